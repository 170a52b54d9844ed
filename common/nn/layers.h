/* layers.h - the layer-kind table: what each kind of node is.
 *
 * A model file (modeldef.h) names each node's kind by PyTorch's class name
 * ("Conv2d", "Linear", "BatchNorm2d", ...). Each kind is one row of a table
 * in layers.c with
 *  - its attributes (name, type, default, range: the table the model-file
 *    loader checks attribute names against and the builder resolves values
 *    with, sizes included);
 *  - shape inference: per-sample input shapes and dtypes -> output shape,
 *    and the node's parameters (state_dict suffix, shape, PyTorch's default
 *    initialisation, dense or row-sparse) and buffers (BatchNorm's running
 *    statistics);
 *  - forward and backward, written against the backend table (backend.h),
 *    so one row serves the ref, dnnl and cuda backends;
 *  - what its backward reads (its inputs, its output, neither), whether it
 *    may run in place, and the bytes a training tape keeps beyond its
 *    output - the executor's memory plan (exec.c) reads these;
 *  - its FLOPs per sample (the stage table of --check-config).
 * Adding a kind is adding a row (and its rows in scripts/gen_golden_kinds.py).
 *
 * The executor (exec.c) owns the memory: it allocates each node's output
 * and the gradients, and frees what a node saved (ps_layer_saved) with the
 * tape. Layers never lock and never touch the optimizer.
 */
#ifndef PS_NN_LAYERS_H
#define PS_NN_LAYERS_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "modeldef.h"
#include "rng.h"
#include "status.h"
#include "tensor.h"

/* Initialisation of a parameter. DEFAULT is the kind's PyTorch default
 * (Conv2d/Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias;
 * Embedding: N(0, 1); norms: ones and zeros). */
typedef enum {
    PS_INIT_DEFAULT = 0,
    PS_INIT_UNIFORM,      /* U(a, b); DEFAULT's uniform is U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
    PS_INIT_NORMAL,       /* N(a, b^2): mean a, std b */
    PS_INIT_CONST,        /* every element a */
    PS_INIT_WEIGHT_NORM,  /* weight_g of a weight-normed node (weight_norm: true): ||weight_v|| of the values
                             weight_v (the next parameter) draws, as nn.utils.weight_norm sets it */
} ps_init_kind;

typedef struct ps_init {
    ps_init_kind kind;
    float a, b;
    int fan_bound;        /* UNIFORM with the bound 1/sqrt(fan_in) (a, b unused) */
} ps_init;

