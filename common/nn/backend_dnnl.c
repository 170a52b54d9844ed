/* backend_dnnl.c - the oneDNN (2.6, CPU, C API) backend.
 *
 * Conv, max-pool, linear (inner product), relu (eltwise, dst-based
 * backward) and log-softmax run as oneDNN primitives; mul/add/sgd are
 * OpenMP loops (memory bound).
 *
 * Layouts: activations are plain (nchw, nc) or, where the model executor
 * asks for it, blocked with the channel block oneDNN itself picks on this
 * ISA (probe_block: nChw16c on AVX-512, nChw8c on AVX2 and SSE4.1; see
 * blocked_layout and backend.h). Convolutions take "any" for src, weights
 * and dst, so oneDNN picks the layouts its fastest kernel for the ISA
 * wants; the caller's activations and the plain master weights are
 * reordered into them where they differ (cached reorder primitives), and
 * outputs reordered back. Linear layers keep plain weights (oi), so the
 * large fc weights are never reordered. PS_DNNL_LAYOUT=plain in the
 * environment turns blocked layouts off (for comparison); =8 or =16
 * forces the block size.
 *
 * Fallback check: every primitive's implementation name is checked at
 * creation against kKindInfo; reference kernels of kinds that may not have
 * one are counted and described (ps_backend_fallbacks). On SSE4.1, where
 * oneDNN has no JIT backward-data convolution, the data gradient runs as
 * the equivalent forward convolution (conv_bwd_data_as_forward).
 *
 * Primitives are created once per distinct (kind, shape, bias?) key and
 * kept for the life of the backend in a mutex-protected array; creation
 * happens under that mutex, execution outside it. oneDNN allows one
 * primitive to execute concurrently from several threads with distinct
 * memory objects, so every call builds its own memory objects (wrapping the
 * caller's pointers), its own scratchpad (user-managed scratchpad mode; see
 * make_prim) and its own stream: a stream per call keeps threads fully
 * independent at the price of a few small allocations.
 *
 * Threads: when nthreads > 0 each op first calls omp_set_num_threads(), a
 * setting of the calling thread, so every caller gets nthreads OpenMP
 * threads for oneDNN - until a caller uses set_threads, from then on the
 * threads each calling thread set apply (the model executor sizes every
 * call). Memory is aligned_alloc(64) through a pool of freed buffers (see
 * "buffer pool" below); copies are memcpy.
 * Failed oneDNN calls become PS_ERR_INTERNAL naming the call (PS_DNNL_CHECK).
 */
#include "backend_impl.h"

#include <dnnl.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dnnl_check.h"

typedef enum {
    PK_CONV_FWD, PK_CONV_BWD_DATA, PK_CONV_BWD_WEIGHTS,
    PK_POOL_FWD_TRAINING, PK_POOL_FWD_INFERENCE, PK_POOL_BWD,
    PK_IP_FWD, PK_IP_BWD_DATA, PK_IP_BWD_WEIGHTS,
    PK_RELU_FWD, PK_RELU_BWD,
    PK_LOGSOFTMAX_FWD, PK_LOGSOFTMAX_BWD,
    PK_REORDER,
    PK_SOFTMAX_FWD, PK_SOFTMAX_BWD,
} prim_kind;

/* Everything a primitive depends on. Compared with memcmp: always build
 * from a zeroed value. dims: conv n,cin,h,w,cout,kh,kw,stride,pad; pool
 * n,c,h,w,k,stride; ip n,in,out; relu count; logsoftmax rows,cols. */
typedef struct prim_key {
    int32_t kind;
    int32_t bias;
    int32_t src_layout, dst_layout;  /* PS_LAYOUT_* of the activations */
    int64_t dims[9];
} prim_key;

#define PS_DNNL_MAX_CONV 3

/* An argument whose caller-side layout (user_md) differs from the one the
 * primitive chose (prim_md): inputs are reordered user -> prim before the
 * primitive runs, outputs prim -> user after. */
typedef struct arg_conv {
    int arg;                    /* DNNL_ARG_* */
    int output;
    dnnl_primitive_t reorder;
    size_t prim_bytes;
} arg_conv;

typedef struct prim_entry {
    prim_key key;
    dnnl_primitive_t prim;
    const char *impl;           /* oneDNN's implementation name (owned by prim) */
    int nconv;
    arg_conv conv[PS_DNNL_MAX_CONV];
} prim_entry;

#define PS_DNNL_MAX_FALLBACKS 16  /* descriptions kept; the count goes on */

typedef struct dn_impl {
    dnnl_engine_t engine;
    int nthreads;
    int block;              /* blocked layout's channel block: 16, 8 or 0 (none) */
    int caller_threads;     /* __atomic: set_threads was used; ops keep the caller's count */
    pthread_mutex_t lock;   /* guards cache, len, cap, nfallback, fallback */
    prim_entry **cache;     /* entries never move: callers keep pointers */
    size_t len, cap;
    pthread_mutex_t pool_lock; /* guards pool, pool_bytes */
    struct pool_buf *pool;  /* freed buffers kept for reuse (pool_get/pool_put) */
    size_t pool_bytes;
    int nfallback;          /* primitives created with a disallowed reference kernel */
    char fallback[PS_DNNL_MAX_FALLBACKS][160]; /* the first ones, described */
} dn_impl;

/* ---- the fallback check ----
 * Which primitive kinds may run oneDNN's reference (plain C) kernels. The
 * hot paths of a training step may not: a reference convolution or pooling
 * is 10-100x slower than the JIT kernel and dominates the step. Tiny ops
 * (log-softmax of 10 classes) and memory-bound reorders may. Adding a kind
 * is adding a row. */
typedef struct prim_kind_info {
    const char *name;
    int may_ref;
} prim_kind_info;

static const prim_kind_info kKindInfo[] = {
    [PK_CONV_FWD] = { "convolution forward", 0 },
    [PK_CONV_BWD_DATA] = { "convolution backward data", 0 },
    [PK_CONV_BWD_WEIGHTS] = { "convolution backward weights", 0 },
    [PK_POOL_FWD_TRAINING] = { "max-pool forward (training)", 0 },
    [PK_POOL_FWD_INFERENCE] = { "max-pool forward (inference)", 0 },
    [PK_POOL_BWD] = { "max-pool backward", 0 },
    [PK_IP_FWD] = { "inner product forward", 0 },
    [PK_IP_BWD_DATA] = { "inner product backward data", 0 },
    [PK_IP_BWD_WEIGHTS] = { "inner product backward weights", 0 },
    [PK_RELU_FWD] = { "relu forward", 0 },
    [PK_RELU_BWD] = { "relu backward", 0 },
    [PK_LOGSOFTMAX_FWD] = { "log-softmax forward", 1 },
    [PK_LOGSOFTMAX_BWD] = { "log-softmax backward", 1 },
    [PK_REORDER] = { "reorder", 1 },
    [PK_SOFTMAX_FWD] = { "softmax forward", 0 },  /* a language model's vocabulary: not tiny */
    [PK_SOFTMAX_BWD] = { "softmax backward", 1 },
};

/* 1 when oneDNN's implementation string names a reference kernel: "ref:any",
 * "gemm:ref", or the plain C loops ("simple_nchw:any"); JIT kernels
 * ("jit:avx2", "x64:gemm:jit", "brgconv:avx512_core") are not. */
static int impl_is_reference(const char *impl) {
    if (!impl || strstr(impl, "ref") || !strncmp(impl, "simple", 6)) return 1;
    return !strstr(impl, "jit") && !strstr(impl, "brg");
}

/* A candidate for arg_conv: the argument and the layout of the caller's buffer. */
typedef struct user_arg {
    int arg;
    int output;
    dnnl_memory_desc_t md;
} user_arg;

