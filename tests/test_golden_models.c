/* test_golden_models.c - the models besides the MNIST CNN against PyTorch:
 * tests/golden/cartpole_step.safetensors and rnn_lm_stages.safetensors,
 * written by scripts/gen_golden_models.py (committed; this test does not
 * need PyTorch). For the ref and dnnl backends: forward outputs with the
 * stored dropout masks, parameter gradients, input gradients where the
 * input is float, and the weights after one plain SGD step. The LM's two
 * stages run as one context with two forwards accumulating into one
 * ps_grads (the RPC tutorial's shape: embedding and decoder around the
 * trainer's RNN).
 *
 * Adam through the model (cartpole_adam / rnn_lm_adam.safetensors): two
 * steps on given output gradients; after each, every parameter's weights,
 * exp_avg, exp_avg_sq (ps_model_snapshot) and step count vs
 * torch.optim.Adam, and for rnn_lm's embedding vs torch.optim.SparseAdam:
 * rows not hit in a step keep their weights and moments bit for bit (rows
 * hit only at step 0 keep non-zero moments through step 1; rows never hit
 * keep their initial weights and zero moments) - dense Adam would move
 * them. */
#include "model.h"
#include "safetensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define OKE(call) CHECK_MSG((call) == PS_OK, "%s: %s", label, err.msg)
#define ATOL 1e-6
#define RTOL 1e-4

static const void *tensor(const ps_st_file *g, const char *name, int dtype, int64_t numel) {
    const ps_st_tensor *t = ps_st_find(g, name);
    CHECK_MSG(t && t->dtype == dtype && ps_st_numel(t) == numel, "golden %s: missing or wrong dtype/size", name);
    return t && t->dtype == dtype && ps_st_numel(t) == numel ? t->data : NULL;
}

static void set_params(ps_model *m, const ps_st_file *g, const char *label) {
    ps_err err = {0};
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        char name[96];
        if (!strcmp(p->stage, "rnn")) continue; /* rnn_lm's parameter-only LSTM stage: not in these files */
        snprintf(name, sizeof name, "init.%s", p->name);
        const float *w = tensor(g, name, PS_ST_F32, p->numel);
        if (w) OKE(ps_model_set_param(m, i, w, &err));
    }
}

static void check_grads_and_step(ps_model *m, const ps_st_file *g, ps_grads *acc, const char *label) {
    ps_err err = {0};
    char name[96], what[160];
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        float *got = malloc((size_t)p->numel * sizeof(float));
        if (!strcmp(p->stage, "rnn")) { /* parameter-only: the stages' backward gives it nothing */
            OKE(ps_grads_get(m, acc, i, got, &err));
            int64_t nz = 0;
            for (int64_t k = 0; k < p->numel; k++) nz += got[k] != 0;
            CHECK_MSG(nz == 0, "%s grad.%s: %lld nonzero", label, p->name, (long long)nz);
            free(got);
            continue;
        }
        snprintf(name, sizeof name, "grad.%s", p->name);
        const float *want = tensor(g, name, PS_ST_F32, p->numel);
        OKE(ps_grads_get(m, acc, i, got, &err));
        snprintf(what, sizeof what, "%s %s", label, name);
        if (want) check_array(what, got, want, (size_t)p->numel, ATOL, RTOL);
        free(got);
    }
    uint64_t v = 0;
    OKE(ps_model_step_grads(m, acc, &v, &err));
    CHECK(v == 1);
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        if (!strcmp(p->stage, "rnn")) continue;
        float *got = malloc((size_t)p->numel * sizeof(float));
        snprintf(name, sizeof name, "final.%s", p->name);
        const float *want = tensor(g, name, PS_ST_F32, p->numel);
        OKE(ps_model_get_param(m, i, got, &err));
        snprintf(what, sizeof what, "%s %s", label, name);
        if (want) check_array(what, got, want, (size_t)p->numel, ATOL, RTOL);
        if (want && p->sparse) {   /* rows no id hit are bit-identical to the initial ones */
            snprintf(name, sizeof name, "init.%s", p->name);
            const float *w0 = tensor(g, name, PS_ST_F32, p->numel);
            int64_t width = p->dims[1], same = 0, untouched = 0;
            const float *gr = tensor(g, "grad.encoder.weight", PS_ST_F32, p->numel);
            for (int64_t r = 0; w0 && gr && r < p->dims[0]; r++) {
                int hit = 0;
                for (int64_t j = 0; j < width; j++) hit |= gr[r * width + j] != 0;
                if (hit) continue;
                untouched++;
                same += !memcmp(got + r * width, w0 + r * width, (size_t)width * sizeof(float));
            }
            CHECK(untouched > 0 && same == untouched);
        }
        free(got);
    }
}

