/* doctor.c — `shoal doctor`: is this machine ready for shoal, and does the
 * pipeline compute right on it?  One line per check, `ok|warn|FAIL  what —
 * what to do`, or --json; exit 1 when a check failed (docs/cli.md).
 *
 * Owns: the checks and how they are judged — the engine binary beside
 * shoal and its version; the CPU (the kernels' ISA, from `shoal-engine
 * info`); memory and K3's plan (`shoal-engine plan` of K3's config, which
 * mkmodel writes); the cold read rate of the cache directory's disk
 * (estimate.c's measurement); free space against the budget; shoald
 * (running, its version) and the permissions of its socket and home; the
 * upstream (a TCP connection to HF_ENDPOINT, or HF_HUB_OFFLINE); and the
 * oracle end to end (a freshly generated `mkmodel --preset oracle` run by
 * the engine, or --oracle MODEL, e.g. hf://org/name through shoald, must
 * say exactly SYNTH_ORACLE_TEXT).  Does not own what the engine computes,
 * nor the plan: it runs the engine binary and reads its JSON (the CLI does
 * not link the kernels).
 */
#include "tools/shoal/shoal_int.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/platform.h"
#include "common/sys.h"
#include "common/version.h"
#include "synth/synth.h"      /* the oracle's promise (macros only: nothing linked) */

enum { ST_OK, ST_WARN, ST_FAIL };
static const char *const st_word[] = { "ok", "warn", "FAIL" };
static const char *const st_json[] = { "ok", "warn", "fail" };

#define MAX_CHECKS 12
#define K3_COLD_TOKEN 25829572608.0     /* bytes of experts a K3 token reads with no hits */

typedef struct check {
    const char *name;
    int status;
    char what[1536];
    char todo[1024];
    shoal_json *detail;           /* owned; figures for --json */
} check;

typedef struct doctor {
    shoal_cli *cli;
    int json;
    const char *oracle;           /* --oracle MODEL, or NULL: generate one */
    uint64_t disk_bytes;
    char engine[SHOAL_PATH_MAX], mkmodel[SHOAL_PATH_MAX];
    int have_engine;
    char tmp[SHOAL_PATH_MAX];     /* scratch directory, removed at the end */
    shoal_json *stats;            /* STATS (live or from the index), or NULL */
    int live;
    check checks[MAX_CHECKS];
    int n;
} doctor;

