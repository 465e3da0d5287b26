/* tensors.c — the tensor list of a synthetic K3-family model.
 *
 * Owns: every tensor's name, dtype, shape and value recipe (k3.md §2/§6),
 * which shard holds it, and the order inside a shard.  Does not own the
 * values themselves (weights.c) nor the bytes on disk (shard.c).
 *
 * Shards: tiny puts `layers_per_shard` layers in each shard, slice one layer
 * per shard; the last shard holds the globals (embedding, lm_head, final
 * norm, output AttnRes) and `vision_tower.dummy`.
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
#include "tools/mkmodel/mkmodel_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PFX "language_model."

typedef struct builder {
    mk_model *m;
    int       shard;
    int       rc;
    shoal_err *err;
} builder;

static void add(builder *b, mk_init init, mk_dtype dt, unsigned ndim, const uint64_t *shape,
                const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void add(builder *b, mk_init init, mk_dtype dt, unsigned ndim, const uint64_t *shape,
                const char *fmt, ...)
{
    mk_model *m = b->m;
    va_list ap;
    mk_tensor *t;
    int n;

    if (b->rc)
        return;
    if (m->count == m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 1024;
        mk_tensor *nt = realloc(m->t, ncap * sizeof *nt);
        if (!nt) {
            b->rc = shoal_err_set(b->err, SHOAL_ENOMEM, "out of memory for the tensor list");
            return;
        }
        m->t = nt;
        m->cap = ncap;
    }
    t = &m->t[m->count];
    memset(t, 0, sizeof *t);
    va_start(ap, fmt);
    n = vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof t->name) {
        b->rc = shoal_err_set(b->err, SHOAL_EINTERNAL, "tensor name too long");
        return;
    }
    t->init = init;
    t->dtype = dt;
    t->ndim = ndim;
    t->nbytes = mk_dtype_size(dt);
    for (unsigned d = 0; d < ndim; d++) {
        t->shape[d] = shape[d];
        t->nbytes *= shape[d];
    }
    t->used = ndim ? shape[0] : 1;
    t->shard = b->shard;
    m->count++;
}

/* Shorthands: a BF16 matrix [out, in], a BF16/F32 vector [n]. */
#define MAT(b, o, i, ...) add(b, MK_INIT_MATRIX, MK_BF16, 2, (uint64_t[]){ (o), (i) }, __VA_ARGS__)
#define VEC(b, init, dt, n, ...) add(b, init, dt, 1, (uint64_t[]){ (n) }, __VA_ARGS__)

static void layer_kda(builder *b, const mk_config *c, int i)
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
        add(b, MK_INIT_CONV, MK_F32, 3, (uint64_t[]){ p, 1, (uint64_t)c->conv_kernel },
            PFX "model.layers.%d.self_attn.%s_conv1d.weight", i, qkvg[k]);
    /* K3 stores A_log zero-padded past num_heads ([128] for 96 heads). */
    VEC(b, MK_INIT_A_LOG, MK_F32, alog, PFX "model.layers.%d.self_attn.A_log", i);
    if (!b->rc)
        b->m->t[b->m->count - 1].used = (uint64_t)c->kda_heads;
    VEC(b, MK_INIT_DT_BIAS, MK_F32, p, PFX "model.layers.%d.self_attn.dt_bias", i);
    VEC(b, MK_INIT_NORM, MK_F32, hd, PFX "model.layers.%d.self_attn.o_norm.weight", i);
}

static void layer_mla(builder *b, const mk_config *c, int i)
{
    uint64_t h = (uint64_t)c->hidden, nh = (uint64_t)c->mla_heads;
    uint64_t ql = (uint64_t)c->q_lora, kvl = (uint64_t)c->kv_lora;
    uint64_t nope = (uint64_t)c->qk_nope, rope = (uint64_t)c->qk_rope, v = (uint64_t)c->v_head;

    MAT(b, ql, h, PFX "model.layers.%d.self_attn.q_a_proj.weight", i);
    VEC(b, MK_INIT_NORM, MK_BF16, ql, PFX "model.layers.%d.self_attn.q_a_layernorm.weight", i);
    MAT(b, nh * (nope + rope), ql, PFX "model.layers.%d.self_attn.q_b_proj.weight", i);
    MAT(b, kvl + rope, h, PFX "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight", i);
    VEC(b, MK_INIT_NORM, MK_BF16, kvl, PFX "model.layers.%d.self_attn.kv_a_layernorm.weight", i);
    MAT(b, nh * (nope + v), kvl, PFX "model.layers.%d.self_attn.kv_b_proj.weight", i);
    MAT(b, nh * v, h, PFX "model.layers.%d.self_attn.g_proj.weight", i);
    MAT(b, h, nh * v, PFX "model.layers.%d.self_attn.o_proj.weight", i);
}

