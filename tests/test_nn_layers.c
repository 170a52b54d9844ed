/* test_nn_layers.c - every op of the compute backends (common/nn/backend.h).
 *
 *  1. The reference backend against central finite differences of the
 *     scalar loss L = sum(y * r), r random, on small shapes (strided and
 *     padded conv, odd-sized and overlapping pools, ...): dx, dw, db of
 *     every op. SGD against a double-precision loop over 3 steps.
 *  2. Every other backend (today: dnnl) against the reference on the MNIST
 *     CNN's shapes plus odd ones: forward and every gradient, max-pool with
 *     deliberate ties, and a concurrency check (two threads running conv on
 *     one fresh backend give bit-identical results to a sequential run).
 *
 * Prints the check.h summary; exits non-zero on any failure.
 */
#include "backend.h"
#include "check.h"
#include "loss.h"
#include "support/random.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static float *host_zeros(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    PS_ASSERT(p);
    return p;
}

/* Fill p with n distinct values spaced `gap` apart, in random order: no
 * ties and no kinks within a finite-difference step. */
static void fill_distinct(float *p, size_t n, float gap, rng *r) {
    for (size_t i = 0; i < n; i++) p[i] = ((float)i - (float)n / 2 + 0.5f) * gap;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)((rng_uniform(r) + 1.0f) * 0.5f * (float)i) % i;
        float t = p[i - 1]; p[i - 1] = p[j]; p[j] = t;
    }
}

/* ---- 1. reference backend vs finite differences ---- */

typedef enum { FD_CONV, FD_RELU, FD_POOL, FD_LINEAR, FD_LOGSOFTMAX, FD_MUL, FD_SOFTMAX, FD_EMBEDDING } fd_op;

typedef struct fd_case {
    ps_backend *b;
    fd_op op;
    ps_conv_desc conv;
    ps_pool_desc pool;
    ps_linear_desc lin;
    int rows, cols;      /* log-softmax */
    int64_t count;       /* relu, mul; embedding: ids */
    const int64_t *ids;  /* embedding */
    int dim;             /* embedding */
    float *x, *w, *bias, *mask;
    float *y;            /* forward output, ny floats */
    const float *r;      /* loss weights, ny floats */
    size_t ny;
    void *ws;            /* max-pool workspace */
} fd_case;

static double fd_loss(fd_case *c) {
    const ps_backend_ops *o = c->b->ops;
    ps_status st = PS_ERR_INTERNAL;
    switch (c->op) {
    case FD_CONV: st = o->conv2d_forward(c->b->impl, &c->conv, c->x, c->w, c->bias, c->y, NULL); break;
    case FD_RELU: st = o->relu_forward(c->b->impl, c->count, c->x, c->y, NULL); break;
    case FD_POOL: st = o->maxpool_forward(c->b->impl, &c->pool, c->x, c->y, c->ws, NULL); break;
    case FD_LINEAR: st = o->linear_forward(c->b->impl, &c->lin, c->x, c->w, c->bias, c->y, NULL); break;
    case FD_LOGSOFTMAX: st = o->log_softmax_forward(c->b->impl, c->rows, c->cols, c->x, c->y, NULL); break;
    case FD_MUL: st = o->mul(c->b->impl, c->count, c->x, c->mask, c->y, NULL); break;
    case FD_SOFTMAX: st = o->softmax_forward(c->b->impl, c->rows, c->cols, c->x, c->y, NULL); break;
    case FD_EMBEDDING: st = o->embedding_forward(c->b->impl, c->count, c->dim, c->ids, c->w, c->y, NULL); break;
    }
    PS_ASSERT(st == PS_OK);
    double s = 0.0;
    for (size_t i = 0; i < c->ny; i++) s += (double)c->y[i] * c->r[i];
    return s;
}

/* Compare analytic gradient g (n floats) of the loss w.r.t. p with central
 * differences of step eps. */
static void fd_check(const char *what, fd_case *c, float *p, const float *g, size_t n, float eps,
                     double atol, double rtol) {
    float *num = host_zeros(n);
    for (size_t i = 0; i < n; i++) {
        float save = p[i], hi = save + eps, lo = save - eps;
        p[i] = hi;
        double lp = fd_loss(c);
        p[i] = lo;
        double lm = fd_loss(c);
        p[i] = save;
        num[i] = (float)((lp - lm) / ((double)hi - lo));
    }
    char label[96];
    snprintf(label, sizeof label, "fd %s", what);
    check_array(label, g, num, n, atol, rtol);
    free(num);
}

/* Tolerances of the finite-difference checks: the ops are (piecewise)
 * linear or smooth, so central differences with eps 1e-2 are exact up to
 * float rounding of y (~1e-4 after dividing by 2 eps) or O(eps^2) for
 * log-softmax. Gradients are O(1..10); a wrong index or a dropped term
 * is off by O(1). */
#define FD_EPS  1e-2f
#define FD_ATOL 1e-3
#define FD_RTOL 3e-3

static void fd_conv(ps_backend *b, ps_conv_desc d, rng *r) {
    const int oh = ps_conv_out_h(&d), ow = ps_conv_out_w(&d);
    const size_t nx = (size_t)d.n * d.cin * d.h * d.w, nw = (size_t)d.cout * d.cin * d.kh * d.kw;
    const size_t ny = (size_t)d.n * d.cout * oh * ow;
    fd_case c = { .b = b, .op = FD_CONV, .conv = d, .ny = ny };
    c.x = host_random(nx, r); c.w = host_random(nw, r); c.bias = host_random(d.cout, r);
    c.y = host_zeros(ny);
    float *rr = host_random(ny, r), *dx = host_zeros(nx), *dw = host_zeros(nw), *db = host_zeros(d.cout);
    c.r = rr;
    CHECK(b->ops->conv2d_backward(b->impl, &d, c.x, c.w, rr, dx, dw, db, NULL) == PS_OK);
    char what[64];
    snprintf(what, sizeof what, "conv s%d p%d dx", d.stride, d.pad);
    fd_check(what, &c, c.x, dx, nx, FD_EPS, FD_ATOL, FD_RTOL);
    snprintf(what, sizeof what, "conv s%d p%d dw", d.stride, d.pad);
    fd_check(what, &c, c.w, dw, nw, FD_EPS, FD_ATOL, FD_RTOL);
    snprintf(what, sizeof what, "conv s%d p%d db", d.stride, d.pad);
    fd_check(what, &c, c.bias, db, d.cout, FD_EPS, FD_ATOL, FD_RTOL);
    /* dx == NULL is skipped; the others are unchanged. */
    float *dw2 = host_zeros(nw), *db2 = host_zeros(d.cout);
    CHECK(b->ops->conv2d_backward(b->impl, &d, c.x, c.w, rr, NULL, dw2, db2, NULL) == PS_OK);
    CHECK(memcmp(dw, dw2, nw * sizeof *dw) == 0 && memcmp(db, db2, d.cout * sizeof *db) == 0);
    free(c.x); free(c.w); free(c.bias); free(c.y); free(rr); free(dx); free(dw); free(db);
    free(dw2); free(db2);
}

static void fd_linear(ps_backend *b, ps_linear_desc d, rng *r) {
    const size_t nx = (size_t)d.n * d.in, nw = (size_t)d.out * d.in, ny = (size_t)d.n * d.out;
    fd_case c = { .b = b, .op = FD_LINEAR, .lin = d, .ny = ny };
    c.x = host_random(nx, r); c.w = host_random(nw, r); c.bias = host_random(d.out, r);
    c.y = host_zeros(ny);
    float *rr = host_random(ny, r), *dx = host_zeros(nx), *dw = host_zeros(nw), *db = host_zeros(d.out);
    c.r = rr;
    CHECK(b->ops->linear_backward(b->impl, &d, c.x, c.w, rr, dx, dw, db, NULL) == PS_OK);
    fd_check("linear dx", &c, c.x, dx, nx, FD_EPS, FD_ATOL, FD_RTOL);
    fd_check("linear dw", &c, c.w, dw, nw, FD_EPS, FD_ATOL, FD_RTOL);
    fd_check("linear db", &c, c.bias, db, d.out, FD_EPS, FD_ATOL, FD_RTOL);
    free(c.x); free(c.w); free(c.bias); free(c.y); free(rr); free(dx); free(dw); free(db);
}

static void fd_pool(ps_backend *b, ps_pool_desc d, rng *r) {
    const size_t nx = (size_t)d.n * d.c * d.h * d.w;
    const size_t ny = (size_t)d.n * d.c * ps_pool_out_h(&d) * ps_pool_out_w(&d);
    fd_case c = { .b = b, .op = FD_POOL, .pool = d, .ny = ny };
    c.x = host_zeros(nx);
    fill_distinct(c.x, nx, 5 * FD_EPS, r);
    c.y = host_zeros(ny);
    c.ws = b->ops->alloc(b->impl, b->ops->maxpool_workspace_size(b->impl, &d));
    float *rr = host_random(ny, r), *dx = host_zeros(nx);
    c.r = rr;
    fd_loss(&c); /* forward fills the workspace */
    CHECK(b->ops->maxpool_backward(b->impl, &d, c.ws, rr, dx, NULL) == PS_OK);
    char what[64];
    snprintf(what, sizeof what, "maxpool %dx%d k%d s%d dx", d.h, d.w, d.k, d.stride);
    fd_check(what, &c, c.x, dx, nx, FD_EPS, FD_ATOL, FD_RTOL);
    b->ops->free(b->impl, c.ws);
    free(c.x); free(c.y); free(rr); free(dx);
}

