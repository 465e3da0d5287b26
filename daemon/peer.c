/* peer.c — objects served in place from the Hugging Face cache.
 *
 * Owns: answering a GET key whose file's bytes sit in a blob of an
 * existing huggingface_hub cache that hashed to its etag (fetcher/peer.c
 * verified it when the model was opened): the blob's own descriptor goes
 * to the client with the object's offset in it — no copy in shoald's
 * cache, no byte from upstream — counted as a disk hit.  Also: the
 * XXH3-128 of each such object (GET_ITEM's checksum, which engines check),
 * computed on a worker and remembered; the rule that a blob is served only
 * while its stat is the one it was verified with; and the counters STATS
 * shows ("daemon.hfcache").  Does not own the verification at open, the
 * memo file (fetcher/peer.c) or the miss path (ops.c, sched.c).
 *
 * A GET key of a peer object, on the loop:
 *
 *   1. a hash of the same object in flight: the key joins it (one read
 *      however many ask);
 *   2. its hash remembered (the memo below, for this model, file, range
 *      and the blob's verified stat): the blob is opened and fstat'ed on
 *      the loop — no byte read — and, while its stat is still the
 *      verified one, answered at once;
 *   3. else a job: a worker opens the blob, checks its stat against the
 *      verified one, reads and hashes the range (~10 ms for a 17.5 MB K3
 *      expert from the page cache, 100+ ms cold), checks the stat again,
 *      and the loop answers every key that waits — as a pending request
 *      (work.c): a connection that left meanwhile is answered by nobody,
 *      a key CANCELled meanwhile was answered already and is skipped, and
 *      a GET freed meanwhile (its id may be reused) is told apart by its
 *      serial.
 *
 * A blob whose stat changed since it was verified (in 2 or 3) is never
 * served: the file is dropped from the HF cache for this model's life
 * (fetch_upstream_peer_drop; logged once) and every key waiting for it
 * goes the miss path — fetched from the Hub into the cache, where the
 * file checks of integrity.c cover it.  The next open of the model
 * verifies the blob again (fetcher/peer.c: the memo file is keyed by the
 * stat).  Re-verifying on a worker instead was rejected: a blob that
 * changed is most likely not the Hub's bytes any more, and a K3 shard is
 * ~5 GB of sha256 to learn it.  The stat compared is size, inode, mtime
 * (ns) and ctime (s): a write with the mtime set back by hand still moves
 * the ctime.  What no stat shows (a bit flipped on disk) the engine's
 * checked reads catch: an object it REPORTs damaged drops its blob the
 * same way (peer_damaged).
 *
 * Memory: the memo holds at most PEER_MEMO_MAX entries of 56 bytes
 * (7 MiB) plus 256 KiB of buckets, the oldest replaced first; K3's
 * 82,432 experts + 2,460 spine tensors + its small files fit (4.8 MB
 * used; the array grows by doubling, so it is then at its 7 MiB bound).
 * A key waiting for a hash holds a pending and a peer_ask (~100 bytes),
 * at most DAEMON_CONN_MAX_KEYS per connection.
 */
#include "daemon/daemon_int.h"
#include "common/json.h"
#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"
#include "fetcher/fetch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>
#include "common/xxh3.h"

#define PEER_READ_CHUNK   (4u << 20)
#define PEER_MEMO_MAX     (1u << 17)   /* hashes remembered: 131,072 x 56 B */
#define PEER_MEMO_BUCKETS (1u << 16)
#define PEER_JOB_BUCKETS  1024
#define PEER_CHANGED      1            /* job rc: the blob's stat is not the verified one */

/* One remembered hash (56 bytes). */
typedef struct memo_entry {
    int64_t  model_id;
    uint64_t offset, length;
    uint64_t stamp;                /* of the blob's verified stat */
    uint32_t file;
    uint32_t next;                 /* bucket chain: slot + 1, 0 ends it */
    uint8_t  xxh128[16];
} memo_entry;

/* A GET key waiting for a hash. */
typedef struct peer_ask {
    struct peer_ask *next;
    pending *p;                    /* the connection (NULL once it left), the GET's id */
    uint64_t serial;               /* of the GET (getreq.serial) */
    uint16_t index;
} peer_ask;

