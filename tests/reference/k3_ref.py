#!/usr/bin/python3
"""k3_ref.py - an independent float64 numpy forward pass of Kimi K3.

Written from /work/shared/specs/k3.md (sections 1-3 and 6) and the
safetensors layout of /work/shared/specs/hf-hub.md section 5, not from any C
code, so that the C engine can be checked against it layer by layer
(DESIGN.md decision 10).  Every weight is widened to float64 and every
activation is float64; see README.md in this folder for the flags, the dump
formats and the decisions taken on the points the spec marks as disputed.

As a program:

    k3_ref.py MODEL_DIR --tokens 1,2,3 [--max-tokens N] [--dump-hidden F.npy]
              [--dump-logits F] [--json] [--alog per-head|per-channel]
              [--mla-eps E] [--l2 fla|max] [--stop-at-eos] [--no-weight-cache]

runs the prompt one token at a time, then decodes greedily; the last line of
stdout is the generated ids separated by spaces.

As a module:

    model = load_model(dir)
    state = new_state(model)
    logits, per_layer_hidden = forward_token(model, state, token_id)
"""

import argparse
import collections
import json
import math
import os
import struct
import sys

import numpy as np

# ---------------------------------------------------------------------------
# safetensors (hf-hub.md section 5)
#
#   offset 0      u64 little-endian N
#   offset 8      N bytes of UTF-8 JSON, may start and end with whitespace
#   offset 8+N    data buffer; each tensor's data_offsets [B, E) are relative
#                 to 8+N, contiguous from 0 without holes
# ---------------------------------------------------------------------------

SAFETENSORS_HEADER_MAX = 100_000_000

# dtype name -> bits per element (hf-hub.md section 5)
DTYPE_BITS = {
    "F64": 64, "I64": 64, "U64": 64, "C64": 64,
    "F32": 32, "I32": 32, "U32": 32,
    "F16": 16, "BF16": 16, "I16": 16, "U16": 16,
    "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F6_E2M3": 6, "F6_E3M2": 6,
    "F4": 4,
}

# dtypes whose raw elements numpy can view directly (BF16 as its bit pattern)
NUMPY_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "U64": "<u8", "I32": "<i4", "U32": "<u4",
    "I16": "<i2", "U16": "<u2", "I8": "i1", "U8": "u1", "BOOL": "?",
}


class SafetensorsError(ValueError):
    """A safetensors file or a model directory is malformed."""


class TensorInfo:
    """One header entry: dtype, shape and absolute file range [begin, end)."""

    def __init__(self, name, dtype, shape, begin, end):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(shape)
        self.begin = begin
        self.end = end