static check *add(doctor *d, const char *name, int status, const char *todo, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static check *add(doctor *d, const char *name, int status, const char *todo, const char *fmt, ...)
{
    check *c = &d->checks[d->n < MAX_CHECKS - 1 ? d->n++ : d->n];
    va_list ap;

    c->name = name;
    c->status = status;
    va_start(ap, fmt);
    vsnprintf(c->what, sizeof c->what, fmt, ap);
    va_end(ap);
    snprintf(c->todo, sizeof c->todo, "%s", todo ? todo : "");
    c->detail = shoal_json_object();
    return c;
}

/* ---- running the other binaries ---------------------------------------------- */

typedef struct child {
    shoal_buf out, err;
    int status;                   /* exit status, 128 + signal, 127: not found */
    int timed_out;
} child;

/* Run argv (execvp) with stdin from /dev/null, collecting stdout and
 * stderr, killed after timeout_ms.  0, or a negative code when it could
 * not be started. */
static int run_child(char *const argv[], int timeout_ms, child *ch)
{
    int po[2], pe[2], st = 0;
    pid_t pid;

    memset(ch, 0, sizeof *ch);
    shoal_buf_init(&ch->out, 0);
    shoal_buf_init(&ch->err, 0);
    if (pipe2(po, O_CLOEXEC) != 0)
        return SHOAL_EIO;
    if (pipe2(pe, O_CLOEXEC) != 0) {
        close(po[0]), close(po[1]);
        return SHOAL_EIO;
    }
    if ((pid = fork()) < 0) {
        close(po[0]), close(po[1]), close(pe[0]), close(pe[1]);
        return SHOAL_EIO;
    }
    if (pid == 0) {
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0)
            dup2(in, 0);
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    uint64_t deadline = shoal_now_ns() + (uint64_t)timeout_ms * 1000000u;
    struct pollfd pf[2] = { { po[0], POLLIN, 0 }, { pe[0], POLLIN, 0 } };
    int open_fds = 2;
    while (open_fds > 0) {
        uint64_t now = shoal_now_ns();
        if (now >= deadline) {
            ch->timed_out = 1;
            kill(pid, SIGKILL);
            break;
        }
        if (poll(pf, 2, (int)((deadline - now) / 1000000u) + 1) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < 2; i++) {
            if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            char buf[4096];
            ssize_t k = read(pf[i].fd, buf, sizeof buf);
            if (k > 0 && (i ? &ch->err : &ch->out)->len < (8u << 20)) {
                shoal_buf_append(i ? &ch->err : &ch->out, buf, (size_t)k);
            } else if (k == 0 || (k < 0 && errno != EINTR)) {
                close(pf[i].fd);
                pf[i].fd = -1;
                open_fds--;
            }
        }
    }
    for (int i = 0; i < 2; i++)
        if (pf[i].fd >= 0)
            close(pf[i].fd);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    ch->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    shoal_buf_append_u8(&ch->out, 0);      /* both NUL-terminated for the parsers */
    shoal_buf_append_u8(&ch->err, 0);
    ch->out.len--;
    ch->err.len--;
    return 0;
}

static void child_free(child *ch)
{
    shoal_buf_free(&ch->out);
    shoal_buf_free(&ch->err);
}

/* The last non-empty line of a child's stderr, for a message. */
static const char *last_line(child *ch)
{
    char *s = (char *)ch->err.data;
    if (!s || !*s)
        return "no message";
    size_t n = strlen(s);
    while (n && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = 0;
    char *nl = strrchr(s, '\n');
    return nl ? nl + 1 : s;
}

/* The binary `name` beside this shoal, else the bare name (found on PATH). */
static void sibling(const char *name, char *out, size_t cap)
{
    char self[SHOAL_PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);

    snprintf(out, cap, "%s", name);
    if (n <= 0)
        return;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash)
        return;
    *slash = 0;
    char path[SHOAL_PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", self, name) < (int)sizeof path &&
        access(path, X_OK) == 0)
        snprintf(out, cap, "%s", path);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(p);
    return 0;
}

/* ---- the engine and the CPU --------------------------------------------------- */

static void check_engine(doctor *d)
{
    char *argv[] = { d->engine, "--version", NULL };
    child ch;
    char want[64];

    snprintf(want, sizeof want, "shoal-engine %s", SHOAL_VERSION);
    if (run_child(argv, 10000, &ch) != 0 || ch.status != 0) {
        add(d, "engine", ST_FAIL, "build it (make) or install it beside shoal",
            "shoal-engine not found beside shoal or on PATH (%s)", d->engine);
        child_free(&ch);
        return;
    }
    d->have_engine = 1;
    char *v = (char *)ch.out.data;
    v[strcspn(v, "\n")] = 0;
    if (strcmp(v, want))
        add(d, "engine", ST_WARN, "rebuild both from one tree (make)",
            "%s is \"%s\", this shoal is %s", d->engine, v, SHOAL_VERSION);
    else
        add(d, "engine", ST_OK, NULL, "%s, %s (the same build as shoal)", d->engine, v);
    child_free(&ch);
}

static shoal_json *child_json(child *ch)
{
    shoal_err err = { 0 };
    return ch->out.len ? shoal_json_parse((const char *)ch->out.data, ch->out.len, &err) : NULL;
}

static void check_cpu(doctor *d)
{
    char *argv[] = { d->engine, "info", "--json", NULL };
    child ch;
    shoal_json *j = NULL;
    char isas[128] = "";

    if (!d->have_engine) {
        add(d, "cpu", ST_FAIL, "install shoal-engine (above)", "not checked: no shoal-engine");
        return;
    }
    if (run_child(argv, 10000, &ch) != 0 || ch.status != 0 || !(j = child_json(&ch))) {
        add(d, "cpu", ST_WARN, "rebuild shoal-engine (make)",
            "shoal-engine info failed: %s", last_line(&ch));
        child_free(&ch);
        return;
    }
    const char *isa = jstr(j, "isa", "?");
    shoal_json *all = shoal_json_get(j, "isas");
    for (size_t i = 0; i < shoal_json_array_size(all); i++) {
        const char *s = shoal_json_str_value(shoal_json_array_at(all, i));
        if (s && strcmp(s, isa)) {
            size_t k = strlen(isas);
            snprintf(isas + k, sizeof isas - k, "%s%s", k ? ", " : "", s);
        }
    }
    int64_t cores = jint(j, "cores", 1);
    check *c;
    if (!strcmp(isa, "scalar"))
        c = add(d, "cpu", ST_WARN, "expect products several times slower; x86-64 needs AVX2 + FMA, "
                "aarch64 NEON for the fast kernels",
                "portable scalar kernels only (no SIMD kernels for this CPU), %lld cores",
                (long long)cores);
    else
        c = add(d, "cpu", ST_OK, NULL, "%s kernels (also runs: %s), %lld cores", isa,
                isas[0] ? isas : "none", (long long)cores);
    shoal_json_set_str(c->detail, "isa", isa);
    shoal_json_set_int(c->detail, "cores", cores);
    shoal_json_free(j);
    child_free(&ch);
}

/* ---- memory and K3's plan --------------------------------------------------------- */

static void memory_limits_only(doctor *d, const char *why)
{
    shoal_mem_limits m;
    shoal_err err = { 0 };
    char a[FMT_MAX], b[FMT_MAX];

    if (shoal_mem_limits_read(NULL, &m, &err) != 0) {
        add(d, "memory", ST_WARN, "check /proc/meminfo", "%s", err.msg);
        return;
    }
    add(d, "memory", ST_WARN, "build mkmodel and shoal-engine beside shoal (make) for the plan",
        "limit %s (%s), %s available; no plan for K3: %s", fmt_size(m.limit, a), m.limit_by,
        fmt_size(m.mem_available, b), why);
}

static void check_memory(doctor *d)
{
    char dir[SHOAL_PATH_MAX], cfg[SHOAL_PATH_MAX];
    char *mk[] = { d->mkmodel, "--preset", "k3", "--stdout", "config.json", NULL };
    child ch;
    shoal_err err = { 0 };

    if (!d->have_engine)
        return memory_limits_only(d, "no shoal-engine");
    if (shoal_path_join(dir, sizeof dir, d->tmp, "k3") ||
        shoal_path_join(cfg, sizeof cfg, dir, "config.json") || mkdir(dir, 0700) != 0)
        return memory_limits_only(d, "no scratch directory");
    if (run_child(mk, 30000, &ch) != 0 || ch.status != 0 ||
        shoal_write_file_atomic(cfg, ch.out.data, ch.out.len, &err) != 0) {
        child_free(&ch);
        return memory_limits_only(d, "mkmodel could not write K3's config.json");
    }
    child_free(&ch);
    char *plan[] = { d->engine, "plan", dir, "--json", NULL };
    shoal_json *j = NULL;
    if (run_child(plan, 30000, &ch) != 0 || !(j = child_json(&ch))) {
        memory_limits_only(d, last_line(&ch));
        child_free(&ch);
        return;
    }
    char lim[FMT_MAX], av[FMT_MAX], i8[FMT_MAX], i4[FMT_MAX], tier[FMT_MAX], where[160];
    const char *verdict = jstr(j, "verdict", "?"), *mode = jstr(j, "spine.mode", "?");
    fmt_size((uint64_t)jint(j, "limit", 0), lim);
    fmt_size((uint64_t)jint(j, "mem_available", 0), av);
    fmt_size((uint64_t)jint(j, "min_ram.int8", 0), i8);
    fmt_size((uint64_t)jint(j, "min_ram.int4", 0), i4);
    fmt_size((uint64_t)jint(j, "ram_tier", 0), tier);
    snprintf(where, sizeof where, "limit %s (%s), %s available", lim, jstr(j, "limit_by", "?"), av);
    check *c;
    if (!strcmp(verdict, "resident"))
        c = add(d, "memory", ST_OK, NULL, "%s; K3 plans a resident %s spine and a %s RAM tier "
                "(int8 with a useful tier from %s, int4 from %s)", where, mode, tier, i8, i4);
    else if (!strcmp(verdict, "streamed")) {
        char st[32];
        fmt_size((uint64_t)jint(j, "spine.streamed", 0), st);
        c = add(d, "memory", ST_WARN, "K3 runs, slower: each token re-reads the streamed part; "
                "more memory (or a larger memory cgroup) keeps it resident",
                "%s: K3 keeps part of its %s spine resident and streams %s of it every token "
                "(resident whole: int4 from %s, int8 with a useful RAM tier from %s)", where,
                mode, st, i4, i8);
    } else
        c = add(d, "memory", ST_WARN, "smaller models run here; for K3 use a machine (or memory "
                "cgroup) with at least that much",
                "%s: too little for K3, even streaming its spine (int4 resident whole from %s, "
                "int8 with a useful RAM tier from %s)", where, i4, i8);
    shoal_json_set_str(c->detail, "verdict", verdict);
    shoal_json_set_int(c->detail, "limit", jint(j, "limit", 0));
    shoal_json_set_str(c->detail, "limit_by", jstr(j, "limit_by", "?"));
    shoal_json_set_int(c->detail, "k3_min_int4", jint(j, "min_ram.int4", 0));
    shoal_json_free(j);
    child_free(&ch);
}

/* ---- the disk: read rate and free space ------------------------------------------- */

/* The cache directory, or its nearest existing ancestor when it is not
 * made yet.  1 when it is the cache directory itself. */
static int existing_dir(const char *home, char *out, size_t cap)
{
    struct stat st;
    snprintf(out, cap, "%s", home);
    while (stat(out, &st) != 0 || !S_ISDIR(st.st_mode)) {
        char *slash = strrchr(out, '/');
        if (!slash || slash == out) {
            snprintf(out, cap, "/");
            return 0;
        }
        *slash = 0;
    }
    return strcmp(out, home) == 0;
}

static void check_disk(doctor *d)
{
    char dir[SHOAL_PATH_MAX], r[FMT_MAX], sz[FMT_MAX];
    double rate = 0;
    int tmpfs = 0, own = existing_dir(d->cli->home, dir, sizeof dir);
    shoal_err err = { 0 };

    if (cli_measure_disk(dir, d->disk_bytes, &rate, &tmpfs, &err) != 0) {
        add(d, "disk", ST_FAIL, "the cache directory must be writable: fix its permissions or "
            "pass --home DIR", "%s", err.msg);
        return;
    }
    fmt_rate(rate, r);
    fmt_size(d->disk_bytes, sz);
    double token_s = rate > 0 ? K3_COLD_TOKEN / rate : 0;
    check *c;
    if (tmpfs)
        c = add(d, "disk", ST_WARN, "put the cache on a disk: shoald --home DIR",
                "%s is on tmpfs: the cache would live in RAM and vanish at reboot", dir);
    else if (rate < 200e6)
        c = add(d, "disk", ST_WARN, "use a faster disk (NVMe) for the cache, or warm what you use "
                "so it is read from RAM", "cold reads %s in %s%s (%s, dropped from the page "
                "cache): a K3 token with no hits (25.8 GB of experts) takes %.0f s", r, dir,
                own ? "" : " (the cache directory's parent)", sz, token_s);
    else
        c = add(d, "disk", ST_OK, NULL, "cold reads %s in %s%s (%s, dropped from the page "
                "cache): a K3 token with no hits reads 25.8 GB in %.1f s", r, dir,
                own ? "" : " (the cache directory's parent)", sz, token_s);
    shoal_json_set_num(c->detail, "read_bytes_per_s", rate);
    shoal_json_set_str(c->detail, "dir", dir);
}

static void check_space(doctor *d)
{
    char dir[SHOAL_PATH_MAX], f[FMT_MAX], b[FMT_MAX], u[FMT_MAX], todo[SHOAL_PATH_MAX + 256];
    struct statvfs sv;

    existing_dir(d->cli->home, dir, sizeof dir);
    if (statvfs(dir, &sv) != 0) {
        add(d, "space", ST_WARN, "check the cache directory", "statvfs %s: %s", dir,
            strerror(errno));
        return;
    }
    uint64_t free_b = (uint64_t)sv.f_bavail * sv.f_frsize;
    uint64_t used = d->stats ? (uint64_t)jint(d->stats, "disk.used", 0) : 0;
    int64_t budget = d->stats && !jnull(d->stats, "disk.budget") ? jint(d->stats, "disk.budget", 0) : -1;
    int autob = d->live && jint(d->stats, "daemon.settings.max_size", -1) == 0;
    check *c;
    fmt_size(free_b, f);
    fmt_size(used, u);
    if (budget < 0) {
        c = add(d, "space", free_b < (10ull << 30) ? ST_WARN : ST_OK,
                free_b < (10ull << 30) ? "free space on that disk" : NULL,
                "%s free on %s, %s cached (the budget is known to a running shoald only)", f,
                dir, u);
    } else if ((uint64_t)budget > free_b + used) {
        fmt_size(free_b + used, b);
        snprintf(todo, sizeof todo, "lower it: shoald --home %s --max-size %s (it is kept in "
                 "shoald.conf), or free space", d->cli->home, b);
        c = add(d, "space", ST_WARN, todo, "the budget %s is more than the disk gives the cache: "
                "%s free + %s cached", fmt_size((uint64_t)budget, b), f, u);
    } else {
        c = add(d, "space", ST_OK, NULL, "budget %s%s, %s cached, %s free on %s",
                fmt_size((uint64_t)budget, b), autob ? " (auto)" : "", u, f, dir);
    }
    shoal_json_set_int(c->detail, "free", (int64_t)free_b);
    shoal_json_set_int(c->detail, "budget", budget);
}

/* ---- shoald ---------------------------------------------------------------------- */

static void socket_path(const doctor *d, char *out, size_t cap)
{
    if (d->cli->socket_path)
        snprintf(out, cap, "%s", d->cli->socket_path);
    else if (shoal_path_join(out, cap, d->cli->home, "shoald.sock") != 0)
        out[0] = 0;
}

static void check_daemon(doctor *d)
{
    shoal_client *c = NULL;
    shoal_err err = { 0 };
    char sock[SHOAL_PATH_MAX], todo[SHOAL_PATH_MAX + 256];
    shoal_buf b;
    int rc;

    socket_path(d, sock, sizeof sock);
    if ((rc = cli_connect(d->cli, &c, &err)) != 0) {
        snprintf(todo, sizeof todo, "start it: shoald --home %s --detach", d->cli->home);
        if (rc == SHOAL_ENET)
            add(d, "daemon", ST_FAIL, todo, "shoald is not running (nothing listens on %s)", sock);
        else
            add(d, "daemon", ST_FAIL, "see its log (HOME/shoald.log), or restart it",
                "shoald on %s: %s", sock, err.msg);
        stats_fetch(d->cli, NULL, CACHE_REPORT_BY_NONE, &d->stats, &d->live, &err);
        return;
    }
    const char *v = shoal_client_daemon_version(c);
    shoal_buf_init(&b, 0);
    rc = shoal_client_stats(c, "{\"by\":\"none\"}", &b, &err);
    rc = cli_json_take(rc, &b, &d->stats, &err);
    d->live = rc == 0;
    int64_t pid = d->stats ? jint(d->stats, "daemon.pid", 0) : 0;
    check *k;
    if (rc != 0)
        k = add(d, "daemon", ST_FAIL, "restart shoald from this build", "shoald %s on %s does "
                "not answer STATS: %s", v ? v : "?", sock, err.msg);
    else if (!v || strcmp(v, SHOAL_VERSION))
        k = add(d, "daemon", ST_WARN, "restart shoald from the same build as shoal",
                "shoald %s (pid %lld) on %s, this shoal is %s", v ? v : "?", (long long)pid, sock,
                SHOAL_VERSION);
    else
        k = add(d, "daemon", ST_OK, NULL, "shoald %s (pid %lld) on %s, %lld connected", v,
                (long long)pid, sock, (long long)jint(d->stats, "daemon.clients", 0));
    shoal_json_set_int(k->detail, "pid", pid);
    shoal_json_set_str(k->detail, "version", v ? v : "");
    shoal_client_close(c);
}

static void check_access(doctor *d)
{
    struct stat hs, ss;
    char sock[SHOAL_PATH_MAX], todo[SHOAL_PATH_MAX + 256], sockinfo[96] = "";
    const char *home = d->cli->home;
    uid_t me = geteuid();

    if (stat(home, &hs) != 0) {
        add(d, "access", ST_WARN, "shoald makes it when it starts",
            "no cache directory %s yet", home);
        return;
    }
    if (hs.st_uid != me) {
        snprintf(todo, sizeof todo, "use a cache directory of your own (--home DIR) or run as "
                 "uid %u", (unsigned)hs.st_uid);
        add(d, "access", ST_FAIL, todo, "%s belongs to uid %u, you are %u", home,
            (unsigned)hs.st_uid, (unsigned)me);
        return;
    }
    if (hs.st_mode & 022) {
        snprintf(todo, sizeof todo, "chmod go-w %s", home);
        add(d, "access", ST_FAIL, todo, "others can write %s (mode %04o)", home,
            (unsigned)(hs.st_mode & 07777));
        return;
    }
    socket_path(d, sock, sizeof sock);
    if (lstat(sock, &ss) == 0) {
        if (!S_ISSOCK(ss.st_mode) || ss.st_uid != me || (ss.st_mode & 077)) {
            add(d, "access", ST_FAIL, "stop shoald, remove the file and start shoald again (it "
                "makes its socket 0600)", "%s is %s, owner %u, mode %04o: others could reach "
                "shoald", sock, S_ISSOCK(ss.st_mode) ? "a socket" : "not a socket",
                (unsigned)ss.st_uid, (unsigned)(ss.st_mode & 07777));
            return;
        }
        snprintf(sockinfo, sizeof sockinfo, ", its socket %04o", (unsigned)(ss.st_mode & 07777));
    }
    add(d, "access", ST_OK, NULL, "%s mode %04o%s, yours", home, (unsigned)(hs.st_mode & 07777),
        sockinfo[0] ? sockinfo : " (no socket: shoald not running)");
}

/* ---- the upstream ------------------------------------------------------------------- */

static int truthy(const char *v)
{
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
                 !strcasecmp(v, "on"));
}