static void fd_small_ops(ps_backend *b, rng *r) {
    /* relu: inputs away from the kink */
    {
        const int64_t n = 40;
        fd_case c = { .b = b, .op = FD_RELU, .count = n, .ny = (size_t)n };
        c.x = host_zeros(n);
        fill_distinct(c.x, (size_t)n, 5 * FD_EPS, r);
        c.y = host_zeros(n);
        float *rr = host_random(n, r), *dx = host_zeros(n);
        c.r = rr;
        fd_loss(&c);
        CHECK(b->ops->relu_backward(b->impl, n, c.y, rr, dx, NULL) == PS_OK);
        fd_check("relu dx", &c, c.x, dx, (size_t)n, FD_EPS, FD_ATOL, FD_RTOL);
        /* in place: x == y, dx == dy */
        fd_loss(&c);
        float *xy = host_zeros(n);
        memcpy(xy, c.x, n * sizeof *xy);
        CHECK(b->ops->relu_forward(b->impl, n, xy, xy, NULL) == PS_OK);
        CHECK(memcmp(xy, c.y, n * sizeof *xy) == 0);
        CHECK(b->ops->relu_backward(b->impl, n, c.y, rr, rr, NULL) == PS_OK);
        CHECK(memcmp(rr, dx, n * sizeof *dx) == 0);
        free(c.x); free(c.y); free(rr); free(dx); free(xy);
    }
    /* log-softmax, including a row with a huge offset (stability) */
    {
        const int rows = 3, cols = 10;
        const size_t n = (size_t)rows * cols;
        fd_case c = { .b = b, .op = FD_LOGSOFTMAX, .rows = rows, .cols = cols, .ny = n };
        c.x = host_random(n, r);
        for (size_t i = 0; i < n; i++) c.x[i] *= 3.0f;
        c.y = host_zeros(n);
        float *rr = host_random(n, r), *dx = host_zeros(n);
        c.r = rr;
        fd_loss(&c);
        CHECK(b->ops->log_softmax_backward(b->impl, rows, cols, c.y, rr, dx, NULL) == PS_OK);
        fd_check("log_softmax dx", &c, c.x, dx, n, FD_EPS, FD_ATOL, FD_RTOL);
        float big[4] = { 1000.0f, 999.0f, 998.0f, -1000.0f }, yb[4];
        CHECK(b->ops->log_softmax_forward(b->impl, 1, 4, big, yb, NULL) == PS_OK);
        double lse = log(1.0 + exp(-1.0) + exp(-2.0));
        CHECK_CLOSE(yb[0], -lse, 1e-5, 1e-5);
        CHECK_CLOSE(yb[1], -1.0 - lse, 1e-5, 1e-5);
        CHECK_CLOSE(yb[2], -2.0 - lse, 1e-5, 1e-5);
        CHECK_CLOSE(yb[3], -2000.0 - lse, 1e-3, 1e-6);
        free(c.x); free(c.y); free(rr); free(dx);
    }
    /* mul (dropout): d(x*mask)/dx = mask */
    {
        const int64_t n = 30;
        fd_case c = { .b = b, .op = FD_MUL, .count = n, .ny = (size_t)n };
        c.x = host_random(n, r);
        c.mask = host_zeros(n);
        for (int64_t i = 0; i < n; i++) c.mask[i] = rng_uniform(r) > 0 ? 2.0f : 0.0f;
        c.y = host_zeros(n);
        float *rr = host_random(n, r), *dx = host_zeros(n);
        c.r = rr;
        CHECK(b->ops->mul(b->impl, n, rr, c.mask, dx, NULL) == PS_OK);
        fd_check("mul dx", &c, c.x, dx, (size_t)n, FD_EPS, FD_ATOL, FD_RTOL);
        free(c.x); free(c.mask); free(c.y); free(rr); free(dx);
    }
}

/* The ops added for issue 9: softmax, embedding (gather / scatter-add into
 * unique rows), scale. */
static void fd_new_ops(ps_backend *b, rng *r) {
    /* softmax over rows, and its stability on huge logits */
    {
        const int rows = 4, cols = 6;
        const size_t n = (size_t)rows * cols;
        fd_case c = { .b = b, .op = FD_SOFTMAX, .rows = rows, .cols = cols, .ny = n };
        c.x = host_random(n, r);
        for (size_t i = 0; i < n; i++) c.x[i] *= 3.0f;
        c.y = host_zeros(n);
        float *rr = host_random(n, r), *dx = host_zeros(n);
        c.r = rr;
        fd_loss(&c);
        for (int i = 0; i < rows; i++) {   /* each row sums to 1 */
            double sum = 0;
            for (int j = 0; j < cols; j++) sum += c.y[i * cols + j];
            CHECK_CLOSE(sum, 1.0, 1e-6, 1e-6);
        }
        CHECK(b->ops->softmax_backward(b->impl, rows, cols, c.y, rr, dx, NULL) == PS_OK);
        fd_check("softmax dx", &c, c.x, dx, n, FD_EPS, FD_ATOL, FD_RTOL);
        float big[3] = { 1000.0f, 999.0f, -1000.0f }, yb[3];
        CHECK(b->ops->softmax_forward(b->impl, 1, 3, big, yb, NULL) == PS_OK);
        double z = 1.0 + exp(-1.0);
        CHECK_CLOSE(yb[0], 1.0 / z, 1e-6, 1e-6);
        CHECK_CLOSE(yb[1], exp(-1.0) / z, 1e-6, 1e-6);
        CHECK_CLOSE(yb[2], 0.0, 1e-30, 0);
        free(c.x); free(c.y); free(rr); free(dx);
    }
    /* embedding: y = w[ids]; the scatter-add into unique rows vs finite
     * differences on the whole table (untouched rows must have gradient 0) */
    {
        const int num = 7, dim = 3;
        const int64_t ids[6] = { 4, 1, 4, 6, 1, 4 }, rows[3] = { 1, 4, 6 }, slot[6] = { 1, 0, 1, 2, 0, 1 };
        const size_t ny = 6 * dim;
        fd_case c = { .b = b, .op = FD_EMBEDDING, .count = 6, .ids = ids, .dim = dim, .ny = ny };
        c.w = host_random((size_t)num * dim, r);
        c.y = host_zeros(ny);
        float *rr = host_random(ny, r), *grows = host_zeros(3 * dim), *dense = host_zeros((size_t)num * dim);
        c.r = rr;
        fd_loss(&c);
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < dim; j++) CHECK(c.y[i * dim + j] == c.w[ids[i] * dim + j]);
        for (int i = 0; i < 3 * dim; i++) grows[i] = 99.0f;   /* must be overwritten */
        CHECK(b->ops->embedding_backward(b->impl, 6, dim, slot, rr, 3, grows, NULL) == PS_OK);
        for (int k = 0; k < 3; k++)
            for (int j = 0; j < dim; j++) dense[rows[k] * dim + j] = grows[k * dim + j];
        fd_check("embedding dw", &c, c.w, dense, (size_t)num * dim, FD_EPS, FD_ATOL, FD_RTOL);
        free(c.w); free(c.y); free(rr); free(grows); free(dense);
    }
    /* scale */
    {
        float x[5] = { 1, -2, 3.5f, 0, 8 };
        CHECK(b->ops->scale(b->impl, 5, x, 0.5f, NULL) == PS_OK);
        CHECK(x[0] == 0.5f && x[1] == -1.0f && x[2] == 1.75f && x[3] == 0.0f && x[4] == 4.0f);
    }
}

/* Max-pool ties: the gradient goes to the first maximum in row-major
 * window order (PyTorch). */
static void ref_pool_ties(ps_backend *b) {
    /* (1,1,4,4), k2 s2: window 0 all equal, window 1 tie at (0,3)/(1,2),
     * window 2 tie at (3,0)/(3,1), window 3 single max at (3,3). */
    const float x[16] = { 5, 5, 1, 7,
                          5, 5, 7, 7,
                          0, 0, 2, 1,
                          4, 4, 1, 3 };
    const ps_pool_desc d = { 1, 1, 4, 4, 2, 2 };
    const float want_y[4] = { 5, 7, 4, 3 };
    const float want_dx[16] = { 1, 0, 0, 2,
                                0, 0, 0, 0,
                                0, 0, 0, 0,
                                3, 0, 0, 4 };
    const float dy[4] = { 1, 2, 3, 4 };
    float y[4], dx[16];
    void *ws = b->ops->alloc(b->impl, b->ops->maxpool_workspace_size(b->impl, &d));
    CHECK(b->ops->maxpool_forward(b->impl, &d, x, y, ws, NULL) == PS_OK);
    CHECK(b->ops->maxpool_backward(b->impl, &d, ws, dy, dx, NULL) == PS_OK);
    char what[64];
    snprintf(what, sizeof what, "%s maxpool ties y", b->ops->name);
    check_array(what, y, want_y, 4, 0, 0);
    snprintf(what, sizeof what, "%s maxpool ties dx", b->ops->name);
    check_array(what, dx, want_dx, 16, 0, 0);
    b->ops->free(b->impl, ws);
}

/* SGD for 3 steps against a double-precision loop of ps_sgd_desc's
 * formulas; with and without momentum/weight decay. */
