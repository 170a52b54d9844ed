/* test_shared_params - one node's parameters used at several sites
 * (share: NODE) and a parameter tied across kinds (tie: {weight:
 * NODE.weight}), docs/models.md "Shared parameters".
 *
 * The reference is the same network written without sharing (each site
 * its own node) with the owner's values copied into every site: the
 * gradient of a shared parameter must be the sum of the sites' gradients
 * there (a kind's backward writes its gradient, so a site that wrote over
 * another's fails), the outputs and input gradients equal, on the ref and
 * dnnl backends. Checked for a Linear applied twice to one value's
 * fan-out and in a chain (an ALBERT-style block applied three times), a
 * tied Embedding / Linear (the Embedding's row-sparse gradient scattered
 * into the shared dense one), psd's combined backward (the batched-parts
 * path, ps_model_backward_group: each part's gradients its own, summed
 * over the sites) against each part alone, that the parameter is listed
 * once under its owner, that an SGD step moves every site (one storage),
 * a tied model's checkpoint (both state_dict keys, one value; it loads
 * back) and init files (the alias key accepted when it equals its owner,
 * refused naming both when not), a BatchNorm called at two sites (one set
 * of buffers, listed once; each site's batch statistics folded into it in
 * forward order, not file order, with PyTorch's momentum rule once per
 * call, against the same network with a BatchNorm per site; eval reads the
 * shared running statistics at both; two forwards of one context fold in
 * seq order, then site order), and the model-file refusals
 * (file:line naming both nodes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "checkpoint.h"
#include "model.h"
#include "safetensors.h"
#include "support/tmpdir.h"

#define OKE(expr) do { ps_status rc_ = (expr); CHECK_MSG(rc_ == PS_OK, "%s", err.msg); } while (0)

#define MAXP 16

static char g_dir[256];

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static ps_model *build(const char *name, const char *text, const char *backend, ps_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s.yaml", g_dir, name);
    FILE *f = fopen(path, "w");
    CHECK_MSG(f, "cannot write %s", path);
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
    ps_model_opts o = {.file = path, .cpu_backend = backend, .seed = 3, .compute_threads = 2, .lr = 0.1f};
    return ps_model_create(&o, err);
}

static float *param_values(ps_model *m, const char *name, int64_t *numel) {
    ps_err err = {0};
    int i = ps_model_find_param(m, name);
    CHECK_MSG(i >= 0, "no parameter %s", name);
    if (i < 0) return NULL;
    *numel = ps_model_param(m, i)->numel;
    float *v = malloc((size_t)*numel * sizeof(float));
    OKE(ps_model_get_param(m, i, v, &err));
    return v;
}

/* ref's parameter dst = shared's src (the owner's values at each site). */
static void copy_param(ps_model *ref, const char *dst, ps_model *shared, const char *src) {
    ps_err err = {0};
    int64_t n = 0;
    float *v = param_values(shared, src, &n);
    int i = ps_model_find_param(ref, dst);
    CHECK_MSG(i >= 0 && v && ps_model_param(ref, i)->numel == n, "%s vs %s", dst, src);
    if (i >= 0 && v) OKE(ps_model_set_param(ref, i, v, &err));
    free(v);
}

static float *grad_of(ps_model *m, ps_grads *g, const char *name) {
    ps_err err = {0};
    int i = ps_model_find_param(m, name);
    CHECK_MSG(i >= 0, "no parameter %s", name);
    if (i < 0) return NULL;
    float *v = malloc((size_t)ps_model_param(m, i)->numel * sizeof(float));
    OKE(ps_grads_get(m, g, i, v, &err));
    return v;
}

/* sites: for each parameter of the shared model, the reference's
 * parameters whose gradients sum to it ("a.weight+b.weight"). */
typedef struct site_map { const char *shared; const char *ref[3]; } site_map;

/* One forward and backward of n samples of x through both models; every
 * shared parameter's gradient against the sum over its sites. */
