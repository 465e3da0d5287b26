/* cmd_info.c — `shoal-engine info [--json]`: what this engine binary runs
 * on: its version, the kernels' ISA it picks on this CPU and the ones this
 * build and CPU could run, and the cores it uses by default.  For
 * `shoal doctor` (which does not link the kernels) and for bug reports.
 * Owns only the printing; the ISA choice is engine/kernels/'s. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/cli.h"
#include "common/version.h"
#include "engine/cli/cli_int.h"
#include "engine/kernels/kernels.h"

static const shoal_cli_opt INFO_OPTS[] = {
    { "json", 0, NULL, 1, "one JSON object" },
    { NULL, 0, NULL, 0, NULL },
};

static const shoal_cli_spec INFO_SPEC = {
    .prog = "shoal-engine info",
    .synopsis = "shoal-engine info [--json]",
    .about = "The engine's version, the kernels' ISA it picks on this CPU (the\n"
             "best this build and CPU run), every ISA they could run, and the\n"
             "cores it uses by default.",
    .opts = INFO_OPTS,
};

int engine_cmd_info(int argc, char **argv)
{
    int json = 0, id;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    kernels_isa isa;
    shoal_cli_parser p;
    const char *v;

    shoal_cli_begin(&p, &INFO_SPEC, argc, argv);
    while ((id = shoal_cli_next(&p, &v)) > 0)
        json = 1;
    if (id < 0)
        return p.exit;
    if (p.optind < argc)
        return shoal_cli_usage_error(&INFO_SPEC, "takes no arguments ('%s')", argv[p.optind]);
    isa = kernels_init();
    printf(json ? "{\"version\":\"%s\",\"isa\":\"%s\",\"isas\":[" : "shoal-engine %s\nisa: %s\nisas:",
           SHOAL_VERSION, kernels_isa_name(isa));
    for (int i = 0, n = 0; i < KERNELS_ISA_COUNT_; i++)
        if (kernels_isa_supported((kernels_isa)i))
            printf(json ? "%s\"%s\"" : "%s%s", json ? (n++ ? "," : "") : " ",
                   kernels_isa_name((kernels_isa)i));
    printf(json ? "],\"cores\":%ld}\n" : "\ncores: %ld\n", cores > 0 ? cores : 1);
    return 0;
}
