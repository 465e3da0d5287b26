/* session.c — sequence state and the layer-major forward pass over a chunk
 * (k3.md §3.2 AttnRes stream, §3.6 chunking; the sublayers are in
 * layers.c).  Owns allocation of state and scratch, token checks, the
 * AttnRes bookkeeping and the head.  Does not own weights or experts. */
#include "engine/forward/forward_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/sys.h"

#define MAXZ(a, b) ((a) > (b) ? (a) : (b))

int session_mul(engine_session *s, const engine_mat *w, const float *x, size_t n, float *y,
                shoal_err *err)
{
    uint64_t t0 = shoal_now_ns();
    int rc = engine_mat_mul(s->opt.pool, w, x, n, y, s->w.act, err);
    s->st.spine_ns += shoal_now_ns() - t0;
    return rc;
}

int session_mla_reserve(engine_session *s, size_t need, shoal_err *err)
{
    const k3_config *c = &s->m->cfg;
    size_t cap = s->mla_cap ? s->mla_cap : 64;
    size_t kl = (size_t)c->kv_lora_rank, rope = (size_t)c->qk_rope_dim;

    if (need <= s->mla_cap)
        return 0;
    while (cap < need)
        cap *= 2;
    for (int64_t i = 0; i < c->n_layers; i++) {
        if (c->layers[i].attn != K3_ATTN_MLA)
            continue;
        float *nc = realloc(s->mla_c[i], cap * kl * sizeof *nc);
        if (!nc)
            return shoal_err_set(err, SHOAL_ENOMEM, "MLA cache: out of memory at %zu positions", cap);
        s->mla_c[i] = nc;
        float *nr = realloc(s->mla_r[i], cap * rope * sizeof *nr);
        if (!nr)
            return shoal_err_set(err, SHOAL_ENOMEM, "MLA cache: out of memory at %zu positions", cap);
        s->mla_r[i] = nr;
    }
    float *ns = realloc(s->w.score, (size_t)s->nthreads * cap * sizeof *ns);
    if (!ns)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    s->w.score = ns;
    s->w.score_cap = cap;
    s->mla_cap = cap;
    return 0;
}

static int ws_alloc(engine_session *s)
{
    const k3_config *c = &s->m->cfg;
    session_ws *w = &s->w;
    size_t n = s->opt.chunk, d = (size_t)c->hidden;
    size_t hk = (size_t)c->kda_heads, dk = (size_t)c->kda_head_dim, p = hk * dk;
    size_t h = (size_t)c->n_heads, ql = (size_t)c->q_lora_rank, kl = (size_t)c->kv_lora_rank;
    size_t rope = (size_t)c->qk_rope_dim, nope = (size_t)c->qk_nope_dim;
    size_t qk = nope + rope, vd = (size_t)c->v_head_dim;
    size_t ne = (size_t)c->n_experts, k = (size_t)c->n_experts_per_token, lat = (size_t)c->latent;
    size_t inter = MAXZ((size_t)c->intermediate, (size_t)(c->n_shared_experts * c->moe_intermediate));
    size_t cols = MAXZ(MAXZ(MAXZ(d, p), MAXZ(inter, lat)), MAXZ(MAXZ(ql, kl), MAXZ(nope, h * vd)));
    size_t nt = (size_t)s->nthreads;

#define A(ptr, count) (s->scratch_bytes += ((size_t)(count) + 1) * sizeof *(ptr), \
                      ptr = calloc((size_t)(count) + 1, sizeof *(ptr)), ptr != NULL)
    if (!(A(w->h, n * d) && A(w->x, n * d) && A(w->out, n * d) && A(w->out2, n * d) &&
          A(w->anchors, (size_t)s->max_anchors * n * d) &&
          A(w->kq, n * p) && A(w->kk, n * p) && A(w->kv, n * p) && A(w->kg, n * p) &&
          A(w->kz, n * p) && A(w->kfa, n * dk) && A(w->kb, n * hk) && A(w->ko, n * p) &&
          A(w->mqa, n * ql) && A(w->mq, n * h * qk) && A(w->mkv, n * (kl + rope)) &&
          A(w->mqabs, n * h * kl) && A(w->mctx, n * h * kl) && A(w->mo, n * h * vd) &&
          A(w->mg, n * h * vd) && A(w->mtmp_in, n * MAXZ(kl, nope)) &&
          A(w->mtmp_out, n * MAXZ(kl, vd)) &&
          A(w->fg, n * inter) && A(w->fu, n * inter) &&
          A(w->rs, n * ne) && A(w->rid, n * k) && A(w->rw, n * k) && A(w->rz, n * lat) &&
          A(w->slots, n * k * lat) && A(w->gz, n * lat) && A(w->go, n * lat) &&
          A(w->ones, n) && A(w->ru, n * lat) && A(w->e_cnt, ne) && A(w->e_off, ne + 1) &&
          A(w->pairs, n * k) && A(w->uniq, n * k) && A(w->tmp, nt * MAXZ(dk, d))))
        return SHOAL_ENOMEM;
