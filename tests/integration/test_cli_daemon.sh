#!/usr/bin/env bash
# shoal through a real shoald and hubmock:
#   a known access pattern (shoalc GETs and a RAM-tier REPORT) gives exact
#   counts and hit rates in `shoal stats --json`, and its human output
#   matches a golden file; the heat map has one cell per (layer, expert)
#   with the right colours; `warm --wait` shows progress and completes;
#   Ctrl-C leaves the job running; verify finds a blob corrupted on disk;
#   gc brings the cache under the size asked; with the daemon stopped,
#   stats still works (from the index) and rm frees the space.
source "$(dirname "$0")/lib.sh"
GOLD=$ROOT/tests/integration/golden
for b in shoald shoalc shoal hubmock mkmodel; do
    [ -x "$BIN/$b" ] || skip "$b not built"
done

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl"
H=$T/home
M=hf://t/tiny
export HF_ENDPOINT=$HUB
S() { "$BIN/shoal" --home "$H" "$@"; }
C() { "$BIN/shoalc" --home "$H" "$@"; }
start_daemon() {
    bg shoald "$BIN/shoald" --home "$H" --no-fsync --max-size 64M --log "$T/shoald.log" "$@"
    wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
}
stop_daemon() {
    kill -TERM "$PID_shoald"
    wait "$PID_shoald" || fail "shoald exited $? on SIGTERM"
}
js() {   # js FILE EXPR: print a Python expression over the JSON in FILE (as j)
    /usr/bin/python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}
golden() {
    if [ -n "${SHOAL_GOLDEN_UPDATE:-}" ]; then cp "$T/$1" "$GOLD/$1"; return; fi
    diff -u "$GOLD/$1" "$T/$1" || fail "output differs from golden/$1"
}

# ---- a known access pattern ------------------------------------------------------------
start_daemon --parallel 4
C get $M 1:0 1:1 1:2 > /dev/null || fail "GET 1"          # 3 misses
C get $M 1:0 1:1 2:3 > /dev/null || fail "GET 2"          # 2 hits, 1 miss
C get $M 1:0 > /dev/null || fail "GET 3"                  # 1 hit
C report '{"tier":"ram","hits":10,"misses":6,"bytes":1000}' || fail "REPORT"
S stats --json > "$T/s1.json" || fail "stats --json"
/usr/bin/python3 - "$T/s1.json" <<'PY' || { cat "$T/s1.json"; fail "stats --json through shoald"; }
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == "shoal.stats" and j["source"] == "daemon", j["source"]
d, r = j["tiers"]["disk"], j["tiers"]["ram"]
assert (d["hits"], d["misses"], d["joins"], d["requests"]) == (3, 4, 0, 7), d
assert abs(d["hit_rate"] - 3 / 7) < 1e-12
assert (r["hits"], r["misses"]) == (10, 6), r
assert j["tiers"]["upstream"]["fetches"] == 4
assert j["served"]["requests"] == 17 and j["served"]["ram"] == 10 and j["served"]["disk"] == 3
assert j["disk"]["budget"] == 64 << 20, j["disk"]
lay = {l["layer"]: l["disk"] for l in j["layers"]}
assert (lay[1]["hits"], lay[1]["misses"]) == (3, 3) and abs(lay[1]["hit_rate"] - 0.5) < 1e-12, lay
assert (lay[2]["hits"], lay[2]["misses"]) == (0, 1), lay
assert len(j["models"]) == 1 and j["models"][0]["repo"] == "t/tiny"
cov = j["models"][0]["coverage"]
assert cov["experts_cached"] == 4 and cov["experts_total"] == cov["layers"] * 0 + cov["experts_total"]
progs = [s["program"] for s in j["sessions"]]
assert progs.count("shoalc") >= 3, progs
PY
# The human output: everything but the volatile parts (paths, times, rates, pids).
S stats --by layer > "$T/s1.txt" || fail "stats"
sed -n '/^Requests/,/^Upstream/p' "$T/s1.txt" | grep -v '^Upstream' > "$T/cli_stats_daemon.txt"
sed -n '/^Layers (disk cache)/,/^$/p' "$T/s1.txt" >> "$T/cli_stats_daemon.txt"
grep -q '^Source  *shoald (live)$' "$T/s1.txt" || fail "stats should say it is live"
grep -Eq '^  used +[0-9.]+ KiB  of 64.0 MiB' "$T/s1.txt" || fail "disk use against the budget"
golden cli_stats_daemon.txt

