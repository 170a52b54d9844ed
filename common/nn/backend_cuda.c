/* backend_cuda.c - the CUDA backend: cuDNN for convolution, pooling,
 * activation and softmax (the legacy API, which cuDNN 9 still ships),
 * cuBLAS for the fully connected layers, and the kernels of
 * backend_cuda_kernels.cu where no library call fits (dropout, bias
 * gradient of fc layers, max-pool argmax and gradient, SGD).
 *
 * Built only when the Makefile finds nvcc (it then defines PS_HAVE_CUDA and
 * backend.c registers this table as "cuda"). Nothing here runs, and CUDA is
 * not initialised, unless a stage is placed on cuda:N.
 *
 * Execution model. Every op runs on a "context" (stream + cuDNN handle +
 * cuBLAS handle + cuDNN workspace + pinned copy buffer) taken from a
 * per-backend free list, and synchronises its stream before returning, so
 * an op's results are complete when it returns (as with the CPU backends)
 * and any thread may use any buffer next - except inside an asynchronous
 * run (async_begin / async_end, which psd's executor opens per model call):
 * there the thread's ops share one context and queue on its stream without
 * a wait apiece, the blocks they free are kept aside, and async_end waits
 * once (PS_CUDA_ASYNC=0: no runs). cuDNN and cuBLAS handles are never used
 * by two threads at once. Device memory comes from a per-backend
 * stream-ordered memory pool, or from cudaMalloc where the device has no
 * memory pools, behind a cache of freed blocks by size class that hands
 * them out again with no CUDA call (PS_CUDA_CACHE_MB). Copies to and from
 * the host up to 4 MB go through the context's pinned buffer; a gradient's
 * sum of squares (its norm and finiteness) is computed on the device; a
 * convolution's weight gradient is im2col + one batched cuBLAS GEMM over
 * the images (wgrad_gemm; PS_CUDA_WGRAD=cudnn: cuDNN's), its bias and the
 * bias's gradient kernels of ours (PS_CUDA_BIAS=cudnn: cuDNN's, whose
 * calls cost more of the host's time than the work itself takes).
 *
 * Numerics. Convolutions (any stride, padding, dilation and group count)
 * use FP32 FMA math (no TF32 tensor cores, which Ampere and later would
 * otherwise use for float convolutions) and deterministic algorithms;
 * cuBLAS runs in its default (FP32) math mode. Pooling is kernels of
 * backend_cuda_kernels.cu: max pooling records the argmax of each window
 * (first maximum in row-major order, as PyTorch and the reference backend)
 * in the workspace and routes the gradient through those indices
 * (cudnnPoolingBackward would need x and y, which the op contract does not
 * hand to backward, and leaves the choice among tied maxima unspecified);
 * average pooling follows ps_pool_desc's count_include_pad. Batch and
 * layer normalisation are kernels too (one block per channel or row, sums
 * in double, deterministic), as are the activations; softmax over a
 * dimension is cuDNN's channel mode.
 *
 * Stage boundaries between two CUDA devices (copy_from_peer) use a peer
 * copy when the devices can access each other and otherwise go through a
 * pinned host buffer. PS_CUDA_STAGE_COPY=host forces the pinned-host path
 * (even on one device), so one GPU can exercise the two-device path.
 */
#include "backend_impl.h"
#include "backend_cuda.h"

#include <limits.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <dlfcn.h>

/* ------------------------------------------------------------- cuBLAS */

/* cuBLAS is opened with dlopen when the first CUDA context is made, not
 * linked: the constructors of libcublasLt (which libcublas loads) take
 * ~0.5 s of CPU in every process that links it - psd (twice: it re-executes
 * itself), ps-train and each test program, GPU or not. The seven functions
 * used here are called through this table; the macros keep their names at
 * the call sites (and in PS_CUBLAS_CHECK's messages). */
#define PS_STR_(x) #x
#define PS_STR(x) PS_STR_(x)
#define PS_CUBLAS_LIB "libcublas.so." PS_STR(CUBLAS_VER_MAJOR)
static struct {
    __typeof__(&cublasCreate_v2) create;
    __typeof__(&cublasDestroy_v2) destroy;
    __typeof__(&cublasSetStream_v2) set_stream;
    __typeof__(&cublasSetMathMode) set_math_mode;
    __typeof__(&cublasSgemm_v2) sgemm;
    __typeof__(&cublasSgemmStridedBatched) sgemm_batched;
    __typeof__(&cublasGetStatusString) status_string;
} blas_fn;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static char blas_error[512];  /* why it could not be opened; "" once it is */

static void blas_open(void) {
    void *h = dlopen(PS_CUBLAS_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(blas_error, sizeof blas_error, "cannot load cuBLAS: %s", dlerror());
        return;
    }
    static const struct { const char *name; size_t off; } syms[] = {
        {"cublasCreate_v2", offsetof(__typeof__(blas_fn), create)},
        {"cublasDestroy_v2", offsetof(__typeof__(blas_fn), destroy)},
        {"cublasSetStream_v2", offsetof(__typeof__(blas_fn), set_stream)},
        {"cublasSetMathMode", offsetof(__typeof__(blas_fn), set_math_mode)},
        {"cublasSgemm_v2", offsetof(__typeof__(blas_fn), sgemm)},
        {"cublasSgemmStridedBatched", offsetof(__typeof__(blas_fn), sgemm_batched)},
        {"cublasGetStatusString", offsetof(__typeof__(blas_fn), status_string)},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f) {
            snprintf(blas_error, sizeof blas_error, "%s has no %s", PS_CUBLAS_LIB, syms[i].name);
            memset(&blas_fn, 0, sizeof blas_fn);
            return;
        }
        memcpy((char *)&blas_fn + syms[i].off, &f, sizeof f);
    }
}

int ps_cuda_blas_load(const char **why) {
    pthread_once(&blas_once, blas_open);
    if (why) *why = blas_error;
    return blas_fn.create != NULL;
}

const char *ps_cuda_blas_status_string(int status) {
    return ps_cuda_blas_load(NULL) ? blas_fn.status_string((cublasStatus_t)status) : NULL;
}

#undef cublasCreate
#undef cublasDestroy
#undef cublasSetStream
#undef cublasSgemm
#define cublasCreate(...) blas_fn.create(__VA_ARGS__)
#define cublasDestroy(...) blas_fn.destroy(__VA_ARGS__)
#define cublasSetStream(...) blas_fn.set_stream(__VA_ARGS__)
#define cublasSetMathMode(...) blas_fn.set_math_mode(__VA_ARGS__)
#define cublasSgemm(...) blas_fn.sgemm(__VA_ARGS__)
#undef cublasSgemmStridedBatched
#define cublasSgemmStridedBatched(...) blas_fn.sgemm_batched(__VA_ARGS__)
#define cublasGetStatusString(...) blas_fn.status_string(__VA_ARGS__)

/* ------------------------------------------------------------ checking */

/* "file:line: cudnnConvolutionForward failed: CUDNN_STATUS_BAD_PARAM". The
 * call's text is cut at its '(' so the message names the function. */
static ps_status cuda_fail(ps_err *err, const char *file, int line, const char *call, const char *what) {
    return ps_err_set(err, PS_ERR_INTERNAL, "%s:%d: %.*s failed: %s", file, line,
                      (int)strcspn(call, "("), call, what);
}

/* One checking macro per library. They expect `ps_status rc` and a `done:`
 * label that releases what the op holds. */
