/* test_lstm - the trainer's LSTM layer (trainer/lstm.h), both the plain
 * C reference and oneDNN, against PyTorch's nn.LSTM (2 layers, nonzero
 * initial state, gradients of y, hn and cn: tests/golden/lstm.safetensors
 * from scripts/gen_golden_lstm.py): outputs, input gradients and both
 * biases' gradients. Then oneDNN against the reference at the language
 * model's width over a few windows with the state carried, the reference
 * against finite differences, and the errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/golden_replay.h"
#include "lstm.h"
#include "support/random.h"
#include "safetensors.h"

#define GOLDEN "tests/golden/lstm.safetensors"
enum { T = 5, N = 3, I = 6, H = 4, L = 2 };

static const float *gt(const ps_st_file *g, const char *name, int64_t n) { return golden_tensor(g, name, n); }

static void golden(const ps_st_file *g, ps_lstm_impl impl) {
    const char *iname = ps_lstm_impl_name(impl);
    ps_lstm *lay[L] = {0};
    ps_lstm_weights w[L];
    float *gw[L][4];
    ps_lstm_grads gr[L];
    char name[128];
    ps_err err = {0};
    for (int k = 0; k < L; k++) {
        int64_t in = k ? H : I;
        ps_lstm_shape s = {T, N, in, H};
        CHECK_MSG(ps_lstm_create(impl, s, &lay[k], &err) == PS_OK, "%s", err.msg);
        if (!lay[k]) return;
        snprintf(name, sizeof name, "rnn.weight_ih_l%d", k); w[k].w_ih = gt(g, name, 4 * H * in);
        snprintf(name, sizeof name, "rnn.weight_hh_l%d", k); w[k].w_hh = gt(g, name, 4 * H * H);
        snprintf(name, sizeof name, "rnn.bias_ih_l%d", k); w[k].b_ih = gt(g, name, 4 * H);
        snprintf(name, sizeof name, "rnn.bias_hh_l%d", k); w[k].b_hh = gt(g, name, 4 * H);
        int64_t sz[4] = {4 * H * in, 4 * H * H, 4 * H, 4 * H};
        for (int j = 0; j < 4; j++) gw[k][j] = calloc((size_t)sz[j], sizeof(float));
        gr[k] = (ps_lstm_grads){gw[k][0], gw[k][1], gw[k][2], gw[k][3]};
    }
    const float *x = gt(g, "x", T * N * I), *h0 = gt(g, "h0", L * N * H), *c0 = gt(g, "c0", L * N * H);
    float y0[T * N * H], y[T * N * H], hn[L * N * H], cn[L * N * H];
    CHECK(ps_lstm_forward(lay[0], &w[0], x, h0, c0, y0, hn, cn, &err) == PS_OK);
    CHECK(ps_lstm_forward(lay[1], &w[1], y0, h0 + N * H, c0 + N * H, y, hn + N * H, cn + N * H, &err) == PS_OK);
    const double tol = 2e-5;
    printf("%s forward\n", iname);
    check_array("y", y, gt(g, "y", T * N * H), T * N * H, tol, tol);
    check_array("hn", hn, gt(g, "hn", L * N * H), L * N * H, tol, tol);
    check_array("cn", cn, gt(g, "cn", L * N * H), L * N * H, tol, tol);
    const float *gy = gt(g, "gy", T * N * H), *ghn = gt(g, "ghn", L * N * H), *gcn = gt(g, "gcn", L * N * H);
    float dy0[T * N * H], dx[T * N * I], dh0[L * N * H], dc0[L * N * H];
    CHECK(ps_lstm_backward(lay[1], &w[1], gy, ghn + N * H, gcn + N * H, dy0, dh0 + N * H, dc0 + N * H, &gr[1], &err)
          == PS_OK);
    CHECK(ps_lstm_backward(lay[0], &w[0], dy0, ghn, gcn, dx, dh0, dc0, &gr[0], &err) == PS_OK);
    printf("%s backward\n", iname);
    check_array("grad.x", dx, gt(g, "grad.x", T * N * I), T * N * I, tol, tol);
    check_array("grad.h0", dh0, gt(g, "grad.h0", L * N * H), L * N * H, tol, tol);
    check_array("grad.c0", dc0, gt(g, "grad.c0", L * N * H), L * N * H, tol, tol);
    static const char *pn[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    for (int k = 0; k < L; k++) {
        int64_t in = k ? H : I;
        int64_t sz[4] = {4 * H * in, 4 * H * H, 4 * H, 4 * H};
        for (int j = 0; j < 4; j++) {
            snprintf(name, sizeof name, "grad.rnn.%s_l%d", pn[j], k);
            check_array(name, gw[k][j], gt(g, name, sz[j]), (size_t)sz[j], tol, tol);
        }
    }
    /* one backward per forward (the oneDNN one writes over the tape) */
    CHECK(ps_lstm_backward(lay[1], &w[1], gy, ghn + N * H, gcn + N * H, NULL, NULL, NULL, &gr[1], &err) ==
          PS_ERR_INVALID_ARGUMENT);
    /* gradients accumulate: the same forward and backward again add the same again */
    CHECK(ps_lstm_forward(lay[1], &w[1], y0, h0 + N * H, c0 + N * H, y, hn + N * H, cn + N * H, &err) == PS_OK);
    CHECK(ps_lstm_backward(lay[1], &w[1], gy, ghn + N * H, gcn + N * H, NULL, NULL, NULL, &gr[1], &err) == PS_OK);
    float twice[4 * H];
    const float *gb = gt(g, "grad.rnn.bias_hh_l1", 4 * H);
    for (int r = 0; r < 4 * H; r++) twice[r] = 2 * gb[r];
    check_array("bias_hh_l1 accumulated twice", gw[1][3], twice, 4 * H, tol, tol);
    /* set: written, not added (the old values, NaN here, neither read nor kept) */
    for (int j = 0; j < 4; j++)
        for (int64_t i = 0; i < (j < 2 ? 4 * H * H : 4 * H); i++) gw[1][j][i] = NAN;
    ps_lstm_grads gs = gr[1];
    gs.set = 1;
    CHECK(ps_lstm_forward(lay[1], &w[1], y0, h0 + N * H, c0 + N * H, y, hn + N * H, cn + N * H, &err) == PS_OK);
    CHECK(ps_lstm_backward(lay[1], &w[1], gy, ghn + N * H, gcn + N * H, NULL, NULL, NULL, &gs, &err) == PS_OK);
    for (int j = 0; j < 4; j++) {
        snprintf(name, sizeof name, "grad.rnn.%s_l1", pn[j]);
        int64_t sz = j < 2 ? 4 * H * H : 4 * H;
        check_array(name, gw[1][j], gt(g, name, sz), (size_t)sz, tol, tol);
    }
    for (int k = 0; k < L; k++) {
        ps_lstm_free(lay[k]);
        for (int j = 0; j < 4; j++) free(gw[k][j]);
    }
}

