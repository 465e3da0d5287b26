/* source.h — the engine's expert and spine sources outside the process:
 * everything that talks to shoald (common/client.h).  Built on the forward
 * pass's expert-source interface (engine/forward/forward.h, part 4); the
 * forward pass never includes this header.
 *
 * Three parts:
 *   1. the shoald expert source (expert_source_shoald.c): batched GETs,
 *      the RAM tier, prefetches, parallel reads;
 *   2. a model served by shoald (remote.c, spine_resident.c): OPEN, the
 *      spine pack read into memory or built into shoald's cache, the
 *      expert source set up for it;
 *   3. a model loaded under the memory plan, from a directory or shoald
 *      (load.c).
 * And the checked reads both use (checked_read.c, spine_resident.c),
 * public so bench/checkread measures the code itself.
 */
#ifndef SHOAL_ENGINE_SOURCE_H
#define SHOAL_ENGINE_SOURCE_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "engine/forward/forward.h"
#include "engine/plan/plan.h"

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
    /* [n_layers][experts_per_layer] where each expert lies upstream,
     * (file index << 40) | offset (the manifest's), so a layer's set is
     * asked for and read in file order (expert_source_order); copied.
     * NULL: id order. */
    const uint64_t *file_order;
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
 * the decoded manifest, the spine: the cached pack read into memory
 * (spine_resident.c), or built tensor by tensor straight into the object
 * shoald hands out for it (PUT_BEGIN / PUT_COMMIT) and then read like a
 * second run's, or quantized in memory; the spine tensors the pack does
 * not cover, GET'd by name and kept mapped; the bound engine_model and its
 * shoald expert source.  Does not own the forward pass, nor the cache
 * (shoald does), nor the plan (the caller sizes the RAM tier with it).
 *
 * Threads: one thread at a time (the client connection is shared by the
 * spine load and the expert source).
 */

typedef struct engine_remote engine_remote;

/* How a cached spine pack is brought into memory (spine_resident.c). */
typedef enum spine_load_mode {
    SPINE_LOAD_READ = 0,       /* read into anonymous huge pages (O_DIRECT, threads) */
    SPINE_LOAD_MAP = 1         /* mapped, populated, mlock'd where allowed */
} spine_load_mode;

typedef struct engine_remote_options {
    const char *home;          /* shoald's home (the socket is home/shoald.sock) */
    const char *socket_path;   /* overrides home when set */
    int timeout_ms;            /* per item and per call; <= 0: 60 s */
    expert_page_cache page_cache;  /* when page_cache_set; otherwise dontneed if the
                                    * experts do not fit the RAM tier, else keep */
    int page_cache_set;
    int spine_cache_off;       /* neither use nor store the cached spine pack */
    uint64_t read_part;        /* expert reads in parts of this many bytes; 0: default */
    spine_load_mode spine_load;
    int io_threads;            /* threads reading the pack into memory; 0: 8 */
    /* a pack being built: bytes done of the pack's total; may be NULL */
    engine_progress_fn progress;
    void *progress_ctx;
} engine_remote_options;

/* How the spine was loaded. */
typedef struct engine_remote_spine {
    int    from_pack;          /* bound from a pack in memory: nothing quantized */
    int    built;              /* quantized at this load into a pack */
    int    stored;             /* ... and shoald stored it for the next load */
    int    put_direct;         /* ... written straight into shoald's file (PUT_BEGIN) */
    int    refused;            /* a cached pack was there but refused (warned) */
    int    damaged;            /* ... read back damaged: reported, built again (warned) */
    engine_spine mode;
    uint64_t pack_bytes;
    int    direct;             /* the pack was read with O_DIRECT */
    int    mapped, locked;     /* --spine-load map: mapped, and mlock'd */
    double load_ms;            /* from the first spine GET to the model bound */
    double read_ms;            /* of it: reading the pack into memory */
} engine_remote_spine;

/* Is `spec` a model shoald must serve ("hf://...")? */
int engine_remote_is_spec(const char *spec);

/* Connect, OPEN `spec` and read its manifest: the config is known, no
 * weight is read.  A missing daemon fails with the client's "start
 * shoald" message.  *out on success (engine_remote_free), NULL on failure. */
int engine_remote_connect(const char *spec, const engine_remote_options *ro,
                          engine_remote **out, shoal_err *err);

