/* comm.c — the MPI world of a run (ranks.h part 2) and the waiting both
 * sides share (ranks_int.h).  MPI build only.
 *
 * Errors are returned (MPI_ERRORS_RETURN), never the library's default
 * abort, so rank 0 can say which rank and what it waited for before it
 * ends the run with MPI_Abort.
 */
#include "engine/ranks/ranks.h"
#include "engine/ranks/ranks_int.h"

#include <mpi.h>
#include <sched.h>
#include <time.h>

#include "common/sys.h"

int ranks_mpi_check(int mpi_rc, shoal_err *err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;

    if (mpi_rc == MPI_SUCCESS)
        return 0;
    if (MPI_Error_string(mpi_rc, msg, &len) != MPI_SUCCESS)
        len = 0;
    msg[len < (int)sizeof msg ? len : (int)sizeof msg - 1] = '\0';
    return shoal_err_set(err, SHOAL_ENET, "%s: MPI error: %s", what, len ? msg : "unknown");
}

int ranks_start(int *argc, char ***argv, ranks_world *w, shoal_err *err)
{
    int provided = 0, rc;

    w->rank = 0;
    w->size = 1;
    rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS)
        return ranks_mpi_check(rc, err, "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    if (provided < MPI_THREAD_SERIALIZED)
        return shoal_err_set(err, SHOAL_EUNSUPPORTED, "--experts-over-ranks: the MPI library "
                             "gives no MPI_THREAD_SERIALIZED (serve calls MPI from its worker "
                             "thread)");
    if (w->size < 2)
        return shoal_err_set(err, SHOAL_EINVAL, "--experts-over-ranks needs at least two ranks "
                             "(mpirun -np N with N >= 2): rank 0 runs the model, ranks 1..N-1 "
                             "own its routed experts");
    return 0;
}

void ranks_abort(int code)
{
    MPI_Abort(MPI_COMM_WORLD, code);
}

void ranks_finish(void)
{
    int done = 0;
    MPI_Finalized(&done);
    if (!done)
        MPI_Finalize();
}

void ranks_poll_begin(ranks_poll *p)
{
    p->start_ns = shoal_now_ns();
    p->polls = 0;
}

void ranks_poll_pause(ranks_poll *p)
{
    struct timespec ts = { 0, 50000 };

    if (++p->polls < 200) {
        sched_yield();
        return;
    }
    if (shoal_now_ns() - p->start_ns > 1000000000ull)
        ts.tv_nsec = 1000000;
    nanosleep(&ts, NULL);
}
