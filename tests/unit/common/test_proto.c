/* test_proto.c — the socket protocol codec: headers, fields, keys, and
 * messages with descriptors over a real socketpair. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/proto.h"

static void test_header_roundtrip(void **state)
{
    uint8_t raw[SHOAL_PROTO_HEADER];
    shoal_msg_header h = { 77, SHOAL_MSG_GET_ITEM, SHOAL_MSG_F_FD | SHOAL_MSG_F_LAST, 0x1122334455ull }, g;
    (void)state;
    shoal_msg_header_encode(raw, &h);
    assert_memory_equal(raw, "SHL\x01", 4);
    assert_int_equal(shoal_msg_header_decode(raw, &g, NULL), 0);
    assert_int_equal(g.len, 77);
    assert_int_equal(g.type, SHOAL_MSG_GET_ITEM);
    assert_int_equal(g.flags, SHOAL_MSG_F_FD | SHOAL_MSG_F_LAST);
    assert_true(g.id == 0x1122334455ull);
}

static void test_header_rejects(void **state)
{
    uint8_t raw[SHOAL_PROTO_HEADER];
    shoal_msg_header h = { 10, SHOAL_MSG_HELLO, 0, 0 }, g;
    shoal_err e = { 0 };
    (void)state;

    shoal_msg_header_encode(raw, &h);
    raw[0] = 'X';
    assert_int_equal(shoal_msg_header_decode(raw, &g, &e), SHOAL_EPROTO);
    assert_non_null(strstr(e.msg, "magic"));

    h.len = SHOAL_PROTO_MAX_BODY + 1;
    shoal_msg_header_encode(raw, &h);
    assert_int_equal(shoal_msg_header_decode(raw, &g, &e), SHOAL_ETOOBIG);

    h.len = 1;
    h.type = 99;
    shoal_msg_header_encode(raw, &h);
    assert_int_equal(shoal_msg_header_decode(raw, &g, &e), SHOAL_EPROTO);
    assert_non_null(strstr(e.msg, "unknown message type 99"));

    h.type = SHOAL_MSG_OK;
    h.flags = 0x80;
    shoal_msg_header_encode(raw, &h);
    assert_int_equal(shoal_msg_header_decode(raw, &g, &e), SHOAL_EPROTO);

    h.flags = 0;
    shoal_msg_header_encode(raw, &h);
    raw[13] = 1;   /* reserved */
    assert_int_equal(shoal_msg_header_decode(raw, &g, &e), SHOAL_EPROTO);
}

