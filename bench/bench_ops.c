/* bench_ops - time of the dnnl backend's issue-18 ops at a small ResNet's
 * layer shapes, beside the convolution of the same layer and beside
 * oneDNN's own primitives where the backend runs a C kernel instead
 * (batch norm: ncsp_bnorm on plain layouts, bnorm_jit / bnorm_ref on
 * blocked ones; layer norm: simple_layer_normalization). The point: show
 * the C kernels (chosen because oneDNN 2.6 has no JIT kernel for those
 * layouts on every ISA) are not a step's bottleneck. adaptive_half:
 * AdaptiveAvgPool2d to half the size (uniform 2x2 bins) as the kind runs
 * it (impl=avgpool: oneDNN's average pooling, in the layout it gets)
 * against the adaptive C loops it runs for uneven bins (impl=adaptive_c;
 * in a blocked network with the reorders the executor would add:
 * adaptive_c+reorders).
 *
 * One machine-readable line per measurement, the median over R
 * repetitions of at least T seconds each, in microseconds per call
 * (forward + backward where the op has one):
 *
 *   ops isa=avx2 threads=1 what=bn2d_train layout=blocked shape=32x32x14x14 impl=backend median=123.4 unit=us
 *
 * usage: bench_ops [--threads N] [--reps R] [--secs T] [--only WHAT]
 * (--only: the measurements whose name contains WHAT, e.g. bn2d).
 * ONEDNN_MAX_CPU_ISA=AVX2 / SSE41 emulate lower ISAs.
 */
#include <dnnl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend.h"
#include "cli.h"
#include "clock.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int g_reps = 3, g_threads = 1;
static double g_secs = 0.5;
static const char *g_only;   /* --only: measurements whose name contains it */
static double g_min;         /* the last time_us's fastest repetition */

typedef void (*op_fn)(void *ctx);

static int wanted(const char *what) { return !g_only || strstr(what, g_only); }

/* Median microseconds per call of fn over g_reps repetitions. */
static double time_us(op_fn fn, void *ctx) {
    double med[16];
    fn(ctx);   /* warm-up: primitives created, caches warm */
    for (int r = 0; r < g_reps; r++) {
        long calls = 0;
        double t0 = ps_mono_s(), t;
        do {
            fn(ctx);
            calls++;
        } while ((t = ps_mono_s()) - t0 < g_secs);
        med[r] = (t - t0) / calls * 1e6;
    }
    qsort(med, (size_t)g_reps, sizeof med[0], cmp_double);
    g_min = med[0];
    return med[g_reps / 2];
}

static void line(const char *what, const char *layout, const char *shape, const char *impl, double us) {
    printf("ops isa=%s threads=%d what=%s layout=%s shape=%s impl=%s median=%.1f min=%.1f unit=us\n",
           ps_backend_cpu_isa(), g_threads, what, layout, shape, impl, us, g_min);
    fflush(stdout);
}

static void fill(float *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
}

static void must(ps_status st, const ps_err *err, const char *what) {
    if (st != PS_OK) {
        fprintf(stderr, "bench_ops: %s: %s\n", what, err->msg);
        exit(1);
    }
}

/* ---- the backend's ops ---- */

typedef struct bctx {
    ps_backend *b;
    int n, c, h, w, layout;
    float *x, *y, *dy, *dx, *w1, *dw, *gamma, *beta, *dgamma, *dbeta, *mean, *var, *mask;
    ps_conv_desc conv;
    ps_pool_desc pool;
    ps_ln_desc ln;
    ps_softmax_desc sm;
    ps_act_desc act;
    ps_adaptive_desc ad;
    void *ws;
} bctx;

#define RUN(c, op, ...) do { ps_err e_ = { 0 }; must((c)->b->ops->op((c)->b->impl, __VA_ARGS__, &e_), &e_, #op); } while (0)

static ps_chan_desc chan(const bctx *c) {
    ps_chan_desc d = { .n = c->n, .c = c->c, .s = (int64_t)c->h * c->w, .layout = c->layout, .eps = 1e-5f };
    return d;
}

static void op_conv(void *p) {
    bctx *c = p;
    RUN(c, conv2d_forward, &c->conv, c->x, c->w1, c->beta, c->y);
    RUN(c, conv2d_backward, &c->conv, c->x, c->w1, c->dy, c->dx, c->dw, c->dbeta);
}

