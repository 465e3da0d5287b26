#!/usr/bin/env bash
# test_engine_plan.sh — the memory plan (engine/plan/, docs/engine.md "The
# memory plan"):
#   - `shoal-engine plan` on K3's config (no weights: only config.json)
#     chooses int8 with room, int4 and a capped context on 64 GiB, a
#     streamed part (with its cost per token) on 32 GiB, and refuses on 8 GiB
#     naming the smallest memory that works;
#   - on tiny-k3, a limit between where int4 and int8 begin chooses int4,
#     with --ram and under a real memory cgroup (v1 or v2, when one can be
#     made here), and the run completes with the local int4 run's tokens;
#     a limit below the int4 spine with --spine int4 (and int8) plans a
#     streamed part, reads every streamed layer every pass and makes the
#     all-resident run's tokens; below the smallest streamed plan, and
#     (auto) below the floor, the run is refused with a clear message;
#   - the context cap: a prompt past it is refused by run and answered 400
#     context_length_exceeded by serve, as is a prompt and max_tokens past it.
source "$(dirname "$0")/lib.sh"
E="$BIN/shoal-engine"
[ -x "$E" ] || fail "no $E"
PY=/usr/bin/python3
GiB=$((1 << 30))

field() {  # field FILE KEY.PATH  -> the value of a plan JSON
    $PY -c 'import json,sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."): v = v[k]
print(str(v).lower() if isinstance(v, bool) else v)' "$1" "$2"
}

# ---- K3's config alone ---------------------------------------------------------------
mkdir -p "$T/k3"
$PY - "$T/k3/config.json" <<'PY'
import json, sys
full = [l for l in range(1, 94) if (l % 4 == 0 and l <= 92) or l == 93]
kda = [l for l in range(1, 94) if l not in full]
tc = {"model_type": "kimi_linear", "dtype": "bfloat16", "hidden_act": "situ",
      "hidden_size": 7168, "vocab_size": 163840, "max_position_embeddings": 1048576,
      "num_hidden_layers": 93, "first_k_dense_replace": 1, "moe_layer_freq": 1,
      "intermediate_size": 33792, "num_experts": 896, "num_experts_per_token": 16,
      "num_shared_experts": 2, "moe_intermediate_size": 3072, "routed_expert_hidden_size": 3584,
      "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc", "use_grouped_topk": True,
      "num_expert_group": 1, "topk_group": 1, "moe_renormalize": True,
      "routed_scaling_factor": 1.0, "latent_moe_use_norm": True, "activation_situ_beta": 4.0,
      "activation_situ_linear_beta": 25.0, "num_attention_heads": 96, "num_key_value_heads": 96,
      "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
      "v_head_dim": 128, "mla_use_nope": True, "mla_use_output_gate": True,
      "attn_res_block_size": 12, "rms_norm_eps": 1e-5, "bos_token_id": 163584,
      "eos_token_id": 163586, "pad_token_id": 163839,
      "linear_attn_config": {"num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4,
                             "gate_lower_bound": -5.0, "use_full_rank_gate": True,
                             "kda_layers": kda, "full_attn_layers": full},
      "quantization_config": {"quant_method": "compressed-tensors",
                              "format": "mxfp4-pack-quantized",
                              "config_groups": {"group_0": {"format": "mxfp4-pack-quantized",
                                  "weights": {"num_bits": 4, "group_size": 32}}}}}
json.dump({"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
           "text_config": tc}, open(sys.argv[1], "w"))
PY
plan_k3() {  # NAME RAM [ARGS...] -> $T/NAME.json, $T/NAME.txt; exit status in $prc
    local name=$1 ram=$2; shift 2
    prc=0
    "$E" plan "$T/k3" --ram "$ram" --json "$@" > "$T/$name.json" 2> "$T/$name.err" || prc=$?
    "$E" plan "$T/k3" --ram "$ram" "$@" > "$T/$name.txt" 2>> "$T/$name.err" || true
}
plan_k3 k128 128G
[ $prc = 0 ] && [ "$(field "$T/k128.json" spine.mode)" = int8 ] \
    || { cat "$T/k128.txt" "$T/k128.err"; fail "128 GiB: not int8"; }
