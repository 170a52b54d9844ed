/* fuzz.h - what the fuzz targets share: the property check that turns a
 * violation into a finding, a scratch directory and input/output paths for
 * targets that read files (fuzz_files), writing an input there, and a model file's stage table built from
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

/* A target that hands its input to a loader as a file: a fresh scratch
 * directory (fuzz_scratch) and the paths of its input file and, for a
 * target that writes one back, its output file in it. */
typedef struct fuzz_files {
    char dir[64];
    char in[96];   /* <dir>/<in name> */
    char out[96];  /* <dir>/<out name>; "" without one */
} fuzz_files;

/* Called from LLVMFuzzerInitialize: target names the scratch directory,
 * in_name and out_name (NULL: none) the files in it. */
static inline void fuzz_files_init(fuzz_files *f, const char *target, const char *in_name, const char *out_name) {
    fuzz_scratch(target, f->dir, sizeof f->dir);
    snprintf(f->in, sizeof f->in, "%s/%s", f->dir, in_name);
    if (out_name) snprintf(f->out, sizeof f->out, "%s/%s", f->dir, out_name);
    else f->out[0] = '\0';
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
