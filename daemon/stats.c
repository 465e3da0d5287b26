/* stats.c — the STATS answer: the cache's "shoal.stats" report
 * (cache_report_stats, docs/stats-json.md) with what only the running
 * daemon knows added under "daemon".
 *
 * Owns: parsing the query, the live figures handed to the report (upstream
 * transfers since start, clients, running jobs), and the "daemon" extras:
 * scheduler queues, upstream counters from the fetcher, bytes served since
 * start, warm jobs, live connections with their counts, the limits (what
 * each cap holds and did) and the integrity figures since start.  The report itself
 * is built by cache/report.c, so `shoal stats` shows the same figures
 * whether it asks shoald or reads the index.  Does not own counting
 * (cache/, ops.c).
 */
#include "daemon/daemon_int.h"
#include "common/json.h"
#include "common/log.h"
#include "common/sys.h"
#include "common/version.h"
#include "fetcher/fetch.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static shoal_json *counts_json(const cache_counts *c, int with_bytes)
{
    shoal_json *o = shoal_json_object();
    if (!o)
        return NULL;
    shoal_json_set_int(o, "hits", (int64_t)c->hits);
    shoal_json_set_int(o, "misses", (int64_t)c->misses);
    shoal_json_set_int(o, "joins", (int64_t)c->joins);
    shoal_json_set_num(o, "hit_rate", cache_counts_hit_rate(c));
    if (with_bytes) {
        shoal_json_set_int(o, "bytes_in", (int64_t)c->bytes_in);
        shoal_json_set_int(o, "bytes_out", (int64_t)c->bytes_out);
        shoal_json_set_num(o, "wait_ms", (double)c->wait_ns / 1e6);
    }
    return o;
}

/* ---- sessions -------------------------------------------------------------------------- */

static shoal_json *session_json(uint64_t id, int64_t pid, const char *program, int64_t started,
                                int64_t ended, const cache_counts *c)
{
    shoal_json *o = counts_json(c, 1);
    if (!o)
        return NULL;
    shoal_json_set_int(o, "id", (int64_t)id);
    shoal_json_set_int(o, "pid", pid);
    shoal_json_set_str(o, "program", program);
    shoal_json_set_int(o, "started_ms", started);
    shoal_json_set_int(o, "ended_ms", ended);
    return o;
}

/* ---- the document ------------------------------------------------------------------------ */

static shoal_json *upstream_json(shoald *d)
{
    shoal_json *o = shoal_json_object();
    fetch_stats t = { 0 };
    if (!o)
        return NULL;
    for (int i = 0; i < DAEMON_MODELS_MAX; i++) {
        fetch_stats s;
        if (!d->models[i])
            continue;
        upstream_stats(d->models[i], &s);
        t.requests += s.requests;
        t.resolves += s.resolves;
        t.retries += s.retries;
        t.refused += s.refused;
        t.resumed += s.resumed;
    }
    shoal_json_set_int(o, "transfers", (int64_t)d->up.started);
    shoal_json_set_int(o, "completed", (int64_t)d->up.completed);
    shoal_json_set_int(o, "failed", (int64_t)d->up.failed);
    shoal_json_set_int(o, "cancelled", (int64_t)d->up.cancelled);
    shoal_json_set_int(o, "parked", (int64_t)d->up.parked);
    shoal_json_set_int(o, "bytes", (int64_t)d->up.bytes);
    shoal_json_set_num(o, "transfer_ms", (double)d->up.wait_ns / 1e6);
    shoal_json_set_int(o, "requests", (int64_t)t.requests);
    shoal_json_set_int(o, "resolves", (int64_t)t.resolves);
    shoal_json_set_int(o, "retries", (int64_t)t.retries);
    shoal_json_set_int(o, "refused", (int64_t)t.refused);
    shoal_json_set_int(o, "resumed", (int64_t)t.resumed);
    return o;
}

static shoal_json *sched_json(shoald *d)
{
    shoal_json *o = shoal_json_object(), *q = shoal_json_object();
    if (!o || !q) {
        shoal_json_free(o);
        shoal_json_free(q);
        return NULL;
    }
    shoal_json_set_int(o, "parallel", d->cfg.parallel);
    shoal_json_set_int(o, "running", (int64_t)sched_running(d->sched));
    shoal_json_set_int(q, "demand", (int64_t)sched_queued(d->sched, PRIO_DEMAND));
    shoal_json_set_int(q, "prefetch", (int64_t)sched_queued(d->sched, PRIO_PREFETCH));
    shoal_json_set_int(q, "warm", (int64_t)sched_queued(d->sched, PRIO_WARM));
    shoal_json_set_take(o, "queued", q);
    return o;
}

/* The query: {"model": spec or null, "by": "none|layer|expert|session"},
 * both optional (docs/protocol.md, STATS). */
