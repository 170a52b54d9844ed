/* test_cuda_step - two full training steps of the MNIST CNN with stages on
 * CUDA devices against PyTorch (tests/golden/mnist_step.safetensors, as
 * test_golden_step does for the CPU backends): outputs, loss, every
 * gradient and the weights after SGD with momentum and weight decay, for
 * the placements
 *   conv cuda:0, fc cuda:0      (device-to-device stage boundary)
 *   conv cuda:0, fc cuda:0      with PS_CUDA_STAGE_COPY=host (the
 *                               two-device path through pinned memory)
 *   conv cpu,    fc cuda:0      (host -> device boundary)
 *   conv cuda:0, fc cpu         (device -> host boundary)
 *   conv cuda:0, fc cuda:1      when a second device exists.
 * Also: a placement on a device past the last one is refused naming the
 * stage and the devices found. Without a CUDA device it prints
 * "skipped: no CUDA device" and exits 77.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "model.h"
#include "safetensors.h"

#define NAME "test_cuda_step"
static const char *golden_path = "tests/golden/mnist_step.safetensors";

static const float *tensor(const ps_st_file *f, const char *name, int64_t expect_numel) {
    const ps_st_tensor *t = ps_st_find(f, name);
    CHECK_MSG(t != NULL, "golden file lacks %s", name);
    if (!t) return NULL;
    CHECK_MSG(t->dtype == PS_ST_F32 && ps_st_numel(t) == expect_numel, "%s: dtype/size", name);
    return t->dtype == PS_ST_F32 && ps_st_numel(t) == expect_numel ? t->data : NULL;
}

/* max |a-b| / max(|b|): the error relative to the tensor's scale. */
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
    printf("  %-22s %-28s rel err %.2e\n", label, what, e);
}

static ps_model *make_model(const char *conv_dev, const char *fc_dev, ps_err *err) {
    ps_model_opts o = {0};
    o.arch = "mnist_cnn";
    o.cpu_backend = "dnnl";
    o.n_placement = 2;
    o.placement_stage[0] = "conv";
    o.placement_device[0] = conv_dev;
    o.placement_stage[1] = "fc";
    o.placement_device[1] = fc_dev;
    o.seed = 1;
    o.compute_threads = 2;
    o.lr = 0.03f;
    o.momentum = 0.9f;
    o.weight_decay = 1e-4f;
    return ps_model_create(&o, err);
}

