/* npy.c - numpy .npy files and .npz archives (npy.h). */
#include "npy.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "gzfile.h"
#include "zip.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

#define NPY_MAX_HEADER 65536 /* numpy itself refuses headers over 10000 bytes by default */

/* numpy's descr type codes (after the byte-order character). */
static const struct { const char *code; int dtype; } g_codes[] = {
    {"b1", PS_ARRAY_BOOL}, {"u1", PS_ARRAY_U8},  {"i1", PS_ARRAY_I8},  {"u2", PS_ARRAY_U16},
    {"i2", PS_ARRAY_I16},  {"u4", PS_ARRAY_U32}, {"i4", PS_ARRAY_I32}, {"u8", PS_ARRAY_U64},
    {"i8", PS_ARRAY_I64},  {"f4", PS_ARRAY_F32}, {"f8", PS_ARRAY_F64},
};
#define N_CODES (sizeof g_codes / sizeof g_codes[0])

/* What a parsed header says. */
typedef struct npy_header {
    int dtype;
    int swap;        /* big-endian data */
    int fortran;
    int ndim;
    int64_t dims[PS_ARRAY_MAX_DIMS];
} npy_header;

typedef struct hp {
    const char *s, *end, *start, *what;
    ps_err *err;
} hp;

static ps_status hfail(hp *p, const char *msg) {
    return ps_err_set(p->err, PS_ERR_FORMAT, "%s: malformed .npy header: %s (at character %d of the header)", p->what,
                      msg, (int)(p->s - p->start));
}

static void skip_ws(hp *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++;
}

static int eat(hp *p, char c) {
    skip_ws(p);
    if (p->s < p->end && *p->s == c) { p->s++; return 1; }
    return 0;
}

/* A Python string literal, '...' or "...", without escapes, into buf. */
static ps_status str_lit(hp *p, char *buf, size_t len) {
    skip_ws(p);
    if (p->s >= p->end || (*p->s != '\'' && *p->s != '"')) return hfail(p, "expected a quoted string");
    char q = *p->s++;
    size_t n = 0;
    while (p->s < p->end && *p->s != q) {
        if (*p->s == '\\') return hfail(p, "escapes in strings are not supported");
        if (*p->s == '\0') return hfail(p, "a NUL byte in a string"); /* '<f4\0' is not '<f4' */
        if (n + 1 < len) buf[n++] = *p->s;
        p->s++;
    }
    if (p->s >= p->end) return hfail(p, "unterminated string");
    p->s++;
    buf[n] = 0;
    return PS_OK;
}

static ps_status parse_descr(hp *p, npy_header *h) {
    skip_ws(p);
    if (p->s < p->end && *p->s == '[')
        return ps_err_set(p->err, PS_ERR_UNIMPLEMENTED, "%s: structured (record) dtypes are not supported; save a "
                          "plain numeric array", p->what);
    char d[32];
    ps_status st = str_lit(p, d, sizeof d);
    if (st) return st;
    const char *code = d;
    if (*code == '<' || *code == '>' || *code == '|' || *code == '=') code++;
    for (size_t i = 0; i < N_CODES; i++)
        if (!strcmp(code, g_codes[i].code)) {
            h->dtype = g_codes[i].dtype;
            h->swap = d[0] == '>' && ps_array_dtype_size(h->dtype) > 1;
            return PS_OK;
        }
    return ps_err_set(p->err, PS_ERR_UNIMPLEMENTED, "%s: dtype '%s' is not supported (supported: bool, uint8, int8, "
                      "uint16, int16, uint32, int32, uint64, int64, float32, float64)", p->what, d);
}

static ps_status parse_bool(hp *p, int *v) {
    skip_ws(p);
    if (p->end - p->s >= 4 && !memcmp(p->s, "True", 4)) { p->s += 4; *v = 1; return PS_OK; }
    if (p->end - p->s >= 5 && !memcmp(p->s, "False", 5)) { p->s += 5; *v = 0; return PS_OK; }
    return hfail(p, "fortran_order must be True or False");
}

