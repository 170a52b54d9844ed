/* task_fit.c - the "fit" task: train whatever model psd hosts on a data set
 * from files, with a loss from the table (task.h, docs/fit.md).
 *
 * Data: --inputs and --labels (trainer/dataset.h: IDX, .npy, .npz,
 * safetensors), optionally --test-inputs/--test-labels; `--labels inputs`
 * makes each sample's input, converted as the model receives it
 * (--input-scale, --input-mean, --input-std), its own target (an
 * autoencoder's; dense losses only; the test inputs likewise); a seeded
 * --val-fraction of the training samples is held out (the same samples on
 * every rank); each rank trains on its 1/(world_size-1) share of the rest
 * (--all-data: on all of it), shuffled per epoch with its seed.
 *
 * The model: after connecting, ListParameters of every server gives the
 * stages (per-sample input shape and dtype, output shape); the data is
 * checked against the first stage's input and the last stage's output
 * (trainer/fit_data.h) before any training call. The stages form hops: a
 * run of consecutive stages on one server is one Forward (stage .. last
 * stage); with one server hosting everything, the single hop is the whole
 * model. An embedding stage sharded by rows can only be the first (its
 * input is ids): each shard gets the batch's ids in its rows and its rows
 * are scattered back, as the lm task does.
 *
 * A round is one batch under one context id: Forward through the hops
 * (each hop's output is the next one's input; seq = the hop's index), the
 * loss here (trainer/losses.h), Backward from the last hop to the first
 * (each returning its input gradient to the hop before), then Step on every
 * server touched: ps_retry_once on one server (with --fuse-step the last
 * Backward carries the step), ps_cluster_run over several (partial steps as
 * retry.h says). --lr rides on the Steps' grad_scale (lr / optimizer.lr:
 * exact for SGD without weight decay, momentum included); a list gives
 * each epoch its own (the last repeats): the gradients of that epoch are
 * scaled, so momentum carries earlier steps in gradient units - PyTorch's
 * SGD with the loss scaled the same way, which
 * examples/models/train_small_resnet.py does).
 *
 * Class losses take --ignore-index (PyTorch's ignore_index: the mean and
 * accuracy over the other targets; a batch of ignored targets only is 0
 * with a zero gradient and left out of the epoch's mean) and --class-dim
 * last (a sequence model's (N, T, V) logits against (N, T) labels:
 * ps_fit_check_class). psd's fused loss (--one-call) has no ignore_index,
 * so such a run sends Forward, Backward and Step, saying so.
 *
 * After each epoch: the mean training loss of its batches, and loss and
 * accuracy (class losses, bce_with_logits) on the held-out split (or the
 * test files when there is no split); at the end: on the test files (or
 * the split), through eval-mode Forwards (BatchNorm's running statistics,
 * no dropout).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster.h"
#include "dataset.h"
#include "fit_data.h"
#include "losses.h"
#include "mnist.h"
#include "task.h"

#define FIT_MAX_STAGES 8
#define FIT_MAX_SHARDS 8
#define FIT_EVAL_BYTES ((int64_t)8 << 20)
#define FIT_EVAL_MAX 1024

typedef struct fit_hop {
    int server;                       /* -1: a sharded first stage */
    char first[32], last[32];         /* "" "" = every stage the server hosts (one hop) */
    int in_int64;
    int in_ndim;                      /* the hop's batch input, batch dim included */
    int64_t in_dims[PS_FIT_MAX_DIMS];
    int64_t in_numel, out_numel;      /* per sample */
    /* sharded */
    int n_shards;
    int shard_server[FIT_MAX_SHARDS];
    int64_t shard_lo[FIT_MAX_SHARDS], shard_hi[FIT_MAX_SHARDS], rows;
    int64_t width;                    /* floats per id (the embedding's dim) */
    float *out, *grad;                /* (cap, out_numel) */
} fit_hop;

typedef struct fit_task {
    /* flags */
    char inputs[1024], labels[1024], test_inputs[1024], test_labels[1024];   /* inputs: the names, in messages */
    /* --inputs / --test-inputs given once per input of a model of several (joined: ps_fit_join) */
    char in_spec[2][PS_FIT_MAX_INPUTS][1024];
    int n_in[2];
    int norm_given;                   /* --input-scale, --input-mean or --input-std */
    const ps_loss *loss;
    ps_fit_class cls;                 /* --ignore-index, --class-dim */
    int cls_given;                    /* either flag: class losses only */
    double val_fraction;
    double lr[PS_FIT_MAX_CHANNELS];   /* --lr: per epoch, the last repeats; nlr 0: optimizer.lr */
    int nlr;
    int all_data, eval_only;
    size_t max_bytes;
    ps_fit_norm norm;
    /* data */
    ps_array x, y, tx, ty;            /* y, ty empty with labels_in */
    int labels_in;                    /* --labels inputs: the converted inputs are the targets */
    int have_test;
    uint32_t *train, *val, ntrain, nval, *order;
    uint32_t *test_idx;
    /* the model */
    int ready;
    int one_noted;                    /* --one-call that cannot apply: said once */
    ps_fit_model model;
    ps_fit_layout lay, tlay;
    char stage0[32];
    int nhops;
    fit_hop hops[FIT_MAX_STAGES];
    double grad_scale;                /* this epoch's --lr / optimizer.lr; 1 without --lr */
    /* buffers */
    int bs, ebs, cap;                 /* training and evaluation batch sizes; rows of the buffers */
    float *xf;                        /* (cap, x_numel) float inputs */
    int64_t *xi;                      /* (cap, x_numel) int64 inputs */
    void *tgt;                        /* (cap, y_numel) int64 or float targets */
    int64_t *sh_ids, *sh_pos;         /* sharded first hop: (cap * rows) */
    float *sh_rows;                   /* (cap * rows, width) */
    /* epoch */
    double epoch_loss;
    long epoch_batches;
    long epoch_empty;                 /* batches whose targets were all --ignore-index: no loss, not in the mean */
} fit_task;

/* The labels of the training (test 0) or test files: with labels_in, the
 * inputs themselves (fill_batch converts them as inputs). */
static const ps_array *labels_of(fit_task *t, int test) {
    return t->labels_in ? (test ? &t->tx : &t->x) : test ? &t->ty : &t->y;
}

/* ---- flags ------------------------------------------------------------- */

static ps_status parse_list(const char *flag, const char *v, double *out, int *n, ps_err *err) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", v);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == PS_FIT_MAX_CHANNELS)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: more than %d values", flag, PS_FIT_MAX_CHANNELS);
        ps_status st = ps_parse_double(flag, tok, -1e300, 1e300, 0, &out[*n], err);
        if (st) return st;
        (*n)++;
    }
    if (!*n) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s needs a number or a comma-separated list", flag);
    return PS_OK;
}

