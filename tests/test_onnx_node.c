/* test_onnx_node.c - ONNX's own backend node tests through psd's ONNX
 * import (model.onnx) and an eval forward, against the outputs ONNX ships:
 * every test of Debian libonnx-testdata's data/node
 * (/usr/share/libonnx-testdata/data/node, or $ONNX_NODE_TESTS).
 *
 * For each test: model.onnx is imported with the first graph input as
 * psd's input and the others (test_data_set_0/input_<k>.pb) as constants
 * (initializers: weights, biases, the second operand of Add/Concat, a
 * Reshape's shape, a Gather's indices); the model is built on the dnnl
 * backend (and every test that passes there again on ref), the initial
 * weights loaded from the file, and one eval forward of input_0.pb is
 * compared with output_0.pb by numpy.allclose(rtol=1e-4, atol=1e-6) (a
 * graph of several outputs: with output_0.pb, output_1.pb, ... joined as
 * the import joins them, each flattened after the batch, in order).
 * A test is skipped only when the import refuses it as unsupported
 * (PS_ERR_UNIMPLEMENTED: an op, attribute or shape psd does not have),
 * printed with the reason; any other error fails. The tests of the ops
 * issue 19 lists must all run and pass (never skipped): Conv, MaxPool /
 * AveragePool (2-D default, pads, strides), GlobalAveragePool,
 * BatchNormalization (inference), Gemm (default, transB), Relu, LeakyRelu,
 * Sigmoid, Tanh, Softmax, LogSoftmax, Add, Concat, Flatten, Reshape,
 * Gather - their non-_expanded tests; and Clip (both bounds, a lower one
 * of 0) and HardSwish (its _expanded test is PyTorch's export below
 * opset 14, HardSigmoid then Mul), and MaxPool / AveragePool's ceil_mode
 * tests, Transpose (a Permute), Mul (by its second input, an initializer
 * here: a Scale) and MatMul (2-D: a Linear; 3-D and 4-D: psd's MatMul
 * kind), and the 1-D MaxPool and AveragePool tests (MaxPool1d, AvgPool1d);
 * Sub and Div (by an initializer: a Parameter, broadcast) and ReduceL2 /
 * ReduceSumSquare over some axes (norms as values).
 * ONNX's HardSigmoid tests use other
 * alpha and beta than PyTorch's and are skipped.
 */
#include "model.h"
#include "onnx.h"
#include "onnx_import.h"
#include "onnx_model.h"
#include "onnx_weights.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#define RTOL 1e-4
#define ATOL 1e-6

