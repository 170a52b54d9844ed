/* wire.c - see wire.h. */
#include "wire.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <pb_decode.h>
#include <pb_encode.h>

#include "dims.h"

/* Tensor bytes are copied as is: the host must be little endian like the
 * wire format. A big-endian port would byte-swap in the two data callbacks. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "wire.c assumes a little-endian host (float32 LE on the wire)");
_Static_assert(sizeof(float) == 4, "float must be IEEE binary32");
_Static_assert(PS_WIRE_MAX_DIMS == sizeof(((ps_Tensor *)0)->shape) / sizeof(int64_t),
               "PS_WIRE_MAX_DIMS must match ps.options Tensor.shape max_count");
_Static_assert(PS_WIRE_NAME_MAX == sizeof(((ps_Tensor *)0)->name),
               "PS_WIRE_NAME_MAX must match ps.options Tensor.name max_size");

#define WIRE_ALIGN 64

/* ---- byte buffer input stream ------------------------------------------ */

typedef struct bb_source {
    grpc_byte_buffer_reader reader;
    grpc_slice *cur; /* owned by the byte buffer; NULL before the first */
    size_t off;      /* bytes of *cur already consumed */
} bb_source;

static bool bb_read(pb_istream_t *stream, pb_byte_t *buf, size_t count) {
    bb_source *s = stream->state;
    while (count > 0) {
        if (!s->cur || s->off == GRPC_SLICE_LENGTH(*s->cur)) {
            if (!grpc_byte_buffer_reader_peek(&s->reader, &s->cur)) {
                s->cur = NULL;
                return false; /* nanopb's bytes_left makes this unreachable */
            }
            s->off = 0;
            continue;
        }
        size_t avail = GRPC_SLICE_LENGTH(*s->cur) - s->off;
        size_t n = count < avail ? count : avail;
        if (buf) {
            memcpy(buf, GRPC_SLICE_START_PTR(*s->cur) + s->off, n);
            buf += n;
        }
        s->off += n;
        count -= n;
    }
    return true;
}

ps_status ps_wire_decode(const grpc_byte_buffer *bb, const pb_msgdesc_t *fields,
                         void *msg, ps_err *err) {
    ps_err_clear(err);
    pb_istream_t st;
    bool ok;
    if (!bb) {
        st = pb_istream_from_buffer(NULL, 0);
        ok = pb_decode(&st, fields, msg);
    } else {
        bb_source src = {0};
        /* The reader does not modify a raw buffer; the API just isn't const. */
        if (!grpc_byte_buffer_reader_init(&src.reader, (grpc_byte_buffer *)bb))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                              "malformed message: cannot read the byte buffer");
        st.callback = bb_read;
        st.state = &src;
        st.bytes_left = grpc_byte_buffer_length((grpc_byte_buffer *)bb);
        st.errmsg = NULL;
        ok = pb_decode(&st, fields, msg);
        grpc_byte_buffer_reader_destroy(&src.reader);
    }
    if (ok) return PS_OK;
    /* A bound callback that was given this err explained itself already. */
    if (err && err->code != PS_OK) return err->code;
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "malformed protobuf: %s",
                      PB_GET_ERROR(&st));
}

ps_status ps_wire_encode(const pb_msgdesc_t *fields, const void *msg,
                         grpc_byte_buffer **out, ps_err *err) {
    *out = NULL;
    /* Size pass; what pb_get_encoded_size does, but keeps nanopb's error. */
    pb_ostream_t sizing = PB_OSTREAM_SIZING;
    if (!pb_encode(&sizing, fields, msg))
        return ps_err_set(err, PS_ERR_INTERNAL, "cannot encode message (size pass): %s",
                          PB_GET_ERROR(&sizing));
    size_t size = sizing.bytes_written;
    grpc_slice slice = grpc_slice_malloc(size);
    pb_ostream_t os = pb_ostream_from_buffer(GRPC_SLICE_START_PTR(slice), size);
    if (!pb_encode(&os, fields, msg) || os.bytes_written != size) {
        grpc_slice_unref(slice);
        return ps_err_set(err, PS_ERR_INTERNAL,
                          "cannot encode message: %s (%zu of %zu bytes written)",
                          PB_GET_ERROR(&os), os.bytes_written, size);
    }
    *out = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice); /* the byte buffer holds its own reference */
    return PS_OK;
}

/* ---- shapes ------------------------------------------------------------ */

