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
