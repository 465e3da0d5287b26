/* layers.c — the sublayers of the K3 forward pass, one function per kind,
 * used by every layer of that kind: KDA (k3.md §3.3), gated NoPE MLA (§3.4),
 * the dense SiTU MLP and the LatentMoE (§3.5).  Each takes the chunk's n
 * normed inputs x [n][D] and writes out [n][D]; products run batched over
 * the chunk, sequential state advances token by token.
 *
 * Does not own the AttnRes stream, the head, nor allocation (session.c).
 */
#include "engine/forward/forward_int.h"

#include <math.h>
#include <string.h>

#include "common/sys.h"

/* ---- KDA ------------------------------------------------------------------ */

typedef struct kda_job {
    engine_session *s;
    int layer;
    size_t n;
} kda_job;

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

int layer_kda(engine_session *s, int layer, const float *x, size_t n, float *out, shoal_err *err)
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

/* ---- MLA ------------------------------------------------------------------ */

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

int layer_mla(engine_session *s, int layer, const float *x, size_t n, float *out, shoal_err *err)
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

/* ---- dense MLP and shared experts ------------------------------------------ */

int layer_dense(engine_session *s, const engine_mlp_w *w, const float *x, size_t n, float *out,
                shoal_err *err)
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

/* ---- LatentMoE ------------------------------------------------------------- */

typedef struct moe_ctx {
    engine_session *s;
    size_t n;
    shoal_err *err;
} moe_ctx;

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

int layer_moe(engine_session *s, int layer, const float *x, size_t n, float *out, shoal_err *err)
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
    /* the experts go out now; everything up to the fetch overlaps their
     * transfer: the next layer's guess, the latent input, the shared experts */
    if ((rc = expert_source_request(s->opt.src, layer, ws->uniq, nu, 0, err)) ||
        (rc = lookahead_issue(s, layer, x, n, err)))
        return rc;
    /* 4. latent input */
    if ((rc = session_mul(s, &w->down, x, n, ws->rz, err)))
        return rc;
    /* 7. shared experts (added to the routed output below) */
    if ((rc = layer_dense(s, &w->shared, x, n, ws->out2, err)))
        return rc;
    /* 5. each distinct expert once for the chunk, computed as it arrives */
    expert_source_stats_get(s->opt.src, &before);
    rc = expert_source_fetch(s->opt.src, layer, ws->uniq, nu, moe_expert_ready, &mc, err);
    expert_source_stats_get(s->opt.src, &after);
    s->st.wait_ns += after.wait_ns - before.wait_ns;
    if (rc != 0)
        return rc;
    if (after.experts - before.experts != nu)
        return shoal_err_set(err, SHOAL_EINTERNAL, "expert source delivered %llu of %zu experts",
                             (unsigned long long)(after.experts - before.experts), nu);
    s->st.expert_loads += nu;
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
