/* test_map.c — the owner map of --experts-over-ranks (engine/ranks/ranks.h
 * part 1): every expert has exactly one owner in 1..N-1, the owners of a
 * layer differ by at most one expert, ranks_owned_count agrees with the
 * map, the rotation moves expert 0 from layer to layer, and a build
 * without MPI refuses the option with the way to get it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "engine/ranks/ranks.h"

static void test_balanced(void **state)
{
    static const int experts[] = { 1, 4, 64, 896, 1000 };
    (void)state;
    for (int n = 2; n <= 9; n++)
        for (size_t x = 0; x < sizeof experts / sizeof experts[0]; x++)
            for (int m = 0; m < 92; m += 7) {
                int count[16] = { 0 }, lo = 1 << 30, hi = 0;
                for (int e = 0; e < experts[x]; e++) {
                    int r = ranks_owner(m, e, n);
                    assert_true(r >= 1 && r < n);
                    count[r]++;
                }
                for (int r = 1; r < n; r++) {
                    assert_int_equal(count[r], ranks_owned_count(m, experts[x], r, n));
                    lo = count[r] < lo ? count[r] : lo;
                    hi = count[r] > hi ? count[r] : hi;
                }
                assert_true(hi - lo <= 1);
            }
}

static void test_rotation(void **state)
{
    (void)state;
    /* K3 on 5 machines: 4 owners of 224 experts each per layer */
    assert_int_equal(ranks_owned_count(0, 896, 1, 5), 224);
    assert_int_equal(ranks_owner(0, 0, 5), 1);
    assert_int_equal(ranks_owner(1, 0, 5), 2);
    assert_int_equal(ranks_owner(3, 0, 5), 4);
    assert_int_equal(ranks_owner(4, 0, 5), 1);
    assert_int_equal(ranks_owner(0, 895, 5), 4);
    /* two ranks: one owner has everything */
    assert_int_equal(ranks_owner(7, 123, 2), 1);
    assert_int_equal(ranks_owned_count(7, 896, 1, 2), 896);
}

static void test_without_mpi(void **state)
{
    ranks_world w;
    shoal_err err = { 0 };
    int argc = 1;
    char arg0[] = "shoal-engine", *args[] = { arg0, NULL }, **argv = args;
    (void)state;
    /* the unit tests link the build's ranks library: the refusal without MPI=1 */
    int rc = ranks_start(&argc, &argv, &w, &err);
    if (rc == 0) {          /* an MPI build: a world of one is refused instead */
        ranks_finish();
        fail_msg("ranks_start accepted a world of %d", w.size);
    }
    assert_true(rc == SHOAL_EUNSUPPORTED || rc == SHOAL_EINVAL);
    if (rc == SHOAL_EUNSUPPORTED)
        assert_non_null(strstr(err.msg, "make MPI=1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_balanced),
        cmocka_unit_test(test_rotation),
        cmocka_unit_test(test_without_mpi),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
