/* model_impl.h - the model's internals, shared by model.c (weights, lock,
 * versions, placement), model_build.c (building it from its model file),
 * model_step.c (the optimizer step), exec.c (the graph executor: memory
 * plan, tapes, forward and backward over runs of stages) and grads.c
 * (accumulated gradients). Not for use outside server/nn. */
#ifndef PS_NN_MODEL_IMPL_H
#define PS_NN_MODEL_IMPL_H

#include <pthread.h>

#include "layers.h"
#include "model.h"
#include "modeldef.h"

/* Where a node's parameters and buffers live. */
typedef struct layer_slot {
    int param[PS_LAYER_MAX_PARAMS];     /* index in the model's parameter list */
    int64_t w_off[PS_LAYER_MAX_PARAMS]; /* offset in the stage's weight block */
    int64_t g_off[PS_LAYER_MAX_PARAMS]; /* offset in the stage's dense gradient block, -1 if sparse */
    int buffer[PS_LAYER_MAX_BUFFERS];   /* index in the model's buffer list */
    int64_t b_off[PS_LAYER_MAX_BUFFERS];/* float32: offset in the stage's buffer block; int64: in its counters */
    /* Shared parameters (share: / tie:, modeldef.h): a borrowed one has its
     * owner's param, w_off and g_off. */
    int owner[PS_LAYER_MAX_PARAMS];     /* -1: its own; else the node (stage-local) it borrows it from ... */
    int owner_j[PS_LAYER_MAX_PARAMS];   /* ... and its index there */
    unsigned char shared[PS_LAYER_MAX_PARAMS]; /* used at several sites (lent or borrowed): its gradient is dense
                                                  even where the kind's is row-sparse (Embedding: scattered) */
    unsigned char add_dw[PS_LAYER_MAX_PARAMS]; /* a site before this one in backward order writes the gradient:
                                                  this one adds its own (exec.c ps_exec_dw_begin) */
    /* A share: of a node with buffers (a BatchNorm called at several
     * sites): its buffers are the owner's (buffer, b_off), which every
     * site's training forward folds into, in forward order
     * (model_step.c). */
    int buf_owner;                      /* -1: its own buffers; else the node (stage-local) whose buffers it uses */
} layer_slot;

/* The memory plan of a stage in one mode (exec.c plans it once per stage
 * at build, for training and for eval forwards).
 *
 * Values: 0 is the stage input, 1 + l the output of node l (file order).
 * A view (Flatten, Reshape; Dropout in eval) shares its input's storage;
 * an in-place node (ReLU, Dropout, Add) writes its output over its input's
 * storage when nothing else reads that input afterwards and no backward
 * needs it. Storage ids ("buffers"): 0 the stage input, 1 + l node l's
 * output storage, 1 + nlayers + in_off[l] + i the reorder of node l's
 * input i into the layout it computes in (stage.in_off). */
typedef struct node_plan {
    int out_buf;                        /* storage its output lands in */
    int alloc;                          /* 1: allocate out_buf before the forward (not a view or in place) */
    int *in_buf;                        /* (nin) storage it reads input i from (a reorder's when it has one) */
    int *reorder;                       /* (nin) 1: input i is reordered into in_buf[i] first */
    int nfree;                          /* storages released after its forward */
    int *free_buf;
} node_plan;

typedef struct stage_plan {
    node_plan *node;                    /* per node (file order) */
    int *in_bufs, *reorders;            /* (stage nins) what node_plan's in_buf and reorder point into */
    int nbufs;
    int out_buf;                        /* the stage output's storage */
    unsigned char *kept;                /* per storage: the training tape keeps it for backward */
    int out_writable;                   /* a fused loss may overwrite the output with its gradient */
} stage_plan;

