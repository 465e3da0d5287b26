#!/usr/bin/env bash
# The budget plans (tiny model, shoald with a 9 MiB budget: the spine
# fits, not every expert beside it):
#   settings persist in shoald.conf across restarts and stats shows them;
#   a bad line and a budget past the disk stop the start with what to do;
#   `warm --dry-run` prints the plan and fetches nothing; a selection that
#   does not fit is refused (exit 8, no space; nothing fetched); --fit warms what
#   fits, hottest experts first; a plan that needs room says what it
#   evicts; a budget smaller than the spine is a clear error; once the
#   engine stored its int8 pack the BF16 matrices it replaces are
#   evictable (and left out of a spine warm), --keep-spine pins them again.
source "$(dirname "$0")/lib.sh"
for b in shoald shoalc shoal hubmock mkmodel; do
    [ -x "$BIN/$b" ] || skip "$b not built"
done
"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl"
export HF_ENDPOINT=$HUB
M=hf://t/tiny
H=$T/home
S() { "$BIN/shoal" --home "$H" "$@"; }
C() { "$BIN/shoalc" --home "$H" "$@"; }
js() { /usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
run=0
start_daemon() {   # start_daemon HOME ARGS...: the pid in $DPID
    local home=$1; shift
    run=$((run + 1))
    "$BIN/shoald" --home "$home" --no-fsync --log "$T/shoald.$run.log" "$@" > "$T/out.$run" 2>&1 &
    DPID=$!
    _pids+=($DPID)
    wait_line "$T/shoald.$run.log" 'ready on' 20 || fail "shoald did not start: $(cat "$T/out.$run")"
}
stop_daemon() { kill -TERM "$DPID"; wait "$DPID" || fail "shoald exited $? on SIGTERM"; }
fetched() { grep -c '"status": *206' "$T/hub.jsonl" || true; }

# ---- settings persist; bad settings stop the start ---------------------------------------
start_daemon "$H" --max-size 9M --parallel 4
stop_daemon
grep -q '^max-size = 9M$' "$H/shoald.conf" && grep -q '^parallel = 4$' "$H/shoald.conf" \
    || fail "shoald.conf: $(cat "$H/shoald.conf")"
start_daemon "$H"
S stats > "$T/st.txt"
grep -Eq '^  max-size \(budget\) +9\.00 MiB +\(shoald\.conf\)$' "$T/st.txt" \
    && grep -Eq '^  parallel +4 +\(shoald\.conf\)$' "$T/st.txt" \
    && grep -Eq '^  keep-spine +no +\(default\)$' "$T/st.txt" || { cat "$T/st.txt"; fail "settings in stats"; }
S stats --json > "$T/st.json"
[ "$(js "$T/st.json" '(j["disk"]["budget"], j["daemon"]["settings"]["parallel"], j["daemon"]["settings"]["from"]["max-size"])')" \
  = "(9437184, 4, 'shoald.conf')" ] || fail "settings in stats --json: $(js "$T/st.json" 'j["daemon"]["settings"]')"
"$BIN/shoald" --home "$T/h3" --max-size 1000T > "$T/big.out" 2>&1 && fail "a budget past the disk started"
grep -q 'larger than the disk can give the cache' "$T/big.out" && grep -Eq 'free \+ .* cached = ' "$T/big.out" \
    && grep -Eq 'ask for at most [0-9]+G' "$T/big.out" || fail "budget past the disk: $(cat "$T/big.out")"
[ -e "$T/h3/shoald.conf" ] && fail "a refused budget was written to shoald.conf"
mkdir -p "$T/h4" && echo "max-size = lots" > "$T/h4/shoald.conf"
"$BIN/shoald" --home "$T/h4" > "$T/bad.out" 2>&1 && fail "a bad shoald.conf started"
grep -q 'shoald.conf line 1: max-size takes a size' "$T/bad.out" || fail "bad line: $(cat "$T/bad.out")"

# ---- plans: dry run, refusal, --fit hottest first -----------------------------------------
S warm $M --spine --wait > "$T/w0.out" 2>&1 || { cat "$T/w0.out"; fail "the spine should fit"; }
grep -q '^Plan: hf://t/tiny, the spine and small files$' "$T/w0.out" || { cat "$T/w0.out"; fail "plan printed"; }
# three experts of the last layer asked for, then evicted: hot but not cached
C get $M 7:0 7:1 7:2 > /dev/null && C get $M 7:0 7:1 7:2 > /dev/null || fail "GETs"
S gc --max-size 1 > /dev/null || fail "gc"
S stats --json > "$T/s1.json"
USED=$(js "$T/s1.json" 'j["disk"]["used"]')
N0=$(fetched)
S warm $M --experts all --dry-run > "$T/d1.out" 2> "$T/d1.err"; rc=$?
[ $rc = 8 ] && grep -q 'refused: the selection does not fit the budget' "$T/d1.err" && grep -q -- '--fit' "$T/d1.err" \
    || { cat "$T/d1.out" "$T/d1.err"; fail "experts all in 9 MiB: exit $rc"; }
S warm $M --experts all > "$T/r1.out" 2>&1; rc=$?
[ $rc = 8 ] && grep -q 'nothing started' "$T/r1.out" && ! grep -q 'Started' "$T/r1.out" \
    || { cat "$T/r1.out"; fail "a selection that does not fit should be refused: exit $rc"; }
S warm $M --experts all --fit --dry-run > "$T/d2.out" || { cat "$T/d2.out"; fail "--fit --dry-run"; }
grep -q 'trimmed to the budget' "$T/d2.out" || { cat "$T/d2.out"; fail "the fit plan"; }
FETCH=$(sed -n 's/^  to fetch  *\([0-9,]*\) objects.*/\1/p' "$T/d2.out" | tr -d ,)
OVER=$(sed -n 's/^  would not fit  *\([0-9,]*\) objects.*/\1/p' "$T/d2.out" | tr -d ,)
[ "$FETCH" -gt 0 ] && [ "$OVER" -gt 0 ] && [ $((FETCH + OVER)) = 448 ] || { cat "$T/d2.out"; fail "fit plan figures"; }
sleep 0.2
[ "$(fetched)" = "$N0" ] || fail "a dry run fetched $(( $(fetched) - N0 )) objects"
S stats --json > "$T/s2.json"
[ "$(js "$T/s2.json" 'j["disk"]["used"]')" = "$USED" ] || fail "a plan changed the cache"
S warm $M --experts all --fit --wait > "$T/w1.out" 2>&1 || { cat "$T/w1.out"; fail "warm --fit"; }
grep -q "^Warm complete: $FETCH objects, 0 errors" "$T/w1.out" || { cat "$T/w1.out"; fail "the trimmed job"; }
S stats --json > "$T/s3.json"
EV=$(js "$T/s2.json" 'j["disk"]["evicted"]')
[ "$(js "$T/s3.json" 'j["disk"]["used"] <= j["disk"]["budget"] and j["disk"]["evicted"] == '"$EV")" = True ] \
    || fail "the fit job went past the budget: $(js "$T/s3.json" 'j["disk"]')"
[ "$(js "$T/s3.json" '[(x["objects_total"], x["fit"], x["plan"]["not_fitting_objects"]) for x in j["daemon"]["jobs"]][0]')" \
  = "($FETCH, True, $OVER)" ] || fail "the job's plan in stats: $(js "$T/s3.json" 'j["daemon"]["jobs"]')"
C get $M 7:0 7:1 7:2 | grep -q 'hits 3 misses 0' || fail "the hottest experts (last layer) should have been warmed first"
C get $M 7:60 | grep -q 'hits 0 misses 1' || fail "a cold expert of the last layer should have been left out"

# ---- a plan that needs room says what it evicts ---------------------------------------------
S warm $M --experts layers:7-7 --dry-run > "$T/d3.out" || { cat "$T/d3.out"; fail "layers 7-7 plan"; }
grep -Eq '^  evicts +[1-9][0-9]* objects .*least valuable first: [0-9.]+ [KM]iB of experts' "$T/d3.out" \
    || { cat "$T/d3.out"; fail "the plan should name what it evicts"; }
stop_daemon

# ---- a budget smaller than the spine --------------------------------------------------------
start_daemon "$T/h2" --max-size 2M
"$BIN/shoal" --home "$T/h2" warm $M --spine > "$T/sp.out" 2>&1; rc=$?
[ $rc = 8 ] && grep -q 'the budget 2.00 MiB is smaller than what hf://t/tiny needs pinned' "$T/sp.out" \
    && grep -q 'raise --max-size to at least' "$T/sp.out" || { cat "$T/sp.out"; fail "spine past the budget: exit $rc"; }
stop_daemon

# ---- the BF16 spine evictable once its int8 pack exists ---------------------------------------
if [ -x "$BIN/shoal-engine" ]; then
    H5=$T/h5
    start_daemon "$H5"
    "$BIN/shoal-engine" run $M --home "$H5" --tokens 7,100,300 --max-tokens 2 > /dev/null 2> "$T/e.err" \
        || { cat "$T/e.err"; fail "engine run through shoald"; }
    grep -q 'BF16 matrices it replaces are evictable now' "$T/shoald.$run.log" || fail "no release logged"
    "$BIN/shoal" --home "$H5" stats --json > "$T/l1.json"
    [ "$(js "$T/l1.json" 'j["disk"]["lifted"] > 0 and j["disk"]["lifted"] < j["models"][0]["bytes_by_kind"]["spine"]')" = True ] \
        || fail "lifted spine: $(js "$T/l1.json" 'j["disk"]')"
    "$BIN/shoal" --home "$H5" warm $M --spine --dry-run > "$T/l.out" || { cat "$T/l.out"; fail "spine plan with a pack"; }
    grep -Eq '^  left out +[1-9][0-9]* objects .*int8 pack replaces' "$T/l.out" || { cat "$T/l.out"; fail "left out"; }
    stop_daemon
    start_daemon "$H5" --keep-spine
    grep -Eq 'keep-spine: [1-9][0-9]* spine matrices pinned again' "$T/shoald.$run.log" || fail "keep-spine at start"
    "$BIN/shoal" --home "$H5" stats --json > "$T/l2.json"
    [ "$(js "$T/l2.json" 'j["disk"]["lifted"]')" = 0 ] || fail "--keep-spine left $(js "$T/l2.json" 'j["disk"]["lifted"]') bytes lifted"
    "$BIN/shoal" --home "$H5" warm $M --spine --dry-run | grep -q 'left out' && fail "--keep-spine: nothing is left out"
    stop_daemon
fi
echo ok