static void compare(const char *label, ps_model *sh, ps_model *ref, const site_map *map, int nmap, const void *x,
                    int n, int64_t out_k, int in_f32, int64_t in_k) {
    ps_err err = {0};
    float *o1 = malloc((size_t)(n * out_k) * sizeof(float)), *o2 = malloc((size_t)(n * out_k) * sizeof(float));
    float *gout = malloc((size_t)(n * out_k) * sizeof(float));
    float *gi1 = in_f32 ? malloc((size_t)(n * in_k) * sizeof(float)) : NULL;
    float *gi2 = in_f32 ? malloc((size_t)(n * in_k) * sizeof(float)) : NULL;
    for (int64_t i = 0; i < n * out_k; i++) gout[i] = frand();
    ps_tape *t1 = NULL, *t2 = NULL;
    ps_grads *g1 = ps_grads_create(sh, &err), *g2 = ps_grads_create(ref, &err);
    OKE(ps_model_forward_range(sh, 0, 0, x, n, 1, NULL, 0, o1, &t1, NULL, &err));
    OKE(ps_model_forward_range(ref, 0, 0, x, n, 1, NULL, 0, o2, &t2, NULL, &err));
    char what[160];
    snprintf(what, sizeof what, "%s output", label);
    check_scaled(what, o1, o2, (size_t)(n * out_k), 1e-6);
    OKE(ps_model_backward_acc(sh, t1, gout, gi1, g1, &err));
    OKE(ps_model_backward_acc(ref, t2, gout, gi2, g2, &err));
    if (in_f32) {
        snprintf(what, sizeof what, "%s input gradient", label);
        check_scaled(what, gi1, gi2, (size_t)(n * in_k), 1e-6);
    }
    for (int k = 0; k < nmap; k++) {
        float *got = grad_of(sh, g1, map[k].shared);
        int i = ps_model_find_param(sh, map[k].shared);
        if (!got || i < 0) continue;
        int64_t numel = ps_model_param(sh, i)->numel;
        float *want = calloc((size_t)numel, sizeof(float));
        for (int s = 0; s < 3 && map[k].ref[s]; s++) {
            float *g = grad_of(ref, g2, map[k].ref[s]);
            for (int64_t e = 0; g && e < numel; e++) want[e] += g[e];
            free(g);
        }
        snprintf(what, sizeof what, "%s gradient of %s (sum over its sites)", label, map[k].shared);
        check_scaled(what, got, want, (size_t)numel, 1e-5);
        free(got);
        free(want);
    }
    ps_tape_free(t1);
    ps_tape_free(t2);
    ps_grads_free(g1);
    ps_grads_free(g2);
    free(o1); free(o2); free(gout); free(gi1); free(gi2);
}

/* psd's combined backward of two parts (the batched-parts path) against
 * each part alone: every part's gradients its own, sums over the sites. */
static void compare_group(const char *label, ps_model *m, const void *x, int n1, int n2, size_t in_bytes,
                          int64_t out_k) {
    ps_err err = {0};
    CHECK_MSG(ps_model_can_group(m, 0, 0), "%s: not combinable", label);
    const void *xs[2] = {x, (const char *)x + (size_t)n1 * in_bytes};
    const int ns[2] = {n1, n2};
    const uint64_t seeds[2] = {1, 2};
    float *outs[2], *gout[2];
    ps_tape *tapes[2] = {NULL, NULL}, *alone_t[2] = {NULL, NULL};
    ps_grads *accs[2], *alone[2];
    for (int i = 0; i < 2; i++) {
        outs[i] = malloc((size_t)(ns[i] * out_k) * sizeof(float));
        gout[i] = malloc((size_t)(ns[i] * out_k) * sizeof(float));
        for (int64_t e = 0; e < ns[i] * out_k; e++) gout[i][e] = frand();
        accs[i] = ps_grads_create(m, &err);
        alone[i] = ps_grads_create(m, &err);
    }
    OKE(ps_model_forward_group(m, 0, 0, 2, xs, ns, seeds, outs, tapes, NULL, &err));
    float *gin[2] = {NULL, NULL};
    OKE(ps_model_backward_group(m, 2, tapes, (const float *const *)gout, gin, accs, &err));
    for (int i = 0; i < 2; i++) {
        OKE(ps_model_forward_range(m, 0, 0, xs[i], ns[i], 1, NULL, seeds[i], outs[i], &alone_t[i], NULL, &err));
        OKE(ps_model_backward_acc(m, alone_t[i], gout[i], NULL, alone[i], &err));
    }
    char what[160];
    for (int p = 0; p < ps_model_num_params(m); p++) {
        const ps_param_info *pi = ps_model_param(m, p);
        float *a = malloc((size_t)pi->numel * sizeof(float)), *b = malloc((size_t)pi->numel * sizeof(float));
        for (int i = 0; i < 2; i++) {
            OKE(ps_grads_get(m, accs[i], p, a, &err));
            OKE(ps_grads_get(m, alone[i], p, b, &err));
            snprintf(what, sizeof what, "%s combined part %d %s", label, i, pi->name);
            check_scaled(what, a, b, (size_t)pi->numel, 1e-5);
        }
        free(a);
        free(b);
    }
    for (int i = 0; i < 2; i++) {
        ps_tape_free(tapes[i]);
        ps_tape_free(alone_t[i]);
        ps_grads_free(accs[i]);
        ps_grads_free(alone[i]);
        free(outs[i]);
        free(gout[i]);
    }
}

static const char *TWICE =
    "name: twice\nstages:\n  - name: s\n    input: {shape: [6]}\n    nodes:\n"
    "      - {name: enc, kind: Linear, in_features: 6, out_features: 6}\n"
    "      - {name: act, kind: Tanh, input: input}\n"
    "      - {name: enc2, kind: Linear, in_features: 6, out_features: 6, input: act, share: enc}\n"
    "      - {name: out, kind: Add, inputs: [enc, enc2]}\n";
static const char *TWICE_REF =
    "name: twice_ref\nstages:\n  - name: s\n    input: {shape: [6]}\n    nodes:\n"
    "      - {name: enc, kind: Linear, in_features: 6, out_features: 6}\n"
    "      - {name: act, kind: Tanh, input: input}\n"
    "      - {name: enc2, kind: Linear, in_features: 6, out_features: 6, input: act}\n"
    "      - {name: out, kind: Add, inputs: [enc, enc2]}\n";
