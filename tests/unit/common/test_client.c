/* test_client.c — the shoald client library against a scripted daemon on
 * a real Unix socket: HELLO, OPEN with a manifest descriptor, GET items
 * out of order with descriptors and per-key errors, a control call while
 * items are pending, ERROR replies, a daemon that dies mid-call, the
 * message when no daemon runs, PROGRESS frames that keep a long call alive
 * past its timeout, and PUT_BEGIN / PUT_COMMIT. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/client.h"

typedef struct fake {
    char dir[40], path[100];
    int listener;
    int mode;          /* 0: well-behaved; 1: die after HELLO */
    pthread_t th;
    int put_file;      /* PUT_BEGIN's file, read at PUT_COMMIT */
} fake;

#include <time.h>

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

static int blob_with(const char *text)
{
    char p[] = "/tmp/shoal-client-blob-XXXXXX";
    int fd = mkstemp(p);
    unlink(p);
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        abort();
    return fd;
}

static void reply(int s, shoal_msg_builder *m, int fd)
{
    if (shoal_msg_end(m) || shoal_msg_send(s, m->buf.data, m->buf.len, fd))
        abort();
}

static void send_item(int s, shoal_msg_builder *m, uint64_t id, uint16_t idx, int status,
                      const char *content, int last)
{
    int fd = status == 0 ? blob_with(content) : -1;
    uint8_t sum[16] = { (uint8_t)idx };
    shoal_msg_begin(m, SHOAL_MSG_GET_ITEM, (uint16_t)((fd >= 0 ? SHOAL_MSG_F_FD : 0) |
                                                      (last ? SHOAL_MSG_F_LAST : 0)), id);
    shoal_msg_put_u16(m, idx);
    shoal_msg_put_i32(m, status);
    shoal_msg_put_u8(m, idx == 0 ? SHOAL_SRC_MISS : SHOAL_SRC_HIT);
    shoal_msg_put_u64(m, 0);
    shoal_msg_put_u64(m, content ? strlen(content) : 0);
    shoal_msg_put_bytes(m, sum, 16);
    reply(s, m, fd);
    if (fd >= 0)
        close(fd);
}

/* The version-2 requests of the script: a VERIFY that takes 1.2 s with
 * PROGRESS on the way, PUT_BEGIN and PUT_COMMIT.  1 when h was one. */
static int fake_v2(fake *f, int s, shoal_msg_builder *m, const shoal_msg_header *h,
                   shoal_msg_reader *r)
{
    if (h->type == SHOAL_MSG_VERIFY) {
        /* eight PROGRESS frames 150 ms apart, then the answer: 1.2 s after
         * a request whose client waits 400 ms */
        for (uint64_t i = 1; i <= 8; i++) {
            sleep_ms(150);
            shoal_msg_begin(m, SHOAL_MSG_PROGRESS, 0, h->id);
            shoal_msg_put_u64(m, i);
            shoal_msg_put_u64(m, 8);
            shoal_msg_put_str(m, "verify", 6);
            reply(s, m, -1);
        }
        shoal_msg_begin(m, SHOAL_MSG_JSON, SHOAL_MSG_F_LAST, h->id);
        shoal_msg_put_str32(m, "{}", 2);
        reply(s, m, -1);
        return 1;
    }
    if (h->type == SHOAL_MSG_PUT_BEGIN) {
        char p[] = "/tmp/shoal-client-put-XXXXXX";
        uint64_t len;
        shoal_rd_u32(r);
        shoal_rd_str(r, &(size_t){ 0 });
        len = shoal_rd_u64(r);
        if (f->put_file >= 0)
            close(f->put_file);
        f->put_file = mkstemp(p);
        unlink(p);
        shoal_msg_begin(m, SHOAL_MSG_PUT_READY, SHOAL_MSG_F_FD | SHOAL_MSG_F_LAST, h->id);
        shoal_msg_put_u64(m, 9);
        shoal_msg_put_u64(m, len);
        reply(s, m, f->put_file);
        return 1;
    }
    if (h->type == SHOAL_MSG_PUT_COMMIT) {
        /* OK when the client wrote "zero-copy!" into PUT_BEGIN's file and
         * commits put 9 with the hash it announced; abandon is OK too */
        uint64_t id = shoal_rd_u64(r);
        uint8_t keep = shoal_rd_u8(r);
        const uint8_t *x = shoal_rd_bytes(r, 16);
        char content[16] = { 0 };
        int ok = shoal_rd_finish(r) == 0 && id == 9 &&
                 (keep == 0 || (x[0] == 0x5a && pread(f->put_file, content, 10, 0) == 10 &&
                                strcmp(content, "zero-copy!") == 0));
        shoal_msg_begin(m, ok ? SHOAL_MSG_OK : SHOAL_MSG_ERROR, SHOAL_MSG_F_LAST, h->id);
        if (!ok) {
            shoal_msg_put_i32(m, SHOAL_ECORRUPT);
            shoal_msg_put_str(m, "bad commit", 10);
        }
        reply(s, m, -1);
        return 1;
    }
    return 0;
}