static ps_status fit_set_flag(void *arg, const char *flag, const char *v, ps_err *err) {
    fit_task *t = arg;
    struct { const char *flag; char *dst; } paths[] = {
        {"--inputs", t->inputs}, {"--labels", t->labels}, {"--test-inputs", t->test_inputs},
        {"--test-labels", t->test_labels},
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (!strcmp(flag, paths[i].flag)) {
            if (strlen(v) >= sizeof t->inputs) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: path too long", flag);
            int test = !strcmp(flag, "--test-inputs");
            if (test || !strcmp(flag, "--inputs")) {   /* once per input of the model, in forward's order */
                int *k = &t->n_in[test];
                if (*k == PS_FIT_MAX_INPUTS)
                    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: more than %d input arrays", flag,
                                      PS_FIT_MAX_INPUTS);
                snprintf(t->in_spec[test][(*k)++], sizeof t->inputs, "%s", v);
                size_t used = *k > 1 ? strlen(paths[i].dst) : 0;
                snprintf(paths[i].dst + used, sizeof t->inputs - used, "%s%s", *k > 1 ? " + " : "", v);
                return PS_OK;
            }
            snprintf(paths[i].dst, sizeof t->inputs, "%s", v);
            return PS_OK;
        }
    if (!strcmp(flag, "--loss")) {
        if ((t->loss = ps_loss_find(v))) return PS_OK;
        char names[128];
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--loss: unknown loss '%s' (losses: %s)", v,
                          ps_loss_names(names, sizeof names));
    }
    if (!strcmp(flag, "--ignore-index")) {
        long v2;
        ps_status st = ps_parse_long(flag, v, -(1L << 62), 1L << 62, &v2, err);
        if (!st) t->cls.ignore = v2, t->cls_given = 1;
        return st;
    }
    if (!strcmp(flag, "--class-dim")) {
        t->cls_given = 1;
        if (!strcmp(v, "1")) return t->cls.last = 0, PS_OK;
        if (!strcmp(v, "last") || !strcmp(v, "-1")) return t->cls.last = 1, PS_OK;
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--class-dim %s: 1 (PyTorch's (N, C, d...), the default) or "
                          "last ((N, d..., C): a sequence model's (N, T, V) logits)", v);
    }
    if (!strcmp(flag, "--val-fraction")) {
        return ps_parse_double(flag, v, 0, 1, PS_PARSE_OPEN_HI, &t->val_fraction, err);
    }
    if (!strcmp(flag, "--lr")) {
        ps_status st;
        if ((st = parse_list(flag, v, t->lr, &t->nlr, err))) return st;
        for (int i = 0; i < t->nlr; i++)
            if (!(t->lr[i] > 0)) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--lr %s: every value must be > 0", v);
        return PS_OK;
    }
    if (!strncmp(flag, "--input-", 8)) t->norm_given = 1;
    if (!strcmp(flag, "--input-scale")) {
        return ps_parse_double(flag, v, 0, 1e300, PS_PARSE_OPEN_LO, &t->norm.scale, err);
    }
    if (!strcmp(flag, "--input-mean")) return parse_list(flag, v, t->norm.mean, &t->norm.nmean, err);
    if (!strcmp(flag, "--input-std")) return parse_list(flag, v, t->norm.std, &t->norm.nstd, err);
    if (!strcmp(flag, "--all-data")) {
        t->all_data = 1;
        return PS_OK;
    }
    if (!strcmp(flag, "--eval-only")) {
        t->eval_only = 1;
        return PS_OK;
    }
    if (!strcmp(flag, "--max-data-mb")) {
        long mb;
        ps_status st = ps_parse_long(flag, v, 1, 1 << 20, &mb, err);
        if (!st) t->max_bytes = (size_t)mb << 20;
        return st;
    }
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: unknown flag '%s'", flag);
}

static void *fit_create(void) {
    fit_task *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->norm.scale = -1;
    t->cls.ignore = PS_LOSS_NO_IGNORE;
    t->max_bytes = PS_DATA_MAX_BYTES;
    return t;
}

static void fit_destroy(void *arg) {
    fit_task *t = arg;
    if (!t) return;
    ps_array_free(&t->x);
    ps_array_free(&t->y);
    ps_array_free(&t->tx);
    ps_array_free(&t->ty);
    free(t->train);
    free(t->val);
    free(t->order);
    free(t->test_idx);
    free(t->xf);
    free(t->xi);
    free(t->tgt);
    free(t->sh_ids);
    free(t->sh_pos);
    free(t->sh_rows);
    for (int h = 0; h < t->nhops; h++) {
        free(t->hops[h].out);
        free(t->hops[h].grad);
    }
    free(t);
}

/* ---- init: the data ----------------------------------------------------- */

static ps_status load(const char *flag, const char *spec, size_t max_bytes, ps_array *a, ps_err *err) {
    ps_status st = ps_data_load(spec, max_bytes, a, err);
    return st ? ps_err_prefix(err, "%s", flag) : PS_OK;
}

/* The inputs of flag (test 0: --inputs, 1: --test-inputs) into *x: one array as it is, several joined
 * (ps_fit_join; the model's per-sample shape once connected, fit_setup). */
static ps_status load_inputs(fit_task *t, int test, ps_array *x, ps_err *err) {
    const char *flag = test ? "--test-inputs" : "--inputs";
    int n = t->n_in[test];
    if (n == 1) return load(flag, t->in_spec[test][0], t->max_bytes, x, err);
    ps_array parts[PS_FIT_MAX_INPUTS] = {0};
    const char *names[PS_FIT_MAX_INPUTS] = {0};
    ps_status st = PS_OK;
    for (int i = 0; i < n && st == PS_OK; i++) {
        names[i] = t->in_spec[test][i];
        st = load(flag, names[i], t->max_bytes, &parts[i], err);
    }
    if (st == PS_OK && (st = ps_fit_join(parts, names, n, t->max_bytes, x, err))) ps_err_prefix(err, "%s", flag);
    for (int i = 0; i < n; i++) ps_array_free(&parts[i]);
    return st;
}

/* A joined input (several --inputs) in the model's per-sample shape: the join holds the values of psd-export's
 * join (flattened, or along dim 1 - the same values), so only their count must match. */
