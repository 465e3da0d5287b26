/* cmd_prompt.c — `shoal-engine run MODEL --prompt TEXT` (also reachable as
 * `shoal-engine prompt MODEL --prompt TEXT`): generate from text and stream
 * the reply to the terminal as it is produced.
 *
 * Owns: option parsing and terminal output.  Does not own rendering
 * (engine/text/), generation (engine/serve/) nor the model.
 *
 * Without --chat the text is the raw prompt (no BOS, specials are ordinary
 * text) and the continuation is printed.  With --chat the text is one user
 * message (after --system if given), rendered in K3's chat format; the
 * response goes to stdout and, in thinking mode, the reasoning to stderr
 * (so stdout holds the answer alone).
 *
 * On a terminal (docs/chat.md, "From the terminal"): stderr marks the
 * reasoning with a dim "thinking" header and the answer with a rule
 * before it (plain, without colour, under NO_COLOR), and control
 * characters the model produced (all but \n and \t, C1 controls too) are
 * shown escaped, so a reply cannot move the cursor or retitle the window.
 * Where stdout or stderr is not a terminal, its bytes are the model's, as
 * they were, and no marker is added: scripts read the text itself.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/log.h"
#include "common/path.h"
#include "engine/text/text.h"
#include "engine/cli/cli_int.h"
#include "engine/serve/serve.h"

typedef struct prompt_opts {
    cli_opts c;                  /* MODEL and every shared option */
    const char *prompt, *system, *effort;
    int chat, think;
    long max_tokens, seed;
    int has_seed;
    double temperature, top_p;
} prompt_opts;

enum { P_PROMPT = CLI_OWN, P_CHAT, P_SYSTEM, P_NO_THINK, P_EFFORT, P_MAX_TOKENS, P_TEMP, P_TOP_P,
       P_SEED };

static const cli_option PROMPT_OPTS[] = {
    { "prompt", 1, P_PROMPT }, { "chat", 0, P_CHAT }, { "system", 1, P_SYSTEM },
    { "no-think", 0, P_NO_THINK }, { "effort", 1, P_EFFORT }, { "max-tokens", 1, P_MAX_TOKENS },
    { "temperature", 1, P_TEMP }, { "top-p", 1, P_TOP_P }, { "seed", 1, P_SEED },
    { NULL, 0, 0 },
};

static void usage(FILE *f)
{
    fputs("usage: shoal-engine run MODEL --prompt TEXT [options]\n"
          "\n"
          "Generates from TEXT and streams the text to stdout as it is produced.\n"
          "The memory plan is printed on stderr first.\n"
          "\n"
          "  --chat              TEXT is a user message in K3's chat format\n"
          "  --system TEXT       a system message first (with --chat)\n"
          "  --no-think          thinking off (with --chat; default on, reasoning\n"
          "                      printed to stderr)\n"
          "  --effort E          thinking effort: low|medium|high|max (default max)\n"
          "  --max-tokens N      most tokens to generate (default 256)\n"
          "  --temperature T     0 (default) is greedy\n"
          "  --top-p P           nucleus sampling mass (default 1)\n"
          "  --seed S            sampling seed (default: from the clock)\n", f);
}

static int prompt_own(void *ctx, int id, const char *val)
{
    prompt_opts *o = ctx;
    double v;

    switch (id) {
    case P_PROMPT: o->prompt = val; return 0;
    case P_CHAT: o->chat = 1; return 0;
    case P_SYSTEM: o->system = val; return 0;
    case P_NO_THINK: o->think = 0; return 0;
    case P_EFFORT: o->effort = val; return 0;
    case P_TEMP: return cli_number(val, 0, 2, &o->temperature);
    case P_TOP_P: return cli_number(val, 0, 1, &o->top_p);
    case P_MAX_TOKENS:
        if (cli_number(val, 1, 1 << 20, &v) != 0 || v != (long)v)
            return -1;
        o->max_tokens = (long)v;
        return 0;
    case P_SEED:
        if (cli_number(val, 0, 9.0e15, &v) != 0 || v != (long)v)
            return -1;
        o->seed = (long)v;
        o->has_seed = 1;
        return 0;
    }
    return -1;
}

