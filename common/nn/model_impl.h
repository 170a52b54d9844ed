/* model_impl.h - the model's internals, shared by model.c (weights, lock,
 * versions, placement, optimizer step), exec.c (the executor: tapes,
 * forward and backward over runs of stages) and grads.c (accumulated
 * gradients). Not for use outside common/nn. */
#ifndef PS_NN_MODEL_IMPL_H
#define PS_NN_MODEL_IMPL_H

#include <pthread.h>

#include "layers.h"
#include "model.h"
#include "models.h"

/* Where a layer's parameters live. */
typedef struct layer_slot {
    int param[PS_LAYER_MAX_PARAMS];     /* index in the model's parameter list */
    int64_t w_off[PS_LAYER_MAX_PARAMS]; /* offset in the stage's weight block */
    int64_t g_off[PS_LAYER_MAX_PARAMS]; /* offset in the stage's dense gradient block, -1 if sparse */
} layer_slot;

typedef struct stage {
    const ps_stage_def *def;
    int def_index;           /* index in the model definition (hosted subsets skip some) */
    char device[32];
    int host_memory;         /* device memory is host memory (cpu) */
    ps_backend *be;
    ps_layer *layers;
    layer_slot *slots;       /* per layer */
    int nlayers;
    int64_t nweights;        /* floats in the weight block */
    int64_t ngrads;          /* floats in a dense gradient block (sparse parameters excluded) */
    float *w;                /* (nweights) parameters, on the stage's device */
    float *state[PS_OPTIM_MAX_STATE]; /* (nweights) each: the optimizer's state buffers laid out
                                         as w, the model's nstate of them (NULL beyond) */
    int dropout_base;        /* model-wide index of the stage's first dropout layer */
    ps_stage_info info;
} stage;

typedef struct param_loc {
    int stage, layer, j;
    int64_t off;             /* in the stage's weight block */
    int64_t goff;            /* in the stage's gradient block, -1 if sparse */
} param_loc;

struct ps_model {
    const ps_model_def *def;
    double sizes[PS_MODEL_MAX_SIZES];
    stage stages[PS_MODEL_MAX_STAGES];
    int nstages;
    ps_param_info *params;
    ps_param_info *def_params; /* every parameter of the definition, whole shapes (ndef_params) */
    int ndef_params;
    param_loc *loc;
    int nparams;
    int nsparse;
    int ndropout;
    int64_t total_weights;
    ps_optim_spec optim;     /* the optimizer (checked at creation) */
    int nstate;              /* ps_optim_num_state(&optim) */
    ps_optim_state *ost;     /* per param: buffers into its stage's state blocks, and its step
                                (step 0 <=> buffers zero / not started) */
    pthread_rwlock_t lock;   /* weights: shared for forward/backward, exclusive for step */
    pthread_mutex_t version_mu;
    uint64_t version;
    int thread_budget;       /* compute threads shared by the calls computing at once */
    int inflight;            /* __atomic: forward/backward calls computing now */
    int peak_calls;          /* __atomic: the most computing at once lately ... */
    long long peak_ms;       /* __atomic: ... as of then (ps_model_call_begin) */
};

typedef struct tape_stage {
    void **acts;             /* nlayers+1 activations; acts[0] is the stage input */
    unsigned char *owned;    /* per activation: allocated here (1) or aliased (0) */
    ps_layer_saved *saved;   /* per layer */
    float **rin;             /* per layer: its input reordered to in_layout, or NULL */
} tape_stage;

struct ps_tape {
    ps_model *m;
    int first, last;
    int n;
    int train;
    tape_stage st[PS_MODEL_MAX_STAGES];
    ps_grads *own;           /* the first API's per-tape gradients (ps_model_backward) */
};

struct ps_grads {
    ps_model *m;
    float *dense[PS_MODEL_MAX_STAGES]; /* per stage: (ngrads) on its device, NULL = untouched */
    ps_rows *rows;           /* per parameter: its rows when sparse */
    double sq;               /* the sum of squares of every value, when sq_valid: */
    int sq_valid;            /* cleared by whatever writes the gradients */
};

/* ---- the executor (exec.c): no locks, no optimizer ---- */

/* Plan the activation layouts of a stage's layers (blocked where the
 * backend offers it and the kind prefers it); separate from the rest so a
 * backend's layout rules can change without touching the executor. */
void ps_exec_plan_layouts(stage *st);
/* INVALID_ARGUMENT unless first..last is a run of stages whose shapes chain. */
ps_status ps_exec_check_run(const ps_model *m, int first, int last, ps_err *err);
/* Forward of stages first..last on n samples of host x into host out (one
 * tape); with keep, the tape (x copied) is returned in *tape. Dropout masks
 * come from masks (per dropout layer of the run) or rng. */
ps_status ps_exec_forward(ps_model *m, int first, int last, const void *x, int n, int train, int keep,
                          const float *const *masks, ps_rng *rng, float *out, ps_tape **tape, ps_err *err);
/* Backward of t into acc (ps_model_backward_acc's contract). */
ps_status ps_exec_backward(ps_model *m, ps_tape *t, const float *grad_out, float *grad_in, ps_grads *acc,
                           ps_err *err);

/* Thread budget of a compute call (see model.c). */
int ps_model_call_begin(ps_model *m, int exclusive);
void ps_model_call_end(ps_model *m);

/* Merge src's rows into dst (sums rows present in both); host memory. */
ps_status ps_rows_merge(ps_rows *dst, const ps_rows *src, ps_err *err);

/* Copy count floats between two buffers of one stage's device. */
ps_status ps_stage_copy(stage *st, float *dst, const float *src, int64_t count, ps_err *err);

#endif
