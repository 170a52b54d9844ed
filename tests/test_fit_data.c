/* test_fit_data.c - a data set against a model (trainer/fit_data.h): the
 * refusals ps-train fit gives before training (sample counts, shapes,
 * dtypes, class ids out of range, channel counts), what it accepts (size-1
 * dims, extra leading id dims), the batches it builds (normalisation per
 * channel, computed here independently in double) and the held-out split
 * (disjoint, complete, the same on every rank, shares that partition),
 * several input arrays joined (ps_fit_join), and the class options of ps_fit_check_class
 * (--class-dim last: a (T, V) output against (T,) labels; --ignore-index: a label equal to it
 * passes whatever its value, any other out of range is refused naming sample and position). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fit_data.h"

static ps_array arr(int dtype, int ndim, const int64_t *dims) {
    ps_array a = {.dtype = dtype, .ndim = ndim};
    memcpy(a.dims, dims, sizeof(int64_t) * (size_t)ndim);
    a.bytes = (size_t)ps_array_numel(&a) * ps_array_dtype_size(dtype);
    a.data = calloc(a.bytes ? a.bytes : 1, 1);
    return a;
}

static const ps_fit_model g_cnn = {.in_ndim = 3, .in_dims = {1, 28, 28}, .out_ndim = 1, .out_dims = {10},
                                   .first_stage = "conv"};

/* ps_fit_check fails with every needle in its message. */
static void refuse(const char *what, const ps_array *x, const ps_array *y, const ps_fit_model *m, const char *loss,
                   const ps_fit_norm *norm, const char *n1, const char *n2) {
    ps_fit_layout lay;
    ps_err e = {0};
    ps_fit_norm dn = {.scale = -1};
    ps_status st = ps_fit_check(x, "X.npy", y, "Y.npy", m, ps_loss_find(loss), norm ? norm : &dn, &lay, &e);
    CHECK_MSG(st != PS_OK, "%s: accepted", what);
    CHECK_MSG(!n1 || strstr(e.msg, n1), "%s: '%s' lacks '%s'", what, e.msg, n1);
    CHECK_MSG(!n2 || strstr(e.msg, n2), "%s: '%s' lacks '%s'", what, e.msg, n2);
}

static ps_status accept(const ps_array *x, const ps_array *y, const ps_fit_model *m, const char *loss,
                        const ps_fit_norm *norm, ps_fit_layout *lay) {
    ps_err e = {0};
    ps_fit_norm dn = {.scale = -1};
    ps_status st = ps_fit_check(x, "X.npy", y, "Y.npy", m, ps_loss_find(loss), norm ? norm : &dn, lay, &e);
    CHECK_MSG(st == PS_OK, "%s", e.msg);
    return st;
}

