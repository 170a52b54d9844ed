/* backend_cuda.h - private to backend_cuda.c: the CUDA kernels of the CUDA
 * backend (backend_cuda_kernels.cu), for the ops no cuDNN/cuBLAS call fits.
 *
 * Each launcher enqueues one kernel on `stream` and returns the launch
 * status (cudaGetLastError); the caller synchronises. Shapes follow
 * backend.h (row-major, NCHW). Float arithmetic is written to round exactly
 * as the reference backend does (no fused multiply-add where the reference
 * has separate operations), so SGD, dropout and pooling gradients match it
 * bit for bit.
 */
#ifndef PS_NN_BACKEND_CUDA_H
#define PS_NN_BACKEND_CUDA_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLAS, opened (dlopen) on first use rather than linked (backend_cuda.c
 * says why): 1 once its functions are there; 0 with *why (when not NULL)
 * saying what failed. */
int ps_cuda_blas_load(const char **why);
/* cublasGetStatusString of the opened library; NULL when it cannot be opened. */
const char *ps_cuda_blas_status_string(int status);

/* y[r * cols + c] = b[c] for r < rows (the bias of a linear layer, before
 * the GEMM accumulates onto it). */
cudaError_t ps_cuda_fill_rows(float *y, const float *b, int rows, int cols, cudaStream_t stream);

/* db[c] = sum over r of dy[r * cols + c] (the bias gradient of a linear layer). */
cudaError_t ps_cuda_col_sum(const float *dy, int rows, int cols, float *db, cudaStream_t stream);

/* A 2-D pooling shape (ps_pool_desc resolved; planes = n * c). */
typedef struct ps_cuda_pool {
    int planes, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
    int count_include_pad;  /* average pooling */
} ps_cuda_pool;

/* Max pooling: y and, when idx is not NULL, idx[p, oy, ox] = iy * w + ix of
 * the window's first maximum in row-major order (padding never wins; a NaN
 * does), as the reference backend and PyTorch. */
cudaError_t ps_cuda_maxpool_forward(const ps_cuda_pool *p, const float *x, float *y, int32_t *idx,
                                    cudaStream_t stream);

/* dx from dy through the argmax indices; each dx element gathers the dy of
 * the windows whose maximum it is, in ascending output order (the
 * reference's summation order, so overlapping windows give identical sums). */
cudaError_t ps_cuda_maxpool_backward(const ps_cuda_pool *p, const int32_t *idx, const float *dy, float *dx,
                                     cudaStream_t stream);

/* Average pooling (count_include_pad as ps_pool_desc documents); the
 * backward gathers dy / divisor of every window covering an element. */
cudaError_t ps_cuda_avgpool_forward(const ps_cuda_pool *p, const float *x, float *y, cudaStream_t stream);
cudaError_t ps_cuda_avgpool_backward(const ps_cuda_pool *p, const float *dy, float *dx, cudaStream_t stream);

/* Adaptive average pooling with PyTorch's bins (backend.h ps_adaptive_desc;
 * planes = n * c). The backward gathers, per input element, dy / area of
 * every bin holding it in ascending output order. */
typedef struct ps_cuda_adaptive {
    int planes, h, w, oh, ow;
} ps_cuda_adaptive;

cudaError_t ps_cuda_adaptive_avgpool_forward(const ps_cuda_adaptive *p, const float *x, float *y,
                                             cudaStream_t stream);
cudaError_t ps_cuda_adaptive_avgpool_backward(const ps_cuda_adaptive *p, const float *dy, float *dx,
                                              cudaStream_t stream);

/* Batch normalisation over (n, c, s), plain layout (ps_chan_desc; the
 * formulas of backend.h). One block per channel, sums in double. gamma
 * and beta NULL without affine; var_unbiased may be NULL. */
cudaError_t ps_cuda_bn_forward_training(const float *x, int n, int c, int64_t s, float eps, const float *gamma,
                                        const float *beta, float *y, float *mean, float *invstd,
                                        float *var_unbiased, cudaStream_t stream);
