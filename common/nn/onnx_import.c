/* onnx_import.c - an ONNX graph as a psd model file (see onnx_import.h): a
 * table of op handlers that turn ONNX nodes into psd nodes (layer kinds with
 * attributes and initializer bindings), constant folding for the shape
 * arithmetic exporters emit, recognisers for the exporters' decompositions,
 * and the writer of the model file's text. */
#include "onnx_import.h"

#include <ctype.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "modeldef.h"
#include "tensor.h"

#define MAXD PS_ONNX_MAX_DIMS
#define PS_MAXD PS_SHAPE_MAX_DIMS /* psd's per-sample dims */
#define NAME_MAX_ 100             /* modeldef.c's node names */
#define FOLD_MAX ((int64_t)1 << 20)   /* elements a folded constant may have */
#define BATCH_SYM INT64_MIN       /* a folded integer that is "the batch size" (Shape of the input, dim 0) */
#define MAX_INPUTS PS_NODE_MAX_INPUTS   /* a psd node's inputs (Concat's) */
#define INDEX_MAX 4               /* IndexSelect's index list (a DIMS attribute) */

/* ------------------------------------------------------------- memory */

typedef struct blk {
    struct blk *next;
    max_align_t data[];
} blk;

typedef struct pool {
    blk *head;
} mpool;

static void *palloc(mpool *p, size_t n) {
    blk *b = calloc(1, sizeof *b + (n ? n : 1));
    if (!b) return NULL;
    b->next = p->head;
    p->head = b;
    return b->data;
}

static void pool_free(mpool *p) {
    for (blk *b = p->head, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    p->head = NULL;
}

/* ------------------------------------------------------------- state */

/* VK_VIRT: a value inside a decomposition psd computes as one node (nn.MultiheadAttention's): no psd node
 * computes it; only its shape may be read (the exporter's shape arithmetic), where it is known (vshape) */
enum { VK_NONE = 0, VK_DATA, VK_CONST, VK_VIRT };

typedef struct val {
    struct val *next;           /* hash chain */
    const char *name;
    int kind;
    int prod;                   /* ONNX node producing it, -1: a graph input or initializer */
    int uses;                   /* ONNX node inputs reading it */
    int graph_output;
    /* VK_DATA */
    int node;                   /* psd node producing it, -1: the stage input */
    int dtype;                  /* PS_ONNX_FLOAT or PS_ONNX_INT64 */
    /* both: the full shape (DATA: the batch first unless whole-sample) */
    int ndim;
    int64_t dims[MAXD];
    /* VK_CONST */
    const ps_onnx_tensor *t;    /* a tensor of the file (initializer, Constant, feed), or NULL */
    int init;                   /* an initializer (or feed): may become a parameter */
    int bound;                  /* already a parameter of a psd node ... */
    int bound_pn, bound_tf;     /* ... which, and read how (a later reader read alike shares it) */
    char bound_suffix[24];
    int64_t numel;
    double *f;                  /* folded values (numel), or NULL until needed */
    int64_t *q;                 /* the same as integers (when integral) */
    int is_int;                 /* an integer type */
    int tpose;                  /* a Transpose of the initializer t: dims are t's swapped */
    int stage;                  /* DATA: the psd stage computing it */
    int lstm_out;               /* DATA: an LSTM's output (1: ONNX's (seq, 1, batch, H); 2: squeezed) */
    int trainer;                /* an LSTM's hidden-state input or output: the trainer's, not psd's */
    int kpm;                    /* DATA: Equal(ids, pad) as an Eq node, read only as a MultiheadAttention's key
                                   padding mask (the chain mha_kpm_match claims) */
    int shuffled;               /* DATA: a ChannelShuffle's output seen as the Transpose's (N, C/g, g, H, W)
                                   that the exporter wrote; its psd node computes (C, H, W) (h_transpose) */
    int vshape;                 /* VIRT: dims known, the batch at dim bdim (nn.MultiheadAttention's (L, N, E)) */
    int bdim;
    int rnn;                    /* VIRT: 1 + the recurrent chain (rnn_pat) whose final state it is, or 0 */
    int hlo, hn;                /* its rows hlo .. hlo + hn - 1 of h_n (hn 0: c_n) */
    /* CONST: nn.utils.weight_norm's w = g v / ||v|| as PyTorch exports it (find_weight_norm), read as a Gemm's,
       Conv's or ConvTranspose's weight: this value stands for v (its initializer t), wn_g for g; wn_null: dim=None
       (one norm of the whole), else dim 0 */
    struct val *wn_g;
    int wn_null;
} val;

enum { TF_NONE = 0, TF_TRANSPOSE, TF_GATES, TF_GATES_GRU };

typedef struct pbind {
    char suffix[24];
    const ps_onnx_tensor *t;
    int transform;              /* TF_TRANSPOSE: a 2-D tensor stored transposed (MatMul's B, Gemm's B without
                                   transB); TF_GATES: ONNX LSTM rows in gate order i, o, f, c to PyTorch's
                                   i, f, g, o, read from element `offset` of t; TF_GATES_GRU: ONNX GRU rows
                                   z, r, h to PyTorch's r, z, n */
    int64_t offset;
    int64_t numel;              /* the parameter's elements (t's, or a scalar broadcast to them) */
    int tie_pn;                 /* 1 + the psd node whose parameter tie_suffix this one is (an initializer read
                                   by several nodes: share: / tie:, docs/models.md), 0: its own */
    char tie_suffix[24];
} pbind;

typedef struct pnode {
    char name[NAME_MAX_ + 1];
    const char *kind;
    char attrs[1024];           /* ", key: value" */
    int nin;
    int *in;                    /* (nin) psd node index; -1: the stage input (im->mem) */
    int nb;
    pbind b[32];                /* an LSTM: 4 per layer and direction */
    int onnx;                   /* the ONNX node it came from */
    int has_bias_attr;          /* Linear/Conv2d written with bias: false (a later Add may give it one) */
    int readers;
    int stage;                  /* 0, or 1 after a trainer-side LSTM */
} pnode;

/* Fused ops the pre-pass found: at the node that ends a pattern, its kind
 * and what it reads. */
typedef struct fused {
    const char *kind;           /* "GELU", "SiLU", "Hardswish", "LayerNorm", "GroupNorm" (axis: its groups) */
    const char *x;              /* the input value's name */
    const char *scale, *bias;   /* LayerNorm's initializers (names) */
    const char *src[4];         /* LSTM: the initializers behind W, R, B (weight_ih, weight_hh, bias_ih,
                                   bias_hh) when the exporter glued them from PyTorch's; NULL: W, R, B as given */
    int axis;
    double eps;
    char scope[NAME_MAX_ + 1];
} fused;

/* nn.MultiheadAttention (batch_first, self-attention; the causal attn_mask or key_padding_mask = ids == pad)
 * as PyTorch's exporter decomposes it, found by
 * the pre-pass (find_mha): the ONNX nodes of its roles and the initializers it reads. */
typedef struct mha_pat {
    int t0, end;                /* the Transpose [1, 0, 2] of x to (L, N, E), the Transpose back */
    int part[3];                /* q, k, v: the Slices of the in-projection */
    int resh[3];                /* q, k, v: their Reshapes to (L, N*H, D) */
    int scale;                  /* q's Div by sqrt(D) (or Mul by its reciprocal) */
    int drop;                   /* a Dropout of the attention weights, or -1 */
    int mask_mul, mask_add;     /* an attn_mask: the scores' Mul by 1 and its Add of the mask term, or -1 */
    const char *mask;           /* the mask term the Add reads (h_mha: the causal mask, a constant) */
    /* a key_padding_mask = ids == pad: the exporter's chain from the Equal to the mask term (mha_kpm_match),
     * or kpm_eq -1 */
    int kpm_eq, kpm_r1, kpm_ex, kpm_r2, kpm_cast, kpm_where, kpm_mul;
    int resh_o, resh_y;         /* the Reshapes to (L*N, E) and back to (L, N, E) */
    const char *x, *w, *b, *wo, *bo;   /* the input value; the initializers (b, bo NULL: bias=False) */
    int w_t, wo_t;              /* w / wo stored (in, out) (an eval export's): bound transposed */
    char why[400];              /* a decomposition of nn.MultiheadAttention psd does not take: why (at t0) */
} mha_pat;

typedef struct imp {
    const ps_onnx_model *m;
    const char *label;
    ps_err *err;
    const ps_onnx_import_opts *o;
    int whole, needs_whole;     /* whole: lead is 0 (the whole input is one sample) */
    int lead;                   /* leading dims of computed values: 0, 1 (the batch), or 2 (seq, batch: a model
                                   whose LSTM the trainer runs) */
    int64_t opset;
    mpool mem;
    val **hash;
    int hcap;
    pnode *pn;
    int npn, cappn;
    int cur;                    /* the ONNX node being converted */
    char *absorbed;             /* per ONNX node: handled by a recogniser */
    char *live;                 /* per ONNX node: its outputs reach the graph output */
    int64_t batch;              /* leading mode: the input's first dimension (-1 symbolic) */
    val *input;                 /* the stage input */
    fused *fz;                  /* per ONNX node: a recognised pattern ending there */
    int stage;                  /* the psd stage nodes go to: 0, then 1 after a trainer-side LSTM */
    int stage0_out;             /* psd node ending stage 0 (the LSTM's input), -1 before */
    struct {
        int layers;             /* LSTM ops chained so far */
        int64_t hidden, input;
        int pn;                 /* its psd node (stage 2: parameters only) */
        const char *last_out;   /* the previous layer's output value */
    } lstm;
    int trailing;               /* ONNX node where the trainer's part after the model begins, or -1 */
    const char *out_name;       /* the graph output psd computes */
    const char *outs[MAX_INPUTS];   /* several graph outputs: joined into psd's one (join_outputs) */
    int nouts;
    int out_node;               /* its psd node */
    int64_t pad_extra[3];       /* a zero Pad folded into the node being converted: H, W, node + 1 */
    mha_pat *mha;               /* the nn.MultiheadAttention decompositions found (fz[end].axis, fz[t0].axis) */
    int nmha;
    struct rnn_pat *rnn;        /* the LSTM / GRU chains inside the graph (find_graph_rnns) */
    int nrnn;
    int *rnn_at;                /* per ONNX node: 1 + the chain it belongs to, or 0 */
} imp;

struct ps_onnx_import {
    char *yaml;
    size_t yaml_len;
    int whole;
    int nvalues;
    struct imp_value {
        char name[128];
        const ps_onnx_tensor *t;
        int transform;          /* TF_* */
        int64_t offset;
        int64_t numel;
    } *values;
};

/* ------------------------------------------------------------- errors */

static const ps_onnx_node *cur_node(const imp *im) { return im->cur >= 0 ? &im->m->nodes[im->cur] : NULL; }

static ps_status verr(imp *im, ps_status code, const char *fmt, va_list ap) {
    char msg[PS_ERR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    const ps_onnx_node *n = cur_node(im);
    if (n && n->name[0])
        return ps_err_set(im->err, code, "%s: node '%.120s' (%s): %s", im->label, n->name, n->op_type, msg);
    if (n) return ps_err_set(im->err, code, "%s: node #%d (%s): %s", im->label, im->cur, n->op_type, msg);
    return ps_err_set(im->err, code, "%s: %s", im->label, msg);
}

/* Not supported: the only error meaning "psd does not do this". */
static ps_status unsup(imp *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ps_status unsup(imp *im, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ps_status rc = verr(im, PS_ERR_UNIMPLEMENTED, fmt, ap);
    va_end(ap);
    return rc;
}

/* A graph psd could read but that is wrong. */
static ps_status bad(imp *im, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ps_status bad(imp *im, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ps_status rc = verr(im, PS_ERR_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    return rc;
}

static ps_status oom(imp *im) { return ps_err_set(im->err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", im->label); }

/* In leading mode: this op acts along the batch; the import is retried
 * with the whole input as one sample. */
static ps_status along_batch(imp *im, const char *what) {
    im->needs_whole = 1;
    return unsup(im, "%s acts along dimension 0, the batch (psd then reads the whole input as one sample)", what);
}

/* ------------------------------------------------------------- values */

static val *vget(imp *im, const char *name) {
    for (val *v = im->hash[ps_hash_str(name) & (uint64_t)(im->hcap - 1)]; v; v = v->next)
        if (!strcmp(v->name, name)) return v;
    return NULL;
}

static val *vmake(imp *im, const char *name) {
    val *v = vget(im, name);
    if (v) return v;
    v = palloc(&im->mem, sizeof *v);
    if (!v) return NULL;
    v->name = name;
    v->prod = -1;
    v->node = -1;
    uint64_t h = ps_hash_str(name) & (uint64_t)(im->hcap - 1);
    v->next = im->hash[h];
    im->hash[h] = v;
    return v;
}

/* a * b for element counts, saturating at 2^62 (anything near it is refused as absurd) */
static int64_t smul(int64_t a, int64_t b) {
    const int64_t cap = (int64_t)1 << 62;
    if (a <= 0 || b <= 0) return a < 0 || b < 0 ? -1 : 0;
    return a > cap / b ? cap : a * b;
}

static int64_t prod(const int64_t *d, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p = smul(p, d[i]);
    return p;
}

/* Input k of the current node (NULL, with err set, when missing or unknown). */
static val *in_val(imp *im, int k, int required) {
    const ps_onnx_node *n = cur_node(im);
    if (k >= n->nin || !n->in[k][0]) {
        if (required) bad(im, "input %d is missing", k);
        return NULL;
    }
    val *v = vget(im, n->in[k]);
    if (!v || v->kind == VK_NONE) {
        bad(im, "input '%s' is neither a graph input, an initializer nor an earlier node's output", n->in[k]);
        return NULL;
    }
    if (v->trainer) {
        unsup(im, "input '%s' is an LSTM's hidden state (the trainer's)", v->name);
        return NULL;
    }
    if (v->kpm && im->absorbed[im->cur] != 2) {
        unsup(im, "'%s' (ids == pad) is read by %s: psd reads a comparison of the ids only as "
              "nn.MultiheadAttention's key_padding_mask", v->name, n->op_type);
        return NULL;
    }
    if (v->kind == VK_VIRT && v->rnn && strcmp(n->op_type, "Shape")) {
        unsup(im, "'%s' is the final %s state of an LSTM or GRU psd computes as one node: psd reads the last "
              "layer's rows of h_n one at a time (h_n[-1]; bidirectional h_n[-2] and h_n[-1]), each a cut of the "
              "output", v->name, v->hn ? "hidden" : "cell");
        return NULL;
    }
    if (v->kind == VK_VIRT && strcmp(n->op_type, "Shape")) {
        unsup(im, "input '%s' is inside the nn.MultiheadAttention psd computes as one node: only its shape may be "
              "read outside it", v->name);
        return NULL;
    }
    if (v->kind == VK_DATA && v->stage != im->stage) {
        unsup(im, "'%s' is computed before the LSTM and read after it: one tensor crosses a stage boundary "
              "(the LSTM's output)", v->name);
        return NULL;
    }
    return v;
}

static int has_in(imp *im, int k) {
    const ps_onnx_node *n = cur_node(im);
    return k < n->nin && n->in[k][0];
}

/* A folded value as an integer: truncated, saturating (a float constant of 1e30 or NaN read as a size is
 * refused where it is used, not undefined here). */
static int64_t to_int(double x) {
    if (!(x == x)) return 0;
    if (x >= 9.2e18) return INT64_MAX;
    if (x <= -9.2e18) return INT64_MIN + 1;
    return (int64_t)x;
}

/* The folded values of a constant (NULL with err set when too large or not numbers). */
static const double *cvals(imp *im, val *v) {
    if (v->f) return v->f;
    if (v->numel > FOLD_MAX) {
        unsup(im, "constant '%s' of %lld elements used as a value (psd folds constants of at most %lld)", v->name,
              (long long)v->numel, (long long)FOLD_MAX);
        return NULL;
    }
    double *f = palloc(&im->mem, (size_t)(v->numel ? v->numel : 1) * sizeof *f);
    int64_t *q = palloc(&im->mem, (size_t)(v->numel ? v->numel : 1) * sizeof *q);
    float *tmp = palloc(&im->mem, (size_t)(v->numel ? v->numel : 1) * sizeof *tmp);
    if (!f || !q || !tmp) { oom(im); return NULL; }
    ps_err e = {0};
    if (v->is_int) {
        if (ps_onnx_tensor_int64s(v->t, q, &e)) { bad(im, "%s", e.msg); return NULL; }
        for (int64_t i = 0; i < v->numel; i++) f[i] = (double)q[i];
    } else {
        if (ps_onnx_tensor_floats(v->t, tmp, &e)) { bad(im, "%s", e.msg); return NULL; }
        for (int64_t i = 0; i < v->numel; i++) { f[i] = tmp[i]; q[i] = to_int(tmp[i]); }
    }
    v->f = f;
    v->q = q;
    return f;
}

static const int64_t *cints(imp *im, val *v) {
    if (!cvals(im, v)) return NULL;
    return v->q;
}

static int dtype_is_int(int dt) {
    return dt == PS_ONNX_INT64 || dt == PS_ONNX_INT32 || dt == PS_ONNX_INT16 || dt == PS_ONNX_INT8 ||
           dt == PS_ONNX_UINT8 || dt == PS_ONNX_UINT16 || dt == PS_ONNX_UINT32 || dt == PS_ONNX_UINT64 ||
           dt == PS_ONNX_BOOL;
}

static void set_const_tensor(val *v, const ps_onnx_tensor *t, int init) {
    v->kind = VK_CONST;
    v->t = t;
    v->init = init;
    v->ndim = t->ndim;
    memcpy(v->dims, t->dims, sizeof v->dims);
    v->numel = t->numel;
    v->is_int = dtype_is_int(t->dtype);
    v->dtype = t->dtype;
}

/* A folded constant (its values given). */
static val *const_out(imp *im, int k, int ndim, const int64_t *dims, const double *f, int is_int) {
    const ps_onnx_node *n = cur_node(im);
    if (k >= n->nout || !n->out[k][0]) return NULL;
    val *v = vmake(im, n->out[k]);
    if (!v) { oom(im); return NULL; }
    v->kind = VK_CONST;
    v->ndim = ndim;
    memcpy(v->dims, dims, (size_t)ndim * sizeof *dims);
    v->numel = prod(dims, ndim);
    v->is_int = is_int;
    v->dtype = is_int ? PS_ONNX_INT64 : PS_ONNX_FLOAT;
    v->f = palloc(&im->mem, (size_t)(v->numel ? v->numel : 1) * sizeof(double));
    v->q = palloc(&im->mem, (size_t)(v->numel ? v->numel : 1) * sizeof(int64_t));
    if (!v->f || !v->q) { oom(im); return NULL; }
    for (int64_t i = 0; i < v->numel; i++) {
        v->f[i] = f[i];
        v->q[i] = f[i] == (double)BATCH_SYM ? BATCH_SYM : to_int(f[i]);
    }
    return v;
}

/* A computed tensor, output k of the current node, produced by psd node pn. */
static val *data_out(imp *im, int k, int pn, int dtype, int ndim, const int64_t *dims) {
    const ps_onnx_node *n = cur_node(im);
    if (k >= n->nout || !n->out[k][0]) {
        bad(im, "output %d is missing", k);
        return NULL;
    }
    for (int d = 0; d < ndim; d++)
        if (dims[d] <= 0 && !(d < im->lead && dims[d] == -1)) {   /* a symbolic batch is -1 */
            unsup(im, "output '%s' has a dimension of size %lld (psd's tensors are not empty)", n->out[k],
                  (long long)dims[d]);
            return NULL;
        }
    val *v = vmake(im, n->out[k]);
    if (!v) { oom(im); return NULL; }
    v->kind = VK_DATA;
    v->node = pn;
    v->stage = im->stage;
    v->lstm_out = 0;
    v->dtype = dtype;
    v->ndim = ndim;
    memcpy(v->dims, dims, (size_t)ndim * sizeof *dims);
    return v;
}

/* An alias: output k is input value src. */
static ps_status alias_out(imp *im, int k, const val *src) {
    const ps_onnx_node *n = cur_node(im);
    if (k >= n->nout || !n->out[k][0]) return PS_OK;
    val *v = vmake(im, n->out[k]);
    if (!v) return oom(im);
    val *keep = v->next;
    const char *name = v->name;
    int prodn = v->prod, uses = v->uses, gout = v->graph_output;
    *v = *src;
    v->next = keep;
    v->name = name;
    v->prod = prodn;
    v->uses = uses;
    v->graph_output = gout;
    return PS_OK;
}

/* Per-sample dims of a computed value (psd's view). */
static int sample_dims(const imp *im, const val *v, int64_t *out) {
    int off = im->lead, n = v->ndim - off;
    for (int i = 0; i < n; i++) out[i] = v->dims[off + i];
    return n;
}

/* ONNX axis (negative from the end) of a value with rank r, normalised;
 * -1 and err set when out of range. */
static int norm_axis(imp *im, int64_t axis, int r, const char *what) {
    if (axis < -r || axis >= r) {
        bad(im, "%s %lld is outside a tensor of rank %d", what, (long long)axis, r);
        return -1;
    }
    return (int)(axis < 0 ? axis + r : axis);
}

/* PyTorch's dim (the batch counted as 0) for ONNX axis a; -1 when a is the batch (leading mode). */
static int pt_dim(const imp *im, int a) { return a < im->lead ? -1 : a - im->lead + 1; }

/* ------------------------------------------------------------- attributes */

static const ps_onnx_attr *attr(imp *im, const char *name) { return ps_onnx_attr_find(cur_node(im), name); }

static int64_t attr_i(imp *im, const char *name, int64_t def) {
    const ps_onnx_attr *a = attr(im, name);
    return a ? a->i : def;
}

static float attr_f(imp *im, const char *name, float def) {
    const ps_onnx_attr *a = attr(im, name);
    return a ? a->f : def;
}

static const char *attr_s(imp *im, const char *name, const char *def) {
    const ps_onnx_attr *a = attr(im, name);
    return a && a->s ? a->s : def;
}

/* ints attribute into out (at most max); returns the count, -1 when absent. */
static int attr_ints(imp *im, const char *name, int64_t *out, int max) {
    const ps_onnx_attr *a = attr(im, name);
    if (!a) return -1;
    int n = a->nints < max ? a->nints : max;
    for (int i = 0; i < n; i++) out[i] = a->ints[i];
    return a->nints > max ? max + 1 : n;
}

/* A constant int list that ONNX moved from an attribute to an input (Reshape's
 * shape at opset 5, Split's sizes and Squeeze/Unsqueeze's axes at 13,
 * ReduceMean's axes at 18): input idx from opset from_opset on, when the
 * node has it, else the attribute name. *n: the count, -1 when neither is
 * there. A list computed from the input's values, or of more than cap
 * values, is refused naming what. */
static ps_status moved_ints(imp *im, int idx, int64_t from_opset, const char *name, const char *what, int64_t *out,
                            int cap, int *n) {
    if (im->opset >= from_opset && has_in(im, idx)) {
        val *v = in_val(im, idx, 1);
        if (!v) return im->err->code;
        if (v->kind != VK_CONST) return unsup(im, "%s computed from the input's values", what);
        const int64_t *q = cints(im, v);
        if (!q) return im->err->code;
        if (v->numel > cap) return unsup(im, "%s of %lld values", what, (long long)v->numel);
        *n = (int)v->numel;
        if (*n) memcpy(out, q, sizeof *q * (size_t)*n);
        return PS_OK;
    }
    *n = im->opset < from_opset ? attr_ints(im, name, out, cap) : -1;
    if (*n > cap) return unsup(im, "%s of more than %d values", what, cap);
    return PS_OK;
}

/* Refuse attributes outside the list the handler reads. */
static ps_status only_attrs(imp *im, const char *const *known) {
    const ps_onnx_node *n = cur_node(im);
    for (int i = 0; i < n->nattr; i++) {
        int ok = 0;
        for (const char *const *k = known; *k && !ok; k++) ok = !strcmp(*k, n->attrs[i].name);
        if (!ok) return unsup(im, "attribute '%s' is not supported", n->attrs[i].name);
    }
    return PS_OK;
}

/* ------------------------------------------------------------- psd nodes */

static int valid_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

static int name_taken(const imp *im, const char *name) {
    if (!strcmp(name, "input")) return 1;
    for (int i = 0; i < im->npn; i++)
        if (!strcmp(im->pn[i].name, name)) return 1;
    return 0;
}

/* s sanitised into a node name (segments of [A-Za-z0-9_-] joined by '.'; modeldef's rule: '-' as in
 * torchvision's regnet 'block1-0', so its initializers keep their state_dict names). */
static void sanitize(const char *s, char *out, size_t cap) {
    size_t o = 0;
    int seg = 0;
    for (; *s && o + 1 < cap; s++) {
        char c = *s;
        if (c == '.' || c == '/') {
            if (seg) { out[o++] = '.'; seg = 0; }
            continue;
        }
        out[o++] = valid_char(c) || c == '-' ? c : '_';
        seg = 1;
    }
    while (o && out[o - 1] == '.') o--;
    out[o] = 0;
}

/* The scope path of an exporter's node name ("/layer1/layer1.0/conv1/Conv"
 * -> "layer1.0.conv1"): segments are module names, each either the full
 * dotted path or relative to the one before; the last is the op. */
static void scope_of(const char *name, char *out, size_t cap) {
    char path[512] = "";
    const char *p = name;
    char segs[32][128];
    int ns = 0;
    while (*p && ns < 32) {
        while (*p == '/') p++;
        if (!*p) break;
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n >= sizeof segs[0]) n = sizeof segs[0] - 1;
        memcpy(segs[ns], p, n);
        segs[ns][n] = 0;
        ns++;
        p += n;
    }
    for (int i = 0; i + 1 < ns; i++) {   /* the last segment is the op */
        size_t pl = strlen(path);
        if (pl && !strncmp(segs[i], path, pl) && segs[i][pl] == '.')
            snprintf(path, sizeof path, "%s", segs[i]);
        else if (pl)
            snprintf(path + pl, sizeof path - pl, ".%s", segs[i]);
        else
            snprintf(path, sizeof path, "%s", segs[i]);
    }
    sanitize(path, out, cap);
}

/* Does another ONNX node's scope equal or extend scope? */
static int scope_shared(const imp *im, const char *scope, int self) {
    size_t n = strlen(scope);
    char other[NAME_MAX_ + 1];
    for (int i = 0; i < im->m->nnodes; i++) {
        /* Constants (an op's constant inputs) and nodes a recogniser folded in do not count */
        if (i == self || !im->live[i] || im->absorbed[i] || !strcmp(im->m->nodes[i].op_type, "Constant")) continue;
        scope_of(im->m->nodes[i].name, other, sizeof other);
        if (!strncmp(other, scope, n) && (other[n] == 0 || other[n] == '.')) return 1;
    }
    return 0;
}

static void lower_op(const char *op, char *out, size_t cap) {
    size_t o = 0;
    for (; *op && o + 1 < cap; op++) out[o++] = valid_char(*op) ? (char)tolower((unsigned char)*op) : '_';
    out[o] = 0;
}

/* The name of a psd node for the current ONNX node: the state_dict prefix
 * of an initializer it binds (prefix.suffix), else its scope, else its op. */
static void pick_name(imp *im, const char *prefer_init, const char *suffix, const char *extra, char *out) {
    char base[NAME_MAX_ + 1] = "";
    const ps_onnx_node *n = cur_node(im);
    if (prefer_init && suffix) {
        size_t l = strlen(prefer_init), s = strlen(suffix);
        if (l > s + 1 && prefer_init[l - s - 1] == '.' && !strcmp(prefer_init + l - s, suffix) && l - s - 1 <= NAME_MAX_) {
            char pre[NAME_MAX_ + 1];
            memcpy(pre, prefer_init, l - s - 1);
            pre[l - s - 1] = 0;
            char clean[NAME_MAX_ + 1];
            sanitize(pre, clean, sizeof clean);
            if (!strcmp(clean, pre)) snprintf(base, sizeof base, "%s", pre);
        }
    }
    if (!base[0] && n->name[0]) {
        char scope[NAME_MAX_ + 1], op[64];
        scope_of(n->name, scope, sizeof scope);
        lower_op(n->op_type, op, sizeof op);
        if (scope[0] && !scope_shared(im, scope, im->cur))
            snprintf(base, sizeof base, "%s", scope);
        else if (scope[0])
            snprintf(base, sizeof base, "%.60s.%.36s", scope, op);
        else if (n->name[0] == '/')
            snprintf(base, sizeof base, "%s", op);
        else
            sanitize(n->name, base, sizeof base);
    }
    if (!base[0]) lower_op(n->op_type, base, sizeof base);
    if (extra) {
        size_t l = strlen(base);
        snprintf(base + l, sizeof base - l, ".%s", extra);
    }
    if (!base[0] || isdigit((unsigned char)base[0])) {   /* "n" before it, the end cut to fit */
        size_t l = strlen(base);
        if (l > NAME_MAX_ - 1) l = NAME_MAX_ - 1;
        memmove(base + 1, base, l);
        base[0] = 'n';
        base[l + 1] = 0;
    }
    base[NAME_MAX_ - 6] = 0;
    snprintf(out, NAME_MAX_ + 1, "%s", base);
    size_t bl = strlen(base);
    for (int k = 1; name_taken(im, out); k++) {   /* base_1, base_2, ...: at most 94 + 6 characters */
        char suf[16];
        int sl = snprintf(suf, sizeof suf, "_%d", k);
        if (sl < 0 || bl + (size_t)sl > NAME_MAX_) break;
        memcpy(out + bl, suf, (size_t)sl + 1);
    }
}

/* A new psd node of kind reading inputs in[] (psd node indices, -1 = the stage input). */
static int emit(imp *im, const char *kind, const char *prefer_init, const char *suffix, const char *extra, int nin,
                const int *in) {
    if (im->npn == im->cappn) {
        int cap = im->cappn ? im->cappn * 2 : 64;
        pnode *p = realloc(im->pn, (size_t)cap * sizeof *p);
        if (!p) { oom(im); return -1; }
        im->pn = p;
        im->cappn = cap;
    }
    pnode *p = &im->pn[im->npn];
    memset(p, 0, sizeof *p);
    pick_name(im, prefer_init, suffix, extra, p->name);
    p->kind = kind;
    p->nin = nin;
    if (!(p->in = palloc(&im->mem, (size_t)(nin ? nin : 1) * sizeof *p->in))) { oom(im); return -1; }
    for (int i = 0; i < nin; i++) {
        p->in[i] = in[i];
        if (in[i] >= 0) im->pn[in[i]].readers++;
    }
    p->onnx = im->cur;
    p->stage = im->stage;
    return im->npn++;
}

static void add_attr(imp *im, int pn, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_attr(imp *im, int pn, const char *fmt, ...) {
    pnode *p = &im->pn[pn];
    size_t l = strlen(p->attrs);
    if (l + 3 >= sizeof p->attrs) return;
    memcpy(p->attrs + l, ", ", 3);
    l += 2;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->attrs + l, sizeof p->attrs - l, fmt, ap);
    va_end(ap);
}

/* "[a, b, c]" */
static const char *dims_text(const int64_t *d, int n, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < n && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? ", " : "", (long long)d[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

/* A float as the shortest text that reads back as the same float32. */
static const char *float_text(double v, char *buf, size_t cap) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, cap, "%.*g", digits, v);
        if ((float)strtod(buf, NULL) == (float)v) break;
    }
    if (!strpbrk(buf, ".eEn")) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, ".0");
    }
    return buf;
}

/* The psd node that holds initializer t whole as a parameter of its own
 * (*b: the binding), or -1. A later reader of t (directly or through a
 * Transpose) shares it (share: / tie:). */
static int lent_by(const imp *im, const ps_onnx_tensor *t, int *b) {
    for (int i = 0; i < im->npn; i++)
        for (int k = 0; k < im->pn[i].nb; k++) {
            const pbind *x = &im->pn[i].b[k];
            if (x->t == t && !x->offset && !x->tie_pn && x->transform != TF_GATES && x->numel == t->numel) {
                *b = k;
                return i;
            }
        }
    return -1;
}

/* Bind a constant initializer as parameter or buffer suffix of psd node pn. */
static ps_status bind_tf(imp *im, int pn, const char *suffix, val *c, int transform, int64_t offset, int64_t numel);

static ps_status bind(imp *im, int pn, const char *suffix, val *c, int transpose, int64_t numel) {
    return bind_tf(im, pn, suffix, c, (transpose ^ c->tpose) ? TF_TRANSPOSE : TF_NONE, 0, numel);
}

/* A Linear's / convolution's weight: the initializer w (transposed), or weight_norm's g and v (wn_g) as the
 * kind's weight_g and weight_v with its weight_norm attributes. */
static ps_status bind_weight(imp *im, int pn, val *w, int transpose) {
    if (!w->wn_g) return bind(im, pn, "weight", w, transpose, 0);
    if (transpose ^ w->tpose)
        return unsup(im, "weight_norm of '%s' read transposed (psd's weight_norm normalises the weight as PyTorch "
                     "holds it)", w->name);
    add_attr(im, pn, "weight_norm: true");
    if (w->wn_null) add_attr(im, pn, "weight_norm_dim: null");
    ps_status rc = bind(im, pn, "weight_g", w->wn_g, 0, 0);
    return rc ? rc : bind(im, pn, "weight_v", w, 0, 0);
}

/* Bind with a transform; an initializer read in parts (an LSTM's B) is bound once per part. */
static ps_status bind_tf(imp *im, int pn, const char *suffix, val *c, int transform, int64_t offset, int64_t numel) {
    if (!c->init || !c->t)
        return unsup(im, "'%s' is computed from other values: psd takes parameters from initializers", c->name);
    int ob = -1, on = c->init && c->t && !offset ? lent_by(im, c->t, &ob) : -1;
    int again = on >= 0;   /* read by an earlier node too (directly or through a Transpose): one parameter */
    if (c->bound && !offset && !again)
        return unsup(im, "initializer '%s' is read by two nodes: psd gives every node its own parameters", c->name);
    if (again) {
        c->bound_pn = on;
        c->bound_tf = im->pn[on].b[ob].transform;
        snprintf(c->bound_suffix, sizeof c->bound_suffix, "%s", im->pn[on].b[ob].suffix);
    }
    if (again && (!suffix[0] || !c->bound_suffix[0]))
        return unsup(im, "initializer '%s' is read by two nodes as a tensor of its own (a Parameter): psd shares "
                     "a node's named parameters", c->name);
    if (again && (c->bound_tf != transform || (numel && numel != c->t->numel)))
        return unsup(im, "initializer '%s' is read by two nodes, %s at one of them: psd shares a parameter that "
                     "every node reads alike", c->name, transform || c->bound_tf ? "transposed" : "in part");
    pnode *p = &im->pn[pn];
    if (p->nb == (int)(sizeof p->b / sizeof p->b[0])) return bad(im, "too many parameters");
    if (!ps_onnx_dtype_size(c->t->dtype) || c->t->dtype == PS_ONNX_BOOL)
        return unsup(im, "initializer '%s' of type %s as a parameter (psd's parameters are float32)", c->name,
                     ps_onnx_dtype_name(c->t->dtype));
    pbind *b = &p->b[p->nb++];
    snprintf(b->suffix, sizeof b->suffix, "%s", suffix);
    b->t = c->t;
    b->transform = transform;
    b->offset = offset;
    b->numel = numel ? numel : c->t->numel;
    if (again) {
        b->tie_pn = c->bound_pn + 1;
        snprintf(b->tie_suffix, sizeof b->tie_suffix, "%s", c->bound_suffix);
    } else if (!offset) {
        c->bound_pn = pn;
        c->bound_tf = transform;
        snprintf(c->bound_suffix, sizeof c->bound_suffix, "%s", suffix);
    }
    c->bound = 1;
    return PS_OK;
}

/* A computed float value with per-sample rank in [lo, hi]. */
static ps_status need_float(imp *im, const val *v, int lo, int hi, const char *what) {
    if (v->kind != VK_DATA)
        return unsup(im, "%s '%s' is a constant: psd computes ops on the input's values only", what, v->name);
    if (v->dtype != PS_ONNX_FLOAT)
        return unsup(im, "%s '%s' is %s: psd computes on float", what, v->name, ps_onnx_dtype_name(v->dtype));
    int r = v->ndim - im->lead;
    if (r < lo || r > hi) {
        if (im->whole && v->ndim >= 1 && r - 1 >= lo && r - 1 <= hi)
            return unsup(im, "%s '%s' of rank %d: this op needs its batch dimension (it is the whole input, one "
                         "sample, here)", what, v->name, v->ndim);
        return unsup(im, "%s '%s' of rank %d: psd's kind takes %d..%d dimensions per sample", what, v->name,
                     v->ndim, lo, hi);
    }
    return PS_OK;
}

/* ---------------------------------------------------- elementwise ops */

static ps_status act_of(imp *im, val *x, const char *kind, const char *attrs_text) {
    ps_status rc = need_float(im, x, 0, PS_MAXD, "input");
    if (rc) return rc;
    int in = x->node;
    int pn = emit(im, kind, NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    if (attrs_text) add_attr(im, pn, "%s", attrs_text);
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

/* The activation kind of input 0 (x's: Max's value may be input 1). */
static ps_status simple_act(imp *im, const char *kind, const char *attrs_text) {
    val *x = in_val(im, 0, 1);
    return x ? act_of(im, x, kind, attrs_text) : im->err->code;
}

static ps_status h_relu(imp *im) { return simple_act(im, "ReLU", NULL); }
static ps_status h_sigmoid(imp *im) { return simple_act(im, "Sigmoid", NULL); }
static ps_status h_tanh(imp *im) { return simple_act(im, "Tanh", NULL); }

/* An activation whose one ONNX attribute `alpha` (default dflt) is psd's attribute psd_attr. */
static ps_status alpha_act(imp *im, float dflt, const char *kind, const char *psd_attr) {
    static const char *const known[] = {"alpha", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    char t[64], f[40];
    snprintf(t, sizeof t, "%s: %s", psd_attr, float_text(attr_f(im, "alpha", dflt), f, sizeof f));
    return simple_act(im, kind, t);
}

static ps_status h_leaky(imp *im) { return alpha_act(im, 0.01f, "LeakyReLU", "negative_slope"); }

static ps_status h_identity(imp *im) {
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    return alias_out(im, 0, x);
}

/* Softmax / LogSoftmax: one axis from opset 13; before, the input flattened
 * to 2-D at axis (default 1) and normalised over the second part. */
static ps_status softmax_like(imp *im, const char *kind) {
    static const char *const known[] = {"axis", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if ((rc = need_float(im, x, 1, PS_MAXD, "input"))) return rc;
    int r = x->ndim;
    int a = norm_axis(im, attr_i(im, "axis", im->opset >= 13 ? -1 : 1), r, "axis");
    if (a < 0) return im->err->code;
    if (im->opset < 13 && a != r - 1) {
        /* over the flattened trailing dims a..r-1: Flatten, the kind, Reshape back */
        int d = pt_dim(im, a);
        if (d < 0) return along_batch(im, cur_node(im)->op_type);
        int in = x->node;
        int f = emit(im, "Flatten", NULL, NULL, "flatten", 1, &in);
        if (f < 0) return oom(im);
        add_attr(im, f, "start_dim: %d", d);
        int s = emit(im, kind, NULL, NULL, NULL, 1, &f);
        if (s < 0) return oom(im);
        add_attr(im, s, "dim: -1");
        int64_t ps[MAXD];
        int n = sample_dims(im, x, ps);
        char buf[128];
        int back = emit(im, "Reshape", NULL, NULL, "reshape", 1, &s);
        if (back < 0) return oom(im);
        add_attr(im, back, "shape: %s", dims_text(ps, n, buf, sizeof buf));
        return data_out(im, 0, back, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
    }
    int d = pt_dim(im, a);
    if (d < 0) return along_batch(im, cur_node(im)->op_type);
    int in = x->node;
    int pn = emit(im, kind, NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "dim: %d", d);
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

static ps_status h_softmax(imp *im) { return softmax_like(im, "Softmax"); }
static ps_status h_log_softmax(imp *im) { return softmax_like(im, "LogSoftmax"); }

static ps_status clamp_of(imp *im, val *x, double lo_v, double hi_v);

/* Clip: the bounds attributes before opset 11 (absent: -FLT_MAX,
 * FLT_MAX), optional constant scalar inputs from 11. Both bounds are a
 * Hardtanh (0 and 6: ReLU6, PyTorch's F.relu6 and F.hardtanh export so);
 * a lower bound 0 alone a ReLU; none the identity. */
static ps_status h_clip(imp *im) {
    static const char *const known[] = {"min", "max", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    double b[2] = {-FLT_MAX, FLT_MAX};
    static const char *const names[2] = {"min", "max"};
    for (int k = 0; k < 2; k++) {
        if (im->opset < 11) {
            b[k] = attr_f(im, names[k], (float)b[k]);
        } else if (has_in(im, k + 1)) {
            val *v = in_val(im, k + 1, 1);
            if (!v) return im->err->code;
            if (v->kind != VK_CONST || v->numel != 1) return unsup(im, "a %s that is not a constant scalar", names[k]);
            const double *f = cvals(im, v);
            if (!f) return im->err->code;
            b[k] = f[0];
        }
    }
    return clamp_of(im, x, b[0], b[1]);
}

/* x clamped to [lo, hi] (-FLT_MAX / FLT_MAX and beyond: open): Clip's, and Max / Min by a number's. */
static ps_status clamp_of(imp *im, val *x, double lo_v, double hi_v) {
    double b[2] = {lo_v, hi_v};
    const int lo = b[0] > -FLT_MAX, hi = b[1] < FLT_MAX;
    if (!lo && !hi) return alias_out(im, 0, x);
    if (lo && !hi && b[0] == 0) return act_of(im, x, "ReLU", NULL);
    if (!lo) b[0] = -INFINITY;      /* one bound: the other side of the Hardtanh open */
    if (!hi) b[1] = INFINITY;
    if (!((float)b[0] < (float)b[1])) return unsup(im, "min %g is not below max %g", b[0], b[1]);
    if (b[0] == 0 && b[1] == 6) return act_of(im, x, "ReLU6", NULL);
    char t[96], f1[40], f2[40];
    snprintf(t, sizeof t, "min_val: %s, max_val: %s", float_text(b[0], f1, sizeof f1), float_text(b[1], f2, sizeof f2));
    return act_of(im, x, "Hardtanh", t);
}

/* PyTorch's hardsigmoid: ONNX's HardSigmoid with alpha 1/6 (as float) and beta 0.5. */
static int torch_hardsigmoid(const ps_onnx_node *n) {
    const ps_onnx_attr *a = ps_onnx_attr_find(n, "alpha"), *b = ps_onnx_attr_find(n, "beta");
    return a && a->f == (float)(1.0 / 6.0) && (!b || b->f == 0.5f);
}

static ps_status h_hardsigmoid(imp *im) {
    static const char *const known[] = {"alpha", "beta", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (!torch_hardsigmoid(cur_node(im)))
        return unsup(im, "alpha %g, beta %g: psd's Hardsigmoid is PyTorch's (alpha 1/6, beta 0.5)",
                     attr_f(im, "alpha", 0.2f), attr_f(im, "beta", 0.5f));
    return simple_act(im, "Hardsigmoid", NULL);
}

static ps_status h_hardswish(imp *im) { return simple_act(im, "Hardswish", NULL); }

/* Dropout's ratio: an attribute before opset 12, an input from 12 (with training_mode); is_test before 7
 * (*p 0: the identity). Its mask output must be unread. */
static ps_status dropout_ratio(imp *im, double *p) {
    static const char *const known[] = {"ratio", "is_test", "seed", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    const ps_onnx_node *n = cur_node(im);
    if (n->nout > 1 && n->out[1][0]) {
        val *mask = vget(im, n->out[1]);
        if (mask && (mask->uses || mask->graph_output)) return unsup(im, "its mask output is used");
    }
    *p = 0.5;
    if (im->opset < 12) {
        *p = attr_f(im, "ratio", 0.5f);
        if (im->opset < 7 && attr_i(im, "is_test", 0)) *p = 0;
    } else if (has_in(im, 1)) {
        val *r = in_val(im, 1, 1);
        if (!r) return im->err->code;
        if (r->kind != VK_CONST || r->numel != 1) return unsup(im, "a ratio that is not a constant scalar");
        const double *f = cvals(im, r);
        if (!f) return im->err->code;
        *p = f[0];
    }
    int training = 0;
    if (has_in(im, 2)) {
        val *tm = in_val(im, 2, 1);
        if (!tm) return im->err->code;
        if (tm->kind != VK_CONST || tm->numel != 1) return unsup(im, "a training_mode that is not a constant");
        const double *f = cvals(im, tm);
        if (!f) return im->err->code;
        training = f[0] != 0;
    }
    if (*p == 0) return PS_OK;
    if (training && attr(im, "seed"))
        return unsup(im, "seed %lld: psd draws dropout masks from its own seed per forward", (long long)attr_i(im, "seed", 0));
    if (!(*p > 0 && *p < 1)) return unsup(im, "ratio %g (psd's dropout takes [0, 1))", *p);
    return PS_OK;
}

/* Dropout: psd's Dropout is the identity in eval forwards and drops in training ones, as the exported module
 * did. */
static ps_status h_dropout(imp *im) {
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    double p = 0;
    ps_status rc = dropout_ratio(im, &p);
    if (rc) return rc;
    if (p == 0) return alias_out(im, 0, x);
    if ((rc = need_float(im, x, 0, PS_MAXD, "input"))) return rc;
    char t[64], f[40];
    snprintf(t, sizeof t, "p: %s", float_text(p, f, sizeof f));
    return simple_act(im, "Dropout", t);
}

/* ------------------------------------------------------------ constants */

static ps_status h_constant(imp *im) {
    const ps_onnx_node *n = cur_node(im);
    const ps_onnx_attr *a = attr(im, "value");
    if (n->nout < 1) return bad(im, "no output");
    val *v = vmake(im, n->out[0]);
    if (!v) return oom(im);
    if (a && a->t) {
        set_const_tensor(v, a->t, 0);
        return PS_OK;
    }
    int64_t dims[1];
    double *f;
    if ((a = attr(im, "value_float"))) {
        double x = a->f;
        return const_out(im, 0, 0, dims, &x, 0) ? PS_OK : im->err->code;
    }
    if ((a = attr(im, "value_int"))) {
        double x = (double)a->i;
        return const_out(im, 0, 0, dims, &x, 1) ? PS_OK : im->err->code;
    }
    if ((a = attr(im, "value_floats")) || (a = attr(im, "value_ints"))) {
        int is_int = !strcmp(a->name, "value_ints");
        int cnt = is_int ? a->nints : a->nfloats;
        dims[0] = cnt;
        f = palloc(&im->mem, (size_t)(cnt ? cnt : 1) * sizeof *f);
        if (!f) return oom(im);
        for (int i = 0; i < cnt; i++) f[i] = is_int ? (double)a->ints[i] : a->floats[i];
        return const_out(im, 0, 1, dims, f, is_int) ? PS_OK : im->err->code;
    }
    return unsup(im, "a Constant without value, value_float(s) or value_int(s)");
}

/* Shape of a computed value: its dims, the batch as BATCH_SYM in leading mode. */
static ps_status h_shape(imp *im) {
    static const char *const known[] = {"start", "end", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    int r = x->ndim, s = (int)attr_i(im, "start", 0), e = (int)attr_i(im, "end", r);
    if (s < 0) s += r;
    if (e < 0) e += r;
    if (s < 0) s = 0;
    if (e > r) e = r;
    double f[MAXD];
    int64_t d1[1] = {e > s ? e - s : 0};
    if (x->kind == VK_VIRT && !x->vshape)
        return unsup(im, "the shape of '%s', inside nn.MultiheadAttention where the batch is merged with the heads",
                     x->name);
    for (int i = s; i < e; i++) {
        int64_t d = x->dims[i];
        if (x->kind == VK_VIRT && i == x->bdim) f[i - s] = (double)BATCH_SYM;
        else if (x->kind == VK_DATA && i < im->lead) f[i - s] = (double)BATCH_SYM;
        else if (d < 0) return unsup(im, "the shape of '%s' has a symbolic dimension %d", x->name, i);
        else f[i - s] = (double)d;
    }
    return const_out(im, 0, 1, d1, f, 1) ? PS_OK : im->err->code;
}

static ps_status reshape_target(imp *im, int64_t *shape, int *n);   /* with h_reshape below */

/* v, folded from initializer a by an Unsqueeze or Reshape that only added leading 1s (a prototype layer's
 * self.c.unsqueeze(0), self.c.view(1, R, M)): still that initializer, its values in its order, so it may become
 * a Parameter of the initializer's own name and shape (param_emit, param_node). */
static void init_view(val *v, const val *a) {
    int lead1 = a->init && a->t && !a->tpose && !a->is_int && v->ndim > a->ndim &&
                !memcmp(v->dims + v->ndim - a->ndim, a->dims, (size_t)a->ndim * sizeof *a->dims);
    for (int i = 0; lead1 && i < v->ndim - a->ndim; i++) lead1 = v->dims[i] == 1;
    if (lead1) {
        v->init = 1;
        v->t = a->t;
    }
}

/* A constant op on constants: Cast, Unsqueeze, Squeeze, Gather, Concat,
 * Add, Sub, Mul, Div, Sqrt, Neg - the exporters' shape arithmetic. */
static ps_status fold(imp *im) {
    const ps_onnx_node *n = cur_node(im);
    const char *op = n->op_type;
    val *a = in_val(im, 0, 1);
    if (!a) return im->err->code;
    const double *af = cvals(im, a);
    if (!af) return im->err->code;
    int64_t dims[MAXD];
    if (!strcmp(op, "Cast") || !strcmp(op, "Identity")) {
        int to = (int)attr_i(im, "to", a->is_int ? PS_ONNX_INT64 : PS_ONNX_FLOAT);
        return const_out(im, 0, a->ndim, a->dims, af, dtype_is_int(to) || (!strcmp(op, "Identity") && a->is_int))
            ? PS_OK : im->err->code;
    }
    if (!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze")) {
        int64_t axes[MAXD];
        int na;
        if (moved_ints(im, 1, 13, "axes", "axes", axes, MAXD, &na)) return im->err->code;
        int nd = 0;
        if (!strcmp(op, "Unsqueeze")) {
            int r = a->ndim + (na < 0 ? 0 : na);
            if (na < 0 || r > MAXD) return unsup(im, "Unsqueeze to rank %d", r);
            int is_new[MAXD] = {0};
            for (int i = 0; i < na; i++) {
                int x = norm_axis(im, axes[i], r, "axis");
                if (x < 0) return im->err->code;
                is_new[x] = 1;
            }
            for (int i = 0, k = 0; i < r; i++) dims[nd++] = is_new[i] ? 1 : a->dims[k++];
        } else {
            for (int i = 0; i < a->ndim; i++) {
                int drop = 0;
                for (int j = 0; j < na; j++) drop |= norm_axis(im, axes[j], a->ndim, "axis") == i;
                if (na < 0) drop = a->dims[i] == 1;
                if (!drop) dims[nd++] = a->dims[i];
            }
        }
        val *v = const_out(im, 0, nd, dims, af, a->is_int);
        if (!v) return im->err->code;
        init_view(v, a);
        return PS_OK;
    }
    if (!strcmp(op, "Gather")) {
        val *iv = in_val(im, 1, 1);
        if (!iv) return im->err->code;
        const int64_t *idx = cints(im, iv);
        if (!idx) return im->err->code;
        int ax = norm_axis(im, attr_i(im, "axis", 0), a->ndim, "axis");
        if (ax < 0) return im->err->code;
        int64_t outer = prod(a->dims, ax), inner = prod(a->dims + ax + 1, a->ndim - ax - 1), D = a->dims[ax];
        int nd = 0;
        for (int i = 0; i < ax; i++) dims[nd++] = a->dims[i];
        for (int i = 0; i < iv->ndim && nd < MAXD; i++) dims[nd++] = iv->dims[i];
        for (int i = ax + 1; i < a->ndim && nd < MAXD; i++) dims[nd++] = a->dims[i];
        int64_t cnt = smul(smul(outer, iv->numel), inner);
        if (cnt > FOLD_MAX) return unsup(im, "folding a Gather of %lld values", (long long)cnt);
        double *f = palloc(&im->mem, (size_t)(cnt ? cnt : 1) * sizeof *f);
        if (!f) return oom(im);
        for (int64_t o = 0, k = 0; o < outer; o++)
            for (int64_t j = 0; j < iv->numel; j++) {
                int64_t ix = idx[j] < 0 ? idx[j] + D : idx[j];
                if (ix < 0 || ix >= D) return bad(im, "index %lld outside %lld", (long long)idx[j], (long long)D);
                for (int64_t i = 0; i < inner; i++) f[k++] = af[(o * D + ix) * inner + i];
            }
        return const_out(im, 0, nd, dims, f, a->is_int) ? PS_OK : im->err->code;
    }
    if (!strcmp(op, "ReduceProd")) {   /* of a constant (x.std's count), axes an attribute (before opset 18) */
        int64_t ax[MAXD];
        int na;
        if (moved_ints(im, 1, 18, "axes", "axes", ax, MAXD, &na)) return im->err->code;
        int red[MAXD] = {0}, nd = 0;
        for (int i = 0; i < a->ndim; i++) red[i] = na <= 0;
        for (int i = 0; i < na; i++) {
            int x = norm_axis(im, ax[i], a->ndim, "axes");
            if (x < 0) return im->err->code;
            red[x] = 1;
        }
        const int keep = (int)attr_i(im, "keepdims", 1);
        int64_t outer = 1;
        for (int i = 0; i < a->ndim; i++) {
            if (!red[i] || keep) dims[nd++] = red[i] ? 1 : a->dims[i];
            if (!red[i]) outer *= a->dims[i];
        }
        if (outer != 1) return unsup(im, "folding a ReduceProd that keeps values apart");
        double *f = palloc(&im->mem, sizeof *f);
        if (!f) return oom(im);
        f[0] = 1;
        for (int64_t i = 0; i < a->numel; i++) {
            if (af[i] == (double)BATCH_SYM) return unsup(im, "arithmetic on the batch size");
            f[0] *= af[i];
        }
        return const_out(im, 0, nd, dims, f, a->is_int) ? PS_OK : im->err->code;
    }
    if (!strcmp(op, "Concat")) {
        int ax = norm_axis(im, attr_i(im, "axis", 0), a->ndim ? a->ndim : 1, "axis");
        if (ax < 0) return im->err->code;
        if (a->ndim != 1) return unsup(im, "folding a Concat of rank-%d constants", a->ndim);
        int64_t total = 0;
        for (int k = 0; k < n->nin; k++) {
            val *v = in_val(im, k, 1);
            if (!v) return im->err->code;
            if (v->kind != VK_CONST || v->ndim != 1) return unsup(im, "folding a Concat of '%s'", v->name);
            total += v->numel;
        }
        double *f = palloc(&im->mem, (size_t)(total ? total : 1) * sizeof *f);
        if (!f) return oom(im);
        int64_t o = 0;
        int is_int = 1;
        for (int k = 0; k < n->nin; k++) {
            val *v = in_val(im, k, 1);
            const double *vf = cvals(im, v);
            if (!vf) return im->err->code;
            is_int &= v->is_int;
            for (int64_t i = 0; i < v->numel; i++) f[o++] = vf[i];
        }
        dims[0] = total;
        return const_out(im, 0, 1, dims, f, is_int) ? PS_OK : im->err->code;
    }
    /* the exporters' x.expand(n, -1, -1) / view(-1) shape arithmetic: Reshape of a constant, ConstantOfShape,
     * Equal, Where */
    if (!strcmp(op, "Reshape")) {
        int64_t shape[MAXD];
        int ns;
        ps_status rc = reshape_target(im, shape, &ns);
        if (rc) return rc;
        int64_t known = 1;
        int neg = -1;
        for (int i = 0; i < ns; i++) {
            if (shape[i] == 0 && !attr_i(im, "allowzero", 0)) {
                if (i >= a->ndim) return bad(im, "shape entry %d is 0 but the input has rank %d", i, a->ndim);
                shape[i] = a->dims[i];
            }
            if (shape[i] == -1 && neg < 0) neg = i;
            else if (shape[i] < 0) return bad(im, "shape entry %lld", (long long)shape[i]);
            else known = smul(known, shape[i]);
        }
        if (neg >= 0) {
            if (!known || a->numel % known) return bad(im, "cannot reshape %lld values", (long long)a->numel);
            shape[neg] = a->numel / known;
        } else if (known != a->numel) {
            return bad(im, "cannot reshape %lld values to %lld", (long long)a->numel, (long long)known);
        }
        val *v = const_out(im, 0, ns, shape, af, a->is_int);
        if (!v) return im->err->code;
        init_view(v, a);
        return PS_OK;
    }
    if (!strcmp(op, "ConstantOfShape")) {
        const int64_t *q = cints(im, a);
        if (!q) return im->err->code;
        if (a->ndim != 1 || a->numel > MAXD) return unsup(im, "folding a ConstantOfShape of a rank-%d shape", a->ndim);
        int64_t cnt = 1;
        for (int i = 0; i < a->numel; i++) {
            if (q[i] < 0) return bad(im, "ConstantOfShape to a dimension of %lld", (long long)q[i]);
            dims[i] = q[i];
            cnt = smul(cnt, q[i]);
        }
        if (cnt > FOLD_MAX) return unsup(im, "folding a ConstantOfShape of %lld values", (long long)cnt);
        const ps_onnx_attr *va = attr(im, "value");
        double x = 0;
        int is_int = 0;
        if (va && va->t) {   /* a one-element tensor; float 0 without it */
            ps_err e = {0};
            is_int = dtype_is_int(va->t->dtype);
            if (is_int) {
                int64_t iv;
                if (va->t->numel != 1 || ps_onnx_tensor_int64s(va->t, &iv, &e)) return bad(im, "its value");
                x = (double)iv;
            } else {
                float fv;
                if (va->t->numel != 1 || ps_onnx_tensor_floats(va->t, &fv, &e)) return bad(im, "its value");
                x = fv;
            }
        }
        double *f = palloc(&im->mem, (size_t)(cnt ? cnt : 1) * sizeof *f);
        if (!f) return oom(im);
        for (int64_t i = 0; i < cnt; i++) f[i] = x;
        return const_out(im, 0, (int)a->numel, dims, f, is_int) ? PS_OK : im->err->code;
    }
    if (!strcmp(op, "Where")) {   /* cond ? b : c, each a scalar or of one shape */
        val *b = in_val(im, 1, 1), *c = in_val(im, 2, 1);
        if (!b || !c) return im->err->code;
        const double *bf = cvals(im, b), *cf = cvals(im, c);
        if (!bf || !cf) return im->err->code;
        const val *big = a->numel >= b->numel ? a : b;
        big = big->numel >= c->numel ? big : c;
        for (const val *v = a; v; v = v == a ? b : v == b ? c : NULL)
            if (v->numel != 1 && (v->ndim != big->ndim || memcmp(v->dims, big->dims, (size_t)big->ndim * 8)))
                return unsup(im, "folding a Where of shapes that broadcast other than by a scalar");
        double *f = palloc(&im->mem, (size_t)(big->numel ? big->numel : 1) * sizeof *f);
        if (!f) return oom(im);
        for (int64_t i = 0; i < big->numel; i++)
            f[i] = af[a->numel == 1 ? 0 : i] != 0 ? bf[b->numel == 1 ? 0 : i] : cf[c->numel == 1 ? 0 : i];
        return const_out(im, 0, big->ndim, big->dims, f, b->is_int && c->is_int) ? PS_OK : im->err->code;
    }
    if (!strcmp(op, "Sqrt") || !strcmp(op, "Neg")) {
        double *f = palloc(&im->mem, (size_t)(a->numel ? a->numel : 1) * sizeof *f);
        if (!f) return oom(im);
        for (int64_t i = 0; i < a->numel; i++) f[i] = op[0] == 'S' ? sqrt(af[i]) : -af[i];
        return const_out(im, 0, a->ndim, a->dims, f, a->is_int && op[0] == 'N') ? PS_OK : im->err->code;
    }
    /* binary, numpy broadcasting of a scalar or equal shapes */
    val *b = in_val(im, 1, 1);
    if (!b) return im->err->code;
    const double *bf = cvals(im, b);
    if (!bf) return im->err->code;
    if (!(a->numel == 1 || b->numel == 1 || (a->ndim == b->ndim && !memcmp(a->dims, b->dims, (size_t)a->ndim * 8))))
        return unsup(im, "folding %s of shapes that broadcast other than by a scalar", op);
    /* the larger, or of one element each the higher rank (a rank-0 Mul minus a rank-1 Gather is rank 1:
     * PyTorch's reflect padding's pads arithmetic) */
    const val *big = a->numel > b->numel || (a->numel == b->numel && a->ndim >= b->ndim) ? a : b;
    double *f = palloc(&im->mem, (size_t)(big->numel ? big->numel : 1) * sizeof *f);
    if (!f) return oom(im);
    for (int64_t i = 0; i < big->numel; i++) {
        double x = af[a->numel == 1 ? 0 : i], y = bf[b->numel == 1 ? 0 : i];
        if (!strcmp(op, "Equal")) {   /* the batch symbol equals itself only (a batch is at least 1) */
            f[i] = x == y;
            continue;
        }
        if (x == (double)BATCH_SYM || y == (double)BATCH_SYM) return unsup(im, "arithmetic on the batch size");
        switch (op[0]) {
        case 'A': f[i] = x + y; break;
        case 'S': f[i] = x - y; break;
        case 'M': f[i] = x * y; break;
        default:
            if (a->is_int && b->is_int) {
                if (y == 0) return bad(im, "integer division by zero");
                f[i] = (double)((int64_t)x / (int64_t)y);
            } else {
                f[i] = x / y;
            }
        }
    }
    return const_out(im, 0, big->ndim, big->dims, f, (a->is_int && b->is_int) || !strcmp(op, "Equal")) ? PS_OK
                                                                                                    : im->err->code;
}

static int all_const(imp *im) {
    const ps_onnx_node *n = cur_node(im);
    for (int k = 0; k < n->nin; k++) {
        if (!n->in[k][0]) continue;
        val *v = vget(im, n->in[k]);
        if (!v || v->kind != VK_CONST) return 0;
    }
    return n->nin > 0;
}

/* --------------------------------------------------------- Parameter */

/* Parameter node pn holding initializer `name` under that state_dict name: the node named after its
 * prefix and the parameter after its last segment (encoder.pos_embedding: node encoder, `parameter:
 * pos_embedding`), a tensor at the top of the module after itself (class_token: `parameter: null`, suffix
 * ""). A name that is no module path (an eval export's onnx::Add_5), or a node name already taken, leaves
 * the node its own name and the suffix 'weight'. The suffix goes into sfx (24 bytes). */
static void param_name(imp *im, int pn, const char *name, char *sfx) {
    snprintf(sfx, 24, "weight");
    const char *dot = strrchr(name, '.'), *last = dot ? dot + 1 : "";
    size_t pl = dot ? (size_t)(dot - name) : strlen(name);
    int ok = pl > 0 && pl <= NAME_MAX_ && strlen(last) < 24 && (!dot || *last) &&
             !isdigit((unsigned char)name[0]);
    for (const char *q = last; *q && ok; q++) ok = valid_char(*q);
    if (!ok) return;
    char pre[NAME_MAX_ + 1], clean[NAME_MAX_ + 1], own[NAME_MAX_ + 1];
    memcpy(pre, name, pl);
    pre[pl] = 0;
    sanitize(pre, clean, sizeof clean);
    snprintf(own, sizeof own, "%s", im->pn[pn].name);
    im->pn[pn].name[0] = 0;   /* not its own rival */
    if (strcmp(clean, pre) || name_taken(im, pre)) {
        snprintf(im->pn[pn].name, sizeof im->pn[pn].name, "%s", own);
        return;
    }
    snprintf(im->pn[pn].name, sizeof im->pn[pn].name, "%s", pre);
    snprintf(sfx, 24, "%s", last);
}

/* A Parameter node reading psd node `in` (only its batch size) that holds initializer c (shape: its dims,
 * leading 1s facing the batch) broadcast to the per-sample dims ed[ne]. */
static int param_emit(imp *im, val *c, int in, const int64_t *cd, int cn, const int64_t *ed, int ne,
                      ps_status *rc) {
    /* a Transpose of a 2-D initializer read as a value (h - self.c.t()): the Parameter holds the initializer as
     * it is stored (its state_dict name and shape, so a checkpoint loads back into the module), expanded to the
     * swapped shape, and a Permute swaps its last two dims */
    const int tp = c->tpose && c->init && c->t && cn == 2 && ne >= 2;
    int64_t cs[MAXD], es[MAXD];
    if (tp) {
        memcpy(cs, cd, (size_t)cn * sizeof *cd);
        memcpy(es, ed, (size_t)ne * sizeof *ed);
        cs[0] = cd[1], cs[1] = cd[0];
        es[ne - 2] = ed[ne - 1], es[ne - 1] = ed[ne - 2];
        cd = cs, ed = es;
    }
    /* an Unsqueeze of an initializer (fold) or its Transpose: named by the initializer */
    const char *iname = c->init && c->t && c->t->name[0] && (c->t->ndim < c->ndim || tp) ? c->t->name : c->name;
    int p = emit(im, "Parameter", iname, "weight", NULL, 1, &in);
    if (p < 0) {
        *rc = oom(im);
        return -1;
    }
    char b1[128], b2[128], sfx[24];
    param_name(im, p, iname, sfx);
    add_attr(im, p, "shape: %s", dims_text(cd, cn, b1, sizeof b1));
    if (ne != cn || memcmp(cd, ed, (size_t)cn * sizeof *cd))
        add_attr(im, p, "expand: %s", dims_text(ed, ne ? ne : 1, b2, sizeof b2));
    if (!sfx[0]) add_attr(im, p, "parameter: null");
    else if (strcmp(sfx, "weight")) add_attr(im, p, "parameter: %s", sfx);
    if ((*rc = bind(im, p, sfx, c, tp, 0))) return -1;   /* tp ^ c->tpose: as stored */
    if (!tp) return p;
    int64_t dims[PS_MAXD + 1];
    for (int k = 0; k <= ne; k++) dims[k] = k;   /* the batch first, then the per-sample dims, the last two swapped */
    dims[ne - 1] = ne, dims[ne] = ne - 1;
    int pp = emit(im, "Permute", NULL, NULL, "t", 1, &p);
    if (pp < 0) {
        *rc = oom(im);
        return -1;
    }
    add_attr(im, pp, "dims: %s", dims_text(dims, ne + 1, b1, sizeof b1));
    return pp;
}

/* A Parameter node: constant c (an initializer) broadcast to the per-sample
 * dims of partner (a computed value), for Add and Concat. grow: c may be the
 * larger of the two along a dim where partner's is 1 (a prototype layer's
 * h.unsqueeze(1) - self.c.unsqueeze(0): (1, M) against (R, M)); the Parameter
 * and out_dims are then the broadcast shape, for a Sub / Add / Div that
 * broadcasts partner. */
static int param_node(imp *im, val *c, const val *partner, int64_t *out_dims, int *out_nd, int grow, ps_status *rc) {
    int64_t cd[MAXD];
    int cn = c->ndim;
    memcpy(cd, c->dims, sizeof cd);
    int off = im->lead;
    /* the constant must not span the leading (batch) dims */
    if (off && cn == partner->ndim) {
        for (int i = 0; i < off; i++)
            if (cd[i] != 1) {
                *rc = along_batch(im, "a constant operand");
                return -1;
            }
        memmove(cd, cd + off, (size_t)(cn - off) * sizeof *cd);
        cn -= off;
    }
    int64_t pd[MAXD];
    int pn_nd = partner->ndim - off;
    for (int i = 0; i < pn_nd; i++) pd[i] = partner->dims[off + i];
    if (cn > pn_nd) {
        *rc = unsup(im, "constant '%s' has more dimensions than the value it meets", c->name);
        return -1;
    }
    if (cn == 0) { cd[0] = 1; cn = 1; }
    if (cn > PS_MAXD || pn_nd > PS_MAXD) {
        *rc = unsup(im, "more than %d dimensions per sample", PS_MAXD);
        return -1;
    }
    for (int i = 0; i < cn; i++) {
        int64_t x = cd[cn - 1 - i], y = pn_nd ? pd[pn_nd - 1 - i] : 1;
        if (x != y && x != 1 && !(grow && y == 1 && pn_nd)) {
            *rc = bad(im, "constant '%s' does not broadcast to the per-sample shape of '%s'", c->name, partner->name);
            return -1;
        }
        if (x != y && x != 1) pd[pn_nd - 1 - i] = x;   /* grow: the broadcast shape */
    }
    /* the initializer's own shape where it has the partner's rank (leading 1s facing the batch: a checkpoint
     * loads back into the module, encoder.pos_embedding (1, L, E)) */
    const int full = off && c->ndim == partner->ndim && c->ndim <= PS_MAXD + 1;
    const int64_t *sd = full ? c->dims : cd;
    int sn = full ? c->ndim : cn;
    if (c->init && c->t && c->t->ndim < c->ndim && c->t->ndim >= 1 && c->t->ndim <= cn) {
        sd = c->t->dims;   /* an Unsqueeze of the initializer (fold): its own shape, the 1s added facing the batch */
        sn = c->t->ndim;
    }
    int p = param_emit(im, c, partner->node, sd, sn, pd, pn_nd, rc);
    if (p < 0) return -1;
    memcpy(out_dims, pd, sizeof pd);
    *out_nd = pn_nd;
    return p;
}

/* Expand of an initializer over the batch (vit's class_token.expand(n, -1, -1): (1, 1, E) to (N, 1, E)): a
 * Parameter of the initializer's shape (its leading 1 facing the batch) broadcast to the output's per-sample
 * dims, reading the stage input for the batch size only. */
static ps_status h_expand(imp *im) {
    val *c = in_val(im, 0, 1), *s = in_val(im, 1, 1);
    if (!c || !s) return im->err->code;
    if (s->kind != VK_CONST) return unsup(im, "a shape computed from the input's values");
    if (c->kind != VK_CONST || !c->init || !c->t)
        return unsup(im, "Expand of %s (psd expands an initializer over the batch: a Parameter)",
                     c->kind == VK_DATA ? "a computed value" : "a constant that is not an initializer");
    const int64_t *q = cints(im, s);
    if (!q) return im->err->code;
    if (s->ndim != 1 || s->numel > MAXD || s->numel < c->ndim)
        return unsup(im, "Expand to a shape of %lld dimensions from '%s' of %d", (long long)s->numel, c->name,
                     c->ndim);
    const int r = (int)s->numel, off = r - c->ndim;
    int64_t od[MAXD];
    for (int i = 0; i < r; i++) {   /* numpy's broadcast of the initializer's dims and the shape */
        int64_t a = i < off ? 1 : c->dims[i - off], b = q[i];
        if (i == 0 && im->lead && (b == BATCH_SYM || b == im->batch)) b = im->batch;
        else if (b < 1) return bad(im, "shape entry %d is %lld", i, (long long)q[i]);
        if (a != b && a != 1 && b != 1)
            return bad(im, "'%s' dimension %d (%lld) does not broadcast to the shape's %lld", c->name, i - off,
                       (long long)a, (long long)b);
        od[i] = a == 1 ? b : a;
    }
    if (im->lead && (r < 1 || (off == 0 && c->dims[0] != 1) || (od[0] != im->batch && !(q[0] == BATCH_SYM))))
        return unsup(im, "Expand of '%s' whose first dimension is not the batch (psd expands an initializer over "
                     "the batch: the first entry %lld, the batch %lld)", c->name, (long long)q[0],
                     (long long)im->batch);
    if (r - im->lead > PS_MAXD || c->ndim > PS_MAXD + 1) return unsup(im, "more than %d dimensions per sample", PS_MAXD);
    if (c->bound) return unsup(im, "initializer '%s' is read by two nodes: psd gives every node its own parameters",
                                c->name);
    int64_t cd[MAXD];
    int cn = c->ndim;
    memcpy(cd, c->dims, sizeof cd);
    if (!cn) { cd[0] = 1; cn = 1; }
    ps_status rc = PS_OK;
    int p = param_emit(im, c, -1, cd, cn, od + im->lead, r - im->lead, &rc);
    if (p < 0) return rc;
    int64_t dd[MAXD];
    memcpy(dd, od, sizeof dd);
    if (im->lead) dd[0] = im->input->dims[0];
    return data_out(im, 0, p, PS_ONNX_FLOAT, r, dd) ? PS_OK : im->err->code;
}

/* ------------------------------------------------------------ Add */

/* Fold a bias-shaped initializer into the Linear / Conv2d that computed x
 * (written with bias: false and read only here). */
static int fold_bias(imp *im, const val *x, val *c) {
    int ob;
    if (x->kind != VK_DATA || x->node < 0 || !c->init || x->uses != 1) return 0;
    if (c->bound && (!c->t || lent_by(im, c->t, &ob) < 0)) return 0;   /* bound whole: this Linear shares it */
    pnode *p = &im->pn[x->node];
    if (!p->has_bias_attr || p->readers) return 0;
    int64_t want = x->dims[x->ndim - 1];
    int ok;
    if (!strcmp(p->kind, "Linear")) {
        ok = c->numel == want && (c->ndim == 1 || (c->ndim == 2 && c->dims[0] == 1));
    } else {   /* Conv2d: (C, 1, 1) or (1, C, 1, 1) */
        want = x->dims[x->ndim - 3];
        ok = c->numel == want && c->ndim >= 3 && c->dims[c->ndim - 1] == 1 && c->dims[c->ndim - 2] == 1;
    }
    if (!ok) return 0;
    /* named after the bias's state_dict prefix when the weight gave it none (an eval export's
     * onnx::MatMul_208 with decoder.bias: node decoder) */
    size_t bl = strlen(c->name);
    if (bl > 5 && !strcmp(c->name + bl - 5, ".bias") && bl - 5 <= NAME_MAX_ && p->nb == 1 &&
        strncmp(p->b[0].t->name, c->name, bl - 4)) {
        char pre[NAME_MAX_ + 1], clean[NAME_MAX_ + 1];
        memcpy(pre, c->name, bl - 5);
        pre[bl - 5] = 0;
        sanitize(pre, clean, sizeof clean);
        const char *wn = p->b[0].t->name;
        size_t wl = strlen(wn);
        int weight_named = wl > 7 && !strcmp(wn + wl - 7, ".weight");   /* keep a state_dict name it has */
        /* a weight another node holds (tied: tie:) names that node, not this one: the bias's prefix does */
        if (!strcmp(clean, pre) && (!weight_named || p->b[0].tie_pn) && !name_taken(im, pre))
            snprintf(p->name, sizeof p->name, "%s", pre);
    }
    /* drop ", bias: false" */
    char *s = strstr(p->attrs, ", bias: false");
    if (s) memmove(s, s + 13, strlen(s + 13) + 1);
    p->has_bias_attr = 0;
    if (bind(im, x->node, "bias", c, 0, 0)) return -1;
    return 1;
}

static int scalar_const(imp *im, val *c, double *v);
static ps_status add_const(imp *im, val *x, double value);

static ps_status bcast_pair(imp *im, val *a, val *b, const char *kind, const char *verb);

/* Max / Min of a computed value and a number (F.cosine_similarity's clamp_min(w1 * w2, eps^2) exports as
 * Max): the clamp (clamp_of); of two computed values (torch.maximum, torch.max(a, b)): Maximum / Minimum,
 * broadcast as Div's; of constants folded. */
static ps_status h_minmax(imp *im) {
    if (all_const(im)) return fold(im);
    const int is_max = !strcmp(cur_node(im)->op_type, "Max");
    if (cur_node(im)->nin == 1) {   /* of one value: that value */
        val *x = in_val(im, 0, 1);
        return x ? alias_out(im, 0, x) : im->err->code;
    }
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    if (cur_node(im)->nin == 2 && a->kind == VK_DATA && b->kind == VK_DATA)
        return bcast_pair(im, a, b, is_max ? "Maximum" : "Minimum", is_max ? "the maximum of" : "the minimum of");
    if (a->kind != VK_DATA) { val *t = a; a = b; b = t; }
    double c;
    if (cur_node(im)->nin != 2 || a->kind != VK_DATA || !scalar_const(im, b, &c))
        return unsup(im, "%s of other than a computed value and a number (psd clamps by numbers)",
                     cur_node(im)->op_type);
    return is_max ? clamp_of(im, a, c, FLT_MAX) : clamp_of(im, a, -FLT_MAX, c);
}

/* kind (Add, Sub, Mul, Div) of two computed float values that broadcast as psd's do (numpy's rule: one
 * rank, each pair of dims equal or one of them 1, the leading batch dims equal); verb names the op in the
 * refusal of others. */
static ps_status bcast_pair(imp *im, val *a, val *b, const char *kind, const char *verb) {
    ps_status rc = need_float(im, a, 0, PS_MAXD, "input");
    if (rc || (rc = need_float(im, b, 0, PS_MAXD, "input"))) return rc;
    if (a->ndim != b->ndim)
        return unsup(im, "%s '%s' and '%s' of ranks %d and %d (psd's %s broadcasts computed values of one rank)",
                     verb, a->name, b->name, a->ndim, b->ndim, kind);
    int64_t od[MAXD];
    for (int k = 0; k < a->ndim; k++) {
        if (a->dims[k] != b->dims[k] && k < im->lead) return along_batch(im, "a broadcast");
        if (a->dims[k] != b->dims[k] && a->dims[k] != 1 && b->dims[k] != 1)
            return unsup(im, "%s '%s' and '%s': dimension %d is %lld in one and %lld in the other (psd's %s "
                         "broadcasts dimensions that are equal or 1)", verb, a->name, b->name, k,
                         (long long)a->dims[k], (long long)b->dims[k], kind);
        od[k] = a->dims[k] == 1 ? b->dims[k] : a->dims[k];
    }
    int ins[2] = {a->node, b->node};
    int s = emit(im, kind, NULL, NULL, NULL, 2, ins);
    if (s < 0) return oom(im);
    return data_out(im, 0, s, PS_ONNX_FLOAT, a->ndim, od) ? PS_OK : im->err->code;
}

/* kind (Add, Sub, Div) of computed value x and constant c (an initializer: a learned tensor, x + self.p,
 * x / self.scale), c a Parameter node broadcast to x's per-sample dims; c_first: c is the first operand. */
static ps_status with_param(imp *im, val *x, val *c, const char *kind, int c_first) {
    ps_status rc = need_float(im, x, 0, PS_MAXD, "input");
    if (rc) return rc;
    int64_t pd[MAXD];
    int pnd;
    int p = param_node(im, c, x, pd, &pnd, 1, &rc);
    if (p < 0) return rc;
    int ins[2] = {c_first ? p : x->node, c_first ? x->node : p};
    int s = emit(im, kind, NULL, NULL, NULL, 2, ins);
    if (s < 0) return oom(im);
    int64_t od[MAXD];   /* x's dims, grown where the constant broadcasts it */
    memcpy(od, x->dims, sizeof od);
    for (int i = 0; i < pnd; i++) od[x->ndim - pnd + i] = pd[i];
    return data_out(im, 0, s, PS_ONNX_FLOAT, x->ndim, od) ? PS_OK : im->err->code;
}

static ps_status h_add(imp *im) {
    if (all_const(im)) return fold(im);
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    if (a->kind == VK_CONST) { val *t = a; a = b; b = t; }
    double sc;
    if (a->kind == VK_DATA && scalar_const(im, b, &sc)) return sc == 0 ? alias_out(im, 0, a) : add_const(im, a, sc);
    if (b->kind == VK_CONST) {
        ps_status rc = need_float(im, a, 0, PS_MAXD, "input");
        if (rc) return rc;
        int f = fold_bias(im, a, b);
        if (f < 0) return im->err->code;
        if (f) return alias_out(im, 0, a);
        return with_param(im, a, b, "Add", 0);
    }
    return bcast_pair(im, a, b, "Add", "adding");
}

/* ---- attention written by hand: scalar factors, products of two values, Split ---- */

/* c is a number of the graph (a Constant or folded shape arithmetic, not an initializer: those are learned,
 * Scale) read as one value: *v. */
static int scalar_const(imp *im, val *c, double *v) {
    if (c->kind != VK_CONST || c->init || c->numel != 1) return 0;
    const double *f = cvals(im, c);
    if (!f || !isfinite(f[0]) || f[0] == (double)BATCH_SYM) return 0;
    *v = f[0];
    return 1;
}

/* x * value or x + value: a MulConstant or AddConstant node of kind. */
static ps_status const_node(imp *im, val *x, const char *kind, double value) {
    ps_status rc = need_float(im, x, 0, PS_MAXD, "input");
    if (rc) return rc;
    int xin = x->node;
    int pn = emit(im, kind, NULL, NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    char b[64];
    add_attr(im, pn, "value: %s", float_text(value, b, sizeof b));
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

/* x * value (attention's scores / sqrt(d) is a Div by a Constant) */
static ps_status mul_const(imp *im, val *x, double value) { return const_node(im, x, "MulConstant", value); }

/* ---- elementwise math (users' own layers: x + c, a - b, c - x, x ** c, exp, log, ...) ---- */

/* x + value */
static ps_status add_const(imp *im, val *x, double value) { return const_node(im, x, "AddConstant", value); }

/* A MulConstant or AddConstant (kind) of value reading psd node in, suffix in its name; the new node, or -1
 * (out of memory: err set). */
static int emit_value(imp *im, const char *kind, int in, const char *suffix, double value) {
    int pn = emit(im, kind, NULL, NULL, suffix, 1, &in);
    if (pn < 0) return oom(im), -1;
    char b[64];
    add_attr(im, pn, "value: %s", float_text(value, b, sizeof b));
    return pn;
}

/* An elementwise kind with one attribute line (or none) on x, then (c != NULL) x * c[0] + c[1] as
 * MulConstant and AddConstant nodes where those are not 1 and 0: c - x, c / x. */
static ps_status math_chain(imp *im, val *x, const char *kind, const char *attrs_text, const double *c) {
    ps_status rc = need_float(im, x, 0, PS_MAXD, "input");
    if (rc) return rc;
    int in = x->node;
    if (kind) {
        if ((in = emit(im, kind, NULL, NULL, NULL, 1, &in)) < 0) return oom(im);
        if (attrs_text) add_attr(im, in, "%s", attrs_text);
    }
    if (c && c[0] != 1.0 && (in = emit_value(im, "MulConstant", in, "mul", c[0])) < 0) return im->err->code;
    if (c && c[1] != 0.0 && (in = emit_value(im, "AddConstant", in, "add", c[1])) < 0) return im->err->code;
    if (in == x->node) return alias_out(im, 0, x);
    return data_out(im, 0, in, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

/* A unary op of a computed value; of constants, refused (psd folds Sqrt and Neg only). */
static ps_status math_unary(imp *im, const char *kind, const char *attrs_text) {
    if (all_const(im)) return unsup(im, "%s of constants (psd does not fold it)", cur_node(im)->op_type);
    return simple_act(im, kind, attrs_text);
}

static ps_status h_exp(imp *im) { return math_unary(im, "Exp", NULL); }
static ps_status h_sin(imp *im) { return math_unary(im, "Sin", NULL); }
static ps_status h_cos(imp *im) { return math_unary(im, "Cos", NULL); }
static ps_status h_erf(imp *im) { return math_unary(im, "Erf", NULL); }   /* outside a GELU psd recognises */
static ps_status h_sign(imp *im) { return math_unary(im, "Sign", NULL); }
static ps_status h_log(imp *im) { return math_unary(im, "Log", NULL); }
static ps_status h_abs(imp *im) { return math_unary(im, "Abs", NULL); }
static ps_status h_reciprocal(imp *im) { return math_unary(im, "Pow", "exponent: -1.0"); }

/* RandomNormalLike: standard normal noise of a computed value's shape (a VAE's eps) as psd's RandnLike, drawn on
 * the dropout stream; mean and scale as AddConstant / MulConstant after it. */
static ps_status h_random_normal_like(imp *im) {
    static const char *const known[] = {"dtype", "mean", "scale", "seed", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (attr(im, "seed"))
        return unsup(im, "seed %g: psd draws the noise from its own seed per forward", attr_f(im, "seed", 0));
    if (attr(im, "dtype") && attr_i(im, "dtype", PS_ONNX_FLOAT) != PS_ONNX_FLOAT)
        return unsup(im, "dtype %s (psd draws float32 noise)", ps_onnx_dtype_name((int)attr_i(im, "dtype", 0)));
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if (x->kind != VK_DATA)
        return unsup(im, "noise shaped like a constant: psd draws it like a computed value (torch.randn_like(x))");
    double c[2] = {attr_f(im, "scale", 1.0f), attr_f(im, "mean", 0.0f)};
    return math_chain(im, x, "RandnLike", NULL, c);
}

static ps_status h_sqrt(imp *im) {
    if (all_const(im)) return fold(im);
    return simple_act(im, "Sqrt", NULL);
}

static ps_status h_neg(imp *im) {
    if (all_const(im)) return fold(im);
    val *x = in_val(im, 0, 1);
    return x ? mul_const(im, x, -1.0) : im->err->code;
}

static ps_status h_elu(imp *im) { return alpha_act(im, 1.0f, "ELU", "alpha"); }

/* Selu with ONNX's default alpha and gamma (PyTorch's constants, as float) */
static ps_status h_selu(imp *im) {
    static const char *const known[] = {"alpha", "gamma", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    const float a = attr_f(im, "alpha", 1.67326319217681884765625f), g = attr_f(im, "gamma", 1.05070102214813232421875f);
    if (a != 1.67326319217681884765625f || g != 1.05070102214813232421875f)
        return unsup(im, "alpha %g, gamma %g: psd's SELU is PyTorch's (ONNX's defaults)", a, g);
    return math_unary(im, "SELU", NULL);
}

/* Softplus: log(exp(x) + 1), PyTorch's at beta 1 (its threshold 20 is where they meet in float32; PyTorch
 * exports beta != 1 as Mul, Softplus, Div and drops the threshold) */
static ps_status h_softplus(imp *im) { return math_unary(im, "Softplus", NULL); }

/* Pow(x, exponent) with a constant scalar exponent */
static ps_status h_pow(imp *im) {
    if (all_const(im)) return unsup(im, "Pow of constants (psd does not fold it)");
    val *x = in_val(im, 0, 1), *e = in_val(im, 1, 1);
    if (!x || !e) return im->err->code;
    double c;
    if (x->kind != VK_DATA || !scalar_const(im, e, &c))
        return unsup(im, "Pow of a computed value by a constant number only (x ** 2)");
    char t[64], f[40];
    snprintf(t, sizeof t, "exponent: %s", float_text(c, f, sizeof f));
    return math_chain(im, x, c == 1.0 ? NULL : "Pow", t, NULL);
}

/* Sub: a - b of computed values (Sub, broadcast), of a computed value and an initializer (with_param), x - c (AddConstant -c), c - x (MulConstant -1, AddConstant c) */
static ps_status h_sub(imp *im) {
    if (all_const(im)) return fold(im);
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    double c;
    if (a->kind == VK_DATA && scalar_const(im, b, &c)) return c == 0 ? alias_out(im, 0, a) : add_const(im, a, -c);
    if (b->kind == VK_DATA && scalar_const(im, a, &c)) {
        const double k[2] = {-1.0, c};
        return math_chain(im, b, NULL, NULL, k);
    }
    if (a->kind == VK_DATA && b->kind == VK_CONST) return with_param(im, a, b, "Sub", 0);
    if (b->kind == VK_DATA && a->kind == VK_CONST) return with_param(im, b, a, "Sub", 1);
    return bcast_pair(im, a, b, "Sub", "subtracting");
}

/* 1 when initializer `name` is a state_dict name (module path, then a word) whose last word is not
 * "weight": a raw parameter of a custom layer (inp.W, W_q), not nn.Linear's weight nor an eval export's
 * onnx::MatMul_84. */
static int custom_param_name(const char *name) {
    const char *dot = strrchr(name, '.'), *last = dot ? dot + 1 : name;
    if (!*last || strstr(name, "::") || !strcmp(last, "weight") || isdigit((unsigned char)name[0])) return 0;
    for (const char *q = name; *q; q++)
        if (!valid_char(*q) && *q != '.') return 0;
    return 1;
}

/* MatMul of two computed values, leading dims broadcast (numpy's rule; the batch faces the batch), or of a
 * computed value and a constant that is no Linear's weight (a 2-D right operand is one): psd's MatMul with
 * that constant as its parameter (`parameter`, `shape`, `parameter_side`; named as param_name says), read
 * once for every sample, its leading dims right-aligned against the sample's, 1s facing the batch. */
static ps_status matmul_values(imp *im, val *a, val *b) {
    ps_status rc = PS_OK;
    const val *data = a->kind == VK_DATA ? a : b;
    val *c = a->kind == VK_DATA ? (b->kind == VK_DATA ? NULL : b) : a;
    if ((rc = need_float(im, data, 1, PS_MAXD, "input"))) return rc;
    const int nd = data->ndim, lead = im->lead;
    char b1[128], b2[128];
    int64_t ad[MAXD], bd[MAXD], od[MAXD];
    for (int i = 0; i < nd; i++) {   /* right-aligned, a constant's missing dims 1 */
        int ja = i - (nd - a->ndim), jb = i - (nd - b->ndim);
        ad[i] = ja >= 0 ? a->dims[ja] : 1;
        bd[i] = jb >= 0 ? b->dims[jb] : 1;
    }
    const int vec = c == b && nd - lead == 1 && c->ndim == 2;   /* x (N, k) @ W (k, n): a row per sample */
    int ok = vec || (nd - lead >= 2 && (c ? c->ndim >= 2 && c->ndim <= nd : a->ndim == b->ndim));
    for (int i = 0; c && !vec && i < lead; i++)   /* a constant's dims facing the batch: 1s, or one sample */
        if ((c == a ? ad[i] : bd[i]) != 1 && c->ndim == nd) return along_batch(im, "a constant operand of MatMul");
    for (int i = 0; ok && i < nd - 2; i++) {
        ok = ad[i] == bd[i] || ad[i] == 1 || bd[i] == 1 || i < lead;
        od[i] = i < lead ? data->dims[i] : ad[i] > bd[i] ? ad[i] : bd[i];
    }
    if (vec) {
        memcpy(od, data->dims, sizeof od);
        od[nd - 1] = b->dims[1];
    }
    if (!ok || (vec ? a->dims[nd - 1] != b->dims[0] : ad[nd - 1] != bd[nd - 2]))
        return unsup(im, "MatMul of '%s' %s and '%s' %s: psd's MatMul takes stacks of matrices (two computed ones of "
                     "one rank; a constant of 2 or more dims, its leading ones 1 against the batch) whose leading "
                     "dimensions broadcast and whose inner ones match", a->name,
                     dims_text(a->dims, a->ndim, b1, sizeof b1), b->name, dims_text(b->dims, b->ndim, b2, sizeof b2));
    if (!vec) {
        od[nd - 2] = ad[nd - 2];
        od[nd - 1] = bd[nd - 1];
    }
    int pn;
    if (c) {
        int in = data->node;
        if ((pn = emit(im, "MatMul", c->name, "weight", NULL, 1, &in)) < 0) return oom(im);
        /* named by the initializer's whole state_dict name, `parameter: null` (a module's W_q, W_k and W_v are
         * three nodes; its b for an Add stays free); else as param_name says */
        char sfx[24];
        const char *iname = c->t && c->t->name[0] ? c->t->name : c->name;
        im->pn[pn].name[0] = 0;
        if (custom_param_name(iname) && strlen(iname) <= NAME_MAX_ && !name_taken(im, iname)) {
            snprintf(im->pn[pn].name, sizeof im->pn[pn].name, "%s", iname);
            sfx[0] = 0;
        } else {
            pick_name(im, iname, "weight", NULL, im->pn[pn].name);
            param_name(im, pn, iname, sfx);
        }
        if (!sfx[0]) add_attr(im, pn, "parameter: null");
        else add_attr(im, pn, "parameter: %s", sfx);
        int64_t cd[MAXD];   /* a Transpose of the initializer (x @ W.t()): its own dims, read transposed */
        memcpy(cd, c->dims, sizeof cd);
        if (c->tpose) {
            cd[c->ndim - 2] = c->dims[c->ndim - 1];
            cd[c->ndim - 1] = c->dims[c->ndim - 2];
            add_attr(im, pn, c == a ? "transpose_a: true" : "transpose_b: true");
        }
        add_attr(im, pn, "shape: %s", dims_text(cd, c->ndim, b1, sizeof b1));
        if (c == a) add_attr(im, pn, "parameter_side: left");
        if ((rc = bind(im, pn, sfx, c, c->tpose, 0))) return rc;
    } else {
        int ins[2] = {a->node, b->node};
        if ((pn = emit(im, "MatMul", NULL, NULL, NULL, 2, ins)) < 0) return oom(im);
    }
    return data_out(im, 0, pn, PS_ONNX_FLOAT, nd, od) ? PS_OK : im->err->code;
}

/* Einsum of two computed values that is a batched matrix product (attention written with torch.einsum:
 * "bhqd,bhkd->bhqk", "bhqk,bhkd->bhqd", "...qd,...kd->...kq"), as psd-export writes it: operands and output of
 * one rank (3 or more, the batch first), the same leading subscripts in all three, the last two of each operand
 * one kept and one summed over - a MatMul with transpose_a / transpose_b (an output transposed: B^T A^T).
 * Anything else refused, naming the equation. */
static ps_status h_einsum(imp *im) {
    static const char *const known[] = {"equation", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    const ps_onnx_node *nd = cur_node(im);
    const char *eq = attr_s(im, "equation", NULL);
    if (!eq) return bad(im, "no equation");
    if (nd->nin != 2) return unsup(im, "Einsum of %d operands (psd writes einsum of two as a MatMul)", nd->nin);
    val *x[2] = {in_val(im, 0, 1), in_val(im, 1, 1)};
    if (!x[0] || !x[1]) return im->err->code;
    for (int k = 0; k < 2; k++) {
        if (x[k]->kind != VK_DATA)
            return unsup(im, "Einsum '%s' of a constant operand (psd writes einsum of two computed values as a "
                         "MatMul; x @ W is a MatMul export)", eq);
        if ((rc = need_float(im, x[k], 1, PS_MAXD, "operand"))) return rc;
    }
    /* the equation without spaces, each "..." as the spare capital letters it stands for */
    char t[3][MAXD + 1];
    int tl[3] = {0, 0, 0}, part = 0, ell[3] = {-1, -1, -1};
    for (const char *q = eq; *q; q++) {
        if (*q == ' ') continue;
        if (*q == ',' && part == 0) { part = 1; continue; }
        if (q[0] == '-' && q[1] == '>' && part == 1) { part = 2; q++; continue; }
        if (q[0] == '.' && q[1] == '.' && q[2] == '.' && ell[part] < 0) { ell[part] = tl[part]; q += 2; continue; }
        if (!isalpha((unsigned char)*q) || tl[part] >= MAXD) return unsup(im, "Einsum '%s': psd reads 'ab,cd->ef' "
                                                                         "of at most %d subscripts each", eq, MAXD);
        t[part][tl[part]++] = *q;
    }
    if (part != 2) return unsup(im, "Einsum '%s': psd takes two operands and an explicit output ('->')", eq);
    const int r = x[0]->ndim;
    int n_ell = -1;
    for (int k = 0; k < 2; k++)
        if (ell[k] >= 0) n_ell = x[k]->ndim - tl[k];
    if (n_ell < 0 && ell[2] >= 0) return bad(im, "'...' in the output of '%s' only", eq);
    for (int k = 0; k < 3; k++) {   /* expand: "...": capitals A, B, ... (ONNX's subscripts are letters) */
        if (ell[k] < 0) continue;
        if (n_ell < 0 || tl[k] + n_ell > MAXD) return unsup(im, "Einsum '%s': its '...'", eq);
        for (int i = 0; i < tl[k]; i++)
            if (isupper((unsigned char)t[k][i])) return unsup(im, "Einsum '%s': capitals beside '...'", eq);
        memmove(t[k] + ell[k] + n_ell, t[k] + ell[k], (size_t)(tl[k] - ell[k]));
        for (int i = 0; i < n_ell; i++) t[k][ell[k] + i] = (char)('A' + i);
        tl[k] += n_ell;
    }
    int ok = tl[0] == x[0]->ndim && tl[1] == x[1]->ndim && tl[0] == r && tl[1] == r && tl[2] == r && r >= 3 &&
             !memcmp(t[0], t[1], (size_t)(r - 2)) && !memcmp(t[0], t[2], (size_t)(r - 2));
    for (int k = 0; k < 3 && ok; k++)   /* no subscript twice in a term (a diagonal) */
        for (int i = 0; i < r; i++)
            for (int j = i + 1; j < r; j++) ok &= t[k][i] != t[k][j];
    char kk = 0, ii = 0, jj = 0;
    if (ok) {   /* k: the one subscript of the last two both operands have, summed over; i, j: the kept ones */
        int shared = 0;
        for (int a = r - 2; a < r; a++)
            for (int b = r - 2; b < r; b++)
                if (t[0][a] == t[1][b]) { kk = t[0][a]; shared++; }
        ok = shared == 1 && !memchr(t[2], kk, (size_t)r);
        ii = t[0][r - 2] == kk ? t[0][r - 1] : t[0][r - 2];
        jj = t[1][r - 2] == kk ? t[1][r - 1] : t[1][r - 2];
    }
    int ta = t[0][r - 2] == kk, tb = t[1][r - 1] == kk, swap = 0;
    if (ok && t[2][r - 2] == ii && t[2][r - 1] == jj) swap = 0;
    else if (ok && t[2][r - 2] == jj && t[2][r - 1] == ii) swap = 1;   /* (A B)^T = B^T A^T */
    else ok = 0;
    if (!ok)
        return unsup(im, "Einsum '%s' is not a batched matrix product (psd writes einsum as a MatMul: operands and "
                     "output of one rank, 3 or more with the batch first, the same leading subscripts, the last two "
                     "of each operand one kept and one summed over)", eq);
    for (int d = 0; d < r - 2; d++)
        if (x[0]->dims[d] != x[1]->dims[d] && d >= im->lead)
            return unsup(im, "Einsum '%s': leading dims %lld and %lld differ", eq, (long long)x[0]->dims[d],
                         (long long)x[1]->dims[d]);
    const val *A = swap ? x[1] : x[0], *B = swap ? x[0] : x[1];
    const int tA = swap ? !tb : ta, tB = swap ? !ta : tb;
    int64_t od[MAXD];
    memcpy(od, A->dims, sizeof od);
    od[r - 2] = tA ? A->dims[r - 1] : A->dims[r - 2];
    od[r - 1] = tB ? B->dims[r - 2] : B->dims[r - 1];
    const int64_t kA = tA ? A->dims[r - 2] : A->dims[r - 1], kB = tB ? B->dims[r - 1] : B->dims[r - 2];
    if (kA != kB) return bad(im, "Einsum '%s': the summed subscript is %lld and %lld long", eq, (long long)kA,
                             (long long)kB);
    int ins[2] = {A->node, B->node};
    int pn = emit(im, "MatMul", NULL, NULL, NULL, 2, ins);
    if (pn < 0) return oom(im);
    if (tA) add_attr(im, pn, "transpose_a: true");
    if (tB) add_attr(im, pn, "transpose_b: true");
    return data_out(im, 0, pn, PS_ONNX_FLOAT, r, od) ? PS_OK : im->err->code;
}

/* Split of a computed value along one axis (newer exporters' x.chunk / torch.split): a Narrow per output
 * that is read. Sizes: the split input (opset 13) or attribute, else equal parts. */
static ps_status h_split(imp *im) {
    static const char *const known[] = {"axis", "split", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    const ps_onnx_node *n = cur_node(im);
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if (x->kind != VK_DATA) return unsup(im, "Split of a constant");
    if ((rc = need_float(im, x, 1, PS_MAXD, "input"))) return rc;
    int a = norm_axis(im, attr_i(im, "axis", 0), x->ndim, "axis");
    if (a < 0) return im->err->code;
    int d = pt_dim(im, a);
    if (d < 0) return along_batch(im, "Split");
    int64_t sz[MAXD * 4];
    int ns;
    const int cap = (int)(sizeof sz / sizeof sz[0]);
    if ((rc = moved_ints(im, 1, 13, "split", "split sizes", sz, cap, &ns))) return rc;
    if (ns < 0) {   /* neither: equal parts */
        ns = n->nout;
        if (ns < 1 || ns > cap || x->dims[a] % ns) return bad(im, "%lld does not split into %d equal parts",
                                                             (long long)x->dims[a], ns);
        for (int i = 0; i < ns; i++) sz[i] = x->dims[a] / ns;
    }
    int64_t total = 0;
    for (int i = 0; i < ns; i++) {
        if (sz[i] < 1) return unsup(im, "a Split with an empty part (psd's tensors are not empty)");
        total += sz[i];
    }
    if (ns != n->nout || total != x->dims[a])
        return bad(im, "%d parts summing to %lld for %d outputs of an axis of %lld", ns, (long long)total, n->nout,
                   (long long)x->dims[a]);
    int64_t start = 0;
    for (int k = 0; k < ns; start += sz[k], k++) {
        val *o = n->out[k][0] ? vget(im, n->out[k]) : NULL;
        if (!o || !(o->uses || o->graph_output)) continue;   /* a part nothing reads: no node */
        int in = x->node;
        int pn = emit(im, "Narrow", NULL, NULL, NULL, 1, &in);
        if (pn < 0) return oom(im);
        add_attr(im, pn, "dim: %d, start: %lld, length: %lld", d, (long long)start, (long long)sz[k]);
        int64_t od[MAXD];
        memcpy(od, x->dims, sizeof od);
        od[a] = sz[k];
        if (!data_out(im, k, pn, PS_ONNX_FLOAT, x->ndim, od)) return im->err->code;
    }
    return PS_OK;
}

/* Div: of constants folded; a computed value by a number of the graph, a MulConstant by its reciprocal; c /
 * x a Pow -1; of two computed values psd's Div (broadcast, bcast_pair); of one and an initializer a Div
 * with a Parameter (with_param). */
static ps_status h_arith(imp *im) {
    if (all_const(im)) return fold(im);
    double c;
    if (!strcmp(cur_node(im)->op_type, "Div")) {
        val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
        if (!a || !b) return im->err->code;
        if (a->kind == VK_DATA && scalar_const(im, b, &c)) {
            if (c == 0) return unsup(im, "a division by 0");
            return mul_const(im, a, 1.0 / c);
        }
        if (b->kind == VK_DATA && scalar_const(im, a, &c)) {   /* c / x (rsqrt's 1 / sqrt(x)) */
            const double k[2] = {c, 0.0};
            return math_chain(im, b, "Pow", "exponent: -1.0", k);
        }
    }
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    if (!strcmp(cur_node(im)->op_type, "Div") && a->kind == VK_DATA && b->kind == VK_DATA)
        return bcast_pair(im, a, b, "Div", "dividing");   /* x / x.norm(...), (x - mu) / std */
    if (!strcmp(cur_node(im)->op_type, "Div") && (a->kind == VK_DATA) != (b->kind == VK_DATA))
        return a->kind == VK_DATA ? with_param(im, a, b, "Div", 0) : with_param(im, b, a, "Div", 1);
    return unsup(im, "%s of '%s' and '%s' (psd divides computed values by numbers, learned tensors or computed "
                 "values)", cur_node(im)->op_type, a->name, b->name);
}

/* Mul of a computed value by an initializer (convnext's layer_scale * x):
 * a Scale whose parameter keeps the initializer's state_dict name
 * ("features.1.0.layer_scale": node features.1.0, parameter layer_scale). */
static ps_status mul_init(imp *im, val *x, val *c) {
    ps_status rc = need_float(im, x, 0, PS_MAXD, "input");
    if (rc) return rc;
    if (!c->init || !c->t || c->bound)
        return unsup(im, "Mul by a constant ('%s') that is not an initializer of its own: psd multiplies by "
                     "learned tensors (Scale) or computed values (Mul)", c->name);
    /* the Scale kind's broadcast (layers.c scale_shape): right-aligned with the sample's dims (one leading 1
     * may face the batch), 1s, then the value's own dims, then 1s; the shape stays the initializer's */
    int64_t sd[MAXD], p[MAXD];
    const int sn = sample_dims(im, x, sd), cn = c->ndim;
    int ok = cn <= sn || (cn == sn + 1 && c->dims[0] == 1), f = -1, l = -1;
    for (int k = 0; ok && k < sn; k++) {
        int j = k - (sn - cn);
        p[k] = j >= 0 ? c->dims[j] : 1;
        if (p[k] != 1 && f < 0) f = k;
        if (p[k] != 1) l = k;
    }
    for (int k = f; ok && f >= 0 && k <= l; k++) ok = p[k] == sd[k];
    for (int k = 0; !ok && im->lead && k < cn - sn; k++)   /* it spans the batch: the whole input as one sample */
        if (c->dims[k] != 1) return along_batch(im, "a constant factor");
    if (!ok)
        return unsup(im, "multiplying '%s' by initializer '%s': psd's Scale broadcasts 1s, then the value's own "
                     "dimensions, then 1s ((C, 1, 1) over (N, C, H, W))", x->name, c->name);
    /* the state_dict name: prefix.suffix, the suffix a word; else the kind's 'weight' */
    const char *dot = strrchr(c->name, '.');
    char suffix[24] = "weight";
    if (dot && dot != c->name && strlen(dot + 1) > 0 && strlen(dot + 1) < sizeof suffix) {
        int word = 1;
        for (const char *q = dot + 1; *q && word; q++) word = valid_char(*q);
        if (word) snprintf(suffix, sizeof suffix, "%s", dot + 1);
    }
    int xin = x->node;
    int pn = emit(im, "Scale", c->name, suffix, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    char b[128];
    int64_t one = 1;
    add_attr(im, pn, "shape: %s", cn ? dims_text(c->dims, cn, b, sizeof b) : dims_text(&one, 1, b, sizeof b));
    if (strcmp(suffix, "weight")) add_attr(im, pn, "parameter: %s", suffix);
    if ((rc = bind(im, pn, suffix, c, 0, 0))) return rc;
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

/* Mul of two computed values: psd's Mul (one shape, or broadcast:
 * squeeze-and-excitation's (N, C, 1, 1) by (N, C, H, W), a (N, 1, H, W)
 * mask; bcast_pair). By an initializer: a Scale (mul_init); by another
 * constant: refused. */
static ps_status h_mul(imp *im) {
    if (all_const(im)) return fold(im);
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    double c;
    if (a->kind == VK_DATA && scalar_const(im, b, &c)) return mul_const(im, a, c);
    if (b->kind == VK_DATA && scalar_const(im, a, &c)) return mul_const(im, b, c);
    if (a->kind == VK_DATA && b->kind == VK_CONST) return mul_init(im, a, b);
    if (b->kind == VK_DATA && a->kind == VK_CONST) return mul_init(im, b, a);
    if (a->kind != VK_DATA || b->kind != VK_DATA)
        return unsup(im, "Mul by a constant ('%s'): psd's Mul takes two computed values",
                     a->kind != VK_DATA ? a->name : b->name);
    return bcast_pair(im, a, b, "Mul", "multiplying");
}

/* ------------------------------------------------------------ Linear */

/* y = x . W (+ bias): W (in, out) with transpose, or (out, in). */
static ps_status linear(imp *im, val *x, val *w, int w_is_in_out, val *c) {
    ps_status rc = need_float(im, x, 1, PS_MAXD, "input");
    if (rc) return rc;
    if (w->kind != VK_CONST || w->ndim != 2)
        return unsup(im, "a weight '%s' that is not a 2-D initializer", w->name);
    int64_t in = w_is_in_out ? w->dims[0] : w->dims[1], out = w_is_in_out ? w->dims[1] : w->dims[0];
    if (x->dims[x->ndim - 1] != in)
        return bad(im, "input '%s' has %lld features but the weight '%s' takes %lld", x->name,
                   (long long)x->dims[x->ndim - 1], w->name, (long long)in);
    int xin = x->node;
    int pn = emit(im, "Linear", w->t ? w->t->name : w->name, w->wn_g ? "weight_v" : "weight", NULL, 1, &xin);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "out_features: %lld", (long long)out);
    if ((rc = bind_weight(im, pn, w, w_is_in_out))) return rc;
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    od[x->ndim - 1] = out;
    int has_bias = 0;
    if (c) {
        if (c->kind != VK_CONST) return unsup(im, "a bias '%s' that is computed", c->name);
        if (c->numel == out && (c->ndim == 1 || (c->ndim == 2 && c->dims[0] == 1))) {
            if ((rc = bind(im, pn, "bias", c, 0, 0))) return rc;
            has_bias = 1;
        } else if (c->numel == 1) {   /* a scalar bias: every output gets it (out values, trained apart) */
            if ((rc = bind(im, pn, "bias", c, 0, out))) return rc;
            has_bias = 1;
        }
    }
    if (!has_bias) {
        add_attr(im, pn, "bias: false");
        im->pn[pn].has_bias_attr = 1;
    }
    if (c && !has_bias) {   /* a bias of another shape (Gemm's C (M, N)): a Parameter added */
        val tmp = *x;
        tmp.node = pn;
        memcpy(tmp.dims, od, sizeof od);
        int64_t pd[MAXD];
        int pnd;
        int p = param_node(im, c, &tmp, pd, &pnd, 0, &rc);
        if (p < 0) return rc;
        int ins[2] = {pn, p};
        int s = emit(im, "Add", NULL, NULL, "add", 2, ins);
        if (s < 0) return oom(im);
        pn = s;
    }
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, od) ? PS_OK : im->err->code;
}

static ps_status h_gemm(imp *im) {
    static const char *const known[] = {"alpha", "beta", "transA", "transB", "broadcast", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (attr_f(im, "alpha", 1.0f) != 1.0f) return unsup(im, "alpha %g (psd's Linear computes x W^T + b)",
                                                       attr_f(im, "alpha", 1));
    if (has_in(im, 2) && attr_f(im, "beta", 1.0f) != 1.0f)
        return unsup(im, "beta %g (psd's Linear computes x W^T + b)", attr_f(im, "beta", 1));
    if (attr_i(im, "transA", 0)) return unsup(im, "transA: 1 (psd's Linear takes the input untransposed)");
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1), *c = has_in(im, 2) ? in_val(im, 2, 1) : NULL;
    if (!a || !b || (has_in(im, 2) && !c)) return im->err->code;
    if (a->kind == VK_DATA && a->ndim != 2) return bad(im, "input A of rank %d (Gemm takes 2)", a->ndim);
    return linear(im, a, b, !attr_i(im, "transB", 0), c);
}

static ps_status h_matmul(imp *im) {
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    if (a->kind == VK_CONST && b->kind == VK_CONST) return unsup(im, "MatMul of two constants");
    /* a 2-D right operand is a Linear's weight - unless it is a state_dict tensor of another name (x @ self.W
     * of a custom layer: a MatMul by the parameter keeps its name) */
    if (b->kind == VK_CONST && b->ndim == 2 && !custom_param_name(b->t && b->t->name[0] ? b->t->name : b->name))
        return linear(im, a, b, 1, NULL);
    return matmul_values(im, a, b);
}

/* ------------------------------------------------------ Conv and pools */

/* Conv and the pools over sp spatial dims, 1 (N, C, L) or 2 (N, C, H, W):
 * psd's 1-d kinds are its 2-d kinds over a (C, 1, L) plane, so a 1-d node's
 * kernel, strides, dilations and pads are the second entry of 2-entry
 * arrays whose first is the identity (1, or no padding). */

/* attribute key of sp values into v[2 - sp ..]; absent: v unchanged */
static ps_status spatial_ints(imp *im, const char *key, int sp, int64_t *v) {
    int64_t t[2];
    int n = attr_ints(im, key, t, 2);
    if (n < 0) return PS_OK;
    if (n != sp) return bad(im, "%s has %d values (a %d-D node takes %d)", key, n, sp, sp);
    const int64_t lo = strcmp(key, "output_padding") ? 1 : 0;   /* sizes, strides, dilations: 1 or more */
    for (int i = 0; i < sp; i++) {
        if (t[i] < lo || t[i] > 65536)
            return bad(im, "%s value %lld (psd takes %lld..65536)", key, (long long)t[i], (long long)lo);
        v[2 - sp + i] = t[i];
    }
    return PS_OK;
}

/* "kernel_size: 3" (1-D: its one entry; 2-D: N or [H, W]) */
static void spatial_attr(imp *im, int pn, int sp, const char *key, const int64_t *v);

/* The padding of pads [hb, wb, he, we] ([b, e] in 1-D) or auto_pad, symmetric. */
static ps_status pads_2d(imp *im, const val *x, int sp, const int64_t *k, const int64_t *s, const int64_t *dil,
                         int64_t *pad, int64_t *extra) {
    int64_t p[4] = {0, 0, 0, 0};
    const char *ap = attr_s(im, "auto_pad", "NOTSET");
    if (!strcmp(ap, "SAME_UPPER") || !strcmp(ap, "SAME_LOWER")) {
        for (int i = 2 - sp; i < 2; i++) {
            int64_t in = x->dims[x->ndim - 2 + i], out = (in + s[i] - 1) / s[i];
            int64_t total = (out - 1) * s[i] + (k[i] - 1) * dil[i] + 1 - in;
            if (total < 0) total = 0;
            int64_t small = total / 2, large = total - small;
            p[i] = !strcmp(ap, "SAME_UPPER") ? small : large;
            p[i + 2] = total - p[i];
        }
    } else if (!strcmp(ap, "NOTSET")) {
        int64_t t[4];
        int n = attr_ints(im, "pads", t, 4);
        if (n >= 0 && n != 2 * sp) return bad(im, "pads has %d values (%d-D takes %d)", n, sp, 2 * sp);
        for (int i = 0; n > 0 && i < sp; i++) {
            p[2 - sp + i] = t[i];
            p[4 - sp + i] = t[sp + i];
        }
    } else if (strcmp(ap, "VALID")) {
        return unsup(im, "auto_pad '%s'", ap);
    }
    for (int i = 0; i < 4; i++)
        if (p[i] < 0) return unsup(im, "negative pads");
    if (p[0] != p[2] || p[1] != p[3]) {
        if (!extra) return unsup(im, "asymmetric pads [%lld, %lld, %lld, %lld] (psd pads both sides alike)",
                                 (long long)p[0], (long long)p[1], (long long)p[2], (long long)p[3]);
        memcpy(extra, p, sizeof p);
    }
    pad[0] = p[0];
    pad[1] = p[1];
    return PS_OK;
}

static void pair_attr(imp *im, int pn, const char *key, const int64_t *v) {
    if (v[0] == v[1]) add_attr(im, pn, "%s: %lld", key, (long long)v[0]);
    else add_attr(im, pn, "%s: [%lld, %lld]", key, (long long)v[0], (long long)v[1]);
}

static void spatial_attr(imp *im, int pn, int sp, const char *key, const int64_t *v) {
    if (sp == 1) add_attr(im, pn, "%s: %lld", key, (long long)v[1]);
    else pair_attr(im, pn, key, v);
}

static ps_status h_conv(imp *im) {
    static const char *const known[] = {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1), *w = in_val(im, 1, 1), *b = has_in(im, 2) ? in_val(im, 2, 1) : NULL;
    if (!x || !w || (has_in(im, 2) && !b)) return im->err->code;
    const int sp = x->ndim - 2;   /* Conv2d, or Conv1d over (N, C, L) */
    if (x->kind == VK_DATA && sp != 1 && sp != 2)
        return unsup(im, "a %d-D convolution (psd's Conv1d and Conv2d are 1-D and 2-D)", sp);
    if ((rc = need_float(im, x, sp + 1, sp + 1, "input"))) return rc;
    if (w->kind != VK_CONST || w->ndim != sp + 2)
        return unsup(im, "a weight '%s' that is not a %d-D initializer", w->name, sp + 2);
    int64_t k[2] = {1, w->dims[w->ndim - 1]}, s[2] = {1, 1}, dil[2] = {1, 1}, pad[2], ks[2] = {1, 0};
    if (sp == 2) k[0] = w->dims[2];
    if ((rc = spatial_ints(im, "kernel_shape", sp, ks))) return rc;
    if (ks[1] && (ks[0] != k[0] || ks[1] != k[1])) return bad(im, "kernel_shape does not match the weight '%s'", w->name);
    if ((rc = spatial_ints(im, "strides", sp, s)) || (rc = spatial_ints(im, "dilations", sp, dil))) return rc;
    int64_t g = attr_i(im, "group", 1);
    if ((rc = pads_2d(im, x, sp, k, s, dil, pad, NULL))) return rc;
    if (im->pad_extra[2] == im->cur + 1) {   /* a zero Pad folded in */
        pad[0] += im->pad_extra[0];
        pad[1] += im->pad_extra[1];
    }
    int64_t cin = x->dims[x->ndim - sp - 1];
    if (g < 1 || cin % g || w->dims[0] % g || w->dims[1] * g != cin)
        return bad(im, "group %lld does not fit input channels %lld and weight '%s' (%lld, %lld, ...)", (long long)g,
                   (long long)cin, w->name, (long long)w->dims[0], (long long)w->dims[1]);
    int xin = x->node;
    int pn = emit(im, sp == 1 ? "Conv1d" : "Conv2d", w->name, w->wn_g ? "weight_v" : "weight", NULL, 1, &xin);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "out_channels: %lld", (long long)w->dims[0]);
    spatial_attr(im, pn, sp, "kernel_size", k);
    if (s[0] != 1 || s[1] != 1) spatial_attr(im, pn, sp, "stride", s);
    if (pad[0] || pad[1]) spatial_attr(im, pn, sp, "padding", pad);
    if (dil[0] != 1 || dil[1] != 1) spatial_attr(im, pn, sp, "dilation", dil);
    if (g != 1) add_attr(im, pn, "groups: %lld", (long long)g);
    if ((rc = bind_weight(im, pn, w, 0))) return rc;
    if (b) {
        if (b->kind != VK_CONST || b->numel != w->dims[0]) return bad(im, "bias '%s' does not fit", b->name);
        if ((rc = bind(im, pn, "bias", b, 0, 0))) return rc;
    } else {
        add_attr(im, pn, "bias: false");
        im->pn[pn].has_bias_attr = 1;
    }
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    od[x->ndim - sp - 1] = w->dims[0];
    for (int i = 2 - sp; i < 2; i++) {
        int64_t in = x->dims[x->ndim - 2 + i];
        od[x->ndim - 2 + i] = (in + 2 * pad[i] - dil[i] * (k[i] - 1) - 1) / s[i] + 1;
        if (od[x->ndim - 2 + i] < 1) return bad(im, "the kernel does not fit the input");
    }
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, od) ? PS_OK : im->err->code;
}

static ps_status pool(imp *im, int is_max) {
    static const char *const kmax[] = {"auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "storage_order",
                                       "strides", NULL};
    static const char *const kavg[] = {"auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads",
                                       "strides", NULL};
    ps_status rc = only_attrs(im, is_max ? kmax : kavg);
    if (rc) return rc;
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    const ps_onnx_node *nd = cur_node(im);
    if (is_max && nd->nout > 1 && nd->out[1][0]) {
        val *ix = vget(im, nd->out[1]);
        if (ix && (ix->uses || ix->graph_output)) return unsup(im, "the Indices output");
    }
    const int sp = x->ndim - 2;   /* MaxPool2d / AvgPool2d, or their 1-d kinds over (N, C, L) */
    if (x->kind == VK_DATA && sp != 1 && sp != 2) return unsup(im, "%d-D pooling (psd pools 1-D and 2-D)", sp);
    if ((rc = need_float(im, x, sp + 1, sp + 1, "input"))) return rc;
    int64_t k[2] = {1, 0}, s[2] = {1, 1}, dil[2] = {1, 1}, pad[2];
    if ((rc = spatial_ints(im, "kernel_shape", sp, k))) return rc;
    if (!k[1]) return bad(im, "kernel_shape is missing");
    if ((rc = spatial_ints(im, "strides", sp, s))) return rc;   /* each 1 or more (spatial_ints) */
    if ((rc = spatial_ints(im, "dilations", sp, dil))) return rc;
    if (dil[0] != 1 || dil[1] != 1) return unsup(im, "dilations (psd's pools have none)");
    const int ceil = attr_i(im, "ceil_mode", 0) != 0;
    if (attr_i(im, "storage_order", 0)) return unsup(im, "storage_order: 1");
    if ((rc = pads_2d(im, x, sp, k, s, dil, pad, NULL))) return rc;
    int cip = is_max ? 0 : (int)attr_i(im, "count_include_pad", 0);
    if (!is_max && im->pad_extra[2] == im->cur + 1) {   /* a zero Pad folded in: it counts in the average */
        if ((pad[0] || pad[1]) && !cip) return unsup(im, "a Pad before an AveragePool that pads without counting");
        pad[0] += im->pad_extra[0];
        pad[1] += im->pad_extra[1];
        cip = 1;
    }
    if (pad[0] >= k[0] || pad[1] >= k[1])
        return unsup(im, "pads %lldx%lld as large as the kernel %lldx%lld", (long long)pad[0], (long long)pad[1],
                     (long long)k[0], (long long)k[1]);
    int xin = x->node;
    static const char *const kinds[2][2] = {{"AvgPool1d", "AvgPool2d"}, {"MaxPool1d", "MaxPool2d"}};
    int pn = emit(im, kinds[is_max][sp - 1], NULL, NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    spatial_attr(im, pn, sp, "kernel_size", k);
    if (s[0] != k[0] || s[1] != k[1]) spatial_attr(im, pn, sp, "stride", s);
    if (pad[0] || pad[1]) spatial_attr(im, pn, sp, "padding", pad);
    if (!is_max && !cip) add_attr(im, pn, "count_include_pad: false");
    if (ceil) add_attr(im, pn, "ceil_mode: true");
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    for (int i = 2 - sp; i < 2; i++) {
        int64_t in = x->dims[x->ndim - 2 + i];
        if (in + 2 * pad[i] < k[i]) return bad(im, "the window does not fit the input");
        /* ceil_mode: ONNX rounds up; PyTorch (psd) also drops a last window
         * that would start in the right padding. Where they differ, refuse. */
        int64_t o = (in + 2 * pad[i] - k[i] + (ceil ? s[i] - 1 : 0)) / s[i] + 1;
        if (ceil && (o - 1) * s[i] >= in + pad[i])
            return unsup(im, "ceil_mode: 1 with a last window starting in the padding (ONNX keeps it, PyTorch and "
                         "psd drop it)");
        od[x->ndim - 2 + i] = o;
    }
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, od) ? PS_OK : im->err->code;
}

static ps_status h_maxpool(imp *im) { return pool(im, 1); }
static ps_status h_avgpool(imp *im) { return pool(im, 0); }

static ps_status h_gap(imp *im) {
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    const int sp = x->ndim - 2;
    if (x->kind == VK_DATA && sp != 1 && sp != 2) return unsup(im, "%d-D pooling (psd pools 1-D and 2-D)", sp);
    ps_status rc = need_float(im, x, sp + 1, sp + 1, "input");
    if (rc) return rc;
    int xin = x->node;
    int pn = emit(im, sp == 1 ? "AdaptiveAvgPool1d" : "AdaptiveAvgPool2d", NULL, NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "output_size: 1");
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    for (int i = 1; i <= sp; i++) od[x->ndim - i] = 1;
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, od) ? PS_OK : im->err->code;
}

/* GlobalMaxPool (PyTorch's adaptive_max_pool2d to 1) and ReduceMax over every spatial axis (x.amax(dim=(2,
 * 3))): a MaxPool2d / MaxPool1d over the whole plane (then Flatten where ReduceMax drops the axes). */
static ps_status global_max(imp *im, int keep) {
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    const int sp = x->ndim - 2;
    if (x->kind == VK_DATA && sp != 1 && sp != 2) return unsup(im, "%d-D pooling (psd pools 1-D and 2-D)", sp);
    ps_status rc = need_float(im, x, sp + 1, sp + 1, "input");
    if (rc) return rc;
    int xin = x->node;
    int pn = emit(im, sp == 1 ? "MaxPool1d" : "MaxPool2d", NULL, NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    char b[64];
    add_attr(im, pn, "kernel_size: %s", sp == 1 ? (snprintf(b, sizeof b, "%lld", (long long)x->dims[2]), b)
                                                : dims_text(x->dims + 2, 2, b, sizeof b));
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    for (int i = 1; i <= sp; i++) od[x->ndim - i] = 1;
    if (keep) return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, od) ? PS_OK : im->err->code;
    int f = emit(im, "Flatten", NULL, NULL, "flatten", 1, &pn);
    if (f < 0) return oom(im);
    return data_out(im, 0, f, PS_ONNX_FLOAT, 2, od) ? PS_OK : im->err->code;
}

static ps_status h_gmp(imp *im) { return global_max(im, 1); }


/* ReduceMean over adjacent axes after the batch. Over the two spatial axes
 * of an (N, C, H, W) value (mnasnet's x.mean([2, 3])): AdaptiveAvgPool2d to
 * 1x1, then Flatten when keepdims is 0. Over others (a text classifier's
 * mean over the tokens, x.mean(dim=1) of (N, T, E)): Reshape to (before,
 * the axes, after), AdaptiveAvgPool2d to [1, null], Reshape to the mean's
 * shape, as psd-export writes it. The axes are an attribute before opset
 * 18, an input from it. */
/* The reduction's result: psd node pn of dims od (on), times count for a ReduceSum (count 0: a mean). */
static ps_status reduce_out(imp *im, int pn, int on, const int64_t *od, double count, const char *post) {
    if (count > 0 && (pn = emit_value(im, "MulConstant", pn, "sum", count)) < 0) return im->err->code;
    if (post && (pn = emit(im, post, NULL, NULL, NULL, 1, &pn)) < 0) return oom(im);
    return data_out(im, 0, pn, PS_ONNX_FLOAT, on, od) ? PS_OK : im->err->code;
}

/* A Reduce* node's axes [lo, hi] of x (adjacent, after the batch; n of them; an attribute before opset
 * axes_input_opset, an input from it) and the result's dims od (on of them, keepdims as its attribute says).
 * what names the reduction in refusals ("mean", "max", ...); how says what psd writes for it. */
static ps_status reduce_axes(imp *im, const val *x, int axes_input_opset, const char *what, const char *how,
                             int *lo_out, int *hi_out, int *n_out, int64_t *od, int *on_out) {
    int64_t ax[PS_MAXD + 1];
    int n;
    ps_status rc = moved_ints(im, 1, axes_input_opset, "axes", "axes", ax, PS_MAXD, &n);
    if (rc) return rc;
    if (n <= 0) return unsup(im, "a %s over all axes (psd's is over adjacent axes after the batch)", what);
    int r = x->ndim, lo = r, hi = -1, seen[MAXD] = {0};
    char buf[128];
    for (int i = 0; i < n; i++) {
        int a = norm_axis(im, ax[i], r, "axes");
        if (a < 0) return im->err->code;
        if (a < im->lead) {
            snprintf(buf, sizeof buf, "a %s over the batch", what);
            return along_batch(im, buf);
        }
        if (seen[a]) return bad(im, "axis %d twice in axes", a);
        seen[a] = 1;
        lo = a < lo ? a : lo;
        hi = a > hi ? a : hi;
    }
    if (hi - lo + 1 != n)
        return unsup(im, "a %s over axes %s of a rank-%d value (psd's is over adjacent axes after the batch: %s)",
                     what, dims_text(ax, n, buf, sizeof buf), r, how);
    int keep = (int)attr_i(im, "keepdims", 1), on = 0;
    for (int i = 0; i < r; i++)
        if (i < lo || i > hi || keep) od[on++] = i < lo || i > hi ? x->dims[i] : 1;
    *lo_out = lo;
    *hi_out = hi;
    *n_out = n;
    *on_out = on;
    return PS_OK;
}

/* A reduction over x's axes [lo, hi] (n of them) other than the spatial ones: x viewed as three[] = (before,
 * the axes, after) - a Reshape node, or -1 (err set) - for a pooling over three[1] ... */
static int reduce_view_in(imp *im, const val *x, int lo, int hi, int n, int64_t three[3]) {
    three[0] = prod(x->dims + im->lead, lo - im->lead);
    three[1] = prod(x->dims + lo, n);
    three[2] = prod(x->dims + hi + 1, x->ndim - hi - 1);
    char buf[128];
    int in = x->node, pn = emit(im, "Reshape", NULL, NULL, "view", 1, &in);
    if (pn < 0) return oom(im), -1;
    add_attr(im, pn, "shape: %s", dims_text(three, 3, buf, sizeof buf));
    return pn;
}

/* ... and the pooled (before, 1, after) node in viewed as the result's dims od (on of them): in itself when
 * they are those, else a Reshape (-1: err set). */
static int reduce_view_out(imp *im, int in, int on, const int64_t *od, const int64_t three[3]) {
    const int64_t pooled[3] = {three[0], 1, three[2]};
    if (on - im->lead == 3 && !memcmp(od + im->lead, pooled, sizeof pooled)) return in;
    char buf[128];
    int pn = emit(im, "Reshape", NULL, NULL, "view", 1, &in);
    if (pn < 0) return oom(im), -1;
    add_attr(im, pn, "shape: %s", dims_text(od + im->lead, on - im->lead, buf, sizeof buf));
    return pn;
}

/* ReduceMean (its axes an input from opset 18) and ReduceSum (from 13: the mean times the count) of x, then
 * the kind post when not NULL (ReduceL2's Sqrt) */
static ps_status reduce_of(imp *im, val *x, int axes_input_opset, int sum, const char *post) {
    static const char *const known[] = {"axes", "keepdims", "noop_with_empty_axes", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if ((rc = need_float(im, x, 1, PS_MAXD, "input"))) return rc;
    const char *what = sum ? "sum" : "mean";
    int r = x->ndim, lo, hi, n, on;
    int64_t od[MAXD];   /* the mean's dims */
    if ((rc = reduce_axes(im, x, axes_input_opset, what, "a Reshape and AdaptiveAvgPool2d", &lo, &hi, &n, od, &on)))
        return rc;
    int keep = (int)attr_i(im, "keepdims", 1);
    const double count = sum ? (double)prod(x->dims + lo, n) : 0.0;
    int xin = x->node;
    if (r - im->lead == 3 && lo == r - 2) {   /* the spatial axes of (N, C, H, W) */
        int pn = emit(im, "AdaptiveAvgPool2d", NULL, NULL, NULL, 1, &xin);
        if (pn < 0) return oom(im);
        add_attr(im, pn, "output_size: 1");
        int64_t kd[MAXD];
        memcpy(kd, x->dims, sizeof kd);
        kd[r - 1] = kd[r - 2] = 1;
        if (keep) return reduce_out(im, pn, r, kd, count, post);
        int f = emit(im, "Flatten", NULL, NULL, "flatten", 1, &pn);
        if (f < 0) return oom(im);
        return reduce_out(im, f, r - 2, kd, count, post);
    }
    int64_t three[3];
    int cur = reduce_view_in(im, x, lo, hi, n, three);
    if (cur < 0) return im->err->code;
    if ((cur = emit(im, "AdaptiveAvgPool2d", NULL, NULL, NULL, 1, &cur)) < 0) return oom(im);
    add_attr(im, cur, "output_size: [1, null]");
    if ((cur = reduce_view_out(im, cur, on, od, three)) < 0) return im->err->code;
    return reduce_out(im, cur, on, od, count, post);
}

static ps_status reduce_mean_sum(imp *im, int axes_input_opset, int sum) {
    val *x = in_val(im, 0, 1);
    return x ? reduce_of(im, x, axes_input_opset, sum, NULL) : im->err->code;
}

static ps_status h_reducemean(imp *im) { return reduce_mean_sum(im, 18, 0); }
static ps_status h_reducesum(imp *im) { return reduce_mean_sum(im, 13, 1); }

/* ReduceMax and ReduceMin (a max of -x, negated) over adjacent axes after the batch: over every spatial axis
 * of (N, C, L) / (N, C, H, W) (x.amax(dim=(2, 3))) a MaxPool over the whole plane (global_max); otherwise
 * (torch.max(h, dim=1)'s values over the tokens of (N, T, E)) Reshape to (before, the axes, after), MaxPool2d
 * over a (the axes, 1) window, Reshape to the result's dims - as psd-export writes them. */
static ps_status reduce_max_min(imp *im, int neg) {
    static const char *const known[] = {"axes", "keepdims", "noop_with_empty_axes", NULL};
    const char *what = neg ? "min" : "max";
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (all_const(im)) return unsup(im, "Reduce%s of constants (psd does not fold it)", neg ? "Min" : "Max");
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if ((rc = need_float(im, x, 1, PS_MAXD, "input"))) return rc;
    int r = x->ndim, lo, hi, n, on;
    int64_t od[MAXD];
    if ((rc = reduce_axes(im, x, 18, what, "a Reshape and MaxPool2d", &lo, &hi, &n, od, &on))) return rc;
    int keep = (int)attr_i(im, "keepdims", 1);
    if (!neg && im->lead == 1 && (r == 3 || r == 4) && lo == 2 && hi == r - 1) return global_max(im, keep);
    val src = *x;       /* a min: the max of -x (a MulConstant by -1), negated */
    if (neg && (src.node = emit_value(im, "MulConstant", x->node, "neg", -1.0)) < 0) return im->err->code;
    int64_t three[3];
    int cur = reduce_view_in(im, &src, lo, hi, n, three);
    if (cur < 0) return im->err->code;
    if ((cur = emit(im, "MaxPool2d", NULL, NULL, NULL, 1, &cur)) < 0) return oom(im);
    add_attr(im, cur, "kernel_size: [%lld, 1]", (long long)three[1]);
    if ((cur = reduce_view_out(im, cur, on, od, three)) < 0) return im->err->code;
    if (neg && (cur = emit_value(im, "MulConstant", cur, "neg", -1.0)) < 0) return im->err->code;
    return data_out(im, 0, cur, PS_ONNX_FLOAT, on, od) ? PS_OK : im->err->code;
}

static ps_status h_reducemax(imp *im) { return reduce_max_min(im, 0); }

/* ReduceLogSumExp (torch.logsumexp) over adjacent axes after the batch, shifted by the max as PyTorch computes
 * it: m = the max over the axes, kept (Reshape, MaxPool2d, Reshape), then m + log(sum(exp(x - m))) - Sub
 * (broadcast), Exp, the sum (Reshape, AdaptiveAvgPool2d, Reshape, a MulConstant by the count), Log, Add m - and
 * a Reshape without the axes unless keepdims; as psd-export writes it. Its gradient is softmax(x) (m's two paths
 * cancel), and exp never overflows. */
static ps_status h_reducelogsumexp(imp *im) {
    static const char *const known[] = {"axes", "keepdims", "noop_with_empty_axes", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if ((rc = need_float(im, x, 1, PS_MAXD, "input"))) return rc;
    int r = x->ndim, lo, hi, n, on;
    int64_t od[MAXD], kd[MAXD], three[3];
    if ((rc = reduce_axes(im, x, 18, "logsumexp", "a max-shifted Sub, Exp, sum, Log and Add", &lo, &hi, &n, od,
                          &on)))
        return rc;
    memcpy(kd, x->dims, sizeof kd);
    for (int i = lo; i <= hi; i++) kd[i] = 1;
    int cur = reduce_view_in(im, x, lo, hi, n, three);
    if (cur < 0) return im->err->code;
    if ((cur = emit(im, "MaxPool2d", NULL, NULL, "max", 1, &cur)) < 0) return oom(im);
    add_attr(im, cur, "kernel_size: [%lld, 1]", (long long)three[1]);
    int m = reduce_view_out(im, cur, r, kd, three);
    if (m < 0) return im->err->code;
    int ins[2] = {x->node, m};
    if ((cur = emit(im, "Sub", NULL, NULL, "sub", 2, ins)) < 0) return oom(im);
    val e = *x;
    if ((e.node = emit(im, "Exp", NULL, NULL, "exp", 1, &cur)) < 0) return oom(im);
    if ((cur = reduce_view_in(im, &e, lo, hi, n, three)) < 0) return im->err->code;
    if ((cur = emit(im, "AdaptiveAvgPool2d", NULL, NULL, "sum", 1, &cur)) < 0) return oom(im);
    add_attr(im, cur, "output_size: [1, null]");
    if ((cur = reduce_view_out(im, cur, r, kd, three)) < 0) return im->err->code;
    if (three[1] != 1 && (cur = emit_value(im, "MulConstant", cur, "sum", (double)three[1])) < 0)
        return im->err->code;
    if ((cur = emit(im, "Log", NULL, NULL, "log", 1, &cur)) < 0) return oom(im);
    ins[0] = m;
    ins[1] = cur;
    if ((cur = emit(im, "Add", NULL, NULL, "add", 2, ins)) < 0) return oom(im);
    if (on != r) {
        char buf[128];
        int in = cur;
        if ((cur = emit(im, "Reshape", NULL, NULL, "view", 1, &in)) < 0) return oom(im);
        add_attr(im, cur, "shape: %s", dims_text(od + im->lead, on - im->lead, buf, sizeof buf));
    }
    return data_out(im, 0, cur, PS_ONNX_FLOAT, on, od) ? PS_OK : im->err->code;
}

/* CumSum (torch.cumsum) along a constant axis after the batch, with its exclusive and reverse attributes:
 * psd's CumSum. */
static ps_status h_cumsum(imp *im) {
    static const char *const known[] = {"exclusive", "reverse", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1), *av = x ? in_val(im, 1, 1) : NULL;
    if (!av) return im->err->code;
    if ((rc = need_float(im, x, 1, PS_MAXD, "input"))) return rc;
    if (av->kind != VK_CONST) return unsup(im, "a CumSum along an axis computed from the input's values");
    const int64_t *q = cints(im, av);
    if (!q) return im->err->code;
    if (av->numel != 1) return bad(im, "axis: one value, got %lld", (long long)av->numel);
    int a = norm_axis(im, q[0], x->ndim, "axis");
    if (a < 0) return im->err->code;
    int d = pt_dim(im, a);
    if (d < 0) return along_batch(im, "CumSum");
    int in = x->node, pn = emit(im, "CumSum", NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "dim: %d", d);
    if (attr_i(im, "reverse", 0)) add_attr(im, pn, "reverse: true");
    if (attr_i(im, "exclusive", 0)) add_attr(im, pn, "exclusive: true");
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}
static ps_status h_reducemin(imp *im) { return reduce_max_min(im, 1); }

/* ReduceSumSquare and ReduceL2 as values (x.norm(dim=1, keepdim=True) exports as ReduceL2; F.normalize's is
 * found apart): Pow 2, the sum (reduce_of), and for ReduceL2 Sqrt - its gradient at an all-zero vector NaN
 * where PyTorch's is 0: h_reducel2 takes it only for a whole-input sample. */
static ps_status reduce_squares(imp *im, const char *post) {
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    ps_status rc = need_float(im, x, 1, PS_MAXD, "input");
    if (rc) return rc;
    int xin = x->node;
    int pw = emit(im, "Pow", NULL, NULL, "square", 1, &xin);
    if (pw < 0) return oom(im);
    add_attr(im, pw, "exponent: 2.0");
    val sq = *x;
    sq.node = pw;
    return reduce_of(im, &sq, 18, 1, post);
}

static ps_status h_reducesumsquare(imp *im) { return reduce_squares(im, NULL); }

/* ReduceL2 with the batch leading: sum(x * F.normalize(x)) over the axes, as psd-export writes a norm -
 * Reshape to (before, the axes, after), Normalize along the axes, Mul by x, AdaptiveAvgPool2d to [1, null],
 * MulConstant by their count, Reshape to the result: |x| with PyTorch's gradient x / |x|, 0 at an all-zero
 * vector (reduce_squares' Sqrt gives NaN there; it serves a whole-input sample). */
static ps_status h_reducel2(imp *im) {
    if (im->lead != 1) return reduce_squares(im, "Sqrt");
    static const char *const known[] = {"axes", "keepdims", "noop_with_empty_axes", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if ((rc = need_float(im, x, 1, PS_MAXD, "input"))) return rc;
    int lo, hi, n, on;
    int64_t od[MAXD];
    if ((rc = reduce_axes(im, x, 18, "norm", "a Reshape, Normalize, Mul and AdaptiveAvgPool2d", &lo, &hi, &n, od,
                          &on)))
        return rc;
    int64_t three[3];
    int ins[2] = {reduce_view_in(im, x, lo, hi, n, three), -1}, cur;
    if (ins[0] < 0) return im->err->code;
    if ((ins[1] = emit(im, "Normalize", NULL, NULL, "normalize", 1, ins)) < 0) return oom(im);
    add_attr(im, ins[1], "dim: 2");
    if ((cur = emit(im, "Mul", NULL, NULL, "mul", 2, ins)) < 0) return oom(im);
    if ((cur = emit(im, "AdaptiveAvgPool2d", NULL, NULL, NULL, 1, &cur)) < 0) return oom(im);
    add_attr(im, cur, "output_size: [1, null]");
    if (three[1] != 1 && (cur = emit_value(im, "MulConstant", cur, "sum", (double)three[1])) < 0)
        return im->err->code;
    if ((cur = reduce_view_out(im, cur, on, od, three)) < 0) return im->err->code;
    return data_out(im, 0, cur, PS_ONNX_FLOAT, on, od) ? PS_OK : im->err->code;
}

/* ReduceProd of constants folded (x.std's count: the product of gathered Shape dims); of computed values
 * refused. */
static ps_status h_reduceprod(imp *im) {
    if (all_const(im)) return fold(im);
    return unsup(im, "ReduceProd of computed values (psd folds it over constant shapes only)");
}

/* BatchNormalization: scale, B, mean, var initializers. Opset < 6:
 * consumed_inputs; < 7: is_test; < 9: spatial (1 only); >= 14:
 * training_mode. momentum m is PyTorch's 1 - m. A training-mode node's
 * extra outputs (the updated statistics) must be unused: psd folds the
 * batch statistics into its running buffers itself. */
static ps_status h_batchnorm(imp *im) {
    static const char *const known[] = {"epsilon", "momentum", "spatial", "is_test", "consumed_inputs",
                                        "training_mode", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (im->opset < 9 && attr_i(im, "spatial", 1) != 1) return unsup(im, "spatial: 0 (per-activation statistics)");
    val *x = in_val(im, 0, 1), *sc = in_val(im, 1, 1), *bi = in_val(im, 2, 1), *mean = in_val(im, 3, 1),
        *var = in_val(im, 4, 1);
    if (!x || !sc || !bi || !mean || !var) return im->err->code;
    const ps_onnx_node *nd = cur_node(im);
    for (int k = 1; k < nd->nout; k++) {
        val *o = nd->out[k][0] ? vget(im, nd->out[k]) : NULL;
        if (o && (o->uses || o->graph_output))
            return unsup(im, "output %d (the %s) is used: psd keeps BatchNorm's statistics in its buffers", k,
                         k == 1 ? "running mean" : k == 2 ? "running variance" : "saved statistics");
    }
    int r = x->ndim - im->lead;
    if ((rc = need_float(im, x, 1, 3, "input"))) return rc;
    int64_t c = x->dims[im->lead];
    if (im->whole) return unsup(im, "BatchNormalization needs the batch dimension");
    val *ps[4] = {sc, bi, mean, var};
    static const char *const suf[4] = {"weight", "bias", "running_mean", "running_var"};
    for (int i = 0; i < 4; i++)
        if (ps[i]->kind != VK_CONST || ps[i]->numel != c)
            return bad(im, "input '%s' (%s) must be an initializer of %lld values", ps[i]->name, suf[i], (long long)c);
    int xin = x->node;
    int pn = emit(im, r == 3 ? "BatchNorm2d" : "BatchNorm1d", sc->name, "weight", NULL, 1, &xin);
    if (pn < 0) return oom(im);
    double eps = attr_f(im, "epsilon", 1e-5f), mom = 1.0 - (double)attr_f(im, "momentum", 0.9f);
    char f1[40], f2[40];
    snprintf(f1, sizeof f1, "%.6g", eps);
    if ((float)strtod(f1, NULL) != (float)eps) float_text(eps, f1, sizeof f1);
    snprintf(f2, sizeof f2, "%.6g", mom);
    if ((float)eps != 1e-5f) add_attr(im, pn, "eps: %s", f1);
    if (fabs(mom - 0.1) > 1e-6) add_attr(im, pn, "momentum: %s", f2);
    for (int i = 0; i < 4; i++)
        if ((rc = bind(im, pn, suf[i], ps[i], 0, 0))) return rc;
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

/* ---------------------------------------------------- shapes and joins */

static ps_status h_flatten(imp *im) {
    static const char *const known[] = {"axis", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (all_const(im)) return unsup(im, "Flatten of a constant");
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if ((rc = need_float(im, x, 0, PS_MAXD, "input"))) return rc;
    int r = x->ndim;
    int a = norm_axis(im, attr_i(im, "axis", 1), r + 1, "axis");
    if (a < 0) return im->err->code;
    int64_t od[2] = {prod(x->dims, a), prod(x->dims + a, r - a)};
    int xin = x->node, pn;
    if (!im->whole) {
        if (im->lead != 1 || a != 1) return along_batch(im, "Flatten with an axis other than 1");
        pn = emit(im, "Flatten", NULL, NULL, NULL, 1, &xin);
        if (pn < 0) return oom(im);
        od[0] = x->dims[0];
    } else {
        pn = emit(im, "Reshape", NULL, NULL, NULL, 1, &xin);
        if (pn < 0) return oom(im);
        char b[64];
        add_attr(im, pn, "shape: %s", dims_text(od, 2, b, sizeof b));
    }
    return data_out(im, 0, pn, PS_ONNX_FLOAT, 2, od) ? PS_OK : im->err->code;
}

/* The current Reshape node's target shape as written (0 and -1 not yet
 * resolved) into shape (MAXD entries), *n its length: the attribute before
 * opset 5, the constant second input from then on. Read by h_reshape and by
 * the attention matcher's Reshapes (mha_reshape). */
static ps_status reshape_target(imp *im, int64_t *shape, int *n) {
    ps_status rc = moved_ints(im, 1, 5, "shape", "a target shape", shape, MAXD, n);
    if (rc) return rc;
    return *n < 0 ? bad(im, "no shape") : PS_OK;
}

/* Reshape: the shape a constant input (opset >= 5) or attribute; 0 copies
 * a dimension (unless allowzero), -1 is inferred. In leading mode the
 * first entry must keep the batch (0, the batch symbol, the traced batch
 * size, or -1 with the rest per sample). */
static ps_status h_reshape(imp *im) {
    static const char *const known[] = {"allowzero", "shape", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    int64_t shape[MAXD + 1];
    int ns;
    if ((rc = reshape_target(im, shape, &ns))) return rc;
    if (x->kind == VK_CONST) {
        if (all_const(im)) return fold(im);   /* shape arithmetic (x.expand(n, -1, -1)'s) */
        return unsup(im, "Reshape of a constant by a computed shape");
    }
    if ((rc = need_float(im, x, 0, PS_MAXD, "input"))) return rc;
    int allowzero = (int)attr_i(im, "allowzero", 0);
    /* leading mode: the first entry must keep the batch (0, the batch symbol, the batch size, or -1 over
     * exactly the batch); the rest reshape one sample. Whole-sample: every entry reshapes the sample. */
    int off = im->lead;
    int64_t full[MAXD];
    int64_t total = prod(x->dims + off, x->ndim - off), known_p = 1;
    int neg = -1;
    if (ns < off) return along_batch(im, "a Reshape that merges the batch");
    for (int i = 0; i < off; i++) full[i] = x->dims[i];
    for (int i = off; i < ns; i++) {
        int64_t v = shape[i];
        if (v == BATCH_SYM) return along_batch(im, "a Reshape that moves the batch");
        if (v == 0 && !allowzero) {
            if (i >= x->ndim) return bad(im, "shape entry %d is 0 but the input has rank %d", i, x->ndim);
            v = x->dims[i];
        }
        if (v == -1) {
            if (neg >= 0) return bad(im, "two -1 entries in the shape");
            neg = i;
        } else if (v < 0 || v > PS_ONNX_MAX_NUMEL) {
            return bad(im, "shape entry %lld", (long long)v);
        } else {
            known_p = smul(known_p, v);
        }
        full[i] = v;
    }
    for (int i = 0; i < off; i++) {
        int64_t f0 = shape[i];
        int keeps = f0 == BATCH_SYM || (f0 == 0 && !allowzero) || (f0 > 0 && f0 == x->dims[i]) ||
                    (off == 1 && f0 == -1 && neg < 0 && known_p == total);
        if (!keeps) return along_batch(im, "a Reshape that moves the batch");
    }
    if (neg >= 0) {
        if (!known_p || total % known_p) return bad(im, "cannot reshape %lld elements to the shape", (long long)total);
        full[neg] = total / known_p;
    } else if (known_p != total) {
        if (!im->whole) return along_batch(im, "a Reshape that moves the batch");
        return bad(im, "cannot reshape %lld elements to %lld", (long long)total, (long long)known_p);
    }
    int xin = x->node;
    int pn;
    char b[128];
    if (x->shuffled && ns == 4 && full[1] == x->dims[1] * x->dims[2] && full[2] == x->dims[3] &&
        full[3] == x->dims[4])   /* channel_shuffle's view back: what the ChannelShuffle node computes */
        return data_out(im, 0, xin, PS_ONNX_FLOAT, ns, full) ? PS_OK : im->err->code;
    if (ns - off > PS_MAXD) return unsup(im, "more than %d dimensions per sample", PS_MAXD);
    pn = emit(im, "Reshape", NULL, NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "shape: %s", dims_text(full + off, ns - off, b, sizeof b));
    return data_out(im, 0, pn, PS_ONNX_FLOAT, ns, full) ? PS_OK : im->err->code;
}

static ps_status h_concat(imp *im) {
    static const char *const known[] = {"axis", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (all_const(im)) return fold(im);
    const ps_onnx_node *nd = cur_node(im);
    if (nd->nin == 1) {   /* torch.cat of a one-tensor list (densenet's first layer): the identity */
        val *x = in_val(im, 0, 1);
        if (!x) return im->err->code;
        if (norm_axis(im, attr_i(im, "axis", im->opset >= 4 ? 0 : 1), x->ndim, "axis") < 0) return im->err->code;
        return alias_out(im, 0, x);
    }
    if (nd->nin < 1 || nd->nin > MAX_INPUTS) return unsup(im, "%d inputs (psd's Concat takes 2 to %d)", nd->nin,
                                                          MAX_INPUTS);
    val *first = NULL;
    for (int k = 0; k < nd->nin && !first; k++) {
        val *v = in_val(im, k, 1);
        if (!v) return im->err->code;
        if (v->kind == VK_DATA) first = v;
    }
    int r = first->ndim;
    int a = norm_axis(im, attr_i(im, "axis", im->opset >= 4 ? 0 : 1), r, "axis");
    if (a < 0) return im->err->code;
    int d = pt_dim(im, a);
    if (d < 0) return along_batch(im, "Concat");
    int ins[MAX_INPUTS];
    int64_t od[MAXD];
    memcpy(od, first->dims, sizeof od);
    od[a] = 0;
    for (int k = 0; k < nd->nin; k++) {
        val *v = in_val(im, k, 1);
        if (!v) return im->err->code;
        if (v->kind == VK_CONST) {
            /* a constant part: a Parameter of its shape (it spans the batch in leading mode only as 1) */
            val tmp = *first;
            int off = im->lead;
            if (v->ndim != r) return bad(im, "input '%s' has rank %d, not %d", v->name, v->ndim, r);
            for (int i = 0; i < off; i++)
                if (v->dims[i] != 1) return along_batch(im, "a constant part of Concat");
            for (int i = 0; i < r; i++) tmp.dims[i] = i == a ? v->dims[i] : first->dims[i];
            int64_t want[MAXD];
            memcpy(want, tmp.dims, sizeof want);
            int64_t pd[MAXD];
            int pnd;
            int p = param_node(im, v, &tmp, pd, &pnd, 0, &rc);
            if (p < 0) return rc;
            (void)off;
            ins[k] = p;
            od[a] += v->dims[a];
            continue;
        }
        if ((rc = need_float(im, v, 0, PS_MAXD, "input"))) return rc;
        if (v->ndim != r) return bad(im, "input '%s' has rank %d, not %d", v->name, v->ndim, r);
        for (int i = 0; i < r; i++)
            if (i != a && v->dims[i] != first->dims[i])
                return bad(im, "input '%s' differs from '%s' outside the axis", v->name, first->name);
        ins[k] = v->node;
        od[a] += v->dims[a];
    }
    int pn = emit(im, "Concat", NULL, NULL, NULL, nd->nin, ins);
    if (pn < 0) return oom(im);
    if (d != 1) add_attr(im, pn, "dim: %d", d);
    return data_out(im, 0, pn, PS_ONNX_FLOAT, r, od) ? PS_OK : im->err->code;
}

/* Gather: an initializer table read by computed int64 ids along axis 0 is
 * an Embedding; a computed value indexed by constant indices is an
 * IndexSelect (+ Reshape for indices of rank != 1). */
static ps_status h_gather(imp *im) {
    static const char *const known[] = {"axis", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (all_const(im)) return fold(im);
    val *data = in_val(im, 0, 1), *idx = in_val(im, 1, 1);
    if (!data || !idx) return im->err->code;
    int a = norm_axis(im, attr_i(im, "axis", 0), data->ndim, "axis");
    if (a < 0) return im->err->code;
    int64_t od[MAXD];
    int nd = 0;
    for (int i = 0; i < a; i++) od[nd++] = data->dims[i];
    for (int i = 0; i < idx->ndim; i++) {
        if (nd == MAXD) return unsup(im, "an output of more than %d dimensions", MAXD);
        od[nd++] = idx->dims[i];
    }
    for (int i = a + 1; i < data->ndim; i++) {
        if (nd == MAXD) return unsup(im, "an output of more than %d dimensions", MAXD);
        od[nd++] = data->dims[i];
    }
    if (data->kind == VK_CONST) {   /* Embedding */
        if (idx->dtype != PS_ONNX_INT64) return unsup(im, "indices of type %s (psd's ids are int64)",
                                                      ps_onnx_dtype_name(idx->dtype));
        if (a != 0) return unsup(im, "a table indexed along axis %d (an Embedding takes rows)", a);
        if (data->ndim != 2) return unsup(im, "a table of rank %d (an Embedding's is 2-D)", data->ndim);
        int xin = idx->node;
        int pn = emit(im, "Embedding", data->name, "weight", NULL, 1, &xin);
        if (pn < 0) return oom(im);
        add_attr(im, pn, "num_embeddings: %lld, embedding_dim: %lld", (long long)data->dims[0],
                 (long long)data->dims[1]);
        if ((rc = bind(im, pn, "weight", data, 0, 0))) return rc;
        return data_out(im, 0, pn, PS_ONNX_FLOAT, nd, od) ? PS_OK : im->err->code;
    }
    if (idx->kind != VK_CONST) return unsup(im, "indices computed from the input for a computed table");
    int d = pt_dim(im, a);
    if (d < 0) return along_batch(im, "Gather");
    if ((rc = need_float(im, data, 1, PS_MAXD, "data"))) return rc;
    const int64_t *q = cints(im, idx);
    if (!q) return im->err->code;
    if (idx->numel < 1 || idx->numel > INDEX_MAX)
        return unsup(im, "%lld indices (psd's IndexSelect takes 1 to %d)", (long long)idx->numel, INDEX_MAX);
    char b[256];
    size_t o = 0;
    for (int64_t i = 0; i < idx->numel; i++) {
        int64_t v = q[i] < 0 ? q[i] + data->dims[a] : q[i];
        if (v < 0 || v >= data->dims[a]) return bad(im, "index %lld outside %lld", (long long)q[i],
                                                     (long long)data->dims[a]);
        o += (size_t)snprintf(b + o, sizeof b - o, "%s%lld", i ? ", " : "", (long long)v);
    }
    int xin = data->node;
    int pn = emit(im, "IndexSelect", NULL, NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    if (d != 1) add_attr(im, pn, "dim: %d", d);
    add_attr(im, pn, "index: [%s]", b);
    if (idx->ndim != 1) {
        int64_t ps[MAXD];
        int off = im->lead;
        if (nd - off > PS_MAXD) return unsup(im, "more than %d dimensions per sample", PS_MAXD);
        if (nd - off < 1) return unsup(im, "a scalar per sample");
        for (int i = off; i < nd; i++) ps[i - off] = od[i];
        int r2 = emit(im, "Reshape", NULL, NULL, "reshape", 1, &pn);
        if (r2 < 0) return oom(im);
        add_attr(im, r2, "shape: %s", dims_text(ps, nd - off, b, sizeof b));
        pn = r2;
    }
    return data_out(im, 0, pn, PS_ONNX_FLOAT, nd, od) ? PS_OK : im->err->code;
}

/* LayerNormalization (opset 17): axis to the end, Scale and B initializers. */
static ps_status layer_norm(imp *im, val *x, int axis, double eps, val *scale, val *bias, const char *scope_name) {
    ps_status rc = need_float(im, x, 1, PS_MAXD, "input");
    if (rc) return rc;
    int a = norm_axis(im, axis, x->ndim, "axis");
    if (a < 0) return im->err->code;
    if (pt_dim(im, a) < 0) return along_batch(im, "LayerNormalization");
    int64_t *shape = x->dims + a;
    int n = x->ndim - a;
    int xin = x->node;
    int pn = emit(im, "LayerNorm", scale ? scale->name : NULL, "weight", NULL, 1, &xin);
    if (pn < 0) return oom(im);
    if (scope_name && scope_name[0] && !(scale && strstr(scale->name, ".weight"))) {
        char nm[NAME_MAX_ + 1];
        snprintf(nm, sizeof nm, "%s", scope_name);
        if (!name_taken(im, nm)) snprintf(im->pn[pn].name, sizeof im->pn[pn].name, "%s", nm);
    }
    char b[128], f[40];
    add_attr(im, pn, "normalized_shape: %s", n == 1 ? (snprintf(b, sizeof b, "%lld", (long long)shape[0]), b)
                                                    : dims_text(shape, n, b, sizeof b));
    if ((float)eps != 1e-5f) add_attr(im, pn, "eps: %s", float_text(eps, f, sizeof f));
    int64_t cnt = prod(shape, n);
    if (!scale && !bias) {
        add_attr(im, pn, "elementwise_affine: false");
    } else {
        if (!scale || !bias || scale->kind != VK_CONST || bias->kind != VK_CONST || scale->numel != cnt ||
            bias->numel != cnt)
            return unsup(im, "a LayerNorm whose scale and bias are not initializers of %lld values", (long long)cnt);
        if ((rc = bind(im, pn, "weight", scale, 0, 0)) || (rc = bind(im, pn, "bias", bias, 0, 0))) return rc;
    }
    return PS_OK;
}

static ps_status h_layernorm(imp *im) {
    static const char *const known[] = {"axis", "epsilon", "stash_type", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    const ps_onnx_node *nd = cur_node(im);
    for (int k = 1; k < nd->nout; k++) {
        val *o = nd->out[k][0] ? vget(im, nd->out[k]) : NULL;
        if (o && (o->uses || o->graph_output)) return unsup(im, "its mean / inverse deviation outputs are used");
    }
    val *x = in_val(im, 0, 1), *s = in_val(im, 1, 1), *b = has_in(im, 2) ? in_val(im, 2, 1) : NULL;
    if (!x || !s) return im->err->code;
    if ((rc = layer_norm(im, x, (int)attr_i(im, "axis", -1), attr_f(im, "epsilon", 1e-5f), s, b, NULL))) return rc;
    return data_out(im, 0, im->npn - 1, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

/* ---- group and instance normalisation ---- */

/* x (N, C, *) normalised per sample and group: nn.GroupNorm (groups G, from the pattern find_patterns
 * recognises) or ONNX's InstanceNormalization (instance: groups = C; InstanceNorm1d / 2d for (N, C, L) /
 * (N, C, H, W), else a GroupNorm of C groups). scale and bias: initializers of C values (weight and bias), or
 * both NULL (affine false). */
static ps_status group_norm(imp *im, val *x, int64_t groups, double eps, val *scale, val *bias,
                            const char *scope_name, int instance) {
    ps_status rc = need_float(im, x, 1, PS_MAXD, "input");
    if (rc) return rc;
    if (im->lead < 1 || x->ndim - im->lead < 1) return along_batch(im, instance ? "InstanceNormalization" : "GroupNorm");
    const int64_t c = x->dims[im->lead];
    const int r = x->ndim - im->lead;     /* per-sample rank */
    if (instance) groups = c;
    if (groups < 1 || c % groups)
        return unsup(im, "%lld groups do not divide the %lld channels", (long long)groups, (long long)c);
    const char *kind = instance && r == 2 ? "InstanceNorm1d" : instance && r == 3 ? "InstanceNorm2d" : "GroupNorm";
    int xin = x->node;
    int pn = emit(im, kind, scale ? scale->name : NULL, "weight", NULL, 1, &xin);
    if (pn < 0) return oom(im);
    if (scope_name && scope_name[0] && !(scale && strstr(scale->name, ".weight"))) {
        char nm[NAME_MAX_ + 1];
        snprintf(nm, sizeof nm, "%s", scope_name);
        if (!name_taken(im, nm)) snprintf(im->pn[pn].name, sizeof im->pn[pn].name, "%s", nm);
    }
    char f[40];
    if (kind[0] == 'G') add_attr(im, pn, "num_groups: %lld", (long long)groups);
    if ((float)eps != 1e-5f) add_attr(im, pn, "eps: %s", float_text(eps, f, sizeof f));
    if (!scale && !bias) {
        if (kind[0] == 'G') add_attr(im, pn, "affine: false");
        return PS_OK;
    }
    if (!scale || !bias || scale->kind != VK_CONST || bias->kind != VK_CONST || scale->numel != c || bias->numel != c)
        return unsup(im, "a %s whose scale and bias are not initializers of %lld values", kind, (long long)c);
    if (kind[0] == 'I') add_attr(im, pn, "affine: true");
    if ((rc = bind(im, pn, "weight", scale, 0, 0)) || (rc = bind(im, pn, "bias", bias, 0, 0))) return rc;
    return PS_OK;
}

/* 1: constant v holds only the value c (PyTorch's exporter's ones and zeros for an instance norm without
 * weights) */
static int const_all(imp *im, val *v, double c) {
    if (!v || v->kind != VK_CONST || v->init) return 0;
    const double *f = cvals(im, v);
    for (int64_t i = 0; f && i < v->numel; i++)
        if (f[i] != c) return 0;
    return f != NULL;
}

/* InstanceNormalization (nn.InstanceNorm1d / 2d): with initializers for scale and bias, affine; with the
 * exporter's constant ones and zeros, without. */
static ps_status h_instnorm(imp *im) {
    static const char *const known[] = {"epsilon", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1), *s = in_val(im, 1, 1), *b = in_val(im, 2, 1);
    if (!x || !s || !b) return im->err->code;
    const int plain = const_all(im, s, 1.0) && const_all(im, b, 0.0);
    if ((rc = group_norm(im, x, 0, attr_f(im, "epsilon", 1e-5f), plain ? NULL : s, plain ? NULL : b, NULL, 1)))
        return rc;
    return data_out(im, 0, im->npn - 1, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

/* ------------------------------------------------- recognised patterns */

static const char *out0(imp *im, int i);

/* nn.utils.weight_norm's Mul (find_weight_norm): its output stands for v (x), with g (f->scale), for the
 * Gemm / Conv / ConvTranspose that reads it as its weight (bind_weight). */
static ps_status weight_norm_value(imp *im, const fused *f, const val *x) {
    val *g = vget(im, f->scale), *o = vmake(im, out0(im, im->cur));
    if (!o) return oom(im);
    if (x->kind != VK_CONST || !x->init || !x->t || !g || g->kind != VK_CONST || !g->init || !g->t)
        return unsup(im, "weight_norm of '%s' by '%s': psd takes g and v as initializers", x->name, f->scale);
    if (g->numel != (f->axis ? 1 : x->dims[0]))
        return bad(im, "weight_norm's g '%s' has %lld values for v '%s' of %lld rows", g->name, (long long)g->numel,
                   x->name, (long long)x->dims[0]);
    val saved = *o;
    *o = *x;
    o->next = saved.next;
    o->name = saved.name;
    o->uses = saved.uses;
    o->prod = saved.prod;
    o->graph_output = saved.graph_output;
    o->wn_g = g;
    o->wn_null = f->axis;
    return PS_OK;
}

static ps_status h_fused(imp *im) {
    fused *f = &im->fz[im->cur];
    val *x = vget(im, f->x);
    if (!x || x->kind == VK_NONE) return bad(im, "the %s's input '%s' is unknown", f->kind, f->x);
    ps_status rc;
    if (!strcmp(f->kind, "WeightNorm")) return weight_norm_value(im, f, x);
    if (!strcmp(f->kind, "LayerNorm")) {
        val *s = f->scale ? vget(im, f->scale) : NULL, *b = f->bias ? vget(im, f->bias) : NULL;
        if ((rc = layer_norm(im, x, f->axis, f->eps, s, b, f->scope))) return rc;
        return data_out(im, 0, im->npn - 1, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
    }
    if (!strcmp(f->kind, "Normalize")) {
        if ((rc = need_float(im, x, 1, PS_MAXD, "input"))) return rc;
        int a = norm_axis(im, f->axis, x->ndim, "axes");
        if (a < 0) return im->err->code;
        if (pt_dim(im, a) < 0) return along_batch(im, "F.normalize");
        int in = x->node;
        int pn = emit(im, "Normalize", NULL, NULL, NULL, 1, &in);
        if (pn < 0) return oom(im);
        char e[40];
        add_attr(im, pn, "dim: %d", pt_dim(im, a));
        add_attr(im, pn, "eps: %s", float_text(f->eps, e, sizeof e));
        return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
    }
    if (!strcmp(f->kind, "GroupNorm")) {
        val *s = f->scale ? vget(im, f->scale) : NULL, *b = f->bias ? vget(im, f->bias) : NULL;
        if ((rc = group_norm(im, x, f->axis, f->eps, s, b, f->scope, 0))) return rc;
        return data_out(im, 0, im->npn - 1, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
    }
    if ((rc = need_float(im, x, 0, PS_MAXD, "input"))) return rc;
    int in = x->node;
    int pn = emit(im, f->kind, NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    /* named after the module it came from, else after the kind (F.gelu at the top: "gelu") */
    char nm[NAME_MAX_ + 1], base[NAME_MAX_ + 1];
    if (f->scope[0]) snprintf(base, sizeof base, "%s", f->scope);
    else lower_op(f->kind, base, sizeof base);
    snprintf(nm, sizeof nm, "%s", base);
    im->pn[pn].name[0] = 0;   /* not its own rival */
    for (int k = 1; name_taken(im, nm); k++) snprintf(nm, sizeof nm, "%.88s_%d", base, k);
    snprintf(im->pn[pn].name, sizeof im->pn[pn].name, "%s", nm);
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

static ps_status h_lstm(imp *im);
static void find_mha(imp *im, int t0);

/* ------------------------------------------------------------- op table */

/* ---- upsampling: ConvTranspose and Resize (decoders, U-Nets) ---- */

/* ConvTranspose over (N, C, H, W): psd's ConvTranspose2d. The weight is
 * (C, out/group, kh, kw), PyTorch's; pads symmetric (auto_pad NOTSET or
 * VALID), output_padding below the stride; output_shape refused (psd's
 * size is the attributes'). */
static ps_status h_upconv(imp *im) {
    static const char *const known[] = {"auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                                        "output_shape", "pads", "strides", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1), *w = in_val(im, 1, 1), *b = has_in(im, 2) ? in_val(im, 2, 1) : NULL;
    if (!x || !w || (has_in(im, 2) && !b)) return im->err->code;
    if (x->kind == VK_DATA && x->ndim != 4)
        return unsup(im, "a %d-D transposed convolution (psd's ConvTranspose2d is 2-D)", x->ndim - 2);
    if ((rc = need_float(im, x, 3, 3, "input"))) return rc;
    if (w->kind != VK_CONST || w->ndim != 4) return unsup(im, "a weight '%s' that is not a 4-D initializer", w->name);
    if (attr(im, "output_shape"))
        return unsup(im, "output_shape (PyTorch's output_size=; psd's ConvTranspose2d takes output_padding)");
    const char *ap = attr_s(im, "auto_pad", "NOTSET");
    if (strcmp(ap, "NOTSET") && strcmp(ap, "VALID")) return unsup(im, "auto_pad '%s' of a ConvTranspose", ap);
    int64_t k[2] = {w->dims[2], w->dims[3]}, s[2] = {1, 1}, dil[2] = {1, 1}, pad[2], op[2] = {0, 0};
    int64_t ks[2] = {1, 0};
    if ((rc = spatial_ints(im, "kernel_shape", 2, ks))) return rc;
    if (ks[1] && (ks[0] != k[0] || ks[1] != k[1])) return bad(im, "kernel_shape does not match the weight '%s'", w->name);
    if ((rc = spatial_ints(im, "strides", 2, s)) || (rc = spatial_ints(im, "dilations", 2, dil)) ||
        (rc = spatial_ints(im, "output_padding", 2, op)))
        return rc;
    if ((rc = pads_2d(im, x, 2, k, s, dil, pad, NULL))) return rc;
    const int64_t g = attr_i(im, "group", 1), cin = x->dims[1];
    if (g < 1 || cin % g || w->dims[0] != cin)
        return bad(im, "group %lld does not fit input channels %lld and weight '%s' (%lld, %lld, ...)", (long long)g,
                   (long long)cin, w->name, (long long)w->dims[0], (long long)w->dims[1]);
    for (int i = 0; i < 2; i++)
        if (s[i] < 1 || dil[i] < 1 || op[i] < 0 || op[i] >= s[i])
            return unsup(im, "strides %lldx%lld, dilations %lldx%lld and output_padding %lldx%lld (psd's "
                         "output_padding is below the stride)", (long long)s[0], (long long)s[1], (long long)dil[0],
                         (long long)dil[1], (long long)op[0], (long long)op[1]);
    const int64_t cout = w->dims[1] * g;
    int xin = x->node;
    int pn = emit(im, "ConvTranspose2d", w->name, w->wn_g ? "weight_v" : "weight", NULL, 1, &xin);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "out_channels: %lld", (long long)cout);
    pair_attr(im, pn, "kernel_size", k);
    if (s[0] != 1 || s[1] != 1) pair_attr(im, pn, "stride", s);
    if (pad[0] || pad[1]) pair_attr(im, pn, "padding", pad);
    if (op[0] || op[1]) pair_attr(im, pn, "output_padding", op);
    if (dil[0] != 1 || dil[1] != 1) pair_attr(im, pn, "dilation", dil);
    if (g != 1) add_attr(im, pn, "groups: %lld", (long long)g);
    if ((rc = bind_weight(im, pn, w, 0))) return rc;
    if (b) {
        if (b->kind != VK_CONST || b->numel != cout) return bad(im, "bias '%s' does not fit", b->name);
        if ((rc = bind(im, pn, "bias", b, 0, 0))) return rc;
    } else {
        add_attr(im, pn, "bias: false");
        im->pn[pn].has_bias_attr = 1;
    }
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    od[1] = cout;
    for (int i = 0; i < 2; i++) {
        od[2 + i] = (x->dims[2 + i] - 1) * s[i] - 2 * pad[i] + dil[i] * (k[i] - 1) + op[i] + 1;
        if (od[2 + i] < 1) return bad(im, "the padding leaves no output");
    }
    return data_out(im, 0, pn, PS_ONNX_FLOAT, 4, od) ? PS_OK : im->err->code;
}

/* Resize over (N, C, H, W) as PyTorch 1.13 exports F.interpolate: psd's
 * Upsample. 'nearest' with nearest_mode floor and coordinate mode
 * asymmetric (PyTorch's nearest: floor(o / scale)); 'linear' with
 * half_pixel or pytorch_half_pixel (align_corners false) or align_corners.
 * scales [1, 1, sh, sw] (a scale_factor) or sizes [N, C, H', W'], constant. */
static ps_status h_resize(imp *im) {
    static const char *const known[] = {"coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
                                        "extrapolation_value", "mode", "nearest_mode", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if (x->kind == VK_DATA && x->ndim != 4)
        return unsup(im, "Resize of a rank-%d tensor (psd's Upsample resizes (N, C, H, W))", x->ndim);
    if ((rc = need_float(im, x, 3, 3, "input"))) return rc;
    const char *mode = attr_s(im, "mode", "nearest"), *ct = attr_s(im, "coordinate_transformation_mode", "half_pixel");
    const char *nm = attr_s(im, "nearest_mode", "round_prefer_floor");
    int bilinear, align = 0;
    if (!strcmp(mode, "nearest")) {
        if (strcmp(nm, "floor") || strcmp(ct, "asymmetric"))
            return unsup(im, "nearest Resize with nearest_mode '%s' and coordinate_transformation_mode '%s' (psd's is "
                         "PyTorch's 'nearest': floor and asymmetric)", nm, ct);
        bilinear = 0;
    } else if (!strcmp(mode, "linear")) {
        if (!strcmp(ct, "align_corners")) align = 1;
        else if (strcmp(ct, "half_pixel") && strcmp(ct, "pytorch_half_pixel"))
            return unsup(im, "linear Resize with coordinate_transformation_mode '%s' (psd's bilinear: half_pixel, "
                         "pytorch_half_pixel or align_corners)", ct);
        bilinear = 1;
    } else {
        return unsup(im, "Resize in mode '%s' (psd's Upsample: nearest and linear)", mode);
    }
    if (attr_i(im, "exclude_outside", 0)) return unsup(im, "exclude_outside");
    val *sc = has_in(im, 2) ? in_val(im, 2, 1) : NULL, *sz = has_in(im, 3) ? in_val(im, 3, 1) : NULL;
    if ((has_in(im, 2) && !sc) || (has_in(im, 3) && !sz)) return im->err->code;
    if (sc && sc->numel == 0) sc = NULL;   /* an empty scales beside sizes */
    if (!sc == !sz) return bad(im, "give scales or sizes, one of them");
    int pn = -1, xin = x->node;
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    if (sc) {
        if (sc->kind != VK_CONST) return unsup(im, "scales computed from the input's values");
        const double *f = cvals(im, sc);
        if (!f) return im->err->code;
        if (sc->numel != 4 || f[0] != 1 || f[1] != 1 || !(f[2] > 0) || !(f[3] > 0) || f[2] > 65536 || f[3] > 65536)
            return unsup(im, "scales other than [1, 1, sh, sw] with positive sh, sw");
        /* align_corners: ONNX divides by in * scale - 1 where PyTorch divides by the output size - 1 */
        for (int i = 0; align && i < 2; i++)
            if ((double)x->dims[2 + i] * f[2 + i] != floor((double)x->dims[2 + i] * f[2 + i]))
                return unsup(im, "align_corners with scale %g of size %lld (ONNX's scale there is not PyTorch's: "
                             "give sizes)", f[2 + i], (long long)x->dims[2 + i]);
        if ((pn = emit(im, "Upsample", NULL, NULL, NULL, 1, &xin)) < 0) return oom(im);
        if (f[2] == f[3]) add_attr(im, pn, "scale_factor: %.9g", f[2]);
        else add_attr(im, pn, "scale_factor: [%.9g, %.9g]", f[2], f[3]);
        for (int i = 0; i < 2; i++) od[2 + i] = (int64_t)floor((double)x->dims[2 + i] * f[2 + i]);
    } else {
        if (sz->kind != VK_CONST) return unsup(im, "sizes computed from the input's values");
        const int64_t *q = cints(im, sz);
        if (!q) return im->err->code;
        if (sz->numel != 4 || (q[0] != BATCH_SYM && q[0] != x->dims[0]) || q[1] != x->dims[1] || q[2] < 1 ||
            q[3] < 1 || q[2] > 65536 || q[3] > 65536)
            return unsup(im, "sizes other than [N, C, H', W'] (psd resizes H and W)");
        if ((pn = emit(im, "Upsample", NULL, NULL, NULL, 1, &xin)) < 0) return oom(im);
        if (q[2] == q[3]) add_attr(im, pn, "size: %lld", (long long)q[2]);
        else add_attr(im, pn, "size: [%lld, %lld]", (long long)q[2], (long long)q[3]);
        od[2] = q[2];
        od[3] = q[3];
    }
    if (od[2] < 1 || od[3] < 1) return bad(im, "an output of %lldx%lld", (long long)od[2], (long long)od[3]);
    if (bilinear && !strcmp(ct, "pytorch_half_pixel") && (od[2] == 1 || od[3] == 1))
        return unsup(im, "pytorch_half_pixel to a size of 1 (ONNX reads index 0 there, PyTorch's bilinear the "
                     "half-pixel centre: half_pixel's)");
    if (bilinear) add_attr(im, pn, "mode: bilinear");
    if (align) add_attr(im, pn, "align_corners: true");
    return data_out(im, 0, pn, PS_ONNX_FLOAT, 4, od) ? PS_OK : im->err->code;
}

/* GridSample (opset 16; PyTorch 1.13's export of F.grid_sample; F.affine_grid it does not export): x (N, C, H,
 * W) read at grid (N, H', W', 2) -> (N, C, H', W'), psd's GridSample. mode bilinear or nearest (opset 20's
 * 'linear' is bilinear), padding_mode zeros, border or reflection, align_corners. A constant grid (an
 * initializer, (1, H', W', 2)) is a Parameter: the same grid for every sample, learned as a module's own tensor
 * would be. */
static ps_status h_gridsample(imp *im) {
    static const char *const known[] = {"align_corners", "mode", "padding_mode", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    val *x = in_val(im, 0, 1), *g = in_val(im, 1, 1);
    if (!x || !g) return im->err->code;
    if (x->kind != VK_DATA) return unsup(im, "GridSample of a constant input");
    if (x->ndim != 4 || im->lead != 1)
        return unsup(im, "GridSample of a rank-%d input (psd's GridSample is the 2-d one: (N, C, H, W))", x->ndim);
    if ((rc = need_float(im, x, 3, 3, "input"))) return rc;
    const char *mode = attr_s(im, "mode", "bilinear"), *pad = attr_s(im, "padding_mode", "zeros");
    const int nearest = !strcmp(mode, "nearest");
    if (!nearest && strcmp(mode, "bilinear") && strcmp(mode, "linear"))
        return unsup(im, "GridSample in mode '%s' (psd's: bilinear and nearest)", mode);
    if (strcmp(pad, "zeros") && strcmp(pad, "border") && strcmp(pad, "reflection"))
        return unsup(im, "GridSample with padding_mode '%s'", pad);
    if (g->ndim != 4 || g->dims[3] != 2)
        return unsup(im, "GridSample with a rank-%d grid (psd's takes (N, H', W', 2))", g->ndim);
    int gn;
    if (g->kind == VK_CONST) {
        if (g->dims[0] != 1) return along_batch(im, "a constant grid");
        if ((gn = param_emit(im, g, x->node, g->dims, 4, g->dims + 1, 3, &rc)) < 0) return rc;
    } else {
        if ((rc = need_float(im, g, 3, 3, "grid"))) return rc;
        gn = g->node;
    }
    int ins[2] = {x->node, gn};
    int pn = emit(im, "GridSample", NULL, NULL, NULL, 2, ins);
    if (pn < 0) return oom(im);
    if (nearest) add_attr(im, pn, "mode: nearest");
    if (strcmp(pad, "zeros")) add_attr(im, pn, "padding_mode: %s", pad);
    if (attr_i(im, "align_corners", 0)) add_attr(im, pn, "align_corners: true");
    const int64_t od[4] = {x->dims[0], x->dims[1], g->dims[1], g->dims[2]};
    return data_out(im, 0, pn, PS_ONNX_FLOAT, 4, od) ? PS_OK : im->err->code;
}

typedef struct op_row {
    const char *op;
    ps_status (*fn)(imp *im);
    int min_opset;              /* the first opset whose meaning the handler reads */
} op_row;

static int producer_of(imp *im, const char *name);
static int sole_consumer(imp *im, const char *name);

/* A channel shuffle as exporters write torchvision's channel_shuffle (and
 * nn.ChannelShuffle): x (N, C, H, W) Reshape to (N, g, C/g, H, W),
 * Transpose perm [0, 2, 1, 3, 4], Reshape to (N, C, H, W). At the
 * Transpose: a ChannelShuffle of groups g reading x; its output stands for
 * the transposed value, which only that last Reshape may read (it becomes
 * the ChannelShuffle's output; the first Reshape is left unread). 0: not
 * that pattern. */
static int channel_shuffle_pattern(imp *im, val *x, const int64_t *perm, int np, ps_status *rc) {
    static const int64_t want[5] = {0, 2, 1, 3, 4};
    const ps_onnx_node *n = cur_node(im);
    if (x->kind != VK_DATA || im->lead != 1 || x->ndim != 5 || np != 5 || memcmp(perm, want, sizeof want) ||
        n->nout < 1)
        return 0;
    int r = producer_of(im, n->in[0]), c = sole_consumer(im, n->out[0]);
    if (r < 0 || c < 0 || strcmp(im->m->nodes[r].op_type, "Reshape") || strcmp(im->m->nodes[c].op_type, "Reshape"))
        return 0;
    val *src = vget(im, im->m->nodes[r].in[0]);
    if (!src || src->kind != VK_DATA || src->ndim != 4 || src->dims[1] != x->dims[1] * x->dims[2] ||
        src->dims[2] != x->dims[3] || src->dims[3] != x->dims[4])
        return 0;
    int in = src->node;
    int pn = emit(im, "ChannelShuffle", NULL, NULL, "channel_shuffle", 1, &in);
    if (pn < 0) { *rc = oom(im); return 1; }
    add_attr(im, pn, "groups: %lld", (long long)x->dims[1]);
    int64_t od[5] = {x->dims[0], x->dims[2], x->dims[1], x->dims[3], x->dims[4]};
    val *v = data_out(im, 0, pn, PS_ONNX_FLOAT, 5, od);
    if (!v) { *rc = im->err->code; return 1; }
    v->shuffled = 1;
    *rc = PS_OK;
    return 1;
}

/* Transpose of a computed value (convnext's permutes, x.permute(0, 2, 3,
 * 1)): a Permute, the leading (batch) dims kept where they are. */
static ps_status transpose_data(imp *im, val *x, const int64_t *perm, int np) {
    ps_status rc = need_float(im, x, 0, PS_MAXD, "input");
    if (rc) return rc;
    int64_t p[MAXD], od[MAXD], dims[PS_MAXD + 1];
    int seen[MAXD] = {0};
    if (np > x->ndim || (np >= 0 && np != x->ndim)) return bad(im, "perm has %d entries for a tensor of rank %d", np,
                                                              x->ndim);
    for (int k = 0; k < x->ndim; k++) {   /* absent: the dims reversed */
        p[k] = np < 0 ? x->ndim - 1 - k : perm[k];
        if (p[k] < 0) p[k] += x->ndim;
        if (p[k] < 0 || p[k] >= x->ndim || seen[p[k]]++) return bad(im, "perm is not a permutation of 0..%d",
                                                                  x->ndim - 1);
        od[k] = x->dims[p[k]];
    }
    for (int k = 0; k < im->lead; k++)
        if (p[k] != k) return along_batch(im, "Transpose");
    dims[0] = 0;   /* PyTorch's dims: the batch, then the per-sample ones */
    for (int k = im->lead; k < x->ndim; k++) dims[k - im->lead + 1] = p[k] - im->lead + 1;
    int xin = x->node;
    int pn = emit(im, "Permute", NULL, NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    char b[128];
    add_attr(im, pn, "dims: %s", dims_text(dims, x->ndim - im->lead + 1, b, sizeof b));
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, od) ? PS_OK : im->err->code;
}

/* Transpose of a 2-D initializer (PyTorch's training-mode export of
 * nn.Linear on 3-D input: MatMul(x, Transpose(weight))): the same tensor,
 * read transposed where it is bound. Of a computed value: a channel
 * shuffle's (above) is a ChannelShuffle, any other a Permute. */
/* Transpose of a computed constant (the exporters' shape arithmetic: PyTorch's reflect padding turns its
 * (axis, side) pads into ONNX's order with one): folded. perm absent (np < 0): the axes reversed. */
static ps_status transpose_const(imp *im, val *x, const int64_t *perm, int np) {
    const int r = x->ndim;
    int64_t p[MAXD], od[MAXD], str[MAXD];
    if (np >= 0 && np != r) return bad(im, "perm of %d axes for a rank-%d value", np, r);
    int seen[MAXD] = {0};
    for (int a = 0; a < r; a++) {
        p[a] = np < 0 ? r - 1 - a : perm[a];
        if (p[a] < 0 || p[a] >= r || seen[p[a]]++) return bad(im, "perm is not a permutation of %d axes", r);
        od[a] = x->dims[p[a]];
    }
    for (int a = r - 1, m = 1; a >= 0; a--) { str[a] = m; m *= (int)x->dims[a]; }
    const double *xf = cvals(im, x);
    if (!xf) return im->err->code;
    int64_t total = x->numel;
    double *f = palloc(&im->mem, (size_t)(total ? total : 1) * sizeof *f);
    if (!f) return oom(im);
    for (int64_t i = 0; i < total; i++) {
        int64_t rem = i, src = 0;
        for (int a = r - 1; a >= 0; a--) {
            src += (rem % od[a]) * str[p[a]];
            rem /= od[a];
        }
        f[i] = xf[src];
    }
    return const_out(im, 0, r, od, f, x->is_int) ? PS_OK : im->err->code;
}

/* ---- DepthToSpace and SpaceToDepth (nn.PixelShuffle's export, super-resolution nets): Reshapes and Permutes of
 * at most 4 per-sample dims, as psd-export writes nn.PixelShuffle ---- */

/* A Reshape of psd node in to the per-sample shape[n], then (np > 0) a Permute of the per-sample dims by perm[np]:
 * the last node, or -1 (err set). */
static int view_perm(imp *im, int in, const int64_t *shape, int n, const int *perm, int np) {
    char b[128];
    int pn = emit(im, "Reshape", NULL, NULL, "view", 1, &in);
    if (pn < 0) return oom(im), -1;
    add_attr(im, pn, "shape: %s", dims_text(shape, n, b, sizeof b));
    if (np <= 0) return pn;
    int64_t dims[PS_MAXD + 1] = {0};
    for (int k = 0; k < np; k++) dims[k + 1] = perm[k] + 1;
    int pp = emit(im, "Permute", NULL, NULL, "permute", 1, &pn);
    if (pp < 0) return oom(im), -1;
    add_attr(im, pp, "dims: %s", dims_text(dims, np + 1, b, sizeof b));
    return pp;
}

/* x (N, C, H, W) and the blocksize attribute, checked: *r, or an error. */
static ps_status space_depth_in(imp *im, val **x, int64_t *r) {
    static const char *const known[] = {"blocksize", "mode", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    if (all_const(im)) return unsup(im, "%s of a constant", cur_node(im)->op_type);
    if (!(*x = in_val(im, 0, 1))) return im->err->code;
    if ((rc = need_float(im, *x, 0, PS_MAXD, "input"))) return rc;
    if (!attr(im, "blocksize")) return bad(im, "no blocksize");
    *r = attr_i(im, "blocksize", 0);
    if (*r < 1 || *r > 4096) return bad(im, "blocksize %lld", (long long)*r);
    if ((*x)->ndim != 4 || im->lead != 1 || im->whole)
        return unsup(im, "input of rank %d (psd reads (N, C, H, W) with the batch first)", (*x)->ndim);
    return PS_OK;
}

/* DepthToSpace: mode CRD (PyTorch's pixel_shuffle: out[c, h r + i, w r + j] = in[c r^2 + i r + j, h, w]) or DCR
 * (ONNX's default: in[(i r + j) C' + c, h, w]). */
static ps_status h_depth_to_space(imp *im) {
    val *x;
    int64_t r;
    ps_status rc = space_depth_in(im, &x, &r);
    if (rc) return rc;
    const char *mode = attr_s(im, "mode", "DCR");
    const int crd = !strcmp(mode, "CRD");
    if (!crd && strcmp(mode, "DCR")) return unsup(im, "mode '%s' (ONNX's are DCR and CRD)", mode);
    const int64_t C = x->dims[1], H = x->dims[2], W = x->dims[3];
    if (C % (r * r)) return bad(im, "%lld channels are not a multiple of blocksize^2 = %lld", (long long)C,
                                (long long)(r * r));
    const int64_t c = C / (r * r);
    static const int p0231[4] = {0, 2, 3, 1}, p0213[4] = {0, 2, 1, 3}, p1203[4] = {1, 2, 0, 3};
    int in = x->node;
    if (crd) {   /* (c r + i, j, h, w) -> (c r + i, h, w, j); (c, i, h, w') -> (c, h, i, w') */
        const int64_t a[4] = {c * r, r, H, W}, b[4] = {c, r, H, W * r};
        if ((in = view_perm(im, in, a, 4, p0231, 4)) < 0 || (in = view_perm(im, in, b, 4, p0213, 4)) < 0)
            return im->err->code;
    } else {     /* (i, j, c h, w) -> (i, c h, w, j); (i, c, h, w') -> (c, h, i, w') */
        const int64_t a[4] = {r, r, c * H, W}, b[4] = {r, c, H, W * r};
        if ((in = view_perm(im, in, a, 4, p0231, 4)) < 0 || (in = view_perm(im, in, b, 4, p1203, 4)) < 0)
            return im->err->code;
    }
    const int64_t o[3] = {c, H * r, W * r};
    if ((in = view_perm(im, in, o, 3, NULL, 0)) < 0) return im->err->code;
    const int64_t od[4] = {x->dims[0], c, H * r, W * r};
    return data_out(im, 0, in, PS_ONNX_FLOAT, 4, od) ? PS_OK : im->err->code;
}

/* SpaceToDepth: out[(i r + j) C + c, h, w] = in[c, h r + i, w r + j] (DepthToSpace DCR's inverse; PyTorch writes
 * pixel_unshuffle as Reshapes and a Transpose instead). */
static ps_status h_space_to_depth(imp *im) {
    val *x;
    int64_t r;
    ps_status rc = space_depth_in(im, &x, &r);
    if (rc) return rc;
    if (attr(im, "mode")) return unsup(im, "a mode attribute (SpaceToDepth has none)");
    const int64_t C = x->dims[1], H = x->dims[2] / r, W = x->dims[3] / r;
    if (x->dims[2] % r || x->dims[3] % r)
        return bad(im, "%lldx%lld is not a multiple of blocksize %lld", (long long)x->dims[2], (long long)x->dims[3],
                   (long long)r);
    static const int p2013[4] = {2, 0, 1, 3}, p021[3] = {0, 2, 1};
    const int64_t a[4] = {C, H, r, W * r}, b[3] = {r, C * H * W, r}, o[3] = {r * r * C, H, W};
    int in = x->node;   /* (c, h, i, w') -> (i, c, h, w'); (i, c h w, j) -> (i, j, c h w) */
    if ((in = view_perm(im, in, a, 4, p2013, 4)) < 0 || (in = view_perm(im, in, b, 3, p021, 3)) < 0 ||
        (in = view_perm(im, in, o, 3, NULL, 0)) < 0)
        return im->err->code;
    const int64_t od[4] = {x->dims[0], r * r * C, H, W};
    return data_out(im, 0, in, PS_ONNX_FLOAT, 4, od) ? PS_OK : im->err->code;
}

static ps_status h_transpose(imp *im) {
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    int64_t perm[MAXD];
    int np = attr_ints(im, "perm", perm, MAXD);
    ps_status rc;
    if (channel_shuffle_pattern(im, x, perm, np, &rc)) return rc;
    if (x->kind == VK_DATA) return transpose_data(im, x, perm, np);
    if (x->kind == VK_CONST && !x->init) return transpose_const(im, x, perm, np);
    if (x->kind != VK_CONST || !x->t || !x->init || x->ndim != 2 || (np >= 0 && (np != 2 || perm[0] != 1 ||
                                                                                  perm[1] != 0)))
        return unsup(im, "Transpose of a constant other than a 2-D initializer (psd reads it as a transposed "
                     "weight)");
    const ps_onnx_node *n = cur_node(im);
    if (n->nout < 1) return bad(im, "no output");
    val *v = vmake(im, n->out[0]);
    if (!v) return oom(im);
    set_const_tensor(v, x->t, 1);
    v->tpose = !x->tpose;
    v->dims[0] = x->dims[1];
    v->dims[1] = x->dims[0];
    x->bound = 1;   /* read through the transpose only */
    return PS_OK;
}

/* The current Slice's starts, ends, axes and steps into sv[0..3] (cnt[k]:
 * how many, -1 when absent): attributes before opset 10 (no steps), the
 * constant inputs 1-4 from then on. Read by slice_args and h_slice. */
static ps_status slice_lists(imp *im, int64_t sv[4][MAXD], int cnt[4]) {
    static const char *const known[] = {"starts", "ends", "axes", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    for (int k = 0; k < 4; k++) cnt[k] = -1;
    if (im->opset < 10) {
        static const char *const names[3] = {"starts", "ends", "axes"};
        for (int k = 0; k < 3; k++) cnt[k] = attr_ints(im, names[k], sv[k], MAXD);
        return PS_OK;
    }
    for (int k = 0; k < 4; k++) {
        if (!has_in(im, k + 1)) continue;
        val *c = in_val(im, k + 1, 1);
        if (!c) return im->err->code;
        if (c->kind != VK_CONST) return unsup(im, "%s computed from the input's values",
                                               k == 0 ? "starts" : k == 1 ? "ends" : k == 2 ? "axes" : "steps");
        const int64_t *q = cints(im, c);
        if (!q) return im->err->code;
        if (c->numel > MAXD) return bad(im, "%lld slice entries", (long long)c->numel);
        cnt[k] = (int)c->numel;
        for (int i = 0; i < cnt[k]; i++) sv[k][i] = q[i];
    }
    return PS_OK;
}

/* The Slice being converted read as one axis (normalised for rank r), step 1, [*st, *en) of that axis's
 * dims[axis] elements (clamped; not empty); the data input is not read. */
static ps_status slice_args(imp *im, const int64_t *dims, int r, int *axis, int64_t *st, int64_t *en) {
    ps_status rc;
    int64_t sv[4][MAXD];      /* starts, ends, axes, steps */
    int cnt[4];
    if ((rc = slice_lists(im, sv, cnt))) return rc;
    if (cnt[0] != 1 || cnt[1] != 1 || (cnt[2] >= 0 && cnt[2] != 1) || (cnt[3] >= 0 && (cnt[3] != 1 || sv[3][0] != 1)))
        return unsup(im, "a Slice other than along one axis with step 1");
    int a = norm_axis(im, cnt[2] == 1 ? sv[2][0] : 0, r, "axis");
    if (a < 0) return im->err->code;
    int64_t D = dims[a], s0 = sv[0][0], e0 = sv[1][0];
    if (s0 < 0) s0 += D;
    if (e0 < 0) e0 += D;
    s0 = s0 < 0 ? 0 : s0 > D ? D : s0;
    e0 = e0 < 0 ? 0 : e0 > D ? D : e0;
    if (e0 <= s0) return unsup(im, "an empty Slice (%lld to %lld of %lld)", (long long)s0, (long long)e0, (long long)D);
    *axis = a;
    *st = s0;
    *en = e0;
    return PS_OK;
}

/* Slice of a constant (minGPT's causal mask self.bias[:, :, :T, :T]; PyTorch's reflect padding reverses its
 * pads by a step of -1): folded, any axes and nonzero steps, starts and ends clamped as ONNX's. */
static ps_status slice_const(imp *im, val *x) {
    int64_t sv[4][MAXD];      /* starts, ends, axes, steps */
    int cnt[4];
    ps_status rc = slice_lists(im, sv, cnt);
    if (rc) return rc;
    const int r = x->ndim;
    if (cnt[0] < 0 || cnt[1] != cnt[0] || (cnt[2] >= 0 && cnt[2] != cnt[0]) || (cnt[3] >= 0 && cnt[3] != cnt[0]))
        return bad(im, "starts, ends, axes and steps of different lengths");
    int64_t st[MAXD], step[MAXD], od[MAXD];
    for (int a = 0; a < r; a++) { st[a] = 0; step[a] = 1; od[a] = x->dims[a]; }
    int seen[MAXD] = {0};
    for (int i = 0; i < cnt[0]; i++) {
        int a = norm_axis(im, cnt[2] >= 0 ? sv[2][i] : i, r, "axis");
        if (a < 0) return im->err->code;
        if (seen[a]++) return bad(im, "axis %d twice", a);
        int64_t D = x->dims[a], s0 = sv[0][i], e0 = sv[1][i], k = cnt[3] >= 0 ? sv[3][i] : 1;
        if (k == 0) return bad(im, "a step of 0");
        if (s0 < 0) s0 = s0 < -D ? -1 : s0 + D;
        if (e0 < 0) e0 = e0 < -D ? -1 : e0 + D;
        if (k > 0) {
            s0 = s0 < 0 ? 0 : s0 > D ? D : s0;
            e0 = e0 < 0 ? 0 : e0 > D ? D : e0;
            od[a] = e0 > s0 ? (e0 - s0 + k - 1) / k : 0;
        } else {
            s0 = s0 < 0 ? -1 : s0 > D - 1 ? D - 1 : s0;
            e0 = e0 < -1 ? -1 : e0 > D - 1 ? D - 1 : e0;
            od[a] = s0 > e0 ? (s0 - e0 + (-k) - 1) / (-k) : 0;
        }
        st[a] = s0;
        step[a] = k;
    }
    const double *xf = cvals(im, x);
    if (!xf) return im->err->code;
    int64_t total = prod(od, r), str[MAXD];
    for (int a = r - 1, m = 1; a >= 0; a--) { str[a] = m; m *= (int)x->dims[a]; }
    if (total > FOLD_MAX) return unsup(im, "folding a Slice of %lld values", (long long)total);
    double *f = palloc(&im->mem, (size_t)(total ? total : 1) * sizeof *f);
    if (!f) return oom(im);
    for (int64_t i = 0; i < total; i++) {
        int64_t rem = i, src = 0;
        for (int a = r - 1; a >= 0; a--) {
            int64_t j = rem % od[a];
            rem /= od[a];
            src += (st[a] + j * step[a]) * str[a];
        }
        f[i] = xf[src];
    }
    return const_out(im, 0, r, od, f, x->is_int) ? PS_OK : im->err->code;
}

/* Slice of a computed value by constants (x.chunk and x.split's pieces,
 * x[:, a:b], swin's x[..., 0::2, 1::2, :]): a Narrow per axis it cuts,
 * with its step (1 or more; starts and ends clamped as ONNX's, negatives
 * from the end); an axis taken whole is no node. */
static ps_status h_slice(imp *im) {
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if (x->kind == VK_CONST) return slice_const(im, x);
    if (x->kind != VK_DATA) return unsup(im, "Slice of a constant");
    ps_status rc = need_float(im, x, 1, PS_MAXD, "input");
    if (rc) return rc;
    int64_t sv[4][MAXD];      /* starts, ends, axes, steps */
    int cnt[4];
    if ((rc = slice_lists(im, sv, cnt))) return rc;
    int ne = cnt[0];
    if (ne < 1 || cnt[1] != ne || (cnt[2] >= 0 && cnt[2] != ne) || (cnt[3] >= 0 && cnt[3] != ne))
        return bad(im, "starts, ends, axes and steps of different lengths");
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    int cur = x->node, seen[MAXD] = {0}, pn = -1;
    for (int k = 0; k < ne; k++) {
        int a = norm_axis(im, cnt[2] >= 0 ? sv[2][k] : k, x->ndim, "axis");
        if (a < 0) return im->err->code;
        if (seen[a]++) return bad(im, "axis %d sliced twice", a);
        int64_t D = x->dims[a], st = cnt[3] >= 0 ? sv[3][k] : 1, s0 = sv[0][k], e0 = sv[1][k];
        if (st == -1) {   /* torch.flip's export: the whole axis backwards (start clamped to D - 1, end to -1) */
            s0 = s0 < 0 ? s0 + D : s0;
            e0 = e0 < 0 ? e0 + D : e0;
            s0 = s0 < 0 ? 0 : s0 > D - 1 ? D - 1 : s0;
            e0 = e0 < -1 ? -1 : e0 > D - 1 ? D - 1 : e0;
            if (s0 != D - 1 || e0 != -1)
                return unsup(im, "a Slice with step -1 over %lld to %lld of %lld (psd reverses whole axes: Flip)",
                             (long long)s0, (long long)e0, (long long)D);
            int d = pt_dim(im, a);
            if (d < 0) return along_batch(im, "Slice");
            if ((pn = emit(im, "Flip", NULL, NULL, NULL, 1, &cur)) < 0) return oom(im);
            add_attr(im, pn, "dims: [%d]", d);
            cur = pn;
            continue;
        }
        if (st < 1)
            return unsup(im, "a Slice with step %lld (psd steps forward: 1 or more, or -1 over a whole axis)",
                         (long long)st);
        if (s0 < 0) s0 += D;
        if (e0 < 0) e0 += D;
        s0 = s0 < 0 ? 0 : s0 > D ? D : s0;
        e0 = e0 < 0 ? 0 : e0 > D ? D : e0;
        if (e0 <= s0)
            return unsup(im, "an empty Slice (%lld to %lld of %lld)", (long long)s0, (long long)e0, (long long)D);
        int64_t len = (e0 - s0 + st - 1) / st;
        if (s0 == 0 && len == D) continue;     /* the whole axis */
        int d = pt_dim(im, a);
        if (d < 0) return along_batch(im, "Slice");
        if ((pn = emit(im, "Narrow", NULL, NULL, NULL, 1, &cur)) < 0) return oom(im);
        add_attr(im, pn, "dim: %d, start: %lld, length: %lld", d, (long long)s0, (long long)len);
        if (st != 1) add_attr(im, pn, "step: %lld", (long long)st);
        od[a] = len;
        cur = pn;
    }
    if (pn < 0) return alias_out(im, 0, x);   /* every axis whole: the value itself */
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, od) ? PS_OK : im->err->code;
}

/* Pad of a computed value in 'constant' mode (a zero Pad before an
 * AveragePool or a Conv is their padding, absorbed before), 'reflect' or
 * 'edge' (PyTorch's reflect and replicate padding): psd's Pad, ONNX's pads
 * [begin per axis..., end per axis...] as F.pad's (before, after) pairs
 * from the last axis back; the batch's must be 0. */
static ps_status h_pad(imp *im) {
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if (x->kind != VK_DATA) return unsup(im, "Pad of a constant");
    ps_status rc = need_float(im, x, 1, PS_MAXD, "input");
    if (rc) return rc;
    static const char *const known10[] = {"mode", "pads", "value", NULL}, *const known[] = {"mode", NULL};
    if ((rc = only_attrs(im, im->opset < 11 ? known10 : known))) return rc;   /* inputs from opset 11 */
    const ps_onnx_attr *ma = attr(im, "mode");
    const char *mode = ma && ma->s ? ma->s : "constant";
    const char *psd_mode = !strcmp(mode, "constant") ? NULL : !strcmp(mode, "reflect") ? "reflect"
                         : !strcmp(mode, "edge") ? "replicate" : "";
    if (psd_mode && !*psd_mode)
        return unsup(im, "Pad in mode '%s' (psd pads in modes constant, reflect and edge)", mode);
    int64_t p[2 * MAXD];
    int np;
    double value = 0;
    if (im->opset < 11) {
        np = attr_ints(im, "pads", p, 2 * MAXD);
        value = attr_f(im, "value", 0.0f);
    } else {
        val *pv = in_val(im, 1, 1);
        if (!pv) return im->err->code;
        if (pv->kind != VK_CONST) return unsup(im, "pads computed from the input's values");
        const int64_t *q = cints(im, pv);
        if (!q) return im->err->code;
        if (pv->numel > 2 * MAXD) return bad(im, "%lld pads", (long long)pv->numel);
        np = (int)pv->numel;
        for (int i = 0; i < np; i++) p[i] = q[i];
        if (has_in(im, 2)) {
            val *cv = in_val(im, 2, 1);
            if (!cv) return im->err->code;
            const double *f = cv->kind == VK_CONST && cv->numel == 1 ? cvals(im, cv) : NULL;
            if (!f) return cv->kind == VK_CONST && cv->numel == 1 ? im->err->code
                                                                  : unsup(im, "a constant_value that is no number");
            value = f[0];
        }
    }
    int r = x->ndim;
    if (np != 2 * r) return bad(im, "%d pads for a tensor of rank %d (2 per axis)", np, r);
    int first = -1;      /* the outermost padded axis */
    for (int a = 0; a < r; a++) {
        if (p[a] < 0 || p[a + r] < 0) return unsup(im, "negative pads (a crop)");
        if ((p[a] || p[a + r]) && first < 0) first = a;
    }
    if (first < 0) return alias_out(im, 0, x);
    if (pt_dim(im, first) < 0) return along_batch(im, "Pad");
    char list[256];
    size_t o = 0;
    int64_t od[MAXD];
    memcpy(od, x->dims, sizeof od);
    for (int a = r - 1; a >= first; a--) {
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%lld, %lld", a == r - 1 ? "" : ", ", (long long)p[a],
                              (long long)p[a + r]);
        od[a] += p[a] + p[a + r];
    }
    int in = x->node;
    int pn = emit(im, "Pad", NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "pad: [%s]", list);
    char vb[32];
    if (value != 0 && !psd_mode) add_attr(im, pn, "value: %s", float_text(value, vb, sizeof vb));
    if (psd_mode) add_attr(im, pn, "mode: %s", psd_mode);
    return data_out(im, 0, pn, PS_ONNX_FLOAT, r, od) ? PS_OK : im->err->code;
}

/* Squeeze / Unsqueeze of a computed value: a Reshape (axes an input from
 * opset 13, an attribute before); the batch stays where it is. */
static ps_status h_squeeze(imp *im) {
    if (all_const(im)) return fold(im);
    int unsq = !strcmp(cur_node(im)->op_type, "Unsqueeze");
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if (x->lstm_out == 1 && !unsq) {   /* an LSTM's Y (seq, 1, batch, H) without its direction axis */
        int64_t ax[1] = {1};
        int na = has_in(im, 1) ? -1 : attr_ints(im, "axes", ax, 1);
        if (has_in(im, 1)) {
            val *av = in_val(im, 1, 1);
            const int64_t *q = av && av->kind == VK_CONST && av->numel == 1 ? cints(im, av) : NULL;
            if (q) { ax[0] = q[0]; na = 1; }
        }
        if (na != 1 || (ax[0] != 1 && ax[0] != -3)) return unsup(im, "a Squeeze of an LSTM's output other than "
                                                               "its direction axis");
        int64_t od[3] = {x->dims[0], x->dims[2], x->dims[3]};
        val *y = data_out(im, 0, -1, PS_ONNX_FLOAT, 3, od);
        if (!y) return im->err->code;
        y->lstm_out = 2;
        im->lstm.last_out = y->name;
        return PS_OK;
    }
    ps_status rc = need_float(im, x, 0, PS_MAXD, "input");
    if (rc) return rc;
    int64_t axes[MAXD];
    int na;
    if (im->opset >= 13 && has_in(im, 1)) {
        val *av = in_val(im, 1, 1);
        if (!av) return im->err->code;
        if (av->kind != VK_CONST) return unsup(im, "axes computed from the input");
        const int64_t *q = cints(im, av);
        if (!q) return im->err->code;
        if (av->numel > MAXD) return unsup(im, "%lld axes", (long long)av->numel);
        na = (int)av->numel;
        for (int i = 0; i < na; i++) axes[i] = q[i];
    } else {
        na = attr_ints(im, "axes", axes, MAXD);
    }
    int64_t od[MAXD];
    int nd = 0, r = unsq ? x->ndim + (na < 0 ? 0 : na) : x->ndim;
    if (unsq && (na < 0 || r > MAXD)) return unsup(im, "Unsqueeze to rank %d", r);
    int mark[MAXD] = {0};
    for (int i = 0; i < (na < 0 ? 0 : na); i++) {
        int a = norm_axis(im, axes[i], r, "axis");
        if (a < 0) return im->err->code;
        mark[a] = 1;
    }
    for (int i = 0, k = 0; i < r; i++) {
        if (unsq) {
            od[nd++] = mark[i] ? 1 : x->dims[k++];
            if (mark[i] && pt_dim(im, i) < 0) return along_batch(im, "Unsqueeze");
        } else if ((na < 0 && x->dims[i] == 1) || mark[i]) {
            if (x->dims[i] != 1) return bad(im, "axis %d has size %lld, not 1", i, (long long)x->dims[i]);
            if (pt_dim(im, i) < 0) return along_batch(im, "Squeeze");
        } else {
            od[nd++] = x->dims[i];
        }
    }
    int off = im->lead;
    if (nd - off < 1) return unsup(im, "a scalar per sample");
    if (nd - off > PS_MAXD) return unsup(im, "more than %d dimensions per sample", PS_MAXD);
    int xin = x->node;
    int pn = emit(im, "Reshape", NULL, NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    char b[128];
    add_attr(im, pn, "shape: %s", dims_text(od + off, nd - off, b, sizeof b));
    return data_out(im, 0, pn, PS_ONNX_FLOAT, nd, od) ? PS_OK : im->err->code;
}

/* Cast: folded on constants; on a computed value only to its own type
 * (PyTorch exports x.to(device) and x.float() of a float as a Cast). */
static ps_status h_cast(imp *im) {
    if (all_const(im)) return fold(im);
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    int64_t to = attr_i(im, "to", 0);
    if (x->kind == VK_DATA && to == x->dtype) return alias_out(im, 0, x);
    if (x->kind == VK_DATA && x->dtype == PS_ONNX_BOOL && x->node >= 0 && to == PS_ONNX_FLOAT)   /* a comparison's */
        return data_out(im, 0, x->node, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;   /* 1/0 mask */
    if (x->kind == VK_DATA && x->dtype == PS_ONNX_FLOAT && x->node >= 0 && to == PS_ONNX_BOOL) {   /* m.bool() */
        int in = x->node;   /* m != 0: Abs, LessOrEqual 0 (m == 0), Where(that, 0, 1) - NaN true, as PyTorch's */
        if ((in = emit(im, "Abs", NULL, NULL, NULL, 1, &in)) < 0) return oom(im);
        if ((in = emit(im, "LessOrEqual", NULL, NULL, NULL, 1, &in)) < 0) return oom(im);
        add_attr(im, in, "value: 0.0");
        int pn = emit(im, "Where", NULL, NULL, NULL, 1, &in);
        if (pn < 0) return oom(im);
        add_attr(im, pn, "a: 0.0, b: 1.0");
        return data_out(im, 0, pn, PS_ONNX_BOOL, x->ndim, x->dims) ? PS_OK : im->err->code;
    }
    return unsup(im, "Cast of a computed %s value to %s (psd computes in float32; ids are int64)",
                 ps_onnx_dtype_name(x->dtype), ps_onnx_dtype_name((int32_t)to));
}

static ps_status h_fold_only(imp *im) {
    if (all_const(im)) return fold(im);
    return unsup(im, "%s of computed values (psd folds it only on constants)", cur_node(im)->op_type);
}

static int data_readers(imp *im, const char *v, int *out, int max);

/* ---- masks computed from the input (elem4): Equal of computed float values, Not of a comparison ---- */

/* Equal(a, c) of a computed float value and a number, or Equal(a, b) of two that broadcast (masked_fill(m == 0,
 * v) of a computed 1/0 m): |a - c| <= 0 - an AddConstant -c (none for 0) or a Sub, an Abs, a LessOrEqual 0: exactly
 * a == c (two floats differ iff their difference is not 0; NaN: 0), a 1/0 float mask marked bool as h_compare's. */
static ps_status equal_computed(imp *im) {
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    if (a->kind != VK_DATA && b->kind == VK_DATA) { val *t = a; a = b; b = t; }
    if (a->kind == VK_DATA && a->dtype != PS_ONNX_FLOAT)
        return unsup(im, "Equal of the computed %s value '%s' (psd compares float values, and reads ids == pad of the "
                     "int64 input ids as nn.MultiheadAttention's key_padding_mask)", ps_onnx_dtype_name(a->dtype),
                     a->name);
    ps_status rc;
    double c = 0.0;
    char f[40];
    if (a->kind == VK_DATA && b->kind == VK_DATA) {
        if ((rc = bcast_pair(im, a, b, "Sub", "comparing"))) return rc;
        a = vget(im, cur_node(im)->out[0]);
    } else if (a->kind != VK_DATA || !scalar_const(im, b, &c) || !isfinite(c)) {
        return unsup(im, "Equal of other than computed values and a finite number (psd compares a float tensor with a "
                     "number or two that broadcast; ids == pad as nn.MultiheadAttention's key_padding_mask)");
    }
    if ((rc = need_float(im, a, 0, PS_MAXD, "input"))) return rc;
    int in = a->node;
    if (c != 0.0) {
        if ((in = emit(im, "AddConstant", NULL, NULL, NULL, 1, &in)) < 0) return oom(im);
        add_attr(im, in, "value: %s", float_text(-c, f, sizeof f));
    }
    if ((in = emit(im, "Abs", NULL, NULL, NULL, 1, &in)) < 0) return oom(im);
    int pn = emit(im, "LessOrEqual", NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "value: 0.0");
    return data_out(im, 0, pn, PS_ONNX_BOOL, a->ndim, a->dims) ? PS_OK : im->err->code;
}

/* Not(mask) of a comparison's mask (~(g > 0.2), m != 1 as Not(Equal)): Where(mask, 0, 1), a mask again; of
 * constants folded. */
static ps_status h_not(imp *im) {
    if (all_const(im)) return fold(im);
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    if (x->kind != VK_DATA || x->dtype != PS_ONNX_BOOL || x->node < 0)
        return unsup(im, "Not of '%s': psd negates a comparison's mask (Greater, Less, ..., Equal of float values)",
                     x->name);
    int in = x->node;
    int pn = emit(im, "Where", NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "a: 0.0, b: 1.0");
    return data_out(im, 0, pn, PS_ONNX_BOOL, x->ndim, x->dims) ? PS_OK : im->err->code;
}

/* Equal of constants: folded. Equal(ids, pad) of the int64 ids and a constant integer that only
 * nn.MultiheadAttention key padding mask chains read (mha_kpm_match claimed it): an Eq node, psd's 1/0 float
 * mask, read as those attentions' second input. */
static ps_status h_equal(imp *im) {
    if (all_const(im)) return fold(im);
    int claimed = 0;
    for (int k = 0; k < im->nmha; k++) claimed |= im->mha[k].kpm_eq == im->cur && !im->mha[k].why[0];
    if (!claimed) return equal_computed(im);
    const char *out = out0(im, im->cur);
    int rd[8], nr = data_readers(im, out, rd, 8);
    for (int k = 0; k < nr; k++)
        if (k >= 8 || rd[k] < 0 || im->absorbed[rd[k]] != 2)
            return unsup(im, "'%s' (ids == pad) is read by %s besides nn.MultiheadAttention's key_padding_mask", out,
                         k < 8 && rd[k] >= 0 ? im->m->nodes[rd[k]].op_type : "the graph's output or more nodes");
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    val *ids = a->kind == VK_DATA ? a : b, *c = a->kind == VK_DATA ? b : a;
    double v = 0;
    if (ids->kind != VK_DATA || ids->dtype != PS_ONNX_INT64 || ids->node >= 0 || !scalar_const(im, c, &v) ||
        v != floor(v) || fabs(v) > 9007199254740992.0)
        return unsup(im, "key_padding_mask '%s': psd reads Equal of the model's int64 input ids and a constant "
                     "integer (ids == pad)", out);
    int in = ids->node;
    int pn = emit(im, "Eq", NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    add_attr(im, pn, "value: %lld", (long long)v);
    val *o = data_out(im, 0, pn, PS_ONNX_FLOAT, ids->ndim, ids->dims);
    if (!o) return im->err->code;
    o->kpm = 1;
    return PS_OK;
}

/* Where(cond, value, x) or Where(cond, x, value) with cond a constant and value a number: x.masked_fill (the
 * exporter's, minGPT's att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))), a MaskedFill when the
 * filled positions are a triangle of the last two dims (torch.triu or torch.tril of ones, the same matrix at
 * every leading index); of constants alone, folded. */
static ps_status where_computed(imp *im, val *c, val *a, val *b);

static ps_status h_where(imp *im) {
    if (all_const(im)) return fold(im);
    val *c = in_val(im, 0, 1), *a = in_val(im, 1, 1), *b = in_val(im, 2, 1);
    if (!c || !a || !b) return im->err->code;
    if (c->kind == VK_DATA) return where_computed(im, c, a, b);
    const int fill_a = b->kind == VK_DATA;   /* cond true: the value (masked_fill's form) */
    val *x = fill_a ? b : a, *v = fill_a ? a : b;
    if (c->kind != VK_CONST || x->kind != VK_DATA || v->kind != VK_CONST || v->numel != 1)
        return unsup(im, "Where other than masked_fill: a constant condition choosing between a number and a "
                     "computed value (psd's MaskedFill)");
    ps_status rc = need_float(im, x, 2, PS_MAXD, "the filled value");
    if (rc) return rc;
    const double *cf = cvals(im, c), *vf = cvals(im, v);
    if (!cf || !vf) return im->err->code;
    char b1[64], b2[64];
    const int64_t R = x->dims[x->ndim - 2], C = x->dims[x->ndim - 1];
    int ok = c->ndim >= 2 && c->ndim <= x->ndim && c->dims[c->ndim - 2] == R && c->dims[c->ndim - 1] == C;
    for (int k = 0; ok && k < c->ndim - 2; k++)
        ok = c->dims[k] == 1 || c->dims[k] == x->dims[x->ndim - c->ndim + k];
    if (!ok)
        return unsup(im, "masked_fill (Where): the condition '%s' is %s, not (..., %lld, %lld) broadcast over the "
                     "value's %s", c->name, dims_text(c->dims, c->ndim, b1, sizeof b1), (long long)R, (long long)C,
                     dims_text(x->dims, x->ndim, b2, sizeof b2));
    /* the filled positions of each matrix, all the same */
    const int64_t mats = c->numel / (R * C);
    for (int64_t t = 1; t < mats; t++)
        for (int64_t i = 0; i < R * C; i++)
            if ((cf[t * R * C + i] != 0) != (cf[i] != 0))
                return unsup(im, "masked_fill (Where): the condition '%s' differs between its matrices (psd's "
                             "MaskedFill fills one triangle of the last two dims)", c->name);
    for (int tri = 0; tri < 2; tri++)
        for (int64_t d = -R; d <= C; d++) {
            int same = 1;
            for (int64_t i = 0; same && i < R; i++)
                for (int64_t j = 0; same && j < C; j++) {
                    const int in = tri ? j - i <= d : j - i >= d, filled = (cf[i * C + j] != 0) == fill_a;
                    same = in == filled;
                }
            if (!same) continue;
            int xin = x->node;
            int pn = emit(im, "MaskedFill", NULL, NULL, NULL, 1, &xin);
            if (pn < 0) return oom(im);
            char f[40];
            add_attr(im, pn, "mask: %s, diagonal: %lld, value: %s", tri ? "tril" : "triu", (long long)d,
                     float_text(vf[0], f, sizeof f));
            return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
        }
    return unsup(im, "masked_fill (Where): the positions the condition '%s' fills are no triangle of the last two "
                 "dims (torch.triu or torch.tril of ones), which psd's MaskedFill takes", c->name);
}

/* ---- comparisons of a computed value with a number, and Where choosing by them ---- */

/* Greater, Less, GreaterOrEqual, LessOrEqual of a computed float value and a constant number (either side;
 * h > 0.5, 0.5 >= h), or of two computed values (as their difference against 0): psd's kind of that name, a 1/0 float mask marked bool here, so that only Where (and
 * a Cast to float) read it; of constants folded. */
static ps_status h_compare(imp *im) {
    if (all_const(im)) return fold(im);
    static const char *const mirror[][2] = {{"Greater", "Less"}, {"Less", "Greater"},
                                            {"GreaterOrEqual", "LessOrEqual"}, {"LessOrEqual", "GreaterOrEqual"}};
    const char *op = cur_node(im)->op_type, *kind = op;
    val *a = in_val(im, 0, 1), *b = in_val(im, 1, 1);
    if (!a || !b) return im->err->code;
    double c;
    if (a->kind != VK_DATA && b->kind == VK_DATA) {   /* c < h: h > c */
        val *t = a; a = b; b = t;
        for (size_t i = 0; i < sizeof mirror / sizeof mirror[0]; i++)
            if (!strcmp(op, mirror[i][0])) kind = mirror[i][1];
    }
    ps_status rc;
    if (a->kind == VK_DATA && b->kind == VK_DATA) {   /* a > b: a - b > 0 (two floats differ iff a - b != 0) */
        if ((rc = bcast_pair(im, a, b, "Sub", "comparing"))) return rc;
        a = vget(im, cur_node(im)->out[0]);
        c = 0.0;
    } else if (a->kind != VK_DATA || !scalar_const(im, b, &c)) {
        return unsup(im, "%s of other than computed values and a number (psd compares a tensor with a number, or "
                     "two that broadcast)", op);
    }
    if ((rc = need_float(im, a, 0, PS_MAXD, "input"))) return rc;
    int in = a->node;
    int pn = emit(im, kind, NULL, NULL, NULL, 1, &in);
    if (pn < 0) return oom(im);
    char f[40];
    add_attr(im, pn, "value: %s", float_text(c, f, sizeof f));
    return data_out(im, 0, pn, PS_ONNX_BOOL, a->ndim, a->dims) ? PS_OK : im->err->code;
}

/* r copies of psd node cur joined along psd dim d: one Concat of r, or (r > 64, Concat's most) Concats of
 * Concats, as psd-export's repeat_steps. Returns the node, or -1 (the error set). */
static int concat_copies(imp *im, int cur, int64_t r, int d) {
    int ins[64];
    int64_t n = r <= 64 ? r : 64;
    for (int64_t k = 0; k < n; k++) ins[k] = cur;
    int big = emit(im, "Concat", NULL, NULL, NULL, (int)n, ins);
    if (big < 0) { oom(im); return -1; }
    if (d != 1) add_attr(im, big, "dim: %d", d);
    if (r <= 64) return big;
    if (r / 64 > 1 && (big = concat_copies(im, big, r / 64, d)) < 0) return -1;
    if (r % 64 == 0) return big;
    ins[0] = big;
    for (int64_t k = 1; k <= r % 64; k++) ins[k] = cur;
    int pn = emit(im, "Concat", NULL, NULL, NULL, (int)(r % 64) + 1, ins);
    if (pn < 0) { oom(im); return -1; }
    if (d != 1) add_attr(im, pn, "dim: %d", d);
    return pn;
}

/* Where(cond, a, b) with cond a comparison's mask (h_compare) and a, b computed values or numbers (torch.where(h >
 * 0, h, 0.1 * h)): psd's Where, its inputs of one shape - a computed one that broadcasts (numpy's rule, one rank,
 * the batch dims equal) first repeated along its size-1 dims (concat_copies, as x.expand_as(y)). */
static ps_status where_computed(imp *im, val *c, val *a, val *b) {
    char b1[64], b2[64];
    if (c->dtype != PS_ONNX_BOOL || c->node < 0)
        return unsup(im, "Where of the computed condition '%s': psd takes a comparison of a computed value with a "
                     "number (Greater, Less, GreaterOrEqual, LessOrEqual) there", c->name);
    val *vs[3] = {c, a, b};
    int64_t od[MAXD];
    memcpy(od, c->dims, sizeof od);
    double num[2];
    for (int k = 1; k < 3; k++) {
        val *v = vs[k];
        if (v->kind == VK_DATA) {
            ps_status rc = need_float(im, v, 0, PS_MAXD, "input");
            if (rc) return rc;
            if (v->ndim != c->ndim)
                return unsup(im, "Where of the condition '%s' %s and '%s' %s: psd's Where broadcasts values of the "
                             "condition's rank", c->name, dims_text(c->dims, c->ndim, b1, sizeof b1), v->name,
                             dims_text(v->dims, v->ndim, b2, sizeof b2));
            for (int i = 0; i < c->ndim; i++) {
                if (v->dims[i] == od[i] || v->dims[i] == 1) continue;
                if (od[i] != 1)
                    return unsup(im, "Where of '%s' %s: dimension %d is %lld, where the others have %lld (psd "
                                 "broadcasts dimensions that are equal or 1)", v->name,
                                 dims_text(v->dims, v->ndim, b2, sizeof b2), i, (long long)v->dims[i],
                                 (long long)od[i]);
                od[i] = v->dims[i];
            }
        } else if (v->kind != VK_CONST || v->init || v->numel != 1 || !cvals(im, v) ||
                   isnan(num[k - 1] = cvals(im, v)[0])) {
            return unsup(im, "Where choosing '%s': psd takes a computed value or a number", v->name);
        }
    }
    int ins[3], nin = 0;
    for (int k = 0; k < 3; k++) {
        val *v = vs[k];
        if (v->kind != VK_DATA) continue;
        int cur = v->node;   /* -1: the graph's input itself */
        for (int i = 0; i < v->ndim; i++) {
            if (v->dims[i] == od[i]) continue;
            if (pt_dim(im, i) < 0) return along_batch(im, "a broadcast");
            if ((cur = concat_copies(im, cur, od[i], pt_dim(im, i))) < 0) return im->err->code;
        }
        ins[nin++] = cur;
    }
    int pn = emit(im, "Where", NULL, NULL, NULL, nin, ins);
    if (pn < 0) return oom(im);
    char f[40];
    for (int k = 1; k < 3; k++)
        if (vs[k]->kind != VK_DATA) add_attr(im, pn, "%s: %s", k == 2 ? "b" : "a", float_text(num[k - 1], f, sizeof f));
    return data_out(im, 0, pn, PS_ONNX_FLOAT, c->ndim, od) ? PS_OK : im->err->code;
}

/* ---- shrinks, thresholds, PReLU and RReLU ---- */

static int is_op(imp *im, int i, const char *op);
static const char *in0(imp *im, int i);

static ps_status h_celu(imp *im) { return alpha_act(im, 1.0f, "CELU", "alpha"); }
static ps_status h_softsign(imp *im) { return math_unary(im, "Softsign", NULL); }

/* Shrink(bias, lambd): x < -lambd ? x + bias : x > lambd ? x - bias : 0 - nn.Hardshrink at bias 0,
 * nn.Softshrink at bias lambd (PyTorch 1.13 itself writes both as Where subgraphs, which psd refuses) */
static ps_status h_shrink(imp *im) {
    static const char *const known[] = {"bias", "lambd", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    const float b = attr_f(im, "bias", 0.0f), l = attr_f(im, "lambd", 0.5f);
    char t[64], f[40];
    snprintf(t, sizeof t, "lambd: %s", float_text(l, f, sizeof f));
    if (b == 0.0f) return math_unary(im, "Hardshrink", t);
    if (b == l && l >= 0.0f) return math_unary(im, "Softshrink", t);
    return unsup(im, "Shrink with bias %g, lambd %g: psd's are Hardshrink (bias 0) and Softshrink (bias = lambd >= 0)",
                 b, l);
}

/* ThresholdedRelu(alpha): x > alpha ? x : 0, nn.Threshold(alpha, 0) */
static ps_status h_thresholded_relu(imp *im) {
    static const char *const known[] = {"alpha", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    char t[80], f[40];
    snprintf(t, sizeof t, "threshold: %s, value: 0.0", float_text(attr_f(im, "alpha", 1.0f), f, sizeof f));
    return math_unary(im, "Threshold", t);
}

/* RandomUniformLike(x) read by PRelu(x, .) alone: nn.RReLU in training as PyTorch exports it (h_prelu makes
 * the RReLU node); its output has no psd node */
static ps_status h_random_uniform_like(imp *im) {
    const ps_onnx_node *n = cur_node(im);
    const int c = sole_consumer(im, n->out[0]);
    if (!is_op(im, c, "PRelu") || im->m->nodes[c].nin < 2 || strcmp(im->m->nodes[c].in[1], n->out[0]) ||
        strcmp(in0(im, c), n->in[0]))
        return unsup(im, "RandomUniformLike other than nn.RReLU's (the slopes of PRelu of its own input): psd "
                     "draws no random tensors");
    val *v = vmake(im, n->out[0]);
    if (!v) return oom(im);
    v->kind = VK_VIRT;
    return PS_OK;
}

/* PRelu(x, slope): nn.PReLU as PyTorch exports it, slope = Unsqueeze(weight, axes) (or an initializer of
 * its own), one slope or one per channel (dim 1 of (N, C, ...), right-aligned as ONNX broadcasts it);
 * PRelu(x, RandomUniformLike(x, low, high)): nn.RReLU(low, high) */
static ps_status h_prelu(imp *im) {
    const ps_onnx_node *n = cur_node(im);
    if (n->nin < 2) return bad(im, "PRelu without a slope");
    val *x = in_val(im, 0, 1);
    if (!x) return im->err->code;
    ps_status rc = need_float(im, x, 0, PS_MAXD, "input");
    if (rc) return rc;
    int in = x->node, pn;
    const int u = producer_of(im, n->in[1]);
    if (is_op(im, u, "RandomUniformLike")) {
        const int save = im->cur;
        im->cur = u;
        const float lo = attr_f(im, "low", 0.0f), hi = attr_f(im, "high", 1.0f);
        im->cur = save;
        char t[96], a[40], b[40];
        snprintf(t, sizeof t, "lower: %s, upper: %s", float_text(lo, a, sizeof a), float_text(hi, b, sizeof b));
        if ((pn = emit(im, "RReLU", NULL, NULL, NULL, 1, &in)) < 0) return oom(im);
        add_attr(im, pn, "%s", t);
        return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
    }
    val *w = in_val(im, 1, 1);
    if (!w) return im->err->code;
    if (is_op(im, u, "Unsqueeze") && sole_consumer(im, n->in[1]) == im->cur) {   /* nn.PReLU's own weight */
        val *wi = vget(im, in0(im, u));
        if (wi && wi->kind == VK_CONST && wi->init) w = wi;
    }
    if (w->kind != VK_CONST)
        return unsup(im, "PRelu by a computed slope ('%s'): psd's PReLU learns its slopes", w->name);
    int64_t sd[MAXD];
    const int sn = sample_dims(im, x, sd);
    const int64_t k = w->numel ? w->numel : prod(w->dims, w->ndim);
    const val *shape = vget(im, n->in[1]);   /* the slope as PRelu reads it (the Unsqueeze's output) */
    int ok = k == 1;
    if (!ok && sn >= 1 && k == sd[0] && shape && shape->ndim <= sn) {   /* (C, 1, ...) facing (C, ...) */
        ok = shape->ndim == sn && shape->dims[0] == k;
        for (int d = 1; ok && d < shape->ndim; d++) ok = shape->dims[d] == 1;
    }
    if (!ok)
        return unsup(im, "PRelu slope '%s' of %lld values over '%s': psd's PReLU takes one slope or one per channel "
                     "(dim 1)", w->name, (long long)k, x->name);
    if ((pn = emit(im, "PReLU", w->name, "weight", NULL, 1, &in)) < 0) return oom(im);
    if (k > 1) add_attr(im, pn, "num_parameters: %lld", (long long)k);
    if ((rc = bind(im, pn, "weight", w, 0, k))) return rc;
    return data_out(im, 0, pn, PS_ONNX_FLOAT, x->ndim, x->dims) ? PS_OK : im->err->code;
}

static const op_row ops[] = {
    {"Conv", h_conv, 1},
    {"Gemm", h_gemm, 1},
    {"MatMul", h_matmul, 1},
    {"Relu", h_relu, 1},
    {"LeakyRelu", h_leaky, 1},
    {"Sigmoid", h_sigmoid, 1},
    {"Tanh", h_tanh, 1},
    {"Clip", h_clip, 6},
    {"Max", h_minmax, 1},
    {"Min", h_minmax, 1},
    {"HardSigmoid", h_hardsigmoid, 6},
    {"HardSwish", h_hardswish, 14},
    {"Softmax", h_softmax, 1},
    {"LogSoftmax", h_log_softmax, 1},
    {"Dropout", h_dropout, 1},
    {"Identity", h_identity, 1},
    {"Add", h_add, 1},
    {"Sub", h_sub, 1},
    {"Mul", h_mul, 1},
    {"Div", h_arith, 1},
    {"MaxPool", h_maxpool, 1},
    {"AveragePool", h_avgpool, 1},
    {"GlobalAveragePool", h_gap, 1},
    {"ReduceMean", h_reducemean, 1},
    {"ReduceSum", h_reducesum, 1},
    {"ReduceSumSquare", h_reducesumsquare, 1},
    {"ReduceL2", h_reducel2, 1},
    {"ReduceProd", h_reduceprod, 1},
    {"GlobalMaxPool", h_gmp, 1},
    {"ReduceMax", h_reducemax, 1},
    {"ReduceMin", h_reducemin, 1},
    {"ReduceLogSumExp", h_reducelogsumexp, 1},
    {"CumSum", h_cumsum, 11},
    {"BatchNormalization", h_batchnorm, 1},
    {"Flatten", h_flatten, 1},
    {"Reshape", h_reshape, 1},
    {"Split", h_split, 2},
    {"Expand", h_expand, 8},
    {"Concat", h_concat, 1},
    {"Gather", h_gather, 1},
    {"LayerNormalization", h_layernorm, 17},
    {"Constant", h_constant, 1},
    {"Shape", h_shape, 1},
    {"Cast", h_cast, 1},
    {"Transpose", h_transpose, 1},
    {"Slice", h_slice, 1},
    {"Pad", h_pad, 1},
    {"LSTM", h_lstm, 7},
    {"Unsqueeze", h_squeeze, 1},
    {"Squeeze", h_squeeze, 1},
    {"Sqrt", h_sqrt, 1},
    {"Neg", h_neg, 1},
    /* elementwise math */
    {"Exp", h_exp, 1},
    {"Log", h_log, 1},
    {"Abs", h_abs, 1},
    {"Reciprocal", h_reciprocal, 1},
    {"Pow", h_pow, 1},
    {"Elu", h_elu, 1},
    {"Selu", h_selu, 1},
    {"Softplus", h_softplus, 1},
    /* shrinks, thresholds, PReLU, RReLU (PRelu of RandomUniformLike) */
    {"Celu", h_celu, 12},
    {"Softsign", h_softsign, 1},
    {"Shrink", h_shrink, 9},
    {"ThresholdedRelu", h_thresholded_relu, 10},
    {"PRelu", h_prelu, 7},
    {"RandomUniformLike", h_random_uniform_like, 1},
    {"InstanceNormalization", h_instnorm, 6},
    {"ConstantOfShape", h_fold_only, 9},
    {"Equal", h_equal, 1},
    {"Not", h_not, 1},
    {"Where", h_where, 9},
    /* comparisons with a number (Where's condition), sin, cos */
    {"Greater", h_compare, 9},
    {"Less", h_compare, 9},
    {"GreaterOrEqual", h_compare, 12},
    {"LessOrEqual", h_compare, 12},
    {"Sin", h_sin, 7},
    {"Cos", h_cos, 7},
    {"Erf", h_erf, 9},
    {"RandomNormalLike", h_random_normal_like, 1},
    {"DepthToSpace", h_depth_to_space, 1},
    {"Einsum", h_einsum, 12},
    {"SpaceToDepth", h_space_to_depth, 1},
    {"Sign", h_sign, 9},
    /* upsampling */
    {"ConvTranspose", h_upconv, 1},
    {"Resize", h_resize, 11},
    {"GridSample", h_gridsample, 16},
};

static const op_row *find_op(const char *op) {
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(ops[i].op, op)) return &ops[i];
    return NULL;
}

/* ------------------------------------------------------------ pre-pass */

static int producer_of(imp *im, const char *name) {
    val *v = vget(im, name);
    return v ? v->prod : -1;
}

/* The single consumer of value name (node index), or -1. */
static int sole_consumer(imp *im, const char *name) {
    val *v = vget(im, name);
    if (!v || v->uses != 1 || v->graph_output) return -1;
    for (int i = 0; i < im->m->nnodes; i++)
        for (int k = 0; k < im->m->nodes[i].nin; k++)
            if (!strcmp(im->m->nodes[i].in[k], name)) return i;
    return -1;
}

static int is_op(imp *im, int i, const char *op) { return i >= 0 && !strcmp(im->m->nodes[i].op_type, op); }

/* A constant scalar input value (initializer or Constant node) of node i, input k. */
static int const_scalar(imp *im, int i, int k, double *out) {
    const ps_onnx_node *n = &im->m->nodes[i];
    if (k < 0 || k >= n->nin) return 0;   /* k: other_input's -1 where the node does not read the value */
    val *v = vget(im, n->in[k]);
    if (v && v->kind == VK_CONST && v->t && v->t->numel == 1) {
        float f;
        if (ps_onnx_tensor_floats(v->t, &f, NULL)) return 0;
        *out = f;
        return 1;
    }
    int p = producer_of(im, n->in[k]);
    if (!is_op(im, p, "Constant")) return 0;
    const ps_onnx_attr *a = ps_onnx_attr_find(&im->m->nodes[p], "value");
    if (a && a->t && a->t->numel == 1) {
        float f;
        if (ps_onnx_tensor_floats(a->t, &f, NULL)) return 0;
        *out = f;
        return 1;
    }
    if ((a = ps_onnx_attr_find(&im->m->nodes[p], "value_float"))) {
        *out = a->f;
        return 1;
    }
    return 0;
}

/* The other input of binary node i (not the one named x); -1 if x is not an input. */
static int other_input(imp *im, int i, const char *x) {
    const ps_onnx_node *n = &im->m->nodes[i];
    if (n->nin != 2) return -1;
    if (!strcmp(n->in[0], x)) return 1;
    if (!strcmp(n->in[1], x)) return 0;
    return -1;
}

static void set_scope(imp *im, int i, char *out) {
    scope_of(im->m->nodes[i].name, out, NAME_MAX_ + 1);
}

/* Output 0 / input 0 of node i, "" when it has none (a malformed graph). */
static const char *out0(imp *im, int i) { return im->m->nodes[i].nout ? im->m->nodes[i].out[0] : ""; }
static const char *in0(imp *im, int i) { return im->m->nodes[i].nin ? im->m->nodes[i].in[0] : ""; }

/* The constant tensor input k of node i (an initializer or a Constant node's value), or NULL. */
static const ps_onnx_tensor *const_input(imp *im, int i, int k) {
    const ps_onnx_node *n = &im->m->nodes[i];
    if (k >= n->nin || !n->in[k][0]) return NULL;
    val *v = vget(im, n->in[k]);
    if (v && v->kind == VK_CONST && v->t) return v->t;
    int p = producer_of(im, n->in[k]);
    const ps_onnx_attr *a = is_op(im, p, "Constant") ? ps_onnx_attr_find(&im->m->nodes[p], "value") : NULL;
    return a ? a->t : NULL;
}

/* 1: constant input k of node i holds only the value c */
static int const_input_all(imp *im, int i, int k, float c) {
    const ps_onnx_tensor *t = const_input(im, i, k);
    if (!t || t->numel < 1 || t->numel > 65536) return 0;
    float *f = malloc((size_t)t->numel * sizeof *f);
    int ok = f && !ps_onnx_tensor_floats(t, f, NULL);
    for (int64_t j = 0; ok && j < t->numel; j++) ok = f[j] == c;
    free(f);
    return ok;
}

/* nn.GroupNorm's weight (bias) as PyTorch exports it: Unsqueeze(initializer, axes) read by the Mul (Add)
 * alone -> the initializer's name (*unsq: the Unsqueeze); without weights, a Constant scalar `none`
 * (1 for the weight, 0 for the bias) -> "". Else NULL. */
static const char *gn_param(imp *im, int node, int k, double none, int *unsq) {
    const char *v = im->m->nodes[node].in[k];
    double c;
    *unsq = -1;
    if (const_scalar(im, node, k, &c)) return c == none ? "" : NULL;
    int u = producer_of(im, v);
    if (!is_op(im, u, "Unsqueeze") || sole_consumer(im, v) != node) return NULL;
    val *w = vget(im, in0(im, u));
    if (!w || w->kind != VK_CONST || !w->init) return NULL;
    *unsq = u;
    return w->name;
}

/* nn.GroupNorm(G, C) as PyTorch exports it: Reshape(x, [0, G, -1]) -> InstanceNormalization(ones(G),
 * zeros(G)) -> Reshape(., Shape(x)) -> Mul(., Unsqueeze(weight)) -> Add(., Unsqueeze(bias)) (without weights
 * Mul by 1, Add 0): one GroupNorm node at the Add. */
static void find_group_norm(imp *im, int i) {
    const ps_onnx_model *m = im->m;
    const ps_onnx_node *n = &m->nodes[i];
    int r1 = producer_of(im, n->in[0]);
    const ps_onnx_tensor *st = is_op(im, r1, "Reshape") ? const_input(im, r1, 1) : NULL;
    int64_t sh[3];
    if (!st || st->numel != 3 || ps_onnx_tensor_int64s(st, sh, NULL) || sh[0] != 0 || sh[1] < 1 || sh[2] != -1 ||
        sole_consumer(im, out0(im, r1)) != i)
        return;
    if (!const_input_all(im, i, 1, 1.0f) || !const_input_all(im, i, 2, 0.0f)) return;
    int r2 = sole_consumer(im, out0(im, i));
    int mu = is_op(im, r2, "Reshape") ? sole_consumer(im, out0(im, r2)) : -1;
    int wk = is_op(im, mu, "Mul") ? other_input(im, mu, out0(im, r2)) : -1;
    int ad = wk >= 0 ? sole_consumer(im, out0(im, mu)) : -1;
    int bk = is_op(im, ad, "Add") ? other_input(im, ad, out0(im, mu)) : -1;
    if (bk < 0) return;
    int uw, ub;
    const char *w = gn_param(im, mu, wk, 1.0, &uw), *b = gn_param(im, ad, bk, 0.0, &ub);
    if (!w || !b || !w[0] != !b[0]) return;
    im->absorbed[r1] = im->absorbed[i] = im->absorbed[r2] = im->absorbed[mu] = 1;
    if (uw >= 0) im->absorbed[uw] = 1;
    if (ub >= 0) im->absorbed[ub] = 1;
    fused *f = &im->fz[ad];
    f->kind = "GroupNorm";
    f->x = in0(im, r1);
    f->scale = w[0] ? w : NULL;
    f->bias = b[0] ? b : NULL;
    f->axis = (int)sh[1];
    const ps_onnx_attr *e = ps_onnx_attr_find(n, "epsilon");
    f->eps = e ? e->f : 1e-5;
    set_scope(im, i, f->scope);
}

/* F.normalize(x, dim=d, eps) as PyTorch exports it: ReduceL2(x, axes [d], keepdims 1) -> Clip(min eps) ->
 * Expand(., Shape(x)) -> Div(x, .): one Normalize node at the Div (axis: d as ONNX counts, eps). */
static void find_normalize(imp *im, int i) {
    const ps_onnx_node *n = &im->m->nodes[i];
    const ps_onnx_attr *ax = ps_onnx_attr_find(n, "axes"), *kd = ps_onnx_attr_find(n, "keepdims");
    if (!ax || ax->nints != 1 || (kd && kd->i != 1)) return;
    const char *x = n->in[0];
    int cl = sole_consumer(im, out0(im, i));
    double eps;
    if (!is_op(im, cl, "Clip")) return;
    const ps_onnx_node *c = &im->m->nodes[cl];
    if (im->opset >= 11) {   /* eps a constant scalar, or the exporter's Cast of one */
        int cast = producer_of(im, c->nin > 1 ? c->in[1] : "");
        if (!const_scalar(im, cl, 1, &eps) && !(is_op(im, cast, "Cast") && const_scalar(im, cast, 0, &eps))) return;
        if (c->nin > 2 && c->in[2][0]) return;
    } else {
        const ps_onnx_attr *mn = ps_onnx_attr_find(c, "min");
        if (!mn || ps_onnx_attr_find(c, "max")) return;
        eps = mn->f;
    }
    int ex = sole_consumer(im, out0(im, cl));
    int dv = is_op(im, ex, "Expand") ? sole_consumer(im, out0(im, ex)) : -1;
    if (!is_op(im, dv, "Div") || im->m->nodes[dv].nin != 2 || strcmp(in0(im, dv), x) ||
        strcmp(im->m->nodes[dv].in[1], out0(im, ex)))
        return;
    im->absorbed[i] = im->absorbed[cl] = im->absorbed[ex] = 1;
    fused *f = &im->fz[dv];
    f->kind = "Normalize";
    f->x = x;
    f->axis = (int)ax->ints[0];
    f->eps = eps;
    set_scope(im, i, f->scope);
}

/* GELU: Div(x, sqrt2) -> Erf -> Add(1) -> Mul(x, .) -> Mul(0.5) (or 0.5
 * applied to x first). SiLU: Sigmoid(x) -> Mul(x, .). Hardswish (PyTorch's
 * export below opset 14): HardSigmoid(x, alpha 1/6, beta 0.5) -> Mul(x, .). */

/* nn.utils.weight_norm(module, dim=0 or None) as PyTorch exports it before the Gemm (transB 1), Conv or
 * ConvTranspose that reads the weight: ReduceL2(v, axes: every one but 0, or all; keepdims 1) -> Div(v, .) ->
 * Mul(., g) (either order), v and g initializers read nowhere else. The ReduceL2 and the Div are absorbed; the Mul
 * becomes a value standing for v and g (weight_norm_value), which the node binds as weight_v and weight_g. */
static void find_weight_norm(imp *im, int i) {
    const ps_onnx_node *n = &im->m->nodes[i];
    const ps_onnx_attr *ax = ps_onnx_attr_find(n, "axes"), *kd = ps_onnx_attr_find(n, "keepdims");
    val *v = n->nin == 1 ? vget(im, n->in[0]) : NULL;
    if (!ax || (kd && kd->i != 1) || !v || v->kind != VK_CONST || !v->init || !v->t || v->ndim < 2 || v->uses != 2 ||
        v->graph_output)
        return;
    const int all = (int)ax->nints == v->ndim;
    if (!all && (int)ax->nints != v->ndim - 1) return;
    for (int k = 0; k < (int)ax->nints; k++)
        if (ax->ints[k] != k + !all && ax->ints[k] != k + !all - v->ndim) return;
    int dv = sole_consumer(im, out0(im, i));
    if (!is_op(im, dv, "Div") || im->m->nodes[dv].nin != 2 || strcmp(in0(im, dv), v->name) ||
        strcmp(im->m->nodes[dv].in[1], out0(im, i)))
        return;
    int mu = sole_consumer(im, out0(im, dv)), gi = is_op(im, mu, "Mul") ? other_input(im, mu, out0(im, dv)) : -1;
    val *g = gi >= 0 ? vget(im, im->m->nodes[mu].in[gi]) : NULL;
    if (!g || g->kind != VK_CONST || !g->init || !g->t || g->uses != 1 || g->graph_output) return;
    int rd = sole_consumer(im, out0(im, mu));
    const ps_onnx_node *r = rd >= 0 ? &im->m->nodes[rd] : NULL;
    if (!r || r->nin < 2 || strcmp(r->in[1], out0(im, mu)) || strcmp(r->in[0], out0(im, mu)) == 0) return;
    if (!is_op(im, rd, "Conv") && !is_op(im, rd, "ConvTranspose") && !is_op(im, rd, "Gemm")) return;
    if (is_op(im, rd, "Gemm")) {
        const ps_onnx_attr *tb = ps_onnx_attr_find(r, "transB");
        if (!tb || tb->i != 1) return;
    }
    im->absorbed[i] = im->absorbed[dv] = 1;
    fused *f = &im->fz[mu];
    f->kind = "WeightNorm";
    f->x = v->name;
    f->scale = g->name;
    f->axis = all;
}

static void find_patterns(imp *im) {
    const ps_onnx_model *m = im->m;
    for (int i = 0; i < m->nnodes; i++) {
        const ps_onnx_node *n = &m->nodes[i];
        if (!strcmp(n->op_type, "ReduceL2")) find_weight_norm(im, i);   /* may also be find_normalize's */
        if (!strcmp(n->op_type, "Erf") && n->nin == 1 && n->nout == 1) {
            int dv = producer_of(im, n->in[0]);
            double c;
            if (!is_op(im, dv, "Div") || sole_consumer(im, out0(im, dv)) != i) continue;
            if (!const_scalar(im, dv, 1, &c) || fabs(c - 1.41421356) > 1e-5) continue;
            const char *x = in0(im, dv);
            int ad = sole_consumer(im, out0(im, i));
            if (!is_op(im, ad, "Add") || !const_scalar(im, ad, other_input(im, ad, out0(im, i)), &c) || c != 1) continue;
            int mu = sole_consumer(im, out0(im, ad));
            if (!is_op(im, mu, "Mul")) continue;
            int xi = other_input(im, mu, out0(im, ad));
            if (xi < 0) continue;
            int end = -1;
            if (!strcmp(m->nodes[mu].in[xi], x)) {   /* x * (1 + erf) then * 0.5 */
                int h = sole_consumer(im, out0(im, mu));
                if (is_op(im, h, "Mul") && const_scalar(im, h, other_input(im, h, out0(im, mu)), &c) &&
                    c == 0.5)
                    end = h;
            } else {   /* (x * 0.5) * (1 + erf) */
                int h = producer_of(im, m->nodes[mu].in[xi]);
                if (is_op(im, h, "Mul") && sole_consumer(im, out0(im, h)) == mu &&
                    other_input(im, h, x) >= 0 && const_scalar(im, h, other_input(im, h, x), &c) && c == 0.5) {
                    im->absorbed[h] = 1;
                    end = mu;
                }
            }
            if (end < 0) continue;
            im->absorbed[dv] = im->absorbed[i] = im->absorbed[ad] = 1;
            if (end != mu) im->absorbed[mu] = 1;
            im->fz[end].kind = "GELU";
            im->fz[end].x = x;
            set_scope(im, dv, im->fz[end].scope);
        } else if ((!strcmp(n->op_type, "Sigmoid") ||
                    (!strcmp(n->op_type, "HardSigmoid") && torch_hardsigmoid(n))) && n->nin == 1 && n->nout == 1) {
            int mu = sole_consumer(im, out0(im, i));
            if (!is_op(im, mu, "Mul")) continue;
            int xi = other_input(im, mu, out0(im, i));
            if (xi < 0 || strcmp(m->nodes[mu].in[xi], n->in[0])) continue;
            im->absorbed[i] = 1;
            im->fz[mu].kind = n->op_type[0] == 'S' ? "SiLU" : "Hardswish";
            im->fz[mu].x = n->in[0];
            set_scope(im, i, im->fz[mu].scope);
        } else if (!strcmp(n->op_type, "ReduceMean") && n->nin >= 1 && n->nout == 1) {
            /* LayerNorm: ReduceMean(x) -> Sub(x, mean) -> Pow(., 2) -> ReduceMean -> Add(eps) -> Sqrt ->
             * Div(sub, .) [-> Mul(gamma) -> Add(beta)] */
            const char *x = n->in[0];
            int sub = -1;
            for (int j = 0; j < m->nnodes && sub < 0; j++)
                if (is_op(im, j, "Sub") && m->nodes[j].nin == 2 && !strcmp(in0(im, j), x) &&
                    !strcmp(m->nodes[j].in[1], out0(im, i)))
                    sub = j;
            if (sub < 0 || sole_consumer(im, out0(im, i)) != sub) continue;
            const char *d = out0(im, sub);
            int pw = -1, dv = -1;
            for (int j = 0; j < m->nnodes; j++) {
                if (is_op(im, j, "Pow") && m->nodes[j].nin == 2 && !strcmp(in0(im, j), d)) pw = j;
                if (is_op(im, j, "Div") && m->nodes[j].nin == 2 && !strcmp(in0(im, j), d)) dv = j;
            }
            double c;
            if (pw < 0 || dv < 0 || !const_scalar(im, pw, 1, &c) || c != 2) continue;
            val *dval = vget(im, d);
            if (!dval || dval->uses != 2) continue;
            int rm2 = sole_consumer(im, out0(im, pw));
            if (!is_op(im, rm2, "ReduceMean")) continue;
            int ad = sole_consumer(im, out0(im, rm2));
            double eps;
            if (!is_op(im, ad, "Add") || !const_scalar(im, ad, other_input(im, ad, out0(im, rm2)), &eps))
                continue;
            int sq = sole_consumer(im, out0(im, ad));
            if (!is_op(im, sq, "Sqrt") || sole_consumer(im, out0(im, sq)) != dv ||
                strcmp(m->nodes[dv].in[1], out0(im, sq)))
                continue;
            int64_t axes[MAXD];
            const ps_onnx_attr *ax = ps_onnx_attr_find(n, "axes");
            if (!ax || ax->nints < 1 || ax->nints > MAXD || !ps_onnx_attr_find(&m->nodes[rm2], "axes")) continue;
            for (int k = 0; k < ax->nints; k++) axes[k] = ax->ints[k];
            int end = dv;
            const char *scale = NULL, *bias = NULL;
            int mu = sole_consumer(im, out0(im, dv));
            if (is_op(im, mu, "Mul")) {
                int gi = other_input(im, mu, out0(im, dv));
                val *g = gi >= 0 ? vget(im, m->nodes[mu].in[gi]) : NULL;
                if (g && g->kind == VK_CONST && g->init) {
                    int bi = sole_consumer(im, out0(im, mu));
                    int k2 = is_op(im, bi, "Add") ? other_input(im, bi, out0(im, mu)) : -1;
                    val *bv = k2 >= 0 ? vget(im, m->nodes[bi].in[k2]) : NULL;
                    if (bv && bv->kind == VK_CONST && bv->init) {
                        scale = g->name;
                        bias = bv->name;
                        im->absorbed[dv] = im->absorbed[mu] = 1;
                        end = bi;
                    }
                }
            }
            im->absorbed[i] = im->absorbed[sub] = im->absorbed[pw] = im->absorbed[rm2] = im->absorbed[ad] =
                im->absorbed[sq] = 1;
            if (end == dv) im->absorbed[dv] = 0;
            /* the trailing axes: the smallest (as a negative axis) */
            int64_t lo = 0;
            for (int k = 0; k < ax->nints; k++) lo = axes[k] < lo ? axes[k] : lo;
            if (lo >= 0) lo = axes[0];
            im->fz[end].kind = "LayerNorm";
            im->fz[end].x = x;
            im->fz[end].scale = scale;
            im->fz[end].bias = bias;
            im->fz[end].axis = (int)(lo < 0 ? lo : -ax->nints);
            im->fz[end].eps = eps;
            set_scope(im, i, im->fz[end].scope);
        } else if (!strcmp(n->op_type, "ReduceL2") && n->nin >= 1 && n->nout == 1) {
            find_normalize(im, i);
        } else if (!strcmp(n->op_type, "InstanceNormalization") && n->nin == 3 && n->nout == 1) {
            find_group_norm(im, i);
        } else if (!strcmp(n->op_type, "Transpose")) {
            find_mha(im, i);
        } else if (!strcmp(n->op_type, "Pad") && n->nout == 1 && n->nin >= 1) {
            /* a zero constant Pad of H and W read only by an AveragePool or a Conv: their padding */
            const char *mode = "constant";
            const ps_onnx_attr *ma = ps_onnx_attr_find(n, "mode");
            if (ma && ma->s) mode = ma->s;
            if (strcmp(mode, "constant")) continue;
            int64_t p[8];
            int np = -1;
            double cv = 0;
            if (im->opset < 11) {
                const ps_onnx_attr *pa = ps_onnx_attr_find(n, "pads");
                const ps_onnx_attr *va = ps_onnx_attr_find(n, "value");
                if (!pa || pa->nints != 8) continue;
                for (int k = 0; k < 8; k++) p[k] = pa->ints[k];
                np = 8;
                if (va) cv = va->f;
            } else {
                if (n->nin < 2) continue;
                val *pv = vget(im, n->in[1]);
                int pp = producer_of(im, n->in[1]);
                const ps_onnx_tensor *t = pv && pv->kind == VK_CONST ? pv->t : NULL;
                if (!t && is_op(im, pp, "Constant")) {
                    const ps_onnx_attr *a = ps_onnx_attr_find(&m->nodes[pp], "value");
                    t = a ? a->t : NULL;
                }
                if (!t || t->numel != 8 || ps_onnx_tensor_int64s(t, p, NULL)) continue;
                np = 8;
                if (n->nin > 2 && n->in[2][0] && !const_scalar(im, i, 2, &cv)) continue;
            }
            if (np != 8 || cv != 0 || p[0] || p[1] || p[4] || p[5] || p[2] != p[6] || p[3] != p[7]) continue;
            int c = sole_consumer(im, out0(im, i));
            if (!is_op(im, c, "AveragePool") && !is_op(im, c, "Conv")) continue;
            im->absorbed[i] = 1;
            im->fz[c].kind = "Pad";
            im->fz[c].x = n->in[0];
            im->fz[c].axis = (int)p[2];
            im->fz[c].eps = (double)p[3];
        }
    }
}

/* ---- nn.MultiheadAttention ----
 * PyTorch's exporter (F.multi_head_attention_forward, torch 1.13) writes nn.MultiheadAttention(E, H,
 * batch_first=True) called as self-attention, attn(x, x, x, need_weights=False), on x (N, L, E) as
 *   Transpose [1, 0, 2] to (L, N, E); MatMul by Transpose(in_proj_weight) (+ in_proj_bias): (L, N, 3E);
 *   three Slices of the last axis (q, k, v; their bounds Shape arithmetic), each a Reshape to (L, N*H, D)
 *   and a Transpose: q [1, 0, 2] then Div by sqrt(D) (or Mul by 1/sqrt(D)), k [1, 2, 0], v [1, 0, 2];
 *   MatMul q k^T (N*H, L, L), Softmax over the last axis, [Dropout], MatMul by v (N*H, L, D);
 *   Transpose [1, 0, 2], Reshape to (L*N, E), Gemm by out_proj.weight (transB) + out_proj.bias (or MatMul
 *   by its Transpose + Add), Reshape to (L, N, E), Transpose [1, 0, 2] back to (N, L, E).
 * The batch moves to dim 1 and merges with the heads, which psd's batch-first graph cannot follow: the
 * pre-pass finds the whole subgraph structurally (find_mha), its values get no psd node (VK_VIRT: only the
 * exporter's Shape arithmetic reads them, mha_inner), and at the last Transpose h_mha checks the numbers
 * (the Slices' bounds, the Reshapes' shapes, the scale) and writes one MultiheadAttention node whose
 * parameters are the initializers under their own names (encoder.layers.encoder_layer_0.self_attention.
 * in_proj_weight: node encoder.layers.encoder_layer_0.self_attention). A subgraph that starts as one (the
 * query's in-projection reads an in_proj initializer) but is something else - cross-attention, a mask, the
 * attention weights read (need_weights=True) - is refused at its first Transpose, saying which. */

static int perm_is(imp *im, int i, const int64_t *want, int n) {
    if (!is_op(im, i, "Transpose")) return 0;
    const ps_onnx_attr *a = ps_onnx_attr_find(&im->m->nodes[i], "perm");
    if (!a) return n == 2 && want[0] == 1 && want[1] == 0;   /* absent: reversed */
    if (a->nints != n) return 0;
    for (int k = 0; k < n; k++)
        if (a->ints[k] != want[k]) return 0;
    return 1;
}

/* The live nodes reading value v other than Shape nodes (the exporter's shape arithmetic): their count;
 * the first max of them in out[] (node order). A graph output counts as a reader of its own, -1. */
static int data_readers(imp *im, const char *v, int *out, int max) {
    if (!v[0]) return 0;   /* an omitted optional input names no value */
    val *x = vget(im, v);
    int c = 0;
    if (x && x->graph_output && max > 0) out[c++] = -1;   /* read by the graph's consumer */
    for (int i = 0; i < im->m->nnodes; i++) {
        const ps_onnx_node *n = &im->m->nodes[i];
        if (!im->live[i] || !strcmp(n->op_type, "Shape")) continue;
        for (int k = 0; k < n->nin; k++)
            if (!strcmp(n->in[k], v)) {
                if (c < max) out[c] = i;
                c++;
                break;
            }
    }
    return c;
}

/* The one node reading v (besides Shape nodes), or -1. */
static int data_reader(imp *im, const char *v) {
    int r = -1;
    return data_readers(im, v, &r, 1) == 1 ? r : -1;
}

/* An initializer of rank nd read by one node only. */
static val *mha_init(imp *im, const char *name, int nd) {
    val *c = vget(im, name);
    return c && c->kind == VK_CONST && c->init && c->t && c->ndim == nd && c->uses == 1 ? c : NULL;
}

/* The initializer behind v through at most two Transposes or Slices (cross-attention's slices of
 * in_proj_weight), or NULL. */
static const char *mha_root(imp *im, const char *v) {
    for (int k = 0; k < 3; k++) {
        val *c = vget(im, v);
        if (c && c->kind == VK_CONST && c->init) return c->name;
        int p = producer_of(im, v);
        if (!is_op(im, p, "Transpose") && !is_op(im, p, "Slice")) return NULL;
        v = in0(im, p);
    }
    return NULL;
}

/* A constant scalar input k of node i, or of the Cast that computes it (the exporter's Cast(1) of
 * baddbmm's alpha and beta). */
static int const_scalar_cast(imp *im, int i, int k, double *out) {
    if (const_scalar(im, i, k, out)) return 1;
    if (k < 0 || k >= im->m->nodes[i].nin) return 0;
    int c = producer_of(im, im->m->nodes[i].in[k]);
    return is_op(im, c, "Cast") && im->m->nodes[c].nin == 1 && const_scalar(im, c, 0, out);
}

/* An nn.MultiheadAttention parameter by its state_dict name (in_proj_weight, in_proj_bias, or the
 * q_proj_weight of separate projections). */
static int mha_named(const char *name) {
    return name && (strstr(name, "in_proj_weight") || strstr(name, "in_proj_bias") || strstr(name, "q_proj_weight"));
}

/* A weight operand (input k of node i): Transpose [1, 0] of a 2-D initializer (*tr 0, the Transpose node in
 * *tnode), or a 2-D initializer stored (in, out) (*tr 1). */
static const char *mha_weight(imp *im, int i, int k, int *tr, int *tnode) {
    static const int64_t p10[2] = {1, 0};
    if (k >= im->m->nodes[i].nin) return NULL;
    const char *b = im->m->nodes[i].in[k];
    int t = producer_of(im, b);
    val *bv = vget(im, b);
    *tnode = -1;
    if (perm_is(im, t, p10, 2) && mha_init(im, in0(im, t), 2) && bv && bv->uses == 1) {
        *tr = 0;
        *tnode = t;
        return in0(im, t);
    }
    if (mha_init(im, b, 2)) {
        *tr = 1;
        return b;
    }
    return NULL;
}

#define MHA_NODES 40

/* Match the decomposition from Transpose t0: 1 (p filled, its nodes in nodes[], *nn of them, the ones to
 * skip outright - weight transposes - in skip[]), 0 (not nn.MultiheadAttention), 2 (one psd refuses: p->why). */
/* PyTorch 1.13's exporter writes attn(x, x, x, key_padding_mask=ids == pad) (and a TransformerEncoderLayer's
 * src_key_padding_mask) as Equal(ids, pad) before the attention and, inside it, a Reshape of the bool mask to
 * (N, 1, 1, S), an Expand to (N, H, 1, S) (its shape Where / Equal / Mul / ConstantOfShape arithmetic on
 * constants), a Reshape to (N*H, 1, S), a Cast to bool, Where(mask, -inf, zeros) and a Mul by 1: the mask
 * term p->mask. The structure here (the pre-pass); h_mha checks the numbers (mha_kpm). 1 when it is one. */
static int mha_kpm_match(imp *im, mha_pat *p) {
    const ps_onnx_model *m = im->m;
    int mul = producer_of(im, p->mask);
    if (!is_op(im, mul, "Mul") || m->nodes[mul].nin != 2) return 0;
    int wh = producer_of(im, m->nodes[mul].in[0]);
    if (!is_op(im, wh, "Where") || m->nodes[wh].nin != 3 || data_reader(im, out0(im, wh)) != mul) return 0;
    int ca = producer_of(im, m->nodes[wh].in[0]);
    if (!is_op(im, ca, "Cast") || data_reader(im, out0(im, ca)) != wh) return 0;
    int r2 = producer_of(im, in0(im, ca));
    if (!is_op(im, r2, "Reshape") || data_reader(im, out0(im, r2)) != ca) return 0;
    int ex = producer_of(im, in0(im, r2));
    if (!is_op(im, ex, "Expand") || data_reader(im, out0(im, ex)) != r2) return 0;
    int r1 = producer_of(im, in0(im, ex));
    if (!is_op(im, r1, "Reshape") || data_reader(im, out0(im, r1)) != ex) return 0;
    int eq = producer_of(im, in0(im, r1));
    if (!is_op(im, eq, "Equal") || m->nodes[eq].nin != 2) return 0;
    p->kpm_eq = eq, p->kpm_r1 = r1, p->kpm_ex = ex, p->kpm_r2 = r2, p->kpm_cast = ca, p->kpm_where = wh;
    p->kpm_mul = mul;
    return 1;
}

static int mha_match(imp *im, int t0, mha_pat *p, int *nodes, int *nn, int *skip, int *ns) {
    static const int64_t p102[3] = {1, 0, 2}, p120[3] = {1, 2, 0};
    const ps_onnx_model *m = im->m;
    int like = 0, rd[4];
    *nn = *ns = 0;
    memset(p, 0, sizeof *p);
    p->t0 = t0;
    p->drop = -1;
    p->mask_mul = p->mask_add = -1;
    p->kpm_eq = -1;
#define WHY(...) (snprintf(p->why, sizeof p->why, __VA_ARGS__), like ? 2 : 0)
#define ADD(i) (nodes[(*nn)++] = (i))
    if (!perm_is(im, t0, p102, 3) || m->nodes[t0].nin != 1 || m->nodes[t0].nout != 1) return 0;
    val *xv = vget(im, in0(im, t0));
    if (!xv || xv->kind == VK_CONST) return 0;
    p->x = in0(im, t0);
    ADD(t0);
    /* the in-projection: MatMul by in_proj_weight^T (+ in_proj_bias) */
    const char *t0o = out0(im, t0);
    int nr = data_readers(im, t0o, rd, 4);
    for (int k = 0; k < nr && k < 4; k++)
        if (is_op(im, rd[k], "MatMul") && m->nodes[rd[k]].nin == 2 && mha_named(mha_root(im, m->nodes[rd[k]].in[1])))
            like = 1;
    int mm = nr == 1 ? rd[0] : -1, wt;
    if (like && nr > 1)   /* no Transpose of the attention's own: the batch was already at dim 1 */
        return WHY("batch_first=False: the (L, N, E) value it projects ('%s') is read by %d nodes (a "
                   "TransformerEncoderLayer's residual stream); psd holds values batch first: build it with "
                   "batch_first=True, or use psd-export, which follows the batch to dim 1 and back", t0o, nr);
    if (!is_op(im, mm, "MatMul") || m->nodes[mm].nin != 2 || strcmp(in0(im, mm), t0o) ||
        !(p->w = mha_weight(im, mm, 1, &p->w_t, &wt)))
        return WHY("the query, key and value are not projected together from one input by in_proj_weight: "
                   "cross-attention (a query other than the key and value) or a key other than the value, which "
                   "the ONNX import does not read (it reads self-attention, attn(x, x, x); psd-export writes "
                   "nn.TransformerDecoderLayer's cross-attention as MultiheadAttention cross: true)");
    like |= mha_named(p->w);
    ADD(mm);
    if (wt >= 0) skip[(*ns)++] = wt;
    const char *proj = out0(im, mm);
    int ad = data_reader(im, proj);
    if (is_op(im, ad, "Add") && m->nodes[ad].nin == 2) {
        int bi = other_input(im, ad, proj);
        val *b = bi >= 0 ? mha_init(im, m->nodes[ad].in[bi], 1) : NULL;
        if (b) {
            p->b = b->name;
            like |= mha_named(p->b);
            ADD(ad);
            proj = out0(im, ad);
        }
    }
    /* q, k, v: three Slices, each Reshape (L, N*H, D) and Transpose into the heads */
    int parts[4], np = data_readers(im, proj, parts, 4);
    if (np != 3)
        return WHY("the in-projection '%s' is read by %d nodes, not split three ways into query, key and value",
                   proj, np);
    int mm_s = -1, mm_o = -1;
    for (int j = 0; j < 3; j++) {
        int sl = parts[j];
        if (!is_op(im, sl, "Slice") || strcmp(in0(im, sl), proj) || m->nodes[sl].nout != 1)
            return WHY("the in-projection '%s' is read by %s, not three Slices into query, key and value", proj,
                       sl < 0 ? "the graph's output" : m->nodes[sl].op_type);
        int r = data_reader(im, out0(im, sl));
        int t = is_op(im, r, "Reshape") && !strcmp(in0(im, r), out0(im, sl)) ? data_reader(im, out0(im, r)) : -1;
        int role = -1, nx = t >= 0 ? data_reader(im, out0(im, t)) : -1;
        if (perm_is(im, t, p120, 3)) {   /* k, read transposed by q k^T */
            if (is_op(im, nx, "MatMul") && m->nodes[nx].nin == 2 && !strcmp(m->nodes[nx].in[1], out0(im, t)) &&
                (mm_s < 0 || mm_s == nx)) {
                role = 1;
                mm_s = nx;
            }
        } else if (perm_is(im, t, p102, 3)) {
            double c;
            if ((is_op(im, nx, "Div") || is_op(im, nx, "Mul")) && m->nodes[nx].nin == 2 &&
                !strcmp(in0(im, nx), out0(im, t)) && const_scalar(im, nx, 1, &c)) {   /* q, scaled */
                int s2 = data_reader(im, out0(im, nx));
                if (is_op(im, s2, "MatMul") && m->nodes[s2].nin == 2 && !strcmp(in0(im, s2), out0(im, nx)) &&
                    (mm_s < 0 || mm_s == s2)) {
                    role = 0;
                    mm_s = s2;
                    p->scale = nx;
                }
            } else if (is_op(im, nx, "MatMul") && m->nodes[nx].nin == 2 && !strcmp(m->nodes[nx].in[1], out0(im, t))) {
                role = 2;   /* v, read by the attention weights' product */
                mm_o = nx;
            }
        }
        if (role < 0 || p->part[role])
            return WHY("the in-projection's part '%s' does not go into the heads as nn.MultiheadAttention's query, "
                       "key or value (a Reshape, a Transpose, q k^T / sqrt(D) and the product by v)", out0(im, sl));
        p->part[role] = sl;
        p->resh[role] = r;
        ADD(sl);
        ADD(r);
        ADD(t);
        if (role == 0) ADD(p->scale);
    }
    ADD(mm_s);
    /* softmax(q k^T / sqrt(D)), dropout, times v */
    const char *sc = out0(im, mm_s);
    int sm = data_reader(im, sc);
    /* an attn_mask: baddbmm(mask, q, k^T) as the exporter writes it, the scores times 1 plus a mask term
     * (a float mask Unsqueezed, a bool one through Where(mask, -inf, 0), times 1); h_mha checks that it is
     * a constant, the causal mask */
    double one;
    if (is_op(im, sm, "Mul") && m->nodes[sm].nin == 2 && const_scalar_cast(im, sm, other_input(im, sm, sc), &one) &&
        one == 1.0) {
        int ad = data_reader(im, out0(im, sm)), mi = is_op(im, ad, "Add") ? other_input(im, ad, out0(im, sm)) : -1;
        if (mi >= 0) {
            p->mask_mul = sm;
            p->mask_add = ad;
            p->mask = m->nodes[ad].in[mi];
            ADD(sm);
            ADD(ad);
            if (mha_kpm_match(im, p)) {   /* key_padding_mask = ids == pad: its chain is the attention's */
                const int chain[6] = {p->kpm_r1, p->kpm_ex, p->kpm_r2, p->kpm_cast, p->kpm_where, p->kpm_mul};
                for (int k = 0; k < 6; k++) ADD(chain[k]);
            }
            sm = data_reader(im, out0(im, ad));
        }
    }
    if (!is_op(im, sm, "Softmax"))
        return WHY("the attention scores q k^T go to %s before the Softmax: an attention mask other than the "
                   "term the exporter adds for an attn_mask or a key_padding_mask, which psd's MultiheadAttention "
                   "does not take (it takes the causal attn_mask and key_padding_mask=ids == pad)",
                   sm < 0 ? "several nodes" : m->nodes[sm].op_type);
    const ps_onnx_attr *ax = ps_onnx_attr_find(&m->nodes[sm], "axis");
    int64_t axis = ax ? ax->i : im->opset >= 13 ? -1 : 1;
    if (axis != -1 && axis != 2) return WHY("a Softmax over axis %lld, not the keys'", (long long)axis);
    ADD(sm);
    const char *aw = out0(im, sm);
    int a = data_reader(im, aw);
    if (a < 0)
        return WHY("the attention weights (its Softmax's output) are read outside it: need_weights=True, whose "
                   "weights psd's MultiheadAttention does not return (call it with need_weights=False)");
    if (is_op(im, a, "Dropout")) {
        p->drop = a;
        ADD(a);
        aw = out0(im, a);
        a = data_reader(im, aw);
    }
    if (a != mm_o || strcmp(in0(im, a), aw))
        return WHY("the attention weights are not multiplied by the value: '%s' reads them",
                   a < 0 ? "several nodes" : m->nodes[a].name);
    ADD(mm_o);
    /* the heads joined back, the out-projection, the batch first again */
    int to = data_reader(im, out0(im, mm_o));
    if (!perm_is(im, to, p102, 3)) return WHY("the heads' outputs are not transposed back to (L, N*H, D)");
    ADD(to);
    p->resh_o = data_reader(im, out0(im, to));
    if (!is_op(im, p->resh_o, "Reshape") || strcmp(in0(im, p->resh_o), out0(im, to)))
        return WHY("the heads' outputs are not reshaped to (L*N, E)");
    ADD(p->resh_o);
    const char *ho = out0(im, p->resh_o), *po = NULL;
    int g = data_reader(im, ho);
    if (is_op(im, g, "Gemm") && m->nodes[g].nin >= 2 && !strcmp(in0(im, g), ho)) {
        const ps_onnx_node *gn = &m->nodes[g];
        const ps_onnx_attr *ta = ps_onnx_attr_find(gn, "transA"), *tb = ps_onnx_attr_find(gn, "transB"),
                           *al = ps_onnx_attr_find(gn, "alpha"), *be = ps_onnx_attr_find(gn, "beta");
        val *c = gn->nin > 2 && gn->in[2][0] ? mha_init(im, gn->in[2], 1) : NULL;
        if ((ta && ta->i) || (al && al->f != 1.0f) || (be && be->f != 1.0f) || !mha_init(im, gn->in[1], 2) ||
            (gn->nin > 2 && gn->in[2][0] && !c))
            return WHY("the out-projection Gemm '%s' is not x out_proj.weight^T + out_proj.bias", gn->name);
        p->wo = gn->in[1];
        p->wo_t = !(tb && tb->i);
        p->bo = c ? c->name : NULL;
        ADD(g);
        po = out0(im, g);
    } else if (is_op(im, g, "MatMul") && m->nodes[g].nin == 2 && !strcmp(in0(im, g), ho)) {
        int wot;
        if (!(p->wo = mha_weight(im, g, 1, &p->wo_t, &wot)))
            return WHY("the out-projection MatMul '%s' is not by out_proj.weight", m->nodes[g].name);
        if (wot >= 0) skip[(*ns)++] = wot;
        ADD(g);
        po = out0(im, g);
        int ab = data_reader(im, po);
        if (is_op(im, ab, "Add") && m->nodes[ab].nin == 2) {
            int bi = other_input(im, ab, po);
            val *b = bi >= 0 ? mha_init(im, m->nodes[ab].in[bi], 1) : NULL;
            if (b) {
                p->bo = b->name;
                ADD(ab);
                po = out0(im, ab);
            }
        }
    } else {
        return WHY("the joined heads go to %s, not the out-projection (Gemm or MatMul by out_proj.weight)",
                   g < 0 ? "several nodes" : m->nodes[g].op_type);
    }
    if (!p->b != !p->bo)
        return WHY("an in-projection bias without an out-projection bias, or the reverse (nn.MultiheadAttention's "
                   "bias is both or neither)");
    p->resh_y = data_reader(im, po);
    if (!is_op(im, p->resh_y, "Reshape") || strcmp(in0(im, p->resh_y), po))
        return WHY("the out-projection is not reshaped back to (L, N, E)");
    ADD(p->resh_y);
    p->end = data_reader(im, out0(im, p->resh_y));
    if (!perm_is(im, p->end, p102, 3) || strcmp(in0(im, p->end), out0(im, p->resh_y)))
        return WHY("the output is not transposed back to (N, L, E) (batch_first)");
    return 1;
#undef WHY
#undef ADD
}

/* The pre-pass: nn.MultiheadAttention decompositions from Transpose t0 (leading mode only: a graph read as one
 * sample keeps the ops as they are). */
static void find_mha(imp *im, int t0) {
    if (im->lead != 1 || im->absorbed[t0] || im->fz[t0].kind) return;
    mha_pat p;
    int nodes[MHA_NODES], skip[4], nn, ns;
    int r = mha_match(im, t0, &p, nodes, &nn, skip, &ns);
    if (!r) return;
    if (r == 1 && im->batch < 1) {
        r = 2;
        snprintf(p.why, sizeof p.why, "a dynamic batch: the exporter computes the heads' Reshape to (L, N*H, D) "
                 "from the batch size, which psd does not fold (export with a fixed batch: psd runs any batch size "
                 "on the MultiheadAttention node it writes)");
    }
    mha_pat *g = realloc(im->mha, (size_t)(im->nmha + 1) * sizeof *g);
    if (!g) return;   /* out of memory: the ops are converted one by one (and refused) */
    im->mha = g;
    im->mha[im->nmha] = p;
    if (r == 2) {   /* refused at its first Transpose */
        im->fz[t0].kind = "MultiheadAttention";
        im->fz[t0].axis = im->nmha++;
        return;
    }
    for (int k = 0; k < nn; k++) {
        im->absorbed[nodes[k]] = 2;
        im->fz[nodes[k]].axis = im->nmha;
    }
    for (int k = 0; k < ns; k++) im->absorbed[skip[k]] = 1;
    im->fz[p.end].kind = "MultiheadAttention";
    im->fz[p.end].axis = im->nmha++;
}

/* A node inside an nn.MultiheadAttention: its outputs have no psd node (VK_VIRT). Those of shape (L, N, *)
 * - the first Transpose, the in-projection, its Slices - keep their shape for the exporter's Shape
 * arithmetic (the Slices' bounds), the batch at dim 1. */
static ps_status mha_inner(imp *im) {
    const mha_pat *p = &im->mha[im->fz[im->cur].axis];
    const ps_onnx_node *n = cur_node(im);
    val *x = vget(im, p->x), *w = vget(im, p->w);
    int64_t d[3] = {0, 0, 0};
    int known = 0;
    if (x && x->kind == VK_DATA && x->ndim == 3 && w) {
        d[0] = x->dims[1];
        d[1] = x->dims[0];
        d[2] = x->dims[2];
        int64_t rows = p->w_t ? w->dims[1] : w->dims[0];
        known = im->cur == p->t0;
        if (!strcmp(n->op_type, "MatMul") && !strcmp(in0(im, im->cur), out0(im, p->t0))) {
            d[2] = rows;
            known = 1;
        } else if (!strcmp(n->op_type, "Add") && p->b && other_input(im, im->cur, p->b) >= 0) {
            d[2] = rows;
            known = 1;
        } else if (im->cur == p->part[0] || im->cur == p->part[1] || im->cur == p->part[2]) {
            int64_t pd[3] = {d[0], d[1], rows}, st = 0, en = 0;
            int a = 0;
            if (slice_args(im, pd, 3, &a, &st, &en)) {
                ps_err_clear(im->err);   /* h_mha says what is wrong with it */
            } else {
                memcpy(d, pd, sizeof d);
                d[a] = en - st;
                known = 1;
            }
        }
    }
    for (int k = 0; k < n->nout; k++) {
        if (!n->out[k][0]) continue;
        val *v = vmake(im, n->out[k]);
        if (!v) return oom(im);
        v->kind = VK_VIRT;
        v->vshape = known && k == 0;
        v->bdim = 1;
        v->ndim = 3;
        memcpy(v->dims, d, sizeof d);
    }
    return PS_OK;
}

/* The Reshape node i of an nn.MultiheadAttention applied to a value of dims in[3 or 2]: its target shape with
 * 0 and -1 resolved, into out (ns entries). */
static ps_status mha_reshape(imp *im, int i, const int64_t *in, int nin, int64_t *out, int *ns) {
    im->cur = i;
    int64_t shape[MAXD];
    int n;
    ps_status rc = reshape_target(im, shape, &n);
    if (rc) return rc;
    int64_t total = prod(in, nin), known = 1;
    int neg = -1;
    for (int k = 0; k < n; k++) {
        int64_t v = shape[k];
        if (v == 0 && !attr_i(im, "allowzero", 0)) v = k < nin ? in[k] : -2;
        if (v == -1 && neg < 0) neg = k;
        else if (v < 1) return unsup(im, "inside nn.MultiheadAttention: shape entry %d is %s", k,
                                     shape[k] == BATCH_SYM ? "the batch size, unknown (a dynamic batch)" : "not a size");
        else known = smul(known, v);
        out[k] = v;
    }
    if (neg >= 0) {
        if (total % known) return bad(im, "cannot reshape %lld elements to the shape", (long long)total);
        out[neg] = total / known;
    } else if (known != total) {
        return bad(im, "cannot reshape %lld elements to %lld", (long long)total, (long long)known);
    }
    *ns = n;
    return PS_OK;
}

/* The key padding mask chain of p (mha_kpm_match) for x (N, L, E) and H heads: its numbers checked (the Eq
 * of the ids one value per sample and key, repeated over the heads, -inf where it is true and 0 elsewhere,
 * times 1); *mask the Eq's value. */
static ps_status mha_kpm(imp *im, const mha_pat *p, int64_t N, int64_t L, int64_t H, val **mask) {
    const ps_onnx_model *m = im->m;
    char b1[64];
    val *eq = vget(im, out0(im, p->kpm_eq));
    im->cur = p->kpm_r1;
    if (!eq || !eq->kpm || eq->ndim != 2 || eq->dims[1] != L)
        return unsup(im, "nn.MultiheadAttention: its key_padding_mask '%s' is not the model's int64 ids (N, L) = "
                     "(N, %lld) compared with a constant pad id", out0(im, p->kpm_eq), (long long)L);
    const int64_t ids[2] = {N, L};
    int64_t r1[MAXD], r2[MAXD], e[MAXD];
    int n1 = 0, n2 = 0;
    ps_status rc = mha_reshape(im, p->kpm_r1, ids, 2, r1, &n1);
    if (rc) return rc;
    if (n1 != 4 || r1[0] != N || r1[1] != 1 || r1[2] != 1 || r1[3] != L)
        return unsup(im, "nn.MultiheadAttention: its key_padding_mask is reshaped to %s, not (N, 1, 1, L)",
                     dims_text(r1, n1, b1, sizeof b1));
    im->cur = p->kpm_ex;
    val *sh = in_val(im, 1, 1);
    if (!sh) return im->err->code;
    if (sh->kind != VK_CONST || sh->numel != 4 || !sh->q)
        return unsup(im, "nn.MultiheadAttention: its key_padding_mask is expanded to a shape psd does not fold");
    for (int k = 0; k < 4; k++) e[k] = sh->q[k] == 1 || sh->q[k] == -1 ? r1[k] : sh->q[k];
    if (e[0] != N || e[1] != H || e[2] != 1 || e[3] != L)
        return unsup(im, "nn.MultiheadAttention: its key_padding_mask is expanded to %s, not (N, H, 1, L) for %lld "
                     "heads", dims_text(e, 4, b1, sizeof b1), (long long)H);
    if ((rc = mha_reshape(im, p->kpm_r2, e, 4, r2, &n2))) return rc;
    if (n2 != 3 || r2[0] != N * H || r2[1] != 1 || r2[2] != L)
        return unsup(im, "nn.MultiheadAttention: its key_padding_mask is reshaped to %s, not (N*H, 1, L)",
                     dims_text(r2, n2, b1, sizeof b1));
    im->cur = p->kpm_cast;
    if (attr_i(im, "to", 0) != PS_ONNX_BOOL) return unsup(im, "nn.MultiheadAttention: its key_padding_mask is cast "
                                                          "to type %lld, not bool", (long long)attr_i(im, "to", 0));
    im->cur = p->kpm_where;
    val *fill = in_val(im, 1, 1), *zero = in_val(im, 2, 1);
    if (!fill || !zero) return im->err->code;
    double v = 0;
    const double *zf = zero->kind == VK_CONST ? cvals(im, zero) : NULL;
    const double *ff = fill->kind == VK_CONST && fill->numel == 1 ? cvals(im, fill) : NULL;
    int zeros = zf != NULL;
    for (int64_t k = 0; zeros && k < zero->numel; k++) zeros = zf[k] == 0.0;
    if (!ff || !(isinf(ff[0]) && ff[0] < 0) || !zeros)
        return unsup(im, "nn.MultiheadAttention: its key_padding_mask fills other than -inf where it is true and 0 "
                     "elsewhere (Where(mask, -inf, zeros))");
    im->cur = p->kpm_mul;
    val *one = in_val(im, 1, 1);
    if (!one) return im->err->code;
    if (!scalar_const(im, one, &v) || v != 1.0 || strcmp(m->nodes[p->kpm_mul].in[0], out0(im, p->kpm_where)))
        return unsup(im, "nn.MultiheadAttention: its key_padding_mask term is not multiplied by 1");
    *mask = eq;
    return PS_OK;
}

/* The attn_mask term p->mask added to the scores of a sequence of L: *causal 1 when it is the causal mask
 * (-inf where key j > query i, 0 elsewhere; (L, L), or (1, L, L) and (N*H, L, L) of one such matrix): a
 * float torch.triu(full(-inf), 1) or a bool torch.triu(ones, 1) through the exporter's Where(mask, -inf, 0);
 * anything else refused, saying what. */
static ps_status mha_causal(imp *im, const mha_pat *p, int64_t L, int *causal) {
    im->cur = p->mask_add;
    val *mv = vget(im, p->mask);
    if (!mv || mv->kind != VK_CONST)
        return unsup(im, "nn.MultiheadAttention: the attention mask '%s' added to its scores is computed from the "
                     "input (a per-sample attn_mask or key_padding_mask): psd's MultiheadAttention takes a constant "
                     "causal attn_mask only", p->mask);
    char b1[64];
    const int64_t lead = mv->ndim == 3 ? mv->dims[0] : 1;
    if (mv->ndim < 2 || mv->ndim > 3 || mv->dims[mv->ndim - 1] != L || mv->dims[mv->ndim - 2] != L)
        return unsup(im, "nn.MultiheadAttention: the attention mask '%s' is %s, not (L, L) = (%lld, %lld)", p->mask,
                     dims_text(mv->dims, mv->ndim, b1, sizeof b1), (long long)L, (long long)L);
    const double *f = cvals(im, mv);
    if (!f) return im->err->code;
    for (int64_t b = 0; b < lead; b++)
        for (int64_t i = 0; i < L; i++)
            for (int64_t j = 0; j < L; j++) {
                const double v = f[(b * L + i) * L + j];
                if (j > i ? !(isinf(v) && v < 0) : v != 0.0)
                    return unsup(im, "nn.MultiheadAttention: the attention mask '%s' is not the causal one: element "
                                 "(%lld, %lld) is %g, where the causal mask (torch.triu(ones(L, L), 1) as attn_mask) "
                                 "has %s; psd's MultiheadAttention takes the causal attn_mask only", p->mask,
                                 (long long)i, (long long)j, v, j > i ? "-inf" : "0");
            }
    *causal = 1;
    return PS_OK;
}

/* The nn.MultiheadAttention ending at the current node (its last Transpose): the numbers checked, one
 * MultiheadAttention node; at the first Transpose of one psd does not take, the refusal. */
static ps_status h_mha(imp *im) {
    const int end = im->cur;
    const mha_pat *p = &im->mha[im->fz[end].axis];
    if (p->why[0]) return unsup(im, "nn.MultiheadAttention: %s", p->why);
    val *x = vget(im, p->x);
    if (!x || x->kind == VK_NONE) return bad(im, "the attention's input '%s' is unknown", p->x);
    ps_status rc = need_float(im, x, 2, 2, "the attention's input");
    if (rc) return rc;
    const int64_t N = x->dims[0], L = x->dims[1], E = x->dims[2];
    val *w = vget(im, p->w), *b = p->b ? vget(im, p->b) : NULL, *wo = vget(im, p->wo),
        *bo = p->bo ? vget(im, p->bo) : NULL;
    char b1[64];
    if (w->dims[p->w_t ? 1 : 0] != 3 * E || w->dims[p->w_t ? 0 : 1] != E)
        return unsup(im, "nn.MultiheadAttention: in_proj_weight '%s' is %s, not (3E, E) for E %lld", w->name,
                     dims_text(w->dims, w->ndim, b1, sizeof b1), (long long)E);
    if (b && b->numel != 3 * E) return bad(im, "in_proj_bias '%s' has %lld values, not 3E", b->name, (long long)b->numel);
    if (wo->dims[0] != E || wo->dims[1] != E)
        return unsup(im, "nn.MultiheadAttention: out_proj.weight '%s' is %s, not (E, E) for E %lld", wo->name,
                     dims_text(wo->dims, wo->ndim, b1, sizeof b1), (long long)E);
    if (bo && bo->numel != E) return bad(im, "out_proj.bias '%s' has %lld values, not E", bo->name, (long long)bo->numel);
    if (N < 1) {
        im->cur = end;
        return unsup(im, "nn.MultiheadAttention with a symbolic batch (its heads' Reshapes need the traced one)");
    }
    int causal = 0;
    if (p->mask_add >= 0 && p->kpm_eq < 0 && (rc = mha_causal(im, p, L, &causal)) != PS_OK) return rc;
    /* q, k, v: columns [0, E), [E, 2E), [2E, 3E) of the projection, each to (L, N*H, D) */
    const int64_t proj[3] = {L, N, 3 * E}, part[3] = {L, N, E};
    int64_t H = 0, D = 0;
    static const char *const role[3] = {"query", "key", "value"};
    for (int j = 0; j < 3; j++) {
        int a = 0;
        int64_t st = 0, en = 0, sh[MAXD];
        im->cur = p->part[j];
        if ((rc = slice_args(im, proj, 3, &a, &st, &en))) return rc;
        if (a != 2 || st != j * E || en != (j + 1) * E)
            return unsup(im, "nn.MultiheadAttention: the %s is elements [%lld, %lld) of axis %d of the in-projection, "
                         "not [%lld, %lld) of the last", role[j], (long long)st, (long long)en, a, (long long)(j * E),
                         (long long)((j + 1) * E));
        int ns = 0;
        if ((rc = mha_reshape(im, p->resh[j], part, 3, sh, &ns))) return rc;
        if (!j && ns == 3 && sh[0] == L && sh[1] % N == 0 && sh[1] / N * sh[2] == E) {
            H = sh[1] / N;
            D = sh[2];
        }
        if (ns != 3 || !H || sh[0] != L || sh[1] != N * H || sh[2] != D)
            return unsup(im, "nn.MultiheadAttention: the %s's shape %s is not (L, N*H, D) = (%lld, %lld*H, E/H)",
                         role[j], dims_text(sh, ns, b1, sizeof b1), (long long)L, (long long)N);
    }
    /* the scale: q / sqrt(D), or q * (1/sqrt(D)) */
    im->cur = p->scale;
    double c = 0, want = sqrt((double)D);
    val *cv = in_val(im, 1, 1);
    if (!cv) return im->err->code;
    if (!scalar_const(im, cv, &c)) return unsup(im, "nn.MultiheadAttention: q scaled by '%s', not a number", cv->name);
    if (!strcmp(cur_node(im)->op_type, "Mul")) c = c ? 1.0 / c : 0;
    if (fabs(c - want) > 1e-5 * want)
        return unsup(im, "nn.MultiheadAttention: q divided by %g, not sqrt(D) = %g for D %lld", c, want, (long long)D);
    val *kpm = NULL;
    if (p->kpm_eq >= 0 && (rc = mha_kpm(im, p, N, L, H, &kpm)) != PS_OK) return rc;
    double pdrop = 0;
    if (p->drop >= 0) {
        im->cur = p->drop;
        if ((rc = dropout_ratio(im, &pdrop))) return rc;
    }
    const int64_t merged[3] = {L, N * H, D}, joined[2] = {L * N, E};
    int64_t sh[MAXD];
    int ns = 0;
    if ((rc = mha_reshape(im, p->resh_o, merged, 3, sh, &ns))) return rc;
    if (ns != 2 || sh[0] != L * N || sh[1] != E)
        return unsup(im, "nn.MultiheadAttention: the joined heads' shape %s is not (L*N, E) = (%lld, %lld)",
                     dims_text(sh, ns, b1, sizeof b1), (long long)(L * N), (long long)E);
    if ((rc = mha_reshape(im, p->resh_y, joined, 2, sh, &ns))) return rc;
    if (ns != 3 || sh[0] != L || sh[1] != N || sh[2] != E)
        return unsup(im, "nn.MultiheadAttention: the output's shape %s is not (L, N, E) = (%lld, %lld, %lld)",
                     dims_text(sh, ns, b1, sizeof b1), (long long)L, (long long)N, (long long)E);
    im->cur = end;
    /* named after the module whose state_dict names the initializers carry (an eval export's in_proj_weight is
     * onnx::MatMul_84; its in_proj_bias keeps the name) */
    const char *prefer = p->w, *suffix = "in_proj_weight";
    static const char *const sfx[4] = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
    const char *names[4] = {p->w, p->b, p->wo, p->bo};
    for (int k = 3; k >= 0; k--) {
        size_t l = names[k] ? strlen(names[k]) : 0, s = strlen(sfx[k]);
        if (l > s + 1 && names[k][l - s - 1] == '.' && !strcmp(names[k] + l - s, sfx[k])) {
            prefer = names[k];
            suffix = sfx[k];
        }
    }
    const int ins[2] = {x->node, kpm ? kpm->node : -1};
    int pn = emit(im, "MultiheadAttention", prefer, suffix, NULL, kpm ? 2 : 1, ins);
    if (pn < 0) return oom(im);
    char f[40];
    add_attr(im, pn, "embed_dim: %lld, num_heads: %lld", (long long)E, (long long)H);
    if (pdrop > 0) add_attr(im, pn, "dropout: %s", float_text(pdrop, f, sizeof f));
    if (!b) add_attr(im, pn, "bias: false");
    add_attr(im, pn, "batch_first: true");
    if (causal) add_attr(im, pn, "causal: true");
    if ((rc = bind(im, pn, "in_proj_weight", w, p->w_t, 0))) return rc;
    if (b && (rc = bind(im, pn, "in_proj_bias", b, 0, 0))) return rc;
    if ((rc = bind(im, pn, "out_proj.weight", wo, p->wo_t, 0))) return rc;
    if (bo && (rc = bind(im, pn, "out_proj.bias", bo, 0, 0))) return rc;
    return data_out(im, 0, pn, PS_ONNX_FLOAT, 3, x->dims) ? PS_OK : im->err->code;
}

/* ---- the LSTM weight glue ----
 * PyTorch exports nn.LSTM as one ONNX LSTM per layer. ONNX orders the gates
 * i, o, f, c where PyTorch has i, f, g, o: an eval export stores W, R, B
 * reordered (initializers onnx::LSTM_*), a training export computes them
 * from PyTorch's weight_ih_l<k>, weight_hh_l<k>, bias_ih_l<k>, bias_hh_l<k>:
 *   W = Unsqueeze(Concat(Slice(w, 0:H), Slice(w, 3H:4H), Slice(w, H:3H)))
 *   B = Unsqueeze(Concat(Concat(3 Slices of bias_ih), Concat(3 Slices of bias_hh)))
 * The hidden state comes in through Slices of graph inputs (h0, c0) and
 * leaves through Concats into graph outputs: the trainer's. */

/* Constant integer input k of node i (a Constant node's value, or an initializer); 0 if not one. */
static int const_ints(imp *im, int i, int k, int64_t *out, int max) {
    const ps_onnx_node *n = &im->m->nodes[i];
    if (k >= n->nin || !n->in[k][0]) return 0;
    val *v = vget(im, n->in[k]);
    if (!v || v->kind != VK_CONST || v->numel < 1 || v->numel > max) return 0;
    const int64_t *q = cints(im, v);
    if (!q) { ps_err_clear(im->err); return 0; }
    for (int64_t j = 0; j < v->numel; j++) out[j] = q[j];
    return (int)v->numel;
}

/* ONNX's gates from PyTorch's, in rows of H: LSTM i, o, f+c from i, f, g, o; GRU z, r, h from r, z, n */
static const int64_t lstm_want[3][2] = {{0, 1}, {3, 4}, {1, 3}}, gru_want[3][2] = {{1, 2}, {0, 1}, {2, 3}};

/* v = Concat(axis 0) of Slices of one initializer along axis 0 in ONNX's gate order (want): that initializer's
 * name. */
static const char *gate_slices(imp *im, const char *v, int64_t H, const int64_t want[3][2], int *absorb, int *na) {
    int c = producer_of(im, v);
    if (!is_op(im, c, "Concat") || im->m->nodes[c].nin != 3) return NULL;
    const ps_onnx_attr *ax = ps_onnx_attr_find(&im->m->nodes[c], "axis");
    if (ax && ax->i != 0) return NULL;
    const char *src = NULL;
    int slices[3];
    for (int k = 0; k < 3; k++) {
        int sl = producer_of(im, im->m->nodes[c].in[k]);
        if (!is_op(im, sl, "Slice")) return NULL;
        const ps_onnx_node *n = &im->m->nodes[sl];
        if (n->nin < 3) return NULL;
        int64_t st[1], en[1], axes[1] = {0};
        if (const_ints(im, sl, 1, st, 1) != 1 || const_ints(im, sl, 2, en, 1) != 1) return NULL;
        if (n->nin > 3 && n->in[3][0] && (const_ints(im, sl, 3, axes, 1) != 1 || axes[0] != 0)) return NULL;
        if (n->nin > 4 && n->in[4][0]) return NULL;   /* steps */
        if (st[0] != want[k][0] * H || en[0] != want[k][1] * H) return NULL;
        if (src && strcmp(src, n->in[0])) return NULL;
        src = n->in[0];
        slices[k] = sl;
    }
    val *pv = vget(im, src);
    if (!pv || pv->kind != VK_CONST || !pv->init) return NULL;
    absorb[(*na)++] = c;
    for (int k = 0; k < 3; k++) absorb[(*na)++] = slices[k];
    return src;
}

static int unsqueezed(imp *im, const char *v) {
    int u = producer_of(im, v);
    return is_op(im, u, "Unsqueeze") ? u : -1;
}

/* An LSTM whose initial state is a Slice of a graph input (not an initializer): the trainer's (rnn_lm). */
static int trainer_lstm(const ps_onnx_model *m, int i) {
    const ps_onnx_node *n = &m->nodes[i];
    if (strcmp(n->op_type, "LSTM") || n->nin <= 5 || !n->in[5][0]) return 0;
    for (int j = 0; j < i; j++) {
        const ps_onnx_node *s = &m->nodes[j];
        if (s->nout < 1 || strcmp(s->out[0], n->in[5])) continue;
        if (strcmp(s->op_type, "Slice") || s->nin < 1) return 0;
        for (int k = 0; k < m->ninits; k++)
            if (!strcmp(m->inits[k].name, s->in[0])) return 0;
        for (int k = 0; k < m->ninputs; k++)
            if (!strcmp(m->inputs[k].name, s->in[0])) return 1;
        return 0;
    }
    return 0;
}

static void find_lstms(imp *im) {
    const ps_onnx_model *m = im->m;
    for (int i = 0; i < m->nnodes; i++) {
        const ps_onnx_node *n = &m->nodes[i];
        if (strcmp(n->op_type, "LSTM") || n->nin < 3 || !trainer_lstm(m, i)) continue;
        const ps_onnx_attr *hs = ps_onnx_attr_find(n, "hidden_size");
        int64_t H = hs ? hs->i : 0;
        if (H < 1) continue;
        int absorb[32], na = 0;
        /* W, R and B glued from PyTorch's tensors */
        int uw = unsqueezed(im, n->in[1]), ur = unsqueezed(im, n->in[2]), ub = n->nin > 3 && n->in[3][0]
                                                                                   ? unsqueezed(im, n->in[3]) : -1;
        const char *sw = uw >= 0 ? gate_slices(im, in0(im, uw), H, lstm_want, absorb, &na) : NULL;
        const char *sr = ur >= 0 && sw ? gate_slices(im, in0(im, ur), H, lstm_want, absorb, &na) : NULL;
        const char *sbi = NULL, *sbh = NULL;
        if (ub >= 0 && sr) {
            int cb = producer_of(im, in0(im, ub));
            if (is_op(im, cb, "Concat") && m->nodes[cb].nin == 2) {
                sbi = gate_slices(im, in0(im, cb), H, lstm_want, absorb, &na);
                sbh = sbi ? gate_slices(im, m->nodes[cb].in[1], H, lstm_want, absorb, &na) : NULL;
                if (sbh) absorb[na++] = cb;
            }
        }
        if (sw && sr && sbi && sbh) {
            absorb[na++] = uw;
            absorb[na++] = ur;
            absorb[na++] = ub;
            for (int k = 0; k < na; k++) im->absorbed[absorb[k]] = 1;
            im->fz[i].src[0] = sw;
            im->fz[i].src[1] = sr;
            im->fz[i].src[2] = sbi;
            im->fz[i].src[3] = sbh;
        }
        /* the hidden state in (Slices of graph inputs) and out (Concats into graph outputs): the trainer's */
        for (int k = 5; k < 7 && k < n->nin; k++) {
            if (!n->in[k][0]) continue;
            val *v = vget(im, n->in[k]);
            int sl = producer_of(im, n->in[k]);
            if (is_op(im, sl, "Slice")) {
                val *g = vget(im, in0(im, sl));
                if (g && g->prod < 0) {
                    g->trainer = 1;
                    im->absorbed[sl] = 1;
                }
            }
            if (v) v->trainer = 1;
        }
        for (int k = 1; k < n->nout && k < 3; k++) {
            if (!n->out[k][0]) continue;
            val *v = vget(im, n->out[k]);
            if (v) v->trainer = 1;
            for (int j = 0; j < m->nnodes; j++) {
                if (!is_op(im, j, "Concat")) continue;
                int reads = 0;
                for (int q = 0; q < m->nodes[j].nin; q++) reads |= !strcmp(m->nodes[j].in[q], n->out[k]);
                val *o = reads && m->nodes[j].nout ? vget(im, out0(im, j)) : NULL;
                if (o && o->graph_output) {
                    im->absorbed[j] = 1;
                    o->trainer = 1;
                }
            }
        }
    }
}

/* ---- LSTM and GRU inside the graph ----
 * nn.LSTM / nn.GRU(batch_first=True) as PyTorch's exporter writes them
 * (torch.onnx's _generic_rnn): x (N, L, I) turned time-major by a Transpose
 * [1, 0, 2], one ONNX LSTM / GRU per layer from a zero initial state (an
 * Expand of a constant of zeros, or of a Slice of one), the layers joined by
 * a Squeeze of the direction axis (one direction) or a Transpose [0, 2, 1, 3]
 * and a Reshape to (L, N, 2H) (bidirectional), a Transpose [1, 0, 2] back;
 * the final states Y_h of the layers joined by a Concat into h_n (num_layers
 * * directions, N, H). One psd LSTM / GRU node computes the chain (a
 * recurrent chain, rnn_pat); what it does not compute - the time-major
 * values inside - is VK_VIRT, its shape alone readable (the initial states'
 * Shape arithmetic). Rows of h_n are read by Gather (or a Slice, then
 * Gather): the last layer's forward state is the output's last step, the
 * reverse direction's its first step, each Narrows and a Reshape of the
 * node. Weights: a training export glues W, R and B from PyTorch's
 * weight_ih_l<k>[_reverse] ... with Slices, Concats and Unsqueezes, bound
 * as they are; otherwise (an eval export's folded initializers, ONNX's own
 * graphs) W (D, G*H, in), R (D, G*H, H), B (D, 2*G*H) in ONNX's gate order
 * (LSTM i, o, f, c; GRU z, r, h), reordered where bound. */

#define RNN_MAX_LAYERS 4

typedef struct rnn_pat {
    int gru, D, layers, bias;
    int64_t H;
    int t0, end;                        /* the Transposes to and from time-major (end -1: the output unread) */
    int node[RNN_MAX_LAYERS];           /* the ONNX LSTM / GRU nodes */
    int join[RNN_MAX_LAYERS][2];        /* after layer k: Squeeze, or Transpose and Reshape; -1 */
    int hcat;                           /* the Concat of the layers' Y_h, or -1 */
    const char *x;                      /* the input (N, L, I) */
    const char *src[RNN_MAX_LAYERS][2][4];  /* glued: PyTorch's tensors per layer and direction; NULL: W, R, B */
    int pn;                             /* the psd node */
    int why_at;                         /* a chain psd does not take: the node to name, with why */
    char why[300];
} rnn_pat;

/* Unsqueeze(Concat(gate Slices of one initializer)): its name (one direction of W or R). */
static const char *glue_w(imp *im, const char *v, int64_t H, const int64_t want[3][2], int *ab, int *na) {
    int u = unsqueezed(im, v);
    const char *s = u >= 0 ? gate_slices(im, in0(im, u), H, want, ab, na) : NULL;
    if (s) ab[(*na)++] = u;
    return s;
}

/* Unsqueeze(Concat(gate Slices of bias_ih, gate Slices of bias_hh)): bias_ih's name, bias_hh's in *bh. */
static const char *glue_b(imp *im, const char *v, int64_t H, const int64_t want[3][2], int *ab, int *na,
                          const char **bh) {
    int u = unsqueezed(im, v), c = u >= 0 ? producer_of(im, in0(im, u)) : -1;
    if (!is_op(im, c, "Concat") || im->m->nodes[c].nin != 2) return NULL;
    const char *bi = gate_slices(im, im->m->nodes[c].in[0], H, want, ab, na);
    *bh = bi ? gate_slices(im, im->m->nodes[c].in[1], H, want, ab, na) : NULL;
    if (!*bh) return NULL;
    ab[(*na)++] = c;
    ab[(*na)++] = u;
    return bi;
}

/* Input k (1 W, 2 R, 3 B) of RNN node i glued from PyTorch's tensors, per direction (two: a Concat of the
 * directions' parts): the sources into src[d][k - 1] (B: [2] and [3]); 0 if not glued so. */
static int glue_input(imp *im, int i, int k, int D, int64_t H, const int64_t want[3][2], int *ab, int *na,
                      const char *src[2][4]) {
    const ps_onnx_node *n = &im->m->nodes[i];
    if (k >= n->nin || !n->in[k][0]) return 0;
    const char *part[2] = {n->in[k], NULL};
    if (D == 2) {
        int c = producer_of(im, n->in[k]);
        const ps_onnx_attr *ax = is_op(im, c, "Concat") ? ps_onnx_attr_find(&im->m->nodes[c], "axis") : NULL;
        if (!is_op(im, c, "Concat") || im->m->nodes[c].nin != 2 || (ax && ax->i != 0)) return 0;
        part[0] = im->m->nodes[c].in[0];
        part[1] = im->m->nodes[c].in[1];
        ab[(*na)++] = c;
    }
    for (int d = 0; d < D; d++) {
        if (k < 3) {
            if (!(src[d][k - 1] = glue_w(im, part[d], H, want, ab, na))) return 0;
        } else if (!(src[d][2] = glue_b(im, part[d], H, want, ab, na, &src[d][3]))) {
            return 0;
        }
    }
    return 1;
}

/* Input k of RNN node i is absent or zeros: an Expand of a constant of zeros or of a Slice of one, or (an export
 * with a dynamic batch: torch.onnx's dynamic_axes) a ConstantOfShape of zeros to the shape the batch gives or a
 * Slice of one. */
static int zero_state(imp *im, int i, int k, int *ab, int *na) {
    const ps_onnx_node *n = &im->m->nodes[i];
    if (k >= n->nin || !n->in[k][0]) return 1;
    int e = producer_of(im, n->in[k]);
    int cs = is_op(im, e, "ConstantOfShape") ? e : is_op(im, e, "Slice") ? producer_of(im, in0(im, e)) : -1;
    if (is_op(im, cs, "ConstantOfShape")) {   /* itself, or a Slice of it (a layer's rows) */
        const ps_onnx_attr *va = ps_onnx_attr_find(&im->m->nodes[cs], "value");
        float fv = 0;
        ps_err er = {0};
        if (va && (!va->t || va->t->numel != 1 || dtype_is_int(va->t->dtype) || ps_onnx_tensor_floats(va->t, &fv, &er)
                   || fv != 0))
            return 0;
        ab[(*na)++] = cs;
        if (e != cs) ab[(*na)++] = e;
        return 1;
    }
    if (!is_op(im, e, "Expand")) return 0;
    int s = producer_of(im, in0(im, e));
    val *c = is_op(im, s, "Slice") ? vget(im, in0(im, s)) : vget(im, in0(im, e));
    if (!const_all(im, c, 0.0)) return 0;
    ab[(*na)++] = e;
    if (is_op(im, s, "Slice")) ab[(*na)++] = s;
    return 1;
}

/* The nodes reading value v (at most max), their count. */
static int readers_of(imp *im, const char *v, int *out, int max) {
    int c = 0;
    for (int i = 0; i < im->m->nnodes; i++)
        for (int k = 0; k < im->m->nodes[i].nin; k++)
            if (!strcmp(im->m->nodes[i].in[k], v)) {
                if (c < max) out[c] = i;
                c++;
                break;
            }
    return c;
}

static int node_perm_is(imp *im, int i, const int64_t *want, int n) {
    const ps_onnx_attr *a = is_op(im, i, "Transpose") ? ps_onnx_attr_find(&im->m->nodes[i], "perm") : NULL;
    if (!a || a->nints != n) return 0;
    for (int k = 0; k < n; k++)
        if (a->ints[k] != want[k]) return 0;
    return 1;
}

static void rnn_why(imp *im, rnn_pat *p, int at, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void rnn_why(imp *im, rnn_pat *p, int at, const char *fmt, ...) {
    (void)im;
    if (p->why[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof p->why, fmt, ap);
    va_end(ap);
    p->why_at = at;
}

/* Layer k's attributes as nn.LSTM / nn.GRU's: why not, into p. */
static void rnn_attrs(imp *im, rnn_pat *p, int i) {
    const ps_onnx_node *n = &im->m->nodes[i];
    const ps_onnx_attr *a;
    const int gru = !strcmp(n->op_type, "GRU");
    int64_t H = (a = ps_onnx_attr_find(n, "hidden_size")) ? a->i : 0;
    const char *dir = (a = ps_onnx_attr_find(n, "direction")) && a->s ? a->s : "forward";
    int D = !strcmp(dir, "bidirectional") ? 2 : 1;
    if (H < 1 || H > 65536) rnn_why(im, p, i, "hidden_size %lld", (long long)H);
    if (strcmp(dir, "forward") && D != 2)
        rnn_why(im, p, i, "direction '%s': psd's %s runs forward or both ways (nn.%s's bidirectional)", dir,
                n->op_type, n->op_type);
    if ((a = ps_onnx_attr_find(n, "layout")) && a->i)
        rnn_why(im, p, i, "layout %lld: psd reads ONNX's time-major layout 0, as PyTorch's exporter writes it "
                "(a Transpose around it)", (long long)a->i);
    if (ps_onnx_attr_find(n, "clip") || ((a = ps_onnx_attr_find(n, "input_forget")) && a->i) ||
        ps_onnx_attr_find(n, "activation_alpha") || ps_onnx_attr_find(n, "activation_beta") ||
        ((a = ps_onnx_attr_find(n, "activations")) && a->nstrings))
        rnn_why(im, p, i, "clip, input_forget or activations other than the defaults (nn.%s has none)", n->op_type);
    if (gru && !((a = ps_onnx_attr_find(n, "linear_before_reset")) && a->i))
        rnn_why(im, p, i, "linear_before_reset 0 (ONNX's default: the reset gate applied before R_h): psd's GRU "
                "is PyTorch's, r * (W_hn h + b_hn), linear_before_reset 1");
    if (n->nin > 4 && n->in[4][0]) rnn_why(im, p, i, "sequence_lens (psd's sequences are all of one length)");
    if (!gru && n->nin > 7 && n->in[7][0]) rnn_why(im, p, i, "peepholes (P; nn.LSTM has none)");
    if (!p->layers) {
        p->gru = gru, p->H = H, p->D = D, p->bias = n->nin > 3 && n->in[3][0];
    } else if (p->gru != gru || p->H != H || p->D != D || p->bias != (n->nin > 3 && n->in[3][0])) {
        rnn_why(im, p, i, "layers of different kinds, sizes, directions or biases joined (one nn.%s's layers "
                "agree)", n->op_type);
    }
}

/* The recurrent chains: every LSTM / GRU that is not the trainer's, with what joins its layers. */
static ps_status find_graph_rnns(imp *im) {
    const ps_onnx_model *m = im->m;
    for (int i = 0; i < m->nnodes; i++) {
        const ps_onnx_node *n = &m->nodes[i];
        if ((strcmp(n->op_type, "LSTM") && strcmp(n->op_type, "GRU")) || im->rnn_at[i] || trainer_lstm(m, i))
            continue;
        rnn_pat *g = realloc(im->rnn, (size_t)(im->nrnn + 1) * sizeof *g);
        if (!g) return oom(im);
        im->rnn = g;
        rnn_pat *p = &g[im->nrnn];
        const int idx = ++im->nrnn;
        memset(p, 0, sizeof *p);
        p->t0 = p->end = p->hcat = p->pn = -1;
        memset(p->join, -1, sizeof p->join);
        int *ab = calloc((size_t)m->nnodes * 2 + 64, sizeof *ab), na = 0;
        if (!ab) return oom(im);
        im->rnn_at[i] = idx;
        rnn_attrs(im, p, i);   /* what the node is (linear_before_reset, peepholes) before where it reads from */
        p->t0 = n->nin ? producer_of(im, n->in[0]) : -1;
        static const int64_t swap[3] = {1, 0, 2}, dirs[4] = {0, 2, 1, 3};
        if (!node_perm_is(im, p->t0, swap, 3)) {
            rnn_why(im, p, i, "its input '%s' is not a Transpose [1, 0, 2] of a batch-first (N, L, features) tensor "
                    "(nn.%s(batch_first=True) as PyTorch exports it): psd's batch is the first dimension",
                    n->nin ? n->in[0] : "", n->op_type);
            p->t0 = -1;
        } else {
            p->x = in0(im, p->t0);
            im->rnn_at[p->t0] = idx;
        }
        int cur = i;
        for (;;) {
            const ps_onnx_node *r = &m->nodes[cur];
            rnn_attrs(im, p, cur);
            const int k = p->layers++;
            p->node[k] = cur;
            im->rnn_at[cur] = idx;
            const int64_t(*want)[2] = p->gru ? gru_want : lstm_want;
            int gna = na;
            const char *src[2][4] = {{0}};
            if (glue_input(im, cur, 1, p->D, p->H, want, ab, &gna, src) &&
                glue_input(im, cur, 2, p->D, p->H, want, ab, &gna, src) &&
                (!p->bias || glue_input(im, cur, 3, p->D, p->H, want, ab, &gna, src))) {
                na = gna;
                memcpy(p->src[k], src, sizeof src);
            }
            for (int s = 5; s < 7 && s < r->nin; s++)
                if (!zero_state(im, cur, s, ab, &na))
                    rnn_why(im, p, cur, "an initial %s state psd does not read as the exporter's zeros (an Expand "
                            "of a constant of zeros, a ConstantOfShape of zeros): psd's %s starts from zeros; call the module without hx",
                            s == 5 ? "hidden" : "cell", r->op_type);
            /* the join to the next layer */
            int rd[8], nr = r->nout ? readers_of(im, r->out[0], rd, 8) : 0, j1 = -1, j2 = -1;
            if (nr == 0) break;
            if (p->D == 1 && nr == 1 && is_op(im, rd[0], "Squeeze")) {
                int64_t ax[1] = {0};
                int got = const_ints(im, rd[0], 1, ax, 1);
                const ps_onnx_attr *aa = ps_onnx_attr_find(&m->nodes[rd[0]], "axes");
                if (!got && aa && aa->nints == 1) ax[0] = aa->ints[0], got = 1;
                if (got == 1 && (ax[0] == 1 || ax[0] == -3)) j1 = rd[0];
            } else if (p->D == 2 && nr == 1 && node_perm_is(im, rd[0], dirs, 4)) {
                int rs[2];
                int64_t sh[3];   /* to (L, N, 2H): [0, 0, -1] as the exporter writes it, or [0, 0, 2H] */
                if (readers_of(im, out0(im, rd[0]), rs, 2) == 1 && is_op(im, rs[0], "Reshape") &&
                    const_ints(im, rs[0], 1, sh, 3) == 3 && !sh[0] && !sh[1] && (sh[2] == -1 || sh[2] == 2 * p->H))
                    j1 = rd[0], j2 = rs[0];
            }
            if (j1 < 0) {
                rnn_why(im, p, nr ? rd[0] : cur, "the output of layer %d is read by %s, not the exporter's join of "
                        "its directions (psd computes the layers as one node)", k, nr ? m->nodes[rd[0]].op_type : "");
                break;
            }
            p->join[k][0] = j1, p->join[k][1] = j2;
            im->rnn_at[j1] = idx;
            if (j2 >= 0) im->rnn_at[j2] = idx;
            const char *jo = out0(im, j2 >= 0 ? j2 : j1);
            int jr[16], njr = readers_of(im, jo, jr, 16), next = -1;
            for (int q = 0; q < njr && q < 16; q++) {
                if ((is_op(im, jr[q], "LSTM") || is_op(im, jr[q], "GRU")) && !strcmp(in0(im, jr[q]), jo) &&
                    next < 0) {
                    next = jr[q];
                } else if (node_perm_is(im, jr[q], swap, 3) && p->end < 0) {
                    p->end = jr[q];
                } else if (!is_op(im, jr[q], "Shape")) {
                    rnn_why(im, p, jr[q], "the time-major output of layer %d is read by %s (psd computes the "
                            "layers as one node, batch-first)", k, m->nodes[jr[q]].op_type);
                }
            }
            if (next >= 0 && p->end >= 0)
                rnn_why(im, p, p->end, "a layer's output read both by the next layer and after the %s", r->op_type);
            if (next < 0) break;
            if (p->layers == RNN_MAX_LAYERS) {
                rnn_why(im, p, next, "more than %d layers (psd's %s takes num_layers 1 to %d)", RNN_MAX_LAYERS,
                        r->op_type, RNN_MAX_LAYERS);
                break;
            }
            if (im->rnn_at[next] || trainer_lstm(m, next)) {
                rnn_why(im, p, next, "a layer joined to two chains");
                break;
            }
            cur = next;
        }
        if (p->end >= 0) im->rnn_at[p->end] = idx;
        /* h_n: the layers' Y_h, joined by a Concat when there are several */
        const char *hname = NULL;
        if (p->layers == 1) {
            hname = m->nodes[p->node[0]].nout > 1 ? m->nodes[p->node[0]].out[1] : NULL;
        } else {
            const char *y0 = m->nodes[p->node[0]].nout > 1 ? m->nodes[p->node[0]].out[1] : "";
            int rd[4];
            if (y0[0] && readers_of(im, y0, rd, 4) == 1 && is_op(im, rd[0], "Concat") &&
                m->nodes[rd[0]].nin == p->layers) {
                int ok = 1;
                for (int k = 0; k < p->layers; k++)
                    ok &= m->nodes[p->node[k]].nout > 1 && !strcmp(m->nodes[rd[0]].in[k], m->nodes[p->node[k]].out[1]);
                const ps_onnx_attr *ax = ps_onnx_attr_find(&m->nodes[rd[0]], "axis");
                if (ok && (!ax || ax->i == 0)) {
                    p->hcat = rd[0];
                    im->rnn_at[rd[0]] = idx;
                    hname = out0(im, rd[0]);
                }
            }
        }
        /* its readers psd takes: Gather of a row, Slices of rows (read on), Squeeze of one row */
        const char *todo[16];
        int nt = 0;
        if (hname && hname[0]) todo[nt++] = hname;
        while (nt > 0) {
            const char *h = todo[--nt];
            int rd[16], nr = readers_of(im, h, rd, 16);
            for (int q = 0; q < nr && q < 16; q++) {
                int t = rd[q];
                if ((!is_op(im, t, "Gather") && !is_op(im, t, "Slice") && !is_op(im, t, "Squeeze")) ||
                    strcmp(in0(im, t), h) || im->rnn_at[t])
                    continue;
                im->rnn_at[t] = idx;
                if (is_op(im, t, "Slice") && nt < 16) todo[nt++] = out0(im, t);
            }
        }
        for (int k = 0; k < na; k++) im->absorbed[ab[k]] = 1;
        free(ab);
    }
    for (int i = 0; i < m->nnodes; i++)
        if (im->rnn_at[i]) im->absorbed[i] = 3;
    return PS_OK;
}

/* VK_VIRT output k of the current node: dims (the batch at bdim), its shape readable. */
static val *virt_out(imp *im, int k, int ndim, const int64_t *dims, int bdim, int rnn) {
    const ps_onnx_node *n = cur_node(im);
    if (k >= n->nout || !n->out[k][0]) return NULL;
    val *v = vmake(im, n->out[k]);
    if (!v) { oom(im); return NULL; }
    v->kind = VK_VIRT;
    v->vshape = 1;
    v->bdim = bdim;
    v->ndim = ndim;
    v->rnn = rnn;
    v->hlo = v->hn = 0;
    memcpy(v->dims, dims, (size_t)ndim * sizeof *dims);
    return v;
}

/* The psd node of chain p, at its first layer: the kind, attributes and parameters. */
static ps_status rnn_emit(imp *im, rnn_pat *p, val *x) {
    const char *kind = p->gru ? "GRU" : "LSTM";
    const int64_t G = p->gru ? 3 : 4, H = p->H, I = x->dims[2];
    const int glued = p->src[0][0][0] != NULL;
    int xin = x->node;
    int pn = emit(im, kind, glued ? p->src[0][0][0] : NULL, glued ? "weight_ih_l0" : NULL, NULL, 1, &xin);
    if (pn < 0) return oom(im);
    p->pn = pn;
    if (!glued && im->m->nodes[p->node[0]].name[0]) {   /* the exporter's scope of the module (rnn) */
        char scope[NAME_MAX_ + 1];
        scope_of(im->m->nodes[p->node[0]].name, scope, sizeof scope);
        if (scope[0] && !name_taken(im, scope)) snprintf(im->pn[pn].name, sizeof im->pn[pn].name, "%s", scope);
    }
    add_attr(im, pn, "input_size: %lld, hidden_size: %lld", (long long)I, (long long)H);
    if (p->layers > 1) add_attr(im, pn, "num_layers: %d", p->layers);
    if (!p->bias) add_attr(im, pn, "bias: false");
    add_attr(im, pn, "batch_first: true");
    if (p->D == 2) add_attr(im, pn, "bidirectional: true");
    static const char *const base[4] = {"weight_ih_l", "weight_hh_l", "bias_ih_l", "bias_hh_l"};
    ps_status rc;
    for (int l = 0; l < p->layers; l++) {
        const ps_onnx_node *r = &im->m->nodes[p->node[l]];
        const int64_t in = l ? p->D * H : I, sizes[4] = {G * H * in, G * H * H, G * H, G * H};
        val *w = vget(im, r->in[1]), *rr = vget(im, r->in[2]), *b = p->bias ? vget(im, r->in[3]) : NULL;
        for (int d = 0; d < p->D; d++) {
            for (int k = 0; k < (p->bias ? 4 : 2); k++) {
                char suf[24];
                snprintf(suf, sizeof suf, "%s%d%s", base[k], l, d ? "_reverse" : "");
                if (p->src[l][d][0]) {   /* glued from PyTorch's tensors: bound as they are */
                    val *c = vget(im, p->src[l][d][k]);
                    if (!c || c->kind != VK_CONST || c->numel != sizes[k])
                        return bad(im, "'%s' does not have the %lld values of %s", p->src[l][d][k],
                                   (long long)sizes[k], suf);
                    if ((rc = bind(im, pn, suf, c, 0, 0))) return rc;
                    continue;
                }
                /* ONNX's W (D, G*H, in), R (D, G*H, H), B (D, 2*G*H): this direction's rows, gates reordered */
                val *c = k == 0 ? w : k == 1 ? rr : b;
                const int64_t whole = k < 2 ? p->D * sizes[k] : p->D * 2 * G * H;
                if (!c || c->kind != VK_CONST || !c->init || c->numel != whole)
                    return unsup(im, "%s's %s: %s '%s' is not an initializer of %lld values (%s)", kind,
                                 k == 0 ? "W" : k == 1 ? "R" : "B", suf, c ? c->name : "?", (long long)whole,
                                 k == 0 ? "(D, G*H, input_size)" : k == 1 ? "(D, G*H, H)" : "(D, 2*G*H)");
                const int64_t off = k < 2 ? d * sizes[k] : d * 2 * G * H + (k == 3 ? G * H : 0);
                if ((rc = bind_tf(im, pn, suf, c, p->gru ? TF_GATES_GRU : TF_GATES, off, sizes[k]))) return rc;
            }
        }
    }
    return PS_OK;
}

/* Row `row` of chain p's h_n (the current Gather or Squeeze's output): the last layer's final state, a cut
 * of the node's output - the forward direction's last step, the reverse one's first. */
static ps_status rnn_h_row(imp *im, rnn_pat *p, int64_t row) {
    const int layer = (int)(row / p->D), d = (int)(row % p->D);
    if (layer != p->layers - 1)
        return unsup(im, "row %lld of h_n: layer %d's final state; psd gives the last layer's (h_n[-1]%s), the "
                     "output's %s", (long long)row, layer, p->D == 2 ? " and h_n[-2]" : "",
                     p->D == 2 ? "last step's forward half and first step's reverse half" : "last step");
    val *x = vget(im, p->x);
    const int64_t L = x->dims[1], H = p->H;
    int in = p->pn;
    int a = emit(im, "Narrow", NULL, NULL, d ? "h_n_reverse" : "h_n", 1, &in);
    if (a < 0) return oom(im);
    add_attr(im, a, "start: %lld, length: 1", (long long)(d ? 0 : L - 1));
    if (p->D == 2) {
        int b = emit(im, "Narrow", NULL, NULL, d ? "h_n_reverse_half" : "h_n_half", 1, &a);
        if (b < 0) return oom(im);
        add_attr(im, b, "dim: 2, start: %lld, length: %lld", (long long)(d * H), (long long)H);
        a = b;
    }
    int r = emit(im, "Reshape", NULL, NULL, d ? "h_n_reverse_view" : "h_n_view", 1, &a);
    if (r < 0) return oom(im);
    add_attr(im, r, "shape: [%lld]", (long long)H);
    int64_t od[2] = {x->dims[0], H};
    return data_out(im, 0, r, PS_ONNX_FLOAT, 2, od) ? PS_OK : im->err->code;
}

/* A node of a recurrent chain (absorbed 3). */
static ps_status rnn_inner(imp *im) {
    const int i = im->cur;
    rnn_pat *p = &im->rnn[im->rnn_at[i] - 1];
    const ps_onnx_node *n = cur_node(im);
    const int idx = im->rnn_at[i];
    if (p->why[0] && (i == p->why_at || i == p->t0 || i == p->node[0])) {
        im->cur = p->why_at;
        return unsup(im, "nn.%s: %s", im->m->nodes[p->node[0]].op_type, p->why);
    }
    val *x = p->x ? vget(im, p->x) : NULL;
    if (!x || x->kind != VK_DATA || x->dtype != PS_ONNX_FLOAT || x->ndim != 3 || im->lead != 1)
        return unsup(im, "the %s's input '%s' is not a computed float (N, L, features) batch",
                     im->m->nodes[p->node[0]].op_type, p->x ? p->x : "?");
    const int64_t N = x->dims[0], L = x->dims[1], I = x->dims[2], H = p->H, D = p->D;
    if (i == p->t0) {
        int64_t d[3] = {L, N, I};
        return virt_out(im, 0, 3, d, 1, 0) ? PS_OK : im->err->code;
    }
    for (int k = 0; k < p->layers; k++) {
        if (i == p->node[k]) {
            ps_status rc = k == 0 ? rnn_emit(im, p, x) : PS_OK;
            if (rc) return rc;
            int64_t y[4] = {L, D, N, H}, s[3] = {D, N, H};
            if (n->nout > 0 && n->out[0][0] && !virt_out(im, 0, 4, y, 2, 0)) return im->err->code;
            val *h = n->nout > 1 && n->out[1][0] ? virt_out(im, 1, 3, s, 1, idx) : NULL;
            if (h) h->hlo = k * (int)D, h->hn = (int)D;
            if (n->nout > 2 && n->out[2][0] && !virt_out(im, 2, 3, s, 1, idx)) return im->err->code;   /* c_n */
            return PS_OK;
        }
        if (i == p->join[k][0]) {
            int64_t sq[3] = {L, N, H}, tr[4] = {L, N, D, H};
            return virt_out(im, 0, D == 2 ? 4 : 3, D == 2 ? tr : sq, 1, 0) ? PS_OK : im->err->code;
        }
        if (i == p->join[k][1]) {
            int64_t rs[3] = {L, N, D * H};
            return virt_out(im, 0, 3, rs, 1, 0) ? PS_OK : im->err->code;
        }
    }
    if (i == p->end) {
        int64_t od[3] = {N, L, D * H};
        return data_out(im, 0, p->pn, PS_ONNX_FLOAT, 3, od) ? PS_OK : im->err->code;
    }
    if (i == p->hcat) {
        int64_t s[3] = {p->layers * D, N, H};
        val *h = virt_out(im, 0, 3, s, 1, idx);
        if (h) h->hlo = 0, h->hn = p->layers * (int)D;
        return h ? PS_OK : im->err->code;
    }
    /* a reader of h_n's rows */
    val *h = vget(im, in0(im, i));
    if (!h || h->kind != VK_VIRT || h->rnn != idx || !h->hn)
        return unsup(im, "a %s of the %s's final cell state c_n (psd gives the last layer's h_n rows only)",
                     n->op_type, im->m->nodes[p->node[0]].op_type);
    if (is_op(im, i, "Slice")) {
        int a = 0;
        int64_t st = 0, en = 0, dims[3] = {h->hn, 1, H};
        ps_status rc = slice_args(im, dims, 3, &a, &st, &en);
        if (rc) return rc;
        if (a != 0) return unsup(im, "a Slice of h_n along axis %d (psd reads its rows, axis 0)", a);
        int64_t s[3] = {en - st, N, H};
        val *o = virt_out(im, 0, 3, s, 1, idx);
        if (o) o->hlo = h->hlo + (int)st, o->hn = (int)(en - st);
        return o ? PS_OK : im->err->code;
    }
    int64_t row = 0;
    if (is_op(im, i, "Gather")) {
        const ps_onnx_attr *ax = attr(im, "axis");
        int64_t q[1];
        if ((ax && ax->i != 0) || const_ints(im, i, 1, q, 1) != 1 || vget(im, n->in[1])->ndim != 0)
            return unsup(im, "a Gather of h_n other than one row (h_n[k])");
        row = q[0] < 0 ? q[0] + h->hn : q[0];
        if (row < 0 || row >= h->hn) return bad(im, "row %lld of %d", (long long)q[0], h->hn);
    } else {   /* Squeeze of its one row */
        int64_t ax[1] = {0};
        int got = const_ints(im, i, 1, ax, 1);
        const ps_onnx_attr *aa = attr(im, "axes");
        if (!got && aa && aa->nints == 1) ax[0] = aa->ints[0], got = 1;
        if (h->hn != 1 || got != 1 || (ax[0] != 0 && ax[0] != -3))
            return unsup(im, "a Squeeze of h_n other than of its one row");
    }
    return rnn_h_row(im, p, h->hlo + row);
}

/* LSTM: a layer of the trainer-side LSTM. The first one ends stage 0 (its
 * input is that stage's output); its parameters go to a parameter-only
 * stage; its output (squeezed) is stage 1's input. */
static ps_status h_lstm(imp *im) {
    static const char *const known[] = {"hidden_size", "direction", "activations", "clip", "input_forget", "layout",
                                        "activation_alpha", "activation_beta", NULL};
    ps_status rc = only_attrs(im, known);
    if (rc) return rc;
    const ps_onnx_node *n = cur_node(im);
    int64_t H = attr_i(im, "hidden_size", 0);
    const char *dir = attr_s(im, "direction", "forward");
    if (H < 1) return bad(im, "no hidden_size");
    if (strcmp(dir, "forward")) return unsup(im, "direction '%s' (psd's LSTM is unidirectional)", dir);
    if (attr(im, "clip") || attr_i(im, "input_forget", 0) || attr_i(im, "layout", 0) || attr(im, "activation_alpha"))
        return unsup(im, "clip, input_forget, layout or activation parameters (PyTorch's nn.LSTM has none)");
    const ps_onnx_attr *acts = attr(im, "activations");
    if (acts && acts->nstrings) return unsup(im, "activations other than the default (Sigmoid, Tanh, Tanh)");
    if ((n->nin > 4 && n->in[4][0]) || (n->nin > 7 && n->in[7][0]))
        return unsup(im, "sequence_lens or peepholes (P)");
    if (im->lead != 2) return unsup(im, "an LSTM in a graph psd reads without (seq, batch) leading dims");
    val *x = vget(im, n->in[0]);
    if (!x || x->kind != VK_DATA || x->dtype != PS_ONNX_FLOAT || x->ndim != 3)
        return unsup(im, "the LSTM's input '%s' is not a computed (seq, batch, features) float tensor", n->in[0]);
    int first = im->lstm.layers == 0;
    if (first) {
        if (x->stage != 0 || x->node < 0)
            return unsup(im, "the LSTM's input must be computed by psd (an embedding table before it)");
        if (im->pn[x->node].readers || x->uses != 1)
            return unsup(im, "the LSTM's input '%s' is read by other nodes too", x->name);
        im->stage0_out = x->node;
        im->lstm.input = x->dims[2];
        im->lstm.hidden = H;
    } else {
        if (!x->lstm_out || strcmp(im->lstm.last_out, x->name))
            return unsup(im, "an LSTM whose input is not the previous LSTM layer's output");
        if (H != im->lstm.hidden) return unsup(im, "LSTM layers of different hidden sizes");
        if (im->npn && im->pn[im->npn - 1].stage == 1)
            return unsup(im, "nodes between LSTM layers (psd's LSTM stacks its layers directly)");
    }
    int k = im->lstm.layers;
    if (k >= 4) return unsup(im, "more than 4 LSTM layers");
    int64_t in = first ? im->lstm.input : H;
    if (first) {
        int pn = emit(im, "LSTM", NULL, NULL, NULL, 0, NULL);
        if (pn < 0) return oom(im);
        im->pn[pn].stage = 2;
        im->lstm.pn = pn;
    }
    int pn = im->lstm.pn;
    const fused *f = &im->fz[im->cur];
    char suf[4][24];
    snprintf(suf[0], sizeof suf[0], "weight_ih_l%d", k);
    snprintf(suf[1], sizeof suf[1], "weight_hh_l%d", k);
    snprintf(suf[2], sizeof suf[2], "bias_ih_l%d", k);
    snprintf(suf[3], sizeof suf[3], "bias_hh_l%d", k);
    int64_t sizes[4] = {4 * H * in, 4 * H * H, 4 * H, 4 * H};
    if (f->src[0]) {   /* glued from PyTorch's tensors: bound as they are */
        for (int j = 0; j < 4; j++) {
            val *c = vget(im, f->src[j]);
            if (!c || c->kind != VK_CONST || c->numel != sizes[j])
                return bad(im, "'%s' does not have the %lld values of %s", f->src[j], (long long)sizes[j], suf[j]);
            if ((rc = bind(im, pn, suf[j], c, 0, 0))) return rc;
        }
    } else {   /* ONNX's own W (1, 4H, in), R (1, 4H, H), B (1, 8H): gates reordered where bound */
        val *w = in_val(im, 1, 1), *r = in_val(im, 2, 1), *b = has_in(im, 3) ? in_val(im, 3, 1) : NULL;
        if (!w || !r || (has_in(im, 3) && !b)) return im->err->code;
        if (!b) return unsup(im, "an LSTM without B (PyTorch's nn.LSTM has biases)");
        if (w->kind != VK_CONST || w->numel != sizes[0] || r->kind != VK_CONST || r->numel != sizes[1] ||
            b->kind != VK_CONST || b->numel != 8 * H)
            return unsup(im, "W, R and B that are not initializers of (1, 4H, in), (1, 4H, H), (1, 8H)");
        if ((rc = bind_tf(im, pn, suf[0], w, TF_GATES, 0, sizes[0])) || (rc = bind_tf(im, pn, suf[1], r, TF_GATES, 0,
                                                                                      sizes[1])) ||
            (rc = bind_tf(im, pn, suf[2], b, TF_GATES, 0, 4 * H)) || (rc = bind_tf(im, pn, suf[3], b, TF_GATES, 4 * H,
                                                                                    4 * H)))
            return rc;
        b->bound = 1;
    }
    im->lstm.layers++;
    /* the psd node's name: the exporter's scope of the LSTM module */
    if (first && n->name[0]) {
        char scope[NAME_MAX_ + 1];
        scope_of(n->name, scope, sizeof scope);
        if (scope[0] && !strchr(scope, '.') && !name_taken(im, scope))
            snprintf(im->pn[pn].name, sizeof im->pn[pn].name, "%s", scope);
    }
    im->stage = 1;
    int64_t od[4] = {x->dims[0], 1, x->dims[1], H};
    val *y = data_out(im, 0, -1, PS_ONNX_FLOAT, 4, od);
    if (!y) return im->err->code;
    y->lstm_out = 1;
    return PS_OK;
}

/* ------------------------------------------------------------- driver */

/* After a trainer-side LSTM, node `first` acts along the (seq, batch) dims
 * (word_language_model's decoded.view(-1, ntoken)): it and what follows
 * are the trainer's (its loss), provided none of it holds parameters; the
 * model ends with the last psd node. */
static ps_status trainer_tail(imp *im, int first) {
    const ps_onnx_model *m = im->m;
    for (int i = first; i < m->nnodes; i++) {
        if (!im->live[i]) continue;
        for (int k = 0; k < m->nodes[i].nin; k++) {
            val *v = m->nodes[i].in[k][0] ? vget(im, m->nodes[i].in[k]) : NULL;
            if (v && v->kind == VK_CONST && v->init && v->t && v->numel > 1)
                return PS_ERR_UNIMPLEMENTED;   /* a parameter after the cut: keep the first error */
        }
    }
    if (!im->npn || im->pn[im->npn - 1].stage != 1) return PS_ERR_UNIMPLEMENTED;
    ps_err_clear(im->err);
    im->needs_whole = 0;
    im->trailing = first;
    im->out_node = im->npn - 1;
    im->cur = -1;
    return PS_OK;
}

/* Several graph outputs (a VAE's recon, mu and logvar): psd's model has one, so each is flattened after the
 * batch and they are joined along dim 1 in the graph's order, as psd-export joins a module's tuple output. The
 * Concat becomes the output im->out_name names. */
/* Graph output name, converted: a float value psd computes from the input (*v), or an error naming it. */
static ps_status output_value(imp *im, const char *name, val **v) {
    *v = vget(im, name);
    if (!*v || (*v)->kind != VK_DATA || (*v)->node < 0)
        return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: graph output '%s' is %s: psd's model computes its "
                          "output from the input", im->label, name,
                          *v && (*v)->kind == VK_CONST ? "a constant" : "the input itself");
    if ((*v)->dtype != PS_ONNX_FLOAT)
        return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: graph output '%s' is %s (psd's outputs are float)",
                          im->label, name, ps_onnx_dtype_name((*v)->dtype));
    return PS_OK;
}

static ps_status join_outputs(imp *im) {
    int ins[MAX_INPUTS], last = -1;
    int64_t total = 0;
    for (int k = 0; k < im->nouts; k++) {
        val *v;
        ps_status rc = output_value(im, im->outs[k], &v);
        if (rc) return rc;
        if (im->whole || im->lead != 1 || v->stage != im->stage)
            return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: graph output '%s': psd joins several outputs "
                              "of a model whose batch is dim 0, computed in its last stage", im->label, im->outs[k]);
        im->cur = v->prod;
        ins[k] = v->node;
        if (v->ndim != 2) {
            if ((ins[k] = emit(im, "Flatten", NULL, NULL, "flat", 1, &v->node)) < 0) return oom(im);
        }
        total += prod(v->dims + 1, v->ndim - 1);
        if (v->prod > last) last = v->prod;
    }
    im->cur = last;
    int pn = emit(im, "Concat", NULL, NULL, "outputs", im->nouts, ins);
    if (pn < 0) return oom(im);
    val *j = vmake(im, "psd.outputs");
    if (!j) return oom(im);
    j->kind = VK_DATA;
    j->node = pn;
    j->stage = im->stage;
    j->dtype = PS_ONNX_FLOAT;
    j->ndim = 2;
    j->dims[0] = -1;
    j->dims[1] = total;
    im->out_name = j->name;
    im->cur = -1;
    return PS_OK;
}

static ps_status convert(imp *im) {
    const ps_onnx_model *m = im->m;
    const ps_onnx_import_opts *o = im->o;
    /* every value named anywhere: its producer and readers */
    for (int i = 0; i < m->nnodes; i++) {
        const ps_onnx_node *n = &m->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            if (!n->in[k][0]) continue;
            val *v = vmake(im, n->in[k]);
            if (!v) return oom(im);
            v->uses++;
        }
        for (int k = 0; k < n->nout; k++) {
            if (!n->out[k][0]) continue;
            val *v = vmake(im, n->out[k]);
            if (!v) return oom(im);
            if (v->prod >= 0) return bad(im, "value '%s' is the output of nodes %d and %d", n->out[k], v->prod, i);
            v->prod = i;
        }
    }
    for (int i = 0; i < m->ninits; i++) {
        val *v = vmake(im, m->inits[i].name);
        if (!v) return oom(im);
        if (v->prod >= 0)
            return ps_err_set(im->err, PS_ERR_INVALID_ARGUMENT, "%s: initializer '%s' is also a node's output",
                              im->label, v->name);
        set_const_tensor(v, &m->inits[i], 1);
    }
    for (int i = 0; o && i < o->nfeeds; i++) {
        val *v = vmake(im, o->feeds[i]->name);
        if (!v) return oom(im);
        set_const_tensor(v, o->feeds[i], 1);
    }
    if (!(im->live = calloc((size_t)m->nnodes + 1, 1)) || !(im->absorbed = calloc((size_t)m->nnodes + 1, 1)))
        return oom(im);
    for (int i = 0; i < m->noutputs; i++) {
        val *v = vget(im, m->outputs[i].name);
        if (v) v->graph_output = 1;
    }
    /* Constants first (the recognisers read them), then an LSTM's glue and hidden state */
    for (int i = 0; i < m->nnodes; i++) {
        if (strcmp(m->nodes[i].op_type, "Constant")) continue;
        im->cur = i;
        ps_status rc = h_constant(im);
        if (rc) return rc;
    }
    im->cur = -1;
    if (!(im->rnn_at = calloc((size_t)m->nnodes + 1, sizeof *im->rnn_at))) return oom(im);
    find_lstms(im);
    ps_status rrc = find_graph_rnns(im);
    if (rrc) return rrc;
    /* the stage input: the one graph input that is not an initializer (nor an LSTM's hidden state) */
    const ps_onnx_value *gi = NULL;
    for (int i = 0; i < m->ninputs; i++) {
        int t = m->inputs[i].elem_type;
        if (!t || !ps_onnx_dtype_size(t) || t == PS_ONNX_BOOL)
            return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: graph input '%s' is %s: psd's inputs and constants "
                              "are numeric tensors", im->label, m->inputs[i].name,
                              t ? ps_onnx_dtype_name(t) : "not a tensor (a sequence, map or optional)");
    }
    for (int i = 0; i < m->ninputs; i++) {
        val *v = vget(im, m->inputs[i].name);
        if (v && (v->kind == VK_CONST || v->trainer)) continue;
        if (gi)
            return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: graph inputs '%s' and '%s': psd's model takes one "
                              "input", im->label, gi->name, m->inputs[i].name);
        gi = &m->inputs[i];
    }
    if (!gi) return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: the graph has no input: psd's model computes "
                               "from one", im->label);
    if (gi->elem_type != PS_ONNX_FLOAT && gi->elem_type != PS_ONNX_INT64)
        return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: input '%s' is %s: psd's inputs are float or int64",
                          im->label, gi->name, ps_onnx_dtype_name(gi->elem_type));
    if (!gi->has_shape) return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: input '%s' has no shape", im->label,
                                          gi->name);
    val *in = vmake(im, gi->name);
    if (!in) return oom(im);
    in->kind = VK_DATA;
    in->node = -1;
    in->dtype = gi->elem_type;
    in->ndim = gi->ndim;
    for (int d = 0; d < gi->ndim; d++) {
        in->dims[d] = gi->dims[d];
        if (gi->dims[d] == 0)
            return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: input '%s': dimension %d is 0 (psd's tensors are "
                              "not empty)", im->label, gi->name, d);
        if (gi->dims[d] < 0 && d >= im->lead)
            return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: input '%s': dimension %d is symbolic ('%s'): psd "
                              "needs every per-sample dimension", im->label, gi->name, d,
                              gi->dim_param[d] ? gi->dim_param[d] : "?");
    }
    if (prod(in->dims + im->lead, gi->ndim - im->lead) > PS_ONNX_MAX_NUMEL)
        return ps_err_set(im->err, PS_ERR_INVALID_ARGUMENT, "%s: input '%s': more than %lld values per sample",
                          im->label, gi->name, (long long)PS_ONNX_MAX_NUMEL);
    if (gi->ndim < im->lead)
        return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: input '%s' is a scalar", im->label, gi->name);
    if (gi->ndim - im->lead > PS_MAXD) {
        return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: input '%s' has %d dimensions per sample (psd takes at "
                          "most %d)", im->label, gi->name, gi->ndim - im->lead, PS_MAXD);
    }
    im->input = in;
    im->batch = im->whole ? 1 : gi->dims[0];
    /* the output (an LSTM's hidden state out is the trainer's) and liveness */
    val *out = NULL;
    int nout = 0;
    for (int i = 0; i < m->noutputs; i++) {
        val *v = vget(im, m->outputs[i].name);
        if (!v) return ps_err_set(im->err, PS_ERR_INVALID_ARGUMENT, "%s: graph output '%s' is never computed",
                                  im->label, m->outputs[i].name);
        if (v->trainer) continue;
        if (nout == MAX_INPUTS)
            return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: the graph has more than %d outputs (psd joins at "
                              "most %d into its one)", im->label, MAX_INPUTS, MAX_INPUTS);
        im->outs[nout++] = v->name;
        out = v;
        if (v->prod >= 0) im->live[v->prod] = 1;
    }
    if (nout == 0)
        return ps_err_set(im->err, PS_ERR_UNIMPLEMENTED, "%s: the graph has no output psd computes", im->label);
    im->nouts = nout;
    im->out_name = out->name;
    for (int i = m->nnodes - 1; i >= 0; i--) {
        if (!im->live[i]) continue;
        for (int k = 0; k < m->nodes[i].nin; k++) {
            int p = m->nodes[i].in[k][0] ? producer_of(im, m->nodes[i].in[k]) : -1;
            if (p >= i) return ps_err_set(im->err, PS_ERR_INVALID_ARGUMENT, "%s: node %d reads '%s' computed later "
                                          "(the nodes are not in topological order)", im->label, i, m->nodes[i].in[k]);
            if (p >= 0) im->live[p] = 1;
        }
    }
    find_patterns(im);
    for (int i = 0; i < m->nnodes; i++) {
        if (im->live[i] && im->absorbed[i] == 2) {   /* inside an nn.MultiheadAttention */
            im->cur = i;
            ps_status rc = mha_inner(im);
            if (rc) return rc;
            continue;
        }
        if (im->live[i] && im->absorbed[i] == 3) {   /* inside an LSTM / GRU chain */
            im->cur = i;
            ps_status rc = rnn_inner(im);
            if (rc) return rc;
            continue;
        }
        if (!im->live[i] || im->absorbed[i] || !strcmp(m->nodes[i].op_type, "Constant")) continue;
        const ps_onnx_node *n = &m->nodes[i];
        im->cur = i;
        if (im->fz[i].kind && !strcmp(im->fz[i].kind, "MultiheadAttention")) {
            ps_status rc = h_mha(im);
            if (rc) return rc;
            continue;
        }
        if (n->domain[0] && strcmp(n->domain, "ai.onnx"))
            return unsup(im, "op domain '%s': psd reads the default ONNX domain", n->domain);
        if (im->fz[i].kind && strcmp(im->fz[i].kind, "Pad")) {
            ps_status rc = h_fused(im);
            if (rc) return rc;
            continue;
        }
        const op_row *r = find_op(n->op_type);
        if (im->fz[i].kind) {   /* a zero Pad folded into this AveragePool / Conv: it reads the Pad's input */
            im->pad_extra[0] = im->fz[i].axis;
            im->pad_extra[1] = (int64_t)im->fz[i].eps;
            im->pad_extra[2] = i + 1;
            val *src = vget(im, im->fz[i].x), *pad_out = vget(im, n->in[0]);
            if (!src || src->kind == VK_NONE || !pad_out) return bad(im, "the Pad's input is unknown");
            val saved = *pad_out;
            *pad_out = *src;
            pad_out->next = saved.next;
            pad_out->name = saved.name;
            pad_out->uses = saved.uses;
            pad_out->prod = saved.prod;
            ps_status rc = r->fn(im);
            im->pad_extra[2] = 0;
            if (rc) return rc;
            continue;
        }
        if (!r) return unsup(im, "op %s is not supported", n->op_type);
        if (im->opset < r->min_opset) return unsup(im, "opset %lld (psd reads %s from opset %d)",
                                                   (long long)im->opset, n->op_type, r->min_opset);
        ps_status rc = r->fn(im);
        if (rc && im->needs_whole && im->lstm.layers && im->stage == 1 && (rc = trainer_tail(im, i)) == PS_OK)
            return PS_OK;
        if (rc) return rc;
    }
    im->cur = -1;
    if (im->lstm.layers && im->stage0_out < 0) return unsup(im, "an LSTM psd could not place");
    ps_status rc = im->nouts > 1 ? join_outputs(im) : PS_OK;   /* several: joined, out_name the join */
    if (rc == PS_OK) rc = output_value(im, im->out_name, &out);
    if (rc) return rc;
    im->out_node = out->node;
    return PS_OK;
}

/* At least need bytes free after o in *y (capacity *cap): 0, or -1 out of memory (*y freed). */
static int yaml_room(char **y, size_t *cap, size_t o, size_t need) {
    while (o + need > *cap) {
        char *ny = realloc(*y, *cap * 2);
        if (!ny) {
            free(*y);
            *y = NULL;
            return -1;
        }
        *y = ny;
        *cap *= 2;
    }
    return 0;
}

/* A comment's n bytes of the file's strings (a label, a producer, a node name) kept on their lines: control
 * characters (a producer 'backend\rtest') become '?'; the two header lines keep the newline between them. */
static void comment_scrub(char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] < 0x20 && !(s[i] == '\n' && i + 1 < n && s[i + 1] == '#')) || s[i] == 0x7f)
            s[i] = '?';
}

/* The model file's text. */
/* ", share: NODE" when every parameter of p is the same parameter of one
 * node of its kind (one module called at several sites), else ", tie:
 * {SUFFIX: NODE.SUFFIX, ...}" for those another node holds (an initializer
 * read by several nodes); nothing when p owns its parameters. Into buf (cap
 * bytes); returns the bytes written. */
static size_t shared_text(const imp *im, const pnode *p, char *buf, size_t cap) {
    int tied = 0, one = -1, same = 1;
    for (int k = 0; k < p->nb; k++) {
        const pbind *b = &p->b[k];
        if (!b->tie_pn) { same = 0; continue; }
        tied++;
        if (one < 0) one = b->tie_pn - 1;
        same &= b->tie_pn - 1 == one && !strcmp(b->tie_suffix, b->suffix);
    }
    if (!tied) return 0;
    const pnode *o = one >= 0 ? &im->pn[one] : NULL;
    if (same && tied == p->nb && o && !strcmp(o->kind, p->kind) && o->nb == p->nb)
        return (size_t)snprintf(buf, cap, ", share: %s", o->name);
    size_t n = (size_t)snprintf(buf, cap, ", tie: {");
    for (int k = 0, first = 1; k < p->nb && n < cap; k++) {
        const pbind *b = &p->b[k];
        if (!b->tie_pn) continue;
        const char *on = im->pn[b->tie_pn - 1].name;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s: %s%s%s", first ? "" : ", ", b->suffix, on,
                              b->tie_suffix[0] ? "." : "", b->tie_suffix);
        first = 0;
    }
    if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "}");
    return n < cap ? n : cap - 1;
}

static ps_status write_yaml(imp *im, ps_onnx_import *res, const char *name, int out_node) {
    size_t cap = 4096 + (size_t)im->npn * 1400, o = 0;
    char *y = malloc(cap);
    if (!y) return oom(im);
    const ps_onnx_model *m = im->m;
    char b[256];
    /* the file's strings (a label, a producer, a node name) may be kilobytes: room for each before it */
    if (yaml_room(&y, &cap, o, 1024 + strlen(im->label) + strlen(m->producer) + 2 * strlen(name))) return oom(im);
    size_t c0 = o;
    o += (size_t)snprintf(y + o, cap - o, "# imported from ONNX: %s\n#   producer '%s', IR %lld, opset %lld%s",
                          im->label, m->producer, (long long)m->ir_version, (long long)im->opset,
                          im->whole ? "; the whole input is one sample" : "");
    comment_scrub(y + c0, o - c0);
    o += (size_t)snprintf(y + o, cap - o, "\n");
    o += (size_t)snprintf(y + o, cap - o, "name: %s\nabout: \"ONNX model %s\"\n", name, name);
    if (im->trailing >= 0 && yaml_room(&y, &cap, o, 256 + strlen(m->nodes[im->trailing].name) +
                                                   strlen(m->nodes[im->trailing].op_type)))
        return oom(im);
    if (im->trailing >= 0) {
        c0 = o;
        o += (size_t)snprintf(y + o, cap - o, "# left to the trainer: node '%s' (%s) and what follows it",
                              m->nodes[im->trailing].name, m->nodes[im->trailing].op_type);
        comment_scrub(y + c0, o - c0);
        o += (size_t)snprintf(y + o, cap - o, "\n");
    }
    o += (size_t)snprintf(y + o, cap - o, "stages:\n");
    /* one stage "main"; with a trainer-side LSTM: "pre" (to the LSTM's input), "post" (from its output), and
     * the LSTM's parameters in a stage of its own */
    int nst = im->lstm.layers ? 3 : 1;
    for (int st = 0; st < nst; st++) {
        char sname[32];
        int64_t ps[MAXD];
        if (yaml_room(&y, &cap, o, 1500)) return oom(im);
        int n = 0, dtype_int = 0, last = st == 0 && nst > 1 ? im->stage0_out : out_node;
        if (nst == 1) {
            snprintf(sname, sizeof sname, "main");
        } else if (st < 2) {
            snprintf(sname, sizeof sname, "%s", st ? "post" : "pre");
        } else {
            sanitize(im->pn[im->lstm.pn].name, sname, sizeof sname);
            for (char *c = sname; *c; c++) if (*c == '.') *c = '_';
            last = im->lstm.pn;
        }
        if (st == 0) {
            n = sample_dims(im, im->input, ps);
            dtype_int = im->input->dtype == PS_ONNX_INT64;
        } else {
            ps[0] = st == 1 ? im->lstm.hidden : im->lstm.input;
            n = 1;
        }
        o += (size_t)snprintf(y + o, cap - o, "  - name: %s\n    input: {shape: %s, dtype: %s}\n", sname,
                              n ? dims_text(ps, n, b, sizeof b) : "[]", dtype_int ? "int64" : "float32");
        if (st < 2) o += (size_t)snprintf(y + o, cap - o, "    output: %s\n", im->pn[last].name);
        o += (size_t)snprintf(y + o, cap - o, "    nodes:\n");
        int prev = -1;
        for (int i = 0; i < im->npn; i++) {
            pnode *p = &im->pn[i];
            if (p->stage != st || (!p->readers && i != last)) continue;
            /* the line: names of at most NAME_MAX_ bytes, attributes, an LSTM's sizes */
            if (yaml_room(&y, &cap, o, 512 + strlen(p->attrs) + (size_t)p->nin * (NAME_MAX_ + 3) +
                                           (size_t)p->nb * (NAME_MAX_ + 60)))
                return oom(im);
            o += (size_t)snprintf(y + o, cap - o, "      - {name: %s, kind: %s", p->name, p->kind);
            if (p->nin > 1) {
                o += (size_t)snprintf(y + o, cap - o, ", inputs: [");
                for (int k = 0; k < p->nin; k++)
                    o += (size_t)snprintf(y + o, cap - o, "%s%s", k ? ", " : "",
                                          p->in[k] < 0 ? "input" : im->pn[p->in[k]].name);
                o += (size_t)snprintf(y + o, cap - o, "]");
            } else if (p->nin == 1 && p->in[0] != prev) {
                o += (size_t)snprintf(y + o, cap - o, ", input: %s", p->in[0] < 0 ? "input" : im->pn[p->in[0]].name);
            }
            if (st == 2)
                o += (size_t)snprintf(y + o, cap - o, ", hidden_size: %lld, num_layers: %d", (long long)im->lstm.hidden,
                                      im->lstm.layers);
            o += (size_t)snprintf(y + o, cap - o, "%s", p->attrs);
            o += shared_text(im, p, y + o, cap - o);
            o += (size_t)snprintf(y + o, cap - o, "}\n");
            prev = i;
        }
    }
    res->yaml = y;
    res->yaml_len = o;
    return PS_OK;
}

static ps_status import_once(const ps_onnx_model *m, const char *label, const ps_onnx_import_opts *o, int whole,
                             int *needs_whole, ps_onnx_import *res, ps_err *err) {
    imp im;
    memset(&im, 0, sizeof im);
    im.m = m;
    im.label = label;
    im.err = err;
    im.o = o;
    im.whole = whole;
    im.lead = whole ? 0 : 1;
    im.stage0_out = -1;
    im.trailing = -1;
    for (int i = 0; i < m->nnodes && !whole; i++)
        if (trainer_lstm(m, i)) im.lead = 2;   /* (seq, batch) leading dims */
    im.cur = -1;
    im.opset = m->opset;
    im.hcap = 1;
    while (im.hcap < 4 * (m->nnodes * 4 + m->ninits + m->ninputs + 16)) im.hcap <<= 1;
    im.hash = calloc((size_t)im.hcap, sizeof *im.hash);
    im.fz = calloc((size_t)m->nnodes + 1, sizeof *im.fz);
    ps_status rc;
    if (!im.hash || !im.fz) {
        rc = oom(&im);
        goto out;
    }
    if ((rc = convert(&im))) goto out;
    char name[64];
    if (o && o->name && o->name[0]) {
        snprintf(name, sizeof name, "%s", o->name);
    } else {
        const char *base = strrchr(label, '/');
        base = base ? base + 1 : label;
        size_t j = 0;
        for (; base[j] && j < sizeof name - 1; j++) name[j] = valid_char(base[j]) || base[j] == '-' ? base[j] : '_';
        name[j] = 0;
        char *dot = strstr(name, "_onnx");
        if (dot && !dot[5]) *dot = 0;
        if (!name[0]) snprintf(name, sizeof name, "onnx_model");
    }
    if ((rc = write_yaml(&im, res, name, im.out_node))) goto out;
    /* the initial values */
    int nv = 0;
    for (int i = 0; i < im.npn; i++) nv += im.pn[i].nb;
    res->values = calloc((size_t)nv + 1, sizeof *res->values);
    if (!res->values) { rc = oom(&im); goto out; }
    for (int i = 0; i < im.npn; i++)
        for (int k = 0; k < im.pn[i].nb; k++) {
            if (im.pn[i].b[k].tie_pn) continue;   /* another node's parameter: loaded under its owner's name */
            struct imp_value *v = &res->values[res->nvalues++];
            snprintf(v->name, sizeof v->name, "%s%s%s", im.pn[i].name, im.pn[i].b[k].suffix[0] ? "." : "",
                     im.pn[i].b[k].suffix);   /* an empty suffix: the node's name is the tensor's (class_token) */
            v->t = im.pn[i].b[k].t;
            v->transform = im.pn[i].b[k].transform;
            v->offset = im.pn[i].b[k].offset;
            v->numel = im.pn[i].b[k].numel;
        }
    res->whole = whole;
out:
    *needs_whole = im.needs_whole;
    pool_free(&im.mem);
    free(im.hash);
    free(im.pn);
    free(im.live);
    free(im.absorbed);
    free(im.fz);
    free(im.mha);
    free(im.rnn);
    free(im.rnn_at);
    return rc;
}

ps_onnx_import *ps_onnx_import_model(const ps_onnx_model *m, const char *label, const ps_onnx_import_opts *opts,
                                     ps_err *err) {
    ps_onnx_import *res = calloc(1, sizeof *res);
    if (!res) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory", label);
        return NULL;
    }
    if (m->opset && (m->opset < 1 || m->opset > 17)) {
        ps_err_set(err, PS_ERR_UNIMPLEMENTED, "%s: opset %lld: psd reads opsets up to 17", label, (long long)m->opset);
        free(res);
        return NULL;
    }
    if (!m->opset) {
        ps_err_set(err, m->nopsets ? PS_ERR_UNIMPLEMENTED : PS_ERR_INVALID_ARGUMENT, "%s: the model imports no "
                   "default-domain opset%s%s: psd reads ONNX's default domain", label, m->nopsets ? ", only " : "",
                   m->nopsets ? m->opsets[0].domain : "");
        free(res);
        return NULL;
    }
    ps_onnx_batch mode = opts ? opts->batch : PS_ONNX_BATCH_AUTO;
    int needs_whole = 0;
    ps_err first = {0};
    ps_status rc = import_once(m, label, opts, mode == PS_ONNX_BATCH_NONE, &needs_whole, res,
                               mode == PS_ONNX_BATCH_AUTO ? &first : err);
    if (rc && mode == PS_ONNX_BATCH_AUTO) {
        if (needs_whole) {
            free(res->yaml);
            free(res->values);
            memset(res, 0, sizeof *res);
            rc = import_once(m, label, opts, 1, &needs_whole, res, err);
        } else if (err) {
            *err = first;
        }
    }
    if (rc) {
        ps_onnx_import_free(res);
        return NULL;
    }
    return res;
}

void ps_onnx_import_free(ps_onnx_import *im) {
    if (!im) return;
    free(im->yaml);
    free(im->values);
    free(im);
}

const char *ps_onnx_import_yaml(const ps_onnx_import *im, size_t *len) {
    if (len) *len = im->yaml_len;
    return im->yaml;
}

int ps_onnx_import_whole_sample(const ps_onnx_import *im) { return im->whole; }
int ps_onnx_import_num_values(const ps_onnx_import *im) { return im->nvalues; }
const char *ps_onnx_import_value_name(const ps_onnx_import *im, int i) { return im->values[i].name; }
int64_t ps_onnx_import_value_numel(const ps_onnx_import *im, int i) { return im->values[i].numel; }

ps_status ps_onnx_import_value(const ps_onnx_import *im, int i, float *dst, ps_err *err) {
    const struct imp_value *v = &im->values[i];
    const ps_onnx_tensor *t = v->t;
    if (v->transform == TF_GATES) {   /* ONNX's gate order i, o, f, c as PyTorch's i, f, g, o */
        float *tmp = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *tmp);
        if (!tmp) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for '%s'", v->name);
        ps_status rc = ps_onnx_tensor_floats(t, tmp, err);
        static const int from[4] = {0, 2, 3, 1};
        int64_t g = v->numel / 4;
        for (int k = 0; rc == PS_OK && k < 4; k++) memcpy(dst + k * g, tmp + v->offset + from[k] * g, (size_t)g * 4);
        free(tmp);
        return rc;
    }
    if (v->transform == TF_GATES_GRU) {   /* ONNX's z, r, h as PyTorch's r, z, n */
        float *tmp = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *tmp);
        if (!tmp) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for '%s'", v->name);
        ps_status rc = ps_onnx_tensor_floats(t, tmp, err);
        static const int from[3] = {1, 0, 2};
        int64_t g = v->numel / 3;
        for (int k = 0; rc == PS_OK && k < 3; k++) memcpy(dst + k * g, tmp + v->offset + from[k] * g, (size_t)g * 4);
        free(tmp);
        return rc;
    }
    if (v->numel != t->numel) {   /* a scalar spread over numel */
        float x;
        ps_status rc = ps_onnx_tensor_floats(t, &x, err);
        if (rc) return rc;
        for (int64_t k = 0; k < v->numel; k++) dst[k] = x;
        return PS_OK;
    }
    if (v->transform != TF_TRANSPOSE) return ps_onnx_tensor_floats(t, dst, err);
    float *tmp = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *tmp);
    if (!tmp) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for '%s'", v->name);
    ps_status rc = ps_onnx_tensor_floats(t, tmp, err);
    int64_t r = t->dims[0], c = t->dims[1];
    for (int64_t a = 0; rc == PS_OK && a < r; a++)
        for (int64_t b = 0; b < c; b++) dst[b * r + a] = tmp[a * c + b];
    free(tmp);
    return rc;
}

int ps_onnx_is_onnx_file(const char *path) {
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".onnx")) return 1;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int c = fgetc(f);
    fclose(f);
    /* ModelProto's ir_version (field 1, varint) comes first in every
     * exporter's output; byte 0x08 is not text a model file starts with. */
    return c == 0x08;
}