/* ALBERT-style: one block applied three times in a chain */
static const char *CHAIN =
    "name: chain\nstages:\n  - name: s\n    input: {shape: [5]}\n    nodes:\n"
    "      - {name: block, kind: Linear, in_features: 5, out_features: 5}\n"
    "      - {name: a1, kind: Tanh}\n"
    "      - {name: block_1, kind: Linear, in_features: 5, out_features: 5, share: block}\n"
    "      - {name: a2, kind: Tanh}\n"
    "      - {name: block_2, kind: Linear, in_features: 5, out_features: 5, share: block}\n";
static const char *CHAIN_REF =
    "name: chain_ref\nstages:\n  - name: s\n    input: {shape: [5]}\n    nodes:\n"
    "      - {name: block, kind: Linear, in_features: 5, out_features: 5}\n"
    "      - {name: a1, kind: Tanh}\n"
    "      - {name: block_1, kind: Linear, in_features: 5, out_features: 5}\n"
    "      - {name: a2, kind: Tanh}\n"
    "      - {name: block_2, kind: Linear, in_features: 5, out_features: 5}\n";
/* one attention module applied twice (its kind computes each part's parameter gradients in one call) */
static const char *ATTN =
    "name: attn\nstages:\n  - name: s\n    input: {shape: [3, 4]}\n    nodes:\n"
    "      - {name: att, kind: MultiheadAttention, embed_dim: 4, num_heads: 2, batch_first: true}\n"
    "      - {name: t, kind: Tanh}\n"
    "      - {name: att_1, kind: MultiheadAttention, embed_dim: 4, num_heads: 2, batch_first: true, share: att}\n";
static const char *ATTN_REF =
    "name: attn_ref\nstages:\n  - name: s\n    input: {shape: [3, 4]}\n    nodes:\n"
    "      - {name: att, kind: MultiheadAttention, embed_dim: 4, num_heads: 2, batch_first: true}\n"
    "      - {name: t, kind: Tanh}\n"
    "      - {name: att_1, kind: MultiheadAttention, embed_dim: 4, num_heads: 2, batch_first: true}\n";
static const char *TIED =
    "name: tied\nstages:\n  - name: s\n    input: {shape: [4], dtype: int64}\n    nodes:\n"
    "      - {name: encoder, kind: Embedding, num_embeddings: 10, embedding_dim: 6}\n"
    "      - {name: decoder, kind: Linear, in_features: 6, out_features: 10, tie: {weight: encoder.weight}}\n";
static const char *TIED_REF =
    "name: tied_ref\nstages:\n  - name: s\n    input: {shape: [4], dtype: int64}\n    nodes:\n"
    "      - {name: encoder, kind: Embedding, num_embeddings: 10, embedding_dim: 6}\n"
    "      - {name: decoder, kind: Linear, in_features: 6, out_features: 10}\n";

/* One BatchNorm called at two sites (a siamese encoder's BatchNorm, a
 * recurrent-depth block): one set of buffers, which both sites' training
 * forwards update in forward order. Listed in file order bn_1 (the second
 * call) before bn, so a fold in file order rather than forward order gives
 * other running statistics. */
static const char *BNSH =
    "name: bnsh\nstages:\n  - name: s\n    input: {shape: [6]}\n    nodes:\n"
    "      - {name: bn_1, kind: BatchNorm1d, num_features: 4, input: t, share: bn}\n"
    "      - {name: lin, kind: Linear, in_features: 6, out_features: 4, input: input}\n"
    "      - {name: bn, kind: BatchNorm1d, num_features: 4, input: lin}\n"
    "      - {name: t, kind: Tanh, input: bn}\n"
    "      - {name: out, kind: Add, inputs: [bn, bn_1]}\n";
/* each site its own BatchNorm; momentum 1: a step leaves each site's batch statistics in its buffers */
static const char *BNSH_REF =
    "name: bnsh_ref\nstages:\n  - name: s\n    input: {shape: [6]}\n    nodes:\n"
    "      - {name: bn_1, kind: BatchNorm1d, num_features: 4, momentum: 1.0, input: t}\n"
    "      - {name: lin, kind: Linear, in_features: 6, out_features: 4, input: input}\n"
    "      - {name: bn, kind: BatchNorm1d, num_features: 4, momentum: 1.0, input: lin}\n"
    "      - {name: t, kind: Tanh, input: bn}\n"
    "      - {name: out, kind: Add, inputs: [bn, bn_1]}\n";

static void *buffer_values(ps_model *m, const char *name) {
    ps_err err = {0};
    int i = ps_model_find_buffer(m, name);
    CHECK_MSG(i >= 0, "no buffer %s", name);
    if (i < 0) return NULL;
    const ps_buffer_info *b = ps_model_buffer(m, i);
    void *v = malloc((size_t)(b->numel ? b->numel : 1) * 8);
    OKE(ps_model_get_buffer(m, i, v, &err));
    return v;
}

