/* idx.c - IDX files (the MNIST container format), raw or gzip'ed (idx.h). */
#include "idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dims.h"
#include "gzfile.h"
#include "stream.h"

/* Trailing bytes counted before the error says "more than" (idx_load). */
#define IDX_TRAILING_COUNTED (1 << 20)

/* The IDX element types: type byte, name, bytes per element. */
static const struct { int code; const char *name; size_t size; } g_idx_types[] = {
    {PS_IDX_DTYPE_UBYTE, "unsigned byte", 1}, {0x09, "signed byte", 1}, {0x0B, "int16", 2},
    {0x0C, "int32", 4},                        {0x0D, "float32", 4},     {0x0E, "float64", 8},
};

static int type_index(int code) {
    for (size_t i = 0; i < sizeof g_idx_types / sizeof g_idx_types[0]; i++)
        if (g_idx_types[i].code == code) return (int)i;
    return -1;
}

const char *ps_idx_dtype_name(int code) {
    int i = type_index(code);
    return i < 0 ? "unknown" : g_idx_types[i].name;
}

size_t ps_idx_dtype_size(int code) {
    int i = type_index(code);
    return i < 0 ? 0 : g_idx_types[i].size;
}

static void dims_str(const ps_idx *x, char *buf, size_t cap) {
    int64_t d[PS_IDX_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) d[i] = x->dims[i];
    ps_dims_format_as(buf, cap, d, x->ndim, "", "x", "");  /* "60000x28x28" */
}

/* any: every IDX type (else unsigned bytes only); max_bytes: the data's limit. */
static ps_status idx_load(const char *path, int any, size_t max_bytes, ps_idx *out, ps_err *err) {
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

    if (ps_gz_read_full(gz, hdr, 4, &got, &zmsg) < 0) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: read error%s: %s", path, kind,
                        ps_gz_strip_path(path, zmsg));
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
    if (any ? !ps_idx_dtype_size(hdr[2]) : hdr[2] != PS_IDX_DTYPE_UBYTE) {
        st = ps_err_set(err, PS_ERR_UNIMPLEMENTED,
                        "%s: IDX dtype 0x%02x (%s) is not supported; only %s",
                        path, hdr[2], ps_idx_dtype_name(hdr[2]),
                        any ? "0x08 (unsigned byte), 0x09 (signed byte), 0x0b (int16), 0x0c (int32), 0x0d (float32) "
                              "and 0x0e (float64) are" : "0x08 (unsigned byte) is");
        goto done;
    }
    x.dtype = hdr[2];
    x.esize = ps_idx_dtype_size(hdr[2]);
    if (hdr[3] < 1 || hdr[3] > PS_IDX_MAX_DIMS) {
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: IDX header declares %d dimensions; expected 1..%d",
                        path, hdr[3], PS_IDX_MAX_DIMS);
        goto done;
    }
    x.ndim = hdr[3];
    if (ps_gz_read_full(gz, hdr + 4, 4 * (size_t)x.ndim, &got, &zmsg) < 0) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: read error%s: %s", path, kind,
                        ps_gz_strip_path(path, zmsg));
        goto done;
    }
    if (got < 4 * (size_t)x.ndim) {
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: IDX header truncated: expected %d bytes of dimensions, got %zu",
                        path, 4 * x.ndim, got);
        goto done;
    }
    uint64_t total = x.esize;
    for (int i = 0; i < x.ndim; i++) {
        const unsigned char *p = hdr + 4 + 4 * i;
        x.dims[i] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (x.dims[i] == 0) {
            st = ps_err_set(err, PS_ERR_FORMAT, "%s: IDX dimension %d is 0", path, i);
            goto done;
        }
        /* dims are < 2^32 and total stays <= max_bytes <= 2^32 before each step: no overflow. */
        total *= x.dims[i];
        if (total > max_bytes) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                            "%s: IDX dimensions declare more than %zu bytes of data; "
                            "refusing (corrupt header?)", path, max_bytes);
            goto done;
        }
    }
    x.bytes = (size_t)total;
    x.size = x.bytes / x.esize;

    /* Grow the buffer as data arrives so that a short file with a huge
     * header costs only what the file holds. */
    size_t cap = 0, have = 0;
    while (have < x.bytes) {
        if (have == cap) {
            size_t ncap = cap ? cap * 2 : (size_t)1 << 20;
            if (ncap > x.bytes) ncap = x.bytes;
            uint8_t *nd = realloc(data, ncap);
            if (!nd) {
                st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                                "%s: out of memory for %zu bytes of data", path, ncap);
                goto done;
            }
            data = nd;
            cap = ncap;
        }
        if (ps_gz_read_full(gz, data + have, cap - have, &got, &zmsg) < 0) {
            st = ps_err_set(err, PS_ERR_FORMAT,
                            "%s: read error%s after %zu of %zu data bytes (corrupt or truncated?): %s",
                            path, kind, have + got, x.bytes, ps_gz_strip_path(path, zmsg));
            goto done;
        }
        have += got;
        if (have < cap) break; /* end of file */
    }
    if (have < x.bytes) {
        char ds[64];
        dims_str(&x, ds, sizeof ds);
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: truncated IDX data%s: dimensions %s need %zu bytes, got %zu",
                        path, kind, ds, x.bytes, have);
        goto done;
    }

    /* Anything after the declared data means the header is wrong. Count
     * it only so far: a gzip'ed file may inflate to 1032 times its size,
     * and reading gigabytes of zeros only to count them would stall the
     * refusal. */
    size_t trailing = 0;
    while (trailing <= IDX_TRAILING_COUNTED) {
        unsigned char scratch[65536];
        if (ps_gz_read_full(gz, scratch, sizeof scratch, &got, &zmsg) < 0) {
            st = ps_err_set(err, PS_ERR_FORMAT, "%s: read error%s after the data: %s",
                            path, kind, ps_gz_strip_path(path, zmsg));
            goto done;
        }
        trailing += got;
        if (got < sizeof scratch) break;
    }
    if (trailing) {
        char ds[64], n[48];
        dims_str(&x, ds, sizeof ds);
        if (trailing > IDX_TRAILING_COUNTED) snprintf(n, sizeof n, "more than %d MiB of", IDX_TRAILING_COUNTED >> 20);
        else snprintf(n, sizeof n, "%zu", trailing);
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: %s trailing bytes after the %zu data bytes that dimensions %s declare",
                        path, n, x.bytes, ds);
        goto done;
    }

    /* zlib stopped at the first bytes after a member that are not another
     * member: refuse them as gzip -d warns of them (gzfile.h). */
    if (gzipped && (st = ps_gz_check_tail(path, err))) goto done;

    /* IDX data is big-endian: to host order (a no-op for bytes). */
    if (x.esize > 1) {
        const uint16_t probe = 1;
        if (*(const uint8_t *)&probe)
            for (size_t i = 0; i < x.size; i++)
                for (size_t a = i * x.esize, b = a + x.esize - 1; a < b; a++, b--) {
                    uint8_t t = data[a];
                    data[a] = data[b];
                    data[b] = t;
                }
    }
    x.data = data;
    data = NULL;
    *out = x;
