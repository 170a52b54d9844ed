/* array.h - an n-dimensional array of numbers read from a data file, and
 * the element types data files use.
 *
 * A ps_array is what every loader of trainer/dataset.h produces: an element
 * type (ps_array_dtype), up to PS_ARRAY_MAX_DIMS dims in row-major (C)
 * order, and the elements in host byte order. The array owns data (one
 * malloc'ed block, or NULL when it has no elements); ps_array_free releases
 * it (NULL and a zeroed array are fine).
 *
 * The dtype table (one row per type: name, numpy's and safetensors' names,
 * size, integer or not, conversions) is the one place that knows the
 * types; a loader maps its format's type code to a row and names the code
 * it cannot map in its error.
 *
 * Conversions copy a run of elements out to float32 (inputs of a float
 * stage, regression targets) or int64 (class ids, token ids). To int64
 * only integer (and bool) types convert: ps_array_to_i64 refuses floats,
 * since a class label of 2.5 is a bug in the data, not something to round.
 */
#ifndef PS_TRAINER_ARRAY_H
#define PS_TRAINER_ARRAY_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define PS_ARRAY_MAX_DIMS 8

typedef enum {
    PS_ARRAY_BOOL = 0,
    PS_ARRAY_U8,
    PS_ARRAY_I8,
    PS_ARRAY_U16,
    PS_ARRAY_I16,
    PS_ARRAY_U32,
    PS_ARRAY_I32,
    PS_ARRAY_U64,
    PS_ARRAY_I64,
    PS_ARRAY_F32,
    PS_ARRAY_F64,
    PS_ARRAY_NDTYPES
} ps_array_dtype;

typedef struct ps_array {
    int dtype;                         /* a ps_array_dtype */
    int ndim;                          /* 0 (a scalar) .. PS_ARRAY_MAX_DIMS */
    int64_t dims[PS_ARRAY_MAX_DIMS];
    void *data;                        /* numel * size bytes, host byte order; owned */
    size_t bytes;
} ps_array;

/* "uint8", "float32", ...; "?" for an unknown dtype. */
const char *ps_array_dtype_name(int dtype);
/* Bytes per element; 0 for an unknown dtype. */
size_t ps_array_dtype_size(int dtype);
/* 1 for bool and the integer types. */
int ps_array_dtype_is_int(int dtype);

/* Product of dims[0..ndim-1] (1 for a scalar). */
int64_t ps_array_numel(const ps_array *a);
/* Elements per entry of dim 0: the product of dims[1..] (1 when ndim <= 1). */
int64_t ps_array_row_numel(const ps_array *a);
/* "(60000, 28, 28)" into buf; returns buf. */
const char *ps_array_shape_str(const int64_t *dims, int ndim, char *buf, size_t len);

/* Total bytes of dims x esize into *bytes; PS_ERR_RESOURCE_EXHAUSTED naming
 * `what` when it exceeds max_bytes (or overflows), PS_ERR_FORMAT when a dim
 * is negative or the non-zero dims multiply past INT64_MAX (numpy's "array
 * is too big", even for an empty array: then ps_array_numel and
 * ps_array_row_numel of a loaded array never overflow). Every loader checks
 * its shapes here before allocating. */
ps_status ps_array_check_size(const int64_t *dims, int ndim, size_t esize, size_t max_bytes, const char *what,
                              size_t *bytes, ps_err *err);

/* Convert elements [first, first + n) of a (flat index) to float32 into out. */
void ps_array_to_f32(const ps_array *a, int64_t first, int64_t n, float *out);
/* The same to int64; PS_ERR_INVALID_ARGUMENT when a's dtype is not an
 * integer type (the message names it), or, for uint64, a value over
 * INT64_MAX. */
ps_status ps_array_to_i64(const ps_array *a, int64_t first, int64_t n, int64_t *out, ps_err *err);

/* Reverse the byte order of every element (n elements of esize bytes). */
void ps_array_byteswap(void *data, size_t n, size_t esize);

void ps_array_free(ps_array *a);

#endif
