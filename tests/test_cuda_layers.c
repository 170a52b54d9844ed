/* test_cuda_layers.c - every op of the CUDA backend against the reference
 * backend, forward and backward, on the MNIST CNN's shapes and odd ones:
 *  - conv (stride, padding, non-square kernels; dx NULL), linear, ReLU
 *    (in place too), max-pool with and without ties, log-softmax, dropout's
 *    mul, add, SGD (momentum, weight decay), Adam and the row-sparse
 *    updates (sgd_update_rows, adam_update_rows), permute and its inverse,
 *    bit for bit; a recurrent time step's gates (rnn_cell_forward and
 *    rnn_cell_backward, LSTM and GRU) within 1e-5; numpy broadcasting
 *    (binary_bcast bit for bit, each operand's summed gradient within 1e-5;
 *    add, sub, mul, div, max, min (ties on a grid) over left, right, middle, both, scalar, one shape);
 *    torch.where (where, where_backward) with tensors and numbers, bit for bit;
 *  - a failing cuDNN call is PS_ERR_INTERNAL naming the call, file and line;
 *  - two threads running conv on one backend match a sequential run;
 *  - copy_from_peer between two backends, peer path and the pinned-host
 *    path (PS_CUDA_STAGE_COPY=host), including more than one staging chunk;
 *  - a device index past the last one is refused naming the devices found.
 * Without a CUDA device (or in a build without CUDA) it prints
 * "skipped: no CUDA device" and exits 77: a skip, never a pass.
 */
#include "backend.h"
#include "check.h"
#include "support/random.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NAME "test_cuda_layers"
/* Tolerance relative to an array's largest magnitude for sums computed in
 * another order (cuDNN/cuBLAS in float vs the reference in double). */
#define CMP_TOL 1e-4

/* Device buffer of n floats, filled from host (or left as is when NULL). */
static float *up(ps_backend *b, const float *host, size_t n) {
    float *d = ps_backend_alloc_floats(b, (int64_t)(n ? n : 1));
    PS_ASSERT(d);
    ps_err err = { 0 };
    if (host) CHECK_MSG(b->ops->copy_to_device(b->impl, d, host, n * sizeof *host, &err) == PS_OK, "%s", err.msg);
    return d;
}

/* Host copy of a device buffer; frees the device buffer. */
static float *down(ps_backend *b, float *dev, size_t n) {
    float *h = calloc(n ? n : 1, sizeof *h);
    PS_ASSERT(h);
    ps_err err = { 0 };
    CHECK_MSG(b->ops->copy_to_host(b->impl, h, dev, n * sizeof *h, &err) == PS_OK, "%s", err.msg);
    ps_backend_release(b, dev);
    return h;
}

/* An op call that must succeed; the call passes &e_ as its ps_err. */
#define OK(call) do { ps_err e_ = { 0 }; ps_status s_ = (call); \
    CHECK_MSG(s_ == PS_OK, "%s: %s", #call, e_.msg); } while (0)

/* ---- conv ---- */

typedef struct conv_res { float *y, *dx, *dw, *db, *dw_nodx; } conv_res;

static conv_res run_conv(ps_backend *b, const ps_conv_desc *d, const float *x, const float *w,
                         const float *bias, const float *dy) {
    const int groups = d->groups > 1 ? d->groups : 1;   /* weight (cout, cin / groups, kh, kw) */
    const size_t nx = (size_t)d->n * d->cin * d->h * d->w, nw = (size_t)d->cout * (d->cin / groups) * d->kh * d->kw;
    const size_t ny = (size_t)d->n * d->cout * ps_conv_out_h(d) * ps_conv_out_w(d);
    float *X = up(b, x, nx), *W = up(b, w, nw), *B = up(b, bias, d->cout), *DY = up(b, dy, ny);
    float *Y = up(b, NULL, ny), *DX = up(b, NULL, nx), *DW = up(b, NULL, nw), *DB = up(b, NULL, d->cout);
    float *DW2 = up(b, NULL, nw);
    OK(b->ops->conv2d_forward(b->impl, d, X, W, B, Y, &e_));
    OK(b->ops->conv2d_backward(b->impl, d, X, W, DY, DX, DW, DB, &e_));
    OK(b->ops->conv2d_backward(b->impl, d, X, W, DY, NULL, DW2, DB, &e_));
    conv_res o = { down(b, Y, ny), down(b, DX, nx), down(b, DW, nw), down(b, DB, d->cout), down(b, DW2, nw) };
    ps_backend_release(b, X); ps_backend_release(b, W); ps_backend_release(b, B); ps_backend_release(b, DY);
    return o;
}

static void cmp_conv(ps_backend *ref, ps_backend *cu, ps_conv_desc d, rng *r) {
    const int groups = d.groups > 1 ? d.groups : 1;
    const size_t nx = (size_t)d.n * d.cin * d.h * d.w, nw = (size_t)d.cout * (d.cin / groups) * d.kh * d.kw;
    const size_t ny = (size_t)d.n * d.cout * ps_conv_out_h(&d) * ps_conv_out_w(&d);
    float *x = host_random(nx, r), *w = host_random(nw, r), *b = host_random(d.cout, r), *dy = host_random(ny, r);
    conv_res a = run_conv(ref, &d, x, w, b, dy), o = run_conv(cu, &d, x, w, b, dy);
    char what[128];
#define CMP(f, cnt) snprintf(what, sizeof what, "conv n%d %d->%d %dx%d k%dx%d s%d p%d d%d g%d " #f, \
                             d.n, d.cin, d.cout, d.h, d.w, d.kh, d.kw, d.stride_h ? d.stride_h : d.stride, \
                             d.stride_h ? d.pad_h : d.pad, d.dil_h, d.groups); \
    check_scaled(what, o.f, a.f, cnt, CMP_TOL)
    CMP(y, ny); CMP(dx, nx); CMP(dw, nw); CMP(db, (size_t)d.cout); CMP(dw_nodx, nw);
#undef CMP
    free(a.y); free(a.dx); free(a.dw); free(a.db); free(a.dw_nodx);
    free(o.y); free(o.dx); free(o.dw); free(o.db); free(o.dw_nodx);
    free(x); free(w); free(b); free(dy);
}

/* ---- linear ---- */

static void cmp_linear(ps_backend *ref, ps_backend *cu, ps_linear_desc d, rng *r) {
    const size_t nx = (size_t)d.n * d.in, nw = (size_t)d.out * d.in, ny = (size_t)d.n * d.out;
    float *x = host_random(nx, r), *w = host_random(nw, r), *bias = host_random(d.out, r), *dy = host_random(ny, r);
    float *res[2][5];
    ps_backend *bs[2] = { ref, cu };
    for (int k = 0; k < 2; k++) {
        ps_backend *b = bs[k];
        float *X = up(b, x, nx), *W = up(b, w, nw), *B = up(b, bias, d.out), *DY = up(b, dy, ny);
        float *Y = up(b, NULL, ny), *Y0 = up(b, NULL, ny), *DX = up(b, NULL, nx), *DW = up(b, NULL, nw);
        float *DB = up(b, NULL, d.out);
        OK(b->ops->linear_forward(b->impl, &d, X, W, B, Y, &e_));
        OK(b->ops->linear_forward(b->impl, &d, X, W, NULL, Y0, &e_)); /* no bias */
        OK(b->ops->linear_backward(b->impl, &d, X, W, DY, DX, DW, DB, &e_));
        res[k][0] = down(b, Y, ny); res[k][1] = down(b, Y0, ny); res[k][2] = down(b, DX, nx);
        res[k][3] = down(b, DW, nw); res[k][4] = down(b, DB, d.out);
        ps_backend_release(b, X); ps_backend_release(b, W); ps_backend_release(b, B); ps_backend_release(b, DY);
    }
    const char *names[5] = { "y", "y (no bias)", "dx", "dw", "db" };
    const size_t cnt[5] = { ny, ny, nx, nw, (size_t)d.out };
    for (int f = 0; f < 5; f++) {
        char what[128];
        snprintf(what, sizeof what, "linear n%d %d->%d %s", d.n, d.in, d.out, names[f]);
        check_scaled(what, res[1][f], res[0][f], cnt[f], CMP_TOL);
        free(res[0][f]); free(res[1][f]);
    }
    free(x); free(w); free(bias); free(dy);
}

