/* test_cache.c — the cache library through its public header: layout,
 * write/lookup, identity and names, the lock and read-only handles, partial
 * writes and resume, repair at open, verify, budget and eviction, pins,
 * counters and sessions, and the fetcher's metadata tables. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "tests/unit/cache/cache_testutil.h"

typedef struct fx {
    char dir[256];
    cache *c;
    cache_config cfg;
} fx;

static int fx_setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    tu_tmpdir(f->dir, "unit");
    cache_config_default(&f->cfg);
    f->cfg.max_bytes = 64ull << 20;
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fx *f = *state;
    cache_close(f->c);
    tu_rm_rf(f->dir);
    free(f);
    return 0;
}

static void fx_open(fx *f, cache_open_report *rep)
{
    shoal_err err = { 0, "" };
    cache_close(f->c);
    f->c = NULL;
    int rc = cache_open(f->dir, &f->cfg, &f->c, rep, &err);
    if (rc)
        fail_msg("open: %s", err.msg);
}

static void test_layout_and_roundtrip(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    char p[512];
    struct stat st;
    cache_obj o;

    fx_open(f, NULL);
    snprintf(p, sizeof p, "%s/blobs", f->dir);
    assert_int_equal(stat(p, &st), 0);
    snprintf(p, sizeof p, "%s/tmp", f->dir);
    assert_int_equal(stat(p, &st), 0);
    snprintf(p, sizeof p, "%s/index.db", f->dir);
    assert_int_equal(stat(p, &st), 0);

    /* 3 MiB + 7 in odd chunks, checked byte for byte and by checksum. */
    uint64_t len = (3u << 20) + 7;
    assert_int_equal(tu_write_obj(f->c, "etagA", 4096, len, CACHE_KIND_EXPERT, NULL, 333331, &err), 0);
    assert_int_equal(tu_check_obj(f->c, "etagA", 4096, len), 0);
    /* Same etag, other range: another object. */
    assert_int_equal(cache_lookup(f->c, &(cache_key){ "etagA", 0, len }, NULL, &o, &err), SHOAL_ENOTFOUND);
    assert_int_equal(o.fd, -1);
    assert_int_equal(tu_count_files(f->dir, "tmp"), 0);
    assert_int_equal(tu_count_files(f->dir, "blobs"), 1);

    cache_usage u;
    assert_int_equal(cache_usage_get(f->c, &u, &err), 0);
    assert_int_equal(u.used, len);
    assert_int_equal(u.objects, 1);
    assert_int_equal(u.reserved, 0);

    /* Survives a reopen with nothing to repair. */
    cache_open_report rep;
    fx_open(f, &rep);
    assert_int_equal(rep.objects, 1);
    assert_int_equal(rep.bytes, len);
    assert_int_equal(rep.orphans_removed + rep.rows_missing + rep.rows_bad_size + rep.tmp_removed, 0);
    assert_int_equal(tu_check_obj(f->c, "etagA", 4096, len), 0);
}

static void test_bad_arguments(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_writer *w = NULL;
    uint8_t buf[100] = { 0 };

    fx_open(f, NULL);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "", 0, 10 }, CACHE_KIND_SMALL, NULL, &w, &err),
                     SHOAL_EINVAL);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "x", 0, 0 }, CACHE_KIND_SMALL, NULL, &w, &err),
                     SHOAL_ERANGE);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "x", 0, 10 }, (cache_kind)9, NULL, &w, &err),
                     SHOAL_EINVAL);
    /* Past the length, then a short commit: both refused, nothing left. */
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "x", 0, 50 }, CACHE_KIND_SMALL, NULL, &w, &err), 0);
    assert_int_equal(cache_write_append(w, buf, 51, &err), SHOAL_ERANGE);
    assert_int_equal(cache_write_append(w, buf, 40, &err), 0);
    cache_writer *w2 = NULL;
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "x", 0, 50 }, CACHE_KIND_SMALL, NULL, &w2, &err),
                     SHOAL_EBUSY);
    assert_int_equal(cache_write_commit(w, NULL, &err), SHOAL_ERANGE);
    assert_non_null(strstr(err.msg, "40 of 50"));
    assert_int_equal(tu_count_files(f->dir, "tmp"), 0);
    assert_int_equal(tu_count_files(f->dir, "blobs"), 0);
    cache_usage u;
    cache_usage_get(f->c, &u, &err);
    assert_int_equal(u.reserved, 0);
    assert_int_equal(u.objects, 0);
    /* Abort leaves nothing either. */
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "y", 0, 50 }, CACHE_KIND_SMALL, NULL, &w, &err), 0);
    assert_int_equal(cache_write_append(w, buf, 20, &err), 0);
    cache_write_abort(w);
    cache_write_abort(NULL);
    assert_int_equal(tu_count_files(f->dir, "tmp"), 0);
}

