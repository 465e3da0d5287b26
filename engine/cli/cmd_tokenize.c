/* cmd_tokenize.c — `shoal-engine tokenize`: the tokenizer from the shell.
 *
 * Owns: option parsing, reading stdin line by line (or whole), printing ids
 * or text.  Does not own tokenization (tokenizer.c and friends).
 *
 * A line's own '\n' is not part of its text (a '\r' before it is).  For
 * text that holds newlines use --whole (all of stdin is one text) or
 * --in-json (each line is one JSON string literal, e.g. "a\nb").
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/err.h"
#include "common/json.h"
#include "common/sys.h"
#include "common/cli.h"
#include "engine/cli/cli_int.h"
#include "engine/text/text.h"

#define INPUT_MAX ((size_t)1 << 31)

typedef struct tok_opts {
    const char *model_dir;
    const char *vocab;
    const char *pattern;
    const char *config;
    uint32_t    vocab_size;
    int         specials;
    int         no_slice;
    int         json;
    int         whole;
    int         in_json;
    int         decode;
    const char *bench;
    unsigned    repeat;
} tok_opts;

enum { T_VOCAB = 1, T_PATTERN, T_CONFIG, T_VOCAB_SIZE, T_BENCH, T_REPEAT, T_SPECIALS, T_NO_SLICE,
       T_JSON, T_WHOLE, T_IN_JSON, T_DECODE };

static const shoal_cli_opt TOK_OPTS[] = {
    { "vocab", 0, "FILE", T_VOCAB, "a tiktoken-format vocabulary (base64 SP rank per line)" },
    { "pattern", 0, "P", T_PATTERN, "k3 | o200k | cl100k | any regex (default k3)" },
    { "config", 0, "FILE", T_CONFIG, "tokenizer_config.json for the special tokens (with --vocab)" },
    { "vocab-size", 0, "N", T_VOCAB_SIZE, "end of the reserved special range (default: highest\n"
                                          "listed + 1)" },
    { "specials", 0, NULL, T_SPECIALS, "recognise special tokens' spellings in the text" },
    { "no-slice", 0, NULL, T_NO_SLICE, "do not cut long texts and runs as K3's tokenizer does\n"
                                       "(plain tiktoken; differs only past 400,000 characters or\n"
                                       "on runs of one class over 25,000)" },
    { "json", 0, NULL, T_JSON, "print each result as a JSON array (ids) or string (--decode)" },
    { "whole", 0, NULL, T_WHOLE, "encode all of stdin as one text, newlines included" },
    { "in-json", 0, NULL, T_IN_JSON, "each input line is a JSON string literal" },
    { "decode", 0, NULL, T_DECODE, "input lines are ids (spaces, commas, brackets allowed);\n"
                                   "prints the text (invalid UTF-8 replaced by U+FFFD)" },
    { "bench", 0, "FILE", T_BENCH, "encode FILE --repeat times and print the best time:\n"
                                   "'bytes B tokens T seconds S mb_per_s R'" },
    { "repeat", 0, "N", T_REPEAT, "--bench repetitions (1..1000, default 5)" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec TOK_SPEC = {
    .prog = "shoal-engine tokenize",
    .synopsis = "shoal-engine tokenize [MODEL_DIR | --vocab FILE [--pattern P] [--config FILE]\n"
                "                      [--vocab-size N]] [--specials] [--no-slice] [--json]\n"
                "                      [--whole | --in-json] [--decode]\n"
                "shoal-engine tokenize ... --bench FILE [--repeat N]",
    .about = "Reads text from stdin and prints the token ids of each input line,\n"
             "space-separated, one output line per input line.  The line's own newline\n"
             "is not part of its text.  MODEL_DIR: a model directory (tiktoken.model,\n"
             "tokenizer_config.json, config.json's vocab_size; the k3 pattern).",
    .opts = TOK_OPTS,
};

static int parse_u32(const char *s, uint32_t *out)
{
    char *end;
    unsigned long long v;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v > UINT32_MAX)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

/* 0 ok, 1 --help printed, 2 usage error (message printed). */
static int opts_parse(int argc, char **argv, tok_opts *o)
{
    shoal_cli_parser p;
    const char *v;
    uint32_t r;
    int id;

    memset(o, 0, sizeof *o);
    o->repeat = 5;
    shoal_cli_begin(&p, &TOK_SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case T_VOCAB:    o->vocab = v; break;
        case T_PATTERN:  o->pattern = v; break;
        case T_CONFIG:   o->config = v; break;
        case T_BENCH:    o->bench = v; break;
        case T_SPECIALS: o->specials = 1; break;
        case T_NO_SLICE: o->no_slice = 1; break;
        case T_JSON:     o->json = 1; break;
        case T_WHOLE:    o->whole = 1; break;
        case T_IN_JSON:  o->in_json = 1; break;
        case T_DECODE:   o->decode = 1; break;
        case T_VOCAB_SIZE:
            if (parse_u32(v, &o->vocab_size))
                return shoal_cli_bad_value(&p, v, "a token count");
            break;
        case T_REPEAT:
            if (parse_u32(v, &r) || r == 0 || r > 1000)
                return shoal_cli_bad_value(&p, v, "1..1000");
            o->repeat = r;
            break;
        }
    }
    if (id < 0)
        return p.exit == 0 ? 1 : p.exit;
    if (argc - p.optind > 1)
        return shoal_cli_usage_error(&TOK_SPEC, "one MODEL_DIR at most");
    if (p.optind < argc)
        o->model_dir = argv[p.optind];
    if (!!o->model_dir == !!o->vocab) {
        fprintf(stderr, "tokenize: give either MODEL_DIR or --vocab FILE (see --help)\n");
        return 2;
    }
    if (o->model_dir && (o->pattern || o->config || o->vocab_size)) {
        fprintf(stderr, "tokenize: --pattern, --config and --vocab-size go with --vocab\n");
        return 2;
    }
    if (o->whole && o->in_json) {
        fprintf(stderr, "tokenize: --whole and --in-json exclude each other\n");
        return 2;
    }
    return 0;
}

