/* zip.h - read members of a zip archive (the container of numpy's .npz).
 *
 * ps_zip_open reads the whole file (refusing one over max_bytes) and its
 * central directory: the end record (and the zip64 end record and locator
 * when the classic fields are saturated), then every entry's name, method,
 * sizes, CRC and local header offset, with zip64 extra fields where a size
 * or offset is 0xFFFFFFFF (numpy's savez forces zip64 on every member).
 * ps_zip_extract finds a member by name, checks its local header, and
 * returns its bytes: stored (method 0) as is, deflated (method 8) through
 * zlib's raw inflate; the size must be the declared one and the CRC-32
 * must match. Encrypted members and other methods (bzip2, lzma, ...) are
 * refused by name. Multi-disk archives are refused.
 *
 * Every error starts with the path and names what is wrong
 * (PS_ERR_FORMAT for a malformed archive, PS_ERR_NOT_FOUND for a missing
 * member, PS_ERR_UNIMPLEMENTED for an unsupported method,
 * PS_ERR_RESOURCE_EXHAUSTED for a member over the limit).
 * The handle owns the file's bytes; ps_zip_free(NULL) is a no-op.
 */
#ifndef PS_TRAINER_ZIP_H
#define PS_TRAINER_ZIP_H

#include <stddef.h>

#include "status.h"

typedef struct ps_zip ps_zip;

ps_status ps_zip_open(const char *path, size_t max_bytes, ps_zip **out, ps_err *err);
void ps_zip_free(ps_zip *z);

/* Members in central-directory order. */
int ps_zip_count(const ps_zip *z);
const char *ps_zip_name(const ps_zip *z, int i);
/* "a.npy, b.npy" (truncated with "..." to fit) into buf. */
const char *ps_zip_names(const ps_zip *z, char *buf, size_t len);

/* Member `name`'s bytes into *data (malloc'ed, the caller frees; NULL for
 * an empty member) and *len; refuses a member whose size exceeds
 * max_bytes. */
ps_status ps_zip_extract(const ps_zip *z, const char *name, size_t max_bytes, void **data, size_t *len,
                         ps_err *err);

#endif
