/* backend_ref.c - the reference backend: plain single-threaded C loops.
 *
 * Slow and obviously correct; the tests' ground truth for every other
 * backend. Semantics follow PyTorch (CPU): sums are accumulated in double,
 * max-pool ties go to the first maximum in row-major window order (a NaN
 * wins, as in PyTorch), log-softmax subtracts the row maximum, SGD is
 * computed in float exactly as ps_sgd_desc documents. Memory is host memory
 * from aligned_alloc(64); copies are memcpy. There is no state: impl is NULL,
 * so every op is trivially safe to call concurrently.
 */
#include "backend_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static ps_status ref_init(void **impl, int device, int nthreads, ps_err *err) {
    (void)device; (void)nthreads; (void)err;
    *impl = NULL;
    return PS_OK;
}

static void ref_destroy(void *impl) { (void)impl; }

static void *ref_alloc(void *impl, size_t bytes) {
    (void)impl;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL; /* overflow */
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void ref_free(void *impl, void *p) { (void)impl; free(p); }

static ps_status ref_copy(void *impl, void *dst, const void *src, size_t bytes, ps_err *err) {
    (void)impl; (void)err;
    if (bytes) memcpy(dst, src, bytes);
    return PS_OK;
}

/* ---- convolution ---- */

static ps_status ref_conv2d_forward(void *impl, const ps_conv_desc *d, const float *x,
                                    const float *w, const float *b, float *y, ps_err *err) {
    (void)impl; (void)err;
    const int oh = ps_conv_out_h(d), ow = ps_conv_out_w(d);
    for (int n = 0; n < d->n; n++)
        for (int co = 0; co < d->cout; co++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double acc = b ? b[co] : 0.0;
                    for (int ci = 0; ci < d->cin; ci++)
                        for (int ky = 0; ky < d->kh; ky++) {
                            int iy = oy * d->stride - d->pad + ky;
                            if (iy < 0 || iy >= d->h) continue;
                            for (int kx = 0; kx < d->kw; kx++) {
                                int ix = ox * d->stride - d->pad + kx;
                                if (ix < 0 || ix >= d->w) continue;
                                acc += (double)x[(((size_t)n * d->cin + ci) * d->h + iy) * d->w + ix] *
                                       w[(((size_t)co * d->cin + ci) * d->kh + ky) * d->kw + kx];
                            }
                        }
                    y[(((size_t)n * d->cout + co) * oh + oy) * ow + ox] = (float)acc;
                }
    return PS_OK;
}

static ps_status ref_conv2d_backward(void *impl, const ps_conv_desc *d, const float *x,
                                     const float *w, const float *dy, float *dx, float *dw,
                                     float *db, ps_err *err) {
    (void)impl; (void)err;
    const int oh = ps_conv_out_h(d), ow = ps_conv_out_w(d);
    const size_t xsz = (size_t)d->n * d->cin * d->h * d->w;
    const size_t wsz = (size_t)d->cout * d->cin * d->kh * d->kw;
    double *dxa = dx ? calloc(xsz, sizeof *dxa) : NULL;
    double *dwa = dw ? calloc(wsz, sizeof *dwa) : NULL;
    if ((dx && !dxa) || (dw && !dwa)) {
        free(dxa); free(dwa);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ref conv2d_backward: out of memory");
    }
    for (int co = 0; co < d->cout; co++) {
        double acc = 0.0;
        for (int n = 0; n < d->n; n++)
            for (int i = 0; i < oh * ow; i++)
                acc += dy[((size_t)n * d->cout + co) * oh * ow + i];
        if (db) db[co] = (float)acc;
    }
    for (int n = 0; n < d->n; n++)
        for (int co = 0; co < d->cout; co++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double g = dy[(((size_t)n * d->cout + co) * oh + oy) * ow + ox];
                    for (int ci = 0; ci < d->cin; ci++)
                        for (int ky = 0; ky < d->kh; ky++) {
                            int iy = oy * d->stride - d->pad + ky;
                            if (iy < 0 || iy >= d->h) continue;
                            for (int kx = 0; kx < d->kw; kx++) {
                                int ix = ox * d->stride - d->pad + kx;
                                if (ix < 0 || ix >= d->w) continue;
                                size_t xi = (((size_t)n * d->cin + ci) * d->h + iy) * d->w + ix;
                                size_t wi = (((size_t)co * d->cin + ci) * d->kh + ky) * d->kw + kx;
                                if (dwa) dwa[wi] += g * x[xi];
                                if (dxa) dxa[xi] += g * w[wi];
                            }
                        }
                }
    if (dw)
        for (size_t i = 0; i < wsz; i++) dw[i] = (float)dwa[i];
    if (dx)
        for (size_t i = 0; i < xsz; i++) dx[i] = (float)dxa[i];
    free(dxa);
    free(dwa);
    return PS_OK;
}

/* ---- relu ---- */

static ps_status ref_relu_forward(void *impl, int64_t count, const float *x, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++)
        y[i] = (x[i] > 0.0f || isnan(x[i])) ? x[i] : 0.0f;
    return PS_OK;
}

