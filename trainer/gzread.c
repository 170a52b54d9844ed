/* gzread.c - a file read raw or gunzip'ed in one pass, and the bytes after
 * its last gzip member (gzread.h).
 *
 * The reading follows zlib's gzread step by step (its 8 KiB input and
 * 16 KiB output buffers, small reads served from the output buffer, large
 * ones inflated straight into the caller's, the same errors with the same
 * words at the same reads), so that what the loaders answered through
 * gzread - their messages included - stays as it was. Where gzread drops
 * the bytes after the last member, this reader keeps its place there. */
#include "gzread.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#define GZR_IN 8192           /* gzread's default buffer (gzbuffer) */
#define GZR_OUT (GZR_IN << 1) /* its output buffer */
#define GZR_MAX (1u << 30)    /* the most one read() or inflate() call is given */

enum { LOOK, COPY, GZIP }; /* what comes next: unknown (a member or the end), raw bytes, a member's data */

struct ps_gzr {
    int fd;
    const char *path;
    int how, direct, gz, eof, ended, members, zinit;
    int err;          /* Z_OK, Z_BUF_ERROR (cut), or a hard error */
    const char *msg;  /* err's words (static strings) */
    uint64_t nread;   /* bytes read from the file */
    uint64_t end;     /* the offset just past the last member inflated */
    unsigned have;    /* output buffered at next */
    unsigned char *next;
    z_stream zs;
    unsigned char in[GZR_IN], out[GZR_OUT];
};

static void set_err(ps_gzr *r, int err, const char *msg) {
    r->err = err;
    r->msg = msg;
}

/* Up to len bytes of the file into buf (*have); 0, or -1 on a read error. */
static int load(ps_gzr *r, unsigned char *buf, unsigned len, unsigned *have) {
    ssize_t k = 0;
    *have = 0;
    while (*have < len) {
        k = read(r->fd, buf + *have, len - *have);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        *have += (unsigned)k;
        r->nread += (uint64_t)k;
    }
    if (k < 0) {
        set_err(r, Z_ERRNO, strerror(errno));
        return -1;
    }
    if (k == 0) r->eof = 1;
    return 0;
}

/* Keep the unread input and read more after it. */
static int avail(ps_gzr *r) {
    if (r->err != Z_OK && r->err != Z_BUF_ERROR) return -1;
    if (!r->eof) {
        unsigned got;
        if (r->zs.avail_in) memmove(r->in, r->zs.next_in, r->zs.avail_in);
        if (load(r, r->in + r->zs.avail_in, GZR_IN - r->zs.avail_in, &got)) return -1;
        r->zs.avail_in += got;
        r->zs.next_in = r->in;
    }
    return 0;
}

/* At the start or after a member: a member (its magic), raw bytes (at the
 * start only), or the end of the data (what follows is the tail). */
static int look(ps_gzr *r) {
    if (r->zs.avail_in < 2) {
        if (avail(r)) return -1;
        if (!r->zs.avail_in) return 0;
    }
    if (r->zs.avail_in > 1 && r->zs.next_in[0] == 0x1f && r->zs.next_in[1] == 0x8b) {
        inflateReset(&r->zs);
        r->how = GZIP;
        r->direct = 0;
        return 0;
    }
    if (!r->direct) { /* after a member: not another one */
        r->ended = 1;
        return 0;
    }
    memcpy(r->out, r->zs.next_in, r->zs.avail_in);
    r->next = r->out;
    r->have = r->zs.avail_in;
    r->zs.avail_in = 0;
    r->how = COPY;
    return 0;
}

/* Inflate into next_out/avail_out until it is full or the member ends. */
static int decomp(ps_gzr *r) {
    int z = Z_OK;
    unsigned had = r->zs.avail_out;
    do {
        if (!r->zs.avail_in && avail(r)) return -1;
        if (!r->zs.avail_in) {
            set_err(r, Z_BUF_ERROR, "unexpected end of file"); /* what is there is delivered first */
            break;
        }
        z = inflate(&r->zs, Z_NO_FLUSH);
        if (z == Z_STREAM_ERROR || z == Z_NEED_DICT) {
            set_err(r, Z_STREAM_ERROR, "internal error: inflate stream corrupt");
            return -1;
        }
        if (z == Z_MEM_ERROR) {
            set_err(r, Z_MEM_ERROR, "out of memory");
            return -1;
        }
        if (z == Z_DATA_ERROR) {
            set_err(r, Z_DATA_ERROR, r->zs.msg ? r->zs.msg : "compressed data error");
            return -1;
        }
    } while (r->zs.avail_out && z != Z_STREAM_END);
    r->have = had - r->zs.avail_out;
    r->next = r->zs.next_out - r->have;
    if (z == Z_STREAM_END) {
        r->how = LOOK;
        r->members++;
        r->end = r->nread - r->zs.avail_in;
    }
    return 0;
}

