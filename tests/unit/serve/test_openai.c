/* test_openai.c — engine/serve/serve.h (the OpenAI API): request parsing (the allow-list, types,
 * ranges, defaults, content parts, effort mapping, stop, stream options,
 * prompt forms, null as absent) and the reply shapes (whole, chunks, usage,
 * errors, models).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "common/buf.h"
#include "common/json.h"
#include "engine/serve/serve.h"

static int parse(openai_kind k, const char *body, openai_request *r, openai_error *e)
{
    return openai_request_parse(k, body, strlen(body), r, e);
}

/* The request must be refused with 400 naming `param`. */
static void refused(openai_kind k, const char *body, const char *param)
{
    openai_request r;
    openai_error e;
    if (parse(k, body, &r, &e) == 0)
        fail_msg("accepted: %s", body);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    if (strcmp(e.param, param) != 0)
        fail_msg("param '%s', wanted '%s' (%s) for %s", e.param, param, e.message, body);
    assert_null(r.msgs);
}

static void test_chat_defaults(void **state)
{
    openai_request r;
    openai_error e;
    (void)state;
    assert_int_equal(parse(OPENAI_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
                                        "{\"role\":\"user\",\"content\":\"Hi\"}]}", &r, &e), 0);
    assert_string_equal(r.model, "m");
    assert_int_equal(r.n_msgs, 2);
    assert_int_equal(r.msgs[0].role, OPENAI_SYSTEM);
    assert_string_equal(r.msgs[1].content, "Hi");
    assert_int_equal(r.thinking, 1);
    assert_string_equal(r.effort, "max");
    assert_int_equal(r.max_tokens, 0);
    assert_true(r.temperature == 0.0);
    assert_true(r.top_p == 1.0);
    assert_int_equal(r.stream, 0);
    assert_int_equal(r.has_seed, 0);
    assert_int_equal(r.ignore_eos, 0);
    openai_request_free(&r);
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":\"Hi\",\"ignore_eos\":true}", &r, &e), 0);
    assert_int_equal(r.ignore_eos, 1);
    openai_request_free(&r);
    refused(OPENAI_COMPLETION, "{\"prompt\":\"Hi\",\"ignore_eos\":1}", "ignore_eos");
}

static void test_chat_fields(void **state)
{
    openai_request r;
    openai_error e;
    (void)state;
    assert_int_equal(parse(OPENAI_CHAT,
        "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null,"
        "\"reasoning_content\":\"r\"},{\"role\":\"user\",\"content\":\"q\",\"name\":null}],"
        "\"max_tokens\":9,\"max_completion_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
        "\"seed\":-3,\"stop\":[\"x\",\"yz\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"n\":1,\"user\":\"u\",\"presence_penalty\":0,\"frequency_penalty\":0.0,\"logprobs\":false,"
        "\"reasoning_effort\":\"minimal\",\"tools\":null}", &r, &e), 0);
    assert_int_equal(r.msgs[0].role, OPENAI_SYSTEM);
    assert_string_equal(r.msgs[0].content, "ab");
    assert_int_equal(r.msgs[1].role, OPENAI_ASSISTANT);
    assert_int_equal(r.msgs[1].content_len, 0);
    assert_int_equal(r.max_tokens, 7);   /* max_completion_tokens wins */
    assert_true(r.temperature == 0.5 && r.top_p == 0.9);
    assert_int_equal(r.has_seed, 1);
    assert_true(r.seed == (uint64_t)-3);
    assert_int_equal(r.n_stop, 2);
    assert_string_equal(r.stop[1], "yz");
    assert_int_equal(r.stream, 1);
    assert_int_equal(r.include_usage, 1);
    assert_string_equal(r.effort, "low");
    openai_request_free(&r);

    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                                        "\"reasoning_effort\":\"none\",\"stop\":\"S\"}", &r, &e), 0);
    assert_int_equal(r.thinking, 0);
    assert_int_equal(r.n_stop, 1);
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                                        "\"chat_template_kwargs\":{\"thinking\":false}}", &r, &e), 0);
    assert_int_equal(r.thinking, 0);
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                                        "\"reasoning_effort\":\"xhigh\"}", &r, &e), 0);
    assert_string_equal(r.effort, "max");
    openai_request_free(&r);
}

/* What off-the-shelf clients send with values that ask for nothing, and the
 * sampling fields people use. */