/* Inference: from running_mean/var; invstd (c) written when not NULL. */
cudaError_t ps_cuda_bn_forward_inference(const float *x, int n, int c, int64_t s, float eps, const float *gamma,
                                         const float *beta, const float *running_mean, const float *running_var,
                                         float *y, float *invstd, cudaStream_t stream);
/* dx (may be NULL), dgamma, dbeta (NULL without affine). */
cudaError_t ps_cuda_bn_backward(const float *x, const float *dy, int n, int c, int64_t s, int batch_stats,
                                const float *gamma, const float *mean, const float *invstd, float *dx,
                                float *dgamma, float *dbeta, cudaStream_t stream);

/* Layer normalisation of rows x cols (ps_ln_desc); mean, rstd may be NULL
 * in the forward; dx, dgamma, dbeta may each be NULL in the backward. */
cudaError_t ps_cuda_l2norm_forward(int64_t outer, int dim, int64_t inner, float eps, const float *x, float *y,
                                   cudaStream_t stream);
cudaError_t ps_cuda_l2norm_backward(int64_t outer, int dim, int64_t inner, float eps, const float *x, const float *dy,
                                    float *dx, cudaStream_t stream);
cudaError_t ps_cuda_gn_forward(const float *x, int64_t n, int64_t c, int64_t s, int64_t groups, float eps,
                               const float *gamma, const float *beta, float *y, float *mean, float *rstd,
                               cudaStream_t stream);
cudaError_t ps_cuda_gn_backward(const float *x, const float *dy, int64_t n, int64_t c, int64_t s, int64_t groups,
                                const float *gamma, const float *mean, const float *rstd, float *dx, float *dgamma,
                                float *dbeta, cudaStream_t stream);
cudaError_t ps_cuda_ln_forward(const float *x, int64_t rows, int64_t cols, float eps, const float *gamma,
                               const float *beta, float *y, float *mean, float *rstd, cudaStream_t stream);
cudaError_t ps_cuda_ln_backward(const float *x, const float *dy, int64_t rows, int64_t cols, const float *gamma,
                                const float *mean, const float *rstd, float *dx, float *dgamma, float *dbeta,
                                cudaStream_t stream);

/* Activations: the values of ps_act_kind (backend.h; backend_cuda.c checks
 * they agree). */
enum {
    PS_CUDA_ACT_RELU = 0, PS_CUDA_ACT_LEAKY_RELU, PS_CUDA_ACT_GELU, PS_CUDA_ACT_GELU_TANH, PS_CUDA_ACT_SILU,
    PS_CUDA_ACT_TANH, PS_CUDA_ACT_SIGMOID, PS_CUDA_ACT_HARDTANH, PS_CUDA_ACT_HARDSWISH, PS_CUDA_ACT_HARDSIGMOID,
    PS_CUDA_ACT_ELU, PS_CUDA_ACT_SELU, PS_CUDA_ACT_SOFTPLUS, PS_CUDA_ACT_MISH, PS_CUDA_ACT_LOGSIGMOID,
    PS_CUDA_ACT_EXP, PS_CUDA_ACT_LOG, PS_CUDA_ACT_ABS, PS_CUDA_ACT_SQRT, PS_CUDA_ACT_POW, PS_CUDA_ACT_LINEAR,
    PS_CUDA_ACT_CELU, PS_CUDA_ACT_SOFTSIGN, PS_CUDA_ACT_TANHSHRINK, PS_CUDA_ACT_HARDSHRINK, PS_CUDA_ACT_SOFTSHRINK,
    PS_CUDA_ACT_THRESHOLD,
    PS_CUDA_ACT_LOG1P, PS_CUDA_ACT_EXPM1, PS_CUDA_ACT_SIN, PS_CUDA_ACT_COS, PS_CUDA_ACT_GT, PS_CUDA_ACT_LT,
    PS_CUDA_ACT_GE, PS_CUDA_ACT_LE, PS_CUDA_ACT_ERF, PS_CUDA_ACT_SIGN,
    PS_CUDA_ACT_COUNT
};

/* y = f(x) (x == y allowed); alpha, beta as ps_act_desc's. */
cudaError_t ps_cuda_act_forward(int kind, float alpha, float beta, int64_t count, const float *x, float *y,
                                cudaStream_t stream);
