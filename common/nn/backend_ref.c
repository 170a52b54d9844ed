/* backend_ref.c - the reference backend: plain single-threaded C loops.
 *
 * Slow and obviously correct; the tests' ground truth for every other
 * backend. Semantics follow PyTorch (CPU): sums are accumulated in double,
 * max-pool ties go to the first maximum in row-major window order (a NaN
 * wins, as in PyTorch), log-softmax subtracts the row maximum, SGD is
 * computed in float exactly as ps_sgd_desc documents; normalisations and
 * activations are computed in double and rounded once. Only plain layouts
 * (no blocked_layout). Memory is host memory
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

/* ---- convolution (general form: strides, padding, dilation, groups) ---- */

static ps_status ref_conv2d_forward(void *impl, const ps_conv_desc *desc, const float *x,
                                    const float *w, const float *b, float *y, ps_err *err) {
    (void)impl; (void)err;
    const ps_conv_desc d = ps_conv_resolve(desc);
    const int oh = ps_conv_out_h(&d), ow = ps_conv_out_w(&d);
    const int cig = d.cin / d.groups, cog = d.cout / d.groups;
    for (int n = 0; n < d.n; n++)
        for (int co = 0; co < d.cout; co++) {
            const int g = co / cog;
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double acc = b ? b[co] : 0.0;
                    for (int cj = 0; cj < cig; cj++) {
                        const int ci = g * cig + cj;
                        for (int ky = 0; ky < d.kh; ky++) {
                            int iy = oy * d.stride_h - d.pad_h + ky * d.dil_h;
                            if (iy < 0 || iy >= d.h) continue;
                            for (int kx = 0; kx < d.kw; kx++) {
                                int ix = ox * d.stride_w - d.pad_w + kx * d.dil_w;
                                if (ix < 0 || ix >= d.w) continue;
                                acc += (double)x[(((size_t)n * d.cin + ci) * d.h + iy) * d.w + ix] *
                                       w[(((size_t)co * cig + cj) * d.kh + ky) * d.kw + kx];
                            }
                        }
                    }
                    y[(((size_t)n * d.cout + co) * oh + oy) * ow + ox] = (float)acc;
                }
        }
    return PS_OK;
}

static ps_status ref_conv2d_backward(void *impl, const ps_conv_desc *desc, const float *x,
                                     const float *w, const float *dy, float *dx, float *dw,
                                     float *db, ps_err *err) {
    (void)impl; (void)err;
    const ps_conv_desc d = ps_conv_resolve(desc);
    const int oh = ps_conv_out_h(&d), ow = ps_conv_out_w(&d);
    const int cig = d.cin / d.groups, cog = d.cout / d.groups;
    const size_t xsz = (size_t)d.n * d.cin * d.h * d.w;
    const size_t wsz = (size_t)ps_conv_weight_count(&d);
    double *dxa = dx ? calloc(xsz, sizeof *dxa) : NULL;
    double *dwa = dw ? calloc(wsz, sizeof *dwa) : NULL;
    if ((dx && !dxa) || (dw && !dwa)) {
        free(dxa); free(dwa);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ref conv2d_backward: out of memory");
    }
    for (int co = 0; co < d.cout; co++) {
        double acc = 0.0;
        for (int n = 0; n < d.n; n++)
            for (int i = 0; i < oh * ow; i++)
                acc += dy[((size_t)n * d.cout + co) * oh * ow + i];
        if (db) db[co] = (float)acc;
    }
    for (int n = 0; n < d.n; n++)
        for (int co = 0; co < d.cout; co++) {
            const int g = co / cog;
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double gv = dy[(((size_t)n * d.cout + co) * oh + oy) * ow + ox];
                    for (int cj = 0; cj < cig; cj++) {
                        const int ci = g * cig + cj;
                        for (int ky = 0; ky < d.kh; ky++) {
                            int iy = oy * d.stride_h - d.pad_h + ky * d.dil_h;
                            if (iy < 0 || iy >= d.h) continue;
                            for (int kx = 0; kx < d.kw; kx++) {
                                int ix = ox * d.stride_w - d.pad_w + kx * d.dil_w;
                                if (ix < 0 || ix >= d.w) continue;
                                size_t xi = (((size_t)n * d.cin + ci) * d.h + iy) * d.w + ix;
                                size_t wi = (((size_t)co * cig + cj) * d.kh + ky) * d.kw + kx;
                                if (dwa) dwa[wi] += gv * x[xi];
                                if (dxa) dxa[xi] += gv * w[wi];
                            }
                        }
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

/* ---- pooling: max-pool workspace = int32 flat index (iy*w+ix) per output ---- */

static size_t ref_maxpool_workspace_size(void *impl, const ps_pool_desc *d) {
    (void)impl;
    return (size_t)d->n * d->c * ps_pool_out_h(d) * ps_pool_out_w(d) * sizeof(int32_t);
}

/* Window of output (oy, ox) clipped to the input: rows [*y0, *y1), cols
 * [*x0, *x1); returns PyTorch's count_include_pad divisor (the window
 * clipped to the padded input: kh*kw with ceil_mode off). */
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

static ps_status ref_maxpool_forward(void *impl, const ps_pool_desc *desc, const float *x, float *y,
                                     void *workspace, ps_err *err) {
    (void)impl; (void)err;
    const ps_pool_desc d = ps_pool_resolve(desc);
    const int oh = ps_pool_out_h(&d), ow = ps_pool_out_w(&d);
    int32_t *idx = workspace;
    for (size_t p = 0; p < (size_t)d.n * d.c; p++) {
        const float *xp = x + p * d.h * d.w;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                int y0, y1, x0, x1;
                pool_window(&d, oy, ox, &y0, &y1, &x0, &x1);
                /* As PyTorch: start at -inf with the first position; a
                 * larger value or a NaN takes over. */
                int best = y0 * d.w + x0;
                float m = -INFINITY;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) {
                        int i = iy * d.w + ix;
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

static ps_status ref_maxpool_backward(void *impl, const ps_pool_desc *desc, const void *workspace,
                                      const float *dy, float *dx, ps_err *err) {
    (void)impl; (void)err;
    const ps_pool_desc d = ps_pool_resolve(desc);
    const int oh = ps_pool_out_h(&d), ow = ps_pool_out_w(&d);
    const int32_t *idx = workspace;
    memset(dx, 0, (size_t)d.n * d.c * d.h * d.w * sizeof *dx);
    for (size_t p = 0; p < (size_t)d.n * d.c; p++)
        for (int o = 0; o < oh * ow; o++)
            dx[p * d.h * d.w + idx[p * oh * ow + o]] += dy[p * oh * ow + o];
    return PS_OK;
}

static ps_status ref_avgpool_forward(void *impl, const ps_pool_desc *desc, const float *x, float *y,
                                     ps_err *err) {
    (void)impl; (void)err;
    const ps_pool_desc d = ps_pool_resolve(desc);
    const int oh = ps_pool_out_h(&d), ow = ps_pool_out_w(&d);
    for (size_t p = 0; p < (size_t)d.n * d.c; p++) {
        const float *xp = x + p * d.h * d.w;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                int y0, y1, x0, x1;
                const int padded = pool_window(&d, oy, ox, &y0, &y1, &x0, &x1);
                const int div = d.count_include_pad ? padded : (y1 - y0) * (x1 - x0);
                double acc = 0.0;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) acc += xp[iy * d.w + ix];
                y[(p * oh + oy) * ow + ox] = (float)(acc / div);
            }
    }
    return PS_OK;
}

static ps_status ref_avgpool_backward(void *impl, const ps_pool_desc *desc, const float *dy, float *dx,
                                      ps_err *err) {
    (void)impl;
    const ps_pool_desc d = ps_pool_resolve(desc);
    const int oh = ps_pool_out_h(&d), ow = ps_pool_out_w(&d);
    const size_t plane = (size_t)d.h * d.w;
    double *acc = calloc(plane, sizeof *acc);
    if (!acc) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ref avgpool_backward: out of memory");
    for (size_t p = 0; p < (size_t)d.n * d.c; p++) {
        memset(acc, 0, plane * sizeof *acc);
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                int y0, y1, x0, x1;
                const int padded = pool_window(&d, oy, ox, &y0, &y1, &x0, &x1);
                const int div = d.count_include_pad ? padded : (y1 - y0) * (x1 - x0);
                const double g = (double)dy[(p * oh + oy) * ow + ox] / div;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) acc[iy * d.w + ix] += g;
            }
        for (size_t i = 0; i < plane; i++) dx[p * plane + i] = (float)acc[i];
    }
    free(acc);
    return PS_OK;
}

/* Adaptive average pooling: PyTorch's bins (ps_adaptive_desc), sums in double. */
static ps_status ref_adaptive_avgpool_forward(void *impl, const ps_adaptive_desc *d, const float *x, float *y,
                                              ps_err *err) {
    (void)impl; (void)err;
    for (size_t p = 0; p < (size_t)d->n * d->c; p++) {
        const float *xp = x + p * d->h * d->w;
        for (int oy = 0; oy < d->oh; oy++) {
            const int y0 = ps_adaptive_start(oy, d->h, d->oh), y1 = ps_adaptive_end(oy, d->h, d->oh);
            for (int ox = 0; ox < d->ow; ox++) {
                const int x0 = ps_adaptive_start(ox, d->w, d->ow), x1 = ps_adaptive_end(ox, d->w, d->ow);
                double acc = 0.0;
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) acc += xp[iy * d->w + ix];
                y[(p * d->oh + oy) * d->ow + ox] = (float)(acc / ((y1 - y0) * (x1 - x0)));
            }
        }
    }
    return PS_OK;
}

