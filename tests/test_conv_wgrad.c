/* test_conv_wgrad.c - the dnnl backend's convolution gradients at the
 * shapes where it computes them another way than oneDNN's backward
 * primitives (backend_dnnl.c): below AVX2 the weight gradient runs as a
 * forward convolution with batch and channels swapped (stride 1, and
 * stride 2 with a dilated kernel) and the data gradient of a stride-1
 * convolution as a forward convolution with a rotated kernel; at batch 16
 * and 8 or 16 channels, where those forwards get oneDNN's JIT kernels, in
 * the plain and the blocked layout; and the weight gradient of a
 * one-channel-input convolution with dy blocked (the C kernel
 * conv_bwd_w_c1), at every ISA. Reference: the plain C backend (ref)
 * on the same random data, whose convolution gradients test_nn_ops checks
 * against PyTorch autograd and finite differences. One child process per
 * ISA this CPU has (ONEDNN_MAX_CPU_ISA = SSE41, AVX2 and the host's own;
 * oneDNN fixes its ISA at first use, hence a re-exec, as test_nn_ops
 * does). A few seconds.
 */
#include "backend.h"
#include "check.h"
#include "support/isa_child.h"
#include "support/random.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct conv_case {
    const char *name;
    int n, cin, h, w, cout, k, stride, pad;
} conv_case;

static const conv_case kCases[] = {
    { "3x3 s1 p1, 8->8", 16, 8, 14, 14, 8, 3, 1, 1 },
    { "3x3 s1 p1, 16->16", 16, 16, 7, 7, 16, 3, 1, 1 },
    { "3x3 s2 p1, 8->16", 16, 8, 14, 14, 16, 3, 2, 1 },
    { "3x3 s2 p1, 8->16, odd input", 16, 8, 13, 11, 16, 3, 2, 1 },
    { "1x1 s2 p0, 8->16", 16, 8, 14, 14, 16, 1, 2, 0 },
    { "3x3 s1 p0, 1->8", 16, 1, 12, 12, 8, 3, 1, 0 },
    { "5x5 s1 p2, 16->8", 16, 16, 9, 9, 8, 5, 1, 2 },
    { "3x3 s1 p1, 1->8 (the small ResNet's conv1)", 16, 1, 28, 28, 8, 3, 1, 1 },
    { "5x5 s2 p2, 1->16, odd input", 16, 1, 13, 11, 16, 5, 2, 2 },
    { "3x3 s2 p0, 1->32", 5, 1, 9, 10, 32, 3, 2, 0 },
};

#define RUN(b, op, ...) do { ps_err err_ = { 0 }; \
    ps_status s_ = (b)->ops->op((b)->impl, __VA_ARGS__, &err_); \
    CHECK_MSG(s_ == PS_OK, "%s %s: %s", (b)->ops->name, #op, err_.msg); } while (0)

static float *dev_copy(ps_backend *b, const float *host, size_t n) {
    float *p = ps_backend_alloc_floats(b, (int64_t)n);
    if (!p) return NULL;
    ps_err err = { 0 };
    if (host) CHECK_MSG(b->ops->copy_to_device(b->impl, p, host, n * sizeof *p, &err) == PS_OK, "%s", err.msg);
    return p;
}

/* dx, dw, db of case c on backend b, x and dx in layout xl, dy in yl; host arrays out. */
static void grads(ps_backend *b, const conv_case *c, int xl, int yl, const float *x, const float *wt, const float *dy,
                  float *dx, float *dw, float *db) {
    ps_conv_desc d = { .n = c->n, .cin = c->cin, .h = c->h, .w = c->w, .cout = c->cout, .kh = c->k, .kw = c->k,
                       .stride_h = c->stride, .stride_w = c->stride, .pad_h = c->pad, .pad_w = c->pad,
                       .src_layout = xl, .dst_layout = yl };
    const int oh = ps_conv_out_h(&d), ow = ps_conv_out_w(&d);
    const size_t nx = (size_t)c->n * c->cin * c->h * c->w, ny = (size_t)c->n * c->cout * oh * ow;
    const size_t nw = (size_t)c->cout * c->cin * c->k * c->k;
    float *X = dev_copy(b, x, nx), *Y = dev_copy(b, dy, ny), *W = dev_copy(b, wt, nw);
    float *DX = dev_copy(b, NULL, nx), *DW = dev_copy(b, NULL, nw), *DB = dev_copy(b, NULL, (size_t)c->cout);
    float *XB = NULL, *YB = NULL, *DXB = NULL;
    if (xl == PS_LAYOUT_BLOCKED) {
        XB = dev_copy(b, NULL, nx);
        DXB = dev_copy(b, NULL, nx);
        RUN(b, reorder, c->n, c->cin, c->h, c->w, X, PS_LAYOUT_PLAIN, XB, PS_LAYOUT_BLOCKED);
    }
    if (yl == PS_LAYOUT_BLOCKED) {
        YB = dev_copy(b, NULL, ny);
        RUN(b, reorder, c->n, c->cout, oh, ow, Y, PS_LAYOUT_PLAIN, YB, PS_LAYOUT_BLOCKED);
    }
    RUN(b, conv2d_backward, &d, XB ? XB : X, W, YB ? YB : Y, DXB ? DXB : DX, DW, DB);
    if (DXB) RUN(b, reorder, c->n, c->cin, c->h, c->w, DXB, PS_LAYOUT_BLOCKED, DX, PS_LAYOUT_PLAIN);
    ps_err err = { 0 };
    CHECK(b->ops->copy_to_host(b->impl, dx, DX, nx * sizeof *dx, &err) == PS_OK);
    CHECK(b->ops->copy_to_host(b->impl, dw, DW, nw * sizeof *dw, &err) == PS_OK);
    CHECK(b->ops->copy_to_host(b->impl, db, DB, (size_t)c->cout * sizeof *db, &err) == PS_OK);
    float *all[] = { X, Y, W, DX, DW, DB, XB, YB, DXB };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ps_backend_release(b, all[i]);
}

/* Largest |a - b| relative to the largest |b| (at least 1). */
static double rel_err(const float *a, const float *b, size_t n) {
    double worst = 0, scale = 1;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]));
    return worst / scale;
}

