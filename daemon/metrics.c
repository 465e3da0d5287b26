/* metrics.c — shoald's optional /metrics: the daemon's counters in the
 * Prometheus text format (version 0.0.4), over HTTP on its own loop.
 *
 * Owns: the --metrics listener (evhttp on the daemon's event base; off
 * unless asked; loopback when no address is given), the one page it
 * serves and what it shows.  Every figure comes from memory on the loop
 * thread — the cache's counters since open, its usage table, the
 * scheduler's queues, the connection list — never from SQLite, so a
 * scrape costs microseconds and never holds the loop (DESIGN decision 12).
 * The counters restart at zero with shoald, which Prometheus's rate()
 * expects of a counter.  Does not own counting (cache/, ops.c, sched.c).
 *
 * Why off by default: the Unix socket is mode 0600 (only its user); a
 * TCP port is reachable by every local user, and on any address but
 * loopback by the network.  The page holds no model names or paths, only
 * figures, but a listener is still a decision for whoever runs shoald.
 */
#include "daemon/daemon_int.h"
#include "common/buf.h"
#include "common/log.h"
#include "common/sys.h"
#include "common/version.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* ---- the page ------------------------------------------------------------------------ */

#define PAGE_MAX (256u << 10)   /* the page is ~9 KB; a bound, not a size */

/* The page being built; the first failure sticks. */
typedef struct page {
    shoal_buf b;
    int rc;
} page;

