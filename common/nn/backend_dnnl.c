/* backend_dnnl.c - the oneDNN (2.6, CPU, C API) backend.
 *
 * Conv, max-pool, linear (inner product), relu (eltwise, dst-based
 * backward) and log-softmax run as oneDNN primitives, but for the forward
 * of a wide linear layer (dnnl_sgemm per chunk of outputs,
 * linear_fwd_chunks); mul/add/sgd are OpenMP loops (memory bound).
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
 * forces the block size. PS_DNNL_POOL=c runs plain-layout pooling in the
 * C kernels, normally their last resort (for tests and comparison).
 * Also for comparison: PS_DNNL_WFWD=0, PS_DNNL_C1=0 and
 * PS_DNNL_POOL_BWD=onednn leave weight gradients, one-input-channel weight
 * gradients and the blocked max-pool backward to oneDNN (dn_impl says
 * which), PS_DNNL_POOL_CPU=0 keeps one buffer-pool list for all CPUs
 * instead of one per CPU (pool_shard), and PS_DNNL_LINEAR_CHUNK=0 runs a
 * wide linear forward as one inner product (linear_fwd_chunks).
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
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dnnl_check.h"

typedef enum {
    PK_CONV_FWD, PK_CONV_BWD_DATA, PK_CONV_BWD_WEIGHTS,
    PK_POOL_FWD_TRAINING, PK_POOL_FWD_INFERENCE, PK_POOL_BWD,
    PK_IP_FWD, PK_IP_BWD_DATA, PK_IP_BWD_WEIGHTS,
    PK_RELU_FWD, PK_RELU_BWD,
    PK_LOGSOFTMAX_FWD,          /* the (log-)softmax backwards are C loops (softmax_rows_bwd) */
    PK_REORDER,
    PK_SOFTMAX_FWD,
    PK_AVGPOOL_FWD, PK_AVGPOOL_BWD,
    PK_ELTWISE_FWD, PK_ELTWISE_BWD,
    PK_CONV_BWD_W_AS_FWD,
    PK_PERMUTE,
    PK_MATMUL,
} prim_kind;

/* Everything a primitive depends on. Compared with memcmp: always build
 * from a zeroed value (key_make; no padding bytes). dims: conv
 * n,cin,h,w,cout,kh,kw,sh,sw,ph,pw,dh,dw,groups; pool n,c,h,w,kh,kw,sh,sw,
 * ph,pw; ip n,in,out; relu and eltwise count; (log)softmax rows,cols; permute
 * n,ndim,dims[4],perm[4]; matmul batch,m,n,k,trans_a,trans_b,bcast_a,bcast_b,accumulate. */
#define PS_DNNL_KEY_DIMS 14
typedef struct prim_key {
    int32_t kind;
    int32_t bias;                    /* conv/ip: has a bias; avg-pool: count_include_pad */
    int32_t src_layout, dst_layout;  /* PS_LAYOUT_* of the activations */
    int32_t alg;                     /* eltwise: the dnnl_alg_kind_t */
    uint32_t alpha_bits;             /* eltwise: alpha's float bits */
    uint32_t beta_bits;              /* eltwise: beta's float bits */
    int32_t ndims;                   /* dims used */
    int32_t plain_try;               /* plain-layout pooling tried on oneDNN (plain_pool_entry):
                                      * 1 nchw, 2 blocked behind reorders (block in alg); a
                                      * reference kernel is not run (the C kernel is) nor a
                                      * fallback */
    int32_t nthr;                    /* the calling thread's OpenMP thread count at creation
                                      * (get_entry fills it in): a oneDNN kernel fixes its
                                      * thread count when created and always opens a team of
                                      * that many, whatever omp_set_num_threads says later */
    int64_t dims[PS_DNNL_KEY_DIMS];
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
    int native_block;       /* probe_block's, whatever PS_DNNL_LAYOUT says (plain pooling) */
    int pool_c;             /* PS_DNNL_POOL=c: plain-layout pooling always in the C kernels */
    int no_wfwd;            /* PS_DNNL_WFWD=0: weight gradients never as forward convolutions */
    int no_c1;              /* PS_DNNL_C1=0: one-input-channel weight gradients by oneDNN, not conv_bwd_w_c1 */
    int no_pool_bwd_c;      /* PS_DNNL_POOL_BWD=onednn: blocked max-pool backward by oneDNN, not pool_bwd_ws */
    int no_lin_chunk;       /* PS_DNNL_LINEAR_CHUNK=0: wide linear forwards as one inner product (linear_fwd_chunks) */
    int caller_threads;     /* __atomic: set_threads was used; ops keep the caller's count */
    pthread_mutex_t lock;   /* guards cache, len, cap, nfallback, fallback */
    prim_entry **cache;     /* entries never move: callers keep pointers */
    size_t len, cap;
    int nfallback;          /* primitives created with a disallowed reference kernel */
    char fallback[PS_DNNL_MAX_FALLBACKS][200]; /* the first ones, described */
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
    [PK_REORDER] = { "reorder", 1 },
    [PK_SOFTMAX_FWD] = { "softmax forward", 0 },  /* a language model's vocabulary: not tiny */
    [PK_AVGPOOL_FWD] = { "avg-pool forward", 0 },
    [PK_AVGPOOL_BWD] = { "avg-pool backward", 0 },
    [PK_ELTWISE_FWD] = { "activation forward", 0 },
    [PK_ELTWISE_BWD] = { "activation backward", 0 },
    [PK_CONV_BWD_W_AS_FWD] = { "convolution backward weights (as a forward convolution)", 0 },
    [PK_PERMUTE] = { "permute (a strided reorder)", 1 },
    [PK_MATMUL] = { "matmul", 0 },
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
 * are freed. The cap holds a batch-32 step's working set (~20 MB) many
 * times over: with 16 trainers' contexts in flight a 64 MB cap missed
 * (psd's page faults per batch 7 at 2 trainers, 141 at 16; CPU per sample
 * 1.11x; 19 faults and 1.05x at 256 MB). What the pool keeps is handed
 * back by ps_backend_trim(), which psd calls with malloc_trim when
 * contexts expire or it goes idle, so psd's RSS still comes back after a
 * burst or a dead trainer (test_faults). Each buffer carries a 64-byte
 * header with its size.
 * When a freed buffer would pass the cap, the buffers freed longest ago
 * make room for it (they are of sizes no longer asked for, such as a
 * thread count's scratchpad, more often than the newest): with two
 * trainers a full pool that refused new buffers instead missed ~3 times a
 * batch, each miss a fresh mmap zero-filled page by page.
 * One pool serves every instance of the backend in the process: the
 * executor hands buffers across stages of one memory space (a stage's
 * input gradient, its output), so a buffer one stage's instance allocated
 * is often released through the next one's. With a pool per instance the
 * small ResNet's head allocated its 200 KB input gradient afresh every
 * batch (page faults: ~6 % of psd's CPU) while the features stage's pool
 * filled with copies of it. */
#define PS_POOL_MIN ((size_t)64 << 10)
#define PS_POOL_CAP ((size_t)256 << 20)
#define PS_POOL_HDR 64
#define PS_POOL_SHARDS 64

typedef struct pool_buf {
    struct pool_buf *next;
    size_t size;        /* usable bytes after the header, a multiple of 64 */
} pool_buf;

/* One list per CPU (the CPU a buffer was freed on): a buffer written on
 * one core is, while it sits in the pool, in that core's caches, and
 * handing it to a call running on another core makes that call fetch or
 * invalidate every line of it from the first one. On this project's
 * 2-vCPU VM a training step whose phases alternate between the two CPUs
 * computes 1.14x slower (thread CPU time, medians of 6 alternate rounds
 * of bench_compute --hop 2 --hop-cpus 0,1 against 0,0, loaded machine),
 * and psd's calls move between CPUs all the time. pool_get takes the
 * newest buffer of the right size freed on the calling CPU, else one from
 * another CPU's list; the cap holds for all lists together, the oldest
 * buffers of the freeing CPU's list going first. PS_DNNL_POOL_CPU=0: one
 * list for all (as before). */
typedef struct pool_shard {
    _Alignas(64) pthread_mutex_t lock;   /* guards list (a cache line of its own) */
    pool_buf *list;                      /* newest first */
} pool_shard;

static struct {
    pool_shard shard[PS_POOL_SHARDS];
    size_t bytes;           /* __atomic: in every list */
    int nshards;            /* __atomic: 0 until the first instance; 1 with PS_DNNL_POOL_CPU=0 */
    pthread_mutex_t users_lock;
    int users;              /* live instances; the last one empties the pool */
} g_pool = { .users_lock = PTHREAD_MUTEX_INITIALIZER };

static void pool_init_once(void) {
    if (__atomic_load_n(&g_pool.nshards, __ATOMIC_ACQUIRE)) return;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (!g_pool.nshards) {
        for (int i = 0; i < PS_POOL_SHARDS; i++) pthread_mutex_init(&g_pool.shard[i].lock, NULL);
        const char *e = getenv("PS_DNNL_POOL_CPU");
        long n = sysconf(_SC_NPROCESSORS_CONF);
        int ns = e && !strcmp(e, "0") ? 1 : n < 1 ? 1 : n > PS_POOL_SHARDS ? PS_POOL_SHARDS : (int)n;
        __atomic_store_n(&g_pool.nshards, ns, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&mu);
}

/* The calling CPU's list. */
static int pool_home(void) {
    int ns = __atomic_load_n(&g_pool.nshards, __ATOMIC_ACQUIRE);
    if (ns <= 1) return 0;
    int cpu = sched_getcpu();
    return cpu < 0 ? 0 : cpu % ns;
}

/* Empties every list; returns their buffers, which the caller frees with
 * pool_free_list. */
static pool_buf *pool_take_all(void) {
    pool_buf *all = NULL;
    for (int i = 0; i < PS_POOL_SHARDS; i++) {
        pool_shard *sh = &g_pool.shard[i];
        if (!__atomic_load_n(&sh->list, __ATOMIC_RELAXED)) continue;
        pthread_mutex_lock(&sh->lock);
        while (sh->list) {
            pool_buf *b = sh->list;
            sh->list = b->next;
            __atomic_sub_fetch(&g_pool.bytes, b->size, __ATOMIC_RELAXED);
            b->next = all;
            all = b;
        }
        pthread_mutex_unlock(&sh->lock);
    }
    return all;
}

static void pool_free_list(pool_buf *b) {
    while (b) {
        pool_buf *n = b->next;
        free(b);
        b = n;
    }
}

/* The newest buffer of exactly size bytes in list i, taken out; NULL if none. */
static pool_buf *shard_take(int i, size_t size) {
    pool_shard *sh = &g_pool.shard[i];
    if (!__atomic_load_n(&sh->list, __ATOMIC_RELAXED)) return NULL;
    pool_buf *b = NULL;
    pthread_mutex_lock(&sh->lock);
    for (pool_buf **pp = &sh->list; *pp; pp = &(*pp)->next)
        if ((*pp)->size == size) {
            b = *pp;
            *pp = b->next;
            break;
        }
    pthread_mutex_unlock(&sh->lock);
    if (b) __atomic_sub_fetch(&g_pool.bytes, size, __ATOMIC_RELAXED);
    return b;
}

/* The oldest buffer of list i, taken out; NULL if it is empty. */
static pool_buf *shard_take_oldest(int i) {
    pool_shard *sh = &g_pool.shard[i];
    if (!__atomic_load_n(&sh->list, __ATOMIC_RELAXED)) return NULL;
    pthread_mutex_lock(&sh->lock);
    pool_buf **pp = &sh->list, *t = NULL;
    if (*pp) {
        while ((*pp)->next) pp = &(*pp)->next;
        t = *pp;
        *pp = NULL;
    }
    pthread_mutex_unlock(&sh->lock);
    if (t) __atomic_sub_fetch(&g_pool.bytes, t->size, __ATOMIC_RELAXED);
    return t;
}

static void *pool_get(dn_impl *im, size_t bytes) {
    (void)im;
    size_t size = (bytes + 63) & ~(size_t)63;
    if (size < bytes || size > SIZE_MAX - PS_POOL_HDR) return NULL;
    if (size == 0) size = 64;
    if (size >= PS_POOL_MIN) {
        int ns = __atomic_load_n(&g_pool.nshards, __ATOMIC_ACQUIRE), home = pool_home();
        for (int k = 0; k < ns; k++) {
            pool_buf *b = shard_take((home + k) % ns, size);
            if (b) return (char *)b + PS_POOL_HDR;
        }
    }
    pool_buf *b = aligned_alloc(64, size + PS_POOL_HDR);
    if (!b) return NULL;
    b->size = size;
    return (char *)b + PS_POOL_HDR;
}

static void pool_put(dn_impl *im, void *p) {
    (void)im;
    if (!p) return;
    pool_buf *b = (pool_buf *)((char *)p - PS_POOL_HDR);
    if (b->size < PS_POOL_MIN || b->size > PS_POOL_CAP) {
        free(b);
        return;
    }
    int ns = __atomic_load_n(&g_pool.nshards, __ATOMIC_ACQUIRE), home = pool_home();
    pool_buf *old = NULL;   /* evicted: freed outside the locks */
    /* room first: the oldest of this CPU's list, then of the others' */
    for (int k = 0; k < ns && __atomic_load_n(&g_pool.bytes, __ATOMIC_RELAXED) + b->size > PS_POOL_CAP;) {
        pool_buf *t = shard_take_oldest((home + k) % ns);
        if (!t) { k++; continue; }
        t->next = old;
        old = t;
    }
    pool_shard *sh = &g_pool.shard[home];
    /* counted before it can be taken (and subtracted): bytes never wraps */
    __atomic_add_fetch(&g_pool.bytes, b->size, __ATOMIC_RELAXED);
    pthread_mutex_lock(&sh->lock);
    b->next = sh->list;
    sh->list = b;
    pthread_mutex_unlock(&sh->lock);
    pool_free_list(old);
}

/* ---- primitive creation ---- */

static ps_status md_plain(dnnl_memory_desc_t *md, int ndims, const int64_t *dims,
                          dnnl_format_tag_t tag, ps_err *err) {
    dnnl_dims_t d;
    for (int i = 0; i < ndims; i++) d[i] = dims[i];
    PS_DNNL_CHECK(dnnl_memory_desc_init_by_tag(md, ndims, d, dnnl_f32, tag));
    return PS_OK;
}

/* The channel block of a blocked activation with c channels when the
 * backend's block is `block`: that block where c fills whole blocks, else
 * 8 where c is a multiple of 8 (an 8-channel tensor on AVX-512: nChw16c
 * would pad it to twice its size, and oneDNN's 16-lane kernels then
 * compute on zeros and reorder on every call; its 8-lane kernels run on
 * nChw8c at once), else 0 (no blocked layout for c). */
static int block_of(int block, int64_t c) {
    if (block <= 0) return 0;
    if (c % block == 0) return block;
    return c % 8 == 0 ? 8 : 0;
}

static dnnl_format_tag_t blocked_tag(int block) { return block == 16 ? dnnl_nChw16c : dnnl_nChw8c; }

/* The layout of an activation with c channels (block: the backend's). */
static dnnl_format_tag_t act_tag(int block, int64_t c, int layout) {
    if (layout != PS_LAYOUT_BLOCKED) return dnnl_nchw;
    return blocked_tag(block_of(block, c));
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

/* oneDNN's implementation string of prim (NULL when the query fails). */
static const char *prim_impl(dnnl_primitive_t prim) {
    const_dnnl_primitive_desc_t pd;
    const char *impl = NULL;
    if (dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success ||
        dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success)
        return NULL;
    return impl;
}

/* 1 when the convolution prim of kind `kind` has its src (is_x 1) or dst
 * (is_x 0) activation - or their gradients - in a layout with padded
 * channels; 0 when not or is_x is -1. */
static int conv_act_padded(dnnl_primitive_t prim, int kind, int is_x) {
    const_dnnl_primitive_desc_t pd;
    if (is_x < 0) return 0;
    if (dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success) return 1;
    dnnl_query_t q = is_x ? (kind == PK_CONV_BWD_DATA ? dnnl_query_diff_src_md : dnnl_query_src_md)
                          : (kind == PK_CONV_FWD ? dnnl_query_dst_md : dnnl_query_diff_dst_md);
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, q, 0);
    return !md || md->padded_dims[1] != md->dims[1];
}

/* The convolution primitive of kind k->kind for the given activation
 * layouts (x, y) and weight layout. */
static ps_status conv_prim_with(dnnl_engine_t eng, const prim_key *k, const dnnl_memory_desc_t *x,
                                const dnnl_memory_desc_t *w, const dnnl_memory_desc_t *b,
                                const dnnl_memory_desc_t *y, dnnl_primitive_t *prim, ps_err *err) {
    const int64_t *d = k->dims; /* n,cin,h,w,cout,kh,kw,sh,sw,ph,pw,dh,dw,groups */
    dnnl_dims_t strides = { d[7], d[8] }, pad = { d[9], d[10] };
    dnnl_dims_t dil = { d[11] - 1, d[12] - 1 };  /* oneDNN counts the gaps: 0 = dense */
    dnnl_convolution_desc_t fwd, bwd;
    PS_DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(&fwd, dnnl_forward_training,
                  dnnl_convolution_direct, x, w, k->bias ? b : NULL, y, strides, dil, pad, pad));
    switch (k->kind) {
    case PK_CONV_FWD:
        return make_prim(eng, &fwd, NULL, prim, err);
    case PK_CONV_BWD_DATA:
        PS_DNNL_CHECK(dnnl_dilated_convolution_backward_data_desc_init(&bwd, dnnl_convolution_direct,
                      x, w, y, strides, dil, pad, pad));
        return make_bwd_prim(eng, &fwd, &bwd, prim, err);
    default:
        PS_DNNL_CHECK(dnnl_dilated_convolution_backward_weights_desc_init(&bwd, dnnl_convolution_direct,
                      x, w, k->bias ? b : NULL, y, strides, dil, pad, pad));
        return make_bwd_prim(eng, &fwd, &bwd, prim, err);
    }
}

/* Convolutions take "any" for every tensor: oneDNN picks the layouts its
 * fastest kernel for this ISA wants (a fixed layout can leave only the
 * reference kernel: conv1's weight gradient with plain src and nChw8c
 * diff_dst is ref:any on AVX2; grouped and dilated backward passes in
 * nChw8c are ref:any on SSE4.1, dilated weight gradients in nChw8c on
 * every ISA). Should "any" still end on a reference kernel, the primitive
 * is made again with plain nchw activations, where the GEMM-based kernel
 * (gemm:jit) takes every stride, padding, dilation and group count. The
 * caller's layouts (ua) are reordered to and from the chosen ones where
 * they differ (entry_create). Grouped weights are oneDNN's goihw, (g,
 * cout/g, cin/g, kh, kw): the same floats as PyTorch's (cout, cin/g, kh,
 * kw). */
static ps_status create_conv(dnnl_engine_t eng, int block, const prim_key *k, dnnl_primitive_t *prim,
                             user_arg *ua, int *nua, ps_err *err) {
    const int64_t *d = k->dims; /* n,cin,h,w,cout,kh,kw,sh,sw,ph,pw,dh,dw,groups */
    const int64_t oh = (d[2] + 2 * d[9] - d[11] * (d[5] - 1) - 1) / d[7] + 1;
    const int64_t ow = (d[3] + 2 * d[10] - d[12] * (d[6] - 1) - 1) / d[8] + 1;
    const int64_t g = d[13];
    const int64_t xd[4] = { d[0], d[1], d[2], d[3] }, yd[4] = { d[0], d[4], oh, ow }, bd[1] = { d[4] };
    const int64_t wd4[4] = { d[4], d[1], d[5], d[6] }, wd5[5] = { g, d[4] / g, d[1] / g, d[5], d[6] };
    const int wn = g > 1 ? 5 : 4;
    const int64_t *wd = g > 1 ? wd5 : wd4;
    dnnl_memory_desc_t x, w, b, y, xuser, wuser, yuser, xplain, yplain;
    ps_status st;
    if ((st = md_plain(&xuser, 4, xd, act_tag(block, d[1], k->src_layout), err)) ||
        (st = md_plain(&wuser, wn, wd, g > 1 ? dnnl_goihw : dnnl_oihw, err)) ||
        (st = md_plain(&yuser, 4, yd, act_tag(block, d[4], k->dst_layout), err)) ||
        (st = md_plain(&x, 4, xd, dnnl_format_tag_any, err)) ||
        (st = md_plain(&w, wn, wd, dnnl_format_tag_any, err)) ||
        (st = md_plain(&b, 1, bd, dnnl_a, err)) ||
        (st = md_plain(&y, 4, yd, dnnl_format_tag_any, err)) ||
        (st = md_plain(&xplain, 4, xd, dnnl_nchw, err)) ||
        (st = md_plain(&yplain, 4, yd, dnnl_nchw, err)))
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
    if (k->src_layout == PS_LAYOUT_BLOCKED || k->dst_layout == PS_LAYOUT_BLOCKED) {
        /* First the caller's activation layouts: where a direct JIT kernel
         * takes them, no activation is reordered on any call. "any" alone
         * can pick another block (nChw16c, padded, for an 8-channel tensor
         * on AVX-512) and then reorders the activations in and out of it
         * on every call, which cost more than the 16-lane kernel saved.
         * Then the caller's layout for the larger activation only (one
         * reorder, of the smaller one), then the other - unless the kernel
         * pads the other (conv1's weight gradient on AVX-512 would compute
         * on 1 input channel padded to 8). */
        const int x_first = d[1] * d[2] * d[3] >= d[4] * oh * ow;
        const dnnl_memory_desc_t *cand[3][2] = { { &xuser, &yuser },
                                                 { x_first ? &xuser : &x, x_first ? &y : &yuser },
                                                 { x_first ? &x : &xuser, x_first ? &yuser : &y } };
        for (int c = 0; c < 3; c++) {
            ps_err tmp = { 0 };
            if (conv_prim_with(eng, k, cand[c][0], &w, &b, cand[c][1], prim, &tmp) != PS_OK) continue;
            const char *impl = prim_impl(*prim);
            if (impl && !strncmp(impl, "jit", 3) && !impl_is_reference(impl) &&
                !conv_act_padded(*prim, k->kind, cand[c][0] == &x ? 1 : cand[c][1] == &y ? 0 : -1))
                return PS_OK;
            dnnl_primitive_destroy(*prim);
            *prim = NULL;
        }
    }
    if ((st = conv_prim_with(eng, k, &x, &w, &b, &y, prim, err))) return st;
    if (!impl_is_reference(prim_impl(*prim))) return PS_OK;
    dnnl_primitive_destroy(*prim);
    *prim = NULL;
    return conv_prim_with(eng, k, &xplain, &w, &b, &yplain, prim, err);
}

/* The weight gradient of a convolution (one group, no dilation) as a
 * forward convolution, batch and channels swapped (stride 1 here; stride
 * s dilates the kernel dy' by s - 1):
 *   dw[o][i][a][b] = sum_n,p,q x[n][i][a+p-ph][b+q-pw] * dy[n][o][p][q]
 * is the forward convolution of x' = x with n and c swapped (batch cin,
 * cin -> n channels) by the kernel dy' = dy with n and c swapped (cout
 * outputs, n inputs, oh x ow), padding ph, pw: output (cin, cout, kh, kw),
 * dw with its first two axes swapped. The caller's x, dy and dw are
 * described as they lie (their axes permuted, no copy) and reordered into
 * the layouts the forward kernel picks. oneDNN 2.6 has no SSE4.1 JIT
 * kernel for backward weights (im2col + GEMM per image, plus reorders of
 * blocked activations to plain ones), but has a forward one. */
/* The right padding of create_conv_bwd_w_as_fwd's forward along axis a (0
 * rows, 1 columns) of conv dims d: in + pad_l + pad_r - (out - 1) * s = k. */
static int64_t wfwd_pad_r(const int64_t *d, int a) {
    const int64_t in = d[2 + a], k = d[5 + a], s = d[7 + a], p = d[9 + a];
    const int64_t out = (in + 2 * p - k) / s + 1;
    return k + (out - 1) * s - in - p;
}

static ps_status create_conv_bwd_w_as_fwd(dnnl_engine_t eng, int block, const prim_key *k, dnnl_primitive_t *prim,
                                          user_arg *ua, int *nua, ps_err *err) {
    const int64_t *d = k->dims; /* n,cin,h,w,cout,kh,kw,sh,sw,ph,pw,dh,dw,groups */
    const int64_t oh = (d[2] + 2 * d[9] - d[5]) / d[7] + 1, ow = (d[3] + 2 * d[10] - d[6]) / d[8] + 1;
    const int64_t xd[4] = { d[0], d[1], d[2], d[3] }, yd[4] = { d[0], d[4], oh, ow };
    const int64_t wd[4] = { d[4], d[1], d[5], d[6] };
    const int64_t sx[4] = { d[1], d[0], d[2], d[3] }, sw[4] = { d[4], d[0], oh, ow }, sy[4] = { d[1], d[4], d[5], d[6] };
    const int swap[4] = { 1, 0, 2, 3 };
    dnnl_memory_desc_t x0, y0, w0, x, w, y;
    ps_status st;
    if ((st = md_plain(&x0, 4, xd, act_tag(block, d[1], k->src_layout), err)) ||
        (st = md_plain(&y0, 4, yd, act_tag(block, d[4], k->dst_layout), err)) ||
        (st = md_plain(&w0, 4, wd, dnnl_oihw, err)) ||
        (st = md_plain(&x, 4, sx, dnnl_format_tag_any, err)) ||
        (st = md_plain(&w, 4, sw, dnnl_format_tag_any, err)) ||
        (st = md_plain(&y, 4, sy, dnnl_format_tag_any, err)))
        return st;
    PS_DNNL_CHECK(dnnl_memory_desc_permute_axes(&ua[0].md, &x0, swap));
    PS_DNNL_CHECK(dnnl_memory_desc_permute_axes(&ua[1].md, &y0, swap));
    PS_DNNL_CHECK(dnnl_memory_desc_permute_axes(&ua[2].md, &w0, swap));
    ua[0].arg = DNNL_ARG_SRC; ua[0].output = 0;
    ua[1].arg = DNNL_ARG_WEIGHTS; ua[1].output = 0;
    ua[2].arg = DNNL_ARG_DST; ua[2].output = 1;
    *nua = 3;
    /* stride s: the kernel dy' dilated by s - 1; the right padding is what
     * makes the output kh x kw (the rows the forward never reached) */
    dnnl_dims_t strides = { 1, 1 }, pad = { d[9], d[10] }, pad_r = { wfwd_pad_r(d, 0), wfwd_pad_r(d, 1) };
    dnnl_dims_t dil = { d[7] - 1, d[8] - 1 };
    dnnl_convolution_desc_t fwd;
    PS_DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(&fwd, dnnl_forward_training, dnnl_convolution_direct,
                                                             &x, &w, NULL, &y, strides, dil, pad, pad_r));
    return make_prim(eng, &fwd, NULL, prim, err);
}

/* Pooling in the blocked layout (the plain layout runs the C kernels of
 * pool_plain_*: oneDNN 2.6 has only simple_nchw below AVX-512 there).
 * Max (PK_POOL_*) or average (PK_AVGPOOL_*, k->bias = count_include_pad);
 * padding on both sides, ceil_mode's extra rows and columns as more on the
 * bottom and right; its max pooling never picks padding, avg_exclude_padding
 * counts the input positions, and avg_include_padding divides by kh*kw as
 * PyTorch does unless ceil_mode's last window reaches past the padded input
 * (such a pool computes in the plain layout, layers.c pool_infer, on the C
 * kernels: plain_pool_entry). */
static ps_status create_pool(dnnl_engine_t eng, int block, const prim_key *k, dnnl_primitive_t *prim,
                             user_arg *ua, int *nua, ps_err *err) {
    const int64_t *d = k->dims; /* n,c,h,w,kh,kw,sh,sw,ph,pw,ceil_mode */
    const int64_t xd[4] = { d[0], d[1], d[2], d[3] };
    const int64_t yd[4] = { d[0], d[1], ps_pool_out_dim((int)d[2], (int)d[4], (int)d[6], (int)d[8], (int)d[10]),
                            ps_pool_out_dim((int)d[3], (int)d[5], (int)d[7], (int)d[9], (int)d[10]) };
    /* plain_try 2: the primitive in the blocked layout (block k->alg), the
     * caller's plain activations reordered to and from it (entry_create;
     * oneDNN pads a channel count that does not fill the last block) */
    const int behind = k->plain_try == 2;
    const dnnl_format_tag_t tag = behind ? blocked_tag((int)k->alg) : act_tag(block, d[1], k->src_layout);
    dnnl_memory_desc_t x, y, xuser, yuser;
    ps_status st;
    if ((st = md_plain(&x, 4, xd, tag, err)) || (st = md_plain(&y, 4, yd, tag, err)) ||
        (st = md_plain(&xuser, 4, xd, dnnl_nchw, err)) || (st = md_plain(&yuser, 4, yd, dnnl_nchw, err)))
        return st;
    const int avg = k->kind == PK_AVGPOOL_FWD || k->kind == PK_AVGPOOL_BWD;
    const int bwd = k->kind == PK_POOL_BWD || k->kind == PK_AVGPOOL_BWD;
    if (behind) {
        const user_arg fwd_ua[2] = { { DNNL_ARG_SRC, 0, xuser }, { DNNL_ARG_DST, 1, yuser } };
        const user_arg bwd_ua[2] = { { DNNL_ARG_DIFF_DST, 0, yuser }, { DNNL_ARG_DIFF_SRC, 1, xuser } };
        memcpy(ua, bwd ? bwd_ua : fwd_ua, sizeof fwd_ua);
        *nua = 2;
    }
    const dnnl_alg_kind_t alg = !avg ? dnnl_pooling_max
                              : k->bias ? dnnl_pooling_avg_include_padding : dnnl_pooling_avg_exclude_padding;
    /* ceil_mode: the rows and columns its last window reaches past the
     * padded input are more padding on the bottom and right */
    dnnl_dims_t strides = { d[6], d[7] }, kernel = { d[4], d[5] }, pad = { d[8], d[9] },
                pad_r = { d[8] + ps_pool_extra_dim((int)d[2], (int)d[4], (int)d[6], (int)d[8], (int)d[10]),
                          d[9] + ps_pool_extra_dim((int)d[3], (int)d[5], (int)d[7], (int)d[9], (int)d[10]) };
    if (avg && k->bias && (pad_r[0] != pad[0] || pad_r[1] != pad[1]))
        return ps_err_set(err, PS_ERR_INTERNAL, "dnnl: an average pool with count_include_pad whose ceil_mode window "
                          "reaches past the padded input (PyTorch divides by less than kh*kw; the C kernels run it)");
    dnnl_pooling_desc_t fwd, bwdd;
    PS_DNNL_CHECK(dnnl_pooling_forward_desc_init(&fwd,
                  k->kind == PK_POOL_FWD_INFERENCE ? dnnl_forward_inference : dnnl_forward_training,
                  alg, &x, &y, strides, kernel, pad, pad_r));
    if (!bwd) return make_prim(eng, &fwd, NULL, prim, err);
    PS_DNNL_CHECK(dnnl_pooling_backward_desc_init(&bwdd, alg, &x, &y, strides, kernel, pad, pad_r));
    return make_bwd_prim(eng, &fwd, &bwdd, prim, err);
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

/* An activation over dims[0] elements: k->alg, alpha and beta from k->alpha_bits, k->beta_bits;
 * the backward of a *_use_dst_for_bwd algorithm reads dst, the others src. */
static ps_status create_eltwise(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim, ps_err *err) {
    dnnl_memory_desc_t md;
    ps_status st = md_plain(&md, 1, k->dims, dnnl_a, err);
    if (st) return st;
    float alpha, beta;
    memcpy(&alpha, &k->alpha_bits, sizeof alpha);
    memcpy(&beta, &k->beta_bits, sizeof beta);
    dnnl_eltwise_desc_t fwd, bwd;
    PS_DNNL_CHECK(dnnl_eltwise_forward_desc_init(&fwd, dnnl_forward_training, (dnnl_alg_kind_t)k->alg, &md,
                                                 alpha, beta));
    if (k->kind == PK_ELTWISE_FWD) return make_prim(eng, &fwd, NULL, prim, err);
    PS_DNNL_CHECK(dnnl_eltwise_backward_desc_init(&bwd, (dnnl_alg_kind_t)k->alg, &md, &md, alpha, beta));
    return make_bwd_prim(eng, &fwd, &bwd, prim, err);
}

static ps_status create_logsoftmax(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim,
                                   ps_err *err) {
    dnnl_memory_desc_t md;
    ps_status st = md_plain(&md, 2, k->dims, dnnl_nc, err);
    if (st) return st;
    dnnl_logsoftmax_desc_t fwd;
    PS_DNNL_CHECK(dnnl_logsoftmax_forward_desc_init(&fwd, dnnl_forward_training, &md, 1));
    return make_prim(eng, &fwd, NULL, prim, err);
}

static ps_status create_softmax(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim,
                                ps_err *err) {
    dnnl_memory_desc_t md;
    ps_status st = md_plain(&md, 2, k->dims, dnnl_nc, err);
    if (st) return st;
    dnnl_softmax_desc_t fwd;
    PS_DNNL_CHECK(dnnl_softmax_forward_desc_init(&fwd, dnnl_forward_training, &md, 1));
    return make_prim(eng, &fwd, NULL, prim, err);
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
    if ((st = md_plain(&src, 4, k->dims, act_tag(block, k->dims[1], k->src_layout), err)) ||
        (st = md_plain(&dst, 4, k->dims, act_tag(block, k->dims[1], k->dst_layout), err)))
        return st;
    return make_reorder(eng, &src, &dst, prim, err);
}

/* A permutation of each sample's dims as a reorder: the source described
 * in the output's dimension order with the input's strides, the
 * destination dense. dims: n, ndim, the input's per-sample dims
 * (PS_PERMUTE_MAX_DIMS), perm (PS_PERMUTE_MAX_DIMS). */
static ps_status create_permute(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim, ps_err *err) {
    ps_permute_desc pd = {.n = k->dims[0], .ndim = (int)k->dims[1]};
    const int nd = pd.ndim;
    for (int j = 0; j < nd; j++) {
        pd.dims[j] = k->dims[2 + j];
        pd.perm[j] = (int)k->dims[2 + PS_PERMUTE_MAX_DIMS + j];
    }
    int64_t odim[PS_PERMUTE_MAX_DIMS], ostr[PS_PERMUTE_MAX_DIMS];
    dnnl_dims_t dims, sstr, dstr;
    dims[0] = pd.n;
    sstr[0] = ps_permute_strides(&pd, odim, ostr);
    for (int j = 0; j < nd; j++) {
        dims[1 + j] = odim[j];
        sstr[1 + j] = ostr[j];
    }
    int64_t o = 1;
    for (int j = nd; j >= 0; j--) {
        dstr[j] = o;
        o *= dims[j];
    }
    dnnl_memory_desc_t src, dst;
    PS_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&src, nd + 1, dims, dnnl_f32, sstr));
    PS_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&dst, nd + 1, dims, dnnl_f32, dstr));
    return make_reorder(eng, &src, &dst, prim, err);
}

