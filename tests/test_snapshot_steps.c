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
 *  4. set_param (an administrative write, exclusive) still works;
 *  5. a model with a row-sparse parameter (rnn_lm: the embedding stage
 *     steps in place under rows_lock, the decoder and the LSTM's block in
 *     copies): the same gradients give bit-identical weights and versions
 *     as in place, and forwards over the embedding and the decoder
 *     together, over the decoder alone, over the whole table, and model
 *     snapshots, taken while
 *     steps run, each match the in-place model at one version;
 *  6. every optimizer (SGD plain, with momentum, weight decay or both;
 *     Adam with and without weight decay) on mnist_cnn (dnnl and ref),
 *     small_resnet (BatchNorm buffers folded at the step) and rnn_lm
 *     (row-sparse embedding in place beside dense stages): snapshot steps,
 *     which write the dense stages from the current copy into the spare
 *     one, leave weights, update counts, optimizer state, buffers and
 *     version bit-identical to in-place steps, with gradients that skip
 *     whole stages and single parameters on some steps.
 * The in-place model is the reference: it runs the same kernels on the
 * same weights one call at a time. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
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

static void add_dense_k(ps_model *m, ps_grads *g, int k, int partial, rng *r);

/* Adds random values from r (times 0.1) to g's every dense parameter. */
static void add_dense_random(ps_model *m, ps_grads *g, rng *r) { add_dense_k(m, g, 0, 0, r); }

/* Gradient k of the sequence: reproducible random values per parameter. */
static ps_grads *grads_k(ps_model *m, int k) {
    ps_err err = {0};
    ps_grads *g = ps_grads_create(m, &err);
    rng r = {0x9e3779b97f4a7c15ULL * (uint64_t)(k + 1)};
    add_dense_random(m, g, &r);
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

typedef ps_grads *(*grads_fn)(ps_model *m, int k);

/* Step m with gradient s of the sequence; the step must make version s. */
static void step_k(ps_model *m, grads_fn grads, int s) {
    ps_err err = {0};
    ps_grads *g = grads(m, s);
    uint64_t v = 0;
    OKE(ps_model_step_grads(m, g, &v, &err));
    CHECK(v == (uint64_t)s);
    ps_grads_free(g);
}

/* 1 when m's weights are bit-identical to want (nw floats). */
static int weights_are(ps_model *m, const float *want, int64_t nw) {
    float *now = all_weights(m);
    int same = memcmp(now, want, (size_t)nw * sizeof(float)) == 0;
    free(now);
    return same;
}

/* Snapshots in sl that hold no single version of ref_w[0..STEPS]; frees them. */
static int snapshots_bad(snap_log *sl, float *const *ref_w, int64_t nw) {
    int bad = 0;
    for (int i = 0; i < sl->n; i++) {
        if (sl->version[i] > STEPS || memcmp(sl->w[i], ref_w[sl->version[i]], (size_t)nw * sizeof(float))) bad++;
        free(sl->w[i]);
    }
    return bad;
}

/* ---- 5: rnn_lm (ninp = nhid so emb..decoder chain as one run) ---- */
#define LM_V 1000
#define LM_W 32      /* ninp = nhid */
#define LM_IDS 64

/* Adam (SparseAdam for the rows): per-row and dense optimizer state */
static const ps_optim_spec lm_adam = {.kind = PS_OPTIM_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};

static ps_model *make_lm(int snapshots, const ps_optim_spec *spec) {
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = "ref", .seed = 3, .optim = spec,
                       .snapshot_steps = snapshots, .compute_threads = 1, .n_sizes = 4,
                       .size_key = {"ntoken", "ninp", "nhid", "dropout"}, .size_value = {LM_V, LM_W, LM_W, 0}};
    ps_err err = {0};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m != NULL, "rnn_lm: %s", err.msg);
    return m;
}

/* Ids of window k: spread over the table, some repeated. */
static void lm_ids(int k, int64_t *ids) {
    for (int i = 0; i < LM_IDS; i++) ids[i] = ((int64_t)k * 131 + (int64_t)i * 37 * (i % 3 + 1)) % LM_V;
}

/* Every row once, in an order of k's. */
static void lm_all_ids(int k, int64_t *ids) {
    for (int i = 0; i < LM_V; i++) ids[i] = ((int64_t)k * 131 + (int64_t)i * 7) % LM_V;
}

/* Gradient k: the embedding's rows (every row, so a step writes the whole
 * table and a reader racing it would see it half-written) from a training
 * forward and backward of stage emb, plus random dense gradients for every other parameter (the
 * decoder's and the LSTM's, as PushGradients adds them). */

