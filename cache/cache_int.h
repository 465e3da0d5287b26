/* cache_int.h — cache/ internals shared by its files.  Nothing outside
 * cache/ includes this header; no sqlite3 or XXH type leaves cache/.
 *
 * Files: open.c (open/close, lock, budget, repair at open), write.c (the
 * writer), read.c (lookup, pins, remove, list, verify), evict.c (the
 * eviction policy, lifted pins, plans), stats.c (counters, sessions),
 * heat.c (requests per expert in memory), meta.c (models, files), db.c
 * (schema and statements), map.c (hash index), io.c (syscall table).
 */
#ifndef SHOAL_CACHE_INT_H
#define SHOAL_CACHE_INT_H

#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/cache.h"
#include "cache/cache_test.h"
#include "common/path.h"

#define CACHE_TAG "cache"

/* ---- io.c ---- */
extern cache_io cache_io_now;
/* Write all of p through the table; -1 with errno on failure. */
int cache_io_write_all(int fd, const void *p, size_t n);

/* ---- map.c: open-addressing multimap from a 64-bit hash to a uint32
 * value (an index into an array).  Several values may share a hash; the
 * caller compares the full key through `eq`. */
#define CMAP_NONE UINT32_MAX
typedef struct cmap {
    uint64_t *hash;      /* 0 marks an empty slot (hashes are forced != 0) */
    uint32_t *val;
    size_t    cap;       /* power of two */
    size_t    n;
} cmap;

typedef int (*cmap_eq_fn)(const void *ctx, uint32_t val);
uint64_t cmap_fix(uint64_t h);   /* map a hash into the non-zero range */
int      cmap_put(cmap *m, uint64_t h, uint32_t v);           /* 0 / SHOAL_ENOMEM */
uint32_t cmap_find(const cmap *m, uint64_t h, cmap_eq_fn eq, const void *ctx);
int      cmap_del(cmap *m, uint64_t h, uint32_t v);           /* 0 / SHOAL_ENOTFOUND */
int      cmap_set(cmap *m, uint64_t h, uint32_t old, uint32_t v);
void     cmap_clear(cmap *m);
void     cmap_free(cmap *m);

/* objects.pinned / cobj.pinned: 0 the kind decides (cache_config.pin_kinds),
 * 1 pinned by cache_pin, 2 the kind's pin lifted (cache_pin_lift: evictable). */
enum { CACHE_PINNED_KIND = 0, CACHE_PINNED_YES = 1, CACHE_PINNED_LIFTED = 2 };

static inline int cache_pin_effective(int stored, uint32_t pin_kinds, int kind)
{
    return stored == CACHE_PINNED_YES ||
           (stored == CACHE_PINNED_KIND && (pin_kinds & CACHE_PIN_KIND(kind)));
}

/* ---- one committed object, as the writer holds it in memory ---- */
typedef struct cobj {
    uint64_t id;
    uint64_t off, len;
    char    *etag;            /* owned */
    uint64_t keyhash;
    int64_t  last_access_ms;
    uint64_t hits;
    uint32_t hits_pending;    /* hits not yet written to the index */
    int32_t  layer, expert;
    uint8_t  kind;
    uint8_t  pinned;          /* CACHE_PINNED_*: by cache_pin, by kind, or lifted */
    uint8_t  dirty;           /* on the access-flush list */
    uint8_t  verified;        /* part of a whole file that matched its upstream
                                 hash (objects.verified; cache_file_verified) */
    uint8_t  xxh[16];
} cobj;

/* ---- one counter row being gathered in memory ---- */
typedef struct ccount {
    uint64_t session;
    int64_t  model;
    int32_t  layer, expert;
    int32_t  tier;
    cache_counts v;
} ccount;

/* ---- one expert's requests, as heat.c keeps them ---- */
typedef struct cheat {
    int64_t  model;
    int32_t  layer, expert;
    uint64_t requests;        /* hits + misses + joins, both tiers */
} cheat;

/* Prepared statements, made once at open. */
enum {
    ST_OBJ_GET,          /* read-only lookup by key */
    ST_OBJ_INSERT,
    ST_OBJ_DELETE,
    ST_OBJ_ACCESS,
    ST_OBJ_PIN,
    ST_NAME_INSERT,
    ST_NAME_DELETE,
    ST_PART_GET,
    ST_PART_PUT,
    ST_PART_DELETE,
    ST_MODEL_PUT,
    ST_MODEL_ID,
    ST_COUNT_UPSERT,
    ST_COUNT_
};

struct cache_writer;

struct cache {
    char      dir[SHOAL_PATH_MAX];
    char      blobs[SHOAL_PATH_MAX];
    char      tmp[SHOAL_PATH_MAX];
    cache_config cfg;
    sqlite3  *db;
    sqlite3_stmt *st[ST_COUNT_];
    int       lock_fd;
    int       blobs_fd;       /* directory descriptor: openat for lookups */

