/* test_optim - common/nn/optim.c on every CPU backend against PyTorch 1.13
 * (tests/golden/optim_steps.safetensors, written by
 * scripts/gen_golden_optim.py):
 *  - torch.optim.Adam with weight decay and non-default betas/eps (two
 *    parameters, 4 steps), Adam's defaults with tiny gradients (eps
 *    matters), torch.optim.SGD with momentum and weight decay - weights and
 *    every state buffer after every step, within atol + rtol (the ops round
 *    differently from PyTorch's vectorised kernels, e.g. fused multiply-adds);
 *  - row-sparse steps: torch.optim.SparseAdam (lazy: untouched rows and their
 *    moments stay bit for bit) and plain SGD with sparse gradients;
 *  - an independent check of Adam's first step: |dw| = lr where |g| >> eps;
 *  - sparse plain SGD equals the dense update with zero rows, bit for bit;
 *  - the kind table, parsing, state names, and every refusal (bad kind,
 *    ranges, sparse with momentum or weight decay, repeated or out-of-range
 *    rows), with nothing changed on refusal.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "config.h"
#include "optim.h"
#include "safetensors.h"

#define NAME "test_optim"
#define GOLDEN "tests/golden/optim_steps.safetensors"

/* Tolerances against PyTorch: weights are O(1); Adam's update divides by
 * sqrt(v), so a last-bit difference in v shows as ~1e-7 relative in the
 * step. */
#define W_ATOL 2e-6
#define W_RTOL 1e-5
#define S_RTOL 1e-5

static const ps_st_tensor *need(const ps_st_file *g, const char *name) {
    const ps_st_tensor *t = ps_st_find(g, name);
    CHECK_MSG(t != NULL, "golden tensor %s missing", name);
    return t;
}

static double meta_num(const ps_st_file *g, const char *key) {
    const char *v = ps_st_metadata(g, key);
    CHECK_MSG(v != NULL, "golden metadata %s missing", key);
    return v ? strtod(v, NULL) : NAN;
}

static ps_optim_spec case_spec(const ps_st_file *g, const char *c) {
    char k[64];
    ps_optim_spec s;
    snprintf(k, sizeof k, "%sclass", c);
    const char *cls = ps_st_metadata(g, k);
    ps_optim_spec_default(cls && strstr(cls, "Adam") ? PS_OPTIM_ADAM : PS_OPTIM_SGD, &s);
#define GET(f) snprintf(k, sizeof k, "%s" #f, c); if (ps_st_metadata(g, k)) s.f = meta_num(g, k)
    GET(lr); GET(momentum); GET(weight_decay); GET(beta1); GET(beta2); GET(eps);
#undef GET
    return s;
}

static float *dev_from(ps_backend *b, const void *host, int64_t n) {
    float *d = ps_backend_alloc_floats(b, n ? n : 1);
    PS_ASSERT(d);
    ps_err e = { 0 };
    if (host) PS_ASSERT(b->ops->copy_to_device(b->impl, d, host, (size_t)n * sizeof(float), &e) == PS_OK);
    return d;
}

static float *dev_zeros(ps_backend *b, int64_t n) {
    float *z = calloc((size_t)n, sizeof *z), *d = dev_from(b, z, n);
    free(z);
    return d;
}

static float *host_of(ps_backend *b, const float *d, int64_t n) {
    float *h = malloc((size_t)n * sizeof *h);
    ps_err e = { 0 };
    PS_ASSERT(h && b->ops->copy_to_host(b->impl, h, d, (size_t)n * sizeof *h, &e) == PS_OK);
    return h;
}

static void check_dev(ps_backend *b, const char *what, const float *dev, const ps_st_tensor *want, double atol,
                      double rtol) {
    if (!want) return;
    const int64_t n = ps_st_numel(want);
    float *h = host_of(b, dev, n);
    check_array(what, h, want->data, (size_t)n, atol, rtol);
    free(h);
}

/* Largest |x| of a golden tensor, for state tolerances. */
static double max_abs(const ps_st_tensor *t) {
    double m = 0;
    for (int64_t i = 0; t && i < ps_st_numel(t); i++) m = fmax(m, fabs(((const float *)t->data)[i]));
    return m;
}