static ps_status shape_joined(fit_task *t, int test, ps_array *x, ps_err *err) {
    const ps_fit_model *m = &t->model;
    if (t->n_in[test] < 2) return PS_OK;
    char sh[96];
    int64_t want = 1;
    for (int i = 0; i < m->in_ndim; i++) want *= m->in_dims[i];
    if (x->dims[1] != want)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s %s: the %d arrays hold %lld values a sample together, "
                          "but the model's first stage '%s' takes %s (%lld values): give one array per input of "
                          "forward, in its order (psd-export prints the join)", test ? "--test-inputs" : "--inputs",
                          test ? t->test_inputs : t->inputs, t->n_in[test], (long long)x->dims[1], m->first_stage,
                          ps_array_shape_str(m->in_dims, m->in_ndim, sh, sizeof sh), (long long)want);
    x->ndim = 1 + m->in_ndim;
    for (int i = 0; i < m->in_ndim; i++) x->dims[1 + i] = m->in_dims[i];
    return PS_OK;
}

static ps_status fit_init(void *arg, const ps_task_env *env, ps_err *err) {
    fit_task *t = arg;
    const ps_config *cfg = env->cfg;
    char names[128];
    if (!t->inputs[0] || !t->labels[0])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: --inputs and --labels are needed (see ps-train fit --help)");
    if (!t->loss)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: --loss is needed (one of %s)",
                          ps_loss_names(names, sizeof names));
    if (t->cls_given && !t->loss->class_targets)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: --ignore-index and --class-dim are for the class losses "
                          "(nll, cross_entropy), not %s", t->loss->name);
    t->labels_in = !strcmp(t->labels, "inputs");
    if (t->labels_in && t->loss->class_targets)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: --labels inputs makes the inputs the targets, which "
                          "needs a loss of dense targets (mse or bce_with_logits), not %s's class ids", t->loss->name);
    if (t->labels_in && t->test_labels[0] && strcmp(t->test_labels, "inputs"))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: with --labels inputs the test inputs are their own "
                          "targets too; leave out --test-labels %s", t->test_labels);
    if (t->labels_in && t->test_inputs[0]) snprintf(t->test_labels, sizeof t->test_labels, "inputs");
    if (!t->test_inputs[0] != !t->test_labels[0])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: --test-inputs and --test-labels go together");
    if (t->n_in[1] && t->n_in[1] != t->n_in[0])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: %d --inputs but %d --test-inputs: give both once per "
                          "input of the model, in the same order", t->n_in[0], t->n_in[1]);
    if (t->n_in[0] > 1 && t->norm_given)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: with several --inputs the values reach the model as "
                          "they are (ids must stay ids): scale the float arrays beforehand, without --input-scale, "
                          "--input-mean or --input-std");
    if (t->n_in[0] > 1 && t->labels_in)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: --labels inputs takes one --inputs array");
    if (t->nlr && (cfg->optimizer.kind != PS_OPTIM_SGD || cfg->optimizer.weight_decay != 0 || !(cfg->optimizer.lr > 0)))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "fit: --lr scales psd's steps by lr / optimizer.lr, which is "
                          "the same as that lr only for plain SGD (optimizer.type sgd, weight_decay 0; momentum is "
                          "fine) with optimizer.lr of the config psd runs; set optimizer.lr in the config instead");
    t->grad_scale = t->nlr ? t->lr[0] / cfg->optimizer.lr : 1.0;
    ps_status st;
    if ((st = load_inputs(t, 0, &t->x, err)) ||
        (!t->labels_in && (st = load("--labels", t->labels, t->max_bytes, &t->y, err))))
        return st;
    if (t->test_inputs[0]) {
        if ((st = load_inputs(t, 1, &t->tx, err)) ||
            (!t->labels_in && (st = load("--test-labels", t->test_labels, t->max_bytes, &t->ty, err))))
            return st;
        t->have_test = 1;
    }
    /* counts now, before the split and the test indices are allocated by
     * them (shapes against the model once connected) */
    if ((st = ps_fit_check_samples(&t->x, t->inputs, labels_of(t, 0), t->labels, err)) ||
        (t->have_test && (st = ps_fit_check_samples(&t->tx, t->test_inputs, labels_of(t, 1), t->test_labels, err))))
        return st;
    int share = t->all_data ? 1 : env->world_size - 1;
    if ((st = ps_fit_split((uint32_t)t->x.dims[0], t->val_fraction, cfg->trainer.seed, (int)env->rank, share,
                           &t->train, &t->ntrain, &t->val, &t->nval, err)))
        return st;
    t->bs = cfg->trainer.batch_size;
    if (!(t->order = malloc((size_t)t->ntrain * sizeof *t->order)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    if (t->have_test) {
        uint32_t n = (uint32_t)t->tx.dims[0];
        if (!(t->test_idx = malloc((size_t)(n ? n : 1) * sizeof *t->test_idx)))
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        ps_iota_u32(t->test_idx, n);
    }
    printf("Rank %ld: %u training samples (of %lld%s), %u held out%s\n", env->rank, t->ntrain, (long long)t->x.dims[0],
           share > 1 ? ", this rank's share" : "", t->nval,
           t->have_test ? ", plus the test files" : "");
    return PS_OK;
}

/* ---- the model: stages, hops, buffers (once connected) -------------------- */

static int64_t prod(const int64_t *d, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= d[i];
    return p;
}

/* The stages every server reports, in model order, with their server. */
static ps_status list_stages(const ps_task_env *env, ps_StageInfo *st, int *srv, int *n, ps_err *err) {
    const ps_placement *p = ps_cluster_placement(env->cluster);
    int single = ps_cluster_single(env->cluster);
    *n = 0;
    if (single >= 0) { /* the server's own list: model order, whatever the trainer's config names */
        ps_status s = ps_client_list_stages(ps_cluster_client(env->cluster, single), st, FIT_MAX_STAGES, n, err);
        if (s) return ps_err_prefix(err, "ListParameters");
        for (int i = 0; i < *n; i++) srv[i] = single;
        if (!*n) return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "psd lists no stages (a psd older than StageInfo?)");
        return PS_OK;
    }
    ps_StageInfo per[PS_CONFIG_MAX_SERVERS][FIT_MAX_STAGES];
    int nper[PS_CONFIG_MAX_SERVERS] = {0};
    for (int i = 0; i < p->n_servers; i++) {
        ps_client *cl = ps_cluster_client(env->cluster, i);
        if (!cl) continue;
        if (ps_client_list_stages(cl, per[i], FIT_MAX_STAGES, &nper[i], err))
            return ps_err_prefix(err, "%s: ListParameters", ps_cluster_name(env->cluster, i));
    }
    for (int s = 0; s < p->n_stages && s < FIT_MAX_STAGES; s++) {
        const ps_place_stage *ps = &p->stages[s];
        int server = ps->n_shards ? ps->shards[0].server : ps->server, found = 0;
        for (int k = 0; k < nper[server] && !found; k++)
            if (!strcmp(per[server][k].name, ps->name)) {
                st[*n] = per[server][k];
                found = 1;
            }
        if (!found)
            return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s does not list stage '%s' that the config places "
                              "there (does it run this config?)", ps_cluster_name(env->cluster, server), ps->name);
        srv[(*n)++] = ps->n_shards ? -1 : server;
    }
    return PS_OK;
}