/* ---- buffer pool ----
 * A training step allocates and frees the same few MB of activations,
 * workspaces, scratchpads and reorder buffers every batch. Through plain
 * malloc, buffers that large are fresh mmaps each time, and the kernel
 * zero-fills every page on first touch (an AVX2 step on 2 threads went
 * from 1575 to 2181 samples/s with glibc told to keep them). The backend
 * keeps freed buffers of at least PS_POOL_MIN bytes, by exact size, up to
 * PS_POOL_CAP bytes in all, and hands them out again; beyond the cap they
 * are freed. The cap holds a batch-32 step's working set (~20 MB) a few
 * times over and stays small beside psd's memory: test_faults expects
 * psd's RSS to come back after a dead trainer's contexts expire, which a
 * 256 MB cap broke. Each buffer carries a 64-byte header with its size. */
#define PS_POOL_MIN ((size_t)64 << 10)
#define PS_POOL_CAP ((size_t)64 << 20)
#define PS_POOL_HDR 64

typedef struct pool_buf {
    struct pool_buf *next;
    size_t size;        /* usable bytes after the header, a multiple of 64 */
} pool_buf;

static void *pool_get(dn_impl *im, size_t bytes) {
    size_t size = (bytes + 63) & ~(size_t)63;
    if (size < bytes || size > SIZE_MAX - PS_POOL_HDR) return NULL;
    if (size == 0) size = 64;
    if (size >= PS_POOL_MIN) {
        pthread_mutex_lock(&im->pool_lock);
        for (pool_buf **pp = &im->pool; *pp; pp = &(*pp)->next)
            if ((*pp)->size == size) {
                pool_buf *b = *pp;
                *pp = b->next;
                im->pool_bytes -= size;
                pthread_mutex_unlock(&im->pool_lock);
                return (char *)b + PS_POOL_HDR;
            }
        pthread_mutex_unlock(&im->pool_lock);
    }
    pool_buf *b = aligned_alloc(64, size + PS_POOL_HDR);
    if (!b) return NULL;
    b->size = size;
    return (char *)b + PS_POOL_HDR;
}

static void pool_put(dn_impl *im, void *p) {
    if (!p) return;
    pool_buf *b = (pool_buf *)((char *)p - PS_POOL_HDR);
    if (b->size >= PS_POOL_MIN) {
        pthread_mutex_lock(&im->pool_lock);
        if (im->pool_bytes + b->size <= PS_POOL_CAP) {
            b->next = im->pool;
            im->pool = b;
            im->pool_bytes += b->size;
            pthread_mutex_unlock(&im->pool_lock);
            return;
        }
        pthread_mutex_unlock(&im->pool_lock);
    }
    free(b);
}

/* ---- primitive creation ---- */

static ps_status md_plain(dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                          dnnl_format_tag_t tag, ps_err *err) {
    dnnl_dims_t d;
    for (int i = 0; i < ndims; i++) d[i] = dims[i];
    PS_DNNL_CHECK(dnnl_memory_desc_init_by_tag(md, ndims, d, dnnl_f32, tag));
    return PS_OK;
}

static dnnl_format_tag_t act_tag(int block, int layout) {
    if (layout != PS_LAYOUT_BLOCKED) return dnnl_nchw;
    return block == 16 ? dnnl_nChw16c : dnnl_nChw8c;
}

static ps_status prim_from_pd(dnnl_primitive_desc_t pd, dnnl_primitive_t *prim, ps_err *err) {
    PS_DNNL_CHECK(dnnl_primitive_create(prim, pd));
    return PS_OK;
}