/* The model's config.json bytes (borrowed from the manifest). */
void engine_remote_config(const engine_remote *r, const uint8_t **config, size_t *len);

/* Load the spine with `mo` and make the expert source with a RAM tier of
 * `expert_ram` bytes (the plan's).  0 or a negative code (the remote is
 * then only fit for engine_remote_free). */
int engine_remote_bind(engine_remote *r, const engine_model_options *mo, uint64_t expert_ram,
                       shoal_err *err);

/* Borrowed; live until engine_remote_free (model and source after bind). */
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

/* ---- 3. a model loaded under the memory plan --------------------------------
 *
 * what every command that runs a model does first (load.c): read the
 * machine's limits (common/platform.h) and the config (config.json of a
 * directory, or the manifest shoald sends for hf://), make the memory plan
 * (engine/plan/plan.h), refuse what does not fit, print the plan, bind the
 * model in the plan's spine mode, give the expert source the plan's RAM
 * tier, REPORT the plan to shoald, and fill the session options with the
 * plan's context.
 *
 * Owns: the thread pool, the model (directly or through engine_remote),
 * the expert source, the plan.  Does not own the sessions.
 */

struct engine_loaded;

typedef struct engine_load_options {
    plan_options plan;         /* ram, context, spine (-1 auto), chunk, threads, copies,
                                * expert_ram; `remote` is set from the spec */
    /* hf:// models through shoald */
    const char *home;
    int timeout_ms;
    int page_cache;            /* -1: the default policy, else expert_page_cache */
    int spine_cache_off;
    uint64_t read_part;
    spine_load_mode spine_load;
    /* the forward pass */
    int experts;               /* -1: by the spine (exact with f32), else kernels_numerics */
    engine_alog_mode alog;
    engine_l2_mode l2;
    double mla_eps;
    int no_prefetch;           /* 0 on, 1 score, 2 off */
    double prefetch_cutoff;
    /* where the plan is printed at load (one block); NULL: not printed */
    FILE *plan_out;
    /* the load's steps: each one's name with done = total = 0 ("opening
     * the model", "loading the spine"), then the measured phases of a pack
     * being built ("quantizing", "storing"); may be NULL */
    engine_progress_fn progress;
    void *progress_ctx;
    /* Called once the model is bound and l->session filled, before the
     * load returns, on the loading thread: it may change l->session (the
     * MPI ranks' source and applier, docs/mpi.md); a failure fails the
     * load.  May be NULL. */
    int (*bound)(void *ctx, struct engine_loaded *l, shoal_err *err);
    void *bound_ctx;
} engine_load_options;

void engine_load_options_default(engine_load_options *o);

typedef struct engine_loaded {
    struct kernels_pool *pool;
    engine_model *model;
    expert_source *src;
    engine_remote *remote;     /* hf://: owns model and src */
    plan plan;
    engine_session_options session;   /* chunk, pool, src, experts, prefetch, context */
    double load_ms;
    FILE *plan_out;            /* the options' plan_out: a streamed spine's figures at close */
} engine_loaded;

/* The plan alone: limits, config, plan_make; no weight read (hf:// opens
 * the model on shoald for its manifest).  0, or the plan's refusal
 * (SHOAL_ENOMEM, *p filled) or another negative code. */
int engine_load_plan(const char *spec, const engine_load_options *o, plan *p, k3_config *cfg,
                     shoal_err *err);

/* Plan and load.  A plan that streams part of the spine passes it on as
 * engine_model_options.stream_layers: a directory's model writes the
 * streamed part to a file as it derives it; through shoald the cached
 * pack's streamed layers are read in place every pass (remote.c).
 * *out zeroed on failure; close with engine_load_close (accepts a zeroed
 * one). */
int engine_load_open(const char *spec, const engine_load_options *o, engine_loaded *out,
                     shoal_err *err);
void engine_load_close(engine_loaded *l);

/* ---- checked reads (checked_read.c) -------------------------------------- */

struct shoal_client;
/* An object's XXH3-128 hashed as its nparts parts are read, by whichever
 * threads read them (checked_read.c; the shoald expert source's
 * readers use it, bench/checkread measures it).  NULL: out of memory. */