/* 0 ok, 1 help printed, 2 usage error printed. */
static int parse_args(int argc, char **argv, prompt_opts *o)
{
    int rc;

    memset(o, 0, sizeof *o);
    cli_opts_init(&o->c);
    o->think = 1;
    o->effort = "max";
    o->max_tokens = 256;
    o->top_p = 1;
    if ((rc = cli_parse("run", argc, argv, PROMPT_OPTS, prompt_own, o, usage, &o->c)) != 0)
        return rc;
    if (!o->prompt) {
        fprintf(stderr, "run: --prompt TEXT is needed (see --help)\n");
        return 2;
    }
    return 0;
}

typedef struct out_ctx {
    const tokenizer *tok;
    chat_parser *parser;       /* chat */
    tokenizer_stream *ts;      /* raw */
    shoal_buf r, c;
    size_t reasoning_bytes, answer_bytes;
    int tty_out, tty_err;      /* stdout / stderr is a terminal */
    int color;                 /* ANSI dim for the reasoning (a terminal, no NO_COLOR) */
} out_ctx;

#define DIM "\033[2m"
#define UNDIM "\033[22m"

/* Write p[0..n) to f; on a terminal, control characters escaped (\n and \t
 * pass): C0 and DEL as \xHH, C1 (U+0080..U+009F, C2 80..C2 9F in UTF-8) as
 * \uHHHH.  The detokenizer never splits a character, so neither can a
 * chunk. */
static void term_write(FILE *f, const uint8_t *p, size_t n, int tty)
{
    size_t from = 0;
    if (!tty) {
        fwrite(p, 1, n, f);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int c0 = (p[i] < 0x20 && p[i] != '\n' && p[i] != '\t') || p[i] == 0x7f;
        int c1 = p[i] == 0xC2 && i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9F;
        if (!c0 && !c1)
            continue;
        fwrite(p + from, 1, i - from, f);
        if (c0)
            fprintf(f, "\\x%02x", p[i]);
        else
            fprintf(f, "\\u%04x", p[++i]);
        from = i + 1;
    }
    fwrite(p + from, 1, n - from, f);
}

static void print_bufs(out_ctx *oc)
{
    if (oc->r.len) {
        if (oc->reasoning_bytes == 0 && oc->tty_err)
            fputs(oc->color ? DIM "── thinking ──\n" : "── thinking ──\n", stderr);
        term_write(stderr, oc->r.data, oc->r.len, oc->tty_err);
        fflush(stderr);
        oc->reasoning_bytes += oc->r.len;
    }
    if (oc->c.len) {
        if (oc->answer_bytes == 0 && oc->reasoning_bytes > 0 && oc->tty_err)
            fputs(oc->color ? "\n" UNDIM "── answer ──\n" : "\n── answer ──\n", stderr);
        fflush(stderr);
        term_write(stdout, oc->c.data, oc->c.len, oc->tty_out);
        fflush(stdout);
        oc->answer_bytes += oc->c.len;
    }
    shoal_buf_reset(&oc->r);
    shoal_buf_reset(&oc->c);
}

static int on_token(void *ctx, const gen_token *t)
{
    out_ctx *oc = ctx;
    uint32_t id = t->id;
    shoal_err err;
    int rc = 0;

    if (t->is_eos)
        return 0;
    if (oc->parser)
        rc = chat_parser_push(oc->parser, id, &oc->r, &oc->c, &err);
    else if (!tokenizer_is_special(oc->tok, id))
        rc = tokenizer_stream_push(oc->ts, id, &oc->c, &err);
    if (rc < 0)
        return rc;
    print_bufs(oc);
    return 0;
}

/* The prompt's ids: raw text, or the chat rendering. */
static int build_prompt(const prompt_opts *o, const tokenizer *tok, tokenizer_ids *ids,
                        shoal_err *err)
{
    chat_message m[2];
    size_t n = 0;
    chat_options co;
    chat_prompt p;
    int rc;

    if (!o->chat)
        return tokenizer_encode(tok, o->prompt, strlen(o->prompt), 0, ids, err);
    if (o->system)
        m[n++] = (chat_message){ CHAT_SYSTEM, o->system, strlen(o->system) };
    m[n++] = (chat_message){ CHAT_USER, o->prompt, strlen(o->prompt) };
    chat_options_default(&co);
    co.thinking = o->think;
    snprintf(co.effort, sizeof co.effort, "%s", o->effort);
    if ((rc = chat_render(tok, m, n, &co, &p, err)) != 0)
        return rc;
    *ids = p.ids;
    p.ids = (tokenizer_ids){ 0 };
    chat_prompt_free(&p);
    return 0;
}

