/* backend.h - the compute backend function table.
 *
 * Every layer the models use is one entry of ps_backend_ops. Exactly one
 * place (backend.c) knows which backends exist: "ref" (plain C, slow,
 * obviously correct; the tests' ground truth) and "dnnl" (oneDNN 2.6 CPU
 * primitives, created once per shape and cached), plus "cuda" (cuDNN,
 * cuBLAS and a few kernels; backend_cuda.c) when the build found nvcc.
 *
 * Contract for every op:
 *  - Tensors are dense float32 in plain row-major layouts: activations NCHW,
 *    conv weights (cout, cin, kh, kw), linear weights (out, in) as in
 *    PyTorch. Pointers are device pointers of the backend (for the CPU
 *    backends, ordinary host memory from ps_backend_alloc).
 *  - Gradients are written, never accumulated: dw/db/dx are overwritten.
 *  - An optional output given as NULL is not computed (dx of the first layer).
 *  - Ops are safe to call concurrently from several threads on the same
 *    backend with distinct output buffers (psd serves many trainers at once).
 *  - Ops return PS_OK or PS_ERR_INTERNAL (a library failure, with a message
 *    in err naming the failed call); shapes are validated by the caller.
 *
 * Activation layouts (optional, for speed). A backend may offer a
 * channel-blocked layout for 4-D activations (blocked_layout != NULL and it
 * returns a block size B > 0 for the channel count; then B divides c):
 * element (n, c, h, w) of an (N, C, H, W) tensor lives at
 *     ((n * (C/B) + c/B) * H * W + h * W + w) * B + c % B
 * (oneDNN's nChw16c / nChw8c), the same N*C*H*W floats as plain NCHW, so
 * elementwise ops (relu, mul, add) work on either. Conv and max-pool take
 * the layout of their activations in the descriptor (PS_LAYOUT_PLAIN, the
 * zero value, unless the model executor asked blocked_layout first);
 * weights, biases and gradients of parameters are always plain. reorder
 * converts between the two. Backends without blocked_layout are only ever
 * called with plain layouts.
 */
#ifndef PS_NN_BACKEND_H
#define PS_NN_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* 2-D convolution, square stride/padding, no dilation, no groups.
 * y is (n, cout, oh, ow) with oh = (h + 2*pad - kh)/stride + 1. */
#define PS_LAYOUT_PLAIN   0  /* NCHW */
#define PS_LAYOUT_BLOCKED 1  /* the backend's channel-blocked layout (see above) */

typedef struct ps_conv_desc {
    int n, cin, h, w;
    int cout, kh, kw;
    int stride, pad;
    int src_layout, dst_layout; /* of x/dx and y/dy; PS_LAYOUT_PLAIN when 0 */
} ps_conv_desc;

static inline int ps_conv_out_h(const ps_conv_desc *d) { return (d->h + 2 * d->pad - d->kh) / d->stride + 1; }
static inline int ps_conv_out_w(const ps_conv_desc *d) { return (d->w + 2 * d->pad - d->kw) / d->stride + 1; }

/* Max pooling, k x k window, stride, no padding; y is (n, c, oh, ow) with
 * oh = (h - k)/stride + 1 (PyTorch's floor mode). */
typedef struct ps_pool_desc {
    int n, c, h, w;
    int k, stride;
    int layout;                 /* of x, y, dx, dy; PS_LAYOUT_PLAIN when 0 */
} ps_pool_desc;

static inline int ps_pool_out_h(const ps_pool_desc *d) { return (d->h - d->k) / d->stride + 1; }
static inline int ps_pool_out_w(const ps_pool_desc *d) { return (d->w - d->k) / d->stride + 1; }

/* Fully connected: y (n, out) = x (n, in) . w (out, in)^T + b (out). */
typedef struct ps_linear_desc {
    int n, in, out;
} ps_linear_desc;

/* SGD hyper-parameters with PyTorch's torch.optim.SGD semantics
 * (dampening 0, no Nesterov):
 *   g' = g + weight_decay * w
 *   buf = momentum ? (first step ? g' : momentum*buf + g') : -
 *   w  -= lr * (momentum ? buf : g')
 * The caller zero-fills buf and passes first_step=1 on the first update. */
