/* spine_size.c — the spine's bytes per format (spine_size.h). */
#include "common/spine_size.h"

#include <string.h>

static const char *const format_names[SPINE_FMT_COUNT] = { "bf16", "int8", "int4", "f32" };
static const char *const part_names[SPINE_PART_COUNT] = {
    "KDA q/k/v/g/o", "KDA gate path f_a/f_b/b", "KDA conv taps, A_log, dt_bias, o_norm",
    "MLA", "shared experts", "latent down/up", "routers", "dense MLP", "lm_head",
    "embedding", "norms, AttnRes vectors"
};

const char *spine_format_name(spine_format f)
{
    return (unsigned)f < SPINE_FMT_COUNT ? format_names[f] : "?";
}

const char *spine_part_name(spine_part p)
{
    return (unsigned)p < SPINE_PART_COUNT ? part_names[p] : "?";
}

int spine_format_parse(const char *s, spine_format *out)
{
    for (int f = 0; f < SPINE_FMT_COUNT; f++)
        if (s && strcmp(s, format_names[f]) == 0) {
            *out = (spine_format)f;
            return 0;
        }
    return SHOAL_EINVAL;
}

typedef struct tally {
    spine_format f;
    spine_size  *s;
} tally;

/* Is part p one of the large projections int4 quantizes? */
static int int4_part(spine_part p)
{
    return p == SPINE_KDA_PROJ || p == SPINE_SHARED || p == SPINE_LATENT || p == SPINE_DENSE;
}

/* A matrix [rows, cols] kept as the engine keeps it in t->f; keep_f32: a
 * router or gate path (f32 in the quantized formats). */
static void mat(tally *t, spine_part p, uint64_t rows, uint64_t cols, int keep_f32)
{
    uint64_t n = rows * cols, b;
    switch (t->f) {
    case SPINE_FMT_BF16: b = 2 * n; break;
    case SPINE_FMT_F32:  b = 4 * n; break;
    default:
        if (keep_f32 || cols % 32)
            b = 4 * n;                          /* f32 */
        else if (t->f == SPINE_FMT_INT4 && int4_part(p) && cols % 64 == 0)
            b = n / 2 + n / 64 * 2;             /* int4 + an f16 scale per 64 */
        else
            b = n + 4 * rows;                   /* int8 + an f32 scale per row */
    }
    t->s->part[p] += b;
    t->s->matrices += b;
}

/* A vector of n values stored in the checkpoint as f32 (else BF16). */
static void vec(tally *t, spine_part p, uint64_t n, int stored_f32)
{
    uint64_t b = t->f == SPINE_FMT_BF16 ? n * (stored_f32 ? 4 : 2) : 4 * n;
    t->s->part[p] += b;
    t->s->vectors += b;
}

static void kda(tally *t, const k3_config *c)
{
    uint64_t d = (uint64_t)c->hidden, p = (uint64_t)(c->kda_heads * c->kda_head_dim);
    uint64_t dk = (uint64_t)c->kda_head_dim, hk = (uint64_t)c->kda_heads;
    for (int i = 0; i < 4; i++)
        mat(t, SPINE_KDA_PROJ, p, d, 0);           /* q, k, v, g [P, D] */
    mat(t, SPINE_KDA_PROJ, d, p, 0);               /* o [D, P] */
    mat(t, SPINE_KDA_GATE, dk, d, 1);              /* f_a [dk, D] */
    mat(t, SPINE_KDA_GATE, p, dk, 1);              /* f_b [P, dk] */
    mat(t, SPINE_KDA_GATE, hk, d, 1);              /* b [hk, D] */
    vec(t, SPINE_KDA_SMALL, 3 * p * (uint64_t)c->kda_conv, 1);   /* conv taps [P, 1, K] x3 */
    vec(t, SPINE_KDA_SMALL, dk, 1);                /* A_log */
    vec(t, SPINE_KDA_SMALL, p, 1);                 /* dt_bias */
    vec(t, SPINE_KDA_SMALL, dk, 1);                /* o_norm */
    t->s->tensors += 14;
}

