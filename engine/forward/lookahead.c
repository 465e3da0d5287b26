/* lookahead.c — guessing the next MoE layer's experts so they are on their
 * way before that layer routes (docs/performance.md, "Lookahead").
 *
 * Two predictors per MoE layer, both scored on every run of the layer:
 *   - lookahead: at MoE layer L, layer L2's (the next MoE layer's) router
 *     applied to layer L's MoE input, re-weighted from L's post-attention
 *     norm to L2's (the stream changes little between adjacent layers, the
 *     norm weights do);
 *   - previous: the experts layer L2 used on the previous call.
 * Recall = |guess ∩ used| / |used|.  Once a layer has NWARM uses behind it,
 * the better predictor is sent; if even that one's recall is below the
 * cut-off, nothing is sent for the layer (its guesses would mostly move
 * bytes nobody reads).  Both keep being scored, so a layer can come back.
 *
 * Owns: the guesses and the per-layer recall counts (forward_int.h).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/forward/forward.h"
#include "engine/forward/forward_int.h"

/* Uses of a layer before its recall decides (at least two tokens' worth). */
#define NWARM 8

int lookahead_alloc(engine_session *s)
{
    size_t nl = (size_t)s->m->cfg.n_layers, ne = (size_t)s->m->cfg.n_experts;
    size_t n = s->opt.chunk, d = (size_t)s->m->cfg.hidden;
    lookahead *la = &s->la;

    la->cutoff = s->opt.prefetch_cutoff > 0 ? s->opt.prefetch_cutoff : LOOKAHEAD_CUTOFF;
    la->rec = calloc(nl + 1, sizeof *la->rec);
    la->look = calloc(nl * ne + 1, 1);
    la->prev = calloc(nl * ne + 1, 1);
    la->has_look = calloc(nl + 1, 1);
    la->has_prev = calloc(nl + 1, 1);
    la->x = calloc(n * d + 1, sizeof *la->x);
    la->sc = calloc(n * ne + 1, sizeof *la->sc);
    la->ids = calloc(n * ne + 1, sizeof *la->ids);
    la->w = calloc(ne + 1, sizeof *la->w);
    la->conf = calloc(ne + 1, sizeof *la->conf);
    s->scratch_bytes += 2 * nl * ne + (n * d + n * ne + 2 * ne) * sizeof(float) + n * ne * 4;
    return la->rec && la->look && la->prev && la->has_look && la->has_prev && la->x && la->sc &&
           la->ids && la->w && la->conf ? 0 : SHOAL_ENOMEM;
}

void lookahead_free(engine_session *s)
{
    lookahead *la = &s->la;
    free(la->rec);
    free(la->look);
    free(la->prev);
    free(la->has_look);
    free(la->has_prev);
    free(la->x);
    free(la->sc);
    free(la->ids);
    free(la->w);
    free(la->conf);
}

void lookahead_observe(engine_session *s, int layer, const int32_t *uniq, size_t nu)
{
    size_t ne = (size_t)s->m->cfg.n_experts;
    lookahead *la = &s->la;
    engine_layer_recall *r;
    uint8_t *look, *prev;

    if (!la->rec)
        return;
    r = &la->rec[layer];
    look = la->look + (size_t)layer * ne;
    prev = la->prev + (size_t)layer * ne;
    if (la->has_look[layer]) {
        for (size_t i = 0; i < nu; i++)
            r->look_hits += look[uniq[i]];
        r->look_total += nu;
    }
    if (la->has_prev[layer]) {
        for (size_t i = 0; i < nu; i++)
            r->prev_hits += prev[uniq[i]];
        r->prev_total += nu;
    }
    la->has_look[layer] = 0;
    memset(prev, 0, ne);
    for (size_t i = 0; i < nu; i++)
        prev[uniq[i]] = 1;
    la->has_prev[layer] = 1;
}

/* The next MoE layer after `layer`; past the last one, the first (of the
 * next token: *wrapped set, and only the previous-token guess applies). */
static int next_moe(const engine_session *s, int layer, int *wrapped)
{
    *wrapped = 0;
    for (int64_t i = layer + 1; i < s->m->cfg.n_layers; i++)
        if (s->m->cfg.layers[i].moe)
            return (int)i;
    *wrapped = 1;
    for (int64_t i = 0; i <= layer; i++)
        if (s->m->cfg.layers[i].moe)
            return i == layer ? -1 : (int)i;
    return -1;
}