static ps_status ref_relu_backward(void *impl, int64_t count, const float *y, const float *dy,
                                   float *dx, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++)
        dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    return PS_OK;
}

/* ---- max pooling: workspace = int32 flat index (iy*w+ix) per output ---- */

static size_t ref_maxpool_workspace_size(void *impl, const ps_pool_desc *d) {
    (void)impl;
    return (size_t)d->n * d->c * ps_pool_out_h(d) * ps_pool_out_w(d) * sizeof(int32_t);
}

static ps_status ref_maxpool_forward(void *impl, const ps_pool_desc *d, const float *x, float *y,
                                     void *workspace, ps_err *err) {
    (void)impl; (void)err;
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d);
    int32_t *idx = workspace;
    for (size_t p = 0; p < (size_t)d->n * d->c; p++) {
        const float *xp = x + p * d->h * d->w;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                int best = (oy * d->stride) * d->w + ox * d->stride;
                float m = xp[best];
                for (int ky = 0; ky < d->k; ky++)
                    for (int kx = 0; kx < d->k; kx++) {
                        int i = (oy * d->stride + ky) * d->w + ox * d->stride + kx;
                        if (xp[i] > m || isnan(xp[i])) {
                            m = xp[i];
                            best = i;
                        }
                    }
                size_t o = (p * oh + oy) * ow + ox;
                y[o] = m;
                if (idx) idx[o] = best;
            }
    }
    return PS_OK;
}

static ps_status ref_maxpool_backward(void *impl, const ps_pool_desc *d, const void *workspace,
                                      const float *dy, float *dx, ps_err *err) {
    (void)impl; (void)err;
    const int oh = ps_pool_out_h(d), ow = ps_pool_out_w(d);
    const int32_t *idx = workspace;
    memset(dx, 0, (size_t)d->n * d->c * d->h * d->w * sizeof *dx);
    for (size_t p = 0; p < (size_t)d->n * d->c; p++)
        for (int o = 0; o < oh * ow; o++)
            dx[p * d->h * d->w + idx[p * oh * ow + o]] += dy[p * oh * ow + o];
    return PS_OK;
}

/* ---- linear ---- */

static ps_status ref_linear_forward(void *impl, const ps_linear_desc *d, const float *x,
                                    const float *w, const float *b, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int n = 0; n < d->n; n++)
        for (int o = 0; o < d->out; o++) {
            double acc = b ? b[o] : 0.0;
            for (int i = 0; i < d->in; i++)
                acc += (double)x[(size_t)n * d->in + i] * w[(size_t)o * d->in + i];
            y[(size_t)n * d->out + o] = (float)acc;
        }
    return PS_OK;
}

static ps_status ref_linear_backward(void *impl, const ps_linear_desc *d, const float *x,
                                     const float *w, const float *dy, float *dx, float *dw,
                                     float *db, ps_err *err) {
    (void)impl; (void)err;
    if (dx)
        for (int n = 0; n < d->n; n++)
            for (int i = 0; i < d->in; i++) {
                double acc = 0.0;
                for (int o = 0; o < d->out; o++)
                    acc += (double)dy[(size_t)n * d->out + o] * w[(size_t)o * d->in + i];
                dx[(size_t)n * d->in + i] = (float)acc;
            }
    for (int o = 0; o < d->out; o++) {
        for (int i = 0; dw && i < d->in; i++) {
            double acc = 0.0;
            for (int n = 0; n < d->n; n++)
                acc += (double)dy[(size_t)n * d->out + o] * x[(size_t)n * d->in + i];
            dw[(size_t)o * d->in + i] = (float)acc;
        }
        if (db) {
            double acc = 0.0;
            for (int n = 0; n < d->n; n++) acc += dy[(size_t)n * d->out + o];
            db[o] = (float)acc;
        }
    }
    return PS_OK;
}

