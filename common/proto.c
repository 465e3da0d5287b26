/* proto.c — codec of the shoald socket protocol (see proto.h and
 * docs/protocol.md for the header's offset table). */
#include "common/proto.h"
#include "common/platform.h"
#include "common/sys.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const uint8_t proto_magic[4] = { 'S', 'H', 'L', 1 };

static const char *const msg_names[] = {
    [SHOAL_MSG_HELLO] = "HELLO", [SHOAL_MSG_OPEN] = "OPEN", [SHOAL_MSG_GET] = "GET",
    [SHOAL_MSG_CANCEL] = "CANCEL", [SHOAL_MSG_WARM] = "WARM", [SHOAL_MSG_JOB] = "JOB",
    [SHOAL_MSG_STATS] = "STATS", [SHOAL_MSG_REPORT] = "REPORT", [SHOAL_MSG_PIN] = "PIN",
    [SHOAL_MSG_GC] = "GC", [SHOAL_MSG_VERIFY] = "VERIFY", [SHOAL_MSG_RELEASE] = "RELEASE",
    [SHOAL_MSG_PUT] = "PUT", [SHOAL_MSG_PUT_BEGIN] = "PUT_BEGIN",
    [SHOAL_MSG_PUT_COMMIT] = "PUT_COMMIT", [SHOAL_MSG_RM] = "RM",
    [SHOAL_MSG_OK] = "OK", [SHOAL_MSG_ERROR] = "ERROR", [SHOAL_MSG_HELLO_OK] = "HELLO_OK",
    [SHOAL_MSG_OPEN_OK] = "OPEN_OK", [SHOAL_MSG_GET_ITEM] = "GET_ITEM",
    [SHOAL_MSG_JOB_OK] = "JOB_OK", [SHOAL_MSG_JOB_STATUS] = "JOB_STATUS",
    [SHOAL_MSG_JSON] = "JSON", [SHOAL_MSG_PROGRESS] = "PROGRESS",
    [SHOAL_MSG_PUT_READY] = "PUT_READY", [SHOAL_MSG_JOB_STATUS3] = "JOB_STATUS3",
    [SHOAL_MSG_OPEN_OK4] = "OPEN_OK4",
};

int shoal_msg_type_known(uint16_t type)
{
    return type < sizeof msg_names / sizeof msg_names[0] && msg_names[type] != NULL;
}

unsigned shoal_msg_type_version(uint16_t type)
{
    switch (type) {
    case SHOAL_MSG_PUT_BEGIN:
    case SHOAL_MSG_PUT_COMMIT:
    case SHOAL_MSG_PROGRESS:
    case SHOAL_MSG_PUT_READY:
        return 2;
    case SHOAL_MSG_RM:
    case SHOAL_MSG_JOB_STATUS3:
        return 3;
    case SHOAL_MSG_OPEN_OK4:
        return 4;
    default:
        return 1;
    }
}

const char *shoal_msg_type_name(uint16_t type)
{
    return shoal_msg_type_known(type) ? msg_names[type] : "UNKNOWN";
}

void shoal_msg_header_encode(uint8_t out[SHOAL_PROTO_HEADER], const shoal_msg_header *h)
{
    memcpy(out, proto_magic, 4);
    shoal_wr_le32(out + 4, h->len);
    out[8] = (uint8_t)h->type;
    out[9] = (uint8_t)(h->type >> 8);
    out[10] = (uint8_t)h->flags;
    out[11] = (uint8_t)(h->flags >> 8);
    shoal_wr_le32(out + 12, 0);
    shoal_wr_le64(out + 16, h->id);
}

int shoal_msg_header_decode(const uint8_t in[SHOAL_PROTO_HEADER], shoal_msg_header *h,
                            shoal_err *err)
{
    if (memcmp(in, proto_magic, 4) != 0)
        return shoal_err_set(err, SHOAL_EPROTO, "not a shoal protocol frame (bad magic)");
    h->len = shoal_rd_le32(in + 4);
    h->type = shoal_rd_le16(in + 8);
    h->flags = shoal_rd_le16(in + 10);
    h->id = shoal_rd_le64(in + 16);
    if (h->len > SHOAL_PROTO_MAX_BODY)
        return shoal_err_set(err, SHOAL_ETOOBIG, "message body of %u bytes exceeds the %u-byte limit",
                             h->len, SHOAL_PROTO_MAX_BODY);
    if (shoal_rd_le32(in + 12) != 0)
        return shoal_err_set(err, SHOAL_EPROTO, "reserved header bytes are not zero");
    if (!shoal_msg_type_known(h->type))
        return shoal_err_set(err, SHOAL_EPROTO, "unknown message type %u", h->type);
    if (h->flags & ~(unsigned)(SHOAL_MSG_F_FD | SHOAL_MSG_F_LAST))
        return shoal_err_set(err, SHOAL_EPROTO, "unknown header flags 0x%x", h->flags);
    return 0;
}