/* host and port of an http(s) URL; 0 or -1. */
static int url_host(const char *url, char *host, size_t cap, char *port, size_t pcap)
{
    const char *p = url, *def = "443";
    if (!strncmp(p, "https://", 8))
        p += 8;
    else if (!strncmp(p, "http://", 7))
        p += 7, def = "80";
    else
        return -1;
    size_t n = strcspn(p, "/?#");
    const char *colon = NULL;
    if (*p == '[') {                         /* [v6]:port */
        const char *rb = memchr(p, ']', n);
        if (!rb)
            return -1;
        snprintf(host, cap, "%.*s", (int)(rb - p - 1), p + 1);
        colon = rb[1] == ':' ? rb + 1 : NULL;
    } else {
        colon = memchr(p, ':', n);
        snprintf(host, cap, "%.*s", (int)(colon ? (size_t)(colon - p) : n), p);
    }
    snprintf(port, pcap, "%.*s", colon ? (int)(p + n - colon - 1) : (int)strlen(def),
             colon ? colon + 1 : def);
    return host[0] ? 0 : -1;
}

/* TCP connect to host:port within timeout_ms; 0 and *ms, or -1 with why. */
static int tcp_probe(const char *host, const char *port, int timeout_ms, double *ms,
                     char *why, size_t cap)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res = NULL;
    uint64_t t0 = shoal_now_ns();
    int g = getaddrinfo(host, port, &hints, &res), ok = -1;

    if (g != 0) {
        snprintf(why, cap, "cannot resolve %s: %s", host, gai_strerror(g));
        return -1;
    }
    snprintf(why, cap, "no answer from %s:%s within %d ms", host, port, timeout_ms);
    for (struct addrinfo *a = res; a && ok != 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            ok = 0;
        } else if (errno == EINPROGRESS) {
            struct pollfd pf = { fd, POLLOUT, 0 };
            int e = 0;
            socklen_t el = sizeof e;
            if (poll(&pf, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0) {
                if (e == 0)
                    ok = 0;
                else
                    snprintf(why, cap, "%s:%s: %s", host, port, strerror(e));
            }
        } else {
            snprintf(why, cap, "%s:%s: %s", host, port, strerror(errno));
        }
        close(fd);
    }
    freeaddrinfo(res);
    *ms = (double)(shoal_now_ns() - t0) / 1e6;
    return ok;
}

