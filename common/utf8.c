/* utf8.c — see utf8.h (the ranges are RFC 3629's table of well-formed
 * byte sequences). */
#include "common/utf8.h"

size_t shoal_utf8_char_len(const uint8_t *p, size_t n)
{
    uint8_t c, lo = 0x80, hi = 0xBF;
    size_t len;

    if (n == 0)
        return 0;
    c = p[0];
    if (c < 0x80)
        return 1;
    if (c < 0xC2 || c > 0xF4)
        return 0;
    len = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return len;
}
