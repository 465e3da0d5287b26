#!/usr/bin/env bash
# test_metrics_shoald.sh — shoald's --metrics (docs/daemon.md, "Metrics"):
#   - off by default: no listener, no metrics line in the log
#   - --metrics 127.0.0.1:0 serves /metrics in the Prometheus text format:
#     promtool (Prometheus's own parser) accepts it
#   - the figures are the daemon's: after 6 cold GETs and the same 6 again,
#     disk misses 6 and hits 6, 6 transfers completed, bytes served and
#     fetched match what shoalc got, the cache holds them, a REPORT's RAM
#     tier counts appear under tier="ram"; connections and queues are gauges
#   - the limits and the integrity figures: every series is there (0 at
#     start) and moves with its event — a refusal at --max-conns, clients
#     dropped at the HELLO deadline, their log lines held back by the rate
#     limit, files checked against their sha256 after a warm (verified
#     bytes); STATS daemon.limits and daemon.integrity say the same
#   - other paths answer 404, other methods 405; a bad address exits 2
#   - a bare port listens on loopback only
#   - --detach says where the daemon runs (pid, log, socket, metrics)
source "$(dirname "$0")/lib.sh"
command -v promtool >/dev/null || skip "promtool not installed (Debian package prometheus; make deps)"
command -v curl >/dev/null || skip "curl not installed"

"$BIN/mkmodel" --preset tiny --seed 5 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --synth-cache none
export HF_ENDPOINT=$HUB
H=$T/home M=hf://t/tiny

# off by default
bg d0 "$BIN/shoald" --home "$H" --no-fsync
wait_line "$T/d0.log" 'ready on' 20 || fail "shoald did not start"
grep -q 'metrics' "$T/d0.log" && fail "metrics on without --metrics: $(grep metrics "$T/d0.log")"
kill -TERM "$PID_d0"; wait "$PID_d0"

"$BIN/shoald" --home "$H" --no-fsync --metrics nonsense:port > "$T/bad.out" 2>&1; rc=$?
[ $rc = 2 ] && grep -q -- "--metrics nonsense:port: give PORT or ADDR:PORT" "$T/bad.out" \
    || fail "a bad --metrics: exit $rc, $(cat "$T/bad.out")"

bg shoald "$BIN/shoald" --home "$H" --no-fsync --metrics=127.0.0.1:0
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald --metrics did not start"
URL=$(sed -n 's/.*metrics on \(http:[^ ]*\).*/\1/p' "$T/shoald.log" | head -n 1)
[ -n "$URL" ] || fail "no 'metrics on URL' line in the log"
scrape() { curl -fsS "$URL" > "$T/$1.prom" || fail "scrape $1"; promtool check metrics < "$T/$1.prom" \
    > "$T/$1.lint" 2>&1 || fail "promtool rejects the page ($1): $(cat "$T/$1.lint")"; }
val() {   # val FILE 'name{labels}' -> the sample's value
    awk -v k="$2" '$1 == k { print $2; found = 1 } END { if (!found) print "MISSING" }' "$T/$1.prom"
}

scrape cold
[ "$(val cold 'shoald_requests_total{tier="disk",outcome="miss"}')" = 0 ] || fail "misses before any GET"
[ "$(val cold shoald_workers)" -ge 1 ] || fail "no workers gauge"
grep -q '^shoald_build_info{version="' "$T/cold.prom" || fail "no build_info"

KEYS="1:0 1:1 1:2 2:0 2:1 2:2"
"$BIN/shoalc" --home "$H" get $M $KEYS > "$T/get1" || fail "first GET: $(cat "$T/get1")"
"$BIN/shoalc" --home "$H" get $M $KEYS > "$T/get2" || fail "second GET"
BYTES=$(sed -n 's/^hits .* bytes \([0-9]*\) .*/\1/p' "$T/get1")
"$BIN/shoalc" --home "$H" report '{"tier":"ram","hits":5,"misses":2,"bytes":1000}' || fail "REPORT"
scrape warm
[ "$(val warm 'shoald_requests_total{tier="disk",outcome="miss"}')" = 6 ] || fail "disk misses: $(grep requests_total "$T/warm.prom")"
[ "$(val warm 'shoald_requests_total{tier="disk",outcome="hit"}')" = 6 ] || fail "disk hits: $(grep requests_total "$T/warm.prom")"
[ "$(val warm 'shoald_requests_total{tier="ram",outcome="hit"}')" = 5 ] || fail "ram hits from REPORT"
[ "$(val warm 'shoald_requests_total{tier="ram",outcome="miss"}')" = 2 ] || fail "ram misses from REPORT"
[ "$(val warm 'shoald_served_bytes_total{tier="ram"}')" = 1000 ] || fail "ram bytes from REPORT"
[ "$(val warm 'shoald_upstream_transfers_total{result="completed"}')" = 6 ] || fail "transfers: $(grep transfers "$T/warm.prom")"
[ "$(val warm shoald_upstream_bytes_total)" = "$BYTES" ] || fail "upstream bytes $(val warm shoald_upstream_bytes_total), GET got $BYTES"
[ "$(val warm 'shoald_served_bytes_total{tier="disk"}')" -ge "$BYTES" ] || fail "disk bytes served"
[ "$(val warm shoald_cache_used_bytes)" -ge "$BYTES" ] || fail "cache used bytes"
[ "$(val warm shoald_cache_budget_bytes)" -gt 0 ] || fail "no budget"
[ "$(val warm shoald_transfers_running)" = 0 ] || fail "transfers still running"
[ "$(val warm 'shoald_transfers_queued{priority="demand"}')" = 0 ] || fail "demand queue"
[ "$(val warm shoald_connections)" -ge 0 ] || fail "connections gauge"
n=$(grep -c '^# TYPE shoald_' "$T/warm.prom")
[ "$n" -ge 18 ] || fail "only $n metric families"

