#!/usr/bin/env bash
# The CLI tells the truth (issue 17, item 3):
#   shoal warm exits 3 only when shoald is not running; a plan that does not
#   fit exits 8; --experts top:N on a fresh cache says why it does nothing;
#   a job whose objects fail exits 7 with the last error, and `warm --job N`
#   prints how a finished job ended (done or failed, its last error);
#   `shoal estimate` of an uncached hf:// model reads only the config and
#   the headers (hubmock's log: bytes fetched within those) and its hint
#   never says to warm the spine; `shoal ls` shows one row per model and
#   revision with its endpoint (an older commit counted, not listed);
#   `shoal rm` works with shoald running and is refused (6) while a warm
#   job holds the model.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoal" ] || skip "shoald/shoal not built"

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
"$BIN/mkmodel" --preset tiny --seed 4 --out "$T/m2" --quiet || fail "mkmodel 2"
start_hubmock --repo t/tiny="$T/m" --repo t/two="$T/m2" --log "$T/hub.jsonl"
export HF_ENDPOINT=$HUB
H=$T/home
M=hf://t/tiny
S() { "$BIN/shoal" --home "$H" "$@"; }

# ---- no shoald: 3; estimate's hint -------------------------------------------------------
mkdir -p "$H"
rc=0; S warm $M > "$T/w0" 2>&1 || rc=$?
[ $rc = 3 ] && grep -q 'needs shoald' "$T/w0" || { cat "$T/w0"; fail "warm without shoald: exit $rc, not 3"; }
rc=0; S estimate $M --disk-bytes 4M --mem-bytes 4M > "$T/e0" 2>&1 || rc=$?
[ $rc = 4 ] && grep -q 'config.json and the shard headers only' "$T/e0" && ! grep -q 'spine' "$T/e0" \
    || { cat "$T/e0"; fail "estimate without shoald or cache: exit $rc, hint"; }
echo "ok   no shoald: warm exits 3; estimate's hint is to start shoald (config and headers only)"

# ---- estimate with shoald: only the config and the headers are read ---------------------
start_daemon
: > "$T/hub.jsonl"
S estimate $M --disk-bytes 4M --mem-bytes 4M > "$T/e1" 2>&1 || { cat "$T/e1"; fail "estimate through shoald"; }
grep -q "read by shoald's OPEN" "$T/e1" || { cat "$T/e1"; fail "estimate does not say where the config came from"; }
/usr/bin/python3 - "$T/hub.jsonl" "$T/m" <<'PY' || fail "estimate fetched more than the config and the headers"
import json, os, struct, sys
log, model = sys.argv[1:]
allowed = 0
for n in os.listdir(model):
    p = os.path.join(model, n)
    if n.endswith(".safetensors"):   # the header, or the 100,000-byte probe that reads it
        allowed += min(os.path.getsize(p), max(100000, 8 + struct.unpack("<Q", open(p, "rb").read(8))[0]))
    else:
        allowed += os.path.getsize(p)
got = sum(json.loads(l)["bytes"] for l in open(log) if l.strip())
total = sum(os.path.getsize(os.path.join(model, n)) for n in os.listdir(model))
assert got <= allowed, (got, allowed)
print("estimate fetched", got, "bytes of", total, "(config, index, headers:", allowed, ")")
PY

# ---- top:N on a fresh cache --------------------------------------------------------------
rc=0; S warm $M --experts top:2000 > "$T/w1" 2>&1 || rc=$?
[ $rc = 1 ] && grep -q 'selects nothing: no expert of this model has been asked for yet' "$T/w1" \
    || { cat "$T/w1"; fail "top:2000 on a fresh cache: exit $rc"; }
echo "ok   estimate reads the config and headers only; top:N on a fresh cache says why it does nothing"

# ---- a job that succeeds, and --job N after it ---------------------------------------------
S warm $M --spine --wait > "$T/w2" 2>&1 || { cat "$T/w2"; fail "warm --spine"; }
J=$(sed -n 's/^Started warm job \([0-9]*\).*/\1/p' "$T/w2" | head -n 1)
S warm --job "$J" > "$T/j1" 2>&1 || { cat "$T/j1"; fail "warm --job $J of a done job"; }
grep -q "^Job $J: done, .* 0 errors" "$T/j1" || { cat "$T/j1"; fail "--job of a done job: $(cat "$T/j1")"; }

