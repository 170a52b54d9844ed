/* test_batch_forward - batched training Forwards and Backwards
 * (server.batch_wait_ms, server.batch_backward): per-context results equal
 * unbatched ones, through the real service.
 *
 * Two in-process services over real gRPC on loopback, each with its own
 * model built from the same file and seed: A batches training Forwards, B
 * does not. K trainers (threads, each its own client and context) send A
 * concurrently a training Forward (seq 1) and then a fused one (seq 2,
 * targets: the loss and its backward at once); A's batcher is sized to
 * the K forwards' samples, so each round of K runs as one combined
 * forward, and the fused forwards' backward halves as one combined
 * backward; then another plain one (seq 3). Then every context's Backward
 * of seqs 1 and 3 in one call (gradients that depend on its outputs),
 * concurrently: seq 1's of every context combined into one backward, then
 * seq 3's, added into what seq 1 gave; and its accumulated gradients. The same calls go to B one
 * context at a time: the unbatched reference. Per context, outputs, losses,
 * input gradients and every parameter gradient of A must equal B's within
 * max|diff| <= tol * max|B| (1e-6 on the reference backend, 1e-5 on dnnl),
 * which also needs each context's own dropout masks (both models have
 * dropout) and its own parameter gradients (nothing summed across
 * contexts: one context's parameter gradient leaking into another's fails
 * the comparison). A retried Backward is answered as without batching.
 * Also a run of stages short of the model (mnist_cnn's conv),
 * int64 ids with a row-sparse gradient (rnn_lm's emb), convnext's Permute
 * and Scale (layer scale) kinds in a residual block, LayerNorm (its saved
 * mean and rstd cut per context; affine and not, one and several rows a
 * sample), PReLU, RReLU, AlphaDropout and FeatureAlphaDropout (each context's slope gradients, slopes and
 * masks its own), a vit encoder block (class token and positional embedding
 * Parameters, LayerNorm, MultiheadAttention with attention dropout - its
 * tape cut per context, each context's attention mask its own -, a GELU
 * MLP, residual Adds, the class token's row by IndexSelect) and minGPT's
 * attention written by hand (psd-export's nodes of
 * tests/export/attention.py), numpy broadcasts (Sub, Add, Mul, Div of
 * computed tensors of two shapes), Maximum, a comparison and Where, Sin, Log1p and Flip, Bilinear and RandnLike, key padding masks computed from the ids
 * (each context's samples padded otherwise: its mask its own; a context
 * with a sample of padding only refused alone), cross-attention over a
 * memory of another length, parameters used at several
 * sites (share: and tie:, each context's gradient summed over the sites and
 * its own), recurrent cells in an unrolled loop (LSTMCell, GRUCell: each
 * call's tape cut per context), a group whose one member is refused (only it
 * gets the error; the others are answered as unbatched), that a model with
 * BatchNorm is never combined, and on a CUDA device (when there is one;
 * else "cuda: skipped") mnist_cnn and the vit block on cuda:0 within 1e-5. */
#include <grpc/grpc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model.h"
#include "ps_client.h"
#include "rpc_server.h"
#include "service.h"
#include "support/tmpdir.h"

#define MAXMSG (64 << 20)
#define K 3
/* Batching service's wait: its groups are sized to the K trainers' samples
 * and run as soon as every trainer's call is in, so the wait only bounds a
 * broken run; long, so that a loaded machine delaying one trainer's call
 * does not split a group (under the clients' 60 s deadline). */
#define WAIT_MS 45000

typedef struct server {
    ps_model *model;
    ps_service *svc;
    ps_rpc_server *srv;
    char addr[64];
} server;

static const char *g_device;   /* the stages below on this device (NULL: cpu) */
static int g_pad;              /* int64 inputs padded: token ids 1..1000, each sample's last ones pad id 0 */
static const char *g_place[2]; /* mnist_cnn's conv and fc, or a test file's main */

static int start(server *sv, const char *file, const char *backend, double wait_ms, int max_samples, int bwd) {
    ps_err err = {0};
    ps_model_opts mo = {.file = file, .cpu_backend = backend, .seed = 7, .compute_threads = 2, .lr = 0.05f};
    for (int i = 0; g_device && i < 2 && g_place[i]; i++) {
        mo.placement_stage[mo.n_placement] = g_place[i];
        mo.placement_device[mo.n_placement++] = g_device;
    }
    if (strstr(file, "rnn_lm")) {   /* small: the test is about the slicing, not the size */
        static const char *keys[] = {"ntoken", "ninp", "nhid"};
        static const double vals[] = {1000, 32, 32};
        mo.n_sizes = 3;
        for (int i = 0; i < 3; i++) {
            mo.size_key[i] = keys[i];
            mo.size_value[i] = vals[i];
        }
    }
    memset(sv, 0, sizeof *sv);
    sv->model = ps_model_create(&mo, &err);
    CHECK_MSG(sv->model, "%s", err.msg);
    if (!sv->model) return -1;
    ps_service_opts so = {.context_ttl_s = 60, .max_contexts = 64, .max_message_bytes = MAXMSG,
                          .batch_wait_ms = wait_ms, .batch_max_samples = max_samples, .batch_backward = bwd};
    sv->svc = ps_service_create(sv->model, &so, &err);
    CHECK_MSG(sv->svc, "%s", err.msg);
    if (!sv->svc) return -1;
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    /* a held forward keeps its handler thread: one per trainer, and one more */
    sv->srv = ps_rpc_server_create("127.0.0.1:0", K + 1, MAXMSG, methods, nm, sv->svc, &err);
    CHECK_MSG(sv->srv, "%s", err.msg);
    if (!sv->srv || ps_rpc_server_start(sv->srv, &err)) return -1;
    snprintf(sv->addr, sizeof sv->addr, "127.0.0.1:%d", ps_rpc_server_port(sv->srv));
    return 0;
}

static void stop(server *sv) {
    if (sv->srv) ps_rpc_server_free(sv->srv);
    ps_service_free(sv->svc);
    ps_model_free(sv->model);
}

/* What one trainer sends and gets. */
typedef struct trainer {
    const char *addr;
    uint64_t ctx;
    int n, in_per, out_per;
    int i64;                /* the input is int64 ids (no input gradient) */
    const char *stage, *last_stage;
    void *x;                /* (n, in_per) */
    int64_t tgt[8];
    float *out;             /* seq 1's output (n, out_per) */
    float *out3;            /* seq 3's (the same input, its own dropout masks) */
    double loss;            /* seq 2's fused loss */
    float *gin2;            /* seq 2's input gradient */
    float *gin1;            /* seq 1's input gradient (the Backward) */
    float *gin3;            /* seq 3's (the same Backward) */
    ps_wire_tensor_list grads;
    ps_status retry_st;     /* the same Backward again */
    int64_t in_dims[4];
    int in_ndim;
    ps_status st;
    char msg[600];
} trainer;