static const char *const required_prefixes[] = {
    "test_conv_", "test_maxpool_2d_default", "test_maxpool_2d_pads", "test_maxpool_2d_strides",
    "test_averagepool_2d_default", "test_averagepool_2d_pads", "test_averagepool_2d_strides",
    "test_globalaveragepool", "test_batchnorm_epsilon", "test_batchnorm_example", "test_gemm_default_",
    "test_gemm_transposeB", "test_relu", "test_leakyrelu", "test_sigmoid", "test_tanh", "test_softmax_",
    "test_logsoftmax_", "test_add", "test_concat_", "test_flatten_", "test_reshape_", "test_gather_",
    /* mobilenet_v2/v3's (ReLU6 and Hardtanh export as Clip) */
    "test_clip", "test_hardswish",
    /* squeezenet's and googlenet's */
    "test_maxpool_2d_ceil", "test_averagepool_2d_ceil",
    /* convnext's permutes (Permute; those moving dim 0 read the whole input as one sample) and its layer
     * scale (a Mul by an initializer: Scale; the tests' second input is one) */
    "test_transpose_", "test_mul",
    /* shufflenet's x.chunk: a Slice along one axis (clamped ends, a negative end); Slices of several axes
     * (swin's x[..., 0::2, 1::2, :] has steps) and a constant Pad (swin's padding to its window) */
    "test_slice", "test_constant_pad",
    /* attention written by hand: MatMul (2-D: a Linear by the initializer; 3-D and 4-D: psd's MatMul of the
     * input and a Parameter) */
    "test_matmul_",
    /* several graph outputs, joined into psd's one (each flattened after the batch, in order): Split's 2-D tests */
    "test_split_equal_parts_2d", "test_split_variable_parts_2d",
    /* the 1-d kinds (MaxPool1d, AvgPool1d over (N, C, L)) */
    "test_maxpool_1d_default", "test_averagepool_1d_default",
    /* a text classifier's mean over the tokens: ReduceMean over adjacent axes (over all axes: no axis left) */
    "test_reduce_mean_do_not_keepdims", "test_reduce_mean_keepdims", "test_reduce_mean_negative_axes_keepdims",
    /* decoders and U-Nets: ConvTranspose (2-D, pads, dilations), Resize linear (half_pixel, align_corners) */
    "test_convtranspose", "test_resize_upsample_scales_linear", "test_resize_downsample_scales_linear",
    /* elementwise math (users' own layers; Pow and Sub take numbers or computed values, the tests' second
     * input is an initializer) */
    "test_abs", "test_elu", "test_exp", "test_log", "test_neg", "test_reciprocal", "test_selu_default",
    "test_softplus", "test_sqrt",
    /* sin / cos (sinusoidal features; not sinh and cosh: a name matches up to an '_') */
    "test_sin", "test_cos", "test_erf", "test_sign", "test_depthtospace_", "test_spacetodepth",
    /* nn.InstanceNorm1d / 2d (scale and bias: initializers) */
    "test_instancenorm_",
    /* ReduceSum over adjacent axes (the mean times the count) */
    "test_reduce_sum_do_not_keepdims", "test_reduce_sum_keepdims", "test_reduce_sum_negative_axes_keepdims_example",
    /* global max pooling (adaptive_max_pool2d to 1) */
    "test_globalmaxpool",
    /* shrinks and thresholds (nn.CELU, nn.Softsign, Shrink as Hardshrink / Softshrink, ThresholdedRelu as
     * Threshold(alpha, 0)); ONNX's PRelu tests broadcast slopes over (4, 5) or the last dim, not nn.PReLU's
     * one or per-channel slopes: skipped */
    "test_celu", "test_softsign", "test_shrink_", "test_thresholdedrelu",
    /* max and min over adjacent axes (torch.max(h, dim=1)'s values, torch.amin; over all axes: the batch's too) */
    "test_reduce_max_do_not_keepdims", "test_reduce_max_keepdims", "test_reduce_max_negative_axes_keepdims",
    "test_reduce_min_do_not_keepdims", "test_reduce_min_keepdims", "test_reduce_min_negative_axes_keepdims",
    /* numpy broadcasting (Sub and Div of a computed value and an initializer: a Parameter), and norms as
     * values (x.norm(dim=1, keepdim=True) exports as ReduceL2; over all axes: no axis left per sample) */
    "test_sub", "test_div", "test_reduce_l2_do_not_keepdims", "test_reduce_l2_keep_dims",
    "test_reduce_l2_negative_axes_keep_dims", "test_reduce_sum_square_do_not_keepdims",
    "test_reduce_sum_square_keepdims", "test_reduce_sum_square_negative_axes_keepdims",
    /* spatial transformers: GridSample (bilinear and nearest, each padding mode, align_corners) */
    "test_gridsample",
    NULL};