static ps_status ref_adaptive_avgpool_backward(void *impl, const ps_adaptive_desc *d, const float *dy, float *dx,
                                               ps_err *err) {
    (void)impl;
    const size_t plane = (size_t)d->h * d->w;
    double *acc = calloc(plane ? plane : 1, sizeof *acc);
    if (!acc) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ref adaptive_avgpool_backward: out of memory");
    for (size_t p = 0; p < (size_t)d->n * d->c; p++) {
        memset(acc, 0, plane * sizeof *acc);
        for (int oy = 0; oy < d->oh; oy++) {
            const int y0 = ps_adaptive_start(oy, d->h, d->oh), y1 = ps_adaptive_end(oy, d->h, d->oh);
            for (int ox = 0; ox < d->ow; ox++) {
                const int x0 = ps_adaptive_start(ox, d->w, d->ow), x1 = ps_adaptive_end(ox, d->w, d->ow);
                const double g = (double)dy[(p * d->oh + oy) * d->ow + ox] / ((y1 - y0) * (x1 - x0));
                for (int iy = y0; iy < y1; iy++)
                    for (int ix = x0; ix < x1; ix++) acc[iy * d->w + ix] += g;
            }
        }
        for (size_t i = 0; i < plane; i++) dx[p * plane + i] = (float)acc[i];
    }
    free(acc);
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

static ps_status ref_sgd_update(void *impl, int64_t count, float *w_out, const float *w, const float *g,
                                float *buf, const ps_sgd_desc *s, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) {
        float gi = g[i];
        if (s->weight_decay != 0.0f) gi += s->weight_decay * w[i];
        if (s->momentum != 0.0f) {
            buf[i] = s->first_step ? gi : s->momentum * buf[i] + gi;
            gi = buf[i];
        }
        w_out[i] = w[i] - s->lr * gi;
    }
    return PS_OK;
}

static ps_status ref_add(void *impl, int64_t count, float *dst, const float *src, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) dst[i] += src[i];
    return PS_OK;
}

/* ---- optimizers ---- */

/* Adam on one element, as ps_adam_desc documents (torch.optim.Adam): w
 * updated into *w_out. */
static inline void ref_adam_one(float *w_out, float w, float g, float *m, float *v, const ps_adam_scalars *s) {
    if (s->weight_decay != 0.0f) g = g + s->weight_decay * w;
    *m = s->beta1 * *m + s->one_minus_beta1 * g;
    *v = s->beta2 * *v + s->one_minus_beta2 * (g * g);
    const float denom = sqrtf(*v) / s->bc2_sqrt + s->eps;
    *w_out = w + (-s->step_size) * (*m / denom);
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

static ps_status ref_adam_update(void *impl, int64_t count, float *w_out, const float *w, const float *g, float *m,
                                 float *v, const ps_adam_desc *d, ps_err *err) {
    (void)impl; (void)err;
    const ps_adam_scalars s = ps_adam_scalars_of(d);
    for (int64_t i = 0; i < count; i++) ref_adam_one(&w_out[i], w[i], g[i], &m[i], &v[i], &s);
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

/* ---- batch normalisation (plain layout: element (i, j, p) at (i*c + j)*s + p) ---- */

static ps_status ref_bn_forward_training(void *impl, const ps_chan_desc *d, const float *x, const float *gamma,
                                         const float *beta, float *y, float *mean, float *invstd,
                                         float *var_unbiased, ps_err *err) {
    (void)impl; (void)err;
    const double m = (double)d->n * d->s;
    for (int j = 0; j < d->c; j++) {
        double sum = 0.0, sq = 0.0;
        for (int i = 0; i < d->n; i++)
            for (int64_t p = 0; p < d->s; p++) sum += x[((int64_t)i * d->c + j) * d->s + p];
        const double mu = sum / m;
        for (int i = 0; i < d->n; i++)
            for (int64_t p = 0; p < d->s; p++) {
                const double t = x[((int64_t)i * d->c + j) * d->s + p] - mu;
                sq += t * t;
            }
        const double var = sq / m, is = 1.0 / sqrt(var + d->eps);
        const double g = gamma ? gamma[j] : 1.0, bb = beta ? beta[j] : 0.0;
        for (int i = 0; i < d->n; i++)
            for (int64_t p = 0; p < d->s; p++) {
                const int64_t o = ((int64_t)i * d->c + j) * d->s + p;
                y[o] = (float)((x[o] - mu) * is * g + bb);
            }
        mean[j] = (float)mu;
        invstd[j] = (float)is;
        if (var_unbiased) var_unbiased[j] = (float)(sq / (m - 1.0));
    }
    return PS_OK;
}

static ps_status ref_bn_forward_inference(void *impl, const ps_chan_desc *d, const float *x, const float *gamma,
                                          const float *beta, const float *running_mean, const float *running_var,
                                          float *y, float *invstd, ps_err *err) {
    (void)impl; (void)err;
    for (int j = 0; j < d->c; j++) {
        const double is = 1.0 / sqrt((double)running_var[j] + d->eps), mu = running_mean[j];
        const double g = gamma ? gamma[j] : 1.0, bb = beta ? beta[j] : 0.0;
        for (int i = 0; i < d->n; i++)
            for (int64_t p = 0; p < d->s; p++) {
                const int64_t o = ((int64_t)i * d->c + j) * d->s + p;
                y[o] = (float)((x[o] - mu) * is * g + bb);
            }
        if (invstd) invstd[j] = (float)is;
    }
    return PS_OK;
}

static ps_status ref_bn_backward(void *impl, const ps_chan_desc *d, int batch_stats, const float *x,
                                 const float *dy, const float *gamma, const float *beta, const float *mean,
                                 const float *invstd, float *dx, float *dgamma, float *dbeta, ps_err *err) {
    (void)impl; (void)err; (void)beta;
    const double m = (double)d->n * d->s;
    for (int j = 0; j < d->c; j++) {
        const double mu = mean[j], is = invstd[j], g = gamma ? gamma[j] : 1.0;
        double sdy = 0.0, sdyx = 0.0;
        for (int i = 0; i < d->n; i++)
            for (int64_t p = 0; p < d->s; p++) {
                const int64_t o = ((int64_t)i * d->c + j) * d->s + p;
                sdy += dy[o];
                sdyx += dy[o] * (x[o] - mu) * is;
            }
        if (dbeta) dbeta[j] = (float)sdy;
        if (dgamma) dgamma[j] = (float)sdyx;
        if (!dx) continue;
        for (int i = 0; i < d->n; i++)
            for (int64_t p = 0; p < d->s; p++) {
                const int64_t o = ((int64_t)i * d->c + j) * d->s + p;
                double v = dy[o];
                if (batch_stats) v -= sdy / m + (x[o] - mu) * is * sdyx / m;
                dx[o] = (float)(g * is * v);
            }
    }
    return PS_OK;
}

/* ---- layer normalisation ---- */

static ps_status ref_ln_forward(void *impl, const ps_ln_desc *d, const float *x, const float *gamma,
                                const float *beta, float *y, float *mean, float *rstd, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t r = 0; r < d->rows; r++) {
        const float *xr = x + r * d->cols;
        float *yr = y + r * d->cols;
        double sum = 0.0, sq = 0.0;
        for (int64_t j = 0; j < d->cols; j++) sum += xr[j];
        const double mu = sum / (double)d->cols;
        for (int64_t j = 0; j < d->cols; j++) sq += (xr[j] - mu) * (xr[j] - mu);
        const double rs = 1.0 / sqrt(sq / (double)d->cols + d->eps);
        for (int64_t j = 0; j < d->cols; j++)
            yr[j] = (float)((xr[j] - mu) * rs * (gamma ? gamma[j] : 1.0) + (beta ? beta[j] : 0.0));
        if (mean) mean[r] = (float)mu;
        if (rstd) rstd[r] = (float)rs;
    }
    return PS_OK;
}

static ps_status ref_ln_backward(void *impl, const ps_ln_desc *d, const float *x, const float *dy,
                                 const float *gamma, const float *mean, const float *rstd, float *dx,
                                 float *dgamma, float *dbeta, ps_err *err) {
    (void)impl;
    double *dg = NULL, *dbb = NULL;
    if (dgamma || dbeta) {
        dg = calloc((size_t)d->cols, sizeof *dg);
        dbb = calloc((size_t)d->cols, sizeof *dbb);
        if (!dg || !dbb) {
            free(dg); free(dbb);
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ref layernorm_backward: out of memory");
        }
    }
    for (int64_t r = 0; r < d->rows; r++) {
        const float *xr = x + r * d->cols, *dyr = dy + r * d->cols;
        const double mu = mean[r], rs = rstd[r];
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < d->cols; j++) {
            const double xh = (xr[j] - mu) * rs, g = dyr[j] * (gamma ? gamma[j] : 1.0);
            sg += g;
            sgx += g * xh;
            if (dg) { dg[j] += dyr[j] * xh; dbb[j] += dyr[j]; }
        }
        if (!dx) continue;
        const double n = (double)d->cols;
        for (int64_t j = 0; j < d->cols; j++) {
            const double xh = (xr[j] - mu) * rs, g = dyr[j] * (gamma ? gamma[j] : 1.0);
            dx[r * d->cols + j] = (float)(rs * (g - sg / n - xh * sgx / n));
        }
    }
    for (int64_t j = 0; dg && j < d->cols; j++) {
        if (dgamma) dgamma[j] = (float)dg[j];
        if (dbeta) dbeta[j] = (float)dbb[j];
    }
    free(dg);
    free(dbb);
    return PS_OK;
}

