/* model_run.c - whole-model training calls for the tests over psd's
 * executor API (see model_run.h). */
#include "model_run.h"

ps_status run_forward(ps_model *m, const float *x, int n, int train, const float *const *dropout_masks,
                      uint64_t dropout_seed, float *out, ps_tape **tape, uint64_t *version_used, ps_err *err) {
    if (n > ps_model_max_batch(m))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "batch size %d is outside 1..%d", n, ps_model_max_batch(m));
    return ps_model_forward_range(m, 0, ps_model_num_stages(m) - 1, x, n, train, dropout_masks, dropout_seed, out,
                                  tape, version_used, err);
}

ps_grads *run_backward(ps_model *m, ps_tape *t, const float *grad_out, ps_err *err) {
    ps_grads *g = ps_grads_create(m, err);
    if (g && ps_model_backward_acc(m, t, grad_out, NULL, g, err) != PS_OK) {
        ps_grads_free(g);
        g = NULL;
    }
    return g;
}
