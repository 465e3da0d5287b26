/* none.c — the ranks room without MPI (a build without `make MPI=1`):
 * --experts-over-ranks is refused with how to get it.  Replaced by
 * comm.c, lead.c and owner.c in an MPI build (Makefile).
 */
#include "engine/ranks/ranks.h"

#include <stdlib.h>

int ranks_start(int *argc, char ***argv, ranks_world *w, shoal_err *err)
{
    (void)argc;
    (void)argv;
    w->rank = 0;
    w->size = 1;
    return shoal_err_set(err, SHOAL_EUNSUPPORTED, "--experts-over-ranks: this shoal-engine was "
                         "built without MPI; build it with `make MPI=1` (needs mpicc: Debian's "
                         "libopenmpi-dev and openmpi-bin; docs/mpi.md)");
}

void ranks_abort(int code)
{
    (void)code;
    abort();
}

void ranks_finish(void)
{
}

int ranks_lead_new(const engine_model *m, const ranks_lead_options *o, ranks_lead **out,
                   shoal_err *err)
{
    (void)m;
    (void)o;
    *out = NULL;
    return shoal_err_set(err, SHOAL_EUNSUPPORTED, "built without MPI (make MPI=1)");
}

expert_source *ranks_lead_source(ranks_lead *l)
{
    (void)l;
    return NULL;
}

const engine_expert_applier *ranks_lead_applier(ranks_lead *l)
{
    (void)l;
    return NULL;
}

void ranks_lead_stats(const ranks_lead *l, ranks_stats *out)
{
    (void)l;
    *out = (ranks_stats){ 0 };
}

const char *ranks_lead_doing(const ranks_lead *l)
{
    (void)l;
    return "";
}

void ranks_lead_free(ranks_lead *l)
{
    (void)l;
}

int ranks_owner_serve(const char *spec, const ranks_owner_options *o, const ranks_world *w,
                      shoal_err *err)
{
    (void)spec;
    (void)o;
    (void)w;
    return shoal_err_set(err, SHOAL_EUNSUPPORTED, "built without MPI (make MPI=1)");
}