/* A batched matrix product (ps_matmul_desc) as oneDNN's matmul: src (batch,
 * m, k), weights (batch, k, n), dst (batch, m, n); a transposed operand is
 * its buffer described with the last two strides swapped (no copy); a
 * broadcast one has batch 1 (oneDNN's matmul broadcasts batch dims of
 * 1); accumulate is a sum post-op (dst += the product). dims: batch, m,
 * n, k, trans_a, trans_b, bcast_a, bcast_b, accumulate. */
static ps_status create_matmul(dnnl_engine_t eng, const prim_key *k, dnnl_primitive_t *prim, ps_err *err) {
    const int64_t b = k->dims[0], m = k->dims[1], n = k->dims[2], kk = k->dims[3];
    const int ta = (int)k->dims[4], tb = (int)k->dims[5];
    dnnl_dims_t ad = { k->dims[6] ? 1 : b, m, kk }, bd = { k->dims[7] ? 1 : b, kk, n }, cd = { b, m, n };
    dnnl_dims_t as = { m * kk, ta ? 1 : kk, ta ? m : 1 }, bs = { kk * n, tb ? 1 : n, tb ? kk : 1 },
                cs = { m * n, n, 1 };
    dnnl_memory_desc_t a, w, c;
    dnnl_matmul_desc_t md;
    PS_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&a, 3, ad, dnnl_f32, as));
    PS_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&w, 3, bd, dnnl_f32, bs));
    PS_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&c, 3, cd, dnnl_f32, cs));
    PS_DNNL_CHECK(dnnl_matmul_desc_init(&md, &a, &w, NULL, &c));
    if (!k->dims[8]) return make_prim(eng, &md, NULL, prim, err);
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    PS_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    ps_status st = PS_OK;
    if (dnnl_post_ops_create(&po) != dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return ps_err_set(err, PS_ERR_INTERNAL, "dnnl_post_ops_create failed");
    }
    if (dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success || dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success)
        st = ps_err_set(err, PS_ERR_INTERNAL, "dnnl: the matmul's sum post-op was refused");
    if (st == PS_OK) st = make_prim_attr(eng, &md, NULL, attr, prim, err);
    dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return st;
}

