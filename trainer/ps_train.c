/* ps-train - the trainer CLI (one process per trainer rank).
 *
 * Loads MNIST-format IDX files, and for every batch: remote Forward (train)
 * under a fresh context id, local NLL loss and its gradient, remote
 * Backward, an optional gradient check, remote Step. Then evaluates the
 * test set with remote Forward (eval) and prints the accuracy. Mirrors
 * PyTorch's RPC parameter-server tutorial's trainer, with the server
 * address instead of a master address and port.
 */
#include <errno.h>
#include <grpc/grpc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "config.h"
#include "log.h"
#include "mnist.h"
#include "ps_client.h"
#include "retry.h"
#include "rng.h"
#include "security.h"
#include "status_cmd.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ps-train [options]\n"
            "       ps-train status [--server ADDR]   print a running psd's status\n"
            "  -c, --config FILE        cluster config (YAML); flags override it\n"
            "  -s, --server ADDR        psd address host:port (server.address)\n"
            "  -r, --rank N             this trainer's rank, 1..world_size-1 (default 1)\n"
            "  -w, --world-size N       the PS plus all trainers (trainer.world_size)\n"
            "  -d, --data DIR           directory with MNIST IDX files (trainer.data)\n"
            "  -e, --epochs N           passes over the training set (trainer.epochs)\n"
            "  -b, --batch-size N       samples per batch (trainer.batch_size)\n"
            "      --log-every N        batches between 'training batch' lines (trainer.log_every)\n"
            "      --seed N             shuffling seed; each rank adds its rank (trainer.seed)\n"
            "      --check-gradients    fetch each batch's gradients and verify them (trainer.check_gradients)\n"
            "      --shard              train on this rank's 1/(world_size-1) share of the data\n"
            "      --fuse-step          send Backward and Step as one RPC\n"
            "      --max-batches N      stop each epoch after N batches (quick runs)\n"
            "      --wait-s S           wait up to S seconds for psd to come up (default 30)\n"
            "      --status             print psd's status (model version, contexts, counters) and exit\n"
            "      --set KEY=VALUE      override any config key\n"
            "  -V, --version            print the version and exit\n"
            "  -h, --help               this help\n");
}