#undef A
    for (size_t i = 0; i < n; i++)
        w->ones[i] = 1.0f;
    if (!(w->act = kernels_act_new((cols + 31) / 32 * 32, n)))
        return SHOAL_ENOMEM;
    /* kernels_act: int8 values, a scale per 32 and 8 bias words per 32 */
    s->scratch_bytes += (cols + 31) / 32 * 32 * n * 2 + (cols + 31) / 32 * n * 4;
    /* kernels_expert_ws: g, u, h [n][I], y [n][L] and two acts */
    s->scratch_bytes += n * (3 * (size_t)c->moe_intermediate + lat) * sizeof(float) +
                        n * ((size_t)c->moe_intermediate + lat) * 3;
    if (c->n_moe_layers > 0 &&
        !(w->ews = kernels_expert_ws_new((size_t)c->moe_intermediate, lat, n,
                                         (float)c->situ_beta, (float)c->situ_linear_beta)))
        return SHOAL_ENOMEM;
    return 0;
}

static void ws_free(session_ws *w)
{
    void *all[] = { w->h, w->x, w->out, w->out2, w->anchors, w->kq, w->kk, w->kv, w->kg, w->kz, w->kfa,
                    w->kb, w->ko, w->mqa, w->mq, w->mkv, w->mqabs, w->mctx, w->mo, w->mg,
                    w->mtmp_in, w->mtmp_out, w->score, w->fg, w->fu, w->rs, w->rid, w->rw,
                    w->rz, w->slots, w->gz, w->go, w->ones, w->ru, w->e_cnt, w->e_off,
                    w->pairs, w->uniq, w->tmp };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    kernels_act_free(w->act);
    kernels_expert_ws_free(w->ews);
}

int engine_session_new(const engine_model *m, const engine_session_options *opt,
                       engine_session **out, shoal_err *err)
{
    const k3_config *c = &m->cfg;
    size_t p = (size_t)(c->kda_heads * c->kda_head_dim), dk = (size_t)c->kda_head_dim;
    engine_session *s;
    int rc = 0;

    *out = NULL;
    if (!opt || opt->chunk < 1 || opt->chunk > 4096)
        return shoal_err_set(err, SHOAL_EINVAL, "session: chunk size must be 1..4096");
    if (c->n_moe_layers > 0 && !opt->src)
        return shoal_err_set(err, SHOAL_EINVAL, "session: the model has MoE layers but no expert source");
    if (!(s = calloc(1, sizeof *s)))
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    s->m = m;
    s->opt = *opt;
    s->nthreads = kernels_pool_nthreads(opt->pool);
    for (int64_t i = 0; i < c->n_layers; i++)
        s->max_anchors += c->layers[i].snapshot;
    if (s->max_anchors > 63) {
        free(s);
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "session: more than 63 AttnRes snapshots");
    }
    s->kda_S = calloc((size_t)c->n_layers, sizeof *s->kda_S);
    s->kda_conv = calloc((size_t)c->n_layers, sizeof *s->kda_conv);
    s->mla_c = calloc((size_t)c->n_layers, sizeof *s->mla_c);
    s->mla_r = calloc((size_t)c->n_layers, sizeof *s->mla_r);
    if (!s->kda_S || !s->kda_conv || !s->mla_c || !s->mla_r)
        rc = SHOAL_ENOMEM;
    for (int64_t i = 0; rc == 0 && i < c->n_layers; i++) {
        if (c->layers[i].attn != K3_ATTN_KDA)
            continue;
        s->kda_S[i] = calloc((size_t)c->kda_heads * dk * dk, sizeof(float));
        s->kda_conv[i] = calloc(3 * (size_t)(c->kda_conv - 1) * p + 1, sizeof(float));
        if (!s->kda_S[i] || !s->kda_conv[i])
            rc = SHOAL_ENOMEM;
    }
    if (rc == 0)
        rc = ws_alloc(s);
    if (rc == 0 && c->n_moe_layers > 0)
        rc = lookahead_alloc(s);
    if (rc == 0)
        rc = session_mla_reserve(s, 64, err);
    if (rc != 0) {
        engine_session_free(s);
        return shoal_err_set(err, rc, "session: out of memory");
    }
    *out = s;
    return 0;
}

