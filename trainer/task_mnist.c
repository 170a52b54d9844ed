/* task_mnist.c - the "mnist" task: PyTorch's RPC parameter-server
 * tutorial (task.h).
 *
 * Loads MNIST-format IDX files (trainer.data). Each round is one batch:
 * remote Forward (train) under a fresh context id, local NLL loss and its
 * gradient, remote Backward, an optional gradient check, remote Step.
 * Evaluation runs the test set through remote Forward (eval) and prints the
 * accuracy. Every rank trains on all of the data, shuffled with its own
 * seed, as in the tutorial, or on its share with --shard.
 *
 * Stages on two servers (model.placement conv: ps0, fc: ps1, cluster.h):
 * Forward(conv) on its server -> Forward(fc) on the other -> the loss here
 * -> Backward(fc) with its input gradient back -> Backward(conv) with it ->
 * Step on both, one context id on both (ps_cluster_run). With both stages
 * on one server the single-call path below is used unchanged.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "mnist.h"
#include "modeldef.h"
#include "task.h"

#define MNIST_CLASSES 10
#define EVAL_BATCH 500 /* test images per evaluation Forward (<= the model's max batch) */
#define CONV_OUT 9216  /* floats per image between the stages: mnist_cnn's conv output, 64 x 12 x 12 */

typedef struct mnist_task {
    int shard;                 /* --shard */
    ps_mnist train, test;
    uint32_t first, ntrain;    /* this rank's training indices: first .. first+ntrain-1 */
    uint32_t *order;           /* (ntrain) this epoch's order */
    int bs, cap;               /* batch size; rows of the buffers */
    float *x;                  /* (cap, 1, rows, cols) */
    int64_t *y;                /* (cap) */
    float *lp;                 /* (cap, 10) log-probabilities */
    float *grad;               /* (bs, 10) d loss / d lp */
    int s_conv, s_fc;          /* servers of the stages when they differ (cluster.h); else -1 */
    float *act, *dact;         /* (cap, CONV_OUT) conv's output, its gradient (stages on two servers) */
    int one_noted;             /* --one-call that cannot apply here: said once */
} mnist_task;

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
    int fuse, one, check;
    const ps_wire_param_list *params;
    float *lp, *grad;
    double loss, grad_err;
    uint64_t version;
    int checked;
} batch_job;

static ps_status batch_step(void *arg, uint64_t ctx, ps_err *err);

static ps_status batch_once(void *arg, uint64_t ctx, int *kept, ps_err *err) {
    batch_job *j = arg;
    int64_t cols;
    if (j->one) {  /* --one-call: psd's cross-entropy on the model's log-probabilities is the NLL
                    * (log_softmax is idempotent), its backward and the step */
        *kept = PS_KEPT_STEP;  /* psd may have applied it though the reply is lost: ps_retry_once settles by Step */
        ps_client_fwd f = {.ctx = ctx, .rank = (uint32_t)j->rank, .train = 1,
                           .input = {PS_CLIENT_F32, 4, {j->n, 1, j->rows, j->cols}, j->x},
                           .targets = {PS_CLIENT_I64, 1, {j->n}, j->y}};
        return ps_client_train_step(j->cl, &f, &j->loss, &j->version, err);
    }
    ps_status st = ps_client_forward(j->cl, ctx, (uint32_t)j->rank, 1, j->x, j->n, 1, j->rows, j->cols, j->lp,
                                     (int64_t)j->cap * j->k, &cols, &j->version, err);
    if (st) return st;
    if (cols != j->k)
        return ps_err_set(err, PS_ERR_INTERNAL, "model returned %lld outputs, expected %d", (long long)cols, j->k);
    *kept = PS_KEPT_HELD;
    j->loss = nll_loss(j->lp, j->y, j->n, j->k, j->grad);
    int fused = j->fuse && !j->check;
    ps_client_scalar loss = {"loss", j->loss};   /* psd's round metrics and dashboard */
    if (fused) {   /* Backward with step: one round trip */
        uint32_t seq = 0;
        ps_client_tensor g = {PS_CLIENT_F32, 2, {j->n, j->k}, j->grad};
        ps_client_bwd bw = {.ctx = ctx, .n = 1, .seqs = &seq, .grads = &g, .step = 1, .scalars = &loss,
                            .nscalars = isfinite(j->loss)};
        ps_client_step_out so = {0};
        *kept = PS_KEPT_STEP;
        if ((st = ps_client_backward_ex(j->cl, &bw, &so, err))) return st;
        j->version = so.version;
        return PS_OK;
    }
    if ((st = ps_client_backward(j->cl, ctx, j->grad, j->n, j->k, 0, &j->version, err))) return st;
    if (j->check) {
        j->checked = 1;
        if (check_gradients(j->cl, ctx, j->params, j->lp, j->y, j->n, j->k, &j->grad_err))
            return ps_err_set(err, PS_ERR_INTERNAL, "gradient check failed");
    }
    *kept = PS_KEPT_STEP;
    return batch_step(j, ctx, err);
}

