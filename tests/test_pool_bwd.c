/* test_pool_bwd.c - the dnnl backend's max-pool backward in the blocked
 * layout, computed from oneDNN's training-forward workspace by the C loop
 * pool_bwd_ws (backend_dnnl.c; it replaces oneDNN's backward where that is
 * the jit:sse41 kernel) and by oneDNN's own backward primitive
 * (PS_DNNL_POOL_BWD=onednn), both against the plain C backend (ref), whose
 * max pooling test_nn_ops and test_kinds check against PyTorch autograd.
 * Windows that tile the input (2x2 stride 2: the small ResNet's pool),
 * overlapping ones, an input the windows do not cover, 8- and 16-channel
 * blocks, and a padded case (always oneDNN's backward). One child process
 * per ISA this CPU has (ONEDNN_MAX_CPU_ISA = SSE41, AVX2 and the host's
 * own), as test_conv_wgrad. Under a second.
 */
#include "backend.h"
#include "check.h"
#include "support/isa_child.h"
#include "support/random.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pool_case {
    const char *name;
    int n, c, h, w, k, stride, pad;
} pool_case;

static const pool_case kCases[] = {
    { "2x2 s2, 8 channels, 28x28 (the small ResNet's pool)", 16, 8, 28, 28, 2, 2, 0 },
    { "2x2 s2, 16 channels, 14x14", 8, 16, 14, 14, 2, 2, 0 },
    { "2x2 s2, 8 channels, 15x13 (a row and a column no window covers)", 8, 8, 15, 13, 2, 2, 0 },
    { "3x3 s2, 8 channels, 15x15 (overlapping windows)", 8, 8, 15, 15, 3, 2, 0 },
    { "3x3 s1, 16 channels, 9x9", 4, 16, 9, 9, 3, 1, 0 },
    { "3x3 s2 p1, 16 channels, 14x14 (padded: oneDNN's backward)", 4, 16, 14, 14, 3, 2, 1 },
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

/* dx (host, plain) of case c on backend b, its activations in layout lay. */
static void pool_grad(ps_backend *b, const pool_case *c, int lay, const float *x, const float *dy, float *dx) {
    ps_pool_desc d = { .n = c->n, .c = c->c, .h = c->h, .w = c->w, .kh = c->k, .kw = c->k, .stride_h = c->stride,
                       .stride_w = c->stride, .pad_h = c->pad, .pad_w = c->pad, .layout = lay };
    const int oh = ps_pool_out_h(&d), ow = ps_pool_out_w(&d);
    const size_t nx = (size_t)c->n * c->c * c->h * c->w, ny = (size_t)c->n * c->c * oh * ow;
    const size_t wsb = b->ops->maxpool_workspace_size(b->impl, &d);
    CHECK_MSG(wsb > 0, "%s %s: no workspace size", b->ops->name, c->name);
    float *X = dev_copy(b, x, nx), *DY = dev_copy(b, dy, ny), *Y = dev_copy(b, NULL, ny);
    float *DX = dev_copy(b, NULL, nx), *WS = dev_copy(b, NULL, (wsb + 3) / 4);
    float *XB = NULL, *DYB = NULL, *DXB = NULL;
    if (lay == PS_LAYOUT_BLOCKED) {
        XB = dev_copy(b, NULL, nx);
        DYB = dev_copy(b, NULL, ny);
        DXB = dev_copy(b, NULL, nx);
        RUN(b, reorder, c->n, c->c, c->h, c->w, X, PS_LAYOUT_PLAIN, XB, PS_LAYOUT_BLOCKED);
        RUN(b, reorder, c->n, c->c, oh, ow, DY, PS_LAYOUT_PLAIN, DYB, PS_LAYOUT_BLOCKED);
    }
    RUN(b, maxpool_forward, &d, XB ? XB : X, Y, WS);
    RUN(b, maxpool_backward, &d, WS, DYB ? DYB : DY, DXB ? DXB : DX);
    if (DXB) RUN(b, reorder, c->n, c->c, c->h, c->w, DXB, PS_LAYOUT_BLOCKED, DX, PS_LAYOUT_PLAIN);
    ps_err err = { 0 };
    CHECK(b->ops->copy_to_host(b->impl, dx, DX, nx * sizeof *dx, &err) == PS_OK);
    float *all[] = { X, DY, Y, DX, WS, XB, DYB, DXB };
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
    ps_backend *ref = ps_backend_create("ref", 0, 0, &err);
    ps_backend *dn = ps_backend_create("dnnl", 0, 1, &err);      /* the C loop where it applies */
    setenv("PS_DNNL_POOL_BWD", "onednn", 1);                     /* read when a backend is created */
    ps_backend *dno = ps_backend_create("dnnl", 0, 1, &err);     /* oneDNN's backward always */
    unsetenv("PS_DNNL_POOL_BWD");
    CHECK_MSG(ref && dn && dno, "%s", err.msg);
    if (!ref || !dn || !dno) return check_summary("test_pool_bwd");
    printf("  %s: oneDNN's effective ISA %s\n", isa, ps_backend_cpu_isa());
    rng r = { 0x9001b0d5 };
    for (size_t i = 0; i < sizeof kCases / sizeof kCases[0]; i++) {
        const pool_case *c = &kCases[i];
        ps_pool_desc d = { .n = c->n, .c = c->c, .h = c->h, .w = c->w, .kh = c->k, .kw = c->k, .stride_h = c->stride,
                           .stride_w = c->stride, .pad_h = c->pad, .pad_w = c->pad };
        const size_t nx = (size_t)c->n * c->c * c->h * c->w;
        const size_t ny = (size_t)c->n * c->c * ps_pool_out_h(&d) * ps_pool_out_w(&d);
        float *x = host_random(nx, &r), *dy = host_random(ny, &r);
        float *dx0 = calloc(nx, sizeof *dx0), *dx1 = calloc(nx, sizeof *dx1), *dx2 = calloc(nx, sizeof *dx2);
        PS_ASSERT(x && dy && dx0 && dx1 && dx2);
        pool_grad(ref, c, PS_LAYOUT_PLAIN, x, dy, dx0);
        const int blk = dn->ops->blocked_layout ? dn->ops->blocked_layout(dn->impl, c->c) : 0;
        CHECK_MSG(blk > 0, "%s %s: the dnnl backend has no blocked layout for %d channels", isa, c->name, c->c);
        if (blk > 0) {
            pool_grad(dn, c, PS_LAYOUT_BLOCKED, x, dy, dx1);
            pool_grad(dno, c, PS_LAYOUT_BLOCKED, x, dy, dx2);
            double e1 = rel_err(dx1, dx0, nx), e2 = rel_err(dx2, dx0, nx);
            CHECK_MSG(e1 < 1e-6, "%s %s: dx off by %.3g (relative to its largest element)", isa, c->name, e1);
            CHECK_MSG(e2 < 1e-6, "%s %s, PS_DNNL_POOL_BWD=onednn: dx off by %.3g", isa, c->name, e2);
        }
        free(x); free(dy); free(dx0); free(dx1); free(dx2);
    }
    char buf[1024];
    int nf = ps_backend_fallbacks(dn, buf, sizeof buf);
    CHECK_MSG(nf == 0, "%s: %d disallowed reference kernels:\n%s", isa, nf, buf);
    ps_backend_free(ref);
    ps_backend_free(dn);
    ps_backend_free(dno);
    char name[64];
    snprintf(name, sizeof name, "test_pool_bwd[%s]", isa);
    return check_summary(name);
}

int main(int argc, char **argv) { return isa_children_main("test_pool_bwd", argc, argv, child); }
