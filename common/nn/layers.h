/* layers.h - the layer-kind table: what each kind of layer is.
 *
 * A model (models.h) names its layers by kind ("conv2d", "linear",
 * "embedding", ...). Each kind is one row of a table in layers.c with
 *  - shape inference: per-sample input shape and dtype -> output shape,
 *    and the layer's parameters (state_dict suffix, shape, PyTorch's
 *    default initialisation, dense or row-sparse);
 *  - forward and backward, written against the backend table (backend.h),
 *    so one row serves the ref, dnnl and cuda backends;
 *  - the bytes a training tape keeps for the layer beyond its output.
 * Adding a kind is adding a row (and its tests in tests/test_nn_layers.c).
 *
 * The executor (exec.c) owns the memory: it allocates each layer's output
 * and the gradients, and frees what a layer saved (ps_layer_saved) with the
 * tape. Layers never lock and never touch the optimizer.
 */
#ifndef PS_NN_LAYERS_H
#define PS_NN_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "rng.h"
#include "status.h"
#include "tensor.h"

/* Initialisation of a parameter. DEFAULT is the kind's PyTorch default
 * (Conv2d/Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias;
 * Embedding: N(0, 1)). */
typedef enum {
    PS_INIT_DEFAULT = 0,
    PS_INIT_UNIFORM,      /* U(-a, a) */
    PS_INIT_NORMAL,       /* N(0, 1) */
    PS_INIT_ZERO,
} ps_init_kind;

/* One layer of a model definition. Sizes are literals or, when the *_key
 * is set, the model's size of that name (model.sizes.<key> in the config). */
typedef struct ps_layer_def {
    const char *kind;           /* a row of the kind table: "conv2d", "linear", ... */
    const char *name;           /* parameter prefix ("conv1"); NULL for kinds without parameters */
    int out;                    /* conv2d: out channels; linear: out features; embedding: dim */
    const char *out_key;
    int num;                    /* embedding: rows of the table */
    const char *num_key;
    int k, stride, pad;         /* conv2d, maxpool2d; lstm: k = the layer index l (suffix _l<k>) */
    float p;                    /* dropout, dropout2d: drop probability */
    const char *p_key;
    ps_init_kind w_init, b_init;/* override the kind's default initialisation */
    float init_a;               /* bound of PS_INIT_UNIFORM */
} ps_layer_def;

#define PS_LAYER_MAX_PARAMS 4 /* lstm: weight_ih, weight_hh, bias_ih, bias_hh */

typedef struct ps_layer_param {
    const char *suffix;         /* "weight", "bias" */
    int ndim;
    int64_t dims[4];
    int64_t numel;
    int64_t fan_in;             /* for the default initialisation */
    ps_init_kind init;          /* resolved: never PS_INIT_DEFAULT */
    float init_a;
    int sparse;                 /* gradient kept row-sparse (embedding tables) */
} ps_layer_param;

struct ps_layer_kind;

/* A layer of a built model: the definition with its sizes resolved and
 * shapes inferred. */
typedef struct ps_layer {
    const struct ps_layer_kind *kind;
    const ps_layer_def *def;
    int out, num, k, stride, pad;   /* resolved sizes */
    float p;
    ps_shape in, outs;              /* per-sample input and output shapes */
    ps_dtype in_dtype, out_dtype;
    int nparams;
    ps_layer_param param[PS_LAYER_MAX_PARAMS];
    int in_layout, out_layout;      /* PS_LAYOUT_* (planned by the executor) */
    int dropout_idx;                /* index among the model's dropout layers, -1 if none */
    int64_t row_lo;                 /* embedding shard (model.h shard_*): its table holds global rows
                                       [row_lo, row_lo + num) of row_total; ids stay global */
    int64_t row_total;              /* 0 = not a shard */
} ps_layer;

/* What a layer keeps in a tape for its backward pass; freed by the tape. */
typedef struct ps_layer_saved {
    void *dev;                  /* backend memory (mask, pooling workspace) or NULL */
} ps_layer_saved;

