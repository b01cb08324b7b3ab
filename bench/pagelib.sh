# bench/pagelib.sh: sourced by the bench/*.sh scripts that write a results page (bench/results/*.md).
#
# bench_tree: the tree measured: $PERMD_TREE, else this checkout's short commit, else "unknown". A copy run on
# another machine (tests/gpu/run.sh) may carry a stale .git: name the tree there with PERMD_TREE.
bench_tree() {
  echo "${PERMD_TREE:-$(git -C "$(dirname "${BASH_SOURCE[0]}")/.." rev-parse --short HEAD 2>/dev/null || echo unknown)}"
}

# bench_kept PAGE: what a rerun keeps of PAGE, printed: its sections from the first heading that says
# "(by hand" to the end (notes written by hand below the generated tables); nothing when there are none.
bench_kept() {
  [ -f "$1" ] || return 0
  awk '/^#+ .*\(by hand/ {on = 1} on' "$1"
}

# bench_append_kept KEPT: print KEPT after a blank line, if there is any.
bench_append_kept() {
  [ -z "$1" ] || printf '\n%s\n' "$1"
}
