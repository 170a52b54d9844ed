/* onnx.c - reading an ONNX ModelProto with nanopb (see onnx.h): callbacks
 * that decode the main graph's nodes, attributes, initializers, inputs and
 * outputs into an arena, bounding every count, name and dimension, and
 * pointing at raw tensor data in the caller's buffer instead of copying it. */
#include "onnx.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pb_decode.h>

#include "arena.h"
#include "onnx.pb.h"

/* Parsed metadata beyond this (arena.h's cap): an absurd file. */
#define ARENA_MAX ((size_t)1 << 31)

/* A growable array in the arena (old copies are left behind: at most
 * twice the final size). */
typedef struct vec {
    void *v;
    int n, cap;
    size_t elem;
} vec;

static void *vec_push(ps_arena *a, vec *v) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 8;
        void *nv = ps_arena_alloc(a, (size_t)cap * v->elem);
        if (!nv) return NULL;
        if (v->n) memcpy(nv, v->v, (size_t)v->n * v->elem);
        v->v = nv;
        v->cap = cap;
    }
    return (char *)v->v + (size_t)v->n++ * v->elem;
}

/* ---------------------------------------------------------------- reader */

typedef struct rd {
    ps_arena *ar;
    ps_err *err;
    const char *label;
    const uint8_t *base;        /* the buffer (for byte offsets in errors) */
    size_t len;
    int failed;                 /* err holds the reason */
    const char *where;          /* "node 3", "tensor 'w'": context for errors */
    char where_buf[256];
    char tensor_where[256];
} rd;

static size_t offset_of(const rd *r, const pb_istream_t *s) {
    const uint8_t *p = s->state;   /* buffer streams: the read position */
    return p >= r->base && p <= r->base + r->len ? (size_t)(p - r->base) : 0;
}

static bool fail(rd *r, const pb_istream_t *s, ps_status code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool fail(rd *r, const pb_istream_t *s, ps_status code, const char *fmt, ...) {
    if (r->failed) return false;
    char msg[PS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->failed = 1;
    if (s)
        ps_err_set(r->err, code, "%s: %s%s%s (byte %zu)", r->label, r->where ? r->where : "", r->where ? ": " : "",
                   msg, offset_of(r, s));
    else
        ps_err_set(r->err, code, "%s: %s%s%s", r->label, r->where ? r->where : "", r->where ? ": " : "", msg);
    return false;
}

static bool oom(rd *r, const pb_istream_t *s) {
    return fail(r, s, PS_ERR_RESOURCE_EXHAUSTED, "out of memory (or more metadata than psd reads)");
}

/* A string field into a NUL-terminated arena copy. */
static bool read_string(rd *r, pb_istream_t *s, const char **dst, const char *what) {
    size_t n = s->bytes_left;
    if (n > PS_ONNX_MAX_NAME) return fail(r, s, PS_ERR_INVALID_ARGUMENT, "%s of %zu bytes (at most %d)", what, n,
                                          PS_ONNX_MAX_NAME);
    char *p = ps_arena_alloc(r->ar, n + 1);
    if (!p) return oom(r, s);
    if (!pb_read(s, (pb_byte_t *)p, n)) return false;
    p[n] = 0;
    if (memchr(p, 0, n)) return fail(r, s, PS_ERR_INVALID_ARGUMENT, "%s holds a NUL byte", what);
    *dst = p;
    return true;
}

typedef struct str_arg {
    rd *r;
    const char **dst;
    const char *what;
} str_arg;

static bool cb_string(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    str_arg *a = *arg;
    (void)f;
    return read_string(a->r, s, a->dst, a->what);
}

typedef struct strvec_arg {
    rd *r;
    vec v;                      /* const char * */
    const char *what;
} strvec_arg;

static bool cb_strvec(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    strvec_arg *a = *arg;
    (void)f;
    if (a->v.n >= PS_ONNX_MAX_LIST)
        return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "more than %d %ss", PS_ONNX_MAX_LIST, a->what);
    const char **slot = vec_push(a->r->ar, &a->v);
    if (!slot) return oom(a->r, s);
    return read_string(a->r, s, slot, a->what);
}

/* Repeated int64 (packed or not: nanopb calls once per value read). */
typedef struct i64vec_arg {
    rd *r;
    vec v;                      /* int64_t */
    int limit;
    const char *what;
    int zigzag;                 /* sint64 (unused by onnx.proto, kept for clarity) */
    int u64;                    /* uint64: decoded as varint, stored as int64 bits */
} i64vec_arg;

static bool cb_i64vec(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    i64vec_arg *a = *arg;
    (void)f;
    if (a->v.n >= a->limit)
        return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "more than %d values in %s", a->limit, a->what);
    uint64_t u;
    if (!pb_decode_varint(s, &u)) return false;
    int64_t *slot = vec_push(a->r->ar, &a->v);
    if (!slot) return oom(a->r, s);
    *slot = (int64_t)u;
    return true;
}