/* ---- group normalisation (ps_gn_desc), in double ---- */

static ps_status ref_gn_forward(void *impl, const ps_gn_desc *d, const float *x, const float *gamma,
                                const float *beta, float *y, float *mean, float *rstd, ps_err *err) {
    (void)impl; (void)err;
    const int64_t cg = d->c / d->groups, m = cg * d->s;
    for (int64_t r = 0; r < d->n * d->groups; r++) {
        const float *xr = x + r * m;
        float *yr = y + r * m;
        double sum = 0.0, sq = 0.0;
        for (int64_t j = 0; j < m; j++) sum += xr[j];
        const double mu = sum / (double)m;
        for (int64_t j = 0; j < m; j++) sq += (xr[j] - mu) * (xr[j] - mu);
        const double rs = 1.0 / sqrt(sq / (double)m + d->eps);
        for (int64_t j = 0; j < m; j++) {
            const int64_t ch = (r % d->groups) * cg + j / d->s;
            yr[j] = (float)((xr[j] - mu) * rs * (gamma ? gamma[ch] : 1.0) + (beta ? beta[ch] : 0.0));
        }
        if (mean) mean[r] = (float)mu;
        if (rstd) rstd[r] = (float)rs;
    }
    return PS_OK;
}

static ps_status ref_gn_backward(void *impl, const ps_gn_desc *d, const float *x, const float *dy,
                                 const float *gamma, const float *mean, const float *rstd, float *dx,
                                 float *dgamma, float *dbeta, ps_err *err) {
    (void)impl; (void)err;
    const int64_t cg = d->c / d->groups, m = cg * d->s;
    for (int64_t r = 0; dx && r < d->n * d->groups; r++) {
        const float *xr = x + r * m, *dyr = dy + r * m;
        const double mu = mean[r], rs = rstd[r];
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < m; j++) {
            const int64_t ch = (r % d->groups) * cg + j / d->s;
            const double g = dyr[j] * (gamma ? gamma[ch] : 1.0);
            sg += g;
            sgx += g * (xr[j] - mu) * rs;
        }
        for (int64_t j = 0; j < m; j++) {
            const int64_t ch = (r % d->groups) * cg + j / d->s;
            const double g = dyr[j] * (gamma ? gamma[ch] : 1.0), xh = (xr[j] - mu) * rs;
            dx[r * m + j] = (float)(rs * (g - sg / (double)m - xh * sgx / (double)m));
        }
    }
    for (int64_t ch = 0; (dgamma || dbeta) && ch < d->c; ch++) {
        double dg = 0.0, db = 0.0;
        for (int64_t i = 0; i < d->n; i++) {
            const int64_t r = i * d->groups + ch / cg, off = (i * d->c + ch) * d->s;
            for (int64_t p = 0; p < d->s; p++) {
                dg += (double)dy[off + p] * ((x[off + p] - (double)mean[r]) * rstd[r]);
                db += dy[off + p];
            }
        }
        if (dgamma) dgamma[ch] = (float)dg;
        if (dbeta) dbeta[ch] = (float)db;
    }
    return PS_OK;
}

/* ---- L2 normalisation over one dimension (ps_l2norm_desc), in double ---- */

static ps_status ref_l2norm_forward(void *impl, const ps_l2norm_desc *d, const float *x, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t o = 0; o < d->outer; o++)
        for (int64_t i = 0; i < d->inner; i++) {
            const int64_t base = o * d->dim * d->inner + i;
            double s = 0.0;
            for (int k = 0; k < d->dim; k++) s += (double)x[base + k * d->inner] * x[base + k * d->inner];
            const double n = fmax(sqrt(s), (double)d->eps);
            for (int k = 0; k < d->dim; k++) y[base + k * d->inner] = (float)(x[base + k * d->inner] / n);
        }
    return PS_OK;
}

static ps_status ref_l2norm_backward(void *impl, const ps_l2norm_desc *d, const float *x, const float *dy, float *dx,
                                     ps_err *err) {
    (void)impl; (void)err;
    for (int64_t o = 0; o < d->outer; o++)
        for (int64_t i = 0; i < d->inner; i++) {
            const int64_t base = o * d->dim * d->inner + i;
            double s = 0.0, dot = 0.0;
            for (int k = 0; k < d->dim; k++) s += (double)x[base + k * d->inner] * x[base + k * d->inner];
            const double n = sqrt(s);
            if (n < (double)d->eps) {
                for (int k = 0; k < d->dim; k++) dx[base + k * d->inner] = (float)(dy[base + k * d->inner] / d->eps);
                continue;
            }
            for (int k = 0; k < d->dim; k++) dot += (double)dy[base + k * d->inner] * x[base + k * d->inner] / n;
            for (int k = 0; k < d->dim; k++) {
                const int64_t j = base + k * d->inner;
                dx[j] = (float)((dy[j] - x[j] / n * dot) / n);
            }
        }
    return PS_OK;
}

