/* bench_compute - in-process compute throughput of the model executor.
 *
 * For one backend and one thread count: samples/s of a training-mode
 * forward alone and of a full training step (forward with tape, backward,
 * SGD step), batch B on real MNIST images (IDX files) so the numbers match
 * what psd computes. Warm-up first, then R repetitions of T seconds each,
 * the forward's and the step's alternating (a load that changes during the
 * run then moves both alike, not their ratio); prints one machine-readable
 * line per measurement:
 *
 *   compute backend=dnnl isa=avx2 threads=2 batch=32 what=step reps=5 median=912.3 min=... max=... unit=samples/s cpu_us=480.2
 *
 * (isa: oneDNN's effective ISA, which ONEDNN_MAX_CPU_ISA can lower; cpu_us:
 * the process's CPU time per sample, median of the reps - what the work
 * costs whatever else the machine runs, where samples/s is what it got).
 * The model is mnist_cnn, or with --model FILE a model file of one's own
 * that takes a 1x28x28 float32 image and gives 10 outputs (e.g.
 * examples/models/small_resnet.yaml); the line then starts
 * "compute model=NAME backend=...".
 *
 * usage: bench_compute [--backend NAME] [--threads N] [--batch B]
 *                      [--reps R] [--secs T] [--batches N] [--data DIR] [--model FILE] [--profile]
 * --batches N: each repetition (and the warm-up) runs exactly N batches
 * instead of T seconds - the same work in every run, so that the CPU time
 * of two builds can be compared (e.g. under `perf stat -e task-clock`) on
 * a machine whose load makes wall time noisy.
 * --profile prints per-phase times (forward / backward / step) of the
 * median repetition as well.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "clock.h"
#include "mnist.h"
#include "model.h"

static double cpu_s(void) {  /* the whole process's CPU time (every OpenMP thread) */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct bench_ctx {
    ps_model *m;
    ps_mnist *data;
    float *x, *out, *grad;
    int64_t *y;
    uint32_t *idx;
    int batch;
    uint64_t ctx;
    double t_fwd, t_bwd, t_step; /* accumulated phase times */
    double cpu;                  /* process CPU seconds of the last run_for */
    long nbatches;
} bench_ctx;

static int one_batch(bench_ctx *b, int step, ps_err *err) {
    uint32_t base = (uint32_t)((b->ctx * (uint64_t)b->batch) % (b->data->n - (uint32_t)b->batch));
    for (int i = 0; i < b->batch; i++) b->idx[i] = base + (uint32_t)i;
    if (ps_mnist_batch(b->data, b->idx, b->batch, b->x, b->y, err)) return -1;
    b->ctx++;
    ps_tape *t = NULL;
    double t0 = ps_mono_s();
    if (ps_model_forward_range(b->m, 0, ps_model_num_stages(b->m) - 1, b->x, b->batch, 1, NULL, b->ctx, b->out,
                               step ? &t : NULL, NULL, err))
        return -1;
    double t1 = ps_mono_s();
    b->t_fwd += t1 - t0;
    if (!step) return 0;
    const int k = 10;
    memset(b->grad, 0, (size_t)b->batch * k * sizeof(float));
    for (int i = 0; i < b->batch; i++) b->grad[(size_t)i * k + b->y[i]] = -1.0f / b->batch;
    ps_grads *g = ps_grads_create(b->m, err);
    int rc = g ? (int)ps_model_backward_acc(b->m, t, b->grad, NULL, g, err) : -1;
    double t2 = ps_mono_s();
    b->t_bwd += t2 - t1;
    if (rc == 0) rc = ps_model_step_grads(b->m, g, NULL, err);
    b->t_step += ps_mono_s() - t2;
    ps_grads_free(g);
    ps_tape_free(t);
    return rc ? -1 : 0;
}

/* Run batches for `secs` seconds, or exactly `fixed` batches when fixed >
 * 0; returns samples/s. */
static double run_for(bench_ctx *b, int step, double secs, long fixed, ps_err *err) {
    long samples = 0;
    b->t_fwd = b->t_bwd = b->t_step = 0;
    b->nbatches = 0;
    double t0 = ps_mono_s(), c0 = cpu_s(), el;
    do {
        if (one_batch(b, step, err)) return -1;
        samples += b->batch;
        b->nbatches++;
        el = ps_mono_s() - t0;
    } while (fixed > 0 ? b->nbatches < fixed : el < secs);
    b->cpu = cpu_s() - c0;
    return samples / el;
}

