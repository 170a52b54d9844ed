/* lstm.c - one LSTM layer (lstm.h): the plain C reference and the oneDNN
 * implementation (oneDNN's sgemm and a vectorised cell) behind one handle. */
#include "lstm.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include "backend.h" /* ps_backend_cpu_isa: the ISA oneDNN uses */
#include "dnnl_check.h"

typedef struct lstm_impl_ops {
    ps_status (*init)(ps_lstm *l, ps_err *err);
    void (*fini)(ps_lstm *l);
    ps_status (*forward)(ps_lstm *l, const ps_lstm_weights *w, const float *x, const float *h0, const float *c0,
                         float *y, float *hT, float *cT, ps_err *err);
    ps_status (*backward)(ps_lstm *l, const ps_lstm_weights *w, const float *dy, const float *dhT, const float *dcT,
                          float *dx, float *dh0, float *dc0, ps_lstm_grads *g, ps_err *err);
} lstm_impl_ops;

/* the cell's element-wise forward and backward steps, per ISA (below) */
typedef void (*cell_fwd_fn)(float *, const float *, const float *, float *, float *, float *, int64_t, int64_t);
typedef void (*cell_bwd_fn)(const float *, const float *, const float *, const float *, const float *, float *, float *,
                            float *, int64_t, int64_t);
typedef struct cell_ops { cell_fwd_fn fwd; cell_bwd_fn bwd; } cell_ops;

/* The oneDNN (sgemm) state of a handle. */
typedef struct lstm_dnnl {
    float *tc;          /* (T,N,H) tanh(c_t) of the last forward */
    float *da;          /* (T,N,4H) the gates' gradients of a backward: act's block (da_own 0) or its own */
    int da_own;         /* PS_LSTM_DA_OWN=1: da in a block of its own (for comparison) */
    float *dh, *dc;     /* (N,H) the recurrent gradients */
    float *db;          /* (4H) the bias gradient, summed by the cell's backward */
    float *b;           /* (4H) b_ih + b_hh, which the cell's forward adds */
    float *wp;          /* w_hh packed for rec_fwd_512 (its panels), or NULL: dnnl_sgemm per step */
    cell_ops cell;      /* for oneDNN's ISA */
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
    float *act;  /* (T,N,4H) activated gates */
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
    if (g->set) {
        memset(g->w_ih, 0, (size_t)(G * I) * sizeof(float));
        memset(g->w_hh, 0, (size_t)(G * H) * sizeof(float));
        memset(g->b_ih, 0, (size_t)G * sizeof(float));
        memset(g->b_hh, 0, (size_t)G * sizeof(float));
    }
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

/* ---- oneDNN's sgemm + the cell here ----
 * The GEMMs over the whole window at once where nothing recurrent is in
 * the way: the input projection of all T steps (TN x I . I x 4H) forward,
 * the weight gradients (4H x TN . TN x I and . TN x H) and the input
 * gradient (TN x 4H . 4H x I) backward. Per step only the recurrent
 * product (N x H . H x 4H forward, N x 4H . 4H x H backward) and the
 * cell's element-wise work, one fused pass over the step's gates. The
 * weights are read in PyTorch's layout as they are (no reorders), the
 * gradients accumulate straight into the caller's (beta 1). oneDNN's
 * sgemm follows ONEDNN_MAX_CPU_ISA; the cell is compiled for AVX-512,
 * AVX2 and the baseline and picked by oneDNN's ISA the same way (loss.c
 * does the same for the cross-entropy). oneDNN 2.6's LSTM primitive, used
 * before, is its `ref` RNN implementation, reordered the weights four
 * times a window and took 6-17 % more CPU for a 2-layer window (forward +
 * backward at the LM's sizes, 1 thread, same-run A/B per ISA). */

static int lstm_threads; /* __atomic; ps_lstm_set_threads */

void ps_lstm_set_threads(int n) { __atomic_store_n(&lstm_threads, n > 0 ? n : 0, __ATOMIC_RELAXED); }

static void use_threads(void) {
    int n = __atomic_load_n(&lstm_threads, __ATOMIC_RELAXED);
    if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}

/* exp, sigmoid and tanh in float, branch-free so the loops vectorise:
 * Cephes' expf polynomial (range reduction by ln 2, ~1 ulp) with the
 * argument clamped to [-87, 88] (NaN passes: comparisons with it fail). */
static inline __attribute__((always_inline)) float c_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3333519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    union { int32_t i; float f; } s = {.i = ((int32_t)n + 127) << 23};
    return p * s.f;
}

