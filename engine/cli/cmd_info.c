/* cmd_info.c — `shoal-engine info [--json]`: what this engine binary runs
 * on: its version, the kernels' ISA it picks on this CPU and the ones this
 * build and CPU could run, and the cores it uses by default.  For
 * `shoal doctor` (which does not link the kernels) and for bug reports.
 * Owns only the printing; the ISA choice is engine/kernels/'s. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/version.h"
#include "engine/cli/cli_int.h"
#include "engine/kernels/kernels.h"

int engine_cmd_info(int argc, char **argv)
{
    int json = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    kernels_isa isa = kernels_init();

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: shoal-engine info [--json]\n\n"
                   "The engine's version, the kernels' ISA it picks on this CPU (the\n"
                   "best this build and CPU run), every ISA they could run, and the\n"
                   "cores it uses by default.\n");
            return 0;
        } else {
            fprintf(stderr, "info: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    printf(json ? "{\"version\":\"%s\",\"isa\":\"%s\",\"isas\":[" : "shoal-engine %s\nisa: %s\nisas:",
           SHOAL_VERSION, kernels_isa_name(isa));
    for (int i = 0, n = 0; i < KERNELS_ISA_COUNT_; i++)
        if (kernels_isa_supported((kernels_isa)i))
            printf(json ? "%s\"%s\"" : "%s%s", json ? (n++ ? "," : "") : " ",
                   kernels_isa_name((kernels_isa)i));
    printf(json ? "],\"cores\":%ld}\n" : "\ncores: %ld\n", cores > 0 ? cores : 1);
    return 0;
}
