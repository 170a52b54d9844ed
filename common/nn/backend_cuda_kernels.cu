/* backend_cuda_kernels.cu - the CUDA kernels of the CUDA backend (see
 * backend_cuda.h): bias broadcast and reduction of the fc layers, the
 * max-pool argmax and its gradient, dropout's multiply, gradient
 * accumulation, SGD and Adam. Everything else is cuDNN or cuBLAS
 * (backend_cuda.c).
 *
 * All kernels are grid-stride loops over int64 indices. The _rn intrinsics
 * keep nvcc from contracting a*b+c into one fused multiply-add, which would
 * round differently from the reference backend.
 */
#include "backend_cuda.h"

namespace {

const int kThreads = 256;

/* Blocks for n elements: enough to fill the GPU, grid-stride beyond that. */
unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > 8192) b = 8192;
    return (unsigned)b;
}

__global__ void fill_rows_kernel(float *y, const float *b, int rows, int cols) {
    const int64_t n = (int64_t)rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = b[i % cols];
}

__global__ void col_sum_kernel(const float *dy, int rows, int cols, float *db) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
         c += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0.0; /* as the reference: sums in double */
        for (int r = 0; r < rows; r++) acc += dy[(int64_t)r * cols + c];
        db[c] = (float)acc;
    }
}

__global__ void maxpool_argmax_kernel(const float *x, int planes, int h, int w, int k, int stride,
                                      int oh, int ow, int32_t *idx) {
    const int64_t n = (int64_t)planes * oh * ow;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ox = (int)(i % ow), oy = (int)((i / ow) % oh);
        const float *xp = x + (i / ((int64_t)oh * ow)) * h * w;
        int best = (oy * stride) * w + ox * stride;
        float m = xp[best];
        for (int ky = 0; ky < k; ky++)
            for (int kx = 0; kx < k; kx++) {
                const int j = (oy * stride + ky) * w + ox * stride + kx;
                const float v = xp[j];
                if (v > m || isnan(v)) {
                    m = v;
                    best = j;
                }
            }
        idx[i] = best;
    }
}

__global__ void maxpool_backward_kernel(const int32_t *idx, const float *dy, int planes, int h, int w,
                                        int k, int stride, int oh, int ow, float *dx) {
    const int64_t n = (int64_t)planes * h * w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ix = (int)(i % w), iy = (int)((i / w) % h);
        const int64_t p = i / ((int64_t)h * w);
        const int self = iy * w + ix;
        /* Windows covering (iy, ix): oy*stride <= iy < oy*stride + k. */
        const int oy0 = iy - k + 1 <= 0 ? 0 : (iy - k + stride) / stride;
        const int ox0 = ix - k + 1 <= 0 ? 0 : (ix - k + stride) / stride;
        const int oy1 = min(iy / stride, oh - 1), ox1 = min(ix / stride, ow - 1);
        float acc = 0.0f;
        for (int oy = oy0; oy <= oy1; oy++)
            for (int ox = ox0; ox <= ox1; ox++) {
                const int64_t o = (p * oh + oy) * ow + ox;
                if (idx[o] == self) acc = __fadd_rn(acc, dy[o]);
            }
        dx[i] = acc;
    }
}

__global__ void mul_kernel(int64_t n, const float *x, const float *mask, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fmul_rn(x[i], mask[i]);
}

__global__ void add_kernel(int64_t n, float *dst, const float *src) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __fadd_rn(dst[i], src[i]);
}

__global__ void sgd_kernel(int64_t n, float *w, const float *g, float *buf, float lr, float momentum,
                           float weight_decay, int first_step) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        if (weight_decay != 0.0f) gi = __fadd_rn(gi, __fmul_rn(weight_decay, w[i]));
        if (momentum != 0.0f) {
            const float b = first_step ? gi : __fadd_rn(__fmul_rn(momentum, buf[i]), gi);
            buf[i] = b;
            gi = b;
        }
        w[i] = __fsub_rn(w[i], __fmul_rn(lr, gi));
    }
}

/* Adam, as the reference backend's ref_adam_one (no contraction). */
__global__ void adam_kernel(int64_t n, float *w, const float *g, float *m, float *v, ps_cuda_adam_args a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        if (a.weight_decay != 0.0f) gi = __fadd_rn(gi, __fmul_rn(a.weight_decay, w[i]));
        const float mi = __fadd_rn(__fmul_rn(a.beta1, m[i]), __fmul_rn(a.one_minus_beta1, gi));
        const float vi = __fadd_rn(__fmul_rn(a.beta2, v[i]), __fmul_rn(a.one_minus_beta2, __fmul_rn(gi, gi)));
        m[i] = mi;
        v[i] = vi;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
        w[i] = __fadd_rn(w[i], __fmul_rn(-a.step_size, __fdiv_rn(mi, denom)));
    }
}

/* Plain SGD on the listed rows: element i is column i % width of row rows[i / width]. */
__global__ void sgd_rows_kernel(int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                const float *g_rows, float lr) {
    const int64_t n = nrows * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = rows[i / width] * width + i % width;
        w[o] = __fsub_rn(w[o], __fmul_rn(lr, g_rows[i]));
    }
}

