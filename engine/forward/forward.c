/* forward.c — the forward pass of one sequence (k3.md §3), in the order one
 * token flows: session setup, then a chunk of tokens through the stack.
 *
 * Owns: allocation of per-sequence state and scratch, token checks, the
 * AttnRes stream and its bookkeeping (§3.2), the sublayers — KDA (§3.3),
 * gated NoPE MLA (§3.4), the dense SiTU MLP and the LatentMoE (§3.5) — and
 * the head.  Every sublayer takes the chunk's n normed inputs x [n][D] and
 * writes out [n][D]; products run batched over the chunk (§3.6), sequential
 * state advances token by token.  Does not own weights (model.c), the
 * small arithmetic steps (ops.c), where experts come from (the expert
 * source, forward.h part 4), nor the router lookahead (lookahead.c).
 *
 * How one token flows.  Session setup comes first; then the steps of the
 * pass in the order a token meets them (C wants a callee before its caller,
 * so the two drivers, forward_chunk and engine_session_run, close the file):
 *   engine_session_new        state: KDA windows and S, MLA cache, scratch
 *   engine_session_run        checks the ids, cuts the input into chunks,
 *   forward_chunk             and runs each chunk through the whole stack:
 *     embed_chunk               1. the embedding row of each token
 *     layer_run                 2. each layer (k3.md §3.2 steps 1-7):
 *       mix_chunk, norm_chunk        AttnRes mix of the stream, RMSNorm
 *       layer_kda                    KDA: projections, conv (kda_conv), L2,
 *         kda_conv, kda_heads_run      decay, recurrence (kda_heads_run), gate
 *       layer_mla                    or MLA: latent q/kv, cache, absorbed
 *         mla_attend_run               scores and context, W_UV, gate, W_o
 *       mix_chunk, norm_chunk        AttnRes mix again, RMSNorm
 *       layer_dense                  the dense SiTU MLP, or
 *       layer_moe                    the MoE: router and selection
 *         moe_route                    (moe_route), latent down, shared
 *         moe_expert_ready             experts, each routed expert as it
 *                                      arrives, aggregate, norm, up
 *     tail_logits               3. the tail: AttnRes mix, final norm, lm_head
 * The weights each step reads, with their shapes, are in forward.h part 2.
 */
#include "engine/forward/forward_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/sys.h"

#define MAXZ(a, b) ((a) > (b) ? (a) : (b))

/* ==== session setup ====================================================== */


/* The most positions the session holds: the plan's context, or the model's. */
static int64_t session_ctx(const engine_session *s)
{
    int64_t max = s->m->cfg.max_positions;
    return s->opt.max_positions > 0 && s->opt.max_positions < max ? s->opt.max_positions : max;
}

/* Grow the MLA cache to hold `need` positions, doubling, but never past
 * the session's context (the memory plan counted exactly that many). */
