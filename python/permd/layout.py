"""permd.ShardLayout: a sharded dataset's shards as its loader wrote them (MDS index.json, WebDataset tars, a sizes
file), and sample ids to (shard, offset) and back. The same rules as permctl's reader (client/layout.h)."""
import bisect
import bz2
import itertools
import json
import lzma
import math
import os
import re
import stat
import tarfile
import zlib

from . import _args
from .errors import PermdError

try:
    import numpy as np
except ImportError:
    np = None

MAX_SHARDS = 1 << 24  # the default bound on shards, as the daemon's max_shards and permctl --max-shards
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")

# PD_E* codes (core/error.h), as permctl reports them
EINVAL, EOVERFLOW, EIO, ENOTFOUND, ETOOBIG, EUNSUPPORTED = -1, -4, -5, -7, -11, -12


class LayoutError(PermdError, ValueError):
    """A layout that cannot be read. .path is the file at fault, .code the PD_E* code permctl gives:
    ENOTFOUND missing, EIO unreadable/truncated/damaged, EINVAL malformed or empty, EOVERFLOW a count too
    large, EUNSUPPORTED an unknown version or format, ETOOBIG more than max_shards shards."""

    def __init__(self, code, path, message):
        super().__init__(code, f"{path}: {message}")
        self.path = path


class ShardLayout:
    """Shards in the order their sample ids follow: shard i holds sizes[i] samples and is read from paths[i]
    (None where the source names no file). Sample ids count the samples shard after shard: the layout's
    sample s is (shard, offset) = locate(s), and sample_id(shard, offset) = s.

    A ShardLayout is the sequence of its sizes, so it goes wherever permd takes shard sizes:
    ShardPlan(seed, epoch, layout), Sampler(..., shards=layout), Client.put_dataset(name, shards=layout).

        layout = ShardLayout.from_tars("/data/shard-{000000..000999}.tar")
        layout = ShardLayout.from_mds("/data/train")          # or its index.json
        layout = ShardLayout.from_sizes("shards.txt")         # or any sequence of sizes
    """

    def __init__(self, sizes, paths=None):
        self.sizes = [_args.integer("shard size", s) for s in sizes]
        if not self.sizes:
            raise ValueError("a sharded dataset needs at least one shard")
        self.paths = [None] * len(self.sizes) if paths is None else list(paths)
        if len(self.paths) != len(self.sizes):
            raise ValueError(f"{len(self.paths)} paths for {len(self.sizes)} shards")
        self.starts = [0]
        for s in self.sizes:
            self.starts.append(self.starts[-1] + s)
        if self.starts[-1] > _args.N_MAX:
            raise ValueError("the shards hold more than 2**63 samples in all")

    @classmethod
    def from_mds(cls, index, max_shards=MAX_SHARDS):
        """A MosaicML Streaming index.json (version 2), or the directory holding it."""
        return cls(*_read_mds(os.fspath(index), max_shards))

    @classmethod
    def from_tars(cls, *specs, max_shards=MAX_SHARDS):
        """WebDataset tar shards: each spec a path, a directory, a brace pattern or a glob; "::" joins several."""
        if not specs:
            raise ValueError("no tar shards given")
        paths = _resolve_specs(specs, max_shards)
        _tars_unique(paths)
        return cls([count_tar(p) for p in paths], paths)

    @classmethod
    def from_sizes(cls, source, max_shards=MAX_SHARDS):
        """A sizes file (one count per line, optionally then blanks and a path: what permctl shards prints), or
        any sequence of sizes."""
        if isinstance(source, (str, bytes, os.PathLike)):
            return cls(*_read_sizes(os.fspath(source), max_shards))
        return cls(source)

    def __len__(self):
        return len(self.sizes)

    def __iter__(self):
        return iter(self.sizes)

    def __getitem__(self, shard):
        return self.sizes[shard]

    def __repr__(self):
        return f"ShardLayout(shards={len(self.sizes)}, samples={self.samples})"

    @property
    def samples(self):
        return self.starts[-1]

    def locate(self, sample):
        """(shard, offset in the shard) of a sample id; numpy arrays of ids give two arrays."""
        if np is not None and isinstance(sample, np.ndarray):
            ids = _args.uint_array("sample ids", sample).astype(np.uint64)
            if ids.size and ids.max() >= self.samples:
                raise IndexError(f"sample ids must be below {self.samples}")
            starts = np.asarray(self.starts, dtype=np.uint64)
            shard = np.searchsorted(starts, ids, side="right") - 1
            return shard, ids - starts[shard]
        s = _args.integer("sample", sample)
        if s >= self.samples:
            raise IndexError(f"sample {s} is not below {self.samples}")
        shard = bisect.bisect_right(self.starts, s) - 1  # empty shards share a start: the last of them holds s
        return shard, s - self.starts[shard]

    def sample_id(self, shard, offset):
        """The sample id of the offset-th sample of a shard (numpy arrays: elementwise)."""
        if np is not None and isinstance(shard, np.ndarray):
            shard = _args.uint_array("shard ids", shard).astype(np.int64)
            offset = _args.uint_array("offsets", np.asarray(offset)).astype(np.uint64)
            sizes = np.asarray(self.sizes, dtype=np.uint64)
            if shard.size and (shard.min() < 0 or shard.max() >= len(self.sizes) or (offset >= sizes[shard]).any()):
                raise IndexError("a (shard, offset) pair lies outside the layout")
            return np.asarray(self.starts, dtype=np.uint64)[shard] + offset
        i = _args.integer("shard", shard, 0, len(self.sizes) - 1)
        o = _args.integer("offset", offset)
        if o >= self.sizes[i]:
            raise IndexError(f"shard {i} holds {self.sizes[i]} samples, not {o + 1}")
        return self.starts[i] + o

    def where(self, sample):
        """(path, offset) of a sample id: the file to read it from and its index there."""
        shard, offset = self.locate(sample)
        return self.paths[shard], offset

    def keys(self, shard):
        """A tar shard's sample keys in order (WebDataset's __key__), read again from its headers: any file
        from_tars() counts, whatever its name (LayoutError where the file is no tar)."""
        path = self.paths[_args.integer("shard", shard, 0, len(self.sizes) - 1)]
        if path is None:
            raise ValueError(f"shard {shard} names no file")
        return list(_tar_keys(path))


# ---- Brace patterns: braceexpand 0.1.7's rules (what WebDataset expands URLs with), as client/braces.c ----------

_INT_RANGE = re.compile(r"^(-?[0-9]+)\.\.(-?[0-9]+)(?:\.\.-?([0-9]+))?$")
_CHAR_RANGE = re.compile(r"^([A-Za-z])\.\.([A-Za-z])(?:\.\.-?([0-9]+))?$")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BRACES_DEPTH_MAX = 64
BRACES_BYTES_MAX = 1 << 30  # names adding up to more bytes are refused (ETOOBIG), as client/braces.h


class _Unbalanced(Exception):
    pass