static void check_upstream(doctor *d)
{
    const char *ep = d->cli->hf_endpoint && *d->cli->hf_endpoint ? d->cli->hf_endpoint
                                                                  : "https://huggingface.co";
    char host[256], port[16], why[320];
    double ms = 0;

    if (truthy(d->cli->hf_offline)) {
        add(d, "upstream", ST_OK, NULL, "offline (HF_HUB_OFFLINE=%s in this shell): not probed; "
            "only what the cache holds can run (shoald itself does not read HF_HUB_OFFLINE)",
            d->cli->hf_offline);
        return;
    }
    if (url_host(ep, host, sizeof host, port, sizeof port) != 0) {
        add(d, "upstream", ST_FAIL, "set HF_ENDPOINT to http(s)://host[:port]",
            "HF_ENDPOINT=%s is not an http(s) URL", ep);
        return;
    }
    if (tcp_probe(host, port, 3000, &ms, why, sizeof why) != 0) {
        add(d, "upstream", ST_FAIL, "check the network or proxy, set HF_ENDPOINT to a mirror, or "
            "HF_HUB_OFFLINE=1 to use only what is cached", "%s unreachable: %s", ep, why);
        return;
    }
    check *c = add(d, "upstream", ST_OK, NULL, "%s reachable (TCP to %s:%s in %.0f ms; as this "
                   "shell sees it: shoald has its own environment)", ep, host, port, ms);
    shoal_json_set_str(c->detail, "endpoint", ep);
    shoal_json_set_num(c->detail, "connect_ms", ms);
}

