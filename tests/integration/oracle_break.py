#!/usr/bin/python3
"""oracle_break.py - broken copies of the oracle model, one fault each.

    oracle_break.py SRC_DIR OUT_DIR FAULT     copy SRC_DIR to OUT_DIR with FAULT
    oracle_break.py --list                    the faults, one a line

Each fault is what an engine bug (or a wrong byte served by shoald) would
look like, written into the files instead: the test runs the real engine on
the copy and checks the oracle's sentence does NOT come out, so the sentence
coming out of the intact model says each of these parts is right
(docs/mkmodel.md "The oracle").  Unchanged files are hard-linked; a shard
that changes is rewritten whole.  Uses only its own safetensors reader.
"""

import json
import os
import shutil
import struct
import sys

import numpy as np

PFX = "language_model.model.layers."
LAYERS, EXPERTS = 8, 64
MOE = range(1, LAYERS)


def read_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


class Model:
    """The copy being broken: tensors as writable numpy views of its shards."""

    def __init__(self, src, out):
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(src, "model.safetensors.index.json")) as f:
            self.where = json.load(f)["weight_map"]
        self.src, self.out, self.shards = src, out, {}
        for name in os.listdir(src):
            dst = os.path.join(out, name)
            if os.path.exists(dst):
                os.unlink(dst)
            os.link(os.path.join(src, name), dst)

    def _shard(self, shard):
        if shard not in self.shards:
            path = os.path.join(self.out, shard)
            data = np.fromfile(path, dtype=np.uint8)       # a private copy
            os.unlink(path)                                # break the hard link
            start, header = read_header(os.path.join(self.src, shard))
            self.shards[shard] = (path, data, start, header)
        return self.shards[shard]

    def raw(self, name):
        """The bytes of tensor `name` (full name), writable."""
        _, data, start, header = self._shard(self.where[name])
        b, e = header[name]["data_offsets"]
        return data[start + b:start + e]

    def bf16(self, name):
        """A BF16 tensor as its uint16 bit patterns, in its shape, writable."""
        shard = self.where[name]
        _, _, _, header = self._shard(shard)
        assert header[name]["dtype"] == "BF16", name
        return self.raw(name).view("<u2").reshape(header[name]["shape"])

    def f32(self, name):
        _, _, _, header = self._shard(self.where[name])
        return self.raw(name).view("<f4").reshape(header[name]["shape"])

    def save(self):
        for path, data, _, _ in self.shards.values():
            data.tofile(path)


BF16_ONE, BF16_ZERO = 0x3F80, 0x0000


def expert_records(m, layer, e, w, kind):
    return m.raw(f"{PFX}{layer}.block_sparse_moe.experts.{e}.w{w}.weight_{kind}")


def all_records(m, kind):
    for layer in MOE:
        for e in range(EXPERTS):
            for w in (1, 2, 3):
                yield expert_records(m, layer, e, w, kind)


def router_perm(m):
    """Each MoE layer's router rows rotated by one: routing goes elsewhere."""
    for layer in MOE:
        g = m.bf16(f"{PFX}{layer}.block_sparse_moe.gate.weight")
        g[:] = np.roll(g.copy(), 1, axis=0)


def nibble_swap(m):
    """Every packed byte's nibbles swapped: column 2j read as 2j+1."""
    for r in all_records(m, "packed"):
        r[:] = ((r & 0x0F) << 4) | (r >> 4)


def scale_plus(m):
    """Every scale byte + 1: the exponent bias taken as 126."""
    for r in all_records(m, "scale"):
        r[:] = r + 1


def scale_minus(m):
    """Every scale byte - 1: the exponent bias taken as 128."""
    for r in all_records(m, "scale"):
        r[:] = r - 1


def swap_records(m, a, b):
    for layer in MOE:
        for e in range(EXPERTS):
            for kind in ("packed", "scale"):
                x, y = expert_records(m, layer, e, a, kind), expert_records(m, layer, e, b, kind)
                t = x.copy()
                x[:] = y
                y[:] = t


def w1_w3(m):
    """w1 and w3 records swapped: gate read as up and up as gate."""
    swap_records(m, 1, 3)


def w2_w3(m):
    """w2 and w3 records swapped (same byte sizes in tiny-k3)."""
    swap_records(m, 2, 3)