# ---- the heat map -----------------------------------------------------------------------
S heatmap $M -o "$T/h.svg" > /dev/null || fail "heatmap"
/usr/bin/python3 - "$T/h.svg" "$T/s1.json" <<'PY' || fail "heatmap SVG through shoald"
import json, math, sys, xml.etree.ElementTree as ET
NS = "{http://www.w3.org/2000/svg}"
cov = json.load(open(sys.argv[2]))["models"][0]["coverage"]
cells = [r for r in ET.parse(sys.argv[1]).getroot().iter(NS + "rect") if r.get("class") == "cell"]
L, E = cov["layers"], cov["experts_per_layer"]
assert len(cells) == L * E, (len(cells), L, E)
seen = {(int(c.get("data-layer")), int(c.get("data-expert"))): c for c in cells}
assert len(seen) == L * E
pal = ["#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
       "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f"]
known = {(1, 0): 3, (1, 1): 2, (1, 2): 1, (2, 3): 1}
for k, c in seen.items():
    n = known.get(k, 0)
    assert int(c.get("data-requests")) == n, (k, c.get("data-requests"))
    mean = sum(v for (l, e), v in known.items() if l == k[0]) / E
    b = min(10, max(0, math.floor(math.log(n / mean) / math.log(4) * 5 + 0.5) + 5)) if n else -1
    exp = "#c8c8c8" if n == 0 else pal[b]
    assert c.get("fill") == exp, (k, c.get("fill"), exp)
assert seen[(1, 0)].get("fill") == "#67001f" and seen[(0, 0)].get("fill") == "#c8c8c8"
PY

# ---- warm --wait -------------------------------------------------------------------------
S warm $M --experts layers:3-4 --wait > "$T/w1.out" 2>&1 || { cat "$T/w1.out"; fail "warm --wait"; }
grep -Eq '^warm +100\.0 %' "$T/w1.out" && grep -q '^Warm complete' "$T/w1.out" \
    || { cat "$T/w1.out"; fail "warm --wait shows no progress to completion"; }
grep -Eq '(KiB|MiB|B)/s  ETA' "$T/w1.out" || fail "progress lacks rate and ETA"

# pin / unpin through shoald: the 2 x 64 experts of layers 3-4 just warmed
S pin $M --layers 3-4 > "$T/pin.out" || { cat "$T/pin.out"; fail "pin"; }
grep -q '^Pinned 128 objects' "$T/pin.out" || { cat "$T/pin.out"; fail "pin count"; }
S stats --json > "$T/sp.json"
[ "$(js "$T/sp.json" 'j["disk"]["pinned"] - j["models"][0]["bytes_by_kind"]["spine"] - j["models"][0]["bytes_by_kind"]["small"] - j["models"][0]["bytes_by_kind"]["derived"]')" = $((128 * 13056)) ] \
    || fail "pinned bytes after pin: $(js "$T/sp.json" 'j["disk"]')"
S unpin $M --layers 3-4 | grep -q '^Unpinned 128 objects' || fail "unpin"

# ---- Ctrl-C detaches; the job goes on -----------------------------------------------------
curl -fsS -X POST "$HUB/_mock/faults?bw=20000" > /dev/null || fail "could not slow hubmock down"
"$BIN/shoal" --home "$H" warm $M --experts all --wait > "$T/w2.out" 2>&1 &
WPID=$!
wait_line "$T/w2.out" '^Started warm job [0-9]+' 20 || fail "warm did not start"
wait_line "$T/w2.out" '%' 20 || fail "no progress line"
kill -INT $WPID
wait $WPID; rc=$?
[ $rc = 130 ] || { cat "$T/w2.out"; fail "Ctrl-C: exit $rc, not 130"; }
JOB=$(sed -n 's/^Started warm job \([0-9]*\).*/\1/p' "$T/w2.out")
grep -q "Detached: warm job $JOB keeps running in shoald" "$T/w2.out" || { cat "$T/w2.out"; fail "no detach message"; }
C job "$JOB" > "$T/job.out" || fail "job status"
grep -Eq '^state [01] ' "$T/job.out" || { cat "$T/job.out"; fail "the job did not keep running"; }
curl -fsS -X POST "$HUB/_mock/faults?bw=0" > /dev/null
S warm --job "$JOB" --wait > "$T/w3.out" 2>&1 || { cat "$T/w3.out"; fail "following the job again"; }
grep -q '^Warm complete' "$T/w3.out" || fail "the detached job did not complete"

