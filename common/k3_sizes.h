/* k3_sizes.h — the K3 spine as the engine stores it: every derived matrix
 * in the order the engine loads it, the format each spine mode gives it,
 * and the bytes that adds up to (specs/k3.md §8 at K3's size).
 *
 * Owns: the one list of the spine's matrices and the per-mode choice of
 * format (int8, int4, f32), so that the engine's loader and its spine
 * pack, the memory plan (engine/plan/) and `shoal estimate` all count the
 * same bytes.  Lives in common/ because the CLI uses it and never links
 * the engine.  Does not own quantizing (engine/kernels/) nor the pack's
 * layout (engine/forward/spine_pack.c), only what goes in it.
 *
 * Which tensor keeps which precision (docs/engine.md lists them with K3's
 * bytes):
 *   f32 mode   everything f32 (validation).
 *   int8 mode  int8 with one f32 scale per row, except the router gate and
 *              KDA's gate path (f_a, f_b, b), which stay f32: they choose
 *              the experts and set the decay and write strength, where a
 *              rounding error changes a decision, not a value; and any
 *              matrix whose width is not a multiple of 32 (the kernels'
 *              block), f32 too.
 *   int4 mode  int4 (groups of KERNELS_Q4_GROUP = 32 columns, a BF16
 *              scale each) for the large projections: KDA q/k/v/g/o, the
 *              shared experts, the latent down/up and the dense MLP —
 *              86 % of int8's bytes; MLA and lm_head stay int8 (attention
 *              over the whole context and the logits themselves are where
 *              int4's ~8 % per-weight error would show directly, and
 *              together they are only 6.8 GB at int8); routers and the
 *              gate path stay f32 as in int8.
 */
#ifndef SHOAL_K3_SIZES_H
#define SHOAL_K3_SIZES_H

#include <stddef.h>
#include <stdint.h>

#include "common/k3_config.h"

typedef enum k3_spine_mode {
    K3_SPINE_INT8 = 0,
    K3_SPINE_INT4 = 1,
    K3_SPINE_F32 = 2,
    K3_SPINE_MODES
} k3_spine_mode;

/* "int8", "int4", "f32" */
const char *k3_spine_mode_name(k3_spine_mode m);

/* A matrix's stored format; the numbers are the spine pack's dtype codes. */
typedef enum k3_fmt { K3_FMT_INT8 = 0, K3_FMT_F32 = 1, K3_FMT_INT4 = 2 } k3_fmt;

const char *k3_fmt_name(k3_fmt f);    /* "int8", "f32", "int4" */

/* Columns per int4 scale (engine/kernels KERNELS_Q4_GROUP). */
#define K3_INT4_GROUP 32

/* The rows of specs/k3.md §8's table. */
typedef enum k3_part {
    K3_PART_KDA_PROJ = 0,   /* KDA q/k/v/g/o */
    K3_PART_KDA_GATE,       /* KDA f_a/f_b/b */
    K3_PART_MLA,            /* MLA q_a, q_b, kv_a, W_UKᵀ, W_UV, g, o */
    K3_PART_SHARED,         /* shared experts gate/up/down */
    K3_PART_LATENT,         /* routed_expert_down/up */
    K3_PART_ROUTER,         /* gate.weight */
    K3_PART_DENSE,          /* the dense layers' MLP */
    K3_PART_HEAD,           /* lm_head */
    K3_PART_COUNT
} k3_part;

const char *k3_part_name(k3_part p);  /* "KDA projections", ... */

/* One derived matrix.  name: the source tensor without "language_model."
 * (kv_b_proj.weight appears twice: W_UKᵀ [H·kl, nope], then W_UV
 * [H·vd, kl]). */
typedef struct k3_spine_mat {
    char     name[96];
    uint64_t rows, cols;
    k3_fmt   fmt;
    k3_part  part;
    int      layer;         /* -1: a global */
} k3_spine_mat;

/* The format mode gives a matrix of `part`, `cols` wide. */
k3_fmt k3_spine_fmt(k3_spine_mode mode, k3_part part, uint64_t cols);

/* Bytes of a matrix's data: int8 rows·cols + 4·rows (scales); int4
 * rows·cols/2 + 2·rows·cols/32; f32 4·rows·cols. */
uint64_t k3_mat_bytes(const k3_spine_mat *m);

/* Call fn for every derived matrix in load order (the globals' lm_head,
 * then each layer: attention, then its MLP or MoE).  Stops at fn's first
 * non-zero return and returns it; 0 after the last. */
typedef int (*k3_spine_fn)(void *ctx, const k3_spine_mat *m);
int k3_spine_walk(const k3_config *c, k3_spine_mode mode, k3_spine_fn fn, void *ctx);

/* The spine's bytes by part, for one mode. */
typedef struct k3_spine_sizes {
    uint64_t part[K3_PART_COUNT];    /* derived matrices per §8 row */
    uint64_t matrices;               /* their sum */
    size_t   n_matrices;
    uint64_t vectors;                /* norms, AttnRes, conv taps, A, dt_bias, biases: f32 */
    uint64_t embedding;              /* [V, D] BF16, mapped (not derived) */
    uint64_t bf16_part[K3_PART_COUNT];  /* the same matrices in the checkpoint (BF16) */
    uint64_t bf16_matrices;
    uint64_t checkpoint;             /* every spine tensor as the checkpoint stores
                                        it (BF16, the F32 ones F32): K3 113.5 GB */
    uint64_t layer_max;              /* the largest one layer's derived matrices */
    uint64_t layer[K3_MAX_LAYERS];   /* each layer's derived matrices */
    uint64_t globals;                /* lm_head */
} k3_spine_sizes;

void k3_spine_sizes_get(const k3_config *c, k3_spine_mode mode, k3_spine_sizes *out);

/* Per-sequence state (k3.md §3.7) in f32: the KDA recurrent state and
 * conv windows of every KDA layer (context-independent), and the MLA
 * cache per position over every MLA layer. */
uint64_t k3_kda_state_bytes(const k3_config *c);
uint64_t k3_mla_bytes_per_token(const k3_config *c);

#endif