# one connection held open shows up
"$BIN/shoalc" --home "$H" ping --interval 100 --seconds 3 > "$T/ping" &
PING=$!
sleep 1
scrape conn
[ "$(val conn shoald_connections)" -ge 1 ] || fail "an open connection is not counted"
wait $PING

# only /metrics, only GET
[ "$(curl -s -o /dev/null -w '%{http_code}' "${URL%/metrics}/other")" = 404 ] || fail "another path is not 404"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$URL")" = 405 ] || fail "POST is not 405"
ctype=$(curl -fsS -o /dev/null -w '%{content_type}' "$URL")
case $ctype in "text/plain; version=0.0.4"*) ;; *) fail "Content-Type $ctype" ;; esac
kill -TERM "$PID_shoald"; wait "$PID_shoald" || fail "shoald exited non-zero on SIGTERM"

# ---- the limits and the integrity figures move when their event happens ---------------
# (a home of its own: the settings given here are kept in its shoald.conf)
HL=$T/home_lim
bg dl "$BIN/shoald" --home "$HL" --no-fsync --metrics=127.0.0.1:0 --max-conns 4 --frame-timeout 1
wait_line "$T/dl.log" 'ready on' 20 || fail "shoald --max-conns 4 did not start"
URL=$(sed -n 's/.*metrics on \(http:[^ ]*\).*/\1/p' "$T/dl.log" | head -n 1)
scrape l0
for k in 'shoald_connections_refused_total{cause="cap"}' 'shoald_connections_dropped_total{cause="frame_deadline"}' \
         'shoald_connections_dropped_total{cause="room"}' 'shoald_connections_dropped_total{cause="descriptors"}' \
         'shoald_connections_dropped_total{cause="bytes"}' shoald_frame_deadlines_total shoald_accept_pauses_total \
         shoald_log_lines_suppressed_total shoald_descriptors_queued shoald_buffered_bytes \
         'shoald_cache_object_bytes{check="verified"}' 'shoald_cache_object_bytes{check="trusted"}' \
         'shoald_file_checks_total{result="match"}' 'shoald_file_checks_total{result="mismatch"}' \
         shoald_quarantined_bytes_total shoald_refetch_jobs_total shoald_damaged_reported_total; do
    [ "$(val l0 "$k")" = 0 ] || fail "$k is $(val l0 "$k") before anything happened"
done
[ "$(val l0 shoald_connections_limit)" = 4 ] || fail "connections_limit $(val l0 shoald_connections_limit)"
[ "$(val l0 shoald_buffered_bytes_limit)" -gt 0 ] && [ "$(val l0 shoald_descriptors_queued_limit)" -gt 0 ] \
    || fail "no limits on the page"
# 25 connections that never say HELLO, 4 at a time under the cap: each
# newcomer takes the place of the oldest (dropped to make room), the last 4
# are dropped at the 1 s deadline, and the drops' log lines are
# rate-limited (10 a window per kind, the rest counted)
/usr/bin/python3 -c '
import socket, sys, time
s = []
for _ in range(25):
    c = socket.socket(socket.AF_UNIX); c.connect(sys.argv[1]); s.append(c)
time.sleep(2.5)' "$HL/shoald.sock" || fail "no-HELLO client"
# four clients at the cap, all of one user: a fifth is refused
pings=()
for i in 1 2 3 4; do
    "$BIN/shoalc" --home "$HL" ping --interval 200 --seconds 4 > "$T/lping$i" 2>&1 &
    pings+=($!)
done
sleep 1.5
"$BIN/shoalc" --home "$HL" stats > "$T/l5" 2>&1 && fail "a fifth client at --max-conns 4 was served"
# (its ERROR names --max-conns; a client that reads only after its HELLO
# failed may see the close instead: test_bounds_daemon.sh checks the ERROR)
grep -q 'max-conns\|closed the connection' "$T/l5" || fail "the refused client saw: $(cat "$T/l5")"
wait "${pings[@]}" || fail "a client below the cap failed: $(cat "$T"/lping*)"
# a whole model warmed: its files are checked against their sha256
"$BIN/shoalc" --home "$HL" warm $M all --wait > "$T/lwarm" 2>&1 || fail "warm: $(cat "$T/lwarm")"
for _ in $(seq 100); do
    scrape l1
    [ "$(val l1 'shoald_file_checks_total{result="match"}')" -ge 3 ] && [ "$(val l1 shoald_file_checks_queued)" = 0 ] && break
    sleep 0.1