/* The resolved attributes of a node (the kind's table says which apply). */
typedef struct ps_layer_attrs {
    int64_t in_features;        /* Conv2d in_channels, Linear in_features, BatchNorm num_features, LSTM
                                   input_size: 0 = inferred (when given, it must match) */
    int64_t out;                /* out_channels, out_features, embedding_dim, hidden_size, embed_dim */
    int64_t in2_features;       /* Bilinear: the second input's size (0 = inferred; when given, it must match) */
    int64_t num;                /* Embedding num_embeddings, LSTM num_layers, MultiheadAttention num_heads */
    int64_t kernel[2], stride[2], padding[2], dilation[2]; /* stride 0 = the kernel (pools) */
    int64_t groups;             /* Conv2d, ChannelShuffle */
    int bias;                   /* 1: has a bias */
    int affine;                 /* norms: weight and bias */
    int track;                  /* BatchNorm track_running_stats */
    double eps;
    double momentum;            /* BatchNorm; momentum_null: cumulative average */
    int momentum_null;
    double p;                   /* Dropout, StochasticDepth */
    double slope;               /* LeakyReLU negative_slope */
    double min_val, max_val;    /* Hardtanh (ReLU6: 0, 6) */
    int approximate;            /* GELU: 0 'none', 1 'tanh' */
    int mode;                   /* StochasticDepth: 0 'row' (a draw per sample), 1 'batch' (one per batch);
                                   MultiheadAttention: batch_first */
    int64_t dim, end_dim;       /* Softmax, LogSoftmax, Concat dim; Flatten start_dim/end_dim (PyTorch's,
                                   the batch dimension counted as 0) */
    int ndims;                  /* Reshape shape / LayerNorm normalized_shape */
    int64_t dims[PS_SHAPE_MAX_DIMS];
    int count_include_pad;      /* AvgPool2d */
    int64_t output_size[2];     /* AdaptiveAvgPool2d as given (0: null, the input's size); its infer sets
                                   out_hw to the output's */
    int64_t out_hw[2];
    int ndims2;                 /* Parameter expand (0: its shape) */
    int64_t dims2[PS_SHAPE_MAX_DIMS];
    int act;                    /* the activation of an activation kind (set by its infer) */
    int bcast;                  /* Mul: the input broadcast over the other's trailing dims, -1: none; Add,
                                   Sub, Mul, Div: 2, numpy broadcasting of the two (set by their infer) */
    int64_t start, length;      /* Narrow */
    int64_t step;               /* Narrow: every step-th element from start (1: a contiguous piece) */
    int nshifts, nrdims;        /* Roll shifts and dims (PyTorch's dims, the batch counted as 0) */
    int64_t shifts[PS_SHAPE_MAX_DIMS], rdims[PS_SHAPE_MAX_DIMS];
    int npads;                  /* Pad pad: F.pad's (before, after) pairs, the last dim's first */
    int64_t pads[2 * PS_SHAPE_MAX_DIMS];
    int pad_mode;               /* Pad mode: 0 'constant', 1 'reflect', 2 'replicate', 3 'circular' */
    int64_t window[2], windows[2], shift[2]; /* RelativePositionBias window_size, windows, shift_size */
    int nperm;                  /* Permute dims (PyTorch's, the batch's 0 included) */
    int64_t perm[PS_SHAPE_MAX_DIMS + 1];
    const char *pname;          /* Scale, Parameter, MatMul parameter: the state_dict suffix of its tensor (the
                                   model definition's string); "" (null): the node's name is the tensor's;
                                   NULL: not given (MatMul of two inputs) */
    int trans_a, trans_b;       /* MatMul transpose_a, transpose_b */
    int mm_left;                /* MatMul parameter_side: 0 right (x @ W), 1 left (W @ x) */
    double value;               /* MulConstant value; MaskedFill value (may be -inf or inf); Pad value */
    /* attention masks */
    int tri;                    /* MaskedFill mask: 0 'triu', 1 'tril' */
    int64_t diagonal;           /* MaskedFill diagonal (torch.triu's / torch.tril's) */
    int causal;                 /* MultiheadAttention causal: query i attends to keys 0..i */
    /* key padding masks computed from the token ids */
    int64_t eq_value;           /* Eq value: the constant the ids are compared with (the pad id) */
    int64_t padding_idx;        /* Embedding padding_idx (negatives counted from the end); pad_given 0: null */
    int pad_given;
    int kpm_float;              /* MultiheadAttention key_padding_mask: 0 'bool' (nonzero masks), 1 'float' (added) */
    /* upsampling (decoders, U-Nets) */
    int64_t output_padding[2];  /* ConvTranspose2d output_padding */
    double scale_factor[2];     /* Upsample scale_factor (h, w); scale_given 0: null */
    int scale_given;
    int64_t size[2];            /* Upsample size (h, w); 0: null */
    int resize_mode;            /* Upsample mode: 0 'nearest', 1 'bilinear' */
    int align_corners;          /* Upsample (bilinear) */
    int recompute_scale;        /* Upsample recompute_scale_factor: the output size's in/out as the scale */
    /* elementwise math */
    double elu_alpha;           /* ELU alpha */
    double sp_beta, sp_threshold; /* Softplus beta, threshold */
    double exponent;            /* Pow exponent */
    /* shrinks, thresholds and the parametric / randomized leaky ReLUs (CELU's alpha is elu_alpha,
       Threshold's value is value) */
    double lambd;               /* Hardshrink, Softshrink lambd */
    double threshold;           /* Threshold threshold */
    double rr_lower, rr_upper;  /* RReLU lower, upper */
    int64_t num_parameters;     /* PReLU num_parameters: 1 or the channels (dim 1 of the batched input) */
    /* recurrent layers (LSTM, GRU) */
    int bidirectional;          /* both directions, outputs concatenated (2H); the trainer's LSTM refuses it */
    /* Where: a number in place of input a (b); where_a_null (where_b_null) 1: a (b) is an input */
    double where_a, where_b;
    int where_a_null, where_b_null;
    int flag;                   /* accepted and without effect (inplace, batch_first, ...) */
    double ignored;
    int cum_reverse, cum_exclusive;   /* CumSum reverse, exclusive (ONNX's CumSum attributes) */
    /* Embedding of a slice of the stage input's ids (a model of several id inputs joined flat): each
       sample's ids ids_start .. ids_start + numel(ids_shape) - 1, viewed as ids_shape; ids_sliced 0 (ids_start
       null): the whole input */
    int64_t ids_start;
    int ids_sliced;
    int ids_ndims;
    int64_t ids_dims[PS_SHAPE_MAX_DIMS];
    /* spatial transformers: AffineGrid's size is size[2] (the grid's H, W), align_corners both kinds' */
    int gs_mode;                /* GridSample mode: 0 'bilinear', 1 'nearest', 2 'bicubic' (refused) */
    int gs_padding;             /* GridSample padding_mode: 0 'zeros', 1 'border', 2 'reflection' */
    /* weight normalisation (nn.utils.weight_norm) of Linear, Conv1d, Conv2d, ConvTranspose2d: wn 1: the
       weight is weight_g * weight_v / ||weight_v||, the norm over every dim but wn_dim (wn_dim_given 0:
       weight_norm_dim null, one norm of the whole weight) */
    int wn;
    int64_t wn_dim;
    int wn_dim_given;
    /* cross-attention (encoder-decoder Transformers) */
    int cross;                  /* MultiheadAttention cross: queries from input 0, keys and values from input 1
                                   (attn(x, memory, memory): nn.TransformerDecoderLayer's multihead_attn) */
} ps_layer_attrs;

