/* tensors.c — the tensor list of a synthetic K3-family model.
 *
 * Owns: every language tensor's name, dtype, shape and value recipe (k3.md
 * §2/§6), which shard holds it, the order inside a shard and the offsets.
 * Does not own the values themselves (weights.c), the vision tensors of the
 * k3 preset (vision.c) nor the bytes of a file (model.c, render.c).
 *
 * Shards: tiny puts `layers_per_shard` layers in each shard, slice and k3
 * one layer per shard; the next shard holds the globals (embedding,
 * lm_head, final norm, output AttnRes) — with `vision_tower.dummy` for tiny
 * and slice — and k3 adds two vision shards after it (k3.md §2: 1..93
 * layers, 94 globals, 95-96 vision).
 *
 * Order inside a shard, as the safetensors Rust writer does it: by dtype,
 * F32 then BF16 then U8 (the writer's alignment-descending order, so every
 * tensor is aligned to its element size), then by name in byte order.  The
 * routed experts are the only U8 tensors, so each layer's experts form one
 * gap-free run in lexicographic name order (expert 10 before expert 2) and
 * each expert's six records are back to back: w1.weight_packed,
 * w1.weight_scale, w2.weight_packed, w2.weight_scale, w3.weight_packed,
 * w3.weight_scale.
 */
#include "synth/synth_int.h"
#include "common/platform.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PFX "language_model."

void synth_add(synth_builder *b, synth_init init, synth_dtype dt, unsigned ndim,
               const uint64_t *shape, const char *fmt, ...)
{
    synth_tensors *ts = b->ts;
    char name[160];
    va_list ap;
    synth_tensor *t;
    int n;

    if (b->rc)
        return;
    if (ts->count == ts->cap) {
        size_t ncap = ts->cap ? ts->cap * 2 : 1024;
        synth_tensor *nt = realloc(ts->t, ncap * sizeof *nt);
        if (!nt) {
            b->rc = shoal_err_set(b->err, SHOAL_ENOMEM, "out of memory for the tensor list");
            return;
        }
        ts->t = nt;
        ts->cap = ncap;
    }
    va_start(ap, fmt);
    n = vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof name || ndim > SYNTH_MAX_DIMS ||
        ts->names.len > UINT32_MAX - sizeof name) {
        b->rc = shoal_err_set(b->err, SHOAL_EINTERNAL, "tensor name or shape too long");
        return;
    }
    t = &ts->t[ts->count];
    memset(t, 0, sizeof *t);
    t->name = (uint32_t)ts->names.len;
    if ((b->rc = shoal_buf_append(&ts->names, name, (size_t)n + 1))) {
        shoal_err_set(b->err, b->rc, "out of memory for the tensor names");
        return;
    }
    t->state0 = synth_seed_state(name, b->seed);
    t->init = (uint8_t)init;
    t->dtype = (uint8_t)dt;
    t->ndim = (uint8_t)ndim;
    t->nbytes = synth_dtype_size(dt);
    for (unsigned d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->nbytes *= shape[d];
    }
    t->shard = (uint16_t)b->shard;
    ts->count++;
}

/* Shorthands: a BF16 matrix [out, in], a BF16/F32 vector [n]. */
#define MAT(b, o, i, ...) synth_add(b, SYNTH_INIT_MATRIX, SYNTH_BF16, 2, (uint64_t[]){ (o), (i) }, __VA_ARGS__)
#define VEC(b, init, dt, n, ...) synth_add(b, init, dt, 1, (uint64_t[]){ (n) }, __VA_ARGS__)

static void layer_kda(synth_builder *b, const synth_config *c, int i)
{
    uint64_t h = (uint64_t)c->hidden, hd = (uint64_t)c->kda_head_dim;
    uint64_t p = (uint64_t)c->kda_heads * hd;
    uint64_t alog = (uint64_t)(c->kda_heads > c->kda_head_dim ? c->kda_heads : c->kda_head_dim);
    static const char *const qkvg[] = { "q", "k", "v", "g" };

    for (int k = 0; k < 4; k++)
        MAT(b, p, h, PFX "model.layers.%d.self_attn.%s_proj.weight", i, qkvg[k]);
    MAT(b, h, p, PFX "model.layers.%d.self_attn.o_proj.weight", i);
    MAT(b, hd, h, PFX "model.layers.%d.self_attn.f_a_proj.weight", i);
    MAT(b, p, hd, PFX "model.layers.%d.self_attn.f_b_proj.weight", i);
    MAT(b, (uint64_t)c->kda_heads, h, PFX "model.layers.%d.self_attn.b_proj.weight", i);
    for (int k = 0; k < 3; k++)
        synth_add(b, SYNTH_INIT_CONV, SYNTH_F32, 3, (uint64_t[]){ p, 1, (uint64_t)c->conv_kernel },
            PFX "model.layers.%d.self_attn.%s_conv1d.weight", i, qkvg[k]);
    /* K3 stores A_log zero-padded past num_heads ([128] for 96 heads). */
    VEC(b, SYNTH_INIT_A_LOG, SYNTH_F32, alog, PFX "model.layers.%d.self_attn.A_log", i);
    if (!b->rc)
        b->ts->t[b->ts->count - 1].used = (uint16_t)c->kda_heads;
    VEC(b, SYNTH_INIT_DT_BIAS, SYNTH_F32, p, PFX "model.layers.%d.self_attn.dt_bias", i);
    VEC(b, SYNTH_INIT_NORM, SYNTH_F32, hd, PFX "model.layers.%d.self_attn.o_norm.weight", i);
}

