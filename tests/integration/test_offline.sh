#!/usr/bin/env bash
# Offline and a degraded upstream (docs/fetcher.md, "Offline"):
#   with hubmock stopped after the first open, a model shoald opened before
#   serves from the cache — shoalc get, shoal warm of what is cached and
#   shoal-engine run, in the running daemon and after a restart (the
#   branch resolves to its last known commit, and the log says so); an
#   object that is not cached fails at once with EOFFLINE naming it, and
#   shoal warm exits 7 (upstream) with that error, not 3;
#   with HF_HUB_OFFLINE=1 (hubmock up again) no request reaches the Hub at
#   all, cached objects serve, a missing one is EOFFLINE naming the expert,
#   and a model never opened here says so.
source "$(dirname "$0")/lib.sh"
E=$BIN/shoal-engine
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] && [ -x "$E" ] || skip "shoald/shoalc/shoal-engine not built"

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
"$BIN/mkmodel" --preset tiny --seed 4 --out "$T/m2" --quiet || fail "mkmodel 2"
start_hubmock --repo t/tiny="$T/m" --repo t/two="$T/m2" --log "$T/hub.jsonl"
export HF_ENDPOINT=$HUB
H=$T/home
M=hf://t/tiny
P=7,100,300,5,9,42,11,12,13,700,1
item() { grep "^$2 " "$1"; }   # the line of one key in shoalc's output

# ---- online: everything of t/tiny, only config.json of t/two -------------------------
start_daemon
"$BIN/shoal" --home "$H" warm $M --wait > "$T/warm.out" 2>&1 || { cat "$T/warm.out"; fail "warm online"; }
"$E" run $M --home "$H" --tokens $P --max-tokens 4 > "$T/o_online" 2> "$T/e_online" \
    || { cat "$T/e_online"; fail "engine run online"; }
"$BIN/shoalc" --home "$H" get hf://t/two f:config.json > "$T/two.out" || { cat "$T/two.out"; fail "t/two config"; }

# ---- the Hub goes away ------------------------------------------------------------------
kill -TERM "$PID_hubmock"; wait "$PID_hubmock" 2>/dev/null
"$BIN/shoalc" --home "$H" get $M 1:0 t:model.embed_tokens.weight f:config.json --check "$T/m" > "$T/g1" \
    || { cat "$T/g1"; fail "cached GET with the Hub down"; }
grep -q 'hits 3 .*mismatched 0' "$T/g1" || fail "cached GET with the Hub down: $(grep '^hits' "$T/g1")"
"$E" run $M --home "$H" --tokens $P --max-tokens 4 > "$T/o_down" 2> "$T/e_down" \
    || { cat "$T/e_down"; fail "engine run with the Hub down"; }
cmp -s "$T/o_online" "$T/o_down" || fail "engine output differs with the Hub down"
# Not cached: EOFFLINE at once, naming it (the retrying path says ENET "giving up after 8").
"$BIN/shoalc" --home "$H" get hf://t/two 1:0 > "$T/g2" 2>&1 && fail "an uncached object with the Hub down succeeded"
grep -q '1:0 error EOFFLINE' "$T/g2" || { cat "$T/g2"; fail "uncached object: not EOFFLINE"; }
# (a GET_ITEM carries a status, no text: the message is the daemon's log line)
grep -q 'model-0000.*cannot be reached' "$LOG" \
    || { tail "$LOG"; fail "uncached object: the log does not name it and the cause"; }
rc=0; "$BIN/shoal" --home "$H" warm hf://t/two --wait > "$T/w2" 2>&1 || rc=$?
[ $rc = 7 ] || { cat "$T/w2"; fail "warm with the Hub down exited $rc, not 7 (upstream)"; }
grep -q 'last error' "$T/w2" && grep -q 'cannot be reached' "$T/w2" \
    || { cat "$T/w2"; fail "warm with the Hub down does not give the last error"; }
echo "ok   Hub down, daemon up: cached GET and engine serve; uncached EOFFLINE named; warm exit 7"

# ---- restart shoald with the Hub still down: the branch's last known commit ----------
stop_daemon
start_daemon
"$BIN/shoalc" --home "$H" get $M 1:0 4:17 f:config.json --check "$T/m" > "$T/g3" \
    || { cat "$T/g3"; fail "GET after a restart with the Hub down"; }
grep -q 'hits 3 .*mismatched 0' "$T/g3" || fail "after restart: $(grep '^hits' "$T/g3")"
grep -q 'offline.*resolves to its last known commit' "$LOG" \
    || { cat "$LOG"; fail "shoald does not say main resolved to its last known commit"; }
"$E" run $M --home "$H" --tokens $P --max-tokens 4 > "$T/o_restart" 2> "$T/e_restart" \
    || { cat "$T/e_restart"; fail "engine run after a restart with the Hub down"; }
cmp -s "$T/o_online" "$T/o_restart" || fail "engine output differs after the restart"
grep -q 'the Hub cannot be reached: main resolved to its last known commit' "$T/e_restart" \
    || { cat "$T/e_restart"; fail "the engine does not say main resolved to its last known commit"; }