/* oneDNN vs reference, three windows with the hidden state carried across
 * (as the trainer's detached BPTT windows). At AVX-512 the forward's
 * recurrent product is lstm.c's own kernel: blocks of 7 rows and panels of
 * 48 gates, so shapes with a short last block and panel. */
static void dnnl_vs_ref(ps_lstm_shape s, double tol) {
    const int64_t G = 4 * s.H;
    rng r = {99};
    float *w_ih = host_random((size_t)(G * s.I), &r), *w_hh = host_random((size_t)(G * s.H), &r);
    float *b_ih = host_random((size_t)G, &r), *b_hh = host_random((size_t)G, &r);
    ps_lstm_weights w = {w_ih, w_hh, b_ih, b_hh};
    ps_lstm *a = NULL, *b = NULL;
    ps_err err = {0};
    CHECK(ps_lstm_create(PS_LSTM_REF, s, &a, &err) == PS_OK);
    CHECK_MSG(ps_lstm_create(PS_LSTM_DNNL, s, &b, &err) == PS_OK, "%s", err.msg);
    if (!a || !b) return;
    size_t nx = (size_t)(s.T * s.N * s.I), ny = (size_t)(s.T * s.N * s.H), nh = (size_t)(s.N * s.H);
    float *ya = malloc(ny * 4), *yb = malloc(ny * 4), *ha = calloc(nh, 4), *ca = calloc(nh, 4), *hb = calloc(nh, 4),
          *cb = calloc(nh, 4), *dxa = malloc(nx * 4), *dxb = malloc(nx * 4);
    float *ga[4], *gb[4];
    size_t gs[4] = {(size_t)(G * s.I), (size_t)(G * s.H), (size_t)G, (size_t)G};
    for (int j = 0; j < 4; j++) { ga[j] = calloc(gs[j], 4); gb[j] = calloc(gs[j], 4); }
    ps_lstm_grads gra = {ga[0], ga[1], ga[2], ga[3]}, grb = {gb[0], gb[1], gb[2], gb[3]};
    for (int win = 0; win < 3; win++) {
        float *x = host_random(nx, &r), *dy = host_random(ny, &r);
        CHECK(ps_lstm_forward(a, &w, x, win ? ha : NULL, win ? ca : NULL, ya, ha, ca, &err) == PS_OK);
        CHECK(ps_lstm_forward(b, &w, x, win ? hb : NULL, win ? cb : NULL, yb, hb, cb, &err) == PS_OK);
        check_scaled("dnnl y vs ref", yb, ya, ny, tol);
        check_scaled("dnnl cT vs ref", cb, ca, nh, tol);
        CHECK(ps_lstm_backward(a, &w, dy, NULL, NULL, dxa, NULL, NULL, &gra, &err) == PS_OK);
        CHECK(ps_lstm_backward(b, &w, dy, NULL, NULL, dxb, NULL, NULL, &grb, &err) == PS_OK);
        check_scaled("dnnl dx vs ref", dxb, dxa, nx, tol);
        free(x);
        free(dy);
    }
    const char *gn[4] = {"w_ih", "w_hh", "b_ih", "b_hh"};
    for (int j = 0; j < 4; j++) check_scaled(gn[j], gb[j], ga[j], gs[j], tol);
    ps_lstm_free(a);
    ps_lstm_free(b);
    free(ya); free(yb); free(ha); free(ca); free(hb); free(cb); free(dxa); free(dxb);
    for (int j = 0; j < 4; j++) { free(ga[j]); free(gb[j]); }
    free(w_ih); free(w_hh); free(b_ih); free(b_hh);
}

