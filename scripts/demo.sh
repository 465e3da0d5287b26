#!/usr/bin/env bash
# make demo: the main job, end to end, on a generated model.
#
# Today: generate tiny-k3 under ./demo/, serve it as a Hugging Face Hub on
# loopback with hubmock, resolve a shard through the Hub's 302 redirect,
# fetch one routed expert's span with an HTTP Range request (libcurl, via
# bin/hubget), check its bytes against the shard, and stop everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
DEMO=demo
MODEL=$DEMO/tiny-k3
LAYER=${DEMO_LAYER:-1}
EXPERT=${DEMO_EXPERT:-10}
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
hub_pid=

cleanup() {
    if [ -n "$hub_pid" ] && kill -0 "$hub_pid" 2>/dev/null; then
        kill -TERM "$hub_pid" 2>/dev/null || true
        wait "$hub_pid" 2>/dev/null || true
        echo "demo: stopped hubmock (pid $hub_pid)"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "1. Generating tiny-k3 (K3's tensor names, dtypes and math at tiny sizes) in $MODEL"
rm -rf "$MODEL"
mkdir -p "$DEMO"
"$BIN/mkmodel" --preset tiny --seed 0 --out "$MODEL"
ls -l "$MODEL" | sed 1d | awk '{printf "   %10d  %s\n", $5, $9}'

say "2. Serving it as a Hugging Face Hub on 127.0.0.1 (hubmock)"
"$BIN/hubmock" --repo demo/tiny-k3="$MODEL" --port 0 --cdn-port 0 --log "$DEMO/hub-requests.jsonl" \
    > "$DEMO/hubmock.out" 2> "$DEMO/hubmock.err" &
hub_pid=$!
for _ in $(seq 100); do
    grep -q '^hub http' "$DEMO/hubmock.out" 2>/dev/null && break
    kill -0 "$hub_pid" 2>/dev/null || { cat "$DEMO/hubmock.err"; echo "demo: hubmock failed to start" >&2; exit 1; }
    sleep 0.1
done
read -r _ HUB _ CDN < "$DEMO/hubmock.out"
echo "   hub at $HUB, its CDN at $CDN"

say "3. Where is expert $EXPERT of layer $LAYER?"
PREFIX="language_model.model.layers.$LAYER.block_sparse_moe.experts.$EXPERT"
SHARD=$(node -e '
  const ix = require(process.argv[1]);
  const f = ix.weight_map[process.argv[2] + ".w1.weight_packed"];
  if (!f) { console.error("expert not in the index"); process.exit(1); }
  console.log(f);' "$PWD/$MODEL/model.safetensors.index.json" "$PREFIX")
BEGIN=$("$BIN/stinfo" "$MODEL/$SHARD" | awk -v t="$PREFIX.w1.weight_packed" '$1 == t {print $4}')
END=$("$BIN/stinfo" "$MODEL/$SHARD" | awk -v t="$PREFIX.w3.weight_scale" '$1 == t {print $5}')
LEN=$((END - BEGIN))
echo "   $SHARD bytes $BEGIN..$((END - 1)): six MXFP4 records back to back, $LEN bytes"

say "4. Resolving $SHARD on the Hub (HEAD, 302 handled by hand)"
"$BIN/hubget" --endpoint "$HUB" --info hf://demo/tiny-k3 "$SHARD" | sed 's/^/   /'

say "5. Fetching the span with Range: bytes=$BEGIN-$((END - 1)) from the CDN location"
"$BIN/hubget" --endpoint "$HUB" hf://demo/tiny-k3 "$SHARD" --range "$BEGIN-$((END - 1))" -o "$DEMO/expert.bin"
echo "   got $(stat -c %s "$DEMO/expert.bin") bytes"

say "6. Checking them against the shard on disk"
if cmp -s "$DEMO/expert.bin" <(tail -c +$((BEGIN + 1)) "$MODEL/$SHARD" | head -c "$LEN"); then
    echo "   identical: all $LEN bytes match"
else
    echo "demo: the fetched bytes differ from the shard" >&2
    exit 1
fi
echo "   the Hub saw these requests (from hubmock's log):"
node -e '
  for (const l of require("fs").readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean)) {
    const r = JSON.parse(l);
    console.log(`     ${r.port.padEnd(3)} ${r.method.padEnd(4)} ${r.status} ${r.range ? "range " + r.range : ""}  ${r.path.split("?")[0]}`);
  }' "$DEMO/hub-requests.jsonl"

say "Done"
echo "shoal generated a K3-shaped model, served it as a Hugging Face Hub on loopback,"
echo "followed the Hub's redirect to its CDN, fetched one $LEN-byte expert with an HTTP"
echo "Range request and checked it byte for byte. The daemon, engine and stats come next."