static void test_checks(void) {
    ps_array x = arr(PS_ARRAY_U8, 3, (int64_t[]){5, 28, 28}), y = arr(PS_ARRAY_U8, 1, (int64_t[]){5});
    ps_array y4 = arr(PS_ARRAY_I64, 1, (int64_t[]){4}), yf = arr(PS_ARRAY_F32, 1, (int64_t[]){5});
    ps_array x27 = arr(PS_ARRAY_F32, 3, (int64_t[]){5, 27, 28}), xflat = arr(PS_ARRAY_F32, 2, (int64_t[]){5, 784});
    ps_array y2 = arr(PS_ARRAY_I32, 2, (int64_t[]){5, 2}), y10 = arr(PS_ARRAY_F64, 2, (int64_t[]){5, 10});
    ps_array x0 = arr(PS_ARRAY_U8, 3, (int64_t[]){0, 28, 28}), y0 = arr(PS_ARRAY_U8, 1, (int64_t[]){0});
    ps_fit_layout lay;
    refuse("count", &x, &y4, &g_cnn, "nll", NULL, "X.npy hold 5 samples", "Y.npy hold 4");
    refuse("empty", &x0, &y0, &g_cnn, "nll", NULL, "no samples", NULL);
    /* samples without values, checked before the model is known: two tiny
     * files of shape (2^32-1, 0) made ps-train fit allocate 37 GB of
     * sample indices */
    ps_array xe = arr(PS_ARRAY_U8, 2, (int64_t[]){4294967295, 0}), ye = arr(PS_ARRAY_I64, 2, (int64_t[]){4294967295, 0});
    ps_array ye3 = arr(PS_ARRAY_I64, 3, (int64_t[]){5, 2, 0});
    ps_err e = {0};
    CHECK(ps_fit_check_samples(&xe, "X.npy", &ye, "Y.npy", &e) == PS_ERR_INVALID_ARGUMENT &&
          strstr(e.msg, "inputs X.npy: each of the 4294967295 samples is (0,), no values"));
    CHECK_MSG(ps_fit_check_samples(&x, "X.npy", &ye3, "Y.npy", &e) == PS_ERR_INVALID_ARGUMENT &&
              strstr(e.msg, "labels Y.npy: each of the 5 samples is (2, 0), no values"), "%s", e.msg);
    CHECK_MSG(ps_fit_check_samples(&x, "X.npy", &y, "Y.npy", &e) == PS_OK, "%s", e.msg);
    CHECK(ps_fit_check_samples(&x, "X.npy", &y4, "Y.npy", &e) == PS_ERR_INVALID_ARGUMENT && strstr(e.msg, "hold 4"));
    ps_array_free(&xe);
    ps_array_free(&ye);
    ps_array_free(&ye3);
    refuse("image size", &x27, &y, &g_cnn, "nll", NULL, "each sample is (27, 28)", "'conv' takes (1, 28, 28)");
    refuse("flat", &xflat, &y, &g_cnn, "nll", NULL, "(784,)", NULL);
    refuse("float labels", &x, &yf, &g_cnn, "cross_entropy", NULL, "float32", "integer class ids");
    refuse("two ids", &x, &y2, &g_cnn, "nll", NULL, "label is (2,)", "needs ()");
    refuse("mse shape", &x, &y, &g_cnn, "mse", NULL, "needs (10,)", "one number per output element");
    ((uint8_t *)y.data)[3] = 10;
    refuse("range", &x, &y, &g_cnn, "nll", NULL, "sample 3 has class 10", "10 classes (0..9)");
    ((uint8_t *)y.data)[3] = 9;
    ps_array yi = arr(PS_ARRAY_I64, 1, (int64_t[]){5});
    ((int64_t *)yi.data)[4] = -1;
    refuse("negative", &x, &yi, &g_cnn, "cross_entropy", NULL, "sample 4 has class -1", NULL);
    ps_fit_norm n3 = {.scale = -1, .nmean = 3, .mean = {0.1, 0.2, 0.3}};
    refuse("channels", &x, &y, &g_cnn, "nll", &n3, "3/0 values", "1 channels");
    ps_fit_norm n0 = {.scale = -1, .nstd = 1, .std = {0}};
    refuse("std 0", &x, &y, &g_cnn, "nll", &n0, "--input-std must be > 0", NULL);

    /* accepted: (28, 28) images into (1, 28, 28), uint8 labels, default scale 1/255 */
    if (!accept(&x, &y, &g_cnn, "nll", NULL, &lay)) {
        CHECK(lay.extra_ndim == 0 && lay.in_ndim == 4 && lay.in_dims[1] == 1 && lay.in_dims[3] == 28);
        CHECK(lay.classes == 10 && lay.inner == 1 && lay.rows == 1 && lay.out_numel == 10 && lay.x_numel == 784);
        CHECK_CLOSE(lay.scale, 1.0 / 255.0, 0, 1e-15);
    }
    ps_fit_norm one = {.scale = 1};
    if (!accept(&x27 /* any float */, &y, &(ps_fit_model){.in_ndim = 2, .in_dims = {27, 28}, .out_ndim = 1,
                                                            .out_dims = {10}, .first_stage = "s"}, "nll", &one, &lay))
        CHECK(lay.scale == 1.0);
    /* dense targets (5, 10) of float64 for mse and bce_with_logits */
    CHECK(!accept(&x, &y10, &g_cnn, "mse", NULL, &lay) && lay.y_numel == 10);
    CHECK(!accept(&x, &y10, &g_cnn, "bce_with_logits", NULL, &lay));

    /* an embedding model: int64 ids, extra leading dims (T = 6) */
    ps_fit_model emb = {.in_ndim = 0, .in_int64 = 1, .out_ndim = 1, .out_dims = {50}, .first_stage = "emb"};
    ps_array ids = arr(PS_ARRAY_I32, 2, (int64_t[]){5, 6}), tgt = arr(PS_ARRAY_I64, 2, (int64_t[]){5, 6});
    if (!accept(&ids, &tgt, &emb, "cross_entropy", NULL, &lay)) {
        CHECK(lay.extra_ndim == 1 && lay.extra[0] == 6 && lay.rows == 6 && lay.classes == 50 && lay.in_ndim == 2);
        CHECK(lay.out_numel == 300 && lay.y_numel == 6);
    }
    ps_array fids = arr(PS_ARRAY_F32, 2, (int64_t[]){5, 6});
    refuse("float ids", &fids, &tgt, &emb, "cross_entropy", NULL, "float32", "takes int64 ids");
    refuse("label per position", &ids, &y, &emb, "cross_entropy", NULL, "needs (6,)", NULL);
    ps_array *all[] = {&x, &y, &y4, &yf, &x27, &xflat, &y2, &y10, &x0, &y0, &yi, &ids, &tgt, &fids};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ps_array_free(all[i]);
}

