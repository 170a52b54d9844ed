/* bench_cuda_ops - what one backend call costs on a GPU, by what it does:
 * the fixed costs (an allocation and its free, a copy each way, a 1-element
 * op - launch plus synchronisation) beside MNIST's ops at batch 32 (conv2's
 * forward and backward, a ReLU over conv1's output, fc1's forward). Each op
 * is called N times in a row by each of T threads at once (every thread
 * with its own buffers), R rounds; prints the median over rounds of the
 * wall time per call as one thread saw it, and the calls per second of all
 * threads together:
 *
 *   cuda_ops device=cuda:0 threads=8 what=relu_1 us_per_call=12.3 calls_per_s=650000
 *
 * The *_run rows call the op N times inside one asynchronous run
 * (backend.h async_begin / async_end: no wait per call, one at the end), as
 * psd's executor does within a call; PS_CUDA_ASYNC=0 makes them wait per
 * call as the others do.
 *
 * A machine without a CUDA device prints "skipped" and exits 0 (it is a
 * bench, not a test). PS_CUDA_CACHE_MB=0 in the environment turns the
 * backend's block cache off (docs/gpu.md), for the alloc_free rows.
 *
 * --backend dnnl (or ref) runs the same calls on the CPU backend (device=cpu;
 * its ops have no runs), which also checks this program where no GPU is.
 *
 * usage: bench_cuda_ops [--backend cuda|dnnl|ref] [--device N] [--threads "1 8"] [--calls N] [--reps R]
 *                       [--only WHAT]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"


/* One thread's buffers: MNIST's conv2 at batch 32 (x, w, b, y, dx, dw, db), fc1 (fw, fx), a host batch. */
typedef struct bufs {
    ps_backend *be;
    float *x, *w, *b, *y, *dx, *dw, *db, *fw, *fx, *host;
} bufs;

static const ps_conv_desc conv2 = {.n = 32, .cin = 32, .h = 26, .w = 26, .cout = 64, .kh = 3, .kw = 3, .stride = 1};
static const ps_linear_desc fc1 = {.n = 32, .in = 9216, .out = 128};

static ps_status alloc_free(bufs *u, size_t bytes) {
    void *p = u->be->ops->alloc(u->be->impl, bytes);
    u->be->ops->free(u->be->impl, p);
    return p ? PS_OK : PS_ERR_RESOURCE_EXHAUSTED;
}
static ps_status do_alloc_4k(bufs *u, ps_err *e) { (void)e; return alloc_free(u, 4096); }
static ps_status do_alloc_1m(bufs *u, ps_err *e) { (void)e; return alloc_free(u, 1 << 20); }
static ps_status do_h2d(bufs *u, ps_err *e) {
    return u->be->ops->copy_to_device(u->be->impl, u->x, u->host, 32 * 784 * sizeof(float), e);
}
static ps_status do_d2h(bufs *u, ps_err *e) {
    return u->be->ops->copy_to_host(u->be->impl, u->host, u->y, 32 * 10 * 32 * sizeof(float), e);
}
static ps_status do_relu_1(bufs *u, ps_err *e) { return u->be->ops->relu_forward(u->be->impl, 1, u->x, u->dx, e); }
static ps_status do_relu_conv1(bufs *u, ps_err *e) {
    return u->be->ops->relu_forward(u->be->impl, 32 * 32 * 26 * 26, u->x, u->dx, e);
}
static ps_status do_conv2_fwd(bufs *u, ps_err *e) {
    return u->be->ops->conv2d_forward(u->be->impl, &conv2, u->x, u->w, u->b, u->y, e);
}
static ps_status do_conv2_bwd(bufs *u, ps_err *e) {
    return u->be->ops->conv2d_backward(u->be->impl, &conv2, u->x, u->w, u->y, u->dx, u->dw, u->db, e);
}
static ps_status do_fc1_fwd(bufs *u, ps_err *e) {
    return u->be->ops->linear_forward(u->be->impl, &fc1, u->fx, u->fw, u->b, u->y, e);
}

/* What is measured: a name, the call, and whether the calls run inside one asynchronous run. */
static const struct {
    const char *what;
    ps_status (*call)(bufs *, ps_err *);
    int in_run;
} kinds[] = {
    {"alloc_free_4k", do_alloc_4k, 0}, {"alloc_free_1m", do_alloc_1m, 0}, {"h2d_100k", do_h2d, 0},
    {"d2h_40k", do_d2h, 0},            {"relu_1", do_relu_1, 0},          {"relu_conv1", do_relu_conv1, 0},
    {"conv2_fwd", do_conv2_fwd, 0},    {"conv2_bwd", do_conv2_bwd, 0},    {"fc1_fwd", do_fc1_fwd, 0},
    {"relu_1_run", do_relu_1, 1},      {"conv2_fwd_run", do_conv2_fwd, 1}, {"conv2_bwd_run", do_conv2_bwd, 1},
};
#define NKINDS (int)(sizeof kinds / sizeof kinds[0])