static void family(page *b, const char *name, const char *type, const char *help)
{
    if (!b->rc)
        b->rc = shoal_buf_appendf(&b->b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void value(page *b, const char *name, const char *labels, uint64_t v)
{
    if (!b->rc)
        b->rc = shoal_buf_appendf(&b->b, "%s%s%s%s %llu\n", name, labels ? "{" : "",
                                  labels ? labels : "", labels ? "}" : "", (unsigned long long)v);
}

static void one(page *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    value(b, name, NULL, v);
}

static void requests(shoald *d, page *b)
{
    static const char *const tiers[CACHE_TIER_COUNT_] = { "disk", "ram" };
    cache_counts c[CACHE_TIER_COUNT_];

    for (int t = 0; t < CACHE_TIER_COUNT_; t++)
        cache_stats_since_open(d->cache, t, &c[t]);
    family(b, "shoald_requests_total", "counter",
           "Object requests since shoald started, by tier (disk: this cache; ram: the engines' "
           "RAM tier, as they report it) and outcome (a join waited on a transfer in flight).");
    for (int t = 0; t < CACHE_TIER_COUNT_; t++) {
        char l[64];
        snprintf(l, sizeof l, "tier=\"%s\",outcome=\"hit\"", tiers[t]);
        value(b, "shoald_requests_total", l, c[t].hits);
        snprintf(l, sizeof l, "tier=\"%s\",outcome=\"miss\"", tiers[t]);
        value(b, "shoald_requests_total", l, c[t].misses);
        snprintf(l, sizeof l, "tier=\"%s\",outcome=\"join\"", tiers[t]);
        value(b, "shoald_requests_total", l, c[t].joins);
    }
    family(b, "shoald_served_bytes_total", "counter",
           "Bytes served since shoald started, by tier.");
    for (int t = 0; t < CACHE_TIER_COUNT_; t++) {
        char l[32];
        snprintf(l, sizeof l, "tier=\"%s\"", tiers[t]);
        value(b, "shoald_served_bytes_total", l, c[t].bytes_out);
    }
}

static void upstream(shoald *d, page *b)
{
    static const char *const prio[PRIO_COUNT] = { "demand", "prefetch", "warm" };

    one(b, "shoald_upstream_bytes_total", "counter", "Bytes fetched from upstream since start.",
        d->up.bytes);
    family(b, "shoald_upstream_transfers_total", "counter",
           "Upstream transfers since start, by how they ended (parked: stopped to resume later).");
    value(b, "shoald_upstream_transfers_total", "result=\"completed\"", d->up.completed);
    value(b, "shoald_upstream_transfers_total", "result=\"failed\"", d->up.failed);
    value(b, "shoald_upstream_transfers_total", "result=\"cancelled\"", d->up.cancelled);
    value(b, "shoald_upstream_transfers_total", "result=\"parked\"", d->up.parked);
    one(b, "shoald_transfers_running", "gauge", "Upstream transfers running now.",
        sched_running(d->sched));
    family(b, "shoald_transfers_queued", "gauge", "Upstream transfers waiting, by priority.");
    for (int p = 0; p < PRIO_COUNT; p++) {
        char l[32];
        snprintf(l, sizeof l, "priority=\"%s\"", prio[p]);
        value(b, "shoald_transfers_queued", l, sched_queued(d->sched, p));
    }
}

static void cache_part(const cache_usage *up, page *b)
{
    const cache_usage u = *up;
    one(b, "shoald_cache_used_bytes", "gauge", "Bytes of committed objects in the disk cache.",
        u.used);
    one(b, "shoald_cache_budget_bytes", "gauge", "The disk cache's budget.", u.budget);
    one(b, "shoald_cache_pinned_bytes", "gauge", "Bytes of pinned objects (never evicted).",
        u.pinned);
    one(b, "shoald_cache_reserved_bytes", "gauge", "Bytes reserved by objects being written.",
        u.reserved);
    one(b, "shoald_cache_objects", "gauge", "Objects in the disk cache.", u.objects);
    one(b, "shoald_cache_evictions_total", "counter", "Objects evicted since start.", u.evicted);
    one(b, "shoald_cache_evicted_bytes_total", "counter", "Bytes evicted since start.",
        u.evicted_bytes);
}

/* The limits of docs/daemon.md "Limits": what each cap did since start,
 * and what is held against the caps now. */
static void limits_part(shoald *d, page *b)
{
    const struct daemon_bounds *n = &d->bounds;

    one(b, "shoald_connections_accepted_total", "counter", "Connections accepted since start.",
        n->accepted);
    one(b, "shoald_connections_limit", "gauge",
        "Connections at most (--max-conns, cut to the descriptor limit).", d->lim.conns);
    family(b, "shoald_connections_refused_total", "counter",
           "Newcomers refused since start (an ERROR, then closed), by cause.");
    value(b, "shoald_connections_refused_total", "cause=\"cap\"", n->refused);
    family(b, "shoald_connections_dropped_total", "counter",
           "Clients dropped since start (an ERROR naming the limit, then closed), by cause: room "
           "(made room at the cap), descriptors (--max-conn-fds, --max-fds), bytes "
           "(--max-buffered), frame_deadline (--frame-timeout).");
    value(b, "shoald_connections_dropped_total", "cause=\"room\"", n->evicted);
    value(b, "shoald_connections_dropped_total", "cause=\"descriptors\"", n->dropped_fds);
    value(b, "shoald_connections_dropped_total", "cause=\"bytes\"", n->dropped_bytes);
    value(b, "shoald_connections_dropped_total", "cause=\"frame_deadline\"", n->frame_timeouts);
    one(b, "shoald_frame_deadlines_total", "counter",
        "Frames (or HELLOs) not complete within --frame-timeout since start.", n->frame_timeouts);
    one(b, "shoald_accept_pauses_total", "counter",
        "accept() failures for want of descriptors or memory since start; each paused the "
        "listener.", n->accept_errors);
    one(b, "shoald_descriptors_queued", "gauge", "Descriptors queued to clients now.", d->out_fds);
    one(b, "shoald_descriptors_queued_limit", "gauge", "Descriptors queued to all clients at "
        "most (--max-fds, cut to the descriptor limit).", d->lim.fds);
    one(b, "shoald_buffered_bytes", "gauge", "Bytes of frames and replies held for clients now.",
        d->buffered);
    one(b, "shoald_buffered_bytes_limit", "gauge", "Bytes held for all clients at most "
        "(--max-buffered).", d->lim.buffered);
    one(b, "shoald_log_lines_suppressed_total", "counter",
        "Repeated log lines held back by the rate limit since start.", shoal_log_suppressed());
}

/* Bytes verified vs trusted (the cache's memory), and the file checks
 * since start (integrity.c). */
static void integrity_part(shoald *d, const cache_usage *u, page *b)
{
    integrity_counts n;

    family(b, "shoald_cache_object_bytes", "gauge",
           "Bytes of upstream objects cached, by how they were checked: verified (their "
           "whole file matched its upstream hash) or trusted (checked on transfer only).");
    value(b, "shoald_cache_object_bytes", "check=\"verified\"", u->verified);
    value(b, "shoald_cache_object_bytes", "check=\"trusted\"", u->trusted);
    integrity_get(d, &n);
    family(b, "shoald_file_checks_total", "counter",
           "Complete files hashed against their upstream hash since start, by result.");
    value(b, "shoald_file_checks_total", "result=\"match\"", n.files_ok);
    value(b, "shoald_file_checks_total", "result=\"mismatch\"", n.files_bad);
    one(b, "shoald_file_check_bytes_total", "counter", "Bytes those checks hashed.",
        n.bytes_hashed);
    one(b, "shoald_file_checks_queued", "gauge", "Complete files waiting for their check.",
        n.queued);
    one(b, "shoald_quarantined_bytes_total", "counter",
        "Bytes of objects removed since start because their file did not match.",
        n.quarantined_bytes);
    one(b, "shoald_refetch_jobs_total", "counter",
        "Warm jobs started since start to fetch quarantined objects again.", n.refetches);
    one(b, "shoald_damaged_reported_total", "counter",
        "Objects engines reported damaged (removed, fetched again on their next GET).",
        n.damaged);
}

static void process_part(shoald *d, page *b)
{
    unsigned jobs = work_busy(d);

    one(b, "shoald_connections", "gauge", "Clients connected to the socket.", d->nconns);
    one(b, "shoald_workers", "gauge", "Worker threads.", DAEMON_WORKERS);
    one(b, "shoald_workers_busy", "gauge", "Worker threads running a job.",
        jobs < DAEMON_WORKERS ? jobs : DAEMON_WORKERS);
    one(b, "shoald_worker_jobs_queued", "gauge", "Jobs waiting for a worker thread.",
        jobs > DAEMON_WORKERS ? jobs - DAEMON_WORKERS : 0);
    one(b, "shoald_warm_jobs_running", "gauge", "Warm jobs not finished.", warm_running(d->warm));
    one(b, "shoald_start_time_seconds", "gauge", "When shoald started (Unix time).",
        (uint64_t)(d->started_ms / 1000));
    family(b, "shoald_build_info", "gauge", "shoald's version.");
    value(b, "shoald_build_info", "version=\"" SHOAL_VERSION "\"", 1);
}

int metrics_render(shoald *d, shoal_buf *out)
{
    page b = { *out, 0 };
    cache_usage u;
    shoal_err err = { 0 };
    /* one walk of the object table (~85,000 at K3 size: well under 1 ms);
     * a writer's usage is memory and does not fail */
    int have = cache_usage_get(d->cache, &u, &err) == 0;

    requests(d, &b);
    upstream(d, &b);
    if (have)
        cache_part(&u, &b);
    limits_part(d, &b);
    if (have)
        integrity_part(d, &u, &b);
    process_part(d, &b);
    *out = b.b;
    return b.rc;
}

/* ---- HTTP ------------------------------------------------------------------------------ */

static void on_request(struct evhttp_request *req, void *arg)
{
    shoald *d = arg;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    struct evbuffer *out;
    shoal_buf b;

    if (!path || strcmp(path, "/metrics") != 0) {
        evhttp_send_error(req, HTTP_NOTFOUND, "shoald serves /metrics only");
        return;
    }
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET &&
        evhttp_request_get_command(req) != EVHTTP_REQ_HEAD) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        evhttp_send_error(req, 405, "GET only");
        return;
    }
    shoal_buf_init(&b, PAGE_MAX);
    out = evbuffer_new();
    if (!out || metrics_render(d, &b) != 0 || evbuffer_add(out, b.data, b.len) != 0) {
        evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
    } else {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                          "text/plain; version=0.0.4; charset=utf-8");
        evhttp_send_reply(req, HTTP_OK, "OK", out);
    }
    if (out)
        evbuffer_free(out);
    shoal_buf_free(&b);
}