static void batch_release(void *arg, uint64_t ctx) {
    batch_job *j = arg;
    ps_client_release_context(j->cl, ctx, (uint32_t)j->rank, NULL, NULL);  /* best effort */
}

static ps_status batch_step(void *arg, uint64_t ctx, ps_err *err) {
    batch_job *j = arg;
    ps_client_scalar loss = {"loss", j->loss};
    ps_client_step_out so = {0};
    ps_status st = ps_client_step_full(j->cl, ctx, 0, 0.0f, &loss, isfinite(j->loss), &so, NULL, err);
    if (!st) j->version = so.version;
    return st;
}

/* The same batch with conv and fc on different servers: the activations
 * and their gradient travel through the trainer (ps_cluster_run). */
typedef struct chain_job {
    batch_job *j;
    int s_conv, s_fc;
    float *act, *dact;
} chain_job;

static ps_status chain_once(void *arg, ps_cluster_batch *b, ps_err *err) {
    chain_job *c = arg;
    batch_job *j = c->j;
    uint32_t seq = 0;
    ps_client_fwd f = {.rank = (uint32_t)j->rank, .stage = "conv",
                       .input = {PS_CLIENT_F32, 4, {j->n, 1, j->rows, j->cols}, j->x}};
    ps_client_fwd_out o = {.out = c->act, .out_cap = (int64_t)j->cap * CONV_OUT};
    ps_status st = ps_cluster_forward(b, c->s_conv, &f, &o, err);
    if (st) return st;
    int64_t acols = o.ndim == 2 ? o.dims[1] : 0;
    if (acols <= 0 || acols > CONV_OUT)
        return ps_err_set(err, PS_ERR_INTERNAL, "stage conv returned %d dims (%lld per image), expected (n, <= %d)",
                          o.ndim, (long long)acols, CONV_OUT);
    f = (ps_client_fwd){.rank = (uint32_t)j->rank, .stage = "fc", .input = {PS_CLIENT_F32, 2, {j->n, acols}, c->act}};
    o = (ps_client_fwd_out){.out = j->lp, .out_cap = (int64_t)j->cap * j->k};
    if ((st = ps_cluster_forward(b, c->s_fc, &f, &o, err))) return st;
    if (o.ndim != 2 || o.dims[1] != j->k)
        return ps_err_set(err, PS_ERR_INTERNAL, "stage fc returned %lld outputs, expected %d",
                          (long long)(o.ndim == 2 ? o.dims[1] : -1), j->k);
    j->loss = nll_loss(j->lp, j->y, j->n, j->k, j->grad);
    b->has_loss = 1;
    b->loss = j->loss;
    ps_client_tensor g = {PS_CLIENT_F32, 2, {j->n, j->k}, j->grad};
    float *ig[1] = {c->dact};
    int64_t icap[1] = {(int64_t)j->n * acols};
    ps_client_bwd bw = {.n = 1, .seqs = &seq, .grads = &g, .input_grads = ig, .input_caps = icap};
    if ((st = ps_cluster_backward(b, c->s_fc, &bw, err))) return st;
    g = (ps_client_tensor){PS_CLIENT_F32, 2, {j->n, acols}, c->dact};
    bw = (ps_client_bwd){.n = 1, .seqs = &seq, .grads = &g};
    return ps_cluster_backward(b, c->s_conv, &bw, err);
}

typedef struct eval_call {
    ps_client *cl;
    long rank;
    const float *x;
    int n, rows, cols;
    float *out;
    int64_t cap, out_cols;
} eval_call;

