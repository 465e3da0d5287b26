/* estimate.c — `shoal estimate`: what a token will cost on this machine,
 * before anyone downloads a terabyte.  Measures the cold disk read rate
 * (a temporary file in the cache directory, dropped from the page cache)
 * and the memory read bandwidth (a STREAM-style sum), takes the upstream
 * rate from the cache's past transfers, reads the model's config (experts
 * per token x span size; the spine in the format the engine keeps it in
 * RAM, common/k3_sizes.h: int8 by default, --spine int4|f32) and
 * the cache's measured hit rates, and prints seconds per token streaming,
 * from disk and from RAM, with the arithmetic.  I/O only: compute time is
 * not included.
 */
#include "tools/shoal/shoal_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "common/k3_config.h"
#include "common/manifest.h"
#include "common/k3_sizes.h"
#include "common/sys.h"

#define TMPFS_MAGIC_ 0x01021994

typedef struct model_shape {
    char     name[SHOAL_PATH_MAX];
    k3_config cfg;
    const char *config_from;
} model_shape;

/* ---- measurements ---------------------------------------------------------------- */

int cli_measure_disk(const char *dir, uint64_t bytes, double *rate, int *tmpfs, shoal_err *err)
{
    char path[SHOAL_PATH_MAX];
    size_t chunk = 4u << 20;
    uint8_t *buf = malloc(chunk);
    struct statfs sf;
    int fd, rc = 0;

    *rate = 0;
    *tmpfs = statfs(dir, &sf) == 0 && (unsigned long)sf.f_type == TMPFS_MAGIC_;
    char name[64];
    snprintf(name, sizeof name, ".shoal-estimate-%d.tmp", (int)getpid());
    if (shoal_path_join(path, sizeof path, dir, name) != 0) {
        free(buf);
        return shoal_err_set(err, SHOAL_ETOOBIG, "path too long: %s", dir);
    }
    if (!buf)
        return shoal_err_set(err, SHOAL_ENOMEM, "out of memory");
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        free(buf);
        return shoal_err_set(err, SHOAL_EIO, "cannot create %s to measure the disk: %s", path,
                             strerror(errno));
    }
    unlink(path);    /* gone whatever happens next */
    for (size_t i = 0; i < chunk; i++)
        buf[i] = (uint8_t)(i * 131u + 7u);
    for (uint64_t at = 0; rc == 0 && at < bytes; at += chunk)
        rc = shoal_write_all(fd, buf, chunk);
    if (rc == 0 && fsync(fd) != 0)
        rc = SHOAL_EIO;
    if (rc == 0) {
        /* Dropped from the page cache, the file is read from the device. */
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        uint64_t t0 = shoal_now_ns(), got = 0;
        for (uint64_t at = 0; rc == 0 && at < bytes; at += chunk, got += chunk)
            rc = shoal_pread_all(fd, buf, chunk, (off_t)at);
        double secs = (double)(shoal_now_ns() - t0) / 1e9;
        *rate = secs > 0 ? (double)got / secs : 0;
    }
    close(fd);
    free(buf);
    return rc ? shoal_err_set(err, rc, "measuring the disk in %s: %s", dir, shoal_strerror(rc)) : 0;
}