/* "PORT", "ADDR:PORT" or "[V6]:PORT" into host (loopback when absent). */
static int parse_addr(const char *s, char *host, size_t cap, uint16_t *port)
{
    const char *colon = strrchr(s, ':');
    long p;
    size_t n;

    if (!colon) {
        snprintf(host, cap, "127.0.0.1");
        colon = s - 1;
    } else {
        const char *h = s;
        n = (size_t)(colon - s);
        if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
            h++;
            n -= 2;
        }
        if (n == 0 || n >= cap)
            return -1;
        memcpy(host, h, n);
        host[n] = '\0';
    }
    if (shoal_long_parse(colon + 1, 0, 65535, &p) != 0)
        return -1;
    *port = (uint16_t)p;
    return 0;
}

int metrics_start(shoald *d, const char *addr, shoal_err *err)
{
    char host[128];
    uint16_t port;
    struct evhttp_bound_socket *bs;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;

    if (!addr)
        return 0;
    if (parse_addr(addr, host, sizeof host, &port) != 0)
        return shoal_err_set(err, SHOAL_EINVAL, "--metrics %s: give PORT or ADDR:PORT "
                             "(127.0.0.1:9464)", addr);
    d->metrics = evhttp_new(d->base);
    if (!d->metrics)
        return shoal_err_set(err, SHOAL_ENOMEM, "cannot create the metrics server");
    evhttp_set_timeout(d->metrics, 10);
    evhttp_set_max_headers_size(d->metrics, 8192);
    evhttp_set_max_body_size(d->metrics, 0);
    /* every method reaches on_request, which answers 405 (evhttp's own
     * filter answers 501, which says the server cannot, not that it will not) */
    evhttp_set_allowed_methods(d->metrics, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                               EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
                               EVHTTP_REQ_PATCH);
    evhttp_set_gencb(d->metrics, on_request, d);
    bs = evhttp_bind_socket_with_handle(d->metrics, host, port);
    if (!bs)
        return shoal_err_set(err, SHOAL_EIO, "--metrics %s: cannot listen on %s port %u (in use, "
                             "or not an address of this machine)", addr, host, port);
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &len) == 0)
        port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                              : ((struct sockaddr_in *)&ss)->sin_port);
    snprintf(d->metrics_url, sizeof d->metrics_url, "http://%s%s%s:%u/metrics",
             strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", port);
    LOG_INFO("shoald", "metrics on %s", d->metrics_url);
    return 0;
}

void metrics_stop(shoald *d)
{
    if (d->metrics)
        evhttp_free(d->metrics);
    d->metrics = NULL;
}