    /* Objects (writer only).  Invariant 4: used == sum of objs[].len. */
    cobj     *objs;
    size_t    nobjs, capobjs;
    cmap      by_key, by_id;
    uint64_t  next_id;
    uint64_t  budget, used, reserved;
    uint64_t  reserved_disk;  /* reserved rounded up per writer to blksize: what
                                 cache_evict_for charges, like used_disk */
    uint64_t  used_disk;      /* sum of objs[].len rounded up to blksize: what the
                                 budget is charged (disk blocks, not bytes) */
    uint64_t  blksize;        /* the filesystem's block (statvfs f_bsize) */
    uint64_t  evicted, evicted_bytes;
    uint64_t *dirty;          /* ids whose access stats wait for a flush */
    size_t    ndirty, capdirty;

    /* Counters gathered since the last flush. */
    ccount   *counts;
    size_t    ncounts, capcounts;
    cmap      by_count;
    uint64_t  pending_events;
    uint64_t  last_flush_ns;
    cache_counts since_open[CACHE_TIER_COUNT_];   /* every tier total since open (never flushed) */

    struct cache_writer *writers;   /* active writers */

    /* Requests per expert (heat.c); valid while heat_ready. */
    cheat    *heat;
    size_t    nheat, capheat;
    cmap      by_heat;
    int       heat_ready;
    /* cache_set_unlinker: where unlinks of files the index no longer names
     * go (NULL: unlink at once). */
    cache_unlink_fn unlink_fn;
    void     *unlink_ctx;
    /* cache_set_commit_hook: told of every committed object (NULL: none). */
    cache_commit_fn commit_fn;
    void     *commit_ctx;
};

/* Unlink a file the index no longer names: through the unlinker when one
 * is set (later, on another thread), else now. */
void cache_unlink_later(cache *c, const char *path);

/* ---- db.c ---- */
int  cache_db_open(cache *c, const char *path, int read_only, shoal_err *err);
void cache_db_close(cache *c);
int  cache_db_exec(cache *c, const char *sql, shoal_err *err);
/* Map an SQLite failure to a shoal code with its message. */
int  cache_db_fail(cache *c, int rc, const char *what, shoal_err *err);
int  cache_db_begin(cache *c, shoal_err *err);
int  cache_db_commit(cache *c, shoal_err *err);
void cache_db_rollback(cache *c);

/* ---- open.c ---- */
void     cache_blob_name(char *out, size_t cap, uint64_t id);   /* "%016llx" */
int      cache_blob_path(const cache *c, uint64_t id, char *out, size_t cap);
int      cache_tmp_path(const cache *c, uint64_t id, char *out, size_t cap);
uint64_t cache_key_hash(const char *etag, uint64_t off, uint64_t len);
uint64_t cache_id_hash(uint64_t id);
int      cache_obj_pinned(const cache *c, const cobj *o);
/* Index of the object with this key / id in c->objs, or CMAP_NONE. */
uint32_t cache_obj_find(const cache *c, const cache_key *key);
uint32_t cache_obj_by_id(const cache *c, uint64_t id);
/* Add to / drop from the in-memory table (not the index). */
int      cache_obj_add(cache *c, const cobj *o, shoal_err *err);
void     cache_obj_drop(cache *c, uint32_t idx);
int      cache_key_check(const cache_key *key, shoal_err *err);
void     cache_assert_usage(const cache *c);
/* Allocate dir/reserve (0, or SHOAL_ENOSPC with a warning) / release it. */
int      cache_reserve_take(cache *c);
int      cache_reserve_give(cache *c);

/* ---- write.c ---- */
void cache_writers_abort_all(cache *c);

/* ---- read.c ---- */
/* Delete these objects: rows in one transaction, then the blobs
 * (invariant 7).  ids are object ids. */
int cache_objs_delete(cache *c, const uint64_t *ids, size_t n, shoal_err *err);

/* ---- evict.c ---- */
/* len as the budget charges it: rounded up to the filesystem's block. */
uint64_t cache_disk_len(const cache *c, uint64_t len);
/* Disk blocks the active writers' tmp files hold now (fstat of each; a
 * PUT_BEGIN's file grows as its client writes).  They are the cache's:
 * the budget's "room" counts them, so a file being filled does not
 * shrink the budget while its reservation also charges it. */
uint64_t cache_writers_disk(const cache *c);
/* Make room for `need` more bytes (used + reserved + need <= budget),
 * evicting the least valuable unpinned objects.  SHOAL_ENOSPC and nothing
 * changed if it cannot fit. */
int cache_evict_for(cache *c, uint64_t need, shoal_err *err);

/* ---- heat.c ---- */
/* Add n requests to (model, layer, expert) when the table is loaded. */
void cache_heat_add(cache *c, int64_t model, int32_t layer, int32_t expert, uint64_t n);
/* (Re)load the table from the flushed counters (writer; flush first). */
int  cache_heat_load(cache *c, shoal_err *err);
void cache_heat_free(cache *c);

/* ---- stats.c ---- */
void cache_stats_note_access(cache *c, uint32_t idx);   /* a hit: recency and frequency */
void cache_stats_note_touch(cache *c, uint32_t idx);    /* recency only */
void cache_stats_free(cache *c);
int  cache_names_insert(cache *c, uint64_t id, const cache_names *names, shoal_err *err);
int  cache_model_id(cache *c, const cache_names *names, int64_t *id, shoal_err *err);

#endif
