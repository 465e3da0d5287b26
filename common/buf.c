/* buf.c — growable byte buffers. */
#include "common/buf.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void shoal_buf_init(shoal_buf *b, size_t limit)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    b->limit = limit;
}

int shoal_buf_reserve(shoal_buf *b, size_t extra)
{
    size_t need, ncap;
    uint8_t *p;

    if (extra > SIZE_MAX - b->len - 1)
        return SHOAL_ETOOBIG;
    need = b->len + extra + 1;            /* +1 keeps a NUL terminator */
    if (b->limit && need - 1 > b->limit)
        return SHOAL_ETOOBIG;
    if (need <= b->cap)
        return 0;
    ncap = b->cap ? b->cap : 64;
    while (ncap < need)
        ncap = ncap > SIZE_MAX / 2 ? need : ncap * 2;
    p = realloc(b->data, ncap);
    if (!p)
        return SHOAL_ENOMEM;
    b->data = p;
    b->cap = ncap;
    return 0;
}

int shoal_buf_append(shoal_buf *b, const void *p, size_t n)
{
    int rc = shoal_buf_reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int shoal_buf_append_str(shoal_buf *b, const char *s)
{
    return shoal_buf_append(b, s, strlen(s));
}

int shoal_buf_appendf(shoal_buf *b, const char *fmt, ...)
{
    va_list ap;
    int n, rc;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return SHOAL_EINVAL;
    rc = shoal_buf_reserve(b, (size_t)n);
    if (rc)
        return rc;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int shoal_buf_append_u8(shoal_buf *b, uint8_t v) { return shoal_buf_append(b, &v, 1); }

int shoal_buf_append_le16(shoal_buf *b, uint16_t v)
{
    uint8_t p[2] = { (uint8_t)v, (uint8_t)(v >> 8) };
    return shoal_buf_append(b, p, 2);
}

int shoal_buf_append_le32(shoal_buf *b, uint32_t v)
{
    uint8_t p[4];
    shoal_wr_le32(p, v);
    return shoal_buf_append(b, p, 4);
}

int shoal_buf_append_le64(shoal_buf *b, uint64_t v)
{
    uint8_t p[8];
    shoal_wr_le64(p, v);
    return shoal_buf_append(b, p, 8);
}

void shoal_buf_consume(shoal_buf *b, size_t n)
{
    if (n >= b->len) {
        shoal_buf_reset(b);
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    b->data[b->len] = '\0';
}

void shoal_buf_reset(shoal_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

uint8_t *shoal_buf_take(shoal_buf *b, size_t *len)
{
    uint8_t *p = b->data;
    if (len)
        *len = b->len;
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
    return p;
}

void shoal_buf_free(shoal_buf *b)
{
    if (!b)
        return;
    free(b->data);
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}