static ps_status create_prim(dnnl_engine_t eng, int block, const prim_key *k, dnnl_primitive_t *prim,
                             user_arg *ua, int *nua, ps_err *err) {
    *nua = 0;
    switch ((prim_kind)k->kind) {
    case PK_CONV_FWD: case PK_CONV_BWD_DATA: case PK_CONV_BWD_WEIGHTS:
        return create_conv(eng, block, k, prim, ua, nua, err);
    case PK_CONV_BWD_W_AS_FWD:
        return create_conv_bwd_w_as_fwd(eng, block, k, prim, ua, nua, err);
    case PK_POOL_FWD_TRAINING: case PK_POOL_FWD_INFERENCE: case PK_POOL_BWD:
    case PK_AVGPOOL_FWD: case PK_AVGPOOL_BWD:
        return create_pool(eng, block, k, prim, ua, nua, err);
    case PK_ELTWISE_FWD: case PK_ELTWISE_BWD:
        return create_eltwise(eng, k, prim, err);
    case PK_REORDER:
        return create_act_reorder(eng, block, k, prim, err);
    case PK_IP_FWD: case PK_IP_BWD_DATA: case PK_IP_BWD_WEIGHTS:
        return create_ip(eng, k, prim, err);
    case PK_RELU_FWD: case PK_RELU_BWD:
        return create_relu(eng, k, prim, err);
    case PK_LOGSOFTMAX_FWD:
        return create_logsoftmax(eng, k, prim, err);
    case PK_SOFTMAX_FWD:
        return create_softmax(eng, k, prim, err);
    case PK_PERMUTE:
        return create_permute(eng, k, prim, err);
    case PK_MATMUL:
        return create_matmul(eng, k, prim, err);
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
 * per primitive since primitives are cached; once per shape, whatever
 * the thread counts it is created under). */
static void check_fallback(dn_impl *im, const prim_key *k, const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success) impl = NULL;
    const prim_kind_info *ki = &kKindInfo[k->kind];
    if (ki->may_ref || k->plain_try || !impl_is_reference(impl)) return;
    for (size_t i = 0; i < im->len; i++) {  /* counted under another thread count already? */
        prim_key other = im->cache[i]->key;
        other.nthr = k->nthr;
        if (memcmp(&other, k, sizeof *k) == 0) return;
    }
    if (im->nfallback < PS_DNNL_MAX_FALLBACKS) {
        char dims[96] = "";
        size_t len = 0;
        for (int i = 0; i < k->ndims && len < sizeof dims; i++)
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

/* The cached entry for k and the calling thread's OpenMP thread count,
 * created on first use. One entry per thread count: a primitive created
 * under 2 threads runs every call as a team of 2 (oneDNN's parallel()
 * passes the count it was created with to num_threads), so a call given
 * one thread (ps_model_call_begin, two calls computing at once) would
 * still fork two, and a convolution's backward-weights reduction then
 * spins in oneDNN's barrier while its partner waits for a core. */
static ps_status get_entry(dn_impl *im, const prim_key *kin, const prim_entry **out, ps_err *err) {
    ps_status st = PS_OK;
    prim_key kk = *kin;
    const prim_key *k = &kk;
    kk.nthr = omp_get_max_threads();
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
    k.ndims = ndims;
    for (int i = 0; i < ndims; i++) k.dims[i] = dims[i];
    return k;
}

/* d: resolved (ps_conv_resolve). */
static prim_key conv_key(prim_kind kind, const ps_conv_desc *d, int bias) {
    const int64_t dims[14] = { d->n, d->cin, d->h, d->w, d->cout, d->kh, d->kw, d->stride_h, d->stride_w,
                               d->pad_h, d->pad_w, d->dil_h, d->dil_w, d->groups };
    prim_key k = key_make(kind, bias, 14, dims);
    k.src_layout = d->src_layout == PS_LAYOUT_BLOCKED;
    k.dst_layout = d->dst_layout == PS_LAYOUT_BLOCKED;
    return k;
}

/* d: resolved (ps_pool_resolve). */
static prim_key pool_key(prim_kind kind, const ps_pool_desc *d) {
    const int64_t dims[11] = { d->n, d->c, d->h, d->w, d->kh, d->kw, d->stride_h, d->stride_w, d->pad_h, d->pad_w,
                               d->ceil_mode != 0 };
    prim_key k = key_make(kind, kind == PK_AVGPOOL_FWD || kind == PK_AVGPOOL_BWD ? d->count_include_pad != 0 : 0,
                          11, dims);
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

/* Run the cached primitive entry e on the caller's buffers, reordering the
 * arguments whose layout the primitive chose itself (conv weights). */
static ps_status exec_entry(dn_impl *im, const prim_entry *e, const exec_arg *a, int n, ps_err *err) {
    ps_status st = PS_OK;
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

/* Run the cached primitive for k (exec_entry). */
static ps_status run(dn_impl *im, const prim_key *k, const exec_arg *a, int n, ps_err *err) {
    const prim_entry *e;
    ps_status st = get_entry(im, k, &e, err);
    return st ? st : exec_entry(im, e, a, n, err);
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
    im->block = im->native_block = probe_block(im->engine);
    const char *lay = getenv("PS_DNNL_LAYOUT");
    if (lay && !strcmp(lay, "plain")) im->block = 0;
    else if (lay && !strcmp(lay, "8")) im->block = 8;
    else if (lay && !strcmp(lay, "16")) im->block = 16;
    const char *pool = getenv("PS_DNNL_POOL");
    im->pool_c = pool && !strcmp(pool, "c");
    const char *wfwd = getenv("PS_DNNL_WFWD");
    im->no_wfwd = wfwd && !strcmp(wfwd, "0");
    const char *c1 = getenv("PS_DNNL_C1");
    im->no_c1 = c1 && !strcmp(c1, "0");
    const char *lchunk = getenv("PS_DNNL_LINEAR_CHUNK");
    im->no_lin_chunk = lchunk && !strcmp(lchunk, "0");
    const char *pbwd = getenv("PS_DNNL_POOL_BWD");
    im->no_pool_bwd_c = pbwd && !strcmp(pbwd, "onednn");
    pthread_mutex_init(&im->lock, NULL);
    pool_init_once();
    pthread_mutex_lock(&g_pool.users_lock);
    g_pool.users++;
    pthread_mutex_unlock(&g_pool.users_lock);
    *impl = im;
    return PS_OK;
}

void ps_backend_dnnl_trim(void) {
    pool_free_list(pool_take_all());
}

static void dn_destroy(void *impl) {
    dn_impl *im = impl;
    if (!im) return;
    for (size_t i = 0; i < im->len; i++) entry_free(im->cache[i]);
    free(im->cache);
    pthread_mutex_lock(&g_pool.users_lock);
    if (--g_pool.users == 0) pool_free_list(pool_take_all());
    pthread_mutex_unlock(&g_pool.users_lock);
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

/* Elementwise ops and the C kernels: memory bound; OpenMP loops (the
 * calling thread's thread count) when they are large enough to pay for
 * waking threads. */
#define PS_OMP_MIN 65536

/* ---- C kernels: vector width ----
 * The build targets baseline x86-64 (SSE2); the hot C kernels below are
 * also compiled for AVX2 and AVX-512 and the CPU's best version is picked
 * at load time (GCC's target_clones; other compilers get the baseline). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define PS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PS_CLONES
#endif
#define PS_INLINE static inline __attribute__((always_inline))

/* Sums run in float over chunks of at most PS_SUM_CHUNK elements
 * (vectorised) and are added up in double. */
#define PS_SUM_CHUNK 256


static ps_status dn_conv2d_forward(void *impl, const ps_conv_desc *desc, const float *x,
                                   const float *w, const float *b, float *y, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const ps_conv_desc d = ps_conv_resolve(desc);
    prim_key k = conv_key(PK_CONV_FWD, &d, b != NULL);
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_WEIGHTS, w }, { DNNL_ARG_DST, y },
                     { DNNL_ARG_BIAS, b } };
    return run(im, &k, a, b ? 4 : 3, err);
}

/* The data gradient of a stride-1 convolution is itself a forward
 * convolution: dx = conv(dy, W') with W'[i][o][a][b] = W[o][i][kh-1-a][kw-1-b]
 * (in and out channels swapped, kernel rotated 180 degrees) and padding
 * k-1-pad. oneDNN 2.6 has no SSE4.1 JIT kernel for backward data (it runs
 * im2col + GEMM, 1.5x the time of the JIT forward kernel for the same
 * FLOPs), but has a forward one. The forward descriptor of that equivalent
 * convolution (d resolved: one group, no dilation, stride 1). */
static ps_conv_desc bwd_data_fwd_desc(const ps_conv_desc *d) {
    ps_conv_desc t = { .n = d->n, .cin = d->cout, .h = ps_conv_out_h(d), .w = ps_conv_out_w(d), .cout = d->cin,
                       .kh = d->kh, .kw = d->kw, .stride_h = 1, .stride_w = 1, .pad_h = d->kh - 1 - d->pad_h,
                       .pad_w = d->kw - 1 - d->pad_w, .src_layout = d->dst_layout, .dst_layout = d->src_layout };
    return ps_conv_resolve(&t);
}

/* 1 in *via when the backward-data primitive for k is GEMM-based and the
 * equivalent forward convolution gets a direct JIT kernel (stride 1, one
 * group, no dilation, pad < k; SSE4.1 in practice): then that is the
 * faster way. d resolved. */
static ps_status bwd_data_via_forward(dn_impl *im, const ps_conv_desc *d, const prim_key *k, int *via,
                                      ps_err *err) {
    const prim_entry *e;
    ps_status st;
    *via = 0;
    if (d->stride_h != 1 || d->stride_w != 1 || d->groups != 1 || d->dil_h != 1 || d->dil_w != 1 ||
        d->pad_h >= d->kh || d->pad_w >= d->kw)
        return PS_OK;
    if ((st = get_entry(im, k, &e, err))) return st;
    if (!e->impl || !strstr(e->impl, "gemm")) return PS_OK;
    ps_conv_desc t = bwd_data_fwd_desc(d);
    prim_key fk = conv_key(PK_CONV_FWD, &t, 0);
    const prim_entry *f;
    if ((st = get_entry(im, &fk, &f, err))) return st;
    *via = f->impl && !strstr(f->impl, "gemm") && !impl_is_reference(f->impl);
    return PS_OK;
}

/* 1 in *via when the backward-weights primitive for k is GEMM-based and
 * the equivalent forward convolution (create_conv_bwd_w_as_fwd) gets a
 * direct JIT kernel (stride 1, one group, no dilation; SSE4.1 in
 * practice). d resolved. */
static ps_status bwd_weights_via_forward(dn_impl *im, const ps_conv_desc *d, const prim_key *k, int *via,
                                         ps_err *err) {
    const prim_entry *e;
    ps_status st;
    *via = 0;
    if (d->groups != 1 || d->dil_h != 1 || d->dil_w != 1 || im->no_wfwd || wfwd_pad_r(k->dims, 0) < 0 ||
        wfwd_pad_r(k->dims, 1) < 0)
        return PS_OK;
    if ((st = get_entry(im, k, &e, err))) return st;
    if (!e->impl || !strstr(e->impl, "gemm")) return PS_OK;
    prim_key fk = conv_key(PK_CONV_BWD_W_AS_FWD, d, 0);
    const prim_entry *f;
    if ((st = get_entry(im, &fk, &f, err))) return st;
    *via = f->impl && !strstr(f->impl, "gemm") && !impl_is_reference(f->impl);
    return PS_OK;
}

static ps_status conv_bwd_data_as_forward(dn_impl *im, const ps_conv_desc *d, const float *w,
                                          const float *dy, float *dx, ps_err *err) {
    const int co = d->cout, ci = d->cin, kh = d->kh, kw = d->kw;
    float *wt = pool_get(im, (size_t)co * ci * kh * kw * sizeof(float));  /* (cin, cout, kh, kw) */
    if (!wt) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl: out of memory for rotated weights");
    for (int o = 0; o < co; o++)
        for (int i = 0; i < ci; i++)
            for (int a = 0; a < kh; a++)
                for (int b = 0; b < kw; b++)
                    wt[(((size_t)i * co + o) * kh + a) * kw + b] =
                        w[(((size_t)o * ci + i) * kh + (kh - 1 - a)) * kw + (kw - 1 - b)];
    ps_conv_desc t = bwd_data_fwd_desc(d);
    prim_key fk = conv_key(PK_CONV_FWD, &t, 0);
    exec_arg a[] = { { DNNL_ARG_SRC, dy }, { DNNL_ARG_WEIGHTS, wt }, { DNNL_ARG_DST, dx } };
    ps_status st = run(im, &fk, a, 3, err);
    pool_put(im, wt);
    return st;
}

/* db = sum of dy over n and the positions (the dw == NULL case), dy in
 * the plain or the blocked (block > 0) layout. */
static void bias_grad(const float *dy, int n, int c, int64_t plane, int block, float *db) {
    for (int j = 0; j < c; j++) {
        double acc = 0.0;
        for (int i = 0; i < n; i++)
            for (int64_t p = 0; p < plane; p++)
                acc += block ? dy[(((int64_t)i * (c / block) + j / block) * plane + p) * block + j % block]
                             : dy[((int64_t)i * c + j) * plane + p];
        db[j] = (float)acc;
    }
}

/* ---- weight gradient of a one-input-channel convolution: a C kernel ----
 * The stem convolution of an image model (conv1: 1 channel in, cout out,
 * a small kernel) has a weight gradient of kh*kw*cout sums over the batch
 * and the output positions. oneDNN 2.6 pads the 1 input channel to the
 * block for its blocked kernels (AVX2: 8x the work, 0.7 ms of a 5.7 ms
 * small-ResNet step at batch 64) or reorders dy to 16 lanes first
 * (AVX-512), and SSE4.1 runs it as a forward convolution behind two
 * reorders. Here, dy blocked (B lanes of channels per position, contiguous)
 * and x plain: per output position, B-lane multiply-adds of dy with each
 * tap's input value. Images in parallel, each thread's sums (float per
 * image, added up in double) kept apart and added in thread order after
 * the loop, so the result does not depend on scheduling. */
#define PS_C1_TAPS_MAX 49

/* The sums of image x (h x w, plain) against its dy block (oh*ow
 * positions of L lanes) into acc[tap] (kh*kw taps, L lanes each, GCC
 * vector types: one register per tap in the 3x3 interior, where the nine
 * taps are spelled out). */
typedef float ps_v8f __attribute__((vector_size(32)));
typedef float ps_v16f __attribute__((vector_size(64)));
#define C1_IMAGE(NAME, VT)                                                                                   \
    PS_INLINE void NAME(const ps_conv_desc *d, const float *x, const float *dy, VT *acc, VT *accb) {        \
        const int oh = ps_conv_out_h(d), ow = ps_conv_out_w(d), kh = d->kh, kw = d->kw, w = d->w;          \
        const int k33 = kh == 3 && kw == 3;                                                                 \
        VT a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3], a4 = acc[4], a5 = acc[5], a6 = acc[6],       \
           a7 = acc[7], a8 = acc[8], ab = *accb;                                                            \
        for (int oy = 0; oy < oh; oy++) {                                                                   \
            const int iy0 = oy * d->stride_h - d->pad_h;                                                    \
            const int ya = iy0 < 0 ? -iy0 : 0, yb = iy0 + kh > d->h ? d->h - iy0 : kh;                      \
            /* the columns whose window lies inside the input: [lo, hi) */                                   \
            int lo = (d->pad_w + d->stride_w - 1) / d->stride_w;                                            \
            int hi = w + d->pad_w - kw < 0 ? 0 : (w + d->pad_w - kw) / d->stride_w + 1;                     \
            if (hi > ow) hi = ow;                                                                           \
            if (lo > hi) lo = hi;                                                                           \
            if (!(k33 && ya == 0 && yb == 3)) lo = hi = ow;                                                 \
            for (int ox = lo; ox < hi; ox++) {                                                              \
                VT g;                                                                                       \
                memcpy(&g, dy + ((int64_t)oy * ow + ox) * sizeof(VT) / sizeof(float), sizeof g);            \
                const float *r = x + (int64_t)iy0 * w + ox * d->stride_w - d->pad_w;                        \
                ab += g;                                                                                    \
                a0 += g * r[0]; a1 += g * r[1]; a2 += g * r[2];                                             \
                a3 += g * r[w]; a4 += g * r[w + 1]; a5 += g * r[w + 2];                                     \
                a6 += g * r[2 * w]; a7 += g * r[2 * w + 1]; a8 += g * r[2 * w + 2];                         \
            }                                                                                               \
            for (int ox = 0; ox < ow; ox++) {                                                               \
                if (ox == lo && hi > lo) ox = hi;                                                           \
                if (ox >= ow) break;                                                                        \
                const int ix0 = ox * d->stride_w - d->pad_w;                                                \
                const int xa = ix0 < 0 ? -ix0 : 0, xb = ix0 + kw > w ? w - ix0 : kw;                        \
                VT g;                                                                                       \
                memcpy(&g, dy + ((int64_t)oy * ow + ox) * sizeof(VT) / sizeof(float), sizeof g);            \
                ab += g;                                                                                    \
                for (int a = ya; a < yb; a++)                                                               \
                    for (int b = xa; b < xb; b++) {                                                         \
                        const int t = a * kw + b;                                                           \
                        const VT v = g * x[(int64_t)(iy0 + a) * w + ix0 + b];                               \
                        if (k33) {                                                                          \
                            switch (t) {                                                                    \
                            case 0: a0 += v; break; case 1: a1 += v; break; case 2: a2 += v; break;         \
                            case 3: a3 += v; break; case 4: a4 += v; break; case 5: a5 += v; break;         \
                            case 6: a6 += v; break; case 7: a7 += v; break; default: a8 += v; break;        \
                            }                                                                               \
                        } else {                                                                            \
                            acc[t] += v;                                                                    \
                        }                                                                                   \
                    }                                                                                       \
            }                                                                                               \
        }                                                                                                   \
        *accb = ab;                                                                                         \
        if (k33) {                                                                                          \
            acc[0] = a0; acc[1] = a1; acc[2] = a2; acc[3] = a3; acc[4] = a4;                                \
            acc[5] = a5; acc[6] = a6; acc[7] = a7; acc[8] = a8;                                             \
        }                                                                                                   \
    }
C1_IMAGE(c1_image8, ps_v8f)
C1_IMAGE(c1_image16, ps_v16f)

PS_CLONES static void c1_images(const ps_conv_desc *d, const float *x, const float *dy, int block, int i0, int i1,
                                double *tot) {
    const int taps = d->kh * d->kw, nb = d->cout / block;
    const int64_t xplane = (int64_t)d->h * d->w, dplane = (int64_t)ps_conv_out_h(d) * ps_conv_out_w(d) * block;
    ps_v16f acc16[PS_C1_TAPS_MAX], b16;
    ps_v8f acc8[PS_C1_TAPS_MAX], b8;
    for (int i = i0; i < i1; i++)
        for (int cb = 0; cb < nb; cb++) {
            const float *g = dy + ((int64_t)i * nb + cb) * dplane;
            float *acc = block == 8 ? (float *)acc8 : (float *)acc16;
            float *accb = block == 8 ? (float *)&b8 : (float *)&b16;
            memset(acc, 0, (size_t)(taps < 9 ? 9 : taps) * block * sizeof(float));
            memset(accb, 0, (size_t)block * sizeof(float));
            if (block == 8) c1_image8(d, x + i * xplane, g, acc8, &b8);
            else c1_image16(d, x + i * xplane, g, acc16, &b16);
            for (int t = 0; t < taps; t++)
                for (int l = 0; l < block; l++) tot[((int64_t)(cb * block + l)) * taps + t] += acc[t * block + l];
            for (int l = 0; l < block; l++) tot[(int64_t)d->cout * taps + cb * block + l] += accb[l];
        }
}

/* 1 when the C kernel computes d's weight gradient: one input channel,
 * one group, no dilation, x plain, dy blocked in 8 or 16 lanes. */
static int conv_c1_ok(const dn_impl *im, const ps_conv_desc *d) {
    const int blk = d->dst_layout == PS_LAYOUT_BLOCKED ? block_of(im->block, d->cout) : 0;
    return d->cin == 1 && d->groups == 1 && d->dil_h == 1 && d->dil_w == 1 && d->src_layout != PS_LAYOUT_BLOCKED &&
           (blk == 8 || blk == 16) && d->kh * d->kw <= PS_C1_TAPS_MAX && !im->no_c1;
}

/* dw (cout, 1, kh, kw) and db (cout; NULL: no bias) of d (conv_c1_ok). */
static ps_status conv_bwd_w_c1(dn_impl *im, const ps_conv_desc *d, const float *x, const float *dy, float *dw,
                               float *db, ps_err *err) {
    const int block = block_of(im->block, d->cout), taps = d->kh * d->kw, nt = omp_get_max_threads();
    const int64_t per = (int64_t)d->cout * (taps + 1);   /* dw, then db */
    double *tot = calloc((size_t)nt * per, sizeof *tot);
    if (!tot) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl: out of memory for a weight gradient");
    const int64_t work = (int64_t)d->n * ps_conv_out_h(d) * ps_conv_out_w(d) * d->cout * taps;
#pragma omp parallel num_threads(nt) if (work >= PS_OMP_MIN)
    {
        const int t = omp_get_thread_num(), k = omp_get_num_threads();
        const int i0 = (int)((int64_t)d->n * t / k), i1 = (int)((int64_t)d->n * (t + 1) / k);
        c1_images(d, x, dy, block, i0, i1, tot + t * per);
    }
    for (int64_t j = 0; j < per; j++) {
        double s = 0.0;
        for (int t = 0; t < nt; t++) s += tot[t * per + j];
        if (j < (int64_t)d->cout * taps) dw[j] = (float)s;
        else if (db) db[j - (int64_t)d->cout * taps] = (float)s;
    }
    free(tot);
    return PS_OK;
}

static ps_status dn_conv2d_backward(void *impl, const ps_conv_desc *desc, const float *x,
                                    const float *w, const float *dy, float *dx, float *dw,
                                    float *db, ps_err *err) {
    dn_impl *im = impl;
    ps_status st;
    set_threads(im);
    const ps_conv_desc d = ps_conv_resolve(desc);
    if (dx) {
        prim_key k = conv_key(PK_CONV_BWD_DATA, &d, 1);
        int via_fwd = 0;
        if ((st = bwd_data_via_forward(im, &d, &k, &via_fwd, err))) return st;
        if (via_fwd) {
            if ((st = conv_bwd_data_as_forward(im, &d, w, dy, dx, err))) return st;
        } else {
            exec_arg a[] = { { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_WEIGHTS, w }, { DNNL_ARG_DIFF_SRC, dx } };
            if ((st = run(im, &k, a, 3, err))) return st;
        }
    }
    if (dw && conv_c1_ok(im, &d)) return conv_bwd_w_c1(im, &d, x, dy, dw, db, err);   /* db too */
    if (dw) {
        prim_key k = conv_key(PK_CONV_BWD_WEIGHTS, &d, db != NULL);
        int via_fwd = 0;
        if ((st = bwd_weights_via_forward(im, &d, &k, &via_fwd, err))) return st;
        if (via_fwd) {
            prim_key fk = conv_key(PK_CONV_BWD_W_AS_FWD, &d, 0);
            exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_WEIGHTS, dy }, { DNNL_ARG_DST, dw } };
            if ((st = run(im, &fk, a, 3, err))) return st;
            if (db)
                bias_grad(dy, d.n, d.cout, (int64_t)ps_conv_out_h(&d) * ps_conv_out_w(&d),
                          d.dst_layout == PS_LAYOUT_BLOCKED ? block_of(im->block, d.cout) : 0, db);
            return PS_OK;
        }
        exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DIFF_DST, dy },
                         { DNNL_ARG_DIFF_WEIGHTS, dw }, { DNNL_ARG_DIFF_BIAS, db } };
        return run(im, &k, a, db ? 4 : 3, err);
    }
    if (db)
        bias_grad(dy, d.n, d.cout, (int64_t)ps_conv_out_h(&d) * ps_conv_out_w(&d),
                  d.dst_layout == PS_LAYOUT_BLOCKED ? block_of(im->block, d.cout) : 0, db);
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

/* ---- pooling ----
 * Blocked layout: oneDNN primitives (JIT on every ISA for the block
 * probe_block picks). Plain layout: oneDNN 2.6 runs nchw pooling with its
 * reference kernel (simple_nchw) below AVX-512 and for channel counts it
 * does not block, so plain_pool_entry picks a JIT way (nchw where there is
 * a kernel, else blocked behind reorders), and the C kernels below are
 * the last resort. The C max-pool's workspace is the ref backend's: the
 * int32 index iy*w+ix of each output's maximum in its plane. */

/* Window of output (oy, ox), clipped to the input; returns PyTorch's
 * count_include_pad divisor. */
static int pool_window(const ps_pool_desc *d, int oy, int ox, int *y0, int *y1, int *x0, int *x1) {
    int hs = oy * d->stride_h - d->pad_h, ws = ox * d->stride_w - d->pad_w;
    int he = hs + d->kh, we = ws + d->kw;
    if (he > d->h + d->pad_h) he = d->h + d->pad_h;
    if (we > d->w + d->pad_w) we = d->w + d->pad_w;
    const int padded = (he - hs) * (we - ws);
    *y0 = hs < 0 ? 0 : hs;
    *x0 = ws < 0 ? 0 : ws;
    *y1 = he > d->h ? d->h : he;
    *x1 = we > d->w ? d->w : we;
    return padded;
}

/* The window of output (oy, ox) and average pooling's divisor for it: the
 * padded window's size with count_include_pad, else the input elements in
 * it. */
static int pool_avg_window(const ps_pool_desc *d, int oy, int ox, int *y0, int *y1, int *x0, int *x1) {
    const int padded = pool_window(d, oy, ox, y0, y1, x0, x1);
    return d->count_include_pad ? padded : (*y1 - *y0) * (*x1 - *x0);
}

/* The C kernels work plane by plane and output row by output row. Output
 * columns whose window lies inside the input horizontally ([lo, hi)) are
 * computed together, vectorised across columns, one window position
 * (ky, kx) after the other in row-major order (so the first maximum still
 * wins); the border columns, whose windows stick into the padding, take
 * the scalar path. Columns go PS_POOL_COLS at a time. */
#define PS_POOL_COLS 256

static void pool_interior(const ps_pool_desc *d, int ow, int *lo, int *hi) {
    *lo = (d->pad_w + d->stride_w - 1) / d->stride_w;
    *hi = d->w + d->pad_w - d->kw < 0 ? 0 : (d->w + d->pad_w - d->kw) / d->stride_w + 1;
    if (*hi > ow) *hi = ow;
    if (*lo > *hi) *lo = *hi;
}

/* Scalar max over one window (the border columns). */
static void pool_max_one(const ps_pool_desc *d, const float *xp, int oy, int ox, float *y, int32_t *idx) {
    int y0, y1, x0, x1;
    pool_window(d, oy, ox, &y0, &y1, &x0, &x1);
    int best = y0 * d->w + x0;
    float m = -INFINITY;
    for (int iy = y0; iy < y1; iy++)
        for (int ix = x0; ix < x1; ix++) {
            const float v = xp[iy * d->w + ix];
            if (v > m || isnan(v)) {
                m = v;
                best = iy * d->w + ix;
            }
        }
    *y = m;
    if (idx) *idx = best;
}

PS_CLONES static void pool_max_plane(const ps_pool_desc *d, const float *xp, float *yp, int32_t *ip) {
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d), sw = d->stride_w;
    int lo, hi;
    pool_interior(d, ow, &lo, &hi);
    for (int oy = 0; oy < oh; oy++) {
        float *yr = yp + (int64_t)oy * ow;
        int32_t *ir = ip ? ip + (int64_t)oy * ow : NULL;
        for (int ox = 0; ox < ow; ox++)   /* the border columns */
            if (ox < lo || ox >= hi) pool_max_one(d, xp, oy, ox, &yr[ox], ir ? &ir[ox] : NULL);
        int y0, y1, x0, x1;
        pool_window(d, oy, lo, &y0, &y1, &x0, &x1);
        for (int c0 = lo; c0 < hi; c0 += PS_POOL_COLS) {
            const int n = hi - c0 < PS_POOL_COLS ? hi - c0 : PS_POOL_COLS;
            float m[PS_POOL_COLS];
            int32_t id[PS_POOL_COLS];
            const int32_t first = y0 * d->w + c0 * sw - d->pad_w;
            for (int k = 0; k < n; k++) {
                m[k] = -INFINITY;
                id[k] = first + k * sw;
            }
            for (int iy = y0; iy < y1; iy++)
                for (int kx = 0; kx < d->kw; kx++) {
                    const int32_t base = iy * d->w + c0 * sw - d->pad_w + kx;
                    const float *row = xp + base;
#pragma omp simd
                    for (int k = 0; k < n; k++) {
                        const float v = row[k * sw];
                        const int take = v > m[k] || v != v;
                        m[k] = take ? v : m[k];
                        id[k] = take ? base + k * sw : id[k];
                    }
                }
            memcpy(yr + c0, m, (size_t)n * sizeof *m);
            if (ir) memcpy(ir + c0, id, (size_t)n * sizeof *id);
        }
    }
}

/* One window covering each whole plane, no padding (AdaptiveAvgPool2d(1)). */
static int pool_is_global(const ps_pool_desc *d) {
    return d->kh == d->h && d->kw == d->w && !d->pad_h && !d->pad_w;
}

