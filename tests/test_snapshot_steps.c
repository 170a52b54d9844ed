/* test_snapshot_steps - snapshot steps (model.h snapshot_steps, model.c
 * "Snapshot steps") against in-place steps:
 *  1. the same gradients give bit-identical weights and versions, step by
 *     step, with and without snapshots (SGD with momentum, so the one copy
 *     of the optimizer state is exercised too);
 *  2. while one thread steps, forwards on other threads each see exactly
 *     one version: every output equals the output the in-place model gives
 *     at the version the forward reports (a forward that read weights of
 *     two versions, or a half-written copy, would match neither);
 *  3. model snapshots taken during steps hold one version's weights;
 *  4. set_param (an administrative write, exclusive) and a row-sparse
 *     model (always in place) still work.
 * The in-place model is the reference: it runs the same kernels on the
 * same weights one call at a time. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model.h"
#include "support/model_run.h"
#include "support/random.h"

#define OKE(call) CHECK_MSG((call) == PS_OK, "%s", err.msg)
#define STEPS 12
#define BATCH 4

static ps_model *make(const char *arch, int snapshots) {
    ps_model_opts o = {0};
    o.arch = arch;
    o.cpu_backend = "dnnl";
    o.seed = 11;
    o.compute_threads = 1;
    o.lr = 0.05f;
    o.momentum = 0.9f;
    o.snapshot_steps = snapshots;
    ps_err err = {0};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m != NULL, "%s: %s", arch, err.msg);
    return m;
}

/* Gradient k of the sequence: reproducible random values per parameter. */
static ps_grads *grads_k(ps_model *m, int k) {
    ps_err err = {0};
    ps_grads *g = ps_grads_create(m, &err);
    rng r = {0x9e3779b97f4a7c15ULL * (uint64_t)(k + 1)};
    for (int i = 0; g && i < ps_model_num_params(m); i++) {
        int64_t n = ps_model_param(m, i)->numel;
        float *h = host_random((size_t)n, &r);
        for (int64_t j = 0; j < n; j++) h[j] *= 0.1f;
        OKE(ps_grads_add_dense(m, g, i, h, &err));
        free(h);
    }
    return g;
}

static float *all_weights(ps_model *m) {
    ps_err err = {0};
    float *w = malloc((size_t)ps_model_num_weights(m) * sizeof *w);
    OKE(ps_model_snapshot(m, w, NULL, NULL, NULL, &err));
    return w;
}

typedef struct fwd_log {
    ps_model *m;
    const float *x;
    int out_size;
    volatile int stop;
    int n;                     /* forwards logged */
    uint64_t version[4096];
    float *out;                /* (4096, BATCH * out_size) */
    int failed;
} fwd_log;

static void *forwards(void *p) {
    fwd_log *f = p;
    ps_err err = {0};
    while (!f->stop && f->n < 4096) {
        uint64_t v = 0;
        if (run_forward(f->m, f->x, BATCH, 0, NULL, 0, f->out + (size_t)f->n * BATCH * f->out_size, NULL, &v,
                             &err) != PS_OK) {
            f->failed = 1;
            break;
        }
        f->version[f->n++] = v;
    }
    return NULL;
}

typedef struct snap_log {
    ps_model *m;
    volatile int stop;
    int n;
    uint64_t version[256];
    float *w[256];
} snap_log;

static void *snapshots(void *p) {
    snap_log *s = p;
    ps_err err = {0};
    while (!s->stop && s->n < 256) {
        float *w = malloc((size_t)ps_model_num_weights(s->m) * sizeof *w);
        uint64_t v = 0;
        if (!w || ps_model_snapshot(s->m, w, NULL, NULL, &v, &err) != PS_OK) {
            free(w);
            break;
        }
        s->w[s->n] = w;
        s->version[s->n++] = v;
    }
    return NULL;
}