static int open_tokenizer(const tok_opts *o, tokenizer **t, shoal_err *err)
{
    int rc;
    if (o->model_dir)
        return tokenizer_model_open(t, o->model_dir, err);
    if ((rc = tokenizer_load(t, o->vocab, o->pattern ? o->pattern : "k3", err)))
        return rc;
    if (o->config)
        rc = tokenizer_specials_load(*t, o->config, o->vocab_size, err);
    else if (o->vocab_size)
        rc = tokenizer_specials_parse(*t, NULL, 0, o->vocab_size, err);
    if (rc) {
        tokenizer_free(*t);
        *t = NULL;
    }
    return rc;
}

static int enc_flags(const tok_opts *o)
{
    return (o->specials ? TOKENIZER_ALLOW_SPECIALS : 0) | (o->no_slice ? TOKENIZER_NO_SLICE : 0);
}

/* ---- one record ----------------------------------------------------------- */

static int print_ids(const tokenizer_ids *ids, int json, shoal_buf *line)
{
    int rc = 0;
    shoal_buf_reset(line);
    if (json)
        rc = shoal_buf_append(line, "[", 1);
    for (size_t i = 0; i < ids->n && rc == 0; i++)
        rc = shoal_buf_appendf(line, "%s%" PRIu32, i ? (json ? "," : " ") : "", ids->v[i]);
    if (rc == 0 && json)
        rc = shoal_buf_append(line, "]", 1);
    if (rc == 0)
        rc = shoal_buf_append(line, "\n", 1);
    if (rc == 0 && fwrite(line->data, 1, line->len, stdout) != line->len)
        rc = SHOAL_EIO;
    return rc;
}

/* Parse "1 2 3", "1,2,3" or "[1, 2, 3]". */
static int parse_id_list(const char *s, size_t n, tokenizer_ids *ids, shoal_err *err)
{
    size_t i = 0;
    while (i < n) {
        uint64_t v = 0;
        size_t d = 0;
        if (strchr(" \t\r,[]", s[i])) {
            i++;
            continue;
        }
        while (i < n && s[i] >= '0' && s[i] <= '9' && d < 11)
            v = v * 10 + (uint64_t)(s[i++] - '0'), d++;
        if (d == 0 || v > UINT32_MAX || (i < n && !strchr(" \t\r,[]", s[i])))
            return shoal_err_set(err, SHOAL_EINVAL, "bad token id list near '%.20s'", s + i);
        if (tokenizer_ids_push(ids, (uint32_t)v))
            return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    }
    return 0;
}

static int do_decode(const tokenizer *t, const tok_opts *o, const char *s, size_t n,
                     shoal_buf *line, shoal_err *err)
{
    tokenizer_ids ids = { 0 };
    shoal_buf text;
    int rc;
    shoal_buf_init(&text, 0);
    shoal_buf_reset(line);
    if ((rc = parse_id_list(s, n, &ids, err)) == 0 &&
        (rc = tokenizer_decode(t, ids.v, ids.n, 0, &text, err)) == 0) {
        if (o->json) {
            shoal_json *j = shoal_json_new_strn(text.data ? (char *)text.data : "", text.len);
            rc = j ? shoal_json_dump(j, SHOAL_JSON_COMPACT, line) : SHOAL_ENOMEM;
            shoal_json_free(j);
        } else {
            rc = shoal_buf_append(line, text.data, text.len);
        }
        if (rc == 0)
            rc = shoal_buf_append(line, "\n", 1);
        if (rc == 0 && fwrite(line->data, 1, line->len, stdout) != line->len)
            rc = SHOAL_EIO;
        if (rc)
            shoal_err_set(err, rc, "output: %s", shoal_strerror(rc));
    }
    tokenizer_ids_free(&ids);
    shoal_buf_free(&text);
    return rc;
}

