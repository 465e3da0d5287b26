/* chat.h — K3's chat format ("XTML", specs/k3.md §4): rendering a
 * conversation to token ids, and parsing the model's reply back into its
 * think and response channels.
 *
 * Owns: the tag grammar (open/close, attributes, escaping), per-segment
 * encoding (every ordinary fragment is BPE-encoded on its own, so segment
 * boundaries are token boundaries; specials appear only in structural
 * positions, never from message text), the thinking-effort system message,
 * the one rule for rendering history, the generation prompt, and the
 * streaming reply parser.  Does not own tokenization (tokenizer.h) nor
 * sampling (generate.h).  docs/chat.md has the rules with examples.
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
#ifndef SHOAL_ENGINE_CHAT_H
#define SHOAL_ENGINE_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"
#include "engine/tokenizer.h"

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
