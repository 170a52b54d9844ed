/* model.h - a model hosted by psd: named stages of layers, each stage placed
 * on a device with its own backend.
 *
 * A model is built from a model file (modeldef.h: stages of layers;
 * configs/models/mnist_cnn.yaml is PyTorch's RPC parameter-server tutorial
 * network, stages "conv" and "fc"). Parameters use PyTorch's state_dict names and
 * initialisation, one block per stage.
 *
 * Shapes: every stage has a per-sample input shape (0..3 dims) and dtype
 * and a per-sample output shape (ps_stage_info). A batch is (leading
 * dims..., per-sample dims); the functions here take n = the product of the
 * leading dims, so (seq, batch) ids are n = seq*batch samples of shape ().
 *
 * Ownership and concurrency:
 *  - ps_model owns the weights and the optimizer state (optim.h: one
 *    ps_optim_state per parameter - SGD's momentum buffer, Adam's exp_avg
 *    and exp_avg_sq - and its step count), allocated and zero-filled with
 *    the weights at creation, so a step never allocates it.
 *  - A ps_tape is what one forward pass over a run of stages keeps for its
 *    backward pass (activations, dropout masks, pooling workspaces). It
 *    belongs to one request context; the caller frees it with ps_tape_free.
 *  - A ps_grads holds the parameter gradients a context accumulated over
 *    any number of tapes (dense blocks per stage, row-sparse rows for
 *    embedding tables). Gradients go into it, never into shared state.
 *  - Consistency (hogwild with a readers/writer lock): forward and backward
 *    hold the weights lock shared, step holds it exclusively, so every
 *    operation sees one consistent set of weights and no step tears another.
 *    With snapshot_steps the guarantee is the same without the waiting: a
 *    step computes the next version in a copy of the weights and publishes
 *    it at once; calls already running finish on the version they began.
 *    A stage with a row-sparse parameter (an embedding table) is not
 *    copied: a step writes its rows in place while calls reading that
 *    stage are held off, so only they wait (model.c, "Snapshot steps").
 *    Steps of different trainers interleave asynchronously: a context's
 *    gradient is computed against the weights current at its Backward, which
 *    may be a few steps newer than those its Forward used.
 *  - All functions are thread-safe for distinct tapes.
 */
#ifndef PS_NN_MODEL_H
#define PS_NN_MODEL_H

#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

#include "backend.h"
#include "optim.h"
#include "status.h"

#include "modeldef.h"
#include "tensor.h"

#define PS_MODEL_MAX_SIZE_KEYS 8

typedef struct ps_model ps_model;
typedef struct ps_tape ps_tape;

typedef struct ps_model_opts {
    const char *arch;              /* model.arch: a shipped model file (modeldef.h), "mnist_cnn" */
    const char *file;              /* model.file: a model file's path; when set, arch is not used */
    const char *origin;            /* what led to the model file, prefixed to its errors
                                      (ps_config_model_origin: "psd.yaml: model.file");
                                      NULL: none */
    const char *cpu_backend;       /* backend for stages on "cpu": "dnnl" or "ref" */
    int n_placement;               /* (stage, device) pairs; stages not named go to "cpu" */
    const char *placement_stage[PS_MODEL_MAX_STAGES];
    const char *placement_device[PS_MODEL_MAX_STAGES]; /* "cpu", "cuda:0", ... */
    uint64_t seed;                 /* initial weights and dropout streams */
    int snapshot_steps;            /* 1: a step writes the next weights into a copy and
                                      publishes it, so forwards and backwards never wait
                                      for a step nor a step for them (up to 4 copies of
                                      the weights; a stage with a row-sparse parameter
                                      has one copy, stepped in place, and only calls
                                      reading that stage wait for a step writing it);
                                      0: steps update in place under the exclusive lock
                                      (see "Consistency" above) */
    int compute_threads;           /* thread budget (0 = online CPUs): each forward or
                                      backward runs on budget / (the most calls
                                      computing at once in the last second) threads,
                                      at least 1; a step on all */
    int pin_compute;               /* 1: a call computing on one thread while others
                                      compute holds one of psd's CPUs (its thread is
                                      bound to it) until it ends; see model.c */
    const ps_optim_spec *optim;    /* the optimizer (optim.h: kind and hyper-parameters),
                                      copied; NULL: SGD from lr, momentum, weight_decay */
    float lr, momentum, weight_decay; /* shorthand for SGD (torch.optim.SGD semantics) when
                                         optim is NULL */
    int n_sizes;                   /* (key, value) pairs of the model's sizes (its model
                                      file's sizes:); sizes not named take the file's defaults */
    const char *size_key[PS_MODEL_MAX_SIZE_KEYS];
    double size_value[PS_MODEL_MAX_SIZE_KEYS];
    /* Several PS nodes (common/placement.h). n_hosted == 0: every stage of
     * the model is built here (the single-server form). Otherwise only the
     * named stages are built - the others have no parameters, backend or
     * memory here, though every stage's shapes are still inferred - and
     * ps_model_num_stages / ps_model_stage / ps_model_param enumerate the
     * hosted stages and their parameters only, in model order. */
    int n_hosted;
    const char *hosted[PS_MODEL_MAX_STAGES];
    /* shard_stage (NULL = none), a hosted stage whose first layer is an
     * embedding of R rows: this model holds only its global rows
     * [shard_lo, shard_hi), the table parameter keeps its state_dict name
     * with (shard_hi - shard_lo) rows, ids stay global (an id outside the
     * range is INVALID_ARGUMENT naming it and the range), and the initial
     * rows equal rows [shard_lo, shard_hi) of the whole model built with
     * the same seed. */
    const char *shard_stage;
    int64_t shard_lo, shard_hi;
} ps_model_opts;

