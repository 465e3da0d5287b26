#!/usr/bin/env bash
# shoal with no daemon running, on a cache with a known access pattern
# (built by `test_report --populate`, see tests/unit/cache/test_report.c):
#   stats from the index read-only: human output vs a golden file, --json
#   exact counts and hit rates; ls; heatmap SVG (one cell per (layer,
#   expert), the right colours) and --ascii; verify finds a corrupted blob,
#   --deep a file that does not hash to its etag; pin; gc brings the cache
#   under the size; rm frees the space; estimate shows its arithmetic;
#   help and exit codes.
source "$(dirname "$0")/lib.sh"
BUILD=${BUILD:-build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
POP=$BUILD/tests/unit/cache/test_report
GOLD=$ROOT/tests/integration/golden
[ -x "$BIN/shoal" ] && [ -x "$POP" ] || skip "bin/shoal or $POP not built"
H=$T/home
"$POP" --populate "$H" || fail "could not build the fixture cache"
S() { "$BIN/shoal" --home "$H" "$@"; }
# Paths and clock times change from run to run; nothing else may.
norm() { sed -e "s|$H|HOME|g" -e 's/[0-9]\{4\}-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]/YYYY-MM-DD hh:mm:ss/g'; }
golden() {   # golden NAME: stdin vs golden/NAME (SHOAL_GOLDEN_UPDATE=1 rewrites it)
    norm > "$T/$1"
    if [ -n "${SHOAL_GOLDEN_UPDATE:-}" ]; then cp "$T/$1" "$GOLD/$1"; return; fi
    diff -u "$GOLD/$1" "$T/$1" || fail "output differs from golden/$1"
}

# ---- stats from the index ----------------------------------------------------------
S stats > "$T/stats.out" || fail "shoal stats exited $?"
golden cli_stats_index.txt < "$T/stats.out"
S stats org/tiny --by layer > "$T/layer.out" || fail "shoal stats --by layer exited $?"
golden cli_stats_layer.txt < "$T/layer.out"
S stats --json > "$T/stats.json" || fail "stats --json"
/usr/bin/python3 - "$T/stats.json" <<'PY' || fail "stats --json figures"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["schema"] == "shoal.stats" and j["version"] == 1 and j["source"] == "index", j["source"]
d, r, u = j["tiers"]["disk"], j["tiers"]["ram"], j["tiers"]["upstream"]
assert (d["hits"], d["misses"], d["joins"], d["requests"]) == (8, 2, 1, 11), d
assert abs(d["hit_rate"] - 8 / 11) < 1e-12
assert (r["hits"], r["misses"]) == (30, 11), r
assert (u["fetches"], u["joins"], u["bytes_in"]) == (2, 1, 2000), u
assert j["served"] == {"requests": 41, "ram": 30, "disk": 8, "upstream": 3,
                       "hit_rate": j["served"]["hit_rate"]} and abs(j["served"]["hit_rate"] - 38 / 41) < 1e-12
layers = {(l["model"], l["layer"]): l for l in j["layers"]}
assert layers[(1, 0)]["disk"]["hits"] == 6 and layers[(1, 0)]["disk"]["hit_rate"] == 1.0
assert abs(layers[(1, 1)]["disk"]["hit_rate"] - 0.4) < 1e-12
assert j["disk"]["budget"] is None and j["daemon"] is None
assert [s["pid"] for s in j["sessions"]] == [4243, 4242]
m = j["models"][0]
assert m["repo"] == "org/tiny" and m["coverage"]["experts_cached"] == 6 and m["coverage"]["experts_total"] == 8
PY
S stats --by expert --json | /usr/bin/python3 -c '
import json, sys
g = {(r["layer"]): r for r in json.load(sys.stdin)["experts"]}
assert g[0]["requests"] == [4, 1, 1] and g[1]["requests"] == [2, 0, 1, 2] and g[1]["hits"] == [2, 0, 0, 0], g
' || fail "stats --by expert grid"
S stats org/nothing > "$T/nf.out" 2>&1; rc=$?
[ $rc = 4 ] && grep -q "no model matching 'org/nothing'" "$T/nf.out" || fail "unknown model: exit $rc, $(cat "$T/nf.out")"

# ---- ls -----------------------------------------------------------------------------
# (not `S ls | golden`: a failure inside a pipe's subshell fails nothing)
S ls > "$T/ls.out" || fail "shoal ls exited $?"
golden cli_ls_index.txt < "$T/ls.out"

# ---- heatmap -------------------------------------------------------------------------
S heatmap org/tiny -o "$T/h.svg" > /dev/null || fail "heatmap"
if command -v xmllint > /dev/null; then xmllint --noout "$T/h.svg" || fail "xmllint refuses the heat map"; fi
/usr/bin/python3 - "$T/h.svg" <<'PY' || fail "heatmap SVG"
import math, sys, xml.etree.ElementTree as ET
NS = "{http://www.w3.org/2000/svg}"
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == NS + "svg"
cells = [r for r in root.iter(NS + "rect") if r.get("class") == "cell"]
assert len(cells) == 2 * 4, len(cells)
seen = {(int(c.get("data-layer")), int(c.get("data-expert"))): c for c in cells}
assert sorted(seen) == [(l, e) for l in range(2) for e in range(4)]
# requests per expert over the layer's mean, log scale centred on 1 (docs/cli.md)
pal = ["#053061", "#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7",
       "#fddbc7", "#f4a582", "#d6604d", "#b2182b", "#67001f"]
want = {(0, 0): 4, (0, 1): 1, (0, 2): 1, (0, 3): 0, (1, 0): 2, (1, 1): 0, (1, 2): 1, (1, 3): 2}
for k, n in want.items():
    c = seen[k]
    mean = sum(v for (l, e), v in want.items() if l == k[0]) / 4
    assert int(c.get("data-requests")) == n, (k, c.get("data-requests"))
    b = min(10, max(0, math.floor(math.log(n / mean) / math.log(4) * 5 + 0.5) + 5)) if n else -1
    exp = "#c8c8c8" if n == 0 else pal[b]
    assert c.get("fill") == exp, (k, n, c.get("fill"), exp)
assert seen[(0, 0)].get("fill") == "#b2182b" and seen[(0, 1)].get("fill") == "#d1e5f0"
rates = {int(r.get("data-layer")): float(r.get("data-hit-rate")) for r in root.iter(NS + "rect") if r.get("class") == "rate"}
assert rates == {0: 1.0, 1: 0.4}, rates
assert len([r for r in root.iter(NS + "rect") if r.get("class") == "key"]) == 11
texts = " ".join(t.text or "" for t in root.iter(NS + "text"))
assert "expert" in texts and "layer" in texts and "log scale" in texts and "40.0 %" in texts
PY
S heatmap org/tiny --ascii > "$T/ascii.out" || fail "heatmap --ascii"
grep -q '^    0 |%-- | 100.0 %$' "$T/ascii.out" && grep -q '^    1 |\* -\*|  40.0 %$' "$T/ascii.out" \
    || { cat "$T/ascii.out"; fail "ascii heat map rows"; }
S heatmap org/tiny --json | /usr/bin/python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["schema"] == "shoal.heatmap" and j["experts_per_cell"] == 1 and j["columns"] == 4, j
r = {x["layer"]: x for x in j["rows"]}
assert r[0]["cells"] == [4, 1, 1, 0] and r[1]["cells"] == [2, 0, 1, 2] and r[1]["hits"] == [2, 0, 0, 0], r
assert r[0]["ratio"][0] == round(4 / 1.5, 4) and r[0]["busiest_expert"] == 0, r[0]
' || fail "heatmap --json"

# ---- verify, pin, gc, rm (the CLI is the writer: no daemon runs) ----------------------
S verify > "$T/v0.out"; rc=$?
[ $rc = 0 ] && grep -q 'Checked 11 objects' "$T/v0.out" || fail "verify of a sound cache: exit $rc"
S verify org/tiny --deep > "$T/vd.out"; rc=$?
[ $rc = 5 ] && grep -q 'bad file: bad.bin' "$T/vd.out" || { cat "$T/vd.out"; fail "deep verify: exit $rc"; }
printf 'XXXX' | dd of="$H/blobs/0000000000000001" bs=1 seek=10 conv=notrunc status=none
S verify > "$T/v1.out"; rc=$?
[ $rc = 5 ] && grep -q '1 bad (removed' "$T/v1.out" || { cat "$T/v1.out"; fail "corrupt blob: exit $rc"; }
S verify > /dev/null || fail "the bad blob should be gone after verify"
S pin org/tiny --layers 0-0 | grep -q 'Pinned 4 objects' || fail "pin layer 0"
used() { S stats --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["disk"]["used"])'; }
S gc --max-size 5000 > "$T/gc.out" || fail "gc"
[ "$(used)" -le 5600 ] || fail "gc: pinned objects must stay"
S unpin org/tiny | grep -q 'Unpinned' || fail "unpin"
S gc --max-size 3000 > "$T/gc2.out" || fail "gc 2"
[ "$(used)" -le 3000 ] || { cat "$T/gc2.out"; fail "gc did not bring the cache under 3000 bytes: $(used)"; }
S rm org/tiny > "$T/rm.out" || fail "rm"
grep -q 'Removed org/tiny@main' "$T/rm.out" || fail "rm output: $(cat "$T/rm.out")"
# config.json is shared with org/other: it stays until that goes too.
[ "$(used)" = 43 ] || fail "rm should leave only the shared config.json: $(used) bytes left"
S rm hf://org/other@main > /dev/null || fail "rm org/other"
[ "$(used)" = 0 ] || fail "rm should free everything: $(used) bytes left"
S rm org/tiny > /dev/null 2>&1; [ $? = 4 ] || fail "rm of an absent model should exit 4"

# ---- estimate -------------------------------------------------------------------------
"$BIN/mkmodel" --preset tiny --out "$T/m" --quiet || fail "mkmodel"
S estimate "$T/m" --disk-bytes 8M --mem-bytes 16M --upstream 50M > "$T/est.out" || { cat "$T/est.out"; fail "estimate"; }
for w in 'experts per token  E = ' 'from RAM +\(S \+ E\) / mem' 'from disk +S/mem' \
         'streaming +S/mem' 'cold disk read' 'memory read' 'upstream +up += 50.0 MiB/s'; do
    grep -Eq "$w" "$T/est.out" || { cat "$T/est.out"; fail "estimate lacks /$w/"; }
done
[ "$(grep -cE '^ +=.* = [0-9.e+-]+ s$' "$T/est.out")" = 3 ] || { cat "$T/est.out"; fail "estimate: three results"; }
# The spine from the config's shapes: its BF16 tally is what the checkpoint
# holds (index total_size minus the routed experts), and the formats differ.
/usr/bin/python3 - "$T/m" "$T/est.out" <<'PY' || { cat "$T/est.out"; fail "estimate: the checkpoint's spine"; }
import json, re, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json")); c = c.get("text_config", c)
total = json.load(open(d + "/model.safetensors.index.json"))["metadata"]["total_size"]
moe = sum(1 for i in range(c["num_hidden_layers"]) if i >= c["first_k_dense_replace"])
span = 3 * c["moe_intermediate_size"] * c["routed_expert_hidden_size"] * 17 // 32
v = float(total - moe * c["num_experts"] * span)
u = 0
while v >= 1024 and u < 5:
    v /= 1024; u += 1
want = ("%.2f %s" if v < 10 else "%.1f %s" if v < 100 else "%.0f %s") % (v, ["B", "KiB", "MiB", "GiB"][u])
line = [l for l in open(sys.argv[2]) if "checkpoint:" in l][0]
assert ("checkpoint: %s BF16" % want) in line, (line, want)
PY
S estimate "$T/m" --spine int4 --disk-bytes 8M --mem-bytes 16M --upstream 50M > "$T/est4.out" || fail "estimate --spine int4"
grep -q '^  spine (int4) ' "$T/est4.out" || { cat "$T/est4.out"; fail "estimate --spine int4"; }
[ "$(grep 'S = ' "$T/est.out")" != "$(grep 'S = ' "$T/est4.out" | sed 's/int4/int8/')" ] || fail "int4 and int8 spines should differ"
S estimate "$T/m" --spine int3 > /dev/null 2>&1; [ $? = 2 ] || fail "--spine int3 should be a usage error"
/usr/bin/python3 - "$T/m/config.json" "$T/est.out" <<'PY' || fail "estimate: E"
import json, re, sys
c = json.load(open(sys.argv[1])); c = c.get("text_config", c)
moe = sum(1 for i in range(c["num_hidden_layers"]) if i >= c["first_k_dense_replace"] and (i - c["first_k_dense_replace"]) % c["moe_layer_freq"] == 0)
span = 3 * c["moe_intermediate_size"] * c["routed_expert_hidden_size"] * 17 // 32
line = [l for l in open(sys.argv[2]) if "E = " in l][0]
m = re.search(r"E = (\d+) MoE layers x (\d+) experts", line)
assert m and int(m.group(1)) == moe and int(m.group(2)) == c["num_experts_per_token"], (line, moe)
PY

# ---- help, usage and the daemon-only command ---------------------------------------------
for c in stats ls warm verify gc pin unpin rm heatmap estimate; do
    S "$c" --help > "$T/help" || fail "$c --help exited $?"
    grep -q "usage: shoal" "$T/help" || fail "$c --help prints no usage"
done
S stats --by nonsense > /dev/null 2>&1; [ $? = 2 ] || fail "a bad flag should exit 2"
S frobnicate > /dev/null 2>&1; [ $? = 2 ] || fail "an unknown command should exit 2"
S warm org/tiny > "$T/warm.out" 2>&1; rc=$?
[ $rc = 3 ] && grep -q 'shoald is not running' "$T/warm.out" || fail "warm without shoald: exit $rc, $(cat "$T/warm.out")"
"$BIN/shoal" --home "$T/none" stats > "$T/none.out" 2>&1; rc=$?
[ $rc = 4 ] && grep -q 'no shoal cache in' "$T/none.out" || fail "no cache: exit $rc"
echo "ok"