/* ---- log-softmax ---- */

static ps_status ref_log_softmax_forward(void *impl, int rows, int cols, const float *x, float *y,
                                         ps_err *err) {
    (void)impl; (void)err;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * cols;
        float *yr = y + (size_t)r * cols;
        double m = -INFINITY;
        for (int c = 0; c < cols; c++)
            if (xr[c] > m) m = xr[c];
        double s = 0.0;
        for (int c = 0; c < cols; c++) s += exp(xr[c] - m);
        double lse = m + log(s);
        for (int c = 0; c < cols; c++) yr[c] = (float)(xr[c] - lse);
    }
    return PS_OK;
}

static ps_status ref_log_softmax_backward(void *impl, int rows, int cols, const float *y,
                                          const float *dy, float *dx, ps_err *err) {
    (void)impl; (void)err;
    for (int r = 0; r < rows; r++) {
        const float *yr = y + (size_t)r * cols, *dyr = dy + (size_t)r * cols;
        float *dxr = dx + (size_t)r * cols;
        double s = 0.0;
        for (int c = 0; c < cols; c++) s += dyr[c];
        for (int c = 0; c < cols; c++) dxr[c] = (float)(dyr[c] - exp(yr[c]) * s);
    }
    return PS_OK;
}

/* ---- elementwise ---- */

static ps_status ref_mul(void *impl, int64_t count, const float *x, const float *mask, float *y,
                         ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) y[i] = x[i] * mask[i];
    return PS_OK;
}

static ps_status ref_sgd_update(void *impl, int64_t count, float *w, const float *g, float *buf,
                                const ps_sgd_desc *s, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) {
        float gi = g[i];
        if (s->weight_decay != 0.0f) gi += s->weight_decay * w[i];
        if (s->momentum != 0.0f) {
            buf[i] = s->first_step ? gi : s->momentum * buf[i] + gi;
            gi = buf[i];
        }
        w[i] -= s->lr * gi;
    }
    return PS_OK;
}

static ps_status ref_add(void *impl, int64_t count, float *dst, const float *src, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) dst[i] += src[i];
    return PS_OK;
}

/* ---- optimizers ---- */

/* Adam on one element, as ps_adam_desc documents (torch.optim.Adam). */
static inline void ref_adam_one(float *w, float g, float *m, float *v, const ps_adam_scalars *s) {
    if (s->weight_decay != 0.0f) g = g + s->weight_decay * *w;
    *m = s->beta1 * *m + s->one_minus_beta1 * g;
    *v = s->beta2 * *v + s->one_minus_beta2 * (g * g);
    const float denom = sqrtf(*v) / s->bc2_sqrt + s->eps;
    *w = *w + (-s->step_size) * (*m / denom);
}

/* SparseAdam on one element of a touched row (torch.optim.SparseAdam). */
static inline void ref_sparse_adam_one(float *w, float g, float *m, float *v, const ps_adam_scalars *s) {
    const float m_old = *m, v_old = *v;
    const float m_upd = (g - m_old) * s->one_minus_beta1;
    const float v_upd = (g * g - v_old) * s->one_minus_beta2;
    *m = m_old + m_upd;
    *v = v_old + v_upd;
    const float numer = m_upd + m_old, denom = sqrtf(v_upd + v_old) + s->eps;
    *w = *w + (-s->step_size_sp) * (numer / denom);
}

static ps_status ref_adam_update(void *impl, int64_t count, float *w, const float *g, float *m, float *v,
                                 const ps_adam_desc *d, ps_err *err) {
    (void)impl; (void)err;
    const ps_adam_scalars s = ps_adam_scalars_of(d);
    for (int64_t i = 0; i < count; i++) ref_adam_one(&w[i], g[i], &m[i], &v[i], &s);
    return PS_OK;
}

