#!/usr/bin/env bash
# test_mkmodel.sh — bin/mkmodel writes the model directories k3.md §6 and
# docs/mkmodel.md describe; an independent Python parser
# (mkmodel_check.py) checks them and compares bin/stinfo's view of every
# shard with its own.  The full k3 preset is checked as headers over sparse
# files; --stdout and --print-etags against the directory.
source "$(dirname "$0")/lib.sh"
PY=/usr/bin/python3
CHECK="$ROOT/tests/integration/mkmodel_check.py"
[ -x "$BIN/mkmodel" ] && [ -x "$BIN/stinfo" ] || fail "bin/mkmodel and bin/stinfo must be built"
$PY -c 'import numpy' 2>/dev/null || skip "/usr/bin/python3 has no numpy"

mk() { "$BIN/mkmodel" --quiet "$@"; }

# --- tiny, two seeds, determinism -------------------------------------------
check mk --preset tiny --out "$T/a" "tiny seed 0"
check mk --preset tiny --out "$T/b" "tiny seed 0 again"
check mk --preset tiny --seed 7 --out "$T/c" "tiny seed 7"
check $PY "$CHECK" "$T/a" --stinfo "$BIN/stinfo" "checker on tiny seed 0"
check $PY "$CHECK" "$T/c" --stinfo "$BIN/stinfo" "checker on tiny seed 7"
[ "$(ls "$T/a" | wc -l)" -eq 7 ] || fail "tiny writes 7 files: $(ls "$T/a")"
for f in "$T"/a/*; do
    cmp -s "$f" "$T/b/$(basename "$f")" || fail "same seed, different bytes: $(basename "$f")"
done
for i in 1 2 3; do
    s=model-0000$i-of-000003.safetensors
    cmp -s "$T/a/$s" "$T/c/$s" && fail "seed 7 wrote the same $s as seed 0"
done
cmp -s "$T/a/tiktoken.model" "$T/c/tiktoken.model" || fail "the tokenizer must not depend on the seed"
[ "$(wc -l < "$T/a/tiktoken.model")" -eq 768 ] || fail "tiny tiktoken.model has 768 ranks"

# k3.md §6 figures, read back through the C reader.
"$BIN/stinfo" "$T/a/model-00002-of-000003.safetensors" > "$T/s2.txt" || fail "stinfo shard 2"
grep -q '^language_model.model.layers.4.block_sparse_moe.experts.10.w1.weight_packed U8 \[64,64\] ' "$T/s2.txt" \
    || fail "expert record shape"
grep -q '^language_model.model.layers.5.self_attn.A_log F32 \[32\] ' "$T/s2.txt" || fail "tiny A_log is [32]"
grep -q '^language_model.model.layers.6.self_attn.q_b_proj.weight BF16 \[96,64\] ' "$T/s2.txt" \
    || fail "layer 6 (0-based) is MLA with q_b [96,64]"
# Expert 10 comes right after expert 1 (lexicographic order), 13,056 bytes each.
b1=$(awk '$1 ~ /layers\.4\.block_sparse_moe\.experts\.1\.w1\.weight_packed$/ {print $4}' "$T/s2.txt")
b10=$(awk '$1 ~ /layers\.4\.block_sparse_moe\.experts\.10\.w1\.weight_packed$/ {print $4}' "$T/s2.txt")
[ $((b10 - b1)) -eq 13056 ] || fail "expert 10 follows expert 1 by 13,056 bytes (got $((b10 - b1)))"
grep -q '"full_attn_layers": \[' "$T/a/config.json" || fail "config lists full_attn_layers"
$PY - "$T/a/config.json" <<'PY' || fail "tiny config values"
import json, sys
t = json.load(open(sys.argv[1]))["text_config"]
la = t["linear_attn_config"]
assert la["kda_layers"] == [1, 2, 3, 5, 6] and la["full_attn_layers"] == [4, 7, 8]
assert (t["hidden_size"], t["num_experts"], t["num_experts_per_token"], t["vocab_size"]) == (256, 64, 4, 1024)
assert (t["bos_token_id"], t["eos_token_id"], t["pad_token_id"]) == (768, 770, 1023)
PY

# --- the directory rules --------------------------------------------------------
mk --out "$T/a" 2>"$T/err.txt" && fail "a non-empty directory was overwritten without --force"
grep -q "not empty" "$T/err.txt" || fail "refusal says why: $(cat "$T/err.txt")"
check mk --layers 12 --experts 3 --out "$T/d" "tiny 12 layers"
[ -e "$T/d/model-00004-of-000004.safetensors" ] || fail "12 layers make 3+1 shards"
check $PY "$CHECK" "$T/d" --stinfo "$BIN/stinfo" "checker on tiny 12 layers x 3 experts"
check mk --force --out "$T/d" "--force over an earlier model"
[ ! -e "$T/d/model-00004-of-000004.safetensors" ] || fail "--force left a stale shard"
check $PY "$CHECK" "$T/d" "checker after --force"
for bad in "--layers 0" "--experts 0" "--experts 99999" "--layers x" "--preset huge" "--seed -1" "--bogus" \
           "--print-etags" "--stdout config.json" "--jobs 0"; do
    # shellcheck disable=SC2086
    mk --out "$T/bad" $bad 2>/dev/null
    [ $? -eq 2 ] || fail "mkmodel $bad must exit 2"
done
mk 2>/dev/null; [ $? -eq 2 ] || fail "--out is required"
"$BIN/mkmodel" --help | grep -q -- "--preset" || fail "--help"

# --- slice: real K3 expert sizes, kept cheap ----------------------------------
check mk --preset slice --experts 2 --out "$T/s" "slice, 2 experts"
check $PY "$CHECK" "$T/s" --stinfo "$BIN/stinfo" "checker on slice"
"$BIN/stinfo" "$T/s/model-00002-of-000005.safetensors" > "$T/ss.txt" || fail "stinfo slice"
b0=$(awk '$1 ~ /experts\.0\.w1\.weight_packed$/ {print $4}' "$T/ss.txt")
e0=$(awk '$1 ~ /experts\.0\.w3\.weight_scale$/ {print $5}' "$T/ss.txt")
[ $((e0 - b0)) -eq 17547264 ] || fail "a slice expert spans 17,547,264 bytes (got $((e0 - b0)))"

# --- one file on stdout, and the digest table ---------------------------------
mk --stdout model-00002-of-000003.safetensors | cmp -s - "$T/a/model-00002-of-000003.safetensors" \
    || fail "--stdout writes the same bytes as the directory"
mk --stdout nope.json 2>"$T/err.txt" && fail "--stdout of a file the model lacks"
grep -q "no file 'nope.json'" "$T/err.txt" || fail "--stdout message: $(cat "$T/err.txt")"
mk --print-etags > "$T/etags.inc" || fail "--print-etags"
for f in "$T"/a/*; do
    grep -q "^SYNTH_KNOWN_ROW(\"$(basename "$f")\", $(stat -c %s "$f")ULL, \"$(sha256sum <"$f" | cut -d' ' -f1)\"" "$T/etags.inc" \
        || fail "--print-etags row of $(basename "$f")"
done

# --- k3: the full layout as headers over sparse files -------------------------
check mk --preset k3 --headers-only --out "$T/k3" "k3 --headers-only"
[ "$(ls "$T/k3" | wc -l)" -eq 100 ] || fail "k3 has 96 shards and 4 other files"
"$BIN/stinfo" "$T/k3/model-00002-of-000096.safetensors" > "$T/k3s.txt" || fail "stinfo on a k3 headers-only shard"
[ "$(grep -vc '^#' "$T/k3s.txt")" -eq $((896 * 6 + 28)) ] || fail "k3 shard 2 lists 896 experts and 28 tensors"
grep -q '^language_model.model.layers.1.block_sparse_moe.experts.895.w2.weight_packed U8 \[3584,1536\] ' "$T/k3s.txt" \
    || fail "k3 expert 895 w2 [3584,1536]"
grep -q '^language_model.model.layers.1.self_attn.q_proj.weight BF16 \[12288,7168\] ' "$T/k3s.txt" \
    || fail "k3 layer 1 KDA q_proj [12288,7168]"
"$BIN/stinfo" "$T/k3/model-00096-of-000096.safetensors" | grep -q '^mm_projector.linear_2.weight BF16 \[7168,4608\] ' \
    || fail "k3 shard 96 holds the projector"
total=$(stat -c %s "$T"/k3/* | awk '{s+=$1} END {printf "%.0f", s}')
[ "$total" -gt 1560000000000 ] && [ "$total" -lt 1561000000000 ] || fail "k3 files total $total bytes, not ~1.56 TB"
used=$(du -sk "$T/k3" | cut -f1)
[ "$used" -lt 300000 ] || fail "k3 headers-only uses ${used} KiB on disk: the shards are not sparse"
$PY - "$T/k3/config.json" <<'PY' || fail "k3 config values"
import json, sys
t = json.load(open(sys.argv[1]))["text_config"]
la = t["linear_attn_config"]
assert la["full_attn_layers"] == list(range(4, 93, 4)) + [93] and len(la["kda_layers"]) == 69
assert (t["hidden_size"], t["num_hidden_layers"], t["vocab_size"], t["num_experts"]) == (7168, 93, 163840, 896)
assert (t["num_attention_heads"], la["num_heads"], t["intermediate_size"]) == (96, 96, 33792)
assert (t["bos_token_id"], t["eos_token_id"], t["pad_token_id"]) == (163584, 163586, 163839)
PY
if [ -x "$BIN/shoal-engine" ]; then   # the engine loads the padded tokenizer with K3's ids
    ids=$(printf 'Hello, world!\n' | "$BIN/shoal-engine" tokenize "$T/k3") || fail "shoal-engine tokenize on k3"
    [ "$ids" = "$(printf 'Hello, world!\n' | "$BIN/shoal-engine" tokenize "$T/a")" ] || fail "k3 and tiny tokenize alike ($ids)"
    [ "$(echo 163584 163586 | "$BIN/shoal-engine" tokenize "$T/k3" --decode)" = "[BOS]<|end_of_msg|>" ] \
        || fail "k3 specials at K3's ids"
fi
check mk --preset k3 --layers 5 --headers-only --out "$T/k3l5" "k3 --layers 5 --headers-only"
check $PY "$CHECK" "$T/k3l5" --layout-only --stinfo "$BIN/stinfo" "checker on k3, 5 layers x 896 experts"

# --- the C reader refuses what is not a whole shard ---------------------------
cp "$T/a/model-00003-of-000003.safetensors" "$T/cut.safetensors"
truncate -s -1 "$T/cut.safetensors"
"$BIN/stinfo" "$T/cut.safetensors" >/dev/null 2>"$T/err.txt" && fail "stinfo accepted a truncated shard"
grep -q "past the end" "$T/err.txt" || fail "truncation message: $(cat "$T/err.txt")"

# --- an interrupted run leaves no valid-looking partial shard -----------------
"$BIN/mkmodel" --quiet --preset slice --experts 8 --out "$T/k" &
pid=$!
for _ in $(seq 100); do
    ls "$T"/k/.model-00002-*.partial >/dev/null 2>&1 && break
    sleep 0.05
done
kill -KILL $pid 2>/dev/null
wait $pid 2>/dev/null
[ ! -e "$T/k/model.safetensors.index.json" ] || fail "an interrupted run wrote index.json"
for f in "$T"/k/model-*.safetensors; do
    [ -e "$f" ] || continue
    "$BIN/stinfo" "$f" >/dev/null || fail "interrupted run left an invalid $(basename "$f")"
done
[ ! -e "$T/k/model-00002-of-000005.safetensors" ] || fail "shard 2 complete before the kill?"
echo "mkmodel: all checks passed"