typedef struct stage {
    const ps_stage_def *def;
    int def_index;           /* index in the model definition (hosted subsets skip some) */
    char device[32];
    int host_memory;         /* device memory is host memory (cpu) */
    ps_backend *be;
    ps_layer *layers;        /* file order */
    layer_slot *slots;       /* per node */
    int nlayers;
    int *order;              /* (nlayers) topological order: indices into layers */
    /* Every node's inputs, node after node (file order): node l's input i is
     * entry in_off[l] + i of the per-input arrays. */
    int nins;                /* inputs of all the nodes together */
    int *in_off;             /* (nlayers + 1) node l's first entry; in_off[nlayers] = nins */
    int *in_val;             /* (nins) the value an input reads */
    ps_shape *in_shape;      /* (nins) the layers' in ... */
    ps_dtype *in_dtype;      /* (nins) ... in_dtype ... */
    int *in_layout;          /* (nins) ... and in_layout point here */
    int out_val;             /* the stage's output value */
    int *val_layout;         /* (nlayers + 1) layout of each value */
    unsigned char *rg[2];    /* (nlayers + 1) per value: its gradient is needed, [0] without and [1]
                                with d loss / d stage input */
    stage_plan plan[2];      /* [0] eval, [1] training */
    int64_t nweights;        /* floats in the weight block */
    int64_t ngrads;          /* floats in a dense gradient block (sparse parameters excluded) */
    int64_t nbufw;           /* floats in the buffer block (float32 buffers) */
    int64_t nbufi;           /* int64 counters (host) */
    float *w;                /* (nweights) parameters, on the stage's device */
    float *bufw;             /* (nbufw) float32 buffers, on the stage's device */
    int64_t *bufi;           /* (nbufi) int64 buffers, host */
    float *state[PS_OPTIM_MAX_STATE]; /* (nweights) each: the optimizer's state buffers laid out
                                         as w, the model's nstate of them (NULL beyond) */
    int dropout_base;        /* model-wide index of the stage's first dropout node */
    int inplace;             /* snapshot steps: the stage has a row-sparse parameter, so it has one
                                copy, shared by every wset, stepped in place under rows_lock */
    ps_stage_info info;
    int64_t *nprof;          /* PS_EXEC_PROFILE: per node, __atomic: forward CPU ns, wall ns, calls,
                                backward CPU ns, wall ns, calls (exec.c); NULL when off */
} stage;

typedef struct buffer_loc {
    int stage, layer, j;
    int64_t off;             /* in the stage's float32 buffer block or its int64 counters */
} buffer_loc;

/* One training forward's statistics for a node with buffers (BatchNorm),
 * kept in the accumulated gradients until the step folds them (model.c):
 * host copies of what the kind's stats() names. */
typedef struct fold_record {
    uint64_t key;            /* the tape's key and seq (ps_tape_set_key): the fold order; within
                                one tape the nodes' topological (forward) order (grads.c) */
    uint32_t seq;
    int stage, layer;
    int nstats;
    float *stats[4];
    int64_t len[4];
} fold_record;

/* A copy of the weights: every hosted stage's parameters and float32
 * buffers (what a forward or backward reads). The model computes with the
 * current copy; with snapshot steps (model.c, "Snapshot steps") a step
 * writes the next version into a free copy and publishes it, while calls
 * already computing keep the copy they started with. */
#define PS_WSETS 4
typedef struct wset {
    float *w[PS_MODEL_MAX_STAGES];     /* per stage: (nweights) on its device */
    float *bufw[PS_MODEL_MAX_STAGES];  /* per stage: (nbufw) */
    uint64_t version;                  /* the model version it holds */
    int refs;                          /* calls reading it (m->wmu) */
} wset;

typedef struct param_loc {
    int stage, layer, j;
    int64_t off;             /* in the stage's weight block */
    int64_t goff;            /* in the stage's gradient block, -1 if sparse */
} param_loc;