typedef struct i32vec_arg {
    rd *r;
    vec v;                      /* int32_t */
    int limit;
    const char *what;
} i32vec_arg;

static bool cb_i32vec(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    i32vec_arg *a = *arg;
    (void)f;
    if (a->v.n >= a->limit)
        return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "more than %d values in %s", a->limit, a->what);
    uint64_t u;
    if (!pb_decode_varint(s, &u)) return false;
    int32_t *slot = vec_push(a->r->ar, &a->v);
    if (!slot) return oom(a->r, s);
    *slot = (int32_t)u;
    return true;
}

typedef struct f32vec_arg {
    rd *r;
    vec v;                      /* float */
    int limit;
    const char *what;
} f32vec_arg;

static bool cb_f32vec(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    f32vec_arg *a = *arg;
    (void)f;
    if (a->v.n >= a->limit)
        return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "more than %d values in %s", a->limit, a->what);
    float x;
    if (!pb_decode_fixed32(s, &x)) return false;
    float *slot = vec_push(a->r->ar, &a->v);
    if (!slot) return oom(a->r, s);
    *slot = x;
    return true;
}

typedef struct f64vec_arg {
    rd *r;
    vec v;                      /* double */
    int limit;
    const char *what;
} f64vec_arg;

static bool cb_f64vec(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    f64vec_arg *a = *arg;
    (void)f;
    if (a->v.n >= a->limit)
        return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "more than %d values in %s", a->limit, a->what);
    double x;
    if (!pb_decode_fixed64(s, &x)) return false;
    double *slot = vec_push(a->r->ar, &a->v);
    if (!slot) return oom(a->r, s);
    *slot = x;
    return true;
}

/* A bytes field left in place: pointer and length into the buffer. */
typedef struct bytes_arg {
    rd *r;
    const uint8_t *p;
    size_t n;
    int seen;
} bytes_arg;

static bool cb_bytes_ref(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    bytes_arg *a = *arg;
    (void)f;
    a->p = s->state;
    a->n = s->bytes_left;
    a->seen = 1;
    return pb_read(s, NULL, s->bytes_left);   /* a buffer stream skips without touching the bytes */
}

static bool cb_count(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    int *n = *arg;
    (void)f;
    (*n)++;
    return pb_read(s, NULL, s->bytes_left);
}

/* ---------------------------------------------------------------- tensors */

size_t ps_onnx_dtype_size(int32_t dtype) {
    switch (dtype) {
    case PS_ONNX_FLOAT: case PS_ONNX_INT32: case PS_ONNX_UINT32: return 4;
    case PS_ONNX_UINT8: case PS_ONNX_INT8: case PS_ONNX_BOOL: return 1;
    case PS_ONNX_UINT16: case PS_ONNX_INT16: case PS_ONNX_FLOAT16: return 2;
    case PS_ONNX_INT64: case PS_ONNX_DOUBLE: case PS_ONNX_UINT64: return 8;
    default: return 0;
    }
}

const char *ps_onnx_dtype_name(int32_t dtype) {
    static const char *const names[] = {"undefined", "float", "uint8", "int8", "uint16", "int16", "int32", "int64",
                                        "string", "bool", "float16", "double", "uint32", "uint64", "complex64",
                                        "complex128", "bfloat16"};
    return dtype >= 0 && dtype < (int32_t)(sizeof names / sizeof names[0]) ? names[dtype] : "unknown type";
}

