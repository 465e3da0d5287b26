#!/usr/bin/env bash
# One object over several connections (fetcher/xfer_parts.c, docs/fetcher.md
# "Parts"): a 17.5 MB slice expert with splitting on goes over >= 4
# connections at once and is stored byte-identical; resets in the middle of
# parts still give an identical object, and every retry asks only for its
# part's unfinished rest (no byte asked twice, parts disjoint); Ctrl-C
# mid-way, then a new run finishes it from what was kept.
source "$(dirname "$0")/lib.sh"
for b in shoal-fetch hubmock mkmodel; do [ -x "$BIN/$b" ] || fail "$BIN/$b not built"; done
command -v curl >/dev/null || skip "curl CLI not installed"
PY=/usr/bin/python3

"$BIN/mkmodel" --quiet --preset slice --experts 2 --layers 2 --out "$T/m" || fail "mkmodel"
start_hubmock --repo org/s="$T/m" --log "$T/req.log" --log-times --seed 7
export HF_ENDPOINT=$HUB HF_HOME=$T/hfhome
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_TOKEN_PATH
faults() { curl -sS -f -X POST "$HUB/_mock/faults?$1" -o /dev/null || fail "POST /_mock/faults?$1"; }
jget() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
F() { "$BIN/shoal-fetch" --no-token "$@"; }
# A cache with the manifest already in it, so the log then holds the
# expert's requests only.
home() { F --home "$1" hf://org/s --manifest >/dev/null 2>&1 || fail "manifest into $1"; }

# The first expert (layer:expert) of the manifest.
F --home "$T/h0" hf://org/s --manifest >"$T/man.out" 2>&1 || fail "manifest: $(cat "$T/man.out")"
EX=$($PY - "$T/m" <<'PYEOF'
import json, os, re, sys
idx = json.load(open(os.path.join(sys.argv[1], "model.safetensors.index.json")))["weight_map"]
ks = sorted((int(m.group(1)), int(m.group(2))) for n in idx
            for m in [re.search(r"layers\.(\d+)\.[a-z_]+\.experts\.(\d+)\.", n)] if m)
print("%d:%d" % ks[0])
PYEOF
) || fail "no expert in the index"
echo "expert $EX"

# Check the CDN requests logged since the mark: ranges of one object.
#   parts_check LOG MIN_CONCURRENT  -> prints "requests N parts P max-concurrent C"
parts_check() {
    $PY - "$1" "$2" <<'PYEOF'
import json, sys
L = [json.loads(l) for l in open(sys.argv[1])]
want = int(sys.argv[2])
cdn = [l for l in L if l["port"] == "cdn" and l["method"] == "GET" and l["range"]]
assert cdn, "no ranged CDN request"
parts = {}   # a part's requests share their last byte
for l in cdn:
    a, b = (int(x) for x in l["range"][len("bytes="):].split("-"))
    parts.setdefault(b, []).append((l["t0_us"], a, l["status"], l["bytes"], l["fault"]))
spans = []
for b, reqs in parts.items():
    reqs.sort()
    starts = [a for _, a, _, _, _ in reqs]
    # a retry asks for the rest only: it starts after the previous start
    # unless the previous answer delivered nothing (a status or refused)
    for (t, a, st, n, f), (t2, a2, _, _, _) in zip(reqs, reqs[1:]):
        assert a2 >= a, "part ending %d: retry at %d before %d" % (b, a2, a)
        if st == 206 and n > 65536 and f and ("reset" in f or "truncate" in f):
            assert a2 > a, "part ending %d: a retry asked again from %d after %d bytes" % (b, a, n)
    spans.append((min(starts), b))
spans.sort()
for (a1, b1), (a2, b2) in zip(spans, spans[1:]):
    assert b1 < a2, "parts overlap: %d-%d and %d-%d" % (a1, b1, a2, b2)
    assert b1 + 1 == a2, "a hole between parts: %d-%d and %d-%d" % (a1, b1, a2, b2)
ev = sorted([(l["t0_us"], 1) for l in cdn] + [(l["t1_us"], -1) for l in cdn])
cur = top = 0
for _, d in ev:
    cur += d
    top = max(top, cur)
print("requests %d parts %d max-concurrent %d" % (len(cdn), len(spans), top))
assert len(spans) >= want and top >= want, "want >= %d parts at once" % want
PYEOF
}

# ---- 1. one expert, split over the connections, capped per connection ------------
faults "clear=1&bw=10MB"
home "$T/h1"
home "$T/h1b"
: >"$T/req.log"
F --home "$T/h1" hf://org/s --experts "$EX" --parallel 8 --verify-against "$T/m" --json \
    >"$T/r1.json" 2>"$T/r1.err" || fail "split fetch: $(tail -n 3 "$T/r1.err")"
cat "$T/r1.json"
[ "$(jget "$T/r1.json" objects_fetched)" = 1 ] || fail "one object expected"
[ "$(jget "$T/r1.json" bytes_fetched)" = "$(jget "$T/r1.json" bytes)" ] || fail "bytes fetched != object bytes"
parts_check "$T/req.log" 4 || fail "the object did not go over >= 4 connections at once"

# split off: one request
: >"$T/req.log"
F --home "$T/h1b" hf://org/s --experts "$EX" --parallel 8 --split-min 0 --verify-against "$T/m" \
    >/dev/null 2>"$T/r1b.err" || fail "unsplit fetch: $(tail -n 3 "$T/r1b.err")"
n=$(grep -c '"port":"cdn","method":"GET"' "$T/req.log")
[ "$n" = 1 ] || fail "--split-min 0 made $n CDN requests, want 1"

# ---- 2. resets and truncations in the middle of parts --------------------------------
home "$T/h2"
faults "clear=1&bw=40MB&rate_reset=0.35&rate_truncate=0.15&seed=11"
: >"$T/req.log"
F --home "$T/h2" hf://org/s --experts "$EX" --parallel 8 --backoff-ms 20 --max-attempts 30 \
    --verify-against "$T/m" --json >"$T/r2.json" 2>"$T/r2.err" \
    || fail "split fetch through resets: $(tail -n 3 "$T/r2.err")"
cat "$T/r2.json"
[ "$(jget "$T/r2.json" retries)" -gt 0 ] || fail "the faults caused no retries"
[ "$(jget "$T/r2.json" resumed)" -gt 0 ] || fail "no part resumed mid-way"
[ "$(jget "$T/r2.json" bytes_fetched)" = "$(jget "$T/r2.json" bytes)" ] || fail "a byte was written twice"
grep -q '"fault":"reset' "$T/req.log" || fail "no reset happened"
parts_check "$T/req.log" 2 || fail "parts through resets"

# ---- 3. Ctrl-C mid-way, a new run finishes ---------------------------------------------
home "$T/h3"
faults "clear=1&bw=1MB"
"$BIN/shoal-fetch" --no-token --home "$T/h3" hf://org/s --experts "$EX" --parallel 8 \
    >"$T/r3.out" 2>&1 &
fpid=$!
sleep 1
kill -INT $fpid
wait $fpid
rc=$?
[ $rc -eq 130 ] || fail "Ctrl-C: exit $rc, want 130 ($(cat "$T/r3.out"))"
faults "clear=1"
F --home "$T/h3" hf://org/s --experts "$EX" --verify-against "$T/m" --json >"$T/r4.json" \
    2>"$T/r4.err" || fail "resume after Ctrl-C: $(tail -n 3 "$T/r4.err")"
total=$(jget "$T/r4.json" bytes) got=$(jget "$T/r4.json" bytes_fetched)
echo "resume fetched $got of $total bytes"
[ "$got" -lt "$total" ] || fail "the rerun fetched everything again (nothing was kept)"
echo "ok"
