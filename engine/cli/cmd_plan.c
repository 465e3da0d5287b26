/* cmd_plan.c — `shoal-engine plan MODEL`: the memory plan a run of MODEL
 * would make on this machine (or under --ram), printed without loading
 * any weight: a directory's config.json, or the manifest shoald sends for
 * an hf:// model (docs/engine.md, "The memory plan").
 *
 * Owns: its options and output.  Does not own the plan (engine/plan/) nor
 * reading the limits and the config (engine/source/ load.c).
 */
#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "common/json.h"
#include "engine/cli/cli_int.h"

enum { PLAN_JSON = CLI_OWN, PLAN_COPIES };

typedef struct plan_cmd {
    cli_opts c;
    int json;
} plan_cmd;

static const cli_option PLAN_OPTS[] = {
    { "json", 0, PLAN_JSON }, { "states", 1, PLAN_COPIES }, { NULL, 0, 0 },
};

static void usage(FILE *f)
{
    fputs("usage: shoal-engine plan MODEL [--ram SIZE] [--context N] [--spine MODE] [--json]\n"
          "\n"
          "Prints the memory plan a run of MODEL makes: the limit and where it comes\n"
          "from, the reserve, the spine's mode and resident bytes, the context and its\n"
          "KV cache and state, the scratch, the expert buffers and the RAM tier; the\n"
          "part of the spine that would be streamed when even int4 does not fit; or\n"
          "the refusal naming the smallest memory that works (exit 1).  No weight is\n"
          "read.  The options are the run's (below), but --ram plans for a machine of\n"
          "that size instead of capping this one's limit.\n"
          "\n"
          "  --json              one JSON object instead of the text\n"
          "  --states 1|2        sequence states held: 2 (serve, run --prompt: live\n"
          "                      and snapshot; the default) or 1 (run --tokens)\n", f);
}

static int plan_own(void *ctx, int id, const char *val)
{
    plan_cmd *p = ctx;
    if (id == PLAN_JSON) {
        p->json = 1;
        return 0;
    }
    if (id == PLAN_COPIES && (strcmp(val, "1") == 0 || strcmp(val, "2") == 0)) {
        p->c.load.plan.copies = val[0] - '0';
        return 0;
    }
    return -1;
}

int engine_cmd_plan(int argc, char **argv)
{
    plan_cmd p;
    plan pl;
    k3_config cfg;
    shoal_err err = { 0 };
    int rc;

    memset(&p, 0, sizeof p);
    cli_opts_init(&p.c);
    p.c.load.plan.copies = 2;
    p.c.load.plan.ram_replace = 1;       /* plan --ram: what a machine of that size would get */
    if ((rc = cli_parse("plan", argc, argv, PLAN_OPTS, plan_own, &p, usage, &p.c)) != 0)
        return rc == 1 ? 0 : 2;
    if (cli_home("plan", &p.c, &err) != 0)
        return 1;
    memset(&pl, 0, sizeof pl);
    rc = engine_load_plan(p.c.model, &p.c.load, &pl, &cfg, &err);
    if (rc != 0 && pl.verdict != PLAN_REFUSED) {
        fprintf(stderr, "plan: %s\n", err.msg);
        return 1;
    }
    if (p.json) {
        shoal_json *j = plan_to_json(&pl);
        shoal_buf b;
        shoal_buf_init(&b, 0);
        if (!j || shoal_json_dump(j, SHOAL_JSON_COMPACT, &b) != 0) {
            fprintf(stderr, "plan: out of memory\n");
            rc = SHOAL_ENOMEM;
        } else {
            printf("%.*s\n", (int)b.len, (const char *)b.data);
        }
        shoal_json_free(j);
        shoal_buf_free(&b);
    } else {
        plan_print(&pl, &cfg, stdout);
    }
    if (rc != 0 && pl.verdict == PLAN_REFUSED)
        fprintf(stderr, "plan: %s\n", err.msg);
    return rc == 0 && fflush(stdout) == 0 ? 0 : 1;
}