static ps_grads *lm_grads_k_ex(ps_model *m, int k, int partial) {
    ps_err err = {0};
    int emb = ps_model_find_stage(m, "emb");
    int64_t ids[LM_V];
    lm_all_ids(k, ids);
    rng r = {0x51ed27ULL * (uint64_t)(k + 3)};
    float *gout = host_random((size_t)LM_V * LM_W, &r);
    ps_tape *t = NULL;
    ps_grads *g = ps_grads_create(m, &err);
    OKE(ps_model_forward_range(m, emb, emb, ids, LM_V, 1, NULL, 1, NULL, &t, NULL, &err));
    OKE(ps_model_backward_acc(m, t, gout, NULL, g, &err));
    ps_tape_free(t);
    free(gout);
    add_dense_k(m, g, k, partial, &r);
    return g;
}

static ps_grads *lm_grads_k(ps_model *m, int k) { return lm_grads_k_ex(m, k, 0); }

/* Eval forwards of stages first..last while steps run, each compared at
 * once with the in-place model's output at the version it reports. */
typedef struct lm_fwd {
    ps_model *m;
    int first, last;
    const void *x;             /* nx ids or nx x LM_W floats */
    int nx;
    size_t ob;                 /* output bytes */
    float *const *ref;         /* per version: the in-place model's output */
    int stop, n, bad, failed;  /* __atomic */
} lm_fwd;

static void *lm_forwards(void *p) {
    lm_fwd *f = p;
    ps_err err = {0};
    float *out = malloc(f->ob);
    while (out && !__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        uint64_t v = 0;
        if (ps_model_forward_range(f->m, f->first, f->last, f->x, f->nx, 0, NULL, 0, out, NULL, &v, &err) != PS_OK) {
            f->failed = 1;
            break;
        }
        if (v > STEPS || memcmp(out, f->ref[v], f->ob)) f->bad++;
        __atomic_add_fetch(&f->n, 1, __ATOMIC_RELEASE);
    }
    free(out);
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);   /* done: nobody waits for more */
    return NULL;
}

/* Until the forward thread has finished 2 more calls (so one began after
 * the last step) or stopped: every version is read by some forward, however
 * the threads are scheduled. */