/* A dense case: every parameter, every step, weights and state. */
static void run_dense(ps_backend *b, const ps_st_file *g, const char *c, const char *const *params, int np,
                      int steps) {
    const ps_optim_spec s = case_spec(g, c);
    ps_err e = { 0 };
    CHECK_MSG(ps_optim_check(&s, 0, &e) == PS_OK, "%s", e.msg);
    const int ns = ps_optim_num_state(&s);
    for (int p = 0; p < np; p++) {
        char name[128], what[256];
        snprintf(name, sizeof name, "%sinit.%s", c, params[p]);
        const ps_st_tensor *init = need(g, name);
        if (!init) continue;
        const int64_t n = ps_st_numel(init);
        float *w = dev_from(b, init->data, n);
        ps_optim_state st = { { NULL }, 0 };
        for (int j = 0; j < ns; j++) st.buf[j] = dev_zeros(b, n);
        for (int k = 1; k <= steps; k++) {
            snprintf(name, sizeof name, "%sstep%d.grad.%s", c, k, params[p]);
            const ps_st_tensor *gt = need(g, name);
            if (!gt) break;
            float *gd = dev_from(b, gt->data, n);
            ps_status rc = ps_optim_step(b, &s, n, w, gd, &st, &e);
            CHECK_MSG(rc == PS_OK, "%s %s step %d: %s", b->label, c, k, e.msg);
            CHECK(st.step == k);
            ps_backend_release(b, gd);
            snprintf(name, sizeof name, "%sstep%d.%s", c, k, params[p]);
            snprintf(what, sizeof what, "%s %s", b->label, name);
            check_dev(b, what, w, need(g, name), W_ATOL, W_RTOL);
            for (int j = 0; j < ns; j++) {
                snprintf(name, sizeof name, "%sstep%d.%s.%s", c, k, ps_optim_state_name(s.kind, j), params[p]);
                const ps_st_tensor *want = need(g, name);
                snprintf(what, sizeof what, "%s %s", b->label, name);
                check_dev(b, what, st.buf[j], want, 1e-6 * max_abs(want), S_RTOL);
            }
        }
        ps_backend_release(b, w);
        for (int j = 0; j < ns; j++) ps_backend_release(b, st.buf[j]);
    }
}

/* A row-sparse case on "emb": weights and state after every step; rows
 * never touched so far keep their initial weights (and zero state). */
static void run_sparse(ps_backend *b, const ps_st_file *g, const char *c, int steps) {
    const ps_optim_spec s = case_spec(g, c);
    ps_err e = { 0 };
    CHECK_MSG(ps_optim_check(&s, 1, &e) == PS_OK, "%s", e.msg);
    char name[128], what[256];
    snprintf(name, sizeof name, "%sinit.emb", c);
    const ps_st_tensor *init = need(g, name);
    if (!init) return;
    const int64_t total = init->dims[0], width = init->dims[1], n = total * width;
    const int ns = ps_optim_num_state(&s);
    float *w = dev_from(b, init->data, n);
    ps_optim_state st = { { NULL }, 0 };
    for (int j = 0; j < ns; j++) st.buf[j] = dev_zeros(b, n);
    unsigned char touched[64] = { 0 };
    PS_ASSERT(total <= 64);
    for (int k = 1; k <= steps; k++) {
        snprintf(name, sizeof name, "%sstep%d.rows", c, k);
        const ps_st_tensor *rows = need(g, name);
        snprintf(name, sizeof name, "%sstep%d.grad_rows", c, k);
        const ps_st_tensor *gr = need(g, name);
        if (!rows || !gr) return;
        CHECK(rows->dtype == PS_ST_I64 && gr->dims[1] == width);
        const int64_t nr = rows->dims[0];
        const int64_t *ri = rows->data;
        for (int64_t i = 0; i < nr; i++) touched[ri[i]] = 1;
        float *gd = dev_from(b, gr->data, nr * width);
        ps_status rc = ps_optim_step_rows(b, &s, total, width, ri, nr, w, gd, &st, &e);
        CHECK_MSG(rc == PS_OK, "%s %s step %d: %s", b->label, c, k, e.msg);
        CHECK(st.step == k);
        ps_backend_release(b, gd);
        snprintf(name, sizeof name, "%sstep%d.emb", c, k);
        snprintf(what, sizeof what, "%s %s", b->label, name);
        check_dev(b, what, w, need(g, name), W_ATOL, W_RTOL);
        float *hw = host_of(b, w, n);
        int same = 1;
        for (int64_t r = 0; r < total; r++)
            if (!touched[r]) same &= !memcmp(hw + r * width, (const float *)init->data + r * width,
                                             (size_t)width * sizeof(float));
        CHECK_MSG(same, "%s %s step %d: an untouched row changed", b->label, c, k);
        free(hw);
        for (int j = 0; j < ns; j++) {
            snprintf(name, sizeof name, "%sstep%d.%s.emb", c, k, ps_optim_state_name(s.kind, j));
            const ps_st_tensor *want = need(g, name);
            snprintf(what, sizeof what, "%s %s", b->label, name);
            check_dev(b, what, st.buf[j], want, 1e-6 * max_abs(want), S_RTOL);
            float *hs = host_of(b, st.buf[j], n);
            int zero = 1;
            for (int64_t i = 0; i < n; i++) zero &= touched[i / width] || hs[i] == 0.0f;
            CHECK_MSG(zero, "%s %s: state of an untouched row is not zero", b->label, name);
            free(hs);
        }
    }
    ps_backend_release(b, w);
    for (int j = 0; j < ns; j++) ps_backend_release(b, st.buf[j]);
}

