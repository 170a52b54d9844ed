/* task_lm.c - the "lm" task: PyTorch's model-parallel RNN language model
 * (RPC tutorial distributed/rpc/rnn) trained as word_language_model does
 * (task.h).
 *
 * psd hosts rnn_lm: stage "emb" (encoder Embedding + dropout), stage
 * "decoder" (dropout + Linear) and the parameter-only stage "rnn" holding
 * the LSTM's weights. The LSTM runs here (trainer/lstm.h, oneDNN or the
 * reference), one layer at a time with dropout between layers. A round is
 * one BPTT window of the batchified training stream, under one context:
 *   Forward ids on emb -> (pull the LSTM weights if the version changed)
 *   -> LSTM -> Forward on decoder -> cross-entropy here -> Backward decoder
 *   (its input gradient back) -> LSTM backward -> Backward emb ->
 *   PushGradients (the LSTM's) -> Step with grad_scale = clip coefficient x
 *   lr factor.
 * Clipping is clip_grad_norm_ over every parameter: the PushGradients reply
 * carries the context's squared gradient norm (emb, decoder and LSTM).
 * The lr schedule (÷4 when validation loss does not improve, as the
 * example) rides on grad_scale: exact for plain SGD (psd's optimizer must
 * be sgd without momentum or weight decay, optimizer.lr the starting lr).
 * The hidden state is carried across windows, detached, and reset at each
 * epoch; a retried round restarts from the state before it.
 * Each trainer takes its contiguous 1/(world_size-1) share of train.txt.
 *
 * Several PS nodes (cluster.h): the stages may live on different servers
 * and emb may be sharded by rows (model.placement.emb.shards). Then a
 * window runs under one context id on every server it touches
 * (ps_cluster_run): each shard gets the ids of the window's positions that
 * fall in its rows (global ids, 1-D) and its rows are scattered back into
 * the (T, N, ninp) input of the LSTM; its Backward gets the matching rows
 * of the gradient; a shard no id of the window falls in is not touched.
 * The LSTM's weights come from the server hosting "rnn" (pulled every
 * window unless a Forward of the window on that server shows the version
 * unchanged), its gradients go there; the decoder runs on its server. The
 * global-norm clip sums the squared gradient norm each touched server
 * reports for the context and gives every Step the same grad_scale.
 * In fused mode the decoder's server reports its norm with the Forward
 * reply (ForwardResponse.grad_sq_norm). With every stage on one server the
 * single-server path is used unchanged.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "cluster.h"
#include "lm_corpus.h"
#include "loss.h"
#include "lstm.h"
#include "modeldef.h"
#include "rng.h"
#include "task.h"

#define LM_MAX_LAYERS 8
#define LM_EVAL_BATCH 10 /* word_language_model's eval_batch_size */
#define LM_LSTM_CACHE 4

typedef struct lstm_slot { ps_lstm *l; int64_t T, N; } lstm_slot;

typedef struct lm_task {
    int bptt;                   /* --bptt */
    int eval_only;              /* --eval-only */
    int fused;                  /* --decoder fused (1) or logits (0) */
    int threads;                /* --threads: the LSTM's oneDNN threads */
    double clip;                /* --clip */
    ps_lstm_impl impl;          /* --lstm */
    ps_lm_corpus *corpus;
    int64_t ntoken, ninp, nhid; /* from psd's parameters (ListParameters) */
    int nlayers;
    double dropout;
    int bs;
    int64_t *train;             /* (train_rows, bs) this rank's share, batchified */
    size_t train_rows;
    int64_t *valid, *test;      /* (rows, LM_EVAL_BATCH) */
    size_t valid_rows, test_rows;
    /* LSTM weights (PyTorch layout), their version, gradients */
    float *w[LM_MAX_LAYERS][4], *g[LM_MAX_LAYERS][4];
    int64_t wn[LM_MAX_LAYERS][4];
    uint64_t w_version;
    int have_w;
    lstm_slot cache[LM_MAX_LAYERS][LM_LSTM_CACHE];
    /* hidden state carried across windows: h, c (nlayers, bs, nhid) */
    float *h, *c;
    /* schedule */
    double lr0, lr, best_val;
    int epoch_seen;
    /* progress */
    double log_loss, log_t0;
    int log_n;
    /* stages on several servers (env->cl == NULL): where they live, and the
     * per-shard gather buffers of a window (ids, positions, rows) */
    int s_emb, s_dec, s_rnn;    /* servers; s_emb -1 when sharded */
    int emb_stage;              /* emb's index in the placement */
    int64_t *sh_ids;            /* (bptt * max(bs, LM_EVAL_BATCH)) */
    int64_t *sh_pos;
    float *sh_rows;             /* (bptt * max(bs, LM_EVAL_BATCH), ninp) */
    uint64_t fwd_version[PS_CONFIG_MAX_SERVERS]; /* versions the window's emb Forwards saw */
    /* a training window's buffers, made once for the longest window (bptt)
     * and reused: fresh ones every window cost page faults (~7 % of the
     * trainer's CPU); logits only in logits mode */
    float *wb_e, *wb_y[LM_MAX_LAYERS], *wb_mask[LM_MAX_LAYERS], *wb_logits, *wb_dlogits, *wb_dy, *wb_dx, *wb_h1,
        *wb_c1;
    unsigned fwd_seen;
} lm_task;

static const char *pnames[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};

/* The layer-k LSTM handle for (T, N), made on first use. */
static ps_status lstm_get(lm_task *t, int k, int64_t T, int64_t N, ps_lstm **out, ps_err *err) {
    lstm_slot *s = t->cache[k];
    for (int i = 0; i < LM_LSTM_CACHE; i++)
        if (s[i].l && s[i].T == T && s[i].N == N) { *out = s[i].l; return PS_OK; }
    ps_lstm_free(s[LM_LSTM_CACHE - 1].l);
    memmove(s + 1, s, (LM_LSTM_CACHE - 1) * sizeof *s);
    ps_lstm_shape sh = {T, N, k ? t->nhid : t->ninp, t->nhid};
    s[0] = (lstm_slot){NULL, T, N};
    ps_status st = ps_lstm_create(t->impl, sh, &s[0].l, err);
    *out = s[0].l;
    return st;
}