/* Decode one TensorProto from s into t (the arena holds what it needs). */
static bool read_tensor(rd *r, pb_istream_t *s, ps_onnx_tensor *t) {
    onnx_TensorProto tp = onnx_TensorProto_init_zero;
    i64vec_arg dims = {r, {NULL, 0, 0, sizeof(int64_t)}, PS_ONNX_MAX_DIMS + 1, "dims", 0, 0};
    str_arg name = {r, &t->name, "tensor name"};
    bytes_arg raw = {r, NULL, 0, 0};
    f32vec_arg fd = {r, {NULL, 0, 0, sizeof(float)}, PS_ONNX_MAX_TYPED, "float_data"};
    i32vec_arg id32 = {r, {NULL, 0, 0, sizeof(int32_t)}, PS_ONNX_MAX_TYPED, "int32_data"};
    i64vec_arg id64 = {r, {NULL, 0, 0, sizeof(int64_t)}, PS_ONNX_MAX_TYPED, "int64_data", 0, 0};
    i64vec_arg idu64 = {r, {NULL, 0, 0, sizeof(int64_t)}, PS_ONNX_MAX_TYPED, "uint64_data", 0, 1};
    f64vec_arg dd = {r, {NULL, 0, 0, sizeof(double)}, PS_ONNX_MAX_TYPED, "double_data"};
    int nstrings = 0, nexternal = 0;
    tp.dims.funcs.decode = cb_i64vec;
    tp.dims.arg = &dims;
    tp.name.funcs.decode = cb_string;
    tp.name.arg = &name;
    tp.raw_data.funcs.decode = cb_bytes_ref;
    tp.raw_data.arg = &raw;
    tp.float_data.funcs.decode = cb_f32vec;
    tp.float_data.arg = &fd;
    tp.int32_data.funcs.decode = cb_i32vec;
    tp.int32_data.arg = &id32;
    tp.int64_data.funcs.decode = cb_i64vec;
    tp.int64_data.arg = &id64;
    tp.uint64_data.funcs.decode = cb_i64vec;
    tp.uint64_data.arg = &idu64;
    tp.double_data.funcs.decode = cb_f64vec;
    tp.double_data.arg = &dd;
    tp.string_data.funcs.decode = cb_count;
    tp.string_data.arg = &nstrings;
    tp.external_data.funcs.decode = cb_count;
    tp.external_data.arg = &nexternal;
    if (!t->name) t->name = "";
    if (!pb_decode(s, onnx_TensorProto_fields, &tp)) return false;
    if (!t->name) t->name = "";
    snprintf(r->tensor_where, sizeof r->tensor_where, "tensor '%.200s'", t->name);
    const char *saved = r->where;
    r->where = r->tensor_where;
    bool ok = false;
    if (tp.has_data_location && tp.data_location == onnx_TensorProto_DataLocation_EXTERNAL) {
        fail(r, s, PS_ERR_INVALID_ARGUMENT, "its data is in an external file (data_location EXTERNAL): psd reads "
             "models whose tensors are inside the .onnx file (save with save_as_external_data=False)");
        goto out;
    }
    if (nexternal) {
        fail(r, s, PS_ERR_INVALID_ARGUMENT, "external_data entries without data_location EXTERNAL");
        goto out;
    }
    if (tp.has_segment) {
        fail(r, s, PS_ERR_INVALID_ARGUMENT, "a segmented tensor (segment): psd reads whole tensors");
        goto out;
    }
    if (dims.v.n > PS_ONNX_MAX_DIMS) {
        fail(r, s, PS_ERR_INVALID_ARGUMENT, "more than %d dimensions", PS_ONNX_MAX_DIMS);
        goto out;
    }
    t->ndim = dims.v.n;
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        int64_t x = ((const int64_t *)dims.v.v)[d];
        if (x < 0 || x > PS_ONNX_MAX_NUMEL || (x && t->numel > PS_ONNX_MAX_NUMEL / x)) {
            fail(r, s, PS_ERR_INVALID_ARGUMENT, "dimension %d is %lld: absurd (%lld elements at most)", d,
                 (long long)x, (long long)PS_ONNX_MAX_NUMEL);
            goto out;
        }
        t->dims[d] = x;
        t->numel *= x;
    }
    t->dtype = tp.has_data_type ? tp.data_type : 0;
    if (t->dtype == PS_ONNX_STRING || nstrings) {
        fail(r, s, PS_ERR_INVALID_ARGUMENT, "a string tensor: psd's tensors are numbers");
        goto out;
    }
    size_t es = ps_onnx_dtype_size(t->dtype);
    int typed = fd.v.n + id32.v.n + id64.v.n + idu64.v.n + dd.v.n;
    if (raw.seen) {
        if (!es) {
            fail(r, s, PS_ERR_INVALID_ARGUMENT, "data type %d (%s): psd reads float, double, float16 and integer "
                 "tensors", (int)t->dtype, ps_onnx_dtype_name(t->dtype));
            goto out;
        }
        if ((uint64_t)raw.n != (uint64_t)t->numel * es) {
            fail(r, s, PS_ERR_INVALID_ARGUMENT, "raw_data holds %zu bytes but %lld %s values take %llu", raw.n,
                 (long long)t->numel, ps_onnx_dtype_name(t->dtype), (unsigned long long)t->numel * es);
            goto out;
        }
        if (typed) {
            fail(r, s, PS_ERR_INVALID_ARGUMENT, "both raw_data and typed values");
            goto out;
        }
        t->raw = raw.p;
    } else if (typed || t->numel == 0) {
        const vec *v = NULL;
        switch (t->dtype) {
        case PS_ONNX_FLOAT: v = &fd.v; break;
        case PS_ONNX_INT32: case PS_ONNX_INT16: case PS_ONNX_INT8: case PS_ONNX_UINT16: case PS_ONNX_UINT8:
        case PS_ONNX_BOOL: case PS_ONNX_FLOAT16: v = &id32.v; break;
        case PS_ONNX_INT64: v = &id64.v; break;
        case PS_ONNX_DOUBLE: v = &dd.v; break;
        case PS_ONNX_UINT32: case PS_ONNX_UINT64: v = &idu64.v; break;
        default:
            fail(r, s, PS_ERR_INVALID_ARGUMENT, "data type %d (%s): psd reads float, double, float16 and integer "
                 "tensors", (int)t->dtype, ps_onnx_dtype_name(t->dtype));
            goto out;
        }
        if (v->n != typed || (int64_t)v->n != t->numel) {
            fail(r, s, PS_ERR_INVALID_ARGUMENT, "%d values for %lld elements of type %s", typed,
                 (long long)t->numel, ps_onnx_dtype_name(t->dtype));
            goto out;
        }
        t->typed = v->v;
    } else {
        fail(r, s, PS_ERR_INVALID_ARGUMENT, "no data (%lld elements)", (long long)t->numel);
        goto out;
    }
    ok = true;