int main(int argc, char **argv) {
    const char *backend = "dnnl", *data_dir = "data/mnist", *model_file = NULL;
    long threads = 1, batch = 32, reps = 5, profile = 0, fixed = 0;
    double secs = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long tmp;
        if (!strcmp(a, "--profile")) { profile = 1; continue; }
        if (!v) { fprintf(stderr, "bench_compute: %s needs a value (see the header of bench/bench_compute.c)\n", a); return 2; }
        i++;
        if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--data")) data_dir = v;
        else if (!strcmp(a, "--model")) model_file = v;
        else if (!strcmp(a, "--threads")) { if (ps_cli_long("bench_compute", a, v, 1, 256, &threads)) return 2; }
        else if (!strcmp(a, "--batch")) { if (ps_cli_long("bench_compute", a, v, 1, 512, &batch)) return 2; }
        else if (!strcmp(a, "--batches")) { if (ps_cli_long("bench_compute", a, v, 1, 1000000, &fixed)) return 2; }
        else if (!strcmp(a, "--reps")) { if (ps_cli_long("bench_compute", a, v, 1, 1000, &reps)) return 2; }
        else if (!strcmp(a, "--secs")) { if (ps_cli_long("bench_compute", a, v, 1, 600, &tmp)) return 2; secs = (double)tmp; }
        else if (!strcmp(a, "--msecs")) { if (ps_cli_long("bench_compute", a, v, 10, 600000, &tmp)) return 2; secs = tmp / 1000.0; }
        else { fprintf(stderr, "bench_compute: unknown option '%s'\n", a); return 2; }
    }
    ps_err err = {0};
    ps_mnist data = {0};
    if (ps_mnist_load(data_dir, "train", &data, &err)) { fprintf(stderr, "bench_compute: %s\n", err.msg); return 1; }
    ps_model_opts o = {0};
    if (model_file) o.file = model_file;
    else o.arch = "mnist_cnn";
    o.cpu_backend = backend;
    o.seed = 1;
    o.compute_threads = (int)threads;
    o.lr = 0.03f;
    ps_model *m = ps_model_create(&o, &err);
    if (!m) { fprintf(stderr, "bench_compute: %s\n", err.msg); ps_mnist_free(&data); return 1; }
    const ps_stage_info *in = ps_model_stage(m, 0), *last = ps_model_stage(m, ps_model_num_stages(m) - 1);
    if (last->out_ndim != 1 || last->out_dims[0] != 10 || in->in_dtype != PS_DTYPE_F32 ||
        (in->in_ndim == 3 ? in->in_dims[0] * in->in_dims[1] * in->in_dims[2] : in->in_ndim == 1 ? in->in_dims[0] : 0) !=
            784) {
        fprintf(stderr, "bench_compute: model %s does not take a 1x28x28 float32 image to 10 outputs\n",
                ps_model_arch(m));
        ps_model_free(m);
        ps_mnist_free(&data);
        return 2;
    }
    char model_tag[80] = "";
    if (model_file) snprintf(model_tag, sizeof model_tag, "model=%s ", ps_model_arch(m));
    bench_ctx b = {0};
    b.m = m;
    b.data = &data;
    b.batch = (int)batch;
    b.x = malloc((size_t)batch * 784 * sizeof(float));
    b.out = malloc((size_t)batch * 10 * sizeof(float));
    b.grad = malloc((size_t)batch * 10 * sizeof(float));
    b.y = malloc((size_t)batch * sizeof(int64_t));
    b.idx = malloc((size_t)batch * sizeof(uint32_t));
    int rc = 1;
    if (!b.x || !b.out || !b.grad || !b.y || !b.idx) { fprintf(stderr, "bench_compute: out of memory\n"); goto out; }

    const char *what[2] = {"forward", "step"};
    /* Warm-up of both: primitive creation, page faults, caches. Then the
     * repetitions of the forward and the step alternate, so that a change
     * in the machine's load during the run moves both alike and their
     * ratio (issue 18's step/forward) is not the load's. */
    for (int step = 0; step <= 1; step++)
        if (run_for(&b, step, secs < 0.5 ? secs : 0.5, fixed, &err) < 0) { fprintf(stderr, "bench_compute: %s\n", err.msg); goto out; }
    double *pfs[2] = { calloc((size_t)reps * 5, sizeof(double)), calloc((size_t)reps * 5, sizeof(double)) };
    if (!pfs[0] || !pfs[1]) { free(pfs[0]); free(pfs[1]); goto out; }
    for (long i = 0; i < reps; i++)
        for (int step = 0; step <= 1; step++) {
            double *p = &pfs[step][i * 5];
            p[0] = run_for(&b, step, secs, fixed, &err);
            if (p[0] < 0) { fprintf(stderr, "bench_compute: %s\n", err.msg); free(pfs[0]); free(pfs[1]); goto out; }
            double nb = (double)b.nbatches;
            p[1] = b.t_fwd / nb * 1e3;
            p[2] = b.t_bwd / nb * 1e3;
            p[3] = b.t_step / nb * 1e3;
            p[4] = b.cpu / (nb * (double)batch) * 1e6;
        }
    for (int step = 0; step <= 1; step++) {
        double *pf = pfs[step], *r = calloc((size_t)reps, sizeof *r);
        if (!r) { free(pfs[0]); free(pfs[1]); goto out; }
        for (long i = 0; i < reps; i++) r[i] = pf[i * 5];
        qsort(pf, (size_t)reps, 5 * sizeof(double), cmp_double);  /* rows by samples/s */
        double *cpu = calloc((size_t)reps, sizeof *cpu);
        for (long i = 0; cpu && i < reps; i++) cpu[i] = pf[i * 5 + 4];
        if (cpu) qsort(cpu, (size_t)reps, sizeof *cpu, cmp_double);
        double cpu_med = !cpu ? 0 : reps % 2 ? cpu[reps / 2] : 0.5 * (cpu[reps / 2 - 1] + cpu[reps / 2]);
        free(cpu);
        qsort(r, (size_t)reps, sizeof *r, cmp_double);
        double med = reps % 2 ? r[reps / 2] : 0.5 * (r[reps / 2 - 1] + r[reps / 2]);
        printf("compute %sbackend=%s isa=%s threads=%ld batch=%ld what=%s reps=%ld median=%.1f min=%.1f max=%.1f "
               "unit=samples/s cpu_us=%.1f\n", model_tag, backend, ps_backend_cpu_isa(), threads, batch, what[step], reps,
               med, r[0], r[reps - 1], cpu_med);
        if (profile) {
            const double *p = &pf[(reps / 2) * 5];
            printf("  phases (ms/batch, median rep): forward %.2f backward %.2f step %.2f\n", p[1], p[2], p[3]);
        }
        fflush(stdout);
        free(r);
    }
    free(pfs[0]);
    free(pfs[1]);
    rc = 0;
out:
    free(b.x); free(b.out); free(b.grad); free(b.y); free(b.idx);
    ps_model_free(m);
    ps_mnist_free(&data);
    return rc;
}
