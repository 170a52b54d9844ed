/* test_onnx_import.c - the ONNX reader's and importer's refusals and
 * opset-dependent meanings, on models built here byte by byte (a tiny
 * protobuf writer for onnx.proto's field numbers):
 *
 *  - refusals with their codes and messages: malformed protobuf (truncated,
 *    garbage; the byte offset named), a tensor in an external data file,
 *    absurd dimensions (beyond 2^40 elements, more than 8 dims), raw data of
 *    the wrong size, an unsupported op (PS_ERR_UNIMPLEMENTED naming the node
 *    and op type), opset 18, a graph with two inputs; and that a .onnx file
 *    psd cannot read is refused by the model-file loader naming the file;
 *  - a Conv's strides, dilations or kernel_shape of 0 refused (a fuzzer's division by zero);
 *  - meanings that follow the opset: Softmax's axis (one axis from 13; the
 *    flattened trailing dims before, checked numerically against a softmax
 *    computed here), Dropout's ratio (attribute before 12, input from 12),
 *    BatchNormalization's momentum (PyTorch's 1 - m) and spatial (before 9),
 *    Pad's pads (attribute before 11, input from 11: a zero Pad before an
 *    AveragePool is the pool's padding); the oldest file read (IR 3,
 *    opset 6);
 *  - names: a Gemm reading 'fc.weight' is node 'fc' with parameters
 *    fc.weight, fc.bias; Gemm without transB stores B transposed;
 *  - Concat's arity: one input is the identity, 64 (of 100-character names)
 *    a Concat computing what it should, 65 refused;
 *  - shufflenet's unit: Slices as Narrows, channel_shuffle's Reshape,
 *    Transpose, Reshape as one ChannelShuffle, computing what it should;
 *  - nn.PReLU's and nn.RReLU's exports: PRelu of Unsqueeze(weight) as PReLU,
 *    PRelu of RandomUniformLike as RReLU; other RandomUniformLike readers and
 *    a slope over the last dim refused;
 *  - attention's pieces: a view's shape folded from the exporters'
 *    expand(-1) arithmetic (Reshape of a constant, Shape, ConstantOfShape,
 *    Sub, Add, Equal, Where), a MatMul of a value and its Transpose, a
 *    Split whose first part nothing reads, computing what they should;
 *  - users' elementwise functions: Greater with the number first (a Less),
 *    Where by it between a value and a number, Max of two computed values,
 *    a Slice with step -1 over a whole axis (Flip), computing what they
 *    should (a value on the threshold too); a partial step -1 and Where by
 *    a condition that is no comparison refused;
 *  - a VAE's export: RandomNormalLike (mean, scale) as RandnLike and constants, three graph outputs joined
 *    into psd's one (flattened, in order), computing what they should; a seed, a double dtype and an output
 *    that is the input itself refused.
 */
#include "model.h"
#include "onnx.h"
#include "onnx_import.h"
#include "onnx_model.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

/* ---- a protobuf writer ---- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void varint(buf *b, uint64_t v) {
    uint8_t t[10];
    int k = 0;
    do {
        t[k] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v) t[k] |= 0x80;
        k++;
    } while (v);
    put(b, t, (size_t)k);
}

static void f_varint(buf *b, int field, uint64_t v) { varint(b, (uint64_t)field << 3); varint(b, v); }
static void f_bytes(buf *b, int field, const void *d, size_t n) {
    varint(b, (uint64_t)field << 3 | 2);
    varint(b, n);
    put(b, d, n);
}
static void f_str(buf *b, int field, const char *s) { f_bytes(b, field, s, strlen(s)); }
static void f_msg(buf *b, int field, buf *m) { f_bytes(b, field, m->p, m->n); free(m->p); memset(m, 0, sizeof *m); }
static void f_float(buf *b, int field, float f) { varint(b, (uint64_t)field << 3 | 5); put(b, &f, 4); }

/* TensorProto: dims, float32 raw values (or none), extra bytes appended verbatim */
static buf tensor(const char *name, int ndim, const int64_t *dims, const float *vals, int64_t n) {
    buf t = {0};
    for (int i = 0; i < ndim; i++) f_varint(&t, 1, (uint64_t)dims[i]);
    f_varint(&t, 2, 1);   /* FLOAT */
    f_str(&t, 8, name);
    if (vals) f_bytes(&t, 9, vals, (size_t)n * sizeof(float));
    return t;
}

/* ValueInfoProto of a float tensor */
static buf value_info(const char *name, int ndim, const int64_t *dims) {
    buf shape = {0}, tt = {0}, tp = {0}, v = {0};
    for (int i = 0; i < ndim; i++) {
        buf d = {0};
        f_varint(&d, 1, (uint64_t)dims[i]);
        f_msg(&shape, 1, &d);
    }
    f_varint(&tt, 1, 1);
    f_msg(&tt, 2, &shape);
    f_msg(&tp, 1, &tt);
    f_str(&v, 1, name);
    f_msg(&v, 2, &tp);
    return v;
}

typedef struct attr_spec {
    const char *name;
    int type;                   /* 1 float, 2 int, 3 string, 4 tensor, 7 ints */
    double f;
    int64_t i;
    int nints;
    int64_t ints[10];
    const char *s;              /* type 3 */
    const buf *t;               /* type 4: a TensorProto (copied) */
} attr_spec;

static buf node(const char *name, const char *op, int nin, const char *const *in, const char *out, int nattr,
                const attr_spec *attrs) {
    buf n = {0};
    for (int i = 0; i < nin; i++) f_str(&n, 1, in[i]);
    f_str(&n, 2, out);
    f_str(&n, 3, name);
    f_str(&n, 4, op);
    for (int k = 0; k < nattr; k++) {
        buf a = {0};
        f_str(&a, 1, attrs[k].name);
        if (attrs[k].type == 1) f_float(&a, 2, (float)attrs[k].f);
        if (attrs[k].type == 2) f_varint(&a, 3, (uint64_t)attrs[k].i);
        if (attrs[k].type == 3) f_str(&a, 4, attrs[k].s);
        if (attrs[k].type == 4) f_bytes(&a, 5, attrs[k].t->p, attrs[k].t->n);
        for (int j = 0; attrs[k].type == 7 && j < attrs[k].nints; j++) f_varint(&a, 8, (uint64_t)attrs[k].ints[j]);
        f_varint(&a, 20, (uint64_t)attrs[k].type);
        f_msg(&n, 5, &a);
    }
    return n;
}

/* ModelProto: IR version ir, the default-domain opset, a graph of nodes, initializers, one input, one output */
static buf model_ir(int64_t ir, int64_t opset, buf *nodes, int nn, buf *inits, int ni, buf *in, buf *out) {
    buf g = {0}, m = {0}, o = {0};
    for (int i = 0; i < nn; i++) f_msg(&g, 1, &nodes[i]);
    f_str(&g, 2, "g");
    for (int i = 0; i < ni; i++) f_msg(&g, 5, &inits[i]);
    f_msg(&g, 11, in);
    f_msg(&g, 12, out);
    f_varint(&m, 1, (uint64_t)ir);
    f_str(&m, 2, "test_onnx_import");
    f_msg(&m, 7, &g);
    f_str(&o, 1, "");
    f_varint(&o, 2, (uint64_t)opset);
    f_msg(&m, 8, &o);
    return m;
}

static buf model(int64_t opset, buf *nodes, int nn, buf *inits, int ni, buf *in, buf *out) {
    return model_ir(7, opset, nodes, nn, inits, ni, in, out);
}

/* TensorProto of int64 values (a Pad's pads from opset 11) */
static buf tensor_i64(const char *name, int64_t dim, const int64_t *vals) {
    buf t = {0};
    f_varint(&t, 1, (uint64_t)dim);
    f_varint(&t, 2, 7);   /* INT64 */
    f_str(&t, 8, name);
    f_bytes(&t, 9, vals, (size_t)dim * sizeof(int64_t));
    return t;
}

/* ---- helpers ---- */

static ps_onnx_import *import(const buf *m, ps_err *e, ps_onnx_model **om) {
    *om = ps_onnx_parse(m->p, m->n, "t.onnx", e);
    if (!*om) return NULL;
    ps_onnx_import *im = ps_onnx_import_model(*om, "t.onnx", NULL, e);
    if (!im) {
        ps_onnx_free(*om);
        *om = NULL;
    }
    return im;
}

static void expect_refusal(const char *what, const buf *m, ps_status code, const char *needle) {
    ps_err e = {0};
    ps_onnx_model *om;
    ps_onnx_import *im = import(m, &e, &om);
    CHECK_MSG(!im && e.code == code && strstr(e.msg, needle) && !strncmp(e.msg, "t.onnx", 6),
              "%s: expected %s with '%s', got %s: %s", what, ps_status_name(code), needle, ps_status_name(e.code),
              e.msg);
    if (!im && e.code == code && strstr(e.msg, needle)) printf("ok: refused %s: %s\n", what, e.msg);
    ps_onnx_import_free(im);
    ps_onnx_free(om);
}

static char *yaml_of(const buf *m) {
    ps_err e = {0};
    ps_onnx_model *om;
    ps_onnx_import *im = import(m, &e, &om);
    CHECK_MSG(im != NULL, "import: %s", e.msg);
    if (!im) return strdup("");
    char *y = strdup(ps_onnx_import_yaml(im, NULL));
    ps_onnx_import_free(im);
    ps_onnx_free(om);
    return y;
}

/* psd's model of an imported model file's text, on the ref backend (the
 * text goes through a temporary file, as psd reads a model.file); NULL,
 * with the check failed, when it does not build. */
static ps_model *ref_model_of(const char *yaml, ps_err *e) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_onnx_import.%d.yaml", (int)getpid());
    FILE *f = fopen(path, "w");
    if (f) { fputs(yaml, f); fclose(f); }
    ps_model_opts mo = {.file = path, .cpu_backend = "ref", .seed = 1, .compute_threads = 1, .lr = 0.1f};
    ps_model *pm = ps_model_create(&mo, e);
    CHECK_MSG(pm != NULL, "build: %s", e->msg);
    unlink(path);
    return pm;
}

/* How many times needle stands in text. */
static int count_of(const char *text, const char *needle) {
    int k = 0;
    for (const char *q = text; (q = strstr(q, needle)); q++) k++;
    return k;
}

/* The graph y = x + w (x and y (2, 3)) with initializer w = t (taken):
 * refused with code and an error naming needle. */
static void expect_add_refusal(const char *what, buf *t, ps_status code, const char *needle) {
    int64_t d[2] = {2, 3};
    const char *in[2] = {"x", "w"};
    buf n = node("add", "Add", 2, in, "y", 0, NULL);
    buf vi = value_info("x", 2, d), vo = value_info("y", 2, d);
    buf m = model(13, &n, 1, t, 1, &vi, &vo);
    expect_refusal(what, &m, code, needle);
    free(m.p);
}

