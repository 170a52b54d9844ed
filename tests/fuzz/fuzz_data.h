/* fuzz_data.h - what the fuzz targets of the data loaders (fuzz_idx,
 * fuzz_npy, fuzz_npz: trainer/dataset.h and the formats under it) share:
 * the first input byte as a mode (gzip the rest or not), writing a file
 * gzip'ed, and the property check of one load's answer. Each target is one
 * program that includes this once, after fuzz.h. */
#ifndef PS_FUZZ_DATA_H
#define PS_FUZZ_DATA_H

#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "array.h"
#include "fuzz.h"

/* The data limit the targets load under (--max-data-mb): small, so that a
 * header that declares more is refused and every accepted input stays
 * cheap; the limit itself is a property checked on every answer. */
#define FUZZ_DATA_MAX ((size_t)1 << 20)

/* path := the bytes, gzip'ed (a valid gzip stream around whatever they are). */
static inline void fuzz_write_gz(const char *path, const uint8_t *data, size_t size) {
    gzFile gz = gzopen(path, "wb1");
    fuzz_require(gz != NULL, "a scratch gzip file", path);
    if (size) fuzz_require(gzwrite(gz, data, (unsigned)size) == (int)size, "the scratch gzip file written", path);
    fuzz_require(gzclose(gz) == Z_OK, "the scratch gzip file closed", path);
}

/* One loader's answer for the file `path` under `max` bytes:
 *  - refused: a non-empty, NUL-terminated message that names the file, and
 *    *a left zeroed;
 *  - accepted: a known dtype, 0..PS_ARRAY_MAX_DIMS non-negative dims whose
 *    product (and every partial product, which callers form: numel,
 *    row_numel) fits int64, bytes = numel * the dtype's size <= max, data
 *    readable over all of it (ASan), and the conversions answer. */
static inline void fuzz_check_array(ps_status st, const ps_array *a, const ps_err *err, const char *path, size_t max) {
    if (st != PS_OK) {
        fuzz_require(memchr(err->msg, 0, sizeof err->msg) != NULL && err->msg[0], "an error has a message", err->msg);
        fuzz_require(strstr(err->msg, path) != NULL, "an error names the file", err->msg);
        fuzz_require(a->data == NULL && a->ndim == 0 && a->bytes == 0, "a refused array is left zeroed", err->msg);
        return;
    }
    fuzz_require(a->dtype >= 0 && a->dtype < PS_ARRAY_NDTYPES, "a known dtype", path);
    fuzz_require(a->ndim >= 0 && a->ndim <= PS_ARRAY_MAX_DIMS, "ndim in range", path);
    int64_t n = 1, nz = 1; /* nz: the product of the non-zero dims */
    for (int i = 0; i < a->ndim; i++) {
        fuzz_require(a->dims[i] >= 0, "dims non-negative", path);
        if (a->dims[i]) fuzz_require(!__builtin_mul_overflow(nz, a->dims[i], &nz), "the dims' product fits int64", path);
        n *= a->dims[i] ? 1 : 0;
    }
    n = n ? nz : 0;
    fuzz_require(ps_array_numel(a) == n, "numel is the dims' product", path);
    fuzz_require(a->ndim < 1 || ps_array_row_numel(a) * a->dims[0] == n, "row_numel * dims[0] = numel", path);
    fuzz_require(a->bytes == (size_t)n * ps_array_dtype_size(a->dtype), "bytes = numel * dtype size", path);
    fuzz_require(a->bytes <= max, "bytes within the data limit", path);
    fuzz_require(!a->bytes || a->data, "data for the bytes", path);
    volatile uint8_t sum = 0;
    for (size_t i = 0; i < a->bytes; i++) sum ^= ((const uint8_t *)a->data)[i];
    (void)sum;
    if (n) {
        float f[16];
        int64_t q[16];
        int64_t k = n < 16 ? n : 16;
        ps_array_to_f32(a, n - k, k, f);
        ps_err e = {0};
        ps_status s = ps_array_to_i64(a, n - k, k, q, &e);
        fuzz_require(s == PS_OK || e.msg[0], "a refused conversion says why", path);
        fuzz_require(s != PS_OK || ps_array_dtype_is_int(a->dtype), "only integer types convert to int64", path);
    }
}

/* Two answers for the same content agree: both refused, or both the same array. */
static inline void fuzz_same_array(ps_status s1, const ps_array *a, ps_status s2, const ps_array *b, const char *what) {
    fuzz_require((s1 == PS_OK) == (s2 == PS_OK), "two loaders agree on accepting", what);
    if (s1 != PS_OK || s2 != PS_OK) return;
    fuzz_require(a->dtype == b->dtype && a->ndim == b->ndim && a->bytes == b->bytes &&
                 !memcmp(a->dims, b->dims, sizeof(int64_t) * (size_t)a->ndim) &&
                 (!a->bytes || !memcmp(a->data, b->data, a->bytes)), "two loaders give the same array", what);
}

#endif
