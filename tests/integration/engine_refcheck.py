#!/usr/bin/python3
"""engine_refcheck.py - compare shoal-engine's dumps with tests/reference/k3_ref.py.

Used by tests/integration/test_engine_*.sh.  Runs the float64 reference
in-process on the same prompt (same greedy loop as k3_ref.py's CLI), reads
the engine's --dump-hidden (.npy [positions, layers, hidden]) and
--dump-logits (float32 [generated, vocab]) and checks them.

Checks:
  layers  teacher-forced: each layer (and the head) run by the reference on
          the engine's own inputs (its output of the layer before, its
          anchors, its history through that layer's state), so errors do not
          compound; --tol bounds the max over positions, --tol-median the
          median.
  e2e     free-running greedy generation compared as a whole: greedy ids
          must agree for every step until the reference's top-2 margin first
          drops below --margin, and for at least --min-steps steps; per-layer
          hidden states and logits over the agreeing steps within
          max(--tol, 4 x floor), where floor is how far the reference itself
          moves when every weight gets f32-rounding-sized noise (relative
          6e-8, two draws).  tiny-k3's random weights amplify such noise up
          to ~1e3x by the last layers (mostly through the attention
          sublayers), so a fixed 1e-5 holds in the first layers only; the
          floor says how much the model itself permits.

References (--ref):
  f64   the float64 reference as is.
  int8  the reference with the engine's int8 numerics emulated in float64:
        every int8 spine matrix replaced by its per-row quantized values
        (scale = max|w|/127, q = rint(w*127/max|w|), computed in float32 as
        kernels/quant.c does), activations of those products quantized per
        32 the same way, and with --experts fast the routed experts' z and
        SiTU(h) quantized per 32.  What is left is f32 vs f64 arithmetic,
        plus rare activations whose rounding flips (a value within f32 noise
        of a rounding boundary), one int8 step each.
  int4  the same with the engine's int4 spine (--spine int4,
        common/k3_sizes.h): KDA q/k/v/g/o, the shared experts, the latent
        down/up and the dense MLP replaced by their int4 values (per group
        of 32 columns, scale = bf16(max|w|/7) rounded to nearest even, q =
        rint(w * (1/scale)) clamped to +-7, in float32 as
        engine/kernels/q4.c), MLA and lm_head int8 as above, routers and
        the gate path f32; activations quantized per 32 as for int8.

Exit 0 when every check passes, 1 otherwise; prints one line per check.
"""

import argparse
import json
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import k3_ref  # noqa: E402

F32 = np.float32


def q8_rows(w):
    """Per-row int8 quantization as kernels/quant.c, dequantized to float64."""
    w = np.asarray(w, dtype=F32)
    amax = np.abs(w).max(axis=1)
    scale = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.clip(np.rint((w * inv[:, None]).astype(F32)), -127, 127)
    return scale.astype(np.float64)[:, None] * q


def q8_act(x):
    """Per-32 activation quantization as kernels_act_quantize, dequantized."""
    x = np.asarray(x, dtype=F32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / F32(127)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.clip(np.rint((x * inv[:, None]).astype(F32)), -127, 127)
    return (d.astype(np.float64)[:, None] * q).reshape(-1)


def bf16_round(x):
    """float32 to the nearest BF16 (ties to even), as float32 (q4.c's bf16_round)."""
    b = np.asarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(F32)


def q4_groups(w):
    """Per-32-column int4 quantization as engine/kernels/q4.c, dequantized."""
    w = np.asarray(w, dtype=F32)
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    amax = np.abs(g).max(axis=2)
    scale = bf16_round((amax / F32(7)).astype(F32))
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, F32(1) / scale, F32(0)).astype(F32)
    q = np.clip(np.rint((g * inv[:, :, None]).astype(F32)), -7, 7)
    return (scale.astype(np.float64)[:, :, None] * q).reshape(rows, cols)


class QMat:
    """An int8 (or int4) spine matrix: W' @ q8_act(x)."""

    def __init__(self, w, int4=False):
        self.w = q4_groups(w) if int4 else q8_rows(w)
        self.shape = self.w.shape

    def __matmul__(self, x):
        return self.w @ q8_act(x)


