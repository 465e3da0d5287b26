# bench/lib/hub.sh — sourced by the bench/*/run.sh scripts that need a Hub.
# bench_hubmock NAME MODEL_DIR: serve MODEL_DIR as hf://org/slice with
# tools/hubmock (its log in $T/hub.log), set HPID and HUB, point HF_ENDPOINT
# at it and drop any token from the environment.  Exits the script with a
# message naming NAME when hubmock does not start.  Needs $BIN and $T.
bench_hubmock() {
    "$BIN/hubmock" --repo org/slice="$2" >"$T/hub.log" 2>&1 &
    HPID=$!
    for _ in $(seq 300); do grep -q '^hub ' "$T/hub.log" && break; sleep 0.1; done
    HUB=$(sed -n 's/^hub \(http:[^ ]*\) cdn .*/\1/p' "$T/hub.log")
    [ -n "$HUB" ] || { echo "$1: hubmock did not start"; cat "$T/hub.log"; exit 1; }
    export HF_ENDPOINT=$HUB
    unset HF_TOKEN HUGGING_FACE_HUB_TOKEN
}