/* Fill the output buffer (have == 0 on entry). */
static int fetch(ps_gzr *r) {
    do {
        switch (r->how) {
        case LOOK:
            if (look(r)) return -1;
            if (r->how == LOOK) return 0;
            break;
        case COPY:
            if (load(r, r->out, GZR_OUT, &r->have)) return -1;
            r->next = r->out;
            return 0;
        default:
            r->zs.avail_out = GZR_OUT;
            r->zs.next_out = r->out;
            if (decomp(r)) return -1;
        }
    } while (!r->have && (!r->eof || r->zs.avail_in));
    return 0;
}

/* One gzread(buf, len): the count, 0 at the end (or cut: err says), -1. */
static long read_once(ps_gzr *r, unsigned char *buf, unsigned len) {
    if (r->err != Z_OK && r->err != Z_BUF_ERROR) return -1;
    unsigned long got = 0;
    while (len) {
        unsigned n = len;
        if (r->have) {
            if (r->have < n) n = r->have;
            memcpy(buf, r->next, n);
            r->next += n;
            r->have -= n;
        } else if (r->ended || (r->eof && !r->zs.avail_in)) {
            break;
        } else if (r->how == LOOK || n < GZR_OUT) {
            if (fetch(r)) { got = 0; break; } /* gzread drops this call's bytes on an error */
            continue;
        } else if (r->how == COPY) {
            if (load(r, buf, n, &n)) { got = 0; break; }
        } else {
            r->zs.avail_out = n;
            r->zs.next_out = buf;
            if (decomp(r)) { got = 0; break; }
            n = r->have;
            r->have = 0;
        }
        len -= n;
        buf += n;
        got += n;
    }
    if (!got && r->err != Z_OK && r->err != Z_BUF_ERROR) return -1;
    return (long)got;
}

ps_status ps_gzr_open(const char *path, ps_gzr **out, ps_err *err) {
    *out = NULL;
    ps_gzr *r = calloc(1, sizeof *r);
    if (!r) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    r->path = path;
    r->how = LOOK;
    r->direct = 1;
    r->err = Z_OK;
    if ((r->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        ps_status st = ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s", path,
                                  strerror(errno));
        free(r);
        return st;
    }
    if (inflateInit2(&r->zs, 16 + MAX_WBITS) != Z_OK) { /* gzip only: a header and a trailer */
        close(r->fd);
        free(r);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for zlib", path);
    }
    avail(r); /* the start tells gzip from raw; a read error is the first read's */
    r->gz = r->zs.avail_in >= 2 && r->in[0] == 0x1f && r->in[1] == 0x8b;
    *out = r;
    return PS_OK;
}

int ps_gzr_gzipped(const ps_gzr *r) { return r->gz; }

int ps_gzr_read(ps_gzr *r, void *buf, size_t n, size_t *got, const char **msg) {
    *got = 0;
    while (*got < n) {
        size_t want = n - *got > GZR_MAX ? GZR_MAX : n - *got;
        long k = read_once(r, (unsigned char *)buf + *got, (unsigned)want);
        if (k < 0 || (k == 0 && r->err != Z_OK)) { /* a cut stream answers 0 with err set: not a clean end */
            *msg = r->msg;
            return -1;
        }
        if (k == 0) return 0;
        *got += (size_t)k;
    }
    return 0;
}

ps_status ps_gzr_check_tail(ps_gzr *r, ps_err *err) {
    if (!r->gz || !r->ended) return PS_OK;
    uint64_t tail = r->zs.avail_in;
    int junk = 0;
    for (uInt i = 0; i < r->zs.avail_in && !junk; i++) junk = r->zs.next_in[i] != 0;
    r->zs.avail_in = 0;
    while (!r->eof) {
        unsigned got;
        if (load(r, r->in, GZR_IN, &got))
            return ps_err_set(err, PS_ERR_IO, "%s: read error: %s", r->path, r->msg);
        tail += got;
        for (unsigned i = 0; i < got && !junk; i++) junk = r->in[i] != 0;
    }
    if (!junk) return PS_OK;
    return ps_err_set(err, PS_ERR_FORMAT, "%s: %llu byte%s after the end of the gzip data (byte %llu, after %d "
                      "member%s) are not gzip; refused (gzip -d ignores them, warning 'trailing garbage "
                      "ignored'): cut the file at byte %llu", r->path, (unsigned long long)tail, tail == 1 ? "" : "s",
                      (unsigned long long)r->end, r->members, r->members == 1 ? "" : "s",
                      (unsigned long long)r->end);
}

void ps_gzr_close(ps_gzr *r) {
    if (!r) return;
    inflateEnd(&r->zs);
    close(r->fd);
    free(r);
}
