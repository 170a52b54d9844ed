/* array.c - n-dimensional arrays read from data files and the dtype table
 * (array.h). */
#include "array.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dims.h"

/* Converters of one element type, generated per C type. */
#define PS_ARRAY_CONV(suffix, ctype)                                                     \
    static void f32_##suffix(const void *src, int64_t n, float *out) {                  \
        const ctype *s = src;                                                            \
        for (int64_t i = 0; i < n; i++) out[i] = (float)s[i];                           \
    }                                                                                    \
    static int i64_##suffix(const void *src, int64_t n, int64_t *out) {                 \
        const ctype *s = src;                                                            \
        for (int64_t i = 0; i < n; i++) out[i] = (int64_t)s[i];                         \
        return 0;                                                                        \
    }
PS_ARRAY_CONV(bool, uint8_t)
PS_ARRAY_CONV(u8, uint8_t)
PS_ARRAY_CONV(i8, int8_t)
PS_ARRAY_CONV(u16, uint16_t)
PS_ARRAY_CONV(i16, int16_t)
PS_ARRAY_CONV(u32, uint32_t)
PS_ARRAY_CONV(i32, int32_t)
PS_ARRAY_CONV(i64, int64_t)

static void f32_u64(const void *src, int64_t n, float *out) {
    const uint64_t *s = src;
    for (int64_t i = 0; i < n; i++) out[i] = (float)s[i];
}
/* uint64 ids over INT64_MAX do not fit: returns 1 at the first. */
static int i64_u64(const void *src, int64_t n, int64_t *out) {
    const uint64_t *s = src;
    for (int64_t i = 0; i < n; i++) {
        if (s[i] > (uint64_t)INT64_MAX) return 1;
        out[i] = (int64_t)s[i];
    }
    return 0;
}
static void f32_f32(const void *src, int64_t n, float *out) { memcpy(out, src, (size_t)n * sizeof(float)); }
static void f32_f64(const void *src, int64_t n, float *out) {
    const double *s = src;
    for (int64_t i = 0; i < n; i++) out[i] = (float)s[i];
}

typedef struct dtype_row {
    const char *name;
    size_t size;
    void (*to_f32)(const void *src, int64_t n, float *out);
    int (*to_i64)(const void *src, int64_t n, int64_t *out); /* NULL: not an integer type */
} dtype_row;

static const dtype_row g_dtypes[PS_ARRAY_NDTYPES] = {
    [PS_ARRAY_BOOL] = {"bool", 1, f32_bool, i64_bool},
    [PS_ARRAY_U8] = {"uint8", 1, f32_u8, i64_u8},
    [PS_ARRAY_I8] = {"int8", 1, f32_i8, i64_i8},
    [PS_ARRAY_U16] = {"uint16", 2, f32_u16, i64_u16},
    [PS_ARRAY_I16] = {"int16", 2, f32_i16, i64_i16},
    [PS_ARRAY_U32] = {"uint32", 4, f32_u32, i64_u32},
    [PS_ARRAY_I32] = {"int32", 4, f32_i32, i64_i32},
    [PS_ARRAY_U64] = {"uint64", 8, f32_u64, i64_u64},
    [PS_ARRAY_I64] = {"int64", 8, f32_i64, i64_i64},
    [PS_ARRAY_F32] = {"float32", 4, f32_f32, NULL},
    [PS_ARRAY_F64] = {"float64", 8, f32_f64, NULL},
};

static const dtype_row *row(int dtype) {
    return dtype >= 0 && dtype < PS_ARRAY_NDTYPES ? &g_dtypes[dtype] : NULL;
}

const char *ps_array_dtype_name(int dtype) { return row(dtype) ? row(dtype)->name : "?"; }
size_t ps_array_dtype_size(int dtype) { return row(dtype) ? row(dtype)->size : 0; }
int ps_array_dtype_is_int(int dtype) { return row(dtype) && row(dtype)->to_i64; }

int64_t ps_array_numel(const ps_array *a) {
    int64_t n = 1;
    for (int i = 0; i < a->ndim; i++) n *= a->dims[i];
    return n;
}

int64_t ps_array_row_numel(const ps_array *a) {
    int64_t n = 1;
    for (int i = 1; i < a->ndim; i++) n *= a->dims[i];
    return n;
}

const char *ps_array_shape_str(const int64_t *dims, int ndim, char *buf, size_t len) {
    return ps_dims_format_as(buf, len, dims, ndim, "(", ", ", ndim == 1 ? ",)" : ")");  /* numpy's (3,) */
}

ps_status ps_array_check_size(const int64_t *dims, int ndim, size_t esize, size_t max_bytes, const char *what,
                              size_t *bytes, ps_err *err) {
    char sh[128];
    uint64_t b = esize, nz = 1; /* nz: the product of the non-zero dims */
    int over = 0, zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 0) return ps_err_set(err, PS_ERR_FORMAT, "%s: dimension %d is negative (%lld)", what, i,
                                           (long long)dims[i]);
        if (dims[i] == 0) { zero = 1; continue; }
        /* numpy's rule ("array is too big"): even an empty array's other
         * dims must multiply within int64, so that numel and every partial
         * product callers form stay defined */
        if (nz > (uint64_t)INT64_MAX / (uint64_t)dims[i])
            return ps_err_set(err, PS_ERR_FORMAT, "%s: shape %s: the product of the dimensions overflows int64 "
                              "(corrupt header?)", what, ps_array_shape_str(dims, ndim, sh, sizeof sh));
        nz *= (uint64_t)dims[i];
        if (over || b > UINT64_MAX / (uint64_t)dims[i]) over = 1;
        else b *= (uint64_t)dims[i];
    }
    if (zero) b = 0, over = 0;
    if (over || b > max_bytes)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: shape %s needs more than the %zu MiB data limit "
                          "(--max-data-mb)", what, ps_array_shape_str(dims, ndim, sh, sizeof sh), max_bytes >> 20);
    *bytes = (size_t)b;
    return PS_OK;
}

void ps_array_to_f32(const ps_array *a, int64_t first, int64_t n, float *out) {
    const dtype_row *r = row(a->dtype);
    PS_ASSERT(r && first >= 0 && first + n <= ps_array_numel(a));
    r->to_f32((const char *)a->data + (size_t)first * r->size, n, out);
}

ps_status ps_array_to_i64(const ps_array *a, int64_t first, int64_t n, int64_t *out, ps_err *err) {
    const dtype_row *r = row(a->dtype);
    PS_ASSERT(r && first >= 0 && first + n <= ps_array_numel(a));
    const void *src = (const char *)a->data + (size_t)first * r->size;
    if (a->dtype == PS_ARRAY_I64) {
        memcpy(out, src, (size_t)n * sizeof(int64_t));
        return PS_OK;
    }
    if (!r->to_i64)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s values where integers are needed", r->name);
    if (r->to_i64(src, n, out))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "a uint64 value over 2^63-1 where an int64 is needed");
    return PS_OK;
}

void ps_array_byteswap(void *data, size_t n, size_t esize) {
    unsigned char *p = data;
    if (esize <= 1) return;
    for (size_t i = 0; i < n; i++, p += esize)
        for (size_t a = 0, b = esize - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

void ps_array_free(ps_array *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}
