/* proto.h — the codec of shoald's socket protocol (docs/protocol.md).
 *
 * Owns: the 24-byte header, message building into a shoal_buf, bounds-
 * checked field reading, keys, and sending/receiving one message with an
 * optional descriptor (SCM_RIGHTS).  Does not own connections, sessions or
 * what a message means: the daemon and the client library do.
 *
 * Invariants:
 *   1. A built message is never larger than SHOAL_PROTO_HEADER +
 *      SHOAL_PROTO_MAX_BODY; shoal_msg_end() refuses to finish one that is.
 *   2. A reader never reads past its body; any overrun, or bytes left over
 *      at shoal_rd_finish(), is SHOAL_EPROTO.
 */
#ifndef SHOAL_PROTO_H
#define SHOAL_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"

/* The version a client asks for in HELLO and the oldest the daemon still
 * speaks (docs/protocol.md, principle 2).  2 added PROGRESS, PUT_BEGIN,
 * PUT_COMMIT and PUT_READY; 3 added RM and JOB_STATUS3 (JOB's answer with
 * the last error's code); 4 added OPEN_OK4 (OPEN's answer with how the
 * model's upstream stands: SHOAL_UPSTREAM_*); a connection that said 1
 * never receives a type version 1 did not know. */
#define SHOAL_PROTO_VERSION   4
#define SHOAL_PROTO_VERSION_MIN 1
#define SHOAL_PROTO_HEADER    24
#define SHOAL_PROTO_MAX_BODY  (1u << 20)
#define SHOAL_PROTO_MAX_STR   4096
#define SHOAL_PROTO_MAX_KEYS  1024

enum shoal_msg_type {
    SHOAL_MSG_HELLO = 1, SHOAL_MSG_OPEN = 2, SHOAL_MSG_GET = 3, SHOAL_MSG_CANCEL = 4,
    SHOAL_MSG_WARM = 5, SHOAL_MSG_JOB = 6, SHOAL_MSG_STATS = 7, SHOAL_MSG_REPORT = 8,
    SHOAL_MSG_PIN = 9, SHOAL_MSG_GC = 10, SHOAL_MSG_VERIFY = 11, SHOAL_MSG_RELEASE = 12,
    SHOAL_MSG_PUT = 13, SHOAL_MSG_PUT_BEGIN = 14, SHOAL_MSG_PUT_COMMIT = 15, SHOAL_MSG_RM = 16,
    SHOAL_MSG_OK = 64, SHOAL_MSG_ERROR = 65, SHOAL_MSG_HELLO_OK = 66, SHOAL_MSG_OPEN_OK = 67,
    SHOAL_MSG_GET_ITEM = 68, SHOAL_MSG_JOB_OK = 69, SHOAL_MSG_JOB_STATUS = 70,
    SHOAL_MSG_JSON = 71, SHOAL_MSG_PROGRESS = 72, SHOAL_MSG_PUT_READY = 73,
    SHOAL_MSG_JOB_STATUS3 = 74, SHOAL_MSG_OPEN_OK4 = 75
};

/* OPEN_OK4's upstream byte: how the model's revision was resolved.
 * OFFLINE: HF_HUB_OFFLINE is set, UNREACHABLE: the Hub could not be
 * reached — in both a branch is its last known commit and only what the
 * cache holds serves; LOCAL: a directory (no upstream). */
enum { SHOAL_UPSTREAM_ONLINE = 0, SHOAL_UPSTREAM_LOCAL = 1, SHOAL_UPSTREAM_OFFLINE = 2,
       SHOAL_UPSTREAM_UNREACHABLE = 3 };

/* The oldest protocol version that knows a message type (1 to 4). */
unsigned shoal_msg_type_version(uint16_t type);

/* PROGRESS: how far a long request (OPEN, PUT, VERIFY, GC) has come.  Never
 * LAST; at most every SHOAL_PROGRESS_MS per request, and only while the
 * work advances.  phase is a short word ("headers", "hash", "verify"). */
#define SHOAL_PROGRESS_MS 500
#define SHOAL_PROGRESS_PHASE_MAX 32

enum { SHOAL_MSG_F_FD = 1, SHOAL_MSG_F_LAST = 2 };

/* Key kinds of GET and PIN. */
enum { SHOAL_KEY_EXPERT = 1, SHOAL_KEY_TENSOR = 2, SHOAL_KEY_FILE = 3, SHOAL_KEY_DERIVED = 4 };

/* A derived object's name (PUT, SHOAL_KEY_DERIVED): 1..SHOAL_PROTO_MAX_DERIVED
 * bytes of [A-Za-z0-9._-], so it can sit inside a cache etag. */
#define SHOAL_PROTO_MAX_DERIVED 64
int shoal_derived_name_ok(const char *name, size_t n);

/* WARM's selection byte: the selection in the low 6 bits, and flags: FIT
 * trims a selection that does not fit the budget to what does (instead of
 * refusing it), PLAN answers the plan as JSON and starts nothing. */
enum { SHOAL_WARM_SEL_MASK = 0x3f, SHOAL_WARM_F_FIT = 0x40, SHOAL_WARM_F_PLAN = 0x80 };

/* GET_ITEM sources. */
enum { SHOAL_SRC_HIT = 0, SHOAL_SRC_MISS = 1, SHOAL_SRC_JOIN = 2 };

