#!/usr/bin/env bash
# test_oracle.sh — the oracle preset (docs/mkmodel.md "The oracle"):
#   the engine prints exactly the promised sentence, locally (int8, int4 and
#   f32 spines, fast and exact experts, chunk 1 and 16, two seeds) and through
#   shoald from hubmock (--synth ...=oracle; cold, warm, from the cached
#   spine pack); the same ids as the float64 reference, which also shows
#   that engine bugs no file can hold break it; and each broken copy of the
#   files (oracle_break.py: routers, nibbles, scales, records, expert
#   spans, biases, AttnRes, lm_head, shared experts) does NOT give the
#   sentence, locally on every spine and one of them through shoald.
#   Last, `make demo`'s script: the commands a user types, the sentence,
#   the closing line, no shoalc internals.
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
PY=/usr/bin/python3
BREAK="$ROOT/tests/integration/oracle_break.py"
for b in shoal-engine shoald shoal hubmock mkmodel stinfo; do
    [ -x "$BIN/$b" ] || fail "$BIN/$b not built"
done
$PY -c 'import numpy' 2>/dev/null || skip "numpy not installed for $PY"

# The promise, written here independently of synth/: changing the sentence
# means changing this test too.
PROMPT="The oracle says:"
TEXT=" Each token was routed to its expert, and this came out right."
EOS=770

check "$BIN/mkmodel" --quiet --preset oracle --out "$T/m" "mkmodel --preset oracle"
check "$BIN/mkmodel" --quiet --preset oracle --seed 3 --out "$T/m3" "mkmodel --preset oracle --seed 3"
"$BIN/mkmodel" --quiet --preset oracle --layers 4 --out "$T/bad" 2> "$T/bad.err" \
    && fail "--preset oracle --layers 4 was accepted"
grep -q "oracle preset has 8 layers" "$T/bad.err" || fail "refusal: $(cat "$T/bad.err")"
check $PY "$ROOT/tests/integration/mkmodel_check.py" "$T/m" --layout-only --stinfo "$BIN/stinfo" \
    "mkmodel_check on the oracle's layout"
cfg() { $PY -c 'import json, sys; print(eval(sys.argv[2], {"c": json.load(open(sys.argv[1]))}))' \
          "$T/m/config.json" "$1"; }
[ "$(cfg 'c["oracle"]["prompt"]')" = "$PROMPT" ] && [ "$(cfg 'c["oracle"]["text"]')" = "$TEXT" ] \
    || fail "config.json's oracle is not the promise: $(cfg 'c["oracle"]')"
PIDS=$(cfg '" ".join(map(str, c["oracle"]["prompt_ids"]))')
IDS=$(cfg '" ".join(map(str, c["oracle"]["ids"]))')
# the engine's tokenizer agrees with the ids synth/ hard-codes
[ "$(printf '%s\n' "$PROMPT" | "$E" tokenize "$T/m")" = "$PIDS" ] || fail "the prompt tokenizes otherwise"
[ "$(printf '%s\n' "$TEXT" | "$E" tokenize "$T/m")" = "$IDS" ] || fail "the sentence tokenizes otherwise"
[ "$(printf '%s\n' "$PROMPT$TEXT" | "$E" tokenize "$T/m")" = "$PIDS $IDS" ] \
    || fail "prompt + sentence is not the prompt's ids then the sentence's"
[ "$(echo "$IDS" | wc -w)" -ge 12 ] || fail "the sentence has fewer than a dozen tokens"
echo "ok   the promise: \"$PROMPT\" ->\"$TEXT\" ($(echo "$IDS" | wc -w) tokens, ids agree with the tokenizer)"

# ---- locally: exactly the sentence -------------------------------------------------
say_text() {   # NAME MODEL ARGS...: the reply to the prompt must be the sentence
    local name=$1 model=$2; shift 2
    timeout 60 "$E" run "$model" --prompt "$PROMPT" "$@" > "$T/$name.out" 2> "$T/$name.err" \
        || { cat "$T/$name.err"; fail "$name: run $model --prompt failed"; }
    [ "$(cat "$T/$name.out")" = "$TEXT" ] \
        || fail "$name: the oracle said '$(cat "$T/$name.out")' ($*)"
}
say_text int8 "$T/m"
say_text f32 "$T/m" --spine f32
say_text int4 "$T/m" --spine int4
say_text chunk1 "$T/m" --chunk 1 --threads 1
say_text seed3 "$T/m3"
say_text seed3f32 "$T/m3" --spine f32
ids() {   # MODEL ARGS...: the generated ids for the prompt ids
    local model=$1; shift
    timeout 60 "$E" run "$model" --tokens "$(echo "$PIDS" | tr ' ' ,)" --max-tokens 24 "$@"
}
WANT="$IDS $EOS $EOS"      # eos continues as eos
for v in "" "--spine f32" "--spine int4" "--experts exact" "--spine f32 --experts fast" "--chunk 3"; do
    got=$(ids "$T/m" $v) || fail "run --tokens $v"
    [ "$got" = "$WANT" ] || fail "run --tokens $v: '$got', want '$WANT'"
