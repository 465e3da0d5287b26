/* expert_source.h — where the routed experts' bytes come from.
 *
 * Owns: the contract between the MoE layer and an expert provider.  The
 * layer asks once per MoE layer (and chunk) for every distinct expert it
 * needs; the source calls back once per expert, in whatever order the bytes
 * become ready, with a borrowed pointer to the expert's whole span (the six
 * records back to back, k3.md §2: cfg.expert_bytes bytes) or with an error.
 * The layer computes each expert inside its callback, so I/O and compute
 * overlap for sources that deliver progressively.
 *
 * Implementations:
 *   - local (expert_source_local_new): a bound local snapshot directory; the
 *     span points into the model's read-only mapping and every callback runs
 *     before fetch returns, in the order asked;
 *   - shoald (expert_source_shoald_new, DESIGN.md decision 9): batched
 *     GETs through common/client.h, each returned descriptor mapped (or
 *     read, per the page-cache policy) and called back as it arrives; it
 *     holds the engine's RAM tier (experts kept mapped, a quota per layer,
 *     least recently used out first) and the prefetches
 *     (expert_source_request), and REPORTs RAM hits to shoald.
 *
 * Does not own routing, compute, nor the predictions (layers.c).
 */
#ifndef SHOAL_ENGINE_EXPERT_SOURCE_H
#define SHOAL_ENGINE_EXPERT_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/model.h"

/* Where a delivered expert came from (DESIGN.md decision 9). */
typedef enum expert_tier {
    EXPERT_TIER_RAM = 0,      /* the engine's own expert cache */
    EXPERT_TIER_LOCAL = 1,    /* a local snapshot's mapping (page cache or disk) */
    EXPERT_TIER_DISK = 2,     /* shoald's disk cache */
    EXPERT_TIER_NETWORK = 3,  /* fetched upstream by shoald */
    EXPERT_TIER_COUNT
} expert_tier;

const char *expert_tier_name(expert_tier t);

/* Called once per requested expert.  On success status is 0 and span holds
 * `bytes` bytes, borrowed until the callback returns.  On failure status is
 * negative, span NULL and detail says why.  Return 0 to go on; a negative
 * return stops the fetch (remaining experts are not delivered) and fetch
 * returns that code. */
typedef int (*expert_ready_fn)(void *ctx, int layer, int32_t expert, const uint8_t *span,
                               size_t bytes, expert_tier tier, int status,
                               const shoal_err *detail);

typedef struct expert_source_stats {
    uint64_t experts;                    /* spans delivered */
    uint64_t bytes;                      /* their bytes */
    uint64_t hits[EXPERT_TIER_COUNT];    /* spans per tier */
    uint64_t wait_ns;                    /* time fetch spent not in callbacks */
    /* filled by sources that prefetch / keep a RAM tier (0 otherwise) */
    uint64_t prefetch_sent;              /* experts asked for as a guess */
    uint64_t prefetch_used;              /* ... that a fetch then used */
    uint64_t prefetch_early;             /* ... that were already in when fetched */
    uint64_t ram_resident;               /* experts held in the RAM tier now */
    uint64_t ram_bytes;                  /* their bytes */
    uint64_t ram_quota;                  /* experts per MoE layer the tier may hold */
    /* sources that read with their own threads (0 otherwise) */
    uint64_t read_bytes;                 /* read for demand and guesses */
    uint64_t read_guess_bytes;           /* ... of them read as a guess */
    uint64_t read_busy_ns;               /* time at least one read was running */
} expert_source_stats;

typedef struct expert_source expert_source;

/* The implementation's side: every source provides these. */
typedef struct expert_source_ops {
    /* Deliver ids[0..n) of `layer` (distinct ids) through fn. */
    int (*fetch)(void *impl, int layer, const int32_t *ids, size_t n,
                 expert_ready_fn fn, void *ctx, shoal_err *err);
    void (*free)(void *impl);
} expert_source_ops;

/* Optional operations (expert_source_new_more). */
typedef struct expert_source_more_ops {
    /* Start moving ids of `layer` towards the engine without
     * waiting.  prefetch 1: a guess, at low priority and cancelled when the
     * layer's own fetch comes; 0: the layer fetches exactly these next. */
    int (*request)(void *impl, int layer, const int32_t *ids, size_t n, int prefetch,
                   shoal_err *err);
    /* Optional: add the source's own counters (prefetch_*, ram_*). */
    void (*stats)(void *impl, expert_source_stats *out);
} expert_source_more_ops;

/* Wrap an implementation (taken: freed by expert_source_free).  NULL on no
 * memory (impl is then freed through ops->free). */
expert_source *expert_source_new(const expert_source_ops *ops, void *impl);
/* The same with the optional operations (more may be NULL). */
expert_source *expert_source_new_more(const expert_source_ops *ops,
                                      const expert_source_more_ops *more, void *impl);
void expert_source_free(expert_source *src);

/* Fetch ids[0..n) of MoE layer `layer`; fn runs once per delivered expert.
 * Returns 0 when every expert was delivered and every callback returned 0;
 * otherwise the first negative code (from the source or a callback), with
 * err filled.  Counts into the source's stats. */
int expert_source_fetch(expert_source *src, int layer, const int32_t *ids, size_t n,
                        expert_ready_fn fn, void *ctx, shoal_err *err);

void expert_source_stats_get(const expert_source *src, expert_source_stats *out);

/* See expert_source_more_ops.request; a no-op (0) for sources without it. */
int expert_source_request(expert_source *src, int layer, const int32_t *ids, size_t n,
                          int prefetch, shoal_err *err);

/* How expert bytes read from shoald's cache treat the page cache. */
typedef enum expert_page_cache {
    EXPERT_PC_KEEP = 0,       /* mmap: pages stay cached after use */
    EXPERT_PC_DONTNEED = 1,   /* mmap, then posix_fadvise(DONTNEED) once unmapped */
    EXPERT_PC_DIRECT = 2      /* O_DIRECT pread into the engine's own buffer */
} expert_page_cache;

typedef struct expert_source_shoald_options {
    uint64_t expert_bytes;    /* from OPEN_OK */
    int n_layers, experts_per_layer, moe_layers;
    uint64_t ram_bytes;       /* RAM tier budget over all MoE layers; 0: none */
    expert_page_cache page_cache;
    int timeout_ms;           /* per item; <= 0: 60 s */
    uint64_t read_part;       /* bytes per read part, rounded up to whole pages;
                               * 0: the default (docs/performance.md) */
} expert_source_shoald_options;

/* The shoald source: experts of the model `handle` opened on `client`
 * (both borrowed; one thread at a time uses the client).  An item that does
 * not arrive within timeout_ms fails the fetch with SHOAL_ETIMEOUT, and a
 * daemon that goes away fails it with SHOAL_ENET, so a dead daemon is an
 * error, not a hang.  NULL on no memory. */
struct shoal_client;
expert_source *expert_source_shoald_new(struct shoal_client *client, uint32_t handle,
                                        const expert_source_shoald_options *o);

/* The local-directory source over a bound model (borrowed: must outlive the
 * source).  NULL on no memory. */
expert_source *expert_source_local_new(const engine_model *m);

#endif