/* Reference gradient of loss = sum(y * gy) w.r.t. a few weights and inputs by central differences (double-checked
 * independently of PyTorch). */
static void finite_differences(void) {
    ps_lstm_shape s = {3, 2, 3, 3};
    const int64_t G = 4 * s.H;
    rng r = {7};
    float *w_ih = host_random((size_t)(G * s.I), &r), *w_hh = host_random((size_t)(G * s.H), &r);
    float *b_ih = host_random((size_t)G, &r), *b_hh = host_random((size_t)G, &r);
    size_t nx = (size_t)(s.T * s.N * s.I), ny = (size_t)(s.T * s.N * s.H);
    float *x = host_random(nx, &r), *gy = host_random(ny, &r), y[18], dx[18];
    ps_lstm_weights w = {w_ih, w_hh, b_ih, b_hh};
    ps_lstm *l = NULL;
    ps_err err = {0};
    CHECK(ps_lstm_create(PS_LSTM_REF, s, &l, &err) == PS_OK);
    if (!l) return;
    float *g[4];
    size_t gs[4] = {(size_t)(G * s.I), (size_t)(G * s.H), (size_t)G, (size_t)G};
    for (int j = 0; j < 4; j++) g[j] = calloc(gs[j], 4);
    ps_lstm_grads gr = {g[0], g[1], g[2], g[3]};
    CHECK(ps_lstm_forward(l, &w, x, NULL, NULL, y, NULL, NULL, &err) == PS_OK);
    CHECK(ps_lstm_backward(l, &w, gy, NULL, NULL, dx, NULL, NULL, &gr, &err) == PS_OK);
    float *targets[5] = {w_ih, w_hh, b_ih, b_hh, x};
    float *grads[5] = {g[0], g[1], g[2], g[3], dx};
    size_t sizes[5] = {gs[0], gs[1], gs[2], gs[3], nx};
    for (int t = 0; t < 5; t++)
        for (size_t i = 0; i < sizes[t]; i += 5) {
            float keep = targets[t][i];
            double f[2];
            for (int sgn = 0; sgn < 2; sgn++) {
                targets[t][i] = keep + (sgn ? -1e-2f : 1e-2f);
                CHECK(ps_lstm_forward(l, &w, x, NULL, NULL, y, NULL, NULL, &err) == PS_OK);
                f[sgn] = 0;
                for (size_t k = 0; k < ny; k++) f[sgn] += (double)y[k] * gy[k];
            }
            targets[t][i] = keep;
            CHECK_CLOSE(grads[t][i], (f[0] - f[1]) / 2e-2, 2e-3, 1e-2);
        }
    ps_lstm_free(l);
    for (int j = 0; j < 4; j++) free(g[j]);
    free(w_ih); free(w_hh); free(b_ih); free(b_hh); free(x); free(gy);
}

