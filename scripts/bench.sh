#!/usr/bin/env bash
# make bench: runs every benchmark and gathers their figures.
#
# Each benchmark (a build/bench/NAME program, or an executable
# bench/NAME/run.sh) measures its own baseline in the same run and records
# figures through bench/lib (one JSON object per line in
# bench/out/results.jsonl).  At the end the lines become
# bench/out/results.json: a list of {name, value, unit, baseline,
# baseline_value, ratio, better, target}.
#   scripts/bench.sh [NAME...]   only the named benchmarks
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${BIN:-bin}
export BUILD BIN SHOAL_ROOT=$PWD
mkdir -p bench/out
export SHOAL_BENCH_OUT=$PWD/bench/out/results.jsonl
: > "$SHOAL_BENCH_OUT"
want=" $* "
failed=0

run() {
    local name=$1; shift
    [ "$want" = "  " ] || [[ $want == *" $name "* ]] || return 0
    echo "== bench/$name"
    "$@" || { echo "bench/$name failed (exit $?)"; failed=1; }
}

for b in "$BUILD"/bench/*; do
    [ -x "$b" ] && [ -f "$b" ] || continue
    case $b in *.d|*.o) continue ;; esac
    run "$(basename "$b")" "$b"
done
for s in bench/*/run.sh; do
    [ -x "$s" ] || continue
    run "$(basename "$(dirname "$s")")" "$s"
done

node -e '
const fs = require("fs");
const lines = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean);
const out = lines.map(l => JSON.parse(l));
fs.writeFileSync(process.argv[2], JSON.stringify(out, null, 2) + "\n");
const below = out.filter(r => r.ratio !== null && r.target !== null &&
    (r.better === "lower" ? r.ratio > r.target : r.ratio < r.target));
console.log(`bench: ${out.length} figures in ${process.argv[2]}` +
    (below.length ? `; below target: ${below.map(r => r.name).join(", ")}` : ""));
' "$SHOAL_BENCH_OUT" bench/out/results.json
exit $failed