echo "ok   128 GiB: $(grep '^plan: spine' "$T/k128.txt")"

plan_k3 k64 64G
[ $prc = 0 ] && [ "$(field "$T/k64.json" spine.mode)" = int4 ] \
    && [ "$(field "$T/k64.json" verdict)" = resident ] \
    && [ "$(field "$T/k64.json" context_capped)" = true ] \
    && [ "$(field "$T/k64.json" context)" -lt 1048576 ] \
    || { cat "$T/k64.txt" "$T/k64.err"; fail "64 GiB: not int4 with a capped context"; }
grep -q '^plan: context [0-9]* tokens (capped by the plan)' "$T/k64.txt" || fail "64 GiB: the cap is not stated"
tier=$(field "$T/k64.json" ram_tier)
[ "$tier" -gt $((10 * GiB)) ] || fail "64 GiB: a RAM tier of only $tier bytes"
echo "ok   64 GiB: int4, context $(field "$T/k64.json" context) of 1048576, RAM tier $((tier / GiB)) GiB"

plan_k3 k32 32G
[ $prc = 0 ] && [ "$(field "$T/k32.json" verdict)" = streamed ] \
    || { cat "$T/k32.txt" "$T/k32.err"; fail "32 GiB: no streamed plan"; }
first=$(field "$T/k32.json" spine.first_streamed_layer)
[ "$first" -gt 0 ] && [ "$first" -lt 93 ] && [ "$(field "$T/k32.json" spine.streamed)" -gt 0 ] \
    || fail "32 GiB: streams from layer $first"
grep -q "^plan: streamed: .* per token from layer $first on ([0-9.]* s/token at 7 GB/s)" "$T/k32.txt" \
    || { cat "$T/k32.txt"; fail "32 GiB: the streamed part's cost is not stated"; }
echo "ok   32 GiB: $(grep '^plan: streamed' "$T/k32.txt")"

plan_k3 k8 8G
floor=$(field "$T/k8.json" min_ram.floor)
[ $prc = 1 ] && [ "$(field "$T/k8.json" verdict)" = refused ] || fail "8 GiB: not refused (exit $prc)"
grep -q 'needs at least [0-9.]* GiB of memory; this run may use 8.00 GiB (--ram' "$T/k8.err" \
    || { cat "$T/k8.err"; fail "8 GiB: the refusal does not name the smallest memory"; }
plan_k3 kfloor "$floor"
[ $prc = 0 ] || { cat "$T/kfloor.err"; fail "the named smallest memory ($floor) does not plan"; }
echo "ok   8 GiB refused: $(head -n 1 "$T/k8.err" | cut -c1-110)...; $floor bytes plan"

plan_k3 kctx 256G --context 131072
[ "$(field "$T/kctx.json" context)" = 131072 ] && grep -q '131072 tokens (--context)' "$T/kctx.txt" \
    || { cat "$T/kctx.txt"; fail "--context 131072 not taken"; }
plan_k3 kbad 256G --context 2000000
[ $prc = 1 ] && grep -q 'past the model.s max_position_embeddings 1048576' "$T/kbad.err" \
    || { cat "$T/kbad.err"; fail "--context past the model's max not refused"; }
echo "ok   --context taken as asked, refused past max_position_embeddings"

