/* main.c — mkmodel: write a synthetic K3-family model directory.
 *
 * Owns: the command line, the output directory (creation, the non-empty
 * check, --force cleanup) and the order files are written in: config and
 * tokenizer files, then the shards, then model.safetensors.index.json last,
 * so a directory without the index is visibly incomplete.  docs/mkmodel.md
 * is the user's guide.
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
        "usage: mkmodel --out DIR [--preset tiny|slice] [--seed N] [--layers N]\n"
        "               [--experts N] [--force] [--quiet]\n"
        "\n"
        "Write a synthetic Kimi-K3-family model directory (config.json,\n"
        "tokenizer_config.json, tiktoken.model, model.safetensors.index.json and\n"
        "model-NNNNN-of-NNNNNN.safetensors shards) with deterministic weights.\n"
        "\n"
        "  --out DIR      output directory (created; must be empty unless --force)\n"
        "  --preset P     tiny (k3.md section 6, default) or slice (K3 expert sizes:\n"
        "                 17,547,264-byte experts, 4 layers x 32 experts, ~2.6 GB)\n"
        "  --seed N       weight seed, 0..2^63-1 (default 0 = the k3.md section 6 values)\n"
        "  --layers N     number of layers (1..%d); MLA on every 4th 1-based layer\n"
        "                 and on the last two, as K3\n"
        "  --experts N    routed experts per MoE layer (1..%d)\n"
        "  --force        write into a non-empty DIR, replacing an earlier model\n"
        "  --quiet        no progress on stderr\n"
        "  --help         this text\n", MK_MAX_LAYERS, MK_MAX_EXPERTS);
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
static void stale_remove(const char *dir, const mk_model *m)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char keep[64], path[SHOAL_PATH_MAX];
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
        int ours = 0;
        for (int i = 0; i < m->shards && shard; i++) {
            mk_shard_name(m, i, keep, sizeof keep);
            ours |= strcmp(keep, n) == 0;
        }
        if (!ours && shoal_path_join(path, sizeof path, dir, n) == 0)
            unlink(path);
    }
    closedir(d);
}

typedef struct opts {
    const char *out;
    mk_preset preset;
    uint64_t seed, layers, experts;
    int force, quiet;
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
        } else if (!strcmp(a, "--out") && v) {
            o->out = v;
            i++;
        } else if (!strcmp(a, "--preset") && v) {
            if (!strcmp(v, "tiny"))
                o->preset = MK_PRESET_TINY;
            else if (!strcmp(v, "slice"))
                o->preset = MK_PRESET_SLICE;
            else {
                fprintf(stderr, "mkmodel: unknown preset '%s' (tiny or slice)\n", v);
                return -1;
            }
            i++;
        } else if (!strcmp(a, "--seed") && v) {
            if (parse_u64(a, argv[++i], INT64_MAX, &o->seed))
                return -1;
        } else if (!strcmp(a, "--layers") && v) {
            if (parse_u64(a, argv[++i], MK_MAX_LAYERS, &o->layers) || o->layers == 0) {
                fprintf(stderr, "mkmodel: --layers must be 1..%d\n", MK_MAX_LAYERS);
                return -1;
            }
        } else if (!strcmp(a, "--experts") && v) {
            if (parse_u64(a, argv[++i], MK_MAX_EXPERTS, &o->experts) || o->experts == 0) {
                fprintf(stderr, "mkmodel: --experts must be 1..%d\n", MK_MAX_EXPERTS);
                return -1;
            }
        } else {
            fprintf(stderr, "mkmodel: unknown or incomplete option '%s' (see --help)\n", a);
            return -1;
        }
    }
    if (!o->out) {
        fprintf(stderr, "mkmodel: --out DIR is required (see --help)\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts o;
    mk_config cfg;
    mk_model model = { 0 };
    mk_progress pr = { 0 };
    shoal_err err = { 0 };
    int rc;

    shoal_log_setup("mkmodel", SHOAL_LOG_WARN, NULL);
    if ((rc = opts_parse(argc, argv, &o)))
        return rc > 0 ? 0 : 2;
    mk_preset_init(&cfg, o.preset);
    cfg.seed = o.seed;
    if ((rc = mk_config_finish(&cfg, (int)o.layers, (int)o.experts, &err)))
        goto fail;
    int ne = dir_nonempty(o.out);
    if (ne < 0) {
        rc = shoal_err_set(&err, shoal_err_from_errno(errno), "%s: %s", o.out, strerror(errno));
        goto fail;
    }
    if (ne && !o.force) {
        rc = shoal_err_set(&err, SHOAL_EEXIST, "%s is not empty (use --force to overwrite)",
                           o.out);
        goto fail;
    }
    if ((rc = shoal_mkdir_p(o.out, 0755, &err)) || (rc = mk_model_build(&cfg, &model, &err)))
        goto fail;
    if (o.force)
        stale_remove(o.out, &model);
    /* A directory without its index is visibly incomplete: drop an old one
     * first, write the new one last. */
    {
        char idx[SHOAL_PATH_MAX];
        if (shoal_path_join(idx, sizeof idx, o.out, "model.safetensors.index.json") == 0)
            unlink(idx);
    }
    pr.tty = !o.quiet && isatty(2);
    pr.verbose = !o.quiet;
    if ((rc = mk_config_write(&cfg, o.out, &err)) ||
        (rc = mk_tokenizer_config_write(&cfg, o.out, &err)) ||
        (rc = mk_tiktoken_write(&cfg, o.out, &err)) ||
        (rc = mk_shards_write(&cfg, &model, o.out, &pr, &err)) ||
        (rc = mk_index_write(&model, o.out, &err)))
        goto fail;
    if (!o.quiet) {
        char sz[32];
        fprintf(stderr, "mkmodel: wrote %s model (seed %llu, %d layers, %d experts, %d shards, "
                "%zu tensors, %s) to %s\n", o.preset == MK_PRESET_TINY ? "tiny" : "slice",
                (unsigned long long)cfg.seed, cfg.layers, cfg.experts, model.shards,
                model.count, shoal_size_format(model.total_bytes, sz, sizeof sz), o.out);
    }
    mk_model_free(&model);
    return 0;
fail:
    fprintf(stderr, "mkmodel: %s\n", err.msg[0] ? err.msg : shoal_strerror(rc));
    mk_model_free(&model);
    return 1;
}
