#!/usr/bin/env bash
# Single-flight: two clients asking for the same missing expert at once
# cause exactly one upstream transfer (hubmock's log) and both get it, one
# as a miss and one as a join; a demand joining a warm transfer gets it too.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] || skip "shoald/shoalc not built"

"$BIN/mkmodel" --preset tiny --seed 5 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl"
H=$T/home
M=hf://t/tiny
export HF_ENDPOINT=$HUB
bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log"
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
field() { awk -v k="$2" '/^hits /{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}' "$1"; }

# Open the model (manifest built) so the log below counts only the expert.
"$BIN/shoalc" --home "$H" get $M f:config.json > /dev/null || fail "warm-up GET"
# Every CDN answer now waits 1.5 s before its first byte.
curl -fsS -X POST "$HUB/_mock/faults?rate_stall=1&stall_secs=1.5&stall_at=before&status_on=cdn" > /dev/null \
    || curl -fsS -X POST "$HUB/_mock/faults?rate_stall=1&stall_secs=2&stall_at=before" > /dev/null \
    || fail "cannot set hubmock faults"
n0=$(grep -c '"port":"cdn"' "$T/hub.jsonl")
"$BIN/shoalc" --home "$H" get $M 3:7 --check "$T/m" > "$T/a" &
pa=$!
sleep 0.5
"$BIN/shoalc" --home "$H" get $M 3:7 --check "$T/m" > "$T/b" &
pb=$!
wait $pa || fail "client A failed: $(cat "$T/a")"
wait $pb || fail "client B failed: $(cat "$T/b")"
[ "$(field "$T/a" misses)" = 1 ] || fail "client A should miss: $(cat "$T/a")"
[ "$(field "$T/b" joins)" = 1 ] || fail "client B should join: $(cat "$T/b")"
[ "$(field "$T/a" checked)" = 1 ] && [ "$(field "$T/b" checked)" = 1 ] || fail "bytes not checked"
sleep 0.2
n1=$(grep -c '"port":"cdn"' "$T/hub.jsonl")
[ $((n1 - n0)) = 1 ] || { tail -n 5 "$T/hub.jsonl"; fail "expected exactly one upstream transfer, saw $((n1 - n0))"; }

# A demand for an expert being warmed joins the warm transfer.
"$BIN/shoalc" --home "$H" warm $M layers:5-5 > "$T/warm" || fail "WARM"
sleep 0.3
"$BIN/shoalc" --home "$H" get $M 5:0 5:1 5:2 5:3 --check "$T/m" > "$T/c" || fail "GET during warm"
[ "$(field "$T/c" joins)" -ge 1 ] || fail "a demand during a warm job should join: $(cat "$T/c")"
curl -fsS -X POST "$HUB/_mock/faults?clear=1" > /dev/null
job=$(awk '/^job /{print $2}' "$T/warm")
for _ in $(seq 300); do
    "$BIN/shoalc" --home "$H" job "$job" > "$T/job" || fail "JOB"
    grep -q '^state 2 ' "$T/job" && break
    sleep 0.1
done
grep -q '^state 2 objects 64/64 ' "$T/job" || fail "warm job did not finish: $(cat "$T/job")"
# Each object of layer 5 went upstream once, joins included.
n2=$(grep -c '"port":"cdn"' "$T/hub.jsonl")
[ $((n2 - n1)) -le 64 ] || fail "$((n2 - n1)) transfers for 64 objects"
kill -TERM "$PID_shoald"
rc=0; wait "$PID_shoald" || rc=$?
[ "$rc" = 0 ] || fail "shoald exited $rc on SIGTERM"
! grep -l 'runtime error\|AddressSanitizer\|LeakSanitizer' "$T"/*.log 2>/dev/null \
    || fail "sanitizer reports in the daemon's log"
echo "ok"