/* Hashing one object on a worker. */
typedef struct peer_job {
    work     w;                    /* first */
    struct peer_job *hnext;        /* in flight, by object */
    model   *m;                    /* a reference, for the job's life */
    objref   o;                    /* etag and tensor borrowed from m's manifest */
    char     blob[SHOAL_PATH_MAX];
    fetch_peer_stat want;          /* the blob's stat when it was verified */
    peer_ask *asks;
    /* the worker's */
    int      fd;                   /* the blob, kept for the replies */
    int      rc;                   /* 0, PEER_CHANGED, or a negative code */
    int      transient;            /* rc is shoald's own want (descriptors, memory):
                                      the keys get it, the blob stays in use */
    uint64_t hashed;               /* bytes read */
    uint8_t  xxh128[16];
    char     why[SHOAL_ERR_MSG_MAX];
} peer_job;

struct peer_state {
    memo_entry *e;                 /* slots [0, n) in use */
    uint32_t    n, cap, hand;      /* hand: the next slot replaced once full */
    uint32_t   *buckets;           /* PEER_MEMO_BUCKETS heads: slot + 1 */
    peer_job   *jobs[PEER_JOB_BUCKETS];
    peer_counts counts;
};

/* ---- the memo ---------------------------------------------------------------- */

static struct peer_state *state(shoald *d)
{
    if (!d->peer) {
        struct peer_state *P = calloc(1, sizeof *P);
        if (P && !(P->buckets = calloc(PEER_MEMO_BUCKETS, sizeof *P->buckets))) {
            free(P);
            P = NULL;
        }
        d->peer = P;
    }
    return d->peer;
}

void peer_shutdown(shoald *d)
{
    if (!d->peer)
        return;
    free(d->peer->e);
    free(d->peer->buckets);
    free(d->peer);
    d->peer = NULL;
}

static uint64_t stat_stamp(const fetch_peer_stat *s)
{
    uint64_t v[4] = { s->size, s->ino, (uint64_t)s->mtime_ns, (uint64_t)s->ctime_s };
    return XXH3_64bits(v, sizeof v);
}

/* The blob as verified: size, inode, mtime, and the ctime (which a write
 * moves even when the mtime is set back by hand; POSIX seconds). */
static int stat_is(const struct stat *st, const fetch_peer_stat *want)
{
    return (uint64_t)st->st_size == want->size && (uint64_t)st->st_ino == want->ino
           && shoal_stat_mtime_ns(st) == want->mtime_ns && (int64_t)st->st_ctime == want->ctime_s;
}

static uint64_t obj_hash(int64_t model_id, const objref *o)
{
    uint64_t v[4] = { (uint64_t)model_id, o->file, o->key.offset, o->key.length };
    return XXH3_64bits(v, sizeof v);
}

static memo_entry *memo_find(struct peer_state *P, int64_t model_id, const objref *o,
                             uint64_t stamp)
{
    for (uint32_t s = P->buckets[obj_hash(model_id, o) % PEER_MEMO_BUCKETS]; s; ) {
        memo_entry *e = &P->e[s - 1];
        if (e->model_id == model_id && e->file == o->file && e->offset == o->key.offset
            && e->length == o->key.length && e->stamp == stamp)
            return e;
        s = e->next;
    }
    return NULL;
}

static void memo_unlink(struct peer_state *P, uint32_t slot)
{
    const memo_entry *e = &P->e[slot];
    objref o = { .file = e->file, .key = { .offset = e->offset, .length = e->length } };
    uint32_t *pp = &P->buckets[obj_hash(e->model_id, &o) % PEER_MEMO_BUCKETS];
    while (*pp && *pp != slot + 1)
        pp = &P->e[*pp - 1].next;
    if (*pp)
        *pp = e->next;
}