static void layer_moe(builder *b, const mk_config *c, int i)
{
    uint64_t h = (uint64_t)c->hidden, e = (uint64_t)c->experts, l = (uint64_t)c->latent;
    uint64_t in = (uint64_t)c->moe_inter, sh = (uint64_t)c->shared_experts * in;
    const char *bsm = "block_sparse_moe";

    MAT(b, e, h, PFX "model.layers.%d.%s.gate.weight", i, bsm);
    VEC(b, MK_INIT_SCORE_BIAS, MK_F32, e, PFX "model.layers.%d.%s.gate.e_score_correction_bias",
        i, bsm);
    MAT(b, l, h, PFX "model.layers.%d.%s.routed_expert_down_proj.weight", i, bsm);
    MAT(b, h, l, PFX "model.layers.%d.%s.routed_expert_up_proj.weight", i, bsm);
    VEC(b, MK_INIT_NORM, MK_BF16, l, PFX "model.layers.%d.%s.routed_expert_norm.weight", i, bsm);
    MAT(b, sh, h, PFX "model.layers.%d.%s.shared_experts.gate_proj.weight", i, bsm);
    MAT(b, sh, h, PFX "model.layers.%d.%s.shared_experts.up_proj.weight", i, bsm);
    MAT(b, h, sh, PFX "model.layers.%d.%s.shared_experts.down_proj.weight", i, bsm);
    for (int x = 0; x < c->experts; x++) {
        /* w1 (gate) and w3 (up): L -> I; w2 (down): I -> L.  MXFP4: two
         * codes a byte, one scale byte per 32 columns. */
        static const char *const w[] = { "w1", "w2", "w3" };
        for (int k = 0; k < 3; k++) {
            uint64_t rows = k == 1 ? l : in, cols = k == 1 ? in : l;
            add(b, MK_INIT_PACKED, MK_U8, 2, (uint64_t[]){ rows, cols / 2 },
                PFX "model.layers.%d.%s.experts.%d.%s.weight_packed", i, bsm, x, w[k]);
            add(b, MK_INIT_SCALE, MK_U8, 2, (uint64_t[]){ rows, cols / 32 },
                PFX "model.layers.%d.%s.experts.%d.%s.weight_scale", i, bsm, x, w[k]);
        }
    }
}

static void layer(builder *b, const mk_config *c, int i)
{
    uint64_t h = (uint64_t)c->hidden, di = (uint64_t)c->dense_inter;
    static const char *const norms[] = { "input_layernorm", "post_attention_layernorm",
                                         "self_attention_res_norm", "mlp_res_norm" };

    for (int k = 0; k < 4; k++)
        VEC(b, MK_INIT_NORM, MK_BF16, h, PFX "model.layers.%d.%s.weight", i, norms[k]);
    add(b, MK_INIT_RES_PROJ, MK_BF16, 2, (uint64_t[]){ 1, h },
        PFX "model.layers.%d.self_attention_res_proj.weight", i);
    add(b, MK_INIT_RES_PROJ, MK_BF16, 2, (uint64_t[]){ 1, h },
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

static void globals(builder *b, const mk_config *c)
{
    uint64_t h = (uint64_t)c->hidden, v = (uint64_t)c->vocab;

    MAT(b, v, h, PFX "model.embed_tokens.weight");
    VEC(b, MK_INIT_NORM, MK_BF16, h, PFX "model.norm.weight");
    VEC(b, MK_INIT_NORM, MK_BF16, h, PFX "model.output_attn_res_norm.weight");
    add(b, MK_INIT_RES_PROJ, MK_BF16, 2, (uint64_t[]){ 1, h },
        PFX "model.output_attn_res_proj.weight");
    MAT(b, v, h, PFX "lm_head.weight");
    /* Not a language tensor: readers must skip it. */
    MAT(b, 4, 8, "vision_tower.dummy");
}

const char *mk_dtype_name(mk_dtype t)
{
    return t == MK_F32 ? "F32" : t == MK_BF16 ? "BF16" : "U8";
}

unsigned mk_dtype_size(mk_dtype t)
{
    return t == MK_F32 ? 4 : t == MK_BF16 ? 2 : 1;
}

static int dtype_rank(mk_dtype t)
{
    return t == MK_F32 ? 0 : t == MK_BF16 ? 1 : 2;
}

static int file_order_cmp(const void *a, const void *b)
{
    const mk_tensor *x = a, *y = b;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    if (dtype_rank(x->dtype) != dtype_rank(y->dtype))
        return dtype_rank(x->dtype) < dtype_rank(y->dtype) ? -1 : 1;
    return strcmp(x->name, y->name);
}

int mk_model_build(const mk_config *c, mk_model *m, shoal_err *err)
{
    builder b = { m, 0, 0, err };
    int per = c->layers_per_shard;

    memset(m, 0, sizeof *m);
    for (int i = 0; i < c->layers && !b.rc; i++) {
        b.shard = per > 0 ? i / per : i;
        layer(&b, c, i);
    }
    m->shards = (per > 0 ? (c->layers + per - 1) / per : c->layers) + 1;
    b.shard = m->shards - 1;
    globals(&b, c);
    if (b.rc) {
        mk_model_free(m);
        return b.rc;
    }
    qsort(m->t, m->count, sizeof *m->t, file_order_cmp);
    uint64_t off = 0;
    for (size_t i = 0; i < m->count; i++) {
        if (i > 0 && m->t[i].shard != m->t[i - 1].shard)
            off = 0;
        m->t[i].begin = off;
        off += m->t[i].nbytes;
        m->total_bytes += m->t[i].nbytes;
    }
    return 0;
}

void mk_model_free(mk_model *m)
{
    if (!m)
        return;
    free(m->t);
    memset(m, 0, sizeof *m);
}

void mk_shard_name(const mk_model *m, int i, char *out, size_t cap)
{
    snprintf(out, cap, "model-%05d-of-%06d.safetensors", i + 1, m->shards);
}