static ps_status fit_setup(fit_task *t, const ps_task_env *env, ps_err *err) {
    ps_StageInfo st[FIT_MAX_STAGES];
    int srv[FIT_MAX_STAGES], ns;
    ps_status s = list_stages(env, st, srv, &ns, err);
    if (s) return s;
    for (int i = 1; i < ns; i++) { /* the stages must chain: each takes the one before's output */
        int same = st[i].input_shape_count == st[i - 1].output_shape_count && st[i].input_dtype == ps_DType_FLOAT32;
        for (pb_size_t d = 0; same && d < st[i].input_shape_count; d++)
            same = st[i].input_shape[d] == st[i - 1].output_shape[d];
        if (!same) {
            char a[96], b[96];
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model %s: stage %s takes %s, but stage %s before it "
                              "outputs %s: fit runs the stages as a chain (rnn_lm's LSTM runs on the trainer: "
                              "ps-train lm)", env->model, st[i].name,
                              ps_array_shape_str(st[i].input_shape, st[i].input_shape_count, a, sizeof a),
                              st[i - 1].name,
                              ps_array_shape_str(st[i - 1].output_shape, st[i - 1].output_shape_count, b, sizeof b));
        }
    }
    snprintf(t->stage0, sizeof t->stage0, "%s", st[0].name);
    ps_fit_model *m = &t->model;
    m->first_stage = t->stage0;
    m->in_ndim = st[0].input_shape_count;
    memcpy(m->in_dims, st[0].input_shape, sizeof(int64_t) * (size_t)m->in_ndim);
    m->in_int64 = st[0].input_dtype == ps_DType_INT64;
    m->out_ndim = st[ns - 1].output_shape_count;
    memcpy(m->out_dims, st[ns - 1].output_shape, sizeof(int64_t) * (size_t)m->out_ndim);
    if (t->labels_in && m->in_int64)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--labels inputs: the model's first stage '%s' takes int64 "
                          "ids, which cannot be the targets of a dense loss", m->first_stage);
    if ((s = shape_joined(t, 0, &t->x, err)) || (t->have_test && (s = shape_joined(t, 1, &t->tx, err))))
        return s;
    if ((s = ps_fit_check_class(&t->x, t->inputs, labels_of(t, 0), t->labels, m, t->loss, &t->cls, &t->norm,
                                &t->lay, err)))
        return s;
    if (t->have_test && (s = ps_fit_check_class(&t->tx, t->test_inputs, labels_of(t, 1), t->test_labels, m,
                                                t->loss, &t->cls, &t->norm, &t->tlay, err)))
        return s;
    if (t->labels_in && t->lay.y_numel != t->lay.x_numel)
        return ps_err_set(err, PS_ERR_INTERNAL, "--labels inputs: %lld targets per sample for %lld inputs",
                          (long long)t->lay.y_numel, (long long)t->lay.x_numel);
    if (t->have_test && t->tlay.x_numel != t->lay.x_numel)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--test-inputs %s: %lld values per sample, --inputs %lld",
                          t->test_inputs, (long long)t->tlay.x_numel, (long long)t->lay.x_numel);
    const ps_fit_layout *lay = &t->lay;
    /* hops: runs of stages on one server */
    t->nhops = 0;
    for (int i = 0; i < ns; i++) {
        fit_hop *h = &t->hops[t->nhops];
        int join = t->nhops > 0 && srv[i] >= 0 && t->hops[t->nhops - 1].server == srv[i];
        if (join) {
            h = &t->hops[t->nhops - 1];
        } else {
            memset(h, 0, sizeof *h);
            h->server = srv[i];
            snprintf(h->first, sizeof h->first, "%.31s", ps_cluster_single(env->cluster) >= 0 ? "" : st[i].name);
            h->in_int64 = st[i].input_dtype == ps_DType_INT64;
            h->in_ndim = 1 + lay->extra_ndim + (int)st[i].input_shape_count;
            if (h->in_ndim > PS_FIT_MAX_DIMS)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stage %s's input would need %d dims per batch; psd "
                                  "takes at most %d", st[i].name, h->in_ndim, PS_FIT_MAX_DIMS);
            memcpy(h->in_dims + 1, lay->extra, sizeof(int64_t) * (size_t)lay->extra_ndim);
            memcpy(h->in_dims + 1 + lay->extra_ndim, st[i].input_shape, sizeof(int64_t) * st[i].input_shape_count);
            h->in_numel = lay->rows * prod(st[i].input_shape, st[i].input_shape_count);
            t->nhops++;
        }
        snprintf(h->last, sizeof h->last, "%.31s", ps_cluster_single(env->cluster) >= 0 ? "" : st[i].name);
        h->out_numel = lay->rows * prod(st[i].output_shape, st[i].output_shape_count);
        if (srv[i] < 0) { /* sharded: the first stage, one id per position */
            const ps_placement *p = ps_cluster_placement(env->cluster);
            int ps = ps_placement_stage(p, st[i].name);
            if (i != 0 || !h->in_int64 || st[i].input_shape_count != 0 || ps < 0)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stage %s is sharded by rows: fit takes a sharded "
                                  "stage only as the model's first, taking one int64 id per position", st[i].name);
            const ps_place_stage *pl = &p->stages[ps];
            h->n_shards = pl->n_shards > FIT_MAX_SHARDS ? FIT_MAX_SHARDS : pl->n_shards;
            for (int k = 0; k < h->n_shards; k++) {
                h->shard_server[k] = pl->shards[k].server;
                h->shard_lo[k] = pl->shards[k].lo;
                h->shard_hi[k] = pl->shards[k].hi;
            }
            h->rows = pl->rows;
            h->width = prod(st[i].output_shape, st[i].output_shape_count);
        }
    }
    if (t->hops[t->nhops - 1].out_numel != lay->out_numel)
        return ps_err_set(err, PS_ERR_INTERNAL, "the last stage outputs %lld values per sample, expected %lld",
                          (long long)t->hops[t->nhops - 1].out_numel, (long long)lay->out_numel);
    /* buffers. Evaluation Forwards (no context, no max batch) take up to
     * FIT_EVAL_BYTES of inputs or outputs, at most FIT_EVAL_MAX samples. */
    int64_t per = lay->x_numel * (m->in_int64 ? 8 : 4), widest = 0;
    for (int h = 0; h < t->nhops; h++) widest = t->hops[h].out_numel > widest ? t->hops[h].out_numel : widest;
    if (widest * 4 > per) per = widest * 4;
    int64_t ebs = FIT_EVAL_BYTES / (per > 0 ? per : 1);
    t->ebs = (int)(ebs > FIT_EVAL_MAX ? FIT_EVAL_MAX : ebs < t->bs ? t->bs : ebs);
    t->cap = t->ebs > t->bs ? t->ebs : t->bs;
    size_t cap = (size_t)t->cap;
    size_t tsz = t->loss->class_targets ? sizeof(int64_t) : sizeof(float);
    int64_t ynum = lay->y_numel > t->tlay.y_numel ? lay->y_numel : t->tlay.y_numel;
    if (m->in_int64) t->xi = malloc(cap * (size_t)lay->x_numel * sizeof *t->xi);
    else t->xf = malloc(cap * (size_t)lay->x_numel * sizeof *t->xf);
    t->tgt = malloc(cap * (size_t)ynum * tsz);
    int ok = (t->xi || t->xf) && t->tgt;
    for (int h = 0; h < t->nhops && ok; h++) {
        t->hops[h].out = malloc(cap * (size_t)t->hops[h].out_numel * sizeof(float));
        t->hops[h].grad = malloc(cap * (size_t)t->hops[h].out_numel * sizeof(float));
        ok = t->hops[h].out && t->hops[h].grad;
        if (t->hops[h].n_shards) {
            t->sh_ids = malloc(cap * (size_t)lay->rows * sizeof *t->sh_ids);
            t->sh_pos = malloc(cap * (size_t)lay->rows * sizeof *t->sh_pos);
            t->sh_rows = malloc(cap * (size_t)t->hops[h].out_numel * sizeof *t->sh_rows);
            ok = t->sh_ids && t->sh_pos && t->sh_rows;
        }
    }
    if (!ok) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for batches of %d", t->cap);
    char sh1[96], sh2[96];
    printf("Rank %ld: model %s: %d stage%s in %d hop%s; per sample %s %s in, %s out; loss %s\n", env->rank, env->model,
           ns, ns == 1 ? "" : "s", t->nhops, t->nhops == 1 ? "" : "s", m->in_int64 ? "int64" : "float32",
           ps_array_shape_str(m->in_dims, m->in_ndim, sh1, sizeof sh1),
           ps_array_shape_str(m->out_dims, m->out_ndim, sh2, sizeof sh2), t->loss->name);
    t->ready = 1;
    return PS_OK;
}

