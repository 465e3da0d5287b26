#!/usr/bin/env bash
# shoald's limits against hostile clients (issue 18 item 2; docs/daemon.md,
# "Limits"), with the real binaries:
#   - under prlimit --nofile=256:256, 300 silent connections: the cap holds
#     them off, a real client is still served, the log stays small;
#   - a frame begun and never ended, and a connection that never says
#     HELLO: ERROR ETIMEOUT naming --frame-timeout, then closed;
#   - connections that GET cached experts and never read: dropped with an
#     ERROR naming the descriptor limit, the daemon's descriptors stay under
#     the rlimit, others are served;
#   - 300 connections each declaring a 1 MiB body and sending 1 MiB - 1:
#     shoald's RSS grows by less than --max-buffered plus slack (unbounded
#     it grew by 1 MiB per connection).
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] || skip "shoald/shoalc not built"
command -v prlimit > /dev/null || skip "prlimit (util-linux) not installed"
PY=/usr/bin/python3
CLIENT=$ROOT/tests/integration/bounds_client.py

"$BIN/mkmodel" --preset tiny --seed 5 --out "$T/m" --quiet || fail "mkmodel"
H=$T/home

start_daemon() {   # a fresh log per start
    starts=$((${starts:-0} + 1))
    LOG=$T/shoald.$starts.log
    bg shoald "$@" --home "$H" --no-fsync --log "$LOG"
    wait_line "$LOG" 'ready on' 20 || fail "shoald did not start"
    SOCK=$H/shoald.sock
}
stop_daemon() {
    kill -TERM "$PID_shoald"
    local rc=0
    wait "$PID_shoald" || rc=$?
    [ "$rc" = 0 ] || fail "shoald exited $rc on SIGTERM"
}
get_ok() {
    "$BIN/shoalc" --home "$H" get "$T/m" 1:0 1:1 --check "$T/m" > "$T/get.out" 2>&1 \
        || { cat "$T/get.out"; fail "$1"; }
}

# ---- descriptors: a flood under prlimit ----------------------------------------------
start_daemon prlimit --nofile=256:256 "$BIN/shoald" --frame-timeout 3 --max-conn-fds 64
grep -q 'limits: 80 connections' "$LOG" || { grep limits "$LOG"; fail "limits not cut to RLIMIT_NOFILE"; }
get_ok "GET before the flood"
$PY "$CLIENT" "$SOCK" flood 300 > "$T/flood.out" 2>&1 &
flood=$!
sleep 1
get_ok "a real client was not served during a flood of 300 connections"
wait $flood || { cat "$T/flood.out"; fail "flood client"; }
fds=$(ls /proc/"$PID_shoald"/fd | wc -l)
[ "$fds" -lt 256 ] || fail "shoald holds $fds descriptors under a limit of 256"
lines=$(wc -l < "$LOG")
[ "$lines" -lt 100 ] || { tail -n 20 "$LOG"; fail "the flood wrote $lines log lines"; }
echo "flood: $(cat "$T/flood.out"); $lines log lines; $fds descriptors open"

# ---- descriptors: clients that GET and never read ------------------------------------
$PY "$CLIENT" "$SOCK" hoard "$T/m" 3 > "$T/hoard.out" 2>&1 || { cat "$T/hoard.out"; fail "hoarders"; }
cat "$T/hoard.out"
grep -q 'dropped: .*descriptors' "$LOG" || fail "the drop is not logged"
fds=$(ls /proc/"$PID_shoald"/fd | wc -l)
[ "$fds" -lt 200 ] || fail "shoald holds $fds descriptors after the hoarders left"
get_ok "a real client was not served after the hoarders"

# ---- frame and HELLO deadlines ----------------------------------------------------------
$PY "$CLIENT" "$SOCK" partial > "$T/partial.out" 2>&1 || { cat "$T/partial.out"; fail "partial frame"; }
$PY "$CLIENT" "$SOCK" nohello > "$T/nohello.out" 2>&1 || { cat "$T/nohello.out"; fail "no HELLO"; }
cat "$T/partial.out" "$T/nohello.out"
get_ok "GET after the deadlines"
lines=$(wc -l < "$LOG")
[ "$lines" -lt 150 ] || fail "$lines log lines"

# ---- per-user fairness: one user at the cap cannot keep another out ------------------
if [ "$(id -u)" = 0 ] && command -v setpriv > /dev/null; then
    # let the other user reach the socket (the test's doing, not shoald's)
    chmod 711 "$T" "$H"; chmod 666 "$SOCK"
    $PY "$CLIENT" "$SOCK" fair 100 > "$T/fair.out" 2>&1 || { cat "$T/fair.out"; fail "fairness"; }
    cat "$T/fair.out"
    chmod 600 "$SOCK"; chmod 700 "$H" "$T"
else
    echo "skip per-user fairness: needs root and setpriv for a second user"
fi
stop_daemon

# ---- bytes: huge declared bodies across many connections -------------------------------
# Under ASan freed blocks sit in its quarantine (256 MiB by default) and
# shadow memory adds an eighth: keep the quarantine small, allow for both.
bound=$((96 * 1024))
if [ -n "${SHOAL_ASAN:-}" ]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:quarantine_size_mb=1"
    bound=$((160 * 1024))
fi
start_daemon "$BIN/shoald" --max-buffered 32M --frame-timeout 10
$PY "$CLIENT" "$SOCK" bodies 300 "$PID_shoald" > "$T/bodies.out" 2>&1 \
    || { cat "$T/bodies.out"; fail "bodies client"; }
cat "$T/bodies.out"
growth=$(sed -n 's/^peak_growth_kb //p' "$T/bodies.out")
# 32 MiB of buffers + slack; without the cap 300 connections held 300 MiB
[ "$growth" -lt "$bound" ] || fail "RSS grew by $growth kB with --max-buffered 32M"
grep -q 'max-buffered' "$LOG" || fail "no connection was dropped for --max-buffered"
get_ok "GET after the bodies"
lines=$(wc -l < "$LOG")
[ "$lines" -lt 100 ] || fail "$lines log lines after the bodies"
stop_daemon
echo "bounds: ok"
