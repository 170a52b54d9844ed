/* test_nn_model.c - the model API over the layer table and the registry
 * (server/nn/model.h), with properties that do not depend on the code:
 *
 *  - stage shapes of every registry model;
 *  - input gradients (ps_model_backward_acc's grad_in) vs central finite
 *    differences of L = sum(out * r) with the dropout masks held fixed;
 *  - accumulation: two forwards + two backward_acc into one ps_grads equal
 *    one forward + backward of the concatenated batch (gradients add over
 *    samples); ps_grads_add + ps_grads_scale average two contexts;
 *  - row-sparse embeddings: only the touched rows have gradients and
 *    change in the step, by exactly the dense SGD update w - lr * g;
 *    momentum with a sparse table is refused;
 *  - the step is atomic: a refused step leaves weights and version alone;
 *    a context covering one stage leaves the other stage's weights alone;
 *  - a 200-sample eval forward (run in slices) equals per-sample forwards;
 *  - Dropout2d zeroes whole planes; the conv stage's input gradient on
 *    dnnl equals ref's; one seed repeats a forward's masks, another not;
 *  - StochasticDepth (ref and dnnl), by counting: 'row' drops whole
 *    samples, about p of them over 8,000, and scales the others by
 *    1/(1-p); 'batch' drops all of a forward or none, about p of 400
 *    forwards; the backward zeroes and scales exactly the samples the
 *    forward did; a seed replays its masks, combined forwards ('row' only)
 *    draw each part's own; p 1 drops everything; eval is the identity;
 *  - AlphaDropout and FeatureAlphaDropout (ref and dnnl), by properties:
 *    each value kept (a x + b, gradient a dy) or dropped (PyTorch's
 *    constant, gradient 0), per (sample, channel) for the feature kind,
 *    about p dropped, standard-normal input keeps mean 0 and variance 1,
 *    seeds replay, combined forwards draw each part's own, eval is the
 *    identity;
 *  - RReLU in training: each negative value's slope in [lower, upper),
 *    its gradient that slope, spread over the range; seeds replay,
 *    combined forwards draw each part's own; eval is the mean slope's;
 *  - MultiheadAttention with attention dropout: the input gradient vs
 *    finite differences with a mask held fixed, a seed replays its mask,
 *    combined forwards draw each part's own, eval is the training forward
 *    at a mask of ones; a combined backward of their tapes gives each part
 *    its own backward's input and parameter gradients while running the
 *    attention's backward once (backend calls counted);
 *  - a mixed float32 input of ids and features: sliced Embeddings give the
 *    int64 model's rows, ids that are not exact ids or rows refused, the
 *    input gradient 0 at the ids;
 *  - bad input: int64 ids out of range (index and value named), stage runs
 *    that do not chain, an input gradient of int64 ids, non-finite grads;
 *  - the optimizer state (Adam): a step on the decoder alone counts only
 *    the decoder's parameters; a refused step leaves state and steps alone;
 *    set_param restarts a parameter's state (step 0, zeros);
 *    ps_model_set_optim_state puts back a snapshot exactly; momentum with
 *    adam is refused at creation.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/random.h"
#include "support/tmpdir.h"

#define OKE(call) CHECK_MSG((call) == PS_OK, "%s", err.msg)

static ps_model *make(const char *arch, const char *backend, float momentum, int nsizes, const char **keys,
                      const double *vals) {
    ps_model_opts o = {0};
    o.arch = arch;
    o.cpu_backend = backend;
    o.seed = 7;
    o.compute_threads = 2;
    o.lr = 0.1f;
    o.momentum = momentum;
    o.n_sizes = nsizes;
    for (int i = 0; i < nsizes; i++) { o.size_key[i] = keys[i]; o.size_value[i] = vals[i]; }
    ps_err err = {0};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m != NULL, "%s/%s: %s", arch, backend, err.msg);
    return m;
}

/* The model file text written to path, built on backend (seed 7, lr 0.1); NULL with err set when psd
 * refuses it (and a failed check when path cannot be written). */
static ps_model *model_from_text(const char *path, const char *backend, const char *text, ps_err *err) {
    FILE *f = fopen(path, "w");
    CHECK_MSG(f, "cannot write %s", path);
    if (!f) return NULL;
    fputs(text, f);
    fclose(f);
    ps_model_opts o = {.file = path, .cpu_backend = backend, .seed = 7, .compute_threads = 2, .lr = 0.1f};
    return ps_model_create(&o, err);
}

/* model_from_text, with a failed check when psd refuses it. */
static ps_model *model_from_text_ok(const char *path, const char *backend, const char *text) {
    ps_err err = {0};
    ps_model *m = model_from_text(path, backend, text, &err);
    CHECK_MSG(m != NULL || !err.code, "%s: %s", path, err.msg);
    return m;
}

static const char *RNN_KEYS[4] = {"ntoken", "ninp", "nhid", "dropout"};

static ps_model *make_rnn(const char *backend, int ninp, int nhid) {
    const double vals[4] = {50, ninp, nhid, 0.25};
    return make("rnn_lm", backend, 0, 4, RNN_KEYS, vals);
}

/* n masks of per-sample size k: 0 or 1/(1-p), drawn from r. */
static float *mask_random(int64_t count, float p, rng *r) {
    float *m = malloc((size_t)count * sizeof *m);
    for (int64_t i = 0; i < count; i++) m[i] = (rng_uniform(r) + 1.0f) * 0.5f < p ? 0.0f : 1.0f / (1.0f - p);
    return m;
}

static void test_stage_shapes(void) {
    ps_model *m = make("mnist_cnn", "ref", 0, 0, NULL, NULL);
    if (m) {
        CHECK(ps_model_num_stages(m) == 2);
        const ps_stage_info *c = ps_model_stage(m, 0), *f = ps_model_stage(m, 1);
        CHECK(!strcmp(c->name, "conv") && c->in_ndim == 3 && c->in_dims[0] == 1 && c->in_dims[1] == 28 &&
              c->in_dtype == PS_DTYPE_F32 && c->out_ndim == 1 && c->out_dims[0] == 9216 && c->params == 4);
        CHECK(!strcmp(f->name, "fc") && f->in_ndim == 1 && f->in_dims[0] == 9216 && f->out_dims[0] == 10);
        CHECK(ps_model_find_stage(m, "fc") == 1 && ps_model_find_stage(m, "emb") == -1);
        CHECK(ps_model_stage(m, 2) == NULL);
        ps_model_free(m);
    }
    m = make("cartpole_policy", "ref", 0, 0, NULL, NULL);
    if (m) {
        const ps_stage_info *p = ps_model_stage(m, 0);
        CHECK(ps_model_num_stages(m) == 1 && !strcmp(p->name, "policy") && p->in_ndim == 1 && p->in_dims[0] == 4 &&
              p->out_ndim == 1 && p->out_dims[0] == 2 && p->params == 4);
        const char *names[] = {"affine1.weight", "affine1.bias", "affine2.weight", "affine2.bias"};
        for (int i = 0; i < 4; i++) CHECK(ps_model_find_param(m, names[i]) == i);
        ps_model_free(m);
    }
    m = make_rnn("ref", 8, 6);
    if (m) {
        const ps_stage_info *e = ps_model_stage(m, 0), *d = ps_model_stage(m, 1);
        CHECK(!strcmp(e->name, "emb") && e->in_ndim == 0 && e->in_dtype == PS_DTYPE_I64 && e->out_ndim == 1 &&
              e->out_dims[0] == 8);
        CHECK(!strcmp(d->name, "decoder") && d->in_ndim == 1 && d->in_dims[0] == 6 && d->out_dims[0] == 50);
        int w = ps_model_find_param(m, "encoder.weight");
        CHECK(w == 0 && ps_model_param(m, w)->sparse && ps_model_param(m, w)->dims[0] == 50);
        CHECK(!ps_model_param(m, ps_model_find_param(m, "decoder.weight"))->sparse);
        /* init: encoder and decoder weights in U(-0.1, 0.1), decoder bias 0 */
        float buf[400];
        ps_err err = {0};
        OKE(ps_model_get_param(m, 0, buf, &err));
        float mx = 0;
        for (int i = 0; i < 400; i++) mx = fmaxf(mx, fabsf(buf[i]));
        CHECK(mx <= 0.1f && mx > 0.09f);
        OKE(ps_model_get_param(m, ps_model_find_param(m, "decoder.bias"), buf, &err));
        for (int i = 0; i < 50; i++) CHECK(buf[i] == 0.0f);
        ps_model_free(m);
    }
    /* a size the model does not have, and momentum with a sparse table */
    ps_model_opts o = {.arch = "cartpole_policy", .cpu_backend = "ref", .lr = 0.1f, .n_sizes = 1,
                       .size_key = {"ntoken"}, .size_value = {5}};
    ps_err err = {0};
    CHECK(ps_model_create(&o, &err) == NULL && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "model.sizes.ntoken: model 'cartpole_policy' has no size 'ntoken'"), "%s", err.msg);
    ps_model_opts r = {.arch = "rnn_lm", .cpu_backend = "ref", .lr = 0.1f, .momentum = 0.9f};
    CHECK(ps_model_create(&r, &err) == NULL && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "encoder.weight is a row-sparse parameter"), "%s", err.msg);
}

/* d L / d x of stages first..last vs central differences, masks fixed. */
static void fd_input_grad(const char *label, ps_model *m, int first, int last, int n, int64_t in_k, int64_t out_k,
                          const float *const *masks, rng *r) {
    ps_err err = {0};
    float *x = host_random((size_t)(n * in_k), r), *rr = host_random((size_t)(n * out_k), r);
    float *out = malloc((size_t)(n * out_k) * sizeof(float)), *gin = malloc((size_t)(n * in_k) * sizeof(float));
    ps_tape *t = NULL;
    OKE(ps_model_forward_range(m, first, last, x, n, 1, masks, 0, out, &t, NULL, &err));
    ps_grads *g = ps_grads_create(m, &err);
    if (!t || !g) return;
    OKE(ps_model_backward_acc(m, t, rr, gin, g, &err));
    float *num = malloc((size_t)(n * in_k) * sizeof(float));
    const float eps = 1e-2f;
    for (int64_t i = 0; i < n * in_k; i++) {
        double l[2];
        for (int s = 0; s < 2; s++) {
            float save = x[i];
            x[i] = save + (s ? -eps : eps);
            OKE(ps_model_forward_range(m, first, last, x, n, 1, masks, 0, out, NULL, NULL, &err));
            x[i] = save;
            l[s] = 0;
            for (int64_t j = 0; j < n * out_k; j++) l[s] += (double)out[j] * rr[j];
        }
        num[i] = (float)((l[0] - l[1]) / (2 * eps));
    }
    char what[96];
    snprintf(what, sizeof what, "%s input gradient vs finite differences", label);
    check_array(what, gin, num, (size_t)(n * in_k), 2e-3, 5e-3);
    ps_grads_free(g);
    ps_tape_free(t);
    free(x); free(rr); free(out); free(gin); free(num);
}

