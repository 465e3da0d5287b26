#!/usr/bin/env bash
# test: serial  (its pinger / answer-time bounds want the machine to itself)
# test_server_limits.sh — `shoal-engine serve` against hostile clients
# (tests/integration/server_hostile.py), each bounded in count and time:
#   - a 2 MB header: refused at once (400), the connection closed;
#   - one 48 MB header line: the server stops reading after --max-header and
#     spends well under a second of CPU on it;
#   - 300 slowloris connections dripping a header line every 0.5 s: all
#     closed at the request deadline, /health answering meanwhile;
#   - under prlimit --nofile=128: a flood of 1,000 silent connections, then
#     the descriptor limit lowered under the running server (EMFILE on
#     accept): a real client is still answered, the CPU stays idle (no
#     accept spin), and the log holds a handful of lines, not millions;
#   - /metrics and /health count it all, libevent's own 400s and 413s too
#     (promtool parses /metrics).
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
[ -x "$E" ] || skip "no $E"
command -v curl >/dev/null || skip "curl is not installed"
command -v prlimit >/dev/null || skip "prlimit is not installed"
HOSTILE=$ROOT/tests/integration/server_hostile.py

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"

start() {   # NAME [prlimit args --] serve args...
    local name=$1; shift
    bg "$name" "$@"
    wait_line "$T/$name.log" '^listening on http://' 30 || fail "server $name did not start"
    U=$(sed -n 's/^listening on \(http:.*\)$/\1/p' "$T/$name.log" | head -n 1)
    P=${U##*:}
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # utime + stime, 1/100 s
field() {
    curl -s "$U/health" | /usr/bin/python3 -c "import json,sys
d=json.load(sys.stdin)
for k in sys.argv[1].split('.'): d=d[k]
print(d)" "$1"
}
kv() { echo "$1" | tr ' ' '\n' | sed -n "/^$2\$/{n;p;}"; }   # kv "k v k v" KEY

start lim "$E" serve "$T/m" --port 0 --threads 1 --request-timeout 2 --idle-timeout 10 \
    --max-header 32K --max-connections 400
pid=$PID_lim

# ---- headers ---------------------------------------------------------------------------------
r=$(/usr/bin/python3 "$HOSTILE" header "$P" $((2 << 20))) || fail "header client: $r"
[ "$(kv "$r" status)" = 400 ] || fail "2 MB header: $r (wanted 400)"
awk -v s="$(kv "$r" secs)" 'BEGIN {exit !(s < 2)}' || fail "2 MB header answered slowly: $r"
echo "ok   2 MB header: $r"
c0=$(cpu_ticks "$pid")
r=$(/usr/bin/python3 "$HOSTILE" header "$P" $((48 << 20))) || fail "header client: $r"
c1=$(cpu_ticks "$pid")
[ $((c1 - c0)) -lt 100 ] || fail "48 MB header line cost $((c1 - c0))/100 s of CPU"
[ "$(kv "$r" sent)" -lt $((48 << 20)) ] || echo "note: the whole 48 MB went into the socket buffers"
echo "ok   48 MB header line: $r; server CPU $((c1 - c0))/100 s"

# ---- slowloris -------------------------------------------------------------------------------
c0=$(cpu_ticks "$pid")
r=$(/usr/bin/python3 "$HOSTILE" slowloris "$P" 300 8) || fail "slowloris client: $r"
c1=$(cpu_ticks "$pid")
[ "$(kv "$r" closed)" = 300 ] || fail "slowloris: not every dripping connection was closed: $r"
awk -v s="$(kv "$r" last_close)" 'BEGIN {exit !(s < 5)}' || fail "slowloris closed late: $r"
[ "$(kv "$r" health_fail)" = 0 ] || fail "/health failed during slowloris: $r"
awk -v s="$(kv "$r" health_max)" 'BEGIN {exit !(s < 1.5)}' || fail "/health slow during slowloris: $r"
echo "ok   slowloris x300: $r; server CPU $((c1 - c0))/100 s"
check [ "$(field connections.request_timeouts)" -ge 300 ] "408s counted in /health"
# libevent's own refusals: the header line past --max-header above (400),
# and a body past --max-body (413): neither reaches the server's handlers
check [ "$(field connections.refused_bad_request)" -ge 1 ] "400s libevent sent counted in /health"
check [ "$(field connections.refused_too_large)" = 0 ] "no 413 yet"
head -c $((5 << 20)) /dev/zero > "$T/body"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST --data-binary @"$T/body" "$U/v1/completions")
[ "$code" = 413 ] || fail "a 5 MiB body: $code (wanted 413)"
check [ "$(field connections.refused_too_large)" = 1 ] "the 413 counted in /health"
curl -s "$U/metrics" >"$T/metrics"
grep -q '^shoal_engine_http_request_timeouts_total [1-9]' "$T/metrics" || fail "metrics lack the 408s"
grep -q '^shoal_engine_http_refused_total{reason="too_large"} 1$' "$T/metrics" || fail "metrics lack the 413"
grep -q '^shoal_engine_http_refused_total{reason="bad_request"} [1-9]' "$T/metrics" || fail "metrics lack the 400s"
command -v promtool >/dev/null || fail "promtool is missing: make deps installs it"
promtool check metrics <"$T/metrics" || fail "promtool: /metrics does not parse or lint"
kill -TERM "$pid"; wait "$pid" || fail "server exit status $?"

# ---- floods under a descriptor limit ----------------------------------------------------------
start flood prlimit --nofile=128 -- "$E" serve "$T/m" --port 0 --threads 1 --request-timeout 3
pid=$PID_flood
check [ "$(field connections.limit)" -le 64 ] "the connection cap follows the descriptor limit"
c0=$(cpu_ticks "$pid")
r=$(/usr/bin/python3 "$HOSTILE" flood "$P" 1000 2) || fail "flood client: $r"
c1=$(cpu_ticks "$pid")
[ "$(kv "$r" health)" = 200 ] || fail "/health during a connection flood: $r"
awk -v s="$(kv "$r" secs)" 'BEGIN {exit !(s < 2)}' || fail "/health slow during the flood: $r"
[ $((c1 - c0)) -lt 150 ] || fail "the flood cost $((c1 - c0))/100 s of CPU"
echo "ok   1,000 silent connections at the cap: $r; server CPU $((c1 - c0))/100 s"

# the descriptors run out under the server (something else holds them): EMFILE
prlimit --pid "$pid" --nofile=24 || fail "prlimit --pid"
c0=$(cpu_ticks "$pid")
r=$(/usr/bin/python3 "$HOSTILE" flood "$P" 400 3) || fail "flood client: $r"
c1=$(cpu_ticks "$pid")
[ "$(kv "$r" health)" = 200 ] || fail "/health at the descriptor limit: $r"
[ $((c1 - c0)) -lt 150 ] || fail "EMFILE: $((c1 - c0))/100 s of CPU in 3 s (an accept spin?)"
check [ "$(field connections.accept_errors)" -gt 0 ] "accept failures counted"
n=$(grep -c 'accept' "$T/flood.log")
[ "$n" -le 10 ] || fail "$n log lines about accept (rate limit broken)"
echo "ok   EMFILE flood: $r; server CPU $((c1 - c0))/100 s; $n log lines about accept"
check [ "$(curl -s -o /dev/null -w '%{http_code}' "$U/v1/completions" -d '{"prompt":"Hi","max_tokens":2}')" = 200 ] \
    "generation after the floods"
kill -TERM "$pid"; wait "$pid" || fail "server exit status $?"
echo "server limit tests passed"
