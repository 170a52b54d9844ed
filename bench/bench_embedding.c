/* bench_embedding - the row-sparse embedding update rate as the table grows.
 *
 * rnn_lm's stage emb (encoder Embedding + dropout) in process: a training
 * forward of a (35, 20) window of random ids, its backward (row-sparse
 * gradient) and the SGD step that touches only those rows, repeated for
 * SECS seconds after a warm-up, for each table size given. Prints, per
 * size, windows/s and the ratio to the first size:
 *
 *   embedding rows=1000000 dim=200 windows/s=1234.5 ratio=0.97
 *
 * usage: bench_embedding [--secs S] [--dim D] ROWS...   (default 10000 1000000)
 * A parameter server's point: a table 100x larger keeps (nearly) the update
 * rate, since only the batch's rows are read and written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "clock.h"
#include "model.h"
#include "rng.h"

static int run(long rows, int dim, double secs, double *rate) {
    ps_err err = {0};
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = "dnnl", .seed = 1, .lr = 20.0f, .n_sizes = 4,
                       .size_key = {"ntoken", "ninp", "nhid", "dropout"}, .size_value = {(double)rows, dim, dim, 0.2}};
    ps_model *m = ps_model_create(&o, &err);
    if (!m) { fprintf(stderr, "bench_embedding: %s\n", err.msg); return 1; }
    enum { T = 35, N = 20, NS = T * N };
    int64_t ids[NS];
    float *out = malloc((size_t)NS * dim * sizeof(float)), *g = malloc((size_t)NS * dim * sizeof(float));
    for (int i = 0; i < NS * dim; i++) g[i] = 1e-3f * (float)((i * 7919) % 1000 - 500);
    ps_rng r;
    ps_rng_seed(&r, 7);
    long n = 0;
    double t0 = 0;
    for (long it = 0;; it++) {
        if (it == 20) t0 = ps_mono_s();
        if (it > 20 && ps_mono_s() - t0 >= secs) break;
        for (int i = 0; i < NS; i++) ids[i] = (int64_t)ps_rng_below(&r, (uint64_t)rows);
        ps_tape *tape = NULL;
        ps_grads *acc = ps_grads_create(m, &err);
        uint64_t v;
        if (!acc || ps_model_forward_range(m, 0, 0, ids, NS, 1, NULL, (uint64_t)it, out, &tape, NULL, &err) ||
            ps_model_backward_acc(m, tape, g, NULL, acc, &err) || ps_model_step_grads(m, acc, &v, &err)) {
            fprintf(stderr, "bench_embedding: %s\n", err.msg);
            return 1;
        }
        ps_tape_free(tape);
        ps_grads_free(acc);
        if (it >= 20) n++;
    }
    *rate = n / (ps_mono_s() - t0);
    free(out);
    free(g);
    ps_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    double secs = 3;
    long dim = 200;
    long sizes[16];
    int ns = 0;
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        if (!strcmp(argv[i], "--secs") && i + 1 < argc) bad = ps_cli_double("bench_embedding", "--secs", argv[++i], 0.01, 3600, &secs);
        else if (!strcmp(argv[i], "--dim") && i + 1 < argc) bad = ps_cli_long("bench_embedding", "--dim", argv[++i], 1, 65536, &dim);
        else if (ns < 16) bad = ps_cli_long("bench_embedding", "ROWS", argv[i], 1, 1L << 30, &sizes[ns++]);
        if (bad) return 2;
    }
    if (!ns) sizes[ns++] = 10000, sizes[ns++] = 1000000;
    double first = 0;
    for (int k = 0; k < ns; k++) {
        double rate;
        if (run(sizes[k], dim, secs, &rate)) return 1;
        if (!k) first = rate;
        printf("embedding rows=%ld dim=%ld windows/s=%.1f ratio=%.3f\n", sizes[k], dim, rate, rate / first);
        fflush(stdout);
    }
    return 0;
}