ps_status ps_wire_shape_count(const int64_t *dims, int ndim, const char *what,
                              size_t *count, ps_err *err) {
    *count = 0;
    if (ndim < 1 || ndim > PS_WIRE_MAX_DIMS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%s: shape has %d dims, need 1 to %d", what, ndim,
                          PS_WIRE_MAX_DIMS);
    char sh[128];
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] < 1) {
            ps_dims_format(sh, sizeof sh, dims, ndim);
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                              "%s: shape %s has dim %d = %" PRId64 ", need >= 1",
                              what, sh, i, dims[i]);
        }
        size_t bytes;
        if ((uint64_t)dims[i] > SIZE_MAX ||
            __builtin_mul_overflow(n, (size_t)dims[i], &n) ||
            __builtin_mul_overflow(n, sizeof(float), &bytes)) {
            ps_dims_format(sh, sizeof sh, dims, ndim);
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                              "%s: shape %s is too large (element count overflows)",
                              what, sh);
        }
    }
    *count = n;
    return PS_OK;
}

/* ---- recycled decode buffers -------------------------------------------
 * A large tensor decoded per call (psd: a Forward's input, 200 KB for the
 * small ResNet at batch 64) would otherwise be allocated and freed every
 * call: glibc hands back memory past the top of the heap and takes it
 * again, so every call faulted pages in anew (3/4 of psd's page faults in
 * steady state, ~14 us each on this project's VM), and freeing a chunk
 * over 64 KiB consolidates malloc's fast bins. ps_wire_tensor_in_free puts
 * such a buffer here instead; the next decode of the same padded size
 * takes the newest one (likely still in this core's cache). At most
 * WIRE_RECYCLE_N buffers, each WIRE_RECYCLE_MIN .. WIRE_RECYCLE_MAX bytes.
 * Buffers here are plain posix_memalign blocks: whoever took one over
 * (a tensor list, a handler) may free() it. PS_WIRE_RECYCLE=0 in the
 * environment turns it off (for comparison). */
#define WIRE_RECYCLE_N 8
#define WIRE_RECYCLE_MIN ((size_t)64 << 10)
#define WIRE_RECYCLE_MAX ((size_t)16 << 20)
/* and at most this many bytes in all: a client sending large tensors of
 * many sizes pins no more than this in a process for good */
#define WIRE_RECYCLE_TOTAL ((size_t)32 << 20)

static struct {
    pthread_mutex_t mu;
    int n;
    int off;                   /* 1: PS_WIRE_RECYCLE=0; read once (pthread_once) */
    void *p[WIRE_RECYCLE_N];   /* newest last */
    size_t size[WIRE_RECYCLE_N];
    size_t total;              /* sum of size[] */
} g_recycle = { .mu = PTHREAD_MUTEX_INITIALIZER };
static pthread_once_t g_recycle_once = PTHREAD_ONCE_INIT;

static void recycle_init(void) {
    const char *e = getenv("PS_WIRE_RECYCLE");
    g_recycle.off = e && !strcmp(e, "0");
}

static size_t padded_size(size_t bytes) {
    size_t padded;
    if (__builtin_add_overflow(bytes, (size_t)WIRE_ALIGN - 1, &padded)) return 0;
    padded &= ~(size_t)(WIRE_ALIGN - 1);
    return padded ? padded : WIRE_ALIGN;
}

static int recyclable(size_t padded) {
    pthread_once(&g_recycle_once, recycle_init);
    return !g_recycle.off && padded >= WIRE_RECYCLE_MIN && padded <= WIRE_RECYCLE_MAX;
}

/* With g_recycle.mu held: buffer i taken out of the list. */
static void *recycle_remove_locked(int i) {
    void *p = g_recycle.p[i];
    g_recycle.total -= g_recycle.size[i];
    memmove(g_recycle.p + i, g_recycle.p + i + 1, (size_t)(g_recycle.n - i - 1) * sizeof g_recycle.p[0]);
    memmove(g_recycle.size + i, g_recycle.size + i + 1, (size_t)(g_recycle.n - i - 1) * sizeof g_recycle.size[0]);
    g_recycle.n--;
    return p;
}

/* The newest recycled buffer of exactly padded bytes, taken out; NULL if none. */
static void *recycle_take(size_t padded) {
    void *p = NULL;
    pthread_mutex_lock(&g_recycle.mu);
    for (int i = g_recycle.n - 1; i >= 0 && !p; i--)
        if (g_recycle.size[i] == padded) p = recycle_remove_locked(i);
    pthread_mutex_unlock(&g_recycle.mu);
    return p;
}

/* Keep p (padded bytes, from alloc_floats) for the next decode, or free it.
 * A full list (WIRE_RECYCLE_N buffers or WIRE_RECYCLE_TOTAL bytes) drops
 * its oldest. */