# ---- tiny-k3: int4 chosen by the limit, and the run completes ------------------------------
"$BIN/mkmodel" --preset tiny --seed 5 --out "$T/m" --quiet || fail "mkmodel"
M=$T/m
P=7,100,300,5,9,42
"$E" plan "$M" --states 1 --json > "$T/tiny.json" || fail "plan tiny"
[ "$(field "$T/tiny.json" spine.mode)" = int8 ] || fail "tiny, all the memory: not int8"
lo=$(field "$T/tiny.json" min_ram.int4)
hi=$(field "$T/tiny.json" min_ram.int8)
[ "$lo" -lt "$hi" ] || fail "tiny: int4 from $lo, int8 from $hi"
mid=$(( (lo + hi) / 2 ))
"$E" run "$M" --tokens $P --max-tokens 6 --spine int4 > "$T/o_int4" 2>/dev/null || fail "local int4 run"
"$E" run "$M" --tokens $P --max-tokens 6 --ram "$mid" --stats --json > "$T/ram.json" 2> "$T/ram.err" \
    || { cat "$T/ram.err"; fail "run --ram $mid"; }
[ "$(field "$T/ram.json" plan.spine.mode)" = int4 ] && [ "$(field "$T/ram.json" plan.limit_by)" = --ram ] \
    || { cat "$T/ram.err"; fail "--ram $mid did not choose int4"; }
[ "$($PY -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["tokens"])))' "$T/ram.json")" \
  = "$(tail -n 1 "$T/o_int4")" ] || fail "--ram $mid: tokens differ from the local int4 run"
grep -q '^plan: spine int4' "$T/ram.err" || fail "the run did not log its plan"
echo "ok   tiny: int4 from $lo, int8 from $hi bytes; --ram $mid chose int4 and ran ($(tail -n 1 "$T/o_int4"))"

# a limit below the int4 spine: --spine int4 plans a streamed part (tiny's experts are too
# small next to its spine for auto's floor), runs it, and makes the all-resident run's ids
"$E" plan "$M" --states 1 --spine int4 --json > "$T/tiny4.json" || fail "plan tiny --spine int4"
slo=$(field "$T/tiny4.json" min_ram.streamed_any)
[ "$slo" -lt "$lo" ] || fail "tiny: streaming needs $slo, int4 whole $lo"
smid=$(( (slo + lo) / 2 ))
"$E" run "$M" --tokens $P --max-tokens 6 --spine int4 --ram "$smid" --stats --json \
    > "$T/st.json" 2> "$T/st.err" || { cat "$T/st.err"; fail "run --spine int4 --ram $smid"; }
[ "$(field "$T/st.json" plan.verdict)" = streamed ] \
    && [ "$(field "$T/st.json" plan.spine.streamed)" -gt 0 ] \
    || { cat "$T/st.err"; fail "--ram $smid did not plan a streamed part"; }
sfirst=$(field "$T/st.json" plan.spine.first_streamed_layer)
grep -q "^plan: streamed: .* per token from layer $sfirst on" "$T/st.err" || fail "the streamed part is not stated"
[ "$($PY -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["tokens"])))' "$T/st.json")" \
  = "$(tail -n 1 "$T/o_int4")" ] || fail "--ram $smid (streamed from layer $sfirst): tokens differ from the resident int4 run"
# every streamed layer was read each forward pass (6 tokens: 1 prefill chunk + 5 decode steps),
# plus at most one: the read ahead of the next pass's first layer, which may or may not
# have ended when the stats are taken
reads=$(sed -n 's/^stats: streamed spine: .*, \([0-9]*\) layer reads.*/\1/p' "$T/st.err")
want=$(( (8 - sfirst) * 6 ))
[ "$reads" = $want ] || [ "$reads" = $((want + 1)) ] \
    || { cat "$T/st.err"; fail "streamed layer reads: $reads, not $want (or $((want + 1)) with the next pass's read ahead)"; }