/* Remember o's hash under stamp (replacing the oldest entry once full). */
static void memo_put(struct peer_state *P, int64_t model_id, const objref *o, uint64_t stamp,
                     const uint8_t xxh128[16])
{
    memo_entry *e = memo_find(P, model_id, o, stamp);
    uint32_t slot, *head;

    if (e) {
        memcpy(e->xxh128, xxh128, 16);
        return;
    }
    if (P->n == P->cap && P->cap < PEER_MEMO_MAX) {
        uint32_t cap = P->cap ? 2 * P->cap : 1024;
        memo_entry *ne = realloc(P->e, (size_t)cap * sizeof *ne);
        if (ne) {
            P->e = ne;
            P->cap = cap;
        }
    }
    if (P->n < P->cap) {
        slot = P->n++;
    } else if (P->n == PEER_MEMO_MAX) {
        slot = P->hand;
        P->hand = (P->hand + 1) % PEER_MEMO_MAX;
        memo_unlink(P, slot);
        P->counts.memo_replaced++;
    } else {
        return;   /* out of memory: it is hashed again next time */
    }
    e = &P->e[slot];
    e->model_id = model_id;
    e->file = o->file;
    e->offset = o->key.offset;
    e->length = o->key.length;
    e->stamp = stamp;
    memcpy(e->xxh128, xxh128, 16);
    head = &P->buckets[obj_hash(model_id, o) % PEER_MEMO_BUCKETS];
    e->next = *head;
    *head = slot + 1;
}

/* ---- jobs in flight ------------------------------------------------------------ */

static peer_job **job_slot(struct peer_state *P, const model *m, const objref *o)
{
    peer_job **pp = &P->jobs[obj_hash(m->model_id, o) % PEER_JOB_BUCKETS];
    while (*pp && !((*pp)->m == m && (*pp)->o.file == o->file
                    && (*pp)->o.key.offset == o->key.offset
                    && (*pp)->o.key.length == o->key.length))
        pp = &(*pp)->hnext;
    return pp;
}

static int ask_add(peer_job *j, conn *c, const getreq *g, uint16_t i)
{
    peer_ask *a = calloc(1, sizeof *a);
    if (!a || !(a->p = pending_new(c, g->id, NULL))) {
        free(a);
        return SHOAL_ENOMEM;
    }
    a->serial = g->serial;
    a->index = i;
    a->next = j->asks;
    j->asks = a;
    return 0;
}

/* ---- the worker ------------------------------------------------------------------ */

/* XXH3-128 of [off, off+len) of fd, canonical (big-endian); stops between
 * chunks when *stop is set (SHOAL_ECANCELED). */
static int range_xxh(int fd, uint64_t off, uint64_t len, uint8_t out[16], const _Atomic int *stop)
{
    XXH3_state_t *h = shoal_xxh3_new();
    uint8_t *buf = malloc(PEER_READ_CHUNK);
    int rc = h && buf ? 0 : SHOAL_ENOMEM;

    if (rc == 0) {
        shoal_xxh3_reset(h);
        for (uint64_t done = 0; rc == 0 && done < len; ) {
            size_t n = len - done < PEER_READ_CHUNK ? (size_t)(len - done) : PEER_READ_CHUNK;
            if (atomic_load(stop)) {
                rc = SHOAL_ECANCELED;
                break;
            }
            rc = shoal_pread_all(fd, buf, n, (off_t)(off + done));
            if (rc == 0)
                shoal_xxh3_update(h, buf, n);
            done += n;
        }
    }
    if (rc == 0) {
        XXH128_canonical_t cn;
        shoal_xxh3_digest(h, cn.digest);
        memcpy(out, cn.digest, 16);
    }
    shoal_xxh3_free(h);
    free(buf);
    return rc;
}

/* Worker: the blob as verified?  Then its range's hash, and the blob still
 * as verified after it (a write meanwhile changes the mtime). */
static void job_run(work *w)
{
    peer_job *j = (peer_job *)w;
    struct stat st;

    j->fd = open(j->blob, O_RDONLY | O_CLOEXEC);
    if (j->fd < 0) {
        j->transient = errno == EMFILE || errno == ENFILE || errno == ENOMEM;
        j->rc = shoal_err_from_errno(errno);
        snprintf(j->why, sizeof j->why, "cannot open it: %s", strerror(errno));
        return;
    }
    if (fstat(j->fd, &st) != 0 || !stat_is(&st, &j->want)) {
        j->rc = PEER_CHANGED;
        snprintf(j->why, sizeof j->why, "it changed since it was verified (size, mtime, ctime or "
                 "inode)");
        return;
    }
    j->rc = range_xxh(j->fd, j->o.key.offset, j->o.key.length, j->xxh128, &w->stop);
    j->transient = j->rc == SHOAL_ENOMEM;
    if (j->rc) {
        snprintf(j->why, sizeof j->why, "cannot read bytes %llu+%llu: %s",
                 (unsigned long long)j->o.key.offset, (unsigned long long)j->o.key.length,
                 shoal_strerror(j->rc));
        return;
    }
    j->hashed = j->o.key.length;
    if (fstat(j->fd, &st) != 0 || !stat_is(&st, &j->want)) {
        j->rc = PEER_CHANGED;
        snprintf(j->why, sizeof j->why, "it changed while it was hashed");
    }
}

