/* bench_group - what batching costs or saves in psd's compute alone (no
 * RPC, no waiting): K training forwards and K backwards of B samples each,
 * one call each (as without batching), against one combined forward
 * (ps_model_forward_group) and one combined backward
 * (ps_model_backward_group) of the same K parts, on mnist_cnn, in one
 * process, alternately, R times. Prints the CPU-seconds per sample
 * (getrusage: this process's user + system time, which other load on the
 * machine disturbs less than wall time) of each way and their ratio.
 * bench/batching.sh runs it beside the end-to-end figures.
 *
 * With --place DEV (cuda:0, ...) every stage computes on that device and
 * the wall time per sample is printed too: a GPU's calls queue on streams
 * and wait, which the CPU-seconds do not show.
 *
 * usage: bench_group [--parts K] [--batch B] [--reps R] [--threads T] [--backend dnnl|ref] [--place DEV]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "model.h"

static double cpu_now(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define DIE(...) do { fprintf(stderr, "bench_group: " __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

int main(int argc, char **argv) {
    int k = 8, b = 32, reps = 5, threads = 1;
    const char *backend = "dnnl", *place = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--parts")) k = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) b = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "--place")) place = argv[i + 1];
        else DIE("unknown option %s", argv[i]);
    }
    if (k < 1 || k > 64 || b < 1 || b > 256 || reps < 1 || threads < 1) DIE("bad sizes");
    ps_err err = {0};
    ps_model_opts mo = {.arch = "mnist_cnn", .cpu_backend = backend, .seed = 1, .compute_threads = threads,
                        .lr = 0.01f};
    if (place) {   /* mnist_cnn's two stages */
        mo.n_placement = 2;
        mo.placement_stage[0] = "conv";
        mo.placement_stage[1] = "fc";
        mo.placement_device[0] = mo.placement_device[1] = place;
    }
    ps_model *m = ps_model_create(&mo, &err);
    if (!m) DIE("%s", err.msg);
    int last = ps_model_num_stages(m) - 1;
    const ps_stage_info *s0 = ps_model_stage(m, 0), *sl = ps_model_stage(m, last);
    int64_t in_per = 1, out_per = 1;
    for (int d = 0; d < s0->in_ndim; d++) in_per *= s0->in_dims[d];
    for (int d = 0; d < sl->out_ndim; d++) out_per *= sl->out_dims[d];
    float *x = malloc(sizeof(float) * (size_t)(k * b * in_per)), *g = malloc(sizeof(float) * (size_t)(k * b * out_per));
    float *out = malloc(sizeof(float) * (size_t)(k * b * out_per));
    for (int64_t i = 0; i < k * b * in_per; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    for (int64_t i = 0; i < k * b * out_per; i++) g[i] = (float)((i * 40503u) % 200) / 1000.0f - 0.1f;
    const void **xs = malloc(sizeof *xs * (size_t)k);
    const float **gs = malloc(sizeof *gs * (size_t)k);
    float **outs = malloc(sizeof *outs * (size_t)k), **gin = calloc((size_t)k, sizeof *gin);
    int *ns = malloc(sizeof *ns * (size_t)k);
    uint64_t *seeds = malloc(sizeof *seeds * (size_t)k);
    ps_tape **tapes = calloc((size_t)k, sizeof *tapes);
    ps_grads **accs = calloc((size_t)k, sizeof *accs);
    for (int i = 0; i < k; i++) {
        xs[i] = x + (size_t)i * (size_t)(b * in_per);
        gs[i] = g + (size_t)i * (size_t)(b * out_per);
        outs[i] = out + (size_t)i * (size_t)(b * out_per);
        ns[i] = b;
        seeds[i] = (uint64_t)i + 1;
    }
    double f1[64], fk[64], b1[64], bk[64], w1[64], wk[64];
    if (reps > 64) reps = 64;
    for (int r = -1; r < reps; r++) {   /* one warm-up round */
        for (int way = 0; way < 2; way++) {   /* 0: each alone, 1: combined */
            double w0 = wall_now(), t0 = cpu_now();
            if (way == 0) {
                for (int i = 0; i < k; i++)
                    if (ps_model_forward_range(m, 0, last, xs[i], b, 1, NULL, seeds[i], outs[i], &tapes[i], NULL, &err))
                        DIE("%s", err.msg);
            } else if (ps_model_forward_group(m, 0, last, k, xs, ns, seeds, outs, tapes, NULL, &err)) {
                DIE("%s", err.msg);
            }
            double t1 = cpu_now(), w1t = wall_now();
            for (int i = 0; i < k; i++)
                if (!(accs[i] = ps_grads_create(m, &err))) DIE("%s", err.msg);
            double w2t = wall_now(), t2 = cpu_now();
            if (way == 0) {
                for (int i = 0; i < k; i++)
                    if (ps_model_backward_acc(m, tapes[i], gs[i], NULL, accs[i], &err)) DIE("%s", err.msg);
            } else if (ps_model_backward_group(m, k, tapes, gs, gin, accs, &err)) {
                DIE("%s", err.msg);
            }
            double t3 = cpu_now(), w3 = wall_now();
            for (int i = 0; i < k; i++) {
                ps_grads_free(accs[i]);
                ps_tape_free(tapes[i]);
                tapes[i] = NULL;
            }
            if (r < 0) continue;
            double per = 1e6 / (double)(k * b);
            if (way == 0) { f1[r] = (t1 - t0) * per; b1[r] = (t3 - t2) * per; w1[r] = (w1t - w0 + w3 - w2t) * per; }
            else { fk[r] = (t1 - t0) * per; bk[r] = (t3 - t2) * per; wk[r] = (w1t - w0 + w3 - w2t) * per; }
        }
    }
    double mf1 = median(f1, reps), mfk = median(fk, reps), mb1 = median(b1, reps), mbk = median(bk, reps);
    printf("psd's compute alone, mnist_cnn on %s, %d thread(s): %d parts of %d samples, each alone vs combined "
           "(CPU us per sample, median of %d alternated rounds)\n", place ? place : backend, threads, k, b, reps);
    printf("  training forward:  alone %8.1f  combined %8.1f  combined/alone %.2f\n", mf1, mfk, mfk / mf1);
    printf("  backward:          alone %8.1f  combined %8.1f  combined/alone %.2f\n", mb1, mbk, mbk / mb1);
    printf("  forward+backward:  alone %8.1f  combined %8.1f  combined/alone %.2f\n", mf1 + mb1, mfk + mbk,
           (mfk + mbk) / (mf1 + mb1));
    if (place) {
        double a = median(w1, reps), c = median(wk, reps);
        printf("  forward+backward, wall us per sample:  alone %8.1f  combined %8.1f  combined/alone %.2f\n", a, c,
               c / a);
    }
    free(x); free(g); free(out); free(xs); free(gs); free(outs); free(gin); free(ns); free(seeds);
    free(tapes); free(accs);
    ps_model_free(m);
    return 0;
}