static inline __attribute__((always_inline)) float c_sigm(float x) { return 1.0f / (1.0f + c_exp(-x)); }

static inline __attribute__((always_inline)) float c_tanh(float x) {
    float t = c_exp(-2.0f * fabsf(x)), r = (1.0f - t) / (1.0f + t);
    return copysignf(r, x);
}

/* One forward step for n rows: a (n, 4H) gate pre-activations without the
 * bias b (4H) -> activated in place; c = f cp + i g, tc = tanh(c), h = o tc. */
static inline __attribute__((always_inline)) void cell_fwd_body(float *a, const float *b, const float *cp, float *c,
                                                                float *tc, float *h, int64_t n, int64_t H) {
    for (int64_t r = 0; r < n; r++) {
        float *ar = a + r * 4 * H;
        const float *cpr = cp + r * H;
        float *cr = c + r * H, *tcr = tc + r * H, *hr = h + r * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            float ig = c_sigm(ar[j] + b[j]), fg = c_sigm(ar[H + j] + b[H + j]), gg = c_tanh(ar[2 * H + j] + b[2 * H + j]),
                  og = c_sigm(ar[3 * H + j] + b[3 * H + j]);
            float cv = fg * cpr[j] + ig * gg, tv = c_tanh(cv);
            ar[j] = ig, ar[H + j] = fg, ar[2 * H + j] = gg, ar[3 * H + j] = og;
            cr[j] = cv, tcr[j] = tv, hr[j] = og * tv;
        }
    }
}

/* One backward step: dh (n, H) the gradient from the next step (in) plus
 * dy; dc (n, H) likewise, replaced by the one for the step before; da
 * (n, 4H) the gates' pre-activation gradients, also added into db (4H, the
 * bias gradient: no pass of its own over the window's da). */
static inline __attribute__((always_inline)) void cell_bwd_body(const float *a, const float *cp, const float *tc,
                                                                const float *dh, const float *dy, float *dc,
                                                                float *da, float *db, int64_t n, int64_t H) {
    for (int64_t r = 0; r < n; r++) {
        const float *ar = a + r * 4 * H, *cpr = cp + r * H, *tcr = tc + r * H, *dhr = dh + r * H, *dyr = dy + r * H;
        float *dcr = dc + r * H, *dar = da + r * 4 * H;
#pragma omp simd
        for (int64_t j = 0; j < H; j++) {
            float ig = ar[j], fg = ar[H + j], gg = ar[2 * H + j], og = ar[3 * H + j], tv = tcr[j];
            float dhv = dhr[j] + dyr[j];
            float dcv = dcr[j] + dhv * og * (1.0f - tv * tv);
            const float d0 = dcv * gg * ig * (1.0f - ig), d1 = dcv * cpr[j] * fg * (1.0f - fg);
            const float d2 = dcv * ig * (1.0f - gg * gg), d3 = dhv * tv * og * (1.0f - og);
            dar[j] = d0, dar[H + j] = d1, dar[2 * H + j] = d2, dar[3 * H + j] = d3;
            db[j] += d0, db[H + j] += d1, db[2 * H + j] += d2, db[3 * H + j] += d3;
            dcr[j] = dcv * fg;
        }
    }
}