/* One training forward and step of each model on x (n samples). */
static void train_step(ps_model *m, const float *x, int n, int64_t out_k) {
    ps_err err = {0};
    float *out = malloc((size_t)(n * out_k) * sizeof(float)), *gout = malloc((size_t)(n * out_k) * sizeof(float));
    for (int64_t i = 0; i < n * out_k; i++) gout[i] = frand();
    ps_tape *t = NULL;
    ps_grads *g = ps_grads_create(m, &err);
    OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 0, out, &t, NULL, &err));
    if (t) OKE(ps_model_backward_acc(m, t, gout, NULL, g, &err));
    uint64_t v = 0;
    OKE(ps_model_step_grads(m, g, &v, &err));
    ps_tape_free(t);
    ps_grads_free(g);
    free(out);
    free(gout);
}

/* The batch statistics of each site of ref (momentum 1, the shared
 * model's parameters at each site) for x: one step of ref, its buffers. */
static void site_stats(ps_model *ref, ps_model *sh, const float *x, int n, float mean[2][4], float var[2][4]) {
    const char *own[4] = {"lin.weight", "lin.bias", "bn.weight", "bn.bias"};
    for (int k = 0; k < 4; k++) copy_param(ref, own[k], sh, own[k]);
    copy_param(ref, "bn_1.weight", sh, "bn.weight");
    copy_param(ref, "bn_1.bias", sh, "bn.bias");
    train_step(ref, x, n, 4);
    for (int s = 0; s < 2; s++) {
        float *m = buffer_values(ref, s ? "bn_1.running_mean" : "bn.running_mean");
        float *v = buffer_values(ref, s ? "bn_1.running_var" : "bn.running_var");
        for (int c = 0; c < 4 && m && v; c++) { mean[s][c] = m[c]; var[s][c] = v[c]; }
        free(m);
        free(v);
    }
}

/* Two forwards of one context before its step (seq 0 and 1, their
 * backwards in reverse order): four folds into the one set, forward by
 * forward (seq order), site by site within each, as PyTorch's two calls of
 * the model update them. */
static void test_batchnorm_seq(const char *backend, ps_model *sh, ps_model *ref) {
    ps_err err = {0};
    enum { N = 7 };
    float x[2][N * 6], mean[2][2][4], var[2][2][4];
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < N * 6; i++) x[f][i] = (1.0f + (float)f) * frand() - 0.3f * (float)f;
    float *rm0 = buffer_values(sh, "bn.running_mean"), *rv0 = buffer_values(sh, "bn.running_var");
    int64_t *nbt0 = buffer_values(sh, "bn.num_batches_tracked");
    for (int f = 0; f < 2; f++) site_stats(ref, sh, x[f], N, mean[f], var[f]);
    ps_tape *t[2] = {NULL, NULL};
    ps_grads *g = ps_grads_create(sh, &err);
    float out[N * 4], gout[N * 4];
    for (int i = 0; i < N * 4; i++) gout[i] = frand();
    for (int f = 0; f < 2; f++) {
        OKE(ps_model_forward_range(sh, 0, 0, x[f], N, 1, NULL, 0, out, &t[f], NULL, &err));
        if (t[f]) ps_tape_set_key(t[f], 77, (uint32_t)f);
    }
    for (int f = 1; f >= 0; f--)
        if (t[f]) OKE(ps_model_backward_acc(sh, t[f], gout, NULL, g, &err));
    uint64_t v = 0;
    OKE(ps_model_step_grads(sh, g, &v, &err));
    float *rm = buffer_values(sh, "bn.running_mean"), *rv = buffer_values(sh, "bn.running_var");
    int64_t *nbt = buffer_values(sh, "bn.num_batches_tracked");
    if (rm0 && rv0 && nbt0 && rm && rv && nbt) {
        float wm[4], wv[4];
        for (int c = 0; c < 4; c++) {
            double a = rm0[c], b = rv0[c];
            for (int f = 0; f < 2; f++)
                for (int s = 0; s < 2; s++) {
                    a = 0.9 * a + 0.1 * mean[f][s][c];
                    b = 0.9 * b + 0.1 * var[f][s][c];
                }
            wm[c] = (float)a;
            wv[c] = (float)b;
        }
        char label[96];
        snprintf(label, sizeof label, "%s two forwards of one context: running_mean (seq, then site order)", backend);
        check_scaled(label, rm, wm, 4, 1e-5);
        snprintf(label, sizeof label, "%s two forwards of one context: running_var (seq, then site order)", backend);
        check_scaled(label, rv, wv, 4, 1e-5);
        CHECK_MSG(*nbt == *nbt0 + 4, "%s num_batches_tracked %lld after %lld and two forwards of two calls", backend,
                  (long long)*nbt, (long long)*nbt0);
    }
    for (int f = 0; f < 2; f++) ps_tape_free(t[f]);
    ps_grads_free(g);
    free(rm0); free(rv0); free(nbt0); free(rm); free(rv); free(nbt);
}