static void check_sgd(ps_backend *b, rng *r) {
    const int64_t n = 257;
    const ps_sgd_desc cfgs[3] = { { 0.1f, 0.9f, 0.01f, 0 }, { 0.05f, 0.0f, 0.0f, 0 },
                                  { 0.1f, 0.0f, 0.1f, 0 } };
    for (int k = 0; k < 3; k++) {
        ps_sgd_desc s = cfgs[k];
        float *w0 = host_random(n, r);
        float *w = b->ops->alloc(b->impl, n * sizeof *w);
        float *g = b->ops->alloc(b->impl, n * sizeof *g);
        float *buf = s.momentum != 0 ? b->ops->alloc(b->impl, n * sizeof *buf) : NULL;
        float *hw = host_zeros(n), *hg = host_zeros(n);
        double *ew = malloc(n * sizeof *ew), *ebuf = calloc(n, sizeof *ebuf);
        for (int64_t i = 0; i < n; i++) ew[i] = w0[i];
        CHECK(b->ops->copy_to_device(b->impl, w, w0, n * sizeof *w, NULL) == PS_OK);
        if (buf) {
            memset(hg, 0, n * sizeof *hg);
            CHECK(b->ops->copy_to_device(b->impl, buf, hg, n * sizeof *hg, NULL) == PS_OK);
        }
        for (int step = 0; step < 3; step++) {
            for (int64_t i = 0; i < n; i++) hg[i] = rng_uniform(r);
            CHECK(b->ops->copy_to_device(b->impl, g, hg, n * sizeof *g, NULL) == PS_OK);
            s.first_step = step == 0;
            CHECK(b->ops->sgd_update(b->impl, n, w, w, g, buf, &s, NULL) == PS_OK);
            for (int64_t i = 0; i < n; i++) {
                double gi = (double)hg[i] + (double)s.weight_decay * ew[i];
                if (s.momentum != 0) {
                    ebuf[i] = step == 0 ? gi : (double)s.momentum * ebuf[i] + gi;
                    gi = ebuf[i];
                }
                ew[i] -= (double)s.lr * gi;
            }
        }
        CHECK(b->ops->copy_to_host(b->impl, hw, w, n * sizeof *w, NULL) == PS_OK);
        float *ewf = host_zeros(n);
        for (int64_t i = 0; i < n; i++) ewf[i] = (float)ew[i];
        char what[64];
        snprintf(what, sizeof what, "%s sgd lr %g mom %g wd %g", b->ops->name, s.lr, s.momentum,
                 s.weight_decay);
        check_array(what, hw, ewf, (size_t)n, 1e-6, 1e-5);
        free(w0); free(hw); free(hg); free(ew); free(ebuf); free(ewf);
        b->ops->free(b->impl, w); b->ops->free(b->impl, g);
        if (buf) b->ops->free(b->impl, buf);
    }
    /* add: dst += src */
    {
        float *a = host_random(n, r), *c = host_random(n, r), *want = host_zeros(n);
        for (int64_t i = 0; i < n; i++) want[i] = a[i] + c[i];
        float *da = b->ops->alloc(b->impl, n * sizeof *da), *dc = b->ops->alloc(b->impl, n * sizeof *dc);
        CHECK(b->ops->copy_to_device(b->impl, da, a, n * sizeof *a, NULL) == PS_OK);
        CHECK(b->ops->copy_to_device(b->impl, dc, c, n * sizeof *c, NULL) == PS_OK);
        CHECK(b->ops->add(b->impl, n, da, dc, NULL) == PS_OK);
        CHECK(b->ops->copy_to_host(b->impl, a, da, n * sizeof *a, NULL) == PS_OK);
        char what[64];
        snprintf(what, sizeof what, "%s add", b->ops->name);
        check_array(what, a, want, (size_t)n, 0, 0);
        b->ops->free(b->impl, da); b->ops->free(b->impl, dc);
        free(a); free(c); free(want);
    }
}

/* ---- 2. other backends vs the reference ---- */

/* Relative tolerance of backend comparisons (scaled by the array's largest
 * magnitude): float accumulation over up to ~10^4 terms in another order
 * differs by ~1e-6..1e-5 of the scale; any real bug is off by O(1). */
#define CMP_TOL 1e-4

/* Host buffers mirrored on a backend. */
static float *dev_from(ps_backend *b, const float *host, size_t n) {
    float *p = ps_backend_alloc_floats(b, (int64_t)n);
    PS_ASSERT(p);
    if (host) CHECK(b->ops->copy_to_device(b->impl, p, host, n * sizeof *p, NULL) == PS_OK);
    return p;
}

static float *host_from(ps_backend *b, const float *dev, size_t n) {
    float *p = host_zeros(n);
    CHECK(b->ops->copy_to_host(b->impl, p, dev, n * sizeof *p, NULL) == PS_OK);
    return p;
}

/* Run op on backend b with host inputs; outputs come back as host arrays. */
typedef struct conv_out { float *y, *dx, *dw, *db, *dw_nodx; } conv_out;

static conv_out run_conv(ps_backend *b, const ps_conv_desc *d, const float *x, const float *w,
                         const float *bias, const float *dy) {
    const size_t nx = (size_t)d->n * d->cin * d->h * d->w, nw = (size_t)d->cout * d->cin * d->kh * d->kw;
    const size_t ny = (size_t)d->n * d->cout * ps_conv_out_h(d) * ps_conv_out_w(d);
    float *X = dev_from(b, x, nx), *W = dev_from(b, w, nw), *B = dev_from(b, bias, d->cout);
    float *DY = dev_from(b, dy, ny), *Y = dev_from(b, NULL, ny), *DX = dev_from(b, NULL, nx);
    float *DW = dev_from(b, NULL, nw), *DB = dev_from(b, NULL, d->cout);
    ps_err err = { 0 };
    CHECK_MSG(b->ops->conv2d_forward(b->impl, d, X, W, B, Y, &err) == PS_OK, "%s", err.msg);
    CHECK_MSG(b->ops->conv2d_backward(b->impl, d, X, W, DY, DX, DW, DB, &err) == PS_OK, "%s", err.msg);
    conv_out o = { host_from(b, Y, ny), host_from(b, DX, nx), host_from(b, DW, nw),
                   host_from(b, DB, d->cout), NULL };
    /* dx == NULL (first layer): dw must not change */
    CHECK_MSG(b->ops->conv2d_backward(b->impl, d, X, W, DY, NULL, DW, DB, &err) == PS_OK, "%s", err.msg);
    o.dw_nodx = host_from(b, DW, nw);
    ps_backend_release(b, X); ps_backend_release(b, W); ps_backend_release(b, B);
    ps_backend_release(b, DY); ps_backend_release(b, Y); ps_backend_release(b, DX);
    ps_backend_release(b, DW); ps_backend_release(b, DB);
    return o;
}

static void conv_out_free(conv_out *o) { free(o->y); free(o->dx); free(o->dw); free(o->db); free(o->dw_nodx); }

static void cmp_conv(ps_backend *ref, ps_backend *dut, ps_conv_desc d, rng *r) {
    const size_t nx = (size_t)d.n * d.cin * d.h * d.w, nw = (size_t)d.cout * d.cin * d.kh * d.kw;
    const size_t ny = (size_t)d.n * d.cout * ps_conv_out_h(&d) * ps_conv_out_w(&d);
    float *x = host_random(nx, r), *w = host_random(nw, r), *b = host_random(d.cout, r);
    float *dy = host_random(ny, r);
    conv_out a = run_conv(ref, &d, x, w, b, dy), o = run_conv(dut, &d, x, w, b, dy);
    char what[128];
    const char *nm = dut->ops->name;
#define CMP(field, cnt) \
    snprintf(what, sizeof what, "%s conv n%d %d->%d %dx%d k%dx%d s%d p%d " #field, nm, d.n, d.cin, \
             d.cout, d.h, d.w, d.kh, d.kw, d.stride, d.pad); \
    check_scaled(what, o.field, a.field, cnt, CMP_TOL)
    CMP(y, ny); CMP(dx, nx); CMP(dw, nw); CMP(db, (size_t)d.cout); CMP(dw_nodx, nw);
#undef CMP
    conv_out_free(&a); conv_out_free(&o);
    free(x); free(w); free(b); free(dy);
}

typedef struct lin_out { float *y, *dx, *dw, *db; } lin_out;

static lin_out run_linear(ps_backend *b, const ps_linear_desc *d, const float *x, const float *w,
                          const float *bias, const float *dy) {
    const size_t nx = (size_t)d->n * d->in, nw = (size_t)d->out * d->in, ny = (size_t)d->n * d->out;
    float *X = dev_from(b, x, nx), *W = dev_from(b, w, nw), *B = dev_from(b, bias, d->out);
    float *DY = dev_from(b, dy, ny), *Y = dev_from(b, NULL, ny), *DX = dev_from(b, NULL, nx);
    float *DW = dev_from(b, NULL, nw), *DB = dev_from(b, NULL, d->out);
    ps_err err = { 0 };
    CHECK_MSG(b->ops->linear_forward(b->impl, d, X, W, B, Y, &err) == PS_OK, "%s", err.msg);
    CHECK_MSG(b->ops->linear_backward(b->impl, d, X, W, DY, DX, DW, DB, &err) == PS_OK, "%s", err.msg);
    lin_out o = { host_from(b, Y, ny), host_from(b, DX, nx), host_from(b, DW, nw), host_from(b, DB, d->out) };
    ps_backend_release(b, X); ps_backend_release(b, W); ps_backend_release(b, B);
    ps_backend_release(b, DY); ps_backend_release(b, Y); ps_backend_release(b, DX);
    ps_backend_release(b, DW); ps_backend_release(b, DB);
    return o;
}

