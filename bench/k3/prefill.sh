#!/usr/bin/env bash
# bench/k3/prefill.sh — layer-major prefill at full K3 width (issue 16 item 2).
#
# A K3 of every width with 896 experts per MoE layer and top-16, cut to
# K3_PREFILL_LAYERS layers (default 2: KDA + dense, MLA + MoE; each MoE layer
# is 15.7 GB of experts), synthesized by hubmock, warmed whole into a fresh
# shoald cache (budget K3_PREFILL_BUDGET, default 40G), then a prompt of
# K3_PREFILL_TOKENS (default 512) pseudo-random ids run with --max-tokens 1,
# --expert-ram 0 (no RAM tier: every expert comes from disk), O_DIRECT reads
# and no router guesses, twice, each after the page cache was dropped:
#   layer-major: --chunk auto (the plan takes the prompt as one chunk)
#   chunk 16:    --chunk 16, the old prefill
# and, right before each, the disk's cold read rate: the same 16-reader
# O_DIRECT reads of 4 MiB over K3_PREFILL_PROBE (default 64) expert blobs
# of the cache, after the same drop.  The figures (docs/performance.md):
#   bytes: expert bytes read <= 1.05 x distinct experts x expert bytes
#   time:  prefill s <= 1.3 x max(compute s, those bytes / the cold rate)
# where compute is the prefill's time outside waiting for experts.  Needs
# root (drop_caches) and ~30 GB of disk per MoE layer plus ~10 GB; the cache
# is deleted at the end (K3_PREFILL_KEEP=1 keeps it, with its path printed).
# Results go to $SHOAL_BENCH_OUT (default bench/out/results.jsonl) as
# k3.prefill.* lines.  Run by `make bench-k3`; too heavy for `make bench`.
set -eu
cd "$(dirname "$0")/../.."
. bench/lib/hub.sh
BIN=${BIN:-bin}
OUT=${SHOAL_BENCH_OUT:-bench/out/results.jsonl}
LAYERS=${K3_PREFILL_LAYERS:-2}
EXPERTS=${K3_PREFILL_EXPERTS:-896}   # fewer only to try the script out quickly
TOKENS=${K3_PREFILL_TOKENS:-512}
BUDGET=${K3_PREFILL_BUDGET:-40G}
PROBE=${K3_PREFILL_PROBE:-64}
THREADS=${K3_PREFILL_THREADS:-$(nproc)}
NAME=bench/k3/prefill
mkdir -p "$(dirname "$OUT")"
for b in shoal-engine shoald shoal hubmock; do
    [ -x "$BIN/$b" ] || { echo "$NAME: $BIN/$b not built (make)"; exit 1; }