/* ---- building ------------------------------------------------------------ */

void shoal_msg_begin(shoal_msg_builder *m, uint16_t type, uint16_t flags, uint64_t id)
{
    shoal_msg_header h = { 0, type, flags, id };
    uint8_t hdr[SHOAL_PROTO_HEADER];

    if (m->buf.limit == 0)
        m->buf.limit = SHOAL_PROTO_HEADER + SHOAL_PROTO_MAX_BODY;
    shoal_buf_reset(&m->buf);
    m->rc = 0;
    shoal_msg_header_encode(hdr, &h);
    m->rc = shoal_buf_append(&m->buf, hdr, sizeof hdr);
}

static void put(shoal_msg_builder *m, const void *p, size_t n)
{
    if (m->rc == 0)
        m->rc = shoal_buf_append(&m->buf, p, n);
}

void shoal_msg_put_u8(shoal_msg_builder *m, uint8_t v) { put(m, &v, 1); }

void shoal_msg_put_u16(shoal_msg_builder *m, uint16_t v)
{
    uint8_t p[2] = { (uint8_t)v, (uint8_t)(v >> 8) };
    put(m, p, 2);
}

void shoal_msg_put_u32(shoal_msg_builder *m, uint32_t v)
{
    uint8_t p[4];
    shoal_wr_le32(p, v);
    put(m, p, 4);
}

void shoal_msg_put_u64(shoal_msg_builder *m, uint64_t v)
{
    uint8_t p[8];
    shoal_wr_le64(p, v);
    put(m, p, 8);
}

void shoal_msg_put_i32(shoal_msg_builder *m, int32_t v) { shoal_msg_put_u32(m, (uint32_t)v); }
void shoal_msg_put_bytes(shoal_msg_builder *m, const void *p, size_t n) { put(m, p, n); }

void shoal_msg_put_str(shoal_msg_builder *m, const char *s, size_t n)
{
    if (n > SHOAL_PROTO_MAX_STR) {
        if (m->rc == 0)
            m->rc = SHOAL_ETOOBIG;
        return;
    }
    shoal_msg_put_u16(m, (uint16_t)n);
    put(m, s, n);
}

void shoal_msg_put_str32(shoal_msg_builder *m, const char *s, size_t n)
{
    if (n > SHOAL_PROTO_MAX_BODY) {
        if (m->rc == 0)
            m->rc = SHOAL_ETOOBIG;
        return;
    }
    shoal_msg_put_u32(m, (uint32_t)n);
    put(m, s, n);
}

void shoal_msg_put_key(shoal_msg_builder *m, const shoal_key *k)
{
    shoal_msg_put_u8(m, k->kind);
    switch (k->kind) {
    case SHOAL_KEY_EXPERT:
        shoal_msg_put_u16(m, k->layer);
        shoal_msg_put_u32(m, k->expert);
        break;
    case SHOAL_KEY_TENSOR:
    case SHOAL_KEY_FILE:
    case SHOAL_KEY_DERIVED:
        shoal_msg_put_str(m, k->name, k->name_len);
        break;
    default:
        if (m->rc == 0)
            m->rc = SHOAL_EINVAL;
    }
}

int shoal_msg_end(shoal_msg_builder *m)
{
    if (m->rc)
        return m->rc;
    if (m->buf.len < SHOAL_PROTO_HEADER)
        return SHOAL_EINVAL;
    if (m->buf.len - SHOAL_PROTO_HEADER > SHOAL_PROTO_MAX_BODY)
        return SHOAL_ETOOBIG;
    shoal_wr_le32(m->buf.data + 4, (uint32_t)(m->buf.len - SHOAL_PROTO_HEADER));
    return 0;
}

