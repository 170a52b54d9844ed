/* stream.h - a pipe, FIFO, socket or device read whole into memory, so
 * that the loaders read it as they read a regular file (dataset.h says
 * what users see; ps_data_load and ps_idx_load use it).
 *
 * Streams can be read once, and a FIFO without a writer blocks in fopen
 * forever: the caller opens the path with O_NONBLOCK (which never waits)
 * and, when fstat says it is not a regular file or directory, passes the
 * descriptor here. What is read is bounded (limit bytes); the first byte,
 * or the writer's close, must come within wait_ms. */
#ifndef PS_TRAINER_STREAM_H
#define PS_TRAINER_STREAM_H

#include <stddef.h>

#include "status.h"

/* Room a header or container may add to an array's bytes in a stream. */
#define PS_DATA_STREAM_SLACK ((size_t)1 << 20)
/* How long a stream's first byte is waited for. */
#define PS_DATA_STREAM_WAIT_MS 60000

/* The stream on fd (opened O_NONBLOCK) read whole into an anonymous
 * in-memory file: *memfd on success (the caller closes it; it reads as
 * "/proc/self/fd/N"). At most limit bytes (PS_ERR_RESOURCE_EXHAUSTED
 * beyond); no byte within wait_ms: PS_ERR_UNAVAILABLE naming path and
 * "no writer?". */
ps_status ps_stream_read(int fd, const char *path, size_t limit, int wait_ms, int *memfd, ps_err *err);

/* Replace every `from` in err's message by `to` (the stream's name for the
 * in-memory copy's). */
void ps_err_rename(ps_err *err, const char *from, const char *to);

/* Load path with load(path, arg): a regular file (or a directory, for the
 * loader to refuse) as it is; a terminal refused; any other stream (a pipe
 * such as <(zcat x.gz), a FIFO, /dev/stdin) opened without waiting, read
 * with ps_stream_read (limit, wait_ms) and loaded from its in-memory copy,
 * errors naming path, not the copy. */
typedef ps_status (*ps_stream_load_fn)(const char *path, void *arg, ps_err *err);
ps_status ps_stream_load(const char *path, size_t limit, int wait_ms, ps_stream_load_fn load, void *arg,
                         ps_err *err);

#endif
