/* hubmock_int.h — hubmock's internal interface (tools/hubmock only).
 *
 * hubmock serves model directories as a Hugging Face Hub on loopback, with a
 * second "CDN" port for the signed redirect targets, and injects faults.
 * Files:
 *   main.c    command line, ports, signals, the ready line
 *   repo.c    snapshots (directory -> files, hashes, commit id), repos, refs
 *   synth_repo.c  synthesized repos (--synth): models from synth/, their
 *             etags (committed table, cache file, hashing threads), breakages
 *   etag_cache.c  the persistent etag cache file of synthesized repos
 *   http.c    a small HTTP/1.1 server over bufferevents: parsing, sending,
 *             body streaming with the body faults (reset, truncate, stall,
 *             drip, corruption, bandwidth cap), delayed answers, keep-alive
 *   hub.c     the Hub port: /resolve, /api/..., /_mock control
 *   cdn.c     the CDN port: signed URLs, ranges
 *   faults.c  fault settings, the seeded PRNG, key=value parsing
 *   reqlog.c  the JSON-lines request log
 *
 * Why not evhttp: a fault server must cut a body after K bytes with a reset
 * or a clean close, stall mid-body and throttle one connection; evhttp owns
 * the connection and offers none of that, so the server is written directly
 * on bufferevents (which also give sendfile and per-connection rate limits).
 *
 * Everything runs on one libevent loop in one thread; no locks.  The only
 * other threads are the etag hashers of synthesized repos, which run (and
 * are joined) before the loop starts.
 */
#ifndef HUBMOCK_INT_H
#define HUBMOCK_INT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/buf.h"
#include "common/err.h"
#include "synth/synth.h"

struct event_base;

#define HM_NONE UINT64_MAX

/* ---- repo.c ------------------------------------------------------------ */

typedef struct hm_file {
    char    *path;          /* relative, '/'-separated; owned */
    uint64_t size;
    char     sha256[65];    /* content sha256 (LFS oid, X-Linked-Etag) */
    char     gitsha1[41];   /* git blob sha1 of what git stores: the content
                               for small files, the LFS pointer for LFS ones */
    int      is_lfs;
    size_t   synth_file;    /* synthesized snapshots: the file's index in the model */
} hm_file;

/* An immutable view of one directory as it was hashed, or of a synthesized
 * model: a commit. */
typedef struct hm_snapshot {
    char    *dir;           /* absolute path; owned; NULL when synthesized */
    const synth_model *synth;  /* synthesized: the model (owned by hm_repos) */
    char     commit[41];
    hm_file *files;         /* sorted by path */
    size_t   nfiles;
} hm_snapshot;

typedef struct hm_ref {
    char        *name;      /* "main", "v1", "refs/pr/1"; owned */
    hm_snapshot *snap;      /* borrowed from the repo's snapshot list */
} hm_ref;

typedef struct hm_repo {
    char         *id;       /* "org/name"; owned */
    char          bucket[25];  /* 24 hex of the CDN path, from the id */
    hm_ref       *refs;
    size_t        nrefs;
    hm_snapshot **snaps;    /* every snapshot ever referenced; owned */
    size_t        nsnaps;
} hm_repo;

typedef struct hm_repos {
    hm_repo *v;
    size_t   n;
    uint64_t lfs_threshold;
    synth_model **models;   /* every synthesized model of every snapshot; owned */
    size_t   nmodels;
} hm_repos;

/* Hash every regular file under dir (skipping .git/) into a new snapshot.
 * Caller frees with hm_snapshot_free. */
int hm_snapshot_load(const char *dir, uint64_t lfs_threshold, hm_snapshot **out,
                     shoal_err *err);
void hm_snapshot_free(hm_snapshot *s);
/* Borrowed file entry, or NULL. */
const hm_file *hm_snapshot_file(const hm_snapshot *s, const char *path);