/* ps_fit_check_class: a sequence model's (T, V) = (4, 7) output per sample against (4,) labels. */
static void test_class_opts(void) {
    ps_fit_model lm = {.in_ndim = 1, .in_int64 = 1, .in_dims = {4}, .out_ndim = 2, .out_dims = {4, 7},
                       .first_stage = "emb"};
    ps_array ids = arr(PS_ARRAY_I64, 2, (int64_t[]){3, 4}), tgt = arr(PS_ARRAY_I64, 2, (int64_t[]){3, 4});
    ps_fit_norm dn = {.scale = -1};
    ps_fit_layout lay;
    ps_err e = {0};
    ps_fit_class last = {.ignore = PS_LOSS_NO_IGNORE, .last = 1};
    const ps_loss *ce = ps_loss_find("cross_entropy");
    CHECK_MSG(!ps_fit_check_class(&ids, "X", &tgt, "Y", &lm, ce, &last, &dn, &lay, &e), "%s", e.msg);
    CHECK(lay.classes == 7 && lay.inner == 1 && lay.rows == 1 && lay.loss_rows == 4 && lay.out_numel == 28);
    CHECK(lay.y_numel == 4);
    /* classes first (the default): (T, V) is C = 4 over 7 positions, labels (7,) */
    CHECK(ps_fit_check_class(&ids, "X", &tgt, "Y", &lm, ce, NULL, &dn, &lay, &e) != PS_OK && strstr(e.msg, "(7,)"));
    /* a label of 7 (= V) refused naming sample 2 position 1; as the ignore_index it passes */
    ((int64_t *)tgt.data)[2 * 4 + 1] = 7;
    CHECK(ps_fit_check_class(&ids, "X", &tgt, "Y", &lm, ce, &last, &dn, &lay, &e) != PS_OK);
    CHECK_MSG(strstr(e.msg, "sample 2 has class 7 at position 1") && strstr(e.msg, "0..6"), "%s", e.msg);
    ps_fit_class ig7 = {.ignore = 7, .last = 1}, ig0 = {.ignore = 0, .last = 1}, ign100 = {.ignore = -100, .last = 1};
    CHECK_MSG(!ps_fit_check_class(&ids, "X", &tgt, "Y", &lm, ce, &ig7, &dn, &lay, &e), "%s", e.msg);
    e.msg[0] = 0;
    CHECK(ps_fit_check_class(&ids, "X", &tgt, "Y", &lm, ce, &ig0, &dn, &lay, &e) != PS_OK &&
          strstr(e.msg, "or --ignore-index 0"));
    ((int64_t *)tgt.data)[2 * 4 + 1] = -100;   /* PyTorch's default ignore_index */
    CHECK(!ps_fit_check_class(&ids, "X", &tgt, "Y", &lm, ce, &ign100, &dn, &lay, &e));
    CHECK(ps_fit_check_class(&ids, "X", &tgt, "Y", &lm, ce, &last, &dn, &lay, &e) != PS_OK &&
          strstr(e.msg, "class -100"));
    /* a dense loss keeps its layout whatever cls says */
    ps_array yd = arr(PS_ARRAY_F32, 3, (int64_t[]){3, 4, 7});
    CHECK(!ps_fit_check_class(&ids, "X", &yd, "Y", &lm, ps_loss_find("mse"), &last, &dn, &lay, &e) &&
          lay.loss_rows == 1 && lay.classes == 4 && lay.inner == 7);
    ps_array_free(&ids);
    ps_array_free(&tgt);
    ps_array_free(&yd);
}