static ps_lstm_weights weights_of(const lm_task *t, int k) {
    return (ps_lstm_weights){t->w[k][0], t->w[k][1], t->w[k][2], t->w[k][3]};
}

/* Pull the LSTM's weights from psd (GetParameters of stage "rnn"). */
static ps_status pull_weights(lm_task *t, ps_client *cl, ps_err *err) {
    ps_wire_tensor_list l;
    uint64_t v = 0;
    ps_status st = ps_client_get_stage_parameters(cl, "rnn", &l, &v, err);
    int got = 0;
    for (size_t i = 0; st == PS_OK && i < l.n; i++) {
        int k, j, found = 0;
        char want[64];
        for (k = 0; k < t->nlayers && !found; k++)
            for (j = 0; j < 4 && !found; j++) {
                snprintf(want, sizeof want, "rnn.%s_l%d", pnames[j], k);
                if (strcmp(want, l.items[i].name)) continue;
                found = 1;
                if (l.items[i].bytes != (size_t)t->wn[k][j] * sizeof(float))
                    st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "GetParameters: %s has %zu bytes, expected %lld "
                                    "floats", want, l.items[i].bytes, (long long)t->wn[k][j]);
                else
                    memcpy(t->w[k][j], l.items[i].data, l.items[i].bytes), got++;
            }
    }
    if (st == PS_OK && got != 4 * t->nlayers)
        st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "GetParameters(stage rnn): %d of the LSTM's %d tensors", got,
                        4 * t->nlayers);
    if (st == PS_OK) t->w_version = v, t->have_w = 1;
    ps_wire_tensor_list_free(&l);
    return st;
}

/* One window: what a run of the round uses and produces. */
typedef struct lm_job {
    lm_task *t;
    const ps_task_env *env;
    const int64_t *ids, *tgt;   /* (T, N) */
    int64_t T, N;
    float *e, *y[LM_MAX_LAYERS], *mask[LM_MAX_LAYERS], *logits, *dlogits, *dy, *dx;
    float *h1, *c1;             /* the state after the window (nlayers, N, H) */
    double loss, sq_norm, scale;
    uint64_t version;
    uint64_t seed;
} lm_job;

/* The LSTM forward of job j's window over its embeddings j->e, dropout
 * between layers (masks drawn from j->seed, kept for the backward); the
 * output is j->y[nlayers - 1]. */
static ps_status lstm_window_forward(lm_job *j, ps_err *err) {
    lm_task *t = j->t;
    const int64_t T = j->T, N = j->N, H = t->nhid;
    ps_status st;
    ps_rng rng;
    ps_rng_seed(&rng, j->seed);
    const float *x = j->e;
    for (int k = 0; k < t->nlayers; k++) {
        ps_lstm *l;
        ps_lstm_weights w = weights_of(t, k);
        if ((st = lstm_get(t, k, T, N, &l, err)) ||
            (st = ps_lstm_forward(l, &w, x, t->h + k * N * H, t->c + k * N * H, j->y[k], j->h1 + k * N * H,
                                  j->c1 + k * N * H, err)))
            return st;
        if (k < t->nlayers - 1 && t->dropout > 0) {
            float keep = (float)(1.0 - t->dropout), sc = 1.0f / keep;
            ps_rng_uniforms(&rng, j->mask[k], T * N * H);   /* the stream in order, then compared */
            for (int64_t i = 0; i < T * N * H; i++) {
                j->mask[k][i] = j->mask[k][i] < keep ? sc : 0.0f;
                j->y[k][i] *= j->mask[k][i];
            }
        }
        x = j->y[k];
    }
    return PS_OK;
}

/* The LSTM backward from d loss / d output in j->dy: the weights' gradients
 * written into t->g, d loss / d embeddings into j->e (the
 * embedding's output is not needed any more: reused). */
static ps_status lstm_window_backward(lm_job *j, ps_err *err) {
    lm_task *t = j->t;
    const int64_t T = j->T, N = j->N, H = t->nhid;
    ps_status st;
    float *dy = j->dy;
    for (int k = t->nlayers - 1; k >= 0; k--) {
        ps_lstm *l;
        ps_lstm_weights w = weights_of(t, k);
        ps_lstm_grads g = {t->g[k][0], t->g[k][1], t->g[k][2], t->g[k][3], .set = 1}; /* one backward per layer */
        float *dx = k ? j->dx : j->e;
        if ((st = lstm_get(t, k, T, N, &l, err)) ||
            (st = ps_lstm_backward(l, &w, dy, NULL, NULL, dx, NULL, NULL, &g, err)))
            return st;
        if (k) { /* the layer below's output gradient: through its dropout, in one pass */
            if (t->dropout > 0)
                for (int64_t i = 0; i < T * N * H; i++) j->dy[i] = dx[i] * j->mask[k - 1][i];
            else
                memcpy(j->dy, dx, (size_t)(T * N * H) * sizeof(float));
            dy = j->dy;
        }
    }
    return PS_OK;
}

/* The LSTM's gradients t->g as PushGradients items named as the state_dict
 * ("rnn.weight_ih_l0", ...); names is their storage. */
static void rnn_grad_items(const lm_task *t, ps_wire_named *items, char (*names)[32]) {
    const int64_t H = t->nhid;
    for (int k = 0; k < t->nlayers; k++)
        for (int q = 0; q < 4; q++) {
            ps_wire_named *it = &items[k * 4 + q];
            snprintf(names[k * 4 + q], 32, "rnn.%s_l%d", pnames[q], k);
            *it = (ps_wire_named){.name = names[k * 4 + q], .ndim = q < 2 ? 2 : 1, .data = t->g[k][q]};
            it->dims[0] = 4 * H;
            if (q < 2) it->dims[1] = q == 0 ? (k ? H : t->ninp) : H;
        }
}