/* The conv stage of mnist_cnn (conv, relu, conv, max-pool, Dropout2d,
 * flatten) with a channel mask: a dropped channel is zero over its whole
 * plane, and the stage's input gradient (conv1's backward-data, through
 * the blocked-layout reorders) on dnnl equals the reference backend's.
 * (Finite differences through two ReLUs and a max-pool cross too many
 * kinks to be a sharp reference here; the ops themselves are checked
 * against finite differences in test_nn_layers.) */
static void conv_stage_grad_in(rng *r) {
    const int n = 2;
    const int64_t in_k = 784, out_k = 9216;
    float *x = host_random(n * in_k, r), *rr = host_random(n * out_k, r), *mask = mask_random(n * 64, 0.25f, r);
    float *out = malloc(n * out_k * sizeof(float)), *gin[2] = {malloc(n * in_k * sizeof(float)),
                                                                malloc(n * in_k * sizeof(float))};
    const char *backends[2] = {"ref", "dnnl"};
    const float *masks[1] = {mask};
    ps_model *m[2];
    for (int b = 0; b < 2; b++) {
        m[b] = make("mnist_cnn", backends[b], 0, 0, NULL, NULL);   /* same seed: same weights */
        if (!m[b]) return;
        ps_err err = {0};
        ps_tape *t = NULL;
        ps_grads *g = ps_grads_create(m[b], &err);
        OKE(ps_model_forward_range(m[b], 0, 0, x, n, 1, masks, 0, out, &t, NULL, &err));
        int dropped = 0, zero_planes = 0;
        for (int c = 0; c < n * 64; c++) {
            int allz = 1;
            for (int k = 0; k < 144; k++) allz &= out[c * 144 + k] == 0.0f;
            dropped += mask[c] == 0;
            zero_planes += allz && mask[c] == 0;
        }
        CHECK(dropped > 0 && zero_planes == dropped);
        if (t && g) OKE(ps_model_backward_acc(m[b], t, rr, gin[b], g, &err));
        ps_grads_free(g);
        ps_tape_free(t);
    }
    check_scaled("dnnl mnist_cnn conv stage input gradient vs ref", gin[1], gin[0], (size_t)(n * in_k), 1e-4);
    free(x); free(rr); free(out); free(gin[0]); free(gin[1]); free(mask);
    ps_model_free(m[0]); ps_model_free(m[1]);
}

/* Each forward draws its masks from its own seed: the same seed repeats
 * them, another seed does not. */
static void test_dropout_seeds(rng *r) {
    ps_model *m = make("cartpole_policy", "ref", 0, 0, NULL, NULL);
    if (!m) return;
    ps_err err = {0};
    float *x = host_random(64 * 4, r), a[128], b[128], c[128], e1[128], e2[128];
    OKE(ps_model_forward_range(m, 0, 0, x, 64, 1, NULL, 42, a, NULL, NULL, &err));
    OKE(ps_model_forward_range(m, 0, 0, x, 64, 1, NULL, 42, b, NULL, NULL, &err));
    OKE(ps_model_forward_range(m, 0, 0, x, 64, 1, NULL, 43, c, NULL, NULL, &err));
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK(memcmp(a, c, sizeof a) != 0);
    /* eval ignores the seed (no dropout) */
    OKE(ps_model_forward_range(m, 0, 0, x, 64, 0, NULL, 1, e1, NULL, NULL, &err));
    OKE(ps_model_forward_range(m, 0, 0, x, 64, 0, NULL, 2, e2, NULL, NULL, &err));
    CHECK(memcmp(e1, e2, sizeof e1) == 0);
    free(x);
    ps_model_free(m);
}

/* A one-stage model file with a StochasticDepth on (3, 2, 2) samples, in dir. */
static ps_model *make_sdepth(const char *dir, const char *backend, double p, const char *mode) {
    char path[512], text[512];
    snprintf(path, sizeof path, "%s/sd_%s_%s.yaml", dir, backend, mode);
    snprintf(text, sizeof text, "name: sd\nmax_batch: 1024\nstages:\n  - name: s\n    input: {shape: [3, 2, 2]}\n"
             "    nodes:\n      - {name: sd, kind: StochasticDepth, p: %g, mode: %s}\n", p, mode);
    return model_from_text_ok(path, backend, text);
}

/* One training forward and backward of n samples (12 values each) with
 * seed: per sample, 1 when the forward dropped it (all zero) and 0 when it
 * kept it scaled by keep; -1 (and a failed check) for anything else, or
 * for an input gradient other than dy times the same. */
static void sdepth_run(ps_model *m, const char *label, const float *x, int n, uint64_t seed, float keep,
                       int *dropped, rng *r) {
    ps_err err = {0};
    const int k = 12;
    float *out = malloc((size_t)n * k * sizeof(float)), *gin = malloc((size_t)n * k * sizeof(float));
    float *dy = host_random((size_t)n * k, r);
    ps_tape *t = NULL;
    ps_grads *g = ps_grads_create(m, &err);
    OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, seed, out, &t, NULL, &err));
    if (t && g) OKE(ps_model_backward_acc(m, t, dy, gin, g, &err));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int zero = 1, scaled = 1, gzero = 1, gscaled = 1;
        for (int j = i * k; j < (i + 1) * k; j++) {
            zero &= out[j] == 0.0f;
            scaled &= fabsf(out[j] - x[j] * keep) <= 1e-6f * fabsf(x[j] * keep);
            gzero &= gin[j] == 0.0f;
            gscaled &= fabsf(gin[j] - dy[j] * keep) <= 1e-6f * fabsf(dy[j] * keep);
        }
        dropped[i] = zero && gzero ? 1 : scaled && gscaled && !zero ? 0 : -1;
        bad += dropped[i] < 0;
    }
    CHECK_MSG(!bad, "%s: %d of %d samples neither dropped nor kept and scaled by %g (forward and backward alike)",
              label, bad, n, keep);
    ps_tape_free(t);
    ps_grads_free(g);
    free(out); free(gin); free(dy);
}

static void test_stochastic_depth(rng *r) {
    char dir[] = "/tmp/ps-test-nn-model.XXXXXX";
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    const char *backends[2] = {"ref", "dnnl"};
    const double p = 0.3;
    const float keep = 1.0f / 0.7f;
    for (int b = 0; b < 2; b++) {
        char label[96];
        /* row: 8 forwards of 1,000 samples */
        ps_model *m = make_sdepth(dir, backends[b], p, "row");
        if (!m) continue;
        snprintf(label, sizeof label, "%s StochasticDepth row", backends[b]);
        const int n = 1000;
        float *x = host_random((size_t)n * 12, r);
        int *d = malloc(n * sizeof(int)), *d2 = malloc(n * sizeof(int)), total = 0, mixed = 1;
        for (int f = 0; f < 8; f++) {
            sdepth_run(m, label, x, n, 100 + (uint64_t)f, keep, d, r);
            int in_this = 0;
            for (int i = 0; i < n; i++) in_this += d[i] == 1;
            mixed &= in_this > 0 && in_this < n;
            total += in_this;
        }
        CHECK_MSG(mixed, "%s: a forward dropped all of its samples or none", label);
        CHECK_MSG(total > 0.274 * 8 * n && total < 0.326 * 8 * n, "%s: dropped %d of %d samples, p is %g", label,
                  total, 8 * n, p);
        sdepth_run(m, label, x, n, 100, keep, d, r);   /* seed 100 again: the same samples */
        sdepth_run(m, label, x, n, 100, keep, d2, r);
        CHECK_MSG(!memcmp(d, d2, n * sizeof(int)), "%s: a seed's forward did not replay its mask", label);
        sdepth_run(m, label, x, n, 101, keep, d2, r);
        CHECK_MSG(memcmp(d, d2, n * sizeof(int)), "%s: two seeds drew the same mask", label);
        /* combined forwards (psd's batched Forwards): each part its own seed's mask */
        CHECK_MSG(ps_model_can_group(m, 0, 0), "%s: not combinable", label);
        {
            ps_err err = {0};
            const void *xs[2] = {x, x + 300 * 12};
            const int ns[2] = {300, 700};
            const uint64_t seeds[2] = {55, 56};
            float *outs[2] = {malloc(300 * 12 * sizeof(float)), malloc(700 * 12 * sizeof(float))};
            float *alone = malloc(700 * 12 * sizeof(float));
            ps_tape *tapes[2] = {NULL, NULL};
            OKE(ps_model_forward_group(m, 0, 0, 2, xs, ns, seeds, outs, tapes, NULL, &err));
            for (int i = 0; i < 2; i++) {
                OKE(ps_model_forward_range(m, 0, 0, xs[i], ns[i], 1, NULL, seeds[i], alone, NULL, NULL, &err));
                CHECK_MSG(!memcmp(alone, outs[i], (size_t)ns[i] * 12 * sizeof(float)),
                          "%s: combined forward part %d differs from its own forward", label, i);
                ps_tape_free(tapes[i]);
                free(outs[i]);
            }
            free(alone);
        }
        /* eval: the identity */
        {
            ps_err err = {0};
            float *e = malloc((size_t)n * 12 * sizeof(float));
            OKE(ps_model_forward_range(m, 0, 0, x, n, 0, NULL, 100, e, NULL, NULL, &err));
            CHECK_MSG(!memcmp(e, x, (size_t)n * 12 * sizeof(float)), "%s: eval is not the identity", label);
            free(e);
        }
        ps_model_free(m);
        /* batch: 400 forwards of 8 samples, each all or none */
        m = make_sdepth(dir, backends[b], p, "batch");
        if (!m) { free(x); free(d); free(d2); continue; }
        snprintf(label, sizeof label, "%s StochasticDepth batch", backends[b]);
        int forwards_dropped = 0, split = 0;
        for (int f = 0; f < 400; f++) {
            sdepth_run(m, label, x, 8, 1000 + (uint64_t)f, keep, d, r);
            int in_this = 0;
            for (int i = 0; i < 8; i++) in_this += d[i] == 1;
            split += in_this != 0 && in_this != 8;
            forwards_dropped += in_this == 8;
        }
        CHECK_MSG(!split, "%s: %d forwards dropped some samples and kept others", label, split);
        CHECK_MSG(forwards_dropped > 0.185 * 400 && forwards_dropped < 0.415 * 400,
                  "%s: dropped %d of 400 forwards, p is %g", label, forwards_dropped, p);
        CHECK_MSG(!ps_model_can_group(m, 0, 0), "%s: one draw for the batch, yet combinable", label);
        ps_model_free(m);
        /* p 1: every sample dropped */
        m = make_sdepth(dir, backends[b], 1.0, "row");
        if (m) {
            snprintf(label, sizeof label, "%s StochasticDepth p 1", backends[b]);
            sdepth_run(m, label, x, 64, 9, 1.0f, d, r);
            int all = 1;
            for (int i = 0; i < 64; i++) all &= d[i] == 1;
            CHECK_MSG(all, "%s: a sample was kept", label);
            ps_model_free(m);
        }
        free(x); free(d); free(d2);
    }
    test_rmtree(dir);
}