static void cartpole(const char *backend) {
    char label[64];
    snprintf(label, sizeof label, "%s cartpole_policy", backend);
    ps_err err = {0};
    ps_st_file *g = ps_st_read("tests/golden/cartpole_step.safetensors", &err);
    CHECK_MSG(g, "%s", err.msg);
    ps_model_opts o = {.arch = "cartpole_policy", .cpu_backend = backend, .seed = 3, .compute_threads = 2,
                       .lr = 0.01f};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!g || !m) { ps_st_free(g); ps_model_free(m); return; }
    set_params(m, g, label);
    const int n = 6;
    const float *x = tensor(g, "input", PS_ST_F32, n * 4), *mask = tensor(g, "mask", PS_ST_F32, n * 128);
    const float *want_out = tensor(g, "output", PS_ST_F32, n * 2), *gout = tensor(g, "grad_output", PS_ST_F32, n * 2);
    const float *want_gin = tensor(g, "grad_input", PS_ST_F32, n * 4);
    if (x && mask && want_out && gout && want_gin) {
        float out[12], gin[24];
        const float *masks[1] = {mask};
        ps_tape *t = NULL;
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, masks, 0, out, &t, NULL, &err));
        char what[96];
        snprintf(what, sizeof what, "%s output", label);
        check_array(what, out, want_out, 12, ATOL, RTOL);
        ps_grads *acc = ps_grads_create(m, &err);
        if (t && acc) {
            OKE(ps_model_backward_acc(m, t, gout, gin, acc, &err));
            snprintf(what, sizeof what, "%s grad_input", label);
            check_array(what, gin, want_gin, 24, ATOL, RTOL);
            check_grads_and_step(m, g, acc, label);
        }
        ps_grads_free(acc);
        ps_tape_free(t);
    }
    ps_model_free(m);
    ps_st_free(g);
}

static void rnn_lm(const char *backend) {
    char label[64];
    snprintf(label, sizeof label, "%s rnn_lm", backend);
    ps_err err = {0};
    ps_st_file *g = ps_st_read("tests/golden/rnn_lm_stages.safetensors", &err);
    CHECK_MSG(g, "%s", err.msg);
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = backend, .seed = 3, .compute_threads = 2, .lr = 0.5f,
                       .n_sizes = 4, .size_key = {"ntoken", "ninp", "nhid", "dropout"},
                       .size_value = {50, 8, 8, 0.2}};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!g || !m) { ps_st_free(g); ps_model_free(m); return; }
    set_params(m, g, label);
    const int n = 15;   /* (seq 5, batch 3) */
    const int64_t *ids = tensor(g, "emb.input", PS_ST_I64, n);
    const float *em = tensor(g, "emb.mask", PS_ST_F32, n * 8), *eo = tensor(g, "emb.output", PS_ST_F32, n * 8);
    const float *eg = tensor(g, "emb.grad_output", PS_ST_F32, n * 8), *dx = tensor(g, "dec.input", PS_ST_F32, n * 8);
    const float *dm = tensor(g, "dec.mask", PS_ST_F32, n * 8), *dout = tensor(g, "dec.output", PS_ST_F32, n * 50);
    const float *dg = tensor(g, "dec.grad_output", PS_ST_F32, n * 50);
    const float *dgin = tensor(g, "dec.grad_input", PS_ST_F32, n * 8);
    if (ids && em && eo && eg && dx && dm && dout && dg && dgin) {
        float e[120], d[750], gin[120];
        char what[96];
        ps_tape *te = NULL, *td = NULL;
        const float *emasks[1] = {em}, *dmasks[1] = {dm};
        OKE(ps_model_forward_range(m, 0, 0, ids, n, 1, emasks, 0, e, &te, NULL, &err));
        snprintf(what, sizeof what, "%s emb output", label);
        check_array(what, e, eo, 120, ATOL, RTOL);
        OKE(ps_model_forward_range(m, 1, 1, dx, n, 1, dmasks, 0, d, &td, NULL, &err));
        snprintf(what, sizeof what, "%s decoder output", label);
        check_array(what, d, dout, 750, ATOL, RTOL);
        ps_grads *acc = ps_grads_create(m, &err);
        if (te && td && acc) {
            OKE(ps_model_backward_acc(m, td, dg, gin, acc, &err));
            snprintf(what, sizeof what, "%s decoder grad_input", label);
            check_array(what, gin, dgin, 120, ATOL, RTOL);
            OKE(ps_model_backward_acc(m, te, eg, NULL, acc, &err));
            check_grads_and_step(m, g, acc, label);
        }
        ps_grads_free(acc);
        ps_tape_free(te);
        ps_tape_free(td);
    }
    ps_model_free(m);
    ps_st_free(g);
}

