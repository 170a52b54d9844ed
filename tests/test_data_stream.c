/* test_data_stream.c - data that can be read only once (trainer/dataset.h):
 * a named pipe (mkfifo) and an anonymous pipe named /dev/fd/N, as bash's
 * <(zcat x.npy.gz) gives ps-train fit. Each is fed by a child process.
 *  - a .npy, a gzip'ed .npy, a gzip'ed IDX and a safetensors tensor
 *    (FIFO:NAME) through a FIFO, a .npy through /dev/fd/N, and FIFO:NAME of
 *    a .npy refused naming the FIFO: the values arrive
 *    whole (the format sniffing used to consume the first bytes, and the
 *    loader then reopened the FIFO and blocked for a second writer);
 *  - a FIFO nobody writes is refused within the wait given (it used to
 *    block in fopen forever), naming the FIFO and "no writer?";
 *  - a stream over the data limit is refused without reading it all
 *    (/dev/zero, and a FIFO writer of 4 MiB against a 64 KiB limit);
 *  - a stream that is no data file is refused naming the FIFO (not the
 *    in-memory copy's /proc/self/fd path);
 *  - ps_data_format on a FIFO answers at once (refused) instead of waiting;
 *  - ps_idx_load (what `ps-train mnist` reads with) handles a FIFO the same
 *    way: read whole, or refused naming it and "no writer?" (it used to
 *    block in fopen forever).
 * A SIGALRM after 60 s turns a hang into a failure. */
#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "dataset.h"
#include "idx.h"
#include "support/tmpdir.h"

static char g_dir[] = "/tmp/ps_test_data_stream_XXXXXX";

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_data_stream: FAILED: hung for 60 s (a stream read blocked)\n";
    if (write(2, msg, sizeof msg - 1)) {}
    _exit(1);
}

/* A .npy (version 1.0) of int32 (n,) holding 0, 7, 14, ... */
static size_t make_npy(unsigned char *buf, size_t cap, int n) {
    char hdr[128];
    int hl = snprintf(hdr, sizeof hdr, "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }", n);
    while ((10 + hl + 1) % 64) hdr[hl++] = ' ';
    hdr[hl++] = '\n';
    size_t len = 10 + (size_t)hl + 4 * (size_t)n;
    if (len > cap) return 0;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hl & 0xff);
    buf[9] = (unsigned char)(hl >> 8);
    memcpy(buf + 10, hdr, (size_t)hl);
    for (int i = 0; i < n; i++) {
        int32_t v = 7 * i;
        memcpy(buf + 10 + hl + 4 * i, &v, 4);
    }
    return len;
}

/* A child that opens path for writing (waiting for the reader) and writes
 * len bytes of buf, gzip'ed when gz; or writes to the pipe end fd when
 * path is NULL. */
static pid_t writer(const char *path, int fd, const void *buf, size_t len, int gz) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    signal(SIGPIPE, SIG_IGN);
    if (path) fd = open(path, O_WRONLY);
    if (fd < 0) _exit(2);
    if (gz) {
        gzFile g = gzdopen(fd, "wb");
        if (!g || gzwrite(g, buf, (unsigned)len) != (int)len) _exit(3);
        gzclose(g);
        _exit(0);
    }
    for (size_t o = 0; o < len;) {
        ssize_t k = write(fd, (const char *)buf + o, len - o);
        if (k <= 0) _exit(4);
        o += (size_t)k;
    }
    close(fd);
    _exit(0);
}

static void reap(pid_t pid) {
    kill(pid, SIGKILL); /* a writer the loader refused before opening waits forever */
    waitpid(pid, NULL, 0);
}

