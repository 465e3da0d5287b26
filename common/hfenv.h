/* hfenv.h — where the Hugging Face settings come from: the endpoint and the
 * token, found the way huggingface_hub finds them (specs/hf-hub.md §2).
 *
 * Owns: the lookup order HF_TOKEN, HUGGING_FACE_HUB_TOKEN, then the file
 * $HF_TOKEN_PATH, else $HF_HOME/token, else $XDG_CACHE_HOME/huggingface/
 * token, else ~/.cache/huggingface/token; HF_HUB_DISABLE_IMPLICIT_TOKEN=1
 * sends none; whitespace around the token is dropped.  Also HF_HUB_OFFLINE
 * and where the huggingface_hub cache is (HF_HUB_CACHE, HF_HOME/hub).  The environment is
 * captured once in main() (shoal_hf_env_capture); the lookup itself takes
 * the captured values, so library code never calls getenv.
 */
#ifndef SHOAL_HFENV_H
#define SHOAL_HFENV_H

#include <stddef.h>

typedef struct shoal_hf_env {
    const char *endpoint;           /* $HF_ENDPOINT */
    const char *token;              /* $HF_TOKEN */
    const char *hub_token;          /* $HUGGING_FACE_HUB_TOKEN */
    const char *token_path;         /* $HF_TOKEN_PATH */
    const char *hf_home;            /* $HF_HOME */
    const char *xdg_cache_home;     /* $XDG_CACHE_HOME */
    const char *home;               /* $HOME */
    const char *disable_implicit;   /* $HF_HUB_DISABLE_IMPLICIT_TOKEN */
    const char *offline;            /* $HF_HUB_OFFLINE */
    const char *hub_cache;          /* $HF_HUB_CACHE */
} shoal_hf_env;

/* For main() only: read the variables above from the process. */
void shoal_hf_env_capture(shoal_hf_env *env);

/* The token, or NULL when there is none (or implicit tokens are disabled,
 * or the file cannot be read).  Caller frees. */
char *shoal_hf_token(const shoal_hf_env *env);

/* 1 when HF_HUB_OFFLINE is set to a true value (1, true, yes, on, as
 * huggingface_hub reads it): no request goes to the Hub; what the cache
 * holds is served and anything else fails at once (SHOAL_EOFFLINE). */
int shoal_hf_offline(const shoal_hf_env *env);

/* The huggingface_hub cache directory into out: $HF_HUB_CACHE, else
 * $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub.  0, or -1 when none can be named. */
int shoal_hf_hub_cache(const shoal_hf_env *env, char *out, size_t cap);

#endif