static void test_client_fields(void **state)
{
    openai_request r;
    openai_error e;
    (void)state;
    assert_int_equal(parse(OPENAI_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
        "\"content\":\"a\",\"tool_calls\":[]}],\"tools\":[],\"tool_choice\":\"none\",\"store\":false,"
        "\"metadata\":{\"k\":\"v\"},\"response_format\":{\"type\":\"text\"},"
        "\"parallel_tool_calls\":true,\"logprobs\":false,\"top_logprobs\":0}", &r, &e), 0);
    assert_int_equal(r.logprobs, 0);
    assert_int_equal(r.n_msgs, 2);
    openai_request_free(&r);

    assert_int_equal(parse(OPENAI_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"top_k\":40,\"min_p\":0.05,"
        "\"repetition_penalty\":1.1,\"presence_penalty\":-0.5,\"frequency_penalty\":1.5,"
        "\"min_tokens\":3,\"max_tokens\":9,\"stop_token_ids\":[7,8],\"logprobs\":true,"
        "\"top_logprobs\":5}", &r, &e), 0);
    assert_int_equal(r.top_k, 40);
    assert_true(r.min_p == 0.05 && r.repetition_penalty == 1.1);
    assert_true(r.presence_penalty == -0.5 && r.frequency_penalty == 1.5);
    assert_int_equal(r.min_tokens, 3);
    assert_int_equal(r.n_stop_ids, 2);
    assert_int_equal(r.stop_ids[1], 8);
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.top_logprobs, 5);
    openai_request_free(&r);

    /* defaults: every knob off */
    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
                                        "\"top_k\":-1}", &r, &e), 0);
    assert_int_equal(r.top_k, 0);
    assert_true(r.min_p == 0 && r.repetition_penalty == 1 && r.presence_penalty == 0);
    assert_int_equal(r.logprobs + r.top_logprobs + (int)r.n_stop_ids + (int)r.min_tokens, 0);
    openai_request_free(&r);

    /* completions: logprobs is a count; false or 0 ask for the token alone or nothing */
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":3,\"best_of\":1}",
                           &r, &e), 0);
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.top_logprobs, 3);
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":0}", &r, &e), 0);
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.top_logprobs, 0);
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":false}", &r, &e), 0);
    assert_int_equal(r.logprobs, 0);
    openai_request_free(&r);
}

