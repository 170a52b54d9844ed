/* test_im2col.c - the im2col / col2im op pair of F.unfold / F.fold
 * (backend.h's ps_im2col_desc) over geometries beyond test_kinds' golden
 * cases: padding past the kernel, strides past the dilated kernel (pixels
 * no window reads), dilation, non-square everything, one-pixel images,
 * and planes large enough for dnnl's threads. On every backend here (ref,
 * dnnl; cuda when this machine has a device):
 *
 *  1. col2im is im2col's adjoint: <im2col(x), c> = <x, col2im(c)>, summed
 *     in double (an independent check of both: a column element sent to
 *     the wrong pixel, or a pixel read from the wrong place, breaks it);
 *  2. im2col of an image whose pixels hold their own indices puts each
 *     pixel where the window formula says, 0 outside the image (checked
 *     here element by element from the formula, not from ref's loop);
 *  3. every backend's results equal ref's exactly (col2im sums each
 *     pixel's column elements in one order, kernel row then column).
 *
 * test_kinds checks the kinds on all three against PyTorch autograd.
 */
#include "backend.h"
#include "check.h"
#include "support/random.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct geo {
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw;
} geo;

static const geo kGeos[] = {
    {2, 3, 5, 6, 2, 3, 1, 1, 0, 0, 1, 1},
    {2, 2, 7, 7, 3, 3, 2, 2, 1, 1, 1, 1},
    {1, 2, 8, 9, 3, 2, 2, 1, 1, 2, 2, 3},
    {2, 1, 5, 5, 2, 2, 3, 3, 0, 0, 1, 1},     /* stride past the kernel: rows and columns no window reads */
    {1, 2, 4, 3, 2, 2, 1, 2, 3, 4, 1, 1},     /* padding past the kernel: whole windows outside the image */
    {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1},     /* one pixel */
    {1, 2, 1, 5, 3, 1, 1, 2, 1, 0, 1, 1},     /* one row, padded */
    {2, 3, 6, 6, 3, 3, 3, 3, 0, 0, 1, 1},     /* ViT-style patches that tile */
    {2, 3, 9, 11, 3, 4, 2, 3, 2, 1, 3, 2},
    {4, 16, 40, 36, 3, 3, 1, 1, 1, 1, 1, 1},  /* past dnnl's threading threshold */
    {3, 8, 33, 29, 5, 2, 2, 3, 4, 1, 2, 5},
};

static int64_t blocks(int64_t n, int64_t k, int64_t s, int64_t p, int64_t d) {
    return (n + 2 * p - d * (k - 1) - 1) / s + 1;
}

static ps_im2col_desc desc_of(const geo *g) {
    ps_im2col_desc d = {g->n, g->c, g->h, g->w, g->kh, g->kw, g->sh, g->sw, g->ph, g->pw, g->dh, g->dw, 0, 0};
    d.oh = blocks(g->h, g->kh, g->sh, g->ph, g->dh);
    d.ow = blocks(g->w, g->kw, g->sw, g->pw, g->dw);
    return d;
}

/* im2col (to_cols) or col2im of src (host, n elements) into dst (host, m elements) on backend b. */
static void run_op(ps_backend *b, const ps_im2col_desc *d, int to_cols, const float *src, size_t n, float *dst,
                   size_t m) {
    ps_err err = {0};
    float *ds = ps_backend_alloc_floats(b, (int64_t)n), *dd = ps_backend_alloc_floats(b, (int64_t)m);
    CHECK_MSG(ds && dd, "%s: out of memory", b->ops->name);
    if (!ds || !dd) return;
    CHECK(b->ops->copy_to_device(b->impl, ds, src, n * sizeof *src, &err) == PS_OK);
    ps_status rc = to_cols ? b->ops->im2col(b->impl, d, ds, dd, &err) : b->ops->col2im(b->impl, d, ds, dd, &err);
    CHECK_MSG(rc == PS_OK, "%s %s: %s", b->ops->name, to_cols ? "im2col" : "col2im", err.msg);
    CHECK(b->ops->copy_to_host(b->impl, dst, dd, m * sizeof *dst, &err) == PS_OK);
    b->ops->free(b->impl, ds);
    b->ops->free(b->impl, dd);
}