/* Point ref `ref` of repo `id` at a snapshot of `dir` (hashed now), adding
 * the repo or the ref as needed.  Snapshots with an already known commit are
 * reused, so old commits keep serving their own directory. */
int hm_repos_set(hm_repos *rs, const char *id, const char *ref, const char *dir,
                 shoal_err *err);
/* The same for a snapshot built elsewhere (synth_repo.c); takes ownership
 * of snap, even on failure. */
int hm_repos_put(hm_repos *rs, const char *id, const char *ref, hm_snapshot *snap,
                 shoal_err *err);
/* Order of hm_file by path (snapshots keep their files sorted). */
int hm_file_cmp(const void *a, const void *b);
/* Fill s->commit from its sorted files. */
void hm_snapshot_commit(hm_snapshot *s);
/* Whether the Hub keeps path in LFS: *.safetensors and tiktoken.model
 * always, anything else from `threshold` bytes. */
int hm_path_is_lfs(const char *path, uint64_t size, uint64_t threshold);
/* The git blob sha1 of the LFS pointer of (sha256, size): an LFS file's ETag. */
void hm_lfs_pointer_sha1(const char *sha256, uint64_t size, char out[41]);
void hm_hex(const unsigned char *p, size_t n, char *out);
hm_repo *hm_repos_find(const hm_repos *rs, const char *id);
/* A 40-hex commit of this repo, or a ref name (already percent-decoded). */
hm_snapshot *hm_repo_revision(const hm_repo *r, const char *rev);
/* Find an LFS file by sha256 over all repos; *snap gets its snapshot. */
const hm_file *hm_repos_blob(const hm_repos *rs, const char *sha256,
                             const hm_snapshot **snap);
void hm_repos_free(hm_repos *rs);

/* ---- faults.c ------------------------------------------------------------ */

enum { HM_ON_BOTH = 0, HM_ON_HUB = 1, HM_ON_CDN = 2 };
enum { HM_STALL_BEFORE = 0, HM_STALL_MID = 1 };
enum { HM_CORRUPT_NONE = 0, HM_CORRUPT_ONE = 1, HM_CORRUPT_ALL = 2, HM_CORRUPT_DRIFT = 3 };

typedef struct hm_faults {
    double   rate_429, rate_503;     /* shares of requests, 0..1 */
    int      status_on;              /* HM_ON_*: ports the 429/503 apply to */
    uint64_t retry_after;            /* seconds, in Retry-After and RateLimit */
    double   rate_reset;             /* CDN bodies: RST after reset_after bytes */
    uint64_t reset_after;            /* 0: half the body */
    double   rate_truncate;          /* CDN bodies: clean close after truncate_after */
    uint64_t truncate_after;         /* 0: half the body */
    double   rate_ignore_range;      /* CDN: answer a Range request with 200 */
    double   rate_stall;             /* CDN: pause stall_secs */
    double   stall_secs;
    int      stall_at;               /* HM_STALL_BEFORE / HM_STALL_MID */
    uint64_t bw;                     /* CDN bytes/s per connection, 0: none */
    uint64_t cdn_ttl;                /* signed URL lifetime, seconds */
    uint64_t seed;
    uint64_t latency;                /* ms before every answer, both ports */
    double   hub_stall;              /* seconds before every hub-port answer */
    double   rate_corrupt;           /* CDN bodies: corrupted as corrupt_mode */
    int      corrupt_mode;           /* HM_CORRUPT_ONE / ALL / DRIFT */
    uint64_t corrupt_count;          /* > 0: only this many more corrupted answers,
                                        then rate_corrupt drops to 0 */
    double   drip_secs;              /* CDN bodies: one byte every drip_secs */
    uint64_t huge_header;            /* bytes of an extra response header, 0: none */
} hm_faults;