static void test_refusals(void **state)
{
    (void)state;
#define M "\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]"
    refused(OPENAI_CHAT, "{" M ",\"logit_bias\":{}}", "logit_bias");
    refused(OPENAI_CHAT, "{" M ",\"tools\":[{\"type\":\"function\"}]}", "tools");
    refused(OPENAI_CHAT, "{" M ",\"tool_choice\":\"required\"}", "tool_choice");
    refused(OPENAI_CHAT, "{" M ",\"store\":true}", "store");
    refused(OPENAI_CHAT, "{" M ",\"metadata\":{\"a\":1}}", "metadata");
    refused(OPENAI_CHAT, "{" M ",\"response_format\":{\"type\":\"json_object\"}}", "response_format");
    refused(OPENAI_CHAT, "{" M ",\"parallel_tool_calls\":\"yes\"}", "parallel_tool_calls");
    refused(OPENAI_CHAT, "{" M ",\"top_k\":-2}", "top_k");
    refused(OPENAI_CHAT, "{" M ",\"min_p\":1.5}", "min_p");
    refused(OPENAI_CHAT, "{" M ",\"repetition_penalty\":0}", "repetition_penalty");
    refused(OPENAI_CHAT, "{" M ",\"frequency_penalty\":2.5}", "frequency_penalty");
    refused(OPENAI_CHAT, "{" M ",\"stop_token_ids\":[1,-1]}", "stop_token_ids");
    refused(OPENAI_CHAT, "{" M ",\"min_tokens\":5,\"max_tokens\":4}", "min_tokens");
    refused(OPENAI_CHAT, "{" M ",\"top_logprobs\":3}", "top_logprobs");
    refused(OPENAI_CHAT, "{" M ",\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs");
    refused(OPENAI_CHAT, "{" M ",\"logprobs\":1}", "logprobs");
    refused(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs");
    refused(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":21}", "logprobs");
    refused(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"best_of\":2}", "best_of");
    refused(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"tools\":[]}", "tools");
    refused(OPENAI_CHAT, "{" M ",\"prompt\":\"x\"}", "prompt");
    refused(OPENAI_CHAT, "{" M ",\"n\":2}", "n");
    refused(OPENAI_CHAT, "{" M ",\"temperature\":2.5}", "temperature");
    refused(OPENAI_CHAT, "{" M ",\"temperature\":\"hot\"}", "temperature");
    refused(OPENAI_CHAT, "{" M ",\"top_p\":-0.1}", "top_p");
    refused(OPENAI_CHAT, "{" M ",\"max_tokens\":0}", "max_tokens");
    refused(OPENAI_CHAT, "{" M ",\"max_tokens\":1.5}", "max_tokens");
    refused(OPENAI_CHAT, "{" M ",\"seed\":1.5}", "seed");
    refused(OPENAI_CHAT, "{" M ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop");
    refused(OPENAI_CHAT, "{" M ",\"stop\":[1]}", "stop");
    refused(OPENAI_CHAT, "{" M ",\"stream\":1}", "stream");
    refused(OPENAI_CHAT, "{" M ",\"stream_options\":{\"include_usage\":true}}", "stream_options");
    refused(OPENAI_CHAT, "{" M ",\"stream\":true,\"stream_options\":{\"x\":1}}", "stream_options");
    refused(OPENAI_CHAT, "{" M ",\"reasoning_effort\":\"extreme\"}", "reasoning_effort");
    refused(OPENAI_CHAT, "{" M ",\"chat_template_kwargs\":{\"foo\":1}}", "chat_template_kwargs");
    refused(OPENAI_CHAT, "{" M ",\"echo\":false}", "echo");
    refused(OPENAI_CHAT, "{\"messages\":[]}", "messages");
    refused(OPENAI_CHAT, "{}", "messages");
    refused(OPENAI_CHAT, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].role");
    refused(OPENAI_CHAT, "{\"messages\":[{\"content\":\"x\"}]}", "messages[0].role");
    refused(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content");
    refused(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":null}]}", "messages[0].content");
    refused(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"b\"}]}",
            "messages[0].name");
    refused(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
                         "\"image_url\":{}}]}]}", "messages[0].content");
    refused(OPENAI_CHAT, "{\"messages\":[1]}", "messages[0]");
    refused(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"messages\":[]}", "messages");
    refused(OPENAI_COMPLETION, "{\"prompt\":\"\"}", "prompt");
    refused(OPENAI_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
    refused(OPENAI_COMPLETION, "{\"prompt\":[[1,2]]}", "prompt");
    refused(OPENAI_COMPLETION, "{\"prompt\":[1,-2]}", "prompt");
    refused(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", "echo");
    refused(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"suffix\":\"y\"}", "suffix");
    refused(OPENAI_COMPLETION, "{\"max_tokens\":3}", "prompt");
#undef M
}

static void test_malformed(void **state)
{
    openai_request r;
    openai_error e;
    (void)state;
    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":", &r, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "");
    assert_non_null(strstr(e.message, "parse"));
    assert_int_equal(parse(OPENAI_CHAT, "[1]", &r, &e), -1);
    assert_int_equal(e.status, 400);
    assert_int_equal(openai_request_parse(OPENAI_CHAT, "", 0, &r, &e), -1);
    /* a parse error quoting bytes that are not UTF-8 still goes back as JSON */
    {
        static const char body[] = "{\"\\\xdc\x9c\\\\nul\xff\xfe";
        shoal_buf out;
        shoal_json *j;
        assert_int_equal(openai_request_parse(OPENAI_CHAT, body, sizeof body - 1, &r, &e), -1);
        shoal_buf_init(&out, 0);
        assert_int_equal(openai_error_json(&e, &out), 0);
        j = shoal_json_parse((const char *)out.data, out.len, NULL);
        assert_non_null(j);
        shoal_json_free(j);
        shoal_buf_free(&out);
    }
}

static void test_completion_prompts(void **state)
{
    openai_request r;
    openai_error e;
    (void)state;
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":null}", &r, &e), 0);
    assert_int_equal(r.prompt_len, 3);
    assert_int_equal(r.max_tokens, 16);     /* the API's default */
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":[\"a\\u0000b\"]}", &r, &e), -1);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":[\"ab\"],\"echo\":false,\"logprobs\":null}",
                           &r, &e), 0);
    assert_int_equal(r.prompt_len, 2);
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":[5,4294967295]}", &r, &e), 0);
    assert_int_equal(r.n_prompt_ids, 2);
    assert_true(r.prompt_ids[1] == 4294967295u);
    assert_null(r.prompt);
    openai_request_free(&r);
}