/* OPEN_OK4 of model handle 3 (an unreachable upstream), its manifest attached. */
static void fake_open_ok(int s, shoal_msg_builder *m, uint64_t id)
{
    int mf = blob_with("{\"manifest\":1}");
    shoal_msg_begin(m, SHOAL_MSG_OPEN_OK4, SHOAL_MSG_F_FD | SHOAL_MSG_F_LAST, id);
    shoal_msg_put_u32(m, 3);
    shoal_msg_put_str(m, "abc123", 6);
    shoal_msg_put_u64(m, 14);
    shoal_msg_put_u16(m, 8);
    shoal_msg_put_u32(m, 64);
    shoal_msg_put_u64(m, 13056);
    shoal_msg_put_u8(m, SHOAL_UPSTREAM_UNREACHABLE);
    reply(s, m, mf);
    close(mf);
}

/* Serves one connection following a fixed script. */
static void *fake_main(void *arg)
{
    fake *f = arg;
    int s = accept(f->listener, NULL, NULL);
    shoal_msg_builder m = { 0 };
    shoal_buf body;
    shoal_msg_header h;
    uint64_t get_id = 0;
    int fd;

    shoal_buf_init(&body, 0);
    while (shoal_msg_recv(s, &h, &body, &fd, 5000, NULL) == 0) {
        shoal_msg_reader r;
        shoal_rd_init(&r, body.data, body.len);
        if (fake_v2(f, s, &m, &h, &r))
            goto next;
        switch (h.type) {
        case SHOAL_MSG_HELLO:
            shoal_msg_begin(&m, SHOAL_MSG_HELLO_OK, 0, h.id);
            shoal_msg_put_u16(&m, SHOAL_PROTO_VERSION);
            shoal_msg_put_str(&m, "test-1", 6);
            shoal_msg_put_u64(&m, 77);
            shoal_msg_put_u32(&m, SHOAL_PROTO_MAX_BODY);
            reply(s, &m, -1);
            if (f->mode == 1)
                goto out;
            break;
        case SHOAL_MSG_OPEN:
            fake_open_ok(s, &m, h.id);
            break;
        case SHOAL_MSG_GET:
            if (shoal_rd_u32(&r) != 3) {   /* unknown handle: the whole GET fails */
                const char *msg = "no such model handle";
                shoal_msg_begin(&m, SHOAL_MSG_ERROR, SHOAL_MSG_F_LAST, h.id);
                shoal_msg_put_i32(&m, SHOAL_EINVAL);
                shoal_msg_put_str(&m, msg, strlen(msg));
                reply(s, &m, -1);
                break;
            }
            get_id = h.id;
            /* Key 2 first, then a failure for key 1; key 0 comes later. */
            send_item(s, &m, h.id, 2, 0, "expert-two", 0);
            send_item(s, &m, h.id, 1, SHOAL_ENOTFOUND, NULL, 0);
            break;
        case SHOAL_MSG_WARM: {
            /* selection 4: the job id says how many expert keys came */
            uint32_t handle = shoal_rd_u32(&r);
            uint8_t sel = shoal_rd_u8(&r);
            uint16_t n = sel == 4 ? shoal_rd_u16(&r) : 0;
            for (unsigned i = 0; i < n; i++) {
                shoal_key k;
                shoal_rd_key(&r, &k);
                if (k.kind != SHOAL_KEY_EXPERT)
                    n = 0;
            }
            shoal_msg_begin(&m, SHOAL_MSG_JOB_OK, SHOAL_MSG_F_LAST, h.id);
            shoal_msg_put_u64(&m, shoal_rd_finish(&r) == 0 && handle == 3 ? 1000u + n : 0);
            reply(s, &m, -1);
            break;
        }
        case SHOAL_MSG_STATS: {
            const char *j = "{\"hits\":5}";
            shoal_msg_begin(&m, SHOAL_MSG_JSON, SHOAL_MSG_F_LAST, h.id);
            shoal_msg_put_str32(&m, j, strlen(j));
            /* The pending GET's last item arrives before the STATS reply. */
            send_item(s, &m, get_id, 0, 0, "expert-zero", 1);
            shoal_msg_begin(&m, SHOAL_MSG_JSON, SHOAL_MSG_F_LAST, h.id);
            shoal_msg_put_str32(&m, j, strlen(j));
            reply(s, &m, -1);
            break;
        }
        case SHOAL_MSG_PUT: {
            /* OK only for a well-formed PUT whose descriptor holds the
             * bytes it names; "taken" has been stored by someone else */
            uint32_t handle = shoal_rd_u32(&r);
            size_t n = 0;
            const char *name = shoal_rd_str(&r, &n);
            uint64_t len = shoal_rd_u64(&r);
            const uint8_t *x = shoal_rd_bytes(&r, 16);
            char content[32] = { 0 };
            int ok = shoal_rd_finish(&r) == 0 && h.flags == SHOAL_MSG_F_FD && fd >= 0 &&
                     handle == 3 && len == 10 && x[0] == 0xab && x[15] == 0xcd &&
                     pread(fd, content, 10, 0) == 10 && strcmp(content, "pack-bytes") == 0;
            int taken = ok && n == 5 && memcmp(name, "taken", 5) == 0;
            const char *msg = taken ? "stored already" : "bad PUT";
            if (ok && !taken) {
                shoal_msg_begin(&m, SHOAL_MSG_OK, SHOAL_MSG_F_LAST, h.id);
            } else {
                shoal_msg_begin(&m, SHOAL_MSG_ERROR, SHOAL_MSG_F_LAST, h.id);
                shoal_msg_put_i32(&m, taken ? SHOAL_EEXIST : SHOAL_EPROTO);
                shoal_msg_put_str(&m, msg, strlen(msg));
            }
            reply(s, &m, -1);
            break;
        }
        default: {
            const char *msg = "not supported by the test daemon";
            shoal_msg_begin(&m, SHOAL_MSG_ERROR, SHOAL_MSG_F_LAST, h.id);
            shoal_msg_put_i32(&m, SHOAL_EUNSUPPORTED);
            shoal_msg_put_str(&m, msg, strlen(msg));
            reply(s, &m, -1);
        }
        }
    next:
        if (fd >= 0)
            close(fd);
    }
out:
    close(s);
    shoal_buf_free(&body);
    shoal_msg_builder_free(&m);
    return NULL;
}