/* ---- max pooling: y and dx must equal the reference exactly ---- */

static void cmp_pool(ps_backend *ref, ps_backend *cu, ps_pool_desc d, int ties, rng *r) {
    const size_t nx = (size_t)d.n * d.c * d.h * d.w;
    const size_t ny = (size_t)d.n * d.c * ps_pool_out_h(&d) * ps_pool_out_w(&d);
    float *x = host_random(nx, r), *dy = host_random(ny, r);
    if (ties) /* values in {0, 1, 2}: most windows tie */
        for (size_t i = 0; i < nx; i++) x[i] = (float)(int)((x[i] + 1.0f) * 1.5f);
    float *res[2][3];
    ps_backend *bs[2] = { ref, cu };
    for (int k = 0; k < 2; k++) {
        ps_backend *b = bs[k];
        void *ws = b->ops->alloc(b->impl, b->ops->maxpool_workspace_size(b->impl, &d));
        PS_ASSERT(ws);
        float *X = up(b, x, nx), *DY = up(b, dy, ny), *Y = up(b, NULL, ny), *Yn = up(b, NULL, ny);
        float *DX = up(b, NULL, nx);
        OK(b->ops->maxpool_forward(b->impl, &d, X, Yn, NULL, &e_));
        OK(b->ops->maxpool_forward(b->impl, &d, X, Y, ws, &e_));
        OK(b->ops->maxpool_backward(b->impl, &d, ws, DY, DX, &e_));
        res[k][0] = down(b, Y, ny); res[k][1] = down(b, Yn, ny); res[k][2] = down(b, DX, nx);
        b->ops->free(b->impl, ws);
        ps_backend_release(b, X); ps_backend_release(b, DY);
    }
    const char *names[3] = { "y", "y (no workspace)", "dx" };
    const size_t cnt[3] = { ny, ny, nx };
    for (int f = 0; f < 3; f++) {
        char what[128];
        snprintf(what, sizeof what, "maxpool n%d c%d %dx%d k%d s%d%s %s", d.n, d.c, d.h, d.w, d.k, d.stride,
                 ties ? " ties" : "", names[f]);
        check_array(what, res[1][f], res[0][f], cnt[f], 0, 0);
        free(res[0][f]); free(res[1][f]);
    }
    free(x); free(dy);
}

/* ---- relu, log-softmax, mul, add, sgd, adam, row-sparse updates ---- */

static void cmp_small_ops(ps_backend *ref, ps_backend *cu, rng *r) {
    ps_backend *bs[2] = { ref, cu };
    char what[128];
    {   /* relu on conv1's output size (odd count for the flat descriptor), exact zeros in x */
        const int64_t n = 3 * 32 * 26 * 26 + 5;
        float *x = host_random(n, r), *dy = host_random(n, r);
        for (int64_t i = 0; i < n; i += 7) x[i] = 0.0f;
        float *res[2][4];
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *X = up(b, x, n), *Y = up(b, NULL, n), *DY = up(b, dy, n), *DX = up(b, NULL, n);
            OK(b->ops->relu_forward(b->impl, n, X, Y, &e_));
            OK(b->ops->relu_backward(b->impl, n, Y, DY, DX, &e_));
            OK(b->ops->relu_forward(b->impl, n, X, X, &e_));     /* in place */
            OK(b->ops->relu_backward(b->impl, n, X, DY, DY, &e_)); /* in place */
            res[k][0] = down(b, Y, n); res[k][1] = down(b, DX, n); res[k][2] = down(b, X, n);
            res[k][3] = down(b, DY, n);
        }
        const char *names[4] = { "relu y", "relu dx", "relu in-place y", "relu in-place dx" };
        for (int f = 0; f < 4; f++) {
            check_array(names[f], res[1][f], res[0][f], (size_t)n, 0, 0);
            free(res[0][f]); free(res[1][f]);
        }
        free(x); free(dy);
    }
    const int shapes[3][2] = { { 8, 10 }, { 3, 1000 }, { 512, 10 } };
    for (int s = 0; s < 3; s++) {
        const int rows = shapes[s][0], cols = shapes[s][1];
        const size_t n = (size_t)rows * cols;
        float *x = host_random(n, r), *dy = host_random(n, r);
        for (size_t i = 0; i < n; i++) x[i] = 5.0f * x[i] + (s == 1 ? 50.0f : 0.0f);
        float *res[2][2];
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *X = up(b, x, n), *Y = up(b, NULL, n), *DY = up(b, dy, n), *DX = up(b, NULL, n);
            OK(b->ops->log_softmax_forward(b->impl, rows, cols, X, Y, &e_));
            OK(b->ops->log_softmax_backward(b->impl, rows, cols, Y, DY, DX, &e_));
            res[k][0] = down(b, Y, n); res[k][1] = down(b, DX, n);
            ps_backend_release(b, X); ps_backend_release(b, DY);
        }
        snprintf(what, sizeof what, "log_softmax (%d,%d) y", rows, cols);
        check_array(what, res[1][0], res[0][0], n, 1e-5, 1e-5);
        snprintf(what, sizeof what, "log_softmax (%d,%d) dx", rows, cols);
        check_scaled(what, res[1][1], res[0][1], n, CMP_TOL);
        for (int k = 0; k < 2; k++) { free(res[k][0]); free(res[k][1]); }
        free(x); free(dy);
    }
    {   /* mul (dropout mask, in place) and add: exact */
        const int64_t n = 8 * 64 * 12 * 12;
        float *x = host_random(n, r), *mask = host_random(n, r), *z = host_random(n, r);
        for (int64_t i = 0; i < n; i++) mask[i] = mask[i] > -0.5f ? 1.0f / 0.75f : 0.0f;
        float *res[2][2];
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *X = up(b, x, n), *M = up(b, mask, n), *Z = up(b, z, n);
            OK(b->ops->mul(b->impl, n, X, M, X, &e_));
            OK(b->ops->add(b->impl, n, Z, X, &e_));
            res[k][0] = down(b, X, n); res[k][1] = down(b, Z, n);
            ps_backend_release(b, M);
        }
        check_array("mul", res[1][0], res[0][0], (size_t)n, 0, 0);
        check_array("add", res[1][1], res[0][1], (size_t)n, 0, 0);
        for (int k = 0; k < 2; k++) { free(res[k][0]); free(res[k][1]); }
        free(x); free(mask); free(z);
    }
    {   /* sgd: three steps, each configuration; the kernel rounds like the reference */
        const int64_t n = 1000;
        const ps_sgd_desc cfgs[3] = { { 0.1f, 0.9f, 0.01f, 0 }, { 0.05f, 0.0f, 0.0f, 0 }, { 0.1f, 0.0f, 0.1f, 0 } };
        for (int c = 0; c < 3; c++) {
            float *w0 = host_random(n, r), *g[3], *res[2];
            for (int s = 0; s < 3; s++) g[s] = host_random(n, r);
            for (int k = 0; k < 2; k++) {
                ps_backend *b = bs[k];
                float *zeros = calloc(n, sizeof *zeros);
                float *W = up(b, w0, n), *B = cfgs[c].momentum != 0 ? up(b, zeros, n) : NULL;
                float *W2 = up(b, zeros, n);
                for (int s = 0; s < 3; s++) {   /* step 1 out of place (snapshot steps), the others in place */
                    float *G = up(b, g[s], n), *out = s == 1 ? W2 : W;
                    ps_sgd_desc sd = cfgs[c];
                    sd.first_step = s == 0;
                    OK(b->ops->sgd_update(b->impl, n, out, W, G, B, &sd, &e_));
                    if (out != W) { W2 = W; W = out; }
                    ps_backend_release(b, G);
                }
                res[k] = down(b, W, n);
                ps_backend_release(b, B);
                ps_backend_release(b, W2);
                free(zeros);
            }
            snprintf(what, sizeof what, "sgd lr %g mom %g wd %g", cfgs[c].lr, cfgs[c].momentum, cfgs[c].weight_decay);
            check_array(what, res[1], res[0], (size_t)n, 0, 0);
            free(res[0]); free(res[1]); free(w0);
            for (int s = 0; s < 3; s++) free(g[s]);
        }
    }
    {   /* adam: three steps with and without weight decay; the kernel rounds like the reference */
        const int64_t n = 1000;
        const ps_adam_desc cfgs[2] = { { 0.01, 0.8, 0.99, 1e-6, 0.05, 0 }, { 1e-3, 0.9, 0.999, 1e-8, 0.0, 0 } };
        for (int c = 0; c < 2; c++) {
            float *w0 = host_random(n, r), *g[3], *res[2][3];
            for (int s = 0; s < 3; s++) g[s] = host_random(n, r);
            for (int i = 0; i < n; i += 11) g[0][i] = 0.0f;
            for (int k = 0; k < 2; k++) {
                ps_backend *b = bs[k];
                float *zeros = calloc(n, sizeof *zeros);
                float *W = up(b, w0, n), *M = up(b, zeros, n), *V = up(b, zeros, n), *W2 = up(b, zeros, n);
                for (int s = 0; s < 3; s++) {   /* step 1 out of place (snapshot steps), the others in place */
                    float *G = up(b, g[s], n), *out = s == 1 ? W2 : W;
                    ps_adam_desc ad = cfgs[c];
                    ad.step = s + 1;
                    OK(b->ops->adam_update(b->impl, n, out, W, G, M, V, &ad, &e_));
                    if (out != W) { W2 = W; W = out; }
                    ps_backend_release(b, G);
                }
                ps_backend_release(b, W2);
                res[k][0] = down(b, W, n); res[k][1] = down(b, M, n); res[k][2] = down(b, V, n);
                free(zeros);
            }
            const char *names[3] = { "w", "exp_avg", "exp_avg_sq" };
            for (int f = 0; f < 3; f++) {
                snprintf(what, sizeof what, "adam lr %g wd %g: %s", cfgs[c].lr, cfgs[c].weight_decay, names[f]);
                check_array(what, res[1][f], res[0][f], (size_t)n, 0, 0);
                free(res[0][f]); free(res[1][f]);
            }
            free(w0);
            for (int s = 0; s < 3; s++) free(g[s]);
        }
    }
    {   /* row-sparse sgd and SparseAdam: two steps on listed rows of a (50, 33) table */
        enum { R = 50, W = 33, NR = 7 };
        const int64_t rows[2][NR] = { { 4, 49, 0, 17, 3, 30, 8 }, { 17, 1, 4, 48, 22, 9, 35 } };
        float *w0 = host_random(R * W, r), *g[2];
        for (int s = 0; s < 2; s++) g[s] = host_random(NR * W, r);
        float *res[2][4];
        const ps_adam_desc ad0 = { 0.01, 0.9, 0.999, 1e-4, 0.0, 0 };
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *zeros = calloc(R * W, sizeof *zeros);
            float *WS = up(b, w0, R * W), *WA = up(b, w0, R * W), *M = up(b, zeros, R * W), *V = up(b, zeros, R * W);
            for (int s = 0; s < 2; s++) {
                int64_t *RI = b->ops->alloc(b->impl, sizeof rows[s]);
                PS_ASSERT(RI);
                OK(b->ops->copy_to_device(b->impl, RI, rows[s], sizeof rows[s], &e_));
                float *G = up(b, g[s], NR * W);
                OK(b->ops->sgd_update_rows(b->impl, NR, W, RI, WS, G, 0.1f, &e_));
                ps_adam_desc ad = ad0;
                ad.step = s + 1;
                OK(b->ops->adam_update_rows(b->impl, NR, W, RI, WA, G, M, V, &ad, &e_));
                ps_backend_release(b, G);
                ps_backend_release(b, RI);
            }
            res[k][0] = down(b, WS, R * W); res[k][1] = down(b, WA, R * W);
            res[k][2] = down(b, M, R * W); res[k][3] = down(b, V, R * W);
            free(zeros);
        }
        const char *names[4] = { "sgd_update_rows w", "adam_update_rows w", "adam_update_rows exp_avg",
                                 "adam_update_rows exp_avg_sq" };
        for (int f = 0; f < 4; f++) {
            check_array(names[f], res[1][f], res[0][f], (size_t)R * W, 0, 0);
            free(res[0][f]); free(res[1][f]);
        }
        free(w0); free(g[0]); free(g[1]);
    }
}

