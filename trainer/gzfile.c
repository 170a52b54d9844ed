/* gzfile.c - gzip'ed files as the loaders read them (gzfile.h). */
#include "gzfile.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <zlib.h>

#define GZ_CHUNK 65536

/* Inflate one member starting at file offset `at`; *end: the offset just
 * past it. 0, or -1 when it does not decompress (*msg) or ends early. */
static int one_member(FILE *f, z_stream *zs, uint64_t at, uint64_t *end, const char **msg) {
    unsigned char in[GZ_CHUNK], out[GZ_CHUNK];
    if (fseeko(f, (off_t)at, SEEK_SET)) { *msg = strerror(errno); return -1; }
    inflateReset(zs);
    uint64_t base = at;
    for (;;) {
        size_t n = fread(in, 1, sizeof in, f);
        if (n == 0) { *msg = ferror(f) ? strerror(errno) : "unexpected end of file"; return -1; }
        zs->next_in = in;
        zs->avail_in = (uInt)n;
        while (zs->avail_in) {
            zs->next_out = out;
            zs->avail_out = sizeof out;
            int r = inflate(zs, Z_NO_FLUSH);
            if (r == Z_STREAM_END) {
                *end = base + (uint64_t)(zs->next_in - in);
                return 0;
            }
            if (r != Z_OK && r != Z_BUF_ERROR) { *msg = zs->msg ? zs->msg : "error"; return -1; }
        }
        base += n;
    }
}

ps_status ps_gz_check_tail(const char *path, ps_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return ps_err_set(err, PS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) { /* gzip only: a header and a trailer */
        fclose(f);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for zlib", path);
    }
    ps_status st = PS_OK;
    uint64_t end = 0;
    int members = 0;
    for (;;) {
        const char *msg = "";
        if (one_member(f, &zs, end, &end, &msg)) {
            st = ps_err_set(err, PS_ERR_FORMAT, "%s: gzip member %d (from byte %llu) does not decompress (zlib: %s)",
                            path, members + 1, (unsigned long long)end, msg);
            break;
        }
        members++;
        /* what follows: another member (its magic), nothing, zeros, or junk */
        unsigned char b[GZ_CHUNK];
        size_t n;
        if (fseeko(f, (off_t)end, SEEK_SET)) { st = ps_err_set(err, PS_ERR_IO, "%s: seek: %s", path, strerror(errno)); break; }
        n = fread(b, 1, 2, f);
        if (n == 2 && b[0] == 0x1f && b[1] == 0x8b) continue;
        uint64_t tail = n;
        int junk = (n > 0 && b[0]) || (n > 1 && b[1]);
        while ((n = fread(b, 1, sizeof b, f)) > 0) {
            tail += n;
            for (size_t i = 0; i < n && !junk; i++) junk = b[i] != 0;
        }
        if (ferror(f)) st = ps_err_set(err, PS_ERR_IO, "%s: read error: %s", path, strerror(errno));
        else if (junk)
            st = ps_err_set(err, PS_ERR_FORMAT, "%s: %llu byte%s after the end of the gzip data (byte %llu, after %d "
                            "member%s) are not gzip; refused (gzip -d ignores them, warning 'trailing garbage "
                            "ignored'): cut the file at byte %llu", path, (unsigned long long)tail, tail == 1 ? "" : "s",
                            (unsigned long long)end, members, members == 1 ? "" : "s", (unsigned long long)end);
        break;
    }
    inflateEnd(&zs);
    fclose(f);
    return st;
}

int ps_gz_read_full(gzFile gz, void *buf, size_t n, size_t *got, const char **zmsg) {
    *got = 0;
    while (*got < n) {
        size_t want = n - *got;
        if (want > (1u << 30)) want = 1u << 30;
        int r = gzread(gz, (char *)buf + *got, (unsigned)want);
        int zerr;
        if (r < 0) {
            *zmsg = gzerror(gz, &zerr);
            return -1;
        }
        if (r == 0) {
            const char *m = gzerror(gz, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END) { *zmsg = m; return -1; }
            return 0;
        }
        *got += (size_t)r;
    }
    return 0;
}

const char *ps_gz_strip_path(const char *path, const char *zmsg) {
    size_t n = strlen(path);
    if (!strncmp(zmsg, path, n) && zmsg[n] == ':' && zmsg[n + 1] == ' ') return zmsg + n + 2;
    return zmsg;
}
