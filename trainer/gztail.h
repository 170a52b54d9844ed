/* gztail.h - what follows the last member of a gzip file.
 *
 * zlib's gzread reads concatenated gzip members as one stream (as gzip -d
 * does) but stops silently at the first bytes after a member that are not
 * another member: a file with junk appended (a cut-and-pasted download, two
 * files glued with a header between them) loads as if the junk were not
 * there. gzip(1) says "decompression OK, trailing garbage ignored" and
 * exits 2; it ignores zero bytes after the last member silently (tar pads
 * with them). ps_gz_check_tail walks the file's members with zlib the same
 * way and answers:
 *  - PS_OK: every byte belongs to a member, or only zero bytes follow the
 *    last one;
 *  - PS_ERR_FORMAT naming the file, where the gzip data ends and how many
 *    bytes follow: other bytes after the last member (refused: the loaders
 *    refuse trailing bytes after an array's data too), or a member that
 *    does not decompress;
 *  - PS_ERR_IO when the file cannot be read.
 * Call it on a file known to start with the gzip magic (1f 8b), after the
 * data was read: it reads the file once more (inflating into a scratch
 * buffer), in constant memory. */
#ifndef PS_TRAINER_GZTAIL_H
#define PS_TRAINER_GZTAIL_H

#include "status.h"

ps_status ps_gz_check_tail(const char *path, ps_err *err);

#endif