/* The ops added for issue 9: softmax (cuDNN accurate), embedding gather
 * and scatter-add (sample order: exact), scale (exact). */
static void cmp_new_ops(ps_backend *ref, ps_backend *cu, rng *r) {
    ps_backend *bs[2] = { ref, cu };
    char what[96];
    const int shapes[2][2] = { { 6, 2 }, { 35, 1000 } };
    for (int s = 0; s < 2; s++) {
        const int rows = shapes[s][0], cols = shapes[s][1];
        const size_t n = (size_t)rows * cols;
        float *x = host_random(n, r), *dy = host_random(n, r), *res[2][2];
        for (size_t i = 0; i < n; i++) x[i] *= 5.0f;
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *X = up(b, x, n), *Y = up(b, NULL, n), *DY = up(b, dy, n), *DX = up(b, NULL, n);
            OK(b->ops->softmax_forward(b->impl, rows, cols, X, Y, &e_));
            OK(b->ops->softmax_backward(b->impl, rows, cols, Y, DY, DX, &e_));
            res[k][0] = down(b, Y, n); res[k][1] = down(b, DX, n);
            ps_backend_release(b, X); ps_backend_release(b, DY);
        }
        snprintf(what, sizeof what, "softmax (%d,%d) y", rows, cols);
        check_array(what, res[1][0], res[0][0], n, 1e-6, 1e-5);
        snprintf(what, sizeof what, "softmax (%d,%d) dx", rows, cols);
        check_scaled(what, res[1][1], res[0][1], n, CMP_TOL);
        for (int k = 0; k < 2; k++) { free(res[k][0]); free(res[k][1]); }
        free(x); free(dy);
    }
    {
        const int64_t n = 700, num = 50;
        const int dim = 16;
        int64_t *ids = malloc(n * sizeof *ids);
        for (int64_t i = 0; i < n; i++) ids[i] = (int64_t)((rng_uniform(r) + 1.0f) * 0.5f * num) % num;
        float *w = host_random((size_t)num * dim, r), *dy = host_random((size_t)n * dim, r), *res[2][2];
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            int64_t *I = b->ops->alloc(b->impl, n * sizeof *I);
            OK(b->ops->copy_to_device(b->impl, I, ids, n * sizeof *I, &e_));
            float *W = up(b, w, (size_t)num * dim), *Y = up(b, NULL, (size_t)n * dim), *DY = up(b, dy, (size_t)n * dim);
            float *G = up(b, NULL, (size_t)num * dim);
            OK(b->ops->embedding_forward(b->impl, n, dim, I, W, Y, &e_));
            OK(b->ops->embedding_backward(b->impl, n, dim, I, DY, num, G, &e_));   /* slot = id */
            res[k][0] = down(b, Y, (size_t)n * dim); res[k][1] = down(b, G, (size_t)num * dim);
            ps_backend_release(b, I); ps_backend_release(b, W); ps_backend_release(b, DY);
        }
        check_array("embedding y", res[1][0], res[0][0], (size_t)n * dim, 0, 0);
        check_array("embedding grows", res[1][1], res[0][1], (size_t)num * dim, 0, 0);
        for (int k = 0; k < 2; k++) { free(res[k][0]); free(res[k][1]); }
        free(ids); free(w); free(dy);
    }
    {
        const int64_t n = 100000;
        float *x = host_random(n, r), *res[2];
        for (int k = 0; k < 2; k++) {
            float *X = up(bs[k], x, n);
            OK(bs[k]->ops->scale(bs[k]->impl, n, X, 0.37f, &e_));
            res[k] = down(bs[k], X, n);
        }
        check_array("scale", res[1], res[0], (size_t)n, 0, 0);
        free(res[0]); free(res[1]); free(x);
    }
    {   /* permute (convnext's NCHW <-> NHWC, and a 4-D sample) and its inverse: copies, bit for bit */
        const ps_permute_desc ds[2] = { { 3, 3, { 16, 5, 7 }, { 1, 2, 0 } }, { 2, 4, { 2, 3, 4, 5 }, { 2, 0, 3, 1 } } };
        for (int t = 0; t < 2; t++) {
            const ps_permute_desc d = ds[t], inv = ps_permute_inverse(&d);
            int64_t n = d.n;
            for (int k = 0; k < d.ndim; k++) n *= d.dims[k];
            float *x = host_random((size_t)n, r), *res[2][2];
            for (int k = 0; k < 2; k++) {
                float *X = up(bs[k], x, (size_t)n), *Y = up(bs[k], NULL, (size_t)n), *B = up(bs[k], NULL, (size_t)n);
                OK(bs[k]->ops->permute(bs[k]->impl, &d, X, Y, &e_));
                OK(bs[k]->ops->permute(bs[k]->impl, &inv, Y, B, &e_));
                res[k][0] = down(bs[k], Y, (size_t)n); res[k][1] = down(bs[k], B, (size_t)n);
                ps_backend_release(bs[k], X);
            }
            snprintf(what, sizeof what, "permute %d y", t);
            check_array(what, res[1][0], res[0][0], (size_t)n, 0, 0);
            snprintf(what, sizeof what, "permute %d back", t);
            check_array(what, res[1][1], x, (size_t)n, 0, 0);
            for (int k = 0; k < 2; k++) { free(res[k][0]); free(res[k][1]); }
            free(x);
        }
    }
}