PS_CLONES static void pool_avg_plane(const ps_pool_desc *d, const float *xp, float *yp) {
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d), sw = d->stride_w;
    if (pool_is_global(d)) {
        const int64_t n = (int64_t)d->h * d->w;
        double total = 0.0;
        for (int64_t j0 = 0; j0 < n; j0 += PS_SUM_CHUNK) {
            const int64_t je = j0 + PS_SUM_CHUNK < n ? j0 + PS_SUM_CHUNK : n;
            float t = 0.0f;
#pragma omp simd reduction(+:t)
            for (int64_t j = j0; j < je; j++) t += xp[j];
            total += t;
        }
        yp[0] = (float)(total / (double)n);
        return;
    }
    int lo, hi;
    pool_interior(d, ow, &lo, &hi);
    for (int oy = 0; oy < oh; oy++) {
        float *yr = yp + (int64_t)oy * ow;
        for (int ox = 0; ox < ow; ox++) {
            if (ox >= lo && ox < hi) continue;
            int y0, y1, x0, x1;
            const int div = pool_avg_window(d, oy, ox, &y0, &y1, &x0, &x1);
            float acc = 0.0f;
            for (int iy = y0; iy < y1; iy++)
                for (int ix = x0; ix < x1; ix++) acc += xp[iy * d->w + ix];
            yr[ox] = acc / (float)div;
        }
        if (lo >= hi) continue;
        int y0, y1, x0, x1;
        const float div = (float)pool_avg_window(d, oy, lo, &y0, &y1, &x0, &x1);
        for (int c0 = lo; c0 < hi; c0 += PS_POOL_COLS) {
            const int n = hi - c0 < PS_POOL_COLS ? hi - c0 : PS_POOL_COLS;
            float acc[PS_POOL_COLS] = { 0 };
            for (int iy = y0; iy < y1; iy++)
                for (int kx = 0; kx < d->kw; kx++) {
                    const float *row = xp + iy * d->w + c0 * sw - d->pad_w + kx;
#pragma omp simd
                    for (int k = 0; k < n; k++) acc[k] += row[k * sw];
                }
#pragma omp simd
            for (int k = 0; k < n; k++) yr[c0 + k] = acc[k] / div;
        }
    }
}

PS_CLONES static void pool_avg_bwd_plane(const ps_pool_desc *d, const float *dyp, float *dxp) {
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d), sw = d->stride_w;
    const int64_t plane = (int64_t)d->h * d->w;
    if (pool_is_global(d)) {
        const float g = dyp[0] / (float)plane;
#pragma omp simd
        for (int64_t j = 0; j < plane; j++) dxp[j] = g;
        return;
    }
    memset(dxp, 0, (size_t)plane * sizeof *dxp);
    int lo, hi;
    pool_interior(d, ow, &lo, &hi);
    for (int oy = 0; oy < oh; oy++) {
        const float *gr = dyp + (int64_t)oy * ow;
        for (int ox = 0; ox < ow; ox++) {
            if (ox >= lo && ox < hi) continue;
            int y0, y1, x0, x1;
            const float g = gr[ox] / (float)pool_avg_window(d, oy, ox, &y0, &y1, &x0, &x1);
            for (int iy = y0; iy < y1; iy++)
                for (int ix = x0; ix < x1; ix++) dxp[iy * d->w + ix] += g;
        }
        if (lo >= hi) continue;
        int y0, y1, x0, x1;
        const float div = (float)pool_avg_window(d, oy, lo, &y0, &y1, &x0, &x1);
        for (int c0 = lo; c0 < hi; c0 += PS_POOL_COLS) {
            const int n = hi - c0 < PS_POOL_COLS ? hi - c0 : PS_POOL_COLS;
            float g[PS_POOL_COLS];
            for (int k = 0; k < n; k++) g[k] = gr[c0 + k] / div;
            for (int iy = y0; iy < y1; iy++)
                for (int kx = 0; kx < d->kw; kx++) {
                    float *row = dxp + iy * d->w + c0 * sw - d->pad_w + kx;
                    /* one window position: distinct columns k*sw, no two k write the same element */
#pragma omp simd
                    for (int k = 0; k < n; k++) row[k * sw] += g[k];
                }
        }
    }
}

/* Max pooling of the plain planes; idx may be NULL (inference). */
static void pool_plain_max(const ps_pool_desc *d, const float *x, float *y, int32_t *idx) {
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d);
    const int64_t planes = (int64_t)d->n * d->c, plane = (int64_t)d->h * d->w;
#pragma omp parallel for if (planes * oh * ow * d->kh * d->kw >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++)
        pool_max_plane(d, x + p * plane, y + p * oh * ow, idx ? idx + p * oh * ow : NULL);
}

/* Gradient through the recorded maxima, summed in output order per plane. */
static void pool_plain_max_bwd(const ps_pool_desc *d, const int32_t *idx, const float *dy, float *dx) {
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d);
    const int64_t planes = (int64_t)d->n * d->c, plane = (int64_t)d->h * d->w;
#pragma omp parallel for if (planes * plane >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++) {
        float *dxp = dx + p * plane;
        memset(dxp, 0, (size_t)plane * sizeof *dxp);
        for (int o = 0; o < oh * ow; o++) dxp[idx[p * oh * ow + o]] += dy[p * oh * ow + o];
    }
}

static void pool_plain_avg(const ps_pool_desc *d, const float *x, float *y) {
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d);
    const int64_t planes = (int64_t)d->n * d->c, plane = (int64_t)d->h * d->w;
#pragma omp parallel for if (planes * oh * ow * d->kh * d->kw >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++) pool_avg_plane(d, x + p * plane, y + p * oh * ow);
}

static void pool_plain_avg_bwd(const ps_pool_desc *d, const float *dy, float *dx) {
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d);
    const int64_t planes = (int64_t)d->n * d->c, plane = (int64_t)d->h * d->w;
#pragma omp parallel for if (planes * oh * ow * d->kh * d->kw >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++) pool_avg_bwd_plane(d, dy + p * oh * ow, dx + p * plane);
}

/* Plain layout: a oneDNN primitive of kind for d with a JIT kernel, NULL
 * when the C kernels run instead. First the nchw primitive (AVX-512 has
 * nchw pooling kernels for channel counts it likes), else the blocked one
 * behind JIT reorders (every ISA has those; the reorders cost two passes
 * over the activations, far less than the C loops for small windows). For
 * max pooling the training forward and the backward must agree (they share
 * the workspace's format): both from the same choice, both JIT. */
static const prim_entry *plain_pool_entry(dn_impl *im, prim_kind kind, const ps_pool_desc *d) {
    /* global average pooling (AdaptiveAvgPool2d(1)): one sum per plane, the
     * C kernel's fast path beats two reorders */
    if ((kind == PK_AVGPOOL_FWD || kind == PK_AVGPOOL_BWD) && pool_is_global(d)) return NULL;
    /* ceil_mode past the padded input: oneDNN's divisor is kh*kw, PyTorch's the window within it */
    if ((kind == PK_AVGPOOL_FWD || kind == PK_AVGPOOL_BWD) && d->count_include_pad && ps_pool_ceil_extra(d))
        return NULL;
    if (im->pool_c) return NULL;
    prim_kind need[2] = { kind, kind };
    int nneed = 1;
    if (kind == PK_POOL_FWD_TRAINING || kind == PK_POOL_BWD) {
        need[0] = PK_POOL_FWD_TRAINING; need[1] = PK_POOL_BWD; nneed = 2;
    } else if (kind == PK_AVGPOOL_FWD || kind == PK_AVGPOOL_BWD) {
        need[0] = PK_AVGPOOL_FWD; need[1] = PK_AVGPOOL_BWD; nneed = 2;
    }
    for (int mode = 1; mode <= 2; mode++) {
        if (mode == 2 && !im->native_block) break;
        const prim_entry *e = NULL;
        int ok = 1;
        for (int i = 0; i < nneed && ok; i++) {
            prim_key k = pool_key(need[i], d);
            k.plain_try = mode;
            if (mode == 2) k.alg = im->native_block;
            ps_err err = { 0 };
            const prim_entry *t;
            if (get_entry(im, &k, &t, &err) != PS_OK || !t->impl || impl_is_reference(t->impl)) ok = 0;
            else if (need[i] == kind) e = t;
        }
        if (ok) return e;
    }
    return NULL;
}


/* 0 when the primitive cannot be created (the forward then reports why). */
static size_t dn_maxpool_workspace_size(void *impl, const ps_pool_desc *desc) {
    dn_impl *im = impl;
    set_threads(im);
    const ps_pool_desc d = ps_pool_resolve(desc);
    const prim_entry *e = NULL;
    if (d.layout != PS_LAYOUT_BLOCKED && !(e = plain_pool_entry(im, PK_POOL_FWD_TRAINING, &d)))
        return (size_t)d.n * d.c * ps_pool_out_h(&d) * ps_pool_out_w(&d) * sizeof(int32_t);
    prim_key k = pool_key(PK_POOL_FWD_TRAINING, &d);
    dnnl_primitive_t prim;
    const_dnnl_primitive_desc_t pd;
    if (e) prim = e->prim;
    else if (get_prim(im, &k, &prim, NULL) != PS_OK) return 0;
    if (dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success) return 0;
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_workspace_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

static ps_status dn_maxpool_forward(void *impl, const ps_pool_desc *desc, const float *x, float *y,
                                    void *workspace, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const ps_pool_desc d = ps_pool_resolve(desc);
    const prim_kind kind = workspace ? PK_POOL_FWD_TRAINING : PK_POOL_FWD_INFERENCE;
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DST, y }, { DNNL_ARG_WORKSPACE, workspace } };
    if (d.layout != PS_LAYOUT_BLOCKED) {
        const prim_entry *e = plain_pool_entry(im, kind, &d);
        if (e) return exec_entry(im, e, a, workspace ? 3 : 2, err);
        pool_plain_max(&d, x, y, workspace);
        return PS_OK;
    }
    prim_key k = pool_key(kind, &d);
    return run(im, &k, a, workspace ? 3 : 2, err);
}

/* ---- max-pool backward in the blocked layout, from oneDNN's workspace ----
 * oneDNN 2.6's blocked max-pool backward is slow on SSE4.1 (jit:sse41:
 * 0.56 ms for the small ResNet's 2x2 pool at batch 64, 7x its forward;
 * ~0.06 ms on AVX2 and AVX-512; this loop ~0.3 ms, bound by its stores),
 * so it replaces oneDNN's only where that is the jit:sse41 kernel. Its JIT
 * training forward records, per output element, which position of the
 * window held the maximum: one byte, kh index * kw + kw index, laid out
 * as the output (nChw8c / nChw16c). Where the workspace is exactly that
 * (ws_is_window_index: u8, the output's blocked layout, no padding, the
 * window inside the input) the gradient is one pass here: per output
 * block and window position, a lane-wise select of dy where the recorded
 * index is that position, added into dx. PS_DNNL_POOL_BWD=onednn runs
 * oneDNN's backward instead; tests/test_pool_bwd checks both against the
 * ref backend per ISA. */
typedef float pool_v8f __attribute__((vector_size(32)));
typedef int32_t pool_v8i __attribute__((vector_size(32)));
typedef uint8_t pool_v8u8 __attribute__((vector_size(8)));

/* One image's channel block: B lanes (8 or 16) as groups of 8, the window
 * index of a group widened to 32 bits once per output position; per window
 * position a compare and a mask of dy. */
PS_INLINE void pool_bwd_ws_block(const ps_pool_desc *d, int oh, int ow, const uint8_t *ws, const float *dy,
                                 float *dx, const int B) {
    /* windows that tile the input exactly (the usual 2x2 stride 2): every
     * dx element is written once, no zeroing pass first */
    const int tile = d->stride_h == d->kh && d->stride_w == d->kw && oh * d->kh == d->h && ow * d->kw == d->w;
    if (!tile) memset(dx, 0, (size_t)d->h * d->w * B * sizeof *dx);
    for (int oy = 0; oy < oh; oy++)
        for (int ox = 0; ox < ow; ox++)
            for (int l0 = 0; l0 < B; l0 += 8) {
                const int64_t o = ((int64_t)oy * ow + ox) * B + l0;
                const uint8_t *wp = ws + o;
                pool_v8u8 w8;
                memcpy(&w8, wp, sizeof w8);
                const pool_v8i idx = __builtin_convertvector(w8, pool_v8i);
                pool_v8f g;
                memcpy(&g, dy + o, sizeof g);
                for (int ky = 0; ky < d->kh; ky++)
                    for (int kx = 0; kx < d->kw; kx++) {
                        const pool_v8i m = idx == (ky * d->kw + kx);    /* all ones where the max was */
                        const pool_v8f v = (pool_v8f)((pool_v8i)g & m);
                        float *t = dx + ((int64_t)(oy * d->stride_h + ky) * d->w + ox * d->stride_w + kx) * B + l0;
                        if (tile) {
                            memcpy(t, &v, sizeof v);
                        } else {
                            pool_v8f acc;
                            memcpy(&acc, t, sizeof acc);
                            acc += v;
                            memcpy(t, &acc, sizeof acc);
                        }
                    }
            }
}

PS_CLONES static void pool_bwd_ws8(const ps_pool_desc *d, int oh, int ow, const uint8_t *ws, const float *dy,
                                   float *dx) {
    pool_bwd_ws_block(d, oh, ow, ws, dy, dx, 8);
}

PS_CLONES static void pool_bwd_ws16(const ps_pool_desc *d, int oh, int ow, const uint8_t *ws, const float *dy,
                                    float *dx) {
    pool_bwd_ws_block(d, oh, ow, ws, dy, dx, 16);
}

/* The block B (8 or 16) when the training forward's workspace for d (its
 * primitive desc pd) is the window index described above, else 0. */
static int ws_is_window_index(const ps_pool_desc *d, const_dnnl_primitive_desc_t pd) {
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d);
    if (d->pad_h || d->pad_w || d->kh * d->kw > 255 || (oh - 1) * d->stride_h + d->kh > d->h ||
        (ow - 1) * d->stride_w + d->kw > d->w)
        return 0;
    const dnnl_memory_desc_t *ws = dnnl_primitive_desc_query_md(pd, dnnl_query_workspace_md, 0);
    const dnnl_memory_desc_t *dst = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    if (!ws || !dst || ws->data_type != dnnl_u8 || ws->format_kind != dnnl_blocked || ws->ndims != 4) return 0;
    const dnnl_blocking_desc_t *bw = &ws->format_desc.blocking, *bd = &dst->format_desc.blocking;
    if (bw->inner_nblks != 1 || bw->inner_idxs[0] != 1 || (bw->inner_blks[0] != 8 && bw->inner_blks[0] != 16))
        return 0;
    const int64_t B = bw->inner_blks[0];
    const int64_t want[4] = { (d->c / B) * oh * ow * B, (int64_t)oh * ow * B, (int64_t)ow * B, B };
    const int64_t dims[4] = { d->n, d->c, oh, ow };
    if (d->c % B || dst->format_kind != dnnl_blocked || bd->inner_nblks != 1 || bd->inner_blks[0] != B) return 0;
    for (int i = 0; i < 4; i++)
        if (ws->dims[i] != dims[i] || ws->padded_dims[i] != dims[i] || bw->strides[i] != want[i] ||
            bd->strides[i] != want[i] || ws->padded_offsets[i])
            return 0;
    return ws->offset0 == 0 ? (int)B : 0;
}

/* pool_bwd_ws over the (image, channel block) planes; 0 when it does not
 * apply (then oneDNN's backward runs). */
static int pool_bwd_ws(dn_impl *im, const prim_entry *be, const ps_pool_desc *d, const void *workspace,
                       const float *dy, float *dx) {
    if (im->no_pool_bwd_c) return 0;
    /* only where oneDNN's own backward (be) is its slow SSE4.1 kernel: its
     * AVX2 and AVX-512 ones are faster than this loop (~1 against ~4.5 us
     * a sample for the small ResNet's pool) */
    if (!be->impl || !strstr(be->impl, "sse41")) return 0;
    prim_key k = pool_key(PK_POOL_FWD_TRAINING, d);
    dnnl_primitive_t prim;
    const_dnnl_primitive_desc_t pd;
    if (get_prim(im, &k, &prim, NULL) != PS_OK || dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success)
        return 0;
    const int B = ws_is_window_index(d, pd);
    if (!B) return 0;
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d);
    const int64_t planes = (int64_t)d->n * (d->c / B), in = (int64_t)d->h * d->w * B, out = (int64_t)oh * ow * B;
    const uint8_t *ws = workspace;
#pragma omp parallel for if (planes * in >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++) {
        if (B == 8) pool_bwd_ws8(d, oh, ow, ws + p * out, dy + p * out, dx + p * in);
        else pool_bwd_ws16(d, oh, ow, ws + p * out, dy + p * out, dx + p * in);
    }
    return 1;
}

static ps_status dn_maxpool_backward(void *impl, const ps_pool_desc *desc, const void *workspace,
                                     const float *dy, float *dx, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const ps_pool_desc d = ps_pool_resolve(desc);
    exec_arg a[] = { { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_WORKSPACE, workspace },
                     { DNNL_ARG_DIFF_SRC, dx } };
    if (d.layout != PS_LAYOUT_BLOCKED) {
        const prim_entry *e = plain_pool_entry(im, PK_POOL_BWD, &d);
        if (e) return exec_entry(im, e, a, 3, err);
        pool_plain_max_bwd(&d, workspace, dy, dx);
        return PS_OK;
    }
    prim_key k = pool_key(PK_POOL_BWD, &d);
    const prim_entry *be;
    ps_status st = get_entry(im, &k, &be, err);
    if (st != PS_OK) return st;
    if (pool_bwd_ws(im, be, &d, workspace, dy, dx)) return PS_OK;
    return exec_entry(im, be, a, 3, err);
}

static ps_status dn_avgpool_forward(void *impl, const ps_pool_desc *desc, const float *x, float *y,
                                    ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const ps_pool_desc d = ps_pool_resolve(desc);
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DST, y } };
    if (d.layout != PS_LAYOUT_BLOCKED) {
        const prim_entry *e = plain_pool_entry(im, PK_AVGPOOL_FWD, &d);
        if (e) return exec_entry(im, e, a, 2, err);
        pool_plain_avg(&d, x, y);
        return PS_OK;
    }
    prim_key k = pool_key(PK_AVGPOOL_FWD, &d);
    return run(im, &k, a, 2, err);
}

static ps_status dn_avgpool_backward(void *impl, const ps_pool_desc *desc, const float *dy, float *dx,
                                     ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const ps_pool_desc d = ps_pool_resolve(desc);
    exec_arg a[] = { { DNNL_ARG_DIFF_DST, dy }, { DNNL_ARG_DIFF_SRC, dx } };
    if (d.layout != PS_LAYOUT_BLOCKED) {
        const prim_entry *e = plain_pool_entry(im, PK_AVGPOOL_BWD, &d);
        if (e) return exec_entry(im, e, a, 2, err);
        pool_plain_avg_bwd(&d, dy, dx);
        return PS_OK;
    }
    prim_key k = pool_key(PK_AVGPOOL_BWD, &d);
    return run(im, &k, a, 2, err);
}

/* ---- adaptive average pooling with uneven bins: C loops over planes ----
 * oneDNN's pooling has one window size and stride per axis; PyTorch's
 * adaptive bins (backend.h ps_adaptive_desc) differ in size from one
 * output to the next where the output size does not divide the input's
 * (vgg's 2x2 to 7x7, alexnet's 1x1 to 6x6), so these run here, in the
 * plain layout the kind asks for. Uniform bins never come here: the kind
 * runs them as average pooling (oneDNN's, in blocked layouts). */
static ps_status dn_adaptive_avgpool_forward(void *impl, const ps_adaptive_desc *d, const float *x, float *y,
                                             ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t planes = (int64_t)d->n * d->c, in = (int64_t)d->h * d->w, out = (int64_t)d->oh * d->ow;
#pragma omp parallel for if (planes * (in > out ? in : out) >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++) {
        const float *xp = x + p * in;
        float *yp = y + p * out;
        for (int oy = 0; oy < d->oh; oy++) {
            const int y0 = ps_adaptive_start(oy, d->h, d->oh), y1 = ps_adaptive_end(oy, d->h, d->oh);
            for (int ox = 0; ox < d->ow; ox++) {
                const int x0 = ps_adaptive_start(ox, d->w, d->ow), x1 = ps_adaptive_end(ox, d->w, d->ow);
                float acc = 0.0f;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) acc += xp[iy * d->w + ix];
                yp[oy * d->ow + ox] = acc / (float)((y1 - y0) * (x1 - x0));
            }
        }
    }
    return PS_OK;
}

static ps_status dn_adaptive_avgpool_backward(void *impl, const ps_adaptive_desc *d, const float *dy, float *dx,
                                              ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t planes = (int64_t)d->n * d->c, in = (int64_t)d->h * d->w, out = (int64_t)d->oh * d->ow;
#pragma omp parallel for if (planes * (in > out ? in : out) >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++) {
        const float *gp = dy + p * out;
        float *dxp = dx + p * in;
        memset(dxp, 0, (size_t)in * sizeof *dxp);
        for (int oy = 0; oy < d->oh; oy++) {
            const int y0 = ps_adaptive_start(oy, d->h, d->oh), y1 = ps_adaptive_end(oy, d->h, d->oh);
            for (int ox = 0; ox < d->ow; ox++) {
                const int x0 = ps_adaptive_start(ox, d->w, d->ow), x1 = ps_adaptive_end(ox, d->w, d->ow);
                const float g = gp[oy * d->ow + ox] / (float)((y1 - y0) * (x1 - x0));
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) dxp[iy * d->w + ix] += g;
            }
        }
    }
    return PS_OK;
}

/* ---- upsampling: C loops over planes ----
 * oneDNN 2.6's resampling primitive computes 'nearest' as round((o + 0.5)
 * * in / out - 0.5) and 'linear' from the sizes alone, where PyTorch's
 * nearest takes floor(o * scale) and both take 1 / scale_factor when one
 * is given (backend.h ps_resize_desc): they differ at non-integer scales,
 * so upsampling runs here, in the plain layout, by backend.h's rules. The
 * source indices and weights of the rows and of the columns are computed
 * once per call; a plane's outputs are then a gather (nearest) or four
 * multiply-adds in PyTorch's order (bilinear). */
typedef struct dn_resize_axis {
    int *i0, *i1;
    float *l1;
} dn_resize_axis;

static int dn_resize_axis_make(dn_resize_axis *a, int out, int in, float scale, const ps_resize_desc *d) {
    a->i0 = malloc((size_t)out * sizeof *a->i0);
    a->i1 = malloc((size_t)out * sizeof *a->i1);
    a->l1 = malloc((size_t)out * sizeof *a->l1);
    if (!a->i0 || !a->i1 || !a->l1) return -1;
    for (int o = 0; o < out; o++) {
        if (d->bilinear) {
            ps_resize_linear(o, in, out, scale, d->align_corners, &a->i0[o], &a->i1[o], &a->l1[o]);
        } else {
            a->i0[o] = a->i1[o] = ps_resize_nearest(o, in, out, scale);
            a->l1[o] = 0.0f;
        }
    }
    return 0;
}

static void dn_resize_axis_free(dn_resize_axis *a) {
    free(a->i0);
    free(a->i1);
    free(a->l1);
}

