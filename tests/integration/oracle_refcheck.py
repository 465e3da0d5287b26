#!/usr/bin/python3
"""oracle_refcheck.py - the oracle model against tests/reference/k3_ref.py.

    oracle_refcheck.py MODEL_DIR [--engine-ids IDS] [--margins]

1. The float64 reference's greedy continuation of the model's prompt is the
   model's promised ids, then eos (config.json "oracle").  --engine-ids
   (space-separated, as `shoal-engine run --tokens` prints them) must be
   the same ids.
2. Engine bugs that are not a change of the files (those are
   oracle_break.py's) are patched into the reference one at a time; each
   must change the continuation: routing weights from s + bias, a softmax
   router, the AttnRes score without its /rms, a plain residual instead of
   AttnRes, no routed_expert_norm, MXFP4's nibbles read high first, every
   pair of e2m1 magnitudes swapped, every single e2m1 value wrong, the sign
   bit ignored.  Two bugs the construction cannot see are
   run too and must leave the ids alone (they document a limit, and would
   flag a change of it): routing weights not renormalized (RMSNorm(U)
   removes a common factor) and AttnRes mixing normalized vectors (the mixes
   pick one vector, and RMSNorm follows).
3. --margins prints the construction's margins measured in the intact run.

Exit 0 when all hold, 1 otherwise (each failure on stderr).
"""

import argparse
import itertools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import k3_ref as R  # noqa: E402

ORIG = {name: getattr(R, name) for name in
        ("attn_res_mix", "moe_route", "moe_forward", "sigmoid", "_BYTE_PAIRS")}


def restore():
    for name, value in ORIG.items():
        setattr(R, name, value)


def continuation(model_dir, prompt, want):
    """Greedy ids after prompt, stopping at the first one that differs from want."""
    model = R.load_model(model_dir)
    state = R.new_state(model)
    logits = None
    for t in prompt:
        logits, _ = R.forward_token(model, state, t)
    out = []
    while len(out) < len(want):
        if out:
            logits, _ = R.forward_token(model, state, out[-1])
        out.append(int(np.argmax(logits)))
        if out[-1] != want[len(out) - 1]:
            break
    return out


# ---- the engine bugs -------------------------------------------------------

def bug_bias_weights():
    def route(scores, bias, top_k, renormalize=True, scaling=1.0):
        order = np.argsort(-(scores + bias), kind="stable")[:top_k]
        sel = (scores + bias)[order]
        return order, sel / np.sum(sel) * scaling
    R.moe_route = route


def bug_no_renorm():
    R.moe_route = lambda s, b, k, renormalize=True, scaling=1.0: ORIG["moe_route"](s, b, k, False, scaling)


def bug_softmax_router():
    def moe(model, i, x, trace=None):
        def act(v):
            if v.shape == (model.cfg.experts,):
                e = np.exp(v - v.max())
                return e / e.sum()
            return ORIG["sigmoid"](v)
        R.sigmoid = act
        try:
            return ORIG["moe_forward"](model, i, x, trace)
        finally:
            R.sigmoid = ORIG["sigmoid"]
    R.moe_forward = moe


def bug_mix_no_rms():
    def mix(prefix, anchors, w_norm, w_proj, eps):
        v = np.stack(list(anchors) + [prefix])
        return R.softmax(v @ (w_norm * w_proj)) @ v
    R.attn_res_mix = mix


def bug_mix_normalized():
    def mix(prefix, anchors, w_norm, w_proj, eps):
        v = np.stack(list(anchors) + [prefix])
        n = v / np.sqrt(np.mean(v * v, axis=1, keepdims=True) + eps)
        return R.softmax(n @ (w_norm * w_proj)) @ n
    R.attn_res_mix = mix


def bug_plain_residual():
    R.attn_res_mix = lambda prefix, anchors, w_norm, w_proj, eps: prefix


def bug_no_latent_norm():
    def moe(model, i, x, trace=None):
        model.cfg.latent_norm = False
        try:
            return ORIG["moe_forward"](model, i, x, trace)
        finally:
            model.cfg.latent_norm = True
    R.moe_forward = moe


def table_bug(table, high_first=False):
    def bug():
        lo, hi = np.arange(256) & 0x0F, np.arange(256) >> 4
        if high_first:
            lo, hi = hi, lo
        R._BYTE_PAIRS = np.stack([table[lo], table[hi]], axis=1)
    return bug


