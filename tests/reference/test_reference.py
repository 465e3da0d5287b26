#!/usr/bin/python3
"""Checks of k3_ref.py.  Run by tests/integration/test_reference.sh.

    test_reference.py [--model TINY_DIR] [unittest args]

Without --model only the checks that need no model run (formats, router,
KDA recurrence); with it, a tiny-k3 written by bin/mkmodel is loaded and run.
"""

import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import k3_ref  # noqa: E402

MODEL_DIR = None


def write_safetensors(path, header, data, pad_to=8, lead=b""):
    """Hand-build a safetensors file: u64le N, JSON (space padded), data."""
    j = lead + json.dumps(header).encode()
    j += b" " * ((-len(j)) % pad_to)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(j)))
        f.write(j)
        f.write(data)


class FakeKda:
    """Stands in for Model: one KDA layer of one head, head_dim 2, hidden 2."""

    def __init__(self, a_log, dt_bias):
        from types import SimpleNamespace
        self.cfg = SimpleNamespace(kda_heads=1, kda_dim=2, hidden=2, conv_k=4,
                                   gate_lower=-5.0, eps=1e-5)
        self.alog, self.l2 = "per-head", "fla"
        eye, zero = np.eye(2), np.zeros((2, 2))
        taps = np.zeros((2, 1, 4))
        taps[:, 0, 3] = 1.0
        p = "model.layers.0.self_attn."
        self.t = {p + "q_proj.weight": eye, p + "k_proj.weight": eye, p + "v_proj.weight": eye,
                  p + "q_conv1d.weight": taps, p + "k_conv1d.weight": taps,
                  p + "v_conv1d.weight": taps, p + "f_a_proj.weight": zero,
                  p + "f_b_proj.weight": zero, p + "dt_bias": np.array(dt_bias),
                  p + "A_log": np.array(a_log), p + "b_proj.weight": np.zeros((1, 2)),
                  p + "g_proj.weight": zero, p + "o_norm.weight": np.ones(2),
                  p + "o_proj.weight": eye}

    def w(self, name, shape):
        assert self.t[name].shape == tuple(shape), (name, shape)
        return self.t[name]

    def raw(self, name):
        return self.t[name].astype(np.float32), "F32"


