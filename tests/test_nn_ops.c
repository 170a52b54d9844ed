/* test_nn_ops.c - the backend ops issue 18 added (common/nn/backend.h:
 * general conv2d, max/avg pooling with padding, batch and layer
 * normalisation, activations, softmax over a dimension, channel masks,
 * strided copies, add_out, fill) and adaptive average pooling's uneven
 * bins, on every backend, against PyTorch.
 *
 *  1. Golden: tests/golden/nn_ops.safetensors (scripts/gen_golden_ops.py,
 *     PyTorch 1.13 autograd) holds, per case, the inputs, parameters,
 *     outputs and every gradient; each case runs on the ref backend here.
 *  2. The ref backend against central finite differences of the loss
 *     sum(y * gy) on the same cases (every input and parameter gradient),
 *     so the ground truth is not only as good as one PyTorch file.
 *  3. The dnnl backend in one child process per ISA this CPU has
 *     (ONEDNN_MAX_CPU_ISA = AVX512_CORE, AVX2, SSE41; oneDNN fixes its ISA
 *     at first use, hence a re-exec, as tests/test_isa.c does): every case
 *     in the plain layout and, where the op takes one and the backend
 *     offers it for the channel count, the blocked layout; then no
 *     primitive may have got a disallowed reference kernel
 *     (ps_backend_fallbacks), and below AVX-512 an average pool forced onto
 *     nChw16c, which has no kernel there, must be reported (the check can
 *     fail).
 *  4. The cuda backend when this machine has a device (else that part
 *     prints "skipped"); its op table must be complete either way.
 */
#include "backend.h"
#include "check.h"
#include "safetensors.h"
#include "support/isa_child.h"
#include "support/random.h"
#ifdef PS_HAVE_CUDA
#include "backend_impl.h"   /* only to see that the CUDA table has every op without a device */
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN_OPS "tests/golden/nn_ops.safetensors"

/* ---- golden cases ---- */

typedef struct gcase {
    const ps_st_file *g;
    char name[64];
    const char *desc;   /* "kind=conv n=2 ..." */
} gcase;

/* Value of key in the description; NULL when absent. */
static const char *attr_s(const gcase *c, const char *key, char *buf, size_t size) {
    size_t kl = strlen(key);
    for (const char *p = c->desc; (p = strstr(p, key)) != NULL; p += kl) {
        if ((p == c->desc || p[-1] == ' ') && p[kl] == '=') {
            size_t n = strcspn(p + kl + 1, " ");
            if (n >= size) n = size - 1;
            memcpy(buf, p + kl + 1, n);
            buf[n] = 0;
            return buf;
        }
    }
    return NULL;
}

static long attr_i(const gcase *c, const char *key) {
    char buf[64];
    const char *v = attr_s(c, key, buf, sizeof buf);
    PS_ASSERT(v);
    return strtol(v, NULL, 10);
}

static double attr_f(const gcase *c, const char *key) {
    char buf[64];
    const char *v = attr_s(c, key, buf, sizeof buf);
    PS_ASSERT(v);
    return strtod(v, NULL);
}

/* The golden tensor "<case>.<t>", or NULL. */
static const ps_st_tensor *gt(const gcase *c, const char *t) {
    char full[PS_ST_NAME_MAX];
    snprintf(full, sizeof full, "%s.%s", c->name, t);
    const ps_st_tensor *x = ps_st_find(c->g, full);
    PS_ASSERT(!x || x->dtype == PS_ST_F32);
    return x;
}

/* ---- named host arrays: a case's inputs and a run's outputs ---- */

#define IO_MAX 16

typedef struct named {
    const char *name;
    float *p;
    size_t n;
} named;

typedef struct io {
    named in[IO_MAX];
    int nin;
    named out[IO_MAX];
    int nout;
} io;

static float *host_alloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    PS_ASSERT(p);
    return p;
}

static named *io_find(named *v, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, name)) return &v[i];
    return NULL;
}

/* The case's inputs: copies of every golden tensor that is not an
 * output or a gradient. */
static void io_load(io *v, const gcase *c) {
    static const char *const kInputs[] = { "x", "w", "b", "a", "gamma", "beta", "running_mean", "running_var",
                                           "mask", "gy" };
    memset(v, 0, sizeof *v);
    for (size_t i = 0; i < sizeof kInputs / sizeof kInputs[0]; i++) {
        const ps_st_tensor *t = gt(c, kInputs[i]);
        if (!t) continue;
        size_t n = (size_t)ps_st_numel(t);
        named *e = &v->in[v->nin++];
        e->name = kInputs[i];
        e->n = n;
        e->p = host_alloc(n);
        memcpy(e->p, t->data, n * sizeof(float));
    }
}

static float *in_get(io *v, const char *name) {
    named *e = io_find(v->in, v->nin, name);
    return e ? e->p : NULL;
}

static size_t in_len(io *v, const char *name) {
    named *e = io_find(v->in, v->nin, name);
    return e ? e->n : 0;
}

static float *out_new(io *v, const char *name, size_t n) {
    PS_ASSERT(v->nout < IO_MAX && !io_find(v->out, v->nout, name));
    named *e = &v->out[v->nout++];
    e->name = name;
    e->n = n;
    e->p = host_alloc(n);
    return e->p;
}

static float *out_get(io *v, const char *name) {
    named *e = io_find(v->out, v->nout, name);
    return e ? e->p : NULL;
}

static void io_clear_out(io *v) {
    for (int i = 0; i < v->nout; i++) free(v->out[i].p);
    v->nout = 0;
}

static void io_free(io *v) {
    io_clear_out(v);
    for (int i = 0; i < v->nin; i++) free(v->in[i].p);
    v->nin = 0;
}

/* ---- device buffers ---- */