/* ---- one batch through the hops ------------------------------------------ */

typedef struct fit_job {
    fit_task *t;
    const ps_task_env *env;
    const ps_fit_layout *lay;
    int n;
    int train;
    ps_cluster_batch *b;              /* several servers (train) */
    double loss;
    int64_t correct;
    int64_t counted;                  /* predictions in the loss's mean (those not --ignore-index) */
    uint64_t version;
} fit_job;

static ps_status hop_forward(fit_job *j, int hi, ps_err *err) {
    fit_task *t = j->t;
    fit_hop *h = &t->hops[hi];
    const int n = j->n;
    uint32_t rank = (uint32_t)j->env->rank;
    ps_client_tensor in;
    if (hi == 0) {
        in = (ps_client_tensor){t->model.in_int64 ? PS_CLIENT_I64 : PS_CLIENT_F32, h->in_ndim, {0},
                                t->model.in_int64 ? (const void *)t->xi : (const void *)t->xf};
    } else {
        in = (ps_client_tensor){PS_CLIENT_F32, h->in_ndim, {0}, t->hops[hi - 1].out};
    }
    memcpy(in.dims, h->in_dims, sizeof in.dims);
    in.dims[0] = n;
    if (h->n_shards) { /* ids in each shard's rows, rows scattered back */
        const int64_t npos = (int64_t)n * j->lay->rows, D = h->width;
        for (int64_t i = 0; i < npos; i++)
            if (t->xi[i] < 0 || t->xi[i] >= h->rows)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "id %lld is outside the sharded table's %lld rows",
                                  (long long)t->xi[i], (long long)h->rows);
        for (int k = 0; k < h->n_shards; k++) {
            int64_t cnt = 0;
            for (int64_t i = 0; i < npos; i++)
                if (t->xi[i] >= h->shard_lo[k] && t->xi[i] < h->shard_hi[k]) t->sh_pos[cnt] = i, t->sh_ids[cnt++] = t->xi[i];
            if (!cnt) continue;
            ps_client_fwd f = {.seq = (uint32_t)hi, .rank = rank, .train = j->train, .stage = h->first,
                               .input = {PS_CLIENT_I64, 1, {cnt}, t->sh_ids}};
            ps_client_fwd_out o = {.out = t->sh_rows, .out_cap = cnt * D};
            ps_status st;
            if (j->b) st = ps_cluster_forward(j->b, h->shard_server[k], &f, &o, err);
            else if ((st = ps_client_forward_ex(ps_cluster_client(j->env->cluster, h->shard_server[k]), &f, &o, err)))
                ps_err_prefix(err, "%s", ps_cluster_name(j->env->cluster, h->shard_server[k]));
            if (st) return st;
            for (int64_t i = 0; i < cnt; i++)
                memcpy(h->out + t->sh_pos[i] * D, t->sh_rows + i * D, (size_t)D * sizeof(float));
        }
        return PS_OK;
    }
    ps_client_fwd f = {.seq = (uint32_t)hi, .rank = rank, .train = j->train, .stage = h->first,
                       .last_stage = h->last, .input = in};
    ps_client_fwd_out o = {.out = h->out, .out_cap = (int64_t)n * h->out_numel};
    ps_status st;
    ps_client *cl = ps_cluster_client(j->env->cluster, h->server);
    if (j->b) {
        st = ps_cluster_forward(j->b, h->server, &f, &o, err);
    } else { /* evaluation: no context */
        st = ps_client_forward_ex(cl, &f, &o, err);
        if (st && ps_cluster_single(j->env->cluster) < 0) ps_err_prefix(err, "%s", ps_cluster_name(j->env->cluster, h->server));
    }
    if (st) return st;
    int64_t per = o.ndim >= 1 && o.dims[0] == n ? prod(o.dims + 1, o.ndim - 1) : -1;
    if (per != h->out_numel)
        return ps_err_set(err, PS_ERR_INTERNAL, "stage %s returned %d dims (%lld values per sample), expected (%d, %lld "
                          "values)", h->last[0] ? h->last : "(last)", o.ndim, (long long)per, n, (long long)h->out_numel);
    j->version = o.version;
    return PS_OK;
}