/* A Relu graph: x (2, 3) -> y */
static buf relu_model(int64_t opset) {
    int64_t d[2] = {2, 3};
    const char *in[1] = {"x"};
    buf n = node("/act/Relu", "Relu", 1, in, "y", 0, NULL);
    buf vi = value_info("x", 2, d), vo = value_info("y", 2, d);
    return model(opset, &n, 1, NULL, 0, &vi, &vo);
}

static void test_refusals(void) {
    buf ok = relu_model(13);
    char *y = yaml_of(&ok);
    CHECK_MSG(strstr(y, "kind: ReLU") && strstr(y, "input: {shape: [3], dtype: float32}"), "relu model: %s", y);
    free(y);

    buf cut = {0};
    put(&cut, ok.p, ok.n - 3);
    expect_refusal("a truncated file", &cut, PS_ERR_FORMAT, "malformed protobuf");
    buf garbage = {0};
    put(&garbage, "\x08\x07\x3a\xff\xff\xff\xff\x0f", 8);
    expect_refusal("garbage", &garbage, PS_ERR_FORMAT, "byte");
    free(ok.p);
    free(cut.p);
    free(garbage.p);

    int64_t d[2] = {2, 3};
    const char *in1[2] = {"x", "w"};
    float w[3] = {1, 2, 3};
    /* an initializer in an external file */
    {
        int64_t wd[1] = {3};
        buf t = tensor("w", 1, wd, NULL, 0);
        buf ext = {0};
        f_str(&ext, 1, "location");
        f_str(&ext, 2, "weights.bin");
        f_msg(&t, 13, &ext);
        f_varint(&t, 14, 1);   /* EXTERNAL */
        expect_add_refusal("external data", &t, PS_ERR_INVALID_ARGUMENT, "external file");
    }
    /* absurd dimensions */
    {
        int64_t wd[2] = {(int64_t)1 << 41, 3};
        buf t = tensor("w", 2, wd, NULL, 0);
        expect_add_refusal("a dimension of 2^41", &t, PS_ERR_INVALID_ARGUMENT, "absurd");
    }
    {
        int64_t wd[9] = {1, 1, 1, 1, 1, 1, 1, 1, 3};
        buf t = tensor("w", 9, wd, w, 3);
        expect_add_refusal("9 dimensions", &t, PS_ERR_INVALID_ARGUMENT, "more than 8 dimensions");
    }
    {
        int64_t wd[1] = {4};
        buf t = tensor("w", 1, wd, w, 3);
        expect_add_refusal("raw data of the wrong size", &t, PS_ERR_INVALID_ARGUMENT, "raw_data holds 12 bytes");
    }
    /* an unsupported op, opset 18, two graph inputs */
    {
        const char *in[1] = {"x"};
        buf n = node("/block/Foo", "Foo", 1, in, "y", 0, NULL);
        buf vi = value_info("x", 2, d), vo = value_info("y", 2, d);
        buf m = model(13, &n, 1, NULL, 0, &vi, &vo);
        expect_refusal("an unknown op", &m, PS_ERR_UNIMPLEMENTED, "node '/block/Foo' (Foo): op Foo is not supported");
        free(m.p);
    }
    {
        buf m = relu_model(18);
        expect_refusal("opset 18", &m, PS_ERR_UNIMPLEMENTED, "opsets up to 17");
        free(m.p);
    }
    {
        buf n = node("add", "Add", 2, in1, "y", 0, NULL);
        buf g = {0}, m = {0}, o = {0};
        buf vi = value_info("x", 2, d), vw = value_info("w", 2, d), vo = value_info("y", 2, d);
        f_msg(&g, 1, &n);
        f_msg(&g, 11, &vi);
        f_msg(&g, 11, &vw);
        f_msg(&g, 12, &vo);
        f_varint(&m, 1, 7);
        f_msg(&m, 7, &g);
        f_varint(&o, 2, 13);
        f_msg(&m, 8, &o);
        expect_refusal("two graph inputs", &m, PS_ERR_UNIMPLEMENTED, "psd's model takes one input");
        free(m.p);
    }
    /* the model-file loader on a .onnx file it cannot read names the file */
    {
        char path[64];
        snprintf(path, sizeof path, "/tmp/test_onnx_import.%d.onnx", (int)getpid());
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        if (f) {
            fwrite("\x08\x07\x3a\xff", 1, 4, f);
            fclose(f);
            ps_err e = {0};
            ps_model_def *def = ps_model_def_load_file(path, &e);
            CHECK_MSG(!def && strstr(e.msg, path) && strstr(e.msg, "malformed"), "loader: %s", e.msg);
            ps_model_def_free(def);
            unlink(path);
        }
    }
}

/* Softmax over (2, 3, 4) at axis 1: opset 13 normalises over axis 1 alone,
 * opset 11 over the flattened (3, 4). */
