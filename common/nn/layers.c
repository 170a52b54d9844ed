/* layers.c - the layer-kind table (see layers.h): attribute resolution,
 * initialisation, and one row per kind; the functions above the table are
 * that row's entries, grouped by kind. */
#include "layers.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ps_rows_clear(ps_rows *r) {
    free(r->rows);
    free(r->grad);
    memset(r, 0, sizeof *r);
}

/* ------------------------------------------------------------ attributes */

static int is_bool_word(const char *s, int *v) {
    if (!strcmp(s, "true") || !strcmp(s, "True")) { *v = 1; return 1; }
    if (!strcmp(s, "false") || !strcmp(s, "False")) { *v = 0; return 1; }
    return 0;
}

/* One numeric value: a literal or a size (by name). */
static ps_status attr_number(const ps_layer *ly, const ps_attr_spec *sp, const char *text, const ps_model_def *def,
                             int n, const char *const *keys, const double *values, double *out, ps_err *err) {
    char *end;
    double v = text ? strtod(text, &end) : 0;
    if (text && *text && !*end && isfinite(v)) {
        *out = v;
        return PS_OK;
    }
    if (text && ps_model_def_size(def, text)) {
        *out = ps_model_def_size_value(def, text, n, keys, values);
        return PS_OK;
    }
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is neither a number nor a size of the model", sp->name,
                      text ? text : "null");
    (void)ly;
}

static ps_status attr_range(const ps_attr_spec *sp, double v, int integer, ps_err *err) {
    int lo_ok = sp->lo_open ? v > sp->lo : v >= sp->lo, hi_ok = sp->hi_open ? v < sp->hi : v <= sp->hi;
    if (integer && v != floor(v))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %g is not a whole number", sp->name, v);
    if (!lo_ok || !hi_ok) {
        char lo[32], hi[32];
        snprintf(lo, sizeof lo, "%g", sp->lo);
        snprintf(hi, sizeof hi, "%g", sp->hi);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %g is outside %s%s, %s%s", sp->name, v,
                          sp->lo_open ? "(" : "[", sp->lo < -1e15 ? "-inf" : lo, sp->hi > 1e15 ? "inf" : hi,
                          sp->hi_open ? ")" : "]");
    }
    return PS_OK;
}

/* Set attribute sp from nvals texts (a list when is_list). */
static ps_status attr_set(ps_layer *ly, const ps_attr_spec *sp, int is_list, int nvals, const char *const *vals,
                          const ps_model_def *def, int n, const char *const *keys, const double *values,
                          ps_err *err) {
    char *base = (char *)&ly->a;
    double x;
    ps_status st;
    switch (sp->type) {
    case PS_ATTR_BOOL: {
        int b;
        if (!vals[0] || !is_bool_word(vals[0], &b))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not true or false", sp->name,
                              vals[0] ? vals[0] : "null");
        *(int *)(base + sp->off) = b;
        return PS_OK;
    }
    case PS_ATTR_ENUM:
        for (int i = 0; sp->enums[i]; i++)
            if (vals[0] && !strcmp(sp->enums[i], vals[0])) { *(int *)(base + sp->off) = i; return PS_OK; }
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' is not a value it takes", sp->name,
                          vals[0] ? vals[0] : "null");
    case PS_ATTR_FLOAT_OR_NULL:
        if (!vals[0]) { *(int *)(base + sp->off2) = 1; return PS_OK; }
        *(int *)(base + sp->off2) = 0;
        /* fall through */
    case PS_ATTR_FLOAT:
        if ((st = attr_number(ly, sp, vals[0], def, n, keys, values, &x, err))) return st;
        if ((st = attr_range(sp, x, 0, err))) return st;
        *(double *)(base + sp->off) = x;
        return PS_OK;
    case PS_ATTR_INT:
        if ((st = attr_number(ly, sp, vals[0], def, n, keys, values, &x, err))) return st;
        if ((st = attr_range(sp, x, 1, err))) return st;
        *(int64_t *)(base + sp->off) = (int64_t)x;
        return PS_OK;
    case PS_ATTR_PAIR: {
        int64_t *p = (int64_t *)(base + sp->off);
        for (int i = 0; i < 2; i++) {
            const char *t = vals[is_list ? i : 0];
            if ((st = attr_number(ly, sp, t, def, n, keys, values, &x, err))) return st;
            if ((st = attr_range(sp, x, 1, err))) return st;
            p[i] = (int64_t)x;
        }
        return PS_OK;
    }
    case PS_ATTR_DIMS: {
        int64_t *p = (int64_t *)(base + sp->off);
        for (int i = 0; i < nvals; i++) {
            if ((st = attr_number(ly, sp, vals[i], def, n, keys, values, &x, err))) return st;
            if ((st = attr_range(sp, x, 1, err))) return st;
            p[i] = (int64_t)x;
        }
        *(int *)(base + sp->off2) = nvals;
        return PS_OK;
    }
    }
    return ps_err_set(err, PS_ERR_INTERNAL, "attribute type %d", (int)sp->type);
}

/* A default's text as one value or a bracketed list "[a, b]". */
static ps_status attr_default(ps_layer *ly, const ps_attr_spec *sp, const ps_model_def *def, ps_err *err) {
    if (!sp->def[0]) return PS_OK;   /* "" = not given: the field keeps its zero (inferred) */
    if (!strcmp(sp->def, "null")) {
        const char *v[1] = {NULL};
        return attr_set(ly, sp, 0, 1, v, def, 0, NULL, NULL, err);
    }
    const char *v[1] = {sp->def};
    return attr_set(ly, sp, 0, 1, v, def, 0, NULL, NULL, err);
}

