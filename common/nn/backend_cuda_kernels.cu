/* backend_cuda_kernels.cu - the CUDA kernels of the CUDA backend (see
 * backend_cuda.h): bias broadcast and reduction of the fc layers, max and
 * average pooling (with padding) and their gradients, batch and layer
 * normalisation, activations, dropout's multiplies, strided accumulation,
 * gradient accumulation, SGD and Adam. Everything else is cuDNN or cuBLAS
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

/* Window of output (oy, ox) clipped to the input; returns PyTorch's
 * count_include_pad divisor (the window clipped to the padded input). */
__device__ int pool_window(const ps_cuda_pool &p, int oy, int ox, int *y0, int *y1, int *x0, int *x1) {
    const int hs = oy * p.sh - p.ph, ws = ox * p.sw - p.pw;
    const int he = min(hs + p.kh, p.h + p.ph), we = min(ws + p.kw, p.w + p.pw);
    const int padded = (he - hs) * (we - ws);
    *y0 = max(hs, 0);
    *x0 = max(ws, 0);
    *y1 = min(he, p.h);
    *x1 = min(we, p.w);
    return padded;
}

/* The outputs whose window covers input row iy: [*o0, *o1] (empty when o0 > o1). */
__device__ void covering(int i, int k, int s, int pad, int on, int *o0, int *o1) {
    const int a = i + pad - k + 1;          /* o * s >= a */
    *o0 = a <= 0 ? 0 : (a + s - 1) / s;
    *o1 = min((i + pad) / s, on - 1);
}

__global__ void maxpool_forward_kernel(ps_cuda_pool p, const float *x, float *y, int32_t *idx) {
    const int64_t n = (int64_t)p.planes * p.oh * p.ow;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ox = (int)(i % p.ow), oy = (int)((i / p.ow) % p.oh);
        const float *xp = x + (i / ((int64_t)p.oh * p.ow)) * p.h * p.w;
        int y0, y1, x0, x1;
        pool_window(p, oy, ox, &y0, &y1, &x0, &x1);
        int best = y0 * p.w + x0;
        float m = -INFINITY;
        for (int iy = y0; iy < y1; iy++)
            for (int ix = x0; ix < x1; ix++) {
                const float v = xp[iy * p.w + ix];
                if (v > m || isnan(v)) {
                    m = v;
                    best = iy * p.w + ix;
                }
            }
        y[i] = m;
        if (idx) idx[i] = best;
    }
}

__global__ void maxpool_backward_kernel(ps_cuda_pool p, const int32_t *idx, const float *dy, float *dx) {
    const int64_t n = (int64_t)p.planes * p.h * p.w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ix = (int)(i % p.w), iy = (int)((i / p.w) % p.h);
        const int64_t pl = i / ((int64_t)p.h * p.w);
        const int self = iy * p.w + ix;
        int oy0, oy1, ox0, ox1;
        covering(iy, p.kh, p.sh, p.ph, p.oh, &oy0, &oy1);
        covering(ix, p.kw, p.sw, p.pw, p.ow, &ox0, &ox1);
        float acc = 0.0f;
        for (int oy = oy0; oy <= oy1; oy++)
            for (int ox = ox0; ox <= ox1; ox++) {
                const int64_t o = (pl * p.oh + oy) * p.ow + ox;
                if (idx[o] == self) acc = __fadd_rn(acc, dy[o]);
            }
        dx[i] = acc;
    }
}

__global__ void avgpool_forward_kernel(ps_cuda_pool p, const float *x, float *y) {
    const int64_t n = (int64_t)p.planes * p.oh * p.ow;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ox = (int)(i % p.ow), oy = (int)((i / p.ow) % p.oh);
        const float *xp = x + (i / ((int64_t)p.oh * p.ow)) * p.h * p.w;
        int y0, y1, x0, x1;
        const int padded = pool_window(p, oy, ox, &y0, &y1, &x0, &x1);
        const int div = p.count_include_pad ? padded : (y1 - y0) * (x1 - x0);
        float acc = 0.0f;
        for (int iy = y0; iy < y1; iy++)
            for (int ix = x0; ix < x1; ix++) acc += xp[iy * p.w + ix];
        y[i] = acc / (float)div;
    }
}

__global__ void avgpool_backward_kernel(ps_cuda_pool p, const float *dy, float *dx) {
    const int64_t n = (int64_t)p.planes * p.h * p.w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ix = (int)(i % p.w), iy = (int)((i / p.w) % p.h);
        const int64_t pl = i / ((int64_t)p.h * p.w);
        int oy0, oy1, ox0, ox1;
        covering(iy, p.kh, p.sh, p.ph, p.oh, &oy0, &oy1);
        covering(ix, p.kw, p.sw, p.pw, p.ow, &ox0, &ox1);
        float acc = 0.0f;
        for (int oy = oy0; oy <= oy1; oy++)
            for (int ox = ox0; ox <= ox1; ox++) {
                int y0, y1, x0, x1;
                const int padded = pool_window(p, oy, ox, &y0, &y1, &x0, &x1);
                const int div = p.count_include_pad ? padded : (y1 - y0) * (x1 - x0);
                acc += dy[(pl * p.oh + oy) * p.ow + ox] / (float)div;
            }
        dx[i] = acc;
    }
}

/* Sum of v over the block (blockDim.x == kThreads, a power of two); every
 * thread gets the result. red: kThreads doubles of shared memory. */
__device__ double block_sum(double v, double *red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    const double r = red[0];
    __syncthreads();
    return r;
}

/* Element e (0 <= e < n*s) of channel j of a plain (n, c, s) tensor. */
__device__ __forceinline__ int64_t chan_at(int64_t e, int j, int c, int64_t s) {
    return ((e / s) * c + j) * s + e % s;
}

/* One block per channel (grid-stride over channels). */
__global__ void bn_forward_training_kernel(const float *x, int n, int c, int64_t s, float eps, const float *gamma,
                                           const float *beta, float *y, float *mean, float *invstd,
                                           float *var_unbiased) {
    __shared__ double red[kThreads];
    const int64_t m = (int64_t)n * s;
    for (int j = blockIdx.x; j < c; j += gridDim.x) {
        double acc = 0.0;
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x) acc += x[chan_at(e, j, c, s)];
        const double mu = block_sum(acc, red) / (double)m;
        acc = 0.0;
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
            const double t = x[chan_at(e, j, c, s)] - mu;
            acc += t * t;
        }
        const double sq = block_sum(acc, red);
        const double is = 1.0 / sqrt(sq / (double)m + eps);
        const double g = gamma ? gamma[j] : 1.0, b = beta ? beta[j] : 0.0;
        const float scale = (float)(is * g), shift = (float)(b - mu * is * g);
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
            const int64_t o = chan_at(e, j, c, s);
            y[o] = x[o] * scale + shift;
        }
        if (threadIdx.x == 0) {
            mean[j] = (float)mu;
            invstd[j] = (float)is;
            if (var_unbiased) var_unbiased[j] = (float)(sq / (double)(m - 1));
        }
    }
}

__global__ void bn_forward_inference_kernel(const float *x, int n, int c, int64_t s, float eps, const float *gamma,
                                            const float *beta, const float *running_mean, const float *running_var,
                                            float *y) {
    const int64_t total = (int64_t)n * c * s;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)((i / s) % c);
        const double is = 1.0 / sqrt((double)running_var[j] + eps);
        const double g = gamma ? gamma[j] : 1.0, b = beta ? beta[j] : 0.0;
        y[i] = (float)((x[i] - running_mean[j]) * is * g + b);
    }
}

__global__ void bn_invstd_kernel(int c, float eps, const float *running_var, float *invstd) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < c; j += gridDim.x * blockDim.x)
        invstd[j] = (float)(1.0 / sqrt((double)running_var[j] + eps));
}

__global__ void bn_backward_kernel(const float *x, const float *dy, int n, int c, int64_t s, int batch_stats,
                                   const float *gamma, const float *mean, const float *invstd, float *dx,
                                   float *dgamma, float *dbeta) {
    __shared__ double red[kThreads];
    const int64_t m = (int64_t)n * s;
    for (int j = blockIdx.x; j < c; j += gridDim.x) {
        const float mu = mean[j];
        double a = 0.0, b = 0.0;
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
            const int64_t o = chan_at(e, j, c, s);
            a += dy[o];
            b += (double)dy[o] * (x[o] - mu);
        }
        const double sdy = block_sum(a, red), sdyx = block_sum(b, red);
        const double is = invstd[j], g = gamma ? gamma[j] : 1.0, dg = sdyx * is;
        if (threadIdx.x == 0) {
            if (dbeta) dbeta[j] = (float)sdy;
            if (dgamma) dgamma[j] = (float)dg;
        }
        if (!dx) continue;
        const float ca = (float)(g * is);
        const float cb = batch_stats ? (float)(-g * is * is * dg / (double)m) : 0.0f;
        const float cc = batch_stats ? (float)(-g * is * sdy / (double)m) : 0.0f;
        for (int64_t e = threadIdx.x; e < m; e += blockDim.x) {
            const int64_t o = chan_at(e, j, c, s);
            dx[o] = ca * dy[o] + cb * (x[o] - mu) + cc;
        }
    }
}

/* One block per row (grid-stride over rows). */
__global__ void ln_forward_kernel(const float *x, int64_t rows, int64_t cols, float eps, const float *gamma,
                                  const float *beta, float *y, float *mean, float *rstd) {
    __shared__ double red[kThreads];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        double acc = 0.0;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc += xr[j];
        const double mu = block_sum(acc, red) / (double)cols;
        acc = 0.0;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) acc += (xr[j] - mu) * (xr[j] - mu);
        const double rs = 1.0 / sqrt(block_sum(acc, red) / (double)cols + eps);
        const float fm = (float)mu, fr = (float)rs;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            const float t = (xr[j] - fm) * fr;
            yr[j] = gamma ? t * gamma[j] + beta[j] : t;
        }
        if (threadIdx.x == 0) {
            if (mean) mean[r] = fm;
            if (rstd) rstd[r] = fr;
        }
    }
}

