/* stream.c - a pipe, FIFO or other stream read whole into memory (stream.h). */
#include "stream.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

void ps_err_rename(ps_err *err, const char *from, const char *to) {
    char buf[sizeof err->msg];
    size_t o = 0, nf = strlen(from), nt = strlen(to);
    for (const char *p = err->msg; *p && o + 1 < sizeof buf;) {
        if (!strncmp(p, from, nf)) {
            size_t k = nt < sizeof buf - 1 - o ? nt : sizeof buf - 1 - o;
            memcpy(buf + o, to, k);
            o += k;
            p += nf;
        } else {
            buf[o++] = *p++;
        }
    }
    buf[o] = 0;
    memcpy(err->msg, buf, o + 1);
}

ps_status ps_stream_read(int fd, const char *path, size_t limit, int wait_ms, int *memfd, ps_err *err) {
    *memfd = memfd_create("ps-train-data", MFD_CLOEXEC);
    if (*memfd < 0) return ps_err_set(err, PS_ERR_IO, "%s: a stream, and no in-memory file to read it into: %s", path,
                                      strerror(errno));
    char buf[1 << 16];
    size_t total = 0;
    ps_status st = PS_OK;
    for (int first = 1;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int r = poll(&pf, 1, first ? wait_ms : -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { st = ps_err_set(err, PS_ERR_IO, "%s: poll: %s", path, strerror(errno)); break; }
        if (r == 0) {
            st = ps_err_set(err, PS_ERR_UNAVAILABLE, "%s: a FIFO with nothing written to it in %g s (no writer?): "
                            "start the program that writes it first, or write the data to a file", path,
                            wait_ms / 1000.0);
            break;
        }
        first = 0;
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n < 0) { st = ps_err_set(err, PS_ERR_IO, "%s: read error: %s", path, strerror(errno)); break; }
        if (n == 0) break; /* the writer closed it */
        if ((size_t)n > limit - total) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: a stream of more than %zu MiB, over the %zu MiB data "
                            "limit (--max-data-mb) and what a header may add; refused without reading the rest", path,
                            limit >> 20, (limit - PS_DATA_STREAM_SLACK) >> 20);
            break;
        }
        for (ssize_t w = 0; w < n;) {
            ssize_t k = write(*memfd, buf + w, (size_t)(n - w));
            if (k < 0 && errno == EINTR) continue;
            if (k < 0) {
                st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: a stream of %zu bytes does not fit in memory: %s",
                                path, total + (size_t)n, strerror(errno));
                break;
            }
            w += k;
        }
        if (st) break;
        total += (size_t)n;
    }
    if (st) {
        close(*memfd);
        *memfd = -1;
    }
    return st;
}

ps_status ps_stream_load(const char *path, size_t limit, int wait_ms, ps_stream_load_fn load, void *arg,
                         ps_err *err) {
    struct stat sb;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* never waits for a FIFO's writer */
    if (fd < 0 || fstat(fd, &sb)) {
        ps_status st = ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s", path,
                                  strerror(errno));
        if (fd >= 0) close(fd);
        return st;
    }
    if (S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode)) {
        close(fd);
        return load(path, arg, err);
    }
    if (isatty(fd)) {
        close(fd);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: a terminal, not a data file (redirect a file or a pipe "
                          "into it)", path);
    }
    int memfd;
    ps_status st = ps_stream_read(fd, path, limit, wait_ms, &memfd, err);
    close(fd);
    if (st) return st;
    char mpath[64];
    snprintf(mpath, sizeof mpath, "/proc/self/fd/%d", memfd);
    st = load(mpath, arg, err);
    if (st) ps_err_rename(err, mpath, path);
    close(memfd);
    return st;
}
