/* model_run.h - whole-model training calls for the tests, over the executor
 * API psd itself uses (model.h): a forward over every stage, a backward
 * into fresh accumulated gradients. What a test then does with them is the
 * daemon's API too: ps_grads_get, ps_model_step_grads, ps_grads_free. */
#ifndef PS_TEST_MODEL_RUN_H
#define PS_TEST_MODEL_RUN_H

#include <stdint.h>

#include "model.h"

/* ps_model_forward_range over all stages; a batch above the model's
 * max_batch is refused in eval too. */
ps_status run_forward(ps_model *m, const float *x, int n, int train, const float *const *dropout_masks,
                      uint64_t dropout_seed, float *out, ps_tape **tape, uint64_t *version_used, ps_err *err);

/* Backward of the tape from d loss / d output into new gradients (free
 * with ps_grads_free); NULL with err set when it fails. */
ps_grads *run_backward(ps_model *m, ps_tape *t, const float *grad_out, ps_err *err);

#endif