/* ---- recurrent layers: a time step's gates (rnn_cell_forward/backward), LSTM and GRU, vs the reference ---- */

static void cmp_rnn_cells(ps_backend *ref, ps_backend *cu, rng *r) {
    ps_backend *bs[2] = { ref, cu };
    char what[96];
    for (int gru = 0; gru < 2; gru++) {
        const ps_rnn_cell_desc d = { gru, 9, 13 };
        const size_t nh = (size_t)(d.n * d.H), ng = nh * (gru ? 3 : 4), na = nh * 4;
        float *gx = host_random(ng, r), *gh = host_random(ng, r), *hp = host_random(nh, r), *cp = host_random(nh, r);
        float *dh = host_random(nh, r), *dc = host_random(nh, r), *res[2][7];
        for (int k = 0; k < 2; k++) {
            ps_backend *b = bs[k];
            float *GX = up(b, gx, ng), *GH = up(b, gh, ng), *HP = up(b, hp, nh), *CP = up(b, cp, nh);
            float *H = up(b, NULL, nh), *C = up(b, NULL, nh), *A = up(b, NULL, na), *DH = up(b, dh, nh);
            float *DC = up(b, dc, nh), *DGX = up(b, NULL, ng), *DGH = up(b, NULL, ng), *DHP = up(b, NULL, nh);
            OK(b->ops->rnn_cell_forward(b->impl, &d, GX, GH, HP, CP, H, C, A, &e_));
            OK(b->ops->rnn_cell_backward(b->impl, &d, A, HP, CP, C, DH, DC, DGX, DGH, DHP, &e_));
            res[k][0] = down(b, H, nh); res[k][1] = down(b, C, nh); res[k][2] = down(b, A, na);
            res[k][3] = down(b, DGX, ng); res[k][4] = down(b, DGH, ng); res[k][5] = down(b, DHP, nh);
            res[k][6] = down(b, DC, nh);
            ps_backend_release(b, GX); ps_backend_release(b, GH); ps_backend_release(b, HP);
            ps_backend_release(b, CP); ps_backend_release(b, DH);
        }
        static const char *const names[7] = { "h", "c", "act", "dgx", "dgh", "dh_prev", "dc_prev" };
        const size_t lens[7] = { nh, nh, na, ng, ng, nh, nh };
        for (int j = 0; j < 7; j++) {
            if (gru && (j == 1 || j == 6)) continue;   /* a GRU has no cell state */
            snprintf(what, sizeof what, "rnn_cell %s %s", gru ? "GRU" : "LSTM", names[j]);
            check_array(what, res[1][j], res[0][j], lens[j], 1e-6, 1e-5);
        }
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 7; j++) free(res[k][j]);
        free(gx); free(gh); free(hp); free(cp); free(dh); free(dc);
    }
}

/* ---- numpy broadcasting (binary_bcast, binary_bcast_backward): each op over the right operand broadcast,
 * the left one, a middle dim, both along dims of their own, a scalar per sample, one shape ---- */

static void cmp_bcast(ps_backend *ref, ps_backend *cu, rng *r) {
    static const int64_t shapes[][3][4] = {   /* y, a, b: (n, d1, d2, d3) */
        {{3, 4, 5, 6}, {3, 4, 5, 6}, {3, 4, 5, 1}}, {{3, 4, 5, 6}, {3, 1, 1, 1}, {3, 4, 5, 6}},
        {{2, 4, 5, 6}, {2, 4, 1, 6}, {2, 4, 5, 6}}, {{2, 4, 5, 6}, {2, 4, 1, 6}, {2, 1, 5, 1}},
        {{2, 7, 3, 9}, {2, 7, 3, 9}, {2, 7, 3, 9}}, {{5, 16, 8, 8}, {5, 16, 1, 1}, {5, 16, 8, 8}}};
    static const char *const ops[6] = {"add", "sub", "mul", "div", "max", "min"};
    ps_backend *bs[2] = {ref, cu};
    char what[96];
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++)
        for (int op = PS_BINARY_ADD; op <= PS_BINARY_MIN; op++) {
            ps_bcast_desc d = {.op = op, .ndim = 4};
            size_t n[3] = {1, 1, 1};
            for (int k = 0; k < 4; k++) {
                d.y[k] = shapes[t][0][k];
                d.a[k] = shapes[t][1][k];
                d.b[k] = shapes[t][2][k];
                for (int j = 0; j < 3; j++) n[j] *= (size_t)shapes[t][j][k];
            }
            float *a = host_random(n[1], r), *b = host_random(n[2], r), *dy = host_random(n[0], r), *res[2][3];
            for (size_t i = 0; i < n[2]; i++) b[i] = 0.5f + (b[i] < 0 ? -b[i] : b[i]);   /* away from 0 */
            if (op >= PS_BINARY_MAX) {   /* max, min: values on a grid of 1/4, so that many pairs tie */
                for (size_t i = 0; i < n[1]; i++) a[i] = 0.25f * (float)(int)(4.0f * a[i]) + 0.5f;
                for (size_t i = 0; i < n[2]; i++) b[i] = 0.25f * (float)(int)(4.0f * b[i]);
            }
            for (int k = 0; k < 2; k++) {
                ps_backend *be = bs[k];
                float *A = up(be, a, n[1]), *B = up(be, b, n[2]), *DY = up(be, dy, n[0]);
                float *Y = up(be, NULL, n[0]), *DA = up(be, NULL, n[1]), *DB = up(be, NULL, n[2]);
                OK(be->ops->binary_bcast(be->impl, &d, A, B, Y, &e_));
                OK(be->ops->binary_bcast_backward(be->impl, &d, 0, A, B, DY, DA, &e_));
                OK(be->ops->binary_bcast_backward(be->impl, &d, 1, A, B, DY, DB, &e_));
                res[k][0] = down(be, Y, n[0]);
                res[k][1] = down(be, DA, n[1]);
                res[k][2] = down(be, DB, n[2]);
                ps_backend_release(be, A); ps_backend_release(be, B); ps_backend_release(be, DY);
            }
            static const char *const names[3] = {"y", "da", "db"};
            for (int j = 0; j < 3; j++) {
                snprintf(what, sizeof what, "binary_bcast %s case %zu %s", ops[op], t, names[j]);
                if (j == 0) check_array(what, res[1][j], res[0][j], n[j], 0, 0);   /* one rounding: bit for bit */
                else check_array(what, res[1][j], res[0][j], n[j], 1e-6, 1e-5);
            }
            for (int k = 0; k < 2; k++)
                for (int j = 0; j < 3; j++) free(res[k][j]);
            free(a); free(b); free(dy);
        }
}