static ps_status make_prim_attr(dnnl_engine_t eng, const_dnnl_op_desc_t op_desc,
                                const_dnnl_primitive_desc_t hint, dnnl_primitive_attr_t attr,
                                dnnl_primitive_t *prim, ps_err *err) {
    dnnl_primitive_desc_t pd;
    PS_DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    PS_DNNL_CHECK(dnnl_primitive_desc_create(&pd, op_desc, attr, eng, hint));
    ps_status st = prim_from_pd(pd, prim, err);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* Primitive for op_desc (hint: the forward pd for backward primitives).
 * The scratchpad is user-managed: a primitive's own (library-managed)
 * scratchpad is shared by all its executions, which would race when
 * several threads run one cached primitive (unless oneDNN was built with
 * DNNL_ENABLE_CONCURRENT_EXEC, which Debian's is not). */
static ps_status make_prim(dnnl_engine_t eng, const_dnnl_op_desc_t op_desc,
                           const_dnnl_primitive_desc_t hint, dnnl_primitive_t *prim, ps_err *err) {
    dnnl_primitive_attr_t attr;
    PS_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    ps_status st = make_prim_attr(eng, op_desc, hint, attr, prim, err);
    dnnl_primitive_attr_destroy(attr);
    return st;
}

/* Backward primitive: create the forward pd as hint, then op_desc. */
static ps_status make_bwd_prim(dnnl_engine_t eng, const_dnnl_op_desc_t fwd_desc,
                               const_dnnl_op_desc_t op_desc, dnnl_primitive_t *prim, ps_err *err) {
    dnnl_primitive_desc_t hint;
    PS_DNNL_CHECK(dnnl_primitive_desc_create(&hint, fwd_desc, NULL, eng, NULL));
    ps_status st = make_prim(eng, op_desc, hint, prim, err);
    dnnl_primitive_desc_destroy(hint);
    return st;
}

/* Convolutions take "any" for every tensor: oneDNN picks the layouts its
 * fastest kernel for this ISA wants (a fixed layout can leave only the
 * reference kernel: conv1's weight gradient with plain src and nChw8c
 * diff_dst is ref:any on AVX2). The caller's layouts (ua) are reordered to
 * and from the chosen ones where they differ (entry_create). */
static ps_status create_conv(dnnl_engine_t eng, int block, const prim_key *k, dnnl_primitive_t *prim,
                             user_arg *ua, int *nua, ps_err *err) {
    const int64_t *d = k->dims; /* n,cin,h,w,cout,kh,kw,stride,pad */
    const int64_t oh = (d[2] + 2 * d[8] - d[5]) / d[7] + 1, ow = (d[3] + 2 * d[8] - d[6]) / d[7] + 1;
    const int64_t xd[4] = { d[0], d[1], d[2], d[3] }, wd[4] = { d[4], d[1], d[5], d[6] };
    const int64_t yd[4] = { d[0], d[4], oh, ow }, bd[1] = { d[4] };
    dnnl_memory_desc_t x, w, b, y, xuser, wuser, yuser;
    ps_status st;
    if ((st = md_plain(&xuser, 4, xd, act_tag(block, k->src_layout), err)) ||
        (st = md_plain(&wuser, 4, wd, dnnl_oihw, err)) ||
        (st = md_plain(&yuser, 4, yd, act_tag(block, k->dst_layout), err)) ||
        (st = md_plain(&x, 4, xd, dnnl_format_tag_any, err)) ||
        (st = md_plain(&w, 4, wd, dnnl_format_tag_any, err)) ||
        (st = md_plain(&b, 1, bd, dnnl_a, err)) ||
        (st = md_plain(&y, 4, yd, dnnl_format_tag_any, err)))
        return st;
    /* The caller's side of each argument: (arg, output?, layout). */
    const user_arg fwd_ua[3] = { { DNNL_ARG_SRC, 0, xuser }, { DNNL_ARG_WEIGHTS, 0, wuser },
                                 { DNNL_ARG_DST, 1, yuser } };
    const user_arg bwd_data_ua[3] = { { DNNL_ARG_DIFF_DST, 0, yuser }, { DNNL_ARG_WEIGHTS, 0, wuser },
                                      { DNNL_ARG_DIFF_SRC, 1, xuser } };
    const user_arg bwd_w_ua[3] = { { DNNL_ARG_SRC, 0, xuser }, { DNNL_ARG_DIFF_DST, 0, yuser },
                                   { DNNL_ARG_DIFF_WEIGHTS, 1, wuser } };
    const user_arg *src_ua = k->kind == PK_CONV_FWD ? fwd_ua
                           : k->kind == PK_CONV_BWD_DATA ? bwd_data_ua : bwd_w_ua;
    memcpy(ua, src_ua, sizeof fwd_ua);
    *nua = 3;
    dnnl_dims_t strides = { d[7], d[7] }, pad = { d[8], d[8] };
    dnnl_convolution_desc_t fwd, bwd;
    PS_DNNL_CHECK(dnnl_convolution_forward_desc_init(&fwd, dnnl_forward_training,
                  dnnl_convolution_direct, &x, &w, k->bias ? &b : NULL, &y, strides, pad, pad));
    switch (k->kind) {
    case PK_CONV_FWD:
        return make_prim(eng, &fwd, NULL, prim, err);
    case PK_CONV_BWD_DATA:
        PS_DNNL_CHECK(dnnl_convolution_backward_data_desc_init(&bwd, dnnl_convolution_direct,
                      &x, &w, &y, strides, pad, pad));
        return make_bwd_prim(eng, &fwd, &bwd, prim, err);
    default:
        PS_DNNL_CHECK(dnnl_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct,
                      &x, &w, k->bias ? &b : NULL, &y, strides, pad, pad));
        return make_bwd_prim(eng, &fwd, &bwd, prim, err);
    }
}

static ps_status create_pool(dnnl_engine_t eng, int block, const prim_key *k, dnnl_primitive_t *prim,
                             ps_err *err) {
    const int64_t *d = k->dims; /* n,c,h,w,k,stride */
    const int64_t xd[4] = { d[0], d[1], d[2], d[3] };
    const int64_t yd[4] = { d[0], d[1], (d[2] - d[4]) / d[5] + 1, (d[3] - d[4]) / d[5] + 1 };
    dnnl_memory_desc_t x, y;
    ps_status st;
    if ((st = md_plain(&x, 4, xd, act_tag(block, k->src_layout), err)) ||
        (st = md_plain(&y, 4, yd, act_tag(block, k->src_layout), err)))
        return st;
    /* No padding; oneDNN's shape check floors like PyTorch's floor mode. */
    dnnl_dims_t strides = { d[5], d[5] }, kernel = { d[4], d[4] }, pad = { 0, 0 };
    dnnl_pooling_desc_t fwd, bwd;
    PS_DNNL_CHECK(dnnl_pooling_forward_desc_init(&fwd,
                  k->kind == PK_POOL_FWD_INFERENCE ? dnnl_forward_inference : dnnl_forward_training,
                  dnnl_pooling_max, &x, &y, strides, kernel, pad, pad));
    if (k->kind != PK_POOL_BWD) return make_prim(eng, &fwd, NULL, prim, err);
    PS_DNNL_CHECK(dnnl_pooling_backward_desc_init(&bwd, dnnl_pooling_max, &x, &y, strides, kernel,
                                                  pad, pad));
    return make_bwd_prim(eng, &fwd, &bwd, prim, err);
}

static ps_status create_ip(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim,
                           ps_err *err) {
    const int64_t *d = k->dims; /* n,in,out */
    const int64_t xd[2] = { d[0], d[1] }, wd[2] = { d[2], d[1] }, yd[2] = { d[0], d[2] };
    const int64_t bd[1] = { d[2] };
    dnnl_memory_desc_t x, w, b, y;
    ps_status st;
    if ((st = md_plain(&x, 2, xd, dnnl_nc, err)) || (st = md_plain(&w, 2, wd, dnnl_oi, err)) ||
        (st = md_plain(&b, 1, bd, dnnl_a, err)) || (st = md_plain(&y, 2, yd, dnnl_nc, err)))
        return st;
    dnnl_inner_product_desc_t fwd, bwd;
    PS_DNNL_CHECK(dnnl_inner_product_forward_desc_init(&fwd, dnnl_forward_training, &x, &w,
                                                       k->bias ? &b : NULL, &y));
    switch (k->kind) {
    case PK_IP_FWD:
        return make_prim(eng, &fwd, NULL, prim, err);
    case PK_IP_BWD_DATA:
        PS_DNNL_CHECK(dnnl_inner_product_backward_data_desc_init(&bwd, &x, &w, &y));
        return make_bwd_prim(eng, &fwd, &bwd, prim, err);
    default:
        PS_DNNL_CHECK(dnnl_inner_product_backward_weights_desc_init(&bwd, &x, &w,
                                                                    k->bias ? &b : NULL, &y));
        return make_bwd_prim(eng, &fwd, &bwd, prim, err);
    }
}

static ps_status create_relu(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim,
                             ps_err *err) {
    dnnl_memory_desc_t md;
    ps_status st = md_plain(&md, 1, k->dims, dnnl_a, err);
    if (st) return st;
    /* dst-based backward: dx = dy where y > 0, which is the contract. */
    dnnl_eltwise_desc_t fwd, bwd;
    PS_DNNL_CHECK(dnnl_eltwise_forward_desc_init(&fwd, dnnl_forward_training,
                                                 dnnl_eltwise_relu_use_dst_for_bwd, &md, 0.f, 0.f));
    if (k->kind == PK_RELU_FWD) return make_prim(eng, &fwd, NULL, prim, err);
    PS_DNNL_CHECK(dnnl_eltwise_backward_desc_init(&bwd, dnnl_eltwise_relu_use_dst_for_bwd, &md, &md,
                                                  0.f, 0.f));
    return make_bwd_prim(eng, &fwd, &bwd, prim, err);
}

static ps_status create_logsoftmax(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim,
                                   ps_err *err) {
    dnnl_memory_desc_t md;
    ps_status st = md_plain(&md, 2, k->dims, dnnl_nc, err);
    if (st) return st;
    dnnl_logsoftmax_desc_t fwd, bwd;
    PS_DNNL_CHECK(dnnl_logsoftmax_forward_desc_init(&fwd, dnnl_forward_training, &md, 1));
    if (k->kind == PK_LOGSOFTMAX_FWD) return make_prim(eng, &fwd, NULL, prim, err);
    PS_DNNL_CHECK(dnnl_logsoftmax_backward_desc_init(&bwd, &md, &md, 1));
    return make_bwd_prim(eng, &fwd, &bwd, prim, err);
}

static ps_status create_softmax(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim,
                                ps_err *err) {
    dnnl_memory_desc_t md;
    ps_status st = md_plain(&md, 2, k->dims, dnnl_nc, err);
    if (st) return st;
    dnnl_softmax_desc_t fwd, bwd;
    PS_DNNL_CHECK(dnnl_softmax_forward_desc_init(&fwd, dnnl_forward_training, &md, 1));
    if (k->kind == PK_SOFTMAX_FWD) return make_prim(eng, &fwd, NULL, prim, err);
    PS_DNNL_CHECK(dnnl_softmax_backward_desc_init(&bwd, &md, &md, 1));
    return make_bwd_prim(eng, &fwd, &bwd, prim, err);
}

/* Reorder from src to dst (user-managed scratchpad, like every primitive). */
static ps_status make_reorder(dnnl_engine_t eng, const dnnl_memory_desc_t *src, const dnnl_memory_desc_t *dst,
                              dnnl_primitive_t *prim, ps_err *err) {
    dnnl_primitive_attr_t attr;
    dnnl_primitive_desc_t pd;
    PS_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    dnnl_status_t s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success) s = dnnl_reorder_primitive_desc_create(&pd, src, eng, dst, eng, attr);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success)
        return ps_err_set(err, PS_ERR_INTERNAL, "%s:%d: dnnl_reorder_primitive_desc_create failed: status %d",
                          __FILE__, __LINE__, (int)s);
    ps_status st = prim_from_pd(pd, prim, err);
    dnnl_primitive_desc_destroy(pd);
    return st;
}

