/* lstm.c - one LSTM layer (lstm.h): the plain C reference and oneDNN's
 * LSTM primitives behind one handle. */
#include "lstm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include "dnnl_check.h"

typedef struct lstm_impl_ops {
    ps_status (*init)(ps_lstm *l, ps_err *err);
    void (*fini)(ps_lstm *l);
    ps_status (*forward)(ps_lstm *l, const ps_lstm_weights *w, const float *x, const float *h0, const float *c0,
                         float *y, float *hT, float *cT, ps_err *err);
    ps_status (*backward)(ps_lstm *l, const ps_lstm_weights *w, const float *dy, const float *dhT, const float *dcT,
                          float *dx, float *dh0, float *dc0, ps_lstm_grads *g, ps_err *err);
} lstm_impl_ops;

/* The oneDNN state of a handle. */
typedef struct lstm_dnnl {
    dnnl_engine_t eng;
    dnnl_stream_t strm;
    dnnl_primitive_desc_t fwd_pd, bwd_pd;
    dnnl_primitive_t fwd, bwd;
    /* reorders user (PyTorch ldgoi) <-> primitive layouts; NULL when equal */
    dnnl_primitive_t r_fwd_wl, r_fwd_wi, r_bwd_wl, r_bwd_wi, r_dwl, r_dwi;
    dnnl_memory_desc_t user_wl, user_wi;                  /* ldgoi (1,1,I,4,H), (1,1,H,4,H) */
    float *wl_f, *wi_f, *wl_b, *wi_b, *dwl, *dwi, *dbias; /* primitive-layout buffers */
    float *bias;        /* (4H) b_ih + b_hh */
    float *ws;          /* oneDNN workspace of the last forward */
    float *dwl_u, *dwi_u; /* (4H,I), (4H,H) gradients in PyTorch layout */
    float *y;           /* (T,N,H) copy of the last forward's output */
    float *hT, *cT;     /* (N,H) */
    float *zero_nh;     /* (N,H) zeros */
} lstm_dnnl;

struct ps_lstm {
    ps_lstm_impl impl;
    ps_lstm_shape s;
    const lstm_impl_ops *ops;
    int have_forward;
    /* tape of the last forward (both): */
    float *x;    /* (T,N,I) */
    float *h;    /* (T+1,N,H) h_{-1}=h0 .. h_{T-1} */
    float *c;    /* (T+1,N,H) c_{-1}=c0 .. c_{T-1} */
    float *act;  /* (T,N,4H) activated gates (ref) */
    lstm_dnnl d;
};

static float sigm(float v) { return 1.0f / (1.0f + expf(-v)); }

/* ---- reference ---- */

static ps_status ref_init(ps_lstm *l, ps_err *err) {
    size_t T = (size_t)l->s.T, N = (size_t)l->s.N, H = (size_t)l->s.H;
    l->act = malloc(T * N * 4 * H * sizeof(float));
    return l->act ? PS_OK : ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "lstm: out of memory");
}

static void ref_fini(ps_lstm *l) { free(l->act); }

static ps_status ref_forward(ps_lstm *l, const ps_lstm_weights *w, const float *x, const float *h0,
                             const float *c0, float *y, float *hT, float *cT, ps_err *err) {
    (void)err, (void)h0, (void)c0; /* the tape's first rows (ps_lstm_forward copied them) */
    const int64_t T = l->s.T, N = l->s.N, I = l->s.I, H = l->s.H, G = 4 * H;
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * N * I, *hp = l->h + t * N * H, *cp = l->c + t * N * H;
        float *hn = l->h + (t + 1) * N * H, *cn = l->c + (t + 1) * N * H, *a = l->act + t * N * G;
        for (int64_t n = 0; n < N; n++) {
            for (int64_t r = 0; r < G; r++) {
                double s = (double)w->b_ih[r] + w->b_hh[r];
                for (int64_t k = 0; k < I; k++) s += (double)w->w_ih[r * I + k] * xt[n * I + k];
                for (int64_t k = 0; k < H; k++) s += (double)w->w_hh[r * H + k] * hp[n * H + k];
                a[n * G + r] = r >= 2 * H && r < 3 * H ? tanhf((float)s) : sigm((float)s);
            }
            for (int64_t j = 0; j < H; j++) {
                float ig = a[n * G + j], fg = a[n * G + H + j], gg = a[n * G + 2 * H + j], og = a[n * G + 3 * H + j];
                float cv = fg * cp[n * H + j] + ig * gg;
                cn[n * H + j] = cv;
                hn[n * H + j] = og * tanhf(cv);
            }
        }
        memcpy(y + t * N * H, hn, (size_t)(N * H) * sizeof(float));
    }
    if (hT) memcpy(hT, l->h + T * N * H, (size_t)(N * H) * sizeof(float));
    if (cT) memcpy(cT, l->c + T * N * H, (size_t)(N * H) * sizeof(float));
    return PS_OK;
}