static int session_mla_reserve(engine_session *s, size_t need, shoal_err *err)
{
    const k3_config *c = &s->m->cfg;
    size_t cap = s->mla_cap ? s->mla_cap : 64, ctx = (size_t)session_ctx(s);
    size_t kl = (size_t)c->kv_lora_rank, rope = (size_t)c->qk_rope_dim;

    if (need <= s->mla_cap)
        return 0;
    while (cap < need)
        cap *= 2;
    if (cap > ctx)
        cap = ctx > need ? ctx : need;
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
    s->layer_loads = calloc((size_t)c->n_layers, sizeof *s->layer_loads);
    if (!s->kda_S || !s->kda_conv || !s->mla_c || !s->mla_r || !s->layer_loads)
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
        rc = session_mla_reserve(s, session_ctx(s) < 64 ? (size_t)session_ctx(s) : 64, err);
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
    free(s->layer_loads);
    ws_free(&s->w);
    lookahead_free(s);
    free(s);
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

void engine_session_recall(const engine_session *s, int layer, engine_layer_recall *out)
{
    memset(out, 0, sizeof *out);
    if (s->la.rec && layer >= 0 && layer < s->m->cfg.n_layers)
        *out = s->la.rec[layer];
}

uint64_t engine_session_layer_loads(const engine_session *s, int layer)
{
    return layer >= 0 && layer < s->m->cfg.n_layers ? s->layer_loads[layer] : 0;
}

/* ==== one chunk through the stack ========================================= */

/* y [n][rows] = W x, timed as spine: every projection below goes through it. */
int session_mul(engine_session *s, const engine_mat *w, const float *x, size_t n, float *y,
                shoal_err *err)
{
    uint64_t t0 = shoal_now_ns();
    int rc = engine_mat_mul(s->opt.pool, w, x, n, y, s->w.act, err);
    s->st.spine_ns += shoal_now_ns() - t0;
    return rc;
}

/* ---- 1. embedding ----------------------------------------------------------- */

static void embed_chunk(engine_session *s, const int32_t *tok, size_t n)
{
    size_t d = (size_t)s->m->cfg.hidden;
    for (size_t t = 0; t < n; t++)
        engine_model_embed(s->m, tok[t], s->w.h + t * d);
}

/* ---- 2. the layers: AttnRes mix ---------------------------------------------- */


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

/* ---- 2. the layers: KDA ------------------------------------------------------ */

typedef struct kda_job {
    engine_session *s;
    int layer;
    size_t n;
} kda_job;

/* Causal depthwise conv (taps [P][K], tap K-1 = current input) then SiLU,
 * over the chunk in order; win [K-1][P] holds the previous inputs. */
static void kda_conv(float *x, size_t n, size_t p, size_t kw, const float *taps, float *win)
{
    for (size_t t = 0; t < n; t++) {
        float *xt = x + t * p;
        for (size_t ch = 0; ch < p; ch++) {
            const float *tp = taps + ch * kw;
            float in = xt[ch], y = 0;
            for (size_t j = 0; j + 1 < kw; j++)
                y += tp[j] * win[j * p + ch];
            y += tp[kw - 1] * in;
            for (size_t j = 0; j + 2 < kw; j++)
                win[j * p + ch] = win[(j + 1) * p + ch];
            if (kw > 1)
                win[(kw - 2) * p + ch] = in;
            xt[ch] = y * engine_sigmoid(y);
        }
    }
}

/* Delta-rule recurrence: heads split across threads, tokens in order. */
static void kda_heads_run(void *ctx, int tid, int nthreads)
{
    kda_job *j = ctx;
    engine_session *s = j->s;
    const k3_config *c = &s->m->cfg;
    size_t hk = (size_t)c->kda_heads, dk = (size_t)c->kda_head_dim, p = hk * dk;
    float *tmp = s->w.tmp + (size_t)tid * (dk > (size_t)c->hidden ? dk : (size_t)c->hidden);

    for (size_t h = (size_t)tid; h < hk; h += (size_t)nthreads) {
        float *S = s->kda_S[j->layer] + h * dk * dk;
        for (size_t t = 0; t < j->n; t++) {
            size_t off = t * p + h * dk;
            engine_kda_step(S, s->w.kq + off, s->w.kk + off, s->w.kv + off, s->w.kz + off,
                            s->w.kb[t * hk + h], dk, dk, s->w.ko + off, tmp);
        }
    }
}

static int layer_kda(engine_session *s, int layer, const float *x, size_t n, float *out,
                     shoal_err *err)
{
    const k3_config *c = &s->m->cfg;
    const engine_kda_w *w = &s->m->layers[layer].kda;
    session_ws *ws = &s->w;
    size_t hk = (size_t)c->kda_heads, dk = (size_t)c->kda_head_dim, p = hk * dk;
    size_t kw = (size_t)c->kda_conv;
    float qscale = 1.0f / sqrtf((float)dk), lower = (float)c->kda_gate_lower_bound;
    kda_job job = { s, layer, n };
    int rc;

    /* 1, 4, 5, 7: the chunk's projections */
    if ((rc = session_mul(s, &w->q, x, n, ws->kq, err)) || (rc = session_mul(s, &w->k, x, n, ws->kk, err)) ||
        (rc = session_mul(s, &w->v, x, n, ws->kv, err)) || (rc = session_mul(s, &w->g, x, n, ws->kg, err)) ||
        (rc = session_mul(s, &w->fa, x, n, ws->kfa, err)) ||
        (rc = session_mul(s, &w->fb, ws->kfa, n, ws->kz, err)) ||
        (rc = session_mul(s, &w->b, x, n, ws->kb, err)))
        return rc;
    uint64_t t0 = shoal_now_ns();
    /* 2. conv + SiLU; 3. L2 norm per head, q scaled by Dk^-1/2 */
    float *win = s->kda_conv[layer];
    kda_conv(ws->kq, n, p, kw, w->conv[0], win);
    kda_conv(ws->kk, n, p, kw, w->conv[1], win + (kw - 1) * p);
    kda_conv(ws->kv, n, p, kw, w->conv[2], win + 2 * (kw - 1) * p);
    for (size_t t = 0; t < n; t++)
        for (size_t h = 0; h < hk; h++) {
            float *q = ws->kq + t * p + h * dk, *k = ws->kk + t * p + h * dk;
            engine_l2norm(q, dk, s->m->opt.l2);
            engine_l2norm(k, dk, s->m->opt.l2);
            for (size_t j = 0; j < dk; j++)
                q[j] *= qscale;
        }
    /* 4. decay α = exp(lower·σ(A·(z + dt_bias))) in place of z; 5. β = σ(b) */
    for (size_t t = 0; t < n; t++) {
        float *z = ws->kz + t * p;
        for (size_t ch = 0; ch < p; ch++)
            z[ch] = expf(lower * engine_sigmoid(w->A[ch] * (z[ch] + w->dt_bias[ch])));
        for (size_t h = 0; h < hk; h++)
            ws->kb[t * hk + h] = engine_sigmoid(ws->kb[t * hk + h]);
    }
    /* 6. recurrence */
    kernels_pool_run(s->opt.pool, kda_heads_run, &job);
    /* 7. y_h = RMSNorm(o_h) ⊙ σ(g_h) */
    for (size_t t = 0; t < n; t++)
        for (size_t h = 0; h < hk; h++) {
            float *o = ws->ko + t * p + h * dk;
            const float *g = ws->kg + t * p + h * dk;
            engine_rmsnorm(o, w->o_norm, dk, c->rms_eps, o);
            for (size_t j = 0; j < dk; j++)
                o[j] *= engine_sigmoid(g[j]);
        }
    s->st.attn_ns += shoal_now_ns() - t0;
    return session_mul(s, &w->o, ws->ko, n, out, err);
}

/* ---- 2. the layers: MLA ------------------------------------------------------ */

typedef struct mla_job {
    engine_session *s;
    int layer;
    size_t n;
} mla_job;

/* Scores and context for every (token, head): token t sees positions
 * 0..pos+t; ctx = Σ softmax(score)_s · c_s in the latent space. */
static void mla_attend_run(void *ctx, int tid, int nthreads)
{
    mla_job *j = ctx;
    engine_session *s = j->s;
    const k3_config *c = &s->m->cfg;
    size_t h = (size_t)c->n_heads, kl = (size_t)c->kv_lora_rank, rope = (size_t)c->qk_rope_dim;
    size_t qk = (size_t)c->qk_nope_dim + rope;
    const float *cc = s->mla_c[j->layer], *rr = s->mla_r[j->layer];
    double scale = 1.0 / sqrt((double)qk);
    float *p = s->w.score + (size_t)tid * s->w.score_cap;

    for (size_t item = (size_t)tid; item < j->n * h; item += (size_t)nthreads) {
        size_t t = item / h, hh = item % h, len = (size_t)s->pos + t + 1;
        const float *qa = s->w.mqabs + (t * h + hh) * kl;
        const float *qx = s->w.mq + t * h * qk + hh * qk + (qk - rope);
        float *cx = s->w.mctx + (t * h + hh) * kl;
        double mx = -INFINITY, sum = 0;
        for (size_t sp = 0; sp < len; sp++) {
            double acc = 0;
            for (size_t l = 0; l < kl; l++)
                acc += (double)qa[l] * cc[sp * kl + l];
            for (size_t r = 0; r < rope; r++)
                acc += (double)qx[r] * rr[sp * rope + r];
            p[sp] = (float)(acc * scale);
            if (p[sp] > mx)
                mx = p[sp];
        }
        for (size_t sp = 0; sp < len; sp++) {
            p[sp] = (float)exp(p[sp] - mx);
            sum += p[sp];
        }
        for (size_t l = 0; l < kl; l++)
            cx[l] = 0;
        for (size_t sp = 0; sp < len; sp++) {
            float pw = (float)(p[sp] / sum);
            for (size_t l = 0; l < kl; l++)
                cx[l] += pw * cc[sp * kl + l];
        }
    }
}

static int layer_mla(engine_session *s, int layer, const float *x, size_t n, float *out,
                     shoal_err *err)
{
    const k3_config *c = &s->m->cfg;
    const engine_mla_w *w = &s->m->layers[layer].mla;
    session_ws *ws = &s->w;
    size_t h = (size_t)c->n_heads, ql = (size_t)c->q_lora_rank, kl = (size_t)c->kv_lora_rank;
    size_t nope = (size_t)c->qk_nope_dim, rope = (size_t)c->qk_rope_dim, qk = nope + rope;
    size_t vd = (size_t)c->v_head_dim;
    double qeps = s->m->opt.mla_eps;
    mla_job job = { s, layer, n };
    int rc;

    /* 1. q = W_qb RMSNorm(W_qa x) */
    if ((rc = session_mul(s, &w->q_a, x, n, ws->mqa, err)))
        return rc;
    for (size_t t = 0; t < n; t++)
        engine_rmsnorm(ws->mqa + t * ql, w->q_a_norm, ql, qeps, ws->mqa + t * ql);
    if ((rc = session_mul(s, &w->q_b, ws->mqa, n, ws->mq, err)) ||
        (rc = session_mul(s, &w->kv_a, x, n, ws->mkv, err)))
        return rc;
    /* 2-3. append the chunk's c (normed) and r (raw) to the cache first */
    for (size_t t = 0; t < n; t++) {
        const float *kv = ws->mkv + t * (kl + rope);
        size_t ps = (size_t)s->pos + t;
        engine_rmsnorm(kv, w->kv_a_norm, kl, qeps, s->mla_c[layer] + ps * kl);
        memcpy(s->mla_r[layer] + ps * rope, kv + kl, rope * sizeof(float));
    }
    /* 5 (absorbed): q_abs,h = W_UK,hᵀ q_nope,h, so q_nope·(W_UK c) = q_abs·c */
    for (size_t hh = 0; hh < h; hh++) {
        engine_mat ukt = engine_mat_rows(&w->ukt, hh * kl, kl);
        for (size_t t = 0; t < n; t++)
            memcpy(ws->mtmp_in + t * nope, ws->mq + t * h * qk + hh * qk, nope * sizeof(float));
        if ((rc = session_mul(s, &ukt, ws->mtmp_in, n, ws->mtmp_out, err)))
            return rc;
        for (size_t t = 0; t < n; t++)
            memcpy(ws->mqabs + (t * h + hh) * kl, ws->mtmp_out + t * kl, kl * sizeof(float));
    }
    uint64_t t0 = shoal_now_ns();
    kernels_pool_run(s->opt.pool, mla_attend_run, &job);
    s->st.attn_ns += shoal_now_ns() - t0;
    /* 6. o_h = W_UV,h ctx_h */
    for (size_t hh = 0; hh < h; hh++) {
        engine_mat uv = engine_mat_rows(&w->uv, hh * vd, vd);
        for (size_t t = 0; t < n; t++)
            memcpy(ws->mtmp_in + t * kl, ws->mctx + (t * h + hh) * kl, kl * sizeof(float));
        if ((rc = session_mul(s, &uv, ws->mtmp_in, n, ws->mtmp_out, err)))
            return rc;
        for (size_t t = 0; t < n; t++)
            memcpy(ws->mo + t * h * vd + hh * vd, ws->mtmp_out + t * vd, vd * sizeof(float));
    }
    /* 7. att = W_o (o ⊙ σ(W_g x)) */
    if ((rc = session_mul(s, &w->g, x, n, ws->mg, err)))
        return rc;
    for (size_t j = 0; j < n * h * vd; j++)
        ws->mo[j] *= engine_sigmoid(ws->mg[j]);
    return session_mul(s, &w->o, ws->mo, n, out, err);
}

/* ---- 2. the layers: dense MLP (and the MoE's shared experts) ----------------- */

static int layer_dense(engine_session *s, const engine_mlp_w *w, const float *x, size_t n,
                       float *out, shoal_err *err)
{
    const k3_config *c = &s->m->cfg;
    size_t inter = w->gate.rows;
    int rc;

    if ((rc = session_mul(s, &w->gate, x, n, s->w.fg, err)) ||
        (rc = session_mul(s, &w->up, x, n, s->w.fu, err)))
        return rc;
    kernels_situ(s->w.fg, s->w.fu, s->w.fg, n * inter, (float)c->situ_beta,
                 (float)c->situ_linear_beta);
    return session_mul(s, &w->down, s->w.fg, n, out, err);
}

/* ---- 2. the layers: LatentMoE ------------------------------------------------ */

typedef struct moe_ctx {
    engine_session *s;
    size_t n;
    shoal_err *err;
} moe_ctx;

/* Route every token, then group (token, slot) pairs by expert: e_cnt[e],
 * e_off[e] into pairs[] (pair = t·k + slot), uniq[] the distinct ids in
 * ascending order.  Returns the number of distinct experts. */
static size_t moe_route(engine_session *s, const engine_moe_w *w, size_t n)
{
    const k3_config *c = &s->m->cfg;
    session_ws *ws = &s->w;
    size_t ne = (size_t)c->n_experts, k = (size_t)c->n_experts_per_token, nu = 0;

    for (size_t t = 0; t < n; t++) {
        float *sc = ws->rs + t * ne;
        for (size_t e = 0; e < ne; e++)
            sc[e] = engine_sigmoid(sc[e]);
        engine_route_topk(sc, w->bias, ne, k, c->renormalize, c->routed_scaling,
                          ws->rid + t * k, ws->rw + t * k);
    }
    memset(ws->e_cnt, 0, ne * sizeof *ws->e_cnt);
    for (size_t j = 0; j < n * k; j++)
        ws->e_cnt[ws->rid[j]]++;
    ws->e_off[0] = 0;
    for (size_t e = 0; e < ne; e++) {
        ws->e_off[e + 1] = ws->e_off[e] + ws->e_cnt[e];
        if (ws->e_cnt[e])
            ws->uniq[nu++] = (int32_t)e;
    }
    memset(ws->e_cnt, 0, ne * sizeof *ws->e_cnt);
    for (size_t j = 0; j < n * k; j++) {
        int32_t e = ws->rid[j];
        ws->pairs[ws->e_off[e] + ws->e_cnt[e]++] = (int32_t)j;
    }
    return nu;
}

/* One expert has arrived: run it on the tokens that chose it and leave each
 * token's result in its routing slot (aggregated later in routing order,
 * so arrival order and chunk size do not change the sums). */
static int moe_expert_ready(void *ctx, int layer, int32_t e, const uint8_t *span, size_t bytes,
                            expert_tier tier, int status, const shoal_err *detail)
{
    moe_ctx *mc = ctx;
    engine_session *s = mc->s;
    const k3_config *c = &s->m->cfg;
    session_ws *ws = &s->w;
    size_t lat = (size_t)c->latent, k = (size_t)c->n_experts_per_token;
    kernels_expert ex;
    uint64_t t0 = shoal_now_ns();
    int rc;

    (void)tier;
    if (status != 0)
        return shoal_err_set(mc->err, status, "layer %d expert %d: %s", layer, (int)e,
                             detail ? detail->msg : shoal_strerror(status));
    if (bytes != c->expert_bytes)
        return shoal_err_set(mc->err, SHOAL_EPROTO, "layer %d expert %d: %zu bytes, expected %llu",
                             layer, (int)e, bytes, (unsigned long long)c->expert_bytes);
    size_t first = (size_t)ws->e_off[e], cnt = (size_t)ws->e_cnt[e];
    for (size_t i = 0; i < cnt; i++) {
        size_t t = (size_t)ws->pairs[first + i] / k;
        memcpy(ws->gz + i * lat, ws->rz + t * lat, lat * sizeof(float));
    }
    memset(ws->go, 0, cnt * lat * sizeof(float));
    rc = kernels_expert_view(span, (size_t)c->moe_intermediate, lat, &ex, mc->err);
    if (rc == 0)
        rc = kernels_expert_apply(ws->ews, s->opt.pool, &ex, ws->gz, cnt, ws->ones, ws->go,
                                  s->opt.experts, mc->err);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < cnt; i++)
        memcpy(ws->slots + (size_t)ws->pairs[first + i] * lat, ws->go + i * lat, lat * sizeof(float));
    s->st.expert_ns += shoal_now_ns() - t0;
    s->st.expert_uses += cnt;
    return 0;
}

