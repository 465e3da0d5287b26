#!/usr/bin/env bash
# test_tokenizer_tiktoken.sh — `shoal-engine tokenize` against js-tiktoken
# (an independent tiktoken implementation from npm) with o200k_base's ranks
# loaded from a tiktoken-format file and o200k's own pattern: every string of
# a 2,400-string corpus must give exactly js-tiktoken's ids and round-trip;
# lossy decoding must agree (and the same for cl100k_base on 800 strings).
# Then the command line itself, and K3's gold
# vectors (specs/k3.md §4) when $SHOAL_K3_TOKENIZER_DIR holds a real
# tiktoken.model (skipped with a message otherwise).
source "$(dirname "$0")/lib.sh"

ENGINE=$BIN/shoal-engine
CLIENTS=$ROOT/tests/clients
[ -x "$ENGINE" ] || skip "$ENGINE not built"
command -v node >/dev/null || skip "node is not installed (make deps)"
[ -d "$ROOT/tests/node/node_modules/js-tiktoken" ] || skip "js-tiktoken is not installed (make deps)"

# ---- the corpus against js-tiktoken ----------------------------------------
node "$CLIENTS/o200k_export.js" >"$T/o200k.tiktoken" 2>"$T/export.log" || fail "o200k export: $(cat "$T/export.log")"
[ "$(wc -l <"$T/o200k.tiktoken")" -gt 199000 ] || fail "o200k export is short"
node "$CLIENTS/tok_corpus.js" --count 2400 >"$T/corpus.jsonl" || fail "corpus generator failed"
[ "$(wc -l <"$T/corpus.jsonl")" -ge 2000 ] || fail "corpus has fewer than 2000 strings"
node "$CLIENTS/tok_compare.js" --bin "$ENGINE" --vocab "$T/o200k.tiktoken" --corpus "$T/corpus.jsonl" \
    --encoding o200k_base --pattern o200k || fail "shoal and js-tiktoken disagree (see above)"

# The same code with cl100k_base and its pattern, on a smaller corpus.
node "$CLIENTS/o200k_export.js" cl100k_base >"$T/cl100k.tiktoken" 2>/dev/null || fail "cl100k export"
node "$CLIENTS/tok_corpus.js" --count 800 --seed 5 >"$T/corpus800.jsonl" || fail "corpus generator failed"
node "$CLIENTS/tok_compare.js" --bin "$ENGINE" --vocab "$T/cl100k.tiktoken" --corpus "$T/corpus800.jsonl" \
    --encoding cl100k_base --pattern cl100k || fail "shoal and js-tiktoken disagree on cl100k_base"

# ---- the command line ------------------------------------------------------
V=(--vocab "$T/o200k.tiktoken" --pattern o200k)
"$ENGINE" tokenize --help | grep -q "usage: shoal-engine tokenize" || fail "--help"
out=$(printf 'Hello, world!\n\nThe capital of France is\n' | "$ENGINE" tokenize "${V[@]}")
want=$(printf '13225 11 2375 0\n\n976 9029 328 10128 382')  # js-tiktoken's ids
[ "$out" = "$want" ] || fail "line mode: got [$out] want [$want]"
out=$(printf 'Hello, world!' | "$ENGINE" tokenize "${V[@]}" --json)
[ "$out" = "[13225,11,2375,0]" ] || fail "--json: got $out"
# --whole keeps the newlines; --in-json reads escapes; both agree.
a=$(printf 'a\n\nb  ' | "$ENGINE" tokenize "${V[@]}" --whole)
b=$(printf '"a\\n\\nb  "\n' | "$ENGINE" tokenize "${V[@]}" --in-json)
[ "$a" = "64 279 65 256" ] && [ "$a" = "$b" ] || fail "--whole [$a] vs --in-json [$b]"
out=$(echo "$a" | "$ENGINE" tokenize "${V[@]}" --decode --json)
[ "$out" = '"a\n\nb  "' ] || fail "--decode --json: got $out"
# Errors: a bad vocabulary names its line; usage errors exit 2.
printf 'IQ== 0\nnot-base64! 1\n' >"$T/bad.tiktoken"
"$ENGINE" tokenize --vocab "$T/bad.tiktoken" </dev/null 2>"$T/err.log"; rc=$?
[ $rc -eq 1 ] && grep -q "line 2" "$T/err.log" || fail "bad vocabulary: exit $rc, $(cat "$T/err.log")"
"$ENGINE" tokenize </dev/null 2>/dev/null; rc=$?
[ $rc -eq 2 ] || fail "no vocabulary should be a usage error, got exit $rc"
echo 99999999 | "$ENGINE" tokenize "${V[@]}" --decode 2>/dev/null; rc=$?
[ $rc -eq 1 ] || fail "an unknown id should fail, got exit $rc"
echo "command line: ok"

# ---- K3 gold vectors (specs/k3.md §4) --------------------------------------
K3=${SHOAL_K3_TOKENIZER_DIR:-}
if [ -z "$K3" ] || [ ! -f "$K3/tiktoken.model" ]; then
    echo "K3 gold vectors: skipped (set SHOAL_K3_TOKENIZER_DIR to a directory with K3's tiktoken.model and tokenizer_config.json)"
    exit 0
fi
cat >"$T/gold.jsonl" <<'G'
"The capital of France is"
"Hello, world!"
"Hello\n\nworld  "
"a <|open|> b [BOS] c"
G
out=$("$ENGINE" tokenize "$K3" --in-json <"$T/gold.jsonl") || fail "K3 tokenize failed"
want=$(printf '%s\n' "1008 10484 318 15383 387" "19180 11 2695 0" "19180 382 23617 256" \
    "64 22652 4454 91 29 291 793 33 4110 60 275")
[ "$out" = "$want" ] || fail "K3 gold: got
$out
want
$want"
out=$(echo '"a <|open|> b [BOS] c"' | "$ENGINE" tokenize "$K3" --in-json --specials)
[ "$out" = "64 220 163587 291 220 163584 275" ] || fail "K3 gold with specials: got $out"
out=$(echo "17374 13 646 606 142957 37092 387 7081 306 17374 13 646 14715 91527 16575 387 1280" |
      "$ENGINE" tokenize "$K3" --decode)
[ "$out" = " Paris. The Eiffel Tower is located in Paris. The Louvre Museum is also" ] ||
    fail "K3 oracle decode: got [$out]"
echo "K3 gold vectors: ok"
