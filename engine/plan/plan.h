/* plan.h — the engine's memory plan: how the memory a run may use is
 * shared between the OS, the spine, the context, the scratch, the expert
 * buffers and the RAM tier, decided at load from the model's config
 * before any weight is read (docs/engine.md, "The memory plan").
 *
 * Owns: the arithmetic — the limit (the smallest of MemTotal, the memory
 * cgroup, the rlimits and --ram), the reserve, the spine's resident bytes
 * per mode (from common/k3_sizes.h), the KV cache and KDA state for the
 * context it allows, the prefill scratch, the expert buffer pool, what is
 * left for the RAM tier, the choice of spine mode (`auto`), the part of
 * the spine that would be streamed when even int4 does not fit, and the
 * refusal below the floor with the smallest RAM that works (auto: the
 * floor, no more of the spine streamed than one token's experts' bytes;
 * --spine given: whatever streamed part fits).  Pure: it
 * reads nothing (common/platform.h reads the limits) and allocates
 * nothing but its JSON.  Uses common/ only; cli, serve, source and
 * forward use it.
 */
#ifndef SHOAL_ENGINE_PLAN_H
#define SHOAL_ENGINE_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "common/json.h"
#include "common/k3_config.h"
#include "common/k3_sizes.h"
#include "common/platform.h"

/* The reserve: max(PLAN_RESERVE_MIN, PLAN_RESERVE_PCT % of the limit). */
#define PLAN_RESERVE_MIN   ((uint64_t)2 << 30)
#define PLAN_RESERVE_PCT   6
/* The context the plan never goes below (or the model's max if smaller). */
#define PLAN_CONTEXT_MIN   4096
/* The context's KV and state take at most 1/PLAN_CONTEXT_SHARE of what
 * the fixed parts leave; the rest is the RAM tier's. */
#define PLAN_CONTEXT_SHARE 4
/* Expert buffers the shoald source may hold outside the RAM tier (a
 * layer's experts and the next layer's guesses, 2 x 16 for K3), each
 * rounded up to whole 2 MiB huge pages (engine/source). */
#define PLAN_EXPERT_POOL   32
#define PLAN_HUGE_PAGE     ((uint64_t)2 << 20)
/* A streamed matrix's weights and scales each start at a multiple of
 * this in its layer's region of the stream file (plan_stream_mat_bytes). */
#define PLAN_STREAM_ALIGN  64
/* The disk the cost of a streamed spine is stated at: one fast NVMe. */
#define PLAN_DISK_RATE     7e9
/* The prefill chunk `chunk 0` picks from: at least PLAN_CHUNK_MIN (the
 * prompt's length if shorter), at most PLAN_CHUNK_MAX (the session's
 * limit). */
#define PLAN_CHUNK_MIN     16
#define PLAN_CHUNK_MAX     4096

typedef struct plan_options {
    uint64_t ram;              /* --ram: plan for at most this; 0: the machine's limit */
    int      ram_replace;      /* `plan --ram`: plan for a machine of exactly `ram` */
    int64_t  context;          /* --context: exactly this many positions; 0: the plan's choice */
    int      spine;            /* -1 auto, else a k3_spine_mode (--spine) */
    size_t   chunk;            /* prefill chunk; 0: the largest the plan allows */
    size_t   chunk_max;        /* with chunk 0: at most this (the prompt); 0: PLAN_CHUNK_MAX */
    int      threads;          /* compute threads (>= 1) */
    int      copies;           /* session states held: 1 (run --tokens), 2 (live + snapshot) */
    int      remote;           /* experts through shoald (buffers and a RAM tier); 0: a
                                * local directory's mapping */
    uint64_t expert_ram;       /* --expert-ram, when expert_ram_set */
    int      expert_ram_set;
} plan_options;

void plan_options_default(plan_options *o);

typedef enum plan_verdict {
    PLAN_RESIDENT = 0,         /* the whole spine resident */
    PLAN_STREAMED = 1,         /* a prefix of layers resident, the rest (but their routers)
                                * read every token */
    PLAN_REFUSED = 2           /* below the floor */
} plan_verdict;

