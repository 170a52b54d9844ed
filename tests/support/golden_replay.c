/* golden_replay.c - replays PyTorch's golden MNIST training steps on a
 * model and checks every output and gradient (golden_replay.h). */
#include "golden_replay.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "model_run.h"

const float *golden_tensor(const ps_st_file *g, const char *name, int64_t expect_numel) {
    const ps_st_tensor *t = ps_st_find(g, name);
    CHECK_MSG(t != NULL, "golden file lacks %s", name);
    if (!t) return NULL;
    int ok = t->dtype == PS_ST_F32 && ps_st_numel(t) == expect_numel;
    CHECK_MSG(ok, "%s: dtype/size", name);
    return ok ? t->data : NULL;
}

void golden_model_opts(ps_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->arch = "mnist_cnn";
    o->cpu_backend = "dnnl";
    o->seed = 1;
    o->compute_threads = 2;
    o->lr = 0.03f;
    o->momentum = 0.9f;
    o->weight_decay = 1e-4f;
}

/* max |a-b| / max(|b|) over n values: the error relative to the tensor's scale. */
static double rel_err(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || isnan(d)) md = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return mb > 0 ? md / mb : md;
}

static void compare(const char *label, const char *what, const float *got, const float *want, int64_t n,
                    double tol) {
    double e = rel_err(got, want, n);
    CHECK_MSG(e <= tol, "%s: %s: relative error %.3g > %.3g", label, what, e, tol);
    printf("  %-22s %-30s rel err %.2e\n", label, what, e);
}

void golden_replay(const ps_st_file *g, ps_model *m, const char *label) {
    ps_err err = {0};
    int np = ps_model_num_params(m);
    CHECK(np == 8);
    char name[160];
    for (int i = 0; i < np; i++) {
        const ps_param_info *p = ps_model_param(m, i);
        snprintf(name, sizeof name, "init.%s", p->name);
        const float *w = golden_tensor(g, name, p->numel);
        if (w) CHECK(ps_model_set_param(m, i, w, &err) == PS_OK);
    }
    const int n = 8, k = 10;
    for (int step = 1; step <= 2; step++) {
        char key[64];
        snprintf(key, sizeof key, "step%d.input", step);
        const float *x = golden_tensor(g, key, (int64_t)n * 784);
        snprintf(key, sizeof key, "step%d.mask1", step);
        const float *m1 = golden_tensor(g, key, (int64_t)n * 64);   /* Dropout2d: per channel */
        snprintf(key, sizeof key, "step%d.mask2", step);
        const float *m2 = golden_tensor(g, key, (int64_t)n * 128);
        snprintf(key, sizeof key, "step%d.output", step);
        const float *want_out = golden_tensor(g, key, (int64_t)n * k);
        snprintf(key, sizeof key, "step%d.grad_output", step);
        const float *gout = golden_tensor(g, key, (int64_t)n * k);
        snprintf(key, sizeof key, "step%d.loss", step);
        const float *want_loss = golden_tensor(g, key, 1);
        snprintf(key, sizeof key, "step%d.target", step);
        const ps_st_tensor *tt = ps_st_find(g, key);
        CHECK(tt && tt->dtype == PS_ST_I64 && ps_st_numel(tt) == n);
        if (!x || !m1 || !m2 || !want_out || !gout || !want_loss || !tt) break;
        const int64_t *target = tt->data;

        const float *masks[2] = {m1, m2};
        float out[80];
        ps_tape *tape = NULL;
        CHECK_MSG(run_forward(m, x, n, 1, masks, 0, out, &tape, NULL, &err) == PS_OK, "%s: %s", label,
                  err.msg);
        if (!tape) break;
        snprintf(key, sizeof key, "step%d output", step);
        compare(label, key, out, want_out, (int64_t)n * k, 2e-5);
        /* The trainer's loss and gradient, computed as ps-train does. */
        double loss = 0;
        float grad[80] = {0};
        for (int i = 0; i < n; i++) {
            loss -= out[i * k + target[i]];
            grad[i * k + target[i]] = -1.0f / n;
        }
        CHECK_CLOSE(loss / n, want_loss[0], 1e-5, 1e-5);
        compare(label, "grad_output", grad, gout, (int64_t)n * k, 1e-7);
        ps_grads *grads = run_backward(m, tape, gout, &err);
        CHECK_MSG(grads != NULL, "%s: %s", label, err.msg);
        for (int i = 0; i < np; i++) {
            const ps_param_info *p = ps_model_param(m, i);
            snprintf(name, sizeof name, "step%d.grad.%s", step, p->name);
            const float *want = golden_tensor(g, name, p->numel);
            float *got = malloc((size_t)p->numel * sizeof(float));
            CHECK(grads && ps_grads_get(m, grads, i, got, &err) == PS_OK);
            if (want) compare(label, name, got, want, p->numel, 2e-5);
            free(got);
        }
        uint64_t v = 0;
        CHECK(grads && ps_model_step_grads(m, grads, &v, &err) == PS_OK);
        CHECK(v == (uint64_t)step);
        ps_grads_free(grads);
        ps_tape_free(tape);
    }
    for (int i = 0; i < np; i++) {
        const ps_param_info *p = ps_model_param(m, i);
        snprintf(name, sizeof name, "final.%s", p->name);
        const float *want = golden_tensor(g, name, p->numel);
        float *got = malloc((size_t)p->numel * sizeof(float));
        CHECK(ps_model_get_param(m, i, got, &err) == PS_OK);
        if (want) compare(label, name, got, want, p->numel, 1e-5);
        free(got);
    }
    /* Eval mode: no dropout, no tape; must equal a train forward with all-ones masks. */
    const float *x = golden_tensor(g, "step1.input", (int64_t)n * 784);
    if (x) {
        float ev[80], tr[80];
        float *ones1 = malloc(sizeof(float) * n * 64), *ones2 = malloc(sizeof(float) * n * 128);
        for (int i = 0; i < n * 64; i++) ones1[i] = 1;
        for (int i = 0; i < n * 128; i++) ones2[i] = 1;
        const float *ones[2] = {ones1, ones2};
        CHECK(run_forward(m, x, n, 0, NULL, 0, ev, NULL, NULL, &err) == PS_OK);
        CHECK(run_forward(m, x, n, 1, ones, 0, tr, NULL, NULL, &err) == PS_OK);
        compare(label, "eval == train without dropout", ev, tr, (int64_t)n * k, 1e-6);
        free(ones1);
        free(ones2);
    }
}