class SafetensorsFile:
    """A parsed safetensors file whose tensors are read through one memmap."""

    def __init__(self, path):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            first = f.read(8)
            if len(first) < 8:
                raise SafetensorsError(f"{path}: shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", first)
            if n > SAFETENSORS_HEADER_MAX:
                raise SafetensorsError(f"{path}: header length {n} over {SAFETENSORS_HEADER_MAX}")
            if 8 + n > size:
                raise SafetensorsError(f"{path}: header ends at {8 + n}, past the file end {size}")
            raw = f.read(n)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SafetensorsError(f"{path}: header is not UTF-8: {e}") from None
        if not text.lstrip(" \t\r\n").startswith("{"):
            raise SafetensorsError(f"{path}: header JSON does not start with '{{'")
        try:
            header = json.loads(text)
        except json.JSONDecodeError as e:
            raise SafetensorsError(f"{path}: header is not JSON: {e}") from None
        self.metadata = header.pop("__metadata__", {}) or {}
        self.data_start = 8 + n
        self.tensors = self._parse_entries(header, size - self.data_start)
        self._map = None
        if size > self.data_start:
            self._map = np.memmap(path, dtype=np.uint8, mode="r")

    def _parse_entries(self, header, data_size):
        entries = []
        for name, e in header.items():
            if not isinstance(e, dict):
                raise SafetensorsError(f"{self.path}: {name}: entry is not an object")
            dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
            if dtype not in DTYPE_BITS:
                raise SafetensorsError(f"{self.path}: {name}: unknown dtype {dtype!r}")
            if not isinstance(shape, list) or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise SafetensorsError(f"{self.path}: {name}: bad shape {shape!r}")
            if (not isinstance(offs, list) or len(offs) != 2
                    or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
                    or not 0 <= offs[0] <= offs[1]):
                raise SafetensorsError(f"{self.path}: {name}: bad data_offsets {offs!r}")
            bits = math.prod(shape) * DTYPE_BITS[dtype]
            if bits % 8:
                raise SafetensorsError(f"{self.path}: {name}: does not end on a byte boundary")
            if bits // 8 != offs[1] - offs[0]:
                raise SafetensorsError(
                    f"{self.path}: {name}: {offs[1] - offs[0]} bytes, shape needs {bits // 8}")
            entries.append((offs[0], offs[1], name, dtype, shape))
        entries.sort()
        expect = 0
        for b, end, name, _, _ in entries:
            if b != expect:
                raise SafetensorsError(
                    f"{self.path}: {name}: starts at {b}, expected {expect} (hole or overlap)")
            expect = end
        if expect > data_size:
            raise SafetensorsError(f"{self.path}: data ends at {expect}, file holds {data_size}")
        return {name: TensorInfo(name, dtype, shape, self.data_start + b, self.data_start + end)
                for b, end, name, dtype, shape in entries}

    def raw(self, name):
        """The tensor's stored elements, read-only, in its shape (BF16 as uint16)."""
        info = self.tensors[name]
        if info.dtype not in NUMPY_DTYPES:
            raise SafetensorsError(f"{self.path}: {name}: dtype {info.dtype} not supported")
        if info.end == info.begin:
            return np.zeros(info.shape, NUMPY_DTYPES[info.dtype])
        return self._map[info.begin:info.end].view(NUMPY_DTYPES[info.dtype]).reshape(info.shape)


# ---------------------------------------------------------------------------
# Number formats
# ---------------------------------------------------------------------------

def bf16_to_f64(bits):
    """BF16 bit patterns -> float64, widened exactly: (bits << 16) as f32."""
    b = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16
    return b.view(np.float32).astype(np.float64)


# e2m1 values of codes 0..15: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3
# the sign (k3.md section 2)
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
# a packed byte -> (value of the even column, value of the odd column):
# the low nibble comes first
_BYTE_PAIRS = np.stack([E2M1[np.arange(256) & 0x0F], E2M1[np.arange(256) >> 4]], axis=1)