static ps_status ref_backward(ps_lstm *l, const ps_lstm_weights *w, const float *dy, const float *dhT,
                              const float *dcT, float *dx, float *dh0, float *dc0, ps_lstm_grads *g, ps_err *err) {
    const int64_t T = l->s.T, N = l->s.N, I = l->s.I, H = l->s.H, G = 4 * H;
    float *dh = calloc((size_t)(N * H), sizeof(float)), *dc = calloc((size_t)(N * H), sizeof(float));
    float *da = malloc((size_t)(N * G) * sizeof(float)), *dhn = malloc((size_t)(N * H) * sizeof(float));
    if (!dh || !dc || !da || !dhn) {
        free(dh); free(dc); free(da); free(dhn);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "lstm: out of memory");
    }
    if (dhT) memcpy(dh, dhT, (size_t)(N * H) * sizeof(float));
    if (dcT) memcpy(dc, dcT, (size_t)(N * H) * sizeof(float));
    for (int64_t t = T - 1; t >= 0; t--) {
        const float *xt = l->x + t * N * I, *hp = l->h + t * N * H, *cp = l->c + t * N * H;
        const float *cn = l->c + (t + 1) * N * H, *a = l->act + t * N * G;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < H; j++) {
                int64_t k = n * H + j;
                float ig = a[n * G + j], fg = a[n * G + H + j], gg = a[n * G + 2 * H + j], og = a[n * G + 3 * H + j];
                float tc = tanhf(cn[k]);
                float dhv = dh[k] + dy[t * N * H + k];
                float dcv = dc[k] + dhv * og * (1 - tc * tc);
                da[n * G + j] = dcv * gg * ig * (1 - ig);
                da[n * G + H + j] = dcv * cp[k] * fg * (1 - fg);
                da[n * G + 2 * H + j] = dcv * ig * (1 - gg * gg);
                da[n * G + 3 * H + j] = dhv * tc * og * (1 - og);
                dc[k] = dcv * fg;
            }
        for (int64_t r = 0; r < G; r++)
            for (int64_t n = 0; n < N; n++) {
                float d = da[n * G + r];
                g->b_ih[r] += d;
                g->b_hh[r] += d;
                for (int64_t k = 0; k < I; k++) g->w_ih[r * I + k] += d * xt[n * I + k];
                for (int64_t k = 0; k < H; k++) g->w_hh[r * H + k] += d * hp[n * H + k];
            }
        for (int64_t n = 0; n < N; n++) {
            if (dx)
                for (int64_t k = 0; k < I; k++) {
                    double s = 0;
                    for (int64_t r = 0; r < G; r++) s += (double)da[n * G + r] * w->w_ih[r * I + k];
                    dx[t * N * I + n * I + k] = (float)s;
                }
            for (int64_t k = 0; k < H; k++) {
                double s = 0;
                for (int64_t r = 0; r < G; r++) s += (double)da[n * G + r] * w->w_hh[r * H + k];
                dhn[n * H + k] = (float)s;
            }
        }
        memcpy(dh, dhn, (size_t)(N * H) * sizeof(float));
    }
    if (dh0) memcpy(dh0, dh, (size_t)(N * H) * sizeof(float));
    if (dc0) memcpy(dc0, dc, (size_t)(N * H) * sizeof(float));
    free(dh); free(dc); free(da); free(dhn);
    return PS_OK;
}

static const lstm_impl_ops ref_ops = {ref_init, ref_fini, ref_forward, ref_backward};

/* ---- oneDNN ---- */

static int lstm_threads; /* __atomic; ps_lstm_set_threads */

void ps_lstm_set_threads(int n) { __atomic_store_n(&lstm_threads, n > 0 ? n : 0, __ATOMIC_RELAXED); }

static void use_threads(void) {
    int n = __atomic_load_n(&lstm_threads, __ATOMIC_RELAXED);
    if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}