/* SparseAdam on the listed rows, as the reference's ref_sparse_adam_one. */
__global__ void sparse_adam_rows_kernel(int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                        const float *g_rows, float *m, float *v, ps_cuda_adam_args a) {
    const int64_t n = nrows * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = rows[i / width] * width + i % width;
        const float g = g_rows[i], m_old = m[o], v_old = v[o];
        const float m_upd = __fmul_rn(__fsub_rn(g, m_old), a.one_minus_beta1);
        const float v_upd = __fmul_rn(__fsub_rn(__fmul_rn(g, g), v_old), a.one_minus_beta2);
        m[o] = __fadd_rn(m_old, m_upd);
        v[o] = __fadd_rn(v_old, v_upd);
        const float denom = __fadd_rn(__fsqrt_rn(__fadd_rn(v_upd, v_old)), a.eps);
        w[o] = __fadd_rn(w[o], __fmul_rn(-a.step_size_sp, __fdiv_rn(__fadd_rn(m_upd, m_old), denom)));
    }
}

__global__ void embedding_forward_kernel(int64_t n, int dim, const int64_t *ids, const float *w, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * dim;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = w[ids[i / dim] * dim + i % dim];
}

/* One thread per column: every gradient row is summed in sample order, as
 * in the reference (deterministic, no atomics). */
__global__ void embedding_backward_kernel(int64_t n, int dim, const int64_t *slot, const float *dy,
                                          float *grows) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < dim;
         j += (int64_t)gridDim.x * blockDim.x)
        for (int64_t i = 0; i < n; i++)
            grows[slot[i] * dim + j] = __fadd_rn(grows[slot[i] * dim + j], dy[i * dim + j]);
}

__global__ void scale_kernel(int64_t n, float *x, float s) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

} // namespace

extern "C" {

cudaError_t ps_cuda_embedding_forward(int64_t n, int dim, const int64_t *ids, const float *w, float *y,
                                      cudaStream_t stream) {
    embedding_forward_kernel<<<blocks_for(n * dim), kThreads, 0, stream>>>(n, dim, ids, w, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_embedding_backward(int64_t n, int dim, const int64_t *slot, const float *dy,
                                       int64_t nrows, float *grows, cudaStream_t stream) {
    cudaError_t e = cudaMemsetAsync(grows, 0, (size_t)nrows * dim * sizeof(float), stream);
    if (e != cudaSuccess) return e;
    embedding_backward_kernel<<<blocks_for(dim), kThreads, 0, stream>>>(n, dim, slot, dy, grows);
    return cudaGetLastError();
}

cudaError_t ps_cuda_scale(int64_t count, float *x, float s, cudaStream_t stream) {
    scale_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, x, s);
    return cudaGetLastError();
}

cudaError_t ps_cuda_fill_rows(float *y, const float *b, int rows, int cols, cudaStream_t stream) {
    fill_rows_kernel<<<blocks_for((int64_t)rows * cols), kThreads, 0, stream>>>(y, b, rows, cols);
    return cudaGetLastError();
}

cudaError_t ps_cuda_col_sum(const float *dy, int rows, int cols, float *db, cudaStream_t stream) {
    col_sum_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(dy, rows, cols, db);
    return cudaGetLastError();
}

cudaError_t ps_cuda_maxpool_argmax(const float *x, int planes, int h, int w, int k, int stride,
                                   int oh, int ow, int32_t *idx, cudaStream_t stream) {
    maxpool_argmax_kernel<<<blocks_for((int64_t)planes * oh * ow), kThreads, 0, stream>>>(
        x, planes, h, w, k, stride, oh, ow, idx);
    return cudaGetLastError();
}

cudaError_t ps_cuda_maxpool_backward(const int32_t *idx, const float *dy, int planes, int h, int w,
                                     int k, int stride, int oh, int ow, float *dx,
                                     cudaStream_t stream) {
    maxpool_backward_kernel<<<blocks_for((int64_t)planes * h * w), kThreads, 0, stream>>>(
        idx, dy, planes, h, w, k, stride, oh, ow, dx);
    return cudaGetLastError();
}

cudaError_t ps_cuda_mul(int64_t count, const float *x, const float *mask, float *y,
                        cudaStream_t stream) {
    mul_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, x, mask, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_add(int64_t count, float *dst, const float *src, cudaStream_t stream) {
    add_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, dst, src);
    return cudaGetLastError();
}

cudaError_t ps_cuda_sgd(int64_t count, float *w, const float *g, float *buf, float lr,
                        float momentum, float weight_decay, int first_step, cudaStream_t stream) {
    sgd_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, w, g, buf, lr, momentum,
                                                           weight_decay, first_step);
    return cudaGetLastError();
}

cudaError_t ps_cuda_adam(int64_t count, float *w, const float *g, float *m, float *v,
                         const ps_cuda_adam_args *a, cudaStream_t stream) {
    adam_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, w, g, m, v, *a);
    return cudaGetLastError();
}

cudaError_t ps_cuda_sgd_rows(int64_t nrows, int64_t width, const int64_t *rows, float *w, const float *g_rows,
                             float lr, cudaStream_t stream) {
    sgd_rows_kernel<<<blocks_for(nrows * width), kThreads, 0, stream>>>(nrows, width, rows, w, g_rows, lr);
    return cudaGetLastError();
}

cudaError_t ps_cuda_sparse_adam_rows(int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                     const float *g_rows, float *m, float *v, const ps_cuda_adam_args *a,
                                     cudaStream_t stream) {
    sparse_adam_rows_kernel<<<blocks_for(nrows * width), kThreads, 0, stream>>>(nrows, width, rows, w, g_rows,
                                                                               m, v, *a);
    return cudaGetLastError();
}

} // extern "C"