ps_status ps_layer_resolve(ps_layer *ly, const ps_model_def *def, int n, const char *const *keys,
                           const double *values, ps_err *err) {
    memset(&ly->a, 0, sizeof ly->a);
    ps_status st;
    for (const ps_attr_spec *sp = ly->kind->attrs; sp && sp->name; sp++)
        if (sp->def && (st = attr_default(ly, sp, def, err)) != PS_OK) return st;
    for (int i = 0; ly->def && i < ly->def->nattr; i++) {
        const ps_attr_def *ad = &ly->def->attrs[i];
        const ps_attr_spec *sp = ps_layer_kind_attr(ly->kind, ad->key);
        PS_ASSERT(sp && "the loader checked the attribute names");
        if ((st = attr_set(ly, sp, ad->is_list, ad->nvals, ad->vals, def, n, keys, values, err)) != PS_OK)
            return st;
    }
    return PS_OK;
}

/* ---------------------------------------------------------------- init */

ps_status ps_init_parse(const char *spec, ps_init *out, ps_err *err) {
    memset(out, 0, sizeof *out);
    double a = 0, b = 0;
    char tail;
    if (!strcmp(spec, "default")) { out->kind = PS_INIT_DEFAULT; return PS_OK; }
    if (!strcmp(spec, "zeros")) { out->kind = PS_INIT_CONST; return PS_OK; }
    if (!strcmp(spec, "ones")) { out->kind = PS_INIT_CONST; out->a = 1; return PS_OK; }
    if (sscanf(spec, "constant(%lf)%c", &a, &tail) == 1 && isfinite(a)) {
        out->kind = PS_INIT_CONST;
        out->a = (float)a;
        return PS_OK;
    }
    if (sscanf(spec, "uniform(%lf ,%lf)%c", &a, &b, &tail) == 2 && isfinite(a) && isfinite(b) && a < b) {
        out->kind = PS_INIT_UNIFORM;
        out->a = (float)a;
        out->b = (float)b;
        return PS_OK;
    }
    if (sscanf(spec, "normal(%lf ,%lf)%c", &a, &b, &tail) == 2 && isfinite(a) && isfinite(b) && b >= 0) {
        out->kind = PS_INIT_NORMAL;
        out->a = (float)a;
        out->b = (float)b;
        return PS_OK;
    }
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "'%.64s' is not an initialisation (default, zeros, ones, "
                      "constant(V), uniform(A, B) with A < B, normal(MEAN, STD))", spec);
}

static float normal01(ps_rng *r) {  /* Box-Muller */
    float u1 = ps_rng_uniform(r), u2 = ps_rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

void ps_layer_init_param(const ps_layer *ly, int j, float *host, ps_rng *r) {
    const ps_layer_param *p = &ly->param[j];
    const ps_init *in = &p->init;
    if (in->kind == PS_INIT_CONST) {
        for (int64_t i = 0; i < p->numel; i++) host[i] = in->a;
        return;
    }
    if (in->kind == PS_INIT_NORMAL) {
        for (int64_t i = 0; i < p->numel; i++) host[i] = in->a + in->b * normal01(r);
        return;
    }
    /* uniform: symmetric bounds as (2u - 1) * bound (the draw the C tables made) */
    if (in->fan_bound || in->a == -in->b) {
        float bound = in->fan_bound ? 1.0f / sqrtf((float)(p->fan_in ? p->fan_in : 1)) : in->b;
        for (int64_t i = 0; i < p->numel; i++) host[i] = (2.0f * ps_rng_uniform(r) - 1.0f) * bound;
        return;
    }
    for (int64_t i = 0; i < p->numel; i++) host[i] = in->a + (in->b - in->a) * ps_rng_uniform(r);
}

/* ------------------------------------------------------------- helpers */

static ps_status need_ndim(const ps_layer *ly, int i, int lo, int hi, ps_dtype dt, ps_err *err) {
    char b[64];
    if (ly->in[i].ndim < lo || ly->in[i].ndim > hi || ly->in_dtype[i] != dt) {
        if (lo == hi)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "per-sample input %s %s; it takes %d dimension%s of %s",
                              ps_shape_format(&ly->in[i], b, sizeof b), ps_dtype_name(ly->in_dtype[i]), lo,
                              lo == 1 ? "" : "s", ps_dtype_name(dt));
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "per-sample input %s %s; it takes %d..%d dimensions of %s",
                          ps_shape_format(&ly->in[i], b, sizeof b), ps_dtype_name(ly->in_dtype[i]), lo, hi,
                          ps_dtype_name(dt));
    }
    return PS_OK;
}

/* a * b for sizes, saturating at PS_NUMEL_MAX + 1 (too large; refused by the builder). */
static int64_t sat_mul(int64_t a, int64_t b) {
    if (a <= 0 || b <= 0) return a * b == 0 ? 0 : PS_NUMEL_MAX + 1;
    return a > (PS_NUMEL_MAX + 1) / b ? PS_NUMEL_MAX + 1 : a * b;
}

static void set_param(ps_layer *ly, int j, const char *suffix, int ndim, const int64_t *dims, int64_t fan_in,
                      ps_init def_init) {
    ps_layer_param *p = &ly->param[j];
    p->suffix = suffix;
    p->ndim = ndim;
    p->numel = 1;
    for (int d = 0; d < ndim; d++) { p->dims[d] = dims[d]; p->numel = sat_mul(p->numel, dims[d]); }
    p->fan_in = fan_in;
    p->init = def_init;
    if (ly->nparams < j + 1) ly->nparams = j + 1;
}

