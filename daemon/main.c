/* main.c — shoald: the program's edge.
 *
 * Owns: flags and environment (read here and nowhere else), the home
 * directory, logging, --detach (fork, a pipe through which the child says
 * whether it started, the parent's line saying where it runs, a pid
 * file), the service manager's notifications (sd_notify when built with
 * libsystemd: READY=1 once the socket listens, STOPPING=1, STATUS=), the
 * signal events (SIGTERM/SIGINT:
 * stop accepting, park transfers, save jobs, flush counters, exit 0;
 * SIGHUP: reopen the log), the counter flush timer, and the order in which
 * the parts are built and torn down.  docs/daemon.md is the user's page.
 */
#include "daemon/daemon_int.h"
#include "common/cli.h"
#include "common/hfenv.h"
#include "common/log.h"
#include "common/platform.h"
#include "common/sys.h"
#include "common/version.h"

#include <ctype.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

enum {
    OPT_HOME = 1, OPT_MAX_SIZE, OPT_PARALLEL, OPT_SPLIT_MIN, OPT_KEEP_SPINE, OPT_NO_KEEP_SPINE,
    OPT_LOG, OPT_LOG_LEVEL, OPT_DETACH, OPT_PID_FILE, OPT_METRICS, OPT_NO_FSYNC,
    OPT_MAX_CONNS, OPT_MAX_CONN_FDS, OPT_MAX_FDS, OPT_MAX_BUFFERED, OPT_FRAME_TIMEOUT,
    OPT_LOW_SPEED,
};