static void recycle_put(void *p, size_t bytes) {
    if (!p) return;
    size_t padded = padded_size(bytes);
    if (!recyclable(padded)) { free(p); return; }
    void *old[WIRE_RECYCLE_N];
    int nold = 0;
    pthread_mutex_lock(&g_recycle.mu);
    while (g_recycle.n > 0 && (g_recycle.n == WIRE_RECYCLE_N || g_recycle.total + padded > WIRE_RECYCLE_TOTAL))
        old[nold++] = recycle_remove_locked(0);
    g_recycle.p[g_recycle.n] = p;
    g_recycle.size[g_recycle.n++] = padded;
    g_recycle.total += padded;
    pthread_mutex_unlock(&g_recycle.mu);
    for (int i = 0; i < nold; i++) free(old[i]);
}

size_t ps_wire_recycled_bytes(void) {
    pthread_mutex_lock(&g_recycle.mu);
    size_t t = g_recycle.total;
    pthread_mutex_unlock(&g_recycle.mu);
    return t;
}

/* 64-byte aligned, rounded up so vector loops may read whole lines. */
static float *alloc_floats(size_t bytes) {
    size_t padded = padded_size(bytes);
    if (!padded) return NULL;
    void *p = recyclable(padded) ? recycle_take(padded) : NULL;
    if (!p && posix_memalign(&p, WIRE_ALIGN, padded) != 0) return NULL;
    return p;
}

/* ---- one tensor, decode side ------------------------------------------- */

void ps_wire_tensor_in_init(ps_wire_tensor_in *t, size_t max_bytes) {
    memset(t, 0, sizeof *t);
    t->max_bytes = max_bytes;
}

void ps_wire_tensor_in_free(ps_wire_tensor_in *t) {
    if (!t) return;
    recycle_put(t->data, t->bytes);
    t->data = NULL;
    t->bytes = 0;
}

static bool tensor_data_decode(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    ps_wire_tensor_in *t = *arg;
    size_t n = stream->bytes_left;
    if (n > t->max_bytes) {
        ps_err_set(t->err, PS_ERR_RESOURCE_EXHAUSTED,
                   "Tensor.data: %zu bytes exceed the limit of %zu bytes", n, t->max_bytes);
        PB_RETURN_ERROR(stream, "tensor data over the size limit");
    }
    if (n % sizeof(float) != 0) {
        ps_err_set(t->err, PS_ERR_INVALID_ARGUMENT,
                   "Tensor.data: %zu bytes is not a whole number of float32 values", n);
        PB_RETURN_ERROR(stream, "tensor data not a multiple of 4 bytes");
    }
    recycle_put(t->data, t->bytes); /* a repeated occurrence replaces the earlier one */
    t->data = NULL;
    t->bytes = 0;
    float *buf = NULL;
    if (n > 0) {
        buf = alloc_floats(n);
        if (!buf) {
            ps_err_set(t->err, PS_ERR_RESOURCE_EXHAUSTED,
                       "Tensor.data: cannot allocate %zu bytes", n);
            PB_RETURN_ERROR(stream, "out of memory for tensor data");
        }
        if (!pb_read(stream, (pb_byte_t *)buf, n)) {
            free(buf);
            return false;
        }
    }
    t->data = buf;
    t->bytes = n;
    t->got++;
    return true;
}

void ps_wire_tensor_decode_bind(ps_Tensor *msg, ps_wire_tensor_in *t) {
    msg->data.funcs.decode = tensor_data_decode;
    msg->data.arg = t;
}

size_t ps_wire_dtype_size(int dtype) {
    switch (dtype) {
    case ps_DType_FLOAT32: return 4;
    case ps_DType_INT64: return 8;
    default: return 0;
    }
}

const char *ps_wire_dtype_name(int dtype) {
    switch (dtype) {
    case ps_DType_FLOAT32: return "float32";
    case ps_DType_INT64: return "int64";
    default: return "unknown";
    }
}

ps_status ps_wire_tensor_check(const ps_Tensor *msg, const ps_wire_tensor_in *t,
                               const char *what, ps_err *err) {
    size_t esz = ps_wire_dtype_size(msg->dtype);
    if (!esz)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%s: dtype %d is not a known dtype (FLOAT32 = 0, INT64 = 1)", what,
                          (int)msg->dtype);
    size_t count;
    ps_status st = ps_wire_shape_count(msg->shape, (int)msg->shape_count, what, &count, err);
    if (st != PS_OK) return st;
    if (count > SIZE_MAX / esz || count * esz != t->bytes) {
        char sh[128];
        ps_dims_format(sh, sizeof sh, msg->shape, (int)msg->shape_count);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%s: shape %s needs %zu bytes (%zu %s) but data has %zu bytes",
                          what, sh, count * esz, count, ps_wire_dtype_name(msg->dtype), t->bytes);
    }
    return PS_OK;
}