/* ---- PReLU: one slope per channel of a plain (n, c, s) activation, or one
 * for all of it (c 1); the slopes' gradient summed in double ---- */

static ps_status ref_prelu_forward(void *impl, const ps_chan_desc *d, const float *x, const float *w, float *y,
                                   ps_err *err) {
    (void)impl;
    if (d->c > 1 && d->layout != PS_LAYOUT_PLAIN)
        return ps_err_set(err, PS_ERR_INTERNAL, "ref: prelu of %d slopes in layout %d", d->c, d->layout);
    for (int64_t i = 0; i < (int64_t)d->n * d->c * d->s; i++) {
        const double v = x[i];
        y[i] = (float)(v > 0.0 ? v : (double)w[(i / d->s) % d->c] * v);
    }
    return PS_OK;
}

static ps_status ref_prelu_backward(void *impl, const ps_chan_desc *d, const float *x, const float *w, const float *dy,
                                    float *dx, float *dw, ps_err *err) {
    (void)impl;
    if (d->c > 1 && d->layout != PS_LAYOUT_PLAIN)
        return ps_err_set(err, PS_ERR_INTERNAL, "ref: prelu of %d slopes in layout %d", d->c, d->layout);
    for (int k = 0; k < d->c; k++) {
        double g = 0.0;
        for (int b = 0; b < d->n; b++)
            for (int64_t j = 0; j < d->s; j++) {
                const int64_t i = ((int64_t)b * d->c + k) * d->s + j;
                if (dx) dx[i] = (float)(x[i] > 0.0f ? (double)dy[i] : (double)w[k] * dy[i]);
                if (x[i] <= 0.0f) g += (double)x[i] * dy[i];
            }
        if (dw) dw[k] = (float)g;
    }
    return PS_OK;
}

/* ---- activations (computed in double, rounded once) ---- */

#define SELU_ALPHA 1.6732632423543772848170429916717
#define SELU_SCALE 1.0507009873554804934193349852946

/* log(1 + exp(z)) without overflow */
static double softplus(double z) { return z > 0.0 ? z + log1p(exp(-z)) : log1p(exp(z)); }

static double act_f(const ps_act_desc *d, double x) {
    switch ((ps_act_kind)d->kind) {
    case PS_ACT_RELU: return x > 0.0 || isnan(x) ? x : 0.0;
    case PS_ACT_LEAKY_RELU: return x > 0.0 ? x : (double)d->alpha * x;
    case PS_ACT_GELU: return 0.5 * x * (1.0 + erf(x * M_SQRT1_2));
    case PS_ACT_GELU_TANH: {
        const double k = sqrt(2.0 / M_PI);
        return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
    case PS_ACT_SILU: return x / (1.0 + exp(-x));
    case PS_ACT_TANH: return tanh(x);
    case PS_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case PS_ACT_HARDTANH: return x < (double)d->alpha ? (double)d->alpha : x > (double)d->beta ? (double)d->beta : x;
    case PS_ACT_HARDSWISH: return x <= -3.0 ? 0.0 : x >= 3.0 ? x : x * (x + 3.0) / 6.0;
    case PS_ACT_HARDSIGMOID: return x <= -3.0 ? 0.0 : x >= 3.0 ? 1.0 : x / 6.0 + 0.5;
    case PS_ACT_ELU: return x > 0.0 ? x : (double)d->alpha * expm1(x);
    case PS_ACT_SELU: return SELU_SCALE * (x > 0.0 ? x : SELU_ALPHA * expm1(x));
    case PS_ACT_SOFTPLUS: return (double)d->alpha * x > (double)d->beta ? x : softplus(x * d->alpha) / d->alpha;
    case PS_ACT_MISH: return x * tanh(softplus(x));
    case PS_ACT_LOGSIGMOID: return -softplus(-x);
    case PS_ACT_EXP: return exp(x);
    case PS_ACT_LOG: return log(x);
    case PS_ACT_ABS: return fabs(x);
    case PS_ACT_SQRT: return sqrt(x);
    case PS_ACT_POW: return pow(x, (double)d->alpha);
    case PS_ACT_LINEAR: return (double)d->alpha * x + (double)d->beta;
    case PS_ACT_CELU: return x > 0.0 ? x : (double)d->alpha * expm1(x / (double)d->alpha);
    case PS_ACT_SOFTSIGN: return x / (1.0 + fabs(x));
    case PS_ACT_TANHSHRINK: return x - tanh(x);
    case PS_ACT_HARDSHRINK: return x > (double)d->alpha || x < -(double)d->alpha ? x : 0.0;
    case PS_ACT_SOFTSHRINK:
        return x > (double)d->alpha ? x - (double)d->alpha : x < -(double)d->alpha ? x + (double)d->alpha : 0.0;
    case PS_ACT_THRESHOLD: return x > (double)d->alpha ? x : (double)d->beta;
    case PS_ACT_LOG1P: return log1p(x);
    case PS_ACT_EXPM1: return expm1(x);
    case PS_ACT_SIN: return sin(x);
    case PS_ACT_COS: return cos(x);
    case PS_ACT_GT: return x > (double)d->alpha;
    case PS_ACT_LT: return x < (double)d->alpha;
    case PS_ACT_GE: return x >= (double)d->alpha;
    case PS_ACT_LE: return x <= (double)d->alpha;
    case PS_ACT_ERF: return erf(x);
    case PS_ACT_SIGN: return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;   /* NaN and -0: 0, as PyTorch */
    case PS_ACT_COUNT: break;
    }
    return NAN;
}

/* f'(x) * dy, from x or y as ps_act_backward_reads_x says. */
static double act_df(const ps_act_desc *d, double x, double y, double dy) {
    switch ((ps_act_kind)d->kind) {
    case PS_ACT_RELU: return y > 0.0 ? dy : 0.0;
    case PS_ACT_LEAKY_RELU: return x > 0.0 ? dy : (double)d->alpha * dy;
    case PS_ACT_GELU: {
        const double cdf = 0.5 * (1.0 + erf(x * M_SQRT1_2)), pdf = exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
        return dy * (cdf + x * pdf);
    }
    case PS_ACT_GELU_TANH: {
        const double k = sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = tanh(u);
        const double du = k * (1.0 + 3.0 * 0.044715 * x * x);
        return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du);
    }
    case PS_ACT_SILU: {
        const double sg = 1.0 / (1.0 + exp(-x));
        return dy * sg * (1.0 + x * (1.0 - sg));
    }
    case PS_ACT_TANH: return dy * (1.0 - y * y);
    case PS_ACT_SIGMOID: return dy * y * (1.0 - y);
    case PS_ACT_HARDTANH: return y <= (double)d->alpha || y >= (double)d->beta ? 0.0 : dy;
    case PS_ACT_HARDSWISH: return x < -3.0 ? 0.0 : x <= 3.0 ? dy * (x / 3.0 + 0.5) : dy;
    case PS_ACT_HARDSIGMOID: return x > -3.0 && x < 3.0 ? dy / 6.0 : 0.0;
    case PS_ACT_ELU: return x > 0.0 ? dy : dy * (double)d->alpha * exp(x);
    case PS_ACT_SELU: return dy * SELU_SCALE * (x > 0.0 ? 1.0 : SELU_ALPHA * exp(x));
    case PS_ACT_SOFTPLUS: {
        const double z = (double)d->alpha * x;
        return z > (double)d->beta ? dy : dy / (1.0 + exp(-z));
    }
    case PS_ACT_MISH: {
        const double t = tanh(softplus(x)), sg = 1.0 / (1.0 + exp(-x));
        return dy * (t + x * sg * (1.0 - t * t));
    }
    case PS_ACT_LOGSIGMOID: return dy / (1.0 + exp(x));
    case PS_ACT_EXP: return dy * exp(x);
    case PS_ACT_LOG: return dy / x;
    case PS_ACT_ABS: return x > 0.0 ? dy : x < 0.0 ? -dy : 0.0;
    case PS_ACT_SQRT: return dy / (2.0 * sqrt(x));
    case PS_ACT_POW: return d->alpha == 0.0f ? 0.0 : dy * (double)d->alpha * pow(x, (double)d->alpha - 1.0);
    case PS_ACT_LINEAR: return dy * (double)d->alpha;
    case PS_ACT_CELU: return x > 0.0 ? dy : dy * exp(x / (double)d->alpha);
    case PS_ACT_SOFTSIGN: {
        const double q = 1.0 + fabs(x);
        return dy / (q * q);
    }
    case PS_ACT_TANHSHRINK: {
        const double t = tanh(x);
        return dy * t * t;
    }
    case PS_ACT_HARDSHRINK:
    case PS_ACT_SOFTSHRINK: return x > (double)d->alpha || x < -(double)d->alpha ? dy : 0.0;
    case PS_ACT_THRESHOLD: return x > (double)d->alpha ? dy : 0.0;
    case PS_ACT_LOG1P: return dy / (1.0 + x);
    case PS_ACT_EXPM1: return dy * exp(x);
    case PS_ACT_SIN: return dy * cos(x);
    case PS_ACT_COS: return -dy * sin(x);
    case PS_ACT_GT:
    case PS_ACT_LT:
    case PS_ACT_GE:
    case PS_ACT_LE: return 0.0;
    case PS_ACT_ERF: return dy * 1.12837916709551257390 * exp(-x * x);   /* 2 / sqrt(pi) */
    case PS_ACT_SIGN: return 0.0;
    case PS_ACT_COUNT: break;
    }
    return NAN;
}

