/* Shard layouts as loaders write them: sample counts and shard paths from an MDS index.json, WebDataset tars or a sizes file. */
#ifndef PD_LAYOUT_H
#define PD_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

/* The default bound on shards one layout may list (the daemon's max_shards default): a brace
 * pattern, a directory or an index past it is refused before its paths are held in memory. */
#define PD_LAYOUT_MAX_SHARDS_DEFAULT (UINT64_C(1) << 24)

/* A layout: shard i has sizes[i] samples and a path (as listed: relative to the index for MDS,
 * as expanded for tars; NULL for a sizes file that names none). Sample ids number the samples
 * shard after shard in this order, the order the loader reads them (StreamingDataset's global
 * index; WebDataset's order within each shard). */
typedef struct pd_layout pd_layout;

/* Every reader returns 0 and a new layout in *out, or a negative PD_E* code and a message naming
 * the file (and the shard or line) in err:
 *   PD_ENOTFOUND   a file, a directory's shards or a pattern's first file does not exist
 *   PD_EIO         a file cannot be read, or a tar is truncated or damaged
 *   PD_EINVAL      malformed content: not a tar, bad JSON, a missing or wrongly typed field,
 *                  a shard with no samples, a duplicate member or shard
 *   PD_EOVERFLOW   a count past what it may hold (a shard's samples, the total past 2^63)
 *   PD_EUNSUPPORTED an index version or shard format this reader does not know
 *   PD_ETOOBIG     more than max_shards shards
 *   PD_ENOMEM
 * max_shards 0 means PD_LAYOUT_MAX_SHARDS_DEFAULT. */

/* A sizes file: one decimal sample count per line, optionally followed by blanks and the
 * shard's path (what permctl shards prints); blank lines and lines starting with # are skipped.
 * Lines end at \n, \r\n or a lone \r (Python's universal newlines); a line holding a NUL byte, or
 * longer than PD_SIZES_LINE_MAX bytes, is refused (PD_EINVAL).
 * "-" reads standard input. Shards of 0 samples are allowed here. */
#define PD_SIZES_LINE_MAX 65536 /* bytes of one sizes line, its end excluded: a size and a path (16 PATH_MAX) */
int pd_layout_read_sizes(const char *path, uint64_t max_shards, pd_layout **out, char *err, size_t errlen);

/* A MosaicML Streaming index.json (version 2): its "shards" in order, each shard's "samples",
 * its path the "raw_data" basename. Strict: see docs/shards.md. When the shard file lies next to
 * the index, its size must be the one listed and an MDS shard's first 4 bytes (its sample count)
 * must agree; nothing else of it is read. */
int pd_layout_read_mds(const char *index, uint64_t max_shards, pd_layout **out, char *err, size_t errlen);

/* WebDataset tar shards: each spec is a path, a directory (its *.tar, *.tar.gz, *.tgz, *.tar.bz2,
 * *.tar.xz files, by name, hidden ones skipped), a brace pattern ("shard-{000..099}.tar"; see
 * braces.h) or a glob ("*.tar"; matches sorted bytewise; the dialect of docs/shards.md, the same as Python's
 * ShardLayout: '*', '?', ASCII [...] sets negated by '!' or '^', '\\' escapes, POSIX classes refused), and "::"
 * separates several in one spec as in WebDataset.
 * Shards come in the order given; one file given twice (by its device and inode: a.tar and ./a.tar, a link)
 * is refused (PD_EINVAL); each one's samples are counted by pd_layout_count_tar. */
int pd_layout_read_tars(const char *const *specs, size_t nspecs, uint64_t max_shards, pd_layout **out, char *err,
                        size_t errlen);

uint64_t pd_layout_shards(const pd_layout *l);
const uint64_t *pd_layout_sizes(const pd_layout *l);
const char *pd_layout_path(const pd_layout *l, uint64_t shard); /* NULL when the source named none */
uint64_t pd_layout_samples(const pd_layout *l);                  /* the sum of the sizes, ≤ 2^63 */
uint64_t pd_layout_bytes_read(const pd_layout *l);               /* bytes read from shard files */
void pd_layout_free(pd_layout *l);

/* Count the samples of one tar shard as WebDataset reads it: the headers read as Python's tarfile reads
 * them (WebDataset iterates tarfile: ustar prefixes joined whatever the header's magic, pax extended and
 * global headers, GNU long names, sparse members; the first header that is not one ends the archive), then
 * grouped as WebDataset groups them: regular files only, names "__*__" (and anything under "__*__/")
 * skipped, a member's key is its name up to the first dot of its last path component (members without one
 * are skipped), a sample is a run of consecutive members with one key, and an extension repeated in a
 * sample (compared after Python's str.lower()) is an error. Reads the tar headers only (data is seeked
 * over) unless it is compressed (gzip, bzip2, xz, lzma, as libarchive recognizes them), which is read
 * through to its end: the whole stream must be sound. *bytes_read: bytes read from the file. Errors as
 * above: PD_EINVAL for a file that is no tar (its first 512 bytes no tar header), empty, compressed twice,
 * or repeating an extension within a sample (as WebDataset would raise); PD_EIO for a tar truncated or
 * damaged anywhere after its first header (where tarfile, and so WebDataset, would silently stop), a
 * member that does not advance the archive (a negative size), more than 64 headers in a row (63 extended
 * headers before a member) or an extended header of more than 1 MiB, and a compressed stream that is cut,
 * fails one of libarchive's checks or is followed by anything but zero bytes (gzip's CRC-32 and length
 * are not checked: layout_tar.c's tar_verify says why). */
int pd_layout_count_tar(const char *path, uint64_t *samples, uint64_t *bytes_read, char *err, size_t errlen);

/* WebDataset's split of a member name name[0..len) into key and extension (its base_plus_ext, newlines
 * included): 1 with *keylen and *ext (the text after the dot, up to len) when the name has a key, else 0. */
int pd_wds_split(const char *name, size_t len, size_t *keylen, const char **ext);

/* Whether WebDataset skips the member name[0..len) as metadata ("__x__", "__x__/..."). */
int pd_wds_is_meta(const char *name, size_t len);

#endif