/* Tests those prefixes match that are other ops or variants issue 19 does not list. */
static const char *const not_required[] = {
    "test_convinteger", "test_batchnorm_epsilon_training_mode",
    /* ConvTranspose 1-D and 3-D, auto_pad SAME, output_shape (psd's size is output_padding's); Resize linear
     * with align_corners by a scale whose output size is not in * scale (ONNX's rule there is not PyTorch's) */
    "test_convtranspose_1d", "test_convtranspose_3d", "test_convtranspose_autopad_same",
    "test_convtranspose_kernel_shape", "test_convtranspose_output_shape", "test_convtranspose_with_kernel",
    "test_resize_downsample_scales_linear_align_corners",
    "test_batchnorm_example_training_mode", "test_add_uint8", "test_gather_elements", "test_gathernd",
    "test_averagepool_2d_pads_count_include_pad", "test_reshape_allowzero",
    /* int8; no bounds (the graph output is its input) */
    "test_clip_default_int8", "test_clip_default_inbounds", "test_mul_uint8",
    /* a Slice with step -1; an empty one (psd's tensors are not empty) */
    "test_slice_neg_steps", "test_slice_start_out_of_bounds",
    /* uint8 */
    "test_sub_uint8", "test_div_uint8",
    /* GridSample's bicubic mode */
    "test_gridsample_bicubic", NULL};

