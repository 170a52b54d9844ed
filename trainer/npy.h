/* npy.h - numpy's .npy arrays and .npz archives of them.
 *
 * .npy (numpy/lib/format.py): the magic "\x93NUMPY", format version 1.0
 * (2-byte header length), 2.0 or 3.0 (4-byte; 3.0's header is UTF-8) -
 * any other, a minor byte other than 0 included, is refused naming it -
 * then a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (60000, 28, 28), }
 * padded with spaces and a newline, then the elements. Accepted:
 *  - descr: a byte order ('<', '>', '|', '=') and one of b1 u1 i1 u2 i2 u4
 *    i4 u8 i8 f4 f8 (bool, unsigned and signed integers, float32/64); big
 *    endian data is swapped to the host's. Anything else (float16,
 *    complex, strings, objects, structured dtypes) is refused naming it;
 *  - fortran_order: False (C order). True is refused for arrays of 2 or
 *    more dims (np.ascontiguousarray fixes the file), accepted for 0-1;
 *  - shape: 0..PS_ARRAY_MAX_DIMS non-negative dims.
 * The data must be exactly the size the header declares: a short file and
 * trailing bytes are errors. A .npy file may be gzip'ed (read through
 * zlib; bytes after the last gzip member other than zeros are refused,
 * gzfile.h); its data must fit max_bytes, checked before allocating.
 *
 * .npz: a zip archive (zip.h) of NAME.npy members, stored (np.savez) or
 * deflated (np.savez_compressed). ps_npz_load reads member NAME (".npy" is
 * appended when missing); name NULL takes the only member of a one-array
 * archive. A missing member lists the archive's arrays.
 *
 * Errors start with the file (and member) and say what is wrong:
 * PS_ERR_FORMAT (wrong magic, malformed header, truncated, trailing bytes),
 * PS_ERR_UNIMPLEMENTED (dtype, Fortran order), PS_ERR_NOT_FOUND,
 * PS_ERR_RESOURCE_EXHAUSTED (over max_bytes). On failure *out is zeroed.
 */
#ifndef PS_TRAINER_NPY_H
#define PS_TRAINER_NPY_H

#include <stddef.h>

#include "array.h"
#include "status.h"

/* A whole .npy image in memory; `what` names it in messages. */
ps_status ps_npy_parse(const void *buf, size_t len, const char *what, size_t max_bytes, ps_array *out, ps_err *err);
ps_status ps_npy_load(const char *path, size_t max_bytes, ps_array *out, ps_err *err);
ps_status ps_npz_load(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err);

#endif