/* Activation reorder between layouts; dims n,c,h,w. */
static ps_status create_act_reorder(dnnl_engine_t eng, int block, const prim_key *k, dnnl_primitive_t *prim,
                                    ps_err *err) {
    dnnl_memory_desc_t src, dst;
    ps_status st;
    if ((st = md_plain(&src, 4, k->dims, act_tag(block, k->src_layout), err)) ||
        (st = md_plain(&dst, 4, k->dims, act_tag(block, k->dst_layout), err)))
        return st;
    return make_reorder(eng, &src, &dst, prim, err);
}

static ps_status create_prim(dnnl_engine_t eng, int block, const prim_key *k, dnnl_primitive_t *prim,
                             user_arg *ua, int *nua, ps_err *err) {
    *nua = 0;
    switch ((prim_kind)k->kind) {
    case PK_CONV_FWD: case PK_CONV_BWD_DATA: case PK_CONV_BWD_WEIGHTS:
        return create_conv(eng, block, k, prim, ua, nua, err);
    case PK_POOL_FWD_TRAINING: case PK_POOL_FWD_INFERENCE: case PK_POOL_BWD:
        return create_pool(eng, block, k, prim, err);
    case PK_REORDER:
        return create_act_reorder(eng, block, k, prim, err);
    case PK_IP_FWD: case PK_IP_BWD_DATA: case PK_IP_BWD_WEIGHTS:
        return create_ip(eng, k, prim, err);
    case PK_RELU_FWD: case PK_RELU_BWD:
        return create_relu(eng, k, prim, err);
    case PK_LOGSOFTMAX_FWD: case PK_LOGSOFTMAX_BWD:
        return create_logsoftmax(eng, k, prim, err);
    case PK_SOFTMAX_FWD: case PK_SOFTMAX_BWD:
        return create_softmax(eng, k, prim, err);
    }
    return ps_err_set(err, PS_ERR_INTERNAL, "dnnl: unknown primitive kind %d", (int)k->kind);
}

static void entry_free(prim_entry *e) {
    if (!e) return;
    if (e->prim) dnnl_primitive_destroy(e->prim);
    for (int i = 0; i < e->nconv; i++)
        if (e->conv[i].reorder) dnnl_primitive_destroy(e->conv[i].reorder);
    free(e);
}

/* Record a disallowed reference kernel for k (called under im->lock, once
 * per primitive since primitives are cached). */
static void check_fallback(dn_impl *im, const prim_key *k, const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success) impl = NULL;
    const prim_kind_info *ki = &kKindInfo[k->kind];
    if (ki->may_ref || !impl_is_reference(impl)) return;
    if (im->nfallback < PS_DNNL_MAX_FALLBACKS) {
        char dims[96] = "";
        size_t len = 0;
        for (int i = 0; i < 9 && k->dims[i] && len < sizeof dims; i++)
            len += (size_t)snprintf(dims + len, sizeof dims - len, "%s%lld", i ? "," : "",
                                    (long long)k->dims[i]);
        snprintf(im->fallback[im->nfallback], sizeof im->fallback[0], "%s [%s]%s: %s", ki->name, dims,
                 k->src_layout || k->dst_layout ? " (blocked)" : "", impl ? impl : "(unknown)");
    }
    im->nfallback++;
}

/* Build the entry for k: the primitive plus a reorder for every argument
 * whose caller-side layout differs from the primitive's. */
static ps_status entry_create(dn_impl *im, const prim_key *k, prim_entry **out, ps_err *err) {
    prim_entry *e = calloc(1, sizeof *e);
    if (!e) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl: primitive cache: out of memory");
    e->key = *k;
    user_arg ua[PS_DNNL_MAX_CONV];
    int nua = 0;
    ps_status st = create_prim(im->engine, im->block, k, &e->prim, ua, &nua, err);
    const_dnnl_primitive_desc_t pd = NULL;
    if (st == PS_OK && dnnl_primitive_get_primitive_desc(e->prim, &pd) != dnnl_success)
        st = ps_err_set(err, PS_ERR_INTERNAL, "dnnl: dnnl_primitive_get_primitive_desc failed");
    if (st == PS_OK) {
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &e->impl) != dnnl_success) e->impl = NULL;
        check_fallback(im, k, pd);
    }
    for (int i = 0; i < nua && st == PS_OK; i++) {
        const dnnl_memory_desc_t *pmd = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, ua[i].arg);
        if (!pmd || pmd->ndims == 0) {
            st = ps_err_set(err, PS_ERR_INTERNAL, "dnnl: primitive has no argument %d", ua[i].arg);
            break;
        }
        if (dnnl_memory_desc_equal(pmd, &ua[i].md)) continue;
        arg_conv *c = &e->conv[e->nconv++];
        c->arg = ua[i].arg;
        c->output = ua[i].output;
        c->prim_bytes = dnnl_memory_desc_get_size(pmd);
        st = ua[i].output ? make_reorder(im->engine, pmd, &ua[i].md, &c->reorder, err)
                          : make_reorder(im->engine, &ua[i].md, pmd, &c->reorder, err);
    }
    if (st != PS_OK) { entry_free(e); return st; }
    *out = e;
    return PS_OK;
}

/* The cached entry for k, created on first use. */
static ps_status get_entry(dn_impl *im, const prim_key *k, const prim_entry **out, ps_err *err) {
    ps_status st = PS_OK;
    pthread_mutex_lock(&im->lock);
    for (size_t i = 0; i < im->len; i++)
        if (memcmp(&im->cache[i]->key, k, sizeof *k) == 0) {
            *out = im->cache[i];
            pthread_mutex_unlock(&im->lock);
            return PS_OK;
        }
    if (im->len == im->cap) {
        size_t cap = im->cap ? 2 * im->cap : 16;
        prim_entry **c = realloc(im->cache, cap * sizeof *c);
        if (!c) {
            pthread_mutex_unlock(&im->lock);
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl: primitive cache: out of memory");
        }
        im->cache = c;
        im->cap = cap;
    }
    prim_entry *e = NULL;
    st = entry_create(im, k, &e, err);
    if (st == PS_OK) {
        im->cache[im->len++] = e;
        *out = e;
    }
    pthread_mutex_unlock(&im->lock);
    return st;
}

static ps_status get_prim(dn_impl *im, const prim_key *k, dnnl_primitive_t *prim, ps_err *err) {
    const prim_entry *e;
    ps_status st = get_entry(im, k, &e, err);
    if (st == PS_OK) *prim = e->prim;
    return st;
}

static prim_key key_make(prim_kind kind, int bias, int ndims, const int64_t *dims) {
    prim_key k;
    memset(&k, 0, sizeof k);
    k.kind = kind;
    k.bias = bias;
    for (int i = 0; i < ndims; i++) k.dims[i] = dims[i];
    return k;
}

static prim_key conv_key(prim_kind kind, const ps_conv_desc *d, int bias) {
    const int64_t dims[9] = { d->n, d->cin, d->h, d->w, d->cout, d->kh, d->kw, d->stride, d->pad };
    prim_key k = key_make(kind, bias, 9, dims);
    k.src_layout = d->src_layout == PS_LAYOUT_BLOCKED;
    k.dst_layout = d->dst_layout == PS_LAYOUT_BLOCKED;
    return k;
}

