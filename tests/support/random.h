/* random.h - reproducible test data for the layer tests (xorshift64; the
 * same seed gives the same arrays on every machine). */
#ifndef PS_TEST_RANDOM_H
#define PS_TEST_RANDOM_H

#include <stddef.h>
#include <stdint.h>

typedef struct rng { uint64_t s; } rng;

/* Uniform in [-1, 1). */
float rng_uniform(rng *r);
/* n uniform values in a new malloc'd array (never NULL). */
float *host_random(size_t n, rng *r);

#endif
