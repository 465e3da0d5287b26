#!/usr/bin/env bash
# Local snapshots and the Hugging Face cache (docs/fetcher.md, "Local
# snapshots", "The Hugging Face cache"):
#   a poisoned snapshot (a blob named with the real sha256 holding other
#   bytes) opened as a directory is keyed as a local file, so later hf://
#   GETs of the same objects get the Hub's bytes, never the poisoned ones.
source "$(dirname "$0")/lib.sh"
[ -x "$BIN/shoald" ] && [ -x "$BIN/shoalc" ] || skip "shoald/shoalc not built"

"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
start_hubmock --repo t/tiny="$T/m" --log "$T/hub.jsonl"
export HF_ENDPOINT=$HUB
H=$T/home
bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log"
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
summary() { grep '^hits ' "$1"; }
field() { summary "$1" | awk -v k="$2" '{for (i = 1; i < NF; i++) if ($i == k) print $(i + 1)}'; }

# ---- a poisoned snapshot does not poison the Hub model ---------------------------------
COMMIT=0123456789abcdef0123456789abcdef01234567
/usr/bin/python3 "$ROOT/tests/integration/hfcache_layout.py" "$T/m" "$T/poison" t/tiny $COMMIT \
    --poison model-00001-of-000003.safetensors > "$T/poison.etags" || fail "layout"
SNAP=$T/poison/models--t--tiny/snapshots/$COMMIT
# Keys in the poisoned shard (the first layers' experts and the embedding).
KEYS="1:0 1:5 t:model.embed_tokens.weight f:config.json"
"$BIN/shoalc" --home "$H" get "$SNAP" $KEYS > "$T/local.out" || { cat "$T/local.out"; fail "GET of the snapshot"; }
"$BIN/shoalc" --home "$H" get hf://t/tiny $KEYS --check "$T/m" > "$T/hub.out" || { cat "$T/hub.out"; fail "hf:// GET"; }
[ "$(field "$T/hub.out" mismatched)" = 0 ] && [ "$(field "$T/hub.out" checked)" = 4 ] \
    || fail "hf:// GET after a poisoned snapshot: $(summary "$T/hub.out")"
grep -q 'does not hash to its name' "$T/shoald.log" || fail "shoald did not say the blob is not what its name says"
# config.json's blob was honest: one object, shared (a hit), not fetched again.
grep -q 'f:config.json hit' "$T/hub.out" || { cat "$T/hub.out"; fail "an honest blob's object should be shared"; }
echo "ok   poisoned snapshot: keyed as local, hf:// gets the Hub's bytes; honest blobs shared"

# ---- the Hugging Face cache as a peer: read in place, no byte fetched, nothing copied ----
kill -TERM "$PID_shoald"; wait "$PID_shoald" || fail "shoald exit"
COMMIT=$(curl -s "$HUB/_mock/repo?repo=t/tiny" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["refs"]["main"])')
HFC=$T/hfhome/hub
/usr/bin/python3 "$ROOT/tests/integration/hfcache_layout.py" "$T/m" "$HFC" t/tiny "$COMMIT" > /dev/null || fail "layout"
# the blobs' inodes before: read in place means the same files, never copied or changed
ls -li "$HFC/models--t--tiny/blobs" > "$T/blobs.before"
H2=$T/home2
: > "$T/hub.jsonl"
HF_HOME=$T/hfhome bg shoald "$BIN/shoald" --home "$H2" --no-fsync --log "$T/shoald2.log"
wait_line "$T/shoald2.log" 'ready on' 20 || fail "shoald (HF cache) did not start"
KEYS="1:0 1:5 7:3 t:model.embed_tokens.weight t:lm_head.weight f:config.json f:tiktoken.model"
"$BIN/shoalc" --home "$H2" get hf://t/tiny $KEYS --check "$T/m" > "$T/peer.out" \
    || { cat "$T/peer.out"; fail "GET with the HF cache as a peer"; }
grep -q 'hits 7 .*mismatched 0' "$T/peer.out" || fail "HF cache peer: $(grep '^hits' "$T/peer.out")"
grep -q 'files are read in place from the Hugging Face cache' "$T/shoald2.log" \
    || fail "shoald does not say it reads the HF cache in place"
