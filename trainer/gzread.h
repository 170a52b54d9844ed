/* gzread.h - a file read as it is or, when it starts with the gzip magic
 * (1f 8b), decompressed: one pass, one zlib stream.
 *
 * gzip members concatenated (cat a.gz b.gz) read as one stream, as gzip -d
 * reads them. zlib's gzread stops silently at the first bytes after a
 * member that are not another member: a file with junk appended (a
 * cut-and-pasted download, two files glued with a header between them)
 * loaded as if the junk were not there. gzip(1) says "decompression OK,
 * trailing garbage ignored" and exits 2; it ignores zero bytes after the
 * last member silently (tar pads with them). This reader stops there too
 * (what follows is no data) and remembers where the gzip data ended, so
 * that ps_gzr_check_tail can answer, without inflating the file again:
 *  - PS_OK: every byte belongs to a member, or only zero bytes follow the
 *    last one (or the file is not gzip'ed);
 *  - PS_ERR_FORMAT naming the file, where the gzip data ends and how many
 *    bytes follow: other bytes after the last member (refused: the loaders
 *    refuse trailing bytes after an array's data too);
 *  - PS_ERR_IO when the rest of the file cannot be read.
 * A member that does not decompress, or a file cut inside one, is an
 * error of ps_gzr_read with zlib's message, at the read where gzread gave
 * it (gzread.c follows gzread's steps). Memory is constant: 24 KiB of
 * buffers and zlib's state. */
#ifndef PS_TRAINER_GZREAD_H
#define PS_TRAINER_GZREAD_H

#include <stddef.h>

#include "status.h"

typedef struct ps_gzr ps_gzr;

/* Open path: PS_ERR_NOT_FOUND or PS_ERR_IO ("PATH: cannot open: ...").
 * path is kept (not copied) until ps_gzr_close. A FIFO without a writer
 * blocks here: callers read streams into memory first (stream.h). */
ps_status ps_gzr_open(const char *path, ps_gzr **out, ps_err *err);

/* Whether the file starts with the gzip magic. */
int ps_gzr_gzipped(const ps_gzr *r);

/* Up to n bytes into buf; *got says how many arrived. 0 after n bytes or
 * at the end of the data; -1 when the data does not decompress, is cut, or
 * the file cannot be read (*msg: zlib's or the system's words, without the
 * path; *got: the bytes before it). */
int ps_gzr_read(ps_gzr *r, void *buf, size_t n, size_t *got, const char **msg);

/* After ps_gzr_read reached the end of the data: the bytes after the last
 * gzip member (above). Reads the rest of the file once, without inflating. */
ps_status ps_gzr_check_tail(ps_gzr *r, ps_err *err);

void ps_gzr_close(ps_gzr *r);

#endif
