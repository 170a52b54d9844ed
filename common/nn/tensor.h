/* tensor.h - element types and shapes shared by the layers, the executor
 * and (through the dtype values) the wire.
 *
 * A shape here is a per-sample shape: 0..4 dimensions, the batch dimension
 * not included (a batch is (leading dims..., per-sample dims) and the
 * executor only sees n = the product of the leading dims). Shapes are plain
 * values; nothing here owns memory.
 */
#ifndef PS_NN_TENSOR_H
#define PS_NN_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dims.h"

/* Element types. The values equal the wire's DType enum (proto/ps.proto). */
typedef enum { PS_DTYPE_F32 = 0, PS_DTYPE_I64 = 1 } ps_dtype;

#define PS_SHAPE_MAX_DIMS 4

typedef struct ps_shape {
    int ndim;                          /* 0..PS_SHAPE_MAX_DIMS; 0 = one scalar per sample */
    int64_t dims[PS_SHAPE_MAX_DIMS];
} ps_shape;

/* Bytes of one element. */
static inline size_t ps_dtype_size(ps_dtype t) { return t == PS_DTYPE_I64 ? 8 : 4; }

static inline const char *ps_dtype_name(ps_dtype t) { return t == PS_DTYPE_I64 ? "int64" : "float32"; }

/* Elements per sample (1 for a scalar shape). */
static inline int64_t ps_shape_numel(const ps_shape *s) {
    int64_t k = 1;
    for (int d = 0; d < s->ndim; d++) k *= s->dims[d];
    return k;
}

/* Elements per sample without the last dimension (rows of a last-dim op). */
static inline int64_t ps_shape_rows(const ps_shape *s) {
    int64_t k = 1;
    for (int d = 0; d + 1 < s->ndim; d++) k *= s->dims[d];
    return k;
}

static inline int64_t ps_shape_last(const ps_shape *s) { return s->ndim ? s->dims[s->ndim - 1] : 1; }

static inline int ps_shape_equal(const ps_shape *a, const ps_shape *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d]) return 0;
    return 1;
}

/* Whether small (ndim dims, as big's) broadcasts over big as psd's Mul
 * takes it: its leading dims big's, the rest 1 - squeeze-and-excitation's
 * (C, 1, 1) by (C, H, W). Shared by the Mul kind and the ONNX import. */
static inline int ps_dims_bcast_trailing(const int64_t *small, const int64_t *big, int ndim) {
    int k = 0;
    while (k < ndim && small[k] == big[k]) k++;
    for (; k < ndim; k++)
        if (small[k] != 1) return 0;
    return 1;
}

/* "(1, 28, 28)", "()" into buf (dims.h). */
static inline const char *ps_shape_format(const ps_shape *s, char *buf, size_t size) {
    return ps_dims_format(buf, size, s->dims, s->ndim);
}

#endif