done:
    free(data);
    gzclose(gz);
    return st;
}

/* A regular file as it is; a pipe, FIFO or device (a FIFO without a writer
 * would block in fopen forever) read whole into memory first, as
 * ps_data_load reads them (stream.h). */
typedef struct idx_args {
    int any;
    size_t max_bytes;
    ps_idx *out;
} idx_args;

static ps_status idx_load_cb(const char *path, void *arg, ps_err *err) {
    idx_args *a = arg;
    return idx_load(path, a->any, a->max_bytes, a->out, err);
}

static ps_status idx_load_path(const char *path, int any, size_t max_bytes, int wait_ms, ps_idx *out, ps_err *err) {
    memset(out, 0, sizeof *out);
    idx_args a = {any, max_bytes, out};
    return ps_stream_load(path, max_bytes + PS_DATA_STREAM_SLACK, wait_ms, idx_load_cb, &a, err);
}

ps_status ps_idx_load(const char *path, ps_idx *out, ps_err *err) {
    return idx_load_path(path, 0, PS_IDX_MAX_BYTES, PS_DATA_STREAM_WAIT_MS, out, err);
}

ps_status ps_idx_load_wait(const char *path, int wait_ms, ps_idx *out, ps_err *err) {
    return idx_load_path(path, 0, PS_IDX_MAX_BYTES, wait_ms, out, err);
}

ps_status ps_idx_load_any(const char *path, size_t max_bytes, ps_idx *out, ps_err *err) {
    return idx_load_path(path, 1, max_bytes < PS_IDX_MAX_BYTES ? max_bytes : PS_IDX_MAX_BYTES, PS_DATA_STREAM_WAIT_MS,
                         out, err);
}

void ps_idx_free(ps_idx *idx) {
    if (!idx) return;
    free(idx->data);
    memset(idx, 0, sizeof *idx);
}