/* One input record (a line without its '\n', or all of stdin). */
static int do_record(const tokenizer *t, const tok_opts *o, const char *s, size_t n,
                     shoal_buf *line, shoal_err *err)
{
    tokenizer_ids ids = { 0 };
    shoal_json *arr = NULL;
    int rc = 0;

    if (o->in_json) {
        /* Wrapped in [] because the JSON layer parses documents, not bare
         * strings. */
        shoal_buf_reset(line);
        if ((rc = shoal_buf_append(line, "[", 1)) || (rc = shoal_buf_append(line, s, n)) ||
            (rc = shoal_buf_append(line, "]", 1)))
            return shoal_err_set(err, rc, "out of memory");
        arr = shoal_json_parse((const char *)line->data, line->len, err);
        shoal_json *str = arr ? shoal_json_array_at(arr, 0) : NULL;
        if (!str || shoal_json_array_size(arr) != 1 || shoal_json_typeof(str) != SHOAL_JSON_STRING) {
            shoal_json_free(arr);
            return shoal_err_set(err, SHOAL_EINVAL, "--in-json: the line is not one JSON string");
        }
        s = shoal_json_str_value(str);
        n = shoal_json_str_len(str);
    }
    if (o->decode)
        rc = do_decode(t, o, s, n, line, err);
    else if ((rc = tokenizer_encode(t, s, n, enc_flags(o), &ids, err)) == 0 &&
             (rc = print_ids(&ids, o->json, line)))
        shoal_err_set(err, rc, "output: %s", shoal_strerror(rc));
    tokenizer_ids_free(&ids);
    shoal_json_free(arr);
    return rc;
}

static int run_lines(const tokenizer *t, const tok_opts *o, shoal_err *err)
{
    char *buf = NULL;
    size_t cap = 0;
    ssize_t got;
    shoal_buf line;
    int rc = 0;

    shoal_buf_init(&line, 0);
    if (o->whole) {
        shoal_buf all;
        shoal_buf_init(&all, INPUT_MAX);
        if ((rc = shoal_read_file("/dev/stdin", INPUT_MAX, &all, err)) == 0)
            rc = do_record(t, o, all.data ? (char *)all.data : "", all.len, &line, err);
        shoal_buf_free(&all);
    } else {
        while (rc == 0 && (got = getline(&buf, &cap, stdin)) >= 0) {
            size_t n = (size_t)got;
            if (n && buf[n - 1] == '\n')
                n--;
            rc = do_record(t, o, buf, n, &line, err);
        }
        free(buf);
    }
    shoal_buf_free(&line);
    if (rc == 0 && fflush(stdout))
        rc = shoal_err_set(err, SHOAL_EIO, "writing stdout failed");
    return rc;
}

/* Encode the file `repeat` times; report the fastest run. */
static int run_bench(const tokenizer *t, const tok_opts *o, shoal_err *err)
{
    shoal_buf file;
    tokenizer_ids ids = { 0 };
    double best = 0;
    int rc;

    shoal_buf_init(&file, 0);
    if ((rc = shoal_read_file(o->bench, INPUT_MAX, &file, err)))
        return rc;
    for (unsigned r = 0; r < o->repeat && rc == 0; r++) {
        uint64_t t0 = shoal_now_ns();
        ids.n = 0;
        rc = tokenizer_encode(t, file.data ? (char *)file.data : "", file.len,
                              enc_flags(o), &ids, err);
        double s = (double)(shoal_now_ns() - t0) * 1e-9;
        if (r == 0 || s < best)
            best = s;
    }
    if (rc == 0)
        printf("bytes %zu tokens %zu seconds %.6f mb_per_s %.3f\n", file.len, ids.n, best,
               best > 0 ? (double)file.len / best / 1e6 : 0.0);
    tokenizer_ids_free(&ids);
    shoal_buf_free(&file);
    return rc;
}

int engine_cmd_tokenize(int argc, char **argv)
{
    tok_opts o;
    tokenizer *t = NULL;
    shoal_err err;
    int rc;

    shoal_err_clear(&err);
    if ((rc = opts_parse(argc, argv, &o)))
        return rc == 1 ? 0 : 2;
    if ((rc = open_tokenizer(&o, &t, &err)) == 0)
        rc = o.bench ? run_bench(t, &o, &err) : run_lines(t, &o, &err);
    tokenizer_free(t);
    if (rc) {
        fprintf(stderr, "tokenize: %s\n", err.msg[0] ? err.msg : shoal_strerror(rc));
        return 1;
    }
    return 0;
}