static void check_geo(ps_backend *b, ps_backend *ref, const geo *g, int gi) {
    const ps_im2col_desc d = desc_of(g);
    const size_t nx = (size_t)(d.n * d.c * d.h * d.w), L = (size_t)(d.oh * d.ow);
    const size_t nc = (size_t)(d.n * d.c * d.kh * d.kw) * L;
    rng r = {0x9e3779b97f4a7c15ull + (uint64_t)gi};
    float *x = host_random(nx, &r), *c = host_random(nc, &r);
    float *cols = malloc(nc * sizeof *cols), *img = malloc(nx * sizeof *img);
    float *idx = malloc(nx * sizeof *idx), *icols = malloc(nc * sizeof *icols);
    run_op(b, &d, 1, x, nx, cols, nc);
    run_op(b, &d, 0, c, nc, img, nx);
    /* 1. adjointness */
    double a = 0, bsum = 0, scale = 0;
    for (size_t k = 0; k < nc; k++) a += (double)cols[k] * c[k], scale += fabs((double)cols[k] * c[k]);
    for (size_t k = 0; k < nx; k++) bsum += (double)x[k] * img[k];
    CHECK_MSG(fabs(a - bsum) <= 1e-5 * (scale + 1), "%s geometry %d: <im2col(x), c> %.9g but <x, col2im(c)> %.9g",
              b->ops->name, gi, a, bsum);
    /* 2. each column element from the window formula */
    for (size_t k = 0; k < nx; k++) idx[k] = (float)(k + 1);
    run_op(b, &d, 1, idx, nx, icols, nc);
    int64_t bad = 0;
    for (int64_t s = 0; s < d.n; s++)
        for (int64_t ci = 0; ci < d.c; ci++)
            for (int64_t i = 0; i < d.kh; i++)
                for (int64_t j = 0; j < d.kw; j++)
                    for (int64_t p = 0; p < d.oh; p++)
                        for (int64_t q = 0; q < d.ow; q++) {
                            const int64_t y = p * d.sh - d.ph + i * d.dh, xx = q * d.sw - d.pw + j * d.dw;
                            const float want = y >= 0 && y < d.h && xx >= 0 && xx < d.w
                                                   ? (float)(((s * d.c + ci) * d.h + y) * d.w + xx + 1) : 0.0f;
                            const int64_t at = ((s * d.c + ci) * d.kh * d.kw + i * d.kw + j) * (int64_t)L +
                                               p * d.ow + q;
                            bad += icols[at] != want;
                        }
    CHECK_MSG(bad == 0, "%s geometry %d: %lld column elements not the pixel the window formula reads", b->ops->name,
              gi, (long long)bad);
    /* 3. the same as ref, exactly */
    if (b != ref) {
        float *rc = malloc(nc * sizeof *rc), *ri = malloc(nx * sizeof *ri);
        run_op(ref, &d, 1, x, nx, rc, nc);
        run_op(ref, &d, 0, c, nc, ri, nx);
        CHECK_MSG(!memcmp(rc, cols, nc * sizeof *rc), "%s geometry %d: im2col differs from ref's", b->ops->name, gi);
        CHECK_MSG(!memcmp(ri, img, nx * sizeof *ri), "%s geometry %d: col2im differs from ref's", b->ops->name, gi);
        free(rc);
        free(ri);
    }
    free(x); free(c); free(cols); free(img); free(idx); free(icols);
}

int main(void) {
    ps_err err = {0};
    const char *names[] = {"ref", "dnnl", "cuda"};
    ps_backend *ref = ps_backend_create("ref", 0, 0, &err);
    CHECK_MSG(ref, "%s", err.msg);
    if (!ref) return check_summary("test_im2col");
    for (int bi = 0; bi < 3; bi++) {
        ps_backend *b = bi == 0 ? ref : ps_backend_create(names[bi], 0, 2, &err);
        if (!b) {
            CHECK_MSG(bi == 2, "%s: %s", names[bi], err.msg);
            printf("%s: skipped: %s\n", names[bi], err.msg);
            continue;
        }
        for (size_t g = 0; g < sizeof kGeos / sizeof kGeos[0]; g++) check_geo(b, ref, &kGeos[g], (int)g);
        printf("%s: %zu geometries\n", names[bi], sizeof kGeos / sizeof kGeos[0]);
        if (b != ref) ps_backend_free(b);
    }
    ps_backend_free(ref);
    return check_summary("test_im2col");
}