static int required(const char *name) {
    if (strstr(name, "_expanded")) return 0;
    for (const char *const *p = not_required; *p; p++)
        if (!strncmp(name, *p, strlen(*p))) return 0;
    for (const char *const *p = required_prefixes; *p; p++) {
        size_t n = strlen(*p);
        if (!strncmp(name, *p, n) && (p[0][n - 1] == '_' || !name[n] || name[n] == '_')) return 1;
    }
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

typedef struct loaded {
    ps_onnx_file *f;
    ps_onnx_tensor *t;
} loaded;

static int load_pb(const char *path, loaded *l, char *why, size_t cap) {
    ps_err e = {0};
    memset(l, 0, sizeof *l);
    if (!(l->f = ps_onnx_map_file(path, &e)) || !(l->t = ps_onnx_parse_tensor(l->f->data, l->f->len, path, &e))) {
        snprintf(why, cap, "%s", e.msg);
        ps_onnx_unmap(l->f);
        l->f = NULL;
        return -1;
    }
    return 0;
}

static void free_pb(loaded *l) {
    ps_onnx_free_tensor(l->t);
    ps_onnx_unmap(l->f);
}

enum { T_OK, T_SKIP, T_FAIL };

/* One backend: build, load weights, forward, compare. */
/* want[nwant]: the graph's outputs, which psd's import joins into its one (each flattened after the batch, in
 * order): compared joined the same way. */
static int run_backend(const char *dir, const char *yaml_path, const ps_onnx_import *im, const char *backend,
                       const ps_onnx_tensor *x, ps_onnx_tensor *const *want, int nwant, char *why, size_t cap) {
    ps_err e = {0};
    ps_model_opts mo = {0};
    mo.file = yaml_path;
    mo.cpu_backend = backend;
    mo.seed = 1;
    mo.compute_threads = 1;
    mo.lr = 0.1f;
    ps_model *m = ps_model_create(&mo, &e);
    if (!m) { snprintf(cap ? why : why, cap, "build (%s): %s", backend, e.msg); return T_FAIL; }
    int rc = T_FAIL;
    float *out = NULL;
    void *xin = NULL;
    if (ps_onnx_import_weights(m, im, dir, &e)) { snprintf(why, cap, "weights: %s", e.msg); goto done; }
    const ps_stage_info *si = ps_model_stage(m, 0);
    int64_t per = 1;
    for (int d = 0; d < si->in_ndim; d++) per *= si->in_dims[d];
    int64_t n = per ? x->numel / per : 0;
    if (n < 1 || n * per != x->numel) {
        snprintf(why, cap, "input of %lld values is not a whole number of samples of %lld", (long long)x->numel,
                 (long long)per);
        goto done;
    }
    int64_t outper = 1, total = 0;
    for (int d = 0; d < si->out_ndim; d++) outper *= si->out_dims[d];
    for (int k = 0; k < nwant; k++) {
        if (want[k]->numel % n) {
            snprintf(why, cap, "output %d's %lld values are not %lld samples'", k, (long long)want[k]->numel,
                     (long long)n);
            goto done;
        }
        total += want[k]->numel;
    }
    if (outper * n != total) {
        snprintf(why, cap, "psd computes %lld values, ONNX's output%s %lld", (long long)(outper * n),
                 nwant > 1 ? "s have" : " has", (long long)total);
        goto done;
    }
    xin = malloc((size_t)x->numel * 8 + 8);
    out = malloc((size_t)total * sizeof(float) + 4);
    float *wantf = malloc((size_t)total * sizeof(float) + 4), *part = malloc((size_t)total * sizeof(float) + 4);
    if (!xin || !out || !wantf || !part) { free(wantf); free(part); snprintf(why, cap, "out of memory"); goto done; }
    ps_status st = si->in_dtype == PS_DTYPE_I64 ? ps_onnx_tensor_int64s(x, xin, &e) : ps_onnx_tensor_floats(x, xin, &e);
    for (int k = 0, at = 0; k < nwant && !st; k++) {   /* sample i's values: each output's part i, in order */
        const int64_t pk = want[k]->numel / n;
        if (!(st = ps_onnx_tensor_floats(want[k], part, &e)))
            for (int64_t i = 0; i < n; i++) memcpy(wantf + i * outper + at, part + i * pk, (size_t)pk * sizeof(float));
        at += (int)pk;
    }
    free(part);
    if (st) { free(wantf); snprintf(why, cap, "%s", e.msg); goto done; }
    uint64_t ver;
    if (ps_model_forward_range(m, 0, 0, xin, (int)n, 0, NULL, 0, out, NULL, &ver, &e)) {
        free(wantf);
        snprintf(why, cap, "forward (%s): %s", backend, e.msg);
        goto done;
    }
    int64_t bad = -1;
    double worst = 0;
    for (int64_t i = 0; i < total; i++) {
        double d = fabs((double)out[i] - wantf[i]), tol = ATOL + RTOL * fabs((double)wantf[i]);
        if (!(d <= tol) && (isnan(out[i]) != isnan(wantf[i]) || !isnan(wantf[i]))) {
            if (bad < 0 || d - tol > worst) { bad = i; worst = d - tol; }
        }
    }
    if (bad >= 0) {
        snprintf(why, cap, "%s: element %lld is %.9g, ONNX's %.9g (allclose rtol %g atol %g)", backend,
                 (long long)bad, out[bad], wantf[bad], RTOL, ATOL);
    } else {
        rc = T_OK;
    }
    free(wantf);
done:
    free(out);
    free(xin);
    ps_model_free(m);
    return rc;
}

static int run_test(const char *root, const char *name, char *why, size_t cap) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    snprintf(path, sizeof path, "%s/model.onnx", dir);
    ps_err e = {0};
    ps_onnx_file *mf = ps_onnx_map_file(path, &e);
    if (!mf) { snprintf(why, cap, "%s", e.msg); return T_FAIL; }
    ps_onnx_model *om = ps_onnx_parse(mf->data, mf->len, path, &e);
    int rc = T_FAIL;
    loaded ins[16], outp[16];
    int nins = 0, nout = 0;
    ps_onnx_import *im = NULL;
    char yaml_path[64] = "";
    memset(ins, 0, sizeof ins);
    if (!om) { snprintf(why, cap, "%s", e.msg); goto done; }
    /* graph inputs that are not initializers, in order: the first is psd's, the rest constants
     * (those that are not numeric tensors are not read: the import refuses them) */
    const ps_onnx_tensor *feeds[16];
    ps_onnx_tensor named[16];
    int nfeeds = 0, k = 0;
    for (int i = 0; i < om->ninputs && nins < 16; i++) {
        int is_init = 0;
        for (int j = 0; j < om->ninits; j++) is_init |= !strcmp(om->inits[j].name, om->inputs[i].name);
        if (is_init) continue;
        int t = om->inputs[i].elem_type;
        int numeric = t && ps_onnx_dtype_size(t) && t != PS_ONNX_BOOL;
        snprintf(path, sizeof path, "%s/test_data_set_0/input_%d.pb", dir, k);
        if (numeric && !access(path, R_OK)) {
            if (load_pb(path, &ins[nins], why, cap)) goto done;
            if (k > 0) {
                named[nfeeds] = *ins[nins].t;
                named[nfeeds].name = om->inputs[i].name;
                feeds[nfeeds] = &named[nfeeds];
                nfeeds++;
            }
            nins++;
        }
        k++;
    }
    ps_onnx_import_opts io = {PS_ONNX_BATCH_AUTO, "node_test", nfeeds, feeds};
    im = ps_onnx_import_model(om, name, &io, &e);
    if (!im) {
        snprintf(why, cap, "%s", e.msg);
        rc = e.code == PS_ERR_UNIMPLEMENTED ? T_SKIP : T_FAIL;
        goto done;
    }
    if (nins < 1) { snprintf(why, cap, "the import took a graph without a numeric input"); goto done; }
    ps_onnx_tensor *wants[16];
    for (; nout < om->noutputs && nout < 16; nout++) {
        snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", dir, nout);
        if (load_pb(path, &outp[nout], why, cap)) goto done;
        wants[nout] = outp[nout].t;
    }
    snprintf(yaml_path, sizeof yaml_path, "/tmp/test_onnx_node.%d.yaml", (int)getpid());
    FILE *f = fopen(yaml_path, "w");
    size_t len;
    const char *text = ps_onnx_import_yaml(im, &len);
    if (!f || fwrite(text, 1, len, f) != len) { snprintf(why, cap, "cannot write %s", yaml_path); if (f) fclose(f); goto done; }
    fclose(f);
    rc = run_backend(dir, yaml_path, im, "dnnl", ins[0].t, wants, nout, why, cap);
    if (rc == T_OK) rc = run_backend(dir, yaml_path, im, "ref", ins[0].t, wants, nout, why, cap);
    if (rc != T_OK && getenv("ONNX_NODE_VERBOSE")) fprintf(stderr, "--- %s\n%s", name, text);
done:
    if (yaml_path[0]) unlink(yaml_path);
    ps_onnx_import_free(im);
    for (int i = 0; i < nins; i++) free_pb(&ins[i]);
    for (int i = 0; i < nout; i++) free_pb(&outp[i]);
    ps_onnx_free(om);
    ps_onnx_unmap(mf);
    return rc;
}