/* An attribute of a kind. */
typedef enum {
    PS_ATTR_INT,                /* int64_t in [lo, hi]; a literal or a size */
    PS_ATTR_INT_OR_NULL,        /* PS_ATTR_INT, or null (sets the int at off2 to 1 when given, 0 for null):
                                   Embedding's padding_idx */
    PS_ATTR_PAIR,               /* int64_t[2]: one value for both, or a list of two */
    PS_ATTR_PAIR_OR_NULL,       /* PS_ATTR_PAIR whose values may be null, stored as 0 (AdaptiveAvgPool2d's
                                   output_size: null keeps the input's size) */
    PS_ATTR_FLOAT,              /* double in [lo, hi] (lo_open/hi_open exclude) */
    PS_ATTR_FLOAT_OR_NULL,      /* double, or null (sets the int at off2 to 1 for null, 0 otherwise:
                                   momentum_null); an infinity where the range [lo, hi] holds it */
    PS_ATTR_BOOL,               /* int 0/1 */
    PS_ATTR_ENUM,               /* int: index into enums */
    PS_ATTR_DIMS,               /* int ndims then int64_t dims[4]: one value or a list of 1..4 */
    PS_ATTR_BATCH_DIMS,         /* as DIMS over a batched tensor's dims: a list of 1..5 (int64_t[5]) */
    PS_ATTR_NAME,               /* const char *: a word of letters, digits and _ (a state_dict suffix) */
    PS_ATTR_FLOAT_INF,          /* as FLOAT, or an infinity: inf, -inf (YAML's .inf, -.inf; any case) */
    PS_ATTR_PADS,               /* as DIMS with up to 2 * PS_SHAPE_MAX_DIMS values (F.pad's pad list) */
    PS_ATTR_FLOAT_PAIR_OR_NULL, /* double[2]: one value for both or a list of two, or null (sets the int
                                   at off2 to 1 when given, 0 for null): Upsample's scale_factor */
} ps_attr_type;

typedef struct ps_attr_spec {
    const char *name;
    ps_attr_type type;
    size_t off;                 /* into ps_layer_attrs */
    const char *def;            /* default, as it would be written; NULL = required */
    double lo, hi;
    int lo_open, hi_open;
    const char *const *enums;   /* PS_ATTR_ENUM: NULL-terminated */
    size_t off2;                /* FLOAT_OR_NULL: the int set on null; DIMS, BATCH_DIMS: ndims */
    int empty_ok;               /* DIMS: an empty list is a value (Reshape's shape [], one value per sample) */
} ps_attr_spec;

/* Bounds the builder holds every shape to (anything larger is refused):
 * a dimension, and the elements of a per-sample activation or a parameter. */
