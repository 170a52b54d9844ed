/* gzfile.h - gzip'ed files as the loaders read them (IDX, .npy, and the
 * format sniffing of dataset.c): whole reads through zlib's gzread, zlib's
 * messages without the path, and what follows the last member.
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
#ifndef PS_TRAINER_GZFILE_H
#define PS_TRAINER_GZFILE_H

#include <stddef.h>
#include <zlib.h>

#include "status.h"

/* Up to n bytes from gz into buf (*got: how many arrived, in reads of at
 * most 1 GiB). 0 at a clean end or after n bytes; -1 on a zlib error, its
 * message in *zmsg (gzerror's, starting with the path). gzread answers 0
 * both at a clean end and for a cut stream, with the error set: told
 * apart here. */
int ps_gz_read_full(gzFile gz, void *buf, size_t n, size_t *got, const char **zmsg);

/* zmsg without the "PATH: " gzerror puts first (the callers' messages
 * name the path themselves). */
const char *ps_gz_strip_path(const char *path, const char *zmsg);

ps_status ps_gz_check_tail(const char *path, ps_err *err);

#endif
