/* rng.c - the house PRNG: xoshiro256** seeded through splitmix64, uniform
 * floats and unbiased integers below a bound (rng.h). */
#include "rng.h"

uint64_t ps_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t ps_splitmix64_below(uint64_t *state, uint64_t bound) {
    /* Reject the lowest (2^64 mod bound) values so every residue is equally likely. */
    uint64_t threshold = (0 - bound) % bound;
    for (;;) {
        uint64_t r = ps_splitmix64(state);
        if (r >= threshold) return r % bound;
    }
}

void ps_rng_seed(ps_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = ps_splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ps_rng_next(ps_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float ps_rng_uniform(ps_rng *r) {
    return (float)(ps_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

void ps_rng_uniforms(ps_rng *r, float *out, int64_t n) {
    ps_rng st = *r;   /* the state in registers for the loop */
    for (int64_t i = 0; i < n; i++) out[i] = ps_rng_uniform(&st);
    *r = st;
}

uint64_t ps_rng_below(ps_rng *r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do { x = ps_rng_next(r); } while (x >= limit);
    return x % n;
}