static void mla(tally *t, const k3_config *c)
{
    uint64_t d = (uint64_t)c->hidden, h = (uint64_t)c->n_heads, ql = (uint64_t)c->q_lora_rank;
    uint64_t kl = (uint64_t)c->kv_lora_rank, nope = (uint64_t)c->qk_nope_dim;
    uint64_t rope = (uint64_t)c->qk_rope_dim, vd = (uint64_t)c->v_head_dim;
    mat(t, SPINE_MLA, ql, d, 0);                   /* q_a */
    mat(t, SPINE_MLA, h * (nope + rope), ql, 0);   /* q_b */
    mat(t, SPINE_MLA, kl + rope, d, 0);            /* kv_a_proj_with_mqa */
    if (t->f == SPINE_FMT_BF16) {
        mat(t, SPINE_MLA, h * (nope + vd), kl, 0); /* kv_b as stored */
    } else {
        mat(t, SPINE_MLA, h * kl, nope, 0);        /* W_UK^T per head */
        mat(t, SPINE_MLA, h * vd, kl, 0);          /* W_UV per head */
    }
    mat(t, SPINE_MLA, h * vd, d, 0);               /* g */
    mat(t, SPINE_MLA, d, h * vd, 0);               /* o */
    vec(t, SPINE_MLA, ql, 0);                      /* q_a_layernorm */
    vec(t, SPINE_MLA, kl, 0);                      /* kv_a_layernorm */
    t->s->tensors += 8;
}

static void mlp(tally *t, spine_part p, uint64_t width, uint64_t d)
{
    mat(t, p, width, d, 0);                        /* gate */
    mat(t, p, width, d, 0);                        /* up */
    mat(t, p, d, width, 0);                        /* down */
    t->s->tensors += 3;
}

static void moe(tally *t, const k3_config *c)
{
    uint64_t d = (uint64_t)c->hidden, e = (uint64_t)c->n_experts, lat = (uint64_t)c->latent;
    mat(t, SPINE_ROUTER, e, d, 1);                 /* gate.weight */
    vec(t, SPINE_ROUTER, e, 1);                    /* gate.e_score_correction_bias */
    mat(t, SPINE_LATENT, lat, d, 0);               /* routed_expert_down_proj */
    mat(t, SPINE_LATENT, d, lat, 0);               /* routed_expert_up_proj */
    vec(t, SPINE_LATENT, lat, 0);                  /* routed_expert_norm */
    t->s->tensors += 5;
    mlp(t, SPINE_SHARED, (uint64_t)(c->n_shared_experts * c->moe_intermediate), d);
}

void spine_size_of(const k3_config *c, spine_format f, spine_size *out)
{
    tally t = { f, out };
    uint64_t d = (uint64_t)c->hidden, v = (uint64_t)c->vocab;

    memset(out, 0, sizeof *out);
    for (int64_t l = 0; l < c->n_layers && l < K3_MAX_LAYERS; l++) {
        vec(&t, SPINE_VECTORS, 4 * d, 0);          /* 4 norms [D] */
        vec(&t, SPINE_VECTORS, 2 * d, 0);          /* AttnRes projections [1, D] x2 */
        t.s->tensors += 6;
        if (c->layers[l].attn == K3_ATTN_KDA)
            kda(&t, c);
        else
            mla(&t, c);
        if (c->layers[l].moe)
            moe(&t, c);
        else
            mlp(&t, SPINE_DENSE, (uint64_t)c->intermediate, d);
    }
    mat(&t, SPINE_LM_HEAD, v, d, 0);
    vec(&t, SPINE_VECTORS, 3 * d, 0);              /* norm, output AttnRes norm and proj */
    out->embedding = v * d * 2;                    /* BF16, mapped, in every format */
    out->part[SPINE_EMBED] = out->embedding;
    out->tensors += 5;
    out->total = out->matrices + out->vectors + out->embedding;
    out->per_token = out->total - out->embedding + d * 2;
}
