/* layers.c - the layer-kind table (see layers.h). One row per kind; the
 * functions above the table are that row's entries, grouped by kind. */
#include "layers.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ps_rows_clear(ps_rows *r) {
    free(r->rows);
    free(r->grad);
    memset(r, 0, sizeof *r);
}

static ps_status need_shape(const ps_layer *ly, int ndim, ps_dtype dt, ps_err *err) {
    char b[64];
    if ((ndim >= 0 && ly->in.ndim != ndim) || ly->in_dtype != dt)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%s layer%s%s: per-sample input %s %s; it takes %d dimension%s of %s",
                          ly->kind->name, ly->def->name ? " " : "", ly->def->name ? ly->def->name : "",
                          ps_shape_format(&ly->in, b, sizeof b), ps_dtype_name(ly->in_dtype), ndim,
                          ndim == 1 ? "" : "s", ps_dtype_name(dt));
    return PS_OK;
}

static void set_param(ps_layer *ly, int j, const char *suffix, int ndim, const int64_t *dims,
                      int64_t fan_in, ps_init_kind def_init, ps_init_kind override) {
    ps_layer_param *p = &ly->param[j];
    p->suffix = suffix;
    p->ndim = ndim;
    p->numel = 1;
    for (int d = 0; d < ndim; d++) { p->dims[d] = dims[d]; p->numel *= dims[d]; }
    p->fan_in = fan_in;
    p->init = override != PS_INIT_DEFAULT ? override : def_init;
    p->init_a = override != PS_INIT_DEFAULT ? ly->def->init_a : 0.0f;
    if (ly->nparams < j + 1) ly->nparams = j + 1;
}

static const char *no_op(const ps_backend_ops *ops) { (void)ops; return NULL; }

/* The same shape and dtype out as in. */
static ps_status infer_same(ps_layer *ly, ps_err *err) {
    ps_status rc = need_shape(ly, -1, PS_DTYPE_F32, err);
    if (rc) return rc;
    ly->outs = ly->in;
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static size_t no_bytes(const ps_layer *ly, int n) { (void)ly; (void)n; return 0; }

/* ---- conv2d: nn.Conv2d(cin, out, k, stride, pad); params weight, bias ---- */

static ps_conv_desc conv_desc(const ps_layer *ly, int n) {
    ps_conv_desc d = {n, (int)ly->in.dims[0], (int)ly->in.dims[1], (int)ly->in.dims[2], ly->out, ly->k, ly->k,
                      ly->stride, ly->pad, ly->in_layout, ly->out_layout};
    return d;
}

static ps_status conv_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_shape(ly, 3, PS_DTYPE_F32, err);
    if (rc) return rc;
    ps_conv_desc d = conv_desc(ly, 1);
    if (ly->out < 1 || ly->k < 1 || ly->stride < 1 || ps_conv_out_h(&d) < 1 || ps_conv_out_w(&d) < 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "conv2d %s: kernel %d does not fit the input",
                          ly->def->name, ly->k);
    ly->outs.ndim = 3;
    ly->outs.dims[0] = ly->out;
    ly->outs.dims[1] = ps_conv_out_h(&d);
    ly->outs.dims[2] = ps_conv_out_w(&d);
    ly->out_dtype = PS_DTYPE_F32;
    int64_t fan_in = ly->in.dims[0] * ly->k * ly->k;
    int64_t wd[4] = {ly->out, ly->in.dims[0], ly->k, ly->k}, bd[1] = {ly->out};
    set_param(ly, 0, "weight", 4, wd, fan_in, PS_INIT_UNIFORM, ly->def->w_init);
    set_param(ly, 1, "bias", 1, bd, fan_in, PS_INIT_UNIFORM, ly->def->b_init);
    return PS_OK;
}

static ps_status conv_forward(ps_layer_call *c, ps_err *err) {
    ps_conv_desc d = conv_desc(c->ly, c->n);
    return c->be->ops->conv2d_forward(c->be->impl, &d, c->x, c->w[0], c->w[1], c->y, err);
}