static void test_batches(void) {
    /* (4, 3, 2, 2) uint8 "images", per-channel mean/std */
    ps_array x = arr(PS_ARRAY_U8, 4, (int64_t[]){4, 3, 2, 2}), y = arr(PS_ARRAY_I16, 1, (int64_t[]){4});
    for (int i = 0; i < 48; i++) ((uint8_t *)x.data)[i] = (uint8_t)(i * 5 + 3);
    for (int i = 0; i < 4; i++) ((int16_t *)y.data)[i] = (int16_t)(3 - i);
    ps_fit_model m = {.in_ndim = 3, .in_dims = {3, 2, 2}, .out_ndim = 1, .out_dims = {4}, .first_stage = "s"};
    ps_fit_norm norm = {.scale = -1, .nmean = 3, .mean = {0.5, 0.4, 0.3}, .nstd = 3, .std = {0.2, 0.25, 0.5}};
    ps_fit_layout lay;
    if (accept(&x, &y, &m, "cross_entropy", &norm, &lay)) return;
    uint32_t idx[2] = {2, 0};
    float xf[24];
    int64_t t[2];
    ps_err e = {0};
    CHECK(ps_fit_inputs(&x, &lay, &norm, 0, idx, 2, xf, NULL, &e) == PS_OK);
    CHECK(ps_fit_targets(&y, &lay, ps_loss_find("cross_entropy"), idx, 2, t, &e) == PS_OK);
    CHECK(t[0] == 1 && t[1] == 3);
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 12; j++) {
            int c = j / 4;
            double v = (double)(uint8_t)((idx[s] * 12 + j) * 5 + 3) / 255.0;
            CHECK_CLOSE(xf[s * 12 + j], (v - norm.mean[c]) / norm.std[c], 1e-6, 1e-6);
        }
    /* dense targets as floats */
    ps_array yd = arr(PS_ARRAY_I8, 2, (int64_t[]){4, 4});
    for (int i = 0; i < 16; i++) ((int8_t *)yd.data)[i] = (int8_t)(i - 8);
    ps_fit_norm dn = {.scale = -1};
    float tf[8];
    if (!accept(&x, &yd, &m, "mse", &dn, &lay)) {
        CHECK(ps_fit_targets(&yd, &lay, ps_loss_find("mse"), idx, 2, tf, &e) == PS_OK);
        CHECK(tf[0] == 0.0f && tf[3] == 3.0f && tf[4] == -8.0f && tf[7] == -5.0f);
    }
    ps_array_free(&x);
    ps_array_free(&y);
    ps_array_free(&yd);
}

static void test_split(void) {
    ps_err e = {0};
    uint32_t *tr, *va, nt, nv;
    const uint32_t N = 1003;
    /* the held-out part: round(0.1 * N) samples, the same for every rank */
    uint32_t *va1 = NULL, nv1 = 0;
    uint8_t *seen = calloc(N, 1);
    for (int rank = 1; rank <= 3; rank++) {
        CHECK(ps_fit_split(N, 0.1, 7, rank, 3, &tr, &nt, &va, &nv, &e) == PS_OK);
        CHECK(nv == 100);
        if (rank == 1) {
            va1 = malloc(nv * sizeof *va1);
            memcpy(va1, va, nv * sizeof *va1);
            nv1 = nv;
        } else {
            CHECK(nv == nv1 && !memcmp(va, va1, nv * sizeof *va));
        }
        CHECK(nt == 301); /* 903 training samples, 3 shares */
        for (uint32_t i = 0; i < nt; i++) {
            CHECK(!seen[tr[i]]);
            seen[tr[i]]++;
        }
        free(tr);
        free(va);
    }
    for (uint32_t i = 0; i < nv1; i++) {
        CHECK(!seen[va1[i]]);
        seen[va1[i]]++;
        CHECK(i == 0 || va1[i] > va1[i - 1]);
    }
    uint32_t covered = 0;
    for (uint32_t i = 0; i < N; i++) covered += seen[i] == 1;
    CHECK(covered == N);
    /* another seed holds out other samples */
    CHECK(ps_fit_split(N, 0.1, 8, 1, 1, &tr, &nt, &va, &nv, &e) == PS_OK);
    CHECK(nt == N - 100 && nv == 100 && memcmp(va, va1, nv * sizeof *va));
    free(tr);
    free(va);
    free(va1);
    free(seen);
    CHECK(ps_fit_split(N, 0, 7, 2, 2, &tr, &nt, &va, &nv, &e) == PS_OK && nv == 0 && nt == N - N / 2 && tr[0] == N / 2);
    free(tr);
    free(va);
    CHECK(ps_fit_split(5, 0.05, 1, 1, 1, &tr, &nt, &va, &nv, &e) == PS_ERR_INVALID_ARGUMENT && strstr(e.msg, "none"));
    CHECK(ps_fit_split(3, 0.9, 1, 1, 1, &tr, &nt, &va, &nv, &e) == PS_ERR_INVALID_ARGUMENT);
    CHECK(ps_fit_split(3, 0, 1, 1, 4, &tr, &nt, &va, &nv, &e) == PS_ERR_INVALID_ARGUMENT && strstr(e.msg, "4 trainers"));
}

