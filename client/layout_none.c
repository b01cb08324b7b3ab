/* The MDS and tar readers of a build without jansson or libarchive (PERMD_IMPORT=OFF, or AUTO without them). */
#include "layout_internal.h"

#include "core/error.h"

int pd_layout_read_mds(const char *index, uint64_t max_shards, pd_layout **out, char *err, size_t errlen)
{
    (void)max_shards;
    (void)out;
    return pd_layout_fail(PD_EUNSUPPORTED, err, errlen,
                          "%s: this permd was built without jansson (libjansson-dev): cannot read MDS indexes", index);
}

int pd_layout_count_tar(const char *path, uint64_t *samples, uint64_t *bytes_read, char *err, size_t errlen)
{
    (void)samples;
    (void)bytes_read;
    return pd_layout_fail(PD_EUNSUPPORTED, err, errlen,
                          "%s: this permd was built without libarchive (libarchive-dev): cannot read tar shards", path);
}