typedef struct ps_param_info {
    const char *name;              /* "conv1.weight" */
    int ndim;
    int64_t dims[4];
    int64_t numel;
    const char *stage;             /* "conv" */
    const char *device;            /* "cpu" */
    int stage_index;
    int sparse;                    /* 1: row-sparse gradient and update (embedding table) */
    int64_t row_offset;            /* a shard's table (shard_stage): it holds global rows
                                      [row_offset, row_offset + dims[0]) ... */
    int64_t rows_total;            /* ... of rows_total; 0 = not a shard (the whole parameter) */
} ps_param_info;

/* A buffer: state of a node that is not trained (BatchNorm's
 * running_mean, running_var, num_batches_tracked). Never part of
 * gradients; checkpointed under its state_dict name. */
typedef struct ps_buffer_info {
    const char *name;              /* "bn1.running_mean" */
    int ndim;                      /* 0 for a scalar (num_batches_tracked) */
    int64_t dims[4];
    int64_t numel;
    ps_dtype dtype;                /* float32, or int64 (counters) */
    const char *stage;
    const char *device;
    int stage_index;               /* hosted stage; -1 in the definition's list for one hosted elsewhere */
    int external;                  /* a Constant's: no values of its own (ps_model_unset_constant) */
} ps_buffer_info;

typedef struct ps_stage_info {
    const char *name;              /* "conv" */
    const char *device;            /* "cpu", "cuda:0" */
    int in_ndim;                   /* per-sample input */
    int64_t in_dims[4];
    ps_dtype in_dtype;
    int out_ndim;                  /* per-sample output (always float32) */
    int64_t out_dims[4];
    int params;                    /* parameters of the stage */
    int params_only;               /* 1: a parameter-only stage (rnn_lm's "rnn"): never forwarded;
                                      its gradients come from ps_grads_add_dense (PushGradients) */
    int64_t row_lo, row_hi;        /* the shard stage: global ids it answers; both 0 = not sharded */
    int fused_bn_relu;             /* BatchNorm + ReLU (ReLU6, LeakyReLU) pairs its backend computes as one
                                      (server/nn/exec.c) */
} ps_stage_info;

typedef struct ps_grads ps_grads;

/* Build the model: validates arch, sizes, stage names, devices and the
 * optimizer (an unknown stage or size, a device without a backend, a layer
 * kind the stage's backend lacks, an optimizer setting out of range
 * (ps_optim_check), and with a row-sparse parameter (embedding table)
 * anything its row-sparse update refuses - sgd momentum, weight decay -
 * are PS_ERR_INVALID_ARGUMENT naming it).
 *
 * Every dense parameter is updated with the optimizer's dense rule
 * (ps_optim_step: torch.optim.SGD or torch.optim.Adam), every row-sparse
 * one with its row-sparse rule (ps_optim_step_rows: plain SGD on the
 * touched rows, or torch.optim.SparseAdam's lazy update: only the touched
 * rows' weights and moments change, one step count per parameter). */