int engine_cmd_prompt(int argc, char **argv)
{
    prompt_opts o;
    gen_model_options mo = { 0 };
    gen_model gm;
    gen_params gp;
    gen_result res;
    tokenizer_ids ids = { 0 };
    out_ctx oc;
    shoal_err err = { 0 };
    int rc;

    if ((rc = parse_args(argc, argv, &o)) != 0)
        return rc == 1 ? 0 : 2;
    if (cli_home("run", &o.c, &err) != 0)
        return 1;
    o.c.load.plan_out = stderr;
    o.c.load.progress = cli_progress;
    mo.load = &o.c.load;
    if ((rc = gen_model_open(o.c.model, &mo, &gm, &err)) != 0) {
        fprintf(stderr, "run: %s\n", err.msg);
        return 1;
    }
    memset(&oc, 0, sizeof oc);
    oc.tok = gm.tok;
    oc.tty_out = isatty(STDOUT_FILENO);
    oc.tty_err = isatty(STDERR_FILENO);
    /* the program's edge (https://no-color.org): lint: allow getenv */
    oc.color = oc.tty_err && !(getenv("NO_COLOR") && getenv("NO_COLOR")[0]);   /* lint: allow */
    shoal_buf_init(&oc.r, 0);
    shoal_buf_init(&oc.c, 0);
    rc = build_prompt(&o, gm.tok, &ids, &err);
    if (rc == 0 && ids.n + (size_t)o.max_tokens > gm.backend.n_ctx)
        rc = shoal_err_set(&err, SHOAL_ERANGE, "the prompt (%zu tokens) and --max-tokens %ld "
                           "need %zu positions; the context is %zu tokens (%s)", ids.n,
                           o.max_tokens, ids.n + (size_t)o.max_tokens, gm.backend.n_ctx,
                           gm.backend.n_ctx < (size_t)gm.model->cfg.max_positions
                               ? "the memory plan's cap: raise it with --context N, or give "
                                 "the run more memory" : "max_position_embeddings");
    if (rc == 0 && o.chat && !(oc.parser = chat_parser_new(gm.tok, o.think)))
        rc = shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
    if (rc == 0 && !o.chat && !(oc.ts = tokenizer_stream_new(gm.tok)))
        rc = shoal_err_set(&err, SHOAL_ENOMEM, "out of memory");
    if (rc == 0) {
        gen_params_default(&gp);
        gp.s.temperature = o.temperature;
        gp.s.top_p = o.top_p;
        gp.seed = (uint64_t)o.seed;
        gp.has_seed = o.has_seed;
        gp.max_tokens = (size_t)o.max_tokens;
        gp.eos = &gm.eos;
        gp.n_eos = 1;
        rc = generator_run(gm.gen, ids.v, ids.n, &gp, on_token, &oc, &res, &err);
    }
    if (rc == 0) {
        if (oc.parser)
            chat_parser_finish(oc.parser, &oc.r, &oc.c);
        else
            tokenizer_stream_flush(oc.ts, &oc.c);
        print_bufs(&oc);
        if (oc.color && oc.reasoning_bytes && !oc.answer_bytes)
            fputs(UNDIM, stderr);       /* the reasoning ran to the end */
        fputc('\n', stdout);
        if (o.c.stats)
            fprintf(stderr, "\nprompt %zu tokens, completion %zu tokens (%s); prefill %.3f s, "
                            "decode %.3f s (%.2f ms/token)\n",
                    res.prompt_tokens, res.completion_tokens, gen_finish_name(res.finish),
                    (double)res.prefill_ns * 1e-9, (double)res.decode_ns * 1e-9,
                    res.completion_tokens ? (double)res.decode_ns * 1e-6 / (double)res.completion_tokens : 0.0);
    } else {
        fprintf(stderr, "run: %s\n", err.msg);
    }
    chat_parser_free(oc.parser);
    tokenizer_stream_free(oc.ts);
    shoal_buf_free(&oc.r);
    shoal_buf_free(&oc.c);
    tokenizer_ids_free(&ids);
    gen_model_close(&gm);
    return rc == 0 ? 0 : 1;
}
