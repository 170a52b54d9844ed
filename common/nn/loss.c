/* loss.c - the mean cross-entropy of logits against class ids (loss.h).
 *
 * One row at a time: the row's max, then e_v = exp(z_v - max) written
 * straight into the gradient (which may be the logits themselves) while
 * summing them, then one scaling pass, g_v = e_v / (sum n), and the
 * target's -1/n. Three passes over a row that stays in cache, one exp per
 * logit. exp is a float polynomial (Cephes expf: range reduction by ln 2,
 * degree-6 polynomial, ~1 ulp), vectorised with AVX-512, AVX2 or SSE4.1
 * where the CPU and oneDNN's ISA (ps_backend_cpu_isa, so
 * ONEDNN_MAX_CPU_ISA caps it too) allow, scalar otherwise; every path
 * computes the same polynomial - the AVX-512, AVX2 and scalar ones with the
 * same fused multiply-adds, so they differ only in the order a row's sum
 * is added up; SSE4.1 has no FMA and rounds each step. Each row's
 * log-sum-exp and the loss are accumulated in double. Arguments below
 * -87 are clamped there (exp(-87) ~ 1.6e-38, nothing next to the max's
 * 1); NaN and +inf logits still make the loss NaN, as before. */
#include "loss.h"

#include <math.h>
#include <string.h>

#include "backend.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PS_CE_X86 1
#include <immintrin.h>
#endif

#define EXP_LO (-87.0f)
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3333519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f

static inline float exp_poly(float x) {
    x = x < EXP_LO ? EXP_LO : x; /* NaN passes */
    float n = nearbyintf(x * LOG2E);
    float r = fmaf(n, -LN2_HI, x);
    r = fmaf(n, -LN2_LO, r);
    float p = P0;
    p = fmaf(p, r, P1);
    p = fmaf(p, r, P2);
    p = fmaf(p, r, P3);
    p = fmaf(p, r, P4);
    p = fmaf(p, r, P5);
    p = fmaf(p, r * r, r) + 1.0f;
    if (isnan(x)) return x;
    int32_t bits = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    return p * s;
}

/* max of z[0..k); e_v = exp(z_v - mx) into g (may alias z), their sum */
static float row_max_scalar(const float *z, int64_t k) {
    float mx = z[0];
    for (int64_t v = 1; v < k; v++) mx = z[v] > mx ? z[v] : mx;
    return mx;
}

static double row_exp_scalar(const float *z, int64_t k, float mx, float *g) {
    double s = 0;
    for (int64_t v = 0; v < k; v++) {
        float e = exp_poly(z[v] - mx);
        if (g) g[v] = e;
        s += e;
    }
    return s;
}

static void row_scale_scalar(float *g, int64_t k, float c) {
    for (int64_t v = 0; v < k; v++) g[v] *= c;
}

#ifdef PS_CE_X86
__attribute__((target("avx512f"))) static float row_max_512(const float *z, int64_t k) {
    __m512 m = _mm512_set1_ps(z[0]);
    int64_t v = 0;
    for (; v + 16 <= k; v += 16) m = _mm512_max_ps(_mm512_loadu_ps(z + v), m);
    float mx = _mm512_reduce_max_ps(m);
    for (; v < k; v++) mx = z[v] > mx ? z[v] : mx;
    return mx;
}

__attribute__((target("avx512f"))) static inline __m512 exp_512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(EXP_LO), x); /* NaN passes (the second operand) */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    __m512 p = _mm512_set1_ps(P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(P5));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mask_mov_ps(_mm512_mul_ps(p, _mm512_castsi512_ps(e)), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

/* float lanes over chunks of CHUNK logits, each chunk's sum added in double */
#define CHUNK 1024

__attribute__((target("avx512f"))) static double row_exp_512(const float *z, int64_t k, float mx, float *g) {
    __m512 m = _mm512_set1_ps(mx);
    double sum = 0;
    int64_t v = 0;
    while (v < k) {
        int64_t end = k - v > CHUNK ? v + CHUNK : k;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
        for (; v + 32 <= end; v += 32) {
            __m512 e0 = exp_512(_mm512_sub_ps(_mm512_loadu_ps(z + v), m));
            __m512 e1 = exp_512(_mm512_sub_ps(_mm512_loadu_ps(z + v + 16), m));
            if (g) _mm512_storeu_ps(g + v, e0), _mm512_storeu_ps(g + v + 16, e1);
            s0 = _mm512_add_ps(s0, e0);
            s1 = _mm512_add_ps(s1, e1);
        }
        for (; v < end; v += 16) {
            __mmask16 mk = end - v >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (end - v)) - 1);
            __m512 e = exp_512(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, z + v), m));
            e = _mm512_maskz_mov_ps(mk, e);
            if (g) _mm512_mask_storeu_ps(g + v, mk, e);
            s0 = _mm512_add_ps(s0, e);
        }
        v = end;
        sum += _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
    return sum;
}