/* Run op of backend b (err is the last argument), CHECKing it succeeded. */
#define RUN(b, op, ...) do { ps_err err_ = { 0 }; \
    ps_status s_ = (b)->ops->op((b)->impl, __VA_ARGS__, &err_); \
    CHECK_MSG(s_ == PS_OK, "%s %s: %s", (b)->ops->name, #op, err_.msg); } while (0)

static float *dev_from(ps_backend *b, const float *host, size_t n) {
    float *p = ps_backend_alloc_floats(b, (int64_t)(n ? n : 1));
    PS_ASSERT(p);
    if (host && n) {
        ps_err err = { 0 };
        CHECK_MSG(b->ops->copy_to_device(b->impl, p, host, n * sizeof *p, &err) == PS_OK, "%s", err.msg);
    }
    return p;
}

static void dev_to(ps_backend *b, float *host, const float *dev, size_t n) {
    ps_err err = { 0 };
    CHECK_MSG(b->ops->copy_to_host(b->impl, host, dev, n * sizeof *host, &err) == PS_OK, "%s", err.msg);
}

/* An activation (n, c, h, w) on the device in `layout`, from a plain host array. */
static float *act_in(ps_backend *b, const float *host, int n, int c, int h, int w, int layout) {
    size_t cnt = (size_t)n * c * h * w;
    float *p = dev_from(b, host, cnt);
    if (layout == PS_LAYOUT_PLAIN) return p;
    float *q = dev_from(b, NULL, cnt);
    RUN(b, reorder, n, c, h, w, p, PS_LAYOUT_PLAIN, q, PS_LAYOUT_BLOCKED);
    ps_backend_release(b, p);
    return q;
}

/* Back to a plain host array (the output named name). */
static void act_out(ps_backend *b, io *v, const char *name, const float *dev, int n, int c, int h, int w,
                    int layout) {
    size_t cnt = (size_t)n * c * h * w;
    float *host = out_new(v, name, cnt);
    if (layout == PS_LAYOUT_PLAIN) {
        dev_to(b, host, dev, cnt);
        return;
    }
    float *q = dev_from(b, NULL, cnt);
    RUN(b, reorder, n, c, h, w, dev, PS_LAYOUT_BLOCKED, q, PS_LAYOUT_PLAIN);
    dev_to(b, host, q, cnt);
    ps_backend_release(b, q);
}

static void vec_out(ps_backend *b, io *v, const char *name, const float *dev, size_t n) {
    dev_to(b, out_new(v, name, n), dev, n);
}

/* ---- the ops, one runner per kind ----
 * A runner runs the case's op on b with v's inputs (forward, and the
 * backward unless fwd_only) and leaves host outputs in v named like the
 * golden tensors they must match. layout: of the activations, for the ops
 * that take one (the caller checks the backend offers it). */

typedef struct run_opts {
    int layout;
    int fwd_only;
    int square_form;    /* conv/pool: fill the descriptor's square (legacy) form */
} run_opts;

typedef void (*runner)(ps_backend *b, const gcase *c, io *v, const run_opts *o);

static ps_conv_desc conv_desc_of(const gcase *c, const run_opts *o) {
    ps_conv_desc d = { .n = (int)attr_i(c, "n"), .cin = (int)attr_i(c, "cin"), .h = (int)attr_i(c, "h"),
                       .w = (int)attr_i(c, "w"), .cout = (int)attr_i(c, "cout"), .kh = (int)attr_i(c, "kh"),
                       .kw = (int)attr_i(c, "kw"), .src_layout = o->layout, .dst_layout = o->layout };
    if (o->square_form) {
        d.stride = (int)attr_i(c, "sh");
        d.pad = (int)attr_i(c, "ph");
    } else {
        d.stride_h = (int)attr_i(c, "sh"); d.stride_w = (int)attr_i(c, "sw");
        d.pad_h = (int)attr_i(c, "ph"); d.pad_w = (int)attr_i(c, "pw");
        d.dil_h = (int)attr_i(c, "dh"); d.dil_w = (int)attr_i(c, "dw");
        d.groups = (int)attr_i(c, "groups");
    }
    return d;
}

/* The square form can describe the case: one stride, one pad, no dilation, one group. */
static int conv_is_square(const gcase *c) {
    return attr_i(c, "sh") == attr_i(c, "sw") && attr_i(c, "ph") == attr_i(c, "pw") && attr_i(c, "dh") == 1 &&
           attr_i(c, "dw") == 1 && attr_i(c, "groups") == 1;
}

static void run_conv(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const ps_conv_desc d = conv_desc_of(c, o);
    const int oh = ps_conv_out_h(&d), ow = ps_conv_out_w(&d);
    const size_t nw = (size_t)ps_conv_weight_count(&d), ny = (size_t)d.n * d.cout * oh * ow;
    PS_ASSERT(nw == in_len(v, "w"));
    float *X = act_in(b, in_get(v, "x"), d.n, d.cin, d.h, d.w, o->layout);
    float *W = dev_from(b, in_get(v, "w"), nw);
    float *B = in_get(v, "b") ? dev_from(b, in_get(v, "b"), (size_t)d.cout) : NULL;
    float *Y = dev_from(b, NULL, ny);
    RUN(b, conv2d_forward, &d, X, W, B, Y);
    act_out(b, v, "y", Y, d.n, d.cout, oh, ow, o->layout);
    if (!o->fwd_only) {
        float *DY = act_in(b, in_get(v, "gy"), d.n, d.cout, oh, ow, o->layout);
        float *DX = dev_from(b, NULL, (size_t)d.n * d.cin * d.h * d.w), *DW = dev_from(b, NULL, nw);
        float *DB = B ? dev_from(b, NULL, (size_t)d.cout) : NULL;
        RUN(b, conv2d_backward, &d, X, W, DY, DX, DW, DB);
        act_out(b, v, "gx", DX, d.n, d.cin, d.h, d.w, o->layout);
        vec_out(b, v, "gw", DW, nw);
        if (DB) vec_out(b, v, "gb", DB, (size_t)d.cout);
        /* dx not wanted (a first layer): the weight gradient is the same */
        RUN(b, conv2d_backward, &d, X, W, DY, NULL, DW, DB);
        vec_out(b, v, "gw#nodx", DW, nw);
        ps_backend_release(b, DY); ps_backend_release(b, DX); ps_backend_release(b, DW);
        ps_backend_release(b, DB);
    }
    ps_backend_release(b, X); ps_backend_release(b, W); ps_backend_release(b, B); ps_backend_release(b, Y);
}

static ps_pool_desc pool_desc_of(const gcase *c, const run_opts *o) {
    ps_pool_desc d = { .n = (int)attr_i(c, "n"), .c = (int)attr_i(c, "c"), .h = (int)attr_i(c, "h"),
                       .w = (int)attr_i(c, "w"), .layout = o->layout,
                       .count_include_pad = (int)attr_i(c, "count_include_pad") };
    if (o->square_form) {
        d.k = (int)attr_i(c, "kh");
        d.stride = (int)attr_i(c, "sh");
    } else {
        d.kh = (int)attr_i(c, "kh"); d.kw = (int)attr_i(c, "kw");
        d.stride_h = (int)attr_i(c, "sh"); d.stride_w = (int)attr_i(c, "sw");
        d.pad_h = (int)attr_i(c, "ph"); d.pad_w = (int)attr_i(c, "pw");
    }
    return d;
}

static int pool_is_square(const gcase *c) {
    return attr_i(c, "kh") == attr_i(c, "kw") && attr_i(c, "sh") == attr_i(c, "sw") && attr_i(c, "ph") == 0 &&
           attr_i(c, "pw") == 0;
}

static void run_pool(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const ps_pool_desc d = pool_desc_of(c, o);
    const int oh = ps_pool_out_h(&d), ow = ps_pool_out_w(&d);
    const size_t ny = (size_t)d.n * d.c * oh * ow, nx = (size_t)d.n * d.c * d.h * d.w;
    const int is_max = !strncmp(c->desc, "kind=maxpool", 12);
    float *X = act_in(b, in_get(v, "x"), d.n, d.c, d.h, d.w, o->layout), *Y = dev_from(b, NULL, ny);
    void *ws = NULL;
    if (is_max) {
        size_t wsz = b->ops->maxpool_workspace_size(b->impl, &d);
        CHECK(wsz > 0);
        ws = b->ops->alloc(b->impl, wsz ? wsz : 1);
        RUN(b, maxpool_forward, &d, X, Y, NULL);
        act_out(b, v, "y#nows", Y, d.n, d.c, oh, ow, o->layout);
        RUN(b, maxpool_forward, &d, X, Y, ws);
    } else {
        RUN(b, avgpool_forward, &d, X, Y);
    }
    act_out(b, v, "y", Y, d.n, d.c, oh, ow, o->layout);
    if (!o->fwd_only) {
        float *DY = act_in(b, in_get(v, "gy"), d.n, d.c, oh, ow, o->layout), *DX = dev_from(b, NULL, nx);
        if (is_max) RUN(b, maxpool_backward, &d, ws, DY, DX);
        else RUN(b, avgpool_backward, &d, DY, DX);
        act_out(b, v, "gx", DX, d.n, d.c, d.h, d.w, o->layout);
        ps_backend_release(b, DY); ps_backend_release(b, DX);
    }
    if (ws) b->ops->free(b->impl, ws);
    ps_backend_release(b, X); ps_backend_release(b, Y);
}

/* (n, c, s) as a 4-D activation for reorders: (n, c, s, 1). */
static void run_bn(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const ps_chan_desc d = { .n = (int)attr_i(c, "n"), .c = (int)attr_i(c, "c"), .s = attr_i(c, "s"),
                             .layout = o->layout, .eps = (float)attr_f(c, "eps") };
    const int training = (int)attr_i(c, "training"), affine = (int)attr_i(c, "affine");
    const double mom = attr_f(c, "momentum");
    const size_t nx = (size_t)d.n * d.c * d.s;
    float *X = act_in(b, in_get(v, "x"), d.n, d.c, (int)d.s, 1, o->layout), *Y = dev_from(b, NULL, nx);
    float *G = affine ? dev_from(b, in_get(v, "gamma"), (size_t)d.c) : NULL;
    float *Bt = affine ? dev_from(b, in_get(v, "beta"), (size_t)d.c) : NULL;
    float *RM = dev_from(b, in_get(v, "running_mean"), (size_t)d.c);
    float *RV = dev_from(b, in_get(v, "running_var"), (size_t)d.c);
    float *M = dev_from(b, NULL, (size_t)d.c), *IS = dev_from(b, NULL, (size_t)d.c);
    float *VU = dev_from(b, NULL, (size_t)d.c);
    const float *rm = in_get(v, "running_mean"), *rv = in_get(v, "running_var");
    float *rm_new = out_new(v, "running_mean_new", (size_t)d.c), *rv_new = out_new(v, "running_var_new", (size_t)d.c);
    if (training) {
        RUN(b, batchnorm_forward_training, &d, X, G, Bt, Y, M, IS, VU);
        vec_out(b, v, "save_mean", M, (size_t)d.c);
        vec_out(b, v, "save_invstd", IS, (size_t)d.c);
        float *vu = host_alloc((size_t)d.c);
        dev_to(b, vu, VU, (size_t)d.c);
        const float *mean = out_get(v, "save_mean");
        /* PyTorch's momentum rule, in float as it runs it: the executor's job,
         * here to show var_unbiased is what that rule needs. */
        for (int j = 0; j < d.c; j++) {
            rm_new[j] = (float)(1.0 - mom) * rm[j] + (float)mom * mean[j];
            rv_new[j] = (float)(1.0 - mom) * rv[j] + (float)mom * vu[j];
        }
        free(vu);
    } else {
        RUN(b, batchnorm_forward_inference, &d, X, G, Bt, RM, RV, Y, IS);
        memcpy(rm_new, rm, (size_t)d.c * sizeof *rm);
        memcpy(rv_new, rv, (size_t)d.c * sizeof *rv);
    }
    act_out(b, v, "y", Y, d.n, d.c, (int)d.s, 1, o->layout);
    if (!o->fwd_only) {
        float *DY = act_in(b, in_get(v, "gy"), d.n, d.c, (int)d.s, 1, o->layout), *DX = dev_from(b, NULL, nx);
        float *DG = affine ? dev_from(b, NULL, (size_t)d.c) : NULL, *DB = affine ? dev_from(b, NULL, (size_t)d.c) : NULL;
        RUN(b, batchnorm_backward, &d, training, X, DY, G, NULL, training ? M : RM, IS, DX, DG, DB);
        act_out(b, v, "gx", DX, d.n, d.c, (int)d.s, 1, o->layout);
        if (affine) {
            vec_out(b, v, "ggamma", DG, (size_t)d.c);
            vec_out(b, v, "gbeta", DB, (size_t)d.c);
            /* dx not wanted: the parameter gradients are the same */
            RUN(b, batchnorm_backward, &d, training, X, DY, G, NULL, training ? M : RM, IS, NULL, DG, DB);
            vec_out(b, v, "ggamma#nodx", DG, (size_t)d.c);
        }
        ps_backend_release(b, DY); ps_backend_release(b, DX); ps_backend_release(b, DG); ps_backend_release(b, DB);
    }
    ps_backend_release(b, X); ps_backend_release(b, Y); ps_backend_release(b, G); ps_backend_release(b, Bt);
    ps_backend_release(b, RM); ps_backend_release(b, RV); ps_backend_release(b, M); ps_backend_release(b, IS);
    ps_backend_release(b, VU);
}

static void run_ln(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const ps_ln_desc d = { .rows = attr_i(c, "rows"), .cols = attr_i(c, "cols"), .eps = (float)attr_f(c, "eps") };
    const int affine = (int)attr_i(c, "affine");
    const size_t nx = (size_t)(d.rows * d.cols);
    float *X = dev_from(b, in_get(v, "x"), nx), *Y = dev_from(b, NULL, nx);
    float *G = affine ? dev_from(b, in_get(v, "gamma"), (size_t)d.cols) : NULL;
    float *Bt = affine ? dev_from(b, in_get(v, "beta"), (size_t)d.cols) : NULL;
    float *M = dev_from(b, NULL, (size_t)d.rows), *R = dev_from(b, NULL, (size_t)d.rows);
    RUN(b, layernorm_forward, &d, X, G, Bt, Y, NULL, NULL);   /* inference: no statistics kept */
    vec_out(b, v, "y#nostats", Y, nx);
    RUN(b, layernorm_forward, &d, X, G, Bt, Y, M, R);
    vec_out(b, v, "y", Y, nx);
    if (!o->fwd_only) {
        float *DY = dev_from(b, in_get(v, "gy"), nx), *DX = dev_from(b, NULL, nx);
        float *DG = affine ? dev_from(b, NULL, (size_t)d.cols) : NULL;
        float *DB = affine ? dev_from(b, NULL, (size_t)d.cols) : NULL;
        RUN(b, layernorm_backward, &d, X, DY, G, M, R, DX, DG, DB);
        vec_out(b, v, "gx", DX, nx);
        if (affine) {
            vec_out(b, v, "ggamma", DG, (size_t)d.cols);
            vec_out(b, v, "gbeta", DB, (size_t)d.cols);
        }
        ps_backend_release(b, DY); ps_backend_release(b, DX); ps_backend_release(b, DG); ps_backend_release(b, DB);
    }
    ps_backend_release(b, X); ps_backend_release(b, Y); ps_backend_release(b, G); ps_backend_release(b, Bt);
    ps_backend_release(b, M); ps_backend_release(b, R);
}

static const char *const kActNames[PS_ACT_COUNT] = {
    [PS_ACT_RELU] = "relu", [PS_ACT_LEAKY_RELU] = "leaky_relu", [PS_ACT_GELU] = "gelu",
    [PS_ACT_GELU_TANH] = "gelu_tanh", [PS_ACT_SILU] = "silu", [PS_ACT_TANH] = "tanh", [PS_ACT_SIGMOID] = "sigmoid",
    [PS_ACT_HARDTANH] = "hardtanh", [PS_ACT_HARDSWISH] = "hardswish", [PS_ACT_HARDSIGMOID] = "hardsigmoid",
    [PS_ACT_ELU] = "elu", [PS_ACT_SELU] = "selu", [PS_ACT_SOFTPLUS] = "softplus", [PS_ACT_MISH] = "mish",
    [PS_ACT_LOGSIGMOID] = "logsigmoid", [PS_ACT_EXP] = "exp", [PS_ACT_LOG] = "log", [PS_ACT_ABS] = "abs",
    [PS_ACT_SQRT] = "sqrt", [PS_ACT_POW] = "pow", [PS_ACT_LINEAR] = "linear",
    [PS_ACT_CELU] = "celu", [PS_ACT_SOFTSIGN] = "softsign", [PS_ACT_TANHSHRINK] = "tanhshrink",
    [PS_ACT_HARDSHRINK] = "hardshrink", [PS_ACT_SOFTSHRINK] = "softshrink", [PS_ACT_THRESHOLD] = "threshold",
    [PS_ACT_LOG1P] = "log1p", [PS_ACT_EXPM1] = "expm1", [PS_ACT_SIN] = "sin", [PS_ACT_COS] = "cos",
    [PS_ACT_GT] = "gt", [PS_ACT_LT] = "lt", [PS_ACT_GE] = "ge", [PS_ACT_LE] = "le", [PS_ACT_ERF] = "erf",
    [PS_ACT_SIGN] = "sign",
};
_Static_assert(PS_ACT_SIGN + 1 == PS_ACT_COUNT, "kActNames names every activation");

static ps_act_desc act_desc_of(const gcase *c) {
    char buf[32];
    const char *name = attr_s(c, "act", buf, sizeof buf);
    ps_act_desc d = { .kind = -1, .alpha = (float)attr_f(c, "alpha") };
    for (int k = 0; k < PS_ACT_COUNT; k++)
        if (name && kActNames[k] && !strcmp(name, kActNames[k])) d.kind = k;
    PS_ASSERT(d.kind >= 0);
    if (d.kind == PS_ACT_HARDTANH || d.kind == PS_ACT_THRESHOLD) d.beta = (float)attr_f(c, "beta");
    return d;
}

static void run_act(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const ps_act_desc d = act_desc_of(c);
    const int64_t n = attr_i(c, "count");
    float *X = dev_from(b, in_get(v, "x"), (size_t)n), *Y = dev_from(b, NULL, (size_t)n);
    RUN(b, act_forward, &d, n, X, Y);
    vec_out(b, v, "y", Y, (size_t)n);
    if (!o->fwd_only) {
        const int rx = ps_act_backward_reads_x(d.kind);
        float *DY = dev_from(b, in_get(v, "gy"), (size_t)n), *DX = dev_from(b, NULL, (size_t)n);
        /* only the tensor the contract says is read; the other is NULL */
        RUN(b, act_backward, &d, n, rx ? X : NULL, rx ? NULL : Y, DY, DX);
        vec_out(b, v, "gx", DX, (size_t)n);
        /* in place: dx == dy */
        RUN(b, act_backward, &d, n, rx ? X : NULL, rx ? NULL : Y, DY, DY);
        vec_out(b, v, "gx#inplace", DY, (size_t)n);
        ps_backend_release(b, DY); ps_backend_release(b, DX);
    }
    /* in place: x == y */
    RUN(b, act_forward, &d, n, X, X);
    vec_out(b, v, "y#inplace", X, (size_t)n);
    ps_backend_release(b, X); ps_backend_release(b, Y);
}

static void run_softmax(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const ps_softmax_desc d = { .outer = attr_i(c, "outer"), .dim = (int)attr_i(c, "dim"),
                                .inner = attr_i(c, "inner"), .log = (int)attr_i(c, "log") };
    const size_t n = (size_t)(d.outer * d.dim * d.inner);
    float *X = dev_from(b, in_get(v, "x"), n), *Y = dev_from(b, NULL, n);
    RUN(b, softmax_dim_forward, &d, X, Y);
    vec_out(b, v, "y", Y, n);
    if (!o->fwd_only) {
        float *DY = dev_from(b, in_get(v, "gy"), n), *DX = dev_from(b, NULL, n);
        RUN(b, softmax_dim_backward, &d, Y, DY, DX);
        vec_out(b, v, "gx", DX, n);
        ps_backend_release(b, DY); ps_backend_release(b, DX);
    }
    ps_backend_release(b, X); ps_backend_release(b, Y);
}

static void run_dropout2d(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const ps_chan_desc d = { .n = (int)attr_i(c, "n"), .c = (int)attr_i(c, "c"), .s = attr_i(c, "s"),
                             .layout = o->layout };
    const size_t nx = (size_t)d.n * d.c * d.s;
    float *X = act_in(b, in_get(v, "x"), d.n, d.c, (int)d.s, 1, o->layout), *Y = dev_from(b, NULL, nx);
    float *MK = dev_from(b, in_get(v, "mask"), (size_t)d.n * d.c);
    RUN(b, mul_channels, &d, X, MK, Y);
    act_out(b, v, "y", Y, d.n, d.c, (int)d.s, 1, o->layout);
    if (!o->fwd_only) {
        float *DY = act_in(b, in_get(v, "gy"), d.n, d.c, (int)d.s, 1, o->layout);
        RUN(b, mul_channels, &d, DY, MK, DY);   /* in place */
        act_out(b, v, "gx", DY, d.n, d.c, (int)d.s, 1, o->layout);
        ps_backend_release(b, DY);
    }
    ps_backend_release(b, X); ps_backend_release(b, Y); ps_backend_release(b, MK);
}

/* PReLU (plain layout): y, and the backward's dx and dw together and each alone. */
static void run_prelu(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    (void)o;
    const ps_chan_desc d = { .n = (int)attr_i(c, "n"), .c = (int)attr_i(c, "c"), .s = attr_i(c, "s"),
                             .layout = PS_LAYOUT_PLAIN };
    const size_t nx = (size_t)d.n * d.c * d.s;
    float *X = dev_from(b, in_get(v, "x"), nx), *W = dev_from(b, in_get(v, "w"), (size_t)d.c);
    float *Y = dev_from(b, NULL, nx);
    RUN(b, prelu_forward, &d, X, W, Y);
    vec_out(b, v, "y", Y, nx);
    if (!o->fwd_only) {
        float *DY = dev_from(b, in_get(v, "gy"), nx), *DX = dev_from(b, NULL, nx), *DW = dev_from(b, NULL, (size_t)d.c);
        RUN(b, prelu_backward, &d, X, W, DY, DX, DW);
        vec_out(b, v, "gx", DX, nx);
        vec_out(b, v, "gw", DW, (size_t)d.c);
        RUN(b, prelu_backward, &d, X, W, DY, NULL, DW);
        vec_out(b, v, "gw#alone", DW, (size_t)d.c);
        RUN(b, prelu_backward, &d, X, W, DY, DX, NULL);
        vec_out(b, v, "gx#alone", DX, nx);
        ps_backend_release(b, DY); ps_backend_release(b, DX); ps_backend_release(b, DW);
    }
    ps_backend_release(b, X); ps_backend_release(b, W); ps_backend_release(b, Y);
}

/* Adaptive average pooling (plain layout only). */
static void run_adaptive(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const ps_adaptive_desc d = { (int)attr_i(c, "n"), (int)attr_i(c, "c"), (int)attr_i(c, "h"), (int)attr_i(c, "w"),
                                 (int)attr_i(c, "oh"), (int)attr_i(c, "ow") };
    const size_t nx = (size_t)d.n * d.c * d.h * d.w, ny = (size_t)d.n * d.c * d.oh * d.ow;
    float *X = dev_from(b, in_get(v, "x"), nx), *Y = dev_from(b, NULL, ny);
    RUN(b, adaptive_avgpool_forward, &d, X, Y);
    vec_out(b, v, "y", Y, ny);
    if (!o->fwd_only) {
        float *DY = dev_from(b, in_get(v, "gy"), ny), *DX = dev_from(b, NULL, nx);
        RUN(b, adaptive_avgpool_backward, &d, DY, DX);
        vec_out(b, v, "gx", DX, nx);
        ps_backend_release(b, DY); ps_backend_release(b, DX);
    }
    ps_backend_release(b, X); ps_backend_release(b, Y);
}

/* torch.cat([a, b], dim) with copy2d; backward splits gy the same way:
 * ga by accumulating onto a filled 0 (fill + accumulate), gb by copying. */
static void run_concat(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const int64_t rows = attr_i(c, "rows"), ca = attr_i(c, "ca"), cb = attr_i(c, "cb");
    const int n = (int)attr_i(c, "n"), c_a = (int)attr_i(c, "c_a"), c_b = (int)attr_i(c, "c_b");
    const int sp = (int)attr_i(c, "spatial");
    PS_ASSERT(o->layout == PS_LAYOUT_PLAIN || rows == n);
    /* plain: any dim (rows x cols); blocked: the channels of (n, c, sp, 1) */
    float *A = o->layout ? act_in(b, in_get(v, "a"), n, c_a, sp, 1, o->layout) : dev_from(b, in_get(v, "a"), (size_t)(rows * ca));
    float *B = o->layout ? act_in(b, in_get(v, "b"), n, c_b, sp, 1, o->layout) : dev_from(b, in_get(v, "b"), (size_t)(rows * cb));
    float *Y = dev_from(b, NULL, (size_t)(rows * (ca + cb)));
    RUN(b, copy2d, rows, ca, A, ca, Y, ca + cb, 0);
    RUN(b, copy2d, rows, cb, B, cb, Y + ca, ca + cb, 0);
    if (o->layout == PS_LAYOUT_PLAIN) vec_out(b, v, "y", Y, (size_t)(rows * (ca + cb)));
    else act_out(b, v, "y", Y, n, c_a + c_b, sp, 1, o->layout);
    if (!o->fwd_only) {
        float *DY = o->layout ? act_in(b, in_get(v, "gy"), n, c_a + c_b, sp, 1, o->layout)
                              : dev_from(b, in_get(v, "gy"), (size_t)(rows * (ca + cb)));
        float *GA = dev_from(b, NULL, (size_t)(rows * ca)), *GB = dev_from(b, NULL, (size_t)(rows * cb));
        RUN(b, fill, rows * ca, GA, 0.0f);
        RUN(b, copy2d, rows, ca, DY, ca + cb, GA, ca, 1);
        RUN(b, copy2d, rows, cb, DY + ca, ca + cb, GB, cb, 0);
        if (o->layout == PS_LAYOUT_PLAIN) {
            vec_out(b, v, "ga", GA, (size_t)(rows * ca));
            vec_out(b, v, "gb", GB, (size_t)(rows * cb));
        } else {
            act_out(b, v, "ga", GA, n, c_a, sp, 1, o->layout);
            act_out(b, v, "gb", GB, n, c_b, sp, 1, o->layout);
        }
        ps_backend_release(b, DY); ps_backend_release(b, GA); ps_backend_release(b, GB);
    }
    ps_backend_release(b, A); ps_backend_release(b, B); ps_backend_release(b, Y);
}

static void run_add(ps_backend *b, const gcase *c, io *v, const run_opts *o) {
    const int64_t n = attr_i(c, "count");
    float *A = dev_from(b, in_get(v, "a"), (size_t)n), *B = dev_from(b, in_get(v, "b"), (size_t)n);
    float *Y = dev_from(b, NULL, (size_t)n);
    RUN(b, add_out, n, A, B, Y);
    vec_out(b, v, "y", Y, (size_t)n);
    RUN(b, add_out, n, A, B, B);   /* y == b */
    vec_out(b, v, "y#inplace", B, (size_t)n);
    if (!o->fwd_only) {   /* both parts get gy: the executor's copies */
        float *DY = dev_from(b, in_get(v, "gy"), (size_t)n);
        RUN(b, copy2d, 1, n, DY, n, A, n, 0);
        RUN(b, fill, n, B, 0.0f);
        RUN(b, add, n, B, DY);
        vec_out(b, v, "ga", A, (size_t)n);
        vec_out(b, v, "gb", B, (size_t)n);
        ps_backend_release(b, DY);
    }
    ps_backend_release(b, A); ps_backend_release(b, B); ps_backend_release(b, Y);
}

typedef struct kind_row {
    const char *kind;
    runner run;
    int layouts;        /* takes PS_LAYOUT_BLOCKED activations */
    int has_square;     /* has a square (legacy) descriptor form */
} kind_row;

static const kind_row kKinds[] = {
    { "conv", run_conv, 1, 1 },
    { "maxpool", run_pool, 1, 1 },
    { "avgpool", run_pool, 1, 1 },
    { "bn", run_bn, 1, 0 },
    { "ln", run_ln, 0, 0 },
    { "act", run_act, 0, 0 },
    { "softmax", run_softmax, 0, 0 },
    { "dropout2d", run_dropout2d, 1, 0 },
    { "concat", run_concat, 1, 0 },
    { "add", run_add, 0, 0 },
    { "adaptive", run_adaptive, 0, 0 },
    { "prelu", run_prelu, 0, 0 },
};

static const kind_row *kind_of(const gcase *c) {
    char buf[32];
    const char *k = attr_s(c, "kind", buf, sizeof buf);
    for (size_t i = 0; k && i < sizeof kKinds / sizeof kKinds[0]; i++)
        if (!strcmp(k, kKinds[i].kind)) return &kKinds[i];
    return NULL;
}

/* Channel count of a case's activations (for the blocked layout), 0 when
 * the blocked layout does not apply (1-D batch norm, concat not along
 * channels of 4-D tensors). */
static int case_channels(const gcase *c) {
    char buf[32];
    const char *k = attr_s(c, "kind", buf, sizeof buf);
    if (!strcmp(k, "conv")) return (int)(attr_i(c, "cin") < attr_i(c, "cout") ? attr_i(c, "cin") : attr_i(c, "cout"));
    if (!strcmp(k, "bn")) return attr_i(c, "ndim") == 4 ? (int)attr_i(c, "c") : 0;
    if (!strcmp(k, "concat")) {
        if (attr_i(c, "rows") != attr_i(c, "n")) return 0;
        return (int)(attr_i(c, "c_a") < attr_i(c, "c_b") ? attr_i(c, "c_a") : attr_i(c, "c_b"));
    }
    return (int)attr_i(c, "c");
}

/* 1 when the backend offers its blocked layout for every channel count of c. */
static int blocked_ok(ps_backend *b, const gcase *c) {
    const int ch = case_channels(c);
    if (!b->ops->blocked_layout || ch <= 0) return 0;
    char buf[32];
    const char *k = attr_s(c, "kind", buf, sizeof buf);
    int ok = b->ops->blocked_layout(b->impl, ch) > 0;
    if (!strcmp(k, "conv"))
        ok = b->ops->blocked_layout(b->impl, (int)attr_i(c, "cin")) > 0 &&
             b->ops->blocked_layout(b->impl, (int)attr_i(c, "cout")) > 0;
    if (!strcmp(k, "concat"))
        ok = b->ops->blocked_layout(b->impl, (int)attr_i(c, "c_a")) > 0 &&
             b->ops->blocked_layout(b->impl, (int)attr_i(c, "c_b")) > 0;
    return ok;
}

/* ---- comparing with the golden file ---- */

/* Every output against the golden tensor of its name ("y#nows" against
 * "y": the part after '#' names a variant of the same result). */
static void compare_outputs(const gcase *c, io *v, const char *label, double tol) {
    for (int i = 0; i < v->nout; i++) {
        char base[64];
        snprintf(base, sizeof base, "%s", v->out[i].name);
        base[strcspn(base, "#")] = 0;
        const ps_st_tensor *t = gt(c, base);
        char what[192];
        snprintf(what, sizeof what, "%s %s %s", label, c->name, v->out[i].name);
        CHECK_MSG(t != NULL, "%s: no golden tensor %s.%s", what, c->name, base);
        if (!t) continue;
        CHECK_MSG((size_t)ps_st_numel(t) == v->out[i].n, "%s: %zu elements, golden has %lld", what, v->out[i].n,
                  (long long)ps_st_numel(t));
        if ((size_t)ps_st_numel(t) != v->out[i].n) continue;
        check_scaled(what, v->out[i].p, t->data, v->out[i].n, tol);
    }
}

/* Gradients PyTorch computed that every run must produce (so a runner
 * cannot silently skip one). */
static void check_coverage(const gcase *c, io *v, const char *label) {
    static const char *const kGrads[] = { "y", "gx", "gw", "gb", "ga", "ggamma", "gbeta", "save_mean", "save_invstd",
                                          "running_var_new" };
    for (size_t i = 0; i < sizeof kGrads / sizeof kGrads[0]; i++)
        if (gt(c, kGrads[i]))
            CHECK_MSG(out_get(v, kGrads[i]) != NULL, "%s %s: %s not computed", label, c->name, kGrads[i]);
}

/* Tolerances, scaled by the largest golden magnitude (check_scaled): the
 * ref backend computes in double and rounds once, PyTorch in float, so
 * they differ by float rounding of sums of up to ~150 terms; other
 * backends also sum in other orders, and oneDNN's JIT eltwise kernels use
 * polynomial approximations of erf/tanh/exp (rel. error ~1e-6). A wrong
 * index, term or formula is off by O(1). */
#define TOL_REF 2e-5
#define TOL_DUT 1e-4

typedef struct case_list {
    gcase *c;
    int n;
} case_list;

static case_list load_cases(const ps_st_file *g) {
    case_list L = { NULL, 0 };
    const char *names = ps_st_metadata(g, "cases");
    CHECK_MSG(names != NULL, "%s: no 'cases' metadata", GOLDEN_OPS);
    if (!names) return L;
    int cap = 1;
    for (const char *p = names; *p; p++) cap += *p == ',';
    L.c = calloc((size_t)cap, sizeof *L.c);
    PS_ASSERT(L.c);
    for (const char *p = names; *p;) {
        size_t n = strcspn(p, ",");
        gcase *c = &L.c[L.n];
        PS_ASSERT(n < sizeof c->name);
        memcpy(c->name, p, n);
        c->name[n] = 0;
        c->g = g;
        c->desc = ps_st_metadata(g, c->name);
        CHECK_MSG(c->desc != NULL && kind_of(c) != NULL, "%s: case %s has no known kind", GOLDEN_OPS, c->name);
        if (c->desc && kind_of(c)) L.n++;
        p += n;
        if (*p == ',') p++;
    }
    return L;
}

/* Run every case on b against the golden outputs; both layouts where the
 * backend has a blocked one, and the square descriptor form where it can
 * describe the case. Returns the number of runs. */
static int golden_all(ps_backend *b, const case_list *L, const char *label, double tol, const char *only) {
    int runs = 0;
    for (int i = 0; i < L->n; i++) {
        const gcase *c = &L->c[i];
        const kind_row *k = kind_of(c);
        if (only && !strstr(k->kind, only)) continue;
        for (int layout = 0; layout < 2; layout++) {
            if (layout == PS_LAYOUT_BLOCKED && !(k->layouts && blocked_ok(b, c))) continue;
            for (int sq = 0; sq < 2; sq++) {
                if (sq && !(k->has_square &&
                            (!strcmp(k->kind, "conv") ? conv_is_square(c) : pool_is_square(c))))
                    continue;
                io v;
                io_load(&v, c);
                run_opts o = { .layout = layout, .square_form = sq };
                k->run(b, c, &v, &o);
                char lab[96];
                snprintf(lab, sizeof lab, "%s%s%s", label, layout ? " blocked" : "", sq ? " square-form" : "");
                check_coverage(c, &v, lab);
                compare_outputs(c, &v, lab, tol);
                io_free(&v);
                runs++;
            }
        }
    }
    return runs;
}

/* ---- 2. ref vs finite differences ---- */

/* sum(y * gy) of a forward run (v's current inputs). */
static double fd_loss(ps_backend *b, const gcase *c, const kind_row *k, io *v) {
    run_opts o = { .fwd_only = 1 };
    io_clear_out(v);
    k->run(b, c, v, &o);
    const float *y = out_get(v, "y"), *gy = in_get(v, "gy");
    PS_ASSERT(y && gy);
    double s = 0.0;
    for (size_t i = 0; i < in_len(v, "gy"); i++) s += (double)y[i] * gy[i];
    return s;
}

#define FD_EPS 1e-2f

/* Analytic gradient `grad` (from a full run) of input `input` against
 * central differences. */
static void fd_one(ps_backend *b, const gcase *c, const kind_row *k, io *v, const char *input, const float *grad) {
    float *p = in_get(v, input);
    size_t n = in_len(v, input);
    float *num = host_alloc(n);
    for (size_t i = 0; i < n; i++) {
        float save = p[i], hi = save + FD_EPS, lo = save - FD_EPS;
        p[i] = hi;
        double lp = fd_loss(b, c, k, v);
        p[i] = lo;
        double lm = fd_loss(b, c, k, v);
        p[i] = save;
        num[i] = (float)((lp - lm) / ((double)hi - lo));
    }
    char what[128];
    snprintf(what, sizeof what, "fd ref %s d/d%s", c->name, input);
    /* Smooth or piecewise-linear ops away from kinks: central differences
     * are exact up to O(eps^2) and the float rounding of y summed over
     * the loss, ~1e-4 after dividing by 2 eps. A wrong term is O(1). */
    check_array(what, grad, num, n, 2e-3, 5e-3);
    free(num);
}

/* Distinct values spaced 5*eps apart in random order: no ties and no kink
 * of relu-like ops or argmax switch within a finite-difference step. */
static void fill_distinct(float *p, size_t n, float gap, rng *r) {
    for (size_t i = 0; i < n; i++) p[i] = ((float)i - (float)n / 2 + 0.5f) * gap;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)((rng_uniform(r) + 1.0f) * 0.5f * (float)i) % i;
        float t = p[i - 1]; p[i - 1] = p[j]; p[j] = t;
    }
}

