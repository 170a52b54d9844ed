/* malloc_tune.c - psd's glibc malloc thresholds (see malloc_tune.h). */
#include "malloc_tune.h"

#include <stdlib.h>
#include <string.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#define PS_MMAP_THRESHOLD ((int)32 << 20)   /* glibc's own dynamic maximum on 64-bit */
#define PS_TRIM_THRESHOLD ((int)64 << 20)

int ps_malloc_tune(void) {
#ifdef __GLIBC__
    const char *t = getenv("GLIBC_TUNABLES");
    if (t && strstr(t, "glibc.malloc.")) return 0;
    return mallopt(M_MMAP_THRESHOLD, PS_MMAP_THRESHOLD) == 1 && mallopt(M_TRIM_THRESHOLD, PS_TRIM_THRESHOLD) == 1;
#else
    return 0;
#endif
}
