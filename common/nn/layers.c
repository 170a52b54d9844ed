/* layers.c - the layer-kind table (see layers.h): attribute resolution,
 * initialisation, and one row per kind; the functions above the table are
 * that row's entries, grouped by kind. */
#include "layers.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

int ps_attr_infinity(const char *s, double *v) {
    if (!s) return 0;
    const double sign = *s == '-' ? -1.0 : 1.0;
    if (*s == '-' || *s == '+') s++;
    if (*s == '.') s++;
    if (strcasecmp(s, "inf")) return 0;
    *v = sign * INFINITY;
    return 1;
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
    case PS_ATTR_FLOAT_INF:
        if (ps_attr_infinity(vals[0], &x)) {
            *(double *)(base + sp->off) = x;
            return PS_OK;
        }
        if ((st = attr_number(ly, sp, vals[0], def, n, keys, values, &x, err))) return st;
        *(double *)(base + sp->off) = x;
        return PS_OK;
    case PS_ATTR_FLOAT_OR_NULL:
        if (!vals[0]) { *(int *)(base + sp->off2) = 1; return PS_OK; }
        *(int *)(base + sp->off2) = 0;
        if (ps_attr_infinity(vals[0], &x)) {   /* within the range only where it is open-ended (Where's a, b) */
            if ((st = attr_range(sp, x, 0, err))) return st;
            *(double *)(base + sp->off) = x;
            return PS_OK;
        }
        /* fall through */
    case PS_ATTR_FLOAT:
        if ((st = attr_number(ly, sp, vals[0], def, n, keys, values, &x, err))) return st;
        if ((st = attr_range(sp, x, 0, err))) return st;
        *(double *)(base + sp->off) = x;
        return PS_OK;
    case PS_ATTR_INT_OR_NULL:
        *(int *)(base + sp->off2) = vals[0] != NULL;
        if (!vals[0]) { *(int64_t *)(base + sp->off) = 0; return PS_OK; }
        /* fall through */
    case PS_ATTR_INT:
        if ((st = attr_number(ly, sp, vals[0], def, n, keys, values, &x, err))) return st;
        if ((st = attr_range(sp, x, 1, err))) return st;
        *(int64_t *)(base + sp->off) = (int64_t)x;
        return PS_OK;
    case PS_ATTR_PAIR:
    case PS_ATTR_PAIR_OR_NULL: {
        int64_t *p = (int64_t *)(base + sp->off);
        for (int i = 0; i < 2; i++) {
            const char *t = vals[is_list ? i : 0];
            if (!t && sp->type == PS_ATTR_PAIR_OR_NULL) { p[i] = 0; continue; }
            if ((st = attr_number(ly, sp, t, def, n, keys, values, &x, err))) return st;
            if ((st = attr_range(sp, x, 1, err))) return st;
            p[i] = (int64_t)x;
        }
        return PS_OK;
    }
    case PS_ATTR_FLOAT_PAIR_OR_NULL: {   /* Upsample's scale_factor: null (not given), N or [h, w] */
        double *p = (double *)(base + sp->off);
        *(int *)(base + sp->off2) = 0;
        if (!is_list && !vals[0]) return PS_OK;
        for (int i = 0; i < 2; i++) {
            const char *t = vals[is_list ? i : 0];
            if (!t) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: entry %d is null", sp->name, i + 1);
            if ((st = attr_number(ly, sp, t, def, n, keys, values, &x, err))) return st;
            if ((st = attr_range(sp, x, 0, err))) return st;
            p[i] = x;
        }
        *(int *)(base + sp->off2) = 1;
        return PS_OK;
    }
    case PS_ATTR_NAME:   /* null: "" (the node's name is the tensor's whole name) */
        *(const char **)(base + sp->off) = vals[0] ? vals[0] : "";   /* the definition's (or the table's) string */
        return PS_OK;
    case PS_ATTR_DIMS:
    case PS_ATTR_BATCH_DIMS:
    case PS_ATTR_PADS: {
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

static void init_draw(const ps_layer *ly, int j, float *host, ps_rng *r);
static float init_value(const ps_layer_param *p, ps_rng *r);

void ps_layer_init_param(const ps_layer *ly, int j, float *host, ps_rng *r) {
    init_draw(ly, j, host, r);
    /* Embedding's padding_idx row starts at zeros (nn.Embedding's _fill_padding_idx_with_zero); a shard
     * holds rows [row_lo, row_lo + num) */
    if (ly->a.pad_given && ly->param[j].sparse && ly->a.padding_idx >= ly->row_lo &&
        ly->a.padding_idx < ly->row_lo + ly->param[j].dims[0])
        memset(host + (ly->a.padding_idx - ly->row_lo) * ly->param[j].dims[1], 0,
               (size_t)ly->param[j].dims[1] * sizeof(float));
}

static void init_draw(const ps_layer *ly, int j, float *host, ps_rng *r) {
    const ps_layer_param *p = &ly->param[j];
    const ps_init *in = &p->init;
    if (in->kind == PS_INIT_WEIGHT_NORM) {   /* weight_g: the norms of weight_v's draw, from a copy of the stream */
        const ps_layer_param *v = &ly->param[j + 1];
        ps_rng copy = *r;
        const int64_t rows = p->numel, k = v->numel / p->numel;
        for (int64_t i = 0; i < rows; i++) {
            double s = 0.0;
            for (int64_t e = 0; e < k; e++) {
                const double x = init_value(v, &copy);
                s += x * x;
            }
            host[i] = (float)sqrt(s);
        }
        return;
    }
    for (int64_t i = 0; i < p->numel; i++) host[i] = init_value(p, r);
}

/* One value of parameter p's initialisation (its elements are drawn in order, each so). */
static float init_value(const ps_layer_param *p, ps_rng *r) {
    const ps_init *in = &p->init;
    if (in->kind == PS_INIT_CONST) return in->a;
    if (in->kind == PS_INIT_NORMAL) return in->a + in->b * normal01(r);
    /* uniform: symmetric bounds as (2u - 1) * bound (the draw the C tables made) */
    if (in->fan_bound || in->a == -in->b) {
        const float bound = in->fan_bound ? 1.0f / sqrtf((float)(p->fan_in ? p->fan_in : 1)) : in->b;
        return (2.0f * ps_rng_uniform(r) - 1.0f) * bound;
    }
    return in->a + (in->b - in->a) * ps_rng_uniform(r);
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
static const ps_init ZEROS = {PS_INIT_CONST, 0, 0, 0};
static const ps_init ONES = {PS_INIT_CONST, 1, 0, 0};

static void set_buffer(ps_layer *ly, const char *suffix, int ndim, const int64_t *dims, ps_dtype dt, float init) {
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

/* Input 0 is a float tensor of any rank and the attribute dim one of its
 * sample dimensions: *d is its index in the per-sample shape. */
static ps_status need_dim_attr(const ps_layer *ly, int *d, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    if ((*d = sample_dim(ly->a.dim, ly->in[0].ndim)) < 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dim %lld is not a dimension 1..%d of the batched input "
                          "(0 is the batch)", (long long)ly->a.dim, ly->in[0].ndim);
    return PS_OK;
}

static const char *no_op(const ps_layer *ly, const ps_backend_ops *ops) { (void)ly; (void)ops; return NULL; }

static ps_status view_pass(ps_layer_call *c, ps_err *err) { (void)c; (void)err; return PS_OK; }

/* ---- weight normalisation: nn.utils.weight_norm(module, 'weight', dim) of
 * Linear, Conv1d, Conv2d and ConvTranspose2d (attributes weight_norm, false,
 * and weight_norm_dim: 0, weight_norm's default, or null, its dim=None: one
 * norm of the whole weight). The node's weight is
 *     w = g * v / ||v||
 * with the norm over every dim of v but weight_norm_dim (PyTorch's
 * norm_except_dim), and its parameters are PyTorch's: weight_g (v's shape
 * with 1s but dim 0; a scalar for null) and weight_v (the weight's shape),
 * trained as the reparametrisation - psd never holds w. One step serves the
 * four kinds: ps_layer_infer calls wn_params after the kind's infer set
 * weight (and bias); the kinds' forward and backward hand a weight-normed
 * call to wn_forward / wn_backward, which compute w into scratch memory with
 * the backend's l2norm (u = v / ||v|| per row of v seen as (D, K)) and
 * mul_channels (w = g u), run the kind's own forward or backward on w, and
 * turn its weight gradient dw into PyTorch's (_weight_norm_interface_backward)
 *     dg = sum_k dw * u               (mul, then bias_grad per row)
 *     dv = (g / ||v||) (dw - u dg)     (l2norm_backward of g dw)
 * so every backend with those ops runs it, each op checked against the ref
 * backend's. Parameters weight_g (0), weight_v (1), bias (2): g's default
 * initialisation (||v|| of v's draw, as weight_norm() sets it,
 * PS_INIT_WEIGHT_NORM) draws v's values from a copy of the stream before v
 * draws them. ---- */

typedef ps_status (*layer_fn)(ps_layer_call *c, ps_err *err);

static const ps_init WN_NORM = {PS_INIT_WEIGHT_NORM, 0, 0, 0};

/* weight_v as D rows of K: D = its dim 0 (weight_norm_dim 0) or 1 (null) */
static ps_chan_desc wn_rows(const ps_layer *ly) {
    const ps_layer_param *v = &ly->param[1];
    const int64_t d = ly->a.wn_dim_given ? v->dims[0] : 1;
    return (ps_chan_desc){.n = 1, .c = (int)d, .s = v->numel / d, .layout = PS_LAYOUT_PLAIN};
}

/* The kind's weight (param 0) and bias (param 1, if any) as weight_g, weight_v, bias. */
static ps_status wn_params(ps_layer *ly, ps_err *err) {
    if (!ly->a.wn) return PS_OK;
    if (ly->a.wn_dim_given && ly->a.wn_dim != 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "weight_norm_dim %lld: psd normalises the weight over every "
                          "dim but 0 (weight_norm's default dim=0) or as a whole (null: dim=None)",
                          (long long)ly->a.wn_dim);
    PS_ASSERT(ly->nparams >= 1 && ly->nparams <= 2 && !strcmp(ly->param[0].suffix, "weight"));
    const ps_layer_param w = ly->param[0];
    const int64_t rows = ly->a.wn_dim_given ? w.dims[0] : 1;
    if (w.numel / rows > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "weight_norm: %lld elements under one norm (psd takes at most "
                          "2^31 - 1)", (long long)(w.numel / rows));
    if (ly->nparams == 2) ly->param[2] = ly->param[1];
    ly->param[1] = w;
    ly->param[1].suffix = "weight_v";
    ps_layer_param *g = &ly->param[0];
    g->suffix = "weight_g";
    g->init = WN_NORM;
    g->ndim = ly->a.wn_dim_given ? w.ndim : 0;   /* (D, 1, ...) as norm_except_dim keeps it; a 0-d one for null */
    for (int d = ly->a.wn_dim_given; d < 4; d++) g->dims[d] = 1;
    g->numel = rows;
    ly->nparams++;
    return PS_OK;
}

static const char *wn_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    if (!ly->a.wn || (ops->l2norm_forward && ops->l2norm_backward && ops->mul_channels && ops->mul && ops->bias_grad))
        return NULL;
    return "l2norm_forward/l2norm_backward/mul_channels/mul/bias_grad";
}

/* u = v / ||v|| per row, w = g u (w may be u). */
static ps_status wn_weight(const ps_layer_call *c, float *u, float *w, ps_err *err) {
    const ps_chan_desc r = wn_rows(c->ly);
    const ps_l2norm_desc nd = {r.c, (int)r.s, 1, 0.0f};
    ps_status rc = c->be->ops->l2norm_forward(c->be->impl, &nd, c->w[1], u, err);
    return rc ? rc : c->be->ops->mul_channels(c->be->impl, &r, u, c->w[0], w, err);
}

/* c as the kind's own call on weight w: a copy of the node without weight_norm (plain: its parameters the
 * kind's weight, of v's shape, and bias), params w and the bias. */
static ps_layer_call wn_plain_call(const ps_layer_call *c, ps_layer *plain, float **ws, float *w) {
    *plain = *c->ly;
    plain->a.wn = 0;
    plain->nparams = c->ly->nparams - 1;
    plain->param[0] = c->ly->param[1];
    plain->param[0].suffix = "weight";
    plain->param[1] = c->ly->param[2];
    ws[0] = w;
    ws[1] = c->ly->a.bias ? c->w[2] : NULL;
    ps_layer_call cc = *c;
    cc.ly = plain;
    cc.w = ws;
    return cc;
}

static ps_status wn_forward(ps_layer_call *c, layer_fn fn, ps_err *err) {
    float *w = ps_backend_alloc_floats(c->be, c->ly->param[1].numel), *ws[2];
    if (!w) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's weight (weight_norm)", c->ly->name);
    ps_layer plain;
    ps_layer_call cc = wn_plain_call(c, &plain, ws, w);
    ps_status rc = wn_weight(c, w, w, err);
    if (rc == PS_OK) rc = fn(&cc, err);
    ps_backend_release(c->be, w);
    return rc;
}

static ps_status wn_backward(ps_layer_call *c, layer_fn fn, ps_err *err) {
    const ps_layer *ly = c->ly;
    const int64_t nw = ly->param[1].numel;
    const int grads = c->dw[0] || c->dw[1];
    float *u = ps_backend_alloc_floats(c->be, nw), *w = ps_backend_alloc_floats(c->be, nw);
    float *dw = grads ? ps_backend_alloc_floats(c->be, nw) : NULL, *ws[2];
    ps_status rc = !u || !w || (grads && !dw)
                       ? ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's weight gradient "
                                    "(weight_norm)", ly->name)
                       : wn_weight(c, u, w, err);
    ps_layer plain;
    ps_layer_call cc = wn_plain_call(c, &plain, ws, w);
    memset(cc.dw, 0, sizeof cc.dw);
    cc.dw[0] = dw;
    cc.dw[1] = ly->a.bias ? c->dw[2] : NULL;
    if (rc == PS_OK) rc = fn(&cc, err);
    const ps_chan_desc r = wn_rows(ly);
    const ps_l2norm_desc nd = {r.c, (int)r.s, 1, 0.0f};
    if (rc == PS_OK && c->dw[0]) {   /* dg = sum over each row of dw * u (w is free now) */
        rc = c->be->ops->mul(c->be->impl, nw, dw, u, w, err);
        if (rc == PS_OK) rc = c->be->ops->bias_grad(c->be->impl, &r, w, c->dw[0], err);
    }
    if (rc == PS_OK && c->dw[1]) {   /* dv = l2norm_backward(v, g dw) */
        rc = c->be->ops->mul_channels(c->be->impl, &r, dw, c->w[0], dw, err);
        if (rc == PS_OK) rc = c->be->ops->l2norm_backward(c->be->impl, &nd, c->w[1], dw, c->dw[1], err);
    }
    ps_backend_release(c->be, u);
    ps_backend_release(c->be, w);
    ps_backend_release(c->be, dw);
    return rc;
}

/* ---- Conv2d: nn.Conv2d(in_channels, out_channels, kernel_size, stride,
 * padding, dilation, groups, bias); params weight (out, in/groups, kh, kw),
 * bias (out) ---- */

/* The 1-d kinds (Conv1d, MaxPool1d, AvgPool1d, AdaptiveAvgPool1d) are their
 * 2-d kinds over a (C, 1, L) plane: a sample (C, L) has that memory, and so
 * has Conv1d's weight (out, in/groups, k) as (out, in/groups, 1, k). Their
 * attributes fill the second entry of each pair (one_d_infer sets the
 * first: kernel 1, stride 1, no padding); the backends see 2-d ops. */
static int one_d(const ps_layer *ly) {
    const char *k = ly->kind->name;
    size_t n = strlen(k);
    return n > 2 && !strcmp(k + n - 2, "1d") && strcmp(k, "BatchNorm1d");
}

/* Input 0's channels, height and width as the 2-d ops read them. */
static void plane_of(const ps_layer *ly, int *c, int *h, int *w) {
    const ps_shape *in = &ly->in[0];
    *c = (int)in->dims[0];
    *h = one_d(ly) ? 1 : (int)in->dims[1];
    *w = (int)in->dims[one_d(ly) ? 1 : 2];
}

/* A 1-d kind's per-sample input (C, L) and its 2-d pair entries; 2-d kinds:
 * (C, H, W). */
static ps_status plane_infer(ps_layer *ly, ps_err *err) {
    if (!one_d(ly)) return need_ndim(ly, 0, 3, 3, PS_DTYPE_F32, err);
    ps_status rc = need_ndim(ly, 0, 2, 2, PS_DTYPE_F32, err);
    if (rc) return rc;
    ps_layer_attrs *a = &ly->a;
    a->kernel[0] = 1;
    a->stride[0] = 1;
    a->padding[0] = 0;
    a->dilation[0] = 1;
    a->output_size[0] = 1;
    return PS_OK;
}

/* The output (C', H', W') as a 1-d kind's (C', L') or a 2-d kind's shape. */
static void plane_out(ps_layer *ly, int64_t c, int64_t h, int64_t w) {
    ly->outs.ndim = one_d(ly) ? 2 : 3;
    ly->outs.dims[0] = c;
    ly->outs.dims[1] = one_d(ly) ? w : h;
    if (!one_d(ly)) ly->outs.dims[2] = w;
    ly->out_dtype = PS_DTYPE_F32;
}

static ps_conv_desc conv_desc(const ps_layer *ly, int n) {
    const ps_layer_attrs *a = &ly->a;
    int cin, h, w;
    plane_of(ly, &cin, &h, &w);
    ps_conv_desc d = {.n = n, .cin = cin, .h = h, .w = w, .cout = (int)a->out, .kh = (int)a->kernel[0], .kw = (int)a->kernel[1],
                      .src_layout = ly->in_layout[0], .dst_layout = ly->out_layout};
    if (a->kernel[0] == a->kernel[1] && a->stride[0] == a->stride[1] && a->padding[0] == a->padding[1] &&
        a->dilation[0] == 1 && a->dilation[1] == 1 && a->groups == 1) {   /* the square form (MNIST's) */
        d.stride = (int)a->stride[0];
        d.pad = (int)a->padding[0];
        return d;
    }
    d.stride_h = (int)a->stride[0];
    d.stride_w = (int)a->stride[1];
    d.pad_h = (int)a->padding[0];
    d.pad_w = (int)a->padding[1];
    d.dil_h = (int)a->dilation[0];
    d.dil_w = (int)a->dilation[1];
    d.groups = (int)a->groups;
    return d;
}

static ps_status conv_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = plane_infer(ly, err);
    if (rc) return rc;
    const ps_layer_attrs *a = &ly->a;
    int64_t cin = ly->in[0].dims[0];
    int ci, ih, iw;
    plane_of(ly, &ci, &ih, &iw);
    if ((rc = check_given("in_channels", a->in_features, cin, err))) return rc;
    if (cin % a->groups || a->out % a->groups)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "groups %lld divides neither in_channels %lld and "
                          "out_channels %lld both", (long long)a->groups, (long long)cin, (long long)a->out);
    ps_conv_desc d = conv_desc(ly, 1);
    if (ps_conv_out_h(&d) < 1 || ps_conv_out_w(&d) < 1 ||
        ih + 2 * a->padding[0] < a->dilation[0] * (a->kernel[0] - 1) + 1 ||
        iw + 2 * a->padding[1] < a->dilation[1] * (a->kernel[1] - 1) + 1) {
        if (one_d(ly))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "kernel %lld (dilation %lld, padding %lld) does not fit "
                              "the input (%lld, %lld)", (long long)a->kernel[1], (long long)a->dilation[1],
                              (long long)a->padding[1], (long long)cin, (long long)iw);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "kernel %lldx%lld (dilation %lldx%lld, padding %lldx%lld) "
                          "does not fit the input (%lld, %lld, %lld)", (long long)a->kernel[0],
                          (long long)a->kernel[1], (long long)a->dilation[0], (long long)a->dilation[1],
                          (long long)a->padding[0], (long long)a->padding[1], (long long)cin,
                          (long long)ih, (long long)iw);
    }
    plane_out(ly, a->out, ps_conv_out_h(&d), ps_conv_out_w(&d));
    int64_t fan_in = cin / a->groups * a->kernel[0] * a->kernel[1];
    /* Conv1d's weight (out, in/groups, k): the same memory as (out, in/groups, 1, k) */
    int64_t wd[4] = {a->out, cin / a->groups, a->kernel[0], a->kernel[1]}, bd[1] = {a->out};
    if (one_d(ly)) wd[2] = a->kernel[1];
    set_param(ly, 0, "weight", one_d(ly) ? 3 : 4, wd, fan_in, FAN_UNIFORM);
    if (a->bias) set_param(ly, 1, "bias", 1, bd, fan_in, FAN_UNIFORM);
    return PS_OK;
}

static ps_status conv_forward(ps_layer_call *c, ps_err *err) {
    if (c->ly->a.wn) return wn_forward(c, conv_forward, err);
    ps_conv_desc d = conv_desc(c->ly, c->n);
    return c->be->ops->conv2d_forward(c->be->impl, &d, c->x, c->w[0], c->ly->a.bias ? c->w[1] : NULL, c->y, err);
}

static ps_status conv_backward(ps_layer_call *c, ps_err *err);

/* A combined backward (c->parts, PS_KIND_BWD_PARTS): each part's weight and
 * bias gradients from its own images - in one call where the backend
 * offers conv2d_wgrad_parts (a GPU's: one GEMM over every image instead of
 * one call per part), else part by part - then dx for all the images at
 * once, last (dx may overwrite dy). */
static ps_status conv_backward_parts(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    const ps_layer_parts *pt = c->parts;
    const ps_backend_ops *ops = c->be->ops;
    ps_status rc = PS_OK;
    int any = 0, all = 1;   /* a parameter gradient wanted; the weight's and bias's of every part */
    for (int p = 0; p < pt->k; p++) {
        float *const *dw = pt->dw + (size_t)p * PS_LAYER_MAX_PARAMS;
        for (int j = 0; j < ly->nparams; j++) any |= dw[j] != NULL;
        all &= dw[0] && (!ly->a.bias || dw[1]);
    }
    if (any && all && !ly->a.wn && ops->conv2d_wgrad_parts) {
        float **dw = malloc(2 * (size_t)pt->k * sizeof *dw);
        if (!dw) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory combining backwards");
        for (int p = 0; p < pt->k; p++) {
            dw[p] = pt->dw[(size_t)p * PS_LAYER_MAX_PARAMS];
            dw[pt->k + p] = pt->dw[(size_t)p * PS_LAYER_MAX_PARAMS + 1];
        }
        const ps_conv_desc d = conv_desc(ly, c->n);
        rc = ops->conv2d_wgrad_parts(c->be->impl, &d, c->x, c->dy, pt->k, pt->off, pt->n, dw,
                                     ly->a.bias ? dw + pt->k : NULL, err);
        free(dw);
    } else if (any) {
        const size_t xs = (size_t)ps_shape_numel(&ly->in[0]) * sizeof(float);
        const size_t ys = (size_t)ps_layer_out_count(ly, 1) * sizeof(float);
        float *no_dx[1] = {NULL};
        for (int p = 0; p < pt->k && rc == PS_OK; p++) {
            const void *x = (const char *)c->x + xs * (size_t)pt->off[p];
            ps_layer_call pc = *c;
            pc.parts = NULL;
            pc.n = pt->n[p];
            pc.xs = &x;
            pc.x = x;
            pc.dy = (const float *)((const char *)c->dy + ys * (size_t)pt->off[p]);
            pc.dxs = no_dx;
            pc.dx = NULL;
            memcpy(pc.dw, pt->dw + (size_t)p * PS_LAYER_MAX_PARAMS, sizeof pc.dw);
            rc = conv_backward(&pc, err);
        }
    }
    if (rc == PS_OK && c->dx) {
        ps_layer_call w = *c;
        w.parts = NULL;
        memset(w.dw, 0, sizeof w.dw);
        rc = conv_backward(&w, err);
    }
    return rc;
}

static ps_status conv_backward(ps_layer_call *c, ps_err *err) {
    if (c->parts) return conv_backward_parts(c, err);
    if (c->ly->a.wn) return wn_backward(c, conv_backward, err);
    ps_conv_desc d = conv_desc(c->ly, c->n);
    return c->be->ops->conv2d_backward(c->be->impl, &d, c->x, c->w[0], c->dy, c->dx, c->dw[0],
                                       c->ly->a.bias ? c->dw[1] : NULL, err);
}

static double conv_flops(const ps_layer *ly) {
    return 2.0 * (double)ps_shape_numel(&ly->outs) * (double)(ly->in[0].dims[0] / ly->a.groups) *
           (double)ly->a.kernel[0] * (double)ly->a.kernel[1];
}

/* ---- ConvTranspose2d: nn.ConvTranspose2d(in_channels, out_channels,
 * kernel_size, stride, padding, output_padding, groups, bias, dilation);
 * params weight (in, out/groups, kh, kw), bias (out) ----
 * The transposed convolution is the input gradient of the convolution
 * that maps its output back to its input: Conv2d(out -> in, the same
 * kernel, stride, padding, dilation, groups) over an (out, H', W') plane,
 * whose weight (in, out/groups, kh, kw) is this kind's own. So its
 * forward is that convolution's backward-data (dy = x), its input
 * gradient that convolution's forward of dy, and its weight gradient that
 * convolution's weight gradient with dy as the input and x as the output
 * gradient - oneDNN's and cuDNN's deconvolution are computed so too, and
 * each backend's convolution ops (with their checks against reference
 * kernels) serve it, in the layouts they take: the convolution's source is
 * this node's output, its destination this node's input. The bias is
 * added per channel. */
static ps_conv_desc upconv_desc(const ps_layer *ly, int n) {
    const ps_layer_attrs *a = &ly->a;
    const int64_t cin = ly->in[0].dims[0];
    return (ps_conv_desc){.n = n, .cin = (int)a->out, .h = (int)ly->outs.dims[1], .w = (int)ly->outs.dims[2],
                          .cout = (int)cin, .kh = (int)a->kernel[0], .kw = (int)a->kernel[1],
                          .stride_h = (int)a->stride[0], .stride_w = (int)a->stride[1], .pad_h = (int)a->padding[0],
                          .pad_w = (int)a->padding[1], .dil_h = (int)a->dilation[0], .dil_w = (int)a->dilation[1],
                          .groups = (int)a->groups, .src_layout = ly->out_layout, .dst_layout = ly->in_layout[0]};
}

static ps_chan_desc upconv_chan(const ps_layer *ly, int n) {
    return (ps_chan_desc){.n = n, .c = (int)ly->outs.dims[0], .s = ly->outs.dims[1] * ly->outs.dims[2],
                          .layout = ly->out_layout};
}

static ps_status upconv_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 3, 3, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_layer_attrs *a = &ly->a;
    const int64_t cin = ly->in[0].dims[0];
    if ((rc = check_given("in_channels", a->in_features, cin, err))) return rc;
    if (cin % a->groups || a->out % a->groups)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "groups %lld divides neither in_channels %lld and "
                          "out_channels %lld both", (long long)a->groups, (long long)cin, (long long)a->out);
    int64_t o[2];
    for (int i = 0; i < 2; i++) {
        if (a->output_padding[i] >= a->stride[i])
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "output_padding %lld is not smaller than stride %lld "
                              "(PyTorch also takes one below the dilation; psd does not)",
                              (long long)a->output_padding[i], (long long)a->stride[i]);
        o[i] = (ly->in[0].dims[1 + i] - 1) * a->stride[i] - 2 * a->padding[i] + a->dilation[i] * (a->kernel[i] - 1) +
               a->output_padding[i] + 1;
    }
    if (o[0] < 1 || o[1] < 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "padding %lldx%lld leaves no output of the input (%lld, "
                          "%lld, %lld) (output %lldx%lld)", (long long)a->padding[0], (long long)a->padding[1],
                          (long long)cin, (long long)ly->in[0].dims[1], (long long)ly->in[0].dims[2],
                          (long long)o[0], (long long)o[1]);
    if (o[0] > PS_DIM_MAX || o[1] > PS_DIM_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "output %lldx%lld is too large", (long long)o[0],
                          (long long)o[1]);
    ly->outs.ndim = 3;
    ly->outs.dims[0] = a->out;
    ly->outs.dims[1] = o[0];
    ly->outs.dims[2] = o[1];
    ly->out_dtype = PS_DTYPE_F32;
    /* PyTorch's fan_in of this weight: its dim 1 times the kernel */
    const int64_t fan_in = a->out / a->groups * a->kernel[0] * a->kernel[1];
    const int64_t wd[4] = {cin, a->out / a->groups, a->kernel[0], a->kernel[1]}, bd[1] = {a->out};
    set_param(ly, 0, "weight", 4, wd, fan_in, FAN_UNIFORM);
    if (a->bias) set_param(ly, 1, "bias", 1, bd, fan_in, FAN_UNIFORM);
    return PS_OK;
}

static const char *upconv_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    const char *wn = wn_missing(ly, ops);
    if (wn) return wn;
    if (ly->a.bias && !(ops->bias_add && ops->bias_grad)) return "bias_add/bias_grad";
    return NULL;
}

static ps_status upconv_forward(ps_layer_call *c, ps_err *err) {
    if (c->ly->a.wn) return wn_forward(c, upconv_forward, err);
    const ps_conv_desc d = upconv_desc(c->ly, c->n);
    ps_status rc = c->be->ops->conv2d_backward(c->be->impl, &d, NULL, c->w[0], c->x, c->y, NULL, NULL, err);
    if (rc || !c->ly->a.bias) return rc;
    const ps_chan_desc cd = upconv_chan(c->ly, c->n);
    return c->be->ops->bias_add(c->be->impl, &cd, c->w[1], c->y, err);
}

static ps_status upconv_backward(ps_layer_call *c, ps_err *err) {
    if (c->ly->a.wn) return wn_backward(c, upconv_backward, err);
    const ps_conv_desc d = upconv_desc(c->ly, c->n);
    ps_status rc;
    if (c->dx && (rc = c->be->ops->conv2d_forward(c->be->impl, &d, c->dy, c->w[0], NULL, c->dx, err))) return rc;
    if (c->dw[0] && (rc = c->be->ops->conv2d_backward(c->be->impl, &d, c->dy, c->w[0], c->x, NULL, c->dw[0], NULL,
                                                       err)))
        return rc;
    if (c->ly->a.bias && c->dw[1]) {
        const ps_chan_desc cd = upconv_chan(c->ly, c->n);
        return c->be->ops->bias_grad(c->be->impl, &cd, c->dy, c->dw[1], err);
    }
    return PS_OK;
}

static double upconv_flops(const ps_layer *ly) {
    return 2.0 * (double)ps_shape_numel(&ly->in[0]) * (double)(ly->a.out / ly->a.groups) * (double)ly->a.kernel[0] *
           (double)ly->a.kernel[1];
}

/* ---- Upsample: nn.Upsample(size, scale_factor, mode, align_corners,
 * recompute_scale_factor) and F.interpolate (nn.UpsamplingNearest2d and
 * nn.UpsamplingBilinear2d are Upsample with mode nearest, and bilinear with
 * align_corners true) over (C, H, W): PyTorch's output size (size, or
 * floor(H * scale_factor)) and source indices (backend.h ps_resize_desc).
 * Plain layout. ---- */
static ps_resize_desc resize_desc(const ps_layer *ly, int n) {
    const ps_layer_attrs *a = &ly->a;
    ps_resize_desc d = {.n = n, .c = (int)ly->in[0].dims[0], .h = (int)ly->in[0].dims[1], .w = (int)ly->in[0].dims[2],
                        .oh = (int)ly->outs.dims[1], .ow = (int)ly->outs.dims[2], .bilinear = a->resize_mode == 1,
                        .align_corners = a->resize_mode == 1 && a->align_corners};
    const int scaled = a->scale_given && !a->recompute_scale;
    d.scale_h = ps_resize_scale(d.h, d.oh, scaled ? a->scale_factor[0] : 0, d.align_corners);
    d.scale_w = ps_resize_scale(d.w, d.ow, scaled ? a->scale_factor[1] : 0, d.align_corners);
    return d;
}

static ps_status resize_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 3, 3, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_layer_attrs *a = &ly->a;
    const int has_size = a->size[0] > 0;
    if (has_size == a->scale_given)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "give either size or scale_factor (%s)",
                          has_size ? "both are given" : "neither is");
    if (a->resize_mode == 0 && a->align_corners)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "align_corners applies to mode 'bilinear' only (PyTorch "
                          "refuses it with 'nearest')");
    if (has_size && a->recompute_scale)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "recompute_scale_factor needs scale_factor, not size");
    ly->outs.ndim = 3;
    ly->outs.dims[0] = ly->in[0].dims[0];
    for (int i = 0; i < 2; i++) {
        const double o = has_size ? (double)a->size[i] : floor((double)ly->in[0].dims[1 + i] * a->scale_factor[i]);
        if (o < 1 || o > PS_DIM_MAX || o > 65536.0 * 65536.0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "output size %g of input size %lld is outside 1..%lld",
                              o, (long long)ly->in[0].dims[1 + i], (long long)PS_DIM_MAX);
        ly->outs.dims[1 + i] = (int64_t)o;
    }
    if (ly->outs.dims[1] > 2147483647 / ly->outs.dims[2] || ly->in[0].dims[1] > 2147483647 / ly->in[0].dims[2])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "a plane of %lldx%lld is too large",
                          (long long)ly->outs.dims[1], (long long)ly->outs.dims[2]);
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *resize_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->resize_forward && ops->resize_backward ? NULL : "resize_forward/resize_backward";
}

static ps_status resize_forward(ps_layer_call *c, ps_err *err) {
    const ps_resize_desc d = resize_desc(c->ly, c->n);
    return c->be->ops->resize_forward(c->be->impl, &d, c->x, c->y, err);
}

static ps_status resize_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    const ps_resize_desc d = resize_desc(c->ly, c->n);
    return c->be->ops->resize_backward(c->be->impl, &d, c->dy, c->dx, err);
}

/* Four multiply-adds an output (bilinear), a copy (nearest). */
static double resize_flops(const ps_layer *ly) {
    return (ly->a.resize_mode == 1 ? 8.0 : 1.0) * (double)ps_shape_numel(&ly->outs);
}

/* ---- spatial transformers: AffineGrid (F.affine_grid(theta, size,
 * align_corners): theta (2, 3) per sample -> the grid (H, W, 2), size the
 * model file's [H, W], F.affine_grid's size[2:]) and GridSample
 * (F.grid_sample(x, grid, mode, padding_mode, align_corners): x (C, H, W)
 * and grid (H', W', 2) -> (C, H', W')), PyTorch's 2-d rules (backend.h
 * ps_affgrid_desc, ps_gridsample_desc); gradients to theta, to x and to
 * the grid (the STN trains its localisation net through them). Plain
 * layout. ---- */
static ps_affgrid_desc affgrid_desc(const ps_layer *ly, int n) {
    const ps_affgrid_desc d = {n, (int)ly->outs.dims[0], (int)ly->outs.dims[1], ly->a.align_corners};
    return d;
}

static ps_status affgrid_infer(ps_layer *ly, ps_err *err) {
    char b[64];
    ps_status rc = need_ndim(ly, 0, 2, 2, PS_DTYPE_F32, err);
    if (rc) return rc;
    if (ly->in[0].dims[0] != 2 || ly->in[0].dims[1] != 3)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "per-sample input %s: AffineGrid takes theta (2, 3) (a 2-d "
                          "affine matrix; theta.view(-1, 2, 3))", ps_shape_format(&ly->in[0], b, sizeof b));
    if (ly->a.size[0] * ly->a.size[1] > 1 << 24)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "size %lldx%lld: psd's AffineGrid takes at most 2^24 points",
                          (long long)ly->a.size[0], (long long)ly->a.size[1]);
    ly->outs.ndim = 3;
    ly->outs.dims[0] = ly->a.size[0];
    ly->outs.dims[1] = ly->a.size[1];
    ly->outs.dims[2] = 2;
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *affgrid_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->affine_grid && ops->affine_grid_backward ? NULL : "affine_grid/affine_grid_backward";
}

static ps_status affgrid_forward(ps_layer_call *c, ps_err *err) {
    const ps_affgrid_desc d = affgrid_desc(c->ly, c->n);
    return c->be->ops->affine_grid(c->be->impl, &d, c->x, c->y, err);
}

static ps_status affgrid_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    const ps_affgrid_desc d = affgrid_desc(c->ly, c->n);
    return c->be->ops->affine_grid_backward(c->be->impl, &d, c->dy, c->dx, err);
}

/* Three multiply-adds per coordinate. */
static double affgrid_flops(const ps_layer *ly) { return 6.0 * (double)ps_shape_numel(&ly->outs); }

static ps_gridsample_desc gridsample_desc(const ps_layer *ly, int n) {
    const ps_gridsample_desc d = {n, (int)ly->in[0].dims[0], (int)ly->in[0].dims[1], (int)ly->in[0].dims[2],
                                  (int)ly->in[1].dims[0], (int)ly->in[1].dims[1], ly->a.gs_mode, ly->a.gs_padding,
                                  ly->a.align_corners};
    return d;
}

static ps_status gridsample_infer(ps_layer *ly, ps_err *err) {
    char b0[64], b1[64];
    ps_status rc = need_ndim(ly, 0, 3, 3, PS_DTYPE_F32, err);
    if (!rc) rc = need_ndim(ly, 1, 3, 3, PS_DTYPE_F32, err);
    if (rc) return rc;
    if (ly->in[1].dims[2] != 2)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s and %s: GridSample takes the input (C, H, W) "
                          "and a grid (H', W', 2) of (x, y) points (4-d input, 2-d sampling)",
                          ps_shape_format(&ly->in[0], b0, sizeof b0), ps_shape_format(&ly->in[1], b1, sizeof b1));
    if (ly->a.gs_mode == 2)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "mode 'bicubic': psd's GridSample samples 'bilinear' and "
                          "'nearest'");
    if (ly->in[0].dims[1] * ly->in[0].dims[2] > 2147483647 / ly->in[0].dims[0] ||
        ly->in[1].dims[0] * ly->in[1].dims[1] > 2147483647 / ly->in[0].dims[0])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s and %s are too large for GridSample",
                          ps_shape_format(&ly->in[0], b0, sizeof b0), ps_shape_format(&ly->in[1], b1, sizeof b1));
    ly->outs.ndim = 3;
    ly->outs.dims[0] = ly->in[0].dims[0];
    ly->outs.dims[1] = ly->in[1].dims[0];
    ly->outs.dims[2] = ly->in[1].dims[1];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *gridsample_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->grid_sample && ops->grid_sample_backward ? NULL : "grid_sample/grid_sample_backward";
}

static ps_status gridsample_forward(ps_layer_call *c, ps_err *err) {
    const ps_gridsample_desc d = gridsample_desc(c->ly, c->n);
    return c->be->ops->grid_sample(c->be->impl, &d, c->xs[0], c->xs[1], c->y, err);
}