typedef struct ps_sgd_desc {
    float lr, momentum, weight_decay;
    int first_step;
} ps_sgd_desc;

/* Adam hyper-parameters and the step number, with PyTorch 1.13's
 * torch.optim.Adam semantics (_single_tensor_adam; amsgrad and maximize off,
 * weight decay added to the gradient - Adam, not AdamW). step is the
 * parameter's update count INCLUDING this update (1 on the first), as
 * PyTorch's state['step'] after its increment. Per element, in float:
 *   g' = weight_decay ? g + weight_decay * w : g
 *   m  = beta1 * m + (1 - beta1) * g'
 *   v  = beta2 * v + (1 - beta2) * g' * g'
 *   w += -step_size * (m / (sqrt(v) / bc2_sqrt + eps))
 * with, in double as Python computes them, then rounded to float:
 *   step_size = lr / (1 - beta1^step), bc2_sqrt = sqrt(1 - beta2^step).
 * The caller zero-fills m and v before step 1.
 *
 * The row-sparse variant (adam_update_rows) is torch.optim.SparseAdam: only
 * the given rows change (weight_decay must be 0; SparseAdam has none):
 *   m += (1 - beta1) * (g - m_old)            (per touched element)
 *   v += (1 - beta2) * (g * g - v_old)
 *   w += -step_size_sp * (m / (sqrt(v) + eps))
 * with step_size_sp = lr * sqrt(1 - beta2^step) / (1 - beta1^step) (double,
 * then float) - note eps is not scaled as in dense Adam. */
typedef struct ps_adam_desc {
    double lr, beta1, beta2, eps, weight_decay; /* double, as the Python floats */
    int64_t step;
} ps_adam_desc;

/* The float scalars every backend uses for an Adam update (see above). */
typedef struct ps_adam_scalars {
    float one_minus_beta1, one_minus_beta2;
    float beta1, beta2, eps, weight_decay; /* the desc's, rounded to float */
    float step_size;      /* dense: lr / bc1 */
    float bc2_sqrt;       /* dense: sqrt(bc2) */
    float step_size_sp;   /* sparse: lr * sqrt(bc2) / bc1 */
} ps_adam_scalars;

/* Computes them in double as Python does (bc = 1 - beta ** step), then
 * rounds each to float, as PyTorch does when a Python scalar meets a float32
 * tensor. d->step >= 1. */
ps_adam_scalars ps_adam_scalars_of(const ps_adam_desc *d);