static void fd_case(ps_backend *ref, const gcase *c, rng *r) {
    const kind_row *k = kind_of(c);
    if (!strcmp(k->kind, "add") || !strcmp(k->kind, "concat")) return;   /* copies: golden is exact */
    io v;
    io_load(&v, c);
    char buf[32];
    const char *act = attr_s(c, "act", buf, sizeof buf);
    if (!strcmp(k->kind, "maxpool") || (act && (!strcmp(act, "relu") || !strcmp(act, "leaky_relu"))))
        fill_distinct(in_get(&v, "x"), in_len(&v, "x"), 5 * FD_EPS, r);
    /* the hard activations' kinks (0, 6, +-3 and their cases' min/max, all multiples of 0.5) stay 5 FD_EPS
     * from every value, which reach past +-3 */
    if (act && (!strcmp(act, "hardtanh") || !strcmp(act, "hardswish") || !strcmp(act, "hardsigmoid")))
        fill_distinct(in_get(&v, "x"), in_len(&v, "x"), 10 * FD_EPS, r);
    /* the shrinks' and thresholds' kinks (their cases' lambd and threshold, multiples of 0.1) and PReLU's 0 */
    if ((act && (!strcmp(act, "hardshrink") || !strcmp(act, "softshrink") || !strcmp(act, "threshold"))) ||
        !strcmp(k->kind, "prelu"))
        fill_distinct(in_get(&v, "x"), in_len(&v, "x"), 10 * FD_EPS, r);
    run_opts o = { 0 };
    k->run(ref, c, &v, &o);
    /* keep the analytic gradients; fd_loss reuses the outputs */
    static const char *const kPairs[][2] = { { "x", "gx" }, { "w", "gw" }, { "b", "gb" }, { "gamma", "ggamma" },
                                             { "beta", "gbeta" } };
    float *grads[5] = { 0 };
    for (int i = 0; i < 5; i++) {
        const float *g = out_get(&v, kPairs[i][1]);
        if (!g || !in_get(&v, kPairs[i][0])) continue;
        grads[i] = host_alloc(in_len(&v, kPairs[i][0]));
        memcpy(grads[i], g, in_len(&v, kPairs[i][0]) * sizeof(float));
    }
    for (int i = 0; i < 5; i++)
        if (grads[i]) {
            fd_one(ref, c, k, &v, kPairs[i][0], grads[i]);
            free(grads[i]);
        }
    io_free(&v);
}