static int count_entries(const cache_entry *e, void *ctx)
{
    int *n = ctx;
    (void)e;
    (*n)++;
    return 0;
}

static void test_identity_and_names(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_names n1 = { "https://hub", "org/m", "main", "c1", "model-1.safetensors", NULL, 3, 7 };
    cache_names n2 = { "https://hub", "org/m", "v2", "c2", "model-1.safetensors", NULL, 3, 7 };

    fx_open(f, NULL);
    assert_int_equal(tu_write_obj(f->c, "sha", 100, 5000, CACHE_KIND_EXPERT, &n1, 4096, &err), 0);
    /* The same bytes under another revision are not stored again. */
    assert_int_equal(tu_write_obj(f->c, "sha", 100, 5000, CACHE_KIND_EXPERT, &n2, 4096, &err), SHOAL_EEXIST);
    assert_int_equal(cache_names_add(f->c, &(cache_key){ "sha", 100, 5000 }, &n2, &err), 0);
    assert_int_equal(tu_count_files(f->dir, "blobs"), 1);

    cache_model m1, m2;
    assert_int_equal(cache_model_get(f->c, "https://hub", "org/m", "main", &m1, &err), 0);
    assert_int_equal(cache_model_get(f->c, "https://hub", "org/m", "v2", &m2, &err), 0);
    assert_string_equal(m1.commit, "c1");
    assert_string_equal(m2.commit, "c2");
    assert_true(m1.id != m2.id);
    int n = 0;
    assert_int_equal(cache_list(f->c, 0, count_entries, &n, &err), 0);
    assert_int_equal(n, 2);
    n = 0;
    assert_int_equal(cache_list(f->c, m2.id, count_entries, &n, &err), 0);
    assert_int_equal(n, 1);
}

static void test_lock_and_readers(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache *second = NULL, *ro = NULL;
    cache_obj o;
    char pid[32];

    fx_open(f, NULL);
    assert_int_equal(tu_write_obj(f->c, "e1", 0, 1000, CACHE_KIND_SMALL, NULL, 100, &err), 0);
    assert_int_equal(cache_open(f->dir, &f->cfg, &second, NULL, &err), SHOAL_ELOCKED);
    assert_null(second);
    snprintf(pid, sizeof pid, "process %ld", (long)getpid());
    assert_non_null(strstr(err.msg, pid));

    cache_config rc = f->cfg;
    rc.read_only = 1;
    assert_int_equal(cache_open(f->dir, &rc, &ro, NULL, &err), 0);
    assert_int_equal(tu_check_obj(ro, "e1", 0, 1000), 0);
    /* The writer goes on while the reader is open; the reader sees it. */
    assert_int_equal(tu_write_obj(f->c, "e2", 0, 2000, CACHE_KIND_SMALL, NULL, 100, &err), 0);
    assert_int_equal(tu_check_obj(ro, "e2", 0, 2000), 0);
    assert_int_equal(cache_lookup(ro, &(cache_key){ "e3", 0, 1 }, NULL, &o, &err), SHOAL_ENOTFOUND);
    cache_writer *w = NULL;
    assert_int_equal(cache_write_begin(ro, &(cache_key){ "e3", 0, 1 }, CACHE_KIND_SMALL, NULL, &w, &err),
                     SHOAL_EINVAL);
    assert_int_equal(cache_verify(ro, 0, &(cache_verify_report){ 0, 0, 0, 0 }, &err), SHOAL_EINVAL);
    cache_usage u;
    assert_int_equal(cache_usage_get(ro, &u, &err), 0);
    assert_int_equal(u.objects, 2);
    assert_int_equal(u.used, 3000);
    cache_close(ro);

    /* After the writer closes, another can open. */
    cache_close(f->c);
    f->c = NULL;
    assert_int_equal(cache_open(f->dir, &f->cfg, &second, NULL, &err), 0);
    cache_close(second);
}

/* The same across processes: a second writer process is refused naming
 * our pid; a reader process works while we write. */
