/* tokenizer.c — libFuzzer target for engine/text/text.h's tokenizer.
 *
 * Arbitrary bytes are encoded with a small vocabulary (all 256 bytes plus
 * merges, some of them multi-byte UTF-8) under the K3 pattern, with and
 * without specials, through the linear or the heap merge path (the first
 * byte chooses), then decoded three ways.  Checked:
 *   - raw decode gives the input back (encoding is lossless for any bytes);
 *   - lossy decode gives the input back when it is valid UTF-8, and is
 *     always valid UTF-8 itself (re-running the lossy pass changes nothing);
 *   - the streaming detokenizer, fed id by id, gives the lossy text.
 * Built by scripts/fuzz.sh (make fuzz).
 *
 * fuzz-sources: common/ engine/text/
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "engine/text/text.h"

static const char *const MERGES[] = {
    "th", "he", "the", " t", " the", "in", "ing", "an", "er", "  ", "    ", "\n\n", "'s",
    "\xE4\xB8", "\xE4\xB8\xAD", "\xF0\x9F", "\xF0\x9F\x98", "\xC3\xA9", "<|", "|>", "ab", "abc",
    NULL,
};

static const char SPECIALS[] =
    "{\"added_tokens_decoder\": {\"300\": {\"content\": \"<|open|>\"},"
    " \"301\": {\"content\": \"<|sep|>\"}, \"302\": {\"content\": \"[BOS]\"}}}";

static tokenizer *make(void)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    shoal_buf v;
    tokenizer *t = NULL;
    int rank = 0;

    shoal_buf_init(&v, 0);
    for (int b = 0; b < 256; b++) {
        uint8_t c = (uint8_t)b;
        char q[5] = { A[c >> 2], A[(c & 3) << 4], '=', '=', 0 };
        shoal_buf_appendf(&v, "%s %d\n", q, rank++);
    }
    for (int i = 0; MERGES[i]; i++) {
        const uint8_t *p = (const uint8_t *)MERGES[i];
        size_t n = strlen(MERGES[i]);
        for (size_t k = 0; k < n; k += 3) {
            uint32_t w = (uint32_t)p[k] << 16 | (k + 1 < n ? (uint32_t)p[k + 1] << 8 : 0) |
                         (k + 2 < n ? p[k + 2] : 0);
            char q[4] = { A[w >> 18 & 63], A[w >> 12 & 63], k + 1 < n ? A[w >> 6 & 63] : '=',
                          k + 2 < n ? A[w & 63] : '=' };
            shoal_buf_append(&v, q, 4);
        }
        shoal_buf_appendf(&v, " %d\n", rank++);
    }
    if (tokenizer_new(&t, (const char *)v.data, v.len, "k3", NULL) ||
        tokenizer_specials_parse(t, SPECIALS, strlen(SPECIALS), 310, NULL))
        abort();
    shoal_buf_free(&v);
    return t;
}

static int valid_utf8(const uint8_t *p, size_t n)
{
    shoal_buf o;
    int same;
    shoal_buf_init(&o, 0);
    if (tokenizer_utf8_lossy(p, n, &o))
        abort();
    same = o.len == n && (n == 0 || memcmp(o.data, p, n) == 0);
    shoal_buf_free(&o);
    return same;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static tokenizer *lin, *heap;
    tokenizer_ids ids = { 0 };
    shoal_buf raw, text, streamed;
    tokenizer_stream *s;
    const tokenizer *t;
    int flags;

    if (!lin) {
        lin = make();
        heap = make();
        tokenizer_set_heap_min(lin, 1u << 30);
        tokenizer_set_heap_min(heap, 4);
    }
    if (size == 0)
        return 0;
    flags = data[0] & 1 ? TOKENIZER_ALLOW_SPECIALS : 0;
    t = data[0] & 2 ? heap : lin;
    data++, size--;

    shoal_buf_init(&raw, 0);
    shoal_buf_init(&text, 0);
    shoal_buf_init(&streamed, 0);
    if (tokenizer_encode(t, (const char *)data, size, flags, &ids, NULL))
        abort();
    if (tokenizer_decode(t, ids.v, ids.n, TOKENIZER_DECODE_RAW, &raw, NULL) || raw.len != size ||
        (size && memcmp(raw.data, data, size)))
        abort();
    if (tokenizer_decode(t, ids.v, ids.n, 0, &text, NULL) || !valid_utf8(text.data, text.len))
        abort();
    if (valid_utf8(data, size) && (text.len != size || (size && memcmp(text.data, data, size))))
        abort();
    if (!(s = tokenizer_stream_new(t)))
        abort();
    for (size_t i = 0; i < ids.n; i++)
        if (tokenizer_stream_push(s, ids.v[i], &streamed, NULL))
            abort();
    if (tokenizer_stream_flush(s, &streamed) || streamed.len != text.len ||
        (text.len && memcmp(streamed.data, text.data, text.len)))
        abort();
    tokenizer_stream_free(s);
    tokenizer_ids_free(&ids);
    shoal_buf_free(&raw);
    shoal_buf_free(&text);
    shoal_buf_free(&streamed);
    return 0;
}