static void fail(trainer *t, ps_status st, const ps_err *err, const char *what) {
    if (t->st) return;
    t->st = st;
    snprintf(t->msg, sizeof t->msg, "%s: %s", what, err->msg);
}

/* The two forwards (seq 1 plain, seq 2 fused) of one trainer. */
static void *forwards(void *arg) {
    trainer *t = arg;
    ps_err err = {0};
    ps_client *cl = ps_client_create(t->addr, 60000, MAXMSG, &err);
    if (!cl) { fail(t, PS_ERR_UNAVAILABLE, &err, "client"); return NULL; }
    ps_client_fwd f = {.ctx = t->ctx, .seq = 1, .rank = (uint32_t)(t->ctx & 0xff), .train = 1,
                       .stage = t->stage, .last_stage = t->last_stage,
                       .input = {.dtype = t->i64 ? PS_CLIENT_I64 : PS_CLIENT_F32, .ndim = 1 + t->in_ndim,
                                 .data = t->x}};
    f.input.dims[0] = t->n;
    memcpy(f.input.dims + 1, t->in_dims, sizeof(int64_t) * (size_t)t->in_ndim);
    ps_client_fwd_out o = {.out = t->out, .out_cap = (int64_t)t->n * t->out_per};
    ps_status st = ps_client_forward_ex(cl, &f, &o, &err);
    if (st) fail(t, st, &err, "forward seq 1");
    f.seq = 2;
    f.targets = (ps_client_tensor){.dtype = PS_CLIENT_I64, .ndim = 1, .dims = {t->n}, .data = t->tgt};
    ps_client_fwd_out o2 = {.input_grad = t->i64 ? NULL : t->gin2, .input_grad_cap = (int64_t)t->n * t->in_per};
    if (!st && (st = ps_client_forward_ex(cl, &f, &o2, &err))) fail(t, st, &err, "fused forward seq 2");
    t->loss = o2.loss;
    f.seq = 3;
    f.targets = (ps_client_tensor){0};
    ps_client_fwd_out o3 = {.out = t->out3, .out_cap = (int64_t)t->n * t->out_per};
    if (!st && (st = ps_client_forward_ex(cl, &f, &o3, &err))) fail(t, st, &err, "forward seq 3");
    ps_client_free(cl);
    return NULL;
}

/* The Backward of seqs 1 and 3 in one call (d loss / d output = a function
 * of the output; the second one is added into what the first gave) and
 * the context's gradients. */
static void backward(trainer *t) {
    ps_err err = {0};
    ps_client *cl = ps_client_create(t->addr, 60000, MAXMSG, &err);
    if (!cl) { fail(t, PS_ERR_UNAVAILABLE, &err, "client"); return; }
    size_t no = (size_t)t->n * (size_t)t->out_per;
    float *g = malloc(2 * no * sizeof *g);
    for (size_t i = 0; i < no; i++) {
        g[i] = 0.25f * t->out[i] - 0.01f * (float)(i % 7);
        g[no + i] = 0.5f * t->out3[i] + 0.02f * (float)(i % 5);
    }
    uint32_t seqs[2] = {1, 3};
    ps_client_tensor gt[2] = {{.dtype = PS_CLIENT_F32, .ndim = 2, .dims = {t->n, t->out_per}, .data = g},
                              {.dtype = PS_CLIENT_F32, .ndim = 2, .dims = {t->n, t->out_per}, .data = g + no}};
    float *gins[2] = {t->gin1, t->gin3};
    int64_t caps[2] = {(int64_t)t->n * t->in_per, (int64_t)t->n * t->in_per};
    ps_client_bwd b = {.ctx = t->ctx, .n = 2, .seqs = seqs, .grads = gt, .input_grads = t->i64 ? NULL : gins,
                       .input_caps = caps};
    ps_client_step_out so;
    ps_status st = ps_client_backward_ex(cl, &b, &so, &err);
    if (st) fail(t, st, &err, "backward seqs 1 and 3");
    if (!st && (st = ps_client_get_gradients(cl, t->ctx, &t->grads, &err))) fail(t, st, &err, "get gradients");
    if (!st) t->retry_st = ps_client_backward_ex(cl, &b, &so, &err);   /* a retry: answered from the record */
    free(g);
    ps_client_free(cl);
}

static void *backward_th(void *arg) {
    backward(arg);
    return NULL;
}

static void trainer_init(trainer *t, const char *addr, int i, int n, const ps_stage_info *s0, const ps_stage_info *sl,
                         const char *stage, const char *last_stage) {
    memset(t, 0, sizeof *t);
    t->addr = addr;
    t->stage = stage;
    t->last_stage = last_stage;
    t->i64 = s0->in_dtype == PS_DTYPE_I64;
    t->ctx = 0xba7c000000000100ULL + (uint64_t)i;
    t->n = n;
    t->in_ndim = s0->in_ndim;
    t->in_per = 1;
    for (int d = 0; d < s0->in_ndim; d++) t->in_per *= (int)(t->in_dims[d] = s0->in_dims[d]);
    t->out_per = 1;
    for (int d = 0; d < sl->out_ndim; d++) t->out_per *= (int)sl->out_dims[d];
    t->x = malloc(sizeof(int64_t) * (size_t)(n * t->in_per));
    for (int j = 0; j < n * t->in_per; j++) {   /* each trainer its own data */
        unsigned h = (unsigned)(j + 1) * 2654435761u + (unsigned)i * 40503u;
        if (t->i64 && g_pad)   /* sample j / in_per keeps 1 + (sample + 2 i) % in_per tokens: each context its own */
            ((int64_t *)t->x)[j] = j % t->in_per < 1 + (j / t->in_per + 2 * i) % t->in_per ? 1 + h % 999 : 0;
        else if (t->i64) ((int64_t *)t->x)[j] = h % 1000;
        else ((float *)t->x)[j] = (float)(h % 2000) / 1000.0f - 1.0f;
    }
    for (int j = 0; j < n; j++) t->tgt[j] = (j * 3 + i) % t->out_per;
    t->out = calloc((size_t)(n * t->out_per), sizeof(float));
    t->out3 = calloc((size_t)(n * t->out_per), sizeof(float));
    t->gin3 = calloc((size_t)(n * t->in_per), sizeof(float));
    t->gin1 = calloc((size_t)(n * t->in_per), sizeof(float));
    t->gin2 = calloc((size_t)(n * t->in_per), sizeof(float));
    ps_wire_tensor_list_init(&t->grads, (size_t)1 << 30);
}

static void trainer_free(trainer *t) {
    free(t->x);
    free(t->out);
    free(t->out3);
    free(t->gin3);
    free(t->gin1);
    free(t->gin2);
    ps_wire_tensor_list_free(&t->grads);
}

