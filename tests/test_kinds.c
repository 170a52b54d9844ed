/* test_kinds.c - every layer kind of model files, through the executor,
 * against PyTorch autograd: tests/golden/kinds.safetensors, written by
 * scripts/gen_golden_kinds.py (committed; this test does not need
 * PyTorch). Each case is a model file (kinds over their attribute
 * combinations, and a DAG with fan-out, a residual Add and Concat on 16
 * channels, so dnnl runs it in blocked layouts); for the ref and dnnl
 * backends:
 *
 *  - the model's parameters and buffers are exactly the PyTorch module's
 *    state_dict entries (names, shapes, dtypes);
 *  - a training forward (stored dropout masks): the output, the input
 *    gradient and every parameter gradient of its backward;
 *  - BatchNorm cases: a second training forward, backwarded into another
 *    accumulator that is then added to the first (its statistics come
 *    first in that accumulator, so the fold must order by sequence number);
 *  - one SGD step on the summed gradients: every parameter, and every
 *    buffer (running_mean, running_var, num_batches_tracked) folded as
 *    PyTorch does, in order;
 *  - an eval forward after the step (running statistics, no dropout);
 *  - on dnnl, no primitive created on a oneDNN reference kernel where the
 *    backend allows none (ps_backend_fallbacks: MatMul's matmul among them);
 *  - the bn_relu* cases: dnnl folds each ReLU (ReLU6, Hardtanh(0, max),
 *    LeakyReLU) into its BatchNorm (the activation a view, exec.c
 *    fuse_bn_relu) except where another node reads the BatchNorm's output
 *    or the activation is not ReLU-shaped (Hardtanh(-1, 1)); ref never
 *    does (the other cases' BatchNorm + ReLU pairs, conv1d_net's and
 *    dag's, fold too).
 * And the same on the cuda backend (the case's stage placed on cuda:0, a
 * looser tolerance for the device's summation order) where this binary
 * has CUDA and the machine a device; otherwise that part prints skipped.
 */
#include "backend.h"
#include "model.h"
#include "modeldef.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "support/isa_child.h"
#include "support/tmpdir.h"

#define ATOL 2e-5
#define RTOL 2e-4
#define ATOL_CUDA 1e-4
#define RTOL_CUDA 1e-3

static double g_atol = ATOL, g_rtol = RTOL;

static char g_dir[256];

static const ps_st_tensor *get(const ps_st_file *g, const char *c, const char *what) {
    char name[2 * PS_ST_NAME_MAX];
    snprintf(name, sizeof name, "%s.%s", c, what);
    return ps_st_find(g, name);
}

static void compare(const char *label, const char *what, const float *got, const ps_st_tensor *want, int64_t n) {
    char w[256];
    snprintf(w, sizeof w, "%s %s", label, what);
    CHECK_MSG(want && want->dtype == PS_ST_F32 && ps_st_numel(want) == n, "%s: golden missing or of another size", w);
    if (want && want->dtype == PS_ST_F32 && ps_st_numel(want) == n) check_array(w, got, want->data, (size_t)n, g_atol, g_rtol);
}

