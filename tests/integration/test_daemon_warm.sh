#!/usr/bin/env bash
# Warm jobs outlive their client and the daemon: SIGKILL shoald in the
# middle of a warm job, restart it, and the job resumes from its file and
# completes; VERIFY then finds the cache consistent and every object
# serves as a hit with the right bytes.  Also: SIGTERM parks a job and a
# restart finishes it.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] || skip "shoald/shoalc not built"

"$BIN/mkmodel" --preset tiny --seed 9 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl"
H=$T/home
M=hf://t/tiny
export HF_ENDPOINT=$HUB
start_daemon() {   # each start logs to a fresh file: wait_line must see its own line
    starts=$((${starts:-0} + 1))
    LOG=$T/shoald.$starts.log
    bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$LOG" --parallel 4
    wait_line "$LOG" 'ready on' 20 || fail "shoald did not start"
}
job_state() { "$BIN/shoalc" --home "$H" job "$1" 2>/dev/null; }
wait_job() {
    for _ in $(seq 600); do
        job_state "$1" > "$T/job" && grep -q '^state [234] ' "$T/job" && return 0
        sleep 0.1
    done
    return 1
}

start_daemon
"$BIN/shoalc" --home "$H" get $M f:config.json > /dev/null || fail "warm-up GET"
# Slow every CDN answer so the job is caught in the middle.
curl -fsS -X POST "$HUB/_mock/faults?rate_stall=1&stall_secs=0.3&stall_at=before&status_on=cdn" > /dev/null \
    || fail "cannot set faults"
"$BIN/shoalc" --home "$H" warm $M all > "$T/warm" || fail "WARM"   # the client leaves at once
job=$(awk '/^job /{print $2}' "$T/warm")
[ -n "$job" ] || fail "no job id"
for _ in $(seq 100); do
    job_state "$job" > "$T/job"
    done_n=$(awk '{split($4, a, "/"); print a[1]}' "$T/job")
    [ "${done_n:-0}" -ge 20 ] && break
    sleep 0.1
done
total=$(awk '{split($4, a, "/"); print a[2]}' "$T/job")
[ "${done_n:-0}" -ge 20 ] && [ "$done_n" -lt "$total" ] || fail "job not in the middle: $(cat "$T/job")"
kill -KILL "$PID_shoald"; wait "$PID_shoald" 2>/dev/null
[ -f "$H/jobs/$job.json" ] || fail "the job was not persisted"

curl -fsS -X POST "$HUB/_mock/faults?clear=1" > /dev/null
start_daemon
grep -q "resuming job $job" "$LOG" || fail "job not resumed after restart"
wait_job "$job" || fail "resumed job did not end: $(cat "$T/job")"
grep -qE "^state 2 objects $total/$total .* errors 0" "$T/job" || fail "resumed job: $(cat "$T/job")"
"$BIN/shoalc" --home "$H" verify > "$T/verify.json" || fail "VERIFY"
/usr/bin/python3 -c '
import json, sys
v = json.load(open(sys.argv[1])); t = int(sys.argv[2])
assert v["schema"] == "shoal.verify" and v["bad"] == 0 and v["missing"] == 0, v
assert v["checked"] >= t, (v, t)' "$T/verify.json" "$total" || fail "verify: $(cat "$T/verify.json")"
ALL=$(for l in 1 4 7; do for e in 0 13 63; do printf '%s:%s ' $l $e; done; done)
"$BIN/shoalc" --home "$H" get $M $ALL t:model.norm.weight --check "$T/m" > "$T/get" || fail "GET after warm"
grep -q '^hits 10 misses 0 joins 0 errors 0 .* checked 10 mismatched 0' "$T/get" || fail "$(tail -1 "$T/get")"

# SIGTERM parks a running job; the next start finishes it.
rm -rf "$T/m2"; "$BIN/mkmodel" --preset tiny --seed 10 --out "$T/m2" --quiet || fail "mkmodel 2"
curl -fsS -X POST "$HUB/_mock/repo?repo=t/two&main=$T/m2" > /dev/null || fail "add repo"
curl -fsS -X POST "$HUB/_mock/faults?rate_stall=1&stall_secs=0.3&stall_at=before&status_on=cdn" > /dev/null
"$BIN/shoalc" --home "$H" warm hf://t/two layers:1-3 > "$T/warm2" || fail "WARM 2"
job2=$(awk '/^job /{print $2}' "$T/warm2")
sleep 1
kill -TERM "$PID_shoald"; wait "$PID_shoald" || fail "SIGTERM exit status"
grep -q '"state": *[01]\|"state":[01]' "$H/jobs/$job2.json" || fail "job 2 not saved as unfinished: $(cat "$H/jobs/$job2.json")"
curl -fsS -X POST "$HUB/_mock/faults?clear=1" > /dev/null
start_daemon
wait_job "$job2" || fail "job 2 did not end"
grep -qE '^state 2 objects 192/192 .* errors 0' "$T/job" || fail "job 2: $(cat "$T/job")"
kill -TERM "$PID_shoald"
rc=0; wait "$PID_shoald" || rc=$?
[ "$rc" = 0 ] || fail "shoald exited $rc on SIGTERM"

# jobs/ holds what is remembered (256 jobs): 300 finished job files (copies of
# job 2's, numbered 1000-1299) leave the newest 256 jobs after a start, job 2's
# own file among the forgotten (the oldest ids go first)
for i in $(seq 1000 1299); do
    sed "s/\"id\": *$job2\b/\"id\": $i/; s/\"id\":$job2\b/\"id\":$i/" "$H/jobs/$job2.json" > "$H/jobs/$i.json"
done
grep -q '"id": *1299\b\|"id":1299\b' "$H/jobs/1299.json" || fail "the copied job files have no new id: $(head -c 300 "$H/jobs/1299.json")"
start_daemon
n=$(ls "$H/jobs" | grep -c '\.json$')
[ "$n" -le 256 ] || fail "jobs/ holds $n files past the 256 remembered"
[ -e "$H/jobs/1299.json" ] && [ ! -e "$H/jobs/1000.json" ] || fail "the newest job files were not the ones kept"
kill -TERM "$PID_shoald"; wait "$PID_shoald" || fail "shoald exited $? on SIGTERM"
! grep -l 'runtime error\|AddressSanitizer\|LeakSanitizer' "$T"/*.log 2>/dev/null \
    || fail "sanitizer reports in the daemon's log"
echo "ok"