struct ps_model {
    ps_model_def *def;       /* owned */
    char origin[PS_ERR_MSG_MAX]; /* ps_model_opts.origin ("" if none): before file:line in messages */
    double sizes[PS_MODEL_MAX_SIZES]; /* per def->sizes */
    const char *size_keys[PS_MODEL_MAX_SIZES];
    stage stages[PS_MODEL_MAX_STAGES];
    int nstages;
    ps_param_info *params;
    ps_param_info *def_params; /* every parameter of the definition, whole shapes (ndef_params) */
    int ndef_params;
    param_loc *loc;
    int nparams;
    ps_buffer_info *buffers; /* every buffer of the hosted stages (nbuffers) */
    buffer_loc *bloc;
    int nbuffers;
    ps_buffer_info *def_buffers; /* every buffer of the definition (ndef_buffers) */
    int ndef_buffers;
    char **alias_name;       /* tied parameters' other state_dict names (nalias) ... */
    int *alias_owner;        /* ... and their owners' indices in def_params */
    int nalias;
    int nsparse;
    int ndropout;
    int64_t total_weights;
    ps_optim_spec optim;     /* the optimizer (checked at creation) */
    int nstate;              /* ps_optim_num_state(&optim) */
    ps_optim_state *ost;     /* per param: buffers into its stage's state blocks, and its step
                                (step 0 <=> buffers zero / not started) */
    pthread_rwlock_t lock;   /* weights: shared for forward/backward (and snapshot steps),
                                exclusive for in-place steps and for set_param & co */
    int snapshots;           /* steps write a copy (see "Snapshot steps" in model.c) */
    pthread_mutex_t wmu;     /* cur, nsets, the copies' refs */
    pthread_cond_t wcv;      /* a copy was released */
    pthread_mutex_t step_mu; /* snapshot steps one at a time */
    pthread_rwlock_t rows_lock; /* snapshot steps: the in-place stages' weights - shared by calls that
                                   read one, exclusive while a step writes them and publishes */
    int ninplace;            /* stages with inplace set */
    wset sets[PS_WSETS];     /* sets[cur] is the current copy (= each stage's w, bufw) */
    int nsets, cur;
    pthread_mutex_t version_mu;
    uint64_t version;
    int eval_whole;          /* an eval forward runs unsliced: a node normalises with the batch's own
                                statistics in eval too (BatchNorm with track_running_stats: false) */
    int thread_budget;       /* compute threads shared by the calls computing at once */
    int inflight;            /* __atomic: forward/backward calls computing now */
    int peak_calls;          /* __atomic: the most computing at once lately ... */
    long long peak_ms;       /* __atomic: ... as of then (ps_model_call_begin) */
    int ncpus;               /* CPUs psd may run on (its affinity at build), up to 64 ... */
    int cpus[64];            /* ... their numbers: a one-thread call holds one (ps_model_call_begin) */
    unsigned long long cpus_held; /* __atomic: bit i: cpus[i] is held by a computing call */
    int pin_calls;           /* one-thread calls hold a CPU each (server.pin_compute) */
};

typedef struct tape_stage {
    float *w, *bufw;         /* the weights the running call computes with (its copy's) */
    void **buf;              /* per storage id (stage_plan.nbufs): its memory, NULL once released */
    unsigned char *owned;    /* per storage: allocated here (1) or aliased (0) */
    ps_layer_saved *saved;   /* per node */
} tape_stage;

struct ps_tape {
    ps_model *m;
    int first, last;
    int n;
    int train;
    uint64_t key;            /* ps_tape_set_key: the order its statistics fold in */
    uint32_t seq;
    int folded;              /* its statistics went into an accumulator (once per tape) */
    int cpu_slot1;           /* 1 + the CPU slot its forward held (model.c), 0 = none: its
                                backward asks for that CPU, whose caches hold the activations */
    tape_stage st[PS_MODEL_MAX_STAGES];
};

struct ps_grads {
    ps_model *m;
    float *dense[PS_MODEL_MAX_STAGES]; /* per stage: (ngrads) on its device, NULL = untouched */
    ps_rows *rows;           /* per parameter: its rows when sparse */
    fold_record *recs;       /* training forwards' statistics, folded into buffers at the step */
    int nrecs, caprecs;
    double sq;               /* the sum of squares of every value, when sq_valid: */
    int sq_valid;            /* cleared by whatever writes the gradients */
};

/* Append the statistics of tape t's nodes (a training tape, once) to g. */
ps_status ps_grads_record(ps_model *m, ps_grads *g, ps_tape *t, ps_err *err);

/* ---- the executor (exec.c): no locks, no optimizer ---- */

/* Plan a built stage: activation layouts (blocked where the backend offers
 * it and the kind prefers it), what backward needs, and the memory plans;
 * separate from the rest so a backend's layout rules can change without
 * touching the executor. */