__attribute__((target("avx512f"))) static void row_scale_512(float *g, int64_t k, float c) {
    __m512 cc = _mm512_set1_ps(c);
    int64_t v = 0;
    for (; v + 16 <= k; v += 16) _mm512_storeu_ps(g + v, _mm512_mul_ps(_mm512_loadu_ps(g + v), cc));
    for (; v < k; v++) g[v] *= c;
}

__attribute__((target("avx2,fma"))) static float row_max_256(const float *z, int64_t k) {
    __m256 m = _mm256_set1_ps(z[0]);
    int64_t v = 0;
    for (; v + 8 <= k; v += 8) m = _mm256_max_ps(_mm256_loadu_ps(z + v), m);
    float t[8], mx;
    _mm256_storeu_ps(t, m);
    mx = t[0];
    for (int i = 1; i < 8; i++) mx = t[i] > mx ? t[i] : mx;
    for (; v < k; v++) mx = z[v] > mx ? z[v] : mx;
    return mx;
}

__attribute__((target("avx2,fma"))) static inline __m256 exp_256(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    __m256 p = _mm256_set1_ps(P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(P5));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_blendv_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

__attribute__((target("avx2,fma"))) static double row_exp_256(const float *z, int64_t k, float mx, float *g) {
    __m256 m = _mm256_set1_ps(mx);
    double sum = 0;
    int64_t v = 0;
    while (k - v >= 16) {
        int64_t end = v + (k - v > CHUNK ? CHUNK : (k - v) / 16 * 16);
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
        for (; v < end; v += 16) {
            __m256 e0 = exp_256(_mm256_sub_ps(_mm256_loadu_ps(z + v), m));
            __m256 e1 = exp_256(_mm256_sub_ps(_mm256_loadu_ps(z + v + 8), m));
            if (g) _mm256_storeu_ps(g + v, e0), _mm256_storeu_ps(g + v + 8, e1);
            s0 = _mm256_add_ps(s0, e0);
            s1 = _mm256_add_ps(s1, e1);
        }
        float t[8], s = 0;
        _mm256_storeu_ps(t, _mm256_add_ps(s0, s1));
        for (int i = 0; i < 8; i++) s += t[i];
        sum += s;
    }
    return sum + row_exp_scalar(z + v, k - v, mx, g ? g + v : NULL);
}

__attribute__((target("avx2,fma"))) static void row_scale_256(float *g, int64_t k, float c) {
    __m256 cc = _mm256_set1_ps(c);
    int64_t v = 0;
    for (; v + 8 <= k; v += 8) _mm256_storeu_ps(g + v, _mm256_mul_ps(_mm256_loadu_ps(g + v), cc));
    for (; v < k; v++) g[v] *= c;
}

/* SSE4.1 (oneDNN's sse41, and CPUs with AVX but not AVX2): 4 lanes and no
 * FMA instruction, so the polynomial's steps are a multiply and an add
 * (within an ulp or two of the fused paths). The scalar path would call
 * libm's fmaf for every step instead: a third of psd's time in the LM's
 * fused mode at SSE4.1. */
__attribute__((target("sse4.1"))) static float row_max_128(const float *z, int64_t k) {
    __m128 m = _mm_set1_ps(z[0]);
    int64_t v = 0;
    for (; v + 4 <= k; v += 4) m = _mm_max_ps(_mm_loadu_ps(z + v), m);
    float t[4], mx;
    _mm_storeu_ps(t, m);
    mx = t[0];
    for (int i = 1; i < 4; i++) mx = t[i] > mx ? t[i] : mx;
    for (; v < k; v++) mx = z[v] > mx ? z[v] : mx;
    return mx;
}

__attribute__((target("sse4.1"))) static inline __m128 exp_128(__m128 x) {
    x = _mm_max_ps(_mm_set1_ps(EXP_LO), x); /* NaN passes (the second operand) */
    __m128 n = _mm_round_ps(_mm_mul_ps(x, _mm_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m128 r = _mm_add_ps(_mm_mul_ps(n, _mm_set1_ps(-LN2_HI)), x);
    r = _mm_add_ps(_mm_mul_ps(n, _mm_set1_ps(-LN2_LO)), r);
    __m128 p = _mm_set1_ps(P0);
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(P1));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(P2));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(P3));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(P4));
    p = _mm_add_ps(_mm_mul_ps(p, r), _mm_set1_ps(P5));
    p = _mm_add_ps(_mm_add_ps(_mm_mul_ps(p, _mm_mul_ps(r, r)), r), _mm_set1_ps(1.0f));
    __m128i e = _mm_slli_epi32(_mm_add_epi32(_mm_cvtps_epi32(n), _mm_set1_epi32(127)), 23);
    return _mm_blendv_ps(_mm_mul_ps(p, _mm_castsi128_ps(e)), x, _mm_cmpunord_ps(x, x));
}