/* Backward of hop hi with grad of its output; its input gradient into the
 * hop before's grad buffer. */
static ps_status hop_backward(fit_job *j, int hi, ps_err *err) {
    fit_task *t = j->t;
    fit_hop *h = &t->hops[hi];
    const int n = j->n;
    uint32_t seq = (uint32_t)hi;
    if (h->n_shards) {
        const int64_t npos = (int64_t)n * j->lay->rows, D = h->width;
        for (int k = 0; k < h->n_shards; k++) {
            int64_t cnt = 0;
            for (int64_t i = 0; i < npos; i++)
                if (t->xi[i] >= h->shard_lo[k] && t->xi[i] < h->shard_hi[k])
                    memcpy(t->sh_rows + cnt++ * D, h->grad + i * D, (size_t)D * sizeof(float));
            if (!cnt) continue;
            ps_client_tensor g = {PS_CLIENT_F32, 2, {cnt, D}, t->sh_rows};
            ps_client_bwd bw = {.n = 1, .seqs = &seq, .grads = &g};
            ps_status st = ps_cluster_backward(j->b, h->shard_server[k], &bw, err);
            if (st) return st;
        }
        return PS_OK;
    }
    ps_client_tensor g = {PS_CLIENT_F32, 0, {0}, h->grad};
    /* the output's shape: (n, extra..., last stage's output) = the next hop's input, or the model's */
    if (hi + 1 < t->nhops) {
        g.ndim = t->hops[hi + 1].in_ndim;
        memcpy(g.dims, t->hops[hi + 1].in_dims, sizeof g.dims);
    } else {
        g.ndim = 1 + j->lay->extra_ndim + t->model.out_ndim;
        memcpy(g.dims + 1, j->lay->extra, sizeof(int64_t) * (size_t)j->lay->extra_ndim);
        memcpy(g.dims + 1 + j->lay->extra_ndim, t->model.out_dims, sizeof(int64_t) * (size_t)t->model.out_ndim);
    }
    g.dims[0] = n;
    float *ig[1] = {hi > 0 ? t->hops[hi - 1].grad : NULL};
    int64_t icap[1] = {hi > 0 ? (int64_t)n * t->hops[hi - 1].out_numel : 0};
    ps_client_bwd bw = {.n = 1, .seqs = &seq, .grads = &g, .input_grads = hi > 0 ? ig : NULL, .input_caps = icap};
    return ps_cluster_backward(j->b, h->server, &bw, err);
}

/* The loss of the last hop's output against the batch's targets; its
 * gradient into the last hop's grad buffer. */
static void batch_loss(fit_job *j) {
    fit_task *t = j->t;
    fit_hop *last = &t->hops[t->nhops - 1];
    const int64_t N = (int64_t)j->n * j->lay->loss_rows, C = j->lay->classes, I = j->lay->inner;
    const int64_t ig = t->cls.ignore;
    j->loss = t->loss->forward_t ? t->loss->forward_t(last->out, t->tgt, N, C * I, j->lay->t_per_row, last->grad)
                                 : t->loss->forward(last->out, t->tgt, N, C, I, ig, last->grad);
    j->correct = t->loss->correct ? t->loss->correct(last->out, t->tgt, N, C, I, ig) : 0;
    j->counted = t->loss->forward_t ? N : ps_loss_counted(t->loss, t->tgt, N, C, I, ig);
}

/* Several servers: the hops' Forwards and Backwards (ps_cluster_run sends the Steps). */
static ps_status fit_multi(void *arg, ps_cluster_batch *b, ps_err *err) {
    fit_job *j = arg;
    ps_status st;
    j->b = b;
    b->grad_scale = (float)j->t->grad_scale;
    for (int h = 0; h < j->t->nhops; h++)
        if ((st = hop_forward(j, h, err))) return st;
    batch_loss(j);
    for (int h = j->t->nhops - 1; h >= 0; h--)
        if ((st = hop_backward(j, h, err))) return st;
    return PS_OK;
}

/* --one-call applies: psd's fused loss is the mean cross-entropy of one
 * logits vector per sample against an int64 class id, as --loss
 * cross_entropy without extra dims. */
static int fit_one_call_fits(fit_task *t, const ps_task_env *env) {
    int ok = !strcmp(t->loss->name, "cross_entropy") && t->lay.extra_ndim == 0 && t->lay.inner == 1 &&
             t->model.out_ndim == 1 && t->grad_scale == 1.0 && t->cls.ignore == PS_LOSS_NO_IGNORE;
    if (!ok && env->one_call == PS_ONE_CALL_ASKED && !t->one_noted) {
        t->one_noted = 1;
        fprintf(stderr, "ps-train fit: --one-call needs --loss cross_entropy, one logits vector per sample "
                "(psd's fused loss), no --ignore-index (psd's fused loss has none) and no --lr other than psd's; "
                "this run sends Forward, Backward and Step\n");
    }
    return ok;
}

/* One server: Forward, loss, Backward (+ Step), under ps_retry_once. */
typedef struct single_job {
    fit_job *j;
    ps_client *cl;
    int fuse, one;
} single_job;

static void single_release(void *arg, uint64_t ctx) {
    single_job *s = arg;
    ps_client_release_context(s->cl, ctx, (uint32_t)s->j->env->rank, NULL, NULL);  /* best effort */
}

static ps_status single_step(void *arg, uint64_t ctx, ps_err *err) {
    single_job *s = arg;
    ps_client_step_out so;
    ps_status st = ps_client_step_scaled(s->cl, ctx, 0, (float)s->j->t->grad_scale, &so, err);
    if (!st) s->j->version = so.version;
    return st;
}