static void test_fields_roundtrip(void **state)
{
    shoal_msg_builder m = { 0 };
    shoal_msg_reader r;
    shoal_msg_header h;
    shoal_key keys[3] = {
        { SHOAL_KEY_EXPERT, 91, 895, NULL, 0 },
        { SHOAL_KEY_TENSOR, 0, 0, "model.norm.weight", 17 },
        { SHOAL_KEY_FILE, 0, 0, "config.json", 11 },
    }, k;
    size_t n;
    const char *s;
    char copy[8];
    (void)state;

    shoal_msg_begin(&m, SHOAL_MSG_GET, 0, 42);
    shoal_msg_put_u8(&m, 0xAB);
    shoal_msg_put_u16(&m, 0xBEEF);
    shoal_msg_put_u32(&m, 0xDEADBEEFu);
    shoal_msg_put_u64(&m, 0x0102030405060708ull);
    shoal_msg_put_i32(&m, -16);
    shoal_msg_put_str(&m, "hf://org/name", 13);
    shoal_msg_put_str32(&m, "{\"a\":1}", 7);
    for (int i = 0; i < 3; i++)
        shoal_msg_put_key(&m, &keys[i]);
    assert_int_equal(shoal_msg_end(&m), 0);

    assert_int_equal(shoal_msg_header_decode(m.buf.data, &h, NULL), 0);
    assert_int_equal(h.len, m.buf.len - SHOAL_PROTO_HEADER);
    assert_true(h.id == 42);
    shoal_rd_init(&r, m.buf.data + SHOAL_PROTO_HEADER, h.len);
    assert_int_equal(shoal_rd_u8(&r), 0xAB);
    assert_int_equal(shoal_rd_u16(&r), 0xBEEF);
    assert_int_equal(shoal_rd_u32(&r), 0xDEADBEEFu);
    assert_true(shoal_rd_u64(&r) == 0x0102030405060708ull);
    assert_int_equal(shoal_rd_i32(&r), -16);
    s = shoal_rd_str(&r, &n);
    assert_int_equal(n, 13);
    assert_memory_equal(s, "hf://org/name", 13);
    s = shoal_rd_str32(&r, &n);
    assert_int_equal(n, 7);
    assert_memory_equal(s, "{\"a\":1}", 7);
    shoal_rd_key(&r, &k);
    assert_int_equal(k.kind, SHOAL_KEY_EXPERT);
    assert_int_equal(k.layer, 91);
    assert_int_equal(k.expert, 895);
    shoal_rd_key(&r, &k);
    assert_int_equal(k.kind, SHOAL_KEY_TENSOR);
    assert_int_equal(k.name_len, 17);
    assert_memory_equal(k.name, "model.norm.weight", 17);
    shoal_rd_key(&r, &k);
    assert_int_equal(k.kind, SHOAL_KEY_FILE);
    assert_int_equal(shoal_rd_finish(&r), 0);

    /* Trailing bytes are a protocol error; so is reading past the end. */
    shoal_rd_init(&r, m.buf.data + SHOAL_PROTO_HEADER, h.len);
    shoal_rd_u8(&r);
    assert_int_equal(shoal_rd_finish(&r), SHOAL_EPROTO);
    shoal_rd_init(&r, "\x05\x00" "ab", 4);
    shoal_rd_str(&r, &n);
    assert_int_equal(r.rc, SHOAL_EPROTO);
    assert_int_equal(n, 0);
    /* A string copy that does not fit. */
    shoal_rd_init(&r, "\x09\x00" "123456789", 11);
    shoal_rd_str_copy(&r, copy, sizeof copy);
    assert_int_equal(r.rc, SHOAL_EPROTO);
    /* Unknown key kind, and an empty name. */
    shoal_rd_init(&r, "\x07", 1);
    shoal_rd_key(&r, &k);
    assert_int_equal(r.rc, SHOAL_EPROTO);
    shoal_rd_init(&r, "\x02\x00\x00", 3);
    shoal_rd_key(&r, &k);
    assert_int_equal(r.rc, SHOAL_EPROTO);
    shoal_msg_builder_free(&m);
}

/* PUT (type 13) and the derived-object key (kind 4). */
static void test_put_and_derived_key(void **state)
{
    shoal_msg_builder m = { 0 };
    shoal_msg_reader r;
    shoal_msg_header h;
    shoal_key k, dk = { SHOAL_KEY_DERIVED, 0, 0, "spine-int8-p1-q1", 16 };
    uint8_t x[16];
    size_t n;
    const char *s;
    (void)state;

    assert_true(shoal_msg_type_known(SHOAL_MSG_PUT));
    assert_string_equal(shoal_msg_type_name(SHOAL_MSG_PUT), "PUT");
    for (int i = 0; i < 16; i++)
        x[i] = (uint8_t)(i * 17);
    shoal_msg_begin(&m, SHOAL_MSG_PUT, SHOAL_MSG_F_FD, 9);
    shoal_msg_put_u32(&m, 2);
    shoal_msg_put_str(&m, "spine-int8-p1-q1", 16);
    shoal_msg_put_u64(&m, 123456789ull);
    shoal_msg_put_bytes(&m, x, 16);
    shoal_msg_put_key(&m, &dk);
    assert_int_equal(shoal_msg_end(&m), 0);
    assert_int_equal(shoal_msg_header_decode(m.buf.data, &h, NULL), 0);
    assert_int_equal(h.type, SHOAL_MSG_PUT);
    assert_int_equal(h.flags, SHOAL_MSG_F_FD);
    shoal_rd_init(&r, m.buf.data + SHOAL_PROTO_HEADER, h.len);
    assert_int_equal(shoal_rd_u32(&r), 2);
    s = shoal_rd_str(&r, &n);
    assert_int_equal(n, 16);
    assert_memory_equal(s, "spine-int8-p1-q1", 16);
    assert_true(shoal_rd_u64(&r) == 123456789ull);
    assert_memory_equal(shoal_rd_bytes(&r, 16), x, 16);
    shoal_rd_key(&r, &k);
    assert_int_equal(k.kind, SHOAL_KEY_DERIVED);
    assert_int_equal(k.name_len, 16);
    assert_memory_equal(k.name, "spine-int8-p1-q1", 16);
    assert_int_equal(shoal_rd_finish(&r), 0);
    shoal_msg_builder_free(&m);

    /* Derived names stay inside an etag: no separators, no spaces, bounded. */
    assert_true(shoal_derived_name_ok("a.b_c-D9", 8));
    assert_false(shoal_derived_name_ok("a:b", 3));
    assert_false(shoal_derived_name_ok("a/b", 3));
    assert_false(shoal_derived_name_ok("a b", 3));
    assert_false(shoal_derived_name_ok("", 0));
    {
        char big[SHOAL_PROTO_MAX_DERIVED + 1];
        memset(big, 'a', sizeof big);
        assert_true(shoal_derived_name_ok(big, SHOAL_PROTO_MAX_DERIVED));
        assert_false(shoal_derived_name_ok(big, sizeof big));
    }
    /* A derived key with a bad name does not parse. */
    shoal_rd_init(&r, "\x04\x03\x00" "a:b", 6);
    shoal_rd_key(&r, &k);
    assert_int_equal(r.rc, SHOAL_EPROTO);
    shoal_rd_init(&r, "\x04\x03\x00" "abc", 6);
    shoal_rd_key(&r, &k);
    assert_int_equal(shoal_rd_finish(&r), 0);
    assert_int_equal(k.kind, SHOAL_KEY_DERIVED);
}

