/* spine_size.h — the bytes of a K3-family model's spine (everything that is
 * not a routed expert) in each format the engine can keep it in, from the
 * config's shapes alone (specs/k3.md §2 lists the tensors, §8 the sums).
 *
 * Owns: the tally of every spine tensor by part (§8's rows) and format:
 *   bf16  as the checkpoint stores it (BF16, the KDA conv taps, A_log,
 *         dt_bias, o_norm and the router bias F32): K3 113.5 GB;
 *   int8  what the engine keeps today (its pack): 2-D projections int8
 *         with an f32 scale per row (MLA's kv_b split into W_UK^T and
 *         W_UV, as the engine does), routers and the KDA gate path f32,
 *         matrices narrower than 32 columns f32; vectors, norms and conv
 *         taps f32; the embedding stays BF16, mapped, one row read per
 *         token: K3 58.0 GB + 2.35 GB;
 *   int4  as int8, but the large projections (KDA q/k/v/g/o, the shared
 *         experts, the latent down/up, the dense MLP) in int4 groups of 64
 *         with an f16 scale each (DESIGN decision 10); MLA and lm_head
 *         stay int8: K3 35.5 GB + 2.35 GB;
 *   f32   every matrix f32 (the scalar reference path).
 * Does not own choosing a format (the engine's memory plan) nor reading
 * any tensor.  Lives in common/ because the CLI (shoal estimate) and the
 * engine's memory plan both need it.
 */
#ifndef SHOAL_SPINE_SIZE_H
#define SHOAL_SPINE_SIZE_H

#include <stdint.h>

#include "common/k3_config.h"

typedef enum spine_format {
    SPINE_FMT_BF16 = 0, SPINE_FMT_INT8, SPINE_FMT_INT4, SPINE_FMT_F32, SPINE_FMT_COUNT
} spine_format;

/* k3.md §8's rows. */
typedef enum spine_part {
    SPINE_KDA_PROJ = 0,   /* KDA q/k/v/g/o */
    SPINE_KDA_GATE,       /* KDA gate path f_a/f_b/b */
    SPINE_KDA_SMALL,      /* KDA conv taps, A_log, dt_bias, o_norm */
    SPINE_MLA,            /* MLA projections */
    SPINE_SHARED,         /* shared experts */
    SPINE_LATENT,         /* latent down/up */
    SPINE_ROUTER,         /* routers */
    SPINE_DENSE,          /* the dense MLP(s) */
    SPINE_LM_HEAD,
    SPINE_EMBED,          /* the token embedding */
    SPINE_VECTORS,        /* the layers' norms and AttnRes vectors, the final ones
                             (a part's own vectors — router bias, MLA layernorms,
                             the latent norm — count in its row, as in §8) */
    SPINE_PART_COUNT
} spine_part;

typedef struct spine_size {
    uint64_t part[SPINE_PART_COUNT];   /* bytes by part */
    uint64_t matrices;    /* 2-D weights the engine derives (int8/int4: its pack) */
    uint64_t vectors;     /* vectors, norms, conv taps, A_log... */
    uint64_t embedding;   /* the token embedding as kept (BF16, mapped) */
    uint64_t total;       /* matrices + vectors + embedding: what stays in RAM */
    uint64_t per_token;   /* what a decode step reads: total less all embedding
                             rows but one */
    uint64_t tensors;     /* the checkpoint's spine tensors (K3: 2,460) */
} spine_size;

/* Fill out for config c in format f.  Cannot fail. */
void spine_size_of(const k3_config *c, spine_format f, spine_size *out);

/* "bf16", "int8", "int4", "f32". */
const char *spine_format_name(spine_format f);
const char *spine_part_name(spine_part p);
/* Parse a format name.  0 or SHOAL_EINVAL. */
int spine_format_parse(const char *s, spine_format *out);

#endif