static void layer_mla(synth_builder *b, const synth_config *c, int i)
{
    uint64_t h = (uint64_t)c->hidden, nh = (uint64_t)c->mla_heads;
    uint64_t ql = (uint64_t)c->q_lora, kvl = (uint64_t)c->kv_lora;
    uint64_t nope = (uint64_t)c->qk_nope, rope = (uint64_t)c->qk_rope, v = (uint64_t)c->v_head;

    MAT(b, ql, h, PFX "model.layers.%d.self_attn.q_a_proj.weight", i);
    VEC(b, SYNTH_INIT_NORM, SYNTH_BF16, ql, PFX "model.layers.%d.self_attn.q_a_layernorm.weight", i);
    MAT(b, nh * (nope + rope), ql, PFX "model.layers.%d.self_attn.q_b_proj.weight", i);
    MAT(b, kvl + rope, h, PFX "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", i);
    VEC(b, SYNTH_INIT_NORM, SYNTH_BF16, kvl, PFX "model.layers.%d.self_attn.kv_a_layernorm.weight", i);
    MAT(b, nh * (nope + v), kvl, PFX "model.layers.%d.self_attn.kv_b_proj.weight", i);
    MAT(b, nh * v, h, PFX "model.layers.%d.self_attn.g_proj.weight", i);
    MAT(b, h, nh * v, PFX "model.layers.%d.self_attn.o_proj.weight", i);
}

static void layer_moe(synth_builder *b, const synth_config *c, int i)
{
    uint64_t h = (uint64_t)c->hidden, e = (uint64_t)c->experts, l = (uint64_t)c->latent;
    uint64_t in = (uint64_t)c->moe_inter, sh = (uint64_t)c->shared_experts * in;
    const char *bsm = "block_sparse_moe";
    synth_init packed = c->packed8 ? SYNTH_INIT_PACKED8 : SYNTH_INIT_PACKED;
    synth_init scale = c->packed8 ? SYNTH_INIT_SCALE8 : SYNTH_INIT_SCALE;

    MAT(b, e, h, PFX "model.layers.%d.%s.gate.weight", i, bsm);
    VEC(b, SYNTH_INIT_SCORE_BIAS, SYNTH_F32, e, PFX "model.layers.%d.%s.gate.e_score_correction_bias",
        i, bsm);
    MAT(b, l, h, PFX "model.layers.%d.%s.routed_expert_down_proj.weight", i, bsm);
    MAT(b, h, l, PFX "model.layers.%d.%s.routed_expert_up_proj.weight", i, bsm);
    VEC(b, SYNTH_INIT_NORM, SYNTH_BF16, l, PFX "model.layers.%d.%s.routed_expert_norm.weight", i, bsm);
    MAT(b, sh, h, PFX "model.layers.%d.%s.shared_experts.gate_proj.weight", i, bsm);
    MAT(b, sh, h, PFX "model.layers.%d.%s.shared_experts.up_proj.weight", i, bsm);
    MAT(b, h, sh, PFX "model.layers.%d.%s.shared_experts.down_proj.weight", i, bsm);
    for (int x = 0; x < c->experts; x++) {
        /* w1 (gate) and w3 (up): L -> I; w2 (down): I -> L.  MXFP4: two
         * codes a byte, one scale byte per 32 columns. */
        static const char *const w[] = { "w1", "w2", "w3" };
        for (int k = 0; k < 3; k++) {
            uint64_t rows = k == 1 ? l : in, cols = k == 1 ? in : l;
            synth_add(b, packed, SYNTH_U8, 2, (uint64_t[]){ rows, cols / 2 },
                PFX "model.layers.%d.%s.experts.%d.%s.weight_packed", i, bsm, x, w[k]);
            synth_add(b, scale, SYNTH_U8, 2, (uint64_t[]){ rows, cols / 32 },
                PFX "model.layers.%d.%s.experts.%d.%s.weight_scale", i, bsm, x, w[k]);
        }
    }
}