#define PS_CUDA_CHECK(call) do { \
    cudaError_t e_ = (call); \
    if (e_ != cudaSuccess) { rc = cuda_fail(err, __FILE__, __LINE__, #call, cudaGetErrorString(e_)); goto done; } \
} while (0)

#define PS_CUDNN_CHECK(call) do { \
    cudnnStatus_t s_ = (call); \
    if (s_ != CUDNN_STATUS_SUCCESS) { rc = cuda_fail(err, __FILE__, __LINE__, #call, cudnnGetErrorString(s_)); goto done; } \
} while (0)

#define PS_CUBLAS_CHECK(call) do { \
    cublasStatus_t s_ = (call); \
    if (s_ != CUBLAS_STATUS_SUCCESS) { rc = cuda_fail(err, __FILE__, __LINE__, #call, cublasGetStatusString(s_)); goto done; } \
} while (0)

/* ------------------------------------------------------------- state */

typedef struct cuda_ctx {
    struct cuda_ctx *next;
    int in_run;               /* held by a thread's asynchronous run (async_begin) */
    cudaStream_t stream;
    cudnnHandle_t dnn;
    cublasHandle_t blas;
    void *ws;                 /* cuDNN workspace (ws_bytes), grown on demand */
    size_t ws_bytes;
    void *pin;                /* pinned host buffer for copies (pin_bytes), grown on demand */
    size_t pin_bytes;
    size_t pin_used;          /* in a run: the front of pin that copies queued and not yet
                                 waited for still read (cu_copy); 0 outside runs */
    cudaEvent_t ev;           /* orders another context's stream after this one's work
                                 (cu_copy_from_peer) */
} cuda_ctx;

/* Descriptors and chosen algorithms of one convolution shape; immutable
 * once in the cache, shared read-only by all contexts. */
typedef struct conv_entry {
    struct conv_entry *next;
    ps_conv_desc d;
    cudnnTensorDescriptor_t x, y, b;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t ws_fwd, ws_bwd_data, ws_bwd_filter;
} conv_entry;

#define PS_CUDA_MAX_DEVICES 64
#define PS_CUDA_STAGE_CHUNK ((size_t)8 << 20) /* pinned staging buffer */
#define PS_CUDA_WS_LIMIT ((size_t)512 << 20)   /* largest cuDNN workspace we accept */

/* Freed device blocks kept by size class and handed out again with no
 * CUDA call (cu_alloc, cu_free): the executor allocates and frees the same
 * sizes every call, and an allocation from the stream-ordered pool costs a
 * driver call and a synchronisation of the legacy stream each time. Safe
 * because every op synchronises before returning, so a freed block is idle.
 * Live blocks are in a chained hash by pointer (a free names no size);
 * cached ones in per-class lists. Idle bytes kept at most cap
 * (PS_CUDA_CACHE_MB, default 1024; 0 turns the cache off); all of them are
 * given back when an allocation fails. */
#define BLK_BUCKETS 4096
#define BLK_CLASSES 320                    /* 512 B .. 2^48 B in steps of 1/8 of a power of two */
typedef struct blk {
    struct blk *next;
    void *p;
    int cls;
} blk;
typedef struct blk_cache {
    int on;
    pthread_mutex_t mu;
    size_t cap, idle;                      /* bytes: the most kept idle, kept idle now */
    size_t live_bytes;                     /* bytes of the blocks handed out (memory_stats) */
    blk *live[BLK_BUCKETS];
    blk *free_cls[BLK_CLASSES];
    blk *spare;                            /* unused nodes */
} blk_cache;

typedef struct cuda_impl {
    int device;
    int have_pool;
    cudaMemPool_t pool;
    int force_staged;                      /* PS_CUDA_STAGE_COPY=host */
    int async;                             /* async_begin honoured (PS_CUDA_ASYNC=0: not) */
    int wgrad_gemm;                        /* conv weight gradients as per-image GEMMs (PS_CUDA_WGRAD) */
    int bias_ours;                         /* conv bias and its gradient by our kernels (PS_CUDA_BIAS) */
    cudnnActivationDescriptor_t relu;
    pthread_mutex_t mu;                    /* free_ctx, convs, peer */
    cuda_ctx *free_ctx;
    conv_entry *convs;
    signed char peer[PS_CUDA_MAX_DEVICES]; /* 0 unknown, 1 peer copy, -1 staged */
    pthread_mutex_t stage_mu;              /* the pinned staging buffer */
    void *pinned;
    blk_cache cache;                       /* freed blocks kept for reuse */
} cuda_impl;

static void ctx_destroy(cuda_ctx *c) {
    if (!c) return;
    if (c->blas) cublasDestroy(c->blas);
    if (c->dnn) cudnnDestroy(c->dnn);
    if (c->ev) cudaEventDestroy(c->ev);
    if (c->stream) cudaStreamDestroy(c->stream);
    if (c->ws) cudaFree(c->ws);
    if (c->pin) cudaFreeHost(c->pin);
    free(c);
}

static ps_status ctx_create(cuda_impl *im, cuda_ctx **out, ps_err *err) {
    ps_status rc = PS_OK;
    const char *why = NULL;
    cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cuda:%d: out of memory", im->device);
    PS_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    PS_CUDA_CHECK(cudaEventCreateWithFlags(&c->ev, cudaEventDisableTiming));
    PS_CUDNN_CHECK(cudnnCreate(&c->dnn));
    PS_CUDNN_CHECK(cudnnSetStream(c->dnn, c->stream));
    if (!ps_cuda_blas_load(&why)) {
        rc = ps_err_set(err, PS_ERR_UNAVAILABLE, "cuda:%d: %s", im->device, why);
        goto done;
    }
    PS_CUBLAS_CHECK(cublasCreate(&c->blas));
    PS_CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    PS_CUBLAS_CHECK(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH));
done:
    if (rc != PS_OK) { ctx_destroy(c); c = NULL; }
    *out = c;
    return rc;
}

/* ---- a thread's asynchronous runs (backend.h async_begin / async_end) ----
 * While a run is open, the thread's ops on this backend share one context
 * (their stream orders them) and end without waiting for it; the blocks
 * they free are kept aside until the run ends, waits for the stream and
 * releases them (a block must not be handed to another thread's stream
 * while this one may still use it). A copy from the host is queued too
 * (its bytes copied first into a region of the context's pinned buffer of
 * its own until the run waits); a copy to the host waits. A stage boundary
 * from another backend on the same device orders the two runs' streams by
 * events (cu_copy_from_peer); from another device it first waits for that
 * backend's run on this thread. One slot per backend a thread has a run
 * open on. */
#define PS_CUDA_RUN_SLOTS 8
typedef struct cuda_run {
    cuda_impl *im;             /* NULL: slot unused */
    int depth;                 /* nested async_begin calls */
    cuda_ctx *c;               /* the run's context, taken at its first op */
    void **freed;              /* blocks freed during the run */
    size_t nfreed, cap;
} cuda_run;
static __thread cuda_run tls_run[PS_CUDA_RUN_SLOTS];

static cuda_run *run_of(const cuda_impl *im) {
    for (int i = 0; i < PS_CUDA_RUN_SLOTS; i++)
        if (tls_run[i].im == im) return &tls_run[i];
    return NULL;
}

/* Make this thread's current device the backend's and take a context (the
 * run's, when this thread has one open on the backend). */
static ps_status ctx_acquire(cuda_impl *im, cuda_ctx **out, ps_err *err) {
    ps_status rc = PS_OK;
    *out = NULL;
    PS_CUDA_CHECK(cudaSetDevice(im->device));
    cuda_run *r = run_of(im);
    if (r && r->c) {
        *out = r->c;
        return PS_OK;
    }
    pthread_mutex_lock(&im->mu);
    cuda_ctx *c = im->free_ctx;
    if (c) im->free_ctx = c->next;
    pthread_mutex_unlock(&im->mu);
    if (!c && (rc = ctx_create(im, &c, err)) != PS_OK) return rc;
    if (r) {
        c->in_run = 1;
        r->c = c;
    }
    *out = c;
done:
    return rc;
}

static void ctx_release(cuda_impl *im, cuda_ctx *c) {
    if (!c || c->in_run) return;   /* a run's context stays with it until async_end */
    pthread_mutex_lock(&im->mu);
    c->next = im->free_ctx;
    im->free_ctx = c;
    pthread_mutex_unlock(&im->mu);
}

/* The end of an op: wait for the context's work, unless it is a run's. */
#define PS_CUDA_SYNC(c) do { if (!(c)->in_run) PS_CUDA_CHECK(cudaStreamSynchronize((c)->stream)); } while (0)
/* Wait for the context's work, in a run too (host memory is read or written). */
#define PS_CUDA_WAIT(c) PS_CUDA_CHECK(cudaStreamSynchronize((c)->stream))

static ps_status ctx_workspace(cuda_ctx *c, size_t bytes, ps_err *err) {
    ps_status rc = PS_OK;
    if (bytes <= c->ws_bytes) return PS_OK;
    if (c->ws) {
        PS_CUDA_CHECK(cudaStreamSynchronize(c->stream));
        PS_CUDA_CHECK(cudaFree(c->ws));
        c->ws = NULL;
        c->ws_bytes = 0;
    }
    PS_CUDA_CHECK(cudaMalloc(&c->ws, bytes));
    c->ws_bytes = bytes;
done:
    return rc;
}

/* ---------------------------------------------------------- init, info */

void ps_backend_cuda_build_info(char *buf, size_t size) {
    int rt = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = CUDART_VERSION;
    size_t dnn = cudnnGetVersion();
    snprintf(buf, size, "built (runtime %d.%d, cuDNN %zu.%zu.%zu)", rt / 1000, (rt % 1000) / 10,
             dnn / 10000, (dnn % 10000) / 100, dnn % 100);
}

/* "CUDA devices found: 2: cuda:0 NVIDIA H200, cuda:1 NVIDIA H200" or
 * "no CUDA devices found: <why>". */
static void describe_devices(char *buf, size_t size, int count, cudaError_t why) {
    if (why != cudaSuccess || count <= 0) {
        snprintf(buf, size, "no CUDA devices found%s%s", why != cudaSuccess ? ": " : "",
                 why != cudaSuccess ? cudaGetErrorString(why) : "");
        return;
    }
    size_t len = (size_t)snprintf(buf, size, "CUDA devices found: %d:", count);
    for (int i = 0; i < count && len < size; i++) {
        struct cudaDeviceProp p;
        const char *name = cudaGetDeviceProperties(&p, i) == cudaSuccess ? p.name : "(unknown)";
        len += (size_t)snprintf(buf + len, size - len, "%s cuda:%d %s", i ? "," : "", i, name);
    }
}

static void cu_destroy(void *impl);
static void blk_cache_destroy(cuda_impl *im);

static ps_status cu_init(void **impl, int device, int nthreads, ps_err *err) {
    (void)nthreads;
    ps_status rc = PS_OK;
    *impl = NULL;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0 || device < 0 || device >= count) {
        char found[384];
        if (e != cudaSuccess) (void)cudaGetLastError(); /* clear it */
        describe_devices(found, sizeof found, e == cudaSuccess ? count : 0, e);
        return ps_err_set(err, (e != cudaSuccess || count <= 0) ? PS_ERR_UNAVAILABLE : PS_ERR_INVALID_ARGUMENT,
                          "no such device (%s)", found);
    }
    cuda_impl *im = calloc(1, sizeof *im);
    if (!im) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cuda:%d: out of memory", device);
    im->device = device;
    pthread_mutex_init(&im->mu, NULL);
    pthread_mutex_init(&im->stage_mu, NULL);
    const char *stage = getenv("PS_CUDA_STAGE_COPY");
    im->force_staged = stage && !strcmp(stage, "host");
    const char *wgrad = getenv("PS_CUDA_WGRAD");
    im->wgrad_gemm = !(wgrad && !strcmp(wgrad, "cudnn"));
    const char *bias = getenv("PS_CUDA_BIAS");
    im->bias_ours = !(bias && !strcmp(bias, "cudnn"));
    const char *async = getenv("PS_CUDA_ASYNC");
    im->async = !(async && !strcmp(async, "0"));
    const char *cache_mb = getenv("PS_CUDA_CACHE_MB");
    long mb = cache_mb && *cache_mb ? strtol(cache_mb, NULL, 10) : 1024;
    pthread_mutex_init(&im->cache.mu, NULL);
    im->cache.on = mb > 0;
    im->cache.cap = mb > 0 ? (size_t)mb << 20 : 0;
    *impl = im;

    PS_CUDA_CHECK(cudaSetDevice(device));
    int pools = 0;
    PS_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    if (pools) {
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = device;
        PS_CUDA_CHECK(cudaMemPoolCreate(&im->pool, &props));
        im->have_pool = 1;
        uint64_t keep = UINT64_MAX; /* keep freed blocks for reuse */
        PS_CUDA_CHECK(cudaMemPoolSetAttribute(im->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    }
    PS_CUDNN_CHECK(cudnnCreateActivationDescriptor(&im->relu));
    PS_CUDNN_CHECK(cudnnSetActivationDescriptor(im->relu, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
    /* One context now, so that a broken driver or library shows at start-up. */
    cuda_ctx *c = NULL;
    if ((rc = ctx_create(im, &c, err)) != PS_OK) goto done;
    ctx_release(im, c);
done:
    if (rc != PS_OK) {
        ps_err_prefix(err, "cuda:%d", device);
        cu_destroy(im);
        *impl = NULL;
    }
    return rc;
}

static void cu_destroy(void *impl) {
    cuda_impl *im = impl;
    if (!im) return;
    cudaSetDevice(im->device);
    cudaDeviceSynchronize();
    while (im->free_ctx) {
        cuda_ctx *c = im->free_ctx;
        im->free_ctx = c->next;
        ctx_destroy(c);
    }
    while (im->convs) {
        conv_entry *ce = im->convs;
        im->convs = ce->next;
        cudnnDestroyTensorDescriptor(ce->x);
        cudnnDestroyTensorDescriptor(ce->y);
        cudnnDestroyTensorDescriptor(ce->b);
        cudnnDestroyFilterDescriptor(ce->w);
        cudnnDestroyConvolutionDescriptor(ce->conv);
        free(ce);
    }
    if (im->relu) cudnnDestroyActivationDescriptor(im->relu);
    if (im->pinned) cudaFreeHost(im->pinned);
    blk_cache_destroy(im);
    if (im->have_pool) cudaMemPoolDestroy(im->pool);
    pthread_mutex_destroy(&im->mu);
    pthread_mutex_destroy(&im->stage_mu);
    free(im);
}

/* -------------------------------------------------------------- memory */

/* The class of a request and the bytes a block of it has: 512 B, then
 * m * 2^(e-3) for m in 8..15 (at most 1/8 more than asked). */
static int blk_class(size_t bytes, size_t *rounded) {
    if (bytes <= 512) { *rounded = 512; return 0; }
    int e = 63 - __builtin_clzll((unsigned long long)bytes);   /* 2^e <= bytes < 2^(e+1) */
    size_t step = (size_t)1 << (e - 3);
    size_t m = (bytes + step - 1) / step;                         /* 8..16 */
    if (m == 16) { m = 8; e++; step <<= 1; }
    *rounded = m * step;
    int c = 1 + (e - 9) * 8 + (int)(m - 8);
    return c < BLK_CLASSES ? c : -1;
}

static size_t blk_bytes(int cls) {
    if (cls == 0) return 512;
    int e = 9 + (cls - 1) / 8, m = 8 + (cls - 1) % 8;
    return (size_t)m << (e - 3);
}

static unsigned blk_hash(const void *p) {
    return (unsigned)((((uintptr_t)p >> 8) * 0x9E3779B97F4A7C15ull) >> 52) & (BLK_BUCKETS - 1);
}

/* Device memory from the pool (or cudaMalloc), outside the cache. */
static void *raw_alloc(cuda_impl *im, size_t bytes) {
    void *p = NULL;
    if (im->have_pool) {
        /* Stream-ordered on the legacy stream, then complete, so any
         * context's stream may use the block right away. */
        if (cudaMallocFromPoolAsync(&p, bytes, im->pool, 0) != cudaSuccess ||
            cudaStreamSynchronize(0) != cudaSuccess) {
            (void)cudaGetLastError();
            return NULL;
        }
        return p;
    }
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void raw_free(cuda_impl *im, void *p) {
    /* Every op has synchronised before returning: no work still uses p. */
    if (im->have_pool) cudaFreeAsync(p, 0);
    else cudaFree(p);
}

/* Give every idle block back (caller holds cache.mu). */
static void blk_cache_drop(cuda_impl *im) {
    for (int c = 0; c < BLK_CLASSES; c++)
        while (im->cache.free_cls[c]) {
            blk *b = im->cache.free_cls[c];
            im->cache.free_cls[c] = b->next;
            raw_free(im, b->p);
            b->next = im->cache.spare;
            im->cache.spare = b;
        }
    im->cache.idle = 0;
}

static void blk_cache_destroy(cuda_impl *im) {
    blk_cache *bc = &im->cache;
    pthread_mutex_lock(&bc->mu);
    blk_cache_drop(im);
    for (int h = 0; h < BLK_BUCKETS; h++)   /* blocks never freed: their nodes only */
        while (bc->live[h]) {
            blk *b = bc->live[h];
            bc->live[h] = b->next;
            free(b);
        }
    while (bc->spare) {
        blk *b = bc->spare;
        bc->spare = b->next;
        free(b);
    }
    pthread_mutex_unlock(&bc->mu);
    pthread_mutex_destroy(&bc->mu);
}

static void *cu_alloc(void *impl, size_t bytes) {
    cuda_impl *im = impl;
    blk_cache *bc = &im->cache;
    if (cudaSetDevice(im->device) != cudaSuccess) return NULL;
    if (!bytes) bytes = 1;
    size_t rounded = bytes;
    int cls = bc->on ? blk_class(bytes, &rounded) : -1;
    if (cls < 0) return raw_alloc(im, bytes);
    pthread_mutex_lock(&bc->mu);
    blk *b = bc->free_cls[cls];
    if (b) {   /* a cached block: no CUDA call */
        bc->free_cls[cls] = b->next;
        bc->idle -= rounded;
    } else {
        pthread_mutex_unlock(&bc->mu);
        void *p = raw_alloc(im, rounded);
        pthread_mutex_lock(&bc->mu);
        if (!p && bc->idle) {   /* out of memory: give the idle blocks back and try again */
            blk_cache_drop(im);
            pthread_mutex_unlock(&bc->mu);
            p = raw_alloc(im, rounded);
            pthread_mutex_lock(&bc->mu);
        }
        if (p && !(b = bc->spare) && !(b = malloc(sizeof *b))) {
            pthread_mutex_unlock(&bc->mu);
            raw_free(im, p);
            return NULL;
        }
        if (!p) { pthread_mutex_unlock(&bc->mu); return NULL; }
        if (b == bc->spare) bc->spare = b->next;
        b->p = p;
        b->cls = cls;
    }
    unsigned h = blk_hash(b->p);
    b->next = bc->live[h];
    bc->live[h] = b;
    bc->live_bytes += rounded;
    pthread_mutex_unlock(&bc->mu);
    return b->p;
}

static void cu_free(void *impl, void *p) {
    cuda_impl *im = impl;
    blk_cache *bc = &im->cache;
    if (!p) return;
    cuda_run *r = run_of(im);
    if (r && r->c) {   /* the run's stream may still use p: released at async_end */
        if (r->nfreed == r->cap) {
            size_t cap = r->cap ? 2 * r->cap : 64;
            void **f = realloc(r->freed, cap * sizeof *f);
            if (f) { r->freed = f; r->cap = cap; }
        }
        if (r->nfreed < r->cap) {
            r->freed[r->nfreed++] = p;
            return;
        }
        cudaSetDevice(im->device);   /* no room to keep it aside: wait for the run's work instead */
        cudaStreamSynchronize(r->c->stream);
    }
    cudaSetDevice(im->device);
    if (bc->on) {
        pthread_mutex_lock(&bc->mu);
        blk **pp = &bc->live[blk_hash(p)];
        while (*pp && (*pp)->p != p) pp = &(*pp)->next;
        blk *b = *pp;
        if (b) {
            *pp = b->next;
            const size_t bytes = blk_bytes(b->cls);
            bc->live_bytes -= bytes;
            if (bc->idle + bytes <= bc->cap) {   /* kept for the next request of its class */
                b->next = bc->free_cls[b->cls];
                bc->free_cls[b->cls] = b;
                bc->idle += bytes;
                pthread_mutex_unlock(&bc->mu);
                return;
            }
            b->next = bc->spare;
            bc->spare = b;
        }
        pthread_mutex_unlock(&bc->mu);
    }
    raw_free(im, p);
}

/* backend.h memory_stats: the pool's memory in use (our cache's idle
 * blocks included: they are not given back to it) and the cache's idle
 * bytes; without a pool, the blocks the cache manages. */
static ps_status cu_memory_stats(void *impl, ps_backend_memory *out, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc = PS_OK;
    size_t fr = 0, tot = 0;
    memset(out, 0, sizeof *out);
    PS_CUDA_CHECK(cudaSetDevice(im->device));
    PS_CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    out->device_free = fr;
    out->device_total = tot;
    pthread_mutex_lock(&im->cache.mu);
    out->cached = im->cache.idle;
    out->used = im->cache.live_bytes + im->cache.idle;
    pthread_mutex_unlock(&im->cache.mu);
    if (im->have_pool) {
        uint64_t used = 0;
        PS_CUDA_CHECK(cudaMemPoolGetAttribute(im->pool, cudaMemPoolAttrUsedMemCurrent, &used));
        out->used = used;
    }
done:
    return rc;
}

static void cu_async_begin(void *impl) {
    cuda_impl *im = impl;
    if (!im->async) return;
    cuda_run *r = run_of(im);
    if (r) { r->depth++; return; }
    for (int i = 0; i < PS_CUDA_RUN_SLOTS; i++)
        if (!tls_run[i].im) {
            tls_run[i] = (cuda_run){.im = im, .depth = 1};
            return;
        }
    /* no slot free: this run's ops stay synchronous */
}

static ps_status cu_async_end(void *impl, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc = PS_OK;
    cuda_run *r = run_of(im);
    if (!r || --r->depth > 0) return PS_OK;
    cuda_ctx *c = r->c;
    void **freed = r->freed;
    size_t nfreed = r->nfreed;
    *r = (cuda_run){0};   /* closed: what follows is outside the run */
    if (c) {
        c->in_run = 0;
        cudaError_t e = cudaSetDevice(im->device);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
        c->pin_used = 0;   /* every copy through the pinned buffer is done */
        if (e != cudaSuccess)
            rc = cuda_fail(err, __FILE__, __LINE__, "cudaStreamSynchronize(end of an asynchronous run)",
                           cudaGetErrorString(e));
        ctx_release(im, c);
    }
    for (size_t i = 0; i < nfreed; i++) cu_free(im, freed[i]);
    free(freed);
    return rc;
}

/* Copies between the host and the device up to this size go through the
 * context's own pinned buffer: a copy from or to pageable memory is staged
 * by the driver through buffers that concurrent copies of the process take
 * turns on (8 threads' 100 KB inputs ran one at a time, bench_cuda_ops),
 * while each context's pinned buffer is its own. Larger ones go direct. */
#define PS_CUDA_PIN_MAX ((size_t)4 << 20)

/* The context's pinned buffer holding at least bytes (0: none to be had);
 * only while no queued copy reads it (c->pin_used == 0). */
static int ctx_pinned(cuda_ctx *c, size_t bytes) {
    if (bytes <= c->pin_bytes) return 1;
    size_t want = (size_t)64 << 10;
    while (want < bytes) want *= 2;
    if (c->pin) cudaFreeHost(c->pin);   /* idle: every copy through it waited for its end */
    c->pin = NULL;
    c->pin_bytes = 0;
    if (cudaHostAlloc(&c->pin, want, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        c->pin = NULL;
        return 0;
    }
    c->pin_bytes = want;
    return 1;
}

/* Where in c's pinned buffer a copy of bytes may stage: past the regions
 * that copies queued in the run still read (c->pin_used), or, when they
 * leave no room, at 0 after waiting for them; -1: no pinned buffer to be
 * had (the caller copies direct). */
static int64_t pin_region(cuda_ctx *c, size_t bytes, ps_err *err) {
    size_t at = c->pin_used;
    if (at + bytes > c->pin_bytes) {
        cudaError_t e = at ? cudaStreamSynchronize(c->stream) : cudaSuccess;
        if (e != cudaSuccess) {
            cuda_fail(err, __FILE__, __LINE__, "cudaStreamSynchronize(pinned buffer full)", cudaGetErrorString(e));
            return -2;
        }
        c->pin_used = at = 0;
        if (!ctx_pinned(c, bytes)) return -1;
    }
    return (int64_t)at;
}

static ps_status cu_copy(cuda_impl *im, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                         ps_err *err) {
    ps_status rc = PS_OK;
    cuda_ctx *c = NULL;
    if (!bytes) return PS_OK;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    int64_t at = bytes <= PS_CUDA_PIN_MAX ? pin_region(c, bytes, err) : -1;
    if (at == -2) { rc = err->code; goto done; }
    if (at >= 0) {
        char *pin = (char *)c->pin + at;
        if (kind == cudaMemcpyHostToDevice) {
            memcpy(pin, src, bytes);   /* src is read: the caller may reuse it at once */
            PS_CUDA_CHECK(cudaMemcpyAsync(dst, pin, bytes, kind, c->stream));
            if (c->in_run) {   /* queued: the region stays the copy's until the run waits */
                c->pin_used = (size_t)at + ((bytes + 255) & ~(size_t)255);
            } else {
                PS_CUDA_WAIT(c);
            }
        } else {   /* after the queued copies in stream order, so their regions may be reused */
            PS_CUDA_CHECK(cudaMemcpyAsync(pin, src, bytes, kind, c->stream));
            PS_CUDA_WAIT(c);
            c->pin_used = 0;
            memcpy(dst, pin, bytes);
        }
        goto done;
    }
    PS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, c->stream));
    PS_CUDA_WAIT(c);
done:
    ctx_release(im, c);
    return rc;
}

/* The sum in double of x[i]^2 on the device: partial sums per block, then
 * one block over them (deterministic), and one double back to the host. */
static ps_status cu_sum_squares(void *impl, const float *x, int64_t n, double *out, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc = PS_OK;
    cuda_ctx *c = NULL;
    *out = 0.0;
    if (n <= 0) return PS_OK;
    const int parts = ps_cuda_sum_squares_parts(n);
    double *tmp = cu_alloc(im, ((size_t)parts + 1) * sizeof(double));   /* the partials, then the sum */
    if (!tmp) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cuda:%d: out of device memory", im->device);
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) goto done;
    PS_CUDA_CHECK(ps_cuda_sum_squares(n, x, tmp, parts, tmp + parts, c->stream));
    PS_CUDA_CHECK(cudaMemcpyAsync(out, tmp + parts, sizeof *out, cudaMemcpyDeviceToHost, c->stream));
    PS_CUDA_WAIT(c);
done:
    ctx_release(im, c);
    cu_free(im, tmp);
    return rc;
}

static ps_status cu_copy_to_device(void *impl, void *dst, const void *host_src, size_t bytes, ps_err *err) {
    return cu_copy(impl, dst, host_src, bytes, cudaMemcpyHostToDevice, err);
}

static ps_status cu_copy_to_host(void *impl, void *host_dst, const void *src, size_t bytes, ps_err *err) {
    return cu_copy(impl, host_dst, src, bytes, cudaMemcpyDeviceToHost, err);
}

/* Can this backend's device read src_dev's pool memory directly? Decided
 * once per device pair: enables peer access (for cudaMalloc memory) and
 * grants this device access to the source's pool. */
static int peer_usable(cuda_impl *dst, cuda_impl *src) {
    int s = src->device;
    if (dst->force_staged || src->force_staged) return 0;
    if (s == dst->device) return 1;
    if (s < 0 || s >= PS_CUDA_MAX_DEVICES) return 0;
    pthread_mutex_lock(&dst->mu);
    int state = dst->peer[s];
    if (state == 0) {
        int can = 0;
        state = -1;
        if (cudaDeviceCanAccessPeer(&can, dst->device, s) == cudaSuccess && can) {
            cudaError_t e = cudaDeviceEnablePeerAccess(s, 0); /* current device is dst's */
            if (e == cudaErrorPeerAccessAlreadyEnabled) e = cudaSuccess;
            if (e == cudaSuccess && src->have_pool) {
                struct cudaMemAccessDesc a;
                memset(&a, 0, sizeof a);
                a.location.type = cudaMemLocationTypeDevice;
                a.location.id = dst->device;
                a.flags = cudaMemAccessFlagsProtReadWrite;
                e = cudaMemPoolSetAccess(src->pool, &a, 1);
            }
            if (e == cudaSuccess) state = 1;
        }
        (void)cudaGetLastError();
        dst->peer[s] = (signed char)state;
    }
    pthread_mutex_unlock(&dst->mu);
    return state == 1;
}

/* Stage boundary between two CUDA backends (possibly on the same device). */
static ps_status cu_copy_from_peer(void *impl, void *dst, void *src_impl, const void *src, size_t bytes,
                                   ps_err *err) {
    cuda_impl *im = impl, *sim = src_impl;
    ps_status rc = PS_OK;
    cuda_ctx *c = NULL, *sc = NULL;
    if (!bytes) return PS_OK;
    cuda_run *sr = sim != im ? run_of(sim) : NULL;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    if (c->in_run && sim->device == im->device && (sim == im || (sr && sr->c)) && peer_usable(im, sim)) {
        /* Both sides queued on one device: no wait. The copy follows what this thread's run on the
         * source queued (src is written there), and that run's stream then waits for the copy: src,
         * freed during that run, is released only at its end, after the copy has read it. */
        if (sim != im) {
            PS_CUDA_CHECK(cudaEventRecord(sr->c->ev, sr->c->stream));
            PS_CUDA_CHECK(cudaStreamWaitEvent(c->stream, sr->c->ev, 0));
        }
        PS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
        if (sim != im) {
            PS_CUDA_CHECK(cudaEventRecord(c->ev, c->stream));
            PS_CUDA_CHECK(cudaStreamWaitEvent(sr->c->stream, c->ev, 0));
        }
        goto done;
    }
    if (sr && sr->c) {   /* src may still be being written by this thread's run on the source backend */
        PS_CUDA_CHECK(cudaSetDevice(sim->device));
        PS_CUDA_WAIT(sr->c);
        PS_CUDA_CHECK(cudaSetDevice(im->device));
    }
    if (peer_usable(im, sim)) {
        if (sim->device == im->device)
            PS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
        else
            PS_CUDA_CHECK(cudaMemcpyPeerAsync(dst, im->device, src, sim->device, bytes, c->stream));
        PS_CUDA_WAIT(c);
        goto done;
    }
    /* Through pinned host memory, one chunk at a time. */
    pthread_mutex_lock(&im->stage_mu);
    if (!im->pinned) {
        cudaError_t e = cudaHostAlloc(&im->pinned, PS_CUDA_STAGE_CHUNK, cudaHostAllocPortable);
        if (e != cudaSuccess) {
            im->pinned = NULL;
            pthread_mutex_unlock(&im->stage_mu);
            rc = cuda_fail(err, __FILE__, __LINE__, "cudaHostAlloc(staging buffer)", cudaGetErrorString(e));
            goto done;
        }
    }
    if ((rc = ctx_acquire(sim, &sc, err)) == PS_OK) {
        for (size_t off = 0; off < bytes && rc == PS_OK; off += PS_CUDA_STAGE_CHUNK) {
            size_t n = bytes - off < PS_CUDA_STAGE_CHUNK ? bytes - off : PS_CUDA_STAGE_CHUNK;
            cudaError_t e = cudaSetDevice(sim->device);
            if (e == cudaSuccess) e = cudaMemcpyAsync(im->pinned, (const char *)src + off, n, cudaMemcpyDeviceToHost, sc->stream);
            if (e == cudaSuccess) e = cudaStreamSynchronize(sc->stream);
            if (e == cudaSuccess) e = cudaSetDevice(im->device);
            if (e == cudaSuccess) e = cudaMemcpyAsync((char *)dst + off, im->pinned, n, cudaMemcpyHostToDevice, c->stream);
            if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
            if (e != cudaSuccess)
                rc = cuda_fail(err, __FILE__, __LINE__, "cudaMemcpyAsync(through pinned host memory)",
                               cudaGetErrorString(e));
        }
    }
    pthread_mutex_unlock(&im->stage_mu);
done:
    ctx_release(sim, sc);
    ctx_release(im, c);
    return rc;
}

/* --------------------------------------------------------- convolution */

static void conv_entry_free(conv_entry *ce) {
    if (!ce) return;
    if (ce->x) cudnnDestroyTensorDescriptor(ce->x);
    if (ce->y) cudnnDestroyTensorDescriptor(ce->y);
    if (ce->b) cudnnDestroyTensorDescriptor(ce->b);
    if (ce->w) cudnnDestroyFilterDescriptor(ce->w);
    if (ce->conv) cudnnDestroyConvolutionDescriptor(ce->conv);
    free(ce);
}

/* Pick the first algorithm cuDNN's heuristics rank that is deterministic,
 * needs no tensor-op math (the descriptor's CUDNN_FMA_MATH then holds it to
 * FP32), is GEMM-like or direct (FFT and Winograd trade
 * accuracy for speed) and fits the workspace limit; fall back to the
 * classic implicit-GEMM kernels. */
#define PICK_ALGO(perf, count, accurate, out, fallback) do { \
    (out) = (fallback); \
    for (int i_ = 0; i_ < (count); i_++) \
        if ((perf)[i_].status == CUDNN_STATUS_SUCCESS && (perf)[i_].determinism == CUDNN_DETERMINISTIC && \
            ((perf)[i_].mathType == CUDNN_FMA_MATH || (perf)[i_].mathType == CUDNN_DEFAULT_MATH) && \
            (perf)[i_].memory <= PS_CUDA_WS_LIMIT && \
            accurate((perf)[i_].algo)) { \
            (out) = (perf)[i_].algo; break; } \
} while (0)

static int fwd_accurate(cudnnConvolutionFwdAlgo_t a) {
    return a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_GEMM || a == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
}
static int bwd_data_accurate(cudnnConvolutionBwdDataAlgo_t a) {
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
}
static int bwd_filter_accurate(cudnnConvolutionBwdFilterAlgo_t a) {
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

/* The entry of d (resolved: ps_conv_resolve), created on first use. */
static ps_status conv_lookup(cuda_impl *im, cuda_ctx *c, const ps_conv_desc *d, conv_entry **out, ps_err *err) {
    ps_status rc = PS_OK;
    conv_entry *ce = NULL;
    pthread_mutex_lock(&im->mu);
    for (conv_entry *e = im->convs; e; e = e->next)
        if (!memcmp(&e->d, d, sizeof *d)) { *out = e; pthread_mutex_unlock(&im->mu); return PS_OK; }
    ce = calloc(1, sizeof *ce);
    if (!ce) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cuda: out of memory"); goto done; }
    ce->d = *d;
    const int oh = ps_conv_out_h(d), ow = ps_conv_out_w(d);
    PS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&ce->x));
    PS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&ce->y));
    PS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&ce->b));
    PS_CUDNN_CHECK(cudnnCreateFilterDescriptor(&ce->w));
    PS_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&ce->conv));
    PS_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(ce->conv, d->pad_h, d->pad_w, d->stride_h, d->stride_w,
                                                   d->dil_h, d->dil_w, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    PS_CUDNN_CHECK(cudnnSetConvolutionGroupCount(ce->conv, d->groups));
    PS_CUDNN_CHECK(cudnnSetConvolutionMathType(ce->conv, CUDNN_FMA_MATH));
    PS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(ce->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, d->n, d->cin, d->h, d->w));
    PS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(ce->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, d->n, d->cout, oh, ow));
    PS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(ce->b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, d->cout, 1, 1));
    /* grouped: (cout, cin/groups, kh, kw), PyTorch's weight */
    PS_CUDNN_CHECK(cudnnSetFilter4dDescriptor(ce->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, d->cout, d->cin / d->groups,
                                              d->kh, d->kw));
    int dn, dc, dh, dw;
    PS_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(ce->conv, ce->x, ce->w, &dn, &dc, &dh, &dw));
    if (dn != d->n || dc != d->cout || dh != oh || dw != ow) {
        rc = ps_err_set(err, PS_ERR_INTERNAL, "%s:%d: cudnnGetConvolution2dForwardOutputDim failed: "
                        "(%d,%d,%d,%d) instead of (%d,%d,%d,%d)", __FILE__, __LINE__, dn, dc, dh, dw,
                        d->n, d->cout, oh, ow);
        goto done;
    }
    {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        int n = 0;
        PS_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(c->dnn, ce->x, ce->w, ce->conv, ce->y,
                                                              CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
        PICK_ALGO(perf, n, fwd_accurate, ce->fwd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM);
        PS_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(c->dnn, ce->x, ce->w, ce->conv, ce->y,
                                                               ce->fwd, &ce->ws_fwd));
    }
    {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        int n = 0;
        PS_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(c->dnn, ce->w, ce->y, ce->conv, ce->x,
                                                                   CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
        PICK_ALGO(perf, n, bwd_data_accurate, ce->bwd_data, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
        PS_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(c->dnn, ce->w, ce->y, ce->conv, ce->x,
                                                                    ce->bwd_data, &ce->ws_bwd_data));
    }
    {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int n = 0;
        PS_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(c->dnn, ce->x, ce->y, ce->conv, ce->w,
                                                                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
        PICK_ALGO(perf, n, bwd_filter_accurate, ce->bwd_filter, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
        PS_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(c->dnn, ce->x, ce->y, ce->conv, ce->w,
                                                                      ce->bwd_filter, &ce->ws_bwd_filter));
    }
    ce->next = im->convs;
    im->convs = ce;
    *out = ce;
    ce = NULL;
done:
    pthread_mutex_unlock(&im->mu);
    conv_entry_free(ce);
    return rc;
}

static ps_status cu_conv2d_forward(void *impl, const ps_conv_desc *desc, const float *x, const float *w,
                                   const float *b, float *y, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    conv_entry *ce = NULL;
    const float one = 1.0f, zero = 0.0f;
    const ps_conv_desc d = ps_conv_resolve(desc);
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    if ((rc = conv_lookup(im, c, &d, &ce, err)) != PS_OK) goto done;
    if ((rc = ctx_workspace(c, ce->ws_fwd, err)) != PS_OK) goto done;
    PS_CUDNN_CHECK(cudnnConvolutionForward(c->dnn, &one, ce->x, x, ce->w, w, ce->conv, ce->fwd, c->ws,
                                           ce->ws_fwd, &zero, ce->y, y));
    if (b && im->bias_ours)
        PS_CUDA_CHECK(ps_cuda_bias_add(d.n, d.cout, (int64_t)ps_conv_out_h(&d) * ps_conv_out_w(&d), b, y, c->stream));
    else if (b)
        PS_CUDNN_CHECK(cudnnAddTensor(c->dnn, &one, ce->b, b, &one, ce->y, y));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

/* The weight gradient as per-image GEMMs (PS_CUDA_WGRAD; "cudnn": cuDNN's).
 * The deterministic backward-filter algorithm cuDNN offers for MNIST's conv2
 * at batch 32 (wgrad_alg1_engine) took 335 us of GPU time on an H200 (ncu)
 * against 37 us for the forward and 45 for the data gradient: the sum over
 * every image's pixels ran on few blocks. Here: im2col of each image (K =
 * cin kh kw rows, L = oh ow columns), one strided batched GEMM for the n
 * images' dW_s (cout, K) = dy_s (cout, L) . col_s^T, and their sum in image
 * order in double - FP32 GEMMs, deterministic. Ungrouped convolutions whose
 * columns fit in PS_CUDA_WGRAD_MAX bytes; the others stay with cuDNN. */
#define PS_CUDA_WGRAD_MAX ((int64_t)256 << 20)

static int wgrad_gemm_fits(const cuda_impl *im, const ps_conv_desc *d) {
    if (!im->wgrad_gemm || d->groups != 1) return 0;
    const int64_t K = (int64_t)d->cin * d->kh * d->kw, L = (int64_t)ps_conv_out_h(d) * ps_conv_out_w(d);
    const int64_t fl = (int64_t)sizeof(float);
    return K > 0 && L > 0 && K < INT_MAX && L < INT_MAX && (int64_t)d->n * K * L <= PS_CUDA_WGRAD_MAX / fl &&
           (int64_t)d->n * K * d->cout <= PS_CUDA_WGRAD_MAX / fl;
}

/* Queue the weight gradients of k parts of the d->n images on c's stream:
 * dw[p] the sum of images off[p] .. off[p] + cnt[p] - 1 (k = 1, off 0,
 * cnt n: an ordinary backward's); *col and *parts (freed by the caller
 * once the stream's work is done) hold its temporaries. Each image's part
 * comes from the same GEMM whatever k is, and each dw[p] is summed in
 * image order as a call of that part alone would sum it. */
static ps_status wgrad_gemm(cuda_impl *im, cuda_ctx *c, const ps_conv_desc *d, const float *x, const float *dy,
                            int k, const int *off, const int *cnt, float *const *dw, float **col, float **parts,
                            ps_err *err) {
    ps_status rc = PS_OK;
    const int oh = ps_conv_out_h(d), ow = ps_conv_out_w(d);
    const int64_t K = (int64_t)d->cin * d->kh * d->kw, L = (int64_t)oh * ow;
    const float one = 1.0f, zero = 0.0f;
    *col = cu_alloc(im, (size_t)(d->n * K * L) * sizeof(float));
    *parts = cu_alloc(im, (size_t)(d->n * K * d->cout) * sizeof(float));
    if (!*col || !*parts)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cuda:%d: out of device memory for a weight gradient's "
                          "columns", im->device);
    const ps_cuda_cols g = {.n = d->n, .c = d->cin, .h = d->h, .w = d->w, .kh = d->kh, .kw = d->kw,
                            .sh = d->stride_h, .sw = d->stride_w, .ph = d->pad_h, .pw = d->pad_w,
                            .dh = d->dil_h, .dw = d->dil_w, .oh = oh, .ow = ow};
    PS_CUDA_CHECK(ps_cuda_im2col(&g, x, *col, c->stream));
    /* column-major: dW_s^T (K, cout) = col_s^T (K, L) . dy_s^T (L, cout) */
    PS_CUBLAS_CHECK(cublasSgemmStridedBatched(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)K, d->cout, (int)L, &one, *col,
                                              (int)L, K * L, dy, (int)L, (int64_t)d->cout * L, &zero, *parts, (int)K,
                                              K * d->cout, d->n));
    for (int p = 0; p < k; p++)
        PS_CUDA_CHECK(ps_cuda_sum_parts(K * d->cout, cnt[p], *parts + (int64_t)off[p] * K * d->cout, dw[p],
                                        c->stream));
done:
    return rc;
}