/* ---- Adam ---- */

#define STATE_ATOL 1e-9   /* exp_avg_sq is ~1e-4 of g^2: an absolute 1e-6 would hide it */

/* The model's training state after a step: weights, steps and Adam's two
 * buffers of every parameter, laid out as ps_model_snapshot does. */
typedef struct adam_snap {
    float *w, *s[2];
    int64_t *step;
} adam_snap;

static void snap_take(ps_model *m, adam_snap *a, const char *label) {
    ps_err err = {0};
    const int64_t nw = ps_model_num_weights(m);
    a->w = malloc((size_t)nw * sizeof(float));
    a->s[0] = malloc((size_t)nw * sizeof(float));
    a->s[1] = malloc((size_t)nw * sizeof(float));
    a->step = calloc((size_t)ps_model_num_params(m), sizeof *a->step);
    CHECK(ps_optim_num_state(ps_model_optim(m)) == 2);
    OKE(ps_model_snapshot(m, a->w, a->step, a->s, NULL, &err));
}

static void snap_free(adam_snap *a) {
    free(a->w);
    free(a->s[0]);
    free(a->s[1]);
    free(a->step);
}

/* Gradients of step k in acc, then the step, then weights/state/steps. */
static void adam_step_check(ps_model *m, const ps_st_file *g, ps_grads *acc, int k, adam_snap *after,
                            const char *label) {
    ps_err err = {0};
    char name[128], what[192];
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        if (!strcmp(p->stage, "rnn")) continue; /* parameter-only LSTM stage: not in these files, no gradient */
        float *got = malloc((size_t)p->numel * sizeof(float));
        snprintf(name, sizeof name, "step%d.grad.%s", k, p->name);
        const float *want = tensor(g, name, PS_ST_F32, p->numel);
        OKE(ps_grads_get(m, acc, i, got, &err));
        snprintf(what, sizeof what, "%s %s", label, name);
        if (want) check_array(what, got, want, (size_t)p->numel, ATOL, RTOL);
        free(got);
    }
    uint64_t v = 0;
    OKE(ps_model_step_grads(m, acc, &v, &err));
    CHECK(v == (uint64_t)k + 1);
    snap_take(m, after, label);
    int64_t off = 0;
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        if (!strcmp(p->stage, "rnn")) { /* never given a gradient: never stepped */
            CHECK_MSG(after->step[i] == 0, "%s %s: step %lld, want 0", label, p->name, (long long)after->step[i]);
            off += p->numel;
            continue;
        }
        CHECK_MSG(after->step[i] == k + 1, "%s %s: step %lld, want %d", label, p->name, (long long)after->step[i],
                  k + 1);
        snprintf(name, sizeof name, "step%d.final.%s", k, p->name);
        const float *want = tensor(g, name, PS_ST_F32, p->numel);
        snprintf(what, sizeof what, "%s %s", label, name);
        if (want) check_array(what, after->w + off, want, (size_t)p->numel, ATOL, RTOL);
        for (int j = 0; j < 2; j++) {
            snprintf(name, sizeof name, "step%d.%s.%s", k, ps_optim_state_name(PS_OPTIM_ADAM, j), p->name);
            want = tensor(g, name, PS_ST_F32, p->numel);
            snprintf(what, sizeof what, "%s %s", label, name);
            if (want) check_array(what, after->s[j] + off, want, (size_t)p->numel, STATE_ATOL, RTOL);
        }
        off += p->numel;
    }
}

