/* k3_sizes.c — the spine's matrices in load order and their bytes (see
 * k3_sizes.h).  The walk follows engine/forward/model.c's load order; the
 * spine pack checks every matrix against it as the model binds, so a
 * difference fails loudly in tests/unit/forward/test_spine_pack.c. */
#include "common/k3_sizes.h"

#include <stdio.h>
#include <string.h>

const char *k3_spine_mode_name(k3_spine_mode m)
{
    switch (m) {
    case K3_SPINE_INT8: return "int8";
    case K3_SPINE_INT4: return "int4";
    case K3_SPINE_F32: return "f32";
    default: return "?";
    }
}

const char *k3_fmt_name(k3_fmt f)
{
    switch (f) {
    case K3_FMT_INT8: return "int8";
    case K3_FMT_INT4: return "int4";
    case K3_FMT_F32: return "f32";
    }
    return "?";
}

const char *k3_part_name(k3_part p)
{
    static const char *const names[K3_PART_COUNT] = {
        "KDA q/k/v/g/o", "KDA gate path f_a/f_b/b", "MLA", "shared experts",
        "latent down/up", "routers", "dense MLP", "lm_head",
    };
    return p < K3_PART_COUNT ? names[p] : "?";
}

k3_fmt k3_spine_fmt(k3_spine_mode mode, k3_part part, uint64_t cols)
{
    if (mode == K3_SPINE_F32 || part == K3_PART_ROUTER || part == K3_PART_KDA_GATE ||
        cols % 32 != 0)
        return K3_FMT_F32;
    if (mode == K3_SPINE_INT4 && part != K3_PART_MLA && part != K3_PART_HEAD &&
        cols % K3_INT4_GROUP == 0)
        return K3_FMT_INT4;
    return K3_FMT_INT8;
}

uint64_t k3_mat_bytes(const k3_spine_mat *m)
{
    switch (m->fmt) {
    case K3_FMT_INT8: return m->rows * m->cols + m->rows * 4;
    case K3_FMT_INT4: return m->rows * m->cols / 2 + m->rows * (m->cols / K3_INT4_GROUP) * 2;
    case K3_FMT_F32: return m->rows * m->cols * 4;
    }
    return 0;
}

typedef struct walker {
    const k3_config *c;
    k3_spine_mode mode;
    k3_spine_fn fn;
    void *ctx;
    int layer;
} walker;

/* A matrix named model.layers.<layer>.<scope><leaf> (a global: leaf). */
static int emit(walker *w, k3_part part, uint64_t rows, uint64_t cols, const char *scope,
                const char *leaf)
{
    k3_spine_mat m = { .rows = rows, .cols = cols, .part = part, .layer = w->layer };
    if (w->layer < 0)
        snprintf(m.name, sizeof m.name, "%s", leaf);
    else
        snprintf(m.name, sizeof m.name, "model.layers.%d.%s%s", w->layer, scope, leaf);
    m.fmt = k3_spine_fmt(w->mode, part, cols);
    return w->fn(w->ctx, &m);
}

#define ATTN "self_attn."
#define MOE  "block_sparse_moe."

static int walk_kda(walker *w)
{
    const k3_config *c = w->c;
    uint64_t d = (uint64_t)c->hidden, hk = (uint64_t)c->kda_heads, dk = (uint64_t)c->kda_head_dim;
    uint64_t p = hk * dk;
    int rc;

    if ((rc = emit(w, K3_PART_KDA_PROJ, p, d, ATTN, "q_proj.weight")) ||
        (rc = emit(w, K3_PART_KDA_PROJ, p, d, ATTN, "k_proj.weight")) ||
        (rc = emit(w, K3_PART_KDA_PROJ, p, d, ATTN, "v_proj.weight")) ||
        (rc = emit(w, K3_PART_KDA_PROJ, p, d, ATTN, "g_proj.weight")) ||
        (rc = emit(w, K3_PART_KDA_PROJ, d, p, ATTN, "o_proj.weight")) ||
        (rc = emit(w, K3_PART_KDA_GATE, dk, d, ATTN, "f_a_proj.weight")) ||
        (rc = emit(w, K3_PART_KDA_GATE, p, dk, ATTN, "f_b_proj.weight")))
        return rc;
    return emit(w, K3_PART_KDA_GATE, hk, d, ATTN, "b_proj.weight");
}

static int walk_mla(walker *w)
{
    const k3_config *c = w->c;
    uint64_t d = (uint64_t)c->hidden, h = (uint64_t)c->n_heads, ql = (uint64_t)c->q_lora_rank;
    uint64_t kl = (uint64_t)c->kv_lora_rank, nope = (uint64_t)c->qk_nope_dim;
    uint64_t rope = (uint64_t)c->qk_rope_dim, vd = (uint64_t)c->v_head_dim;
    int rc;

    if ((rc = emit(w, K3_PART_MLA, ql, d, ATTN, "q_a_proj.weight")) ||
        (rc = emit(w, K3_PART_MLA, h * (nope + rope), ql, ATTN, "q_b_proj.weight")) ||
        (rc = emit(w, K3_PART_MLA, kl + rope, d, ATTN, "kv_a_proj_with_mqa.weight")) ||
        (rc = emit(w, K3_PART_MLA, h * kl, nope, ATTN, "kv_b_proj.weight")) ||
        (rc = emit(w, K3_PART_MLA, h * vd, kl, ATTN, "kv_b_proj.weight")) ||
        (rc = emit(w, K3_PART_MLA, h * vd, d, ATTN, "g_proj.weight")))
        return rc;
    return emit(w, K3_PART_MLA, d, h * vd, ATTN, "o_proj.weight");
}

