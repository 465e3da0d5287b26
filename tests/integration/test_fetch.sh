#!/usr/bin/env bash
# bin/shoal-fetch (fetcher/fetch.h) against hubmock with real HTTP: every
# expert span and spine tensor of tiny-k3 through 429s, resets,
# truncations, ignored ranges, stalls and expiring CDN URLs arrives
# byte-identical; the token never reaches the CDN; each file is resolved
# once (plus re-resolves after expiry) and a restart re-resolves nothing;
# typed errors; revision pinning while main moves; Ctrl-C and resume; a
# snapshot directory upstream; manifest-level rejections; the slice's
# manifest.
source "$(dirname "$0")/lib.sh"
for b in shoal-fetch hubmock mkmodel; do [ -x "$BIN/$b" ] || fail "$BIN/$b not built"; done
command -v curl >/dev/null || skip "curl CLI not installed"
PY=/usr/bin/python3

"$BIN/mkmodel" --quiet --out "$T/m1" || fail "mkmodel"
"$BIN/mkmodel" --quiet --seed 5 --out "$T/m2" || fail "mkmodel seed 5"
TOKEN=hf_fetch_token_42
start_hubmock --repo org/m="$T/m1" --token "$TOKEN" --log "$T/req.log" --seed 3
export HF_ENDPOINT=$HUB HF_TOKEN=$TOKEN HF_HOME=$T/hfhome
unset HUGGING_FACE_HUB_TOKEN HF_TOKEN_PATH HF_HUB_DISABLE_IMPLICIT_TOKEN
F() { "$BIN/shoal-fetch" "$@"; }
faults() { curl -sS -f -X POST "$HUB/_mock/faults?$1" -o /dev/null || fail "POST /_mock/faults?$1"; }
jget() { $PY -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
expect_fail() {   # expect_fail REGEX what -- shoal-fetch args...
    local re=$1 what=$2; shift 3
    if F "$@" >"$T/out" 2>"$T/err"; then fail "$what: shoal-fetch succeeded"; fi
    echo "$what -> $(tail -n 1 "$T/err")"
    grep -qE "$re" "$T/err" || fail "$what: message '$(cat "$T/err")' lacks /$re/"
}

# ---- 1. everything through a hostile network --------------------------------------------
# About 30% of requests fail without delivering a byte here (429, ignored
# range, early stall), so the default of 8 failures in a row is raised to
# keep a chance run of bad luck from failing the test.
faults "rate_429=0.2&retry_after=1&rate_reset=0.1&rate_truncate=0.05&rate_ignore_range=0.05&rate_stall=0.03&stall_secs=3&stall_at=mid&cdn_ttl=2&seed=3"
: >"$T/req.log"
F --home "$T/h1" hf://org/m --spine --experts all --coalesce 64K --stall-timeout 1 --max-attempts 20 \
    --backoff-ms 50 --seed 1 --verify-against "$T/m1" --json >"$T/run1.json" 2>"$T/run1.err" \
    || fail "fetch through faults: $(tail -n 3 "$T/run1.err")"
cat "$T/run1.json"
C1=$(jget "$T/run1.json" commit)
[ "$(jget "$T/run1.json" objects_fetched)" -gt 600 ] || fail "fetched too few objects"
[ "$(jget "$T/run1.json" retries)" -gt 10 ] || fail "the faults caused no retries?"
[ "$(jget "$T/run1.json" refused)" -gt 0 ] || fail "no answer was refused (ignore_range)"
$PY - "$T/req.log" "$C1" <<'PYEOF' || fail "request log check (faulty run)"
import json, sys, collections
L = [json.loads(l) for l in open(sys.argv[1])]
commit = sys.argv[2]
cdn = [l for l in L if l["port"] == "cdn"]
hub = [l for l in L if l["port"] == "hub"]
assert cdn and not any(l["auth"] for l in cdn), "Authorization reached the CDN"
assert all(l["auth"] for l in hub), "a hub request went without the token"
seen = set()
for l in cdn:
    for f in (l["fault"] or "").split("+"):
        seen.add(f)
for f in ("429", "reset", "truncate", "ignore_range", "stall_mid"):
    assert f in seen, "fault %s never happened: %s" % (f, seen)
expired = sum(1 for l in cdn if l["status"] == 403)
assert expired > 0, "no CDN URL expired (cdn_ttl=2)"
heads = collections.Counter(l["path"] for l in hub if l["method"] == "HEAD" and l["status"] in (200, 302))
pinned = {p: n for p, n in heads.items() if "/resolve/%s/" % commit in p}
extra = sum(n - 1 for n in pinned.values())
print("CDN 403s:", expired, "re-resolves:", extra, "files:", len(pinned))
assert extra <= expired, "more re-resolves (%d) than expirations (%d)" % (extra, expired)
assert extra > 0, "an expired location was never re-resolved"
# every GET of a resolved file names the commit, never the branch
assert not any(l["method"] == "GET" and "/resolve/main/" in l["path"] for l in hub)
PYEOF

# ---- 2. no faults: each file resolved exactly once; a restart resolves nothing ----------------
faults "clear=1&cdn_ttl=3600&seed=3"
: >"$T/req.log"
F --home "$T/h2" hf://org/m --spine --experts all --json >"$T/run2.json" || fail "clean fetch"
$PY - "$T/req.log" <<'PYEOF' || fail "each file resolved once"
import json, sys, collections
L = [json.loads(l) for l in open(sys.argv[1])]
heads = collections.Counter(l["path"] for l in L if l["port"] == "hub" and l["method"] == "HEAD")
assert heads and max(heads.values()) == 1, heads
PYEOF
: >"$T/req.log"
F --home "$T/h2" hf://org/m --spine --experts all --json >"$T/run3.json" || fail "rerun"
[ "$(jget "$T/run3.json" objects_cached)" = "$(jget "$T/run3.json" objects)" ] || fail "rerun fetched again"
[ "$(jget "$T/run3.json" manifest_from_cache)" = True ] || fail "manifest not reused from the cache"
n=$(grep -c '"method":"HEAD"' "$T/req.log")
[ "$n" -eq 1 ] || fail "a restart made $n HEADs (want 1: the revision's pin)"
[ "$(grep -c '"port":"cdn"' "$T/req.log")" -eq 0 ] || fail "a restart touched the CDN"

# ---- 3. typed errors ----------------------------------------------------------------------------
HF_TOKEN= expect_fail 'gated \(HTTP 401\).*HF_TOKEN.*licence' "gated, no token" -- --home "$T/he" hf://org/m --manifest
HF_TOKEN=wrong expect_fail 'gated \(HTTP 403\)' "gated, wrong token" -- --home "$T/he" hf://org/m --manifest
F --home "$T/he" hf://org/m --manifest >/dev/null || fail "right token"
expect_fail 'repository org/nope not found' "missing repo" -- --home "$T/he" hf://org/nope --manifest
expect_fail "revision 'v9' not found in org/m" "missing revision" -- --home "$T/he" hf://org/m@v9 --manifest
cp -r "$T/m1" "$T/m3" && rm "$T/m3/model-00002-of-000003.safetensors"
curl -sS -f -X POST "$HUB/_mock/repo?repo=org/broken&main=$T/m3" -o /dev/null || fail "add org/broken"
expect_fail "file 'model-00002-of-000003.safetensors' not found in org/broken" "missing file" -- --home "$T/he" hf://org/broken --manifest
expect_fail 'org/name' "bad spec" -- --home "$T/he" hf://justname --manifest

# ---- 3b. disk full (over the cache budget) and too many failures ---------------------------------
expect_fail 'disk full or over the cache budget' "budget full" -- --home "$T/hf1" --max-size 2M hf://org/m --spine
F --home "$T/hf2" hf://org/m --manifest >/dev/null || fail "manifest before the 503s"
faults "clear=1&rate_503=1&status_on=cdn"
expect_fail 'HTTP 503; giving up after 3 attempts without progress \(too many failures\)' "too many failures" \
    -- --home "$T/hf2" hf://org/m --experts 1:1 --max-attempts 3 --backoff-ms 10
faults "clear=1"

# ---- 4. pinning: main moves to another model while a fetch runs -----------------------------------
faults "clear=1&bw=1MiB"
: >"$T/req.log"
F --home "$T/h4" hf://org/m --spine --experts all --coalesce 256K --json >"$T/run4.json" 2>"$T/run4.err" &
fpid=$!
wait_line "$T/req.log" '"port":"cdn"' 20 || fail "the pinned fetch never reached the CDN"
curl -sS -f -X POST "$HUB/_mock/repo?repo=org/m&main=$T/m2" -o /dev/null || fail "move main"
wait $fpid || fail "fetch during the move: $(cat "$T/run4.err")"
faults "clear=1"
[ "$(jget "$T/run4.json" commit)" = "$C1" ] || fail "the fetch left its pinned commit"
F --home "$T/h4" hf://org/m@"$C1" --spine --experts all --verify-against "$T/m1" >/dev/null \
    || fail "bytes of the pinned run are not all the old model's"
F --home "$T/h4" hf://org/m --spine --experts all --verify-against "$T/m2" --json >"$T/run5.json" \
    || fail "after the move main serves the new model"
[ "$(jget "$T/run5.json" commit)" != "$C1" ] || fail "main did not move"
curl -sS -f -X POST "$HUB/_mock/repo?repo=org/m&main=$T/m1" -o /dev/null

# ---- 5. Ctrl-C pauses; a rerun resumes ---------------------------------------------------------
faults "clear=1&bw=2MiB"
"$BIN/shoal-fetch" --home "$T/h5" hf://org/m --spine --experts all --parallel 2 >"$T/run6.out" 2>&1 &
fpid=$!
sleep 1.5
kill -INT $fpid
wait $fpid
rc=$?
[ $rc -eq 130 ] || fail "Ctrl-C: exit $rc, want 130 ($(cat "$T/run6.out"))"
faults "clear=1"
F --home "$T/h5" hf://org/m --spine --experts all --verify-against "$T/m1" --json >"$T/run7.json" \
    || fail "resume after Ctrl-C"
total=$(jget "$T/run7.json" bytes) got=$(jget "$T/run7.json" bytes_fetched)
echo "resume fetched $got of $total bytes"
[ "$got" -lt "$total" ] || fail "the rerun fetched everything again"

# ---- 6. a snapshot directory upstream ----------------------------------------------------------
F --home "$T/h6" "$T/m1" --manifest --spine --experts all --verify-against "$T/m1" >"$T/loc.out" \
    || fail "local directory: $(cat "$T/loc.out")"
grep -q "experts   448 x 13056 bytes" "$T/loc.out" || fail "local manifest: $(cat "$T/loc.out")"
F --home "$T/h6" "file://$T/m1" --experts layers:1-2 --verify-against "$T/m1" >/dev/null || fail "file:// form"
F --home "$T/h6" "$T/m1" --experts 1:3,7:63 --verify-against "$T/m1" >/dev/null || fail "L:E pairs"
expect_fail 'no expert 99 of layer 1' "unknown expert" -- --home "$T/h6" "$T/m1" --experts 1:99

# ---- 7. layouts the manifest refuses -----------------------------------------------------------
hostile() {   # hostile NAME PYTHON-EDIT REGEX
    local d=$T/bad-$1
    cp -r "$T/m1" "$d"
    $PY - "$d" "$2" <<'PYEOF' || fail "preparing $1"
import json, os, struct, sys
d, how = sys.argv[1], sys.argv[2]
idx_p = os.path.join(d, "model.safetensors.index.json")
idx = json.load(open(idx_p))
def shard_edit(path, fn):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    fn(h)
    j = json.dumps(h, separators=(",", ":")).encode()
    j += b" " * (-len(j) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + raw[8 + n:])
sh = os.path.join(d, "model-00001-of-000003.safetensors")
pre = "language_model.model.layers.1.block_sparse_moe.experts.3."
if how == "dotdot":
    idx["weight_map"][pre + "w1.weight_packed"] = "../model-00001-of-000003.safetensors"
elif how == "absolute":
    idx["weight_map"][pre + "w1.weight_packed"] = "/etc/passwd"
elif how == "order":
    def f(h):
        a, b = h[pre + "w1.weight_scale"], h[pre + "w3.weight_scale"]
        a["data_offsets"], b["data_offsets"] = b["data_offsets"], a["data_offsets"]
    shard_edit(sh, f)
elif how == "span":
    c = json.load(open(os.path.join(d, "config.json")))
    c["text_config"]["moe_intermediate_size"] = 32
    json.dump(c, open(os.path.join(d, "config.json"), "w"))
elif how == "missing":
    idx["weight_map"]["language_model.not.there"] = "model-00001-of-000003.safetensors"
elif how == "hugeheader":
    with open(sh, "r+b") as fh:
        fh.write(struct.pack("<Q", 200_000_000))
elif how == "dtype":
    def f(h):
        h[pre + "w2.weight_scale"]["dtype"] = "U7"
    shard_edit(sh, f)
json.dump(idx, open(idx_p, "w"))
PYEOF
    expect_fail "$3" "hostile: $1" -- --home "$T/hb" "$d" --manifest
}
hostile dotdot 'dotdot' "'\.\.' component"
hostile absolute 'absolute' 'absolute path'
hostile order 'order' "experts\.3\.w1\.weight_scale' does not follow .*back to back"
hostile span 'span' 'config implies'
hostile missing 'missing' "language_model\.not\.there' is in model\.safetensors\.index\.json's weight_map but not in"
hostile hugeheader 'hugeheader' 'ETOOBIG|100000000|too (big|large)|header'
hostile dtype 'dtype' 'U7|dtype'

# ---- 8. the slice's manifest (real K3 expert size) over the Hub --------------------------------
"$BIN/mkmodel" --quiet --preset slice --experts 2 --out "$T/slice" || fail "mkmodel slice"
curl -sS -f -X POST "$HUB/_mock/repo?repo=org/slice&main=$T/slice" -o /dev/null || fail "add org/slice"
F --home "$T/h8" hf://org/slice --manifest >"$T/slice.out" || fail "slice manifest: $(cat "$T/slice.out")"
cat "$T/slice.out"
grep -q "experts   6 x 17547264 bytes" "$T/slice.out" || fail "slice experts"
F --home "$T/h8" hf://org/slice --experts 1:0 --verify-against "$T/slice" >/dev/null || fail "one slice expert"

kill -TERM "$PID_hubmock"
wait "$PID_hubmock"
rc=$?
check [ $rc -eq 0 ] "hubmock exits 0 (got $rc)"
echo "test_fetch: ok"
