/* safetensors.h - read and write the safetensors file format.
 *
 * Layout (https://github.com/huggingface/safetensors):
 *   8 bytes   N, unsigned little-endian: length of the JSON header
 *   N bytes   JSON object: {"<name>": {"dtype": "F32", "shape": [..],
 *             "data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}
 *             (the "__metadata__" entry is optional; the writer pads the
 *             header with spaces so that N is a multiple of 8)
 *   rest      the data buffer; offsets are relative to its first byte, and
 *             the tensors are contiguous, do not overlap and cover it exactly.
 * Tensor data is raw little-endian, row-major (C order).
 *
 * Supported dtypes: F32, F64, I64 (checkpoints), and the integer types
 * I32, I16, I8, U8, U16, U32, U64 and BOOL (data sets: uint8 images,
 * int32 labels), read and write. Any other dtype (F16, BF16, ...) is
 * refused with PS_ERR_FORMAT. Callers check the dtype they need.
 *
 * Ownership: ps_st_read() returns a handle that owns the file's contents;
 * every tensor, name and metadata string obtained from it stays valid until
 * ps_st_free(). Tensor data is aligned for its dtype. ps_st_free(NULL) is a
 * no-op.
 *
 * Errors: ps_st_read() refuses a file that is not exactly well-formed (bad
 * header length, malformed JSON, unknown dtype or key, shape/size mismatch,
 * offsets out of range, overlapping or leaving gaps, truncated data, trailing
 * bytes) with PS_ERR_FORMAT; I/O failures give PS_ERR_IO or PS_ERR_NOT_FOUND.
 * The message in err starts with the path and names the tensor and what is
 * wrong. The host must be little-endian (checked at compile time).
 */
#ifndef PS_SAFETENSORS_H
#define PS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef enum {
    PS_ST_F32 = 1,
    PS_ST_F64,
    PS_ST_I64,
    PS_ST_I32,
    PS_ST_I16,
    PS_ST_I8,
    PS_ST_U8,
    PS_ST_U16,
    PS_ST_U32,
    PS_ST_U64,
    PS_ST_BOOL,
} ps_st_dtype;

#define PS_ST_NAME_MAX 128 /* including the terminating NUL */
#define PS_ST_MAX_DIMS 8

typedef struct ps_st_tensor {
    char name[PS_ST_NAME_MAX];
    int dtype;                      /* a ps_st_dtype */
    int ndim;                       /* 0 (scalar) .. PS_ST_MAX_DIMS */
    int64_t dims[PS_ST_MAX_DIMS];
    void *data;                     /* bytes long; may be NULL when bytes == 0 */
    size_t bytes;                   /* = product(dims) * ps_st_dtype_size(dtype) */
} ps_st_tensor;

typedef struct ps_st_file ps_st_file;

/* "F32", "F64", "I64", "U8", ...; "?" for anything else. */
const char *ps_st_dtype_name(int dtype);
/* Element size in bytes; 0 for an unknown dtype. */
size_t ps_st_dtype_size(int dtype);
/* Number of elements: product of dims (1 for a scalar). */
int64_t ps_st_numel(const ps_st_tensor *t);

/* Read and validate a whole file. NULL on error (err says why). */
ps_st_file *ps_st_read(const char *path, ps_err *err);

/* Tensors in the order of their data in the file (ascending data_offsets). */
size_t ps_st_count(const ps_st_file *f);
const ps_st_tensor *ps_st_get(const ps_st_file *f, size_t i);
/* NULL when there is no tensor of that name. */
const ps_st_tensor *ps_st_find(const ps_st_file *f, const char *name);
/* Value of a "__metadata__" key, NULL when absent. */
const char *ps_st_metadata(const ps_st_file *f, const char *key);
/* Number of metadata entries and the i-th key/value (for listing). */
size_t ps_st_metadata_count(const ps_st_file *f);
const char *ps_st_metadata_key(const ps_st_file *f, size_t i);
const char *ps_st_metadata_value(const ps_st_file *f, size_t i);

void ps_st_free(ps_st_file *f);

/* Write n tensors and optional metadata (meta_kv = {key, value, key, value,
 * ..., NULL}, or NULL for none) to path atomically: the file is written to
 * "<path>.tmp", fsync'ed, renamed over path and the directory fsync'ed, so a
 * crash leaves either the old file or the complete new one.
 * Tensor names must be non-empty, unique, not "__metadata__" and shorter
 * than PS_ST_NAME_MAX; keys, values and names must be valid UTF-8; bytes
 * must equal numel * dtype size. Data is laid out by decreasing element size,
 * then by name (the reference implementation also sorts by dtype, then
 * name), so every tensor is aligned for its dtype; the header lists the
 * tensors in that same order, "__metadata__" first, padded with spaces to a
 * multiple of 8 bytes. */
ps_status ps_st_write(const char *path, const ps_st_tensor *tensors, size_t n,
                      const char *const *meta_kv, ps_err *err);

#endif
