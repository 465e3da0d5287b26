/* ops.c — RMSNorm, AttnRes mix, router top-k, L2 norm and the KDA step
 * (see forward.h part 1).  Owns only arithmetic; no allocation, no state. */
#include "engine/forward/forward.h"

#include <math.h>
#include <string.h>

float engine_sigmoid(float x)
{
    /* expf(-x) overflows to inf for x < -88, giving exactly 0, as wanted */
    return 1.0f / (1.0f + expf(-x));
}

void engine_rmsnorm(const float *x, const float *w, size_t n, double eps, float *out)
{
    double ss = 0;
    for (size_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    double inv = 1.0 / sqrt(ss / (double)n + eps);
    for (size_t i = 0; i < n; i++)
        out[i] = (float)((double)w[i] * x[i] * inv);
}

/* score of one vector: Σ v·sw / sqrt(mean(v²) + eps) */
static double mix_score(const float *v, const float *sw, size_t dim, double eps)
{
    double dot = 0, ss = 0;
    for (size_t d = 0; d < dim; d++) {
        dot += (double)v[d] * sw[d];
        ss += (double)v[d] * v[d];
    }
    return dot / sqrt(ss / (double)dim + eps);
}

void engine_attnres_mix(const float *prefix, const float *const *anchors, size_t n_anchors,
                        const float *sw, size_t dim, double eps, float *out)
{
    /* at most block-count anchors + prefix; K3 has 8, tiny 3 */
    double score[64], p[64], mx, sum = 0;
    size_t n = n_anchors + 1;

    if (n_anchors == 0 || n > 64) {
        if (out != prefix)
            memmove(out, prefix, dim * sizeof *out);
        return;
    }
    for (size_t i = 0; i < n_anchors; i++)
        score[i] = mix_score(anchors[i], sw, dim, eps);
    score[n_anchors] = mix_score(prefix, sw, dim, eps);
    mx = score[0];
    for (size_t i = 1; i < n; i++)
        if (score[i] > mx)
            mx = score[i];
    for (size_t i = 0; i < n; i++) {
        p[i] = exp(score[i] - mx);
        sum += p[i];
    }
    for (size_t i = 0; i < n; i++)
        p[i] /= sum;
    /* prefix last: out may alias it, so read it before writing out[d] */
    for (size_t d = 0; d < dim; d++) {
        double acc = 0;
        for (size_t i = 0; i < n_anchors; i++)
            acc += p[i] * anchors[i][d];
        acc += p[n_anchors] * prefix[d];
        out[d] = (float)acc;
    }
}

void engine_route_topk(const float *scores, const float *bias, size_t n, size_t k,
                       int renormalize, double scaling, int32_t *ids, float *weights)
{
    double sum = 0;

    /* k passes of "largest not yet taken"; a strict > keeps the lowest index
     * on ties, as a stable descending argsort does.  O(k·n): 16 × 896 for K3. */
    for (size_t j = 0; j < k; j++) {
        long best = -1;
        float bv = 0;
        for (size_t e = 0; e < n; e++) {
            int taken = 0;
            for (size_t t = 0; t < j; t++)
                if (ids[t] == (int32_t)e) {
                    taken = 1;
                    break;
                }
            if (taken)
                continue;
            float v = scores[e] + (bias ? bias[e] : 0.0f);
            if (best < 0 || v > bv) {
                best = (long)e;
                bv = v;
            }
        }
        ids[j] = (int32_t)best;
    }
    for (size_t j = 0; j < k; j++)
        sum += scores[ids[j]];
    for (size_t j = 0; j < k; j++) {
        double w = renormalize ? scores[ids[j]] / (sum + 1e-20) : scores[ids[j]];
        weights[j] = (float)(w * scaling);
    }
}

void engine_l2norm(float *x, size_t n, engine_l2_mode mode)
{
    double ss = 0, den;
    for (size_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    if (mode == ENGINE_L2_FLA)
        den = sqrt(ss + 1e-6);
    else
        den = fmax(sqrt(ss), 1e-12);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(x[i] / den);
}

void engine_kda_step(float *S, const float *q, const float *k, const float *v,
                     const float *alpha, float beta, size_t dk, size_t dv,
                     float *o, float *tmp)
{
    /* pass 1: decay rows, tmp = Sᵀk on the decayed state */
    for (size_t j = 0; j < dv; j++)
        tmp[j] = 0;
    for (size_t r = 0; r < dk; r++) {
        float *row = S + r * dv;
        float a = alpha[r], kr = k[r];
        for (size_t j = 0; j < dv; j++) {
            row[j] *= a;
            tmp[j] += kr * row[j];
        }
    }
    for (size_t j = 0; j < dv; j++)
        tmp[j] = v[j] - tmp[j];          /* u */
    /* pass 2: rank-one update, o = Sᵀq on the updated state */
    for (size_t j = 0; j < dv; j++)
        o[j] = 0;
    for (size_t r = 0; r < dk; r++) {
        float *row = S + r * dv;
        float bk = beta * k[r], qr = q[r];
        for (size_t j = 0; j < dv; j++) {
            row[j] += bk * tmp[j];
            o[j] += qr * row[j];
        }
    }
}