static ps_status gridsample_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dxs[0] && !c->dxs[1]) return PS_OK;
    const ps_gridsample_desc d = gridsample_desc(c->ly, c->n);
    return c->be->ops->grid_sample_backward(c->be->impl, &d, c->xs[0], c->xs[1], c->dy, c->dxs[0], c->dxs[1], err);
}

/* Four multiply-adds an output (bilinear), a copy (nearest). */
static double gridsample_flops(const ps_layer *ly) {
    return (ly->a.gs_mode == 0 ? 8.0 : 1.0) * (double)ps_shape_numel(&ly->outs);
}

/* ---- ReLU ---- */

static ps_status relu_forward(ps_layer_call *c, ps_err *err) {
    return c->be->ops->relu_forward(c->be->impl, ps_layer_out_count(c->ly, c->n), c->x, c->y, err);
}

static ps_status relu_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return c->be->ops->relu_backward(c->be->impl, ps_layer_out_count(c->ly, c->n), c->y, c->dy, c->dx, err);
}

/* ---- MaxPool2d, AvgPool2d: nn.MaxPool2d / nn.AvgPool2d(kernel_size,
 * stride=kernel_size, padding, count_include_pad); AdaptiveAvgPool2d
 * (output_size): PyTorch's bins (backend.h ps_adaptive_desc), run as an
 * average pool where they are one (the output size divides the input's:
 * kernel = stride = in / out; 1x1 is the plane, stride 1) and by the
 * adaptive ops, in the plain layout, where they are not ---- */

static int is_adaptive(const ps_layer *ly) { return !strncmp(ly->kind->name, "AdaptiveAvgPool", 15); }

/* AdaptiveAvgPool2d whose bins are average pooling's windows. */
static int adaptive_uniform(const ps_layer *ly) {
    int c, h, w;
    plane_of(ly, &c, &h, &w);
    return h % ly->a.out_hw[0] == 0 && w % ly->a.out_hw[1] == 0;
}

static ps_pool_desc pool_desc(const ps_layer *ly, int n) {
    const ps_layer_attrs *a = &ly->a;
    int pc, ph, pw;
    plane_of(ly, &pc, &ph, &pw);
    ps_pool_desc d = {.n = n, .c = pc, .h = ph, .w = pw,
                      .layout = ly->in_layout[0], .count_include_pad = a->count_include_pad,
                      .ceil_mode = is_adaptive(ly) ? 0 : a->flag};
    if (is_adaptive(ly)) {   /* uniform bins (adaptive_uniform): windows in / out, stride the same */
        d.kh = d.h / (int)a->out_hw[0];
        d.kw = d.w / (int)a->out_hw[1];
        d.stride_h = a->out_hw[0] == 1 ? 1 : d.kh;   /* 1x1: the whole plane, stride 1 (as it always was) */
        d.stride_w = a->out_hw[1] == 1 ? 1 : d.kw;
        d.count_include_pad = 1;
        return d;
    }
    int64_t sh = a->stride[0] ? a->stride[0] : a->kernel[0], sw = a->stride[1] ? a->stride[1] : a->kernel[1];
    if (a->kernel[0] == a->kernel[1] && sh == sw && !a->padding[0] && !a->padding[1]) {   /* the square form */
        d.k = (int)a->kernel[0];
        d.stride = (int)sh;
        return d;
    }
    d.kh = (int)a->kernel[0];
    d.kw = (int)a->kernel[1];
    d.stride_h = (int)sh;
    d.stride_w = (int)sw;
    d.pad_h = (int)a->padding[0];
    d.pad_w = (int)a->padding[1];
    return d;
}

static ps_adaptive_desc adaptive_desc(const ps_layer *ly, int n) {
    int c, h, w;
    plane_of(ly, &c, &h, &w);
    ps_adaptive_desc d = {n, c, h, w, (int)ly->a.out_hw[0], (int)ly->a.out_hw[1]};
    return d;
}

static ps_status pool_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = plane_infer(ly, err);
    if (rc) return rc;
    const ps_layer_attrs *a = &ly->a;
    int pc, ph, pw;
    plane_of(ly, &pc, &ph, &pw);
    /* PyTorch takes padding up to half the kernel; ONNX (and psd) up to the
     * kernel less one, so every window holds an input position. */
    if (one_d(ly) && a->padding[1] >= a->kernel[1])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "padding %lld is not smaller than the kernel %lld",
                          (long long)a->padding[1], (long long)a->kernel[1]);
    if (a->padding[0] >= a->kernel[0] || a->padding[1] >= a->kernel[1])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "padding %lldx%lld is not smaller than the kernel %lldx%lld",
                          (long long)a->padding[0], (long long)a->padding[1], (long long)a->kernel[0],
                          (long long)a->kernel[1]);
    ps_pool_desc d = pool_desc(ly, 1);
    /* An average pool whose ceil_mode window reaches past the padded input
     * divides by less than kh*kw (PyTorch's rule), which oneDNN's
     * avg_include_padding does not: it computes in the plain layout, where
     * every backend runs its own kernel (backend_dnnl.c plain_pool_entry). */
    if (!strncmp(ly->kind->name, "AvgPool", 7) && a->count_include_pad && ps_pool_ceil_extra(&d))
        ly->flags &= ~(unsigned)PS_KIND_LAYOUT_KEEP;
    if (ph + 2 * a->padding[0] < a->kernel[0] || pw + 2 * a->padding[1] < a->kernel[1]) {
        if (one_d(ly))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "window %lld does not fit the input (%d, %d)",
                              (long long)a->kernel[1], pc, pw);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "window %lldx%lld does not fit the input (%d, %d, %d)",
                          (long long)a->kernel[0], (long long)a->kernel[1], pc, ph, pw);
    }
    plane_out(ly, pc, ps_pool_out_h(&d), ps_pool_out_w(&d));
    return PS_OK;
}

/* AdaptiveAvgPool2d: output_size entries null keep the input's size. */
static ps_status adaptive_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = plane_infer(ly, err);
    if (rc) return rc;
    ps_layer_attrs *a = &ly->a;
    int c, hw[2];
    plane_of(ly, &c, &hw[0], &hw[1]);
    for (int i = 0; i < 2; i++) a->out_hw[i] = a->output_size[i] ? a->output_size[i] : hw[i];
    /* uneven bins: the adaptive ops, plain layout */
    if (!adaptive_uniform(ly)) ly->flags &= ~(unsigned)PS_KIND_LAYOUT_KEEP;
    plane_out(ly, c, a->out_hw[0], a->out_hw[1]);
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
    const ps_pool_desc r = pool_desc(ly, 1), g = ps_pool_resolve(&r);
    return (double)ps_shape_numel(&ly->outs) * (double)g.kh * (double)g.kw;
}

static const char *avgpool_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->avgpool_forward && ops->avgpool_backward ? NULL : "avgpool_forward/avgpool_backward";
}

static ps_status avgpool_forward(ps_layer_call *c, ps_err *err) {
    ps_pool_desc d = pool_desc(c->ly, c->n);
    return c->be->ops->avgpool_forward(c->be->impl, &d, c->x, c->y, err);
}

static ps_status avgpool_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    ps_pool_desc d = pool_desc(c->ly, c->n);
    return c->be->ops->avgpool_backward(c->be->impl, &d, c->dy, c->dx, err);
}

static const char *adaptive_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    if (adaptive_uniform(ly)) return avgpool_missing(ly, ops);
    return ops->adaptive_avgpool_forward && ops->adaptive_avgpool_backward
               ? NULL : "adaptive_avgpool_forward/adaptive_avgpool_backward";
}

static ps_status adaptive_forward(ps_layer_call *c, ps_err *err) {
    if (adaptive_uniform(c->ly)) return avgpool_forward(c, err);
    ps_adaptive_desc d = adaptive_desc(c->ly, c->n);
    return c->be->ops->adaptive_avgpool_forward(c->be->impl, &d, c->x, c->y, err);
}

static ps_status adaptive_backward(ps_layer_call *c, ps_err *err) {
    if (adaptive_uniform(c->ly)) return avgpool_backward(c, err);
    if (!c->dx) return PS_OK;
    ps_adaptive_desc d = adaptive_desc(c->ly, c->n);
    return c->be->ops->adaptive_avgpool_backward(c->be->impl, &d, c->dy, c->dx, err);
}

/* Per output element, its bin's area (the adds of its sum). */
static double adaptive_flops(const ps_layer *ly) {
    const ps_adaptive_desc d = adaptive_desc(ly, 1);
    double rows = 0, cols = 0;
    for (int i = 0; i < d.oh; i++) rows += ps_adaptive_end(i, d.h, d.oh) - ps_adaptive_start(i, d.h, d.oh);
    for (int j = 0; j < d.ow; j++) cols += ps_adaptive_end(j, d.w, d.ow) - ps_adaptive_start(j, d.w, d.ow);
    return (double)d.c * rows * cols;
}

/* ---- BatchNorm2d / BatchNorm1d: nn.BatchNorm2d(num_features, eps,
 * momentum, affine, track_running_stats). Training forwards use the
 * batch's statistics and keep mean, invstd and the unbiased variance in the
 * tape: the model folds the last two into running_mean / running_var when
 * the context's step is applied (model.c), never here. ---- */

/* (n, C, s): s = H*W (2d), L or 1 (1d). */
static ps_chan_desc bn_desc(const ps_layer *ly, int n) {
    const ps_shape *in = &ly->in[0];
    int64_t s = 1;
    for (int d = 1; d < in->ndim; d++) s *= in->dims[d];
    ps_chan_desc d = {n, (int)in->dims[0], s, ly->in_layout[0], (float)ly->a.eps, ly->fused};
    return d;
}

static ps_status bn_infer_dims(ps_layer *ly, int lo, int hi, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, lo, hi, PS_DTYPE_F32, err);
    if (rc) return rc;
    int64_t c = ly->in[0].dims[0];
    if ((rc = check_given("num_features", ly->a.in_features, c, err))) return rc;
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    int64_t cd[1] = {c};
    if (ly->a.affine) {
        set_param(ly, 0, "weight", 1, cd, c, ONES);
        set_param(ly, 1, "bias", 1, cd, c, ZEROS);
    }
    if (ly->a.track) {
        set_buffer(ly, "running_mean", 1, cd, PS_DTYPE_F32, 0.0f);
        set_buffer(ly, "running_var", 1, cd, PS_DTYPE_F32, 1.0f);
        set_buffer(ly, "num_batches_tracked", 0, cd, PS_DTYPE_I64, 0.0f);
    }
    return PS_OK;
}

static ps_status bn2d_infer(ps_layer *ly, ps_err *err) { return bn_infer_dims(ly, 3, 3, err); }
static ps_status bn1d_infer(ps_layer *ly, ps_err *err) { return bn_infer_dims(ly, 1, 2, err); }

static const char *bn_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->batchnorm_forward_training && ops->batchnorm_forward_inference && ops->batchnorm_backward
               ? NULL : "batchnorm_forward_training/batchnorm_forward_inference/batchnorm_backward";
}

static ps_status bn_forward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    ps_chan_desc d = bn_desc(ly, c->n);
    const float *gamma = ly->a.affine ? c->w[0] : NULL, *beta = ly->a.affine ? c->w[1] : NULL;
    if (!c->train && ly->a.track)   /* eval: the running statistics */
        return c->be->ops->batchnorm_forward_inference(c->be->impl, &d, c->x, gamma, beta, c->buf[0], c->buf[1],
                                                       c->y, NULL, err);
    if ((int64_t)d.n * d.s < 2)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "BatchNorm %s: expected more than 1 value per channel when "
                          "training (got a batch of %d with %lld per sample)", ly->name, c->n, (long long)d.s);
    float *mean = ps_backend_alloc_floats(c->be, d.c), *invstd = ps_backend_alloc_floats(c->be, d.c);
    float *var = c->train && ly->a.track ? ps_backend_alloc_floats(c->be, d.c) : NULL;
    if (!mean || !invstd || (c->train && ly->a.track && !var)) {
        ps_backend_release(c->be, mean);
        ps_backend_release(c->be, invstd);
        ps_backend_release(c->be, var);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's statistics", ly->name);
    }
    if (c->train) {   /* kept for the backward and the running statistics */
        c->saved->dev[0] = mean;
        c->saved->dev[1] = invstd;
        c->saved->dev[2] = var;
    }
    ps_status rc = c->be->ops->batchnorm_forward_training(c->be->impl, &d, c->x, gamma, beta, c->y, mean, invstd,
                                                          var, err);
    if (!c->train) {
        ps_backend_release(c->be, mean);
        ps_backend_release(c->be, invstd);
    }
    return rc;
}

static ps_status bn_backward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    ps_chan_desc d = bn_desc(ly, c->n);
    return c->be->ops->batchnorm_backward(c->be->impl, &d, 1, c->x, c->dy, ly->a.affine ? c->w[0] : NULL,
                                          ly->a.affine ? c->w[1] : NULL,
                                          c->saved->dev[0], c->saved->dev[1], c->dx,
                                          ly->a.affine ? c->dw[0] : NULL, ly->a.affine ? c->dw[1] : NULL, err);
}

static size_t bn_bytes(const ps_layer *ly, int n) { (void)n; return 3 * (size_t)ly->in[0].dims[0] * sizeof(float); }

static double bn_flops(const ps_layer *ly) { return 4.0 * (double)ps_shape_numel(&ly->outs); }

/* The batch mean and unbiased variance of a training forward. */
static int bn_stats(const ps_layer *ly, const ps_layer_saved *sv, const float **dev, int64_t *len) {
    if (!ly->a.track || !sv->dev[0] || !sv->dev[2]) return 0;
    dev[0] = sv->dev[0];
    dev[1] = sv->dev[2];
    len[0] = len[1] = ly->in[0].dims[0];
    return 2;
}

/* PyTorch's update (ATen's batch_norm update_stats, in double): count the
 * batch, then running = (1 - f) * running + f * batch with f = momentum,
 * or 1 / num_batches_tracked for momentum=None (a cumulative average). */
static void bn_fold(const ps_layer *ly, float *const *fbuf, int64_t *const *ibuf, const float *const *stats) {
    int64_t c = ly->in[0].dims[0];
    ibuf[2][0] += 1;
    double f = ly->a.momentum_null ? 1.0 / (double)ibuf[2][0] : ly->a.momentum;
    for (int64_t j = 0; j < c; j++) {
        fbuf[0][j] = (float)(f * stats[0][j] + (1.0 - f) * fbuf[0][j]);
        fbuf[1][j] = (float)(f * stats[1][j] + (1.0 - f) * fbuf[1][j]);
    }
}

/* ---- LayerNorm: nn.LayerNorm(normalized_shape, eps, elementwise_affine)
 * over the trailing dimensions ---- */

static ps_ln_desc ln_desc(const ps_layer *ly, int n) {
    int64_t cols = 1;
    for (int d = 0; d < ly->a.ndims; d++) cols *= ly->a.dims[d];
    ps_ln_desc d = {(int64_t)n * (ps_shape_numel(&ly->in[0]) / cols), cols, (float)ly->a.eps};
    return d;
}

static ps_status ln_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_shape *in = &ly->in[0];
    int k = ly->a.ndims, ok = k <= in->ndim;
    for (int d = 0; ok && d < k; d++) ok = in->dims[in->ndim - k + d] == ly->a.dims[d];
    if (!ok) {
        char b[64];
        ps_shape ns = {.ndim = k};
        for (int d = 0; d < k; d++) ns.dims[d] = ly->a.dims[d];
        char b2[64];
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "normalized_shape %s is not the input's trailing "
                          "dimensions %s", ps_shape_format(&ns, b2, sizeof b2), ps_shape_format(in, b, sizeof b));
    }
    ly->outs = *in;
    ly->out_dtype = PS_DTYPE_F32;
    if (ly->a.affine) {
        set_param(ly, 0, "weight", k, ly->a.dims, 1, ONES);
        set_param(ly, 1, "bias", k, ly->a.dims, 1, ZEROS);
    }
    return PS_OK;
}

static const char *ln_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->layernorm_forward && ops->layernorm_backward ? NULL : "layernorm_forward/layernorm_backward";
}

static ps_status ln_forward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    ps_ln_desc d = ln_desc(ly, c->n);
    float *mean = NULL, *rstd = NULL;
    if (c->train) {
        mean = ps_backend_alloc_floats(c->be, d.rows);
        rstd = ps_backend_alloc_floats(c->be, d.rows);
        c->saved->dev[0] = mean;
        c->saved->dev[1] = rstd;
        if (!mean || !rstd) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", ly->name);
    }
    return c->be->ops->layernorm_forward(c->be->impl, &d, c->x, ly->a.affine ? c->w[0] : NULL,
                                         ly->a.affine ? c->w[1] : NULL, c->y, mean, rstd, err);
}

static ps_status ln_backward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    ps_ln_desc d = ln_desc(ly, c->n);
    return c->be->ops->layernorm_backward(c->be->impl, &d, c->x, c->dy, ly->a.affine ? c->w[0] : NULL,
                                          c->saved->dev[0], c->saved->dev[1], c->dx, ly->a.affine ? c->dw[0] : NULL,
                                          ly->a.affine ? c->dw[1] : NULL, err);
}

static size_t ln_bytes(const ps_layer *ly, int n) { return 2 * (size_t)ln_desc(ly, n).rows * sizeof(float); }

static double ln_flops(const ps_layer *ly) { return 5.0 * (double)ps_shape_numel(&ly->outs); }

/* ---- GroupNorm: nn.GroupNorm(num_groups, num_channels, eps, affine) over
 * (C, *) per sample; InstanceNorm1d / InstanceNorm2d (num_features, eps,
 * affine, without running statistics) are its num_groups = C. Each sample's
 * group is normalised by its own statistics in training and in eval alike;
 * the parameters are per channel. Plain layout. ---- */

static ps_gn_desc gn_desc(const ps_layer *ly, int n) {
    const int64_t c = ly->in[0].dims[0];
    ps_gn_desc d = {n, c, ps_shape_numel(&ly->in[0]) / c, ly->a.groups, (float)ly->a.eps};
    return d;
}

static ps_status gn_infer_dims(ps_layer *ly, int lo, int hi, const char *given, int instance, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, lo, hi, PS_DTYPE_F32, err);
    if (rc) return rc;
    const int64_t c = ly->in[0].dims[0];
    if ((rc = check_given(given, ly->a.in_features, c, err))) return rc;
    if (instance) {
        if (ly->a.track)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "track_running_stats: true (running statistics "
                              "used in eval) is not supported; psd's instance norm normalises each sample by "
                              "its own statistics, as PyTorch's default");
        ly->a.groups = c;
    } else if (c % ly->a.groups) {
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "num_groups %lld does not divide the input's %lld channels",
                          (long long)ly->a.groups, (long long)c);
    }
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    int64_t cd[1] = {c};
    if (ly->a.affine) {
        set_param(ly, 0, "weight", 1, cd, c, ONES);
        set_param(ly, 1, "bias", 1, cd, c, ZEROS);
    }
    return PS_OK;
}

static ps_status gn_infer(ps_layer *ly, ps_err *err) {
    return gn_infer_dims(ly, 1, PS_SHAPE_MAX_DIMS, "num_channels", 0, err);
}
static ps_status in1d_infer(ps_layer *ly, ps_err *err) { return gn_infer_dims(ly, 2, 2, "num_features", 1, err); }
static ps_status in2d_infer(ps_layer *ly, ps_err *err) { return gn_infer_dims(ly, 3, 3, "num_features", 1, err); }

static const char *gn_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->groupnorm_forward && ops->groupnorm_backward ? NULL : "groupnorm_forward/groupnorm_backward";
}

static ps_status gn_forward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    const ps_gn_desc d = gn_desc(ly, c->n);
    float *mean = NULL, *rstd = NULL;
    if (c->train) {
        mean = ps_backend_alloc_floats(c->be, d.n * d.groups);
        rstd = ps_backend_alloc_floats(c->be, d.n * d.groups);
        c->saved->dev[0] = mean;
        c->saved->dev[1] = rstd;
        if (!mean || !rstd) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", ly->name);
    }
    return c->be->ops->groupnorm_forward(c->be->impl, &d, c->x, ly->a.affine ? c->w[0] : NULL,
                                         ly->a.affine ? c->w[1] : NULL, c->y, mean, rstd, err);
}

static ps_status gn_backward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    const ps_gn_desc d = gn_desc(ly, c->n);
    return c->be->ops->groupnorm_backward(c->be->impl, &d, c->x, c->dy, ly->a.affine ? c->w[0] : NULL,
                                          c->saved->dev[0], c->saved->dev[1], c->dx, ly->a.affine ? c->dw[0] : NULL,
                                          ly->a.affine ? c->dw[1] : NULL, err);
}

static size_t gn_bytes(const ps_layer *ly, int n) {
    const ps_gn_desc d = gn_desc(ly, n);
    return 2 * (size_t)(d.n * d.groups) * sizeof(float);
}

static double gn_flops(const ps_layer *ly) { return 5.0 * (double)ps_shape_numel(&ly->outs); }

/* ---- Normalize: F.normalize(x, p=2, dim, eps), each vector along dim
 * divided by max(its 2-norm, eps) (embeddings, cosine classifiers,
 * contrastive losses). The backward recomputes the norms from x. ---- */

static ps_status l2norm_infer(ps_layer *ly, ps_err *err) {
    if (ly->a.p != 2.0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "p: %g (psd normalises by the 2-norm only)", ly->a.p);
    int d;
    ps_status rc = need_dim_attr(ly, &d, err);
    if (rc) return rc;
    if (ly->in[0].dims[d] > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dim %lld has %lld elements: too many", (long long)ly->a.dim,
                          (long long)ly->in[0].dims[d]);
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static ps_l2norm_desc l2norm_desc(const ps_layer *ly, int n) {
    const int d = sample_dim(ly->a.dim, ly->in[0].ndim);
    ps_l2norm_desc s = {n, (int)ly->in[0].dims[d], 1, (float)ly->a.eps};
    for (int k = 0; k < d; k++) s.outer *= ly->in[0].dims[k];
    for (int k = d + 1; k < ly->in[0].ndim; k++) s.inner *= ly->in[0].dims[k];
    return s;
}

static const char *l2norm_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->l2norm_forward && ops->l2norm_backward ? NULL : "l2norm_forward/l2norm_backward";
}

static ps_status l2norm_forward(ps_layer_call *c, ps_err *err) {
    const ps_l2norm_desc d = l2norm_desc(c->ly, c->n);
    return c->be->ops->l2norm_forward(c->be->impl, &d, c->x, c->y, err);
}

static ps_status l2norm_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    const ps_l2norm_desc d = l2norm_desc(c->ly, c->n);
    return c->be->ops->l2norm_backward(c->be->impl, &d, c->x, c->dy, c->dx, err);
}

/* ---- activations: LeakyReLU(negative_slope), GELU(approximate), SiLU,
 * Tanh, Sigmoid, Hardtanh(min_val, max_val), ReLU6 (Hardtanh(0, 6), as
 * PyTorch's), Hardswish, Hardsigmoid (ReLU has its own ops above); the
 * backward reads the input or the output, as the activation needs ---- */

#define ACT_MATH 8
#define ACT_SHRINK 19   /* kinds_of's first shrink: ACT_MATH + its 11 elementwise math kinds */
#define ACT_MORE 26     /* kinds_of's Log1p: ACT_SHRINK + its 6 shrinks and RReLU */

static ps_act_desc act_desc(const ps_layer *ly) {
    static const int kinds_of[] = {PS_ACT_LEAKY_RELU, PS_ACT_GELU, PS_ACT_SILU, PS_ACT_TANH, PS_ACT_SIGMOID,
                                   PS_ACT_HARDTANH, PS_ACT_HARDSWISH, PS_ACT_HARDSIGMOID,
                                   /* elementwise math: ACT_MATH + k */
                                   PS_ACT_ELU, PS_ACT_SELU, PS_ACT_SOFTPLUS, PS_ACT_MISH, PS_ACT_LOGSIGMOID,
                                   PS_ACT_EXP, PS_ACT_LOG, PS_ACT_ABS, PS_ACT_SQRT, PS_ACT_POW, PS_ACT_LINEAR,
                                   /* shrinks and thresholds: ACT_SHRINK + k */
                                   PS_ACT_CELU, PS_ACT_SOFTSIGN, PS_ACT_TANHSHRINK, PS_ACT_HARDSHRINK,
                                   PS_ACT_SOFTSHRINK, PS_ACT_THRESHOLD, PS_ACT_LEAKY_RELU,
                                   /* more math and the comparisons: ACT_MORE + k */
                                   PS_ACT_LOG1P, PS_ACT_EXPM1, PS_ACT_SIN, PS_ACT_COS, PS_ACT_GT, PS_ACT_LT,
                                   PS_ACT_GE, PS_ACT_LE, PS_ACT_ERF, PS_ACT_SIGN};
    ps_act_desc d = {kinds_of[ly->a.act], (float)ly->a.slope, 0.0f};
    if (d.kind == PS_ACT_GELU && ly->a.approximate) d.kind = PS_ACT_GELU_TANH;
    if (d.kind == PS_ACT_HARDTANH) {
        d.alpha = (float)ly->a.min_val;
        d.beta = (float)ly->a.max_val;
    }
    if (d.kind == PS_ACT_ELU || d.kind == PS_ACT_CELU) d.alpha = (float)ly->a.elu_alpha;
    if (d.kind == PS_ACT_HARDSHRINK || d.kind == PS_ACT_SOFTSHRINK) d.alpha = (float)ly->a.lambd;
    if (d.kind == PS_ACT_THRESHOLD) {
        d.alpha = (float)ly->a.threshold;
        d.beta = (float)ly->a.value;
    }
    if (ly->a.act == ACT_SHRINK + 6) d.alpha = (float)((ly->a.rr_lower + ly->a.rr_upper) / 2.0);   /* RReLU, eval */
    if (d.kind == PS_ACT_SOFTPLUS) {
        d.alpha = (float)ly->a.sp_beta;
        d.beta = (float)ly->a.sp_threshold;
    }
    if (d.kind == PS_ACT_POW) d.alpha = (float)ly->a.exponent;
    if (d.kind == PS_ACT_LINEAR) {
        d.alpha = 1.0f;
        d.beta = (float)ly->a.value;
    }
    if (d.kind >= PS_ACT_GT && d.kind <= PS_ACT_LE) d.alpha = (float)ly->a.value;
    return d;
}

/* ly->a.act carries the row's activation (set by its infer). */
static ps_status act_infer_as(ps_layer *ly, int which, ps_err *err) {
    ps_status rc = infer_same(ly, err);
    if (rc) return rc;
    ly->a.act = which;
    ly->flags &= ~(unsigned)(PS_KIND_BWD_X | PS_KIND_BWD_Y);
    ly->flags |= ps_act_backward_reads_x(act_desc(ly).kind) ? PS_KIND_BWD_X : PS_KIND_BWD_Y;
    return PS_OK;
}
static ps_status leaky_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, 0, err); }
static ps_status gelu_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, 1, err); }
static ps_status silu_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, 2, err); }
static ps_status tanh_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, 3, err); }
static ps_status sigmoid_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, 4, err); }
static ps_status hardswish_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, 6, err); }
static ps_status hardsigmoid_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, 7, err); }

/* Elementwise math (users' own layers: nn.ELU, x.exp(), x ** 2, x + 1.0):
 * the activations' ops, one infer per kind (kinds_of's ACT_MATH + k). */
static ps_status elu_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 0, err); }
static ps_status selu_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 1, err); }
static ps_status softplus_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 2, err); }
static ps_status mish_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 3, err); }
static ps_status logsigmoid_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 4, err); }
static ps_status exp_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 5, err); }
static ps_status log_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 6, err); }
static ps_status abs_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 7, err); }
static ps_status sqrt_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 8, err); }
static ps_status pow_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MATH + 9, err); }
static ps_status addconst_infer(ps_layer *ly, ps_err *err) {
    if (!isfinite(ly->a.value)) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "value: %g is not a finite number",
                                                  ly->a.value);
    return act_infer_as(ly, ACT_MATH + 10, err);
}

/* Shrinks and thresholds (nn.CELU, nn.Softsign, nn.Tanhshrink, nn.Hardshrink,
 * nn.Softshrink, nn.Threshold) and nn.RReLU in eval: the activations' ops,
 * one infer per kind (kinds_of's ACT_SHRINK + k). */
static ps_status celu_infer(ps_layer *ly, ps_err *err) {
    if ((float)ly->a.elu_alpha == 0.0f)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "alpha: 0 (CELU divides by alpha)");
    return act_infer_as(ly, ACT_SHRINK + 0, err);
}
static ps_status softsign_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_SHRINK + 1, err); }
static ps_status tanhshrink_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_SHRINK + 2, err); }
static ps_status hardshrink_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_SHRINK + 3, err); }
static ps_status softshrink_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_SHRINK + 4, err); }
static ps_status threshold_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_SHRINK + 5, err); }

/* torch.log1p, expm1, sin, cos (kinds_of's ACT_MORE + k), and a tensor
 * compared with a number (h > 0.5: Greater, Less, GreaterOrEqual,
 * LessOrEqual, value the number): 1 where it holds, else 0, as floats -
 * Where's condition; their gradient is zero (PyTorch's bool has none). */
static ps_status log1p_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MORE + 0, err); }
static ps_status erf_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MORE + 8, err); }
static ps_status sign_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MORE + 9, err); }
static ps_status expm1_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MORE + 1, err); }
static ps_status sin_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MORE + 2, err); }
static ps_status cos_infer(ps_layer *ly, ps_err *err) { return act_infer_as(ly, ACT_MORE + 3, err); }
static ps_status compare_infer(ps_layer *ly, int k, ps_err *err) {
    if (!isfinite((float)ly->a.value))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "value: %g is not a finite float32 number", ly->a.value);
    return act_infer_as(ly, ACT_MORE + 4 + k, err);
}
static ps_status gt_infer(ps_layer *ly, ps_err *err) { return compare_infer(ly, 0, err); }
static ps_status lt_infer(ps_layer *ly, ps_err *err) { return compare_infer(ly, 1, err); }
static ps_status ge_infer(ps_layer *ly, ps_err *err) { return compare_infer(ly, 2, err); }
static ps_status le_infer(ps_layer *ly, ps_err *err) { return compare_infer(ly, 3, err); }

/* nn.RReLU: in eval PyTorch's LeakyReLU with slope (lower + upper) / 2; in
 * training each element's slope is a uniform draw in [lower, upper)
 * (rrelu_draws: Dropout's stream and discipline, a replayed forward draws
 * the same), applied by prelu_forward with one slope per element and kept
 * in the tape for the backward (dx = dy where x > 0, else slope * dy). In
 * the plain layout, where the draws' order is the elements'. */
static ps_status rrelu_infer(ps_layer *ly, ps_err *err) {
    if (!(ly->a.rr_lower <= ly->a.rr_upper))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lower %g is above upper %g", ly->a.rr_lower,
                          ly->a.rr_upper);
    return act_infer_as(ly, ACT_SHRINK + 6, err);
}

static void rrelu_draws(const ps_layer *ly, ps_rng *rng, float *slope, int64_t n) {
    const float lo = (float)ly->a.rr_lower, span = (float)(ly->a.rr_upper - ly->a.rr_lower);
    ps_rng_uniforms(rng, slope, n);
    for (int64_t i = 0; i < n; i++) slope[i] = lo + slope[i] * span;
}

static const char *rrelu_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->act_forward && ops->act_backward && ops->prelu_forward && ops->prelu_backward
               ? NULL : "act_forward/act_backward/prelu_forward/prelu_backward";
}

/* the training forward's per-element slopes as prelu's (1, count, 1) */
static ps_status rrelu_desc(const ps_layer_call *c, ps_chan_desc *d, ps_err *err) {
    const int64_t count = ps_layer_out_count(c->ly, c->n);
    if (count > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "node %s: RReLU's training forward of %lld values: more "
                          "than %d", c->ly->name, (long long)count, INT32_MAX);
    const ps_chan_desc r = {1, (int)count, 1, PS_LAYOUT_PLAIN, 0.0f};
    *d = r;
    return PS_OK;
}

/* ---- PReLU: nn.PReLU(num_parameters, init), y = x > 0 ? x : w * x with a
 * learned slope w, one for every element (num_parameters 1) or one per
 * channel, dim 1 of the batched input (per-sample dim 0) as PyTorch's. One
 * slope runs in any layout; per-channel slopes in the plain one. PyTorch's
 * init (0.25) is the slopes' default; another is the node's init:
 * {weight: constant(v)} (the model file's init key). ---- */

static ps_status prelu_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = infer_same(ly, err);
    if (rc) return rc;
    const int64_t k = ly->a.num_parameters;
    if (k != 1 && (ly->in[0].ndim == 0 || ly->in[0].dims[0] != k))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "num_parameters: %lld, where the input has %lld channels "
                          "(dim 1): PReLU takes 1 or the channels", (long long)k,
                          ly->in[0].ndim ? (long long)ly->in[0].dims[0] : 1LL);
    if (k > 1) ly->flags &= ~(unsigned)PS_KIND_LAYOUT_KEEP;
    const int64_t dims[1] = {k};
    const ps_init init = {PS_INIT_CONST, 0.25, 0, 0};   /* PyTorch's init=0.25; a node's init: {weight: ...} */
    set_param(ly, 0, "weight", 1, dims, k, init);
    return PS_OK;
}

static ps_chan_desc prelu_desc(const ps_layer *ly, int n) {
    ps_chan_desc d = {n, 1, ps_shape_numel(&ly->in[0]), ly->in_layout[0], 0.0f};
    if (ly->a.num_parameters > 1) {
        d.c = (int)ly->a.num_parameters;
        d.s /= d.c;
    }
    return d;
}

static const char *prelu_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->prelu_forward && ops->prelu_backward ? NULL : "prelu_forward/prelu_backward";
}

static ps_status prelu_forward(ps_layer_call *c, ps_err *err) {
    const ps_chan_desc d = prelu_desc(c->ly, c->n);
    return c->be->ops->prelu_forward(c->be->impl, &d, c->x, c->w[0], c->y, err);
}

static ps_status prelu_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx && !c->dw[0]) return PS_OK;
    const ps_chan_desc d = prelu_desc(c->ly, c->n);
    return c->be->ops->prelu_backward(c->be->impl, &d, c->x, c->w[0], c->dy, c->dx, c->dw[0], err);
}

static ps_status hardtanh_infer(ps_layer *ly, ps_err *err) {
    /* as float32, the type the kernels compare in */
    if (!((float)ly->a.min_val < (float)ly->a.max_val))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "min_val %g is not below max_val %g", ly->a.min_val,
                          ly->a.max_val);
    return act_infer_as(ly, 5, err);
}

static ps_status relu6_infer(ps_layer *ly, ps_err *err) {
    ly->a.min_val = 0.0;
    ly->a.max_val = 6.0;
    return act_infer_as(ly, 5, err);
}

static const char *act_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->act_forward && ops->act_backward ? NULL : "act_forward/act_backward";
}

static ps_status act_forward(ps_layer_call *c, ps_err *err) {
    ps_act_desc d = act_desc(c->ly);
    return c->be->ops->act_forward(c->be->impl, &d, ps_layer_out_count(c->ly, c->n), c->x, c->y, err);
}

static ps_status act_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    ps_act_desc d = act_desc(c->ly);
    int rx = ps_act_backward_reads_x(d.kind);
    return c->be->ops->act_backward(c->be->impl, &d, ps_layer_out_count(c->ly, c->n), rx ? c->x : NULL,
                                    rx ? NULL : c->y, c->dy, c->dx, err);
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

/* n draws of a dropout mask into mask, each 0 or 1/(1-p) to keep: a
 * uniform of the stream below p drops (every one at p 1, StochasticDepth's
 * limit). The stream's values in order, drawn in one loop and then
 * compared in another (vectorised). */
static void drop_draws(const ps_layer *ly, ps_rng *rng, float *mask, int64_t n) {
    const float p = (float)ly->a.p, keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    ps_rng_uniforms(rng, mask, n);
    for (int64_t i = 0; i < n; i++) mask[i] = mask[i] < p ? 0.0f : keep;
}

/* A mask of count floats in the backend's memory, kept in the tape
 * (saved->dev[0]) for the backward: mask_begin allocates it and gives
 * *host, where the caller writes it (the mask itself on a host backend, a
 * staging buffer on a device); mask_end copies the staging buffer over and
 * frees it. */
static ps_status mask_begin(ps_layer_call *c, int64_t count, float **mask, float **host, const char *what,
                            ps_err *err) {
    *mask = ps_backend_alloc_floats(c->be, count);
    *host = !c->be->ops->device_kind ? *mask : malloc((size_t)(count ? count : 1) * sizeof(float));
    if (!*mask || !*host) {
        ps_backend_release(c->be, *mask);
        if (*host != *mask) free(*host);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", what);
    }
    c->saved->dev[0] = *mask;
    return PS_OK;
}

static ps_status mask_end(ps_layer_call *c, float *mask, float *host, int64_t count, ps_err *err) {
    if (host == mask) return PS_OK;
    ps_status rc = c->be->ops->copy_to_device(c->be->impl, mask, host, (size_t)count * sizeof(float), err);
    free(host);
    return rc;
}

/* Draw (or take) a mask of the output's size; group = elements sharing a draw. */
static ps_status dropout_run(ps_layer_call *c, int64_t group, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    int64_t count = ps_layer_out_count(c->ly, c->n);
    float *mask, *host;
    ps_status rc = mask_begin(c, count, &mask, &host, "dropout", err);
    if (rc) return rc;
    if (group == 1 && !c->mask) {
        drop_draws(c->ly, c->rng, host, count);
    } else {
        for (int64_t g = 0; g < count / group; g++) {
            float v;
            if (c->mask) v = c->mask[g];
            else drop_draws(c->ly, c->rng, &v, 1);
            for (int64_t i = 0; i < group; i++) host[g * group + i] = v;
        }
    }
    if ((rc = mask_end(c, mask, host, count, err)) != PS_OK) return rc;
    return ops->mul(c->be->impl, count, c->x, mask, c->y, err);
}

static ps_status dropout_forward(ps_layer_call *c, ps_err *err) { return dropout_run(c, 1, err); }

/* Dropout2d: one draw per (sample, channel), applied by mul_channels in
 * the layout the activation has (the mask is (n, C) whatever the layout). */
static ps_status dropout2d_forward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    ps_chan_desc d = bn_desc(c->ly, c->n);
    int64_t count = (int64_t)d.n * d.c;
    float *mask, *host;
    ps_status rc = mask_begin(c, count, &mask, &host, "dropout", err);
    if (rc) return rc;
    if (c->mask) memcpy(host, c->mask, (size_t)count * sizeof(float));
    else drop_draws(c->ly, c->rng, host, count);
    if ((rc = mask_end(c, mask, host, count, err)) != PS_OK) return rc;
    return ops->mul_channels(c->be->impl, &d, c->x, mask, c->y, err);
}

static ps_status dropout_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return c->be->ops->mul(c->be->impl, ps_layer_out_count(c->ly, c->n), c->dy, c->saved->dev[0], c->dx, err);
}