static void cell_fwd_base(float *a, const float *b, const float *cp, float *c, float *tc, float *h, int64_t n, int64_t H) {
    cell_fwd_body(a, b, cp, c, tc, h, n, H);
}
static void cell_bwd_base(const float *a, const float *cp, const float *tc, const float *dh, const float *dy,
                          float *dc, float *da, float *db, int64_t n, int64_t H) {
    cell_bwd_body(a, cp, tc, dh, dy, dc, da, db, n, H);
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LSTM_X86 1
__attribute__((target("avx2,fma"))) static void cell_fwd_256(float *a, const float *b, const float *cp, float *c,
                                                             float *tc, float *h, int64_t n, int64_t H) {
    cell_fwd_body(a, b, cp, c, tc, h, n, H);
}
__attribute__((target("avx2,fma"))) static void cell_bwd_256(const float *a, const float *cp, const float *tc,
                                                             const float *dh, const float *dy, float *dc, float *da,
                                                             float *db, int64_t n, int64_t H) {
    cell_bwd_body(a, cp, tc, dh, dy, dc, da, db, n, H);
}
__attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,prefer-vector-width=512"))) static void
cell_fwd_512(float *a, const float *b, const float *cp, float *c, float *tc, float *h, int64_t n, int64_t H) {
    cell_fwd_body(a, b, cp, c, tc, h, n, H);
}
__attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,prefer-vector-width=512"))) static void
cell_bwd_512(const float *a, const float *cp, const float *tc, const float *dh, const float *dy, float *dc, float *da,
             float *db, int64_t n, int64_t H) {
    cell_bwd_body(a, cp, tc, dh, dy, dc, da, db, n, H);
}
#endif

/* The cell for oneDNN's ISA (ONEDNN_MAX_CPU_ISA caps both). */
static cell_ops cell_pick(void) {
    cell_ops o = {cell_fwd_base, cell_bwd_base};
#ifdef LSTM_X86
    const char *isa = ps_backend_cpu_isa();
    __builtin_cpu_init();
    if (isa && !strncmp(isa, "avx512_core", 11) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw"))
        o = (cell_ops){cell_fwd_512, cell_bwd_512};
    else if (isa && (!strncmp(isa, "avx2", 4) || !strncmp(isa, "avx512", 6)) && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma"))
        o = (cell_ops){cell_fwd_256, cell_bwd_256};
#endif
    return o;
}

/* ---- the forward's recurrent product at AVX-512 ----
 * a (N, 4H) += h (N, H) . w_hh^T, once per step: oneDNN 2.6's sgemm runs
 * this small product (20 x 200 . 200 x 800 at the LM's sizes) at ~57 % of
 * one core's AVX-512 peak, repacking w_hh on every call. Here w_hh is
 * packed once per window into panels of REC_PW columns of the gates, k-major
 * (wp[panel][k][j] = w_hh[panel * REC_PW + j][k], zeros past 4H), and a
 * register-blocked kernel keeps REC_RB rows x REC_PW columns of a in 21
 * zmm accumulators over all of k. One thread, as the trainer runs the
 * LSTM. PS_LSTM_RECURRENT=dnnl keeps dnnl_sgemm (for comparison). */
#define REC_NV 3                 /* zmm per row of a panel */
#define REC_PW (16 * REC_NV)     /* a panel's columns */
#define REC_RB 7                 /* rows of a per kernel call */

static int64_t rec_panels(int64_t G) { return (G + REC_PW - 1) / REC_PW; }

#ifdef LSTM_X86
#include <immintrin.h>
#define AVX512_TARGET __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))

/* R rows of a (lda) += the rows of h (ldh) . panel p (H x REC_PW), the
 * panel's columns past 4H masked off */
static inline __attribute__((always_inline)) AVX512_TARGET void rec_kern(int R, const float *h, int64_t ldh,
                                                                          const float *p, int64_t H, float *a,
                                                                          int64_t lda, const __mmask16 *m) {
    __m512 c[REC_RB][REC_NV];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = 0; v < REC_NV; v++) c[i][v] = _mm512_maskz_loadu_ps(m[v], a + i * lda + 16 * v);
    for (int64_t k = 0; k < H; k++) {
        __m512 w[REC_NV];
#pragma GCC unroll 4
        for (int v = 0; v < REC_NV; v++) w[v] = _mm512_load_ps(p + k * REC_PW + 16 * v);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 b = _mm512_set1_ps(h[i * ldh + k]);
#pragma GCC unroll 4
            for (int v = 0; v < REC_NV; v++) c[i][v] = _mm512_fmadd_ps(b, w[v], c[i][v]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 4
        for (int v = 0; v < REC_NV; v++) _mm512_mask_storeu_ps(a + i * lda + 16 * v, m[v], c[i][v]);
}

#define REC_KERN(R)                                                                                             \
    static AVX512_TARGET void rec_kern##R(const float *h, int64_t ldh, const float *p, int64_t H, float *a,    \
                                          int64_t lda, const __mmask16 *m) {                                   \
        rec_kern(R, h, ldh, p, H, a, lda, m);                                                                  \
    }
REC_KERN(1) REC_KERN(2) REC_KERN(3) REC_KERN(4) REC_KERN(5) REC_KERN(6) REC_KERN(7)
typedef void (*rec_kern_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t, const __mmask16 *);
static const rec_kern_fn rec_kerns[REC_RB + 1] = {NULL,        rec_kern1, rec_kern2, rec_kern3,
                                                  rec_kern4,   rec_kern5, rec_kern6, rec_kern7};

/* a (N, G) += h (N, H) . w_hh^T with w_hh packed in wp (rec_pack) */
static AVX512_TARGET void rec_fwd_512(int64_t N, int64_t G, int64_t H, const float *h, const float *wp, float *a) {
    for (int64_t p = 0; p < rec_panels(G); p++) {
        __mmask16 m[REC_NV];
        for (int v = 0; v < REC_NV; v++) {
            int64_t left = G - p * REC_PW - 16 * v;
            m[v] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
        }
        for (int64_t r = 0; r < N; r += REC_RB) {
            int R = N - r < REC_RB ? (int)(N - r) : REC_RB;
            rec_kerns[R](h + r * H, H, wp + p * REC_PW * H, H, a + r * G + p * REC_PW, G, m);
        }
    }
}
#endif

/* w_hh (G, H) into rec_fwd_512's panels */
static void rec_pack(const float *w_hh, int64_t G, int64_t H, float *wp) {
    for (int64_t p = 0; p < rec_panels(G); p++)
        for (int64_t k = 0; k < H; k++)
            for (int64_t j = 0; j < REC_PW; j++) {
                int64_t g = p * REC_PW + j;
                wp[(p * H + k) * REC_PW + j] = g < G ? w_hh[g * H + k] : 0.0f;
            }
}

static ps_status sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                       const float *B, int64_t ldb, float beta, float *C, int64_t ldc, ps_err *err) {
    PS_DNNL_CHECK(dnnl_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc));
    return PS_OK;
}

static ps_status lstm_dnnl_init(ps_lstm *l, ps_err *err) {
    size_t T = (size_t)l->s.T, N = (size_t)l->s.N, H = (size_t)l->s.H;
    l->act = malloc(T * N * 4 * H * sizeof(float));
    l->d.tc = malloc(T * N * H * sizeof(float));
    const char *dao = getenv("PS_LSTM_DA_OWN");
    l->d.da_own = dao && !strcmp(dao, "1");
    l->d.da = l->d.da_own ? malloc(T * N * 4 * H * sizeof(float)) : l->act;
    l->d.dh = malloc(N * H * sizeof(float));
    l->d.dc = malloc(N * H * sizeof(float));
    l->d.db = malloc(4 * H * sizeof(float));
    l->d.b = malloc(4 * H * sizeof(float));
    l->d.cell = cell_pick();
#ifdef LSTM_X86
    const char *rec = getenv("PS_LSTM_RECURRENT");
    if (l->d.cell.fwd == cell_fwd_512 && !(rec && !strcmp(rec, "dnnl")) &&
        !(l->d.wp = aligned_alloc(64, (size_t)(rec_panels(4 * l->s.H) * REC_PW * l->s.H) * sizeof(float))))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "lstm: out of memory");
#endif
    if (!l->act || !l->d.tc || !l->d.da || !l->d.dh || !l->d.dc || !l->d.db || !l->d.b)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "lstm: out of memory");
    return PS_OK;
}