/* A convolution backward's temporaries on the device: the weight
 * gradient's columns and per-image parts, the bias gradient's plane sums. */
typedef struct conv_tmp {
    float *col, *parts;
    double *planes;
} conv_tmp;

/* Queue the bias gradients of k parts of dy (n, c, s) on c's stream (our
 * kernels: ps_cuda_bias_grad_parts), its plane sums in t->planes. */
static ps_status bias_grad_queue(cuda_impl *im, cuda_ctx *c, int n, int ch, int64_t s, const float *dy, int k,
                                 const int *off, const int *cnt, float *const *db, conv_tmp *t, ps_err *err) {
    ps_status rc = PS_OK;
    if (!(t->planes = cu_alloc(im, (size_t)(n > 0 ? n : 1) * (size_t)ch * sizeof *t->planes)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cuda:%d: out of device memory for a bias gradient",
                          im->device);
    PS_CUDA_CHECK(ps_cuda_bias_grad_parts(ch, s, dy, k, off, cnt, db, t->planes, c->stream));
done:
    return rc;
}

/* The end of a call that queued work using t: on failure outside a run,
 * wait for what was queued; then the context and t go (in a run, t's
 * blocks are kept aside until its end). */
static ps_status conv_tmp_end(cuda_impl *im, cuda_ctx *c, conv_tmp *t, ps_status rc) {
    if (rc != PS_OK && c && !c->in_run) cudaStreamSynchronize(c->stream);
    ctx_release(im, c);
    cu_free(im, t->col);
    cu_free(im, t->parts);
    cu_free(im, t->planes);
    return rc;
}

static ps_status cu_conv2d_backward(void *impl, const ps_conv_desc *desc, const float *x, const float *w,
                                    const float *dy, float *dx, float *dw, float *db, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    conv_entry *ce = NULL;
    conv_tmp t = {0};
    const float one = 1.0f, zero = 0.0f;
    const ps_conv_desc d = ps_conv_resolve(desc);
    const int gemm_dw = dw && wgrad_gemm_fits(im, &d);
    const int all = 0;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    if ((rc = conv_lookup(im, c, &d, &ce, err)) != PS_OK) goto done;
    size_t ws = ce->ws_bwd_data > ce->ws_bwd_filter ? ce->ws_bwd_data : ce->ws_bwd_filter;
    if ((rc = ctx_workspace(c, ws, err)) != PS_OK) goto done;
    if (db && im->bias_ours &&
        (rc = bias_grad_queue(im, c, d.n, d.cout, (int64_t)ps_conv_out_h(&d) * ps_conv_out_w(&d), dy, 1, &all, &d.n,
                              &db, &t, err)) != PS_OK)
        goto done;
    if (db && !im->bias_ours) PS_CUDNN_CHECK(cudnnConvolutionBackwardBias(c->dnn, &one, ce->y, dy, &zero, ce->b, db));
    if (gemm_dw && (rc = wgrad_gemm(im, c, &d, x, dy, 1, &all, &d.n, &dw, &t.col, &t.parts, err)) != PS_OK) goto done;
    if (dw && !gemm_dw)
        PS_CUDNN_CHECK(cudnnConvolutionBackwardFilter(c->dnn, &one, ce->x, x, ce->y, dy, ce->conv, ce->bwd_filter,
                                                      c->ws, ce->ws_bwd_filter, &zero, ce->w, dw));
    if (dx)
        PS_CUDNN_CHECK(cudnnConvolutionBackwardData(c->dnn, &one, ce->w, w, ce->y, dy, ce->conv, ce->bwd_data,
                                                    c->ws, ce->ws_bwd_data, &zero, ce->x, dx));
    PS_CUDA_SYNC(c);
done:
    return conv_tmp_end(im, c, &t, rc);
}

/* backend.h conv2d_wgrad_parts: every image's part of the weight gradient
 * in one GEMM (wgrad_gemm), then each part's sum, and every part's bias
 * gradient in one launch (or by cuDNN part by part, as each part's own call
 * would under PS_CUDA_BIAS=cudnn); shapes the GEMM form does not
 * take, part by part through cu_conv2d_backward. */
static ps_status cu_conv2d_wgrad_parts(void *impl, const ps_conv_desc *desc, const float *x, const float *dy, int k,
                                       const int *off, const int *cnt, float *const *dw, float *const *db,
                                       ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc = PS_OK;
    const ps_conv_desc d = ps_conv_resolve(desc);
    const int64_t x_per = (int64_t)d.cin * d.h * d.w, y_per = (int64_t)d.cout * ps_conv_out_h(&d) * ps_conv_out_w(&d);
    if (!wgrad_gemm_fits(im, &d)) {
        for (int p = 0; p < k && rc == PS_OK; p++) {
            ps_conv_desc dp = d;
            dp.n = cnt[p];
            rc = cu_conv2d_backward(impl, &dp, x + off[p] * x_per, NULL, dy + off[p] * y_per, NULL, dw[p],
                                    db ? db[p] : NULL, err);
        }
        return rc;
    }
    cuda_ctx *c = NULL;
    conv_tmp t = {0};
    const float one = 1.0f, zero = 0.0f;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    if ((rc = wgrad_gemm(im, c, &d, x, dy, k, off, cnt, dw, &t.col, &t.parts, err)) != PS_OK) goto done;
    if (db && im->bias_ours &&
        (rc = bias_grad_queue(im, c, d.n, d.cout, y_per / d.cout, dy, k, off, cnt, db, &t, err)) != PS_OK)
        goto done;
    for (int p = 0; db && !im->bias_ours && p < k; p++) {
        ps_conv_desc dp = d;
        conv_entry *ce = NULL;
        dp.n = cnt[p];
        if ((rc = conv_lookup(im, c, &dp, &ce, err)) != PS_OK) goto done;
        PS_CUDNN_CHECK(cudnnConvolutionBackwardBias(c->dnn, &one, ce->y, dy + off[p] * y_per, &zero, ce->b, db[p]));
    }
    PS_CUDA_SYNC(c);
done:
    return conv_tmp_end(im, c, &t, rc);
}

/* ------------------------------------------------ activation, softmax */

/* A 4-D descriptor for count elements (cuDNN has no 1-D tensors): (1, 1,
 * count / w, w) with w the largest power of two <= 1024 dividing count. */
static cudnnStatus_t set_flat_desc(cudnnTensorDescriptor_t t, int64_t count) {
    int w = 1024;
    while (w > 1 && count % w) w /= 2;
    return cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1, (int)(count / w), w);
}

