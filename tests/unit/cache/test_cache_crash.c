/* test_cache_crash.c — SIGKILL at random moments.
 *
 * A forked child writes objects in a loop (random sizes and chunkings,
 * pauses and resumes, removals, evictions under a small budget, counter
 * flushes) until the parent kills it with SIGKILL after a random delay.
 * After every kill the parent reopens the cache (which repairs it) and
 * checks that every object the index knows has a blob of the right size
 * whose checksum verifies and whose bytes are the ones written, that no
 * blob lacks a row, and that tmp/ holds only resumable partials.
 * 40 rounds, a few seconds in all.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "common/log.h"
#include "common/platform.h"
#include "tests/unit/cache/cache_testutil.h"

#define ROUNDS 40

static uint64_t rng_state;

static uint64_t rnd(void)
{
    rng_state = tu_mix(rng_state);
    return rng_state;
}

static void child_config(cache_config *cfg)
{
    cache_config_default(cfg);
    cfg->max_bytes = 8u << 20;
    cfg->checkpoint_bytes = 64u << 10;
    cfg->flush_events = 16;
}

/* The writer child: never returns. */
static void child(const char *dir, int round, int report_fd)
{
    cache_config cfg;
    cache *c = NULL;
    shoal_err err = { 0, "" };
    uint8_t *buf = malloc(1 << 17);
    struct { char etag[48]; uint64_t off, len; } recent[64];
    size_t nrecent = 0;

    child_config(&cfg);
    for (int tries = 0; cache_open(dir, &cfg, &c, NULL, &err) != 0; tries++) {
        if (tries > 200)
            _exit(3);
        usleep(10000);   /* the previous child's lock goes with its death */
    }
    rng_state = (uint64_t)round * 7919u + 1;
    for (;;) {
        char etag[48];
        cache_writer *w = NULL;
        /* Keys come from a small space shared by all rounds, so a later
         * round finds the partial writes an earlier one was killed in and
         * resumes them (or finds the object cached and moves on). */
        uint64_t j = rnd() % 300;
        uint64_t len = 1 + tu_mix(j + 12345) % 400000, off = tu_mix(j) % 1000000;
        cache_names nm = CACHE_NAMES_NONE;
        nm.layer = (int32_t)(j % 5);
        nm.expert = (int32_t)j;
        snprintf(etag, sizeof etag, "k%llu", (unsigned long long)j);
        if (cache_write_begin(c, &(cache_key){ etag, off, len }, CACHE_KIND_EXPERT, &nm, &w, &err) != 0)
            continue;
        if (cache_writer_offset(w) > 0) {
            char b = 'r';   /* tell the parent: a killed write was resumed */
            if (write(report_fd, &b, 1) != 1)
                _exit(8);
        }
        int pause_at = rnd() % 4 == 0 ? (int)(rnd() % len) : -1;
        for (uint64_t at = cache_writer_offset(w); at < len;) {
            size_t n = 1 + rnd() % (1 << 17);
            if (n > len - at)
                n = len - at;
            tu_fill(buf, n, etag, off, at);
            if (cache_write_append(w, buf, n, &err) != 0)
                _exit(4);
            at += n;
            if (pause_at >= 0 && at >= (uint64_t)pause_at && at < len) {
                /* Pause and resume: the resumed writer says where it is. */
                if (cache_write_pause(w, &err) != 0 ||
                    cache_write_begin(c, &(cache_key){ etag, off, len }, CACHE_KIND_EXPERT, &nm, &w, &err) != 0 ||
                    cache_writer_offset(w) != at)
                    _exit(5);
                pause_at = -1;
            }
        }
        if (cache_write_commit(w, NULL, &err) != 0)
            _exit(6);
        cache_req rq = { 0, 0, nm.layer, nm.expert, CACHE_TIER_DISK };
        cache_obj o;
        if (cache_lookup(c, &(cache_key){ etag, off, len }, &rq, &o, &err) != 0)
            _exit(7);
        close(o.fd);
        memcpy(recent[nrecent % 64].etag, etag, sizeof etag);
        recent[nrecent % 64].off = off;
        recent[nrecent % 64].len = len;
        nrecent++;
        if (rnd() % 8 == 0) {
            size_t k = (size_t)(rnd() % (nrecent < 64 ? nrecent : 64));
            /* May be evicted already: SHOAL_ENOTFOUND is fine. */
            cache_remove(c, &(cache_key){ recent[k].etag, recent[k].off, recent[k].len }, NULL);
        }
        if (cache_flush_due(c))
            cache_flush(c, NULL);
    }
}