# products that stay f32 in the engine's int8 spine (engine/forward/model.c)
F32_NAMES = (".gate.weight", ".f_a_proj.weight", ".f_b_proj.weight", ".b_proj.weight")


def int4_part(model, name):
    """Is `name` one of the matrices the int4 spine keeps in int4
    (common/k3_sizes.h: KDA q/k/v/g/o, shared experts, latent down/up,
    dense MLP)?"""
    if ".shared_experts." in name or "routed_expert_down_proj" in name \
            or "routed_expert_up_proj" in name or ".mlp." in name:
        return True
    if ".self_attn." in name and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight",
                                                 "g_proj.weight", "o_proj.weight")):
        layer = int(name.split(".")[2])
        return model.cfg.kinds[layer] == "K"
    return False


def emulate_int8(model, experts_fast, int4=False):
    orig = model.w
    cache = {}

    def w(name, shape):
        got = cache.get(name)
        if got is None:
            got = orig(name, shape)
            if (got.ndim == 2 and got.shape[0] > 1 and got.shape[1] % 32 == 0
                    and not name.endswith(F32_NAMES) and "res_proj" not in name
                    and "kv_b_proj" not in name):
                got = QMat(got, int4 and int4_part(model, name))
            cache[name] = got
        return got

    model.w = w
    model.qcache = cache
    k3_ref.mla_forward = mla_forward_int8
    if experts_fast:
        k3_ref.moe_forward = moe_forward_fast


def mla_forward_int8(model, st, i, x):
    """k3_ref.mla_forward with the engine's absorbed int8 products."""
    c = model.cfg
    hh, nope, rope, vd = c.mla_heads, c.nope, c.rope, c.v_dim
    n, ql, kl = c.hidden, c.q_lora, c.kv_lora
    pre = f"model.layers.{i}.self_attn."
    w = model.w
    qa = k3_ref.rms_norm(w(pre + "q_a_proj.weight", (ql, n)) @ x,
                         w(pre + "q_a_layernorm.weight", (ql,)), model.mla_eps)
    q = (w(pre + "q_b_proj.weight", (hh * (nope + rope), ql)) @ qa).reshape(hh, nope + rope)
    kv = w(pre + "kv_a_proj_with_mqa.weight", (kl + rope, n)) @ x
    st["c"].append(k3_ref.rms_norm(kv[:kl], w(pre + "kv_a_layernorm.weight", (kl,)), model.mla_eps))
    st["r"].append(kv[kl:])
    cs, rs = np.stack(st["c"]), np.stack(st["r"])
    key = pre + "kv_b_split"
    if key not in model.qcache:
        kv_b = w(pre + "kv_b_proj.weight", (hh * (nope + vd), kl)).reshape(hh, nope + vd, kl)
        ukt = [kv_b[h, :nope, :].T for h in range(hh)]              # [kl, nope]
        ukt = [QMat(m) if nope % 32 == 0 else m for m in ukt]
        uv = [QMat(kv_b[h, nope:, :]) if kl % 32 == 0 else kv_b[h, nope:, :] for h in range(hh)]
        model.qcache[key] = (ukt, uv)
    ukt, uv = model.qcache[key]
    o = []
    for h in range(hh):
        q_abs = ukt[h] @ q[h, :nope]
        score = (cs @ q_abs + rs @ q[h, nope:]) / math.sqrt(nope + rope)
        ctx = k3_ref.softmax(score) @ cs
        o.append(uv[h] @ ctx)
    o = np.concatenate(o)
    o = o * k3_ref.sigmoid(w(pre + "g_proj.weight", (hh * vd, n)) @ x)
    return w(pre + "o_proj.weight", (n, hh * vd)) @ o