static ps_status md_tag(dnnl_memory_desc_t *md, int nd, const dnnl_dims_t dims, dnnl_format_tag_t tag, ps_err *err) {
    PS_DNNL_CHECK(dnnl_memory_desc_init_by_tag(md, nd, dims, dnnl_f32, tag));
    return PS_OK;
}

/* A reorder from -> to, or *r = NULL when they are the same layout. */
static ps_status mk_reorder(lstm_dnnl *d, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                            dnnl_primitive_t *r, ps_err *err) {
    *r = NULL;
    if (dnnl_memory_desc_equal(from, to)) return PS_OK;
    dnnl_primitive_desc_t pd;
    PS_DNNL_CHECK(dnnl_reorder_primitive_desc_create(&pd, from, d->eng, to, d->eng, NULL));
    dnnl_status_t st = dnnl_primitive_create(r, pd);
    dnnl_primitive_desc_destroy(pd);
    PS_DNNL_CHECK(st);
    return PS_OK;
}

static ps_status run_reorder(lstm_dnnl *d, dnnl_primitive_t r, const dnnl_memory_desc_t *from, void *src,
                             const dnnl_memory_desc_t *to, void *dst, ps_err *err) {
    if (!r) {
        memcpy(dst, src, dnnl_memory_desc_get_size(to));
        return PS_OK;
    }
    dnnl_memory_t a, b;
    PS_DNNL_CHECK(dnnl_memory_create(&a, from, d->eng, src));
    dnnl_status_t st = dnnl_memory_create(&b, to, d->eng, dst);
    if (st != dnnl_success) { dnnl_memory_destroy(a); PS_DNNL_CHECK(st); }
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, a}, {DNNL_ARG_TO, b}};
    use_threads();
    st = dnnl_primitive_execute(r, d->strm, 2, args);
    if (st == dnnl_success) st = dnnl_stream_wait(d->strm);
    dnnl_memory_destroy(a);
    dnnl_memory_destroy(b);
    PS_DNNL_CHECK(st);
    return PS_OK;
}

static const dnnl_memory_desc_t *q(dnnl_primitive_desc_t pd, dnnl_query_t what, int i) {
    return dnnl_primitive_desc_query_md(pd, what, i);
}

static float *falloc(size_t bytes) { return malloc(bytes ? bytes : 1); }