static void fake_start(fake *f, int mode)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    snprintf(f->dir, sizeof f->dir, "/tmp/shoal-client-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof f->path, "%s/shoald.sock", f->dir);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", f->path);
    f->listener = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(bind(f->listener, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(f->listener, 4), 0);
    f->mode = mode;
    f->put_file = -1;
    assert_int_equal(pthread_create(&f->th, NULL, fake_main, f), 0);
}

static void fake_stop(fake *f)
{
    pthread_join(f->th, NULL);
    close(f->listener);
    unlink(f->path);
    rmdir(f->dir);
}

static void test_no_daemon(void **state)
{
    shoal_client_opts o = { .home = "/nonexistent-shoal-home", .name = "t" };
    shoal_client *c = NULL;
    shoal_err e = { 0 };
    (void)state;
    assert_int_equal(shoal_client_connect(&o, &c, &e), SHOAL_ENET);
    assert_null(c);
    assert_non_null(strstr(e.msg, "shoald is not running"));
    assert_non_null(strstr(e.msg, "shoald --home /nonexistent-shoal-home"));
}

static void test_session(void **state)
{
    fake f;
    shoal_client_opts o = { .name = "test", .call_timeout_ms = 5000 };
    shoal_client *c = NULL;
    shoal_err e = { 0 };
    shoal_model_info mi;
    shoal_key keys[3] = { { SHOAL_KEY_EXPERT, 1, 0, NULL, 0 }, { SHOAL_KEY_EXPERT, 1, 1, NULL, 0 },
                          { SHOAL_KEY_FILE, 0, 0, "config.json", 11 } };
    shoal_item it;
    shoal_buf js;
    uint64_t req;
    char got[32];
    int seen[3] = { 0 };
    (void)state;

    fake_start(&f, 0);
    o.socket_path = f.path;
    assert_int_equal(shoal_client_connect(&o, &c, &e), 0);
    assert_true(shoal_client_session(c) == 77);
    assert_string_equal(shoal_client_daemon_version(c), "test-1");

    assert_int_equal(shoal_client_open(c, "hf://org/tiny", &mi, &e), 0);
    assert_int_equal(mi.handle, 3);
    assert_string_equal(mi.commit, "abc123");
    assert_int_equal(mi.upstream, SHOAL_UPSTREAM_UNREACHABLE);
    assert_int_equal(mi.layers, 8);
    assert_true(mi.expert_bytes == 13056);
    assert_true(mi.manifest_fd >= 0);
    memset(got, 0, sizeof got);
    assert_int_equal(pread(mi.manifest_fd, got, 14, 0), 14);
    assert_string_equal(got, "{\"manifest\":1}");
    close(mi.manifest_fd);

    /* A GET whose items come out of order, one failing. */
    assert_int_equal(shoal_client_get_send(c, 3, 0, keys, 3, &req, &e), 0);
    assert_int_equal(shoal_client_next(c, 5000, &it, &e), 0);
    assert_true(it.request == req);
    assert_int_equal(it.index, 2);
    assert_int_equal(it.status, 0);
    assert_int_equal(it.source, SHOAL_SRC_HIT);
    memset(got, 0, sizeof got);
    assert_int_equal(pread(it.fd, got, it.length, 0), 10);
    assert_string_equal(got, "expert-two");
    {   /* mapped, then released: unmapped and closed, twice is harmless */
        shoal_view v;
        assert_int_equal(shoal_item_map(&it, 1, &v, &e), 0);
        assert_true(v.length == 10);
        assert_memory_equal(v.data, "expert-two", 10);
        shoal_item_release(&it, &v);
        assert_int_equal(it.fd, -1);
        assert_null(v.base);
        shoal_item_release(&it, &v);
    }
    seen[it.index] = 1;
    assert_int_equal(shoal_client_next(c, 5000, &it, &e), 0);
    assert_int_equal(it.index, 1);
    assert_int_equal(it.status, SHOAL_ENOTFOUND);
    assert_int_equal(it.fd, -1);
    {
        shoal_view v;
        assert_int_equal(shoal_item_map(&it, 0, &v, &e), SHOAL_EINVAL);
    }
    seen[it.index] = 1;

    /* A control call while the GET's last item is still to come: the item is
     * queued, the call gets its own reply. */
    shoal_buf_init(&js, 0);
    assert_int_equal(shoal_client_stats(c, NULL, &js, &e), 0);
    assert_string_equal((char *)js.data, "{\"hits\":5}");
    shoal_buf_free(&js);
    assert_int_equal(shoal_client_next(c, 5000, &it, &e), 0);
    assert_int_equal(it.index, 0);
    assert_int_equal(it.source, SHOAL_SRC_MISS);
    assert_int_equal(it.last, 1);
    close(it.fd);
    seen[it.index] = 1;
    assert_int_equal(seen[0] + seen[1] + seen[2], 3);

    /* WARM of a list of experts. */
    {
        uint64_t job = 0;
        assert_int_equal(shoal_client_warm_keys(c, 3, keys, 2, &job, &e), 0);
        assert_true(job == 1002);
        assert_int_equal(shoal_client_warm_keys(c, 3, keys, 0, &job, &e), SHOAL_EINVAL);
    }

    /* Nothing more: a timeout, not a hang. */
    assert_int_equal(shoal_client_next(c, 50, &it, &e), SHOAL_ETIMEOUT);

    /* PUT a derived object: the descriptor travels with the request. */
    {
        uint8_t x[16] = { 0xab };
        int pf = blob_with("pack-bytes");
        x[15] = 0xcd;
        assert_int_equal(shoal_client_put(c, 3, "spine-int8-p1-q1", pf, 10, x, &e), 0);
        assert_int_equal(shoal_client_put(c, 3, "taken", pf, 10, x, &e), SHOAL_EEXIST);
        assert_non_null(strstr(e.msg, "stored already"));
        /* refused before sending: bad name, no descriptor, empty */
        assert_int_equal(shoal_client_put(c, 3, "a/b", pf, 10, x, &e), SHOAL_EINVAL);
        assert_int_equal(shoal_client_put(c, 3, "", pf, 10, x, &e), SHOAL_EINVAL);
        assert_int_equal(shoal_client_put(c, 3, "ok", -1, 10, x, &e), SHOAL_EINVAL);
        assert_int_equal(shoal_client_put(c, 3, "ok", pf, 0, x, &e), SHOAL_EINVAL);
        close(pf);
    }

    /* The daemon's errors come back with their code and message. */
    assert_int_equal(shoal_client_release(c, 3, &e), SHOAL_EUNSUPPORTED);
    assert_non_null(strstr(e.msg, "not supported by the test daemon"));
    assert_int_equal(shoal_client_get_send(c, 9, 0, keys, 1, &req, &e), 0);
    assert_int_equal(shoal_client_next(c, 5000, &it, &e), 0);
    assert_int_equal(it.status, SHOAL_EINVAL);
    assert_int_equal(it.index, UINT16_MAX);
    assert_int_equal(it.last, 1);
    /* Bad requests are refused before sending. */
    assert_int_equal(shoal_client_get_send(c, 3, 0, keys, 0, &req, &e), SHOAL_EINVAL);

    shoal_client_close(c);
    fake_stop(&f);
}

