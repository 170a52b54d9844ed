/* idx.h - load IDX files (the MNIST container format), raw or gzip'ed.
 *
 * Format: magic 0x00 0x00 <dtype> <ndim>, then ndim big-endian uint32
 * dimensions, then the big-endian elements in row-major order. dtype 0x08
 * unsigned byte, 0x09 signed byte, 0x0B int16, 0x0C int32, 0x0D float32,
 * 0x0E float64. ps_idx_load takes unsigned bytes only (MNIST's images and
 * labels) and refuses other dtypes by name; ps_idx_load_any takes every
 * one of them and converts the elements to host byte order.
 *
 * ps_idx_load reads the whole file through zlib's gzopen/gzread, which
 * reads gzip files (detected by their magic 1f 8b; concatenated members
 * read as one) and raw files alike; bytes other than zeros after the last
 * member are refused (gzfile.h). A pipe, FIFO or device is read whole into memory first, as
 * ps_data_load reads it (stream.h): a FIFO nobody writes is refused after
 * PS_DATA_STREAM_WAIT_MS ("no writer?"), not waited on forever. It
 * checks the magic, 1 <= ndim <= PS_IDX_MAX_DIMS, every dimension non-zero,
 * the total size against PS_IDX_MAX_BYTES (or the caller's smaller limit),
 * and that the data is exactly the
 * declared size: a short file and trailing bytes are both errors. Every
 * error message starts with the path.
 *
 * On success *out owns data (malloc'ed); release it with ps_idx_free, which
 * also accepts NULL and a zeroed struct. On failure *out is left zeroed.
 */
#ifndef PS_IDX_H
#define PS_IDX_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define PS_IDX_MAX_DIMS 4
#define PS_IDX_DTYPE_UBYTE 0x08
/* Refuse files whose data would exceed this (2 GiB): no real IDX file is
 * this large, and a corrupt header must not make us allocate terabytes. */
#define PS_IDX_MAX_BYTES ((size_t)1 << 31)

typedef struct ps_idx {
    int ndim;                        /* 1..PS_IDX_MAX_DIMS */
    uint32_t dims[PS_IDX_MAX_DIMS];  /* dims[0..ndim-1]; the rest are 0 */
    int dtype;                       /* the IDX type byte (PS_IDX_DTYPE_UBYTE, ...) */
    size_t esize;                    /* bytes per element */
    uint8_t *data;                   /* (dims[0], ..., dims[ndim-1]) elements of dtype, host order */
    size_t size;                     /* product of the dims (= bytes in data for unsigned bytes) */
    size_t bytes;                    /* size * esize */
} ps_idx;

ps_status ps_idx_load(const char *path, ps_idx *out, ps_err *err);
/* The same, waiting wait_ms (not PS_DATA_STREAM_WAIT_MS) for a stream's
 * first byte. */
ps_status ps_idx_load_wait(const char *path, int wait_ms, ps_idx *out, ps_err *err);
/* Any IDX dtype; the data's limit is min(max_bytes, PS_IDX_MAX_BYTES). */
ps_status ps_idx_load_any(const char *path, size_t max_bytes, ps_idx *out, ps_err *err);
/* "unsigned byte", "float32", ...; "unknown". Bytes per element: 0 when unknown. */
const char *ps_idx_dtype_name(int code);
size_t ps_idx_dtype_size(int code);
void ps_idx_free(ps_idx *idx);

#endif