static const ps_init FAN_UNIFORM = {PS_INIT_UNIFORM, 0, 0, 1};
static const ps_init NORMAL01 = {PS_INIT_NORMAL, 0, 1, 0};

static inline void set_buffer(ps_layer *ly, const char *suffix, int ndim, const int64_t *dims, ps_dtype dt, float init) {
    ps_layer_buffer *b = &ly->buffer[ly->nbuffers++];
    b->suffix = suffix;
    b->ndim = ndim;
    b->numel = 1;
    for (int d = 0; d < ndim; d++) { b->dims[d] = dims[d]; b->numel = sat_mul(b->numel, dims[d]); }
    b->dtype = dt;
    b->init = init;
}

static ps_status check_given(const char *what, int64_t given, int64_t inferred, ps_err *err) {
    if (given && given != inferred)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s is %lld but the input has %lld", what, (long long)given,
                          (long long)inferred);
    return PS_OK;
}

/* The same shape and dtype out as in (float). */
static ps_status infer_same(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* A PyTorch dim (batch = 0, negatives from the end of the batched shape)
 * as a per-sample dimension 0..ndim-1; -1 when it is the batch or out of range. */
static int sample_dim(int64_t dim, int ndim) {
    int64_t full = ndim + 1;
    if (dim < 0) dim += full;
    if (dim < 1 || dim >= full) return -1;
    return (int)(dim - 1);
}

static const char *no_op(const ps_layer *ly, const ps_backend_ops *ops) { (void)ly; (void)ops; return NULL; }

static ps_status view_pass(ps_layer_call *c, ps_err *err) { (void)c; (void)err; return PS_OK; }

/* ---- Conv2d: nn.Conv2d(in_channels, out_channels, kernel_size, stride,
 * padding, dilation, groups, bias); params weight (out, in/groups, kh, kw),
 * bias (out) ---- */

static ps_conv_desc conv_desc(const ps_layer *ly, int n) {
    const ps_layer_attrs *a = &ly->a;
    ps_conv_desc d = {n, (int)ly->in[0].dims[0], (int)ly->in[0].dims[1], (int)ly->in[0].dims[2], (int)a->out,
                      (int)a->kernel[0], (int)a->kernel[1], (int)a->stride[0], (int)a->padding[0],
                      ly->in_layout[0], ly->out_layout};
    return d;
}

static ps_status conv_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 3, 3, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_layer_attrs *a = &ly->a;
    int64_t cin = ly->in[0].dims[0];
    if ((rc = check_given("in_channels", a->in_features, cin, err))) return rc;
    if (a->kernel[0] != a->kernel[1] || a->stride[0] != a->stride[1] || a->padding[0] != a->padding[1] ||
        a->dilation[0] != 1 || a->dilation[1] != 1 || a->groups != 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "kernel_size %lldx%lld, stride %lldx%lld, padding "
                          "%lldx%lld, dilation %lldx%lld, groups %lld: this build's convolution takes square "
                          "kernels, strides and padding without dilation or groups",
                          (long long)a->kernel[0], (long long)a->kernel[1], (long long)a->stride[0],
                          (long long)a->stride[1], (long long)a->padding[0], (long long)a->padding[1],
                          (long long)a->dilation[0], (long long)a->dilation[1], (long long)a->groups);
    if (!a->bias)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "bias: false is not supported by this build's convolution");
    ps_conv_desc d = conv_desc(ly, 1);
    if (ps_conv_out_h(&d) < 1 || ps_conv_out_w(&d) < 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "kernel %lldx%lld does not fit the input (%lld, %lld, %lld)",
                          (long long)a->kernel[0], (long long)a->kernel[1], (long long)cin,
                          (long long)ly->in[0].dims[1], (long long)ly->in[0].dims[2]);
    ly->outs.ndim = 3;
    ly->outs.dims[0] = a->out;
    ly->outs.dims[1] = ps_conv_out_h(&d);
    ly->outs.dims[2] = ps_conv_out_w(&d);
    ly->out_dtype = PS_DTYPE_F32;
    int64_t fan_in = cin / a->groups * a->kernel[0] * a->kernel[1];
    int64_t wd[4] = {a->out, cin / a->groups, a->kernel[0], a->kernel[1]}, bd[1] = {a->out};
    set_param(ly, 0, "weight", 4, wd, fan_in, FAN_UNIFORM);
    if (a->bias) set_param(ly, 1, "bias", 1, bd, fan_in, FAN_UNIFORM);
    return PS_OK;
}

static ps_status conv_forward(ps_layer_call *c, ps_err *err) {
    ps_conv_desc d = conv_desc(c->ly, c->n);
    return c->be->ops->conv2d_forward(c->be->impl, &d, c->x, c->w[0], c->ly->a.bias ? c->w[1] : NULL, c->y, err);
}

static ps_status conv_backward(ps_layer_call *c, ps_err *err) {
    ps_conv_desc d = conv_desc(c->ly, c->n);
    return c->be->ops->conv2d_backward(c->be->impl, &d, c->x, c->w[0], c->dy, c->dx, c->dw[0],
                                       c->ly->a.bias ? c->dw[1] : NULL, err);
}

static double conv_flops(const ps_layer *ly) {
    return 2.0 * (double)ps_shape_numel(&ly->outs) * (double)(ly->in[0].dims[0] / ly->a.groups) *
           (double)ly->a.kernel[0] * (double)ly->a.kernel[1];
}

/* ---- ReLU ---- */

