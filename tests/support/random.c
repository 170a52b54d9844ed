/* random.c - reproducible test arrays for the layer tests (random.h). */
#include "random.h"

#include <stdlib.h>

#include "status.h"

float rng_uniform(rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (float)((r->s >> 40) * (1.0 / (1 << 23)) - 1.0);
}

float *host_random(size_t n, rng *r) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    PS_ASSERT(p);
    for (size_t i = 0; i < n; i++) p[i] = rng_uniform(r);
    return p;
}