/* Evaluation through two servers: conv there, fc here. */
typedef struct eval_chain {
    ps_client *conv, *fc;
    long rank;
    const float *x;
    int n, rows, cols;
    float *act, *out;
    int64_t act_cap, cap, out_cols;
} eval_chain;

static ps_status eval_chain_forward(void *arg, ps_err *err) {
    eval_chain *e = arg;
    ps_client_fwd f = {.rank = (uint32_t)e->rank, .stage = "conv",
                       .input = {PS_CLIENT_F32, 4, {e->n, 1, e->rows, e->cols}, e->x}};
    ps_client_fwd_out o = {.out = e->act, .out_cap = e->act_cap};
    ps_status st = ps_client_forward_ex(e->conv, &f, &o, err);
    if (st) return st;
    if (o.ndim != 2) return ps_err_set(err, PS_ERR_INTERNAL, "stage conv returned %d dims, expected 2", o.ndim);
    f = (ps_client_fwd){.rank = (uint32_t)e->rank, .stage = "fc", .input = {PS_CLIENT_F32, 2, {e->n, o.dims[1]}, e->act}};
    o = (ps_client_fwd_out){.out = e->out, .out_cap = e->cap};
    if ((st = ps_client_forward_ex(e->fc, &f, &o, err))) return st;
    e->out_cols = o.ndim == 2 ? o.dims[1] : -1;
    return PS_OK;
}

static ps_status eval_forward(void *arg, ps_err *err) {
    eval_call *e = arg;
    return ps_client_forward(e->cl, 0, (uint32_t)e->rank, 0, e->x, e->n, 1, e->rows, e->cols, e->out, e->cap,
                             &e->out_cols, NULL, err);
}

static void *mnist_create(void) { return calloc(1, sizeof(mnist_task)); }

static void mnist_destroy(void *arg) {
    mnist_task *t = arg;
    if (!t) return;
    ps_mnist_free(&t->train);
    ps_mnist_free(&t->test);
    free(t->order);
    free(t->x);
    free(t->y);
    free(t->lp);
    free(t->grad);
    free(t->act);
    free(t->dact);
    free(t);
}

static ps_status mnist_set_flag(void *arg, const char *flag, const char *value, ps_err *err) {
    mnist_task *t = arg;
    (void)value;
    if (!strcmp(flag, "--shard")) {
        t->shard = 1;
        return PS_OK;
    }
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "mnist: unknown flag '%s'", flag);
}

static ps_status mnist_init(void *arg, const ps_task_env *env, ps_err *err) {
    mnist_task *t = arg;
    const ps_config *cfg = env->cfg;
    ps_status st;
    if ((st = ps_mnist_load(cfg->trainer.data, "train", &t->train, err)) ||
        (st = ps_mnist_load(cfg->trainer.data, "test", &t->test, err)))
        return st;
    /* The images must be what the model takes (one buffer serves both
     * splits): an IDX file of other dimensions is refused here, before any
     * RPC, instead of overflowing the buffer. */
    ps_model_def *def = ps_model_def_load("mnist_cnn", NULL, NULL);
    int64_t mr = 28, mc = 28;
    if (def && def->nstages > 0 && def->stages[0].in_ndim == 3 && !def->stages[0].in_keys[1] &&
        !def->stages[0].in_keys[2]) {
        mr = def->stages[0].in_dims[1];
        mc = def->stages[0].in_dims[2];
    }
    ps_model_def_free(def);
    const ps_mnist *sp[2] = {&t->train, &t->test};
    for (int i = 0; i < 2; i++)
        if (sp[i]->rows != mr || sp[i]->cols != mc)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: the %s images are %ux%u, but model mnist_cnn "
                              "takes %lldx%lld images (the %s images are %ux%u)", cfg->trainer.data,
                              i ? "test (t10k-images-idx3-ubyte)" : "training (train-images-idx3-ubyte)",
                              sp[i]->rows, sp[i]->cols, (long long)mr, (long long)mc, i ? "training" : "test",
                              sp[!i]->rows, sp[!i]->cols);
    t->bs = cfg->trainer.batch_size;
    t->cap = t->bs > EVAL_BATCH ? t->bs : EVAL_BATCH;
    size_t img = (size_t)t->train.rows * t->train.cols;
    /* Everything (like the tutorial) or this rank's share. */
    t->ntrain = t->train.n;
    t->first = 0;
    if (t->shard) {
        uint32_t per = t->train.n / (uint32_t)(env->world_size - 1);
        t->first = per * (uint32_t)(env->rank - 1);
        t->ntrain = env->rank == env->world_size - 1 ? t->train.n - t->first : per;
    }
    if (t->ntrain == 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: no training images for rank %ld", cfg->trainer.data,
                          env->rank);
    t->x = malloc((size_t)t->cap * img * sizeof(float));
    t->y = malloc((size_t)t->cap * sizeof(int64_t));
    t->lp = malloc((size_t)t->cap * MNIST_CLASSES * sizeof(float));
    t->grad = malloc((size_t)t->bs * MNIST_CLASSES * sizeof(float));
    t->order = malloc((size_t)t->ntrain * sizeof(uint32_t));
    if (!t->x || !t->y || !t->lp || !t->grad || !t->order)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    return PS_OK;
}