static ps_status dn_resize(void *impl, const ps_resize_desc *d, const float *x, float *y, const float *dy,
                           float *dx, ps_err *err) {
    set_threads(impl);
    dn_resize_axis ay = {0}, ax = {0};
    if (dn_resize_axis_make(&ay, d->oh, d->h, d->scale_h, d) || dn_resize_axis_make(&ax, d->ow, d->w, d->scale_w, d)) {
        dn_resize_axis_free(&ay);
        dn_resize_axis_free(&ax);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dnnl resize: out of memory");
    }
    const int64_t planes = (int64_t)d->n * d->c, in = (int64_t)d->h * d->w, out = (int64_t)d->oh * d->ow;
    const int w = d->w, ow = d->ow;
#pragma omp parallel for if (planes * (in > out ? in : out) >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++) {
        if (dx) {   /* the adjoint: each output's gradient to the inputs it read */
            const float *gp = dy + p * out;
            float *dxp = dx + p * in;
            memset(dxp, 0, (size_t)in * sizeof *dxp);
            for (int oy = 0; oy < d->oh; oy++) {
                const float ly1 = ay.l1[oy], ly0 = 1.0f - ly1;
                float *r0 = dxp + (int64_t)ay.i0[oy] * w, *r1 = dxp + (int64_t)ay.i1[oy] * w;
                for (int ox = 0; ox < ow; ox++) {
                    const float g = gp[(int64_t)oy * ow + ox], lx1 = ax.l1[ox], lx0 = 1.0f - lx1;
                    if (!d->bilinear) { r0[ax.i0[ox]] += g; continue; }
                    r0[ax.i0[ox]] += ly0 * lx0 * g;
                    r0[ax.i1[ox]] += ly0 * lx1 * g;
                    r1[ax.i0[ox]] += ly1 * lx0 * g;
                    r1[ax.i1[ox]] += ly1 * lx1 * g;
                }
            }
            continue;
        }
        const float *xp = x + p * in;
        float *yp = y + p * out;
        for (int oy = 0; oy < d->oh; oy++) {
            const float ly1 = ay.l1[oy], ly0 = 1.0f - ly1;
            const float *r0 = xp + (int64_t)ay.i0[oy] * w, *r1 = xp + (int64_t)ay.i1[oy] * w;
            float *yr = yp + (int64_t)oy * ow;
            if (!d->bilinear) {
                for (int ox = 0; ox < ow; ox++) yr[ox] = r0[ax.i0[ox]];
                continue;
            }
            for (int ox = 0; ox < ow; ox++) {
                const float lx1 = ax.l1[ox], lx0 = 1.0f - lx1;
                yr[ox] = ly0 * (lx0 * r0[ax.i0[ox]] + lx1 * r0[ax.i1[ox]]) +
                         ly1 * (lx0 * r1[ax.i0[ox]] + lx1 * r1[ax.i1[ox]]);
            }
        }
    }
    dn_resize_axis_free(&ay);
    dn_resize_axis_free(&ax);
    return PS_OK;
}

static ps_status dn_resize_forward(void *impl, const ps_resize_desc *d, const float *x, float *y, ps_err *err) {
    return dn_resize(impl, d, x, y, NULL, NULL, err);
}

static ps_status dn_resize_backward(void *impl, const ps_resize_desc *d, const float *dy, float *dx, ps_err *err) {
    return dn_resize(impl, d, NULL, NULL, dy, dx, err);
}

/* ConvTranspose2d's bias over an (n, c, s) tensor, plain or blocked (B
 * channels a position: the B-channel block j/B of sample i is s * B
 * contiguous floats). */
static ps_status dn_bias_add(void *impl, const ps_chan_desc *d, const float *b, float *y, ps_err *err) {
    (void)err;
    dn_impl *im = impl;
    set_threads(im);
    const int64_t B = d->layout == PS_LAYOUT_BLOCKED ? block_of(im->block, d->c) : 0;
    if (d->layout == PS_LAYOUT_BLOCKED && !B)
        return ps_err_set(err, PS_ERR_INTERNAL, "dnnl bias_add: %d channels are not blocked", d->c);
    const int64_t planes = B ? (int64_t)d->n * (d->c / B) : (int64_t)d->n * d->c, s = d->s;
#pragma omp parallel for if (planes * s * (B ? B : 1) >= PS_OMP_MIN) schedule(static)
    for (int64_t p = 0; p < planes; p++) {
        if (!B) {
            const float v = b[p % d->c];
            float *yp = y + p * s;
#pragma omp simd
            for (int64_t i = 0; i < s; i++) yp[i] += v;
            continue;
        }
        const float *bb = b + p % (d->c / B) * B;
        float *yp = y + p * s * B;
        for (int64_t i = 0; i < s; i++)
#pragma omp simd
            for (int64_t j = 0; j < B; j++) yp[i * B + j] += bb[j];
    }
    return PS_OK;
}

static ps_status dn_bias_grad(void *impl, const ps_chan_desc *d, const float *dy, float *db, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const int B = d->layout == PS_LAYOUT_BLOCKED ? block_of(im->block, d->c) : 0;
    if (d->layout == PS_LAYOUT_BLOCKED && !B)
        return ps_err_set(err, PS_ERR_INTERNAL, "dnnl bias_grad: %d channels are not blocked", d->c);
    bias_grad(dy, d->n, d->c, d->s, B, db);
    return PS_OK;
}

/* ---- a wide linear forward in chunks of outputs ----
 * The language model's decoder (700 x 200 -> 10000 outputs, 8 MB of
 * weights) as one gemm inner product makes oneDNN's sgemm malloc a packing
 * buffer as large as the weights on every call, from whichever malloc
 * arena the calling thread (a gRPC worker, an OpenMP worker) uses; psd's
 * first ~20 windows first-touch a fresh one in arena after arena (300-400
 * MB, 1-1.5 page faults a token at ~14 us each on the CI guest). Here the
 * outputs go in chunks of ~2 MB of weights, each one dnnl_sgemm adding its
 * products to the chunk's columns of y (ldc = out), set to the bias first:
 * the packing buffer is a chunk's, reused call after call. The products'
 * sum plus the bias, as the inner product's post-op adds it. Used when the
 * layer has at least two chunks of LIN_CHUNK_MIN outputs;
 * PS_DNNL_LINEAR_CHUNK=0 turns it off (for comparison). */
#define LIN_CHUNK_BYTES ((size_t)2 << 20)
#define LIN_CHUNK_MIN 1024

/* outputs per chunk for d, or 0: one inner product */
static int lin_chunk_of(const dn_impl *im, const ps_linear_desc *d) {
    if (im->no_lin_chunk || d->in <= 0) return 0;
    size_t per = LIN_CHUNK_BYTES / ((size_t)d->in * sizeof(float));  /* <= 512 Ki outputs */
    int cw = per > (size_t)LIN_CHUNK_MIN ? (int)per : LIN_CHUNK_MIN;
    if (d->out / 2 < cw) return 0;
    int nchunk = (d->out + cw - 1) / cw;
    cw = (d->out + nchunk - 1) / nchunk;
    return (cw + 15) / 16 * 16;   /* whole 64-byte lines of y per row */
}

/* the chunk's columns of every row of y set to its bias: the GEMM then adds
 * the products to them (beta 1) as it stores its results, where a pass
 * adding the bias afterwards would read and write y again (~4 ms a window
 * of 28 MB logits here, a third of the GEMM) */
static void bias_fill_rows(float *y, const float *b, int n, int cols, int64_t ld) {
    for (int i = 0; i < n; i++) memcpy(y + (int64_t)i * ld, b, (size_t)cols * sizeof(float));
}

static ps_status linear_fwd_chunks(const ps_linear_desc *d, int cw, const float *x, const float *w,
                                   const float *b, float *y, ps_err *err) {
    for (int c0 = 0; c0 < d->out; c0 += cw) {
        const int cols = d->out - c0 < cw ? d->out - c0 : cw;
        if (b) bias_fill_rows(y + c0, b + c0, d->n, cols, d->out);
        PS_DNNL_CHECK(dnnl_sgemm('N', 'T', d->n, cols, d->in, 1.0f, x, d->in, w + (int64_t)c0 * d->in, d->in,
                                 b ? 1.0f : 0.0f, y + c0, d->out));
    }
    return PS_OK;
}

static ps_status dn_linear_forward(void *impl, const ps_linear_desc *d, const float *x,
                                     const float *w, const float *b, float *y, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    const int cw = lin_chunk_of(im, d);
    if (cw) return linear_fwd_chunks(d, cw, x, w, b, y, err);
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
    if (db) bias_grad(dy, d->n, d->out, 1, 0, db);
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

static void softmax_rows_bwd(int64_t rows, int cols, int log, const float *y, const float *dy, float *dx);

/* Row-wise, as softmax_backward (softmax_rows_bwd): oneDNN 2.6's
 * log-softmax backward is ref:any below AVX-512 too, and a classifier's
 * LogSoftmax runs it every step. */
static ps_status dn_log_softmax_backward(void *impl, int rows, int cols, const float *y,
                                           const float *dy, float *dx, ps_err *err) {
    (void)err;
    set_threads(impl);
    softmax_rows_bwd(rows, cols, 1, y, dy, dx);
    return PS_OK;
}

static ps_status dn_mul(void *impl, int64_t count, const float *x, const float *mask, float *y,
                          ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) y[i] = x[i] * mask[i];
    return PS_OK;
}

static ps_status dn_sgd_update(void *impl, int64_t count, float *w_out, const float *w, const float *g,
                               float *buf, const ps_sgd_desc *s, ps_err *err) {
    (void)err;
    set_threads(impl);
    const float lr = s->lr, mom = s->momentum, wd = s->weight_decay;
    if (mom == 0.0f) {
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) w_out[i] = w[i] - lr * (g[i] + wd * w[i]);
    } else if (s->first_step) {
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) {
            buf[i] = g[i] + wd * w[i];
            w_out[i] = w[i] - lr * buf[i];
        }
    } else {
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) {
            buf[i] = mom * buf[i] + (g[i] + wd * w[i]);
            w_out[i] = w[i] - lr * buf[i];
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
static ps_status dn_adam_update(void *impl, int64_t count, float *w_out, const float *w, const float *g, float *m,
                                float *v, const ps_adam_desc *d, ps_err *err) {
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
        w_out[i] = w[i] + nss * (mi / (sqrtf(vi) / bc2s + eps));
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

/* Row-wise (log-)softmax backward: an OpenMP loop, not oneDNN's
 * primitives - oneDNN 2.6 has only its reference kernel (ref:any) for
 * them below AVX-512, and multi-head attention runs the softmax's over
 * every head's L x L weights. Softmax: dx = y * (dy - sum(dy * y));
 * log-softmax: dx = dy - exp(y) * sum(dy); the sums in double. Every
 * backward of a softmax over the last dimension comes here
 * (softmax_backward, log_softmax_backward, softmax_dim_backward's
 * inner 1). */
static void softmax_rows_bwd(int64_t rows, int cols, int log, const float *y, const float *dy, float *dx) {
#pragma omp parallel for if (rows * cols >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * cols, *dyr = dy + r * cols;
        float *dxr = dx + r * cols;
        double s = 0;
        if (log) {
#pragma omp simd reduction(+ : s)
            for (int j = 0; j < cols; j++) s += (double)dyr[j];
            const float sf = (float)s;
            for (int j = 0; j < cols; j++) dxr[j] = dyr[j] - expf(yr[j]) * sf;
        } else {
#pragma omp simd reduction(+ : s)
            for (int j = 0; j < cols; j++) s += (double)dyr[j] * yr[j];
            const float sf = (float)s;
#pragma omp simd
            for (int j = 0; j < cols; j++) dxr[j] = yr[j] * (dyr[j] - sf);
        }
    }
}

static ps_status dn_softmax_backward(void *impl, int64_t rows, int cols, const float *y,
                                     const float *dy, float *dx, ps_err *err) {
    (void)err;
    set_threads(impl);
    softmax_rows_bwd(rows, cols, 0, y, dy, dx);
    return PS_OK;
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

/* ---- activations: oneDNN eltwise (JIT on every ISA for these algorithms) ----
 * The *_use_dst_for_bwd algorithms compute the same forward and take dst
 * in the backward: the kinds whose backward reads y (backend.h). clip_v2's
 * backward is 1 strictly inside (alpha, beta), as PyTorch's hardtanh.
 * oneDNN 2.6 has no hard sigmoid: dnnl_alg_kind_undef runs the C kernel
 * below (act_c_forward / act_c_backward). */
typedef struct act_alg {
    dnnl_alg_kind_t alg;
    int use_alpha;      /* alpha (and beta) from the descriptor; else the fixed ones */
    float alpha;
} act_alg;

static const act_alg kActAlg[PS_ACT_COUNT] = {
    [PS_ACT_RELU] = { dnnl_eltwise_relu_use_dst_for_bwd, 0, 0.0f },
    [PS_ACT_LEAKY_RELU] = { dnnl_eltwise_relu, 1, 0.0f },
    [PS_ACT_GELU] = { dnnl_eltwise_gelu_erf, 0, 0.0f },
    [PS_ACT_GELU_TANH] = { dnnl_eltwise_gelu_tanh, 0, 0.0f },
    [PS_ACT_SILU] = { dnnl_eltwise_swish, 0, 1.0f },           /* x * sigmoid(1 * x) */
    [PS_ACT_TANH] = { dnnl_eltwise_tanh_use_dst_for_bwd, 0, 0.0f },
    [PS_ACT_SIGMOID] = { dnnl_eltwise_logistic_use_dst_for_bwd, 0, 0.0f },
    [PS_ACT_HARDTANH] = { dnnl_eltwise_clip_v2_use_dst_for_bwd, 1, 0.0f },  /* clip to [alpha, beta] */
    [PS_ACT_HARDSWISH] = { dnnl_eltwise_hardswish, 0, 0.0f },
    [PS_ACT_HARDSIGMOID] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_ELU] = { dnnl_eltwise_elu, 1, 0.0f },
    [PS_ACT_SELU] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_SOFTPLUS] = { dnnl_eltwise_soft_relu, 0, 0.0f },   /* beta 1, threshold >= 20 only: act_alg_of */
    [PS_ACT_MISH] = { dnnl_eltwise_mish, 0, 0.0f },
    [PS_ACT_LOGSIGMOID] = { dnnl_eltwise_logsigmoid, 0, 0.0f },
    [PS_ACT_EXP] = { dnnl_eltwise_exp, 0, 0.0f },
    [PS_ACT_LOG] = { dnnl_alg_kind_undef, 0, 0.0f },           /* oneDNN's is off by 1.4e-6 at log(1): libm's */
    [PS_ACT_ABS] = { dnnl_eltwise_abs, 0, 0.0f },
    [PS_ACT_SQRT] = { dnnl_eltwise_sqrt, 0, 0.0f },
    [PS_ACT_POW] = { dnnl_eltwise_pow, 1, 0.0f },              /* 1 * x ^ exponent: act_key */
    [PS_ACT_LINEAR] = { dnnl_alg_kind_undef, 0, 0.0f },        /* a * x + b: a C loop each way */
    /* shrinks and thresholds: oneDNN 2.6 has none of them (CELU at alpha 1 is its elu: act_alg_of) */
    [PS_ACT_CELU] = { dnnl_alg_kind_undef, 1, 0.0f },
    [PS_ACT_SOFTSIGN] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_TANHSHRINK] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_HARDSHRINK] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_SOFTSHRINK] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_THRESHOLD] = { dnnl_alg_kind_undef, 0, 0.0f },
    /* log1p, expm1, sin, cos and the comparisons: oneDNN 2.6 has none (math_f below) */
    [PS_ACT_LOG1P] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_EXPM1] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_SIN] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_COS] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_GT] = { dnnl_alg_kind_undef, 1, 0.0f },
    [PS_ACT_LT] = { dnnl_alg_kind_undef, 1, 0.0f },
    [PS_ACT_GE] = { dnnl_alg_kind_undef, 1, 0.0f },
    [PS_ACT_LE] = { dnnl_alg_kind_undef, 1, 0.0f },
    [PS_ACT_ERF] = { dnnl_alg_kind_undef, 0, 0.0f },
    [PS_ACT_SIGN] = { dnnl_alg_kind_undef, 0, 0.0f },
};

#define SELU_ALPHA 1.67326324235437728f
#define SELU_SCALE 1.05070098735548049f

/* oneDNN's soft_relu is softplus with beta 1; its log(1 + exp(x)) equals x
 * in float32 from x ~ 17 on, so PyTorch's threshold (20 by default) only
 * shows below that: those run the C loop. */
static dnnl_alg_kind_t act_alg_of(const ps_act_desc *d) {
    if (d->kind == PS_ACT_SOFTPLUS && !(d->alpha == 1.0f && d->beta >= 20.0f)) return dnnl_alg_kind_undef;
    if (d->kind == PS_ACT_CELU && d->alpha == 1.0f) return dnnl_eltwise_elu;   /* alpha * (exp(x / alpha) - 1) */
    return kActAlg[d->kind].alg;
}

static float softplus_f(float z) { return z > 0.0f ? z + log1pf(expf(-z)) : log1pf(expf(z)); }

/* The shrinks and thresholds, one element each way (a: alpha, b: beta). */
static float shrink_f(int kind, float a, float b, float x) {
    switch (kind) {
    case PS_ACT_CELU: return x > 0.0f ? x : a * expm1f(x / a);
    case PS_ACT_SOFTSIGN: return x / (1.0f + fabsf(x));
    case PS_ACT_TANHSHRINK: return x - tanhf(x);
    case PS_ACT_HARDSHRINK: return x > a || x < -a ? x : 0.0f;
    case PS_ACT_SOFTSHRINK: return x > a ? x - a : x < -a ? x + a : 0.0f;
    default: return x > a ? x : b;      /* PS_ACT_THRESHOLD */
    }
}

static float shrink_df(int kind, float a, float x, float dy) {
    switch (kind) {
    case PS_ACT_CELU: return x > 0.0f ? dy : dy * expf(x / a);
    case PS_ACT_SOFTSIGN: {
        const float q = 1.0f + fabsf(x);
        return dy / (q * q);
    }
    case PS_ACT_TANHSHRINK: {
        const float t = tanhf(x);
        return dy * t * t;
    }
    case PS_ACT_HARDSHRINK:
    case PS_ACT_SOFTSHRINK: return x > a || x < -a ? dy : 0.0f;
    default: return x > a ? dy : 0.0f;  /* PS_ACT_THRESHOLD */
    }
}

/* log1p, expm1, sin, cos and the comparisons with a (gradient zero), one
 * element each way */
static float math_f(int kind, float a, float x) {
    switch (kind) {
    case PS_ACT_LOG1P: return log1pf(x);
    case PS_ACT_EXPM1: return expm1f(x);
    case PS_ACT_SIN: return sinf(x);
    case PS_ACT_COS: return cosf(x);
    case PS_ACT_GT: return x > a ? 1.0f : 0.0f;
    case PS_ACT_LT: return x < a ? 1.0f : 0.0f;
    case PS_ACT_GE: return x >= a ? 1.0f : 0.0f;
    case PS_ACT_ERF: return erff(x);
    case PS_ACT_SIGN: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;   /* NaN and -0: 0, as PyTorch */
    default: return x <= a ? 1.0f : 0.0f;   /* PS_ACT_LE */
    }
}

static float math_df(int kind, float x, float dy) {
    switch (kind) {
    case PS_ACT_LOG1P: return dy / (1.0f + x);
    case PS_ACT_EXPM1: return dy * expf(x);
    case PS_ACT_SIN: return dy * cosf(x);
    case PS_ACT_COS: return -dy * sinf(x);
    case PS_ACT_ERF: return dy * 1.12837916709551257390f * expf(-x * x);
    default: return 0.0f;                   /* the comparisons, sign */
    }
}

/* The activations oneDNN 2.6 lacks (or lacks with these attributes), as
 * the reference computes them, in float. */
static void act_c_forward(const ps_act_desc *d, int64_t count, const float *x, float *y) {
    const float a = d->alpha, b = d->beta;
    switch (d->kind) {
    case PS_ACT_SELU:
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) y[i] = SELU_SCALE * (x[i] > 0.0f ? x[i] : SELU_ALPHA * expm1f(x[i]));
        break;
    case PS_ACT_SOFTPLUS:
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) y[i] = a * x[i] > b ? x[i] : softplus_f(a * x[i]) / a;
        break;
    case PS_ACT_LINEAR:
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) y[i] = a * x[i] + b;
        break;
    case PS_ACT_LOG:
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) y[i] = logf(x[i]);
        break;
    case PS_ACT_CELU:
    case PS_ACT_SOFTSIGN:
    case PS_ACT_TANHSHRINK:
    case PS_ACT_HARDSHRINK:
    case PS_ACT_SOFTSHRINK:
    case PS_ACT_THRESHOLD: {
        const int kind = d->kind;
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) y[i] = shrink_f(kind, a, b, x[i]);
        break;
    }
    case PS_ACT_LOG1P:
    case PS_ACT_EXPM1:
    case PS_ACT_SIN:
    case PS_ACT_COS:
    case PS_ACT_GT:
    case PS_ACT_LT:
    case PS_ACT_GE:
    case PS_ACT_LE:
    case PS_ACT_ERF:
    case PS_ACT_SIGN: {
        const int kind = d->kind;
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) y[i] = math_f(kind, a, x[i]);
        break;
    }
    default:            /* PS_ACT_HARDSIGMOID */
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) {
            const float v = x[i];
            y[i] = v <= -3.0f ? 0.0f : v >= 3.0f ? 1.0f : v / 6.0f + 0.5f;
        }
    }
}

static void act_c_backward(const ps_act_desc *d, int64_t count, const float *x, const float *dy, float *dx) {
    const float a = d->alpha, b = d->beta;
    switch (d->kind) {
    case PS_ACT_SELU:
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) dx[i] = dy[i] * SELU_SCALE * (x[i] > 0.0f ? 1.0f : SELU_ALPHA * expf(x[i]));
        break;
    case PS_ACT_SOFTPLUS:
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) dx[i] = a * x[i] > b ? dy[i] : dy[i] / (1.0f + expf(-a * x[i]));
        break;
    case PS_ACT_LINEAR:
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) dx[i] = a * dy[i];
        break;
    case PS_ACT_LOG:
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) dx[i] = dy[i] / x[i];
        break;
    case PS_ACT_CELU:
    case PS_ACT_SOFTSIGN:
    case PS_ACT_TANHSHRINK:
    case PS_ACT_HARDSHRINK:
    case PS_ACT_SOFTSHRINK:
    case PS_ACT_THRESHOLD: {
        const int kind = d->kind;
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) dx[i] = shrink_df(kind, a, x[i], dy[i]);
        break;
    }
    case PS_ACT_LOG1P:
    case PS_ACT_EXPM1:
    case PS_ACT_SIN:
    case PS_ACT_COS:
    case PS_ACT_GT:
    case PS_ACT_LT:
    case PS_ACT_GE:
    case PS_ACT_LE:
    case PS_ACT_ERF:
    case PS_ACT_SIGN: {
        const int kind = d->kind;
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) dx[i] = math_df(kind, x[i], dy[i]);
        break;
    }
    default:            /* PS_ACT_HARDSIGMOID */
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) dx[i] = x[i] > -3.0f && x[i] < 3.0f ? dy[i] / 6.0f : 0.0f;
    }
}