static ps_status lstm_dnnl_init(ps_lstm *l, ps_err *err) {
    lstm_dnnl *d = &l->d;
    const int64_t T = l->s.T, N = l->s.N, I = l->s.I, H = l->s.H;
    PS_DNNL_CHECK(dnnl_engine_create(&d->eng, dnnl_cpu, 0));
    PS_DNNL_CHECK(dnnl_stream_create(&d->strm, d->eng, dnnl_stream_default_flags));
    dnnl_memory_desc_t src, it, wl_any, wi_any, bias, dst;
    dnnl_dims_t dsrc = {T, N, I}, dit = {1, 1, N, H}, dwl = {1, 1, I, 4, H}, dwi = {1, 1, H, 4, H},
                dbias = {1, 1, 4, H}, ddst = {T, N, H};
    ps_status st;
    if ((st = md_tag(&src, 3, dsrc, dnnl_tnc, err)) || (st = md_tag(&it, 4, dit, dnnl_ldnc, err)) ||
        (st = md_tag(&wl_any, 5, dwl, dnnl_format_tag_any, err)) ||
        (st = md_tag(&wi_any, 5, dwi, dnnl_format_tag_any, err)) || (st = md_tag(&bias, 4, dbias, dnnl_ldgo, err)) ||
        (st = md_tag(&dst, 3, ddst, dnnl_tnc, err)) || (st = md_tag(&d->user_wl, 5, dwl, dnnl_ldgoi, err)) ||
        (st = md_tag(&d->user_wi, 5, dwi, dnnl_ldgoi, err)))
        return st;
    dnnl_rnn_desc_t fd, bd;
    PS_DNNL_CHECK(dnnl_lstm_forward_desc_init(&fd, dnnl_forward_training, dnnl_unidirectional_left2right, &src, &it,
                                              &it, &wl_any, &wi_any, &bias, &dst, &it, &it, 0));
    PS_DNNL_CHECK(dnnl_primitive_desc_create(&d->fwd_pd, &fd, NULL, d->eng, NULL));
    PS_DNNL_CHECK(dnnl_lstm_backward_desc_init(&bd, dnnl_backward, dnnl_unidirectional_left2right, &src, &it, &it,
                                               &wl_any, &wi_any, &bias, &dst, &it, &it, &src, &it, &it, &wl_any,
                                               &wi_any, &bias, &dst, &it, &it, 0));
    PS_DNNL_CHECK(dnnl_primitive_desc_create(&d->bwd_pd, &bd, NULL, d->eng, d->fwd_pd));
    PS_DNNL_CHECK(dnnl_primitive_create(&d->fwd, d->fwd_pd));
    PS_DNNL_CHECK(dnnl_primitive_create(&d->bwd, d->bwd_pd));
    const dnnl_memory_desc_t *fwl = q(d->fwd_pd, dnnl_query_weights_md, 0), *fwi = q(d->fwd_pd, dnnl_query_weights_md, 1);
    const dnnl_memory_desc_t *bwl = q(d->bwd_pd, dnnl_query_weights_md, 0), *bwi = q(d->bwd_pd, dnnl_query_weights_md, 1);
    const dnnl_memory_desc_t *gwl = q(d->bwd_pd, dnnl_query_diff_weights_md, 0);
    const dnnl_memory_desc_t *gwi = q(d->bwd_pd, dnnl_query_diff_weights_md, 1);
    const dnnl_memory_desc_t *gb = q(d->bwd_pd, dnnl_query_diff_weights_md, 2);
    const dnnl_memory_desc_t *ws = q(d->fwd_pd, dnnl_query_workspace_md, 0);
    if ((st = mk_reorder(d, &d->user_wl, fwl, &d->r_fwd_wl, err)) ||
        (st = mk_reorder(d, &d->user_wi, fwi, &d->r_fwd_wi, err)) ||
        (st = mk_reorder(d, &d->user_wl, bwl, &d->r_bwd_wl, err)) ||
        (st = mk_reorder(d, &d->user_wi, bwi, &d->r_bwd_wi, err)) ||
        (st = mk_reorder(d, gwl, &d->user_wl, &d->r_dwl, err)) || (st = mk_reorder(d, gwi, &d->user_wi, &d->r_dwi, err)))
        return st;
    if (dnnl_memory_desc_get_size(gb) != (size_t)(4 * H) * sizeof(float) ||
        !dnnl_memory_desc_equal(gb, &bias))
        return ps_err_set(err, PS_ERR_INTERNAL, "lstm: oneDNN picked an unexpected diff_bias layout");
    size_t nh = (size_t)(N * H) * sizeof(float);
    d->wl_f = falloc(dnnl_memory_desc_get_size(fwl));
    d->wi_f = falloc(dnnl_memory_desc_get_size(fwi));
    d->wl_b = falloc(dnnl_memory_desc_get_size(bwl));
    d->wi_b = falloc(dnnl_memory_desc_get_size(bwi));
    d->dwl = falloc(dnnl_memory_desc_get_size(gwl));
    d->dwi = falloc(dnnl_memory_desc_get_size(gwi));
    d->dbias = falloc((size_t)(4 * H) * sizeof(float));
    d->bias = falloc((size_t)(4 * H) * sizeof(float));
    d->ws = falloc(ws ? dnnl_memory_desc_get_size(ws) : 0);
    d->dwl_u = falloc((size_t)(4 * H * I) * sizeof(float));
    d->dwi_u = falloc((size_t)(4 * H * H) * sizeof(float));
    d->y = falloc((size_t)T * nh);
    d->hT = falloc(nh);
    d->cT = falloc(nh);
    d->zero_nh = calloc(1, nh ? nh : 1);
    if (!d->wl_f || !d->wi_f || !d->wl_b || !d->wi_b || !d->dwl || !d->dwi || !d->dbias || !d->bias || !d->ws ||
        !d->dwl_u || !d->dwi_u || !d->y || !d->hT || !d->cT || !d->zero_nh)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "lstm: out of memory");
    return PS_OK;
}