static void cmp_linear(ps_backend *ref, ps_backend *dut, ps_linear_desc d, rng *r) {
    const size_t nx = (size_t)d.n * d.in, nw = (size_t)d.out * d.in, ny = (size_t)d.n * d.out;
    float *x = host_random(nx, r), *w = host_random(nw, r), *b = host_random(d.out, r);
    float *dy = host_random(ny, r);
    lin_out a = run_linear(ref, &d, x, w, b, dy), o = run_linear(dut, &d, x, w, b, dy);
    char what[128];
#define CMP(field, cnt) \
    snprintf(what, sizeof what, "%s linear n%d %d->%d " #field, dut->ops->name, d.n, d.in, d.out); \
    check_scaled(what, o.field, a.field, cnt, CMP_TOL)
    CMP(y, ny); CMP(dx, nx); CMP(dw, nw); CMP(db, (size_t)d.out);
#undef CMP
    free(a.y); free(a.dx); free(a.dw); free(a.db); free(o.y); free(o.dx); free(o.dw); free(o.db);
    free(x); free(w); free(b); free(dy);
}

/* Max-pool forward (with and without workspace) and backward. With ties,
 * x is drawn from {0, 1, 2} so most windows tie. */
static void run_pool(ps_backend *b, const ps_pool_desc *d, const float *x, const float *dy,
                     float **y_out, float **y_nows_out, float **dx_out) {
    const size_t nx = (size_t)d->n * d->c * d->h * d->w;
    const size_t ny = (size_t)d->n * d->c * ps_pool_out_h(d) * ps_pool_out_w(d);
    size_t wsz = b->ops->maxpool_workspace_size(b->impl, d);
    CHECK(wsz > 0);
    void *ws = b->ops->alloc(b->impl, wsz);
    float *X = dev_from(b, x, nx), *DY = dev_from(b, dy, ny), *Y = dev_from(b, NULL, ny);
    float *DX = dev_from(b, NULL, nx);
    ps_err err = { 0 };
    CHECK_MSG(b->ops->maxpool_forward(b->impl, d, X, Y, NULL, &err) == PS_OK, "%s", err.msg);
    *y_nows_out = host_from(b, Y, ny);
    CHECK_MSG(b->ops->maxpool_forward(b->impl, d, X, Y, ws, &err) == PS_OK, "%s", err.msg);
    CHECK_MSG(b->ops->maxpool_backward(b->impl, d, ws, DY, DX, &err) == PS_OK, "%s", err.msg);
    *y_out = host_from(b, Y, ny);
    *dx_out = host_from(b, DX, nx);
    b->ops->free(b->impl, ws);
    ps_backend_release(b, X); ps_backend_release(b, DY); ps_backend_release(b, Y);
    ps_backend_release(b, DX);
}

static void cmp_pool(ps_backend *ref, ps_backend *dut, ps_pool_desc d, int ties, rng *r) {
    const size_t nx = (size_t)d.n * d.c * d.h * d.w;
    const size_t ny = (size_t)d.n * d.c * ps_pool_out_h(&d) * ps_pool_out_w(&d);
    float *x = host_random(nx, r), *dy = host_random(ny, r);
    if (ties)
        for (size_t i = 0; i < nx; i++) x[i] = (float)(int)((x[i] + 1.0f) * 1.5f);
    float *ay, *ayn, *adx, *oy, *oyn, *odx;
    run_pool(ref, &d, x, dy, &ay, &ayn, &adx);
    run_pool(dut, &d, x, dy, &oy, &oyn, &odx);
    char what[128];
    snprintf(what, sizeof what, "%s maxpool n%d c%d %dx%d k%d s%d%s y", dut->ops->name, d.n, d.c,
             d.h, d.w, d.k, d.stride, ties ? " ties" : "");
    check_array(what, oy, ay, ny, 0, 0);
    strcat(what, " (no workspace)");
    check_array(what, oyn, ayn, ny, 0, 0);
    snprintf(what, sizeof what, "%s maxpool n%d c%d %dx%d k%d s%d%s dx", dut->ops->name, d.n, d.c,
             d.h, d.w, d.k, d.stride, ties ? " ties" : "");
    check_scaled(what, odx, adx, nx, 1e-6); /* sums of at most a few dy */
    free(ay); free(ayn); free(adx); free(oy); free(oyn); free(odx); free(x); free(dy);
}

/* relu, log-softmax and mul, including the in-place forms. */
static void cmp_small_ops(ps_backend *ref, ps_backend *dut, rng *r) {
    ps_backend *bs[2] = { ref, dut };
    char what[128];
    /* relu on the conv2 activation size, with exact zeros in x */
    {
        const int64_t n = 4 * 64 * 24 * 24;
        float *x = host_random(n, r), *dy = host_random(n, r);
        for (int64_t i = 0; i < n; i += 7) x[i] = 0.0f;
        float *y[2], *dx[2], *yi[2];
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *X = dev_from(b, x, n), *Y = dev_from(b, NULL, n), *DY = dev_from(b, dy, n);
            float *DX = dev_from(b, NULL, n);
            ps_err err = { 0 };
            CHECK_MSG(b->ops->relu_forward(b->impl, n, X, Y, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->relu_backward(b->impl, n, Y, DY, DX, &err) == PS_OK, "%s", err.msg);
            y[k] = host_from(b, Y, n); dx[k] = host_from(b, DX, n);
            CHECK_MSG(b->ops->relu_forward(b->impl, n, X, X, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->relu_backward(b->impl, n, X, DY, DY, &err) == PS_OK, "%s", err.msg);
            yi[k] = host_from(b, X, n);
            free(dx[k]); /* compare the in-place dx (DY) to the out-of-place one */
            float *dxo = host_from(b, DX, n), *dxi = host_from(b, DY, n);
            snprintf(what, sizeof what, "%s relu in-place dx", b->ops->name);
            check_array(what, dxi, dxo, (size_t)n, 0, 0);
            dx[k] = dxo;
            free(dxi);
            ps_backend_release(b, X); ps_backend_release(b, Y); ps_backend_release(b, DY);
            ps_backend_release(b, DX);
        }
        snprintf(what, sizeof what, "%s relu y", dut->ops->name);
        check_array(what, y[1], y[0], (size_t)n, 0, 0);
        snprintf(what, sizeof what, "%s relu in-place y", dut->ops->name);
        check_array(what, yi[1], y[0], (size_t)n, 0, 0);
        snprintf(what, sizeof what, "%s relu dx", dut->ops->name);
        check_array(what, dx[1], dx[0], (size_t)n, 0, 0);
        for (int k = 0; k < 2; k++) { free(y[k]); free(dx[k]); free(yi[k]); }
        free(x); free(dy);
    }
    /* log-softmax (4, 10) and a wider, shifted one */
    const int shapes[2][2] = { { 4, 10 }, { 3, 1000 } };
    for (int s = 0; s < 2; s++) {
        const int rows = shapes[s][0], cols = shapes[s][1];
        const size_t n = (size_t)rows * cols;
        float *x = host_random(n, r), *dy = host_random(n, r);
        for (size_t i = 0; i < n; i++) x[i] = 5.0f * x[i] + (s ? 50.0f : 0.0f);
        float *y[2], *dx[2];
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *X = dev_from(b, x, n), *Y = dev_from(b, NULL, n), *DY = dev_from(b, dy, n);
            float *DX = dev_from(b, NULL, n);
            ps_err err = { 0 };
            CHECK_MSG(b->ops->log_softmax_forward(b->impl, rows, cols, X, Y, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->log_softmax_backward(b->impl, rows, cols, Y, DY, DX, &err) == PS_OK,
                      "%s", err.msg);
            y[k] = host_from(b, Y, n); dx[k] = host_from(b, DX, n);
            ps_backend_release(b, X); ps_backend_release(b, Y); ps_backend_release(b, DY);
            ps_backend_release(b, DX);
        }
        snprintf(what, sizeof what, "%s log_softmax (%d,%d) y", dut->ops->name, rows, cols);
        check_array(what, y[1], y[0], n, 1e-5, 1e-5);
        snprintf(what, sizeof what, "%s log_softmax (%d,%d) dx", dut->ops->name, rows, cols);
        check_scaled(what, dx[1], dx[0], n, CMP_TOL);
        for (int k = 0; k < 2; k++) { free(y[k]); free(dx[k]); }
        free(x); free(dy);
    }
    /* mul (dropout mask), in place */
    {
        const int64_t n = 4 * 128;
        float *x = host_random(n, r), *mask = host_random(n, r), *y[2];
        for (int64_t i = 0; i < n; i++) mask[i] = mask[i] > 0 ? 2.0f : 0.0f;
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *X = dev_from(b, x, n), *M = dev_from(b, mask, n);
            CHECK(b->ops->mul(b->impl, n, X, M, X, NULL) == PS_OK);
            y[k] = host_from(b, X, n);
            ps_backend_release(b, X); ps_backend_release(b, M);
        }
        snprintf(what, sizeof what, "%s mul", dut->ops->name);
        check_array(what, y[1], y[0], (size_t)n, 0, 0);
        free(y[0]); free(y[1]); free(x); free(mask);
    }
}

/* softmax, embedding and scale: the backend against the reference. */
static void cmp_new_ops(ps_backend *ref, ps_backend *dut, rng *r) {
    ps_backend *bs[2] = { ref, dut };
    char what[128];
    const int shapes[3][2] = { { 4, 2 }, { 35, 50 }, { 3, 1000 } };
    for (int s = 0; s < 3; s++) {
        const int rows = shapes[s][0], cols = shapes[s][1];
        const size_t n = (size_t)rows * cols;
        float *x = host_random(n, r), *dy = host_random(n, r), *y[2], *dx[2];
        for (size_t i = 0; i < n; i++) x[i] = 5.0f * x[i] + (s == 2 ? 50.0f : 0.0f);
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *X = dev_from(b, x, n), *Y = dev_from(b, NULL, n), *DY = dev_from(b, dy, n), *DX = dev_from(b, NULL, n);
            ps_err err = { 0 };
            CHECK_MSG(b->ops->softmax_forward(b->impl, rows, cols, X, Y, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->softmax_backward(b->impl, rows, cols, Y, DY, DX, &err) == PS_OK, "%s", err.msg);
            y[k] = host_from(b, Y, n); dx[k] = host_from(b, DX, n);
            ps_backend_release(b, X); ps_backend_release(b, Y); ps_backend_release(b, DY); ps_backend_release(b, DX);
        }
        snprintf(what, sizeof what, "%s softmax (%d,%d) y", dut->ops->name, rows, cols);
        check_array(what, y[1], y[0], n, 1e-6, 1e-5);
        snprintf(what, sizeof what, "%s softmax (%d,%d) dx", dut->ops->name, rows, cols);
        check_scaled(what, dx[1], dx[0], n, CMP_TOL);
        for (int k = 0; k < 2; k++) { free(y[k]); free(dx[k]); }
        free(x); free(dy);
    }
    {   /* embedding over a (35 x 20) batch of ids into a 50 x 16 table: exact */
        const int64_t n = 700, num = 50, nrows_max = 50;
        const int dim = 16;
        int64_t *ids = malloc(n * sizeof *ids), *slot = malloc(n * sizeof *slot);
        for (int64_t i = 0; i < n; i++) { ids[i] = (int64_t)((rng_uniform(r) + 1.0f) * 0.5f * num) % num; slot[i] = ids[i]; }
        float *w = host_random((size_t)num * dim, r), *dy = host_random((size_t)n * dim, r), *y[2], *g[2];
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            int64_t *I = b->ops->alloc(b->impl, n * sizeof *I), *S = b->ops->alloc(b->impl, n * sizeof *S);
            ps_err err = { 0 };
            CHECK(b->ops->copy_to_device(b->impl, I, ids, n * sizeof *I, &err) == PS_OK);
            CHECK(b->ops->copy_to_device(b->impl, S, slot, n * sizeof *S, &err) == PS_OK);
            float *W = dev_from(b, w, (size_t)num * dim), *Y = dev_from(b, NULL, (size_t)n * dim);
            float *DY = dev_from(b, dy, (size_t)n * dim), *G = dev_from(b, NULL, (size_t)nrows_max * dim);
            CHECK_MSG(b->ops->embedding_forward(b->impl, n, dim, I, W, Y, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->embedding_backward(b->impl, n, dim, S, DY, nrows_max, G, &err) == PS_OK, "%s", err.msg);
            y[k] = host_from(b, Y, (size_t)n * dim); g[k] = host_from(b, G, (size_t)nrows_max * dim);
            ps_backend_release(b, I); ps_backend_release(b, S); ps_backend_release(b, W);
            ps_backend_release(b, Y); ps_backend_release(b, DY); ps_backend_release(b, G);
        }
        snprintf(what, sizeof what, "%s embedding y", dut->ops->name);
        check_array(what, y[1], y[0], (size_t)n * dim, 0, 0);
        snprintf(what, sizeof what, "%s embedding grows", dut->ops->name);
        check_array(what, g[1], g[0], (size_t)nrows_max * dim, 0, 0);   /* same summation order */
        for (int k = 0; k < 2; k++) { free(y[k]); free(g[k]); }
        free(ids); free(slot); free(w); free(dy);
    }
    {
        const int64_t n = 100000;
        float *x = host_random(n, r), *y[2];
        for (int k = 0; k < 2; k++) {
            float *X = dev_from(bs[k], x, n);
            CHECK(bs[k]->ops->scale(bs[k]->impl, n, X, 0.37f, NULL) == PS_OK);
            y[k] = host_from(bs[k], X, n);
            ps_backend_release(bs[k], X);
        }
        snprintf(what, sizeof what, "%s scale", dut->ops->name);
        check_array(what, y[1], y[0], (size_t)n, 0, 0);
        free(y[0]); free(y[1]); free(x);
    }
}

/* ---- upsampling (Upsample's resize, ConvTranspose2d's bias) ----
 * Every op here is linear in its input, so its backward must be the
 * forward's adjoint exactly: dx[i] = sum_o r[o] * F(e_i)[o] with e_i the
 * i-th unit input, the forward probed once per input element (on the
 * reference backend), the backward run on r. The resize cases: nearest at
 * 2x, at a given non-integer scale factor and to sizes up and down;
 * bilinear with and without align_corners, scale factors and sizes. */
static const ps_resize_desc resize_cases[] = {
    { 2, 3, 4, 5, 8, 10, 0, 0, 0.5f, 0.5f },
    { 1, 2, 5, 4, 8, 6, 0, 0, 1.0f / 1.7f, 1.0f / 1.7f },
    { 2, 2, 4, 5, 7, 3, 0, 0, 4.0f / 7.0f, 5.0f / 3.0f },
    { 2, 3, 4, 5, 8, 10, 1, 0, 0.5f, 0.5f },
    { 1, 2, 4, 5, 6, 11, 1, 0, 1.0f / 1.5f, 1.0f / 2.3f },
    { 2, 2, 4, 5, 7, 3, 1, 1, 3.0f / 6.0f, 4.0f / 2.0f },
    { 1, 2, 5, 4, 3, 2, 1, 0, 5.0f / 3.0f, 2.0f },
};

static void fd_upsampling(ps_backend *b, rng *r) {
    char what[96];
    for (size_t k = 0; k < sizeof resize_cases / sizeof resize_cases[0]; k++) {
        const ps_resize_desc *d = &resize_cases[k];
        const size_t nx = (size_t)d->n * d->c * d->h * d->w, ny = (size_t)d->n * d->c * d->oh * d->ow;
        float *e = host_zeros(nx), *y = host_zeros(ny), *rr = host_random(ny, r), *dx = host_zeros(nx),
              *adj = host_zeros(nx);
        for (size_t i = 0; i < nx; i++) {
            e[i] = 1.0f;
            CHECK(b->ops->resize_forward(b->impl, d, e, y, NULL) == PS_OK);
            double s = 0;
            for (size_t o = 0; o < ny; o++) s += (double)y[o] * rr[o];
            adj[i] = (float)s;
            e[i] = 0.0f;
        }
        for (size_t i = 0; i < nx; i++) dx[i] = 99.0f;   /* must be overwritten */
        CHECK(b->ops->resize_backward(b->impl, d, rr, dx, NULL) == PS_OK);
        snprintf(what, sizeof what, "resize case %zu (%s) dx = the forward's adjoint", k,
                 d->bilinear ? "bilinear" : "nearest");
        check_array(what, dx, adj, nx, 1e-5, 1e-5);
        free(e); free(y); free(rr); free(dx); free(adj);
    }
    /* bias: y += b per channel; db = sum of dy per channel (bias_add's adjoint in b) */
    {
        const ps_chan_desc d = { .n = 3, .c = 4, .s = 5, .layout = PS_LAYOUT_PLAIN };
        const size_t ny = 60;
        float *y = host_random(ny, r), *y0 = malloc(ny * sizeof *y0), *bias = host_random(4, r),
              *db = host_zeros(4), *want = host_zeros(4);
        memcpy(y0, y, ny * sizeof *y);
        CHECK(b->ops->bias_add(b->impl, &d, bias, y, NULL) == PS_OK);
        for (size_t i = 0; i < ny; i++) CHECK(y[i] == y0[i] + bias[i / 5 % 4]);
        for (size_t i = 0; i < ny; i++) want[i / 5 % 4] += y0[i];
        CHECK(b->ops->bias_grad(b->impl, &d, y0, db, NULL) == PS_OK);
        check_array("bias_grad", db, want, 4, 1e-6, 1e-6);
        free(y); free(y0); free(bias); free(db); free(want);
    }
}

/* The other backend against the reference on the same cases and on a
 * decoder's sizes (64 channels of 14x14 to 28x28, batch 8). */
static void cmp_upsampling(ps_backend *ref, ps_backend *dut, rng *r) {
    ps_backend *bs[2] = { ref, dut };
    char what[128];
    ps_resize_desc cases[sizeof resize_cases / sizeof resize_cases[0] + 2];
    size_t nc = 0;
    for (; nc < sizeof resize_cases / sizeof resize_cases[0]; nc++) cases[nc] = resize_cases[nc];
    cases[nc++] = (ps_resize_desc){ 8, 64, 14, 14, 28, 28, 0, 0, 0.5f, 0.5f };
    cases[nc++] = (ps_resize_desc){ 8, 64, 14, 14, 28, 28, 1, 0, 0.5f, 0.5f };
    for (size_t k = 0; k < nc; k++) {
        const ps_resize_desc *d = &cases[k];
        const size_t nx = (size_t)d->n * d->c * d->h * d->w, ny = (size_t)d->n * d->c * d->oh * d->ow;
        float *x = host_random(nx, r), *dy = host_random(ny, r), *y[2], *dx[2];
        for (int j = 0; j < 2; j++) {
            ps_backend *b = bs[j];
            float *X = dev_from(b, x, nx), *Y = dev_from(b, NULL, ny), *DY = dev_from(b, dy, ny),
                  *DX = dev_from(b, NULL, nx);
            ps_err err = { 0 };
            CHECK_MSG(b->ops->resize_forward(b->impl, d, X, Y, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->resize_backward(b->impl, d, DY, DX, &err) == PS_OK, "%s", err.msg);
            y[j] = host_from(b, Y, ny);
            dx[j] = host_from(b, DX, nx);
            ps_backend_release(b, X); ps_backend_release(b, Y); ps_backend_release(b, DY); ps_backend_release(b, DX);
        }
        snprintf(what, sizeof what, "%s resize case %zu y", dut->ops->name, k);
        check_array(what, y[1], y[0], ny, 1e-6, 1e-5);
        snprintf(what, sizeof what, "%s resize case %zu dx", dut->ops->name, k);
        check_scaled(what, dx[1], dx[0], nx, CMP_TOL);
        for (int j = 0; j < 2; j++) { free(y[j]); free(dx[j]); }
        free(x); free(dy);
    }
    {
        const ps_chan_desc d = { .n = 8, .c = 16, .s = 28 * 28, .layout = PS_LAYOUT_PLAIN };
        const size_t ny = (size_t)8 * 16 * 28 * 28;
        float *y0 = host_random(ny, r), *bias = host_random(16, r), *y[2], *db[2];
        for (int j = 0; j < 2; j++) {
            ps_backend *b = bs[j];
            float *Y = dev_from(b, y0, ny), *B = dev_from(b, bias, 16), *DB = dev_from(b, NULL, 16);
            CHECK(b->ops->bias_grad(b->impl, &d, Y, DB, NULL) == PS_OK);
            CHECK(b->ops->bias_add(b->impl, &d, B, Y, NULL) == PS_OK);
            y[j] = host_from(b, Y, ny);
            db[j] = host_from(b, DB, 16);
            ps_backend_release(b, Y); ps_backend_release(b, B); ps_backend_release(b, DB);
        }
        snprintf(what, sizeof what, "%s bias_add", dut->ops->name);
        check_array(what, y[1], y[0], ny, 0, 0);
        snprintf(what, sizeof what, "%s bias_grad", dut->ops->name);
        check_array(what, db[1], db[0], 16, 1e-5, 1e-5);
        for (int j = 0; j < 2; j++) { free(y[j]); free(db[j]); }
        free(y0); free(bias);
    }
}

/* ---- spatial transformers (AffineGrid's affine_grid, GridSample's
 * grid_sample) ----
 * affine_grid is linear in theta and grid_sample in x: each backward must
 * be its forward's adjoint (probed per input element on the reference, as
 * the upsampling ops). The grid gradient is checked against PyTorch
 * autograd by test_kinds' golden cases, and here across backends. Cases:
 * every mode, padding mode and align_corners, grids reaching past [-1, 1]
 * (1.3 x uniform). */
static ps_gridsample_desc gs_case(int k) {
    const ps_gridsample_desc d = { 2, 2, 4, 5, 3, 4, k % 2 ? PS_GS_NEAREST : PS_GS_BILINEAR, k / 2 % 3, k / 6 };
    return d;
}

static float *gs_grid(size_t n, rng *r) {
    float *g = host_random(n, r);
    for (size_t i = 0; i < n; i++) g[i] *= 1.3f;
    return g;
}

static void fd_spatial(ps_backend *b, rng *r) {
    char what[96];
    for (int ac = 0; ac < 2; ac++) {   /* affine_grid: dtheta = the forward's adjoint */
        const ps_affgrid_desc d = { 2, 3, 4, ac };
        const size_t nt = 12, ng = 2 * 3 * 4 * 2;
        float *e = host_zeros(nt), *g = host_zeros(ng), *rr = host_random(ng, r), *dt = host_zeros(nt),
              *adj = host_zeros(nt);
        for (size_t i = 0; i < nt; i++) {
            e[i] = 1.0f;
            CHECK(b->ops->affine_grid(b->impl, &d, e, g, NULL) == PS_OK);
            double s = 0;
            for (size_t o = 0; o < ng; o++) s += (double)g[o] * rr[o];
            adj[i] = (float)s;
            e[i] = 0.0f;
        }
        for (size_t i = 0; i < nt; i++) dt[i] = 99.0f;   /* must be overwritten */
        CHECK(b->ops->affine_grid_backward(b->impl, &d, rr, dt, NULL) == PS_OK);
        snprintf(what, sizeof what, "affine_grid (align_corners %d) dtheta = the forward's adjoint", ac);
        check_array(what, dt, adj, nt, 1e-5, 1e-5);
        free(e); free(g); free(rr); free(dt); free(adj);
    }
    for (int k = 0; k < 12; k++) {   /* grid_sample: dx = the forward's adjoint in x */
        const ps_gridsample_desc d = gs_case(k);
        const size_t nx = (size_t)d.n * d.c * d.h * d.w, ny = (size_t)d.n * d.c * d.oh * d.ow;
        float *grid = gs_grid((size_t)d.n * d.oh * d.ow * 2, r), *e = host_zeros(nx), *y = host_zeros(ny),
              *rr = host_random(ny, r), *dx = host_zeros(nx), *adj = host_zeros(nx);
        for (size_t i = 0; i < nx; i++) {
            e[i] = 1.0f;
            CHECK(b->ops->grid_sample(b->impl, &d, e, grid, y, NULL) == PS_OK);
            double s = 0;
            for (size_t o = 0; o < ny; o++) s += (double)y[o] * rr[o];
            adj[i] = (float)s;
            e[i] = 0.0f;
        }
        for (size_t i = 0; i < nx; i++) dx[i] = 99.0f;
        CHECK(b->ops->grid_sample_backward(b->impl, &d, e, grid, rr, dx, NULL, NULL) == PS_OK);
        snprintf(what, sizeof what, "grid_sample case %d (mode %d, padding %d, align_corners %d) dx = the "
                 "forward's adjoint", k, d.mode, d.padding, d.align_corners);
        check_array(what, dx, adj, nx, 1e-5, 1e-5);
        free(grid); free(e); free(y); free(rr); free(dx); free(adj);
    }
}

/* The other backend against the reference: the small cases and the STN
 * tutorial's sizes (8 digits of 28x28, their grid). */
static void cmp_spatial(ps_backend *ref, ps_backend *dut, rng *r) {
    ps_backend *bs[2] = { ref, dut };
    char what[128];
    for (int k = 0; k < 14; k++) {
        ps_gridsample_desc d = gs_case(k % 12);
        if (k >= 12) d = (ps_gridsample_desc){ 8, 1, 28, 28, 28, 28, PS_GS_BILINEAR, k - 12, 0 };
        const ps_affgrid_desc ad = { d.n, d.oh, d.ow, d.align_corners };
        const size_t nx = (size_t)d.n * d.c * d.h * d.w, ny = (size_t)d.n * d.c * d.oh * d.ow,
                     ng = (size_t)d.n * d.oh * d.ow * 2, nt = (size_t)d.n * 6;
        float *x = host_random(nx, r), *grid = gs_grid(ng, r), *dy = host_random(ny, r), *theta = host_random(nt, r);
        float *y[2], *dx[2], *dg[2], *ag[2], *dt[2];
        for (int j = 0; j < 2; j++) {
            ps_backend *b = bs[j];
            float *X = dev_from(b, x, nx), *G = dev_from(b, grid, ng), *DY = dev_from(b, dy, ny),
                  *Y = dev_from(b, NULL, ny), *DX = dev_from(b, NULL, nx), *DG = dev_from(b, NULL, ng),
                  *T = dev_from(b, theta, nt), *AG = dev_from(b, NULL, ng), *DT = dev_from(b, NULL, nt);
            ps_err err = { 0 };
            CHECK_MSG(b->ops->grid_sample(b->impl, &d, X, G, Y, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->grid_sample_backward(b->impl, &d, X, G, DY, DX, DG, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->affine_grid(b->impl, &ad, T, AG, &err) == PS_OK, "%s", err.msg);
            CHECK_MSG(b->ops->affine_grid_backward(b->impl, &ad, DG, DT, &err) == PS_OK, "%s", err.msg);
            y[j] = host_from(b, Y, ny);
            dx[j] = host_from(b, DX, nx);
            dg[j] = host_from(b, DG, ng);
            ag[j] = host_from(b, AG, ng);
            dt[j] = host_from(b, DT, nt);
            ps_backend_release(b, X); ps_backend_release(b, G); ps_backend_release(b, DY); ps_backend_release(b, Y);
            ps_backend_release(b, DX); ps_backend_release(b, DG); ps_backend_release(b, T);
            ps_backend_release(b, AG); ps_backend_release(b, DT);
        }
        snprintf(what, sizeof what, "%s grid_sample case %d y", dut->ops->name, k);
        check_array(what, y[1], y[0], ny, 1e-6, 1e-5);
        snprintf(what, sizeof what, "%s grid_sample case %d dx", dut->ops->name, k);
        check_scaled(what, dx[1], dx[0], nx, CMP_TOL);
        snprintf(what, sizeof what, "%s grid_sample case %d dgrid", dut->ops->name, k);
        check_scaled(what, dg[1], dg[0], ng, CMP_TOL);
        snprintf(what, sizeof what, "%s affine_grid case %d grid", dut->ops->name, k);
        check_array(what, ag[1], ag[0], ng, 1e-6, 1e-5);
        snprintf(what, sizeof what, "%s affine_grid case %d dtheta", dut->ops->name, k);
        check_scaled(what, dt[1], dt[0], nt, CMP_TOL);
        for (int j = 0; j < 2; j++) { free(y[j]); free(dx[j]); free(dg[j]); free(ag[j]); free(dt[j]); }
        free(x); free(grid); free(dy); free(theta);
    }
}

/* Two threads running conv2d_forward concurrently on one fresh backend
 * (so they also race to create the cached primitive) must match a
 * sequential run bit for bit. */
typedef struct conv_job {
    ps_backend *b;
    const ps_conv_desc *d;
    const float *x, *w, *bias;
    float *y;
    int reps;
    ps_status st;
} conv_job;

static void *conv_job_run(void *arg) {
    conv_job *j = arg;
    j->st = PS_OK;
    for (int i = 0; i < j->reps && j->st == PS_OK; i++)
        j->st = j->b->ops->conv2d_forward(j->b->impl, j->d, j->x, j->w, j->bias, j->y, NULL);
    return NULL;
}

static void check_concurrent(const char *name, rng *r) {
    const ps_conv_desc d = { .n = 4, .cin = 32, .h = 26, .w = 26, .cout = 64, .kh = 3, .kw = 3,
                             .stride = 1, .pad = 0 };
    const size_t nx = (size_t)d.n * d.cin * d.h * d.w, nw = (size_t)d.cout * d.cin * 9;
    const size_t ny = (size_t)d.n * d.cout * ps_conv_out_h(&d) * ps_conv_out_w(&d);
    ps_err err = { 0 };
    ps_backend *b = ps_backend_create(name, 0, 1, &err);
    CHECK_MSG(b != NULL, "%s", err.msg);
    if (!b) return;
    float *xs[2], *ys[2], *seq = dev_from(b, NULL, ny);
    float *w = dev_from(b, NULL, nw), *bias = dev_from(b, NULL, d.cout);
    float *hw = host_random(nw, r), *hb = host_random(d.cout, r);
    CHECK(b->ops->copy_to_device(b->impl, w, hw, nw * sizeof *hw, NULL) == PS_OK);
    CHECK(b->ops->copy_to_device(b->impl, bias, hb, d.cout * sizeof *hb, NULL) == PS_OK);
    conv_job jobs[2];
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
        float *hx = host_random(nx, r);
        xs[t] = dev_from(b, hx, nx);
        ys[t] = dev_from(b, NULL, ny);
        free(hx);
        jobs[t] = (conv_job){ b, &d, xs[t], w, bias, ys[t], 3, PS_OK };
    }
    for (int t = 0; t < 2; t++) CHECK(pthread_create(&th[t], NULL, conv_job_run, &jobs[t]) == 0);
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < 2; t++) {
        CHECK(jobs[t].st == PS_OK);
        CHECK(b->ops->conv2d_forward(b->impl, &d, xs[t], w, bias, seq, NULL) == PS_OK);
        float *got = host_from(b, ys[t], ny), *want = host_from(b, seq, ny);
        char what[64];
        snprintf(what, sizeof what, "%s concurrent conv thread %d", name, t);
        check_array(what, got, want, ny, 0, 0);
        free(got); free(want);
        ps_backend_release(b, xs[t]); ps_backend_release(b, ys[t]);
    }
    ps_backend_release(b, seq); ps_backend_release(b, w); ps_backend_release(b, bias);
    free(hw); free(hb);
    ps_backend_free(b);
}

/* Blocked activation layouts (backend.h), when the backend offers them:
 * the backend's reorder against the index formula written out here, and
 * conv / max-pool on blocked activations against the reference backend on
 * plain ones (host-side blocking, independent of the backend's reorder). */
static void host_block(const float *src, float *dst, int n, int c, int h, int w, int B, int to_blocked) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < c; j++)
            for (int p = 0; p < h * w; p++) {
                size_t plain = ((size_t)i * c + j) * h * w + p;
                size_t blk = (((size_t)i * (c / B) + j / B) * h * w + p) * B + j % B;
                if (to_blocked) dst[blk] = src[plain];
                else dst[plain] = src[blk];
            }
}