def mxfp4_to_f64(packed, scale):
    """MXFP4 -> float64.  packed [R, C/2] u8, scale [R, C/32] u8 -> [R, C].

    Column j's code is the low nibble of packed[r][j/2] for even j and the
    high nibble for odd j; w = e2m1(code) * 2^(scale[r][j/32] - 127), built
    with ldexp, so scale 0 gives 2^-127 (not 0) and 255 gives 2^128.
    """
    packed = np.asarray(packed, dtype=np.uint8)
    scale = np.asarray(scale, dtype=np.uint8)
    rows, half = packed.shape
    cols = 2 * half
    if cols % 32 or scale.shape != (rows, cols // 32):
        raise ValueError(f"MXFP4: packed {packed.shape} does not match scale {scale.shape}")
    values = _BYTE_PAIRS[packed].reshape(rows, cols // 32, 32)     # one group per scale byte
    exps = (scale.astype(np.int32) - 127)[:, :, None]
    return np.ldexp(values, exps).reshape(rows, cols)


# ---------------------------------------------------------------------------
# Config (k3.md section 1) and the model directory
# ---------------------------------------------------------------------------

LANG_PREFIX = "language_model."
SKIP_PREFIXES = ("vision_tower.", "mm_projector.")


class Config:
    """The text_config values the forward pass uses, checked for support."""

    def __init__(self, tc):
        def get(key):
            if key not in tc:
                raise SafetensorsError(f"config.json text_config: missing {key}")
            return tc[key]

        self.hidden = get("hidden_size")
        self.vocab = get("vocab_size")
        self.layers = get("num_hidden_layers")
        self.eps = float(get("rms_norm_eps"))
        self.dense_inter = get("intermediate_size")
        self.first_dense = get("first_k_dense_replace")
        self.moe_freq = get("moe_layer_freq")
        self.situ_beta = float(get("activation_situ_beta"))
        self.situ_lin_beta = float(get("activation_situ_linear_beta"))
        self.block = get("attn_res_block_size")
        # MoE
        self.experts = get("num_experts")
        self.top_k = get("num_experts_per_token")
        self.moe_inter = get("moe_intermediate_size")
        self.latent = get("routed_expert_hidden_size")
        self.renormalize = bool(get("moe_renormalize"))
        self.routed_scale = float(get("routed_scaling_factor"))
        self.latent_norm = bool(get("latent_moe_use_norm"))
        self.shared_experts = get("num_shared_experts")
        # MLA
        self.mla_heads = get("num_attention_heads")
        self.q_lora = get("q_lora_rank")
        self.kv_lora = get("kv_lora_rank")
        self.nope = get("qk_nope_head_dim")
        self.rope = get("qk_rope_head_dim")
        self.v_dim = get("v_head_dim")
        self.output_gate = bool(get("mla_use_output_gate"))
        # KDA
        lac = get("linear_attn_config")
        self.kda_heads = lac["num_heads"]
        self.kda_dim = lac["head_dim"]
        self.conv_k = lac["short_conv_kernel_size"]
        self.gate_lower = float(lac["gate_lower_bound"])
        self.eos = tc.get("eos_token_id")

        unsupported = []
        if get("hidden_act") != "situ":
            unsupported.append("hidden_act != situ")
        if get("moe_router_activation_func") != "sigmoid":
            unsupported.append("router activation != sigmoid")
        if get("num_expert_group") != 1 or get("topk_group") != 1:
            unsupported.append("expert groups other than 1")
        if not get("mla_use_nope"):
            unsupported.append("MLA with RoPE")
        if self.q_lora is None:
            unsupported.append("MLA without q_lora_rank")
        if unsupported:
            raise NotImplementedError("k3_ref: unsupported config: " + ", ".join(unsupported))

        self.kinds = layer_schedule(lac["kda_layers"], lac["full_attn_layers"], self.layers)

    def is_moe(self, i):
        """DeepSeek-style rule: dense below first_k_dense_replace, then every moe_layer_freq."""
        return i >= self.first_dense and i % self.moe_freq == 0


def layer_schedule(kda_layers, full_attn_layers, n_layers):
    """'K'/'M' per 0-based layer from the config's 1-based lists."""
    kinds = [None] * n_layers
    for kind, lst in (("K", kda_layers), ("M", full_attn_layers)):
        for one_based in lst:
            i = one_based - 1
            if not 0 <= i < n_layers or kinds[i] is not None:
                raise SafetensorsError(f"layer lists: {one_based} out of range or listed twice")
            kinds[i] = kind
    if None in kinds:
        raise SafetensorsError(f"layer lists: layer {kinds.index(None) + 1} (1-based) in neither list")
    return "".join(kinds)


class Model:
    """A K3-family model directory, decoded lazily into float64.

    Names used here drop the 'language_model.' prefix.  Decoded tensors are
    kept for reuse unless cache_weights is False, which bounds memory by the
    largest tensor (for K3-sized checkpoints) at the cost of decoding again
    on every use.  Routed experts are decoded only when selected and kept in
    a least-recently-used cache of at most expert_cache_mb of float64
    (a K3-sized expert decodes to 252 MiB).
    """

    def __init__(self, model_dir, alog="per-head", mla_eps=1e-6, l2="fla", cache_weights=True,
                 expert_cache_mb=2048):
        if alog not in ("per-head", "per-channel"):
            raise ValueError(f"alog: {alog}")
        if l2 not in ("fla", "max"):
            raise ValueError(f"l2: {l2}")
        self.dir = model_dir
        self.alog = alog
        self.mla_eps = float(mla_eps)
        self.l2 = l2
        self.cache_weights = cache_weights
        with open(os.path.join(model_dir, "config.json")) as f:
            root = json.load(f)
        self.cfg = Config(root.get("text_config", root))
        self._files = {}
        self._where = {}
        self._cache = {}
        self._experts = collections.OrderedDict()
        self._expert_bytes = 0
        self._expert_limit = expert_cache_mb << 20 if cache_weights else 0
        self.experts_decoded = 0
        self.skipped = 0
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        else:
            single = "model.safetensors"
            weight_map = {k: single for k in self._file(single).tensors}
        for full, shard in weight_map.items():
            if full.startswith(SKIP_PREFIXES) or not full.startswith(LANG_PREFIX):
                self.skipped += 1
                continue
            self._where[full[len(LANG_PREFIX):]] = (shard, full)

    def _file(self, shard):
        f = self._files.get(shard)
        if f is None:
            f = SafetensorsFile(os.path.join(self.dir, shard))
            self._files[shard] = f
        return f

    def names(self):
        return sorted(self._where)

    def has(self, name):
        return name in self._where

    def raw(self, name):
        """Stored elements of a language tensor (name without the prefix)."""
        if name not in self._where:
            raise KeyError(f"tensor {LANG_PREFIX}{name} not in the weight map")
        shard, full = self._where[name]
        f = self._file(shard)
        if full not in f.tensors:
            raise SafetensorsError(f"{shard}: {full} listed in the index but not in the shard")
        return f.raw(full), f.tensors[full].dtype

    def w(self, name, shape):
        """A float-typed tensor as float64, checked against the expected shape."""
        got = self._cache.get(name)
        if got is None:
            raw, dtype = self.raw(name)
            if dtype == "BF16":
                got = bf16_to_f64(raw)
            elif dtype in ("F32", "F64", "F16"):
                got = np.asarray(raw, dtype=np.float64)
            else:
                raise SafetensorsError(f"{name}: dtype {dtype} is not a float weight")
            if self.cache_weights:
                self._cache[name] = got
        if got.shape != tuple(shape):
            raise SafetensorsError(f"{name}: shape {got.shape}, expected {tuple(shape)}")
        return got

    def embedding(self, token):
        """Row `token` of the embedding, without decoding the whole table."""
        c = self.cfg
        if not 0 <= token < c.vocab:
            raise ValueError(f"token {token} outside the vocabulary of {c.vocab}")
        raw, dtype = self.raw("model.embed_tokens.weight")
        if raw.shape != (c.vocab, c.hidden):
            raise SafetensorsError(f"embed_tokens: shape {raw.shape}")
        return bf16_to_f64(raw[token]) if dtype == "BF16" else np.asarray(raw[token], np.float64)

    def expert(self, layer, e):
        """(W1 [I, L], W2 [L, I], W3 [I, L]) of routed expert e of a layer.

        I is moe_intermediate_size and L routed_expert_hidden_size; W1 is
        the gate, W3 the up and W2 the down projection.  Decoded on first
        use and kept in the LRU cache while it fits.
        """
        key = (layer, e)
        got = self._experts.get(key)
        if got is not None:
            self._experts.move_to_end(key)
            return got
        c = self.cfg
        pre = f"model.layers.{layer}.block_sparse_moe.experts.{e}."
        shapes = {"w1": (c.moe_inter, c.latent), "w2": (c.latent, c.moe_inter),
                  "w3": (c.moe_inter, c.latent)}
        mats = []
        for w in ("w1", "w2", "w3"):
            packed, pdt = self.raw(pre + w + ".weight_packed")
            scale, sdt = self.raw(pre + w + ".weight_scale")
            if (pdt, sdt) != ("U8", "U8"):
                raise SafetensorsError(f"{pre}{w}: stored as {pdt}/{sdt}, expected U8/U8")
            m = mxfp4_to_f64(packed, scale)
            if m.shape != shapes[w]:
                raise SafetensorsError(f"{pre}{w}: decodes to {m.shape}, expected {shapes[w]}")
            mats.append(m)
        got = tuple(mats)
        self.experts_decoded += 1
        size = sum(m.nbytes for m in mats)
        if size <= self._expert_limit:
            while self._expert_bytes + size > self._expert_limit:
                _, old = self._experts.popitem(last=False)
                self._expert_bytes -= sum(m.nbytes for m in old)
            self._experts[key] = got
            self._expert_bytes += size
        return got


def load_model(model_dir, **options):
    """Open MODEL_DIR; options: alog, mla_eps, l2, cache_weights, expert_cache_mb (see Model)."""
    return Model(model_dir, **options)


# ---------------------------------------------------------------------------
# Elementwise pieces
# ---------------------------------------------------------------------------

def sigmoid(x):
    with np.errstate(over="ignore"):       # exp(-x) -> inf gives exactly 0
        return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rms_norm(x, w, eps):
    """w * x / sqrt(mean(x^2) + eps) over the last axis."""
    return w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def situ(g, u, beta, lin_beta):
    """SiTU(g, u) = [beta tanh(g/beta) sigma(g)] * [lin_beta tanh(u/lin_beta)]."""
    return (beta * np.tanh(g / beta) * sigmoid(g)) * (lin_beta * np.tanh(u / lin_beta))


def l2_normalize(x, mode):
    """Per row of x [H, D]: 'fla' x/sqrt(sum x^2 + 1e-6); 'max' x/max(|x|, 1e-12)."""
    ss = np.sum(x * x, axis=-1, keepdims=True)
    if mode == "fla":
        return x / np.sqrt(ss + 1e-6)
    return x / np.maximum(np.sqrt(ss), 1e-12)


# ---------------------------------------------------------------------------
# AttnRes (k3.md section 3.2)
# ---------------------------------------------------------------------------

def attn_res_mix(prefix, anchors, w_norm, w_proj, eps):
    """Softmax-weighted sum of V = anchors ++ [prefix] (raw vectors).

    score_i = sum_d V_i[d] w_norm[d] w_proj[d] / sqrt(mean(V_i^2) + eps).
    """
    v = np.stack(list(anchors) + [prefix])                  # [n, hidden]
    sw = w_norm * w_proj
    score = (v @ sw) / np.sqrt(np.mean(v * v, axis=1) + eps)
    return softmax(score) @ v


# ---------------------------------------------------------------------------
# KDA (k3.md section 3.3)
# ---------------------------------------------------------------------------

def short_conv_step(history, x, taps):
    """Causal depthwise conv of one step.

    history [K-1, P] holds the previous K-1 inputs, oldest first; x [P] is
    the current input (tap K-1); taps [P, K].  Returns (new history, y [P])
    with y[c] = sum_j taps[c][j] * window[j][c].
    """
    window = np.concatenate([history, x[None, :]], axis=0)  # [K, P]
    y = np.einsum("kp,pk->p", window, taps)
    return window[1:], y


def kda_recurrent_step(state, q, k, v, alpha, beta):
    """One delta-rule step for every head.

    state [H, Dk, Dv] (S[k][v]), q and k [H, Dk], v [H, Dv], alpha [H, Dk]
    (decay per key row), beta [H].  Decay first, then the delta update:
        S <- diag(alpha) S;  u = v - S^T k;  S <- S + beta k u^T;  o = S^T q
    Returns (new state, o [H, Dv]).
    """
    s = alpha[:, :, None] * state
    u = v - np.einsum("hkv,hk->hv", s, k)
    s = s + beta[:, None, None] * k[:, :, None] * u[:, None, :]
    o = np.einsum("hkv,hk->hv", s, q)
    return s, o


def kda_a(model, pre):
    """A = exp(A_log) shaped to broadcast over z [H, D].

    per-head (spec): A[h] = exp(A_log[h]) for the first H entries.
    per-channel (Deltafin's deviation): A[h][d] = exp(A_log[d]).
    """
    c = model.cfg
    raw, _ = model.raw(pre + "A_log")
    a_log = np.asarray(raw, dtype=np.float64).reshape(-1)
    if model.alog == "per-head":
        if a_log.size < c.kda_heads:
            raise SafetensorsError(f"{pre}A_log: {a_log.size} entries < {c.kda_heads} heads")
        return np.exp(a_log[:c.kda_heads])[:, None]
    if a_log.size < c.kda_dim:
        raise SafetensorsError(f"{pre}A_log: {a_log.size} entries < head_dim {c.kda_dim}")
    return np.exp(a_log[:c.kda_dim])[None, :]


def kda_forward(model, st, i, x):
    """KDA attention of layer i on the normed input x [hidden]; st is its state."""
    c = model.cfg
    hh, d = c.kda_heads, c.kda_dim
    p, n, kk = hh * d, c.hidden, c.conv_k
    pre = f"model.layers.{i}.self_attn."
    w = model.w

    convolved = []
    for name in ("q", "k", "v"):
        proj = w(pre + name + "_proj.weight", (p, n)) @ x                # [P]
        taps = w(pre + name + "_conv1d.weight", (p, 1, kk)).reshape(p, kk)
        st["conv_" + name], y = short_conv_step(st["conv_" + name], proj, taps)
        convolved.append(silu(y).reshape(hh, d))
    q, k, v = convolved
    q = l2_normalize(q, model.l2) * d ** -0.5
    k = l2_normalize(k, model.l2)

    z = w(pre + "f_b_proj.weight", (p, d)) @ (w(pre + "f_a_proj.weight", (d, n)) @ x)
    z = (z + w(pre + "dt_bias", (p,))).reshape(hh, d)
    alpha = np.exp(c.gate_lower * sigmoid(kda_a(model, pre) * z))  # in (e^lower, 1)
    beta = sigmoid(w(pre + "b_proj.weight", (hh, n)) @ x)            # [H]

    st["S"], o = kda_recurrent_step(st["S"], q, k, v, alpha, beta)
    gate = sigmoid(w(pre + "g_proj.weight", (p, n)) @ x).reshape(hh, d)
    y = rms_norm(o, w(pre + "o_norm.weight", (d,)), c.eps) * gate
    return w(pre + "o_proj.weight", (n, p)) @ y.reshape(p)


# ---------------------------------------------------------------------------
# Gated MLA, NoPE (k3.md section 3.4)
# ---------------------------------------------------------------------------

def mla_forward(model, st, i, x):
    """MLA attention of layer i on the normed input x; st caches c and r."""
    c = model.cfg
    hh, nope, rope, vd = c.mla_heads, c.nope, c.rope, c.v_dim
    n, ql, kl = c.hidden, c.q_lora, c.kv_lora
    pre = f"model.layers.{i}.self_attn."
    w = model.w

    qa = rms_norm(w(pre + "q_a_proj.weight", (ql, n)) @ x,
                  w(pre + "q_a_layernorm.weight", (ql,)), model.mla_eps)
    q = (w(pre + "q_b_proj.weight", (hh * (nope + rope), ql)) @ qa).reshape(hh, nope + rope)
    q_nope, q_x = q[:, :nope], q[:, nope:]

    kv = w(pre + "kv_a_proj_with_mqa.weight", (kl + rope, n)) @ x
    st["c"].append(rms_norm(kv[:kl], w(pre + "kv_a_layernorm.weight", (kl,)), model.mla_eps))
    st["r"].append(kv[kl:])
    cs = np.stack(st["c"])                                   # [T, kv_lora]
    rs = np.stack(st["r"])                                   # [T, rope]

    kv_b = w(pre + "kv_b_proj.weight", (hh * (nope + vd), kl)).reshape(hh, nope + vd, kl)
    w_uk, w_uv = kv_b[:, :nope, :], kv_b[:, nope:, :]
    k_nope = np.einsum("hnl,tl->htn", w_uk, cs)              # [H, T, nope]
    score = (np.einsum("hn,htn->ht", q_nope, k_nope) + q_x @ rs.T) / math.sqrt(nope + rope)
    prob = softmax(score, axis=1)                            # [H, T]
    o = np.einsum("hvl,hl->hv", w_uv, prob @ cs)             # [H, v]
    o = o.reshape(hh * vd)
    if c.output_gate:
        o = o * sigmoid(w(pre + "g_proj.weight", (hh * vd, n)) @ x)
    return w(pre + "o_proj.weight", (n, hh * vd)) @ o


# ---------------------------------------------------------------------------
# MLPs (k3.md section 3.5)
# ---------------------------------------------------------------------------

def dense_mlp(model, pre, x, inter):
    """down(SiTU(gate x, up x)) with gate/up [inter, hidden], down [hidden, inter]."""
    c = model.cfg
    w = model.w
    g = w(pre + "gate_proj.weight", (inter, c.hidden)) @ x
    u = w(pre + "up_proj.weight", (inter, c.hidden)) @ x
    return w(pre + "down_proj.weight", (c.hidden, inter)) @ situ(g, u, c.situ_beta, c.situ_lin_beta)


def moe_route(scores, bias, top_k, renormalize=True, scaling=1.0):
    """Top-k of scores + bias, ties to the lowest index (stable argsort).

    Returns (expert ids in routing order, their weights); a weight is
    s_e / (sum of selected s + 1e-20) * scaling when renormalizing.
    """
    order = np.argsort(-(scores + bias), kind="stable")[:top_k]
    sel = scores[order]
    weights = sel / (np.sum(sel) + 1e-20) if renormalize else sel
    return order, weights * scaling


def moe_forward(model, i, x, trace=None):
    """LatentMoE of layer i: routed experts in the latent space plus shared experts."""
    c = model.cfg
    n, lat = c.hidden, c.latent
    pre = f"model.layers.{i}.block_sparse_moe."
    w = model.w

    s = sigmoid(w(pre + "gate.weight", (c.experts, n)) @ x)
    ids, weights = moe_route(s, w(pre + "gate.e_score_correction_bias", (c.experts,)),
                             c.top_k, c.renormalize, c.routed_scale)
    if trace is not None:
        trace.append((i, [int(e) for e in ids]))
    z = w(pre + "routed_expert_down_proj.weight", (lat, n)) @ x       # [latent]
    u = np.zeros(lat)
    for e, we in zip(ids, weights):                                    # routing order
        w1, w2, w3 = model.expert(i, int(e))
        u = u + we * (w2 @ situ(w1 @ z, w3 @ z, c.situ_beta, c.situ_lin_beta))
    if c.latent_norm:
        u = rms_norm(u, w(pre + "routed_expert_norm.weight", (lat,)), c.eps)
    routed = w(pre + "routed_expert_up_proj.weight", (n, lat)) @ u
    # the shared experts are stored fused into one MLP this many rows wide
    shared = dense_mlp(model, pre + "shared_experts.", x, c.shared_experts * c.moe_inter)
    return routed + shared


# ---------------------------------------------------------------------------
# The whole pass (k3.md section 3.2)
# ---------------------------------------------------------------------------

class State:
    """Per-sequence state: KDA conv windows and recurrent state, MLA cache.

    AttnRes lists are per token and are not kept here.  tail_anchors,
    anchor_layers and routes describe the last forward_token call (for tests
    and tracing).
    """

    def __init__(self, model):
        c = model.cfg
        p = c.kda_heads * c.kda_dim
        self.pos = 0
        self.layers = []
        for kind in c.kinds:
            if kind == "K":
                st = {"conv_" + n: np.zeros((c.conv_k - 1, p)) for n in "qkv"}
                st["S"] = np.zeros((c.kda_heads, c.kda_dim, c.kda_dim))
            else:
                st = {"c": [], "r": []}
            self.layers.append(st)
        self.tail_anchors = 0
        self.anchor_layers = []
        self.routes = []


def new_state(model):
    return State(model)


def forward_token(model, state, token_id):
    """Run one token at position state.pos; returns (logits [vocab], hidden [layers, hidden])."""
    c = model.cfg
    n = c.hidden
    w = model.w
    h = model.embedding(token_id)
    anchors = []
    hidden = np.empty((c.layers, n))
    state.routes = []
    state.anchor_layers = []
    for i, kind in enumerate(c.kinds):
        pre = f"model.layers.{i}."
        res_norm = w(pre + "self_attention_res_norm.weight", (n,))
        res_proj = w(pre + "self_attention_res_proj.weight", (1, n))[0]
        a_in = attn_res_mix(h, anchors, res_norm, res_proj, c.eps) if anchors else h
        if i % c.block == 0:
            anchors.append(h)
            state.anchor_layers.append(i)
            prefix = np.zeros(n)
        else:
            prefix = h
        x = rms_norm(a_in, w(pre + "input_layernorm.weight", (n,)), c.eps)
        attend = kda_forward if kind == "K" else mla_forward
        prefix = prefix + attend(model, state.layers[i], i, x)

        m_in = attn_res_mix(prefix, anchors, w(pre + "mlp_res_norm.weight", (n,)),
                            w(pre + "mlp_res_proj.weight", (1, n))[0], c.eps)
        x = rms_norm(m_in, w(pre + "post_attention_layernorm.weight", (n,)), c.eps)
        if c.is_moe(i):
            mlp = moe_forward(model, i, x, state.routes)
        else:
            mlp = dense_mlp(model, pre + "mlp.", x, c.dense_inter)
        h = prefix + mlp
        hidden[i] = h

    y = attn_res_mix(h, anchors, w("model.output_attn_res_norm.weight", (n,)),
                     w("model.output_attn_res_proj.weight", (1, n))[0], c.eps)
    state.tail_anchors = len(anchors)
    y = rms_norm(y, w("model.norm.weight", (n,)), c.eps)
    logits = w("lm_head.weight", (c.vocab, n)) @ y
    state.pos += 1
    return logits, hidden


def top2_margin(logits):
    top = np.partition(logits, -2)[-2:]
    return float(top[1] - top[0])


def generate(model, prompt, max_tokens, stop_at_eos=False):
    """Prompt token by token, then greedy decoding.

    Returns (generated ids, logits [n_generated, vocab] - the distribution
    each generated id was taken from, hidden [n_positions, layers, hidden]
    for every position run through the stack).
    """
    if not prompt:
        raise ValueError("empty prompt")
    state = new_state(model)
    hidden = []
    logits = None
    for t in prompt:
        logits, hid = forward_token(model, state, t)
        hidden.append(hid)
    out, out_logits = [], []
    for step in range(max_tokens):
        if step > 0:
            logits, hid = forward_token(model, state, out[-1])
            hidden.append(hid)
        out_logits.append(logits)
        out.append(int(np.argmax(logits)))     # first maximum on ties
        if stop_at_eos and out[-1] == model.cfg.eos:
            break
    vocab = model.cfg.vocab
    return out, np.array(out_logits).reshape(-1, vocab), np.stack(hidden)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

def parse_tokens(text):
    try:
        return [int(t) for t in text.split(",") if t.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens: not a comma-separated id list: {text}") from None


def main(argv=None):
    ap = argparse.ArgumentParser(description="float64 numpy reference forward pass of Kimi K3")
    ap.add_argument("model_dir")
    ap.add_argument("--tokens", type=parse_tokens, required=True, help="prompt ids, e.g. 1,2,3")
    ap.add_argument("--max-tokens", type=int, default=16, help="greedy steps (default 16)")
    ap.add_argument("--dump-hidden", metavar="FILE.npy",
                    help="float64 [positions, layers, hidden] layer outputs")
    ap.add_argument("--dump-logits", metavar="FILE",
                    help="raw little-endian float32, vocab_size values per generated position")
    ap.add_argument("--json", action="store_true",
                    help="print {prompt_tokens, tokens, top2_margins} before the ids line")
    ap.add_argument("--alog", choices=("per-head", "per-channel"), default="per-head")
    ap.add_argument("--mla-eps", type=float, default=1e-6, help="q_a/kv_a norm eps (default 1e-6)")
    ap.add_argument("--l2", choices=("fla", "max"), default="fla")
    ap.add_argument("--stop-at-eos", action="store_true", help="stop after eos_token_id")
    ap.add_argument("--no-weight-cache", action="store_true",
                    help="decode tensors on every use (bounded memory, slow)")
    ap.add_argument("--expert-cache-mb", type=int, default=2048,
                    help="float64 routed experts kept decoded (default 2048)")
    a = ap.parse_args(argv)
    if a.max_tokens < 0:
        ap.error("--max-tokens must be >= 0")
    if not a.tokens:
        ap.error("--tokens: empty prompt")

    try:
        model = load_model(a.model_dir, alog=a.alog, mla_eps=a.mla_eps, l2=a.l2,
                           cache_weights=not a.no_weight_cache,
                           expert_cache_mb=a.expert_cache_mb)
        for t in a.tokens:
            if not 0 <= t < model.cfg.vocab:
                ap.error(f"--tokens: {t} outside the vocabulary of {model.cfg.vocab}")
        out, logits, hidden = generate(model, a.tokens, a.max_tokens, a.stop_at_eos)
    except (OSError, SafetensorsError, KeyError, NotImplementedError) as e:
        print(f"k3_ref: {e}", file=sys.stderr)
        return 1

    if a.dump_logits:
        logits.astype("<f4").tofile(a.dump_logits)
    if a.dump_hidden:
        np.save(a.dump_hidden, hidden.astype("<f8"))
    if a.json:
        print(json.dumps({"prompt_tokens": a.tokens, "tokens": out,
                          "top2_margins": [top2_margin(lg) for lg in logits]}))
    print(" ".join(str(t) for t in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