/* ---- convolutions past MNIST's: a batched group's 256 samples, a 1x1, dilation with unequal strides,
 * padding and a rectangular kernel, and a grouped one ---- */

static void cmp_conv_more(ps_backend *ref, ps_backend *cu, rng *r) {
    cmp_conv(ref, cu, (ps_conv_desc){256, 32, 26, 26, 64, 3, 3, 1, 0}, r);
    cmp_conv(ref, cu, (ps_conv_desc){4, 16, 7, 7, 24, 1, 1, 1, 0}, r);
    cmp_conv(ref, cu, (ps_conv_desc){.n = 2, .cin = 6, .h = 15, .w = 12, .cout = 5, .kh = 3, .kw = 2, .stride_h = 2,
                                     .stride_w = 1, .pad_h = 2, .pad_w = 1, .dil_h = 2, .dil_w = 3, .groups = 1}, r);
    cmp_conv(ref, cu, (ps_conv_desc){.n = 2, .cin = 8, .h = 9, .w = 9, .cout = 12, .kh = 3, .kw = 3, .stride_h = 1,
                                     .stride_w = 1, .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 4}, r);
}

/* ---- bias_add and bias_grad over (n, c, s): against the reference (which sums in double too); more
 * channels than a block's threads, one plane, planes of one value ---- */

static void cmp_bias(ps_backend *ref, ps_backend *cu, rng *r) {
    static const ps_chan_desc shapes[] = {{.n = 3, .c = 5, .s = 7}, {.n = 32, .c = 64, .s = 576},
                                          {.n = 2, .c = 300, .s = 1}, {.n = 1, .c = 1, .s = 100003}};
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const ps_chan_desc d = shapes[t];
        const size_t ny = (size_t)d.n * d.c * (size_t)d.s;
        float *y = host_random(ny, r), *b = host_random((size_t)d.c, r), *res[2][2];
        ps_backend *bs[2] = {ref, cu};
        for (int k = 0; k < 2; k++) {
            ps_backend *be = bs[k];
            float *Y = up(be, y, ny), *B = up(be, b, (size_t)d.c), *DB = up(be, NULL, (size_t)d.c);
            OK(be->ops->bias_add(be->impl, &d, B, Y, &e_));
            OK(be->ops->bias_grad(be->impl, &d, Y, DB, &e_));
            res[k][0] = down(be, Y, ny);
            res[k][1] = down(be, DB, (size_t)d.c);
            ps_backend_release(be, B);
        }
        char what[96];
        snprintf(what, sizeof what, "bias_add n%d c%d s%lld", d.n, d.c, (long long)d.s);
        check_array(what, res[1][0], res[0][0], ny, 0, 0);   /* one float add each: bit for bit */
        snprintf(what, sizeof what, "bias_grad n%d c%d s%lld", d.n, d.c, (long long)d.s);
        check_scaled(what, res[1][1], res[0][1], (size_t)d.c, 1e-6);
        for (int k = 0; k < 2; k++) { free(res[k][0]); free(res[k][1]); }
        free(y); free(b);
    }
}

/* ---- conv2d_wgrad_parts (a combined backward's per-caller weight gradients): each part's dw and db
 * against the reference's conv2d_backward of that part's images alone; parts equal and unequal, without
 * a bias, inside an asynchronous run, and a grouped convolution (part by part inside the op) ---- */

static void cmp_conv_parts(ps_backend *ref, ps_backend *cu, ps_conv_desc d, int k, const int *cnt, int bias,
                           int in_run, rng *r) {
    enum { KMAX = 16 };
    int off[KMAX];
    d.n = 0;
    for (int p = 0; p < k; p++) { off[p] = d.n; d.n += cnt[p]; }
    const ps_conv_desc rd = ps_conv_resolve(&d);
    const int groups = rd.groups;
    const size_t x_per = (size_t)d.cin * d.h * d.w, y_per = (size_t)d.cout * ps_conv_out_h(&rd) * ps_conv_out_w(&rd);
    const size_t nw = (size_t)d.cout * (d.cin / groups) * d.kh * d.kw;
    float *x = host_random(x_per * d.n, r), *dy = host_random(y_per * d.n, r), *w = host_random(nw, r);
    float *X = up(cu, x, x_per * d.n), *DY = up(cu, dy, y_per * d.n), *DW[KMAX], *DB[KMAX];
    for (int p = 0; p < k; p++) { DW[p] = up(cu, NULL, nw); DB[p] = up(cu, NULL, d.cout); }
    if (in_run) cu->ops->async_begin(cu->impl);
    OK(cu->ops->conv2d_wgrad_parts(cu->impl, &d, X, DY, k, off, cnt, DW, bias ? DB : NULL, &e_));
    if (in_run) OK(cu->ops->async_end(cu->impl, &e_));
    float *RW = up(ref, NULL, nw), *RB = up(ref, NULL, d.cout), *RWT = up(ref, w, nw);
    for (int p = 0; p < k; p++) {
        ps_conv_desc dp = d;
        dp.n = cnt[p];
        float *RX = up(ref, x + off[p] * x_per, x_per * cnt[p]), *RDY = up(ref, dy + off[p] * y_per, y_per * cnt[p]);
        OK(ref->ops->conv2d_backward(ref->impl, &dp, RX, RWT, RDY, NULL, RW, bias ? RB : NULL, &e_));
        float *gw = down(cu, DW[p], nw), *gb = down(cu, DB[p], d.cout);
        char what[128];
        snprintf(what, sizeof what, "conv2d_wgrad_parts %d->%d %dx%d g%d part %d of %d (%d images%s%s) dw", d.cin,
                 d.cout, d.h, d.w, groups, p, k, cnt[p], bias ? "" : ", no bias", in_run ? ", in a run" : "");
        check_scaled(what, gw, RW, nw, CMP_TOL);
        if (bias) {
            what[strlen(what) - 1] = 'b';
            check_scaled(what, gb, RB, (size_t)d.cout, CMP_TOL);
        }
        free(gw); free(gb);
        ps_backend_release(ref, RX); ps_backend_release(ref, RDY);
    }
    ps_backend_release(ref, RW); ps_backend_release(ref, RB); ps_backend_release(ref, RWT);
    ps_backend_release(cu, X); ps_backend_release(cu, DY);
    free(x); free(dy); free(w);
}

static void check_conv_parts(ps_backend *ref, ps_backend *cu, rng *r) {
    CHECK_MSG(cu->ops->conv2d_wgrad_parts != NULL, "the cuda backend offers conv2d_wgrad_parts");
    if (!cu->ops->conv2d_wgrad_parts) return;
    static const int eight[8] = {32, 32, 32, 32, 32, 32, 32, 32}, odd[3] = {3, 5, 1}, one[1] = {4};
    cmp_conv_parts(ref, cu, (ps_conv_desc){0, 32, 26, 26, 64, 3, 3, 1, 0}, 8, eight, 1, 0, r);   /* MNIST conv2 */
    cmp_conv_parts(ref, cu, (ps_conv_desc){0, 1, 28, 28, 32, 3, 3, 1, 0}, 8, eight, 1, 1, r);    /* conv1, in a run */
    cmp_conv_parts(ref, cu, (ps_conv_desc){0, 5, 13, 11, 7, 3, 3, 2, 1}, 3, odd, 1, 1, r);
    cmp_conv_parts(ref, cu, (ps_conv_desc){0, 5, 13, 11, 7, 3, 3, 2, 1}, 3, odd, 0, 0, r);
    cmp_conv_parts(ref, cu, (ps_conv_desc){0, 6, 9, 9, 6, 3, 3, 1, 1}, 1, one, 1, 0, r);
    cmp_conv_parts(ref, cu, (ps_conv_desc){.cin = 8, .h = 9, .w = 9, .cout = 12, .kh = 3, .kw = 3, .stride_h = 1,
                                           .stride_w = 1, .pad_h = 1, .pad_w = 1, .dil_h = 1, .dil_w = 1, .groups = 4},
                   3, odd, 1, 1, r);   /* grouped: the op's part-by-part path */
}