#define PS_DIM_MAX ((int64_t)1 << 30)
#define PS_NUMEL_MAX ((int64_t)1 << 40)

#define PS_LAYER_MAX_PARAMS 32  /* LSTM: 4 per layer and direction, num_layers <= 4, bidirectional */
#define PS_LAYER_MAX_BUFFERS 3  /* BatchNorm: running_mean, running_var, num_batches_tracked */
#define PS_LAYER_MAX_SAVED 6  /* MultiheadAttention: mask, q, k, v, P, o (each sample-major) */

struct ps_layer;

typedef struct ps_layer_param {
    const char *suffix;         /* "weight", "bias" */
    int ndim;
    int64_t dims[4];
    int64_t numel;
    int64_t fan_in;             /* for the default initialisation */
    ps_init init;               /* resolved: never PS_INIT_DEFAULT */
    int sparse;                 /* gradient kept row-sparse (embedding tables) */
} ps_layer_param;

/* A buffer: state that is not trained (no gradient), checkpointed under
 * "<node>.<suffix>". float32 buffers live on the stage's device; int64
 * ones (counters) in host memory. */
typedef struct ps_layer_buffer {
    const char *suffix;         /* "running_mean" */
    int ndim;
    int64_t dims[4];
    int64_t numel;
    ps_dtype dtype;
    float init;                 /* initial value of every element */
    /* or, when set, element k's initial value of an int64 buffer (swin's relative_position_index) */
    int64_t (*init_i64)(const struct ps_layer *ly, int64_t k);
    int external;               /* 1: no values of its own (Constant): they come from --init-from, a
                                   checkpoint or the ONNX file, and psd refuses to start without them */
} ps_layer_buffer;

struct ps_layer_kind;

/* A node of a built model: the definition with its attributes resolved and
 * shapes inferred. */
typedef struct ps_layer {
    const struct ps_layer_kind *kind;
    const ps_node_def *def;
    const char *name;               /* def->name */
    unsigned flags;                 /* the kind's PS_KIND_*, as infer may adjust them for these attributes */
    ps_layer_attrs a;
    int nin;                        /* in, in_dtype, in_layout: nin entries each, in the stage's
                                       per-input arrays (server/nn/model_impl.h) */
    ps_shape *in;                   /* per-sample input shapes */
    ps_dtype *in_dtype;
    ps_shape outs;                  /* per-sample output shape */
    ps_dtype out_dtype;
    int nparams;
    ps_layer_param param[PS_LAYER_MAX_PARAMS];
    int nbuffers;
    ps_layer_buffer buffer[PS_LAYER_MAX_BUFFERS];
    int *in_layout;                 /* PS_LAYOUT_* of each input (planned by the executor) */
    int out_layout;                 /* PS_LAYOUT_* of the output */
    int dropout_idx;                /* index among the model's dropout nodes, -1 if none */
    int64_t row_lo;                 /* Embedding shard (model.h shard_*): its table holds global rows
                                       [row_lo, row_lo + num) of row_total; ids stay global */
    int64_t row_total;              /* 0 = not a shard */
    ps_bn_act fused;                /* BatchNorm: the activation after it folded in (ps_chan_desc.act); set by
                                       the executor, which makes that activation a view passing gradients
                                       through */
} ps_layer;

/* What a node keeps in a tape for its backward pass (backend memory: a
 * mask, a pooling workspace, statistics); freed by the tape. */
