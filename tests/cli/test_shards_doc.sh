#!/usr/bin/env bash
# CLI test: makes the WebDataset tars and the MDS index docs/shards.md describes, then runs its console
# session verbatim in their directory (through test_quickstart.sh), and its Python example there.
set -euo pipefail
BIN=${1:?usage: test_shards_doc.sh BIN_DIR SOURCE_DIR}
SRC=${2:?}
WORK=$(mktemp -d /tmp/permd-shards-doc-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
python3 - <<'PY'
import io, json, os, tarfile
os.makedirs("wds"); os.makedirs("mds")
for i, k in enumerate([5, 3, 4, 2]):  # shard i: k samples of a .jpg and a .cls
    with tarfile.open(f"wds/shard-{i:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as t:
        for n in [f"{i:02d}{j:04d}.{e}" for j in range(k) for e in ("jpg", "cls")]:
            ti = tarfile.TarInfo(n); ti.size = 16; t.addfile(ti, io.BytesIO(b"x" * 16))
shards = [{"column_encodings": ["str", "int"], "column_names": ["text", "label"], "column_sizes": [None, 8],
           "compression": None, "format": "mds", "hashes": [],
           "raw_data": {"basename": f"shard.{i:05d}.mds", "bytes": 4096, "hashes": {}}, "samples": n,
           "size_limit": 67108864, "version": 2, "zip_data": None} for i, n in enumerate([100, 80, 120])]
json.dump({"shards": shards, "version": 2}, open("mds/index.json", "w"), sort_keys=True)
PY
"$SRC/tests/cli/test_quickstart.sh" "$BIN" "$SRC" docs/shards.md
awk '/^```python$/{on=1; next} /^```$/{if (on) exit} on' "$SRC/docs/shards.md" >example.py
[ -s example.py ] || { echo "FAIL: no python block in docs/shards.md" >&2; exit 1; }
if [ -n "${PERMD_LIB:-}" ]; then # unset in sanitizer builds, whose libpermd python cannot load
  PYTHONPATH="$SRC/python" python3 example.py || { echo "FAIL: docs/shards.md's Python example" >&2; exit 1; }
else
  echo "the Python example is skipped here (no PERMD_LIB: a sanitizer build)"
fi
echo ok
