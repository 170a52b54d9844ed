/* safetensors.c - see safetensors.h for the format and the contract. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dims.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian; this host is not");

/* The reference implementation refuses headers above 100 MB too. */
#define ST_HEADER_MAX 100000000ull
#define ST_ALIGN 64

struct ps_st_file {
    ps_st_tensor *tensors;  /* n, sorted by data offset */
    void **owned;           /* n: a private aligned copy of tensor i, or NULL */
    size_t n;
    char **meta_keys;       /* nmeta */
    char **meta_vals;       /* nmeta */
    size_t nmeta;
    void *data;             /* the whole data buffer */
};

/* The dtypes, one row each: the header's name and the element size. */
static const struct { int dtype; const char *name; size_t size; } g_st_dtypes[] = {
    {PS_ST_F32, "F32", 4}, {PS_ST_F64, "F64", 8}, {PS_ST_I64, "I64", 8}, {PS_ST_I32, "I32", 4},
    {PS_ST_I16, "I16", 2}, {PS_ST_I8, "I8", 1},   {PS_ST_U8, "U8", 1},   {PS_ST_U16, "U16", 2},
    {PS_ST_U32, "U32", 4}, {PS_ST_U64, "U64", 8}, {PS_ST_BOOL, "BOOL", 1},
};
#define N_ST_DTYPES (sizeof g_st_dtypes / sizeof g_st_dtypes[0])

const char *ps_st_dtype_name(int dtype) {
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (g_st_dtypes[i].dtype == dtype) return g_st_dtypes[i].name;
    return "?";
}

size_t ps_st_dtype_size(int dtype) {
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (g_st_dtypes[i].dtype == dtype) return g_st_dtypes[i].size;
    return 0;
}

int64_t ps_st_numel(const ps_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->dims[i];
    return n;
}

/* product(dims) * esize into *out; 0 on overflow. */
static int st_nbytes(const int64_t *dims, int ndim, size_t esize, uint64_t *out) {
    uint64_t n = esize;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)dims[i];
        if (dims[i] < 0) return 0;
        if (d != 0 && n > UINT64_MAX / d) return 0;
        n *= d;
    }
    *out = n;
    return 1;
}

/* "[2, 3, 4]" into buf. */
/* Length of the valid UTF-8 sequence starting at s (at most n bytes), or 0. */
static size_t st_utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; min = 0x10000; }
    else return 0;
    if (len > n) return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