static ps_status single_once(void *arg, uint64_t ctx, int *kept, ps_err *err) {
    single_job *s = arg;
    fit_job *j = s->j;
    fit_task *t = j->t;
    fit_hop *h = &t->hops[0];
    const int n = j->n;
    ps_client_fwd f = {.ctx = ctx, .rank = (uint32_t)j->env->rank, .train = 1,
                       .input = {t->model.in_int64 ? PS_CLIENT_I64 : PS_CLIENT_F32, h->in_ndim, {0},
                                 t->model.in_int64 ? (const void *)t->xi : (const void *)t->xf}};
    memcpy(f.input.dims, h->in_dims, sizeof f.input.dims);
    f.input.dims[0] = n;
    if (s->one) {  /* --one-call: psd's cross-entropy, backward and step in this call */
        f.targets = (ps_client_tensor){PS_CLIENT_I64, 1, {n}, t->tgt};
        *kept = PS_KEPT_STEP;  /* psd may have applied it though the reply is lost: ps_retry_once settles by Step */
        return ps_client_train_step(s->cl, &f, &j->loss, &j->version, err);
    }
    ps_client_fwd_out o = {.out = h->out, .out_cap = (int64_t)n * h->out_numel};
    ps_status st = ps_client_forward_ex(s->cl, &f, &o, err);
    if (st) return st;
    *kept = PS_KEPT_HELD;
    int64_t per = o.ndim >= 1 && o.dims[0] == n ? prod(o.dims + 1, o.ndim - 1) : -1;
    if (per != h->out_numel)
        return ps_err_set(err, PS_ERR_INTERNAL, "the model returned %d dims (%lld values per sample), expected (%d, "
                          "%lld values)", o.ndim, (long long)per, n, (long long)h->out_numel);
    batch_loss(j);
    uint32_t seq = 0;
    ps_client_tensor g = {PS_CLIENT_F32, o.ndim, {0}, h->grad};
    memcpy(g.dims, o.dims, sizeof g.dims);
    ps_client_bwd bw = {.ctx = ctx, .n = 1, .seqs = &seq, .grads = &g, .step = s->fuse};
    ps_client_step_out so = {0};
    if (s->fuse) *kept = PS_KEPT_STEP;
    if ((st = ps_client_backward_ex(s->cl, &bw, &so, err))) return st;
    j->version = so.version;
    if (s->fuse) return PS_OK;
    *kept = PS_KEPT_STEP;
    return single_step(s, ctx, err);
}

/* ---- epochs --------------------------------------------------------------- */

static ps_status fit_begin_epoch(void *arg, const ps_task_env *env, int epoch, int *rounds, ps_err *err) {
    fit_task *t = arg;
    ps_status st;
    if (!t->ready && (st = fit_setup(t, env, err))) return st;
    memcpy(t->order, t->train, (size_t)t->ntrain * sizeof *t->order);
    ps_shuffle_u32(t->order, t->ntrain, env->cfg->trainer.seed + (uint64_t)env->rank + 1000003ULL * (uint64_t)epoch);
    *rounds = t->eval_only ? 0 : (int)((t->ntrain + (uint32_t)t->bs - 1) / (uint32_t)t->bs);
    if (t->nlr) t->grad_scale = t->lr[epoch < t->nlr ? epoch : t->nlr - 1] / env->cfg->optimizer.lr;
    t->epoch_loss = 0;
    t->epoch_batches = 0;
    t->epoch_empty = 0;
    return PS_OK;
}

static ps_status fill_batch(fit_task *t, const ps_array *x, const ps_array *y, const ps_fit_layout *lay,
                            const uint32_t *idx, int n, ps_err *err) {
    ps_status st = ps_fit_inputs(x, lay, &t->norm, t->model.in_int64, idx, n, t->xf, t->xi, err);
    if (st) return st;
    if (t->labels_in) /* checked in fit_init / fit_connect: float inputs, a dense loss, y_numel == x_numel */
        return ps_fit_inputs(x, lay, &t->norm, 0, idx, n, (float *)t->tgt, NULL, err);
    return ps_fit_targets(y, lay, t->loss, idx, n, t->tgt, err);
}

static ps_status fit_run_round(void *arg, const ps_task_env *env, int epoch, int b, ps_task_round *out, ps_err *err) {
    fit_task *t = arg;
    (void)epoch;
    uint32_t bs = (uint32_t)t->bs;
    int n = (int)((uint32_t)(b + 1) * bs <= t->ntrain ? bs : t->ntrain - (uint32_t)b * bs);
    ps_status st = fill_batch(t, &t->x, labels_of(t, 0), &t->lay, t->order + (size_t)b * bs, n, err);
    if (st) return st;
    fit_job j = {.t = t, .env = env, .lay = &t->lay, .n = n, .train = 1};
    if (env->cl) {
        single_job s = {.j = &j, .cl = env->cl, .fuse = env->fuse_step && t->grad_scale == 1.0,
                        .one = env->one_call && fit_one_call_fits(t, env)};
        ps_once_ops ops = {.unit = "batch", .run = single_once, .step = single_step, .arg = &s, .marks_step = 1,
                           .release = single_release};
        if ((st = ps_retry_once(env->retry, env->ids, &ops, err))) return st;
    } else {
        if (env->one_call == PS_ONE_CALL_ASKED && !t->one_noted) {
            t->one_noted = 1;
            fprintf(stderr, "ps-train fit: --one-call needs the model on one server; this run sends Forward, "
                    "Backward and Step\n");
        }
        ps_cluster_batch cb;
        if ((st = ps_cluster_run(env->cluster, env->retry, env->ids, "batch", fit_multi, &j, &cb, err))) return st;
        j.version = cb.version;
    }
    if (t->cls.ignore != PS_LOSS_NO_IGNORE && j.counted == 0) { /* all ignored: no loss, a zero gradient */
        t->epoch_empty++;
    } else {
        t->epoch_loss += j.loss;
        t->epoch_batches++;
    }
    *out = (ps_task_round){.loss = j.loss, .samples = n, .version = j.version};
    return PS_OK;
}

/* ---- evaluation ------------------------------------------------------------ */

static ps_status eval_forward(void *arg, ps_err *err) {
    fit_job *j = arg;
    for (int h = 0; h < j->t->nhops; h++) {
        ps_status st = hop_forward(j, h, err);
        if (st) return st;
    }
    return PS_OK;
}