ps_model *ps_model_create(const ps_model_opts *opts, ps_err *err);
void ps_model_free(ps_model *m);

/* The stage table of opts' model (psd --check-config), every stage of its
 * definition, without building weights or backends: per stage its input
 * and output shapes and dtypes, parameters, FLOPs and the bytes of
 * activations a training forward keeps per sample (its memory plan on a
 * plain layout), and where[s] (NULL: opts' placement device). Errors as
 * ps_model_create (the model file's name file:line and the node). */
ps_status ps_model_describe(const ps_model_opts *opts, const char *const *where, FILE *f, ps_err *err);

const char *ps_model_arch(const ps_model *m);
/* The backend running stage s (0-based), NULL past the last stage: for
 * asking it ps_backend_fallbacks() (psd's start-up check, the ISA test). */
const ps_backend *ps_model_stage_backend(const ps_model *m, int s);
int ps_model_num_params(const ps_model *m);
const ps_param_info *ps_model_param(const ps_model *m, int i);
int ps_model_find_param(const ps_model *m, const char *name); /* -1 if absent */
int64_t ps_model_num_weights(const ps_model *m);  /* total parameter count */
/* Every parameter of the model's definition, hosted here or not, in
 * state_dict order, with the whole model's shapes (a shard's table with all
 * its rows, row_offset 0, rows_total 0); stage_index is the hosted stage's
 * index, -1 for a stage hosted elsewhere (device "elsewhere"). The
 * single-server form: the same as ps_model_param. For checking a full
 * state_dict against a hosted subset (--init-from). */
int ps_model_num_def_params(const ps_model *m);
const ps_param_info *ps_model_def_param(const ps_model *m, int i);

/* Tied parameters (tie: in the model file, docs/models.md "Shared
 * parameters"): the borrowing node's state_dict name of a parameter another
 * node owns ("decoder.weight" of "encoder.weight"). PyTorch's state_dict
 * holds both keys, one storage: checkpoints write the alias beside its
 * owner (the owner's values) and loaders accept it when it equals the
 * owner. Alias i (0..ps_model_num_aliases - 1): its name, and in *owner
 * the index of its owner among ps_model_def_param. (share: lends a whole
 * node, one module called at several sites: one key, no alias.) */
int ps_model_num_aliases(const ps_model *m);
const char *ps_model_alias(const ps_model *m, int i, int *owner);

/* Where a parameter or buffer (by state_dict name) is defined:
 * "[origin: ]path:line: node 'fc1'" into buf (the model file's path when
 * no node has that name; origin: ps_model_opts.origin). For errors about it. */
const char *ps_model_where(const ps_model *m, const char *name, char *buf, size_t cap);

/* ---- buffers ---- */

/* The buffers of the hosted stages, in state_dict order. */
int ps_model_num_buffers(const ps_model *m);
const ps_buffer_info *ps_model_buffer(const ps_model *m, int i);   /* NULL if out of range */
/* The name of a hosted buffer with no values of its own (a Constant's, whose
 * values come from --init-from, a checkpoint or the ONNX file), or NULL. */
const char *ps_model_unset_constant(const ps_model *m);
int ps_model_find_buffer(const ps_model *m, const char *name);     /* -1 if absent */
/* Every buffer of the definition, hosted here or not (stage_index -1 for
 * the others), as ps_model_def_param. */
int ps_model_num_def_buffers(const ps_model *m);
const ps_buffer_info *ps_model_def_buffer(const ps_model *m, int i);
/* Copy buffer i to / from host memory: numel values of its dtype (float
 * or int64_t). set_buffer takes the weights lock exclusively. */
ps_status ps_model_get_buffer(ps_model *m, int i, void *host_dst, ps_err *err);
ps_status ps_model_get_buffer_rows(ps_model *m, int i, int64_t row0, int64_t nrows, void *host_dst, ps_err *err);
ps_status ps_model_set_buffer(ps_model *m, int i, const void *host_src, ps_err *err);

