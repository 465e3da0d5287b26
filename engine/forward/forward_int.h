/* forward_int.h — what forward.c (the pass) and lookahead.c (the router
 * lookahead) share: the session struct, its scratch, the spine product.
 * Private to engine/forward/. */
#ifndef SHOAL_ENGINE_FORWARD_INT_H
#define SHOAL_ENGINE_FORWARD_INT_H

#include "engine/forward/forward.h"

/* Scratch for one chunk of up to nmax tokens; sizes in floats per token. */
typedef struct session_ws {
    float *h;          /* [n][D] running stream (prefix) */
    float *x;          /* [n][D] normed sublayer input */
    float *out;        /* [n][D] sublayer output */
    float *out2;       /* [n][D] shared-expert output */
    float *anchors;    /* [max_anchors][n][D] */
    /* KDA */
    float *kq, *kk, *kv, *kg, *kz, *kfa, *kb, *ko;   /* [n][P] (kfa [n][Dk], kb [n][Hk]) */
    /* MLA */
    float *mqa, *mq, *mkv, *mqabs, *mctx, *mo, *mg;  /* see layer_mla */
    float *mtmp_in, *mtmp_out;                        /* [n][max(kl, nope)] gathers */
    float *score;      /* [nthreads][cache cap] softmax rows */
    size_t score_cap;
    /* MLPs */
    float *fg, *fu;    /* [n][max(Id, S)] */
    /* MoE */
    float *rs;         /* [n][E] router scores */
    int32_t *rid;      /* [n][k] routed ids */
    float *rw;         /* [n][k] weights */
    float *rz;         /* [n][L] latent input */
    float *slots;      /* [n][k][L] per-slot expert outputs */
    float *gz, *go;    /* [n][L] gathered inputs / outputs of one expert */
    float *ones;       /* [n] 1.0 */
    float *ru;         /* [n][L] aggregate */
    int32_t *e_cnt, *e_off, *pairs, *uniq;  /* [E], [E+1], [n·k], [n·k] */
    float *tmp;        /* [nthreads][max(Dk, D)] */
    kernels_act *act;
    kernels_expert_ws *ews;
} session_ws;

/* Recall below which a layer's guesses are not sent: on a saturated link a
 * wrongly guessed expert costs as much transfer time as a right one saves,
 * so under one half the prefetch moves more useless bytes than useful ones
 * (docs/performance.md). */
#define LOOKAHEAD_CUTOFF 0.5

typedef struct lookahead {
    engine_layer_recall *rec;   /* [n_layers] */
    uint8_t *look, *prev;       /* [n_layers][E] guesses: router lookahead, previous call */
    uint8_t *has_look, *has_prev;
    float *x, *sc, *w;          /* [n][D], [n][E], [E] scratch */
    int32_t *ids;               /* [n·E] */
    float *conf;                /* [E] how likely each guess is (the send order) */
    double cutoff;
} lookahead;

struct engine_session {
    const engine_model *m;
    engine_session_options opt;
    int nthreads;
    int64_t pos;
    /* state, per layer (NULL where the layer is of the other kind) */
    float **kda_S;     /* [Hk][Dk][Dk] */
    float **kda_conv;  /* [3][K-1][P], oldest first */
    float **mla_c;     /* [cap][kl] */
    float **mla_r;     /* [cap][rope] */
    size_t mla_cap;
    session_ws w;
    engine_session_stats st;
    uint64_t *layer_loads;    /* [n_layers] distinct experts fetched, summed over calls */
    int max_anchors;
    uint64_t scratch_bytes;   /* session_ws, kernels' act and expert scratch */
    lookahead la;
};

/* y [n][rows] = W x, timed as spine. */
int session_mul(engine_session *s, const engine_mat *w, const float *x, size_t n, float *y,
                shoal_err *err);

/* lookahead.c: scratch, scoring the guesses against a layer's real set,
 * and guessing (then prefetching) the next MoE layer's from x [n][D]. */
int lookahead_alloc(engine_session *s);
void lookahead_free(engine_session *s);
void lookahead_observe(engine_session *s, int layer, const int32_t *uniq, size_t nu);
int lookahead_issue(engine_session *s, int layer, const float *x, size_t n, shoal_err *err);

#endif