/* Experts applied elsewhere (forward.h part 4b): the batch handed over
 * after the latent down projection, and the wait for its outputs, timed
 * as waiting for experts. */
static engine_moe_batch moe_applied_batch(engine_session *s, int layer, size_t n, size_t nu)
{
    const k3_config *c = &s->m->cfg;
    session_ws *ws = &s->w;

    return (engine_moe_batch){
        .layer = layer, .n = n, .k = (size_t)c->n_experts_per_token,
        .latent = (size_t)c->latent, .z = ws->rz, .n_ids = nu, .ids = ws->uniq,
        .cnt = ws->e_cnt, .first = ws->e_off, .pairs = ws->pairs, .slots = ws->slots,
    };
}

static int moe_applied_wait(engine_session *s, const engine_moe_batch *b, shoal_err *err)
{
    uint64_t t0 = shoal_now_ns();
    int rc = s->opt.applier->wait(s->opt.applier->ctx, b, err);

    s->st.wait_ns += shoal_now_ns() - t0;
    s->st.expert_uses += b->n * b->k;
    return rc;
}

static int layer_moe(engine_session *s, int layer, const float *x, size_t n, float *out,
                     shoal_err *err)
{
    const k3_config *c = &s->m->cfg;
    const engine_moe_w *w = &s->m->layers[layer].moe;
    session_ws *ws = &s->w;
    size_t lat = (size_t)c->latent, k = (size_t)c->n_experts_per_token, d = (size_t)c->hidden;
    moe_ctx mc = { s, n, err };
    expert_source_stats before, after;
    uint64_t t0 = shoal_now_ns();
    size_t nu;
    int rc;

    /* 1-3. router (f32), selection on biased scores, weights */
    if ((rc = session_mul(s, &w->gate, x, n, ws->rs, err)))
        return rc;
    nu = moe_route(s, w, n);
    lookahead_observe(s, layer, ws->uniq, nu);
    /* one pass over the layer's part of the files: the source asks for and
     * reads the set in file order (results do not depend on the order:
     * each expert's outputs go to their routing slots) */
    expert_source_order(s->opt.src, layer, ws->uniq, nu);
    /* the experts go out now; everything up to the fetch overlaps their
     * transfer: the next layer's guess, the latent input, the shared experts */
    if ((rc = expert_source_request(s->opt.src, layer, ws->uniq, nu, 0, err)) ||
        (rc = lookahead_issue(s, layer, x, n, err)))
        return rc;
    /* 4. latent input; experts applied elsewhere get it now (part 4b) */
    if ((rc = session_mul(s, &w->down, x, n, ws->rz, err)))
        return rc;
    engine_moe_batch rb = moe_applied_batch(s, layer, n, nu);
    if (s->opt.applier && (rc = s->opt.applier->send(s->opt.applier->ctx, &rb, err)))
        return rc;
    /* 7. shared experts (added to the routed output below) */
    if ((rc = layer_dense(s, &w->shared, x, n, ws->out2, err)))
        return rc;
    /* 5. each distinct expert once for the chunk, computed as it arrives */
    if (s->opt.applier) {
        if ((rc = moe_applied_wait(s, &rb, err)) != 0)
            return rc;
    } else {
        expert_source_stats_get(s->opt.src, &before);
        rc = expert_source_fetch(s->opt.src, layer, ws->uniq, nu, moe_expert_ready, &mc, err);
        expert_source_stats_get(s->opt.src, &after);
        s->st.wait_ns += after.wait_ns - before.wait_ns;
        if (rc != 0)
            return rc;
        if (after.experts - before.experts != nu)
            return shoal_err_set(err, SHOAL_EINTERNAL, "expert source delivered %llu of %zu experts",
                                 (unsigned long long)(after.experts - before.experts), nu);
    }
    s->st.expert_loads += nu;
    s->layer_loads[layer] += nu;
    s->st.moe_calls++;
    /* U = Σ w_e y_e in routing order; then RMSNorm and the up projection */
    for (size_t t = 0; t < n; t++) {
        float *u = ws->ru + t * lat;
        memset(u, 0, lat * sizeof *u);
        for (size_t j = 0; j < k; j++) {
            const float *y = ws->slots + (t * k + j) * lat;
            float we = ws->rw[t * k + j];
            for (size_t l = 0; l < lat; l++)
                u[l] += we * y[l];
        }
        if (c->latent_norm)
            engine_rmsnorm(u, w->norm, lat, c->rms_eps, u);
    }
    if ((rc = session_mul(s, &w->up, ws->ru, n, out, err)))
        return rc;
    /* 8. plus the shared experts */
    for (size_t j = 0; j < n * d; j++)
        out[j] += ws->out2[j];
    s->st.moe_ns += shoal_now_ns() - t0;
    return 0;
}