/* Mean loss and accuracy of samples idx[0..n) of (x, y). */
static ps_status evaluate_set(fit_task *t, const ps_task_env *env, const char *what, const ps_array *x,
                              const ps_array *y, const ps_fit_layout *lay, const uint32_t *idx, uint32_t n,
                              ps_err *err) {
    double loss_sum = 0;
    int64_t correct = 0, preds = 0;
    const int64_t per_sample = lay->loss_rows * ps_loss_predictions(t->loss, lay->classes, lay->inner);
    for (uint32_t s = 0; s < n; s += (uint32_t)t->ebs) {
        int m = (int)(n - s < (uint32_t)t->ebs ? n - s : (uint32_t)t->ebs);
        ps_status st = fill_batch(t, x, y, lay, idx + s, m, err);
        if (st) return st;
        fit_job j = {.t = t, .env = env, .lay = lay, .n = m, .train = 0};
        ps_retry_reset(env->retry);
        if ((st = ps_retry_call(env->retry, "evaluation Forward", eval_forward, &j, err))) return st;
        batch_loss(&j);
        loss_sum += j.loss * (double)j.counted; /* the batch's mean, weighted by its predictions */
        correct += j.correct;
        preds += j.counted;
    }
    double loss = preds ? loss_sum / (double)preds : 0.0;
    if (t->loss->correct)
        printf("Rank %ld %s loss %.4f accuracy %.2f%% (%lld/%lld %s)\n", env->rank, what, loss,
               preds ? 100.0 * (double)correct / (double)preds : 0.0, (long long)correct, (long long)preds,
               per_sample == 1 ? "samples" : "predictions");
    else
        printf("Rank %ld %s loss %.6f (%u samples)\n", env->rank, what, loss, n);
    fflush(stdout);
    return PS_OK;
}

static ps_status fit_end_epoch(void *arg, const ps_task_env *env, int epoch, ps_err *err) {
    fit_task *t = arg;
    char what[64];
    if (t->eval_only) return PS_OK;
    printf("Rank %ld epoch %d/%d: training loss %.4f (mean of %ld batches)", env->rank, epoch + 1,
           env->cfg->trainer.epochs, t->epoch_batches ? t->epoch_loss / (double)t->epoch_batches : 0.0,
           t->epoch_batches);
    if (t->epoch_empty)
        printf("; %ld batch%s of only --ignore-index targets left out", t->epoch_empty, t->epoch_empty == 1 ? "" : "es");
    printf("\n");
    fflush(stdout);
    if (env->no_eval) return PS_OK;
    if (t->nval) {
        snprintf(what, sizeof what, "epoch %d/%d validation", epoch + 1, env->cfg->trainer.epochs);
        return evaluate_set(t, env, what, &t->x, labels_of(t, 0), &t->lay, t->val, t->nval, err);
    }
    if (t->have_test && epoch + 1 < env->cfg->trainer.epochs) { /* the last one is the final evaluation's */
        snprintf(what, sizeof what, "epoch %d/%d test", epoch + 1, env->cfg->trainer.epochs);
        return evaluate_set(t, env, what, &t->tx, labels_of(t, 1), &t->tlay, t->test_idx, (uint32_t)t->tx.dims[0], err);
    }
    fflush(stdout);
    return PS_OK;
}

static ps_status fit_evaluate(void *arg, const ps_task_env *env, ps_err *err) {
    fit_task *t = arg;
    if (!t->ready) return PS_OK; /* no epoch ran */
    if (t->have_test)
        return evaluate_set(t, env, "test", &t->tx, labels_of(t, 1), &t->tlay, t->test_idx, (uint32_t)t->tx.dims[0], err);
    if (t->nval) return evaluate_set(t, env, "validation", &t->x, labels_of(t, 0), &t->lay, t->val, t->nval, err);
    printf("Rank %ld: no held-out samples to evaluate (--val-fraction or --test-inputs/--test-labels)\n", env->rank);
    return PS_OK;
}

static const ps_task_flag fit_flags[] = {
    {"--inputs", "-i", "FILE[:NAME]", NULL, "training inputs: IDX (raw or .gz), .npy, .npz:NAME, safetensors:NAME; "
     "once per input of a model of several, in forward's order (joined as psd-export prints)"},
    {"--labels", "-l", "FILE[:NAME]", NULL, "training labels (targets), one per input sample; `inputs`: each input, "
     "converted as the model gets it, is its own target (an autoencoder's; mse, bce_with_logits, bce, vae_bce)"},
    {"--test-inputs", NULL, "FILE[:NAME]", NULL, "test inputs, evaluated at the end (and per epoch without a split); "
     "as many as --inputs"},
    {"--test-labels", NULL, "FILE[:NAME]", NULL, "test labels (none with --labels inputs)"},
    {"--loss", NULL, "NAME", NULL, "nll, cross_entropy, mse, bce_with_logits, bce (as torch.nn.functional) or vae_bce (a VAE's: docs/fit.md)"},
    {"--ignore-index", NULL, "N", NULL, "nll, cross_entropy: labels equal to N are no prediction (PyTorch's "
     "ignore_index, e.g. the padding id): the mean and accuracy are over the others"},
    {"--class-dim", NULL, "1|last", NULL, "nll, cross_entropy: where the output's classes are: 1 (PyTorch's (N, C, "
     "d...), the default) or last ((N, T, V) logits against (N, T) labels, as loss_fn(logits.reshape(-1, V), "
     "tgt.reshape(-1)))"},
    {"--val-fraction", NULL, "F", NULL, "hold out this fraction of the training samples (seeded, the same on every "
     "rank); loss and accuracy on it after each epoch"},
    {"--batch-size", "-b", "N", "trainer.batch_size", "samples per batch, 1..512 (trainer.batch_size)"},
    {"--lr", NULL, "LR[,LR...]", NULL, "learning rate via each Step's grad_scale (LR / optimizer.lr; plain SGD "
     "only); a list: one per epoch, the last repeats"},
    {"--input-scale", NULL, "S", NULL, "multiply inputs by S (default 1/255 for uint8 data, else 1)"},
    {"--input-mean", NULL, "M[,M..]", NULL, "then subtract M (one value, or one per channel)"},
    {"--input-std", NULL, "S[,S..]", NULL, "then divide by S (one value, or one per channel)"},
    {"--all-data", NULL, NULL, NULL, "every rank trains on all training samples (default: its 1/(world_size-1) share)"},
    {"--max-data-mb", NULL, "N", NULL, "refuse an array over N MiB (default 4096)"},
    {"--eval-only", NULL, NULL, NULL, "no training: evaluate psd's current model on the test files (or the split)"},
    {0},
};

const ps_task ps_task_fit = {
    .name = "fit",
    .description = "any model psd hosts, on inputs and labels from IDX, .npy/.npz or safetensors files",
    .unit = "batch",
    .flags = fit_flags,
    .create = fit_create,
    .set_flag = fit_set_flag,
    .init = fit_init,
    .begin_epoch = fit_begin_epoch,
    .run_round = fit_run_round,
    .end_epoch = fit_end_epoch,
    .evaluate = fit_evaluate,
    .destroy = fit_destroy,
};
