/* source.h — the engine's expert and spine sources outside the process:
 * everything that talks to shoald (common/client.h).  Built on the forward
 * pass's expert-source interface (engine/forward/forward.h, part 4); the
 * forward pass never includes this header.
 *
 * Two parts:
 *   1. the shoald expert source (expert_source_shoald.c): batched GETs,
 *      the RAM tier, prefetches, parallel reads;
 *   2. a model served by shoald (remote.c): OPEN, the spine GET'd and
 *      bound, the expert source set up for it.
 */
#ifndef SHOAL_ENGINE_SOURCE_H
#define SHOAL_ENGINE_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/forward/forward.h"

/* ---- 1. the shoald expert source -------------------------------------------
 *
 * Experts of a model opened on shoald, delivered through the expert-source
 * interface (forward.h part 4, where the contract is).
 */

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

/* The same over a link its creator owns and may change: when the daemon
 * restarts, the creator (engine_remote_reconnect) puts the new connection
 * and handle in and bumps epoch; the source then forgets the GETs it had
 * open on the old connection (their items will never come) and asks anew.
 * Experts already resident stay: their bytes are mappings or copies that
 * outlive the connection.  link is borrowed for the source's life; change
 * it only between fetches, on the thread that fetches. */
typedef struct expert_source_shoald_link {
    struct shoal_client *client;
    uint32_t handle;
    uint64_t epoch;
} expert_source_shoald_link;

expert_source *expert_source_shoald_new_link(const expert_source_shoald_link *link,
                                             const expert_source_shoald_options *o);

/* ---- 2. a model served by shoald ------------------------------------------
 *
 * a model served by shoald (DESIGN.md decision 9): the engine
 * side of `shoal-engine run hf://org/name`.
 *
 * Owns: the connection to shoald (common/client.h), the OPEN of the model,
 * the decoded manifest, the spine tensors GET'd by name and kept mapped for
 * the model's lifetime, the bound engine_model and its shoald expert
 * source.  Does not own the forward pass, nor the cache (shoald does).
 *
 * Threads: one thread at a time (the client connection is shared by the
 * spine load and the expert source).
 */

typedef struct engine_remote engine_remote;

typedef struct engine_remote_options {
    const char *home;          /* shoald's home (the socket is home/shoald.sock) */
    const char *socket_path;   /* overrides home when set */
    int timeout_ms;            /* per item and per call; <= 0: 60 s */
    uint64_t expert_ram;       /* the engine's RAM tier for experts, bytes, when */
    int expert_ram_set;        /* ... set; otherwise half of MemAvailable after the spine */
    expert_page_cache page_cache;  /* when page_cache_set; otherwise dontneed if the
                                    * experts do not fit the RAM tier, else keep */
    int page_cache_set;
    int spine_cache_off;       /* neither use nor store the cached int8 spine pack */
    uint64_t read_part;        /* expert reads in parts of this many bytes; 0: default */
} engine_remote_options;

/* How the spine was loaded. */
typedef struct engine_remote_spine {
    int    from_pack;          /* mapped the cached int8 pack: nothing quantized */
    int    stored;             /* quantized, and the pack was stored for next time */
    int    refused;            /* a cached pack was there but refused (warned) */
    double load_ms;            /* from the first spine GET to the model bound */
} engine_remote_spine;

/* Is `spec` a model shoald must serve ("hf://...")? */
int engine_remote_is_spec(const char *spec);

/* Connect, OPEN `spec`, GET every spine tensor and bind the model with
 * `mo`.  A missing daemon fails with the client's "start shoald" message.
 * *out on success (engine_remote_free), NULL on failure. */
int engine_remote_open(const char *spec, const engine_remote_options *ro,
                       const engine_model_options *mo, engine_remote **out, shoal_err *err);

/* Half of /proc/meminfo's MemAvailable (0 when unreadable): the default
 * RAM tier, leaving the rest to the page cache and everything else. */
uint64_t engine_remote_default_ram(void);

/* Borrowed; live until engine_remote_free. */
engine_model *engine_remote_model(engine_remote *r);
expert_source *engine_remote_source(engine_remote *r);
struct shoal_client *engine_remote_client(engine_remote *r);
uint32_t engine_remote_handle(const engine_remote *r);
void engine_remote_spine_info(const engine_remote *r, engine_remote_spine *out);

/* Is the daemon still there?  A REPORT of nothing: one round trip, which
 * also checks that the model's handle is still open.  0, or the client's
 * error (SHOAL_ENET: the connection is gone).  Same thread as the rest. */
int engine_remote_ping(engine_remote *r, shoal_err *err);

/* Replace a lost connection (a restarted shoald): connect, HELLO, OPEN the
 * same commit, check it is the same model, and hand the new connection and
 * handle to the expert source (its link).  The spine, the manifest and the
 * model stay as they are: the spine's bytes are mappings of blobs, which
 * outlive the connection that delivered them.  0, or the failure with the
 * old connection left as it was (call again later). */
int engine_remote_reconnect(engine_remote *r, shoal_err *err);

/* Write the model's small files `names[0..n)` into directory `dir` (for
 * the tokenizer, which reads a directory): config.json from the manifest,
 * the others GET'd from shoald.  A name the model does not have is skipped.
 * 0 or a negative code. */
int engine_remote_write_files(engine_remote *r, const char *const *names, size_t n,
                              const char *dir, shoal_err *err);

void engine_remote_free(engine_remote *r);

#endif