/* ---- answering --------------------------------------------------------------------- */

/* Key i of g: the object in the blob fd (taken), its hash xxh128. */
static void answer(conn *c, model *m, getreq *g, uint16_t i, const objref *o, int fd,
                   const uint8_t xxh128[16])
{
    struct peer_state *P = c->d->peer;
    cache_req req = { c->session, m->model_id, o->layer, o->expert, CACHE_TIER_DISK };
    cache_obj obj;

    memset(&obj, 0, sizeof obj);
    obj.fd = fd;
    obj.length = o->key.length;
    obj.kind = o->kind;
    memcpy(obj.xxh128, xxh128, 16);
    cache_stats_add(c->d->cache, &req, CACHE_HIT, 0, o->key.length, 0);
    c->counts.hits++;
    P->counts.objects++;
    P->counts.bytes += o->key.length;
    session_item_send_at(c, g, i, SHOAL_SRC_HIT, &obj, o->key.offset);
}

/* The blob of m's file changed: never read in place again (this model's life). */
static void drop(shoald *d, model *m, uint32_t file, const char *blob, const char *why)
{
    if (upstream_peer_drop(m, file) != 0)
        return;   /* dropped already */
    d->peer->counts.dropped_files++;
    LOG_WARN("peer", "%s: the Hugging Face cache's blob %s of %s: %s; no longer read in place, "
             "its objects are fetched from the Hub", m->spec, blob, m->man->files[file].path, why);
}

/* Loop: answer every key that waited (those still there), then let go. */
static void job_done(work *w)
{
    peer_job *j = (peer_job *)w;
    shoald *d = w->d;
    struct peer_state *P = d->peer;
    peer_ask *a, *next;

    *job_slot(P, j->m, &j->o) = j->hnext;
    P->counts.hashed_bytes += j->hashed;
    P->counts.hashed_objects += j->hashed != 0;
    if (!d->stopping && j->rc == 0)
        memo_put(P, j->m->model_id, &j->o, stat_stamp(&j->want), j->xxh128);
    else if (!d->stopping && j->rc != SHOAL_ECANCELED && !j->transient)
        drop(d, j->m, j->o.file, j->blob, j->why);
    for (a = j->asks; a; a = next) {
        conn *c = a->p->c;
        getreq *g = c && !d->stopping ? session_get_find(c, a->p->id) : NULL;
        next = a->next;
        if (g && g->serial == a->serial && !g->w[a->index].answered) {
            if (j->rc == 0) {
                int fd = next ? dup(j->fd) : j->fd;
                if (!next)
                    j->fd = -1;
                if (fd >= 0)
                    answer(c, j->m, g, a->index, &j->o, fd, j->xxh128);
                else
                    session_item_send(c, g, a->index, shoal_err_from_errno(errno),
                                      SHOAL_SRC_HIT, NULL);
            } else if (j->transient) {
                session_item_send(c, g, a->index, j->rc, SHOAL_SRC_HIT, NULL);
            } else {
                ops_get_fetch(c, j->m, g, a->index, &j->o);   /* from the Hub */
            }
        }
        pending_end(d, a->p);
        free(a);
    }
    if (j->fd >= 0)
        close(j->fd);
    model_release(d, j->m);
    free(j);
}

void peer_damaged(shoald *d, model *m, const objref *o)
{
    char blob[SHOAL_PATH_MAX];
    if (m->local || upstream_peer_blob(m, o->file, blob, sizeof blob, NULL) != 0)
        return;
    if (state(d))
        drop(d, m, o->file, blob, "a client read bytes of it that do not match their checksum");
    else
        upstream_peer_drop(m, o->file);
}

/* ---- GET ------------------------------------------------------------------------------ */