static void cmp_blocked(ps_backend *ref, ps_backend *dut, rng *r) {
    const ps_backend_ops *ops = dut->ops;
    if (!ops->blocked_layout || ops->blocked_layout(dut->impl, 64) <= 0) {
        printf("  %s: no blocked layout offered; plain only\n", ops->name);
        return;
    }
    const int B = ops->blocked_layout(dut->impl, 64);
    CHECK(ops->reorder != NULL && 64 % B == 0);
    CHECK_MSG(ops->blocked_layout(dut->impl, B + 1) == 0, "%s offers a blocked layout for %d channels", ops->name, B + 1);
    char what[128];
    ps_err err = { 0 };
    { /* reorder both ways */
        const int n = 2, c = 2 * B, h = 3, w = 5;
        const size_t cnt = (size_t)n * c * h * w;
        float *x = host_random(cnt, r), *want = host_zeros(cnt);
        host_block(x, want, n, c, h, w, B, 1);
        float *X = dev_from(dut, x, cnt), *Y = dev_from(dut, NULL, cnt), *Z = dev_from(dut, NULL, cnt);
        CHECK_MSG(ops->reorder(dut->impl, n, c, h, w, X, PS_LAYOUT_PLAIN, Y, PS_LAYOUT_BLOCKED, &err) == PS_OK, "%s", err.msg);
        CHECK_MSG(ops->reorder(dut->impl, n, c, h, w, Y, PS_LAYOUT_BLOCKED, Z, PS_LAYOUT_PLAIN, &err) == PS_OK, "%s", err.msg);
        float *y = host_from(dut, Y, cnt), *z = host_from(dut, Z, cnt);
        snprintf(what, sizeof what, "%s reorder plain->blocked%d", ops->name, B);
        check_array(what, y, want, cnt, 0, 0);
        snprintf(what, sizeof what, "%s reorder blocked%d->plain", ops->name, B);
        check_array(what, z, x, cnt, 0, 0);
        ps_backend_release(dut, X); ps_backend_release(dut, Y); ps_backend_release(dut, Z);
        free(x); free(want); free(y); free(z);
    }
    /* conv: plain -> blocked (the first layer) and blocked -> blocked */
    const ps_conv_desc convs[2] = {
        { .n = 3, .cin = 1, .h = 12, .w = 10, .cout = 2 * B, .kh = 3, .kw = 3, .stride = 1, .pad = 0,
          .src_layout = PS_LAYOUT_PLAIN, .dst_layout = PS_LAYOUT_BLOCKED },
        { .n = 3, .cin = B, .h = 10, .w = 9, .cout = 2 * B, .kh = 3, .kw = 3, .stride = 1, .pad = 0,
          .src_layout = PS_LAYOUT_BLOCKED, .dst_layout = PS_LAYOUT_BLOCKED },
    };
    for (int k = 0; k < 2; k++) {
        ps_conv_desc d = convs[k], dp = d;
        dp.src_layout = dp.dst_layout = PS_LAYOUT_PLAIN;
        const int oh = ps_conv_out_h(&d), ow = ps_conv_out_w(&d);
        const size_t nx = (size_t)d.n * d.cin * d.h * d.w, nw = (size_t)d.cout * d.cin * d.kh * d.kw;
        const size_t ny = (size_t)d.n * d.cout * oh * ow;
        float *x = host_random(nx, r), *w = host_random(nw, r), *b = host_random(d.cout, r);
        float *dy = host_random(ny, r), *xb = host_zeros(nx), *dyb = host_zeros(ny);
        if (d.src_layout == PS_LAYOUT_BLOCKED) host_block(x, xb, d.n, d.cin, d.h, d.w, B, 1);
        else memcpy(xb, x, nx * sizeof *x);
        host_block(dy, dyb, d.n, d.cout, oh, ow, B, 1);
        conv_out a = run_conv(ref, &dp, x, w, b, dy), o = run_conv(dut, &d, xb, w, b, dyb);
        float *y = host_zeros(ny), *dx = host_zeros(nx);
        host_block(o.y, y, d.n, d.cout, oh, ow, B, 0);
        if (d.src_layout == PS_LAYOUT_BLOCKED) host_block(o.dx, dx, d.n, d.cin, d.h, d.w, B, 0);
        else memcpy(dx, o.dx, nx * sizeof *dx);
#define CMPB(got, want, cnt, field) \
        snprintf(what, sizeof what, "%s conv blocked%d %d->%d %s", ops->name, B, d.cin, d.cout, field); \
        check_scaled(what, got, want, cnt, CMP_TOL)
        CMPB(y, a.y, ny, "y"); CMPB(dx, a.dx, nx, "dx"); CMPB(o.dw, a.dw, nw, "dw");
        CMPB(o.db, a.db, (size_t)d.cout, "db"); CMPB(o.dw_nodx, a.dw_nodx, nw, "dw (no dx)");
#undef CMPB
        conv_out_free(&a); conv_out_free(&o);
        free(x); free(w); free(b); free(dy); free(xb); free(dyb); free(y); free(dx);
    }
    /* max-pool on blocked activations, with ties */
    {
        ps_pool_desc d = { .n = 2, .c = 2 * B, .h = 8, .w = 9, .k = 2, .stride = 2, .layout = PS_LAYOUT_BLOCKED };
        ps_pool_desc dp = d;
        dp.layout = PS_LAYOUT_PLAIN;
        const int oh = ps_pool_out_h(&d), ow = ps_pool_out_w(&d);
        const size_t nx = (size_t)d.n * d.c * d.h * d.w, ny = (size_t)d.n * d.c * oh * ow;
        float *x = host_random(nx, r), *dy = host_random(ny, r), *xb = host_zeros(nx), *dyb = host_zeros(ny);
        for (size_t i = 0; i < nx; i++) x[i] = (float)(int)((x[i] + 1.0f) * 1.5f);
        host_block(x, xb, d.n, d.c, d.h, d.w, B, 1);
        host_block(dy, dyb, d.n, d.c, oh, ow, B, 1);
        float *ay, *ayn, *adx, *oy, *oyn, *odx;
        run_pool(ref, &dp, x, dy, &ay, &ayn, &adx);
        run_pool(dut, &d, xb, dyb, &oy, &oyn, &odx);
        float *y = host_zeros(ny), *dx = host_zeros(nx);
        host_block(oy, y, d.n, d.c, oh, ow, B, 0);
        host_block(odx, dx, d.n, d.c, d.h, d.w, B, 0);
        snprintf(what, sizeof what, "%s maxpool blocked%d ties y", ops->name, B);
        check_array(what, y, ay, ny, 0, 0);
        snprintf(what, sizeof what, "%s maxpool blocked%d ties dx", ops->name, B);
        check_scaled(what, dx, adx, nx, 1e-6);
        free(ay); free(ayn); free(adx); free(oy); free(oyn); free(odx);
        free(x); free(dy); free(xb); free(dyb); free(y); free(dx);
    }
}