static prim_key pool_key(prim_kind kind, const ps_pool_desc *d) {
    const int64_t dims[6] = { d->n, d->c, d->h, d->w, d->k, d->stride };
    prim_key k = key_make(kind, 0, 6, dims);
    k.src_layout = k.dst_layout = d->layout == PS_LAYOUT_BLOCKED;
    return k;
}

static prim_key ip_key(prim_kind kind, const ps_linear_desc *d, int bias) {
    const int64_t dims[3] = { d->n, d->in, d->out };
    return key_make(kind, bias, 3, dims);
}

/* ---- execution ---- */

typedef struct exec_arg {
    int arg;            /* DNNL_ARG_* */
    const void *ptr;    /* caller's buffer; written only for outputs */
} exec_arg;

#define PS_DNNL_MAX_ARGS 6

/* What one execution allocates; released by run() whatever happened. */
typedef struct exec_res {
    dnnl_memory_t mem[PS_DNNL_MAX_ARGS + 1];  /* + scratchpad */
    void *scratch;
    dnnl_stream_t stream;
} exec_res;

static ps_status exec_inner(dn_impl *im, dnnl_primitive_t prim, const exec_arg *a, int n,
                            exec_res *r, ps_err *err) {
    const_dnnl_primitive_desc_t pd;
    dnnl_exec_arg_t args[PS_DNNL_MAX_ARGS + 1];
    PS_DNNL_CHECK(dnnl_primitive_get_primitive_desc(prim, &pd));
    for (int i = 0; i < n; i++) {
        const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, a[i].arg);
        if (!md || md->ndims == 0)
            return ps_err_set(err, PS_ERR_INTERNAL, "dnnl: primitive has no argument %d", a[i].arg);
        PS_DNNL_CHECK(dnnl_memory_create(&r->mem[i], md, im->engine, (void *)a[i].ptr));
        args[i].arg = a[i].arg;
        args[i].memory = r->mem[i];
    }
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t ssize = smd ? dnnl_memory_desc_get_size(smd) : 0;
    if (ssize > 0) {
        r->scratch = pool_get(im, ssize);
        if (!r->scratch)
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl: scratchpad of %zu bytes", ssize);
        PS_DNNL_CHECK(dnnl_memory_create(&r->mem[n], smd, im->engine, r->scratch));
        args[n].arg = DNNL_ARG_SCRATCHPAD;
        args[n].memory = r->mem[n];
        n++;
    }
    PS_DNNL_CHECK(dnnl_stream_create(&r->stream, im->engine, dnnl_stream_default_flags));
    PS_DNNL_CHECK(dnnl_primitive_execute(prim, r->stream, n, args));
    PS_DNNL_CHECK(dnnl_stream_wait(r->stream));
    return PS_OK;
}

/* Execute prim on the given buffers (memory objects, scratchpad and stream
 * of this call only). */
static ps_status exec_prim(dn_impl *im, dnnl_primitive_t prim, const exec_arg *a, int n, ps_err *err) {
    exec_res r;
    memset(&r, 0, sizeof r);
    ps_status st = exec_inner(im, prim, a, n, &r, err);
    for (int i = 0; i <= n; i++)
        if (r.mem[i]) dnnl_memory_destroy(r.mem[i]);
    pool_put(im, r.scratch);
    if (r.stream) dnnl_stream_destroy(r.stream);
    return st;
}

/* Run the cached primitive for k on the caller's buffers, reordering the
 * arguments whose layout the primitive chose itself (conv weights). */
static ps_status run(dn_impl *im, const prim_key *k, const exec_arg *a, int n, ps_err *err) {
    const prim_entry *e;
    ps_status st = get_entry(im, k, &e, err);
    if (st) return st;
    if (e->nconv == 0) return exec_prim(im, e->prim, a, n, err);
    exec_arg aa[PS_DNNL_MAX_ARGS];
    void *tmp[PS_DNNL_MAX_CONV] = {0};
    int at[PS_DNNL_MAX_CONV];
    memcpy(aa, a, (size_t)n * sizeof *a);
    for (int c = 0; c < e->nconv && st == PS_OK; c++) {
        const arg_conv *cv = &e->conv[c];
        at[c] = -1;
        for (int i = 0; i < n; i++)
            if (aa[i].arg == cv->arg) at[c] = i;
        if (at[c] < 0) continue;
        tmp[c] = pool_get(im, cv->prim_bytes);
        if (!tmp[c]) { st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl: %zu bytes for a reorder", cv->prim_bytes); break; }
        if (!cv->output) {
            exec_arg ra[2] = { { DNNL_ARG_FROM, aa[at[c]].ptr }, { DNNL_ARG_TO, tmp[c] } };
            st = exec_prim(im, cv->reorder, ra, 2, err);
        }
        aa[at[c]].ptr = tmp[c];
    }
    if (st == PS_OK) st = exec_prim(im, e->prim, aa, n, err);
    for (int c = 0; c < e->nconv && st == PS_OK; c++) {
        const arg_conv *cv = &e->conv[c];
        if (at[c] < 0 || !cv->output) continue;
        exec_arg ra[2] = { { DNNL_ARG_FROM, tmp[c] }, { DNNL_ARG_TO, a[at[c]].ptr } };
        st = exec_prim(im, cv->reorder, ra, 2, err);
    }
    for (int c = 0; c < e->nconv; c++) pool_put(im, tmp[c]);
    return st;
}

static void set_threads(dn_impl *im) {
    if (im->nthreads > 0 && !__atomic_load_n(&im->caller_threads, __ATOMIC_RELAXED))
        omp_set_num_threads(im->nthreads);
}

static void dn_set_threads(void *impl, int n) {
    dn_impl *im = impl;
    __atomic_store_n(&im->caller_threads, 1, __ATOMIC_RELAXED);
    omp_set_num_threads(n > 0 ? n : 1);
}

/* ---- lifecycle and memory ---- */

/* The activation block oneDNN itself picks on this ISA: the layout of the
 * output a direct convolution chooses with "any" layouts, for a shape like
 * the model's conv2 (3x3, 32 -> 64 channels, 26x26, batch 32). nChw16c on
 * AVX-512, nChw8c on AVX2 and SSE4.1 (oneDNN 2.6); 0 when it picks a plain
 * layout or the query fails. Convolutions reorder whatever they get to what
 * they choose (create_conv), so this is a speed choice, not a contract. */
static int probe_block(dnnl_engine_t eng) {
    dnnl_memory_desc_t x, w, y;
    dnnl_dims_t xd = { 32, 32, 26, 26 }, wd = { 64, 32, 3, 3 }, yd = { 32, 64, 24, 24 };
    dnnl_dims_t strides = { 1, 1 }, pad = { 0, 0 };
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd;
    if (dnnl_memory_desc_init_by_tag(&x, 4, xd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&w, 4, wd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_memory_desc_init_by_tag(&y, 4, yd, dnnl_f32, dnnl_format_tag_any) != dnnl_success ||
        dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct, &x, &w,
                                           NULL, &y, strides, pad, pad) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &cd, NULL, eng, NULL) != dnnl_success)
        return 0;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    int block = 0;
    if (md && md->format_kind == dnnl_blocked && md->format_desc.blocking.inner_nblks == 1 &&
        md->format_desc.blocking.inner_idxs[0] == 1)
        block = (int)md->format_desc.blocking.inner_blks[0];
    dnnl_primitive_desc_destroy(pd);
    return block;
}

const char *ps_backend_dnnl_isa(void) {
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
    }
}