void hm_faults_defaults(hm_faults *f);
/* Set one key ("rate_429", "bw", ...) from text.  0 or SHOAL_EINVAL. */
int hm_faults_set(hm_faults *f, const char *key, const char *value, shoal_err *err);
/* Zero every fault (keeps cdn_ttl and seed). */
void hm_faults_clear(hm_faults *f);
/* The settings as a JSON object. */
int hm_faults_dump(const hm_faults *f, shoal_buf *out);

/* xorshift64* seeded PRNG; hm_rng_chance draws once whatever the rate, so
 * the sequence depends only on the order of requests. */
typedef struct hm_rng { uint64_t s; } hm_rng;
void hm_rng_seed(hm_rng *r, uint64_t seed);
int hm_rng_chance(hm_rng *r, double rate);

/* ---- reqlog.c ------------------------------------------------------------ */

typedef struct hm_reqlog hm_reqlog;
/* times: add t0_us / t1_us to each line (--log-times). */
int hm_reqlog_open(const char *path, int times, hm_reqlog **out, shoal_err *err);
void hm_reqlog_close(hm_reqlog *l);
void hm_reqlog_write(hm_reqlog *l, const char *port, const char *method, const char *target,
                     const char *range, int status, uint64_t bytes, int auth,
                     const char *fault, uint64_t t0_us, uint64_t t1_us);

/* ---- http.c ---------------------------------------------------------------- */

typedef enum hm_port { HM_PORT_HUB = 0, HM_PORT_CDN = 1 } hm_port;

typedef struct hm_request {
    hm_port port;
    char    method[16];
    char   *target;          /* raw request target, "/a/b?x=y" */
    char   *path;            /* raw path part (still percent-encoded) */
    char   *query;           /* raw query after '?', or "" */
    char   *range;           /* Range header value, or NULL */
    char   *authorization;   /* Authorization header value, or NULL */
    int     is_head;
} hm_request;

/* Where a response body comes from. */
typedef enum hm_body { HM_BODY_MEM = 0, HM_BODY_FILE, HM_BODY_SYNTH } hm_body;

/* What a handler answers.  The body is `mem`, a range of a file on disk or
 * a range of a synthesized file; the http layer sends Content-Length itself
 * (the body length, also for HEAD answers of file bodies). */
typedef struct hm_response {
    int         status;
    shoal_buf   headers;     /* "Name: value\r\n" lines */
    shoal_buf   mem;
    hm_body     body;
    char        file_path[4096];   /* HM_BODY_FILE */
    const synth_model *synth;      /* HM_BODY_SYNTH, with synth_file */
    size_t      synth_file;
    uint64_t    file_off, file_len;
    char        fault[64];   /* names of the faults applied, "+"-joined */
    /* body faults (HM_NONE: off) */
    uint64_t    cut_after;   /* stop after this many body bytes */
    int         cut_reset;   /* 1: RST, 0: clean close */
    double      stall_before, stall_mid;   /* seconds, 0: none */
    uint64_t    bw;          /* bytes/s, 0: none */
    int         corrupt;     /* HM_CORRUPT_*: bytes changed on the way out */
    uint64_t    corrupt_seq; /* HM_CORRUPT_DRIFT: which request this is */
    double      drip;        /* seconds per body byte, 0: none */
} hm_response;