/* The state_dict entries of the golden (init.* and initbuf.*) are exactly the model's. */
static void check_names(const char *label, const ps_st_file *g, const char *c, ps_model *m) {
    char pre1[160], pre2[160];
    snprintf(pre1, sizeof pre1, "%s.init.", c);
    snprintf(pre2, sizeof pre2, "%s.initbuf.", c);
    int np = 0, nb = 0;
    for (size_t k = 0; k < ps_st_count(g); k++) {
        const ps_st_tensor *t = ps_st_get(g, k);
        int isp = !strncmp(t->name, pre1, strlen(pre1)), isb = !strncmp(t->name, pre2, strlen(pre2));
        if (!isp && !isb) continue;
        const char *name = t->name + strlen(isp ? pre1 : pre2);
        int i = isp ? ps_model_find_param(m, name) : ps_model_find_buffer(m, name);
        CHECK_MSG(i >= 0, "%s: the model has no %s '%s'", label, isp ? "parameter" : "buffer", name);
        if (i < 0) continue;
        int ndim = isp ? ps_model_param(m, i)->ndim : ps_model_buffer(m, i)->ndim;
        const int64_t *dims = isp ? ps_model_param(m, i)->dims : ps_model_buffer(m, i)->dims;
        int same = ndim == t->ndim;
        for (int d = 0; same && d < ndim; d++) same = dims[d] == t->dims[d];
        CHECK_MSG(same, "%s: %s has another shape than PyTorch's", label, name);
        if (!isp) {
            int i64 = ps_model_buffer(m, i)->dtype == PS_DTYPE_I64;
            CHECK_MSG(i64 == (t->dtype == PS_ST_I64), "%s: %s has another dtype than PyTorch's", label, name);
        }
        np += isp;
        nb += isb;
    }
    CHECK_MSG(np == ps_model_num_params(m) && nb == ps_model_num_buffers(m),
              "%s: %d/%d parameters, %d/%d buffers in the golden state_dict", label, np, ps_model_num_params(m), nb,
              ps_model_num_buffers(m));
}

/* The dropout masks of forward f (".mask<k>.<f>"), NULL when the case has none. */
static const float **masks_of(const ps_st_file *g, const char *c, int f, int *n) {
    static const float *mk[16];
    *n = 0;
    for (int k = 0; k < 16; k++) {
        char what[32];
        snprintf(what, sizeof what, "mask%d.%d", k, f);
        const ps_st_tensor *t = get(g, c, what);
        if (!t) break;
        mk[(*n)++] = t->data;
    }
    return *n ? mk : NULL;
}

