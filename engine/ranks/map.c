/* map.c — which rank owns which routed expert (ranks.h part 1).  Pure
 * arithmetic, built with and without MPI so it is tested in every build.
 *
 * Owns: the fixed map, the same on every rank without a message.  Does
 * not own anything MPI.
 */
#include "engine/ranks/ranks.h"

int ranks_owner(int moe_ordinal, int32_t expert, int n_ranks)
{
    int owners = n_ranks - 1;
    return 1 + (int)(((int64_t)expert + moe_ordinal) % owners);
}

int ranks_owned_count(int moe_ordinal, int n_experts, int rank, int n_ranks)
{
    int owners = n_ranks - 1, first;
    /* experts e = first, first + owners, ... with (e + m) mod owners = rank - 1 */
    first = ((rank - 1 - moe_ordinal) % owners + owners) % owners;
    return first < n_experts ? (n_experts - 1 - first) / owners + 1 : 0;
}