static ps_status relu_forward(ps_layer_call *c, ps_err *err) {
    return c->be->ops->relu_forward(c->be->impl, ps_layer_out_count(c->ly, c->n), c->x, c->y, err);
}

static ps_status relu_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return c->be->ops->relu_backward(c->be->impl, ps_layer_out_count(c->ly, c->n), c->y, c->dy, c->dx, err);
}

/* ---- MaxPool2d: nn.MaxPool2d(kernel_size, stride=kernel_size, padding) ---- */

static ps_pool_desc pool_desc(const ps_layer *ly, int n) {
    ps_pool_desc d = {n, (int)ly->in[0].dims[0], (int)ly->in[0].dims[1], (int)ly->in[0].dims[2],
                      (int)ly->a.kernel[0], (int)(ly->a.stride[0] ? ly->a.stride[0] : ly->a.kernel[0]),
                      ly->in_layout[0]};
    return d;
}

static ps_status pool_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 3, 3, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_layer_attrs *a = &ly->a;
    int64_t sh = a->stride[0] ? a->stride[0] : a->kernel[0], sw = a->stride[1] ? a->stride[1] : a->kernel[1];
    if (a->kernel[0] != a->kernel[1] || sh != sw || a->padding[0] || a->padding[1])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "this build's max pooling takes a square window and stride "
                          "without padding");
    ps_pool_desc d = pool_desc(ly, 1);
    if (ps_pool_out_h(&d) < 1 || ps_pool_out_w(&d) < 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "window %lld does not fit the input", (long long)a->kernel[0]);
    ly->outs.ndim = 3;
    ly->outs.dims[0] = ly->in[0].dims[0];
    ly->outs.dims[1] = ps_pool_out_h(&d);
    ly->outs.dims[2] = ps_pool_out_w(&d);
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static ps_status pool_forward(ps_layer_call *c, ps_err *err) {
    ps_pool_desc d = pool_desc(c->ly, c->n);
    size_t ws = c->be->ops->maxpool_workspace_size(c->be->impl, &d);
    void *w = c->be->ops->alloc(c->be->impl, ws ? ws : 8);
    if (!w) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the pooling workspace");
    c->saved->dev[0] = w;
    return c->be->ops->maxpool_forward(c->be->impl, &d, c->x, c->y, w, err);
}

static ps_status pool_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    ps_pool_desc d = pool_desc(c->ly, c->n);
    return c->be->ops->maxpool_backward(c->be->impl, &d, c->saved->dev[0], c->dy, c->dx, err);
}

/* Pooling workspaces are backend-specific; a float per output element is
 * the bound psd accounts for (the index of the maximum). */
static size_t pool_bytes(const ps_layer *ly, int n) { return (size_t)ps_layer_out_count(ly, n) * sizeof(float); }

static double pool_flops(const ps_layer *ly) {
    return (double)ps_shape_numel(&ly->outs) * (double)ly->a.kernel[0] * (double)ly->a.kernel[1];
}

/* ---- Dropout / Dropout2d: inverted dropout with a mask kept in the tape ---- */

static ps_status dropout_infer(ps_layer *ly, ps_err *err) { return infer_same(ly, err); }

static ps_status dropout2d_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 3, 3, PS_DTYPE_F32, err);
    if (rc) return rc;
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* Draw (or take) a mask of the output's size; group = elements sharing a draw. */
static ps_status dropout_run(ps_layer_call *c, int64_t group, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    int64_t count = ps_layer_out_count(c->ly, c->n);
    float *mask = ps_backend_alloc_floats(c->be, count);
    float *host = malloc((size_t)(count ? count : 1) * sizeof(float));
    if (!mask || !host) {
        ps_backend_release(c->be, mask);
        free(host);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for dropout");
    }
    c->saved->dev[0] = mask;
    float keep = 1.0f / (1.0f - (float)c->ly->a.p);
    for (int64_t g = 0; g < count / group; g++) {
        float v = c->mask ? c->mask[g] : (ps_rng_uniform(c->rng) < (float)c->ly->a.p ? 0.0f : keep);
        for (int64_t i = 0; i < group; i++) host[g * group + i] = v;
    }
    ps_status rc = ops->copy_to_device(c->be->impl, mask, host, (size_t)count * sizeof(float), err);
    free(host);
    if (rc != PS_OK) return rc;
    return ops->mul(c->be->impl, count, c->x, mask, c->y, err);
}

static ps_status dropout_forward(ps_layer_call *c, ps_err *err) { return dropout_run(c, 1, err); }

static ps_status dropout2d_forward(ps_layer_call *c, ps_err *err) {
    return dropout_run(c, c->ly->in[0].dims[1] * c->ly->in[0].dims[2], err);
}

static ps_status dropout_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return c->be->ops->mul(c->be->impl, ps_layer_out_count(c->ly, c->n), c->dy, c->saved->dev[0], c->dx, err);
}

static size_t dropout_bytes(const ps_layer *ly, int n) { return (size_t)ps_layer_out_count(ly, n) * sizeof(float); }

/* ---- Flatten: nn.Flatten(start_dim=1, end_dim=-1); a view ---- */