int ps_backend_dnnl_fallbacks(void *impl, char *buf, size_t size) {
    dn_impl *im = impl;
    pthread_mutex_lock(&im->lock);
    int n = im->nfallback;
    if (buf && size) {
        size_t len = 0;
        buf[0] = 0;
        for (int i = 0; i < n && i < PS_DNNL_MAX_FALLBACKS && len < size; i++)
            len += (size_t)snprintf(buf + len, size - len, "%s\n", im->fallback[i]);
        if (n > PS_DNNL_MAX_FALLBACKS && len < size)
            snprintf(buf + len, size - len, "(and %d more)\n", n - PS_DNNL_MAX_FALLBACKS);
    }
    pthread_mutex_unlock(&im->lock);
    return n;
}

static ps_status dn_init(void **impl, int device, int nthreads, ps_err *err) {
    (void)device;
    dn_impl *im = calloc(1, sizeof *im);
    if (!im) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl: out of memory");
    dnnl_status_t s = dnnl_engine_create(&im->engine, dnnl_cpu, 0);
    if (s != dnnl_success) {
        free(im);
        return ps_err_set(err, PS_ERR_INTERNAL, "%s:%d: dnnl_engine_create(cpu, 0) failed: status %d",
                          __FILE__, __LINE__, (int)s);
    }
    im->nthreads = nthreads;
    im->block = probe_block(im->engine);
    const char *lay = getenv("PS_DNNL_LAYOUT");
    if (lay && !strcmp(lay, "plain")) im->block = 0;
    else if (lay && !strcmp(lay, "8")) im->block = 8;
    else if (lay && !strcmp(lay, "16")) im->block = 16;
    pthread_mutex_init(&im->lock, NULL);
    pthread_mutex_init(&im->pool_lock, NULL);
    *impl = im;
    return PS_OK;
}

static void dn_destroy(void *impl) {
    dn_impl *im = impl;
    if (!im) return;
    for (size_t i = 0; i < im->len; i++) entry_free(im->cache[i]);
    free(im->cache);
    while (im->pool) {
        pool_buf *b = im->pool;
        im->pool = b->next;
        free(b);
    }
    pthread_mutex_destroy(&im->pool_lock);
    pthread_mutex_destroy(&im->lock);
    dnnl_engine_destroy(im->engine);
    free(im);
}

static void *dn_alloc(void *impl, size_t bytes) {
    return pool_get(impl, bytes);
}

static void dn_free(void *impl, void *p) { pool_put(impl, p); }

static ps_status dn_copy(void *impl, void *dst, const void *src, size_t bytes, ps_err *err) {
    (void)impl; (void)err;
    if (bytes) memcpy(dst, src, bytes);
    return PS_OK;
}

/* ---- ops ---- */

static ps_status dn_conv2d_forward_sq(void *impl, const ps_conv_desc *d, const float *x,
                                     const float *w, const float *b, float *y, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    prim_key k = conv_key(PK_CONV_FWD, d, b != NULL);
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_WEIGHTS, w }, { DNNL_ARG_DST, y },
                     { DNNL_ARG_BIAS, b } };
    return run(im, &k, a, b ? 4 : 3, err);
}

/* The data gradient of a stride-1 convolution is itself a forward
 * convolution: dx = conv(dy, W') with W'[i][o][a][b] = W[o][i][k-1-a][k-1-b]
 * (in and out channels swapped, kernel rotated 180 degrees) and padding
 * k-1-pad. oneDNN 2.6 has no SSE4.1 JIT kernel for backward data (it runs
 * im2col + GEMM, 1.5x the time of the JIT forward kernel for the same
 * FLOPs), but has a forward one. The forward descriptor of that equivalent
 * convolution. */
static ps_conv_desc bwd_data_fwd_desc(const ps_conv_desc *d) {
    ps_conv_desc t = { d->n, d->cout, ps_conv_out_h(d), ps_conv_out_w(d), d->cin, d->kh, d->kw, 1,
                       d->kh - 1 - d->pad, d->dst_layout, d->src_layout };
    return t;
}

/* 1 in *via when the backward-data primitive for k is GEMM-based and the
 * equivalent forward convolution gets a direct JIT kernel (square kernel,
 * stride 1, pad < k; SSE4.1 in practice): then that is the faster way. */
static ps_status bwd_data_via_forward(dn_impl *im, const ps_conv_desc *d, const prim_key *k, int *via,
                                      ps_err *err) {
    const prim_entry *e;
    ps_status st;
    *via = 0;
    if (d->stride != 1 || d->kh != d->kw || d->pad >= d->kh) return PS_OK;
    if ((st = get_entry(im, k, &e, err))) return st;
    if (!e->impl || !strstr(e->impl, "gemm")) return PS_OK;
    ps_conv_desc t = bwd_data_fwd_desc(d);
    prim_key fk = conv_key(PK_CONV_FWD, &t, 0);
    const prim_entry *f;
    if ((st = get_entry(im, &fk, &f, err))) return st;
    *via = f->impl && !strstr(f->impl, "gemm") && !impl_is_reference(f->impl);
    return PS_OK;
}

static ps_status conv_bwd_data_as_forward(dn_impl *im, const ps_conv_desc *d, const float *w,
                                          const float *dy, float *dx, ps_err *err) {
    const int co = d->cout, ci = d->cin, kk = d->kh;
    float *wt = pool_get(im, (size_t)co * ci * kk * kk * sizeof(float));  /* (cin, cout, k, k) */
    if (!wt) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl: out of memory for rotated weights");
    for (int o = 0; o < co; o++)
        for (int i = 0; i < ci; i++)
            for (int a = 0; a < kk; a++)
                for (int b = 0; b < kk; b++)
                    wt[(((size_t)i * co + o) * kk + a) * kk + b] =
                        w[(((size_t)o * ci + i) * kk + (kk - 1 - a)) * kk + (kk - 1 - b)];
    ps_conv_desc t = bwd_data_fwd_desc(d);
    prim_key fk = conv_key(PK_CONV_FWD, &t, 0);
    exec_arg a[] = { { DNNL_ARG_SRC, dy }, { DNNL_ARG_WEIGHTS, wt }, { DNNL_ARG_DST, dx } };
    ps_status st = run(im, &fk, a, 3, err);
    pool_put(im, wt);
    return st;
}

/* db = sum of dy over n, and the spatial positions (dw == NULL case). */
static void bias_grad(const float *dy, int n, int c, int64_t plane, float *db) {
    for (int j = 0; j < c; j++) {
        double acc = 0.0;
        for (int i = 0; i < n; i++)
            for (int64_t p = 0; p < plane; p++) acc += dy[((int64_t)i * c + j) * plane + p];
        db[j] = (float)acc;
    }
}

static ps_status dn_conv2d_backward_sq(void *impl, const ps_conv_desc *d, const float *x,
                                      const float *w, const float *dy, float *dx, float *dw,
                                      float *db, ps_err *err) {
    dn_impl *im = impl;
    ps_status st;
    set_threads(im);
    if (dx) {
        prim_key k = conv_key(PK_CONV_BWD_DATA, d, 1);
        int via_fwd = 0;
        if ((st = bwd_data_via_forward(im, d, &k, &via_fwd, err))) return st;
        if (via_fwd) {
            if ((st = conv_bwd_data_as_forward(im, d, w, dy, dx, err))) return st;
        } else {
            exec_arg a[] = { { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_WEIGHTS, w }, { DNNL_ARG_DIFF_SRC, dx } };
            if ((st = run(im, &k, a, 3, err))) return st;
        }
    }
    if (dw) {
        prim_key k = conv_key(PK_CONV_BWD_WEIGHTS, d, db != NULL);
        exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DIFF_DST, dy },
                         { DNNL_ARG_DIFF_WEIGHTS, dw }, { DNNL_ARG_DIFF_BIAS, db } };
        return run(im, &k, a, db ? 4 : 3, err);
    }
    if (db) bias_grad(dy, d->n, d->cout, (int64_t)ps_conv_out_h(d) * ps_conv_out_w(d), db);
    return PS_OK;
}

