#!/usr/bin/env bash
# shoal at Kimi K3's real size (test_report_full --populate: 92 MoE layers x
# 896 experts with the counts of a long run, a K3-shaped manifest):
#   through shoald, `stats --by expert --json` is a 1.19 MB reply — past the
#   1 MiB frame, so it comes in several frames — and every one of the
#   82,432 counts is exact; the heat map is a bounded, well-formed SVG whose
#   every cell has the colour of its ratio to the layer's mean; --json and
#   --ascii agree; with shoald stopped the index gives the same grid and the
#   output says where it came from.
source "$(dirname "$0")/lib.sh"
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
POP=$BUILD/tests/unit/cache/test_report_full
[ -x "$BIN/shoal" ] && [ -x "$BIN/shoald" ] && [ -x "$POP" ] || skip "shoal, shoald or $POP not built"
H=$T/home
M=moonshotai/Kimi-K3
"$POP" --populate "$H" || fail "could not build the K3-sized cache"
S() { "$BIN/shoal" --home "$H" "$@"; }
bg shoald "$BIN/shoald" --home "$H" --no-fsync --max-size 64M --log "$T/shoald.log" --log-level debug
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"

# The grid the fixture wrote (test_report_full.c, k3_requests).
cat > "$T/k3.py" <<'PY'
def requests(l, e):
    h = (l * 2654435761 + e * 40503) & 0xffffffff
    r = 150000 + h % 60000
    if (e * 7 + l) % 211 == 0:
        r *= 4
    if (e * 13 + l) % 307 == 0:
        r //= 5
    return r
GRID = {l: [requests(l, e) for e in range(896)] for l in range(1, 93)}
PY