__global__ void ln_backward_dx_kernel(const float *x, const float *dy, int64_t rows, int64_t cols,
                                      const float *gamma, const float *mean, const float *rstd, float *dx) {
    __shared__ double red[kThreads];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * cols, *dyr = dy + r * cols;
        const float mu = mean[r], rs = rstd[r];
        double a = 0.0, b = 0.0;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            const float g = gamma ? dyr[j] * gamma[j] : dyr[j];
            a += g;
            b += (double)g * ((xr[j] - mu) * rs);
        }
        const float ma = (float)(block_sum(a, red) / (double)cols), mb = (float)(block_sum(b, red) / (double)cols);
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            const float g = gamma ? dyr[j] * gamma[j] : dyr[j];
            dx[r * cols + j] = rs * (g - ma - (xr[j] - mu) * rs * mb);
        }
    }
}

/* One thread per column, rows summed in order (deterministic). */
__global__ void ln_backward_params_kernel(const float *x, const float *dy, int64_t rows, int64_t cols,
                                          const float *mean, const float *rstd, float *dgamma, float *dbeta) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
        double dg = 0.0, db = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            const float g = dy[r * cols + j];
            dg += (double)g * ((x[r * cols + j] - mean[r]) * rstd[r]);
            db += g;
        }
        if (dgamma) dgamma[j] = (float)dg;
        if (dbeta) dbeta[j] = (float)db;
    }
}

/* Group normalisation (backend.h ps_gn_desc): one block per (sample, group) row for the statistics, y and
 * dx; one thread per channel for dgamma / dbeta, the samples and positions summed in order. */
__global__ void gn_forward_kernel(const float *x, int64_t rows, int64_t groups, int64_t cg, int64_t s, float eps,
                                  const float *gamma, const float *beta, float *y, float *mean, float *rstd) {
    __shared__ double red[kThreads];
    const int64_t m = cg * s;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * m;
        float *yr = y + r * m;
        double acc = 0.0;
        for (int64_t j = threadIdx.x; j < m; j += blockDim.x) acc += xr[j];
        const double mu = block_sum(acc, red) / (double)m;
        acc = 0.0;
        for (int64_t j = threadIdx.x; j < m; j += blockDim.x) acc += (xr[j] - mu) * (xr[j] - mu);
        const double rs = 1.0 / sqrt(block_sum(acc, red) / (double)m + eps);
        const float fm = (float)mu, fr = (float)rs;
        for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
            const int64_t ch = (r % groups) * cg + j / s;
            const float t = (xr[j] - fm) * fr;
            yr[j] = gamma ? t * gamma[ch] + beta[ch] : t;
        }
        if (threadIdx.x == 0) {
            if (mean) mean[r] = fm;
            if (rstd) rstd[r] = fr;
        }
    }
}

__global__ void gn_backward_dx_kernel(const float *x, const float *dy, int64_t rows, int64_t groups, int64_t cg,
                                      int64_t s, const float *gamma, const float *mean, const float *rstd, float *dx) {
    __shared__ double red[kThreads];
    const int64_t m = cg * s;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * m, *dyr = dy + r * m;
        const float mu = mean[r], rs = rstd[r];
        double a = 0.0, b = 0.0;
        for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
            const float g = gamma ? dyr[j] * gamma[(r % groups) * cg + j / s] : dyr[j];
            a += g;
            b += (double)g * ((xr[j] - mu) * rs);
        }
        const float ma = (float)(block_sum(a, red) / (double)m), mb = (float)(block_sum(b, red) / (double)m);
        for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
            const float g = gamma ? dyr[j] * gamma[(r % groups) * cg + j / s] : dyr[j];
            dx[r * m + j] = rs * (g - ma - (xr[j] - mu) * rs * mb);
        }
    }
}

__global__ void gn_backward_params_kernel(const float *x, const float *dy, int64_t n, int64_t c, int64_t groups,
                                          int64_t s, const float *mean, const float *rstd, float *dgamma,
                                          float *dbeta) {
    const int64_t cg = c / groups;
    for (int64_t ch = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; ch < c; ch += (int64_t)gridDim.x * blockDim.x) {
        double dg = 0.0, db = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t r = i * groups + ch / cg, off = (i * c + ch) * s;
            for (int64_t p = 0; p < s; p++) {
                const float g = dy[off + p];
                dg += (double)g * ((x[off + p] - mean[r]) * rstd[r]);
                db += g;
            }
        }
        if (dgamma) dgamma[ch] = (float)dg;
        if (dbeta) dbeta[ch] = (float)db;
    }
}

/* L2 normalisation over one dimension (backend.h ps_l2norm_desc): one thread per vector. */
__global__ void l2norm_forward_kernel(int64_t outer, int dim, int64_t inner, float eps, const float *x, float *y) {
    for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < outer * inner;
         v += (int64_t)gridDim.x * blockDim.x) {
        const int64_t base = (v / inner) * dim * inner + v % inner;
        double s = 0.0;
        for (int k = 0; k < dim; k++) s += (double)x[base + k * inner] * x[base + k * inner];
        const float r = 1.0f / fmaxf((float)sqrt(s), eps);
        for (int k = 0; k < dim; k++) y[base + k * inner] = x[base + k * inner] * r;
    }
}

__global__ void l2norm_backward_kernel(int64_t outer, int dim, int64_t inner, float eps, const float *x,
                                       const float *dy, float *dx) {
    for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < outer * inner;
         v += (int64_t)gridDim.x * blockDim.x) {
        const int64_t base = (v / inner) * dim * inner + v % inner;
        double s = 0.0, dot = 0.0;
        for (int k = 0; k < dim; k++) {
            s += (double)x[base + k * inner] * x[base + k * inner];
            dot += (double)dy[base + k * inner] * x[base + k * inner];
        }
        const float n = (float)sqrt(s);
        if (n < eps) {
            for (int k = 0; k < dim; k++) dx[base + k * inner] = dy[base + k * inner] / eps;
            continue;
        }
        const float r = 1.0f / n, c = (float)(dot / s);
        for (int k = 0; k < dim; k++) dx[base + k * inner] = (dy[base + k * inner] - x[base + k * inner] * c) * r;
    }
}

#define SELU_ALPHA 1.67326324235437728f
#define SELU_SCALE 1.05070098735548049f

__device__ float softplus_f(float z) { return z > 0.0f ? z + log1pf(expf(-z)) : log1pf(expf(z)); }

