/* hub.h — a blocking Hugging Face Hub client: resolve a file, GET byte ranges.
 *
 * Owns: upstream specs (hf://org/name[@revision]), resolve URLs and their
 * percent-encoding (specs/hf-hub.md §1), the HEAD that resolves a file to
 * {commit, etag, size, location} with the 302 handled by hand (§2), strict
 * range and whole-file GETs, mapping Hub errors (X-Error-Code) to shoal codes
 * with messages that say what to do, and the rule that the token goes to the
 * Hub's origin (scheme, host and port) and nowhere else.
 * Does not own: retries and backoff, resume, re-resolving an expired CDN
 * location (fetcher/fetch.h adds them: its metadata reads retry around this
 * client, its transfers run on libcurl multi), nor reading the token or
 * endpoint from the environment (the program does).  Header parsing, the
 * 206 check and error mapping are shared with the transfers (http_int.h).
 *
 * Every call is blocking and uses the client's one libcurl handle, so
 * connections are kept alive between calls.  A client is not thread-safe;
 * use one per thread.  No libcurl type appears here.
 */
#ifndef SHOAL_FETCHER_HUB_H
#define SHOAL_FETCHER_HUB_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define HUB_REPO_MAX 256
#define HUB_REV_MAX  256
#define HUB_ETAG_MAX 130
#define HUB_URL_MAX  4096
#define HUB_DEFAULT_ENDPOINT "https://huggingface.co"

/* A parsed upstream spec. */
typedef struct hub_spec {
    char repo[HUB_REPO_MAX];      /* "org/name" */
    char revision[HUB_REV_MAX];   /* "main", a branch, "refs/pr/1" or a commit */
} hub_spec;

/* Parse "hf://org/name" or "hf://org/name@revision" (revision may contain
 * '/', e.g. refs/pr/1; default "main").  0 or SHOAL_EINVAL (message says
 * what is wrong); *out is unchanged on failure. */
int hub_spec_parse(const char *text, hub_spec *out, shoal_err *err);

/* "{endpoint}/{repo}/resolve/{revision}/{file}" with the revision encoded
 * entirely (refs/pr/1 -> refs%2Fpr%2F1) and the file encoded except '/'.
 * A trailing '/' of endpoint is dropped.  0 or SHOAL_ETOOBIG. */
int hub_url_resolve(const char *endpoint, const char *repo, const char *revision,
                    const char *file, char *out, size_t cap);

/* 1 if both absolute URLs have the same scheme, host and port (default
 * ports filled in), else 0 (also when either does not parse). */
int hub_url_same_origin(const char *a, const char *b);

typedef struct hub_options {
    const char *endpoint;          /* NULL: HUB_DEFAULT_ENDPOINT */
    const char *token;             /* NULL or "": anonymous */
    long        connect_timeout_ms;/* 0: 10000 */
    long        stall_secs;        /* give up when no byte arrives for this
                                      long (0: 30) */
    const _Atomic int *stop;       /* when *stop becomes nonzero, a request in
                                      flight is abandoned within ~1 s:
                                      SHOAL_ECANCELED (NULL: never) */
} hub_options;

typedef struct hub_client hub_client;

/* New client; copies what it needs from opt.  Caller frees. */
int hub_client_new(const hub_options *opt, hub_client **out, shoal_err *err);
void hub_client_free(hub_client *c);

/* What a resolve found. */
typedef struct hub_file {
    char     commit[41];            /* X-Repo-Commit */
    char     etag[HUB_ETAG_MAX];    /* sha256 (LFS) or git sha1, no quotes */
    uint64_t size;
    int      is_lfs;                /* 1: location is the CDN URL of a 302 */
    char     location[HUB_URL_MAX]; /* where to GET the bytes: the CDN URL, or
                                       the resolve URL at the commit (or the
                                       resolve-cache URL) for small files */
} hub_file;

/* HEAD the file's resolve URL without following absolute redirects
 * (relative ones are followed, query kept).  Errors: SHOAL_ENOTFOUND (repo,
 * revision or file, named), SHOAL_EAUTH (gated or bad token: what to do),
 * SHOAL_EBUSY (429/503), SHOAL_ENET / SHOAL_ETIMEOUT (transport),
 * SHOAL_EPROTO (missing or malformed X-Repo-Commit, etag or size).
 * *out is filled only on success. */
int hub_file_resolve(hub_client *c, const hub_spec *spec, const char *file, hub_file *out,
                     shoal_err *err);

/* GET bytes [first, last] (inclusive) of a resolved file into dst (last -
 * first + 1 bytes) or write them to fd at its current position.  Sends
 * Range: bytes=first-last and accepts only a 206 whose Content-Range is
 * exactly "bytes first-last/size" with exactly last-first+1 body bytes.
 * Anything else (a 200 that ignored the Range, another range or total, a
 * short or long body) is an error: SHOAL_EPROTO, SHOAL_ERANGE (416 or a
 * range past the size), SHOAL_EAUTH (the CDN refused the signed URL: it may
 * have expired, resolve again), SHOAL_EBUSY, SHOAL_ENET, SHOAL_ETIMEOUT.
 * On error nothing is kept: dst's contents are unspecified; a regular file
 * behind fd is truncated back to where it started (a pipe cannot be). */
int hub_range_read(hub_client *c, const hub_file *f, uint64_t first, uint64_t last, void *dst,
                   shoal_err *err);
int hub_range_write(hub_client *c, const hub_file *f, uint64_t first, uint64_t last, int fd,
                    shoal_err *err);

/* The whole file into dst (f->size bytes) or to fd: a plain GET checked
 * against the size for small files, a checked range 0..size-1 for LFS
 * files.  Errors as above. */
int hub_file_read(hub_client *c, const hub_file *f, void *dst, shoal_err *err);
int hub_file_write(hub_client *c, const hub_file *f, int fd, shoal_err *err);

/* The last HTTP answer: status (0 if none) and the server's wait hint in
 * seconds from RateLimit t= or Retry-After (-1 if none), for the caller's
 * retry policy. */
int hub_client_last_status(const hub_client *c);
long hub_client_retry_after(const hub_client *c);

#endif
