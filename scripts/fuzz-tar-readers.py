#!/usr/bin/env python3
"""Differential fuzzing of the two tar shard readers: permctl shards --tars (client/layout_tar.c) against
permd.ShardLayout (python/permd/layout.py, Python's tarfile) on random tars, mutated (odd number fields with
their checksums made right, random header bytes, pax records, cuts) and compressed (gzip, bzip2, xz, lzma; cut,
bit-flipped or followed by junk), then on tars built from raw parts (pax extended and global headers, GNU long
names, old GNU sparse members, GNU incremental headers, unknown types, prefixes). Each case must give the same
count or the same PD_E* code; disagreeing files are kept in the work directory and the first few printed.

    usage: scripts/fuzz-tar-readers.py PERMCTL [SEED [CASES]]   (NORMAL=0.97 makes fewer number fields odd)
"""
import bz2
import gzip
import io
import lzma
import os
import random
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import permd  # noqa: E402
from permd import layout  # noqa: E402

PERMCTL = sys.argv[1] if len(sys.argv) > 1 else "build/bin/permctl"
CODES = {-1: "PD_EINVAL", -4: "PD_EOVERFLOW", -5: "PD_EIO", -7: "PD_ENOTFOUND", -11: "PD_ETOOBIG",
         -12: "PD_EUNSUPPORTED"}
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
N = int(sys.argv[3]) if len(sys.argv) > 3 else 300
D = tempfile.mkdtemp(prefix="permd-fuzz-tars-")