static void test_other_processes(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    int go[2];

    fx_open(f, NULL);
    assert_int_equal(tu_write_obj(f->c, "x0", 0, 5000, CACHE_KIND_SMALL, NULL, 1000, &err), 0);
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cache *w = NULL, *ro = NULL;
        char want[64], b;
        cache_config rc = f->cfg;
        close(go[1]);
        snprintf(want, sizeof want, "process %ld", (long)getppid());
        if (cache_open(f->dir, &f->cfg, &w, NULL, &err) != SHOAL_ELOCKED || !strstr(err.msg, want))
            _exit(10);
        rc.read_only = 1;
        if (cache_open(f->dir, &rc, &ro, NULL, &err) != 0)
            _exit(11);
        if (read(go[0], &b, 1) != 1)   /* the parent starts writing now */
            _exit(12);
        int seen_last = 0;
        for (int i = 0; i < 2000 && !seen_last; i++) {
            if (tu_check_obj(ro, "x0", 0, 5000) != 0)
                _exit(13);
            seen_last = tu_check_obj(ro, "x19", 0, 5000) == 0;
            usleep(1000);
        }
        cache_close(ro);
        _exit(seen_last ? 0 : 14);
    }
    close(go[0]);
    assert_int_equal(write(go[1], "g", 1), 1);
    for (int i = 1; i < 20; i++) {
        char etag[16];
        snprintf(etag, sizeof etag, "x%d", i);
        assert_int_equal(tu_write_obj(f->c, etag, 0, 5000, CACHE_KIND_SMALL, NULL, 1000, &err), 0);
    }
    close(go[1]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_default_budget(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_usage u;
    struct statvfs sv;

    f->cfg.max_bytes = 0;
    f->cfg.free_share = 0.5;
    f->cfg.floor_bytes = 0;
    fx_open(f, NULL);
    assert_int_equal(statvfs(f->dir, &sv), 0);
    double half = 0.5 * (double)sv.f_bavail * (double)sv.f_frsize;
    assert_int_equal(cache_usage_get(f->c, &u, &err), 0);
    assert_true((double)u.budget > half * 0.9 && (double)u.budget < half * 1.1);
    /* A floor larger than the disk leaves no budget: writes are refused. */
    f->cfg.floor_bytes = UINT64_MAX / 4;
    fx_open(f, NULL);
    assert_int_equal(cache_usage_get(f->c, &u, &err), 0);
    assert_int_equal(u.budget, 0);
    assert_int_equal(tu_write_obj(f->c, "b", 0, 10, CACHE_KIND_SMALL, NULL, 10, &err), SHOAL_ENOSPC);
    assert_non_null(strstr(err.msg, "budget"));
}

static void test_partial_resume_in_process(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_writer *w = NULL;
    uint64_t len = 300000;
    uint8_t *buf = malloc(len);

    fx_open(f, NULL);
    tu_fill(buf, len, "p1", 8, 0);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "p1", 8, len }, CACHE_KIND_SPINE, NULL, &w, &err), 0);
    assert_int_equal(cache_writer_offset(w), 0);
    assert_int_equal(cache_write_append(w, buf, 123456, &err), 0);
    assert_int_equal(cache_write_pause(w, &err), 0);
    assert_int_equal(tu_count_files(f->dir, "tmp"), 1);
    cache_usage u;
    cache_usage_get(f->c, &u, &err);
    assert_int_equal(u.reserved, 0);

    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "p1", 8, len }, CACHE_KIND_SPINE, NULL, &w, &err), 0);
    assert_int_equal(cache_writer_offset(w), 123456);
    assert_int_equal(cache_write_append(w, buf + 123456, len - 123456, &err), 0);
    assert_int_equal(cache_write_commit(w, NULL, &err), 0);
    assert_int_equal(tu_check_obj(f->c, "p1", 8, len), 0);
    assert_int_equal(tu_count_files(f->dir, "tmp"), 0);
    free(buf);
    /* The partial row went with the commit: a reopen keeps nothing. */
    cache_open_report rep;
    fx_open(f, &rep);
    assert_int_equal(rep.partials_kept + rep.partials_dropped + rep.tmp_removed, 0);
}

static void test_partial_resume_after_restart(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_writer *w = NULL;
    uint64_t len = 1000000;
    uint8_t *buf = malloc(len);
    cache_open_report rep;

    f->cfg.checkpoint_bytes = 65536;
    fx_open(f, NULL);
    tu_fill(buf, len, "p2", 0, 0);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "p2", 0, len }, CACHE_KIND_EXPERT, NULL, &w, &err), 0);
    /* 200,000 bytes in appends of 10,000: a checkpoint follows the append
     * that crosses each further 64 KiB, so at 70,000 and 140,000; the last
     * 60,000 bytes were never made durable. */
    for (int i = 0; i < 20; i++)
        assert_int_equal(cache_write_append(w, buf + i * 10000, 10000, &err), 0);
    /* Closing with a writer open is like dying: the checkpointed part stays. */
    cache_close(f->c);
    f->c = NULL;
    fx_open(f, &rep);
    assert_int_equal(rep.partials_kept, 1);
    assert_int_equal(rep.tmp_removed, 0);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "p2", 0, len }, CACHE_KIND_EXPERT, NULL, &w, &err), 0);
    assert_int_equal(cache_writer_offset(w), 140000);
    assert_int_equal(cache_write_append(w, buf + 140000, len - 140000, &err), 0);
    assert_int_equal(cache_write_commit(w, NULL, &err), 0);
    assert_int_equal(tu_check_obj(f->c, "p2", 0, len), 0);
    free(buf);

    /* An unusable leftover (a partial row whose file is shorter than its
     * durable length) is dropped and the write starts over. */
    buf = malloc(200000);
    tu_fill(buf, 200000, "p3", 0, 0);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "p3", 0, 200000 }, CACHE_KIND_EXPERT, NULL, &w, &err), 0);
    assert_int_equal(cache_write_append(w, buf, 100000, &err), 0);
    assert_int_equal(cache_write_pause(w, &err), 0);
    cache_close(f->c);
    f->c = NULL;
    char p[512];
    DIR *d;
    struct dirent *de;
    snprintf(p, sizeof p, "%s/tmp", f->dir);
    d = opendir(p);
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] != '.') {
            char q[1024];
            snprintf(q, sizeof q, "%s/%s", p, de->d_name);
            assert_int_equal(truncate(q, 10), 0);
        }
    closedir(d);
    fx_open(f, &rep);
    assert_int_equal(rep.partials_dropped, 1);
    assert_int_equal(rep.tmp_removed, 1);
    assert_int_equal(tu_count_files(f->dir, "tmp"), 0);
    assert_int_equal(cache_write_begin(f->c, &(cache_key){ "p3", 0, 200000 }, CACHE_KIND_EXPERT, NULL, &w, &err), 0);
    assert_int_equal(cache_writer_offset(w), 0);
    cache_write_abort(w);
    free(buf);
}