/* dx = dy * f'(.) from x or y (ps_act_backward_reads_x). */
cudaError_t ps_cuda_act_backward(int kind, float alpha, float beta, int64_t count, const float *x, const float *y,
                                 const float *dy, float *dx, cudaStream_t stream);

/* y[q * s + p] = x[q * s + p] * mask[q] for q < planes (Dropout2d). */
cudaError_t ps_cuda_mul_planes(int64_t planes, int64_t s, const float *x, const float *mask, float *y,
                               cudaStream_t stream);

/* dst[r * dst_ld + j] += src[r * src_ld + j] (copy2d's accumulate). */
cudaError_t ps_cuda_add2d(int64_t rows, int64_t cols, const float *src, int64_t src_ld, float *dst,
                          int64_t dst_ld, cudaStream_t stream);

/* y = a + b. */
cudaError_t ps_cuda_add_out(int64_t count, const float *a, const float *b, float *y, cudaStream_t stream);

/* x[i] = value. */
cudaError_t ps_cuda_fill(int64_t count, float *x, float value, cudaStream_t stream);

/* y = x * mask (dropout, forward and backward; x == y allowed). */
cudaError_t ps_cuda_mul(int64_t count, const float *x, const float *mask, float *y,
                        cudaStream_t stream);

/* dst += src. */
cudaError_t ps_cuda_add(int64_t count, float *dst, const float *src, cudaStream_t stream);

/* One SGD step with torch.optim.SGD semantics (see ps_sgd_desc) from w into
 * w_out (w itself, or not overlapping it); buf may be NULL when momentum is 0. */
cudaError_t ps_cuda_sgd(int64_t count, float *w_out, const float *w, const float *g, float *buf, float lr,
                        float momentum, float weight_decay, int first_step, cudaStream_t stream);

/* Adam's float scalars (ps_adam_scalars of backend.h, which this header
 * does not include: nvcc compiles it alone). */
typedef struct ps_cuda_adam_args {
    float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
    float step_size, bc2_sqrt, step_size_sp;
} ps_cuda_adam_args;

/* One Adam step (torch.optim.Adam, see ps_adam_desc in backend.h) from w
 * into w_out, as ps_cuda_sgd. */
cudaError_t ps_cuda_adam(int64_t count, float *w_out, const float *w, const float *g, float *m, float *v,
                         const ps_cuda_adam_args *a, cudaStream_t stream);

/* Plain SGD on nrows listed rows (device int64 indices) of a row-major
 * (?, width) parameter; g_rows is (nrows, width). */
cudaError_t ps_cuda_sgd_rows(int64_t nrows, int64_t width, const int64_t *rows, float *w, const float *g_rows,
                             float lr, cudaStream_t stream);

/* SparseAdam on the listed rows (torch.optim.SparseAdam). */
cudaError_t ps_cuda_sparse_adam_rows(int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                     const float *g_rows, float *m, float *v, const ps_cuda_adam_args *a,
                                     cudaStream_t stream);

/* y (n, dim) = rows ids[i] of w (n, dim). */
cudaError_t ps_cuda_embedding_forward(int64_t n, int dim, const int64_t *ids, const float *w, float *y,
                                      cudaStream_t stream);

/* grows (nrows, dim) = 0, then grows[slot[i]] += dy[i], summed in sample order. */
cudaError_t ps_cuda_embedding_backward(int64_t n, int dim, const int64_t *slot, const float *dy,
                                       int64_t nrows, float *grows, cudaStream_t stream);

/* y = x with each of n samples' ndim (1..4) dims permuted (ps_permute_desc
 * of backend.h, which this header does not include): one thread per output
 * element, its input offset from the strides in odims' order (istr). */
cudaError_t ps_cuda_permute(int64_t n, int ndim, const int64_t *odims, const int64_t *istr, const float *x,
                            float *y, cudaStream_t stream);

/* x *= s. */
cudaError_t ps_cuda_scale(int64_t count, float *x, float s, cudaStream_t stream);