void engine_session_free(engine_session *s)
{
    if (!s)
        return;
    for (int64_t i = 0; i < s->m->cfg.n_layers; i++) {
        if (s->kda_S)
            free(s->kda_S[i]);
        if (s->kda_conv)
            free(s->kda_conv[i]);
        if (s->mla_c)
            free(s->mla_c[i]);
        if (s->mla_r)
            free(s->mla_r[i]);
    }
    free(s->kda_S);
    free(s->kda_conv);
    free(s->mla_c);
    free(s->mla_r);
    ws_free(&s->w);
    lookahead_free(s);
    free(s);
}

void engine_session_recall(const engine_session *s, int layer, engine_layer_recall *out)
{
    memset(out, 0, sizeof *out);
    if (s->la.rec && layer >= 0 && layer < s->m->cfg.n_layers)
        *out = s->la.rec[layer];
}

int engine_session_copy(engine_session *dst, const engine_session *src, shoal_err *err)
{
    const k3_config *c = &src->m->cfg;
    size_t p = (size_t)(c->kda_heads * c->kda_head_dim), dk = (size_t)c->kda_head_dim;
    size_t kl = (size_t)c->kv_lora_rank, rope = (size_t)c->qk_rope_dim, pos = (size_t)src->pos;
    int rc;

    if (dst->m != src->m)
        return shoal_err_set(err, SHOAL_EINVAL, "session copy between two models");
    if (dst == src)
        return 0;
    if ((rc = session_mla_reserve(dst, pos, err)) != 0)
        return rc;
    for (int64_t i = 0; i < c->n_layers; i++) {
        if (c->layers[i].attn == K3_ATTN_KDA) {
            memcpy(dst->kda_S[i], src->kda_S[i], (size_t)c->kda_heads * dk * dk * sizeof(float));
            memcpy(dst->kda_conv[i], src->kda_conv[i],
                   3 * (size_t)(c->kda_conv - 1) * p * sizeof(float));
        } else if (pos > 0) {
            memcpy(dst->mla_c[i], src->mla_c[i], pos * kl * sizeof(float));
            memcpy(dst->mla_r[i], src->mla_r[i], pos * rope * sizeof(float));
        }
    }
    dst->pos = src->pos;
    return 0;
}

int64_t engine_session_pos(const engine_session *s)
{
    return s->pos;
}

uint64_t engine_session_bytes(const engine_session *s)
{
    const k3_config *c = &s->m->cfg;
    uint64_t b = s->scratch_bytes + (uint64_t)s->nthreads * s->w.score_cap * sizeof(float);
    uint64_t p = (uint64_t)(c->kda_heads * c->kda_head_dim);

    for (int64_t i = 0; i < c->n_layers; i++) {
        if (c->layers[i].attn == K3_ATTN_KDA)
            b += ((uint64_t)c->kda_heads * (uint64_t)c->kda_head_dim * (uint64_t)c->kda_head_dim +
                  3 * (uint64_t)(c->kda_conv - 1) * p) * sizeof(float);
        else
            b += s->mla_cap * (uint64_t)(c->kv_lora_rank + c->qk_rope_dim) * sizeof(float);
    }
    return b;
}

void engine_session_stats_get(const engine_session *s, engine_session_stats *out)
{
    *out = s->st;
}

/* For each token t: out[t] = Mix(v[t], anchors[0..na)[t], sw). */
static void mix_chunk(engine_session *s, const float *v, int na, const float *sw, size_t n,
                      float *out)
{
    size_t d = (size_t)s->m->cfg.hidden;
    const float *anc[64];

    for (size_t t = 0; t < n; t++) {
        for (int a = 0; a < na; a++)
            anc[a] = s->w.anchors + ((size_t)a * s->opt.chunk + t) * d;
        engine_attnres_mix(v + t * d, anc, (size_t)na, sw, d, s->m->cfg.rms_eps, out + t * d);
    }
}

static void norm_chunk(const float *x, const float *w, size_t n, size_t d, double eps, float *out)
{
    for (size_t t = 0; t < n; t++)
        engine_rmsnorm(x + t * d, w, d, eps, out + t * d);
}

