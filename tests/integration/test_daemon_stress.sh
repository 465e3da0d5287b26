#!/usr/bin/env bash
# 4 clients x 200 random experts at once, with hubmock's faults on (429s
# with Retry-After, resets, truncations, ignored ranges): every byte right,
# and the counters add up: each distinct expert was a miss exactly once
# (one transfer), every other ask a hit or a join, and the daemon's disk
# tier saw exactly 800 requests.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] || skip "shoald/shoalc not built"

"$BIN/mkmodel" --preset tiny --seed 7 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl" --seed 11
H=$T/home
M=hf://t/tiny
export HF_ENDPOINT=$HUB
bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log" --parallel 8
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"

# Open once without faults (the manifest), then turn the faults on.
"$BIN/shoalc" --home "$H" get $M f:config.json > /dev/null || fail "warm-up GET"
curl -fsS -X POST "$HUB/_mock/faults?rate_429=0.1&retry_after=1&rate_reset=0.05&rate_truncate=0.05&rate_ignore_range=0.05&status_on=cdn" \
    > /dev/null || fail "cannot set faults"
pids=()
for c in 1 2 3 4; do
    "$BIN/shoalc" --home "$H" random $M 200 --seed $c --batch 50 --check "$T/m" > "$T/c$c" 2>&1 &
    pids+=($!)
done
for c in 1 2 3 4; do
    wait "${pids[$((c - 1))]}" || { tail -n 3 "$T/c$c"; fail "client $c failed"; }
done
curl -fsS -X POST "$HUB/_mock/faults?clear=1" > /dev/null
"$BIN/shoalc" --home "$H" stats > "$T/stats.json" || fail "STATS"
/usr/bin/python3 - "$T" "$T/hub.jsonl" <<'PY' || fail "counters do not add up"
import json, re, sys
t = sys.argv[1]
keys, hits, misses, joins = set(), 0, 0, 0
for c in range(1, 5):
    lines = open(f"{t}/c{c}").read().splitlines()
    summ = [l for l in lines if l.startswith("hits ")][0].split()
    f = dict(zip(summ[::2], map(int, summ[1::2])))
    assert f["errors"] == 0 and f["mismatched"] == 0 and f["checked"] == 200, (c, f)
    hits += f["hits"]; misses += f["misses"]; joins += f["joins"]
    for l in lines:
        m = re.match(r"item \d+ (\d+:\d+) (hit|miss|join) length \d+ ok$", l)
        if m:
            keys.add(m.group(1))
assert hits + misses + joins == 800, (hits, misses, joins)
assert misses == len(keys), ("each distinct expert is one miss", misses, len(keys))
s = json.load(open(f"{t}/stats.json"))
d = s["tiers"]["disk"]
# the warm-up GET of config.json was one more miss
assert d["hits"] + d["misses"] + d["joins"] == 801, d
assert d["misses"] == misses + 1 and d["joins"] == joins and d["hits"] == hits, (d, hits, misses, joins)
up = s["tiers"]["upstream"]
assert up["transfers_completed"] == misses + 1 and up["transfers_failed"] == 0, up
faults = [json.loads(l).get("fault") for l in open(sys.argv[2])]
assert sum(1 for f in faults if f) > 10, "the faults did not fire"
print(f"{len(keys)} distinct experts: {hits} hits, {misses} misses, {joins} joins; "
      f"{sum(1 for f in faults if f)} faulty answers")
PY
"$BIN/shoalc" --home "$H" verify > "$T/verify.json" || fail "VERIFY"
/usr/bin/python3 -c '
import json, sys
v = json.load(open(sys.argv[1]))
assert v["schema"] == "shoal.verify" and v["bad"] == 0 and v["missing"] == 0 and v["checked"] >= 371, v
' "$T/verify.json" || fail "verify: $(cat "$T/verify.json")"
kill -TERM "$PID_shoald"
rc=0; wait "$PID_shoald" || rc=$?
[ "$rc" = 0 ] || fail "shoald exited $rc on SIGTERM"
! grep -l 'runtime error\|AddressSanitizer\|LeakSanitizer' "$T"/*.log 2>/dev/null \
    || fail "sanitizer reports in the daemon's log"
echo "ok"
