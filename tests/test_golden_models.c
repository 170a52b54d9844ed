/* test_golden_models.c - the models besides the MNIST CNN against PyTorch:
 * tests/golden/cartpole_step.safetensors and rnn_lm_stages.safetensors,
 * written by scripts/gen_golden_models.py (committed; this test does not
 * need PyTorch). For the ref and dnnl backends: forward outputs with the
 * stored dropout masks, parameter gradients, input gradients where the
 * input is float, and the weights after one plain SGD step. The LM's two
 * stages run as one context with two forwards accumulating into one
 * ps_grads (the RPC tutorial's shape: embedding and decoder around the
 * trainer's RNN). */
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

int main(void) {
    const char *backends[2] = {"ref", "dnnl"};
    for (int b = 0; b < 2; b++) {
        cartpole(backends[b]);
        rnn_lm(backends[b]);
    }
    return check_summary("test_golden_models");
}