P=7,100,300,5,9,42,11,12,13,700,1
"$BIN/shoal-engine" run "$T/m" --tokens $P --max-tokens 4 > "$T/o_local" || fail "local run"
"$BIN/shoal-engine" run hf://t/tiny --home "$H2" --tokens $P --max-tokens 4 > "$T/o_peer" 2> "$T/e_peer" \
    || { cat "$T/e_peer"; fail "engine through the HF cache peer"; }
cmp -s "$T/o_local" "$T/o_peer" || fail "engine output through the HF cache differs from the local run"
"$BIN/shoal" --home "$H2" warm hf://t/tiny --wait > "$T/warm.out" 2>&1 || { cat "$T/warm.out"; fail "warm (peer)"; }
# No byte fetched: only HEADs reached the Hub (the pin and the resolves), no GET of any file.
/usr/bin/python3 - "$T/hub.jsonl" <<'PY' || fail "the HF cache peer fetched bytes from the Hub"
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
gets = [r for r in reqs if r["method"] != "HEAD" or r["bytes"]]
assert not gets, gets[:3]
print("hub requests:", len(reqs), "all HEAD")
PY
# Nothing copied: the only objects shoald stored are its own (the manifest, the engine's int8 pack).
"$BIN/shoal" --home "$H2" ls --json > "$T/ls.json" || fail "ls"
/usr/bin/python3 - "$T/ls.json" <<'PY' || fail "the HF cache's bytes were copied into shoald's cache"
import json, sys
ms = json.load(open(sys.argv[1]))["models"]
k = ms[0]["bytes_by_kind"]
assert k["expert"] == 0 and k["spine"] == 0 and k["small"] == 0, k
PY
ls -li "$HFC/models--t--tiny/blobs" > "$T/blobs.after"
cmp -s "$T/blobs.before" "$T/blobs.after" || fail "the HF cache's blobs changed"
kill -TERM "$PID_shoald"; wait "$PID_shoald"
echo "ok   HF cache peer: GET, engine, warm served in place; only HEADs to the Hub; nothing copied"

# ---- offline, a model shoald never opened: refs/main and the snapshot's links ----------
H3=$T/home3
: > "$T/hub.jsonl"
HF_HOME=$T/hfhome HF_HUB_OFFLINE=1 bg shoald "$BIN/shoald" --home "$H3" --no-fsync --log "$T/shoald3.log"
wait_line "$T/shoald3.log" 'ready on' 20 || fail "shoald (offline, HF cache) did not start"
"$BIN/shoalc" --home "$H3" get hf://t/tiny $KEYS --check "$T/m" > "$T/off.out" \
    || { cat "$T/off.out"; tail "$T/shoald3.log"; fail "offline GET from the HF cache"; }
grep -q 'hits 7 .*mismatched 0' "$T/off.out" || fail "offline HF cache: $(grep '^hits' "$T/off.out")"
grep -q "from the Hugging Face cache's refs" "$T/shoald3.log" || fail "the log does not say main came from refs/"
[ ! -s "$T/hub.jsonl" ] || fail "HF_HUB_OFFLINE=1: $(wc -l < "$T/hub.jsonl") requests reached the Hub"
kill -TERM "$PID_shoald"; wait "$PID_shoald"
echo "ok   HF_HUB_OFFLINE=1, never opened by shoald: resolved from the HF cache's refs and links, 0 requests"

# ---- a blob that does not hash to its name is not used --------------------------------
H4=$T/home4
/usr/bin/python3 "$ROOT/tests/integration/hfcache_layout.py" "$T/m" "$T/bad/hub" t/tiny "$COMMIT" \
    --poison model-00001-of-000003.safetensors > /dev/null || fail "layout (poisoned)"