static void run_case(const ps_st_file *g, const char *c, const char *backend) {
    char label[160];
    snprintf(label, sizeof label, "%s %s", backend, c);
    char key[160];
    snprintf(key, sizeof key, "%s.yaml", c);
    const char *text = ps_st_metadata(g, key);
    snprintf(key, sizeof key, "%s.forwards", c);
    const char *fw = ps_st_metadata(g, key);
    CHECK_MSG(text && fw, "%s: metadata missing", label);
    if (!text || !fw) return;
    int forwards = atoi(fw);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.yaml", g_dir, c);
    FILE *f = fopen(path, "w");
    if (!f) { CHECK_MSG(0, "cannot write %s", path); return; }
    fputs(text, f);
    fclose(f);
    ps_err err = {0};
    ps_model_opts o = {.file = path, .cpu_backend = backend, .seed = 1, .compute_threads = 2, .lr = 0.1f};
    ps_model_def *def = NULL;
    if (!strcmp(backend, "cuda")) {   /* the case's one stage on the device */
        def = ps_model_def_load_file(path, &err);
        CHECK_MSG(def && def->nstages == 1, "%s: %s", label, def ? "not one stage" : err.msg);
        if (!def || def->nstages != 1) { ps_model_def_free(def); return; }
        o.cpu_backend = "ref";
        o.n_placement = 1;
        o.placement_stage[0] = def->stages[0].name;
        o.placement_device[0] = "cuda:0";
    }
    ps_model *m = ps_model_create(&o, &err);
    ps_model_def_free(def);
    CHECK_MSG(m, "%s: %s", label, err.msg);
    if (!m) return;
    check_names(label, g, c, m);
    if (!strncmp(c, "bn_relu", 7)) {   /* dnnl folds the activation into the BatchNorm, unless another node reads
                                          the BatchNorm's output or the activation is not ReLU-shaped */
        int want = !strcmp(backend, "dnnl") && !strstr(c, "shared") && !strstr(c, "nofold");
        CHECK_MSG(ps_model_stage(m, 0)->fused_bn_relu == want, "%s: %d BatchNorm + ReLU pairs fused, want %d", label,
                  ps_model_stage(m, 0)->fused_bn_relu, want);
    }
    for (int i = 0; i < ps_model_num_params(m); i++) {
        char what[160];
        snprintf(what, sizeof what, "init.%s", ps_model_param(m, i)->name);
        const ps_st_tensor *t = get(g, c, what);
        const ps_param_info *pi = ps_model_param(m, i);
        if (t && t->dtype == PS_ST_F32 && ps_st_numel(t) == pi->numel && pi->ndim == 2 && pi->dims[0] > 1) {
            /* a row PyTorch's module builds as exact zeros among drawn ones (an Embedding's padding_idx) is
             * zeros in psd's own initial values too */
            float *mine = malloc((size_t)pi->numel * sizeof *mine);
            CHECK(mine && ps_model_get_param(m, i, mine, &err) == PS_OK);
            for (int64_t r = 0; mine && r < pi->dims[0]; r++) {
                const float *want = (const float *)t->data + r * pi->dims[1];
                int zero = 1, mine_zero = 1;
                for (int64_t k = 0; k < pi->dims[1]; k++) {
                    zero &= want[k] == 0.0f;
                    mine_zero &= mine[r * pi->dims[1] + k] == 0.0f;
                }
                if (zero && !mine_zero && pi->dims[1] > 1)
                    CHECK_MSG(0, "%s: %s: row %lld is zeros in PyTorch's initial values but not in psd's", label,
                              pi->name, (long long)r);
            }
            free(mine);
        }
        if (t && t->dtype == PS_ST_F32 && ps_st_numel(t) == ps_model_param(m, i)->numel)
            CHECK_MSG(ps_model_set_param(m, i, t->data, &err) == PS_OK, "%s", err.msg);
    }
    for (int i = 0; i < ps_model_num_buffers(m); i++) {
        char what[160];
        const ps_buffer_info *b = ps_model_buffer(m, i);
        snprintf(what, sizeof what, "ownbuf.%s", b->name);
        const ps_st_tensor *own = get(g, c, what);
        if (own && b->dtype == PS_DTYPE_I64 && own->dtype == PS_ST_I64 && ps_st_numel(own) == b->numel) {
            /* int64 buffers as the module builds them (swin's relative_position_index; BatchNorm's count, which
             * the golden's building forward moved, is not stored): psd's own initial values are PyTorch's */
            int64_t *mine = malloc((size_t)b->numel * sizeof *mine), bad = 0;
            CHECK(mine && ps_model_get_buffer(m, i, mine, &err) == PS_OK);
            for (int64_t k = 0; mine && k < b->numel; k++) bad += mine[k] != ((const int64_t *)own->data)[k];
            CHECK_MSG(bad == 0, "%s: %s: %lld of %lld initial values are not PyTorch's", label, b->name,
                      (long long)bad, (long long)b->numel);
            free(mine);
        }
        snprintf(what, sizeof what, "initbuf.%s", b->name);
        const ps_st_tensor *t = get(g, c, what);
        if (t && ps_st_numel(t) == b->numel)
            CHECK_MSG(ps_model_set_buffer(m, i, t->data, &err) == PS_OK, "%s", err.msg);
    }
    const ps_st_tensor *x1 = get(g, c, "x1"), *go1 = get(g, c, "go1"), *xe = get(g, c, "xe");
    CHECK_MSG(x1 && go1 && xe, "%s: golden inputs missing", label);
    if (!x1 || !go1 || !xe) { ps_model_free(m); return; }
    int n = (int)x1->dims[0];
    int64_t in_k = ps_st_numel(x1) / n, out_k = ps_st_numel(go1) / n;
    int fin = x1->dtype == PS_ST_F32;
    /* the shapes first: a model whose output is not PyTorch's size would write past `out` */
    const ps_stage_info *si = ps_model_stage(m, 0);
    int64_t mine_k = 1;
    for (int d = 0; si && d < si->out_ndim; d++) mine_k *= si->out_dims[d];
    CHECK_MSG(si && mine_k == out_k, "%s: per-sample output of %lld elements, PyTorch's %lld", label,
              (long long)mine_k, (long long)out_k);
    if (!si || mine_k != out_k) { ps_model_free(m); return; }
    float *out = malloc((size_t)(n * out_k) * sizeof(float)), *gin = malloc((size_t)(n * in_k) * sizeof(float));
    ps_tape *t1 = NULL, *t2 = NULL;
    ps_grads *acc = ps_grads_create(m, &err), *acc2 = NULL;
    int nm;
    const float **mk = masks_of(g, c, 1, &nm);
    CHECK_MSG(ps_model_forward_range(m, 0, 0, x1->data, n, 1, mk, 0, out, &t1, NULL, &err) == PS_OK, "%s: %s",
              label, err.msg);
    if (t1 && acc) {
        ps_tape_set_key(t1, 7, 1);
        compare(label, "output", out, get(g, c, "out1"), n * out_k);
        CHECK_MSG(ps_model_backward_acc(m, t1, go1->data, fin ? gin : NULL, acc, &err) == PS_OK, "%s: %s", label,
                  err.msg);
        if (fin) compare(label, "grad_input", gin, get(g, c, "grad_input"), n * in_k);
        for (int i = 0; i < ps_model_num_params(m); i++) {
            const ps_param_info *p = ps_model_param(m, i);
            float *gr = malloc((size_t)p->numel * sizeof(float));
            char what[160];
            snprintf(what, sizeof what, "grad.%s", p->name);
            CHECK(ps_grads_get(m, acc, i, gr, &err) == PS_OK);
            compare(label, what, gr, get(g, c, what), p->numel);
            free(gr);
        }
    }
    ps_grads *step_with = acc;
    if (forwards == 2 && acc) {
        const ps_st_tensor *x2 = get(g, c, "x2"), *go2 = get(g, c, "go2");
        mk = masks_of(g, c, 2, &nm);
        acc2 = ps_grads_create(m, &err);
        CHECK(x2 && go2 && acc2);
        if (x2 && go2 && acc2 &&
            ps_model_forward_range(m, 0, 0, x2->data, n, 1, mk, 0, NULL, &t2, NULL, &err) == PS_OK) {
            ps_tape_set_key(t2, 7, 2);
            CHECK_MSG(ps_model_backward_acc(m, t2, go2->data, NULL, acc2, &err) == PS_OK, "%s: %s", label, err.msg);
            CHECK(ps_grads_add(m, acc2, acc, &err) == PS_OK);   /* forward 2's statistics first */
            step_with = acc2;
        } else {
            CHECK_MSG(0, "%s: second forward: %s", label, err.msg);
        }
    }
    if (step_with && (ps_model_num_params(m) || ps_model_num_buffers(m))) {
        uint64_t v = 0;
        CHECK_MSG(ps_model_step_grads(m, step_with, &v, &err) == PS_OK && v == 1, "%s: step: %s", label, err.msg);
    }
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        float *w = malloc((size_t)p->numel * sizeof(float));
        char what[160];
        snprintf(what, sizeof what, "final.%s", p->name);
        CHECK(ps_model_get_param(m, i, w, &err) == PS_OK);
        compare(label, what, w, get(g, c, what), p->numel);
        free(w);
    }
    for (int i = 0; i < ps_model_num_buffers(m); i++) {
        const ps_buffer_info *b = ps_model_buffer(m, i);
        char what[160];
        snprintf(what, sizeof what, "buf.%s", b->name);
        const ps_st_tensor *want = get(g, c, what);
        if (b->dtype == PS_DTYPE_I64) {
            int64_t *got = calloc((size_t)b->numel, sizeof *got), k = 0;
            CHECK(got && ps_model_get_buffer(m, i, got, &err) == PS_OK);
            int ok = got && want && want->dtype == PS_ST_I64 && ps_st_numel(want) == b->numel;
            while (ok && k < b->numel && got[k] == ((const int64_t *)want->data)[k]) k++;
            CHECK_MSG(ok && k == b->numel, "%s: %s[%lld] is %lld, PyTorch's %lld", label, b->name, (long long)k,
                      got && k < b->numel ? (long long)got[k] : -1LL,
                      ok && k < b->numel ? (long long)((const int64_t *)want->data)[k] : -1LL);
            free(got);
        } else {
            float *v = malloc((size_t)b->numel * sizeof(float));
            CHECK(ps_model_get_buffer(m, i, v, &err) == PS_OK);
            compare(label, what, v, want, b->numel);
            free(v);
        }
    }
    CHECK_MSG(ps_model_forward_range(m, 0, 0, xe->data, n, 0, NULL, 0, out, NULL, NULL, &err) == PS_OK, "%s: %s",
              label, err.msg);
    compare(label, "eval output", out, get(g, c, "eval_out"), n * out_k);
    if (!strcmp(backend, "dnnl")) {   /* no oneDNN reference kernel where backend_dnnl.c allows none */
        char fb[1024] = "";
        int nf = ps_backend_fallbacks(ps_model_stage_backend(m, 0), fb, sizeof fb);
        CHECK_MSG(nf == 0, "%s: %d primitives on a reference kernel:\n%s", label, nf, fb);
    }
    ps_grads_free(acc);
    ps_grads_free(acc2);
    ps_tape_free(t1);
    ps_tape_free(t2);
    free(out);
    free(gin);
    ps_model_free(m);
}