static void op_bn(void *p) {
    bctx *c = p;
    ps_chan_desc d = chan(c);
    RUN(c, batchnorm_forward_training, &d, c->x, c->gamma, c->beta, c->y, c->mean, c->var, NULL);
    RUN(c, batchnorm_backward, &d, 1, c->x, c->dy, c->gamma, NULL, c->mean, c->var, c->dx, c->dgamma, c->dbeta);
}

static void op_maxpool(void *p) {
    bctx *c = p;
    RUN(c, maxpool_forward, &c->pool, c->x, c->y, c->ws);
    RUN(c, maxpool_backward, &c->pool, c->ws, c->dy, c->dx);
}

static void op_avgpool(void *p) {
    bctx *c = p;
    RUN(c, avgpool_forward, &c->pool, c->x, c->y);
    RUN(c, avgpool_backward, &c->pool, c->dy, c->dx);
}

static void op_adaptive(void *p) {
    bctx *c = p;
    RUN(c, adaptive_avgpool_forward, &c->ad, c->x, c->y);
    RUN(c, adaptive_avgpool_backward, &c->ad, c->dy, c->dx);
}

/* The adaptive C loops in a blocked network: x and dy reordered to plain
 * (into gamma, beta), y and dx back. */
static void op_adaptive_reordered(void *p) {
    bctx *c = p;
    const ps_adaptive_desc *d = &c->ad;
    RUN(c, reorder, d->n, d->c, d->h, d->w, c->x, PS_LAYOUT_BLOCKED, c->gamma, PS_LAYOUT_PLAIN);
    RUN(c, adaptive_avgpool_forward, d, c->gamma, c->beta);
    RUN(c, reorder, d->n, d->c, d->oh, d->ow, c->beta, PS_LAYOUT_PLAIN, c->y, PS_LAYOUT_BLOCKED);
    RUN(c, reorder, d->n, d->c, d->oh, d->ow, c->dy, PS_LAYOUT_BLOCKED, c->beta, PS_LAYOUT_PLAIN);
    RUN(c, adaptive_avgpool_backward, d, c->beta, c->gamma);
    RUN(c, reorder, d->n, d->c, d->h, d->w, c->gamma, PS_LAYOUT_PLAIN, c->dx, PS_LAYOUT_BLOCKED);
}

static void op_ln(void *p) {
    bctx *c = p;
    RUN(c, layernorm_forward, &c->ln, c->x, c->gamma, c->beta, c->y, c->mean, c->var);
    RUN(c, layernorm_backward, &c->ln, c->x, c->dy, c->gamma, c->mean, c->var, c->dx, c->dgamma, c->dbeta);
}

static void op_softmax(void *p) {
    bctx *c = p;
    RUN(c, softmax_dim_forward, &c->sm, c->x, c->y);
    RUN(c, softmax_dim_backward, &c->sm, c->y, c->dy, c->dx);
}

static void op_act(void *p) {
    bctx *c = p;
    const int64_t n = (int64_t)c->n * c->c * c->h * c->w;
    RUN(c, act_forward, &c->act, n, c->x, c->y);
    RUN(c, act_backward, &c->act, n, c->x, c->y, c->dy, c->dx);
}

static void op_mask(void *p) {
    bctx *c = p;
    ps_chan_desc d = chan(c);
    RUN(c, mul_channels, &d, c->x, c->mask, c->y);
    RUN(c, mul_channels, &d, c->dy, c->mask, c->dx);
}

/* ---- oneDNN's own batch and layer normalisation, for comparison ---- */

typedef struct dctx {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t fwd, bwd;
    dnnl_exec_arg_t fa[8], ba[12];
    int nfa, nba;
    const char *impl;
} dctx;

static void dn_check(dnnl_status_t s, const char *what) {
    if (s != dnnl_success) {
        fprintf(stderr, "bench_ops: %s failed: status %d\n", what, (int)s);
        exit(1);
    }
}

static dnnl_memory_t mem(dctx *d, const dnnl_memory_desc_t *md, void *p) {
    dnnl_memory_t m;
    dn_check(dnnl_memory_create(&m, md, d->eng, p), "dnnl_memory_create");
    return m;
}

