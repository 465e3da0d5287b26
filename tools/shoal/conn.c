/* conn.c — how the CLI reaches the cache: shoald's socket first; the index
 * read-only (always allowed beside the daemon); or, for commands that
 * write while no daemon runs, the cache as its one writer.
 */
#include "tools/shoal/shoal_int.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_connect(const shoal_cli *cli, shoal_client **out, shoal_err *err)
{
    shoal_client_opts o;
    memset(&o, 0, sizeof o);
    o.home = cli->home;
    o.socket_path = cli->socket_path;
    o.name = "shoal";
    o.connect_timeout_ms = 2000;
    o.call_timeout_ms = 600000;     /* verify and gc of a big cache take a while */
    return shoal_client_connect(&o, out, err);
}

static int cache_at(const shoal_cli *cli, int read_only, cache **out, shoal_err *err)
{
    char idx[SHOAL_PATH_MAX];
    struct stat st;
    cache_config cfg;

    *out = NULL;
    if (shoal_path_join(idx, sizeof idx, cli->home, "index.db") != 0)
        return shoal_err_set(err, SHOAL_ETOOBIG, "cache path too long");
    if (stat(idx, &st) != 0)
        return shoal_err_set(err, SHOAL_ENOTFOUND, "no shoal cache in %s (nothing cached yet? "
                             "start `shoald --home %s` and warm a model, or pass --home)",
                             cli->home, cli->home);
    cache_config_default(&cfg);
    cfg.read_only = read_only;
    return cache_open(cli->home, &cfg, out, NULL, err);
}

int cli_cache_reader(const shoal_cli *cli, cache **out, shoal_err *err)
{
    return cache_at(cli, 1, out, err);
}

int cli_cache_writer(const shoal_cli *cli, cache **out, shoal_err *err)
{
    int rc = cache_at(cli, 0, out, err);
    if (rc == SHOAL_ELOCKED)
        shoal_err_wrap(err, rc, "shoald holds the cache (it was started meanwhile?); run the "
                       "command again so it goes through shoald");
    return rc;
}

int cli_exit_for(int rc)
{
    switch (rc) {
    case 0:                return EXIT_OK_;
    case SHOAL_EINVAL:     return EXIT_USAGE;
    case SHOAL_ENOTFOUND:  return EXIT_NOTFOUND;
    /* From a request: the Hub's (a failed cli_connect is EXIT_NODAEMON,
     * which its callers decide). */
    case SHOAL_ENET:
    case SHOAL_ETIMEOUT:
    case SHOAL_EAUTH:
    case SHOAL_EBUSY:
    case SHOAL_EOFFLINE:   return EXIT_UPSTREAM;
    case SHOAL_ENOSPC:     return EXIT_NOSPACE;
    case SHOAL_ELOCKED:    return EXIT_BUSY;
    case SHOAL_ECORRUPT:   return EXIT_DAMAGED;
    case SHOAL_ECANCELED:  return EXIT_DETACHED;
    default:               return EXIT_FAIL;
    }
}

int cli_fail(int rc, const shoal_err *err)
{
    fprintf(stderr, "shoal: %s\n", err && err->msg[0] ? err->msg : shoal_strerror(rc));
    return cli_exit_for(rc);
}

void cli_model_spec(const char *arg, char *out, size_t cap)
{
    struct stat st;
    char real[PATH_MAX];
    const char *p = arg;

    if (strncmp(p, "file://", 7) == 0)
        p += 7;
    /* A directory is known by its absolute path (the daemon's working
     * directory is not ours). */
    if (strncmp(arg, "hf://", 5) != 0 && stat(p, &st) == 0 && S_ISDIR(st.st_mode) &&
        realpath(p, real)) {
        snprintf(out, cap, "%s", real);
        return;
    }
    snprintf(out, cap, "%s", arg);
}

int cli_json_take(int rc, shoal_buf *b, shoal_json **out, shoal_err *err)
{
    *out = NULL;
    if (rc == 0 && !(*out = shoal_json_parse((const char *)b->data, b->len, err)))
        rc = SHOAL_EFORMAT;
    shoal_buf_free(b);
    return rc;
}

void cli_json_print(const shoal_json *j)
{
    shoal_buf out;
    shoal_buf_init(&out, 0);
    shoal_json_dump(j, SHOAL_JSON_PRETTY, &out);
    printf("%s\n", out.data ? (const char *)out.data : "");
    shoal_buf_free(&out);
}