/* ---- AlphaDropout / FeatureAlphaDropout, by properties (their draws are
 * psd's, not PyTorch's): with PyTorch's constants A = 1.7580993408473766,
 * a = ((1 - p)(1 + p A^2))^-1/2, every value is either kept, a x + A a p
 * with gradient a dy, or dropped, -A a (1 - p) with gradient 0;
 * FeatureAlphaDropout decides per (sample, channel); about p of them drop;
 * standard-normal input keeps mean 0 and variance 1; a seed replays its
 * masks and combined forwards draw each part's own; eval is the identity. ---- */

static ps_model *make_alpha_drop(const char *dir, const char *backend, const char *kind, double p) {
    char path[512], text[512];
    snprintf(path, sizeof path, "%s/ad_%s_%s_%g.yaml", dir, backend, kind, p);
    snprintf(text, sizeof text, "name: ad\nmax_batch: 4096\nstages:\n  - name: s\n    input: {shape: [3, 2, 2]}\n"
             "    nodes:\n      - {name: d, kind: %s, p: %g}\n", kind, p);
    return model_from_text_ok(path, backend, text);
}

/* One training forward and backward of n samples of 12 values: kept[i] 1
 * for a kept value, 0 for a dropped one (-1 and a failed check for a value
 * that is neither, forward or backward); out receives the forward's output. */
static void alpha_drop_run(ps_model *m, const char *label, const float *x, int n, uint64_t seed, double p,
                           int *kept, float *out, rng *r) {
    ps_err err = {0};
    const int64_t count = (int64_t)n * 12;
    const double A = 1.7580993408473766, a = 1.0 / sqrt((1.0 - p) * (1.0 + p * A * A));
    float *gin = malloc((size_t)count * sizeof(float)), *dy = host_random((size_t)count, r);
    ps_tape *t = NULL;
    ps_grads *g = ps_grads_create(m, &err);
    OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, seed, out, &t, NULL, &err));
    if (t && g) OKE(ps_model_backward_acc(m, t, dy, gin, g, &err));
    int bad = 0;
    for (int64_t j = 0; j < count; j++) {
        const double keep_v = a * x[j] + A * a * p, drop_v = -A * a * (1.0 - p);
        const int k = fabs(out[j] - keep_v) <= 1e-5 * (1.0 + fabs(keep_v)) &&
                      fabs(gin[j] - a * dy[j]) <= 1e-5 * (1.0 + fabs(a * dy[j]));
        const int d = fabs(out[j] - drop_v) <= 1e-5 * (1.0 + fabs(drop_v)) && gin[j] == 0.0f;
        kept[j] = k ? 1 : d ? 0 : -1;
        bad += kept[j] < 0;
    }
    CHECK_MSG(!bad, "%s: %d of %lld values neither kept (a x + A a p, gradient a dy) nor dropped (-A a (1 - p), "
              "gradient 0)", label, bad, (long long)count);
    ps_tape_free(t);
    ps_grads_free(g);
    free(gin); free(dy);
}

static void test_alpha_dropout(rng *r) {
    char dir[] = "/tmp/ps-test-nn-model.XXXXXX";
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    const char *backends[2] = {"ref", "dnnl"}, *kinds[2] = {"AlphaDropout", "FeatureAlphaDropout"};
    const int n = 2000;
    const int64_t count = (int64_t)n * 12;
    float *x = malloc((size_t)count * sizeof(float)), *out = malloc((size_t)count * sizeof(float));
    float *out2 = malloc((size_t)count * sizeof(float));
    int *k1 = malloc((size_t)count * sizeof(int)), *k2 = malloc((size_t)count * sizeof(int));
    for (int64_t j = 0; j < count; j += 2) {   /* standard normal (Box-Muller) */
        const double u1 = (rng_uniform(r) + 1.0) / 2.0 + 1e-12, u2 = (rng_uniform(r) + 1.0) / 2.0;
        x[j] = (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
        x[j + 1] = (float)(sqrt(-2.0 * log(u1)) * sin(2.0 * M_PI * u2));
    }
    for (int b = 0; b < 2; b++)
        for (int kk = 0; kk < 2; kk++) {
            const double p = 0.2;
            char label[96];
            snprintf(label, sizeof label, "%s %s", backends[b], kinds[kk]);
            ps_model *m = make_alpha_drop(dir, backends[b], kinds[kk], p);
            if (!m) continue;
            alpha_drop_run(m, label, x, n, 100, p, k1, out, r);
            int64_t dropped = 0, split = 0;
            double mean = 0.0, var = 0.0;
            for (int64_t j = 0; j < count; j++) {
                dropped += k1[j] == 0;
                mean += out[j];
            }
            mean /= (double)count;
            for (int64_t j = 0; j < count; j++) var += (out[j] - mean) * (out[j] - mean);
            var /= (double)(count - 1);
            for (int64_t q = 0; kk == 1 && q < count / 4; q++)   /* channels of 4 values: one decision each */
                for (int v = 1; v < 4; v++) split += k1[q * 4 + v] != k1[q * 4];
            CHECK_MSG(!split, "%s: %lld channels partly dropped", label, (long long)split);
            /* 24,000 values (6,000 channels): p within 4 standard errors */
            const double units = kk ? count / 4.0 : (double)count, frac = (double)dropped / (double)count;
            CHECK_MSG(fabs(frac - p) < 4.0 * sqrt(p * (1.0 - p) / units), "%s: dropped %.4f of the values, p is %g",
                      label, frac, p);
            CHECK_MSG(fabs(mean) < 0.05 && fabs(var - 1.0) < 0.08, "%s: standard-normal input came out with mean %.4f,"
                      " variance %.4f (want 0 and 1)", label, mean, var);
            alpha_drop_run(m, label, x, n, 100, p, k2, out2, r);   /* seed 100 again: the same mask */
            CHECK_MSG(!memcmp(k1, k2, (size_t)count * sizeof(int)), "%s: a seed's forward did not replay its mask",
                      label);
            alpha_drop_run(m, label, x, n, 101, p, k2, out2, r);
            CHECK_MSG(memcmp(k1, k2, (size_t)count * sizeof(int)), "%s: two seeds drew the same mask", label);
            {   /* combined forwards (psd's batched Forwards): each part its own seed's mask */
                ps_err err = {0};
                const void *xs[2] = {x, x + 300 * 12};
                const int ns[2] = {300, 700};
                const uint64_t seeds[2] = {55, 56};
                float *outs[2] = {malloc(300 * 12 * sizeof(float)), malloc(700 * 12 * sizeof(float))};
                ps_tape *tapes[2] = {NULL, NULL};
                CHECK_MSG(ps_model_can_group(m, 0, 0), "%s: not combinable", label);
                OKE(ps_model_forward_group(m, 0, 0, 2, xs, ns, seeds, outs, tapes, NULL, &err));
                for (int i = 0; i < 2; i++) {
                    OKE(ps_model_forward_range(m, 0, 0, xs[i], ns[i], 1, NULL, seeds[i], out2, NULL, NULL, &err));
                    CHECK_MSG(!memcmp(out2, outs[i], (size_t)ns[i] * 12 * sizeof(float)),
                              "%s: combined forward part %d differs from its own forward", label, i);
                    ps_tape_free(tapes[i]);
                    free(outs[i]);
                }
            }
            {   /* eval: the identity */
                ps_err err = {0};
                OKE(ps_model_forward_range(m, 0, 0, x, n, 0, NULL, 100, out2, NULL, NULL, &err));
                CHECK_MSG(!memcmp(out2, x, (size_t)count * sizeof(float)), "%s: eval is not the identity", label);
            }
            ps_model_free(m);
        }
    free(x); free(out); free(out2); free(k1); free(k2);
    test_rmtree(dir);
}

/* A forward combining two parts (200 and 300 samples of x, k per sample;
 * seeds 55 and 56) gives each part exactly its own forward's output with
 * its seed: the draws of a dropout-stream kind are each caller's own. */
static void check_group_draws(ps_model *m, const char *kind, const char *backend, const float *x, int k,
                              float *out) {
    ps_err err = {0};
    const void *xs[2] = {x, x + 200 * k};
    const int ns[2] = {200, 300};
    const uint64_t seeds[2] = {55, 56};
    float *outs[2] = {malloc(200 * k * sizeof(float)), malloc(300 * k * sizeof(float))};
    ps_tape *tapes[2] = {NULL, NULL};
    CHECK_MSG(ps_model_can_group(m, 0, 0), "%s %s: not combinable", backend, kind);
    OKE(ps_model_forward_group(m, 0, 0, 2, xs, ns, seeds, outs, tapes, NULL, &err));
    for (int i = 0; i < 2; i++) {
        OKE(ps_model_forward_range(m, 0, 0, xs[i], ns[i], 1, NULL, seeds[i], out, NULL, NULL, &err));
        CHECK_MSG(!memcmp(out, outs[i], (size_t)ns[i] * k * sizeof(float)),
                  "%s %s: combined forward part %d differs from its own forward", backend, kind, i);
        ps_tape_free(tapes[i]);
        free(outs[i]);
    }
}

/* ---- RReLU in training, by properties: every negative value's slope
 * (out / x) in [lower, upper) and its gradient the same slope, positives
 * passed; the slopes spread over the range; a seed replays them, combined
 * forwards draw each part's own; eval is LeakyReLU((lower + upper) / 2). ---- */
static void test_rrelu(rng *r) {
    char dir[] = "/tmp/ps-test-nn-model.XXXXXX", path[600];
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    const char *backends[2] = {"ref", "dnnl"};
    const double lo = 0.1, hi = 0.4;
    const int n = 500, k = 12;
    float *x = host_random((size_t)n * k, r), *out = malloc((size_t)n * k * sizeof(float));
    float *out2 = malloc((size_t)n * k * sizeof(float)), *gin = malloc((size_t)n * k * sizeof(float));
    float *dy = host_random((size_t)n * k, r);
    for (int b = 0; b < 2; b++) {
        char text[512];
        snprintf(path, sizeof path, "%s/rrelu_%s.yaml", dir, backends[b]);
        snprintf(text, sizeof text, "name: rr\nmax_batch: 1024\nstages:\n  - name: s\n    input: {shape: [3, 2, 2]}\n"
                 "    nodes:\n      - {name: r, kind: RReLU, lower: %g, upper: %g}\n", lo, hi);
        ps_model *m = model_from_text_ok(path, backends[b], text);
        if (!m) continue;
        ps_err err = {0};
        ps_tape *t = NULL;
        ps_grads *g = ps_grads_create(m, &err);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 100, out, &t, NULL, &err));
        if (t && g) OKE(ps_model_backward_acc(m, t, dy, gin, g, &err));
        int bad = 0, neg = 0, low = 0, high = 0;
        for (int j = 0; j < n * k; j++) {
            if (x[j] > 0.0f) {
                bad += out[j] != x[j] || gin[j] != dy[j];
                continue;
            }
            if (x[j] == 0.0f) continue;
            const double s = (double)out[j] / x[j];
            neg++;
            bad += !(s >= lo - 1e-6 && s < hi + 1e-6) || fabs(gin[j] - s * dy[j]) > 1e-5 * (1.0 + fabs(dy[j]));
            low += s < lo + (hi - lo) / 4;
            high += s > hi - (hi - lo) / 4;
        }
        CHECK_MSG(!bad, "%s RReLU: %d values off their slope in [%g, %g) (forward or backward)", backends[b], bad, lo, hi);
        CHECK_MSG(low > neg / 6 && high > neg / 6, "%s RReLU: of %d slopes, %d in the lowest quarter, %d in the highest",
                  backends[b], neg, low, high);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 100, out2, NULL, NULL, &err));
        CHECK_MSG(!memcmp(out, out2, (size_t)n * k * sizeof(float)), "%s RReLU: a seed did not replay its slopes",
                  backends[b]);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 101, out2, NULL, NULL, &err));
        CHECK_MSG(memcmp(out, out2, (size_t)n * k * sizeof(float)), "%s RReLU: two seeds drew the same slopes",
                  backends[b]);
        check_group_draws(m, "RReLU", backends[b], x, k, out2);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 0, NULL, 100, out2, NULL, NULL, &err));   /* eval */
        int ebad = 0;
        for (int j = 0; j < n * k; j++)
            ebad += fabsf(out2[j] - (x[j] > 0.0f ? x[j] : (float)((lo + hi) / 2) * x[j])) > 1e-6f;
        CHECK_MSG(!ebad, "%s RReLU: %d eval values are not LeakyReLU(%g)'s", backends[b], ebad, (lo + hi) / 2);
        ps_tape_free(t);
        ps_grads_free(g);
        ps_model_free(m);
    }
    free(x); free(out); free(out2); free(gin); free(dy);
    test_rmtree(dir);
}