static ps_status conv_backward(ps_layer_call *c, ps_err *err) {
    ps_conv_desc d = conv_desc(c->ly, c->n);
    return c->be->ops->conv2d_backward(c->be->impl, &d, c->x, c->w[0], c->dy, c->dx, c->dw[0], c->dw[1], err);
}

/* ---- relu ---- */

static ps_status relu_forward(ps_layer_call *c, ps_err *err) {
    return c->be->ops->relu_forward(c->be->impl, ps_layer_out_count(c->ly, c->n), c->x, c->y, err);
}

static ps_status relu_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return c->be->ops->relu_backward(c->be->impl, ps_layer_out_count(c->ly, c->n), c->y, c->dy, c->dx, err);
}

/* ---- maxpool2d: F.max_pool2d(k, stride) ---- */

static ps_pool_desc pool_desc(const ps_layer *ly, int n) {
    ps_pool_desc d = {n, (int)ly->in.dims[0], (int)ly->in.dims[1], (int)ly->in.dims[2], ly->k, ly->stride,
                      ly->in_layout};
    return d;
}

static ps_status pool_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_shape(ly, 3, PS_DTYPE_F32, err);
    if (rc) return rc;
    ps_pool_desc d = pool_desc(ly, 1);
    if (ly->k < 1 || ly->stride < 1 || ps_pool_out_h(&d) < 1 || ps_pool_out_w(&d) < 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "maxpool2d: window %d does not fit the input", ly->k);
    ly->outs.ndim = 3;
    ly->outs.dims[0] = ly->in.dims[0];
    ly->outs.dims[1] = ps_pool_out_h(&d);
    ly->outs.dims[2] = ps_pool_out_w(&d);
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static ps_status pool_forward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    ps_pool_desc d = pool_desc(c->ly, c->n);
    size_t wsb = ops->maxpool_workspace_size(c->be->impl, &d);
    c->saved->dev = wsb ? ops->alloc(c->be->impl, wsb) : NULL;
    if (wsb && !c->saved->dev) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for pooling");
    return ops->maxpool_forward(c->be->impl, &d, c->x, c->y, c->saved->dev, err);
}

static ps_status pool_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    ps_pool_desc d = pool_desc(c->ly, c->n);
    return c->be->ops->maxpool_backward(c->be->impl, &d, c->saved->dev, c->dy, c->dx, err);
}

/* ---- dropout (nn.Dropout, elementwise) and dropout2d (nn.Dropout2d) ----
 * Inverted dropout: kept elements are scaled by 1/(1-p). The mask lives in
 * the tape at full size (the same multiply serves both kinds); dropout2d
 * draws one value per (sample, channel) and spreads it over the channel.
 * An injected mask (golden tests) is (n, per-sample shape) for dropout and
 * (n, C) for dropout2d. */

static ps_status dropout_infer(ps_layer *ly, ps_err *err) {
    if (!(ly->p >= 0.0f && ly->p < 1.0f))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: p = %g is outside [0, 1)", ly->kind->name,
                          (double)ly->p);
    return infer_same(ly, err);
}

static ps_status dropout2d_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_shape(ly, 3, PS_DTYPE_F32, err);
    return rc ? rc : dropout_infer(ly, err);
}

/* Fill the full-size host mask; group = elements sharing one draw. */
static ps_status dropout_run(ps_layer_call *c, int64_t group, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    int64_t count = ps_layer_out_count(c->ly, c->n);
    float *mask = ps_backend_alloc_floats(c->be, count);
    float *host = malloc((size_t)count * sizeof(float));
    if (!mask || !host) {
        ps_backend_release(c->be, mask);
        free(host);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for dropout");
    }
    c->saved->dev = mask;
    float keep = 1.0f / (1.0f - c->ly->p);
    for (int64_t g = 0; g < count / group; g++) {
        float v = c->mask ? c->mask[g] : (ps_rng_uniform(c->rng) < c->ly->p ? 0.0f : keep);
        for (int64_t i = 0; i < group; i++) host[g * group + i] = v;
    }
    ps_status rc = ops->copy_to_device(c->be->impl, mask, host, (size_t)count * sizeof(float), err);
    free(host);
    if (rc != PS_OK) return rc;
    return ops->mul(c->be->impl, count, c->x, mask, c->y, err);
}

