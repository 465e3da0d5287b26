/* request.c — decode a request body into a daemon_request.
 *
 * Owns: the request half of docs/protocol.md's message table, strictly:
 * every field read through the bounds-checked reader, no trailing bytes,
 * reply types refused.  Pure (no I/O, no allocation), so the libFuzzer
 * target tests/fuzz/protocol.c drives it directly.  Does not own what a
 * request means (ops.c).
 */
#include "daemon/daemon_int.h"

#include <string.h>

static int parse_keys(shoal_msg_reader *r, daemon_request *q, shoal_err *err)
{
    q->nkeys = shoal_rd_u16(r);
    if (r->rc == 0 && (q->nkeys == 0 || q->nkeys > SHOAL_PROTO_MAX_KEYS))
        return shoal_err_set(err, SHOAL_EPROTO, "a request carries 1..%d keys, not %u",
                             SHOAL_PROTO_MAX_KEYS, q->nkeys);
    for (unsigned i = 0; i < q->nkeys && r->rc == 0; i++)
        shoal_rd_key(r, &q->keys[i]);
    return 0;
}

static int parse_warm(shoal_msg_reader *r, daemon_request *q, shoal_err *err)
{
    uint8_t raw;
    q->handle = shoal_rd_u32(r);
    raw = shoal_rd_u8(r);
    q->selection = raw & SHOAL_WARM_SEL_MASK;
    q->warm_flags = raw & (SHOAL_WARM_F_FIT | SHOAL_WARM_F_PLAN);
    switch (q->selection) {
    case 0: case 1:
        return 0;
    case 2:
        q->a = shoal_rd_u16(r);
        q->b = shoal_rd_u16(r);
        return 0;
    case 3:
        q->a = shoal_rd_u32(r);
        return 0;
    case 4:
        return parse_keys(r, q, err);
    default:
        return r->rc ? 0 : shoal_err_set(err, SHOAL_EPROTO, "unknown WARM selection %u",
                                         q->selection);
    }
}

int daemon_request_parse(const shoal_msg_header *h, const uint8_t *body, size_t len,
                         daemon_request *q, shoal_err *err)
{
    shoal_msg_reader r;
    int rc = 0;

    q->type = h->type;
    q->id = h->id;
    q->nkeys = 0;
    q->text[0] = '\0';
    q->json = NULL;
    q->json_len = 0;
    if (h->flags != (h->type == SHOAL_MSG_PUT ? SHOAL_MSG_F_FD : 0))
        return shoal_err_set(err, SHOAL_EPROTO, "%s: requests carry no flags but PUT's FD "
                             "(got 0x%x)", shoal_msg_type_name(h->type), h->flags);
    if (h->type != SHOAL_MSG_HELLO && h->id == 0)
        return shoal_err_set(err, SHOAL_EPROTO, "%s: request id 0 is reserved for HELLO",
                             shoal_msg_type_name(h->type));
    shoal_rd_init(&r, body, len);
    switch (h->type) {
    case SHOAL_MSG_HELLO:
        q->version = shoal_rd_u16(&r);
        shoal_rd_str_copy(&r, q->name, sizeof q->name);
        q->pid = shoal_rd_u32(&r);
        break;
    case SHOAL_MSG_OPEN:
    case SHOAL_MSG_STATS:
    case SHOAL_MSG_RM:
        shoal_rd_str_copy(&r, q->text, sizeof q->text);
        break;
    case SHOAL_MSG_GET:
    case SHOAL_MSG_PIN:
        q->handle = shoal_rd_u32(&r);
        q->priority = shoal_rd_u8(&r);
        if (r.rc == 0 && q->priority > 1)
            return shoal_err_set(err, SHOAL_EPROTO, "%s: byte %u must be 0 or 1",
                                 shoal_msg_type_name(h->type), q->priority);
        rc = parse_keys(&r, q, err);
        break;
    case SHOAL_MSG_CANCEL:
    case SHOAL_MSG_JOB:
    case SHOAL_MSG_GC:
        q->u64 = shoal_rd_u64(&r);
        break;
    case SHOAL_MSG_WARM:
        rc = parse_warm(&r, q, err);
        break;
    case SHOAL_MSG_REPORT:
        q->json = shoal_rd_str32(&r, &q->json_len);
        break;
    case SHOAL_MSG_VERIFY:
        shoal_rd_str_copy(&r, q->text, sizeof q->text);
        q->priority = shoal_rd_u8(&r);
        break;
    case SHOAL_MSG_RELEASE:
        q->handle = shoal_rd_u32(&r);
        break;
    case SHOAL_MSG_PUT: {
        size_t n = 0;
        const char *name;
        const uint8_t *x;
        q->handle = shoal_rd_u32(&r);
        name = shoal_rd_str(&r, &n);
        q->u64 = shoal_rd_u64(&r);
        x = shoal_rd_bytes(&r, 16);
        if (r.rc == 0 && (!shoal_derived_name_ok(name, n) || q->u64 == 0))
            return shoal_err_set(err, SHOAL_EPROTO, "PUT: a name of 1..%d [A-Za-z0-9._-] and a "
                                 "length > 0", SHOAL_PROTO_MAX_DERIVED);
        if (r.rc == 0) {
            memcpy(q->text, name, n);
            q->text[n] = '\0';
            memcpy(q->xxh128, x, 16);
        }
        break;
    }
    case SHOAL_MSG_PUT_BEGIN: {
        size_t n = 0;
        const char *name;
        q->handle = shoal_rd_u32(&r);
        name = shoal_rd_str(&r, &n);
        q->u64 = shoal_rd_u64(&r);
        if (r.rc == 0 && (!shoal_derived_name_ok(name, n) || q->u64 == 0))
            return shoal_err_set(err, SHOAL_EPROTO, "PUT_BEGIN: a name of 1..%d [A-Za-z0-9._-] "
                                 "and a length > 0", SHOAL_PROTO_MAX_DERIVED);
        if (r.rc == 0) {
            memcpy(q->text, name, n);
            q->text[n] = '\0';
        }
        break;
    }
    case SHOAL_MSG_PUT_COMMIT: {
        const uint8_t *x;
        q->u64 = shoal_rd_u64(&r);
        q->priority = shoal_rd_u8(&r);
        x = shoal_rd_bytes(&r, 16);
        if (r.rc == 0 && q->priority > 1)
            return shoal_err_set(err, SHOAL_EPROTO, "PUT_COMMIT: keep must be 0 or 1, not %u",
                                 q->priority);
        if (r.rc == 0)
            memcpy(q->xxh128, x, 16);
        break;
    }
    default:
        return shoal_err_set(err, SHOAL_EPROTO, "%s is not a request",
                             shoal_msg_type_name(h->type));
    }
    if (rc)
        return rc;
    if (shoal_rd_finish(&r))
        return shoal_err_set(err, SHOAL_EPROTO, "%s: malformed body (%zu bytes)",
                             shoal_msg_type_name(h->type), len);
    return 0;
}