/* Backend calls of the attention's backward, counted by a spy in the
 * stage backend's ops table: one softmax_backward and four matmuls per
 * backward call of the attention. */
static int g_softmax_bwd, g_matmul;
static const ps_backend_ops *g_real_ops;

static ps_status spy_softmax_backward(void *impl, int64_t rows, int cols, const float *y, const float *dy, float *dx,
                                      ps_err *err) {
    g_softmax_bwd++;
    return g_real_ops->softmax_backward(impl, rows, cols, y, dy, dx, err);
}

static ps_status spy_matmul(void *impl, const ps_matmul_desc *d, const float *a, const float *b, float *c,
                            ps_err *err) {
    g_matmul++;
    return g_real_ops->matmul(impl, d, a, b, c, err);
}

/* The combined backward of a combined forward's tapes (psd's batched
 * Backwards) against each tape's own backward: each part's input gradient
 * and its own parameter gradients (ref: bit for bit; dnnl within 1e-6 x
 * max), and the attention's backward computed once for all the parts -
 * one softmax backward and four matmuls, where the parts' own backwards
 * take one and four each (it once ran once per part and once more). */
static void attention_backward_group(const char *label, ps_model *m, int bk, ps_tape *const *tapes, const int *ns,
                                     int64_t per, rng *r) {
    ps_err err = {0};
    float *gout[2], *gin[2], *gin_alone = malloc((size_t)(ns[0] + ns[1]) * per * sizeof(float));
    ps_grads *accs[2], *alone[2];
    for (int i = 0; i < 2; i++) {
        gout[i] = host_random((size_t)(ns[i] * per), r);
        gin[i] = malloc((size_t)(ns[i] * per) * sizeof(float));
        accs[i] = ps_grads_create(m, &err);
        alone[i] = ps_grads_create(m, &err);
    }
    ps_backend *be = (ps_backend *)ps_model_stage_backend(m, 0);
    ps_backend_ops spy = *be->ops;
    g_real_ops = be->ops;
    spy.softmax_backward = spy_softmax_backward;
    spy.matmul = spy_matmul;
    be->ops = &spy;
    g_softmax_bwd = g_matmul = 0;
    OKE(ps_model_backward_group(m, 2, tapes, (const float *const *)gout, gin, accs, &err));
    int sm_group = g_softmax_bwd, mm_group = g_matmul;
    g_softmax_bwd = g_matmul = 0;
    for (int i = 0; i < 2; i++)
        OKE(ps_model_backward_acc(m, tapes[i], gout[i], gin_alone + (i ? ns[0] * per : 0), alone[i], &err));
    be->ops = g_real_ops;
    CHECK_MSG(sm_group == 1 && mm_group == 4, "%s: the combined backward ran %d softmax backwards and %d matmuls, "
              "not the attention's backward once (1 and 4)", label, sm_group, mm_group);
    CHECK_MSG(g_softmax_bwd == 2 && g_matmul == 8, "%s: the parts' own backwards ran %d softmax backwards and %d "
              "matmuls (2 and 8)", label, g_softmax_bwd, g_matmul);
    const double tol = bk ? 1e-6 : 0;
    char what[200];
    for (int i = 0; i < 2; i++) {
        const float *want = gin_alone + (i ? ns[0] * per : 0);
        snprintf(what, sizeof what, "%s: combined backward part %d's input gradient", label, i);
        if (tol > 0) check_scaled(what, gin[i], want, (size_t)(ns[i] * per), tol);
        else CHECK_MSG(!memcmp(gin[i], want, (size_t)(ns[i] * per) * sizeof(float)), "%s differs", what);
        for (int j = 0; j < ps_model_num_params(m); j++) {
            const ps_param_info *pi = ps_model_param(m, j);
            float *a = malloc((size_t)pi->numel * sizeof(float)), *b = malloc((size_t)pi->numel * sizeof(float));
            OKE(ps_grads_get(m, accs[i], j, a, &err));
            OKE(ps_grads_get(m, alone[i], j, b, &err));
            snprintf(what, sizeof what, "%s: combined backward part %d's %s gradient", label, i, pi->name);
            if (tol > 0) check_scaled(what, a, b, (size_t)pi->numel, tol);
            else CHECK_MSG(!memcmp(a, b, (size_t)pi->numel * sizeof(float)), "%s differs", what);
            free(a);
            free(b);
        }
    }
    for (int i = 0; i < 2; i++) {
        free(gout[i]);
        free(gin[i]);
        ps_grads_free(accs[i]);
        ps_grads_free(alone[i]);
    }
    free(gin_alone);
}

/* MultiheadAttention with attention dropout (ref and dnnl): the input
 * gradient against finite differences with a mask held fixed; a seed
 * replays its forward's mask (the same output), another seed draws
 * another; a combined forward of two parts gives each the output of its
 * own forward (its own seed's mask); the model counts one dropout node of
 * N*H*L*L draws; eval is deterministic and the training forward at a mask
 * of ones. */
static void test_attention_dropout(rng *r) {
    char dir[] = "/tmp/ps-test-nn-model.XXXXXX";
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    const char *backends[2] = {"ref", "dnnl"};
    const int n = 3, L = 5, E = 8, H = 2;
    for (int b = 0; b < 2; b++) {
        char path[512], label[96];
        snprintf(path, sizeof path, "%s/mha_%s.yaml", dir, backends[b]);
        FILE *f = fopen(path, "w");
        CHECK_MSG(f, "cannot write %s", path);
        if (!f) continue;
        fprintf(f, "name: mha\nstages:\n  - name: s\n    input: {shape: [%d, %d]}\n    nodes:\n"
                   "      - {name: a, kind: MultiheadAttention, embed_dim: %d, num_heads: %d, dropout: 0.4, "
                   "batch_first: true}\n", L, E, E, H);
        fclose(f);
        ps_model_opts o = {.file = path, .cpu_backend = backends[b], .seed = 7, .compute_threads = 2, .lr = 0.1f};
        ps_err err = {0};
        ps_model *m = ps_model_create(&o, &err);
        CHECK_MSG(m != NULL, "%s: %s", path, err.msg);
        if (!m) continue;
        snprintf(label, sizeof label, "%s MultiheadAttention dropout", backends[b]);
        float *mask = mask_random((int64_t)n * H * L * L, 0.4f, r), *ones = malloc((size_t)n * H * L * L * sizeof(float));
        for (int i = 0; i < n * H * L * L; i++) ones[i] = 1.0f;
        const float *masks[1] = {mask};
        fd_input_grad(label, m, 0, 0, n, L * E, L * E, masks, r);
        float *x = host_random((size_t)n * L * E, r);
        float *y1 = malloc((size_t)n * L * E * sizeof(float)), *y2 = malloc((size_t)n * L * E * sizeof(float));
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 100, y1, NULL, NULL, &err));
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 100, y2, NULL, NULL, &err));
        CHECK_MSG(!memcmp(y1, y2, (size_t)n * L * E * sizeof(float)), "%s: a seed's forward did not replay its mask",
                  label);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 101, y2, NULL, NULL, &err));
        CHECK_MSG(memcmp(y1, y2, (size_t)n * L * E * sizeof(float)), "%s: two seeds drew the same mask", label);
        /* combined forwards (psd's batched Forwards): each part its own seed's mask, its own tape */
        CHECK_MSG(ps_model_can_group(m, 0, 0), "%s: not combinable", label);
        {
            const void *xs[2] = {x, x + L * E};
            const int ns[2] = {1, n - 1};
            const uint64_t seeds[2] = {100, 77};
            float *outs[2] = {malloc((size_t)L * E * sizeof(float)), malloc((size_t)(n - 1) * L * E * sizeof(float))};
            ps_tape *tapes[2] = {NULL, NULL};
            OKE(ps_model_forward_group(m, 0, 0, 2, xs, ns, seeds, outs, tapes, NULL, &err));
            for (int i = 0; i < 2; i++) {
                char what[200];
                OKE(ps_model_forward_range(m, 0, 0, xs[i], ns[i], 1, NULL, seeds[i], y2, NULL, NULL, &err));
                snprintf(what, sizeof what, "%s: combined forward part %d vs its own forward", label, i);
                check_scaled(what, outs[i], y2, (size_t)ns[i] * L * E, b ? 1e-5 : 1e-6);
            }
            attention_backward_group(label, m, b, tapes, ns, (int64_t)L * E, r);
            for (int i = 0; i < 2; i++) {
                ps_tape_free(tapes[i]);
                free(outs[i]);
            }
        }
        masks[0] = ones;
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, masks, 0, y1, NULL, NULL, &err));
        OKE(ps_model_forward_range(m, 0, 0, x, n, 0, NULL, 5, y2, NULL, NULL, &err));
        CHECK_MSG(!memcmp(y1, y2, (size_t)n * L * E * sizeof(float)),
                  "%s: the eval forward is not the training forward with a mask of ones", label);
        free(mask); free(ones); free(x); free(y1); free(y2);
        ps_model_free(m);
    }
    test_rmtree(dir);
}