/* Protocol 2's types: known, named, and marked as version 2, so a daemon
 * never sends them on a connection that said version 1. */
static void test_version_two_types(void **state)
{
    static const uint16_t v2[] = { SHOAL_MSG_PUT_BEGIN, SHOAL_MSG_PUT_COMMIT, SHOAL_MSG_PROGRESS,
                                   SHOAL_MSG_PUT_READY };
    static const char *const names[] = { "PUT_BEGIN", "PUT_COMMIT", "PROGRESS", "PUT_READY" };
    (void)state;
    assert_int_equal(SHOAL_PROTO_VERSION, 4);
    assert_int_equal(SHOAL_PROTO_VERSION_MIN, 1);
    for (int i = 0; i < 4; i++) {
        assert_true(shoal_msg_type_known(v2[i]));
        assert_string_equal(shoal_msg_type_name(v2[i]), names[i]);
        assert_int_equal(shoal_msg_type_version(v2[i]), 2);
    }
    assert_int_equal(shoal_msg_type_version(SHOAL_MSG_PUT), 1);
    assert_int_equal(shoal_msg_type_version(SHOAL_MSG_JSON), 1);
    /* version 3: RM and JOB_STATUS3 */
    assert_string_equal(shoal_msg_type_name(SHOAL_MSG_RM), "RM");
    assert_string_equal(shoal_msg_type_name(SHOAL_MSG_JOB_STATUS3), "JOB_STATUS3");
    assert_int_equal(shoal_msg_type_version(SHOAL_MSG_RM), 3);
    assert_int_equal(shoal_msg_type_version(SHOAL_MSG_JOB_STATUS3), 3);
    /* version 4: OPEN_OK4 */
    assert_string_equal(shoal_msg_type_name(SHOAL_MSG_OPEN_OK4), "OPEN_OK4");
    assert_int_equal(shoal_msg_type_version(SHOAL_MSG_OPEN_OK4), 4);
    assert_int_equal(shoal_msg_type_version(SHOAL_MSG_OPEN_OK), 1);
    assert_false(shoal_msg_type_known(76));
    assert_false(shoal_msg_type_known(17));
}

static void test_builder_limits(void **state)
{
    shoal_msg_builder m = { 0 };
    char *big = calloc(1, SHOAL_PROTO_MAX_BODY + 16);
    (void)state;
    assert_non_null(big);
    shoal_msg_begin(&m, SHOAL_MSG_JSON, 0, 1);
    shoal_msg_put_str(&m, big, SHOAL_PROTO_MAX_STR + 1);
    assert_int_equal(shoal_msg_end(&m), SHOAL_ETOOBIG);
    shoal_msg_begin(&m, SHOAL_MSG_JSON, 0, 1);   /* begin clears the failure */
    shoal_msg_put_str32(&m, big, SHOAL_PROTO_MAX_BODY - 4);
    assert_int_equal(shoal_msg_end(&m), 0);
    shoal_msg_begin(&m, SHOAL_MSG_JSON, 0, 1);
    shoal_msg_put_str32(&m, big, SHOAL_PROTO_MAX_BODY);   /* + 4 length bytes: over */
    assert_int_not_equal(shoal_msg_end(&m), 0);
    shoal_msg_builder_free(&m);
    free(big);
}

static int tmp_file_with(const char *text)
{
    char path[] = "/tmp/shoal-proto-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    return fd;
}

