/* ops.h — the small per-token operations of the K3 forward pass
 * (specs/k3.md §3) that are not matrix products: RMSNorm, the AttnRes mix,
 * the router's top-k, the KDA L2 norm and one delta-rule step.
 *
 * Owns: the arithmetic of these steps and its summation order.  Does not own
 * weights, state lifetimes nor threading (session.c and layers.c call these
 * per token and per head).  Public so unit tests can check each step against
 * a hand computation.
 *
 * Numerics: inputs and outputs are f32; reductions over a vector (sums of
 * squares, dot products, softmax) are accumulated in double, which costs
 * nothing at these sizes and keeps the f32 path within 1e-5 of the float64
 * reference.
 */
#ifndef SHOAL_ENGINE_OPS_H
#define SHOAL_ENGINE_OPS_H

#include <stddef.h>
#include <stdint.h>

/* Logistic sigmoid, 1 / (1 + e^-x), without overflow for large |x|. */
float engine_sigmoid(float x);

/* out = w ⊙ x / sqrt(mean(x²) + eps) over n values.  out may alias x. */
void engine_rmsnorm(const float *x, const float *w, size_t n, double eps, float *out);

/* AttnRes Mix (k3.md §3.2): V = anchors[0..n_anchors) ++ [prefix];
 * score_i = Σ_d V_i[d]·sw[d] / sqrt(mean(V_i²) + eps) with sw = w_norm ⊙
 * w_proj precomputed; out = Σ_i softmax(score)_i · V_i (raw vectors).
 * out may alias prefix but no anchor.  n_anchors may be 0 (out = prefix). */
void engine_attnres_mix(const float *prefix, const float *const *anchors, size_t n_anchors,
                        const float *sw, size_t dim, double eps, float *out);

/* Router selection (k3.md §3.5 steps 2-3): the k largest of scores+bias,
 * ties to the lowest index, written to ids[0..k) best first (routing order);
 * weights[i] = scores[ids[i]] / (Σ selected scores + 1e-20) · scaling when
 * renormalize, else scores[ids[i]] · scaling.  k <= n.  bias may be NULL. */
void engine_route_topk(const float *scores, const float *bias, size_t n, size_t k,
                       int renormalize, double scaling, int32_t *ids, float *weights);

/* L2-normalize x[0..n) in place.  ENGINE_L2_FLA: x / sqrt(Σx² + 1e-6) (the
 * spec's choice); ENGINE_L2_MAX: x / max(‖x‖, 1e-12) (Deltafin's form). */
typedef enum engine_l2_mode { ENGINE_L2_FLA = 0, ENGINE_L2_MAX = 1 } engine_l2_mode;
void engine_l2norm(float *x, size_t n, engine_l2_mode mode);

/* One KDA delta-rule step for one head (k3.md §3.3 step 6).  S is [dk][dv]
 * (S[k][v], row k = key dimension), alpha [dk] the per-key decay, beta the
 * write strength:
 *   S <- diag(alpha) S;  u = v - Sᵀk;  S <- S + beta·k uᵀ;  o = Sᵀq.
 * o [dv]; tmp is scratch of dv floats. */
void engine_kda_step(float *S, const float *q, const float *k, const float *v,
                     const float *alpha, float beta, size_t dk, size_t dv,
                     float *o, float *tmp);

#endif