# ---- the full-size STATS reply, in frames ------------------------------------------------
S stats $M --by expert --json > "$T/s.json" || fail "stats --by expert --json through shoald"
/usr/bin/python3 - "$T" <<'PY' || fail "the full-size grid"
import json, os, sys
sys.path.insert(0, sys.argv[1])
from k3 import GRID
j = json.load(open(os.path.join(sys.argv[1], "s.json")))
assert j["source"] == "daemon", j["source"]
rows = {r["layer"]: r for r in j["experts"]}
assert sorted(rows) == list(range(1, 93)), sorted(rows)[:5]
for l, want in GRID.items():
    assert rows[l]["requests"] == want, l
    assert rows[l]["hits"] == [r - r // 16 for r in want], l
assert j["tiers"]["disk"]["requests"] == sum(map(sum, GRID.values()))
assert j["models"][0]["coverage"]["experts_total"] == 82432
PY
LINE=$(grep -E 'JSON reply of [0-9]+ bytes in [0-9]+ frames' "$T/shoald.log" | tail -n 1)
[ -n "$LINE" ] || fail "shoald did not send the reply in frames"
BYTES=$(echo "$LINE" | sed -E 's/.*reply of ([0-9]+) bytes in ([0-9]+) frames.*/\1/')
FRAMES=$(echo "$LINE" | sed -E 's/.*reply of ([0-9]+) bytes in ([0-9]+) frames.*/\2/')
[ "$BYTES" -gt 1048576 ] && [ "$FRAMES" -ge 2 ] || fail "reply of $BYTES bytes in $FRAMES frames"
echo "full-size STATS reply: $BYTES bytes in $FRAMES frames (each at most 1,048,572 bytes)"
S stats $M --by expert > "$T/s.txt" || fail "stats --by expert"
grep -q '^Source  *shoald (live)$' "$T/s.txt" || fail "stats should say it is live"
/usr/bin/python3 - "$T" <<'PY' || { sed -n '/^Hottest/,$p' "$T/s.txt"; fail "the hottest expert"; }
import os, re, sys
sys.path.insert(0, sys.argv[1])
from k3 import GRID
top = max((n, -l, -e) for l, v in GRID.items() for e, n in enumerate(v))
text = open(os.path.join(sys.argv[1], "s.txt")).read()
row = text.split("Hottest experts")[1].splitlines()[2].split()
assert (int(row[1]), int(row[2]), int(row[3].replace(",", ""))) == (-top[1], -top[2], top[0]), row
assert "20 of 82432 asked" in text
PY

# ---- the heat map at full size -------------------------------------------------------------
S heatmap $M -o "$T/h.svg" > "$T/h.out" || fail "heatmap"
grep -q 'in cells of 8' "$T/h.out" && grep -q 'live from shoald' "$T/h.out" || fail "$(cat "$T/h.out")"
SIZE=$(stat -c %s "$T/h.svg")
[ "$SIZE" -lt 1000000 ] || fail "the full-size heat map is $SIZE bytes (bound: 1 MB)"
echo "full-size heat map: $SIZE bytes"
if command -v xmllint > /dev/null; then xmllint --noout "$T/h.svg" || fail "xmllint refuses the heat map"; fi
/usr/bin/python3 - "$T" <<'PY' || fail "heat map cells"
import math, os, re, sys, xml.etree.ElementTree as ET
sys.path.insert(0, sys.argv[1])
from k3 import GRID
NS = "{http://www.w3.org/2000/svg}"
PAL = ["#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
       "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f"]
root = ET.parse(os.path.join(sys.argv[1], "h.svg")).getroot()
rows = [g for g in root.iter(NS + "g") if g.get("class") == "row"]
assert len(rows) == 93, len(rows)
for g in rows:
    l = int(g.get("data-layer"))
    want = GRID.get(l, [0] * 896)
    mean = sum(want) / 896
    got = {}
    for p in g.iter(NS + "path"):
        for x, y, w, h in re.findall(r"M(\d+) (\d+)h(\d+)v(\d+)h-\d+z", p.get("d")):
            x, w = int(x), int(w)
            for c in range((x - 70) // 8, (x - 70 + w) // 8):
                assert c not in got, (l, c)
                got[c] = p.get("fill")
    assert sorted(got) == list(range(112)), (l, len(got))
    for c in range(112):
        s = sum(want[c * 8:(c + 1) * 8])
        exp = "#c8c8c8" if s == 0 else PAL[min(10, max(0, math.floor(math.log(s / 8 / mean) / math.log(4) * 5 + 0.5) + 5))]
        assert got[c] == exp, (l, c, got[c], exp)
    assert g.find(NS + "title") is not None
# a flat layer is mostly white; the hot experts (4x) show
fills = [p.get("fill") for p in root.iter(NS + "path")]
assert "#f7f7f7" in fills and ("#fddbc7" in fills or "#f4a582" in fills), set(fills)
PY
S heatmap $M --json > "$T/h.json" || fail "heatmap --json"
/usr/bin/python3 - "$T" <<'PY' || fail "heatmap --json cells"
import json, os, sys
sys.path.insert(0, sys.argv[1])
from k3 import GRID
j = json.load(open(os.path.join(sys.argv[1], "h.json")))
assert (j["layers"], j["experts"], j["experts_per_cell"], j["columns"]) == (93, 896, 8, 112), j
for r in j["rows"]:
    want = GRID.get(r["layer"], [0] * 896)
    assert r["cells"] == [sum(want[c * 8:(c + 1) * 8]) for c in range(112)], r["layer"]
    assert r["requests"] == sum(want)
PY
# The finest grid the flag allows stays bounded too (4 experts a cell).
S heatmap $M -o "$T/h4.svg" --columns 256 > /dev/null || fail "heatmap --columns 256"
SIZE4=$(stat -c %s "$T/h4.svg")
[ "$SIZE4" -lt 1000000 ] || fail "heat map of 224 columns: $SIZE4 bytes"
echo "heat map of 224 columns: $SIZE4 bytes"
S heatmap $M --ascii > "$T/a.out" || fail "heatmap --ascii"
[ "$(grep -cE '^ +[0-9]+ \|' "$T/a.out")" = 93 ] || { head -5 "$T/a.out"; fail "ascii rows"; }

# ---- the daemon stopped: the index gives the same grid, and says so ---------------------------
kill -TERM "$PID_shoald"
wait "$PID_shoald" || fail "shoald exited $? on SIGTERM"
S stats $M --by expert --json > "$T/i.json" || fail "stats from the index"
/usr/bin/python3 - "$T/s.json" "$T/i.json" <<'PY' || fail "index and daemon disagree"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert b["source"] == "index"
assert a["experts"] == b["experts"]
PY
S stats $M | grep -q '^Source  *index (read-only; shoald is not running)$' || fail "the index source is not named"
S heatmap $M -o "$T/hi.svg" | grep -q 'from the index: shoald is not running' || fail "heatmap source"
echo ok
