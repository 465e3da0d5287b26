/* ranks_int.h — the messages between rank 0 and the owners, and the
 * polling both sides wait with.  Private to engine/ranks/ (MPI build).
 *
 * Every message is on MPI_COMM_WORLD, MPI_BYTE, in host byte order (the
 * ranks of one run are one architecture: the same binary).  Tags:
 *
 *   tag         from -> to   body
 *   HELLO       owner -> 0   ranks_hello: status, the model's sizes, error text
 *   SETUP       0 -> owner   ranks_setup: chunk, numerics, timeout
 *   NOTE        0 -> owner   int32 layer, prefetch, n, ids[n]: expert_source_request
 *   WORK        0 -> owner   ranks_work: layer, n ids, rows; ids[n], cnt[n];
 *                            float rows [Σcnt][L], expert by expert, each
 *                            expert's rows in the layer's pair order
 *   OUT + j     owner -> 0   ranks_out, then float [cnt[j]][L]: the j-th
 *                            expert's outputs (j < E, so tags stay < 64 + 1024)
 *   DONE        owner -> 0   ranks_done: the layer's time on the owner
 *   FAIL        owner -> 0   char[RANKS_FAIL_MAX]: why the owner cannot go on
 *   END         0 -> owner   nothing: the run is over
 *
 * MPI keeps the order of messages from one sender on one communicator, so
 * an owner sees a layer's NOTE before its WORK, as a single process asks
 * its source before it fetches.
 */
#ifndef SHOAL_ENGINE_RANKS_INT_H
#define SHOAL_ENGINE_RANKS_INT_H

#include <stdint.h>

#include "common/err.h"

enum {
    RANKS_TAG_HELLO = 1, RANKS_TAG_SETUP, RANKS_TAG_NOTE, RANKS_TAG_WORK, RANKS_TAG_DONE,
    RANKS_TAG_FAIL, RANKS_TAG_END, RANKS_TAG_OUT = 64
};

#define RANKS_FAIL_MAX 512
#define RANKS_MAX_EXPERTS 1024

typedef struct ranks_hello {
    int32_t status;              /* 0, or the owner's negative shoal code */
    int32_t n_layers, n_experts, latent, inter;
    int32_t pad;
    uint64_t expert_bytes;
    char msg[RANKS_FAIL_MAX];    /* status != 0: why */
} ranks_hello;

typedef struct ranks_setup {
    int32_t chunk, numerics, timeout_ms, k;
} ranks_setup;

typedef struct ranks_work {
    int32_t layer, n_ids, rows, seq;
} ranks_work;

typedef struct ranks_out {
    int32_t layer, expert, rows, seq;
} ranks_out;

typedef struct ranks_done {
    int32_t layer, seq;
    uint64_t busy_ns;            /* WORK received .. last output computed */
    uint64_t wait_ns;            /* of it, waiting for the rank's expert source */
} ranks_done;

/* Waiting without burning the core others compute on: the first polls
 * yield the CPU, later ones sleep 50 us, and after a second with nothing
 * 1 ms (an idle owner of `serve`). */
typedef struct ranks_poll {
    uint64_t start_ns;
    unsigned polls;
} ranks_poll;

void ranks_poll_begin(ranks_poll *p);
void ranks_poll_pause(ranks_poll *p);
/* An MPI return code as a shoal error naming `what`; 0 stays 0. */
int ranks_mpi_check(int mpi_rc, shoal_err *err, const char *what);

#endif
