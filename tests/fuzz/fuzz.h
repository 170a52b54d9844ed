/* fuzz.h - what the fuzz targets share: the property check that turns a
 * violation into a finding, a scratch directory for targets that read
 * files, and writing an input there. Each target is one program that
 * includes this once. */
#ifndef PS_FUZZ_H
#define PS_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A property violated: say which (with details) and abort = a finding. */
static inline void fuzz_require(int ok, const char *what, const char *details) {
    if (ok) return;
    fprintf(stderr, "fuzz: property violated: %s (details: '%s')\n", what, details ? details : "");
    abort();
}

/* A fresh directory for the target's files, in memory (/dev/shm) when it
 * can be; dir receives its path. */
static inline void fuzz_scratch(const char *name, char *dir, size_t n) {
    snprintf(dir, n, "/dev/shm/%s.XXXXXX", name);
    if (mkdtemp(dir)) return;
    snprintf(dir, n, "/tmp/%s.XXXXXX", name);
    fuzz_require(mkdtemp(dir) != NULL, "a scratch directory", dir);
}

static inline void fuzz_write(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    fuzz_require(f != NULL, "a scratch file", path);
    if (size) fuzz_require(fwrite(data, 1, size, f) == size, "the scratch file written", path);
    fclose(f);
}

#endif