static ps_status dropout_forward(ps_layer_call *c, ps_err *err) { return dropout_run(c, 1, err); }

static ps_status dropout2d_forward(ps_layer_call *c, ps_err *err) {
    return dropout_run(c, c->ly->in.dims[1] * c->ly->in.dims[2], err);
}

static ps_status dropout_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return c->be->ops->mul(c->be->impl, ps_layer_out_count(c->ly, c->n), c->dy, c->saved->dev, c->dx, err);
}

static size_t dropout_bytes(const ps_layer *ly, int n) { return (size_t)ps_layer_out_count(ly, n) * sizeof(float); }

/* ---- flatten: torch.flatten(x, 1); a view ---- */

static ps_status flatten_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_shape(ly, -1, PS_DTYPE_F32, err);
    if (rc) return rc;
    ly->outs.ndim = 1;
    ly->outs.dims[0] = ps_shape_numel(&ly->in);
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static ps_status view_pass(ps_layer_call *c, ps_err *err) { (void)c; (void)err; return PS_OK; }

/* ---- linear: nn.Linear(in, out) over the last dimension ---- */

static ps_linear_desc linear_desc(const ps_layer *ly, int n) {
    ps_linear_desc d = {(int)(n * ps_shape_rows(&ly->in)), (int)ps_shape_last(&ly->in), ly->out};
    return d;
}

static ps_status linear_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_shape(ly, -1, PS_DTYPE_F32, err);
    if (rc) return rc;
    if (ly->in.ndim < 1 || ly->out < 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "linear %s: needs a per-sample input of at least "
                          "one dimension and out >= 1", ly->def->name);
    ly->outs = ly->in;
    ly->outs.dims[ly->outs.ndim - 1] = ly->out;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t in = ps_shape_last(&ly->in);
    int64_t wd[2] = {ly->out, in}, bd[1] = {ly->out};
    set_param(ly, 0, "weight", 2, wd, in, PS_INIT_UNIFORM, ly->def->w_init);
    set_param(ly, 1, "bias", 1, bd, in, PS_INIT_UNIFORM, ly->def->b_init);
    return PS_OK;
}

static ps_status linear_forward(ps_layer_call *c, ps_err *err) {
    ps_linear_desc d = linear_desc(c->ly, c->n);
    return c->be->ops->linear_forward(c->be->impl, &d, c->x, c->w[0], c->w[1], c->y, err);
}

static ps_status linear_backward(ps_layer_call *c, ps_err *err) {
    ps_linear_desc d = linear_desc(c->ly, c->n);
    return c->be->ops->linear_backward(c->be->impl, &d, c->x, c->w[0], c->dy, c->dx, c->dw[0], c->dw[1], err);
}

/* ---- log_softmax and softmax over the last dimension ---- */

static ps_status log_softmax_forward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    return c->be->ops->log_softmax_forward(c->be->impl, (int)(c->n * ps_shape_rows(&ly->in)),
                                           (int)ps_shape_last(&ly->in), c->x, c->y, err);
}

static ps_status log_softmax_backward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    if (!c->dx) return PS_OK;
    return c->be->ops->log_softmax_backward(c->be->impl, (int)(c->n * ps_shape_rows(&ly->in)),
                                            (int)ps_shape_last(&ly->in), c->y, c->dy, c->dx, err);
}

static const char *softmax_missing(const ps_backend_ops *ops) {
    return ops->softmax_forward && ops->softmax_backward ? NULL : "softmax_forward/softmax_backward";
}

static ps_status softmax_forward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    return c->be->ops->softmax_forward(c->be->impl, c->n * ps_shape_rows(&ly->in), (int)ps_shape_last(&ly->in),
                                       c->x, c->y, err);
}