static void test_input_grads(rng *r) {
    const char *backends[2] = {"ref", "dnnl"};
    for (int b = 0; b < 2; b++) {
        ps_model *m = make("cartpole_policy", backends[b], 0, 0, NULL, NULL);
        if (!m) continue;
        float *mask = mask_random(3 * 128, 0.6f, r);
        const float *masks[1] = {mask};
        char label[64];
        snprintf(label, sizeof label, "%s cartpole_policy", backends[b]);
        fd_input_grad(label, m, 0, 0, 3, 4, 2, masks, r);
        free(mask);
        ps_model_free(m);
        /* the decoder stage of the LM: dropout + linear on (n, nhid) */
        m = make_rnn(backends[b], 8, 6);
        if (!m) continue;
        mask = mask_random(4 * 6, 0.25f, r);
        masks[0] = mask;
        snprintf(label, sizeof label, "%s rnn_lm decoder", backends[b]);
        fd_input_grad(label, m, 1, 1, 4, 6, 50, masks, r);
        free(mask);
        ps_model_free(m);
    }
}

/* Gradients accumulate over forwards: (n1 + n2) samples in two tapes into
 * one ps_grads == one tape of the concatenation. The input gradient is per
 * sample: bit for bit on ref (the same arithmetic per sample), within
 * in_tol of its largest element on dnnl, whose kernels may pick their blocking and summation
 * order by the minibatch (oneDNN 2.6's AVX2 backward-data kernels on an
 * AVX2 host differ in the last bits between a batch of 5 and batches of 2
 * and 3; AVX-512 hosts matched bit for bit). */
static void check_accumulation(const char *label, ps_model *m, int n1, int n2, int64_t in_k, int64_t out_k,
                               int nmask, const int64_t *mask_k, const float *const *masks12, double in_tol,
                               rng *r) {
    ps_err err = {0};
    int n = n1 + n2;
    float *x = host_random((size_t)(n * in_k), r), *gout = host_random((size_t)(n * out_k), r);
    float *out = malloc((size_t)(n * out_k) * sizeof(float));
    float *gin = malloc((size_t)(n * in_k) * sizeof(float)), *gin2 = malloc((size_t)(n * in_k) * sizeof(float));
    ps_grads *whole = ps_grads_create(m, &err), *parts = ps_grads_create(m, &err);
    ps_tape *t = NULL, *t1 = NULL, *t2 = NULL;
    OKE(ps_model_forward_range(m, 0, ps_model_num_stages(m) - 1, x, n, 1, masks12, 0, out, &t, NULL, &err));
    OKE(ps_model_backward_acc(m, t, gout, gin, whole, &err));
    const float *m2[4];
    for (int k = 0; k < nmask; k++) m2[k] = masks12[k] + n1 * mask_k[k];
    OKE(ps_model_forward_range(m, 0, ps_model_num_stages(m) - 1, x, n1, 1, masks12, 0, out, &t1, NULL, &err));
    OKE(ps_model_forward_range(m, 0, ps_model_num_stages(m) - 1, x + n1 * in_k, n2, 1, m2, 0, out, &t2, NULL,
                               &err));
    OKE(ps_model_backward_acc(m, t1, gout, gin2, parts, &err));
    OKE(ps_model_backward_acc(m, t2, gout + n1 * out_k, gin2 + n1 * in_k, parts, &err));
    char what[128];
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        float *a = malloc((size_t)p->numel * sizeof(float)), *b = malloc((size_t)p->numel * sizeof(float));
        OKE(ps_grads_get(m, whole, i, a, &err));
        OKE(ps_grads_get(m, parts, i, b, &err));
        snprintf(what, sizeof what, "%s accumulated %s", label, p->name);
        check_scaled(what, b, a, (size_t)p->numel, 1e-5);
        free(a); free(b);
    }
    snprintf(what, sizeof what, "%s input gradient of the parts", label);
    if (in_tol == 0)
        check_array(what, gin2, gin, (size_t)(n * in_k), 0, 0);
    else
        check_scaled(what, gin2, gin, (size_t)(n * in_k), in_tol);
    /* average of two contexts = (parts + whole) / 2 = whole (both hold the same sums) */
    OKE(ps_grads_add(m, parts, whole, &err));
    OKE(ps_grads_scale(m, parts, 0.5f, &err));
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        float *a = malloc((size_t)p->numel * sizeof(float)), *b = malloc((size_t)p->numel * sizeof(float));
        OKE(ps_grads_get(m, whole, i, a, &err));
        OKE(ps_grads_get(m, parts, i, b, &err));
        snprintf(what, sizeof what, "%s add+scale %s", label, p->name);
        check_scaled(what, b, a, (size_t)p->numel, 1e-5);
        free(a); free(b);
    }
    int bad = -1;
    int64_t el = -1;
    CHECK(ps_grads_check_finite(m, whole, &bad, &el) == 1);
    CHECK(ps_grads_bytes(whole) > 0);
    ps_tape_free(t); ps_tape_free(t1); ps_tape_free(t2);
    ps_grads_free(whole); ps_grads_free(parts);
    free(x); free(gout); free(out); free(gin); free(gin2);
}

static void test_accumulation(rng *r) {
    ps_model *m = make("cartpole_policy", "ref", 0, 0, NULL, NULL);
    if (m) {
        float *mask = mask_random(8 * 128, 0.6f, r);
        const float *masks[1] = {mask};
        const int64_t mk[1] = {128};
        check_accumulation("ref cartpole_policy", m, 3, 5, 4, 2, 1, mk, masks, 0, r);
        free(mask);
        ps_model_free(m);
    }
    m = make("mnist_cnn", "dnnl", 0, 0, NULL, NULL);
    if (m) {
        float *m1 = mask_random(5 * 64, 0.25f, r), *m2 = mask_random(5 * 128, 0.5f, r);
        const float *masks[2] = {m1, m2};
        const int64_t mk[2] = {64, 128};   /* dropout2d: one value per channel */
        check_accumulation("dnnl mnist_cnn", m, 2, 3, 784, 10, 2, mk, masks, 1e-5, r);
        free(m1); free(m2);
        ps_model_free(m);
    }
}

/* Embedding: only touched rows get gradients and change; the change is
 * exactly plain SGD's. */
static void test_sparse_rows(rng *r) {
    const char *backends[2] = {"ref", "dnnl"};
    for (int b = 0; b < 2; b++) {
        ps_model *m = make_rnn(backends[b], 8, 8);
        if (!m) continue;
        ps_err err = {0};
        /* (seq 3, batch 4) ids, rows 3 and 17 repeated; two forwards */
        int64_t ids1[12] = {3, 17, 5, 3, 17, 17, 40, 3, 9, 5, 17, 3}, ids2[4] = {49, 0, 3, 22};
        float *out1 = malloc(12 * 8 * sizeof(float)), *out2 = malloc(4 * 8 * sizeof(float));
        float *g1 = host_random(12 * 8, r), *g2 = host_random(4 * 8, r);
        ps_tape *t1 = NULL, *t2 = NULL;
        ps_grads *g = ps_grads_create(m, &err);
        OKE(ps_model_forward_range(m, 0, 0, ids1, 12, 1, NULL, 11, out1, &t1, NULL, &err));
        OKE(ps_model_forward_range(m, 0, 0, ids2, 4, 1, NULL, 12, out2, &t2, NULL, &err));
        float *gin = malloc(12 * sizeof(float));
        CHECK(ps_model_backward_acc(m, t1, g1, gin, g, &err) == PS_ERR_INVALID_ARGUMENT);  /* int64 input */
        CHECK_MSG(strstr(err.msg, "int64"), "%s", err.msg);
        OKE(ps_model_backward_acc(m, t1, g1, NULL, g, &err));
        OKE(ps_model_backward_acc(m, t2, g2, NULL, g, &err));
        /* memory: 8 unique rows, not the 50-row table */
        CHECK(ps_grads_bytes(g) < 50 * 8 * sizeof(float));
        /* the expected dense gradient: sum over samples of dy * mask where ids hit */
        float dense[400] = {0}, w0[400], w1[400], gotg[400];
        int touched[50] = {0};
        float *mk1 = malloc(12 * 8 * sizeof(float)), *mk2 = malloc(4 * 8 * sizeof(float));
        /* the masks are recovered from the outputs: out = w[id] * mask */
        OKE(ps_model_get_param(m, 0, w0, &err));
        for (int i = 0; i < 12 * 8; i++) { float wv = w0[ids1[i / 8] * 8 + i % 8]; mk1[i] = wv != 0 ? out1[i] / wv : 0; }
        for (int i = 0; i < 4 * 8; i++) { float wv = w0[ids2[i / 8] * 8 + i % 8]; mk2[i] = wv != 0 ? out2[i] / wv : 0; }
        for (int i = 0; i < 12; i++) { touched[ids1[i]] = 1; for (int j = 0; j < 8; j++) dense[ids1[i] * 8 + j] += g1[i * 8 + j] * mk1[i * 8 + j]; }
        for (int i = 0; i < 4; i++) { touched[ids2[i]] = 1; for (int j = 0; j < 8; j++) dense[ids2[i] * 8 + j] += g2[i * 8 + j] * mk2[i * 8 + j]; }
        OKE(ps_grads_get(m, g, 0, gotg, &err));
        char what[96];
        snprintf(what, sizeof what, "%s encoder.weight row-sparse gradient", backends[b]);
        check_array(what, gotg, dense, 400, 1e-5, 1e-4);
        /* the decoder stage was not run: its weights must not move */
        int dw = ps_model_find_param(m, "decoder.weight");
        float d0[400], d1[400];
        OKE(ps_model_get_param(m, dw, d0, &err));
        uint64_t v = 0;
        OKE(ps_model_step_grads(m, g, &v, &err));
        CHECK(v == 1);
        OKE(ps_model_get_param(m, 0, w1, &err));
        OKE(ps_model_get_param(m, dw, d1, &err));
        CHECK(memcmp(d0, d1, sizeof d0) == 0);
        int changed_untouched = 0;
        for (int row = 0; row < 50; row++)
            for (int j = 0; j < 8; j++) {
                int k = row * 8 + j;
                if (!touched[row]) changed_untouched += w1[k] != w0[k];
                else CHECK_CLOSE(w1[k], w0[k] - 0.1f * gotg[k], 1e-7, 1e-6);  /* dense SGD on that row */
            }
        CHECK(changed_untouched == 0);
        ps_tape_free(t1); ps_tape_free(t2); ps_grads_free(g);
        free(out1); free(out2); free(g1); free(g2); free(gin); free(mk1); free(mk2);
        ps_model_free(m);
    }
}