out:
    r->where = saved;
    return ok;
}

typedef struct tensorvec_arg {
    rd *r;
    vec v;                      /* ps_onnx_tensor */
    const char *what;
} tensorvec_arg;

static bool cb_tensorvec(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    tensorvec_arg *a = *arg;
    (void)f;
    if (a->v.n >= PS_ONNX_MAX_NODES)
        return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "more than %d %ss", PS_ONNX_MAX_NODES, a->what);
    ps_onnx_tensor t;
    memset(&t, 0, sizeof t);
    if (!read_tensor(a->r, s, &t)) return false;
    ps_onnx_tensor *slot = vec_push(a->r->ar, &a->v);
    if (!slot) return oom(a->r, s);
    *slot = t;
    return true;
}

typedef struct tensor_arg {
    rd *r;
    ps_onnx_tensor *t;
} tensor_arg;

static bool cb_tensor(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    tensor_arg *a = *arg;
    (void)f;
    ps_onnx_tensor *t = ps_arena_alloc(a->r->ar, sizeof *t);
    if (!t) return oom(a->r, s);
    if (!read_tensor(a->r, s, t)) return false;
    a->t = t;
    return true;
}

/* ---------------------------------------------------------------- nodes */

typedef struct attrvec_arg {
    rd *r;
    vec v;                      /* ps_onnx_attr */
} attrvec_arg;

static bool cb_attr(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    attrvec_arg *a = *arg;
    rd *r = a->r;
    (void)f;
    if (a->v.n >= PS_ONNX_MAX_LIST) return fail(r, s, PS_ERR_INVALID_ARGUMENT, "more than %d attributes",
                                                PS_ONNX_MAX_LIST);
    ps_onnx_attr at;
    memset(&at, 0, sizeof at);
    onnx_AttributeProto ap = onnx_AttributeProto_init_zero;
    str_arg name = {r, &at.name, "attribute name"}, sv = {r, &at.s, "string attribute"}, ref = {r, NULL, ""};
    const char *refname = NULL;
    ref.dst = &refname;
    tensor_arg t = {r, NULL};
    f32vec_arg floats = {r, {NULL, 0, 0, sizeof(float)}, PS_ONNX_MAX_LIST, "floats"};
    i64vec_arg ints = {r, {NULL, 0, 0, sizeof(int64_t)}, PS_ONNX_MAX_LIST, "ints", 0, 0};
    int ngraphs = 0;
    ap.name.funcs.decode = cb_string;
    ap.name.arg = &name;
    ap.s.funcs.decode = cb_string;
    ap.s.arg = &sv;
    ap.t.funcs.decode = cb_tensor;
    ap.t.arg = &t;
    ap.floats.funcs.decode = cb_f32vec;
    ap.floats.arg = &floats;
    ap.ints.funcs.decode = cb_i64vec;
    ap.ints.arg = &ints;
    ap.strings.funcs.decode = cb_count;
    ap.strings.arg = &at.nstrings;
    ap.g.funcs.decode = cb_count;
    ap.g.arg = &ngraphs;
    ap.graphs.funcs.decode = cb_count;
    ap.graphs.arg = &ngraphs;
    ap.ref_attr_name.funcs.decode = cb_string;
    ap.ref_attr_name.arg = &ref;
    if (!pb_decode(s, onnx_AttributeProto_fields, &ap)) return false;
    if (!at.name) return fail(r, s, PS_ERR_INVALID_ARGUMENT, "an attribute without a name");
    if (refname) return fail(r, s, PS_ERR_INVALID_ARGUMENT, "attribute '%s' refers to a function's attribute "
                             "(ref_attr_name): psd reads graphs, not functions", at.name);
    at.f = ap.f;
    at.i = ap.i;
    at.t = t.t;
    at.nfloats = floats.v.n;
    at.floats = floats.v.v;
    at.nints = ints.v.n;
    at.ints = ints.v.v;
    if (ap.has_type) at.type = (int)ap.type;
    else if (ngraphs) at.type = PS_ONNX_ATTR_GRAPH;
    else if (at.t) at.type = PS_ONNX_ATTR_TENSOR;
    else if (at.s) at.type = PS_ONNX_ATTR_STRING;
    else if (at.nints) at.type = PS_ONNX_ATTR_INTS;
    else if (at.nfloats) at.type = PS_ONNX_ATTR_FLOATS;
    else if (ap.has_f) at.type = PS_ONNX_ATTR_FLOAT;
    else if (ap.has_i) at.type = PS_ONNX_ATTR_INT;
    if (at.type == PS_ONNX_ATTR_STRING && !at.s) at.s = "";
    ps_onnx_attr *slot = vec_push(r->ar, &a->v);
    if (!slot) return oom(r, s);
    *slot = at;
    return true;
}