typedef struct checked_read checked_read;
checked_read *checked_read_new(const uint8_t want[16], uint32_t nparts);
void checked_read_free(checked_read *r);
/* Part `part` ([p, p+n), in the object's order) has been read.  Any
 * thread; returns at once unless this caller takes the next parts' hash.
 * Once every part's call has returned, checked_read_result is final. */
int  checked_read_part(checked_read *r, uint32_t part, const uint8_t *p, size_t n);
/* 1 the bytes match, -1 they do not, 0 not every part hashed yet. */
int  checked_read_result(checked_read *r);
/* Tell shoald that layer's expert read back damaged (REPORT "damaged"):
 * it removes the object, so the next GET fetches it again. */
int  checked_read_report(struct shoal_client *c, uint32_t handle, int layer, int32_t expert,
                         shoal_err *err);
/* The same for an object named by kind "tensor" (a spine tensor), "file"
 * (a small file) or "derived" (the spine pack): shoald removes it, so the
 * next GET fetches it again (a derived object: the engine makes it
 * again). */
int  checked_read_report_object(struct shoal_client *c, uint32_t handle, const char *kind,
                                const char *name, shoal_err *err);

/* ---- the spine pack read into memory, checked (spine_resident.c) ---------
 *
 * What remote.c reads a cached pack with. */

/* A spine pack held in the engine's memory: the bytes of an object,
 * read into anonymous memory (SPINE_LOAD_READ) or mapped, populated and
 * locked where allowed (SPINE_LOAD_MAP). */
typedef struct spine_resident {
    const uint8_t *data;       /* the object's first byte */
    uint64_t length;
    void *base;                /* the buffer or the mapping underneath */
    size_t maplen;
    int mapped;                /* 1: a file mapping (munmap), 0: anonymous (free) */
    int locked;                /* MAP: mlock succeeded */
    int direct;                /* READ: O_DIRECT worked (else buffered reads) */
    double ms;
    uint64_t file_start;       /* READ: the file offset of base[0] (a 4 KiB multiple) */
    size_t lead;               /* READ: data - base */
    /* checked: the object's XXH3-128 as its bytes went by, up to file
     * offset hash_pos; want is the index's (the GET_ITEM's) */
    struct XXH3_state_s *hash; /* NULL: unchecked */
    uint64_t hash_pos;
    uint8_t want[16];
    double hash_ms;            /* reading the streamed part only to hash it */
} spine_resident;

/* A file range hashed on its own as the rest of the object goes by
 * (a streamed layer's, for its per-pass check). */
typedef struct spine_resident_range {
    uint64_t off, len;         /* file offsets */
} spine_resident_range;

/* Bring [off, off+len) of fd into memory per `mode`, reading with
 * `threads` threads in parts (READ).  fd stays the caller's.  want (NULL:
 * unchecked): the object's XXH3-128, canonical; the bytes are hashed as
 * they are read, spine_resident_check says whether they match. */
int spine_resident_read(int fd, uint64_t off, uint64_t len, spine_load_mode mode, int threads,
                        const uint8_t want[16], spine_resident *out, shoal_err *err);
void spine_resident_free(spine_resident *r);
/* READ only the first `fill` bytes of the object now (the buffer spans
 * all `len`; the rest stays untouched anonymous memory, no RAM until
 * written); spine_resident_fill reads [from, to) of the object later.
 * MAP maps and populates everything. */
int spine_resident_read_part(int fd, uint64_t off, uint64_t len, uint64_t fill,
                             spine_load_mode mode, int threads, const uint8_t want[16],
                             spine_resident *out, shoal_err *err);
int spine_resident_fill(spine_resident *r, int fd, uint64_t from, uint64_t to, int threads,
                        shoal_err *err);
/* Checked: the bytes after the last filled one (the streamed part, which
 * stays on disk) read once into small buffers only to be hashed, with
 * the ranges rg[0..nrg) (file offsets, each within what is read) hashed
 * on their own into xxh[i] (canonical).  Unchecked: nothing. */
int spine_resident_hash_rest(spine_resident *r, int fd, const spine_resident_range *rg,
                             size_t nrg, uint8_t (*xxh)[16], int threads, shoal_err *err);
/* 1: every byte was hashed and matches want; -1: it does not; 0:
 * unchecked, or not every byte read yet. */
int spine_resident_check(const spine_resident *r);

#endif