static shoal_json *parse_json(const shoal_buf *b)
{
    shoal_err err;
    shoal_json *j = shoal_json_parse((const char *)b->data, b->len, &err);
    if (!j)
        fail_msg("bad JSON: %.*s", (int)b->len, (const char *)b->data);
    return j;
}

static void test_replies(void **state)
{
    openai_reply_info ri = { .id = "chatcmpl-1", .model = "tiny", .created = 5, .prompt_tokens = 10,
                             .completion_tokens = 3, .cached_tokens = 4, .finish_reason = "stop" };
    shoal_buf b;
    shoal_json *j;
    const char *s;
    int64_t v;
    (void)state;

    shoal_buf_init(&b, 0);
    assert_int_equal(openai_chat_json(&ri, "hi\"", 3, "think", 5, &b), 0);
    j = parse_json(&b);
    assert_int_equal(shoal_json_str(j, "object", &s, NULL), 0);
    assert_string_equal(s, "chat.completion");
    assert_string_equal(shoal_json_str_value(shoal_json_path(shoal_json_array_at(
                            shoal_json_get(j, "choices"), 0), "message.content")), "hi\"");
    assert_string_equal(shoal_json_str_value(shoal_json_path(shoal_json_array_at(
                            shoal_json_get(j, "choices"), 0), "message.reasoning_content")), "think");
    assert_int_equal(shoal_json_int(j, "usage.total_tokens", &v, NULL), 0);
    assert_int_equal(v, 13);
    assert_int_equal(shoal_json_int(j, "usage.prompt_tokens_details.cached_tokens", &v, NULL), 0);
    assert_int_equal(v, 4);
    shoal_json_free(j);

    /* no reasoning: the key is absent */
    shoal_buf_reset(&b);
    assert_int_equal(openai_chat_json(&ri, "", 0, NULL, 0, &b), 0);
    assert_null(strstr((const char *)b.data, "reasoning_content"));

    /* chunks are SSE events */
    shoal_buf_reset(&b);
    ri.finish_reason = NULL;
    assert_int_equal(openai_chat_chunk(&ri, 1, "", 0, NULL, 0, 1, &b), 0);
    assert_int_equal(strncmp((const char *)b.data, "data: {", 7), 0);
    assert_int_equal(strcmp((const char *)b.data + b.len - 2, "\n\n"), 0);
    assert_non_null(strstr((const char *)b.data, "\"role\":\"assistant\""));
    assert_non_null(strstr((const char *)b.data, "\"usage\":null"));
    assert_non_null(strstr((const char *)b.data, "\"finish_reason\":null"));
    shoal_buf_reset(&b);
    assert_int_equal(openai_usage_chunk(&ri, 1, &b), 0);
    assert_non_null(strstr((const char *)b.data, "\"choices\":[]"));
    assert_non_null(strstr((const char *)b.data, "\"completion_tokens\":3"));
    shoal_buf_reset(&b);
    ri.finish_reason = "length";
    assert_int_equal(openai_completion_chunk(&ri, "x", 1, 0, &b), 0);
    assert_non_null(strstr((const char *)b.data, "\"finish_reason\":\"length\""));
    assert_null(strstr((const char *)b.data, "usage"));
    shoal_buf_reset(&b);
    assert_int_equal(openai_done_event(&b), 0);
    assert_string_equal((const char *)b.data, "data: [DONE]\n\n");

    /* errors */
    {
        openai_error e;
        openai_error_set(&e, 429, "rate_limit_exceeded", NULL, "queue_full", "busy %d", 1);
        shoal_buf_reset(&b);
        assert_int_equal(openai_error_json(&e, &b), 0);
        assert_string_equal((const char *)b.data, "{\"error\":{\"message\":\"busy 1\",\"type\":"
                            "\"rate_limit_exceeded\",\"param\":null,\"code\":\"queue_full\"}}");
    }
    shoal_buf_reset(&b);
    assert_int_equal(openai_models_json("tiny", 0, &b), 0);
    j = parse_json(&b);
    assert_string_equal(shoal_json_str_value(shoal_json_get(shoal_json_array_at(
                            shoal_json_get(j, "data"), 0), "id")), "tiny");
    shoal_json_free(j);
    shoal_buf_free(&b);
}