static void test_softmax_opsets(void) {
    int64_t d[3] = {2, 3, 4};
    const char *in[1] = {"x"};
    attr_spec ax = {"axis", 2, 0, 1, 0, {0}};
    for (int v = 0; v < 2; v++) {
        int64_t opset = v ? 13 : 11;
        buf n = node("sm", "Softmax", 1, in, "y", 1, &ax);
        buf vi = value_info("x", 3, d), vo = value_info("y", 3, d);
        buf m = model(opset, &n, 1, NULL, 0, &vi, &vo);
        ps_err e = {0};
        ps_onnx_model *om;
        ps_onnx_import *im = import(&m, &e, &om);
        CHECK_MSG(im != NULL, "softmax opset %lld: %s", (long long)opset, e.msg);
        if (!im) { free(m.p); continue; }
        const char *y = ps_onnx_import_yaml(im, NULL);
        if (v) CHECK_MSG(strstr(y, "kind: Softmax, dim: 1") && !strstr(y, "Flatten"), "opset 13: %s", y);
        else CHECK_MSG(strstr(y, "kind: Flatten") && strstr(y, "dim: -1") && strstr(y, "kind: Reshape"), "opset 11: %s", y);
        /* numerically: psd's eval forward against a softmax computed here */
        ps_model *pm = ref_model_of(y, &e);
        float x[24], out[24], want[24];
        for (int i = 0; i < 24; i++) x[i] = sinf((float)i * 1.7f) * 2;
        for (int b = 0; b < 2; b++) {
            if (v) {   /* over axis 1 for each (b, k) */
                for (int k = 0; k < 4; k++) {
                    double mx = -1e30, s = 0;
                    for (int c = 0; c < 3; c++) mx = fmax(mx, x[b * 12 + c * 4 + k]);
                    for (int c = 0; c < 3; c++) s += exp(x[b * 12 + c * 4 + k] - mx);
                    for (int c = 0; c < 3; c++) want[b * 12 + c * 4 + k] = (float)(exp(x[b * 12 + c * 4 + k] - mx) / s);
                }
            } else {   /* over the 12 values of sample b */
                double mx = -1e30, s = 0;
                for (int i = 0; i < 12; i++) mx = fmax(mx, x[b * 12 + i]);
                for (int i = 0; i < 12; i++) s += exp(x[b * 12 + i] - mx);
                for (int i = 0; i < 12; i++) want[b * 12 + i] = (float)(exp(x[b * 12 + i] - mx) / s);
            }
        }
        uint64_t ver;
        if (pm && ps_model_forward_range(pm, 0, 0, x, 2, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK) {
            char what[64];
            snprintf(what, sizeof what, "softmax opset %lld", (long long)opset);
            check_array(what, out, want, 24, 1e-6, 1e-5);
        } else if (pm) {
            CHECK_MSG(0, "forward: %s", e.msg);
        }
        ps_model_free(pm);
        ps_onnx_import_free(im);
        ps_onnx_free(om);
        free(m.p);
    }
}

static void test_attributes(void) {
    /* Dropout: ratio attribute at opset 10, input at 12 */
    int64_t d[2] = {2, 3}, dc[1] = {3};
    const char *in1[1] = {"x"};
    attr_spec ratio = {"ratio", 1, 0.25, 0, 0, {0}};
    {
        buf n = node("drop", "Dropout", 1, in1, "y", 1, &ratio);
        buf vi = value_info("x", 2, d), vo = value_info("y", 2, d);
        buf m = model(10, &n, 1, NULL, 0, &vi, &vo);
        char *y = yaml_of(&m);
        CHECK_MSG(strstr(y, "kind: Dropout, p: 0.25"), "dropout opset 10: %s", y);
        free(y);
        free(m.p);
    }
    {
        float r = 0.4f;
        buf t = tensor("r", 0, NULL, &r, 1);
        const char *in2[2] = {"x", "r"};
        buf n = node("drop", "Dropout", 2, in2, "y", 0, NULL);
        buf vi = value_info("x", 2, d), vo = value_info("y", 2, d);
        buf m = model(12, &n, 1, &t, 1, &vi, &vo);
        char *y = yaml_of(&m);
        CHECK_MSG(strstr(y, "kind: Dropout, p: 0.4"), "dropout opset 12: %s", y);
        free(y);
        free(m.p);
    }
    /* Conv: a stride, dilation or kernel_shape of 0 (a fuzzer's: the output size divided by the stride) refused */
    {
        int64_t x4[4] = {1, 1, 4, 4}, w4[4] = {1, 1, 2, 2};
        float wv[4] = {1, 2, 3, 4};
        const char *cin[2] = {"x", "w"};
        const char *keys[3] = {"strides", "dilations", "kernel_shape"};
        for (int k = 0; k < 3; k++) {
            attr_spec a = {keys[k], 7, 0, 0, 2, {k == 2 ? 2 : 1, 0}};
            buf wt = tensor("w", 4, w4, wv, 4);
            buf n = node("/c/Conv", "Conv", 2, cin, "y", 1, &a);
            buf vi = value_info("x", 4, x4), vo = value_info("y", 4, x4);
            buf m = model(13, &n, 1, &wt, 1, &vi, &vo);
            char what[64], needle[64];
            snprintf(what, sizeof what, "a Conv with %s [%d, 0]", keys[k], k == 2 ? 2 : 1);
            snprintf(needle, sizeof needle, "%s value 0", keys[k]);
            expect_refusal(what, &m, PS_ERR_INVALID_ARGUMENT, needle);
            free(m.p);
        }
    }
    /* BatchNormalization: momentum 0.7 is PyTorch's 0.3; spatial 0 refused before opset 9 */
    {
        int64_t x4[4] = {2, 3, 4, 4};
        float ones[3] = {1, 1, 1}, zeros[3] = {0, 0, 0};
        buf ts[4] = {tensor("bn.weight", 1, dc, ones, 3), tensor("bn.bias", 1, dc, zeros, 3),
                     tensor("bn.running_mean", 1, dc, zeros, 3), tensor("bn.running_var", 1, dc, ones, 3)};
        const char *in5[5] = {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"};
        attr_spec at[2] = {{"momentum", 1, 0.7, 0, 0, {0}}, {"epsilon", 1, 1e-3, 0, 0, {0}}};
        buf n = node("/bn/BatchNormalization", "BatchNormalization", 5, in5, "y", 2, at);
        buf vi = value_info("x", 4, x4), vo = value_info("y", 4, x4);
        buf m = model(9, &n, 1, ts, 4, &vi, &vo);
        char *y = yaml_of(&m);
        CHECK_MSG(strstr(y, "{name: bn, kind: BatchNorm2d, eps: 0.001, momentum: 0.3}"), "batchnorm: %s", y);
        free(y);
        free(m.p);
        buf ts2[4] = {tensor("bn.weight", 1, dc, ones, 3), tensor("bn.bias", 1, dc, zeros, 3),
                      tensor("bn.running_mean", 1, dc, zeros, 3), tensor("bn.running_var", 1, dc, ones, 3)};
        attr_spec sp = {"spatial", 2, 0, 0, 0, {0}};
        buf n2 = node("/bn/BatchNormalization", "BatchNormalization", 5, in5, "y", 1, &sp);
        buf vi2 = value_info("x", 4, x4), vo2 = value_info("y", 4, x4);
        buf m2 = model(7, &n2, 1, ts2, 4, &vi2, &vo2);
        expect_refusal("BatchNormalization spatial 0 at opset 7", &m2, PS_ERR_UNIMPLEMENTED, "spatial: 0");
        free(m2.p);
    }
    /* Gemm: names from the initializers; B transposed without transB */
    for (int transb = 0; transb < 2; transb++) {
        int64_t wd[2] = {transb ? 4 : 3, transb ? 3 : 4}, bd[1] = {4}, od[2] = {2, 4};
        float wv[12], bv[4] = {1, 2, 3, 4};
        for (int i = 0; i < 12; i++) wv[i] = (float)i;
        buf ts[2] = {tensor("fc.weight", 2, wd, wv, 12), tensor("fc.bias", 1, bd, bv, 4)};
        const char *in3[3] = {"x", "fc.weight", "fc.bias"};
        attr_spec tb = {"transB", 2, 0, 1, 0, {0}};
        buf n = node("/fc/Gemm", "Gemm", 3, in3, "y", transb, &tb);
        buf vi = value_info("x", 2, d), vo = value_info("y", 2, od);
        buf m = model(13, &n, 1, ts, 2, &vi, &vo);
        ps_err e = {0};
        ps_onnx_model *om;
        ps_onnx_import *im = import(&m, &e, &om);
        CHECK_MSG(im != NULL, "gemm: %s", e.msg);
        if (im) {
            const char *y = ps_onnx_import_yaml(im, NULL);
            CHECK_MSG(strstr(y, "{name: fc, kind: Linear, out_features: 4}"), "gemm: %s", y);
            CHECK(ps_onnx_import_num_values(im) == 2 && !strcmp(ps_onnx_import_value_name(im, 0), "fc.weight") &&
                  !strcmp(ps_onnx_import_value_name(im, 1), "fc.bias"));
            float got[12];
            CHECK(ps_onnx_import_value(im, 0, got, &e) == PS_OK);
            /* PyTorch's (out, in): row o, column i is B[i][o] without transB, B[o][i] with it */
            int same = 1;
            for (int o = 0; o < 4; o++)
                for (int i = 0; i < 3; i++) same &= got[o * 3 + i] == (transb ? wv[o * 3 + i] : wv[i * 4 + o]);
            CHECK_MSG(same, "gemm transB %d: the weight as Linear's (out, in)", transb);
        }
        ps_onnx_import_free(im);
        ps_onnx_free(om);
        free(m.p);
    }
}

/* The oldest files psd reads (IR 3, opset 6), and Pad's pads: an attribute
 * before opset 11, an input from 11. A zero Pad of H and W read by an
 * AveragePool is the pool's padding, the zeros counted in the average
 * (count_include_pad, AvgPool2d's default); at opset 11 a Pad with pads as
 * an attribute is not ONNX's Pad of that opset and is refused naming it. */
static void test_old_opsets(void) {
    buf r = {0};
    {
        int64_t d[2] = {2, 3};
        const char *in[1] = {"x"};
        buf n = node("/act/Relu", "Relu", 1, in, "y", 0, NULL);
        buf vi = value_info("x", 2, d), vo = value_info("y", 2, d);
        r = model_ir(3, 6, &n, 1, NULL, 0, &vi, &vo);
    }
    char *y = yaml_of(&r);
    CHECK_MSG(strstr(y, "kind: ReLU"), "IR 3, opset 6 relu: %s", y);
    if (strstr(y, "kind: ReLU")) printf("ok: IR 3, opset 6 read\n");
    free(y);
    free(r.p);
    int64_t x4[4] = {2, 3, 4, 4};
    int64_t pads[8] = {0, 0, 1, 1, 0, 0, 1, 1};
    attr_spec pool = {"kernel_shape", 7, 0, 0, 2, {3, 3}};
    for (int opset = 10; opset <= 11; opset++) {
        for (int as_attr = 0; as_attr < 2; as_attr++) {
            if (opset == 10 && !as_attr) continue;   /* no pads input before 11 */
            const char *pin[2] = {"x", "pads"}, *ain[1] = {"p"};
            attr_spec pa = {"pads", 7, 0, 0, 8, {0, 0, 1, 1, 0, 0, 1, 1}};
            buf ns[2] = {node("/pool/Pad", "Pad", as_attr ? 1 : 2, pin, "p", as_attr, &pa),
                         node("/pool/AveragePool", "AveragePool", 1, ain, "y", 1, &pool)};
            buf t = tensor_i64("pads", 8, pads);
            buf vi = value_info("x", 4, x4), vo = value_info("y", 4, x4);
            buf m = model(opset, ns, 2, as_attr ? NULL : &t, as_attr ? 0 : 1, &vi, &vo);
            if (as_attr) free(t.p);
            char what[64];
            snprintf(what, sizeof what, "Pad with pads as %s at opset %d", as_attr ? "attribute" : "input", opset);
            if (opset == 11 && as_attr) {
                expect_refusal(what, &m, PS_ERR_UNIMPLEMENTED, "(Pad): attribute 'pads' is not supported");
            } else {
                y = yaml_of(&m);
                int ok = strstr(y, "kind: AvgPool2d, kernel_size: 3, stride: 1, padding: 1") && !strstr(y, "Pad") &&
                         !strstr(y, "count_include_pad");
                CHECK_MSG(ok, "%s: %s", what, y);
                if (ok) printf("ok: %s: the pool's padding\n", what);
                free(y);
            }
            free(m.p);
        }
    }
    {   /* strides of 0 (a mutated file make fuzz found: the output size divided by them) */
        const char *ain[1] = {"x"};
        attr_spec pa[2] = {pool, {"strides", 7, 0, 0, 2, {0, 0}}};
        buf n = node("/pool/AveragePool", "AveragePool", 1, ain, "y", 2, pa);
        buf vi = value_info("x", 4, x4), vo = value_info("y", 4, x4);
        buf m = model(13, &n, 1, NULL, 0, &vi, &vo);
        expect_refusal("an AveragePool with strides 0", &m, PS_ERR_INVALID_ARGUMENT, "strides value 0");
        free(m.p);
    }
}

/* Concat's arity: one input is the identity (torch.cat of a one-tensor
 * list: densenet's first layer); 64 are a Concat, even of 100-character
 * names (two such lines outgrow the model file's first buffer); 65 are
 * refused. x (2, 3) -> Concat[x] -> Relu -> Concat[r x 64] -> Concat[c1 x
 * 64] (2, 12288), checked numerically: y[b, k] = relu(x[b, k % 3]). */
static void test_concat_arity(void) {
    char rname[128], cname[128];
    snprintf(rname, sizeof rname, "/%.90s/Relu", "rrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr");
    snprintf(cname, sizeof cname, "/%.90s/Concat", "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc");
    const char *x1[1] = {"x"}, *c0[1] = {"c0"}, *r64[65], *c64[64];
    for (int i = 0; i < 65; i++) r64[i] = "r";
    for (int i = 0; i < 64; i++) c64[i] = "c1";
    attr_spec ax = {"axis", 2, 0, 1, 0, {0}};
    int64_t dx[2] = {2, 3}, dy[2] = {2, 3 * 64 * 64}, d65[2] = {2, 3 * 65};
    {
        buf ns[4] = {node("/first/Concat", "Concat", 1, x1, "c0", 1, &ax), node(rname, "Relu", 1, c0, "r", 0, NULL),
                     node(cname, "Concat", 64, r64, "c1", 1, &ax), node("/last/Concat", "Concat", 64, c64, "y", 1, &ax)};
        buf vi = value_info("x", 2, dx), vo = value_info("y", 2, dy);
        buf m = model(13, ns, 4, NULL, 0, &vi, &vo);
        char *y = yaml_of(&m);
        const char *relu = strstr(y, "kind: ReLU");
        CHECK_MSG(relu && !strstr(relu, "input: c0") && strstr(y, "kind: Concat") == strstr(relu, "kind: Concat"),
                  "a one-input Concat is the identity (no node; the Relu reads the input): %s", y);
        int cats = count_of(y, "kind: Concat");
        CHECK_MSG(cats == 2, "two Concats of 64: %d in %s", cats, y);
        ps_err e = {0};
        ps_model *pm = ref_model_of(y, &e);
        enum { OUT = 3 * 64 * 64 };
        float x[6] = {-1.5f, 0.25f, 2.0f, 0.5f, -0.75f, 3.5f};
        float *out = calloc(2 * OUT, sizeof *out), *want = calloc(2 * OUT, sizeof *want);
        for (int b = 0; b < 2; b++)
            for (int k = 0; k < OUT; k++) want[b * OUT + k] = fmaxf(x[b * 3 + k % 3], 0.0f);
        uint64_t ver;
        if (pm && ps_model_forward_range(pm, 0, 0, x, 2, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK)
            check_array("Concat of 64 of a Concat of 64 of relu(Concat[x])", out, want, 2 * OUT, 0, 0);
        else if (pm)
            CHECK_MSG(0, "forward: %s", e.msg);
        ps_model_free(pm);
        free(out);
        free(want);
        free(y);
        free(m.p);
    }
    {
        buf ns[2] = {node("/act/Relu", "Relu", 1, x1, "r", 0, NULL), node("/wide/Concat", "Concat", 65, r64, "y", 1, &ax)};
        buf vi = value_info("x", 2, dx), vo = value_info("y", 2, d65);
        buf m = model(13, ns, 2, NULL, 0, &vi, &vo);
        expect_refusal("a Concat of 65", &m, PS_ERR_UNIMPLEMENTED,
                       "node '/wide/Concat' (Concat): 65 inputs (psd's Concat takes 2 to 64)");
        free(m.p);
    }
}

/* shufflenet_v2's unit as PyTorch exports it: x.chunk as two Slices, a
 * branch, Concat, and channel_shuffle's Reshape (N, g, C/g, H, W),
 * Transpose [0, 2, 1, 3, 4], Reshape back: two Narrows and a
 * ChannelShuffle (no Reshape, no Transpose left), checked numerically;
 * a Slice with step 2 refused. */
static void test_shuffle_unit(void) {
    int64_t dx[4] = {2, 4, 2, 2}, d5[5] = {2, 2, 2, 2, 2};
    int64_t zero[1] = {0}, two[1] = {2}, end[1] = {INT64_MAX}, ax1[1] = {1};
    buf inits[6] = {tensor_i64("s0", 1, zero), tensor_i64("s2", 1, two), tensor_i64("e2", 1, two),
                    tensor_i64("end", 1, end), tensor_i64("ax1", 1, ax1), tensor_i64("shape5", 5, d5)};
    buf shape4 = tensor_i64("shape4", 4, dx);
    const char *sa[4] = {"x", "s0", "e2", "ax1"}, *sb[4] = {"x", "s2", "end", "ax1"}, *rb[1] = {"b"},
               *cat[2] = {"a", "r"}, *r5[2] = {"c", "shape5"}, *tp[1] = {"v"}, *r4[2] = {"t", "shape4"};
    attr_spec ax = {"axis", 2, 0, 1, 0, {0}}, perm = {"perm", 7, 0, 0, 5, {0, 2, 1, 3, 4}};
    buf ns[7] = {node("/u/Slice", "Slice", 4, sa, "a", 0, NULL), node("/u/Slice_1", "Slice", 4, sb, "b", 0, NULL),
                 node("/u/branch/Relu", "Relu", 1, rb, "r", 0, NULL), node("/u/Concat", "Concat", 2, cat, "c", 1, &ax),
                 node("/u/Reshape", "Reshape", 2, r5, "v", 0, NULL), node("/u/Transpose", "Transpose", 1, tp, "t", 1, &perm),
                 node("/u/Reshape_1", "Reshape", 2, r4, "y", 0, NULL)};
    buf all[7] = {inits[0], inits[1], inits[2], inits[3], inits[4], inits[5], shape4};
    buf vi = value_info("x", 4, dx), vo = value_info("y", 4, dx);
    buf m = model(13, ns, 7, all, 7, &vi, &vo);
    char *y = yaml_of(&m);
    int narrows = count_of(y, "kind: Narrow");
    CHECK_MSG(narrows == 2 && strstr(y, "kind: ChannelShuffle, groups: 2") && !strstr(y, "Reshape") &&
              strstr(y, "dim: 1, start: 2, length: 2"), "shuffle unit: %s", y);
    ps_err e = {0};
    ps_model *pm = ref_model_of(y, &e);
    float x[32], out[32], want[32];
    for (int i = 0; i < 32; i++) x[i] = sinf((float)i * 1.3f) * 2;
    /* cat [x0, x1, relu x2, relu x3]; shuffled with 2 groups: output channel i * 2 + j is input j * 2 + i */
    for (int n = 0; n < 2; n++)
        for (int oc = 0; oc < 4; oc++) {
            int ic = (oc % 2) * 2 + oc / 2;
            for (int k = 0; k < 4; k++) {
                float v = x[n * 16 + ic * 4 + k];
                want[n * 16 + oc * 4 + k] = ic >= 2 ? fmaxf(v, 0.0f) : v;
            }
        }
    uint64_t ver;
    if (pm && ps_model_forward_range(pm, 0, 0, x, 2, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK)
        check_array("shuffle unit: Narrow, Narrow, ReLU, Concat, ChannelShuffle", out, want, 32, 0, 0);
    else if (pm)
        CHECK_MSG(0, "forward: %s", e.msg);
    ps_model_free(pm);
    free(y);
    free(m.p);
    {   /* swin's x[..., 1::2, 0::2] (a Slice of two axes with step 2: two strided Narrows), checked numerically;
         * a step of -1 refused */
        int64_t one2[2] = {1, 0}, end2[2] = {INT64_MAX, INT64_MAX}, ax23[2] = {2, 3}, st2[2] = {2, 2}, neg[1] = {-1};
        buf t[4] = {tensor_i64("s", 2, one2), tensor_i64("e", 2, end2), tensor_i64("ax", 2, ax23),
                    tensor_i64("st", 2, st2)};
        const char *si[5] = {"x", "s", "e", "ax", "st"};
        buf n = node("/u/Slice", "Slice", 5, si, "y", 0, NULL);
        int64_t dy[4] = {2, 4, 1, 1};
        buf vi2 = value_info("x", 4, dx), vo2 = value_info("y", 4, dy);
        buf m2 = model(13, &n, 1, t, 4, &vi2, &vo2);
        char *y2 = yaml_of(&m2);
        CHECK_MSG(count_of(y2, "kind: Narrow") == 2 && strstr(y2, "dim: 2, start: 1, length: 1, step: 2") &&
                  strstr(y2, "dim: 3, start: 0, length: 1, step: 2"), "strided Slice: %s", y2);
        ps_model *pm2 = ref_model_of(y2, &e);
        float o2[8], w2[8];
        for (int k = 0; k < 8; k++) w2[k] = x[k * 4 + 2];   /* (n, c, 1, 0) of each (2, 2) plane */
        if (pm2 && ps_model_forward_range(pm2, 0, 0, x, 2, 0, NULL, 0, o2, NULL, &ver, &e) == PS_OK)
            check_array("x[..., 1::2, 0::2]: two strided Narrows", o2, w2, 8, 0, 0);
        else if (pm2)
            CHECK_MSG(0, "forward: %s", e.msg);
        ps_model_free(pm2);
        free(y2);
        free(m2.p);
        buf tn[4] = {tensor_i64("s0", 1, zero), tensor_i64("end", 1, end), tensor_i64("ax1", 1, ax1),
                     tensor_i64("st", 1, neg)};
        const char *sn[5] = {"x", "s0", "end", "ax1", "st"};
        buf nn = node("/u/Slice", "Slice", 5, sn, "y", 0, NULL);
        buf vi3 = value_info("x", 4, dx), vo3 = value_info("y", 4, dx);
        buf m3 = model(13, &nn, 1, tn, 4, &vi3, &vo3);
        expect_refusal("a Slice with step -1 of part of an axis", &m3, PS_ERR_UNIMPLEMENTED,
                       "a Slice with step -1 over 0 to 3 of 4 (psd reverses whole axes: Flip)");
        free(m3.p);
    }
}

/* users' elementwise functions as an exporter may write them: Greater(0.5, x) with the number first (a Less of
 * x), Where choosing x or the number -1 by it, Max of that and Relu(x) (two computed values: Maximum), a Slice
 * with step -1 over the whole axis 1 (torch.flip: Flip), checked numerically; Where by a condition that is no
 * comparison refused. */
static void test_elementwise(void) {
    int64_t dx[2] = {2, 4}, st[1] = {-1}, en[1] = {INT64_MIN}, ax1[1] = {1}, step[1] = {-1};
    const float half = 0.5f, m1 = -1.0f;
    buf half_t = tensor("", 0, NULL, &half, 1), m1_t = tensor("", 0, NULL, &m1, 1);
    attr_spec hv = {"value", 4, 0, 0, 0, {0}, NULL, &half_t}, mv = {"value", 4, 0, 0, 0, {0}, NULL, &m1_t};
    buf inits[4] = {tensor_i64("st", 1, st), tensor_i64("en", 1, en), tensor_i64("ax1", 1, ax1),
                    tensor_i64("step", 1, step)};
    const char *gt_in[2] = {"half", "x"}, *wh_in[3] = {"g", "x", "m1"}, *r_in[1] = {"x"}, *mx_in[2] = {"w", "r"},
               *sl_in[5] = {"mx", "st", "en", "ax1", "step"};
    buf ns[7] = {node("/Constant", "Constant", 0, NULL, "half", 1, &hv),
                 node("/Constant_1", "Constant", 0, NULL, "m1", 1, &mv),
                 node("/Greater", "Greater", 2, gt_in, "g", 0, NULL), node("/Where", "Where", 3, wh_in, "w", 0, NULL),
                 node("/Relu", "Relu", 1, r_in, "r", 0, NULL), node("/Max", "Max", 2, mx_in, "mx", 0, NULL),
                 node("/Slice", "Slice", 5, sl_in, "y", 0, NULL)};
    buf vi = value_info("x", 2, dx), vo = value_info("y", 2, dx);
    buf m = model(13, ns, 7, inits, 4, &vi, &vo);
    char *y = yaml_of(&m);
    CHECK_MSG(strstr(y, "kind: Less") && strstr(y, "value: 0.5") && strstr(y, "kind: Where") &&
              strstr(y, "b: -1.0") && strstr(y, "kind: Maximum") && strstr(y, "kind: Flip") &&
              strstr(y, "dims: [1]"), "elementwise: %s", y);
    ps_err e = {0};
    ps_model *pm = ref_model_of(y, &e);
    float x[8], out[8], want[8];
    for (int i = 0; i < 8; i++) x[i] = sinf((float)i * 1.7f) * 1.5f;
    x[3] = 0.5f;   /* on the threshold: 0.5 > 0.5 is false, so -1 there */
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < 4; j++) {
            const float v = x[n * 4 + j], w = 0.5f > v ? v : -1.0f;
            want[n * 4 + 3 - j] = fmaxf(w, fmaxf(v, 0.0f));
        }
    uint64_t ver;
    if (pm && ps_model_forward_range(pm, 0, 0, x, 2, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK)
        check_array("Greater of a number first, Where, Max of two computed values, Slice by -1", out, want, 8, 0, 0);
    else if (pm)
        CHECK_MSG(0, "forward: %s", e.msg);
    ps_model_free(pm);
    free(y);
    free(m.p);
    {   /* Where by a computed condition that is no comparison (the input itself) */
        const char *w2_in[3] = {"x", "x", "m1"};
        buf n2[2] = {node("/Constant_1", "Constant", 0, NULL, "m1", 1, &mv), node("/Where", "Where", 3, w2_in, "y", 0, NULL)};
        buf vi2 = value_info("x", 2, dx), vo2 = value_info("y", 2, dx);
        buf m2 = model(13, n2, 2, NULL, 0, &vi2, &vo2);
        expect_refusal("Where by a computed condition that is no comparison", &m2, PS_ERR_UNIMPLEMENTED,
                       "psd takes a comparison of a computed value with a number");
        free(m2.p);
    }
    free(half_t.p);
    free(m1_t.p);
}

/* A graph of several outputs (value infos outs[0..nout-1]), default domain at opset 13 */
static buf model_outs(buf *nodes, int nn, buf *inits, int ni, buf *in, buf *outs, int nout) {
    buf g = {0}, m = {0}, o = {0};
    for (int i = 0; i < nn; i++) f_msg(&g, 1, &nodes[i]);
    f_str(&g, 2, "g");
    for (int i = 0; i < ni; i++) f_msg(&g, 5, &inits[i]);
    f_msg(&g, 11, in);
    for (int i = 0; i < nout; i++) f_msg(&g, 12, &outs[i]);
    f_varint(&m, 1, 7);
    f_str(&m, 2, "test_onnx_import");
    f_msg(&m, 7, &g);
    f_str(&o, 1, "");
    f_varint(&o, 2, 13);
    f_msg(&m, 8, &o);
    return m;
}

/* A VAE's export: torch.randn_like as RandomNormalLike (mean 2, scale 0.5: a RandnLike, MulConstant 0.5,
 * AddConstant 2), and three graph outputs r = relu(x) (2, 4), e = exp(x viewed (2, 2, 2)), z the noise (2, 4),
 * joined as psd's one output (2, 12): r | e flattened | z, checked numerically for r and e, z drawn with mean 2
 * and spread 0.5 (8 draws: distinct, inside 2 +- 3); a seed, a double dtype and an output that is the input
 * itself refused. */
static void test_outputs_noise(void) {
    int64_t dx[2] = {2, 4}, de[3] = {2, 2, 2}, shp[3] = {0, 2, 2};
    buf init = tensor_i64("shp", 3, shp);
    attr_spec rn[2] = {{"mean", 1, 2.0, 0, 0, {0}, NULL, NULL}, {"scale", 1, 0.5, 0, 0, {0}, NULL, NULL}};
    const char *x1[1] = {"x"}, *rs_in[2] = {"x", "shp"}, *q1[1] = {"q"}, *r1[1] = {"r"};
    buf ns[4] = {node("/Relu", "Relu", 1, x1, "r", 0, NULL), node("/Reshape", "Reshape", 2, rs_in, "q", 0, NULL),
                 node("/Exp", "Exp", 1, q1, "e", 0, NULL),
                 node("/RandomNormalLike", "RandomNormalLike", 1, r1, "z", 2, rn)};
    buf vi = value_info("x", 2, dx), vo[3] = {value_info("r", 2, dx), value_info("e", 3, de), value_info("z", 2, dx)};
    buf m = model_outs(ns, 4, &init, 1, &vi, vo, 3);
    char *y = yaml_of(&m);
    CHECK_MSG(strstr(y, "kind: RandnLike") && strstr(y, "kind: MulConstant, value: 0.5") &&
              strstr(y, "kind: AddConstant, value: 2.0") && strstr(y, "kind: Flatten") && strstr(y, "kind: Concat"),
              "outputs and noise: %s", y);
    ps_err e = {0};
    ps_model *pm = ref_model_of(y, &e);
    float x[8], out[24], want[16], got[16];
    for (int i = 0; i < 8; i++) x[i] = sinf((float)i * 1.3f);
    uint64_t ver;
    if (pm && ps_model_forward_range(pm, 0, 0, x, 2, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK) {
        int distinct = 1, inside = 1;
        for (int n = 0; n < 2; n++)
            for (int j = 0; j < 4; j++) {
                want[n * 8 + j] = fmaxf(x[n * 4 + j], 0.0f);
                want[n * 8 + 4 + j] = expf(x[n * 4 + j]);
                got[n * 8 + j] = out[n * 12 + j];
                got[n * 8 + 4 + j] = out[n * 12 + 4 + j];
                const float z = out[n * 12 + 8 + j];
                inside &= z > -1.0f && z < 5.0f;
                for (int k = 0; k < n * 4 + j; k++) distinct &= z != out[(k / 4) * 12 + 8 + k % 4];
            }
        check_array("three graph outputs joined: relu(x) | exp(x) flattened", got, want, 16, 1e-6, 1e-6);
        CHECK_MSG(distinct && inside, "RandomNormalLike(mean 2, scale 0.5): 8 draws distinct %d, inside 2 +- 3 %d",
                  distinct, inside);
        if (distinct && inside) printf("ok: RandomNormalLike(mean 2, scale 0.5): 8 distinct draws inside 2 +- 3\n");
    } else if (pm) {
        CHECK_MSG(0, "forward: %s", e.msg);
    }
    ps_model_free(pm);
    free(y);
    free(m.p);
    {
        attr_spec sd[1] = {{"seed", 1, 7.0, 0, 0, {0}, NULL, NULL}}, dt[1] = {{"dtype", 2, 0, 11, 0, {0}, NULL, NULL}};
        const char *specs[2] = {"a seed", "a double dtype"}, *needles[2] = {"seed 7", "dtype"};
        for (int k = 0; k < 2; k++) {
            buf n1 = node("/RandomNormalLike", "RandomNormalLike", 1, x1, "y", 1, k ? dt : sd);
            buf vi1 = value_info("x", 2, dx), vo1 = value_info("y", 2, dx);
            buf m1 = model(13, &n1, 1, NULL, 0, &vi1, &vo1);
            char what[64];
            snprintf(what, sizeof what, "RandomNormalLike with %s", specs[k]);
            expect_refusal(what, &m1, PS_ERR_UNIMPLEMENTED, needles[k]);
            free(m1.p);
        }
        buf n2 = node("/Relu", "Relu", 1, x1, "r", 0, NULL);
        buf vi2 = value_info("x", 2, dx), vo2[2] = {value_info("r", 2, dx), value_info("x", 2, dx)};
        buf m2 = model_outs(&n2, 1, NULL, 0, &vi2, vo2, 2);
        expect_refusal("a graph output that is the input itself", &m2, PS_ERR_UNIMPLEMENTED, "the input itself");
        free(m2.p);
    }
    free(init.p);
}

/* attention's pieces as exporters write them: a view's shape from the exporters' expand(-1) arithmetic on
 * constants (Reshape of a constant, Shape, ConstantOfShape, Sub, Add, Equal, Where: [2, 4, 3] -> [2, -1, 3]),
 * a MatMul of two computed values (x and its Transpose), a Split along the last dim whose first part nothing
 * reads: Reshape, Permute, MatMul and one Narrow, checked numerically. */
static void test_attention_pieces(void) {
    int64_t dx[3] = {2, 3, 4}, dy[3] = {2, 4, 3}, c243[3] = {2, 4, 3}, m1[1] = {-1}, one[1] = {1}, four[1] = {4},
            sp[2] = {1, 3};
    buf inits[5] = {tensor_i64("c", 3, c243), tensor_i64("m1", 1, m1), tensor_i64("one", 1, one),
                    tensor_i64("four", 1, four), tensor_i64("sp", 2, sp)};
    const char *rc_in[2] = {"c", "m1"}, *sh_in[1] = {"r"}, *cs_in[1] = {"sh"}, *sub_in[2] = {"z", "one"},
               *add_in[2] = {"z", "four"}, *eq_in[2] = {"r", "f"}, *wh_in[3] = {"eq", "neg", "r"},
               *xr_in[2] = {"x", "w"}, *tp_in[1] = {"xr"}, *mm_in[2] = {"xr", "t"}, *sp_in[2] = {"p", "sp"};
    attr_spec perm = {"perm", 7, 0, 0, 3, {0, 2, 1}}, ax = {"axis", 2, 0, 2, 0, {0}};
    buf split = node("/a/Split", "Split", 2, sp_in, "s0", 1, &ax);
    f_str(&split, 2, "y");   /* its second output */
    buf ns[11] = {node("/a/Reshape_1", "Reshape", 2, rc_in, "r", 0, NULL), node("/a/Shape", "Shape", 1, sh_in, "sh", 0, NULL),
                  node("/a/ConstantOfShape", "ConstantOfShape", 1, cs_in, "z", 0, NULL),
                  node("/a/Sub", "Sub", 2, sub_in, "neg", 0, NULL), node("/a/Add", "Add", 2, add_in, "f", 0, NULL),
                  node("/a/Equal", "Equal", 2, eq_in, "eq", 0, NULL), node("/a/Where", "Where", 3, wh_in, "w", 0, NULL),
                  node("/a/Reshape", "Reshape", 2, xr_in, "xr", 0, NULL),
                  node("/a/Transpose", "Transpose", 1, tp_in, "t", 1, &perm),
                  node("/a/MatMul", "MatMul", 2, mm_in, "p", 0, NULL), split};
    buf vi = value_info("x", 3, dx), vo = value_info("y", 3, dy);
    buf m = model(13, ns, 11, inits, 5, &vi, &vo);
    char *y = yaml_of(&m);
    CHECK_MSG(strstr(y, "kind: Reshape, shape: [4, 3]") && strstr(y, "kind: Permute, dims: [0, 2, 1]") &&
              strstr(y, "kind: MatMul, inputs: [") && count_of(y, "kind: Narrow") == 1 &&
              strstr(y, "dim: 2, start: 1, length: 3"), "attention pieces: %s", y);
    ps_err e = {0};
    ps_model *pm = ref_model_of(y, &e);
    float x[24], out[24], want[24];
    for (int i = 0; i < 24; i++) x[i] = cosf((float)i * 0.7f);
    for (int n = 0; n < 2; n++)   /* A = x[n] as (4, 3); p = A A^T (4, 4); y = p[:, 1:4] */
        for (int i = 0; i < 4; i++)
            for (int j = 1; j < 4; j++) {
                double acc = 0;
                for (int k = 0; k < 3; k++) acc += (double)x[n * 12 + i * 3 + k] * x[n * 12 + j * 3 + k];
                want[n * 12 + i * 3 + j - 1] = (float)acc;
            }
    uint64_t ver;
    if (pm && ps_model_forward_range(pm, 0, 0, x, 2, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK)
        check_array("attention pieces: Reshape of the folded shape, Permute, MatMul, Narrow of the Split", out, want,
                    24, 1e-6, 1e-5);
    else if (pm)
        CHECK_MSG(0, "forward: %s", e.msg);
    ps_model_free(pm);
    free(y);
    free(m.p);
}

/* nn.MultiheadAttention(8, 2, batch_first=True) as PyTorch's exporter decomposes it (torch 1.13, opset 13) on
 * x (2, 3, 8): Transpose to (L, N, E), MatMul by Transpose(in_proj_weight) + in_proj_bias, three Slices
 * into q, k, v, each Reshape (3, 4, 4) and Transpose (k's [1, 2, 0]), q / 2 (sqrt(D)), q k^T, Softmax,
 * [Dropout], times v, Transpose, Reshape (6, 8), Gemm by out_proj, Reshape (3, 2, 8), Transpose back.
 * variant: "plain"; "eval" (in_proj_weight stored (E, 3E) as onnx::MatMul_9, as an eval export folds it);
 * "dropout" (0.25 on the attention weights); what psd refuses: "mask" (an Add on the scores), "weights" (the
 * Softmax's output read outside: need_weights), "scale" (q / 3), "order" (the first Slice is the key). */
static buf mha_model(const char *variant) {
    const int eval = !strcmp(variant, "eval"), drop = !strcmp(variant, "dropout"), mask = !strcmp(variant, "mask"),
              wts = !strcmp(variant, "weights"), order = !strcmp(variant, "order");
    enum { E = 8, L = 3, N = 2, H = 2 };
    float w[3 * E * E], b[3 * E], wo[E * E], bo[E], mk[L * L];
    for (int i = 0; i < 3 * E * E; i++) w[i] = sinf((float)i * 0.37f) * 0.3f;
    for (int i = 0; i < 3 * E; i++) b[i] = cosf((float)i) * 0.1f;
    for (int i = 0; i < E * E; i++) wo[i] = cosf((float)i * 0.21f) * 0.3f;
    for (int i = 0; i < E; i++) bo[i] = sinf((float)i) * 0.1f;
    for (int i = 0; i < L * L; i++) mk[i] = i % 4 ? 0.0f : -1.0f;
    int64_t dw[2] = {3 * E, E}, dwt[2] = {E, 3 * E}, db[1] = {3 * E}, dwo[2] = {E, E}, dbo[1] = {E}, dm[2] = {L, L};
    int64_t s0[1] = {0}, s1[1] = {E}, s2[1] = {2 * E}, s3[1] = {3 * E}, ax[1] = {-1}, hs[3] = {L, N * H, E / H},
            js[2] = {L * N, E}, ys[3] = {L, N, E}, dx[3] = {N, L, E};
    buf inits[16];
    int ni = 0;
    inits[ni++] = eval ? tensor("onnx::MatMul_9", 2, dwt, w, 3 * E * E) : tensor("attn.in_proj_weight", 2, dw, w,
                                                                                   3 * E * E);
    inits[ni++] = tensor("attn.in_proj_bias", 1, db, b, 3 * E);
    inits[ni++] = tensor("attn.out_proj.weight", 2, dwo, wo, E * E);
    inits[ni++] = tensor("attn.out_proj.bias", 1, dbo, bo, E);
    inits[ni++] = tensor_i64("s0", 1, s0);
    inits[ni++] = tensor_i64("s1", 1, s1);
    inits[ni++] = tensor_i64("s2", 1, s2);
    inits[ni++] = tensor_i64("s3", 1, s3);
    inits[ni++] = tensor_i64("ax", 1, ax);
    inits[ni++] = tensor_i64("hs", 3, hs);
    inits[ni++] = tensor_i64("js", 2, js);
    inits[ni++] = tensor_i64("ys", 3, ys);
    if (mask) inits[ni++] = tensor("mask", 2, dm, mk, L * L);
    attr_spec p102 = {"perm", 7, 0, 0, 3, {1, 0, 2}}, p120 = {"perm", 7, 0, 0, 3, {1, 2, 0}},
              p10 = {"perm", 7, 0, 0, 2, {1, 0}}, tb = {"transB", 2, 0, 1, 0, {0}}, lastax = {"axis", 2, 0, -1, 0, {0}},
              sc = {"value_float", 1, !strcmp(variant, "scale") ? 3.0 : 2.0, 0, 0, {0}},
              ratio = {"value_float", 1, 0.25, 0, 0, {0}};
    const char *x[1] = {"x"}, *wt_in[1] = {"attn.in_proj_weight"}, *mm_in[2] = {"t0", eval ? "onnx::MatMul_9" : "wt"},
               *add_in[2] = {"attn.in_proj_bias", "mm"}, *sl_q[4] = {"proj", order ? "s1" : "s0", order ? "s2" : "s1", "ax"},
               *sl_k[4] = {"proj", order ? "s0" : "s1", order ? "s1" : "s2", "ax"}, *sl_v[4] = {"proj", "s2", "s3", "ax"},
               *rq[2] = {"q0", "hs"}, *rk[2] = {"k0", "hs"}, *rv[2] = {"v0", "hs"}, *tq[1] = {"qr"}, *tk[1] = {"kr"},
               *tv[1] = {"vr"}, *dq[2] = {"qt", "c"}, *mms[2] = {"qs", "kt"}, *madd[2] = {"sc", "mask"},
               *smx[1] = {mask ? "scm" : "sc"}, *dr[2] = {"aw", "r"}, *mmo[2] = {drop ? "ad" : "aw", "vt"},
               *to[1] = {"o"}, *ro[2] = {"ot", "js"}, *gm[3] = {"oj", "attn.out_proj.weight", "attn.out_proj.bias"},
               *ry[2] = {"g", "ys"}, *ty[1] = {"gy"}, *rs[1] = {"aw"}, *ya[2] = {"yt", "ws"};
    buf ns[40];
    int nn = 0;
    ns[nn++] = node("/attn/Transpose", "Transpose", 1, x, "t0", 1, &p102);
    if (!eval) ns[nn++] = node("/attn/Transpose_1", "Transpose", 1, wt_in, "wt", 1, &p10);
    ns[nn++] = node("/attn/MatMul", "MatMul", 2, mm_in, "mm", 0, NULL);
    ns[nn++] = node("/attn/Add", "Add", 2, add_in, "proj", 0, NULL);
    ns[nn++] = node("/attn/Slice", "Slice", 4, sl_q, "q0", 0, NULL);
    ns[nn++] = node("/attn/Slice_1", "Slice", 4, sl_k, "k0", 0, NULL);
    ns[nn++] = node("/attn/Slice_2", "Slice", 4, sl_v, "v0", 0, NULL);
    ns[nn++] = node("/attn/Reshape", "Reshape", 2, rq, "qr", 0, NULL);
    ns[nn++] = node("/attn/Transpose_2", "Transpose", 1, tq, "qt", 1, &p102);
    ns[nn++] = node("/attn/Reshape_1", "Reshape", 2, rk, "kr", 0, NULL);
    ns[nn++] = node("/attn/Reshape_2", "Reshape", 2, rv, "vr", 0, NULL);
    ns[nn++] = node("/attn/Transpose_3", "Transpose", 1, tv, "vt", 1, &p102);
    ns[nn++] = node("/attn/Constant", "Constant", 0, NULL, "c", 1, &sc);
    ns[nn++] = node("/attn/Div", "Div", 2, dq, "qs", 0, NULL);
    ns[nn++] = node("/attn/Transpose_4", "Transpose", 1, tk, "kt", 1, &p120);
    ns[nn++] = node("/attn/MatMul_1", "MatMul", 2, mms, "sc", 0, NULL);
    if (mask) ns[nn++] = node("/attn/Add_1", "Add", 2, madd, "scm", 0, NULL);
    ns[nn++] = node("/attn/Softmax", "Softmax", 1, smx, "aw", 1, &lastax);
    if (drop) {
        ns[nn++] = node("/attn/Constant_1", "Constant", 0, NULL, "r", 1, &ratio);
        ns[nn++] = node("/attn/Dropout", "Dropout", 2, dr, "ad", 0, NULL);
    }
    ns[nn++] = node("/attn/MatMul_2", "MatMul", 2, mmo, "o", 0, NULL);
    ns[nn++] = node("/attn/Transpose_5", "Transpose", 1, to, "ot", 1, &p102);
    ns[nn++] = node("/attn/Reshape_3", "Reshape", 2, ro, "oj", 0, NULL);
    ns[nn++] = node("/attn/Gemm", "Gemm", 3, gm, "g", 1, &tb);
    ns[nn++] = node("/attn/Reshape_4", "Reshape", 2, ry, "gy", 0, NULL);
    ns[nn++] = node("/attn/Transpose_6", "Transpose", 1, ty, wts ? "yt" : "y", 1, &p102);
    if (wts) {   /* the weights read too (need_weights=True's average, then used) */
        ns[nn++] = node("/ReduceSum", "ReduceSum", 1, rs, "ws", 0, NULL);
        ns[nn++] = node("/Add", "Add", 2, ya, "y", 0, NULL);
    }
    buf vi = value_info("x", 3, dx), vo = value_info("y", 3, dx);
    return model(13, ns, nn, inits, ni, &vi, &vo);
}

/* The imported model's forward (ref backend, its initial values the initializers) against the
 * decomposition's own arithmetic, computed here from the same weights: per sample, P = x W^T + b, q, k, v
 * its thirds, per head h (columns hD..hD+D-1) softmax(q_h k_h^T / sqrt(D)) v_h, joined, y = o Wo^T + bo. */
static void mha_forward_check(const char *variant, const char *yaml, const ps_onnx_import *im) {
    enum { E = 8, L = 3, N = 2, H = 2, D = 4 };
    ps_err e = {0};
    ps_model *pm = ref_model_of(yaml, &e);
    if (!pm) return;
    float w[3 * E * E], b[3 * E], wo[E * E], bo[E], x[N * L * E], out[N * L * E], want[N * L * E], t[3 * E * E];
    for (int k = 0; k < 4; k++) {   /* psd's parameters from the file's initializers, as psd starts */
        CHECK(ps_onnx_import_value(im, k, t, &e) == PS_OK);
        int p = ps_model_find_param(pm, ps_onnx_import_value_name(im, k));
        CHECK(p >= 0 && ps_model_set_param(pm, p, t, &e) == PS_OK);
    }
    /* the graph's weights as mha_model wrote them: W (3E, E) is in_proj_weight, or the transpose of the eval
     * export's (E, 3E) initializer */
    const int eval = !strcmp(variant, "eval");
    for (int r = 0; r < 3 * E; r++)
        for (int c = 0; c < E; c++) w[r * E + c] = sinf((float)(eval ? c * 3 * E + r : r * E + c) * 0.37f) * 0.3f;
    for (int i = 0; i < 3 * E; i++) b[i] = cosf((float)i) * 0.1f;
    for (int i = 0; i < E * E; i++) wo[i] = cosf((float)i * 0.21f) * 0.3f;
    for (int i = 0; i < E; i++) bo[i] = sinf((float)i) * 0.1f;
    for (int i = 0; i < N * L * E; i++) x[i] = sinf((float)i * 0.61f + 0.3f);
    for (int n = 0; n < N; n++) {
        double P[L][3 * E], o[L][E];
        for (int l = 0; l < L; l++)
            for (int r = 0; r < 3 * E; r++) {
                double acc = b[r];
                for (int c = 0; c < E; c++) acc += (double)x[(n * L + l) * E + c] * w[r * E + c];
                P[l][r] = acc;
            }
        for (int h = 0; h < H; h++)
            for (int i = 0; i < L; i++) {
                double s[L], mx = -1e300, z = 0;
                for (int j = 0; j < L; j++) {
                    s[j] = 0;
                    for (int d = 0; d < D; d++) s[j] += P[i][h * D + d] * P[j][E + h * D + d];
                    s[j] /= sqrt((double)D);
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j < L; j++) z += (s[j] = exp(s[j] - mx));
                for (int d = 0; d < D; d++) {
                    o[i][h * D + d] = 0;
                    for (int j = 0; j < L; j++) o[i][h * D + d] += s[j] / z * P[j][2 * E + h * D + d];
                }
            }
        for (int l = 0; l < L; l++)
            for (int r = 0; r < E; r++) {
                double acc = bo[r];
                for (int c = 0; c < E; c++) acc += o[l][c] * wo[r * E + c];
                want[(n * L + l) * E + r] = (float)acc;
            }
    }
    uint64_t ver;
    char what[96];
    snprintf(what, sizeof what, "mha %s: psd's forward = the decomposition's arithmetic", variant);
    if (ps_model_forward_range(pm, 0, 0, x, N, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK)
        check_array(what, out, want, N * L * E, 1e-5, 1e-5);
    else
        CHECK_MSG(0, "forward: %s", e.msg);
    ps_model_free(pm);
}

/* nn.MultiheadAttention's exported decomposition read back as one MultiheadAttention node whose parameters
 * are the module's state_dict names (the eval export's (E, 3E) in_proj_weight bound transposed, the node
 * named by its in_proj_bias), the attention weights' Dropout as its dropout, computing as the kind does (its
 * own golden check is test_kinds') where the input is per sample; and what it does not take refused at the
 * first Transpose, saying why (tests/export/check_attention.py trains the real exports against PyTorch). */
static void test_mha(void) {
    static const char *const names[4] = {"attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight",
                                          "attn.out_proj.bias"};
    for (int v = 0; v < 3; v++) {
        const char *variant = v == 0 ? "plain" : v == 1 ? "eval" : "dropout";
        buf m = mha_model(variant);
        ps_err e = {0};
        ps_onnx_model *om;
        ps_onnx_import *im = import(&m, &e, &om);
        CHECK_MSG(im != NULL, "mha %s: %s", variant, e.msg);
        if (im) {
            const char *y = ps_onnx_import_yaml(im, NULL);
            int ok = count_of(y, "kind:") == 1 && strstr(y, "input: {shape: [3, 8], dtype: float32}") &&
                     strstr(y, v == 2 ? "{name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
                                        "dropout: 0.25, batch_first: true}"
                                      : "{name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
                                        "batch_first: true}");
            CHECK_MSG(ok, "mha %s: one MultiheadAttention node: %s", variant, y);
            int named = ps_onnx_import_num_values(im) == 4;
            for (int k = 0; k < 4 && named; k++) named = !strcmp(ps_onnx_import_value_name(im, k), names[k]);
            CHECK_MSG(named, "mha %s: parameters %s, %s, %s, %s", variant, names[0], names[1], names[2], names[3]);
            float got[192];
            /* in_proj_weight (3E, E): element (r, c) is w[r * E + c]; the eval export's (E, 3E) holds it at
             * [c * 3E + r], the same values the builder wrote in PyTorch's layout and read back transposed */
            CHECK(ps_onnx_import_value(im, 0, got, &e) == PS_OK);
            int same = 1;
            for (int r = 0; r < 24; r++)
                for (int c = 0; c < 8; c++) {
                    int i = v == 1 ? c * 24 + r : r * 8 + c;
                    same &= got[r * 8 + c] == sinf((float)i * 0.37f) * 0.3f;
                }
            CHECK_MSG(same, "mha %s: in_proj_weight as PyTorch's (3E, E)", variant);
            if (ok && named && same) printf("ok: mha %s: one MultiheadAttention node, the module's parameters\n",
                                            variant);
            if (v < 2) mha_forward_check(variant, y, im);
        }
        ps_onnx_import_free(im);
        ps_onnx_free(om);
        free(m.p);
    }
    static const struct { const char *variant, *needle; } refused[] = {
        {"mask", "node '/attn/Transpose' (Transpose): nn.MultiheadAttention: the attention scores q k^T go to Add "
                 "before the Softmax: an attention mask"},
        {"weights", "node '/attn/Transpose' (Transpose): nn.MultiheadAttention: the attention weights (its "
                    "Softmax's output) are read outside it: need_weights=True"},
        {"scale", "node '/attn/Div' (Div): nn.MultiheadAttention: q divided by 3, not sqrt(D) = 2 for D 4"},
        {"order", "node '/attn/Slice' (Slice): nn.MultiheadAttention: the query is elements [8, 16) of axis 2 of "
                  "the in-projection, not [0, 8) of the last"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        buf m = mha_model(refused[k].variant);
        char what[64];
        snprintf(what, sizeof what, "mha %s", refused[k].variant);
        expect_refusal(what, &m, PS_ERR_UNIMPLEMENTED, refused[k].needle);
        free(m.p);
    }
}

/* vit's class token and positional embedding as PyTorch exports them: Expand of an initializer 'cls'
 * (1, 1, 4) to (2, 1, 4) (the batch), Concat with x (2, 3, 4) along the tokens, Add of 'enc.pos' (1, 4,
 * 4): Parameters that keep the initializers' names and shapes ('cls': `parameter: null`; 'enc.pos': node
 * 'enc', `parameter: pos`), computing what they should; an Expand to a first dimension other than the
 * batch refused. */
static void test_expand_param(void) {
    int64_t dx[3] = {2, 3, 4}, dy[3] = {2, 4, 4}, dc[3] = {1, 1, 4}, dp[3] = {1, 4, 4}, shp[3] = {2, 1, 4},
            bad3[3] = {3, 1, 4};
    float cls[4] = {0.5f, -1.0f, 2.0f, 0.25f}, pos[16];
    for (int i = 0; i < 16; i++) pos[i] = (float)i * 0.125f - 1.0f;
    const char *ex[2] = {"cls", "shp"}, *cat[2] = {"e", "x"}, *ad[2] = {"c", "enc.pos"};
    attr_spec ax = {"axis", 2, 0, 1, 0, {0}};
    for (int refuse = 0; refuse < 2; refuse++) {
        buf inits[3] = {tensor("cls", 3, dc, cls, 4), tensor_i64("shp", 3, refuse ? bad3 : shp),
                        tensor("enc.pos", 3, dp, pos, 16)};
        buf ns[3] = {node("/Expand", "Expand", 2, ex, "e", 0, NULL), node("/Concat", "Concat", 2, cat, "c", 1, &ax),
                     node("/encoder/Add", "Add", 2, ad, "y", 0, NULL)};
        buf vi = value_info("x", 3, dx), vo = value_info("y", 3, dy);
        buf m = model(13, ns, 3, inits, 3, &vi, &vo);
        if (refuse) {
            expect_refusal("an Expand to a first dimension other than the batch", &m, PS_ERR_UNIMPLEMENTED,
                           "node '/Expand' (Expand): Expand of 'cls' whose first dimension is not the batch");
            free(m.p);
            continue;
        }
        ps_err e = {0};
        ps_onnx_model *om;
        ps_onnx_import *im = import(&m, &e, &om);
        CHECK_MSG(im != NULL, "expand: %s", e.msg);
        if (im) {
            const char *y = ps_onnx_import_yaml(im, NULL);
            int ok = strstr(y, "{name: cls, kind: Parameter, shape: [1, 1, 4], expand: [1, 4], "
                               "parameter: null}") &&
                     strstr(y, "{name: enc, kind: Parameter, shape: [1, 4, 4], expand: [4, 4], parameter: pos}") &&
                     ps_onnx_import_num_values(im) == 2 && !strcmp(ps_onnx_import_value_name(im, 0), "cls") &&
                     !strcmp(ps_onnx_import_value_name(im, 1), "enc.pos");
            CHECK_MSG(ok, "expand: Parameters cls (parameter: null) and enc (parameter: pos): %s", y);
            ps_model *pm = ref_model_of(y, &e);
            float x[24], out[32], want[32];
            for (int i = 0; i < 24; i++) x[i] = cosf((float)i * 0.9f);
            for (int k = 0; k < 2 && pm; k++) {   /* the initializers as psd starts from them */
                float t[16];
                CHECK(ps_onnx_import_value(im, k, t, &e) == PS_OK);
                int p = ps_model_find_param(pm, ps_onnx_import_value_name(im, k));
                CHECK(p >= 0 && ps_model_set_param(pm, p, t, &e) == PS_OK);
            }
            for (int n = 0; n < 2; n++)
                for (int l = 0; l < 4; l++)
                    for (int c = 0; c < 4; c++)
                        want[(n * 4 + l) * 4 + c] = (l ? x[(n * 3 + l - 1) * 4 + c] : cls[c]) + pos[l * 4 + c];
            uint64_t ver;
            if (pm && ps_model_forward_range(pm, 0, 0, x, 2, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK)
                check_array("expand: [cls expanded, x] + enc.pos", out, want, 32, 0, 0);
            else if (pm)
                CHECK_MSG(0, "forward: %s", e.msg);
            if (ok) printf("ok: expand: class token and positional embedding as named Parameters\n");
            ps_model_free(pm);
        }
        ps_onnx_import_free(im);
        ps_onnx_free(om);
        free(m.p);
    }
}

/* nn.PReLU and nn.RReLU as PyTorch 1.13 exports them: PRelu(x, Unsqueeze(p.weight, [1])) over (N, 3, 4) is
 * node p of kind PReLU with 3 slopes bound to p.weight; PRelu(x, RandomUniformLike(x)) is RReLU with its low
 * and high; a RandomUniformLike read by anything else, and a slope over the last dim, refused. */
static void test_prelu_rrelu(void) {
    int64_t d[3] = {2, 3, 4}, three = 3, four = 4, ax[1] = {1};
    float w[4] = {0.1f, -0.2f, 0.3f, 0.4f};
    const char *uq[2] = {"p.weight", "axes"}, *pr[2] = {"x", "s"}, *ru[1] = {"x"}, *add[2] = {"x", "r"};
    buf vi, vo;   /* fresh for each model (model() takes them) */
#define IO() (vi = value_info("x", 3, d), vo = value_info("y", 3, d))
    {
        buf inits[2] = {tensor("p.weight", 1, &three, w, 3), tensor_i64("axes", 1, ax)};
        buf ns[2] = {node("/p/Unsqueeze", "Unsqueeze", 2, uq, "s", 0, NULL), node("/p/PRelu", "PRelu", 2, pr, "y", 0, NULL)};
        IO();
        buf m = model(13, ns, 2, inits, 2, &vi, &vo);
        char *y = yaml_of(&m);
        CHECK_MSG(strstr(y, "{name: p, kind: PReLU, num_parameters: 3}"), "prelu: %s", y);
        if (strstr(y, "{name: p, kind: PReLU, num_parameters: 3}")) printf("ok: PRelu of Unsqueeze(p.weight) is PReLU p\n");
        free(y);
        free(m.p);
    }
    {
        attr_spec a[2] = {{"low", 1, 0.1, 0, 0, {0}}, {"high", 1, 0.3, 0, 0, {0}}};
        buf ns[2] = {node("/RandomUniformLike", "RandomUniformLike", 1, ru, "s", 2, a),
                     node("/PRelu", "PRelu", 2, pr, "y", 0, NULL)};
        IO();
        buf m = model(13, ns, 2, NULL, 0, &vi, &vo);
        char *y = yaml_of(&m);
        const int ok = strstr(y, "kind: RReLU, lower: 0.1, upper: 0.3") != NULL;
        CHECK_MSG(ok, "rrelu: %s", y);
        if (ok) printf("ok: PRelu of RandomUniformLike(x) is RReLU(low, high)\n");
        free(y);
        free(m.p);
        buf ns2[2] = {node("/RandomUniformLike", "RandomUniformLike", 1, ru, "r", 2, a),
                      node("/Add", "Add", 2, add, "y", 0, NULL)};
        IO();
        m = model(13, ns2, 2, NULL, 0, &vi, &vo);
        expect_refusal("a RandomUniformLike added", &m, PS_ERR_UNIMPLEMENTED,
                       "RandomUniformLike other than nn.RReLU's");
        free(m.p);
    }
    {
        buf init = tensor("slope", 1, &four, w, 4);
        const char *pr2[2] = {"x", "slope"};
        buf n = node("/PRelu", "PRelu", 2, pr2, "y", 0, NULL);
        IO();
        buf m = model(13, &n, 1, &init, 1, &vi, &vo);
        expect_refusal("a PRelu slope over the last dim", &m, PS_ERR_UNIMPLEMENTED,
                       "psd's PReLU takes one slope or one per channel");
        free(m.p);
    }
#undef IO
}

/* The int lists ONNX moved from an attribute to an input (moved_ints):
 * Squeeze's axes as an attribute (opset 11) folding a constant, with 9
 * axes (one past psd's rank limit: the fold once read past its array),
 * is refused naming them. */
static void test_moved_ints(void) {
    int64_t c1[1] = {1}, dx[2] = {2, 3};
    buf init = tensor_i64("c", 1, c1);
    const char *sq_in[1] = {"c"}, *add_in[2] = {"x", "s"};
    attr_spec ax = {"axes", 7, 0, 0, 9, {0, 1, 2, 3, 4, 5, 6, 7, 8}};
    buf ns[2] = {node("/q/Squeeze", "Squeeze", 1, sq_in, "s", 1, &ax), node("/q/Add", "Add", 2, add_in, "y", 0, NULL)};
    buf vi = value_info("x", 2, dx), vo = value_info("y", 2, dx);
    buf m = model(11, ns, 2, &init, 1, &vi, &vo);
    expect_refusal("a Squeeze of 9 axes", &m, PS_ERR_UNIMPLEMENTED, "axes of more than 8 values");
    free(m.p);
}

/* ---- LSTM and GRU inside the graph: x (N, L, I) -> Transpose [1, 0, 2] -> one ONNX LSTM or GRU in
 * ONNX's own gate order (initializers W, R, B; no initial state) -> the exporter's join (Squeeze of the
 * direction axis, or bidirectional Transpose [0, 2, 1, 3] and Reshape [0, 0, -1]) -> Transpose back: one psd
 * node whose forward is ONNX's equations written out here (the gates' order, B = [Wb, Rb], the reverse
 * direction from the last step, GRU's linear_before_reset 1). ---- */

enum { RN = 2, RL = 3, RI = 2, RH = 2 };

static double sigm(double v) { return 1.0 / (1.0 + exp(-v)); }

static buf rnn_graph(int gru, int D, int lbr, const float *w, const float *r, const float *b) {
    const int G = gru ? 3 : 4;
    int64_t xd[3] = {RN, RL, RI}, yd[3] = {RN, RL, D * RH}, wd[3] = {D, G * RH, RI}, rd[3] = {D, G * RH, RH},
            bd[2] = {D, 2 * G * RH}, sq[1] = {1}, rs[3] = {0, 0, -1};
    buf nodes[6], inits[5];
    int nn = 0, ni = 0;
    attr_spec swap = {"perm", 7, 0, 0, 3, {1, 0, 2}, NULL}, dirs = {"perm", 7, 0, 0, 4, {0, 2, 1, 3}, NULL};
    attr_spec ra[3] = {{"hidden_size", 2, 0, RH, 0, {0}, NULL},
                       {"direction", 3, 0, 0, 0, {0}, D == 2 ? "bidirectional" : "forward"},
                       {"linear_before_reset", 2, 0, lbr, 0, {0}, NULL}};
    const char *t0[1] = {"x"}, *rin[4] = {"xt", "W", "R", "B"}, *j1[2] = {"y", "sq"}, *j2[1] = {"yt"},
               *j3[2] = {"ytt", "rs"}, *end[1] = {"yj"};
    nodes[nn++] = node("/rnn/Transpose", "Transpose", 1, t0, "xt", 1, &swap);
    nodes[nn++] = node(gru ? "/rnn/GRU" : "/rnn/LSTM", gru ? "GRU" : "LSTM", 4, rin, "y", gru ? 3 : 2, ra);
    if (D == 1) {
        nodes[nn++] = node("/rnn/Squeeze", "Squeeze", 2, j1, "yj", 0, NULL);
    } else {
        nodes[nn++] = node("/rnn/Transpose_1", "Transpose", 1, j1, "ytt", 1, &dirs);
        nodes[nn++] = node("/rnn/Reshape", "Reshape", 2, j3, "yj", 0, NULL);
    }
    (void)j2;
    nodes[nn++] = node("/rnn/Transpose_2", "Transpose", 1, end, "out", 1, &swap);
    inits[ni++] = tensor("W", 3, wd, w, D * G * RH * RI);
    inits[ni++] = tensor("R", 3, rd, r, D * G * RH * RH);
    inits[ni++] = tensor("B", 2, bd, b, D * 2 * G * RH);
    inits[ni++] = tensor_i64(D == 1 ? "sq" : "rs", D == 1 ? 1 : 3, D == 1 ? sq : rs);
    buf vi = value_info("x", 3, xd), vo = value_info("out", 3, yd);
    return model(13, nodes, nn, inits, ni, &vi, &vo);
}

static void rnn_case(int gru, int D) {
    const int G = gru ? 3 : 4;
    float w[2 * 4 * RH * RI], r[2 * 4 * RH * RH], b[2 * 8 * RH], x[RN * RL * RI], out[RN * RL * 2 * RH],
        want[RN * RL * 2 * RH], t[2 * 8 * RH * RI + 64];
    for (int i = 0; i < D * G * RH * RI; i++) w[i] = sinf((float)i * 0.7f + 0.2f) * 0.6f;
    for (int i = 0; i < D * G * RH * RH; i++) r[i] = cosf((float)i * 0.9f) * 0.5f;
    for (int i = 0; i < D * 2 * G * RH; i++) b[i] = sinf((float)i * 1.3f) * 0.4f;
    for (int i = 0; i < RN * RL * RI; i++) x[i] = cosf((float)i * 0.45f + 0.1f);
    /* ONNX's equations: gates LSTM i, o, f, c; GRU z, r, h; B = [Wb, Rb] per direction */
    for (int n = 0; n < RN; n++)
        for (int d = 0; d < D; d++) {
            double h[RH] = {0}, c[RH] = {0};
            for (int s = 0; s < RL; s++) {
                const int l = d ? RL - 1 - s : s;
                double gx[4 * RH], gh[4 * RH];
                for (int q = 0; q < G * RH; q++) {
                    gx[q] = b[d * 2 * G * RH + q];
                    gh[q] = b[d * 2 * G * RH + G * RH + q];
                    for (int k = 0; k < RI; k++) gx[q] += (double)w[(d * G * RH + q) * RI + k] * x[(n * RL + l) * RI + k];
                    for (int k = 0; k < RH; k++) gh[q] += (double)r[(d * G * RH + q) * RH + k] * h[k];
                }
                double hn[RH];
                for (int u = 0; u < RH; u++) {
                    if (gru) {
                        double z = sigm(gx[u] + gh[u]), rr = sigm(gx[RH + u] + gh[RH + u]);
                        double hh = tanh(gx[2 * RH + u] + rr * gh[2 * RH + u]);
                        hn[u] = (1 - z) * hh + z * h[u];
                    } else {
                        double ig = sigm(gx[u] + gh[u]), og = sigm(gx[RH + u] + gh[RH + u]);
                        double fg = sigm(gx[2 * RH + u] + gh[2 * RH + u]), cg = tanh(gx[3 * RH + u] + gh[3 * RH + u]);
                        c[u] = fg * c[u] + ig * cg;
                        hn[u] = og * tanh(c[u]);
                    }
                }
                for (int u = 0; u < RH; u++) {
                    h[u] = hn[u];
                    want[(n * RL + l) * D * RH + d * RH + u] = (float)hn[u];
                }
            }
        }
    char what[96];
    snprintf(what, sizeof what, "%s%s in the graph", D == 2 ? "bidirectional " : "", gru ? "GRU" : "LSTM");
    buf m = rnn_graph(gru, D, 1, w, r, b);
    ps_err e = {0};
    ps_onnx_model *om;
    ps_onnx_import *im = import(&m, &e, &om);
    CHECK_MSG(im != NULL, "%s: import: %s", what, e.msg);
    if (im) {
        const char *y = ps_onnx_import_yaml(im, NULL);
        char node_text[160];
        snprintf(node_text, sizeof node_text, "{name: rnn, kind: %s, input_size: %d, hidden_size: %d, batch_first: "
                 "true%s}", gru ? "GRU" : "LSTM", RI, RH, D == 2 ? ", bidirectional: true" : "");
        CHECK_MSG(strstr(y, node_text) && count_of(y, "kind:") == 1, "%s: one node %s: %s", what, node_text, y);
        ps_model *pm = ref_model_of(y, &e);
        int names = ps_onnx_import_num_values(im) == D * 4;
        for (int k = 0; pm && k < ps_onnx_import_num_values(im); k++) {
            CHECK(ps_onnx_import_value(im, k, t, &e) == PS_OK);
            int p = ps_model_find_param(pm, ps_onnx_import_value_name(im, k));
            names &= p >= 0;
            CHECK(p >= 0 && ps_model_set_param(pm, p, t, &e) == PS_OK);
        }
        CHECK_MSG(names, "%s: the parameters are PyTorch's rnn.weight_ih_l0 ... (%s ...)", what,
                  ps_onnx_import_value_name(im, 0));
        uint64_t ver;
        char w2[160];
        snprintf(w2, sizeof w2, "%s: psd's forward = ONNX's equations", what);
        if (pm && ps_model_forward_range(pm, 0, 0, x, RN, 0, NULL, 0, out, NULL, &ver, &e) == PS_OK) {
            int before = check_failed_;
            check_array(w2, out, want, RN * RL * D * RH, 1e-5, 1e-5);
            if (check_failed_ == before && names) printf("ok: %s\n", w2);
        } else
            CHECK_MSG(0, "%s: forward: %s", what, e.msg);
        ps_model_free(pm);
    }
    ps_onnx_import_free(im);
    ps_onnx_free(om);
    free(m.p);
}

static void test_graph_rnns(void) {
    rnn_case(0, 1);
    rnn_case(0, 2);
    rnn_case(1, 1);
    rnn_case(1, 2);
    float w[2 * 3 * RH * RI] = {0}, r[2 * 3 * RH * RH] = {0}, b[2 * 6 * RH] = {0};
    buf m = rnn_graph(1, 1, 0, w, r, b);
    expect_refusal("a GRU with linear_before_reset 0", &m, PS_ERR_UNIMPLEMENTED,
                   "node '/rnn/GRU' (GRU): nn.GRU: linear_before_reset 0");
    free(m.p);
}

int main(void) {
    test_graph_rnns();
    test_mha();
    test_expand_param();
    test_attention_pieces();
    test_refusals();
    test_concat_arity();
    test_shuffle_unit();
    test_elementwise();
    test_outputs_noise();
    test_softmax_opsets();
    test_attributes();
    test_old_opsets();
    test_moved_ints();
    test_prelu_rrelu();
    return check_summary("test_onnx_import");
}