/* one thread's share of a check on asynchronous runs (peer: a second backend on the same device) */
typedef struct run_job { ps_backend *cu; int bad; ps_backend *peer; } run_job;

/* fn on one thread, then on 4 at once, each with its own job like proto; checks that none went wrong. */
static void run_on_threads(void *(*fn)(void *), run_job proto, const char *what) {
    run_job one = proto;
    fn(&one);
    CHECK_MSG(one.bad == 0, "%s, one thread: %d wrong", what, one.bad);
    enum { T = 4 };
    run_job jobs[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        jobs[i] = proto;
        pthread_create(&th[i], NULL, fn, &jobs[i]);
    }
    int bad = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].bad;
    }
    CHECK_MSG(bad == 0, "%s, %d threads at once: %d wrong", what, T, bad);
}

/* ---- copies from the host queued inside a run: each copy's bytes are taken before the call returns (the
 * caller rewrites its buffer at once), copies past the context's pinned buffer wait for the ones before and
 * start over, a bigger one grows it, a copy to the host between them; and a stage boundary between two
 * backends on one device inside runs on both, the source freed inside its run; 4 threads at once ---- */

static void *async_copies(void *arg) {
    run_job *j = arg;
    ps_backend *cu = j->cu;
    enum { K = 48, SMALL = 10007, BIG = 300001 };
    float *h = malloc(BIG * sizeof *h), *back = malloc(BIG * sizeof *back);
    float *B[K], *ACC = up(cu, NULL, SMALL);
    ps_err e = {0};
    cu->ops->async_begin(cu->impl);
    j->bad += cu->ops->fill(cu->impl, SMALL, ACC, 0.0f, &e) != PS_OK;
    for (int i = 0; i < K; i++) {
        const size_t n = i == K / 2 ? BIG : SMALL;   /* one bigger than the pinned buffer so far */
        B[i] = ps_backend_alloc_floats(cu, (int64_t)n);
        for (size_t q = 0; q < n; q++) h[q] = (float)(i + 1);
        j->bad += !B[i] || cu->ops->copy_to_device(cu->impl, B[i], h, n * sizeof *h, &e) != PS_OK;
        memset(h, 0xff, n * sizeof *h);   /* NaNs: the copy must have taken its bytes already */
        j->bad += cu->ops->add_out(cu->impl, SMALL, ACC, B[i], ACC, &e) != PS_OK;
        if (i == K / 3) {   /* a copy to the host mid-run sees the queue's work before it */
            j->bad += cu->ops->copy_to_host(cu->impl, back, ACC, SMALL * sizeof *back, &e) != PS_OK;
            for (size_t q = 0; q < SMALL; q++) j->bad += back[q] != (float)((i + 1) * (i + 2) / 2);
        }
    }
    j->bad += cu->ops->async_end(cu->impl, &e) != PS_OK;
    j->bad += cu->ops->copy_to_host(cu->impl, back, ACC, SMALL * sizeof *back, &e) != PS_OK;
    for (size_t q = 0; q < SMALL; q++) j->bad += back[q] != (float)(K * (K + 1) / 2);
    for (int i = 0; i < K; i++) {
        const size_t n = i == K / 2 ? BIG : SMALL;
        j->bad += cu->ops->copy_to_host(cu->impl, back, B[i], n * sizeof *back, &e) != PS_OK;
        for (size_t q = 0; q < n; q++) j->bad += back[q] != (float)(i + 1);
        ps_backend_release(cu, B[i]);
    }
    ps_backend_release(cu, ACC);
    /* the stage boundary: S written on backend a, copied to b, freed in a's run, a's next blocks written */
    ps_backend *a = j->peer, *b = cu;
    enum { N = 200003, ROUNDS = 20 };
    for (size_t q = 0; q < N; q++) h[q] = (float)(q % 5);
    float *X = up(a, h, N);
    for (int round = 0; round < ROUNDS; round++) {
        a->ops->async_begin(a->impl);
        b->ops->async_begin(b->impl);
        float *S = ps_backend_alloc_floats(a, N), *D = ps_backend_alloc_floats(b, N);
        j->bad += !S || !D;
        j->bad += a->ops->add_out(a->impl, N, X, X, S, &e) != PS_OK;        /* S = 2x */
        j->bad += a->ops->add_out(a->impl, N, S, X, S, &e) != PS_OK;        /* S = 3x */
        j->bad += b->ops->copy_from_peer(b->impl, D, a->impl, S, N * sizeof(float), &e) != PS_OK;
        ps_backend_release(a, S);                                          /* kept aside until a's run ends */
        float *T = ps_backend_alloc_floats(a, N);
        j->bad += !T || a->ops->fill(a->impl, N, T, -7.0f, &e) != PS_OK;   /* a's stream goes on */
        j->bad += b->ops->add_out(b->impl, N, D, D, D, &e) != PS_OK;        /* D = 6x */
        ps_backend_release(a, T);
        if (round % 2) {   /* either run may end first */
            j->bad += a->ops->async_end(a->impl, &e) != PS_OK;
            j->bad += b->ops->async_end(b->impl, &e) != PS_OK;
        } else {
            j->bad += b->ops->async_end(b->impl, &e) != PS_OK;
            j->bad += a->ops->async_end(a->impl, &e) != PS_OK;
        }
        j->bad += b->ops->copy_to_host(b->impl, back, D, N * sizeof *back, &e) != PS_OK;
        for (size_t q = 0; q < N; q++) j->bad += back[q] != 6.0f * (float)(q % 5);
        ps_backend_release(b, D);
    }
    ps_backend_release(a, X);
    free(h);
    free(back);
    return NULL;
}

static void check_async_copies(ps_backend *cu) {
    ps_err err = {0};
    ps_backend *a = ps_backend_create("cuda", 0, 0, &err);   /* another stage's backend on the same device */
    CHECK_MSG(a != NULL, "%s", err.msg);
    if (!a) return;
    run_on_threads(async_copies, (run_job){cu, 0, a}, "copies queued in runs");
    ps_backend_free(a);
}

/* ---- sum_squares: the sum in double of x^2 on the device (a gradient's norm) against the host's, over
 * sizes around the block and part counts; a NaN or an inf anywhere makes it non-finite ---- */

static void cmp_sum_squares(ps_backend *cu, rng *r) {
    static const size_t sizes[] = {1, 255, 256, 257, 1000, 65537, 262144 * 4 + 3, 1199882};
    char what[64];
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        const size_t n = sizes[t];
        float *x = host_random(n, r);
        double want = 0;
        for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
        float *X = up(cu, x, n);
        double got = -1;
        OK(cu->ops->sum_squares(cu->impl, X, (int64_t)n, &got, &e_));
        snprintf(what, sizeof what, "sum_squares n=%zu", n);
        CHECK_MSG(fabs(got - want) <= 1e-12 * want * (1 + log2((double)n)), "%s: got %.17g want %.17g", what, got,
                  want);
        for (int bad = 0; bad < 2; bad++) {   /* a NaN, then an inf, at the far end */
            float v = bad ? INFINITY : NAN;
            ps_err e = {0};
            CHECK(cu->ops->copy_to_device(cu->impl, X + n - 1, &v, sizeof v, &e) == PS_OK);
            OK(cu->ops->sum_squares(cu->impl, X, (int64_t)n, &got, &e_));
            CHECK_MSG(!isfinite(got), "%s with %s: got %g", what, bad ? "inf" : "NaN", got);
        }
        ps_backend_release(cu, X);
        free(x);
    }
}