static ps_status cu_relu(cuda_impl *im, int64_t count, const float *y, const float *dy, const float *x,
                         float *out, ps_err *err) {
    ps_status rc;
    cuda_ctx *c = NULL;
    cudnnTensorDescriptor_t t = NULL;
    const float one = 1.0f, zero = 0.0f;
    if (count <= 0) return PS_OK;
    if (count > INT_MAX)
        return ps_err_set(err, PS_ERR_INTERNAL, "cuda relu: %lld elements is too many", (long long)count);
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&t));
    PS_CUDNN_CHECK(set_flat_desc(t, count));
    if (!dy) {
        PS_CUDNN_CHECK(cudnnActivationForward(c->dnn, im->relu, &one, t, x, &zero, t, out));
    } else {
        /* relu's output stands in for its input: y > 0 exactly where x > 0. */
        PS_CUDNN_CHECK(cudnnActivationBackward(c->dnn, im->relu, &one, t, y, t, dy, t, y, &zero, t, out));
    }
    PS_CUDA_SYNC(c);
done:
    if (t) cudnnDestroyTensorDescriptor(t);
    ctx_release(im, c);
    return rc;
}

static ps_status cu_relu_forward(void *impl, int64_t count, const float *x, float *y, ps_err *err) {
    return cu_relu(impl, count, NULL, NULL, x, y, err);
}

