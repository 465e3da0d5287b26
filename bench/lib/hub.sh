# bench/lib/hub.sh — sourced by the bench/*/run.sh scripts that need a Hub.
# bench_hub_start NAME TRIES HUBMOCK_ARGS...: start tools/hubmock with the
# arguments (its log in $T/hub.log), wait up to TRIES tenths of a second for
# its address (a synthesized K3 hashes its small files first), set HPID and
# HUB, point HF_ENDPOINT at it and drop any token from the environment.
# Exits the script with a message naming NAME when hubmock does not start.
# Needs $BIN and $T.
bench_hub_start() {
    local name=$1 tries=$2
    shift 2
    "$BIN/hubmock" "$@" >"$T/hub.log" 2>&1 &
    HPID=$!
    for _ in $(seq "$tries"); do grep -q '^hub ' "$T/hub.log" && break; sleep 0.1; done
    HUB=$(sed -n 's/^hub \(http:[^ ]*\) cdn .*/\1/p' "$T/hub.log")
    [ -n "$HUB" ] || { echo "$name: hubmock did not start"; cat "$T/hub.log"; exit 1; }
    export HF_ENDPOINT=$HUB
    unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
}

# bench_hubmock NAME MODEL_DIR: serve MODEL_DIR as hf://org/slice.
bench_hubmock() {
    bench_hub_start "$1" 300 --repo org/slice="$2"
}