static ps_status act_key(prim_kind kind, const ps_act_desc *d, int64_t count, prim_key *k, ps_err *err) {
    if (d->kind < 0 || d->kind >= PS_ACT_COUNT)
        return ps_err_set(err, PS_ERR_INTERNAL, "dnnl: unknown activation %d", d->kind);
    const act_alg *a = &kActAlg[d->kind];
    float alpha = a->use_alpha ? d->alpha : a->alpha, beta = a->use_alpha ? d->beta : 0.0f;
    if (d->kind == PS_ACT_POW) {            /* oneDNN's pow is alpha * x ^ beta */
        alpha = 1.0f;
        beta = d->alpha;
    }
    *k = key_make(kind, 0, 1, &count);
    k->alg = (int32_t)act_alg_of(d);
    memcpy(&k->alpha_bits, &alpha, sizeof alpha);
    memcpy(&k->beta_bits, &beta, sizeof beta);
    return PS_OK;
}

static ps_status dn_act_forward(void *impl, const ps_act_desc *d, int64_t count, const float *x, float *y,
                                ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    if (count <= 0) return PS_OK;
    prim_key k;
    ps_status st = act_key(PK_ELTWISE_FWD, d, count, &k, err);
    if (st) return st;
    if (k.alg == (int32_t)dnnl_alg_kind_undef) {
        act_c_forward(d, count, x, y);
        return PS_OK;
    }
    exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DST, y } };
    return run(im, &k, a, 2, err);
}

static ps_status dn_act_backward(void *impl, const ps_act_desc *d, int64_t count, const float *x, const float *y,
                                 const float *dy, float *dx, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    if (count <= 0) return PS_OK;
    prim_key k;
    ps_status st = act_key(PK_ELTWISE_BWD, d, count, &k, err);
    if (st) return st;
    const int rx = ps_act_backward_reads_x(d->kind);
    if (k.alg == (int32_t)dnnl_alg_kind_undef) {
        act_c_backward(d, count, x, dy, dx);
        return PS_OK;
    }
    exec_arg a[] = { { rx ? DNNL_ARG_SRC : DNNL_ARG_DST, rx ? x : y }, { DNNL_ARG_DIFF_DST, dy },
                     { DNNL_ARG_DIFF_SRC, dx } };
    return run(im, &k, a, 3, err);
}

/* ---- batch normalisation: C kernels ----
 * oneDNN 2.6 has no JIT batch normalisation for plain layouts (ncsp_bnorm)
 * nor for nChw16c below AVX-512 (bnorm_ref). Memory bound: the forward
 * reads x three times (mean, squared deviations, output), the backward
 * twice; OpenMP over channel groups; sums as PS_SUM_CHUNK says. A
 * group is L channels j0..j0+L-1 whose element (i, p, lane) is at
 * base + i*istride + p*pstride + lane:
 *   plain, s > 1:  one channel,          base j*s,     istride c*s, pstride 1
 *   plain, s == 1: up to 16 channels,    base j0,      istride c
 *   blocked:       one block of B lanes, base jb*s*B,  istride c*s, pstride B
 * A folded activation (d->act, batchnorm_relu: ReLU, ReLU6 / Hardtanh(0,
 * max), LeakyReLU): the forwards' map applies it; the backward's passes
 * take dy through its gradient at the forward's v = scale*x + shift
 * (bn_affine's floats, the same expression) - one pass over x, dy and dx
 * fewer than a separate activation's forward and backward (which kept its
 * own input or output for the mask). */
#define PS_BN_LANES 16

/* The activation folded into a batch norm (ps_chan_desc.act, ps_bn_act:
 * ReLU, its cap hi for ReLU6 / Hardtanh(0, max), LeakyReLU's slope below
 * 0) applied to the forward's v = scale*x + shift: above 0 capped at hi,
 * below 0 times slope, NaN kept (as oneDNN's relu and clip). */
PS_INLINE float bn_act_fwd(float v, const ps_bn_act *A) {
    return v > 0.0f ? (v > A->hi ? A->hi : v) : (v < 0.0f ? A->slope * v : v);
}
/* d loss / d v from g = d loss / d activation: PyTorch's rules on the
 * activation's input v - g above 0 (0 at or above a cap: hardtanh's; no
 * cap when hi is INFINITY, so v = +inf keeps g), g * slope at or below 0
 * (leaky_relu's; ReLU's slope 0: threshold's). */
PS_INLINE float bn_act_bwd(float g, float v, const ps_bn_act *A) {
    return v > 0.0f ? (A->hi < INFINITY && !(v < A->hi) ? 0.0f : g) : A->slope * g;
}

typedef struct bn_group {
    int64_t base, istride, pstride;
    int j0, lanes;
} bn_group;

static int bn_ngroups(const ps_chan_desc *d, int block) {
    if (d->layout == PS_LAYOUT_BLOCKED) return d->c / block;
    if (d->s == 1) return (d->c + PS_BN_LANES - 1) / PS_BN_LANES;
    return d->c;
}

static bn_group bn_group_at(const ps_chan_desc *d, int block, int g) {
    bn_group r;
    if (d->layout == PS_LAYOUT_BLOCKED) {
        r = (bn_group){ (int64_t)g * d->s * block, (int64_t)d->c * d->s, block, g * block, block };
    } else if (d->s == 1) {
        const int j0 = g * PS_BN_LANES;
        r = (bn_group){ j0, d->c, 0, j0, d->c - j0 < PS_BN_LANES ? d->c - j0 : PS_BN_LANES };
    } else {
        r = (bn_group){ (int64_t)g * d->s, (int64_t)d->c * d->s, 1, g, 1 };
    }
    return r;
}

/* The per-lane sums of a group, for L lanes (a constant after inlining):
 *   mode 0: s1 = sum(x)
 *   mode 1: s1 = sum((x - mu)^2)
 *   mode 2: s1 = sum(dy), s2 = sum(dy * (x - mu)) */
PS_INLINE void bn_sums_l(const bn_group *g, int n, int64_t s, const float *x, const float *dy, const float *mu,
                         const float *sc, const float *sh, const ps_bn_act *A, int mode, int L, double *s1,
                         double *s2) {
    for (int l = 0; l < L; l++) s1[l] = s2[l] = 0.0;
    for (int i = 0; i < n; i++) {
        const int64_t o = g->base + i * g->istride;
        for (int64_t p0 = 0; p0 < s; p0 += PS_SUM_CHUNK) {
            const int64_t pe = p0 + PS_SUM_CHUNK < s ? p0 + PS_SUM_CHUNK : s;
            if (L == 1) {   /* plain: contiguous positions */
                const float *xi = x + o, *gi = dy ? dy + o : NULL, m = mu ? mu[0] : 0.0f;
                float a = 0.0f, b = 0.0f;
                if (mode == 0) {
#pragma omp simd reduction(+:a)
                    for (int64_t p = p0; p < pe; p++) a += xi[p];
                } else if (mode == 1) {
#pragma omp simd reduction(+:a)
                    for (int64_t p = p0; p < pe; p++) a += (xi[p] - m) * (xi[p] - m);
                } else if (!sc) {
#pragma omp simd reduction(+:a, b)
                    for (int64_t p = p0; p < pe; p++) {
                        a += gi[p];
                        b += gi[p] * (xi[p] - m);
                    }
                } else {
                    const float ka = sc[0], kb = sh[0];
#pragma omp simd reduction(+:a, b)
                    for (int64_t p = p0; p < pe; p++) {
                        const float gp = bn_act_bwd(gi[p], ka * xi[p] + kb, A);
                        a += gp;
                        b += gp * (xi[p] - m);
                    }
                }
                s1[0] += a;
                s2[0] += b;
                continue;
            }
            float a[PS_BN_LANES] = { 0 }, b[PS_BN_LANES] = { 0 };
            for (int64_t p = p0; p < pe; p++) {
                const float *xp = x + o + p * g->pstride, *gp = dy ? dy + o + p * g->pstride : NULL;
                if (mode == 0) {
#pragma omp simd
                    for (int l = 0; l < L; l++) a[l] += xp[l];
                } else if (mode == 1) {
#pragma omp simd
                    for (int l = 0; l < L; l++) a[l] += (xp[l] - mu[l]) * (xp[l] - mu[l]);
                } else if (!sc) {
#pragma omp simd
                    for (int l = 0; l < L; l++) {
                        a[l] += gp[l];
                        b[l] += gp[l] * (xp[l] - mu[l]);
                    }
                } else {
#pragma omp simd
                    for (int l = 0; l < L; l++) {
                        const float gl = bn_act_bwd(gp[l], sc[l] * xp[l] + sh[l], A);
                        a[l] += gl;
                        b[l] += gl * (xp[l] - mu[l]);
                    }
                }
            }
            for (int l = 0; l < L; l++) {
                s1[l] += a[l];
                s2[l] += b[l];
            }
        }
    }
}

/* out = ca*in + cb*(x - mu) + cc per lane (cb, x, mu unused when x is
 * NULL: then out = ca*in + cc, the forward's affine map, through the
 * folded activation A when there is one). With x and sc, sh (a folded
 * activation's backward): in taken through bn_act_bwd at sc*x + sh first. */
PS_INLINE void bn_map_l(const bn_group *g, int n, int64_t s, const float *in, const float *x, const float *mu,
                        const float *ca, const float *cb, const float *cc, const float *sc, const float *sh,
                        const ps_bn_act *A, int L, float *out) {
    for (int i = 0; i < n; i++) {
        const int64_t o = g->base + i * g->istride;
        if (L == 1) {
            const float a = ca[0], c = cc[0], b = x ? cb[0] : 0.0f, m = x ? mu[0] : 0.0f;
            if (x && sc) {
                const float ka = sc[0], kb = sh[0];
#pragma omp simd
                for (int64_t p = 0; p < s; p++)
                    out[o + p] = a * bn_act_bwd(in[o + p], ka * x[o + p] + kb, A) + b * (x[o + p] - m) + c;
            } else if (x) {
#pragma omp simd
                for (int64_t p = 0; p < s; p++) out[o + p] = a * in[o + p] + b * (x[o + p] - m) + c;
            } else if (A) {
#pragma omp simd
                for (int64_t p = 0; p < s; p++) out[o + p] = bn_act_fwd(a * in[o + p] + c, A);
            } else {
#pragma omp simd
                for (int64_t p = 0; p < s; p++) out[o + p] = a * in[o + p] + c;
            }
            continue;
        }
        for (int64_t p = 0; p < s; p++) {
            const int64_t q = o + p * g->pstride;
            if (x && sc) {
#pragma omp simd
                for (int l = 0; l < L; l++)
                    out[q + l] = ca[l] * bn_act_bwd(in[q + l], sc[l] * x[q + l] + sh[l], A) +
                                 cb[l] * (x[q + l] - mu[l]) + cc[l];
            } else if (x) {
#pragma omp simd
                for (int l = 0; l < L; l++) out[q + l] = ca[l] * in[q + l] + cb[l] * (x[q + l] - mu[l]) + cc[l];
            } else if (A) {
#pragma omp simd
                for (int l = 0; l < L; l++) out[q + l] = bn_act_fwd(ca[l] * in[q + l] + cc[l], A);
            } else {
#pragma omp simd
                for (int l = 0; l < L; l++) out[q + l] = ca[l] * in[q + l] + cc[l];
            }
        }
    }
}

/* The group's lane count as a constant for the inlined bodies. */
#define BN_BY_LANES(L, call) \
    switch (L) { \
    case 1: { const int L_ = 1; call; break; } \
    case 8: { const int L_ = 8; call; break; } \
    case 16: { const int L_ = 16; call; break; } \
    default: { const int L_ = (L); call; break; } \
    }

/* mode 2 with sc, sh and A: dy through a folded activation (bn_sums_l). */
PS_CLONES static void bn_sums(const bn_group *g, int n, int64_t s, const float *x, const float *dy, const float *mu,
                              const float *sc, const float *sh, const ps_bn_act *A, int mode, double *s1, double *s2) {
    if (mode == 0) { BN_BY_LANES(g->lanes, bn_sums_l(g, n, s, x, NULL, NULL, NULL, NULL, NULL, 0, L_, s1, s2)) }
    else if (mode == 1) { BN_BY_LANES(g->lanes, bn_sums_l(g, n, s, x, NULL, mu, NULL, NULL, NULL, 1, L_, s1, s2)) }
    else if (!sc) { BN_BY_LANES(g->lanes, bn_sums_l(g, n, s, x, dy, mu, NULL, NULL, NULL, 2, L_, s1, s2)) }
    else { BN_BY_LANES(g->lanes, bn_sums_l(g, n, s, x, dy, mu, sc, sh, A, 2, L_, s1, s2)) }
}

/* The forward's map (x NULL; A: a folded activation) or the backward's (x;
 * sc, sh and A: dy through a folded activation), bn_map_l. */
PS_CLONES static void bn_map(const bn_group *g, int n, int64_t s, const float *in, const float *x, const float *mu,
                             const float *ca, const float *cb, const float *cc, const float *sc, const float *sh,
                             const ps_bn_act *A, float *out) {
    if (x && sc) { BN_BY_LANES(g->lanes, bn_map_l(g, n, s, in, x, mu, ca, cb, cc, sc, sh, A, L_, out)) }
    else if (x) { BN_BY_LANES(g->lanes, bn_map_l(g, n, s, in, x, mu, ca, cb, cc, NULL, NULL, NULL, L_, out)) }
    else if (A) { BN_BY_LANES(g->lanes, bn_map_l(g, n, s, in, NULL, NULL, ca, NULL, cc, NULL, NULL, A, L_, out)) }
    else { BN_BY_LANES(g->lanes, bn_map_l(g, n, s, in, NULL, NULL, ca, NULL, cc, NULL, NULL, NULL, L_, out)) }
}

/* The activation d folds in, NULL when none. */
static const ps_bn_act *bn_act_of(const ps_chan_desc *d) { return d->act.on ? &d->act : NULL; }

/* The training forward's y = scale*x + shift for channel j from the
 * statistics it keeps (mean, invstd as stored): the backward of a folded
 * activation recomputes y from the same floats. */
static void bn_affine(float mu, float invstd, const float *gamma, const float *beta, int j, float *scale,
                      float *shift) {
    const double gm = gamma ? gamma[j] : 1.0, bt = beta ? beta[j] : 0.0, is = invstd;
    *scale = (float)(is * gm);
    *shift = (float)(bt - (double)mu * is * gm);
}

/* (The OpenMP if-clauses are spelled out: compilers that ignore the
 * pragmas would otherwise warn about unused helpers.) */
static ps_status dn_bn_forward_training(void *impl, const ps_chan_desc *d, const float *x, const float *gamma,
                                        const float *beta, float *y, float *mean, float *invstd,
                                        float *var_unbiased, ps_err *err) {
    dn_impl *im = impl;
    (void)err;
    set_threads(im);
    const ps_bn_act *A = bn_act_of(d);
    const int ng = bn_ngroups(d, block_of(im->block, d->c));
    const double m = (double)d->n * d->s;
#pragma omp parallel for if ((int64_t)d->n * d->c * d->s >= PS_OMP_MIN) schedule(static)
    for (int gi = 0; gi < ng; gi++) {
        const bn_group g = bn_group_at(d, block_of(im->block, d->c), gi);
        double s1[PS_BN_LANES], s2[PS_BN_LANES];
        float mu[PS_BN_LANES], scale[PS_BN_LANES], shift[PS_BN_LANES];
        bn_sums(&g, d->n, d->s, x, NULL, NULL, NULL, NULL, NULL, 0, s1, s2);
        for (int l = 0; l < g.lanes; l++) mu[l] = (float)(s1[l] / m);
        bn_sums(&g, d->n, d->s, x, NULL, mu, NULL, NULL, NULL, 1, s1, s2);   /* squared deviations from mu */
        for (int l = 0; l < g.lanes; l++) {
            const int j = g.j0 + l;
            mean[j] = mu[l];
            invstd[j] = (float)(1.0 / sqrt(s1[l] / m + d->eps));
            bn_affine(mu[l], invstd[j], gamma, beta, j, &scale[l], &shift[l]);
            if (var_unbiased) var_unbiased[j] = (float)(s1[l] / (m - 1.0));
        }
        bn_map(&g, d->n, d->s, x, NULL, NULL, scale, NULL, shift, NULL, NULL, A, y);
    }
    return PS_OK;
}

static ps_status dn_bn_forward_inference(void *impl, const ps_chan_desc *d, const float *x, const float *gamma,
                                         const float *beta, const float *running_mean, const float *running_var,
                                         float *y, float *invstd, ps_err *err) {
    dn_impl *im = impl;
    (void)err;
    set_threads(im);
    const ps_bn_act *A = bn_act_of(d);
    const int ng = bn_ngroups(d, block_of(im->block, d->c));
#pragma omp parallel for if ((int64_t)d->n * d->c * d->s >= PS_OMP_MIN) schedule(static)
    for (int gi = 0; gi < ng; gi++) {
        const bn_group g = bn_group_at(d, block_of(im->block, d->c), gi);
        float scale[PS_BN_LANES], shift[PS_BN_LANES];
        for (int l = 0; l < g.lanes; l++) {
            const int j = g.j0 + l;
            const float is = (float)(1.0 / sqrt((double)running_var[j] + d->eps));
            bn_affine(running_mean[j], is, gamma, beta, j, &scale[l], &shift[l]);
            if (invstd) invstd[j] = is;
        }
        bn_map(&g, d->n, d->s, x, NULL, NULL, scale, NULL, shift, NULL, NULL, A, y);
    }
    return PS_OK;
}

static ps_status dn_bn_backward(void *impl, const ps_chan_desc *d, int batch_stats, const float *x,
                                const float *dy, const float *gamma, const float *beta, const float *mean,
                                const float *invstd, float *dx, float *dgamma, float *dbeta, ps_err *err) {
    dn_impl *im = impl;
    (void)err;
    set_threads(im);
    const ps_bn_act *A = bn_act_of(d);
    const int ng = bn_ngroups(d, block_of(im->block, d->c));
    const double m = (double)d->n * d->s;
#pragma omp parallel for if ((int64_t)d->n * d->c * d->s >= PS_OMP_MIN) schedule(static)
    for (int gi = 0; gi < ng; gi++) {
        const bn_group g = bn_group_at(d, block_of(im->block, d->c), gi);
        double sdy[PS_BN_LANES], sdyx[PS_BN_LANES];
        float mu[PS_BN_LANES], ca[PS_BN_LANES], cb[PS_BN_LANES], cc[PS_BN_LANES];
        float sc[PS_BN_LANES], sh[PS_BN_LANES];   /* a folded activation's: the forward's y = sc*x + sh */
        for (int l = 0; l < g.lanes; l++) {
            mu[l] = mean[g.j0 + l];
            if (A) bn_affine(mu[l], invstd[g.j0 + l], gamma, beta, g.j0 + l, &sc[l], &sh[l]);
        }
        bn_sums(&g, d->n, d->s, x, dy, mu, A ? sc : NULL, A ? sh : NULL, A, 2, sdy, sdyx);
        /* dx = ca * dy + cb * (x - mean) + cc per lane */
        for (int l = 0; l < g.lanes; l++) {
            const int j = g.j0 + l;
            const double gm = gamma ? gamma[j] : 1.0, s = invstd[j], dg = sdyx[l] * s;
            if (dbeta) dbeta[j] = (float)sdy[l];
            if (dgamma) dgamma[j] = (float)dg;
            ca[l] = (float)(gm * s);
            cb[l] = batch_stats ? (float)(-gm * s * s * dg / m) : 0.0f;
            cc[l] = batch_stats ? (float)(-gm * s * sdy[l] / m) : 0.0f;
        }
        if (dx) bn_map(&g, d->n, d->s, dy, x, mu, ca, cb, cc, A ? sc : NULL, A ? sh : NULL, A, dx);
    }
    return PS_OK;
}

/* ---- layer normalisation: C kernels ----
 * oneDNN 2.6's layer normalisation is simple_layer_normalization (plain C,
 * not JIT) on every ISA. Rows in parallel, two passes per row (mean, then
 * squared deviations), float sums over chunks added up in double as for
 * batch norm; the parameter gradients in blocks of columns (each thread
 * owns its columns: deterministic, no atomics). */
#define PS_LN_COLS 64

/* sum(a) (b NULL, mu unused), sum((a - mu)^2) (b == a) or sum(a * (b - mu) * rs)
 * over n floats, in float chunks added up in double. */
PS_INLINE double ln_sum(const float *a, const float *b, float mu, float rs, const float *gamma, int mode, int64_t n) {
    double total = 0.0;
    for (int64_t j0 = 0; j0 < n; j0 += PS_SUM_CHUNK) {
        const int64_t je = j0 + PS_SUM_CHUNK < n ? j0 + PS_SUM_CHUNK : n;
        float t = 0.0f;
        if (mode == 0) {
#pragma omp simd reduction(+:t)
            for (int64_t j = j0; j < je; j++) t += a[j];
        } else if (mode == 1) {
#pragma omp simd reduction(+:t)
            for (int64_t j = j0; j < je; j++) t += (a[j] - mu) * (a[j] - mu);
        } else if (mode == 2) {   /* sum(dy * gamma) */
#pragma omp simd reduction(+:t)
            for (int64_t j = j0; j < je; j++) t += gamma ? a[j] * gamma[j] : a[j];
        } else {                  /* sum(dy * gamma * xhat) */
#pragma omp simd reduction(+:t)
            for (int64_t j = j0; j < je; j++) t += (gamma ? a[j] * gamma[j] : a[j]) * ((b[j] - mu) * rs);
        }
        total += t;
    }
    return total;
}

PS_CLONES static void ln_row_forward(const float *xr, int64_t n, float eps, const float *gamma, const float *beta,
                                     float *yr, float *mean, float *rstd) {
    const float mu = (float)(ln_sum(xr, NULL, 0.0f, 0.0f, NULL, 0, n) / (double)n);
    const float rs = (float)(1.0 / sqrt(ln_sum(xr, NULL, mu, 0.0f, NULL, 1, n) / (double)n + eps));
    if (gamma) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mu) * rs * gamma[j] + beta[j];
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) yr[j] = (xr[j] - mu) * rs;
    }
    *mean = mu;
    *rstd = rs;
}