static ps_status dropout2d_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    ps_chan_desc d = bn_desc(c->ly, c->n);
    return c->be->ops->mul_channels(c->be->impl, &d, c->dy, c->saved->dev[0], c->dx, err);
}

static const char *dropout2d_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->mul_channels ? NULL : "mul_channels";
}

static size_t dropout2d_bytes(const ps_layer *ly, int n) { return (size_t)n * (size_t)ly->in[0].dims[0] * sizeof(float); }

static size_t dropout_bytes(const ps_layer *ly, int n) { return (size_t)ps_layer_out_count(ly, n) * sizeof(float); }

/* ---- RandnLike: torch.randn_like(x), standard normal noise of the input's
 * shape (the reparameterisation of a VAE, z = mu + eps * std). Drawn on
 * Dropout's stream with its discipline (a replayed training forward draws
 * the same; psd's batched forwards take each part's own draws), in eval
 * too, from the eval forward's stream, as PyTorch samples in eval. No
 * gradient reaches the input, which gives only the shape. ---- */

static void randn_draws(ps_rng *rng, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = normal01(rng);
}

static ps_status randn_infer(ps_layer *ly, ps_err *err) {
    if (ly->in_dtype[0] != PS_DTYPE_F32)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input is %s; RandnLike takes float32",
                          ps_dtype_name(ly->in_dtype[0]));
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *randn_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->fill ? NULL : "fill";
}

static ps_status randn_forward(ps_layer_call *c, ps_err *err) {
    int64_t count = ps_layer_out_count(c->ly, c->n);
    int dev = c->be->ops->device_kind != 0;
    float *host = dev ? malloc((size_t)(count ? count : 1) * sizeof(float)) : c->y;
    if (!host) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for randn_like's noise");
    if (c->mask) memcpy(host, c->mask, (size_t)count * sizeof(float));
    else randn_draws(c->rng, host, count);
    ps_status rc = dev ? c->be->ops->copy_to_device(c->be->impl, c->y, host, (size_t)count * sizeof(float), err)
                       : PS_OK;
    if (dev) free(host);
    return rc;
}

static ps_status randn_backward(ps_layer_call *c, ps_err *err) {
    return c->dx ? c->be->ops->fill(c->be->impl, ps_layer_in_count(c->ly, 0, c->n), c->dx, 0.0f, err) : PS_OK;
}

/* RReLU (rrelu_infer): eval the activations' LeakyReLU; training draws a
 * slope per element, kept in the tape */
static ps_status rrelu_forward(ps_layer_call *c, ps_err *err) {
    if (!c->train) return act_forward(c, err);
    ps_chan_desc d;
    ps_status rc = rrelu_desc(c, &d, err);
    if (rc) return rc;
    float *slope, *host;
    if ((rc = mask_begin(c, d.c, &slope, &host, "rrelu slopes", err)) != PS_OK) return rc;
    if (c->mask) memcpy(host, c->mask, (size_t)d.c * sizeof(float));
    else rrelu_draws(c->ly, c->rng, host, d.c);
    if ((rc = mask_end(c, slope, host, d.c, err)) != PS_OK) return rc;
    return c->be->ops->prelu_forward(c->be->impl, &d, c->x, slope, c->y, err);
}

static ps_status rrelu_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    if (!c->saved || !c->saved->dev[0]) return act_backward(c, err);
    ps_chan_desc d;
    ps_status rc = rrelu_desc(c, &d, err);
    if (rc) return rc;
    return c->be->ops->prelu_backward(c->be->impl, &d, c->x, c->saved->dev[0], c->dy, c->dx, NULL, err);
}

/* ---- AlphaDropout / FeatureAlphaDropout (SELU networks): nn.AlphaDropout(p)
 * keeps SELU's mean and variance. PyTorch's, with A = 1.7580993408473766
 * (SELU's scale * alpha) and a = ((1 - p) (1 + p A^2))^-1/2: kept values
 * a x + A a p, dropped ones -A a (1 - p); here y = m (x + A) - A a (1 - p)
 * with m = a on kept values, 0 on dropped ones, and dx = m dy. Dropout's
 * draws (drop_draws: one per element, or per (sample, channel) for
 * FeatureAlphaDropout, the channels dim 1 of (N, C, ...)), so a replayed
 * forward draws the same; the tape keeps m. p is below 1 (Dropout's
 * range), eval the identity. ---- */

#define ALPHA_DROP_ALPHA (-1.7580993408473766)   /* -A */

static double alpha_drop_a(double p) {
    return 1.0 / sqrt((1.0 - p) * (1.0 + p * ALPHA_DROP_ALPHA * ALPHA_DROP_ALPHA));
}

/* count draws (injected or drawn) into m: a where kept, 0 where dropped */
static void alpha_drop_mask(ps_layer_call *c, float *m, int64_t count) {
    const float a = (float)alpha_drop_a(c->ly->a.p);
    if (c->mask) memcpy(m, c->mask, (size_t)count * sizeof(float));
    else drop_draws(c->ly, c->rng, m, count);
    for (int64_t i = 0; i < count; i++) m[i] = m[i] != 0.0f ? a : 0.0f;
}

/* y = m (x + A) - A a (1 - p), m applied by mul or mul_channels */
static ps_status alpha_drop_apply(ps_layer_call *c, const float *mask, int channels, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    const double p = c->ly->a.p, a = alpha_drop_a(p);
    const int64_t count = ps_layer_out_count(c->ly, c->n);
    const ps_act_desc shift = {PS_ACT_LINEAR, 1.0f, (float)-ALPHA_DROP_ALPHA},
                      base = {PS_ACT_LINEAR, 1.0f, (float)(ALPHA_DROP_ALPHA * a * (1.0 - p))};
    ps_status rc = ops->act_forward(c->be->impl, &shift, count, c->x, c->y, err);
    if (rc) return rc;
    if (channels) {
        const ps_chan_desc d = bn_desc(c->ly, c->n);
        rc = ops->mul_channels(c->be->impl, &d, c->y, mask, c->y, err);
    } else {
        rc = ops->mul(c->be->impl, count, c->y, mask, c->y, err);
    }
    if (rc) return rc;
    return ops->act_forward(c->be->impl, &base, count, c->y, c->y, err);
}

static ps_status alpha_dropout_forward(ps_layer_call *c, ps_err *err) {
    const int64_t count = ps_layer_out_count(c->ly, c->n);
    float *mask, *host;
    ps_status rc = mask_begin(c, count, &mask, &host, "alpha dropout", err);
    if (rc) return rc;
    alpha_drop_mask(c, host, count);
    if ((rc = mask_end(c, mask, host, count, err)) != PS_OK) return rc;
    return alpha_drop_apply(c, mask, 0, err);
}

static ps_status feature_alpha_dropout_forward(ps_layer_call *c, ps_err *err) {
    const ps_chan_desc d = bn_desc(c->ly, c->n);
    const int64_t count = (int64_t)d.n * d.c;
    float *mask, *host;
    ps_status rc = mask_begin(c, count, &mask, &host, "alpha dropout", err);
    if (rc) return rc;
    alpha_drop_mask(c, host, count);
    if ((rc = mask_end(c, mask, host, count, err)) != PS_OK) return rc;
    return alpha_drop_apply(c, mask, 1, err);
}

static ps_status feature_alpha_dropout_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *alpha_dropout_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->act_forward ? NULL : "act_forward";
}

static const char *feature_alpha_dropout_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->act_forward && ops->mul_channels ? NULL : "act_forward/mul_channels";
}

/* ---- StochasticDepth: torchvision.ops.StochasticDepth(p, mode), a
 * residual branch dropped whole: per sample ('row') or for the whole
 * batch ('batch'), kept values scaled by 1/(1-p) (at p 1 every value is
 * dropped, as torchvision's), the identity in eval. Its draws are
 * Dropout's (drop_draws from the forward's stream: one per sample, or one
 * per forward), so a replayed forward draws the same; they are expanded
 * to an (n, C) mask that mul_channels applies in the activation's layout
 * (C the first per-sample dimension, 1 for a sample of one value) and the
 * tape keeps for the backward. ---- */

static ps_chan_desc sdepth_desc(const ps_layer *ly, int n) {
    if (ly->in[0].ndim == 0) {
        ps_chan_desc d = {n, 1, 1, PS_LAYOUT_PLAIN, 0.0f};
        return d;
    }
    return bn_desc(ly, n);
}

static ps_status sdepth_forward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    const ps_chan_desc d = sdepth_desc(c->ly, c->n);
    const int64_t count = (int64_t)d.n * d.c, draws = ps_layer_dropout_draws(c->ly, c->n);
    float *v = malloc((size_t)(draws ? draws : 1) * sizeof(float)), *mask, *host;
    if (!v) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for stochastic depth");
    ps_status rc = mask_begin(c, count, &mask, &host, "stochastic depth", err);
    if (rc) {
        free(v);
        return rc;
    }
    if (c->mask) memcpy(v, c->mask, (size_t)draws * sizeof(float));
    else drop_draws(c->ly, c->rng, v, draws);
    for (int64_t q = 0; q < count; q++) host[q] = v[c->ly->a.mode ? 0 : q / d.c];   /* batch: draw 0 for all */
    free(v);
    if ((rc = mask_end(c, mask, host, count, err)) != PS_OK) return rc;
    return ops->mul_channels(c->be->impl, &d, c->x, mask, c->y, err);
}

static ps_status sdepth_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    const ps_chan_desc d = sdepth_desc(c->ly, c->n);
    return c->be->ops->mul_channels(c->be->impl, &d, c->dy, c->saved->dev[0], c->dx, err);
}

static size_t sdepth_bytes(const ps_layer *ly, int n) {
    const ps_chan_desc d = sdepth_desc(ly, n);
    return (size_t)d.n * (size_t)d.c * sizeof(float);
}

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
    ly->outs = ly->in[0];
    ly->outs.dims[ly->outs.ndim - 1] = ly->a.out;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t wd[2] = {ly->a.out, in}, bd[1] = {ly->a.out};
    set_param(ly, 0, "weight", 2, wd, in, FAN_UNIFORM);
    if (ly->a.bias) set_param(ly, 1, "bias", 1, bd, in, FAN_UNIFORM);
    return PS_OK;
}

static ps_status linear_forward(ps_layer_call *c, ps_err *err) {
    if (c->ly->a.wn) return wn_forward(c, linear_forward, err);
    ps_linear_desc d = linear_desc(c->ly, c->n);
    return c->be->ops->linear_forward(c->be->impl, &d, c->x, c->w[0], c->ly->a.bias ? c->w[1] : NULL, c->y, err);
}

static ps_status linear_backward(ps_layer_call *c, ps_err *err) {
    if (c->ly->a.wn) return wn_backward(c, linear_backward, err);
    ps_linear_desc d = linear_desc(c->ly, c->n);
    return c->be->ops->linear_backward(c->be->impl, &d, c->x, c->w[0], c->dy, c->dx, c->dw[0],
                                       c->ly->a.bias ? c->dw[1] : NULL, err);
}

static double linear_flops(const ps_layer *ly) { return 2.0 * (double)ps_shape_numel(&ly->outs) * (double)ps_shape_last(&ly->in[0]); }

/* ---- Bilinear: nn.Bilinear, y = x1^T W x2 + b per row: x1 (..., I) and
 * x2 (..., J) with the same leading dims, W (O, I, J), b (O). Computed as
 * Z = the outer products x1 x2^T of the rows (a batched matmul of (I, 1)
 * by (1, J)), then Linear's y = Z W^T + b with W read as (O, I*J); the
 * training tape keeps Z for the backward: Linear's backward gives dZ, dW
 * and db, then dx1 = dZ x2 and dx2 = x1^T dZ row by row (two batched
 * matmuls). ---- */

typedef struct bil_geom {
    int64_t rows;   /* n times the leading dims */
    int i, j, o;
} bil_geom;

static bil_geom bil_of(const ps_layer *ly, int n) {
    bil_geom g = {n, (int)ps_shape_last(&ly->in[0]), (int)ps_shape_last(&ly->in[1]), (int)ly->a.out};
    for (int d = 0; d + 1 < ly->in[0].ndim; d++) g.rows *= ly->in[0].dims[d];
    return g;
}

static ps_status bilinear_infer(ps_layer *ly, ps_err *err) {
    char b0[64], b1[64];
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (!rc) rc = need_ndim(ly, 1, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    int same = ly->in[0].ndim == ly->in[1].ndim;
    for (int d = 0; same && d + 1 < ly->in[0].ndim; d++) same = ly->in[0].dims[d] == ly->in[1].dims[d];
    if (!same)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s and %s: Bilinear takes two of the same leading "
                          "dims (only the last may differ)", ps_shape_format(&ly->in[0], b0, sizeof b0),
                          ps_shape_format(&ly->in[1], b1, sizeof b1));
    int64_t i = ps_shape_last(&ly->in[0]), j = ps_shape_last(&ly->in[1]);
    if ((rc = check_given("in1_features", ly->a.in_features, i, err)) ||
        (rc = check_given("in2_features", ly->a.in2_features, j, err)))
        return rc;
    if (i * j > (int64_t)1 << 24)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "in1_features x in2_features is %lld: psd's Bilinear takes "
                          "at most 2^24", (long long)(i * j));
    ly->outs = ly->in[0];
    ly->outs.dims[ly->outs.ndim - 1] = ly->a.out;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t wd[3] = {ly->a.out, i, j}, bd[1] = {ly->a.out};
    set_param(ly, 0, "weight", 3, wd, i, FAN_UNIFORM);   /* PyTorch's U(+-1/sqrt(in1_features)) for both */
    if (ly->a.bias) set_param(ly, 1, "bias", 1, bd, i, FAN_UNIFORM);
    return PS_OK;
}

static const char *bilinear_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->matmul && ops->linear_forward && ops->linear_backward ? NULL
                                                                      : "matmul/linear_forward/linear_backward";
}

static ps_status bilinear_forward(ps_layer_call *c, ps_err *err) {
    const bil_geom g = bil_of(c->ly, c->n);
    float *z = ps_backend_alloc_floats(c->be, g.rows * g.i * g.j);
    if (!z) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for Bilinear's outer products");
    const ps_matmul_desc outer = {.batch = g.rows, .m = g.i, .n = g.j, .k = 1};
    ps_status rc = c->be->ops->matmul(c->be->impl, &outer, c->xs[0], c->xs[1], z, err);
    const ps_linear_desc ld = {(int)g.rows, g.i * g.j, g.o};
    if (rc == PS_OK)
        rc = c->be->ops->linear_forward(c->be->impl, &ld, z, c->w[0], c->ly->a.bias ? c->w[1] : NULL, c->y, err);
    if (rc == PS_OK && c->train) {   /* kept for the backward */
        ps_backend_release(c->be, c->saved->dev[0]);
        c->saved->dev[0] = z;
    } else {
        ps_backend_release(c->be, z);
    }
    return rc;
}

static ps_status bilinear_backward(ps_layer_call *c, ps_err *err) {
    const bil_geom g = bil_of(c->ly, c->n);
    const float *z = c->saved->dev[0];
    if (!z) return ps_err_set(err, PS_ERR_INTERNAL, "Bilinear's backward without its forward's products");
    const int inputs = c->dxs[0] || c->dxs[1];
    float *dz = inputs ? ps_backend_alloc_floats(c->be, g.rows * g.i * g.j) : NULL;
    if (inputs && !dz) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for Bilinear's gradient");
    const ps_linear_desc ld = {(int)g.rows, g.i * g.j, g.o};
    ps_status rc = c->be->ops->linear_backward(c->be->impl, &ld, z, c->w[0], c->dy, dz, c->dw[0],
                                               c->ly->a.bias ? c->dw[1] : NULL, err);
    if (rc == PS_OK && c->dxs[0]) {   /* dx1 (I, 1) = dZ (I, J) . x2^T, x2 stored (1, J) */
        const ps_matmul_desc d1 = {.batch = g.rows, .m = g.i, .n = 1, .k = g.j, .trans_b = 1};
        rc = c->be->ops->matmul(c->be->impl, &d1, dz, c->xs[1], c->dxs[0], err);
    }
    if (rc == PS_OK && c->dxs[1]) {   /* dx2 (1, J) = x1 (1, I) . dZ (I, J) */
        const ps_matmul_desc d2 = {.batch = g.rows, .m = 1, .n = g.j, .k = g.i};
        rc = c->be->ops->matmul(c->be->impl, &d2, c->xs[0], dz, c->dxs[1], err);
    }
    ps_backend_release(c->be, dz);
    return rc;
}

static size_t bilinear_bytes(const ps_layer *ly, int n) {
    const bil_geom g = bil_of(ly, n);
    return (size_t)g.rows * (size_t)g.i * (size_t)g.j * sizeof(float);
}

static double bilinear_flops(const ps_layer *ly) {
    const bil_geom g = bil_of(ly, 1);
    return (double)g.rows * g.i * g.j * (2.0 * g.o + 1.0);
}

/* ---- LogSoftmax and Softmax over dim: the row-wise ops when dim is
 * the last one that is not 1, the strided op otherwise ---- */

static ps_status softmax_infer(ps_layer *ly, ps_err *err) {
    int d;
    ps_status rc = need_dim_attr(ly, &d, err);
    if (rc) return rc;
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* The input as (outer, dim, inner) around the softmax dimension. */
static ps_softmax_desc sm_desc(const ps_layer *ly, int n, int log) {
    int d = sample_dim(ly->a.dim, ly->in[0].ndim);
    ps_softmax_desc s = {n, (int)ly->in[0].dims[d], 1, log};
    for (int k = 0; k < d; k++) s.outer *= ly->in[0].dims[k];
    for (int k = d + 1; k < ly->in[0].ndim; k++) s.inner *= ly->in[0].dims[k];
    return s;
}

static const char *sm_missing(const ps_layer *ly, const ps_backend_ops *ops, int log) {
    ps_softmax_desc s = sm_desc(ly, 1, log);
    if (s.inner > 1) return ops->softmax_dim_forward && ops->softmax_dim_backward ? NULL : "softmax_dim_forward/backward";
    if (log) return NULL;
    return ops->softmax_forward && ops->softmax_backward ? NULL : "softmax_forward/softmax_backward";
}
static const char *softmax_missing(const ps_layer *ly, const ps_backend_ops *ops) { return sm_missing(ly, ops, 0); }
static const char *log_softmax_missing(const ps_layer *ly, const ps_backend_ops *ops) { return sm_missing(ly, ops, 1); }

static ps_status sm_forward(ps_layer_call *c, int log, ps_err *err) {
    ps_softmax_desc s = sm_desc(c->ly, c->n, log);
    const ps_backend_ops *ops = c->be->ops;
    if (s.inner > 1) return ops->softmax_dim_forward(c->be->impl, &s, c->x, c->y, err);
    if (log) return ops->log_softmax_forward(c->be->impl, (int)s.outer, s.dim, c->x, c->y, err);
    return ops->softmax_forward(c->be->impl, s.outer, s.dim, c->x, c->y, err);
}

static ps_status sm_backward(ps_layer_call *c, int log, ps_err *err) {
    if (!c->dx) return PS_OK;
    ps_softmax_desc s = sm_desc(c->ly, c->n, log);
    const ps_backend_ops *ops = c->be->ops;
    if (s.inner > 1) return ops->softmax_dim_backward(c->be->impl, &s, c->y, c->dy, c->dx, err);
    if (log) return ops->log_softmax_backward(c->be->impl, (int)s.outer, s.dim, c->y, c->dy, c->dx, err);
    return ops->softmax_backward(c->be->impl, s.outer, s.dim, c->y, c->dy, c->dx, err);
}

static ps_status log_softmax_forward(ps_layer_call *c, ps_err *err) { return sm_forward(c, 1, err); }
static ps_status log_softmax_backward(ps_layer_call *c, ps_err *err) { return sm_backward(c, 1, err); }
static ps_status softmax_forward(ps_layer_call *c, ps_err *err) { return sm_forward(c, 0, err); }
static ps_status softmax_backward(ps_layer_call *c, ps_err *err) { return sm_backward(c, 0, err); }

/* ---- Embedding: nn.Embedding(num_embeddings, embedding_dim); int64 ids
 * in, rows out. The weight's gradient is row-sparse: the unique ids of the
 * batch and the sum of the output gradients of each (a scatter-add).
 * With ids_start it reads a slice of each sample's flat ids (a model of
 * several id inputs, joined): ids_start .. ids_start + numel(ids_shape) - 1,
 * viewed as ids_shape; only that slice is checked and read. ---- */

/* The ids a sample of the node reads: the slice's, or the whole input's. */
static int64_t emb_ids_per_sample(const ps_layer *ly) {
    if (!ly->a.ids_sliced) return ps_shape_numel(&ly->in[0]);
    int64_t k = 1;
    for (int i = 0; i < ly->a.ids_ndims; i++) k *= ly->a.ids_dims[i];
    return k;
}

/* A mixed input (int64 ids and float32 features, joined as one float32
 * input) carries its ids as float32 values: exact integers below 2^24
 * (EMB_F32_IDS), read only by an Embedding of a slice. */
#define EMB_F32_IDS 16777216.0f

static int emb_f32_ids(const ps_layer *ly) { return ly->in_dtype[0] == PS_DTYPE_F32; }

/* v is such an id: an exact integer in 0..2^24 - 1 */
static int emb_f32_is_id(float v) { return v >= 0.0f && v < EMB_F32_IDS && v == floorf(v); }

static ps_status emb_infer(ps_layer *ly, ps_err *err) {
    if (emb_f32_ids(ly) && !ly->a.ids_sliced)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "its input is float32: an Embedding reads int64 ids, or "
                          "float32 ids only in a slice (ids_start) of a mixed input of ids and features");
    ps_status rc = need_ndim(ly, 0, 0, ly->a.ids_sliced ? PS_SHAPE_MAX_DIMS : PS_SHAPE_MAX_DIMS - 1,
                             emb_f32_ids(ly) ? PS_DTYPE_F32 : PS_DTYPE_I64, err);
    if (rc) return rc;
    if (ly->a.ids_sliced) {
        char b[64];
        int64_t k = 1, per = ps_shape_numel(&ly->in[0]);
        if (ly->a.ids_ndims > PS_SHAPE_MAX_DIMS - 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ids_shape has %d dimensions; it takes at most %d (the "
                              "rows add one)", ly->a.ids_ndims, PS_SHAPE_MAX_DIMS - 1);
        for (int i = 0; i < ly->a.ids_ndims; i++) k = sat_mul(k, ly->a.ids_dims[i]);
        if (ly->a.ids_start + k > per)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ids_start %lld and ids_shape (%lld ids) read past the "
                              "%lld ids of each sample (input %s)", (long long)ly->a.ids_start, (long long)k,
                              (long long)per, ps_shape_format(&ly->in[0], b, sizeof b));
    } else if (ly->a.ids_ndims) {
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ids_shape without ids_start (the slice's first id)");
    }
    if (ly->a.num > INT32_MAX || ly->a.out > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "num_embeddings and embedding_dim are at most %d", INT32_MAX);
    int64_t rows = ly->row_total ? ly->row_total : ly->a.num;   /* the whole table's, for a shard too */
    if (ly->a.pad_given) {
        if (ly->a.padding_idx < -rows || ly->a.padding_idx >= rows)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "padding_idx %lld is not a row of the %lld-row table "
                              "(-%lld..%lld, as nn.Embedding's)", (long long)ly->a.padding_idx, (long long)rows,
                              (long long)rows, (long long)rows - 1);
        if (ly->a.padding_idx < 0) ly->a.padding_idx += rows;
    }
    ly->outs = ly->in[0];
    if (ly->a.ids_sliced) {
        ly->outs.ndim = ly->a.ids_ndims;
        for (int i = 0; i < ly->a.ids_ndims; i++) ly->outs.dims[i] = ly->a.ids_dims[i];
    }
    ly->outs.dims[ly->outs.ndim++] = ly->a.out;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t wd[2] = {ly->a.num, ly->a.out};
    set_param(ly, 0, "weight", 2, wd, ly->a.out, NORMAL01);
    ly->param[0].sparse = 1;
    return PS_OK;
}

static const char *emb_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    if (emb_f32_ids(ly) && !ops->fill) return "fill";
    return ops->embedding_forward && ops->embedding_backward ? NULL : "embedding_forward/embedding_backward";
}

/* Sliced: only the slice's ids are checked (the others are not read by this
 * node; psd's other kinds do not read int64 ids). */
static ps_status emb_check(const ps_layer *ly, const void *host_x, int64_t count, ps_err *err) {
    const int64_t *ids = host_x;
    const float *fids = host_x;           /* a mixed input's float32 ids */
    int64_t lo = ly->row_lo, hi = ly->row_lo + ly->a.num;
    int64_t per = ps_shape_numel(&ly->in[0]), k = emb_ids_per_sample(ly);
    int64_t n = ly->a.ids_sliced ? (per ? count / per : 0) * k : count;
    for (int64_t j = 0; j < n; j++) {
        int64_t i = ly->a.ids_sliced ? j / k * per + ly->a.ids_start + j % k : j;
        if (emb_f32_ids(ly)) {
            float v = fids[i];
            if (!emb_f32_is_id(v))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input[%lld][%lld] = %.9g (id %lld of %s's slice "
                                  "ids_start %lld) is not an id: the float32 input carries ids as exact integers "
                                  "0..16777215 (2^24 - 1)", (long long)(i / per), (long long)(i % per), (double)v,
                                  (long long)(j % k), ly->name, (long long)ly->a.ids_start);
            if ((int64_t)v >= lo && (int64_t)v < hi) continue;
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input[%lld][%lld] = %lld (id %lld of %s's slice "
                              "ids_start %lld) is not a row of %s.weight (%lld..%lld)", (long long)(i / per),
                              (long long)(i % per), (long long)v, (long long)(j % k), ly->name,
                              (long long)ly->a.ids_start, ly->name, (long long)lo, (long long)(hi - 1));
        }
        if (ids[i] >= lo && ids[i] < hi) continue;
        if (ly->a.ids_sliced)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input[%lld][%lld] = %lld (id %lld of %s's slice "
                              "ids_start %lld) is not a row of %s.weight (%lld..%lld)", (long long)(i / per),
                              (long long)(i % per), (long long)ids[i], (long long)(j % k), ly->name,
                              (long long)ly->a.ids_start, ly->name, (long long)lo, (long long)(hi - 1));
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

/* The c->n * emb_ids_per_sample ids the node reads, as rows of its table
 * (a shard's global ids as local rows; a slice gathered), in a new host
 * buffer (*out, the caller frees it). */
static ps_status emb_host_ids(const ps_layer_call *c, int64_t **out, ps_err *err) {
    const ps_layer *ly = c->ly;
    ps_status rc;
    *out = NULL;
    int64_t per = ps_shape_numel(&ly->in[0]), k = emb_ids_per_sample(ly);
    int f32 = emb_f32_ids(ly);            /* a mixed input's float32 ids (a slice: emb_infer) */
    size_t xb = (size_t)(c->n * per) * (f32 ? sizeof(float) : sizeof(int64_t));
    size_t ib = (size_t)(c->n * k) * sizeof(int64_t);
    int64_t *x = malloc(xb ? xb : 8), *h = ly->a.ids_sliced ? malloc(ib ? ib : 8) : x;
    if (!x || !h) {
        if (h != x) free(h);
        free(x);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's ids", ly->name);
    }
    if ((rc = c->be->ops->copy_to_host(c->be->impl, x, c->x, xb, err)) != PS_OK) {
        if (h != x) free(h);
        free(x);
        return rc;
    }
    if (f32) {   /* checked as the stage's input (emb_check); a computed slice is checked here */
        const float *fx = (const float *)x;
        for (int64_t s = 0; s < c->n; s++)
            for (int64_t j = 0; j < k; j++) {
                float v = fx[s * per + ly->a.ids_start + j];
                if (!emb_f32_is_id(v) || (int64_t)v < ly->row_lo || (int64_t)v >= ly->row_lo + ly->a.num) {
                    free(h);
                    free(x);
                    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: id %.9g of sample %lld is not a row of "
                                      "%s.weight (%lld..%lld)", ly->name, (double)v, (long long)s, ly->name,
                                      (long long)ly->row_lo, (long long)(ly->row_lo + ly->a.num - 1));
                }
                h[s * k + j] = (int64_t)v;
            }
        free(x);
    } else if (h != x) {
        for (int64_t s = 0; s < c->n; s++) memcpy(h + s * k, x + s * per + ly->a.ids_start, (size_t)k * sizeof *h);
        free(x);
    }
    for (int64_t i = 0; i < c->n * k; i++) h[i] -= ly->row_lo;
    *out = h;
    return PS_OK;
}

/* emb_host_ids in a new buffer of c->be's device; NULL on failure (err set). */
static int64_t *emb_local_ids(const ps_layer_call *c, int64_t n, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    size_t ib = (size_t)n * sizeof(int64_t);
    int64_t *h = NULL, *d = NULL;
    ps_status rc = emb_host_ids(c, &h, err);
    if (rc == PS_OK && !(d = ops->alloc(c->be->impl, ib ? ib : 8)))
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's ids", c->ly->name);
    if (rc == PS_OK) rc = ops->copy_to_device(c->be->impl, d, h, ib, err);
    free(h);
    if (rc != PS_OK) { ps_backend_release(c->be, d); return NULL; }
    return d;
}

static ps_status emb_forward(ps_layer_call *c, ps_err *err) {
    int64_t n = c->n * emb_ids_per_sample(c->ly);
    int dim = (int)c->ly->a.out;
    if (!c->ly->row_lo && !c->ly->a.ids_sliced)
        return c->be->ops->embedding_forward(c->be->impl, n, dim, c->x, c->w[0], c->y, err);
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
    int64_t n = c->n * emb_ids_per_sample(c->ly);
    int dim = (int)c->ly->a.out;
    size_t ib = (size_t)n * sizeof(int64_t);
    int64_t *ids = NULL;
    ps_status rc = emb_host_ids(c, &ids, err);   /* a shard's local rows; a slice's */
    int64_t *sorted = malloc(ib ? ib : 8), *slot = malloc(ib ? ib : 8);
    int64_t *dslot = ops->alloc(impl, ib ? ib : 8);
    float *dgrows = NULL;
    ps_rows r = {0};
    if (rc != PS_OK) goto done;
    if (!sorted || !slot || !dslot) goto oom;
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
    if (c->ly->a.pad_given) {   /* padding_idx's row gets no gradient (nn.Embedding's): left out of the rows */
        int64_t pad = c->ly->a.padding_idx - c->ly->row_lo;
        const int64_t *p = bsearch(&pad, r.rows, (size_t)r.nrows, sizeof *r.rows, cmp_i64);
        if (p) {
            int64_t k = p - r.rows;
            memmove(r.rows + k, r.rows + k + 1, (size_t)(r.nrows - k - 1) * sizeof(int64_t));
            memmove(r.grad + k * dim, r.grad + (k + 1) * dim, (size_t)(r.nrows - k - 1) * dim * sizeof(float));
            r.nrows--;
        }
    }
    ps_rows_clear(c->rows);
    *c->rows = r;
    memset(&r, 0, sizeof r);
    if (c->dx)   /* a mixed float32 input's gradient: none through ids (zeros; the features' Narrows add theirs) */
        rc = ops->fill(impl, ps_layer_in_count(c->ly, 0, c->n), c->dx, 0.0f, err);
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
 * (trainer/lstm.h), which pulls the weights and pushes their gradients
 * (PushGradients). A stage of LSTM nodes is parameter-only: Forward and
 * Backward on it are refused. ---- */

#define LSTM_MAX_LAYERS 4
_Static_assert(LSTM_MAX_LAYERS * 2 * 4 <= PS_LAYER_MAX_PARAMS, "a bidirectional 4-layer LSTM's 32 parameters");
/* PyTorch's names per layer and direction (the reverse direction's end in _reverse) */
static const char *const rnn_suffix[LSTM_MAX_LAYERS][2][4] = {
#define RNN_SUFFIXES(l) {{"weight_ih_l" #l, "weight_hh_l" #l, "bias_ih_l" #l, "bias_hh_l" #l}, \
                         {"weight_ih_l" #l "_reverse", "weight_hh_l" #l "_reverse", "bias_ih_l" #l "_reverse", \
                          "bias_hh_l" #l "_reverse"}}
    RNN_SUFFIXES(0), RNN_SUFFIXES(1), RNN_SUFFIXES(2), RNN_SUFFIXES(3),
#undef RNN_SUFFIXES
};
#define lstm_suffix(l, k) rnn_suffix[l][0][k]

static ps_status rnn_infer(ps_layer *ly, ps_err *err);

static ps_status lstm_infer(ps_layer *ly, ps_err *err) {
    if (ly->in[0].ndim == 2) return rnn_infer(ly, err);   /* (L, input_size): psd runs it (below) */
    ps_status rc = need_ndim(ly, 0, 1, 1, PS_DTYPE_F32, err);
    if (rc) return rc;
    int64_t in = ly->in[0].dims[0], H = ly->a.out;
    if ((rc = check_given("input_size", ly->a.in_features, in, err))) return rc;
    if (ly->a.num > LSTM_MAX_LAYERS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "num_layers %lld: at most %d", (long long)ly->a.num,
                          LSTM_MAX_LAYERS);
    if (!ly->a.bias || ly->a.bidirectional)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: the trainer's LSTM (a per-step input of one "
                          "dimension) has biases and one direction", !ly->a.bias ? "bias: false" : "bidirectional");
    ly->flags = PS_KIND_PARAMS_ONLY;   /* held for the trainer: never forwarded */
    ly->outs = ly->in[0];
    ly->outs.dims[0] = H;
    ly->out_dtype = PS_DTYPE_F32;
    ps_init u = {PS_INIT_UNIFORM, 0, 0, 1};
    for (int l = 0; l < ly->a.num; l++) {
        int64_t wi[2] = {4 * H, l ? H : in}, wh[2] = {4 * H, H}, b[1] = {4 * H};
        set_param(ly, 4 * l + 0, lstm_suffix(l, 0), 2, wi, H, u);
        set_param(ly, 4 * l + 1, lstm_suffix(l, 1), 2, wh, H, u);
        set_param(ly, 4 * l + 2, lstm_suffix(l, 2), 1, b, H, u);
        set_param(ly, 4 * l + 3, lstm_suffix(l, 3), 1, b, H, u);
    }
    return PS_OK;
}

static ps_status lstm_refuse(ps_layer_call *c, ps_err *err) {
    return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "LSTM %s: psd holds this LSTM's parameters only; the LSTM "
                      "runs on the trainer (pull them with GetParameters, push their gradients with "
                      "PushGradients)", c->ly->name);
}

/* ---- LSTM and GRU run by psd: nn.LSTM / nn.GRU(input_size, hidden_size,
 * num_layers, bias, batch_first=True, dropout, bidirectional) over each
 * sample's (L, input_size) sequence, zero initial state, the output (L, D*H)
 * the last layer's h_t of every step (PyTorch's `out` of `out, _ =
 * rnn(x)`; D = 2 directions when bidirectional, the forward one's h_t then
 * the reverse one's, as PyTorch concatenates them). PyTorch's parameters
 * per layer k and direction: weight_ih_l<k> (G*H, in), weight_hh_l<k> (G*H,
 * H), bias_ih_l<k>, bias_hh_l<k> (G*H; without bias: none), the reverse
 * direction's the same names ending in _reverse, after the forward one's;
 * in is input_size for layer 0, D*H above (both directions of the layer
 * below). Gates in PyTorch's order (LSTM i, f, g, o: G = 4; GRU r, z, n: G
 * = 3, n = tanh(W_in x + b_in + r * (W_hn h + b_hn))), all U(-1/sqrt(H),
 * 1/sqrt(H)). In training, dropout between layers (not after the last) as
 * nn.LSTM's: a mask (num_layers - 1, L, n, D*H), time-major, drawn per
 * element like Dropout's.
 *
 * Computed time-major: the input permuted to (L, n, in), each layer and
 * direction's input projection for all steps one linear_forward, then per
 * step the recurrent linear_forward (h_{t-1} W_hh^T + b_hh) and the
 * backend's rnn_cell_forward (the gates); the reverse direction runs the
 * steps from L-1 down to 0. The backward runs each direction's steps the
 * other way round with rnn_cell_backward and one linear_backward per step
 * for d h_{t-1}, then the weight gradients of all steps in two
 * linear_backwards per layer and direction. The tape (saved->dev[1], one
 * block) keeps the permuted input, per layer and direction the hidden states
 * ((L+1, n, H): the forward direction's h_0 = 0 first, h_t at t; the
 * reverse one's h_t at t and its zero start at L), the cell states (LSTM,
 * likewise), the step's gate values (L, n, 4H; ps_rnn_cell_desc), per layer
 * of two directions the joined output (L, n, 2H), and the dropped-out
 * input of the layer above; dev[0] the dropout mask. ---- */

typedef struct rnn_geom {
    int gru, layers, bias, drop, D;
    int64_t n, L, I, H, G;
    int64_t off_x0;                         /* the permuted input (L, n, I) */
    int64_t off_h[LSTM_MAX_LAYERS][2];      /* (L+1, n, H) per direction */
    int64_t off_c[LSTM_MAX_LAYERS][2];      /* (L+1, n, H), LSTM */
    int64_t off_a[LSTM_MAX_LAYERS][2];      /* (L, n, 4H) */
    int64_t off_y[LSTM_MAX_LAYERS];         /* the two directions joined (L, n, 2H), D = 2 */
    int64_t off_xd[LSTM_MAX_LAYERS];        /* layer k's input after dropout (L, n, D*H), k >= 1 with dropout */
    int64_t saved;                          /* floats of the block */
} rnn_geom;

static rnn_geom rnn_of(const ps_layer *ly, int n, int train) {
    rnn_geom g = {0};
    g.gru = !strcmp(ly->kind->name, "GRU");
    g.layers = (int)ly->a.num;
    g.bias = ly->a.bias;
    g.drop = train && ly->a.p > 0 && g.layers > 1;
    g.D = ly->a.bidirectional ? 2 : 1;
    g.n = n;
    g.L = ly->in[0].dims[0];
    g.I = ly->in[0].dims[1];
    g.H = ly->a.out;
    g.G = g.gru ? 3 : 4;
    int64_t o = 0, nh = g.n * g.H;
    g.off_x0 = o, o += g.L * g.n * g.I;
    for (int l = 0; l < g.layers; l++) {
        for (int d = 0; d < g.D; d++) {
            g.off_h[l][d] = o, o += (g.L + 1) * nh;
            g.off_c[l][d] = o, o += g.gru ? 0 : (g.L + 1) * nh;
            g.off_a[l][d] = o, o += g.L * 4 * nh;
        }
        g.off_y[l] = o, o += g.D == 2 ? g.L * 2 * nh : 0;
        g.off_xd[l] = o, o += l && g.drop ? g.L * g.D * nh : 0;
    }
    g.saved = o;
    return g;
}

/* Parameter indices of layer l, direction d: weight_ih, weight_hh, bias_ih, bias_hh (-1 without bias). */
static int rnn_pi(const rnn_geom *g, int l, int d, int k) {
    const int per = g->bias ? 4 : 2;
    return k < 2 || g->bias ? (l * g->D + d) * per + k : -1;
}

/* Layer l's output (L, n, D*H) in the tape: the forward h_1..h_L, or both directions joined. */
static float *rnn_layer_out(const rnn_geom *g, float *S, int l) {
    return g->D == 2 ? S + g->off_y[l] : S + g->off_h[l][0] + g->n * g->H;
}

/* Step t of direction d reads state slot rnn_prev and writes rnn_next (forward: t, t+1; reverse: t+1, t). */
static int64_t rnn_prev(int d, int64_t t) { return d ? t + 1 : t; }
static int64_t rnn_next(int d, int64_t t) { return d ? t : t + 1; }

static ps_status rnn_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 2, 2, PS_DTYPE_F32, err);
    if (rc) return rc;
    const int gru = !strcmp(ly->kind->name, "GRU"), D = ly->a.bidirectional ? 2 : 1;
    const int64_t L = ly->in[0].dims[0], in = ly->in[0].dims[1], H = ly->a.out, G = gru ? 3 : 4;
    if ((rc = check_given("input_size", ly->a.in_features, in, err))) return rc;
    if (ly->a.num > LSTM_MAX_LAYERS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "num_layers %lld: at most %d", (long long)ly->a.num,
                          LSTM_MAX_LAYERS);
    if (!ly->a.mode)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "batch_first is false: psd's batch is the first dimension, "
                          "so the input must be (N, L, input_size) (batch_first: true)");
    if (L > 1000000 || H > 65536 || in > 65536)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "a sequence longer than 1000000 or a size over 65536");
    ly->flags = ly->kind->flags & ~(unsigned)PS_KIND_PARAMS_ONLY;
    ly->outs = ly->in[0];
    ly->outs.dims[1] = D * H;
    ly->out_dtype = PS_DTYPE_F32;
    ps_init u = {PS_INIT_UNIFORM, 0, 0, 1};
    int j = 0;
    for (int l = 0; l < ly->a.num; l++) {
        for (int d = 0; d < D; d++) {
            int64_t wi[2] = {G * H, l ? D * H : in}, wh[2] = {G * H, H}, b[1] = {G * H};
            set_param(ly, j++, rnn_suffix[l][d][0], 2, wi, H, u);
            set_param(ly, j++, rnn_suffix[l][d][1], 2, wh, H, u);
            if (!ly->a.bias) continue;
            set_param(ly, j++, rnn_suffix[l][d][2], 1, b, H, u);
            set_param(ly, j++, rnn_suffix[l][d][3], 1, b, H, u);
        }
    }
    return PS_OK;
}