static int st_utf8_valid(const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t l = st_utf8_len((const unsigned char *)s + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

/* ---------------------------------------------------------------------------
 * Header JSON parser: strict, for exactly the safetensors header shape.
 */

typedef struct st_parser {
    const char *s;        /* header bytes */
    size_t n, i;          /* length, cursor */
    const char *path;
    const char *tensor;   /* name of the tensor being parsed, for messages */
    ps_err *err;
} st_parser;

static ps_status st_fail(st_parser *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static ps_status st_fail(st_parser *p, const char *fmt, ...) {
    char what[PS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (p->tensor)
        return ps_err_set(p->err, PS_ERR_FORMAT, "%s: tensor '%s': header JSON at byte %zu: %s",
                          p->path, p->tensor, p->i, what);
    return ps_err_set(p->err, PS_ERR_FORMAT, "%s: header JSON at byte %zu: %s",
                      p->path, p->i, what);
}

static void st_ws(st_parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' ||
                           p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

/* Next non-blank character without consuming it; 0 at the end. */
static char st_peek(st_parser *p) {
    st_ws(p);
    return p->i < p->n ? p->s[p->i] : 0;
}

static ps_status st_expect(st_parser *p, char c, const char *context) {
    char got = st_peek(p);
    if (got != c) {
        if (!got) return st_fail(p, "expected '%c' %s, got end of header", c, context);
        return st_fail(p, "expected '%c' %s, got '%c'", c, context, got);
    }
    p->i++;
    return PS_OK;
}

static int st_hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

/* A JSON string into a new NUL-terminated UTF-8 buffer (*out, caller frees). */
static ps_status st_string(st_parser *p, char **out) {
    ps_status st = st_expect(p, '"', "to start a string");
    if (st) return st;
    /* The decoded string is never longer than the raw one. */
    size_t start = p->i, cap = 1;
    while (start + cap - 1 < p->n && p->s[start + cap - 1] != '"') cap += p->s[start + cap - 1] == '\\' ? 2 : 1;
    char *buf = malloc(cap);
    if (!buf) return ps_err_set(p->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", p->path);
    size_t k = 0;
    for (;;) {
        if (p->i >= p->n) { free(buf); return st_fail(p, "unterminated string"); }
        unsigned char c = (unsigned char)p->s[p->i];
        if (c == '"') { p->i++; break; }
        if (c < 0x20) { free(buf); return st_fail(p, "control character 0x%02x in string", c); }
        if (c != '\\') {
            size_t l = st_utf8_len((const unsigned char *)p->s + p->i, p->n - p->i);
            if (!l) { free(buf); return st_fail(p, "invalid UTF-8 in string"); }
            memcpy(buf + k, p->s + p->i, l);
            k += l;
            p->i += l;
            continue;
        }
        if (p->i + 1 >= p->n) { free(buf); return st_fail(p, "unterminated string"); }
        char e = p->s[p->i + 1];
        p->i += 2;
        switch (e) {
        case '"': buf[k++] = '"'; continue;
        case '\\': buf[k++] = '\\'; continue;
        case '/': buf[k++] = '/'; continue;
        case 'b': buf[k++] = '\b'; continue;
        case 'f': buf[k++] = '\f'; continue;
        case 'n': buf[k++] = '\n'; continue;
        case 'r': buf[k++] = '\r'; continue;
        case 't': buf[k++] = '\t'; continue;
        case 'u': break;
        default: free(buf); p->i -= 2; return st_fail(p, "invalid escape '\\%c' in string", e);
        }
        unsigned cp, lo;
        if (p->i + 4 > p->n || !st_hex4(p->s + p->i, &cp)) {
            free(buf); return st_fail(p, "invalid \\u escape in string");
        }
        p->i += 4;
        if (cp >= 0xdc00 && cp <= 0xdfff) { free(buf); return st_fail(p, "unpaired surrogate in string"); }
        if (cp >= 0xd800 && cp <= 0xdbff) {
            if (p->i + 6 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
                !st_hex4(p->s + p->i + 2, &lo) || lo < 0xdc00 || lo > 0xdfff) {
                free(buf); return st_fail(p, "unpaired surrogate in string");
            }
            p->i += 6;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        if (cp == 0) { free(buf); return st_fail(p, "NUL character (\\u0000) in string"); }
        /* 6 raw bytes (\uXXXX) always have room for <= 3 encoded ones, and a
         * 12-byte surrogate pair for 4. */
        if (cp < 0x80) buf[k++] = (char)cp;
        else if (cp < 0x800) { buf[k++] = (char)(0xc0 | (cp >> 6)); buf[k++] = (char)(0x80 | (cp & 0x3f)); }
        else if (cp < 0x10000) {
            buf[k++] = (char)(0xe0 | (cp >> 12)); buf[k++] = (char)(0x80 | ((cp >> 6) & 0x3f));
            buf[k++] = (char)(0x80 | (cp & 0x3f));
        } else {
            buf[k++] = (char)(0xf0 | (cp >> 18)); buf[k++] = (char)(0x80 | ((cp >> 12) & 0x3f));
            buf[k++] = (char)(0x80 | ((cp >> 6) & 0x3f)); buf[k++] = (char)(0x80 | (cp & 0x3f));
        }
    }
    buf[k] = '\0';
    *out = buf;
    return PS_OK;
}

/* A non-negative JSON integer (no sign, fraction or exponent) below 2^63. */
static ps_status st_uint(st_parser *p, const char *what, uint64_t *out) {
    char c = st_peek(p);
    if (c < '0' || c > '9') {
        if (!c) return st_fail(p, "%s: expected a non-negative integer, got end of header", what);
        return st_fail(p, "%s: expected a non-negative integer, got '%c'", what, c);
    }
    size_t start = p->i;
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        unsigned d = (unsigned)(p->s[p->i] - '0');
        if (v > ((uint64_t)INT64_MAX - d) / 10) { p->i = start; return st_fail(p, "%s: integer too large", what); }
        v = v * 10 + d;
        p->i++;
    }
    if (p->i - start > 1 && p->s[start] == '0') { p->i = start; return st_fail(p, "%s: leading zero in integer", what); }
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i = start;
        return st_fail(p, "%s: expected a non-negative integer, got a fraction or exponent", what);
    }
    *out = v;
    return PS_OK;
}

/* [int, int, ...] with at most max entries. */
static ps_status st_uint_array(st_parser *p, const char *what, uint64_t *vals, int max, int *count) {
    ps_status st = st_expect(p, '[', what);
    if (st) return st;
    *count = 0;
    if (st_peek(p) == ']') { p->i++; return PS_OK; }
    for (;;) {
        if (*count == max) return st_fail(p, "%s: more than %d entries", what, max);
        st = st_uint(p, what, &vals[*count]);
        if (st) return st;
        (*count)++;
        char c = st_peek(p);
        if (c == ']') { p->i++; return PS_OK; }
        if (c != ',') return st_fail(p, "%s: expected ',' or ']' in array", what);
        p->i++;
    }
}

static ps_status st_parse_tensor(st_parser *p, ps_st_tensor *t, uint64_t off[2]) {
    int have_dtype = 0, have_shape = 0, have_off = 0;
    ps_status st = st_expect(p, '{', "to start the tensor entry");
    if (st) return st;
    if (st_peek(p) == '}') return st_fail(p, "empty tensor entry (needs dtype, shape, data_offsets)");
    for (;;) {
        char *key = NULL;
        if ((st = st_string(p, &key))) return st;
        if ((st = st_expect(p, ':', "after a key"))) { free(key); return st; }
        if (!strcmp(key, "dtype")) {
            char *v = NULL;
            if (have_dtype++) { free(key); return st_fail(p, "duplicate key \"dtype\""); }
            if ((st = st_string(p, &v))) { free(key); return st; }
            t->dtype = 0;
            for (size_t i = 0; i < N_ST_DTYPES && !t->dtype; i++)
                if (!strcmp(v, g_st_dtypes[i].name)) t->dtype = g_st_dtypes[i].dtype;
            if (!t->dtype) {
                st = ps_err_set(p->err, PS_ERR_FORMAT,
                                "%s: tensor '%s': unsupported dtype \"%.32s\" (supported: F32, F64, I64, I32, I16, I8, U8, U16, U32, U64, BOOL)",
                                p->path, p->tensor, v);
                free(v); free(key);
                return st;
            }
            free(v);
        } else if (!strcmp(key, "shape")) {
            uint64_t dims[PS_ST_MAX_DIMS];
            if (have_shape++) { free(key); return st_fail(p, "duplicate key \"shape\""); }
            if ((st = st_uint_array(p, "shape", dims, PS_ST_MAX_DIMS, &t->ndim))) { free(key); return st; }
            for (int d = 0; d < t->ndim; d++) t->dims[d] = (int64_t)dims[d];
        } else if (!strcmp(key, "data_offsets")) {
            int cnt;
            if (have_off++) { free(key); return st_fail(p, "duplicate key \"data_offsets\""); }
            if ((st = st_uint_array(p, "data_offsets", off, 2, &cnt))) { free(key); return st; }
            if (cnt != 2) { free(key); return st_fail(p, "data_offsets must have 2 entries, has %d", cnt); }
        } else {
            st = st_fail(p, "unknown key \"%.64s\" (expected dtype, shape, data_offsets)", key);
            free(key);
            return st;
        }
        free(key);
        char c = st_peek(p);
        if (c == '}') { p->i++; break; }
        if (c != ',') return st_fail(p, "expected ',' or '}' in tensor entry");
        p->i++;
    }
    if (!have_dtype) return st_fail(p, "missing \"dtype\"");
    if (!have_shape) return st_fail(p, "missing \"shape\"");
    if (!have_off) return st_fail(p, "missing \"data_offsets\"");
    return PS_OK;
}

static int cmp_strp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name (in sorted order) that occurs twice among n records of
 * `stride` bytes whose name is at byte `off` (indirect: a char * there,
 * else the characters themselves), in O(n log n): a header of 60,000
 * tensors must not take a quadratic pass. *dup = NULL if none; returns -1
 * when out of memory. */
static int first_duplicate(const void *base, size_t n, size_t stride, size_t off, int indirect,
                           const char **dup) {
    *dup = NULL;
    if (n < 2) return 0;
    const char **names = malloc(n * sizeof *names);
    if (!names) return -1;
    for (size_t i = 0; i < n; i++) {
        const char *rec = (const char *)base + i * stride;
        names[i] = indirect ? *(const char *const *)(rec + off) : rec + off;
    }
    qsort(names, n, sizeof *names, cmp_strp);
    for (size_t i = 1; i < n && !*dup; i++)
        if (!strcmp(names[i - 1], names[i])) *dup = names[i];
    free(names);
    return 0;
}

static ps_status st_parse_metadata(st_parser *p, ps_st_file *f) {
    ps_status st = st_expect(p, '{', "to start __metadata__");
    if (st) return st;
    if (st_peek(p) == '}') { p->i++; return PS_OK; }
    for (;;) {
        char *k = NULL, *v = NULL;
        if ((st = st_string(p, &k))) return st;
        if ((st = st_expect(p, ':', "after a __metadata__ key"))) { free(k); return st; }
        if (st_peek(p) != '"') {
            st = st_fail(p, "__metadata__ value of \"%.64s\" must be a string", k);
            free(k);
            return st;
        }
        if ((st = st_string(p, &v))) { free(k); return st; }
        char **nk = realloc(f->meta_keys, (f->nmeta + 1) * sizeof *nk);
        if (nk) f->meta_keys = nk;
        char **nv = realloc(f->meta_vals, (f->nmeta + 1) * sizeof *nv);
        if (nv) f->meta_vals = nv;
        if (!nk || !nv) {
            free(k); free(v);
            return ps_err_set(p->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", p->path);
        }
        f->meta_keys[f->nmeta] = k;
        f->meta_vals[f->nmeta] = v;
        f->nmeta++;
        char c = st_peek(p);
        if (c == '}') {
            p->i++;
            const char *dup = NULL;
            if (first_duplicate(f->meta_keys, f->nmeta, sizeof(char *), 0, 1, &dup))
                return ps_err_set(p->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", p->path);
            if (dup) return st_fail(p, "duplicate __metadata__ key \"%.64s\"", dup);
            return PS_OK;
        }
        if (c != ',') return st_fail(p, "expected ',' or '}' in __metadata__");
        p->i++;
    }
}

/* Fills f->tensors/n (unsorted) and offs (2 per tensor, *offs malloc'd). */
static ps_status st_parse_header(st_parser *p, ps_st_file *f, uint64_t **offs) {
    int have_meta = 0;
    size_t cap = 0;
    ps_status st = st_expect(p, '{', "at the start of the header");
    if (st) return st;
    if (st_peek(p) == '}') p->i++;
    else for (;;) {
        char *key = NULL;
        if ((st = st_string(p, &key))) return st;
        if ((st = st_expect(p, ':', "after a key"))) { free(key); return st; }
        if (!strcmp(key, "__metadata__")) {
            free(key);
            if (have_meta++) return st_fail(p, "duplicate \"__metadata__\"");
            if ((st = st_parse_metadata(p, f))) return st;
        } else {
            size_t len = strlen(key);
            if (len == 0 || len >= PS_ST_NAME_MAX) {
                st = st_fail(p, "tensor name \"%.64s%s\" is %zu bytes (must be 1..%d)",
                             key, len > 64 ? "..." : "", len, PS_ST_NAME_MAX - 1);
                free(key);
                return st;
            }
            if (f->n == cap) {
                cap = cap ? 2 * cap : 16;
                ps_st_tensor *nt = realloc(f->tensors, cap * sizeof *nt);
                if (nt) f->tensors = nt;
                uint64_t *no = realloc(*offs, cap * 2 * sizeof *no);
                if (no) *offs = no;
                if (!nt || !no) {
                    free(key);
                    return ps_err_set(p->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", p->path);
                }
            }
            ps_st_tensor *t = &f->tensors[f->n];
            memset(t, 0, sizeof *t);
            memcpy(t->name, key, len + 1);
            free(key);
            f->n++;
            p->tensor = t->name;
            if ((st = st_parse_tensor(p, t, *offs + 2 * (f->n - 1)))) return st;
            p->tensor = NULL;
        }
        char c = st_peek(p);
        if (c == '}') { p->i++; break; }
        if (c != ',') return st_fail(p, "expected ',' or '}' after an entry");
        p->i++;
    }
    if (st_peek(p)) return st_fail(p, "unexpected '%c' after the header object", p->s[p->i]);
    const char *dup = NULL;
    if (first_duplicate(f->tensors, f->n, sizeof *f->tensors, offsetof(ps_st_tensor, name), 0, &dup))
        return ps_err_set(p->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", p->path);
    if (dup) return st_fail(p, "duplicate tensor name '%s'", dup);
    return PS_OK;
}

/* ---------------------------------------------------------------------------
 * Reader
 */

static ps_status st_read_full(int fd, void *buf, size_t n, const char *path, uint64_t at, ps_err *err) {
    char *b = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = read(fd, b + done, n - done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return ps_err_set(err, PS_ERR_IO, "%s: read failed at byte %" PRIu64 ": %s",
                              path, at + done, strerror(errno));
        if (r == 0)
            return ps_err_set(err, PS_ERR_FORMAT, "%s: file truncated: ends at byte %" PRIu64
                              " while reading %zu bytes from byte %" PRIu64,
                              path, at + done, n, at);
        done += (size_t)r;
    }
    return PS_OK;
}

typedef struct st_order { uint64_t begin, end; size_t idx; } st_order;

static int st_order_cmp(const void *a, const void *b) {
    const st_order *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Checks sizes and offsets against a data buffer of dsize bytes starting at
 * file byte data_start; *order_out gets the tensors sorted by offset. */
static ps_status st_validate(ps_st_file *f, const uint64_t *offs, uint64_t data_start,
                             uint64_t dsize, const char *path, st_order **order_out, ps_err *err) {
    char sh[160];
    st_order *ord = malloc((f->n ? f->n : 1) * sizeof *ord);
    if (!ord) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    for (size_t i = 0; i < f->n; i++) {
        ps_st_tensor *t = &f->tensors[i];
        uint64_t b = offs[2 * i], e = offs[2 * i + 1], need;
        if (e < b) {
            free(ord);
            return ps_err_set(err, PS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                              "] end before they begin", path, t->name, b, e);
        }
        if (!st_nbytes(t->dims, t->ndim, ps_st_dtype_size(t->dtype), &need)) {
            free(ord);
            return ps_err_set(err, PS_ERR_FORMAT, "%s: tensor '%s': shape %s overflows", path, t->name,
                              ps_dims_format_as(sh, sizeof sh, t->dims, t->ndim, "[", ", ", "]"));
        }
        if (need != e - b) {
            free(ord);
            return ps_err_set(err, PS_ERR_FORMAT, "%s: tensor '%s': shape %s of %s needs %" PRIu64
                              " bytes but data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64 " bytes",
                              path, t->name, ps_dims_format_as(sh, sizeof sh, t->dims, t->ndim, "[", ", ", "]"),
                              ps_st_dtype_name(t->dtype), need, b, e, e - b);
        }
        t->bytes = (size_t)need;
        ord[i] = (st_order){ b, e, i };
    }
    qsort(ord, f->n, sizeof *ord, st_order_cmp);
    uint64_t pos = 0;
    for (size_t k = 0; k < f->n; k++) {
        const ps_st_tensor *t = &f->tensors[ord[k].idx];
        if (ord[k].begin < pos) {
            const ps_st_tensor *prev = &f->tensors[ord[k - 1].idx];
            ps_err_set(err, PS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] overlap tensor '%s' [%" PRIu64 ", %" PRIu64 "]", path, t->name,
                       ord[k].begin, ord[k].end, prev->name, ord[k - 1].begin, ord[k - 1].end);
            free(ord);
            return PS_ERR_FORMAT;
        }
        if (ord[k].end > dsize) {
            ps_err_set(err, PS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] out of range: the data buffer holds only %" PRIu64 " bytes (the file is %"
                       PRIu64 " bytes, this tensor needs %" PRIu64 "; truncated?)", path, t->name,
                       ord[k].begin, ord[k].end, dsize, data_start + dsize, data_start + ord[k].end);
            free(ord);
            return PS_ERR_FORMAT;
        }
        if (ord[k].begin > pos) {
            ps_err_set(err, PS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] leave a gap of %" PRIu64 " bytes after byte %" PRIu64 " of the data buffer",
                       path, t->name, ord[k].begin, ord[k].end, ord[k].begin - pos, pos);
            free(ord);
            return PS_ERR_FORMAT;
        }
        pos = ord[k].end;
    }
    if (pos < dsize) {
        free(ord);
        return ps_err_set(err, PS_ERR_FORMAT, "%s: %" PRIu64 " trailing bytes after the last tensor"
                          " (data buffer is %" PRIu64 " bytes, tensors cover %" PRIu64 ")",
                          path, dsize - pos, dsize, pos);
    }
    *order_out = ord;
    return PS_OK;
}

ps_st_file *ps_st_read(const char *path, ps_err *err) {
    ps_st_file *f = calloc(1, sizeof *f);
    char *hdr = NULL;
    uint64_t *offs = NULL;
    st_order *ord = NULL;
    ps_st_tensor *sorted = NULL;
    ps_status st = PS_OK;
    int fd = -1;
    if (!f) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path); return NULL; }

    /* O_NONBLOCK: a FIFO (or device) named like the file must not block
     * psd here; anything but a regular file is refused below. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        st = ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s",
                        path, strerror(errno));
        goto out;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) { st = ps_err_set(err, PS_ERR_IO, "%s: stat: %s", path, strerror(errno)); goto out; }
    if (!S_ISREG(sb.st_mode)) { st = ps_err_set(err, PS_ERR_IO, "%s: not a regular file", path); goto out; }
    uint64_t fsize = (uint64_t)sb.st_size;
    if (fsize < 8) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: file is %" PRIu64 " bytes, too short for the 8-byte"
                        " header length (truncated?)", path, fsize);
        goto out;
    }
    unsigned char lenb[8];
    if ((st = st_read_full(fd, lenb, 8, path, 0, err))) goto out;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenb[i];
    if (hlen < 2) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: header length %" PRIu64 " is too small for a JSON object",
                        path, hlen);
        goto out;
    }
    if (hlen > fsize - 8) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: header length %" PRIu64 " does not fit the file of %"
                        PRIu64 " bytes (at most %" PRIu64 "; truncated or not a safetensors file)",
                        path, hlen, fsize, fsize - 8);
        goto out;
    }
    if (hlen > ST_HEADER_MAX) {
        st = ps_err_set(err, PS_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the limit of %llu bytes",
                        path, hlen, ST_HEADER_MAX);
        goto out;
    }
    hdr = malloc((size_t)hlen);
    if (!hdr) { st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path); goto out; }
    if ((st = st_read_full(fd, hdr, (size_t)hlen, path, 8, err))) goto out;

    st_parser p = { hdr, (size_t)hlen, 0, path, NULL, err };
    if ((st = st_parse_header(&p, f, &offs))) goto out;

    uint64_t dsize = fsize - 8 - hlen;
    if ((st = st_validate(f, offs, 8 + hlen, dsize, path, &ord, err))) goto out;

    if (dsize > SIZE_MAX - ST_ALIGN) { st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: too large", path); goto out; }
    if (dsize) {
        f->data = aligned_alloc(ST_ALIGN, ((size_t)dsize + ST_ALIGN - 1) / ST_ALIGN * ST_ALIGN);
        if (!f->data) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for %" PRIu64 " bytes of data",
                            path, dsize);
            goto out;
        }
        if ((st = st_read_full(fd, f->data, (size_t)dsize, path, 8 + hlen, err))) goto out;
    }

    /* Put the tensors in file order and point them at their data. */
    sorted = malloc((f->n ? f->n : 1) * sizeof *sorted);
    f->owned = calloc(f->n ? f->n : 1, sizeof *f->owned);
    if (!sorted || !f->owned) { st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path); goto out; }
    for (size_t k = 0; k < f->n; k++) {
        ps_st_tensor *t = &sorted[k];
        *t = f->tensors[ord[k].idx];
        char *src = t->bytes ? (char *)f->data + ord[k].begin : NULL;  /* no data at all: f->data is NULL */
        t->data = src;
        if (t->bytes && ord[k].begin % ps_st_dtype_size(t->dtype) != 0) {
            /* Valid but misaligned for its dtype: keep an aligned copy. */
            f->owned[k] = aligned_alloc(ST_ALIGN, (t->bytes + ST_ALIGN - 1) / ST_ALIGN * ST_ALIGN);
            if (!f->owned[k]) { st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path); goto out; }
            memcpy(f->owned[k], src, t->bytes);
            t->data = f->owned[k];
        }
    }
    free(f->tensors);
    f->tensors = sorted;
    sorted = NULL;

out:
    if (fd >= 0) close(fd);
    free(hdr);
    free(offs);
    free(ord);
    free(sorted);
    if (st != PS_OK) { ps_st_free(f); return NULL; }
    return f;
}

size_t ps_st_count(const ps_st_file *f) { return f->n; }

const ps_st_tensor *ps_st_get(const ps_st_file *f, size_t i) {
    return i < f->n ? &f->tensors[i] : NULL;
}

const ps_st_tensor *ps_st_find(const ps_st_file *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

const char *ps_st_metadata(const ps_st_file *f, const char *key) {
    for (size_t i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta_keys[i], key)) return f->meta_vals[i];
    return NULL;
}

size_t ps_st_metadata_count(const ps_st_file *f) { return f->nmeta; }
const char *ps_st_metadata_key(const ps_st_file *f, size_t i) { return i < f->nmeta ? f->meta_keys[i] : NULL; }
const char *ps_st_metadata_value(const ps_st_file *f, size_t i) { return i < f->nmeta ? f->meta_vals[i] : NULL; }

void ps_st_free(ps_st_file *f) {
    if (!f) return;
    if (f->owned)
        for (size_t i = 0; i < f->n; i++) free(f->owned[i]);
    free(f->owned);
    free(f->tensors);
    for (size_t i = 0; i < f->nmeta; i++) { free(f->meta_keys[i]); free(f->meta_vals[i]); }
    free(f->meta_keys);
    free(f->meta_vals);
    free(f->data);
    free(f);
}

/* ---------------------------------------------------------------------------
 * Writer
 */

typedef struct st_buf { char *p; size_t len, cap; int oom; } st_buf;

static void sb_put(st_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->len + n + 1 > cap) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_printf(st_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(st_buf *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    PS_ASSERT(n >= 0 && (size_t)n < sizeof tmp); /* only used for numbers */
    sb_put(b, tmp, (size_t)n);
}

static void sb_json_string(st_buf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { char e[2] = { '\\', (char)c }; sb_put(b, e, 2); }
        else if (c < 0x20) sb_printf(b, "\\u%04x", c);
        else sb_put(b, s, 1);
    }
    sb_put(b, "\"", 1);
}

static ps_status st_write_all(int fd, const void *buf, size_t n, const char *tmp, ps_err *err) {
    const char *b = buf;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return ps_err_set(err, PS_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        b += w;
        n -= (size_t)w;
    }
    return PS_OK;
}

static ps_status st_fsync_dir(const char *path, ps_err *err) {
    size_t len = strlen(path);
    char *dir = malloc(len + 2);
    if (!dir) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (!slash) strcpy(dir, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ps_status st = PS_OK;
    if (fd < 0) st = ps_err_set(err, PS_ERR_IO, "%s: open directory %s: %s", path, dir, strerror(errno));
    else {
        if (fsync(fd) != 0)
            st = ps_err_set(err, PS_ERR_IO, "%s: fsync directory %s: %s", path, dir, strerror(errno));
        close(fd);
    }
    free(dir);
    return st;
}

typedef struct st_wsort { const ps_st_tensor *t; } st_wsort;

static int st_wsort_cmp(const void *a, const void *b) {
    const ps_st_tensor *x = ((const st_wsort *)a)->t, *y = ((const st_wsort *)b)->t;
    size_t ex = ps_st_dtype_size(x->dtype), ey = ps_st_dtype_size(y->dtype);
    if (ex != ey) return ex > ey ? -1 : 1;
    return strcmp(x->name, y->name);
}

static ps_status st_check_input(const char *path, const ps_st_tensor *tensors, size_t n,
                                const char *const *meta_kv, ps_err *err) {
    char sh[160];
    for (size_t i = 0; i < n; i++) {
        const ps_st_tensor *t = &tensors[i];
        size_t len = strnlen(t->name, PS_ST_NAME_MAX);
        uint64_t need;
        if (len == 0 || len == PS_ST_NAME_MAX)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor %zu: name must be 1..%d bytes",
                              path, i, PS_ST_NAME_MAX - 1);
        if (!strcmp(t->name, "__metadata__") || !st_utf8_valid(t->name))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor %zu: invalid name '%s'", path, i, t->name);
        if (!ps_st_dtype_size(t->dtype))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': unknown dtype %d",
                              path, t->name, t->dtype);
        if (t->ndim < 0 || t->ndim > PS_ST_MAX_DIMS)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': ndim %d not in 0..%d",
                              path, t->name, t->ndim, PS_ST_MAX_DIMS);
        if (!st_nbytes(t->dims, t->ndim, ps_st_dtype_size(t->dtype), &need) || need != t->bytes)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': shape %s of %s does not"
                              " match %zu bytes", path, t->name,
                              ps_dims_format_as(sh, sizeof sh, t->dims, t->ndim, "[", ", ", "]"), ps_st_dtype_name(t->dtype),
                              t->bytes);
        if (t->bytes && !t->data)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': data is NULL", path, t->name);
    }
    const char *dup = NULL;
    if (first_duplicate(tensors, n, sizeof *tensors, offsetof(ps_st_tensor, name), 0, &dup))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    if (dup) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: duplicate tensor name '%s'", path, dup);
    for (size_t i = 0; meta_kv && meta_kv[i]; i += 2) {
        if (!meta_kv[i + 1])
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: metadata key '%s' has no value", path, meta_kv[i]);
        if (!st_utf8_valid(meta_kv[i]) || !st_utf8_valid(meta_kv[i + 1]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: metadata key %zu: not valid UTF-8", path, i / 2);
        for (size_t j = 0; j < i; j += 2)
            if (!strcmp(meta_kv[j], meta_kv[i]))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: duplicate metadata key '%s'", path, meta_kv[i]);
    }
    return PS_OK;
}

ps_status ps_st_write(const char *path, const ps_st_tensor *tensors, size_t n,
                      const char *const *meta_kv, ps_err *err) {
    ps_status st = st_check_input(path, tensors, n, meta_kv, err);
    if (st) return st;

    st_wsort *ord = malloc((n ? n : 1) * sizeof *ord);
    if (!ord) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) ord[i].t = &tensors[i];
    qsort(ord, n, sizeof *ord, st_wsort_cmp);

    st_buf h = { 0 };
    int first = 1;
    sb_put(&h, "{", 1);
    if (meta_kv && meta_kv[0]) {
        sb_put(&h, "\"__metadata__\":{", 16);
        for (size_t i = 0; meta_kv[i]; i += 2) {
            if (i) sb_put(&h, ",", 1);
            sb_json_string(&h, meta_kv[i]);
            sb_put(&h, ":", 1);
            sb_json_string(&h, meta_kv[i + 1]);
        }
        sb_put(&h, "}", 1);
        first = 0;
    }
    uint64_t pos = 0;
    for (size_t k = 0; k < n; k++) {
        const ps_st_tensor *t = ord[k].t;
        if (!first) sb_put(&h, ",", 1);
        first = 0;
        sb_json_string(&h, t->name);
        sb_put(&h, ":{\"dtype\":\"", 11);
        sb_put(&h, ps_st_dtype_name(t->dtype), strlen(ps_st_dtype_name(t->dtype)));
        sb_put(&h, "\",\"shape\":[", 11);
        for (int d = 0; d < t->ndim; d++) sb_printf(&h, "%s%" PRId64, d ? "," : "", t->dims[d]);
        sb_printf(&h, "],\"data_offsets\":[%" PRIu64 ",", pos);
        pos += t->bytes;
        sb_printf(&h, "%" PRIu64 "]}", pos);
    }
    sb_put(&h, "}", 1);
    while (h.len % 8) sb_put(&h, " ", 1);

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (h.oom || !tmp) {
        free(h.p); free(ord); free(tmp);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = ps_err_set(err, PS_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    if ((st = st_write_all(fd, lenb, 8, tmp, err))) goto fail;
    if ((st = st_write_all(fd, h.p, h.len, tmp, err))) goto fail;
    for (size_t k = 0; k < n; k++)
        if (ord[k].t->bytes && (st = st_write_all(fd, ord[k].t->data, ord[k].t->bytes, tmp, err))) goto fail;
    if (fsync(fd) != 0) { st = ps_err_set(err, PS_ERR_IO, "%s: fsync: %s", tmp, strerror(errno)); goto fail; }
    if (close(fd) != 0) {
        fd = -1;
        st = ps_err_set(err, PS_ERR_IO, "%s: close: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        st = ps_err_set(err, PS_ERR_IO, "%s: rename from %s: %s", path, tmp, strerror(errno));
        goto fail;
    }
    st = st_fsync_dir(path, err);
    goto out;

fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
out:
    free(tmp);
    free(h.p);
    free(ord);
    return st;
}