int main(void) {
    const char *root = getenv("ONNX_NODE_TESTS");
    if (!root) root = "/usr/share/libonnx-testdata/data/node";
    DIR *d = opendir(root);
    if (!d) {
        printf("skipped: %s not found (Debian's libonnx-testdata: scripts/install-deps.sh)\n", root);
        return 77;
    }
    char **names = NULL;
    int n = 0, cap = 0;
    for (struct dirent *de; (de = readdir(d));) {
        if (strncmp(de->d_name, "test_", 5)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            names = realloc(names, (size_t)cap * sizeof *names);
            if (!names) return 1;
        }
        names[n++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    const char *only = getenv("ONNX_NODE_ONLY");
    int ok = 0, skip = 0, fail = 0, req = 0, req_ok = 0;
    for (int i = 0; i < n; i++) {
        if (only && !strstr(names[i], only)) continue;
        char why[PS_ERR_MSG_MAX + 256] = "";
        int r = run_test(root, names[i], why, sizeof why);
        int must = required(names[i]);
        req += must;
        if (r == T_OK) {
            ok++;
            req_ok += must;
            printf("ok       %s\n", names[i]);
        } else if (r == T_SKIP) {
            skip++;
            printf("skipped  %s: %s\n", names[i], why);
            CHECK_MSG(!must, "%s is one of issue 19's ops and must run, but psd refuses it: %s", names[i], why);
        } else {
            fail++;
            printf("FAIL     %s: %s\n", names[i], why);
            CHECK_MSG(0, "%s: %s", names[i], why);
        }
        free(names[i]);
    }
    free(names);
    printf("onnx node tests: %d ran and passed, %d skipped as unsupported, %d failed; %d of the %d required ran and "
           "passed\n", ok, skip, fail, req_ok, req);
    CHECK(only || req >= 60);
    return check_summary("test_onnx_node");
}