static ps_status ref_act_forward(void *impl, const ps_act_desc *d, int64_t count, const float *x, float *y,
                                 ps_err *err) {
    (void)impl;
    if (d->kind < 0 || d->kind >= PS_ACT_COUNT)
        return ps_err_set(err, PS_ERR_INTERNAL, "ref act_forward: unknown activation %d", d->kind);
    for (int64_t i = 0; i < count; i++) y[i] = (float)act_f(d, x[i]);
    return PS_OK;
}

static ps_status ref_act_backward(void *impl, const ps_act_desc *d, int64_t count, const float *x, const float *y,
                                  const float *dy, float *dx, ps_err *err) {
    (void)impl;
    if (d->kind < 0 || d->kind >= PS_ACT_COUNT)
        return ps_err_set(err, PS_ERR_INTERNAL, "ref act_backward: unknown activation %d", d->kind);
    const int rx = ps_act_backward_reads_x(d->kind);
    for (int64_t i = 0; i < count; i++)
        dx[i] = (float)act_df(d, rx ? x[i] : 0.0, rx ? 0.0 : y[i], dy[i]);
    return PS_OK;
}

/* ---- softmax over one dimension of (outer, dim, inner) ---- */

static ps_status ref_softmax_dim_forward(void *impl, const ps_softmax_desc *d, const float *x, float *y,
                                         ps_err *err) {
    (void)impl; (void)err;
    for (int64_t o = 0; o < d->outer; o++)
        for (int64_t i = 0; i < d->inner; i++) {
            const float *xp = x + o * d->dim * d->inner + i;
            float *yp = y + o * d->dim * d->inner + i;
            double m = -INFINITY, s = 0.0;
            for (int k = 0; k < d->dim; k++)
                if (xp[k * d->inner] > m) m = xp[k * d->inner];
            for (int k = 0; k < d->dim; k++) s += exp(xp[k * d->inner] - m);
            for (int k = 0; k < d->dim; k++)
                yp[k * d->inner] = d->log ? (float)(xp[k * d->inner] - m - log(s))
                                          : (float)(exp(xp[k * d->inner] - m) / s);
        }
    return PS_OK;
}

static ps_status ref_softmax_dim_backward(void *impl, const ps_softmax_desc *d, const float *y, const float *dy,
                                          float *dx, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t o = 0; o < d->outer; o++)
        for (int64_t i = 0; i < d->inner; i++) {
            const int64_t base = o * d->dim * d->inner + i;
            double s = 0.0;
            for (int k = 0; k < d->dim; k++) {
                const int64_t e = base + k * d->inner;
                s += d->log ? (double)dy[e] : (double)dy[e] * y[e];
            }
            for (int k = 0; k < d->dim; k++) {
                const int64_t e = base + k * d->inner;
                dx[e] = d->log ? (float)(dy[e] - exp(y[e]) * s) : (float)(y[e] * (dy[e] - s));
            }
        }
    return PS_OK;
}

/* ---- channel masks, copies, sums ---- */

static ps_status ref_mul_channels(void *impl, const ps_chan_desc *d, const float *x, const float *mask, float *y,
                                  ps_err *err) {
    (void)impl; (void)err;
    for (int64_t q = 0; q < (int64_t)d->n * d->c; q++)
        for (int64_t p = 0; p < d->s; p++) y[q * d->s + p] = x[q * d->s + p] * mask[q];
    return PS_OK;
}

static ps_status ref_copy2d(void *impl, int64_t rows, int64_t cols, const float *src, int64_t src_ld, float *dst,
                            int64_t dst_ld, int accumulate, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++)
            dst[r * dst_ld + j] = accumulate ? dst[r * dst_ld + j] + src[r * src_ld + j] : src[r * src_ld + j];
    return PS_OK;
}

static ps_status ref_add_out(void *impl, int64_t count, const float *a, const float *b, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) y[i] = a[i] + b[i];
    return PS_OK;
}

static ps_status ref_fill(void *impl, int64_t count, float *x, float value, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) x[i] = value;
    return PS_OK;
}

/* ---- permute: every output element in order, its input position by
 * the input's strides taken in the output's dimension order ---- */

static ps_status ref_permute(void *impl, const ps_permute_desc *d, const float *x, float *y, ps_err *err) {
    (void)impl; (void)err;
    int64_t odim[PS_PERMUTE_MAX_DIMS], ostr[PS_PERMUTE_MAX_DIMS];
    const int64_t per = ps_permute_strides(d, odim, ostr);
    for (int64_t i = 0; i < d->n; i++)
        for (int64_t o = 0; o < per; o++) {
            int64_t rest = o, off = 0;
            for (int k = d->ndim - 1; k >= 0; k--) {
                off += (rest % odim[k]) * ostr[k];
                rest /= odim[k];
            }
            y[i * per + o] = x[i * per + off];
        }
    return PS_OK;
}

/* ---- matmul: each output element a sum in double over k, with op(a)
 * and op(b) read through their strides (a transposed operand is the same
 * buffer read with its two strides swapped; a broadcast one at stride 0
 * between matrices; accumulate starts the sum from c) ---- */

static ps_status ref_matmul(void *impl, const ps_matmul_desc *d, const float *a, const float *b, float *c,
                            ps_err *err) {
    (void)impl; (void)err;
    const int64_t m = d->m, n = d->n, k = d->k;
    /* op(a)[i][p] = a[i * ai + p * ap], op(b)[p][j] = b[p * bp + j * bj] */
    const int64_t ai = d->trans_a ? 1 : k, ap = d->trans_a ? m : 1;
    const int64_t bp = d->trans_b ? 1 : n, bj = d->trans_b ? k : 1;
    for (int64_t t = 0; t < d->batch; t++) {
        const float *at = a + (d->bcast_a ? 0 : t * m * k), *bt = b + (d->bcast_b ? 0 : t * k * n);
        float *ct = c + t * m * n;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double acc = d->accumulate ? (double)ct[i * n + j] : 0.0;
                for (int64_t p = 0; p < k; p++) acc += (double)at[i * ai + p * ap] * bt[p * bp + j * bj];
                ct[i * n + j] = (float)acc;
            }
    }
    return PS_OK;
}

