/* text.h — the engine's text room: the tiktoken-exact tokenizer and K3's
 * chat format.  It depends on nothing else in the engine (common/ only, never
 * the daemon client), so any tool can use it: `shoal-engine tokenize` today.
 *
 * Two parts, each with its own contract below:
 *   1. tokenizer_* — load, encode, decode (engine/text/tokenizer.c, tok_*.c);
 *   2. chat_*      — rendering a conversation to ids and parsing the reply
 *                    (engine/text/chat.c).
 */
#ifndef SHOAL_ENGINE_TEXT_H
#define SHOAL_ENGINE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"

/* ---- 1. the tokenizer ----------------------------------------------------
 *
 * tiktoken-exact byte-level BPE: load, encode, decode.
 *
 * Owns: a vocabulary in tiktoken format (`base64(bytes) SP rank` per line),
 * the special tokens of a tokenizer_config.json, a pre-tokenizer regex
 * (PCRE2, Unicode properties, JIT), rank-based BPE, lossy UTF-8 decoding and
 * a streaming detokenizer.  Does not own chat rendering (part 2, which decides
 * where specials are allowed) or sampling.  docs/tokenizer.md has the details.
 *
 * Encoding follows K3's tokenization_kimi.py and tiktoken exactly for valid
 * UTF-8 text:
 *   1. cut the text into slices of at most 400,000 code points, and each
 *      slice where a run of whitespace or non-whitespace code points
 *      (Python's str.isspace) grows past 25,000;
 *   2. with TOKENIZER_ALLOW_SPECIALS, cut each slice at the exact spellings
 *      of special tokens, which emit their ids (otherwise "<|open|>" is
 *      ordinary text);
 *   3. split each remaining segment with the pre-tokenizer regex (leftmost
 *      matches; text no alternative matches is dropped, as in tiktoken);
 *   4. a piece that is a whole vocabulary entry emits its rank; otherwise
 *      byte-level BPE repeatedly merges the adjacent pair whose
 *      concatenation has the lowest rank, leftmost on ties.
 * Bytes input need not be valid UTF-8: each maximal run of invalid bytes is
 * encoded on its own by byte-level BPE (never matched by the regex), so
 * decode(encode(x)) == x for every byte string x.
 *
 * Thread safety: a tokenizer is immutable after loading (specials are set
 * before first use) and may be used by many threads at once; each encode
 * borrows per-call scratch (regex match data, JIT stack, BPE arrays) from a
 * small pool under a mutex.  A tokenizer_stream belongs to one thread.
 */

typedef struct tokenizer tokenizer;

/* Upper bounds on what a vocabulary file may ask for (memory guards). */
#define TOKENIZER_MAX_RANK      (1u << 24)   /* ranks are below this */
#define TOKENIZER_MAX_TOKEN_LEN 65535        /* bytes in one vocabulary entry */

/* Slicing limits of step 1 above, in code points. */
#define TOKENIZER_SLICE_CHARS   400000
#define TOKENIZER_RUN_CHARS     25000

/* Growable list of token ids.  Start zeroed; free with tokenizer_ids_free. */
typedef struct tokenizer_ids {
    uint32_t *v;
    size_t    n;
    size_t    cap;
} tokenizer_ids;

void tokenizer_ids_free(tokenizer_ids *ids);
/* Append one id.  0 or SHOAL_ENOMEM (list unchanged). */
int tokenizer_ids_push(tokenizer_ids *ids, uint32_t id);

/* ---- patterns ------------------------------------------------------------ */

/* Resolve a pattern argument into the PCRE2 source the tokenizer compiles:
 * "k3" (K3's pre-tokenizer, specs/k3.md §4), "o200k", "cl100k" (tiktoken's
 * o200k_base and cl100k_base patterns), or any other string, taken as a
 * regex in tiktoken's (Rust regex) syntax.  Every pattern goes through
 * tokenizer_pattern_translate.  *out is the caller's to free.
 * 0, SHOAL_EINVAL (empty pattern, unbalanced class) or SHOAL_ENOMEM. */
int tokenizer_pattern_resolve(const char *pattern, char **out, shoal_err *err);