/* logprobs in OpenAI's two shapes, and null when not asked */
static void test_logprob_shapes(void **state)
{
    static const uint8_t hel[] = "Hel", lo[] = "lo", half[] = { 0xE2, 0x82 };
    openai_lp_list l = { 0 }, rs = { 0 };
    openai_lp_token t = { .tok = { hel, 3, -0.5f }, .text_offset = 0, .n_top = 2,
                          .top = { { hel, 3, -0.5f }, { lo, 2, -INFINITY } } };
    openai_reply_info ri = { .id = "x", .model = "m", .created = 1, .finish_reason = "stop" };
    shoal_buf b;
    shoal_json *j, *c0;
    double d;
    (void)state;

    assert_int_equal(openai_lp_push(&l, &t), 0);
    t = (openai_lp_token){ .tok = { half, 2, -2.25f }, .text_offset = 3, .n_top = 0 };
    assert_int_equal(openai_lp_push(&l, &t), 0);
    shoal_buf_init(&b, 0);

    /* chat: content[] entries with bytes and top_logprobs; -inf as -9999 */
    ri.lp = &l;
    assert_int_equal(openai_chat_json(&ri, "Hel", 3, NULL, 0, &b), 0);
    j = parse_json(&b);
    c0 = shoal_json_array_at(shoal_json_path(shoal_json_array_at(shoal_json_get(j, "choices"), 0),
                                             "logprobs.content"), 0);
    assert_string_equal(shoal_json_str_value(shoal_json_get(c0, "token")), "Hel");
    assert_int_equal(shoal_json_num(c0, "logprob", &d, NULL), 0);
    assert_true(d == -0.5);
    assert_int_equal(shoal_json_array_size(shoal_json_get(c0, "bytes")), 3);
    assert_int_equal(shoal_json_int_value(shoal_json_array_at(shoal_json_get(c0, "bytes"), 0)), 'H');
    assert_int_equal(shoal_json_num(shoal_json_array_at(shoal_json_get(c0, "top_logprobs"), 1),
                                    "logprob", &d, NULL), 0);
    assert_true(d == -9999.0);
    /* a token that is half a character: U+FFFD as text, the bytes exact */
    c0 = shoal_json_array_at(shoal_json_path(shoal_json_array_at(shoal_json_get(j, "choices"), 0),
                                             "logprobs.content"), 1);
    assert_string_equal(shoal_json_str_value(shoal_json_get(c0, "token")), "\xEF\xBF\xBD");
    assert_int_equal(shoal_json_int_value(shoal_json_array_at(shoal_json_get(c0, "bytes"), 1)), 0x82);
    shoal_json_free(j);

    /* with reasoning: a second list beside content */
    ri.lp_reasoning = &rs;
    shoal_buf_reset(&b);
    assert_int_equal(openai_chat_chunk(&ri, 0, "x", 1, NULL, 0, 0, &b), 0);
    assert_non_null(strstr((const char *)b.data, "\"reasoning_content\":[]"));
    ri.lp_reasoning = NULL;

    /* completions: the legacy arrays; top_logprobs dicts hold the sampled token */
    shoal_buf_reset(&b);
    assert_int_equal(openai_completion_json(&ri, "Hel", 3, &b), 0);
    j = parse_json(&b);
    c0 = shoal_json_path(shoal_json_array_at(shoal_json_get(j, "choices"), 0), "logprobs");
    assert_int_equal(shoal_json_array_size(shoal_json_get(c0, "tokens")), 2);
    assert_int_equal(shoal_json_int_value(shoal_json_array_at(shoal_json_get(c0, "text_offset"), 1)), 3);
    assert_int_equal(shoal_json_num(shoal_json_array_at(shoal_json_get(c0, "top_logprobs"), 0),
                                    "lo", &d, NULL), 0);
    assert_true(d == -9999.0);
    assert_int_equal(shoal_json_object_size(shoal_json_array_at(shoal_json_get(c0, "top_logprobs"), 1)), 1);
    shoal_json_free(j);

    /* not asked: null */
    ri.lp = NULL;
    shoal_buf_reset(&b);
    assert_int_equal(openai_completion_chunk(&ri, "x", 1, 0, &b), 0);
    assert_non_null(strstr((const char *)b.data, "\"logprobs\":null"));
    shoal_buf_free(&b);
    openai_lp_list_free(&l);
    openai_lp_list_free(&rs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_defaults),
        cmocka_unit_test(test_chat_fields),
        cmocka_unit_test(test_client_fields),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_logprob_shapes),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_completion_prompts),
        cmocka_unit_test(test_replies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