static void lstm_dnnl_fini(ps_lstm *l) {
    free(l->act);
    free(l->d.tc);
    if (l->d.da_own) free(l->d.da);
    free(l->d.dh);
    free(l->d.dc);
    free(l->d.db);
    free(l->d.b);
    free(l->d.wp);
}

static ps_status lstm_dnnl_forward(ps_lstm *l, const ps_lstm_weights *w, const float *x, const float *h0,
                                   const float *c0, float *y, float *hT, float *cT, ps_err *err) {
    (void)h0, (void)c0; /* the tape's first rows (ps_lstm_forward copied them) */
    const int64_t T = l->s.T, N = l->s.N, I = l->s.I, H = l->s.H, G = 4 * H;
    ps_status st;
    use_threads();
    /* every step's input projection in one GEMM; the cell adds both biases */
    for (int64_t q = 0; q < G; q++) l->d.b[q] = w->b_ih[q] + w->b_hh[q];
    if ((st = sgemm('N', 'T', T * N, G, I, x, I, w->w_ih, I, 0.0f, l->act, G, err))) return st;
    if (l->d.wp) rec_pack(w->w_hh, G, H, l->d.wp);
    for (int64_t t = 0; t < T; t++) {
        float *a = l->act + t * N * G;
        const float *hp = l->h + t * N * H, *cp = l->c + t * N * H;
#ifdef LSTM_X86
        if (l->d.wp) rec_fwd_512(N, G, H, hp, l->d.wp, a);
        else
#endif
        if ((st = sgemm('N', 'T', N, G, H, hp, H, w->w_hh, H, 1.0f, a, G, err))) return st;
        l->d.cell.fwd(a, l->d.b, cp, l->c + (t + 1) * N * H, l->d.tc + t * N * H, l->h + (t + 1) * N * H, N, H);
    }
    size_t nh = (size_t)(N * H) * sizeof(float);
    memcpy(y, l->h + N * H, (size_t)T * nh);
    if (hT) memcpy(hT, l->h + T * N * H, nh);
    if (cT) memcpy(cT, l->c + T * N * H, nh);
    return PS_OK;
}