typedef struct nodevec_arg {
    rd *r;
    vec v;                      /* ps_onnx_node */
} nodevec_arg;

static bool cb_node(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    nodevec_arg *a = *arg;
    rd *r = a->r;
    (void)f;
    if (a->v.n >= PS_ONNX_MAX_NODES)
        return fail(r, s, PS_ERR_INVALID_ARGUMENT, "more than %d nodes", PS_ONNX_MAX_NODES);
    ps_onnx_node nd;
    memset(&nd, 0, sizeof nd);
    onnx_NodeProto np = onnx_NodeProto_init_zero;
    strvec_arg in = {r, {NULL, 0, 0, sizeof(const char *)}, "input"};
    strvec_arg out = {r, {NULL, 0, 0, sizeof(const char *)}, "output"};
    str_arg name = {r, &nd.name, "node name"}, op = {r, &nd.op_type, "op_type"}, dom = {r, &nd.domain, "domain"};
    attrvec_arg at = {r, {NULL, 0, 0, sizeof(ps_onnx_attr)}};
    np.input.funcs.decode = cb_strvec;
    np.input.arg = &in;
    np.output.funcs.decode = cb_strvec;
    np.output.arg = &out;
    np.name.funcs.decode = cb_string;
    np.name.arg = &name;
    np.op_type.funcs.decode = cb_string;
    np.op_type.arg = &op;
    np.domain.funcs.decode = cb_string;
    np.domain.arg = &dom;
    np.attribute.funcs.decode = cb_attr;
    np.attribute.arg = &at;
    snprintf(r->where_buf, sizeof r->where_buf, "node %d", a->v.n);
    r->where = r->where_buf;
    if (!pb_decode(s, onnx_NodeProto_fields, &np)) return false;
    r->where = NULL;
    if (!nd.name) nd.name = "";
    if (!nd.domain) nd.domain = "";
    if (!nd.op_type || !nd.op_type[0])
        return fail(r, s, PS_ERR_INVALID_ARGUMENT, "node %d ('%s') has no op_type", a->v.n, nd.name);
    nd.nin = in.v.n;
    nd.in = in.v.v;
    nd.nout = out.v.n;
    nd.out = out.v.v;
    nd.nattr = at.v.n;
    nd.attrs = at.v.v;
    ps_onnx_node *slot = vec_push(r->ar, &a->v);
    if (!slot) return oom(r, s);
    *slot = nd;
    return true;
}

/* ----------------------------------------------------- graph inputs/outputs */

/* TensorShapeProto.Dimension by hand (its oneof holds a string). */
typedef struct dims_arg {
    rd *r;
    ps_onnx_value *v;
    int n;
} dims_arg;

static bool cb_dim(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    dims_arg *a = *arg;
    (void)f;
    if (a->n >= PS_ONNX_MAX_DIMS)
        return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "value '%s' has more than %d dimensions", a->v->name,
                    PS_ONNX_MAX_DIMS);
    int64_t value = -1;
    const char *param = NULL;
    while (s->bytes_left) {
        pb_wire_type_t wt;
        uint32_t tag;
        bool eof;
        if (!pb_decode_tag(s, &wt, &tag, &eof)) return false;
        if (tag == 1 && wt == PB_WT_VARINT) {
            uint64_t u;
            if (!pb_decode_varint(s, &u)) return false;
            value = (int64_t)u;
            param = NULL;
        } else if (tag == 2 && wt == PB_WT_STRING) {
            pb_istream_t sub;
            if (!pb_make_string_substream(s, &sub)) return false;
            bool ok = read_string(a->r, &sub, &param, "dim_param");
            if (!pb_close_string_substream(s, &sub) || !ok) return false;
            value = -1;
        } else if (!pb_skip_field(s, wt)) {
            return false;
        }
    }
    if (value < -1 || value > PS_ONNX_MAX_NUMEL)
        return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "value '%s': dimension %d is %lld", a->v->name, a->n,
                    (long long)value);
    a->v->dims[a->n] = value;
    a->v->dim_param[a->n] = param;
    a->n++;
    return true;
}

/* TypeProto by hand: only tensor_type (field 1) is read; sequences, maps,
 * optionals are left as "not a tensor" (elem_type 0). */