static ps_status flatten_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_shape *in = &ly->in[0];
    int s = sample_dim(ly->a.dim, in->ndim), e = sample_dim(ly->a.end_dim, in->ndim);
    if (in->ndim == 0) { ly->outs = *in; ly->outs.ndim = 1; ly->outs.dims[0] = 1; ly->out_dtype = PS_DTYPE_F32; return PS_OK; }
    if (s < 0 || e < 0 || s > e)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "start_dim %lld, end_dim %lld do not name dimensions 1..%d "
                          "of the batched input (0 is the batch)", (long long)ly->a.dim, (long long)ly->a.end_dim,
                          in->ndim);
    ps_shape o = {0};
    for (int d = 0; d < s; d++) o.dims[o.ndim++] = in->dims[d];
    int64_t k = 1;
    for (int d = s; d <= e; d++) k *= in->dims[d];
    o.dims[o.ndim++] = k;
    for (int d = e + 1; d < in->ndim; d++) o.dims[o.ndim++] = in->dims[d];
    ly->outs = o;
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* ---- Reshape: x.view(N, *shape); one entry may be -1 ---- */

static ps_status reshape_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    int64_t total = ps_shape_numel(&ly->in[0]), known = 1;
    int infer_at = -1;
    ps_shape o = {.ndim = ly->a.ndims};
    for (int d = 0; d < ly->a.ndims; d++) {
        o.dims[d] = ly->a.dims[d];
        if (o.dims[d] == -1) {
            if (infer_at >= 0) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "shape: only one entry may be -1");
            infer_at = d;
        } else if (o.dims[d] < 1) {
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "shape: entry %d is %lld", d + 1, (long long)o.dims[d]);
        } else {
            known = sat_mul(known, o.dims[d]);
        }
    }
    if (infer_at >= 0 && known && total % known == 0) o.dims[infer_at] = total / known;
    int64_t got = 1;
    for (int d = 0; d < o.ndim; d++) got = sat_mul(got, o.dims[d]);
    if (got != total) {
        char b1[64];
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "shape: %lld elements per sample cannot be viewed as the "
                          "given shape (input %s)", (long long)total, ps_shape_format(&ly->in[0], b1, sizeof b1));
    }
    ly->outs = o;
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* ---- Linear: nn.Linear(in_features, out_features, bias) over the last dimension ---- */

static ps_linear_desc linear_desc(const ps_layer *ly, int n) {
    ps_linear_desc d = {(int)(n * ps_shape_rows(&ly->in[0])), (int)ps_shape_last(&ly->in[0]), (int)ly->a.out};
    return d;
}

static ps_status linear_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    int64_t in = ps_shape_last(&ly->in[0]);
    if ((rc = check_given("in_features", ly->a.in_features, in, err))) return rc;
    if (!ly->a.bias)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "bias: false is not supported by this build's linear");
    ly->outs = ly->in[0];
    ly->outs.dims[ly->outs.ndim - 1] = ly->a.out;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t wd[2] = {ly->a.out, in}, bd[1] = {ly->a.out};
    set_param(ly, 0, "weight", 2, wd, in, FAN_UNIFORM);
    set_param(ly, 1, "bias", 1, bd, in, FAN_UNIFORM);
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

static double linear_flops(const ps_layer *ly) { return 2.0 * (double)ps_shape_numel(&ly->outs) * (double)ps_shape_last(&ly->in[0]); }

/* ---- LogSoftmax and Softmax over dim (the last dimension) ---- */

static ps_status softmax_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    int d = sample_dim(ly->a.dim, ly->in[0].ndim);
    if (d < 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dim %lld is not a dimension 1..%d of the batched input "
                          "(0 is the batch)", (long long)ly->a.dim, ly->in[0].ndim);
    for (int k = d + 1; k < ly->in[0].ndim; k++)
        if (ly->in[0].dims[k] != 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dim %lld: this build takes softmax over the last "
                              "dimension only", (long long)ly->a.dim);
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static int64_t sm_rows(const ps_layer_call *c) {
    int d = sample_dim(c->ly->a.dim, c->ly->in[0].ndim);
    int64_t r = c->n;
    for (int k = 0; k < d; k++) r *= c->ly->in[0].dims[k];
    return r;
}

static int sm_cols(const ps_layer_call *c) { return (int)c->ly->in[0].dims[sample_dim(c->ly->a.dim, c->ly->in[0].ndim)]; }

static ps_status log_softmax_forward(ps_layer_call *c, ps_err *err) {
    return c->be->ops->log_softmax_forward(c->be->impl, (int)sm_rows(c), sm_cols(c), c->x, c->y, err);
}

static ps_status log_softmax_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return c->be->ops->log_softmax_backward(c->be->impl, (int)sm_rows(c), sm_cols(c), c->y, c->dy, c->dx, err);
}

static const char *softmax_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->softmax_forward && ops->softmax_backward ? NULL : "softmax_forward/softmax_backward";
}

static ps_status softmax_forward(ps_layer_call *c, ps_err *err) {
    return c->be->ops->softmax_forward(c->be->impl, sm_rows(c), sm_cols(c), c->x, c->y, err);
}

static ps_status softmax_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return c->be->ops->softmax_backward(c->be->impl, sm_rows(c), sm_cols(c), c->y, c->dy, c->dx, err);
}

/* ---- Embedding: nn.Embedding(num_embeddings, embedding_dim); int64 ids
 * in, rows out. The weight's gradient is row-sparse: the unique ids of the
 * batch and the sum of the output gradients of each (a scatter-add). ---- */

static ps_status emb_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 0, PS_SHAPE_MAX_DIMS - 1, PS_DTYPE_I64, err);
    if (rc) return rc;
    if (ly->a.num > INT32_MAX || ly->a.out > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "num_embeddings and embedding_dim are at most %d", INT32_MAX);
    ly->outs = ly->in[0];
    ly->outs.dims[ly->outs.ndim++] = ly->a.out;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t wd[2] = {ly->a.num, ly->a.out};
    set_param(ly, 0, "weight", 2, wd, ly->a.out, NORMAL01);
    ly->param[0].sparse = 1;
    return PS_OK;
}