static void check_values(const char *what, ps_status st, const ps_array *a, const ps_err *e, int n) {
    CHECK_MSG(st == PS_OK, "%s: %s", what, e->msg);
    if (st) return;
    CHECK_MSG(a->dtype == PS_ARRAY_I32 && a->ndim == 1 && a->dims[0] == n, "%s: dtype %d ndim %d dims[0] %lld", what,
              a->dtype, a->ndim, (long long)a->dims[0]);
    int bad = -1;
    for (int i = 0; i < n && bad < 0 && a->ndim == 1 && a->dims[0] == n; i++)
        if (((const int32_t *)a->data)[i] != 7 * i) bad = i;
    CHECK_MSG(bad < 0, "%s: element %d is wrong", what, bad);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(60);
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/in.fifo", g_dir);
    if (mkfifo(fifo, 0600)) { perror("mkfifo"); return 2; }
    static unsigned char npy[1 << 16];
    const int n = 1000;
    size_t len = make_npy(npy, sizeof npy, n);
    CHECK(len > 0);
    ps_array a;
    ps_err e = {0};
    ps_status st;
    pid_t w;

    /* a .npy through a FIFO: whole, every value */
    w = writer(fifo, -1, npy, len, 0);
    st = ps_data_load(fifo, PS_DATA_MAX_BYTES, &a, &e);
    check_values("npy through a FIFO", st, &a, &e, n);
    ps_array_free(&a);
    reap(w);

    /* gzip'ed: the gzip reader gets the stream's bytes too */
    w = writer(fifo, -1, npy, len, 1);
    st = ps_data_load(fifo, PS_DATA_MAX_BYTES, &a, &e);
    check_values("gzip'ed npy through a FIFO", st, &a, &e, n);
    ps_array_free(&a);
    reap(w);

    /* a gzip'ed IDX through a FIFO */
    unsigned char idx[8 + 300];
    memcpy(idx, "\0\0\x08\x01\0\0\x01\x2c", 8);
    for (int i = 0; i < 300; i++) idx[8 + i] = (unsigned char)(i * 3);
    w = writer(fifo, -1, idx, sizeof idx, 1);
    st = ps_data_load(fifo, PS_DATA_MAX_BYTES, &a, &e);
    CHECK_MSG(st == PS_OK && a.dtype == PS_ARRAY_U8 && a.ndim == 1 && a.dims[0] == 300 &&
              !memcmp(a.data, idx + 8, 300), "gzip'ed IDX through a FIFO: %s", st ? e.msg : "wrong array");
    ps_array_free(&a);
    reap(w);

    /* an anonymous pipe as /dev/fd/N: what bash's <(zcat x.npy.gz) passes */
    int p[2];
    CHECK(pipe(p) == 0);
    w = writer(NULL, p[1], npy, len, 0);
    close(p[1]);
    char devfd[64];
    snprintf(devfd, sizeof devfd, "/dev/fd/%d", p[0]);
    st = ps_data_load(devfd, PS_DATA_MAX_BYTES, &a, &e);
    check_values("npy through /dev/fd/N", st, &a, &e, n);
    ps_array_free(&a);
    close(p[0]);
    reap(w);

    /* safetensors through a FIFO, a tensor picked by FIFO:NAME (its reader
     * wants a regular file: it gets the in-memory copy) */
    static unsigned char st_file[8 + 128 + 4000];
    char js[129];
    int jl = snprintf(js, sizeof js, "{\"x\":{\"dtype\":\"I32\",\"shape\":[%d],\"data_offsets\":[0,%d]},"
                      "\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[%d,%d]}}", n, 4 * n, 4 * n, 4 * n);
    while (jl % 8) js[jl++] = ' ';
    for (int i = 0; i < 8; i++) st_file[i] = (unsigned char)((uint64_t)jl >> (8 * i));
    memcpy(st_file + 8, js, (size_t)jl);
    memcpy(st_file + 8 + jl, npy + len - 4 * (size_t)n, 4 * (size_t)n); /* the .npy's elements */
    char spec[160];
    snprintf(spec, sizeof spec, "%s:x", fifo);
    w = writer(fifo, -1, st_file, 8 + (size_t)jl + 4 * (size_t)n, 0);
    st = ps_data_load(spec, PS_DATA_MAX_BYTES, &a, &e);
    check_values("safetensors through a FIFO", st, &a, &e, n);
    ps_array_free(&a);
    reap(w);

    /* FILE:NAME of a stream that holds one array: refused, naming the FIFO */
    w = writer(fifo, -1, npy, len, 0);
    st = ps_data_load(spec, PS_DATA_MAX_BYTES, &a, &e);
    CHECK_MSG(st == PS_ERR_INVALID_ARGUMENT && strstr(e.msg, fifo) && strstr(e.msg, "names nothing in it") &&
              !strstr(e.msg, "/proc/self/fd"), "%s: %s", spec, e.msg);
    reap(w);

    /* a FIFO nobody writes: refused within the wait, not waited on forever */
    st = ps_data_load_wait(fifo, PS_DATA_MAX_BYTES, 300, &a, &e);
    CHECK_MSG(st == PS_ERR_UNAVAILABLE && strstr(e.msg, fifo) && strstr(e.msg, "nothing written to it in 0.3 s (no writer?)"), "no writer: %d %s", st,
              e.msg);

    /* ps_idx_load (ps-train mnist) on a FIFO: the same stream handling; it
     * used to block in fopen forever when nobody wrote the FIFO */
    ps_idx x;
    w = writer(fifo, -1, idx, sizeof idx, 1);
    st = ps_idx_load(fifo, &x, &e);
    CHECK_MSG(st == PS_OK && x.ndim == 1 && x.dims[0] == 300 && !memcmp(x.data, idx + 8, 300),
              "ps_idx_load of a gzip'ed IDX through a FIFO: %s", st ? e.msg : "wrong array");
    ps_idx_free(&x);
    reap(w);
    st = ps_idx_load_wait(fifo, 300, &x, &e);
    CHECK_MSG(st == PS_ERR_UNAVAILABLE && strstr(e.msg, fifo) && strstr(e.msg, "nothing written to it in 0.3 s (no "
              "writer?)") && x.data == NULL, "ps_idx_load, no writer: %d %s", st, e.msg);
    w = writer(fifo, -1, idx, 20, 0); /* cut: the message names the FIFO, not the in-memory copy */
    st = ps_idx_load(fifo, &x, &e);
    CHECK_MSG(st == PS_ERR_FORMAT && strstr(e.msg, fifo) && strstr(e.msg, "need 300 bytes, got 12") &&
              !strstr(e.msg, "/proc/self/fd"), "ps_idx_load of a cut IDX through a FIFO: %d %s", st, e.msg);
    reap(w);

    /* over the limit: refused, never read whole */
    st = ps_data_load_wait("/dev/zero", 65536, 300, &a, &e);
    CHECK_MSG(st == PS_ERR_RESOURCE_EXHAUSTED && strstr(e.msg, "/dev/zero") && strstr(e.msg, "--max-data-mb"),
              "/dev/zero: %d %s", st, e.msg);
    size_t big = (size_t)4 << 20;
    unsigned char *zeros = calloc(1, big);
    w = writer(fifo, -1, zeros, big, 0);
    st = ps_data_load(fifo, 65536, &a, &e);
    CHECK_MSG(st == PS_ERR_RESOURCE_EXHAUSTED && strstr(e.msg, fifo), "4 MiB FIFO, 64 KiB limit: %d %s", st, e.msg);
    reap(w);
    free(zeros);

    /* no data file: the message names the FIFO, not the in-memory copy */
    w = writer(fifo, -1, "label,pixel0\n1,0\n", 17, 0);
    st = ps_data_load(fifo, PS_DATA_MAX_BYTES, &a, &e);
    CHECK_MSG(st == PS_ERR_FORMAT && strstr(e.msg, fifo) && strstr(e.msg, "not a data file") &&
              !strstr(e.msg, "/proc/self/fd"), "text through a FIFO: %s", e.msg);
    reap(w);

    /* ps_data_format cannot tell a stream's format without consuming it */
    CHECK_MSG(ps_data_format(fifo, &e) == NULL && strstr(e.msg, "not a regular file"), "format of a FIFO: %s", e.msg);

    test_rmtree(g_dir);
    return check_summary("test_data_stream");
}