__device__ float act_f(int kind, float alpha, float beta, float x) {
    switch (kind) {
    case PS_CUDA_ACT_RELU: return x > 0.0f || isnan(x) ? x : 0.0f;
    case PS_CUDA_ACT_LEAKY_RELU: return x > 0.0f ? x : alpha * x;
    case PS_CUDA_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case PS_CUDA_ACT_GELU_TANH: {
        const float k = 0.79788456080286536f; /* sqrt(2/pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case PS_CUDA_ACT_SILU: return x / (1.0f + expf(-x));
    case PS_CUDA_ACT_TANH: return tanhf(x);
    case PS_CUDA_ACT_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case PS_CUDA_ACT_HARDTANH: return x < alpha ? alpha : x > beta ? beta : x;
    case PS_CUDA_ACT_HARDSWISH: return x <= -3.0f ? 0.0f : x >= 3.0f ? x : x * (x + 3.0f) / 6.0f;
    case PS_CUDA_ACT_HARDSIGMOID: return x <= -3.0f ? 0.0f : x >= 3.0f ? 1.0f : x / 6.0f + 0.5f;
    case PS_CUDA_ACT_ELU: return x > 0.0f ? x : alpha * expm1f(x);
    case PS_CUDA_ACT_SELU: return SELU_SCALE * (x > 0.0f ? x : SELU_ALPHA * expm1f(x));
    case PS_CUDA_ACT_SOFTPLUS: return alpha * x > beta ? x : softplus_f(alpha * x) / alpha;
    case PS_CUDA_ACT_MISH: return x * tanhf(softplus_f(x));
    case PS_CUDA_ACT_LOGSIGMOID: return -softplus_f(-x);
    case PS_CUDA_ACT_EXP: return expf(x);
    case PS_CUDA_ACT_LOG: return logf(x);
    case PS_CUDA_ACT_ABS: return fabsf(x);
    case PS_CUDA_ACT_SQRT: return sqrtf(x);
    case PS_CUDA_ACT_POW: return powf(x, alpha);
    case PS_CUDA_ACT_LINEAR: return alpha * x + beta;
    case PS_CUDA_ACT_CELU: return x > 0.0f ? x : alpha * expm1f(x / alpha);
    case PS_CUDA_ACT_SOFTSIGN: return x / (1.0f + fabsf(x));
    case PS_CUDA_ACT_TANHSHRINK: return x - tanhf(x);
    case PS_CUDA_ACT_HARDSHRINK: return x > alpha || x < -alpha ? x : 0.0f;
    case PS_CUDA_ACT_SOFTSHRINK: return x > alpha ? x - alpha : x < -alpha ? x + alpha : 0.0f;
    case PS_CUDA_ACT_THRESHOLD: return x > alpha ? x : beta;
    case PS_CUDA_ACT_LOG1P: return log1pf(x);
    case PS_CUDA_ACT_EXPM1: return expm1f(x);
    case PS_CUDA_ACT_SIN: return sinf(x);
    case PS_CUDA_ACT_COS: return cosf(x);
    case PS_CUDA_ACT_GT: return x > alpha ? 1.0f : 0.0f;
    case PS_CUDA_ACT_LT: return x < alpha ? 1.0f : 0.0f;
    case PS_CUDA_ACT_GE: return x >= alpha ? 1.0f : 0.0f;
    case PS_CUDA_ACT_LE: return x <= alpha ? 1.0f : 0.0f;
    case PS_CUDA_ACT_ERF: return erff(x);
    case PS_CUDA_ACT_SIGN: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;   /* NaN and -0: 0, as PyTorch */
    }
    return NAN;
}

__device__ float act_df(int kind, float alpha, float beta, float x, float y, float dy) {
    switch (kind) {
    case PS_CUDA_ACT_RELU: return y > 0.0f ? dy : 0.0f;
    case PS_CUDA_ACT_LEAKY_RELU: return x > 0.0f ? dy : alpha * dy;
    case PS_CUDA_ACT_GELU: {
        const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
        const float pdf = expf(-0.5f * x * x) * 0.39894228040143268f; /* 1/sqrt(2 pi) */
        return dy * (cdf + x * pdf);
    }
    case PS_CUDA_ACT_GELU_TANH: {
        const float k = 0.79788456080286536f, u = k * (x + 0.044715f * x * x * x), t = tanhf(u);
        const float du = k * (1.0f + 3.0f * 0.044715f * x * x);
        return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
    }
    case PS_CUDA_ACT_SILU: {
        const float sg = 1.0f / (1.0f + expf(-x));
        return dy * sg * (1.0f + x * (1.0f - sg));
    }
    case PS_CUDA_ACT_TANH: return dy * (1.0f - y * y);
    case PS_CUDA_ACT_SIGMOID: return dy * y * (1.0f - y);
    case PS_CUDA_ACT_HARDTANH: return y <= alpha || y >= beta ? 0.0f : dy;
    case PS_CUDA_ACT_HARDSWISH: return x < -3.0f ? 0.0f : x <= 3.0f ? dy * (x / 3.0f + 0.5f) : dy;
    case PS_CUDA_ACT_HARDSIGMOID: return x > -3.0f && x < 3.0f ? dy / 6.0f : 0.0f;
    case PS_CUDA_ACT_ELU: return x > 0.0f ? dy : dy * alpha * expf(x);
    case PS_CUDA_ACT_SELU: return dy * SELU_SCALE * (x > 0.0f ? 1.0f : SELU_ALPHA * expf(x));
    case PS_CUDA_ACT_SOFTPLUS: return alpha * x > beta ? dy : dy / (1.0f + expf(-alpha * x));
    case PS_CUDA_ACT_MISH: {
        const float t = tanhf(softplus_f(x)), sg = 1.0f / (1.0f + expf(-x));
        return dy * (t + x * sg * (1.0f - t * t));
    }
    case PS_CUDA_ACT_LOGSIGMOID: return dy / (1.0f + expf(x));
    case PS_CUDA_ACT_EXP: return dy * expf(x);
    case PS_CUDA_ACT_LOG: return dy / x;
    case PS_CUDA_ACT_ABS: return x > 0.0f ? dy : x < 0.0f ? -dy : 0.0f;
    case PS_CUDA_ACT_SQRT: return dy / (2.0f * sqrtf(x));
    case PS_CUDA_ACT_POW: return alpha == 0.0f ? 0.0f : dy * alpha * powf(x, alpha - 1.0f);
    case PS_CUDA_ACT_LINEAR: return dy * alpha;
    case PS_CUDA_ACT_CELU: return x > 0.0f ? dy : dy * expf(x / alpha);
    case PS_CUDA_ACT_SOFTSIGN: {
        const float q = 1.0f + fabsf(x);
        return dy / (q * q);
    }
    case PS_CUDA_ACT_TANHSHRINK: {
        const float t = tanhf(x);
        return dy * t * t;
    }
    case PS_CUDA_ACT_HARDSHRINK:
    case PS_CUDA_ACT_SOFTSHRINK: return x > alpha || x < -alpha ? dy : 0.0f;
    case PS_CUDA_ACT_THRESHOLD: return x > alpha ? dy : 0.0f;
    case PS_CUDA_ACT_LOG1P: return dy / (1.0f + x);
    case PS_CUDA_ACT_EXPM1: return dy * expf(x);
    case PS_CUDA_ACT_SIN: return dy * cosf(x);
    case PS_CUDA_ACT_COS: return -dy * sinf(x);
    case PS_CUDA_ACT_GT:
    case PS_CUDA_ACT_LT:
    case PS_CUDA_ACT_GE:
    case PS_CUDA_ACT_LE: return 0.0f;
    case PS_CUDA_ACT_ERF: return dy * 1.12837916709551257390f * expf(-x * x);
    case PS_CUDA_ACT_SIGN: return 0.0f;
    }
    return NAN;
}

__global__ void act_forward_kernel(int kind, float alpha, float beta, int64_t n, const float *x, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = act_f(kind, alpha, beta, x[i]);
}

__global__ void act_backward_kernel(int kind, float alpha, float beta, int64_t n, const float *x, const float *y,
                                    const float *dy, float *dx) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = act_df(kind, alpha, beta, x ? x[i] : 0.0f, y ? y[i] : 0.0f, dy[i]);
}

/* PReLU (backend.h prelu_forward): slope w[(i / s) % c] for element i of a
 * plain (n, c, s) activation. */
__global__ void prelu_forward_kernel(int64_t count, int64_t c, int64_t s, const float *x, const float *w, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] > 0.0f ? x[i] : w[(i / s) % c] * x[i];
}

__global__ void prelu_backward_dx_kernel(int64_t count, int64_t c, int64_t s, const float *x, const float *w,
                                         const float *dy, float *dx) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        dx[i] = x[i] > 0.0f ? dy[i] : w[(i / s) % c] * dy[i];
}

/* One block per channel: its threads stride over the channel's n * s
 * values, summing x * dy where x <= 0 in double, then reduce in shared memory. */
__global__ void prelu_backward_dw_kernel(int64_t n, int64_t c, int64_t s, const float *x, const float *dy, float *dw) {
    __shared__ double part[kThreads];
    const int64_t k = blockIdx.x;
    double g = 0.0;
    for (int64_t t = threadIdx.x; t < n * s; t += blockDim.x) {
        const int64_t i = ((t / s) * c + k) * s + t % s;
        if (x[i] <= 0.0f) g += (double)x[i] * dy[i];
    }
    part[threadIdx.x] = g;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) dw[k] = (float)part[0];
}

/* Adaptive average pooling's bins (backend.h ps_adaptive_desc: PyTorch's
 * start_index / end_index). */
__device__ int adaptive_start(int i, int in, int out) { return (int)((int64_t)i * in / out); }
__device__ int adaptive_end(int i, int in, int out) { return (int)((((int64_t)i + 1) * in + out - 1) / out); }

__global__ void adaptive_avgpool_forward_kernel(ps_cuda_adaptive p, const float *x, float *y) {
    const int64_t n = (int64_t)p.planes * p.oh * p.ow;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ox = (int)(i % p.ow), oy = (int)((i / p.ow) % p.oh);
        const float *xp = x + (i / ((int64_t)p.oh * p.ow)) * p.h * p.w;
        const int y0 = adaptive_start(oy, p.h, p.oh), y1 = adaptive_end(oy, p.h, p.oh);
        const int x0 = adaptive_start(ox, p.w, p.ow), x1 = adaptive_end(ox, p.w, p.ow);
        float acc = 0.0f;
        for (int iy = y0; iy < y1; iy++)
            for (int ix = x0; ix < x1; ix++) acc = __fadd_rn(acc, xp[iy * p.w + ix]);
        y[i] = __fdiv_rn(acc, (float)((y1 - y0) * (x1 - x0)));
    }
}

/* The outputs whose bins hold input index i of an axis in -> out: a
 * superset by arithmetic, then each checked against its own bin. */
__device__ void adaptive_covering(int i, int in, int out, int *o0, int *o1) {
    *o0 = max(adaptive_start(i, out, in) - 1, 0);
    *o1 = min(adaptive_end(i, out, in), out - 1);
}

/* One thread per input element, gathering dy / area over the bins that
 * hold it, in ascending output order. */
__global__ void adaptive_avgpool_backward_kernel(ps_cuda_adaptive p, const float *dy, float *dx) {
    const int64_t n = (int64_t)p.planes * p.h * p.w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int ix = (int)(i % p.w), iy = (int)((i / p.w) % p.h);
        const int64_t pl = i / ((int64_t)p.h * p.w);
        int oy0, oy1, ox0, ox1;
        adaptive_covering(iy, p.h, p.oh, &oy0, &oy1);
        adaptive_covering(ix, p.w, p.ow, &ox0, &ox1);
        float acc = 0.0f;
        for (int oy = oy0; oy <= oy1; oy++) {
            const int y0 = adaptive_start(oy, p.h, p.oh), y1 = adaptive_end(oy, p.h, p.oh);
            if (iy < y0 || iy >= y1) continue;
            for (int ox = ox0; ox <= ox1; ox++) {
                const int x0 = adaptive_start(ox, p.w, p.ow), x1 = adaptive_end(ox, p.w, p.ow);
                if (ix < x0 || ix >= x1) continue;
                acc = __fadd_rn(acc, __fdiv_rn(dy[(pl * p.oh + oy) * p.ow + ox], (float)((y1 - y0) * (x1 - x0))));
            }
        }
        dx[i] = acc;
    }
}

__global__ void mul_planes_kernel(int64_t planes, int64_t s, const float *x, const float *mask, float *y) {
    const int64_t n = planes * s;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fmul_rn(x[i], mask[i / s]);
}

/* Dims and strides of a permute, by value (at most 4 per sample). */
struct permute_geom {
    int ndim;
    int64_t per;                /* elements per sample */
    int64_t odim[4], istr[4];
};