static const char *emb_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->embedding_forward && ops->embedding_backward ? NULL : "embedding_forward/embedding_backward";
}

static ps_status emb_check(const ps_layer *ly, const void *host_x, int64_t count, ps_err *err) {
    const int64_t *ids = host_x;
    int64_t lo = ly->row_lo, hi = ly->row_lo + ly->a.num;
    for (int64_t i = 0; i < count; i++) {
        if (ids[i] >= lo && ids[i] < hi) continue;
        if (ly->row_total)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                              "input[%lld] = %lld is outside this shard's rows [%lld, %lld) of %s.weight "
                              "(%lld rows over its shards)", (long long)i, (long long)ids[i], (long long)lo,
                              (long long)hi, ly->name, (long long)ly->row_total);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input[%lld] = %lld is not a row of %s.weight (0..%lld)",
                          (long long)i, (long long)ids[i], ly->name, (long long)(ly->a.num - 1));
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
    if (!h || !d) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's ids", c->ly->name);
    if (rc == PS_OK) rc = ops->copy_to_host(c->be->impl, h, c->x, ib, err);
    for (int64_t i = 0; rc == PS_OK && i < n; i++) h[i] -= c->ly->row_lo;
    if (rc == PS_OK) rc = ops->copy_to_device(c->be->impl, d, h, ib, err);
    free(h);
    if (rc != PS_OK) { ps_backend_release(c->be, d); return NULL; }
    return d;
}

static ps_status emb_forward(ps_layer_call *c, ps_err *err) {
    int64_t n = c->n * ps_shape_numel(&c->ly->in[0]);
    int dim = (int)c->ly->a.out;
    if (!c->ly->row_lo) return c->be->ops->embedding_forward(c->be->impl, n, dim, c->x, c->w[0], c->y, err);
    int64_t *ids = emb_local_ids(c, n, err);
    if (!ids) return PS_ERR_RESOURCE_EXHAUSTED;
    ps_status rc = c->be->ops->embedding_forward(c->be->impl, n, dim, ids, c->w[0], c->y, err);
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
    int64_t n = c->n * ps_shape_numel(&c->ly->in[0]);
    int dim = (int)c->ly->a.out;
    size_t ib = (size_t)n * sizeof(int64_t);
    int64_t *ids = malloc(ib ? ib : 8), *sorted = malloc(ib ? ib : 8), *slot = malloc(ib ? ib : 8);
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
    r.rows = malloc((size_t)(nrows ? nrows : 1) * sizeof(int64_t));
    r.grad = malloc((size_t)(nrows ? nrows : 1) * dim * sizeof(float));
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
    rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the %s.weight gradient", c->ly->name);
done:
    ps_rows_clear(&r);
    free(ids);
    free(sorted);
    free(slot);
    ps_backend_release(c->be, dslot);
    ps_backend_release(c->be, dgrows);
    return rc;
}

static double zero_flops(const ps_layer *ly) { (void)ly; return 0; }

/* ---- LSTM: the parameters of an nn.LSTM(input_size, hidden_size,
 * num_layers): weight_ih_l<k>, weight_hh_l<k>, bias_ih_l<k>, bias_hh_l<k>
 * per layer (gate order i, f, g, o), PyTorch's init U(-1/sqrt(H),
 * 1/sqrt(H)) for all. psd only holds them: the LSTM runs on the trainer
 * (common/nn/lstm.h), which pulls the weights and pushes their gradients
 * (PushGradients). A stage of LSTM nodes is parameter-only: Forward and
 * Backward on it are refused. ---- */

#define LSTM_MAX_LAYERS (PS_LAYER_MAX_PARAMS / 4)
static const char *const lstm_suffix[LSTM_MAX_LAYERS][4] = {
#define LSTM_SUFFIXES(l) {"weight_ih_l" #l, "weight_hh_l" #l, "bias_ih_l" #l, "bias_hh_l" #l}
    LSTM_SUFFIXES(0), LSTM_SUFFIXES(1), LSTM_SUFFIXES(2), LSTM_SUFFIXES(3),
#undef LSTM_SUFFIXES
};

static ps_status lstm_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, 1, PS_DTYPE_F32, err);
    if (rc) return rc;
    int64_t in = ly->in[0].dims[0], H = ly->a.out;
    if ((rc = check_given("input_size", ly->a.in_features, in, err))) return rc;
    if (ly->a.num > LSTM_MAX_LAYERS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "num_layers %lld: at most %d", (long long)ly->a.num,
                          LSTM_MAX_LAYERS);
    ly->outs = ly->in[0];
    ly->outs.dims[0] = H;
    ly->out_dtype = PS_DTYPE_F32;
    ps_init u = {PS_INIT_UNIFORM, 0, 0, 1};
    for (int l = 0; l < ly->a.num; l++) {
        int64_t wi[2] = {4 * H, l ? H : in}, wh[2] = {4 * H, H}, b[1] = {4 * H};
        set_param(ly, 4 * l + 0, lstm_suffix[l][0], 2, wi, H, u);
        set_param(ly, 4 * l + 1, lstm_suffix[l][1], 2, wh, H, u);
        set_param(ly, 4 * l + 2, lstm_suffix[l][2], 1, b, H, u);
        set_param(ly, 4 * l + 3, lstm_suffix[l][3], 1, b, H, u);
    }
    return PS_OK;
}

static ps_status lstm_refuse(ps_layer_call *c, ps_err *err) {
    return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "LSTM %s: psd holds this LSTM's parameters only; the LSTM "
                      "runs on the trainer (pull them with GetParameters, push their gradients with "
                      "PushGradients)", c->ly->name);
}