static const char *rnn_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    if (ly->flags & PS_KIND_PARAMS_ONLY) return NULL;
    return ops->rnn_cell_forward && ops->rnn_cell_backward && ops->permute && ops->fill && ops->add && ops->add_out
                   && ops->mul && ops->copy2d
               ? NULL
               : "rnn_cell_forward/rnn_cell_backward, permute, fill, add, add_out, mul, copy2d";
}

/* (a, b, c) -> (b, a, c): the batch and time axes swapped. */
static ps_status rnn_swap(const ps_layer_call *c, int64_t a, int64_t b, int64_t k, const float *x, float *y,
                          ps_err *err) {
    const ps_permute_desc d = {1, 3, {a, b, k, 1}, {1, 0, 2, 3}};
    return c->be->ops->permute(c->be->impl, &d, x, y, err);
}

/* The GEMMs' rows (ps_linear_desc's int n): a call's steps times samples. */
static ps_status rnn_check_rows(const ps_layer_call *c, ps_err *err) {
    const int64_t rows = c->ly->in[0].dims[0] * c->n;
    if (rows > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: %lld steps x %d samples in one call: at most %d",
                          c->ly->name, (long long)c->ly->in[0].dims[0], c->n, INT32_MAX);
    return PS_OK;
}

static ps_status rnn_forward(ps_layer_call *c, ps_err *err) {
    if (c->ly->flags & PS_KIND_PARAMS_ONLY) return lstm_refuse(c, err);
    ps_status crc = rnn_check_rows(c, err);
    if (crc) return crc;
    const ps_backend_ops *ops = c->be->ops;
    void *im = c->be->impl;
    const rnn_geom g = rnn_of(c->ly, c->n, c->train);
    const int64_t nh = g.n * g.H, ng = g.n * g.G * g.H, DH = g.D * g.H;
    const ps_rnn_cell_desc cd = {g.gru, g.n, g.H};
    float *S = ps_backend_alloc_floats(c->be, g.saved), *gx = ps_backend_alloc_floats(c->be, g.L * ng + ng);
    float *mask = NULL, *host = NULL;
    ps_status rc = PS_OK;
    if (!S || !gx) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", c->ly->name);
        goto out;
    }
    if (g.drop) {
        const int64_t count = (int64_t)(g.layers - 1) * g.L * g.D * nh;
        if ((rc = mask_begin(c, count, &mask, &host, "dropout", err)) != PS_OK) goto out;
        if (c->mask) memcpy(host, c->mask, (size_t)count * sizeof(float));
        else drop_draws(c->ly, c->rng, host, count);
        if ((rc = mask_end(c, mask, host, count, err)) != PS_OK) goto out;
    }
    float *gh = gx + g.L * ng;
    rc = rnn_swap(c, g.n, g.L, g.I, c->x, S + g.off_x0, err);
    for (int l = 0; l < g.layers && rc == PS_OK; l++) {
        const float *X = S + g.off_x0;
        int64_t in = g.I;
        if (l) {
            X = rnn_layer_out(&g, S, l - 1), in = DH;
            if (g.drop) {
                rc = ops->mul(im, g.L * g.D * nh, X, mask + (int64_t)(l - 1) * g.L * g.D * nh, S + g.off_xd[l], err);
                X = S + g.off_xd[l];
            }
        }
        for (int d = 0; d < g.D && rc == PS_OK; d++) {
            float *Hs = S + g.off_h[l][d], *Cs = g.gru ? NULL : S + g.off_c[l][d], *A = S + g.off_a[l][d];
            const int bi = rnn_pi(&g, l, d, 2), bh = rnn_pi(&g, l, d, 3);
            const ps_linear_desc dx = {(int)(g.L * g.n), (int)in, (int)(g.G * g.H)},
                                 dh = {(int)g.n, (int)g.H, (int)(g.G * g.H)};
            const int64_t h0 = rnn_prev(d, d ? g.L - 1 : 0);   /* the zero state's slot */
            rc = ops->linear_forward(im, &dx, X, c->w[rnn_pi(&g, l, d, 0)], bi >= 0 ? c->w[bi] : NULL, gx, err);
            if (rc == PS_OK) rc = ops->fill(im, nh, Hs + h0 * nh, 0.0f, err);
            if (rc == PS_OK && Cs) rc = ops->fill(im, nh, Cs + h0 * nh, 0.0f, err);
            for (int64_t s = 0; s < g.L && rc == PS_OK; s++) {
                const int64_t t = d ? g.L - 1 - s : s, tp = rnn_prev(d, t), tn = rnn_next(d, t);
                rc = ops->linear_forward(im, &dh, Hs + tp * nh, c->w[rnn_pi(&g, l, d, 1)], bh >= 0 ? c->w[bh] : NULL,
                                         gh, err);
                if (rc == PS_OK)
                    rc = ops->rnn_cell_forward(im, &cd, gx + t * ng, gh, Hs + tp * nh, Cs ? Cs + tp * nh : NULL,
                                               Hs + tn * nh, Cs ? Cs + tn * nh : NULL, A + t * 4 * nh, err);
            }
            if (rc == PS_OK && g.D == 2)   /* into the joined output: forward h_1..h_L, reverse h_0..h_{L-1} */
                rc = ops->copy2d(im, g.L * g.n, g.H, Hs + (d ? 0 : nh), g.H, S + g.off_y[l] + d * g.H, DH, 0, err);
        }
    }
    if (rc == PS_OK) rc = rnn_swap(c, g.L, g.n, DH, rnn_layer_out(&g, S, g.layers - 1), c->y, err);
    if (rc == PS_OK && c->train) {   /* the tape frees it */
        c->saved->dev[1] = S;
        S = NULL;
    }
out:
    ps_backend_release(c->be, S);
    ps_backend_release(c->be, gx);
    return rc;
}

static ps_status rnn_backward(ps_layer_call *c, ps_err *err) {
    if (c->ly->flags & PS_KIND_PARAMS_ONLY) return lstm_refuse(c, err);
    ps_status crc = rnn_check_rows(c, err);
    if (crc) return crc;
    const ps_backend_ops *ops = c->be->ops;
    void *im = c->be->impl;
    const rnn_geom g = rnn_of(c->ly, c->n, 1);
    const int64_t nh = g.n * g.H, ng = g.n * g.G * g.H, lng = g.L * ng, DH = g.D * g.H;
    const int64_t maxin = g.I > DH ? g.I : DH, lnx = g.L * g.n * maxin;
    const ps_rnn_cell_desc cd = {g.gru, g.n, g.H};
    float *S = c->saved->dev[1];
    const float *mask = c->saved->dev[0];
    const int drop = mask != NULL && g.layers > 1;   /* the forward's: a mask when it dropped */
    /* dY (L, n, D*H), dX (L, n, max(I, D*H)), dgx, dgh (L, n, G*H; LSTM: dgh is dgx), dh, dhrec, dc, tmp (n, H);
     * two directions: dYd (L, n, H) one direction's part of dY, dX2 the reverse direction's dX */
    const int64_t two = g.D == 2;
    float *W = ps_backend_alloc_floats(c->be, g.L * g.n * DH + lnx + (g.gru ? 2 : 1) * lng + 4 * nh
                                                  + two * (g.L * nh + lnx));
    if (!W) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's backward", c->ly->name);
    float *dY = W, *dX = dY + g.L * g.n * DH, *dgx = dX + lnx, *dgh = g.gru ? dgx + lng : dgx;
    float *dh = dgh + lng, *dhrec = dh + nh, *dc = dhrec + nh, *tmp = dc + nh;
    float *dYd = two ? tmp + nh : dY, *dX2 = two ? dYd + g.L * nh : NULL;
    ps_status rc = rnn_swap(c, g.n, g.L, DH, c->dy, dY, err);
    for (int l = g.layers - 1; l >= 0 && rc == PS_OK; l--) {
        const float *X = l == 0 ? S + g.off_x0 : drop ? S + g.off_xd[l] : rnn_layer_out(&g, S, l - 1);
        const int64_t in = l ? DH : g.I;
        const int want_dx = l > 0 || c->dx;
        for (int d = 0; d < g.D && rc == PS_OK; d++) {
            const float *Hs = S + g.off_h[l][d], *Cs = g.gru ? NULL : S + g.off_c[l][d], *A = S + g.off_a[l][d];
            const float *Wih = c->w[rnn_pi(&g, l, d, 0)], *Whh = c->w[rnn_pi(&g, l, d, 1)];
            const ps_linear_desc dh1 = {(int)g.n, (int)g.H, (int)(g.G * g.H)};
            if (two) rc = ops->copy2d(im, g.L * g.n, g.H, dY + d * g.H, DH, dYd, g.H, 0, err);
            if (rc == PS_OK) rc = ops->fill(im, nh, dhrec, 0.0f, err);
            if (rc == PS_OK) rc = ops->fill(im, nh, dc, 0.0f, err);
            for (int64_t s = g.L - 1; s >= 0 && rc == PS_OK; s--) {   /* the forward's steps backwards */
                const int64_t t = d ? g.L - 1 - s : s, tp = rnn_prev(d, t), tn = rnn_next(d, t);
                rc = ops->add_out(im, nh, dYd + t * nh, dhrec, dh, err);
                if (rc == PS_OK)
                    rc = ops->rnn_cell_backward(im, &cd, A + t * 4 * nh, Hs + tp * nh, Cs ? Cs + tp * nh : NULL,
                                                Cs ? Cs + tn * nh : NULL, dh, dc, dgx + t * ng, dgh + t * ng, dhrec,
                                                err);
                if (rc == PS_OK && s > 0) {
                    rc = ops->linear_backward(im, &dh1, Hs + tp * nh, Whh, dgh + t * ng, tmp, NULL, NULL, err);
                    if (rc == PS_OK) rc = ops->add(im, nh, dhrec, tmp, err);
                }
            }
            const int bi = rnn_pi(&g, l, d, 2), bh = rnn_pi(&g, l, d, 3);
            const ps_linear_desc dxi = {(int)(g.L * g.n), (int)in, (int)(g.G * g.H)},
                                 dhh = {(int)(g.L * g.n), (int)g.H, (int)(g.G * g.H)};
            float *dWih = c->dw[rnn_pi(&g, l, d, 0)], *dWhh = c->dw[rnn_pi(&g, l, d, 1)];
            float *dbi = bi >= 0 ? c->dw[bi] : NULL, *dbh = bh >= 0 ? c->dw[bh] : NULL;
            float *dXd = d ? dX2 : dX;
            if (rc == PS_OK && (want_dx || dWih || dbi))
                rc = ops->linear_backward(im, &dxi, X, Wih, dgx, want_dx ? dXd : NULL, dWih, dbi, err);
            /* step t's h_{t-1}: the forward's slots 0..L-1, the reverse's 1..L */
            if (rc == PS_OK && (dWhh || dbh))
                rc = ops->linear_backward(im, &dhh, Hs + (d ? nh : 0), Whh, dgh, NULL, dWhh, dbh, err);
            if (rc == PS_OK && d && want_dx) rc = ops->add(im, g.L * g.n * in, dX, dX2, err);
        }
        if (rc == PS_OK && l > 0) {   /* d loss / d (the layer below's output), through the dropout */
            const int64_t count = g.L * g.n * DH;
            rc = drop ? ops->mul(im, count, dX, mask + (int64_t)(l - 1) * count, dY, err)
                      : ops->copy2d(im, 1, count, dX, count, dY, count, 0, err);
        }
    }
    if (rc == PS_OK && c->dx) rc = rnn_swap(c, g.L, g.n, g.I, dX, c->dx, err);
    ps_backend_release(c->be, W);
    return rc;
}

static size_t rnn_bytes(const ps_layer *ly, int n) {
    if (ly->flags & PS_KIND_PARAMS_ONLY) return 0;
    const rnn_geom g = rnn_of(ly, n, 1);
    return (size_t)(g.saved + (g.drop ? (int64_t)(g.layers - 1) * g.L * g.n * g.D * g.H : 0)) * sizeof(float);
}

static double rnn_flops(const ps_layer *ly) {
    const int gru = !strcmp(ly->kind->name, "GRU");
    double f = 0, H = (double)ly->a.out, G = gru ? 3 : 4, D = ly->a.bidirectional ? 2 : 1;
    const double L = ly->flags & PS_KIND_PARAMS_ONLY ? 1 : (double)ly->in[0].dims[0];
    const double in = (double)ly->in[0].dims[ly->in[0].ndim - 1];
    for (int l = 0; l < ly->a.num; l++) f += D * 2.0 * G * H * ((l ? D * H : in) + H);
    return L * f;
}

/* ---- LSTMCell and GRUCell: nn.LSTMCell / nn.GRUCell(input_size,
 * hidden_size, bias), one time step, the cell a loop calls once per step
 * (a node per call, the later ones share: the first's parameters). Inputs
 * x (input_size), then the state: GRUCell h (H), LSTMCell h and c (H each);
 * without them the state is zeros (PyTorch's cell(x)). Output: GRUCell's h'
 * (H); LSTMCell's h' and c' joined, (2H) = [h', c'] (psd's nodes have one
 * output: Narrow cuts h' and c' apart). PyTorch's parameters weight_ih
 * (G*H, input_size), weight_hh (G*H, H), bias_ih, bias_hh (G*H; without
 * bias: none), gates in PyTorch's order (LSTM i, f, g, o; GRU r, z, n), all
 * U(-1/sqrt(H), 1/sqrt(H)). One step of the LSTM / GRU kinds above: the two
 * GEMMs by linear_forward, the gates by the backend's rnn_cell_forward; the
 * backward rnn_cell_backward and two linear_backwards. The tape keeps the
 * gate values (dev[0], (n, 4H); ps_rnn_cell_desc) and, LSTMCell, c' (dev[1],
 * (n, H)), both sample-major; the backward reads the inputs. ---- */

typedef struct cell_geom {
    int gru, bias, given;          /* given: the state is an input (else zeros) */
    int64_t n, I, H, G;
} cell_geom;

static cell_geom cell_of(const ps_layer *ly, int n) {
    cell_geom g;
    g.gru = !strcmp(ly->kind->name, "GRUCell");
    g.bias = ly->a.bias;
    g.given = ly->nin > 1;
    g.n = n;
    g.I = ly->in[0].dims[0];
    g.H = ly->a.out;
    g.G = g.gru ? 3 : 4;
    return g;
}


static ps_status cell_infer(ps_layer *ly, ps_err *err) {
    const int gru = !strcmp(ly->kind->name, "GRUCell");
    const int64_t H = ly->a.out, G = gru ? 3 : 4;
    ps_status rc = need_ndim(ly, 0, 1, 1, PS_DTYPE_F32, err);
    if (rc) return rc;
    const int64_t in = ly->in[0].dims[0];
    if ((rc = check_given("input_size", ly->a.in_features, in, err))) return rc;
    if (!gru && ly->nin == 2)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "LSTMCell takes x, or x, h and c (nn.LSTMCell's (h, c)): "
                          "2 inputs given");
    for (int i = 1; i < ly->nin; i++) {
        char b[64];
        if ((rc = need_ndim(ly, i, 1, 1, PS_DTYPE_F32, err))) return rc;
        if (ly->in[i].dims[0] != H)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s's state %s is %s: hidden_size is %lld",
                              ly->kind->name, i == 1 ? "h" : "c", ps_shape_format(&ly->in[i], b, sizeof b),
                              (long long)H);
    }
    if (H > 65536 || in > 65536) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "a size over 65536");
    ly->outs = ly->in[0];
    ly->outs.dims[0] = gru ? H : 2 * H;
    ly->out_dtype = PS_DTYPE_F32;
    const ps_init u = {PS_INIT_UNIFORM, 0, 0, 1};
    const int64_t wi[2] = {G * H, in}, wh[2] = {G * H, H}, b[1] = {G * H};
    set_param(ly, 0, "weight_ih", 2, wi, H, u);
    set_param(ly, 1, "weight_hh", 2, wh, H, u);
    if (ly->a.bias) {
        set_param(ly, 2, "bias_ih", 1, b, H, u);
        set_param(ly, 3, "bias_hh", 1, b, H, u);
    }
    return PS_OK;
}

static const char *cell_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->rnn_cell_forward && ops->rnn_cell_backward && ops->fill && ops->add && ops->copy2d
               ? NULL
               : "rnn_cell_forward/rnn_cell_backward, fill, add, copy2d";
}

static ps_status cell_forward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    void *im = c->be->impl;
    const cell_geom g = cell_of(c->ly, c->n);
    const int64_t nh = g.n * g.H, ng = g.n * g.G * g.H;
    const ps_rnn_cell_desc cd = {g.gru, g.n, g.H};
    const ps_linear_desc dx = {c->n, (int)g.I, (int)(g.G * g.H)}, dh = {c->n, (int)g.H, (int)(g.G * g.H)};
    /* tape: act (n, 4H), LSTMCell c' (n, H); work: gx, gh (n, G*H), zeros (n, H) without a state, h' (n, H) */
    float *act = ps_backend_alloc_floats(c->be, 4 * nh), *cn = g.gru ? NULL : ps_backend_alloc_floats(c->be, nh);
    float *W = ps_backend_alloc_floats(c->be, 2 * ng + (g.given ? 0 : nh) + nh);
    ps_status rc = PS_OK;
    if (!act || (!g.gru && !cn) || !W) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", c->ly->name);
        goto out;
    }
    float *gx = W, *gh = gx + ng, *zero = g.given ? NULL : gh + ng, *hn = (g.given ? gh + ng : zero + nh);
    const float *h0 = g.given ? c->xs[1] : zero, *c0 = g.gru ? NULL : g.given ? c->xs[2] : zero;
    if (!g.given) rc = ops->fill(im, nh, zero, 0.0f, err);
    if (rc == PS_OK) rc = ops->linear_forward(im, &dx, c->x, c->w[0], g.bias ? c->w[2] : NULL, gx, err);
    if (rc == PS_OK) rc = ops->linear_forward(im, &dh, h0, c->w[1], g.bias ? c->w[3] : NULL, gh, err);
    /* GRUCell: h' straight into the output; LSTMCell: h' and c' apart, then joined row by row */
    if (rc == PS_OK)
        rc = ops->rnn_cell_forward(im, &cd, gx, gh, h0, c0, g.gru ? c->y : hn, cn, act, err);
    if (rc == PS_OK && !g.gru) rc = ops->copy2d(im, g.n, g.H, hn, g.H, c->y, 2 * g.H, 0, err);
    if (rc == PS_OK && !g.gru) rc = ops->copy2d(im, g.n, g.H, cn, g.H, (float *)c->y + g.H, 2 * g.H, 0, err);
    if (rc == PS_OK && c->train) {   /* the tape frees them */
        c->saved->dev[0] = act;
        c->saved->dev[1] = cn;
        act = cn = NULL;
    }
out:
    ps_backend_release(c->be, act);
    ps_backend_release(c->be, cn);
    ps_backend_release(c->be, W);
    return rc;
}

static ps_status cell_backward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    void *im = c->be->impl;
    const cell_geom g = cell_of(c->ly, c->n);
    const int64_t nh = g.n * g.H, ng = g.n * g.G * g.H;
    const ps_rnn_cell_desc cd = {g.gru, g.n, g.H};
    const ps_linear_desc dxd = {c->n, (int)g.I, (int)(g.G * g.H)}, dhd = {c->n, (int)g.H, (int)(g.G * g.H)};
    const float *act = c->saved->dev[0], *cn = c->saved->dev[1];
    float *dh0 = g.given ? c->dxs[1] : NULL, *dc0 = g.given && !g.gru ? c->dxs[2] : NULL;
    /* dgx, dgh (n, G*H; LSTMCell: dgh is dgx), zeros (n, H) without a state; LSTMCell's dh, dc (n, H) cut from
     * dy; dh_prev's part outside W_hh (n, H) */
    float *W = ps_backend_alloc_floats(c->be, 2 * ng + (g.given ? 0 : nh) + (g.gru ? 0 : 2 * nh) + nh);
    if (!W) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's backward", c->ly->name);
    float *dgx = W, *dgh = g.gru ? dgx + ng : dgx, *p = dgx + 2 * ng;
    float *zero = g.given ? NULL : p;
    p += g.given ? 0 : nh;
    float *dh = g.gru ? NULL : p, *dc = g.gru ? NULL : p + nh;
    p += g.gru ? 0 : 2 * nh;
    float *dhp = p;
    const float *h0 = g.given ? c->xs[1] : zero, *c0 = g.gru ? NULL : g.given ? c->xs[2] : zero;
    ps_status rc = g.given ? PS_OK : ops->fill(im, nh, zero, 0.0f, err);
    if (rc == PS_OK && !g.gru) rc = ops->copy2d(im, g.n, g.H, c->dy, 2 * g.H, dh, g.H, 0, err);
    if (rc == PS_OK && !g.gru) rc = ops->copy2d(im, g.n, g.H, c->dy + g.H, 2 * g.H, dc, g.H, 0, err);
    if (rc == PS_OK)   /* dc: d loss / d c' in, d loss / d c (the state given) out */
        rc = ops->rnn_cell_backward(im, &cd, act, h0, c0, cn, g.gru ? c->dy : dh, dc, dgx, dgh, dhp, err);
    if (rc == PS_OK && (c->dx || c->dw[0] || (g.bias && c->dw[2])))
        rc = ops->linear_backward(im, &dxd, c->x, c->w[0], dgx, c->dx, c->dw[0], g.bias ? c->dw[2] : NULL, err);
    if (rc == PS_OK && (dh0 || c->dw[1] || (g.bias && c->dw[3])))
        rc = ops->linear_backward(im, &dhd, h0, c->w[1], dgh, dh0, c->dw[1], g.bias ? c->dw[3] : NULL, err);
    if (rc == PS_OK && dh0) rc = ops->add(im, nh, dh0, dhp, err);   /* GRUCell's z * dh' (LSTMCell's is 0) */
    if (rc == PS_OK && dc0) rc = ops->copy2d(im, 1, nh, dc, nh, dc0, nh, 0, err);
    ps_backend_release(c->be, W);
    return rc;
}

static size_t cell_bytes(const ps_layer *ly, int n) {
    const cell_geom g = cell_of(ly, n);
    return (size_t)(g.n * (4 * g.H + (g.gru ? 0 : g.H))) * sizeof(float);
}

static double cell_flops(const ps_layer *ly) {
    const cell_geom g = cell_of(ly, 1);
    return 2.0 * (double)(g.G * g.H) * (double)(g.I + g.H) + 10.0 * (double)g.H;
}

/* The tape's gates (dev[0], 4H a sample) and LSTMCell's c' (dev[1], H a sample). */
static size_t cell_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    (void)be;
    const cell_geom g = cell_of(ly, n);
    const int64_t per = j == 0 ? 4 * g.H : j == 1 && !g.gru ? g.H : 0;
    return (size_t)(g.n * per) * sizeof(float);
}

/* ---- numpy broadcasting of two computed inputs (Add, Sub, Mul, Div):
 * the two samples' shapes of one rank (the batch, dim 0, is both
 * inputs' own: PyTorch's right-aligned rule with the batch dims equal),
 * each pair of dims equal or one of them 1; the output takes the larger.
 * The backend's binary_bcast computes it, binary_bcast_backward each
 * input's gradient summed over the dims it was broadcast along. a.bcast
 * is BCAST_NUMPY then (Mul's trailing case keeps its own op). Plain
 * layout; never in place. ---- */

#define BCAST_NUMPY 2

/* The broadcast shape of inputs 0 and 1 into ly->outs; an error naming
 * both when they do not broadcast. */
static ps_status bcast_infer(ps_layer *ly, ps_err *err) {
    char b1[64], b2[64];
    const ps_shape *x = &ly->in[0], *z = &ly->in[1];
    int ok = x->ndim == z->ndim;
    ly->outs = *x;
    for (int k = 0; ok && k < x->ndim; k++) {
        ok = x->dims[k] == z->dims[k] || x->dims[k] == 1 || z->dims[k] == 1;
        ly->outs.dims[k] = x->dims[k] == 1 ? z->dims[k] : x->dims[k];
    }
    if (!ok)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input '%s' is %s and input '%s' is %s: %s broadcasts "
                          "inputs of one rank whose dimensions are equal or 1 (numpy's rule, per sample)",
                          ly->def->in_names[0], ps_shape_format(x, b1, sizeof b1), ly->def->in_names[1],
                          ps_shape_format(z, b2, sizeof b2), ly->kind->name);
    ly->a.bcast = BCAST_NUMPY;
    ly->flags &= ~(unsigned)(PS_KIND_INPLACE | PS_KIND_GRAD_PASS | PS_KIND_LAYOUT_KEEP);
    return PS_OK;
}

static ps_bcast_desc bcast_desc(const ps_layer *ly, int n, int op) {
    ps_bcast_desc d = {.op = op, .ndim = ly->outs.ndim + 1};
    d.y[0] = d.a[0] = d.b[0] = n;
    for (int k = 0; k < ly->outs.ndim; k++) {
        d.y[k + 1] = ly->outs.dims[k];
        d.a[k + 1] = ly->in[0].dims[k];
        d.b[k + 1] = ly->in[1].dims[k];
    }
    return d;
}

static ps_status bcast_forward(ps_layer_call *c, int op, ps_err *err) {
    const ps_bcast_desc d = bcast_desc(c->ly, c->n, op);
    return c->be->ops->binary_bcast(c->be->impl, &d, c->xs[0], c->xs[1], c->y, err);
}

static ps_status bcast_backward(ps_layer_call *c, int op, ps_err *err) {
    const ps_bcast_desc d = bcast_desc(c->ly, c->n, op);
    ps_status rc = PS_OK;
    for (int i = 0; i < 2 && rc == PS_OK; i++)
        if (c->dxs[i])
            rc = c->be->ops->binary_bcast_backward(c->be->impl, &d, i, c->xs[0], c->xs[1], c->dy, c->dxs[i], err);
    return rc;
}

static const char *bcast_missing(const ps_backend_ops *ops) {
    return ops->binary_bcast && ops->binary_bcast_backward ? NULL : "binary_bcast/binary_bcast_backward";
}

/* ---- Add: the residual sum of its inputs (all of one shape), or of two
 * that broadcast (numpy's rule, above) ---- */

static ps_status add_infer(ps_layer *ly, ps_err *err) {
    char b1[64], b2[64];
    ly->a.bcast = -1;
    for (int i = 0; i < ly->nin; i++) {
        ps_status rc = need_ndim(ly, i, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
        if (rc) return rc;
    }
    ly->out_dtype = PS_DTYPE_F32;
    if (ly->nin == 2 && !ps_shape_equal(&ly->in[0], &ly->in[1])) return bcast_infer(ly, err);
    for (int i = 0; i < ly->nin; i++)
        if (!ps_shape_equal(&ly->in[i], &ly->in[0]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input '%s' is %s but input '%s' is %s: Add of more "
                              "than two inputs takes inputs of one shape (two may broadcast)", ly->def->in_names[0],
                              ps_shape_format(&ly->in[0], b1, sizeof b1), ly->def->in_names[i],
                              ps_shape_format(&ly->in[i], b2, sizeof b2));
    ly->outs = ly->in[0];
    return PS_OK;
}

/* y = x0 + x1 + ...: the executor gives y == x0 when it runs in place. */
static ps_status add_forward(ps_layer_call *c, ps_err *err) {
    if (c->ly->a.bcast == BCAST_NUMPY) return bcast_forward(c, PS_BINARY_ADD, err);
    const ps_backend_ops *ops = c->be->ops;
    int64_t count = ps_layer_out_count(c->ly, c->n);
    ps_status rc = ops->add_out(c->be->impl, count, c->xs[0], c->xs[1], c->y, err);
    for (int i = 2; i < c->ly->nin && rc == PS_OK; i++) rc = ops->add(c->be->impl, count, c->y, c->xs[i], err);
    return rc;
}

/* Called only when broadcasting: otherwise PS_KIND_GRAD_PASS routes dy to every input. */
static ps_status add_backward(ps_layer_call *c, ps_err *err) {
    return c->ly->a.bcast == BCAST_NUMPY ? bcast_backward(c, PS_BINARY_ADD, err) : view_pass(c, err);
}

static const char *add_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    if (ly->a.bcast == BCAST_NUMPY) return bcast_missing(ops);
    return ops->add_out ? NULL : "add_out";
}

/* ---- Concat: torch.cat(inputs, dim); every other dimension equal ---- */

static ps_status concat_infer(ps_layer *ly, ps_err *err) {
    char b1[64], b2[64];
    int d;
    ps_status rc = need_dim_attr(ly, &d, err);
    if (rc) return rc;
    ly->outs = ly->in[0];
    for (int i = 1; i < ly->nin; i++) {
        if ((rc = need_ndim(ly, i, ly->in[0].ndim, ly->in[0].ndim, PS_DTYPE_F32, err))) return rc;
        for (int k = 0; k < ly->in[0].ndim; k++)
            if (k != d && ly->in[i].dims[k] != ly->in[0].dims[k])
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input '%s' is %s but input '%s' is %s: they may "
                                  "differ only in dim %lld", ly->def->in_names[0],
                                  ps_shape_format(&ly->in[0], b1, sizeof b1), ly->def->in_names[i],
                                  ps_shape_format(&ly->in[i], b2, sizeof b2), (long long)ly->a.dim);
        ly->outs.dims[d] += ly->in[i].dims[d];
    }
    ly->out_dtype = PS_DTYPE_F32;
    if (d != 0) ly->flags &= ~(unsigned)PS_KIND_LAYOUT_KEEP;   /* blocked: along the channels only */
    return PS_OK;
}

/* Input i as rows of a 2-D copy into the output: rows, its columns, the
 * output's row length and i's offset in it. A blocked (C, H, W) activation
 * is viewed as (C/B, H, W, B). */
static void concat_geom(const ps_layer *ly, const ps_backend *be, int n, int i, int64_t *rows, int64_t *cols,
                        int64_t *ld, int64_t *off) {
    int d = sample_dim(ly->a.dim, ly->in[0].ndim);
    int64_t before = 0;
    for (int j = 0; j < i; j++) before += ly->in[j].dims[d];
    const ps_shape *o = &ly->outs;
    if (ly->in_layout[0] == PS_LAYOUT_BLOCKED) {
        int64_t B = be->ops->blocked_layout(be->impl, (int)o->dims[0]), C = o->dims[0], H = o->dims[1],
                W = o->dims[2];
        int64_t ci = ly->in[i].dims[0], hi = ly->in[i].dims[1], wi = ly->in[i].dims[2];
        if (d == 0) { *rows = n; *cols = ci * H * W; *ld = C * H * W; *off = before * H * W; }
        else if (d == 1) { *rows = (int64_t)n * (C / B); *cols = hi * W * B; *ld = H * W * B; *off = before * W * B; }
        else { *rows = (int64_t)n * (C / B) * H; *cols = wi * B; *ld = W * B; *off = before * B; }
        return;
    }
    int64_t outer = n, inner = 1;
    for (int k = 0; k < d; k++) outer *= o->dims[k];
    for (int k = d + 1; k < o->ndim; k++) inner *= o->dims[k];
    *rows = outer;
    *cols = ly->in[i].dims[d] * inner;
    *ld = o->dims[d] * inner;
    *off = before * inner;
}

static const char *concat_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->copy2d ? NULL : "copy2d";
}

static ps_status concat_forward(ps_layer_call *c, ps_err *err) {
    ps_status rc = PS_OK;
    for (int i = 0; i < c->ly->nin && rc == PS_OK; i++) {
        int64_t rows, cols, ld, off;
        concat_geom(c->ly, c->be, c->n, i, &rows, &cols, &ld, &off);
        rc = c->be->ops->copy2d(c->be->impl, rows, cols, c->xs[i], cols, (float *)c->y + off, ld, 0, err);
    }
    return rc;
}

static ps_status concat_backward(ps_layer_call *c, ps_err *err) {
    ps_status rc = PS_OK;
    for (int i = 0; i < c->ly->nin && rc == PS_OK; i++) {
        if (!c->dxs[i]) continue;
        int64_t rows, cols, ld, off;
        concat_geom(c->ly, c->be, c->n, i, &rows, &cols, &ld, &off);
        rc = c->be->ops->copy2d(c->be->impl, rows, cols, c->dy + off, ld, c->dxs[i], cols, 0, err);
    }
    return rc;
}

/* ---- Mul: x0 * x1, of one shape, or one of them (C, 1, 1)-like - its
 * leading dims the other's, the rest 1 - broadcast over the other's
 * trailing dims: squeeze-and-excitation's `scale * x` of (N, C, 1, 1) by
 * (N, C, H, W). Plain layout. Backward: d big = dy * small (broadcast), d
 * small = the sum over the broadcast dims of dy * big (a product with a
 * vector of ones). Any other numpy broadcast: BCAST_NUMPY. ---- */

static ps_status mul_infer(ps_layer *ly, ps_err *err) {
    for (int i = 0; i < 2; i++) {
        ps_status rc = need_ndim(ly, i, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
        if (rc) return rc;
    }
    ly->out_dtype = PS_DTYPE_F32;
    ly->a.bcast = -1;
    if (ps_shape_equal(&ly->in[0], &ly->in[1])) {
        ly->outs = ly->in[0];
        return PS_OK;
    }
    const int s = ps_shape_numel(&ly->in[0]) < ps_shape_numel(&ly->in[1]) ? 0 : 1;
    const ps_shape *small = &ly->in[s], *big = &ly->in[1 - s];
    if (small->ndim != big->ndim || !ps_dims_bcast_trailing(small->dims, big->dims, small->ndim))
        return bcast_infer(ly, err);   /* any other numpy broadcast */
    ly->outs = *big;
    ly->a.bcast = s;
    return PS_OK;
}

static const char *mul_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    if (ly->a.bcast == BCAST_NUMPY) return bcast_missing(ops);
    return ops->mul && ops->mul_channels && ops->linear_forward && ops->fill ? NULL
                                                                            : "mul/mul_channels/linear_forward/fill";
}

/* The broadcast input's per-sample count q and the span s it covers: the big input is (q, s) per sample. */
static ps_chan_desc mul_desc(const ps_layer *ly, int n) {
    ps_chan_desc d = {0};
    int64_t q = ps_shape_numel(&ly->in[ly->a.bcast]);
    d.n = n;
    d.c = (int)q;
    d.s = ps_shape_numel(&ly->outs) / q;
    d.layout = PS_LAYOUT_PLAIN;
    return d;
}

static ps_status mul_forward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    if (ly->a.bcast == BCAST_NUMPY) return bcast_forward(c, PS_BINARY_MUL, err);
    if (ly->a.bcast < 0)
        return c->be->ops->mul(c->be->impl, ps_layer_out_count(ly, c->n), c->xs[0], c->xs[1], c->y, err);
    ps_chan_desc d = mul_desc(ly, c->n);
    return c->be->ops->mul_channels(c->be->impl, &d, c->xs[1 - ly->a.bcast], c->xs[ly->a.bcast], c->y, err);
}

static ps_status mul_backward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    if (ly->a.bcast == BCAST_NUMPY) return bcast_backward(c, PS_BINARY_MUL, err);
    const ps_backend_ops *ops = c->be->ops;
    const int64_t count = ps_layer_out_count(ly, c->n);
    ps_status rc = PS_OK;
    if (ly->a.bcast < 0) {
        for (int i = 0; i < 2 && rc == PS_OK; i++)
            if (c->dxs[i]) rc = ops->mul(c->be->impl, count, c->dy, c->xs[1 - i], c->dxs[i], err);
        return rc;
    }
    const int s = ly->a.bcast, b = 1 - s;
    ps_chan_desc d = mul_desc(ly, c->n);
    if (c->dxs[b] && (rc = ops->mul_channels(c->be->impl, &d, c->dy, c->xs[s], c->dxs[b], err))) return rc;
    if (!c->dxs[s]) return PS_OK;
    const int64_t rows = (int64_t)d.n * d.c;
    if (rows > INT32_MAX || d.s > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: Mul's broadcast of %lld rows of %lld is too large",
                          ly->name, (long long)rows, (long long)d.s);
    float *prod = ps_backend_alloc_floats(c->be, count), *ones = ps_backend_alloc_floats(c->be, d.s);
    if (!prod || !ones) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", ly->name);
    } else if (!(rc = ops->mul(c->be->impl, count, c->dy, c->xs[b], prod, err)) &&
               !(rc = ops->fill(c->be->impl, d.s, ones, 1.0f, err))) {
        ps_linear_desc ld = {(int)rows, (int)d.s, 1};
        rc = ops->linear_forward(c->be->impl, &ld, prod, ones, NULL, c->dxs[s], err);
    }
    ps_backend_release(c->be, prod);
    ps_backend_release(c->be, ones);
    return rc;
}

