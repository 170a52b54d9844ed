/* fuzz_safetensors - libFuzzer target over the safetensors reader
 * (safetensors.h): what psd reads when it resumes from a checkpoint or
 * starts --init-from a file, and ps-ckpt merges. Build and run: `make fuzz`.
 *
 * Properties checked on every input (a violation aborts = a finding):
 *  - ps_st_read answers a file, or NULL with a non-empty message;
 *  - a file it accepts is consistent: every tensor's bytes equal its
 *    element count times its dtype's size, names are non-empty and
 *    NUL-terminated, ps_st_find finds each tensor by its name;
 *  - what it accepts round-trips: written back with ps_st_write and read
 *    again, the same tensors (names, dtypes, shapes, bytes) and metadata;
 *  - ps_data_load (trainer/dataset.h: `ps-train fit --inputs FILE[:NAME]`)
 *    on the file, and on its first tensor by name, answers what
 *    fuzz_check_array (fuzz_data.h) accepts;
 *  - ASan/UBSan: no memory error, leak or undefined behaviour. */
#include <stdlib.h>
#include <string.h>

#include "dataset.h"
#include "fuzz.h"
#include "fuzz_data.h"
#include "safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static fuzz_files g_files;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_files_init(&g_files, "fuzz_safetensors", "in.safetensors", "out.safetensors");
    return 0;
}

static void check_file(const ps_st_file *f) {
    for (size_t i = 0; i < ps_st_count(f); i++) {
        const ps_st_tensor *t = ps_st_get(f, i);
        fuzz_require(memchr(t->name, 0, sizeof t->name) && t->name[0], "a tensor has a name", "");
        fuzz_require(t->ndim >= 0 && t->ndim <= PS_ST_MAX_DIMS, "ndim in range", t->name);
        fuzz_require(t->bytes == (size_t)ps_st_numel(t) * ps_st_dtype_size(t->dtype), "bytes match the shape", t->name);
        fuzz_require(ps_st_find(f, t->name) == t, "found by its name", t->name);
    }
}

/* The data loader on the file, and on tensor `name` of it. */
static void check_data(const char *name) {
    char spec[256];
    snprintf(spec, sizeof spec, "%s%s%s", g_files.in, name ? ":" : "", name ? name : "");
    ps_array a;
    ps_err e = {0};
    fuzz_check_array(ps_data_load(spec, FUZZ_DATA_MAX, &a, &e), &a, &e, g_files.in, FUZZ_DATA_MAX);
    ps_array_free(&a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write(g_files.in, data, size);
    ps_err err = {0};
    check_data(NULL);
    ps_st_file *f = ps_st_read(g_files.in, &err);
    if (!f) {
        fuzz_require(memchr(err.msg, 0, sizeof err.msg) != NULL && err.msg[0], "an error has a message", err.msg);
        return 0;
    }
    check_file(f);
    if (ps_st_count(f) && !strchr(ps_st_get(f, 0)->name, ':')) check_data(ps_st_get(f, 0)->name);
    /* write it back and read it again */
    size_t n = ps_st_count(f), nm = ps_st_metadata_count(f);
    ps_st_tensor *ts = calloc(n ? n : 1, sizeof *ts);
    const char **kv = calloc(2 * nm + 1, sizeof *kv);
    fuzz_require(ts && kv, "memory", "");
    for (size_t i = 0; i < n; i++) ts[i] = *ps_st_get(f, i);
    for (size_t i = 0; i < nm; i++) {
        kv[2 * i] = ps_st_metadata_key(f, i);
        kv[2 * i + 1] = ps_st_metadata_value(f, i);
    }
    ps_err e2 = {0};
    if (ps_st_write(g_files.out, ts, n, nm ? kv : NULL, &e2) == PS_OK) {
        ps_st_file *g = ps_st_read(g_files.out, &e2);
        fuzz_require(g != NULL, "what was written reads back", e2.msg);
        fuzz_require(ps_st_count(g) == n && ps_st_metadata_count(g) == nm, "as many tensors and metadata", g_files.out);
        for (size_t i = 0; i < n; i++) {
            const ps_st_tensor *a = ps_st_find(f, ps_st_get(g, i)->name), *b = ps_st_get(g, i);
            fuzz_require(a && a->dtype == b->dtype && a->ndim == b->ndim &&
                    !memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->ndim) && a->bytes == b->bytes &&
                    (!a->bytes || !memcmp(a->data, b->data, a->bytes)), "the same tensor back", b->name);
        }
        for (size_t i = 0; i < nm; i++)
            fuzz_require(ps_st_metadata(g, kv[2 * i]) && !strcmp(ps_st_metadata(g, kv[2 * i]), kv[2 * i + 1]),
                    "the same metadata back", kv[2 * i]);
        ps_st_free(g);
    } else {
        fuzz_require(e2.msg[0] != '\0', "a refused write has a message", e2.msg);
    }
    free(ts);
    free(kv);
    ps_st_free(f);
    return 0;
}