typedef struct plan {
    plan_verdict verdict;
    /* the limit */
    uint64_t limit;
    char     limit_by[48];
    shoal_mem_limits machine;
    /* the parts, bytes */
    uint64_t reserve;
    k3_spine_mode spine;
    uint64_t spine_bytes;          /* every derived matrix and vector of the mode */
    uint64_t spine_resident;       /* of them resident (= spine_bytes unless streamed) */
    uint64_t spine_streamed;       /* read from disk every token */
    int      first_streamed_layer; /* layers [this, n) streamed; n_layers when none */
    uint64_t stream_buffers;       /* two of the largest streamed layer's region */
    double   stream_s_per_token;   /* spine_streamed / PLAN_DISK_RATE */
    int64_t  context;
    int      context_capped;       /* context < max_position_embeddings */
    int      context_set;          /* --context chose it */
    int      copies;
    uint64_t state_bytes;          /* KDA state, all copies */
    uint64_t kv_per_token;         /* MLA cache per position, all copies, with scores */
    uint64_t kv_bytes;             /* state + context x per token */
    size_t   chunk;                /* the prefill chunk the scratch is for */
    int      chunk_auto;           /* plan_make chose it (options.chunk 0) */
    uint64_t scratch;              /* the session's chunk scratch */
    uint64_t pool_buffers, pool_buffer_bytes, pool;
    int      remote;               /* experts through shoald (else a directory's mapping) */
    uint64_t tier;                 /* the RAM tier */
    uint64_t tier_useful;          /* one decode token's experts */
    int      tier_set;             /* --expert-ram chose it */
    uint64_t tier_planned;         /* what the plan left (= tier unless tier_set) */
    /* the smallest limit for: int8 resident with a useful tier, int4
     * resident, and the floor (streaming at most one token's experts'
     * bytes of the spine) */
    uint64_t min_int8, min_int4, min_floor;
    /* with --spine given the floor does not apply: the smallest limit at
     * which any suffix of layers streamed fits (the resident rest and two
     * buffers) */
    uint64_t min_run;
    char     why[320];             /* why this mode / verdict, one sentence */
} plan;

/* Plan the model `c` under `lim` with `o`.  0 with *p filled (verdict
 * resident or streamed), or SHOAL_ENOMEM with *p filled (verdict refused)
 * and err saying the smallest RAM that works, or SHOAL_EINVAL for options
 * the model cannot take (a context past max_position_embeddings). */
int plan_make(const k3_config *c, const shoal_mem_limits *lim, const plan_options *o, plan *p,
              shoal_err *err);

/* The chunk scratch a session of `c` holds for chunks of `chunk` tokens
 * on `threads` threads (forward.c's workspace, the kernels' activation and
 * expert buffers, the router lookahead), without the context-dependent
 * MLA cache and scores. */
uint64_t plan_scratch_bytes(const k3_config *c, size_t chunk, int threads);

/* The streamed part (docs/engine.md, "Smaller machines"): whether a
 * matrix of `part` is streamed when its layer is (all but the routers and
 * the lm_head); the bytes a streamed matrix takes in its layer's region
 * (weights, then scales, each aligned to PLAN_STREAM_ALIGN); the bytes of
 * layer `layer`'s region (its streamed matrices, rounded up to 4 KiB: one
 * O_DIRECT read, one of the two buffers). */
int plan_part_streamed(k3_part part);
uint64_t plan_stream_mat_bytes(k3_fmt fmt, uint64_t rows, uint64_t cols);
uint64_t plan_stream_layer_bytes(const k3_config *c, k3_spine_mode mode, int layer);
/* One of the two buffers for a region of `region` bytes: whole 2 MiB
 * (huge) pages from 2 MiB on, whole 4 KiB pages below. */
uint64_t plan_stream_buffer_bytes(uint64_t region);

/* The plan as one block of text lines, each starting with "plan: ". */
void plan_print(const plan *p, const k3_config *c, FILE *f);

/* The plan as a JSON object (caller frees), NULL on no memory. */
shoal_json *plan_to_json(const plan *p);

#endif