static void lm_wait_more(lm_fwd *f) {
    int n0 = __atomic_load_n(&f->n, __ATOMIC_ACQUIRE);
    while (__atomic_load_n(&f->n, __ATOMIC_ACQUIRE) < n0 + 2 && !__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void lm_part(void) {
    ps_err err = {0};
    ps_model *in = make_lm(0, &lm_adam), *sn = make_lm(1, &lm_adam);
    int emb = in ? ps_model_find_stage(in, "emb") : -1, dec = in ? ps_model_find_stage(in, "decoder") : -1;
    CHECK(emb >= 0 && dec == emb + 1);
    if (!in || !sn || emb < 0 || dec != emb + 1) { ps_model_free(in); ps_model_free(sn); return; }
    int64_t nw = ps_model_num_weights(in);
    int64_t ids[LM_IDS], all[LM_V];
    lm_ids(1000, ids);
    lm_all_ids(1000, all);
    rng r = {77};
    float *h = host_random((size_t)LM_IDS * LM_W, &r);
    const size_t ob = (size_t)LM_IDS * LM_V * sizeof(float);
    const size_t eb = (size_t)LM_V * LM_W * sizeof(float);
    float *ref_w[STEPS + 1], *ref_both[STEPS + 1], *ref_dec[STEPS + 1], *ref_emb[STEPS + 1];
    for (int s = 0; s <= STEPS; s++) {
        if (s > 0) step_k(in, lm_grads_k, s);
        ref_w[s] = all_weights(in);
        ref_both[s] = malloc(ob);
        ref_dec[s] = malloc(ob);
        OKE(ps_model_forward_range(in, emb, dec, ids, LM_IDS, 0, NULL, 0, ref_both[s], NULL, NULL, &err));
        OKE(ps_model_forward_range(in, dec, dec, h, LM_IDS, 0, NULL, 0, ref_dec[s], NULL, NULL, &err));
        ref_emb[s] = malloc(eb);
        OKE(ps_model_forward_range(in, emb, emb, all, LM_V, 0, NULL, 0, ref_emb[s], NULL, NULL, &err));
    }
    lm_fwd f[3] = {{.m = sn, .first = emb, .last = dec, .x = ids, .nx = LM_IDS, .ob = ob, .ref = ref_both},
                   {.m = sn, .first = dec, .last = dec, .x = h, .nx = LM_IDS, .ob = ob, .ref = ref_dec},
                   {.m = sn, .first = emb, .last = emb, .x = all, .nx = LM_V, .ob = eb, .ref = ref_emb}};
    snap_log sl;
    memset(&sl, 0, sizeof sl);
    sl.m = sn;
    pthread_t th[4];
    for (int t = 0; t < 3; t++) CHECK(pthread_create(&th[t], NULL, lm_forwards, &f[t]) == 0);
    CHECK(pthread_create(&th[3], NULL, snapshots, &sl) == 0);
    int same_w = 1;
    for (int s = 1; s <= STEPS; s++) {
        for (int t = 0; t < 3; t++) lm_wait_more(&f[t]);
        step_k(sn, lm_grads_k, s);
        same_w &= weights_are(sn, ref_w[s], nw);
    }
    for (int t = 0; t < 3; t++) lm_wait_more(&f[t]);
    CHECK_MSG(same_w, "rnn_lm: snapshot steps (embedding in place) changed the weights differently from in-place "
              "steps");
    for (int t = 0; t < 3; t++) __atomic_store_n(&f[t].stop, 1, __ATOMIC_RELEASE);
    sl.stop = 1;
    for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
    const char *what[3] = {"emb..decoder", "decoder", "emb (every row)"};
    for (int t = 0; t < 3; t++) {
        CHECK(!f[t].failed);
        CHECK(f[t].n >= 2 * (STEPS + 1));
        CHECK_MSG(f[t].bad == 0, "rnn_lm: %d of %d %s forwards during steps match no single version", f[t].bad,
                  f[t].n, what[t]);
        printf("test_snapshot_steps: rnn_lm, %d %s forwards during %d steps, %d not one version\n", f[t].n,
               what[t], STEPS, f[t].bad);
    }
    int sbad = snapshots_bad(&sl, ref_w, nw);
    CHECK_MSG(sbad == 0, "rnn_lm: %d of %d snapshots hold no single version", sbad, sl.n);
    for (int s = 0; s <= STEPS; s++) { free(ref_w[s]); free(ref_both[s]); free(ref_dec[s]); free(ref_emb[s]); }
    free(h);
    ps_model_free(in);
    ps_model_free(sn);
}

/* ---- 6: every optimizer, the dense stages written out of place ----
 * A snapshot step writes the next weights of the dense stages from the
 * current copy into a spare one (the optimizer reads one and writes the
 * other; a parameter without a gradient is copied). Against the in-place
 * model, step by step: weights, update counts, optimizer state (momentum,
 * exp_avg, exp_avg_sq), buffers (BatchNorm's running statistics) and the
 * version, bit for bit, for every optimizer the step table supports. The
 * gradients leave whole stages and single parameters out on some steps
 * (a parameter left un-updated, or left stale in the spare copy, which
 * holds a version two or more steps old, differs), and weight decay reads
 * the weights (reading the spare copy instead of the current one
 * differs). */
typedef struct optim_case {
    const char *what;
    ps_optim_spec spec;
} optim_case;

static const optim_case kOptims[] = {
    {"sgd", {.kind = PS_OPTIM_SGD, .lr = 0.05}},
    {"sgd momentum", {.kind = PS_OPTIM_SGD, .lr = 0.05, .momentum = 0.9}},
    {"sgd weight_decay", {.kind = PS_OPTIM_SGD, .lr = 0.05, .weight_decay = 0.1}},
    {"sgd momentum weight_decay", {.kind = PS_OPTIM_SGD, .lr = 0.05, .momentum = 0.9, .weight_decay = 0.01}},
    {"adam", {.kind = PS_OPTIM_ADAM, .lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8}},
    {"adam weight_decay", {.kind = PS_OPTIM_ADAM, .lr = 0.01, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6,
                           .weight_decay = 0.05}},
};
#define NOPTIMS (int)(sizeof kOptims / sizeof kOptims[0])
#define MATRIX_STEPS 7

/* Random dense gradients of step k for every dense parameter; partial:
 * stage s gets none on steps with (k + s) % 3 == 0, and parameter i of a
 * stage that gets some is left out (zero in its stage's block) when
 * (k + i) % 4 == 0. */
static void add_dense_k(ps_model *m, ps_grads *g, int k, int partial, rng *r) {
    ps_err err = {0};
    for (int i = 0; g && i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        if (p->sparse) continue;
        if (partial && ((k + p->stage_index) % 3 == 0 || (k + i) % 4 == 0)) continue;
        float *h = host_random((size_t)p->numel, r);
        for (int64_t j = 0; j < p->numel; j++) h[j] *= 0.1f;
        OKE(ps_grads_add_dense(m, g, i, h, &err));
        free(h);
    }
}

/* The whole training state of m (ps_model_snapshot_ex), as one block of
 * bytes to compare. */
typedef struct train_state {
    float *w;
    int64_t *step;
    float *st[PS_OPTIM_MAX_STATE];
    void *buf[64];
    uint64_t version;
} train_state;

static void state_take(ps_model *m, train_state *t) {
    ps_err err = {0};
    memset(t, 0, sizeof *t);
    const int64_t nw = ps_model_num_weights(m);
    t->w = malloc((size_t)nw * sizeof(float));
    t->step = calloc((size_t)ps_model_num_params(m), sizeof *t->step);
    int ns = ps_optim_num_state(ps_model_optim(m));
    for (int j = 0; j < ns; j++) t->st[j] = malloc((size_t)nw * sizeof(float));
    CHECK(ps_model_num_buffers(m) <= 64);
    for (int i = 0; i < ps_model_num_buffers(m) && i < 64; i++) {
        const ps_buffer_info *b = ps_model_buffer(m, i);
        t->buf[i] = calloc((size_t)(b->numel ? b->numel : 1), 8);
    }
    OKE(ps_model_snapshot_ex(m, t->w, t->step, t->st, t->buf, &t->version, &err));
}

static void state_free(ps_model *m, train_state *t) {
    free(t->w);
    free(t->step);
    for (int j = 0; j < PS_OPTIM_MAX_STATE; j++) free(t->st[j]);
    for (int i = 0; i < ps_model_num_buffers(m) && i < 64; i++) free(t->buf[i]);
}

/* NULL when a and b are the same state; else what differs (static text). */
static const char *state_diff(ps_model *m, const train_state *a, const train_state *b, char *msg, size_t cap) {
    int64_t off = 0;
    int ns = ps_optim_num_state(ps_model_optim(m));
    if (a->version != b->version) return "the version";
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        const size_t nb = (size_t)p->numel * sizeof(float);
        const char *what = NULL;
        if (memcmp(a->w + off, b->w + off, nb)) what = "weights";
        else if (a->step[i] != b->step[i]) what = "update count";
        for (int j = 0; !what && j < ns; j++)
            if (memcmp(a->st[j] + off, b->st[j] + off, nb)) what = ps_optim_state_name(ps_model_optim(m)->kind, j);
        if (what) {
            snprintf(msg, cap, "%s's %s", p->name, what);
            return msg;
        }
        off += p->numel;
    }
    for (int i = 0; i < ps_model_num_buffers(m) && i < 64; i++) {
        const ps_buffer_info *bi = ps_model_buffer(m, i);
        if (memcmp(a->buf[i], b->buf[i], (size_t)bi->numel * (bi->dtype == PS_DTYPE_I64 ? 8 : 4))) {
            snprintf(msg, cap, "buffer %s", bi->name);
            return msg;
        }
    }
    return NULL;
}

typedef enum { GRADS_RANDOM, GRADS_BACKWARD, GRADS_LM } grads_kind;

/* Gradients of step k for m: random dense ones (partial), a training
 * forward and backward of x (with BatchNorm's statistics to fold), or
 * rnn_lm's rows of the embedding plus partial dense ones. */
static ps_grads *grads_of(ps_model *m, grads_kind gk, int k, const float *x, int64_t out_numel) {
    ps_err err = {0};
    if (gk == GRADS_LM) return lm_grads_k_ex(m, k, 1);
    if (gk == GRADS_RANDOM) {
        ps_grads *g = ps_grads_create(m, &err);
        rng r = {0x2545f4914f6cdd1dULL * (uint64_t)(k + 5)};
        add_dense_k(m, g, k, 1, &r);
        return g;
    }
    rng r = {0x9e3779b9ULL * (uint64_t)(k + 7)};
    float *out = malloc((size_t)BATCH * out_numel * sizeof *out);
    float *gout = host_random((size_t)BATCH * out_numel, &r);
    ps_tape *t = NULL;
    OKE(run_forward(m, x, BATCH, 1, NULL, (uint64_t)k, out, &t, NULL, &err));
    ps_grads *g = t ? run_backward(m, t, gout, &err) : NULL;
    CHECK_MSG(g != NULL, "%s", err.msg);
    ps_tape_free(t);
    free(out);
    free(gout);
    return g;
}

static void matrix_case(const char *model, const ps_model_opts *base, grads_kind gk, const optim_case *oc) {
    ps_err err = {0};
    ps_model *m[2];
    for (int k = 0; k < 2; k++) {
        ps_model_opts o = *base;
        o.optim = &oc->spec;
        o.snapshot_steps = k;
        m[k] = ps_model_create(&o, &err);
        CHECK_MSG(m[k] != NULL, "%s, %s: %s", model, oc->what, err.msg);
    }
    if (!m[0] || !m[1]) { ps_model_free(m[0]); ps_model_free(m[1]); return; }
    const ps_stage_info *st0 = ps_model_stage(m[0], 0), *stl = ps_model_stage(m[0], ps_model_num_stages(m[0]) - 1);
    int64_t in_numel = 1, out_numel = 1;
    for (int d = 0; d < st0->in_ndim; d++) in_numel *= st0->in_dims[d];
    for (int d = 0; d < stl->out_ndim; d++) out_numel *= stl->out_dims[d];
    rng r = {1234};
    float *x = gk == GRADS_BACKWARD ? host_random((size_t)BATCH * in_numel, &r) : NULL;
    const char *bad = NULL;
    char msg[256];
    int bad_step = 0;
    for (int s = 1; s <= MATRIX_STEPS && !bad; s++) {
        train_state t[2];
        for (int k = 0; k < 2; k++) {
            ps_grads *g = grads_of(m[k], gk, s, x, out_numel);
            uint64_t v = 0;
            OKE(ps_model_step_grads(m[k], g, &v, &err));
            CHECK(v == (uint64_t)s);
            ps_grads_free(g);
            state_take(m[k], &t[k]);
        }
        bad = state_diff(m[0], &t[0], &t[1], msg, sizeof msg);
        bad_step = s;
        for (int k = 0; k < 2; k++) state_free(m[k], &t[k]);
    }
    CHECK_MSG(!bad, "%s, %s: after step %d a snapshot step left %s different from an in-place step", model,
              oc->what, bad_step, bad);
    free(x);
    ps_model_free(m[0]);
    ps_model_free(m[1]);
}

static void optim_matrix(void) {
    const ps_model_opts mnist_dnnl = {.arch = "mnist_cnn", .cpu_backend = "dnnl", .seed = 5, .compute_threads = 2};
    const ps_model_opts mnist_ref = {.arch = "mnist_cnn", .cpu_backend = "ref", .seed = 6, .compute_threads = 1};
    const ps_model_opts resnet = {.file = "examples/models/small_resnet.yaml", .cpu_backend = "dnnl", .seed = 7,
                                  .compute_threads = 2};
    const ps_model_opts lm = {.arch = "rnn_lm", .cpu_backend = "ref", .seed = 3, .compute_threads = 1, .n_sizes = 4,
                              .size_key = {"ntoken", "ninp", "nhid", "dropout"}, .size_value = {LM_V, LM_W, LM_W, 0}};
    int cases = 0;
    for (int c = 0; c < NOPTIMS; c++) {
        const ps_optim_spec *sp = &kOptims[c].spec;
        matrix_case("mnist_cnn (dnnl)", &mnist_dnnl, GRADS_RANDOM, &kOptims[c]);
        matrix_case("mnist_cnn (ref)", &mnist_ref, GRADS_RANDOM, &kOptims[c]);
        matrix_case("small_resnet (dnnl, BatchNorm)", &resnet, GRADS_BACKWARD, &kOptims[c]);
        cases += 3;
        /* row-sparse rules: SparseAdam, or plain SGD (no momentum, no weight decay) */
        ps_err err = {0};
        if (ps_optim_check(sp, 1, &err) == PS_OK) {
            matrix_case("rnn_lm (embedding rows in place, dense stages out of place)", &lm, GRADS_LM, &kOptims[c]);
            cases++;
        }
    }
    printf("test_snapshot_steps: %d model x optimizer cases, %d steps each, snapshot = in-place bit for bit\n",
           cases, MATRIX_STEPS);
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
        if (s > 0) step_k(in, grads_k, s);
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
        step_k(sn, grads_k, s);
        same_w &= weights_are(sn, ref_w[s], nw);
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
    int sbad = snapshots_bad(&sl, ref_w, nw);
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
    lm_part();
    optim_matrix();

    for (int s = 0; s <= STEPS; s++) { free(ref_w[s]); free(ref_out[s]); }
    free(x);
    ps_model_free(in);
    ps_model_free(sn);
    return check_summary("test_snapshot_steps");
}