int main(void) {
    ps_err err = {0};
    ps_model *in = make("mnist_cnn", 0), *sn = make("mnist_cnn", 1);
    if (!in || !sn) return check_summary("test_snapshot_steps");
    /* per-sample sizes: the first stage's input, the last stage's output */
    const ps_stage_info *st0 = ps_model_stage(in, 0), *stl = ps_model_stage(in, ps_model_num_stages(in) - 1);
    int64_t in_numel = 1, k64 = 1;
    for (int d = 0; d < st0->in_ndim; d++) in_numel *= st0->in_dims[d];
    for (int d = 0; d < stl->out_ndim; d++) k64 *= stl->out_dims[d];
    int k = (int)k64;
    int64_t nw = ps_model_num_weights(in);
    rng r = {42};
    float *x = host_random((size_t)BATCH * (size_t)in_numel, &r);

    /* the reference: in place, one call at a time; weights and the eval
     * output of x at every version */
    float *ref_w[STEPS + 1], *ref_out[STEPS + 1];
    for (int s = 0; s <= STEPS; s++) {
        if (s > 0) {
            ps_grads *g = grads_k(in, s);
            uint64_t v = 0;
            OKE(ps_model_step_grads(in, g, &v, &err));
            CHECK(v == (uint64_t)s);
            ps_grads_free(g);
        }
        ref_w[s] = all_weights(in);
        ref_out[s] = malloc((size_t)BATCH * k * sizeof(float));
        OKE(run_forward(in, x, BATCH, 0, NULL, 0, ref_out[s], NULL, NULL, &err));
    }

    /* 2 and 3: steps on one thread, forwards on two and snapshots on one */
    fwd_log f[2];
    snap_log sl;
    memset(&sl, 0, sizeof sl);
    sl.m = sn;
    pthread_t th[3];
    for (int t = 0; t < 2; t++) {
        memset(&f[t], 0, sizeof f[t]);
        f[t].m = sn;
        f[t].x = x;
        f[t].out_size = k;
        f[t].out = malloc((size_t)4096 * BATCH * k * sizeof(float));
        CHECK(pthread_create(&th[t], NULL, forwards, &f[t]) == 0);
    }
    CHECK(pthread_create(&th[2], NULL, snapshots, &sl) == 0);
    /* 1: step by step, the same weights as in place */
    int same_w = 1;
    for (int s = 1; s <= STEPS; s++) {
        ps_grads *g = grads_k(sn, s);
        uint64_t v = 0;
        OKE(ps_model_step_grads(sn, g, &v, &err));
        CHECK(v == (uint64_t)s);
        ps_grads_free(g);
        float *now = all_weights(sn);
        same_w &= memcmp(now, ref_w[s], (size_t)nw * sizeof(float)) == 0;
        free(now);
    }
    CHECK_MSG(same_w, "snapshot steps changed the weights differently from in-place steps");
    for (int t = 0; t < 2; t++) f[t].stop = 1;
    sl.stop = 1;
    for (int t = 0; t < 3; t++) pthread_join(th[t], NULL);

    int bad = 0, logged = 0, versions_seen = 0;
    uint64_t seen = 0;
    for (int t = 0; t < 2; t++) {
        CHECK(!f[t].failed);
        for (int i = 0; i < f[t].n; i++) {
            uint64_t v = f[t].version[i];
            logged++;
            if (v > STEPS) { bad++; continue; }
            if (!(seen & (1ULL << v))) { seen |= 1ULL << v; versions_seen++; }
            if (memcmp(f[t].out + (size_t)i * BATCH * k, ref_out[v], (size_t)BATCH * k * sizeof(float))) bad++;
        }
        free(f[t].out);
    }
    CHECK_MSG(bad == 0, "%d of %d forwards during steps match no single version's weights", bad, logged);
    CHECK(logged > 0);
    printf("test_snapshot_steps: %d forwards during %d steps saw %d versions, each one whole\n", logged, STEPS,
           versions_seen);
    int sbad = 0;
    for (int i = 0; i < sl.n; i++) {
        if (sl.version[i] > STEPS || memcmp(sl.w[i], ref_w[sl.version[i]], (size_t)nw * sizeof(float))) sbad++;
        free(sl.w[i]);
    }
    CHECK_MSG(sbad == 0, "%d of %d snapshots hold no single version", sbad, sl.n);

    /* 4: an administrative write lands in the weights every later call sees */
    const ps_param_info *p0 = ps_model_param(sn, 0);
    float *zero = calloc((size_t)p0->numel, sizeof *zero), *got = malloc((size_t)p0->numel * sizeof *got);
    OKE(ps_model_set_param(sn, 0, zero, &err));
    OKE(ps_model_get_param(sn, 0, got, &err));
    CHECK(memcmp(zero, got, (size_t)p0->numel * sizeof *got) == 0);
    ps_grads *g = grads_k(sn, 99);
    OKE(ps_model_step_grads(sn, g, NULL, &err));   /* and a step after it starts from it */
    ps_grads_free(g);
    OKE(ps_model_get_param(sn, 0, got, &err));
    int moved = 0;
    for (int64_t j = 0; j < p0->numel; j++) moved += got[j] != 0;
    CHECK(moved > 0);
    free(zero);
    free(got);
    /* a model with an embedding table steps in place (and still steps) */
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = "ref", .seed = 3, .lr = 0.1f, .snapshot_steps = 1,
                       .n_sizes = 3, .size_key = {"ntoken", "ninp", "nhid"}, .size_value = {50, 8, 8}};
    ps_model *lm = ps_model_create(&o, &err);
    CHECK_MSG(lm != NULL, "%s", err.msg);
    if (lm) {
        size_t pb = (size_t)ps_model_param(lm, 0)->numel * sizeof(float);
        float *before = malloc(pb), *after = malloc(pb);
        OKE(ps_model_get_param(lm, 0, before, &err));
        int64_t ids[2] = {0, 1};
        float out[2 * 4096];
        ps_tape *t = NULL;
        int emb = ps_model_find_stage(lm, "emb");
        if (emb >= 0) {
            const ps_stage_info *si = ps_model_stage(lm, emb);
            int64_t per = 1;
            for (int d = 0; d < si->out_ndim; d++) per *= si->out_dims[d];
            float *gout = calloc((size_t)(2 * per), sizeof *gout);
            for (int64_t j = 0; j < 2 * per; j++) gout[j] = 1.0f;
            OKE(ps_model_forward_range(lm, emb, emb, ids, 2, 1, NULL, 1, per <= 4096 ? out : NULL, &t, NULL, &err));
            ps_grads *ge = ps_grads_create(lm, &err);
            OKE(ps_model_backward_acc(lm, t, gout, NULL, ge, &err));
            uint64_t v = 0;
            OKE(ps_model_step_grads(lm, ge, &v, &err));
            CHECK(v == 1);
            OKE(ps_model_get_param(lm, 0, after, &err));
            CHECK(memcmp(before, after, pb) != 0);
            ps_grads_free(ge);
            ps_tape_free(t);
            free(gout);
        }
        free(before);
        free(after);
        ps_model_free(lm);
    }

    for (int s = 0; s <= STEPS; s++) { free(ref_w[s]); free(ref_out[s]); }
    free(x);
    ps_model_free(in);
    ps_model_free(sn);
    return check_summary("test_snapshot_steps");
}