typedef struct ps_layer_saved {
    void *dev[PS_LAYER_MAX_SAVED];
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

/* One call of a node's forward or backward. Pointers are memory of be's
 * device (ps_backend_alloc_floats) unless said otherwise. */
typedef struct ps_layer_call {
    const ps_layer *ly;
    ps_backend *be;
    int n;                      /* samples */
    const void *const *xs;      /* inputs (ly->nin), each in ly->in_layout[i] */
    const void *x;              /* xs[0] */
    void *y;                    /* output (forward: written; backward: the forward's, when kept) */
    float *const *w;            /* parameters, ly->nparams of them */
    float *const *buf;          /* float32 buffers, in the order of ly->buffer (int64 ones: NULL) */
    const int64_t *const *ibuf; /* int64 buffers (host memory), in the order of ly->buffer (float32 ones: NULL) */
    ps_layer_saved *saved;
    /* forward */
    int train;
    const float *mask;          /* host: an injected dropout mask (golden tests), or NULL */
    ps_rng *rng;                /* this forward's dropout stream */
    /* backward */
    const float *dy;
    float *const *dxs;          /* per input: d loss / d input, overwritten; NULL: not wanted */
    float *dx;                  /* dxs[0] */
    float *dw[PS_LAYER_MAX_PARAMS]; /* dense parameter gradients, overwritten */
    ps_rows *rows;              /* sparse parameter 0: filled with its gradient (host) */
    const struct ps_layer_parts *parts; /* a combined backward of a PS_KIND_BWD_PARTS kind, else NULL */
} ps_layer_call;

/* A combined backward (psd's batched Backwards, server/nn/exec_group.c):
 * the call's n samples are k callers' samples side by side, and each
 * caller gets the parameter gradients of its own samples alone. A kind
 * with PS_KIND_BWD_PARTS computes them itself in the one call that
 * computes every caller's input gradient (its dw are then NULL): part p's
 * samples are [off[p], off[p] + n[p]) and its gradient of dense parameter
 * j goes to dw[p * PS_LAYER_MAX_PARAMS + j] (overwritten). Other kinds
 * never see it: the executor calls their backward once for the input
 * gradients and once per part for its parameter gradients. */
typedef struct ps_layer_parts {
    int k;
    const int *off, *n;
    float *const *dw;           /* k * PS_LAYER_MAX_PARAMS */
} ps_layer_parts;

/* Flags of a kind (ps_layer.flags). */
enum {
    PS_KIND_VIEW = 1,           /* output is the input, reshaped (Flatten, Reshape): plain layout */
    PS_KIND_EVAL_VIEW = 2,      /* identity in eval mode (Dropout) */
    PS_KIND_LAYOUT_KEEP = 4,    /* computes in whatever layout it gets (ReLU, pools) */
    PS_KIND_LAYOUT_BLOCKED = 8, /* prefers the backend's blocked layout (Conv2d) */
    PS_KIND_DROPOUT = 16,       /* takes a dropout mask (counted in dropout_idx) */
    PS_KIND_PARAMS_ONLY = 32,   /* holds parameters another process computes with (LSTM):
                                   never forwarded; its stage is parameter-only */
    PS_KIND_BWD_X = 64,         /* backward reads the inputs */
    PS_KIND_BWD_Y = 128,        /* backward reads the output */
    PS_KIND_INPLACE = 256,      /* forward may write y over input 0 (same size), backward dx over dy */
    PS_KIND_GRAD_PASS = 512,    /* backward is d input_i = d output for every input (Add): the
                                   executor routes the gradient, the kind's backward is not called */
    PS_KIND_BUFFERS_EVAL = 1024,/* its eval forward differs from training (BatchNorm) */
    PS_KIND_BWD_PARTS = 2048,   /* backward honours ps_layer_call.parts (dense parameters only): a
                                   combined backward is one call (MultiheadAttention, whose parameter
                                   gradients need the whole attention backward; Conv2d/Conv1d, whose
                                   backend may offer conv2d_wgrad_parts) */
};

typedef struct ps_layer_kind {
    const char *name;           /* PyTorch's class name */
    unsigned flags;
    int min_inputs, max_inputs;
    const ps_attr_spec *attrs;  /* NULL-name terminated */
    /* Fill ly->outs, out_dtype, params and buffers from ly->in, in_dtype and
     * the attributes; INVALID_ARGUMENT naming what does not fit. */
    ps_status (*infer)(ps_layer *ly, ps_err *err);
    /* NULL when the backend has every op this node needs, else their names. */
    const char *(*missing_op)(const ps_layer *ly, const ps_backend_ops *ops);
    ps_status (*forward)(ps_layer_call *c, ps_err *err);
    ps_status (*backward)(ps_layer_call *c, ps_err *err);
    /* Bytes a training tape keeps beyond the output activation (NULL: 0). */
    size_t (*tape_bytes)(const ps_layer *ly, int n);
    /* Optional: validate a host input (int64 ids) before it is used. */
    ps_status (*check_input)(const ps_layer *ly, const void *host_x, int64_t count, ps_err *err);
    /* FLOPs per sample of the forward, a multiply-add counted as 2 (NULL: elementwise, the output's size). */
    double (*flops)(const ps_layer *ly);
    /* Buffers updated by training (BatchNorm's running statistics), both
     * NULL for kinds without. stats: the arrays of a training forward's
     * saved state its fold reads (device memory, float), their lengths;
     * returns how many (0: nothing to fold). fold: apply one forward's
     * stats (host copies) to the node's buffers (host copies: float32 ones
     * in fbuf, int64 ones in ibuf, in ly->buffer order). The model folds a
     * context's forwards when its step is applied (model.h). */
    int (*stats)(const ps_layer *ly, const ps_layer_saved *sv, const float **dev, int64_t *len);
    void (*fold)(const ps_layer *ly, float *const *fbuf, int64_t *const *ibuf, const float *const *stats);
} ps_layer_kind;

/* The kind of that name, or NULL. */
const ps_layer_kind *ps_layer_kind_find(const char *name);
/* The kinds' names, comma-separated, into buf. */
const char *ps_layer_kind_list(char *buf, size_t cap);
/* Kind k's attribute of that name, or NULL. */
const ps_attr_spec *ps_layer_kind_attr(const ps_layer_kind *k, const char *name);
/* 1 and *v = +-INFINITY when s spells an infinity a PS_ATTR_FLOAT_INF
 * attribute takes (inf, +inf, -inf, .inf, -.inf; any case), else 0. */
int ps_attr_infinity(const char *s, double *v);
/* "out_channels, kernel_size, ..." into buf. */
const char *ps_layer_kind_attr_list(const ps_layer_kind *k, char *buf, size_t cap);

/* Resolve ly->def's attributes (defaults, sizes of def's model from the
 * n (key, value) overrides) into ly->a. INVALID_ARGUMENT naming the
 * attribute and the value. */
ps_status ps_layer_resolve(ps_layer *ly, const ps_model_def *def, int n, const char *const *keys,
                           const double *values, ps_err *err);

/* Infer ly's shapes, parameters and buffers (ly->kind, def, a, nin, in,
 * in_dtype set), then apply the node's init: entries. */
ps_status ps_layer_infer(ps_layer *ly, ps_err *err);

/* Initialise parameter j of ly in host memory (numel floats), drawing from r. */
void ps_layer_init_param(const ps_layer *ly, int j, float *host, ps_rng *r);

/* Parse an init spec ("zeros", "ones", "constant(v)", "uniform(a, b)",
 * "normal(mean, std)", "default"); INVALID_ARGUMENT naming it. */
ps_status ps_init_parse(const char *spec, ps_init *out, ps_err *err);

/* Number of elements of the node's output / input i for n samples. */
static inline int64_t ps_layer_out_count(const ps_layer *ly, int n) { return n * ps_shape_numel(&ly->outs); }
static inline int64_t ps_layer_in_count(const ps_layer *ly, int i, int n) { return n * ps_shape_numel(&ly->in[i]); }

/* FLOPs per sample of the forward (the kind's flops, or the output's size). */
double ps_layer_flops(const ps_layer *ly);

/* 1 when node ly computes each sample from that sample alone (outputs,
 * saved state and parameter gradients of sample i depend on sample i only)
 * and keeps its saved state sample-major, so that one forward over several
 * callers' samples can be cut into each caller's part (psd's batched
 * Forwards, server/nn/exec_group.c); saved[j]: bytes of saved dev[j] for n
 * samples on backend be (0: none). 0 for batch-coupled or unknown kinds
 * (BatchNorm, ...). */
int ps_layer_per_sample(const ps_layer *ly, const ps_backend *be, int n, size_t saved[PS_LAYER_MAX_SAVED]);
/* A dropout node's mask for n samples, drawn from rng exactly as its
 * training forward draws it (ps_layer_dropout_draws values: one per element
 * for Dropout, per (sample, channel) for Dropout2d, per sample for
 * StochasticDepth's mode 'row' and one for its 'batch'); the form the
 * forward takes as an injected mask (ps_layer_call.mask). */
void ps_layer_dropout_mask(const ps_layer *ly, int n, ps_rng *rng, float *mask);
int64_t ps_layer_dropout_draws(const ps_layer *ly, int n);

#endif