static void blob_path(const fx *f, uint64_t id, char *out, size_t cap)
{
    snprintf(out, cap, "%s/blobs/%016" PRIx64, f->dir, id);
}

static void test_repair_at_open(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_obj o;
    char p[512];
    uint64_t ids[4];
    cache_open_report rep;

    fx_open(f, NULL);
    for (int i = 0; i < 4; i++) {
        char etag[16];
        snprintf(etag, sizeof etag, "r%d", i);
        assert_int_equal(tu_write_obj(f->c, etag, 0, 10000 + i, CACHE_KIND_EXPERT, NULL, 4096, &err), 0);
        assert_int_equal(cache_lookup(f->c, &(cache_key){ etag, 0, 10000 + i }, NULL, &o, &err), 0);
        ids[i] = o.id;
        close(o.fd);
    }
    cache_close(f->c);
    f->c = NULL;
    /* r0: blob gone.  r1: blob cut short.  An orphan blob, tmp junk. */
    blob_path(f, ids[0], p, sizeof p);
    assert_int_equal(unlink(p), 0);
    blob_path(f, ids[1], p, sizeof p);
    assert_int_equal(truncate(p, 5), 0);
    blob_path(f, 0xabcdef, p, sizeof p);
    FILE *fp = fopen(p, "w");
    fputs("orphan", fp);
    fclose(fp);
    snprintf(p, sizeof p, "%s/blobs/not-a-blob", f->dir);
    fp = fopen(p, "w");
    fclose(fp);
    snprintf(p, sizeof p, "%s/tmp/00000000000000ff.part", f->dir);
    fp = fopen(p, "w");
    fputs("junk", fp);
    fclose(fp);

    fx_open(f, &rep);
    assert_int_equal(rep.rows_missing, 1);
    assert_int_equal(rep.rows_bad_size, 1);
    assert_int_equal(rep.orphans_removed, 2);
    assert_int_equal(rep.tmp_removed, 1);
    assert_int_equal(rep.objects, 2);
    assert_int_equal(rep.bytes, 10002 + 10003);
    assert_int_equal(cache_lookup(f->c, &(cache_key){ "r0", 0, 10000 }, NULL, &o, &err), SHOAL_ENOTFOUND);
    assert_int_equal(cache_lookup(f->c, &(cache_key){ "r1", 0, 10001 }, NULL, &o, &err), SHOAL_ENOTFOUND);
    assert_int_equal(tu_check_obj(f->c, "r2", 0, 10002), 0);
    assert_int_equal(tu_check_obj(f->c, "r3", 0, 10003), 0);
    assert_int_equal(tu_count_files(f->dir, "blobs"), 2);
    assert_int_equal(tu_count_files(f->dir, "tmp"), 0);
    /* The dropped objects can be written again. */
    assert_int_equal(tu_write_obj(f->c, "r0", 0, 10000, CACHE_KIND_EXPERT, NULL, 4096, &err), 0);
    assert_int_equal(tu_check_obj(f->c, "r0", 0, 10000), 0);
    fx_open(f, &rep);
    assert_int_equal(rep.objects, 3);
    assert_int_equal(rep.orphans_removed + rep.rows_missing + rep.rows_bad_size + rep.tmp_removed, 0);
}