static void test_daemon_dies(void **state)
{
    fake f;
    shoal_client_opts o = { .name = "test", .call_timeout_ms = 5000 };
    shoal_client *c = NULL;
    shoal_err e = { 0 };
    shoal_buf js;
    (void)state;
    fake_start(&f, 1);
    o.socket_path = f.path;
    assert_int_equal(shoal_client_connect(&o, &c, &e), 0);
    shoal_buf_init(&js, 0);
    assert_int_equal(shoal_client_stats(c, NULL, &js, &e), SHOAL_ENET);
    assert_non_null(strstr(e.msg, "shoald closed the connection"));
    /* Every later call fails at once. */
    assert_int_equal(shoal_client_stats(c, NULL, &js, &e), SHOAL_ENET);
    shoal_buf_free(&js);
    shoal_client_close(c);
    fake_stop(&f);
}

typedef struct seen_progress {
    uint64_t last_done, frames;
    char phase[SHOAL_PROGRESS_PHASE_MAX + 1];
} seen_progress;

static void count_progress(const shoal_progress *p, void *ctx)
{
    seen_progress *s = ctx;
    s->frames++;
    s->last_done = p->done;
    snprintf(s->phase, sizeof s->phase, "%s", p->phase);
}

static void test_progress_and_put(void **state)
{
    fake f;
    shoal_client_opts o = { .name = "test", .call_timeout_ms = 400 };
    shoal_client *c = NULL;
    shoal_err e = { 0 };
    seen_progress sp = { 0, 0, "" };
    shoal_buf js;
    shoal_put p;
    uint8_t x[16] = { 0x5a };
    (void)state;

    fake_start(&f, 0);
    o.socket_path = f.path;
    assert_int_equal(shoal_client_connect(&o, &c, &e), 0);
    /* Each frame starts the wait afresh: 1.2 s of work, a 400 ms timeout. */
    shoal_client_on_progress(c, count_progress, &sp);
    shoal_buf_init(&js, 0);
    assert_int_equal(shoal_client_verify(c, NULL, 1, &js, &e), 0);
    assert_string_equal((char *)js.data, "{}");
    assert_true(sp.frames == 8 && sp.last_done == 8);
    assert_string_equal(sp.phase, "verify");
    shoal_buf_free(&js);

    /* PUT_BEGIN hands a descriptor to write into; commit closes it. */
    assert_int_equal(shoal_client_put_begin(c, 3, "pack", 10, &p, &e), 0);
    assert_true(p.id == 9 && p.length == 10 && p.fd >= 0);
    assert_int_equal(pwrite(p.fd, "zero-copy!", 10, 0), 10);
    assert_int_equal(shoal_client_put_commit(c, &p, x, &e), 0);
    assert_int_equal(p.fd, -1);
    x[0] = 0;
    assert_int_equal(shoal_client_put_begin(c, 3, "pack", 10, &p, &e), 0);
    assert_int_equal(shoal_client_put_commit(c, &p, x, &e), SHOAL_ECORRUPT);
    assert_int_equal(shoal_client_put_begin(c, 3, "pack", 10, &p, &e), 0);
    assert_int_equal(shoal_client_put_abort(c, &p, &e), 0);
    assert_int_equal(shoal_client_put_begin(c, 3, "a/b", 10, &p, &e), SHOAL_EINVAL);
    assert_int_equal(p.fd, -1);
    shoal_client_close(c);
    fake_stop(&f);
    if (f.put_file >= 0)
        close(f.put_file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_daemon),
        cmocka_unit_test(test_session),
        cmocka_unit_test(test_daemon_dies),
        cmocka_unit_test(test_progress_and_put),
    };
    return cmocka_run_group_tests_name("client", tests, NULL, NULL);
}
