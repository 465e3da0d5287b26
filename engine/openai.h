/* openai.h — the OpenAI-compatible API's data: parsing and validating
 * request bodies for /v1/chat/completions and /v1/completions, and building
 * the response bodies and SSE chunks.
 *
 * Owns: the allow-lists of request fields (anything else is refused with a
 * 400 naming it), value checks, defaults, and the JSON shapes of replies.
 * Does not own HTTP (server.c), tokenization or generation.
 * docs/server.md lists every field.
 *
 * Error bodies have OpenAI's shape:
 *   {"error": {"message": "...", "type": "invalid_request_error",
 *              "param": "temperature" | null, "code": "..." | null}}
 */
#ifndef SHOAL_ENGINE_OPENAI_H
#define SHOAL_ENGINE_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "common/err.h"

#define OPENAI_MAX_STOP 4
#define OPENAI_EFFORT_MAX 16

typedef enum openai_kind { OPENAI_CHAT = 0, OPENAI_COMPLETION = 1 } openai_kind;

typedef enum openai_role { OPENAI_SYSTEM = 0, OPENAI_USER = 1, OPENAI_ASSISTANT = 2 } openai_role;

/* A message; content is owned by the request (text parts joined). */
typedef struct openai_message {
    openai_role role;
    char       *content;
    size_t      content_len;
} openai_message;

/* A parsed request.  Strings are owned; free with openai_request_free. */
typedef struct openai_request {
    openai_kind kind;
    char       *model;             /* NULL if absent */
    /* chat */
    openai_message *msgs;
    size_t      n_msgs;
    int         thinking;          /* 1 unless reasoning_effort "none" or
                                      chat_template_kwargs.thinking false */
    char        effort[OPENAI_EFFORT_MAX];   /* K3 effort: low|medium|high|max */
    /* completion: text, or token ids */
    char       *prompt;
    size_t      prompt_len;
    uint32_t   *prompt_ids;
    size_t      n_prompt_ids;
    /* sampling and limits */
    size_t      max_tokens;        /* 0: not given */
    double      temperature;       /* default 0 (greedy) */
    double      top_p;             /* default 1 */
    uint64_t    seed;
    int         has_seed;
    char       *stop[OPENAI_MAX_STOP];
    size_t      n_stop;
    int         stream;
    int         ignore_eos;     /* vLLM's extension: generation does not end at the eos */
    int         include_usage;     /* stream_options.include_usage */
} openai_request;

/* What went wrong, ready to be sent. */
typedef struct openai_error {
    int  status;                   /* HTTP status */
    char type[32];                 /* "invalid_request_error", ... */
    char param[64];                /* "" for null */
    char code[40];                 /* "" for null */
    char message[384];
} openai_error;

/* Fill e (status, type, param or NULL, code or NULL, printf message). */
void openai_error_set(openai_error *e, int status, const char *type, const char *param,
                      const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The error body as JSON text (appended to out).  0 or SHOAL_ENOMEM. */
int openai_error_json(const openai_error *e, shoal_buf *out);

/* Parse body[0..len) as a request of `kind`.  0, or -1 with e filled (a
 * 400 naming the field for unknown fields, bad types or values; malformed
 * JSON; n != 1) and *r freed.  Only whole numbers fit integer fields. */
int openai_request_parse(openai_kind kind, const char *body, size_t len, openai_request *r,
                         openai_error *e);
void openai_request_free(openai_request *r);

/* ---- replies -------------------------------------------------------------------- */

/* What a reply needs besides the text. */
typedef struct openai_reply_info {
    const char *id;                /* "chatcmpl-..." / "cmpl-..." */
    const char *model;
    int64_t     created;           /* Unix seconds */
    size_t      prompt_tokens, completion_tokens, cached_tokens;
    const char *finish_reason;     /* "stop", "length" or NULL (not finished) */
} openai_reply_info;

/* Whole responses: chat.completion (reasoning may be NULL: no
 * reasoning_content) or text_completion.  Appended to out. */
int openai_chat_json(const openai_reply_info *ri, const char *content, size_t content_len,
                     const char *reasoning, size_t reasoning_len, shoal_buf *out);
int openai_completion_json(const openai_reply_info *ri, const char *text, size_t text_len,
                           shoal_buf *out);

/* One SSE event "data: {...}\n\n" appended to out.
 * Chat: delta with role (first chunk), content or reasoning_content (either
 * may be NULL), finish_reason from ri; with_usage adds "usage": null (the
 * include_usage convention) to non-final chunks.
 * Usage chunk: choices [] and the usage object.
 * Completion: choices[0].text, finish_reason from ri. */
int openai_chat_chunk(const openai_reply_info *ri, int role, const char *content,
                      size_t content_len, const char *reasoning, size_t reasoning_len,
                      int with_usage, shoal_buf *out);
int openai_completion_chunk(const openai_reply_info *ri, const char *text, size_t text_len,
                            int with_usage, shoal_buf *out);
int openai_usage_chunk(const openai_reply_info *ri, int chat, shoal_buf *out);
/* "data: [DONE]\n\n" */
int openai_done_event(shoal_buf *out);

/* GET /v1/models body for one model. */
int openai_models_json(const char *model, int64_t created, shoal_buf *out);

#endif
