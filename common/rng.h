/* rng.h - small explicit PRNG (xoshiro256** seeded through splitmix64).
 *
 * Deterministic across platforms, so a seed in a config reproduces the same
 * initial weights, shuffles and dropout masks. The state is a plain value the
 * caller owns; nothing here is global or thread-shared.
 */
#ifndef PS_RNG_H
#define PS_RNG_H

#include <stdint.h>

typedef struct ps_rng {
    uint64_t s[4];
} ps_rng;

/* splitmix64 (Steele, Lea, Flood 2014): advance *state and return the next
 * 64-bit value. Seeds xoshiro and drives the data shuffles. */
uint64_t ps_splitmix64(uint64_t *state);
/* Uniform value in [0, bound) from a splitmix64 stream, without modulo
 * bias (rejection); bound > 0. */
uint64_t ps_splitmix64_below(uint64_t *state, uint64_t bound);

void ps_rng_seed(ps_rng *r, uint64_t seed);
uint64_t ps_rng_next(ps_rng *r);
/* Uniform in [0, 1) with 24 bits of precision. */
float ps_rng_uniform(ps_rng *r);
/* n values of ps_rng_uniform into out, in order: the same values and the
 * same state after as n calls, in one loop (dropout masks). */
void ps_rng_uniforms(ps_rng *r, float *out, int64_t n);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t ps_rng_below(ps_rng *r, uint64_t n);

#endif