static bool cb_type(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    dims_arg *a = *arg;
    (void)f;
    while (s->bytes_left) {
        pb_wire_type_t wt;
        uint32_t tag;
        bool eof;
        if (!pb_decode_tag(s, &wt, &tag, &eof)) return false;
        if (tag != 1 || wt != PB_WT_STRING) {
            if (!pb_skip_field(s, wt)) return false;
            continue;
        }
        onnx_TypeProto_Tensor tt = onnx_TypeProto_Tensor_init_zero;
        a->n = 0;
        tt.shape.dim.funcs.decode = cb_dim;
        tt.shape.dim.arg = a;
        pb_istream_t sub;
        if (!pb_make_string_substream(s, &sub)) return false;
        bool ok = pb_decode(&sub, onnx_TypeProto_Tensor_fields, &tt);
        if (!pb_close_string_substream(s, &sub) || !ok) return false;
        a->v->elem_type = tt.has_elem_type ? tt.elem_type : 0;
        a->v->has_shape = tt.has_shape;
        a->v->ndim = a->n;
    }
    return true;
}

typedef struct valuevec_arg {
    rd *r;
    vec v;                      /* ps_onnx_value */
    const char *what;
} valuevec_arg;

static bool cb_value(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    valuevec_arg *a = *arg;
    rd *r = a->r;
    (void)f;
    if (a->v.n >= PS_ONNX_MAX_LIST) return fail(r, s, PS_ERR_INVALID_ARGUMENT, "more than %d graph %ss",
                                                PS_ONNX_MAX_LIST, a->what);
    ps_onnx_value v;
    memset(&v, 0, sizeof v);
    v.name = "";
    onnx_ValueInfoProto vp = onnx_ValueInfoProto_init_zero;
    str_arg name = {r, &v.name, "value name"};
    dims_arg da = {r, &v, 0};
    vp.name.funcs.decode = cb_string;
    vp.name.arg = &name;
    vp.type.funcs.decode = cb_type;
    vp.type.arg = &da;
    if (!pb_decode(s, onnx_ValueInfoProto_fields, &vp)) return false;
    ps_onnx_value *slot = vec_push(r->ar, &a->v);
    if (!slot) return oom(r, s);
    *slot = v;
    return true;
}

/* ----------------------------------------------------------- model, graph */

typedef struct graph_arg {
    rd *r;
    nodevec_arg nodes;
    tensorvec_arg inits;
    valuevec_arg inputs, outputs;
    const char *name;
    int nsparse;
    int seen;
} graph_arg;

static bool cb_graph(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    graph_arg *g = *arg;
    (void)f;
    if (g->seen++) return fail(g->r, s, PS_ERR_INVALID_ARGUMENT, "the model holds several graphs");
    onnx_GraphProto gp = onnx_GraphProto_init_zero;
    str_arg name = {g->r, &g->name, "graph name"};
    gp.node.funcs.decode = cb_node;
    gp.node.arg = &g->nodes;
    gp.initializer.funcs.decode = cb_tensorvec;
    gp.initializer.arg = &g->inits;
    gp.input.funcs.decode = cb_value;
    gp.input.arg = &g->inputs;
    gp.output.funcs.decode = cb_value;
    gp.output.arg = &g->outputs;
    gp.name.funcs.decode = cb_string;
    gp.name.arg = &name;
    gp.sparse_initializer.funcs.decode = cb_count;
    gp.sparse_initializer.arg = &g->nsparse;
    return pb_decode(s, onnx_GraphProto_fields, &gp);
}

typedef struct opsetvec_arg {
    rd *r;
    vec v;                      /* ps_onnx_opset */
} opsetvec_arg;

static bool cb_opset(pb_istream_t *s, const pb_field_iter_t *f, void **arg) {
    opsetvec_arg *a = *arg;
    (void)f;
    if (a->v.n >= 256) return fail(a->r, s, PS_ERR_INVALID_ARGUMENT, "more than 256 opset imports");
    ps_onnx_opset o = {"", 0};
    onnx_OperatorSetIdProto op = onnx_OperatorSetIdProto_init_zero;
    str_arg dom = {a->r, &o.domain, "opset domain"};
    op.domain.funcs.decode = cb_string;
    op.domain.arg = &dom;
    if (!pb_decode(s, onnx_OperatorSetIdProto_fields, &op)) return false;
    o.version = op.version;
    ps_onnx_opset *slot = vec_push(a->r->ar, &a->v);
    if (!slot) return oom(a->r, s);
    *slot = o;
    return true;
}

static bool malformed(rd *r, pb_istream_t *s) {
    if (r->failed) return false;
    return fail(r, s, PS_ERR_FORMAT, "not a valid ONNX model (malformed protobuf: %s)", PB_GET_ERROR(s));
}