/* Name tape t's forward for the running statistics: its key (the context)
 * and seq (the forward's number in it). A step folds the statistics of the
 * training forwards whose backwards went into its gradients in (key, seq)
 * order (each tape once, at its first backward), so a context's forwards
 * fold in sequence order - PyTorch's order - whatever order their
 * backwards ran in, and a context that never steps changes nothing. */
void ps_tape_set_key(ps_tape *t, uint64_t key, uint32_t seq);

/* ---- stages ---- */
int ps_model_num_stages(const ps_model *m);

/* What the GPU stages hold of their devices' memory, one entry per device
 * (its stages' backends summed; backend.h memory_stats): returns the
 * number of entries written (<= max), 0 when no stage is on a GPU. */
typedef struct ps_device_memory {
    char device[32];                      /* "cuda:0" */
    uint64_t live, cached;                /* psd's stages' pools: in use; freed and kept for reuse */
    uint64_t device_free, device_total;   /* the whole device */
} ps_device_memory;
int ps_model_device_memory(const ps_model *m, ps_device_memory *out, int max);
const ps_stage_info *ps_model_stage(const ps_model *m, int s);   /* NULL if out of range */
int ps_model_find_stage(const ps_model *m, const char *name);    /* -1 if absent */

/* Forward of stages first..last (a consecutive run whose shapes chain) on n
 * samples. x is host memory of the first stage's in_dtype, n x per-sample
 * input; out receives n x per-sample output of the last stage (float).
 * Int64 ids outside an embedding's rows are INVALID_ARGUMENT naming the
 * index and the value.
 * train != 0: dropout is active and *tape (when tape is not NULL) receives
 * what backward needs; n is at most ps_model_max_batch.
 * train == 0 (eval): any n; it runs in slices of at most 64 samples under
 * ONE acquisition of the weights lock, so the whole call sees one weights
 * version (*version_used) and memory stays bounded; nothing is kept (a
 * model with a BatchNorm without running statistics, which normalises an
 * eval batch by its own statistics as PyTorch does, runs it whole).
 * Dropout masks are per dropout node in the model file's order.
 * dropout_masks, when not NULL, supplies one host mask per dropout layer of
 * the run, in order: (n, per-sample shape) of values 0 or 1/(1-p) for
 * dropout, (n, C) for dropout2d (one value per channel), (n) for
 * StochasticDepth's mode 'row' and one value for its 'batch' - used by the
 * golden tests. Otherwise masks are drawn from dropout_seed: give every
 * forward its own seed (psd derives it from the context id and the
 * forward's sequence number in the context). out may be NULL for a training
 * forward that keeps its tape: the output is then only in the tape
 * (ps_tape_get_output, ps_tape_output_writable). */
ps_status ps_model_forward_range(ps_model *m, int first, int last, const void *x, int n, int train,
                                 const float *const *dropout_masks, uint64_t dropout_seed, float *out,
                                 ps_tape **tape, uint64_t *version_used, ps_err *err);

/* Combined training forwards (psd's batched Forwards, server.batch_wait_ms):
 * k forwards of stages first..last, part i of n[i] samples at x[i] with
 * dropout seed seeds[i], computed as one forward of their sum under one
 * weights version (*version_used); tapes[i] (and out[i] when out and out[i]
 * are not NULL) receive what ps_model_forward_range(..., x[i], n[i], 1,
 * NULL, seeds[i], out[i], &tapes[i], ...) would give - the same dropout
 * masks, each part's own copy of the activations its backward reads, so
 * its backward gives its own input and parameter gradients - up to
 * floating-point rounding of the bigger computation. Only runs whose every
 * node is per-sample (ps_model_can_group); FAILED_PRECONDITION otherwise.
 * Any error fails the whole group (no tape returned): run the parts alone
 * to tell whose it was. */
int ps_model_can_group(const ps_model *m, int first, int last);
ps_status ps_model_forward_group(ps_model *m, int first, int last, int k, const void *const *x, const int *n,
                                 const uint64_t *seeds, float *const *out, ps_tape **tapes, uint64_t *version_used,
                                 ps_err *err);