def e2m1_bugs():
    """(name, bug): every pair of magnitudes swapped, every magnitude given
    the next one's value, the sign bit ignored."""
    mags = R.E2M1[1:8]
    for a, b in itertools.combinations(range(1, 8), 2):
        t = R.E2M1.copy()
        t[a], t[b], t[a + 8], t[b + 8] = t[b], t[a], t[b + 8], t[a + 8]
        yield f"e2m1 {mags[a - 1]:g}<->{mags[b - 1]:g} swapped", table_bug(t)
    for a in range(1, 8):
        t = R.E2M1.copy()
        wrong = R.E2M1[a + 1] if a < 7 else 8.0
        t[a], t[a + 8] = wrong, -wrong
        yield f"e2m1 {R.E2M1[a]:g} decoded as {wrong:g}", table_bug(t)
    yield "e2m1 sign bit ignored", table_bug(np.abs(R.E2M1))
    yield "MXFP4 high nibble first", table_bug(R.E2M1, high_first=True)


BUGS = [
    ("routing weights from s + bias", bug_bias_weights, True),
    ("softmax router", bug_softmax_router, True),
    ("AttnRes score without /rms", bug_mix_no_rms, True),
    ("plain residual instead of AttnRes", bug_plain_residual, True),
    ("no routed_expert_norm", bug_no_latent_norm, True),
    ("routing weights not renormalized", bug_no_renorm, False),
    ("AttnRes mixing normalized vectors", bug_mix_normalized, False),
]


# ---- margins ---------------------------------------------------------------

def margins(model_dir, prompt, want):
    """The intact run's margins at the positions of the chain (the prompt's
    last token onwards): mixes, selection, logits."""
    st = {"p": 0.0, "gap": np.inf}
    on = [False]

    def mix(prefix, anchors, w_norm, w_proj, eps):
        v = np.stack(list(anchors) + [prefix])
        sw = w_norm * w_proj
        score = (v @ sw) / np.sqrt(np.mean(v * v, axis=1) + eps)
        p = R.softmax(score)
        if on[0] and np.count_nonzero(w_proj) == 1:      # a constructed mix
            others = [p[i] for i in range(len(p)) if i != np.argmax(p) and np.any(v[i])]
            st["p"] = max([st["p"]] + others)
        return p @ v

    def route(scores, bias, top_k, renormalize=True, scaling=1.0):
        if on[0]:
            v = np.sort(scores + bias)[::-1]
            st["gap"] = min(st["gap"], v[top_k - 1] - v[top_k])
        return ORIG["moe_route"](scores, bias, top_k, renormalize, scaling)

    R.attn_res_mix, R.moe_route = mix, route
    model = R.load_model(model_dir)
    state = R.new_state(model)
    seq, margin = prompt + want[:-1], np.inf
    for n, t in enumerate(seq):
        on[0] = n >= len(prompt) - 1
        logits, _ = R.forward_token(model, state, t)
        if on[0]:
            margin = min(margin, R.top2_margin(logits))
    restore()
    print(f"margins: largest weight a constructed mix gives a vector it must not pick "
          f"{st['p']:.3g}; "
          f"smallest gap between the 4th and 5th selection score {st['gap']:.3f}; "
          f"smallest top-2 logit margin {margin:.3f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--engine-ids", help="the engine's ids for the same prompt")
    ap.add_argument("--margins", action="store_true")
    a = ap.parse_args(argv)
    with open(os.path.join(a.model_dir, "config.json")) as f:
        config = json.load(f)
    prompt = config["oracle"]["prompt_ids"]
    want = config["oracle"]["ids"] + [config["text_config"]["eos_token_id"]]
    bad = 0

    got = continuation(a.model_dir, prompt, want)
    if got != want:
        print(f"oracle_refcheck: the reference continues with {got}, not {want}", file=sys.stderr)
        bad += 1
    else:
        print(f"reference: the promised {len(want)} ids, eos last")
    if a.engine_ids is not None:
        eng = [int(t) for t in a.engine_ids.split()]
        if eng[:len(want)] != want:
            print(f"oracle_refcheck: the engine's ids {eng} differ from the reference's",
                  file=sys.stderr)
            bad += 1
    if a.margins:
        margins(a.model_dir, prompt, want)
    bugs = BUGS + [(name, bug, True) for name, bug in e2m1_bugs()]
    for name, bug, must_break in bugs:
        bug()
        try:
            got = continuation(a.model_dir, prompt, want)
        finally:
            restore()
        broke = got != want
        if broke != must_break:
            print(f"oracle_refcheck: {name}: the continuation {'changed' if broke else 'did not change'}"
                  f" ({got[:6]}...)", file=sys.stderr)
            bad += 1
    print(f"reference with {len(bugs)} engine bugs: "
          f"{sum(1 for b in bugs if b[2])} break the sentence, "
          f"{sum(1 for b in bugs if not b[2])} cannot (as documented)" if not bad else
          f"oracle_refcheck: {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