/* ---- the oracle --------------------------------------------------------------------- */

static void check_oracle(doctor *d)
{
    char dir[SHOAL_PATH_MAX], say[200], todo[SHOAL_PATH_MAX + 256];
    const char *model = d->oracle;
    child ch;

    if (!d->have_engine) {
        add(d, "oracle", ST_FAIL, "install shoal-engine (above)", "not run: no shoal-engine");
        return;
    }
    if (!model) {
        char *mk[] = { d->mkmodel, "--quiet", "--preset", "oracle", "--out", dir, NULL };
        if (shoal_path_join(dir, sizeof dir, d->tmp, "oracle") != 0 ||
            run_child(mk, 60000, &ch) != 0 || ch.status != 0) {
            add(d, "oracle", ST_WARN, "build mkmodel beside shoal (make), or pass --oracle MODEL",
                "not run: mkmodel could not generate the oracle (%s)", last_line(&ch));
            child_free(&ch);
            return;
        }
        child_free(&ch);
        model = dir;
    }
    int remote = !strncmp(model, "hf://", 5);
    /* a local model's argv ends at the NULL in place of --home */
    char *run[] = { d->engine, "run", (char *)model, "--prompt", SYNTH_ORACLE_PROMPT,
                    "--max-tokens", "40", remote ? "--home" : NULL, d->cli->home, NULL };
    uint64_t t0 = shoal_now_ns();
    int rc = run_child(run, 180000, &ch);
    double secs = (double)(shoal_now_ns() - t0) / 1e9;
    char *said = (char *)ch.out.data;
    size_t n = said ? strlen(said) : 0;
    while (n && said[n - 1] == '\n')
        said[--n] = 0;
    const char *via = remote ? "through shoald" : d->oracle ? "local directory" : "a generated "
                      "oracle, run locally";
    check *c;
    if (rc != 0 || ch.status != 0 || ch.timed_out) {
        snprintf(todo, sizeof todo, "%s", remote ? "check the daemon and upstream lines above; "
                 "the engine's message says more" : "run it by hand to see: shoal-engine run "
                 "DIR --prompt ...");
        c = add(d, "oracle", ST_FAIL, todo, "shoal-engine run %s (%s) %s: %s", model, via,
                ch.timed_out ? "timed out" : "failed", last_line(&ch));
    } else if (strcmp(said ? said : "", SYNTH_ORACLE_TEXT)) {
        snprintf(say, sizeof say, "%.120s", said ? said : "");
        c = add(d, "oracle", ST_FAIL, "the engine computes wrong here: report it with `shoal "
                "doctor --json` and `shoal-engine info`", "the oracle said \"%s\", not \"%s\" "
                "(%s, %s)", say, SYNTH_ORACLE_TEXT, model, via);
    } else {
        c = add(d, "oracle", ST_OK, NULL, "\"%s\" came out right (%s, %.1f s): routing, "
                "experts%s, MXFP4, AttnRes and lm_head compute right", SYNTH_ORACLE_TEXT, via,
                secs, remote ? " fetched by shoald" : "");
    }
    shoal_json_set_str(c->detail, "model", model);
    shoal_json_set_str(c->detail, "said", said ? said : "");
    shoal_json_set_str(c->detail, "want", SYNTH_ORACLE_TEXT);
    child_free(&ch);
}