static void test_batchnorm(const char *backend) {
    ps_err err = {0};
    ps_model *sh = build("bnsh", BNSH, backend, &err), *ref = NULL;
    CHECK_MSG(sh, "%s", err.msg);
    if (sh) ref = build("bnsh_ref", BNSH_REF, backend, &err);
    CHECK_MSG(ref, "%s", err.msg);
    if (!sh || !ref) goto done;
    /* listed once, under the first call's names (PyTorch's state_dict) */
    CHECK_MSG(ps_model_num_params(sh) == 4 && ps_model_find_param(sh, "bn_1.weight") < 0,
              "%d parameters", ps_model_num_params(sh));
    CHECK_MSG(ps_model_num_buffers(sh) == 3 && ps_model_find_buffer(sh, "bn_1.running_mean") < 0 &&
              ps_model_find_buffer(sh, "bn.num_batches_tracked") >= 0, "%d buffers", ps_model_num_buffers(sh));
    CHECK_MSG(ps_model_num_def_buffers(sh) == 3, "%d definition buffers", ps_model_num_def_buffers(sh));
    const char *own[4] = {"lin.weight", "lin.bias", "bn.weight", "bn.bias"};
    for (int k = 0; k < 4; k++) copy_param(ref, own[k], sh, own[k]);
    copy_param(ref, "bn_1.weight", sh, "bn.weight");
    copy_param(ref, "bn_1.bias", sh, "bn.bias");
    enum { N = 9 };
    float x[N * 6];
    for (int i = 0; i < N * 6; i++) x[i] = 2.0f * frand() + 0.5f;
    const site_map map[4] = {{"lin.weight", {"lin.weight", NULL}}, {"lin.bias", {"lin.bias", NULL}},
                             {"bn.weight", {"bn.weight", "bn_1.weight", NULL}},
                             {"bn.bias", {"bn.bias", "bn_1.bias", NULL}}};
    char label[96];
    snprintf(label, sizeof label, "%s BatchNorm applied twice (training)", backend);
    compare(label, sh, ref, map, 4, x, N, 4, 1, 6);
    /* a step: both sites' batch statistics folded into the one set, first call first */
    train_step(sh, x, N, 4);
    train_step(ref, x, N, 4);
    float *m1 = buffer_values(ref, "bn.running_mean"), *v1 = buffer_values(ref, "bn.running_var");
    float *m2 = buffer_values(ref, "bn_1.running_mean"), *v2 = buffer_values(ref, "bn_1.running_var");
    float *rm = buffer_values(sh, "bn.running_mean"), *rv = buffer_values(sh, "bn.running_var");
    int64_t *nbt = buffer_values(sh, "bn.num_batches_tracked");
    if (m1 && v1 && m2 && v2 && rm && rv && nbt) {
        float wm[4], wv[4];
        for (int c = 0; c < 4; c++) {   /* PyTorch's momentum rule once per call: bn, then bn_1 */
            wm[c] = (float)(0.9 * (0.9 * 0.0 + 0.1 * m1[c]) + 0.1 * m2[c]);
            wv[c] = (float)(0.9 * (0.9 * 1.0 + 0.1 * v1[c]) + 0.1 * v2[c]);
        }
        snprintf(label, sizeof label, "%s shared running_mean (first call folded first)", backend);
        check_scaled(label, rm, wm, 4, 1e-5);
        snprintf(label, sizeof label, "%s shared running_var (first call folded first)", backend);
        check_scaled(label, rv, wv, 4, 1e-5);
        CHECK_MSG(*nbt == 2, "%s num_batches_tracked %lld after one step of two calls", backend, (long long)*nbt);
        /* eval: both sites normalise with the shared running statistics */
        for (int k = 0; k < 4; k++) copy_param(ref, own[k], sh, own[k]);
        copy_param(ref, "bn_1.weight", sh, "bn.weight");
        copy_param(ref, "bn_1.bias", sh, "bn.bias");
        const char *site[2] = {"bn", "bn_1"}, *suf[3] = {"running_mean", "running_var", "num_batches_tracked"};
        void *vals[3] = {rm, rv, nbt};
        for (int s2 = 0; s2 < 2; s2++)
            for (int k = 0; k < 3; k++) {
                char nm[64];
                snprintf(nm, sizeof nm, "%s.%s", site[s2], suf[k]);
                OKE(ps_model_set_buffer(ref, ps_model_find_buffer(ref, nm), vals[k], &err));
            }
        float e1[N * 4], e2[N * 4];
        OKE(ps_model_forward_range(sh, 0, 0, x, N, 0, NULL, 0, e1, NULL, NULL, &err));
        OKE(ps_model_forward_range(ref, 0, 0, x, N, 0, NULL, 0, e2, NULL, NULL, &err));
        snprintf(label, sizeof label, "%s BatchNorm applied twice (eval: the shared running statistics)", backend);
        check_scaled(label, e1, e2, N * 4, 1e-6);
    }
    free(m1); free(v1); free(m2); free(v2); free(rm); free(rv); free(nbt);
    test_batchnorm_seq(backend, sh, ref);
done:
    ps_model_free(sh);
    ps_model_free(ref);
}

