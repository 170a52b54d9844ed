/* golden_replay.h - replay PyTorch's two golden training steps
 * (tests/golden/mnist_step.safetensors, written by scripts/gen_golden.py)
 * on a model and CHECK every output, the loss, the trainer's loss
 * gradient, every parameter gradient and the weights after SGD.
 * Shared by test_golden_step (CPU backends) and test_cuda_step (GPU
 * placements) so both hold the model to the same references and
 * tolerances. */
#ifndef PS_TEST_GOLDEN_REPLAY_H
#define PS_TEST_GOLDEN_REPLAY_H

#include "model.h"
#include "safetensors.h"

#define GOLDEN_PATH "tests/golden/mnist_step.safetensors"

/* The golden tensor `name` as floats, CHECKing its dtype and size; NULL
 * (after a failed CHECK) when absent or different. */
const float *golden_tensor(const ps_st_file *g, const char *name, int64_t expect_numel);

/* m must be an mnist_cnn built with lr 0.03, momentum 0.9, weight decay
 * 1e-4 (golden_model_opts fills those); label prefixes every printed line. */
void golden_replay(const ps_st_file *g, ps_model *m, const char *label);

/* The optimizer settings and architecture the golden file was made with. */
void golden_model_opts(ps_model_opts *o);

#endif
