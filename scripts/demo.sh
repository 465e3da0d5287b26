#!/usr/bin/env bash
# make demo: the main job, end to end, as a user runs it, on a model that
# says something.
#
# The model is the oracle (`mkmodel --preset oracle`, docs/mkmodel.md): a
# K3-shaped model whose weights are constructed so that its continuation of
# "The oracle says:" is one known sentence, which comes out only when the
# routing, the expert fetches through shoald, the MXFP4 decoding, AttnRes
# and lm_head are all right.  hubmock serves it as a Hugging Face Hub on
# loopback (synthesized, from no disk); then the commands a user types:
# shoald --detach on a fresh cache directory, shoal warm, shoal-engine run,
# shoal stats — each echoed as `$ command` before its output.  Ends with a
# line saying whether the sentence came out right (exit 1 if not), and
# stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}
MODEL=hf://demo/oracle
PROMPT="The oracle says:"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/shoal-demo.XXXXXX")
hub_pid=
ok=0

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
show() { printf '\033[36m$ %s\033[0m\n' "$*"; }     # the command, as typed

cleanup() {
    local pid
    if [ -f "$WORK/home/shoald.pid" ] && pid=$(cat "$WORK/home/shoald.pid") &&
       kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        echo "demo: stopped shoald (pid $pid)"
    fi
    if [ -n "$hub_pid" ] && kill -0 "$hub_pid" 2>/dev/null; then
        kill -TERM "$hub_pid" 2>/dev/null || true
        wait "$hub_pid" 2>/dev/null || true
        echo "demo: stopped hubmock (pid $hub_pid)"
    fi
    if [ "$ok" = 1 ]; then
        rm -rf "$WORK"
    else
        echo "demo: logs kept in $WORK (hubmock.err, home/shoald.log)"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bold "A Hugging Face Hub on 127.0.0.1 serving demo/oracle (hubmock, for the demo only)"
"$BIN/hubmock" --synth demo/oracle=oracle --port 0 --cdn-port 0 \
    > "$WORK/hubmock.out" 2> "$WORK/hubmock.err" &
hub_pid=$!
for _ in $(seq 200); do
    grep -q '^hub http' "$WORK/hubmock.out" 2>/dev/null && break
    kill -0 "$hub_pid" 2>/dev/null || { cat "$WORK/hubmock.err" >&2; exit 1; }
    sleep 0.1
done
read -r _ HUB _ _ < "$WORK/hubmock.out"
[ -n "$HUB" ] || { echo "demo: hubmock did not start" >&2; exit 1; }
echo "   The oracle: K3's tensor names, dtypes, MXFP4 experts and math at tiny sizes, with"
echo "   weights built so that \"$PROMPT\" continues with one known sentence."

bold "Point shoal at it, with a fresh cache directory"
show "export HF_ENDPOINT=$HUB"
export HF_ENDPOINT=$HUB
show "export SHOAL_HOME=$WORK/home"
export SHOAL_HOME=$WORK/home
case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
export PATH="$BIN:$PATH"           # so the commands read as a user types them

bold "Start the cache daemon"
show "shoald --detach"
shoald --detach
echo "   (log: $SHOAL_HOME/shoald.log)"

bold "Fetch the spine (everything but the routed experts) into the cache"
show "shoal warm $MODEL --spine --wait"
shoal warm "$MODEL" --spine --wait

bold "Run the model through shoald: the router's experts are fetched as they are needed"
show "shoal-engine run $MODEL --prompt \"$PROMPT\""
shoal-engine run "$MODEL" --prompt "$PROMPT" | tee "$WORK/reply.txt"

bold "What the cache served"
show "shoal stats"
shoal stats

# what the model promises: config.json's "oracle" (as the Hub serves it)
want=$(curl -sS "$HUB/demo/oracle/resolve/main/config.json" |
       python3 -c 'import json, sys; print(json.load(sys.stdin)["oracle"]["text"])')
if [ "$(cat "$WORK/reply.txt")" = "$want" ]; then
    bold "The sentence came out right: routing, expert fetches through shoald, MXFP4, AttnRes and lm_head all work."
    ok=1
else
    bold "FAILED: the oracle should have said \"$want\"; something in the pipeline is wrong (try shoal doctor)."
    exit 1
fi