/* ---- the block cache (PS_CUDA_CACHE_MB): blocks freed and handed out again never overlap a live one -
 * each live block holds its own pattern through rounds of frees and allocations of mixed sizes (some
 * of one class), under a cap that keeps only a few idle blocks (PS_CUDA_CACHE_MB=1) and the default ---- */

static void check_block_cache(const char *cap_mb, rng *r) {
    if (cap_mb) setenv("PS_CUDA_CACHE_MB", cap_mb, 1);
    ps_err err = {0};
    ps_backend *cu = ps_backend_create("cuda", 0, 0, &err);
    if (cap_mb) unsetenv("PS_CUDA_CACHE_MB");
    CHECK_MSG(cu, "%s", err.msg);
    if (!cu) return;
    enum { N = 96 };
    float *blk[N] = {0};
    size_t len[N] = {0};
    int bad = 0;
    for (int round = 0; round < 6; round++) {
        for (int i = 0; i < N; i++) {
            if (blk[i] && rng_uniform(r) < 0) continue;   /* about half stay live across the round */
            ps_backend_release(cu, blk[i]);
            const uint32_t u = (uint32_t)((rng_uniform(r) + 1.0f) * 8388608.0f);
            len[i] = i % 4 == 0 ? 1000 : 1 + u % (u & 1 ? 300 : 300000);   /* a quarter of one size */
            blk[i] = up(cu, NULL, len[i]);
            float *h = malloc(len[i] * sizeof *h);
            for (size_t k = 0; k < len[i]; k++) h[k] = (float)(round * N + i);
            OK(cu->ops->copy_to_device(cu->impl, blk[i], h, len[i] * sizeof *h, &e_));
            free(h);
        }
        for (int i = 0; i < N; i++) {   /* every live block still holds what was written into it */
            float *h = malloc(len[i] * sizeof *h);
            OK(cu->ops->copy_to_host(cu->impl, h, blk[i], len[i] * sizeof *h, &e_));
            for (size_t k = 0; k < len[i]; k++)
                if (h[k] != h[0]) { bad++; break; }
            free(h);
        }
    }
    CHECK_MSG(bad == 0, "block cache (PS_CUDA_CACHE_MB=%s): %d live blocks overwritten", cap_mb ? cap_mb : "default",
              bad);
    for (int i = 0; i < N; i++) ps_backend_release(cu, blk[i]);
    ps_backend_free(cu);
}

/* ---- asynchronous runs (async_begin / async_end): 60 chained ops inside one run, each through a new
 * temporary freed inside the run (the block cache must not hand it out while the run's queue may still
 * use it), give exactly the synchronous result; a copy to the host inside the run sees the queue's work
 * before it; a nested pair ends the run only at the outer end; threads' runs are their own ---- */

static void *async_chain(void *arg) {
    run_job *j = arg;
    ps_backend *cu = j->cu;
    enum { N = 100003, STEPS = 60 };
    float *x = malloc(N * sizeof *x), *h = malloc(N * sizeof *h);
    for (int i = 0; i < N; i++) x[i] = (float)((i % 17) - 8) / 8.0f;   /* sums of these stay exact */
    float *X = up(cu, x, N), *ACC = up(cu, NULL, N), *D = up(cu, NULL, 1);
    ps_err e = {0};
    cu->ops->async_begin(cu->impl);
    cu->ops->async_begin(cu->impl);   /* nested: only the outer end closes the run */
    j->bad += cu->ops->fill(cu->impl, N, ACC, 0.0f, &e) != PS_OK;
    for (int k = 0; k < STEPS; k++) {
        float *T = ps_backend_alloc_floats(cu, N);
        j->bad += !T || cu->ops->add_out(cu->impl, N, ACC, X, T, &e) != PS_OK;   /* T = ACC + X */
        j->bad += cu->ops->relu_forward(cu->impl, 1, X, D, &e) != PS_OK;          /* more queued work */
        j->bad += cu->ops->add_out(cu->impl, N, T, X, ACC, &e) != PS_OK;          /* ACC = T + X */
        ps_backend_release(cu, T);
        if (k == STEPS / 2) {   /* the host copy waits for the queue */
            j->bad += cu->ops->copy_to_host(cu->impl, h, ACC, N * sizeof *h, &e) != PS_OK;
            for (int i = 0; i < N; i++) j->bad += h[i] != (float)(2 * (k + 1)) * x[i];
        }
    }
    j->bad += cu->ops->async_end(cu->impl, &e) != PS_OK;   /* inner */
    j->bad += cu->ops->async_end(cu->impl, &e) != PS_OK;   /* outer: waits */
    j->bad += cu->ops->copy_to_host(cu->impl, h, ACC, N * sizeof *h, &e) != PS_OK;
    for (int i = 0; i < N; i++) j->bad += h[i] != (float)(2 * STEPS) * x[i];
    ps_backend_release(cu, X);
    ps_backend_release(cu, ACC);
    ps_backend_release(cu, D);
    free(x);
    free(h);
    return NULL;
}

static void check_async_runs(ps_backend *cu) {
    run_on_threads(async_chain, (run_job){cu, 0, NULL}, "async runs");
}

/* ---- torch.where (where, where_backward): tensors on both sides, then a number for a and for b; bit for
 * bit ---- */

static void cmp_where(ps_backend *ref, ps_backend *cu, rng *r) {
    const size_t n = 3001;
    float *c = host_random(n, r), *a = host_random(n, r), *b = host_random(n, r), *dy = host_random(n, r);
    for (size_t i = 0; i < n; i++) c[i] = c[i] > 0.2f ? 1.0f : 0.0f;
    ps_backend *bs[2] = {ref, cu};
    char what[64];
    for (int form = 0; form < 3; form++) {   /* 0: a and b tensors; 1: a the number 1.5; 2: b -2.5 */
        float *res[2][3];
        for (int k = 0; k < 2; k++) {
            ps_backend *be = bs[k];
            float *C = up(be, c, n), *A = up(be, a, n), *B = up(be, b, n), *DY = up(be, dy, n);
            float *Y = up(be, NULL, n), *DA = up(be, NULL, n), *DB = up(be, NULL, n);
            OK(be->ops->where(be->impl, (int64_t)n, C, form == 1 ? NULL : A, 1.5f, form == 2 ? NULL : B, -2.5f,
                              Y, &e_));
            OK(be->ops->where_backward(be->impl, (int64_t)n, C, DY, DA, DB, &e_));
            res[k][0] = down(be, Y, n);
            res[k][1] = down(be, DA, n);
            res[k][2] = down(be, DB, n);
            ps_backend_release(be, C); ps_backend_release(be, A); ps_backend_release(be, B);
            ps_backend_release(be, DY);
        }
        static const char *const names[3] = {"y", "da", "db"};
        for (int j = 0; j < 3; j++) {
            snprintf(what, sizeof what, "where form %d %s", form, names[j]);
            check_array(what, res[1][j], res[0][j], n, 0, 0);
        }
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 3; j++) free(res[k][j]);
    }
    free(c); free(a); free(b); free(dy);
}

/* ---- concurrency ---- */

typedef struct conv_job {
    ps_backend *b;
    const ps_conv_desc *d;
    const float *x, *w, *bias;
    float *y;
    ps_status st;
} conv_job;

static void *conv_job_run(void *arg) {
    conv_job *j = arg;
    j->st = PS_OK;
    for (int i = 0; i < 5 && j->st == PS_OK; i++)
        j->st = j->b->ops->conv2d_forward(j->b->impl, j->d, j->x, j->w, j->bias, j->y, NULL);
    return NULL;
}