static ps_status dn_relu_forward(void *impl, int64_t count, const float *x, float *y, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    prim_key k = key_make(PK_RELU_FWD, 0, 1, &count);
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DST, y } };
    return run(im, &k, a, 2, err);
}

static ps_status dn_relu_backward(void *impl, int64_t count, const float *y, const float *dy,
                                    float *dx, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    prim_key k = key_make(PK_RELU_BWD, 0, 1, &count);
    exec_arg a[] = { { DNNL_ARG_DST, y }, { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_DIFF_SRC, dx } };
    return run(im, &k, a, 3, err);
}

/* 0 when the primitive cannot be created (the forward then reports why). */
static size_t dn_maxpool_workspace_size_sq(void *impl, const ps_pool_desc *d) {
    dn_impl *im = impl;
    set_threads(im);
    prim_key k = pool_key(PK_POOL_FWD_TRAINING, d);
    dnnl_primitive_t prim;
    const_dnnl_primitive_desc_t pd;
    if (get_prim(im, &k, &prim, NULL) != PS_OK ||
        dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success)
        return 0;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_workspace_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

static ps_status dn_maxpool_forward_sq(void *impl, const ps_pool_desc *d, const float *x, float *y,
                                      void *workspace, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    prim_key k = pool_key(workspace ? PK_POOL_FWD_TRAINING : PK_POOL_FWD_INFERENCE, d);
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DST, y }, { DNNL_ARG_WORKSPACE, workspace } };
    return run(im, &k, a, workspace ? 3 : 2, err);
}

static ps_status dn_maxpool_backward_sq(void *impl, const ps_pool_desc *d, const void *workspace,
                                       const float *dy, float *dx, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    prim_key k = pool_key(PK_POOL_BWD, d);
    exec_arg a[] = { { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_WORKSPACE, workspace },
                     { DNNL_ARG_DIFF_SRC, dx } };
    return run(im, &k, a, 3, err);
}

static ps_status dn_linear_forward(void *impl, const ps_linear_desc *d, const float *x,
                                     const float *w, const float *b, float *y, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    prim_key k = ip_key(PK_IP_FWD, d, b != NULL);
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_WEIGHTS, w }, { DNNL_ARG_DST, y },
                     { DNNL_ARG_BIAS, b } };
    return run(im, &k, a, b ? 4 : 3, err);
}

static ps_status dn_linear_backward(void *impl, const ps_linear_desc *d, const float *x,
                                      const float *w, const float *dy, float *dx, float *dw,
                                      float *db, ps_err *err) {
    dn_impl *im = impl;
    ps_status st;
    set_threads(im);
    if (dx) {
        prim_key k = ip_key(PK_IP_BWD_DATA, d, 1);
        exec_arg a[] = { { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_WEIGHTS, w }, { DNNL_ARG_DIFF_SRC, dx } };
        if ((st = run(im, &k, a, 3, err))) return st;
    }
    if (dw) {
        prim_key k = ip_key(PK_IP_BWD_WEIGHTS, d, db != NULL);
        exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DIFF_DST, dy },
                         { DNNL_ARG_DIFF_WEIGHTS, dw }, { DNNL_ARG_DIFF_BIAS, db } };
        return run(im, &k, a, db ? 4 : 3, err);
    }
    if (db) bias_grad(dy, d->n, d->out, 1, db);
    return PS_OK;
}

static ps_status dn_log_softmax_forward(void *impl, int rows, int cols, const float *x, float *y,
                                          ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const int64_t dims[2] = { rows, cols };
    prim_key k = key_make(PK_LOGSOFTMAX_FWD, 0, 2, dims);
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DST, y } };
    return run(im, &k, a, 2, err);
}

static ps_status dn_log_softmax_backward(void *impl, int rows, int cols, const float *y,
                                           const float *dy, float *dx, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const int64_t dims[2] = { rows, cols };
    prim_key k = key_make(PK_LOGSOFTMAX_BWD, 0, 2, dims);
    exec_arg a[] = { { DNNL_ARG_DST, y }, { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_DIFF_SRC, dx } };
    return run(im, &k, a, 3, err);
}

/* Elementwise ops: memory bound; OpenMP loops (the calling thread's
 * thread count) when they are large enough to pay for waking threads. */
#define PS_OMP_MIN 65536

static ps_status dn_mul(void *impl, int64_t count, const float *x, const float *mask, float *y,
                          ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) y[i] = x[i] * mask[i];
    return PS_OK;
}

static ps_status dn_sgd_update(void *impl, int64_t count, float *w, const float *g, float *buf,
                                 const ps_sgd_desc *s, ps_err *err) {
    (void)err;
    set_threads(impl);
    const float lr = s->lr, mom = s->momentum, wd = s->weight_decay;
    if (mom == 0.0f) {
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) w[i] -= lr * (g[i] + wd * w[i]);
    } else if (s->first_step) {
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) {
            buf[i] = g[i] + wd * w[i];
            w[i] -= lr * buf[i];
        }
    } else {
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) {
            buf[i] = mom * buf[i] + (g[i] + wd * w[i]);
            w[i] -= lr * buf[i];
        }
    }
    return PS_OK;
}

static ps_status dn_add(void *impl, int64_t count, float *dst, const float *src, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) dst[i] += src[i];
    return PS_OK;
}

/* Adam and SparseAdam: the reference backend's float expressions, in
 * OpenMP loops (see ps_adam_desc). */
static ps_status dn_adam_update(void *impl, int64_t count, float *w, const float *g, float *m, float *v,
                                const ps_adam_desc *d, ps_err *err) {
    (void)err;
    set_threads(impl);
    const ps_adam_scalars s = ps_adam_scalars_of(d);
    const float b1 = s.beta1, b2 = s.beta2, omb1 = s.one_minus_beta1, omb2 = s.one_minus_beta2;
    const float wd = s.weight_decay, eps = s.eps, bc2s = s.bc2_sqrt, nss = -s.step_size;
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) {
        const float gi = wd != 0.0f ? g[i] + wd * w[i] : g[i];
        const float mi = b1 * m[i] + omb1 * gi;
        const float vi = b2 * v[i] + omb2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        w[i] = w[i] + nss * (mi / (sqrtf(vi) / bc2s + eps));
    }
    return PS_OK;
}

static ps_status dn_sgd_update_rows(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                    const float *g_rows, float lr, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for if (nrows * width >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < nrows; r++) {
        float *wr = w + rows[r] * width;
        const float *gr = g_rows + r * width;
#pragma omp simd
        for (int64_t j = 0; j < width; j++) wr[j] -= lr * gr[j];
    }
    return PS_OK;
}

static ps_status dn_adam_update_rows(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                     const float *g_rows, float *m, float *v, const ps_adam_desc *d,
                                     ps_err *err) {
    (void)err;
    set_threads(impl);
    const ps_adam_scalars s = ps_adam_scalars_of(d);
    const float omb1 = s.one_minus_beta1, omb2 = s.one_minus_beta2, eps = s.eps, nss = -s.step_size_sp;
#pragma omp parallel for if (nrows * width >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < nrows; r++) {
        const int64_t o = rows[r] * width;
        const float *gr = g_rows + r * width;
#pragma omp simd
        for (int64_t j = 0; j < width; j++) {
            const float g = gr[j], m_old = m[o + j], v_old = v[o + j];
            const float m_upd = (g - m_old) * omb1, v_upd = (g * g - v_old) * omb2;
            m[o + j] = m_old + m_upd;
            v[o + j] = v_old + v_upd;
            w[o + j] = w[o + j] + nss * ((m_upd + m_old) / (sqrtf(v_upd + v_old) + eps));
        }
    }
    return PS_OK;
}