void shoal_msg_builder_free(shoal_msg_builder *m)
{
    if (m)
        shoal_buf_free(&m->buf);
}

/* ---- reading ------------------------------------------------------------- */

void shoal_rd_init(shoal_msg_reader *r, const void *body, size_t len)
{
    r->p = body;
    r->len = len;
    r->pos = 0;
    r->rc = 0;
}

const uint8_t *shoal_rd_bytes(shoal_msg_reader *r, size_t n)
{
    const uint8_t *p;
    if (r->rc || n > r->len - r->pos) {
        r->rc = SHOAL_EPROTO;
        return NULL;
    }
    p = r->p + r->pos;
    r->pos += n;
    return p;
}

uint8_t shoal_rd_u8(shoal_msg_reader *r)
{
    const uint8_t *p = shoal_rd_bytes(r, 1);
    return p ? p[0] : 0;
}

uint16_t shoal_rd_u16(shoal_msg_reader *r)
{
    const uint8_t *p = shoal_rd_bytes(r, 2);
    return p ? shoal_rd_le16(p) : 0;
}

uint32_t shoal_rd_u32(shoal_msg_reader *r)
{
    const uint8_t *p = shoal_rd_bytes(r, 4);
    return p ? shoal_rd_le32(p) : 0;
}

uint64_t shoal_rd_u64(shoal_msg_reader *r)
{
    const uint8_t *p = shoal_rd_bytes(r, 8);
    return p ? shoal_rd_le64(p) : 0;
}

int32_t shoal_rd_i32(shoal_msg_reader *r) { return (int32_t)shoal_rd_u32(r); }

const char *shoal_rd_str(shoal_msg_reader *r, size_t *n)
{
    size_t len = shoal_rd_u16(r);
    const char *s;
    if (len > SHOAL_PROTO_MAX_STR)
        r->rc = SHOAL_EPROTO;
    s = (const char *)shoal_rd_bytes(r, len);
    *n = s ? len : 0;
    return s ? s : "";
}

const char *shoal_rd_str32(shoal_msg_reader *r, size_t *n)
{
    size_t len = shoal_rd_u32(r);
    const char *s = (const char *)shoal_rd_bytes(r, len);
    *n = s ? len : 0;
    return s ? s : "";
}

void shoal_rd_str_copy(shoal_msg_reader *r, char *out, size_t cap)
{
    size_t n;
    const char *s = shoal_rd_str(r, &n);
    if (r->rc || n >= cap) {
        r->rc = SHOAL_EPROTO;
        if (cap)
            out[0] = '\0';
        return;
    }
    memcpy(out, s, n);
    out[n] = '\0';
}

