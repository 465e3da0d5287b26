/* main.c — mkmodel: write a synthetic K3-family model directory.
 *
 * Owns: the command line, the output directory (creation, the non-empty
 * check, --force cleanup) and choosing what to produce: the directory
 * (write.c writes it in order, the index last, so a directory without the
 * index is visibly incomplete), one file on stdout, or the digest table.
 * The model itself comes from synth/.  docs/mkmodel.md is the user's guide.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/err.h"
#include "common/log.h"
#include "common/path.h"
#include "common/sys.h"
#include "tools/mkmodel/mkmodel_int.h"

enum {
    OPT_OUT = 1, OPT_PRESET, OPT_SEED, OPT_LAYERS, OPT_EXPERTS, OPT_HEADERS_ONLY, OPT_STDOUT,
    OPT_ETAGS, OPT_JOBS, OPT_FORCE, OPT_QUIET,
};

static const shoal_cli_opt OPTS[] = {
    { "out", 0, "DIR", OPT_OUT, "output directory (created; must be empty unless --force)" },
    { "preset", 0, "tiny|slice|k3|oracle", OPT_PRESET,
      "tiny (k3.md section 6, default), slice (K3 expert sizes:\n"
      "17,547,264-byte experts, 4 layers x 32 experts, ~2.6 GB),\n"
      "k3 (the full checkpoint: 93 layers x 896 experts, 96 shards,\n"
      "~1.56 TB; use --headers-only, --layers, --experts) or\n"
      "oracle (tiny's files, constructed weights: its greedy\n"
      "continuation of \"" SYNTH_ORACLE_PROMPT "\" is\n"
      "\"" SYNTH_ORACLE_TEXT "\"\n"
      "only if the engine gets every part right; config.json\n"
      "\"oracle\" holds both; the seed moves only the filler)" },
    { "seed", 0, "N", OPT_SEED, "weight seed, 0..2^63-1 (default 0 = the k3.md section 6 values)" },
    { "layers", 0, "N", OPT_LAYERS, "number of layers; MLA on every 4th 1-based layer\n"
                                    "and on the last two, as K3" },
    { "experts", 0, "N", OPT_EXPERTS, "routed experts per MoE layer" },
    { "headers-only", 0, NULL, OPT_HEADERS_ONLY,
      "shards get their real headers and sizes as sparse files\n"
      "(holes for the data), for tools that read local snapshots" },
    { "stdout", 0, "FILE", OPT_STDOUT, "write only FILE of the model (e.g. model-00001-of-000003.\n"
                                       "safetensors) to stdout, no directory" },
    { "print-etags", 0, NULL, OPT_ETAGS, "print every file's size, sha256, git sha1 and probe as the\n"
                                         "rows of synth/k3_etags.inc (hashes the whole model)" },
    { "jobs", 0, "N", OPT_JOBS, "hashing threads for --print-etags (default: CPUs)" },
    { "force", 0, NULL, OPT_FORCE, "write into a non-empty DIR, replacing an earlier model" },
    { "quiet", 'q', NULL, OPT_QUIET, "no progress on stderr" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec SPEC = {
    .prog = "mkmodel",
    .summary = "write a synthetic Kimi-K3-family model",
    .synopsis = "mkmodel --out DIR [--preset tiny|slice|k3|oracle] [--seed N] [--layers N] [--experts N]\n"
                "        [--headers-only] [--force] [--quiet]\n"
                "mkmodel --stdout FILE [model options]\n"
                "mkmodel --print-etags [--jobs N] [model options]",
    .about = "Write a synthetic Kimi-K3-family model directory (config.json,\n"
             "tokenizer_config.json, tiktoken.model, model.safetensors.index.json and\n"
             "model-NNNNN-of-NNNNNN.safetensors shards) with deterministic weights, or one\n"
             "of its files on stdout, or its digest table.  A developer's tool\n"
             "(docs/mkmodel.md).",
    .opts = OPTS,
    .notes = "Progress goes to stderr: a bar on a terminal, a line every 5 s otherwise;\n"
             "--quiet or HF_HUB_DISABLE_PROGRESS_BARS=1 turn it off, NO_COLOR its colour.",
};

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v;
    errno = 0;
    if (!s || !*s || *s == '-')
        return -1;
    v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

/* 1 if dir holds anything, 0 if empty or missing, -1 on error. */
static int dir_nonempty(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int any = 0;
    if (!d)
        return errno == ENOENT ? 0 : -1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            any = 1;
    closedir(d);
    return any;
}

/* With --force: remove shards and partial files of an earlier run that this
 * run will not overwrite, so the directory holds one consistent model. */
static void stale_remove(const char *dir, const synth_model *m)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[SHOAL_PATH_MAX];
    if (!d)
        return;
    while ((e = readdir(d))) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        int shard = strncmp(n, "model-", 6) == 0 && len > 12 &&
                    strcmp(n + len - 12, ".safetensors") == 0;
        int partial = n[0] == '.' && len > 8 && strcmp(n + len - 8, ".partial") == 0;
        if (!shard && !partial)
            continue;
        int ours = shard && synth_file_find(m, n) >= 0;
        if (!ours && shoal_path_join(path, sizeof path, dir, n) == 0)
            unlink(path);
    }
    closedir(d);
}

typedef struct opts {
    const char *out, *cat;
    synth_preset preset;
    uint64_t seed, layers, experts, jobs;
    int force, quiet, headers_only, print_etags;
} opts;