static void test_send_recv_fd(void **state)
{
    int sv[2], file, got_fd = -1;
    shoal_msg_builder m = { 0 };
    shoal_msg_header h;
    shoal_buf body;
    char back[16] = { 0 };
    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    file = tmp_file_with("expert-bytes");

    /* Two messages back to back: one with a descriptor, one without. */
    shoal_msg_begin(&m, SHOAL_MSG_GET_ITEM, SHOAL_MSG_F_FD, 9);
    shoal_msg_put_u16(&m, 0);
    assert_int_equal(shoal_msg_end(&m), 0);
    assert_int_equal(shoal_msg_send(sv[0], m.buf.data, m.buf.len, file), 0);
    shoal_msg_begin(&m, SHOAL_MSG_OK, SHOAL_MSG_F_LAST, 10);
    assert_int_equal(shoal_msg_end(&m), 0);
    assert_int_equal(shoal_msg_send(sv[0], m.buf.data, m.buf.len, -1), 0);

    shoal_buf_init(&body, 0);
    assert_int_equal(shoal_msg_recv(sv[1], &h, &body, &got_fd, 1000, NULL), 0);
    assert_int_equal(h.type, SHOAL_MSG_GET_ITEM);
    assert_true(h.id == 9);
    assert_int_equal(body.len, 2);
    assert_true(got_fd >= 0);
    assert_int_not_equal(got_fd, file);
    assert_int_equal(pread(got_fd, back, 12, 0), 12);
    assert_string_equal(back, "expert-bytes");
    close(got_fd);

    assert_int_equal(shoal_msg_recv(sv[1], &h, &body, &got_fd, 1000, NULL), 0);
    assert_int_equal(h.type, SHOAL_MSG_OK);
    assert_int_equal(got_fd, -1);
    assert_int_equal(body.len, 0);

    shoal_buf_free(&body);
    shoal_msg_builder_free(&m);
    close(file);
    close(sv[0]);
    close(sv[1]);
}

static void test_recv_failures(void **state)
{
    int sv[2], got_fd = -1, file;
    shoal_msg_builder m = { 0 };
    shoal_msg_header h;
    shoal_buf body;
    shoal_err e = { 0 };
    (void)state;
    shoal_buf_init(&body, 0);

    /* Timeout with nothing sent. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(shoal_msg_recv(sv[1], &h, &body, &got_fd, 50, &e), SHOAL_ETIMEOUT);

    /* A descriptor without the FD flag is refused and the descriptor closed. */
    file = tmp_file_with("x");
    shoal_msg_begin(&m, SHOAL_MSG_OK, 0, 1);
    assert_int_equal(shoal_msg_end(&m), 0);
    assert_int_equal(shoal_msg_send(sv[0], m.buf.data, m.buf.len, file), 0);
    assert_int_equal(shoal_msg_recv(sv[1], &h, &body, &got_fd, 1000, &e), SHOAL_EPROTO);
    assert_int_equal(got_fd, -1);

    /* A body cut short by the peer closing. */
    shoal_msg_begin(&m, SHOAL_MSG_JSON, 0, 2);
    shoal_msg_put_str32(&m, "0123456789", 10);
    assert_int_equal(shoal_msg_end(&m), 0);
    assert_int_equal(write(sv[0], m.buf.data, m.buf.len - 3), (ssize_t)(m.buf.len - 3));
    close(sv[0]);
    assert_int_equal(shoal_msg_recv(sv[1], &h, &body, &got_fd, 1000, &e), SHOAL_EPROTO);
    assert_non_null(strstr(e.msg, "cut short"));
    /* Then a clean close. */
    assert_int_equal(shoal_msg_recv(sv[1], &h, &body, &got_fd, 1000, &e), SHOAL_ENET);
    assert_non_null(strstr(e.msg, "closed"));
    close(sv[1]);

    /* Garbage: bad magic. */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(write(sv[0], "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27), 27);
    assert_int_equal(shoal_msg_recv(sv[1], &h, &body, &got_fd, 1000, &e), SHOAL_EPROTO);
    close(sv[0]);
    close(sv[1]);
    close(file);
    shoal_buf_free(&body);
    shoal_msg_builder_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_roundtrip),
        cmocka_unit_test(test_header_rejects),
        cmocka_unit_test(test_fields_roundtrip),
        cmocka_unit_test(test_put_and_derived_key),
        cmocka_unit_test(test_version_two_types),
        cmocka_unit_test(test_builder_limits),
        cmocka_unit_test(test_send_recv_fd),
        cmocka_unit_test(test_recv_failures),
    };
    return cmocka_run_group_tests_name("proto", tests, NULL, NULL);
}
