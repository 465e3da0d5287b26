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
#include "common/hfenv.h"
#include "common/log.h"
#include "common/path.h"
#include "common/sys.h"
#include "fetcher/hub.h"

static void usage(FILE *out)
{
    fprintf(out,
"usage: hubget [options] hf://org/name[@revision] FILE\n"
"\n"
"Resolves FILE on a Hugging Face Hub (or a mirror, or hubmock) and writes its\n"
"bytes to stdout or -o OUT.\n"
"\n"
"  --endpoint URL     Hub endpoint (default $HF_ENDPOINT, else https://huggingface.co)\n"
"  --range A-B        only bytes A..B (inclusive); A- means to the end\n"
"  -o OUT             write to OUT (atomically: nothing is left on failure)\n"
"  --info             print commit, etag, size, lfs and location; fetch nothing\n"
"  --stall-timeout S  give up when no byte arrives for S seconds (default 30)\n"
"  --no-token         send no token even if one is configured\n"
"  -v                 debug logging on stderr\n"
"\n"
"The token comes from HF_TOKEN, HUGGING_FACE_HUB_TOKEN, or the file\n"
"$HF_TOKEN_PATH (default $HF_HOME/token, ~/.cache/huggingface/token).  It is\n"
"sent only to the endpoint's host, never to the CDN a file redirects to.\n");
}

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
    int info = 0, no_token = 0, open_end = 0, fd = 1, rc = 1;
    long stall = 0;
    uint64_t a = 0, b = 0;
    shoal_hf_env hfe;
    char *token = NULL, tmp[SHOAL_PATH_MAX] = "";
    hub_spec spec;
    hub_options opt;
    hub_client *c = NULL;
    hub_file f;
    shoal_err err;

    shoal_err_clear(&err);
    shoal_log_setup("hubget", SHOAL_LOG_WARN, NULL);
    for (int i = 1; i < argc; i++) {
        const char *x = argv[i];
        int has = i + 1 < argc;
        if (strcmp(x, "--help") == 0 || strcmp(x, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(x, "--info") == 0) {
            info = 1;
        } else if (strcmp(x, "--no-token") == 0) {
            no_token = 1;
        } else if (strcmp(x, "-v") == 0) {
            shoal_log_set_level(SHOAL_LOG_DEBUG);
        } else if (has && strcmp(x, "--endpoint") == 0) {
            endpoint = argv[++i];
        } else if (has && strcmp(x, "--range") == 0) {
            range = argv[++i];
        } else if (has && strcmp(x, "-o") == 0) {
            outpath = argv[++i];
        } else if (has && strcmp(x, "--stall-timeout") == 0) {
            char *end;
            stall = strtol(argv[++i], &end, 10);
            if (*end || stall <= 0) {
                fprintf(stderr, "hubget: bad --stall-timeout '%s'\n", argv[i]);
                return 2;
            }
        } else if (x[0] == '-' && x[1]) {
            fprintf(stderr, "hubget: unknown or incomplete option '%s' (see --help)\n", x);
            return 2;
        } else if (!spec_s) {
            spec_s = x;
        } else if (!file) {
            file = x;
        } else {
            fprintf(stderr, "hubget: too many arguments (see --help)\n");
            return 2;
        }
    }
    if (!spec_s || !file) {
        usage(stderr);
        return 2;
    }
    if (hub_spec_parse(spec_s, &spec, &err)) {
        fprintf(stderr, "hubget: %s\n", err.msg);
        return 2;
    }
    if (range && parse_range(range, &a, &b, &open_end)) {
        fprintf(stderr, "hubget: --range wants A-B or A- with A <= B, got '%s'\n", range);
        return 2;
    }
    shoal_hf_env_capture(&hfe);
    if (!endpoint)
        endpoint = hfe.endpoint;
    token = no_token ? NULL : shoal_hf_token(&hfe);
    memset(&opt, 0, sizeof opt);
    opt.endpoint = endpoint && endpoint[0] ? endpoint : HUB_DEFAULT_ENDPOINT;
    opt.token = token;
    opt.stall_secs = stall;
    if (hub_client_new(&opt, &c, &err) || hub_file_resolve(c, &spec, file, &f, &err)) {
        fprintf(stderr, "hubget: %s\n", err.msg);
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