ps_status ps_exec_plan(stage *st, ps_err *err);
void ps_exec_plan_free(stage *st);
/* INVALID_ARGUMENT unless first..last is a run of stages whose shapes chain. */
ps_status ps_exec_check_run(const ps_model *m, int first, int last, ps_err *err);
/* Forward of stages first..last on n samples of host x into host out (one
 * tape) with the weights of ws; with keep, the tape (x copied) is returned
 * in *tape. Dropout masks come from masks (per dropout node of the run) or
 * rng. */
ps_status ps_exec_forward(ps_model *m, const wset *ws, int first, int last, const void *x, int n, int train,
                          int keep, const float *const *masks, ps_rng *rng, float *out, ps_tape **tape, ps_err *err);
/* Backward of t into acc with the weights of ws (ps_model_backward_acc's
 * contract). */
ps_status ps_exec_backward(ps_model *m, const wset *ws, ps_tape *t, const float *grad_out, float *grad_in,
                           ps_grads *acc, ps_err *err);

/* A model call's backend ops on stages first..last as one asynchronous run
 * per backend that offers one (backend.h async_begin / async_end): begin
 * after the call's locks are taken, end - which waits for the work - before
 * they are released, before weights are published and before any buffer
 * written goes to another thread. run_end returns rc, or the run's failure
 * when rc was PS_OK (into err). */
void ps_model_run_begin(ps_model *m, int first, int last);
ps_status ps_model_run_end(ps_model *m, int first, int last, ps_status rc, ps_err *err);

/* An empty tape of stages first..last for n samples (NULL: out of memory). */
ps_tape *ps_exec_tape_new(ps_model *m, int first, int last, int n);
/* Bytes of storage id b of stage st for n samples (plain count: a blocked
 * layout holds as many, sample-major). */
size_t ps_exec_buf_bytes(const stage *st, int b, int n);

/* ---- shared parameters in backward (exec.c) ----
 * A kind's backward writes (not adds) its parameter gradients. A shared
 * parameter (layer_slot.shared) is written by its first site in backward
 * order; every later site (add_dw) writes into scratch that is added in
 * after. A shared parameter whose kind's gradient is row-sparse
 * (Embedding) is dense: its rows are scattered into it. */
typedef struct ps_dw_sites {
    float *tmp[PS_LAYER_MAX_PARAMS];    /* scratch the kind writes (add_dw), added into dst after */
    float *dst[PS_LAYER_MAX_PARAMS];    /* the parameter's dense gradient */
    ps_rows rows;                       /* a shared row-sparse kind's rows, scattered into dst[rj] */
    int rj;                             /* -1: none */
} ps_dw_sites;

/* Point dw[] (PS_LAYER_MAX_PARAMS, zeroed here) and *crows at where node l
 * of st writes its parameter gradients: dense is the stage's gradient block,
 * rows the per-parameter rows of row-sparse ones. */
ps_status ps_exec_dw_begin(stage *st, int l, float *dense, ps_rows *rows, float **dw, ps_rows **crows,
                           ps_dw_sites *f, ps_err *err);
/* After the backward call (its status rc): scratch added, rows scattered,
 * everything released (also on error). Returns rc or the first error. */
ps_status ps_exec_dw_end(stage *st, int l, ps_dw_sites *f, ps_status rc, ps_err *err);

/* ---- combined forwards (exec_group.c) ---- */

/* 1 when every node of stages first..last is per-sample
 * (ps_layer_per_sample): one training forward over several callers'
 * samples can be cut into each caller's tape. */
int ps_exec_group_ok(const ps_model *m, int first, int last);
/* The dropout masks a training forward of stages first..last on n samples
 * draws from a stream seeded with seed, in the executor's order, written
 * at sample offset off of masks[d] (the run's d-th dropout node, as
 * ps_exec_forward takes them; each of total samples). */
void ps_exec_group_masks(const ps_model *m, int first, int last, uint64_t seed, int off, int n, int total,
                         float *const *masks);
/* Dropout nodes of stages first..last, and the floats of node d's mask for n samples. */
int ps_exec_group_ndropout(const ps_model *m, int first, int last);
int64_t ps_exec_group_mask_len(const ps_model *m, int first, int last, int d, int n);
/* A training tape of samples [off, off + n) of big: its own copies of every
 * storage and saved state the forward kept, as if the forward had run on
 * those samples alone. */