/* A refused step changes nothing; the old per-tape API still works. */
static void test_atomic_step(rng *r) {
    ps_model *a = make("cartpole_policy", "ref", 0.9f, 0, NULL, NULL), *b = make("cartpole_policy", "ref", 0, 0, NULL, NULL);
    if (!a || !b) return;
    ps_err err = {0};
    float x[8], out[4], w0[512], w1[512];
    for (int i = 0; i < 8; i++) x[i] = rng_uniform(r);
    ps_tape *t = NULL;
    ps_grads *gb = ps_grads_create(b, &err), *empty = ps_grads_create(a, &err);
    OKE(ps_model_forward_range(b, 0, 0, x, 2, 1, NULL, 1, out, &t, NULL, &err));
    float gout[4] = {1, -1, 0.5f, 0.25f};
    OKE(ps_model_backward_acc(b, t, gout, NULL, gb, &err));
    OKE(ps_model_get_param(a, 0, w0, &err));
    uint64_t v = 99;
    CHECK(ps_model_step_grads(a, gb, &v, &err) == PS_ERR_INVALID_ARGUMENT);   /* another model's */
    CHECK(ps_model_step_grads(a, empty, &v, &err) == PS_ERR_FAILED_PRECONDITION);
    CHECK(v == 99 && ps_model_version(a) == 0);
    OKE(ps_model_get_param(a, 0, w1, &err));
    CHECK(memcmp(w0, w1, sizeof w0) == 0);
    /* a tape from an eval forward has nothing to go backward from */
    ps_tape *te = NULL;
    OKE(ps_model_forward_range(b, 0, 0, x, 2, 0, NULL, 1, out, &te, NULL, &err));
    CHECK(te == NULL);
    /* the tape answers its output again */
    float again[4];
    OKE(ps_tape_get_output(b, t, again, &err));
    OKE(ps_model_forward_range(b, 0, 0, x, 2, 1, NULL, 1, out, NULL, NULL, &err));  /* same seed */
    CHECK(memcmp(again, out, sizeof out) == 0);
    CHECK(ps_tape_first_stage(t) == 0 && ps_tape_last_stage(t) == 0 && ps_tape_batch(t) == 2);
    /* non-finite gradients are found and named */
    float nan_out[4] = {NAN, 0, 0, 0};
    ps_grads *gn = ps_grads_create(b, &err);
    OKE(ps_model_backward_acc(b, t, nan_out, NULL, gn, &err));
    int p = -1;
    int64_t el = -1;
    CHECK(ps_grads_check_finite(b, gn, &p, &el) == 0 && p >= 0 && el >= 0);
    ps_grads_free(gn);
    /* the check is one pass of squares summed in double (grads.c): the
     * largest finite floats are finite, and a norm computed (and kept)
     * before a later add does not hide a NaN the add brought */
    float big_out[4] = {3e38f, -3e38f, 3e38f, 1};
    ps_grads *gbig = ps_grads_create(b, &err);
    OKE(ps_model_backward_acc(b, t, big_out, NULL, gbig, &err));
    int pb = -1;
    int64_t eb = -1;
    int fb = ps_grads_check_finite(b, gbig, &pb, &eb);
    double sq = 0;
    OKE(ps_grads_sq_norm(b, gbig, &sq, &err));
    float *pg = calloc((size_t)ps_model_param(b, 0)->numel, sizeof *pg);
    int all_finite = 1;   /* the gradient itself, independently */
    for (int i = 0; pg && i < ps_model_num_params(b); i++) {
        float *gi = calloc((size_t)ps_model_param(b, i)->numel, sizeof *gi);
        OKE(ps_grads_get(b, gbig, i, gi, &err));
        for (int64_t k = 0; gi && k < ps_model_param(b, i)->numel; k++) all_finite &= isfinite(gi[k]) != 0;
        free(gi);
    }
    CHECK(fb == all_finite);
    CHECK(isfinite(sq) == all_finite);
    CHECK(ps_grads_check_finite(b, gb, &pb, &eb) == 1);
    OKE(ps_grads_sq_norm(b, gb, &sq, &err));   /* cached now */
    if (pg) pg[0] = NAN;
    OKE(ps_grads_add_dense(b, gb, 0, pg, &err));
    CHECK(ps_grads_check_finite(b, gb, &pb, &eb) == 0 && pb == 0 && eb == 0);
    OKE(ps_grads_sq_norm(b, gb, &sq, &err));
    CHECK(isnan(sq));
    free(pg);
    ps_grads_free(gbig);
    ps_tape_free(t);
    ps_grads_free(gb); ps_grads_free(empty);
    ps_model_free(a); ps_model_free(b);
}

/* 200-sample eval = 200 one-sample evals (slices of 64 inside). */
static void test_eval_slices(rng *r) {
    const char *arch[2] = {"cartpole_policy", "mnist_cnn"};
    const int64_t in_k[2] = {4, 784}, out_k[2] = {2, 10};
    for (int a = 0; a < 2; a++) {
        ps_model *m = make(arch[a], "dnnl", 0, 0, NULL, NULL);
        if (!m) continue;
        ps_err err = {0};
        const int n = 200;
        float *x = host_random((size_t)(n * in_k[a]), r);
        float *all = malloc((size_t)(n * out_k[a]) * sizeof(float)), *one = malloc((size_t)(n * out_k[a]) * sizeof(float));
        uint64_t ver = 5;
        OKE(ps_model_forward_range(m, 0, ps_model_num_stages(m) - 1, x, n, 0, NULL, 0, all, NULL, &ver, &err));
        CHECK(ver == 0);
        for (int i = 0; i < n; i++)
            OKE(ps_model_forward_range(m, 0, ps_model_num_stages(m) - 1, x + i * in_k[a], 1, 0, NULL, 0,
                                       one + i * out_k[a], NULL, NULL, &err));
        char what[96];
        snprintf(what, sizeof what, "%s: eval of 200 == 200 evals of 1", arch[a]);
        check_array(what, all, one, (size_t)(n * out_k[a]), 1e-6, 1e-5);
        /* training forwards stay bounded by max_batch */
        CHECK(ps_model_forward_range(m, 0, 0, x, ps_model_max_batch(m) + 1, 1, NULL, 0, all, NULL, NULL, &err) ==
              PS_ERR_INVALID_ARGUMENT);
        free(x); free(all); free(one);
        ps_model_free(m);
    }
}