static ps_optim_spec adam_spec(double weight_decay) {
    ps_optim_spec s;
    ps_optim_spec_default(PS_OPTIM_ADAM, &s);
    s.lr = 0.01;
    s.weight_decay = weight_decay;
    return s;
}

static void cartpole_adam(const char *backend) {
    char label[64];
    snprintf(label, sizeof label, "%s cartpole_policy adam", backend);
    ps_err err = {0};
    ps_st_file *g = ps_st_read("tests/golden/cartpole_adam.safetensors", &err);
    CHECK_MSG(g, "%s", err.msg);
    const ps_optim_spec spec = adam_spec(0.01);
    ps_model_opts o = {.arch = "cartpole_policy", .cpu_backend = backend, .seed = 3, .compute_threads = 2,
                       .optim = &spec};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!g || !m) { ps_st_free(g); ps_model_free(m); return; }
    CHECK(ps_model_optim(m)->kind == PS_OPTIM_ADAM && ps_model_optim(m)->weight_decay == 0.01);
    set_params(m, g, label);
    const int n = 6;
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "step%d.input", k);
        const float *x = tensor(g, name, PS_ST_F32, n * 4);
        snprintf(name, sizeof name, "step%d.mask", k);
        const float *mask = tensor(g, name, PS_ST_F32, n * 128);
        snprintf(name, sizeof name, "step%d.grad_output", k);
        const float *gout = tensor(g, name, PS_ST_F32, n * 2);
        if (!x || !mask || !gout) break;
        float out[12];
        const float *masks[1] = {mask};
        ps_tape *t = NULL;
        ps_grads *acc = ps_grads_create(m, &err);
        OKE(ps_model_forward_range(m, 0, 0, x, n, 1, masks, 0, out, &t, NULL, &err));
        adam_snap after = {0};
        if (t && acc) {
            OKE(ps_model_backward_acc(m, t, gout, NULL, acc, &err));
            adam_step_check(m, g, acc, k, &after, label);
        }
        snap_free(&after);
        ps_grads_free(acc);
        ps_tape_free(t);
    }
    ps_model_free(m);
    ps_st_free(g);
}

