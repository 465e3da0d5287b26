#!/bin/bash
# test_engine_run.sh — shoal-engine run on tiny-k3 without the reference:
# chunked prefill bit-identical to token-at-a-time (C = 1, 3, 8) and across
# thread counts; decode after prefill equal to one full forward; the output
# forms (ids line, --json, --stats, dumps); the option grammar shared by
# every command; the context cap; bad input refused with a message naming
# what is wrong.
source "$(dirname "$0")/lib.sh"

E="$BIN/shoal-engine"
[ -x "$E" ] || fail "no $E"
"$BIN/mkmodel" --preset tiny --seed 3 --out "$T/m" --quiet || fail "mkmodel"
M="$T/m"
P=7,100,300,5,9,42,11,12,13,700,1
V=1024

# --- chunked prefill == token at a time, both spines, and thread counts ---
for spine in int8 int4 f32; do
    for c in 1 3 8; do
        "$E" run "$M" --tokens $P --max-tokens 5 --spine $spine --chunk $c \
            --dump-logits "$T/l_${spine}_$c" --dump-hidden "$T/h_${spine}_$c.npy" >"$T/o_${spine}_$c" \
            || fail "run --chunk $c --spine $spine"
    done
    for c in 3 8; do
        cmp -s "$T/l_${spine}_1" "$T/l_${spine}_$c" || fail "$spine: logits with --chunk $c differ from --chunk 1"
        cmp -s "$T/h_${spine}_1.npy" "$T/h_${spine}_$c.npy" || fail "$spine: hidden with --chunk $c differ"
        cmp -s "$T/o_${spine}_1" "$T/o_${spine}_$c" || fail "$spine: ids with --chunk $c differ"
    done
    "$E" run "$M" --tokens $P --max-tokens 5 --spine $spine --chunk 8 --threads 1 \
        --dump-logits "$T/l_${spine}_t1" >/dev/null || fail "run --threads 1"
    cmp -s "$T/l_${spine}_1" "$T/l_${spine}_t1" || fail "$spine: --threads 1 differs from the default"
    echo "ok   $spine: chunks 1/3/8 and 1/2 threads bit-identical"
done

