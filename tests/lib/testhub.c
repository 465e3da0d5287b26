/* testhub.c — see testhub.h. */
#include "tests/lib/testhub.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char *test_hub_bin_dir(void)
{
    const char *b = getenv("BIN");
    return b && b[0] ? b : "bin";
}

int test_hub_start(test_hub *h, const char *name, const char *const *hub_args)
{
    char cmd[1024], line[512], exe[512], repo[512];
    const char *argv[32];
    size_t n = 0;
    int pfd[2];
    FILE *f;

    memset(h, 0, sizeof *h);
    h->pid = -1;
    snprintf(h->dir, sizeof h->dir, "/tmp/shoal-%s.XXXXXX", name);
    if (!mkdtemp(h->dir))
        return -1;
    snprintf(cmd, sizeof cmd, "%s/mkmodel --quiet --out %s/model", test_hub_bin_dir(), h->dir);
    if (system(cmd) != 0)
        return -1;
    snprintf(exe, sizeof exe, "%s/hubmock", test_hub_bin_dir());
    snprintf(repo, sizeof repo, "org/m=%s/model", h->dir);
    argv[n++] = exe;
    argv[n++] = "--repo";
    argv[n++] = repo;
    for (size_t i = 0; hub_args && hub_args[i] && n < 31; i++)
        argv[n++] = hub_args[i];
    argv[n] = NULL;
    if (pipe(pfd) != 0)
        return -1;
    h->pid = fork();
    if (h->pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    f = fdopen(pfd[0], "r");
    if (!f || !fgets(line, sizeof line, f) || sscanf(line, "hub %127s", h->endpoint) != 1) {
        if (f)
            fclose(f);
        return -1;
    }
    fclose(f);
    return 0;
}

int test_hub_stop(test_hub *h)
{
    char cmd[512];
    if (h->pid > 0) {
        kill(h->pid, SIGTERM);
        waitpid(h->pid, NULL, 0);
        h->pid = -1;
    }
    if (!h->dir[0])
        return 0;
    snprintf(cmd, sizeof cmd, "rm -rf %s", h->dir);
    return system(cmd) == 0 ? 0 : -1;
}