static ps_status ref_sgd_update_rows(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                     const float *g_rows, float lr, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t r = 0; r < nrows; r++) {
        float *wr = w + rows[r] * width;
        const float *gr = g_rows + r * width;
        for (int64_t j = 0; j < width; j++) wr[j] -= lr * gr[j];
    }
    return PS_OK;
}

static ps_status ref_adam_update_rows(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                      const float *g_rows, float *m, float *v, const ps_adam_desc *d,
                                      ps_err *err) {
    (void)impl; (void)err;
    const ps_adam_scalars s = ps_adam_scalars_of(d);
    for (int64_t r = 0; r < nrows; r++) {
        const int64_t o = rows[r] * width;
        for (int64_t j = 0; j < width; j++)
            ref_sparse_adam_one(&w[o + j], g_rows[r * width + j], &m[o + j], &v[o + j], &s);
    }
    return PS_OK;
}

/* Softmax over each row, max-shifted: y = exp(x - max) / sum exp(x - max). */
static ps_status ref_softmax_forward(void *impl, int64_t rows, int cols, const float *x, float *y,
                                     ps_err *err) {
    (void)impl; (void)err;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float mx = xr[0];
        for (int j = 1; j < cols; j++) if (xr[j] > mx) mx = xr[j];
        double sum = 0;
        for (int j = 0; j < cols; j++) { yr[j] = expf(xr[j] - mx); sum += yr[j]; }
        for (int j = 0; j < cols; j++) yr[j] = (float)(yr[j] / sum);
    }
    return PS_OK;
}

static ps_status ref_softmax_backward(void *impl, int64_t rows, int cols, const float *y,
                                      const float *dy, float *dx, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * cols, *dyr = dy + r * cols;
        float *dxr = dx + r * cols;
        double dot = 0;
        for (int j = 0; j < cols; j++) dot += (double)dyr[j] * yr[j];
        for (int j = 0; j < cols; j++) dxr[j] = yr[j] * (dyr[j] - (float)dot);
    }
    return PS_OK;
}

static ps_status ref_embedding_forward(void *impl, int64_t n, int dim, const int64_t *ids,
                                       const float *w, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < n; i++) memcpy(y + i * dim, w + ids[i] * dim, (size_t)dim * sizeof(float));
    return PS_OK;
}

static ps_status ref_embedding_backward(void *impl, int64_t n, int dim, const int64_t *slot,
                                        const float *dy, int64_t nrows, float *grows, ps_err *err) {
    (void)impl; (void)err;
    memset(grows, 0, (size_t)nrows * dim * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) grows[slot[i] * dim + j] += dy[i * dim + j];
    return PS_OK;
}

static ps_status ref_scale(void *impl, int64_t count, float *x, float s, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) x[i] *= s;
    return PS_OK;
}

const ps_backend_ops ps_backend_ref_ops = {
    .name = "ref",
    .init = ref_init,
    .destroy = ref_destroy,
    .alloc = ref_alloc,
    .free = ref_free,
    .copy_to_device = ref_copy,
    .copy_to_host = ref_copy,
    .conv2d_forward = ref_conv2d_forward,
    .conv2d_backward = ref_conv2d_backward,
    .relu_forward = ref_relu_forward,
    .relu_backward = ref_relu_backward,
    .maxpool_workspace_size = ref_maxpool_workspace_size,
    .maxpool_forward = ref_maxpool_forward,
    .maxpool_backward = ref_maxpool_backward,
    .linear_forward = ref_linear_forward,
    .linear_backward = ref_linear_backward,
    .log_softmax_forward = ref_log_softmax_forward,
    .log_softmax_backward = ref_log_softmax_backward,
    .mul = ref_mul,
    .sgd_update = ref_sgd_update,
    .add = ref_add,
    .softmax_forward = ref_softmax_forward,
    .softmax_backward = ref_softmax_backward,
    .embedding_forward = ref_embedding_forward,
    .embedding_backward = ref_embedding_backward,
    .scale = ref_scale,
    .adam_update = ref_adam_update,
    .sgd_update_rows = ref_sgd_update_rows,
    .adam_update_rows = ref_adam_update_rows,
};