static ps_status cu_relu_backward(void *impl, int64_t count, const float *y, const float *dy, float *dx,
                                  ps_err *err) {
    return cu_relu(impl, count, y, dy, NULL, dx, err);
}

/* Softmax (CUDNN_SOFTMAX_ACCURATE: max-shifted) or log-softmax
 * (CUDNN_SOFTMAX_LOG) over each row: the forward pass when dy is NULL
 * (x_or_y = x), else the backward pass (x_or_y = the forward's output). */
static ps_status cu_softmax(cuda_impl *im, cudnnSoftmaxAlgorithm_t algo, int64_t rows, int cols,
                            const float *x_or_y, const float *dy, float *out, ps_err *err) {
    ps_status rc;
    cuda_ctx *c = NULL;
    cudnnTensorDescriptor_t t = NULL;
    const float one = 1.0f, zero = 0.0f;
    if (rows > 0x7fffffff) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "softmax: %lld rows", (long long)rows);
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&t));
    PS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)rows, cols, 1, 1));
    if (!dy)
        PS_CUDNN_CHECK(cudnnSoftmaxForward(c->dnn, algo, CUDNN_SOFTMAX_MODE_INSTANCE, &one, t, x_or_y, &zero, t,
                                           out));
    else
        PS_CUDNN_CHECK(cudnnSoftmaxBackward(c->dnn, algo, CUDNN_SOFTMAX_MODE_INSTANCE, &one, t, x_or_y, t, dy,
                                            &zero, t, out));
    PS_CUDA_SYNC(c);
done:
    if (t) cudnnDestroyTensorDescriptor(t);
    ctx_release(im, c);
    return rc;
}