# --- decode after prefill == the full forward of the same sequence ---
ids=($(tail -n 1 "$T/o_int8_1"))
[ ${#ids[@]} -eq 5 ] || fail "expected 5 generated ids, got '${ids[*]}'"
"$E" run "$M" --tokens "$P,${ids[0]},${ids[1]},${ids[2]},${ids[3]}" --max-tokens 1 --chunk 16 \
    --dump-logits "$T/full" >"$T/full.out" || fail "full forward"
tail -c $((V * 4)) "$T/l_int8_1" >"$T/last"
cmp -s "$T/full" "$T/last" || fail "decode after prefill differs from the full forward"
[ "$(tail -n 1 "$T/full.out")" = "${ids[4]}" ] || fail "full forward picked another token"
[ "$(stat -c %s "$T/l_int8_1")" -eq $((5 * V * 4)) ] || fail "--dump-logits size"
echo "ok   decode after prefill == full forward (bit-identical)"

# --- layer-major prefill: --chunk auto (the default) lets the plan take the
# whole prompt through each layer at once; decode then continues from that
# state: ids and logits equal token-at-a-time's, and --stats shows each MoE
# layer's distinct experts against min(tokens x top-k, experts) ---
P40=$(seq -s, 3 42)
"$E" run "$M" --tokens $P --max-tokens 5 --stats --dump-logits "$T/l_lm" >"$T/o_lm" 2>"$T/e_lm" \
    || { cat "$T/e_lm"; fail "layer-major run"; }
cmp -s "$T/o_int8_1" "$T/o_lm" || fail "layer-major prefill: ids '$(tail -n 1 "$T/o_lm")' differ from token-at-a-time's"
cmp -s "$T/l_int8_1" "$T/l_lm" || fail "layer-major prefill: logits differ from token-at-a-time's"
grep -q '^plan: prefill chunk 11 (the largest the plan allows)' "$T/e_lm" \
    || fail "the plan did not take the 11-token prompt as one chunk: $(grep 'prefill chunk' "$T/e_lm")"
for c in auto 1 16; do
    "$E" run "$M" --tokens $P40 --max-tokens 4 --chunk $c --stats --dump-logits "$T/l40_$c" \
        >"$T/o40_$c" 2>"$T/e40_$c" || { cat "$T/e40_$c"; fail "40-token run --chunk $c"; }
done
cmp -s "$T/o40_1" "$T/o40_auto" && cmp -s "$T/l40_1" "$T/l40_auto" \
    || fail "40 tokens: layer-major prefill and decode differ from token-at-a-time"
/usr/bin/python3 - "$T/e_lm" 11 1 "$T/e40_auto" 40 1 "$T/e40_16" 40 3 <<'PYEOF' || fail "--stats per-layer loads"
import re, sys
a = sys.argv[1:]
per = {}
for i in range(0, len(a), 3):
    path, tokens, chunks = a[i], int(a[i + 1]), int(a[i + 2])
    text = open(path).read()
    m = re.search(r"^stats: prefill of (\d+) tokens in (\d+) chunks?: distinct experts read per "
                  r"MoE layer / bound min\(tokens x top-k, experts\) = (\d+):(.*)$", text, re.M)
    assert m, text
    assert int(m.group(1)) == tokens and int(m.group(2)) == chunks, m.group(0)
    bound = int(m.group(3))
    assert bound == min(tokens * 4, 64), (bound, tokens)   # tiny: top-4 of 64
    loads = [tuple(map(int, x.split("/"))) for _, x in re.findall(r"L(\d+) (\d+/\d+);", m.group(4))]
    assert len(loads) == 7, loads                           # layers 1-7 are MoE
    total = int(re.search(r"^stats: prefill loaded (\d+) distinct", text, re.M).group(1))
    assert sum(l for l, _ in loads) == total, (loads, total)
    if chunks == 1:
        assert all(0 < l <= bound and b == bound for l, b in loads), (path, loads)
    per[(tokens, chunks)] = [l for l, _ in loads]
# three chunks of the same prompt read more than the one chunk's union
assert all(x >= y for x, y in zip(per[(40, 3)], per[(40, 1)])), per
assert sum(per[(40, 3)]) > sum(per[(40, 1)]), per
print("ok   per-layer loads: 11 tokens %s of %d; 40 tokens %s (one chunk) against %s (chunks of 16)"
      % (per[(11, 1)], 44, per[(40, 1)], per[(40, 3)]))
PYEOF
echo "ok   layer-major prefill (whole prompt per layer) then decode == token-at-a-time (bit-identical)"

# --- output forms ---
"$E" run "$M" --tokens $P --max-tokens 3 --json >"$T/json" || fail "--json"
[ "$(wc -l <"$T/json")" -eq 1 ] || fail "--json printed more than one line"
/usr/bin/python3 - "$T/json" "${ids[*]:0:3}" <<'PYEOF' || fail "--json content"
import json, sys
o = json.load(open(sys.argv[1]))
assert o["prompt_tokens"] == [7, 100, 300, 5, 9, 42, 11, 12, 13, 700, 1], o
assert o["tokens"] == [int(t) for t in sys.argv[2].split()], (o["tokens"], sys.argv[2])
t = o["timings"]
assert t["prefill_ms"] > 0 and len(t["per_token_ms"]) == 2 and t["decode_tokens_per_s"] > 0, t
PYEOF
"$E" run "$M" --tokens $P --max-tokens 3 --stats >"$T/st.out" 2>"$T/st.err" || fail "--stats"
grep -q "per-token ms" "$T/st.err" && grep -q "local [0-9]" "$T/st.err" && grep -q "MiB read" "$T/st.err" \
    || fail "--stats output: $(cat "$T/st.err")"
[ "$(tail -n 1 "$T/st.out")" = "${ids[*]:0:3}" ] || fail "--stats changed the ids line"
"$E" --version | grep -q '^shoal-engine [0-9]' || fail "--version"
"$E" --help | grep -q 'run MODEL' || fail "--help"
"$E" run --help | grep -q -- '--dump-hidden' || fail "run --help"
echo "ok   --json, --stats, --version, --help"

# --- bad input ---
expect_fail() {  # expect_fail STATUS REGEX CMD...
    local want=$1 re=$2; shift 2
    "$@" >"$T/bad.out" 2>"$T/bad.err"
    local rc=$?
    [ $rc -eq "$want" ] || fail "'$*' exited $rc, expected $want: $(cat "$T/bad.err")"
    grep -qE "$re" "$T/bad.err" || fail "'$*': message '$(cat "$T/bad.err")' lacks /$re/"
}
expect_fail 1 'outside the vocabulary' "$E" run "$M" --tokens 1,1024 --max-tokens 1
expect_fail 1 'outside the vocabulary' "$E" run "$M" --tokens -1 --max-tokens 1
expect_fail 2 'comma-separated' "$E" run "$M" --tokens 1,x --max-tokens 1
expect_fail 2 'bad value for --spine: int3' "$E" run "$M" --tokens 1 --spine int3
expect_fail 2 "unrecognized option '--bogus'" "$E" run "$M" --tokens 1 --bogus
expect_fail 2 "option '--chunk' needs a value" "$E" run "$M" --tokens 1 --chunk
expect_fail 2 'more than one MODEL' "$E" run "$M" "$M" --tokens 1
expect_fail 2 "unrecognized option '--bogus'" "$E" serve "$M" --bogus
expect_fail 2 "unrecognized option '--bogus'" "$E" run "$M" --prompt hi --bogus
expect_fail 2 "bad value for --ram" "$E" plan "$M" --ram lots
# serve's own options go through the same table
expect_fail 2 'bad value for --request-timeout: 0' "$E" serve "$M" --request-timeout 0
expect_fail 2 'bad value for --max-header: 1' "$E" serve "$M" --max-header=1
expect_fail 2 "option '--idle-timeout' needs a value" "$E" serve "$M" --idle-timeout
expect_fail 2 'bad value for --max-connections: 0' "$E" serve "$M" --max-connections=0
expect_fail 2 'give the key once' "$E" serve "$M" --api-key-file /dev/null --api-key k
"$E" serve --help | grep -q -- '--api-key-file FILE' || fail "serve --help lacks --api-key-file"
# one grammar: --opt=value and --opt value, in every command
a=$("$E" run "$M" --tokens=$P --max-tokens=3 --chunk=3 --spine=int8 2>/dev/null | tail -n 1)
[ "$a" = "${ids[*]:0:3}" ] || fail "--opt=value: $a, expected ${ids[*]:0:3}"
for cmd in run prompt serve plan; do
    "$E" $cmd --help | grep -q -- '--expert-ram SIZE' || fail "$cmd --help lacks the shared options"
    "$E" $cmd --version | grep -q '^shoal-engine [0-9]' || fail "$cmd --version"
done
expect_fail 1 'shoald' "$E" run hf://moonshotai/Kimi-K3 --tokens 1 --max-tokens 1
expect_fail 1 'config.json' "$E" run "$T/nothing" --tokens 1 --max-tokens 1
# the context cap: 11 prompt tokens and 5 more need 15 positions
expect_fail 1 'need 15 positions; the context is 12 tokens \(--context\)' \
    "$E" run "$M" --tokens $P --max-tokens 5 --context 12
a=$("$E" run "$M" --tokens $P --max-tokens 5 --context 15 2>/dev/null | tail -n 1)
[ "$a" = "${ids[*]}" ] || fail "--context 15: $a, expected ${ids[*]}"
expect_fail 1 'past the model.s max_position_embeddings 4096' \
    "$E" run "$M" --tokens $P --context 5000

cp -r "$M" "$T/cfg"
/usr/bin/python3 - "$T/cfg/config.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["text_config"]["q_lora_rank"] = 96
json.dump(c, open(sys.argv[1], "w"))
PYEOF
expect_fail 1 'q_a_proj.weight: shape \[64,256\] does not match the config, expected \[96,256\]' \
    "$E" run "$T/cfg" --tokens 1 --max-tokens 1

cp -r "$M" "$T/miss"
/usr/bin/python3 - "$T/miss/model.safetensors.index.json" <<'PYEOF'
import json, sys
i = json.load(open(sys.argv[1]))
del i["weight_map"]["language_model.model.layers.5.self_attn.dt_bias"]
del i["weight_map"]["language_model.model.layers.2.block_sparse_moe.experts.17.w3.weight_scale"]
json.dump(i, open(sys.argv[1], "w"))
PYEOF
expect_fail 1 'language_model.model.layers.2.block_sparse_moe.experts.17.w3.weight_scale: missing from the index' \
    "$E" run "$T/miss" --tokens 1 --max-tokens 1
echo "ok   bad input refused with the culprit named"
echo "all engine run checks passed"
