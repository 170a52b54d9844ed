/* test_isa - no reference kernels in a training step, on every x86-64 ISA
 * this host can run, and the numbers still right.
 *
 * oneDNN picks its kernels by ISA when a primitive is created, and falls
 * back to reference C kernels where none fits (conv1's weight gradient on
 * AVX2 once did, 90 % of a step). ONEDNN_MAX_CPU_ISA can only be set before
 * oneDNN's first use, so the parent runs one child process of itself per
 * ISA - AVX512_CORE, AVX2, SSE41 - skipping (with a printed line) those the
 * CPU lacks. Each child:
 *  - checks oneDNN's effective ISA is the one asked for;
 *  - replays PyTorch's golden training steps (batch 8) on the dnnl backend;
 *  - runs a batch-32 step on dnnl and on the plain C ref backend from the
 *    same weights and dropout masks and compares outputs, gradients and
 *    updated weights;
 *  - asserts no primitive of either dnnl model, nor of psd's start-up probe
 *    (ps_isa_check), got a disallowed reference kernel;
 *  - on AVX2 and SSE4.1, shows the check can fail: a max-pool forced onto
 *    nChw16c (PS_DNNL_LAYOUT=16), which only AVX-512 has a kernel for, must
 *    be reported.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "isa_check.h"
#include "model.h"
#include "safetensors.h"
#include "support/golden_replay.h"
#include "support/isa_child.h"
#include "support/model_run.h"
#include "support/random.h"

static int fallbacks_of(const ps_model *m, const char *label) {
    int total = 0;
    char buf[2048];
    for (int s = 0; ps_model_stage_backend(m, s); s++) {
        int n = ps_backend_fallbacks(ps_model_stage_backend(m, s), buf, sizeof buf);
        if (n) fprintf(stderr, "%s: %d disallowed fallback(s):\n%s", label, n, buf);
        total += n;
    }
    return total;
}

/* A batch-32 training step on dnnl against the ref backend. */
static void step_vs_ref(const char *isa) {
    ps_err err = {0};
    ps_model_opts o;
    golden_model_opts(&o);
    ps_model *m[2] = { NULL, NULL };
    const char *be[2] = { "dnnl", "ref" };
    for (int i = 0; i < 2; i++) {
        o.cpu_backend = be[i];
        m[i] = ps_model_create(&o, &err);
        CHECK_MSG(m[i] != NULL, "%s: %s", be[i], err.msg);
    }
    if (!m[0] || !m[1]) goto out;
    enum { N = 32, K = 10 };
    rng r = { 0x1234567 };
    float *x = host_random((size_t)N * 784, &r);
    for (int i = 0; i < N * 784; i++) x[i] = 0.5f * (x[i] + 1.0f);   /* pixels in [0, 1) */
    float out[2][N * K], g[N * K] = { 0 };
    for (int i = 0; i < N; i++) g[i * K + (i * 7) % K] = -1.0f / N;
    ps_tape *t[2] = { NULL, NULL };
    ps_grads *gr[2] = { NULL, NULL };
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(run_forward(m[i], x, N, 1, NULL, 99, out[i], &t[i], NULL, &err) == PS_OK, "%s", err.msg);
        if (t[i]) CHECK_MSG((gr[i] = run_backward(m[i], t[i], g, &err)) != NULL, "%s", err.msg);
    }
    char what[96];
    snprintf(what, sizeof what, "%s batch-32 output", isa);
    check_scaled(what, out[0], out[1], N * K, 1e-4);
    int np = gr[0] && gr[1] ? ps_model_num_params(m[0]) : 0;
    for (int p = 0; p < np; p++) {
        const ps_param_info *pi = ps_model_param(m[0], p);
        float *a = malloc((size_t)pi->numel * sizeof *a), *b = malloc((size_t)pi->numel * sizeof *b);
        CHECK(ps_grads_get(m[0], gr[0], p, a, &err) == PS_OK);
        CHECK(ps_grads_get(m[1], gr[1], p, b, &err) == PS_OK);
        snprintf(what, sizeof what, "%s batch-32 grad %s", isa, pi->name);
        check_scaled(what, a, b, (size_t)pi->numel, 1e-4);
        free(a);
        free(b);
    }
    for (int i = 0; i < 2 && np; i++) CHECK(ps_model_step_grads(m[i], gr[i], NULL, &err) == PS_OK);
    for (int p = 0; p < np; p++) {
        const ps_param_info *pi = ps_model_param(m[0], p);
        float *a = malloc((size_t)pi->numel * sizeof *a), *b = malloc((size_t)pi->numel * sizeof *b);
        CHECK(ps_model_get_param(m[0], p, a, &err) == PS_OK);
        CHECK(ps_model_get_param(m[1], p, b, &err) == PS_OK);
        snprintf(what, sizeof what, "%s batch-32 stepped %s", isa, pi->name);
        check_scaled(what, a, b, (size_t)pi->numel, 1e-4);
        free(a);
        free(b);
    }
    for (int i = 0; i < 2; i++) ps_grads_free(gr[i]), ps_tape_free(t[i]);
    free(x);
    CHECK_MSG(fallbacks_of(m[0], isa) == 0, "%s: batch-32 step used reference kernels (listed above)", isa);
