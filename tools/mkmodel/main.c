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

#include "common/err.h"
#include "common/log.h"
#include "common/path.h"
#include "common/sys.h"
#include "tools/mkmodel/mkmodel_int.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: mkmodel --out DIR [--preset tiny|slice|k3|oracle] [--seed N] [--layers N]\n"
        "               [--experts N] [--headers-only] [--force] [--quiet]\n"
        "       mkmodel --stdout FILE [model flags]     one file of the model on stdout\n"
        "       mkmodel --print-etags [--jobs N] [model flags]   its digest table\n"
        "\n"
        "Write a synthetic Kimi-K3-family model directory (config.json,\n"
        "tokenizer_config.json, tiktoken.model, model.safetensors.index.json and\n"
        "model-NNNNN-of-NNNNNN.safetensors shards) with deterministic weights.\n"
        "\n"
        "  --out DIR      output directory (created; must be empty unless --force)\n"
        "  --preset P     tiny (k3.md section 6, default), slice (K3 expert sizes:\n"
        "                 17,547,264-byte experts, 4 layers x 32 experts, ~2.6 GB),\n"
        "                 k3 (the full checkpoint: 93 layers x 896 experts, 96 shards,\n"
        "                 ~1.56 TB; use --headers-only, --layers, --experts) or\n"
        "                 oracle (tiny's files, constructed weights: its greedy\n"
        "                 continuation of \"" SYNTH_ORACLE_PROMPT "\" is\n"
        "                 \"" SYNTH_ORACLE_TEXT "\"\n"
        "                 only if the engine gets every part right; config.json\n"
        "                 \"oracle\" holds both; the seed moves only the filler)\n"
        "  --seed N       weight seed, 0..2^63-1 (default 0 = the k3.md section 6 values)\n"
        "  --layers N     number of layers (1..%d); MLA on every 4th 1-based layer\n"
        "                 and on the last two, as K3\n"
        "  --experts N    routed experts per MoE layer (1..%d)\n"
        "  --headers-only shards get their real headers and sizes as sparse files\n"
        "                 (holes for the data), for tools that read local snapshots\n"
        "  --stdout FILE  write only FILE of the model (e.g. model-00001-of-000003.\n"
        "                 safetensors) to stdout, no directory\n"
        "  --print-etags  print every file's size, sha256, git sha1 and probe as the\n"
        "                 rows of synth/k3_etags.inc (hashes the whole model)\n"
        "  --jobs N       hashing threads for --print-etags (default: CPUs)\n"
        "  --force        write into a non-empty DIR, replacing an earlier model\n"
        "  --quiet        no progress on stderr\n"
        "  --help         this text\n", SYNTH_MAX_LAYERS, SYNTH_MAX_EXPERTS);
}

static int parse_u64(const char *flag, const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') {
        fprintf(stderr, "mkmodel: %s needs a non-negative integer\n", flag);
        return -1;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max) {
        fprintf(stderr, "mkmodel: %s: '%s' is not an integer in 0..%llu\n", flag, s,
                (unsigned long long)max);
        return -1;
    }
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

/* 0 to go on, 1 to exit 0 (--help), -1 to exit 2. */
static int opts_parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--force")) {
            o->force = 1;
        } else if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
        } else if (!strcmp(a, "--headers-only")) {
            o->headers_only = 1;
        } else if (!strcmp(a, "--print-etags")) {
            o->print_etags = 1;
        } else if (!strcmp(a, "--stdout") && v) {
            o->cat = v;
            i++;
        } else if (!strcmp(a, "--jobs") && v) {
            if (parse_u64(a, argv[++i], 256, &o->jobs) || o->jobs == 0) {
                fprintf(stderr, "mkmodel: --jobs must be 1..256\n");
                return -1;
            }
        } else if (!strcmp(a, "--out") && v) {
            o->out = v;
            i++;
        } else if (!strcmp(a, "--preset") && v) {
            if (synth_preset_parse(v, &o->preset)) {
                fprintf(stderr, "mkmodel: unknown preset '%s' (tiny, slice, k3 or oracle)\n", v);
                return -1;
            }
            i++;
        } else if (!strcmp(a, "--seed") && v) {
            if (parse_u64(a, argv[++i], INT64_MAX, &o->seed))
                return -1;
        } else if (!strcmp(a, "--layers") && v) {
            if (parse_u64(a, argv[++i], SYNTH_MAX_LAYERS, &o->layers) || o->layers == 0) {
                fprintf(stderr, "mkmodel: --layers must be 1..%d\n", SYNTH_MAX_LAYERS);
                return -1;
            }
        } else if (!strcmp(a, "--experts") && v) {
            if (parse_u64(a, argv[++i], SYNTH_MAX_EXPERTS, &o->experts) || o->experts == 0) {
                fprintf(stderr, "mkmodel: --experts must be 1..%d\n", SYNTH_MAX_EXPERTS);
                return -1;
            }
        } else {
            fprintf(stderr, "mkmodel: unknown or incomplete option '%s' (see --help)\n", a);
            return -1;
        }
    }
    if (!!o->out + !!o->cat + o->print_etags != 1) {
        fprintf(stderr, "mkmodel: give one of --out DIR, --stdout FILE or --print-etags "
                "(see --help)\n");
        return -1;
    }
    return 0;
}

/* Write the model directory o->out. */
static int dir_write(const opts *o, const synth_model *model, shoal_err *err)
{
    mk_progress pr = { 0 };
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
    pr.tty = !o->quiet && isatty(2);
    pr.verbose = !o->quiet;
    return mk_model_write(model, o->out, o->headers_only, &pr, err);
}

int main(int argc, char **argv)
{
    opts o;
    synth_config cfg;
    synth_model *model = NULL;
    shoal_err err = { 0 };
    int rc;

    shoal_log_setup("mkmodel", SHOAL_LOG_WARN, NULL);
    if ((rc = opts_parse(argc, argv, &o)))
        return rc > 0 ? 0 : 2;
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
        rc = mk_etags_print(model, jobs, o.quiet, &err);
    } else if (o.cat) {
        rc = mk_file_cat(model, o.cat, 1, &err);
    } else {
        rc = dir_write(&o, model, &err);
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
    fprintf(stderr, "mkmodel: %s\n", err.msg[0] ? err.msg : shoal_strerror(rc));
    synth_model_free(model);
    return 1;
}