/* max|got - want| <= tol * max|want| */
static void same(const char *what, const float *got, const float *want, size_t n, double tol) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(want[i]));
    check_array(what, got, want, n, tol * mx, 0);
}

/* K trainers' forwards (stages stage..last_stage of file's model) on a
 * batching psd and one at a time on a non-batching one: the same per
 * context. */
static void run_model(const char *file, const char *stage, const char *last_stage, const char *backend, double tol) {
    static const int ns[K] = {2, 3, 5};
    int total = 0;
    for (int i = 0; i < K; i++) total += ns[i];
    server a, b;
    if (start(&a, file, backend, WAIT_MS, total, 1) || start(&b, file, backend, 0, 256, 0)) {
        stop(&a);
        return;
    }
    int first = stage ? ps_model_find_stage(a.model, stage) : 0;
    int last = last_stage ? ps_model_find_stage(a.model, last_stage) : stage ? first : ps_model_num_stages(a.model) - 1;
    const ps_stage_info *s0 = ps_model_stage(a.model, first), *sl = ps_model_stage(a.model, last);
    CHECK(ps_model_can_group(a.model, first, last));
    trainer ta[K], tb[K];
    pthread_t th[K];
    for (int i = 0; i < K; i++) {
        trainer_init(&ta[i], a.addr, i, ns[i], s0, sl, stage, last_stage);
        trainer_init(&tb[i], b.addr, i, ns[i], s0, sl, stage, last_stage);
    }
    for (int i = 0; i < K; i++) pthread_create(&th[i], NULL, forwards, &ta[i]);
    for (int i = 0; i < K; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < K; i++) pthread_create(&th[i], NULL, backward_th, &ta[i]);
    for (int i = 0; i < K; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < K; i++) {   /* the reference: one context at a time */
        forwards(&tb[i]);
        backward(&tb[i]);
    }
    uint64_t held, combined;
    ps_service_batch_stats(a.svc, &held, &combined);
    CHECK_MSG(held == 3 * K && combined == 3 * K, "%s/%s: %llu forwards held, %llu combined (want %d, %d)", file,
              backend, (unsigned long long)held, (unsigned long long)combined, 3 * K, 3 * K);
    ps_service_batch_bwd_stats(a.svc, &held, &combined);   /* the fused ones', seq 1's and seq 3's */
    CHECK_MSG(held == 3 * K && combined == 3 * K, "%s/%s: %llu backwards held, %llu combined (want %d, %d)", file,
              backend, (unsigned long long)held, (unsigned long long)combined, 3 * K, 3 * K);
    ps_service_batch_stats(b.svc, &held, &combined);
    CHECK(held == 0 && combined == 0);
    ps_service_batch_bwd_stats(b.svc, &held, &combined);
    CHECK(held == 0 && combined == 0);
    char what[160];
    for (int i = 0; i < K; i++) {
        trainer *p = &ta[i], *q = &tb[i];
        CHECK_MSG(!p->st && !q->st, "trainer %d: %s / %s", i, p->msg, q->msg);
        if (p->st || q->st) continue;
        CHECK_MSG(p->retry_st == q->retry_st && q->retry_st != PS_OK, "ctx %d: a retried Backward: %d (want %d)", i,
                  p->retry_st, q->retry_st);
        size_t no = (size_t)p->n * (size_t)p->out_per, ni = (size_t)p->n * (size_t)p->in_per;
        snprintf(what, sizeof what, "%s/%s ctx %d: output", file, backend, i);
        same(what, p->out, q->out, no, tol);
        snprintf(what, sizeof what, "%s/%s ctx %d: output of seq 3", file, backend, i);
        same(what, p->out3, q->out3, no, tol);
        snprintf(what, sizeof what, "%s/%s ctx %d: fused loss", file, backend, i);
        float pl = (float)p->loss, ql = (float)q->loss;
        same(what, &pl, &ql, 1, tol);
        if (!p->i64) {
            snprintf(what, sizeof what, "%s/%s ctx %d: fused input gradient", file, backend, i);
            same(what, p->gin2, q->gin2, ni, tol);
            snprintf(what, sizeof what, "%s/%s ctx %d: input gradient", file, backend, i);
            same(what, p->gin1, q->gin1, ni, tol);
            snprintf(what, sizeof what, "%s/%s ctx %d: input gradient of seq 3", file, backend, i);
            same(what, p->gin3, q->gin3, ni, tol);
        }
        CHECK(p->grads.n == q->grads.n && p->grads.n > 0);
        for (size_t j = 0; j < p->grads.n && j < q->grads.n; j++) {
            snprintf(what, sizeof what, "%s/%s ctx %d: gradient of %s", file, backend, i, q->grads.items[j].name);
            CHECK(!strcmp(p->grads.items[j].name, q->grads.items[j].name) &&
                  p->grads.items[j].bytes == q->grads.items[j].bytes);
            if (p->grads.items[j].bytes == q->grads.items[j].bytes)
                same(what, p->grads.items[j].data, q->grads.items[j].data, q->grads.items[j].bytes / sizeof(float),
                     tol);
        }
    }
    /* the contexts' gradients differ from each other (each its own, not a sum) */
    if (!ta[0].st && !ta[1].st && ta[0].grads.n && ta[1].grads.n)
        CHECK(memcmp(ta[0].grads.items[0].data, ta[1].grads.items[0].data, ta[0].grads.items[0].bytes) != 0);
    for (int i = 0; i < K; i++) {
        trainer_free(&ta[i]);
        trainer_free(&tb[i]);
    }
    stop(&a);
    stop(&b);
}

/* Seq 1 alone. */
static void *forward1(void *arg) {
    trainer *t = arg;
    ps_err err = {0};
    ps_client *cl = ps_client_create(t->addr, 60000, MAXMSG, &err);
    if (!cl) { fail(t, PS_ERR_UNAVAILABLE, &err, "client"); return NULL; }
    ps_client_fwd f = {.ctx = t->ctx, .seq = 1, .rank = (uint32_t)(t->ctx & 0xff), .train = 1, .stage = t->stage,
                       .input = {.dtype = PS_CLIENT_I64, .ndim = 1 + t->in_ndim, .dims = {t->n}, .data = t->x}};
    memcpy(f.input.dims + 1, t->in_dims, sizeof(int64_t) * (size_t)t->in_ndim);
    ps_client_fwd_out o = {.out = t->out, .out_cap = (int64_t)t->n * t->out_per};
    ps_status st = ps_client_forward_ex(cl, &f, &o, &err);
    if (st) fail(t, st, &err, "forward");
    ps_client_free(cl);
    return NULL;
}