__global__ void permute_kernel(int64_t total, permute_geom g, const float *x, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t s = i / g.per, rest = i % g.per, off = 0;
        for (int k = g.ndim - 1; k >= 0; k--) {
            off += (rest % g.odim[k]) * g.istr[k];
            rest /= g.odim[k];
        }
        y[i] = x[s * g.per + off];
    }
}

__global__ void add2d_kernel(int64_t rows, int64_t cols, const float *src, int64_t src_ld, float *dst,
                             int64_t dst_ld) {
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, j = i % cols;
        dst[r * dst_ld + j] = __fadd_rn(dst[r * dst_ld + j], src[r * src_ld + j]);
    }
}

__global__ void add_out_kernel(int64_t n, const float *a, const float *b, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(a[i], b[i]);
}

__global__ void fill_kernel(int64_t n, float *x, float v) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = v;
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

__global__ void sgd_kernel(int64_t n, float *w_out, const float *w, const float *g, float *buf, float lr,
                           float momentum, float weight_decay, int first_step) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        if (weight_decay != 0.0f) gi = __fadd_rn(gi, __fmul_rn(weight_decay, w[i]));
        if (momentum != 0.0f) {
            const float b = first_step ? gi : __fadd_rn(__fmul_rn(momentum, buf[i]), gi);
            buf[i] = b;
            gi = b;
        }
        w_out[i] = __fsub_rn(w[i], __fmul_rn(lr, gi));
    }
}

/* Adam, as the reference backend's ref_adam_one (no contraction). */
__global__ void adam_kernel(int64_t n, float *w_out, const float *w, const float *g, float *m, float *v,
                            ps_cuda_adam_args a) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        if (a.weight_decay != 0.0f) gi = __fadd_rn(gi, __fmul_rn(a.weight_decay, w[i]));
        const float mi = __fadd_rn(__fmul_rn(a.beta1, m[i]), __fmul_rn(a.one_minus_beta1, gi));
        const float vi = __fadd_rn(__fmul_rn(a.beta2, v[i]), __fmul_rn(a.one_minus_beta2, __fmul_rn(gi, gi)));
        m[i] = mi;
        v[i] = vi;
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
        w_out[i] = __fadd_rn(w[i], __fmul_rn(-a.step_size, __fdiv_rn(mi, denom)));
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

/* One thread per element (grid-stride): in the triangle of its matrix, the value, else x's. */
__global__ void tri_fill_kernel(int64_t n, int64_t rows, int64_t cols, int upper, int64_t diagonal, float value,
                                const float *x, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t c = i % cols, r = (i / cols) % rows;
        const bool in = upper ? c - r >= diagonal : c - r <= diagonal;
        y[i] = in ? value : x[i];
    }
}

/* One thread per (o, k) line (grid-stride), its len elements summed in order in double. */
__global__ void cumsum_kernel(int64_t lines, int64_t len, int64_t inner, int reverse, int exclusive, const float *x,
                              float *y) {
    for (int64_t l = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; l < lines; l += (int64_t)gridDim.x * blockDim.x) {
        const int64_t o = l / inner, k = l % inner;
        double acc = 0.0;
        for (int64_t t = 0; t < len; t++) {
            const int64_t i = reverse ? len - 1 - t : t, at = (o * len + i) * inner + k;
            if (exclusive) {
                y[at] = (float)acc;
                acc += x[at];
            } else {
                acc += x[at];
                y[at] = (float)acc;
            }
        }
    }
}

/* im2col: one thread per column element (s, ci, i, j, p, q), 0 outside the image. */
__global__ void im2col_kernel(ps_cuda_cols g, int64_t count, const float *x, float *col) {
    const int64_t L = g.oh * g.ow;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < count; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pq = e % L, r = e / L, k = r % (g.kh * g.kw), plane = r / (g.kh * g.kw);
        const int64_t y = (pq / g.ow) * g.sh - g.ph + (k / g.kw) * g.dh;
        const int64_t xx = (pq % g.ow) * g.sw - g.pw + (k % g.kw) * g.dw;
        col[e] = y >= 0 && y < g.h && xx >= 0 && xx < g.w ? x[(plane * g.h + y) * g.w + xx] : 0.0f;
    }
}

/* col2im: one thread per pixel (s, ci, y, x), summing in kernel order (i, j) the column elements whose window
 * position (p, q) reads it: y = p sh - ph + i dh, so p = (y + ph - i dh) / sh when that divides and 0 <= p < oh. */
__global__ void col2im_kernel(ps_cuda_cols g, int64_t count, const float *col, float *x) {
    const int64_t L = g.oh * g.ow;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < count; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t xx = e % g.w, y = (e / g.w) % g.h, plane = e / (g.w * g.h);
        const float *cp = col + plane * g.kh * g.kw * L;
        float acc = 0.0f;
        for (int64_t i = 0; i < g.kh; i++) {
            const int64_t ty = y + g.ph - i * g.dh;
            if (ty < 0 || ty % g.sh) continue;
            const int64_t p = ty / g.sh;
            if (p >= g.oh) continue;
            for (int64_t j = 0; j < g.kw; j++) {
                const int64_t tx = xx + g.pw - j * g.dw;
                if (tx < 0 || tx % g.sw) continue;
                const int64_t q = tx / g.sw;
                if (q >= g.ow) continue;
                acc = __fadd_rn(acc, cp[(i * g.kw + j) * L + p * g.ow + q]);
            }
        }
        x[e] = acc;
    }
}

/* y[i] = sum over s < parts of p[s count + i], in s order, in double (the per-image weight gradients'
 * sum: the same result every time). */
__global__ void sum_parts_kernel(int64_t count, int parts, const float *p, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        double acc = 0.0;
        for (int s = 0; s < parts; s++) acc += p[(int64_t)s * count + i];
        y[i] = (float)acc;
    }
}

__global__ void eq_const_kernel(int64_t n, const int64_t *x, int64_t value, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] == value ? 1.0f : 0.0f;
}

__global__ void key_pad_kernel(int64_t n, int64_t per, int64_t cols, int additive, const float *mask, float *s) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float m = mask[(i / (per * cols)) * cols + i % cols];
        if (additive) s[i] += m;
        else if (m != 0.0f) s[i] = -INFINITY;
    }
}

/* Recurrent layers (LSTM, GRU): one time step's gates, one thread per (row, hidden unit) (ps_rnn_cell_desc). */
__device__ __forceinline__ float rnn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void rnn_cell_forward_kernel(int64_t count, int64_t H, int gru, const float *gx, const float *gh,
                                        const float *h_prev, const float *c_prev, float *h, float *c, float *act) {
    const int64_t G = gru ? 3 : 4;
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < count; o += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = o / H, j = o % H;
        const float *x = gx + r * G * H, *y = gh + r * G * H;
        float *a = act + r * 4 * H;
        if (gru) {
            const float rg = rnn_sigmoid(x[j] + y[j]), z = rnn_sigmoid(x[H + j] + y[H + j]);
            const float nn = tanhf(x[2 * H + j] + rg * y[2 * H + j]);
            h[o] = (1.0f - z) * nn + z * h_prev[o];
            a[j] = rg; a[H + j] = z; a[2 * H + j] = nn; a[3 * H + j] = y[2 * H + j];
        } else {
            const float i = rnn_sigmoid(x[j] + y[j]), f = rnn_sigmoid(x[H + j] + y[H + j]);
            const float g = tanhf(x[2 * H + j] + y[2 * H + j]), og = rnn_sigmoid(x[3 * H + j] + y[3 * H + j]);
            const float cn = f * c_prev[o] + i * g;
            c[o] = cn;
            h[o] = og * tanhf(cn);
            a[j] = i; a[H + j] = f; a[2 * H + j] = g; a[3 * H + j] = og;
        }
    }
}

__global__ void rnn_cell_backward_kernel(int64_t count, int64_t H, int gru, const float *act, const float *h_prev,
                                         const float *c_prev, const float *c, const float *dh, float *dc, float *dgx,
                                         float *dgh, float *dh_prev) {
    const int64_t G = gru ? 3 : 4;
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < count; o += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = o / H, j = o % H;
        const float *a = act + r * 4 * H;
        float *gx = dgx + r * G * H, *gh = dgh + r * G * H;
        if (gru) {
            const float rg = a[j], z = a[H + j], nn = a[2 * H + j], ghn = a[3 * H + j];
            const float dn = dh[o] * (1.0f - z) * (1.0f - nn * nn);
            const float dz = dh[o] * (h_prev[o] - nn) * z * (1.0f - z);
            const float dr = dn * ghn * rg * (1.0f - rg);
            gx[j] = dr; gh[j] = dr;
            gx[H + j] = dz; gh[H + j] = dz;
            gx[2 * H + j] = dn;
            gh[2 * H + j] = dn * rg;
            dh_prev[o] = dh[o] * z;
        } else {
            const float i = a[j], f = a[H + j], g = a[2 * H + j], og = a[3 * H + j], tc = tanhf(c[o]);
            const float dcc = dc[o] + dh[o] * og * (1.0f - tc * tc);
            const float v0 = dcc * g * i * (1.0f - i), v1 = dcc * c_prev[o] * f * (1.0f - f);
            const float v2 = dcc * i * (1.0f - g * g), v3 = dh[o] * tc * og * (1.0f - og);
            gx[j] = v0; gx[H + j] = v1; gx[2 * H + j] = v2; gx[3 * H + j] = v3;
            gh[j] = v0; gh[H + j] = v1; gh[2 * H + j] = v2; gh[3 * H + j] = v3;
            dc[o] = dcc * f;
            dh_prev[o] = 0.0f;
        }
    }
}

/* ---- numpy broadcasting (ps_cuda_bcast) ---- */