static void layer(synth_builder *b, const synth_config *c, int i)
{
    uint64_t h = (uint64_t)c->hidden, di = (uint64_t)c->dense_inter;
    static const char *const norms[] = { "input_layernorm", "post_attention_layernorm",
                                         "self_attention_res_norm", "mlp_res_norm" };

    for (int k = 0; k < 4; k++)
        VEC(b, SYNTH_INIT_NORM, SYNTH_BF16, h, PFX "model.layers.%d.%s.weight", i, norms[k]);
    synth_add(b, SYNTH_INIT_RES_PROJ, SYNTH_BF16, 2, (uint64_t[]){ 1, h },
        PFX "model.layers.%d.self_attention_res_proj.weight", i);
    synth_add(b, SYNTH_INIT_RES_PROJ, SYNTH_BF16, 2, (uint64_t[]){ 1, h },
        PFX "model.layers.%d.mlp_res_proj.weight", i);
    if (c->is_mla[i])
        layer_mla(b, c, i);
    else
        layer_kda(b, c, i);
    if (i == 0) {   /* first_k_dense_replace = 1 */
        MAT(b, di, h, PFX "model.layers.%d.mlp.gate_proj.weight", i);
        MAT(b, di, h, PFX "model.layers.%d.mlp.up_proj.weight", i);
        MAT(b, h, di, PFX "model.layers.%d.mlp.down_proj.weight", i);
    } else {
        layer_moe(b, c, i);
    }
}

static void globals(synth_builder *b, const synth_config *c)
{
    uint64_t h = (uint64_t)c->hidden, v = (uint64_t)c->vocab;

    MAT(b, v, h, PFX "model.embed_tokens.weight");
    VEC(b, SYNTH_INIT_NORM, SYNTH_BF16, h, PFX "model.norm.weight");
    VEC(b, SYNTH_INIT_NORM, SYNTH_BF16, h, PFX "model.output_attn_res_norm.weight");
    synth_add(b, SYNTH_INIT_RES_PROJ, SYNTH_BF16, 2, (uint64_t[]){ 1, h },
        PFX "model.output_attn_res_proj.weight");
    MAT(b, v, h, PFX "lm_head.weight");
    /* Not a language tensor: readers must skip it (k3 has the real set). */
    if (!c->vision)
        MAT(b, 4, 8, "vision_tower.dummy");
}

const char *synth_dtype_name(synth_dtype t)
{
    return t == SYNTH_F32 ? "F32" : t == SYNTH_BF16 ? "BF16" : "U8";
}

unsigned synth_dtype_size(synth_dtype t)
{
    return t == SYNTH_F32 ? 4 : t == SYNTH_BF16 ? 2 : 1;
}

static int dtype_rank(unsigned t)
{
    return t == SYNTH_F32 ? 0 : t == SYNTH_BF16 ? 1 : 2;
}

static int file_order_cmp(const void *a, const void *b, void *arg)
{
    const synth_tensor *x = a, *y = b;
    const char *names = arg;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    if (dtype_rank(x->dtype) != dtype_rank(y->dtype))
        return dtype_rank(x->dtype) < dtype_rank(y->dtype) ? -1 : 1;
    return strcmp(names + x->name, names + y->name);
}

int synth_tensors_build(const synth_config *c, synth_tensors *ts, shoal_err *err)
{
    synth_builder b = { ts, c->seed, 0, 0, err };
    int per = c->layers_per_shard;
    int layer_shards = per > 0 ? (c->layers + per - 1) / per : c->layers;

    memset(ts, 0, sizeof *ts);
    shoal_buf_init(&ts->names, 0);
    for (int i = 0; i < c->layers && !b.rc; i++) {
        b.shard = per > 0 ? i / per : i;
        layer(&b, c, i);
    }
    ts->shards = layer_shards + 1 + (c->vision ? SYNTH_VISION_SHARDS : 0);
    b.shard = layer_shards;
    globals(&b, c);
    if (c->vision)
        synth_vision_add(&b, c, layer_shards + 1);
    if (b.rc) {
        synth_tensors_free(ts);
        return b.rc;
    }
    if (c->preset == SYNTH_PRESET_ORACLE)
        synth_oracle_tag(c, ts);
    shoal_qsort_r(ts->t, ts->count, sizeof *ts->t, file_order_cmp, ts->names.data);
    uint64_t off = 0;
    for (size_t i = 0; i < ts->count; i++) {
        if (i > 0 && ts->t[i].shard != ts->t[i - 1].shard)
            off = 0;
        ts->t[i].begin = off;
        off += ts->t[i].nbytes;
        ts->total_bytes += ts->t[i].nbytes;
    }
    return 0;
}

void synth_tensors_free(synth_tensors *ts)
{
    if (!ts)
        return;
    free(ts->t);
    shoal_buf_free(&ts->names);
    memset(ts, 0, sizeof *ts);
}

void synth_shard_name(int i, int n, char *out, size_t cap)
{
    snprintf(out, cap, "model-%05d-of-%06d.safetensors", i + 1, n);
}