/* clip_grad_norm_(clip) for the global squared norm, times the lr schedule,
 * as the one scale every Step of the window gets. */
static double clip_scale(const lm_task *t, double sq_norm) {
    double norm = sqrt(sq_norm), coef = t->clip / (norm + 1e-6);
    return (coef < 1 ? coef : 1.0) * (t->lr / t->lr0);
}

static ps_status lm_once(void *arg, uint64_t ctx, int *kept, ps_err *err) {
    lm_job *j = arg;
    lm_task *t = j->t;
    ps_client *cl = j->env->cl;
    const int64_t T = j->T, N = j->N, H = t->nhid, V = t->ntoken;
    uint32_t rank = (uint32_t)j->env->rank;
    ps_status st;
    /* 1. embedding (psd) */
    ps_client_fwd f = {.ctx = ctx, .seq = 0, .rank = rank, .train = 1, .stage = "emb",
                       .input = {PS_CLIENT_I64, 2, {T, N}, j->ids}};
    ps_client_fwd_out fo = {.out = j->e, .out_cap = T * N * t->ninp};
    if ((st = ps_client_forward_ex(cl, &f, &fo, err))) return st;
    *kept = PS_KEPT_HELD;
    /* 2. the LSTM's weights when psd's version moved on */
    if ((!t->have_w || fo.version != t->w_version) && (st = pull_weights(t, cl, err))) return st;
    /* 3. the LSTM here, dropout between layers */
    if ((st = lstm_window_forward(j, err))) return st;
    const float *x = j->y[t->nlayers - 1];
    /* 4. decoder (psd) and the loss here */
    f = (ps_client_fwd){.ctx = ctx, .seq = 1, .rank = rank, .train = 1, .stage = "decoder",
                        .input = {PS_CLIENT_F32, 3, {T, N, H}, x}};
    uint32_t seq0 = 0;
    ps_client_tensor gt;
    ps_client_bwd b;
    if (t->fused) { /* psd computes the loss and backwards the decoder: only its input gradient returns */
        f.targets = (ps_client_tensor){PS_CLIENT_I64, 2, {T, N}, j->tgt};
        fo = (ps_client_fwd_out){.input_grad = j->dy, .input_grad_cap = T * N * H};
        if ((st = ps_client_forward_ex(cl, &f, &fo, err))) return st;
        j->loss = fo.loss;
    } else { /* the tutorial's: logits here, the loss here, their gradient back */
        fo = (ps_client_fwd_out){.out = j->logits, .out_cap = T * N * V};
        if ((st = ps_client_forward_ex(cl, &f, &fo, err))) return st;
        j->loss = ps_cross_entropy(j->logits, j->tgt, T * N, V, j->dlogits);
        uint32_t seq1 = 1;
        gt = (ps_client_tensor){PS_CLIENT_F32, 3, {T, N, V}, j->dlogits};
        float *ig[1] = {j->dy};
        int64_t cap[1] = {T * N * H};
        b = (ps_client_bwd){.ctx = ctx, .n = 1, .seqs = &seq1, .grads = &gt, .input_grads = ig, .input_caps = cap};
        if ((st = ps_client_backward_ex(cl, &b, NULL, err))) return st;
    }
    /* 5. backward: the LSTM, the embedding */
    if ((st = lstm_window_backward(j, err))) return st;
    gt = (ps_client_tensor){PS_CLIENT_F32, 3, {T, N, t->ninp}, j->e};
    b = (ps_client_bwd){.ctx = ctx, .n = 1, .seqs = &seq0, .grads = &gt};
    if ((st = ps_client_backward_ex(cl, &b, NULL, err))) return st;
    /* 6. the LSTM's gradients into the context; the global norm back */
    ps_wire_named items[LM_MAX_LAYERS * 4];
    char names[LM_MAX_LAYERS * 4][32];
    rnn_grad_items(t, items, names);
    if ((st = ps_client_push_gradients(cl, ctx, rank, 1, items, (size_t)(4 * t->nlayers), &j->sq_norm, err)))
        return st;
    /* 7. clip_grad_norm_(clip) and the lr schedule, as one scale */
    j->scale = clip_scale(t, j->sq_norm);
    ps_client_step_out so;
    ps_client_scalar loss = {"loss", j->loss};   /* the dashboard's loss where psd computes none (logits mode) */
    *kept = PS_KEPT_STEP;  /* from here a lost reply is settled by Step; before, the batch runs again */
    if ((st = ps_client_step_full(cl, ctx, 0, (float)j->scale, &loss, isfinite(j->loss), &so, NULL, err))) return st;
    j->version = so.version;
    return PS_OK;
}

/* Point j's buffers at the task's window buffers, made on first use for a
 * window of bptt x batch_size (no window is longer). */
static ps_status lm_buffers(lm_task *t, lm_job *j, ps_err *err) {
    if (!t->wb_e) {
        size_t tn = (size_t)t->bptt * (size_t)t->bs, th = tn * (size_t)t->nhid * sizeof(float);
        size_t lh = (size_t)(t->nlayers * t->bs * t->nhid) * sizeof(float);
        int ok = (t->wb_e = malloc(tn * (size_t)t->ninp * sizeof(float))) && (t->wb_dy = malloc(th)) &&
                 (t->wb_dx = malloc(th)) && (t->wb_h1 = malloc(lh)) && (t->wb_c1 = malloc(lh));
        if (ok && !t->fused)
            ok = (t->wb_logits = malloc(tn * (size_t)t->ntoken * sizeof(float))) &&
                 (t->wb_dlogits = malloc(tn * (size_t)t->ntoken * sizeof(float)));
        for (int k = 0; ok && k < t->nlayers; k++) ok = (t->wb_y[k] = malloc(th)) && (t->wb_mask[k] = malloc(th));
        if (!ok) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for a window's buffers");
    }
    j->e = t->wb_e, j->logits = t->wb_logits, j->dlogits = t->wb_dlogits, j->dy = t->wb_dy, j->dx = t->wb_dx;
    j->h1 = t->wb_h1, j->c1 = t->wb_c1;
    for (int k = 0; k < t->nlayers; k++) j->y[k] = t->wb_y[k], j->mask[k] = t->wb_mask[k];
    return PS_OK;
}

