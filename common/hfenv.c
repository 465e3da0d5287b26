/* hfenv.c — the Hugging Face endpoint and token lookup (see hfenv.h). */
#include "common/hfenv.h"
#include "common/buf.h"
#include "common/path.h"
#include "common/sys.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void shoal_hf_env_capture(shoal_hf_env *env)
{
    /* The program's edge: main() calls this once.  lint: allow getenv */
    env->endpoint = getenv("HF_ENDPOINT");                          /* lint: allow */
    env->token = getenv("HF_TOKEN");                                /* lint: allow */
    env->hub_token = getenv("HUGGING_FACE_HUB_TOKEN");              /* lint: allow */
    env->token_path = getenv("HF_TOKEN_PATH");                      /* lint: allow */
    env->hf_home = getenv("HF_HOME");                               /* lint: allow */
    env->xdg_cache_home = getenv("XDG_CACHE_HOME");                 /* lint: allow */
    env->home = getenv("HOME");                                     /* lint: allow */
    env->disable_implicit = getenv("HF_HUB_DISABLE_IMPLICIT_TOKEN"); /* lint: allow */
    env->offline = getenv("HF_HUB_OFFLINE");                        /* lint: allow */
    env->hub_cache = getenv("HF_HUB_CACHE");                        /* lint: allow */
}

static int set(const char *s) { return s && s[0]; }

/* The trimmed text of b as a new string, or NULL when empty. */
static char *trimmed(const shoal_buf *b)
{
    size_t s = 0, e = b->len;
    char *tok;
    while (s < e && isspace(b->data[s]))
        s++;
    while (e > s && isspace(b->data[e - 1]))
        e--;
    if (e == s || !(tok = malloc(e - s + 1)))
        return NULL;
    memcpy(tok, b->data + s, e - s);
    tok[e - s] = '\0';
    return tok;
}

char *shoal_hf_token(const shoal_hf_env *env)
{
    char path[SHOAL_PATH_MAX];
    shoal_buf b;
    char *tok = NULL;
    int n;

    if (set(env->disable_implicit) &&
        (strcmp(env->disable_implicit, "1") == 0 || strcasecmp(env->disable_implicit, "true") == 0))
        return NULL;
    shoal_buf_init(&b, 64 * 1024);
    if (set(env->token) || set(env->hub_token)) {
        if (shoal_buf_append_str(&b, set(env->token) ? env->token : env->hub_token) == 0)
            tok = trimmed(&b);
        shoal_buf_free(&b);
        return tok;
    }
    if (set(env->token_path))
        n = snprintf(path, sizeof path, "%s", env->token_path);
    else if (set(env->hf_home))
        n = snprintf(path, sizeof path, "%s/token", env->hf_home);
    else if (set(env->xdg_cache_home))
        n = snprintf(path, sizeof path, "%s/huggingface/token", env->xdg_cache_home);
    else if (set(env->home))
        n = snprintf(path, sizeof path, "%s/.cache/huggingface/token", env->home);
    else
        return NULL;
    if (n > 0 && (size_t)n < sizeof path && shoal_read_file(path, 64 * 1024, &b, NULL) == 0)
        tok = trimmed(&b);
    shoal_buf_free(&b);
    return tok;
}

int shoal_hf_offline(const shoal_hf_env *env)
{
    static const char *const yes[] = { "1", "true", "yes", "on" };
    if (!set(env->offline))
        return 0;
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        if (strcasecmp(env->offline, yes[i]) == 0)
            return 1;
    return 0;
}

int shoal_hf_hub_cache(const shoal_hf_env *env, char *out, size_t cap)
{
    int n;
    if (set(env->hub_cache))
        n = snprintf(out, cap, "%s", env->hub_cache);
    else if (set(env->hf_home))
        n = snprintf(out, cap, "%s/hub", env->hf_home);
    else if (set(env->xdg_cache_home))
        n = snprintf(out, cap, "%s/huggingface/hub", env->xdg_cache_home);
    else if (set(env->home))
        n = snprintf(out, cap, "%s/.cache/huggingface/hub", env->home);
    else
        return -1;
    return n > 0 && (size_t)n < cap ? 0 : -1;
}