static ps_status cu_softmax_forward(void *impl, int64_t rows, int cols, const float *x, float *y, ps_err *err) {
    return cu_softmax(impl, CUDNN_SOFTMAX_ACCURATE, rows, cols, x, NULL, y, err);
}

static ps_status cu_softmax_backward(void *impl, int64_t rows, int cols, const float *y, const float *dy,
                                     float *dx, ps_err *err) {
    return cu_softmax(impl, CUDNN_SOFTMAX_ACCURATE, rows, cols, y, dy, dx, err);
}

static ps_status cu_log_softmax_forward(void *impl, int rows, int cols, const float *x, float *y, ps_err *err) {
    return cu_softmax(impl, CUDNN_SOFTMAX_LOG, rows, cols, x, NULL, y, err);
}

static ps_status cu_log_softmax_backward(void *impl, int rows, int cols, const float *y, const float *dy,
                                         float *dx, ps_err *err) {
    return cu_softmax(impl, CUDNN_SOFTMAX_LOG, rows, cols, y, dy, dx, err);
}

static ps_status cu_embedding_forward(void *impl, int64_t n, int dim, const int64_t *ids, const float *w,
                                      float *y, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_embedding_forward(n, dim, ids, w, y, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_status cu_embedding_backward(void *impl, int64_t n, int dim, const int64_t *slot, const float *dy,
                                       int64_t nrows, float *grows, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_embedding_backward(n, dim, slot, dy, nrows, grows, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_status cu_scale(void *impl, int64_t count, float *x, float s, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_scale(count, x, s, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

/* ------------------------------------------------------------- pooling */

/* The kernels' view of d (resolved here). */
static ps_cuda_pool cu_pool_of(const ps_pool_desc *desc) {
    const ps_pool_desc d = ps_pool_resolve(desc);
    ps_cuda_pool p = { d.n * d.c, d.h, d.w, d.kh, d.kw, d.stride_h, d.stride_w, d.pad_h, d.pad_w,
                       ps_pool_out_h(&d), ps_pool_out_w(&d), d.count_include_pad };
    return p;
}

static size_t cu_maxpool_workspace_size(void *impl, const ps_pool_desc *d) {
    (void)impl;
    return (size_t)d->n * d->c * ps_pool_out_h(d) * ps_pool_out_w(d) * sizeof(int32_t);
}

/* All four pooling ops: one kernel on a context's stream. */
typedef enum { POOL_MAX_FWD, POOL_MAX_BWD, POOL_AVG_FWD, POOL_AVG_BWD } pool_op;

static ps_status cu_pool(cuda_impl *im, pool_op op, const ps_pool_desc *d, const float *in, void *workspace,
                         float *out, ps_err *err) {
    ps_status rc;
    cuda_ctx *c = NULL;
    const ps_cuda_pool p = cu_pool_of(d);
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    switch (op) {
    case POOL_MAX_FWD: PS_CUDA_CHECK(ps_cuda_maxpool_forward(&p, in, out, workspace, c->stream)); break;
    case POOL_MAX_BWD: PS_CUDA_CHECK(ps_cuda_maxpool_backward(&p, workspace, in, out, c->stream)); break;
    case POOL_AVG_FWD: PS_CUDA_CHECK(ps_cuda_avgpool_forward(&p, in, out, c->stream)); break;
    case POOL_AVG_BWD: PS_CUDA_CHECK(ps_cuda_avgpool_backward(&p, in, out, c->stream)); break;
    }
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_status cu_maxpool_forward(void *impl, const ps_pool_desc *d, const float *x, float *y,
                                    void *workspace, ps_err *err) {
    return cu_pool(impl, POOL_MAX_FWD, d, x, workspace, y, err);
}

static ps_status cu_maxpool_backward(void *impl, const ps_pool_desc *d, const void *workspace, const float *dy,
                                     float *dx, ps_err *err) {
    return cu_pool(impl, POOL_MAX_BWD, d, dy, (void *)workspace, dx, err);
}

static ps_status cu_avgpool_forward(void *impl, const ps_pool_desc *d, const float *x, float *y, ps_err *err) {
    return cu_pool(impl, POOL_AVG_FWD, d, x, NULL, y, err);
}

static ps_status cu_avgpool_backward(void *impl, const ps_pool_desc *d, const float *dy, float *dx, ps_err *err) {
    return cu_pool(impl, POOL_AVG_BWD, d, dy, NULL, dx, err);
}

/* -------------------------------------------------------------- linear */

/* Row-major y (n, out) = x (n, in) . w (out, in)^T is, in cuBLAS's
 * column-major terms, y^T (out, n) = w (out, in) . x^T (in, n): w's buffer
 * is w^T column-major (ld in), so op(w) = T; x's buffer is x^T (ld in). */
static ps_status cu_linear_forward(void *impl, const ps_linear_desc *d, const float *x, const float *w,
                                   const float *b, float *y, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    const float one = 1.0f, zero = 0.0f;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    if (b) PS_CUDA_CHECK(ps_cuda_fill_rows(y, b, d->n, d->out, c->stream));
    PS_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, d->out, d->n, d->in, &one, w, d->in, x,
                                d->in, b ? &one : &zero, y, d->out));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

/* dx (n, in) = dy (n, out) . w: column-major dx^T (in, n) = w^T (in, out) . dy^T (out, n).
 * dw (out, in) = dy^T . x: column-major dw^T (in, out) = x^T (in, n) . dy (n, out). */
static ps_status cu_linear_backward(void *impl, const ps_linear_desc *d, const float *x, const float *w,
                                    const float *dy, float *dx, float *dw, float *db, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    const float one = 1.0f, zero = 0.0f;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    if (dx)
        PS_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, d->in, d->n, d->out, &one, w, d->in, dy,
                                    d->out, &zero, dx, d->in));
    if (dw)
        PS_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, d->in, d->out, d->n, &one, x, d->in, dy,
                                    d->out, &zero, dw, d->in));
    if (db) PS_CUDA_CHECK(ps_cuda_col_sum(dy, d->n, d->out, db, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

/* ------------------------------------------------------------- matmul */

/* Row-major c (m, n) = op(a) (m, k) . op(b) (k, n) is, column-major,
 * c^T (n, m) = op(b)^T (n, k) . op(a)^T (k, m): b's buffer read
 * column-major is b^T ((n, k), ld n) or, with trans_b, b ((k, n), ld k,
 * op T); a's likewise. One strided-batched GEMM for the whole batch (a
 * broadcast operand at stride 0, an accumulated product with beta 1). */
static ps_status cu_matmul(void *impl, const ps_matmul_desc *d, const float *a, const float *b, float *c,
                           ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *cx = NULL;
    const float one = 1.0f, zero = 0.0f;
    if (d->batch <= 0 || d->m <= 0 || d->n <= 0) return PS_OK;
    if (d->batch > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "matmul: a batch of %lld matrices is more than cuBLAS takes",
                          (long long)d->batch);
    if ((rc = ctx_acquire(im, &cx, err)) != PS_OK) return rc;
    /* a broadcast operand: stride 0 between matrices; accumulate: beta 1 */
    PS_CUBLAS_CHECK(cublasSgemmStridedBatched(cx->blas, d->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                              d->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, d->n, d->m, d->k, &one, b,
                                              d->trans_b ? d->k : d->n, d->bcast_b ? 0 : (long long)d->k * d->n, a,
                                              d->trans_a ? d->m : d->k, d->bcast_a ? 0 : (long long)d->m * d->k,
                                              d->accumulate ? &one : &zero, c, d->n, (long long)d->m * d->n,
                                              (int)d->batch));
    PS_CUDA_SYNC(cx);
done:
    ctx_release(im, cx);
    return rc;
}

/* --------------------------------------------------------- elementwise */

static ps_status cu_mul(void *impl, int64_t count, const float *x, const float *mask, float *y, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if (count <= 0) return PS_OK;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_mul(count, x, mask, y, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_status cu_add(void *impl, int64_t count, float *dst, const float *src, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if (count <= 0) return PS_OK;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_add(count, dst, src, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_status cu_sgd_update(void *impl, int64_t count, float *w_out, const float *w, const float *g,
                               float *buf, const ps_sgd_desc *s, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if (count <= 0) return PS_OK;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_sgd(count, w_out, w, g, buf, s->lr, s->momentum, s->weight_decay, s->first_step, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_cuda_adam_args cu_adam_args(const ps_adam_desc *d) {
    const ps_adam_scalars s = ps_adam_scalars_of(d);
    ps_cuda_adam_args a = {
        .beta1 = s.beta1, .beta2 = s.beta2, .one_minus_beta1 = s.one_minus_beta1,
        .one_minus_beta2 = s.one_minus_beta2, .eps = s.eps, .weight_decay = s.weight_decay,
        .step_size = s.step_size, .bc2_sqrt = s.bc2_sqrt, .step_size_sp = s.step_size_sp,
    };
    return a;
}

static ps_status cu_adam_update(void *impl, int64_t count, float *w_out, const float *w, const float *g,
                                float *m, float *v, const ps_adam_desc *d, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if (count <= 0) return PS_OK;
    const ps_cuda_adam_args a = cu_adam_args(d);
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_adam(count, w_out, w, g, m, v, &a, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_status cu_sgd_update_rows(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                    const float *g_rows, float lr, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if (nrows <= 0 || width <= 0) return PS_OK;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_sgd_rows(nrows, width, rows, w, g_rows, lr, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_status cu_adam_update_rows(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                     const float *g_rows, float *m, float *v, const ps_adam_desc *d,
                                     ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if (nrows <= 0 || width <= 0) return PS_OK;
    const ps_cuda_adam_args a = cu_adam_args(d);
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDA_CHECK(ps_cuda_sparse_adam_rows(nrows, width, rows, w, g_rows, m, v, &a, c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}


/* ------------------------------------- normalisation, activations, copies */

_Static_assert((int)PS_CUDA_ACT_RELU == (int)PS_ACT_RELU && (int)PS_CUDA_ACT_LEAKY_RELU == (int)PS_ACT_LEAKY_RELU &&
               (int)PS_CUDA_ACT_GELU == (int)PS_ACT_GELU && (int)PS_CUDA_ACT_GELU_TANH == (int)PS_ACT_GELU_TANH &&
               (int)PS_CUDA_ACT_SILU == (int)PS_ACT_SILU && (int)PS_CUDA_ACT_TANH == (int)PS_ACT_TANH &&
               (int)PS_CUDA_ACT_SIGMOID == (int)PS_ACT_SIGMOID && (int)PS_CUDA_ACT_HARDTANH == (int)PS_ACT_HARDTANH &&
               (int)PS_CUDA_ACT_HARDSWISH == (int)PS_ACT_HARDSWISH &&
               (int)PS_CUDA_ACT_HARDSIGMOID == (int)PS_ACT_HARDSIGMOID && (int)PS_CUDA_ACT_ELU == (int)PS_ACT_ELU &&
               (int)PS_CUDA_ACT_SELU == (int)PS_ACT_SELU && (int)PS_CUDA_ACT_SOFTPLUS == (int)PS_ACT_SOFTPLUS &&
               (int)PS_CUDA_ACT_MISH == (int)PS_ACT_MISH && (int)PS_CUDA_ACT_LOGSIGMOID == (int)PS_ACT_LOGSIGMOID &&
               (int)PS_CUDA_ACT_EXP == (int)PS_ACT_EXP && (int)PS_CUDA_ACT_LOG == (int)PS_ACT_LOG &&
               (int)PS_CUDA_ACT_ABS == (int)PS_ACT_ABS && (int)PS_CUDA_ACT_SQRT == (int)PS_ACT_SQRT &&
               (int)PS_CUDA_ACT_POW == (int)PS_ACT_POW && (int)PS_CUDA_ACT_LINEAR == (int)PS_ACT_LINEAR &&
               (int)PS_CUDA_ACT_CELU == (int)PS_ACT_CELU && (int)PS_CUDA_ACT_SOFTSIGN == (int)PS_ACT_SOFTSIGN &&
               (int)PS_CUDA_ACT_TANHSHRINK == (int)PS_ACT_TANHSHRINK &&
               (int)PS_CUDA_ACT_HARDSHRINK == (int)PS_ACT_HARDSHRINK &&
               (int)PS_CUDA_ACT_SOFTSHRINK == (int)PS_ACT_SOFTSHRINK &&
               (int)PS_CUDA_ACT_THRESHOLD == (int)PS_ACT_THRESHOLD &&
               (int)PS_CUDA_ACT_LOG1P == (int)PS_ACT_LOG1P && (int)PS_CUDA_ACT_EXPM1 == (int)PS_ACT_EXPM1 &&
               (int)PS_CUDA_ACT_SIN == (int)PS_ACT_SIN && (int)PS_CUDA_ACT_COS == (int)PS_ACT_COS &&
               (int)PS_CUDA_ACT_GT == (int)PS_ACT_GT && (int)PS_CUDA_ACT_LT == (int)PS_ACT_LT &&
               (int)PS_CUDA_ACT_GE == (int)PS_ACT_GE && (int)PS_CUDA_ACT_LE == (int)PS_ACT_LE &&
               (int)PS_CUDA_ACT_ERF == (int)PS_ACT_ERF && (int)PS_CUDA_ACT_SIGN == (int)PS_ACT_SIGN &&
               (int)PS_CUDA_ACT_COUNT == (int)PS_ACT_COUNT,
               "backend_cuda.h's activation kinds are ps_act_kind's");

/* Run one launcher (an expression using c->stream) on a context and wait. */
#define CU_LAUNCH(im, launch) do { \
    ps_status rc; \
    cuda_ctx *c = NULL; \
    if ((rc = ctx_acquire((im), &c, err)) != PS_OK) return rc; \
    PS_CUDA_CHECK(launch); \
    PS_CUDA_SYNC(c); \
done: \
    ctx_release((im), c); \
    return rc; \
} while (0)

static ps_status cu_bn_forward_training(void *impl, const ps_chan_desc *d, const float *x, const float *gamma,
                                        const float *beta, float *y, float *mean, float *invstd,
                                        float *var_unbiased, ps_err *err) {
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_bn_forward_training(x, d->n, d->c, d->s, d->eps, gamma, beta, y, mean, invstd,
                                                            var_unbiased, c->stream));
}

static ps_status cu_bn_forward_inference(void *impl, const ps_chan_desc *d, const float *x, const float *gamma,
                                         const float *beta, const float *running_mean, const float *running_var,
                                         float *y, float *invstd, ps_err *err) {
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_bn_forward_inference(x, d->n, d->c, d->s, d->eps, gamma, beta, running_mean,
                                                             running_var, y, invstd, c->stream));
}

static ps_status cu_bn_backward(void *impl, const ps_chan_desc *d, int batch_stats, const float *x, const float *dy,
                                const float *gamma, const float *beta, const float *mean, const float *invstd,
                                float *dx, float *dgamma, float *dbeta, ps_err *err) {
    (void)beta;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_bn_backward(x, dy, d->n, d->c, d->s, batch_stats, gamma, mean, invstd, dx,
                                                    dgamma, dbeta, c->stream));
}

static ps_status cu_ln_forward(void *impl, const ps_ln_desc *d, const float *x, const float *gamma, const float *beta,
                               float *y, float *mean, float *rstd, ps_err *err) {
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_ln_forward(x, d->rows, d->cols, d->eps, gamma, beta, y, mean, rstd,
                                                   c->stream));
}

static ps_status cu_ln_backward(void *impl, const ps_ln_desc *d, const float *x, const float *dy, const float *gamma,
                                const float *mean, const float *rstd, float *dx, float *dgamma, float *dbeta,
                                ps_err *err) {
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_ln_backward(x, dy, d->rows, d->cols, gamma, mean, rstd, dx, dgamma, dbeta,
                                                    c->stream));
}

static ps_status cu_l2norm_forward(void *impl, const ps_l2norm_desc *d, const float *x, float *y, ps_err *err) {
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_l2norm_forward(d->outer, d->dim, d->inner, d->eps, x, y, c->stream));
}

static ps_status cu_l2norm_backward(void *impl, const ps_l2norm_desc *d, const float *x, const float *dy, float *dx,
                                    ps_err *err) {
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_l2norm_backward(d->outer, d->dim, d->inner, d->eps, x, dy, dx, c->stream));
}

static ps_status cu_gn_forward(void *impl, const ps_gn_desc *d, const float *x, const float *gamma, const float *beta,
                               float *y, float *mean, float *rstd, ps_err *err) {
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_gn_forward(x, d->n, d->c, d->s, d->groups, d->eps, gamma, beta, y, mean, rstd,
                                                   c->stream));
}

static ps_status cu_gn_backward(void *impl, const ps_gn_desc *d, const float *x, const float *dy, const float *gamma,
                                const float *mean, const float *rstd, float *dx, float *dgamma, float *dbeta,
                                ps_err *err) {
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_gn_backward(x, dy, d->n, d->c, d->s, d->groups, gamma, mean, rstd, dx, dgamma,
                                                    dbeta, c->stream));
}

static ps_status cu_act_forward(void *impl, const ps_act_desc *d, int64_t count, const float *x, float *y,
                                ps_err *err) {
    if (d->kind < 0 || d->kind >= PS_ACT_COUNT)
        return ps_err_set(err, PS_ERR_INTERNAL, "cuda: unknown activation %d", d->kind);
    if (count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_act_forward(d->kind, d->alpha, d->beta, count, x, y, c->stream));
}

static ps_status cu_act_backward(void *impl, const ps_act_desc *d, int64_t count, const float *x, const float *y,
                                 const float *dy, float *dx, ps_err *err) {
    if (d->kind < 0 || d->kind >= PS_ACT_COUNT)
        return ps_err_set(err, PS_ERR_INTERNAL, "cuda: unknown activation %d", d->kind);
    if (count <= 0) return PS_OK;
    const int rx = ps_act_backward_reads_x(d->kind);
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_act_backward(d->kind, d->alpha, d->beta, count, rx ? x : NULL,
                                                     rx ? NULL : y, dy, dx, c->stream));
}

/* cuDNN's channel-mode softmax over C of an (outer, dim, inner, 1) NCHW
 * tensor is exactly softmax over dim of (outer, dim, inner). */
static ps_status cu_softmax_dim(cuda_impl *im, const ps_softmax_desc *d, const float *x_or_y, const float *dy,
                                float *out, ps_err *err) {
    ps_status rc;
    cuda_ctx *c = NULL;
    cudnnTensorDescriptor_t t = NULL;
    const float one = 1.0f, zero = 0.0f;
    const cudnnSoftmaxAlgorithm_t algo = d->log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE;
    if (d->outer > INT_MAX || d->inner > INT_MAX)
        return ps_err_set(err, PS_ERR_INTERNAL, "cuda softmax: %lld x %d x %lld is too large", (long long)d->outer,
                          d->dim, (long long)d->inner);
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    PS_CUDNN_CHECK(cudnnCreateTensorDescriptor(&t));
    PS_CUDNN_CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, (int)d->outer, d->dim,
                                              (int)d->inner, 1));
    if (!dy)
        PS_CUDNN_CHECK(cudnnSoftmaxForward(c->dnn, algo, CUDNN_SOFTMAX_MODE_CHANNEL, &one, t, x_or_y, &zero, t, out));
    else
        PS_CUDNN_CHECK(cudnnSoftmaxBackward(c->dnn, algo, CUDNN_SOFTMAX_MODE_CHANNEL, &one, t, x_or_y, t, dy, &zero,
                                            t, out));
    PS_CUDA_SYNC(c);
done:
    if (t) cudnnDestroyTensorDescriptor(t);
    ctx_release(im, c);
    return rc;
}

static ps_status cu_softmax_dim_forward(void *impl, const ps_softmax_desc *d, const float *x, float *y, ps_err *err) {
    return cu_softmax_dim(impl, d, x, NULL, y, err);
}

static ps_status cu_softmax_dim_backward(void *impl, const ps_softmax_desc *d, const float *y, const float *dy,
                                         float *dx, ps_err *err) {
    return cu_softmax_dim(impl, d, y, dy, dx, err);
}

static ps_status cu_mul_channels(void *impl, const ps_chan_desc *d, const float *x, const float *mask, float *y,
                                 ps_err *err) {
    if ((int64_t)d->n * d->c * d->s <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_mul_planes((int64_t)d->n * d->c, d->s, x, mask, y, c->stream));
}

/* Adaptive average pooling's uneven bins (ps_adaptive_desc). */
static ps_status cu_adaptive_avgpool_forward(void *impl, const ps_adaptive_desc *d, const float *x, float *y,
                                             ps_err *err) {
    const ps_cuda_adaptive p = { d->n * d->c, d->h, d->w, d->oh, d->ow };
    if ((int64_t)p.planes * p.oh * p.ow <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_adaptive_avgpool_forward(&p, x, y, c->stream));
}

static ps_status cu_adaptive_avgpool_backward(void *impl, const ps_adaptive_desc *d, const float *dy, float *dx,
                                              ps_err *err) {
    const ps_cuda_adaptive p = { d->n * d->c, d->h, d->w, d->oh, d->ow };
    if ((int64_t)p.planes * p.h * p.w <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_adaptive_avgpool_backward(&p, dy, dx, c->stream));
}

static ps_status cu_copy2d(void *impl, int64_t rows, int64_t cols, const float *src, int64_t src_ld, float *dst,
                           int64_t dst_ld, int accumulate, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc;
    cuda_ctx *c = NULL;
    if (rows <= 0 || cols <= 0) return PS_OK;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    if (accumulate)
        PS_CUDA_CHECK(ps_cuda_add2d(rows, cols, src, src_ld, dst, dst_ld, c->stream));
    else
        PS_CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)dst_ld * sizeof(float), src, (size_t)src_ld * sizeof(float),
                                        (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice,
                                        c->stream));
    PS_CUDA_SYNC(c);
done:
    ctx_release(im, c);
    return rc;
}

static ps_status cu_add_out(void *impl, int64_t count, const float *a, const float *b, float *y, ps_err *err) {
    if (count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_add_out(count, a, b, y, c->stream));
}

static ps_status cu_fill(void *impl, int64_t count, float *x, float value, ps_err *err) {
    if (count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_fill(count, x, value, c->stream));
}

static ps_status cu_permute(void *impl, const ps_permute_desc *d, const float *x, float *y, ps_err *err) {
    int64_t odim[PS_PERMUTE_MAX_DIMS], ostr[PS_PERMUTE_MAX_DIMS];
    const int64_t per = ps_permute_strides(d, odim, ostr);
    if (d->n * per <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_permute(d->n, d->ndim, odim, ostr, x, y, c->stream));
}

static ps_status cu_tri_fill(void *impl, const ps_tri_desc *d, const float *x, float *y, ps_err *err) {
    const int64_t count = d->batch * d->rows * d->cols;
    if (count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_tri_fill(count, d->rows, d->cols, d->upper, d->diagonal, d->value, x, y,
                                                  c->stream));
}

static ps_status cu_eq_const(void *impl, int64_t count, const int64_t *x, int64_t value, float *y, ps_err *err) {
    if (count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_eq_const(count, x, value, y, c->stream));
}

static ps_status cu_key_pad(void *impl, const ps_keypad_desc *d, const float *mask, float *s, ps_err *err) {
    const int64_t per = d->heads * d->rows, count = d->batch * per * d->cols;
    if (count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_key_pad(count, per, d->cols, d->additive, mask, s, c->stream));
}

/* ---- upsampling (ps_resize_desc; plain layout), ConvTranspose2d's bias ---- */
static ps_status cu_resize_forward(void *impl, const ps_resize_desc *d, const float *x, float *y, ps_err *err) {
    const ps_cuda_resize p = { d->n * d->c, d->h, d->w, d->oh, d->ow, d->bilinear, d->align_corners, d->scale_h,
                               d->scale_w };
    if ((int64_t)p.planes * p.oh * p.ow <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_resize_forward(&p, x, y, c->stream));
}

static ps_status cu_resize_backward(void *impl, const ps_resize_desc *d, const float *dy, float *dx, ps_err *err) {
    const ps_cuda_resize p = { d->n * d->c, d->h, d->w, d->oh, d->ow, d->bilinear, d->align_corners, d->scale_h,
                               d->scale_w };
    if ((int64_t)p.planes * p.h * p.w <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_resize_backward(&p, dy, dx, c->stream));
}

static ps_status cu_bias_add(void *impl, const ps_chan_desc *d, const float *b, float *y, ps_err *err) {
    if ((int64_t)d->n * d->c * d->s <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_bias_add(d->n, d->c, d->s, b, y, c->stream));
}

static ps_status cu_bias_grad(void *impl, const ps_chan_desc *d, const float *dy, float *db, ps_err *err) {
    cuda_impl *im = impl;
    ps_status rc = PS_OK;
    cuda_ctx *c = NULL;
    conv_tmp t = {0};
    const int all = 0;
    if (d->c <= 0) return PS_OK;
    if ((rc = ctx_acquire(im, &c, err)) != PS_OK) return rc;
    if ((rc = bias_grad_queue(im, c, d->n, d->c, d->s, dy, 1, &all, &d->n, &db, &t, err)) != PS_OK) goto done;
    PS_CUDA_SYNC(c);
done:
    return conv_tmp_end(im, c, &t, rc);
}

/* Recurrent layers (LSTM, GRU): a time step's gates (the GEMMs are linear_forward / linear_backward's cuBLAS). */
static ps_status cu_rnn_cell_forward(void *impl, const ps_rnn_cell_desc *d, const float *gx, const float *gh,
                                     const float *h_prev, const float *c_prev, float *h, float *c_, float *act,
                                     ps_err *err) {
    if (d->n * d->H <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_rnn_cell_forward(d->n, d->H, d->gru, gx, gh, h_prev, c_prev, h, c_, act,
                                                          c->stream));
}

static ps_status cu_prelu_forward(void *impl, const ps_chan_desc *d, const float *x, const float *w, float *y,
                                  ps_err *err) {
    if (d->c > 1 && d->layout != PS_LAYOUT_PLAIN)
        return ps_err_set(err, PS_ERR_INTERNAL, "cuda: prelu of %d slopes in layout %d", d->c, d->layout);
    if ((int64_t)d->n * d->c * d->s <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_prelu_forward(d->n, d->c, d->s, x, w, y, c->stream));
}

static ps_status cu_prelu_backward(void *impl, const ps_chan_desc *d, const float *x, const float *w, const float *dy,
                                   float *dx, float *dw, ps_err *err) {
    if (d->c > 1 && d->layout != PS_LAYOUT_PLAIN)
        return ps_err_set(err, PS_ERR_INTERNAL, "cuda: prelu of %d slopes in layout %d", d->c, d->layout);
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_prelu_backward(d->n, d->c, d->s, x, w, dy, dx, dw, c->stream));
}

static ps_status cu_rnn_cell_backward(void *impl, const ps_rnn_cell_desc *d, const float *act, const float *h_prev,
                                      const float *c_prev, const float *c_, const float *dh, float *dc, float *dgx,
                                      float *dgh, float *dh_prev, ps_err *err) {
    if (d->n * d->H <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_rnn_cell_backward(d->n, d->H, d->gru, act, h_prev, c_prev, c_, dh, dc, dgx,
                                                           dgh, dh_prev, c->stream));
}

/* numpy broadcasting: ps_bcast_geometry's strides handed to the kernels */
_Static_assert(sizeof ((ps_cuda_bcast *)0)->dims / sizeof(int64_t) == PS_BCAST_MAX_DIMS,
               "ps_cuda_bcast holds PS_BCAST_MAX_DIMS dims");

static ps_cuda_bcast cu_bcast_of(const ps_bcast_desc *d) {
    const ps_bcast_geom g = ps_bcast_geometry(d);
    ps_cuda_bcast c = {.op = d->op, .nd = g.nd, .count = g.count};
    for (int k = 0; k < g.nd; k++) {
        c.dims[k] = g.dims[k];
        c.sy[k] = g.sy[k];
        c.sa[k] = g.sa[k];
        c.sb[k] = g.sb[k];
    }
    return c;
}

static ps_status cu_binary_bcast(void *impl, const ps_bcast_desc *d, const float *a, const float *b, float *y,
                                 ps_err *err) {
    const ps_cuda_bcast g = cu_bcast_of(d);
    if (g.count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_binary_bcast(&g, a, b, y, c->stream));
}

static ps_status cu_binary_bcast_backward(void *impl, const ps_bcast_desc *d, int which, const float *a,
                                          const float *b, const float *dy, float *dx, ps_err *err) {
    const ps_cuda_bcast g = cu_bcast_of(d);
    if (g.count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_binary_bcast_backward(&g, which, a, b, dy, dx, c->stream));
}

_Static_assert(PS_BINARY_MAX == 4 && PS_BINARY_MIN == 5, "the kernels' max and min are ops 4 and 5");

static ps_status cu_where(void *impl, int64_t count, const float *cond, const float *a, float av, const float *b,
                          float bv, float *y, ps_err *err) {
    if (count <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_where(count, cond, a, av, b, bv, y, c->stream));
}

static ps_status cu_where_backward(void *impl, int64_t count, const float *cond, const float *dy, float *da,
                                   float *db, ps_err *err) {
    if (count <= 0 || (!da && !db)) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_where_backward(count, cond, dy, da, db, c->stream));
}

