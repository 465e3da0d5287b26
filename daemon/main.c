/* main.c — shoald: the program's edge.
 *
 * Owns: flags and environment (read here and nowhere else), the home
 * directory, logging, --detach (fork, a pipe through which the child says
 * whether it started, a pid file), the signal events (SIGTERM/SIGINT:
 * stop accepting, park transfers, save jobs, flush counters, exit 0;
 * SIGHUP: reopen the log), the counter flush timer, and the order in which
 * the parts are built and torn down.  docs/daemon.md is the user's page.
 */
#include "daemon/daemon_int.h"
#include "common/hfenv.h"
#include "common/log.h"
#include "common/sys.h"
#include "common/version.h"

#include <ctype.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
"usage: shoald [options]\n"
"\n"
"shoal's daemon: owns the cache directory, fetches experts from upstream,\n"
"warms the cache in the background and serves engines over a Unix socket\n"
"($SHOAL_HOME/shoald.sock).  See docs/daemon.md.\n"
"\n"
"  --home DIR         cache directory (default $SHOAL_HOME, else\n"
"                     $XDG_CACHE_HOME/shoal, else ~/.cache/shoal)\n"
"  --max-size SIZE    cache budget (\"200G\"; default: 90%% of the free disk)\n"
"  --parallel N       transfers at once (default 8)\n"
"  --split-min SIZE   smallest part when one object goes over several\n"
"                     connections (default 2M; 0 = never split)\n"
"  --log FILE         log to FILE (SIGHUP reopens it); default stderr, or\n"
"                     DIR/shoald.log with --detach\n"
"  --log-level L      error|warn|info|debug|trace (default info)\n"
"  --detach           run in the background; write a pid file\n"
"  --pid-file FILE    with --detach (default DIR/shoald.pid)\n"
"  --no-fsync         skip fsyncs (tests and benchmarks only)\n"
"  --version, --help\n"
"\n"
"Upstream: HF_ENDPOINT (default https://huggingface.co); the token from\n"
"HF_TOKEN, HUGGING_FACE_HUB_TOKEN or $HF_TOKEN_PATH ($HF_HOME/token,\n"
"~/.cache/huggingface/token), sent only to the endpoint's host.\n");
}

typedef struct opts {
    const char *home, *max_size, *parallel, *split_min, *log, *log_level, *pid_file;
    int detach, no_fsync;
} opts;

static int parse_args(int argc, char **argv, opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            printf("shoald %s\n", SHOAL_VERSION);
            exit(0);
        } else if (strcmp(a, "--detach") == 0) {
            o->detach = 1;
        } else if (strcmp(a, "--no-fsync") == 0) {
            o->no_fsync = 1;
        } else if (strcmp(a, "--home") == 0) {
            slot = &o->home;
        } else if (strcmp(a, "--max-size") == 0) {
            slot = &o->max_size;
        } else if (strcmp(a, "--parallel") == 0) {
            slot = &o->parallel;
        } else if (strcmp(a, "--split-min") == 0) {
            slot = &o->split_min;
        } else if (strcmp(a, "--log") == 0) {
            slot = &o->log;
        } else if (strcmp(a, "--log-level") == 0) {
            slot = &o->log_level;
        } else if (strcmp(a, "--pid-file") == 0) {
            slot = &o->pid_file;
        } else {
            fprintf(stderr, "shoald: unknown argument %s (see --help)\n", a);
            return -1;
        }
        if (slot) {
            if (i + 1 >= argc) {
                fprintf(stderr, "shoald: %s needs a value\n", a);
                return -1;
            }
            *slot = argv[++i];
        }
    }
    return 0;
}

/* ---- signals and timers --------------------------------------------------------- */

static void daemon_stop(shoald *d, const char *why)
{
    shoal_err err = { 0 };
    if (d->stopping)
        return;
    d->stopping = 1;
    LOG_INFO("shoald", "%s: stopping (transfers parked, counters flushed)", why);
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
    if (cache_flush_due(d->cache) && cache_flush(d->cache, &err) != 0)
        LOG_WARN("shoald", "flushing counters: %s", err.msg);
}

/* ---- start-up -------------------------------------------------------------------------- */

static int config_build(const opts *o, daemon_config *cfg, shoal_err *err)
{
    shoal_env env;
    shoal_hf_env hfe;
    char *end;
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
    n = snprintf(cfg->socket_path, sizeof cfg->socket_path, "%s/shoald.sock", cfg->home);
    if (n < 0 || (size_t)n >= sizeof cfg->socket_path)
        return shoal_err_set(err, SHOAL_ETOOBIG, "%s/shoald.sock is too long for a Unix socket "
                             "(107 bytes at most): use a shorter --home", cfg->home);
    cfg->parallel = 8;
    if (o->parallel) {
        long v = strtol(o->parallel, &end, 10);
        if (*end || v < 1 || v > DAEMON_PARALLEL_MAX)
            return shoal_err_set(err, SHOAL_EINVAL, "--parallel takes 1..%d, not %s",
                                 DAEMON_PARALLEL_MAX, o->parallel);
        cfg->parallel = (int)v;
    }
    if (o->split_min) {
        if (shoal_size_parse(o->split_min, &cfg->split_min) != 0)
            return shoal_err_set(err, SHOAL_EINVAL, "--split-min: cannot read %s (try 4M, or 0)",
                                 o->split_min);
        if (cfg->split_min == 0)
            cfg->split_min = UINT64_MAX;   /* 0 on the command line: never split */
    }
    if (o->max_size && shoal_size_parse(o->max_size, &cfg->max_size) != 0)
        return shoal_err_set(err, SHOAL_EINVAL, "--max-size: cannot read %s (try 200G)",
                             o->max_size);
    cfg->endpoint = hfe.endpoint;
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
    cc.no_fsync = d->cfg.no_fsync;
    rc = cache_open(d->cfg.home, &cc, &d->cache, &rep, err);
    if (rc == SHOAL_ELOCKED)
        return shoal_err_wrap(err, rc, "another shoald is running on %s", d->cfg.home);
    if (rc)
        return rc;
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
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Fork; the parent waits for the child's word through a pipe and exits
 * with it.  Returns the write end in the child (-1 when not detaching). */
static int detach(void)
{
    int p[2];
    pid_t pid;
    if (pipe2(p, O_CLOEXEC) != 0)
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
        if (got > 0 && strcmp(msg, "ok") == 0)
            _exit(0);
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

    if (parse_args(argc, argv, &o) != 0)
        return 2;
    if (o.log_level && shoal_log_level_parse(o.log_level, &level) != 0) {
        fprintf(stderr, "shoald: --log-level takes error|warn|info|debug|trace\n");
        return 2;
    }
    if (config_build(&o, &d.cfg, &err) != 0) {
        fprintf(stderr, "shoald: %s\n", err.msg);
        return 1;
    }
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
        pipe_fd = detach();
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
    if (pipe_fd >= 0) {
        tell_parent(pipe_fd, "ok");
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