/* Translate Rust-regex constructs PCRE2 lacks or reads differently:
 *  - class intersection: [A&&[^B]] -> (?:(?![B])[A]); [A&&B] ->
 *    (?:(?=[B])[A]); [^A&&B] -> (?:(?!(?=[B])[A])(?s:.));
 *  - a bare script name \p{Han} (Script in Rust, Script_Extensions in
 *    PCRE2 >= 10.40) -> \p{sc:Han}; general categories and names with an
 *    explicit "type:" or "type=" are kept.
 * Everything else is copied.  *out is the caller's to free. */
int tokenizer_pattern_translate(const char *src, char **out, shoal_err *err);

/* ---- loading --------------------------------------------------------------- */

/* Parse a tiktoken-format vocabulary held in memory and compile `pattern`
 * (see tokenizer_pattern_resolve).  Checks: every non-empty line is
 * `base64 SP rank`, the base64 is canonical, ranks < TOKENIZER_MAX_RANK,
 * no rank and no byte string appears twice, and all 256 single bytes are
 * present; a failure names the line.  0 or a negative code; *out is set only
 * on success (caller frees with tokenizer_free). */
int tokenizer_new(tokenizer **out, const char *vocab, size_t vocab_len, const char *pattern,
                  shoal_err *err);

/* The same, reading the vocabulary from a file. */
int tokenizer_load(tokenizer **out, const char *vocab_path, const char *pattern, shoal_err *err);

/* A model directory: tiktoken.model, tokenizer_config.json (specials; if
 * present) and config.json (vocab_size, at the root or under text_config,
 * if present: the end of the reserved range), with the "k3" pattern. */
int tokenizer_model_open(tokenizer **out, const char *dir, shoal_err *err);

/* Set the special tokens from a tokenizer_config.json text: each entry of
 * `added_tokens_decoder` ("id": {"content": "..."}) names one special; every
 * other id in [n_base, reserved_end) is spelled "<|reserved_token_{id}|>".
 * reserved_end 0 means one past the highest listed id.  `json` may be NULL
 * (no named specials).  Ids outside [n_base, reserved_end), duplicate
 * spellings and empty spellings are errors.  Replaces earlier specials; call
 * before the tokenizer is shared between threads. */
int tokenizer_specials_parse(tokenizer *t, const char *json, size_t json_len,
                             uint32_t reserved_end, shoal_err *err);
/* The same from a file path. */
int tokenizer_specials_load(tokenizer *t, const char *config_path, uint32_t reserved_end,
                            shoal_err *err);

void tokenizer_free(tokenizer *t);

/* ---- queries ---------------------------------------------------------------- */

/* One past the highest base rank (163,584 for K3). */
uint32_t tokenizer_n_base(const tokenizer *t);
/* One past the highest id (base or special): the model's vocab size. */
uint32_t tokenizer_n_vocab(const tokenizer *t);
/* Number of special tokens. */
size_t tokenizer_n_specials(const tokenizer *t);
/* The id of an exact special spelling: 0 or SHOAL_ENOTFOUND. */
int tokenizer_special_id(const tokenizer *t, const char *text, uint32_t *id);
/* 1 if id is a special token, else 0. */
int tokenizer_is_special(const tokenizer *t, uint32_t id);
/* Bytes of one id (a special's spelling for specials).  The pointer is
 * borrowed from t.  0 or SHOAL_ERANGE for an id that names nothing. */
int tokenizer_token_bytes(const tokenizer *t, uint32_t id, const uint8_t **p, size_t *n);
/* The PCRE2 source in use (borrowed from t). */
const char *tokenizer_pattern(const tokenizer *t);

/* Pieces at least this long are merged with a heap (O(n log n)); shorter
 * ones with tiktoken's linear scan, faster for short pieces.  Both give
 * the same result; the knob exists so tests can check that.  Default 128. */
void tokenizer_set_heap_min(tokenizer *t, size_t n);

/* ---- encoding ----------------------------------------------------------------- */

/* TOKENIZER_NO_SLICE skips step 1: plain tiktoken, which does not slice
 * (the results differ only for texts over 400,000 code points or with a
 * same-class run over 25,000). */
enum { TOKENIZER_ALLOW_SPECIALS = 1, TOKENIZER_NO_SLICE = 2 };