static int query_parse(const char *query, size_t qlen, char *spec, size_t cap,
                       cache_report_by *by, shoal_err *err)
{
    static const char *const names[] = { "none", "layer", "expert", "session" };
    shoal_json *q, *v;
    int rc = 0;

    spec[0] = '\0';
    *by = CACHE_REPORT_BY_NONE;
    if (qlen == 0)
        return 0;
    q = shoal_json_parse(query, qlen, err);
    if (!q || shoal_json_typeof(q) != SHOAL_JSON_OBJECT) {
        shoal_json_free(q);
        return shoal_err_set(err, SHOAL_EINVAL, "STATS: the query must be a JSON object");
    }
    v = shoal_json_get(q, "model");
    if (v && shoal_json_typeof(v) == SHOAL_JSON_STRING)
        snprintf(spec, cap, "%s", shoal_json_str_value(v));
    else if (v && shoal_json_typeof(v) != SHOAL_JSON_NULL)
        rc = shoal_err_set(err, SHOAL_EINVAL, "STATS: \"model\" must be a string or null");
    v = shoal_json_get(q, "by");
    if (rc == 0 && v) {
        const char *b = shoal_json_typeof(v) == SHOAL_JSON_STRING ? shoal_json_str_value(v) : "";
        unsigned i = 0;
        while (i < 4 && strcmp(b, names[i]) != 0)
            i++;
        if (i == 4)
            rc = shoal_err_set(err, SHOAL_EINVAL, "STATS: \"by\" is none, layer, expert or session");
        else
            *by = (cache_report_by)i;
    }
    shoal_json_free(q);
    return rc;
}

/* The automatic file checks since start (integrity.c). */
static shoal_json *integrity_json(shoald *d)
{
    integrity_counts n;
    cache_usage u;
    shoal_err e = { 0 };
    shoal_json *o = shoal_json_object();
    if (!o)
        return NULL;
    integrity_get(d, &n);
    if (cache_usage_get(d->cache, &u, &e) == 0) {   /* memory: as /metrics shows them */
        shoal_json_set_int(o, "verified_bytes", (int64_t)u.verified);
        shoal_json_set_int(o, "trusted_bytes", (int64_t)u.trusted);
    }
    shoal_json_set_int(o, "checks", (int64_t)n.checks);
    shoal_json_set_int(o, "files_ok", (int64_t)n.files_ok);
    shoal_json_set_int(o, "files_bad", (int64_t)n.files_bad);
    shoal_json_set_int(o, "bytes_hashed", (int64_t)n.bytes_hashed);
    shoal_json_set_int(o, "quarantined_bytes", (int64_t)n.quarantined_bytes);
    shoal_json_set_int(o, "refetch_jobs", (int64_t)n.refetches);
    shoal_json_set_int(o, "damaged_reported", (int64_t)n.damaged);
    shoal_json_set_int(o, "files_queued", (int64_t)n.queued);
    shoal_json_set_bool(o, "checking", n.running != 0);
    {   /* HF cache objects served: each from a blob verified against its etag (peer.c) */
        peer_counts pc;
        peer_get(d, &pc);
        shoal_json_set_int(o, "peer_verified_bytes", (int64_t)pc.bytes);
    }
    return o;
}

/* The limits (docs/daemon.md "Limits"): each cap, what is held against it
 * now, and what the caps did since start.  Counters kept as they happen
 * (server.c, conn.c): building this is a few stores. */
static shoal_json *limits_json(shoald *d)
{
    const struct daemon_bounds *n = &d->bounds;
    shoal_json *o = shoal_json_object(), *refused = shoal_json_object(),
               *dropped = shoal_json_object();
    if (!o || !refused || !dropped) {
        shoal_json_free(o);
        shoal_json_free(refused);
        shoal_json_free(dropped);
        return NULL;
    }
    shoal_json_set_int(o, "connections", (int64_t)d->nconns);
    shoal_json_set_int(o, "connections_limit", (int64_t)d->lim.conns);
    shoal_json_set_int(o, "descriptors_queued", (int64_t)d->out_fds);
    shoal_json_set_int(o, "descriptors_queued_limit", (int64_t)d->lim.fds);
    shoal_json_set_int(o, "descriptors_per_connection_limit", (int64_t)d->lim.conn_fds);
    shoal_json_set_int(o, "buffered_bytes", (int64_t)d->buffered);
    shoal_json_set_int(o, "buffered_bytes_limit", (int64_t)d->lim.buffered);
    shoal_json_set_int(o, "frame_timeout_s", (int64_t)d->lim.frame_secs);
    shoal_json_set_int(o, "accepted", (int64_t)n->accepted);
    shoal_json_set_int(refused, "cap", (int64_t)n->refused);
    shoal_json_set_take(o, "refused", refused);
    shoal_json_set_int(dropped, "room", (int64_t)n->evicted);
    shoal_json_set_int(dropped, "descriptors", (int64_t)n->dropped_fds);
    shoal_json_set_int(dropped, "bytes", (int64_t)n->dropped_bytes);
    shoal_json_set_int(dropped, "frame_deadline", (int64_t)n->frame_timeouts);
    shoal_json_set_take(o, "dropped", dropped);
    shoal_json_set_int(o, "frame_deadlines", (int64_t)n->frame_timeouts);
    shoal_json_set_int(o, "accept_pauses", (int64_t)n->accept_errors);
    shoal_json_set_int(o, "log_lines_suppressed", (int64_t)shoal_log_suppressed());
    return o;
}