/* One member of a group is refused (an id outside the table): the group
 * fails as a whole, every member runs alone, and only that one gets the
 * error; the others are answered as without batching. */
static void bad_member(void) {
    static const int ns[K] = {2, 3, 5};
    server a, b;
    if (start(&a, "configs/models/rnn_lm.yaml", "ref", WAIT_MS, 10, 1) ||
        start(&b, "configs/models/rnn_lm.yaml", "ref", 0, 256, 0)) {
        stop(&a);
        return;
    }
    int e = ps_model_find_stage(a.model, "emb");
    const ps_stage_info *s0 = ps_model_stage(a.model, e);
    trainer ta[K], tb[K];
    pthread_t th[K];
    for (int i = 0; i < K; i++) {
        trainer_init(&ta[i], a.addr, i, ns[i], s0, s0, "emb", NULL);
        trainer_init(&tb[i], b.addr, i, ns[i], s0, s0, "emb", NULL);
    }
    ((int64_t *)ta[1].x)[1] = 5000;   /* ntoken is 1000 */
    for (int i = 0; i < K; i++) pthread_create(&th[i], NULL, forward1, &ta[i]);
    for (int i = 0; i < K; i++) pthread_join(th[i], NULL);
    CHECK_MSG(ta[1].st == PS_ERR_INVALID_ARGUMENT && strstr(ta[1].msg, "5000"), "%d %s", ta[1].st, ta[1].msg);
    uint64_t held, combined;
    ps_service_batch_stats(a.svc, &held, &combined);
    CHECK_MSG(held == K && combined == 0, "%llu held, %llu combined", (unsigned long long)held,
              (unsigned long long)combined);
    for (int i = 0; i < K; i += 2) {
        forward1(&tb[i]);
        CHECK_MSG(!ta[i].st && !tb[i].st, "%s / %s", ta[i].msg, tb[i].msg);
        same("a good member of a failed group", ta[i].out, tb[i].out, (size_t)ta[i].n * (size_t)ta[i].out_per, 1e-6);
    }
    for (int i = 0; i < K; i++) {
        trainer_free(&ta[i]);
        trainer_free(&tb[i]);
    }
    stop(&a);
    stop(&b);
}

/* A combined backward refuses tapes it cannot lay side by side (other
 * stages), changing no accumulator; the service then runs each alone. */
static void group_refused(void) {
    ps_err err = {0};
    ps_model_opts mo = {.file = "configs/models/mnist_cnn.yaml", .cpu_backend = "ref", .seed = 7,
                        .compute_threads = 1, .lr = 0.05f};
    ps_model *m = ps_model_create(&mo, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!m) return;
    float x[2 * 784], out[2 * 10], g[2 * 9216];
    for (int i = 0; i < 2 * 784; i++) x[i] = (float)(i % 13) / 13.0f;
    for (int i = 0; i < 2 * 9216; i++) g[i] = (float)(i % 5) / 50.0f;
    ps_tape *t[2] = {NULL, NULL};
    CHECK(ps_model_forward_range(m, 0, 1, x, 2, 1, NULL, 1, out, &t[0], NULL, &err) == PS_OK);
    CHECK(ps_model_forward_range(m, 0, 0, x, 2, 1, NULL, 2, NULL, &t[1], NULL, &err) == PS_OK);
    ps_grads *acc[2] = {ps_grads_create(m, &err), ps_grads_create(m, &err)};
    const float *gs[2] = {g, g};
    float *gin[2] = {NULL, NULL};
    ps_status st = t[0] && t[1] ? ps_model_backward_group(m, 2, t, gs, gin, acc, &err) : PS_OK;
    CHECK_MSG(st == PS_ERR_FAILED_PRECONDITION, "%d %s", st, err.msg);
    for (int i = 0; i < 2; i++) {
        double sq = -1;
        CHECK(ps_grads_sq_norm(m, acc[i], &sq, &err) == PS_OK && sq == 0);
        ps_grads_free(acc[i]);
        ps_tape_free(t[i]);
    }
    ps_model_free(m);
}

/* A one-stage model (name: cn, stage main, per-sample input shape in_shape,
 * the nodes' YAML lines) written to a temporary file, through run_model on
 * ref (1e-6) and dnnl (1e-5), or on g_device (1e-5) when set. */
static void run_file(const char *in_shape, const char *nodes) {
    char dir[] = "/tmp/ps-test-batch-forward.XXXXXX", path[64];
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    snprintf(path, sizeof path, "%s/cn.yaml", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "name: cn\nstages:\n  - name: main\n    input: {shape: %s}\n    nodes:\n%s", in_shape, nodes);
    fclose(f);
    if (g_device) {
        run_model(path, NULL, NULL, "ref", 1e-5);
    } else {
        run_model(path, NULL, NULL, "ref", 1e-6);
        run_model(path, NULL, NULL, "dnnl", 1e-5);
    }
    test_rmtree(dir);
}

/* convnext's per-sample kinds: Permute (to and from the channels-last layout, Linear on the last dim
 * between) and Scale (its layer scale) in a residual block. */
static void run_convnext_kinds(void) {
    run_file("[4, 3, 3]",
             "      - {name: stem, kind: Conv2d, out_channels: 8, kernel_size: 1}\n"
             "      - {name: blk.p, kind: Permute, dims: [0, 2, 3, 1]}\n"
             "      - {name: blk.fc, kind: Linear, out_features: 8}\n"
             "      - {name: blk.q, kind: Permute, dims: [0, 3, 1, 2]}\n"
             "      - {name: blk, kind: Scale, shape: [8, 1, 1], parameter: layer_scale, init: {layer_scale: \"normal(0, 1)\"}}\n"
             "      - {name: add, kind: Add, inputs: [blk, stem]}\n"
             "      - {name: flat, kind: Flatten}\n"
             "      - {name: fc, kind: Linear, out_features: 10}\n");
}

/* Convolutions in a combined backward (Conv2d/Conv1d compute every context's weight gradient in one call
 * where the backend offers it - a GPU's one GEMM - else part by part): a weight-normalised Conv2d, one
 * without a bias, a grouped and dilated one with strides and padding, a Conv1d; each context's weight and
 * bias gradients its own. */
static void run_conv_kinds(void) {
    run_file("[4, 9, 9]",
             "      - {name: wn, kind: Conv2d, out_channels: 6, kernel_size: 3, padding: 1, weight_norm: true}\n"
             "      - {name: r1, kind: ReLU}\n"
             "      - {name: nb, kind: Conv2d, out_channels: 6, kernel_size: [3, 2], bias: false}\n"
             "      - {name: gd, kind: Conv2d, out_channels: 6, kernel_size: 3, groups: 3, dilation: 2, stride: [1, 2],\n"
             "         padding: 2}\n"
             "      - {name: flat, kind: Flatten, start_dim: 2}\n"
             "      - {name: c1, kind: Conv1d, out_channels: 4, kernel_size: 3, padding: 1}\n"
             "      - {name: flat2, kind: Flatten}\n"
             "      - {name: fc, kind: Linear, out_features: 10}\n");
}