/* ---- the descriptor helpers ---- */

static void check_descs(void) {
    const ps_conv_desc sq = { 2, 3, 9, 8, 4, 3, 3, 2, 1 };
    const ps_conv_desc gen = { .n = 2, .cin = 3, .h = 9, .w = 8, .cout = 4, .kh = 3, .kw = 3, .stride_h = 2,
                               .stride_w = 2, .pad_h = 1, .pad_w = 1 };
    CHECK(ps_conv_out_h(&sq) == 5 && ps_conv_out_w(&sq) == 4);
    CHECK(ps_conv_out_h(&gen) == 5 && ps_conv_out_w(&gen) == 4);
    ps_conv_desc a = ps_conv_resolve(&sq), b = ps_conv_resolve(&gen);
    CHECK(memcmp(&a, &b, sizeof a) == 0);
    const ps_conv_desc dil = { .n = 1, .cin = 4, .h = 10, .w = 9, .cout = 6, .kh = 3, .kw = 2, .stride_h = 1,
                               .stride_w = 2, .pad_h = 2, .pad_w = 0, .dil_h = 2, .dil_w = 3, .groups = 2 };
    CHECK(ps_conv_out_h(&dil) == 10 && ps_conv_out_w(&dil) == 3);   /* (10+4-5)/1+1, (9-4)/2+1 */
    CHECK(ps_conv_weight_count(&dil) == 6 * 2 * 3 * 2);
    const ps_pool_desc ps = { 1, 1, 7, 6, 2, 2 };
    const ps_pool_desc pg = { .n = 1, .c = 1, .h = 7, .w = 6, .kh = 3, .kw = 2, .stride_h = 2, .stride_w = 1,
                              .pad_h = 1, .pad_w = 1 };
    CHECK(ps_pool_out_h(&ps) == 3 && ps_pool_out_w(&ps) == 3);
    CHECK(ps_pool_out_h(&pg) == 4 && ps_pool_out_w(&pg) == 7);
    CHECK(ps_act_backward_reads_x(PS_ACT_GELU) && !ps_act_backward_reads_x(PS_ACT_SIGMOID));
}