static double lstm_flops(const ps_layer *ly) {
    double f = 0, H = (double)ly->a.out;
    for (int l = 0; l < ly->a.num; l++) f += 2.0 * 4 * H * ((l ? H : (double)ly->in[0].dims[0]) + H);
    return f;
}

/* ---- Add: the residual sum of its inputs (all of one shape) ---- */

static ps_status add_infer(ps_layer *ly, ps_err *err) {
    char b1[64], b2[64];
    for (int i = 0; i < ly->nin; i++) {
        ps_status rc = need_ndim(ly, i, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
        if (rc) return rc;
        if (!ps_shape_equal(&ly->in[i], &ly->in[0]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input '%s' is %s but input '%s' is %s: Add takes "
                              "inputs of one shape", ly->def->in_names[0], ps_shape_format(&ly->in[0], b1, sizeof b1),
                              ly->def->in_names[i], ps_shape_format(&ly->in[i], b2, sizeof b2));
    }
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* y = x0 + x1 + ...: the executor gives y == x0 when it runs in place. */
static ps_status add_forward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    int64_t count = ps_layer_out_count(c->ly, c->n);
    ps_status rc = PS_OK;
    if (c->y != c->xs[0]) {
        if (c->be->ops->alloc && c->be->device == 0 && !c->be->ops->device_kind) {
            memcpy(c->y, c->xs[0], (size_t)count * sizeof(float));
        } else {   /* a device: through the host */
            float *h = malloc((size_t)(count ? count : 1) * sizeof(float));
            if (!h) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
            rc = ops->copy_to_host(c->be->impl, h, c->xs[0], (size_t)count * sizeof(float), err);
            if (rc == PS_OK) rc = ops->copy_to_device(c->be->impl, c->y, h, (size_t)count * sizeof(float), err);
            free(h);
        }
    }
    for (int i = 1; i < c->ly->nin && rc == PS_OK; i++) rc = ops->add(c->be->impl, count, c->y, c->xs[i], err);
    return rc;
}

/* ------------------------------------------------------ attribute tables */

#define A(f) offsetof(ps_layer_attrs, f)
#define ATTR_INT(nm, f, d, lo) {nm, PS_ATTR_INT, A(f), d, lo, PS_DIM_MAX, 0, 0, NULL, 0}
#define ATTR_PAIR(nm, f, d, lo) {nm, PS_ATTR_PAIR, A(f), d, lo, 65536, 0, 0, NULL, 0}
#define ATTR_BOOL(nm, f, d) {nm, PS_ATTR_BOOL, A(f), d, 0, 1, 0, 0, NULL, 0}
#define ATTR_FLOAT(nm, f, d, lo, hi, lo_open, hi_open) {nm, PS_ATTR_FLOAT, A(f), d, lo, hi, lo_open, hi_open, NULL, 0}
#define ATTR_END {NULL, 0, 0, NULL, 0, 0, 0, 0, NULL, 0}

static const char *const padding_modes[] = {"zeros", NULL};

static const ps_attr_spec conv_attrs[] = {
    ATTR_INT("in_channels", in_features, "", 1),
    ATTR_INT("out_channels", out, NULL, 1),
    ATTR_PAIR("kernel_size", kernel, NULL, 1),
    ATTR_PAIR("stride", stride, "1", 1),
    ATTR_PAIR("padding", padding, "0", 0),
    ATTR_PAIR("dilation", dilation, "1", 1),
    ATTR_INT("groups", groups, "1", 1),
    ATTR_BOOL("bias", bias, "true"),
    {"padding_mode", PS_ATTR_ENUM, A(flag), "zeros", 0, 0, 0, 0, padding_modes, 0},
    ATTR_END,
};
static const ps_attr_spec maxpool_attrs[] = {
    ATTR_PAIR("kernel_size", kernel, NULL, 1),
    ATTR_PAIR("stride", stride, "", 1),
    ATTR_PAIR("padding", padding, "0", 0),
    ATTR_END,
};
static const ps_attr_spec linear_attrs[] = {
    ATTR_INT("in_features", in_features, "", 1),
    ATTR_INT("out_features", out, NULL, 1),
    ATTR_BOOL("bias", bias, "true"),
    ATTR_END,
};
static const ps_attr_spec emb_attrs[] = {
    ATTR_INT("num_embeddings", num, NULL, 1),
    ATTR_INT("embedding_dim", out, NULL, 1),
    ATTR_END,
};
static const ps_attr_spec lstm_attrs[] = {
    ATTR_INT("input_size", in_features, "", 1),
    ATTR_INT("hidden_size", out, NULL, 1),
    ATTR_INT("num_layers", num, "1", 1),
    ATTR_FLOAT("dropout", ignored, "0", 0, 1, 0, 1),
    ATTR_END,
};
static const ps_attr_spec inplace_attrs[] = {
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec dropout_attrs[] = {
    ATTR_FLOAT("p", p, "0.5", 0, 1, 0, 1),
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec softmax_attrs[] = {
    {"dim", PS_ATTR_INT, A(dim), NULL, -5, 5, 0, 0, NULL, 0},
    ATTR_END,
};
static const ps_attr_spec flatten_attrs[] = {
    {"start_dim", PS_ATTR_INT, A(dim), "1", -5, 5, 0, 0, NULL, 0},
    {"end_dim", PS_ATTR_INT, A(end_dim), "-1", -5, 5, 0, 0, NULL, 0},
    ATTR_END,
};
static const ps_attr_spec reshape_attrs[] = {
    {"shape", PS_ATTR_DIMS, A(dims), NULL, -1, PS_DIM_MAX, 0, 0, NULL, A(ndims)},
    ATTR_END,
};
static const ps_attr_spec no_attrs[] = {ATTR_END};

/* ---------------------------------------------------------------- table */

#define F_ACT (PS_KIND_LAYOUT_KEEP | PS_KIND_INPLACE)
static const ps_layer_kind kinds[] = {
    {"Conv2d", PS_KIND_LAYOUT_BLOCKED | PS_KIND_BWD_X, 1, 1, conv_attrs, conv_infer, no_op, conv_forward,
     conv_backward, NULL, NULL, conv_flops},
    {"Linear", PS_KIND_BWD_X, 1, 1, linear_attrs, linear_infer, no_op, linear_forward, linear_backward, NULL, NULL,
     linear_flops},
    {"MaxPool2d", PS_KIND_LAYOUT_KEEP, 1, 1, maxpool_attrs, pool_infer, no_op, pool_forward, pool_backward,
     pool_bytes, NULL, pool_flops},
    {"ReLU", F_ACT | PS_KIND_BWD_Y, 1, 1, inplace_attrs, infer_same, no_op, relu_forward, relu_backward, NULL, NULL,
     NULL},
    {"Dropout", PS_KIND_EVAL_VIEW | PS_KIND_DROPOUT | PS_KIND_INPLACE, 1, 1, dropout_attrs, dropout_infer, no_op,
     dropout_forward, dropout_backward, dropout_bytes, NULL, NULL},
    {"Dropout2d", PS_KIND_EVAL_VIEW | PS_KIND_DROPOUT | PS_KIND_INPLACE, 1, 1, dropout_attrs, dropout2d_infer, no_op,
     dropout2d_forward, dropout_backward, dropout_bytes, NULL, NULL},
    {"Flatten", PS_KIND_VIEW, 1, 1, flatten_attrs, flatten_infer, no_op, view_pass, view_pass, NULL, NULL, zero_flops},
    {"Reshape", PS_KIND_VIEW, 1, 1, reshape_attrs, reshape_infer, no_op, view_pass, view_pass, NULL, NULL, zero_flops},
    {"LogSoftmax", PS_KIND_BWD_Y, 1, 1, softmax_attrs, softmax_infer, no_op, log_softmax_forward,
     log_softmax_backward, NULL, NULL, NULL},
    {"Softmax", PS_KIND_BWD_Y, 1, 1, softmax_attrs, softmax_infer, softmax_missing, softmax_forward, softmax_backward,
     NULL, NULL, NULL},
    {"Embedding", PS_KIND_BWD_X, 1, 1, emb_attrs, emb_infer, emb_missing, emb_forward, emb_backward, NULL, emb_check,
     zero_flops},
    {"LSTM", PS_KIND_PARAMS_ONLY, 1, 1, lstm_attrs, lstm_infer, no_op, lstm_refuse, lstm_refuse, NULL, NULL,
     lstm_flops},
    {"Add", PS_KIND_LAYOUT_KEEP | PS_KIND_INPLACE | PS_KIND_GRAD_PASS, 2, PS_NODE_MAX_INPUTS, no_attrs, add_infer,
     no_op, add_forward, view_pass, NULL, NULL, NULL},
};

#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

const ps_layer_kind *ps_layer_kind_find(const char *name) {
    for (int i = 0; name && i < NKINDS; i++)
        if (!strcmp(kinds[i].name, name)) return &kinds[i];
    return NULL;
}

const char *ps_layer_kind_list(char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < NKINDS && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", kinds[i].name);
    return buf;
}

const ps_attr_spec *ps_layer_kind_attr(const ps_layer_kind *k, const char *name) {
    for (const ps_attr_spec *a = k->attrs; a && a->name; a++)
        if (!strcmp(a->name, name)) return a;
    return NULL;
}

const char *ps_layer_kind_attr_list(const ps_layer_kind *k, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (const ps_attr_spec *a = k->attrs; a && a->name && o < cap; a++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", a->name);
    if (!buf[0]) snprintf(buf, cap, "no attributes");
    return buf;
}

ps_status ps_layer_infer(ps_layer *ly, ps_err *err) {
    ly->nparams = 0;
    ly->nbuffers = 0;
    memset(ly->param, 0, sizeof ly->param);
    memset(ly->buffer, 0, sizeof ly->buffer);
    ly->flags = ly->kind->flags;
    ps_status rc = ly->kind->infer(ly, err);
    if (rc != PS_OK) return rc;
    for (int i = 0; ly->def && i < ly->def->ninit; i++) {   /* the file's init: entries */
        const ps_init_def *id = &ly->def->inits[i];
        int j = 0;
        while (j < ly->nparams && strcmp(ly->param[j].suffix, id->suffix)) j++;
        if (j == ly->nparams) {
            char list[256] = "";
            for (int k = 0; k < ly->nparams; k++) {
                strncat(list, k ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, ly->param[k].suffix, sizeof list - strlen(list) - 1);
            }
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "init.%s: no parameter '%s' (parameters: %s)", id->suffix,
                              id->suffix, ly->nparams ? list : "none");
        }
        ps_init in;
        if ((rc = ps_init_parse(id->spec, &in, err)) != PS_OK) return rc;
        if (in.kind != PS_INIT_DEFAULT) ly->param[j].init = in;
    }
    return PS_OK;
}

double ps_layer_flops(const ps_layer *ly) {
    return ly->kind->flops ? ly->kind->flops(ly) : (double)ps_shape_numel(&ly->outs);
}