int shoal_derived_name_ok(const char *name, size_t n)
{
    if (!name || n == 0 || n > SHOAL_PROTO_MAX_DERIVED)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

void shoal_rd_key(shoal_msg_reader *r, shoal_key *k)
{
    size_t n = 0;
    memset(k, 0, sizeof *k);
    k->kind = shoal_rd_u8(r);
    switch (k->kind) {
    case SHOAL_KEY_EXPERT:
        k->layer = shoal_rd_u16(r);
        k->expert = shoal_rd_u32(r);
        break;
    case SHOAL_KEY_TENSOR:
    case SHOAL_KEY_FILE:
        k->name = shoal_rd_str(r, &n);
        k->name_len = (uint16_t)n;
        if (n == 0)
            r->rc = SHOAL_EPROTO;
        break;
    case SHOAL_KEY_DERIVED:
        k->name = shoal_rd_str(r, &n);
        k->name_len = (uint16_t)n;
        if (r->rc == 0 && !shoal_derived_name_ok(k->name, n))
            r->rc = SHOAL_EPROTO;
        break;
    default:
        r->rc = SHOAL_EPROTO;
    }
}

int shoal_rd_finish(shoal_msg_reader *r)
{
    if (r->rc == 0 && r->pos != r->len)
        r->rc = SHOAL_EPROTO;
    return r->rc;
}

/* ---- sockets ------------------------------------------------------------- */

int shoal_msg_send(int sock, const void *msg, size_t len, int pass_fd)
{
    const char *p = msg;
    size_t done = 0;

    while (done < len) {
        struct iovec iov = { (void *)(p + done), len - done };
        struct msghdr mh = { 0 };
        union { struct cmsghdr h; char b[CMSG_SPACE(sizeof(int))]; } ctl;
        ssize_t w;

        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        if (done == 0 && pass_fd >= 0) {
            struct cmsghdr *c;
            memset(&ctl, 0, sizeof ctl);
            mh.msg_control = ctl.b;
            mh.msg_controllen = sizeof ctl.b;
            c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
        }
        w = sendmsg(sock, &mh, SHOAL_MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return shoal_err_from_errno(errno);
        }
        done += (size_t)w;
    }
    return 0;
}

static int wait_readable(int sock, int timeout_ms, uint64_t deadline_ns)
{
    struct pollfd pfd = { sock, POLLIN, 0 };
    int ms = -1, r;
    if (timeout_ms >= 0) {
        uint64_t now = shoal_now_ns();
        ms = now >= deadline_ns ? 0 : (int)((deadline_ns - now) / 1000000u) + 1;
    }
    do {
        r = poll(&pfd, 1, ms);
    } while (r < 0 && errno == EINTR);
    if (r < 0)
        return shoal_err_from_errno(errno);
    return r == 0 ? SHOAL_ETIMEOUT : 0;
}

/* Read exactly n bytes; collect one SCM_RIGHTS descriptor if present. */
static int recv_exact(int sock, void *buf, size_t n, int *fd_out, int timeout_ms,
                      uint64_t deadline_ns)
{
    char *p = buf;
    size_t got = 0;

    while (got < n) {
        struct iovec iov = { p + got, n - got };
        union { struct cmsghdr h; char b[CMSG_SPACE(4 * sizeof(int))]; } ctl;
        struct msghdr mh = { 0 };
        ssize_t r;
        int rc = wait_readable(sock, timeout_ms, deadline_ns);
        if (rc)
            return rc;
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = ctl.b;
        mh.msg_controllen = sizeof ctl.b;
        r = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            return shoal_err_from_errno(errno);
        }
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < k; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                    if (*fd_out < 0)
                        *fd_out = fd;
                    else
                        close(fd);   /* more than one: a protocol error below */
                }
            }
        }
        if (r == 0)
            return got == 0 ? SHOAL_ENET : SHOAL_EPROTO;
        got += (size_t)r;
    }
    return 0;
}

int shoal_msg_recv(int sock, shoal_msg_header *h, shoal_buf *body, int *fd_out,
                   int timeout_ms, shoal_err *err)
{
    uint8_t hdr[SHOAL_PROTO_HEADER];
    uint64_t deadline = timeout_ms >= 0 ? shoal_now_ns() + (uint64_t)timeout_ms * 1000000u : 0;
    int fd = -1, rc;

    shoal_buf_reset(body);
    rc = recv_exact(sock, hdr, sizeof hdr, &fd, timeout_ms, deadline);
    if (rc == SHOAL_ENET) {
        rc = shoal_err_set(err, SHOAL_ENET, "connection closed by peer");
        goto fail;
    }
    if (rc) {
        shoal_err_set(err, rc, "receiving a message header: %s", shoal_strerror(rc));
        goto fail;
    }
    rc = shoal_msg_header_decode(hdr, h, err);
    if (rc)
        goto fail;
    if (h->len) {
        rc = shoal_buf_reserve(body, h->len);
        if (rc) {
            shoal_err_set(err, rc, "no memory for a %u-byte message", h->len);
            goto fail;
        }
        rc = recv_exact(sock, body->data, h->len, &fd, timeout_ms, deadline);
        if (rc) {
            shoal_err_set(err, rc == SHOAL_ENET ? SHOAL_EPROTO : rc,
                          "message body cut short: %s", shoal_strerror(rc));
            rc = err ? err->code : SHOAL_EPROTO;
            goto fail;
        }
        body->len = h->len;
        body->data[body->len] = '\0';
    }
    if ((fd >= 0) != ((h->flags & SHOAL_MSG_F_FD) != 0)) {
        rc = shoal_err_set(err, SHOAL_EPROTO, "%s: descriptor flag and attached descriptor disagree",
                           shoal_msg_type_name(h->type));
        goto fail;
    }
    *fd_out = fd;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    *fd_out = -1;
    return rc;
}