/* ---- one tensor, encode side ------------------------------------------- */

static bool tensor_data_encode(pb_ostream_t *stream, const pb_field_t *field,
                               void *const *arg) {
    const ps_Tensor *m = field->message;
    size_t count = 1;
    for (pb_size_t i = 0; i < m->shape_count; i++) count *= (size_t)m->shape[i];
    if (count == 0 || !*arg) return true; /* nothing to send */
    if (!pb_encode_tag_for_field(stream, field)) return false;
    return pb_encode_string(stream, (const pb_byte_t *)*arg, count * ps_wire_dtype_size(m->dtype));
}

static void copy_name(char *dst, size_t cap, const char *src) {
    if (!src) src = "";
    size_t n = strlen(src);
    PS_ASSERT(n < cap);
    memcpy(dst, src, n + 1);
}

void ps_wire_tensor_encode_bind(ps_Tensor *msg, const char *name, int ndim,
                                const int64_t *dims, const float *data) {
    ps_wire_tensor_encode_bind_typed(msg, name, ndim, dims, data, ps_DType_FLOAT32);
}

void ps_wire_tensor_encode_bind_typed(ps_Tensor *msg, const char *name, int ndim,
                                      const int64_t *dims, const void *data, int dtype) {
    PS_ASSERT(ndim >= 0 && ndim <= PS_WIRE_MAX_DIMS);   /* 0: a scalar buffer */
    PS_ASSERT(ps_wire_dtype_size(dtype) != 0);
    msg->dtype = (ps_DType)dtype;
    copy_name(msg->name, sizeof msg->name, name);
    msg->shape_count = (pb_size_t)ndim;
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        PS_ASSERT(dims[i] >= 1);
        PS_ASSERT(!__builtin_mul_overflow(count, (size_t)dims[i], &count));
        msg->shape[i] = dims[i];
    }
    PS_ASSERT(count <= SIZE_MAX / ps_wire_dtype_size(dtype));
    msg->data.funcs.encode = tensor_data_encode;
    msg->data.arg = (void *)data; /* only read, in tensor_data_encode */
}

/* ---- repeated, encode side --------------------------------------------- */

static bool tensors_encode(pb_ostream_t *stream, const pb_field_t *field,
                           void *const *arg) {
    const ps_wire_named_list *l = *arg;
    for (size_t i = 0; i < l->n; i++) {
        const ps_wire_named *it = &l->items[i];
        ps_Tensor t = ps_Tensor_init_zero;
        ps_wire_tensor_encode_bind_typed(&t, it->name, it->ndim, it->dims, it->data, it->dtype);
        if (!pb_encode_tag_for_field(stream, field)) return false;
        if (!pb_encode_submessage(stream, ps_Tensor_fields, &t)) return false;
    }
    return true;
}

void ps_wire_tensors_encode_bind(pb_callback_t *cb, const ps_wire_named_list *list) {
    cb->funcs.encode = tensors_encode;
    cb->arg = (void *)list;
}

static bool params_encode(pb_ostream_t *stream, const pb_field_t *field,
                          void *const *arg) {
    const ps_wire_named_list *l = *arg;
    for (size_t i = 0; i < l->n; i++) {
        const ps_wire_named *it = &l->items[i];
        ps_ParameterInfo p = ps_ParameterInfo_init_zero;
        PS_ASSERT(it->ndim >= 0 && it->ndim <= PS_WIRE_MAX_DIMS);
        copy_name(p.name, sizeof p.name, it->name);
        copy_name(p.device, sizeof p.device, it->device);
        copy_name(p.stage, sizeof p.stage, it->stage);
        p.sparse = it->sparse != 0;
        p.buffer = it->buffer != 0;
        p.dtype = (ps_DType)it->dtype;
        p.row_offset = it->row_offset;
        p.rows_total = it->rows_total;
        p.shape_count = (pb_size_t)it->ndim;
        memcpy(p.shape, it->dims, (size_t)it->ndim * sizeof(int64_t));
        if (!pb_encode_tag_for_field(stream, field)) return false;
        if (!pb_encode_submessage(stream, ps_ParameterInfo_fields, &p)) return false;
    }
    return true;
}

void ps_wire_params_encode_bind(pb_callback_t *cb, const ps_wire_named_list *list) {
    cb->funcs.encode = params_encode;
    cb->arg = (void *)list;
}

/* ---- repeated, decode side --------------------------------------------- */