def base_tar():
    fmt = rng.choice([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as tf:
        if fmt == tarfile.PAX_FORMAT and rng.random() < 0.3:
            tf.pax_headers = {"comment": "x" * rng.randint(0, 50)}
        for i in range(rng.randint(1, 12)):
            k = rng.choice(["a", "b", "k%d" % i, "d/x", "ü", "x" * 120 + "/y", "p" * 150, "__m__", "z.v/q"])
            e = rng.choice(["jpg", "JPG", "cls", "", "tar.gz", "Σ", "ς"])
            name = k + ("." + e if e else "")
            ti = tarfile.TarInfo(name)
            r = rng.random()
            if r < 0.1:
                ti.type = tarfile.DIRTYPE
            elif r < 0.15:
                ti.type, ti.linkname = tarfile.SYMTYPE, "zz"
            data = b"" if ti.type != tarfile.REGTYPE else os.urandom(rng.randint(0, 1200))
            ti.size = len(data)
            try:
                tf.addfile(ti, io.BytesIO(data))
            except ValueError:
                pass
    return bytearray(bio.getvalue())


def headers(b):
    """Offsets of 512-byte blocks that look like headers (a checksum that matches)."""
    out = []
    for off in range(0, len(b) - 511, 512):
        h = b[off:off + 512]
        try:
            chk = int(bytes(h[148:156]).split(b"\0")[0].strip() or b"0", 8)
        except ValueError:
            continue
        if chk == 256 + sum(h[:148]) + sum(h[156:]):
            out.append(off)
    return out


def rechk(b, off):
    h = b[off:off + 512]
    h[148:156] = b" " * 8
    b[off + 148:off + 156] = b"%06o\0 " % sum(h)


FIELDS = [(100, 8), (108, 8), (116, 8), (124, 12), (136, 12), (156, 1), (257, 8), (329, 8), (337, 8), (345, 12),
          (345, 155), (0, 100)]
JUNK = [b"0000888\0", b"  17 \0", b"-1\0", b"0o17\0", b"1_7\0", b"\x80\0\0\0\0\0\0\x05", b"\xff" * 8, b"\x1c12\x1f\0",
        b"x", b"0", b"\0", b"5", b"g", b"x", b"L", b"S", b"K", b"Z", b"13602760400\0", b"ustar  \0", b"ustar\x0000",
        b"a.jpg/", b"\xc3\xa9/", b"\xff\xfe", b"00000001000\0", b"77777777777\0"]


def mutate(b):
    hs = headers(b)
    op = rng.random()
    if op < 0.45 and hs:  # a field set to something odd, the checksum made right again
        off = rng.choice(hs)
        f, n = rng.choice(FIELDS)
        v = rng.choice(JUNK)[:n]
        b[off + f:off + f + len(v)] = v
        rechk(b, off)
    elif op < 0.6 and hs:  # random bytes in a header, the checksum right or not
        off = rng.choice(hs)
        for _ in range(rng.randint(1, 4)):
            b[off + rng.randrange(512)] = rng.randrange(256)
        if rng.random() < 0.7:
            rechk(b, off)
    elif op < 0.75:  # a pax record edited
        i = b.find(b" path=")
        if i < 0:
            i = b.find(b" comment=")
        if i > 0:
            b[i - 1:i] = rng.choice([b"9", b"0", b"x", b"1"])
    elif op < 0.9:  # cut
        del b[rng.randrange(1, len(b)):]
    return b


def compress(b):
    k = rng.choice(["none", "none", "gz", "bz2", "xz", "lzma"])
    if k == "gz":
        c = bytearray(gzip.compress(bytes(b)))
    elif k == "bz2":
        c = bytearray(bz2.compress(bytes(b)))
    elif k == "xz":
        c = bytearray(lzma.compress(bytes(b)))
    elif k == "lzma":
        c = bytearray(lzma.compress(bytes(b), format=lzma.FORMAT_ALONE))
    else:
        return b
    r = rng.random()
    if r < 0.15:
        del c[rng.randrange(1, len(c)):]
    elif r < 0.3:
        c[rng.randrange(len(c))] ^= 1 << rng.randrange(8)
    elif r < 0.4:
        c += rng.choice([b"\0" * rng.randint(1, 9), b"junk", c[:20], bytes(c)])
    return c


def run_c(p):
    try:  # a reader that loops on crafted input is a finding, not a stuck fuzzer (these tars are tiny)
        r = subprocess.run([PERMCTL, "shards", "--tars", p], capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None, "a hang (60 s)"
    if r.returncode == 0:
        return int(r.stdout.split(b"\t")[0]), None
    return None, r.stderr.decode("utf-8", "replace").strip().rsplit("(", 1)[-1].rstrip(")")


def run_py(p):
    try:
        return layout.count_tar(p), None
    except permd.LayoutError as e:
        return None, CODES[e.code]


def compare(label, prefix, make):
    """Run N cases of make(): each tar written, read by both, kept when they disagree; the disagreements."""
    bad, seen = 0, {}
    for t in range(N):
        p = f"{D}/{prefix}{t}.tar"
        with open(p, "wb") as f:
            f.write(make())
        c, py = run_c(p), run_py(p)
        key = c[1] or "ok"
        seen[key] = seen.get(key, 0) + 1
        if c == py:
            os.unlink(p)
            continue
        bad += 1
        if bad <= 8:
            r = subprocess.run([PERMCTL, "shards", "--tars", p], capture_output=True)
            try:
                layout.count_tar(p)
                pm = ""
            except permd.LayoutError as e:
                pm = str(e)
            print(p, "C", c, r.stderr.decode("utf-8", "replace").strip()[:200], "| Py", py, pm[:200])
    print(N, label + ",", bad, "disagreements", seen)
    return bad


def mutated_tar():
    b = base_tar()
    for _ in range(rng.randint(0, 3)):
        b = mutate(b)
    return compress(b)


total_bad = compare("cases", "f", mutated_tar)


# ---- Raw tars from parts: pax records, global headers, GNU long names, sparse members, odd numbers ----------
NORMAL = float(os.environ.get("NORMAL", "0.7"))


def num(v, n):
    r = rng.random()
    if r < NORMAL:
        return (b"%0*o" % (n - 1, max(v, 0)))[-(n - 1):] + b"\0"
    if r < 0.8:
        return b"\x80" + max(v, 0).to_bytes(n - 1, "big")
    if r < 0.85:
        return b"\xff" * n
    return rng.choice([b" %o \0" % max(v, 0), b"0o%o\0" % max(v, 0), b"-%o\0" % abs(v), b"1_0\0", b"\x1c%o\0" % max(v, 0)])[:n].ljust(n, b"\0")


def hdr(name, size, typ=b"0", prefix=b"", magic=b"ustar\x0000", extra=None):
    if isinstance(name, str):
        name = name.encode("utf-8", "surrogateescape")
    h = bytearray(512)
    h[0:len(name[:100])] = name[:100]
    h[100:108] = num(0o644, 8)
    h[108:116] = num(0, 8)
    h[116:124] = num(0, 8)
    h[124:136] = num(size, 12)
    h[136:148] = num(0, 12)
    h[156:157] = typ
    h[257:265] = magic
    h[345:345 + len(prefix[:155])] = prefix[:155]
    for off, v in (extra or {}).items():
        h[off:off + len(v)] = v
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def pad(d):
    return d + b"\0" * (-len(d) % 512)


def rec(k, v):
    body = b" " + k + b"=" + v + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n = len(str(n)) + len(body)
    return str(n).encode() + body


PAXV = {b"path": [b"a.jpg", b"a.jpg/", b"x/__m__/a.b", b"n\nl.jpg", b"k.\xc3\x89", b"zz.png", b"a\0b.jpg"],
        b"size": [b"0", b"5", b"\xd9\xa3", b" 7", b"1_0", b"x", b"-3", b"999999999999999"],
        b"GNU.sparse.name": [b"s.jpg", b"a.jpg"], b"GNU.sparse.size": [b"3", b"x", b"\xd9\xa3"],
        b"GNU.sparse.realsize": [b"4", b"?"], b"GNU.sparse.map": [b"0,1", b"0,x", b""],
        b"GNU.sparse.major": [b"1"], b"GNU.sparse.minor": [b"0"], b"GNU.sparse.offset": [b"0", b"q"],
        b"GNU.sparse.numbytes": [b"1"], b"mtime": [b"1.5"], b"hdrcharset": [b"BINARY"]}


def raw_tar():
    out = b""
    for i in range(rng.randint(1, 8)):
        r = rng.random()
        name = rng.choice(["a.jpg", "a.txt", "b.jpg", "k%d.cls" % i, "d.v/e.jpg", "__x__", "n\nm.jpg", "A.JPG",
                           "x/.h", "a.jpg/"])
        data = os.urandom(rng.randint(0, 700))
        if r < 0.25:  # pax x or g
            recs = b"".join(rec(k, rng.choice(PAXV[k])) for k in rng.sample(list(PAXV), rng.randint(1, 3)))
            r = rng.random()
            if r < 0.1:  # a record's framing broken: no newline, a length too short, too long, past 20 digits
                recs = recs[:-1] + b"X"
            elif r < 0.2:
                recs = rng.choice([b"0", b"4", b"99999999999999", b"0" * 21 + b"9"]) + recs[recs.index(b" "):]
            out += hdr("././@PaxHeader", len(recs), rng.choice([b"x", b"x", b"g", b"X"])) + pad(recs)
        elif r < 0.35:  # GNU long name
            ln = rng.choice([b"long/" * 30 + b"l.jpg", b"q.jpg\0junk", b"w.JPG"])
            out += hdr("././@LongLink", len(ln), rng.choice([b"L", b"K"]), magic=b"ustar  \0") + pad(ln)
        elif r < 0.42:  # old GNU sparse
            ext = rng.random() < 0.5
            extra = {386: num(0, 12), 398: num(len(data), 12), 482: b"\1" if ext else b"\0", 483: num(len(data), 12)}
            out += hdr(name, len(data), b"S", magic=b"ustar  \0", extra=extra)
            if ext:
                e = bytearray(512)
                e[0:12] = num(1, 12)
                e[12:24] = num(2, 12)
                if rng.random() < 0.2:
                    e[30] = ord("z")
                out += bytes(e)
            out += pad(data)
            continue
        elif r < 0.5:  # GNU incremental: atime/ctime where ustar keeps its prefix
            out += hdr(name, len(data), magic=b"ustar  \0", extra={345: b"13602760400\0", 357: b"13602760400\0"}) + pad(data)
            continue
        elif r < 0.55:
            out += hdr(name, len(data), rng.choice([b"Z", b"1", b"5", b"\0", b"7", b"2"])) + pad(data)
            continue
        elif r < 0.6:
            out += hdr(name, len(data), prefix=rng.choice([b"pre", b"p.q", b"\xff"])) + pad(data)
            continue
        out += hdr(name, len(data), magic=rng.choice([b"ustar\x0000", b"ustar  \0", b"\0" * 8])) + pad(data)
    if rng.random() < 0.9:
        out += b"\0" * 1024
    return bytearray(out)


def raw_case():
    b = raw_tar()
    if rng.random() < 0.3:
        b = mutate(b)
    return compress(b)


total_bad += compare("raw cases", "r", raw_case)
if not total_bad:
    os.rmdir(D)
else:
    print("kept in", D)
sys.exit(1 if total_bad else 0)