static ps_status cu_cumsum(void *impl, const ps_cumsum_desc *d, const float *x, float *y, ps_err *err) {
    if (d->outer * d->len * d->inner <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_cumsum(d->outer, d->len, d->inner, d->reverse, d->exclusive, x, y,
                                                c->stream));
}

static ps_cuda_cols cu_im2col_of(const ps_im2col_desc *d) {
    return (ps_cuda_cols){.n = d->n, .c = d->c, .h = d->h, .w = d->w, .kh = d->kh, .kw = d->kw, .sh = d->sh,
                            .sw = d->sw, .ph = d->ph, .pw = d->pw, .dh = d->dh, .dw = d->dw, .oh = d->oh,
                            .ow = d->ow};
}

static ps_status cu_im2col(void *impl, const ps_im2col_desc *d, const float *x, float *col, ps_err *err) {
    const ps_cuda_cols g = cu_im2col_of(d);
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_im2col(&g, x, col, c->stream));
}

static ps_status cu_col2im(void *impl, const ps_im2col_desc *d, const float *col, float *x, ps_err *err) {
    const ps_cuda_cols g = cu_im2col_of(d);
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_col2im(&g, col, x, c->stream));
}

/* ---- spatial transformers (ps_affgrid_desc, ps_gridsample_desc; plain layout) ---- */
static ps_status cu_affine_grid(void *impl, const ps_affgrid_desc *d, const float *theta, float *grid, ps_err *err) {
    if ((int64_t)d->n * d->h * d->w <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_affine_grid(d->n, d->h, d->w, d->align_corners, theta, grid, c->stream));
}