/* -1 to go on, else the exit status. */
static int opts_parse(int argc, char **argv, opts *o)
{
    shoal_cli_parser p;
    const char *v;
    int id;

    memset(o, 0, sizeof *o);
    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case OPT_FORCE:        o->force = 1; break;
        case OPT_QUIET:        o->quiet = 1; break;
        case OPT_HEADERS_ONLY: o->headers_only = 1; break;
        case OPT_ETAGS:        o->print_etags = 1; break;
        case OPT_STDOUT:       o->cat = v; break;
        case OPT_OUT:          o->out = v; break;
        case OPT_JOBS:
            if (parse_u64(v, 256, &o->jobs) || o->jobs == 0)
                return shoal_cli_bad_value(&p, v, "1..256");
            break;
        case OPT_PRESET:
            if (synth_preset_parse(v, &o->preset))
                return shoal_cli_bad_value(&p, v, "tiny, slice, k3 or oracle");
            break;
        case OPT_SEED:
            if (parse_u64(v, INT64_MAX, &o->seed))
                return shoal_cli_bad_value(&p, v, "an integer in 0..2^63-1");
            break;
        case OPT_LAYERS:
            if (parse_u64(v, SYNTH_MAX_LAYERS, &o->layers) || o->layers == 0) {
                fprintf(stderr, "mkmodel: --layers must be 1..%d\n", SYNTH_MAX_LAYERS);
                return SHOAL_EXIT_USAGE;
            }
            break;
        case OPT_EXPERTS:
            if (parse_u64(v, SYNTH_MAX_EXPERTS, &o->experts) || o->experts == 0) {
                fprintf(stderr, "mkmodel: --experts must be 1..%d\n", SYNTH_MAX_EXPERTS);
                return SHOAL_EXIT_USAGE;
            }
            break;
        }
    }
    if (id < 0)
        return p.exit;
    if (p.optind < argc)
        return shoal_cli_usage_error(&SPEC, "unexpected argument '%s'", argv[p.optind]);
    if (!!o->out + !!o->cat + o->print_etags != 1)
        return shoal_cli_usage_error(&SPEC, "give one of --out DIR, --stdout FILE or "
                                     "--print-etags");
    return -1;
}

/* Write the model directory o->out. */
static int dir_write(const opts *o, const synth_model *model, shoal_meter *meter,
                     shoal_err *err)
{
    mk_progress pr = { 0, 0, meter, 0, 0 };
    char idx[SHOAL_PATH_MAX];
    int ne = dir_nonempty(o->out), rc;

    if (ne < 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", o->out, strerror(errno));
    if (ne && !o->force)
        return shoal_err_set(err, SHOAL_EEXIST, "%s is not empty (use --force to overwrite)",
                             o->out);
    if ((rc = shoal_mkdir_p(o->out, 0755, err)))
        return rc;
    if (o->force)
        stale_remove(o->out, model);
    /* A directory without its index is visibly incomplete: drop an old one
     * first; write.c writes the new one last. */
    if (shoal_path_join(idx, sizeof idx, o->out, "model.safetensors.index.json") == 0)
        unlink(idx);
    return mk_model_write(model, o->out, o->headers_only, &pr, err);
}

int main(int argc, char **argv)
{
    opts o;
    synth_config cfg;
    synth_model *model = NULL;
    shoal_err err = { 0 };
    shoal_meter_cfg mc;
    shoal_meter meter;
    int rc;

    shoal_log_setup("mkmodel", SHOAL_LOG_WARN, NULL);
    if ((rc = opts_parse(argc, argv, &o)) >= 0)
        return rc;
    shoal_meter_env_capture(&mc, o.quiet);
    shoal_meter_init(&meter, stderr, &mc, "mkmodel", SHOAL_METER_BYTES);
    synth_config_init(&cfg, o.preset);
    cfg.seed = o.seed;
    if ((rc = synth_config_finish(&cfg, (int)o.layers, (int)o.experts, &err))) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);   /* a flag the preset refuses */
        return 2;
    }
    if ((rc = synth_model_new(&cfg, &model, &err)))
        goto fail;
    if (o.print_etags) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        int jobs = o.jobs ? (int)o.jobs : cpus > 0 ? (int)cpus : 1;
        rc = mk_etags_print(model, jobs, &meter, &err);
    } else if (o.cat) {
        rc = mk_file_cat(model, o.cat, 1, &err);
    } else {
        rc = dir_write(&o, model, &meter, &err);
    }
    if (rc)
        goto fail;
    if (!o.quiet && o.out) {
        char sz[32];
        fprintf(stderr, "mkmodel: wrote %s model (seed %llu, %d layers, %d experts, %d shards, "
                "%zu tensors, %s%s) to %s\n", synth_preset_name(o.preset),
                (unsigned long long)cfg.seed, cfg.layers, cfg.experts, synth_model_shards(model),
                synth_model_tensors(model),
                shoal_size_format(synth_model_tensor_bytes(model), sz, sizeof sz),
                o.headers_only ? ", headers only" : "", o.out);
    }
    synth_model_free(model);
    return 0;
fail:
    shoal_meter_clear(&meter);
    fprintf(stderr, "mkmodel: %s\n", err.msg[0] ? err.msg : shoal_strerror(rc));
    synth_model_free(model);
    return shoal_exit_for(rc);
}