static int child(const char *isa) {
    ps_err err = { 0 };
    ps_backend *ref = ps_backend_create("ref", 0, 0, &err), *dn = ps_backend_create("dnnl", 0, 1, &err);
    CHECK_MSG(ref && dn, "%s", err.msg);
    if (!ref || !dn) return check_summary("test_conv_wgrad");
    printf("  %s: oneDNN's effective ISA %s\n", isa, ps_backend_cpu_isa());
    rng r = { 0xc0ffee18 };
    for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; i++) {
        const conv_case *c = &kCases[i];
        ps_conv_desc d = { .n = c->n, .cin = c->cin, .h = c->h, .w = c->w, .cout = c->cout, .kh = c->k, .kw = c->k,
                           .stride_h = c->stride, .stride_w = c->stride, .pad_h = c->pad, .pad_w = c->pad };
        const size_t nx = (size_t)c->n * c->cin * c->h * c->w;
        const size_t ny = (size_t)c->n * c->cout * ps_conv_out_h(&d) * ps_conv_out_w(&d);
        const size_t nw = (size_t)c->cout * c->cin * c->k * c->k;
        float *x = host_random(nx, &r), *wt = host_random(nw, &r), *dy = host_random(ny, &r);
        float *dx0 = calloc(nx, sizeof *dx0), *dw0 = calloc(nw, sizeof *dw0), *db0 = calloc((size_t)c->cout, 4);
        float *dx1 = calloc(nx, sizeof *dx1), *dw1 = calloc(nw, sizeof *dw1), *db1 = calloc((size_t)c->cout, 4);
        PS_ASSERT(dx0 && dw0 && db0 && dx1 && dw1 && db1);
        grads(ref, c, PS_LAYOUT_PLAIN, PS_LAYOUT_PLAIN, x, wt, dy, dx0, dw0, db0);
        const int bin = dn->ops->blocked_layout ? dn->ops->blocked_layout(dn->impl, c->cin) : 0;
        const int bout = dn->ops->blocked_layout ? dn->ops->blocked_layout(dn->impl, c->cout) : 0;
        /* plain; blocked; x plain and dy blocked (an image model's first
         * convolution: 1 channel has no block; the C weight gradient) */
        for (int mode = 0; mode < 3; mode++) {
            if ((mode == 1 && (bin <= 0 || bout <= 0)) || (mode == 2 && (bin > 0 || bout <= 0))) continue;
            const int xl = mode == 1 ? PS_LAYOUT_BLOCKED : PS_LAYOUT_PLAIN;
            const int yl = mode ? PS_LAYOUT_BLOCKED : PS_LAYOUT_PLAIN;
            grads(dn, c, xl, yl, x, wt, dy, dx1, dw1, db1);
            double ex = rel_err(dx1, dx0, nx), ew = rel_err(dw1, dw0, nw), eb = rel_err(db1, db0, (size_t)c->cout);
            const char *lay = mode == 2 ? "x plain, dy blocked" : mode == 1 ? "blocked" : "plain";
            CHECK_MSG(ex < 1e-5, "%s %s %s: dx off by %.3g (relative to its largest element)", isa, c->name, lay, ex);
            CHECK_MSG(ew < 1e-5, "%s %s %s: dw off by %.3g (relative to its largest element)", isa, c->name, lay, ew);
            CHECK_MSG(eb < 1e-5, "%s %s %s: db off by %.3g (relative to its largest element)", isa, c->name, lay, eb);
        }
        free(x); free(wt); free(dy); free(dx0); free(dw0); free(db0); free(dx1); free(dw1); free(db1);
    }
    char buf[1024];
    int nf = ps_backend_fallbacks(dn, buf, sizeof buf);
    CHECK_MSG(nf == 0, "%s: %d disallowed reference kernels:\n%s", isa, nf, buf);
    ps_backend_free(ref);
    ps_backend_free(dn);
    char name[64];
    snprintf(name, sizeof name, "test_conv_wgrad[%s]", isa);
    return check_summary(name);
}

int main(int argc, char **argv) { return isa_children_main("test_conv_wgrad", argc, argv, child); }