/* The dnnl backend again with oneDNN capped to SSE4.1, in a child
 * (oneDNN fixes its ISA at first use): there the weight gradients of
 * stride-1 convolutions run as forward convolutions and the data
 * gradients too (backend_dnnl.c), paths the host's ISA never takes. */
static void sse41_child(const char *self) {
    if (!strstr(ps_backend_cpu_isa(), "avx") && strcmp(ps_backend_cpu_isa(), "sse41")) {
        printf("dnnl SSE41: skipped: not an x86-64 oneDNN (%s)\n", ps_backend_cpu_isa());
        return;
    }
    char *const args[] = {(char *)self, "--sse41", NULL};
    check_isa_child("test_kinds' dnnl cases", "SSE41", args);
}

int main(int argc, char **argv) {
    ps_err err = {0};
    const int sse41 = argc == 2 && !strcmp(argv[1], "--sse41");
    if (sse41) CHECK_MSG(!strcmp(ps_backend_cpu_isa(), "sse41"), "effective ISA %s, expected sse41", ps_backend_cpu_isa());
    ps_st_file *g = ps_st_read("tests/golden/kinds.safetensors", &err);
    CHECK_MSG(g, "%s", err.msg);
    if (!g) return check_summary("test_kinds");
    snprintf(g_dir, sizeof g_dir, "/tmp/ps-test-kinds.XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    const char *cases = ps_st_metadata(g, "cases");
    CHECK(cases != NULL);
    char *list = strdup(cases ? cases : "");
    int ncases = 0;
    const char *backends[] = {"ref", "dnnl"};
    for (char *save = NULL, *c = strtok_r(list, ",", &save); c; c = strtok_r(NULL, ",", &save)) {
        for (int b = sse41; b < 2; b++) run_case(g, c, backends[b]);
        ncases++;
    }
    if (sse41) {
        printf("%d cases on dnnl, ONEDNN_MAX_CPU_ISA=SSE41\n", ncases);
        free(list);
        ps_st_free(g);
        test_rmtree(g_dir);
        return check_summary("test_kinds[SSE41]");
    }
    printf("%d cases, ref and dnnl\n", ncases);
#ifdef PS_HAVE_CUDA
    ps_backend *cu = ps_backend_create("cuda", 0, 0, &err);
    if (cu) {
        ps_backend_free(cu);
        free(list);
        list = strdup(cases ? cases : "");
        g_atol = ATOL_CUDA;
        g_rtol = RTOL_CUDA;
        for (char *save = NULL, *c = strtok_r(list, ",", &save); c; c = strtok_r(NULL, ",", &save)) run_case(g, c, "cuda");
        printf("%d cases on cuda:0\n", ncases);
    } else {
        printf("cuda: skipped: %s\n", err.msg);
    }
#else
    printf("cuda: skipped: this binary was built without CUDA\n");
#endif
    free(list);
    ps_st_free(g);
    test_rmtree(g_dir);
    sse41_child(argv[0]);
    return check_summary("test_kinds");
}
