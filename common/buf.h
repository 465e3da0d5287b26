/* buf.h — growable byte buffers with an optional size limit.
 *
 * Owns: one contiguous heap block and its length.  The limit guards sizes
 * that come from untrusted input: growing past it fails with SHOAL_ETOOBIG
 * instead of allocating.  Data stays NUL-terminated past `len` (not counted)
 * so text can be used as a C string.
 */
#ifndef SHOAL_BUF_H
#define SHOAL_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct shoal_buf {
    uint8_t *data;   /* NULL until the first append */
    size_t   len;
    size_t   cap;
    size_t   limit;  /* 0: no limit */
} shoal_buf;

/* Start empty with a limit (0 = none).  Cannot fail. */
void shoal_buf_init(shoal_buf *b, size_t limit);

/* Make room for `extra` more bytes.  0, SHOAL_ENOMEM or SHOAL_ETOOBIG;
 * on failure the buffer is unchanged. */
int shoal_buf_reserve(shoal_buf *b, size_t extra);

int shoal_buf_append(shoal_buf *b, const void *p, size_t n);
int shoal_buf_append_str(shoal_buf *b, const char *s);
int shoal_buf_appendf(shoal_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int shoal_buf_append_u8(shoal_buf *b, uint8_t v);
int shoal_buf_append_le16(shoal_buf *b, uint16_t v);
int shoal_buf_append_le32(shoal_buf *b, uint32_t v);
int shoal_buf_append_le64(shoal_buf *b, uint64_t v);

/* Drop the first n bytes (n <= len), keeping the rest. */
void shoal_buf_consume(shoal_buf *b, size_t n);

/* Empty it, keeping the allocation. */
void shoal_buf_reset(shoal_buf *b);

/* Hand the block to the caller (caller frees with free()); the buffer is
 * left empty.  Returns NULL if nothing was ever appended. */
uint8_t *shoal_buf_take(shoal_buf *b, size_t *len);

/* Release the block.  Accepts a zeroed or already-freed buffer. */
void shoal_buf_free(shoal_buf *b);

/* Little-endian readers for codecs. */
static inline uint16_t shoal_rd_le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t shoal_rd_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t shoal_rd_le64(const uint8_t *p)
{
    return (uint64_t)shoal_rd_le32(p) | (uint64_t)shoal_rd_le32(p + 4) << 32;
}
static inline void shoal_wr_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
static inline void shoal_wr_le64(uint8_t *p, uint64_t v)
{
    shoal_wr_le32(p, (uint32_t)v);
    shoal_wr_le32(p + 4, (uint32_t)(v >> 32));
}

#endif
