#!/usr/bin/env bash
# bench/mpi: expert parallelism over MPI (docs/mpi.md, "Measured").  The
# slice (K3's 17.5 MB experts, 16 of them routed per token, 3 MoE layers)
# through warm shoald caches, decoded the same way twice in one run:
#   baseline: one process (shoal-engine run, its own shoald);
#   figure:   mpirun -np 3 ... --experts-over-ranks (rank 0 the spine,
#             ranks 1 and 2 the experts, each with its own shoald)
# on this machine's cores and loopback.  Figures: the per-token decode
# time (median), rank 0's communication per MoE layer run (span from the
# inputs sent to the last output in, less the busiest owner's time) beside
# the single process's whole MoE layer time, and the bytes per position
# beside the cost model's 2 · k · L · 4 per MoE layer.  Both runs must give
# the same ids (the test checks the logits).  Skipped, with the reason,
# when no MPI build can be made (no mpicc).
set -eu
cd "$(dirname "$0")/../.."
. bench/lib/hub.sh
BIN=${BIN:-bin}
BUILD=${BUILD:-build}
OUT=${SHOAL_BENCH_OUT:-bench/out/results.jsonl}
TOKENS=${BENCH_MPI_TOKENS:-8}
mkdir -p "$(dirname "$OUT")"
for b in shoal-engine shoald hubmock mkmodel shoal; do
    [ -x "$BIN/$b" ] || { echo "bench/mpi: $BIN/$b not built (make)"; exit 1; }
done
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
    echo "bench/mpi: skipped: no mpicc/mpirun (scripts/deps.sh installs libopenmpi-dev and openmpi-bin)"
    exit 0
fi
MB=$BUILD-mpi
make --no-print-directory -j2 MPI=1 BUILD="$MB" BIN="$MB/bin" "$MB/bin/shoal-engine" > /dev/null 2>&1 \
    || { echo "bench/mpi: skipped: make MPI=1 failed (run it by hand to see why)"; exit 0; }
EM=$MB/bin/shoal-engine
MPIRUN=(mpirun --oversubscribe -np 3)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
T=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-mpi.XXXXXX")
HPID= DPIDS=()
trap 'for p in "${DPIDS[@]}"; do kill "$p" 2>/dev/null; done; [ -n "$HPID" ] && kill "$HPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT

"$BIN/mkmodel" --quiet --preset slice --experts 16 --out "$T/model"
bench_hubmock bench/mpi "$T/model"
for r in 0 1 2; do
    mkdir -p "$T/h$r"
    "$BIN/shoald" --home "$T/h$r" --no-fsync --log "$T/shoald$r.log" &
    DPIDS+=($!)
done
for r in 0 1 2; do
    for _ in $(seq 200); do grep -q 'ready on' "$T/shoald$r.log" 2>/dev/null && break; sleep 0.1; done
done
for r in 0 1 2; do   # every cache warm: the figure is compute and messages, not the Hub
    "$BIN/shoal" --home "$T/h$r" warm hf://org/slice --wait > /dev/null 2>&1 \
        || { echo "bench/mpi: warm of home $r failed"; exit 1; }
done
P=7,100,300,5,9,42,11,12
ARGS=(--tokens $P --max-tokens "$TOKENS" --threads 2 --expert-ram 2G --stats)
one() { "$BIN/shoal-engine" run hf://org/slice --home "$T/h0" "${ARGS[@]}" > "$T/o1" 2> "$T/e1" \
        || { cat "$T/e1"; exit 1; }; }
many() { "${MPIRUN[@]}" "$EM" run hf://org/slice --home "$T/h%r" --experts-over-ranks "${ARGS[@]}" \
         > "$T/o3" 2> "$T/e3" || { cat "$T/e3"; exit 1; }; }
one; many                       # first runs fill the RAM tiers and the spine packs
one; many
cmp -s "$T/o1" "$T/o3" || { echo "bench/mpi: ids differ: $(cat "$T/o1") vs $(cat "$T/o3")"; exit 1; }
median_tok() {  # FILE: median of the decode steps' ms
    sed -n 's/^stats: per-token ms: //p' "$1" | tr ' ' '\n' | grep . | sort -g \
        | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
D1=$(median_tok "$T/e1")
D3=$(median_tok "$T/e3")
L1=$(sed -n 's/.*per MoE layer \([0-9.]*\) ms.*/\1/p' "$T/e1" | head -n 1)
COMM=$(sed -n 's/.*communication \([0-9.]*\) ms.*/\1/p' "$T/e3" | head -n 1)
SPAN=$(sed -n 's/.*span \([0-9.]*\) ms.*/\1/p' "$T/e3" | head -n 1)
BPT=$(sed -n 's/.*per token \([0-9]*\) bytes.*/\1/p' "$T/e3" | head -n 1)
# the model: per position, per MoE layer, k experts' inputs and outputs of L floats
MODEL=$(awk 'BEGIN {print 3 * 16 * 3584 * 4 * 2}')
r() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.6g", (b > 0 ? a / b : 0)}'; }
echo "bench/mpi: slice (16 experts, top-16, 3 MoE layers), $TOKENS tokens, warm caches, 2 threads a rank"
grep '^stats: ranks:' "$T/e3" | sed 's/^/bench\/mpi: /'
printf '%-40s %12.4g %-6s vs %s %.4g %s  ratio %.3f\n' mpi.decode_per_token "$D3" ms \
    "one process" "$D1" ms "$(r "$D3" "$D1")"
printf '%-40s %12.4g %-6s vs %s %.4g %s  ratio %.3f\n' mpi.comm_per_moe_layer "$COMM" ms \
    "one process's MoE layer" "$L1" ms "$(r "$COMM" "$L1")"
printf '%-40s %12.4g %-6s vs %s %.4g %s  ratio %.3f\n' mpi.bytes_per_position "$BPT" B \
    "the model's 2·k·L·4 per MoE layer" "$MODEL" B "$(r "$BPT" "$MODEL")"
{
printf '{"name":"mpi.decode_per_token","value":%s,"unit":"ms","baseline":"one process, same model, caches and threads (median decode step)","baseline_value":%s,"ratio":%s,"better":"lower","target":null}\n' \
    "$D3" "$D1" "$(r "$D3" "$D1")"
printf '{"name":"mpi.comm_per_moe_layer","value":%s,"unit":"ms","baseline":"one process: a whole MoE layer run (per MoE layer)","baseline_value":%s,"ratio":%s,"better":"lower","target":null}\n' \
    "$COMM" "$L1" "$(r "$COMM" "$L1")"
printf '{"name":"mpi.span_per_moe_layer","value":%s,"unit":"ms","baseline":"one process: a whole MoE layer run (per MoE layer)","baseline_value":%s,"ratio":%s,"better":"lower","target":null}\n' \
    "$SPAN" "$L1" "$(r "$SPAN" "$L1")"
printf '{"name":"mpi.bytes_per_position","value":%s,"unit":"B","baseline":"cost model: 2 x 16 experts x 3584 x 4 B x 3 MoE layers","baseline_value":%s,"ratio":%s,"better":"lower","target":null}\n' \
    "$BPT" "$MODEL" "$(r "$BPT" "$MODEL")"
} >> "$OUT"