static ps_status parse_shape(hp *p, npy_header *h) {
    if (!eat(p, '(')) return hfail(p, "shape must be a tuple");
    h->ndim = 0;
    for (;;) {
        if (eat(p, ')')) return PS_OK;
        skip_ws(p);
        if (p->s >= p->end || *p->s < '0' || *p->s > '9') return hfail(p, "shape entries must be non-negative integers");
        int64_t v = 0;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
            if (v > (INT64_MAX - 9) / 10) return hfail(p, "shape entry too large");
            v = v * 10 + (*p->s++ - '0');
        }
        if (p->s < p->end && *p->s == 'L') p->s++; /* Python 2 longs */
        if (h->ndim == PS_ARRAY_MAX_DIMS)
            return ps_err_set(p->err, PS_ERR_UNIMPLEMENTED, "%s: more than %d dimensions", p->what, PS_ARRAY_MAX_DIMS);
        h->dims[h->ndim++] = v;
        if (eat(p, ',')) continue;
        if (eat(p, ')')) return PS_OK;
        return hfail(p, "expected ',' or ')' in shape");
    }
}

static ps_status parse_header(const char *s, size_t len, const char *what, npy_header *h, ps_err *err) {
    hp p = {s, s + len, s, what, err};
    int have_d = 0, have_f = 0, have_s = 0;
    ps_status st;
    memset(h, 0, sizeof *h);
    if (!eat(&p, '{')) return hfail(&p, "expected '{'");
    while (!eat(&p, '}')) {
        char key[32];
        if ((st = str_lit(&p, key, sizeof key))) return st;
        if (!eat(&p, ':')) return hfail(&p, "expected ':' after a key");
        if (!strcmp(key, "descr") && !have_d++) st = parse_descr(&p, h);
        else if (!strcmp(key, "fortran_order") && !have_f++) st = parse_bool(&p, &h->fortran);
        else if (!strcmp(key, "shape") && !have_s++) st = parse_shape(&p, h);
        else return ps_err_set(err, PS_ERR_FORMAT, "%s: malformed .npy header: unexpected or repeated key '%s'", what,
                               key);
        if (st) return st;
        if (!eat(&p, ',')) {
            if (!eat(&p, '}')) return hfail(&p, "expected ',' or '}'");
            break;
        }
    }
    skip_ws(&p);
    if (p.s != p.end) return hfail(&p, "bytes after the dict");
    if (!have_d || !have_f || !have_s)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: malformed .npy header: missing '%s'", what,
                          !have_d ? "descr" : !have_f ? "fortran_order" : "shape");
    if (h->fortran && h->ndim > 1)
        return ps_err_set(err, PS_ERR_UNIMPLEMENTED, "%s: the array is stored in Fortran (column-major) order; only C "
                          "order is supported (save np.ascontiguousarray(a) instead)", what);
    return PS_OK;
}

/* The magic and version in the first bytes: header length and where it
 * starts; avail: how many bytes p holds. */
static ps_status prelude(const unsigned char *p, size_t avail, const char *what, size_t *hstart, size_t *hlen,
                         ps_err *err) {
    if (avail < 6 || memcmp(p, "\x93NUMPY", 6))
        return ps_err_set(err, PS_ERR_FORMAT, "%s: not a .npy file (no \\x93NUMPY magic)", what);
    if (avail < 10)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: truncated .npy preamble: %zu of its 10 bytes", what, avail);
    int major = p[6], minor = p[7];
    if (minor != 0 || major < 1 || major > 3) /* numpy writes x.0 only, and reads only 1.0, 2.0 and 3.0 */
        return ps_err_set(err, PS_ERR_UNIMPLEMENTED, "%s: .npy format version %d.%d is not supported (1.0, 2.0 and "
                          "3.0 are)", what, major, minor);
    if (major == 1) {
        *hstart = 10;
        *hlen = (size_t)p[8] | (size_t)p[9] << 8;
    } else { /* 2.0, and 3.0 (the same with a UTF-8 header, which only structured dtypes' field names need) */
        if (avail < 12) return ps_err_set(err, PS_ERR_FORMAT, "%s: truncated .npy preamble", what);
        *hstart = 12;
        *hlen = (size_t)p[8] | (size_t)p[9] << 8 | (size_t)p[10] << 16 | (size_t)p[11] << 24;
    }
    if (*hlen > NPY_MAX_HEADER)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: .npy header of %zu bytes (over %d: corrupt?)", what, *hlen,
                          NPY_MAX_HEADER);
    return PS_OK;
}