def moe_forward_fast(model, i, x, trace=None):
    """k3_ref.moe_forward with the experts' activations quantized per 32."""
    c = model.cfg
    n, lat = c.hidden, c.latent
    pre = f"model.layers.{i}.block_sparse_moe."
    w = model.w
    s = k3_ref.sigmoid(w(pre + "gate.weight", (c.experts, n)) @ x)
    ids, weights = k3_ref.moe_route(s, w(pre + "gate.e_score_correction_bias", (c.experts,)),
                                    c.top_k, c.renormalize, c.routed_scale)
    z = q8_act(w(pre + "routed_expert_down_proj.weight", (lat, n)) @ x)
    u = np.zeros(lat)
    for e, we in zip(ids, weights):
        w1, w2, w3 = model.expert(i, int(e))
        h = k3_ref.situ(w1 @ z, w3 @ z, c.situ_beta, c.situ_lin_beta)
        u = u + we * (w2 @ q8_act(h))
    if c.latent_norm:
        u = k3_ref.rms_norm(u, w(pre + "routed_expert_norm.weight", (lat,)), c.eps)
    routed = w(pre + "routed_expert_up_proj.weight", (n, lat)) @ u
    shared = k3_ref.dense_mlp(model, pre + "shared_experts.", x, c.shared_experts * c.moe_inter)
    return routed + shared


def perturb(model, noise, seed):
    """Multiply every float weight by (1 + noise * N(0,1)): an f32-rounding-sized
    disturbance, to measure how much the model amplifies it."""
    rng = np.random.default_rng(seed)
    inner = model.w
    cache = {}

    def w(name, shape):
        got = cache.get(name)
        if got is None:
            got = inner(name, shape)
            if isinstance(got, QMat):
                q = QMat.__new__(QMat)
                q.w = got.w * (1 + noise * rng.standard_normal(got.w.shape))
                q.shape = got.shape
                got = q
            else:
                got = got * (1 + noise * rng.standard_normal(got.shape))
            cache[name] = got
        return got

    model.w = w


def run_ref(model_dir, tokens, max_tokens, mode, experts_fast, noise=0.0, seed=0):
    saved = (k3_ref.mla_forward, k3_ref.moe_forward)
    try:
        model = k3_ref.load_model(model_dir)
        if mode in ("int8", "int4"):
            emulate_int8(model, experts_fast, mode == "int4")
        if noise:
            perturb(model, noise, seed)
        out, logits, hidden = k3_ref.generate(model, tokens, max_tokens)
    finally:
        k3_ref.mla_forward, k3_ref.moe_forward = saved
    return out, logits, hidden


def rel(a, b, axis):
    return np.linalg.norm(a - b, axis=axis) / np.maximum(np.linalg.norm(b, axis=axis), 1e-30)


def layer_step(model, st, i, h_in, anchors):
    """Layer i of k3.md 3.2 (steps 1-7) on one position: the body of
    k3_ref.forward_token's loop, with the input and anchors given."""
    c = model.cfg
    n = c.hidden
    w = model.w
    pre = f"model.layers.{i}."
    a_in = (k3_ref.attn_res_mix(h_in, anchors, w(pre + "self_attention_res_norm.weight", (n,)),
                                w(pre + "self_attention_res_proj.weight", (1, n))[0], c.eps)
            if anchors else h_in)
    if i % c.block == 0:
        anchors = anchors + [h_in]
        prefix = np.zeros(n)
    else:
        prefix = h_in
    x = k3_ref.rms_norm(a_in, w(pre + "input_layernorm.weight", (n,)), c.eps)
    attend = k3_ref.kda_forward if c.kinds[i] == "K" else k3_ref.mla_forward
    prefix = prefix + attend(model, st.layers[i], i, x)
    m_in = k3_ref.attn_res_mix(prefix, anchors, w(pre + "mlp_res_norm.weight", (n,)),
                               w(pre + "mlp_res_proj.weight", (1, n))[0], c.eps)
    x = k3_ref.rms_norm(m_in, w(pre + "post_attention_layernorm.weight", (n,)), c.eps)
    mlp = (k3_ref.moe_forward(model, i, x) if c.is_moe(i)
           else k3_ref.dense_mlp(model, pre + "mlp.", x, c.dense_inter))
    return prefix + mlp


