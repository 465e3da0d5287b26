/* ranks.h — expert parallelism over MPI (docs/mpi.md): `mpirun -np N
 * shoal-engine run|serve MODEL --experts-over-ranks`.  Rank 0 runs the
 * whole model except its routed experts; ranks 1..N-1 own the (layer,
 * expert) pairs by a fixed map (part 1), each with its own shoald, cache
 * directory, RAM tier and prefetches, and apply their experts to the
 * latent inputs rank 0 sends; rank 0 puts each output in its routing slot
 * and sums in routing order, so the logits are a single process's bits.
 *
 * Owns: the map, the MPI world (start, abort, finish), rank 0's side (an
 * expert source whose requests become prefetch notes to the owners, and
 * an expert applier, engine/forward/forward.h part 4b), and the owners'
 * service loop.  Does not own the forward pass (forward/), shoald's
 * client (source/), nor the options (cli/).
 *
 * MPI only inside this room's .c files, built with `make MPI=1` (mpicc);
 * no MPI type crosses this header.  Without MPI=1 the room is the map
 * and a refusal (ranks_start says how to build it).
 *
 * Threads: one thread at a time (MPI_THREAD_SERIALIZED): `run` calls
 * everything on its main thread; `serve` starts and finishes on the main
 * thread and runs rank 0's side on its worker thread in between.
 */
#ifndef SHOAL_ENGINE_RANKS_H
#define SHOAL_ENGINE_RANKS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "engine/forward/forward.h"
#include "engine/source/source.h"

/* ---- 1. the owner map (pure; docs/mpi.md "The map") -----------------------
 *
 * Expert e of the MoE layer whose ordinal among the MoE layers is m (0 for
 * the first MoE layer) belongs to rank 1 + (e + m) mod (N - 1).  Every rank
 * owns ⌊E/(N-1)⌋ or ⌈E/(N-1)⌉ experts of every layer (round robin), and the
 * rotation by m spreads a low expert id's traffic over the ranks layer by
 * layer.  n_ranks >= 2. */
int ranks_owner(int moe_ordinal, int32_t expert, int n_ranks);

/* Experts of one MoE layer owned by `rank` (1..n_ranks-1). */
int ranks_owned_count(int moe_ordinal, int n_experts, int rank, int n_ranks);

/* ---- 2. the world ------------------------------------------------------------ */

typedef struct ranks_world {
    int rank, size;
} ranks_world;

/* MPI_Init_thread (funneled), errors returned instead of aborting, rank
 * and size.  At least two ranks.  SHOAL_EUNSUPPORTED when built without
 * MPI=1; SHOAL_EINVAL for a world of one. */
int ranks_start(int *argc, char ***argv, ranks_world *w, shoal_err *err);
/* End every rank of the run with `code` (MPI_Abort): after rank 0 has
 * printed why.  Does not return. */
void ranks_abort(int code);
/* MPI_Finalize, after a clean end on every rank. */
void ranks_finish(void);

/* ---- 3. rank 0 --------------------------------------------------------------- */

typedef struct ranks_lead ranks_lead;

typedef struct ranks_lead_options {
    int timeout_ms;            /* an owner silent this long fails the run; <= 0: 60 s */
    size_t chunk;              /* the session's chunk (most rows per expert) */
    kernels_numerics experts;  /* the session's expert numerics */
} ranks_lead_options;

/* Communication figures of rank 0 (docs/mpi.md, "Measured"). */
typedef struct ranks_stats {
    uint64_t layers;           /* MoE layer runs applied by owners */
    uint64_t experts;          /* (layer run, expert) pairs applied */
    uint64_t rows;             /* token-expert rows sent */
    uint64_t bytes_out;        /* inputs sent (work messages) */
    uint64_t bytes_in;         /* outputs received */
    uint64_t notes, note_bytes;/* prefetch notes sent and their bytes */
    uint64_t messages;         /* messages sent and received (notes included) */
    uint64_t span_ns;          /* sum over layer runs: inputs sent .. last output in */
    uint64_t wait_ns;          /* of it, rank 0 waiting (after its shared experts) */
    uint64_t owner_ns;         /* sum over layer runs of the busiest owner's time */
} ranks_stats;

/* Rank 0's side, once the model is bound: waits (up to the timeout) for
 * every owner's hello, checks they opened the same model, and sends them
 * the session's chunk and numerics.  A failed owner's message is the
 * error ("rank 2: ...").  m borrowed for the lead's life. */
int ranks_lead_new(const engine_model *m, const ranks_lead_options *o, ranks_lead **out,
                   shoal_err *err);
/* The expert source for the session (requests become prefetch notes to
 * the owners; fetch is refused) and the applier; both borrowed. */
expert_source *ranks_lead_source(ranks_lead *l);
const engine_expert_applier *ranks_lead_applier(ranks_lead *l);
void ranks_lead_stats(const ranks_lead *l, ranks_stats *out);
/* What rank 0 waits for now, one line; always NUL-terminated, so a signal
 * handler may write it. */
const char *ranks_lead_doing(const ranks_lead *l);
/* Tell every owner the run is over (they return from ranks_owner_serve)
 * and free.  Accepts NULL. */
void ranks_lead_free(ranks_lead *l);

/* ---- 4. the owners ------------------------------------------------------------ */

typedef struct ranks_owner_options {
    /* MODEL's load options: shoald's home (already this rank's), timeout,
     * page cache, read parts; plan.ram, plan.expert_ram(_set) and
     * plan.threads size this rank's RAM tier and compute threads */
    const engine_load_options *load;
    FILE *stats_out;           /* the rank's tier figures at the end; NULL: none */
} ranks_owner_options;

/* Serve rank 0 until it says the run is over: open MODEL (hf:// through
 * this rank's shoald with a RAM tier of the owned experts; a directory is
 * bound whole), say hello, then apply the experts rank 0 sends, each
 * output sent as soon as it is computed.  A failure to open or fetch is
 * sent to rank 0, which ends the run.  0 after a clean end. */
int ranks_owner_serve(const char *spec, const ranks_owner_options *o, const ranks_world *w,
                      shoal_err *err);

#endif