/* ---- stages on several servers ------------------------------------------ */

/* The Forward of stage emb for ids (T, N) into e (T, N, ninp): on its
 * server, or per shard with the window's ids in its rows, scattered back.
 * b: a training window's batch (train, context); NULL: evaluation. */
static ps_status emb_forward_multi(lm_task *t, const ps_task_env *env, ps_cluster_batch *b, const int64_t *ids,
                                   int64_t T, int64_t N, float *e, ps_err *err) {
    const ps_placement *p = ps_cluster_placement(env->cluster);
    const ps_place_stage *ps = &p->stages[t->emb_stage];
    const int64_t D = t->ninp;
    uint32_t rank = (uint32_t)env->rank;
    ps_status st;
    t->fwd_seen = 0;
    int n = ps->n_shards ? ps->n_shards : 1;
    for (int k = 0; k < n; k++) {
        int server = ps->n_shards ? ps->shards[k].server : ps->server;
        ps_client_fwd f = {.rank = rank, .stage = "emb"};
        ps_client_fwd_out o;
        int64_t cnt = T * N;
        if (ps->n_shards) {
            cnt = 0;
            for (int64_t i = 0; i < T * N; i++) {
                if (ids[i] < 0 || ids[i] >= ps->rows)
                    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "token id %lld is outside the embedding's %lld "
                                      "rows", (long long)ids[i], (long long)ps->rows);
                if (ids[i] >= ps->shards[k].lo && ids[i] < ps->shards[k].hi) t->sh_pos[cnt] = i, t->sh_ids[cnt++] = ids[i];
            }
            if (!cnt) continue;  /* no id of the window in this shard: not touched */
            f.input = (ps_client_tensor){PS_CLIENT_I64, 1, {cnt}, t->sh_ids};
            o = (ps_client_fwd_out){.out = t->sh_rows, .out_cap = cnt * D};
        } else {
            f.input = (ps_client_tensor){PS_CLIENT_I64, 2, {T, N}, ids};
            o = (ps_client_fwd_out){.out = e, .out_cap = T * N * D};
        }
        if (b) st = ps_cluster_forward(b, server, &f, &o, err);
        else if ((st = ps_client_forward_ex(ps_cluster_client(env->cluster, server), &f, &o, err)))
            ps_err_prefix(err, "%s", ps_cluster_name(env->cluster, server));
        if (st) return st;
        t->fwd_version[server] = o.version;
        t->fwd_seen |= 1u << server;
        if (ps->n_shards)
            for (int64_t i = 0; i < cnt; i++) memcpy(e + t->sh_pos[i] * D, t->sh_rows + i * D, (size_t)D * sizeof(float));
    }
    return PS_OK;
}

/* The Backward of stage emb with de (T, N, ninp): per shard the rows of its
 * positions (the same gather as its Forward). */
static ps_status emb_backward_multi(lm_task *t, const ps_task_env *env, ps_cluster_batch *b, const int64_t *ids,
                                    int64_t T, int64_t N, const float *de, ps_err *err) {
    const ps_place_stage *ps = &ps_cluster_placement(env->cluster)->stages[t->emb_stage];
    const int64_t D = t->ninp;
    uint32_t seq = 0;
    ps_status st;
    if (!ps->n_shards) {
        ps_client_tensor g = {PS_CLIENT_F32, 3, {T, N, D}, de};
        ps_client_bwd bw = {.n = 1, .seqs = &seq, .grads = &g};
        return ps_cluster_backward(b, ps->server, &bw, err);
    }
    for (int k = 0; k < ps->n_shards; k++) {
        int64_t cnt = 0;
        for (int64_t i = 0; i < T * N; i++)
            if (ids[i] >= ps->shards[k].lo && ids[i] < ps->shards[k].hi)
                memcpy(t->sh_rows + cnt++ * D, de + i * D, (size_t)D * sizeof(float));
        if (!cnt) continue;
        ps_client_tensor g = {PS_CLIENT_F32, 2, {cnt, D}, t->sh_rows};
        ps_client_bwd bw = {.n = 1, .seqs = &seq, .grads = &g};
        if ((st = ps_cluster_backward(b, ps->shards[k].server, &bw, err))) return st;
    }
    return PS_OK;
}

/* The LSTM's weights from rnn's server unless a Forward of this window
 * there showed them unchanged. */
static ps_status pull_weights_multi(lm_task *t, const ps_task_env *env, ps_err *err) {
    if (t->have_w && (t->fwd_seen & (1u << t->s_rnn)) && t->fwd_version[t->s_rnn] == t->w_version) return PS_OK;
    ps_status st = pull_weights(t, ps_cluster_client(env->cluster, t->s_rnn), err);
    return st ? ps_err_prefix(err, "%s", ps_cluster_name(env->cluster, t->s_rnn)) : PS_OK;
}

/* One window over several servers (ps_cluster_run): lm_once's steps with
 * each stage's calls on its server; no Step (the cluster sends them, with
 * b->grad_scale). */
