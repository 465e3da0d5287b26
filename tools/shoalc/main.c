/* main.c — shoalc: a small test and development client of shoald.
 *
 * Speaks to the daemon only through common/client.h, as an engine does:
 * opens a model, GETs keys (experts "L:E", tensors "t:NAME", files
 * "f:PATH", or N random experts), maps each descriptor, touches every
 * page, optionally compares the bytes with the model directory and the
 * item's XXH3-128 with the bytes (--check, using the manifest the daemon
 * handed over), and prints one line per item
 * and a summary of hits, misses and joins.  Also WARM (with --wait), JOB,
 * STATS, VERIFY, GC, REPORT, PIN, OPEN alone (timed), PUT (either form) and
 * `ping`: STATS every few milliseconds on its own connection, with the
 * answer times' percentiles at the end — how long shoald's loop keeps
 * clients waiting while it does something else.  The CLI users run is
 * `shoal`; this is for tests, the demo and benchmarks.
 */
#include "common/cli.h"
#include "common/client.h"
#include "common/json.h"
#include "common/manifest.h"
#include "common/path.h"
#include "common/platform.h"
#include "common/sys.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

enum {
    OPT_HOME = 1, OPT_SOCKET, OPT_PREFETCH, OPT_WAIT, OPT_CANCEL, OPT_QUIET, OPT_SHALLOW,
    OPT_PROGRESS, OPT_BEGIN, OPT_ABORT, OPT_LEAVE, OPT_BAD_HASH, OPT_INTERVAL, OPT_SECONDS,
    OPT_QUERY, OPT_TIMEOUT, OPT_CHECK, OPT_BATCH, OPT_SEED, OPT_DISCONNECT,
};