class TestFormats(unittest.TestCase):
    def test_bf16(self):
        bits = np.array([0x3F80, 0xC000, 0x3F81, 0x4049, 0x0001, 0x7F80, 0xFF80, 0x8000], np.uint16)
        got = k3_ref.bf16_to_f64(bits)
        self.assertEqual(got.dtype, np.float64)
        want = [1.0, -2.0, 1.0 + 2.0 ** -7, 3.140625, 2.0 ** -133, math.inf, -math.inf, -0.0]
        self.assertEqual(list(got), want)
        self.assertTrue(math.copysign(1.0, got[7]) < 0)

    def test_mxfp4_codes_and_nibble_order(self):
        # byte i holds code 2i (low nibble) and 2i+1 (high): columns 0..15 = codes 0..15
        packed = np.zeros((1, 16), np.uint8)
        packed[0, :8] = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]
        got = k3_ref.mxfp4_to_f64(packed, np.array([[127]], np.uint8))
        want = [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]
        self.assertEqual(list(got[0, :16]), want)
        self.assertTrue(math.copysign(1.0, got[0, 8]) < 0)       # code 8 is -0
        self.assertEqual(list(got[0, 16:]), [0.0] * 16)

    def test_mxfp4_scales(self):
        # two rows of 64 columns: two scale groups per row
        packed = np.zeros((2, 32), np.uint8)
        packed[:, 0] = 0x9A        # col 0 = code 0xA = -1.0, col 1 = code 0x9 = -0.5
        packed[:, 15] = 0x27       # col 30 = 6.0, col 31 = 1.0 (last of group 0)
        packed[:, 16] = 0x02       # col 32 = 1.0 (first of group 1), col 33 = 0
        scale = np.array([[127, 128], [0, 255]], np.uint8)
        got = k3_ref.mxfp4_to_f64(packed, scale)
        self.assertEqual(got.shape, (2, 64))
        self.assertEqual(list(got[0, [0, 1, 30, 31, 32, 33]]), [-1.0, -0.5, 6.0, 1.0, 2.0, 0.0])
        # scale 0 is 2^-127 with ldexp (not the 0.0 of the bit trick); 255 is 2^128
        self.assertEqual(got[1, 0], -(2.0 ** -127))
        self.assertEqual(got[1, 31], 2.0 ** -127)
        self.assertNotEqual(got[1, 31], 0.0)
        self.assertEqual(got[1, 32], 2.0 ** 128)

    def test_mxfp4_shape_mismatch(self):
        with self.assertRaises(ValueError):
            k3_ref.mxfp4_to_f64(np.zeros((1, 16), np.uint8), np.zeros((1, 2), np.uint8))

    def test_safetensors_reader(self):
        f32 = struct.pack("<2f", 1.5, -2.0)
        bf = struct.pack("<4H", 0x3F80, 0x4000, 0xBF80, 0x0000)
        u8 = bytes([7, 8, 9])
        header = {   # JSON order differs from offset order on purpose
            "u": {"dtype": "U8", "shape": [3], "data_offsets": [16, 19]},
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]},
            "z": {"dtype": "F32", "shape": [0], "data_offsets": [19, 19]},
            "s": {"dtype": "U8", "shape": [], "data_offsets": [19, 20]},
        }
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.safetensors")
            write_safetensors(p, header, f32 + bf + u8 + b"\x05", lead=b"  ")
            st = k3_ref.SafetensorsFile(p)
            with open(p, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
            self.assertEqual(n % 8, 0)
            self.assertEqual(st.metadata, {"format": "pt"})
            self.assertEqual(st.tensors["b"].begin, 8 + n + 8)
            self.assertEqual(st.tensors["b"].end, 8 + n + 16)
            self.assertEqual(list(st.raw("a")), [1.5, -2.0])
            self.assertEqual(k3_ref.bf16_to_f64(st.raw("b")).tolist(), [[1.0, 2.0], [-1.0, 0.0]])
            self.assertEqual(list(st.raw("u")), [7, 8, 9])
            self.assertEqual(st.raw("z").shape, (0,))
            self.assertEqual(int(st.raw("s")), 5)

    def test_safetensors_rejects(self):
        good = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
        cases = {
            "hole": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 8),
            "size": ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, 8),
            "dtype": ({"a": {"dtype": "F12", "shape": [2], "data_offsets": [0, 8]}}, 8),
            "past end": (good, 4),
            "overlap": ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                         "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}}, 8),
        }
        with tempfile.TemporaryDirectory() as d:
            for what, (hdr, nbytes) in cases.items():
                p = os.path.join(d, what + ".safetensors")
                write_safetensors(p, hdr, bytes(nbytes))
                with self.assertRaises(k3_ref.SafetensorsError, msg=what):
                    k3_ref.SafetensorsFile(p)
            p = os.path.join(d, "long.safetensors")
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", 1000) + b"{}")
            with self.assertRaises(k3_ref.SafetensorsError):
                k3_ref.SafetensorsFile(p)
            p = os.path.join(d, "notobj.safetensors")
            with open(p, "wb") as f:
                f.write(struct.pack("<Q", 8) + b"[1,2]   ")
            with self.assertRaises(k3_ref.SafetensorsError):
                k3_ref.SafetensorsFile(p)


