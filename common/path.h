/* path.h — paths, the shoal home directory, sizes as people write them.
 *
 * Owns: resolution of $SHOAL_HOME with XDG defaults (from values the
 * program read at its edge: library code never calls getenv), bounded path
 * joins, mkdir -p, and parsing/printing byte sizes ("64G", "1.5 GiB").
 */
#ifndef SHOAL_PATH_H
#define SHOAL_PATH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

#define SHOAL_PATH_MAX 4096

/* The environment values that decide where things live.  main() fills it
 * with shoal_env_capture(); tests fill it by hand.  NULL/empty = unset. */
typedef struct shoal_env {
    const char *shoal_home;      /* $SHOAL_HOME */
    const char *xdg_cache_home;  /* $XDG_CACHE_HOME */
    const char *home;            /* $HOME */
} shoal_env;

/* For main() only: read the variables above from the process. */
void shoal_env_capture(shoal_env *env);

/* The cache directory: `flag` (e.g. --home) if given, else $SHOAL_HOME,
 * else $XDG_CACHE_HOME/shoal, else $HOME/.cache/shoal.  Does not create it.
 * 0, or SHOAL_EINVAL (nothing to go on) / SHOAL_ETOOBIG (too long). */
int shoal_home_resolve(const shoal_env *env, const char *flag, char *out, size_t cap,
                       shoal_err *err);

/* out = a "/" b (b absolute: b alone).  0 or SHOAL_ETOOBIG. */
int shoal_path_join(char *out, size_t cap, const char *a, const char *b);

/* Create a directory and its parents (mode for the new ones).  0 if it
 * exists already. */
int shoal_mkdir_p(const char *path, mode_t mode, shoal_err *err);

/* Parse "123", "64K", "1.5G", "10GiB", "500MB", "2T" (K/M/G/T and KiB/MiB/...
 * are powers of 1024; KB/MB/GB/TB powers of 1000).  0 or SHOAL_EINVAL. */
int shoal_size_parse(const char *s, uint64_t *out);

/* Parse a whole decimal integer in [lo, hi] (a command-line value).
 * 0 or SHOAL_EINVAL; *out is unchanged on failure. */
int shoal_long_parse(const char *s, long lo, long hi, long *out);

/* "17.5 MiB", "1.02 GiB", "512 B" into out.  Returns out. */
char *shoal_size_format(uint64_t bytes, char *out, size_t cap);

#endif
