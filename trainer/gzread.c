/* gzread.c - a file read raw or gunzip'ed in one pass, and the bytes after
 * its last gzip member (gzread.h). */
#include "gzread.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define GZR_CHUNK 65536

enum { GZR_DATA, GZR_END, GZR_ERROR }; /* reading data; at the end of the data; failed (msg) */

struct ps_gzr {
    FILE *f;
    const char *path;
    int gz, state, members;
    const char *msg;  /* GZR_ERROR: zlib's or strerror's message (static strings) */
    uint64_t nread;   /* bytes read from the file so far */
    uint64_t end;     /* GZR_END of a gzip file: the offset just past the last member */
    z_stream zs;
    unsigned char in[GZR_CHUNK];
};

/* Keep the avail_in unread bytes and read more after them: the count read,
 * 0 at the end of the file or on an error (ferror). */
static size_t refill(ps_gzr *r) {
    if (r->zs.avail_in && r->zs.next_in != r->in) memmove(r->in, r->zs.next_in, r->zs.avail_in);
    r->zs.next_in = r->in;
    size_t n = fread(r->in + r->zs.avail_in, 1, sizeof r->in - r->zs.avail_in, r->f);
    r->zs.avail_in += (uInt)n;
    r->nread += n;
    return n;
}

static int fail(ps_gzr *r, const char *msg) {
    r->state = GZR_ERROR;
    r->msg = msg;
    return -1;
}

ps_status ps_gzr_open(const char *path, ps_gzr **out, ps_err *err) {
    *out = NULL;
    ps_gzr *r = calloc(1, sizeof *r);
    if (!r) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    r->path = path;
    if (!(r->f = fopen(path, "rb"))) {
        ps_status st = ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s", path,
                                  strerror(errno));
        free(r);
        return st;
    }
    refill(r); /* the start tells gzip from raw; a read error is the first read's */
    if (ferror(r->f)) fail(r, strerror(errno));
    r->gz = r->zs.avail_in >= 2 && r->in[0] == 0x1f && r->in[1] == 0x8b;
    if (r->gz && inflateInit2(&r->zs, 16 + MAX_WBITS) != Z_OK) { /* gzip only: a header and a trailer */
        fclose(r->f);
        free(r);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for zlib", path);
    }
    *out = r;
    return PS_OK;
}

int ps_gzr_gzipped(const ps_gzr *r) { return r->gz; }

static int read_raw(ps_gzr *r, unsigned char *buf, size_t n, size_t *got) {
    size_t k = r->zs.avail_in < n ? r->zs.avail_in : n; /* what open read ahead first */
    memcpy(buf, r->zs.next_in, k);
    r->zs.next_in += k;
    r->zs.avail_in -= (uInt)k;
    *got = k;
    if (*got < n) *got += fread(buf + *got, 1, n - *got, r->f);
    if (*got < n && ferror(r->f)) return fail(r, strerror(errno));
    return 0;
}

int ps_gzr_read(ps_gzr *r, void *buf, size_t n, size_t *got, const char **msg) {
    *got = 0;
    if (r->state == GZR_DATA && !r->gz && read_raw(r, buf, n, got) == 0) return 0;
    while (r->state == GZR_DATA && *got < n) {
        if (!r->zs.avail_in && !refill(r))
            return fail(r, ferror(r->f) ? strerror(errno) : "unexpected end of file"); /* gzread's words */
        size_t want = n - *got;
        r->zs.next_out = (unsigned char *)buf + *got;
        r->zs.avail_out = want > (1u << 30) ? 1u << 30 : (uInt)want;
        uInt before = r->zs.avail_out;
        int z = inflate(&r->zs, Z_NO_FLUSH);
        *got += before - r->zs.avail_out;
        if (z == Z_STREAM_END) {
            /* What follows: another member (its magic), or the end of the data. */
            r->members++;
            if (r->zs.avail_in < 2) refill(r);
            if (ferror(r->f)) return fail(r, strerror(errno));
            if (r->zs.avail_in >= 2 && r->zs.next_in[0] == 0x1f && r->zs.next_in[1] == 0x8b) {
                inflateReset(&r->zs);
                continue;
            }
            r->end = r->nread - r->zs.avail_in;
            r->state = GZR_END;
        } else if (z == Z_DATA_ERROR) {
            return fail(r, r->zs.msg ? r->zs.msg : "compressed data error");
        } else if (z == Z_MEM_ERROR) {
            return fail(r, "out of memory");
        } else if (z != Z_OK && z != Z_BUF_ERROR) {
            return fail(r, "internal error: inflate stream corrupt");
        }
    }
    if (r->state == GZR_ERROR) {
        *msg = r->msg;
        return -1;
    }
    return 0;
}

ps_status ps_gzr_check_tail(ps_gzr *r, ps_err *err) {
    if (!r->gz || r->state != GZR_END) return PS_OK;
    uint64_t tail = 0;
    int junk = 0;
    do {
        for (uInt i = 0; i < r->zs.avail_in && !junk; i++) junk = r->zs.next_in[i] != 0;
        tail += r->zs.avail_in;
        r->zs.avail_in = 0;
    } while (refill(r));
    if (ferror(r->f)) return ps_err_set(err, PS_ERR_IO, "%s: read error: %s", r->path, strerror(errno));
    if (!junk) return PS_OK;
    return ps_err_set(err, PS_ERR_FORMAT, "%s: %llu byte%s after the end of the gzip data (byte %llu, after %d "
                      "member%s) are not gzip; refused (gzip -d ignores them, warning 'trailing garbage "
                      "ignored'): cut the file at byte %llu", r->path, (unsigned long long)tail, tail == 1 ? "" : "s",
                      (unsigned long long)r->end, r->members, r->members == 1 ? "" : "s",
                      (unsigned long long)r->end);
}

void ps_gzr_close(ps_gzr *r) {
    if (!r) return;
    if (r->gz) inflateEnd(&r->zs);
    fclose(r->f);
    free(r);
}
