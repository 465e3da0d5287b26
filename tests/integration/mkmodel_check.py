#!/usr/bin/python3
"""mkmodel_check.py — independent checker of a model directory written by
tools/mkmodel (docs/mkmodel.md, k3.md §2/§6).

    mkmodel_check.py DIR [--stinfo BIN] [--layout-only]

Parses the safetensors shards with its own reader (not fetcher/), derives the
expected tensor list from config.json alone, and checks: header framing
(8-byte LE length, JSON padded with spaces to a multiple of 8, offsets
contiguous from 0 to the end of the file), every tensor's dtype and shape,
the shard naming and assignment, index.json, the expert layout (six records
back to back, 3*I*L*17/32 bytes, each layer's experts one run in
lexicographic name order), the tokenizer files, value ranges, and exact
values of sample tensors recomputed from the seed rule.  With --stinfo it
also compares bin/stinfo's listing of every shard with its own.
--layout-only skips the values (a directory written with --headers-only).
The k3 preset adds its 168 vision tensors (docs/mkmodel.md) in two shards
after the globals, 8-bytes-a-draw expert bytes and a padded tokenizer.
Exits 0 when everything holds, 1 with the list of failures otherwise.
"""
import base64
import json
import math
import os
import re
import struct
import subprocess
import sys

import numpy as np

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
PFX = "language_model."
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
    return cond


# ---- the seed rule, reimplemented -----------------------------------------
def fnv1a64(s):
    h = 0xcbf29ce484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001b3) & M64
    return h