/* y = x but the elements (i, j) of each of the count / (rows * cols)
 * (rows, cols) matrices with j - i >= diagonal (upper) or j - i <=
 * diagonal (!upper), which are value (ps_tri_desc of backend.h); y may be x. */
cudaError_t ps_cuda_tri_fill(int64_t count, int64_t rows, int64_t cols, int upper, int64_t diagonal, float value,
                             const float *x, float *y, cudaStream_t stream);

/* The cumulative sum of ps_cumsum_desc (backend.h) along the middle axis of
 * (outer, len, inner): one thread per (o, k) line, summed in double. */
cudaError_t ps_cuda_cumsum(int64_t outer, int64_t len, int64_t inner, int reverse, int exclusive, const float *x,
                           float *y, cudaStream_t stream);

/* im2col / col2im of backend.h's ps_im2col_desc (F.unfold / F.fold), the
 * same fields. im2col: one thread per column element; col2im: one thread
 * per image pixel gathering the column elements that read it (no atomics,
 * a fixed order). */
typedef struct ps_cuda_cols {
    int64_t n, c, h, w;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t oh, ow;
} ps_cuda_cols;

cudaError_t ps_cuda_im2col(const ps_cuda_cols *g, const float *x, float *col, cudaStream_t stream);
cudaError_t ps_cuda_col2im(const ps_cuda_cols *g, const float *col, float *x, cudaStream_t stream);

/* y[i] = sum over s < parts of p[s count + i], in s order, summed in double. */
cudaError_t ps_cuda_sum_parts(int64_t count, int parts, const float *p, float *y, cudaStream_t stream);

/* y[i] = x[i] == value ? 1 : 0 (int64 token ids to a float mask). */
cudaError_t ps_cuda_eq_const(int64_t count, const int64_t *x, int64_t value, float *y, cudaStream_t stream);

/* Scores s (count = batch * per * cols elements, per = heads * rows), mask
 * (batch, cols): s += mask[b, j] (additive) or s = -inf where mask[b, j]
 * != 0 (ps_keypad_desc of backend.h). */
cudaError_t ps_cuda_key_pad(int64_t count, int64_t per, int64_t cols, int additive, const float *mask, float *s,
                            cudaStream_t stream);
/* Recurrent layers: one time step's gates (ps_rnn_cell_desc's formulas; n rows of H). */
cudaError_t ps_cuda_rnn_cell_forward(int64_t n, int64_t H, int gru, const float *gx, const float *gh,
                                     const float *h_prev, const float *c_prev, float *h, float *c, float *act,
                                     cudaStream_t stream);
cudaError_t ps_cuda_rnn_cell_backward(int64_t n, int64_t H, int gru, const float *act, const float *h_prev,
                                      const float *c_prev, const float *c, const float *dh, float *dc, float *dgx,
                                      float *dgh, float *dh_prev, cudaStream_t stream);

/* PReLU: backend.h's prelu_forward / prelu_backward over a plain (n, c, s)
 * activation, one slope per channel (c 1: one for all); dx or dw may be NULL. */
cudaError_t ps_cuda_prelu_forward(int64_t n, int64_t c, int64_t s, const float *x, const float *w, float *y,
                                  cudaStream_t stream);
cudaError_t ps_cuda_prelu_backward(int64_t n, int64_t c, int64_t s, const float *x, const float *w, const float *dy,
                                   float *dx, float *dw, cudaStream_t stream);

/* ---- upsampling (Upsample, ConvTranspose2d's bias) ---- */
/* Resizing planes of (h, w) to (oh, ow) by backend.h's rules
 * (ps_resize_desc; planes = n * c). The backward zeroes dx and adds each
 * output's weighted gradient to the inputs it read, atomically (the order
 * of those sums is the scheduler's, as in PyTorch's CUDA kernel). */
typedef struct ps_cuda_resize {
    int planes, h, w, oh, ow, bilinear, align_corners;
    float scale_h, scale_w;
} ps_cuda_resize;