static void test_twice(const char *backend) {
    ps_err err = {0};
    ps_model *sh = build("twice", TWICE, backend, &err), *ref = NULL;
    CHECK_MSG(sh, "%s", err.msg);
    if (sh) ref = build("twice_ref", TWICE_REF, backend, &err);
    CHECK_MSG(ref, "%s", err.msg);
    if (!sh || !ref) goto done;
    CHECK_MSG(ps_model_num_params(sh) == 2 && ps_model_find_param(sh, "enc2.weight") < 0,
              "enc2's parameters are listed (%d parameters)", ps_model_num_params(sh));
    CHECK(ps_model_num_weights(sh) == 42);
    for (int k = 0; k < 2; k++) {
        copy_param(ref, k ? "enc.bias" : "enc.weight", sh, k ? "enc.bias" : "enc.weight");
        copy_param(ref, k ? "enc2.bias" : "enc2.weight", sh, k ? "enc.bias" : "enc.weight");
    }
    float x[7 * 6];
    for (int i = 0; i < 7 * 6; i++) x[i] = frand();
    const site_map map[2] = {{"enc.weight", {"enc.weight", "enc2.weight", NULL}},
                             {"enc.bias", {"enc.bias", "enc2.bias", NULL}}};
    char label[64];
    snprintf(label, sizeof label, "%s applied twice", backend);
    compare(label, sh, ref, map, 2, x, 7, 6, 1, 6);
    snprintf(label, sizeof label, "%s applied twice", backend);
    compare_group(label, sh, x, 3, 4, 6 * sizeof(float), 6);
    /* one storage: a step moves the value both sites read */
    ps_tape *t = NULL;
    ps_grads *g = ps_grads_create(sh, &err);
    float out[7 * 6], gout[7 * 6], before[7 * 6], after[7 * 6];
    for (int i = 0; i < 7 * 6; i++) gout[i] = 1.0f;
    OKE(ps_model_forward_range(sh, 0, 0, x, 7, 1, NULL, 0, before, &t, NULL, &err));
    OKE(ps_model_backward_acc(sh, t, gout, NULL, g, &err));
    uint64_t v = 0;
    OKE(ps_model_step_grads(sh, g, &v, &err));
    OKE(ps_model_forward_range(sh, 0, 0, x, 7, 0, NULL, 0, after, NULL, NULL, &err));
    int64_t n = 0;
    float *w = param_values(sh, "enc.weight", &n), *b = param_values(sh, "enc.bias", &n);
    for (int s = 0; s < 7 && w && b; s++)   /* out = W x + b + W tanh(x) + b with the stepped W, b */
        for (int o = 0; o < 6; o++) {
            double want = 2.0 * b[o];
            for (int i = 0; i < 6; i++) want += w[o * 6 + i] * (x[s * 6 + i] + tanh(x[s * 6 + i]));
            out[s * 6 + o] = (float)want;
        }
    check_scaled("after a step, both sites read the stepped weights", after, out, 7 * 6, 1e-5);
    CHECK_MSG(memcmp(before, after, sizeof after), "the step did not move the shared weights");
    free(w);
    free(b);
    ps_tape_free(t);
    ps_grads_free(g);
done:
    ps_model_free(sh);
    ps_model_free(ref);
}

static void test_chain(const char *backend) {
    ps_err err = {0};
    ps_model *sh = build("chain", CHAIN, backend, &err), *ref = NULL;
    CHECK_MSG(sh, "%s", err.msg);
    if (sh) ref = build("chain_ref", CHAIN_REF, backend, &err);
    CHECK_MSG(ref, "%s", err.msg);
    if (!sh || !ref) goto done;
    CHECK(ps_model_num_params(sh) == 2);
    const char *sites[3] = {"block", "block_1", "block_2"};
    for (int s = 0; s < 3; s++)
        for (int k = 0; k < 2; k++) {
            char dst[64];
            snprintf(dst, sizeof dst, "%s.%s", sites[s], k ? "bias" : "weight");
            copy_param(ref, dst, sh, k ? "block.bias" : "block.weight");
        }
    float x[5 * 5];
    for (int i = 0; i < 25; i++) x[i] = frand();
    const site_map map[2] = {{"block.weight", {"block.weight", "block_1.weight", "block_2.weight"}},
                             {"block.bias", {"block.bias", "block_1.bias", "block_2.bias"}}};
    char label[64];
    snprintf(label, sizeof label, "%s block applied three times", backend);
    compare(label, sh, ref, map, 2, x, 5, 5, 1, 5);
    compare_group(label, sh, x, 2, 3, 5 * sizeof(float), 5);
done:
    ps_model_free(sh);
    ps_model_free(ref);
}

static void test_attention(const char *backend) {
    ps_err err = {0};
    ps_model *sh = build("attn", ATTN, backend, &err), *ref = NULL;
    CHECK_MSG(sh, "%s", err.msg);
    if (sh) ref = build("attn_ref", ATTN_REF, backend, &err);
    CHECK_MSG(ref, "%s", err.msg);
    if (!sh || !ref) goto done;
    site_map map[MAXP];
    char names[MAXP][2][96];
    int np = ps_model_num_params(sh);
    CHECK(np == ps_model_num_params(ref) / 2);
    for (int i = 0; i < np && i < MAXP; i++) {
        const char *nm = ps_model_param(sh, i)->name;   /* att.<suffix> */
        snprintf(names[i][0], sizeof names[i][0], "%s", nm);
        snprintf(names[i][1], sizeof names[i][1], "att_1%s", nm + 3);
        copy_param(ref, names[i][0], sh, nm);
        copy_param(ref, names[i][1], sh, nm);
        map[i] = (site_map){nm, {names[i][0], names[i][1], NULL}};
    }
    float x[6 * 12];
    for (int i = 0; i < 72; i++) x[i] = frand();
    char label[64];
    snprintf(label, sizeof label, "%s attention applied twice", backend);
    compare(label, sh, ref, map, np, x, 6, 12, 1, 12);
    compare_group(label, sh, x, 2, 4, 12 * sizeof(float), 12);
done:
    ps_model_free(sh);
    ps_model_free(ref);
}