/* ---- Sub: a - b of two computed tensors of one shape (x - y, torch.sub;
 * ONNX's Sub), or that broadcast (x - x.mean(1, keepdim=True)). The
 * gradients are dy and -dy (summed over a broadcast input's dims). ---- */

static ps_status sub_infer(ps_layer *ly, ps_err *err) {
    for (int i = 0; i < 2; i++) {
        ps_status rc = need_ndim(ly, i, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
        if (rc) return rc;
    }
    ly->a.bcast = -1;
    ly->out_dtype = PS_DTYPE_F32;
    if (!ps_shape_equal(&ly->in[0], &ly->in[1])) return bcast_infer(ly, err);
    ly->outs = ly->in[0];
    return PS_OK;
}

static const char *sub_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    if (ly->a.bcast == BCAST_NUMPY) return bcast_missing(ops);
    return ops->copy2d && ops->scale && ops->add ? NULL : "copy2d/scale/add";
}

/* dst = src * f (dst == src allowed: then only the scale; f 1: only the copy). Sub's and MulConstant's. */
static ps_status scaled_copy(const ps_layer_call *c, const float *src, float *dst, int64_t count, float f,
                             ps_err *err) {
    ps_status rc = PS_OK;
    if (dst != src) rc = c->be->ops->copy2d(c->be->impl, 1, count, src, count, dst, count, 0, err);
    return rc || f == 1.0f ? rc : c->be->ops->scale(c->be->impl, count, dst, f, err);
}

static ps_status sub_forward(ps_layer_call *c, ps_err *err) {
    if (c->ly->a.bcast == BCAST_NUMPY) return bcast_forward(c, PS_BINARY_SUB, err);
    const int64_t count = ps_layer_out_count(c->ly, c->n);
    ps_status rc = scaled_copy(c, c->xs[1], c->y, count, -1.0f, err);
    return rc ? rc : c->be->ops->add(c->be->impl, count, c->y, c->xs[0], err);
}

static ps_status sub_backward(ps_layer_call *c, ps_err *err) {
    if (c->ly->a.bcast == BCAST_NUMPY) return bcast_backward(c, PS_BINARY_SUB, err);
    const int64_t count = ps_layer_out_count(c->ly, c->n);
    ps_status rc = PS_OK;
    for (int i = 0; i < 2 && rc == PS_OK; i++)
        if (c->dxs[i]) rc = scaled_copy(c, c->dy, c->dxs[i], count, i ? -1.0f : 1.0f, err);
    return rc;
}

/* ---- Div: a / b of two computed tensors, of one shape or that broadcast
 * (x / x.norm(dim=1, keepdim=True), (x - mu) / std; torch.div, ONNX's
 * Div). Gradients dy / b and -dy * a / b^2, summed over a broadcast
 * input's dims; all through binary_bcast (one shape is its case of no
 * broadcast dims). ---- */

static ps_status div_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = sub_infer(ly, err);
    ly->a.bcast = BCAST_NUMPY;
    return rc;
}

static const char *div_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return bcast_missing(ops);
}

static ps_status div_forward(ps_layer_call *c, ps_err *err) { return bcast_forward(c, PS_BINARY_DIV, err); }

static ps_status div_backward(ps_layer_call *c, ps_err *err) { return bcast_backward(c, PS_BINARY_DIV, err); }

/* ---- Maximum, Minimum: torch.maximum(a, b) / torch.max(a, b) and the
 * minimum of two computed tensors, of one shape or that broadcast (numpy's
 * rule, as Div). The gradient goes to the larger (smaller) operand, half
 * to each where they are equal (PyTorch's), summed over a broadcast
 * input's dims; NaN on either side gives NaN. ---- */

static int extreme_op(const ps_layer *ly) {
    return !strcmp(ly->kind->name, "Maximum") ? PS_BINARY_MAX : PS_BINARY_MIN;
}

static ps_status extreme_forward(ps_layer_call *c, ps_err *err) { return bcast_forward(c, extreme_op(c->ly), err); }

static ps_status extreme_backward(ps_layer_call *c, ps_err *err) { return bcast_backward(c, extreme_op(c->ly), err); }

/* ---- Where: torch.where(cond, a, b) - a where cond is nonzero, b
 * elsewhere; cond a float mask (Greater, Less, ... of a tensor and a
 * number; Eq), a and b computed tensors of cond's shape or numbers
 * (attributes a, b: a number given there is not an input). Inputs: cond,
 * then a and b as far as they are tensors. The gradient goes to a where
 * cond holds, to b elsewhere, none to cond. ---- */

static ps_status where_infer(ps_layer *ly, ps_err *err) {
    char b1[64], b2[64];
    const ps_layer_attrs *a = &ly->a;
    const int want = 1 + a->where_a_null + a->where_b_null;
    if (ly->nin != want)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%d inputs, where Where takes %d: the condition, then %s",
                          ly->nin, want, want == 3 ? "a and b (neither is a number)"
                          : want == 2 ? (a->where_a_null ? "a (b is the number b:)" : "b (a is the number a:)")
                          : "nothing else (a and b are numbers)");
    for (int i = 0; i < ly->nin; i++) {
        ps_status rc = need_ndim(ly, i, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
        if (rc) return rc;
        if (!ps_shape_equal(&ly->in[i], &ly->in[0]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "input '%s' is %s but the condition '%s' is %s: Where "
                              "takes inputs of the condition's shape", ly->def->in_names[i],
                              ps_shape_format(&ly->in[i], b1, sizeof b1), ly->def->in_names[0],
                              ps_shape_format(&ly->in[0], b2, sizeof b2));
    }
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *where_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->where && ops->where_backward && ops->fill ? NULL : "where/where_backward/fill";
}

static ps_status where_forward(ps_layer_call *c, ps_err *err) {
    const ps_layer_attrs *a = &c->ly->a;
    const float *xa = a->where_a_null ? c->xs[1] : NULL, *xb = a->where_b_null ? c->xs[1 + a->where_a_null] : NULL;
    return c->be->ops->where(c->be->impl, ps_layer_out_count(c->ly, c->n), c->xs[0], xa, (float)a->where_a, xb,
                             (float)a->where_b, c->y, err);
}

static ps_status where_backward(ps_layer_call *c, ps_err *err) {
    const ps_layer_attrs *a = &c->ly->a;
    const int64_t count = ps_layer_out_count(c->ly, c->n);
    float *da = a->where_a_null ? c->dxs[1] : NULL, *db = a->where_b_null ? c->dxs[1 + a->where_a_null] : NULL;
    ps_status rc = c->dxs[0] ? c->be->ops->fill(c->be->impl, count, c->dxs[0], 0.0f, err) : PS_OK;
    if (rc || (!da && !db)) return rc;
    return c->be->ops->where_backward(c->be->impl, count, c->xs[0], c->dy, da, db, err);
}

/* ---- Parameter: a learned tensor of its own (`shape`), broadcast to each
 * sample (`expand`, numpy's rule: trailing dims equal or 1 in shape) - a
 * constant operand of an imported graph (ONNX Add/Concat with an
 * initializer, Gemm's matrix bias), as x + self.p is in PyTorch. Its input
 * only gives the batch size (its gradient is zero). Param weight, zeros. ---- */

typedef struct bcast {
    int ne;
    int64_t e[PS_SHAPE_MAX_DIMS], pstride[PS_SHAPE_MAX_DIMS];
    int k;                      /* dims k.. are equal in both: one contiguous run */
    int64_t run, outer, numel;
} bcast;

static bcast param_bcast(const ps_layer *ly) {
    const ps_layer_attrs *a = &ly->a;
    bcast b;
    memset(&b, 0, sizeof b);
    b.ne = ly->outs.ndim;
    int64_t pd[PS_SHAPE_MAX_DIMS];
    for (int i = 0; i < b.ne; i++) {
        b.e[i] = ly->outs.dims[i];
        int j = i - (b.ne - a->ndims);
        pd[i] = j >= 0 ? a->dims[j] : 1;
    }
    int64_t st = 1;
    for (int i = b.ne - 1; i >= 0; i--) {
        b.pstride[i] = pd[i] == 1 ? 0 : st;
        st *= pd[i];
    }
    b.k = b.ne;
    while (b.k > 0 && pd[b.k - 1] == b.e[b.k - 1]) b.k--;
    b.run = 1;
    for (int i = b.k; i < b.ne; i++) b.run *= b.e[i];
    b.outer = 1;
    for (int i = 0; i < b.k; i++) b.outer *= b.e[i];
    b.numel = b.run * b.outer;
    return b;
}

static int64_t bcast_src(const bcast *b, int64_t o) {
    int64_t off = 0;
    for (int i = b->k - 1; i >= 0; i--) {
        off += (o % b->e[i]) * b->pstride[i];
        o /= b->e[i];
    }
    return off;
}

static ps_status param_infer(ps_layer *ly, ps_err *err) {
    const ps_layer_attrs *a = &ly->a;
    int ne = a->ndims2 ? a->ndims2 : a->ndims;
    const int64_t *e = a->ndims2 ? a->dims2 : a->dims;
    for (int i = 0; i < a->ndims - ne; i++)   /* leading 1s face the batch: vit's class_token (1, 1, E) */
        if (a->dims[i] != 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "shape has %d dimensions, expand %d, and the extra "
                              "leading ones are not all 1", a->ndims, ne);
    for (int i = 0; i < a->ndims && i < ne; i++) {
        int64_t p = a->dims[a->ndims - 1 - i], q = e[ne - 1 - i];
        if (p != q && p != 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "shape dimension %d (%lld) does not broadcast to "
                              "expand's %lld (equal, or 1)", a->ndims - 1 - i, (long long)p, (long long)q);
    }
    ly->outs.ndim = ne;
    for (int i = 0; i < ne; i++) ly->outs.dims[i] = e[i];
    ly->out_dtype = PS_DTYPE_F32;
    set_param(ly, 0, a->pname, a->ndims, a->dims, 1, ZEROS);
    return PS_OK;
}

static const char *copy_fill_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return !ops->copy2d ? "copy2d" : !ops->fill ? "fill" : NULL;
}

static ps_status param_forward(ps_layer_call *c, ps_err *err) {
    bcast b = param_bcast(c->ly);
    ps_status rc = PS_OK;
    for (int s = 0; s < c->n && rc == PS_OK; s++)
        for (int64_t o = 0; o < b.outer && rc == PS_OK; o++)
            rc = c->be->ops->copy2d(c->be->impl, 1, b.run, c->w[0] + bcast_src(&b, o), b.run,
                                    (float *)c->y + s * b.numel + o * b.run, b.run, 0, err);
    return rc;
}

static ps_status param_backward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    bcast b = param_bcast(c->ly);
    ps_status rc = PS_OK;
    if (c->dx) rc = ops->fill(c->be->impl, ps_layer_in_count(c->ly, 0, c->n), c->dx, 0.0f, err);
    if (rc == PS_OK && c->dw[0]) {
        rc = ops->fill(c->be->impl, c->ly->param[0].numel, c->dw[0], 0.0f, err);
        for (int s = 0; s < c->n && rc == PS_OK; s++)
            for (int64_t o = 0; o < b.outer && rc == PS_OK; o++)
                rc = ops->copy2d(c->be->impl, 1, b.run, c->dy + s * b.numel + o * b.run, b.run,
                                 c->dw[0] + bcast_src(&b, o), b.run, 1, err);
    }
    return rc;
}

/* ---- Constant: a registered buffer read as a value (x + self.pe, (x -
 * self.mean) / self.std). The Parameter kind's shape, expand and
 * broadcast, over a float32 buffer that is never trained and never
 * changes; its values are the weights file's, a checkpoint's or the ONNX
 * file's (external: psd refuses to start without them). Only the input's
 * batch size is read; no gradient flows anywhere. ---- */

static ps_status const_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = param_infer(ly, err);   /* shape against expand, outs; it sets a parameter ... */
    if (rc) return rc;
    ly->nparams = 0;                       /* ... which a Constant holds as a buffer instead */
    set_buffer(ly, ly->a.pname, ly->a.ndims, ly->a.dims, PS_DTYPE_F32, 0.0f);
    ly->buffer[ly->nbuffers - 1].external = 1;
    return PS_OK;
}

static ps_status const_forward(ps_layer_call *c, ps_err *err) {
    bcast b = param_bcast(c->ly);
    ps_status rc = PS_OK;
    for (int s = 0; s < c->n && rc == PS_OK; s++)
        for (int64_t o = 0; o < b.outer && rc == PS_OK; o++)
            rc = c->be->ops->copy2d(c->be->impl, 1, b.run, c->buf[0] + bcast_src(&b, o), b.run,
                                    (float *)c->y + s * b.numel + o * b.run, b.run, 0, err);
    return rc;
}

static ps_status const_backward(ps_layer_call *c, ps_err *err) {
    return c->dx ? c->be->ops->fill(c->be->impl, ps_layer_in_count(c->ly, 0, c->n), c->dx, 0.0f, err) : PS_OK;
}

/* ---- IndexSelect: x.index_select(dim, index) with a constant index list
 * (ONNX Gather of a computed value by constant indices); backward sums
 * dy into the selected positions (repeated indices add). ---- */

static ps_status index_select_infer(ps_layer *ly, ps_err *err) {
    int d;
    ps_status rc = need_dim_attr(ly, &d, err);
    if (rc) return rc;
    for (int i = 0; i < ly->a.ndims; i++)
        if (ly->a.dims[i] >= ly->in[0].dims[d])
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "index %lld is outside dim %lld of size %lld",
                              (long long)ly->a.dims[i], (long long)ly->a.dim, (long long)ly->in[0].dims[d]);
    ly->outs = ly->in[0];
    ly->outs.dims[d] = ly->a.ndims;
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* The input as (outer, D, inner) around the selected dim. */
static void index_select_geom(const ps_layer *ly, int n, int64_t *outer, int64_t *D, int64_t *inner) {
    int d = sample_dim(ly->a.dim, ly->in[0].ndim);
    *outer = n;
    *inner = 1;
    for (int k = 0; k < d; k++) *outer *= ly->in[0].dims[k];
    for (int k = d + 1; k < ly->in[0].ndim; k++) *inner *= ly->in[0].dims[k];
    *D = ly->in[0].dims[d];
}

static ps_status index_select_forward(ps_layer_call *c, ps_err *err) {
    int64_t outer, D, inner, K = c->ly->a.ndims;
    index_select_geom(c->ly, c->n, &outer, &D, &inner);
    ps_status rc = PS_OK;
    for (int64_t k = 0; k < K && rc == PS_OK; k++)
        rc = c->be->ops->copy2d(c->be->impl, outer, inner, (const float *)c->x + c->ly->a.dims[k] * inner, D * inner,
                                (float *)c->y + k * inner, K * inner, 0, err);
    return rc;
}

static ps_status index_select_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    int64_t outer, D, inner, K = c->ly->a.ndims;
    index_select_geom(c->ly, c->n, &outer, &D, &inner);
    ps_status rc = c->be->ops->fill(c->be->impl, ps_layer_in_count(c->ly, 0, c->n), c->dx, 0.0f, err);
    for (int64_t k = 0; k < K && rc == PS_OK; k++)
        rc = c->be->ops->copy2d(c->be->impl, outer, inner, c->dy + k * inner, K * inner,
                                c->dx + c->ly->a.dims[k] * inner, D * inner, 1, err);
    return rc;
}

/* ---- ChannelShuffle: nn.ChannelShuffle(groups), shufflenet's
 * channel_shuffle: (C, ...) viewed as (groups, C/groups, ...), the two
 * swapped: output channel i * groups + j is input channel j * (C/groups)
 * + i. Its backward is the shuffle with C/groups groups (the inverse
 * permutation). Plain layout; strided copies of whole channels. ---- */

static ps_status shuffle_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    if (ly->in[0].dims[0] % ly->a.groups)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%lld channels do not divide into %lld groups",
                          (long long)ly->in[0].dims[0], (long long)ly->a.groups);
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* dst = src shuffled with g groups: one copy per input channel (n rows of a
 * channel's elements) or one per (sample, group) (C/g rows), whichever
 * is fewer calls. */
static ps_status shuffle_copy(const ps_layer_call *c, const float *src, float *dst, int64_t g, ps_err *err) {
    int64_t C = c->ly->in[0].dims[0], inner = ps_shape_numel(&c->ly->in[0]) / C, cpg = C / g;
    const ps_backend_ops *ops = c->be->ops;
    ps_status rc = PS_OK;
    if (C <= (int64_t)c->n * g) {
        for (int64_t j = 0; j < g && rc == PS_OK; j++)
            for (int64_t i = 0; i < cpg && rc == PS_OK; i++)
                rc = ops->copy2d(c->be->impl, c->n, inner, src + (j * cpg + i) * inner, C * inner,
                                 dst + (i * g + j) * inner, C * inner, 0, err);
        return rc;
    }
    for (int64_t s = 0; s < c->n && rc == PS_OK; s++)
        for (int64_t j = 0; j < g && rc == PS_OK; j++)
            rc = ops->copy2d(c->be->impl, cpg, inner, src + (s * C + j * cpg) * inner, inner,
                             dst + (s * C + j) * inner, g * inner, 0, err);
    return rc;
}

static ps_status shuffle_forward(ps_layer_call *c, ps_err *err) {
    return shuffle_copy(c, c->x, c->y, c->ly->a.groups, err);
}

static ps_status shuffle_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return shuffle_copy(c, c->dy, c->dx, c->ly->in[0].dims[0] / c->ly->a.groups, err);
}

static const char *copy_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->copy2d ? NULL : "copy2d";
}

/* ---- Narrow: x.narrow(dim, start, length), one piece of x.chunk(k, dim)
 * or of ONNX's Split; with step, every step-th element from start
 * (x[..., start::step] of length elements: swin's patch merging takes
 * x[..., 0::2, 0::2, :]); backward puts dy back in place, zeros elsewhere.
 * Plain layout. ---- */

static ps_status narrow_infer(ps_layer *ly, ps_err *err) {
    int d;
    ps_status rc = need_dim_attr(ly, &d, err);
    if (rc) return rc;
    if (ly->a.length > 0 && ly->a.start + (ly->a.length - 1) * ly->a.step >= ly->in[0].dims[d])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "start %lld + (length %lld - 1) * step %lld is past dim %lld "
                          "of size %lld", (long long)ly->a.start, (long long)ly->a.length, (long long)ly->a.step,
                          (long long)ly->a.dim, (long long)ly->in[0].dims[d]);
    ly->outs = ly->in[0];
    ly->outs.dims[d] = ly->a.length;
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* One piece (step 1: one copy of L * inner floats a row) or L copies of inner floats each. to_x 0: x -> y;
 * 1: y -> x (the backward's dy into dx). */
static ps_status narrow_copy(const ps_layer_call *c, const float *src, float *dst, int to_x, ps_err *err) {
    int64_t outer, D, inner, L = c->ly->a.length, st = c->ly->a.step;
    index_select_geom(c->ly, c->n, &outer, &D, &inner);
    int64_t run = st == 1 ? L : 1, pieces = st == 1 ? 1 : L;
    ps_status rc = PS_OK;
    for (int64_t i = 0; i < pieces && rc == PS_OK; i++) {
        int64_t xo = (c->ly->a.start + i * st) * inner, yo = i * inner;
        rc = to_x ? c->be->ops->copy2d(c->be->impl, outer, run * inner, src + yo, L * inner, dst + xo, D * inner, 0,
                                       err)
                  : c->be->ops->copy2d(c->be->impl, outer, run * inner, src + xo, D * inner, dst + yo, L * inner, 0,
                                       err);
    }
    return rc;
}

static ps_status narrow_forward(ps_layer_call *c, ps_err *err) {
    return narrow_copy(c, c->x, c->y, 0, err);
}

static ps_status narrow_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    ps_status rc = PS_OK;
    if (c->ly->a.length < c->ly->in[0].dims[sample_dim(c->ly->a.dim, c->ly->in[0].ndim)])
        rc = c->be->ops->fill(c->be->impl, ps_layer_in_count(c->ly, 0, c->n), c->dx, 0.0f, err);
    return rc ? rc : narrow_copy(c, c->dy, c->dx, 1, err);
}

/* ---- Permute: torch.permute(x, dims) / torchvision's Permute(dims) -
 * each sample's dimensions reordered, PyTorch's dims (the batch counted as
 * 0, negatives from the end) with the batch kept at 0. Plain layout (flags
 * 0: the executor reorders a blocked input first); the backward permutes
 * the gradient back. ---- */

/* "[0, 2, 3, 1]" of the dims as written. */
static const char *perm_text(const ps_layer *ly, char *buf, size_t cap) {
    return ps_dims_format_as(buf, cap, ly->a.perm, ly->a.nperm, "[", ", ", "]");
}

static ps_status permute_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_shape *in = &ly->in[0];
    const int full = in->ndim + 1;
    char b1[64], b2[64];
    if (ly->a.nperm != full)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dims %s has %d entries but the batched input %s has %d "
                          "dimensions", perm_text(ly, b1, sizeof b1), ly->a.nperm,
                          ps_dims_format_batch(b2, sizeof b2, in->dims, in->ndim), full);
    int seen[PS_SHAPE_MAX_DIMS + 1] = {0}, perm[PS_SHAPE_MAX_DIMS + 1] = {0};
    for (int k = 0; k < full; k++) {
        int64_t d = ly->a.perm[k];
        if (d < -full || d >= full)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dims %s: %lld is not a dimension of the batched input "
                              "(%d..%d)", perm_text(ly, b1, sizeof b1), (long long)d, -full, full - 1);
        perm[k] = (int)(d < 0 ? d + full : d);
        if (seen[perm[k]]++)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dims %s is not a permutation: dimension %d appears "
                              "twice", perm_text(ly, b1, sizeof b1), perm[k]);
    }
    if (perm[0] != 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dims %s moves the batch: dims[0] must be 0 (psd permutes "
                          "each sample's dimensions)", perm_text(ly, b1, sizeof b1));
    ly->outs.ndim = in->ndim;
    for (int k = 0; k < in->ndim; k++) ly->outs.dims[k] = in->dims[perm[k + 1] - 1];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* The forward's permutation of n samples (a one-value sample: the identity on one dim). */
static ps_permute_desc permute_desc(const ps_layer *ly, int n) {
    ps_permute_desc d = {.n = n, .ndim = ly->in[0].ndim ? ly->in[0].ndim : 1};
    const int full = ly->in[0].ndim + 1;
    d.dims[0] = 1;
    for (int k = 0; k < ly->in[0].ndim; k++) {
        int64_t p = ly->a.perm[k + 1];
        d.dims[k] = ly->in[0].dims[k];
        d.perm[k] = (int)(p < 0 ? p + full : p) - 1;
    }
    return d;
}

static const char *permute_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->permute ? NULL : "permute";
}

static ps_status permute_forward(ps_layer_call *c, ps_err *err) {
    ps_permute_desc d = permute_desc(c->ly, c->n);
    return c->be->ops->permute(c->be->impl, &d, c->x, c->y, err);
}

static ps_status permute_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    ps_permute_desc f = permute_desc(c->ly, c->n), d = ps_permute_inverse(&f);
    return c->be->ops->permute(c->be->impl, &d, c->dy, c->dx, err);
}

/* ---- Scale: x * p, a learned tensor p (`shape`; its state_dict suffix
 * `parameter`, default weight) broadcast over each sample by numpy's rule:
 * ConvNeXt's layer scale, `self.layer_scale * x` with layer_scale (C, 1, 1)
 * on (C, H, W). Right-aligned with the sample (a leading 1 may face the
 * batch), p's dims are 1s, then the sample's own, then 1s: the sample is
 * (outer, q, inner) and p has q values. Plain layout. Forward: each row of
 * a (n * outer, q) matrix of p's values (ones (n*outer, 1) times p^T, exact)
 * multiplies an inner run (mul_channels); backward: dx the same way, dp
 * the sum over samples, outer and inner of dy * x (products with vectors
 * of ones). Param: ones. ---- */

typedef struct scale_geom {
    int64_t outer, q, inner;
} scale_geom;

/* The geometry; *ok 0 when p does not broadcast so. */
static scale_geom scale_shape(const ps_layer *ly, int *ok) {
    const ps_shape *in = &ly->in[0];
    scale_geom g = {1, 1, 1};
    int64_t p[PS_SHAPE_MAX_DIMS + 1];
    int np = ly->a.ndims, nd = in->ndim;
    *ok = np <= nd + 1 && (np <= nd || ly->a.dims[0] == 1);
    if (!*ok) return g;
    for (int k = 0; k < nd; k++) {   /* right-aligned, 1 where p has no dim */
        int j = k - (nd - np);
        p[k] = j >= 0 ? ly->a.dims[j] : 1;
    }
    int f = 0, l = nd - 1;
    while (f < nd && p[f] == 1) f++;
    while (l >= f && p[l] == 1) l--;
    for (int k = 0; k < nd; k++) {
        if (k >= f && k <= l && p[k] != in->dims[k]) *ok = 0;
        if (k < f) g.outer *= in->dims[k];
        else if (k <= l) g.q *= in->dims[k];
        else g.inner *= in->dims[k];
    }
    if (f == nd) { g.inner = g.outer; g.outer = 1; }   /* one value: over the whole sample */
    return g;
}

static ps_status scale_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 0, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    int ok;
    scale_shape(ly, &ok);
    if (!ok) {
        char b1[64], b2[64];
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "shape %s does not broadcast over the input %s as Scale "
                          "takes it (right-aligned: 1s, then the input's own dimensions, then 1s, as (C, 1, 1) "
                          "over (C, H, W))", ps_dims_format_as(b1, sizeof b1, ly->a.dims, ly->a.ndims, "[", ", ", "]"),
                          ps_shape_format(&ly->in[0], b2, sizeof b2));
    }
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    set_param(ly, 0, ly->a.pname, ly->a.ndims, ly->a.dims, 1, ONES);
    return PS_OK;
}

static const char *scale_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->mul && ops->mul_channels && ops->linear_forward && ops->linear_backward && ops->fill
               ? NULL : "mul/mul_channels/linear_forward/linear_backward/fill";
}

/* The (rows, q) matrix of p's values, one row per (sample, outer index), into *mask (and the ones into *ones). */
static ps_status scale_rows(ps_layer_call *c, const scale_geom *g, float **mask, float **ones, ps_err *err) {
    const int64_t rows = (int64_t)c->n * g->outer;
    if (rows > INT32_MAX || g->q > INT32_MAX || g->inner > INT32_MAX || rows * g->q > INT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: Scale of %lld rows of %lld by %lld is too large",
                          c->ly->name, (long long)rows, (long long)g->q, (long long)g->inner);
    *mask = ps_backend_alloc_floats(c->be, rows * g->q);
    *ones = ps_backend_alloc_floats(c->be, rows > g->inner ? rows : g->inner);
    if (!*mask || !*ones) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", c->ly->name);
    ps_linear_desc ld = {(int)rows, 1, (int)g->q};
    ps_status rc = c->be->ops->fill(c->be->impl, rows > g->inner ? rows : g->inner, *ones, 1.0f, err);
    return rc ? rc : c->be->ops->linear_forward(c->be->impl, &ld, *ones, c->w[0], NULL, *mask, err);
}

static ps_status scale_forward(ps_layer_call *c, ps_err *err) {
    int ok;
    scale_geom g = scale_shape(c->ly, &ok);
    float *mask = NULL, *ones = NULL;
    ps_status rc = scale_rows(c, &g, &mask, &ones, err);
    if (rc == PS_OK) {
        ps_chan_desc d = {.n = (int)(c->n * g.outer), .c = (int)g.q, .s = g.inner, .layout = PS_LAYOUT_PLAIN};
        rc = c->be->ops->mul_channels(c->be->impl, &d, c->x, mask, c->y, err);
    }
    ps_backend_release(c->be, mask);
    ps_backend_release(c->be, ones);
    return rc;
}

static ps_status scale_backward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    int ok;
    scale_geom g = scale_shape(c->ly, &ok);
    const int64_t rows = (int64_t)c->n * g.outer, count = ps_layer_out_count(c->ly, c->n);
    float *mask = NULL, *ones = NULL, *prod = NULL, *sums = NULL;
    ps_status rc = scale_rows(c, &g, &mask, &ones, err);
    if (rc == PS_OK && c->dx) {
        ps_chan_desc d = {.n = (int)rows, .c = (int)g.q, .s = g.inner, .layout = PS_LAYOUT_PLAIN};
        rc = ops->mul_channels(c->be->impl, &d, c->dy, mask, c->dx, err);
    }
    if (rc == PS_OK && c->dw[0]) {
        prod = ps_backend_alloc_floats(c->be, count);
        sums = g.inner > 1 ? ps_backend_alloc_floats(c->be, rows * g.q) : prod;
        if (!prod || !sums) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", c->ly->name);
        if (rc == PS_OK) rc = ops->mul(c->be->impl, count, c->dy, c->x, prod, err);
        if (rc == PS_OK && g.inner > 1) {   /* (rows * q, inner) . ones (inner) */
            ps_linear_desc ld = {(int)(rows * g.q), (int)g.inner, 1};
            rc = ops->linear_forward(c->be->impl, &ld, prod, ones, NULL, sums, err);
        }
        if (rc == PS_OK) {   /* dp (q, 1) = sums (rows, q)^T . ones (rows, 1) */
            ps_linear_desc ld = {(int)rows, 1, (int)g.q};
            rc = ops->linear_backward(c->be->impl, &ld, ones, c->w[0], sums, NULL, c->dw[0], NULL, err);
        }
    }
    if (sums != prod) ps_backend_release(c->be, sums);
    ps_backend_release(c->be, prod);
    ps_backend_release(c->be, mask);
    ps_backend_release(c->be, ones);
    return rc;
}

/* ---- MultiheadAttention: nn.MultiheadAttention(embed_dim, num_heads,
 * dropout, bias, batch_first=True) as self-attention, attn(x, x, x,
 * need_weights=False) with no mask, or with causal the causal attn_mask
 * (key j > query i masked: torch.triu(ones(L, L), 1) as bool, or -inf
 * there as nn.Transformer.generate_square_subsequent_mask writes it): x
 * (L, E) per sample, H heads of D = E/H; with a second input, the key
 * padding mask (L) per sample (PyTorch's key_padding_mask (N, S), computed
 * from the ids by Eq: key_padding_mask 'bool', a nonzero value masks the
 * key; 'float', the value is added to its scores). Forward, for the n
 * samples at once:
 *   q, k, v = x W_j^T + b_j, W_j rows jE..jE+E-1 of in_proj_weight (j = 0,
 *             1, 2), each (n, L, E) permuted to (n, H, L, D)
 *   P = softmax(q k^T / sqrt(D)) over the last dim, (n, H, L, L); with
 *       causal the scores of j > i are -inf first (P 0 there), with a
 *       bool key padding mask those of the masked keys j of every query
 *       (a float one is added). A sample one of whose queries would
 *       attend to no key (every key masked; with causal, key 0) is
 *       refused: PyTorch 1.13 gives NaN there (mha_check_keys).
 *   A = P * mask (dropout on the attention weights in training: the mask
 *       of Dropout's draws, one per element of P), else P
 *   o = A v, (n, H, L, D) permuted back to (n, L, E); y = o W_o^T + b_o
 * Backward: d o from y's linear; dA = d o v^T, dv = A^T d o; dP = dA * mask;
 * dS = softmax's backward of dP; dq = dS k / sqrt(D), dk = dS^T q / sqrt(D);
 * each of dq, dk, dv permuted back and through its linear (dx their sum).
 * The products are the backend's matmul (the scale 1/sqrt(D) applied after
 * the product). The tape keeps the mask (dev[0]), q, k, v (dev[1..3]), P
 * (dev[4]) and o (dev[5]), each its own block and sample-major, so that a
 * combined forward's tape cuts into each caller's (mha_saved).
 * Params (state_dict order, PyTorch's): in_proj_weight (3E, E) xavier
 * uniform, in_proj_bias (3E) zeros, out_proj.weight (E, E) U(+-1/sqrt(E)),
 * out_proj.bias (E) zeros; without bias only the two weights.
 * Cross-attention (cross: true; nn.TransformerDecoderLayer's
 * multihead_attn(x, memory, memory)): q from input 0 (L, E), k and v from
 * input 1, the memory (S, E) of another length; a third input is the
 * memory's key padding mask (S). The same steps with P (n, H, L, S); the
 * backward's dq goes to input 0, dk + dv to the memory. Not with causal. ---- */

typedef struct mha_geom {
    int n, L, Lk, E, H, D;      /* L queries; Lk keys and values (L, but with cross the memory's length) */
    int64_t nle, nke, p;        /* n*L*E (q, o), n*Lk*E (k, v), n*H*L*Lk (P) */
    int wo, bi, bo;             /* parameter indices: out_proj.weight, in_proj_bias, out_proj.bias (-1: none) */
    int kv, km;                 /* input indices: the keys' and values' (1 with cross, else 0), the key padding
                                   mask's (-1: none) */
} mha_geom;

static mha_geom mha_of(const ps_layer *ly, int n) {
    mha_geom g;
    g.n = n;
    g.kv = ly->a.cross ? 1 : 0;
    g.km = ly->nin > 1 + g.kv ? 1 + g.kv : -1;
    g.L = (int)ly->in[0].dims[0];
    g.Lk = ly->nin > g.kv && ly->in[g.kv].ndim >= 1 ? (int)ly->in[g.kv].dims[0] : g.L;
    g.E = (int)ly->a.out;
    g.H = (int)ly->a.num;
    g.D = g.E / g.H;
    g.nle = (int64_t)n * g.L * g.E;
    g.nke = (int64_t)n * g.Lk * g.E;
    g.p = (int64_t)n * g.H * g.L * g.Lk;
    g.bi = ly->a.bias ? 1 : -1;
    g.wo = ly->a.bias ? 2 : 1;
    g.bo = ly->a.bias ? 3 : -1;
    return g;
}

static ps_status mha_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 2, 2, PS_DTYPE_F32, err);
    if (rc) return rc;
    const int64_t E = ly->a.out, H = ly->a.num;
    if (!ly->a.mode)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "batch_first is false: psd's batch is the first dimension, "
                          "so the input must be (N, L, E) (batch_first: true)");
    if (ly->in[0].dims[1] != E)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "embed_dim is %lld but the input's last dimension is %lld",
                          (long long)E, (long long)ly->in[0].dims[1]);
    if (E % H)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "embed_dim %lld is not divisible by num_heads %lld",
                          (long long)E, (long long)H);
    if (ly->in[0].dims[0] > 65536 || E > 65536)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "a sequence or embedding longer than 65536");
    if (ly->a.cross) {   /* the keys and values: the memory, (S, E) per sample */
        char b[64];
        const char *nm = ly->def && ly->nin > 1 ? ly->def->in_names[1] : "memory";
        if (ly->nin < 2)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "cross is true but the node has one input: "
                              "cross-attention reads the queries (input 0) and the memory its keys and values "
                              "come from (input 1; a key padding mask of the memory third)");
        if (ly->in_dtype[1] != PS_DTYPE_F32 || ly->in[1].ndim != 2 || ly->in[1].dims[1] != E)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "the memory '%s' is %s %s per sample; cross-attention "
                              "reads (S, %lld) float32 keys and values (embed_dim %lld)", nm,
                              ps_shape_format(&ly->in[1], b, sizeof b), ps_dtype_name(ly->in_dtype[1]),
                              (long long)E, (long long)E);
        if (ly->in[1].dims[0] > 65536)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "a memory longer than 65536");
        if (ly->a.causal)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "causal with cross: the causal mask is a "
                              "self-attention's (nn.Transformer's tgt_mask); its memory_mask is not taken");
    } else if (ly->nin == 3) {
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "three inputs without cross: self-attention reads its "
                          "input and a key padding mask (cross: true reads queries, memory and its mask)");
    }
    const mha_geom g = mha_of(ly, 1);
    if (g.km >= 0) {   /* the key padding mask: one value per key */
        char b[64];
        const char *nm = ly->def ? ly->def->in_names[g.km] : "mask";
        if (ly->in_dtype[g.km] != PS_DTYPE_F32 || ly->in[g.km].ndim != 1 || ly->in[g.km].dims[0] != g.Lk)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "the key padding mask '%s' is %s %s per sample; it must "
                              "be (%d) float32, one value per key (PyTorch's key_padding_mask (N, S), S = the "
                              "%s's %d tokens; compute it from the ids with Eq)", nm,
                              ps_shape_format(&ly->in[g.km], b, sizeof b), ps_dtype_name(ly->in_dtype[g.km]),
                              g.Lk, ly->a.cross ? "memory" : "input", g.Lk);
        if (ly->a.kpm_float && ly->a.causal)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "key_padding_mask 'float' with causal: PyTorch 1.13 "
                              "reads a float key_padding_mask beside a bool causal attn_mask as bool (nonzero "
                              "masked) and refuses it beside a float one; use key_padding_mask 'bool'");
    }
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    const float bound = sqrtf(6.0f / (float)(4 * E));   /* xavier_uniform_ of (3E, E) */
    const ps_init xavier = {PS_INIT_UNIFORM, -bound, bound, 0};
    int64_t wi[2] = {3 * E, E}, bi[1] = {3 * E}, wo[2] = {E, E}, bo[1] = {E};
    set_param(ly, 0, "in_proj_weight", 2, wi, E, xavier);
    if (g.bi >= 0) set_param(ly, g.bi, "in_proj_bias", 1, bi, E, ZEROS);
    set_param(ly, g.wo, "out_proj.weight", 2, wo, E, FAN_UNIFORM);
    if (g.bo >= 0) set_param(ly, g.bo, "out_proj.bias", 1, bo, E, ZEROS);
    return PS_OK;
}

static const char *mha_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    const int km = mha_of(ly, 1).km >= 0;
    return !ops->matmul ? "matmul" : !ops->permute ? "permute" : !ops->softmax_forward ? "softmax_forward"
         : !ops->softmax_backward ? "softmax_backward" : !ops->add ? "add" : !ops->scale ? "scale"
         : ly->a.causal && !ops->tri_fill ? "tri_fill" : km && !ops->key_pad ? "key_pad"
         : km && !ops->copy_to_host ? "copy_to_host" : NULL;
}

/* (n, L, H, D) <-> (n, H, L, D) for L tokens (the queries' or the keys'): the heads out of the embedding and
 * back */
static ps_status mha_heads(const ps_layer_call *c, const mha_geom *g, int L, int back, const float *x, float *y,
                           ps_err *err) {
    ps_permute_desc d = {.n = g->n, .ndim = 3, .perm = {1, 0, 2}};
    d.dims[0] = back ? g->H : L;
    d.dims[1] = back ? L : g->H;
    d.dims[2] = g->D;
    return c->be->ops->permute(c->be->impl, &d, x, y, err);
}