static void errors(void) {
    ps_lstm *l = (ps_lstm *)1;
    ps_err err = {0};
    ps_lstm_shape bad = {0, 2, 3, 4};
    CHECK(ps_lstm_create(PS_LSTM_DNNL, bad, &l, &err) == PS_ERR_INVALID_ARGUMENT && l == NULL);
    CHECK(strstr(err.msg, "T=0") != NULL);
    ps_lstm_shape s = {2, 2, 3, 4};
    CHECK(ps_lstm_create(PS_LSTM_REF, s, &l, &err) == PS_OK);
    float dy[16] = {0}, gbuf[64] = {0};
    ps_lstm_grads g = {gbuf, gbuf, gbuf, gbuf};
    ps_lstm_weights w = {gbuf, gbuf, gbuf, gbuf};
    CHECK(ps_lstm_backward(l, &w, dy, NULL, NULL, NULL, NULL, NULL, &g, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.msg, "without a forward") != NULL);
    ps_lstm_free(l);
    ps_lstm_free(NULL);
    CHECK(ps_lstm_impl_parse("dnnl") == PS_LSTM_DNNL && ps_lstm_impl_parse("ref") == PS_LSTM_REF &&
          ps_lstm_impl_parse("cuda") == -1);
}

int main(void) {
    ps_err err = {0};
    ps_st_file *g = ps_st_read(GOLDEN, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (g) {
        golden(g, PS_LSTM_REF);
        golden(g, PS_LSTM_DNNL);
        ps_st_free(g);
    }
    dnnl_vs_ref((ps_lstm_shape){7, 4, 24, 20}, 1e-5);
    dnnl_vs_ref((ps_lstm_shape){4, 9, 24, 50}, 1e-5);  /* 4H = 200: 4 panels and 8 gates; rows 7 + 2 */
    /* the LM's N and H (rows 7 + 7 + 6, 16 panels and 32): float sums of
     * 216 products against the reference's double ones, 3e-5 apart at
     * oneDNN's AVX2 sgemm and at AVX-512 alike */
    dnnl_vs_ref((ps_lstm_shape){3, 20, 16, 200}, 1e-4);
    finite_differences();
    errors();
    return check_summary("test_lstm");
}