static void cmp_backend(ps_backend *ref, const char *name, rng *r) {
    ps_err err = { 0 };
    ps_backend *dut = ps_backend_create(name, 0, 2, &err);
    CHECK_MSG(dut != NULL, "create %s: %s", name, err.msg);
    if (!dut) return;
    /* the MNIST CNN */
    cmp_conv(ref, dut, (ps_conv_desc){ .n = 4, .cin = 1, .h = 28, .w = 28, .cout = 32, .kh = 3,
                                       .kw = 3, .stride = 1, .pad = 0 }, r);
    cmp_conv(ref, dut, (ps_conv_desc){ .n = 4, .cin = 32, .h = 26, .w = 26, .cout = 64, .kh = 3,
                                       .kw = 3, .stride = 1, .pad = 0 }, r);
    cmp_pool(ref, dut, (ps_pool_desc){ .n = 4, .c = 64, .h = 24, .w = 24, .k = 2, .stride = 2 }, 0, r);
    cmp_pool(ref, dut, (ps_pool_desc){ .n = 4, .c = 64, .h = 24, .w = 24, .k = 2, .stride = 2 }, 1, r);
    cmp_linear(ref, dut, (ps_linear_desc){ .n = 4, .in = 9216, .out = 128 }, r);
    cmp_linear(ref, dut, (ps_linear_desc){ .n = 4, .in = 128, .out = 10 }, r);
    /* odd shapes: strided+padded conv, non-square kernel, odd pool sizes */
    cmp_conv(ref, dut, (ps_conv_desc){ .n = 3, .cin = 5, .h = 13, .w = 11, .cout = 7, .kh = 3,
                                       .kw = 3, .stride = 2, .pad = 1 }, r);
    cmp_conv(ref, dut, (ps_conv_desc){ .n = 2, .cin = 3, .h = 9, .w = 10, .cout = 4, .kh = 5,
                                       .kw = 2, .stride = 3, .pad = 2 }, r);
    cmp_pool(ref, dut, (ps_pool_desc){ .n = 2, .c = 3, .h = 7, .w = 9, .k = 2, .stride = 2 }, 0, r);
    cmp_pool(ref, dut, (ps_pool_desc){ .n = 2, .c = 3, .h = 7, .w = 9, .k = 2, .stride = 2 }, 1, r);
    cmp_pool(ref, dut, (ps_pool_desc){ .n = 2, .c = 3, .h = 11, .w = 11, .k = 3, .stride = 2 }, 1, r);
    cmp_linear(ref, dut, (ps_linear_desc){ .n = 3, .in = 17, .out = 5 }, r);
    /* a vocabulary-wide output: the dnnl backend's forward in chunks of
     * outputs (linear_fwd_chunks: 2 MB of weights each, the last one short) */
    cmp_linear(ref, dut, (ps_linear_desc){ .n = 5, .in = 200, .out = 6007 }, r);
    cmp_small_ops(ref, dut, r);
    cmp_new_ops(ref, dut, r);
    cmp_upsampling(ref, dut, r);
    cmp_spatial(ref, dut, r);
    cmp_blocked(ref, dut, r);
    ref_pool_ties(dut);
    check_sgd(dut, r);
    /* the same shapes again: served from the primitive cache */
    cmp_conv(ref, dut, (ps_conv_desc){ .n = 3, .cin = 5, .h = 13, .w = 11, .cout = 7, .kh = 3,
                                       .kw = 3, .stride = 2, .pad = 1 }, r);
    /* a failing library call is PS_ERR_INTERNAL naming the call (a negative
     * pad gives negative output dims; the buffers are never touched) */
    {
        const ps_conv_desc bad = { .n = 1, .cin = 1, .h = 8, .w = 8, .cout = 1, .kh = 3, .kw = 3,
                                   .stride = 1, .pad = -5 };
        float buf[64] = { 0 };
        ps_err e = { 0 };
        CHECK(dut->ops->conv2d_forward(dut->impl, &bad, buf, buf, buf, buf, &e) == PS_ERR_INTERNAL);
        CHECK_MSG(e.code == PS_ERR_INTERNAL && strstr(e.msg, "failed"), "%s", e.msg);
        printf("expected error: %s\n", e.msg);
    }
    ps_backend_free(dut);
    check_concurrent(name, r);
}