/* Send the guess `mask` for layer l2 as a prefetch, most likely expert
 * first (conf: higher is likelier; NULL: id order): the source reads
 * guesses in that order and only as many as fit the disk's idle gap, so
 * the order decides which guesses are read. */
static int send_guess(engine_session *s, int l2, const uint8_t *mask, const float *conf,
                      shoal_err *err)
{
    lookahead *la = &s->la;
    size_t ne = (size_t)s->m->cfg.n_experts, nids = 0;
    for (size_t e = 0; e < ne; e++)
        if (mask[e])
            la->ids[nids++] = (int32_t)e;
    for (size_t i = 1; conf && i < nids; i++) {     /* insertion sort: k ids */
        int32_t v = la->ids[i];
        size_t j = i;
        for (; j > 0 && conf[la->ids[j - 1]] < conf[v]; j--)
            la->ids[j] = la->ids[j - 1];
        la->ids[j] = v;
    }
    la->rec[l2].prefetches += nids;
    return expert_source_request(s->opt.src, l2, la->ids, nids, 1, err);
}

/* Which guess to send for layer l2: 0 none, 1 lookahead, 2 previous. */
static int choose(const lookahead *la, int l2)
{
    const engine_layer_recall *r = &la->rec[l2];
    double rl = r->look_total ? (double)r->look_hits / (double)r->look_total : 0;
    double rp = r->prev_total ? (double)r->prev_hits / (double)r->prev_total : 0;

    if (r->look_total < NWARM)
        return 1;                        /* no evidence yet: try the router */
    if (rl >= rp)
        return rl >= la->cutoff ? 1 : 0;
    return rp >= la->cutoff ? 2 : 0;
}

int lookahead_issue(engine_session *s, int layer, const float *x, size_t n, shoal_err *err)
{
    const k3_config *c = &s->m->cfg;
    lookahead *la = &s->la;
    size_t ne = (size_t)c->n_experts, k = (size_t)c->n_experts_per_token, d = (size_t)c->hidden;
    int wrapped, l2 = next_moe(s, layer, &wrapped);
    const engine_layer_w *w1 = &s->m->layers[layer], *w2;
    uint8_t *look;
    int rc, pick;

    if (!la->rec || l2 < 0 || s->opt.no_prefetch > 1)
        return 0;
    if (wrapped) {
        /* the next token's first MoE layer: its router cannot see that
         * token yet, the previous token's set is the only guess */
        const engine_layer_recall *r = &la->rec[l2];
        double rp = r->prev_total ? (double)r->prev_hits / (double)r->prev_total : 0;
        if (s->opt.no_prefetch || !la->has_prev[l2] || (r->prev_total >= NWARM && rp < la->cutoff))
            return 0;
        la->rec[l2].predictor = 2;
        return send_guess(s, l2, la->prev + (size_t)l2 * ne, NULL, err);
    }
    w2 = &s->m->layers[l2];
    for (size_t t = 0; t < n; t++)
        for (size_t i = 0; i < d; i++) {
            float a = w1->post_norm[i];
            la->x[t * d + i] = a != 0.0f ? x[t * d + i] / a * w2->post_norm[i] : 0.0f;
        }
    if ((rc = session_mul(s, &w2->moe.gate, la->x, n, la->sc, err)) != 0)
        return rc;
    look = la->look + (size_t)l2 * ne;
    memset(look, 0, ne);
    memset(la->conf, 0, ne * sizeof *la->conf);
    for (size_t t = 0; t < n; t++) {
        float *sc = la->sc + t * ne;
        int32_t top[64];
        size_t kk = k < 64 ? k : 64;
        for (size_t e = 0; e < ne; e++)
            sc[e] = engine_sigmoid(sc[e]);
        engine_route_topk(sc, w2->moe.bias, ne, kk, c->renormalize, c->routed_scaling, top, la->w);
        for (size_t j = 0; j < kk; j++) {
            look[top[j]] = 1;
            la->conf[top[j]] += (float)(kk - j);   /* router rank, summed over tokens */
        }
    }
    if (la->has_prev[l2])                     /* both predictors agree: likelier still */
        for (size_t e = 0; e < ne; e++)
            la->conf[e] += la->prev[(size_t)l2 * ne + e] ? (float)k : 0.0f;
    la->has_look[l2] = 1;
    pick = choose(la, l2);
    la->rec[l2].predictor = pick;
    if (pick == 0 || s->opt.no_prefetch)
        return 0;
    return send_guess(s, l2, pick == 1 ? look : la->prev + (size_t)l2 * ne,
                      pick == 1 ? la->conf : NULL, err);
}