def _parse_pattern(s, depth):
    """A pattern as a product of items; each item a list of alternatives, each a str or a parsed pattern."""
    if depth > BRACES_DEPTH_MAX:
        raise _Unbalanced(f"braces nested deeper than {BRACES_DEPTH_MAX}")
    items, start, level, pos = [], 0, 0, 0
    while pos < len(s):
        c = s[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            if level == 0 and pos > start:
                items.append([s[start:pos]])
                start = pos
            level += 1
        elif c == "}":
            level -= 1
            if level == 0:
                expr = s[start + 1:pos]
                item = _parse_expression(expr, depth + 1)
                items.extend([["{"], [_parse_pattern(expr, depth + 1)], ["}"]] if item is None else [item])
                start = pos + 1
        pos += 1
    if level != 0:
        raise _Unbalanced("unbalanced braces")
    if start < len(s):
        items.append([s[start:]])
    return items


def _parse_expression(expr, depth):
    m = _INT_RANGE.match(expr)
    if m and not expr.endswith("\n"):
        left, right, step = m.groups()
        width = max(len(left), len(right)) if any(
            e.lstrip("-").startswith("0") and e.lstrip("-") != "0" for e in (left, right)) else 0
        a, b = int(left), int(right)
        return _Range(a, b, int(step or 0) or 1, lambda v: "%0*d" % (width, v), max(width, len(str(a)), len(str(b))))
    m = _CHAR_RANGE.match(expr)
    if m and not expr.endswith("\n"):
        left, right, step = m.groups()
        return _Range(_ALPHABET.index(left), _ALPHABET.index(right), int(step or 0) or 1, _ALPHABET.__getitem__, 1)
    alts, start, level, pos = [], 0, 0, 0
    while pos < len(expr):
        c = expr[pos]
        if c == "\\":
            pos += 2
            continue
        if c == "{":
            level += 1
        elif c == "}":
            level -= 1
        elif c == "," and level == 0:
            alts.append(_parse_pattern(expr[start:pos], depth))
            start = pos + 1
        pos += 1
    if not alts:
        return None
    alts.append(_parse_pattern(expr[start:], depth))
    return alts


class _Range:
    def __init__(self, a, b, step, fmt, longest):
        self.a, self.b, self.step, self.fmt = a, b, step, fmt
        self.longest = longest  # no name is longer

    def count(self):  # not __len__: len() must fit an index-sized integer, and {1..10^20} does not
        return abs(self.b - self.a) // self.step + 1

    def __iter__(self):
        d = self.step if self.a <= self.b else -self.step
        return (self.fmt(self.a + i * d) for i in range(self.count()))


def _measure(items):
    """(names, bytes of them in all) of a parsed pattern, as client/braces.c counts them: none is built."""
    n, parts = 1, []
    for item in items:
        if isinstance(item, _Range):
            part = (item.count(), item.count() * item.longest)
        else:
            each = [(1, len(a.encode("utf-8", "surrogateescape"))) if isinstance(a, str) else _measure(a) for a in item]
            part = (sum(c for c, _ in each), sum(b for _, b in each))
        parts.append(part)
        n *= part[0]
    return n, sum(b * (n // c) for c, b in parts if c)


def _names(items):
    """A parsed pattern's names in order, one at a time: its items are expanded, never all of their product."""
    strings = [list(item) if isinstance(item, _Range) else [
        x for a in item for x in ([a] if isinstance(a, str) else _names(a))] for item in items]
    return ("".join(t) for t in itertools.product(*strings))


_UNESCAPE = re.compile(r"\\(.)")


def _iter_braces(pattern, max_names):
    """expand_braces' names, one at a time (the bounds are checked before the first)."""
    try:
        items = _parse_pattern(pattern, 0)
    except _Unbalanced as e:
        raise ValueError(f"{e} in {pattern!r}") from None
    names, size = _measure(items)
    if names > max_names:
        raise LayoutError(ETOOBIG, pattern, f"expands to more than {max_names} names")
    if size > BRACES_BYTES_MAX:
        raise LayoutError(ETOOBIG, pattern, f"expands to names of more than {BRACES_BYTES_MAX} bytes in all")
    return (_UNESCAPE.sub(r"\1", s) for s in _names(items))


def expand_braces(pattern, max_names=MAX_SHARDS):
    """The names a brace pattern stands for, in order (braceexpand's rules; see client/braces.h). ValueError
    for unbalanced braces, LayoutError(ETOOBIG) past max_names or BRACES_BYTES_MAX bytes of names (both counted
    before any name is built)."""
    return list(_iter_braces(pattern, max_names))


# ---- Tar specs -----------------------------------------------------------------------------------------------------

def _is_file_in_dir(path):
    """Whether a directory's entry is a file to count: subdirectories are skipped, as in C, but a shard behind a
    broken link (or a link loop), or a FIFO or a device named as one, must not go missing quietly."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise LayoutError(ENOTFOUND, path, "a broken link") from None
    except OSError as e:
        raise LayoutError(EIO, path, e.strerror) from None
    if stat.S_ISDIR(mode):
        return False
    if not stat.S_ISREG(mode):
        raise LayoutError(EINVAL, path, "not a regular file")
    return True


def _list_dir(name):
    """A directory's tar shards (not its subdirectories'), sorted by the bytes of their names."""
    try:
        names = os.listdir(name)
    except OSError as e:
        raise LayoutError(EIO, name, f"cannot list it: {e.strerror}") from None
    found = sorted((n for n in names if not n.startswith(".") and n.endswith(TAR_SUFFIXES)
                    and _is_file_in_dir(os.path.join(name, n))), key=os.fsencode)
    if not found:
        raise LayoutError(ENOTFOUND, name, "no tar shards in it (" + ", ".join("*" + x for x in TAR_SUFFIXES) + ")")
    return [os.path.join(name, n) for n in found]


def _resolve_specs(specs, max_shards):
    paths = []

    def add(p, spec):
        if len(paths) >= max_shards:
            raise LayoutError(ETOOBIG, spec, f"more than {max_shards} shards (raise max_shards)")
        paths.append(p)

    for spec in specs:
        for part in os.fspath(spec).split("::"):
            if not part:
                raise LayoutError(EINVAL, spec, "an empty shard spec")
            try:
                names = _iter_braces(part, max(max_shards - len(paths), 1))
            except ValueError as e:
                if isinstance(e, LayoutError):
                    raise
                raise LayoutError(EINVAL, part, str(e)) from None
            for name in names:  # an existing file, else a directory, else a glob (as C: stat's own error)
                try:
                    st = os.stat(name)
                except FileNotFoundError as e:
                    if any(c in name for c in "*?["):
                        for p in glob_shards(name, max_shards - len(paths)):
                            add(p, name)
                    elif name != part:
                        raise LayoutError(ENOTFOUND, name, f"no such file (from {part!r})") from None
                    else:
                        raise LayoutError(ENOTFOUND, name, e.strerror) from None
                except OSError as e:  # a link loop, a file where a directory should be, a name too long
                    raise LayoutError(EIO, name, e.strerror) from None
                else:
                    for p in _list_dir(name) if stat.S_ISDIR(st.st_mode) else [name]:
                        add(p, name)
    return paths


def _tars_unique(paths):
    """One file listed twice (a.tar, ./a.tar, a link to it, or {a,a}.tar) would have its samples counted twice:
    refused, naming the first repeat in shard order, as C does. Files os.stat() fails on are left to the count."""
    seen = {}
    for i, p in enumerate(paths):
        try:
            st = os.stat(p)
        except OSError:
            continue
        j = seen.setdefault((st.st_dev, st.st_ino), i)
        if j != i:
            raise LayoutError(EINVAL, p, f"shard {i} is {paths[j]} (shard {j}) again: one file listed twice would "
                                         "have its samples counted twice")


# ---- Globs: one dialect, the same in C (client/layout.c) and Python -------------------------------------------------
# glibc's glob() and Python's glob/fnmatch read [^a], [[:digit:]] and backslashes differently, so neither is used.

def _set_end(p, i):
    """The index of the ']' closing the set opened by p[i] == '[', or None (the '[' is then an ordinary
    character). A ']' right after "[" or "[!" is a member; a backslash escapes the next character."""
    j = i + 1
    if j < len(p) and p[j] in "!^":
        j += 1
    first = j
    while j < len(p):
        if p[j] == "\\":
            j += 2
            continue
        if p[j] == "]" and j > first:
            return j
        j += 1
    return None


def _set_items(p, i, end):
    """The (lo, hi) ranges of the set p[i..end], and whether it is negated."""
    j = i + 1
    neg = p[j] in "!^"
    j += neg
    items = []
    while j < end:
        if p[j] == "[" and j + 1 < end and p[j + 1] in ":=.":
            items.append(None)  # a POSIX class: refused by _check_part
        if p[j] == "\\":
            j += 1
        lo = hi = p[j]
        if j + 2 < end and p[j + 1] == "-":
            j += 2
            if p[j] == "\\":
                j += 1
            hi = p[j]
        items.append((lo, hi))
        j += 1
    return items, neg


def _check_part(p, pattern):
    i = 0
    while i < len(p):
        if p[i] == "\\":
            i += 2
            continue
        end = _set_end(p, i) if p[i] == "[" else None
        if end is not None:
            for item in _set_items(p, i, end)[0]:
                if item is None:
                    raise LayoutError(EINVAL, pattern, "POSIX classes ([:digit:], [=a=], [.a.]) are not supported "
                                                       "in globs")
                if not (item[0].isascii() and item[1].isascii()):
                    raise LayoutError(EINVAL, pattern, "a glob's [...] set takes ASCII characters only")
                if item[0] > item[1]:
                    raise LayoutError(EINVAL, pattern, "a reversed range in a glob's [...] set")
            i = end
        i += 1


def _magic(p):
    i = 0
    while i < len(p):
        if p[i] == "\\":
            i += 2
            continue
        if p[i] in "*?" or (p[i] == "[" and _set_end(p, i) is not None):
            return True
        i += 1
    return False


def _match(p, s):
    """'*' any run, '?' one character, [...] one of a set ([!...] or [^...] one not in it), '\\c' c itself."""
    pi = si = 0
    star, star_s = None, 0
    while si < len(s):
        if pi < len(p):
            c = p[pi]
            if c == "*":
                star, star_s = pi, si
                pi += 1
                continue
            if c == "?":
                pi += 1
                si += 1
                continue
            end = _set_end(p, pi) if c == "[" else None
            if end is not None:
                items, neg = _set_items(p, pi, end)
                if any(lo <= s[si] <= hi for lo, hi in items) != neg:
                    pi, si = end + 1, si + 1
                    continue
            else:
                n = 2 if c == "\\" and pi + 1 < len(p) else 1
                if p[pi + n - 1] == s[si]:
                    pi, si = pi + n, si + 1
                    continue
        if star is None:
            return False
        pi, star_s = star + 1, star_s + 1
        si = star_s
    while pi < len(p) and p[pi] == "*":
        pi += 1
    return pi == len(p)


def _unescape(p):
    return re.sub(r"\\(.)", r"\1", p, flags=re.S)


def glob_shards(pattern, max_names=MAX_SHARDS):
    """The files a glob matches, sorted by the bytes of their names, as permctl reads it (see docs/shards.md):
    each '/'-separated part matched on its own ('*', '?', ASCII [...] sets, [!...] and [^...], '\\' escapes);
    hidden names only by a part starting with '.'; POSIX classes refused. LayoutError(ENOTFOUND) for none."""
    cur = [""]
    parts = pattern.split("/")
    for k, part in enumerate(parts):
        first, last = k == 0, k == len(parts) - 1
        _check_part(part, pattern)
        nxt = []
        if not _magic(part):
            lit = _unescape(part)
            for c in cur:
                p = c + ("" if first else "/") + lit
                if not last or os.path.lexists(p):
                    nxt.append(p)
        else:
            dot = part.startswith(".") or part.startswith("\\.")
            for c in cur:
                d = c or ("." if first else "/")
                try:
                    names = os.listdir(d)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                except OSError as e:
                    raise LayoutError(EIO, pattern, f"cannot list {d}: {e.strerror}") from None
                for n in names:
                    if (n.startswith(".") and not dot) or not _match(part, n):
                        continue
                    p = c + ("" if first else "/") + n
                    if not last:
                        try:
                            if not stat.S_ISDIR(os.stat(p).st_mode):
                                continue
                        except OSError:
                            continue
                    nxt.append(p)
                    # past max_names the last part's matches stop (the add says why); directories matched before it
                    # are bounded apart, by MAX_SHARDS, as in C (a directory may hold no shard: stopping at
                    # max_names dropped the shards under those not listed yet)
                    if last and len(nxt) > max_names:
                        break
                    if not last and len(nxt) > MAX_SHARDS:
                        raise LayoutError(ETOOBIG, pattern, f"more than {MAX_SHARDS} directories match its parts "
                                          "before the last: narrow the pattern")
        cur = nxt
    if not cur:
        raise LayoutError(ENOTFOUND, pattern, "matches no file")
    return sorted(cur, key=os.fsencode)


# ---- Tar shards: WebDataset's grouping, from the headers -------------------------------------------------------------

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext


def _split_key(name):
    """_KEY.match(name).groups(), or None, in linear time: the regex backtracks quadratically over a name of
    many '/' (a 1 MiB GNU long name of "a/a/...": half an hour), as WebDataset's does; C's pd_wds_split reads it
    the same way. The key ends at the first dot after the last '/' (d); it matches when some prefix P the regex
    can take ("" or up to a '/' with no newline before it: '.' matches none) leaves a dot-free run before d."""
    last_slash = name.rfind("/")
    d = name.find(".", last_slash + 1)
    if d < 1:
        return None
    prev_dot = name.rfind(".", 0, last_slash + 1)  # P must end after it: the run [P's end, d) has no dot
    nl = name.find("\n")
    hi = d - 1 if nl < 0 else min(d - 1, nl)  # P's end: before d (the run is not empty), not past a newline
    j = name.rfind("/", 0, hi)
    if prev_dot < 0 or (j >= 0 and j + 1 > prev_dot):  # P = "", or P up to the last '/' that may end it
        return name[:d], name[d + 1:]
    return None
_META = re.compile(r"__[^/]*__($|/)")


def _is_meta(name):
    return ("/" not in name and name.startswith("__") and name.endswith("__")) or bool(_META.match(name))


# Bounds C keeps too (client/layout_tar.c): tarfile recurses into each extended header and reads its data whole.
_CHAIN_MAX = 64  # headers in a row before one member
_EXT_MAX = 1 << 20  # bytes of one extended header's data (pax, GNU long name)
_EXT_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
              tarfile.SOLARIS_XHDTYPE)


_PAX_LENGTH = re.compile(br"([0-9]{1,20}) ")  # a pax record's length, as tarfile's fixed _proc_pax reads it


class _Damaged(Exception):
    """A file or compressed stream that cannot be read whole (PD_EIO)."""


class _TarInfo(tarfile.TarInfo):
    """tarfile's own reading (what WebDataset counts), with C's bounds. _proc_member is where tarfile hands a parsed
    header on, the extension point its comments name; it also notes that the tar's first header was one."""

    def _proc_member(self, tf):
        src = tf.fileobj
        src.parsed = True
        if src.depth >= _CHAIN_MAX:
            raise _Damaged(f"more than {_CHAIN_MAX} headers in a row before a member")
        if self.type in _EXT_TYPES and not 0 <= self.size <= _EXT_MAX:
            raise _Damaged("an extended header of a negative size" if self.size < 0 else
                           "an extended header of more than 1 MiB")
        src.depth += 1
        try:
            return super()._proc_member(tf)
        finally:
            src.depth -= 1

    def _proc_pax(self, tf):
        """tarfile's _proc_pax as fixed in 2024 (CPython gh-121285: 3.11.10, 3.12.5, 3.13), whatever this
        interpreter's is: a tarfile before the fix stops reading records quietly at a bad one and goes on, where
        C (and a fixed tarfile) raise. Records are framed "%d %s=%s\\n", read raw, decoded after."""
        buf = tf.fileobj.read(self._block(self.size))
        pax_headers = tf.pax_headers if self.type == tarfile.XGLTYPE else tf.pax_headers.copy()
        pos, encoding, raw = 0, None, []
        while len(buf) > pos and buf[pos] != 0:
            m = _PAX_LENGTH.match(buf, pos)
            if not m or int(m.group(1)) < 5 or pos + int(m.group(1)) > len(buf):  # "5 x=\n" is the shortest
                raise tarfile.InvalidHeaderError("invalid header")
            length = int(m.group(1))
            end = m.start(1) + length - 1  # the record's last byte: its newline
            keyword, eq, value = buf[m.end(1) + 1:end].partition(b"=")
            if not keyword or eq != b"=" or buf[end] != 0x0A:
                raise tarfile.InvalidHeaderError("invalid header")
            raw.append((keyword, value))
            if keyword == b"hdrcharset" and encoding is None:  # the first one counts
                encoding = tf.encoding if value == b"BINARY" else "utf-8"
            pos += length
        encoding = encoding or "utf-8"
        for keyword, value in raw:
            keyword = self._decode_pax_field(keyword, "utf-8", "utf-8", tf.errors)
            if keyword in tarfile.PAX_NAME_FIELDS:
                value = self._decode_pax_field(value, encoding, tf.encoding, tf.errors)
            else:
                value = self._decode_pax_field(value, "utf-8", "utf-8", tf.errors)
            pax_headers[keyword] = value
        try:
            nxt = self.fromtarfile(tf)
        except tarfile.HeaderError as e:
            raise tarfile.SubsequentHeaderError(str(e)) from None
        if "GNU.sparse.map" in pax_headers:
            self._proc_gnusparse_01(nxt, pax_headers)
        elif "GNU.sparse.size" in pax_headers:  # 0.0: this header's offset and numbytes records
            sparse = {b"GNU.sparse.offset": [], b"GNU.sparse.numbytes": []}
            for keyword, value in raw:
                if keyword in sparse:
                    try:
                        sparse[keyword].append(int(value.decode()))
                    except ValueError:
                        raise tarfile.InvalidHeaderError("invalid header") from None
            nxt.sparse = list(zip(*sparse.values()))
        elif pax_headers.get("GNU.sparse.major") == "1" and pax_headers.get("GNU.sparse.minor") == "0":
            self._proc_gnusparse_10(nxt, pax_headers, tf)
        if self.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
            nxt._apply_pax_info(pax_headers, tf.encoding, tf.errors)
            nxt.offset = self.offset
            if "size" in pax_headers:  # the size was replaced: the next header moves
                offset = nxt.offset_data
                if nxt.isreg() or nxt.type not in tarfile.SUPPORTED_TYPES:
                    offset += nxt._block(nxt.size)
                tf.offset = offset
        return nxt

    def _proc_gnusparse_10(self, nxt, pax_headers, tf):
        """tarfile's, reading and checking the same numbers (int() of each line, a block read when no newline is
        left), without keeping them: tarfile keeps each in a list, memory growing with the file (C keeps none)."""
        buf = tf.fileobj.read(tarfile.BLOCKSIZE)
        count, buf = buf.split(b"\n", 1)
        left = int(count) * 2
        while left > 0:
            if b"\n" not in buf:
                buf += tf.fileobj.read(tarfile.BLOCKSIZE)
            number, buf = buf.split(b"\n", 1)
            int(number)
            left -= 1
        nxt.offset_data = tf.fileobj.tell()

    def _proc_sparse(self, tf):
        """tarfile's, reading and checking the same extension blocks (nti() of each of their 21 pairs), without
        keeping the pairs: tarfile keeps up to 21 from every 512-byte block, memory growing with the file."""
        self.sparse, isextended, origsize = self._sparse_structs  # the header's own (4 at most)
        del self._sparse_structs
        while isextended:
            buf = tf.fileobj.read(tarfile.BLOCKSIZE)
            for pos in range(0, 21 * 24, 12):
                tarfile.nti(buf[pos:pos + 12])
            isextended = bool(buf[504])
        self.offset_data = tf.fileobj.tell()
        tf.offset = self.offset_data + self._block(self.size)
        self.size = origsize
        return self


class _Feed:
    """Bytes from an iterator of chunks, read ahead and consumed as libarchive's filters do: ahead(n) is n bytes or
    None when fewer are left; consumed counts what a decompressor took."""

    def __init__(self, chunks):
        self._it, self._buf, self._at, self.consumed, self._end = iter(chunks), b"", 0, 0, False

    def _more(self):
        if self._end:
            return False
        for c in self._it:
            if c:
                self._buf = self._buf[self._at:] + c
                self._at = 0
                return True
        self._end = True
        return False

    def ahead(self, n):
        while len(self._buf) - self._at < n:
            if not self._more():
                return None
        return self._buf[self._at:self._at + n]

    def available(self):
        """What is buffered (at least a byte), or b"" at the end."""
        if len(self._buf) == self._at and not self._more():
            return b""
        return self._buf[self._at:]

    def consume(self, n):
        self._at += n
        self.consumed += n

    def give_back(self, data):
        """Undo the consuming of data, the last bytes consumed (what a decompressor left after its stream's end)."""
        if data:
            self._buf = bytes(data) + self._buf[self._at:]
            self._at = 0
            self.consumed -= len(data)


_OUT = 1 << 20  # decompressed bytes at a time: a small compressed block may stand for gigabytes


def _drive(d, f, what):
    """Run a bz2/lzma decompressor to its stream's end on f, yielding its output; f keeps what follows the end."""
    while not d.eof:
        if d.needs_input:
            data = f.available()
            if not data:
                raise _Damaged(f"a damaged or cut compressed stream: truncated {what} input")
            f.consume(len(data))
        else:
            data = b""
        try:
            out = d.decompress(data, _OUT)
        except (OSError, EOFError, ValueError, lzma.LZMAError) as e:
            raise _Damaged(f"a damaged or cut compressed stream: {what}: {e}") from None
        if out:
            yield out
    f.give_back(d.unused_data)


def _gzip_header(f):
    """libarchive's peek_at_header(): the length of the gzip member header at f's front, 0 when there is none."""
    h = f.ahead(10)
    if h is None or h[:3] != b"\x1f\x8b\x08" or h[3] & 0xE0:
        return 0
    flags, n = h[3], 10
    if flags & 4:  # extra field: its length, then (unchecked here) its bytes
        h = f.ahead(n + 2)
        if h is None:
            return 0
        n += 2 + (h[n] | h[n + 1] << 8)
    for bit in (8, 16):  # file name, comment: NUL-terminated
        if flags & bit:
            while True:
                n += 1
                h = f.ahead(n)
                if h is None:
                    return 0
                if h[n - 1] == 0:
                    break
    if flags & 2:  # header CRC (not checked)
        if f.ahead(n + 2) is None:
            return 0
        n += 2
    return n


class _Gzip:
    """libarchive's gzip filter: members one after another while a member header follows; neither checks the
    CRC-32 and length."""
    name = "gzip"

    def __init__(self):
        pass

    def run(self, f):
        while True:
            n = _gzip_header(f)
            if not n:
                return
            if f.ahead(n) is None:
                raise _Damaged("a damaged or cut compressed stream: truncated gzip input")
            f.consume(n)
            d = zlib.decompressobj(-15)
            while not d.eof:
                data = f.available()
                if not data:
                    raise _Damaged("a damaged or cut compressed stream: truncated gzip input")
                try:
                    out = d.decompress(data, _OUT)
                except zlib.error as e:
                    raise _Damaged(f"a damaged or cut compressed stream: gzip decompression failed ({e})") from None
                # At the member's end what follows it is unused_data; unconsumed_tail may hold the same bytes too
                # (once a call hit _OUT, zlib keeps setting it), so it is not subtracted then: that took 8 bytes
                # of trailer as unread, and a well-formed shard compressing more than 16:1 was refused.
                f.consume(len(data) - (len(d.unused_data) if d.eof else len(d.unconsumed_tail)))
                if out:
                    yield out
            t = f.ahead(8)
            if t is None:
                raise _Damaged("a damaged or cut compressed stream: the gzip trailer is cut")
            f.consume(8)


class _Bzip2:
    """libarchive's bzip2 filter: streams one after another while one follows (its bid)."""
    name = "bzip2"

    @staticmethod
    def bid(f):
        h = f.ahead(14)
        return (h is not None and h[:3] == b"BZh" and 0x31 <= h[3] <= 0x39
                and h[4:10] in (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90"))

    def run(self, f):
        while self.bid(f):
            yield from _drive(bz2.BZ2Decompressor(), f, "bzip2")


class _Xz:
    """libarchive's xz filter (liblzma, concatenated streams): streams with zero padding of 4n bytes between and
    after them, nothing else."""
    name = "xz"

    def run(self, f):
        while True:
            yield from _drive(lzma.LZMADecompressor(format=lzma.FORMAT_XZ), f, "xz")
            zeros = 0
            while True:
                h = f.available()
                k = len(h) - len(h.lstrip(b"\0"))
                f.consume(k)
                zeros += k
                if k < len(h) or not h:
                    break
            if zeros % 4:
                raise _Damaged("a damaged or cut compressed stream: xz: padding that is no multiple of 4 bytes")
            if not f.available():
                return


class _Lzma:
    """libarchive's lzma filter: one LZMA-alone stream."""
    name = "lzma"

    def run(self, f):
        yield from _drive(lzma.LZMADecompressor(format=lzma.FORMAT_ALONE), f, "lzma")


_LZMA_DICTS = {1 << k for k in range(12, 28)}


def _bid(f):
    """libarchive's filter bidders (gzip, bzip2, xz, lzma; at most one can claim any data): the filter, or None."""
    if f.ahead(6) == b"\xfd7zXZ\x00":
        return _Xz()
    if _gzip_header(f):
        return _Gzip()
    if _Bzip2.bid(f):
        return _Bzip2()
    h = f.ahead(14)
    if h is None or h[0] > 224:
        return None
    bits = 8 if h[0] in (0x5D, 0x5E) else 0
    bits += 64 if h[5:13] == b"\xff" * 8 else 0
    dicsize = int.from_bytes(h[1:5], "little")
    if dicsize in _LZMA_DICTS or (0x300000 <= dicsize <= 0x3F00000 and not dicsize & 0xFFFFF and bits == 72):
        return _Lzma()
    return None


def _file_chunks(f):
    while True:
        b = f.read(1 << 16)
        if not b:
            return
        yield b


class _TarStream:
    """The tar tarfile reads: the file itself (seekable), or its decompressed stream (forward only, as C's).
    Remembers its last read, where permd looks for the end-of-archive block."""

    def __init__(self, f, feed=None):
        self.f, self.feed, self.pos = f, feed, 0
        self.parsed, self.depth, self.last = False, 0, (None, b"")

    def read(self, n=-1):
        at = self.pos
        if self.feed is None:
            self.f.seek(at)
            data = self.f.read(n)
        else:
            out, want = [], (1 << 62) if n is None or n < 0 else n
            while want > 0:
                c = self.feed.available()
                if not c:
                    break
                c = c[:want]
                self.feed.consume(len(c))
                out.append(c)
                want -= len(c)
            data = b"".join(out)
        self.pos += len(data)
        self.last = (at, data)
        return data

    def seek(self, pos, whence=0):
        if whence != 0:
            raise _Damaged("an unexpected seek")
        if self.feed is not None:
            if pos < self.pos:
                raise _Damaged("a seek backward in a compressed stream")
            left = pos - self.pos
            while left > 0:
                c = self.feed.available()
                if not c:
                    break
                k = min(len(c), left)
                self.feed.consume(k)
                left -= k
        self.pos = pos
        return pos

    def tell(self):
        return self.pos


def _open_layers(f):
    """The filters libarchive would stack on the file (the outermost first) and the Feed of the innermost's output."""
    file_feed = _Feed(_file_chunks(f))
    layers, feed = [], file_feed
    while True:
        codec = _bid(feed)
        if codec is None:
            return file_feed, layers, feed
        if len(layers) == 24:
            raise _Damaged("a damaged or cut compressed stream: Input requires too many filters for decoding")
        layers.append(codec)
        feed = _Feed(codec.run(feed))


def _verify(f, size, file_feed, layers, top):
    """A compressed shard must be whole, as C checks it: the stream read to its end, and the bytes after it zeros.
    gzip's CRC-32 and length are not checked, as in C (libarchive shows no member's trailer, and a gzip of several
    members is valid)."""
    while top.available():
        top.consume(len(top.available()))
    rest = size - file_feed.consumed
    data = file_feed.available()
    while data:
        if data.count(0) != len(data):
            raise _Damaged(f"{rest} bytes after the compressed data that are not zeros (junk, or a second stream "
                           "of another kind)")
        file_feed.consume(len(data))
        data = file_feed.available()


def _tar_keys(path):
    """Yield a tar shard's sample keys in order, as WebDataset reads it: tarfile's members (with C's bounds), regular
    ones only, metadata and keyless names skipped, a sample being a run of consecutive members with one key
    (group_by_keys). Headers only when uncompressed; a compressed shard is decompressed as libarchive does in C and
    must be whole. The same rules and codes as client/layout_tar.c."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise LayoutError(ENOTFOUND, path, "no such file") from None
    except OSError as e:
        raise LayoutError(EIO, path, e.strerror) from None
    if not stat.S_ISREG(st.st_mode):
        raise LayoutError(EINVAL, path, "not a regular file")
    if st.st_size == 0:
        raise LayoutError(EINVAL, path, "an empty file (0 bytes), not a tar shard")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise LayoutError(EIO, path, e.strerror) from None
    with f:
        try:
            file_feed, layers, top = _open_layers(f)
        except _Damaged as e:
            raise LayoutError(EIO, path, str(e)) from None
        except OSError as e:
            raise LayoutError(EIO, path, f"read failed: {e.strerror}") from None
        if not layers:
            f.seek(0)
            src = _TarStream(f)
        else:
            src = _TarStream(f, top)
        failure = None
        try:
            if len(layers) > 1:
                failure = LayoutError(EINVAL, path, f"compressed twice ({layers[1].name} inside {layers[0].name}): "
                                                    "WebDataset decompresses one layer")
            else:
                yield from _tar_walk(path, src)
        except LayoutError as e:
            failure = e
        if layers:  # a broken stream is the verdict, whatever was read from it
            try:
                _verify(f, st.st_size, file_feed, layers, top)
            except _Damaged as e:
                raise LayoutError(EIO, path, str(e)) from None
            except OSError as e:
                raise LayoutError(EIO, path, f"read failed: {e.strerror}") from None
        if failure is not None:
            raise failure


def _tar_walk(path, src):
    try:
        tf = tarfile.open(fileobj=src, mode="r:", tarinfo=_TarInfo)
    except (_Damaged, OSError) as e:  # reading the file or its stream failed
        raise LayoutError(EIO, path, str(e)) from None
    except Exception as e:  # the first 512 bytes are no tar header: not a tar; anything after: damage
        if src.parsed:
            raise LayoutError(EIO, path, f"truncated or damaged after member 0 ({e})") from None
        raise LayoutError(EINVAL, path, f"not a tar archive ({e})") from None
    members = samples = ext_bytes = 0
    key, exts = None, set()
    try:
        for ti in tf:
            members += 1
            tf.members = []  # as WebDataset: tarfile would keep every TarInfo
            if tf.offset <= ti.offset:  # a negative size: tarfile would read this header again, for ever
                raise LayoutError(EIO, path, f"member {members} ({ti.name!r}) does not advance the archive")
            if not ti.isreg() or _is_meta(ti.name):
                continue
            m = _split_key(ti.name)
            if not m:
                continue
            k, ext = m[0], m[1].lower()
            if k != key or samples == 0:
                key, exts, ext_bytes = k, set(), 0
                samples += 1
                yield k
            if ext in exts or ext in ("__key__", "__url__"):
                raise LayoutError(EINVAL, path, f"member {ti.name!r} repeats the extension {ext!r} in sample "
                                                f"{k!r} (WebDataset raises on it)")
            exts.add(ext)
            # kept to find a repeat: bounded as in C (a 2 KB bzip2 of 1 MiB extensions took 300 MB)
            ext_bytes += len(ext.encode("utf-8", "surrogateescape"))
            if len(exts) > SAMPLE_EXTS or ext_bytes > SAMPLE_EXT_BYTES:
                raise LayoutError(EINVAL, path, f"sample {k!r} has more than {SAMPLE_EXTS} extensions or "
                                                f"{SAMPLE_EXT_BYTES} bytes of them: not a WebDataset sample")
        # tarfile ends quietly at a cut or damaged header: look at where it stopped (the block it read there)
        at, block = src.last
        if at != tf.offset:
            src.seek(tf.offset)
            block = src.read(tarfile.BLOCKSIZE)
    except LayoutError:
        raise
    except (_Damaged, OSError) as e:
        raise LayoutError(EIO, path, str(e)) from None
    except Exception as e:  # what tarfile raises past the first header
        raise LayoutError(EIO, path, f"truncated or damaged after member {members} ({e})") from None
    if not block:  # every tar writer writes one: this tar was cut right after a member
        raise LayoutError(EIO, path, f"truncated after member {members} (no end-of-archive block)")
    if len(block) < tarfile.BLOCKSIZE or block.count(0) != tarfile.BLOCKSIZE:
        raise LayoutError(EIO, path, f"truncated or damaged after member {members}")
    if samples == 0:
        raise LayoutError(EINVAL, path, f"an empty shard: no samples in its {members} members")


def count_tar(path):
    """The samples of one tar shard, as WebDataset groups its members (see ShardLayout.from_tars)."""
    return sum(1 for _ in _tar_keys(os.fspath(path)))


# ---- Sizes files ----------------------------------------------------------------------------------------------------

SAMPLE_EXTS, SAMPLE_EXT_BYTES = 65536, 1 << 24  # a sample's distinct extensions and their bytes (layout_tar.c)
SIZES_LINE_MAX = 65536  # bytes of one sizes line, its end excluded (client/layout.h's PD_SIZES_LINE_MAX)
_SIZE_LINE = re.compile(r"([^ \t]*)[ \t]*(.*)", re.S)  # SIZE, then blanks and a path (maybe none)


def _read_sizes(path, max_shards):
    sizes, paths, total = [], [], 0
    try:
        f = open(path, encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        raise LayoutError(ENOTFOUND, path, "cannot read it: no such file") from None
    except OSError as e:
        raise LayoutError(EIO, path, f"cannot read it: {e.strerror}") from None
    with f:  # universal newlines: lines end at \n, \r\n or a lone \r, as in C
        for lineno in itertools.count(1):
            # At most SIZES_LINE_MAX bytes a line, as in C: a file with no line end (/dev/zero) is refused, not
            # read into memory (a bare MemoryError). A character takes 1 to 4 bytes (undecodable ones 1).
            line = f.readline(SIZES_LINE_MAX + 2)
            if not line:
                break
            line = line.rstrip("\r\n")
            where = f"{path}:{lineno}"
            if len(line) > SIZES_LINE_MAX // 4 and len(line.encode("utf-8", "surrogateescape")) > SIZES_LINE_MAX:
                raise LayoutError(EINVAL, where, f"a line longer than {SIZES_LINE_MAX} bytes (a size and a path): "
                                  "not a sizes file")
            if "\0" in line:  # C's strings would end there: refused by both
                raise LayoutError(EINVAL, where, "a NUL byte in the line")
            if not line or line.startswith("#"):
                continue
            if line[0] in " \t":  # as C says it: the size must start the line
                raise LayoutError(EINVAL, where, "the line starts with a blank (a shard size must start it)")
            number, rest = _SIZE_LINE.match(line).groups()
            digits = number.lstrip("0")  # int() refuses more than 4300 digits: a count never has 21
            if not number.isascii() or not number.isdigit() or len(digits) > 20 or int(digits or "0") >= 1 << 64:
                raise LayoutError(EINVAL, where, f"{number!r} is not a shard size (an unsigned decimal integer)")
            if len(sizes) == max_shards:
                raise LayoutError(ETOOBIG, where, f"more than {max_shards} shards (raise max_shards)")
            total += int(digits or "0")
            if total > _args.N_MAX:
                raise LayoutError(EOVERFLOW, where, "the shards hold more than 2^63 samples in all")
            sizes.append(int(digits or "0"))
            paths.append(rest or None)
    if not sizes:
        raise LayoutError(EINVAL, path, "lists no shard sizes")
    return sizes, paths


# ---- MDS indexes -----------------------------------------------------------------------------------------------------

_MDS_FORMATS = ("mds", "csv", "tsv", "xsv", "json")
_I64 = (-(1 << 63), (1 << 63) - 1)  # jansson's integers


class _Overflow(Exception):
    pass


def _json_int(text):
    try:
        v = int(text)
    except ValueError:  # past int()'s 4300 digits: far past 64 bits
        raise _Overflow(text[:32] + "...") from None
    if not _I64[0] <= v <= _I64[1]:
        raise _Overflow(text)
    return v


def _json_float(text):
    v = float(text)
    if v in (math.inf, -math.inf):  # jansson refuses a real past DBL_MAX
        raise _Overflow(text)
    return v


_JSON_DEPTH_MAX = 512  # C refuses deeper nesting the same way (MDS_DEPTH_MAX in client/layout_mds.c)


def _json_depth(data, limit):
    """The deepest nesting of arrays and objects in a JSON text (strings skipped), counted up to limit + 1: the
    scan C makes, so both refuse the same texts (jansson goes to 2048, json as deep as the recursion limit)."""
    depth = deepest = i = 0
    n = len(data)
    while i < n and deepest <= limit:
        c = data[i]
        if c == 0x22:  # a string: skip to its closing quote
            i += 1
            while i < n and data[i] != 0x22:
                i += 2 if data[i] == 0x5C else 1
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x5D, 0x7D) and depth:
            depth -= 1
        i += 1
    return deepest


_JANSSON_REFUSES = re.compile("[\0\ud800-\udfff]")


def _json_strings_ok(root):
    """jansson (C) refuses a \\u0000 and an unpaired surrogate escape anywhere, in fields nobody reads too; json
    keeps them. A parsed string holding either came from such an escape."""
    stack = [root]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _JANSSON_REFUSES.search(v):
                return False
        elif isinstance(v, dict):
            if any(_JANSSON_REFUSES.search(k) for k in v):
                return False
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


class _JsonError(Exception):
    pass


_JSON_TOKEN = re.compile(r"""[ \t\n\r]*(?:([][{}:,])|(")|(-?[0-9])|([A-Za-z]+)|(.)|$)""", re.S)
_JSON_NUMBER = re.compile(r"-?(?:0(?![0-9])|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_JSON_ESCAPES = {"\"": '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _jansson_first_error(s):
    """The kind of the first error jansson (C's JSON reader, JSON_REJECT_DUPLICATES) meets in s: "overflow" for a
    number out of range, "other" for anything else, None for none. Only run on a text Python refused: json, the
    hooks and the checks after it do not meet errors in the text's order."""
    pos = 0

    def lex():  # the next token (kind, value); a lexical error raises first, as jansson's lexer does
        nonlocal pos
        m = _JSON_TOKEN.match(s, pos)
        pos = m.end()
        if m.group(1):
            return m.group(1), None
        if m.group(2):
            out, i = [], pos
            while True:
                if i >= len(s):
                    raise _JsonError("other")
                c = s[i]
                if c == '"':
                    break
                if c < " " or "\udc80" <= c <= "\udcff":  # a control character, or a byte that is not UTF-8
                    raise _JsonError("other")
                if c != "\\":
                    out.append(c)
                    i += 1
                    continue
                e = s[i + 1:i + 2]
                if e in _JSON_ESCAPES:
                    out.append(_JSON_ESCAPES[e])
                    i += 2
                    continue
                h = s[i + 2:i + 6]
                if e != "u" or len(h) != 4 or not all(x in "0123456789abcdefABCDEF" for x in h):
                    raise _JsonError("other")
                v, i = int(h, 16), i + 6
                if 0xDC00 <= v <= 0xDFFF:
                    raise _JsonError("other")
                if 0xD800 <= v <= 0xDBFF:
                    h = s[i + 2:i + 6]
                    if s[i:i + 2] != "\\u" or len(h) != 4 or not all(x in "0123456789abcdefABCDEF" for x in h) \
                            or not 0xDC00 <= int(h, 16) <= 0xDFFF:
                        raise _JsonError("other")
                    v, i = 0x10000 + ((v - 0xD800) << 10) + int(h, 16) - 0xDC00, i + 6
                out.append(chr(v))
            pos = i + 1
            return "str", "".join(out)
        if m.group(3):
            n = _JSON_NUMBER.match(s, m.start(3))
            if not n or s[n.end():n.end() + 1] in (".", "e", "E") or (n.group(1) is None and n.group(2) is None and
                                                                      s[n.end():n.end() + 1].isdigit()):
                raise _JsonError("other")  # "01", "1.", "1e": jansson's invalid token
            pos = n.end()
            text = n.group(0)
            if n.group(1) is None and n.group(2) is None:
                try:
                    _json_int(text)
                except _Overflow:
                    raise _JsonError("overflow") from None
            elif float(text) in (math.inf, -math.inf):
                raise _JsonError("overflow")
            return "num", None
        if m.group(4):
            if m.group(4) not in ("true", "false", "null"):
                raise _JsonError("other")
            return "lit", None
        if m.group(5):
            raise _JsonError("other")
        return "eof", None

    def value(tok):  # parse one value starting at tok (iteratively: the depth is bounded above anyway)
        stack = []
        while True:
            kind, v = tok
            if kind == "{":
                stack.append(("{", set()))
                tok = lex()
                if tok[0] == "}":
                    stack.pop()
                    tok = None
                else:
                    tok = key(tok, stack[-1][1])
                    continue
            elif kind == "[":
                stack.append(("[", None))
                tok = lex()
                if tok[0] == "]":
                    stack.pop()
                    tok = None
                else:
                    continue
            elif kind == "str":
                if "\0" in v:
                    raise _JsonError("other")
            elif kind not in ("num", "lit"):
                raise _JsonError("other")
            while True:  # a value ended: what follows it in its container
                if not stack:
                    return
                t = lex()
                if t[0] == ",":
                    tok = lex()
                    if stack[-1][0] == "{":
                        tok = key(tok, stack[-1][1])
                    break
                if t[0] != ("}" if stack[-1][0] == "{" else "]"):
                    raise _JsonError("other")
                stack.pop()

    def key(tok, seen):  # a key, its ':', and the value's first token
        if tok[0] != "str" or "\0" in tok[1] or tok[1] in seen:
            raise _JsonError("other")
        seen.add(tok[1])
        if lex()[0] != ":":
            raise _JsonError("other")
        return lex()

    try:
        tok = lex()
        if tok[0] not in ("{", "["):
            raise _JsonError("other")
        value(tok)
        if lex()[0] != "eof":
            raise _JsonError("other")
    except _JsonError as e:
        return e.args[0]
    return None


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate object key {k!r}")
        out[k] = v
    return out


def _no_constant(name):
    raise ValueError(f"invalid JSON constant {name}")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _read_mds(index, max_shards):
    file = os.path.join(index, "index.json") if os.path.isdir(index) else index
    folder = os.path.dirname(file) or "."
    try:
        if not stat.S_ISREG(os.stat(file).st_mode):  # a FIFO or device would block or never end
            raise LayoutError(EINVAL, file, "not a regular file")
        with open(file, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise LayoutError(ENOTFOUND, file, "no such file") from None
    except OSError as e:
        raise LayoutError(EIO, file, e.strerror) from None
    if _json_depth(data, _JSON_DEPTH_MAX) > _JSON_DEPTH_MAX:
        raise LayoutError(EINVAL, file, f"malformed JSON: nested deeper than {_JSON_DEPTH_MAX}")
    try:
        root = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_int=_json_int,
                          parse_float=_json_float, parse_constant=_no_constant)
        error = None
        if b"\\u" in data and not _json_strings_ok(root):
            error = LayoutError(EINVAL, file, "malformed JSON: a \\u0000 or an unpaired surrogate escape in a string")
    except _Overflow as e:
        error = LayoutError(EOVERFLOW, file, "a number out of range: integers must fit in 64 bits (±2^63), reals "
                                             f"in a double ({e})")
    except json.JSONDecodeError as e:
        error = LayoutError(EINVAL, f"{file}:{e.lineno}:{e.colno}", f"malformed JSON: {e.msg}")
    except ValueError as e:  # duplicate keys, NaN, bad UTF-8
        error = LayoutError(EINVAL, file, f"malformed JSON: {e}")
    except RecursionError:  # (only when called with little stack left: the depth is checked above)
        error = LayoutError(EINVAL, file, "malformed JSON: nested too deeply")
    if error is not None:
        # jansson (C) stops at the first error in the text, json and the checks above at another: which one came
        # first decides between PD_EOVERFLOW and PD_EINVAL, as in C
        first = _jansson_first_error(data.decode("utf-8", "surrogateescape"))
        if (first == "overflow") != (error.code == EOVERFLOW):
            error = LayoutError(EOVERFLOW if first == "overflow" else EINVAL, file,
                                "a number out of range: integers must fit in 64 bits (±2^63), reals in a double"
                                if first == "overflow" else "malformed JSON")
        raise error
    if not isinstance(root, dict):
        raise LayoutError(EINVAL, file, "not a JSON object")
    _mds_version(file, root, "")
    shards = root.get("shards")
    if not isinstance(shards, list):
        raise LayoutError(EINVAL, file, 'no "shards" array')
    if not shards:
        raise LayoutError(EINVAL, file, '"shards" is empty')
    sizes, paths, total = [], [], 0
    for i, shard in enumerate(shards):
        def fail(code, msg, i=i):
            raise LayoutError(code, file, f"shard {i}: {msg}")

        if not isinstance(shard, dict):
            fail(EINVAL, "not an object")
        _mds_version(file, shard, f"shard {i}: ")
        fmt = shard.get("format")
        if not isinstance(fmt, str):
            fail(EINVAL, 'no "format" string')
        if fmt not in _MDS_FORMATS:
            fail(EUNSUPPORTED, f"format '{fmt}' is none of mds, csv, tsv, xsv, json")
        samples = _mds_uint(fail, shard, "samples", (1 << 32) - 1 if fmt == "mds" else (1 << 64) - 1)
        raw, raw_bytes = _mds_file(fail, shard, "raw_data")
        zip_, zip_bytes = _mds_file(fail, shard, "zip_data")
        if "compression" in shard and (shard["compression"] is not None) != (zip_ is not None):
            fail(EINVAL, f'"compression" is {"null" if shard["compression"] is None else "set"} but "zip_data" is '
                         f'{"set" if zip_ else "null"}')
        if samples == 0:
            fail(EINVAL, f'{raw} is an empty shard ("samples": 0)')
        _mds_check_file(fail, folder, raw, raw_bytes, samples if fmt == "mds" else None)
        if zip_ is not None:
            _mds_check_file(fail, folder, zip_, zip_bytes, None)
        if len(sizes) == max_shards:
            raise LayoutError(ETOOBIG, f"{file}: shard {i}", f"more than {max_shards} shards (raise max_shards)")
        total += samples
        if total > _args.N_MAX:
            raise LayoutError(EOVERFLOW, f"{file}: shard {i}", "the shards hold more than 2^63 samples in all")
        sizes.append(samples)
        paths.append(raw)
    seen = set()
    for p in sorted(paths):
        if p in seen:
            raise LayoutError(EINVAL, file, f"two shards name the file {p}")
        seen.add(p)
    return sizes, paths


def _mds_version(file, obj, where):
    v = obj.get("version")
    if _is_int(v) and v == 2:
        return
    if not _is_int(v):
        raise LayoutError(EINVAL, file, f'{where}"version" is {"missing" if v is None else "not an integer"}')
    raise LayoutError(EUNSUPPORTED, file, f'{where}"version" is {v}; this reader knows MDS index version 2')


def _mds_uint(fail, obj, key, hi):
    if key not in obj:
        fail(EINVAL, f'no "{key}"')
    v = obj[key]
    if not _is_int(v):
        fail(EINVAL, f'"{key}" is not an integer')
    if v < 0:
        fail(EINVAL, f'"{key}" is negative ({v})')
    if v > hi:
        fail(EOVERFLOW, f'"{key}" is {v}, more than {hi}'
                        + (" (an MDS shard counts its samples in 32 bits)" if hi == (1 << 32) - 1 else ""))
    return v


def _mds_name_ok(name):
    """A relative path inside the dataset's directory, each part a name (so that two spellings of one file,
    a.mds and ./a.mds, cannot both be listed), in UTF-8 without NUL (C's JSON reader refuses the rest)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return bool(name) and "\0" not in name and all(part not in ("", ".", "..") for part in name.split("/"))


def _mds_file(fail, shard, key):
    if key not in shard:
        fail(EINVAL, f'no "{key}"')
    f = shard[key]
    if f is None and key != "raw_data":
        return None, 0
    if not isinstance(f, dict):
        fail(EINVAL, f'"{key}" is not an object')
    name = f.get("basename")
    if not isinstance(name, str):
        fail(EINVAL, f'"{key}" has no "basename" string')
    if not _mds_name_ok(name):
        fail(EINVAL, f'"{key}".basename {name!r} is not a plain relative path inside the dataset\'s directory')
    return name, _mds_uint(fail, f, "bytes", (1 << 64) - 1)


def _mds_check_file(fail, folder, name, size, samples):
    """A shard file next to the index must have the listed size, and an MDS one its samples in its first 4 bytes."""
    path = os.path.join(folder, name)
    if not os.path.lexists(path):  # an index may be registered away from its shards
        return
    if not os.path.isfile(path):
        fail(EINVAL, f"{path} is not a regular file")
    actual = os.path.getsize(path)
    if actual != size:
        fail(EINVAL, f"{path} is {actual} bytes but the index lists {size} (a partial or stale file?)")
    if samples is not None:
        try:  # non-blocking, and regular once open: a file swapped for a FIFO since the check above would block
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            fail(EIO, f"{path}: cannot read its header: {e.strerror}")
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                fail(EINVAL, f"{path} is not a regular file")
            try:
                head = f.read(4)
            except OSError as e:
                fail(EIO, f"{path}: cannot read its header: {e.strerror}")
        if len(head) != 4:  # the index lists so few bytes: malformed, as a wrong count is
            fail(EINVAL, f"{path} is {len(head)} bytes, too short for its header (4 bytes: the sample count)")
        n = int.from_bytes(head, "little")
        if n != samples:
            fail(EINVAL, f"{path} holds {n} samples but the index lists {samples}")