echo "ok   tiny --spine int4 --ram $smid: layers $sfirst-7 streamed ($reads layer reads), the resident run's tokens"
# the streamed int8 spine too, against the resident int8 run
"$E" plan "$M" --states 1 --spine int8 --json > "$T/tiny8.json" || fail "plan tiny --spine int8"
s8lo=$(field "$T/tiny8.json" min_ram.streamed_any)
"$E" run "$M" --tokens $P --max-tokens 6 --spine int8 > "$T/o_int8" 2>/dev/null || fail "local int8 run"
"$E" run "$M" --tokens $P --max-tokens 6 --spine int8 --ram $(( s8lo + 65536 )) > "$T/o_s8" 2> "$T/s8.err" \
    || { cat "$T/s8.err"; fail "run --spine int8 streamed"; }
grep -q '^plan: streamed' "$T/s8.err" && [ "$(tail -n 1 "$T/o_s8")" = "$(tail -n 1 "$T/o_int8")" ] \
    || { cat "$T/s8.err"; fail "streamed int8: not streamed, or tokens differ from the resident int8 run"; }
echo "ok   tiny --spine int8 at the smallest memory that streams: the resident int8 run's tokens"
"$E" run "$M" --tokens $P --spine int4 --ram $(( slo - 4096 )) > "$T/slow.out" 2> "$T/slow.err" \
    && fail "--spine int4 below the smallest streamed plan ran"
grep -q 'with --spine given; this run may use' "$T/slow.err" || { cat "$T/slow.err"; fail "below the streamed minimum: no clear refusal"; }

# through shoald: the cached pack's streamed layers read in place every pass, the same tokens
# (the first run builds the pack, the second reads it from shoald's cache)
start_hubmock --repo t/tiny="$M"
export HF_ENDPOINT=$HUB
bg shoald "$BIN/shoald" --home "$T/home" --no-fsync --log "$T/shoald.log"
wait_line "$T/shoald.log" 'ready on' 20 || fail "shoald did not start"
"$E" plan hf://t/tiny --home "$T/home" --states 1 --spine int4 --json > "$T/r4.json" || fail "plan hf://t/tiny"
rmid=$(( ($(field "$T/r4.json" min_ram.streamed_any) + $(field "$T/r4.json" min_ram.int4)) / 2 ))
for i in 1 2; do
    "$E" run hf://t/tiny --home "$T/home" --tokens $P --max-tokens 6 --spine int4 --ram "$rmid" \
        --stats > "$T/r$i.out" 2> "$T/r$i.err" || { cat "$T/r$i.err"; fail "hf:// streamed run $i"; }
    grep -q '^plan: streamed' "$T/r$i.err" && [ "$(tail -n 1 "$T/r$i.out")" = "$(tail -n 1 "$T/o_int4")" ] \
        || { cat "$T/r$i.err"; fail "hf:// run $i: not streamed, or tokens differ from the resident int4 run"; }
    rr=$(sed -n 's/^stats: streamed spine: .*, \([0-9]*\) layer reads.*/\1/p' "$T/r$i.err")
    [ "${rr:-0}" -ge $(( (8 - $(field "$T/r4.json" spine.first_streamed_layer)) * 6 )) ] \
        || { cat "$T/r$i.err"; fail "hf:// run $i: $rr streamed layer reads"; }
done
grep -q 'stored spine-int4' "$T/shoald.log" || fail "no int4 pack stored"
echo "ok   hf://t/tiny --spine int4 --ram $rmid: streamed in place from the pack (built, then cached), the resident run's tokens"

"$E" run "$M" --tokens $P --ram 1G > "$T/low.out" 2> "$T/low.err" && fail "a run below the floor ran"
grep -q 'run: the model needs at least 2.0[0-9] GiB of memory; this run may use 1.00 GiB (--ram)' \
    "$T/low.err" || { cat "$T/low.err"; fail "below the floor: $(tail -n 1 "$T/low.err")"; }
echo "ok   below the floor: $(tail -n 1 "$T/low.err" | cut -c1-100)..."