/* What only the running daemon knows, added to the report's "daemon". */
static void daemon_extra(shoald *d, shoal_json *o)
{
    shoal_json *jobs = shoal_json_array(), *live = shoal_json_array();
    shoal_json_set_int(o, "pid", (int64_t)getpid());
    shoal_json_set_str(o, "version", SHOAL_VERSION);
    shoal_json_set_int(o, "bytes_served", (int64_t)d->bytes_served);
    shoal_json_set_take(o, "scheduler", sched_json(d));
    shoal_json_set_take(o, "settings", settings_json(&d->cfg));
    shoal_json_set_take(o, "upstream", upstream_json(d));
    shoal_json_set_take(o, "integrity", integrity_json(d));
    shoal_json_set_take(o, "hfcache", peer_json(d));
    shoal_json_set_take(o, "limits", limits_json(d));
    if (jobs) {
        warm_stats_json(d->warm, jobs);
        shoal_json_set_take(o, "jobs", jobs);
    }
    if (live) {
        for (conn *c = d->conns; c; c = c->next)
            if (c->hello)
                shoal_json_append_take(live, session_json(c->session, c->pid, c->program,
                                                          c->started_ms, 0, &c->counts));
        shoal_json_set_take(o, "connections", live);
    }
}

/* Each open model's row says how its upstream stands ("online", "local",
 * "offline": HF_HUB_OFFLINE, "unreachable": its revision is the last known
 * commit); a model no engine has open has no "upstream". */
static void models_upstream(shoald *d, shoal_json *root)
{
    shoal_json *ms = shoal_json_get(root, "models");
    for (size_t i = 0; ms && i < shoal_json_array_size(ms); i++) {
        shoal_json *row = shoal_json_array_at(ms, i);
        int64_t v;
        if (shoal_json_int(row, "id", &v, NULL) != 0)
            continue;
        for (int k = 0; k < DAEMON_MODELS_MAX; k++)
            if (d->models[k] && d->models[k]->model_id == v) {
                shoal_json_set_str(row, "upstream", upstream_state_name(d->models[k]));
                break;
            }
    }
}

int stats_json(shoald *d, const char *query, size_t qlen, shoal_buf *out, shoal_err *err)
{
    char spec[SHOAL_PROTO_MAX_STR + 1];
    cache_report_live live = { 0 };
    cache_report_opts o = { 0 };
    shoal_buf rep;
    shoal_json *root = NULL, *dj;
    unsigned jobs = 0, clients = 0;
    int rc = query_parse(query, qlen, spec, sizeof spec, &o.by, err);

    if (rc)
        return rc;
    for (conn *c = d->conns; c; c = c->next)
        clients += c->hello != 0;
    jobs = warm_running(d->warm);
    live = (cache_report_live){ d->started_ms, d->up.started, d->up.completed, d->up.failed,
                                d->up.bytes, d->up.wait_ns, clients, jobs };
    o.model = spec[0] ? spec : NULL;
    o.max_sessions = DAEMON_RECENT_SESSIONS;
    o.source = "daemon";
    o.live = &live;
    shoal_buf_init(&rep, 0);
    rc = cache_report_stats(d->cache, &o, &rep, err);
    if (rc == 0 && !(root = shoal_json_parse((const char *)rep.data, rep.len, err)))
        rc = SHOAL_EINTERNAL;
    shoal_buf_free(&rep);
    if (rc)
        return rc;
    dj = shoal_json_get(root, "daemon");
    if (dj && shoal_json_typeof(dj) == SHOAL_JSON_OBJECT)
        daemon_extra(d, dj);
    models_upstream(d, root);
    if (shoal_json_dump(root, SHOAL_JSON_COMPACT, out) != 0)
        rc = shoal_err_set(err, SHOAL_ETOOBIG, "the statistics exceed %u MiB: ask for one "
                           "model or a coarser \"by\"", DAEMON_JSON_MAX >> 20);
    shoal_json_free(root);
    return rc;
}
