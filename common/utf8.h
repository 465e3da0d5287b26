/* utf8.h — checking UTF-8 byte by byte. */
#ifndef SHOAL_COMMON_UTF8_H
#define SHOAL_COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length (1-4) of the well-formed character that starts p[0..n), or 0
 * when none does (a stray continuation byte, an overlong form, a
 * surrogate, a value past U+10FFFF, or a sequence cut short by n). */
size_t shoal_utf8_char_len(const uint8_t *p, size_t n);

#endif