static void rnn_lm_adam(const char *backend) {
    char label[64];
    snprintf(label, sizeof label, "%s rnn_lm adam", backend);
    ps_err err = {0};
    ps_st_file *g = ps_st_read("tests/golden/rnn_lm_adam.safetensors", &err);
    CHECK_MSG(g, "%s", err.msg);
    const ps_optim_spec spec = adam_spec(0);
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = backend, .seed = 3, .compute_threads = 2, .optim = &spec,
                       .n_sizes = 4, .size_key = {"ntoken", "ninp", "nhid", "dropout"},
                       .size_value = {50, 8, 8, 0.2}};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!g || !m) { ps_st_free(g); ps_model_free(m); return; }
    set_params(m, g, label);
    const int enc = ps_model_find_param(m, "encoder.weight");
    CHECK(enc == 0 && ps_model_param(m, enc)->sparse);   /* its slice of a snapshot starts at 0 */
    const int n = 15, rows = 50, width = 8;
    const float *w0 = tensor(g, "init.encoder.weight", PS_ST_F32, rows * width);
    adam_snap prev = {0};
    int hit_ever[50] = {0};
    for (int k = 0; k < 2; k++) {
        char name[64];
        const void *in[6];
        const char *keys[6] = {"emb.input", "emb.mask", "emb.grad_output", "dec.input", "dec.mask",
                               "dec.grad_output"};
        const int64_t numel[6] = {n, n * 8, n * 8, n * 8, n * 8, n * 50};
        int ok = 1;
        for (int q = 0; q < 6; q++) {
            snprintf(name, sizeof name, "step%d.%s", k, keys[q]);
            ok &= (in[q] = tensor(g, name, q ? PS_ST_F32 : PS_ST_I64, numel[q])) != NULL;
        }
        if (!ok || !w0) break;
        const int64_t *ids = in[0];
        int hit[50] = {0};
        for (int i = 0; i < n; i++) hit[ids[i]] = hit_ever[ids[i]] = 1;
        float e[120], d[750];
        ps_tape *te = NULL, *td = NULL;
        const float *emasks[1] = {in[1]}, *dmasks[1] = {in[4]};
        ps_grads *acc = ps_grads_create(m, &err);
        OKE(ps_model_forward_range(m, 0, 0, ids, n, 1, emasks, 0, e, &te, NULL, &err));
        OKE(ps_model_forward_range(m, 1, 1, in[3], n, 1, dmasks, 0, d, &td, NULL, &err));
        adam_snap after = {0};
        if (te && td && acc) {
            OKE(ps_model_backward_acc(m, td, in[5], NULL, acc, &err));
            OKE(ps_model_backward_acc(m, te, in[2], NULL, acc, &err));
            adam_step_check(m, g, acc, k, &after, label);
            /* SparseAdam's laziness, bit for bit: a row this step did not hit
             * keeps weights and moments; one never hit is as initialised. */
            int kept = 0, lazy_nonzero = 0, fresh = 0;
            for (int r = 0; r < rows && after.w; r++) {
                if (hit[r]) continue;
                const size_t o_ = (size_t)r * width, b = (size_t)width * sizeof(float);
                if (hit_ever[r]) {   /* hit at step 0 only */
                    kept += !memcmp(after.w + o_, prev.w + o_, b) && !memcmp(after.s[0] + o_, prev.s[0] + o_, b) &&
                            !memcmp(after.s[1] + o_, prev.s[1] + o_, b);
                    lazy_nonzero += after.s[1][o_] != 0.0f;
                    CHECK_MSG(!memcmp(after.w + o_, prev.w + o_, b), "%s row %d moved at step %d without a hit",
                              label, r, k);
                } else {
                    int zero = 1;
                    for (int j = 0; j < width; j++) zero &= after.s[0][o_ + j] == 0.0f && after.s[1][o_ + j] == 0.0f;
                    fresh += zero && !memcmp(after.w + o_, w0 + o_, b);
                    CHECK_MSG(zero && !memcmp(after.w + o_, w0 + o_, b), "%s row %d never hit but changed", label, r);
                }
            }
            if (k == 1) CHECK_MSG(kept > 0 && kept == lazy_nonzero, "%s: %d rows hit at step 0 only kept, %d with "
                                  "non-zero moments", label, kept, lazy_nonzero);
            CHECK(fresh > 0);
        }
        snap_free(&prev);
        prev = after;
        ps_grads_free(acc);
        ps_tape_free(te);
        ps_tape_free(td);
    }
    snap_free(&prev);
    /* Weight decay has no row-sparse rule: refused at creation, naming both. */
    const ps_optim_spec wd = adam_spec(0.01);
    ps_model_opts bad = o;
    bad.optim = &wd;
    ps_err e2 = {0};
    CHECK(ps_model_create(&bad, &e2) == NULL && e2.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(e2.msg, "encoder.weight is a row-sparse parameter") && strstr(e2.msg, "weight_decay 0.01"),
              "%s", e2.msg);
    ps_model_free(m);
    ps_st_free(g);
}

int main(void) {
    const char *backends[2] = {"ref", "dnnl"};
    for (int b = 0; b < 2; b++) {
        cartpole(backends[b]);
        rnn_lm(backends[b]);
        cartpole_adam(backends[b]);
        rnn_lm_adam(backends[b]);
    }
    return check_summary("test_golden_models");
}
