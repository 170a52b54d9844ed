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
 * median repetition as well, and each phase's CPU time on the thread that
 * ran it (cpu ... ms/batch).
 *
 * What psd does around the same compute, one ingredient at a time (to
 * find why a call costs more inside psd than here; docs/performance.md):
 * --snapshots       model.snapshot_steps as psd has it (a Step writes the
 *                   next weights into another of up to 4 copies);
 * --malloc-tune     psd's glibc malloc thresholds (server/malloc_tune.h);
 * --hop N           each phase (forward, backward, step) runs on the next
 *                   of N worker threads, the main thread waiting for it as
 *                   psd's RPC thread waits for a worker;
 * --hop-cpus A,B,.. worker i runs on CPU list[i % len] only (with --hop:
 *                   0,1 puts consecutive phases on different cores, 0,0
 *                   keeps them on one);
 * --fresh-input     the batch is copied into a freshly malloc'd buffer
 *                   before each forward (psd decodes every request into
 *                   new memory);
 * --gap-us U        the calling thread sleeps U us between phases (the
 *                   trainer's round trip: the CPU idles or runs others);
 * --evict-kb K      the calling thread writes K KiB of other memory between
 *                   phases (caches as cold as another process's work
 *                   between two calls leaves them);
 * --psd-checks      what psd's handlers add: the input's and the output
 *                   gradient's NaN/Inf scans, the parameter gradients'
 *                   finiteness check, a separate scratch accumulator added
 *                   into the context's (ps_grads_add);
 * --parallel P      P threads in this process, each bound to its own CPU
 *                   (i mod the CPUs), run their own batches at once on the
 *                   one model, as psd's workers serve P trainers (hogwild
 *                   steps, the model's own locks) but without the RPC;
 *                   samples/s is all threads' together, cpu_us the
 *                   process's CPU per sample. Set --threads 1 beside it to
 *                   read it against P processes of one thread each.
 */
#include <errno.h>
#include <sched.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "mnist.h"
#include "malloc_tune.h"
#include "model.h"
#include "service_impl.h"   /* svc_check_finite: the check psd makes of every tensor */

static double cpu_s(void) {  /* the whole process's CPU time (every OpenMP thread) */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double thread_cpu_s(void) {  /* the calling thread's CPU time */
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Worker threads for --hop: job i goes to worker i % n, the caller waits. */
typedef struct hop_worker {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int (*fn)(void *);
    void *arg;
    int busy, rc, stop;
} hop_worker;

static void *hop_main(void *p) {
    hop_worker *w = p;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->busy && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        pthread_mutex_unlock(&w->mu);
        int rc = w->fn(w->arg);
        pthread_mutex_lock(&w->mu);
        w->rc = rc;
        w->busy = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
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
    double c_fwd, c_bwd, c_step; /* accumulated phase CPU times (the thread that ran it) */
    double cpu;                  /* process CPU seconds of the last run_for */
    long nbatches;
    /* psd's ingredients (see the header) */
    int fresh_input, psd_checks;
    long gap_us;
    char *evict;                 /* --evict-kb */
    size_t nevict;
    hop_worker *hop;
    int nhop;
    long njobs;
    /* the batch in flight between phases */
    const float *xin;
    int keep;                    /* the forward keeps a tape (a step follows) */
    ps_tape *t;
    ps_grads *g;
    ps_err *err;
} bench_ctx;

static int phase_fwd(void *p) {
    bench_ctx *b = p;
    double c0 = thread_cpu_s();
    int rc = b->psd_checks && svc_check_finite(b->xin, (size_t)b->batch * 784, "input", b->err) ? -1 : 0;
    if (!rc && ps_model_forward_range(b->m, 0, ps_model_num_stages(b->m) - 1, b->xin, b->batch, 1, NULL, b->ctx,
                                      b->out, b->keep ? &b->t : NULL, NULL, b->err))
        rc = -1;
    b->c_fwd += thread_cpu_s() - c0;
    return rc;
}

static int phase_bwd(void *p) {
    bench_ctx *b = p;
    double c0 = thread_cpu_s();
    int rc = b->psd_checks && svc_check_finite(b->grad, (size_t)b->batch * 10, "grad_output", b->err) ? -1 : 0;
    ps_grads *g = rc ? NULL : ps_grads_create(b->m, b->err);
    if (!g) rc = -1;
    if (!rc && ps_model_backward_acc(b->m, b->t, b->grad, NULL, g, b->err)) rc = -1;
    if (!rc && b->psd_checks) {   /* a scratch accumulator, checked, added into the context's */
        int bp;
        int64_t be;
        if (ps_grads_check_finite(b->m, g, &bp, &be) != 1) rc = -1;
        ps_grads *cg = rc ? NULL : ps_grads_create(b->m, b->err);
        if (!rc && (!cg || ps_grads_add(b->m, cg, g, b->err))) rc = -1;
        ps_grads_free(g);
        g = cg;
    }
    ps_tape_free(b->t);
    b->t = NULL;
    b->g = g;
    b->c_bwd += thread_cpu_s() - c0;
    return rc;
}

static int phase_step(void *p) {
    bench_ctx *b = p;
    double c0 = thread_cpu_s();
    int rc = ps_model_step_grads(b->m, b->g, NULL, b->err) ? -1 : 0;
    ps_grads_free(b->g);
    b->g = NULL;
    b->c_step += thread_cpu_s() - c0;
    return rc;
}

/* Runs one phase inline or on the next --hop worker; then the --gap-us pause. */
static int run_phase(bench_ctx *b, int (*fn)(void *)) {
    int rc;
    if (b->nhop) {
        hop_worker *w = &b->hop[b->njobs++ % b->nhop];
        pthread_mutex_lock(&w->mu);
        w->fn = fn;
        w->arg = b;
        w->busy = 1;
        pthread_cond_broadcast(&w->cv);
        while (w->busy) pthread_cond_wait(&w->cv, &w->mu);
        rc = w->rc;
        pthread_mutex_unlock(&w->mu);
    } else {
        rc = fn(b);
    }
    for (size_t i = 0; i < b->nevict; i += 64) b->evict[i]++;
    if (b->gap_us > 0) {
        struct timespec ts = { b->gap_us / 1000000, (b->gap_us % 1000000) * 1000 };
        nanosleep(&ts, NULL);
    }
    return rc;
}

static int one_batch(bench_ctx *b, int step, ps_err *err) {
    uint32_t base = (uint32_t)((b->ctx * (uint64_t)b->batch) % (b->data->n - (uint32_t)b->batch));
    for (int i = 0; i < b->batch; i++) b->idx[i] = base + (uint32_t)i;
    if (ps_mnist_batch(b->data, b->idx, b->batch, b->x, b->y, err)) return -1;
    b->ctx++;
    b->err = err;
    float *fresh = NULL;
    b->xin = b->x;
    if (b->fresh_input) {   /* as psd's decode: new memory every request */
        size_t bytes = (size_t)b->batch * 784 * sizeof(float);
        if (!(fresh = malloc(bytes + 1))) return -1;
        memcpy(fresh, b->x, bytes);
        b->xin = fresh;
    }
    b->keep = step;
    double t0 = ps_mono_s();
    int rc = run_phase(b, phase_fwd);
    free(fresh);
    double t1 = ps_mono_s();
    b->t_fwd += t1 - t0;
    if (!step) return rc;
    if (rc) { ps_tape_free(b->t); b->t = NULL; return -1; }
    const int k = 10;
    memset(b->grad, 0, (size_t)b->batch * k * sizeof(float));
    for (int i = 0; i < b->batch; i++) b->grad[(size_t)i * k + b->y[i]] = -1.0f / b->batch;
    rc = run_phase(b, phase_bwd);
    double t2 = ps_mono_s();
    b->t_bwd += t2 - t1;
    if (rc == 0) rc = run_phase(b, phase_step);
    b->t_step += ps_mono_s() - t2;
    ps_grads_free(b->g);
    b->g = NULL;
    ps_tape_free(b->t);
    b->t = NULL;
    return rc ? -1 : 0;
}

/* Run batches for `secs` seconds, or exactly `fixed` batches when fixed >
 * 0; returns samples/s. */
static double run_for(bench_ctx *b, int step, double secs, long fixed, ps_err *err) {
    long samples = 0;
    b->t_fwd = b->t_bwd = b->t_step = 0;
    b->c_fwd = b->c_bwd = b->c_step = 0;
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

/* b's batch buffers for batch B (b->batch); 0, or -1 when out of memory
 * (what was allocated is freed by ctx_free_buffers either way). */
static int ctx_buffers(bench_ctx *b) {
    size_t n = (size_t)b->batch;
    b->x = malloc(n * 784 * sizeof(float));
    b->out = malloc(n * 10 * sizeof(float));
    b->grad = malloc(n * 10 * sizeof(float));
    b->y = malloc(n * sizeof(int64_t));
    b->idx = malloc(n * sizeof(uint32_t));
    return b->x && b->out && b->grad && b->y && b->idx ? 0 : -1;
}

static void ctx_free_buffers(bench_ctx *b) {
    free(b->x); free(b->out); free(b->grad); free(b->y); free(b->idx);
}

/* --parallel: one thread's share of a repetition. */
typedef struct par_job {
    bench_ctx *b;
    pthread_t th;
    int step, cpu;
    double secs;
    long fixed;
    double rate;
    ps_err err;
} par_job;

static void *par_main(void *p) {
    par_job *j = p;
    if (j->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(j->cpu, &set);
        pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    }
    j->rate = run_for(j->b, j->step, j->secs, j->fixed, &j->err);
    return NULL;
}

/* run_for on np contexts at once, one thread each; b[0] gets the summed
 * phase times (per batch of all threads), the process's CPU and every
 * thread's batches; returns all threads' samples/s together. */
static double run_par(bench_ctx *b, int np, int step, double secs, long fixed, ps_err *err) {
    par_job job[64];
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double c0 = cpu_s(), total = 0;
    int started = 0;
    for (int i = 0; i < np; i++) {
        job[i] = (par_job){.b = &b[i], .step = step, .cpu = ncpu > 0 ? (int)(i % ncpu) : -1, .secs = secs, .fixed = fixed};
        if (pthread_create(&job[i].th, NULL, par_main, &job[i])) break;
        started++;
    }
    for (int i = 0; i < started; i++) pthread_join(job[i].th, NULL);
    double cpu = cpu_s() - c0;
    if (started < np) { ps_err_set(err, PS_ERR_INTERNAL, "--parallel: no thread"); return -1; }
    for (int i = 0; i < np; i++) {
        if (job[i].rate < 0) { *err = job[i].err; return -1; }
        total += job[i].rate;
    }
    for (int i = 1; i < np; i++) {
        b[0].t_fwd += b[i].t_fwd; b[0].t_bwd += b[i].t_bwd; b[0].t_step += b[i].t_step;
        b[0].c_fwd += b[i].c_fwd; b[0].c_bwd += b[i].c_bwd; b[0].c_step += b[i].c_step;
        b[0].nbatches += b[i].nbatches;
    }
    b[0].cpu = cpu;
    return total;
}

int main(int argc, char **argv) {
    const char *backend = "dnnl", *data_dir = "data/mnist", *model_file = NULL;
    long threads = 1, batch = 32, reps = 5, profile = 0, fixed = 0, nhop = 0, gap_us = 0, evict_kb = 0, npar = 1;
    int snapshots = 0, tune = 0, fresh_input = 0, psd_checks = 0, ncpus = 0, cpus[64];
    double secs = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long tmp;
        if (!strcmp(a, "--profile")) { profile = 1; continue; }
        if (!strcmp(a, "--snapshots")) { snapshots = 1; continue; }
        if (!strcmp(a, "--malloc-tune")) { tune = 1; continue; }
        if (!strcmp(a, "--fresh-input")) { fresh_input = 1; continue; }
        if (!strcmp(a, "--psd-checks")) { psd_checks = 1; continue; }
        if (!v) { fprintf(stderr, "bench_compute: %s needs a value (see the header of bench/bench_compute.c)\n", a); return 2; }
        i++;
        if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--data")) data_dir = v;
        else if (!strcmp(a, "--model")) model_file = v;
        else if (!strcmp(a, "--threads")) { if (ps_cli_long("bench_compute", a, v, 1, 256, &threads)) return 2; }
        else if (!strcmp(a, "--batch")) { if (ps_cli_long("bench_compute", a, v, 1, 512, &batch)) return 2; }
        else if (!strcmp(a, "--batches")) { if (ps_cli_long("bench_compute", a, v, 1, 1000000, &fixed)) return 2; }
        else if (!strcmp(a, "--hop")) { if (ps_cli_long("bench_compute", a, v, 1, 64, &nhop)) return 2; }
        else if (!strcmp(a, "--parallel")) { if (ps_cli_long("bench_compute", a, v, 1, 64, &npar)) return 2; }
        else if (!strcmp(a, "--hop-cpus")) {
            for (const char *q = v; *q && ncpus < 64;) {
                char *e;
                long c = strtol(q, &e, 10);
                if (e == q || c < 0 || c >= CPU_SETSIZE) { fprintf(stderr, "bench_compute: --hop-cpus: '%s' is not a list of CPU numbers\n", v); return 2; }
                cpus[ncpus++] = (int)c;
                q = *e == ',' ? e + 1 : e;
                if (*e && *e != ',') { fprintf(stderr, "bench_compute: --hop-cpus: '%s' is not a list of CPU numbers\n", v); return 2; }
            }
        }
        else if (!strcmp(a, "--evict-kb")) { if (ps_cli_long("bench_compute", a, v, 0, 1 << 22, &evict_kb)) return 2; }
        else if (!strcmp(a, "--gap-us")) { if (ps_cli_long("bench_compute", a, v, 0, 1000000, &gap_us)) return 2; }
        else if (!strcmp(a, "--reps")) { if (ps_cli_long("bench_compute", a, v, 1, 1000, &reps)) return 2; }
        else if (!strcmp(a, "--secs")) { if (ps_cli_long("bench_compute", a, v, 1, 600, &tmp)) return 2; secs = (double)tmp; }
        else if (!strcmp(a, "--msecs")) { if (ps_cli_long("bench_compute", a, v, 10, 600000, &tmp)) return 2; secs = tmp / 1000.0; }
        else { fprintf(stderr, "bench_compute: unknown option '%s'\n", a); return 2; }
    }
    if (npar > 1 && (nhop || gap_us || evict_kb)) {
        fprintf(stderr, "bench_compute: --parallel goes with none of --hop, --gap-us, --evict-kb\n");
        return 2;
    }
    if (tune && !ps_malloc_tune()) fprintf(stderr, "bench_compute: --malloc-tune: left alone (GLIBC_TUNABLES)\n");
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
    o.snapshot_steps = snapshots;
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
    int buffers_ok = ctx_buffers(&b) == 0;
    b.fresh_input = fresh_input;
    b.psd_checks = psd_checks;
    b.gap_us = gap_us;
    b.nevict = (size_t)evict_kb << 10;
    if (b.nevict && !(b.evict = calloc(b.nevict, 1))) { fprintf(stderr, "bench_compute: out of memory\n"); return 1; }
    hop_worker hop[64];
    for (long i = 0; i < nhop; i++) {
        hop[i] = (hop_worker){0};
        pthread_mutex_init(&hop[i].mu, NULL);
        pthread_cond_init(&hop[i].cv, NULL);
        if (pthread_create(&hop[i].th, NULL, hop_main, &hop[i])) { fprintf(stderr, "bench_compute: no thread\n"); return 1; }
        b.nhop = (int)i + 1;
        if (ncpus) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpus[i % ncpus], &set);
            if (pthread_setaffinity_np(hop[i].th, sizeof set, &set)) fprintf(stderr, "bench_compute: --hop-cpus: CPU %d refused\n", cpus[i % ncpus]);
        }
    }
    b.hop = hop;
    int rc = 1;
    if (!buffers_ok) { fprintf(stderr, "bench_compute: out of memory\n"); goto out; }
    /* --parallel: bs[0] is b; the others their own buffers and contexts
     * (context ids apart, batches from other places of the data) */
    bench_ctx bs[64];
    bs[0] = b;
    int npar_ok = 1;
    for (long i = 1; i < npar; i++) {
        bs[i] = (bench_ctx){.m = m, .data = &data, .batch = (int)batch, .ctx = (uint64_t)i << 40, .psd_checks = psd_checks,
                            .fresh_input = fresh_input};
        if (ctx_buffers(&bs[i])) npar_ok = 0;
    }
    if (!npar_ok) { fprintf(stderr, "bench_compute: out of memory\n"); goto out_par; }
#define RUN(step, secs) (npar > 1 ? run_par(bs, (int)npar, (step), (secs), fixed, &err) : run_for(&bs[0], (step), (secs), fixed, &err))

    const char *what[2] = {"forward", "step"};
    /* Warm-up of both: primitive creation, page faults, caches. Then the
     * repetitions of the forward and the step alternate, so that a change
     * in the machine's load during the run moves both alike and their
     * ratio (issue 18's step/forward) is not the load's. */
    for (int step = 0; step <= 1; step++)
        if (RUN(step, secs < 0.5 ? secs : 0.5) < 0) { fprintf(stderr, "bench_compute: %s\n", err.msg); goto out_par; }
    double *pfs[2] = { calloc((size_t)reps * 8, sizeof(double)), calloc((size_t)reps * 8, sizeof(double)) };
    if (!pfs[0] || !pfs[1]) { free(pfs[0]); free(pfs[1]); goto out_par; }
    for (long i = 0; i < reps; i++)
        for (int step = 0; step <= 1; step++) {
            double *p = &pfs[step][i * 8];
            p[0] = RUN(step, secs);
            if (p[0] < 0) { fprintf(stderr, "bench_compute: %s\n", err.msg); free(pfs[0]); free(pfs[1]); goto out_par; }
            const bench_ctx *b0 = &bs[0];
            double nb = (double)b0->nbatches;
            p[1] = b0->t_fwd / nb * 1e3;
            p[2] = b0->t_bwd / nb * 1e3;
            p[3] = b0->t_step / nb * 1e3;
            p[4] = b0->cpu / (nb * (double)batch) * 1e6;
            p[5] = b0->c_fwd / nb * 1e3;
            p[6] = b0->c_bwd / nb * 1e3;
            p[7] = b0->c_step / nb * 1e3;
        }
    for (int step = 0; step <= 1; step++) {
        double *pf = pfs[step], *r = calloc((size_t)reps, sizeof *r);
        if (!r) { free(pfs[0]); free(pfs[1]); goto out_par; }
        for (long i = 0; i < reps; i++) r[i] = pf[i * 8];
        qsort(pf, (size_t)reps, 8 * sizeof(double), cmp_double);  /* rows by samples/s */
        double *cpu = calloc((size_t)reps, sizeof *cpu);
        for (long i = 0; cpu && i < reps; i++) cpu[i] = pf[i * 8 + 4];
        if (cpu) qsort(cpu, (size_t)reps, sizeof *cpu, cmp_double);
        double cpu_med = !cpu ? 0 : reps % 2 ? cpu[reps / 2] : 0.5 * (cpu[reps / 2 - 1] + cpu[reps / 2]);
        free(cpu);
        qsort(r, (size_t)reps, sizeof *r, cmp_double);
        double med = reps % 2 ? r[reps / 2] : 0.5 * (r[reps / 2 - 1] + r[reps / 2]);
        char par_tag[32] = "";
        if (npar > 1) snprintf(par_tag, sizeof par_tag, "parallel=%ld ", npar);
        printf("compute %sbackend=%s isa=%s threads=%ld %sbatch=%ld what=%s reps=%ld median=%.1f min=%.1f max=%.1f "
               "unit=samples/s cpu_us=%.1f\n", model_tag, backend, ps_backend_cpu_isa(), threads, par_tag, batch, what[step],
               reps, med, r[0], r[reps - 1], cpu_med);
        if (profile) {
            const double *p = &pf[(reps / 2) * 8];
            printf("  phases (ms/batch, median rep): forward %.2f backward %.2f step %.2f"
                   " cpu forward %.3f backward %.3f step %.3f\n", p[1], p[2], p[3], p[5], p[6], p[7]);
        }
        fflush(stdout);
        free(r);
    }
    free(pfs[0]);
    free(pfs[1]);
    rc = 0;
#undef RUN
out_par:
    for (long i = 1; i < npar; i++) ctx_free_buffers(&bs[i]);
out:
    for (int i = 0; i < b.nhop; i++) {
        pthread_mutex_lock(&hop[i].mu);
        hop[i].stop = 1;
        pthread_cond_broadcast(&hop[i].cv);
        pthread_mutex_unlock(&hop[i].mu);
        pthread_join(hop[i].th, NULL);
    }
    free(b.evict);
    ctx_free_buffers(&b);
    ps_model_free(m);
    ps_mnist_free(&data);
    return rc;
}
