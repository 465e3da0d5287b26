/* openai_request.c — libFuzzer target for the request parser of the
 * OpenAI-compatible API (engine/serve/serve.h part 2).
 *
 * The first byte picks the endpoint (even: chat, odd: completions); the
 * rest is the request body.  Whatever the bytes, the parser must not crash,
 * leak or read out of bounds; a refusal must be a 4xx/5xx with a message; an
 * accepted request must satisfy what serve.h promises (checked here,
 * trapping on a violation), and its error/reply builders must work on it.
 * Built and run by scripts/fuzz.sh (`make fuzz`).
 *
 * fuzz-sources: common/ engine/serve/openai_parse.c engine/serve/openai_reply.c engine/text/
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/buf.h"
#include "engine/serve/serve.h"

#define REQUIRE(c) do { if (!(c)) __builtin_trap(); } while (0)

static void invariants(const openai_request *r)
{
    REQUIRE(r->temperature >= 0 && r->temperature <= 2);
    REQUIRE(r->top_p >= 0 && r->top_p <= 1);
    REQUIRE(r->n_stop <= OPENAI_MAX_STOP);
    for (size_t i = 0; i < r->n_stop; i++)
        REQUIRE(r->stop[i] != NULL);
    REQUIRE(!r->include_usage || r->stream);
    REQUIRE(r->min_p >= 0 && r->min_p <= 1);
    REQUIRE(r->repetition_penalty > 0);
    REQUIRE(r->presence_penalty >= -2 && r->presence_penalty <= 2);
    REQUIRE(r->frequency_penalty >= -2 && r->frequency_penalty <= 2);
    REQUIRE(r->top_logprobs >= 0 && r->top_logprobs <= GEN_TOP_LOGPROBS_MAX);
    REQUIRE(r->top_logprobs == 0 || r->logprobs || r->kind == OPENAI_COMPLETION);
    REQUIRE(r->n_stop_ids <= OPENAI_MAX_STOP_IDS);
    REQUIRE(!r->max_tokens || r->min_tokens <= r->max_tokens);
    if (r->kind == OPENAI_CHAT) {
        REQUIRE(r->n_msgs > 0 && r->msgs);
        for (size_t i = 0; i < r->n_msgs; i++) {
            REQUIRE(r->msgs[i].content != NULL);
            REQUIRE(strlen(r->msgs[i].content) <= r->msgs[i].content_len);
            REQUIRE(r->msgs[i].role <= OPENAI_ASSISTANT);
        }
        REQUIRE(!r->thinking || r->effort[0]);
    } else {
        REQUIRE((r->prompt && r->prompt_len > 0) || (r->prompt_ids && r->n_prompt_ids > 0));
        REQUIRE(r->max_tokens >= 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    openai_request r;
    openai_error e;
    shoal_buf out;

    if (size < 1)
        return 0;
    shoal_buf_init(&out, 0);
    if (openai_request_parse(data[0] & 1 ? OPENAI_COMPLETION : OPENAI_CHAT, (const char *)data + 1,
                             size - 1, &r, &e) == 0) {
        openai_reply_info ri = { .id = "x", .model = r.model ? r.model : "m", .created = 1,
                                 .prompt_tokens = 1, .finish_reason = "stop" };
        invariants(&r);
        REQUIRE(openai_chat_json(&ri, r.stop[0] ? r.stop[0] : "", r.stop[0] ? strlen(r.stop[0]) : 0,
                                 NULL, 0, &out) == 0);
        openai_request_free(&r);
    } else {
        REQUIRE(e.status >= 400 && e.status < 600);
        REQUIRE(e.message[0] != 0);
        REQUIRE(r.msgs == NULL && r.prompt == NULL && r.model == NULL);
        REQUIRE(openai_error_json(&e, &out) == 0);
    }
    shoal_buf_free(&out);
    return 0;
}
