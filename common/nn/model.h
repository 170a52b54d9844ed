/* model.h - a model hosted by psd: named stages of layers, each stage placed
 * on a device with its own backend.
 *
 * A model is built from an architecture definition (a table of stages, each
 * a sequence of layers; see model.c: "mnist_cnn" is PyTorch's RPC
 * parameter-server tutorial network, stages "conv" and "fc"). Parameters use
 * PyTorch's state_dict names and default initialisation, one block per stage.
 *
 * Ownership and concurrency:
 *  - ps_model owns the weights and the optimizer state (momentum buffers).
 *  - A ps_tape is what one forward pass keeps for its backward pass
 *    (activations, dropout masks, pooling workspaces) plus that context's
 *    parameter gradients. It belongs to one request context; the caller
 *    frees it with ps_tape_free. Gradients go into the tape, never into
 *    shared state.
 *  - Consistency (hogwild with a readers/writer lock): forward and backward
 *    hold the weights lock shared, step holds it exclusively, so every
 *    operation sees one consistent set of weights and no step tears another.
 *    Steps of different trainers interleave asynchronously: a context's
 *    gradient is computed against the weights current at its Backward, which
 *    may be a few steps newer than those its Forward used.
 *  - All functions are thread-safe for distinct tapes.
 */
#ifndef PS_NN_MODEL_H
#define PS_NN_MODEL_H

#include <stdint.h>
#include <stddef.h>

#include "backend.h"
#include "status.h"

#define PS_MODEL_MAX_STAGES 8

typedef struct ps_model ps_model;
typedef struct ps_tape ps_tape;

typedef struct ps_model_opts {
    const char *arch;              /* "mnist_cnn" */
    const char *cpu_backend;       /* backend for stages on "cpu": "dnnl" or "ref" */
    int n_placement;               /* (stage, device) pairs; stages not named go to "cpu" */
    const char *placement_stage[PS_MODEL_MAX_STAGES];
    const char *placement_device[PS_MODEL_MAX_STAGES]; /* "cpu", "cuda:0", ... */
    uint64_t seed;                 /* initial weights and dropout streams */
    int compute_threads;           /* thread budget (0 = online CPUs): each forward or
                                      backward runs on budget / (calls computing at
                                      once) threads, at least 1; a step on all */
    float lr, momentum, weight_decay; /* SGD (torch.optim.SGD semantics) */
} ps_model_opts;

typedef struct ps_param_info {
    const char *name;              /* "conv1.weight" */
    int ndim;
    int64_t dims[4];
    int64_t numel;
    const char *stage;             /* "conv" */
    const char *device;            /* "cpu" */
} ps_param_info;

/* Names of the architectures this build knows, NULL-terminated. */
const char *const *ps_model_arch_names(void);

/* Build the model: validates arch, stage names and devices (an unknown stage
 * or a device without a backend is PS_ERR_INVALID_ARGUMENT naming it). */
ps_model *ps_model_create(const ps_model_opts *opts, ps_err *err);
void ps_model_free(ps_model *m);

const char *ps_model_arch(const ps_model *m);
int ps_model_num_params(const ps_model *m);
const ps_param_info *ps_model_param(const ps_model *m, int i);
int ps_model_find_param(const ps_model *m, const char *name); /* -1 if absent */
int64_t ps_model_num_weights(const ps_model *m);  /* total parameter count */

/* Per-sample input shape (c, h, w) and number of outputs per sample. */
void ps_model_input_shape(const ps_model *m, int *c, int *h, int *w);
int ps_model_output_size(const ps_model *m);
/* Largest batch a single forward accepts. */
int ps_model_max_batch(const ps_model *m);

/* Number of optimizer steps applied so far (the model version). */
uint64_t ps_model_version(const ps_model *m);

/* Copy a parameter to / from host memory (numel floats). set_param takes the
 * weights lock exclusively and resets that parameter's momentum. */
ps_status ps_model_get_param(ps_model *m, int i, float *host_dst, ps_err *err);
ps_status ps_model_set_param(ps_model *m, int i, const float *host_src, ps_err *err);

/* Forward pass of a batch x (n, c, h, w) in host memory; writes n *
 * output_size floats to host out. With train != 0, dropout is active and
 * *tape receives what backward needs (free with ps_tape_free); with
 * train == 0 (eval), tape may be NULL and nothing is kept.
 * dropout_masks, when not NULL, supplies one host mask per dropout layer in
 * order (values 0 or 1/(1-p), shaped like the layer's input) instead of the
 * model's RNG - used by the golden-file tests. dropout_seed seeds this
 * forward's dropout stream (e.g. derived from the context id). */
ps_status ps_model_forward(ps_model *m, const float *x, int n, int train,
                           const float *const *dropout_masks, uint64_t dropout_seed,
                           float *out, ps_tape **tape, uint64_t *version_used, ps_err *err);

/* Backward pass from d loss / d output (n, output_size, host memory); the
 * parameter gradients land in the tape (overwriting earlier ones). */
ps_status ps_model_backward(ps_model *m, ps_tape *tape, const float *grad_out, ps_err *err);

/* 1 once backward has filled the tape's gradients. */
int ps_tape_has_grads(const ps_tape *t);
int ps_tape_batch(const ps_tape *t);
/* Copy parameter i's gradient from the tape to host memory. */
ps_status ps_tape_get_grad(ps_model *m, const ps_tape *t, int i, float *host_dst, ps_err *err);

/* Apply SGD with the tape's gradients (exclusive weights lock); returns the
 * new version in *version. The tape stays valid; the caller frees it. */
ps_status ps_model_step(ps_model *m, const ps_tape *t, uint64_t *version, ps_err *err);

/* Bytes a tape of batch n holds (activations + gradients), for limits. */
size_t ps_model_tape_bytes(const ps_model *m, int n);

void ps_tape_free(ps_tape *t);

/* ---- checkpoint support (used by psd's server/checkpoint.c) ---- */

/* 1 when the optimizer keeps momentum buffers (momentum > 0). */
int ps_model_has_momentum(const ps_model *m);

/* A consistent copy of the training state, taken under one shared weights
 * lock (no step lands halfway): every parameter in parameter order,
 * concatenated (ps_model_num_weights floats), into w; when mom is not NULL
 * and the model has momentum, the momentum buffers laid out the same way,
 * with started[i] = 1 when parameter i's buffer exists (PyTorch creates it
 * at a parameter's first step; an unstarted buffer is left zero); and the
 * model version. */
ps_status ps_model_snapshot(ps_model *m, float *w, float *mom, unsigned char *started,
                            uint64_t *version, ps_err *err);

/* Set parameter i's momentum buffer from host memory (numel floats), or,
 * with NULL, mark it not started (the next step starts it, as PyTorch's
 * first step). Call after ps_model_set_param, which resets it.
 * FAILED_PRECONDITION when the model has no momentum. */
ps_status ps_model_set_momentum(ps_model *m, int i, const float *host_src, ps_err *err);

/* Set the model version (steps applied), e.g. when resuming. */
void ps_model_set_version(ps_model *m, uint64_t version);

#endif
