/* test_rng - the house PRNG's bulk draw (rng.h ps_rng_uniforms, which
 * dropout masks use) against its one-at-a-time definition: n values of
 * ps_rng_uniform from the same seed are the same floats in the same order,
 * and leave the same state behind (the next draws agree too), for several
 * n including 0 and 1. */
#include <string.h>

#include "check.h"
#include "rng.h"

int main(void) {
    static const int64_t ns[] = {0, 1, 7, 64, 1000, 4099};
    for (size_t c = 0; c < sizeof ns / sizeof ns[0]; c++) {
        const int64_t n = ns[c];
        ps_rng a, b;
        ps_rng_seed(&a, 12345 + (uint64_t)c);
        ps_rng_seed(&b, 12345 + (uint64_t)c);
        static float bulk[4100], one[4100];
        ps_rng_uniforms(&a, bulk, n);
        int lo = 1;
        for (int64_t i = 0; i < n; i++) {
            one[i] = ps_rng_uniform(&b);
            lo &= one[i] >= 0.0f && one[i] < 1.0f;
        }
        CHECK_MSG(n == 0 || memcmp(bulk, one, (size_t)n * sizeof(float)) == 0,
                  "ps_rng_uniforms(%lld) differs from %lld calls of ps_rng_uniform", (long long)n, (long long)n);
        CHECK_MSG(lo, "a uniform outside [0, 1)");
        CHECK_MSG(memcmp(&a, &b, sizeof a) == 0, "ps_rng_uniforms(%lld) left another state behind", (long long)n);
        CHECK(ps_rng_uniform(&a) == ps_rng_uniform(&b));
    }
    return check_summary("test_rng");
}