/* The learned and drawn activations: PReLU per channel and with one slope (each context's slope gradients
 * its own), RReLU's slopes and AlphaDropout's / FeatureAlphaDropout's masks drawn per context, and shrinks. */
static void run_shrink_kinds(void) {
    run_file("[4, 3, 3]",
             "      - {name: conv, kind: Conv2d, out_channels: 6, kernel_size: 1}\n"
             "      - {name: pr, kind: PReLU, num_parameters: 6, init: {weight: \"normal(0.2, 0.5)\"}}\n"
             "      - {name: fad, kind: FeatureAlphaDropout, p: 0.3}\n"
             "      - {name: rr, kind: RReLU, lower: 0.1, upper: 0.4}\n"
             "      - {name: cel, kind: CELU, alpha: 0.5}\n"
             "      - {name: flat, kind: Flatten}\n"
             "      - {name: fc, kind: Linear, out_features: 16}\n"
             "      - {name: ss, kind: Softshrink, lambd: 0.1}\n"
             "      - {name: ad, kind: AlphaDropout, p: 0.2}\n"
             "      - {name: pr1, kind: PReLU}\n"
             "      - {name: out, kind: Linear, out_features: 10}\n");
}

/* Parameters used at several sites (share:, tie:; docs/models.md "Shared
 * parameters"): a Linear applied three times and a LayerNorm and a
 * MultiheadAttention twice in a chain, and an Embedding tied to its decoder
 * Linear; each context's gradient summed over the sites, its own. */
static void run_shared(void) {
    run_file("[5, 8]",
             "      - {name: blk, kind: Linear, out_features: 8}\n"
             "      - {name: ln, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true}\n"
             "      - {name: blk_1, kind: Linear, out_features: 8, share: blk}\n"
             "      - {name: ln_1, kind: LayerNorm, normalized_shape: 8, share: ln}\n"
             "      - {name: attn_1, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true, "
             "share: attn}\n"
             "      - {name: blk_2, kind: Linear, out_features: 8, share: blk}\n"
             "      - {name: flat, kind: Flatten}\n"
             "      - {name: out, kind: Linear, out_features: 10}\n");
    run_file("[3], dtype: int64",
             "      - {name: encoder, kind: Embedding, num_embeddings: 1000, embedding_dim: 6}\n"
             "      - {name: act, kind: Tanh}\n"
             "      - {name: decoder, kind: Linear, out_features: 1000, tie: {weight: encoder.weight}}\n"
             "      - {name: flat, kind: Flatten}\n");
}

/* Recurrent cells in an unrolled loop (psd-export's nodes of a loop's
 * nn.LSTMCell / nn.GRUCell): an LSTMCell called three times (share:, from
 * zeros, then (h, c) cut from its (2H) output), a GRUCell reading its h's;
 * each call's tape (the gates, LSTMCell's c') cut per context. */
static void run_cells(void) {
    char nodes[4096], prev[32] = "";
    size_t k = 0;
    for (int t = 0; t < 3; t++) {
        k += (size_t)snprintf(nodes + k, sizeof nodes - k,
                              "      - {name: x%d, kind: Narrow, dim: 1, start: %d, length: 1, input: input}\n"
                              "      - {name: x%dv, kind: Reshape, shape: [4]}\n", t, t, t);
        if (t == 0)
            k += (size_t)snprintf(nodes + k, sizeof nodes - k, "      - {name: cell0, kind: LSTMCell, hidden_size: 5}\n");
        else
            k += (size_t)snprintf(nodes + k, sizeof nodes - k,
                                  "      - {name: cell%d, kind: LSTMCell, hidden_size: 5, inputs: [x%dv, h%d, c%d], "
                                  "share: cell0}\n", t, t, t - 1, t - 1);
        k += (size_t)snprintf(nodes + k, sizeof nodes - k,
                              "      - {name: h%d, kind: Narrow, dim: 1, start: 0, length: 5, input: cell%d}\n", t, t);
        if (t < 2)
            k += (size_t)snprintf(nodes + k, sizeof nodes - k,
                                  "      - {name: c%d, kind: Narrow, dim: 1, start: 5, length: 5, input: cell%d}\n", t, t);
        k += (size_t)snprintf(nodes + k, sizeof nodes - k, "      - {name: g%d, kind: GRUCell, hidden_size: 6, "
                              "inputs: [h%d%s]%s}\n", t, t, prev, t ? ", share: g0" : "");
        snprintf(prev, sizeof prev, ", g%d", t);
    }
    snprintf(nodes + k, sizeof nodes - k, "      - {name: out, kind: Linear, out_features: 10}\n");
    run_file("[3, 4]", nodes);
}

/* LayerNorm's saved mean and rstd cut per context: over a whole sample
 * (one row a sample), over its last dim (six rows a sample) with drawn
 * weight and bias, and without elementwise_affine. */
static void run_layernorm(void) {
    run_file("[6, 4]",
             "      - {name: ln0, kind: LayerNorm, normalized_shape: [6, 4]}\n"
             "      - {name: fc, kind: Linear, out_features: 5}\n"
             "      - {name: ln1, kind: LayerNorm, normalized_shape: 5, init: {weight: \"normal(1, 0.5)\", "
             "bias: \"normal(0, 0.5)\"}}\n"
             "      - {name: act, kind: Tanh}\n"
             "      - {name: ln2, kind: LayerNorm, normalized_shape: 5, elementwise_affine: false}\n"
             "      - {name: flat, kind: Flatten}\n"
             "      - {name: out, kind: Linear, out_features: 10}\n");
}

/* A vit encoder block as psd-export writes torchvision's: patches
 * projected, the class token (a Parameter) joined in front, the positional
 * embedding (a Parameter) added, pre-norm MultiheadAttention with
 * attention dropout (its tape - mask, q, k, v, P, o - cut per context, each
 * context's mask its own) and a GELU MLP, both residual, a final LayerNorm,
 * the class token's row picked (IndexSelect) for the head. */