/* ---- the command ---------------------------------------------------------------- */

enum { O_JSON = 1, O_ORACLE, O_DISK_BYTES };

static const shoal_cli_opt doctor_opts[] = {
    { "json", 0, NULL, O_JSON, "the checks as JSON (shoal.doctor, docs/cli.md)" },
    { "oracle", 0, "MODEL", O_ORACLE, "run this oracle model (a directory, or hf://org/name\n"
                                      "through shoald) instead of generating one with mkmodel" },
    { "disk-bytes", 0, "SIZE", O_DISK_BYTES, "the disk measurement's file (default 64M)" },
    { NULL, 0, NULL, 0, NULL },
};

const shoal_cli_spec cmd_doctor_spec = {
    .prog = "shoal doctor",
    .synopsis = "shoal doctor [--json] [--oracle MODEL] [--disk-bytes SIZE]",
    .about = "Checks this machine, shoald and the engine, one line each:\n"
             "`ok|warn|FAIL  check  what - what to do`.  engine (shoal-engine beside shoal),\n"
             "cpu (the kernels' ISA), memory (the limit and K3's plan), disk (the cold read\n"
             "rate of the cache directory), space (free against the budget), daemon\n"
             "(shoald running, its version), access (socket and home permissions),\n"
             "upstream (HF_ENDPOINT reachable, or HF_HUB_OFFLINE), oracle (the engine\n"
             "must say exactly the oracle model's sentence).  Exit 1 when a check failed.",
    .opts = doctor_opts,
};

