#!/usr/bin/env bash
# test_tokenizer_tiny.sh — the tokenizer on tiny-k3's synthetic
# tiktoken.model (tools/mkmodel, specs/k3.md §6): the model directory loads
# with its 768 base ranks and 256 reserved specials, text round-trips,
# specials are recognised only with --specials, and the K3 offsets hold.
source "$(dirname "$0")/lib.sh"

ENGINE=$BIN/shoal-engine
[ -x "$ENGINE" ] || skip "$ENGINE not built"
[ -x "$BIN/mkmodel" ] || skip "$BIN/mkmodel not built"
"$BIN/mkmodel" --out "$T/tiny" --preset tiny >"$T/mkmodel.log" 2>&1 || fail "mkmodel: $(tail -3 "$T/mkmodel.log")"

# Round trips: a corpus when node is there, a fixed list otherwise.
if command -v node >/dev/null; then
    node "$ROOT/tests/clients/tok_corpus.js" --count 600 --seed 7 >"$T/corpus.jsonl" || fail "corpus"
else
    printf '%s\n' '"The capital of France is"' '"Hello\n\nworld  "' '"中文 😀 e\u0301"' '""' >"$T/corpus.jsonl"
fi
"$ENGINE" tokenize "$T/tiny" --in-json <"$T/corpus.jsonl" >"$T/ids.txt" || fail "encode"
[ "$(wc -l <"$T/ids.txt")" -eq "$(wc -l <"$T/corpus.jsonl")" ] || fail "one output line per input line"
awk '{for (i = 1; i <= NF; i++) if ($i >= 768) { print "id " $i " on line " NR; exit 1 }}' "$T/ids.txt" ||
    fail "ordinary text produced a special id"
"$ENGINE" tokenize "$T/tiny" --decode --json <"$T/ids.txt" >"$T/back.jsonl" || fail "decode"
/usr/bin/python3 - "$T/corpus.jsonl" "$T/back.jsonl" <<'P' || fail "round trip"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
b = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
bad = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
if len(a) != len(b) or bad:
    for i in bad[:5]:
        print("round trip #%d: %r -> %r" % (i, a[i][:120], b[i][:120]))
    sys.exit(1)
print("tiny-k3 round trip: %d/%d strings equal" % (len(a), len(a)))
P

# Specials: K3's offsets from base 768 (§6), only where allowed.
out=$(echo '"<|open|>user<|sep|>hi<|close|>user<|sep|><|end_of_msg|>[BOS]"' | "$ENGINE" tokenize "$T/tiny" --in-json --specials)
set -- $out
[ "$1" = 771 ] && [ "${!#}" = 768 ] || fail "specials: got $out"
echo "$out" | grep -qw 773 && echo "$out" | grep -qw 772 && echo "$out" | grep -qw 770 || fail "specials: got $out"
out=$(echo '"<|open|>"' | "$ENGINE" tokenize "$T/tiny" --in-json)
echo "$out" | grep -qw 771 && fail "<|open|> became a special without --specials: $out"
out=$(echo "771 1023 800" | "$ENGINE" tokenize "$T/tiny" --decode)
[ "$out" = "<|open|>[PAD]<|reserved_token_800|>" ] || fail "special spellings: got $out"
echo 1024 | "$ENGINE" tokenize "$T/tiny" --decode 2>/dev/null && fail "id 1024 is past the vocabulary"
echo "tiny-k3 specials: ok"
