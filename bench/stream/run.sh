#!/usr/bin/env bash
# bench/stream: shoal-engine streaming the slice model's experts through
# shoald, each figure a ratio to a bound or baseline measured in the same run
# (docs/performance.md explains the cost model behind each):
#   1. cold: hubmock capping each connection (50 MB/s), shoald with 8
#      transfers; seconds per token vs (network expert bytes per token /
#      the aggregate rate of a plain 8-way parallel curl fetch of as many
#      bytes + compute per token)                         (target <= 1.15)
#   2. warm disk, page cache dropped (posix_fadvise DONTNEED on every cache
#      file): seconds per token vs max(compute, disk expert bytes per token /
#      the cold read rate of the same blobs, 8 threads, the mean of reads
#      just before and just after the run)                (target <= 1.2),
#      for each page-cache policy (keep, dontneed, direct), with the expert
#      bytes each leaves in the page cache
#   3. chunked prefill of a 64-token prompt vs token at a time (target >= 3)
#   4. lookahead: recall per MoE layer (vs the previous-token predictor)
#      and the share of expert waiting it removes (prefetch on vs off)
#   5. the RAM tier (--expert-ram 1G) vs none, page cache dropped
# BENCH_STREAM_TOKENS (default 4) sets the generated tokens per run;
# BENCH_STREAM_REPS (default 3) the interleaved rounds of the warm and
# prefill runs (the figure is the run with the median ratio).
set -eu
cd "$(dirname "$0")/../.."
. bench/lib/hub.sh
BIN=${BIN:-bin}
OUT=${SHOAL_BENCH_OUT:-bench/out/results.jsonl}
mkdir -p "$(dirname "$OUT")"
for b in shoal-engine shoald shoal hubmock mkmodel hubget; do
    [ -x "$BIN/$b" ] || { echo "bench/stream: $BIN/$b not built (make)"; exit 1; }
done
command -v curl >/dev/null || { echo "bench/stream: curl not installed"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/shoal-bench-stream.XXXXXX")
HPID=
trap '[ -n "$HPID" ] && kill "$HPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT

"$BIN/mkmodel" --quiet --preset slice --out "$T/model"
bench_hubmock bench/stream "$T/model"

/usr/bin/python3 "$(dirname "$0")/stream.py" "$T" "$HUB" "$BIN" "$OUT" "${BENCH_STREAM_TOKENS:-4}"
