/* testhub.h — a generated model served by tools/hubmock in a child
 * process, for unit tests that need a Hub on loopback. */
#ifndef SHOAL_TESTS_LIB_TESTHUB_H
#define SHOAL_TESTS_LIB_TESTHUB_H

#include <stddef.h>
#include <sys/types.h>

typedef struct test_hub {
    char  dir[256];        /* temporary directory; the model is dir/model */
    char  endpoint[128];   /* hubmock's Hub URL (repo "org/m") */
    pid_t pid;
} test_hub;

/* The directory holding bin/ tools ($BIN, default "bin"). */
const char *test_hub_bin_dir(void);

/* mkdtemp /tmp/shoal-NAME.XXXXXX, `mkmodel --quiet --out DIR/model`, then
 * hubmock --repo org/m=DIR/model with the extra arguments hub_args (NULL-
 * terminated, may be NULL); waits for its "hub URL" line.  0 or -1. */
int test_hub_start(test_hub *h, const char *name, const char *const *hub_args);

/* Stop hubmock and remove the directory.  0 or -1. */
int test_hub_stop(test_hub *h);

#endif
