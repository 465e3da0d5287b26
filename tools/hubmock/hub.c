/* hub.c — the Hub port: /resolve, the metadata API, and /_mock control.
 *
 * Owns: routing Hub paths, the gate (--token), the Hub's error answers
 * (X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound / GatedRepo),
 * the 302 to the CDN for LFS files with X-Repo-Commit / X-Linked-Etag /
 * X-Linked-Size / ETag, small files (200, or a relative 307 to
 * /api/resolve-cache/... with --small-redirect), and the control endpoint.
 * Does not own sending (http.c), signing (cdn.c) or hashing (repo.c).
 *
 * Routes:
 *   HEAD|GET /{org}/{name}/resolve/{rev}/{file}
 *   HEAD|GET /api/resolve-cache/models/{org}/{name}/{commit}/{file}
 *   GET      /api/models/{org}/{name}[/revision/{rev}]   {"id","sha","siblings"}
 *   GET|POST /_mock/faults[?key=value&...]   read / change fault settings
 *   GET|POST /_mock/repo?repo=org/name[&main=DIR | &rev=NAME&dir=DIR]
 */
#include "tools/hubmock/hubmock_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"

/* Percent-encode a file path for a URL, keeping '/'. */
static void url_encode_path(const char *s, shoal_buf *out)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
            || c == '-' || c == '.' || c == '_' || c == '~' || c == '/')
            shoal_buf_append_u8(out, c);
        else
            shoal_buf_appendf(out, "%%%02X", c);
    }
}

/* The gate: 0 to go on, or res filled with 401/403 GatedRepo. */
static int hub_gate(hm_server *s, const hm_request *req, const char *repo, hm_response *res)
{
    char want[1024];
    if (!s->token)
        return 0;
    if (!req->authorization) {
        hm_response_error(res, 401, "GatedRepo",
                          "Access to model %s is restricted. You must have access to it and be "
                          "authenticated to access it. Please log in.", repo);
        return -1;
    }
    snprintf(want, sizeof want, "Bearer %s", s->token);
    if (strcmp(req->authorization, want) != 0) {
        hm_response_error(res, 403, "GatedRepo",
                          "Access to model %s is restricted and you are not in the authorized "
                          "list. Visit https://huggingface.co/%s to ask for access.", repo, repo);
        return -1;
    }
    return 0;
}