static const shoal_cli_opt OPTS[] = {
    { "home", 0, "DIR", OPT_HOME, "cache directory (default $SHOAL_HOME, else\n"
                                  "$XDG_CACHE_HOME/shoal, else ~/.cache/shoal)" },
    { "max-size", 0, "SIZE", OPT_MAX_SIZE, "cache budget (\"200G\"; default, or auto: 90% of the\n"
                                           "free disk + what the cache holds, leaving 10 GiB free)" },
    { "parallel", 0, "N", OPT_PARALLEL, "transfers at once (default 8)" },
    { "split-min", 0, "SIZE", OPT_SPLIT_MIN, "smallest part when one object goes over several\n"
                                             "connections (default 2M; 0 = never split)" },
    { "keep-spine", 0, NULL, OPT_KEEP_SPINE, "keep the BF16 spine matrices pinned after their\n"
                                             "derived pack exists (default: they become evictable)" },
    { "no-keep-spine", 0, NULL, OPT_NO_KEEP_SPINE, "return to the default" },
    { "max-conns", 0, "N", OPT_MAX_CONNS, "connections at once (default 1024; at most half\n"
                                          "the descriptors RLIMIT_NOFILE leaves)" },
    { "max-conn-fds", 0, "N", OPT_MAX_CONN_FDS, "descriptors queued to one client that does\n"
                                                "not read them (default 4096): over it, dropped" },
    { "max-fds", 0, "N", OPT_MAX_FDS, "descriptors queued to all clients (default 16384,\n"
                                      "cut to what RLIMIT_NOFILE leaves)" },
    { "max-buffered", 0, "SIZE", OPT_MAX_BUFFERED, "frames and replies held for all clients\n"
                                                   "(default 256M)" },
    { "frame-timeout", 0, "SECS", OPT_FRAME_TIMEOUT, "a frame once begun, and HELLO after the\n"
                                                     "connect, must arrive within (default 30)" },
    { "low-speed", 0, "RATE/SECS", OPT_LOW_SPEED, "a transfer slower than RATE bytes/s over\n"
                                                  "SECS is a stall, retried (default 10K/30;\n"
                                                  "off)\n"
                                                  "(settings from --max-size on are kept in\n"
                                                  "DIR/shoald.conf: a flag given here is written\n"
                                                  "there and applies at later starts)" },
    { "log", 0, "FILE", OPT_LOG, "log to FILE (SIGHUP reopens it); default stderr, or\n"
                                 "DIR/shoald.log with --detach" },
    { "log-level", 0, "error|warn|info|debug|trace", OPT_LOG_LEVEL, "default info" },
    { "detach", 0, NULL, OPT_DETACH, "run in the background; print its pid, log and socket;\n"
                                     "write a pid file" },
    { "pid-file", 0, "FILE", OPT_PID_FILE, "with --detach (default DIR/shoald.pid)" },
    { "metrics", 0, "[ADDR:]PORT", OPT_METRICS, "serve /metrics (Prometheus text) on ADDR:PORT\n"
                                                "(default address 127.0.0.1; default: off)" },
    { "no-fsync", 0, NULL, OPT_NO_FSYNC, "skip fsyncs (tests and benchmarks only)" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec SPEC = {
    .prog = "shoald",
    .summary = "the shoal cache daemon",
    .man_section = 8,
    .synopsis = "shoald [options]",
    .about = "shoal's daemon: owns the cache directory, fetches experts from upstream,\n"
             "warms the cache in the background and serves engines over a Unix socket\n"
             "($SHOAL_HOME/shoald.sock, mode 0600).  Under systemd (Type=notify) it says\n"
             "READY=1 once the socket listens.  See docs/daemon.md.",
    .opts = OPTS,
    .notes = "Upstream: HF_ENDPOINT (default https://huggingface.co); the token from\n"
             "HF_TOKEN, HUGGING_FACE_HUB_TOKEN or $HF_TOKEN_PATH ($HF_HOME/token,\n"
             "~/.cache/huggingface/token), sent only to the endpoint's host.\n"
             "HF_HUB_OFFLINE=1: never ask the Hub (the cache only).  A huggingface_hub\n"
             "cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub) is\n"
             "read in place for the same hf:// names, its blobs hashed first.",
    .man_extra =
        ".SH SIGNALS\n"
        ".TP\n.B SIGTERM, SIGINT\nstop accepting, park transfers (a later start resumes them), "
        "save warm jobs, flush counters, exit 0.\n"
        ".TP\n.B SIGHUP\nreopen the log file (after logrotate moved it).\n"
        ".SH FILES\n"
        ".TP\n.I $SHOAL_HOME/shoald.sock\nthe socket engines and shoal(1) connect to\n"
        ".TP\n.I $SHOAL_HOME/shoald.conf\nsettings kept between starts\n"
        ".TP\n.I $SHOAL_HOME/index.db, objects/\nthe cache (docs/cache-format.md)\n"
        ".TP\n.I $SHOAL_HOME/shoald.log, shoald.pid\nwith \\-\\-detach\n"
        ".SH ENVIRONMENT\n"
        "SHOAL_HOME, XDG_CACHE_HOME, HOME; HF_ENDPOINT, HF_TOKEN, HUGGING_FACE_HUB_TOKEN,\n"
        "HF_TOKEN_PATH, HF_HOME; NOTIFY_SOCKET (systemd).\n"
        ".SH \"SEE ALSO\"\nshoal(1), shoal\\-engine(1), systemd.service(5)\n",
};

typedef struct opts {
    const char *home, *log, *log_level, *pid_file, *metrics;
    const char *set[DSET_COUNT];   /* settings given (settings.c), NULL: not */
    int detach, no_fsync;
} opts;

/* -1 to go on, else the exit status. */
static int parse_args(int argc, char **argv, opts *o)
{
    shoal_cli_parser p;
    const char *v;
    int id;

    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0) {
        switch (id) {
        case OPT_DETACH:        o->detach = 1; break;
        case OPT_NO_FSYNC:      o->no_fsync = 1; break;
        case OPT_HOME:          o->home = v; break;
        case OPT_KEEP_SPINE:    o->set[DSET_KEEP_SPINE] = "yes"; break;
        case OPT_NO_KEEP_SPINE: o->set[DSET_KEEP_SPINE] = "no"; break;
        case OPT_MAX_SIZE:      o->set[DSET_MAX_SIZE] = v; break;
        case OPT_PARALLEL:      o->set[DSET_PARALLEL] = v; break;
        case OPT_SPLIT_MIN:     o->set[DSET_SPLIT_MIN] = v; break;
        case OPT_MAX_CONNS:     o->set[DSET_MAX_CONNS] = v; break;
        case OPT_MAX_CONN_FDS:  o->set[DSET_MAX_CONN_FDS] = v; break;
        case OPT_MAX_FDS:       o->set[DSET_MAX_FDS] = v; break;
        case OPT_MAX_BUFFERED:  o->set[DSET_MAX_BUFFERED] = v; break;
        case OPT_FRAME_TIMEOUT: o->set[DSET_FRAME_TIMEOUT] = v; break;
        case OPT_LOW_SPEED:     o->set[DSET_LOW_SPEED] = v; break;
        case OPT_LOG:           o->log = v; break;
        case OPT_LOG_LEVEL:     o->log_level = v; break;
        case OPT_PID_FILE:      o->pid_file = v; break;
        case OPT_METRICS:       o->metrics = v; break;
        }
    }
    if (id < 0)
        return p.exit;
    if (p.optind < argc)
        return shoal_cli_usage_error(&SPEC, "takes no arguments ('%s')", argv[p.optind]);
    return -1;
}

/* ---- systemd ------------------------------------------------------------------------ */

/* Tell the service manager (Type=notify) a state line: READY=1,
 * STOPPING=1, STATUS=....  Nothing outside systemd (no NOTIFY_SOCKET) or
 * in a build without libsystemd. */
static void notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void notify(const char *fmt, ...)
{
#ifdef HAVE_SYSTEMD
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    sd_notify(0, line);
#else
    (void)fmt;
#endif
}

/* ---- signals and timers --------------------------------------------------------- */

static void daemon_stop(shoald *d, const char *why)
{
    shoal_err err = { 0 };
    if (d->stopping)
        return;
    d->stopping = 1;
    LOG_INFO("shoald", "%s: stopping (transfers parked, counters flushed)", why);
    {
        const struct daemon_bounds *b = &d->bounds;
        if (b->refused || b->evicted || b->dropped_fds || b->dropped_bytes || b->frame_timeouts ||
            b->accept_errors)
            LOG_INFO("shoald", "limits this run: %llu connections refused, %llu made room, "
                     "%llu dropped for descriptors, %llu for bytes, %llu frame deadlines, "
                     "%llu accept failures", (unsigned long long)b->refused,
                     (unsigned long long)b->evicted, (unsigned long long)b->dropped_fds,
                     (unsigned long long)b->dropped_bytes, (unsigned long long)b->frame_timeouts,
                     (unsigned long long)b->accept_errors);
    }
    notify("STOPPING=1\nSTATUS=stopping (%s): parking transfers, flushing counters", why);
    metrics_stop(d);
    server_close(d);
    work_stop_all(d);   /* jobs end soon; work_shutdown joins them */
    upstream_park_all(d);
    sched_park_all(d->sched);
    warm_save_all(d->warm);
    conn_close_all(d);
    if (cache_flush(d->cache, &err) != 0)
        LOG_WARN("shoald", "flushing counters: %s", err.msg);
    event_base_loopexit(d->base, NULL);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    shoald *d = arg;
    (void)what;
    if (sig == SIGHUP) {
        if (shoal_log_reopen() != 0)
            LOG_WARN("shoald", "SIGHUP: could not reopen the log; keeping the old one");
        else
            LOG_INFO("shoald", "SIGHUP: log reopened");
        return;
    }
    daemon_stop(d, sig == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    shoald *d = arg;
    shoal_err err = { 0 };
    (void)fd;
    (void)what;
    static unsigned ticks;
    if (cache_flush_due(d->cache) && cache_flush(d->cache, &err) != 0)
        LOG_WARN("shoald", "flushing counters: %s", err.msg);
    /* free disk space changes under us (other files, our own blocks) */
    if (++ticks % 10 == 0 && cache_budget_refresh(d->cache, &err) != 0)
        LOG_WARN("shoald", "budget: %s", err.msg);
}

/* ---- start-up -------------------------------------------------------------------------- */

/* ---- the home's permissions ------------------------------------------------------ */

static unsigned perm_fixed;

static int perm_fix(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    mode_t want = type == FTW_D ? 0700 : 0600;
    (void)ftw;
    if (type != FTW_F && type != FTW_D)
        return 0;   /* symlinks and the unreadable are left as they are */
    if (st->st_uid == geteuid() && (st->st_mode & 07777) != want && chmod(path, want) == 0)
        perm_fixed++;
    return 0;
}

/* The home is this user's alone: refuse one owned by another user or that
 * others may write (what they planted stays a risk); make it 0700 and
 * everything under it 0700 / 0600, whatever an older shoald or a umask
 * left (blobs and index.db 0644 let another user read cached bytes and
 * the signed CDN URLs).  The walk runs only when the home or index.db is
 * not private yet (K3's 85,000 blobs: a fraction of a second, once). */
static int home_secure(const char *home, shoal_err *err)
{
    struct stat st, db;
    char idx[SHOAL_PATH_MAX];
    int walk;

    if (lstat(home, &st) != 0)
        return shoal_err_set(err, shoal_err_from_errno(errno), "%s: %s", home, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return shoal_err_set(err, SHOAL_EINVAL, "%s is not a directory: pass --home DIR", home);
    if (st.st_uid != geteuid())
        return shoal_err_set(err, SHOAL_ELOCKED, "%s belongs to uid %u, not to you (uid %u): shoald "
                             "keeps its cache in a directory that is yours alone; use --home on "
                             "a directory of your own", home, (unsigned)st.st_uid,
                             (unsigned)geteuid());
    if (st.st_mode & 0022)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "%s is writable by %s (mode %04o): another user "
                             "could have replaced its files; check them, then `chmod 700 %s`, or "
                             "use another --home", home, st.st_mode & 0002 ? "others" : "its group",
                             (unsigned)(st.st_mode & 07777), home);
    walk = (st.st_mode & 07777) != 0700;
    if (shoal_path_join(idx, sizeof idx, home, "index.db") == 0 && stat(idx, &db) == 0 &&
        (db.st_mode & 0077))
        walk = 1;
    if (walk) {
        perm_fixed = 0;
        nftw(home, perm_fix, 16, FTW_PHYS);
        LOG_INFO("shoald", "%s made private: %u files and directories set to 0600 / 0700", home,
                 perm_fixed);
    }
    return 0;
}

static int config_build(const opts *o, daemon_config *cfg, shoal_err *err)
{
    shoal_env env;
    shoal_hf_env hfe;
    int n;

    shoal_env_capture(&env);
    shoal_hf_env_capture(&hfe);
    if (shoal_home_resolve(&env, o->home, cfg->home, sizeof cfg->home, err) != 0)
        return err->code;
    if (shoal_mkdir_p(cfg->home, 0700, err) != 0)
        return err->code;
    {
        char real[PATH_MAX];
        if (realpath(cfg->home, real) && strlen(real) < sizeof cfg->home)
            memcpy(cfg->home, real, strlen(real) + 1);
    }
    if (home_secure(cfg->home, err) != 0)
        return err->code;
    n = snprintf(cfg->socket_path, sizeof cfg->socket_path, "%s/shoald.sock", cfg->home);
    if (n < 0 || (size_t)n >= sizeof cfg->socket_path)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%s/shoald.sock is too long for a Unix socket "
                             "(107 bytes at most): use a shorter --home", cfg->home);
    /* Budget, parallel, split-min, keep-spine: shoald.conf, then the flags. */
    if (settings_apply(cfg, o->set, err) != 0)
        return err->code;
    cfg->endpoint = hfe.endpoint;
    cfg->offline = shoal_hf_offline(&hfe);
    if (shoal_hf_hub_cache(&hfe, cfg->hf_cache, sizeof cfg->hf_cache) != 0)
        cfg->hf_cache[0] = '\0';
    snprintf(cfg->peer_memo, sizeof cfg->peer_memo, "%.*s/hfcache-verified.txt",
             (int)sizeof cfg->peer_memo - 32, cfg->home);
    if (cfg->endpoint && !cfg->endpoint[0])
        cfg->endpoint = NULL;
    cfg->flush_ms = 1000;
    cfg->no_fsync = o->no_fsync;
    return 0;
}

static int daemon_open(shoald *d, shoal_err *err)
{
    cache_config cc;
    cache_open_report rep;
    struct timeval tv = { 0, 0 };
    int sigs[3] = { SIGTERM, SIGINT, SIGHUP };
    int rc;

    d->listen_fd = -1;
    d->started_ms = shoal_wall_ms();
    cache_config_default(&cc);
    if (d->cfg.max_size)
        cc.max_bytes = d->cfg.max_size;
    cc.budget_fits_disk = 1;
    cc.no_fsync = d->cfg.no_fsync;
    cc.manual_wal_checkpoint = 1;   /* a worker syncs index.db (work.c), never the loop */
    {
        /* tests: checkpoints on a small model (docs/daemon.md, "What never waits") */
        const char *ck = getenv("SHOAL_CHECKPOINT_BYTES");
        uint64_t v;
        if (ck && *ck && shoal_size_parse(ck, &v) == 0 && v >= 4096)
            cc.checkpoint_bytes = v;
    }
    rc = cache_open(d->cfg.home, &cc, &d->cache, &rep, err);
    if (rc == SHOAL_ELOCKED && strstr(err->msg, "in use by process"))
        return shoal_err_wrap(err, rc, "another shoald is running on %s", d->cfg.home);
    if (rc == SHOAL_EINVAL && d->cfg.set[DSET_MAX_SIZE].from == DSET_FILE)
        return shoal_err_wrap(err, rc, "max-size = %s in %s: pass a smaller --max-size (it "
                              "replaces that line) or edit the file",
                              d->cfg.set[DSET_MAX_SIZE].text, d->cfg.conf_path);
    if (rc == SHOAL_EINVAL)
        return shoal_err_wrap(err, rc, "--max-size %s", d->cfg.set[DSET_MAX_SIZE].text);
    if (rc)
        return rc;
    if ((rc = settings_save(&d->cfg, err)) != 0)
        return rc;
    if (d->cfg.keep_spine) {
        /* BF16 matrices an earlier run let go of are pinned again */
        size_t n = 0;
        if ((rc = cache_pin_lift_clear(d->cache, &n, err)) != 0)
            return rc;
        if (n)
            LOG_INFO("shoald", "--keep-spine: %zu spine matrices pinned again", n);
    }
    LOG_INFO("shoald", "cache %s: %llu objects, %llu bytes; repair removed %llu tmp, %llu orphans; "
             "%llu partials kept", d->cfg.home, (unsigned long long)rep.objects,
             (unsigned long long)rep.bytes, (unsigned long long)rep.tmp_removed,
             (unsigned long long)rep.orphans_removed, (unsigned long long)rep.partials_kept);
    /* Workers hand their jobs back with event_active() from their own
     * threads: the base must be made thread-aware before it exists. */
    if (evthread_use_pthreads() != 0)
        return shoal_err_set(err, SHOAL_EINTERNAL, "libevent without pthreads support");
    d->base = event_base_new();
    if (!d->base)
        return shoal_err_set(err, SHOAL_ENOMEM, "cannot create the event loop");
    if ((rc = sched_new(d, &d->sched)) != 0)
        return shoal_err_set(err, rc, "cannot create the scheduler");
    if ((rc = work_init(d, err)) != 0)
        return rc;
    if ((rc = upstream_init(d, err)) != 0 || (rc = warm_new(d, &d->warm, err)) != 0)
        return rc;
    if ((rc = server_listen(d, err)) != 0)
        return rc;
    if ((rc = metrics_start(d, d->cfg.metrics, err)) != 0)
        return rc;
    for (int i = 0; i < 3; i++) {
        d->ev_sig[i] = evsignal_new(d->base, sigs[i], on_signal, d);
        if (!d->ev_sig[i] || event_add(d->ev_sig[i], NULL) != 0)
            return shoal_err_set(err, SHOAL_ENOMEM, "cannot watch signals");
    }
    d->ev_flush = event_new(d->base, -1, EV_PERSIST, on_flush, d);
    tv.tv_sec = d->cfg.flush_ms / 1000;
    tv.tv_usec = (d->cfg.flush_ms % 1000) * 1000;
    if (!d->ev_flush || event_add(d->ev_flush, &tv) != 0)
        return shoal_err_set(err, SHOAL_ENOMEM, "cannot start the flush timer");
    return 0;
}

static void daemon_close(shoald *d)
{
    server_close(d);
    metrics_stop(d);
    if (d->base)
        conn_free_all(d);
    d->stopping = 1;
    work_shutdown(d);   /* after the connections: the jobs' ends answer nobody */
    warm_free(d->warm);
    sched_free(d->sched);
    model_free_all(d);
    if (d->base)
        upstream_shutdown(d);
    for (int i = 0; i < 3; i++)
        if (d->ev_sig[i])
            event_free(d->ev_sig[i]);
    if (d->ev_flush)
        event_free(d->ev_flush);
    cache_close(d->cache);
    if (d->base)
        event_base_free(d->base);
}

/* More descriptors: every queued GET item holds one. */
static void raise_nofile(void)
{
    (void)shoal_fd_limit_raise();
}

/* Fork; the parent waits for the child's word through a pipe, says
 * where the daemon runs (pid, log, socket) and exits with it.  Returns the
 * write end in the child (-2 when the fork failed). */
static int detach(const char *log_path, const char *socket_path)
{
    int p[2];
    pid_t pid;
    if (shoal_pipe(p, SHOAL_FD_CLOEXEC) != 0)
        return -2;
    pid = fork();
    if (pid < 0)
        return -2;
    if (pid > 0) {
        char msg[1024];
        ssize_t n, got = 0;
        close(p[1]);
        while ((n = read(p[0], msg + got, sizeof msg - 1 - (size_t)got)) > 0)
            got += n;
        msg[got > 0 ? got : 0] = '\0';
        if (got > 0 && strncmp(msg, "ok", 2) == 0) {
            printf("shoald started (pid %ld), log %s, socket %s%s\n", (long)pid, log_path,
                   socket_path, msg + 2);
            fflush(stdout);
            _exit(0);
        }
        fprintf(stderr, "shoald: %s\n", got > 0 ? msg : "the daemon exited during start-up");
        _exit(1);
    }
    close(p[0]);
    setsid();
    {
        int fd = open("/dev/null", O_RDWR);
        if (fd >= 0) {
            dup2(fd, 0);
            dup2(fd, 1);
            dup2(fd, 2);
            if (fd > 2)
                close(fd);
        }
    }
    return p[1];
}

static void tell_parent(int fd, const char *msg)
{
    if (fd >= 0) {
        shoal_write_all(fd, msg, strlen(msg));
        close(fd);
    }
}

int main(int argc, char **argv)
{
    static shoald d;
    opts o = { 0 };
    shoal_err err = { 0 };
    shoal_log_level level = SHOAL_LOG_INFO;
    char log_path[SHOAL_PATH_MAX], pid_path[SHOAL_PATH_MAX];
    char *token = NULL;
    int pipe_fd = -1, rc = 1;

    if ((rc = parse_args(argc, argv, &o)) >= 0)
        return rc;
    rc = 1;
    if (o.log_level && shoal_log_level_parse(o.log_level, &level) != 0) {
        return shoal_cli_usage_error(&SPEC, "--log-level takes error|warn|info|debug|trace, "
                                     "not '%s'", o.log_level);
    }
    umask(077);   /* every file shoald makes is its user's alone */
    if (config_build(&o, &d.cfg, &err) != 0) {
        fprintf(stderr, "shoald: %s\n", err.msg);
        return err.code == SHOAL_EINVAL ? SHOAL_EXIT_USAGE : shoal_exit_for(err.code);
    }
    d.cfg.metrics = o.metrics;
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    log_path[0] = '\0';
    if (o.log)
        snprintf(log_path, sizeof log_path, "%s", o.log);
    else if (o.detach)
        shoal_path_join(log_path, sizeof log_path, d.cfg.home, "shoald.log");
    if (o.pid_file)
        snprintf(pid_path, sizeof pid_path, "%s", o.pid_file);
    else
        shoal_path_join(pid_path, sizeof pid_path, d.cfg.home, "shoald.pid");
    if (shoal_log_setup("shoald", level, log_path[0] ? log_path : NULL) != 0) {
        fprintf(stderr, "shoald: cannot open the log %s\n", log_path);
        return 1;
    }
    if (o.detach) {
        pipe_fd = detach(log_path, d.cfg.socket_path);
        if (pipe_fd == -2) {
            fprintf(stderr, "shoald: cannot detach: %s\n", strerror(errno));
            return 1;
        }
    }
    {
        shoal_hf_env hfe;
        shoal_hf_env_capture(&hfe);
        token = shoal_hf_token(&hfe);
    }
    d.cfg.token = token;
    if (daemon_open(&d, &err) != 0) {
        LOG_ERROR("shoald", "%s", err.msg);
        if (pipe_fd >= 0)
            tell_parent(pipe_fd, err.msg);
        else
            fprintf(stderr, "shoald: %s\n", err.msg);
        notify("STATUS=failed to start: %s", err.msg);
        rc = err.code == SHOAL_ELOCKED ? SHOAL_EXIT_BUSY : shoal_exit_for(err.code);
        goto out;
    }
    if (o.detach) {
        char pid[32];
        snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (shoal_write_file_atomic(pid_path, pid, strlen(pid), &err) != 0)
            LOG_WARN("shoald", "pid file: %s", err.msg);
    }
    warm_resume_all(d.warm);
    LOG_INFO("shoald", "shoald %s ready on %s (parallel %d, pid %ld)", SHOAL_VERSION,
             d.cfg.socket_path, d.cfg.parallel, (long)getpid());
    notify("READY=1\nSTATUS=serving %s%s%s", d.cfg.socket_path, d.metrics ? ", metrics " : "",
           d.metrics ? d.metrics_url : "");
    if (pipe_fd >= 0) {
        char ok[200];
        snprintf(ok, sizeof ok, "ok%s%s", d.metrics ? ", metrics " : "",
                 d.metrics ? d.metrics_url : "");
        tell_parent(pipe_fd, ok);
        pipe_fd = -1;
    } else {
        printf("shoald ready %s\n", d.cfg.socket_path);
        fflush(stdout);
    }
    event_base_dispatch(d.base);
    if (!d.stopping)
        daemon_stop(&d, "loop ended");
    rc = 0;
out:
    daemon_close(&d);
    if (o.detach && rc == 0)
        unlink(pid_path);
    if (token) {
        memset(token, 0, strlen(token));
        free(token);
    }
    LOG_INFO("shoald", "exit %d", rc);
    shoal_log_close();
    return rc;
}