static ps_status lm_once_multi(void *arg, ps_cluster_batch *b, ps_err *err) {
    lm_job *j = arg;
    lm_task *t = j->t;
    const ps_task_env *env = j->env;
    const int64_t T = j->T, N = j->N, H = t->nhid, V = t->ntoken;
    uint32_t rank = (uint32_t)env->rank;
    ps_status st;
    if ((st = emb_forward_multi(t, env, b, j->ids, T, N, j->e, err))) return st;
    if ((st = pull_weights_multi(t, env, err))) return st;
    if ((st = lstm_window_forward(j, err))) return st;
    const float *x = j->y[t->nlayers - 1];
    ps_client_fwd f = {.seq = 1, .rank = rank, .stage = "decoder", .input = {PS_CLIENT_F32, 3, {T, N, H}, x}};
    ps_client_fwd_out fo;
    if (t->fused) {
        f.targets = (ps_client_tensor){PS_CLIENT_I64, 2, {T, N}, j->tgt};
        fo = (ps_client_fwd_out){.input_grad = j->dy, .input_grad_cap = T * N * H};
        if ((st = ps_cluster_forward(b, t->s_dec, &f, &fo, err))) return st;
        j->loss = fo.loss;
    } else {
        fo = (ps_client_fwd_out){.out = j->logits, .out_cap = T * N * V};
        if ((st = ps_cluster_forward(b, t->s_dec, &f, &fo, err))) return st;
        j->loss = ps_cross_entropy(j->logits, j->tgt, T * N, V, j->dlogits);
        uint32_t seq1 = 1;
        ps_client_tensor gt = {PS_CLIENT_F32, 3, {T, N, V}, j->dlogits};
        float *ig[1] = {j->dy};
        int64_t cap[1] = {T * N * H};
        ps_client_bwd bw = {.n = 1, .seqs = &seq1, .grads = &gt, .input_grads = ig, .input_caps = cap};
        if ((st = ps_cluster_backward(b, t->s_dec, &bw, err))) return st;
    }
    if ((st = lstm_window_backward(j, err))) return st;
    if ((st = emb_backward_multi(t, env, b, j->ids, T, N, j->e, err))) return st;
    ps_wire_named items[LM_MAX_LAYERS * 4];
    char names[LM_MAX_LAYERS * 4][32];
    rnn_grad_items(t, items, names);
    if ((st = ps_cluster_push_gradients(b, t->s_rnn, items, (size_t)(4 * t->nlayers), err))) return st;
    /* clip_grad_norm_ over every server's part of the model, one scale for all Steps */
    j->sq_norm = ps_cluster_batch_sq_norm(b);
    j->scale = clip_scale(t, j->sq_norm);
    b->grad_scale = (float)j->scale;
    b->has_loss = 1;
    b->loss = j->loss;
    return PS_OK;
}

static void lm_release(void *arg, uint64_t ctx) {
    lm_job *j = arg;
    ps_client_release_context(j->env->cl, ctx, (uint32_t)j->env->rank, NULL, NULL);  /* best effort */
}

static ps_status lm_step(void *arg, uint64_t ctx, ps_err *err) {
    lm_job *j = arg;
    ps_client_step_out so;
    ps_client_scalar loss = {"loss", j->loss};
    ps_status st = ps_client_step_full(j->env->cl, ctx, 0, (float)j->scale, &loss, isfinite(j->loss), &so, NULL, err);
    if (!st) j->version = so.version;
    return st;
}

/* Mean loss of a batchified split (rows, LM_EVAL_BATCH) with psd's weights
 * (eval: no dropout, nothing kept), the state carried across windows. */
/* Progress of an evaluation pass: a live line on a terminal, else a line
 * every trainer.progress_every_s (it takes minutes on a busy machine). */
static void eval_progress(const ps_task_env *env, const char *what, size_t done, size_t all, double t0, double *next) {
    double now = ps_mono_s(), every = env->cfg->trainer.progress_every_s;
    int tty = isatty(STDERR_FILENO);
    if (tty && done < all)
        fprintf(stderr, "\r\033[K[rank %ld] evaluating %s: window %zu/%zu", env->rank, what, done, all);
    else if (tty)
        fprintf(stderr, "\r\033[K");
    else if (every > 0 && now >= *next && done < all) {
        fprintf(stderr, "[rank %ld] progress: evaluating %s: window %zu/%zu (%.0f%%), ends in ~%.0f s\n", env->rank,
                what, done, all, 100.0 * (double)done / (double)all, (now - t0) / (double)done * (double)(all - done));
        *next = now + every;
    }
}

static ps_status lm_eval_split(lm_task *t, const ps_task_env *env, const char *what, const int64_t *data, size_t rows,
                               double *loss, ps_err *err) {
    const int64_t N = LM_EVAL_BATCH, H = t->nhid, V = t->ntoken, B = t->bptt;
    float *e = malloc((size_t)(B * N * t->ninp) * sizeof(float)), *logits = malloc((size_t)(B * N * V) * sizeof(float));
    float *y[2] = {malloc((size_t)(B * N * H) * sizeof(float)), malloc((size_t)(B * N * H) * sizeof(float))};
    float *h = calloc((size_t)(t->nlayers * N * H), sizeof(float)), *c = calloc((size_t)(t->nlayers * N * H), sizeof(float));
    ps_status st = PS_OK;
    if (!e || !logits || !y[0] || !y[1] || !h || !c) st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    if (!st) st = env->cl ? pull_weights(t, env->cl, err) : (t->fwd_seen = 0, pull_weights_multi(t, env, err));
    ps_client *dec = env->cl ? env->cl : ps_cluster_client(env->cluster, t->s_dec);
    double total = 0, t0 = ps_mono_s(), next = t0 + env->cfg->trainer.progress_every_s;
    int64_t count = 0;
    size_t windows = rows > 1 ? (rows - 2) / (size_t)B + 1 : 0;
    for (size_t i = 0; !st && i + 1 < rows; i += (size_t)B) {
        if (i) eval_progress(env, what, i / (size_t)B, windows, t0, &next);
        int64_t T = (int64_t)(rows - 1 - i) < B ? (int64_t)(rows - 1 - i) : B;
        ps_client_fwd f = {.rank = (uint32_t)env->rank, .stage = "emb",
                           .input = {PS_CLIENT_I64, 2, {T, N}, data + i * N}};
        ps_client_fwd_out fo = {.out = e, .out_cap = B * N * t->ninp};
        if (!env->cl) {
            if ((st = emb_forward_multi(t, env, NULL, data + i * N, T, N, e, err))) break;
        } else if ((st = ps_client_forward_ex(env->cl, &f, &fo, err))) break;
        const float *x = e;
        for (int k = 0; k < t->nlayers && !st; k++) {
            ps_lstm *l;
            ps_lstm_weights w = weights_of(t, k);
            if (!(st = lstm_get(t, k, T, N, &l, err)))
                st = ps_lstm_forward(l, &w, x, h + k * N * H, c + k * N * H, y[k & 1], h + k * N * H, c + k * N * H,
                                     err);
            x = y[k & 1];
        }
        if (st) break;
        f = (ps_client_fwd){.rank = (uint32_t)env->rank, .stage = "decoder", .input = {PS_CLIENT_F32, 3, {T, N, H}, x}};
        fo = (ps_client_fwd_out){.out = logits, .out_cap = B * N * V};
        if ((st = ps_client_forward_ex(dec, &f, &fo, err))) break;
        total += ps_cross_entropy(logits, data + (i + 1) * N, T * N, V, NULL) * (double)(T * N);
        count += T * N;
    }
    eval_progress(env, what, windows, windows, t0, &next);
    free(e); free(logits); free(y[0]); free(y[1]); free(h); free(c);
    *loss = count ? total / (double)count : 0;
    return st;
}