static void check_registry(void) {
    const char *const *names = ps_backend_names();
    int have_ref = 0, count = 0;
    for (; names[count]; count++) {
        have_ref |= strcmp(names[count], "ref") == 0;
        if (!strcmp(names[count], "cuda")) continue;  /* needs a GPU: tests/test_cuda_layers.c */
        ps_err err = { 0 };
        ps_backend *b = ps_backend_create(names[count], 0, 1, &err);
        CHECK_MSG(b != NULL, "create %s: %s", names[count], err.msg);
        if (b) {
            CHECK(strcmp(b->ops->name, names[count]) == 0);
            float *p = ps_backend_alloc_floats(b, 3);
            CHECK(p != NULL && ((uintptr_t)p & 63) == 0);
            ps_backend_release(b, p);
        }
        ps_backend_free(b);
    }
    CHECK(have_ref);
    CHECK(count >= 2); /* ref and dnnl */
    ps_err err = { 0 };
    CHECK(ps_backend_create("no-such-backend", 0, 0, &err) == NULL);
    CHECK(err.code == PS_ERR_NOT_FOUND);
    for (int i = 0; i < count; i++) CHECK_MSG(strstr(err.msg, names[i]), "%s", err.msg);
    ps_backend_free(NULL);
}

/* ---- the cross-entropy (loss.c) ---- */