static void test_tied(const char *backend) {
    ps_err err = {0};
    ps_model *sh = build("tied", TIED, backend, &err), *ref = NULL;
    CHECK_MSG(sh, "%s", err.msg);
    if (sh) ref = build("tied_ref", TIED_REF, backend, &err);
    CHECK_MSG(ref, "%s", err.msg);
    if (!sh || !ref) goto done;
    CHECK_MSG(ps_model_num_params(sh) == 2 && ps_model_find_param(sh, "decoder.weight") < 0,
              "decoder.weight is listed (%d parameters)", ps_model_num_params(sh));
    int ei = ps_model_find_param(sh, "encoder.weight");
    CHECK_MSG(ei >= 0 && !ps_model_param(sh, ei)->sparse, "a tied embedding table's gradient is dense");
    copy_param(ref, "encoder.weight", sh, "encoder.weight");
    copy_param(ref, "decoder.weight", sh, "encoder.weight");
    copy_param(ref, "decoder.bias", sh, "decoder.bias");
    int64_t ids[5 * 4];
    for (int i = 0; i < 20; i++) ids[i] = (i * 7 + 3) % 9;   /* row 9 never read: only the decoder's gradient */
    const site_map map[2] = {{"encoder.weight", {"encoder.weight", "decoder.weight", NULL}},
                             {"decoder.bias", {"decoder.bias", NULL, NULL}}};
    char label[64];
    snprintf(label, sizeof label, "%s tied embedding/decoder", backend);
    compare(label, sh, ref, map, 2, ids, 5, 4 * 10, 0, 4);
    compare_group(label, sh, ids, 2, 3, 4 * sizeof(int64_t), 4 * 10);
done:
    ps_model_free(sh);
    ps_model_free(ref);
}

/* A tied model's checkpoint holds both keys with one value and loads back;
 * an init file with the alias key is taken when it equals the owner's and
 * refused naming both when it does not. */
static void test_tied_files(void) {
    ps_err err = {0};
    ps_model *m = build("tied", TIED, "ref", &err), *m2 = NULL;
    CHECK_MSG(m, "%s", err.msg);
    if (!m) return;
    CHECK(ps_model_num_aliases(m) == 1);
    int owner = -1;
    const char *alias = ps_model_alias(m, 0, &owner);
    CHECK_MSG(alias && !strcmp(alias, "decoder.weight") && owner >= 0 &&
              !strcmp(ps_model_def_param(m, owner)->name, "encoder.weight"), "alias %s of %d", alias ? alias : "-",
              owner);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/ckpt", g_dir);
    CHECK(mkdir(dir, 0700) == 0);
    ps_ckpt_info info;
    OKE(ps_ckpt_save(m, dir, 0, 1, &info, &err));
    ps_st_file *f = ps_st_read(info.path, &err);
    CHECK_MSG(f, "%s", err.msg);
    const ps_st_tensor *a = f ? ps_st_find(f, "decoder.weight") : NULL, *o = f ? ps_st_find(f, "encoder.weight") : NULL;
    CHECK_MSG(a && o && a->bytes == o->bytes && !memcmp(a->data, o->data, a->bytes),
              "the checkpoint holds decoder.weight equal to encoder.weight");
    const char *pm = f ? ps_st_metadata(f, "psd.params") : NULL;
    CHECK_MSG(pm && strstr(pm, "decoder.weight@s:10,6"), "psd.params lists the alias: %s", pm ? pm : "(none)");
    m2 = build("tied", TIED, "ref", &err);
    if (m2) {
        OKE(ps_ckpt_load(m2, info.path, NULL, &err));
        int64_t n1 = 0, n2 = 0;
        float *w1 = param_values(m, "encoder.weight", &n1), *w2 = param_values(m2, "encoder.weight", &n2);
        CHECK(w1 && w2 && n1 == n2 && !memcmp(w1, w2, (size_t)n1 * sizeof(float)));
        free(w1);
        free(w2);
    }
    /* init files: the state_dict of PyTorch's tied module, then one whose alias differs */
    if (f) {
        ps_st_tensor t[4];
        int k = 0;
        for (size_t i = 0; i < ps_st_count(f) && k < 4; i++) t[k++] = *ps_st_get(f, i);
        char path[300];
        snprintf(path, sizeof path, "%s/init.safetensors", g_dir);
        const char *meta[] = {NULL};
        OKE(ps_st_write(path, t, (size_t)k, meta, &err));
        if (m2) OKE(ps_ckpt_init_from(m2, path, &err));
        float *other = malloc(a->bytes);
        memcpy(other, a->data, a->bytes);
        other[5] += 1.0f;
        for (int i = 0; i < k; i++)
            if (!strcmp(t[i].name, "decoder.weight")) t[i].data = other;
        OKE(ps_st_write(path, t, (size_t)k, meta, &err));
        ps_status rc = m2 ? ps_ckpt_init_from(m2, path, &err) : PS_OK;
        CHECK_MSG(rc == PS_ERR_INVALID_ARGUMENT && strstr(err.msg, "tensor 'decoder.weight' differs from "
                                                          "'encoder.weight'"), "%s", err.msg);
        free(other);
    }
    ps_st_free(f);
    ps_model_free(m);
    ps_model_free(m2);
}