static ps_status mnist_begin_epoch(void *arg, const ps_task_env *env, int epoch, int *rounds, ps_err *err) {
    mnist_task *t = arg;
    (void)err;
    for (uint32_t i = 0; i < t->ntrain; i++) t->order[i] = t->first + i;
    ps_shuffle_u32(t->order, t->ntrain, env->cfg->trainer.seed + (uint64_t)env->rank + 1000003ULL * (uint64_t)epoch);
    *rounds = (int)((t->ntrain + (uint32_t)t->bs - 1) / (uint32_t)t->bs);
    return PS_OK;
}

/* Stages on two servers: which, and the buffers between them (once). */
static ps_status mnist_chain_setup(mnist_task *t, const ps_task_env *env, ps_err *err) {
    if (t->act) return PS_OK;
    t->s_conv = ps_cluster_stage_server(env->cluster, "conv");
    t->s_fc = ps_cluster_stage_server(env->cluster, "fc");
    if (t->s_conv < 0 || t->s_fc < 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "mnist: stages conv and fc must each be placed on one server "
                          "(model.placement.conv / .fc)");
    if (env->cfg->trainer.check_gradients)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "trainer.check_gradients needs conv and fc on one server "
                          "(here %s and %s)", ps_cluster_name(env->cluster, t->s_conv),
                          ps_cluster_name(env->cluster, t->s_fc));
    t->act = malloc((size_t)t->cap * CONV_OUT * sizeof(float));
    t->dact = malloc((size_t)t->cap * CONV_OUT * sizeof(float));
    if (!t->act || !t->dact) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    return PS_OK;
}

static ps_status mnist_run_round(void *arg, const ps_task_env *env, int epoch, int b, ps_task_round *out,
                                 ps_err *err) {
    mnist_task *t = arg;
    (void)epoch;
    uint32_t bs = (uint32_t)t->bs;
    int n = (int)((uint32_t)(b + 1) * bs <= t->ntrain ? bs : t->ntrain - (uint32_t)b * bs);
    ps_status st = ps_mnist_batch(&t->train, t->order + (size_t)b * bs, n, t->x, t->y, err);
    if (st) return st;
    int one = env->one_call && env->cl && !env->cfg->trainer.check_gradients;
    if (env->one_call == PS_ONE_CALL_ASKED && !one && !t->one_noted) {
        t->one_noted = 1;
        fprintf(stderr, "ps-train mnist: --one-call needs both stages on one server and no trainer.check_gradients; "
                "this run sends Forward, Backward and Step\n");
    }
    batch_job job = {.cl = env->cl, .rank = env->rank, .x = t->x, .y = t->y, .n = n, .rows = (int)t->train.rows,
                     .cols = (int)t->train.cols, .k = MNIST_CLASSES, .cap = t->cap, .fuse = env->fuse_step,
                     .one = one, .check = env->cfg->trainer.check_gradients, .params = env->params, .lp = t->lp,
                     .grad = t->grad};
    if (!env->cl) {  /* conv and fc on different servers */
        if ((st = mnist_chain_setup(t, env, err))) return st;
        chain_job cj = {.j = &job, .s_conv = t->s_conv, .s_fc = t->s_fc, .act = t->act, .dact = t->dact};
        ps_cluster_batch cb;
        if ((st = ps_cluster_run(env->cluster, env->retry, env->ids, "batch", chain_once, &cj, &cb, err))) return st;
        *out = (ps_task_round){.loss = job.loss, .samples = n, .version = cb.version};
        return PS_OK;
    }
    ps_once_ops ops = {.unit = "batch", .run = batch_once, .step = batch_step, .arg = &job, .marks_step = 1,
                       .release = batch_release};
    if ((st = ps_retry_once(env->retry, env->ids, &ops, err))) return st;
    if (job.checked && b % env->cfg->trainer.log_every == 0)
        printf("Rank %ld gradient check batch %d: %zu gradients OK, output bias max error %.2e\n", env->rank, b,
               env->params->n, job.grad_err);
    *out = (ps_task_round){.loss = job.loss, .samples = n, .version = job.version};
    return PS_OK;
}