static double size_of(const ps_config *cfg, const char *key) {
    for (int i = 0; i < cfg->model.n_sizes; i++)
        if (!strcmp(cfg->model.sizes[i].key, key)) return cfg->model.sizes[i].value;
    ps_model_def *d = ps_model_def_load("rnn_lm", NULL, NULL);   /* the model this task trains */
    const ps_size_key *k = d ? ps_model_def_size(d, key) : NULL;
    double v = k ? k->def : 0;
    ps_model_def_free(d);
    return v;
}

static void *lm_create(void) {
    lm_task *t = calloc(1, sizeof(lm_task));
    if (t) t->bptt = 35, t->clip = 0.25, t->impl = PS_LSTM_DNNL, t->fused = 1, t->threads = 1;
    return t;
}

static void lm_destroy(void *arg) {
    lm_task *t = arg;
    if (!t) return;
    ps_lm_corpus_free(t->corpus);
    free(t->train); free(t->valid); free(t->test); free(t->h); free(t->c);
    free(t->sh_ids); free(t->sh_pos); free(t->sh_rows);
    free(t->wb_e); free(t->wb_logits); free(t->wb_dlogits); free(t->wb_dy); free(t->wb_dx); free(t->wb_h1);
    free(t->wb_c1);
    for (int k = 0; k < LM_MAX_LAYERS; k++) {
        for (int q = 0; q < 4; q++) { free(t->w[k][q]); free(t->g[k][q]); }
        for (int i = 0; i < LM_LSTM_CACHE; i++) ps_lstm_free(t->cache[k][i].l);
        free(t->wb_y[k]); free(t->wb_mask[k]);
    }
    free(t);
}

static ps_status lm_set_flag(void *arg, const char *flag, const char *value, ps_err *err) {
    lm_task *t = arg;
    long n;
    if (!strcmp(flag, "--bptt")) {
        if (ps_parse_long(flag, value, 1, 1000, &n, err)) return err->code;
        t->bptt = (int)n;
        return PS_OK;
    }
    if (!strcmp(flag, "--clip"))
        return ps_parse_double(flag, value, 0, 1e300, PS_PARSE_OPEN_LO, &t->clip, err);
    if (!strcmp(flag, "--decoder")) {
        if (strcmp(value, "fused") && strcmp(value, "logits"))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--decoder '%s': fused or logits", value);
        t->fused = !strcmp(value, "fused");
        return PS_OK;
    }
    if (!strcmp(flag, "--threads")) {
        if (ps_parse_long(flag, value, 0, 1024, &n, err)) return err->code;
        t->threads = (int)n;
        return PS_OK;
    }
    if (!strcmp(flag, "--eval-only")) {
        t->eval_only = 1;
        return PS_OK;
    }
    if (!strcmp(flag, "--lstm")) {
        int v = ps_lstm_impl_parse(value);
        if (v < 0) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--lstm '%s': dnnl or ref", value);
        t->impl = (ps_lstm_impl)v;
        return PS_OK;
    }
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lm: unknown flag '%s'", flag);
}

static ps_status lm_init(void *arg, const ps_task_env *env, ps_err *err) {
    lm_task *t = arg;
    const ps_config *cfg = env->cfg;
    ps_status st = ps_lm_corpus_load(cfg->trainer.data, &t->corpus, err);
    if (st) return st;
    ps_lstm_set_threads(t->threads);
    t->bs = cfg->trainer.batch_size;
    t->dropout = size_of(cfg, "dropout");
    double ntok = size_of(cfg, "ntoken");
    if (ps_lm_vocab_size(t->corpus) > (int64_t)ntok)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: a vocabulary of %lld words does not fit the model's "
                          "ntoken %.0f (set model.sizes.ntoken, in psd's config too)", cfg->trainer.data,
                          (long long)ps_lm_vocab_size(t->corpus), ntok);
    if (cfg->optimizer.kind != PS_OPTIM_SGD || cfg->optimizer.momentum != 0 || cfg->optimizer.weight_decay != 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lm: the lr schedule needs plain SGD (optimizer.type sgd, "
                          "momentum 0, weight_decay 0)");
    t->lr0 = t->lr = cfg->optimizer.lr;
    t->best_val = INFINITY;
    /* this rank's contiguous share of the training stream */
    size_t n;
    const int64_t *tr = ps_lm_tokens(t->corpus, PS_LM_TRAIN, &n);
    size_t per = n / (size_t)(env->world_size - 1), first = per * (size_t)(env->rank - 1);
    t->train = ps_lm_batchify(tr + first, per, t->bs, &t->train_rows);
    if (!t->train || t->train_rows < 2)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s/train.txt: %zu tokens for rank %ld of %d trainers: too "
                          "few for batch size %d", cfg->trainer.data, per, env->rank, env->world_size - 1, t->bs);
    const int64_t *va = ps_lm_tokens(t->corpus, PS_LM_VALID, &n);
    t->valid = ps_lm_batchify(va, n, LM_EVAL_BATCH, &t->valid_rows);
    const int64_t *te = ps_lm_tokens(t->corpus, PS_LM_TEST, &n);
    t->test = ps_lm_batchify(te, n, LM_EVAL_BATCH, &t->test_rows);
    if (!t->valid || !t->test || t->valid_rows < 2 || t->test_rows < 2)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: valid.txt and test.txt need at least %d tokens each",
                          cfg->trainer.data, 2 * LM_EVAL_BATCH);
    return PS_OK;
}