__attribute__((target("sse4.1"))) static double row_exp_128(const float *z, int64_t k, float mx, float *g) {
    __m128 m = _mm_set1_ps(mx);
    double sum = 0;
    int64_t v = 0;
    while (k - v >= 8) {
        int64_t end = v + (k - v > CHUNK ? CHUNK : (k - v) / 8 * 8);
        __m128 s0 = _mm_setzero_ps(), s1 = _mm_setzero_ps();
        for (; v < end; v += 8) {
            __m128 e0 = exp_128(_mm_sub_ps(_mm_loadu_ps(z + v), m));
            __m128 e1 = exp_128(_mm_sub_ps(_mm_loadu_ps(z + v + 4), m));
            if (g) _mm_storeu_ps(g + v, e0), _mm_storeu_ps(g + v + 4, e1);
            s0 = _mm_add_ps(s0, e0);
            s1 = _mm_add_ps(s1, e1);
        }
        float t[4];
        _mm_storeu_ps(t, _mm_add_ps(s0, s1));
        sum += (double)(t[0] + t[1] + t[2] + t[3]);
    }
    for (; v < k; v++) {   /* the tail in lanes too: the scalar exp would call fmaf */
        float e = _mm_cvtss_f32(exp_128(_mm_set_ss(z[v] - mx)));
        if (g) g[v] = e;
        sum += e;
    }
    return sum;
}

__attribute__((target("sse4.1"))) static void row_scale_128(float *g, int64_t k, float c) {
    __m128 cc = _mm_set1_ps(c);
    int64_t v = 0;
    for (; v + 4 <= k; v += 4) _mm_storeu_ps(g + v, _mm_mul_ps(_mm_loadu_ps(g + v), cc));
    for (; v < k; v++) g[v] *= c;
}
#endif

/* sum of squares, in double lanes (each float converted exactly) */
static double sumsq_scalar(const float *x, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

#ifdef PS_CE_X86
__attribute__((target("avx512f"))) static double sumsq_512(const float *x, int64_t n) {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd(), a2 = _mm512_setzero_pd(), a3 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512d v0 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), v1 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        __m512d v2 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16)), v3 = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
        a0 = _mm512_fmadd_pd(v0, v0, a0);
        a1 = _mm512_fmadd_pd(v1, v1, a1);
        a2 = _mm512_fmadd_pd(v2, v2, a2);
        a3 = _mm512_fmadd_pd(v3, v3, a3);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3))) +
           sumsq_scalar(x + i, n - i);
}

__attribute__((target("avx2,fma"))) static double sumsq_256(const float *x, int64_t n) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd(), a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256d v0 = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), v1 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        __m256d v2 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 8)), v3 = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 12));
        a0 = _mm256_fmadd_pd(v0, v0, a0);
        a1 = _mm256_fmadd_pd(v1, v1, a1);
        a2 = _mm256_fmadd_pd(v2, v2, a2);
        a3 = _mm256_fmadd_pd(v3, v3, a3);
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
    return t[0] + t[1] + t[2] + t[3] + sumsq_scalar(x + i, n - i);
}