ps_onnx_model *ps_onnx_parse(const void *buf, size_t len, const char *label, ps_err *err) {
    ps_arena *ar = ps_arena_create(ARENA_MAX);
    ps_onnx_model *m = ar ? ps_arena_alloc(ar, sizeof *m) : NULL;
    if (!m) {
        free(ar);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", label);
        return NULL;
    }
    m->arena = ar;
    rd r = {ar, err, label, buf, len, 0, NULL, "", ""};
    graph_arg g = {&r, {&r, {NULL, 0, 0, sizeof(ps_onnx_node)}}, {&r, {NULL, 0, 0, sizeof(ps_onnx_tensor)}, "initializer"},
                   {&r, {NULL, 0, 0, sizeof(ps_onnx_value)}, "input"},
                   {&r, {NULL, 0, 0, sizeof(ps_onnx_value)}, "output"}, NULL, 0, 0};
    opsetvec_arg ops = {&r, {NULL, 0, 0, sizeof(ps_onnx_opset)}};
    const char *pname = NULL, *pver = NULL;
    str_arg pn = {&r, &pname, "producer_name"}, pv = {&r, &pver, "producer_version"};
    onnx_ModelProto mp = onnx_ModelProto_init_zero;
    int nfunctions = 0;
    mp.graph.funcs.decode = cb_graph;
    mp.graph.arg = &g;
    mp.opset_import.funcs.decode = cb_opset;
    mp.opset_import.arg = &ops;
    mp.producer_name.funcs.decode = cb_string;
    mp.producer_name.arg = &pn;
    mp.producer_version.funcs.decode = cb_string;
    mp.producer_version.arg = &pv;
    mp.functions.funcs.decode = cb_count;
    mp.functions.arg = &nfunctions;
    pb_istream_t s = pb_istream_from_buffer(buf, len);
    if (!pb_decode(&s, onnx_ModelProto_fields, &mp)) {
        malformed(&r, &s);
        goto fail;
    }
    if (!g.seen) {
        fail(&r, NULL, PS_ERR_FORMAT, "no graph: not an ONNX model (%zu bytes)", len);
        goto fail;
    }
    if (g.nsparse) {
        fail(&r, NULL, PS_ERR_INVALID_ARGUMENT, "%d sparse initializers: psd reads dense ones", g.nsparse);
        goto fail;
    }
    m->ir_version = mp.ir_version;
    m->nopsets = ops.v.n;
    m->opsets = ops.v.v;
    for (int i = 0; i < ops.v.n; i++)
        if (!m->opsets[i].domain[0] || !strcmp(m->opsets[i].domain, "ai.onnx")) m->opset = m->opsets[i].version;
    char *prod = ps_arena_alloc(ar, 2 * PS_ONNX_MAX_NAME + 2);
    if (!prod) { oom(&r, NULL); goto fail; }
    snprintf(prod, 2 * PS_ONNX_MAX_NAME + 2, "%s%s%s", pname ? pname : "", pver ? " " : "", pver ? pver : "");
    m->producer = prod;
    m->graph_name = g.name ? g.name : "";
    m->nnodes = g.nodes.v.n;
    m->nodes = g.nodes.v.v;
    m->ninits = g.inits.v.n;
    m->inits = g.inits.v.v;
    m->ninputs = g.inputs.v.n;
    m->inputs = g.inputs.v.v;
    m->noutputs = g.outputs.v.n;
    m->outputs = g.outputs.v.v;
    (void)nfunctions;   /* a node calling a local function is an unknown op to the importer */
    return m;
fail:
    ps_arena_free(ar);
    return NULL;
}

void ps_onnx_free(ps_onnx_model *m) {
    if (m) ps_arena_free(m->arena);
}

typedef struct tensor_box {
    ps_onnx_tensor t;           /* first: ps_onnx_free_tensor casts back */
    ps_arena *ar;
} tensor_box;

ps_onnx_tensor *ps_onnx_parse_tensor(const void *buf, size_t len, const char *label, ps_err *err) {
    ps_arena *ar = ps_arena_create(ARENA_MAX);
    tensor_box *b = ar ? ps_arena_alloc(ar, sizeof *b) : NULL;
    if (!b) {
        free(ar);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", label);
        return NULL;
    }
    b->ar = ar;
    rd r = {ar, err, label, buf, len, 0, NULL, "", ""};
    pb_istream_t s = pb_istream_from_buffer(buf, len);
    if (!read_tensor(&r, &s, &b->t)) {
        malformed(&r, &s);
        ps_arena_free(ar);
        return NULL;
    }
    return &b->t;
}

void ps_onnx_free_tensor(ps_onnx_tensor *t) {
    if (t) ps_arena_free(((tensor_box *)t)->ar);
}

/* ------------------------------------------------------------------ files */