static void dnnl_run(void *p) {
    dctx *d = p;
    dn_check(dnnl_primitive_execute(d->fwd, d->stream, d->nfa, d->fa), "execute fwd");
    dn_check(dnnl_primitive_execute(d->bwd, d->stream, d->nba, d->ba), "execute bwd");
    dn_check(dnnl_stream_wait(d->stream), "stream wait");
}

/* Forward (training) + backward primitives of op_desc / bop_desc, with
 * memories for src, dst, diff_* and the statistics on buffers of c. */
static void dnnl_setup(dctx *d, const_dnnl_op_desc_t fop, const_dnnl_op_desc_t bop, const bctx *c, int ln) {
    dnnl_primitive_desc_t fpd, bpd;
    dn_check(dnnl_primitive_desc_create(&fpd, fop, NULL, d->eng, NULL), "fwd pd");
    dn_check(dnnl_primitive_desc_create(&bpd, bop, NULL, d->eng, fpd), "bwd pd");
    dn_check(dnnl_primitive_desc_query(fpd, dnnl_query_impl_info_str, 0, &d->impl), "impl");
    dn_check(dnnl_primitive_create(&d->fwd, fpd), "fwd");
    dn_check(dnnl_primitive_create(&d->bwd, bpd), "bwd");
    const dnnl_memory_desc_t *src = dnnl_primitive_desc_query_md(fpd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *mean = dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 1);
    const dnnl_memory_desc_t *var = dnnl_primitive_desc_query_md(fpd, dnnl_query_dst_md, 2);
    const dnnl_memory_desc_t *ws = dnnl_primitive_desc_query_md(fpd, dnnl_query_workspace_md, 0);
    const dnnl_memory_desc_t *sc = dnnl_primitive_desc_query_md(fpd, dnnl_query_exec_arg_md, DNNL_ARG_SCALE);
    const dnnl_memory_desc_t *sh = dnnl_primitive_desc_query_md(fpd, dnnl_query_exec_arg_md, DNNL_ARG_SHIFT);
    d->nfa = d->nba = 0;
    d->fa[d->nfa++] = (dnnl_exec_arg_t){ DNNL_ARG_SRC, mem(d, src, c->x) };
    d->fa[d->nfa++] = (dnnl_exec_arg_t){ DNNL_ARG_DST, mem(d, src, c->y) };
    d->fa[d->nfa++] = (dnnl_exec_arg_t){ DNNL_ARG_MEAN, mem(d, mean, c->mean) };
    d->fa[d->nfa++] = (dnnl_exec_arg_t){ DNNL_ARG_VARIANCE, mem(d, var, c->var) };
    d->fa[d->nfa++] = (dnnl_exec_arg_t){ DNNL_ARG_SCALE, mem(d, sc, c->gamma) };
    d->fa[d->nfa++] = (dnnl_exec_arg_t){ DNNL_ARG_SHIFT, mem(d, sh, c->beta) };
    void *wsbuf = NULL;
    if (ws && ws->ndims) {
        wsbuf = aligned_alloc(64, (dnnl_memory_desc_get_size(ws) + 63) & ~(size_t)63);
        d->fa[d->nfa++] = (dnnl_exec_arg_t){ DNNL_ARG_WORKSPACE, mem(d, ws, wsbuf) };
    }
    for (int i = 0; i < d->nfa; i++)
        if (d->fa[i].arg != DNNL_ARG_DST) d->ba[d->nba++] = d->fa[i];
    d->ba[d->nba++] = (dnnl_exec_arg_t){ DNNL_ARG_DIFF_DST, mem(d, src, c->dy) };
    d->ba[d->nba++] = (dnnl_exec_arg_t){ DNNL_ARG_DIFF_SRC, mem(d, src, c->dx) };
    d->ba[d->nba++] = (dnnl_exec_arg_t){ DNNL_ARG_DIFF_SCALE, mem(d, sc, c->dgamma) };
    d->ba[d->nba++] = (dnnl_exec_arg_t){ DNNL_ARG_DIFF_SHIFT, mem(d, sh, c->dbeta) };
    (void)ln;
    dnnl_primitive_desc_destroy(fpd);
    dnnl_primitive_desc_destroy(bpd);
}