done
[ "$(val l1 'shoald_connections_refused_total{cause="cap"}')" -ge 1 ] || fail "the refusal at the cap is not counted"
fd=$(val l1 'shoald_connections_dropped_total{cause="frame_deadline"}')
room=$(val l1 'shoald_connections_dropped_total{cause="room"}')
[ "$fd" = 4 ] && [ "$room" = 21 ] || fail "25 no-HELLO connections under a cap of 4: $fd dropped at the deadline, $room for room"
[ "$(val l1 shoald_frame_deadlines_total)" = 4 ] || fail "frame deadlines: $(val l1 shoald_frame_deadlines_total)"
[ "$(val l1 shoald_log_lines_suppressed_total)" -ge 11 ] || fail "suppressed log lines: $(val l1 shoald_log_lines_suppressed_total)"
[ "$(val l1 shoald_connections_accepted_total)" -ge 30 ] || fail "accepted: $(val l1 shoald_connections_accepted_total)"
[ "$(val l1 'shoald_file_checks_total{result="match"}')" -ge 3 ] || fail "file checks: $(grep file_checks "$T/l1.prom")"
[ "$(val l1 shoald_file_check_bytes_total)" -gt 0 ] || fail "no bytes hashed by the file checks"
[ "$(val l1 'shoald_cache_object_bytes{check="verified"}')" -gt 0 ] || fail "no verified bytes: $(grep object_bytes "$T/l1.prom")"
"$BIN/shoal" --home "$HL" stats --json > "$T/lstats.json" || fail "shoal stats --json"
/usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))["daemon"]
l, i = d["limits"], d["integrity"]
assert l["connections_limit"] == 4 and l["refused"]["cap"] >= 1, l
assert l["dropped"]["frame_deadline"] == 4 and l["frame_deadlines"] == 4, l
assert l["dropped"]["room"] == 21 and l["dropped"]["descriptors"] == 0 and l["dropped"]["bytes"] == 0, l
assert l["log_lines_suppressed"] >= 11 and l["accepted"] >= 30, l
for k in ("descriptors_queued", "descriptors_queued_limit", "buffered_bytes", "buffered_bytes_limit", "accept_pauses"): assert k in l, l
assert i["verified_bytes"] > 0 and "trusted_bytes" in i and i["files_ok"] >= 3, i
for k in ("files_bad", "quarantined_bytes", "refetch_jobs", "damaged_reported"): assert k in i, i
' "$T/lstats.json" || fail "STATS daemon.limits / daemon.integrity: $(cat "$T/lstats.json")"
echo "ok   limits and integrity on /metrics and in STATS: refused $(val l1 'shoald_connections_refused_total{cause="cap"}')," \
     "made room $room, frame deadlines $fd, log lines held back $(val l1 shoald_log_lines_suppressed_total)," \
     "files matched $(val l1 'shoald_file_checks_total{result="match"}'), verified $(val l1 'shoald_cache_object_bytes{check="verified"}') bytes"
kill -TERM "$PID_dl"; wait "$PID_dl" || fail "shoald exited non-zero on SIGTERM"

# a bare port is loopback's
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
bg d2 "$BIN/shoald" --home "$H" --no-fsync --metrics "$PORT"
wait_line "$T/d2.log" 'ready on' 20 || fail "shoald --metrics PORT did not start"
grep -q "metrics on http://127.0.0.1:$PORT/metrics" "$T/d2.log" || fail "a bare port is not loopback: $(grep metrics "$T/d2.log")"
curl -fsS "http://127.0.0.1:$PORT/metrics" | promtool check metrics || fail "promtool on the bare port"
kill -TERM "$PID_d2"; wait "$PID_d2"

# --detach: one line saying where it runs
"$BIN/shoald" --home "$H" --no-fsync --detach --metrics 127.0.0.1:0 > "$T/detach.out" 2>&1 \
    || fail "--detach: $(cat "$T/detach.out")"
grep -Eq "^shoald started \(pid [0-9]+\), log $H/shoald.log, socket $H/shoald.sock, metrics http://127.0.0.1:[0-9]+/metrics\$" \
    "$T/detach.out" || fail "--detach said: $(cat "$T/detach.out")"
DPID=$(sed -n 's/.*(pid \([0-9]*\)).*/\1/p' "$T/detach.out")
[ "$(cat "$H/shoald.pid")" = "$DPID" ] || fail "the pid file says $(cat "$H/shoald.pid"), the line $DPID"
_pids+=("$DPID")
curl -fsS "$(grep -o 'http://[^ ]*/metrics' "$T/detach.out")" | promtool check metrics || fail "detached metrics"
kill -TERM "$DPID"
for _ in $(seq 50); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
kill -0 "$DPID" 2>/dev/null && fail "the detached shoald did not stop on SIGTERM"
echo "ok: /metrics ($n families) passes promtool and counts what the daemon did"