/* A refused model: the error names the file's line and what. */
static void refused(const char *name, const char *text, const char *want1, const char *want2) {
    ps_err err = {0};
    ps_model *m = build("bad", text, "ref", &err);
    CHECK_MSG(!m, "%s: accepted", name);
    ps_model_free(m);
    CHECK_MSG(err.code == PS_ERR_INVALID_ARGUMENT, "%s: code %d", name, err.code);
    CHECK_MSG(strstr(err.msg, want1) && (!want2 || strstr(err.msg, want2)), "%s: '%s' lacks '%s' / '%s'", name,
              err.msg, want1, want2 ? want2 : "");
}

#define HEAD "name: bad\nstages:\n  - name: s\n    input: {shape: [6]}\n    nodes:\n"

static void test_refusals(void) {
    refused("shape", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 4}\n"
                          "      - {name: b, kind: Linear, in_features: 4, out_features: 4, share: a}\n",
            "bad.yaml:7: node 'b' (Linear): line 7: b.weight (4, 4) uses a.weight (4, 6) of node 'a' (Linear, line 6)",
            "one shape");
    refused("kind", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 6}\n"
                         "      - {name: b, kind: Conv1d, in_channels: 6, out_channels: 6, kernel_size: 1, share: a}\n",
            "bad.yaml:7: node 'b' (Conv1d): share: 'a' (line 6) is a Linear", NULL);
    refused("missing", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 6, share: zz}\n",
            "bad.yaml:6: node 'a': share: 'zz' is not a node of the model", NULL);
    refused("self", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 6, share: a}\n",
            "bad.yaml:6: node 'a': share names the node itself", NULL);
    refused("chain", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 6}\n"
                          "      - {name: b, kind: Linear, in_features: 6, out_features: 6, share: a}\n"
                          "      - {name: c, kind: Linear, in_features: 6, out_features: 6, share: b}\n",
            "bad.yaml:8: node 'c': share: 'b' (line 7) uses the parameters of 'a' itself", "name the owner 'a'");
    refused("cycle", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 6, tie: {weight: b.weight}}\n"
                          "      - {name: b, kind: Linear, in_features: 6, out_features: 6, tie: {weight: a.weight}}\n",
            "bad.yaml:6: node 'a': tie.weight: b.weight is tied to a.weight itself (line 7)", NULL);
    refused("stage", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 6}\n"
                          "  - name: t\n    nodes:\n"
                          "      - {name: b, kind: Linear, in_features: 6, out_features: 6, share: a}\n",
            "bad.yaml:9: node 'b' (stage 't'): share: 'a' (line 6) is in stage 's'", "within a stage only");
    refused("buffers", HEAD "      - {name: a, kind: BatchNorm1d, num_features: 6}\n"
                            "      - {name: b, kind: BatchNorm1d, num_features: 6, track_running_stats: false, "
                            "share: a}\n",
            "bad.yaml:7: node 'b' (BatchNorm1d): line 7: share: 'a' (line 6) has 3 buffers (running_mean, ...), "
            "this node 0", NULL);
    refused("momentum", HEAD "      - {name: a, kind: BatchNorm1d, num_features: 6}\n"
                             "      - {name: b, kind: BatchNorm1d, num_features: 6, momentum: 0.2, share: a}\n",
            "bad.yaml:7: node 'b' (BatchNorm1d): line 7: share: 'a' (line 6) updates the buffers it lends with eps "
            "1e-05, momentum 0.1", "momentum 0.2");
    refused("suffix", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 6}\n"
                           "      - {name: b, kind: Linear, in_features: 6, out_features: 6, tie: {weight: a.wieght}}\n",
            "line 7: tie.weight: Linear 'a' (line 6) has no parameter 'wieght' (it has: weight, bias)", NULL);
    refused("noparams", HEAD "      - {name: a, kind: ReLU}\n      - {name: b, kind: ReLU, share: a}\n",
            "bad.yaml:7: node 'b' (ReLU): line 7: share: ReLU has no parameters to share", NULL);
    refused("both", HEAD "      - {name: a, kind: Linear, in_features: 6, out_features: 6}\n"
                         "      - {name: b, kind: Linear, in_features: 6, out_features: 6, share: a, "
                         "tie: {bias: a.bias}}\n",
            "bad.yaml:7: node 'b': tie: with share: (line 7) every parameter is shared already", NULL);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/ps-test-shared.XXXXXX");
    if (!mkdtemp(g_dir)) return check_skip("test_shared_params", "no temporary directory");
    const char *backends[2] = {"ref", "dnnl"};
    for (int b = 0; b < 2; b++) {
        test_twice(backends[b]);
        test_chain(backends[b]);
        test_attention(backends[b]);
        test_tied(backends[b]);
        test_batchnorm(backends[b]);
    }
    test_tied_files();
    test_refusals();
    test_rmtree(g_dir);
    return check_summary("test_shared_params");
}