/* Sizes from psd's parameters, buffers; once connected. */
static ps_status lm_connect(lm_task *t, const ps_task_env *env, ps_err *err) {
    if (strcmp(env->model, "rnn_lm"))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lm: psd serves model '%s'; the lm task needs rnn_lm",
                          env->model);
    t->nlayers = 0;
    for (size_t i = 0; i < env->params->n; i++) {
        const ps_ParameterInfo *p = &env->params->items[i];
        if (!strcmp(p->name, "encoder.weight"))  /* a shard: rows_total is the table's */
            t->ntoken = p->rows_total ? p->rows_total : p->shape[0], t->ninp = p->shape[1];
        if (!strncmp(p->name, "rnn.weight_hh_l", 15)) {  /* by index: a list of several servers may repeat it */
            char *end;
            long k = strtol(p->name + 15, &end, 10);
            if (*end || end == p->name + 15 || k < 0 || k >= LM_MAX_LAYERS)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lm: psd's parameter %s: not an LSTM layer 0..%d",
                                  p->name, LM_MAX_LAYERS - 1);
            if (k + 1 > t->nlayers) t->nlayers = (int)k + 1;
            t->nhid = p->shape[1];
        }
    }
    if (!t->ntoken || !t->nlayers || t->nlayers > LM_MAX_LAYERS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lm: psd's rnn_lm has no encoder.weight or no LSTM layers "
                          "(stage rnn)");
    if (ps_lm_vocab_size(t->corpus) > t->ntoken)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lm: a vocabulary of %lld words does not fit psd's ntoken "
                          "%lld", (long long)ps_lm_vocab_size(t->corpus), (long long)t->ntoken);
    int64_t H = t->nhid;
    for (int k = 0; k < t->nlayers; k++) {
        int64_t in = k ? H : t->ninp;
        int64_t n[4] = {4 * H * in, 4 * H * H, 4 * H, 4 * H};
        for (int q = 0; q < 4; q++) {
            t->wn[k][q] = n[q];
            t->w[k][q] = malloc((size_t)n[q] * sizeof(float));
            t->g[k][q] = malloc((size_t)n[q] * sizeof(float));
            if (!t->w[k][q] || !t->g[k][q]) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    if (!env->cl) {  /* stages on several servers */
        t->emb_stage = ps_placement_stage(ps_cluster_placement(env->cluster), "emb");
        t->s_emb = ps_cluster_stage_server(env->cluster, "emb");
        t->s_dec = ps_cluster_stage_server(env->cluster, "decoder");
        t->s_rnn = ps_cluster_stage_server(env->cluster, "rnn");
        if (t->emb_stage < 0 || t->s_dec < 0 || t->s_rnn < 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lm: stages decoder and rnn must each be placed on one "
                              "server and emb on one or sharded (model.placement)");
        size_t cols = (size_t)(t->bs > LM_EVAL_BATCH ? t->bs : LM_EVAL_BATCH), pos = (size_t)t->bptt * cols;
        t->sh_ids = malloc(pos * sizeof(int64_t));
        t->sh_pos = malloc(pos * sizeof(int64_t));
        t->sh_rows = malloc(pos * (size_t)t->ninp * sizeof(float));
        if (!t->sh_ids || !t->sh_pos || !t->sh_rows) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    t->h = calloc((size_t)(t->nlayers * t->bs * H), sizeof(float));
    t->c = calloc((size_t)(t->nlayers * t->bs * H), sizeof(float));
    if (!t->h || !t->c) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    /* logits that travel: a training window's (logits mode) and an evaluation window's */
    int64_t cols = !t->fused && t->bs > LM_EVAL_BATCH ? t->bs : LM_EVAL_BATCH;
    int64_t logit_bytes = (int64_t)t->bptt * cols * t->ntoken * 4;
    int64_t limit = (int64_t)env->cfg->server.rpc.max_message_bytes;
    if (logit_bytes + 4096 > limit)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "lm: a window's logits are %lld MiB (bptt %d x batch %lld x "
                          "ntoken %lld floats), over server.max_message_mb %d: lower --bptt%s or raise the limit (on "
                          "psd too)", (long long)(logit_bytes >> 20), t->bptt, (long long)cols, (long long)t->ntoken,
                          env->cfg->server.rpc.max_message_bytes >> 20, t->fused ? "" : " or --batch-size, use --decoder fused,");
    return PS_OK;
}

static ps_status lm_validate(lm_task *t, const ps_task_env *env, int epoch, ps_err *err) {
    double vl;
    ps_status st = lm_eval_split(t, env, "valid.txt", t->valid, t->valid_rows, &vl, err);
    if (st) return st;
    printf("| end of epoch %3d | valid loss %5.2f | valid ppl %8.2f | rank %ld\n", epoch + 1, vl, exp(vl), env->rank);
    if (vl < t->best_val) t->best_val = vl;
    else t->lr /= 4.0; /* as word_language_model: anneal when validation stops improving */
    fflush(stdout);
    return PS_OK;
}

static ps_status lm_begin_epoch(void *arg, const ps_task_env *env, int epoch, int *rounds, ps_err *err) {
    lm_task *t = arg;
    ps_status st;
    if (!t->h && (st = lm_connect(t, env, err))) return st;
    if (epoch > 0 && (st = lm_validate(t, env, epoch - 1, err))) return st;
    memset(t->h, 0, (size_t)(t->nlayers * t->bs * t->nhid) * sizeof(float));
    memset(t->c, 0, (size_t)(t->nlayers * t->bs * t->nhid) * sizeof(float));
    *rounds = t->eval_only ? 0 : (int)((t->train_rows - 1 + (size_t)t->bptt - 1) / (size_t)t->bptt);
    t->log_loss = 0;
    t->log_n = 0;
    t->log_t0 = ps_mono_s();
    t->epoch_seen = epoch;
    return PS_OK;
}

static ps_status lm_run_round(void *arg, const ps_task_env *env, int epoch, int r, ps_task_round *out, ps_err *err) {
    lm_task *t = arg;
    size_t i = (size_t)r * (size_t)t->bptt;
    int64_t T = (int64_t)(t->train_rows - 1 - i) < t->bptt ? (int64_t)(t->train_rows - 1 - i) : t->bptt;
    int64_t N = t->bs, H = t->nhid;
    lm_job j = {.t = t, .env = env, .ids = t->train + i * (size_t)N, .tgt = t->train + (i + 1) * (size_t)N, .T = T,
                .N = N, .seed = ((uint64_t)env->rank << 48) ^ ((uint64_t)epoch << 32) ^ (uint64_t)r ^ env->cfg->trainer.seed};
    ps_status st = lm_buffers(t, &j, err);
    if (!st && !env->cl) {
        ps_cluster_batch cb;
        st = ps_cluster_run(env->cluster, env->retry, env->ids, "batch", lm_once_multi, &j, &cb, err);
        j.version = cb.version;
    } else if (!st) {
        ps_once_ops ops = {.unit = "batch", .run = lm_once, .step = lm_step, .arg = &j, .marks_step = 1,
                           .release = lm_release};
        st = ps_retry_once(env->retry, env->ids, &ops, err);
    }
    if (!st) { /* the window is done: carry its state (detached) */
        memcpy(t->h, j.h1, (size_t)(t->nlayers * N * H) * sizeof(float));
        memcpy(t->c, j.c1, (size_t)(t->nlayers * N * H) * sizeof(float));
        *out = (ps_task_round){.loss = j.loss, .samples = T * N, .version = j.version};
        t->log_loss += j.loss;
        t->log_n++;
        int every = env->cfg->trainer.log_every;
        if (t->log_n == every) {
            double ms = (ps_mono_s() - t->log_t0) * 1000.0 / every, l = t->log_loss / every;
            int rounds = (int)((t->train_rows - 1 + (size_t)t->bptt - 1) / (size_t)t->bptt);
            printf("| epoch %3d | %5d/%5d batches | lr %02.2f | ms/batch %5.2f | loss %5.2f | ppl %8.2f | rank %ld\n",
                   epoch + 1, r + 1, rounds, t->lr, ms, l, exp(l), env->rank);
            fflush(stdout);
            t->log_loss = 0;
            t->log_n = 0;
            t->log_t0 = ps_mono_s();
        }
    }
    return st;
}

static ps_status lm_evaluate(void *arg, const ps_task_env *env, ps_err *err) {
    lm_task *t = arg;
    ps_status st;
    if (!t->h && (st = lm_connect(t, env, err))) return st;
    if ((st = lm_validate(t, env, t->epoch_seen, err))) return st;
    double tl;
    if ((st = lm_eval_split(t, env, "test.txt", t->test, t->test_rows, &tl, err))) return st;
    /* the unigram model of the training counts (add-one), on the same test tokens */
    const int64_t *cnt = ps_lm_train_counts(t->corpus);
    int64_t V = ps_lm_vocab_size(t->corpus);
    double tot = 0, ul = 0;
    for (int64_t v = 0; v < V; v++) tot += (double)cnt[v] + 1;
    size_t n = (t->test_rows - 1) * LM_EVAL_BATCH;
    for (size_t i = 0; i < n; i++) ul -= log(((double)cnt[t->test[LM_EVAL_BATCH + i]] + 1) / tot);
    ul /= (double)n;
    printf("| End of training | test loss %5.2f | test ppl %8.2f | unigram test ppl %8.2f | ratio %.3f | rank %ld\n",
           tl, exp(tl), exp(ul), exp(tl) / exp(ul), env->rank);
    fflush(stdout);
    return PS_OK;
}

static const ps_task_flag lm_flags[] = {
    {"--data", "-d", "DIR", "trainer.data", "directory with train.txt, valid.txt, test.txt (trainer.data)"},
    {"--batch-size", "-b", "N", "trainer.batch_size", "columns of the batchified stream (trainer.batch_size; 20)"},
    {"--bptt", NULL, "N", NULL, "sequence length of a window (35)"},
    {"--clip", NULL, "X", NULL, "clip the global gradient norm to X (0.25)"},
    {"--lstm", NULL, "IMPL", NULL, "the trainer's LSTM: dnnl (oneDNN) or ref (plain C)"},
    {"--threads", NULL, "N", NULL, "oneDNN threads of the LSTM here (1; 0 = OpenMP's default, every CPU)"},
    {"--eval-only", NULL, NULL, NULL, "no training: validation and test perplexity of psd's weights"},
    {"--decoder", NULL, "MODE", NULL, "fused (psd computes the loss; default) or logits (the tutorial's: logits here)"},
    {0},
};

const ps_task ps_task_lm = {
    .name = "lm",
    .description = "model-parallel RNN language model: embedding and decoder on psd (rnn_lm), LSTM here",
    .unit = "batch",
    .flags = lm_flags,
    .create = lm_create,
    .set_flag = lm_set_flag,
    .init = lm_init,
    .begin_epoch = lm_begin_epoch,
    .run_round = lm_run_round,
    .evaluate = lm_evaluate,
    .destroy = lm_destroy,
};