PS_CLONES static void ln_row_dx(const float *xr, const float *dyr, int64_t n, const float *gamma, float mu, float rs,
                                float *dxr) {
    const float a = (float)(ln_sum(dyr, NULL, 0.0f, 0.0f, gamma, 2, n) / (double)n);
    const float b = (float)(ln_sum(dyr, xr, mu, rs, gamma, 3, n) / (double)n);
    if (gamma) {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dxr[j] = rs * (dyr[j] * gamma[j] - a - (xr[j] - mu) * rs * b);
    } else {
#pragma omp simd
        for (int64_t j = 0; j < n; j++) dxr[j] = rs * (dyr[j] - a - (xr[j] - mu) * rs * b);
    }
}

/* dgamma, dbeta of columns j0..j0+len-1 (len <= PS_LN_COLS) over all rows. */
PS_CLONES static void ln_cols_grad(const float *x, const float *dy, int64_t rows, int64_t cols, int64_t j0,
                                   int64_t len, const float *mean, const float *rstd, float *dgamma, float *dbeta) {
    double dg[PS_LN_COLS] = { 0 }, db[PS_LN_COLS] = { 0 };
    for (int64_t r0 = 0; r0 < rows; r0 += PS_SUM_CHUNK) {
        const int64_t re = r0 + PS_SUM_CHUNK < rows ? r0 + PS_SUM_CHUNK : rows;
        float fg[PS_LN_COLS] = { 0 }, fb[PS_LN_COLS] = { 0 };
        for (int64_t r = r0; r < re; r++) {
            const float *xr = x + r * cols + j0, *dyr = dy + r * cols + j0;
            const float mu = mean[r], rs = rstd[r];
#pragma omp simd
            for (int64_t j = 0; j < len; j++) {
                fg[j] += dyr[j] * ((xr[j] - mu) * rs);
                fb[j] += dyr[j];
            }
        }
        for (int64_t j = 0; j < len; j++) {
            dg[j] += fg[j];
            db[j] += fb[j];
        }
    }
    for (int64_t j = 0; j < len; j++) {
        if (dgamma) dgamma[j0 + j] = (float)dg[j];
        if (dbeta) dbeta[j0 + j] = (float)db[j];
    }
}

/* ---- group normalisation: C kernels (oneDNN 2.6 has none); memory bound:
 * the forward reads a row twice (mean, squared deviations) and writes it
 * once, the backward reads it twice for dx and once more per channel for
 * dgamma / dbeta; sums in double. OpenMP over the rows, then the channels. */

static ps_status dn_gn_forward(void *impl, const ps_gn_desc *d, const float *x, const float *gamma,
                               const float *beta, float *y, float *mean, float *rstd, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t cg = d->c / d->groups, m = cg * d->s, rows = d->n * d->groups;
#pragma omp parallel for if (rows * m >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * m;
        float *yr = y + r * m;
        double sum = 0.0, sq = 0.0;
        for (int64_t j = 0; j < m; j++) sum += xr[j];
        const float mu = (float)(sum / (double)m);
        for (int64_t j = 0; j < m; j++) sq += (double)(xr[j] - mu) * (xr[j] - mu);
        const float rs = (float)(1.0 / sqrt(sq / (double)m + d->eps));
        for (int64_t k = 0; k < cg; k++) {
            const int64_t ch = (r % d->groups) * cg + k;
            const float a = gamma ? gamma[ch] * rs : rs, b = (beta ? beta[ch] : 0.0f) - mu * a;
            const float *xs = xr + k * d->s;
            float *ys = yr + k * d->s;
#pragma omp simd
            for (int64_t p = 0; p < d->s; p++) ys[p] = xs[p] * a + b;
        }
        if (mean) mean[r] = mu;
        if (rstd) rstd[r] = rs;
    }
    return PS_OK;
}

static ps_status dn_gn_backward(void *impl, const ps_gn_desc *d, const float *x, const float *dy,
                                const float *gamma, const float *mean, const float *rstd, float *dx,
                                float *dgamma, float *dbeta, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t cg = d->c / d->groups, m = cg * d->s, rows = d->n * d->groups;
    if (dx) {
#pragma omp parallel for if (rows * m >= PS_OMP_MIN) schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * m, *dyr = dy + r * m;
            const float mu = mean[r], rs = rstd[r];
            double sg = 0.0, sgx = 0.0;
            for (int64_t k = 0; k < cg; k++) {
                const float gm = gamma ? gamma[(r % d->groups) * cg + k] : 1.0f;
                double a = 0.0, b = 0.0;
                for (int64_t p = k * d->s; p < (k + 1) * d->s; p++) {
                    a += dyr[p];
                    b += (double)dyr[p] * (xr[p] - mu);
                }
                sg += gm * a;
                sgx += gm * b * rs;
            }
            const float ma = (float)(sg / (double)m), mb = (float)(sgx / (double)m);
            for (int64_t k = 0; k < cg; k++) {
                const float gm = gamma ? gamma[(r % d->groups) * cg + k] : 1.0f;
                float *dxs = dx + r * m + k * d->s;
                const float *xs = xr + k * d->s, *dys = dyr + k * d->s;
#pragma omp simd
                for (int64_t p = 0; p < d->s; p++) dxs[p] = rs * (dys[p] * gm - ma - (xs[p] - mu) * rs * mb);
            }
        }
    }
    if (dgamma || dbeta) {
#pragma omp parallel for if (rows * m >= PS_OMP_MIN) schedule(static)
        for (int64_t ch = 0; ch < d->c; ch++) {
            double dg = 0.0, db = 0.0;
            for (int64_t i = 0; i < d->n; i++) {
                const int64_t r = i * d->groups + ch / cg, off = (i * d->c + ch) * d->s;
                double a = 0.0, b = 0.0;
                for (int64_t p = 0; p < d->s; p++) {
                    a += dy[off + p];
                    b += (double)dy[off + p] * (x[off + p] - mean[r]);
                }
                db += a;
                dg += b * rstd[r];
            }
            if (dgamma) dgamma[ch] = (float)dg;
            if (dbeta) dbeta[ch] = (float)db;
        }
    }
    return PS_OK;
}

/* ---- L2 normalisation over one dimension: C loops (memory bound), OpenMP
 * over the vectors; the squares summed in double ---- */

static ps_status dn_l2norm_forward(void *impl, const ps_l2norm_desc *d, const float *x, float *y, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t nv = d->outer * d->inner;
#pragma omp parallel for if (nv * d->dim >= PS_OMP_MIN) schedule(static)
    for (int64_t v = 0; v < nv; v++) {
        const int64_t base = (v / d->inner) * d->dim * d->inner + v % d->inner;
        double s = 0.0;
        for (int k = 0; k < d->dim; k++) s += (double)x[base + k * d->inner] * x[base + k * d->inner];
        const float r = 1.0f / fmaxf((float)sqrt(s), d->eps);
        for (int k = 0; k < d->dim; k++) y[base + k * d->inner] = x[base + k * d->inner] * r;
    }
    return PS_OK;
}

static ps_status dn_l2norm_backward(void *impl, const ps_l2norm_desc *d, const float *x, const float *dy, float *dx,
                                    ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t nv = d->outer * d->inner;
#pragma omp parallel for if (nv * d->dim >= PS_OMP_MIN) schedule(static)
    for (int64_t v = 0; v < nv; v++) {
        const int64_t base = (v / d->inner) * d->dim * d->inner + v % d->inner;
        double s = 0.0, dot = 0.0;
        for (int k = 0; k < d->dim; k++) {
            s += (double)x[base + k * d->inner] * x[base + k * d->inner];
            dot += (double)dy[base + k * d->inner] * x[base + k * d->inner];
        }
        const float n = (float)sqrt(s);
        if (n < d->eps) {
            for (int k = 0; k < d->dim; k++) dx[base + k * d->inner] = dy[base + k * d->inner] / d->eps;
            continue;
        }
        const float r = 1.0f / n, c = (float)(dot / s);   /* sum(dy * y) / n = dot / n^2 */
        for (int k = 0; k < d->dim; k++) {
            const int64_t j = base + k * d->inner;
            dx[j] = (dy[j] - x[j] * c) * r;
        }
    }
    return PS_OK;
}

static ps_status dn_ln_forward(void *impl, const ps_ln_desc *d, const float *x, const float *gamma,
                               const float *beta, float *y, float *mean, float *rstd, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for if (d->rows * d->cols >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < d->rows; r++) {
        float mu, rs;
        ln_row_forward(x + r * d->cols, d->cols, d->eps, gamma, beta, y + r * d->cols, &mu, &rs);
        if (mean) mean[r] = mu;
        if (rstd) rstd[r] = rs;
    }
    return PS_OK;
}

static ps_status dn_ln_backward(void *impl, const ps_ln_desc *d, const float *x, const float *dy,
                                const float *gamma, const float *mean, const float *rstd, float *dx,
                                float *dgamma, float *dbeta, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t n = d->cols;
    if (dx) {
#pragma omp parallel for if (d->rows * d->cols >= PS_OMP_MIN) schedule(static)
        for (int64_t r = 0; r < d->rows; r++)
            ln_row_dx(x + r * n, dy + r * n, n, gamma, mean[r], rstd[r], dx + r * n);
    }
    if (dgamma || dbeta) {
        const int64_t nb = (n + PS_LN_COLS - 1) / PS_LN_COLS;
#pragma omp parallel for if (d->rows * d->cols >= PS_OMP_MIN) schedule(static)
        for (int64_t cb = 0; cb < nb; cb++) {
            const int64_t j0 = cb * PS_LN_COLS;
            ln_cols_grad(x, dy, d->rows, n, j0, n - j0 < PS_LN_COLS ? n - j0 : PS_LN_COLS, mean, rstd, dgamma, dbeta);
        }
    }
    return PS_OK;
}

/* ---- softmax over one dimension ----
 * inner == 1 (the last dimension) runs the (log-)softmax forward
 * primitives of softmax_forward / log_softmax_forward and the row-wise
 * backward of softmax_backward (softmax_rows_bwd); otherwise (oneDNN 2.6
 * has only ref:any for a strided axis) a C kernel: for each outer index,
 * a block of inner positions at a time, vectorised along inner. */
#define PS_SM_INNER 64

static void softmax_strided(const ps_softmax_desc *d, const float *x, float *y) {
    const int64_t nb = (d->inner + PS_SM_INNER - 1) / PS_SM_INNER;
#pragma omp parallel for collapse(2) if (d->outer * d->dim * d->inner >= PS_OMP_MIN) schedule(static)
    for (int64_t o = 0; o < d->outer; o++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t i0 = b * PS_SM_INNER, len = d->inner - i0 < PS_SM_INNER ? d->inner - i0 : PS_SM_INNER;
            const float *xo = x + o * d->dim * d->inner + i0;
            float *yo = y + o * d->dim * d->inner + i0;
            float mx[PS_SM_INNER];
            double sum[PS_SM_INNER] = { 0 };
            for (int64_t i = 0; i < len; i++) mx[i] = -INFINITY;
            for (int k = 0; k < d->dim; k++)
#pragma omp simd
                for (int64_t i = 0; i < len; i++) mx[i] = xo[k * d->inner + i] > mx[i] ? xo[k * d->inner + i] : mx[i];
            for (int k = 0; k < d->dim; k++)
                for (int64_t i = 0; i < len; i++) sum[i] += expf(xo[k * d->inner + i] - mx[i]);
            for (int k = 0; k < d->dim; k++)
                for (int64_t i = 0; i < len; i++) {
                    const float t = xo[k * d->inner + i] - mx[i];
                    yo[k * d->inner + i] = d->log ? t - (float)log(sum[i]) : (float)(expf(t) / sum[i]);
                }
        }
}

static void softmax_strided_bwd(const ps_softmax_desc *d, const float *y, const float *dy, float *dx) {
    const int64_t nb = (d->inner + PS_SM_INNER - 1) / PS_SM_INNER;
#pragma omp parallel for collapse(2) if (d->outer * d->dim * d->inner >= PS_OMP_MIN) schedule(static)
    for (int64_t o = 0; o < d->outer; o++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t i0 = b * PS_SM_INNER, len = d->inner - i0 < PS_SM_INNER ? d->inner - i0 : PS_SM_INNER;
            const int64_t base = o * d->dim * d->inner + i0;
            double s[PS_SM_INNER] = { 0 };
            for (int k = 0; k < d->dim; k++) {
                const int64_t e = base + k * d->inner;
#pragma omp simd
                for (int64_t i = 0; i < len; i++) s[i] += d->log ? (double)dy[e + i] : (double)dy[e + i] * y[e + i];
            }
            for (int k = 0; k < d->dim; k++) {
                const int64_t e = base + k * d->inner;
                for (int64_t i = 0; i < len; i++)
                    dx[e + i] = d->log ? dy[e + i] - expf(y[e + i]) * (float)s[i] : y[e + i] * (dy[e + i] - (float)s[i]);
            }
        }
}

static ps_status dn_softmax_dim_forward(void *impl, const ps_softmax_desc *d, const float *x, float *y,
                                        ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    if (d->inner == 1) {
        const int64_t dims[2] = { d->outer, d->dim };
        prim_key k = key_make(d->log ? PK_LOGSOFTMAX_FWD : PK_SOFTMAX_FWD, 0, 2, dims);
        exec_arg a[] = { { DNNL_ARG_SRC, x }, { DNNL_ARG_DST, y } };
        return run(im, &k, a, 2, err);
    }
    softmax_strided(d, x, y);
    return PS_OK;
}

static ps_status dn_softmax_dim_backward(void *impl, const ps_softmax_desc *d, const float *y, const float *dy,
                                         float *dx, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    (void)err;
    if (d->inner == 1) softmax_rows_bwd(d->outer, d->dim, d->log, y, dy, dx);
    else softmax_strided_bwd(d, y, dy, dx);
    return PS_OK;
}

/* ---- channel masks, copies, sums, fill: OpenMP loops ---- */

static ps_status dn_mul_channels(void *impl, const ps_chan_desc *d, const float *x, const float *mask, float *y,
                                 ps_err *err) {
    dn_impl *im = impl;
    (void)err;
    set_threads(im);
    if (d->layout == PS_LAYOUT_BLOCKED) {
        const int B = block_of(im->block, d->c), nb = d->c / B;
#pragma omp parallel for if ((int64_t)d->n * d->c * d->s >= PS_OMP_MIN) schedule(static)
        for (int64_t q = 0; q < (int64_t)d->n * nb; q++) {
            const float *mq = mask + (q / nb) * d->c + (q % nb) * B;   /* sample q/nb, block q%nb */
            for (int64_t p = 0; p < d->s; p++) {
                const int64_t o = (q * d->s + p) * B;
#pragma omp simd
                for (int l = 0; l < B; l++) y[o + l] = x[o + l] * mq[l];
            }
        }
        return PS_OK;
    }
#pragma omp parallel for if ((int64_t)d->n * d->c * d->s >= PS_OMP_MIN) schedule(static)
    for (int64_t q = 0; q < (int64_t)d->n * d->c; q++) {
        const float m = mask[q];
#pragma omp simd
        for (int64_t p = 0; p < d->s; p++) y[q * d->s + p] = x[q * d->s + p] * m;
    }
    return PS_OK;
}

static ps_status dn_copy2d(void *impl, int64_t rows, int64_t cols, const float *src, int64_t src_ld, float *dst,
                           int64_t dst_ld, int accumulate, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for if (rows * cols >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * src_ld;
        float *t = dst + r * dst_ld;
        if (accumulate) {
#pragma omp simd
            for (int64_t j = 0; j < cols; j++) t[j] += s[j];
        } else if (cols) {
            memcpy(t, s, (size_t)cols * sizeof *t);
        }
    }
    return PS_OK;
}

static ps_status dn_add_out(void *impl, int64_t count, const float *a, const float *b, float *y, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) y[i] = a[i] + b[i];
    return PS_OK;
}

static ps_status dn_fill(void *impl, int64_t count, float *x, float value, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for simd if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) x[i] = value;
    return PS_OK;
}

static int dn_blocked_layout(void *impl, int c) {
    const dn_impl *im = impl;
    return block_of(im->block, c);
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

/* Permute: oneDNN's reorder between a strided view and the dense output (create_permute). */
/* 1 when permutation d moves no element: the dims longer than 1 keep
 * their order (a Permute of one dim per sample, heads' permute at one
 * head). */
static int permute_is_copy(const ps_permute_desc *d) {
    int last = -1;
    for (int j = 0; j < d->ndim; j++) {
        if (d->dims[d->perm[j]] == 1) continue;
        if (d->perm[j] < last) return 0;
        last = d->perm[j];
    }
    return 1;
}

/* A strided reorder (create_permute); a permutation that moves nothing is
 * a copy (oneDNN's reorder for it is simple:any, its plain C loop). */
static ps_status dn_permute(void *impl, const ps_permute_desc *d, const float *x, float *y, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    if (permute_is_copy(d)) {
        int64_t count = d->n;
        for (int j = 0; j < d->ndim; j++) count *= d->dims[j];
        if (x != y) memcpy(y, x, (size_t)count * sizeof(float));
        return PS_OK;
    }
    int64_t dims[2 + 2 * PS_PERMUTE_MAX_DIMS] = { d->n, d->ndim };
    for (int j = 0; j < d->ndim; j++) {
        dims[2 + j] = d->dims[j];
        dims[2 + PS_PERMUTE_MAX_DIMS + j] = d->perm[j];
    }
    prim_key k = key_make(PK_PERMUTE, 0, 2 + 2 * PS_PERMUTE_MAX_DIMS, dims);
    exec_arg a[] = { { DNNL_ARG_FROM, x }, { DNNL_ARG_TO, y } };
    return run(im, &k, a, 2, err);
}

/* Matmul: oneDNN's matmul primitive over the whole batch (create_matmul). */
static ps_status dn_matmul(void *impl, const ps_matmul_desc *d, const float *a, const float *b, float *c,
                           ps_err *err) {
    dn_impl *im = impl;
    if (d->batch <= 0 || d->m <= 0 || d->n <= 0) return PS_OK;
    set_threads(im);
    const int64_t dims[9] = { d->batch, d->m, d->n, d->k, d->trans_a, d->trans_b, !!d->bcast_a, !!d->bcast_b,
                              !!d->accumulate };
    prim_key k = key_make(PK_MATMUL, 0, 9, dims);
    exec_arg x[] = { { DNNL_ARG_SRC, a }, { DNNL_ARG_WEIGHTS, b }, { DNNL_ARG_DST, c } };
    return run(im, &k, x, 3, err);
}

/* Triangle fill (attention masks): oneDNN has no primitive for it; a
 * threaded loop over the matrices' rows, each row the run of its columns
 * before the triangle's edge and the run after it. */
static ps_status dn_tri_fill(void *impl, const ps_tri_desc *d, const float *x, float *y, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t nrows = d->batch * d->rows, cols = d->cols;
#pragma omp parallel for if (nrows * cols >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < nrows; r++) {
        const int64_t i = r % d->rows;
        /* the triangle's columns of row i: [lo, hi) */
        int64_t lo = d->upper ? i + d->diagonal : 0, hi = d->upper ? cols : i + d->diagonal + 1;
        lo = lo < 0 ? 0 : lo > cols ? cols : lo;
        hi = hi < lo ? lo : hi > cols ? cols : hi;
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        if (yr != xr) {
            for (int64_t j = 0; j < lo; j++) yr[j] = xr[j];
            for (int64_t j = hi; j < cols; j++) yr[j] = xr[j];
        }
        for (int64_t j = lo; j < hi; j++) yr[j] = d->value;
    }
    return PS_OK;
}

/* Key padding masks (Eq, MultiheadAttention's key_padding_mask): oneDNN
 * has no primitive for either; threaded loops, key_pad's over the rows of
 * every sample's heads, each row reading its sample's mask. */
static ps_status dn_eq_const(void *impl, int64_t count, const int64_t *x, int64_t value, float *y, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) y[i] = x[i] == value ? 1.0f : 0.0f;
    return PS_OK;
}

static ps_status dn_key_pad(void *impl, const ps_keypad_desc *d, const float *mask, float *s, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t per = d->heads * d->rows, nrows = d->batch * per, cols = d->cols;
#pragma omp parallel for if (nrows * cols >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < nrows; r++) {
        const float *m = mask + (r / per) * cols;
        float *sr = s + r * cols;
        if (d->additive)
            for (int64_t j = 0; j < cols; j++) sr[j] += m[j];
        else
            for (int64_t j = 0; j < cols; j++)
                if (m[j] != 0.0f) sr[j] = -INFINITY;
    }
    return PS_OK;
}

/* Recurrent layers (LSTM, GRU) run by psd: the GEMMs are linear_forward /
 * linear_backward's inner products; a time step's gate arithmetic is
 * threaded loops over the rows, as trainer/lstm.c's. oneDNN 2.6's own
 * lstm_forward and lbr_gru_forward primitives are not used: at f32 on x86
 * without AVX-512 they are its "ref" implementation (their impl string at
 * the host's AVX2 and under ONEDNN_MAX_CPU_ISA=AVX2 and SSE41), which the
 * kernel check refuses. */

static float dn_rnn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

static ps_status dn_rnn_cell_forward(void *impl, const ps_rnn_cell_desc *d, const float *gx, const float *gh,
                                      const float *h_prev, const float *c_prev, float *h, float *c, float *act,
                                      ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t H = d->H, G = d->gru ? 3 : 4;
#pragma omp parallel for if (d->n * H >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < d->n; r++) {
        const float *x = gx + r * G * H, *y = gh + r * G * H;
        float *a = act + r * 4 * H;
        for (int64_t j = 0; j < H; j++) {
            const int64_t o = r * H + j;
            if (d->gru) {
                const float rg = dn_rnn_sigmoid(x[j] + y[j]), z = dn_rnn_sigmoid(x[H + j] + y[H + j]);
                const float nn = tanhf(x[2 * H + j] + rg * y[2 * H + j]);
                h[o] = (1.0f - z) * nn + z * h_prev[o];
                a[j] = rg, a[H + j] = z, a[2 * H + j] = nn, a[3 * H + j] = y[2 * H + j];
            } else {
                const float i = dn_rnn_sigmoid(x[j] + y[j]), f = dn_rnn_sigmoid(x[H + j] + y[H + j]);
                const float g = tanhf(x[2 * H + j] + y[2 * H + j]), og = dn_rnn_sigmoid(x[3 * H + j] + y[3 * H + j]);
                c[o] = f * c_prev[o] + i * g;
                h[o] = og * tanhf(c[o]);
                a[j] = i, a[H + j] = f, a[2 * H + j] = g, a[3 * H + j] = og;
            }
        }
    }
    return PS_OK;
}