static ps_status dn_softmax_forward(void *impl, int64_t rows, int cols, const float *x, float *y,
                                    ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const int64_t dims[2] = { rows, cols };
    prim_key k = key_make(PK_SOFTMAX_FWD, 0, 2, dims);
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DST, y } };
    return run(im, &k, a, 2, err);
}

static ps_status dn_softmax_backward(void *impl, int64_t rows, int cols, const float *y,
                                     const float *dy, float *dx, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const int64_t dims[2] = { rows, cols };
    prim_key k = key_make(PK_SOFTMAX_BWD, 0, 2, dims);
    exec_arg a[] = { { DNNL_ARG_DST, y }, { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_DIFF_SRC, dx } };
    return run(im, &k, a, 3, err);
}

/* Embedding rows: oneDNN has no gather primitive; OpenMP loops. */
static ps_status dn_embedding_forward(void *impl, int64_t n, int dim, const int64_t *ids,
                                      const float *w, float *y, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for if (n * dim >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) memcpy(y + i * dim, w + ids[i] * dim, (size_t)dim * sizeof(float));
    return PS_OK;
}

/* Each thread owns a range of columns, so the scatter-add needs no atomics
 * and sums every row in sample order (deterministic). */
static ps_status dn_embedding_backward(void *impl, int64_t n, int dim, const int64_t *slot,
                                       const float *dy, int64_t nrows, float *grows, ps_err *err) {
    (void)err;
    set_threads(impl);
    memset(grows, 0, (size_t)nrows * dim * sizeof(float));
#pragma omp parallel for if (n * dim >= PS_OMP_MIN) schedule(static)
    for (int j = 0; j < dim; j++)
        for (int64_t i = 0; i < n; i++) grows[slot[i] * dim + j] += dy[i * dim + j];
    return PS_OK;
}

static ps_status dn_scale(void *impl, int64_t count, float *x, float s, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) x[i] *= s;
    return PS_OK;
}

static int dn_blocked_layout(void *impl, int c) {
    const dn_impl *im = impl;
    return im->block > 0 && c % im->block == 0 ? im->block : 0;
}

static ps_status dn_reorder(void *impl, int n, int c, int h, int w, const float *src, int src_layout,
                            float *dst, int dst_layout, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const int64_t dims[4] = { n, c, h, w };
    prim_key k = key_make(PK_REORDER, 0, 4, dims);
    k.src_layout = src_layout == PS_LAYOUT_BLOCKED;
    k.dst_layout = dst_layout == PS_LAYOUT_BLOCKED;
    exec_arg a[] = { { DNNL_ARG_FROM, src }, { DNNL_ARG_TO, dst } };
    return run(im, &k, a, 2, err);
}


/* ---- general descriptors (issue 18), until this backend implements them:
 * a descriptor the square form can express runs as that form, any other
 * is refused. ---- */

static int conv_square(const ps_conv_desc *d, ps_conv_desc *sq) {
    const ps_conv_desc r = ps_conv_resolve(d);
    if (r.stride_h != r.stride_w || r.pad_h != r.pad_w || r.dil_h != 1 || r.dil_w != 1 || r.groups != 1) return 0;
    *sq = (ps_conv_desc){ r.n, r.cin, r.h, r.w, r.cout, r.kh, r.kw, r.stride_h, r.pad_h, r.src_layout, r.dst_layout };
    return 1;
}

static int pool_square(const ps_pool_desc *d, ps_pool_desc *sq) {
    const ps_pool_desc r = ps_pool_resolve(d);
    if (r.kh != r.kw || r.stride_h != r.stride_w || r.pad_h || r.pad_w) return 0;
    *sq = (ps_pool_desc){ r.n, r.c, r.h, r.w, r.kh, r.stride_h, r.layout };
    return 1;
}

static ps_status dn_conv2d_forward(void *impl, const ps_conv_desc *d, const float *x, const float *w,
                                   const float *b, float *y, ps_err *err) {
    ps_conv_desc sq;
    if (!conv_square(d, &sq)) return ps_err_set(err, PS_ERR_INTERNAL, "dn: general conv2d not implemented yet");
    return dn_conv2d_forward_sq(impl, &sq, x, w, b, y, err);
}

static ps_status dn_conv2d_backward(void *impl, const ps_conv_desc *d, const float *x, const float *w,
                                    const float *dy, float *dx, float *dw, float *db, ps_err *err) {
    ps_conv_desc sq;
    if (!conv_square(d, &sq)) return ps_err_set(err, PS_ERR_INTERNAL, "dn: general conv2d not implemented yet");
    return dn_conv2d_backward_sq(impl, &sq, x, w, dy, dx, dw, db, err);
}

static size_t dn_maxpool_workspace_size(void *impl, const ps_pool_desc *d) {
    ps_pool_desc sq;
    return pool_square(d, &sq) ? dn_maxpool_workspace_size_sq(impl, &sq) : 0;
}

static ps_status dn_maxpool_forward(void *impl, const ps_pool_desc *d, const float *x, float *y, void *workspace,
                                    ps_err *err) {
    ps_pool_desc sq;
    if (!pool_square(d, &sq)) return ps_err_set(err, PS_ERR_INTERNAL, "dn: padded max-pool not implemented yet");
    return dn_maxpool_forward_sq(impl, &sq, x, y, workspace, err);
}

static ps_status dn_maxpool_backward(void *impl, const ps_pool_desc *d, const void *workspace, const float *dy,
                                     float *dx, ps_err *err) {
    ps_pool_desc sq;
    if (!pool_square(d, &sq)) return ps_err_set(err, PS_ERR_INTERNAL, "dn: padded max-pool not implemented yet");
    return dn_maxpool_backward_sq(impl, &sq, workspace, dy, dx, err);
}

const ps_backend_ops ps_backend_dnnl_ops = {
    .name = "dnnl",
    .init = dn_init,
    .destroy = dn_destroy,
    .alloc = dn_alloc,
    .free = dn_free,
    .copy_to_device = dn_copy,
    .copy_to_host = dn_copy,
    .conv2d_forward = dn_conv2d_forward,
    .conv2d_backward = dn_conv2d_backward,
    .relu_forward = dn_relu_forward,
    .relu_backward = dn_relu_backward,
    .maxpool_workspace_size = dn_maxpool_workspace_size,
    .maxpool_forward = dn_maxpool_forward,
    .maxpool_backward = dn_maxpool_backward,
    .linear_forward = dn_linear_forward,
    .linear_backward = dn_linear_backward,
    .log_softmax_forward = dn_log_softmax_forward,
    .log_softmax_backward = dn_log_softmax_backward,
    .mul = dn_mul,
    .sgd_update = dn_sgd_update,
    .add = dn_add,
    .blocked_layout = dn_blocked_layout,
    .reorder = dn_reorder,
    .set_threads = dn_set_threads,
    .softmax_forward = dn_softmax_forward,
    .softmax_backward = dn_softmax_backward,
    .embedding_forward = dn_embedding_forward,
    .embedding_backward = dn_embedding_backward,
    .scale = dn_scale,
    .adam_update = dn_adam_update,
    .sgd_update_rows = dn_sgd_update_rows,
    .adam_update_rows = dn_adam_update_rows,
};