typedef struct shoal_msg_header {
    uint32_t len;     /* body bytes */
    uint16_t type;
    uint16_t flags;
    uint64_t id;      /* request id */
} shoal_msg_header;

/* A key.  `name` is borrowed from the message body it was read from (or
 * from the caller when building) and is not NUL-terminated. */
typedef struct shoal_key {
    uint8_t     kind;
    uint16_t    layer;
    uint32_t    expert;
    const char *name;
    uint16_t    name_len;
} shoal_key;

/* Is `type` a known message type? */
int shoal_msg_type_known(uint16_t type);
const char *shoal_msg_type_name(uint16_t type);

/* Encode / decode the 24-byte header.  Decoding checks the magic, the body
 * limit, the reserved word and that the type is known: SHOAL_EPROTO or
 * SHOAL_ETOOBIG with a message otherwise. */
void shoal_msg_header_encode(uint8_t out[SHOAL_PROTO_HEADER], const shoal_msg_header *h);
int shoal_msg_header_decode(const uint8_t in[SHOAL_PROTO_HEADER], shoal_msg_header *h,
                            shoal_err *err);

/* Building: begin reserves the header; the put functions append fields;
 * end writes the body length.  Put functions never fail on their own: an
 * allocation or size failure is remembered and returned by end (and by
 * begin for the next message after a reset). */
typedef struct shoal_msg_builder {
    shoal_buf buf;    /* the whole message, header included */
    int       rc;     /* first failure, sticky */
} shoal_msg_builder;

void shoal_msg_begin(shoal_msg_builder *m, uint16_t type, uint16_t flags, uint64_t id);
void shoal_msg_put_u8(shoal_msg_builder *m, uint8_t v);
void shoal_msg_put_u16(shoal_msg_builder *m, uint16_t v);
void shoal_msg_put_u32(shoal_msg_builder *m, uint32_t v);
void shoal_msg_put_u64(shoal_msg_builder *m, uint64_t v);
void shoal_msg_put_i32(shoal_msg_builder *m, int32_t v);
void shoal_msg_put_bytes(shoal_msg_builder *m, const void *p, size_t n);
/* u16 length + bytes; longer than SHOAL_PROTO_MAX_STR is an error. */
void shoal_msg_put_str(shoal_msg_builder *m, const char *s, size_t n);
/* u32 length + bytes (the JSON reply). */
void shoal_msg_put_str32(shoal_msg_builder *m, const char *s, size_t n);
void shoal_msg_put_key(shoal_msg_builder *m, const shoal_key *k);
/* 0, or SHOAL_ETOOBIG / SHOAL_ENOMEM / SHOAL_EINVAL.  The message is
 * m->buf.data[0 .. m->buf.len). */
int shoal_msg_end(shoal_msg_builder *m);
void shoal_msg_builder_free(shoal_msg_builder *m);

/* Reading a body.  Get functions return 0 after an error; check
 * shoal_rd_finish() (or r->rc) before trusting any value. */
typedef struct shoal_msg_reader {
    const uint8_t *p;
    size_t len, pos;
    int rc;
} shoal_msg_reader;

void shoal_rd_init(shoal_msg_reader *r, const void *body, size_t len);
uint8_t  shoal_rd_u8(shoal_msg_reader *r);
uint16_t shoal_rd_u16(shoal_msg_reader *r);
uint32_t shoal_rd_u32(shoal_msg_reader *r);
uint64_t shoal_rd_u64(shoal_msg_reader *r);
int32_t  shoal_rd_i32(shoal_msg_reader *r);
/* Borrowed pointer into the body; n bytes. */
const uint8_t *shoal_rd_bytes(shoal_msg_reader *r, size_t n);
/* Borrowed string (not NUL-terminated) and its length. */
const char *shoal_rd_str(shoal_msg_reader *r, size_t *n);
const char *shoal_rd_str32(shoal_msg_reader *r, size_t *n);
/* Copy a string into out (NUL-terminated); too long for cap is EPROTO. */
void shoal_rd_str_copy(shoal_msg_reader *r, char *out, size_t cap);
/* A key; an unknown kind is EPROTO. */
void shoal_rd_key(shoal_msg_reader *r, shoal_key *k);
/* 0 when every byte was read without error, else SHOAL_EPROTO. */
int shoal_rd_finish(shoal_msg_reader *r);

/* Send one whole message on a blocking stream socket, with `pass_fd`
 * attached when >= 0 (the header must then carry SHOAL_MSG_F_FD).
 * Retries EINTR and partial writes.  0 or a negative code. */
int shoal_msg_send(int sock, const void *msg, size_t len, int pass_fd);

/* Receive one message from a blocking socket: the header into *h, the body
 * into `body` (reset first), and the attached descriptor into *fd_out (-1
 * when none; the caller owns it).  timeout_ms < 0 waits forever.  Returns
 * 0; SHOAL_ENET when the peer closed (before any byte: err says "closed");
 * SHOAL_ETIMEOUT; SHOAL_EPROTO / SHOAL_ETOOBIG for a bad frame (also when a
 * descriptor arrives without the FD flag, or the flag without one). */
int shoal_msg_recv(int sock, shoal_msg_header *h, shoal_buf *body, int *fd_out,
                   int timeout_ms, shoal_err *err);

#endif