static ps_status lstm_dnnl_backward(ps_lstm *l, const ps_lstm_weights *w, const float *dy, const float *dhT,
                                    const float *dcT, float *dx, float *dh0, float *dc0, ps_lstm_grads *g,
                                    ps_err *err) {
    const int64_t T = l->s.T, N = l->s.N, I = l->s.I, H = l->s.H, G = 4 * H;
    lstm_dnnl *d = &l->d;
    size_t nh = (size_t)(N * H) * sizeof(float);
    ps_status st;
    use_threads();
    if (dhT) memcpy(d->dh, dhT, nh); else memset(d->dh, 0, nh);
    if (dcT) memcpy(d->dc, dcT, nh); else memset(d->dc, 0, nh);
    memset(d->db, 0, (size_t)G * sizeof(float));
    /* da is the forward's act (unless PS_LSTM_DA_OWN=1): each step's cell
     * reads its activated gates and writes their gradients in their place,
     * so the backward streams one (T,N,4H) block instead of two (-4 % of a
     * window's backward) */
    for (int64_t t = T - 1; t >= 0; t--) {
        float *da = d->da + t * N * G;
        d->cell.bwd(l->act + t * N * G, l->c + t * N * H, d->tc + t * N * H, d->dh, dy + t * N * H, d->dc, da, d->db,
                    N, H);
        if ((t > 0 || dh0) && (st = sgemm('N', 'N', N, H, G, da, G, w->w_hh, H, 0.0f, d->dh, H, err))) return st;
    }
    if (dh0) memcpy(dh0, d->dh, nh);
    if (dc0) memcpy(dc0, d->dc, nh);
    /* the weights' gradients over the whole window: dA^T x and dA^T h_{t-1} */
    const float beta = g->set ? 0.0f : 1.0f;
    if ((st = sgemm('T', 'N', G, I, T * N, d->da, G, l->x, I, beta, g->w_ih, I, err)) ||
        (st = sgemm('T', 'N', G, H, T * N, d->da, G, l->h, H, beta, g->w_hh, H, err)))
        return st;
    if (dx && (st = sgemm('N', 'N', T * N, I, G, d->da, G, w->w_ih, I, 0.0f, dx, I, err))) return st;
    for (int64_t q = 0; q < G; q++) {
        g->b_ih[q] = g->set ? d->db[q] : g->b_ih[q] + d->db[q];
        g->b_hh[q] = g->set ? d->db[q] : g->b_hh[q] + d->db[q];
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
    /* one backward per forward: oneDNN's writes the gates' gradients over
     * the forward's activated gates (lstm_dnnl_backward) */
    l->have_forward = 0;
    return l->ops->backward(l, w, dy, dhT, dcT, dx, dh0, dc0, g, err);
}