typedef struct ps_backend_ops {
    const char *name;
    /* NULL for backends computing in host memory (CPU); otherwise the device
     * family, e.g. "cuda": pointers are device memory that only the op
     * table's copy functions may touch, and the backend is labelled
     * "<name>/<device_kind>:<index>". */
    const char *device_kind;

    /* Create the backend's private state. device is the device index
     * (ignored by CPU backends); nthreads the compute threads (0 = default). */
    ps_status (*init)(void **impl, int device, int nthreads, ps_err *err);
    void (*destroy)(void *impl);

    /* Memory on the backend's device. alloc returns 64-byte aligned memory
     * or NULL. copy_* move bytes between host and this device. */
    void *(*alloc)(void *impl, size_t bytes);
    void (*free)(void *impl, void *p);
    ps_status (*copy_to_device)(void *impl, void *dst, const void *host_src, size_t bytes, ps_err *err);
    ps_status (*copy_to_host)(void *impl, void *host_dst, const void *src, size_t bytes, ps_err *err);
    /* Optional (NULL for CPU backends): copy bytes from src, memory of
     * another instance of the same backend (src_impl, possibly on another
     * device), to dst on this backend's device - a stage boundary between
     * two devices, without a trip through pageable host memory. */
    ps_status (*copy_from_peer)(void *impl, void *dst, void *src_impl, const void *src, size_t bytes,
                                ps_err *err);

    /* x (n,cin,h,w), w (cout,cin,kh,kw), b (cout) -> y (n,cout,oh,ow). */
    ps_status (*conv2d_forward)(void *impl, const ps_conv_desc *d, const float *x,
                                const float *w, const float *b, float *y, ps_err *err);
    /* From dy (n,cout,oh,ow): dx (may be NULL), dw, db. */
    ps_status (*conv2d_backward)(void *impl, const ps_conv_desc *d, const float *x,
                                 const float *w, const float *dy, float *dx, float *dw,
                                 float *db, ps_err *err);

    /* y = max(x, 0) elementwise over count elements (x == y allowed). */
    ps_status (*relu_forward)(void *impl, int64_t count, const float *x, float *y, ps_err *err);
    /* dx = dy where y > 0 else 0; y is relu's output (dx == dy allowed). */
    ps_status (*relu_backward)(void *impl, int64_t count, const float *y, const float *dy,
                               float *dx, ps_err *err);

    /* Bytes of workspace maxpool_forward needs to remember argmax positions
     * for maxpool_backward (opaque, backend-specific). */
    size_t (*maxpool_workspace_size)(void *impl, const ps_pool_desc *d);
    ps_status (*maxpool_forward)(void *impl, const ps_pool_desc *d, const float *x, float *y,
                                 void *workspace, ps_err *err);
    /* dx (n,c,h,w) from dy (n,c,oh,ow) and the forward's workspace. Ties go
     * to the first maximum in row-major window order, as in PyTorch. */
    ps_status (*maxpool_backward)(void *impl, const ps_pool_desc *d, const void *workspace,
                                  const float *dy, float *dx, ps_err *err);

    /* x (n,in), w (out,in), b (out) -> y (n,out). */
    ps_status (*linear_forward)(void *impl, const ps_linear_desc *d, const float *x,
                                const float *w, const float *b, float *y, ps_err *err);

    /* ---- appended for issue 9 (models beyond MNIST). Optional: a layer
     * kind whose op a backend lacks is refused at model creation, naming
     * the stage, the kind and the backend. ---- */

    /* Row-wise softmax of x (rows, cols). */
    ps_status (*softmax_forward)(void *impl, int64_t rows, int cols, const float *x, float *y,
                                 ps_err *err);
    /* dx = y * (dy - sum_row(dy * y)), y the forward's output. */
    ps_status (*softmax_backward)(void *impl, int64_t rows, int cols, const float *y,
                                  const float *dy, float *dx, ps_err *err);
    /* y (n, dim) = w[ids[i]] row by row; ids (n) int64 on the device, each
     * already checked to lie in 0..rows of w. */
    ps_status (*embedding_forward)(void *impl, int64_t n, int dim, const int64_t *ids,
                                   const float *w, float *y, ps_err *err);
    /* Row-sparse weight gradient: grows (nrows, dim) = 0, then
     * grows[slot[i]] += dy[i] for i < n (slot: device int64, each in
     * 0..nrows-1; the caller maps ids to slots of the unique rows). */
    ps_status (*embedding_backward)(void *impl, int64_t n, int dim, const int64_t *slot,
                                    const float *dy, int64_t nrows, float *grows, ps_err *err);
    /* x *= s elementwise (averaging accumulated gradients). */
    ps_status (*scale)(void *impl, int64_t count, float *x, float s, ps_err *err);
    /* dx (n,in; may be NULL), dw (out,in), db (out) from dy (n,out). */
    ps_status (*linear_backward)(void *impl, const ps_linear_desc *d, const float *x,
                                 const float *w, const float *dy, float *dx, float *dw,
                                 float *db, ps_err *err);

    /* Row-wise log-softmax of x (rows, cols). */
    ps_status (*log_softmax_forward)(void *impl, int rows, int cols, const float *x, float *y,
                                     ps_err *err);
    /* dx = dy - exp(y) * sum_row(dy), y the forward's output. */
    ps_status (*log_softmax_backward)(void *impl, int rows, int cols, const float *y,
                                      const float *dy, float *dx, ps_err *err);

    /* y = x * mask elementwise; mask holds 0 or 1/(1-p) (inverted dropout).
     * Used for dropout's forward and backward (x == y allowed). */
    ps_status (*mul)(void *impl, int64_t count, const float *x, const float *mask, float *y,
                     ps_err *err);

    /* One SGD update of count parameters in place (see ps_sgd_desc). buf may
     * be NULL when momentum is 0. */
    ps_status (*sgd_update)(void *impl, int64_t count, float *w, const float *g, float *buf,
                            const ps_sgd_desc *s, ps_err *err);

    /* dst += src elementwise (accumulating gradients of batched requests). */
    ps_status (*add)(void *impl, int64_t count, float *dst, const float *src, ps_err *err);

    /* Optional (NULL: plain layouts only). Block size B of the blocked
     * layout the backend offers for 4-D activations with c channels, or 0
     * when it offers none for c (then only plain is used). */
    int (*blocked_layout)(void *impl, int c);
    /* Copy an (n, c, h, w) activation from src_layout to dst_layout
     * (src != dst). Required when blocked_layout is set. */
    ps_status (*reorder)(void *impl, int n, int c, int h, int w, const float *src, int src_layout,
                         float *dst, int dst_layout, ps_err *err);

    /* Optional (NULL: init's nthreads only). Compute threads for the ops
     * the calling thread runs from now on (n >= 1), overriding init's
     * nthreads for that thread: the model executor sizes each call by how
     * many calls compute at once (see model.h). */
    void (*set_threads)(void *impl, int n);

    /* ---- optimizers (see common/nn/optim.h for the module that calls them) ---- */

    /* One Adam update of count parameters in place (see ps_adam_desc); m and
     * v are the exp_avg and exp_avg_sq buffers (count floats each). */
    ps_status (*adam_update)(void *impl, int64_t count, float *w, const float *g, float *m, float *v,
                             const ps_adam_desc *d, ps_err *err);
    /* Row-sparse updates of a (total_rows, width) parameter w: rows holds
     * nrows distinct row indices in [0, total_rows) (int64, device memory;
     * the caller validates them) and g_rows the (nrows, width) gradient rows
     * in that order. Rows not listed are not touched, nor is their state.
     * sgd_update_rows: w[r] -= lr * g (plain SGD; identical to the dense
     * update with zero gradient elsewhere). adam_update_rows:
     * torch.optim.SparseAdam (see ps_adam_desc; d->weight_decay is ignored,
     * the caller refuses it). */
    ps_status (*sgd_update_rows)(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                 const float *g_rows, float lr, ps_err *err);
    ps_status (*adam_update_rows)(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                  const float *g_rows, float *m, float *v, const ps_adam_desc *d,
                                  ps_err *err);
} ps_backend_ops;