static void fill(ps_array *out, const npy_header *h, void *data, size_t bytes) {
    out->dtype = h->dtype;
    out->ndim = h->ndim;
    memcpy(out->dims, h->dims, sizeof h->dims);
    out->data = data;
    out->bytes = bytes;
    if (h->swap) ps_array_byteswap(data, bytes / ps_array_dtype_size(h->dtype), ps_array_dtype_size(h->dtype));
}

ps_status ps_npy_parse(const void *buf, size_t len, const char *what, size_t max_bytes, ps_array *out, ps_err *err) {
    memset(out, 0, sizeof *out);
    const unsigned char *p = buf;
    size_t hstart, hlen, bytes;
    npy_header h;
    ps_status st = prelude(p, len, what, &hstart, &hlen, err);
    if (st) return st;
    if (len < hstart + hlen) return ps_err_set(err, PS_ERR_FORMAT, "%s: truncated .npy header", what);
    if ((st = parse_header((const char *)p + hstart, hlen, what, &h, err)) ||
        (st = ps_array_check_size(h.dims, h.ndim, ps_array_dtype_size(h.dtype), max_bytes, what, &bytes, err)))
        return st;
    size_t have = len - hstart - hlen;
    char sh[128];
    if (have != bytes)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: %s: shape %s of %s needs %zu data bytes, the file has %zu", what,
                          have < bytes ? "truncated" : "trailing bytes", ps_array_shape_str(h.dims, h.ndim, sh, sizeof sh),
                          ps_array_dtype_name(h.dtype), bytes, have);
    void *data = malloc(bytes ? bytes : 1);
    if (!data) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for %zu bytes", what, bytes);
    memcpy(data, p + hstart + hlen, bytes);
    fill(out, &h, data, bytes);
    return PS_OK;
}