/* ps_fit_join: several input arrays into the one input, each sample's values in order (np.concatenate of
 * the flattened arrays, written out here by hand); int64 when all are integers, float32 with ids exact when a
 * float array is among them; refusals naming the array. */
static void test_join(void) {
    ps_err e = {0};
    ps_array parts[3], out;
    const char *names[3] = {"ids.npy", "feats.npy", "hist.npy"};
    parts[0] = arr(PS_ARRAY_I64, 2, (int64_t[]){2, 2});
    parts[1] = arr(PS_ARRAY_F64, 3, (int64_t[]){2, 1, 3});
    parts[2] = arr(PS_ARRAY_U8, 1, (int64_t[]){2});
    for (int i = 0; i < 4; i++) ((int64_t *)parts[0].data)[i] = 10 * i + 1;
    for (int i = 0; i < 6; i++) ((double *)parts[1].data)[i] = 0.5 + i;
    ((uint8_t *)parts[2].data)[0] = 7;
    ((uint8_t *)parts[2].data)[1] = 200;
    CHECK_MSG(ps_fit_join(parts, names, 3, 1 << 20, &out, &e) == PS_OK, "%s", e.msg);
    const float want[2][6] = {{1, 11, 0.5f, 1.5f, 2.5f, 7}, {21, 31, 3.5f, 4.5f, 5.5f, 200}};
    CHECK(out.dtype == PS_ARRAY_F32 && out.ndim == 2 && out.dims[0] == 2 && out.dims[1] == 6);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 6; j++)
            CHECK_MSG(((float *)out.data)[r * 6 + j] == want[r][j], "joined [%d][%d] = %g, want %g", r, j,
                      ((float *)out.data)[r * 6 + j], want[r][j]);
    ps_array_free(&out);
    const char *inames[2] = {"ids.npy", "hist.npy"};
    ps_array ints[2] = {parts[0], parts[2]};
    CHECK_MSG(ps_fit_join(ints, inames, 2, 1 << 20, &out, &e) == PS_OK, "%s", e.msg);
    const int64_t iwant[2][3] = {{1, 11, 7}, {21, 31, 200}};
    CHECK(out.dtype == PS_ARRAY_I64 && out.dims[1] == 3);
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) CHECK(((int64_t *)out.data)[r * 3 + j] == iwant[r][j]);
    ps_array_free(&out);
    ((int64_t *)parts[0].data)[3] = 1 << 24;   /* not exact in float32 beside float features */
    CHECK(ps_fit_join(parts, names, 2, 1 << 20, &out, &e) == PS_ERR_INVALID_ARGUMENT &&
          strstr(e.msg, "ids.npy: sample 1 value 16777216 (position 1) is not exact in float32"));
    CHECK(!out.data);
    CHECK_MSG(ps_fit_join(ints, inames, 2, 1 << 20, &out, &e) == PS_OK, "%s", e.msg);   /* int64: exact */
    ps_array_free(&out);
    ps_array short1 = arr(PS_ARRAY_F32, 2, (int64_t[]){3, 2});
    ps_array two[2] = {parts[0], short1};
    const char *snames[2] = {"ids.npy", "short.npy"};
    CHECK(ps_fit_join(two, snames, 2, 1 << 20, &out, &e) == PS_ERR_INVALID_ARGUMENT &&
          strstr(e.msg, "inputs short.npy hold 3 samples (3, 2), but inputs ids.npy hold 2 (2, 2)"));
    CHECK(ps_fit_join(parts, names, 3, 16, &out, &e) == PS_ERR_RESOURCE_EXHAUSTED);   /* 48 bytes over 16 */
    for (int i = 0; i < 3; i++) ps_array_free(&parts[i]);
    ps_array_free(&short1);
}

int main(void) {
    test_checks();
    test_batches();
    test_split();
    test_join();
    test_class_opts();
    return check_summary("test_fit_data");
}