/* Every op of issue 18 present in a backend's table. */
static void check_table(const ps_backend_ops *o) {
    const void *ops[] = { (const void *)o->avgpool_forward, (const void *)o->avgpool_backward,
                          (const void *)o->batchnorm_forward_training, (const void *)o->batchnorm_forward_inference,
                          (const void *)o->batchnorm_backward, (const void *)o->layernorm_forward,
                          (const void *)o->layernorm_backward, (const void *)o->act_forward,
                          (const void *)o->act_backward, (const void *)o->softmax_dim_forward,
                          (const void *)o->softmax_dim_backward, (const void *)o->mul_channels,
                          (const void *)o->copy2d, (const void *)o->add_out, (const void *)o->fill,
                          (const void *)o->adaptive_avgpool_forward, (const void *)o->adaptive_avgpool_backward };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        CHECK_MSG(ops[i] != NULL, "backend %s lacks op %zu of issue 18 (or adaptive pooling's)", o->name, i);
}

/* ---- 3. dnnl, one child per ISA ---- */

/* Below AVX-512 oneDNN has no nChw16c pooling kernel: forcing that layout
 * must show up as a fallback of the new average-pool primitive. */
static void negative_control(const char *isa) {
    ps_err err = { 0 };
    setenv("PS_DNNL_LAYOUT", "16", 1);
    ps_backend *b = ps_backend_create("dnnl", 0, 1, &err);
    unsetenv("PS_DNNL_LAYOUT");
    CHECK_MSG(b != NULL, "%s", err.msg);
    if (!b) return;
    const ps_pool_desc d = { .n = 2, .c = 16, .h = 8, .w = 8, .kh = 3, .kw = 3, .stride_h = 2, .stride_w = 2,
                             .pad_h = 1, .pad_w = 1, .layout = PS_LAYOUT_BLOCKED };
    float *x = ps_backend_alloc_floats(b, 2 * 16 * 8 * 8), *y = ps_backend_alloc_floats(b, 2 * 16 * 4 * 4);
    memset(x, 0, sizeof(float) * 2 * 16 * 8 * 8);
    RUN(b, avgpool_forward, &d, x, y);
    char buf[512];
    int n = ps_backend_fallbacks(b, buf, sizeof buf);
    CHECK_MSG(n == 1 && strstr(buf, "pool"), "%s: nChw16c avg-pool: %d fallbacks reported: %s", isa, n, buf);
    printf("  %-12s negative control reported: %s", isa, buf);
    ps_backend_release(b, x);
    ps_backend_release(b, y);
    ps_backend_free(b);
}