class TestMath(unittest.TestCase):
    def test_router_ties_go_to_lowest_index(self):
        # dyadic values so the sums are exact: s + bias = [.5, .875, .875, .125, .875, .6875],
        # a three-way tie on ids 1, 2 and 4
        s = np.array([0.5, 0.625, 0.75, 0.125, 0.875, 0.9375])
        bias = np.array([0.0, 0.25, 0.125, 0.0, 0.0, -0.25])
        ids, w = k3_ref.moe_route(s, bias, 2)
        self.assertEqual(list(ids), [1, 2])
        np.testing.assert_allclose(w, [0.625 / 1.375, 0.75 / 1.375], rtol=1e-15)
        ids, w = k3_ref.moe_route(s, bias, 4, renormalize=True, scaling=2.5)
        self.assertEqual(list(ids), [1, 2, 4, 5])
        np.testing.assert_allclose(w, 2.5 * np.array([.625, .75, .875, .9375]) / 3.1875, rtol=1e-15)
        # weights come from s, not s + bias
        ids, w = k3_ref.moe_route(s, bias, 2, renormalize=False)
        self.assertEqual(list(w), [0.625, 0.75])
        # tiny-k3 width: six tied leaders among 64 (a quicksort would reorder them)
        s = np.full(64, 0.5)
        s[[3, 9, 17, 40, 41, 60]] = 0.875
        ids, _ = k3_ref.moe_route(s, np.zeros(64), 4)
        self.assertEqual(list(ids), [3, 9, 17, 40])

    def test_l2_normalize(self):
        x = np.array([[3.0, 4.0], [1e-3, 0.0]])
        fla = k3_ref.l2_normalize(x, "fla")
        np.testing.assert_allclose(fla[0], np.array([3.0, 4.0]) / math.sqrt(25 + 1e-6), rtol=1e-15)
        np.testing.assert_allclose(fla[1], [1 / math.sqrt(2), 0.0], rtol=1e-12)   # eps = |x|^2
        mx = k3_ref.l2_normalize(x, "max")
        np.testing.assert_allclose(mx, [[0.6, 0.8], [1.0, 0.0]], rtol=1e-15)

    def test_kda_two_steps_by_hand(self):
        # one head, Dk = Dv = 2; expected values worked out on paper
        S = np.zeros((1, 2, 2))
        S, o = k3_ref.kda_recurrent_step(
            S, q=np.array([[1.0, 0.0]]), k=np.array([[1.0, 0.0]]), v=np.array([[2.0, 3.0]]),
            alpha=np.array([[0.5, 0.5]]), beta=np.array([0.5]))
        np.testing.assert_allclose(S[0], [[1.0, 1.5], [0.0, 0.0]], atol=1e-15)
        np.testing.assert_allclose(o[0], [1.0, 1.5], atol=1e-15)
        # step 2: decay rows by (.5, 1) -> [[.5,.75],[0,0]]; S^T k = [.3,.45];
        # u = [.7,-1.45]; S += k u^T -> [[.92,-.12],[.56,-1.16]]; o = S^T q = row 1
        S, o = k3_ref.kda_recurrent_step(
            S, q=np.array([[0.0, 1.0]]), k=np.array([[0.6, 0.8]]), v=np.array([[1.0, -1.0]]),
            alpha=np.array([[0.5, 1.0]]), beta=np.array([1.0]))
        np.testing.assert_allclose(S[0], [[0.92, -0.12], [0.56, -1.16]], atol=1e-14)
        np.testing.assert_allclose(o[0], [0.56, -1.16], atol=1e-14)

    def test_kda_delta_rule_overwrites(self):
        # no decay, beta 1, unit key: afterwards S^T k returns exactly v
        rng = np.random.default_rng(1)
        S = rng.standard_normal((3, 4, 5))
        k = rng.standard_normal((3, 4))
        k /= np.linalg.norm(k, axis=1, keepdims=True)
        v = rng.standard_normal((3, 5))
        S2, o = k3_ref.kda_recurrent_step(S, k, k, v, np.ones((3, 4)), np.ones(3))
        np.testing.assert_allclose(o, v, atol=1e-12)

    def test_kda_layer_on_crafted_weights(self):
        # one head of width 2 on a 2-wide input, weights chosen so every
        # intermediate is easy to write down: projections are the identity,
        # conv passes the current input, z = dt_bias, beta = gate = 1/2
        a_log = [0.5, 1.25]                  # exact in f32, as A_log is stored
        dt_bias = [0.5, -1.0]
        fake = FakeKda(a_log, dt_bias)
        silu = lambda t: t / (1 + math.exp(-t))
        sig = lambda t: 1 / (1 + math.exp(-t))
        xs = [np.array([1.0, -0.5]), np.array([0.25, 2.0])]
        e0, e1 = math.exp(0.5), math.exp(1.25)
        for alog, a_per_chan in (("per-head", [e0, e0]), ("per-channel", [e0, e1])):
            fake.alog = alog
            s_ref = [[0.0, 0.0], [0.0, 0.0]]
            st = {"conv_" + n: np.zeros((3, 2)) for n in "qkv"}
            st["S"] = np.zeros((1, 2, 2))
            for x in xs:
                got = k3_ref.kda_forward(fake, st, 0, x)
                f = [silu(x[0]), silu(x[1])]
                nf = math.sqrt(f[0] ** 2 + f[1] ** 2 + 1e-6)
                kk = [f[0] / nf, f[1] / nf]
                qq = [kk[0] / math.sqrt(2), kk[1] / math.sqrt(2)]
                alpha = [math.exp(-5 * sig(a_per_chan[d] * dt_bias[d])) for d in range(2)]
                s_ref = [[alpha[r] * s_ref[r][c] for c in range(2)] for r in range(2)]
                u = [f[c] - sum(s_ref[r][c] * kk[r] for r in range(2)) for c in range(2)]
                s_ref = [[s_ref[r][c] + 0.5 * kk[r] * u[c] for c in range(2)] for r in range(2)]
                o = [sum(s_ref[r][c] * qq[r] for r in range(2)) for c in range(2)]
                rms = math.sqrt((o[0] ** 2 + o[1] ** 2) / 2 + 1e-5)
                want = [0.5 * o[c] / rms for c in range(2)]
                np.testing.assert_allclose(st["S"][0], s_ref, rtol=1e-13, err_msg=alog)
                np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=alog)

    def test_kda_a_per_head_or_per_channel(self):
        fake = FakeKda([0.5, 1.25, 0.0], [0.0, 0.0])
        fake.cfg.kda_heads, fake.cfg.kda_dim = 2, 3     # A_log [D] holds H entries + padding
        a = k3_ref.kda_a(fake, "model.layers.0.self_attn.")
        np.testing.assert_allclose(a, [[math.exp(0.5)], [math.exp(1.25)]], rtol=1e-15)
        fake.alog = "per-channel"
        a = k3_ref.kda_a(fake, "model.layers.0.self_attn.")
        np.testing.assert_allclose(a, [[math.exp(0.5), math.exp(1.25), 1.0]], rtol=1e-15)

    def test_short_conv_tap_order(self):
        taps = np.array([[1.0, 10.0, 100.0, 1000.0]])        # tap 3 = current input
        hist = np.zeros((3, 1))
        outs = []
        for x in (1.0, 2.0, 3.0, 4.0, 5.0):
            hist, y = k3_ref.short_conv_step(hist, np.array([x]), taps)
            outs.append(y[0])
        self.assertEqual(outs, [1000.0, 2100.0, 3210.0, 4321.0, 5432.0])

    def test_attn_res_mix(self):
        v = np.array([1.0, -2.0, 3.0])
        w = np.ones(3)
        np.testing.assert_allclose(k3_ref.attn_res_mix(v, [], w, w, 1e-5), v)
        # anchor a scores sum(a)/rms(a); prefix p likewise; softmax mixes raw vectors
        a, p = np.array([2.0, 2.0, 2.0]), np.array([0.0, 0.0, 3.0])
        sa = 6.0 / math.sqrt(4.0 + 1e-5)
        sp = 3.0 / math.sqrt(3.0 + 1e-5)
        pa = math.exp(sa) / (math.exp(sa) + math.exp(sp))
        np.testing.assert_allclose(k3_ref.attn_res_mix(p, [a], w, w, 1e-5),
                                   pa * a + (1 - pa) * p, rtol=1e-14)

    def test_situ(self):
        g, u = 1.3, -0.7
        want = 4 * math.tanh(g / 4) / (1 + math.exp(-g)) * 25 * math.tanh(u / 25)
        self.assertAlmostEqual(float(k3_ref.situ(np.array(g), np.array(u), 4.0, 25.0)), want, 14)

    def test_schedule_from_one_based_lists(self):
        self.assertEqual(k3_ref.layer_schedule([1, 2, 3, 5, 6], [4, 7, 8], 8), "KKKMKKMM")
        with self.assertRaises(k3_ref.SafetensorsError):
            k3_ref.layer_schedule([1, 2, 3, 5], [4, 7, 8], 8)          # layer 6 missing
        with self.assertRaises(k3_ref.SafetensorsError):
            k3_ref.layer_schedule([1, 2, 3, 4, 5, 6], [4, 7, 8], 8)    # layer 4 twice