int ps_tape_first_stage(const ps_tape *t);
int ps_tape_last_stage(const ps_tape *t);
/* The forward's output again (host, n x per-sample output of the last
 * stage): a retried Forward is answered from the record. */
ps_status ps_tape_get_output(ps_model *m, const ps_tape *t, float *host_out, ps_err *err);
/* The tape's output itself (host, n x per-sample output of the last stage),
 * for a fused loss to read and overwrite with d loss / d output, then pass
 * to ps_model_backward_acc as grad_out, saving two copies of it: non-NULL
 * only for a training tape whose last stage is in host memory and whose
 * last layer's backward does not read its output (linear). Once written,
 * ps_tape_get_output returns the gradient. */
float *ps_tape_output_writable(ps_tape *t);

/* ---- accumulated gradients ---- */

/* An empty accumulator: blocks are allocated when a backward first touches
 * a stage or an embedding row. ps_grads_free(NULL) is a no-op. */
ps_grads *ps_grads_create(ps_model *m, ps_err *err);
void ps_grads_free(ps_grads *g);

/* Backward of the tape from d loss / d output (host, n x per-sample output
 * of its last stage). ADDS the parameter gradients of the stages the tape
 * covers into acc. When grad_in is not NULL, writes d loss / d input of the
 * tape's first stage there (host, n x per-sample input, float;
 * INVALID_ARGUMENT when that input is int64); when it is NULL the first
 * layer's backward-data is not computed. The tape stays valid. */
ps_status ps_model_backward_acc(ps_model *m, ps_tape *t, const float *grad_out, float *grad_in, ps_grads *acc,
                                ps_err *err);

/* Combined training backwards (psd's batched Backwards, server.batch_wait_ms
 * with server.batch_backward): k tapes of one run of stages, each with its
 * d loss / d output grad_out[i], as one backward - one pass over the
 * concatenated output gradients computes every part's input gradient
 * (grad_in[i], NULL: not wanted), while each part's parameter gradients
 * are computed from its own samples alone and ADDED into its own accs[i]
 * (distinct accumulators): what ps_model_backward_acc of each tape would
 * give, up to floating-point rounding. The tapes need not come from one
 * combined forward. Only runs whose every node is per-sample
 * (ps_model_can_group); FAILED_PRECONDITION otherwise. Any error fails the
 * whole group, and some accs may already hold their part's gradients:
 * pass fresh accumulators, discard them on error and run the parts alone
 * to tell whose it was. The tapes stay valid. */
ps_status ps_model_backward_group(ps_model *m, int k, ps_tape *const *tapes, const float *const *grad_out,
                                  float *const *grad_in, ps_grads *const *accs, ps_err *err);

/* Parameter param's accumulated gradient, dense (numel floats; zero where
 * nothing was accumulated). */
ps_status ps_grads_get(ps_model *m, const ps_grads *g, int param, float *host_dst, ps_err *err);
/* Rows [row0, row0 + nrows) of its first dimension only (a scalar has one
 * row): nrows * numel / dims[0] floats (paged GetGradients). */
ps_status ps_grads_get_rows(ps_model *m, const ps_grads *g, int param, int64_t row0, int64_t nrows, float *host_dst,
                            ps_err *err);
/* dst += src (sync rounds sum contexts); both of model m. */
ps_status ps_grads_add(ps_model *m, ps_grads *dst, const ps_grads *src, ps_err *err);
/* g *= s (averaging). */
ps_status ps_grads_scale(ps_model *m, ps_grads *g, float s, ps_err *err);
/* 1 when every accumulated value is finite; 0 with *param and *elem (index
 * into the dense parameter) naming the first that is not; -1 when it could
 * not be checked (out of memory, device copy failure). */
int ps_grads_check_finite(ps_model *m, const ps_grads *g, int *param, int64_t *elem);
/* g[param] += host_src (numel floats): the gradient of a parameter of a
 * parameter-only stage, computed elsewhere (PushGradients). Dense
 * parameters only (INVALID_ARGUMENT for a sparse one). */
ps_status ps_grads_add_dense(ps_model *m, ps_grads *g, int param, const float *host_src, ps_err *err);
/* Sum of squares of every accumulated value (dense blocks and row-sparse
 * rows, duplicates already merged): clip_grad_norm_'s total norm squared. */