static __device__ float bcast_apply(int op, float a, float b) {
    if (op == 4) return a > b || isnan(a) ? a : b;   /* max, min: NaN on either side gives NaN */
    if (op == 5) return a < b || isnan(a) ? a : b;
    return op == 0 ? __fadd_rn(a, b) : op == 1 ? __fsub_rn(a, b) : op == 2 ? __fmul_rn(a, b) : __fdiv_rn(a, b);
}

static __device__ double bcast_grad(int op, int which, double dy, double a, double b) {
    if (op == 0) return dy;
    if (op == 1) return which ? -dy : dy;
    if (op == 2) return which ? dy * a : dy * b;
    if (op == 4 || op == 5) {   /* dy to the winner, half to each on a tie */
        const double mine = which ? b : a, other = which ? a : b;
        if (mine == other) return dy / 2;
        return (op == 4 ? mine > other : mine < other) ? dy : 0.0;
    }
    return which ? -dy * a / (b * b) : dy / b;
}

__global__ void binary_bcast_kernel(ps_cuda_bcast g, const float *a, const float *b, float *y) {
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < g.count;
         o += (int64_t)gridDim.x * blockDim.x) {
        int64_t rest = o, oa = 0, ob = 0;
        for (int k = g.nd - 1; k >= 0; k--) {
            const int64_t i = rest % g.dims[k];
            rest /= g.dims[k];
            oa += i * g.sa[k];
            ob += i * g.sb[k];
        }
        y[o] = bcast_apply(g.op, a[oa], b[ob]);
    }
}

/* The backward's walk, split on the host: the dims the gradient keeps
 * (one thread per element j of dx, dx contiguous over them) and the dims
 * it sums over (r, row-major: the reference's order), each with its y, a
 * and b strides. The kernel's loops are unrolled over PS_BCAST_MAX_DIMS
 * with compile-time indices (the split arrays stay in registers). */
struct bcast_split {
    int op, which, nk, nr;
    int64_t kd[5], ky[5], ka[5], kb[5];   /* kept dims, outermost first */
    int64_t rd[5], ry[5], ra[5], rb[5];   /* summed dims, outermost first */
    int64_t kept, red;
};

__global__ void binary_bcast_backward_kernel(bcast_split s, const float *a, const float *b, const float *dy,
                                             float *dx) {
    const int reads = s.op >= 2;
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < s.kept;
         j += (int64_t)gridDim.x * blockDim.x) {
        int64_t rest = j, by = 0, ba = 0, bb = 0;
#pragma unroll
        for (int k = 4; k >= 0; k--)
            if (k < s.nk) {
                const int64_t i = rest % s.kd[k];
                rest /= s.kd[k];
                by += i * s.ky[k];
                ba += i * s.ka[k];
                bb += i * s.kb[k];
            }
        double acc = 0;
        for (int64_t r = 0; r < s.red; r++) {
            int64_t rr = r, oy = by, oa = ba, ob = bb;
#pragma unroll
            for (int k = 4; k >= 0; k--)
                if (k < s.nr) {
                    const int64_t i = rr % s.rd[k];
                    rr /= s.rd[k];
                    oy += i * s.ry[k];
                    oa += i * s.ra[k];
                    ob += i * s.rb[k];
                }
            acc += bcast_grad(s.op, s.which, dy[oy], reads ? a[oa] : 0.0, reads ? b[ob] : 0.0);
        }
        dx[j] = (float)acc;
    }
}

/* ---- sum of squares (ps_cuda_sum_squares) ---- */

__global__ void sum_squares_part_kernel(int64_t n, const float *x, double *partials) {
    __shared__ double red[kThreads];
    double acc = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double v = x[i];
        acc += v * v;
    }
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void sum_squares_final_kernel(int nparts, const double *partials, double *out) {
    __shared__ double red[kThreads];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += partials[i];
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) *out = acc;
}

/* ---- torch.where (ps_cuda_where) ---- */

__global__ void where_kernel(int64_t n, const float *cond, const float *a, float av, const float *b, float bv,
                             float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = cond[i] != 0.0f ? (a ? a[i] : av) : (b ? b[i] : bv);
}

__global__ void where_backward_kernel(int64_t n, const float *cond, const float *dy, float *da, float *db) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const bool pick_a = cond[i] != 0.0f;
        if (da) da[i] = pick_a ? dy[i] : 0.0f;
        if (db) db[i] = pick_a ? 0.0f : dy[i];
    }
}

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

cudaError_t ps_cuda_maxpool_forward(const ps_cuda_pool *p, const float *x, float *y, int32_t *idx,
                                    cudaStream_t stream) {
    maxpool_forward_kernel<<<blocks_for((int64_t)p->planes * p->oh * p->ow), kThreads, 0, stream>>>(*p, x, y, idx);
    return cudaGetLastError();
}

cudaError_t ps_cuda_maxpool_backward(const ps_cuda_pool *p, const int32_t *idx, const float *dy, float *dx,
                                     cudaStream_t stream) {
    maxpool_backward_kernel<<<blocks_for((int64_t)p->planes * p->h * p->w), kThreads, 0, stream>>>(*p, idx, dy, dx);
    return cudaGetLastError();
}

