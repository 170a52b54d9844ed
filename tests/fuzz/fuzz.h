/* fuzz.h - what the fuzz targets share: the property check that turns a
 * violation into a finding, a scratch directory for targets that read
 * files, writing an input there, and a model file's stage table built from
 * memory. Each target is one program that includes this once. */
#ifndef PS_FUZZ_H
#define PS_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#include "model.h"

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

/* The stage table of a model file's text (every shape inferred through the
 * kinds, memory plans made, no weights: psd --describe), the text handed to
 * the builder through a memfd (no disk): made, or refused with a message. */
static inline void fuzz_describe(const void *text, size_t len) {
    static FILE *null;
    if (!null) fuzz_require((null = fopen("/dev/null", "w")) != NULL, "/dev/null opened", "");
    int fd = memfd_create("model", 0);
    fuzz_require(fd >= 0, "a memfd", "");
    if (len) fuzz_require(write(fd, text, len) == (ssize_t)len, "the memfd written", "");
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ps_model_opts o = {.file = path, .cpu_backend = "ref", .seed = 1, .compute_threads = 1, .lr = 0.1f};
    ps_err e = {0};
    fuzz_require(ps_model_describe(&o, NULL, null, &e) == PS_OK || e.msg[0], "a refused stage table says why", "");
    close(fd);
}

#endif
