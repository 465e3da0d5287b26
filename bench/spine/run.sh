#!/usr/bin/env bash
# bench/spine: the cached int8 spine (issue 9).  The slice model through
# shoald, with its BF16 spine already in the disk cache, loaded two ways in
# the same run, alternating, BENCH_SPINE_RUNS (default 3) times each:
#   baseline: --spine-cache off: GET every BF16 spine tensor, quantize at load
#   figure:   the pack the first load stored: GET and map it, nothing quantized
# Both times are the engine's own "stats: spine ... in X ms" (first spine GET
# to the model bound; the pack's includes hashing it).  Medians; the ratio
# is pack / quantize (lower is better).
set -eu
cd "$(dirname "$0")/../.."
. bench/lib/hub.sh
BIN=${BIN:-bin}
OUT=${SHOAL_BENCH_OUT:-bench/out/results.jsonl}
RUNS=${BENCH_SPINE_RUNS:-3}
mkdir -p "$(dirname "$OUT")"
for b in shoal-engine shoald hubmock mkmodel; do
    [ -x "$BIN/$b" ] || { echo "bench/spine: $BIN/$b not built (make)"; exit 1; }
done
T=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-spine.XXXXXX")
HPID= DPID=
trap '[ -n "$DPID" ] && kill "$DPID" 2>/dev/null; [ -n "$HPID" ] && kill "$HPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT

"$BIN/mkmodel" --quiet --preset slice --out "$T/model"
bench_hubmock bench/spine "$T/model"
mkdir -p "$T/home"
"$BIN/shoald" --home "$T/home" --no-fsync --log "$T/shoald.log" &
DPID=$!
for _ in $(seq 200); do grep -q 'ready on' "$T/shoald.log" 2>/dev/null && break; sleep 0.1; done

load_ms() {   # ARGS... -> the spine load time in ms
    "$BIN/shoal-engine" run hf://org/slice --home "$T/home" --tokens 1,2,3 --max-tokens 1 \
        --stats "$@" 2>"$T/err" >/dev/null || { cat "$T/err" >&2; exit 1; }
    sed -n 's/^stats: spine .* in \([0-9.]*\) ms.*/\1/p' "$T/err" | tail -n 1
}
load_ms >/dev/null                      # fetches the spine, quantizes, stores the pack
grep -q 'stored spine-int8' "$T/shoald.log" || { echo "bench/spine: no pack stored"; exit 1; }
q=() p=()
for _ in $(seq "$RUNS"); do
    q+=("$(load_ms --spine-cache off)")
    p+=("$(load_ms)")
    grep -q 'mapped from the cached int8 pack' "$T/err" || { echo "bench/spine: pack not used"; cat "$T/err"; exit 1; }
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
Q=$(median "${q[@]}")
P=$(median "${p[@]}")
R=$(awk -v p="$P" -v q="$Q" 'BEGIN {printf "%.6g", p / q}')
PACK=$(sed -n 's/.*stored spine-int8-p1-q1 (\([0-9]*\) bytes).*/\1/p' "$T/shoald.log" | head -n 1)
echo "bench/spine: slice model, pack of ${PACK:-?} bytes; quantize runs (ms): ${q[*]}; pack runs (ms): ${p[*]}"
printf '%-40s %12.4g %-6s vs %s %.4g %s  ratio %.3f\n' spine.load_cached_pack "$P" ms \
    "quantizing the BF16 spine at load" "$Q" ms "$R"
printf '{"name":"spine.load_cached_pack","value":%s,"unit":"ms","baseline":"quantizing the BF16 spine at load (disk-cached BF16, --spine-cache off)","baseline_value":%s,"ratio":%s,"better":"lower","target":null}\n' \
    "$P" "$Q" "$R" >> "$OUT"