def expert_shift(m):
    """Layer 4's experts each given the bytes of the next expert id: what a
    fetch of the wrong span would deliver."""
    spans = []
    for e in range(EXPERTS):
        spans.append([expert_records(m, 4, e, w, k).copy()
                      for w in (1, 2, 3) for k in ("packed", "scale")])
    for e in range(EXPERTS):
        src = spans[(e + 1) % EXPERTS]
        for i, (w, k) in enumerate((w, k) for w in (1, 2, 3) for k in ("packed", "scale")):
            expert_records(m, 4, e, w, k)[:] = src[i]


def layer_swap(m):
    """Layers 2 and 5 given each other's experts: a fetch of the wrong layer."""
    for e in range(EXPERTS):
        for w in (1, 2, 3):
            for k in ("packed", "scale"):
                x, y = expert_records(m, 2, e, w, k), expert_records(m, 5, e, w, k)
                t = x.copy()
                x[:] = y
                y[:] = t


def bias_zero(m):
    """e_score_correction_bias all 0: selection by the score alone."""
    for layer in MOE:
        m.f32(f"{PFX}{layer}.block_sparse_moe.gate.e_score_correction_bias")[:] = 0


def mlp_res_proj_zero(layer):
    def f(m):
        m.bf16(f"{PFX}{layer}.mlp_res_proj.weight")[:] = BF16_ZERO
    f.__doc__ = f"layer {layer}'s mlp_res_proj zeroed: that mix becomes uniform"
    return f


def out_res_proj_zero(m):
    """output_attn_res_proj zeroed: the tail's mix becomes uniform."""
    m.bf16("language_model.model.output_attn_res_proj.weight")[:] = BF16_ZERO


def res_norm_one(m):
    """Every mlp_res_norm and the output res_norm set to 1: Mix without res_norm."""
    for layer in range(LAYERS):
        m.bf16(f"{PFX}{layer}.mlp_res_norm.weight")[:] = BF16_ONE
    m.bf16("language_model.model.output_attn_res_norm.weight")[:] = BF16_ONE


def lm_head_shuffle(m):
    """lm_head's rows of the sentence's tokens rotated among themselves."""
    with open(os.path.join(m.src, "config.json")) as f:
        ids = json.load(f)["oracle"]["ids"]
    h = m.bf16("language_model.lm_head.weight")
    rows = h[ids].copy()
    h[ids] = np.roll(rows, 1, axis=0)


def shared_zero(m):
    """The shared experts' down projections zeroed: no hop marks its output."""
    for layer in MOE:
        m.bf16(f"{PFX}{layer}.block_sparse_moe.shared_experts.down_proj.weight")[:] = BF16_ZERO


def routed_up_zero(m):
    """Layer 7's routed_expert_up_proj zeroed: the routed experts' output lost."""
    m.bf16(f"{PFX}7.block_sparse_moe.routed_expert_up_proj.weight")[:] = BF16_ZERO


FAULTS = {
    "router-perm": router_perm,
    "nibble-swap": nibble_swap,
    "scale-plus": scale_plus,
    "scale-minus": scale_minus,
    "w1-w3": w1_w3,
    "w2-w3": w2_w3,
    "expert-shift": expert_shift,
    "layer-swap": layer_swap,
    "bias-zero": bias_zero,
    "mlp-res-proj-zero-1": mlp_res_proj_zero(1),
    "mlp-res-proj-zero-4": mlp_res_proj_zero(4),
    "mlp-res-proj-zero-6": mlp_res_proj_zero(6),
    "out-res-proj-zero": out_res_proj_zero,
    "res-norm-one": res_norm_one,
    "lm-head-shuffle": lm_head_shuffle,
    "shared-zero": shared_zero,
    "routed-up-zero": routed_up_zero,
}


def main(argv):
    if argv[1:] == ["--list"]:
        for name, f in FAULTS.items():
            print(f"{name}\t{' '.join(f.__doc__.split())}")
        return 0
    if len(argv) != 4 or argv[3] not in FAULTS:
        print(__doc__.strip().split("\n\n")[0], file=sys.stderr)
        print("faults: " + " ".join(FAULTS), file=sys.stderr)
        return 2
    src, out, fault = argv[1:]
    if os.path.exists(out):
        shutil.rmtree(out)
    m = Model(src, out)
    FAULTS[fault](m)
    m.save()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
