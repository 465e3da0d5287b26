# lib.sh — sourced by integration tests (tests/integration/test_*.sh).
#
# Gives each test a private temporary directory ($T), stops every process it
# started when it exits (pass, fail or Ctrl-C), and small helpers:
#   skip "why"            exit 77 with a message (the runner counts a skip)
#   fail "why"            print and exit 1
#   check COND... "what"  fail with "what" unless the command succeeds
#   bg NAME CMD...        start CMD in the background, stdout/stderr to $T/NAME.log
#   wait_line FILE REGEX [SECS]   wait until FILE has a line matching REGEX
#   start_hubmock ARGS... start tools/hubmock and set $HUB and $CDN
set -u
ROOT=${SHOAL_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
BIN=${BIN:-bin}
case $BIN in /*) ;; *) BIN=$ROOT/$BIN ;; esac
T=$(mktemp -d "${TMPDIR:-/tmp}/shoal-test.XXXXXX")
_pids=()

_cleanup() {
    local p
    for p in "${_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${_pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
    done
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$T"
}
trap _cleanup EXIT
trap 'exit 130' INT TERM

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
check() {
    local what=${*: -1}
    "${@:1:$#-1}" || fail "$what"
}

bg() {
    local name=$1; shift
    "$@" >"$T/$name.log" 2>&1 &
    _pids+=($!)
    eval "PID_${name//[^A-Za-z0-9_]/_}=$!"
}

wait_line() {
    local file=$1 re=$2 secs=${3:-20} i
    for i in $(seq $((secs * 10))); do
        grep -qE "$re" "$file" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "timed out after ${secs}s waiting for /$re/ in $file; it holds:" >&2
    tail -n 20 "$file" >&2
    return 1
}

# start_daemon [ARGS...]: shoald on $H (--no-fsync, then ARGS), each start
# logging to a fresh $LOG (wait_line must see its own 'ready on'); $PID_shoald.
# stop_daemon: SIGTERM, and shoald must exit 0.  A script may define its own.
start_daemon() {
    starts=$((${starts:-0} + 1))
    LOG=$T/shoald.$starts.log
    bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$LOG" "$@"
    wait_line "$LOG" 'ready on' 20 || fail "shoald did not start"
}
stop_daemon() {
    kill -TERM "$PID_shoald"
    local rc=0
    wait "$PID_shoald" || rc=$?
    [ "$rc" = 0 ] || fail "shoald exited $rc on SIGTERM"
}

start_hubmock() {
    bg hubmock "$BIN/hubmock" "$@"
    wait_line "$T/hubmock.log" '^hub http://127\.0\.0\.1:[0-9]+ cdn http://127\.0\.0\.1:[0-9]+' 30 \
        || fail "hubmock did not start"
    HUB=$(sed -n 's/^hub \(http:[^ ]*\) cdn .*/\1/p' "$T/hubmock.log" | head -n 1)
    CDN=$(sed -n 's/^hub [^ ]* cdn \(http:[^ ]*\).*/\1/p' "$T/hubmock.log" | head -n 1)
    export HUB CDN
}

# tiny_hub: tiny-k3 seed 3 in $T/m, served as t/tiny by hubmock
# (HF_ENDPOINT, log $T/hub.jsonl); H=$T/home, M=hf://t/tiny and the prompt P.
tiny_hub() {
    "$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
    start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl"
    export HF_ENDPOINT=$HUB
    H=$T/home
    M=hf://t/tiny
    P=7,100,300,5,9,42,11,12,13,700,1
}

# spine_fixture: the cached-spine tests' start (test_spine_cache.sh,
# test_integrity_spine.sh; $E is shoal-engine): tiny_hub, shoald on $H
# logging to $T/shoald.log, and the local run's ids and logits at int8
# ($T/o_local, $T/l_local) and int4 ($T/o_local4, $T/l_local4).
spine_fixture() {
    tiny_hub
    mkdir -p "$H"
    bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log"
    wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"

    "$E" run "$T/m" --tokens $P --max-tokens 6 --dump-logits "$T/l_local" > "$T/o_local" \
        2>/dev/null || fail "local run"
    "$E" run "$T/m" --tokens $P --max-tokens 6 --spine int4 --dump-logits "$T/l_local4" \
        > "$T/o_local4" 2>/dev/null || fail "local run, int4"
}