static void run_placement(const ps_st_file *g, const char *conv_dev, const char *fc_dev, const char *stage_copy) {
    char label[64];
    snprintf(label, sizeof label, "%s|%s%s", conv_dev, fc_dev, stage_copy ? " (staged)" : "");
    if (stage_copy) setenv("PS_CUDA_STAGE_COPY", stage_copy, 1);
    ps_err err = {0};
    ps_model *m = make_model(conv_dev, fc_dev, &err);
    unsetenv("PS_CUDA_STAGE_COPY");
    CHECK_MSG(m != NULL, "%s: %s", label, err.msg);
    if (!m) return;
    int np = ps_model_num_params(m);
    CHECK(np == 8);
    char name[160];
    for (int i = 0; i < np; i++) {
        const ps_param_info *p = ps_model_param(m, i);
        CHECK(!strcmp(p->device, !strcmp(p->stage, "conv") ? conv_dev : fc_dev));
        snprintf(name, sizeof name, "init.%s", p->name);
        const float *w = tensor(g, name, p->numel);
        if (w) CHECK(ps_model_set_param(m, i, w, &err) == PS_OK);
    }
    const int n = 8, k = 10;
    for (int step = 1; step <= 2; step++) {
        char key[64];
        snprintf(key, sizeof key, "step%d.input", step);
        const float *x = tensor(g, key, (int64_t)n * 784);
        snprintf(key, sizeof key, "step%d.mask1", step);
        const float *m1 = tensor(g, key, (int64_t)n * 64 * 12 * 12);
        snprintf(key, sizeof key, "step%d.mask2", step);
        const float *m2 = tensor(g, key, (int64_t)n * 128);
        snprintf(key, sizeof key, "step%d.output", step);
        const float *want_out = tensor(g, key, (int64_t)n * k);
        snprintf(key, sizeof key, "step%d.grad_output", step);
        const float *gout = tensor(g, key, (int64_t)n * k);
        snprintf(key, sizeof key, "step%d.loss", step);
        const float *want_loss = tensor(g, key, 1);
        snprintf(key, sizeof key, "step%d.target", step);
        const ps_st_tensor *tt = ps_st_find(g, key);
        CHECK(tt && tt->dtype == PS_ST_I64 && ps_st_numel(tt) == n);
        if (!x || !m1 || !m2 || !want_out || !gout || !want_loss || !tt) break;
        const int64_t *target = tt->data;

        const float *masks[2] = {m1, m2};
        float out[80];
        ps_tape *tape = NULL;
        CHECK_MSG(ps_model_forward(m, x, n, 1, masks, 0, out, &tape, NULL, &err) == PS_OK, "%s", err.msg);
        if (!tape) break;
        snprintf(key, sizeof key, "step%d output", step);
        compare(label, key, out, want_out, (int64_t)n * k, 2e-5);
        double loss = 0;
        for (int i = 0; i < n; i++) loss -= out[i * k + target[i]];
        CHECK_CLOSE(loss / n, want_loss[0], 1e-5, 1e-5);
        CHECK_MSG(ps_model_backward(m, tape, gout, &err) == PS_OK, "%s", err.msg);
        for (int i = 0; i < np; i++) {
            const ps_param_info *p = ps_model_param(m, i);
            snprintf(name, sizeof name, "step%d.grad.%s", step, p->name);
            const float *want = tensor(g, name, p->numel);
            float *got = malloc((size_t)p->numel * sizeof(float));
            CHECK(ps_tape_get_grad(m, tape, i, got, &err) == PS_OK);
            if (want) compare(label, name, got, want, p->numel, 2e-5);
            free(got);
        }
        uint64_t v = 0;
        CHECK(ps_model_step(m, tape, &v, &err) == PS_OK);
        CHECK(v == (uint64_t)step);
        ps_tape_free(tape);
    }
    for (int i = 0; i < np; i++) {
        const ps_param_info *p = ps_model_param(m, i);
        snprintf(name, sizeof name, "final.%s", p->name);
        const float *want = tensor(g, name, p->numel);
        float *got = malloc((size_t)p->numel * sizeof(float));
        CHECK(ps_model_get_param(m, i, got, &err) == PS_OK);
        if (want) compare(label, name, got, want, p->numel, 1e-5);
        free(got);
    }
    /* eval forward (no tape, input straight to the device) == train forward with all-ones masks */
    const float *x = tensor(g, "step1.input", (int64_t)n * 784);
    if (x) {
        float ev[80], tr[80];
        float *ones1 = malloc(sizeof(float) * n * 64 * 144), *ones2 = malloc(sizeof(float) * n * 128);
        for (int i = 0; i < n * 64 * 144; i++) ones1[i] = 1;
        for (int i = 0; i < n * 128; i++) ones2[i] = 1;
        const float *ones[2] = {ones1, ones2};
        CHECK(ps_model_forward(m, x, n, 0, NULL, 0, ev, NULL, NULL, &err) == PS_OK);
        CHECK(ps_model_forward(m, x, n, 1, ones, 0, tr, NULL, NULL, &err) == PS_OK);
        compare(label, "eval == train without dropout", ev, tr, (int64_t)n * k, 1e-6);
        free(ones1);
        free(ones2);
    }
    ps_model_free(m);
}

int main(void) {
    ps_err err = {0};
    ps_backend *probe = ps_backend_create("cuda", 0, 0, &err);
    if (!probe) {
        if (err.code == PS_ERR_UNAVAILABLE) {
            char why[PS_ERR_MSG_MAX + 32];
            snprintf(why, sizeof why, "no CUDA device (%s)", err.msg);
            return check_skip(NAME, why);
        }
        CHECK_MSG(probe != NULL, "%s", err.msg);
        return check_summary(NAME);
    }
    ps_backend_free(probe);
    ps_backend *second = ps_backend_create("cuda", 1, 0, &err);
    int two = second != NULL;
    ps_backend_free(second);

    ps_st_file *g = ps_st_read(golden_path, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (!g) return check_summary(NAME);
    run_placement(g, "cuda:0", "cuda:0", NULL);
    run_placement(g, "cuda:0", "cuda:0", "host");
    run_placement(g, "cpu", "cuda:0", NULL);
    run_placement(g, "cuda:0", "cpu", NULL);
    if (two) run_placement(g, "cuda:0", "cuda:1", NULL);
    else printf("one CUDA device: conv cuda:0 | fc cuda:1 is not run\n");

    /* A device past the last one: refused, naming the stage and the devices. */
    ps_err e = {0};
    CHECK(make_model("cuda:0", "cuda:63", &e) == NULL);
    CHECK_MSG(e.code == PS_ERR_INVALID_ARGUMENT && strstr(e.msg, "model.placement.fc: cuda:63") &&
              strstr(e.msg, "CUDA devices found: ") && strstr(e.msg, "cuda:0 "), "%s", e.msg);
    printf("expected error: %s\n", e.msg);
    ps_st_free(g);
    return check_summary(NAME);
}