static void dnnl_bn(bctx *c, dnnl_format_tag_t tag, const char *layout, const char *shape) {
    dctx d = { 0 };
    dn_check(dnnl_engine_create(&d.eng, dnnl_cpu, 0), "engine");
    dn_check(dnnl_stream_create(&d.stream, d.eng, dnnl_stream_default_flags), "stream");
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = { c->n, c->c, c->h, c->w };
    dn_check(dnnl_memory_desc_init_by_tag(&md, 4, dims, dnnl_f32, tag), "md");
    dnnl_batch_normalization_desc_t f, b;
    const unsigned flags = dnnl_use_scale | dnnl_use_shift;
    dn_check(dnnl_batch_normalization_forward_desc_init(&f, dnnl_forward_training, &md, 1e-5f, flags), "bn fwd");
    dn_check(dnnl_batch_normalization_backward_desc_init(&b, dnnl_backward, &md, &md, 1e-5f, flags), "bn bwd");
    dnnl_setup(&d, &f, &b, c, 0);
    line("bn2d_train", layout, shape, d.impl, time_us(dnnl_run, &d));
}

static void dnnl_ln(bctx *c, const char *shape) {
    dctx d = { 0 };
    dn_check(dnnl_engine_create(&d.eng, dnnl_cpu, 0), "engine");
    dn_check(dnnl_stream_create(&d.stream, d.eng, dnnl_stream_default_flags), "stream");
    dnnl_memory_desc_t md, st;
    dnnl_dims_t dims = { c->ln.rows, c->ln.cols }, sd = { c->ln.rows };
    dn_check(dnnl_memory_desc_init_by_tag(&md, 2, dims, dnnl_f32, dnnl_ab), "md");
    dn_check(dnnl_memory_desc_init_by_tag(&st, 1, sd, dnnl_f32, dnnl_a), "md");
    dnnl_layer_normalization_desc_t f, b;
    const unsigned flags = dnnl_use_scale | dnnl_use_shift;
    dn_check(dnnl_layer_normalization_forward_desc_init(&f, dnnl_forward_training, &md, &st, 1e-5f, flags), "ln fwd");
    dn_check(dnnl_layer_normalization_backward_desc_init(&b, dnnl_backward, &md, &md, &st, 1e-5f, flags), "ln bwd");
    dnnl_setup(&d, &f, &b, c, 1);
    line("layernorm", "plain", shape, d.impl, time_us(dnnl_run, &d));
}

/* ---- main ---- */

static bctx setup(ps_backend *b, int n, int ch, int h, int w, int layout) {
    bctx c = { .b = b, .n = n, .c = ch, .h = h, .w = w, .layout = layout };
    const size_t cnt = (size_t)n * ch * h * w, big = cnt > 4096 ? cnt : 4096;
    float **bufs[] = { &c.x, &c.y, &c.dy, &c.dx, &c.w1, &c.dw, &c.gamma, &c.beta, &c.dgamma, &c.dbeta, &c.mean,
                       &c.var, &c.mask };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i] = ps_backend_alloc_floats(b, (int64_t)big);
        fill(*bufs[i], big, 17u * (unsigned)i + 1u);
    }
    for (size_t i = 0; i < big; i++) c.var[i] = 1.0f;
    return c;
}