/* Split "org/name/rest" into a repo id (decoded) and the raw rest. */
static int split_repo(const char *p, char *id, size_t cap, const char **rest)
{
    const char *s1 = strchr(p, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    char *dec;
    size_t n = s2 ? (size_t)(s2 - p) : strlen(p);

    if (!s1 || s1 == p || s1 + 1 == (s2 ? s2 : p + n))
        return -1;
    dec = hm_pct_decode(p, n);
    if (!dec || strlen(dec) >= cap) {
        free(dec);
        return -1;
    }
    memcpy(id, dec, strlen(dec) + 1);
    free(dec);
    *rest = s2 ? s2 + 1 : "";
    return 0;
}

static void hub_resolve(hm_server *s, const hm_request *req, hm_response *res, const char *id,
                        const char *rev_raw, size_t rev_len, const char *file_raw, int cached)
{
    hm_repo *repo = hm_repos_find(&s->repos, id);
    char *rev = hm_pct_decode(rev_raw, rev_len), *file = hm_pct_decode(file_raw, strlen(file_raw));
    const hm_snapshot *snap;
    const hm_file *f;

    if (!repo) {
        hm_response_error(res, 404, "RepoNotFound", "Repository not found: %s", id);
        goto out;
    }
    if (hub_gate(s, req, id, res))
        goto out;
    if (!rev || !rev[0] || !(snap = hm_repo_revision(repo, rev))) {
        hm_response_error(res, 404, "RevisionNotFound", "Invalid rev id: %s", rev ? rev : "");
        goto out;
    }
    if (!file || !file[0] || !(f = hm_snapshot_file(snap, file))) {
        hm_response_error(res, 404, "EntryNotFound", "Entry not found: %s at %s",
                          file ? file : "", snap->commit);
        hm_response_header(res, "X-Repo-Commit", "%s", snap->commit);
        goto out;
    }
    hm_response_header(res, "X-Repo-Commit", "%s", snap->commit);
    if (f->is_lfs) {
        char url[1024];
        hm_cdn_url(s, repo, f, url, sizeof url);
        res->status = 302;
        hm_response_header(res, "Location", "%s", url);
        hm_response_header(res, "X-Linked-Etag", "\"%s\"", f->sha256);
        hm_response_header(res, "X-Linked-Size", "%llu", (unsigned long long)f->size);
        hm_response_header(res, "ETag", "\"%s\"", f->gitsha1);
        hm_response_header(res, "Content-Type", "text/plain; charset=utf-8");
        shoal_buf_appendf(&res->mem, "Found. Redirecting to %s", url);
    } else if (s->small_redirect && !cached) {
        shoal_buf loc;
        shoal_buf_init(&loc, 0);
        shoal_buf_appendf(&loc, "/api/resolve-cache/models/%s/%s/", id, snap->commit);
        url_encode_path(f->path, &loc);
        shoal_buf_appendf(&loc, "?etag=%%22%s%%22", f->gitsha1);
        res->status = 307;
        hm_response_header(res, "Location", "%s", (const char *)loc.data);
        hm_response_header(res, "Content-Type", "text/plain; charset=utf-8");
        shoal_buf_appendf(&res->mem, "Temporary Redirect. Redirecting to %s", (const char *)loc.data);
        shoal_buf_free(&loc);
    } else {
        hm_serve_file(res, snap, f, req->range, 0);
        hm_response_header(res, "ETag", "\"%s\"", f->gitsha1);
        hm_response_header(res, "Content-Type", "application/octet-stream");
    }
out:
    free(rev);
    free(file);
}

static void hub_model_info(hm_server *s, const hm_request *req, hm_response *res, const char *id,
                           const char *rev_raw)
{
    hm_repo *repo = hm_repos_find(&s->repos, id);
    char *rev = hm_pct_decode(rev_raw, strlen(rev_raw));
    const hm_snapshot *snap;
    shoal_json *o = NULL, *sib;

    if (!repo) {
        hm_response_error(res, 404, "RepoNotFound", "Repository not found: %s", id);
        goto out;
    }
    if (hub_gate(s, req, id, res))
        goto out;
    if (!rev || !(snap = hm_repo_revision(repo, rev))) {
        hm_response_error(res, 404, "RevisionNotFound", "Invalid rev id: %s", rev ? rev : "");
        goto out;
    }
    o = shoal_json_object();
    sib = shoal_json_array();
    shoal_json_set_str(o, "id", id);
    shoal_json_set_str(o, "modelId", id);
    shoal_json_set_str(o, "sha", snap->commit);
    shoal_json_set_bool(o, "gated", s->token != NULL);
    for (size_t i = 0; i < snap->nfiles; i++) {
        shoal_json *e = shoal_json_object();
        shoal_json_set_str(e, "rfilename", snap->files[i].path);
        shoal_json_set_int(e, "size", (int64_t)snap->files[i].size);
        shoal_json_append_take(sib, e);
    }
    shoal_json_set_take(o, "siblings", sib);
    res->status = 200;
    hm_response_header(res, "Content-Type", "application/json; charset=utf-8");
    shoal_json_dump(o, SHOAL_JSON_COMPACT, &res->mem);
out:
    shoal_json_free(o);
    free(rev);
}

/* Walk a raw query: fn(key, value) for each pair, decoded.  Stops at the
 * first non-zero return. */
static int query_each(const char *q, int (*fn)(const char *, const char *, void *), void *ctx)
{
    while (q && *q) {
        const char *amp = strchr(q, '&'), *eq;
        size_t len = amp ? (size_t)(amp - q) : strlen(q);
        char *k, *v;
        int rc;
        eq = memchr(q, '=', len);
        k = hm_pct_decode(q, eq ? (size_t)(eq - q) : len);
        v = eq ? hm_pct_decode(eq + 1, len - (size_t)(eq - q) - 1) : hm_pct_decode("", 0);
        rc = k && v ? fn(k, v, ctx) : -1;
        free(k);
        free(v);
        if (rc)
            return rc;
        q = amp ? amp + 1 : NULL;
    }
    return 0;
}

typedef struct fault_ctx {
    hm_faults f;
    shoal_err err;
} fault_ctx;

static int fault_kv(const char *k, const char *v, void *arg)
{
    fault_ctx *fc = arg;
    if (strcmp(k, "clear") == 0) {
        hm_faults_clear(&fc->f);
        return 0;
    }
    return hm_faults_set(&fc->f, k, v, &fc->err) ? -1 : 0;
}

static void hub_control(hm_server *s, const hm_request *req, hm_response *res)
{
    int post = strcmp(req->method, "POST") == 0;

    res->status = 200;
    hm_response_header(res, "Content-Type", "application/json");
    if (strcmp(req->path, "/_mock/faults") == 0) {
        if (post) {
            fault_ctx fc;
            fc.f = s->faults;
            shoal_err_clear(&fc.err);
            if (query_each(req->query, fault_kv, &fc)) {
                hm_response_error(res, 400, NULL, "%s", fc.err.code ? fc.err.msg : "bad query");
                return;
            }
            if (strstr(req->query, "seed=") != NULL) {
                hm_rng_seed(&s->rng, fc.f.seed);   /* restart the sequences */
                hm_rng_seed(&s->rng2, ~fc.f.seed);
            }
            s->faults = fc.f;
            LOG_INFO("hubmock", "faults changed: %s", req->query);
        }
        hm_faults_dump(&s->faults, &res->mem);
    } else if (strcmp(req->path, "/_mock/repo") == 0) {
        char *id = hm_query_get(req->query, "repo"), *dir = hm_query_get(req->query, "main");
        char *ref = dir ? strdup("main") : hm_query_get(req->query, "rev");
        shoal_err err;
        hm_repo *r;
        if (!dir)
            dir = hm_query_get(req->query, "dir");
        if (!id) {
            hm_response_error(res, 400, NULL, "repo= is required");
        } else if (post && (!ref || !dir)) {
            hm_response_error(res, 400, NULL, "need main=DIR, or rev=NAME and dir=DIR");
        } else if (post && hm_repos_set(&s->repos, id, ref, dir, &err)) {
            hm_response_error(res, 400, NULL, "%s", err.msg);
        } else if (!(r = hm_repos_find(&s->repos, id))) {
            hm_response_error(res, 404, "RepoNotFound", "Repository not found: %s", id);
        } else {
            shoal_json *o = shoal_json_object(), *refs = shoal_json_object();
            shoal_json_set_str(o, "repo", r->id);
            for (size_t i = 0; i < r->nrefs; i++)
                shoal_json_set_str(refs, r->refs[i].name, r->refs[i].snap->commit);
            shoal_json_set_take(o, "refs", refs);
            shoal_json_dump(o, SHOAL_JSON_COMPACT, &res->mem);
            shoal_json_free(o);
        }
        free(id);
        free(dir);
        free(ref);
    } else {
        hm_response_error(res, 404, NULL, "unknown control path %s", req->path);
    }
}

int hm_hub_handle(hm_server *s, const hm_request *req, hm_response *res)
{
    const char *p = req->path, *rest, *slash;
    char id[512];

    if (strncmp(p, "/_mock/", 7) == 0) {
        hub_control(s, req, res);
        return 1;
    }
    if (hm_faults_status(s, HM_PORT_HUB, res))
        return 0;
    if (strncmp(p, "/api/resolve-cache/models/", 26) == 0) {
        if (split_repo(p + 26, id, sizeof id, &rest) == 0 && (slash = strchr(rest, '/')) != NULL) {
            hub_resolve(s, req, res, id, rest, (size_t)(slash - rest), slash + 1, 1);
            return 0;
        }
    } else if (strncmp(p, "/api/models/", 12) == 0) {
        if (split_repo(p + 12, id, sizeof id, &rest) == 0) {
            if (rest[0] == '\0')
                hub_model_info(s, req, res, id, "main");
            else if (strncmp(rest, "revision/", 9) == 0)
                hub_model_info(s, req, res, id, rest + 9);
            else
                hm_response_error(res, 404, NULL, "not found");
            return 0;
        }
    } else if (p[0] == '/' && split_repo(p + 1, id, sizeof id, &rest) == 0
               && strncmp(rest, "resolve/", 8) == 0) {
        rest += 8;
        slash = strchr(rest, '/');
        if (slash) {
            hub_resolve(s, req, res, id, rest, (size_t)(slash - rest), slash + 1, 0);
            return 0;
        }
        /* no file part: the Hub answers EntryNotFound-like 404 */
        hub_resolve(s, req, res, id, rest, strlen(rest), "", 0);
        return 0;
    }
    hm_response_error(res, 404, NULL, "Sorry, we can't find the page you are looking for.");
    return 0;
}