ps_status ps_npy_load(const char *path, size_t max_bytes, ps_array *out, ps_err *err) {
    memset(out, 0, sizeof *out);
    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s", path,
                          errno ? strerror(errno) : "out of memory");
    const char *zmsg; /* zlib's words: unused, the messages say "corrupt gzip?" */
    unsigned char pre[12];
    char *hdr = NULL;
    void *data = NULL;
    size_t got, hstart, hlen, bytes;
    npy_header h;
    ps_status st;
    if (ps_gz_read_full(gz, pre, 10, &got, &zmsg)) {
        st = ps_err_set(err, PS_ERR_IO, "%s: read error (corrupt gzip?)", path);
        goto done;
    }
    if (got == 10 && (pre[6] == 2 || pre[6] == 3)) { /* versions 2 and 3: a 4-byte header length */
        size_t more;
        if (ps_gz_read_full(gz, pre + 10, 2, &more, &zmsg)) {
            st = ps_err_set(err, PS_ERR_IO, "%s: read error", path);
            goto done;
        }
        got += more;
    }
    if ((st = prelude(pre, got, path, &hstart, &hlen, err))) goto done;
    if (!(hdr = malloc(hlen + 1))) { st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path); goto done; }
    if (ps_gz_read_full(gz, hdr, hlen, &got, &zmsg) || got < hlen) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: truncated .npy header (%zu of %zu bytes)", path, got, hlen);
        goto done;
    }
    if ((st = parse_header(hdr, hlen, path, &h, err)) ||
        (st = ps_array_check_size(h.dims, h.ndim, ps_array_dtype_size(h.dtype), max_bytes, path, &bytes, err)))
        goto done;
    /* Grow the buffer as data arrives: a header that declares more than the
     * file holds costs only what the file holds. */
    char sh[128], one;
    size_t cap = 0;
    got = 0;
    while (got < bytes) {
        size_t ncap = cap ? cap * 2 : (size_t)1 << 20, n;
        if (ncap > bytes) ncap = bytes;
        void *nd = realloc(data, ncap);
        if (!nd) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for %zu bytes", path, ncap);
            goto done;
        }
        data = nd;
        cap = ncap;
        if (ps_gz_read_full(gz, (char *)data + got, cap - got, &n, &zmsg)) {
            st = ps_err_set(err, PS_ERR_IO, "%s: read error (corrupt gzip?)", path);
            goto done;
        }
        got += n;
        if (got < cap) break;
    }
    if (!data && !(data = malloc(1))) {
        st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
        goto done;
    }
    if (got < bytes) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: truncated: shape %s of %s needs %zu data bytes, the file has %zu", path,
                        ps_array_shape_str(h.dims, h.ndim, sh, sizeof sh), ps_array_dtype_name(h.dtype), bytes, got);
        goto done;
    }
    if (ps_gz_read_full(gz, &one, 1, &got, &zmsg) || got) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: trailing bytes after the %zu data bytes shape %s of %s needs", path,
                        bytes, ps_array_shape_str(h.dims, h.ndim, sh, sizeof sh), ps_array_dtype_name(h.dtype));
        goto done;
    }
    if (!gzdirect(gz) && (st = ps_gz_check_tail(path, err))) goto done; /* junk after the gzip data (gzfile.h) */
    fill(out, &h, data, bytes);
    data = NULL;
done:
    free(hdr);
    free(data);
    gzclose(gz);
    return st;
}

ps_status ps_npz_load(const char *path, const char *name, size_t max_bytes, ps_array *out, ps_err *err) {
    memset(out, 0, sizeof *out);
    ps_zip *z;
    ps_status st = ps_zip_open(path, max_bytes + NPY_MAX_HEADER + 1024, &z, err);
    if (st) return st;
    char member[512], what[700], names[256];
    if (ps_zip_count(z) == 0) {
        st = ps_err_set(err, PS_ERR_NOT_FOUND, "%s: an archive without arrays (np.savez of nothing?)", path);
        ps_zip_free(z);
        return st;
    }
    if (!name) {
        if (ps_zip_count(z) != 1) {
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s holds %d arrays (%s): name one as %s:NAME", path,
                            ps_zip_count(z), ps_zip_names(z, names, sizeof names), path);
            ps_zip_free(z);
            return st;
        }
        snprintf(member, sizeof member, "%s", ps_zip_name(z, 0));
    } else {
        size_t n = strlen(name);
        snprintf(member, sizeof member, "%s%s", name, n >= 4 && !strcmp(name + n - 4, ".npy") ? "" : ".npy");
    }
    void *buf = NULL;
    size_t len = 0;
    st = ps_zip_extract(z, member, max_bytes + NPY_MAX_HEADER + 1024, &buf, &len, err);
    if (st == PS_ERR_NOT_FOUND)
        st = ps_err_set(err, PS_ERR_NOT_FOUND, "%s: no array '%s' (arrays: %s)", path, name ? name : member,
                        ps_zip_names(z, names, sizeof names));
    if (!st) {
        snprintf(what, sizeof what, "%s:%s", path, member);
        st = ps_npy_parse(buf, len, what, max_bytes, out, err);
    }
    free(buf);
    ps_zip_free(z);
    return st;
}