ps_status ps_grads_sq_norm(ps_model *m, const ps_grads *g, double *out, ps_err *err);
/* Bytes the accumulator holds. */
size_t ps_grads_bytes(const ps_grads *g);
/* 1 when a backward or add has put anything into g. */
int ps_grads_touched(const ps_grads *g);

/* Apply the optimizer to the parameters g has gradients for (parameters of
 * stages it never touched are left alone; sparse parameters update only
 * their touched rows) and fold the running statistics g carries into the
 * buffers (ps_tape_set_key), under the exclusive weights lock; returns the
 * new version in *version. Atomic: everything that can fail on input or memory
 * (validation, allocation) happens before the first weight is written, so
 * an error leaves weights, optimizer state and version untouched. */
ps_status ps_model_step_grads(ps_model *m, const ps_grads *g, uint64_t *version, ps_err *err);

/* ---- the whole model ---- */

/* Largest batch a single forward accepts. */
int ps_model_max_batch(const ps_model *m);

/* Number of optimizer steps applied so far (the model version). */
uint64_t ps_model_version(const ps_model *m);

/* Copy a parameter to / from host memory (numel floats). set_param takes the
 * weights lock exclusively and restarts that parameter's optimizer state
 * (step 0, buffers zero), as a fresh PyTorch optimizer would. */
ps_status ps_model_get_param(ps_model *m, int i, float *host_dst, ps_err *err);
/* Rows [row0, row0 + nrows) of its first dimension only (a scalar has one
 * row), as get_param copies the whole (paged GetParameters). */
ps_status ps_model_get_param_rows(ps_model *m, int i, int64_t row0, int64_t nrows, float *host_dst, ps_err *err);
ps_status ps_model_set_param(ps_model *m, int i, const float *host_src, ps_err *err);

int ps_tape_batch(const ps_tape *t);
/* Bytes a tape of batch n holds (activations + gradients), for limits. */
size_t ps_model_tape_bytes(const ps_model *m, int n);
/* Bytes a recorded forward's tape holds (activations and workspaces of its
 * stages; gradients live in ps_grads), for the context memory accounting. */
size_t ps_tape_bytes(const ps_tape *t);

void ps_tape_free(ps_tape *t);

/* ---- checkpoint support (used by psd's server/checkpoint.c) ---- */

/* The optimizer the model applies (a copy of ps_model_opts' spec). Its
 * state: ps_optim_num_state(spec) buffers per parameter, named by
 * ps_optim_state_name(spec->kind, j). */
const ps_optim_spec *ps_model_optim(const ps_model *m);

/* A consistent copy of the training state, taken under one shared weights
 * lock (no step lands halfway): every parameter in parameter order,
 * concatenated (ps_model_num_weights floats), into w; when step is not
 * NULL, each parameter's update count (ps_model_num_params of them; 0: no
 * update yet, as PyTorch before it creates the state); when state is not
 * NULL, state[j] (j < ps_optim_num_state(ps_model_optim(m))) receives
 * buffer j of every parameter laid out as w (zero for step 0); and the
 * model version. */
ps_status ps_model_snapshot(ps_model *m, float *w, int64_t *step, float *const *state, uint64_t *version,
                            ps_err *err);
/* ps_model_snapshot plus, when bufs is not NULL, every buffer i into
 * bufs[i] (numel values of its dtype), under the same lock. */
ps_status ps_model_snapshot_ex(ps_model *m, float *w, int64_t *step, float *const *state, void *const *bufs,
                               uint64_t *version, ps_err *err);

/* Set parameter i's optimizer state: its update count and, for j <
 * ps_optim_num_state, buffer j from state[j] (host, numel floats); state
 * NULL sets the buffers to zero (with step 0: not started, as PyTorch's
 * first step; an SGD momentum buffer of zeros with step > 0 gives the same
 * update). Call after ps_model_set_param, which restarts it. A negative
 * step is INVALID_ARGUMENT; on a device error the step is left at 0. */
ps_status ps_model_set_optim_state(ps_model *m, int i, int64_t step, const float *const *state, ps_err *err);

/* Set the model version (steps applied), e.g. when resuming. */
void ps_model_set_version(ps_model *m, uint64_t version);

#endif