static void test_verify_catches_flipped_bytes(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_obj o;
    cache_verify_report vr;
    char p[512];
    int64_t mid;
    cache_names nm = { "h", "org/v", "main", "c", "f", NULL, 0, 1 };

    fx_open(f, NULL);
    assert_int_equal(tu_write_obj(f->c, "v0", 0, 70000, CACHE_KIND_EXPERT, &nm, 4096, &err), 0);
    assert_int_equal(tu_write_obj(f->c, "v1", 0, 70000, CACHE_KIND_EXPERT, NULL, 4096, &err), 0);
    assert_int_equal(cache_verify(f->c, 0, &vr, &err), 0);
    assert_int_equal(vr.checked, 2);
    assert_int_equal(vr.bad, 0);
    assert_int_equal(vr.bytes, 140000);

    assert_int_equal(cache_lookup(f->c, &(cache_key){ "v0", 0, 70000 }, NULL, &o, &err), 0);
    close(o.fd);
    blob_path(f, o.id, p, sizeof p);
    int fd = open(p, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, 12345), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, 12345), 1);
    close(fd);

    /* Verify of the model's objects only catches it. */
    assert_int_equal(cache_model_put(f->c, "h", "org/v", "main", "c", &mid, &err), 0);
    assert_int_equal(cache_verify(f->c, mid, &vr, &err), 0);
    assert_int_equal(vr.checked, 1);
    assert_int_equal(vr.bad, 1);
    assert_int_equal(cache_lookup(f->c, &(cache_key){ "v0", 0, 70000 }, NULL, &o, &err), SHOAL_ENOTFOUND);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(tu_check_obj(f->c, "v1", 0, 70000), 0);
    /* And after a reopen it is still gone. */
    fx_open(f, NULL);
    assert_int_equal(cache_lookup(f->c, &(cache_key){ "v0", 0, 70000 }, NULL, &o, &err), SHOAL_ENOTFOUND);
    assert_int_equal(cache_verify(f->c, 0, &vr, &err), 0);
    assert_int_equal(vr.checked, 1);
    assert_int_equal(vr.bad, 0);
}

static void test_budget_stream_and_pins(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_usage u;
    const uint64_t obj = 65536;
    char etag[32];

    f->cfg.max_bytes = 1u << 20;             /* 16 objects */
    fx_open(f, NULL);
    /* Spine and small files are pinned by kind; one expert by hand. */
    assert_int_equal(tu_write_obj(f->c, "spine", 0, 2 * obj, CACHE_KIND_SPINE, NULL, 8192, &err), 0);
    assert_int_equal(tu_write_obj(f->c, "small", 0, 1000, CACHE_KIND_SMALL, NULL, 8192, &err), 0);
    assert_int_equal(tu_write_obj(f->c, "keep", 0, obj, CACHE_KIND_EXPERT, NULL, 8192, &err), 0);
    assert_int_equal(cache_pin(f->c, &(cache_key){ "keep", 0, obj }, 1, &err), 0);
    assert_int_equal(tu_write_obj(f->c, "hot", 0, obj, CACHE_KIND_EXPERT, NULL, 8192, &err), 0);

    /* 200 objects (12.5 MiB) through a 1 MiB budget. */
    for (int i = 0; i < 200; i++) {
        cache_names nm = CACHE_NAMES_NONE;
        nm.layer = i % 4;
        nm.expert = i;
        snprintf(etag, sizeof etag, "s%d", i);
        assert_int_equal(tu_write_obj(f->c, etag, 0, obj, CACHE_KIND_EXPERT, &nm, 16384, &err), 0);
        assert_int_equal(cache_usage_get(f->c, &u, &err), 0);
        assert_true(u.used <= u.budget);
        assert_int_equal(u.reserved, 0);
        /* The hot object is asked for all the time: frequency keeps it. */
        cache_obj o;
        assert_int_equal(cache_lookup(f->c, &(cache_key){ "hot", 0, obj }, NULL, &o, &err), 0);
        close(o.fd);
    }
    assert_true(u.evicted >= 180);
    assert_int_equal(u.pinned, 3 * obj + 1000);
    assert_int_equal(tu_check_obj(f->c, "spine", 0, 2 * obj), 0);
    assert_int_equal(tu_check_obj(f->c, "small", 0, 1000), 0);
    assert_int_equal(tu_check_obj(f->c, "keep", 0, obj), 0);
    assert_int_equal(tu_check_obj(f->c, "hot", 0, obj), 0);
    /* The newest survived, the oldest did not. */
    assert_int_equal(tu_check_obj(f->c, "s199", 0, obj), 0);
    assert_int_not_equal(tu_check_obj(f->c, "s0", 0, obj), 0);
    assert_int_equal(tu_count_files(f->dir, "blobs"), (int)u.objects);

    /* Too big for the budget, and too big for what is evictable: refused,
     * nothing changed. */
    assert_int_equal(tu_write_obj(f->c, "huge", 0, 2u << 20, CACHE_KIND_EXPERT, NULL, 8192, &err), SHOAL_ENOSPC);
    assert_int_equal(cache_pin(f->c, &(cache_key){ "hot", 0, obj }, 1, &err), 0);
    cache_usage before;
    cache_usage_get(f->c, &before, &err);
    uint64_t evictable = before.used - before.pinned;
    assert_int_equal(tu_write_obj(f->c, "big", 0, (1u << 20) - before.pinned + 1, CACHE_KIND_EXPERT,
                                  NULL, 8192, &err), SHOAL_ENOSPC);
    assert_non_null(strstr(err.msg, "evictable"));
    cache_usage_get(f->c, &u, &err);
    assert_int_equal(u.used, before.used);
    assert_int_equal(u.objects, before.objects);
    assert_true(evictable > 0);
    assert_int_equal(tu_count_files(f->dir, "tmp"), 0);
    /* Pins survive a reopen. */
    fx_open(f, NULL);
    cache_usage_get(f->c, &u, &err);
    assert_int_equal(u.pinned, before.pinned);
    /* A smaller budget at the next open is met at once, pins kept. */
    f->cfg.max_bytes = before.pinned + obj;
    fx_open(f, NULL);
    cache_usage_get(f->c, &u, &err);
    assert_true(u.used <= u.budget);
    assert_int_equal(u.pinned, before.pinned);
    assert_int_equal(tu_check_obj(f->c, "spine", 0, 2 * obj), 0);
}

