/* idx.c - IDX files (the MNIST container), raw or gzip'ed, checked
 * against their header (idx.h). */
#include "idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dims.h"

/* Human name of an IDX dtype byte, for error messages. */
static const char *dtype_name(int t) {
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    }
    return "unknown";
}

/* Read up to n bytes; *got is how many arrived. Returns 0 at a clean end or
 * after n bytes, -1 on a zlib error (message in *zmsg). */
static int read_full(gzFile gz, void *buf, size_t n, size_t *got, const char **zmsg) {
    *got = 0;
    while (*got < n) {
        size_t want = n - *got;
        if (want > (1u << 30)) want = 1u << 30;
        int r = gzread(gz, (char *)buf + *got, (unsigned)want);
        if (r < 0) {
            int zerr;
            *zmsg = gzerror(gz, &zerr);
            return -1;
        }
        if (r == 0) {
            /* gzread returns 0 both at a clean end and, for a truncated gzip
             * stream, with the error set: tell them apart. */
            int zerr;
            const char *m = gzerror(gz, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END) { *zmsg = m; return -1; }
            return 0;
        }
        *got += (size_t)r;
    }
    return 0;
}

/* gzerror's message starts with the path; drop it since ours does too. */
static const char *strip_path(const char *path, const char *zmsg) {
    size_t n = strlen(path);
    if (!strncmp(zmsg, path, n) && zmsg[n] == ':' && zmsg[n + 1] == ' ') return zmsg + n + 2;
    return zmsg;
}

/* "60000x28x28" */
static void dims_str(const ps_idx *x, char *buf, size_t cap) {
    int64_t d[PS_IDX_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) d[i] = x->dims[i];
    ps_dims_format_as(buf, cap, d, x->ndim, "", "x", "");
}

ps_status ps_idx_load(const char *path, ps_idx *out, ps_err *err) {
    memset(out, 0, sizeof *out);

    /* Peek at the first two bytes only to say "gzip" in messages; zlib
     * itself detects the format. */
    FILE *f = fopen(path, "rb");
    if (!f)
        return ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO,
                          "%s: cannot open: %s", path, strerror(errno));
    unsigned char peek[2] = {0, 0};
    size_t npeek = fread(peek, 1, 2, f);
    fclose(f);
    int gzipped = npeek == 2 && peek[0] == 0x1f && peek[1] == 0x8b;
    const char *kind = gzipped ? " (gzip)" : "";

    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return ps_err_set(err, PS_ERR_IO, "%s: cannot open%s: %s", path, kind,
                          errno ? strerror(errno) : "out of memory");

    ps_status st = PS_OK;
    const char *zmsg = "";
    uint8_t *data = NULL;
    ps_idx x;
    memset(&x, 0, sizeof x);
    unsigned char hdr[4 + 4 * PS_IDX_MAX_DIMS];
    size_t got;

    if (read_full(gz, hdr, 4, &got, &zmsg) < 0) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: read error%s: %s", path, kind,
                        strip_path(path, zmsg));
        goto done;
    }
    if (got < 4) {
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: not an IDX file%s: expected a 4-byte magic, got %zu bytes",
                        path, kind, got);
        goto done;
    }
    if (hdr[0] != 0 || hdr[1] != 0) {
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: not an IDX file%s: magic is %02x %02x %02x %02x, "
                        "expected 00 00 <dtype> <ndim>",
                        path, kind, hdr[0], hdr[1], hdr[2], hdr[3]);
        goto done;
    }
    if (hdr[2] != PS_IDX_DTYPE_UBYTE) {
        st = ps_err_set(err, PS_ERR_UNIMPLEMENTED,
                        "%s: IDX dtype 0x%02x (%s) is not supported; only 0x08 (unsigned byte) is",
                        path, hdr[2], dtype_name(hdr[2]));
        goto done;
    }
    if (hdr[3] < 1 || hdr[3] > PS_IDX_MAX_DIMS) {
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: IDX header declares %d dimensions; expected 1..%d",
                        path, hdr[3], PS_IDX_MAX_DIMS);
        goto done;
    }
    x.ndim = hdr[3];
    if (read_full(gz, hdr + 4, 4 * (size_t)x.ndim, &got, &zmsg) < 0) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: read error%s: %s", path, kind,
                        strip_path(path, zmsg));
        goto done;
    }
    if (got < 4 * (size_t)x.ndim) {
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: IDX header truncated: expected %d bytes of dimensions, got %zu",
                        path, 4 * x.ndim, got);
        goto done;
    }
    uint64_t total = 1;
    for (int i = 0; i < x.ndim; i++) {
        const unsigned char *p = hdr + 4 + 4 * i;
        x.dims[i] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (x.dims[i] == 0) {
            st = ps_err_set(err, PS_ERR_FORMAT, "%s: IDX dimension %d is 0", path, i);
            goto done;
        }
        /* dims are < 2^32 and total stays <= 2^31 before each step: no overflow. */
        total *= x.dims[i];
        if (total > PS_IDX_MAX_BYTES) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                            "%s: IDX dimensions declare more than %zu bytes of data; "
                            "refusing (corrupt header?)", path, (size_t)PS_IDX_MAX_BYTES);
            goto done;
        }
    }
    x.size = (size_t)total;

    /* Grow the buffer as data arrives so that a short file with a huge
     * header costs only what the file holds. */
    size_t cap = 0, have = 0;
    while (have < x.size) {
        if (have == cap) {
            size_t ncap = cap ? cap * 2 : (size_t)1 << 20;
            if (ncap > x.size) ncap = x.size;
            uint8_t *nd = realloc(data, ncap);
            if (!nd) {
                st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                                "%s: out of memory for %zu bytes of data", path, ncap);
                goto done;
            }
            data = nd;
            cap = ncap;
        }
        if (read_full(gz, data + have, cap - have, &got, &zmsg) < 0) {
            st = ps_err_set(err, PS_ERR_FORMAT,
                            "%s: read error%s after %zu of %zu data bytes (corrupt or truncated?): %s",
                            path, kind, have + got, x.size, strip_path(path, zmsg));
            goto done;
        }
        have += got;
        if (have < cap) break; /* end of file */
    }
    if (have < x.size) {
        char ds[64];
        dims_str(&x, ds, sizeof ds);
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: truncated IDX data%s: dimensions %s need %zu bytes, got %zu",
                        path, kind, ds, x.size, have);
        goto done;
    }

    /* Anything after the declared data means the header is wrong. */
    size_t trailing = 0;
    for (;;) {
        unsigned char scratch[65536];
        if (read_full(gz, scratch, sizeof scratch, &got, &zmsg) < 0) {
            st = ps_err_set(err, PS_ERR_FORMAT, "%s: read error%s after the data: %s",
                            path, kind, strip_path(path, zmsg));
            goto done;
        }
        trailing += got;
        if (got < sizeof scratch) break;
    }
    if (trailing) {
        char ds[64];
        dims_str(&x, ds, sizeof ds);
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: %zu trailing bytes after the %zu data bytes that dimensions %s declare",
                        path, trailing, x.size, ds);
        goto done;
    }

    x.data = data;
    data = NULL;
    *out = x;
done:
    free(data);
    gzclose(gz);
    return st;
}

void ps_idx_free(ps_idx *idx) {
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
