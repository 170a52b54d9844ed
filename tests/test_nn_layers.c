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

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

typedef struct rng { uint64_t s; } rng;

static float rng_uniform(rng *r) { /* [-1, 1) */
    r->s ^= r->s << 13; r->s ^= r->s >> 7; r->s ^= r->s << 17;
    return (float)((r->s >> 40) * (1.0 / (1 << 23)) - 1.0);
}

static float *host_random(size_t n, rng *r) {
    float *p = malloc((n ? n : 1) * sizeof *p);
    PS_ASSERT(p);
    for (size_t i = 0; i < n; i++) p[i] = rng_uniform(r);
    return p;
}

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

/* One check per array: every |got - want| <= atol + rtol * |want|. */
static void check_array(const char *what, const float *got, const float *want, size_t n,
                        double atol, double rtol) {
    size_t bad = 0, worst = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]), lim = atol + rtol * fabs(want[i]);
        if (!(diff <= lim)) {
            bad++;
            if (isnan(diff) || diff - lim > worst_excess) {
                worst_excess = isnan(diff) ? INFINITY : diff - lim;
                worst = i;
            }
        }
    }
    CHECK_MSG(bad == 0, "%s: %zu of %zu elements off (atol %g rtol %g), worst [%zu] got %.9g want %.9g",
              what, bad, n, atol, rtol, worst, n ? got[worst] : 0.0f, n ? want[worst] : 0.0f);
}

/* ---- 1. reference backend vs finite differences ---- */

typedef enum { FD_CONV, FD_RELU, FD_POOL, FD_LINEAR, FD_LOGSOFTMAX, FD_MUL } fd_op;

typedef struct fd_case {
    ps_backend *b;
    fd_op op;
    ps_conv_desc conv;
    ps_pool_desc pool;
    ps_linear_desc lin;
    int rows, cols;      /* log-softmax */
    int64_t count;       /* relu, mul */
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
            CHECK(b->ops->sgd_update(b->impl, n, w, g, buf, &s, NULL) == PS_OK);
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

static void check_registry(void) {
    const char *const *names = ps_backend_names();
    int have_ref = 0, count = 0;
    for (; names[count]; count++) {
        have_ref |= strcmp(names[count], "ref") == 0;
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
    ps_err err = { 0 };
    CHECK(ps_backend_create("no-such-backend", 0, 0, &err) == NULL);
    CHECK(err.code == PS_ERR_NOT_FOUND);
    for (int i = 0; i < count; i++) CHECK_MSG(strstr(err.msg, names[i]), "%s", err.msg);
    ps_backend_free(NULL);
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
    ref_pool_ties(ref);
    check_sgd(ref, &r);

    ps_backend_free(ref);
    return check_summary("test_nn_layers");
}