done
[ -w /proc/sys/vm/drop_caches ] || { echo "$NAME: needs root to drop the page cache"; exit 1; }
T=$(mktemp -d "${K3_PREFILL_DIR:-${TMPDIR:-/tmp}}/shoal-bench-k3-prefill.XXXXXX")
HPID= DPID=
cleanup() {
    [ -n "$DPID" ] && kill "$DPID" 2>/dev/null
    [ -n "$HPID" ] && kill "$HPID" 2>/dev/null
    wait 2>/dev/null
    if [ "${K3_PREFILL_KEEP:-0}" = 1 ]; then echo "$NAME: kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
log() { echo "$NAME: $*" >&2; }

# --- the model, the daemon, the warm cache -------------------------------------
"$BIN/hubmock" --synth "org/k3p=k3,layers=$LAYERS,experts=$EXPERTS" >"$T/hub.log" 2>&1 &
HPID=$!
for _ in $(seq 6000); do grep -q '^hub ' "$T/hub.log" && break; sleep 0.1; done
HUB=$(sed -n 's/^hub \(http:[^ ]*\) cdn .*/\1/p' "$T/hub.log")
[ -n "$HUB" ] || { echo "$NAME: hubmock did not start"; cat "$T/hub.log"; exit 1; }
export HF_ENDPOINT=$HUB
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
H=$T/home
mkdir -p "$H"
export SHOAL_HOME=$H
"$BIN/shoald" --home "$H" --max-size "$BUDGET" --no-fsync --log "$T/shoald.log" &
DPID=$!
for _ in $(seq 200); do grep -q 'ready on' "$T/shoald.log" 2>/dev/null && break; sleep 0.1; done
grep -q 'ready on' "$T/shoald.log" || { echo "$NAME: shoald did not start"; cat "$T/shoald.log"; exit 1; }
M=hf://org/k3p
t0=$(date +%s)
"$BIN/shoal" warm "$M" --wait >"$T/warm.log" 2>&1 || { echo "$NAME: warm failed"; tail "$T/warm.log"; exit 1; }
log "warmed $(du -sh "$H" | cut -f1) in $(( $(date +%s) - t0 )) s"
# the spine pack: built and stored by a first load (not measured)
"$BIN/shoal-engine" run "$M" --tokens 1 --max-tokens 1 --threads "$THREADS" >/dev/null \
    2>"$T/first.err" || { echo "$NAME: first load failed"; tail "$T/first.err"; exit 1; }

CFG=$(curl -sf "$HUB/org/k3p/resolve/main/config.json")
read -r EB E K VOCAB < <(/usr/bin/python3 -c '
import json, sys
c = json.loads(sys.argv[1]); t = c.get("text_config", c)
print(3 * t["moe_intermediate_size"] * t["routed_expert_hidden_size"] * 17 // 32,
      t["num_experts"], t["num_experts_per_token"], t["vocab_size"])' "$CFG")
PROMPT=$(/usr/bin/python3 -c '
import sys
n, v = int(sys.argv[1]), int(sys.argv[2]); x = 12345; out = []
for _ in range(n):
    x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    out.append(str(1000 + (x >> 33) % (v - 2000)))
print(",".join(out))' "$TOKENS" "$VOCAB")
mapfile -t BLOBS < <(find "$H/blobs" -type f -size "${EB}c" | head -n "$PROBE")
[ "${#BLOBS[@]}" -gt 0 ] || { echo "$NAME: no expert blob of $EB bytes in the cache"; exit 1; }

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# the cold read rate (bytes/s): 16 readers, O_DIRECT, 4 MiB requests
cold_rate() {
    drop
    local a b
    a=$(date +%s.%N)
    printf '%s\n' "${BLOBS[@]}" | xargs -P 16 -I{} dd if={} of=/dev/null bs=4M iflag=direct status=none
    b=$(date +%s.%N)
    awk -v n="${#BLOBS[@]}" -v eb="$EB" -v a="$a" -v b="$b" 'BEGIN {printf "%.0f", n * eb / (b - a)}'
}
# one measured prefill: prints "prefill_ms total_ms waiting_ms read_bytes distinct chunks"
prefill() {   # CHUNK
    drop
    "$BIN/shoal-engine" run "$M" --tokens "$PROMPT" --max-tokens 1 --chunk "$1" --stats \
        --expert-ram 0 --page-cache direct --prefetch off --threads "$THREADS" \
        >"$T/out.$1" 2>"$T/err.$1" || { echo "$NAME: run --chunk $1 failed"; tail "$T/err.$1"; exit 1; }
    /usr/bin/python3 - "$T/err.$1" <<'PYEOF'
import re, sys
t = open(sys.argv[1]).read()
def f(rx):
    m = re.search(rx, t, re.M)
    if not m:
        sys.exit("no /%s/ in the engine's --stats" % rx)
    return m.groups()
pre = float(f(r"^stats: load [0-9.]+ ms, prefill \d+ tokens ([0-9.]+) ms")[0])
tot, wait = f(r"^stats: time ([0-9.]+) ms: spine [0-9.]+, experts [0-9.]+, attention [0-9.]+, "
              r"waiting ([0-9.]+)")
rd = float(f(r"^stats: reads: ([0-9.]+) MiB")[0]) * 1048576
dist = int(f(r"^stats: prefill loaded (\d+) distinct")[0])
ch = int(f(r"^stats: prefill of \d+ tokens in (\d+) chunk")[0])
print(pre, tot, wait, int(rd), dist, ch)
PYEOF
}

R1=$(cold_rate); read -r P1 T1 W1 B1 D1 C1 < <(prefill auto)
R2=$(cold_rate); read -r P2 T2 W2 B2 D2 C2 < <(prefill 16)
grep '^plan: prefill chunk\|^stats: prefill of' "$T/err.auto" >&2
grep '^stats: prefill of' "$T/err.16" >&2

# --- the figures ------------------------------------------------------------------
/usr/bin/python3 - "$OUT" "$LAYERS" "$TOKENS" "$EB" "$E" "$K" "$R1" "$P1" "$T1" "$W1" "$B1" "$D1" \
    "$C1" "$R2" "$P2" "$T2" "$W2" "$B2" "$D2" "$C2" <<'PYEOF'
import json, sys
out, layers, tokens, eb, e, k = sys.argv[1], *map(int, sys.argv[2:7])
def run(a):
    rate, pre, tot, wait, rd, dist, ch = map(float, a)
    need = dist * eb
    compute = (tot - wait) / 1e3
    bound = max(compute, need / rate)
    return dict(rate=rate, s=pre / 1e3, compute=compute, read=rd, distinct=int(dist), chunks=int(ch),
                need=need, bytes_ratio=rd / need, bound=bound, time_ratio=pre / 1e3 / bound)
lm, c16 = run(sys.argv[7:14]), run(sys.argv[14:21])
print("bench/k3/prefill: %d layers (full K3 width, %d experts, top-%d, %.1f MiB each), %d tokens"
      % (layers, e, k, eb / 1048576, tokens))
for name, r in (("layer-major", lm), ("chunk 16", c16)):
    print("  %-11s %d chunk(s): %.1f s; %d distinct experts, %.2f GB read (%.3f x distinct x "
          "expert bytes); compute %.1f s, cold read %.2f GB/s -> bound %.1f s (%.2f x)"
          % (name, r["chunks"], r["s"], r["distinct"], r["read"] / 1e9, r["bytes_ratio"],
             r["compute"], r["rate"] / 1e9, r["bound"], r["time_ratio"]))
print("  targets: bytes <= 1.05 x: %s; time <= 1.3 x: %s; chunk 16 / layer-major time %.2f x, "
      "bytes %.2f x" % ("met" if lm["bytes_ratio"] <= 1.05 else "MISSED",
                        "met" if lm["time_ratio"] <= 1.3 else "MISSED",
                        c16["s"] / lm["s"], c16["read"] / lm["read"]))
desc = "%d-layer full-width K3 (%d experts, top-%d), %d-token prompt, page cache dropped" % (
    layers, e, k, tokens)
with open(out, "a") as f:
    for name, v, base, bv, unit, tgt in (
            ("k3.prefill.bytes_read_ratio", lm["bytes_ratio"], "distinct experts x expert bytes",
             1.0, "x", 1.05),
            ("k3.prefill.time_ratio", lm["time_ratio"],
             "max(compute, distinct expert bytes / cold read rate)", 1.0, "x", 1.3),
            ("k3.prefill.seconds", lm["s"], "the same prompt at --chunk 16", c16["s"], "s", None)):
        f.write(json.dumps({"name": name, "value": round(v, 4), "unit": unit, "baseline": base,
                            "baseline_value": round(bv, 4), "ratio": round(v / bv, 4),
                            "better": "lower", "target": tgt, "what": desc}) + "\n")
PYEOF