static int child(const isa_row *row) {
    const char *eff = ps_backend_cpu_isa();
    CHECK_MSG(!strcmp(eff, row->effective), "ONEDNN_MAX_CPU_ISA=%s: effective ISA %s, expected %s", row->env, eff,
              row->effective);
    ps_err err = { 0 };
    ps_st_file *g = ps_st_read(GOLDEN_OPS, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    ps_backend *b = ps_backend_create("dnnl", 0, 2, &err);
    CHECK_MSG(b != NULL, "%s", err.msg);
    if (g && b) {
        check_table(b->ops);
        case_list L = load_cases(g);
        char label[64];
        snprintf(label, sizeof label, "dnnl[%s]", row->effective);
        int runs = golden_all(b, &L, label, TOL_DUT, NULL);
        char buf[4096];
        int nf = ps_backend_fallbacks(b, buf, sizeof buf);
        CHECK_MSG(nf == 0, "%s: %d disallowed reference kernels:\n%s", label, nf, buf);
        printf("  %-12s %d golden runs on dnnl (block %d), %d disallowed fallbacks\n", row->env, runs,
               b->ops->blocked_layout ? b->ops->blocked_layout(b->impl, 16) : 0, nf);
        /* plain-layout pooling's last resort, the C kernels, on the same cases */
        setenv("PS_DNNL_POOL", "c", 1);
        ps_backend *bc = ps_backend_create("dnnl", 0, 2, &err);
        unsetenv("PS_DNNL_POOL");
        CHECK_MSG(bc != NULL, "%s", err.msg);
        if (bc) {
            snprintf(label, sizeof label, "dnnl[%s] PS_DNNL_POOL=c", row->effective);
            printf("  %-12s %d golden pooling runs with PS_DNNL_POOL=c\n", row->env, golden_all(bc, &L, label, TOL_DUT, "pool"));
        }
        ps_backend_free(bc);
        free(L.c);
    }
    ps_backend_free(b);
    ps_st_free(g);
    if (strcmp(row->effective, "avx512_core")) negative_control(row->effective);
    char name[64];
    snprintf(name, sizeof name, "test_nn_ops[%s]", row->env);
    return check_summary(name);
}

/* ---- 4. cuda ---- */

static void cuda_part(const case_list *L) {
#ifdef PS_HAVE_CUDA
    check_table(&ps_backend_cuda_ops);
    ps_err err = { 0 };
    ps_backend *cu = ps_backend_create("cuda", 0, 0, &err);
    if (!cu) {
        printf("cuda: skipped: %s\n", err.msg);
        return;
    }
    int runs = golden_all(cu, L, "cuda", TOL_DUT, NULL);
    printf("cuda: %d golden runs\n", runs);
    ps_backend_free(cu);
#else
    (void)L;
    printf("cuda: skipped: this binary was built without CUDA\n");
#endif
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) {
        for (size_t i = 0; i < ISA_ROWS; i++)
            if (!strcmp(argv[2], isa_rows[i].env)) return child(&isa_rows[i]);
        fprintf(stderr, "test_nn_ops: unknown ISA %s\n", argv[2]);
        return 2;
    }
    check_descs();
    ps_err err = { 0 };
    ps_st_file *g = ps_st_read(GOLDEN_OPS, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (!g) return check_summary("test_nn_ops");
    case_list L = load_cases(g);
    CHECK_MSG(L.n >= 50, "only %d golden cases", L.n);

    /* 1 and 2: ref against PyTorch and against finite differences */
    ps_backend *ref = ps_backend_create("ref", 0, 0, &err);
    CHECK_MSG(ref != NULL, "%s", err.msg);
    if (ref) {
        check_table(ref->ops);
        int runs = golden_all(ref, &L, "ref", TOL_REF, NULL);
        rng r = { 0x5eed18 };
        for (int i = 0; i < L.n; i++) fd_case(ref, &L.c[i], &r);
        printf("ref: %d golden runs of %d cases, finite differences on each\n", runs, L.n);
    }
    ps_backend_free(ref);

    /* 4 */
    cuda_part(&L);

    /* 3: dnnl on each ISA */
    int ran = 0;
    for (size_t i = 0; i < ISA_ROWS; i++) {
        const isa_row *row = &isa_rows[i];
        if (!isa_host_has(row)) {
            printf("dnnl %s: skipped: this CPU lacks it (%s...)\n", row->env, row->flags[0]);
            continue;
        }
        char *const args[] = {argv[0], "--child", (char *)row->env, NULL};
        check_isa_child("test_nn_ops: dnnl", row->env, args);
        ran++;
    }
    CHECK_MSG(ran > 0, "no ISA of oneDNN's could run here");
    free(L.c);
    ps_st_free(g);
    return check_summary("test_nn_ops");
}