static void run_vit_block(void) {
    run_file("[4, 6]",
             "      - {name: proj, kind: Linear, out_features: 8}\n"
             "      - {name: class_token, kind: Parameter, shape: [1, 1, 8], expand: [1, 8], parameter: null}\n"
             "      - {name: cat, kind: Concat, inputs: [class_token, proj], dim: 1}\n"
             "      - {name: encoder, kind: Parameter, shape: [1, 5, 8], expand: [5, 8], parameter: pos_embedding, "
             "init: {pos_embedding: \"normal(0, 0.5)\"}}\n"
             "      - {name: pos, kind: Add, inputs: [cat, encoder]}\n"
             "      - {name: ln_1, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, dropout: 0.3, "
             "batch_first: true}\n"
             "      - {name: res1, kind: Add, inputs: [attn, pos]}\n"
             "      - {name: ln_2, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: fc1, kind: Linear, out_features: 16}\n"
             "      - {name: gelu, kind: GELU}\n"
             "      - {name: fc2, kind: Linear, out_features: 8}\n"
             "      - {name: res2, kind: Add, inputs: [fc2, res1]}\n"
             "      - {name: ln, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: cls, kind: IndexSelect, dim: 1, index: [0]}\n"
             "      - {name: flat, kind: Flatten}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* Attention written by hand (minGPT's), as psd-export writes
 * tests/export/attention.py's AttentionClassifier (n_embd 8, 2 heads, seq
 * 6): Narrow, Reshape, Permute, MatMul (transpose_b), MulConstant, Softmax
 * between LayerNorms in a pre-norm block. */
static void run_hand_attention(void) {
    run_file("[6, 5]",
             "      - {name: embed, kind: Linear, out_features: 8}\n"
             "      - {name: ln_1, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: attn.c_attn, kind: Linear, out_features: 24}\n"
             "      - {name: attn.chunk, kind: Narrow, dim: 2, start: 0, length: 8}\n"
             "      - {name: attn.chunk_1, kind: Narrow, input: attn.c_attn, dim: 2, start: 8, length: 8}\n"
             "      - {name: attn.chunk_2, kind: Narrow, input: attn.c_attn, dim: 2, start: 16, length: 8}\n"
             "      - {name: attn.view, kind: Reshape, input: attn.chunk_1, shape: [6, 2, 4]}\n"
             "      - {name: attn.transpose, kind: Permute, dims: [0, 2, 1, 3]}\n"
             "      - {name: attn.view_1, kind: Reshape, input: attn.chunk, shape: [6, 2, 4]}\n"
             "      - {name: attn.transpose_1, kind: Permute, dims: [0, 2, 1, 3]}\n"
             "      - {name: attn.view_2, kind: Reshape, input: attn.chunk_2, shape: [6, 2, 4]}\n"
             "      - {name: attn.transpose_2, kind: Permute, dims: [0, 2, 1, 3]}\n"
             "      - {name: attn.matmul, kind: MatMul, inputs: [attn.transpose_1, attn.transpose], "
             "transpose_b: true}\n"
             "      - {name: attn.div, kind: MulConstant, value: 0.5}\n"
             "      - {name: attn.softmax, kind: Softmax, dim: -1}\n"
             "      - {name: attn.matmul_1, kind: MatMul, inputs: [attn.softmax, attn.transpose_2]}\n"
             "      - {name: attn.transpose_4, kind: Permute, dims: [0, 2, 1, 3]}\n"
             "      - {name: attn.view_3, kind: Reshape, shape: [6, 8]}\n"
             "      - {name: attn.c_proj, kind: Linear, out_features: 8}\n"
             "      - {name: add, kind: Add, inputs: [embed, attn.c_proj]}\n"
             "      - {name: ln_2, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: mlp_fc, kind: Linear, out_features: 32}\n"
             "      - {name: mlp_act, kind: GELU}\n"
             "      - {name: mlp_proj, kind: Linear, out_features: 8}\n"
             "      - {name: add_1, kind: Add, inputs: [add, mlp_proj]}\n"
             "      - {name: ln_f, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: flatten, kind: Flatten}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* Numpy broadcasting between computed tensors (bcast_net's pieces as
 * psd-export writes them): centring by a kept mean (Sub of (C, 1, 1)-like
 * by the full tensor), a (C, 1, 1) gate added, a (1, H, W) mask
 * multiplied, a division by a per-sample (1, 1, 1) value on the left. */
static void run_broadcasts(void) {
    run_file("[3, 4, 4]",
             "      - {name: conv, kind: Conv2d, out_channels: 4, kernel_size: 3, padding: 1}\n"
             "      - {name: mean, kind: AdaptiveAvgPool2d, output_size: 1}\n"
             "      - {name: sub, kind: Sub, inputs: [conv, mean]}\n"
             "      - {name: gate, kind: Sigmoid, input: mean}\n"
             "      - {name: add, kind: Add, inputs: [sub, gate]}\n"
             "      - {name: m, kind: Narrow, dim: 1, start: 0, length: 1, input: add}\n"
             "      - {name: mask, kind: Sigmoid}\n"
             "      - {name: mul, kind: Mul, inputs: [mask, add]}\n"
             "      - {name: f, kind: Flatten, input: mul}\n"
             "      - {name: s, kind: Linear, out_features: 1}\n"
             "      - {name: s3, kind: Reshape, shape: [1, 1, 1]}\n"
             "      - {name: abs, kind: Abs, input: mul}\n"
             "      - {name: pos, kind: AddConstant, value: 0.5}\n"
             "      - {name: div, kind: Div, inputs: [s3, pos]}\n"
             "      - {name: flatten, kind: Flatten}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* Users' elementwise functions as psd-export writes them (tests/export/elem3.py's): Maximum of a
 * (C, L) tensor and a broadcast (C, 1) one, a comparison's mask choosing by Where (a number for b), Sin,
 * Log1p, Flip of the sequence dim added back. */
static void run_elementwise(void) {
    run_file("[4, 6]",
             "      - {name: lin, kind: Linear, out_features: 5}\n"
             "      - {name: g, kind: Narrow, dim: 2, start: 0, length: 1}\n"
             "      - {name: max, kind: Maximum, inputs: [lin, g]}\n"
             "      - {name: gt, kind: Greater, value: 0.1, input: lin}\n"
             "      - {name: where, kind: Where, inputs: [gt, max], b: -0.5}\n"
             "      - {name: sin, kind: Sin}\n"
             "      - {name: abs, kind: Abs, input: lin}\n"
             "      - {name: log1p, kind: Log1p}\n"
             "      - {name: flip, kind: Flip, dims: [1]}\n"
             "      - {name: add, kind: Add, inputs: [sin, flip]}\n"
             "      - {name: flatten, kind: Flatten}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* nn.Bilinear of two Linears (its tape, the rows' outer products, cut per caller) and a VAE's
 * reparameterisation (RandnLike's noise, each caller's own draws) between it and the head. */
static void run_bilinear(void) {
    run_file("[6]",
             "      - {name: a, kind: Linear, out_features: 4}\n"
             "      - {name: b, kind: Linear, input: input, out_features: 3}\n"
             "      - {name: bl, kind: Bilinear, inputs: [a, b], out_features: 5}\n"
             "      - {name: eps, kind: RandnLike}\n"
             "      - {name: scaled, kind: MulConstant, value: 0.1}\n"
             "      - {name: z, kind: Add, inputs: [bl, scaled]}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* A spatial transformer (tests/export/stn.py's, small): theta from a Linear of the flattened input,
 * AffineGrid, GridSample reading the input at that grid (border padding, align_corners) and, nearest, at a
 * grid computed per point, then a head. */
static void run_spatial(void) {
    run_file("[2, 6, 6]",
             "      - {name: f, kind: Flatten}\n"
             "      - {name: loc, kind: Linear, out_features: 6}\n"
             "      - {name: theta, kind: Reshape, shape: [2, 3]}\n"
             "      - {name: grid, kind: AffineGrid, size: [5, 5], align_corners: true}\n"
             "      - {name: gs, kind: GridSample, inputs: [input, grid], padding_mode: border, "
             "align_corners: true}\n"
             "      - {name: gc, kind: Conv2d, input: input, out_channels: 2, kernel_size: 1}\n"
             "      - {name: gp, kind: Permute, dims: [0, 2, 3, 1]}\n"
             "      - {name: gn, kind: GridSample, inputs: [input, gp], mode: nearest}\n"
             "      - {name: f1, kind: Flatten, input: gs}\n"
             "      - {name: f2, kind: Flatten, input: gn}\n"
             "      - {name: cat, kind: Concat, dim: 1, inputs: [f1, f2]}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* Patch extraction (tests/export/unfold.py's, small): a hand-written patch embedding (Unfold, Permute, Linear
 * per patch) and an overlap-add (Unfold with padding, Fold of the columns back), then a head: each caller's
 * columns and input gradient its own. */
static void run_unfold(void) {
    run_file("[2, 6, 6]",
             "      - {name: u, kind: Unfold, kernel_size: 2, stride: 2}\n"
             "      - {name: t, kind: Permute, dims: [0, 2, 1]}\n"
             "      - {name: proj, kind: Linear, out_features: 4}\n"
             "      - {name: f1, kind: Flatten}\n"
             "      - {name: u2, kind: Unfold, input: input, kernel_size: [3, 2], padding: 1, dilation: [1, 2]}\n"
             "      - {name: th, kind: Tanh}\n"
             "      - {name: fold, kind: Fold, output_size: 6, kernel_size: [3, 2], padding: 1, dilation: [1, 2]}\n"
             "      - {name: f2, kind: Flatten}\n"
             "      - {name: cat, kind: Concat, dim: 1, inputs: [f1, f2]}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* Causal attention: minGPT's CausalSelfAttention as psd-export writes
 * tests/export/attention.py's CausalClassifier (n_embd 8, 2 heads, seq 6:
 * the MaskedFill of its tril buffer, attention dropout), then
 * nn.MultiheadAttention with a causal attn_mask and attention dropout. */
static void run_causal_attention(void) {
    run_file("[6, 5]",
             "      - {name: embed, kind: Linear, out_features: 8}\n"
             "      - {name: attn.c_attn, kind: Linear, out_features: 24}\n"
             "      - {name: attn.chunk, kind: Narrow, dim: 2, start: 0, length: 8}\n"
             "      - {name: attn.chunk_1, kind: Narrow, input: attn.c_attn, dim: 2, start: 8, length: 8}\n"
             "      - {name: attn.chunk_2, kind: Narrow, input: attn.c_attn, dim: 2, start: 16, length: 8}\n"
             "      - {name: attn.view, kind: Reshape, input: attn.chunk_1, shape: [6, 2, 4]}\n"
             "      - {name: attn.transpose, kind: Permute, dims: [0, 2, 1, 3]}\n"
             "      - {name: attn.view_1, kind: Reshape, input: attn.chunk, shape: [6, 2, 4]}\n"
             "      - {name: attn.transpose_1, kind: Permute, dims: [0, 2, 1, 3]}\n"
             "      - {name: attn.view_2, kind: Reshape, input: attn.chunk_2, shape: [6, 2, 4]}\n"
             "      - {name: attn.transpose_2, kind: Permute, dims: [0, 2, 1, 3]}\n"
             "      - {name: attn.matmul, kind: MatMul, inputs: [attn.transpose_1, attn.transpose], "
             "transpose_b: true}\n"
             "      - {name: attn.mul, kind: MulConstant, value: 0.5}\n"
             "      - {name: attn.masked_fill, kind: MaskedFill, mask: triu, diagonal: 1, value: -inf}\n"
             "      - {name: attn.softmax, kind: Softmax, dim: -1}\n"
             "      - {name: attn.attn_dropout, kind: Dropout, p: 0.2}\n"
             "      - {name: attn.matmul_1, kind: MatMul, inputs: [attn.attn_dropout, attn.transpose_2]}\n"
             "      - {name: attn.transpose_4, kind: Permute, dims: [0, 2, 1, 3]}\n"
             "      - {name: attn.view_3, kind: Reshape, shape: [6, 8]}\n"
             "      - {name: attn.c_proj, kind: Linear, out_features: 8}\n"
             "      - {name: add, kind: Add, inputs: [embed, attn.c_proj]}\n"
             "      - {name: ln, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: mha, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, dropout: 0.3, "
             "batch_first: true, causal: true}\n"
             "      - {name: add_1, kind: Add, inputs: [add, mha]}\n"
             "      - {name: flatten, kind: Flatten}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* Cross-attention (an nn.TransformerDecoderLayer as psd-export writes it):
 * features embedded, cut into a 4-row target and a 5-row memory, the
 * target's causal self-attention and its cross-attention over the memory
 * (MultiheadAttention cross: true), both with attention dropout: each
 * context's tape (q (n, H, 4, D), k and v (n, H, 5, D), P (n, H, 4, 5))
 * and masks its own, the memory's gradient reaching the embedding. */
static void run_cross_attention(void) {
    run_file("[9, 5]",
             "      - {name: embed, kind: Linear, out_features: 8}\n"
             "      - {name: tgt, kind: Narrow, dim: 1, start: 0, length: 4}\n"
             "      - {name: mem, kind: Narrow, input: embed, dim: 1, start: 4, length: 5}\n"
             "      - {name: dec.self_attn, kind: MultiheadAttention, input: tgt, embed_dim: 8, num_heads: 2, "
             "dropout: 0.3, batch_first: true, causal: true}\n"
             "      - {name: dec.add, kind: Add, inputs: [tgt, dec.self_attn]}\n"
             "      - {name: dec.norm1, kind: LayerNorm, normalized_shape: 8}\n"
             "      - {name: dec.multihead_attn, kind: MultiheadAttention, inputs: [dec.norm1, mem], embed_dim: 8, "
             "num_heads: 2, dropout: 0.3, batch_first: true, cross: true}\n"
             "      - {name: dec.add_1, kind: Add, inputs: [dec.norm1, dec.multihead_attn]}\n"
             "      - {name: flatten, kind: Flatten}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n");
}

/* Key padding masks computed from the ids (Eq), each context's its own
 * (its samples padded differently): nn.MultiheadAttention with
 * key_padding_mask = ids == 0, causal with attention dropout, then one with
 * the float form ((ids == 0) * -1e4, added) over the residual. */
static const char PADMASK_NODES[] =
             "      - {name: emb, kind: Embedding, num_embeddings: 1000, embedding_dim: 8}\n"
             "      - {name: pad, kind: Eq, value: 0, input: input}\n"
             "      - {name: m1, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, dropout: 0.3, "
             "batch_first: true, causal: true, inputs: [emb, pad]}\n"
             "      - {name: add, kind: Add, inputs: [emb, m1]}\n"
             "      - {name: neg, kind: MulConstant, value: -10000.0, input: pad}\n"
             "      - {name: m2, kind: MultiheadAttention, embed_dim: 8, num_heads: 4, batch_first: true, "
             "key_padding_mask: float, inputs: [add, neg]}\n"
             "      - {name: flatten, kind: Flatten}\n"
             "      - {name: head, kind: Linear, out_features: 10}\n";

static void run_padmask(void) {
    g_pad = 1;
    run_file("[6], dtype: int64", PADMASK_NODES);
    g_pad = 0;
}

/* A combined Forward one of whose contexts has a sample of padding only
 * (its queries attend to no key: refused, where PyTorch 1.13 gives NaN):
 * only that context gets the error, naming the sample of its own Forward;
 * the others are answered as unbatched. */
static void padmask_bad_member(void) {
    static const int ns[K] = {2, 3, 5};
    char dir[] = "/tmp/ps-test-batch-forward.XXXXXX", path[64];
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    snprintf(path, sizeof path, "%s/cn.yaml", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(f, "name: cn\nstages:\n  - name: main\n    input: {shape: [6], dtype: int64}\n    nodes:\n%s",
            PADMASK_NODES);
    fclose(f);
    server a, b;
    if (start(&a, path, "ref", WAIT_MS, 10, 1) || start(&b, path, "ref", 0, 256, 0)) {
        stop(&a);
        test_rmtree(dir);
        return;
    }
    const ps_stage_info *s0 = ps_model_stage(a.model, 0);
    trainer ta[K], tb[K];
    pthread_t th[K];
    g_pad = 1;
    for (int i = 0; i < K; i++) {
        trainer_init(&ta[i], a.addr, i, ns[i], s0, s0, NULL, NULL);
        trainer_init(&tb[i], b.addr, i, ns[i], s0, s0, NULL, NULL);
    }
    g_pad = 0;
    for (int j = 0; j < 6; j++) ((int64_t *)ta[1].x)[2 * 6 + j] = 0;   /* context 1's sample 2: padding only */
    for (int i = 0; i < K; i++) pthread_create(&th[i], NULL, forward1, &ta[i]);
    for (int i = 0; i < K; i++) pthread_join(th[i], NULL);
    CHECK_MSG(ta[1].st == PS_ERR_INVALID_ARGUMENT && strstr(ta[1].msg, "node 'm1' (MultiheadAttention): sample 2") &&
              strstr(ta[1].msg, "masks key 0 and causal is true"), "%d %s", ta[1].st, ta[1].msg);
    uint64_t held, combined;
    ps_service_batch_stats(a.svc, &held, &combined);
    CHECK_MSG(held == K && combined == 0, "%llu held, %llu combined", (unsigned long long)held,
              (unsigned long long)combined);
    for (int i = 0; i < K; i += 2) {
        forward1(&tb[i]);
        CHECK_MSG(!ta[i].st && !tb[i].st, "%s / %s", ta[i].msg, tb[i].msg);
        same("a good member of a group with an all-padding sample", ta[i].out, tb[i].out,
             (size_t)ta[i].n * (size_t)ta[i].out_per, 1e-6);
    }
    for (int i = 0; i < K; i++) {
        trainer_free(&ta[i]);
        trainer_free(&tb[i]);
    }
    stop(&a);
    stop(&b);
    test_rmtree(dir);
}

int main(void) {
    grpc_init();
    run_padmask();
    run_convnext_kinds();
    run_conv_kinds();
    run_layernorm();
    run_shrink_kinds();
    run_vit_block();
    run_shared();
    run_cells();
    run_hand_attention();
    run_causal_attention();
    run_cross_attention();
    run_broadcasts();
    run_elementwise();
    run_bilinear();
    run_spatial();
    run_unfold();
    run_model("configs/models/mnist_cnn.yaml", NULL, NULL, "ref", 1e-6);
    run_model("configs/models/cartpole_policy.yaml", NULL, NULL, "ref", 1e-6);
    run_model("configs/models/rnn_lm.yaml", "emb", NULL, "ref", 1e-6);   /* int64 ids, a row-sparse gradient */
    run_model("configs/models/mnist_cnn.yaml", "conv", NULL, "dnnl", 1e-5); /* a run short of the model */
    run_model("configs/models/mnist_cnn.yaml", NULL, NULL, "dnnl", 1e-5);
    bad_member();
    padmask_bad_member();
    group_refused();
    /* on a CUDA device (scripts/gpu-check.sh runs this test there too) */
    ps_err err = {0};
    ps_backend *probe = ps_backend_create("cuda", 0, 0, &err);
    if (probe) {
        ps_backend_free(probe);
        g_device = "cuda:0";
        g_place[0] = "conv";
        g_place[1] = "fc";
        run_model("configs/models/mnist_cnn.yaml", NULL, NULL, "ref", 1e-5);
        g_place[0] = "main";
        g_place[1] = NULL;
        run_vit_block();
        run_padmask();
        run_shared();
        run_cross_attention();
        run_conv_kinds();
        g_device = NULL;
        printf("cuda:0: batched Forwards and Backwards compared (mnist_cnn, the vit block, key padding masks, "
               "shared parameters, cross-attention, convolutions)\n");
    } else {
        printf("cuda: skipped (no CUDA device: %s)\n", err.msg);
        ps_err_clear(&err);
    }
    /* BatchNorm in training couples the samples of a batch: never combined */
    ps_model_opts mo = {.file = "examples/models/small_resnet.yaml", .cpu_backend = "ref", .seed = 1,
                        .compute_threads = 1, .lr = 0.1f};
    ps_model *bn = ps_model_create(&mo, &err);
    CHECK_MSG(bn, "%s", err.msg);
    if (bn) {
        CHECK(!ps_model_can_group(bn, 0, ps_model_num_stages(bn) - 1));
        ps_model_free(bn);
    }
    grpc_shutdown();
    return check_summary("test_batch_forward");
}