static void test_eviction_layer_fairness(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    const uint64_t obj = 65536;
    char etag[32];
    cache_obj o;

    f->cfg.max_bytes = 16 * obj;
    fx_open(f, NULL);
    /* Layer 1's experts come first (so they are the oldest); then a long
     * run of layer 0.  Plain LRU would empty layer 1; fairness keeps about
     * half the cache for it. */
    for (int i = 0; i < 8; i++) {
        cache_names nm = CACHE_NAMES_NONE;
        nm.layer = 1;
        nm.expert = i;
        snprintf(etag, sizeof etag, "L1e%d", i);
        assert_int_equal(tu_write_obj(f->c, etag, 0, obj, CACHE_KIND_EXPERT, &nm, 65536, &err), 0);
    }
    for (int i = 0; i < 40; i++) {
        cache_names nm = CACHE_NAMES_NONE;
        nm.layer = 0;
        nm.expert = i;
        snprintf(etag, sizeof etag, "L0e%d", i);
        assert_int_equal(tu_write_obj(f->c, etag, 0, obj, CACHE_KIND_EXPERT, &nm, 65536, &err), 0);
    }
    int l1 = 0;
    for (int i = 0; i < 8; i++) {
        snprintf(etag, sizeof etag, "L1e%d", i);
        if (cache_lookup(f->c, &(cache_key){ etag, 0, obj }, NULL, &o, &err) == 0) {
            l1++;
            close(o.fd);
        }
    }
    assert_true(l1 >= 6);
}

static int sum_rows(const cache_stats_row *r, void *ctx)
{
    cache_counts *t = ctx;
    t->hits += r->counts.hits;
    t->misses += r->counts.misses;
    t->joins += r->counts.joins;
    t->bytes_out += r->counts.bytes_out;
    t->bytes_in += r->counts.bytes_in;
    t->wait_ns += r->counts.wait_ns;
    return 0;
}

typedef struct sess_seen { int n; int64_t pid; char program[64]; uint64_t hits; int64_t ended; } sess_seen;

static int see_session(const cache_stats_row *r, void *ctx)
{
    sess_seen *s = ctx;
    s->n++;
    s->pid = r->pid;
    snprintf(s->program, sizeof s->program, "%s", r->program);
    s->hits += r->counts.hits;
    s->ended = r->ended_ms;
    return 0;
}

typedef struct layer_seen { int n; uint64_t hits[4], misses[4]; } layer_seen;

static int see_layer(const cache_stats_row *r, void *ctx)
{
    layer_seen *s = ctx;
    s->n++;
    if (r->layer >= 0 && r->layer < 4 && r->tier == CACHE_TIER_DISK) {
        s->hits[r->layer] += r->counts.hits;
        s->misses[r->layer] += r->counts.misses;
    }
    return 0;
}