void ps_wire_tensor_list_init(ps_wire_tensor_list *l, size_t max_total_bytes) {
    memset(l, 0, sizeof *l);
    l->max_total_bytes = max_total_bytes;
}

void ps_wire_tensor_list_free(ps_wire_tensor_list *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) free(l->items[i].data);
    free(l->items);
    l->items = NULL;
    l->n = l->cap = 0;
    l->total_bytes = 0;
}

/* Grow *items (of elem bytes each) to hold one more; false on failure. */
static bool grow(void **items, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t ncap = *cap ? *cap * 2 : 8;
    if (ncap > SIZE_MAX / elem) return false;
    void *p = realloc(*items, ncap * elem);
    if (!p) return false;
    *items = p;
    *cap = ncap;
    return true;
}

static bool tensors_decode(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    ps_wire_tensor_list *l = *arg;
    const size_t overhead = sizeof(ps_wire_tensor);
    if (l->total_bytes > l->max_total_bytes ||
        l->max_total_bytes - l->total_bytes < overhead) {
        ps_err_set(l->err, PS_ERR_RESOURCE_EXHAUSTED,
                   "tensor list: more than %zu bytes after %zu tensors",
                   l->max_total_bytes, l->n);
        PB_RETURN_ERROR(stream, "tensor list over the size limit");
    }
    if (!grow((void **)&l->items, &l->cap, l->n, sizeof *l->items)) {
        ps_err_set(l->err, PS_ERR_RESOURCE_EXHAUSTED, "tensor list: out of memory");
        PB_RETURN_ERROR(stream, "out of memory for tensor list");
    }
    ps_Tensor msg = ps_Tensor_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, l->max_total_bytes - l->total_bytes - overhead);
    in.err = l->err;
    ps_wire_tensor_decode_bind(&msg, &in);
    if (!pb_decode(stream, ps_Tensor_fields, &msg)) {
        ps_wire_tensor_in_free(&in);
        return false;
    }
    char what[PS_WIRE_NAME_MAX + 48];
    snprintf(what, sizeof what, "tensor %zu (\"%s\")", l->n, msg.name);
    size_t esz = ps_wire_dtype_size(msg.dtype);
    if (msg.shape_count == 0 && esz && in.bytes == esz) {
        /* a scalar: a buffer such as num_batches_tracked (GetParameters) */
    } else if (ps_wire_tensor_check(&msg, &in, what, l->err) != PS_OK) {
        ps_wire_tensor_in_free(&in);
        PB_RETURN_ERROR(stream, "tensor shape does not match its data");
    }
    ps_wire_tensor *t = &l->items[l->n++];
    memcpy(t->name, msg.name, sizeof t->name);
    t->ndim = (int)msg.shape_count;
    memset(t->dims, 0, sizeof t->dims);
    memcpy(t->dims, msg.shape, msg.shape_count * sizeof(int64_t));
    t->dtype = (int)msg.dtype;
    t->data = in.data; /* ownership moves to the list */
    t->bytes = in.bytes;
    l->total_bytes += overhead + in.bytes;
    return true;
}

void ps_wire_tensors_decode_bind(pb_callback_t *cb, ps_wire_tensor_list *l) {
    cb->funcs.decode = tensors_decode;
    cb->arg = l;
}

void ps_wire_param_list_init(ps_wire_param_list *l, size_t max_items) {
    memset(l, 0, sizeof *l);
    l->max_items = max_items;
}

void ps_wire_param_list_free(ps_wire_param_list *l) {
    if (!l) return;
    free(l->items);
    l->items = NULL;
    l->n = l->cap = 0;
}

static bool params_decode(pb_istream_t *stream, const pb_field_t *field, void **arg) {
    (void)field;
    ps_wire_param_list *l = *arg;
    if (l->n >= l->max_items) {
        ps_err_set(l->err, PS_ERR_RESOURCE_EXHAUSTED,
                   "parameter list: more than %zu entries", l->max_items);
        PB_RETURN_ERROR(stream, "too many parameter infos");
    }
    if (!grow((void **)&l->items, &l->cap, l->n, sizeof *l->items)) {
        ps_err_set(l->err, PS_ERR_RESOURCE_EXHAUSTED, "parameter list: out of memory");
        PB_RETURN_ERROR(stream, "out of memory for parameter list");
    }
    ps_ParameterInfo p = ps_ParameterInfo_init_zero;
    if (!pb_decode(stream, ps_ParameterInfo_fields, &p)) return false;
    l->items[l->n++] = p;
    return true;
}

void ps_wire_params_decode_bind(pb_callback_t *cb, ps_wire_param_list *l) {
    cb->funcs.decode = params_decode;
    cb->arg = l;
}