ps_onnx_file *ps_onnx_map_file(const char *path, ps_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ps_err_set(err, errno == ENOENT ? PS_ERR_NOT_FOUND : PS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    ps_onnx_file *f = calloc(1, sizeof *f);
    if (!f || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ps_err_set(err, f ? PS_ERR_IO : PS_ERR_RESOURCE_EXHAUSTED, "%s: %s", path,
                   f ? "not a regular file" : "out of memory");
        free(f);
        close(fd);
        return NULL;
    }
    f->len = (size_t)st.st_size;
    if (f->len) {
        void *p = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            ps_err_set(err, PS_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
            free(f);
            close(fd);
            return NULL;
        }
        f->data = p;
    } else {
        f->data = "";
    }
    close(fd);
    return f;
}

void ps_onnx_unmap(ps_onnx_file *f) {
    if (!f) return;
    if (f->len) munmap((void *)f->data, f->len);
    free(f);
}

/* ------------------------------------------------------------ conversions */

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (!man) {
            bits = sign;
        } else {   /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Element i of t as double (integers exactly up to 2^53) or as int64. */
static int load_elem(const ps_onnx_tensor *t, int64_t i, double *d, int64_t *q) {
    size_t es = ps_onnx_dtype_size(t->dtype);
    if (t->raw) {
        const uint8_t *p = t->raw + (size_t)i * es;
        switch (t->dtype) {
        case PS_ONNX_FLOAT: { float v; memcpy(&v, p, 4); *d = v; *q = (int64_t)v; return 0; }
        case PS_ONNX_DOUBLE: { double v; memcpy(&v, p, 8); *d = v; *q = (int64_t)v; return 0; }
        case PS_ONNX_FLOAT16: { uint16_t v; memcpy(&v, p, 2); *d = half_to_float(v); *q = (int64_t)*d; return 0; }
        case PS_ONNX_INT8: { int8_t v; memcpy(&v, p, 1); *q = v; break; }
        case PS_ONNX_UINT8: case PS_ONNX_BOOL: { uint8_t v = *p; *q = v; break; }
        case PS_ONNX_INT16: { int16_t v; memcpy(&v, p, 2); *q = v; break; }
        case PS_ONNX_UINT16: { uint16_t v; memcpy(&v, p, 2); *q = v; break; }
        case PS_ONNX_INT32: { int32_t v; memcpy(&v, p, 4); *q = v; break; }
        case PS_ONNX_UINT32: { uint32_t v; memcpy(&v, p, 4); *q = v; break; }
        case PS_ONNX_INT64: case PS_ONNX_UINT64: { int64_t v; memcpy(&v, p, 8); *q = v; break; }
        default: return -1;
        }
        *d = (double)*q;
        return 1;
    }
    switch (t->dtype) {
    case PS_ONNX_FLOAT: *d = ((const float *)t->typed)[i]; *q = (int64_t)*d; return 0;
    case PS_ONNX_DOUBLE: *d = ((const double *)t->typed)[i]; *q = (int64_t)*d; return 0;
    case PS_ONNX_FLOAT16: *d = half_to_float((uint16_t)((const int32_t *)t->typed)[i]); *q = (int64_t)*d; return 0;
    case PS_ONNX_INT8: case PS_ONNX_UINT8: case PS_ONNX_BOOL: case PS_ONNX_INT16: case PS_ONNX_UINT16:
    case PS_ONNX_INT32:
        *q = ((const int32_t *)t->typed)[i];
        break;
    case PS_ONNX_INT64: case PS_ONNX_UINT32: case PS_ONNX_UINT64:
        *q = ((const int64_t *)t->typed)[i];
        break;
    default:
        return -1;
    }
    *d = (double)*q;
    return 1;
}

ps_status ps_onnx_tensor_floats(const ps_onnx_tensor *t, float *dst, ps_err *err) {
    if (t->dtype == PS_ONNX_FLOAT && t->raw) {
        memcpy(dst, t->raw, (size_t)t->numel * sizeof(float));   /* little-endian hosts (x86-64, aarch64) */
        return PS_OK;
    }
    for (int64_t i = 0; i < t->numel; i++) {
        double d;
        int64_t q;
        if (load_elem(t, i, &d, &q) < 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "tensor '%s' of type %s: psd reads numbers", t->name,
                              ps_onnx_dtype_name(t->dtype));
        dst[i] = (float)d;
    }
    return PS_OK;
}

ps_status ps_onnx_tensor_int64s(const ps_onnx_tensor *t, int64_t *dst, ps_err *err) {
    for (int64_t i = 0; i < t->numel; i++) {
        double d;
        int64_t q;
        int k = load_elem(t, i, &d, &q);
        if (k != 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "tensor '%s' of type %s: expected integers", t->name,
                              ps_onnx_dtype_name(t->dtype));
        dst[i] = q;
    }
    return PS_OK;
}

const ps_onnx_attr *ps_onnx_attr_find(const ps_onnx_node *n, const char *name) {
    for (int i = 0; i < n->nattr; i++)
        if (!strcmp(n->attrs[i].name, name)) return &n->attrs[i];
    return NULL;
}