ps_status ps_exec_tape_slice(ps_model *m, const ps_tape *big, int off, int n, ps_tape **out, ps_err *err);

/* Training tapes of one run of stages, laid side by side: a tape of
 * their samples together (part i's at the offset of the parts before it)
 * with copies of every storage and saved state they kept, as if one
 * forward had run on all of them (the inverse of ps_exec_tape_slice).
 * FAILED_PRECONDITION unless they cover the same stages, are training
 * tapes and every node is per-sample. */
ps_status ps_exec_tape_concat(ps_model *m, ps_tape *const *parts, int k, ps_tape **out, ps_err *err);

/* A combined backward's parts: part i is samples [off[i], off[i] + n[i])
 * of the combined tape; its parameter gradients go to its own blocks,
 * dense[i * PS_MODEL_MAX_STAGES + s] (stage s's, ngrads floats) and
 * rows[i][p] (row-sparse parameter p). */
typedef struct ps_bwd_parts {
    int k;
    const int *off, *n;
    float **dense;
    ps_rows **rows;
} ps_bwd_parts;

/* Node l (stage s, index s of the model) of a combined backward, a node
 * with parameters: c is its call over every part's samples (dy, inputs,
 * output and saved state of the combined tape; dxs the input gradients
 * wanted, or NULL). Computes the input gradients in one call of the
 * kind's backward with no parameter gradient, then each part's parameter
 * gradients from its slice alone (a call with no input gradient), so no
 * part's parameter gradient holds another part's samples; a
 * PS_KIND_BWD_PARTS kind in one call that is told the parts
 * (ps_layer_parts). */
ps_status ps_exec_group_node_backward(stage *st, const ps_layer_call *c, int l, int s, const ps_bwd_parts *parts,
                                      ps_err *err);

/* Backward of k training tapes of one run of stages as one (psd's batched
 * Backwards, model.h ps_model_backward_group): the tapes laid side by
 * side (ps_exec_tape_concat), one backward pass over the concatenated
 * d outputs computing every input gradient at once, and each part's
 * parameter gradients from its own samples (ps_exec_group_node_backward),
 * added into accs[i] (distinct). grad_in[i] NULL: part i's input gradient
 * is not wanted. On error some accs may hold their part's gradients
 * already: pass fresh accumulators and discard them on error. */
ps_status ps_exec_backward_group(ps_model *m, const wset *ws, int k, ps_tape *const *tapes,
                                 const float *const *grad_out, float *const *grad_in, ps_grads *const *accs,
                                 ps_err *err);

/* Bytes a training tape of stages first..last keeps for n samples (no gradients). */
size_t ps_exec_tape_bytes(const ps_model *m, int first, int last, int n);

/* Thread budget of a compute call (see model.c). */
int ps_model_call_begin(ps_model *m, int exclusive);
void ps_model_call_end(ps_model *m);
void ps_model_cpus_init(ps_model *m, int pin);

/* Merge src's rows into dst (sums rows present in both); host memory. */
ps_status ps_rows_merge(ps_rows *dst, const ps_rows *src, ps_err *err);
/* Rows [row0, row0 + nrows) of tensor `name` (ndim dims, numel elements of
 * esz bytes; a scalar has one row) as the byte range [*off, *off + *bytes);
 * INVALID_ARGUMENT naming the tensor when they are outside it. */
ps_status ps_model_row_range(const char *name, int ndim, const int64_t *dims, int64_t numel, size_t esz, int64_t row0,
                             int64_t nrows, size_t *off, size_t *bytes, ps_err *err);

/* Copy count floats between two buffers of one stage's device. */
ps_status ps_stage_copy(stage *st, float *dst, const float *src, int64_t count, ps_err *err);

/* The stage's output node. */
static inline const ps_layer *ps_stage_out_layer(const stage *st) { return &st->layers[st->out_val - 1]; }
/* The stage's per-sample input shape and dtype. */
static inline const ps_shape *ps_stage_in_shape(const stage *st, ps_shape *tmp) {
    tmp->ndim = st->info.in_ndim;
    for (int d = 0; d < PS_SHAPE_MAX_DIMS; d++) tmp->dims[d] = st->info.in_dims[d];
    return tmp;
}

#endif