/* Adam's first step is lr * g / (|g| + eps) per element (m = (1-b1) g,
 * v = (1-b2) g^2, both bias-corrected back to g and g^2): |dw| = lr where
 * |g| >> eps, derived here from the formula, not from PyTorch. */
static void adam_first_step_magnitude(ps_backend *b) {
    const int64_t n = 64;
    float w0[64], g[64];
    for (int i = 0; i < n; i++) {
        w0[i] = 0.25f * (float)(i % 9) - 1.0f;
        g[i] = (i % 2 ? 1.0f : -1.0f) * powf(10.0f, (float)(i % 5) - 3.0f); /* 1e-3 .. 10 */
    }
    ps_optim_spec s;
    ps_optim_spec_default(PS_OPTIM_ADAM, &s);
    ps_optim_state st = { { dev_zeros(b, n), dev_zeros(b, n) }, 0 };
    float *w = dev_from(b, w0, n), *gd = dev_from(b, g, n);
    ps_err e = { 0 };
    CHECK_MSG(ps_optim_step(b, &s, n, w, gd, &st, &e) == PS_OK, "%s", e.msg);
    float *hw = host_of(b, w, n);
    for (int i = 0; i < n; i++) {
        const double dw = (double)hw[i] - w0[i];
        CHECK_CLOSE(dw, -s.lr * (g[i] > 0 ? 1 : -1), 1e-7, 1e-4);
    }
    free(hw);
    ps_backend_release(b, w);
    ps_backend_release(b, gd);
    ps_backend_release(b, st.buf[0]);
    ps_backend_release(b, st.buf[1]);
}

/* Plain SGD on rows == dense SGD with zero gradient elsewhere, bit for bit. */
static void sparse_sgd_equals_dense(ps_backend *b) {
    enum { R = 20, W = 7 };
    float w0[R * W], dense_g[R * W] = { 0 }, g_rows[5 * W];
    const int64_t rows[5] = { 13, 2, 19, 0, 7 };
    for (int i = 0; i < R * W; i++) w0[i] = sinf((float)i);
    for (int r = 0; r < 5; r++)
        for (int j = 0; j < W; j++) dense_g[rows[r] * W + j] = g_rows[r * W + j] = cosf((float)(r * W + j));
    ps_optim_spec s;
    ps_optim_spec_default(PS_OPTIM_SGD, &s);
    s.lr = 0.3;
    ps_optim_state st1 = { { NULL }, 0 }, st2 = { { NULL }, 0 };
    float *w1 = dev_from(b, w0, R * W), *w2 = dev_from(b, w0, R * W);
    float *gd = dev_from(b, dense_g, R * W), *gr = dev_from(b, g_rows, 5 * W);
    ps_err e = { 0 };
    CHECK_MSG(ps_optim_step(b, &s, R * W, w1, gd, &st1, &e) == PS_OK, "%s", e.msg);
    CHECK_MSG(ps_optim_step_rows(b, &s, R, W, rows, 5, w2, gr, &st2, &e) == PS_OK, "%s", e.msg);
    float *h1 = host_of(b, w1, R * W), *h2 = host_of(b, w2, R * W);
    CHECK_MSG(!memcmp(h1, h2, sizeof w0), "%s: sparse SGD differs from dense SGD", b->label);
    CHECK(st1.step == 1 && st2.step == 1);
    free(h1);
    free(h2);
    ps_backend_release(b, w1);
    ps_backend_release(b, w2);
    ps_backend_release(b, gd);
    ps_backend_release(b, gr);
}