static void test_bad_input(void) {
    ps_model *m = make_rnn("ref", 8, 6);
    if (!m) return;
    ps_err err = {0};
    int64_t ids[3] = {1, 50, 2};
    float out[3 * 50];
    CHECK(ps_model_forward_range(m, 0, 0, ids, 3, 0, NULL, 0, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "input[1] = 50") && strstr(err.msg, "encoder.weight"), "%s", err.msg);
    ids[1] = -3;
    CHECK(ps_model_forward_range(m, 0, 0, ids, 3, 1, NULL, 0, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "input[1] = -3"), "%s", err.msg);
    ids[1] = 49;
    /* emb (8) does not feed decoder (6) */
    CHECK(ps_model_forward_range(m, 0, 1, ids, 3, 0, NULL, 0, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "does not feed stage 'decoder'"), "%s", err.msg);
    CHECK(ps_model_forward_range(m, 1, 0, ids, 3, 0, NULL, 0, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK(ps_model_forward_range(m, 0, 2, ids, 3, 0, NULL, 0, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    ps_model_free(m);
    /* with ninp == nhid the two stages chain: ids in, logits out */
    m = make_rnn("ref", 6, 6);
    if (!m) return;
    OKE(ps_model_forward_range(m, 0, 1, ids, 3, 0, NULL, 0, out, NULL, NULL, &err));
    float e[18], d[150];
    OKE(ps_model_forward_range(m, 0, 0, ids, 3, 0, NULL, 0, e, NULL, NULL, &err));
    OKE(ps_model_forward_range(m, 1, 1, e, 3, 0, NULL, 0, d, NULL, NULL, &err));
    check_array("rnn_lm emb..decoder == emb then decoder", out, d, 150, 0, 0);
    ps_model_free(m);
}

static void test_optim_state(rng *r) {
    ps_optim_spec spec;
    ps_optim_spec_default(PS_OPTIM_ADAM, &spec);
    spec.lr = 0.01;
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = "ref", .seed = 2, .compute_threads = 1, .optim = &spec,
                       .n_sizes = 2, .size_key = {"ntoken", "nhid"}, .size_value = {20, 6}};
    ps_err err = {0};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (!m) return;
    const int np = ps_model_num_params(m), dec = ps_model_find_param(m, "decoder.weight");
    const int64_t nw = ps_model_num_weights(m);
    CHECK(ps_optim_num_state(ps_model_optim(m)) == 2 && dec > 0);
    float *w = malloc((size_t)nw * sizeof *w), *s0 = malloc((size_t)nw * sizeof *s0), *s1 = malloc((size_t)nw * sizeof *s1);
    float *w2 = malloc((size_t)nw * sizeof *w2), *t0 = malloc((size_t)nw * sizeof *t0), *t1 = malloc((size_t)nw * sizeof *t1);
    float *st[2] = {s0, s1}, *st2[2] = {t0, t1};
    int64_t steps[16] = {0}, steps2[16] = {0};
    CHECK(np <= 16);
    /* a decoder-only step: the embedding keeps step 0 and zero state */
    float *h = host_random(4 * 6, r), *gd = host_random(4 * 20, r), out[80];
    ps_tape *t = NULL;
    ps_grads *g = ps_grads_create(m, &err);
    OKE(ps_model_forward_range(m, 1, 1, h, 4, 1, NULL, 3, out, &t, NULL, &err));
    OKE(ps_model_backward_acc(m, t, gd, NULL, g, &err));
    OKE(ps_model_step_grads(m, g, NULL, &err));
    OKE(ps_model_snapshot(m, w, steps, st, NULL, &err));
    CHECK(steps[0] == 0 && steps[dec] == 1);
    int64_t off = 0, nz0 = 0, nzd = 0;
    for (int i = 0; i < np; i++) {
        for (int64_t k = 0; k < ps_model_param(m, i)->numel; k++) {
            if (i == 0) nz0 += s0[off + k] != 0 || s1[off + k] != 0;
            if (i == dec) nzd += s1[off + k] != 0;
        }
        off += ps_model_param(m, i)->numel;
    }
    CHECK(nz0 == 0 && nzd > 0);
    /* a refused step (gradients of another model) changes nothing */
    ps_model *other = ps_model_create(&o, &err);
    ps_grads *go = other ? ps_grads_create(other, &err) : NULL;
    if (go) {
        CHECK(ps_model_step_grads(m, go, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
        OKE(ps_model_snapshot(m, w2, steps2, st2, NULL, &err));
        CHECK(!memcmp(steps, steps2, sizeof steps) && !memcmp(s1, t1, (size_t)nw * sizeof *s1));
    }
    ps_grads_free(go);
    ps_model_free(other);
    /* set_param restarts the parameter's state; set_optim_state puts it back */
    const int64_t dn = ps_model_param(m, dec)->numel;
    int64_t doff = 0;
    for (int i = 0; i < dec; i++) doff += ps_model_param(m, i)->numel;
    OKE(ps_model_set_param(m, dec, w + doff, &err));
    OKE(ps_model_snapshot(m, w2, steps2, st2, NULL, &err));
    int zero = 1;
    for (int64_t k = 0; k < dn; k++) zero &= t0[doff + k] == 0 && t1[doff + k] == 0;
    CHECK(steps2[dec] == 0 && zero);
    const float *back[2] = {s0 + doff, s1 + doff};
    OKE(ps_model_set_optim_state(m, dec, steps[dec], back, &err));
    OKE(ps_model_snapshot(m, w2, steps2, st2, NULL, &err));
    CHECK(!memcmp(steps, steps2, sizeof steps) && !memcmp(s0, t0, (size_t)nw * sizeof *s0) &&
          !memcmp(s1, t1, (size_t)nw * sizeof *s1) && !memcmp(w, w2, (size_t)nw * sizeof *w));
    CHECK(ps_model_set_optim_state(m, dec, -1, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    ps_tape_free(t);
    ps_grads_free(g);
    free(h); free(gd); free(w); free(s0); free(s1); free(w2); free(t0); free(t1);
    ps_model_free(m);
    /* momentum is SGD's; Adam's is beta1 */
    spec.momentum = 0.9;
    o.arch = "cartpole_policy";
    o.n_sizes = 0;
    CHECK(ps_model_create(&o, &err) == NULL && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "momentum 0.9 is not an Adam setting"), "%s", err.msg);
}

/* A one-stage model of int64 ids (4 a sample) whose nodes are the YAML
 * lines given, on backend; NULL with the error in err when psd refuses it. */
static ps_model *make_ids_model(const char *dir, const char *backend, const char *nodes, ps_err *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/kpm.yaml", dir);
    FILE *f = fopen(path, "w");
    CHECK_MSG(f, "cannot write %s", path);
    if (!f) return NULL;
    fprintf(f, "name: kpm\nstages:\n  - name: s\n    input: {shape: [4], dtype: int64}\n    nodes:\n"
               "      - {name: emb, kind: Embedding, num_embeddings: 10, embedding_dim: 8}\n%s", nodes);
    fclose(f);
    ps_model_opts o = {.file = path, .cpu_backend = backend, .seed = 7, .compute_threads = 2, .lr = 0.1f};
    return ps_model_create(&o, err);
}

/* Key padding masks: a sample whose queries would attend to no key is
 * refused naming it (PyTorch 1.13 gives NaN), in training and eval, on
 * each CPU backend, while the other samples' forward runs; masks psd
 * cannot take are refused at the model's build naming what is wrong. */
static void test_padmask_refusals(void) {
    char dir[] = "/tmp/ps-test-kpm.XXXXXX";
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    static const char *const mha = "      - {name: pad, kind: Eq, value: 0, input: input}\n"
                                   "      - {name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
                                   "batch_first: true, causal: %s, inputs: [emb, pad]}\n";
    const char *backends[] = {"ref", "dnnl"};
    for (int b = 0; b < 2; b++) {
        for (int causal = 0; causal < 2; causal++) {
            char nodes[512];
            snprintf(nodes, sizeof nodes, mha, causal ? "true" : "false");
            ps_err err = {0};
            ps_model *m = make_ids_model(dir, backends[b], nodes, &err);
            CHECK_MSG(m, "%s", err.msg);
            if (!m) continue;
            /* sample 0 keeps 2 tokens, sample 1 none (causal: key 0 padded, key 1 kept), sample 2 one */
            int64_t ids[12] = {3, 4, 0, 0, 0, causal ? 5 : 0, 0, 0, 7, 0, 0, 0};
            float out[12 * 8];
            for (int train = 0; train < 2; train++) {
                ps_tape *t = NULL;
                ps_status st = ps_model_forward_range(m, 0, 0, ids, 3, train, NULL, 1, out, train ? &t : NULL, NULL,
                                                      &err);
                CHECK_MSG(st == PS_ERR_INVALID_ARGUMENT && strstr(err.msg, "attn") && strstr(err.msg, "sample 1") &&
                          strstr(err.msg, causal ? "masks key 0 and causal is true" : "masks all 4 keys") &&
                          strstr(err.msg, "NaN"), "%s causal %d train %d: %d %s", backends[b], causal, train, st,
                          err.msg);
                ps_tape_free(t);
                ps_err_clear(&err);
            }
            ids[4] = 2;   /* sample 1 keeps token 0: every query attends to some key */
            OKE(ps_model_forward_range(m, 0, 0, ids, 3, 0, NULL, 1, out, NULL, NULL, &err));
            int finite = 1;
            for (int i = 0; i < 12 * 8; i++) finite &= isfinite(out[i]) != 0;
            CHECK_MSG(finite, "%s causal %d: a non-finite output", backends[b], causal);
            ps_model_free(m);
        }
    }
    static const struct { const char *nodes, *want; } bad[] = {
        {"      - {name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true, "
         "inputs: [emb, emb]}\n", "the key padding mask 'emb' is (4, 8) float32 per sample; it must be (4) float32"},
        {"      - {name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true, "
         "inputs: [emb, input]}\n", "the key padding mask 'input' is (4) int64 per sample; it must be (4) float32"},
        {"      - {name: pad, kind: Eq, value: 0}\n", "Eq compares int64 token ids with a constant"},
        {"      - {name: pad, kind: Eq, value: 0.5, input: input}\n"
         "      - {name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true, "
         "inputs: [emb, pad]}\n", "0.5"},
        {"      - {name: pad, kind: Eq, value: 0, input: input}\n"
         "      - {name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true, causal: true, "
         "key_padding_mask: float, inputs: [emb, pad]}\n", "key_padding_mask 'float' with causal"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ps_err err = {0};
        ps_model *m = make_ids_model(dir, "ref", bad[i].nodes, &err);
        CHECK_MSG(!m && strstr(err.msg, bad[i].want), "refusal %zu: want '%s', got '%s'", i, bad[i].want,
                  m ? "(accepted)" : err.msg);
        ps_model_free(m);
    }
    test_rmtree(dir);
}

/* RandnLike (torch.randn_like): standard normal noise of the input's shape
 * on Dropout's stream - its moments (mean within 0.02, variance within
 * 0.03 of 1 over 6,000 draws; about 3 and 2 standard errors), a seed
 * replays it, another seed draws other noise, combined forwards give each
 * part its own seed's noise, eval draws too; no gradient reaches the input
 * (zeros). On both CPU backends. */
static void test_randn_like(rng *r) {
    char dir[] = "/tmp/ps-test-nn-model.XXXXXX", path[600];
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    const char *backends[2] = {"ref", "dnnl"};
    const int n = 500, k = 12;
    float *x = host_random((size_t)n * k, r), *out = malloc((size_t)n * k * sizeof(float));
    float *out2 = malloc((size_t)n * k * sizeof(float)), *gin = malloc((size_t)n * k * sizeof(float));
    float *dy = host_random((size_t)n * k, r);
    for (int b = 0; b < 2; b++) {
        snprintf(path, sizeof path, "%s/randn_%s.yaml", dir, backends[b]);
        ps_model *m = model_from_text_ok(path, backends[b], "name: rn\nmax_batch: 1024\nstages:\n  - name: s\n"
                                         "    input: {shape: [3, 4]}\n    nodes:\n      - {name: e, kind: RandnLike}\n");
        if (!m) continue;
        ps_err err = {0};
        ps_tape *t = NULL;
        ps_grads *g = ps_grads_create(m, &err);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 100, out, &t, NULL, &err));
        for (int j = 0; j < n * k; j++) gin[j] = 1.0f;
        if (t && g) OKE(ps_model_backward_acc(m, t, dy, gin, g, &err));
        double s1 = 0, s2 = 0;
        int nonzero = 0;
        for (int j = 0; j < n * k; j++) {
            s1 += out[j];
            s2 += (double)out[j] * out[j];
            nonzero += gin[j] != 0.0f;
        }
        const double mean = s1 / (n * k), var = s2 / (n * k) - mean * mean;
        CHECK_MSG(fabs(mean) < 0.02 && fabs(var - 1.0) < 0.03, "%s RandnLike: mean %.4f, variance %.4f of %d draws",
                  backends[b], mean, var, n * k);
        CHECK_MSG(!nonzero, "%s RandnLike: %d input gradients are not zero", backends[b], nonzero);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 100, out2, NULL, NULL, &err));
        CHECK_MSG(!memcmp(out, out2, (size_t)n * k * sizeof(float)), "%s RandnLike: a seed did not replay its noise",
                  backends[b]);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, NULL, 101, out2, NULL, NULL, &err));
        CHECK_MSG(memcmp(out, out2, (size_t)n * k * sizeof(float)), "%s RandnLike: two seeds drew the same noise",
                  backends[b]);
        check_group_draws(m, "RandnLike", backends[b], x, k, out2);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 0, NULL, 100, out2, NULL, NULL, &err));   /* eval samples too */
        s1 = s2 = 0;
        for (int j = 0; j < n * k; j++) s1 += out2[j], s2 += (double)out2[j] * out2[j];
        CHECK_MSG(fabs(s2 / (n * k) - 1.0) < 0.05, "%s RandnLike: eval's noise has second moment %.4f",
                  backends[b], s2 / (n * k));
        ps_tape_free(t);
        ps_grads_free(g);
        ps_model_free(m);
    }
    free(x); free(out); free(out2); free(gin); free(dy);
    test_rmtree(dir);
}