static void release(bctx *c) {
    float *bufs[] = { c->x, c->y, c->dy, c->dx, c->w1, c->dw, c->gamma, c->beta, c->dgamma, c->dbeta, c->mean,
                      c->var, c->mask };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ps_backend_release(c->b, bufs[i]);
    if (c->ws) c->b->ops->free(c->b->impl, c->ws);
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        long x;
        if (!strcmp(a, "--threads")) { if (ps_cli_long("bench_ops", a, v, 1, 256, &x)) return 2; g_threads = (int)x; }
        else if (!strcmp(a, "--reps")) { if (ps_cli_long("bench_ops", a, v, 1, 15, &x)) return 2; g_reps = (int)x; }
        else if (!strcmp(a, "--secs")) { if (ps_cli_double("bench_ops", a, v, 1e-3, 3600, &g_secs)) return 2; }
        else if (!strcmp(a, "--only")) g_only = v;
        else {
            fprintf(stderr, "usage: bench_ops [--threads N] [--reps R] [--secs T] [--only WHAT]\n");
            return 2;
        }
    }
    ps_err err = { 0 };
    ps_backend *b = ps_backend_create("dnnl", 0, g_threads, &err);
    if (!b) {
        fprintf(stderr, "bench_ops: %s\n", err.msg);
        return 1;
    }
    /* A small ResNet's layers at batch 32: (channels, size). */
    static const int kShapes[][2] = { { 16, 28 }, { 32, 14 }, { 64, 7 } };
    for (size_t si = 0; si < sizeof kShapes / sizeof kShapes[0]; si++) {
        const int ch = kShapes[si][0], hw = kShapes[si][1];
        char shape[48];
        snprintf(shape, sizeof shape, "32x%dx%dx%d", ch, hw, hw);
        for (int layout = 0; layout < 2; layout++) {
            if (layout && !(b->ops->blocked_layout && b->ops->blocked_layout(b->impl, ch) > 0)) continue;
            const char *lay = layout ? "blocked" : "plain";
            bctx c = setup(b, 32, ch, hw, hw, layout);
            c.conv = (ps_conv_desc){ .n = 32, .cin = ch, .h = hw, .w = hw, .cout = ch, .kh = 3, .kw = 3, .stride_h = 1,
                                     .stride_w = 1, .pad_h = 1, .pad_w = 1, .src_layout = layout, .dst_layout = layout };
            if (wanted("conv3x3_reference_point")) line("conv3x3_reference_point", lay, shape, "backend", time_us(op_conv, &c));
            if (wanted("bn2d_train")) line("bn2d_train", lay, shape, "backend", time_us(op_bn, &c));
            if (wanted("bn2d_train")) dnnl_bn(&c, layout ? (b->ops->blocked_layout(b->impl, ch) == 16 ? dnnl_nChw16c : dnnl_nChw8c) : dnnl_nchw,
                    lay, shape);
            c.pool = (ps_pool_desc){ .n = 32, .c = ch, .h = hw, .w = hw, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2,
                                     .pad_h = 1, .pad_w = 1, .layout = layout, .count_include_pad = 1 };
            c.ws = b->ops->alloc(b->impl, b->ops->maxpool_workspace_size(b->impl, &c.pool));
            if (wanted("maxpool3x3s2p1")) line("maxpool3x3s2p1", lay, shape, "backend", time_us(op_maxpool, &c));
            if (wanted("avgpool3x3s2p1")) line("avgpool3x3s2p1", lay, shape, "backend", time_us(op_avgpool, &c));
            c.pool = (ps_pool_desc){ .n = 32, .c = ch, .h = hw, .w = hw, .kh = hw, .kw = hw, .stride_h = 1,
                                     .stride_w = 1, .layout = layout, .count_include_pad = 1 };
            if (wanted("global_avgpool")) line("global_avgpool", lay, shape, "backend", time_us(op_avgpool, &c));
            if (hw % 2 == 0 && wanted("adaptive_half")) {   /* AdaptiveAvgPool2d to hw / 2: uniform 2x2 bins */
                c.pool = (ps_pool_desc){ .n = 32, .c = ch, .h = hw, .w = hw, .kh = 2, .kw = 2, .stride_h = 2,
                                         .stride_w = 2, .layout = layout, .count_include_pad = 1 };
                c.ad = (ps_adaptive_desc){ 32, ch, hw, hw, hw / 2, hw / 2 };
                line("adaptive_half", lay, shape, "avgpool", time_us(op_avgpool, &c));
                line("adaptive_half", lay, shape, layout ? "adaptive_c+reorders" : "adaptive_c",
                     time_us(layout ? op_adaptive_reordered : op_adaptive, &c));
            }
            if (wanted("dropout2d_mask")) line("dropout2d_mask", lay, shape, "backend", time_us(op_mask, &c));
            if (!layout) {
                c.act = (ps_act_desc){ .kind = PS_ACT_GELU };
                if (wanted("gelu")) line("gelu", "any", shape, "backend", time_us(op_act, &c));
                c.sm = (ps_softmax_desc){ .outer = 32, .dim = ch, .inner = (int64_t)hw * hw };
                if (wanted("softmax_dim1")) line("softmax_dim1", lay, shape, "backend", time_us(op_softmax, &c));
                c.ln = (ps_ln_desc){ .rows = 32, .cols = (int64_t)ch * hw * hw, .eps = 1e-5f };
                if (wanted("layernorm")) line("layernorm", lay, shape, "backend", time_us(op_ln, &c));
                if (wanted("layernorm")) dnnl_ln(&c, shape);
            }
            release(&c);
        }
    }
    ps_backend_free(b);
    return 0;
}