/* Refusals change nothing: weights, state and step stay. */
static void refusals(ps_backend *b) {
    enum { R = 6, W = 3 };
    float w0[R * W], g[2 * W];
    for (int i = 0; i < R * W; i++) w0[i] = (float)i;
    for (int i = 0; i < 2 * W; i++) g[i] = 1.0f;
    ps_optim_spec s;
    ps_optim_spec_default(PS_OPTIM_ADAM, &s);
    ps_optim_state st = { { dev_zeros(b, R * W), dev_zeros(b, R * W) }, 5 };
    float *w = dev_from(b, w0, R * W), *gd = dev_from(b, g, 2 * W);
    ps_err e = { 0 };
    const int64_t out_of_range[2] = { 1, 6 }, negative[2] = { -1, 2 }, repeated[2] = { 4, 4 };
    CHECK(ps_optim_step_rows(b, &s, R, W, out_of_range, 2, w, gd, &st, &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(e.msg, "row index 6 (entry 1) is out of range [0, 6)"), "%s", e.msg);
    CHECK(ps_optim_step_rows(b, &s, R, W, negative, 2, w, gd, &st, &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK(ps_optim_step_rows(b, &s, R, W, repeated, 2, w, gd, &st, &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(e.msg, "row index 4 is repeated"), "%s", e.msg);
    s.weight_decay = 0.01;
    const int64_t ok_rows[2] = { 0, 5 };
    CHECK(ps_optim_step_rows(b, &s, R, W, ok_rows, 2, w, gd, &st, &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(e.msg, "weight_decay 0.01 is not supported for row-sparse updates"), "%s", e.msg);
    ps_optim_spec sg;
    ps_optim_spec_default(PS_OPTIM_SGD, &sg);
    sg.momentum = 0.9;
    CHECK(ps_optim_step_rows(b, &sg, R, W, ok_rows, 2, w, gd, &st, &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(e.msg, "optimizer sgd: momentum 0.9 is not supported for row-sparse"), "%s", e.msg);
    CHECK(st.step == 5);
    float *hw = host_of(b, w, R * W), *hm = host_of(b, st.buf[0], R * W);
    CHECK(!memcmp(hw, w0, sizeof w0));
    int zero = 1;
    for (int i = 0; i < R * W; i++) zero &= hm[i] == 0.0f;
    CHECK(zero);
    free(hw);
    free(hm);
    /* No rows: the step counts (as SparseAdam's), nothing else changes. */
    ps_optim_spec_default(PS_OPTIM_ADAM, &s);
    CHECK(ps_optim_step_rows(b, &s, R, W, NULL, 0, w, gd, &st, &e) == PS_OK && st.step == 6);
    ps_backend_release(b, w);
    ps_backend_release(b, gd);
    ps_backend_release(b, st.buf[0]);
    ps_backend_release(b, st.buf[1]);
}

static void kinds(void) {
    ps_optim_kind k;
    ps_err e = { 0 };
    CHECK(ps_optim_kind_parse("sgd", &k, &e) == PS_OK && k == PS_OPTIM_SGD);
    CHECK(ps_optim_kind_parse("adam", &k, &e) == PS_OK && k == PS_OPTIM_ADAM);
    CHECK(ps_optim_kind_parse("adamw", &k, &e) == PS_ERR_NOT_FOUND);
    CHECK_MSG(!strcmp(e.msg, "unknown optimizer 'adamw' (known: sgd, adam)"), "%s", e.msg);
    CHECK(ps_optim_kind_parse(NULL, &k, &e) == PS_ERR_NOT_FOUND);
    int n;
    const char *const *names = ps_optim_state_names(PS_OPTIM_ADAM, &n);
    CHECK(n == 2 && !strcmp(names[0], "exp_avg") && !strcmp(names[1], "exp_avg_sq"));
    names = ps_optim_state_names(PS_OPTIM_SGD, &n);
    CHECK(n == 1 && !strcmp(names[0], "momentum_buffer"));
    CHECK(ps_optim_state_names((ps_optim_kind)7, &n) == NULL && n == 0);
    CHECK(ps_optim_state_name(PS_OPTIM_ADAM, 2) == NULL && ps_optim_kind_name((ps_optim_kind)-1) == NULL);
    CHECK(!strcmp(ps_optim_kind_get(PS_OPTIM_ADAM)->torch_class, "torch.optim.Adam"));
    ps_optim_spec s;
    ps_optim_spec_default(PS_OPTIM_SGD, &s);
    CHECK(ps_optim_num_state(&s) == 0);
    s.momentum = 0.5;
    CHECK(ps_optim_num_state(&s) == 1);
    ps_optim_spec_default(PS_OPTIM_ADAM, &s);
    CHECK(ps_optim_num_state(&s) == 2);
    CHECK(s.lr == 1e-3 && s.beta1 == 0.9 && s.beta2 == 0.999 && s.eps == 1e-8 && s.weight_decay == 0);
    /* The config's optimizer.type names are this table's, value for value. */
    for (int i = 0; i < PS_OPTIM_KIND_COUNT; i++) {
        const char *cn = ps_config_enum_name("optimizer.type", i);
        CHECK_MSG(cn && !strcmp(cn, ps_optim_kind_name((ps_optim_kind)i)), "kind %d: config %s, optim %s", i,
                  cn ? cn : "(none)", ps_optim_kind_name((ps_optim_kind)i));
    }
    CHECK(ps_config_enum_name("optimizer.type", PS_OPTIM_KIND_COUNT) == NULL);
    /* Ranges. */
    struct { ps_optim_kind k; double lr, mom, wd, b1, b2, eps; const char *msg; } bad[] = {
        { PS_OPTIM_SGD, 0, 0, 0, 0.9, 0.999, 1e-8, "optimizer sgd: lr 0 must be > 0" },
        { PS_OPTIM_SGD, 0.1, 1, 0, 0.9, 0.999, 1e-8, "optimizer sgd: momentum 1 must be in [0, 1)" },
        { PS_OPTIM_SGD, 0.1, 0, -1, 0.9, 0.999, 1e-8, "optimizer sgd: weight_decay -1 must be >= 0" },
        { PS_OPTIM_ADAM, 0.1, 0, 0, 1, 0.999, 1e-8, "optimizer adam: beta1 1 must be in [0, 1)" },
        { PS_OPTIM_ADAM, 0.1, 0, 0, 0.9, -0.5, 1e-8, "optimizer adam: beta2 -0.5 must be in [0, 1)" },
        { PS_OPTIM_ADAM, 0.1, 0, 0, 0.9, 0.999, 0, "optimizer adam: eps 0 must be > 0" },
        { PS_OPTIM_ADAM, NAN, 0, 0, 0.9, 0.999, 1e-8, "optimizer adam: lr nan must be > 0" },
        { PS_OPTIM_ADAM, 0.1, 0.9, 0, 0.9, 0.999, 1e-8,
          "optimizer adam: momentum 0.9 is not an Adam setting (beta1 is its momentum); set it to 0" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ps_optim_spec x = { bad[i].k, bad[i].lr, bad[i].mom, bad[i].wd, bad[i].b1, bad[i].b2, bad[i].eps };
        CHECK(ps_optim_check(&x, 0, &e) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(!strcmp(e.msg, bad[i].msg), "got '%s', want '%s'", e.msg, bad[i].msg);
    }
    ps_optim_spec x = { (ps_optim_kind)5, 0.1, 0, 0, 0.9, 0.999, 1e-8 };
    CHECK(ps_optim_check(&x, 0, &e) == PS_ERR_INVALID_ARGUMENT);
}

int main(void) {
    ps_err err = { 0 };
    kinds();
    ps_st_file *g = ps_st_read(GOLDEN, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (!g) return check_summary(NAME);
    const char *p01[] = { "p0", "p1" }, *p0[] = { "p0" };
    for (const char *const *bn = ps_backend_names(); *bn; bn++) {
        if (!strcmp(*bn, "cuda")) continue; /* tests/test_cuda_layers.c compares CUDA with ref */
        ps_backend *b = ps_backend_create(*bn, 0, 0, &err);
        CHECK_MSG(b != NULL, "%s: %s", *bn, err.msg);
        if (!b) continue;
        run_dense(b, g, "adam.", p01, 2, (int)meta_num(g, "adam.steps"));
        run_dense(b, g, "adamdef.", p0, 1, (int)meta_num(g, "adamdef.steps"));
        run_dense(b, g, "sgd.", p0, 1, (int)meta_num(g, "sgd.steps"));
        run_sparse(b, g, "sadam.", (int)meta_num(g, "sadam.steps"));
        run_sparse(b, g, "ssgd.", (int)meta_num(g, "ssgd.steps"));
        adam_first_step_magnitude(b);
        sparse_sgd_equals_dense(b);
        refusals(b);
        ps_backend_free(b);
    }
    ps_st_free(g);
    return check_summary(NAME);
}