static ps_status softmax_backward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    if (!c->dx) return PS_OK;
    return c->be->ops->softmax_backward(c->be->impl, c->n * ps_shape_rows(&ly->in), (int)ps_shape_last(&ly->in),
                                        c->y, c->dy, c->dx, err);
}

/* ---- embedding: nn.Embedding(num, out); int64 ids in, rows out ----
 * The weight's gradient is row-sparse: the unique ids of the batch and the
 * sum of the output gradients of each (a scatter-add). */

static ps_status emb_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_shape(ly, -1, PS_DTYPE_I64, err);
    if (rc) return rc;
    if (ly->in.ndim >= PS_SHAPE_MAX_DIMS || ly->num < 1 || ly->out < 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "embedding %s: needs num >= 1, dim >= 1 and at most "
                          "%d per-sample dimensions", ly->def->name, PS_SHAPE_MAX_DIMS - 1);
    ly->outs = ly->in;
    ly->outs.dims[ly->outs.ndim++] = ly->out;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t wd[2] = {ly->num, ly->out};
    set_param(ly, 0, "weight", 2, wd, ly->out, PS_INIT_NORMAL, ly->def->w_init);
    ly->param[0].sparse = 1;
    return PS_OK;
}

static const char *emb_missing(const ps_backend_ops *ops) {
    return ops->embedding_forward && ops->embedding_backward ? NULL : "embedding_forward/embedding_backward";
}

static ps_status emb_check(const ps_layer *ly, const void *host_x, int64_t count, ps_err *err) {
    const int64_t *ids = host_x;
    int64_t lo = ly->row_lo, hi = ly->row_lo + ly->num;
    for (int64_t i = 0; i < count; i++) {
        if (ids[i] >= lo && ids[i] < hi) continue;
        if (ly->row_total)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                              "input[%lld] = %lld is outside this shard's rows [%lld, %lld) of %s.weight "
                              "(%lld rows over its shards)", (long long)i, (long long)ids[i], (long long)lo,
                              (long long)hi, ly->def->name, (long long)ly->row_total);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "input[%lld] = %lld is not a row of %s.weight (0..%d)", (long long)i,
                          (long long)ids[i], ly->def->name, ly->num - 1);
    }
    return PS_OK;
}

/* A shard's ids (global) as local rows, in a new buffer of c->be's
 * device; NULL on failure (err set). */
static int64_t *emb_local_ids(const ps_layer_call *c, int64_t n, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    size_t ib = (size_t)n * sizeof(int64_t);
    int64_t *h = malloc(ib ? ib : 8), *d = ops->alloc(c->be->impl, ib ? ib : 8);
    ps_status rc = PS_OK;
    if (!h || !d) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's ids", c->ly->def->name);
    if (rc == PS_OK) rc = ops->copy_to_host(c->be->impl, h, c->x, ib, err);
    for (int64_t i = 0; rc == PS_OK && i < n; i++) h[i] -= c->ly->row_lo;
    if (rc == PS_OK) rc = ops->copy_to_device(c->be->impl, d, h, ib, err);
    free(h);
    if (rc != PS_OK) { ps_backend_release(c->be, d); return NULL; }
    return d;
}