/* Every vector width this CPU has against a double-precision loop: loss and
 * gradient, odd row lengths (the vector tails), in place (grad = logits)
 * bit-identical to out of place, -inf logits (exp 0) and a NaN (NaN loss). */
static void check_cross_entropy(rng *r) {
    const int64_t ks[] = { 1, 7, 16, 33, 250, 10000 };
    const int widths[] = { 0, 128, 256, 512 };
    for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
        int64_t k = ks[ki], n = 5;
        float *z = host_zeros((size_t)(n * k)), *g = host_zeros((size_t)(n * k)), *zz = host_zeros((size_t)(n * k));
        double *gr = calloc((size_t)(n * k), sizeof *gr);
        int64_t tgt[5];
        PS_ASSERT(gr);
        for (int64_t i = 0; i < n * k; i++) z[i] = 8.0f * rng_uniform(r);
        if (k > 2) z[k + 1] = -INFINITY, z[2 * k] = -200.0f, z[3 * k + 2] = 80.0f;
        for (int64_t i = 0; i < n; i++) tgt[i] = (i * 7 + 3) % k;
        double ref = 0;
        for (int64_t i = 0; i < n; i++) {
            const float *zi = z + i * k;
            double mx = zi[0], s = 0;
            for (int64_t v = 1; v < k; v++) mx = zi[v] > mx ? zi[v] : mx;
            for (int64_t v = 0; v < k; v++) s += exp((double)zi[v] - mx);
            double lse = mx + log(s);
            ref += lse - zi[tgt[i]];
            for (int64_t v = 0; v < k; v++) gr[i * k + v] = exp((double)zi[v] - lse) / (double)n;
            gr[i * k + tgt[i]] -= 1.0 / (double)n;
        }
        ref /= (double)n;
        for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
            double loss = 0, loss2 = 0;
            if (!ps_cross_entropy_width(widths[wi], z, tgt, n, k, g, &loss)) continue;
            CHECK_CLOSE(loss, ref, 1e-6, 1e-6);
            double worst = 0;
            for (int64_t i = 0; i < n * k; i++) {
                double d = fabs(g[i] - gr[i]) / (fabs(gr[i]) + 1e-12);
                if (d > worst) worst = d;
            }
            CHECK_MSG(worst < 2e-6, "cross-entropy width %d k %lld: gradient relative error %g", widths[wi],
                      (long long)k, worst);
            memcpy(zz, z, (size_t)(n * k) * sizeof *z);
            ps_cross_entropy_width(widths[wi], zz, tgt, n, k, zz, &loss2);
            CHECK_MSG(loss2 == loss && !memcmp(zz, g, (size_t)(n * k) * sizeof *g),
                      "cross-entropy width %d k %lld: in place differs", widths[wi], (long long)k);
            CHECK_CLOSE(ps_cross_entropy_width(widths[wi], z, tgt, n, k, NULL, &loss2) ? loss2 : loss, loss, 0, 0);
            if (k > 2) {
                memcpy(zz, z, (size_t)(n * k) * sizeof *z);
                zz[4 * k + k / 2] = NAN;
                ps_cross_entropy_width(widths[wi], zz, tgt, n, k, g, &loss2);
                CHECK_MSG(isnan(loss2), "cross-entropy width %d k %lld: a NaN logit gives loss %g", widths[wi],
                          (long long)k, loss2);
            }
        }
        free(z); free(g); free(zz); free(gr);
    }
    /* ps_sum_squares (the gradient norms): every length's vector tail */
    float x[77];
    for (int i = 0; i < 77; i++) x[i] = 3.0f * rng_uniform(r);
    for (int n = 0; n <= 77; n += 7) {
        double ref = 0;
        for (int i = 0; i < n; i++) ref += (double)x[i] * x[i];
        CHECK_CLOSE(ps_sum_squares(x, n), ref, 1e-12, 1e-14);
    }
}

int main(void) {
    rng r = { 0x9e3779b97f4a7c15ull };
    check_registry();

    ps_err err = { 0 };
    ps_backend *ref = ps_backend_create("ref", 0, 0, &err);
    CHECK_MSG(ref != NULL, "%s", err.msg);
    if (!ref) return check_summary("test_nn_layers");

    fd_conv(ref, (ps_conv_desc){ .n = 2, .cin = 3, .h = 7, .w = 6, .cout = 4, .kh = 3, .kw = 3,
                                 .stride = 1, .pad = 0 }, &r);
    fd_conv(ref, (ps_conv_desc){ .n = 2, .cin = 2, .h = 7, .w = 8, .cout = 3, .kh = 3, .kw = 2,
                                 .stride = 2, .pad = 1 }, &r);
    fd_linear(ref, (ps_linear_desc){ .n = 3, .in = 7, .out = 5 }, &r);
    fd_pool(ref, (ps_pool_desc){ .n = 2, .c = 3, .h = 6, .w = 6, .k = 2, .stride = 2 }, &r);
    fd_pool(ref, (ps_pool_desc){ .n = 1, .c = 2, .h = 7, .w = 9, .k = 2, .stride = 2 }, &r);
    fd_pool(ref, (ps_pool_desc){ .n = 1, .c = 2, .h = 7, .w = 7, .k = 3, .stride = 2 }, &r);
    fd_small_ops(ref, &r);
    fd_new_ops(ref, &r);
    fd_upsampling(ref, &r);
    fd_spatial(ref, &r);
    ref_pool_ties(ref);
    check_sgd(ref, &r);
    check_cross_entropy(&r);

    const char *const *names = ps_backend_names();
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], "ref") != 0 && strcmp(names[i], "cuda") != 0) cmp_backend(ref, names[i], &r);

    ps_backend_free(ref);
    return check_summary("test_nn_layers");
}