out:
    for (int i = 0; i < 2; i++) ps_model_free(m[i]);
}

/* The check must see a real fallback: nChw16c max-pool without AVX-512. */
static void negative_control(const char *isa) {
    ps_err err = {0};
    setenv("PS_DNNL_LAYOUT", "16", 1);
    ps_backend *b = ps_backend_create("dnnl", 0, 1, &err);
    unsetenv("PS_DNNL_LAYOUT");
    CHECK_MSG(b != NULL, "%s", err.msg);
    if (!b) return;
    ps_pool_desc d = { 2, 16, 8, 8, 2, 2, PS_LAYOUT_BLOCKED };
    float *x = ps_backend_alloc_floats(b, 2 * 16 * 8 * 8), *y = ps_backend_alloc_floats(b, 2 * 16 * 4 * 4);
    memset(x, 0, sizeof(float) * 2 * 16 * 8 * 8);
    CHECK_MSG(b->ops->maxpool_forward(b->impl, &d, x, y, NULL, &err) == PS_OK, "%s", err.msg);
    char buf[512];
    int n = ps_backend_fallbacks(b, buf, sizeof buf);
    CHECK_MSG(n == 1 && strstr(buf, "max-pool"), "%s: nChw16c max-pool: %d fallbacks reported: %s", isa, n, buf);
    printf("  %-12s negative control reported: %s", isa, buf);
    ps_backend_release(b, x);
    ps_backend_release(b, y);
    ps_backend_free(b);
}

static int child(const isa_row *row) {
    const char *eff = ps_backend_cpu_isa();
    CHECK_MSG(!strcmp(eff, row->effective), "ONEDNN_MAX_CPU_ISA=%s: effective ISA %s, expected %s",
              row->env, eff, row->effective);
    ps_err err = {0};
    ps_st_file *g = ps_st_read(GOLDEN_PATH, &err);
    CHECK_MSG(g != NULL, "%s", err.msg);
    if (g) {
        ps_model_opts o;
        golden_model_opts(&o);
        ps_model *m = ps_model_create(&o, &err);
        CHECK_MSG(m != NULL, "%s", err.msg);
        if (m) {
            golden_replay(g, m, row->effective);
            CHECK_MSG(fallbacks_of(m, row->effective) == 0, "%s: golden steps used reference kernels", row->effective);
        }
        ps_model_free(m);
        ps_st_free(g);
    }
    step_vs_ref(row->effective);
    ps_model_opts o;
    golden_model_opts(&o);
    ps_isa_report rep;
    CHECK_MSG(ps_isa_check(&o, 32, &rep, &err) == PS_OK, "%s", err.msg);
    CHECK_MSG(rep.nfallback == 0, "%s: psd's start-up probe: %d fallbacks:\n%s", row->effective, rep.nfallback,
              rep.fallbacks);
    if (strcmp(row->effective, "avx512_core")) negative_control(row->effective);
    printf("  %-12s effective ISA %s, %d disallowed fallbacks in psd's probe\n", row->env, rep.isa, rep.nfallback);
    char name[64];
    snprintf(name, sizeof name, "test_isa[%s]", row->env);
    return check_summary(name);
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--child")) {
        for (size_t i = 0; i < ISA_ROWS; i++)
            if (!strcmp(argv[2], isa_rows[i].env)) return child(&isa_rows[i]);
        fprintf(stderr, "test_isa: unknown ISA %s\n", argv[2]);
        return 2;
    }
    int ran = 0;
    for (size_t i = 0; i < ISA_ROWS; i++) {
        const isa_row *row = &isa_rows[i];
        if (!isa_host_has(row)) {
            printf("%s: skipped: this CPU lacks it (%s...)\n", row->env, row->flags[0]);
            continue;
        }
        char *const args[] = {argv[0], "--child", (char *)row->env, NULL};
        check_isa_child("test_isa", row->env, args);
        ran++;
    }
    if (!ran) return check_skip("test_isa", "this CPU has none of AVX-512, AVX2, SSE4.1");
    return check_summary("test_isa");
}