/* ---- tri_fill: every element, the triangle's set to the value ---- */

static ps_status ref_tri_fill(void *impl, const ps_tri_desc *d, const float *x, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t t = 0; t < d->batch; t++)
        for (int64_t i = 0; i < d->rows; i++)
            for (int64_t j = 0; j < d->cols; j++) {
                const int64_t o = (t * d->rows + i) * d->cols + j;
                y[o] = ps_tri_in(d, i, j) ? d->value : x[o];
            }
    return PS_OK;
}

/* ---- key padding masks: the ids compared with the pad id, the masked keys' scores ---- */

static ps_status ref_eq_const(void *impl, int64_t count, const int64_t *x, int64_t value, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) y[i] = x[i] == value ? 1.0f : 0.0f;
    return PS_OK;
}

static ps_status ref_key_pad(void *impl, const ps_keypad_desc *d, const float *mask, float *s, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t r = 0; r < d->heads * d->rows; r++)
            for (int64_t j = 0; j < d->cols; j++) {
                const float m = mask[b * d->cols + j];
                float *e = &s[(b * d->heads * d->rows + r) * d->cols + j];
                if (d->additive) *e += m;
                else if (m != 0.0f) *e = -INFINITY;
            }
    return PS_OK;
}

/* ---- upsampling (Upsample, ConvTranspose2d's bias) ---- */

/* One plane of ps_resize_desc: out[oy, ox] from in (forward), or dx
 * accumulated from dy (backward, adj), by backend.h's index rules. */
static void ref_resize_plane(const ps_resize_desc *d, const float *x, float *y, const float *dy, double *dx) {
    for (int oy = 0; oy < d->oh; oy++) {
        int y0, y1;
        float ly;
        if (d->bilinear) ps_resize_linear(oy, d->h, d->oh, d->scale_h, d->align_corners, &y0, &y1, &ly);
        else { y0 = y1 = ps_resize_nearest(oy, d->h, d->oh, d->scale_h); ly = 0.0f; }
        for (int ox = 0; ox < d->ow; ox++) {
            int x0, x1;
            float lx;
            if (d->bilinear) ps_resize_linear(ox, d->w, d->ow, d->scale_w, d->align_corners, &x0, &x1, &lx);
            else { x0 = x1 = ps_resize_nearest(ox, d->w, d->ow, d->scale_w); lx = 0.0f; }
            const float wy[2] = {1.0f - ly, ly}, wx[2] = {1.0f - lx, lx};
            const int iy[2] = {y0, y1}, ix[2] = {x0, x1};
            if (dx) {
                const double g = dy[(size_t)oy * d->ow + ox];
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++) dx[(size_t)iy[a] * d->w + ix[b]] += (double)wy[a] * wx[b] * g;
                continue;
            }
            double v = 0.0;
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++) v += (double)wy[a] * wx[b] * x[(size_t)iy[a] * d->w + ix[b]];
            y[(size_t)oy * d->ow + ox] = (float)v;
        }
    }
}

static ps_status ref_resize_forward(void *impl, const ps_resize_desc *d, const float *x, float *y, ps_err *err) {
    (void)impl; (void)err;
    const size_t in = (size_t)d->h * d->w, out = (size_t)d->oh * d->ow;
    for (size_t p = 0; p < (size_t)d->n * d->c; p++) ref_resize_plane(d, x + p * in, y + p * out, NULL, NULL);
    return PS_OK;
}

static ps_status ref_resize_backward(void *impl, const ps_resize_desc *d, const float *dy, float *dx, ps_err *err) {
    (void)impl;
    const size_t in = (size_t)d->h * d->w, out = (size_t)d->oh * d->ow;
    double *acc = malloc(in * sizeof *acc);
    if (!acc) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ref resize_backward: out of memory");
    for (size_t p = 0; p < (size_t)d->n * d->c; p++) {
        for (size_t i = 0; i < in; i++) acc[i] = 0.0;
        ref_resize_plane(d, NULL, NULL, dy + p * out, acc);
        for (size_t i = 0; i < in; i++) dx[p * in + i] = (float)acc[i];
    }
    free(acc);
    return PS_OK;
}

static ps_status ref_bias_add(void *impl, const ps_chan_desc *d, const float *b, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int i = 0; i < d->n; i++)
        for (int j = 0; j < d->c; j++)
            for (int64_t p = 0; p < d->s; p++) y[((size_t)i * d->c + j) * d->s + p] += b[j];
    return PS_OK;
}

static ps_status ref_bias_grad(void *impl, const ps_chan_desc *d, const float *dy, float *db, ps_err *err) {
    (void)impl; (void)err;
    for (int j = 0; j < d->c; j++) {
        double acc = 0.0;
        for (int i = 0; i < d->n; i++)
            for (int64_t p = 0; p < d->s; p++) acc += dy[((size_t)i * d->c + j) * d->s + p];
        db[j] = (float)acc;
    }
    return PS_OK;
}

/* ---- recurrent layers: one time step's gates (LSTM, GRU; ps_rnn_cell_desc) ---- */


/* The gate arithmetic in double, each result rounded once (the dnnl backend's is float, under OpenMP). */
static double ref_sig(double v) { return 1.0 / (1.0 + exp(-v)); }

static ps_status ref_rnn_cell_forward(void *impl, const ps_rnn_cell_desc *d, const float *gx, const float *gh,
                                      const float *h_prev, const float *c_prev, float *h, float *c, float *act,
                                      ps_err *err) {
    (void)impl; (void)err;
    const int64_t H = d->H, G = d->gru ? 3 : 4;
    for (int64_t r = 0; r < d->n; r++) {
        const float *x = gx + r * G * H, *y = gh + r * G * H;
        float *a = act + r * 4 * H;
        for (int64_t j = 0; j < H; j++) {
            const int64_t o = r * H + j;
            double gate[4];
            for (int k = 0; k < (int)G; k++)   /* GRU's n: x_n + r * y_n, below */
                gate[k] = (double)x[k * H + j] + (d->gru && k == 2 ? 0.0 : (double)y[k * H + j]);
            if (d->gru) {
                const double rg = ref_sig(gate[0]), z = ref_sig(gate[1]);
                const double nn = tanh(gate[2] + rg * (double)y[2 * H + j]);
                h[o] = (float)((1.0 - z) * nn + z * (double)h_prev[o]);
                a[j] = (float)rg, a[H + j] = (float)z, a[2 * H + j] = (float)nn, a[3 * H + j] = y[2 * H + j];
            } else {
                const double i = ref_sig(gate[0]), f = ref_sig(gate[1]), g = tanh(gate[2]), og = ref_sig(gate[3]);
                const double cc = f * (double)c_prev[o] + i * g;
                c[o] = (float)cc;
                h[o] = (float)(og * tanh(cc));
                a[j] = (float)i, a[H + j] = (float)f, a[2 * H + j] = (float)g, a[3 * H + j] = (float)og;
            }
        }
    }
    return PS_OK;
}

