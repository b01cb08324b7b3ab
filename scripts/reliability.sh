#!/usr/bin/env bash
# Runs the reliability suite's long variants (fuzzers, load, faults, kill -9 durability, security) and writes
# their figures into docs/reliability.md between its figures markers. Takes ~10 minutes on 2 CPUs.
#   usage: bash scripts/reliability.sh   (FUZZ_SECONDS=60 per target, LOAD_SECONDS=60 per transport)
set -euo pipefail
cd "$(dirname "$0")/.."
doc=docs/reliability.md
tmp=$(mktemp -d /tmp/permd-reliability-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export PERMD_LONG_TESTS=1

bash scripts/build.sh >/dev/null
echo "== fuzz" >&2
FUZZ_SECONDS=${FUZZ_SECONDS:-60} bash scripts/fuzz.sh >"$tmp/fuzz.txt"
echo "== load" >&2
LOAD_RESULTS="$tmp/load.txt" bash tests/load/run_load.sh build/bin >"$tmp/load.log" 2>&1
echo "== faults, security, durability" >&2
for t in test_faults test_security test_durability; do
  build/bin/$t >"$tmp/$t.log" 2>&1 || { cat "$tmp/$t.log" >&2; exit 1; }
done

kv() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }
{
  echo "<!-- figures:begin (written by scripts/reliability.sh; do not edit by hand) -->"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, $(free -g | awk '/^Mem/{print $2}') GiB ($(uname -sr))"
  echo "- command: \`bash scripts/reliability.sh\` (PERMD_LONG_TESTS=1, FUZZ_SECONDS=${FUZZ_SECONDS:-60}), Release build; fuzzers under ASan+UBSan"
  echo "- commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo ' (with local changes)')"
  echo
  echo "| fuzz target | seconds | executions | crashes | corpus after |"
  echo "|---|---:|---:|---:|---:|"
  while read -r line; do
    echo "| \`${line%% *}\` | $(kv "$line" seconds) | $(kv "$line" execs) | $(kv "$line" crashes) | $(kv "$line" corpus) |"
  done <"$tmp/fuzz.txt"
  echo
  echo "| load: transport | clients | seconds | requests | errors | requests/s | p50 | p99 | p99.9 | max | permd RSS (peak) |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  while read -r line; do
    ms() { awk -v u="$(kv "$line" "$1")" 'BEGIN{printf "%.1f ms", u / 1000}'; }
    echo "| $(kv "$line" transport) | $(kv "$line" clients) | $(kv "$line" seconds) | $(kv "$line" requests) | $(kv "$line" errors) | $(kv "$line" rps) | $(ms p50_us) | $(ms p99_us) | $(ms p999_us) | $(ms max_us) | $(( $(kv "$line" rss_kb) / 1024 )) MiB ($(( $(kv "$line" hwm_kb) / 1024 )) MiB) |"
  done <"$tmp/load.txt"
  echo
  echo "Faults, durability and security (each test's own report):"
  echo
  echo '```'
  for t in test_faults test_durability test_security; do
    # durability reports after every kill: keep its first line and the last count
    grep -E "RSS growth|rounds|refused|PASSED|FAILED" "$tmp/$t.log" | sed "s/^/$t: /"
    grep -E "kills" "$tmp/$t.log" | tail -1 | sed "s/^/$t: /"
  done
  echo '```'
  echo
  echo "<!-- figures:end -->"
} >"$tmp/figures.md"

python3 - "$doc" "$tmp/figures.md" <<'PY'
import re, sys
doc, fig = sys.argv[1], open(sys.argv[2]).read()
text = open(doc).read()
text = re.sub(r"<!-- figures:begin.*?<!-- figures:end -->\n", lambda m: fig, text, flags=re.S)
open(doc, "w").write(text)
PY
cat "$tmp/figures.md"