/* Embeddings reading slices of the ids (ids_start / ids_shape): only a
 * slice's ids are checked - one out of its table's rows refused with its
 * sample and position, ids that no node reads ignored - and a sliced table
 * cannot be sharded past its input; the values are test_kinds' (PyTorch). */
static void test_sliced_ids(void) {
    char dir[] = "/tmp/ps-test-nn-model.XXXXXX", path[600];
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    snprintf(path, sizeof path, "%s/ids.yaml", dir);
    ps_err err = {0};
    ps_model *m = model_from_text_ok(path, "ref", "name: ids\nstages:\n  - name: s\n"
        "    input: {shape: [5], dtype: int64}\n    nodes:\n"
        "      - {name: u, kind: Embedding, num_embeddings: 4, embedding_dim: 3, ids_start: 0, input: input}\n"
        "      - {name: i, kind: Embedding, num_embeddings: 10, embedding_dim: 3, ids_start: 1, ids_shape: [2], "
        "input: input}\n"
        "      - {name: f, kind: Flatten, input: i}\n"
        "      - {name: c, kind: Concat, dim: 1, inputs: [u, f]}\n");
    if (m) {
        /* ids 3 and 4 of each sample are no slice's: any value */
        int64_t x[10] = {3, 9, 0, 999, -5, 0, 2, 7, -1, 1 << 30};
        float out[18];
        OKE(ps_model_forward_range(m, 0, 0, x, 2, 0, NULL, 0, out, NULL, NULL, &err));
        x[0] = 4;   /* u's table has 4 rows */
        CHECK(ps_model_forward_range(m, 0, 0, x, 2, 0, NULL, 0, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(err.msg, "input[0][0] = 4") && strstr(err.msg, "u.weight (0..3)"), "%s", err.msg);
        x[0] = 3;
        x[7] = 10;   /* sample 1, id 1 of i's slice */
        CHECK(ps_model_forward_range(m, 0, 0, x, 2, 1, NULL, 0, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(err.msg, "input[1][2] = 10") && strstr(err.msg, "id 1 of i's slice"), "%s", err.msg);
        x[7] = -1;
        CHECK(ps_model_forward_range(m, 0, 0, x, 2, 1, NULL, 0, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(err.msg, "input[1][2] = -1"), "%s", err.msg);
        ps_model_free(m);
    }
    /* a slice past the input; a shape without a start */
    m = model_from_text(path, "ref", "name: ids\nstages:\n  - name: s\n    input: {shape: [5], dtype: int64}\n"
        "    nodes:\n      - {name: i, kind: Embedding, num_embeddings: 10, embedding_dim: 3, ids_start: 2, "
        "ids_shape: [2, 2]}\n", &err);
    CHECK(!m);
    CHECK_MSG(strstr(err.msg, "ids_start 2 and ids_shape (4 ids) read past the 5 ids of each sample"), "%s", err.msg);
    m = model_from_text(path, "ref", "name: ids\nstages:\n  - name: s\n    input: {shape: [5], dtype: int64}\n"
        "    nodes:\n      - {name: i, kind: Embedding, num_embeddings: 10, embedding_dim: 3, ids_shape: [2]}\n",
        &err);
    CHECK(!m);
    CHECK_MSG(strstr(err.msg, "ids_shape without ids_start"), "%s", err.msg);
    test_rmtree(dir);
}

/* A mixed input: int64 ids and float32 features joined as one float32 input, the ids exact integers in it.
 * Embeddings of its slices give the rows the same model of int64 ids gives (the same seeded weights), a
 * Narrow the features; a value that is not an exact id in [0, 2^24) or not a row is refused naming sample
 * and position; the input gradient is 0 at the ids and dy at the features; an Embedding of a whole float32
 * input is refused. */
static void test_mixed_ids(void) {
    char dir[] = "/tmp/ps-test-nn-model.XXXXXX", path[600];
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    snprintf(path, sizeof path, "%s/mixed.yaml", dir);
    const char *nodes =
        "      - {name: u, kind: Embedding, num_embeddings: 4, embedding_dim: 3, ids_start: 0, input: input}\n"
        "      - {name: i, kind: Embedding, num_embeddings: 10, embedding_dim: 3, ids_start: 1, ids_shape: [2], "
        "input: input}\n"
        "      - {name: f, kind: Flatten, input: i}\n";
    char text[2048];
    snprintf(text, sizeof text, "name: mixed\nstages:\n  - name: s\n    input: {shape: [5], dtype: int64}\n"
             "    nodes:\n%s      - {name: c, kind: Concat, dim: 1, inputs: [u, f]}\n", nodes);
    ps_err err = {0};
    ps_model *mi = model_from_text_ok(path, "ref", text);
    snprintf(text, sizeof text, "name: mixed\nstages:\n  - name: s\n    input: {shape: [5], dtype: float32}\n"
             "    nodes:\n%s      - {name: x, kind: Narrow, input: input, start: 3, length: 2}\n"
             "      - {name: c, kind: Concat, dim: 1, inputs: [u, f, x]}\n", nodes);
    ps_model *mf = model_from_text_ok(path, "ref", text);
    if (mi && mf) {
        int64_t ids[10] = {3, 9, 0, 0, 0, 1, 2, 7, 0, 0};
        float x[10] = {3, 9, 0, 0.25f, -1.5f, 1, 2, 7, 2.5f, 16777216.0f}, oi[18], of[22];
        OKE(ps_model_forward_range(mi, 0, 0, ids, 2, 0, NULL, 0, oi, NULL, NULL, &err));
        OKE(ps_model_forward_range(mf, 0, 0, x, 2, 0, NULL, 0, of, NULL, NULL, &err));
        for (int s = 0; s < 2; s++) {
            for (int j = 0; j < 9; j++)
                CHECK_MSG(of[s * 11 + j] == oi[s * 9 + j], "sample %d value %d: %g, the int64 model's %g", s, j,
                          of[s * 11 + j], oi[s * 9 + j]);
            CHECK(of[s * 11 + 9] == x[s * 5 + 3] && of[s * 11 + 10] == x[s * 5 + 4]);
        }
        /* training: d input is 0 at the ids, dy at the features */
        ps_tape *t = NULL;
        float dy[22], gin[10];
        for (int j = 0; j < 22; j++) dy[j] = 0.125f * (float)(j + 1);
        OKE(ps_model_forward_range(mf, 0, 0, x, 2, 1, NULL, 0, of, &t, NULL, &err));
        ps_grads *g = ps_grads_create(mf, &err);
        if (t && g) {
            OKE(ps_model_backward_acc(mf, t, dy, gin, g, &err));
            for (int s = 0; s < 2; s++)
                for (int j = 0; j < 5; j++)
                    CHECK_MSG(gin[s * 5 + j] == (j < 3 ? 0.0f : dy[s * 11 + 9 + j - 3]), "d input[%d][%d] = %g", s, j,
                              gin[s * 5 + j]);
        }
        ps_grads_free(g);
        ps_tape_free(t);
        const struct { int at; float v; const char *words; } bad[] = {
            {1, 2.5f, "input[0][1] = 2.5 (id 0 of i's slice ids_start 1) is not an id"},
            {7, -1.0f, "input[1][2] = -1 (id 1 of i's slice ids_start 1) is not an id"},
            {5, 16777216.0f, "input[1][0] = 16777216 (id 0 of u's slice ids_start 0) is not an id"},
            {0, 4.0f, "input[0][0] = 4 (id 0 of u's slice ids_start 0) is not a row of u.weight (0..3)"},
        };
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            float y[10];
            memcpy(y, x, sizeof y);
            y[bad[k].at] = bad[k].v;
            CHECK(ps_model_forward_range(mf, 0, 0, y, 2, 0, NULL, 0, of, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
            CHECK_MSG(strstr(err.msg, bad[k].words), "%s", err.msg);
        }
    }
    ps_model_free(mi);
    ps_model_free(mf);
    ps_model *m = model_from_text(path, "ref", "name: ids\nstages:\n  - name: s\n"
        "    input: {shape: [5], dtype: float32}\n    nodes:\n      - {name: i, kind: Embedding, num_embeddings: 10, embedding_dim: 3}\n", &err);
    CHECK(!m);
    CHECK_MSG(strstr(err.msg, "float32 ids only in a slice (ids_start) of a mixed input"), "%s", err.msg);
    ps_model_free(m);
    test_rmtree(dir);
}

int main(void) {
    rng r = {0x2545f4914f6cdd1dull};
    test_mixed_ids();
    test_padmask_refusals();
    test_stage_shapes();
    test_input_grads(&r);
    conv_stage_grad_in(&r);
    test_dropout_seeds(&r);
    test_accumulation(&r);
    test_sparse_rows(&r);
    test_atomic_step(&r);
    test_eval_slices(&r);
    test_bad_input();
    test_sliced_ids();
    test_optim_state(&r);
    test_stochastic_depth(&r);   /* last: the others' random data as before it */
    test_attention_dropout(&r);
    test_alpha_dropout(&r);
    test_rrelu(&r);
    test_randn_like(&r);
    return check_summary("test_nn_model");
}