static void lstm_dnnl_fini(ps_lstm *l) {
    lstm_dnnl *d = &l->d;
    dnnl_primitive_t ps[] = {d->fwd, d->bwd, d->r_fwd_wl, d->r_fwd_wi, d->r_bwd_wl, d->r_bwd_wi, d->r_dwl, d->r_dwi};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        if (ps[i]) dnnl_primitive_destroy(ps[i]);
    if (d->fwd_pd) dnnl_primitive_desc_destroy(d->fwd_pd);
    if (d->bwd_pd) dnnl_primitive_desc_destroy(d->bwd_pd);
    if (d->strm) dnnl_stream_destroy(d->strm);
    if (d->eng) dnnl_engine_destroy(d->eng);
    float *fs[] = {d->wl_f, d->wi_f, d->wl_b, d->wi_b, d->dwl, d->dwi, d->dbias, d->bias, d->ws, d->dwl_u, d->dwi_u,
                   d->y, d->hT, d->cT, d->zero_nh};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) free(fs[i]);
}

/* Execute prim with the (arg, desc, pointer) triples; memories made and destroyed around it. */
typedef struct marg { int arg; const dnnl_memory_desc_t *md; void *p; } marg;

static ps_status exec(lstm_dnnl *d, dnnl_primitive_t prim, const marg *a, int n, ps_err *err) {
    dnnl_exec_arg_t args[32];
    dnnl_status_t st = dnnl_success;
    int made = 0;
    for (; made < n && st == dnnl_success; made++) {
        st = dnnl_memory_create(&args[made].memory, a[made].md, d->eng, a[made].p);
        args[made].arg = a[made].arg;
        if (st != dnnl_success) break;
    }
    use_threads();
    if (st == dnnl_success) st = dnnl_primitive_execute(prim, d->strm, n, args);
    if (st == dnnl_success) st = dnnl_stream_wait(d->strm);
    for (int i = 0; i < made; i++) dnnl_memory_destroy(args[i].memory);
    PS_DNNL_CHECK(st);
    return PS_OK;
}

static ps_status lstm_dnnl_forward(ps_lstm *l, const ps_lstm_weights *w, const float *x, const float *h0,
                              const float *c0, float *y, float *hT, float *cT, ps_err *err) {
    lstm_dnnl *d = &l->d;
    const int64_t N = l->s.N, H = l->s.H, T = l->s.T;
    dnnl_primitive_desc_t pd = d->fwd_pd;
    const dnnl_memory_desc_t *fwl = q(pd, dnnl_query_weights_md, 0), *fwi = q(pd, dnnl_query_weights_md, 1);
    ps_status st;
    if ((st = run_reorder(d, d->r_fwd_wl, &d->user_wl, (void *)w->w_ih, fwl, d->wl_f, err)) ||
        (st = run_reorder(d, d->r_fwd_wi, &d->user_wi, (void *)w->w_hh, fwi, d->wi_f, err)))
        return st;
    for (int64_t r = 0; r < 4 * H; r++) d->bias[r] = w->b_ih[r] + w->b_hh[r];
    const dnnl_memory_desc_t *ws = q(pd, dnnl_query_workspace_md, 0);
    marg a[] = {
        {DNNL_ARG_SRC_LAYER, q(pd, dnnl_query_src_md, 0), (void *)x},
        {DNNL_ARG_SRC_ITER, q(pd, dnnl_query_src_md, 1), (void *)(h0 ? h0 : d->zero_nh)},
        {DNNL_ARG_SRC_ITER_C, q(pd, dnnl_query_src_md, 2), (void *)(c0 ? c0 : d->zero_nh)},
        {DNNL_ARG_WEIGHTS_LAYER, fwl, d->wl_f},
        {DNNL_ARG_WEIGHTS_ITER, fwi, d->wi_f},
        {DNNL_ARG_BIAS, q(pd, dnnl_query_weights_md, 2), d->bias},
        {DNNL_ARG_DST_LAYER, q(pd, dnnl_query_dst_md, 0), d->y},
        {DNNL_ARG_DST_ITER, q(pd, dnnl_query_dst_md, 1), d->hT},
        {DNNL_ARG_DST_ITER_C, q(pd, dnnl_query_dst_md, 2), d->cT},
        {DNNL_ARG_WORKSPACE, ws, d->ws},
    };
    if ((st = exec(d, d->fwd, a, ws ? 10 : 9, err))) return st;
    size_t nh = (size_t)(N * H) * sizeof(float);
    memcpy(y, d->y, (size_t)T * nh);
    if (hT) memcpy(hT, d->hT, nh);
    if (cT) memcpy(cT, d->cT, nh);
    return PS_OK;
}