def teacher_forced(model, fed, eng_hidden, n_prompt, n_logits):
    """Every layer run by the reference on the engine's own inputs (the
    engine's output of the layer before, its anchors, its history through
    that layer's state): per-layer errors without compounding.  Returns
    (hidden [positions, layers, D], logits [n_logits, V])."""
    c = model.cfg
    npos, nl = eng_hidden.shape[0], eng_hidden.shape[1]
    st = k3_ref.new_state(model)
    out = np.empty_like(eng_hidden)
    emb = [model.embedding(t) for t in fed[:npos]]

    def inp(p, i):
        return emb[p] if i == 0 else eng_hidden[p, i - 1]

    for i in range(nl):
        for p in range(npos):
            anchors = [inp(p, j) for j in range(0, i, c.block)]
            out[p, i] = layer_step(model, st, i, inp(p, i), anchors)
    w = model.w
    n = c.hidden
    logits = []
    for s in range(n_logits):
        p = n_prompt - 1 + s
        anchors = [inp(p, j) for j in range(0, nl, c.block)]
        y = k3_ref.attn_res_mix(eng_hidden[p, nl - 1], anchors,
                                w("model.output_attn_res_norm.weight", (n,)),
                                w("model.output_attn_res_proj.weight", (1, n))[0], c.eps)
        y = k3_ref.rms_norm(y, w("model.norm.weight", (n,)), c.eps)
        logits.append(w("lm_head.weight", (c.vocab, n)) @ y)
    return out, np.array(logits).reshape(-1, c.vocab)


def load_engine(a, vocab):
    eng_hidden = np.load(a.hidden)
    eng_logits = np.fromfile(a.logits, dtype="<f4").reshape(-1, vocab)
    eng_ids = [int(t) for t in a.ids.split()]
    return eng_hidden, eng_logits, eng_ids