/* A row-sparse gradient in host memory: rows (nrows, sorted, unique) of a
 * (num, width) table and their gradient rows grad (nrows, width). */
typedef struct ps_rows {
    int64_t *rows;
    int64_t nrows;
    int64_t width;
    float *grad;
} ps_rows;

void ps_rows_clear(ps_rows *r);   /* frees and zeroes */

/* One call of a layer's forward or backward. Pointers are memory of be's
 * device (ps_backend_alloc_floats) unless said otherwise. */
typedef struct ps_layer_call {
    const ps_layer *ly;
    ps_backend *be;
    int n;                      /* samples */
    const void *x;              /* input, in ly->in_layout */
    void *y;                    /* output (forward: written; backward: the forward's) */
    float *const *w;            /* parameters, ly->nparams of them */
    ps_layer_saved *saved;
    /* forward */
    int train;
    const float *mask;          /* host: an injected dropout mask (golden tests), or NULL */
    ps_rng *rng;                /* this forward's dropout stream */
    /* backward */
    const float *dy;
    float *dx;                  /* NULL: d loss / d input not wanted */
    float *dw[PS_LAYER_MAX_PARAMS]; /* dense parameter gradients, overwritten */
    ps_rows *rows;              /* sparse parameter 0: filled with its gradient (host) */
} ps_layer_call;

/* Flags of a kind. */
enum {
    PS_KIND_VIEW = 1,           /* output is the input, reshaped (flatten) */
    PS_KIND_EVAL_VIEW = 2,      /* identity in eval mode (dropout) */
    PS_KIND_LAYOUT_KEEP = 4,    /* computes in whatever layout it gets (relu, max-pool) */
    PS_KIND_LAYOUT_BLOCKED = 8, /* prefers the backend's blocked layout (conv) */
    PS_KIND_DROPOUT = 16,       /* takes a dropout mask (counted in dropout_idx) */
    PS_KIND_PARAMS_ONLY = 32,   /* holds parameters another process computes with (lstm):
                                   never forwarded; its stage is parameter-only */
    PS_KIND_OUTPUT_FREE = 64,   /* backward never reads the output (linear): a fused loss may
                                   overwrite it with its gradient (ps_tape_output_writable) */
};

typedef struct ps_layer_kind {
    const char *name;
    unsigned flags;
    /* Fill ly->outs, out_dtype and params from ly->in, in_dtype and the
     * resolved sizes; INVALID_ARGUMENT naming what does not fit. */
    ps_status (*infer)(ps_layer *ly, ps_err *err);
    /* NULL when the backend lacks an op this kind needs. */
    const char *(*missing_op)(const ps_backend_ops *ops);
    ps_status (*forward)(ps_layer_call *c, ps_err *err);
    ps_status (*backward)(ps_layer_call *c, ps_err *err);
    /* Bytes a training tape keeps beyond the output activation. */
    size_t (*tape_bytes)(const ps_layer *ly, int n);
    /* Optional: validate a host input (int64 ids) before it is used. */
    ps_status (*check_input)(const ps_layer *ly, const void *host_x, int64_t count, ps_err *err);
} ps_layer_kind;

/* The kind of that name, or NULL. */
const ps_layer_kind *ps_layer_kind_find(const char *name);

/* Infer ly's shapes and parameters (ly->kind, def, sizes, in, in_dtype set). */
ps_status ps_layer_infer(ps_layer *ly, ps_err *err);

/* Initialise parameter j of ly in host memory (numel floats), drawing from r. */
void ps_layer_init_param(const ps_layer *ly, int j, float *host, ps_rng *r);

/* Number of elements of the layer's output for n samples. */
static inline int64_t ps_layer_out_count(const ps_layer *ly, int n) { return n * ps_shape_numel(&ly->outs); }
static inline int64_t ps_layer_in_count(const ps_layer *ly, int n) { return n * ps_shape_numel(&ly->in); }

#endif