static void print_text(const doctor *d)
{
    int fails = 0, warns = 0;
    for (int i = 0; i < d->n; i++) {
        const check *c = &d->checks[i];
        printf("%-4s  %-8s  %s%s%s\n", st_word[c->status], c->name, c->what,
               c->todo[0] ? " — " : "", c->todo);
        fails += c->status == ST_FAIL;
        warns += c->status == ST_WARN;
    }
    if (fails)
        printf("\ndoctor: %d failed, %d warning%s: see the lines marked FAIL\n", fails, warns,
               warns == 1 ? "" : "s");
    else
        printf("\ndoctor: no failures%s\n", warns ? " (see the warnings)" : "");
}

static void print_json(doctor *d)
{
    shoal_json *root = shoal_json_object(), *arr = shoal_json_array();
    int fails = 0, warns = 0;
    for (int i = 0; i < d->n; i++) {
        check *c = &d->checks[i];
        shoal_json *o = shoal_json_object();
        shoal_json_set_str(o, "check", c->name);
        shoal_json_set_str(o, "status", st_json[c->status]);
        shoal_json_set_str(o, "what", c->what);
        shoal_json_set_str(o, "todo", c->todo);
        shoal_json_set_take(o, "detail", c->detail);
        c->detail = NULL;
        shoal_json_append_take(arr, o);
        fails += c->status == ST_FAIL;
        warns += c->status == ST_WARN;
    }
    shoal_json_set_str(root, "schema", "shoal.doctor");
    shoal_json_set_int(root, "version", 1);
    shoal_json_set_bool(root, "ok", fails == 0);
    shoal_json_set_int(root, "failures", fails);
    shoal_json_set_int(root, "warnings", warns);
    shoal_json_set_take(root, "checks", arr);
    cli_json_print(root);
    shoal_json_free(root);
}