static ps_status emb_forward(ps_layer_call *c, ps_err *err) {
    int64_t n = c->n * ps_shape_numel(&c->ly->in);
    if (!c->ly->row_lo)
        return c->be->ops->embedding_forward(c->be->impl, n, c->ly->out, c->x, c->w[0], c->y, err);
    int64_t *ids = emb_local_ids(c, n, err);
    if (!ids) return PS_ERR_RESOURCE_EXHAUSTED;
    ps_status rc = c->be->ops->embedding_forward(c->be->impl, n, c->ly->out, ids, c->w[0], c->y, err);
    ps_backend_release(c->be, ids);
    return rc;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static ps_status emb_backward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    void *impl = c->be->impl;
    int64_t n = c->n * ps_shape_numel(&c->ly->in);
    int dim = c->ly->out;
    size_t ib = (size_t)n * sizeof(int64_t);
    int64_t *ids = malloc(ib), *sorted = malloc(ib), *slot = malloc(ib);
    int64_t *dslot = ops->alloc(impl, ib ? ib : 8);
    float *dgrows = NULL;
    ps_status rc = PS_OK;
    ps_rows r = {0};
    if (!ids || !sorted || !slot || !dslot) goto oom;
    if ((rc = ops->copy_to_host(impl, ids, c->x, ib, err)) != PS_OK) goto done;
    for (int64_t i = 0; i < n; i++) ids[i] -= c->ly->row_lo;   /* a shard's local rows */
    memcpy(sorted, ids, ib);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_i64);
    int64_t nrows = 0;
    for (int64_t i = 0; i < n; i++)
        if (i == 0 || sorted[i] != sorted[i - 1]) sorted[nrows++] = sorted[i];
    for (int64_t i = 0; i < n; i++) {   /* slot = position of ids[i] among the unique rows */
        const int64_t *p = bsearch(&ids[i], sorted, (size_t)nrows, sizeof *sorted, cmp_i64);
        slot[i] = p - sorted;
    }
    r.rows = malloc((size_t)nrows * sizeof(int64_t));
    r.grad = malloc((size_t)nrows * dim * sizeof(float));
    dgrows = ps_backend_alloc_floats(c->be, nrows * dim);
    if (!r.rows || !r.grad || !dgrows) goto oom;
    memcpy(r.rows, sorted, (size_t)nrows * sizeof(int64_t));
    r.nrows = nrows;
    r.width = dim;
    if ((rc = ops->copy_to_device(impl, dslot, slot, ib, err)) != PS_OK ||
        (rc = ops->embedding_backward(impl, n, dim, dslot, c->dy, nrows, dgrows, err)) != PS_OK ||
        (rc = ops->copy_to_host(impl, r.grad, dgrows, (size_t)nrows * dim * sizeof(float), err)) != PS_OK)
        goto done;
    ps_rows_clear(c->rows);
    *c->rows = r;
    memset(&r, 0, sizeof r);
    goto done;
oom:
    rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the %s.weight gradient", c->ly->def->name);
done:
    ps_rows_clear(&r);
    free(ids);
    free(sorted);
    free(slot);
    ps_backend_release(c->be, dslot);
    ps_backend_release(c->be, dgrows);
    return rc;
}

/* ---- lstm: the parameters of one nn.LSTM layer (weight_ih_l<k>,
 * weight_hh_l<k>, bias_ih_l<k>, bias_hh_l<k>; gate order i, f, g, o),
 * PyTorch's init U(-1/sqrt(H), 1/sqrt(H)) for all four. psd only holds
 * them: the LSTM runs on the trainer (common/nn/lstm.h), which pulls the
 * weights and pushes their gradients (PushGradients). A stage of lstm
 * layers is parameter-only: Forward and Backward on it are refused. ---- */

#define LSTM_MAX_LAYERS 8
static const char *const lstm_suffix[LSTM_MAX_LAYERS][4] = {
#define LSTM_SUFFIXES(l) {"weight_ih_l" #l, "weight_hh_l" #l, "bias_ih_l" #l, "bias_hh_l" #l}
    LSTM_SUFFIXES(0), LSTM_SUFFIXES(1), LSTM_SUFFIXES(2), LSTM_SUFFIXES(3),
    LSTM_SUFFIXES(4), LSTM_SUFFIXES(5), LSTM_SUFFIXES(6), LSTM_SUFFIXES(7),
#undef LSTM_SUFFIXES
};