done
echo "ok   locally: the sentence on the int8, int4 and f32 spines, fast and exact experts, chunks 1/3/16, seeds 0 and 3"

# ---- the float64 reference, and the bugs only it can hold ----------------------------
$PY "$ROOT/tests/integration/oracle_refcheck.py" "$T/m" --margins --engine-ids "$(ids "$T/m")" \
    > "$T/ref.out" 2> "$T/ref.err" || { cat "$T/ref.out" "$T/ref.err"; fail "oracle_refcheck"; }
sed 's/^/ok   /' "$T/ref.out"

# ---- broken copies: the sentence must NOT come out ---------------------------------
n=0
while IFS=$'\t' read -r fault what; do
    check $PY "$BREAK" "$T/m" "$T/b_$fault" "$fault" "oracle_break.py $fault"
    for spine in int8 int4 f32; do
        out=$(timeout 60 "$E" run "$T/b_$fault" --prompt "$PROMPT" --spine $spine --max-tokens 30 \
              2> "$T/b_$fault.err") || { cat "$T/b_$fault.err"; fail "$fault: the run failed"; }
        [ "$out" != "$TEXT" ] || fail "$fault ($what): the sentence still came out on the $spine spine"
    done
    printf 'ok   broken: %-20s -> "%s"\n' "$fault" "$(printf '%s' "$out" | head -c 40 | tr -c '[:print:]' '?')"
    n=$((n + 1))
done < <($PY "$BREAK" --list)
[ "$n" -ge 15 ] || fail "only $n faults"

# ---- through shoald from hubmock -------------------------------------------------------
start_hubmock --synth demo/oracle=oracle --repo demo/broken="$T/b_scale-plus" --log "$T/hub.jsonl"
export HF_ENDPOINT=$HUB
H=$T/home
bg shoald "$BIN/shoald" --home "$H" --no-fsync --log "$T/shoald.log"
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
# hubmock's synthesized shard is mkmodel's, byte for byte
S=model-00002-of-000003.safetensors
check "$BIN/hubget" --endpoint "$HUB" hf://demo/oracle $S -o "$T/hub_$S" "hubget $S"
cmp -s "$T/hub_$S" "$T/m/$S" || fail "hubmock's synthesized $S differs from mkmodel's"
say_text hf_cold hf://demo/oracle --home "$H"
got=$(ids hf://demo/oracle --home "$H" --stats 2> "$T/hf_ids.err") || fail "run hf:// --tokens"
[ "$got" = "$WANT" ] || fail "through shoald: '$got', want '$WANT'"
grep -q 'spine int8 from the cached pack' "$T/hf_ids.err" \
    || { cat "$T/hf_ids.err"; fail "the second run did not map the cached spine pack"; }
say_text hf_pack hf://demo/oracle --home "$H"
say_text hf_f32 hf://demo/oracle --home "$H" --spine f32
say_text hf_int4 hf://demo/oracle --home "$H" --spine int4
"$BIN/shoal" --home "$H" warm hf://demo/oracle --wait > "$T/warm.out" 2>&1 || { cat "$T/warm.out"; fail "warm"; }
say_text hf_warm hf://demo/oracle --home "$H"
out=$(timeout 60 "$E" run hf://demo/broken --home "$H" --prompt "$PROMPT" --max-tokens 30 2> "$T/hfb.err") \
    || { cat "$T/hfb.err"; fail "run hf://demo/broken"; }
[ "$out" != "$TEXT" ] || fail "the broken copy (scale bytes + 1) gave the sentence through shoald"
echo "ok   through shoald from hubmock: the sentence cold, from the cached spine pack, f32, int4 and warm; the scale-plus copy does not give it"

# ---- make demo's script ------------------------------------------------------------
BIN=$BIN TMPDIR=$T timeout 120 "$ROOT/scripts/demo.sh" > "$T/demo.out" 2>&1 \
    || { cat "$T/demo.out"; fail "scripts/demo.sh failed"; }
plain=$(sed 's/\x1b\[[0-9;]*m//g' "$T/demo.out")
for c in '$ shoald --detach' '$ shoal warm hf://demo/oracle --spine --wait' \
         "\$ shoal-engine run hf://demo/oracle --prompt \"$PROMPT\"" '$ shoal stats'; do
    grep -qxF -- "$c" <<< "$plain" || { echo "$plain"; fail "the demo does not show: $c"; }
done
grep -qxF -- "$TEXT" <<< "$plain" || { echo "$plain"; fail "the demo's reply is not the sentence"; }
grep -q '^The sentence came out right' <<< "$plain" || fail "the demo does not end saying the sentence came out right"
grep -qi 'shoalc\|job 1 state' <<< "$plain" && fail "the demo still shows shoalc internals"
grep -q 'stopped shoald' <<< "$plain" && grep -q 'stopped hubmock' <<< "$plain" \
    || fail "the demo did not stop what it started"
echo "ok   make demo's script: shoald --detach, shoal warm, shoal-engine run, shoal stats, the sentence, the closing line"