# under a real memory cgroup: the same choice from the cgroup's limit
cg_run() {  # DIR FILE: a cgroup at DIR whose limit file is FILE
    local dir=$1 file=$2
    mkdir "$dir" 2>/dev/null || return 1
    if ! echo "$mid" > "$dir/$file" 2>/dev/null; then rmdir "$dir"; return 1; fi
    sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' cg "$dir" \
        "$E" run "$M" --tokens $P --max-tokens 6 --stats --json > "$T/cg.json" 2> "$T/cg.err"
    local rc=$?
    rmdir "$dir" 2>/dev/null
    [ $rc = 0 ] || { cat "$T/cg.err"; fail "run in the cgroup ($dir/$file = $mid)"; }
    return 0
}
me=$(sed -n 's/^0:://p' /proc/self/cgroup)
if cg_run "/sys/fs/cgroup/memory/shoal-plan-$$" memory.limit_in_bytes \
   || cg_run "/sys/fs/cgroup${me%/}/shoal-plan-$$" memory.max; then
    by=$(field "$T/cg.json" plan.limit_by)
    [ "$(field "$T/cg.json" plan.spine.mode)" = int4 ] && [ "${by#cgroup}" != "$by" ] \
        || { cat "$T/cg.err"; fail "the cgroup limit ($by) did not choose int4"; }
    echo "ok   under a memory cgroup of $mid bytes: $by, int4, the run completed"
else
    echo "ok   (no memory cgroup can be made here: the --ram run stands for it)"
fi

# ---- the context cap in serve: 400 context_length_exceeded ---------------------------------
bg serve "$E" serve "$M" --port 0 --context 16 --model-name tiny
wait_line "$T/serve.log" '^listening on http' 30 || { cat "$T/serve.log"; fail "serve did not start"; }
URL=$(sed -n 's/^listening on \(http:.*\)$/\1/p' "$T/serve.log" | head -n 1)
grep -q '^plan: context 16 tokens (--context)' "$T/serve.log" || fail "serve did not log its plan"
code=$(curl -s -o "$T/long.json" -w '%{http_code}' "$URL/v1/completions" \
    -H 'Content-Type: application/json' \
    -d '{"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20],"max_tokens":2}')
[ "$code" = 400 ] && grep -q context_length_exceeded "$T/long.json" \
    || fail "serve: a 20-token prompt past --context 16 got $code $(cat "$T/long.json")"
code=$(curl -s -o "$T/short.json" -w '%{http_code}' "$URL/v1/completions" \
    -H 'Content-Type: application/json' -d '{"prompt":[1,2,3,4],"max_tokens":2}')
[ "$code" = 200 ] || fail "serve: a short prompt got $code $(cat "$T/short.json")"
echo "ok   serve --context 16: a 20-token prompt gets 400 context_length_exceeded, a short one 200"
# the prompt and max_tokens together: 4 + 13 positions do not fit 16, 4 + 12 do (all 12 made)
code=$(curl -s -o "$T/over.json" -w '%{http_code}' "$URL/v1/completions" \
    -H 'Content-Type: application/json' -d '{"prompt":[1,2,3,4],"max_tokens":13}')
[ "$code" = 400 ] && grep -q context_length_exceeded "$T/over.json" && grep -q '17 tokens' "$T/over.json" \
    || fail "serve: 4 prompt tokens + max_tokens 13 past --context 16 got $code $(cat "$T/over.json")"
code=$(curl -s -o "$T/fit.json" -w '%{http_code}' "$URL/v1/completions" \
    -H 'Content-Type: application/json' -d '{"prompt":[1,2,3,4],"max_tokens":12,"ignore_eos":true}')
[ "$code" = 200 ] && [ "$(field "$T/fit.json" usage.completion_tokens)" = 12 ] \
    || fail "serve: 4 prompt tokens + max_tokens 12 in --context 16 got $code $(cat "$T/fit.json")"
echo "ok   serve --context 16: prompt + max_tokens 17 gets 400 context_length_exceeded, 16 runs all 12"
echo "all plan checks passed"