typedef struct job {
    ps_backend *be;
    int kind, calls, failed;
    double secs;
    pthread_barrier_t *bar;
} job;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static float *dev(ps_backend *be, size_t n) {
    float *p = ps_backend_alloc_floats(be, (int64_t)n);
    if (p) {
        float *h = calloc(n, sizeof *h);
        ps_err e = {0};
        for (size_t i = 0; h && i < n; i++) h[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
        if (!h || be->ops->copy_to_device(be->impl, p, h, n * sizeof *h, &e) != PS_OK) {
            ps_backend_release(be, p);
            p = NULL;
        }
        free(h);
    }
    return p;
}

static void *run(void *arg) {
    job *j = arg;
    ps_backend *be = j->be;
    ps_err e = {0};
    bufs u = {.be = be, .x = dev(be, 32 * 32 * 26 * 26), .w = dev(be, 64 * 32 * 9), .b = dev(be, 128),
              .y = dev(be, 32 * 64 * 24 * 24), .dx = dev(be, 32 * 32 * 26 * 26), .dw = dev(be, 64 * 32 * 9),
              .db = dev(be, 64), .fw = dev(be, 128 * 9216), .fx = dev(be, 32 * 9216),
              .host = calloc(32 * 784, sizeof(float))};
    if (!u.x || !u.w || !u.b || !u.y || !u.dx || !u.dw || !u.db || !u.fw || !u.fx || !u.host) j->failed = 1;
    pthread_barrier_wait(j->bar);
    double t0 = now();
    const int in_run = kinds[j->kind].in_run && be->ops->async_begin;
    if (in_run) be->ops->async_begin(be->impl);
    for (int i = 0; i < j->calls && !j->failed; i++)
        if (kinds[j->kind].call(&u, &e) != PS_OK) {
            fprintf(stderr, "bench_cuda_ops: %s: %s\n", kinds[j->kind].what, e.msg);
            j->failed = 1;
        }
    if (in_run && be->ops->async_end(be->impl, &e) != PS_OK) {
        fprintf(stderr, "bench_cuda_ops: %s: %s\n", kinds[j->kind].what, e.msg);
        j->failed = 1;
    }
    j->secs = now() - t0;
    float *devs[] = {u.x, u.w, u.b, u.y, u.dx, u.dw, u.db, u.fw, u.fx};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) ps_backend_release(be, devs[i]);
    free(u.host);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int device = 0, calls = 200, reps = 5;
    const char *threads = "1 8", *only = NULL, *backend = "cuda";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--device")) device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = argv[i + 1];
        else if (!strcmp(argv[i], "--calls")) calls = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only")) only = argv[i + 1];
        else if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else { fprintf(stderr, "bench_cuda_ops: unknown option %s\n", argv[i]); return 2; }
    }
    if (calls < 1 || reps < 1 || reps > 64) { fprintf(stderr, "bench_cuda_ops: bad --calls or --reps\n"); return 2; }
    ps_err err = {0};
    ps_backend *be = ps_backend_create(backend, device, 1, &err);
    if (!be) {
        printf("bench_cuda_ops: skipped: %s\n", err.msg);
        return 0;
    }
    char where[32];
    if (be->ops->device_kind) snprintf(where, sizeof where, "%s:%d", be->ops->device_kind, device);
    else snprintf(where, sizeof where, "cpu");
    int rc = 0;
    char tl[64];
    snprintf(tl, sizeof tl, "%s", threads);
    for (char *tok = strtok(tl, " ,"); tok && !rc; tok = strtok(NULL, " ,")) {
        int t = atoi(tok);
        if (t < 1 || t > 64) { fprintf(stderr, "bench_cuda_ops: bad thread count %s\n", tok); return 2; }
        for (int k = 0; k < NKINDS && !rc; k++) {
            if (only && !strstr(kinds[k].what, only)) continue;
            double per[64], rate[64];
            for (int r = 0; r < reps && !rc; r++) {
                job jobs[64];
                pthread_t th[64];
                pthread_barrier_t bar;
                pthread_barrier_init(&bar, NULL, (unsigned)t);
                for (int i = 0; i < t; i++) {
                    jobs[i] = (job){.be = be, .kind = k, .calls = r == 0 ? calls / 4 + 1 : calls, .bar = &bar};
                    pthread_create(&th[i], NULL, run, &jobs[i]);
                }
                double worst = 0;
                for (int i = 0; i < t; i++) {
                    pthread_join(th[i], NULL);
                    if (jobs[i].failed) rc = 1;
                    if (jobs[i].secs > worst) worst = jobs[i].secs;
                }
                pthread_barrier_destroy(&bar);
                per[r] = worst / jobs[0].calls * 1e6;
                rate[r] = t * jobs[0].calls / worst;
            }
            if (rc) break;
            /* round 0 is a warm-up (cuDNN's algorithm choice, the first allocations) */
            qsort(per + 1, (size_t)(reps > 1 ? reps - 1 : 0), sizeof *per, cmp);
            qsort(rate + 1, (size_t)(reps > 1 ? reps - 1 : 0), sizeof *rate, cmp);
            int m = reps > 1 ? 1 + (reps - 1) / 2 : 0;
            printf("cuda_ops device=%s threads=%d what=%s us_per_call=%.1f calls_per_s=%.0f\n", where, t,
                   kinds[k].what, per[m], rate[m]);
            fflush(stdout);
        }
    }
    ps_backend_free(be);
    return rc;
}