/* Strict integer parse of a flag value. */
static int parse_long(const char *flag, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "ps-train: %s: '%s' is not an integer in %ld..%ld\n", flag, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* NLL loss (mean) of log-probabilities lp (n, k) and its gradient. */
static double nll_loss(const float *lp, const int64_t *y, int n, int k, float *grad) {
    double loss = 0;
    memset(grad, 0, (size_t)n * k * sizeof(float));
    for (int i = 0; i < n; i++) {
        loss -= lp[(size_t)i * k + y[i]];
        grad[(size_t)i * k + y[i]] = -1.0f / n;
    }
    return loss / n;
}

/* The gradient check: every parameter's gradient arrives with the name and
 * shape ListParameters announced and finite values, and the last layer's
 * bias gradient equals what the trainer derives on its own from the
 * log-probabilities: d loss / d fc2.bias = sum_i (softmax_i - onehot_i) / n. */
static int check_gradients(ps_client *cl, uint64_t ctx, const ps_wire_param_list *params, const float *lp,
                           const int64_t *y, int n, int k, double *max_err) {
    ps_err err = {0};
    ps_wire_tensor_list g;
    if (ps_client_get_gradients(cl, ctx, &g, &err)) {
        fprintf(stderr, "ps-train: gradient check: %s\n", err.msg);
        ps_wire_tensor_list_free(&g);
        return -1;
    }
    int ok = g.n == params->n;
    if (!ok) fprintf(stderr, "ps-train: gradient check: %zu gradients for %zu parameters\n", g.n, params->n);
    *max_err = 0;
    for (size_t i = 0; ok && i < g.n; i++) {
        const ps_ParameterInfo *p = &params->items[i];
        int same = !strcmp(g.items[i].name, p->name) && g.items[i].ndim == (int)p->shape_count;
        for (int d = 0; same && d < g.items[i].ndim; d++) same = g.items[i].dims[d] == p->shape[d];
        if (!same) {
            fprintf(stderr, "ps-train: gradient check: gradient %zu is '%s', expected '%s' with its shape\n", i,
                    g.items[i].name, p->name);
            ok = 0;
            break;
        }
        size_t cnt = g.items[i].bytes / sizeof(float);
        for (size_t j = 0; j < cnt; j++)
            if (!isfinite(g.items[i].data[j])) {
                fprintf(stderr, "ps-train: gradient check: %s[%zu] is not finite\n", p->name, j);
                ok = 0;
                break;
            }
        if (ok && i == g.n - 1 && cnt == (size_t)k) {  /* the output layer's bias */
            for (int c = 0; c < k; c++) {
                double want = 0;
                for (int s = 0; s < n; s++) want += (exp(lp[(size_t)s * k + c]) - (y[s] == c)) / n;
                double e = fabs(want - g.items[i].data[c]);
                if (e > *max_err) *max_err = e;
            }
            if (*max_err > 1e-4) {
                fprintf(stderr, "ps-train: gradient check: %s differs from the local value by %.3g\n", p->name,
                        *max_err);
                ok = 0;
            }
        }
    }
    ps_wire_tensor_list_free(&g);
    return ok ? 0 : -1;
}

/* One training batch under one context id: Forward, local loss, Backward,
 * optional gradient check, Step; run by ps_retry_once (retry.h), which
 * retries, settles an unanswered step and re-runs a lost batch. */
typedef struct batch_job {
    ps_client *cl;
    long rank;
    const float *x;
    const int64_t *y;
    int n, rows, cols, k, cap;
    int fuse, check;
    const ps_wire_param_list *params;
    float *lp, *grad;
    double loss, grad_err;
    uint64_t version;
    int checked;
} batch_job;

static ps_status batch_once(void *arg, uint64_t ctx, int *kept, ps_err *err) {
    batch_job *j = arg;
    int64_t cols;
    ps_status st = ps_client_forward(j->cl, ctx, (uint32_t)j->rank, 1, j->x, j->n, 1, j->rows, j->cols, j->lp,
                                     (int64_t)j->cap * j->k, &cols, &j->version, err);
    if (st) return st;
    if (cols != j->k)
        return ps_err_set(err, PS_ERR_INTERNAL, "model returned %lld outputs, expected %d", (long long)cols, j->k);
    *kept = 1;
    j->loss = nll_loss(j->lp, j->y, j->n, j->k, j->grad);
    int fused = j->fuse && !j->check;
    if ((st = ps_client_backward(j->cl, ctx, j->grad, j->n, j->k, fused, &j->version, err))) return st;
    if (j->check) {
        j->checked = 1;
        if (check_gradients(j->cl, ctx, j->params, j->lp, j->y, j->n, j->k, &j->grad_err))
            return ps_err_set(err, PS_ERR_INTERNAL, "gradient check failed");
    }
    if (!fused) st = ps_client_step(j->cl, ctx, &j->version, err);
    return st;
}

static ps_status batch_step(void *arg, uint64_t ctx, ps_err *err) {
    batch_job *j = arg;
    return ps_client_step(j->cl, ctx, &j->version, err);
}

typedef struct eval_call {
    ps_client *cl;
    long rank;
    const float *x;
    int n, rows, cols;
    float *out;
    int64_t cap, out_cols;
} eval_call;

static ps_status eval_forward(void *arg, ps_err *err) {
    eval_call *e = arg;
    return ps_client_forward(e->cl, 0, (uint32_t)e->rank, 0, e->x, e->n, 1, e->rows, e->cols, e->out, e->cap,
                             &e->out_cols, NULL, err);
}

static int print_status(ps_client *cl, ps_err *err) {
    ps_StatusResponse st;
    if (ps_client_status(cl, &st, err)) return -1;
    printf("address: %s\nversion: %s\nmodel: %s\nuptime_s: %.1f\nmodel_version: %llu\n"
           "live_contexts: %llu\nexpired_contexts: %llu\ntrainers_seen: %llu\nsamples: %llu\n"
           "nonfinite_policy: %s\nnonfinite_rejected: %llu\nnonfinite_skipped: %llu\nconsistency: %s\n",
           ps_client_target(cl), st.version, st.model, st.uptime_s, (unsigned long long)st.model_version,
           (unsigned long long)st.live_contexts, (unsigned long long)st.expired_contexts,
           (unsigned long long)st.trainers_seen, (unsigned long long)st.samples, st.nonfinite_policy,
           (unsigned long long)st.nonfinite_rejected, (unsigned long long)st.nonfinite_skipped, st.consistency);
    return 0;
}

int main(int argc, char **argv) {
    ps_log_set_prog("ps-train");
    if (argc > 1 && !strcmp(argv[1], "status")) return ps_status_cmd_main(argc - 1, argv + 1);
    ps_config cfg;
    ps_config_defaults(&cfg);
    ps_err err = {0};
    long rank = 1, max_batches = 0, wait_s = 30;
    int shard = 0, fuse = 0, status_only = 0;
    const char *config_path = NULL;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v = ps_cli_value(argc, argv, &i, "--config", "-c", &missing);
        if (v) config_path = v;
        if (missing) { fprintf(stderr, "ps-train: %s needs a value\n", argv[i]); return 2; }
    }
    if (config_path && ps_config_load(&cfg, config_path, &err)) {
        fprintf(stderr, "ps-train: %s\n", err.msg);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v, *a = argv[i], *key = NULL;
        char kv[512];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "-V") || !strcmp(a, "--version")) { printf("ps-train %s\n", PS_VERSION); return 0; }
        if (!strcmp(a, "--check-gradients")) { key = "trainer.check_gradients"; v = "true"; }
        else if (!strcmp(a, "--shard")) { shard = 1; continue; }
        else if (!strcmp(a, "--status")) { status_only = 1; continue; }
        else if (!strcmp(a, "--fuse-step")) { fuse = 1; continue; }
        else if ((v = ps_cli_value(argc, argv, &i, "--config", "-c", &missing))) continue;
        else if ((v = ps_cli_value(argc, argv, &i, "--rank", "-r", &missing))) {
            if (parse_long("--rank", v, 1, 1023, &rank)) return 2;
            continue;
        } else if ((v = ps_cli_value(argc, argv, &i, "--max-batches", NULL, &missing))) {
            if (parse_long("--max-batches", v, 1, 1L << 30, &max_batches)) return 2;
            continue;
        } else if ((v = ps_cli_value(argc, argv, &i, "--wait-s", NULL, &missing))) {
            if (parse_long("--wait-s", v, 0, 3600, &wait_s)) return 2;
            continue;
        }
        else if ((v = ps_cli_value(argc, argv, &i, "--server", "-s", &missing))) key = "server.address";
        else if ((v = ps_cli_value(argc, argv, &i, "--world-size", "-w", &missing))) key = "trainer.world_size";
        else if ((v = ps_cli_value(argc, argv, &i, "--data", "-d", &missing))) key = "trainer.data";
        else if ((v = ps_cli_value(argc, argv, &i, "--epochs", "-e", &missing))) key = "trainer.epochs";
        else if ((v = ps_cli_value(argc, argv, &i, "--batch-size", "-b", &missing))) key = "trainer.batch_size";
        else if ((v = ps_cli_value(argc, argv, &i, "--log-every", NULL, &missing))) key = "trainer.log_every";
        else if ((v = ps_cli_value(argc, argv, &i, "--seed", NULL, &missing))) key = "trainer.seed";
        else if ((v = ps_cli_value(argc, argv, &i, "--set", NULL, &missing))) {
            const char *val = ps_cli_split_kv(v, kv, sizeof kv);
            if (!val) { fprintf(stderr, "ps-train: --set needs KEY=VALUE, got '%s'\n", v); return 2; }
            key = kv;
            v = val;
        }
        if (missing) { fprintf(stderr, "ps-train: %s needs a value\n", a); return 2; }
        if (!key) { fprintf(stderr, "ps-train: unknown option '%s' (see ps-train --help)\n", a); return 2; }
        if (ps_config_set(&cfg, key, v, "command line", &err)) { fprintf(stderr, "ps-train: %s\n", err.msg); return 2; }
    }
    int world = cfg.trainer.world_size;
    if (rank >= world) {
        fprintf(stderr, "ps-train: --rank %ld is not a trainer rank of world size %d (trainers are 1..%d; "
                "rank 0 is the parameter server)\n", rank, world, world - 1);
        return 2;
    }
    int bs = cfg.trainer.batch_size;
    ps_security sec;
    if (ps_security_client(&cfg, &sec, &err)) { fprintf(stderr, "ps-train: %s\n", err.msg); return 2; }
    if (status_only) {
        grpc_init();
        ps_client *sc = ps_client_create_secure(cfg.server.address, (int)(cfg.trainer.rpc_timeout_s * 1000),
                                                cfg.server.max_message_mb << 20, &sec.rpc, &err);
        int src = sc && print_status(sc, &err) == 0 ? 0 : 1;
        if (src) fprintf(stderr, "ps-train: %s\n", err.msg);
        ps_client_free(sc);
        ps_security_free(&sec);
        grpc_shutdown();
        return src;
    }

    ps_mnist train = {0}, test = {0};
    if (ps_mnist_load(cfg.trainer.data, "train", &train, &err) ||
        ps_mnist_load(cfg.trainer.data, "test", &test, &err)) {
        fprintf(stderr, "ps-train: %s\n", err.msg);
        return 1;
    }

    grpc_init();
    int rc = 1;
    ps_client *cl = ps_client_create_secure(cfg.server.address, (int)(cfg.trainer.rpc_timeout_s * 1000),
                                            cfg.server.max_message_mb << 20, &sec.rpc, &err);
    ps_wire_param_list params = {0};
    float *x = NULL, *lp = NULL, *grad = NULL;
    int64_t *y = NULL;
    uint32_t *order = NULL;
    if (!cl) { fprintf(stderr, "ps-train: %s\n", err.msg); goto out; }

    /* Wait for psd, then learn the model's parameters (the tutorial's RRefs). */
    char model[64] = "";
    double t_wait = now_s();
    for (;;) {
        ps_wire_param_list_free(&params);
        if (ps_client_list_parameters(cl, &params, model, sizeof model, &err) == PS_OK) break;
        if (err.code != PS_ERR_UNAVAILABLE || now_s() - t_wait > wait_s) {
            fprintf(stderr, "ps-train: rank %ld: cannot reach psd: %s\n", rank, err.msg);
            goto out;
        }
        usleep(200 * 1000);
    }
    int64_t nweights = 0;
    for (size_t i = 0; i < params.n; i++) {
        int64_t c = 1;
        for (pb_size_t d = 0; d < params.items[i].shape_count; d++) c *= params.items[i].shape[d];
        nweights += c;
    }
    printf("Rank %ld: connected to psd at %s: model %s, %zu parameter tensors (%lld weights)\n", rank,
           cfg.server.address, model, params.n, (long long)nweights);
    fflush(stdout);

    const int k = 10;
    int img = (int)(train.rows * train.cols);
    int evb = 500;
    int cap = bs > evb ? bs : evb;
    x = malloc((size_t)cap * img * sizeof(float));
    y = malloc((size_t)cap * sizeof(int64_t));
    lp = malloc((size_t)cap * k * sizeof(float));
    grad = malloc((size_t)bs * k * sizeof(float));
    /* This rank's training indices: everything (like the tutorial) or its share. */
    uint32_t ntrain = train.n, first = 0;
    if (shard) {
        uint32_t per = train.n / (uint32_t)(world - 1);
        first = per * (uint32_t)(rank - 1);
        ntrain = rank == world - 1 ? train.n - first : per;
    }
    order = malloc((size_t)ntrain * sizeof(uint32_t));
    if (!x || !y || !lp || !grad || !order) { fprintf(stderr, "ps-train: out of memory\n"); goto out; }

    ps_ctx_ids ids;
    ps_ctx_ids_init(&ids);
    uint64_t version = 0;
    char who[64];
    snprintf(who, sizeof who, "ps-train: rank %ld", rank);
    ps_retry_policy rp = {.max_s = cfg.trainer.retry_max_s, .backoff_s = cfg.trainer.retry_backoff_s,
                          .backoff_max_s = cfg.trainer.retry_backoff_max_s, .seed = ids.base ^ (uint64_t)rank,
                          .who = who, .log = stderr};
    ps_retry rt;
    ps_retry_init(&rt, &rp);
    int tty = isatty(STDERR_FILENO);
    int nbatches = (int)((ntrain + bs - 1) / bs);
    if (max_batches && max_batches < nbatches) nbatches = (int)max_batches;
    double t0 = now_s();
    long samples = 0;
    double last_loss = 0;
    for (int ep = 0; ep < cfg.trainer.epochs; ep++) {
        for (uint32_t i = 0; i < ntrain; i++) order[i] = first + i;
        ps_shuffle_u32(order, ntrain, cfg.trainer.seed + (uint64_t)rank + 1000003ULL * (uint64_t)ep);
        for (int b = 0; b < nbatches; b++) {
            int n = (int)((uint32_t)(b + 1) * bs <= ntrain ? (uint32_t)bs : ntrain - (uint32_t)b * bs);
            if (ps_mnist_batch(&train, order + (size_t)b * bs, n, x, y, &err)) {
                fprintf(stderr, "ps-train: %s\n", err.msg);
                goto out;
            }
            batch_job job = {.cl = cl, .rank = rank, .x = x, .y = y, .n = n, .rows = (int)train.rows,
                             .cols = (int)train.cols, .k = k, .cap = cap, .fuse = fuse,
                             .check = cfg.trainer.check_gradients, .params = &params, .lp = lp, .grad = grad};
            ps_once_ops ops = {.unit = "batch", .run = batch_once, .step = batch_step, .arg = &job};
            if (ps_retry_once(&rt, &ids, &ops, &err)) goto rpc_fail;
            last_loss = job.loss;
            version = job.version;
            if (job.checked && b % cfg.trainer.log_every == 0)
                printf("Rank %ld gradient check batch %d: %zu gradients OK, output bias max error %.2e\n",
                       rank, b, params.n, job.grad_err);
            samples += n;
            if (b % cfg.trainer.log_every == 0) {
                if (tty) fprintf(stderr, "\r\033[K");
                printf("Rank %ld training batch %d loss %.6f\n", rank, b, last_loss);
                fflush(stdout);
            }
            if (tty) {
                double el = now_s() - t0;
                fprintf(stderr, "\r\033[K[rank %ld] epoch %d/%d batch %d/%d loss %.4f  %.0f samples/s  model v%llu",
                        rank, ep + 1, cfg.trainer.epochs, b + 1, nbatches, last_loss, el > 0 ? samples / el : 0.0,
                        (unsigned long long)version);
            }
        }
    }
    double secs = now_s() - t0;
    if (tty) fprintf(stderr, "\r\033[K");
    printf("Training complete!\n");
    printf("Rank %ld: %ld samples in %.1f s (%.0f samples/s)\n", rank, samples, secs, secs > 0 ? samples / secs : 0.0);
    if (rt.total) printf("Rank %ld: %ld RPC retries\n", rank, rt.total);
    fflush(stdout);

    /* Test-set accuracy with the server's current weights. */
    long correct = 0;
    for (uint32_t s = 0; s < test.n; s += (uint32_t)evb) {
        int n = (int)(test.n - s < (uint32_t)evb ? test.n - s : (uint32_t)evb);
        uint32_t idx[500];
        for (int i = 0; i < n; i++) idx[i] = s + (uint32_t)i;
        if (ps_mnist_batch(&test, idx, n, x, y, &err)) { fprintf(stderr, "ps-train: %s\n", err.msg); goto out; }
        ps_retry_reset(&rt);
        eval_call ec = {.cl = cl, .rank = rank, .x = x, .n = n, .rows = (int)test.rows, .cols = (int)test.cols,
                        .out = lp, .cap = (int64_t)cap * k};
        if (ps_retry_call(&rt, "evaluation Forward", eval_forward, &ec, &err)) goto rpc_fail;
        for (int i = 0; i < n; i++) {
            int best = 0;
            for (int c = 1; c < k; c++)
                if (lp[(size_t)i * k + c] > lp[(size_t)i * k + best]) best = c;
            correct += best == y[i];
        }
    }
    printf("Rank %ld accuracy: %.2f%% (%ld/%u test images)\n", rank, 100.0 * correct / test.n, correct, test.n);
    rc = 0;
    goto out;
rpc_fail:
    if (tty) fprintf(stderr, "\r\033[K");
    fprintf(stderr, "ps-train: rank %ld: %s\n", rank, err.msg);
out:
    free(x); free(y); free(lp); free(grad); free(order);
    ps_wire_param_list_free(&params);
    ps_client_free(cl);
    ps_security_free(&sec);
    ps_mnist_free(&train);
    ps_mnist_free(&test);
    grpc_shutdown();
    return rc;
}