void hm_response_header(hm_response *r, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A JSON error body with X-Error-Code / X-Error-Message (code may be NULL). */
void hm_response_error(hm_response *r, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void hm_response_fault(hm_response *r, const char *name);

/* Percent-decode src[0..n) into a new string (caller frees); NULL on a bad
 * escape or an embedded NUL. */
char *hm_pct_decode(const char *src, size_t n);
/* Value of `key` in a raw query string, decoded, caller frees; NULL if absent. */
char *hm_query_get(const char *query, const char *key);

/* ---- the server ------------------------------------------------------------ */

typedef struct hm_server {
    struct event_base *base;
    hm_repos    repos;
    hm_faults   faults;
    hm_rng      rng;
    hm_rng      rng2;            /* draws of faults added later (rate_corrupt),
                                    so the older faults keep their sequence */
    uint64_t    drift_seq;       /* corrupt_mode=drift requests so far */
    hm_reqlog  *log;             /* NULL: no log */
    const char *token;           /* NULL: not gated */
    int         small_redirect;  /* small files: relative 307 to resolve-cache */
    int         log_times;       /* request log lines carry t0_us / t1_us */
    int         hub_port, cdn_port;
    uint8_t     secret[32];      /* CDN URL signing key */
    struct hm_conn *conns;       /* open connections (http.c) */
    struct evconnlistener *listeners[2];
} hm_server;

/* Start listening on 127.0.0.1:port (0 = any); *bound gets the port. */
int hm_http_listen(hm_server *s, hm_port which, int port, int *bound, shoal_err *err);
/* Close the listeners and every open connection. */
void hm_http_shutdown(hm_server *s);

/* hub.c / cdn.c: fill `res` for `req`.  Control requests return 1 from
 * hm_hub_handle (not logged, not subject to faults). */
int hm_hub_handle(hm_server *s, const hm_request *req, hm_response *res);
void hm_cdn_handle(hm_server *s, const hm_request *req, hm_response *res);

/* cdn.c: the signed absolute CDN URL for an LFS file into out. */
void hm_cdn_url(hm_server *s, const hm_repo *repo, const hm_file *f, char *out, size_t cap);

/* cdn.c: answer with bytes of a file: 200 (no Range, an unparseable one, or
 * ignore_range), 206 for one satisfiable range, 416 otherwise.  Adds
 * Accept-Ranges and Content-Range; the caller adds the other headers. */
void hm_serve_file(hm_response *res, const hm_snapshot *snap, const hm_file *f,
                   const char *range, int ignore_range);

/* Decide the 429/503 faults for a request on `port`; 1 if res was filled. */
int hm_faults_status(hm_server *s, hm_port port, hm_response *res);
/* The faults every answer on `port` gets (latency, hub_stall, huge_header);
 * not for control requests. */
void hm_faults_every(hm_server *s, hm_port port, hm_response *res);

/* ---- synth_repo.c / etag_cache.c ------------------------------------------ */

/* A synthesized repo waiting for its etags (--synth, parsed before any is
 * hashed so that every file of every repo is hashed in one pool). */
typedef struct hm_synth_pending hm_synth_pending;

/* Parse `org/name[@REV]=PRESET[,layers=N][,experts=N][,seed=N][,bad=header|sha]`
 * and build its model; appended to *list. */
int hm_synth_parse(const char *spec, hm_synth_pending **list, shoal_err *err);
/* Find every etag (committed table, cache file, else hash on `jobs`
 * threads and save them in the cache), then register the repos.  cache
 * may be NULL (no cache file).  meter (may be NULL) shows a long hash.
 * Frees the list. */
struct shoal_meter;
int hm_synth_finish(hm_server *s, hm_synth_pending *list, const char *cache, int jobs,
                    struct shoal_meter *meter, shoal_err *err);
void hm_synth_pending_free(hm_synth_pending *list);

typedef struct hm_etag_cache hm_etag_cache;
/* Read path (a missing file is an empty cache). */
int hm_etag_cache_load(const char *path, hm_etag_cache **out, shoal_err *err);
/* 1 and *out if (key, file, size) is cached (with a sha1 if want_sha1). */
int hm_etag_cache_get(const hm_etag_cache *c, const char *key, const char *file, uint64_t size,
                      int want_sha1, synth_digest *out);
int hm_etag_cache_put(hm_etag_cache *c, const char *key, const char *file, uint64_t size,
                      const synth_digest *d);
/* Merge with what the file holds now and rewrite it atomically. */
int hm_etag_cache_save(hm_etag_cache *c, shoal_err *err);
void hm_etag_cache_free(hm_etag_cache *c);

#endif