static const shoal_cli_opt OPTS[] = {
    { "home", 0, "DIR", OPT_HOME, "shoald's cache directory (its socket: DIR/shoald.sock)" },
    { "socket", 0, "PATH", OPT_SOCKET, "shoald's socket" },
    { "progress", 0, NULL, OPT_PROGRESS, "print each PROGRESS frame (\"progress PHASE DONE/TOTAL\")" },
    { "timeout", 0, "MS", OPT_TIMEOUT, "give up on an answer after MS ms" },
    { "prefetch", 0, NULL, OPT_PREFETCH, "get/random: priority prefetch (default demand)" },
    { "batch", 0, "N", OPT_BATCH, "get/random: keys per GET (default 1024)" },
    { "check", 0, "DIR", OPT_CHECK, "get/random: compare every item with the model directory\n"
                                       "(bytes, and its XXH3-128 with them)" },
    { "quiet", 'q', NULL, OPT_QUIET, "get/random: no line per item, only the summary" },
    { "disconnect-after", 0, "K", OPT_DISCONNECT, "get/random: close the connection after K items" },
    { "cancel", 0, NULL, OPT_CANCEL, "get/random: send CANCEL right after each GET" },
    { "seed", 0, "S", OPT_SEED, "random: the seed (default 1)" },
    { "wait", 0, NULL, OPT_WAIT, "warm: wait for the job to end" },
    { "shallow", 0, NULL, OPT_SHALLOW, "verify: objects only, not whole files" },
    { "begin", 0, NULL, OPT_BEGIN, "put: PUT_BEGIN, write, PUT_COMMIT" },
    { "abort", 0, NULL, OPT_ABORT, "put: PUT_BEGIN then abandon" },
    { "leave-after-begin", 0, NULL, OPT_LEAVE, "put: PUT_BEGIN, half the bytes, exit" },
    { "bad-hash", 0, NULL, OPT_BAD_HASH, "put: announce a hash the bytes do not have" },
    { "interval", 0, "MS", OPT_INTERVAL, "ping: STATS every MS (default 50)" },
    { "seconds", 0, "S", OPT_SECONDS, "ping: stop after S seconds (default: at SIGTERM)" },
    { "query", 0, "JSON", OPT_QUERY, "ping: the STATS query" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec SPEC = {
    .prog = "shoalc",
    .summary = "a test and development client of shoald",
    .synopsis = "shoalc [--home DIR | --socket PATH] [options] COMMAND ...",
    .about = "Speaks to shoald through common/client.h as an engine does.  The CLI users run\n"
             "is shoal(1); this is for tests, the demo and benchmarks.  Commands:\n"
             "  get MODEL KEY...      KEY: L:E (expert), t:NAME (spine tensor), f:PATH (file)\n"
             "  random MODEL N        N random experts (--seed S)\n"
             "  warm MODEL all|spine|layers:A-B|top:N   [--wait]\n"
             "  job ID | stats [MODEL] | verify [MODEL] [--shallow] | gc SIZE | report JSON\n"
             "  pin MODEL KEY... | unpin MODEL KEY...\n"
             "  open MODEL            OPEN alone: prints the time it took\n"
             "  put MODEL NAME FILE   store FILE as a derived object (PUT)\n"
             "  ping                  STATS every --interval MS until SIGTERM or --seconds S;\n"
             "                        prints \"pings N p50_ms A p99_ms B max_ms C\"\n"
             "Summary line of get/random: \"hits H misses M joins J errors E bytes B checked C\".",
    .opts = OPTS,
};

typedef struct run {
    shoal_client *c;
    int prio, wait, cancel, shallow, put_mode, progress, bad_hash;
    long interval_ms, seconds;
    const char *query;
    size_t batch;
    long disconnect_after;
    unsigned long seed;
    shoal_key *keys;
    size_t nkeys;
    shoal_buf out;
    const char   *check_dir;
    manifest     *man;
    int quiet;
    uint64_t hits, misses, joins, errors, bytes, checked, mismatched;
} run;

static int parse_key(const char *s, shoal_key *k)
{
    unsigned long l, e;
    char *end;
    memset(k, 0, sizeof *k);
    if (strncmp(s, "t:", 2) == 0 || strncmp(s, "f:", 2) == 0) {
        k->kind = s[0] == 't' ? SHOAL_KEY_TENSOR : SHOAL_KEY_FILE;
        k->name = s + 2;
        k->name_len = (uint16_t)strlen(s + 2);
        return k->name_len ? 0 : -1;
    }
    l = strtoul(s, &end, 10);
    if (*end != ':')
        return -1;
    e = strtoul(end + 1, &end, 10);
    if (*end || l > UINT16_MAX || e > UINT32_MAX)
        return -1;
    k->kind = SHOAL_KEY_EXPERT;
    k->layer = (uint16_t)l;
    k->expert = (uint32_t)e;
    return 0;
}

/* Where the key's bytes are in the directory: file path and offset. */
static int key_source(const manifest *m, const shoal_key *k, const char **file, uint64_t *off,
                      uint64_t *len)
{
    char name[SHOAL_PROTO_MAX_STR + 1];
    if (k->kind == SHOAL_KEY_EXPERT) {
        const manifest_expert *e = manifest_expert_find(m, k->layer, k->expert);
        if (!e)
            return -1;
        *file = m->files[e->file].path;
        *off = e->offset;
        *len = m->expert_bytes;
        return 0;
    }
    memcpy(name, k->name, k->name_len);
    name[k->name_len] = '\0';
    if (k->kind == SHOAL_KEY_TENSOR) {
        const manifest_tensor *t = manifest_tensor_find(m, name);
        if (!t)
            return -1;
        *file = m->files[t->file].path;
        *off = t->offset;
        *len = t->length;
        return 0;
    }
    {
        long f = manifest_file_find(m, name);
        if (f < 0)
            return -1;
        *file = m->files[f].path;
        *off = 0;
        *len = m->files[f].size;
    }
    return 0;
}

/* Map the item, touch every page, compare with the directory if asked. */
static void key_print(const shoal_key *k, char *out, size_t cap)
{
    if (k->kind == SHOAL_KEY_EXPERT)
        snprintf(out, cap, "%u:%u", k->layer, k->expert);
    else
        snprintf(out, cap, "%c:%.*s", k->kind == SHOAL_KEY_TENSOR ? 't' : 'f', (int)k->name_len,
                 k->name);
}

static void item_use(run *r, const shoal_item *it, const shoal_key *k)
{
    char kname[256];
    static const char *const src[] = { "hit", "miss", "join" };
    const uint8_t *p = NULL;
    volatile uint8_t sink = 0;
    shoal_view view = { 0 };
    int ok = 1;

    key_print(k, kname, sizeof kname);
    if (it->status != 0) {
        r->errors++;
        if (!r->quiet)
            printf("item %u %s error %s (%d)\n", it->index, kname, shoal_err_name(it->status),
                   it->status);
        return;
    }
    if (it->source == SHOAL_SRC_HIT)
        r->hits++;
    else if (it->source == SHOAL_SRC_MISS)
        r->misses++;
    else
        r->joins++;
    r->bytes += it->length;
    if (it->length) {
        if (shoal_item_map(it, 0, &view, NULL) == 0) {
            p = view.data;
        } else {
            r->errors++;
            ok = 0;
        }
    }
    if (p) {
        for (uint64_t i = 0; i < it->length; i += 4096)
            sink ^= p[i];
        (void)sink;
    }
    if (p && r->check_dir && r->man) {
        const char *file;
        uint64_t off, len;
        char path[SHOAL_PATH_MAX];
        uint8_t *want = NULL;
        int fd = -1;
        ok = key_source(r->man, k, &file, &off, &len) == 0 && len == it->length &&
             shoal_path_join(path, sizeof path, r->check_dir, file) == 0 &&
             (want = malloc(len ? len : 1)) != NULL && (fd = open(path, O_RDONLY)) >= 0 &&
             shoal_pread_all(fd, want, len, (off_t)off) == 0 && memcmp(want, p, len) == 0;
        if (ok) {   /* and the checksum the daemon sent is the bytes' (engines check it) */
            XXH128_canonical_t can;
            XXH128_canonicalFromHash(&can, XXH3_128bits(p, (size_t)len));
            ok = memcmp(can.digest, it->xxh128, 16) == 0;
        }
        if (fd >= 0)
            close(fd);
        free(want);
        r->checked++;
        if (!ok)
            r->mismatched++;
    }
    shoal_item_release((shoal_item *)it, &view);
    if (!r->quiet)
        printf("item %u %s %s length %" PRIu64 "%s\n", it->index, kname, src[it->source % 3],
               it->length,
               r->check_dir ? (ok ? " ok" : " MISMATCH") : "");
}

static int open_model(run *r, const char *model, uint32_t *handle, shoal_err *err)
{
    shoal_model_info mi;
    int rc = shoal_client_open(r->c, model, &mi, err);
    if (rc)
        return rc;
    *handle = mi.handle;
    {
        uint8_t *p = malloc(mi.manifest_len ? mi.manifest_len : 1);
        rc = p ? shoal_pread_all(mi.manifest_fd, p, mi.manifest_len, 0) : SHOAL_ENOMEM;
        if (rc == 0)
            rc = manifest_decode(p, mi.manifest_len, &r->man, err);
        free(p);
    }
    close(mi.manifest_fd);
    return rc;
}

static int do_get(run *r, uint32_t handle, const shoal_key *keys, size_t n, shoal_err *err)
{
    size_t batch = r->batch;
    long disconnect_after = r->disconnect_after;
    int prio = r->prio, cancel = r->cancel;
    size_t done = 0;
    long seen = 0;
    while (done < n) {
        size_t b = n - done < batch ? n - done : batch, got = 0;
        uint64_t req;
        int rc = shoal_client_get_send(r->c, handle, prio, keys + done, b, &req, err);
        if (rc)
            return rc;
        if (cancel && (rc = shoal_client_cancel(r->c, req, err)) != 0)
            return rc;
        while (got < b) {
            shoal_item it;
            rc = shoal_client_next(r->c, 60000, &it, err);
            if (rc)
                return rc;
            if (it.index == UINT16_MAX)
                return it.status;
            item_use(r, &it, &keys[done + it.index]);
            got++;
            if (disconnect_after >= 0 && ++seen >= disconnect_after)
                return 1;
        }
        done += b;
    }
    return 0;
}

static int warm_parse(const char *s, int *sel, uint32_t *a, uint32_t *b)
{
    unsigned long x, y;
    char *end;
    *a = *b = 0;
    if (strcmp(s, "all") == 0)
        *sel = SHOAL_WARM_ALL;
    else if (strcmp(s, "spine") == 0)
        *sel = SHOAL_WARM_SPINE;
    else if (strncmp(s, "layers:", 7) == 0) {
        x = strtoul(s + 7, &end, 10);
        if (*end != '-')
            return -1;
        y = strtoul(end + 1, &end, 10);
        if (*end)
            return -1;
        *sel = SHOAL_WARM_LAYERS;
        *a = (uint32_t)x;
        *b = (uint32_t)y;
    } else if (strncmp(s, "top:", 4) == 0) {
        *sel = SHOAL_WARM_TOP;
        *a = (uint32_t)strtoul(s + 4, NULL, 10);
    } else {
        return -1;
    }
    return 0;
}

static int do_warm(run *r, uint32_t handle, const char *what, int wait, shoal_err *err)
{
    int sel, rc;
    uint32_t a, b;
    uint64_t job;
    shoal_job_status st;

    if (warm_parse(what, &sel, &a, &b) != 0)
        return shoal_err_set(err, SHOAL_EINVAL, "warm: cannot read %s", what);
    rc = shoal_client_warm(r->c, handle, sel, a, b, &job, err);
    if (rc)
        return rc;
    printf("job %" PRIu64 "\n", job);
    fflush(stdout);
    while (wait) {
        rc = shoal_client_job(r->c, job, &st, err);
        if (rc)
            return rc;
        if (st.state >= 2) {
            printf("job %" PRIu64 " state %u objects %u/%u bytes %" PRIu64 "/%" PRIu64
                   " errors %u%s%s\n", job, st.state, st.objects_done, st.objects_total,
                   st.bytes_done, st.bytes_total, st.errors, st.last_error[0] ? " last: " : "",
                   st.last_error);
            return st.state == 2 && st.errors == 0 ? 0 : SHOAL_EIO;
        }
        usleep(50000);
    }
    return 0;
}

static void on_progress(const shoal_progress *p, void *ctx)
{
    (void)ctx;
    printf("progress %s %" PRIu64 "/%" PRIu64 "\n", p->phase, p->done, p->total);
    fflush(stdout);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int do_open(run *r, const char *model, shoal_err *err)
{
    double t0 = now_ms();
    uint32_t handle;
    uint64_t spine = 0;
    size_t shards = 0;
    int rc = open_model(r, model, &handle, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < r->man->ntensors; i++)
        spine += r->man->tensors[i].is_spine ? r->man->tensors[i].length : 0;
    for (size_t i = 0; i < r->man->nfiles; i++) {
        size_t n = strlen(r->man->files[i].path);
        shards += n > 12 && strcmp(r->man->files[i].path + n - 12, ".safetensors") == 0;
    }
    printf("opened %s handle %u in %.1f ms: %zu files %zu tensors %zu experts\n", model, handle,
           now_ms() - t0, r->man->nfiles, r->man->ntensors, r->man->nexperts);
    printf("manifest layers %u experts_per_layer %u expert_bytes %" PRIu64 " spine_bytes %" PRIu64
           " shards %zu\n", r->man->n_layers, r->man->experts_per_layer, r->man->expert_bytes,
           spine, shards);
    return 0;
}

/* XXH3-128 (canonical) of [0, len) of fd. */
static int file_xxh(int fd, uint64_t len, uint8_t out[16])
{
    XXH3_state_t *xs = XXH3_createState();
    XXH128_canonical_t can;
    uint8_t *buf = malloc(4u << 20);
    int rc = xs && buf ? 0 : SHOAL_ENOMEM;
    if (rc == 0)
        XXH3_128bits_reset(xs);
    for (uint64_t off = 0; rc == 0 && off < len;) {
        size_t n = len - off < (4u << 20) ? (size_t)(len - off) : (4u << 20);
        rc = shoal_pread_all(fd, buf, n, (off_t)off);
        if (rc == 0)
            XXH3_128bits_update(xs, buf, n);
        off += n;
    }
    if (rc == 0) {
        XXH128_canonicalFromHash(&can, XXH3_128bits_digest(xs));
        memcpy(out, can.digest, 16);
    }
    XXH3_freeState(xs);
    free(buf);
    return rc;
}

/* Copy [0, len) of src into dst (the daemon's file) with copy_file_range,
 * falling back to read and write. */
static int copy_into(int src, int dst, uint64_t len)
{
    uint8_t *buf = NULL;
    uint64_t off = 0;
    int rc = 0;
    while (rc == 0 && off < len) {
        size_t n = len - off < (4u << 20) ? (size_t)(len - off) : (4u << 20);
        off_t in = (off_t)off, out = (off_t)off;
        ssize_t k = buf ? -1 : shoal_copy_range(src, &in, dst, &out, n);
        if (k > 0) {
            off += (uint64_t)k;
            continue;
        }
        if (!buf && !(buf = malloc(4u << 20)))
            return SHOAL_ENOMEM;
        if (shoal_pread_all(src, buf, n, (off_t)off) != 0 ||
            pwrite(dst, buf, n, (off_t)off) != (ssize_t)n)
            rc = SHOAL_EIO;
        off += n;
    }
    free(buf);
    return rc;
}

static int do_put(run *r, const char *model, const char *name, const char *path, shoal_err *err)
{
    uint8_t xxh[16];
    uint32_t handle;
    struct stat st;
    shoal_put p;
    double t0;
    int fd = open(path, O_RDONLY | O_CLOEXEC), rc;

    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0)
            close(fd);
        return shoal_err_set(err, SHOAL_ENOTFOUND, "put: cannot open %s", path);
    }
    rc = open_model(r, model, &handle, err);
    if (rc == 0 && (rc = file_xxh(fd, (uint64_t)st.st_size, xxh)) != 0)
        shoal_err_set(err, rc, "put: reading %s", path);
    if (r->bad_hash)
        xxh[7] ^= 1;   /* a client whose bytes do not match what it announces */
    t0 = now_ms();
    if (rc == 0 && r->put_mode == 0) {
        rc = shoal_client_put(r->c, handle, name, fd, (uint64_t)st.st_size, xxh, err);
    } else if (rc == 0) {
        rc = shoal_client_put_begin(r->c, handle, name, (uint64_t)st.st_size, &p, err);
        if (rc == 0 && r->put_mode == 2) {
            rc = shoal_client_put_abort(r->c, &p, err);
        } else if (rc == 0 && r->put_mode == 3) {
            /* a client that dies mid-PUT: half the bytes, then gone */
            copy_into(fd, p.fd, (uint64_t)st.st_size / 2);
            printf("left after begin\n");
            fflush(stdout);
            _exit(0);
        } else if (rc == 0) {
            rc = copy_into(fd, p.fd, (uint64_t)st.st_size);
            if (rc)
                shoal_err_set(err, rc, "put: writing into the daemon's file");
            rc = rc ? rc : shoal_client_put_commit(r->c, &p, xxh, err);
            if (p.fd >= 0)
                close(p.fd);
        }
    }
    close(fd);
    if (rc == 0)
        printf("put %s %lld bytes in %.1f ms\n", name, (long long)st.st_size, now_ms() - t0);
    return rc;
}

static volatile sig_atomic_t ping_stop;
static void on_term(int sig) { (void)sig; ping_stop = 1; }

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* STATS every interval; the answer times' percentiles at the end. */
static int do_ping(run *r, shoal_err *err)
{
    size_t n = 0, cap = 1024;
    double *t = malloc(cap * sizeof *t), start = now_ms();
    int rc = t ? 0 : SHOAL_ENOMEM;

    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    printf("ping ready\n");
    fflush(stdout);
    while (rc == 0 && !ping_stop && (r->seconds <= 0 || now_ms() - start < r->seconds * 1e3)) {
        double t0 = now_ms(), dt;
        shoal_buf_reset(&r->out);
        rc = shoal_client_stats(r->c, r->query ? r->query : "{}", &r->out, err);
        dt = now_ms() - t0;
        if (n == cap) {
            double *q = realloc(t, (cap *= 2) * sizeof *t);
            if (!q) {
                rc = SHOAL_ENOMEM;
                break;
            }
            t = q;
        }
        t[n++] = dt;
        if (dt < (double)r->interval_ms)
            usleep((useconds_t)(((double)r->interval_ms - dt) * 1e3));
    }
    if (n) {
        qsort(t, n, sizeof *t, dbl_cmp);
        printf("pings %zu p50_ms %.2f p99_ms %.2f max_ms %.2f\n", n, t[n / 2],
               t[n * 99 / 100 < n ? n * 99 / 100 : n - 1], t[n - 1]);
    }
    free(t);
    return rc;
}

static void print_json(const shoal_buf *b)
{
    fwrite(b->data, 1, b->len, stdout);
    putchar('\n');
}

/* Run one command on a connected client. */
static int command(run *r, const char **args, int nargs, shoal_err *err)
{
    uint32_t handle = 0;
    int rc = 0;

    if (r->progress)
        shoal_client_on_progress(r->c, on_progress, NULL);
    if (strcmp(args[0], "open") == 0 && nargs == 2)
        return do_open(r, args[1], err);
    if (strcmp(args[0], "put") == 0 && nargs == 4)
        return do_put(r, args[1], args[2], args[3], err);
    if (strcmp(args[0], "ping") == 0 && nargs == 1)
        return do_ping(r, err);
    if ((strcmp(args[0], "get") == 0 || strcmp(args[0], "random") == 0 ||
         strcmp(args[0], "warm") == 0 || strcmp(args[0], "pin") == 0 ||
         strcmp(args[0], "unpin") == 0) && nargs >= 3) {
        rc = open_model(r, args[1], &handle, err);
        if (rc)
            return rc;
    }
    if ((strcmp(args[0], "get") == 0 || strcmp(args[0], "pin") == 0 ||
         strcmp(args[0], "unpin") == 0) && nargs >= 3) {
        r->keys = calloc((size_t)nargs, sizeof *r->keys);
        for (int i = 2; r->keys && i < nargs; i++)
            if (parse_key(args[i], &r->keys[r->nkeys++]) != 0) {
                rc = shoal_err_set(err, SHOAL_EINVAL, "cannot read key %s", args[i]);
                return rc;
            }
        if (args[0][0] == 'g')
            rc = do_get(r, handle, r->keys, r->nkeys, err);
        else
            rc = shoal_client_pin(r->c, handle, args[0][0] == 'p', r->keys, r->nkeys, err);
    } else if (strcmp(args[0], "random") == 0 && nargs == 3) {
        size_t n = strtoul(args[2], NULL, 10);
        uint64_t s = r->seed * 0x9e3779b97f4a7c15ull + 1;
        r->keys = calloc(n ? n : 1, sizeof *r->keys);
        if (!r->man || r->man->nexperts == 0) {
            rc = shoal_err_set(err, SHOAL_ENOTFOUND, "the model has no experts");
            return rc;
        }
        for (size_t i = 0; r->keys && i < n; i++) {
            const manifest_expert *e;
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            e = &r->man->experts[s % r->man->nexperts];
            r->keys[i] = (shoal_key){ SHOAL_KEY_EXPERT, (uint16_t)e->layer, e->id, NULL, 0 };
        }
        r->nkeys = n;
        rc = r->keys ? do_get(r, handle, r->keys, r->nkeys, err) : SHOAL_ENOMEM;
    } else if (strcmp(args[0], "warm") == 0 && nargs == 3) {
        rc = do_warm(r, handle, args[2], r->wait, err);
    } else if (strcmp(args[0], "job") == 0 && nargs == 2) {
        shoal_job_status st;
        rc = shoal_client_job(r->c, strtoull(args[1], NULL, 10), &st, err);
        if (rc == 0)
            printf("state %u objects %u/%u bytes %" PRIu64 "/%" PRIu64 " errors %u\n", st.state,
                   st.objects_done, st.objects_total, st.bytes_done, st.bytes_total, st.errors);
    } else if (strcmp(args[0], "stats") == 0) {
        char q[SHOAL_PROTO_MAX_STR];
        if (nargs >= 2)
            snprintf(q, sizeof q, "{\"model\":\"%s\"}", args[1]);
        else
            snprintf(q, sizeof q, "{}");
        rc = shoal_client_stats(r->c, q, &r->out, err);
        if (rc == 0)
            print_json(&r->out);
    } else if (strcmp(args[0], "verify") == 0) {
        rc = shoal_client_verify(r->c, nargs >= 2 ? args[1] : "", !r->shallow, &r->out, err);
        if (rc == 0)
            print_json(&r->out);
    } else if (strcmp(args[0], "gc") == 0 && nargs == 2) {
        uint64_t max = 0;
        if (shoal_size_parse(args[1], &max) != 0)
            rc = shoal_err_set(err, SHOAL_EINVAL, "gc: cannot read size %s", args[1]);
        else if ((rc = shoal_client_gc(r->c, max, &r->out, err)) == 0)
            print_json(&r->out);
    } else if (strcmp(args[0], "report") == 0 && nargs == 2) {
        rc = shoal_client_report(r->c, args[1], err);
    } else {
        rc = shoal_cli_usage_error(&SPEC, "no command '%s' with %d argument%s", args[0], nargs - 1,
                                   nargs == 2 ? "" : "s");
    }
    return rc;
}

int main(int argc, char **argv)
{
    shoal_client_opts co = { 0 };
    shoal_err err = { 0 };
    run r = { 0 };
    const char *args[4096], *val;
    int nargs = 0, rc, id;
    long n;
    shoal_cli_parser p;
    char home[SHOAL_PATH_MAX];
    shoal_env env;

    r.batch = SHOAL_PROTO_MAX_KEYS;
    r.disconnect_after = -1;
    r.interval_ms = 50;
    r.seed = 1;
    shoal_buf_init(&r.out, 0);

    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &val)) > 0) {
        switch (id) {
        case OPT_HOME:     co.home = val; break;
        case OPT_SOCKET:   co.socket_path = val; break;
        case OPT_PREFETCH: r.prio = 1; break;
        case OPT_WAIT:     r.wait = 1; break;
        case OPT_CANCEL:   r.cancel = 1; break;
        case OPT_QUIET:    r.quiet = 1; break;
        case OPT_SHALLOW:  r.shallow = 1; break;
        case OPT_PROGRESS: r.progress = 1; break;
        case OPT_BEGIN:    r.put_mode = 1; break;
        case OPT_ABORT:    r.put_mode = 2; break;
        case OPT_LEAVE:    r.put_mode = 3; break;
        case OPT_BAD_HASH: r.bad_hash = 1; break;
        case OPT_QUERY:    r.query = val; break;
        case OPT_CHECK:    r.check_dir = val; break;
        default:
            if (shoal_long_parse(val, id == OPT_DISCONNECT || id == OPT_SEED ? 0 : 1,
                                 id == OPT_BATCH ? SHOAL_PROTO_MAX_KEYS : 2000000000L, &n) != 0)
                return shoal_cli_bad_value(&p, val, id == OPT_BATCH ? "1..1024 keys" : NULL);
            if (id == OPT_INTERVAL)
                r.interval_ms = n;
            else if (id == OPT_SECONDS)
                r.seconds = n;
            else if (id == OPT_TIMEOUT)
                co.call_timeout_ms = (int)n;
            else if (id == OPT_BATCH)
                r.batch = (size_t)n;
            else if (id == OPT_SEED)
                r.seed = (unsigned long)n;
            else
                r.disconnect_after = n;
        }
    }
    if (id < 0)
        return p.exit;
    for (int i = p.optind; i < argc && nargs < (int)(sizeof args / sizeof args[0]); i++)
        args[nargs++] = argv[i];
    if (nargs < 1)
        return shoal_cli_usage_error(&SPEC, "give a COMMAND");
    if (!co.home && !co.socket_path) {
        shoal_env_capture(&env);
        if (shoal_home_resolve(&env, NULL, home, sizeof home, &err) != 0) {
            fprintf(stderr, "shoalc: %s\n", err.msg);
            return 1;
        }
        co.home = home;
    }
    co.name = "shoalc";
    rc = shoal_client_connect(&co, &r.c, &err);
    if (rc) {
        fprintf(stderr, "shoalc: %s\n", err.msg);
        return rc == SHOAL_ENET ? SHOAL_EXIT_NODAEMON : SHOAL_EXIT_FAIL;
    }
    rc = command(&r, args, nargs, &err);
    if (rc == 1)   /* --disconnect-after: leave without waiting */
        rc = 0;
    if (r.nkeys || strcmp(args[0], "random") == 0)
        printf("hits %" PRIu64 " misses %" PRIu64 " joins %" PRIu64 " errors %" PRIu64
               " bytes %" PRIu64 " checked %" PRIu64 " mismatched %" PRIu64 "\n", r.hits,
               r.misses, r.joins, r.errors, r.bytes, r.checked, r.mismatched);
    if (rc < 0)
        fprintf(stderr, "shoalc: %s\n", err.msg[0] ? err.msg : shoal_strerror(rc));
    free(r.keys);
    manifest_free(r.man);
    shoal_buf_free(&r.out);
    shoal_client_close(r.c);
    if (rc == 2)
        return 2;
    return rc < 0 || r.mismatched || (r.errors && r.nkeys) ? 1 : 0;
}