static ps_status lstm_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_shape(ly, 1, PS_DTYPE_F32, err);
    if (rc) return rc;
    if (ly->out < 1 || ly->k < 0 || ly->k >= LSTM_MAX_LAYERS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lstm %s: needs hidden size >= 1 and a layer index "
                          "0..%d (got %d, %d)", ly->def->name, LSTM_MAX_LAYERS - 1, ly->out, ly->k);
    int64_t in = ly->in.dims[0], H = ly->out;
    ly->outs = ly->in;
    ly->outs.dims[0] = H;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t wi[2] = {4 * H, in}, wh[2] = {4 * H, H}, b[1] = {4 * H};
    set_param(ly, 0, lstm_suffix[ly->k][0], 2, wi, H, PS_INIT_UNIFORM, PS_INIT_DEFAULT);
    set_param(ly, 1, lstm_suffix[ly->k][1], 2, wh, H, PS_INIT_UNIFORM, PS_INIT_DEFAULT);
    set_param(ly, 2, lstm_suffix[ly->k][2], 1, b, H, PS_INIT_UNIFORM, PS_INIT_DEFAULT);
    set_param(ly, 3, lstm_suffix[ly->k][3], 1, b, H, PS_INIT_UNIFORM, PS_INIT_DEFAULT);
    return PS_OK;
}

static ps_status lstm_refuse(ps_layer_call *c, ps_err *err) {
    return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "lstm %s: psd holds this LSTM's parameters only; the "
                      "LSTM runs on the trainer (pull them with GetParameters, push their gradients with "
                      "PushGradients)", c->ly->def->name);
}

/* ---------------------------------------------------------------- table */

static const ps_layer_kind kinds[] = {
    {"conv2d", PS_KIND_LAYOUT_BLOCKED, conv_infer, no_op, conv_forward, conv_backward, no_bytes, NULL},
    {"relu", PS_KIND_LAYOUT_KEEP, infer_same, no_op, relu_forward, relu_backward, no_bytes, NULL},
    {"maxpool2d", PS_KIND_LAYOUT_KEEP, pool_infer, no_op, pool_forward, pool_backward, no_bytes, NULL},
    {"dropout", PS_KIND_EVAL_VIEW | PS_KIND_DROPOUT, dropout_infer, no_op, dropout_forward, dropout_backward,
     dropout_bytes, NULL},
    {"dropout2d", PS_KIND_EVAL_VIEW | PS_KIND_DROPOUT, dropout2d_infer, no_op, dropout2d_forward,
     dropout_backward, dropout_bytes, NULL},
    {"flatten", PS_KIND_VIEW, flatten_infer, no_op, view_pass, view_pass, no_bytes, NULL},
    {"linear", PS_KIND_OUTPUT_FREE, linear_infer, no_op, linear_forward, linear_backward, no_bytes, NULL},
    {"log_softmax", 0, infer_same, no_op, log_softmax_forward, log_softmax_backward, no_bytes, NULL},
    {"softmax", 0, infer_same, softmax_missing, softmax_forward, softmax_backward, no_bytes, NULL},
    {"embedding", 0, emb_infer, emb_missing, emb_forward, emb_backward, no_bytes, emb_check},
    {"lstm", PS_KIND_PARAMS_ONLY, lstm_infer, no_op, lstm_refuse, lstm_refuse, no_bytes, NULL},
};

const ps_layer_kind *ps_layer_kind_find(const char *name) {
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (name && !strcmp(kinds[i].name, name)) return &kinds[i];
    return NULL;
}

ps_status ps_layer_infer(ps_layer *ly, ps_err *err) {
    ly->nparams = 0;
    memset(ly->param, 0, sizeof ly->param);
    return ly->kind->infer(ly, err);
}

static float normal01(ps_rng *r) {  /* Box-Muller */
    float u1 = ps_rng_uniform(r), u2 = ps_rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

void ps_layer_init_param(const ps_layer *ly, int j, float *host, ps_rng *r) {
    const ps_layer_param *p = &ly->param[j];
    float bound = p->init == PS_INIT_UNIFORM && p->init_a > 0 ? p->init_a : 1.0f / sqrtf((float)p->fan_in);
    for (int64_t i = 0; i < p->numel; i++) {
        switch (p->init) {
        case PS_INIT_NORMAL: host[i] = normal01(r); break;
        case PS_INIT_ZERO: host[i] = 0.0f; break;
        default: host[i] = (2.0f * ps_rng_uniform(r) - 1.0f) * bound; break;
        }
    }
}