/* One layer on the chunk (k3.md §3.2 steps 1-7); h [n][D] is the stream. */
static int layer_run(engine_session *s, int i, size_t n, int *na, shoal_err *err)
{
    const engine_layer_w *lw = &s->m->layers[i];
    session_ws *w = &s->w;
    size_t d = (size_t)s->m->cfg.hidden;
    double eps = s->m->cfg.rms_eps;
    int rc;

    /* 1. a_in; 2. snapshot (prefix = 0) or prefix = h, h doubling as prefix */
    if (*na > 0)
        mix_chunk(s, w->h, *na, lw->attn_sw, n, w->x);
    else
        memcpy(w->x, w->h, n * d * sizeof *w->x);
    if (lw->info.snapshot) {
        memcpy(w->anchors + (size_t)*na * s->opt.chunk * d, w->h, n * d * sizeof *w->h);
        (*na)++;
        memset(w->h, 0, n * d * sizeof *w->h);
    }
    /* 3-4. prefix += Attn(RMSNorm(a_in)) */
    norm_chunk(w->x, lw->in_norm, n, d, eps, w->x);
    rc = lw->info.attn == K3_ATTN_KDA ? layer_kda(s, i, w->x, n, w->out, err)
                                      : layer_mla(s, i, w->x, n, w->out, err);
    if (rc != 0)
        return rc;
    for (size_t j = 0; j < n * d; j++)
        w->h[j] += w->out[j];
    /* 5-7. h = prefix + MLP(RMSNorm(Mix(prefix, anchors))) */
    mix_chunk(s, w->h, *na, lw->mlp_sw, n, w->x);
    norm_chunk(w->x, lw->post_norm, n, d, eps, w->x);
    rc = lw->info.moe ? layer_moe(s, i, w->x, n, w->out, err)
                      : layer_dense(s, &lw->dense, w->x, n, w->out, err);
    if (rc != 0)
        return rc;
    for (size_t j = 0; j < n * d; j++)
        w->h[j] += w->out[j];
    return 0;
}

static int forward_chunk(engine_session *s, const int32_t *tok, size_t n, float *logits,
                         shoal_err *err)
{
    const engine_model *m = s->m;
    session_ws *w = &s->w;
    size_t d = (size_t)m->cfg.hidden;
    int na = 0, rc;

    if ((rc = session_mla_reserve(s, (size_t)s->pos + n, err)) != 0)
        return rc;
    for (size_t t = 0; t < n; t++)
        engine_model_embed(m, tok[t], w->h + t * d);
    for (int i = 0; i < (int)m->cfg.n_layers; i++) {
        if ((rc = layer_run(s, i, n, &na, err)) != 0)
            return shoal_err_wrap(err, rc, "layer %d", i);
        if (s->opt.hidden)
            for (size_t t = 0; t < n; t++)
                s->opt.hidden(s->opt.hidden_ctx, s->pos + (int64_t)t, i, w->h + t * d, d);
    }
    /* tail (k3.md §3.2): the last position only */
    if (logits) {
        const float *anc[64];
        float *y = w->x;
        for (int a = 0; a < na; a++)
            anc[a] = w->anchors + ((size_t)a * s->opt.chunk + n - 1) * d;
        engine_attnres_mix(w->h + (n - 1) * d, anc, (size_t)na, m->out_sw, d, m->cfg.rms_eps, y);
        engine_rmsnorm(y, m->final_norm, d, m->cfg.rms_eps, y);
        if ((rc = session_mul(s, &m->lm_head, y, 1, logits, err)) != 0)
            return rc;
    }
    s->pos += (int64_t)n;
    s->st.positions += n;
    s->st.chunks++;
    return 0;
}

int engine_session_run(engine_session *s, const int32_t *tokens, size_t n, float *logits,
                       shoal_err *err)
{
    const k3_config *c = &s->m->cfg;
    uint64_t t0 = shoal_now_ns();
    int rc = 0;

    if (n == 0)
        return shoal_err_set(err, SHOAL_EINVAL, "no tokens to run");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return shoal_err_set(err, SHOAL_ERANGE, "token id %d is outside the vocabulary [0, %lld)",
                                 (int)tokens[i], (long long)c->vocab);
    if (s->pos + (int64_t)n > c->max_positions)
        return shoal_err_set(err, SHOAL_ERANGE, "%lld positions exceed max_position_embeddings %lld",
                             (long long)(s->pos + (int64_t)n), (long long)c->max_positions);
    for (size_t off = 0; off < n && rc == 0; off += s->opt.chunk) {
        size_t len = n - off < s->opt.chunk ? n - off : s->opt.chunk;
        rc = forward_chunk(s, tokens + off, len, off + len == n ? logits : NULL, err);
    }
    s->st.total_ns += shoal_now_ns() - t0;
    return rc;
}
