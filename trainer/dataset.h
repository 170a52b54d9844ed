/* dataset.h - one array of a data set (inputs or labels) from a file,
 * whatever its format: what `ps-train fit --inputs/--labels` read.
 *
 * A spec is PATH or PATH:NAME. NAME picks an array inside a file that holds
 * several: a member of an .npz (x_train or x_train.npy) or a tensor of a
 * safetensors file; a file holding exactly one array needs none. When the
 * whole spec names an existing file it is the path (so paths with ':'
 * work); otherwise it splits at the last ':', and when that PATH does not
 * exist either the PS_ERR_NOT_FOUND message names both readings.
 *
 * The format is recognised by content, not by extension (after gunzip for
 * IDX and .npy, which may be gzip'ed):
 *   IDX          00 00 <type> <ndim>      (idx.h: every IDX type)
 *   .npy         \x93NUMPY                (npy.h)
 *   .npz         PK\x03\x04, or PK\x05\x06 for one without members  (npy.h, zip.h)
 *   safetensors  8-byte header length, then '{'  (common/safetensors.h:
 *                F32 F64 I64 I32 I16 I8 U8 U16 U32 U64 BOOL)
 * Anything else is refused with the first bytes it starts with; a
 * directory, and a gzip file that does not decompress, are refused as such.
 *
 * max_bytes limits the array's data (and what is read to get it): a header
 * that declares more is refused before anything is allocated.
 * Errors start with the path and say what is wrong; *out is zeroed then.
 */
#ifndef PS_TRAINER_DATASET_H
#define PS_TRAINER_DATASET_H

#include <stddef.h>

#include "array.h"
#include "status.h"

/* The default data limit (--max-data-mb): 4 GiB per array. */
#define PS_DATA_MAX_BYTES ((size_t)4 << 30)

/* Streams (a pipe such as bash's <(zcat x.npy.gz), a FIFO, /dev/stdin)
 * can be read once: they are read whole into an anonymous in-memory file
 * (memfd) and loaded from it as a regular file is, every format included.
 * What is read is bounded: more than max_bytes + PS_DATA_STREAM_SLACK
 * bytes (the array and what its header or container adds; a gzip'ed
 * stream is counted compressed) are refused without reading the rest. The
 * first byte, or the writer's close, must arrive within
 * PS_DATA_STREAM_WAIT_MS: a FIFO nobody writes is refused then
 * (PS_ERR_UNAVAILABLE, "no writer?"), not waited on forever; after it the
 * stream is read until its writer closes it. A terminal is refused. */
#include "stream.h" /* PS_DATA_STREAM_SLACK, PS_DATA_STREAM_WAIT_MS */

ps_status ps_data_load(const char *spec, size_t max_bytes, ps_array *out, ps_err *err);
/* The same, waiting wait_ms (not PS_DATA_STREAM_WAIT_MS) for a stream's
 * first byte. */
ps_status ps_data_load_wait(const char *spec, size_t max_bytes, int wait_ms, ps_array *out, ps_err *err);

/* The format of the file at path in words ("IDX", "npy", "npz",
 * "safetensors"), or NULL when it is none of them (err says why). A stream
 * (not a regular file) is refused, not read. */
const char *ps_data_format(const char *path, ps_err *err);

#endif