HF_HUB_CACHE=$T/bad/hub bg shoald "$BIN/shoald" --home "$H4" --no-fsync --log "$T/shoald4.log"
wait_line "$T/shoald4.log" 'ready on' 20 || fail "shoald (poisoned HF cache) did not start"
"$BIN/shoalc" --home "$H4" get hf://t/tiny 1:0 1:5 t:model.embed_tokens.weight --check "$T/m" > "$T/bad.out" \
    || { cat "$T/bad.out"; fail "GET beside a poisoned HF cache"; }
grep -q 'mismatched 0' "$T/bad.out" && grep -q 'checked 3' "$T/bad.out" || fail "poisoned HF cache: $(grep '^hits' "$T/bad.out")"
grep -q 'does not hash to its name; not used' "$T/shoald4.log" || fail "shoald does not say the blob is not used"
kill -TERM "$PID_shoald"; wait "$PID_shoald"
echo "ok   a poisoned HF cache blob is not used: fetched from the Hub, right bytes"

# ---- shoal export: --local-dir and --hf-cache, and the export used as a peer ----------
H5=$T/home5
bg shoald "$BIN/shoald" --home "$H5" --no-fsync --log "$T/shoald5.log"
wait_line "$T/shoald5.log" 'ready on' 20 || fail "shoald (export) did not start"
"$BIN/shoalc" --home "$H5" get hf://t/tiny 1:0 > /dev/null || fail "open for export"
rc=0; "$BIN/shoal" --home "$H5" export hf://t/tiny --local-dir "$T/none" > "$T/ex0" 2>&1 || rc=$?
[ $rc = 4 ] && grep -q 'partial  model-00001' "$T/ex0" || { cat "$T/ex0"; fail "export of an incomplete model: exit $rc"; }
"$BIN/shoal" --home "$H5" warm hf://t/tiny --wait > /dev/null 2>&1 || fail "warm for export"
"$BIN/shoal" --home "$H5" export hf://t/tiny --local-dir "$T/out" > "$T/ex1" 2>&1 || { cat "$T/ex1"; fail "export --local-dir"; }
diff -r "$T/m" "$T/out" > "$T/ex1.diff" || { cat "$T/ex1.diff"; fail "export --local-dir differs from the model"; }
"$BIN/shoal" --home "$H5" export hf://t/tiny --hf-cache --cache-dir "$T/exp" > "$T/ex2" 2>&1 || { cat "$T/ex2"; fail "export --hf-cache"; }
/usr/bin/python3 - "$T/exp/models--t--tiny" "$T/m" "$COMMIT" <<'PY' || fail "export --hf-cache layout"
import os, sys, hashlib
top, src, commit = sys.argv[1:]
assert open(os.path.join(top, "refs", "main")).read() == commit
snap = os.path.join(top, "snapshots", commit)
for name in os.listdir(src):
    p = os.path.join(snap, name)
    assert os.path.islink(p) and not os.path.isabs(os.readlink(p)), p
    blob = os.path.realpath(p)
    assert os.path.dirname(blob) == os.path.realpath(os.path.join(top, "blobs")), blob
    assert open(blob, "rb").read() == open(os.path.join(src, name), "rb").read(), name
PY
kill -TERM "$PID_shoald"; wait "$PID_shoald"
# the exported cache, read in place by a fresh shoald: no byte fetched
: > "$T/hub.jsonl"
HF_HUB_CACHE=$T/exp bg shoald "$BIN/shoald" --home "$T/home6" --no-fsync --log "$T/shoald6.log"
wait_line "$T/shoald6.log" 'ready on' 20 || fail "shoald (exported cache) did not start"
"$BIN/shoalc" --home "$T/home6" get hf://t/tiny $KEYS --check "$T/m" > "$T/ex3" || { cat "$T/ex3"; fail "GET from the exported cache"; }
grep -q 'hits 7 .*mismatched 0' "$T/ex3" || fail "exported cache as a peer: $(grep '^hits' "$T/ex3")"
/usr/bin/python3 -c '
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert all(x["method"] == "HEAD" for x in r), r[:3]' "$T/hub.jsonl" || fail "the exported cache was not used in place"
kill -TERM "$PID_shoald"; wait "$PID_shoald"
echo "ok   export: incomplete model exit 4; --local-dir equals the model; --hf-cache a real HF cache, read in place"