static ps_status lstm_dnnl_backward(ps_lstm *l, const ps_lstm_weights *w, const float *dy, const float *dhT,
                               const float *dcT, float *dx, float *dh0, float *dc0, ps_lstm_grads *g, ps_err *err) {
    lstm_dnnl *d = &l->d;
    const int64_t T = l->s.T, N = l->s.N, I = l->s.I, H = l->s.H;
    dnnl_primitive_desc_t pd = d->bwd_pd;
    const dnnl_memory_desc_t *bwl = q(pd, dnnl_query_weights_md, 0), *bwi = q(pd, dnnl_query_weights_md, 1);
    const dnnl_memory_desc_t *gwl = q(pd, dnnl_query_diff_weights_md, 0), *gwi = q(pd, dnnl_query_diff_weights_md, 1);
    ps_status st;
    if ((st = run_reorder(d, d->r_bwd_wl, &d->user_wl, (void *)w->w_ih, bwl, d->wl_b, err)) ||
        (st = run_reorder(d, d->r_bwd_wi, &d->user_wi, (void *)w->w_hh, bwi, d->wi_b, err)))
        return st;
    for (int64_t r = 0; r < 4 * H; r++) d->bias[r] = w->b_ih[r] + w->b_hh[r];
    /* oneDNN accumulates into the diff weights: start them at zero */
    memset(d->dwl, 0, dnnl_memory_desc_get_size(gwl));
    memset(d->dwi, 0, dnnl_memory_desc_get_size(gwi));
    memset(d->dbias, 0, (size_t)(4 * H) * sizeof(float));
    size_t nh = (size_t)(N * H) * sizeof(float);
    float *dx_buf = dx ? dx : malloc((size_t)(T * N * I) * sizeof(float) + 1);
    float *dh0_buf = dh0 ? dh0 : malloc(nh + 1), *dc0_buf = dc0 ? dc0 : malloc(nh + 1);
    if (!dx_buf || !dh0_buf || !dc0_buf) {
        if (!dx) free(dx_buf);
        if (!dh0) free(dh0_buf);
        if (!dc0) free(dc0_buf);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "lstm: out of memory");
    }
    const dnnl_memory_desc_t *ws = q(pd, dnnl_query_workspace_md, 0);
    marg a[] = {
        {DNNL_ARG_SRC_LAYER, q(pd, dnnl_query_src_md, 0), l->x},
        {DNNL_ARG_SRC_ITER, q(pd, dnnl_query_src_md, 1), l->h},
        {DNNL_ARG_SRC_ITER_C, q(pd, dnnl_query_src_md, 2), l->c},
        {DNNL_ARG_WEIGHTS_LAYER, bwl, d->wl_b},
        {DNNL_ARG_WEIGHTS_ITER, bwi, d->wi_b},
        {DNNL_ARG_BIAS, q(pd, dnnl_query_weights_md, 2), d->bias},
        {DNNL_ARG_DST_LAYER, q(pd, dnnl_query_dst_md, 0), d->y},
        {DNNL_ARG_DST_ITER, q(pd, dnnl_query_dst_md, 1), d->hT},
        {DNNL_ARG_DST_ITER_C, q(pd, dnnl_query_dst_md, 2), d->cT},
        {DNNL_ARG_DIFF_SRC_LAYER, q(pd, dnnl_query_diff_src_md, 0), dx_buf},
        {DNNL_ARG_DIFF_SRC_ITER, q(pd, dnnl_query_diff_src_md, 1), dh0_buf},
        {DNNL_ARG_DIFF_SRC_ITER_C, q(pd, dnnl_query_diff_src_md, 2), dc0_buf},
        {DNNL_ARG_DIFF_WEIGHTS_LAYER, gwl, d->dwl},
        {DNNL_ARG_DIFF_WEIGHTS_ITER, gwi, d->dwi},
        {DNNL_ARG_DIFF_BIAS, q(pd, dnnl_query_diff_weights_md, 2), d->dbias},
        {DNNL_ARG_DIFF_DST_LAYER, q(pd, dnnl_query_diff_dst_md, 0), (void *)dy},
        {DNNL_ARG_DIFF_DST_ITER, q(pd, dnnl_query_diff_dst_md, 1), (void *)(dhT ? dhT : d->zero_nh)},
        {DNNL_ARG_DIFF_DST_ITER_C, q(pd, dnnl_query_diff_dst_md, 2), (void *)(dcT ? dcT : d->zero_nh)},
        {DNNL_ARG_WORKSPACE, ws, d->ws},
    };
    st = exec(d, d->bwd, a, ws ? 19 : 18, err);
    if (!dx) free(dx_buf);
    if (!dh0) free(dh0_buf);
    if (!dc0) free(dc0_buf);
    if (st) return st;
    if ((st = run_reorder(d, d->r_dwl, gwl, d->dwl, &d->user_wl, d->dwl_u, err)) ||
        (st = run_reorder(d, d->r_dwi, gwi, d->dwi, &d->user_wi, d->dwi_u, err)))
        return st;
    for (int64_t i = 0; i < 4 * H * I; i++) g->w_ih[i] += d->dwl_u[i];
    for (int64_t i = 0; i < 4 * H * H; i++) g->w_hh[i] += d->dwi_u[i];
    for (int64_t r = 0; r < 4 * H; r++) {
        g->b_ih[r] += d->dbias[r];
        g->b_hh[r] += d->dbias[r];
    }
    return PS_OK;
}