/* out = alpha * op(a) op(b) for each of the n*H heads */
static ps_status mha_matmul(const ps_layer_call *c, const mha_geom *g, int m, int nn, int k, int ta, int tb, float alpha,
                         const float *a, const float *b, float *out, ps_err *err) {
    ps_matmul_desc d = {(int64_t)g->n * g->H, m, nn, k, ta, tb};
    ps_status rc = c->be->ops->matmul(c->be->impl, &d, a, b, out, err);
    if (rc == PS_OK && alpha != 1.0f) rc = c->be->ops->scale(c->be->impl, d.batch * m * nn, out, alpha, err);
    return rc;
}

/* causal: the scores of key j > query i set to -inf before the softmax (attn_mask the causal mask: its
 * weights exactly 0, so the softmax's backward gives them no gradient and the backward needs nothing more) */
static ps_status mha_causal(const ps_layer_call *c, const mha_geom *g, float *S, ps_err *err) {
    const ps_tri_desc d = {.batch = (int64_t)g->n * g->H, .rows = g->L, .cols = g->Lk, .upper = 1, .diagonal = 1,
                           .value = -INFINITY};
    return c->be->ops->tri_fill(c->be->impl, &d, S, S, err);
}

/* The key padding mask of the call's samples (mask (n, L), device
 * memory): each query must attend to some key. A bool mask masks a
 * nonzero key, a float one a key whose value is -inf; without causal some
 * key of the sample must be left, with causal key 0 (query 0 attends to it
 * alone). PyTorch 1.13 gives NaN for such a query's output (and NaN
 * gradients to every parameter); psd refuses the Forward naming the
 * sample, so that one empty sequence does not poison a step. */
static ps_status mha_check_keys(const ps_layer_call *c, const mha_geom *g, const float *mask, ps_err *err) {
    const int64_t count = (int64_t)g->n * g->Lk;
    float *host = (float *)mask;
    if (c->be->ops->device_kind) {
        if (!(host = malloc((size_t)(count ? count : 1) * sizeof(float))))
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", c->ly->name);
        ps_status rc = c->be->ops->copy_to_host(c->be->impl, host, mask, (size_t)count * sizeof(float), err);
        if (rc != PS_OK) { free(host); return rc; }
    }
    ps_status rc = PS_OK;
    const int isf = c->ly->a.kpm_float;
    for (int b = 0; b < g->n && rc == PS_OK; b++) {
        const float *m = host + (int64_t)b * g->Lk;
        int left = 0;
        for (int j = 0; j < (c->ly->a.causal ? 1 : g->Lk) && !left; j++) left = isf ? m[j] != -INFINITY : m[j] == 0.0f;
        if (left) continue;
        if (c->ly->a.causal && g->L > 1)
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "node '%s' (MultiheadAttention): sample %d: its key padding "
                            "mask masks key 0 and causal is true, so query 0 attends to no key (PyTorch 1.13 gives "
                            "NaN there; pad on the right, or keep token 0 unmasked)", c->ly->name, b);
        else
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "node '%s' (MultiheadAttention): sample %d: its key padding "
                            "mask masks all %d keys, so its queries attend to no key (PyTorch 1.13 gives NaN there; "
                            "a sequence needs one token that is not padding)", c->ly->name, b, g->Lk);
    }
    if (host != mask) free(host);
    return rc;
}

/* the key padding mask (n, Lk) applied to the scores S (n, H, L, Lk) */
static ps_status mha_key_pad(const ps_layer_call *c, const mha_geom *g, float *S, ps_err *err) {
    const ps_keypad_desc d = {.batch = g->n, .heads = g->H, .rows = g->L, .cols = g->Lk,
                              .additive = c->ly->a.kpm_float};
    return c->be->ops->key_pad(c->be->impl, &d, (const float *)c->xs[g->km], S, err);
}

static ps_status mha_forward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    const mha_geom g = mha_of(c->ly, c->n);
    const float s = 1.0f / sqrtf((float)g.D);
    const int drop = c->train && c->ly->a.p > 0;
    /* tmp: the three projections (nle, 2 nke), the scores (p), the heads' output (nle); kept: q, k, v, P, o */
    float *tmp = ps_backend_alloc_floats(c->be, 2 * g.nle + 2 * g.nke + g.p);
    float *kept[5] = {ps_backend_alloc_floats(c->be, g.nle), ps_backend_alloc_floats(c->be, g.nke),
                      ps_backend_alloc_floats(c->be, g.nke), ps_backend_alloc_floats(c->be, g.p),
                      ps_backend_alloc_floats(c->be, g.nle)};
    ps_status rc = PS_OK;
    if (!tmp || !kept[0] || !kept[1] || !kept[2] || !kept[3] || !kept[4]) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", c->ly->name);
        goto out;
    }
    if (g.km >= 0 && (rc = mha_check_keys(c, &g, (const float *)c->xs[g.km], err)) != PS_OK) goto out;
    float *q = kept[0], *k = kept[1], *v = kept[2], *P = kept[3], *o = kept[4];
    float *proj[3] = {tmp, tmp + g.nle, tmp + g.nle + g.nke};
    float *S = tmp + g.nle + 2 * g.nke, *oh = S + g.p;
    for (int j = 0; j < 3 && rc == PS_OK; j++) {   /* q from input 0; k, v from input kv (the memory, or 0) */
        const int rows = j ? g.Lk : g.L;
        const ps_linear_desc ld = {g.n * rows, g.E, g.E};
        rc = ops->linear_forward(c->be->impl, &ld, j ? c->xs[g.kv] : c->x, c->w[0] + (int64_t)j * g.E * g.E,
                                 g.bi >= 0 ? c->w[g.bi] + (int64_t)j * g.E : NULL, proj[j], err);
        if (rc == PS_OK) rc = mha_heads(c, &g, rows, 0, proj[j], kept[j], err);
    }
    if (rc == PS_OK) rc = mha_matmul(c, &g, g.L, g.Lk, g.D, 0, 1, s, q, k, S, err);
    if (rc == PS_OK && c->ly->a.causal) rc = mha_causal(c, &g, S, err);
    if (rc == PS_OK && g.km >= 0) rc = mha_key_pad(c, &g, S, err);
    if (rc == PS_OK) rc = ops->softmax_forward(c->be->impl, g.p / g.Lk, g.Lk, S, P, err);
    const float *A = P;
    if (rc == PS_OK && drop) {
        float *mask, *host;
        if ((rc = mask_begin(c, g.p, &mask, &host, "attention dropout", err)) != PS_OK) goto out;
        if (c->mask) memcpy(host, c->mask, (size_t)g.p * sizeof(float));
        else drop_draws(c->ly, c->rng, host, g.p);
        if ((rc = mask_end(c, mask, host, g.p, err)) == PS_OK) rc = ops->mul(c->be->impl, g.p, P, mask, S, err);
        A = S;
    }
    if (rc == PS_OK) rc = mha_matmul(c, &g, g.L, g.D, g.Lk, 0, 0, 1.0f, A, v, oh, err);
    if (rc == PS_OK) rc = mha_heads(c, &g, g.L, 1, oh, o, err);
    const ps_linear_desc lo = {g.n * g.L, g.E, g.E};
    if (rc == PS_OK)
        rc = ops->linear_forward(c->be->impl, &lo, o, c->w[g.wo], g.bo >= 0 ? c->w[g.bo] : NULL, c->y, err);
    if (rc == PS_OK && c->train) {   /* the tape frees them */
        for (int j = 0; j < 5; j++) {
            c->saved->dev[1 + j] = kept[j];
            kept[j] = NULL;
        }
    }
out:
    ps_backend_release(c->be, tmp);
    for (int j = 0; j < 5; j++) ps_backend_release(c->be, kept[j]);
    return rc;
}

/* Backward of one of a kind's linears over rows rows a sample (x (n*rows,
 * in), w (out, in), dy (n*rows, out)): dx (NULL: not wanted) for all the
 * call's samples at once, and the gradients of its weight and bias -
 * parameters jw and jb (-1: none), at float offsets ow and ob into them -
 * from the call's samples, or in a combined backward (c->parts) each
 * part's from its own rows into its own. */
static ps_status linear_backward_parts(const ps_layer_call *c, int rows, int in, int out, const float *x,
                                       const float *w, const float *dy, float *dx, int jw, int64_t ow, int jb,
                                       int64_t ob, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    const ps_layer_parts *pt = c->parts;
    if (!pt) {
        const ps_linear_desc ld = {c->n * rows, in, out};
        return ops->linear_backward(c->be->impl, &ld, x, w, dy, dx, c->dw[jw] ? c->dw[jw] + ow : NULL,
                                    jb >= 0 && c->dw[jb] ? c->dw[jb] + ob : NULL, err);
    }
    ps_status rc = PS_OK;
    if (dx) {
        const ps_linear_desc ld = {c->n * rows, in, out};
        rc = ops->linear_backward(c->be->impl, &ld, x, w, dy, dx, NULL, NULL, err);
    }
    for (int p = 0; p < pt->k && rc == PS_OK; p++) {
        float *const *dw = pt->dw + (size_t)p * PS_LAYER_MAX_PARAMS;
        const int64_t r0 = (int64_t)pt->off[p] * rows;
        const ps_linear_desc ld = {pt->n[p] * rows, in, out};
        rc = ops->linear_backward(c->be->impl, &ld, x + r0 * in, w, dy + r0 * out, NULL, dw[jw] ? dw[jw] + ow : NULL,
                                  jb >= 0 && dw[jb] ? dw[jb] + ob : NULL, err);
    }
    return rc;
}

/* In a combined backward (c->parts) the attention's backward runs once for
 * every part's samples - all of it is per sample - and only the four
 * linears' parameter gradients are computed part by part
 * (linear_backward_parts). */
static ps_status mha_backward(ps_layer_call *c, ps_err *err) {
    const ps_backend_ops *ops = c->be->ops;
    const mha_geom g = mha_of(c->ly, c->n);
    const float s = 1.0f / sqrtf((float)g.D);
    const float *mask = c->saved->dev[0], *q = c->saved->dev[1], *k = c->saved->dev[2], *v = c->saved->dev[3];
    const float *P = c->saved->dev[4], *o = c->saved->dev[5];
    if (!q || !k || !v || !P || !o)
        return ps_err_set(err, PS_ERR_INTERNAL, "%s: backward without a training forward", c->ly->name);
    if (g.km >= 0 && c->dxs && c->dxs[g.km]) {   /* the key padding mask: a bool one has no gradient */
        if (c->ly->a.kpm_float)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: the float key padding mask '%s' needs a gradient, "
                              "which psd does not compute (compute the mask from the int64 ids: Eq)", c->ly->name,
                              c->ly->def ? c->ly->def->in_names[g.km] : "mask");
        ps_status rc0 = ops->fill(c->be->impl, (int64_t)g.n * g.Lk, c->dxs[g.km], 0.0f, err);
        if (rc0 != PS_OK) return rc0;
    }
    /* where each projection's input gradient goes: q's to dx; with cross k's and v's to the memory's (k
     * writes, v adds), else both added to dx (NULL: not wanted) */
    float *dkv = g.kv ? (c->dxs ? c->dxs[g.kv] : NULL) : c->dx;
    const int64_t nmax = g.nle > g.nke ? g.nle : g.nke;
    /* tmp: d o (nle, then its heads' form), the three gradients in heads' form (nle, 2 nke) and back (the
     * larger), A or dA (p), dS (p), an input gradient's part (nke) */
    float *tmp = ps_backend_alloc_floats(c->be, 3 * g.nle + 3 * g.nke + nmax + 2 * g.p);
    if (!tmp) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", c->ly->name);
    float *d_o = tmp, *doh = d_o + g.nle, *dq = doh + g.nle, *dk = dq + g.nle, *dv = dk + g.nke,
          *dback = dv + g.nke, *dA = dback + nmax, *dS = dA + g.p, *dxp = dS + g.p;
    float *dheads[3] = {dq, dk, dv};
    ps_status rc = linear_backward_parts(c, g.L, g.E, g.E, o, c->w[g.wo], c->dy, d_o, g.wo, 0, g.bo, 0, err);
    if (rc == PS_OK) rc = mha_heads(c, &g, g.L, 0, d_o, doh, err);
    const float *A = P;
    if (rc == PS_OK && mask) {
        rc = ops->mul(c->be->impl, g.p, P, mask, dA, err);
        A = dA;
    }
    if (rc == PS_OK) rc = mha_matmul(c, &g, g.Lk, g.D, g.L, 1, 0, 1.0f, A, doh, dv, err);
    if (rc == PS_OK) rc = mha_matmul(c, &g, g.L, g.Lk, g.D, 0, 1, 1.0f, doh, v, dA, err);
    if (rc == PS_OK && mask) rc = ops->mul(c->be->impl, g.p, dA, mask, dA, err);
    if (rc == PS_OK) rc = ops->softmax_backward(c->be->impl, g.p / g.Lk, g.Lk, P, dA, dS, err);
    if (rc == PS_OK) rc = mha_matmul(c, &g, g.L, g.D, g.Lk, 0, 0, s, dS, k, dq, err);
    if (rc == PS_OK) rc = mha_matmul(c, &g, g.Lk, g.D, g.L, 1, 0, s, dS, q, dk, err);
    for (int j = 0; j < 3 && rc == PS_OK; j++) {
        const int rows = j ? g.Lk : g.L;
        const int64_t cnt = j ? g.nke : g.nle;
        if ((rc = mha_heads(c, &g, rows, 1, dheads[j], dback, err)) != PS_OK) break;
        float *dst = j ? dkv : c->dx;
        const int first = j == 0 || (g.kv && j == 1);   /* writes its input's gradient; the others add */
        float *dx = !dst ? NULL : first ? dst : dxp;
        rc = linear_backward_parts(c, rows, g.E, g.E, j ? c->xs[g.kv] : c->x, c->w[0] + (int64_t)j * g.E * g.E,
                                   dback, dx, 0, (int64_t)j * g.E * g.E, g.bi, (int64_t)j * g.E, err);
        if (rc == PS_OK && dx == dxp) rc = ops->add(c->be->impl, cnt, dst, dxp, err);
    }
    ps_backend_release(c->be, tmp);
    return rc;
}

static size_t mha_bytes(const ps_layer *ly, int n) {
    const mha_geom g = mha_of(ly, n);
    return (size_t)((ly->a.p > 0 ? g.p : 0) + 2 * g.nle + 2 * g.nke + g.p) * sizeof(float);
}

static double mha_flops(const ps_layer *ly) {
    const mha_geom g = mha_of(ly, 1);
    const double L = g.L, Lk = g.Lk, E = g.E;
    return 4.0 * L * E * E + 4.0 * Lk * E * E + 4.0 * L * Lk * E;
}

/* ---- Eq: ids == value (torch.eq(ids, pad), ids.eq(pad)) for int64 token
 * ids and a constant, the pad id: a float32 mask of the ids' shape, 1 where
 * equal, 0 elsewhere - MultiheadAttention's key padding mask computed from
 * the ids the stage reads (PyTorch's bool key_padding_mask, True = 1). The
 * ids take no gradient, so neither does the mask: its backward has nothing
 * to compute. ---- */

static ps_status eq_infer(ps_layer *ly, ps_err *err) {
    char b[64];
    if (ly->in_dtype[0] != PS_DTYPE_I64)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "per-sample input %s %s; Eq compares int64 token ids with "
                          "a constant (the pad id)", ps_shape_format(&ly->in[0], b, sizeof b),
                          ps_dtype_name(ly->in_dtype[0]));
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *eq_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->eq_const ? NULL : "eq_const";
}

static ps_status eq_forward(ps_layer_call *c, ps_err *err) {
    return c->be->ops->eq_const(c->be->impl, ps_layer_out_count(c->ly, c->n), (const int64_t *)c->x,
                                c->ly->a.eq_value, c->y, err);
}

static ps_status eq_backward(ps_layer_call *c, ps_err *err) {
    (void)c; (void)err;
    return PS_OK;
}

/* ---- MatMul: torch.matmul(a, b), each sample a stack of matrices:
 * (..., m, k) @ (..., k, n) -> (..., m, n) with numpy's broadcasting of the
 * leading (batch) dims: right-aligned, a dim of 1 faces any size (the two
 * computed operands have one rank, so that the batch faces the batch). With
 * `parameter`, one operand is a learned tensor of the node (`x @ self.W`,
 * right; `self.W @ x`, parameter_side left) of `shape`, right-aligned
 * against the other's dims and the same for every sample: the backend reads
 * its one copy for every matrix it faces (ps_matmul_desc bcast_a/_b), never
 * a per-sample copy. transpose_a / transpose_b read an operand's last two
 * dims swapped in place (q @ k^T; x @ W.t()).
 *
 * The output's batch dims, the sample's first, are merged into runs where
 * each operand is alike (indexed, or broadcast: its same matrices again);
 * each run but the last is a loop, the last one backend call over its
 * matrices. A broadcast right operand over the last run with a plain left
 * one folds into the rows: (R, m, k) @ (k, n) is one (R*m, k) @ (k, n)
 * product - x @ W over the whole batch is one GEMM, and W's gradient
 * (R*m, k)^T . (R*m, n) sums over the batch inside it. Otherwise a
 * broadcast operand's gradient is summed by accumulating products
 * (ps_matmul_desc accumulate), one per matrix it faced. A vector per
 * sample times a parameter on the right (x (N, k) @ W (k, n), a custom
 * linear layer) is one (N, k) @ (k, n) product. Plain layout. ---- */

typedef struct mm_geom {
    int m, n, k, ta, tb;
    int nr;                                  /* runs of the output's batch dims (the sample's included) */
    int64_t len[PS_SHAPE_MAX_DIMS + 1];      /* matrices along run r */
    int64_t st[3][PS_SHAPE_MAX_DIMS + 1];    /* a, b, c: elements between consecutive matrices along run r
                                                (0: broadcast along it) */
} mm_geom;

/* The operand that is the parameter (0: a, 1: b), or -1. */
static int mm_param_operand(const ps_layer *ly) {
    return ly->a.pname ? (ly->a.mm_left ? 0 : 1) : -1;
}

/* Operand i's dims, the batch's first (0 for the batch: the samples), right-aligned to nd dims with 1s; the
 * parameter faces the batch with 1. */
static void mm_operand_dims(const ps_layer *ly, int i, int nd, int64_t *d) {
    const int p = mm_param_operand(ly);
    const int64_t *src;
    int ns;
    if (p == i) {
        src = ly->a.dims, ns = ly->a.ndims;
        if (ns > nd) { src += ns - nd; ns = nd; }   /* leading 1s of the parameter (infer checked) */
    } else {
        const ps_shape *s = &ly->in[p < 0 ? i : 0];
        src = s->dims, ns = s->ndim;
        *d++ = 0;
        nd--;
    }
    for (int j = 0; j < nd; j++) d[j] = j < nd - ns ? 1 : src[j - (nd - ns)];
}

/* "input 'q' is (2, 4, 8) and input 'k' is (2, 8, 4)" / "... and parameter 'W' is [8, 4]" */
static const char *matmul_inputs(const ps_layer *ly, char *buf, size_t cap) {
    char b[2][64], what[2][96];
    const int p = mm_param_operand(ly);
    for (int i = 0, x = 0; i < 2; i++) {
        if (i == p) {
            snprintf(what[i], sizeof what[i], "parameter '%s%s%s' is %s", ly->name, ly->a.pname[0] ? "." : "",
                     ly->a.pname, ps_dims_format_as(b[i], sizeof b[i], ly->a.dims, ly->a.ndims, "[", ", ", "]"));
        } else {
            snprintf(what[i], sizeof what[i], "input '%s' is %s", ly->def->in_names[x],
                     ps_shape_format(&ly->in[x], b[i], sizeof b[i]));
            x++;
        }
    }
    snprintf(buf, cap, "%s%s and %s%s", what[0], ly->a.trans_a ? " (transpose_a)" : "", what[1],
             ly->a.trans_b ? " (transpose_b)" : "");
    return buf;
}

/* The geometry for n samples (infer checked the shapes). */
/* A vector per sample times the parameter on the right (x (N, k) @ W (k, n)): the samples are the rows. */
static int mm_vector(const ps_layer *ly) {
    return mm_param_operand(ly) == 1 && ly->nin == 1 && ly->in[0].ndim == 1;
}

static mm_geom mm_geometry(const ps_layer *ly, int n) {
    mm_geom g = {.ta = ly->a.trans_a, .tb = ly->a.trans_b};
    if (mm_vector(ly)) {                     /* one (N, k) @ op(W) product */
        const int64_t *w = ly->a.dims + ly->a.ndims - 2;
        g.m = n, g.k = (int)ly->in[0].dims[0], g.n = (int)(g.tb ? w[0] : w[1]);
        return g;
    }
    const int nd = ly->outs.ndim + 1;        /* with the batch */
    int64_t d[2][PS_SHAPE_MAX_DIMS + 1];
    for (int i = 0; i < 2; i++) mm_operand_dims(ly, i, nd, d[i]);
    d[0][0] = mm_param_operand(ly) == 0 ? 1 : n;
    d[1][0] = mm_param_operand(ly) == 1 ? 1 : n;
    g.m = (int)ly->outs.dims[nd - 3];
    g.n = (int)ly->outs.dims[nd - 2];
    g.k = (int)(g.ta ? d[0][nd - 2] : d[0][nd - 1]);
    const int64_t msz[3] = {(int64_t)g.m * g.k, (int64_t)g.k * g.n, (int64_t)g.m * g.n};
    int64_t len[PS_SHAPE_MAX_DIMS + 1];
    int full[PS_SHAPE_MAX_DIMS + 1][2], nb = 0;
    for (int j = 0; j < nd - 2; j++) {       /* the batch dims, a dim of 1 in the output dropped */
        const int64_t o = d[0][j] > d[1][j] ? d[0][j] : d[1][j];
        if (o == 1) continue;
        len[nb] = o;
        full[nb][0] = d[0][j] == o;
        full[nb][1] = d[1][j] == o;
        nb++;
    }
    /* runs of dims alike; strides from the innermost */
    for (int j = 0; j < nb; j++) {
        if (g.nr > 0 && full[j][0] == full[j - 1][0] && full[j][1] == full[j - 1][1]) {
            g.len[g.nr - 1] *= len[j];
            continue;
        }
        g.len[g.nr] = len[j];
        g.st[0][g.nr] = full[j][0];
        g.st[1][g.nr] = full[j][1];
        g.st[2][g.nr] = 1;
        g.nr++;
    }
    int64_t acc[3] = {msz[0], msz[1], msz[2]};
    for (int r = g.nr - 1; r >= 0; r--)
        for (int t = 0; t < 3; t++) {
            g.st[t][r] = g.st[t][r] ? acc[t] : 0;
            acc[t] *= g.st[t][r] ? g.len[r] : 1;
        }
    /* x @ W over the last run: its matrices' rows one matrix */
    if (g.nr > 0 && g.st[1][g.nr - 1] == 0 && !g.ta && (int64_t)g.m * g.len[g.nr - 1] <= INT32_MAX) {
        g.m = (int)(g.m * g.len[g.nr - 1]);
        g.nr--;
    }
    return g;
}

/* p . q -> r over the geometry's batch, each with its per-run strides (ps, qs, rs); a run along which r stays
 * (rs 0) sums its products into it (accumulate after r's first). d: the product of one matrix each. */
static ps_status mm_run(ps_backend *be, const mm_geom *g, ps_matmul_desc d, const float *p, const int64_t *ps,
                        const float *q, const int64_t *qs, float *r, const int64_t *rs, ps_err *err) {
    const int last = g->nr - 1;
    int64_t outer = 1;
    for (int j = 0; j < last; j++) outer *= g->len[j];
    ps_status rc = PS_OK;
    for (int64_t o = 0; o < outer && rc == PS_OK; o++) {
        int64_t po = 0, qo = 0, ro = 0, rest = o;
        int first = 1;
        for (int j = last - 1; j >= 0; j--) {
            const int64_t i = rest % g->len[j];
            rest /= g->len[j];
            po += i * ps[j], qo += i * qs[j], ro += i * rs[j];
            if (i && !rs[j]) first = 0;
        }
        d.batch = 1;
        d.bcast_a = d.bcast_b = 0;
        d.accumulate = !first;
        if (last < 0) {
            rc = be->ops->matmul(be->impl, &d, p + po, q + qo, r + ro, err);
        } else if (rs[last]) {               /* one call over the last run */
            d.batch = g->len[last];
            d.bcast_a = !ps[last], d.bcast_b = !qs[last];
            rc = be->ops->matmul(be->impl, &d, p + po, q + qo, r + ro, err);
        } else {                             /* r summed along it: a product per matrix */
            for (int64_t i = 0; i < g->len[last] && rc == PS_OK; i++) {
                d.accumulate = !first || i > 0;
                rc = be->ops->matmul(be->impl, &d, p + po + i * ps[last], q + qo + i * qs[last], r + ro, err);
            }
        }
    }
    return rc;
}

static ps_status matmul_infer(ps_layer *ly, ps_err *err) {
    char b[300];
    const int p = mm_param_operand(ly);
    if (ly->nin != (p < 0 ? 2 : 1))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "MatMul takes two inputs, or one and a `parameter` (with "
                          "its `shape`); it has %d input%s%s", ly->nin, ly->nin == 1 ? "" : "s",
                          p < 0 ? " and no parameter" : " and a parameter");
    if (p < 0 && ly->a.ndims)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "MatMul's shape is its parameter's: give `parameter` (its "
                          "state_dict suffix, or null) with it, or neither");
    if (p >= 0 && ly->a.ndims < 2)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "MatMul's parameter takes a shape of 2 to %d dimensions "
                          "(a stack of matrices); it has %d", PS_SHAPE_MAX_DIMS, ly->a.ndims);
    if (p == 1 && ly->in[0].ndim == 1 && ly->in_dtype[0] == PS_DTYPE_F32) {   /* x (N, k) @ W: a row per sample */
        int lead = 0;
        while (ly->a.ndims - lead > 2 && ly->a.dims[lead] == 1) lead++;
        const int64_t *w = ly->a.dims + ly->a.ndims - 2;
        const int64_t kb = ly->a.trans_b ? w[1] : w[0];
        if (ly->a.ndims - lead != 2 || ly->a.trans_a || kb != ly->in[0].dims[0])
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: a vector per sample takes a parameter matrix on "
                              "its right whose rows match it ((N, k) @ (k, n); no transpose_a)",
                              matmul_inputs(ly, b, sizeof b));
        ly->outs.ndim = 1;
        ly->outs.dims[0] = ly->a.trans_b ? w[0] : w[1];
        ly->out_dtype = PS_DTYPE_F32;
        set_param(ly, 0, ly->a.pname, ly->a.ndims, ly->a.dims, kb, FAN_UNIFORM);
        return PS_OK;
    }
    for (int i = 0; i < ly->nin; i++)
        if (ly->in_dtype[i] != PS_DTYPE_F32 || ly->in[i].ndim < 2)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: MatMul takes float32 stacks of matrices (2 to "
                              "%d dimensions per sample; the batch is never a matrix dimension)",
                              matmul_inputs(ly, b, sizeof b), PS_SHAPE_MAX_DIMS);
    const int nd = ly->in[0].ndim;           /* per sample */
    if (p < 0 && ly->in[1].ndim != nd)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: MatMul takes two computed inputs of one rank (numpy "
                          "would face the shorter one's batch with a dimension of the other; unsqueeze it so that "
                          "the batch faces the batch)", matmul_inputs(ly, b, sizeof b));
    if (p >= 0) {
        for (int j = 0; j < ly->a.ndims - nd; j++)
            if (ly->a.dims[j] != 1)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: the parameter has more dimensions than the "
                                  "input's sample and the extra leading ones face the batch, so they must be 1",
                                  matmul_inputs(ly, b, sizeof b));
    }
    int64_t d[2][PS_SHAPE_MAX_DIMS + 1];
    for (int i = 0; i < 2; i++) mm_operand_dims(ly, i, nd + 1, d[i]);
    ly->outs.ndim = nd;
    for (int j = 1; j < nd - 1; j++) {
        if (d[0][j] != d[1][j] && d[0][j] != 1 && d[1][j] != 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: batch dimension %d (%lld and %lld) does not "
                              "broadcast (equal, or 1 in one of them)", matmul_inputs(ly, b, sizeof b), j,
                              (long long)d[0][j], (long long)d[1][j]);
        ly->outs.dims[j - 1] = d[0][j] > d[1][j] ? d[0][j] : d[1][j];
    }
    const int64_t m = ly->a.trans_a ? d[0][nd] : d[0][nd - 1], ka = ly->a.trans_a ? d[0][nd - 1] : d[0][nd];
    const int64_t kb = ly->a.trans_b ? d[1][nd] : d[1][nd - 1], n = ly->a.trans_b ? d[1][nd - 1] : d[1][nd];
    if (ka != kb)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: the inner dimensions differ (%lld and %lld): "
                          "(..., m, k) @ (..., k, n)", matmul_inputs(ly, b, sizeof b), (long long)ka, (long long)kb);
    ly->outs.dims[nd - 2] = m;
    ly->outs.dims[nd - 1] = n;
    ly->out_dtype = PS_DTYPE_F32;
    if (p >= 0) set_param(ly, 0, ly->a.pname, ly->a.ndims, ly->a.dims, ka, FAN_UNIFORM);   /* U(+-1/sqrt(k)) */
    return PS_OK;
}

static const char *matmul_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->matmul ? NULL : "matmul";
}

/* a, b and the gradients' pointers of the call: the parameter's or the inputs' */
static void mm_operands(ps_layer_call *c, const float *x[2], float *dx[2]) {
    const int p = mm_param_operand(c->ly);
    for (int i = 0, j = 0; i < 2; i++) {
        if (i == p) {
            x[i] = c->w[0];
            dx[i] = c->dxs ? c->dw[0] : NULL;
        } else {
            x[i] = c->xs[j];
            dx[i] = c->dxs ? c->dxs[j] : NULL;
            j++;
        }
    }
}

static ps_status matmul_forward(ps_layer_call *c, ps_err *err) {
    const mm_geom g = mm_geometry(c->ly, c->n);
    const float *x[2];
    float *dx[2];
    mm_operands(c, x, dx);
    const ps_matmul_desc d = {.m = g.m, .n = g.n, .k = g.k, .trans_a = g.ta, .trans_b = g.tb};
    return mm_run(c->be, &g, d, x[0], g.st[0], x[1], g.st[1], c->y, g.st[2], err);
}

static ps_status matmul_backward(ps_layer_call *c, ps_err *err) {
    const mm_geom g = mm_geometry(c->ly, c->n);
    const float *x[2];
    float *dx[2];
    mm_operands(c, x, dx);
    const ps_matmul_desc d = {.m = g.m, .n = g.n, .k = g.k, .trans_a = g.ta, .trans_b = g.tb};
    ps_status rc = PS_OK;
    for (int i = 0; i < 2 && rc == PS_OK; i++) {   /* da from dy and b; db from a and dy */
        if (!dx[i]) continue;
        int dc_first;
        const ps_matmul_desc gd = i == 0 ? ps_matmul_grad_a(&d, &dc_first) : ps_matmul_grad_b(&d, &dc_first);
        const float *o = x[1 - i];
        const int64_t *os = g.st[1 - i];
        rc = dc_first ? mm_run(c->be, &g, gd, c->dy, g.st[2], o, os, dx[i], g.st[i], err)
                      : mm_run(c->be, &g, gd, o, os, c->dy, g.st[2], dx[i], g.st[i], err);
    }
    return rc;
}

static double matmul_flops(const ps_layer *ly) {
    const mm_geom g = mm_geometry(ly, 1);
    double batch = 1;
    for (int r = 0; r < g.nr; r++) batch *= (double)g.len[r];
    return 2.0 * batch * g.m * g.n * g.k;
}

/* ---- MulConstant: x * value, a number fixed in the model file (attention's
 * scores / sqrt(d), `x * 0.5`); the backward is dy * value. y may be x
 * (in place). ---- */

static const char *mulconst_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->scale && ops->copy2d ? NULL : "scale/copy2d";
}

static ps_status mulconst_forward(ps_layer_call *c, ps_err *err) {
    return scaled_copy(c, c->x, c->y, ps_layer_out_count(c->ly, c->n), (float)c->ly->a.value, err);
}

static ps_status mulconst_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return scaled_copy(c, c->dy, c->dx, ps_layer_out_count(c->ly, c->n), (float)c->ly->a.value, err);
}

/* ---- MaskedFill: x.masked_fill(mask, value) with a constant mask that is
 * a triangle of the last two dims, broadcast over the rest: minGPT's
 * att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf')), the bias
 * torch.tril(ones(n, n)) sliced to T (psd-export reads the slice at the
 * exported shape), is mask 'triu', diagonal 1, value -inf. The filled
 * positions are those of torch.triu(torch.ones(R, C), diagonal) ('triu')
 * or torch.tril(...) ('tril'); the backward passes dy elsewhere and 0
 * there (masked_fill's gradient), so a -inf before a softmax gives those
 * weights exactly 0 and no gradient. y may be x, dx dy (in place). ---- */

static ps_status masked_fill_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 2, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    if (isnan(ly->a.value)) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "value: nan is not a fill value");
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static ps_tri_desc masked_fill_desc(const ps_layer *ly, int n, float value) {
    const ps_shape *s = &ly->in[0];
    ps_tri_desc d = {.rows = s->dims[s->ndim - 2], .cols = s->dims[s->ndim - 1], .upper = ly->a.tri == 0,
                     .diagonal = ly->a.diagonal, .value = value};
    d.batch = ps_layer_in_count(ly, 0, n) / (d.rows * d.cols);
    return d;
}

static const char *tri_fill_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->tri_fill ? NULL : "tri_fill";
}

static ps_status masked_fill_forward(ps_layer_call *c, ps_err *err) {
    const ps_tri_desc d = masked_fill_desc(c->ly, c->n, (float)c->ly->a.value);
    return c->be->ops->tri_fill(c->be->impl, &d, c->x, c->y, err);
}

static ps_status masked_fill_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    const ps_tri_desc d = masked_fill_desc(c->ly, c->n, 0.0f);
    return c->be->ops->tri_fill(c->be->impl, &d, c->dy, c->dx, err);
}

/* ---- Roll: torch.roll(x, shifts, dims) - each listed per-sample dimension
 * rotated by its shift (element i goes to (i + shift) mod size; negative
 * shifts the other way): swin's cyclic shift of its windows. One roll per
 * dim, each two strided copies (the piece that wraps and the rest); several
 * dims go through a scratch tensor. Backward rolls dy by the negated
 * shifts. Plain layout. ---- */

/* Roll's and Flip's dims: each a per-sample dimension, none twice; the output the input's shape. */
static ps_status rdims_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_layer_attrs *a = &ly->a;
    for (int i = 0; i < a->nrdims; i++) {
        int d = sample_dim(a->rdims[i], ly->in[0].ndim);
        if (d < 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dims entry %lld is not a dimension 1..%d of the batched "
                              "input (0 is the batch)", (long long)a->rdims[i], ly->in[0].ndim);
        for (int j = 0; j < i; j++)
            if (sample_dim(a->rdims[j], ly->in[0].ndim) == d)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dims %lld and %lld are one dimension",
                                  (long long)a->rdims[j], (long long)a->rdims[i]);
    }
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static ps_status roll_infer(ps_layer *ly, ps_err *err) {
    if (ly->a.nshifts != ly->a.nrdims)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%d shifts for %d dims: one shift per dim", ly->a.nshifts,
                          ly->a.nrdims);
    return rdims_infer(ly, err);
}

/* dst = src rolled by shift along per-sample dim d (n samples). */
static ps_status roll_one(const ps_layer_call *c, const float *src, float *dst, int d, int64_t shift, ps_err *err) {
    const ps_shape *s = &c->ly->in[0];
    int64_t outer = c->n, inner = 1, D = s->dims[d];
    for (int k = 0; k < d; k++) outer *= s->dims[k];
    for (int k = d + 1; k < s->ndim; k++) inner *= s->dims[k];
    int64_t r = ((shift % D) + D) % D;
    void *impl = c->be->impl;
    if (r == 0) return c->be->ops->copy2d(impl, outer, D * inner, src, D * inner, dst, D * inner, 0, err);
    ps_status rc = c->be->ops->copy2d(impl, outer, (D - r) * inner, src, D * inner, dst + r * inner, D * inner, 0, err);
    return rc ? rc : c->be->ops->copy2d(impl, outer, r * inner, src + (D - r) * inner, D * inner, dst, D * inner, 0,
                                        err);
}

/* dst = src flipped along per-sample dim d (n samples): one strided copy per index. */
static ps_status flip_one(const ps_layer_call *c, const float *src, float *dst, int d, int64_t unused, ps_err *err) {
    (void)unused;
    const ps_shape *s = &c->ly->in[0];
    int64_t outer = c->n, inner = 1, D = s->dims[d];
    for (int k = 0; k < d; k++) outer *= s->dims[k];
    for (int k = d + 1; k < s->ndim; k++) inner *= s->dims[k];
    ps_status rc = PS_OK;
    for (int64_t i = 0; i < D && rc == PS_OK; i++)
        rc = c->be->ops->copy2d(c->be->impl, outer, inner, src + i * inner, D * inner, dst + (D - 1 - i) * inner,
                                D * inner, 0, err);
    return rc;
}

typedef ps_status (*dim_move)(const ps_layer_call *c, const float *src, float *dst, int d, int64_t shift,
                              ps_err *err);

/* dst = src moved by one (roll_one by sign * shifts, flip_one) along each of dims in turn; the last move writes
 * dst, the ones before alternate between a scratch tensor and dst so that no copy reads what it writes. */
static ps_status dims_move_all(const ps_layer_call *c, const float *src, float *dst, int sign, dim_move one,
                               ps_err *err) {
    const ps_layer_attrs *a = &c->ly->a;
    int k = a->nrdims;
    float *tmp = NULL;
    if (k > 1 && !(tmp = ps_backend_alloc_floats(c->be, ps_layer_out_count(c->ly, c->n))))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's roll", c->ly->name);
    ps_status rc = PS_OK;
    const float *from = src;
    for (int i = 0; i < k && rc == PS_OK; i++) {
        float *to = (k - 1 - i) % 2 == 0 ? dst : tmp;
        rc = one(c, from, to, sample_dim(a->rdims[i], c->ly->in[0].ndim), sign * a->shifts[i], err);
        from = to;
    }
    ps_backend_release(c->be, tmp);
    return rc;
}

static ps_status roll_forward(ps_layer_call *c, ps_err *err) {
    return dims_move_all(c, c->x, c->y, 1, roll_one, err);
}

static ps_status roll_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return dims_move_all(c, c->dy, c->dx, -1, roll_one, err);
}

/* ---- Flip: torch.flip(x, dims) - each listed per-sample dimension
 * reversed (element i goes to size - 1 - i); its own inverse, so the
 * backward flips dy. Roll's copies (one per index of a flipped dim). Plain
 * layout. ---- */