static ps_status ref_rnn_cell_backward(void *impl, const ps_rnn_cell_desc *d, const float *act, const float *h_prev,
                                       const float *c_prev, const float *c, const float *dh, float *dc, float *dgx,
                                       float *dgh, float *dh_prev, ps_err *err) {
    (void)impl; (void)err;
    const int64_t H = d->H, G = d->gru ? 3 : 4;
    for (int64_t r = 0; r < d->n; r++) {
        const float *a = act + r * 4 * H;
        float *gx = dgx + r * G * H, *gh = dgh + r * G * H;
        for (int64_t j = 0; j < H; j++) {
            const int64_t o = r * H + j;
            const double g0 = a[j], g1 = a[H + j], g2 = a[2 * H + j], g3 = a[3 * H + j], up = dh[o];
            if (d->gru) {            /* g0 r, g1 z, g2 n, g3 gh_n */
                const double dn = up * (1.0 - g1) * (1.0 - g2 * g2);
                const double dz = up * ((double)h_prev[o] - g2) * g1 * (1.0 - g1);
                const double dr = dn * g3 * g0 * (1.0 - g0);
                gx[j] = gh[j] = (float)dr;
                gx[H + j] = gh[H + j] = (float)dz;
                gx[2 * H + j] = (float)dn;
                gh[2 * H + j] = (float)(dn * g0);
                dh_prev[o] = (float)(up * g1);
            } else {                 /* g0 i, g1 f, g2 g, g3 o */
                const double tc = tanh((double)c[o]);
                const double dcc = (double)dc[o] + up * g3 * (1.0 - tc * tc);
                const double v[4] = {dcc * g2 * g0 * (1.0 - g0), dcc * (double)c_prev[o] * g1 * (1.0 - g1),
                                     dcc * g0 * (1.0 - g2 * g2), up * tc * g3 * (1.0 - g3)};
                for (int k = 0; k < 4; k++) gx[k * H + j] = gh[k * H + j] = (float)v[k];
                dc[o] = (float)(dcc * g1);
                dh_prev[o] = 0.0f;
            }
        }
    }
    return PS_OK;
}

/* ---- numpy broadcasting (ps_bcast_desc): every output element from its
 * operands' positions by ps_bcast_geometry's strides; a gradient element
 * summed in double over the output positions that read it ---- */

static ps_status ref_binary_bcast(void *impl, const ps_bcast_desc *d, const float *a, const float *b, float *y,
                                  ps_err *err) {
    (void)impl; (void)err;
    const ps_bcast_geom g = ps_bcast_geometry(d);
    for (int64_t o = 0; o < g.count; o++) {
        int64_t rest = o, oa = 0, ob = 0;
        for (int k = g.nd - 1; k >= 0; k--) {
            const int64_t i = rest % g.dims[k];
            rest /= g.dims[k];
            oa += i * g.sa[k];
            ob += i * g.sb[k];
        }
        y[o] = ps_binary_apply(d->op, a[oa], b[ob]);
    }
    return PS_OK;
}

static ps_status ref_binary_bcast_backward(void *impl, const ps_bcast_desc *d, int which, const float *a,
                                           const float *b, const float *dy, float *dx, ps_err *err) {
    (void)impl; (void)err;
    const ps_bcast_geom g = ps_bcast_geometry(d);
    const int64_t *sx = which ? g.sb : g.sa;
    int64_t kept = 1;
    for (int k = 0; k < g.nd; k++) kept *= sx[k] ? g.dims[k] : 1;
    const int64_t red = g.count / kept;
    for (int64_t j = 0; j < kept; j++) dx[j] = (float)ps_bcast_grad_sum(&g, sx, d->op, which, j, red, a, b, dy);
    return PS_OK;
}

/* ---- torch.where: a pick per element ---- */

static ps_status ref_where(void *impl, int64_t count, const float *cond, const float *a, float av, const float *b,
                           float bv, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) y[i] = cond[i] != 0.0f ? (a ? a[i] : av) : (b ? b[i] : bv);
    return PS_OK;
}

static ps_status ref_where_backward(void *impl, int64_t count, const float *cond, const float *dy, float *da,
                                    float *db, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t i = 0; i < count; i++) {
        const int pick_a = cond[i] != 0.0f;
        if (da) da[i] = pick_a ? dy[i] : 0.0f;
        if (db) db[i] = pick_a ? 0.0f : dy[i];
    }
    return PS_OK;
}

/* ---- cumsum: each (o, k) line of the (outer, len, inner) view summed in order, in double ---- */

static ps_status ref_cumsum(void *impl, const ps_cumsum_desc *d, const float *x, float *y, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t o = 0; o < d->outer; o++)
        for (int64_t k = 0; k < d->inner; k++) {
            double acc = 0.0;
            for (int64_t t = 0; t < d->len; t++) {
                const int64_t i = d->reverse ? d->len - 1 - t : t, at = (o * d->len + i) * d->inner + k;
                if (d->exclusive) {
                    y[at] = (float)acc;
                    acc += x[at];
                } else {
                    acc += x[at];
                    y[at] = (float)acc;
                }
            }
        }
    return PS_OK;
}

/* ---- im2col / col2im (F.unfold / F.fold): one walk over every column
 * element and the pixel it reads; im2col copies the pixel (0 outside the
 * image), col2im adds the element to it (x zeroed first) ---- */

static void ref_cols(const ps_im2col_desc *d, float *x, float *col, int to_cols) {
    const int64_t L = d->oh * d->ow;
    for (int64_t s = 0; s < d->n; s++)
        for (int64_t ci = 0; ci < d->c; ci++)
            for (int64_t i = 0; i < d->kh; i++)
                for (int64_t j = 0; j < d->kw; j++)
                    for (int64_t p = 0; p < d->oh; p++)
                        for (int64_t q = 0; q < d->ow; q++) {
                            const int64_t y = p * d->sh - d->ph + i * d->dh, xx = q * d->sw - d->pw + j * d->dw;
                            float *cl = col + ((s * d->c + ci) * d->kh * d->kw + i * d->kw + j) * L + p * d->ow + q;
                            const int in = y >= 0 && y < d->h && xx >= 0 && xx < d->w;
                            float *px = in ? x + ((s * d->c + ci) * d->h + y) * d->w + xx : NULL;
                            if (to_cols) *cl = in ? *px : 0.0f;
                            else if (in) *px += *cl;
                        }
}

static ps_status ref_im2col(void *impl, const ps_im2col_desc *d, const float *x, float *col, ps_err *err) {
    (void)impl; (void)err;
    ref_cols(d, (float *)x, col, 1);   /* read only when to_cols */
    return PS_OK;
}

static ps_status ref_col2im(void *impl, const ps_im2col_desc *d, const float *col, float *x, ps_err *err) {
    (void)impl; (void)err;
    for (int64_t k = 0; k < d->n * d->c * d->h * d->w; k++) x[k] = 0.0f;
    ref_cols(d, x, (float *)col, 0);   /* read only when !to_cols */
    return PS_OK;
}

/* ---- spatial transformers (AffineGrid, GridSample; backend.h's index
 * rules, sums in double) ---- */

static ps_status ref_affine_grid(void *impl, const ps_affgrid_desc *d, const float *theta, float *grid, ps_err *err) {
    (void)impl; (void)err;
    for (int i = 0; i < d->n; i++) {
        const float *t = theta + (size_t)i * 6;
        for (int yy = 0; yy < d->h; yy++) {
            const double by = ps_affgrid_base(yy, d->h, d->align_corners);
            for (int xx = 0; xx < d->w; xx++) {
                const double bx = ps_affgrid_base(xx, d->w, d->align_corners);
                float *g = grid + (((size_t)i * d->h + yy) * d->w + xx) * 2;
                g[0] = (float)(t[0] * bx + t[1] * by + t[2]);
                g[1] = (float)(t[3] * bx + t[4] * by + t[5]);
            }
        }
    }
    return PS_OK;
}

static ps_status ref_affine_grid_backward(void *impl, const ps_affgrid_desc *d, const float *dgrid, float *dtheta,
                                          ps_err *err) {
    (void)impl; (void)err;
    for (int i = 0; i < d->n; i++) {
        double acc[6] = {0};
        for (int yy = 0; yy < d->h; yy++) {
            const double by = ps_affgrid_base(yy, d->h, d->align_corners);
            for (int xx = 0; xx < d->w; xx++) {
                const double bx = ps_affgrid_base(xx, d->w, d->align_corners);
                const float *g = dgrid + (((size_t)i * d->h + yy) * d->w + xx) * 2;
                for (int r = 0; r < 2; r++) {
                    acc[3 * r] += g[r] * bx;
                    acc[3 * r + 1] += g[r] * by;
                    acc[3 * r + 2] += g[r];
                }
            }
        }
        for (int k = 0; k < 6; k++) dtheta[(size_t)i * 6 + k] = (float)acc[k];
    }
    return PS_OK;
}

