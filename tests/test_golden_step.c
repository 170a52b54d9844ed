/* test_golden_step - two full training steps of the MNIST CNN against
 * PyTorch (tests/golden/mnist_step.safetensors, written by
 * scripts/gen_golden.py): outputs, loss, every gradient, and the weights
 * after SGD with momentum and weight decay. Runs for each CPU backend;
 * the replay itself is tests/support/golden_replay.c. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "model.h"
#include "safetensors.h"
#include "support/golden_replay.h"

int main(void) {
    ps_err err = {0};
    ps_st_file *g = ps_st_read(GOLDEN_PATH, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (!g) return check_summary("test_golden_step");
    for (const char *const *b = ps_backend_names(); *b; b++) {
        if (!strcmp(*b, "cuda")) continue;  /* GPU placements: test_cuda_step */
        ps_model_opts o;
        golden_model_opts(&o);
        o.cpu_backend = *b;
        ps_model *m = ps_model_create(&o, &err);
        CHECK_MSG(m != NULL, "%s: %s", *b, err.msg);
        if (!m) continue;
        golden_replay(g, m, *b);
        ps_model_free(m);
    }
    ps_st_free(g);
    return check_summary("test_golden_step");
}