/* Test-set accuracy with the server's current weights. */
static ps_status mnist_evaluate(void *arg, const ps_task_env *env, ps_err *err) {
    mnist_task *t = arg;
    const int k = MNIST_CLASSES;
    long correct = 0;
    ps_status st;
    for (uint32_t s = 0; s < t->test.n; s += EVAL_BATCH) {
        int n = (int)(t->test.n - s < EVAL_BATCH ? t->test.n - s : EVAL_BATCH);
        uint32_t idx[EVAL_BATCH];
        for (int i = 0; i < n; i++) idx[i] = s + (uint32_t)i;
        if ((st = ps_mnist_batch(&t->test, idx, n, t->x, t->y, err))) return st;
        ps_retry_reset(env->retry);
        int64_t out_cols;
        if (!env->cl) {
            if ((st = mnist_chain_setup(t, env, err))) return st;
            eval_chain ec = {.conv = ps_cluster_client(env->cluster, t->s_conv),
                             .fc = ps_cluster_client(env->cluster, t->s_fc), .rank = env->rank, .x = t->x, .n = n,
                             .rows = (int)t->test.rows, .cols = (int)t->test.cols, .act = t->act, .out = t->lp,
                             .act_cap = (int64_t)t->cap * CONV_OUT, .cap = (int64_t)t->cap * k};
            if ((st = ps_retry_call(env->retry, "evaluation Forward", eval_chain_forward, &ec, err))) return st;
            out_cols = ec.out_cols;
        } else {
            eval_call ec = {.cl = env->cl, .rank = env->rank, .x = t->x, .n = n, .rows = (int)t->test.rows,
                            .cols = (int)t->test.cols, .out = t->lp, .cap = (int64_t)t->cap * k};
            if ((st = ps_retry_call(env->retry, "evaluation Forward", eval_forward, &ec, err))) return st;
            out_cols = ec.out_cols;
        }
        if (out_cols != k)
            return ps_err_set(err, PS_ERR_INTERNAL, "model returned %lld outputs, expected %d", (long long)out_cols, k);
        for (int i = 0; i < n; i++) {
            int best = 0;
            for (int c = 1; c < k; c++)
                if (t->lp[(size_t)i * k + c] > t->lp[(size_t)i * k + best]) best = c;
            correct += best == t->y[i];
        }
    }
    printf("Rank %ld accuracy: %.2f%% (%ld/%u test images)\n", env->rank, 100.0 * correct / t->test.n, correct,
           t->test.n);
    return PS_OK;
}

static const ps_task_flag mnist_flags[] = {
    {"--data", "-d", "DIR", "trainer.data", "directory with MNIST IDX files (trainer.data)"},
    {"--batch-size", "-b", "N", "trainer.batch_size", "samples per batch, 1..512 (trainer.batch_size)"},
    {"--check-gradients", NULL, NULL, "trainer.check_gradients",
     "fetch each batch's gradients and verify them (trainer.check_gradients)"},
    {"--shard", NULL, NULL, NULL, "train on this rank's 1/(world_size-1) share of the data"},
    {0},
};

const ps_task ps_task_mnist = {
    .name = "mnist",
    .description = "PyTorch's RPC parameter-server tutorial: the MNIST CNN on IDX files",
    .unit = "batch",
    .flags = mnist_flags,
    .create = mnist_create,
    .set_flag = mnist_set_flag,
    .init = mnist_init,
    .begin_epoch = mnist_begin_epoch,
    .run_round = mnist_run_round,
    .evaluate = mnist_evaluate,
    .destroy = mnist_destroy,
};