/* The taps of one grid point: up to 2x2 input positions (nearest: one),
 * their weights, and d index / d grid along x and y. */
typedef struct ref_gs_taps {
    int x0, y0;                 /* the top-left tap (nearest: the tap) */
    float wx[2], wy[2];         /* weights of columns x0, x0 + 1 and rows y0, y0 + 1 */
    float gmx, gmy;
} ref_gs_taps;

static ref_gs_taps ref_gs_point(const ps_gridsample_desc *d, const float *g) {
    ref_gs_taps t;
    const float ix = ps_gs_source(g[0], d->w, d->padding, d->align_corners, &t.gmx);
    const float iy = ps_gs_source(g[1], d->h, d->padding, d->align_corners, &t.gmy);
    const int nearest = d->mode == PS_GS_NEAREST;
    t.x0 = ps_gs_index(ix, d->w, nearest);
    t.y0 = ps_gs_index(iy, d->h, nearest);
    t.wx[1] = nearest ? 0.0f : ix - (float)t.x0;
    t.wy[1] = nearest ? 0.0f : iy - (float)t.y0;
    t.wx[0] = 1.0f - t.wx[1];
    t.wy[0] = 1.0f - t.wy[1];
    return t;
}

static int ref_gs_in(const ps_gridsample_desc *d, int xx, int yy) {
    return xx >= 0 && xx < d->w && yy >= 0 && yy < d->h;
}

/* Tap (a, b) (row y0 + a, column x0 + b) of plane p, 0 outside. */
static double ref_gs_val(const ps_gridsample_desc *d, const float *p, const ref_gs_taps *t, int a, int b) {
    const int xx = t->x0 + b, yy = t->y0 + a;
    return ref_gs_in(d, xx, yy) ? p[(size_t)yy * d->w + xx] : 0.0;
}

static ps_status ref_grid_sample(void *impl, const ps_gridsample_desc *d, const float *x, const float *grid, float *y,
                                 ps_err *err) {
    (void)impl; (void)err;
    const size_t in = (size_t)d->h * d->w, out = (size_t)d->oh * d->ow;
    for (int i = 0; i < d->n; i++)
        for (size_t q = 0; q < out; q++) {
            const ref_gs_taps t = ref_gs_point(d, grid + ((size_t)i * out + q) * 2);
            for (int c = 0; c < d->c; c++) {
                const float *p = x + ((size_t)i * d->c + c) * in;
                double v = 0.0;
                if (d->mode == PS_GS_NEAREST) v = ref_gs_val(d, p, &t, 0, 0);
                else
                    for (int a = 0; a < 2; a++)
                        for (int b = 0; b < 2; b++) v += (double)t.wy[a] * t.wx[b] * ref_gs_val(d, p, &t, a, b);
                y[((size_t)i * d->c + c) * out + q] = (float)v;
            }
        }
    return PS_OK;
}

static ps_status ref_grid_sample_backward(void *impl, const ps_gridsample_desc *d, const float *x, const float *grid,
                                          const float *dy, float *dx, float *dgrid, ps_err *err) {
    (void)impl;
    const size_t in = (size_t)d->h * d->w, out = (size_t)d->oh * d->ow;
    double *acc = dx ? calloc((size_t)d->c * in + 1, sizeof *acc) : NULL;
    if (dx && !acc) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ref grid_sample_backward: out of memory");
    for (int i = 0; i < d->n; i++) {
        if (acc) memset(acc, 0, (size_t)d->c * in * sizeof *acc);
        for (size_t q = 0; q < out; q++) {
            const ref_gs_taps t = ref_gs_point(d, grid + ((size_t)i * out + q) * 2);
            double gx = 0.0, gy = 0.0;
            for (int c = 0; c < d->c; c++) {
                const float *p = x + ((size_t)i * d->c + c) * in;
                const double go = dy[((size_t)i * d->c + c) * out + q];
                const int taps = d->mode == PS_GS_NEAREST ? 1 : 2;
                for (int a = 0; a < taps && acc; a++)
                    for (int b = 0; b < taps; b++) {
                        const int xx = t.x0 + b, yy = t.y0 + a;
                        if (ref_gs_in(d, xx, yy))
                            acc[(size_t)c * in + (size_t)yy * d->w + xx] += (double)t.wy[a] * t.wx[b] * go;
                    }
                if (d->mode == PS_GS_NEAREST || !dgrid) continue;
                const double nw = ref_gs_val(d, p, &t, 0, 0), ne = ref_gs_val(d, p, &t, 0, 1),
                             sw = ref_gs_val(d, p, &t, 1, 0), se = ref_gs_val(d, p, &t, 1, 1);
                gx += ((ne - nw) * t.wy[0] + (se - sw) * t.wy[1]) * go;
                gy += ((sw - nw) * t.wx[0] + (se - ne) * t.wx[1]) * go;
            }
            if (dgrid) {
                dgrid[((size_t)i * out + q) * 2] = (float)(gx * t.gmx);
                dgrid[((size_t)i * out + q) * 2 + 1] = (float)(gy * t.gmy);
            }
        }
        if (acc)
            for (size_t k = 0; k < (size_t)d->c * in; k++) dx[(size_t)i * d->c * in + k] = (float)acc[k];
    }
    free(acc);
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
    .avgpool_forward = ref_avgpool_forward,
    .avgpool_backward = ref_avgpool_backward,
    .batchnorm_forward_training = ref_bn_forward_training,
    .batchnorm_forward_inference = ref_bn_forward_inference,
    .batchnorm_backward = ref_bn_backward,
    .layernorm_forward = ref_ln_forward,
    .layernorm_backward = ref_ln_backward,
    .act_forward = ref_act_forward,
    .act_backward = ref_act_backward,
    .softmax_dim_forward = ref_softmax_dim_forward,
    .softmax_dim_backward = ref_softmax_dim_backward,
    .mul_channels = ref_mul_channels,
    .copy2d = ref_copy2d,
    .add_out = ref_add_out,
    .fill = ref_fill,
    .adaptive_avgpool_forward = ref_adaptive_avgpool_forward,
    .adaptive_avgpool_backward = ref_adaptive_avgpool_backward,
    .permute = ref_permute,
    .matmul = ref_matmul,
    .tri_fill = ref_tri_fill,
    .eq_const = ref_eq_const,
    .key_pad = ref_key_pad,
    /* upsampling */
    .resize_forward = ref_resize_forward,
    .resize_backward = ref_resize_backward,
    .bias_add = ref_bias_add,
    .bias_grad = ref_bias_grad,
    .groupnorm_forward = ref_gn_forward,
    .groupnorm_backward = ref_gn_backward,
    .l2norm_forward = ref_l2norm_forward,
    .l2norm_backward = ref_l2norm_backward,
    .rnn_cell_forward = ref_rnn_cell_forward,
    .rnn_cell_backward = ref_rnn_cell_backward,
    .prelu_forward = ref_prelu_forward,
    .prelu_backward = ref_prelu_backward,
    .binary_bcast = ref_binary_bcast,
    .binary_bcast_backward = ref_binary_bcast_backward,
    .where = ref_where,
    .where_backward = ref_where_backward,
    .cumsum = ref_cumsum,
    .im2col = ref_im2col,
    .col2im = ref_col2im,
    /* spatial transformers */
    .affine_grid = ref_affine_grid,
    .affine_grid_backward = ref_affine_grid_backward,
    .grid_sample = ref_grid_sample,
    .grid_sample_backward = ref_grid_sample_backward,
};