static const lstm_impl_ops dnnl_ops = {lstm_dnnl_init, lstm_dnnl_fini, lstm_dnnl_forward, lstm_dnnl_backward};

/* ---- the handle ---- */

const char *ps_lstm_impl_name(ps_lstm_impl impl) { return impl == PS_LSTM_DNNL ? "dnnl" : "ref"; }

int ps_lstm_impl_parse(const char *name) {
    if (!strcmp(name, "ref")) return PS_LSTM_REF;
    if (!strcmp(name, "dnnl")) return PS_LSTM_DNNL;
    return -1;
}

ps_status ps_lstm_create(ps_lstm_impl impl, ps_lstm_shape s, ps_lstm **out, ps_err *err) {
    *out = NULL;
    if (s.T < 1 || s.N < 1 || s.I < 1 || s.H < 1 || s.T > (1 << 20) || s.N > (1 << 20) || s.I > (1 << 20) ||
        s.H > (1 << 20))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lstm: bad shape T=%lld N=%lld I=%lld H=%lld",
                          (long long)s.T, (long long)s.N, (long long)s.I, (long long)s.H);
    if (impl != PS_LSTM_REF && impl != PS_LSTM_DNNL)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lstm: unknown implementation %d", (int)impl);
    ps_lstm *l = calloc(1, sizeof *l);
    if (!l) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "lstm: out of memory");
    l->impl = impl;
    l->s = s;
    l->ops = impl == PS_LSTM_DNNL ? &dnnl_ops : &ref_ops;
    size_t nh = (size_t)(s.N * s.H);
    l->x = malloc((size_t)(s.T * s.N * s.I) * sizeof(float));
    l->h = malloc((size_t)(s.T + 1) * nh * sizeof(float));
    l->c = malloc((size_t)(s.T + 1) * nh * sizeof(float));
    ps_status st = l->x && l->h && l->c ? l->ops->init(l, err)
                                        : ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "lstm: out of memory");
    if (st) {
        ps_lstm_free(l);
        return ps_err_prefix(err, "lstm (%s)", ps_lstm_impl_name(impl)), st;
    }
    *out = l;
    return PS_OK;
}

void ps_lstm_free(ps_lstm *l) {
    if (!l) return;
    l->ops->fini(l);
    free(l->x);
    free(l->h);
    free(l->c);
    free(l);
}


ps_status ps_lstm_forward(ps_lstm *l, const ps_lstm_weights *w, const float *x, const float *h0, const float *c0,
                          float *y, float *hT, float *cT, ps_err *err) {
    size_t nh = (size_t)(l->s.N * l->s.H) * sizeof(float);
    memcpy(l->x, x, (size_t)(l->s.T * l->s.N * l->s.I) * sizeof(float));
    if (h0) memcpy(l->h, h0, nh); else memset(l->h, 0, nh);
    if (c0) memcpy(l->c, c0, nh); else memset(l->c, 0, nh);
    l->have_forward = 0;
    ps_status st = l->ops->forward(l, w, l->x, l->h, l->c, y, hT, cT, err);
    if (!st) l->have_forward = 1;
    return st;
}

ps_status ps_lstm_backward(ps_lstm *l, const ps_lstm_weights *w, const float *dy, const float *dhT, const float *dcT,
                           float *dx, float *dh0, float *dc0, ps_lstm_grads *g, ps_err *err) {
    if (!l->have_forward) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lstm: backward without a forward");
    return l->ops->backward(l, w, dy, dhT, dcT, dx, dh0, dc0, g, err);
}