static void test_counters_and_sessions(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache *ro = NULL;
    cache_counts t;
    uint64_t sid;
    int64_t mid;
    cache_obj o;

    f->cfg.flush_events = 1000000;
    f->cfg.flush_ms = 100000;
    fx_open(f, NULL);
    assert_int_equal(cache_model_put(f->c, "h", "org/k", "main", "abc", &mid, &err), 0);
    assert_int_equal(cache_session_open(f->c, 4242, "shoal-engine", &sid, &err), 0);
    assert_int_equal(tu_write_obj(f->c, "c0", 0, 1000, CACHE_KIND_EXPERT, NULL, 1000, &err), 0);

    cache_req rq = { sid, mid, 2, 5, CACHE_TIER_DISK };
    for (int i = 0; i < 10; i++) {
        assert_int_equal(cache_lookup(f->c, &(cache_key){ "c0", 0, 1000 }, &rq, &o, &err), 0);
        close(o.fd);
    }
    rq.layer = 3;
    for (int i = 0; i < 4; i++)
        assert_int_equal(cache_lookup(f->c, &(cache_key){ "nope", 0, 1000 }, &rq, &o, &err), SHOAL_ENOTFOUND);
    cache_stats_add(f->c, &rq, CACHE_JOIN, 0, 1000, 0);
    cache_stats_add(f->c, &rq, CACHE_NONE, 4000, 0, 7000000);
    cache_req ram = { sid, mid, 2, 5, CACHE_TIER_RAM };
    cache_stats_add(f->c, &ram, CACHE_HIT, 0, 0, 0);
    cache_stats_add(f->c, &ram, CACHE_HIT, 0, 0, 0);

    /* Nothing written yet: a reader of the index sees no counters. */
    assert_false(cache_flush_due(f->c));
    cache_config rc = f->cfg;
    rc.read_only = 1;
    assert_int_equal(cache_open(f->dir, &rc, &ro, NULL, &err), 0);
    assert_int_equal(cache_stats_total(ro, -1, &t, &err), 0);
    assert_int_equal(t.hits + t.misses, 0);

    /* The writer's query flushes first. */
    assert_int_equal(cache_stats_total(f->c, CACHE_TIER_DISK, &t, &err), 0);
    assert_int_equal(t.hits, 10);
    assert_int_equal(t.misses, 4);
    assert_int_equal(t.joins, 1);
    assert_int_equal(t.bytes_out, 11000);
    assert_int_equal(t.bytes_in, 4000);
    assert_int_equal(t.wait_ns, 7000000);
    assert_int_equal(cache_stats_total(f->c, CACHE_TIER_RAM, &t, &err), 0);
    assert_int_equal(t.hits, 2);
    assert_int_equal(cache_stats_total(ro, -1, &t, &err), 0);
    assert_int_equal(t.hits, 12);
    assert_true(cache_counts_hit_rate(&t) > 12.0 / 17.5 && cache_counts_hit_rate(&t) < 12.0 / 16.5);

    layer_seen ls;
    memset(&ls, 0, sizeof ls);
    assert_int_equal(cache_stats_query(ro, CACHE_STATS_LAYER, mid, see_layer, &ls, &err), 0);
    assert_int_equal(ls.hits[2], 10);
    assert_int_equal(ls.misses[3], 4);
    memset(&t, 0, sizeof t);
    assert_int_equal(cache_stats_query(ro, CACHE_STATS_EXPERT, mid, sum_rows, &t, &err), 0);
    assert_int_equal(t.hits, 12);
    memset(&t, 0, sizeof t);
    assert_int_equal(cache_stats_query(ro, CACHE_STATS_MODEL, 0, sum_rows, &t, &err), 0);
    assert_int_equal(t.hits, 12);
    assert_int_equal(t.misses, 4);
    memset(&t, 0, sizeof t);
    assert_int_equal(cache_stats_query(ro, CACHE_STATS_MODEL, mid + 100, sum_rows, &t, &err), 0);
    assert_int_equal(t.hits, 0);

    assert_int_equal(cache_session_close(f->c, sid, &err), 0);
    sess_seen ss;
    memset(&ss, 0, sizeof ss);
    assert_int_equal(cache_stats_query(ro, CACHE_STATS_SESSION, 0, see_session, &ss, &err), 0);
    assert_int_equal(ss.pid, 4242);
    assert_string_equal(ss.program, "shoal-engine");
    assert_int_equal(ss.hits, 12);
    assert_true(ss.ended > 0);
    cache_close(ro);

    /* Flushes come due by count and by time. */
    f->cfg.flush_events = 5;
    f->cfg.flush_ms = 50;
    fx_open(f, NULL);
    rq.session = 0;
    for (int i = 0; i < 4; i++)
        cache_stats_add(f->c, &rq, CACHE_MISS, 0, 0, 0);
    assert_false(cache_flush_due(f->c));
    cache_stats_add(f->c, &rq, CACHE_MISS, 0, 0, 0);
    assert_true(cache_flush_due(f->c));
    assert_int_equal(cache_flush(f->c, &err), 0);
    assert_false(cache_flush_due(f->c));
    cache_stats_add(f->c, &rq, CACHE_MISS, 0, 0, 0);
    assert_false(cache_flush_due(f->c));
    struct timespec ts = { 0, 60 * 1000000 };
    nanosleep(&ts, NULL);
    assert_true(cache_flush_due(f->c));
    /* Close flushes what is left. */
    fx_open(f, NULL);
    assert_int_equal(cache_stats_total(f->c, CACHE_TIER_DISK, &t, &err), 0);
    assert_int_equal(t.misses, 4 + 6);
}

