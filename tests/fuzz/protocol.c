/* protocol.c — libFuzzer target for what shoald does with a client's bytes.
 *
 * The input is what a client might write on the socket: a stream of frames.
 * Each frame goes through the same steps as in daemon/conn.c: the header
 * decode (common/proto.c), then daemon_request_parse (daemon/request.c).
 * Whatever the bytes, nothing may crash or read out of bounds, and what is
 * accepted must keep the promises: a body within the limit, 1..1024 keys
 * of a known kind with names inside the body, a NUL-terminated text.  The
 * first frame (when small) also goes through shoal_msg_recv on a socket
 * pair, the receive path the client library uses.  Built and run by
 * scripts/fuzz.sh (`make fuzz`).
 *
 * fuzz-sources: common/ daemon/request.c
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/daemon_int.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

static daemon_request rq;

static void check_request(const daemon_request *q, const uint8_t *body, size_t len)
{
    REQUIRE(memchr(q->text, 0, sizeof q->text) != NULL);
    REQUIRE(memchr(q->name, 0, sizeof q->name) != NULL);
    if (q->type == SHOAL_MSG_GET || q->type == SHOAL_MSG_PIN)
        REQUIRE(q->nkeys >= 1 && q->nkeys <= SHOAL_PROTO_MAX_KEYS && q->priority <= 1);
    for (unsigned i = 0; i < q->nkeys; i++) {
        const shoal_key *k = &q->keys[i];
        REQUIRE(k->kind >= SHOAL_KEY_EXPERT && k->kind <= SHOAL_KEY_DERIVED);
        if (k->kind != SHOAL_KEY_EXPERT)
            REQUIRE(k->name_len > 0 && (const uint8_t *)k->name >= body &&
                    (const uint8_t *)k->name + k->name_len <= body + len);
    }
    if (q->json)
        REQUIRE((const uint8_t *)q->json >= body && (const uint8_t *)q->json + q->json_len <= body + len);
}

static void through_socket(const uint8_t *data, size_t size)
{
    int sv[2], fd = -1;
    shoal_msg_header h;
    shoal_buf body;
    shoal_err err = { 0 };

    if (size > 32768 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return;
    if (write(sv[0], data, size) == (ssize_t)size) {
        close(sv[0]);
        sv[0] = -1;
        shoal_buf_init(&body, 0);
        if (shoal_msg_recv(sv[1], &h, &body, &fd, 0, &err) == 0) {
            REQUIRE(h.len <= SHOAL_PROTO_MAX_BODY && body.len == h.len && fd < 0);
            REQUIRE(shoal_msg_type_known(h.type));
        }
        if (fd >= 0)
            close(fd);
        shoal_buf_free(&body);
    }
    if (sv[0] >= 0)
        close(sv[0]);
    close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t pos = 0;

    through_socket(data, size);
    while (size - pos >= SHOAL_PROTO_HEADER) {
        shoal_msg_header h;
        shoal_err err = { 0 };
        const uint8_t *body;
        if (shoal_msg_header_decode(data + pos, &h, &err) != 0) {
            REQUIRE(err.code < 0 && err.msg[0]);
            break;
        }
        REQUIRE(h.len <= SHOAL_PROTO_MAX_BODY && shoal_msg_type_known(h.type));
        if (size - pos - SHOAL_PROTO_HEADER < h.len)
            break;
        body = data + pos + SHOAL_PROTO_HEADER;
        if (daemon_request_parse(&h, body, h.len, &rq, &err) == 0)
            check_request(&rq, body, h.len);
        else
            REQUIRE(err.code < 0 && err.msg[0]);
        pos += SHOAL_PROTO_HEADER + h.len;
    }
    return 0;
}
