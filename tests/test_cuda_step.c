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
#include "support/golden_replay.h"

#define NAME "test_cuda_step"

static ps_model *make_model(const char *conv_dev, const char *fc_dev, ps_err *err) {
    ps_model_opts o;
    golden_model_opts(&o);
    o.n_placement = 2;
    o.placement_stage[0] = "conv";
    o.placement_device[0] = conv_dev;
    o.placement_stage[1] = "fc";
    o.placement_device[1] = fc_dev;
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
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        CHECK(!strcmp(p->device, !strcmp(p->stage, "conv") ? conv_dev : fc_dev));
    }
    golden_replay(g, m, label);
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

    ps_st_file *g = ps_st_read(GOLDEN_PATH, &err);
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