/* ---- one layer ---------------------------------------------------------------- */

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

/* ---- 3. the tail (k3.md §3.2): the last position only ------------------------- */

static int tail_logits(engine_session *s, size_t n, int na, float *logits, shoal_err *err)
{
    const engine_model *m = s->m;
    session_ws *w = &s->w;
    size_t d = (size_t)m->cfg.hidden;
    const float *anc[64];
    float *y = w->x;

    for (int a = 0; a < na; a++)
        anc[a] = w->anchors + ((size_t)a * s->opt.chunk + n - 1) * d;
    engine_attnres_mix(w->h + (n - 1) * d, anc, (size_t)na, m->out_sw, d, m->cfg.rms_eps, y);
    engine_rmsnorm(y, m->final_norm, d, m->cfg.rms_eps, y);
    return session_mul(s, &m->lm_head, y, 1, logits, err);
}

/* ---- the chunk and the run ------------------------------------------------------ */


static int forward_chunk(engine_session *s, const int32_t *tok, size_t n, float *logits,
                         shoal_err *err)
{
    const engine_model *m = s->m;
    session_ws *w = &s->w;
    size_t d = (size_t)m->cfg.hidden;
    int na = 0, rc;

    if ((rc = session_mla_reserve(s, (size_t)s->pos + n, err)) != 0)
        return rc;
    embed_chunk(s, tok, n);
    for (int i = 0; i < (int)m->cfg.n_layers; i++) {
        if ((rc = engine_model_layer_ready(m, i, err)) != 0 ||   /* the streamed spine */
            (rc = layer_run(s, i, n, &na, err)) != 0)
            return shoal_err_wrap(err, rc, "layer %d", i);
        if (s->opt.hidden)
            for (size_t t = 0; t < n; t++)
                s->opt.hidden(s->opt.hidden_ctx, s->pos + (int64_t)t, i, w->h + t * d, d);
    }
    if (logits && (rc = tail_logits(s, n, na, logits, err)) != 0)
        return rc;
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
    if (s->pos + (int64_t)n > session_ctx(s))
        return shoal_err_set(err, SHOAL_ERANGE, "%lld positions exceed the context of %lld "
                             "tokens (%s)", (long long)(s->pos + (int64_t)n),
                             (long long)session_ctx(s),
                             session_ctx(s) < c->max_positions ? "the memory plan's cap; "
                             "--context or more memory to raise it"
                                                               : "max_position_embeddings");
    for (size_t off = 0; off < n && rc == 0; off += s->opt.chunk) {
        size_t len = n - off < s->opt.chunk ? n - off : s->opt.chunk;
        rc = forward_chunk(s, tokens + off, len, off + len == n ? logits : NULL, err);
    }
    s->st.total_ns += shoal_now_ns() - t0;
    return rc;
}