def packed8(name, seed, n):
    """The first n bytes of a k3 expert record: byte i of draw i // 8."""
    return [(x >> (8 * (i % 8))) & 255 for i, x in
            enumerate(d for d in draws(name, seed, (n + 7) // 8) for _ in range(8))][:n]


def draws(name, seed, n):
    """The first n SplitMix64 outputs of a tensor, as Python ints."""
    s = fnv1a64(name) ^ ((seed * GOLDEN) & M64)
    out = []
    for _ in range(n):
        s = (s + GOLDEN) & M64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        out.append(z ^ (z >> 31))
    return out


def bf16_bits(v):
    b = int(np.array([v], dtype=np.float32).view(np.uint32)[0])
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFFFFFF
    return b >> 16


def f32_bits(v):
    return int(np.array([v], dtype=np.float32).view(np.uint32)[0])


# ---- expected layout from config.json --------------------------------------
def expected_tensors(cfg):
    t = cfg["text_config"]
    la = t["linear_attn_config"]
    H, V = t["hidden_size"], t["vocab_size"]
    nl = t["num_hidden_layers"]
    mla = set(x - 1 for x in la["full_attn_layers"])
    kda = set(x - 1 for x in la["kda_layers"])
    check(mla | kda == set(range(nl)) and not (mla & kda), "kda/full_attn lists partition the layers")
    check(0 in kda, "layer 0 is KDA")
    kh, kd = la["num_heads"], la["head_dim"]
    P = kh * kd
    mh = t["num_attention_heads"]
    ql, kvl = t["q_lora_rank"], t["kv_lora_rank"]
    nope, rope, vh = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
    E, L, I = t["num_experts"], t["routed_expert_hidden_size"], t["moe_intermediate_size"]
    S = t["num_shared_experts"] * I
    DI = t["intermediate_size"]
    K = la["short_conv_kernel_size"]
    exp = {}  # name -> (dtype, shape, recipe)

    def add(name, dt, shape, recipe):
        exp[name] = (dt, list(shape), recipe)

    for i in range(nl):
        p = PFX + "model.layers.%d." % i
        for n in ("input_layernorm", "post_attention_layernorm", "self_attention_res_norm", "mlp_res_norm"):
            add(p + n + ".weight", "BF16", [H], "norm")
        add(p + "self_attention_res_proj.weight", "BF16", [1, H], "res_proj")
        add(p + "mlp_res_proj.weight", "BF16", [1, H], "res_proj")
        a = p + "self_attn."
        if i in mla:
            add(a + "q_a_proj.weight", "BF16", [ql, H], "matrix")
            add(a + "q_a_layernorm.weight", "BF16", [ql], "norm")
            add(a + "q_b_proj.weight", "BF16", [mh * (nope + rope), ql], "matrix")
            add(a + "kv_a_proj_with_mqa.weight", "BF16", [kvl + rope, H], "matrix")
            add(a + "kv_a_layernorm.weight", "BF16", [kvl], "norm")
            add(a + "kv_b_proj.weight", "BF16", [mh * (nope + vh), kvl], "matrix")
            add(a + "g_proj.weight", "BF16", [mh * vh, H], "matrix")
            add(a + "o_proj.weight", "BF16", [H, mh * vh], "matrix")
        else:
            for x in "qkvg":
                add(a + x + "_proj.weight", "BF16", [P, H], "matrix")
            add(a + "o_proj.weight", "BF16", [H, P], "matrix")
            add(a + "f_a_proj.weight", "BF16", [kd, H], "matrix")
            add(a + "f_b_proj.weight", "BF16", [P, kd], "matrix")
            add(a + "b_proj.weight", "BF16", [kh, H], "matrix")
            for x in "qkv":
                add(a + x + "_conv1d.weight", "F32", [P, 1, K], "conv")
            add(a + "A_log", "F32", [max(kh, kd)], "a_log")
            add(a + "dt_bias", "F32", [P], "dt_bias")
            add(a + "o_norm.weight", "F32", [kd], "norm")
        if i < t["first_k_dense_replace"]:
            add(p + "mlp.gate_proj.weight", "BF16", [DI, H], "matrix")
            add(p + "mlp.up_proj.weight", "BF16", [DI, H], "matrix")
            add(p + "mlp.down_proj.weight", "BF16", [H, DI], "matrix")
            continue
        m = p + "block_sparse_moe."
        add(m + "gate.weight", "BF16", [E, H], "matrix")
        add(m + "gate.e_score_correction_bias", "F32", [E], "score_bias")
        add(m + "routed_expert_down_proj.weight", "BF16", [L, H], "matrix")
        add(m + "routed_expert_up_proj.weight", "BF16", [H, L], "matrix")
        add(m + "routed_expert_norm.weight", "BF16", [L], "norm")
        add(m + "shared_experts.gate_proj.weight", "BF16", [S, H], "matrix")
        add(m + "shared_experts.up_proj.weight", "BF16", [S, H], "matrix")
        add(m + "shared_experts.down_proj.weight", "BF16", [H, S], "matrix")
        for e in range(E):
            x = m + "experts.%d." % e
            add(x + "w1.weight_packed", "U8", [I, L // 2], "packed")
            add(x + "w1.weight_scale", "U8", [I, L // 32], "scale")
            add(x + "w2.weight_packed", "U8", [L, I // 2], "packed")
            add(x + "w2.weight_scale", "U8", [L, I // 32], "scale")
            add(x + "w3.weight_packed", "U8", [I, L // 2], "packed")
            add(x + "w3.weight_scale", "U8", [I, L // 32], "scale")
    add(PFX + "model.embed_tokens.weight", "BF16", [V, H], "matrix")
    add(PFX + "model.norm.weight", "BF16", [H], "norm")
    add(PFX + "model.output_attn_res_norm.weight", "BF16", [H], "norm")
    add(PFX + "model.output_attn_res_proj.weight", "BF16", [1, H], "res_proj")
    add(PFX + "lm_head.weight", "BF16", [V, H], "matrix")
    if k3(cfg):
        vision_tensors(add, H)
    else:
        add("vision_tower.dummy", "BF16", [4, 8], "matrix")
    return exp


def k3(cfg):
    return cfg.get("mkmodel_preset") == "k3"


def vision_tensors(add, H):
    """The k3 preset's vision tower and projector, as docs/mkmodel.md lists them."""
    VH, VI = 1152, 4304
    add("vision_tower.patch_embed.proj.weight", "BF16", [VH, 3, 14, 14], "matrix")
    add("vision_tower.patch_embed.proj.bias", "BF16", [VH], "bias")
    add("vision_tower.patch_embed.pos_emb.weight", "BF16", [64, 64, VH], "matrix")
    add("vision_tower.patch_embed.pos_emb.time_weight", "BF16", [4, VH], "matrix")
    for b in range(13):
        p = "vision_tower.encoder.blocks.%d." % b
        for n in ("norm0", "norm1"):
            add(p + n + ".weight", "BF16", [VH], "norm")
            add(p + n + ".bias", "BF16", [VH], "bias")
        for n, o, i in (("wqkv", 3 * VH, VH), ("wo", VH, VH), ("mlp.fc0", VI, VH), ("mlp.fc1", VH, VI)):
            add(p + n + ".weight", "BF16", [o, i], "matrix")
            add(p + n + ".bias", "BF16", [o], "bias")
    add("vision_tower.encoder.final_layernorm.weight", "BF16", [VH], "norm")
    add("vision_tower.encoder.final_layernorm.bias", "BF16", [VH], "bias")
    add("mm_projector.pre_norm.weight", "BF16", [VH], "norm")
    add("mm_projector.pre_norm.bias", "BF16", [VH], "bias")
    add("mm_projector.linear_1.weight", "BF16", [4 * VH, 4 * VH], "matrix")
    add("mm_projector.linear_1.bias", "BF16", [4 * VH], "bias")
    add("mm_projector.linear_2.weight", "BF16", [H, 4 * VH], "matrix")
    add("mm_projector.linear_2.bias", "BF16", [H], "bias")


def shard_of(name, shards, nl, per):
    """The shard a tensor must be in: its layer's, the globals' (after the
    layers) or, for k3's vision tensors, one of the two last."""
    m = re.match(r"language_model\.model\.layers\.(\d+)\.", name)
    if m:
        return shards[int(m.group(1)) // per]
    g = (nl + per - 1) // per
    if name.startswith(("vision_tower.", "mm_projector.")) and len(shards) == g + 3:
        b = re.match(r"vision_tower\.encoder\.blocks\.(\d+)\.", name)
        late = name.startswith(("mm_projector.", "vision_tower.encoder.final_")) or (b and int(b.group(1)) >= 7)
        return shards[g + 2 if late else g + 1]
    return shards[g]


# ---- our own safetensors reader ---------------------------------------------
SIZES = {"F32": 4, "BF16": 2, "U8": 1}


def read_shard(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        raw = f.read(n)
    base = os.path.basename(path)
    check(n % 8 == 0, "%s: header length %d is a multiple of 8" % (base, n))
    check(raw[:1] == b"{", "%s: header starts with '{'" % base)
    text = raw.decode("utf-8")
    body = text.rstrip(" ")
    check(body.endswith("}") and len(text) - len(body) < 8, "%s: padded with < 8 spaces" % base)
    hdr = json.loads(body)
    meta = hdr.pop("__metadata__", None)
    check(meta == {"format": "pt"}, "%s: __metadata__ is {format: pt}" % base)
    ents = sorted(hdr.items(), key=lambda kv: (kv[1]["data_offsets"][0], kv[1]["data_offsets"][1]))
    check(list(hdr.keys()) == [k for k, _ in ents], "%s: JSON lists tensors in file order" % base)
    pos = 0
    out = []
    for name, e in ents:
        b, en = e["data_offsets"]
        check(b == pos, "%s: %s starts at %d (expected %d: contiguous)" % (base, name, b, pos))
        nb = SIZES.get(e["dtype"], 0) * int(np.prod(e["shape"], dtype=np.int64))
        check(en - b == nb, "%s: %s size matches dtype x shape" % (base, name))
        absb = 8 + n + b
        check(absb % SIZES.get(e["dtype"], 1) == 0, "%s: %s aligned to its element size" % (base, name))
        out.append((name, e["dtype"], e["shape"], absb, 8 + n + en))
        pos = en
    check(8 + n + pos == size, "%s: data end exactly at the end of the file" % base)
    return out


def tensor_bytes(path, ent):
    with open(path, "rb") as f:
        f.seek(ent[3])
        return f.read(ent[4] - ent[3])


def as_f32(dt, raw):
    if dt == "F32":
        return np.frombuffer(raw, dtype="<f4")
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


# ---- checks ---------------------------------------------------------------
def check_values(d, where, exp, seed, t, k3_cfg):
    """Ranges over whole tensors and exact recomputed values of their first elements."""
    per_class = {}
    for name, (dt, shape, recipe) in sorted(exp.items()):
        per_class.setdefault(recipe, []).append(name)
    for recipe, names in sorted(per_class.items()):
        for name in names[:3] + names[-1:]:
            shard, ent = where[name]
            raw = tensor_bytes(os.path.join(d, shard), ent)
            dt, shape = ent[1], ent[2]
            k = min(64, int(np.prod(shape, dtype=np.int64)))
            xs = draws(name, seed, k)
            us = [(x >> 40) * 2.0 ** -24 for x in xs]
            if recipe in ("packed", "scale") and k3_cfg:
                v = np.frombuffer(raw, dtype=np.uint8)
                b = packed8(name, seed, k)
                want = b if recipe == "packed" else [119 + ((5 * x) >> 8) for x in b]
                check(list(v[:k]) == want, "%s: k3 expert bytes follow the 8-a-draw rule" % name)
                continue
            if recipe == "packed":
                v = np.frombuffer(raw, dtype=np.uint8)
                check(list(v[:k]) == [x >> 56 for x in xs], "%s: packed bytes follow the seed rule" % name)
                continue
            if recipe == "scale":
                v = np.frombuffer(raw, dtype=np.uint8)
                check(v.min() >= 119 and v.max() <= 123, "%s: scale bytes in 119..123" % name)
                check(list(v[:k]) == [119 + int(5 * u) for u in us], "%s: scale bytes follow the seed rule" % name)
                continue
            vals = as_f32(dt, raw)
            if recipe == "matrix":
                a = math.sqrt(3.0 / shape[-1])
                want = [(2 * u - 1) * a for u in us]
                check(np.all(np.abs(vals) <= a * 1.01), "%s: |w| <= sqrt(3/in)" % name)
            elif recipe == "norm":
                want = [1 + 0.2 * (2 * u - 1) for u in us]
                check(vals.min() >= 0.79 and vals.max() <= 1.21, "%s: norm weights in [0.8, 1.2]" % name)
            elif recipe in ("res_proj", "conv"):
                want = [0.5 * (2 * u - 1) for u in us]
                check(np.all(np.abs(vals) <= 0.5), "%s: |w| <= 0.5" % name)
            elif recipe == "dt_bias":
                want = [-4 + 4 * u for u in us]
                check(vals.min() >= -4 and vals.max() <= 0, "%s: dt_bias in [-4, 0]" % name)
            elif recipe == "bias":
                want = [0.02 * (2 * u - 1) for u in us]
                check(np.all(np.abs(vals) <= 0.0201), "%s: bias in [-0.02, 0.02]" % name)
            elif recipe == "score_bias":
                want = [0.1 * (2 * u - 1) for u in us]
                check(np.all(np.abs(vals) <= 0.1001), "%s: bias in [-0.1, 0.1]" % name)
            elif recipe == "a_log":
                heads = t["linear_attn_config"]["num_heads"]
                want = [math.log(1 + 15 * u) if i < heads else 0.0 for i, u in enumerate(us)]
                check(np.all(vals[heads:] == 0) and np.all(vals[:heads] >= 0),
                      "%s: A_log entries past %d heads are exactly 0" % (name, heads))
            bits = [bf16_bits(w) for w in want] if dt == "BF16" else [f32_bits(w) for w in want]
            have = (list(np.frombuffer(raw, dtype="<u2")[:k]) if dt == "BF16"
                    else list(np.frombuffer(raw, dtype="<u4")[:k]))
            check([int(h) for h in have] == bits, "%s: values follow the seed rule (seed %d)" % (name, seed))


def check_experts(where, t):
    E, L, I = t["num_experts"], t["routed_expert_hidden_size"], t["moe_intermediate_size"]
    span = 3 * I * L * 17 // 32
    recs = ["w1.weight_packed", "w1.weight_scale", "w2.weight_packed", "w2.weight_scale",
            "w3.weight_packed", "w3.weight_scale"]
    for i in range(t["first_k_dense_replace"], t["num_hidden_layers"]):
        m = PFX + "model.layers.%d.block_sparse_moe.experts." % i
        spans = []
        for e in range(E):
            ents = [where[m + "%d.%s" % (e, r)] for r in recs]
            check(len(set(s for s, _ in ents)) == 1, "layer %d expert %d in one shard" % (i, e))
            for a, b in zip(ents, ents[1:]):
                check(a[1][4] == b[1][3], "layer %d expert %d: records back to back" % (i, e))
            check(ents[-1][1][4] - ents[0][1][3] == span,
                  "layer %d expert %d spans %d bytes" % (i, e, span))
            spans.append((ents[0][1][3], str(e), ents[0][0]))
        spans.sort()
        check([s[1] for s in spans] == sorted(str(e) for e in range(E)),
              "layer %d: experts in lexicographic name order" % i)
        check(len(set(s[2] for s in spans)) == 1, "layer %d: experts in one shard" % i)
        check(all(b[0] - a[0] == span for a, b in zip(spans, spans[1:])),
              "layer %d: experts form one gap-free run" % i)


def check_tokenizer(d, t):
    V = t["vocab_size"]
    base = V - 256
    lines = open(os.path.join(d, "tiktoken.model"), "rb").read().split(b"\n")
    check(lines[-1] == b"", "tiktoken.model ends with a newline")
    lines = lines[:-1]
    check(len(lines) == base, "tiktoken.model has %d ranks" % base)
    seen = set()
    for r, line in enumerate(lines):
        b64, rank = line.split(b" ")
        tok = base64.b64decode(b64, validate=True)
        check(int(rank) == r, "rank %d is contiguous" % r)
        if r < 256:
            check(tok == bytes([r]), "rank %d is the single byte %d" % (r, r))
        elif r >= 768:
            k = r - 768
            check(tok == bytes([0xF8 + (k >> 16), (k >> 8) & 255, k & 255]),
                  "padding rank %d is its three inert bytes" % r)
        else:
            check(len(tok) >= 2, "merge rank %d has at least two bytes" % r)
        check(tok not in seen, "rank %d's bytes are unique" % r)
        seen.add(tok)
    tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
    want = {base: "[BOS]", base + 1: "[EOS]", base + 2: "<|end_of_msg|>", base + 3: "<|open|>",
            base + 4: "<|close|>", base + 5: "<|sep|>", V - 1: "[PAD]"}
    dec = tc.get("added_tokens_decoder", {})
    check({int(k): v["content"] for k, v in dec.items()} == want, "added_tokens_decoder ids and spellings")
    check(all(v.get("special") is True for v in dec.values()), "added tokens are special")
    check(tc.get("bos_token") == "[BOS]" and tc.get("pad_token") == "[PAD]", "bos/pad token spellings")
    check(t["bos_token_id"] == base and t["eos_token_id"] == base + 2 and t["pad_token_id"] == V - 1,
          "token ids follow K3's offsets")


def check_config(cfg):
    t = cfg["text_config"]
    check(cfg.get("architectures") == ["KimiK3ForConditionalGeneration"], "architectures")
    check(cfg.get("model_type") == "kimi_k3", "model_type kimi_k3")
    check(isinstance(cfg.get("vision_config"), dict), "vision_config present")
    keys = """model_type dtype hidden_act hidden_size vocab_size max_position_embeddings
        num_hidden_layers first_k_dense_replace moe_layer_freq intermediate_size num_experts
        num_experts_per_token num_shared_experts moe_intermediate_size routed_expert_hidden_size
        moe_router_activation_func topk_method use_grouped_topk num_expert_group topk_group
        moe_renormalize routed_scaling_factor latent_moe_use_norm activation_situ_beta
        activation_situ_linear_beta num_attention_heads num_key_value_heads q_lora_rank
        kv_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim mla_use_nope mla_use_output_gate
        attn_res_block_size rms_norm_eps num_nextn_predict_layers use_cache tie_word_embeddings
        bos_token_id eos_token_id pad_token_id linear_attn_config quantization_config""".split()
    for k in keys:
        check(k in t, "text_config.%s present" % k)
    la = t["linear_attn_config"]
    for k in "num_heads head_dim short_conv_kernel_size gate_lower_bound use_full_rank_gate kda_layers full_attn_layers".split():
        check(k in la, "linear_attn_config.%s present" % k)
    q = t["quantization_config"]
    w = q["config_groups"]["group_0"]["weights"]
    check(q["quant_method"] == "compressed-tensors" and q["format"] == "mxfp4-pack-quantized"
          and w["num_bits"] == 4 and w["group_size"] == 32 and w["scale_dtype"] == "torch.uint8",
          "quantization_config")
    check("re:.*self_attn.*" in q["ignore"] and "re:.*shared_experts.*" in q["ignore"], "ignore list")
    n = t["num_hidden_layers"]
    want_mla = [i for i in range(2, n + 1) if i % 4 == 0 or i >= n - 1]
    check(la["full_attn_layers"] == want_mla, "MLA on every 4th layer and the last two: %s" % want_mla)
    check(t["num_experts_per_token"] <= t["num_experts"], "top-k <= experts")


def check_stinfo(stinfo, path, ents):
    r = subprocess.run([stinfo, path], capture_output=True, text=True)
    check(r.returncode == 0, "stinfo %s exits 0 (%s)" % (path, r.stderr.strip()))
    got = [l for l in r.stdout.splitlines() if not l.startswith("#")]
    want = ["%s %s [%s] %d %d" % (n, dt, ",".join(str(x) for x in sh), b, e) for n, dt, sh, b, e in ents]
    check(got == want, "stinfo listing of %s equals the checker's" % os.path.basename(path))
    r = subprocess.run([stinfo, "--json", path], capture_output=True, text=True)
    j = json.loads(r.stdout)
    check([(t["name"], t["dtype"], t["shape"], t["begin"], t["end"]) for t in j["tensors"]]
          == [(n, dt, sh, b, e) for n, dt, sh, b, e in ents], "stinfo --json of %s" % path)


def main():
    args = sys.argv[1:]
    layout_only = "--layout-only" in args
    args = [a for a in args if a != "--layout-only"]
    stinfo = None
    if "--stinfo" in args:
        i = args.index("--stinfo")
        stinfo = args[i + 1]
        del args[i:i + 2]
    d = args[0]
    cfg = json.load(open(os.path.join(d, "config.json")))
    t = cfg["text_config"]
    seed = cfg.get("mkmodel_seed", 0)
    check_config(cfg)
    exp = expected_tensors(cfg)
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    shards = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    check(not [f for f in os.listdir(d) if f.endswith(".partial")], "no partial files left")
    ns = len(shards)
    check(shards == ["model-%05d-of-%06d.safetensors" % (i, ns) for i in range(1, ns + 1)],
          "shard names model-NNNNN-of-NNNNNN: %s" % shards)
    nl = t["num_hidden_layers"]
    per = 4 if cfg.get("mkmodel_preset") in ("tiny", "oracle") else 1   # oracle: tiny's files
    check(ns == (nl + per - 1) // per + 1 + (2 if k3(cfg) else 0), "%d shards for %d layers" % (ns, nl))
    where = {}
    total = 0
    for s in shards:
        ents = read_shard(os.path.join(d, s))
        if stinfo:
            check_stinfo(stinfo, os.path.join(d, s), ents)
        for e in ents:
            check(e[0] not in where, "%s appears once" % e[0])
            where[e[0]] = (s, e)
            total += e[4] - e[3]
            want = shard_of(e[0], shards, nl, per)
            check(s == want, "%s is in %s (found in %s)" % (e[0], want, s))
    check(set(where) == set(exp), "tensor set matches config: missing %s, extra %s" %
          (sorted(set(exp) - set(where))[:5], sorted(set(where) - set(exp))[:5]))
    for name, (dt, shape, _) in exp.items():
        if name in where:
            ent = where[name][1]
            check(ent[1] == dt and ent[2] == shape, "%s is %s %s (found %s %s)" % (name, dt, shape, ent[1], ent[2]))
    check(idx["metadata"]["total_size"] == total, "index total_size %d" % total)
    check(idx["weight_map"] == {n: s for n, (s, _) in where.items()}, "index weight_map covers every tensor")
    check_experts(where, t)
    check_tokenizer(d, t)
    if not failures and not layout_only:
        check_values(d, where, exp, seed, t, k3(cfg))
    if failures:
        for f in failures[:40]:
            print("FAIL:", f)
        print("%d checks failed" % len(failures))
        return 1
    print("mkmodel_check: %s ok (%d tensors in %d shards, seed %d)" % (d, len(where), ns, seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