typedef struct seen {
    uint64_t *ids;
    char    **etags;
    uint64_t *offs, *lens;
    size_t    n, cap;
} seen;

static int collect(const cache_entry *e, void *ctx)
{
    seen *s = ctx;
    for (size_t i = 0; i < s->n; i++)
        if (s->ids[i] == e->id)
            return 0;
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->ids = realloc(s->ids, s->cap * sizeof *s->ids);
        s->etags = realloc(s->etags, s->cap * sizeof *s->etags);
        s->offs = realloc(s->offs, s->cap * sizeof *s->offs);
        s->lens = realloc(s->lens, s->cap * sizeof *s->lens);
    }
    s->ids[s->n] = e->id;
    s->etags[s->n] = strdup(e->etag);
    s->offs[s->n] = e->offset;
    s->lens[s->n] = e->length;
    s->n++;
    return 0;
}

static void test_sigkill_loop(void **state)
{
    char dir[256];
    uint64_t total_objects = 0, kept_partials = 0, repaired = 0, resumed = 0;
    int pfd[2];
    (void)state;

    assert_int_equal(shoal_pipe(pfd, SHOAL_FD_NONBLOCK), 0);

    shoal_log_set_level(SHOAL_LOG_ERROR);
    tu_tmpdir(dir, "crash");
    rng_state = (uint64_t)time(NULL);
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t delay_us = 20000 + rnd() % 180000;
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            child(dir, round, pfd[1]);
        usleep((useconds_t)delay_us);
        kill(pid, SIGKILL);
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        char drain[256];
        ssize_t k;
        while ((k = read(pfd[0], drain, sizeof drain)) > 0)
            resumed += (uint64_t)k;
        if (!WIFSIGNALED(st))
            fail_msg("round %d: the writer exited by itself (status %d)", round, WEXITSTATUS(st));

        cache_config cfg;
        cache *c = NULL;
        cache_open_report rep;
        shoal_err err = { 0, "" };
        seen s;
        memset(&s, 0, sizeof s);
        child_config(&cfg);
        assert_int_equal(cache_open(dir, &cfg, &c, &rep, &err), 0);
        assert_int_equal(cache_list(c, 0, collect, &s, &err), 0);
        assert_int_equal(s.n, rep.objects);
        for (size_t i = 0; i < s.n; i++) {
            int bad = tu_check_obj(c, s.etags[i], s.offs[i], s.lens[i]);
            if (bad)
                fail_msg("round %d: object %s is bad (%d)", round, s.etags[i], bad);
            free(s.etags[i]);
        }
        /* No blob without a row, no tmp file without a partial. */
        assert_int_equal(tu_count_files(dir, "blobs"), (int)s.n);
        assert_int_equal(tu_count_files(dir, "tmp"), (int)rep.partials_kept);
        cache_usage u;
        assert_int_equal(cache_usage_get(c, &u, &err), 0);
        assert_true(u.used <= u.budget);
        total_objects += s.n;
        kept_partials += rep.partials_kept;
        repaired += rep.tmp_removed + rep.orphans_removed;
        free(s.ids);
        free(s.etags);
        free(s.offs);
        free(s.lens);
        cache_close(c);
    }
    print_message("%d rounds: %llu objects checked, %llu partials kept, %llu resumed, "
                  "%llu leftovers repaired\n", ROUNDS, (unsigned long long)total_objects,
                  (unsigned long long)kept_partials, (unsigned long long)resumed,
                  (unsigned long long)repaired);
    /* The loop must have done real work for the checks to mean anything. */
    assert_true(total_objects >= ROUNDS);
    assert_true(resumed > 0);
    close(pfd[0]);
    close(pfd[1]);
    tu_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