/* -1 to go on, else the exit status. */
static int parse_args(doctor *d, int argc, char **argv)
{
    shoal_cli_parser p;
    const char *v;
    int id;

    shoal_cli_begin(&p, &cmd_doctor_spec, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case O_JSON:   d->json = 1; break;
        case O_ORACLE: d->oracle = v; break;
        case O_DISK_BYTES:
            if (shoal_size_parse(v, &d->disk_bytes) != 0 || d->disk_bytes < (1u << 20) ||
                d->disk_bytes > (16ull << 30))
                return shoal_cli_bad_value(&p, v, "a size from 1M to 16G");
            break;
        }
    }
    if (id < 0)
        return p.exit;
    if (p.optind < argc)
        return shoal_cli_usage_error(&cmd_doctor_spec, "takes no arguments ('%s')",
                                     argv[p.optind]);
    return -1;
}

/* The order a reader wants (daemon ran before space: its STATS has the
 * budget): the machine, then the daemon, then the end-to-end run. */
static void order(doctor *d)
{
    static const char *const names[] = { "engine", "cpu", "memory", "disk", "space", "daemon",
                                         "access", "upstream", "oracle" };
    check sorted[MAX_CHECKS];
    int n = 0;
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        for (int i = 0; i < d->n; i++)
            if (!strcmp(d->checks[i].name, names[k]))
                sorted[n++] = d->checks[i];
    memcpy(d->checks, sorted, sizeof sorted[0] * (size_t)n);
    d->n = n;
}

int cmd_doctor(shoal_cli *cli, int argc, char **argv)
{
    doctor *d = calloc(1, sizeof *d);
    int rc, fails = 0;

    if (!d)
        return cli_fail(SHOAL_ENOMEM, NULL);
    d->cli = cli;
    d->disk_bytes = 64u << 20;
    if ((rc = parse_args(d, argc, argv)) >= 0) {
        free(d);
        return rc;
    }
    snprintf(d->tmp, sizeof d->tmp, "%s/shoal-doctor.XXXXXX",
             cli->tmpdir && *cli->tmpdir ? cli->tmpdir : "/tmp");
    if (!mkdtemp(d->tmp)) {
        fprintf(stderr, "shoal doctor: cannot make a scratch directory in %s: %s (set TMPDIR)\n",
                cli->tmpdir ? cli->tmpdir : "/tmp", strerror(errno));
        free(d);
        return EXIT_FAIL;
    }
    sibling("shoal-engine", d->engine, sizeof d->engine);
    sibling("mkmodel", d->mkmodel, sizeof d->mkmodel);
    check_engine(d);
    check_cpu(d);
    check_memory(d);
    check_disk(d);
    check_daemon(d);      /* before space: its STATS has the budget */
    check_space(d);
    check_access(d);
    check_upstream(d);
    check_oracle(d);
    order(d);
    if (d->json)
        print_json(d);
    else
        print_text(d);
    for (int i = 0; i < d->n; i++) {
        fails += d->checks[i].status == ST_FAIL;
        shoal_json_free(d->checks[i].detail);
    }
    shoal_json_free(d->stats);
    nftw(d->tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(d);
    return fails ? EXIT_FAIL : EXIT_OK_;
}
