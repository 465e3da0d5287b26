/* main.c — hubget: resolve a file on a Hugging Face Hub and fetch its bytes.
 *
 * The program edge for fetcher/hub.h: reads HF_ENDPOINT and the token
 * (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, $HF_TOKEN_PATH or $HF_HOME/token or
 * ~/.cache/huggingface/token; HF_HUB_DISABLE_IMPLICIT_TOKEN=1 sends none),
 * then resolves once and GETs the whole file or one range.  With -o the
 * bytes go to a temporary file renamed into place only on success.
 * See docs/hubget.md.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/cli.h"
#include "common/hfenv.h"
#include "common/log.h"
#include "common/path.h"
#include "common/sys.h"
#include "fetcher/hub.h"

enum { OPT_ENDPOINT = 1, OPT_RANGE, OPT_OUT, OPT_INFO, OPT_STALL, OPT_NO_TOKEN, OPT_VERBOSE };

static const shoal_cli_opt OPTS[] = {
    { "endpoint", 0, "URL", OPT_ENDPOINT, "Hub endpoint (default $HF_ENDPOINT, else\nhttps://huggingface.co)" },
    { "range", 0, "A-B", OPT_RANGE, "only bytes A..B (inclusive); A- means to the end" },
    { "output", 'o', "OUT", OPT_OUT, "write to OUT (atomically: nothing is left on failure)" },
    { "info", 0, NULL, OPT_INFO, "print commit, etag, size, lfs and location; fetch nothing" },
    { "stall-timeout", 0, "S", OPT_STALL, "give up when no byte arrives for S seconds (default 30)" },
    { "no-token", 0, NULL, OPT_NO_TOKEN, "send no token even if one is configured" },
    { "verbose", 'v', NULL, OPT_VERBOSE, "debug logging on stderr" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec SPEC = {
    .prog = "hubget",
    .summary = "resolve a file on a Hugging Face Hub and fetch its bytes",
    .synopsis = "hubget [options] hf://org/name[@revision] FILE",
    .about = "Resolves FILE on a Hugging Face Hub (or a mirror, or hubmock) and writes its\n"
             "bytes to stdout or -o OUT.  A developer's tool (docs/hubget.md).",
    .opts = OPTS,
    .notes = "The token comes from HF_TOKEN, HUGGING_FACE_HUB_TOKEN, or the file\n"
             "$HF_TOKEN_PATH (default $HF_HOME/token, ~/.cache/huggingface/token).  It is\n"
             "sent only to the endpoint's host, never to the CDN a file redirects to.",
};

static int parse_range(const char *s, uint64_t *a, uint64_t *b, int *open_end)
{
    char *end;
    errno = 0;
    if (!isdigit((unsigned char)*s))
        return -1;
    *a = strtoull(s, &end, 10);
    if (errno || *end != '-')
        return -1;
    s = end + 1;
    if (*s == '\0') {
        *open_end = 1;
        return 0;
    }
    if (!isdigit((unsigned char)*s))
        return -1;
    *b = strtoull(s, &end, 10);
    if (errno || *end || *b < *a)
        return -1;
    *open_end = 0;
    return 0;
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *range = NULL, *outpath = NULL, *spec_s = NULL, *file = NULL;
    const char *val;
    int info = 0, no_token = 0, open_end = 0, fd = 1, rc = 1, id;
    long stall = 0;
    uint64_t a = 0, b = 0;
    shoal_hf_env hfe;
    char *token = NULL, tmp[SHOAL_PATH_MAX] = "";
    hub_spec spec;
    hub_options opt;
    hub_client *c = NULL;
    hub_file f;
    shoal_err err;
    shoal_cli_parser p;

    shoal_err_clear(&err);
    shoal_log_setup("hubget", SHOAL_LOG_WARN, NULL);
    shoal_cli_begin(&p, &SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &val)) > 0) {
        switch (id) {
        case OPT_INFO:     info = 1; break;
        case OPT_NO_TOKEN: no_token = 1; break;
        case OPT_VERBOSE:  shoal_log_set_level(SHOAL_LOG_DEBUG); break;
        case OPT_ENDPOINT: endpoint = val; break;
        case OPT_RANGE:    range = val; break;
        case OPT_OUT:      outpath = val; break;
        case OPT_STALL:
            if (shoal_long_parse(val, 1, 86400, &stall) != 0)
                return shoal_cli_bad_value(&p, val, "seconds, 1..86400");
            break;
        }
    }
    if (id < 0)
        return p.exit;
    if (argc - p.optind != 2)
        return shoal_cli_usage_error(&SPEC, "give hf://org/name[@revision] and FILE");
    spec_s = argv[p.optind];
    file = argv[p.optind + 1];
    if (hub_spec_parse(spec_s, &spec, &err)) {
        fprintf(stderr, "hubget: %s\n", err.msg);
        return SHOAL_EXIT_USAGE;
    }
    if (range && parse_range(range, &a, &b, &open_end))
        return shoal_cli_usage_error(&SPEC, "--range wants A-B or A- with A <= B, got '%s'",
                                     range);
    shoal_hf_env_capture(&hfe);
    if (shoal_hf_offline(&hfe)) {
        fprintf(stderr, "hubget: HF_HUB_OFFLINE is set and hubget only asks the Hub: unset it "
                "to resolve or fetch %s\n", file ? file : "the file");
        return SHOAL_EXIT_UPSTREAM;
    }
    if (!endpoint)
        endpoint = hfe.endpoint;
    token = no_token ? NULL : shoal_hf_token(&hfe);
    memset(&opt, 0, sizeof opt);
    opt.endpoint = endpoint && endpoint[0] ? endpoint : HUB_DEFAULT_ENDPOINT;
    opt.token = token;
    opt.stall_secs = stall;
    if (hub_client_new(&opt, &c, &err) || hub_file_resolve(c, &spec, file, &f, &err)) {
        fprintf(stderr, "hubget: %s\n", err.msg);
        rc = shoal_exit_for(err.code);
        goto out;
    }
    if (info) {
        printf("commit   %s\netag     %s\nsize     %" PRIu64 "\nlfs      %s\nlocation %s\n",
               f.commit, f.etag, f.size, f.is_lfs ? "yes" : "no", f.location);
        rc = 0;
        goto out;
    }
    if (range && open_end) {
        if (f.size == 0 || a >= f.size) {
            fprintf(stderr, "hubget: range %s starts past the end (%" PRIu64 " bytes)\n", range, f.size);
            goto out;
        }
        b = f.size - 1;
    }
    if (outpath) {
        snprintf(tmp, sizeof tmp, "%s.hubget-%ld.tmp", outpath, (long)getpid());
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            fprintf(stderr, "hubget: create %s: %s\n", tmp, strerror(errno));
            tmp[0] = '\0';
            goto out;
        }
    }
    if (range ? hub_range_write(c, &f, a, b, fd, &err) : hub_file_write(c, &f, fd, &err)) {
        fprintf(stderr, "hubget: %s\n", err.msg);
        rc = shoal_exit_for(err.code);
        goto out;
    }
    if (outpath) {
        if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, outpath) != 0) {
            fprintf(stderr, "hubget: writing %s: %s\n", outpath, strerror(errno));
            fd = -1;
            goto out;
        }
        fd = -1;
        tmp[0] = '\0';
    }
    rc = 0;
out:
    if (outpath && fd >= 0)
        close(fd);
    if (tmp[0])
        unlink(tmp);
    hub_client_free(c);
    free(token);
    return rc;
}