/* each float's square is exact in double, so a multiply and an add */
__attribute__((target("sse4.1"))) static double sumsq_128(const float *x, int64_t n) {
    __m128d a0 = _mm_setzero_pd(), a1 = _mm_setzero_pd(), a2 = _mm_setzero_pd(), a3 = _mm_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128 lo = _mm_loadu_ps(x + i), hi = _mm_loadu_ps(x + i + 4);
        __m128d v0 = _mm_cvtps_pd(lo), v1 = _mm_cvtps_pd(_mm_movehl_ps(lo, lo));
        __m128d v2 = _mm_cvtps_pd(hi), v3 = _mm_cvtps_pd(_mm_movehl_ps(hi, hi));
        a0 = _mm_add_pd(_mm_mul_pd(v0, v0), a0);
        a1 = _mm_add_pd(_mm_mul_pd(v1, v1), a1);
        a2 = _mm_add_pd(_mm_mul_pd(v2, v2), a2);
        a3 = _mm_add_pd(_mm_mul_pd(v3, v3), a3);
    }
    double t[2];
    _mm_storeu_pd(t, _mm_add_pd(_mm_add_pd(a0, a1), _mm_add_pd(a2, a3)));
    return t[0] + t[1] + sumsq_scalar(x + i, n - i);
}
#endif

typedef struct ce_ops {
    float (*max)(const float *, int64_t);
    double (*exp_sum)(const float *, int64_t, float, float *);
    void (*scale)(float *, int64_t, float);
    double (*sumsq)(const float *, int64_t);
} ce_ops;

static const ce_ops ce_scalar = {row_max_scalar, row_exp_scalar, row_scale_scalar, sumsq_scalar};
#ifdef PS_CE_X86
static const ce_ops ce_512 = {row_max_512, row_exp_512, row_scale_512, sumsq_512};
static const ce_ops ce_256 = {row_max_256, row_exp_256, row_scale_256, sumsq_256};
static const ce_ops ce_128 = {row_max_128, row_exp_128, row_scale_128, sumsq_128};
#endif

static const ce_ops *ce_pick(void) {
    static const ce_ops *ops;
    const ce_ops *o = __atomic_load_n(&ops, __ATOMIC_ACQUIRE);
    if (o) return o;
    o = &ce_scalar;
#ifdef PS_CE_X86
    const char *isa = ps_backend_cpu_isa();
    __builtin_cpu_init();
    if (isa && !strncmp(isa, "avx512_core", 11) && __builtin_cpu_supports("avx512f")) o = &ce_512;
    else if (isa && (!strncmp(isa, "avx2", 4) || !strncmp(isa, "avx512", 6)) && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("fma"))
        o = &ce_256;
    else if (isa && __builtin_cpu_supports("sse4.1"))
        o = &ce_128;
#endif
    __atomic_store_n(&ops, o, __ATOMIC_RELEASE);
    return o;
}

static double ce_run(const ce_ops *o, const float *logits, const int64_t *tgt, int64_t n, int64_t k, float *grad) {
    double loss = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *z = logits + i * k;
        float *g = grad ? grad + i * k : NULL;
        float zt = z[tgt[i]]; /* before g (perhaps z itself) is written */
        float mx = o->max(z, k);
        double s = o->exp_sum(z, k, mx, g);
        loss += (double)mx + log(s) - zt;
        if (g) {
            o->scale(g, k, (float)(1.0 / (s * (double)n)));
            g[tgt[i]] -= 1.0f / (float)n;
        }
    }
    return loss / (double)n;
}

double ps_cross_entropy(const float *logits, const int64_t *tgt, int64_t n, int64_t k, float *grad) {
    return ce_run(ce_pick(), logits, tgt, n, k, grad);
}

double ps_sum_squares(const float *x, int64_t n) {
    if (n <= 0) return 0;  /* x may be NULL then (a parameter without row gradients) */
    return ce_pick()->sumsq(x, n);
}

int ps_cross_entropy_width(int width, const float *logits, const int64_t *tgt, int64_t n, int64_t k, float *grad,
                           double *loss) {
    const ce_ops *o = &ce_scalar;
#ifdef PS_CE_X86
    __builtin_cpu_init();
    if (width == 512 && __builtin_cpu_supports("avx512f")) o = &ce_512;
    else if (width == 256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) o = &ce_256;
    else if (width == 128 && __builtin_cpu_supports("sse4.1")) o = &ce_128;
#endif
    if (width != 0 && o == &ce_scalar) return 0;
    *loss = ce_run(o, logits, tgt, n, k, grad);
    return 1;
}
