#!/usr/bin/env bash
# test_accept_backoff.sh — accept() out of descriptors must pause the
# listener, not spin (issue 18: 695,195 log lines in 3 s, a core at 100%),
# for shoald and for `shoal-engine serve`, with the real binaries:
#   - each starts under prlimit --nofile=N:N; then the soft limit is
#     lowered under the running process (something else holds the
#     descriptors), so a flood of connections past the caps makes accept
#     fail with EMFILE while the listening socket stays readable;
#   - while the flood is held: the process's CPU (utime + stime from
#     /proc/PID/stat) stays low — a listener re-polled at once would burn
#     a whole core — and the log holds a handful of lines about accept;
#   - the pause is counted (shoald: STATS daemon.limits.accept_pauses and
#     /metrics shoald_accept_pauses_total; serve: /health and /metrics);
#   - once the connections close a new client is served (HELLO for
#     shoald, /health for serve).
# Fails against a build without the back-off (checked by hand: with
# server_backoff's event_del removed, shoald spent 3.01 s of CPU in 3 s; with
# serve's on_accept_error returning at once, 3.00 s).
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoal" ] || skip "shoald/shoal not built"
command -v prlimit > /dev/null || skip "prlimit (util-linux) not installed"
PY=/usr/bin/python3
CLIENT=$ROOT/tests/integration/bounds_client.py
HOLD=3          # seconds the flood is held and the CPU measured
CPU_MAX=60      # ticks (1/100 s) of CPU allowed over HOLD; a spin takes ~HOLD*100

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
nfds() { ls "/proc/$1/fd" | wc -l; }
# hold_flood PID LOG KIND TARGET N OUT: N connections held HOLD+1 s; sets
# cpu (ticks PID spent over HOLD) and lines (new lines of LOG about accept).
hold_flood() {
    local pid=$1 log=$2 kind=$3 target=$4 n=$5 out=$6 l0 c0 c1 fl
    l0=$(grep -c 'accept' "$log" || true)
    flood "$kind" "$target" "$n" $((HOLD + 1)) > "$out" 2>&1 &
    fl=$!
    sleep 1
    c0=$(cpu_ticks "$pid")
    sleep "$HOLD"
    c1=$(cpu_ticks "$pid")
    wait $fl || fail "flood client: $(cat "$out")"
    cpu=$((c1 - c0))
    lines=$(( $(grep -c 'accept' "$log" || true) - l0 ))
}
# flood KIND TARGET N SECS: N connections (Unix socket path or TCP port),
# held SECS, then closed; prints how many connected
flood() {
    $PY - "$@" << 'EOF'
import socket, sys, time
kind, target, n, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_UNIX if kind == "unix" else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(0.3)
    try:
        s.connect(target if kind == "unix" else ("127.0.0.1", int(target)))
        socks.append(s)
    except OSError:
        s.close()
print("connected %d of %d" % (len(socks), n), flush=True)
time.sleep(secs)
for s in socks:
    s.close()
EOF
}

# ---- shoald -----------------------------------------------------------------------------
H=$T/home
"$BIN/mkmodel" --preset tiny --seed 5 --out "$T/m" --quiet || fail "mkmodel"
bg shoald prlimit --nofile=256:256 "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log" \
    --metrics 127.0.0.1:0
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
URL=$(sed -n 's/.*metrics on \(http:[^ ]*\).*/\1/p' "$T/shoald.log" | head -n 1)
SOCK=$H/shoald.sock
$PY "$CLIENT" "$SOCK" hello1 > "$T/hello0" 2>&1 || fail "HELLO before the flood: $(cat "$T/hello0")"
# the caps were cut from 256 (80 connections); leave room for 16 more descriptors
base=$(nfds "$PID_shoald")
prlimit --pid "$PID_shoald" --nofile=$((base + 16)):256 || fail "prlimit --pid"
hold_flood "$PID_shoald" "$T/shoald.log" unix "$SOCK" 200 "$T/flood_d"
[ "$lines" -ge 1 ] || fail "no accept failure was logged: the flood did not reach EMFILE ($(cat "$T/flood_d"))"
[ "$lines" -lt 100 ] || fail "$lines log lines about accept in $HOLD s (rate limit broken)"
[ "$cpu" -lt "$CPU_MAX" ] || fail "shoald spent $cpu/100 s of CPU in $HOLD s at EMFILE (accept spin?)"
sleep 1.5   # the longest pause is 1 s
$PY "$CLIENT" "$SOCK" hello1 > "$T/hello1" 2>&1 || fail "HELLO after the flood: $(cat "$T/hello1")"
prlimit --pid "$PID_shoald" --nofile=256:256
"$BIN/shoal" --home "$H" stats --json > "$T/stats.json" || fail "shoal stats --json"
pauses=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["daemon"]["limits"]["accept_pauses"])' "$T/stats.json") \
    || fail "no daemon.limits.accept_pauses in STATS"
[ "$pauses" -ge 1 ] || fail "STATS counts $pauses accept pauses"
m=$(curl -fsS "$URL" | awk '$1 == "shoald_accept_pauses_total" { print $2 }')
[ "${m:-0}" -ge 1 ] || fail "/metrics shoald_accept_pauses_total is '${m}'"
echo "ok   shoald at EMFILE: $(cat "$T/flood_d"); CPU $cpu/100 s in $HOLD s; $lines log lines" \
     "about accept; $pauses pauses counted; HELLO served after"
kill -TERM "$PID_shoald"; wait "$PID_shoald" || fail "shoald exited $? on SIGTERM"

# ---- serve ------------------------------------------------------------------------------
E=$BIN/shoal-engine
if [ ! -x "$E" ]; then
    echo "skip serve: no $E"
    exit 0
fi
bg serve prlimit --nofile=128:128 "$E" serve "$T/m" --port 0 --threads 1 --request-timeout 30
wait_line "$T/serve.log" '^listening on http://' 30 || fail "serve did not start"
U=$(sed -n 's/^listening on \(http:.*\)$/\1/p' "$T/serve.log" | head -n 1)
P=${U##*:}
[ "$(curl -s -o /dev/null -w '%{http_code}' "$U/health")" = 200 ] || fail "/health before the flood"
base=$(nfds "$PID_serve")
prlimit --pid "$PID_serve" --nofile=$((base + 8)):128 || fail "prlimit --pid serve"
hold_flood "$PID_serve" "$T/serve.log" tcp "$P" 300 "$T/flood_s"
[ "$lines" -lt 100 ] || fail "serve: $lines log lines about accept in $HOLD s"
[ "$cpu" -lt "$CPU_MAX" ] || fail "serve spent $cpu/100 s of CPU in $HOLD s at EMFILE (accept spin?)"
sleep 1.5
code=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$U/health")
[ "$code" = 200 ] || fail "/health after the flood: $code"
prlimit --pid "$PID_serve" --nofile=128:128
errs=$(curl -fsS "$U/metrics" | awk '$1 == "shoal_engine_accept_errors_total" { print $2 }')
awk -v e="${errs:-0}" 'BEGIN { exit !(e >= 1) }' || fail "serve /metrics accept_errors_total is '$errs'"
echo "ok   serve at EMFILE: $(cat "$T/flood_s"); CPU $cpu/100 s in $HOLD s; $lines log lines" \
     "about accept; $errs accept failures counted; /health served after"
kill -TERM "$PID_serve"; wait "$PID_serve" || fail "serve exited $? on SIGTERM"
echo "accept back-off: ok"