static int get_hits(const cache_entry *e, void *ctx)
{
    *(uint64_t *)ctx = e->hits;
    return 0;
}

static void test_access_hits_persist(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_obj o;
    uint64_t hits = 0;

    fx_open(f, NULL);
    assert_int_equal(tu_write_obj(f->c, "a1", 0, 100, CACHE_KIND_EXPERT, NULL, 100, &err), 0);
    for (int i = 0; i < 7; i++) {
        assert_int_equal(cache_lookup(f->c, &(cache_key){ "a1", 0, 100 }, NULL, &o, &err), 0);
        close(o.fd);
    }
    fx_open(f, NULL);
    assert_int_equal(cache_list(f->c, 0, get_hits, &hits, &err), 0);
    assert_int_equal(hits, 7);
}

static void test_models_and_files(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_model m;
    cache_file in, out;
    int64_t id1, id2, id3;

    fx_open(f, NULL);
    assert_int_equal(cache_model_get(f->c, "h", "org/x", "main", &m, &err), SHOAL_ENOTFOUND);
    assert_int_equal(cache_model_put(f->c, "h", "org/x", "main", "c1", &id1, &err), 0);
    struct timespec ts = { 0, 5 * 1000000 };
    nanosleep(&ts, NULL);
    assert_int_equal(cache_model_put(f->c, "h", "org/x", "main", "c2", &id2, &err), 0);
    assert_int_equal(cache_model_put(f->c, "h", "org/x", "main", "c2", &id3, &err), 0);
    assert_int_equal(id2, id3);
    assert_true(id1 != id2);
    assert_int_equal(cache_model_get(f->c, "h", "org/x", "main", &m, &err), 0);
    assert_string_equal(m.commit, "c2");
    assert_int_equal(m.id, id2);
    assert_int_equal(cache_model_put(f->c, "h", NULL, "main", "c2", &id3, &err), SHOAL_EINVAL);

    memset(&in, 0, sizeof in);
    snprintf(in.endpoint, sizeof in.endpoint, "h");
    snprintf(in.repo, sizeof in.repo, "org/x");
    snprintf(in.commit, sizeof in.commit, "c2");
    snprintf(in.path, sizeof in.path, "model-00001-of-000002.safetensors");
    snprintf(in.etag, sizeof in.etag, "e3b0c442");
    in.size = 17547264ull * 900;
    snprintf(in.location, sizeof in.location, "https://cdn/x?Expires=1&Signature=ab");
    in.location_expires_ms = 1234567;
    assert_int_equal(cache_file_put(f->c, &in, &err), 0);
    assert_int_equal(cache_file_get(f->c, "h", "org/x", "c2", in.path, &out, &err), 0);
    assert_string_equal(out.etag, in.etag);
    assert_int_equal(out.size, in.size);
    assert_string_equal(out.location, in.location);
    assert_int_equal(out.location_expires_ms, 1234567);
    assert_true(out.updated_ms > 0);
    /* Replace (a new signed location). */
    snprintf(in.location, sizeof in.location, "https://cdn/y");
    assert_int_equal(cache_file_put(f->c, &in, &err), 0);
    assert_int_equal(cache_file_get(f->c, "h", "org/x", "c2", in.path, &out, &err), 0);
    assert_string_equal(out.location, "https://cdn/y");
    assert_int_equal(cache_file_get(f->c, "h", "org/x", "c1", in.path, &out, &err), SHOAL_ENOTFOUND);
}

static void test_remove(void **state)
{
    fx *f = *state;
    shoal_err err = { 0, "" };
    cache_obj o;

    fx_open(f, NULL);
    assert_int_equal(tu_write_obj(f->c, "d0", 0, 100, CACHE_KIND_SMALL, NULL, 100, &err), 0);
    assert_int_equal(cache_lookup(f->c, &(cache_key){ "d0", 0, 100 }, NULL, &o, &err), 0);
    assert_int_equal(cache_remove(f->c, &(cache_key){ "d0", 0, 100 }, &err), 0);
    /* A descriptor handed out before stays readable (decision 5). */
    uint8_t buf[100], want[100];
    assert_int_equal(pread(o.fd, buf, 100, 0), 100);
    tu_fill(want, 100, "d0", 0, 0);
    assert_memory_equal(buf, want, 100);
    close(o.fd);
    assert_int_equal(cache_remove(f->c, &(cache_key){ "d0", 0, 100 }, &err), SHOAL_ENOTFOUND);
    assert_int_equal(tu_count_files(f->dir, "blobs"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_layout_and_roundtrip, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_identity_and_names, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_lock_and_readers, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_other_processes, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_default_budget, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_partial_resume_in_process, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_partial_resume_after_restart, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_repair_at_open, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_verify_catches_flipped_bytes, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_budget_stream_and_pins, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_eviction_layer_fairness, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_counters_and_sessions, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_access_hits_persist, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_models_and_files, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_remove, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