static ps_status flip_forward(ps_layer_call *c, ps_err *err) {
    return dims_move_all(c, c->x, c->y, 1, flip_one, err);
}

static ps_status flip_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    return dims_move_all(c, c->dy, c->dx, 1, flip_one, err);
}

/* ---- CumSum: torch.cumsum(x, dim) - the running sum along one per-sample
 * dimension (PyTorch's dim, the batch counted as 0); reverse and exclusive
 * as ONNX's CumSum (from the end; the element itself left out). The
 * backward is the running sum of dy the other way (exclusive kept). Each
 * line summed in double. Plain layout. ---- */

static ps_status cumsum_infer(ps_layer *ly, ps_err *err) {
    int d;
    ps_status rc = need_dim_attr(ly, &d, err);
    if (rc) return rc;
    ly->outs = ly->in[0];
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *cumsum_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return ops->cumsum ? NULL : "cumsum";
}

static ps_cumsum_desc cumsum_desc(const ps_layer *ly, int n, int backward) {
    ps_cumsum_desc d = {.reverse = !ly->a.cum_reverse != !backward, .exclusive = ly->a.cum_exclusive};
    index_select_geom(ly, n, &d.outer, &d.len, &d.inner);
    return d;
}

static ps_status cumsum_forward(ps_layer_call *c, ps_err *err) {
    const ps_cumsum_desc d = cumsum_desc(c->ly, c->n, 0);
    return c->be->ops->cumsum(c->be->impl, &d, c->x, c->y, err);
}

static ps_status cumsum_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    const ps_cumsum_desc d = cumsum_desc(c->ly, c->n, 1);
    return c->be->ops->cumsum(c->be->impl, &d, c->dy, c->dx, err);
}

/* ---- Unfold and Fold: nn.Unfold / F.unfold (im2col: each kernel_size
 * window of a (C, H, W) input, dilated, padded with zeros and strided, as a
 * column: (C kh kw, L), L the windows) and nn.Fold / F.fold (col2im, its
 * adjoint: (C kh kw, L) columns summed back into (C, output_size), overlaps
 * added). Unfold's backward is Fold of dy and Fold's is Unfold of dy: one
 * backend op pair (im2col, col2im) serves the four. Plain layout. ---- */

/* Windows along one dimension of size n, or <= 0 when the kernel does not fit. */
static int64_t unfold_blocks(int64_t n, int64_t k, int64_t s, int64_t pad, int64_t dil) {
    const int64_t span = n + 2 * pad - dil * (k - 1) - 1;
    return span < 0 ? 0 : span / s + 1;
}

/* The geometry of a call: the image side is the Unfold's input (fold 0) or the Fold's output (fold 1). */
static ps_im2col_desc unfold_desc(const ps_layer *ly, int n, int fold) {
    const ps_layer_attrs *a = &ly->a;
    ps_im2col_desc d = {.n = n, .kh = a->kernel[0], .kw = a->kernel[1], .sh = a->stride[0], .sw = a->stride[1],
                        .ph = a->padding[0], .pw = a->padding[1], .dh = a->dilation[0], .dw = a->dilation[1]};
    d.c = fold ? ly->in[0].dims[0] / (d.kh * d.kw) : ly->in[0].dims[0];
    d.h = fold ? a->output_size[0] : ly->in[0].dims[1];
    d.w = fold ? a->output_size[1] : ly->in[0].dims[2];
    d.oh = unfold_blocks(d.h, d.kh, d.sh, d.ph, d.dh);
    d.ow = unfold_blocks(d.w, d.kw, d.sw, d.pw, d.dw);
    return d;
}

static ps_status unfold_blocks_check(const ps_layer *ly, int64_t h, int64_t w, ps_err *err) {
    const ps_layer_attrs *a = &ly->a;
    if (unfold_blocks(h, a->kernel[0], a->stride[0], a->padding[0], a->dilation[0]) <= 0 ||
        unfold_blocks(w, a->kernel[1], a->stride[1], a->padding[1], a->dilation[1]) <= 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "a %lldx%lld kernel (dilation %lldx%lld) does not fit a %lldx%lld image padded by %lldx%lld",
                          (long long)a->kernel[0], (long long)a->kernel[1], (long long)a->dilation[0],
                          (long long)a->dilation[1], (long long)h, (long long)w, (long long)a->padding[0],
                          (long long)a->padding[1]);
    return PS_OK;
}

static ps_status unfold_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 3, 3, PS_DTYPE_F32, err);
    if (rc || (rc = unfold_blocks_check(ly, ly->in[0].dims[1], ly->in[0].dims[2], err))) return rc;
    const ps_im2col_desc d = unfold_desc(ly, 1, 0);
    ly->outs = (ps_shape){.ndim = 2, .dims = {d.c * d.kh * d.kw, d.oh * d.ow}};
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static ps_status fold_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 2, 2, PS_DTYPE_F32, err);
    if (rc || (rc = unfold_blocks_check(ly, ly->a.output_size[0], ly->a.output_size[1], err))) return rc;
    const ps_layer_attrs *a = &ly->a;
    const int64_t kk = a->kernel[0] * a->kernel[1];
    const ps_im2col_desc d = unfold_desc(ly, 1, 1);
    if (ly->in[0].dims[0] % kk)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%lld column rows are not a multiple of the %lldx%lld kernel's %lld positions",
                          (long long)ly->in[0].dims[0], (long long)a->kernel[0], (long long)a->kernel[1],
                          (long long)kk);
    if (ly->in[0].dims[1] != d.oh * d.ow)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "%lld columns, but output_size %lldx%lld holds %lldx%lld = %lld windows of this kernel",
                          (long long)ly->in[0].dims[1], (long long)a->output_size[0], (long long)a->output_size[1],
                          (long long)d.oh, (long long)d.ow, (long long)(d.oh * d.ow));
    ly->outs = (ps_shape){.ndim = 3, .dims = {d.c, d.h, d.w}};
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

static const char *unfold_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return !ops->im2col ? "im2col" : !ops->col2im ? "col2im" : NULL;
}

static ps_status unfold_forward(ps_layer_call *c, ps_err *err) {
    const ps_im2col_desc d = unfold_desc(c->ly, c->n, 0);
    return c->be->ops->im2col(c->be->impl, &d, c->x, c->y, err);
}

static ps_status unfold_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    const ps_im2col_desc d = unfold_desc(c->ly, c->n, 0);
    return c->be->ops->col2im(c->be->impl, &d, c->dy, c->dx, err);
}

static ps_status fold_forward(ps_layer_call *c, ps_err *err) {
    const ps_im2col_desc d = unfold_desc(c->ly, c->n, 1);
    return c->be->ops->col2im(c->be->impl, &d, c->x, c->y, err);
}

static ps_status fold_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    const ps_im2col_desc d = unfold_desc(c->ly, c->n, 1);
    return c->be->ops->im2col(c->be->impl, &d, c->dy, c->dx, err);
}

/* ---- Pad: F.pad(x, pad, mode, value) - pad lists (before, after) pairs
 * from the last dimension backwards, as F.pad's; each dimension grows by
 * its pair. 'constant': the new elements are value (swin's padding to a
 * multiple of its window); 'reflect' (x[1], x[0] | x[0] ... | x[L-2]),
 * 'replicate' (x[0], x[0] | ... | x[L-1]) and 'circular' (x[L-1] | ... |
 * x[0]) take them from the input (CycleGAN's ReflectionPad2d, convolutions'
 * padding_mode). The forward copies x into y's interior and, for the other
 * modes, fills the borders dim by dim from the innermost out, each border
 * slice a strided copy of an interior slice of y (so corners come out as
 * x[r(i), r(j)]); the backward runs those copies' adjoints in reverse order
 * (each adds a border slice's gradient into its source slice) in a copy of
 * dy, then takes the interior. Plain layout. ---- */

enum { PAD_CONSTANT, PAD_REFLECT, PAD_REPLICATE, PAD_CIRCULAR };

static ps_status pad_infer(ps_layer *ly, ps_err *err) {
    ps_status rc = need_ndim(ly, 0, 1, PS_SHAPE_MAX_DIMS, PS_DTYPE_F32, err);
    if (rc) return rc;
    const ps_layer_attrs *a = &ly->a;
    int nd = ly->in[0].ndim;
    if (a->npads % 2 || a->npads / 2 > nd)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "pad has %d values: pairs (before, after) for at most the "
                          "input's %d per-sample dimensions, the last first", a->npads, nd);
    if (a->pad_mode != PAD_CONSTANT && a->value != 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "value %g with mode '%s' (only 'constant' pads with a value)",
                          a->value, a->pad_mode == PAD_REFLECT ? "reflect" : a->pad_mode == PAD_REPLICATE ? "replicate"
                                                                                                  : "circular");
    ly->outs = ly->in[0];
    for (int i = 0; i < a->npads / 2; i++) {
        int d = nd - 1 - i;
        int64_t len = ly->in[0].dims[d], most = a->pad_mode == PAD_REFLECT ? len - 1 : a->pad_mode == PAD_CIRCULAR ? len
                                                : a->pad_mode == PAD_REPLICATE ? (len ? PS_DIM_MAX : 0) : PS_DIM_MAX;
        if (a->pads[2 * i] > most || a->pads[2 * i + 1] > most)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "pad (%lld, %lld) of dimension %d of size %lld: mode '%s' "
                              "takes at most %lld on a side (F.pad's rule)", (long long)a->pads[2 * i],
                              (long long)a->pads[2 * i + 1], d + 1, (long long)len,
                              a->pad_mode == PAD_REFLECT ? "reflect" : a->pad_mode == PAD_CIRCULAR ? "circular"
                                                                                                  : "replicate",
                              (long long)most);
        ly->outs.dims[d] = ly->in[0].dims[d] + a->pads[2 * i] + a->pads[2 * i + 1];
        if (ly->outs.dims[d] > PS_DIM_MAX)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "dimension %d padded to %lld", d + 1,
                              (long long)ly->outs.dims[d]);
    }
    ly->out_dtype = PS_DTYPE_F32;
    return PS_OK;
}

/* The padding before per-sample dim d. */
static int64_t pad_before(const ps_layer *ly, int d) {
    int i = ly->in[0].ndim - 1 - d;
    return i < ly->a.npads / 2 ? ly->a.pads[2 * i] : 0;
}

/* Copies the input-shaped interior between the input's geometry and the
 * output's. L, the innermost padded dim: each copy2d moves, for one index of the dims
 * before L - 1 (the batch included), rows = dim L - 1's size (the batch
 * when L is 0) of in[L] * inner contiguous floats. to_out 1: src is the
 * input (x), dst the output (y); 0: src the output's geometry (dy), dst the
 * input's (dx). */
static ps_status pad_copy(const ps_layer_call *c, const float *src, float *dst, int to_out, ps_err *err) {
    const ps_layer *ly = c->ly;
    const ps_shape *in = &ly->in[0], *out = &ly->outs;
    int nd = in->ndim, L = -1;
    for (int d = 0; d < nd; d++)
        if (pad_before(ly, d) || in->dims[d] != out->dims[d]) L = d;
    const ps_backend_ops *ops = c->be->ops;
    if (L < 0) {
        int64_t count = ps_layer_in_count(ly, 0, c->n);
        return ops->copy2d(c->be->impl, 1, count, src, count, dst, count, 0, err);
    }
    /* batched dims: 0 the batch, k + 1 per-sample dim k */
    int64_t bin[PS_SHAPE_MAX_DIMS + 1], bout[PS_SHAPE_MAX_DIMS + 1], bpre[PS_SHAPE_MAX_DIMS + 1];
    bin[0] = bout[0] = c->n;
    bpre[0] = 0;
    for (int d = 0; d < nd; d++) {
        bin[d + 1] = in->dims[d];
        bout[d + 1] = out->dims[d];
        bpre[d + 1] = pad_before(ly, d);
    }
    int Lb = L + 1;
    int64_t sin[PS_SHAPE_MAX_DIMS + 2], sout[PS_SHAPE_MAX_DIMS + 2];   /* strides in floats */
    sin[nd] = sout[nd] = 1;
    for (int d = nd - 1; d >= 0; d--) { sin[d] = sin[d + 1] * bin[d + 1]; sout[d] = sout[d + 1] * bout[d + 1]; }
    int64_t cols = bin[Lb] * sin[Lb], rows = bin[Lb - 1], outer = 1;
    for (int d = 0; d < Lb - 1; d++) outer *= bin[d];
    ps_status rc = PS_OK;
    for (int64_t o = 0; o < outer && rc == PS_OK; o++) {
        int64_t xo = 0, yo = bpre[Lb] * sout[Lb] + bpre[Lb - 1] * sout[Lb - 1], rem = o;
        for (int d = Lb - 2; d >= 0; d--) {
            int64_t i = rem % bin[d];
            rem /= bin[d];
            xo += i * sin[d];
            yo += (i + bpre[d]) * sout[d];
        }
        rc = to_out ? ops->copy2d(c->be->impl, rows, cols, src + xo, sin[Lb - 1], dst + yo, sout[Lb - 1], 0, err)
                    : ops->copy2d(c->be->impl, rows, cols, src + yo, sout[Lb - 1], dst + xo, sin[Lb - 1], 0, err);
    }
    return rc;
}

/* The border copies of the modes other than 'constant', in the output's
 * geometry: per padded dim from the innermost out, per border index j, the
 * slice at j (every index of the other dims, the batch's included) is the
 * slice at src(j), an index of the input's part of that dim. forward 1:
 * y[j] = y[src]; 0: the adjoints in reverse order, g[src] += g[j]. */
static ps_status pad_borders(const ps_layer_call *c, float *y, int forward, ps_err *err) {
    const ps_layer *ly = c->ly;
    const ps_shape *in = &ly->in[0], *out = &ly->outs;
    const int nd = in->ndim, np = ly->a.npads / 2;
    /* the copies in forward order: (dim, j, src) */
    int64_t total = 0;
    for (int i = 0; i < np; i++) total += ly->a.pads[2 * i] + ly->a.pads[2 * i + 1];
    int64_t (*cp)[3] = malloc((size_t)(total ? total : 1) * sizeof *cp), k = 0;
    if (!cp) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's copies", ly->name);
    for (int i = 0; i < np; i++) {
        int d = nd - 1 - i;
        int64_t b = ly->a.pads[2 * i], e = ly->a.pads[2 * i + 1], L = in->dims[d];
        for (int64_t j = 0; j < b + e; j++) {
            int64_t o = j < b ? j : b + L + (j - b);   /* the border index in the output */
            int64_t t = o - b, s;                      /* its position relative to the input, outside [0, L) */
            switch (ly->a.pad_mode) {
            case PAD_REFLECT: s = t < 0 ? -t : 2 * (L - 1) - t; break;
            case PAD_REPLICATE: s = t < 0 ? 0 : L - 1; break;
            default: s = ((t % L) + L) % L; break;      /* circular */
            }
            cp[k][0] = d;
            cp[k][1] = o;
            cp[k][2] = s + b;
            k++;
        }
    }
    ps_status rc = PS_OK;
    for (int64_t q = 0; q < total && rc == PS_OK; q++) {
        const int64_t *x = cp[forward ? q : total - 1 - q];
        int d = (int)x[0];
        int64_t inner = 1, outer = c->n;
        for (int e = d + 1; e < nd; e++) inner *= out->dims[e];
        for (int e = 0; e < d; e++) outer *= out->dims[e];
        int64_t ld = out->dims[d] * inner;
        if (forward)
            rc = c->be->ops->copy2d(c->be->impl, outer, inner, y + x[2] * inner, ld, y + x[1] * inner, ld, 0, err);
        else
            rc = c->be->ops->copy2d(c->be->impl, outer, inner, y + x[1] * inner, ld, y + x[2] * inner, ld, 1, err);
    }
    free(cp);
    return rc;
}

static ps_status pad_forward(ps_layer_call *c, ps_err *err) {
    ps_status rc = PS_OK;
    if (c->ly->a.pad_mode == PAD_CONSTANT)
        rc = c->be->ops->fill(c->be->impl, ps_layer_out_count(c->ly, c->n), c->y, (float)c->ly->a.value, err);
    if (rc == PS_OK) rc = pad_copy(c, c->x, c->y, 1, err);
    if (rc == PS_OK && c->ly->a.pad_mode != PAD_CONSTANT) rc = pad_borders(c, c->y, 1, err);
    return rc;
}

static ps_status pad_backward(ps_layer_call *c, ps_err *err) {
    if (!c->dx) return PS_OK;
    if (c->ly->a.pad_mode == PAD_CONSTANT) return pad_copy(c, c->dy, c->dx, 0, err);
    int64_t count = ps_layer_out_count(c->ly, c->n);
    float *g = ps_backend_alloc_floats(c->be, count);   /* dy's copy: the border adjoints add into it */
    if (!g) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's gradient", c->ly->name);
    ps_status rc = c->be->ops->copy2d(c->be->impl, 1, count, c->dy, count, g, count, 0, err);
    if (rc == PS_OK) rc = pad_borders(c, g, 0, err);
    if (rc == PS_OK) rc = pad_copy(c, g, c->dx, 0, err);
    ps_backend_release(c->be, g);
    return rc;
}

/* ---- RelativePositionBias: swin's relative position bias, torchvision's
 * ShiftedWindowAttention: relative_position_bias_table[relative_position_
 * index] viewed (N, N, heads) and permuted to (heads, N, N), N = Wh * Ww
 * tokens of a window, the same for each of the windows [nh, nw] of a
 * sample; with shift_size, plus swin's shifted-window attention mask: the
 * (nh * Wh, nw * Ww) grid the windows tile is cut into regions (rows [0,
 * H - Wh), [H - Wh, H - sh), [H - sh, H), columns alike; a shift of 0 one
 * region), and two tokens of a window from different regions get -100.
 * Output (nh * nw, heads, N, N) per sample: what shifted_window_attention
 * adds to q k^T (an Add after it). The input is read for its batch size
 * only (its gradient is 0). The table's gradient: dy summed over the
 * samples and windows, permuted back and scattered to the rows the index
 * names (embedding_backward's dense form). relative_position_index is an
 * int64 buffer that starts as torchvision's index, so the state_dict is
 * the module's; psd gathers by the buffer, as PyTorch does (an entry
 * outside the table refused). ---- */

/* torchvision's relative_position_index, element k = i * N + j of tokens i
 * and j of a window: (dh + Wh - 1) * (2 Ww - 1) + dw + Ww - 1 for their
 * row and column differences. */
static int64_t rpb_index(const ps_layer *ly, int64_t k) {
    int64_t Wh = ly->a.window[0], Ww = ly->a.window[1], N = Wh * Ww, i = k / N, j = k % N;
    return (i / Ww - j / Ww + Wh - 1) * (2 * Ww - 1) + (i % Ww - j % Ww + Ww - 1);
}

static ps_status rpb_infer(ps_layer *ly, ps_err *err) {
    const ps_layer_attrs *a = &ly->a;
    for (int i = 0; i < 2; i++)
        if (a->shift[i] >= a->window[i])
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "shift_size %lld is not below window_size %lld",
                              (long long)a->shift[i], (long long)a->window[i]);
    int64_t N = a->window[0] * a->window[1], nw = a->windows[0] * a->windows[1];
    if (N > 4096 || nw > 65536)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%lld tokens a window, %lld windows: at most 4096 and 65536",
                          (long long)N, (long long)nw);
    ly->outs.ndim = 4;
    ly->outs.dims[0] = nw;
    ly->outs.dims[1] = a->num;
    ly->outs.dims[2] = N;
    ly->outs.dims[3] = N;
    ly->out_dtype = PS_DTYPE_F32;
    int64_t tdims[2] = {(2 * a->window[0] - 1) * (2 * a->window[1] - 1), a->num}, idims[1] = {N * N};
    static const ps_init TRUNC_NORMAL_002 = {PS_INIT_NORMAL, 0, 0.02f, 0};   /* trunc_normal_(std=0.02): +-2 */
    set_param(ly, 0, "relative_position_bias_table", 2, tdims, 1, TRUNC_NORMAL_002);
    set_buffer(ly, "relative_position_index", 1, idims, PS_DTYPE_I64, 0);
    ly->buffer[0].init_i64 = rpb_index;
    return PS_OK;
}

static const char *rpb_missing(const ps_layer *ly, const ps_backend_ops *ops) {
    (void)ly;
    return !ops->embedding_forward ? "embedding_forward" : !ops->embedding_backward ? "embedding_backward"
           : !ops->permute ? "permute" : !ops->copy2d ? "copy2d" : !ops->fill ? "fill" : !ops->add ? "add" : NULL;
}

/* The region of grid row (or column) g of size G (torchvision's slices (0, -win), (-win, -shift), (-shift,
 * None); with shift 0 its labels differ, but the boundary G - win falls between two windows then, so no window
 * sees two regions either way). */
static int rpb_region(int64_t g, int64_t G, int64_t win, int64_t shift) {
    return g < G - win ? 0 : g < G - shift ? 1 : 2;
}

/* The node's relative_position_index buffer on the device (N * N int64), each entry checked to name a row of
 * the table (a loaded checkpoint's or --init-from's may hold anything); torchvision's index when the call
 * carries no buffers. */
static int64_t *rpb_device_index(const ps_layer_call *c, ps_err *err) {
    int64_t NN = c->ly->buffer[0].numel, rows = c->ly->param[0].dims[0];
    const int64_t *buf = c->ibuf ? c->ibuf[0] : NULL;
    int64_t *host = malloc((size_t)NN * sizeof *host), *dev = c->be->ops->alloc(c->be->impl, (size_t)NN * 8);
    if (!host || !dev) {
        free(host);
        if (dev) c->be->ops->free(c->be->impl, dev);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's index", c->ly->name);
        return NULL;
    }
    for (int64_t k = 0; k < NN; k++) {
        host[k] = buf ? buf[k] : rpb_index(c->ly, k);
        if (host[k] < 0 || host[k] >= rows) {
            ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s.relative_position_index[%lld] is %lld, not a row of "
                       "the %lld of relative_position_bias_table", c->ly->name, (long long)k, (long long)host[k],
                       (long long)rows);
            free(host);
            c->be->ops->free(c->be->impl, dev);
            return NULL;
        }
    }
    ps_status rc = c->be->ops->copy_to_device(c->be->impl, dev, host, (size_t)NN * 8, err);
    free(host);
    if (rc != PS_OK) { c->be->ops->free(c->be->impl, dev); return NULL; }
    return dev;
}

static ps_status rpb_forward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    const ps_layer_attrs *a = &ly->a;
    const ps_backend_ops *ops = c->be->ops;
    void *impl = c->be->impl;
    int64_t H = a->num, N = a->window[0] * a->window[1], HNN = H * N * N, nw = ly->outs.dims[0];
    int64_t *idx = rpb_device_index(c, err);
    if (!idx) return err->code;
    float *g = ps_backend_alloc_floats(c->be, HNN), *one = ps_backend_alloc_floats(c->be, nw * HNN), *mask = NULL;
    ps_status rc = PS_OK;
    if (!g || !one) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", ly->name); goto done; }
    /* (N * N, H) rows of the table, then (N, N, H) -> (H, N, N) into window 0 of one sample's output */
    if ((rc = ops->embedding_forward(impl, N * N, (int)H, idx, c->w[0], g, err)) != PS_OK) goto done;
    ps_permute_desc pd = {.n = 1, .ndim = 3, .dims = {N, N, H}, .perm = {2, 0, 1}};
    if ((rc = ops->permute(impl, &pd, g, one, err)) != PS_OK) goto done;
    for (int64_t w = 1; w < nw && rc == PS_OK; w++)
        rc = ops->copy2d(impl, 1, HNN, one, HNN, one + w * HNN, HNN, 0, err);
    if (rc == PS_OK && (a->shift[0] || a->shift[1])) {
        /* the mask (nw, N, N), broadcast over the heads: -100 across regions */
        float *host = malloc((size_t)(nw * HNN) * sizeof *host);
        mask = ps_backend_alloc_floats(c->be, nw * HNN);
        if (!host || !mask) {
            free(host);
            rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's mask", ly->name);
            goto done;
        }
        int64_t Wh = a->window[0], Ww = a->window[1], GH = a->windows[0] * Wh, GW = a->windows[1] * Ww;
        for (int64_t w = 0; w < nw; w++)
            for (int64_t i = 0; i < N; i++)
                for (int64_t j = 0; j < N; j++) {
                    int64_t hi = (w / a->windows[1]) * Wh + i / Ww, wi = (w % a->windows[1]) * Ww + i % Ww;
                    int64_t hj = (w / a->windows[1]) * Wh + j / Ww, wj = (w % a->windows[1]) * Ww + j % Ww;
                    int same = rpb_region(hi, GH, Wh, a->shift[0]) == rpb_region(hj, GH, Wh, a->shift[0]) &&
                               rpb_region(wi, GW, Ww, a->shift[1]) == rpb_region(wj, GW, Ww, a->shift[1]);
                    for (int64_t h = 0; h < H; h++) host[((w * H + h) * N + i) * N + j] = same ? 0.0f : -100.0f;
                }
        rc = ops->copy_to_device(impl, mask, host, (size_t)(nw * HNN) * sizeof *host, err);
        free(host);
        if (rc == PS_OK) rc = ops->add(impl, nw * HNN, one, mask, err);
    }
    for (int s = 0; s < c->n && rc == PS_OK; s++)
        rc = ops->copy2d(impl, 1, nw * HNN, one, nw * HNN, (float *)c->y + s * nw * HNN, nw * HNN, 0, err);
done:
    ps_backend_release(c->be, g);
    ps_backend_release(c->be, one);
    ps_backend_release(c->be, mask);
    ops->free(impl, idx);
    return rc;
}

static ps_status rpb_backward(ps_layer_call *c, ps_err *err) {
    const ps_layer *ly = c->ly;
    const ps_backend_ops *ops = c->be->ops;
    void *impl = c->be->impl;
    ps_status rc = PS_OK;
    if (c->dx) rc = ops->fill(impl, ps_layer_in_count(ly, 0, c->n), c->dx, 0.0f, err);
    if (rc != PS_OK || !c->dw[0]) return rc;
    int64_t H = ly->a.num, N = ly->a.window[0] * ly->a.window[1], HNN = H * N * N, nw = ly->outs.dims[0];
    int64_t *idx = rpb_device_index(c, err);
    if (!idx) return err->code;
    float *acc = ps_backend_alloc_floats(c->be, HNN), *g = ps_backend_alloc_floats(c->be, HNN);
    if (!acc || !g) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", ly->name); goto done; }
    rc = ops->fill(impl, HNN, acc, 0.0f, err);
    for (int64_t k = 0; k < c->n * nw && rc == PS_OK; k++)   /* every sample's every window */
        rc = ops->copy2d(impl, 1, HNN, c->dy + k * HNN, HNN, acc, HNN, 1, err);
    ps_permute_desc pd = {.n = 1, .ndim = 3, .dims = {H, N, N}, .perm = {1, 2, 0}};
    if (rc == PS_OK) rc = ops->permute(impl, &pd, acc, g, err);
    if (rc == PS_OK) rc = ops->embedding_backward(impl, N * N, (int)H, idx, g, ly->param[0].dims[0], c->dw[0], err);
done:
    ps_backend_release(c->be, acc);
    ps_backend_release(c->be, g);
    ops->free(impl, idx);
    return rc;
}

/* ------------------------------------------------------ attribute tables */