static ps_status cu_affine_grid_backward(void *impl, const ps_affgrid_desc *d, const float *dgrid, float *dtheta,
                                         ps_err *err) {
    if (d->n <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_affine_grid_backward(d->n, d->h, d->w, d->align_corners, dgrid, dtheta,
                                                              c->stream));
}

static ps_status cu_grid_sample(void *impl, const ps_gridsample_desc *d, const float *x, const float *grid, float *y,
                                ps_err *err) {
    const ps_cuda_gridsample p = {d->n, d->c, d->h, d->w, d->oh, d->ow, d->mode, d->padding, d->align_corners};
    if ((int64_t)p.n * p.c * p.oh * p.ow <= 0) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_grid_sample(&p, x, grid, y, c->stream));
}

static ps_status cu_grid_sample_backward(void *impl, const ps_gridsample_desc *d, const float *x, const float *grid,
                                         const float *dy, float *dx, float *dgrid, ps_err *err) {
    const ps_cuda_gridsample p = {d->n, d->c, d->h, d->w, d->oh, d->ow, d->mode, d->padding, d->align_corners};
    if (p.n <= 0 || (!dx && !dgrid)) return PS_OK;
    CU_LAUNCH((cuda_impl *)impl, ps_cuda_grid_sample_backward(&p, x, grid, dy, dx, dgrid, c->stream));
}

const ps_backend_ops ps_backend_cuda_ops = {
    .name = "cuda",
    .device_kind = "cuda",
    .init = cu_init,
    .destroy = cu_destroy,
    .alloc = cu_alloc,
    .free = cu_free,
    .copy_to_device = cu_copy_to_device,
    .copy_to_host = cu_copy_to_host,
    .copy_from_peer = cu_copy_from_peer,
    .sum_squares = cu_sum_squares,
    .async_begin = cu_async_begin,
    .async_end = cu_async_end,
    .memory_stats = cu_memory_stats,
    .conv2d_forward = cu_conv2d_forward,
    .conv2d_backward = cu_conv2d_backward,
    .conv2d_wgrad_parts = cu_conv2d_wgrad_parts,
    .relu_forward = cu_relu_forward,
    .relu_backward = cu_relu_backward,
    .maxpool_workspace_size = cu_maxpool_workspace_size,
    .maxpool_forward = cu_maxpool_forward,
    .maxpool_backward = cu_maxpool_backward,
    .linear_forward = cu_linear_forward,
    .linear_backward = cu_linear_backward,
    .log_softmax_forward = cu_log_softmax_forward,
    .log_softmax_backward = cu_log_softmax_backward,
    .mul = cu_mul,
    .sgd_update = cu_sgd_update,
    .add = cu_add,
    .adam_update = cu_adam_update,
    .sgd_update_rows = cu_sgd_update_rows,
    .adam_update_rows = cu_adam_update_rows,
    .softmax_forward = cu_softmax_forward,
    .softmax_backward = cu_softmax_backward,
    .embedding_forward = cu_embedding_forward,
    .embedding_backward = cu_embedding_backward,
    .scale = cu_scale,
    .avgpool_forward = cu_avgpool_forward,
    .avgpool_backward = cu_avgpool_backward,
    .batchnorm_forward_training = cu_bn_forward_training,
    .batchnorm_forward_inference = cu_bn_forward_inference,
    .batchnorm_backward = cu_bn_backward,
    .layernorm_forward = cu_ln_forward,
    .layernorm_backward = cu_ln_backward,
    .act_forward = cu_act_forward,
    .act_backward = cu_act_backward,
    .softmax_dim_forward = cu_softmax_dim_forward,
    .softmax_dim_backward = cu_softmax_dim_backward,
    .mul_channels = cu_mul_channels,
    .copy2d = cu_copy2d,
    .add_out = cu_add_out,
    .fill = cu_fill,
    .adaptive_avgpool_forward = cu_adaptive_avgpool_forward,
    .adaptive_avgpool_backward = cu_adaptive_avgpool_backward,
    .permute = cu_permute,
    .matmul = cu_matmul,
    .tri_fill = cu_tri_fill,
    .eq_const = cu_eq_const,
    .key_pad = cu_key_pad,
    /* upsampling */
    .resize_forward = cu_resize_forward,
    .resize_backward = cu_resize_backward,
    .bias_add = cu_bias_add,
    .bias_grad = cu_bias_grad,
    .groupnorm_forward = cu_gn_forward,
    .groupnorm_backward = cu_gn_backward,
    .l2norm_forward = cu_l2norm_forward,
    .l2norm_backward = cu_l2norm_backward,
    .rnn_cell_forward = cu_rnn_cell_forward,
    .rnn_cell_backward = cu_rnn_cell_backward,
    .prelu_forward = cu_prelu_forward,
    .prelu_backward = cu_prelu_backward,
    .binary_bcast = cu_binary_bcast,
    .binary_bcast_backward = cu_binary_bcast_backward,
    .where = cu_where,
    .where_backward = cu_where_backward,
    .cumsum = cu_cumsum,
    .im2col = cu_im2col,
    .col2im = cu_col2im,
    /* spatial transformers */
    .affine_grid = cu_affine_grid,
    .affine_grid_backward = cu_affine_grid_backward,
    .grid_sample = cu_grid_sample,
    .grid_sample_backward = cu_grid_sample_backward,
};