static int walk_mlp(walker *w, k3_part part, const char *scope, uint64_t inter)
{
    uint64_t d = (uint64_t)w->c->hidden;
    int rc;

    if ((rc = emit(w, part, inter, d, scope, "gate_proj.weight")) ||
        (rc = emit(w, part, inter, d, scope, "up_proj.weight")))
        return rc;
    return emit(w, part, d, inter, scope, "down_proj.weight");
}

static int walk_layer(walker *w)
{
    const k3_config *c = w->c;
    const k3_layer_info *li = &c->layers[w->layer];
    uint64_t d = (uint64_t)c->hidden, lat = (uint64_t)c->latent;
    int rc = li->attn == K3_ATTN_KDA ? walk_kda(w) : walk_mla(w);

    if (rc)
        return rc;
    if (!li->moe)
        return walk_mlp(w, K3_PART_DENSE, "mlp.", (uint64_t)c->intermediate);
    if ((rc = emit(w, K3_PART_ROUTER, (uint64_t)c->n_experts, d, MOE, "gate.weight")) ||
        (rc = emit(w, K3_PART_LATENT, lat, d, MOE, "routed_expert_down_proj.weight")) ||
        (rc = emit(w, K3_PART_LATENT, d, lat, MOE, "routed_expert_up_proj.weight")))
        return rc;
    return walk_mlp(w, K3_PART_SHARED, "block_sparse_moe.shared_experts.",
                    (uint64_t)(c->n_shared_experts * c->moe_intermediate));
}

int k3_spine_walk(const k3_config *c, k3_spine_mode mode, k3_spine_fn fn, void *ctx)
{
    walker w = { c, mode, fn, ctx, -1 };
    int rc = emit(&w, K3_PART_HEAD, (uint64_t)c->vocab, (uint64_t)c->hidden, "",
                  "lm_head.weight");

    for (w.layer = 0; rc == 0 && w.layer < (int)c->n_layers; w.layer++)
        rc = walk_layer(&w);
    return rc;
}

static int add_sizes(void *ctx, const k3_spine_mat *m)
{
    k3_spine_sizes *s = ctx;
    uint64_t b = k3_mat_bytes(m);

    s->part[m->part] += b;
    s->matrices += b;
    s->n_matrices++;
    s->bf16_part[m->part] += m->rows * m->cols * 2;
    s->bf16_matrices += m->rows * m->cols * 2;
    if (m->layer >= 0)
        s->layer[m->layer] += b;
    else
        s->globals += b;
    return 0;
}

void k3_spine_sizes_get(const k3_config *c, k3_spine_mode mode, k3_spine_sizes *out)
{
    uint64_t d = (uint64_t)c->hidden, p = (uint64_t)(c->kda_heads * c->kda_head_dim);
    uint64_t floats = 2 * d;                          /* out_sw, model.norm */
    /* as stored: model.norm, output_attn_res_norm and _proj, BF16 */
    uint64_t ck = 3 * d * 2;

    memset(out, 0, sizeof *out);
    k3_spine_walk(c, mode, add_sizes, out);
    for (int64_t i = 0; i < c->n_layers; i++) {
        const k3_layer_info *li = &c->layers[i];
        floats += 4 * d;                              /* in/post norm, attn_sw, mlp_sw */
        ck += 6 * d * 2;          /* 4 norms + 2 res_proj [1, D], BF16 */
        if (li->attn == K3_ATTN_KDA) {                /* dt_bias, A, o_norm, conv taps */
            floats += 2 * p + (uint64_t)c->kda_head_dim + 3 * p * (uint64_t)c->kda_conv;
            /* F32 in the checkpoint: A_log [Dk], dt_bias [P], o_norm [Dk], conv [P,1,K] x3 */
            ck += 4 * (2 * (uint64_t)c->kda_head_dim + p + 3 * p * (uint64_t)c->kda_conv);
        } else {
            floats += (uint64_t)(c->q_lora_rank + c->kv_lora_rank);
            ck += 2 * (uint64_t)(c->q_lora_rank + c->kv_lora_rank);   /* the latent norms */
        }
        if (li->moe) {                                /* bias, latent norm, span pointers */
            floats += (uint64_t)(c->n_experts + c->latent) + 2 * (uint64_t)c->n_experts;
            ck += 4 * (uint64_t)c->n_experts + 2 * (uint64_t)c->latent;   /* F32 bias, BF16 norm */
        }
        if (out->layer[i] > out->layer_max)
            out->layer_max = out->layer[i];
    }
    out->vectors = floats * 4;
    out->embedding = (uint64_t)c->vocab * d * 2;
    /* the matrices in BF16, but kv_b_proj once (the walk splits it in two
     * whose sizes add up to it) and the embedding */
    out->checkpoint = out->bf16_matrices + out->embedding + ck;
}

uint64_t k3_kda_state_bytes(const k3_config *c)
{
    uint64_t p = (uint64_t)(c->kda_heads * c->kda_head_dim), dk = (uint64_t)c->kda_head_dim;
    uint64_t per = ((uint64_t)c->kda_heads * dk * dk + 3 * (uint64_t)(c->kda_conv - 1) * p) * 4;
    uint64_t n = 0;

    for (int64_t i = 0; i < c->n_layers; i++)
        n += c->layers[i].attn == K3_ATTN_KDA;
    return n * per;
}

uint64_t k3_mla_bytes_per_token(const k3_config *c)
{
    uint64_t n = 0;
    for (int64_t i = 0; i < c->n_layers; i++)
        n += c->layers[i].attn == K3_ATTN_MLA;
    return n * (uint64_t)(c->kv_lora_rank + c->qk_rope_dim) * 4;
}