# ---- verify finds a blob corrupted on disk --------------------------------------------------
BLOB=$(find "$H/blobs" -type f -size 13056c | sort | head -n 1)
[ -n "$BLOB" ] || fail "no expert blob found"
printf 'XXXXXXXX' | dd of="$BLOB" bs=1 seek=100 conv=notrunc status=none
S verify > "$T/v.out"; rc=$?
[ $rc = 5 ] && grep -q ' 1 bad' "$T/v.out" || { cat "$T/v.out"; fail "verify: exit $rc"; }
# its row is gone at once; the file goes on shoald's unlinker (a worker), a moment later
for _ in $(seq 50); do [ -e "$BLOB" ] || break; sleep 0.1; done
[ -e "$BLOB" ] && fail "the corrupt blob is still there 5 s after verify"
S verify > /dev/null || fail "a second verify should find the cache sound"

# ---- gc brings the cache under the size --------------------------------------------------------
S stats --json > "$T/s2.json"
PINNED=$(js "$T/s2.json" 'j["disk"]["pinned"]')
USED=$(js "$T/s2.json" 'j["disk"]["used"]')
TARGET=$(( PINNED + 200000 ))
[ "$USED" -gt "$TARGET" ] || fail "the cache ($USED bytes) should be above the gc target $TARGET"
S gc --max-size "$TARGET" > "$T/gc.out" || fail "gc"
S stats --json > "$T/s3.json"
[ "$(js "$T/s3.json" 'j["disk"]["used"]')" -le "$TARGET" ] || { cat "$T/gc.out"; fail "gc: still above $TARGET"; }

# ---- the daemon stopped: stats from the index, rm frees the space -----------------------------
S stats --json > "$T/s4.json"
stop_daemon
S stats --json > "$T/s5.json" || fail "stats with the daemon stopped"
[ "$(js "$T/s5.json" 'j["source"]')" = index ] || fail "stats should read the index"
[ "$(js "$T/s5.json" '(j["tiers"]["disk"]["hits"], j["tiers"]["disk"]["misses"], j["tiers"]["ram"]["hits"])')" \
  = "$(js "$T/s4.json" '(j["tiers"]["disk"]["hits"], j["tiers"]["disk"]["misses"], j["tiers"]["ram"]["hits"])')" ] \
    || fail "the index and the daemon disagree"
S stats | grep -q 'shoald is not running' || fail "human stats should say the daemon is not running"
S ls | grep -q '^t/tiny ' || fail "ls"
# estimate from the cached manifest, with the upstream rate of past transfers
S estimate $M --disk-bytes 8M --mem-bytes 16M > "$T/est.out" || { cat "$T/est.out"; fail "estimate"; }
grep -q "shapes from the cached manifest's config.json" "$T/est.out" && grep -q '^  spine (int8) ' "$T/est.out" \
    && grep -Eq 'upstream +up += [0-9.]+ [KMG]?i?B/s' "$T/est.out" \
    && [ "$(grep -cE '^ +=.* = [0-9.e+-]+ s$' "$T/est.out")" = 3 ] || { cat "$T/est.out"; fail "estimate of a cached model"; }
S rm $M > "$T/rm.out" || { cat "$T/rm.out"; fail "rm"; }
S stats --json > "$T/s6.json"
[ "$(js "$T/s6.json" 'j["disk"]["used"]')" = 0 ] || fail "rm left $(js "$T/s6.json" 'j["disk"]["used"]') bytes"
[ -z "$(find "$H/blobs" -type f)" ] || fail "rm left blobs behind"
echo ok