static void check_concurrent(rng *r) {
    const ps_conv_desc d = { 16, 32, 26, 26, 64, 3, 3, 1, 0 };
    const size_t nx = (size_t)d.n * d.cin * d.h * d.w, nw = (size_t)d.cout * d.cin * 9;
    const size_t ny = (size_t)d.n * d.cout * 24 * 24;
    ps_err err = { 0 };
    ps_backend *b = ps_backend_create("cuda", 0, 0, &err); /* fresh: empty caches, one context */
    CHECK_MSG(b != NULL, "%s", err.msg);
    if (!b) return;
    float *hw = host_random(nw, r), *hb = host_random(d.cout, r);
    float *W = up(b, hw, nw), *B = up(b, hb, d.cout);
    conv_job jobs[3];
    pthread_t th[3];
    float *hx[3];
    for (int t = 0; t < 3; t++) {
        hx[t] = host_random(nx, r);
        jobs[t] = (conv_job){ b, &d, up(b, hx[t], nx), W, B, up(b, NULL, ny), PS_OK };
    }
    for (int t = 0; t < 3; t++) CHECK(pthread_create(&th[t], NULL, conv_job_run, &jobs[t]) == 0);
    for (int t = 0; t < 3; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < 3; t++) {
        CHECK(jobs[t].st == PS_OK);
        float *seq = up(b, NULL, ny);
        OK(b->ops->conv2d_forward(b->impl, &d, jobs[t].x, W, B, seq, &e_));
        float *got = down(b, jobs[t].y, ny), *want = down(b, seq, ny);
        check_array("concurrent conv vs sequential", got, want, ny, 0, 0);
        free(got); free(want); free(hx[t]);
        ps_backend_release(b, (void *)jobs[t].x);
    }
    ps_backend_release(b, W); ps_backend_release(b, B);
    free(hw); free(hb);
    ps_backend_free(b);
}

/* ---- stage-boundary copies between two backends ---- */

static void check_peer_copy(int src_dev, int dst_dev, const char *mode, rng *r) {
    if (mode) setenv("PS_CUDA_STAGE_COPY", mode, 1);
    else unsetenv("PS_CUDA_STAGE_COPY");
    ps_err err = { 0 };
    ps_backend *a = ps_backend_create("cuda", src_dev, 0, &err);
    CHECK_MSG(a != NULL, "%s", err.msg);
    ps_backend *b = a ? ps_backend_create("cuda", dst_dev, 0, &err) : NULL;
    CHECK_MSG(b != NULL, "%s", err.msg);
    unsetenv("PS_CUDA_STAGE_COPY");
    if (!a || !b) { ps_backend_free(a); ps_backend_free(b); return; }
    CHECK(b->ops->copy_from_peer != NULL && a->ops == b->ops);
    const size_t sizes[3] = { 1, 9216 * 32, (size_t)5 << 20 }; /* the last spans several 8 MiB chunks */
    for (int i = 0; i < 3; i++) {
        const size_t n = sizes[i];
        float *h = host_random(n, r);
        float *S = up(a, h, n), *D = up(b, NULL, n);
        OK(b->ops->copy_from_peer(b->impl, D, a->impl, S, n * sizeof *h, &e_));
        float *got = down(b, D, n);
        char what[96];
        snprintf(what, sizeof what, "copy_from_peer cuda:%d -> cuda:%d (%s) %zu floats", src_dev, dst_dev,
                 mode ? mode : "auto", n);
        CHECK_MSG(memcmp(got, h, n * sizeof *h) == 0, "%s: bytes differ", what);
        ps_backend_release(a, S);
        free(got); free(h);
    }
    ps_backend_free(a);
    ps_backend_free(b);
}

int main(void) {
    ps_err err = { 0 };
    ps_backend *cu = ps_backend_create("cuda", 0, 0, &err);
    if (!cu) {
        if (err.code == PS_ERR_UNAVAILABLE) {
            char why[PS_ERR_MSG_MAX + 32];
            snprintf(why, sizeof why, "no CUDA device (%s)", err.msg);
            return check_skip(NAME, why);
        }
        CHECK_MSG(cu != NULL, "%s", err.msg);
        return check_summary(NAME);
    }
    CHECK_MSG(!strcmp(cu->label, "cuda/cuda:0"), "label %s", cu->label);
    ps_backend *ref = ps_backend_create("ref", 0, 0, &err);
    PS_ASSERT(ref);
    rng r = { 0x9e3779b97f4a7c15ull };

    /* the MNIST CNN at batch 4 and 32, then odd shapes */
    for (int n = 4; n <= 32; n *= 8) {
        cmp_conv(ref, cu, (ps_conv_desc){ n, 1, 28, 28, 32, 3, 3, 1, 0 }, &r);
        cmp_conv(ref, cu, (ps_conv_desc){ n, 32, 26, 26, 64, 3, 3, 1, 0 }, &r);
        cmp_pool(ref, cu, (ps_pool_desc){ n, 64, 24, 24, 2, 2 }, 0, &r);
        cmp_pool(ref, cu, (ps_pool_desc){ n, 64, 24, 24, 2, 2 }, 1, &r);
        cmp_linear(ref, cu, (ps_linear_desc){ n, 9216, 128 }, &r);
        cmp_linear(ref, cu, (ps_linear_desc){ n, 128, 10 }, &r);
    }
    cmp_conv(ref, cu, (ps_conv_desc){ 3, 5, 13, 11, 7, 3, 3, 2, 1 }, &r);
    cmp_conv(ref, cu, (ps_conv_desc){ 2, 3, 9, 10, 4, 5, 2, 3, 2 }, &r);
    cmp_conv(ref, cu, (ps_conv_desc){ 3, 5, 13, 11, 7, 3, 3, 2, 1 }, &r); /* from the cache */
    cmp_pool(ref, cu, (ps_pool_desc){ 2, 3, 7, 9, 2, 2 }, 0, &r);
    cmp_pool(ref, cu, (ps_pool_desc){ 2, 3, 7, 9, 2, 2 }, 1, &r);
    cmp_pool(ref, cu, (ps_pool_desc){ 2, 3, 11, 11, 3, 2 }, 1, &r); /* overlapping windows */
    cmp_linear(ref, cu, (ps_linear_desc){ 3, 17, 5 }, &r);
    cmp_linear(ref, cu, (ps_linear_desc){ 1, 9216, 128 }, &r);
    cmp_small_ops(ref, cu, &r);
    cmp_new_ops(ref, cu, &r);
    cmp_rnn_cells(ref, cu, &r);
    cmp_bcast(ref, cu, &r);
    cmp_where(ref, cu, &r);
    cmp_sum_squares(cu, &r);
    check_block_cache(NULL, &r);
    check_block_cache("1", &r);
    check_async_runs(cu);
    check_async_copies(cu);
    cmp_conv_more(ref, cu, &r);
    check_conv_parts(ref, cu, &r);
    cmp_bias(ref, cu, &r);

    {   /* a failing library call names the call, the file and the line */
        const ps_conv_desc bad = { 1, 1, 8, 8, 1, 3, 3, 1, -5 };
        float *buf = up(cu, NULL, 64);
        ps_err e = { 0 };
        CHECK(cu->ops->conv2d_forward(cu->impl, &bad, buf, buf, buf, buf, &e) == PS_ERR_INTERNAL);
        CHECK_MSG(strstr(e.msg, "backend_cuda.c:") && strstr(e.msg, "cudnn") && strstr(e.msg, "failed"), "%s", e.msg);
        printf("expected error: %s\n", e.msg);
        ps_backend_release(cu, buf);
    }
    {   /* a device past the last one */
        ps_err e = { 0 };
        CHECK(ps_backend_create("cuda", 63, 0, &e) == NULL);
        CHECK_MSG(e.code == PS_ERR_INVALID_ARGUMENT && strstr(e.msg, "CUDA devices found: ") &&
                  strstr(e.msg, "cuda:0 "), "%s", e.msg);
        printf("expected error: %s\n", e.msg);
    }
    check_concurrent(&r);
    check_peer_copy(0, 0, NULL, &r);
    check_peer_copy(0, 0, "host", &r);
    ps_backend *second = ps_backend_create("cuda", 1, 0, &err);
    if (second) {
        ps_backend_free(second);
        check_peer_copy(0, 1, NULL, &r);
        check_peer_copy(1, 0, "host", &r);
    } else {
        printf("one CUDA device: the cuda:0 <-> cuda:1 copies are not run\n");
    }
    ps_backend_free(ref);
    ps_backend_free(cu);
    return check_summary(NAME);
}