# ---- a job whose objects fail: exit 7 and its last error; --job N says so ----------------
"$BIN/shoalc" --home "$H" get hf://t/two f:config.json > /dev/null || fail "open t/two"
kill -TERM "$PID_hubmock"; wait "$PID_hubmock" 2>/dev/null
rc=0; S warm hf://t/two --experts layers:0-1 --wait > "$T/w3" 2>&1 || rc=$?
[ $rc = 7 ] && grep -q 'shoal warm: failed: 0 of' "$T/w3" && grep -q 'last error' "$T/w3" \
    || { cat "$T/w3"; fail "a failing warm: exit $rc, not 7 with its last error"; }
! grep -q 'Warm complete' "$T/w3" || fail "a failing warm says it completed"
J2=$(sed -n 's/^Started warm job \([0-9]*\).*/\1/p' "$T/w3" | head -n 1)
rc=0; S warm --job "$J2" > "$T/j2" 2>&1 || rc=$?
[ $rc = 7 ] && grep -q "^Job $J2: failed" "$T/j2" && grep -q 'last error (EOFFLINE)' "$T/j2" \
    || { cat "$T/j2"; fail "--job of a failed job: exit $rc"; }
echo "ok   warm --wait: 0 on success, 7 with the last error on failure; --job N tells how each ended"

# ---- shoal ls: one row per model and revision, with the endpoint ----------------------------
stop_daemon
start_hubmock --repo t/tiny="$T/m" --repo t/two="$T/m2" --log "$T/hub2.jsonl" \
    --port "${HUB##*:}" --cdn-port "${CDN##*:}"
OLD=$(curl -s "$HUB/_mock/repo?repo=t/tiny" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["refs"]["main"])')
curl -s -X POST "$HUB/_mock/repo?repo=t/tiny&main=$T/m2" > /dev/null || fail "moving main"
start_daemon
"$BIN/shoalc" --home "$H" get $M f:config.json > /dev/null || fail "open t/tiny at its new main"
S ls > "$T/ls" || fail "shoal ls exited $?"
[ "$(grep -c '^t/tiny ' "$T/ls")" = 1 ] || { cat "$T/ls"; fail "t/tiny main should be one row"; }
grep '^t/tiny ' "$T/ls" | grep -q "(+1 older)" && grep '^t/tiny ' "$T/ls" | grep -q "127.0.0.1:${HUB##*:}" \
    || { cat "$T/ls"; fail "the row does not count the older commit or show the endpoint"; }
head -n 1 "$T/ls" | grep -q 'Endpoint' || fail "ls has no Endpoint column"
echo "ok   ls: one row for t/tiny main (+1 older commit), endpoint shown"

# ---- shoal rm with shoald running ----------------------------------------------------------
curl -s -X POST "$HUB/_mock/faults?bw=64KiB" > /dev/null || fail "slowing the CDN"
S warm hf://t/two > "$T/w4" 2>&1 || { cat "$T/w4"; fail "warm t/two (slow)"; }
rc=0; S rm hf://t/two > "$T/rm1" 2>&1 || rc=$?
[ $rc = 6 ] && grep -q 'in use in shoald' "$T/rm1" || { cat "$T/rm1"; fail "rm of a model a job holds: exit $rc, not 6"; }
curl -s -X POST "$HUB/_mock/faults?clear=1" > /dev/null
J3=$(sed -n 's/^Started warm job \([0-9]*\).*/\1/p' "$T/w4" | head -n 1)
S warm --job "$J3" --wait > /dev/null 2>&1 || fail "the warm job did not finish"
S rm $M > "$T/rm2" 2>&1 || { cat "$T/rm2"; fail "rm with shoald running"; }
grep -q 'Removed t/tiny' "$T/rm2" && grep -q 'Freed' "$T/rm2" || { cat "$T/rm2"; fail "rm output"; }
S ls > "$T/ls2" || fail "ls after rm"
! grep -q '^t/tiny ' "$T/ls2" || { cat "$T/ls2"; fail "t/tiny still listed after rm"; }
# the old commit's objects (shared with no other model) are gone: fetched again
"$BIN/shoalc" --home "$H" get "$M@$OLD" t:model.embed_tokens.weight --check "$T/m" > "$T/g" || { cat "$T/g"; fail "GET after rm"; }
grep -q 'misses 1 .*mismatched 0' "$T/g" || fail "GET after rm should fetch again: $(grep '^hits' "$T/g")"
echo "ok   rm through shoald: refused (6) while a job holds the model, then removes; a GET fetches again"
