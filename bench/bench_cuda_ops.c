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
 * usage: bench_cuda_ops [--device N] [--threads "1 8"] [--calls N] [--reps R] [--only WHAT]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"


static const char *const kinds[] = {"alloc_free_4k", "alloc_free_1m", "h2d_100k", "d2h_40k", "relu_1",
                                    "relu_conv1", "conv2_fwd", "conv2_bwd", "fc1_fwd", "relu_1_run",
                                    "conv2_fwd_run", "conv2_bwd_run"};
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

static const ps_conv_desc conv2 = {.n = 32, .cin = 32, .h = 26, .w = 26, .cout = 64, .kh = 3, .kw = 3, .stride = 1};
static const ps_linear_desc fc1 = {.n = 32, .in = 9216, .out = 128};

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
    float *x = dev(be, 32 * 32 * 26 * 26), *w = dev(be, 64 * 32 * 9), *b = dev(be, 128),
          *y = dev(be, 32 * 64 * 24 * 24), *dx = dev(be, 32 * 32 * 26 * 26), *dw = dev(be, 64 * 32 * 9),
          *db = dev(be, 64), *fw = dev(be, 128 * 9216), *fx = dev(be, 32 * 9216);
    float *host = calloc(32 * 784, sizeof *host);
    if (!x || !w || !b || !y || !dx || !dw || !db || !fw || !fx || !host) j->failed = 1;
    pthread_barrier_wait(j->bar);
    double t0 = now();
    const int run = j->kind >= 9 && be->ops->async_begin;
    if (run) be->ops->async_begin(be->impl);
    for (int i = 0; i < j->calls && !j->failed; i++) {
        ps_status s = PS_OK;
        switch (j->kind) {
        case 0: case 1: {
            void *p = be->ops->alloc(be->impl, j->kind == 0 ? 4096 : 1 << 20);
            if (!p) s = PS_ERR_RESOURCE_EXHAUSTED;
            be->ops->free(be->impl, p);
            break;
        }
        case 2: s = be->ops->copy_to_device(be->impl, x, host, 32 * 784 * sizeof(float), &e); break;
        case 3: s = be->ops->copy_to_host(be->impl, host, y, 32 * 10 * 32 * sizeof(float), &e); break;
        case 4: s = be->ops->relu_forward(be->impl, 1, x, dx, &e); break;
        case 5: s = be->ops->relu_forward(be->impl, 32 * 32 * 26 * 26, x, dx, &e); break;
        case 6: s = be->ops->conv2d_forward(be->impl, &conv2, x, w, b, y, &e); break;
        case 7: s = be->ops->conv2d_backward(be->impl, &conv2, x, w, y, dx, dw, db, &e); break;
        case 8: s = be->ops->linear_forward(be->impl, &fc1, fx, fw, b, y, &e); break;
        case 9: s = be->ops->relu_forward(be->impl, 1, x, dx, &e); break;
        case 10: s = be->ops->conv2d_forward(be->impl, &conv2, x, w, b, y, &e); break;
        case 11: s = be->ops->conv2d_backward(be->impl, &conv2, x, w, y, dx, dw, db, &e); break;
        }
        if (s != PS_OK) {
            fprintf(stderr, "bench_cuda_ops: %s: %s\n", kinds[j->kind], e.msg);
            j->failed = 1;
        }
    }
    if (run && be->ops->async_end(be->impl, &e) != PS_OK) {
        fprintf(stderr, "bench_cuda_ops: %s: %s\n", kinds[j->kind], e.msg);
        j->failed = 1;
    }
    j->secs = now() - t0;
    float *bufs[] = {x, w, b, y, dx, dw, db, fw, fx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) ps_backend_release(be, bufs[i]);
    free(host);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int device = 0, calls = 200, reps = 5;
    const char *threads = "1 8", *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--device")) device = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = argv[i + 1];
        else if (!strcmp(argv[i], "--calls")) calls = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only")) only = argv[i + 1];
        else { fprintf(stderr, "bench_cuda_ops: unknown option %s\n", argv[i]); return 2; }
    }
    if (calls < 1 || reps < 1 || reps > 64) { fprintf(stderr, "bench_cuda_ops: bad --calls or --reps\n"); return 2; }
    ps_err err = {0};
    ps_backend *be = ps_backend_create("cuda", device, 1, &err);
    if (!be) {
        printf("bench_cuda_ops: skipped: %s\n", err.msg);
        return 0;
    }
    int rc = 0;
    char tl[64];
    snprintf(tl, sizeof tl, "%s", threads);
    for (char *tok = strtok(tl, " ,"); tok && !rc; tok = strtok(NULL, " ,")) {
        int t = atoi(tok);
        if (t < 1 || t > 64) { fprintf(stderr, "bench_cuda_ops: bad thread count %s\n", tok); return 2; }
        for (int k = 0; k < NKINDS && !rc; k++) {
            if (only && !strstr(kinds[k], only)) continue;
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
            printf("cuda_ops device=cuda:%d threads=%d what=%s us_per_call=%.1f calls_per_s=%.0f\n", device, t,
                   kinds[k], per[m], rate[m]);
            fflush(stdout);
        }
    }
    ps_backend_free(be);
    return rc;
}