/* Encode len bytes of text and append the ids to out.  flags: 0 or a
 * combination of TOKENIZER_ALLOW_SPECIALS and TOKENIZER_NO_SLICE.  0, SHOAL_ENOMEM or SHOAL_EINTERNAL (the regex
 * engine failed); on failure out may hold part of the result. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int flags,
                     tokenizer_ids *out, shoal_err *err);

/* ---- decoding ----------------------------------------------------------------- */

enum { TOKENIZER_DECODE_RAW = 1 };

/* Append the bytes of ids (specials as their spelling) to out, as lossy
 * UTF-8 text, or as raw bytes with TOKENIZER_DECODE_RAW.
 * 0, SHOAL_ERANGE (an id names nothing; out unchanged) or SHOAL_ENOMEM. */
int tokenizer_decode(const tokenizer *t, const uint32_t *ids, size_t n, int flags,
                     shoal_buf *out, shoal_err *err);

/* Append p[0..n) as valid UTF-8, replacing each maximal ill-formed
 * subsequence by U+FFFD as Python's bytes.decode("utf-8", "replace") and
 * WHATWG's TextDecoder do.  A truncated sequence at the end is replaced
 * too.  0 or SHOAL_ENOMEM / SHOAL_ETOOBIG (from out's limit). */
int tokenizer_utf8_lossy(const uint8_t *p, size_t n, shoal_buf *out);

/* Streaming detokenizer: turns ids (or bytes) into text as they come,
 * holding back an incomplete UTF-8 sequence until it completes or turns
 * out invalid, so it never emits half a character.  The concatenation of
 * everything pushed and flushed equals tokenizer_decode of all the ids. */
typedef struct tokenizer_stream tokenizer_stream;

/* t is borrowed and must outlive the stream; it may be NULL for a stream
 * fed only with tokenizer_stream_push_bytes.  NULL on allocation failure. */
tokenizer_stream *tokenizer_stream_new(const tokenizer *t);
/* Append the text that id completes to out (possibly nothing).
 * 0, SHOAL_ERANGE (unknown id; stream unchanged) or SHOAL_ENOMEM. */
int tokenizer_stream_push(tokenizer_stream *s, uint32_t id, shoal_buf *out, shoal_err *err);
int tokenizer_stream_push_bytes(tokenizer_stream *s, const uint8_t *p, size_t n, shoal_buf *out);
/* End of input: a dangling partial sequence becomes U+FFFD.  The stream
 * is empty afterwards and may be reused. */
int tokenizer_stream_flush(tokenizer_stream *s, shoal_buf *out);
/* Bytes held back (0..3). */
size_t tokenizer_stream_pending(const tokenizer_stream *s);
void tokenizer_stream_free(tokenizer_stream *s);

/* ---- 2. the chat format -------------------------------------------------
 *
 * K3's chat format ("XTML", specs/k3.md §4): rendering a
 * conversation to token ids, and parsing the model's reply back into its
 * think and response channels.
 *
 * Owns: the tag grammar (open/close, attributes, escaping), per-segment
 * encoding (every ordinary fragment is BPE-encoded on its own, so segment
 * boundaries are token boundaries; specials appear only in structural
 * positions, never from message text), the thinking-effort system message,
 * the one rule for rendering history, the generation prompt, and the
 * streaming reply parser.  Does not own tokenization (part 1 above) nor
 * sampling (engine/serve/serve.h).  docs/chat.md has the rules with examples.
 *
 * Rendering, for each message in order (display line breaks omitted):
 *   [thinking on]  <|open|>message role="system" type="thinking-effort"<|sep|>
 *                  EFFORT_TEXT<|close|>message<|sep|><|end_of_msg|>
 *   system, user   <|open|>message role="R"<|sep|>CONTENT<|close|>message<|sep|><|end_of_msg|>
 *   assistant      <|open|>message role="assistant"<|sep|>
 *                  [thinking on: <|open|>think<|sep|><|close|>think<|sep|>]
 *                  <|open|>response<|sep|>CONTENT<|close|>response<|sep|>
 *                  <|close|>message<|sep|><|end_of_msg|>
 *   generation     <|open|>message role="assistant"<|sep|>
 *                  thinking on: <|open|>think<|sep|>   off: <|open|>response<|sep|>
 * Earlier assistant turns always get an empty think block when thinking is
 * on (their reasoning is dropped): the spec's recommendation until
 * encoding_k3.py's rule is known.  That rule lives in render_assistant() only.
 */