int peer_has(const model *m, const objref *o)
{
    char blob[SHOAL_PATH_MAX];
    return !m->local && upstream_peer_blob(m, o->file, blob, sizeof blob, NULL) == 0;
}

int peer_serve(conn *c, model *m, getreq *g, uint16_t i, const objref *o)
{
    shoald *d = c->d;
    char blob[SHOAL_PATH_MAX];
    fetch_peer_stat want;
    struct peer_state *P;
    memo_entry *e;
    peer_job **pp, *j;

    if (m->local || upstream_peer_blob(m, o->file, blob, sizeof blob, &want) != 0
        || !(P = state(d)))
        return 0;
    pp = job_slot(P, m, o);
    if (*pp) {                                   /* 1: a hash in flight */
        if (ask_add(*pp, c, g, i) != 0)
            session_item_send(c, g, i, SHOAL_ENOMEM, SHOAL_SRC_HIT, NULL);
        else
            P->counts.joins++;
        return 1;
    }
    if ((e = memo_find(P, m->model_id, o, stat_stamp(&want)))) {   /* 2: remembered */
        struct stat st;
        int fd = open(blob, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && fstat(fd, &st) == 0 && stat_is(&st, &want)) {
            P->counts.memo_hits++;
            answer(c, m, g, i, o, fd, e->xxh128);
            return 1;
        }
        if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM)) {
            session_item_send(c, g, i, shoal_err_from_errno(errno), SHOAL_SRC_HIT, NULL);
            return 1;   /* shoald's own want: the blob stays in use */
        }
        drop(d, m, o->file, blob, fd < 0 ? strerror(errno)
                                         : "it changed since it was verified (size, mtime, ctime "
                                           "or inode)");
        if (fd >= 0)
            close(fd);
        return 0;
    }
    j = calloc(1, sizeof *j);                    /* 3: hash it on a worker */
    if (!j || strlen(blob) >= sizeof j->blob || ask_add(j, c, g, i) != 0) {
        free(j);
        return 0;   /* fetched instead */
    }
    j->w.run = job_run;
    j->w.done = job_done;
    j->m = m;
    m->refs++;
    j->o = *o;
    memcpy(j->blob, blob, strlen(blob) + 1);
    j->want = want;
    j->fd = -1;
    j->hnext = NULL;
    *pp = j;
    P->counts.jobs++;
    work_post(d, &j->w);
    return 1;
}

/* ---- STATS ------------------------------------------------------------------------------ */

void peer_get(const shoald *d, peer_counts *out)
{
    memset(out, 0, sizeof *out);
    if (!d->peer)
        return;
    *out = d->peer->counts;
    out->memo_entries = d->peer->n;
    out->memo_bytes = (uint64_t)d->peer->cap * sizeof(memo_entry)
                      + (uint64_t)PEER_MEMO_BUCKETS * sizeof *d->peer->buckets;
    for (unsigned b = 0; b < PEER_JOB_BUCKETS; b++)
        for (const peer_job *j = d->peer->jobs[b]; j; j = j->hnext)
            out->hashing++;
}

void *peer_json(const shoald *d)
{
    peer_counts n;
    shoal_json *o = shoal_json_object();
    if (!o)
        return NULL;
    peer_get(d, &n);
    shoal_json_set_int(o, "objects_served", (int64_t)n.objects);
    shoal_json_set_int(o, "bytes_served", (int64_t)n.bytes);
    shoal_json_set_int(o, "hash_jobs", (int64_t)n.jobs);
    shoal_json_set_int(o, "hashed_objects", (int64_t)n.hashed_objects);
    shoal_json_set_int(o, "hashed_bytes", (int64_t)n.hashed_bytes);
    shoal_json_set_int(o, "joins", (int64_t)n.joins);
    shoal_json_set_int(o, "memo_hits", (int64_t)n.memo_hits);
    shoal_json_set_int(o, "memo_entries", (int64_t)n.memo_entries);
    shoal_json_set_int(o, "memo_bytes", (int64_t)n.memo_bytes);
    shoal_json_set_int(o, "memo_replaced", (int64_t)n.memo_replaced);
    shoal_json_set_int(o, "hashing", (int64_t)n.hashing);
    shoal_json_set_int(o, "files_dropped", (int64_t)n.dropped_files);
    return o;
}