@unittest.skipIf(MODEL_DIR is None and "--model" not in sys.argv, "no --model given")
class TestTinyModel(unittest.TestCase):
    PROMPT = [5, 17, 300, 42, 767, 1, 99, 512]

    @classmethod
    def setUpClass(cls):
        cls.model = k3_ref.load_model(MODEL_DIR)

    def run_tokens(self, model, tokens):
        st = k3_ref.new_state(model)
        outs = [k3_ref.forward_token(model, st, t) for t in tokens]
        return st, outs

    def test_schedule_and_tail_anchors(self):
        c = self.model.cfg
        self.assertEqual(c.kinds, "KKKMKKMM")
        self.assertEqual([c.is_moe(i) for i in range(c.layers)], [False] + [True] * 7)
        st, _ = self.run_tokens(self.model, self.PROMPT[:1])
        self.assertEqual(st.tail_anchors, 3)
        self.assertEqual(st.anchor_layers, [0, 3, 6])

    def test_vision_skipped_and_every_tensor_reads(self):
        self.assertGreaterEqual(self.model.skipped, 1)
        self.assertFalse(any(n.startswith(("vision_tower", "mm_projector"))
                             for n in self.model.names()))
        for name in self.model.names():
            raw, dtype = self.model.raw(name)
            self.assertIn(dtype, ("BF16", "F32", "U8"), name)

    def test_checkpoint_properties_the_reference_relies_on(self):
        c = self.model.cfg
        a_log, _ = self.model.raw("model.layers.0.self_attn.A_log")
        self.assertEqual(a_log.shape, (c.kda_dim,))
        self.assertTrue(np.all(a_log[c.kda_heads:] == 0.0))   # K3's zero padding
        scale, _ = self.model.raw("model.layers.1.block_sparse_moe.experts.10.w2.weight_scale")
        self.assertTrue(np.all((scale >= 119) & (scale <= 123)))

    def test_forward_is_deterministic_and_finite(self):
        _, a = self.run_tokens(self.model, self.PROMPT)
        other = k3_ref.load_model(MODEL_DIR)
        _, b = self.run_tokens(other, self.PROMPT)
        for (la, ha), (lb, hb) in zip(a, b):
            self.assertEqual(la.shape, (self.model.cfg.vocab,))
            self.assertEqual(ha.shape, (self.model.cfg.layers, self.model.cfg.hidden))
            self.assertTrue(np.array_equal(la, lb))
            self.assertTrue(np.array_equal(ha, hb))
            self.assertTrue(np.all(np.isfinite(la)))
            self.assertTrue(np.all(np.isfinite(ha)))
        # the state carries context: the same token at a later position differs
        self.assertFalse(np.array_equal(a[0][0], self.run_tokens(
            self.model, [self.PROMPT[1], self.PROMPT[0]])[1][1][0]))

    def test_experts_decoded_lazily(self):
        m = k3_ref.load_model(MODEL_DIR)
        c = m.cfg
        st = k3_ref.new_state(m)
        routes, outs = [], []
        for t in self.PROMPT[:2]:
            outs.append(k3_ref.forward_token(m, st, t))
            self.assertEqual(len(st.routes), c.layers - 1)
            routes += st.routes
        for _, ids in routes:
            self.assertEqual(len(ids), c.top_k)
            self.assertEqual(len(set(ids)), c.top_k)
        distinct = len({(i, e) for i, ids in routes for e in ids})
        self.assertEqual(m.experts_decoded, distinct)       # each selected one, once
        self.assertLess(m.experts_decoded, c.experts * (c.layers - 1))
        # a cache too small for one expert decodes on every use, same numbers
        small = k3_ref.load_model(MODEL_DIR, expert_cache_mb=0)
        _, outs_small = self.run_tokens(small, self.PROMPT[:2])
        self.assertEqual(small.experts_decoded, 2 * c.top_k * (c.layers - 1))
        for (la, _), (lb, _) in zip(outs, outs_small):
            self.assertTrue(np.array_equal(la, lb))

    def test_mla_first_position_is_the_value_path(self):
        # with one cached position softmax is 1, so the output is
        # W_o((W_UV c_0) * gate) whatever the query is
        m = self.model
        c = m.cfg
        i = c.kinds.index("M")
        x = np.random.default_rng(3).standard_normal(c.hidden)
        st = k3_ref.new_state(m).layers[i]
        got = k3_ref.mla_forward(m, st, i, x)
        pre = f"model.layers.{i}.self_attn."
        hh, nope, vd, kl = c.mla_heads, c.nope, c.v_dim, c.kv_lora
        kv_b = m.w(pre + "kv_b_proj.weight", (hh * (nope + vd), kl)).reshape(hh, nope + vd, kl)
        o = np.concatenate([kv_b[h, nope:, :] @ st["c"][0] for h in range(hh)])
        o = o * k3_ref.sigmoid(m.w(pre + "g_proj.weight", (hh * vd, c.hidden)) @ x)
        want = m.w(pre + "o_proj.weight", (c.hidden, hh * vd)) @ o
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)

    def test_mla_absorbed_form_agrees(self):
        # section 3.4 allows the absorbed form, q_nope W_UK against the cached
        # latents directly; over several positions it must give the same output
        m = self.model
        c = m.cfg
        i = c.kinds.rindex("M")
        pre = f"model.layers.{i}.self_attn."
        g = lambda name: m.w(pre + name, m.raw(pre + name)[0].shape)
        hh, nope, rope, vd, kl = c.mla_heads, c.nope, c.rope, c.v_dim, c.kv_lora
        kv_b = g("kv_b_proj.weight").reshape(hh, nope + vd, kl)
        st = k3_ref.new_state(m).layers[i]
        rng = np.random.default_rng(9)
        for pos in range(5):
            x = rng.standard_normal(c.hidden)
            got = k3_ref.mla_forward(m, st, i, x)
            qa = g("q_a_proj.weight") @ x
            qa = g("q_a_layernorm.weight") * qa / np.sqrt(np.mean(qa * qa) + 1e-6)
            q = (g("q_b_proj.weight") @ qa).reshape(hh, nope + rope)
            cs, rs = np.array(st["c"]), np.array(st["r"])
            self.assertEqual(cs.shape, (pos + 1, kl))
            self.assertEqual(rs.shape, (pos + 1, rope))
            heads = []
            for h in range(hh):
                q_lat = kv_b[h, :nope, :].T @ q[h, :nope]          # absorbed query
                sc = (cs @ q_lat + rs @ q[h, nope:]) / math.sqrt(nope + rope)
                p = np.exp(sc - sc.max())
                p /= p.sum()
                heads.append(kv_b[h, nope:, :] @ (p @ cs))
            o = np.concatenate(heads) * k3_ref.sigmoid(g("g_proj.weight") @ x)
            np.testing.assert_allclose(got, g("o_proj.weight") @ o, rtol=1e-10, atol=1e-13)

    def test_layer_wiring_follows_section_3_2(self):
        # the first two positions composed again from the building blocks,
        # step by step as k3.md section 3.2 lists them
        m = self.model
        c = m.cfg
        g = lambda name: m.w(name, m.raw(name)[0].shape)
        eps = c.eps
        mine = k3_ref.new_state(m)
        ref = k3_ref.new_state(m)
        for tok in self.PROMPT[:2]:
            logits, hidden = k3_ref.forward_token(m, mine, tok)
            h = k3_ref.bf16_to_f64(m.raw("model.embed_tokens.weight")[0][tok])
            anchors = []
            for i in range(c.layers):
                p = f"model.layers.{i}."
                if anchors:
                    a_in = k3_ref.attn_res_mix(h, anchors, g(p + "self_attention_res_norm.weight"),
                                               g(p + "self_attention_res_proj.weight")[0], eps)
                else:
                    a_in = h
                if i % 3 == 0:
                    anchors.append(h)
                    prefix = np.zeros(c.hidden)
                else:
                    prefix = h
                x = k3_ref.rms_norm(a_in, g(p + "input_layernorm.weight"), eps)
                if c.kinds[i] == "K":
                    prefix = prefix + k3_ref.kda_forward(m, ref.layers[i], i, x)
                else:
                    prefix = prefix + k3_ref.mla_forward(m, ref.layers[i], i, x)
                m_in = k3_ref.attn_res_mix(prefix, anchors, g(p + "mlp_res_norm.weight"),
                                           g(p + "mlp_res_proj.weight")[0], eps)
                x = k3_ref.rms_norm(m_in, g(p + "post_attention_layernorm.weight"), eps)
                if i == 0:
                    mlp = k3_ref.dense_mlp(m, p + "mlp.", x, c.dense_inter)
                else:
                    mlp = k3_ref.moe_forward(m, i, x)
                h = prefix + mlp
                np.testing.assert_array_equal(hidden[i], h, err_msg=f"layer {i}")
            y = k3_ref.attn_res_mix(h, anchors, g("model.output_attn_res_norm.weight"),
                                    g("model.output_attn_res_proj.weight")[0], eps)
            y = k3_ref.rms_norm(y, g("model.norm.weight"), eps)
            np.testing.assert_array_equal(logits, g("lm_head.weight") @ y)

    def test_latent_moe_from_raw_bytes(self):
        # section 3.5 spelled out on the stored bytes of layer 1
        m = self.model
        c = m.cfg
        p = "model.layers.1.block_sparse_moe."
        bf = lambda name: k3_ref.bf16_to_f64(m.raw(p + name)[0])
        x = np.random.default_rng(5).standard_normal(c.hidden)
        s = 1 / (1 + np.exp(-(bf("gate.weight") @ x)))
        choice = s + np.asarray(m.raw(p + "gate.e_score_correction_bias")[0], np.float64)
        ids = sorted(range(c.experts), key=lambda e: (-choice[e], e))[:c.top_k]
        total = sum(s[e] for e in ids)
        z = bf("routed_expert_down_proj.weight") @ x
        u = np.zeros(c.latent)
        act = lambda a, b: 4 * np.tanh(a / 4) / (1 + np.exp(-a)) * 25 * np.tanh(b / 25)
        for e in ids:
            dec = {}
            for wn in ("w1", "w2", "w3"):
                packed = m.raw(f"{p}experts.{e}.{wn}.weight_packed")[0]
                scale = m.raw(f"{p}experts.{e}.{wn}.weight_scale")[0]
                dec[wn] = k3_ref.mxfp4_to_f64(packed, scale)
            u += s[e] / (total + 1e-20) * (dec["w2"] @ act(dec["w1"] @ z, dec["w3"] @ z))
        u = bf("routed_expert_norm.weight") * u / np.sqrt(np.mean(u * u) + c.eps)
        routed = bf("routed_expert_up_proj.weight") @ u
        shared = bf("shared_experts.down_proj.weight") @ act(
            bf("shared_experts.gate_proj.weight") @ x, bf("shared_experts.up_proj.weight") @ x)
        np.testing.assert_allclose(k3_ref.moe_forward(m, 1, x), routed + shared,
                                   rtol=1e-11, atol=1e-13)

    def test_disputed_choices_are_switchable(self):
        base = self.run_tokens(self.model, self.PROMPT[:3])[1][-1][0]
        for opts in ({"alog": "per-channel"}, {"mla_eps": 1e-5}, {"l2": "max"}):
            alt = self.run_tokens(k3_ref.load_model(MODEL_DIR, **opts), self.PROMPT[:3])[1][-1][0]
            self.assertFalse(np.array_equal(base, alt), opts)
            self.assertTrue(np.all(np.isfinite(alt)), opts)

    def test_cli_dumps(self):
        n_gen = 5
        prompt = self.PROMPT[:4]
        c = self.model.cfg
        with tempfile.TemporaryDirectory() as d:
            lg, hid = os.path.join(d, "logits.f32"), os.path.join(d, "hidden.npy")
            r = subprocess.run(
                [sys.executable, os.path.join(HERE, "k3_ref.py"), MODEL_DIR,
                 "--tokens", ",".join(map(str, prompt)), "--max-tokens", str(n_gen),
                 "--dump-logits", lg, "--dump-hidden", hid, "--json"],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.strip().split("\n")
            doc = json.loads(lines[-2])
            ids = [int(t) for t in lines[-1].split()]
            self.assertEqual(doc["prompt_tokens"], prompt)
            self.assertEqual(doc["tokens"], ids)
            self.assertEqual(len(ids), n_gen)
            self.assertTrue(all(m >= 0 for m in doc["top2_margins"]))
            logits = np.fromfile(lg, dtype="<f4")
            self.assertEqual(logits.size, n_gen * c.vocab)
            logits = logits.reshape(n_gen, c.vocab)
            hidden = np.load(hid)
            self.assertEqual(hidden.shape, (len(prompt) + n_gen - 1, c.layers, c.hidden))
            # the same run in-process: position by position
            st = k3_ref.new_state(self.model)
            seq = prompt + ids[:-1]
            for pos, t in enumerate(seq):
                lo, hi = k3_ref.forward_token(self.model, st, t)
                np.testing.assert_array_equal(hidden[pos], hi)
                if pos >= len(prompt) - 1:
                    g = pos - (len(prompt) - 1)
                    np.testing.assert_array_equal(logits[g], lo.astype(np.float32))
                    self.assertEqual(int(np.argmax(lo)), ids[g])
                    self.assertAlmostEqual(doc["top2_margins"][g], k3_ref.top2_margin(lo), 12)


if __name__ == "__main__":
    argv = list(sys.argv)
    if "--model" in argv:
        k = argv.index("--model")
        MODEL_DIR = argv[k + 1]
        del argv[k:k + 2]
    unittest.main(argv=argv, verbosity=2)