/* PReLU: C loops (oneDNN 2.6's prelu primitive broadcasts its weights by
 * memory descriptor; psd's one slope or per-channel slopes over a plain
 * (n, c, s) activation are two loops). The slopes' gradient: each channel's
 * sum in one thread, in double. */
static ps_status dn_prelu_forward(void *impl, const ps_chan_desc *d, const float *x, const float *w, float *y,
                                  ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    if (d->c > 1 && d->layout != PS_LAYOUT_PLAIN)
        return ps_err_set(err, PS_ERR_INTERNAL, "dnnl: prelu of %d slopes in layout %d", d->c, d->layout);
    const int64_t count = (int64_t)d->n * d->c * d->s, s = d->s;
    const int c = d->c;
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) y[i] = x[i] > 0.0f ? x[i] : w[(i / s) % c] * x[i];
    return PS_OK;
}

static ps_status dn_prelu_backward(void *impl, const ps_chan_desc *d, const float *x, const float *w, const float *dy,
                                   float *dx, float *dw, ps_err *err) {
    dn_impl *im = impl;
    set_threads(im);
    if (d->c > 1 && d->layout != PS_LAYOUT_PLAIN)
        return ps_err_set(err, PS_ERR_INTERNAL, "dnnl: prelu of %d slopes in layout %d", d->c, d->layout);
    const int64_t count = (int64_t)d->n * d->c * d->s, s = d->s;
    const int c = d->c, n = d->n;
    if (dx) {
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int64_t i = 0; i < count; i++) dx[i] = x[i] > 0.0f ? dy[i] : w[(i / s) % c] * dy[i];
    }
    if (dw) {
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
        for (int k = 0; k < c; k++) {
            double g = 0.0;
            for (int b = 0; b < n; b++) {
                const float *xr = x + ((int64_t)b * c + k) * s, *dr = dy + ((int64_t)b * c + k) * s;
                for (int64_t j = 0; j < s; j++)
                    if (xr[j] <= 0.0f) g += (double)xr[j] * dr[j];
            }
            dw[k] = (float)g;
        }
    }
    return PS_OK;
}

static ps_status dn_rnn_cell_backward(void *impl, const ps_rnn_cell_desc *d, const float *act, const float *h_prev,
                                       const float *c_prev, const float *c, const float *dh, float *dc, float *dgx,
                                       float *dgh, float *dh_prev, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t H = d->H, G = d->gru ? 3 : 4;
#pragma omp parallel for if (d->n * H >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < d->n; r++) {
        const float *a = act + r * 4 * H;
        float *gx = dgx + r * G * H, *gh = dgh + r * G * H;
        for (int64_t j = 0; j < H; j++) {
            const int64_t o = r * H + j;
            if (d->gru) {
                const float rg = a[j], z = a[H + j], nn = a[2 * H + j], ghn = a[3 * H + j];
                const float dn = dh[o] * (1.0f - z) * (1.0f - nn * nn);
                const float dz = dh[o] * (h_prev[o] - nn) * z * (1.0f - z);
                const float dr = dn * ghn * rg * (1.0f - rg);
                gx[j] = gh[j] = dr;
                gx[H + j] = gh[H + j] = dz;
                gx[2 * H + j] = dn;
                gh[2 * H + j] = dn * rg;
                dh_prev[o] = dh[o] * z;
            } else {
                const float i = a[j], f = a[H + j], g = a[2 * H + j], og = a[3 * H + j], tc = tanhf(c[o]);
                const float dcc = dc[o] + dh[o] * og * (1.0f - tc * tc);
                const float v[4] = {dcc * g * i * (1.0f - i), dcc * c_prev[o] * f * (1.0f - f),
                                    dcc * i * (1.0f - g * g), dh[o] * tc * og * (1.0f - og)};
                for (int k = 0; k < 4; k++) gx[k * H + j] = gh[k * H + j] = v[k];
                dc[o] = dcc * f;
                dh_prev[o] = 0.0f;
            }
        }
    }
    return PS_OK;
}

/* ---- numpy broadcasting (ps_bcast_desc): OpenMP loops over the output's
 * rows (ps_bcast_geometry's last merged dim contiguous in y, stride 0 or 1
 * in each operand); a gradient element per iteration, summed in double
 * over the positions that read it (the full-size operand's in one row
 * loop) ---- */

static ps_status dn_binary_bcast(void *impl, const ps_bcast_desc *d, const float *a, const float *b, float *y,
                                 ps_err *err) {
    (void)err;
    set_threads(impl);
    const ps_bcast_geom g = ps_bcast_geometry(d);
    const int64_t inner = g.nd ? g.dims[g.nd - 1] : 1, rows = g.count / inner;
    const int64_t ia = g.nd ? g.sa[g.nd - 1] : 0, ib = g.nd ? g.sb[g.nd - 1] : 0;
    const int op = d->op;
#pragma omp parallel for if (g.count >= PS_OMP_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t rest = r, oa = 0, ob = 0;
        for (int k = g.nd - 2; k >= 0; k--) {
            const int64_t i = rest % g.dims[k];
            rest /= g.dims[k];
            oa += i * g.sa[k];
            ob += i * g.sb[k];
        }
        const float *pa = a + oa, *pb = b + ob;
        float *py = y + r * inner;
        if (op == PS_BINARY_ADD) {
#pragma omp simd
            for (int64_t p = 0; p < inner; p++) py[p] = pa[p * ia] + pb[p * ib];
        } else if (op == PS_BINARY_SUB) {
#pragma omp simd
            for (int64_t p = 0; p < inner; p++) py[p] = pa[p * ia] - pb[p * ib];
        } else if (op == PS_BINARY_MUL) {
#pragma omp simd
            for (int64_t p = 0; p < inner; p++) py[p] = pa[p * ia] * pb[p * ib];
        } else if (op == PS_BINARY_MAX || op == PS_BINARY_MIN) {
            for (int64_t p = 0; p < inner; p++) py[p] = ps_binary_apply(op, pa[p * ia], pb[p * ib]);
        } else {
#pragma omp simd
            for (int64_t p = 0; p < inner; p++) py[p] = pa[p * ia] / pb[p * ib];
        }
    }
    return PS_OK;
}

static ps_status dn_binary_bcast_backward(void *impl, const ps_bcast_desc *d, int which, const float *a,
                                          const float *b, const float *dy, float *dx, ps_err *err) {
    (void)err;
    set_threads(impl);
    const ps_bcast_geom g = ps_bcast_geometry(d);
    const int64_t *sx = which ? g.sb : g.sa;
    const int reads = ps_binary_reads(d->op), op = d->op;
    int64_t kept = 1;
    for (int k = 0; k < g.nd; k++) kept *= sx[k] ? g.dims[k] : 1;
    const int64_t red = g.count / kept;
    if (red == 1) {   /* the full-size operand: elementwise, row by row */
        const int64_t inner = g.nd ? g.dims[g.nd - 1] : 1, rows = g.count / inner;
        const int64_t ia = g.nd ? g.sa[g.nd - 1] : 0, ib = g.nd ? g.sb[g.nd - 1] : 0;
#pragma omp parallel for if (g.count >= PS_OMP_MIN) schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            int64_t rest = r, oa = 0, ob = 0;
            for (int k = g.nd - 2; k >= 0; k--) {
                const int64_t i = rest % g.dims[k];
                rest /= g.dims[k];
                oa += i * g.sa[k];
                ob += i * g.sb[k];
            }
            const float *pdy = dy + r * inner;
            float *pdx = dx + r * inner;
            for (int64_t p = 0; p < inner; p++)
                pdx[p] = (float)ps_binary_grad(op, which, pdy[p], reads ? a[oa + p * ia] : 0,
                                               reads ? b[ob + p * ib] : 0);
        }
        return PS_OK;
    }
#pragma omp parallel for if (g.count >= PS_OMP_MIN) schedule(static)
    for (int64_t j = 0; j < kept; j++) dx[j] = (float)ps_bcast_grad_sum(&g, sx, op, which, j, red, a, b, dy);
    return PS_OK;
}

/* ---- torch.where: OpenMP over the elements ---- */

static ps_status dn_where(void *impl, int64_t count, const float *cond, const float *a, float av, const float *b,
                          float bv, float *y, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) y[i] = cond[i] != 0.0f ? (a ? a[i] : av) : (b ? b[i] : bv);
    return PS_OK;
}

static ps_status dn_where_backward(void *impl, int64_t count, const float *cond, const float *dy, float *da,
                                   float *db, ps_err *err) {
    (void)err;
    set_threads(impl);
#pragma omp parallel for if (count >= PS_OMP_MIN) schedule(static)
    for (int64_t i = 0; i < count; i++) {
        const int pick_a = cond[i] != 0.0f;
        if (da) da[i] = pick_a ? dy[i] : 0.0f;
        if (db) db[i] = pick_a ? 0.0f : dy[i];
    }
    return PS_OK;
}

/* Cumulative sum (torch.cumsum): oneDNN has no primitive for it; a threaded
 * loop over the outer index, each thread running its (len, inner) block row
 * by row with inner double accumulators (the inner elements of a row are
 * contiguous, so the loop vectorises), rounded once per element as ref's. */
static ps_status dn_cumsum(void *impl, const ps_cumsum_desc *d, const float *x, float *y, ps_err *err) {
    set_threads(impl);
    const int64_t inner = d->inner, len = d->len;
    int failed = 0;
#pragma omp parallel if (d->outer * len * inner >= PS_OMP_MIN)
    {
        double *acc = malloc((size_t)(inner > 0 ? inner : 1) * sizeof *acc);
        if (!acc) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t o = 0; o < d->outer; o++) {
            if (!acc) continue;
            for (int64_t k = 0; k < inner; k++) acc[k] = 0.0;
            for (int64_t t = 0; t < len; t++) {
                const int64_t i = d->reverse ? len - 1 - t : t;
                const float *xr = x + (o * len + i) * inner;
                float *yr = y + (o * len + i) * inner;
                if (d->exclusive) {
                    for (int64_t k = 0; k < inner; k++) {
                        yr[k] = (float)acc[k];
                        acc[k] += xr[k];
                    }
                } else {
                    for (int64_t k = 0; k < inner; k++) {
                        acc[k] += xr[k];
                        yr[k] = (float)acc[k];
                    }
                }
            }
        }
        free(acc);
    }
    if (failed) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for cumsum's accumulators");
    return PS_OK;
}

/* im2col / col2im (F.unfold / F.fold): oneDNN has no primitive for them;
 * a threaded loop over the (sample, channel) planes, each plane's kernel
 * rows walked row by row: the columns whose pixels lie inside the image
 * (q0 <= q < q1, found once per kernel column) read or add with a plain
 * strided loop, the rest are zeros (im2col) or skipped (col2im). A plane's
 * pixels are written by its own thread alone, so col2im needs no atomics. */

/* The output columns [*q0, *q1) whose pixel q sw - pw + j dw of kernel
 * column j lies in [0, w). */
static void dn_cols_qrange(const ps_im2col_desc *d, int64_t j, int64_t *q0, int64_t *q1) {
    const int64_t off = j * d->dw - d->pw;
    int64_t lo = off >= 0 ? 0 : (-off + d->sw - 1) / d->sw;
    int64_t hi = d->w - off <= 0 ? 0 : (d->w - off + d->sw - 1) / d->sw;
    if (hi > d->ow) hi = d->ow;
    if (lo > hi) lo = hi;
    *q0 = lo;
    *q1 = hi;
}

/* One plane: xp its (h, w) pixels, cp its (kh kw, oh ow) columns. */
static void dn_cols_plane(const ps_im2col_desc *d, float *xp, float *cp, int to_cols) {
    const int64_t L = d->oh * d->ow, sw = d->sw;
    for (int64_t i = 0; i < d->kh; i++)
        for (int64_t j = 0; j < d->kw; j++) {
            int64_t q0, q1;
            dn_cols_qrange(d, j, &q0, &q1);
            float *row = cp + (i * d->kw + j) * L;
            for (int64_t p = 0; p < d->oh; p++) {
                const int64_t y = p * d->sh - d->ph + i * d->dh;
                float *cr = row + p * d->ow;
                if (y < 0 || y >= d->h) {
                    if (to_cols) memset(cr, 0, (size_t)d->ow * sizeof *cr);
                    continue;
                }
                const int64_t base = y * d->w + j * d->dw - d->pw;   /* + q sw in [0, w) for q in [q0, q1) */
                if (to_cols) {
                    for (int64_t q = 0; q < q0; q++) cr[q] = 0.0f;
                    for (int64_t q = q0; q < q1; q++) cr[q] = xp[base + q * sw];
                    for (int64_t q = q1; q < d->ow; q++) cr[q] = 0.0f;
                } else {
                    for (int64_t q = q0; q < q1; q++) xp[base + q * sw] += cr[q];
                }
            }
        }
}

static void dn_cols(void *impl, const ps_im2col_desc *d, float *x, float *col, int to_cols) {
    set_threads(impl);
    const int64_t planes = d->n * d->c, hw = d->h * d->w, cl = d->kh * d->kw * d->oh * d->ow;
#pragma omp parallel for if (planes * (cl > hw ? cl : hw) >= PS_OMP_MIN) schedule(static)
    for (int64_t pl = 0; pl < planes; pl++) {
        if (!to_cols) memset(x + pl * hw, 0, (size_t)hw * sizeof *x);
        dn_cols_plane(d, x + pl * hw, col + pl * cl, to_cols);
    }
}

static ps_status dn_im2col(void *impl, const ps_im2col_desc *d, const float *x, float *col, ps_err *err) {
    (void)err;
    dn_cols(impl, d, (float *)x, col, 1);   /* x only read when to_cols */
    return PS_OK;
}

static ps_status dn_col2im(void *impl, const ps_im2col_desc *d, const float *col, float *x, ps_err *err) {
    (void)err;
    dn_cols(impl, d, x, (float *)col, 0);   /* col only read when !to_cols */
    return PS_OK;
}

/* ---- spatial transformers (AffineGrid, GridSample): oneDNN has no
 * sampling primitive; C loops over samples (backend.h's index rules),
 * in float as PyTorch's CPU kernels. ---- */

static ps_status dn_affine_grid(void *impl, const ps_affgrid_desc *d, const float *theta, float *grid, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t pts = (int64_t)d->h * d->w;
#pragma omp parallel for if ((int64_t)d->n * pts >= PS_OMP_MIN) schedule(static)
    for (int i = 0; i < d->n; i++) {
        const float *t = theta + (int64_t)i * 6;
        float *g = grid + (int64_t)i * pts * 2;
        for (int yy = 0; yy < d->h; yy++) {
            const float by = ps_affgrid_base(yy, d->h, d->align_corners);
            for (int xx = 0; xx < d->w; xx++, g += 2) {
                const float bx = ps_affgrid_base(xx, d->w, d->align_corners);
                g[0] = t[0] * bx + t[1] * by + t[2];
                g[1] = t[3] * bx + t[4] * by + t[5];
            }
        }
    }
    return PS_OK;
}

static ps_status dn_affine_grid_backward(void *impl, const ps_affgrid_desc *d, const float *dgrid, float *dtheta,
                                         ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t pts = (int64_t)d->h * d->w;
#pragma omp parallel for if ((int64_t)d->n * pts >= PS_OMP_MIN) schedule(static)
    for (int i = 0; i < d->n; i++) {
        float acc[6] = {0};
        const float *g = dgrid + (int64_t)i * pts * 2;
        for (int yy = 0; yy < d->h; yy++) {
            const float by = ps_affgrid_base(yy, d->h, d->align_corners);
            for (int xx = 0; xx < d->w; xx++, g += 2) {
                const float bx = ps_affgrid_base(xx, d->w, d->align_corners);
                for (int r = 0; r < 2; r++) {
                    acc[3 * r] += g[r] * bx;
                    acc[3 * r + 1] += g[r] * by;
                    acc[3 * r + 2] += g[r];
                }
            }
        }
        memcpy(dtheta + (int64_t)i * 6, acc, sizeof acc);
    }
    return PS_OK;
}

/* One grid point's taps nw, ne, sw, se (nearest: nw alone): their offsets
 * in a plane (-1 outside the input), their weights, and d index / d grid;
 * lx, ly the weights of the second column and row. */
typedef struct dn_gs_taps {
    int64_t off[4];
    float w[4];
    float lx, ly, gmx, gmy;
} dn_gs_taps;

static inline dn_gs_taps dn_gs_point(const ps_gridsample_desc *d, const float *g) {
    dn_gs_taps t;
    const int nearest = d->mode == PS_GS_NEAREST;
    const float ix = ps_gs_source(g[0], d->w, d->padding, d->align_corners, &t.gmx);
    const float iy = ps_gs_source(g[1], d->h, d->padding, d->align_corners, &t.gmy);
    const int x0 = ps_gs_index(ix, d->w, nearest), y0 = ps_gs_index(iy, d->h, nearest);
    t.lx = nearest ? 0.0f : ix - (float)x0;
    t.ly = nearest ? 0.0f : iy - (float)y0;
    for (int k = 0; k < 4; k++) {
        const int xx = x0 + (k & 1), yy = y0 + (k >> 1);
        t.off[k] = xx >= 0 && xx < d->w && yy >= 0 && yy < d->h ? (int64_t)yy * d->w + xx : -1;
        t.w[k] = ((k & 1) ? t.lx : 1.0f - t.lx) * ((k >> 1) ? t.ly : 1.0f - t.ly);
    }
    return t;
}

static ps_status dn_grid_sample(void *impl, const ps_gridsample_desc *d, const float *x, const float *grid, float *y,
                                ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t in = (int64_t)d->h * d->w, out = (int64_t)d->oh * d->ow;
    const int taps = d->mode == PS_GS_NEAREST ? 1 : 4;
#pragma omp parallel for if ((int64_t)d->n * d->c * out >= PS_OMP_MIN) schedule(static)
    for (int i = 0; i < d->n; i++)
        for (int64_t q = 0; q < out; q++) {
            const dn_gs_taps t = dn_gs_point(d, grid + ((int64_t)i * out + q) * 2);
            for (int c = 0; c < d->c; c++) {
                const float *p = x + ((int64_t)i * d->c + c) * in;
                float v = 0.0f;
                for (int k = 0; k < taps; k++)
                    if (t.off[k] >= 0) v += taps == 1 ? p[t.off[k]] : t.w[k] * p[t.off[k]];
                y[((int64_t)i * d->c + c) * out + q] = v;
            }
        }
    return PS_OK;
}

static ps_status dn_grid_sample_backward(void *impl, const ps_gridsample_desc *d, const float *x, const float *grid,
                                         const float *dy, float *dx, float *dgrid, ps_err *err) {
    (void)err;
    set_threads(impl);
    const int64_t in = (int64_t)d->h * d->w, out = (int64_t)d->oh * d->ow;
    const int nearest = d->mode == PS_GS_NEAREST, taps = nearest ? 1 : 4;
#pragma omp parallel for if ((int64_t)d->n * d->c * out >= PS_OMP_MIN) schedule(static)
    for (int i = 0; i < d->n; i++) {
        if (dx) memset(dx + (int64_t)i * d->c * in, 0, (size_t)(d->c * in) * sizeof *dx);
        for (int64_t q = 0; q < out; q++) {
            const dn_gs_taps t = dn_gs_point(d, grid + ((int64_t)i * out + q) * 2);
            float gx = 0.0f, gy = 0.0f;
            for (int c = 0; c < d->c; c++) {
                const int64_t base = ((int64_t)i * d->c + c) * in;
                const float go = dy[((int64_t)i * d->c + c) * out + q];
                for (int k = 0; k < taps && dx; k++)
                    if (t.off[k] >= 0) dx[base + t.off[k]] += nearest ? go : t.w[k] * go;
                if (nearest || !dgrid) continue;
                float v[4];
                for (int k = 0; k < 4; k++) v[k] = t.off[k] >= 0 ? x[base + t.off[k]] : 0.0f;
                gx += ((v[1] - v[0]) * (1.0f - t.ly) + (v[3] - v[2]) * t.ly) * go;
                gy += ((v[2] - v[0]) * (1.0f - t.lx) + (v[3] - v[1]) * t.lx) * go;
            }
            if (dgrid) {
                dgrid[((int64_t)i * out + q) * 2] = gx * t.gmx;
                dgrid[((int64_t)i * out + q) * 2 + 1] = gy * t.gmy;
            }
        }
    }
    return PS_OK;
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
    .avgpool_forward = dn_avgpool_forward,
    .avgpool_backward = dn_avgpool_backward,
    .batchnorm_forward_training = dn_bn_forward_training,
    .batchnorm_forward_inference = dn_bn_forward_inference,
    .batchnorm_backward = dn_bn_backward,
    .batchnorm_relu = 1,
    .layernorm_forward = dn_ln_forward,
    .layernorm_backward = dn_ln_backward,
    .act_forward = dn_act_forward,
    .act_backward = dn_act_backward,
    .softmax_dim_forward = dn_softmax_dim_forward,
    .softmax_dim_backward = dn_softmax_dim_backward,
    .mul_channels = dn_mul_channels,
    .copy2d = dn_copy2d,
    .add_out = dn_add_out,
    .fill = dn_fill,
    .adaptive_avgpool_forward = dn_adaptive_avgpool_forward,
    .adaptive_avgpool_backward = dn_adaptive_avgpool_backward,
    .permute = dn_permute,
    .matmul = dn_matmul,
    .tri_fill = dn_tri_fill,
    .eq_const = dn_eq_const,
    .key_pad = dn_key_pad,
    /* upsampling */
    .resize_forward = dn_resize_forward,
    .resize_backward = dn_resize_backward,
    .bias_add = dn_bias_add,
    .bias_grad = dn_bias_grad,
    .groupnorm_forward = dn_gn_forward,
    .groupnorm_backward = dn_gn_backward,
    .l2norm_forward = dn_l2norm_forward,
    .l2norm_backward = dn_l2norm_backward,
    .rnn_cell_forward = dn_rnn_cell_forward,
    .rnn_cell_backward = dn_rnn_cell_backward,
    .prelu_forward = dn_prelu_forward,
    .prelu_backward = dn_prelu_backward,
    .binary_bcast = dn_binary_bcast,
    .binary_bcast_backward = dn_binary_bcast_backward,
    .where = dn_where,
    .where_backward = dn_where_backward,
    .cumsum = dn_cumsum,
    .im2col = dn_im2col,
    .col2im = dn_col2im,
    /* spatial transformers */
    .affine_grid = dn_affine_grid,
    .affine_grid_backward = dn_affine_grid_backward,
    .grid_sample = dn_grid_sample,
    .grid_sample_backward = dn_grid_sample_backward,
};