cudaError_t ps_cuda_resize_forward(const ps_cuda_resize *p, const float *x, float *y, cudaStream_t stream);
cudaError_t ps_cuda_resize_backward(const ps_cuda_resize *p, const float *dy, float *dx, cudaStream_t stream);
/* y[i, j, q] += b[j], (n, c, s) plain. */
cudaError_t ps_cuda_bias_add(int n, int c, int64_t s, const float *b, float *y, cudaStream_t stream);
/* Bias gradients of dy (n, c, s) plain, part by part: db[p][j] = the sum over images off[p] .. off[p] +
 * cnt[p] - 1 and q of dy[i, j, q], in double - each (image, channel) plane's sum into planes, then the
 * planes' in image order (deterministic; a part's the same as a call of its images alone). planes:
 * (the last image any part reads + 1) * c doubles of device scratch. */
cudaError_t ps_cuda_bias_grad_parts(int c, int64_t s, const float *dy, int k, const int *off, const int *cnt,
                                    float *const *db, double *planes, cudaStream_t stream);

/* Numpy broadcasting of two tensors (backend.h's ps_bcast_desc resolved by
 * ps_bcast_geometry: nd merged dims, each > 1, and the element strides of
 * y, a and b along them, 0 where broadcast). op: ps_binary_op's values
 * (0 add, 1 sub, 2 mul, 3 div, 4 max, 5 min). The backward writes operand `which`'s
 * gradient, one thread per element summing its terms in double. */
typedef struct ps_cuda_bcast {
    int op, nd;
    int64_t dims[5], sy[5], sa[5], sb[5];
    int64_t count;
} ps_cuda_bcast;

cudaError_t ps_cuda_binary_bcast(const ps_cuda_bcast *g, const float *a, const float *b, float *y,
                                 cudaStream_t stream);
cudaError_t ps_cuda_binary_bcast_backward(const ps_cuda_bcast *g, int which, const float *a, const float *b,
                                          const float *dy, float *dx, cudaStream_t stream);

/* out (one double, device memory) = sum of x[i]^2 over n floats, in double:
 * each of nparts blocks sums a grid-stride share into partials[block]
 * (device memory, nparts doubles; nparts <= ps_cuda_sum_squares_parts(n)),
 * then one block sums the partials in order - the same result every time. */
int ps_cuda_sum_squares_parts(int64_t n);
cudaError_t ps_cuda_sum_squares(int64_t n, const float *x, double *partials, int nparts, double *out,
                                cudaStream_t stream);

/* torch.where (backend.h's where / where_backward): a NULL a (b) reads av (bv); da, db may be NULL. */
cudaError_t ps_cuda_where(int64_t count, const float *cond, const float *a, float av, const float *b, float bv,
                          float *y, cudaStream_t stream);
cudaError_t ps_cuda_where_backward(int64_t count, const float *cond, const float *dy, float *da, float *db,
                                   cudaStream_t stream);

/* ---- spatial transformers (AffineGrid, GridSample) ----
 * backend.h's rules (ps_affgrid_desc, ps_gridsample_desc: mode 0 bilinear,
 * 1 nearest; padding 0 zeros, 1 border, 2 reflection). The affine
 * backward sums each sample's six terms in double; grid_sample's backward
 * zeroes dx and adds each output's weighted gradient to the inputs it
 * read atomically (as PyTorch's CUDA kernel), and writes dgrid (one
 * thread per point, its channels summed in order); dx or dgrid may be
 * NULL. */
typedef struct ps_cuda_gridsample {
    int n, c, h, w, oh, ow, mode, padding, align_corners;
} ps_cuda_gridsample;

cudaError_t ps_cuda_affine_grid(int n, int h, int w, int align_corners, const float *theta, float *grid,
                                cudaStream_t stream);
cudaError_t ps_cuda_affine_grid_backward(int n, int h, int w, int align_corners, const float *dgrid, float *dtheta,
                                         cudaStream_t stream);
cudaError_t ps_cuda_grid_sample(const ps_cuda_gridsample *p, const float *x, const float *grid, float *y,
                                cudaStream_t stream);
cudaError_t ps_cuda_grid_sample_backward(const ps_cuda_gridsample *p, const float *x, const float *grid,
                                         const float *dy, float *dx, float *dgrid, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
