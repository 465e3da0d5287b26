/* fetch_int.h — the upstream shared by upstream.c (open, resolve, blocking
 * reads), model.c (the manifest) and xfer_*.c (sessions; their own shared
 * layout is fetcher/xfer_int.h).  Private to fetcher/.
 */
#ifndef SHOAL_FETCHER_FETCH_INT_H
#define SHOAL_FETCHER_FETCH_INT_H

#include <pthread.h>
#include <stdint.h>

#include "fetcher/fetch.h"
#include "fetcher/hub.h"

#define UP_LOCAL_ENDPOINT "file://"

/* What is known of one upstream file at the pinned commit. */
typedef struct up_file {
    char    *path;
    int      ready;             /* hf holds a usable resolution */
    hub_file hf;                /* etag, size, location (Hub) */
    int64_t  expires_ms;        /* of hf.location; 0: unknown / never */
    int      unrecorded;        /* resolved while records were deferred */
    int      peer;              /* HF cache blob: 0 unknown, 1 verified, -1 no */
    char    *peer_blob;         /* its path when verified */
    fetch_peer_stat peer_st;    /* the blob's stat when it was verified */
} up_file;

struct fetch_upstream {
    fetch_options o;            /* strings below are owned copies */
    char        *endpoint;      /* Hub endpoint, or UP_LOCAL_ENDPOINT */
    char        *token_line;    /* "Authorization: Bearer ..." or NULL */
    int          local;
    char        *dir;           /* local: the directory (real path) */
    char         ident[33];     /* local: hash of its files' names, sizes,
                                   mtimes (keys the manifest with commit) */
    hub_spec     spec;          /* Hub: repo and the revision asked for */
    char         commit[HUB_REV_MAX];
    hub_client  *hc;            /* Hub: blocking metadata calls */
    cache       *c;             /* borrowed; may be NULL */
    up_file    **files;         /* each allocated alone: pointers stay valid */
    size_t       nfiles, cap_files;
    fetch_stats  st;
    uint64_t     rng;           /* xorshift64* state for jitter */
    /* Guards files, st, rng and the cache calls while a manifest build
     * reads headers on several threads (each with its own hub_client). */
    pthread_mutex_t mu;
    int          deferring;     /* o.defer_records, until set_cache */
    int          offline;       /* FETCH_ONLINE / OFFLINE / UNREACHABLE */
    char        *peer;          /* HF cache's models--org--name, or NULL */
};

/* A Hub client like u->hc, for a thread of its own.  Caller frees. */
int up_client_new(fetch_upstream *u, hub_client **out, shoal_err *err);

/* up_stat and up_read over the client hc (NULL: u->hc), from any thread. */
int up_stat_on(fetch_upstream *u, hub_client *hc, const char *path, char *etag, size_t cap,
               uint64_t *size, shoal_err *err);
int up_read_on(fetch_upstream *u, hub_client *hc, const char *path, uint64_t off, size_t len,
               void *buf, shoal_err *err);

/* The record of path, created (unresolved) when absent; NULL when out of
 * memory.  The pointer stays valid until fetch_upstream_free(). */
up_file *up_file_get(fetch_upstream *u, const char *path);

/* A usable resolution of path (Hub): the one in memory, else the cache
 * index's while its location has not expired, else a HEAD (with retries).
 * force: always HEAD (the CDN refused the location).  The result is kept
 * in memory and in the cache index. */
int up_resolve(fetch_upstream *u, const char *path, int force, up_file **out, shoal_err *err);

/* Like up_resolve without any request: 0 when memory or the cache index
 * holds a location that has not expired, else -1 (*out still set). */
int up_cached(fetch_upstream *u, const char *path, up_file **out);

/* Record a fresh resolution (from the blocking or the multi path). */
void up_file_store(fetch_upstream *u, up_file *f, const hub_file *hf);

/* Etag and size of path: a Hub resolve or a local stat.  SHOAL_ENOTFOUND
 * names the file. */
int up_stat(fetch_upstream *u, const char *path, char *etag, size_t cap, uint64_t *size,
            shoal_err *err);

/* len bytes at off of path into buf: strict range GETs with retries, or
 * pread.  Errors typed. */
int up_read(fetch_upstream *u, const char *path, uint64_t off, size_t len, void *buf,
            shoal_err *err);

/* Backoff before attempt `attempt` (1-based): base·2^(attempt-1) capped,
 * plus up to 25% jitter; a server hint (seconds, >= 0) wins, capped by
 * max_wait_s. */
long up_backoff_ms(fetch_upstream *u, int attempt, long hint_s);

/* 1 when the file at full hashes to hex (hl 64: sha256; 40: git blob
 * sha1 of its size bytes), 0 when not, a negative code if unreadable. */
int up_hash_matches(const char *full, const char *hex, size_t hl, uint64_t size);

/* The Hugging Face cache as a peer (peer.c).  find: set u->peer when the
 * HF cache holds the repo.  commit: the revision's commit from its refs/
 * (0, or a code).  check: 1 when f's blob (by f->hf.etag) is verified
 * (hashed now or remembered), else 0; caches the answer in f.  resolve:
 * f's etag and size from the snapshot symlink at u->commit, verified; 0 or
 * -1.  read: pread from the verified blob.  A verified blob's stat (size,
 * mtime, inode) is kept in f->peer_st: the daemon serves it only while its
 * stat is still that (fetch_upstream_peer_drop otherwise).  The memo is
 * pruned (blobs gone or changed, repeats, past its bound) at the end of
 * fetch_upstream_peer_scan. */
void up_peer_find(fetch_upstream *u);
int  up_peer_commit(fetch_upstream *u, shoal_err *err);
int  up_peer_check(fetch_upstream *u, up_file *f);
int  up_peer_resolve(fetch_upstream *u, up_file *f);
int  up_peer_read(fetch_upstream *u, up_file *f, uint64_t off, size_t len, void *buf,
                  shoal_err *err);

/* Path of a file inside the local directory into out.  0 or ETOOBIG. */
/* The endpoint that names the model in the cache and the manifest: the
 * Hub's URL, or "" for a local directory (UP_LOCAL_ENDPOINT stays the
 * upstream's own scheme for file records). */
const char *up_model_endpoint(const fetch_upstream *u);
int up_local_path(const fetch_upstream *u, const char *path, char *out, size_t cap);

#endif
