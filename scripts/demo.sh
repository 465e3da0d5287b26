#!/usr/bin/env bash
# make demo: the main job, end to end, on a generated model, through shoald.
#
# Generates tiny-k3 under ./demo/, serves it as a Hugging Face Hub on
# loopback with hubmock, starts shoald on a temporary cache directory,
# warms part of the model in the background, fetches experts as an engine
# would (bin/shoalc: GET over the socket, descriptors mapped, bytes checked
# against the shards), shows the hit and miss counts, and stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
DEMO=demo
MODEL=$DEMO/tiny-k3
HOME_DIR=$(mktemp -d "${TMPDIR:-/tmp}/shoal-demo.XXXXXX")
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
hub_pid=
daemon_pid=

cleanup() {
    if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
        echo "demo: stopped shoald (pid $daemon_pid)"
    fi
    if [ -n "$hub_pid" ] && kill -0 "$hub_pid" 2>/dev/null; then
        kill -TERM "$hub_pid" 2>/dev/null || true
        wait "$hub_pid" 2>/dev/null || true
        echo "demo: stopped hubmock (pid $hub_pid)"
    fi
    rm -rf "$HOME_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for() {   # FILE REGEX PID WHAT
    for _ in $(seq 200); do
        grep -qE "$2" "$1" 2>/dev/null && return 0
        kill -0 "$3" 2>/dev/null || { cat "$1" >&2; echo "demo: $4 failed to start" >&2; exit 1; }
        sleep 0.1
    done
    echo "demo: $4 did not start" >&2
    exit 1
}

say "1. Generating tiny-k3 (K3's tensor names, dtypes and math at tiny sizes) in $MODEL"
rm -rf "$MODEL"
mkdir -p "$DEMO"
"$BIN/mkmodel" --preset tiny --seed 0 --out "$MODEL" --quiet
ls -l "$MODEL" | sed 1d | awk '{printf "   %10d  %s\n", $5, $9}'

say "2. Serving it as a Hugging Face Hub on 127.0.0.1 (hubmock)"
"$BIN/hubmock" --repo demo/tiny-k3="$MODEL" --port 0 --cdn-port 0 --log "$DEMO/hub-requests.jsonl" \
    > "$DEMO/hubmock.out" 2> "$DEMO/hubmock.err" &
hub_pid=$!
wait_for "$DEMO/hubmock.out" '^hub http' "$hub_pid" hubmock
read -r _ HUB _ CDN < "$DEMO/hubmock.out"
echo "   hub at $HUB, its CDN at $CDN"

say "3. Starting shoald on a fresh cache directory"
HF_ENDPOINT=$HUB "$BIN/shoald" --home "$HOME_DIR" --parallel 4 --log "$DEMO/shoald.log" \
    > "$DEMO/shoald.out" 2>&1 &
daemon_pid=$!
wait_for "$DEMO/shoald.out" '^shoald ready' "$daemon_pid" shoald
echo "   $(cat "$DEMO/shoald.out")   (log: $DEMO/shoald.log)"
C=("$BIN/shoalc" --home "$HOME_DIR")

say "4. Warming the experts of layers 1-2 in the background (WARM, then JOB until done)"
"${C[@]}" warm hf://demo/tiny-k3 layers:1-2 --wait | sed 's/^/   /'

say "5. An engine asks for 8 experts of layer 1 (warmed) and 8 of layer 3 (not yet)"
KEYS=$(for e in 0 9 18 27 36 45 54 63; do printf '1:%s 3:%s ' $e $e; done)
"${C[@]}" get hf://demo/tiny-k3 $KEYS --check "$MODEL" | sed 's/^/   /'
echo "   (every item is a descriptor the client mapped and compared with the shard)"

say "6. Asking again: everything is on disk now"
"${C[@]}" get hf://demo/tiny-k3 $KEYS --check "$MODEL" --quiet | sed 's/^/   /'

say "7. What shoald counted (STATS)"
"${C[@]}" stats > "$DEMO/stats.json"
node -e '
  const s = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  const d = s.tiers.disk, u = s.daemon.upstream;
  console.log(`   disk tier: ${d.hits} hits, ${d.misses} misses, ${d.joins} joins, hit rate ${(100 * d.hit_rate).toFixed(1)}%`);
  console.log(`   upstream: ${u.completed} transfers, ${u.bytes} bytes; cache holds ${s.disk.objects} objects, ${s.disk.used} bytes`);
  for (const l of s.layers)
    console.log(`   layer ${l.layer}: ${l.disk.hits} hits, ${l.disk.misses} misses`);' "$DEMO/stats.json"
echo "   hubmock answered $(wc -l < "$DEMO/hub-requests.jsonl") requests; the warm job's objects were fetched once"

say "8. The engine runs the model through shoald: spine by name, experts as they arrive"
echo "   shoal-engine run hf://demo/tiny-k3 --prompt 'Tell me about fish.' --chat --no-think --max-tokens 24"
printf '   reply (streamed as generated; tiny-k3 has random weights): '
"$BIN/shoal-engine" run hf://demo/tiny-k3 --home "$HOME_DIR" --prompt "Tell me about fish." \
    --chat --no-think --max-tokens 24 --stats 2> "$DEMO/engine.err"
sed 's/^/   /' "$DEMO/engine.err" | grep -v '^ *$' | tail -n 2

say "9. What the engine ran, as the CLI sees it (shoal stats, shoal ls)"
"$BIN/shoal" --home "$HOME_DIR" stats | sed 's/^/   /'
"$BIN/shoal" --home "$HOME_DIR" ls | sed 's/^/   /'

say "Done"
echo "shoal generated a K3-shaped model, served it as a Hugging Face Hub on loopback, ran"
echo "shoald on a fresh cache, warmed two layers in the background and served experts to a"
echo "client as file descriptors: misses went upstream once, everything after was a hit;"
echo "then shoal-engine generated text from hf://demo/tiny-k3 with every byte served by shoald."