#define A(f) offsetof(ps_layer_attrs, f)
#define ATTR_INT(nm, f, d, lo) {nm, PS_ATTR_INT, A(f), d, lo, PS_DIM_MAX, 0, 0, NULL, 0}
#define ATTR_PAIR(nm, f, d, lo) {nm, PS_ATTR_PAIR, A(f), d, lo, 65536, 0, 0, NULL, 0}
#define ATTR_BOOL(nm, f, d) {nm, PS_ATTR_BOOL, A(f), d, 0, 1, 0, 0, NULL, 0}
#define ATTR_FLOAT(nm, f, d, lo, hi, lo_open, hi_open) {nm, PS_ATTR_FLOAT, A(f), d, lo, hi, lo_open, hi_open, NULL, 0}
#define ATTR_END {NULL, 0, 0, NULL, 0, 0, 0, 0, NULL, 0}
/* weight normalisation (nn.utils.weight_norm) of Linear, Conv1d, Conv2d, ConvTranspose2d: wn_params */
#define ATTRS_WEIGHT_NORM \
    ATTR_BOOL("weight_norm", wn, "false"),\
    {"weight_norm_dim", PS_ATTR_INT_OR_NULL, A(wn_dim), "0", -8, 8, 0, 0, NULL, A(wn_dim_given)}

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
    ATTRS_WEIGHT_NORM,
    ATTR_END,
};
static const ps_attr_spec maxpool_attrs[] = {
    ATTR_PAIR("kernel_size", kernel, NULL, 1),
    ATTR_PAIR("stride", stride, "", 1),
    ATTR_PAIR("padding", padding, "0", 0),
    ATTR_BOOL("ceil_mode", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec avgpool_attrs[] = {
    ATTR_PAIR("kernel_size", kernel, NULL, 1),
    ATTR_PAIR("stride", stride, "", 1),
    ATTR_PAIR("padding", padding, "0", 0),
    ATTR_BOOL("ceil_mode", flag, "false"),
    ATTR_BOOL("count_include_pad", count_include_pad, "true"),
    ATTR_END,
};
/* the 1-d kinds: one number each, the second entry of the 2-d pair (one_d) */
static const ps_attr_spec conv1d_attrs[] = {
    ATTR_INT("in_channels", in_features, "", 1),
    ATTR_INT("out_channels", out, NULL, 1),
    ATTR_INT("kernel_size", kernel[1], NULL, 1),
    ATTR_INT("stride", stride[1], "1", 1),
    ATTR_INT("padding", padding[1], "0", 0),
    ATTR_INT("dilation", dilation[1], "1", 1),
    ATTR_INT("groups", groups, "1", 1),
    ATTR_BOOL("bias", bias, "true"),
    {"padding_mode", PS_ATTR_ENUM, A(flag), "zeros", 0, 0, 0, 0, padding_modes, 0},
    ATTRS_WEIGHT_NORM,
    ATTR_END,
};
static const ps_attr_spec maxpool1d_attrs[] = {
    ATTR_INT("kernel_size", kernel[1], NULL, 1),
    ATTR_INT("stride", stride[1], "", 1),
    ATTR_INT("padding", padding[1], "0", 0),
    ATTR_BOOL("ceil_mode", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec avgpool1d_attrs[] = {
    ATTR_INT("kernel_size", kernel[1], NULL, 1),
    ATTR_INT("stride", stride[1], "", 1),
    ATTR_INT("padding", padding[1], "0", 0),
    ATTR_BOOL("ceil_mode", flag, "false"),
    ATTR_BOOL("count_include_pad", count_include_pad, "true"),
    ATTR_END,
};
static const ps_attr_spec adaptive1d_attrs[] = {
    ATTR_INT("output_size", output_size[1], NULL, 1),
    ATTR_END,
};
static const ps_attr_spec adaptive_attrs[] = {
    {"output_size", PS_ATTR_PAIR_OR_NULL, A(output_size), NULL, 1, 65536, 0, 0, NULL, 0},
    ATTR_END,
};
static const ps_attr_spec bn_attrs[] = {
    ATTR_INT("num_features", in_features, "", 1),
    ATTR_FLOAT("eps", eps, "1e-5", 0, 1, 1, 0),
    {"momentum", PS_ATTR_FLOAT_OR_NULL, A(momentum), "0.1", 0, 1, 0, 0, NULL, A(momentum_null)},
    ATTR_BOOL("affine", affine, "true"),
    ATTR_BOOL("track_running_stats", track, "true"),
    ATTR_END,
};
static const ps_attr_spec ln_attrs[] = {
    {"normalized_shape", PS_ATTR_DIMS, A(dims), NULL, 1, PS_DIM_MAX, 0, 0, NULL, A(ndims)},
    ATTR_FLOAT("eps", eps, "1e-5", 0, 1, 1, 0),
    ATTR_BOOL("elementwise_affine", affine, "true"),
    ATTR_END,
};
static const ps_attr_spec leaky_attrs[] = {
    ATTR_FLOAT("negative_slope", slope, "0.01", -1e6, 1e6, 0, 0),
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec hardtanh_attrs[] = {    /* an infinite side: torch.clamp with min or max only */
    {"min_val", PS_ATTR_FLOAT_INF, A(min_val), "-1.0", 0, 0, 0, 0, NULL, 0},
    {"max_val", PS_ATTR_FLOAT_INF, A(max_val), "1.0", 0, 0, 0, 0, NULL, 0},
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const char *const gelu_approx[] = {"none", "tanh", NULL};
static const ps_attr_spec gelu_attrs[] = {
    {"approximate", PS_ATTR_ENUM, A(approximate), "none", 0, 0, 0, 0, gelu_approx, 0},
    ATTR_END,
};
static const ps_attr_spec concat_attrs[] = {
    {"dim", PS_ATTR_INT, A(dim), "1", -5, 5, 0, 0, NULL, 0},
    ATTR_END,
};
static const ps_attr_spec linear_attrs[] = {
    ATTR_INT("in_features", in_features, "", 1),
    ATTR_INT("out_features", out, NULL, 1),
    ATTR_BOOL("bias", bias, "true"),
    ATTRS_WEIGHT_NORM,
    ATTR_END,
};
static const ps_attr_spec bilinear_attrs[] = {
    ATTR_INT("in1_features", in_features, "", 1),
    ATTR_INT("in2_features", in2_features, "", 1),
    ATTR_INT("out_features", out, NULL, 1),
    ATTR_BOOL("bias", bias, "true"),
    ATTR_END,
};
static const ps_attr_spec emb_attrs[] = {
    ATTR_INT("num_embeddings", num, NULL, 1),
    ATTR_INT("embedding_dim", out, NULL, 1),
    {"padding_idx", PS_ATTR_INT_OR_NULL, A(padding_idx), "null", -PS_DIM_MAX, PS_DIM_MAX, 0, 0, NULL, A(pad_given)},
    /* a slice of each sample's flat ids (several id inputs joined): its first, and its per-sample shape */
    {"ids_start", PS_ATTR_INT_OR_NULL, A(ids_start), "null", 0, PS_NUMEL_MAX, 0, 0, NULL, A(ids_sliced)},
    {"ids_shape", PS_ATTR_DIMS, A(ids_dims), "", 1, PS_DIM_MAX, 0, 0, NULL, A(ids_ndims), 1},
    ATTR_END,
};
/* LSTM and GRU (nn.LSTM's and nn.GRU's arguments; proj_size is not taken) */
static const ps_attr_spec lstm_attrs[] = {
    ATTR_INT("input_size", in_features, "", 1),
    ATTR_INT("hidden_size", out, NULL, 1),
    ATTR_INT("num_layers", num, "1", 1),
    ATTR_BOOL("bias", bias, "true"),
    ATTR_BOOL("batch_first", mode, "false"),
    ATTR_FLOAT("dropout", p, "0", 0, 1, 0, 1),
    ATTR_BOOL("bidirectional", bidirectional, "false"),
    ATTR_END,
};
/* LSTMCell and GRUCell (nn.LSTMCell's and nn.GRUCell's arguments) */
static const ps_attr_spec cell_attrs[] = {
    ATTR_INT("input_size", in_features, "", 1),
    ATTR_INT("hidden_size", out, NULL, 1),
    ATTR_BOOL("bias", bias, "true"),
    ATTR_END,
};
static const ps_attr_spec inplace_attrs[] = {
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
/* group and instance normalisation */
static const ps_attr_spec gn_attrs[] = {
    ATTR_INT("num_groups", groups, NULL, 1),
    ATTR_INT("num_channels", in_features, "", 1),
    ATTR_FLOAT("eps", eps, "1e-5", 0, 1, 1, 0),
    ATTR_BOOL("affine", affine, "true"),
    ATTR_END,
};
static const ps_attr_spec instnorm_attrs[] = {
    ATTR_INT("num_features", in_features, "", 1),
    ATTR_FLOAT("eps", eps, "1e-5", 0, 1, 1, 0),
    ATTR_FLOAT("momentum", ignored, "0.1", 0, 1, 0, 0),
    ATTR_BOOL("affine", affine, "false"),
    ATTR_BOOL("track_running_stats", track, "false"),
    ATTR_END,
};
static const ps_attr_spec l2norm_attrs[] = {
    ATTR_FLOAT("p", p, "2.0", 0, 1e6, 1, 0),
    {"dim", PS_ATTR_INT, A(dim), "1", -5, 5, 0, 0, NULL, 0},
    ATTR_FLOAT("eps", eps, "1e-12", 0, 1, 0, 0),
    ATTR_END,
};
/* elementwise math */
static const ps_attr_spec elu_attrs[] = {
    ATTR_FLOAT("alpha", elu_alpha, "1.0", -1e6, 1e6, 0, 0),
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec softplus_attrs[] = {
    ATTR_FLOAT("beta", sp_beta, "1.0", 0, 1e6, 1, 0),
    ATTR_FLOAT("threshold", sp_threshold, "20.0", -1e6, 1e6, 0, 0),
    ATTR_END,
};
static const ps_attr_spec pow_attrs[] = {
    ATTR_FLOAT("exponent", exponent, NULL, -1e6, 1e6, 0, 0),
    ATTR_END,
};
static const ps_attr_spec addconst_attrs[] = {
    ATTR_FLOAT("value", value, NULL, -1e30, 1e30, 0, 0),
    ATTR_END,
};
/* shrinks, thresholds, PReLU, RReLU */
static const ps_attr_spec celu_attrs[] = {
    ATTR_FLOAT("alpha", elu_alpha, "1.0", -1e6, 1e6, 0, 0),
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec hardshrink_attrs[] = {
    ATTR_FLOAT("lambd", lambd, "0.5", -1e6, 1e6, 0, 0),
    ATTR_END,
};
static const ps_attr_spec softshrink_attrs[] = {
    ATTR_FLOAT("lambd", lambd, "0.5", 0, 1e6, 0, 0),
    ATTR_END,
};
static const ps_attr_spec threshold_attrs[] = {
    ATTR_FLOAT("threshold", threshold, NULL, -1e30, 1e30, 0, 0),
    ATTR_FLOAT("value", value, NULL, -1e30, 1e30, 0, 0),
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec rrelu_attrs[] = {
    ATTR_FLOAT("lower", rr_lower, "0.125", -1e6, 1e6, 0, 0),
    ATTR_FLOAT("upper", rr_upper, "0.3333333333333333", -1e6, 1e6, 0, 0),
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const ps_attr_spec prelu_attrs[] = {
    {"num_parameters", PS_ATTR_INT, A(num_parameters), "1", 1, PS_DIM_MAX, 0, 0, NULL, 0},
    ATTR_END,
};
static const ps_attr_spec dropout_attrs[] = {
    ATTR_FLOAT("p", p, "0.5", 0, 1, 0, 1),
    ATTR_BOOL("inplace", flag, "false"),
    ATTR_END,
};
static const char *const sdepth_modes[] = {"row", "batch", NULL};
static const char *const pad_modes[] = {"constant", "reflect", "replicate", "circular", NULL};
static const ps_attr_spec sdepth_attrs[] = {
    ATTR_FLOAT("p", p, NULL, 0, 1, 0, 0),
    {"mode", PS_ATTR_ENUM, A(mode), NULL, 0, 0, 0, 0, sdepth_modes, 0},
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
    {"shape", PS_ATTR_DIMS, A(dims), NULL, -1, PS_DIM_MAX, 0, 0, NULL, A(ndims), 1},
    ATTR_END,
};
static const ps_attr_spec param_attrs[] = {
    {"shape", PS_ATTR_DIMS, A(dims), NULL, 1, PS_DIM_MAX, 0, 0, NULL, A(ndims)},
    {"expand", PS_ATTR_DIMS, A(dims2), "", 1, PS_DIM_MAX, 0, 0, NULL, A(ndims2)},
    {"parameter", PS_ATTR_NAME, A(pname), "weight", 0, 0, 0, 0, NULL, 0},
    ATTR_END,
};
static const ps_attr_spec const_attrs[] = {
    {"shape", PS_ATTR_DIMS, A(dims), NULL, 1, PS_DIM_MAX, 0, 0, NULL, A(ndims)},
    {"expand", PS_ATTR_DIMS, A(dims2), "", 1, PS_DIM_MAX, 0, 0, NULL, A(ndims2)},
    {"buffer", PS_ATTR_NAME, A(pname), NULL, 0, 0, 0, 0, NULL, 0},   /* required: a suffix, or null */
    ATTR_END,
};
static const ps_attr_spec index_select_attrs[] = {
    {"dim", PS_ATTR_INT, A(dim), "1", -5, 5, 0, 0, NULL, 0},
    {"index", PS_ATTR_DIMS, A(dims), NULL, 0, PS_DIM_MAX, 0, 0, NULL, A(ndims)},
    ATTR_END,
};
static const ps_attr_spec shuffle_attrs[] = {
    ATTR_INT("groups", groups, NULL, 1),
    ATTR_END,
};
static const ps_attr_spec unfold_attrs[] = {
    ATTR_PAIR("kernel_size", kernel, NULL, 1),
    ATTR_PAIR("dilation", dilation, "1", 1),
    ATTR_PAIR("padding", padding, "0", 0),
    ATTR_PAIR("stride", stride, "1", 1),
    ATTR_END,
};
static const ps_attr_spec fold_attrs[] = {
    ATTR_PAIR("output_size", output_size, NULL, 1),
    ATTR_PAIR("kernel_size", kernel, NULL, 1),
    ATTR_PAIR("dilation", dilation, "1", 1),
    ATTR_PAIR("padding", padding, "0", 0),
    ATTR_PAIR("stride", stride, "1", 1),
    ATTR_END,
};
static const ps_attr_spec cumsum_attrs[] = {
    {"dim", PS_ATTR_INT, A(dim), NULL, -5, 5, 0, 0, NULL, 0},
    ATTR_BOOL("reverse", cum_reverse, "false"),
    ATTR_BOOL("exclusive", cum_exclusive, "false"),
    ATTR_END,
};
static const ps_attr_spec narrow_attrs[] = {
    {"dim", PS_ATTR_INT, A(dim), "1", -5, 5, 0, 0, NULL, 0},
    ATTR_INT("start", start, NULL, 0),
    ATTR_INT("length", length, NULL, 1),
    ATTR_INT("step", step, "1", 1),
    ATTR_END,
};
static const ps_attr_spec permute_attrs[] = {
    {"dims", PS_ATTR_BATCH_DIMS, A(perm), NULL, -(PS_SHAPE_MAX_DIMS + 1), PS_SHAPE_MAX_DIMS, 0, 0, NULL, A(nperm)},
    ATTR_END,
};
static const ps_attr_spec scale_attrs[] = {
    {"shape", PS_ATTR_DIMS, A(dims), NULL, 1, PS_DIM_MAX, 0, 0, NULL, A(ndims)},
    {"parameter", PS_ATTR_NAME, A(pname), "weight", 0, 0, 0, 0, NULL, 0},
    ATTR_END,
};
static const char *const kpm_forms[] = {"bool", "float", NULL};
static const ps_attr_spec mha_attrs[] = {
    {"embed_dim", PS_ATTR_INT, A(out), NULL, 1, 65536, 0, 0, NULL, 0},
    {"num_heads", PS_ATTR_INT, A(num), NULL, 1, 65536, 0, 0, NULL, 0},
    ATTR_FLOAT("dropout", p, "0.0", 0, 1, 0, 1),
    ATTR_BOOL("bias", bias, "true"),
    ATTR_BOOL("batch_first", mode, "false"),
    ATTR_BOOL("causal", causal, "false"),
    {"key_padding_mask", PS_ATTR_ENUM, A(kpm_float), "bool", 0, 0, 0, 0, kpm_forms, 0},
    ATTR_BOOL("cross", cross, "false"),
    ATTR_END,
};
static const char *const mm_sides[] = {"right", "left", NULL};
static const ps_attr_spec matmul_attrs[] = {
    ATTR_BOOL("transpose_a", trans_a, "false"),
    ATTR_BOOL("transpose_b", trans_b, "false"),
    /* a learned operand (x @ self.W): its state_dict suffix (null: the node's name is the tensor's), its dims,
       its side; not given: two computed inputs */
    {"parameter", PS_ATTR_NAME, A(pname), "", 0, 0, 0, 0, NULL, 0},
    {"shape", PS_ATTR_DIMS, A(dims), "", 1, PS_DIM_MAX, 0, 0, NULL, A(ndims)},
    {"parameter_side", PS_ATTR_ENUM, A(mm_left), "right", 0, 0, 0, 0, mm_sides, 0},
    ATTR_END,
};
static const ps_attr_spec eq_attrs[] = {
    {"value", PS_ATTR_INT, A(eq_value), NULL, -9007199254740992.0, 9007199254740992.0, 0, 0,   /* +-2^53 */
     NULL, 0},
    ATTR_END,
};
static const ps_attr_spec mulconst_attrs[] = {
    ATTR_FLOAT("value", value, NULL, -1e30, 1e30, 0, 0),
    ATTR_END,
};
static const char *const tri_masks[] = {"triu", "tril", NULL};
static const ps_attr_spec masked_fill_attrs[] = {
    {"mask", PS_ATTR_ENUM, A(tri), NULL, 0, 0, 0, 0, tri_masks, 0},
    {"diagonal", PS_ATTR_INT, A(diagonal), "0", -PS_DIM_MAX, PS_DIM_MAX, 0, 0, NULL, 0},
    {"value", PS_ATTR_FLOAT_INF, A(value), NULL, 0, 0, 0, 0, NULL, 0},
    ATTR_END,
};
static const ps_attr_spec roll_attrs[] = {
    {"shifts", PS_ATTR_DIMS, A(shifts), NULL, -PS_DIM_MAX, PS_DIM_MAX, 0, 0, NULL, A(nshifts)},
    {"dims", PS_ATTR_DIMS, A(rdims), NULL, -(PS_SHAPE_MAX_DIMS + 1), PS_SHAPE_MAX_DIMS, 0, 0, NULL, A(nrdims)},
    ATTR_END,
};
static const ps_attr_spec flip_attrs[] = {
    {"dims", PS_ATTR_DIMS, A(rdims), NULL, -(PS_SHAPE_MAX_DIMS + 1), PS_SHAPE_MAX_DIMS, 0, 0, NULL, A(nrdims)},
    ATTR_END,
};
/* a tensor compared with a number; Where's numbers in place of a and b (null: an input) */
static const ps_attr_spec compare_attrs[] = {
    ATTR_FLOAT("value", value, NULL, -1e30, 1e30, 0, 0),
    ATTR_END,
};
static const ps_attr_spec where_attrs[] = {
    {"a", PS_ATTR_FLOAT_OR_NULL, A(where_a), "null", -INFINITY, INFINITY, 0, 0, NULL, A(where_a_null)},
    {"b", PS_ATTR_FLOAT_OR_NULL, A(where_b), "null", -INFINITY, INFINITY, 0, 0, NULL, A(where_b_null)},
    ATTR_END,
};
static const ps_attr_spec pad_attrs[] = {
    {"pad", PS_ATTR_PADS, A(pads), NULL, 0, PS_DIM_MAX, 0, 0, NULL, A(npads)},
    ATTR_FLOAT("value", value, "0.0", -1e30, 1e30, 0, 0),
    {"mode", PS_ATTR_ENUM, A(pad_mode), "constant", 0, 0, 0, 0, pad_modes, 0},
    ATTR_END,
};
static const ps_attr_spec rpb_attrs[] = {
    ATTR_PAIR("window_size", window, NULL, 1),
    {"num_heads", PS_ATTR_INT, A(num), NULL, 1, 65536, 0, 0, NULL, 0},
    ATTR_PAIR("windows", windows, "1", 1),
    ATTR_PAIR("shift_size", shift, "0", 0),
    ATTR_END,
};
/* upsampling: ConvTranspose2d, Upsample */
static const ps_attr_spec upconv_attrs[] = {
    ATTR_INT("in_channels", in_features, "", 1),
    ATTR_INT("out_channels", out, NULL, 1),
    ATTR_PAIR("kernel_size", kernel, NULL, 1),
    ATTR_PAIR("stride", stride, "1", 1),
    ATTR_PAIR("padding", padding, "0", 0),
    ATTR_PAIR("output_padding", output_padding, "0", 0),
    ATTR_PAIR("dilation", dilation, "1", 1),
    ATTR_INT("groups", groups, "1", 1),
    ATTR_BOOL("bias", bias, "true"),
    {"padding_mode", PS_ATTR_ENUM, A(flag), "zeros", 0, 0, 0, 0, padding_modes, 0},
    ATTRS_WEIGHT_NORM,
    ATTR_END,
};
static const char *const resize_modes[] = {"nearest", "bilinear", NULL};
static const ps_attr_spec resize_attrs[] = {
    {"size", PS_ATTR_PAIR_OR_NULL, A(size), "null", 1, 65536, 0, 0, NULL, 0},
    {"scale_factor", PS_ATTR_FLOAT_PAIR_OR_NULL, A(scale_factor), "null", 0, 65536, 1, 0, NULL, A(scale_given)},
    {"mode", PS_ATTR_ENUM, A(resize_mode), "nearest", 0, 0, 0, 0, resize_modes, 0},
    ATTR_BOOL("align_corners", align_corners, "false"),
    ATTR_BOOL("recompute_scale_factor", recompute_scale, "false"),
    ATTR_END,
};
static const ps_attr_spec affgrid_attrs[] = {
    {"size", PS_ATTR_PAIR, A(size), NULL, 1, 65536, 0, 0, NULL, 0},
    ATTR_BOOL("align_corners", align_corners, "false"),
    ATTR_END,
};
static const char *const gs_modes[] = {"bilinear", "nearest", "bicubic", NULL};
static const char *const gs_paddings[] = {"zeros", "border", "reflection", NULL};
static const ps_attr_spec gridsample_attrs[] = {
    {"mode", PS_ATTR_ENUM, A(gs_mode), "bilinear", 0, 0, 0, 0, gs_modes, 0},
    {"padding_mode", PS_ATTR_ENUM, A(gs_padding), "zeros", 0, 0, 0, 0, gs_paddings, 0},
    ATTR_BOOL("align_corners", align_corners, "false"),
    ATTR_END,
};
static const ps_attr_spec no_attrs[] = {ATTR_END};

/* ---------------------------------------------------------------- table */

#define F_ACT (PS_KIND_LAYOUT_KEEP | PS_KIND_INPLACE)
#define F_DROP (PS_KIND_EVAL_VIEW | PS_KIND_DROPOUT | PS_KIND_INPLACE)
static const ps_layer_kind kinds[] = {
    {"Conv2d", PS_KIND_LAYOUT_BLOCKED | PS_KIND_BWD_X | PS_KIND_BWD_PARTS, 1, 1, conv_attrs, conv_infer, wn_missing,
     conv_forward, conv_backward, NULL, NULL, conv_flops},
    {"Linear", PS_KIND_BWD_X, 1, 1, linear_attrs, linear_infer, wn_missing, linear_forward, linear_backward, NULL, NULL,
     linear_flops},
    {"Bilinear", PS_KIND_BWD_X, 2, 2, bilinear_attrs, bilinear_infer, bilinear_missing, bilinear_forward,
     bilinear_backward, bilinear_bytes, NULL, bilinear_flops},
    {"BatchNorm2d", PS_KIND_LAYOUT_KEEP | PS_KIND_BWD_X | PS_KIND_BUFFERS_EVAL, 1, 1, bn_attrs, bn2d_infer,
     bn_missing, bn_forward, bn_backward, bn_bytes, NULL, bn_flops, bn_stats, bn_fold},
    {"BatchNorm1d", PS_KIND_BWD_X | PS_KIND_BUFFERS_EVAL, 1, 1, bn_attrs, bn1d_infer, bn_missing, bn_forward,
     bn_backward, bn_bytes, NULL, bn_flops, bn_stats, bn_fold},
    {"LayerNorm", PS_KIND_BWD_X, 1, 1, ln_attrs, ln_infer, ln_missing, ln_forward, ln_backward, ln_bytes, NULL,
     ln_flops},
    {"MaxPool2d", PS_KIND_LAYOUT_KEEP, 1, 1, maxpool_attrs, pool_infer, no_op, pool_forward, pool_backward,
     pool_bytes, NULL, pool_flops},
    {"AvgPool2d", PS_KIND_LAYOUT_KEEP, 1, 1, avgpool_attrs, pool_infer, avgpool_missing, avgpool_forward,
     avgpool_backward, NULL, NULL, pool_flops},
    {"AdaptiveAvgPool2d", PS_KIND_LAYOUT_KEEP, 1, 1, adaptive_attrs, adaptive_infer, adaptive_missing,
     adaptive_forward, adaptive_backward, NULL, NULL, adaptive_flops},
    /* (N, C, L): the 2-d kinds over a (C, 1, L) plane (one_d), in the plain layout */
    {"Conv1d", PS_KIND_BWD_X | PS_KIND_BWD_PARTS, 1, 1, conv1d_attrs, conv_infer, wn_missing, conv_forward,
     conv_backward, NULL, NULL, conv_flops},
    {"MaxPool1d", 0, 1, 1, maxpool1d_attrs, pool_infer, no_op, pool_forward, pool_backward, pool_bytes, NULL,
     pool_flops},
    {"AvgPool1d", 0, 1, 1, avgpool1d_attrs, pool_infer, avgpool_missing, avgpool_forward, avgpool_backward, NULL,
     NULL, pool_flops},
    {"AdaptiveAvgPool1d", 0, 1, 1, adaptive1d_attrs, adaptive_infer, adaptive_missing, adaptive_forward,
     adaptive_backward, NULL, NULL, adaptive_flops},
    {"ReLU", F_ACT | PS_KIND_BWD_Y, 1, 1, inplace_attrs, infer_same, no_op, relu_forward, relu_backward, NULL, NULL,
     NULL},
    {"LeakyReLU", F_ACT, 1, 1, leaky_attrs, leaky_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"GELU", F_ACT, 1, 1, gelu_attrs, gelu_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"SiLU", F_ACT, 1, 1, inplace_attrs, silu_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Tanh", F_ACT, 1, 1, no_attrs, tanh_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Sigmoid", F_ACT, 1, 1, no_attrs, sigmoid_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Hardtanh", F_ACT, 1, 1, hardtanh_attrs, hardtanh_infer, act_missing, act_forward, act_backward, NULL, NULL,
     NULL},
    {"ReLU6", F_ACT, 1, 1, inplace_attrs, relu6_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Hardswish", F_ACT, 1, 1, inplace_attrs, hardswish_infer, act_missing, act_forward, act_backward, NULL, NULL,
     NULL},
    {"Hardsigmoid", F_ACT, 1, 1, inplace_attrs, hardsigmoid_infer, act_missing, act_forward, act_backward, NULL,
     NULL, NULL},
    {"Dropout", F_DROP, 1, 1, dropout_attrs, dropout_infer, no_op, dropout_forward, dropout_backward, dropout_bytes,
     NULL, NULL},
    {"Dropout2d", F_DROP | PS_KIND_LAYOUT_KEEP, 1, 1, dropout_attrs, dropout2d_infer, dropout2d_missing,
     dropout2d_forward, dropout2d_backward, dropout2d_bytes, NULL, NULL},
    /* SELU networks' dropout: the backward is Dropout's / Dropout2d's (dy times the kept mask) */
    {"AlphaDropout", F_DROP, 1, 1, dropout_attrs, dropout_infer, alpha_dropout_missing, alpha_dropout_forward,
     dropout_backward, dropout_bytes, NULL, NULL},
    {"FeatureAlphaDropout", F_DROP | PS_KIND_LAYOUT_KEEP, 1, 1, dropout_attrs, feature_alpha_dropout_infer,
     feature_alpha_dropout_missing, feature_alpha_dropout_forward, dropout2d_backward, dropout2d_bytes, NULL, NULL},
    {"RandnLike", PS_KIND_DROPOUT, 1, 1, no_attrs, randn_infer, randn_missing, randn_forward, randn_backward, NULL, NULL,
     zero_flops},
    {"StochasticDepth", F_DROP | PS_KIND_LAYOUT_KEEP, 1, 1, sdepth_attrs, infer_same, dropout2d_missing,
     sdepth_forward, sdepth_backward, sdepth_bytes, NULL, NULL},
    {"Flatten", PS_KIND_VIEW, 1, 1, flatten_attrs, flatten_infer, no_op, view_pass, view_pass, NULL, NULL, zero_flops},
    {"Reshape", PS_KIND_VIEW, 1, 1, reshape_attrs, reshape_infer, no_op, view_pass, view_pass, NULL, NULL, zero_flops},
    {"LogSoftmax", PS_KIND_BWD_Y, 1, 1, softmax_attrs, softmax_infer, log_softmax_missing, log_softmax_forward,
     log_softmax_backward, NULL, NULL, NULL},
    {"Softmax", PS_KIND_BWD_Y, 1, 1, softmax_attrs, softmax_infer, softmax_missing, softmax_forward, softmax_backward,
     NULL, NULL, NULL},
    {"Embedding", PS_KIND_BWD_X, 1, 1, emb_attrs, emb_infer, emb_missing, emb_forward, emb_backward, NULL, emb_check,
     zero_flops},
    /* recurrent layers: an LSTM whose input is one step (rnn_lm's) is held for the trainer (parameters only);
     * one over (L, input_size) sequences, and a GRU, psd runs */
    {"LSTM", PS_KIND_PARAMS_ONLY | PS_KIND_DROPOUT, 1, 1, lstm_attrs, lstm_infer, rnn_missing, rnn_forward,
     rnn_backward, rnn_bytes, NULL, rnn_flops},
    {"GRU", PS_KIND_DROPOUT, 1, 1, lstm_attrs, rnn_infer, rnn_missing, rnn_forward, rnn_backward, rnn_bytes, NULL,
     rnn_flops},
    /* one step of a recurrent cell (a loop's nn.LSTMCell / nn.GRUCell): x, then the state (none: zeros) */
    {"LSTMCell", PS_KIND_BWD_X, 1, 3, cell_attrs, cell_infer, cell_missing, cell_forward, cell_backward, cell_bytes,
     NULL, cell_flops},
    {"GRUCell", PS_KIND_BWD_X, 1, 2, cell_attrs, cell_infer, cell_missing, cell_forward, cell_backward, cell_bytes,
     NULL, cell_flops},
    {"Add", PS_KIND_LAYOUT_KEEP | PS_KIND_INPLACE | PS_KIND_GRAD_PASS, 2, PS_NODE_MAX_INPUTS, no_attrs, add_infer,
     add_missing, add_forward, add_backward, NULL, NULL, NULL},
    {"Mul", PS_KIND_BWD_X, 2, 2, no_attrs, mul_infer, mul_missing, mul_forward, mul_backward, NULL, NULL, NULL},
    {"Concat", PS_KIND_LAYOUT_KEEP, 2, PS_NODE_MAX_INPUTS, concat_attrs, concat_infer, concat_missing, concat_forward,
     concat_backward, NULL, NULL, zero_flops},
    {"Parameter", 0, 1, 1, param_attrs, param_infer, copy_fill_missing, param_forward, param_backward, NULL, NULL,
     zero_flops},
    {"Constant", 0, 1, 1, const_attrs, const_infer, copy_fill_missing, const_forward, const_backward, NULL, NULL,
     zero_flops},
    {"IndexSelect", 0, 1, 1, index_select_attrs, index_select_infer, copy_fill_missing, index_select_forward,
     index_select_backward, NULL, NULL, zero_flops},
    {"ChannelShuffle", 0, 1, 1, shuffle_attrs, shuffle_infer, copy_missing, shuffle_forward, shuffle_backward, NULL,
     NULL, zero_flops},
    {"Narrow", 0, 1, 1, narrow_attrs, narrow_infer, copy_fill_missing, narrow_forward, narrow_backward, NULL, NULL,
     zero_flops},
    {"Permute", 0, 1, 1, permute_attrs, permute_infer, permute_missing, permute_forward, permute_backward, NULL,
     NULL, zero_flops},
    {"Scale", PS_KIND_BWD_X, 1, 1, scale_attrs, scale_infer, scale_missing, scale_forward, scale_backward, NULL,
     NULL, NULL},
    {"MultiheadAttention", PS_KIND_BWD_X | PS_KIND_DROPOUT | PS_KIND_BWD_PARTS, 1, 3, mha_attrs, mha_infer,
     mha_missing, mha_forward, mha_backward, mha_bytes, NULL, mha_flops},
    /* attention written by hand (q @ k^T / sqrt(d), softmax, @ v) */
    {"MatMul", PS_KIND_BWD_X, 1, 2, matmul_attrs, matmul_infer, matmul_missing, matmul_forward, matmul_backward, NULL,
     NULL, matmul_flops},
    {"MulConstant", PS_KIND_LAYOUT_KEEP | PS_KIND_INPLACE, 1, 1, mulconst_attrs, infer_same, mulconst_missing,
     mulconst_forward, mulconst_backward, NULL, NULL, NULL},
    /* swin's shifted windows: torch.roll, F.pad (Narrow's step: its patch merging's strided slices) */
    {"Roll", 0, 1, 1, roll_attrs, roll_infer, copy_missing, roll_forward, roll_backward, NULL, NULL, zero_flops},
    /* torch.cumsum (users' hand-written layers; ONNX's CumSum) */
    {"CumSum", 0, 1, 1, cumsum_attrs, cumsum_infer, cumsum_missing, cumsum_forward, cumsum_backward, NULL, NULL,
     NULL},
    /* F.unfold / F.fold (patch extraction: hand-written patch embeddings, local attention) */
    {"Unfold", 0, 1, 1, unfold_attrs, unfold_infer, unfold_missing, unfold_forward, unfold_backward, NULL, NULL,
     zero_flops},
    {"Fold", 0, 1, 1, fold_attrs, fold_infer, unfold_missing, fold_forward, fold_backward, NULL, NULL, NULL},
    {"Pad", 0, 1, 1, pad_attrs, pad_infer, copy_fill_missing, pad_forward, pad_backward, NULL, NULL, zero_flops},
    {"RelativePositionBias", 0, 1, 1, rpb_attrs, rpb_infer, rpb_missing, rpb_forward, rpb_backward, NULL, NULL,
     zero_flops},
    /* attention masks (minGPT's causal masked_fill) */
    {"MaskedFill", PS_KIND_INPLACE, 1, 1, masked_fill_attrs, masked_fill_infer, tri_fill_missing, masked_fill_forward,
     masked_fill_backward, NULL, NULL, NULL},
    /* group and instance normalisation (U-Nets, diffusion models, style transfer) */
    {"GroupNorm", PS_KIND_BWD_X, 1, 1, gn_attrs, gn_infer, gn_missing, gn_forward, gn_backward, gn_bytes, NULL,
     gn_flops},
    {"InstanceNorm1d", PS_KIND_BWD_X, 1, 1, instnorm_attrs, in1d_infer, gn_missing, gn_forward, gn_backward, gn_bytes,
     NULL, gn_flops},
    {"InstanceNorm2d", PS_KIND_BWD_X, 1, 1, instnorm_attrs, in2d_infer, gn_missing, gn_forward, gn_backward, gn_bytes,
     NULL, gn_flops},
    /* F.normalize (p 2) */
    {"Normalize", PS_KIND_BWD_X, 1, 1, l2norm_attrs, l2norm_infer, l2norm_missing, l2norm_forward, l2norm_backward,
     NULL, NULL, NULL},
    /* elementwise math (users' own layers): the activations' ops */
    {"ELU", F_ACT, 1, 1, elu_attrs, elu_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"SELU", F_ACT, 1, 1, inplace_attrs, selu_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Softplus", F_ACT, 1, 1, softplus_attrs, softplus_infer, act_missing, act_forward, act_backward, NULL, NULL,
     NULL},
    {"Mish", F_ACT, 1, 1, inplace_attrs, mish_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"LogSigmoid", F_ACT, 1, 1, no_attrs, logsigmoid_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Exp", F_ACT, 1, 1, no_attrs, exp_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Log", F_ACT, 1, 1, no_attrs, log_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Abs", F_ACT, 1, 1, no_attrs, abs_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Sqrt", F_ACT, 1, 1, no_attrs, sqrt_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Pow", F_ACT, 1, 1, pow_attrs, pow_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"AddConstant", F_ACT, 1, 1, addconst_attrs, addconst_infer, act_missing, act_forward, act_backward, NULL, NULL,
     NULL},
    {"Sub", 0, 2, 2, no_attrs, sub_infer, sub_missing, sub_forward, sub_backward, NULL, NULL, NULL},
    /* shrinks and thresholds, nn.RReLU (eval), nn.PReLU (the first activation with a parameter) */
    {"CELU", F_ACT, 1, 1, celu_attrs, celu_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Softsign", F_ACT, 1, 1, no_attrs, softsign_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Tanhshrink", F_ACT, 1, 1, no_attrs, tanhshrink_infer, act_missing, act_forward, act_backward, NULL, NULL,
     NULL},
    {"Hardshrink", F_ACT, 1, 1, hardshrink_attrs, hardshrink_infer, act_missing, act_forward, act_backward, NULL,
     NULL, NULL},
    {"Softshrink", F_ACT, 1, 1, softshrink_attrs, softshrink_infer, act_missing, act_forward, act_backward, NULL,
     NULL, NULL},
    {"Threshold", F_ACT, 1, 1, threshold_attrs, threshold_infer, act_missing, act_forward, act_backward, NULL, NULL,
     NULL},
    {"RReLU", PS_KIND_INPLACE | PS_KIND_DROPOUT, 1, 1, rrelu_attrs, rrelu_infer, rrelu_missing, rrelu_forward,
     rrelu_backward, dropout_bytes, NULL, NULL},
    {"PReLU", PS_KIND_LAYOUT_KEEP | PS_KIND_BWD_X, 1, 1, prelu_attrs, prelu_infer, prelu_missing, prelu_forward,
     prelu_backward, NULL, NULL, NULL},
    /* a / b of computed tensors (numpy broadcasting, as Add, Sub and Mul of two) */
    {"Div", PS_KIND_BWD_X, 2, 2, no_attrs, div_infer, div_missing, div_forward, div_backward, NULL, NULL, NULL},
    /* key padding masks from the token ids (MultiheadAttention's key_padding_mask = ids == pad) */
    {"Eq", 0, 1, 1, eq_attrs, eq_infer, eq_missing, eq_forward, eq_backward, NULL, NULL, NULL},    /* upsampling (decoders, U-Nets): the transposed convolution, nn.Upsample / F.interpolate */
    {"ConvTranspose2d", PS_KIND_LAYOUT_BLOCKED | PS_KIND_BWD_X, 1, 1, upconv_attrs, upconv_infer, upconv_missing, upconv_forward,
     upconv_backward, NULL, NULL, upconv_flops},
    {"Upsample", 0, 1, 1, resize_attrs, resize_infer, resize_missing, resize_forward, resize_backward, NULL, NULL,
     resize_flops},
    /* spatial transformers (the STN tutorial): F.affine_grid, F.grid_sample (input, grid) */
    {"AffineGrid", 0, 1, 1, affgrid_attrs, affgrid_infer, affgrid_missing, affgrid_forward, affgrid_backward, NULL,
     NULL, affgrid_flops},
    {"GridSample", PS_KIND_BWD_X, 2, 2, gridsample_attrs, gridsample_infer, gridsample_missing, gridsample_forward,
     gridsample_backward, NULL, NULL, gridsample_flops},
    /* users' elementwise functions: torch.maximum / minimum of two tensors (numpy broadcasting, as Div),
     * torch.where with a comparison of a tensor and a number as its condition, log1p, expm1, sin, cos,
     * torch.flip */
    {"Maximum", PS_KIND_BWD_X, 2, 2, no_attrs, div_infer, div_missing, extreme_forward, extreme_backward, NULL, NULL,
     NULL},
    {"Minimum", PS_KIND_BWD_X, 2, 2, no_attrs, div_infer, div_missing, extreme_forward, extreme_backward, NULL, NULL,
     NULL},
    {"Greater", F_ACT, 1, 1, compare_attrs, gt_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Less", F_ACT, 1, 1, compare_attrs, lt_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"GreaterOrEqual", F_ACT, 1, 1, compare_attrs, ge_infer, act_missing, act_forward, act_backward, NULL, NULL,
     NULL},
    {"LessOrEqual", F_ACT, 1, 1, compare_attrs, le_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Where", PS_KIND_BWD_X, 1, 3, where_attrs, where_infer, where_missing, where_forward, where_backward, NULL,
     NULL, NULL},
    {"Log1p", F_ACT, 1, 1, no_attrs, log1p_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Erf", F_ACT, 1, 1, no_attrs, erf_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Sign", F_ACT, 1, 1, no_attrs, sign_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Expm1", F_ACT, 1, 1, no_attrs, expm1_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Sin", F_ACT, 1, 1, no_attrs, sin_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Cos", F_ACT, 1, 1, no_attrs, cos_infer, act_missing, act_forward, act_backward, NULL, NULL, NULL},
    {"Flip", 0, 1, 1, flip_attrs, rdims_infer, copy_missing, flip_forward, flip_backward, NULL, NULL, zero_flops},
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
    if (rc == PS_OK) rc = wn_params(ly, err);   /* weight_norm: weight_g, weight_v for the kind's weight */
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

/* ---- per-sample kinds: what a combined forward of several callers' samples may cut back ---- */

static size_t dropout_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    (void)be;
    return j == 0 ? dropout_bytes(ly, n) : 0;
}

static size_t bilinear_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    (void)be;
    return j == 0 ? bilinear_bytes(ly, n) : 0;   /* the rows' outer products, sample-major */
}

static size_t dropout2d_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    (void)be;
    return j == 0 ? dropout2d_bytes(ly, n) : 0;
}

/* Per sample in 'row' mode; 'batch' mode's one draw couples the samples. */
static size_t sdepth_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    (void)be;
    if (ly->a.mode) return (size_t)-1;
    return j == 0 ? sdepth_bytes(ly, n) : 0;
}

static size_t maxpool_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    if (j) return 0;
    ps_pool_desc d = pool_desc(ly, n);
    size_t b = be->ops->maxpool_workspace_size(be->impl, &d);
    return b ? b : (size_t)-1;
}

/* GroupNorm's mean (dev[0]) and rstd (dev[1]): one float per (sample, group) */
static size_t gn_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    (void)be;
    return j < 2 ? gn_bytes(ly, n) / 2 : 0;
}

/* mean (dev[0]) and rstd (dev[1]): one float per normalised row, each
 * sample's rows together */
static size_t ln_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    (void)be;
    return j < 2 ? (size_t)ln_desc(ly, n).rows * sizeof(float) : 0;
}

/* mha_forward's tape: the attention dropout's mask (dev[0], in training
 * with dropout > 0), q, k, v (dev[1..3], (n, H, L, D)), P (dev[4], (n, H,
 * L, L)), o (dev[5], (n, L, E)) */
static size_t mha_saved(const ps_layer *ly, const ps_backend *be, int n, int j) {
    (void)be;
    const mha_geom g = mha_of(ly, n);
    const int64_t floats[PS_LAYER_MAX_SAVED] = {ly->a.p > 0 ? g.p : 0, g.nle, g.nke, g.nke, g.p, g.nle};
    return (size_t)floats[j] * sizeof(float);
}

/* Kinds whose sample i's output, saved state and gradients depend on
 * sample i alone, and the bytes of what they save (NULL: nothing). Not
 * here: BatchNorm1d/2d (a training forward normalises by the batch's
 * statistics), LSTM and GRU (a recurrent node keeps its tape time-major,
 * (L, n, ...), so one forward's saved state does not cut by samples; a
 * parameter-only LSTM is never run). Parameter is here: each sample's output is the tensor
 * itself, and its gradient from a caller's samples is the sum of their dy
 * alone (a combined backward computes it per caller, as Linear's bias);
 * IndexSelect is a copy within each sample (dim 0, the batch, refused). */
static const struct {
    const char *kind;
    size_t (*saved)(const ps_layer *ly, const ps_backend *be, int n, int j);
} per_sample_kinds[] = {
    {"Conv2d", NULL}, {"Linear", NULL}, {"MaxPool2d", maxpool_saved}, {"AvgPool2d", NULL},
    {"AdaptiveAvgPool2d", NULL}, {"Conv1d", NULL}, {"MaxPool1d", maxpool_saved}, {"AvgPool1d", NULL},
    {"AdaptiveAvgPool1d", NULL}, {"ReLU", NULL}, {"LeakyReLU", NULL}, {"GELU", NULL}, {"SiLU", NULL},
    {"Tanh", NULL}, {"Sigmoid", NULL}, {"Hardtanh", NULL}, {"ReLU6", NULL}, {"Hardswish", NULL},
    {"Hardsigmoid", NULL}, {"Dropout", dropout_saved}, {"Dropout2d", dropout2d_saved},
    {"AlphaDropout", dropout_saved}, {"FeatureAlphaDropout", dropout2d_saved},
    {"StochasticDepth", sdepth_saved},
    {"Flatten", NULL}, {"Reshape", NULL}, {"LogSoftmax", NULL}, {"Softmax", NULL}, {"Embedding", NULL},
    {"Roll", NULL}, {"Pad", NULL}, {"RelativePositionBias", NULL},
    {"CumSum", NULL},
    {"Unfold", NULL}, {"Fold", NULL},
    {"Add", NULL}, {"Mul", NULL}, {"Concat", NULL}, {"ChannelShuffle", NULL}, {"Narrow", NULL},
    {"Permute", NULL}, {"Scale", NULL},
    {"MatMul", NULL}, {"MulConstant", NULL},
    {"MaskedFill", NULL},
    {"Eq", NULL},
    {"ConvTranspose2d", NULL}, {"Upsample", NULL},
    /* group and instance normalisation: each sample's own statistics */
    {"GroupNorm", gn_saved}, {"InstanceNorm1d", gn_saved}, {"InstanceNorm2d", gn_saved},
    {"Normalize", NULL},
    /* elementwise math */
    {"ELU", NULL}, {"SELU", NULL}, {"Softplus", NULL}, {"Mish", NULL}, {"LogSigmoid", NULL}, {"Exp", NULL},
    {"Log", NULL}, {"Abs", NULL}, {"Sqrt", NULL}, {"Pow", NULL}, {"AddConstant", NULL}, {"Sub", NULL},
    /* shrinks and thresholds, RReLU, PReLU */
    {"CELU", NULL}, {"Softsign", NULL}, {"Tanhshrink", NULL}, {"Hardshrink", NULL}, {"Softshrink", NULL},
    {"Threshold", NULL}, {"RReLU", dropout_saved}, {"PReLU", NULL},
    {"Div", NULL},
    {"LayerNorm", ln_saved}, {"MultiheadAttention", mha_saved}, {"Parameter", NULL}, {"IndexSelect", NULL},
    {"Constant", NULL}, {"RandnLike", NULL}, {"Bilinear", bilinear_saved},
    /* maximum / minimum, comparisons and where, log1p, expm1, sin, cos, flip */
    {"Maximum", NULL}, {"Minimum", NULL}, {"Greater", NULL}, {"Less", NULL}, {"GreaterOrEqual", NULL},
    {"LessOrEqual", NULL}, {"Where", NULL}, {"Log1p", NULL}, {"Erf", NULL}, {"Sign", NULL},
    {"Expm1", NULL}, {"Sin", NULL}, {"Cos", NULL},
    {"Flip", NULL},
    /* recurrent cells: the tape's gates and c' sample-major */
    {"LSTMCell", cell_saved}, {"GRUCell", cell_saved},
    /* spatial transformers */
    {"AffineGrid", NULL}, {"GridSample", NULL},
};

int ps_layer_per_sample(const ps_layer *ly, const ps_backend *be, int n, size_t saved[PS_LAYER_MAX_SAVED]) {
    for (size_t i = 0; i < sizeof per_sample_kinds / sizeof per_sample_kinds[0]; i++) {
        if (strcmp(per_sample_kinds[i].kind, ly->kind->name)) continue;
        for (int j = 0; j < PS_LAYER_MAX_SAVED; j++) {
            saved[j] = per_sample_kinds[i].saved ? per_sample_kinds[i].saved(ly, be, n, j) : 0;
            if (saved[j] == (size_t)-1) return 0;
        }
        return 1;
    }
    return 0;
}

void ps_layer_dropout_mask(const ps_layer *ly, int n, ps_rng *rng, float *mask) {
    if (!strcmp(ly->kind->name, "RReLU")) {   /* slopes, not keep/drop */
        rrelu_draws(ly, rng, mask, ps_layer_dropout_draws(ly, n));
        return;
    }
    if (!strcmp(ly->kind->name, "RandnLike")) {   /* the noise itself */
        randn_draws(rng, mask, ps_layer_dropout_draws(ly, n));
        return;
    }
    drop_draws(ly, rng, mask, ps_layer_dropout_draws(ly, n));
}

int64_t ps_layer_dropout_draws(const ps_layer *ly, int n) {
    if (!(ly->flags & PS_KIND_DROPOUT)) return 0;
    if (!strcmp(ly->kind->name, "Dropout2d") || !strcmp(ly->kind->name, "FeatureAlphaDropout"))
        return (int64_t)n * ly->in[0].dims[0];
    if (!strcmp(ly->kind->name, "StochasticDepth")) return ly->a.mode ? 1 : n;
    if (!strcmp(ly->kind->name, "MultiheadAttention")) return ly->a.p > 0 ? mha_of(ly, n).p : 0;   /* one per weight */
    if (!strcmp(ly->kind->name, "LSTM") || !strcmp(ly->kind->name, "GRU")) {   /* between layers, in training */
        if (ly->flags & PS_KIND_PARAMS_ONLY) return 0;
        const rnn_geom g = rnn_of(ly, n, 1);
        return g.drop ? (int64_t)(g.layers - 1) * g.L * g.n * g.H : 0;
    }
    return ps_layer_out_count(ly, n);
}