class Checker:
    def __init__(self):
        self.ok = True

    def __call__(self, cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        self.ok = self.ok and bool(cond)


def check_layers(a, tokens, fast, check):
    """Teacher-forced per-layer and head comparison (see module doc)."""
    model = k3_ref.load_model(a.model_dir)
    saved = (k3_ref.mla_forward, k3_ref.moe_forward)
    try:
        if a.ref in ("int8", "int4"):
            emulate_int8(model, fast, a.ref == "int4")
        eng_hidden, eng_logits, eng_ids = load_engine(a, model.cfg.vocab)
        fed = tokens + eng_ids
        want = len(tokens) + max(len(eng_ids) - 1, 0)
        check(eng_hidden.shape == (want, model.cfg.layers, model.cfg.hidden)
              and eng_logits.shape[0] == len(eng_ids),
              f"engine dumps: hidden {eng_hidden.shape}, {eng_logits.shape[0]} logits rows "
              f"for {len(tokens)} prompt + {len(eng_ids)} generated tokens")
        if not check.ok:
            return
        ref_hidden, ref_logits = teacher_forced(model, fed, eng_hidden, len(tokens),
                                                eng_logits.shape[0])
    finally:
        k3_ref.mla_forward, k3_ref.moe_forward = saved
    eh = rel(eng_hidden, ref_hidden, 2)
    el = rel(eng_logits, ref_logits, 1) if len(ref_logits) else np.zeros(1)
    np.set_printoptions(precision=2, linewidth=160)
    print(f"     per-layer rel-L2, max over {eh.shape[0]} positions: {eh.max(axis=0)}")
    print(f"     per-layer rel-L2, median:                      {np.median(eh, axis=0)}")
    check(bool(np.all(eh.max(axis=0) <= a.tol)),
          f"every layer within rel-L2 {a.tol:g} of the {a.ref} reference on the engine's inputs")
    check(bool(np.all(np.median(eh, axis=0) <= a.tol_median)),
          f"every layer's median rel-L2 within {a.tol_median:g}")
    check(float(el.max()) <= a.tol_logits,
          f"logits rel-L2 {el.max():.3g} <= {a.tol_logits:g} over {len(el)} positions")
    if a.tol_cells is not None:
        over = float(np.mean(eh > a.tol_cells))
        check(over <= a.max_cells, f"{over:.1%} of the {eh.size} (position, layer) cells above "
              f"{a.tol_cells:g} (at most {a.max_cells:.0%}: activations whose int8 rounding flips)")
    argmax_same = sum(int(np.argmax(e) == np.argmax(r)) for e, r in zip(eng_logits, ref_logits))
    print(json.dumps({"check": "layers", "ref": a.ref, "layers_max": [float(v) for v in eh.max(axis=0)],
                      "logits_max": float(el.max()), "argmax_same": argmax_same,
                      "positions": int(eh.shape[0])}))


def check_e2e(a, tokens, fast, check):
    """Free-running comparison with a floor-based tolerance (see module doc)."""
    ref_ids, ref_logits, ref_hidden = run_ref(a.model_dir, tokens, a.max_tokens, a.ref, fast)
    floors = []
    for seed in (1, 2):
        _, fl, fh = run_ref(a.model_dir, tokens, a.max_tokens, a.ref, fast, 6e-8, seed)
        floors.append((rel(fh, ref_hidden, 2).max(axis=0), rel(fl, ref_logits, 1).max()))
    floor_h = np.maximum(floors[0][0], floors[1][0])
    floor_l = max(floors[0][1], floors[1][1])
    tol_h = np.maximum(a.tol, 4 * floor_h)
    tol_l = max(a.tol, 4 * floor_l)
    eng_hidden, eng_logits, eng_ids = load_engine(a, ref_logits.shape[1])
    check(eng_hidden.shape == ref_hidden.shape,
          f"hidden shape {eng_hidden.shape} == reference {ref_hidden.shape}")
    check(eng_logits.shape == ref_logits.shape,
          f"logits shape {eng_logits.shape} == reference {ref_logits.shape}")
    if not check.ok:
        return
    margins = [k3_ref.top2_margin(lg) for lg in ref_logits]
    clear = 0
    while clear < len(margins) and margins[clear] >= a.margin:
        clear += 1
    same = 0
    while same < min(len(eng_ids), len(ref_ids)) and eng_ids[same] == ref_ids[same]:
        same += 1
    check(same >= clear, f"greedy ids agree for {same} steps; reference margin >= {a.margin} "
          f"for the first {clear}")
    check(same >= a.min_steps, f"{same} identical greedy steps >= {a.min_steps} required")
    npos = len(tokens) + min(same, max(len(ref_ids) - 1, 0))
    nlog = min(same + 1, len(ref_ids))
    eh = rel(eng_hidden[:npos], ref_hidden[:npos], 2).max(axis=0)
    el = rel(eng_logits[:nlog], ref_logits[:nlog], 1).max() if nlog else 0.0
    np.set_printoptions(precision=2, linewidth=160)
    print(f"     per-layer rel-L2 (max over {npos} positions): {eh}")
    print(f"     reference floor (6e-8 weight noise):         {floor_h}")
    check(bool(np.all(eh <= tol_h)), f"per-layer hidden within max({a.tol:g}, 4 x floor)")
    check(el <= tol_l, f"logits rel-L2 {el:.3g} <= {tol_l:.3g} over {nlog} positions "
          f"(floor {floor_l:.3g})")
    print(json.dumps({"check": "e2e", "ref": a.ref, "layers_rel": [float(v) for v in eh],
                      "logits_rel": float(el), "floor": [float(v) for v in floor_h],
                      "same_steps": same, "clear_steps": clear}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--check", choices=("layers", "e2e"), required=True)
    ap.add_argument("--ref", choices=("f64", "int8", "int4"), default="f64",
                    help="plain float64 reference, or with the int8 / int4 spine emulated")
    ap.add_argument("--experts", choices=("fast", "exact"), default="exact")
    ap.add_argument("--tol", type=float, required=True)
    ap.add_argument("--tol-median", type=float, default=None,
                    help="bound on each layer's median over positions (default --tol)")
    ap.add_argument("--tol-logits", type=float, default=None,
                    help="bound on the logits (layers check; default --tol)")
    ap.add_argument("--hidden", required=True, help="engine --dump-hidden .npy")
    ap.add_argument("--logits", required=True, help="engine --dump-logits")
    ap.add_argument("--ids", required=True, help="engine's generated ids, space-separated")
    ap.add_argument("--tol-cells", type=float, default=None,
                    help="layers check: the share of (position, layer) cells above this ...")
    ap.add_argument("--max-cells", type=float, default=0.0, help="... is at most this")
    ap.add_argument("--margin", type=float, default=0.05)
    ap.add_argument("--min-steps", type=int, default=0)
    a = ap.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    if a.tol_median is None:
        a.tol_median = a.tol
    if a.tol_logits is None:
        a.tol_logits = a.tol
    check = Checker()
    if a.check == "layers":
        check_layers(a, tokens, a.experts == "fast", check)
    else:
        check_e2e(a, tokens, a.experts == "fast", check)
    return 0 if check.ok else 1


if __name__ == "__main__":
    sys.exit(main())