static double measure_memory(uint64_t bytes)
{
    size_t n = (size_t)(bytes / sizeof(double));
    double *a = malloc(n * sizeof *a), best = 0, sink = 0;
    if (!a || n == 0) {
        free(a);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        a[i] = (double)(i & 1023);
    for (int pass = 0; pass < 4; pass++) {
        uint64_t t0 = shoal_now_ns();
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        size_t i = 0;
        for (; i + 4 <= n; i += 4) {
            s0 += a[i];
            s1 += a[i + 1];
            s2 += a[i + 2];
            s3 += a[i + 3];
        }
        sink += s0 + s1 + s2 + s3;
        double secs = (double)(shoal_now_ns() - t0) / 1e9;
        double r = secs > 0 ? (double)(i * sizeof(double)) / secs : 0;
        if (r > best)
            best = r;
    }
    free(a);
    /* Keep the sums alive so the loop is not optimised away. */
    return sink == -1.0 ? 0 : best;
}

/* ---- the model ------------------------------------------------------------------ */

static int shape_from_dir(const char *dir, model_shape *m, shoal_err *err)
{
    char path[SHOAL_PATH_MAX];

    if (shoal_path_join(path, sizeof path, dir, "config.json") != 0)
        return shoal_err_set(err, SHOAL_ETOOBIG, "path too long");
    m->config_from = "config.json";
    return k3_config_load(path, &m->cfg, err);
}

/* The config of a manifest's encoding. */
static int shape_from_manifest(const uint8_t *p, size_t n, model_shape *m, shoal_err *err)
{
    manifest *man = NULL;
    shoal_json *cfg = NULL;
    int rc = manifest_decode(p, n, &man, err);
    if (rc == 0 && !(cfg = shoal_json_parse((const char *)man->config, man->config_len, err)))
        rc = SHOAL_EFORMAT;
    if (rc == 0)
        rc = k3_config_parse(cfg, &m->cfg, err);
    shoal_json_free(cfg);
    manifest_free(man);
    return rc;
}

/* OPEN through shoald: it reads config.json, the index and the shards'
 * safetensors headers (K3: ~290 requests, ~60 MB; no weights) and answers
 * the manifest. */
static int shape_from_daemon(const shoal_cli *cli, const char *spec, model_shape *m,
                             int *no_daemon, shoal_err *err)
{
    shoal_client *cl = NULL;
    shoal_model_info mi;
    shoal_buf b;
    int rc = cli_connect(cli, &cl, err);

    *no_daemon = rc == SHOAL_ENET;
    if (rc)
        return rc;
    memset(&mi, 0, sizeof mi);
    mi.manifest_fd = -1;
    shoal_buf_init(&b, 0);
    rc = shoal_client_open(cl, spec, &mi, err);
    if (rc == 0 && (mi.manifest_fd < 0 || mi.manifest_len == 0))
        rc = shoal_err_set(err, SHOAL_EPROTO, "shoald sent no manifest for %s", spec);
    if (rc == 0 && (rc = shoal_buf_reserve(&b, (size_t)mi.manifest_len)) == 0) {
        rc = shoal_pread_all(mi.manifest_fd, b.data, (size_t)mi.manifest_len, 0);
        if (rc)
            shoal_err_set(err, rc, "reading the manifest of %s", spec);
        else
            b.len = (size_t)mi.manifest_len;
    }
    if (mi.manifest_fd >= 0)
        close(mi.manifest_fd);
    shoal_client_close(cl);
    if (rc == 0)
        rc = shape_from_manifest(b.data, b.len, m, err);
    m->config_from = "config.json, read by shoald's OPEN (config and headers only)";
    shoal_buf_free(&b);
    return rc;
}

static int shape_from_cache(const shoal_cli *cli, const char *spec, model_shape *m, shoal_err *err)
{
    cache *c = NULL;
    shoal_buf b;
    manifest *man = NULL;
    shoal_json *cfg = NULL;
    int rc = cli_cache_reader(cli, &c, err);

    shoal_buf_init(&b, 0);
    if (rc == 0)
        rc = cache_model_manifest(c, spec, &b, err);
    cache_close(c);
    if (rc == SHOAL_ENOTFOUND && strncmp(spec, "hf://", 5) == 0) {
        /* Not cached: shoald's OPEN reads only the config and the headers. */
        int no_daemon = 0;
        shoal_err_clear(err);
        rc = shape_from_daemon(cli, spec, m, &no_daemon, err);
        if (no_daemon)
            rc = shoal_err_set(err, SHOAL_ENOTFOUND, "the cache holds no manifest of %s and shoald "
                           "is not running: start it (`shoald --detach`) and run `shoal "
                           "estimate %s` again; it opens the model, reading config.json and "
                           "the shard headers only (no weights)", spec, spec);
        return rc;
    }
    if (rc == SHOAL_ENOTFOUND)
        shoal_err_wrap(err, rc, "%s is neither a model directory nor a model whose manifest the "
                       "cache holds; as hf://org/name with shoald running, `shoal estimate` "
                       "opens it (config and headers only)", spec);
    if (rc == 0)
        rc = manifest_decode(b.data, b.len, &man, err);
    shoal_buf_free(&b);
    if (rc == 0 && !(cfg = shoal_json_parse((const char *)man->config, man->config_len, err)))
        rc = SHOAL_EFORMAT;
    if (rc == 0)
        rc = k3_config_parse(cfg, &m->cfg, err);
    m->config_from = "the cached manifest's config.json";
    shoal_json_free(cfg);
    manifest_free(man);
    return rc;
}

/* ---- the command ---------------------------------------------------------------- */

enum { O_UPSTREAM = 1, O_DISK_BYTES, O_MEM_BYTES, O_SPINE };

static const shoal_cli_opt estimate_opts[] = {
    { "spine", 0, "int8|int4|f32", O_SPINE, "the spine's format in RAM (default int8: the\n"
                                            "engine's pack, the embedding mapped; int4: the\n"
                                            "large projections in groups of 64)" },
    { "upstream", 0, "RATE", O_UPSTREAM, "the upstream rate in bytes per second (\"100M\"; default:\n"
                                         "the cache's past transfers)" },
    { "disk-bytes", 0, "SIZE", O_DISK_BYTES, "the disk read test's file (default 256M)" },
    { "mem-bytes", 0, "SIZE", O_MEM_BYTES, "the memory bandwidth test's buffer (default 256M)" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_estimate_spec = {
    .prog = "shoal estimate",
    .synopsis = "shoal estimate MODEL [--spine int8|int4|f32] [--upstream RATE]\n"
                "               [--disk-bytes SIZE] [--mem-bytes SIZE]",
    .about = "Expected seconds per token (I/O only) streaming from upstream, from the disk\n"
             "cache and from RAM, with the arithmetic.  MODEL is a directory with config.json\n"
             "or a model whose manifest the cache holds.  The spine is counted in the format\n"
             "the engine keeps it in RAM, from the config's shapes.  Measures the cold disk\n"
             "read rate in the cache directory (a temporary file dropped from the page cache)\n"
             "and the memory read bandwidth (a STREAM-style sum); hit rates are the cache's,\n"
             "for MODEL when known.",
    .opts = estimate_opts,
};

static void rates_from_stats(const shoal_cli *cli, const char *spec, double *up, double *r,
                             double *d, int64_t *rn, int64_t *dn, const char **scope)
{
    shoal_json *j = NULL;
    shoal_err err;
    int live;
    *scope = "this model";
    if (stats_fetch(cli, spec, CACHE_REPORT_BY_NONE, &j, &live, &err) != 0) {
        *scope = "every model in the cache";
        if (stats_fetch(cli, NULL, CACHE_REPORT_BY_NONE, &j, &live, &err) != 0) {
            *scope = "nothing measured";
            return;
        }
    }
    /* The upstream rate is the machine's, whatever the model. */
    *up = jnum(j, "tiers.upstream.rate_bytes_per_s", 0);
    *rn = jint(j, "tiers.ram.requests", 0);
    *dn = jint(j, "tiers.disk.requests", 0);
    *r = *rn ? jnum(j, "tiers.ram.hit_rate", 0) : 0;
    *d = *dn ? jnum(j, "tiers.disk.hit_rate", 0) : 0;
    shoal_json_free(j);
}

/* The command line: -1 to go on (*first: MODEL's index), else the exit
 * status. */
static int estimate_args(int argc, char **argv, uint64_t *up_flag, uint64_t *disk_bytes,
                         uint64_t *mem_bytes, k3_spine_mode *fmt, int *first)
{
    shoal_cli_parser p;
    const char *v;
    int id;

    shoal_cli_begin(&p, &cmd_estimate_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        uint64_t *dst = id == O_UPSTREAM ? up_flag : id == O_DISK_BYTES ? disk_bytes : mem_bytes;
        if (id == O_SPINE) {
            if (strcmp(v, "int8") == 0) *fmt = K3_SPINE_INT8;
            else if (strcmp(v, "int4") == 0) *fmt = K3_SPINE_INT4;
            else if (strcmp(v, "f32") == 0) *fmt = K3_SPINE_F32;
            else return shoal_cli_bad_value(&p, v, "int8, int4 or f32");
        } else if (shoal_size_parse(v, dst) != 0 || *dst == 0) {
            return shoal_cli_bad_value(&p, v, "a size (256M)");
        }
    }
    if (id < 0)
        return p.exit;
    if (p.optind != argc - 1)
        return shoal_cli_usage_error(&cmd_estimate_spec, "give one MODEL");
    *first = p.optind;
    return -1;
}

int cmd_estimate(shoal_cli *cli, int argc, char **argv)
{
    uint64_t disk_bytes = 256u << 20, mem_bytes = 256u << 20, up_flag = 0;
    k3_spine_mode fmt = K3_SPINE_INT8;
    k3_spine_sizes sz;
    model_shape m;
    struct stat st;
    shoal_err err = { 0, "" };
    int rc, tmpfs = 0, first = 0;
    int64_t rn = 0, dn = 0;
    double disk = 0, mem, up = 0, r = 0, d = 0;
    const char *scope = "", *up_from = "the cache's past transfers";
    char a[FMT_MAX], b[FMT_MAX], x[FMT_MAX], y[FMT_MAX], z[FMT_MAX], w[FMT_MAX];

    if ((rc = estimate_args(argc, argv, &up_flag, &disk_bytes, &mem_bytes, &fmt, &first)) >= 0)
        return rc;
    memset(&m, 0, sizeof m);
    if ((rc = cli_model_arg(&cmd_estimate_spec, argv[first], m.name, sizeof m.name)) != 0)
        return rc;
    if (stat(m.name, &st) == 0 && S_ISDIR(st.st_mode))
        rc = shape_from_dir(m.name, &m, &err);
    else
        rc = shape_from_cache(cli, m.name, &m, &err);
    if (rc)
        return cli_fail(rc, &err);
    if (m.cfg.n_moe_layers <= 0 || m.cfg.expert_bytes == 0) {
        fprintf(stderr, "shoal estimate: %s has no routed experts: nothing streams\n", m.name);
        return EXIT_FAIL;
    }

    rates_from_stats(cli, m.name, &up, &r, &d, &rn, &dn, &scope);
    if (up_flag) {
        up = (double)up_flag;
        up_from = "--upstream";
    }
    /* The cache's own disk is the one that matters. */
    const char *dir = stat(cli->home, &st) == 0 ? cli->home : "/var/tmp";
    if ((rc = cli_measure_disk(dir, disk_bytes, &disk, &tmpfs, &err)) != 0)
        return cli_fail(rc, &err);
    mem = measure_memory(mem_bytes);

    double E = (double)m.cfg.n_experts_per_token * (double)m.cfg.n_moe_layers *
               (double)m.cfg.expert_bytes;
    /* the spine as the engine keeps it (common/k3_sizes.h, the same count
     * its loader and memory plan use): the derived matrices and vectors are
     * read every token, the mapped embedding one row a token */
    k3_spine_sizes_get(&m.cfg, fmt, &sz);
    uint64_t per_token = sz.matrices + sz.vectors + 2 * (uint64_t)m.cfg.hidden;
    uint64_t kept = sz.matrices + sz.vectors + sz.embedding;
    double S = (double)per_token;
    printf("Model %s (shapes from %s)\n", m.name, m.config_from);
    printf("  experts per token  E = %lld MoE layers x %lld experts x %s = %s\n",
           (long long)m.cfg.n_moe_layers, (long long)m.cfg.n_experts_per_token,
           fmt_size(m.cfg.expert_bytes, a), fmt_size((uint64_t)E, b));
    printf("  spine (%-4s)       S = %s read per token (%s of matrices, %s of vectors)\n",
           k3_spine_mode_name(fmt), fmt_size(per_token, a), fmt_size(sz.matrices, b),
           fmt_size(sz.vectors, x));
    printf("                     kept in RAM %s with the embedding (%s BF16, mapped: one row "
           "a token)\n", fmt_size(kept, a), fmt_size(sz.embedding, b));
    printf("                     checkpoint: %s BF16 (--spine int8|int4|f32)\n",
           fmt_size(sz.checkpoint, a));
    printf("Measured on this machine\n");
    printf("  memory read        mem  = %s (STREAM-style sum over %s, one thread)\n",
           fmt_rate(mem, a), fmt_size(mem_bytes, b));
    printf("  cold disk read     disk = %s (%s in %s, dropped from the page cache%s)\n",
           fmt_rate(disk, a), fmt_size(disk_bytes, b), dir,
           tmpfs ? "; tmpfs: this is memory, not a disk" : "");
    if (up > 0)
        printf("  upstream           up   = %s (%s)\n", fmt_rate(up, a), up_from);
    else
        printf("  upstream           up   = unknown (no past transfers; pass --upstream RATE)\n");
    printf("Hit rates (%s)\n", scope);
    printf("  engine RAM         r = %s%s\n", fmt_pct(r, a), rn ? "" : " (no RAM-tier reports yet)");
    printf("  disk cache         d = %s%s\n", fmt_pct(d, a), dn ? "" : " (no requests yet)");
    printf("Seconds per token (I/O only)\n");
    if (mem > 0) {
        double t_ram = (S + E) / mem;
        printf("  from RAM     (S + E) / mem\n               = (%s + %s) / %s = %.4g s\n",
               fmt_size((uint64_t)S, a), fmt_size((uint64_t)E, b), fmt_rate(mem, x), t_ram);
    }
    if (mem > 0 && disk > 0) {
        double per = r / mem + (1 - r) / disk;
        double t_disk = S / mem + E * per;
        printf("  from disk    S/mem + E x (r/mem + (1-r)/disk)\n"
               "               = %s/%s + %s x (%.3f/%s + %.3f/%s) = %.4g s\n",
               fmt_size((uint64_t)S, a), fmt_rate(mem, x), fmt_size((uint64_t)E, b), r,
               fmt_rate(mem, y), 1 - r, fmt_rate(disk, z), t_disk);
    }
    if (mem > 0 && disk > 0 && up > 0) {
        double per = r / mem + (1 - r) * (d / disk + (1 - d) / up);
        double t_stream = S / mem + E * per;
        printf("  streaming    S/mem + E x (r/mem + (1-r) x (d/disk + (1-d)/up))\n"
               "               = %s/%s + %s x (%.3f/%s + %.3f x (%.3f/%s + %.3f/%s)) = %.4g s\n",
               fmt_size((uint64_t)S, a), fmt_rate(mem, x), fmt_size((uint64_t)E, b), r,
               fmt_rate(mem, y), 1 - r, d, fmt_rate(disk, z), 1 - d, fmt_rate(up, w), t_stream);
    } else {
        printf("  streaming    needs the upstream rate: pass --upstream RATE\n");
    }
    return EXIT_OK_;
}