/* A created backend: the op table plus its private state. */
typedef struct ps_backend {
    const ps_backend_ops *ops;
    void *impl;
    int device;      /* device index, 0 for CPU backends */
    char label[32];  /* e.g. "dnnl/cpu", "ref/cpu", "cuda/cuda:1" */
} ps_backend;

/* Names of the backends compiled in, NULL-terminated (e.g. {"ref","dnnl",NULL}). */
const char *const *ps_backend_names(void);
/* The backends that compute in host memory (device_kind NULL): "ref",
 * "dnnl"; NULL-terminated, in registry order (model.backend). */
const char *const *ps_backend_cpu_names(void);

/* Create a backend by name; unknown names give PS_ERR_NOT_FOUND listing the
 * known ones. ps_backend_free(NULL) is a no-op. */
ps_backend *ps_backend_create(const char *name, int device, int nthreads, ps_err *err);
void ps_backend_free(ps_backend *b);

/* One line saying which device support this binary carries, e.g.
 * "CUDA: not built" or "CUDA: built (runtime 13.0, cuDNN 9.19.0)" (for
 * `psd --version`). Does not initialise any device. */
void ps_backend_build_info(char *buf, size_t size);

/* The instruction set the CPU backend's kernels run on in this process:
 * oneDNN's effective ISA, lower case ("avx512_core_bf16", "avx2", "sse41",
 * ...; ONEDNN_MAX_CPU_ISA in the environment can only lower it), "unknown"
 * when oneDNN does not say. Freezes oneDNN's ISA choice. */
const char *ps_backend_cpu_isa(void);

/* How many of b's primitives so far were created with a reference (plain
 * C) kernel where the backend's allow-list forbids one (convolution, inner
 * product, pooling and eltwise may not; see kKindInfo in backend_dnnl.c).
 * Their descriptions, one per line, go into buf (may be NULL). Always 0
 * for backends without such a check (ref, cuda). */
int ps_backend_fallbacks(const ps_backend *b, char *buf, size_t size);

/* Convenience wrappers over ops->alloc/free. */
float *ps_backend_alloc_floats(ps_backend *b, int64_t count);
void ps_backend_release(ps_backend *b, void *p);

#endif