grep -q 'cannot be reached' "$T/e_online" && fail "the engine said unreachable while the Hub was up"
"$BIN/shoal" --home "$H" stats > "$T/s3" 2>&1 || { cat "$T/s3"; fail "stats, Hub down"; }
grep -q 't/tiny@main: the Hub cannot be reached: commit .* last known' "$T/s3" \
    || { cat "$T/s3"; fail "shoal stats does not say t/tiny resolved without its Hub"; }
"$BIN/shoal" --home "$H" stats --json > "$T/s3.json" || fail "stats --json, Hub down"
/usr/bin/python3 -c '
import json, sys
ms = {m["repo"]: m for m in json.load(open(sys.argv[1]))["models"]}
assert ms["t/tiny"].get("upstream") == "unreachable", ms["t/tiny"]
' "$T/s3.json" || fail "stats --json: t/tiny's upstream is not \"unreachable\""
"$BIN/shoal" --home "$H" warm $M --spine --wait > "$T/w3" 2>&1 \
    || { cat "$T/w3"; fail "warm of a cached spine with the Hub down"; }
grep -q 'the Hub did not answer: commit .* last known' "$T/w3" || { cat "$T/w3"; fail "warm does not say the Hub did not answer"; }
"$BIN/shoalc" --home "$H" get hf://t/never 1:0 > "$T/g4" 2>&1 && fail "a model never opened, Hub down"
grep -q 'never opened here' "$T/g4" || { cat "$T/g4"; fail "never-opened model: unclear ($(cat "$T/g4"))"; }
echo "ok   restart, Hub down: main pinned to its last known commit; GET, engine, warm of the cached spine"
stop_daemon

# ---- HF_HUB_OFFLINE=1: not one request, even with the Hub back --------------------------
# on the same ports: a model is known by its endpoint
start_hubmock --repo t/tiny="$T/m" --repo t/two="$T/m2" --log "$T/hub2.jsonl" \
    --port "${HUB##*:}" --cdn-port "${CDN##*:}"
HF_HUB_OFFLINE=1 start_daemon
"$BIN/shoalc" --home "$H" get $M 1:0 t:model.embed_tokens.weight --check "$T/m" > "$T/g5" \
    || { cat "$T/g5"; fail "GET with HF_HUB_OFFLINE=1"; }
grep -q 'hits 2 .*mismatched 0' "$T/g5" || fail "HF_HUB_OFFLINE=1: $(grep '^hits' "$T/g5")"
"$E" run $M --home "$H" --tokens $P --max-tokens 4 > "$T/o_off" 2> "$T/e_off" \
    || { cat "$T/e_off"; fail "engine run with HF_HUB_OFFLINE=1"; }
cmp -s "$T/o_online" "$T/o_off" || fail "engine output differs with HF_HUB_OFFLINE=1"
grep -q 'offline (HF_HUB_OFFLINE): main resolved to its last known commit' "$T/e_off" \
    || { cat "$T/e_off"; fail "the engine does not say it runs offline"; }
"$BIN/shoal" --home "$H" stats > "$T/s5" 2>&1 || { cat "$T/s5"; fail "stats offline"; }
grep -q 't/tiny@main: offline (HF_HUB_OFFLINE): commit' "$T/s5" \
    || { cat "$T/s5"; fail "shoal stats does not say t/tiny is offline"; }
"$BIN/shoal" --home "$H" warm $M --spine --dry-run > "$T/w5" 2>&1 || { cat "$T/w5"; fail "warm --dry-run offline"; }
grep -q 'offline (HF_HUB_OFFLINE): commit' "$T/w5" || { cat "$T/w5"; fail "warm does not say it is offline"; }
"$BIN/shoalc" --home "$H" get hf://t/two 2:3 > "$T/g6" 2>&1 && fail "uncached object with HF_HUB_OFFLINE=1"
grep -q '2:3 error EOFFLINE' "$T/g6" && grep -q 'layer 2 expert 3 .*HF_HUB_OFFLINE' "$LOG" \
    || { cat "$T/g6"; tail "$LOG"; fail "HF_HUB_OFFLINE=1: the missing expert is not named"; }
"$BIN/shoalc" --home "$H" get hf://t/never 1:0 > "$T/g7" 2>&1 && fail "never opened, offline"
grep -q 'never opened' "$T/g7" || { cat "$T/g7"; fail "HF_HUB_OFFLINE=1, never opened: $(cat "$T/g7")"; }
grep -q 'HF_HUB_OFFLINE' "$LOG" || fail "the log does not say HF_HUB_OFFLINE"
n=$(grep -c . "$T/hub2.jsonl" 2>/dev/null || true)
[ "${n:-0}" = 0 ] || { head "$T/hub2.jsonl"; fail "HF_HUB_OFFLINE=1: $n requests reached the Hub"; }
echo "ok   HF_HUB_OFFLINE=1: 0 requests to the Hub; cached GET and engine serve; missing expert EOFFLINE named"