cudaError_t ps_cuda_avgpool_forward(const ps_cuda_pool *p, const float *x, float *y, cudaStream_t stream) {
    avgpool_forward_kernel<<<blocks_for((int64_t)p->planes * p->oh * p->ow), kThreads, 0, stream>>>(*p, x, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_avgpool_backward(const ps_cuda_pool *p, const float *dy, float *dx, cudaStream_t stream) {
    avgpool_backward_kernel<<<blocks_for((int64_t)p->planes * p->h * p->w), kThreads, 0, stream>>>(*p, dy, dx);
    return cudaGetLastError();
}

/* Blocks for a one-block-per-item kernel (channels, rows). */
static unsigned items_for(int64_t n) {
    return (unsigned)(n < 1 ? 1 : n > 65535 ? 65535 : n);
}

cudaError_t ps_cuda_bn_forward_training(const float *x, int n, int c, int64_t s, float eps, const float *gamma,
                                        const float *beta, float *y, float *mean, float *invstd,
                                        float *var_unbiased, cudaStream_t stream) {
    bn_forward_training_kernel<<<items_for(c), kThreads, 0, stream>>>(x, n, c, s, eps, gamma, beta, y, mean,
                                                                      invstd, var_unbiased);
    return cudaGetLastError();
}

cudaError_t ps_cuda_bn_forward_inference(const float *x, int n, int c, int64_t s, float eps, const float *gamma,
                                         const float *beta, const float *running_mean, const float *running_var,
                                         float *y, float *invstd, cudaStream_t stream) {
    bn_forward_inference_kernel<<<blocks_for((int64_t)n * c * s), kThreads, 0, stream>>>(
        x, n, c, s, eps, gamma, beta, running_mean, running_var, y);
    if (invstd) bn_invstd_kernel<<<blocks_for(c), kThreads, 0, stream>>>(c, eps, running_var, invstd);
    return cudaGetLastError();
}

cudaError_t ps_cuda_bn_backward(const float *x, const float *dy, int n, int c, int64_t s, int batch_stats,
                                const float *gamma, const float *mean, const float *invstd, float *dx,
                                float *dgamma, float *dbeta, cudaStream_t stream) {
    bn_backward_kernel<<<items_for(c), kThreads, 0, stream>>>(x, dy, n, c, s, batch_stats, gamma, mean, invstd, dx,
                                                              dgamma, dbeta);
    return cudaGetLastError();
}

cudaError_t ps_cuda_ln_forward(const float *x, int64_t rows, int64_t cols, float eps, const float *gamma,
                               const float *beta, float *y, float *mean, float *rstd, cudaStream_t stream) {
    ln_forward_kernel<<<items_for(rows), kThreads, 0, stream>>>(x, rows, cols, eps, gamma, beta, y, mean, rstd);
    return cudaGetLastError();
}

cudaError_t ps_cuda_ln_backward(const float *x, const float *dy, int64_t rows, int64_t cols, const float *gamma,
                                const float *mean, const float *rstd, float *dx, float *dgamma, float *dbeta,
                                cudaStream_t stream) {
    if (dx) ln_backward_dx_kernel<<<items_for(rows), kThreads, 0, stream>>>(x, dy, rows, cols, gamma, mean, rstd, dx);
    if (dgamma || dbeta)
        ln_backward_params_kernel<<<blocks_for(cols), kThreads, 0, stream>>>(x, dy, rows, cols, mean, rstd, dgamma,
                                                                             dbeta);
    return cudaGetLastError();
}

cudaError_t ps_cuda_l2norm_forward(int64_t outer, int dim, int64_t inner, float eps, const float *x, float *y,
                                   cudaStream_t stream) {
    l2norm_forward_kernel<<<blocks_for(outer * inner), kThreads, 0, stream>>>(outer, dim, inner, eps, x, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_l2norm_backward(int64_t outer, int dim, int64_t inner, float eps, const float *x, const float *dy,
                                    float *dx, cudaStream_t stream) {
    l2norm_backward_kernel<<<blocks_for(outer * inner), kThreads, 0, stream>>>(outer, dim, inner, eps, x, dy, dx);
    return cudaGetLastError();
}

cudaError_t ps_cuda_gn_forward(const float *x, int64_t n, int64_t c, int64_t s, int64_t groups, float eps,
                               const float *gamma, const float *beta, float *y, float *mean, float *rstd,
                               cudaStream_t stream) {
    gn_forward_kernel<<<items_for(n * groups), kThreads, 0, stream>>>(x, n * groups, groups, c / groups, s, eps, gamma,
                                                                       beta, y, mean, rstd);
    return cudaGetLastError();
}

cudaError_t ps_cuda_gn_backward(const float *x, const float *dy, int64_t n, int64_t c, int64_t s, int64_t groups,
                                const float *gamma, const float *mean, const float *rstd, float *dx, float *dgamma,
                                float *dbeta, cudaStream_t stream) {
    if (dx)
        gn_backward_dx_kernel<<<items_for(n * groups), kThreads, 0, stream>>>(x, dy, n * groups, groups, c / groups, s,
                                                                               gamma, mean, rstd, dx);
    if (dgamma || dbeta)
        gn_backward_params_kernel<<<blocks_for(c), kThreads, 0, stream>>>(x, dy, n, c, groups, s, mean, rstd, dgamma,
                                                                          dbeta);
    return cudaGetLastError();
}

cudaError_t ps_cuda_act_forward(int kind, float alpha, float beta, int64_t count, const float *x, float *y,
                                cudaStream_t stream) {
    act_forward_kernel<<<blocks_for(count), kThreads, 0, stream>>>(kind, alpha, beta, count, x, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_act_backward(int kind, float alpha, float beta, int64_t count, const float *x, const float *y,
                                 const float *dy, float *dx, cudaStream_t stream) {
    act_backward_kernel<<<blocks_for(count), kThreads, 0, stream>>>(kind, alpha, beta, count, x, y, dy, dx);
    return cudaGetLastError();
}

cudaError_t ps_cuda_prelu_forward(int64_t n, int64_t c, int64_t s, const float *x, const float *w, float *y,
                                  cudaStream_t stream) {
    prelu_forward_kernel<<<blocks_for(n * c * s), kThreads, 0, stream>>>(n * c * s, c, s, x, w, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_prelu_backward(int64_t n, int64_t c, int64_t s, const float *x, const float *w, const float *dy,
                                   float *dx, float *dw, cudaStream_t stream) {
    if (dx) prelu_backward_dx_kernel<<<blocks_for(n * c * s), kThreads, 0, stream>>>(n * c * s, c, s, x, w, dy, dx);
    if (dw) prelu_backward_dw_kernel<<<(unsigned)c, kThreads, 0, stream>>>(n, c, s, x, dy, dw);
    return cudaGetLastError();
}

cudaError_t ps_cuda_adaptive_avgpool_forward(const ps_cuda_adaptive *p, const float *x, float *y,
                                             cudaStream_t stream) {
    adaptive_avgpool_forward_kernel<<<blocks_for((int64_t)p->planes * p->oh * p->ow), kThreads, 0, stream>>>(*p, x,
                                                                                                            y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_adaptive_avgpool_backward(const ps_cuda_adaptive *p, const float *dy, float *dx,
                                              cudaStream_t stream) {
    adaptive_avgpool_backward_kernel<<<blocks_for((int64_t)p->planes * p->h * p->w), kThreads, 0, stream>>>(*p, dy,
                                                                                                           dx);
    return cudaGetLastError();
}

cudaError_t ps_cuda_mul_planes(int64_t planes, int64_t s, const float *x, const float *mask, float *y,
                               cudaStream_t stream) {
    mul_planes_kernel<<<blocks_for(planes * s), kThreads, 0, stream>>>(planes, s, x, mask, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_permute(int64_t n, int ndim, const int64_t *odims, const int64_t *istr, const float *x,
                            float *y, cudaStream_t stream) {
    permute_geom g;
    g.ndim = ndim;
    g.per = 1;
    for (int k = 0; k < 4; k++) {
        g.odim[k] = k < ndim ? odims[k] : 1;
        g.istr[k] = k < ndim ? istr[k] : 0;
        if (k < ndim) g.per *= odims[k];
    }
    const int64_t total = n * g.per;
    if (total <= 0) return cudaSuccess;
    permute_kernel<<<blocks_for(total), kThreads, 0, stream>>>(total, g, x, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_add2d(int64_t rows, int64_t cols, const float *src, int64_t src_ld, float *dst,
                          int64_t dst_ld, cudaStream_t stream) {
    add2d_kernel<<<blocks_for(rows * cols), kThreads, 0, stream>>>(rows, cols, src, src_ld, dst, dst_ld);
    return cudaGetLastError();
}

cudaError_t ps_cuda_add_out(int64_t count, const float *a, const float *b, float *y, cudaStream_t stream) {
    add_out_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, a, b, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_fill(int64_t count, float *x, float value, cudaStream_t stream) {
    fill_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, x, value);
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

cudaError_t ps_cuda_sgd(int64_t count, float *w_out, const float *w, const float *g, float *buf, float lr,
                        float momentum, float weight_decay, int first_step, cudaStream_t stream) {
    sgd_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, w_out, w, g, buf, lr, momentum,
                                                           weight_decay, first_step);
    return cudaGetLastError();
}

cudaError_t ps_cuda_adam(int64_t count, float *w_out, const float *w, const float *g, float *m, float *v,
                         const ps_cuda_adam_args *a, cudaStream_t stream) {
    adam_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, w_out, w, g, m, v, *a);
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

cudaError_t ps_cuda_tri_fill(int64_t count, int64_t rows, int64_t cols, int upper, int64_t diagonal, float value,
                             const float *x, float *y, cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    tri_fill_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, rows, cols, upper, diagonal, value, x, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_cumsum(int64_t outer, int64_t len, int64_t inner, int reverse, int exclusive, const float *x,
                           float *y, cudaStream_t stream) {
    const int64_t lines = outer * inner;
    if (lines <= 0 || len <= 0) return cudaSuccess;
    cumsum_kernel<<<blocks_for(lines), kThreads, 0, stream>>>(lines, len, inner, reverse, exclusive, x, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_im2col(const ps_cuda_cols *g, const float *x, float *col, cudaStream_t stream) {
    const int64_t count = g->n * g->c * g->kh * g->kw * g->oh * g->ow;
    if (count <= 0) return cudaSuccess;
    im2col_kernel<<<blocks_for(count), kThreads, 0, stream>>>(*g, count, x, col);
    return cudaGetLastError();
}

cudaError_t ps_cuda_col2im(const ps_cuda_cols *g, const float *col, float *x, cudaStream_t stream) {
    const int64_t count = g->n * g->c * g->h * g->w;
    if (count <= 0) return cudaSuccess;
    col2im_kernel<<<blocks_for(count), kThreads, 0, stream>>>(*g, count, col, x);
    return cudaGetLastError();
}

cudaError_t ps_cuda_sum_parts(int64_t count, int parts, const float *p, float *y, cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    sum_parts_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, parts, p, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_eq_const(int64_t count, const int64_t *x, int64_t value, float *y, cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    eq_const_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, x, value, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_key_pad(int64_t count, int64_t per, int64_t cols, int additive, const float *mask, float *s,
                            cudaStream_t stream) {
    if (count <= 0) return cudaSuccess;
    key_pad_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, per, cols, additive, mask, s);
    return cudaGetLastError();
}

cudaError_t ps_cuda_rnn_cell_forward(int64_t n, int64_t H, int gru, const float *gx, const float *gh,
                                     const float *h_prev, const float *c_prev, float *h, float *c, float *act,
                                     cudaStream_t stream) {
    const int64_t count = n * H;
    if (count <= 0) return cudaSuccess;
    rnn_cell_forward_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, H, gru, gx, gh, h_prev, c_prev, h, c,
                                                                         act);
    return cudaGetLastError();
}

cudaError_t ps_cuda_rnn_cell_backward(int64_t n, int64_t H, int gru, const float *act, const float *h_prev,
                                      const float *c_prev, const float *c, const float *dh, float *dc, float *dgx,
                                      float *dgh, float *dh_prev, cudaStream_t stream) {
    const int64_t count = n * H;
    if (count <= 0) return cudaSuccess;
    rnn_cell_backward_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, H, gru, act, h_prev, c_prev, c, dh,
                                                                          dc, dgx, dgh, dh_prev);
    return cudaGetLastError();
}

} // extern "C"

/* ---- upsampling (Upsample, ConvTranspose2d's bias) ----
 * backend.h's index rules (ps_resize_nearest, ps_resize_linear), restated
 * for the device in the same float operations. */
namespace {

__device__ int resize_nearest(int o, int in, int out, float scale) {
    if (out == in) return o;
    if (out == 2 * in) return o >> 1;
    const float f = floorf(__fmul_rn((float)o, scale));
    return f < (float)(in - 1) ? (int)f : in - 1;
}

__device__ void resize_linear(int o, int in, int out, float scale, int align_corners, int *i0, int *i1, float *l1) {
    if (out == in) { *i0 = *i1 = o; *l1 = 0.0f; return; }
    float src = align_corners ? __fmul_rn(scale, (float)o) : __fsub_rn(__fmul_rn(scale, __fadd_rn((float)o, 0.5f)), 0.5f);
    if (src < 0.0f) src = 0.0f;
    int i = (int)floorf(src);
    if (i > in - 1) i = in - 1;
    float l = __fsub_rn(src, (float)i);
    *i0 = i;
    *i1 = i < in - 1 ? i + 1 : i;
    *l1 = l < 0.0f ? 0.0f : l > 1.0f ? 1.0f : l;
}

__device__ void resize_taps(const ps_cuda_resize &p, int oy, int ox, int iy[2], int ix[2], float wy[2], float wx[2]) {
    float ly = 0.0f, lx = 0.0f;
    if (p.bilinear) {
        resize_linear(oy, p.h, p.oh, p.scale_h, p.align_corners, &iy[0], &iy[1], &ly);
        resize_linear(ox, p.w, p.ow, p.scale_w, p.align_corners, &ix[0], &ix[1], &lx);
    } else {
        iy[0] = iy[1] = resize_nearest(oy, p.h, p.oh, p.scale_h);
        ix[0] = ix[1] = resize_nearest(ox, p.w, p.ow, p.scale_w);
    }
    wy[0] = __fsub_rn(1.0f, ly);
    wy[1] = ly;
    wx[0] = __fsub_rn(1.0f, lx);
    wx[1] = lx;
}

__global__ void resize_forward_kernel(ps_cuda_resize p, const float *x, float *y) {
    const int64_t n = (int64_t)p.planes * p.oh * p.ow;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int ox = (int)(i % p.ow), oy = (int)(i / p.ow % p.oh);
        const float *xp = x + i / ((int64_t)p.oh * p.ow) * p.h * p.w;
        int iy[2], ix[2];
        float wy[2], wx[2];
        resize_taps(p, oy, ox, iy, ix, wy, wx);
        if (!p.bilinear) { y[i] = xp[(int64_t)iy[0] * p.w + ix[0]]; continue; }
        const float r0 = __fadd_rn(__fmul_rn(wx[0], xp[(int64_t)iy[0] * p.w + ix[0]]),
                                   __fmul_rn(wx[1], xp[(int64_t)iy[0] * p.w + ix[1]]));
        const float r1 = __fadd_rn(__fmul_rn(wx[0], xp[(int64_t)iy[1] * p.w + ix[0]]),
                                   __fmul_rn(wx[1], xp[(int64_t)iy[1] * p.w + ix[1]]));
        y[i] = __fadd_rn(__fmul_rn(wy[0], r0), __fmul_rn(wy[1], r1));
    }
}

/* dx zeroed first; each output adds its share to the inputs it read (as PyTorch's CUDA kernel, atomically). */
__global__ void resize_backward_kernel(ps_cuda_resize p, const float *dy, float *dx) {
    const int64_t n = (int64_t)p.planes * p.oh * p.ow;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int ox = (int)(i % p.ow), oy = (int)(i / p.ow % p.oh);
        float *dxp = dx + i / ((int64_t)p.oh * p.ow) * p.h * p.w;
        int iy[2], ix[2];
        float wy[2], wx[2];
        resize_taps(p, oy, ox, iy, ix, wy, wx);
        if (!p.bilinear) { atomicAdd(dxp + (int64_t)iy[0] * p.w + ix[0], dy[i]); continue; }
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 2; b++)
                atomicAdd(dxp + (int64_t)iy[a] * p.w + ix[b], __fmul_rn(__fmul_rn(wy[a], wx[b]), dy[i]));
    }
}

__global__ void bias_add_kernel(int64_t n, int c, int64_t s, const float *b, float *y) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __fadd_rn(y[i], b[i / s % c]);
}

/* Up to kBiasParts parts of a bias gradient per launch, by value. */
const int kBiasParts = 32;
struct bias_parts {
    int off[kBiasParts], cnt[kBiasParts];
    float *db[kBiasParts];
};

/* planes[b] = the sum in double of plane b's s values (x (planes, s)): one block a plane, each thread a
 * fixed strided subset, then block_sum's fixed tree - deterministic. Reads along s are coalesced. */
__global__ void plane_sum_kernel(int64_t s, const float *x, double *planes) {
    __shared__ double red[kThreads];
    const float *p = x + (int64_t)blockIdx.x * s;
    double acc = 0.0;
    for (int64_t q = threadIdx.x; q < s; q += blockDim.x) acc += p[q];
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) planes[blockIdx.x] = acc;
}

/* db[p][j] = the sum over images off[p] .. off[p] + cnt[p] - 1 of planes[i c + j], in image order: one
 * thread a channel, blockIdx.y the part. */
__global__ void bias_parts_final_kernel(int c, const double *planes, bias_parts bp) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x, p = blockIdx.y;
    if (j >= c) return;
    double acc = 0.0;
    for (int i = bp.off[p]; i < bp.off[p] + bp.cnt[p]; i++) acc += planes[(int64_t)i * c + j];
    bp.db[p][j] = (float)acc;
}

} // namespace

extern "C" {

cudaError_t ps_cuda_resize_forward(const ps_cuda_resize *p, const float *x, float *y, cudaStream_t stream) {
    const int64_t n = (int64_t)p->planes * p->oh * p->ow;
    if (n <= 0) return cudaSuccess;
    resize_forward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(*p, x, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_resize_backward(const ps_cuda_resize *p, const float *dy, float *dx, cudaStream_t stream) {
    const int64_t n = (int64_t)p->planes * p->oh * p->ow;
    cudaError_t e = cudaMemsetAsync(dx, 0, (size_t)p->planes * p->h * p->w * sizeof(float), stream);
    if (e != cudaSuccess || n <= 0) return e;
    resize_backward_kernel<<<blocks_for(n), kThreads, 0, stream>>>(*p, dy, dx);
    return cudaGetLastError();
}

cudaError_t ps_cuda_bias_add(int n, int c, int64_t s, const float *b, float *y, cudaStream_t stream) {
    const int64_t count = (int64_t)n * c * s;
    if (count <= 0) return cudaSuccess;
    bias_add_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, c, s, b, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_bias_grad_parts(int c, int64_t s, const float *dy, int k, const int *off, const int *cnt,
                                    float *const *db, double *planes, cudaStream_t stream) {
    int n = 0;   /* the images any part reads: 0 .. n - 1 */
    for (int p = 0; p < k; p++)
        if (cnt[p] > 0 && off[p] + cnt[p] > n) n = off[p] + cnt[p];
    if (c <= 0 || k <= 0) return cudaSuccess;
    if (n > 0 && s > 0) {
        plane_sum_kernel<<<(unsigned)((int64_t)n * c), kThreads, 0, stream>>>(s, dy, planes);
    } else if (n > 0) {
        cudaError_t e = cudaMemsetAsync(planes, 0, (size_t)n * c * sizeof *planes, stream);
        if (e != cudaSuccess) return e;
    }
    cudaError_t e = cudaGetLastError();
    for (int p0 = 0; e == cudaSuccess && p0 < k; p0 += kBiasParts) {
        bias_parts bp = {};
        const int m = k - p0 < kBiasParts ? k - p0 : kBiasParts;
        for (int p = 0; p < m; p++) {
            bp.off[p] = off[p0 + p];
            bp.cnt[p] = cnt[p0 + p] > 0 ? cnt[p0 + p] : 0;
            bp.db[p] = db[p0 + p];
        }
        bias_parts_final_kernel<<<dim3((unsigned)((c + kThreads - 1) / kThreads), (unsigned)m), kThreads, 0, stream>>>(
            c, planes, bp);
        e = cudaGetLastError();
    }
    return e;
}

cudaError_t ps_cuda_binary_bcast(const ps_cuda_bcast *g, const float *a, const float *b, float *y,
                                 cudaStream_t stream) {
    binary_bcast_kernel<<<blocks_for(g->count), kThreads, 0, stream>>>(*g, a, b, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_binary_bcast_backward(const ps_cuda_bcast *g, int which, const float *a, const float *b,
                                          const float *dy, float *dx, cudaStream_t stream) {
    bcast_split s = {};
    s.op = g->op;
    s.which = which;
    s.kept = s.red = 1;
    for (int k = 0; k < g->nd && k < 5; k++) {
        if (which ? g->sb[k] : g->sa[k]) {
            s.kd[s.nk] = g->dims[k]; s.ky[s.nk] = g->sy[k]; s.ka[s.nk] = g->sa[k]; s.kb[s.nk] = g->sb[k];
            s.nk++;
            s.kept *= g->dims[k];
        } else {
            s.rd[s.nr] = g->dims[k]; s.ry[s.nr] = g->sy[k]; s.ra[s.nr] = g->sa[k]; s.rb[s.nr] = g->sb[k];
            s.nr++;
            s.red *= g->dims[k];
        }
    }
    binary_bcast_backward_kernel<<<blocks_for(s.kept), kThreads, 0, stream>>>(s, a, b, dy, dx);
    return cudaGetLastError();
}

int ps_cuda_sum_squares_parts(int64_t n) {
    unsigned b = blocks_for(n);
    return b > 1024 ? 1024 : (int)b;
}

cudaError_t ps_cuda_sum_squares(int64_t n, const float *x, double *partials, int nparts, double *out,
                                cudaStream_t stream) {
    sum_squares_part_kernel<<<nparts, kThreads, 0, stream>>>(n, x, partials);
    sum_squares_final_kernel<<<1, kThreads, 0, stream>>>(nparts, partials, out);
    return cudaGetLastError();
}

cudaError_t ps_cuda_where(int64_t count, const float *cond, const float *a, float av, const float *b, float bv,
                          float *y, cudaStream_t stream) {
    where_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, cond, a, av, b, bv, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_where_backward(int64_t count, const float *cond, const float *dy, float *da, float *db,
                                   cudaStream_t stream) {
    where_backward_kernel<<<blocks_for(count), kThreads, 0, stream>>>(count, cond, dy, da, db);
    return cudaGetLastError();
}


} // extern "C"

/* ---- spatial transformers (AffineGrid, GridSample) ----
 * backend.h's rules (ps_affgrid_base, ps_gs_source, ps_gs_index), restated
 * for the device in the same float operations. */
namespace {

__device__ float affgrid_base(int k, int size, int align_corners) {
    if (size <= 1) return 0.0f;
    const float step = __fdiv_rn(2.0f, (float)(size - 1));
    float v = k < size / 2 ? __fadd_rn(-1.0f, __fmul_rn(step, (float)k))
                           : __fsub_rn(1.0f, __fmul_rn(step, (float)(size - 1 - k)));
    if (!align_corners) v = __fdiv_rn(__fmul_rn(v, (float)(size - 1)), (float)size);
    return v;
}

__device__ float gs_clip(float in, int size, float *g) {
    if (in <= 0.0f) { *g = 0.0f; return 0.0f; }
    const float max = (float)(size - 1);
    if (in >= max) { *g = 0.0f; return max; }
    *g = 1.0f;
    return in;
}

__device__ float gs_reflect(float in, int twice_low, int twice_high, float *g) {
    if (twice_low == twice_high) { *g = 0.0f; return 0.0f; }
    const float min = (float)twice_low / 2.0f, span = (float)(twice_high - twice_low) / 2.0f;
    float mult = 1.0f;
    in = __fsub_rn(in, min);
    if (in < 0.0f) { mult = -1.0f; in = -in; }
    const float extra = fmodf(in, span);
    const int flips = (int)floorf(__fdiv_rn(in, span));
    if (flips % 2 == 0) { *g = mult; return __fadd_rn(extra, min); }
    *g = -mult;
    return __fadd_rn(__fsub_rn(span, extra), min);
}

__device__ float gs_source(float coord, int size, int padding, int align_corners, float *g) {
    float gc, gr;
    if (align_corners) {
        *g = (float)(size - 1) / 2.0f;
        coord = __fmul_rn(__fdiv_rn(__fadd_rn(coord, 1.0f), 2.0f), (float)(size - 1));
    } else {
        *g = (float)size / 2.0f;
        coord = __fdiv_rn(__fsub_rn(__fmul_rn(__fadd_rn(coord, 1.0f), (float)size), 1.0f), 2.0f);
    }
    if (padding == 1) {
        coord = gs_clip(coord, size, &gc);
        *g = __fmul_rn(*g, gc);
    } else if (padding == 2) {
        coord = align_corners ? gs_reflect(coord, 0, 2 * (size - 1), &gr) : gs_reflect(coord, -1, 2 * size - 1, &gr);
        coord = gs_clip(coord, size, &gc);
        *g = __fmul_rn(__fmul_rn(*g, gr), gc);
    }
    return coord;
}

__device__ int gs_index(float v, int size, int nearest) {
    if (!(v > -2.0f)) return -2;
    if (!(v < (float)size + 1.0f)) return size + 1;
    return (int)(nearest ? nearbyintf(v) : floorf(v));
}

/* One grid point: the top-left (nearest: the) tap, the weights of the second column and row, d index / d grid. */
struct gs_taps {
    int x0, y0;
    float lx, ly, gmx, gmy;
};

__device__ gs_taps gs_point(const ps_cuda_gridsample &p, const float *g) {
    gs_taps t;
    const int nearest = p.mode == 1;
    const float ix = gs_source(g[0], p.w, p.padding, p.align_corners, &t.gmx);
    const float iy = gs_source(g[1], p.h, p.padding, p.align_corners, &t.gmy);
    t.x0 = gs_index(ix, p.w, nearest);
    t.y0 = gs_index(iy, p.h, nearest);
    t.lx = nearest ? 0.0f : __fsub_rn(ix, (float)t.x0);
    t.ly = nearest ? 0.0f : __fsub_rn(iy, (float)t.y0);
    return t;
}

__device__ bool gs_in(const ps_cuda_gridsample &p, int x, int y) { return x >= 0 && x < p.w && y >= 0 && y < p.h; }

__global__ void affine_grid_kernel(int n, int h, int w, int align_corners, const float *theta, float *grid) {
    const int64_t count = (int64_t)n * h * w;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const int xx = (int)(i % w), yy = (int)(i / w % h);
        const float *t = theta + i / ((int64_t)h * w) * 6;
        const float bx = affgrid_base(xx, w, align_corners), by = affgrid_base(yy, h, align_corners);
        grid[i * 2] = __fadd_rn(__fadd_rn(__fmul_rn(t[0], bx), __fmul_rn(t[1], by)), t[2]);
        grid[i * 2 + 1] = __fadd_rn(__fadd_rn(__fmul_rn(t[3], bx), __fmul_rn(t[4], by)), t[5]);
    }
}

/* One thread per (sample, theta entry): the sum over the sample's points, in double. */
__global__ void affine_grid_backward_kernel(int n, int h, int w, int align_corners, const float *dgrid,
                                            float *dtheta) {
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < (int64_t)n * 6;
         j += (int64_t)gridDim.x * blockDim.x) {
        const int r = (int)(j % 6) / 3, col = (int)(j % 6) % 3;
        const float *g = dgrid + j / 6 * (int64_t)h * w * 2;
        double acc = 0.0;
        for (int yy = 0; yy < h; yy++) {
            const float by = affgrid_base(yy, h, align_corners);
            for (int xx = 0; xx < w; xx++) {
                const float b = col == 0 ? affgrid_base(xx, w, align_corners) : col == 1 ? by : 1.0f;
                acc += (double)g[((int64_t)yy * w + xx) * 2 + r] * b;
            }
        }
        dtheta[j] = (float)acc;
    }
}

__device__ float gs_tap(const ps_cuda_gridsample &p, const float *plane, int x, int y) {
    return gs_in(p, x, y) ? plane[(int64_t)y * p.w + x] : 0.0f;
}

__global__ void grid_sample_kernel(ps_cuda_gridsample p, const float *x, const float *grid, float *y) {
    const int64_t out = (int64_t)p.oh * p.ow, count = (int64_t)p.n * p.c * out;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < count; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t q = k % out, ic = k / out, i = ic / p.c;
        const gs_taps t = gs_point(p, grid + (i * out + q) * 2);
        const float *plane = x + ic * p.h * p.w;
        if (p.mode == 1) { y[k] = gs_tap(p, plane, t.x0, t.y0); continue; }
        const float r0 = __fadd_rn(__fmul_rn(__fsub_rn(1.0f, t.lx), gs_tap(p, plane, t.x0, t.y0)),
                                   __fmul_rn(t.lx, gs_tap(p, plane, t.x0 + 1, t.y0)));
        const float r1 = __fadd_rn(__fmul_rn(__fsub_rn(1.0f, t.lx), gs_tap(p, plane, t.x0, t.y0 + 1)),
                                   __fmul_rn(t.lx, gs_tap(p, plane, t.x0 + 1, t.y0 + 1)));
        y[k] = __fadd_rn(__fmul_rn(__fsub_rn(1.0f, t.ly), r0), __fmul_rn(t.ly, r1));
    }
}

/* One thread per (sample, grid point), over the channels: dx atomically, dgrid written. */
__global__ void grid_sample_backward_kernel(ps_cuda_gridsample p, const float *x, const float *grid, const float *dy,
                                            float *dx, float *dgrid) {
    const int64_t out = (int64_t)p.oh * p.ow, count = (int64_t)p.n * out, in = (int64_t)p.h * p.w;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < count; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t q = k % out, i = k / out;
        const gs_taps t = gs_point(p, grid + k * 2);
        const float wx[2] = {__fsub_rn(1.0f, t.lx), t.lx}, wy[2] = {__fsub_rn(1.0f, t.ly), t.ly};
        float gx = 0.0f, gy = 0.0f;
        for (int c = 0; c < p.c; c++) {
            const int64_t ic = i * p.c + c;
            const float go = dy[ic * out + q];
            const float *plane = x + ic * in;
            if (dx) {
                const int taps = p.mode == 1 ? 1 : 2;
                for (int a = 0; a < taps; a++)
                    for (int b = 0; b < taps; b++)
                        if (gs_in(p, t.x0 + b, t.y0 + a))
                            atomicAdd(dx + ic * in + (int64_t)(t.y0 + a) * p.w + t.x0 + b,
                                      __fmul_rn(__fmul_rn(wy[a], wx[b]), go));
            }
            if (p.mode == 1 || !dgrid) continue;
            const float nw = gs_tap(p, plane, t.x0, t.y0), ne = gs_tap(p, plane, t.x0 + 1, t.y0),
                        sw = gs_tap(p, plane, t.x0, t.y0 + 1), se = gs_tap(p, plane, t.x0 + 1, t.y0 + 1);
            gx += ((ne - nw) * wy[0] + (se - sw) * wy[1]) * go;
            gy += ((sw - nw) * wx[0] + (se - ne) * wx[1]) * go;
        }
        if (dgrid) {
            dgrid[k * 2] = __fmul_rn(gx, t.gmx);
            dgrid[k * 2 + 1] = __fmul_rn(gy, t.gmy);
        }
    }
}

} // namespace

extern "C" {

cudaError_t ps_cuda_affine_grid(int n, int h, int w, int align_corners, const float *theta, float *grid,
                                cudaStream_t stream) {
    const int64_t count = (int64_t)n * h * w;
    if (count <= 0) return cudaSuccess;
    affine_grid_kernel<<<blocks_for(count), kThreads, 0, stream>>>(n, h, w, align_corners, theta, grid);
    return cudaGetLastError();
}

cudaError_t ps_cuda_affine_grid_backward(int n, int h, int w, int align_corners, const float *dgrid, float *dtheta,
                                         cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    affine_grid_backward_kernel<<<blocks_for((int64_t)n * 6), kThreads, 0, stream>>>(n, h, w, align_corners, dgrid,
                                                                                    dtheta);
    return cudaGetLastError();
}

cudaError_t ps_cuda_grid_sample(const ps_cuda_gridsample *p, const float *x, const float *grid, float *y,
                                cudaStream_t stream) {
    const int64_t count = (int64_t)p->n * p->c * p->oh * p->ow;
    if (count <= 0) return cudaSuccess;
    grid_sample_kernel<<<blocks_for(count), kThreads, 0, stream>>>(*p, x, grid, y);
    return cudaGetLastError();
}

cudaError_t ps_cuda_grid_sample_backward(const ps_cuda_gridsample *p, const float *x, const float *grid,
                                         const float *dy, float *dx, float *dgrid, cudaStream_t stream) {
    const int64_t count = (int64_t)p->n * p->oh * p->ow;
    if (dx) {
        const cudaError_t e = cudaMemsetAsync(dx, 0, (size_t)p->n * p->c * p->h * p->w * sizeof(float), stream);
        if (e != cudaSuccess) return e;
    }
    if (count <= 0) return cudaSuccess;
    grid_sample_backward_kernel<<<blocks_for(count), kThreads, 0, stream>>>(*p, x, grid, dy, dx, dgrid);
    return cudaGetLastError();
}

} // extern "C"