typedef enum chat_role { CHAT_SYSTEM = 0, CHAT_USER = 1, CHAT_ASSISTANT = 2 } chat_role;

/* One message; text is borrowed for the call and need not be
 * NUL-terminated. */
typedef struct chat_message {
    chat_role   role;
    const char *content;
    size_t      content_len;
} chat_message;

/* Parse "system" / "user" / "assistant" ("developer" counts as system):
 * 0 or SHOAL_EINVAL. */
int chat_role_parse(const char *s, chat_role *out);

#define CHAT_EFFORT_MAX 32

typedef struct chat_options {
    int  thinking;                    /* 1 (default): thinking mode */
    char effort[CHAT_EFFORT_MAX];     /* "max" (default), "high", "medium", "low" */
    int  add_generation_prompt;       /* 1 (default) */
} chat_options;

void chat_options_default(chat_options *o);

/* One segment of a rendered prompt: a special token or an ordinary fragment
 * encoded on its own.  Token range [tok, tok+n_tok), text range
 * [text, text+text_len) of chat_prompt.text. */
typedef struct chat_segment {
    size_t tok, n_tok;
    size_t text, text_len;
    int    special;
} chat_segment;

/* A rendered prompt.  Start zeroed; free with chat_prompt_free. */
typedef struct chat_prompt {
    tokenizer_ids ids;         /* the tokens the model sees */
    shoal_buf     text;        /* the same as text, specials spelled out */
    chat_segment *seg;
    size_t        n_seg, cap_seg;
} chat_prompt;

void chat_prompt_free(chat_prompt *p);

/* Append an attribute value escaped as XTML wants it: & -> &amp;,
 * " -> &quot;, everything else as is.  0 or SHOAL_ENOMEM / SHOAL_ETOOBIG. */
int chat_attr_escape(const char *s, size_t n, shoal_buf *out);

/* Render msgs[0..n) with options o (NULL: defaults) into out (which must be
 * zeroed or freed).  The tokenizer must know <|open|>, <|close|>, <|sep|>
 * and <|end_of_msg|>.  Effort values are letters only (SHOAL_EINVAL
 * otherwise).  0, SHOAL_ENOTFOUND (a special is missing), SHOAL_EINVAL or
 * SHOAL_ENOMEM; out is freed on failure. */
int chat_render(const tokenizer *t, const chat_message *msgs, size_t n, const chat_options *o,
                chat_prompt *out, shoal_err *err);

/* ---- parsing the reply ------------------------------------------------- */

/* Where the parser is. */
typedef enum chat_channel {
    CHAT_CH_THINK = 0,       /* reasoning text */
    CHAT_CH_RESPONSE = 1,    /* the answer */
    CHAT_CH_OTHER = 2        /* between blocks or inside a tag: text is dropped */
} chat_channel;

typedef struct chat_parser chat_parser;

/* A parser for the tokens generated after a generation prompt rendered with
 * `thinking` on or off (it starts in the think or the response channel).
 * t is borrowed.  NULL on no memory. */
chat_parser *chat_parser_new(const tokenizer *t, int thinking);
void chat_parser_free(chat_parser *p);

/* Feed one generated id.  Text it completes is appended to reasoning (think
 * channel) or content (response channel); tag names and other specials are
 * consumed.  Returns 1 when id is <|end_of_msg|> (the reply is over; the
 * id adds no text), 0 otherwise, or a negative code (SHOAL_ERANGE: unknown
 * id; SHOAL_ENOMEM). */
int chat_parser_push(chat_parser *p, uint32_t id, shoal_buf *reasoning, shoal_buf *content,
                     shoal_err *err);
/* End of generation: flush partial UTF-8 of the current channel. */
int chat_parser_finish(chat_parser *p, shoal_buf *reasoning, shoal_buf *content);
chat_channel chat_parser_channel(const chat_parser *p);

#endif
