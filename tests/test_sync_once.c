/* test_sync_once - exactly once under sync and ssp with short deadlines,
 * and across a restart: the real service on loopback (in-process), trainers
 * running their batches through ps_retry_once (trainer/retry.h) with an RPC
 * deadline far shorter than the waits psd imposes.
 *
 *  - sync: a round of 2 waits ~1 s for its slow member; the fast trainer's
 *    Step outlives its 250 ms deadline again and again, is settled while its
 *    context waits in the round ("in use": ask again), and every batch is
 *    applied exactly once: Status.contexts_applied = batches, one optimizer
 *    step per round. (Before "in use" meant "ask again", the fast trainer
 *    re-ran its batch into the same round: applied twice.)
 *  - sync, a straggler: the slow trainer's first Step comes after its round
 *    closed by its timeout (1 s): ABORTED, the batch runs again under a new
 *    context into the open round (every task does this: ps_retry_once), and
 *    still every batch is applied once (the dropped context never counts).
 *  - ssp, max_staleness 0: the fast trainer's Forwards are held past their
 *    deadline; batches still apply once each (contexts_applied = version =
 *    batches).
 *  - sync with one call a batch (ForwardRequest.step: psd's loss, backward
 *    and step in the Forward): the fast trainer's Forward outlives its
 *    deadline while its step waits in the round; settled by a Step of the
 *    same context, never run twice. Under ssp too: a held one-call Forward
 *    whose deadline passed never runs; its settling Step finds nothing and
 *    the batch runs again, once.
 *  - one call a batch computes what three do: the parameters' change and the
 *    loss of a Forward with targets and step against the same batch's
 *    Forward, the NLL's gradient here, Backward and Step on a twin psd
 *    (mnist_cnn ends in log_softmax, so psd's cross-entropy is the NLL);
 *    a Step of its context afterwards answers what it did; step or
 *    skip_input_grad without targets is refused, naming the field.
 *  - restart: a step acknowledged, a checkpoint written with the context
 *    records (checkpoint.h psd.settle), a new model and service restored from
 *    it: the retried Step is answered with the version it produced, not
 *    NOT_FOUND (which the settle rules read as "run the batch again").
 */
#include <grpc/grpc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "checkpoint.h"
#include "model.h"
#include "ps_client.h"
#include "retry.h"
#include "rpc.h"
#include "service.h"
#include "support/tmpdir.h"

#define MAXMSG (16 << 20)
#define NB 4 /* images per batch */

typedef struct server {
    ps_model *model;
    ps_service *svc;
    ps_rpc_server *srv;
    char addr[64];
    pthread_t ticker;          /* what psd's main loop does: round timeouts, expiry */
    volatile int stop_ticker;
} server;

static void *tick_main(void *p) {
    server *s = p;
    while (!s->stop_ticker) {
        ps_service_expire(s->svc);
        usleep(100 * 1000);
    }
    return NULL;
}

static ps_model *new_model(void) {
    ps_model_opts mo = {.arch = "mnist_cnn", .cpu_backend = "dnnl", .seed = 5, .compute_threads = 1, .lr = 0.01f};
    ps_err err = {0};
    ps_model *m = ps_model_create(&mo, &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    return m;
}

static double g_sync_timeout_s = 60;

static int start(server *s, ps_model *m, ps_cons_mode mode, int workers, int staleness) {
    ps_err err = {0};
    memset(s, 0, sizeof *s);
    s->model = m;
    ps_service_opts so = {.context_ttl_s = 60, .max_contexts = 256, .max_message_bytes = MAXMSG,
                          .cons = {.mode = mode, .sync_workers = workers, .sync_timeout_s = g_sync_timeout_s,
                                   .max_staleness = staleness}};
    s->svc = ps_service_create(m, &so, &err);
    CHECK_MSG(s->svc != NULL, "%s", err.msg);
    if (!s->svc) return -1;
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    s->srv = ps_rpc_server_create("127.0.0.1:0", 4, MAXMSG, methods, nm, s->svc, &err);
    CHECK_MSG(s->srv != NULL, "%s", err.msg);
    if (!s->srv || ps_rpc_server_start(s->srv, &err)) return -1;
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%d", ps_rpc_server_port(s->srv));
    pthread_create(&s->ticker, NULL, tick_main, s);
    return 0;
}

static void stop(server *s) {
    s->stop_ticker = 1;
    pthread_join(s->ticker, NULL);
    if (s->svc) ps_service_close(s->svc);
    if (s->srv) ps_rpc_server_shutdown(s->srv, 2000);
    ps_rpc_server_free(s->srv);
    ps_service_free(s->svc);
    ps_model_free(s->model);
}

static ps_StatusResponse status_of(const char *addr) {
    ps_err err = {0};
    ps_StatusResponse st = ps_StatusResponse_init_zero;
    ps_client *c = ps_client_create(addr, 10000, MAXMSG, &err);
    CHECK(c && ps_client_status(c, &st, &err) == PS_OK);
    ps_client_free(c);
    return st;
}

/* ---- a trainer: batches through ps_retry_once ---------------------------- */

typedef struct trainer {
    const char *addr;
    int deadline_ms;
    int batches;
    double pause_before_step_s;  /* the slow one */
    int pause_batches;           /* ... in its first this many runs (0: all) */
    int runs;
    uint32_t rank;
    /* results */
    int done;
    long retries;
    ps_status st;
    char msg[PS_ERR_MSG_MAX];
    /* per batch */
    ps_client *cl;
    float x[NB * 784], out[NB * 10], grad[NB * 10];
    int64_t y[NB];
    int one_call;                /* Forward with targets and step=true */
} trainer;

static ps_status batch_run(void *arg, uint64_t ctx, int *kept, ps_err *err) {
    trainer *t = arg;
    int64_t cols;
    if (t->one_call) {  /* the slow one pauses after its call, so that it is never behind unseen */
        *kept = 1;
        ps_client_fwd f = {.ctx = ctx, .rank = t->rank, .train = 1, .input = {PS_CLIENT_F32, 4, {NB, 1, 28, 28}, t->x},
                           .targets = {PS_CLIENT_I64, 1, {NB}, t->y}};
        double loss;
        uint64_t v;
        ps_status st = ps_client_train_step(t->cl, &f, &loss, &v, err);
        if (t->pause_before_step_s > 0 && (!t->pause_batches || t->runs < t->pause_batches))
            usleep((useconds_t)(t->pause_before_step_s * 1e6));
        t->runs++;
        return st;
    }
    ps_status st = ps_client_forward(t->cl, ctx, t->rank, 1, t->x, NB, 1, 28, 28, t->out, NB * 10, &cols, NULL, err);
    if (st) return st;
    *kept = 1;
    if ((st = ps_client_backward(t->cl, ctx, t->grad, NB, 10, 0, NULL, err))) return st;
    if (t->pause_before_step_s > 0 && (!t->pause_batches || t->runs < t->pause_batches))
        usleep((useconds_t)(t->pause_before_step_s * 1e6));
    t->runs++;
    return ps_client_step(t->cl, ctx, NULL, err);
}

static ps_status batch_step(void *arg, uint64_t ctx, ps_err *err) {
    trainer *t = arg;
    return ps_client_step(t->cl, ctx, NULL, err);
}

static void *trainer_main(void *p) {
    trainer *t = p;
    ps_err err = {0};
    t->cl = ps_client_create(t->addr, t->deadline_ms, MAXMSG, &err);
    CHECK_MSG(t->cl != NULL, "%s", err.msg);
    if (!t->cl) return NULL;
    for (int i = 0; i < NB * 784; i++) t->x[i] = (float)((i * 7 + (int)t->rank) % 13) / 13.0f;
    for (int i = 0; i < NB; i++) t->grad[i * 10 + (i + (int)t->rank) % 10] = -1.0f / NB;
    for (int i = 0; i < NB; i++) t->y[i] = (i + (int)t->rank) % 10;
    ps_retry_policy rp = {.max_s = 60, .backoff_s = 0.05, .backoff_max_s = 0.2, .seed = t->rank, .who = "trainer"};
    ps_retry r;
    ps_retry_init(&r, &rp);
    ps_ctx_ids ids;
    ps_ctx_ids_init(&ids);
    ps_once_ops ops = {.unit = "batch", .run = batch_run, .step = batch_step, .arg = t};
    t->st = PS_OK;
    for (int b = 0; b < t->batches && !t->st; b++) {
        t->st = ps_retry_once(&r, &ids, &ops, &err);
        if (t->st) snprintf(t->msg, sizeof t->msg, "%s", err.msg);
        else t->done++;
    }
    t->retries = r.total;
    ps_client_free(t->cl);
    return NULL;
}

/* A fast trainer with a 250 ms deadline and a slow one pausing ~1 s before
 * each Step; both run `batches` batches. */
static int g_one_call;  /* run_pair's trainers send one call a batch */

static void run_pair(const char *addr, int batches, trainer *fast, trainer *slow) {
    *fast = (trainer){.addr = addr, .deadline_ms = 250, .batches = batches, .rank = 1, .one_call = g_one_call};
    *slow = (trainer){.addr = addr, .deadline_ms = 20000, .batches = batches, .rank = 2, .pause_before_step_s = 1.0,
                      .one_call = g_one_call};
    pthread_t a, b;
    pthread_create(&a, NULL, trainer_main, fast);
    pthread_create(&b, NULL, trainer_main, slow);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    CHECK_MSG(fast->st == PS_OK && fast->done == batches, "fast trainer: %d of %d batches: %s", fast->done, batches,
              fast->msg);
    CHECK_MSG(slow->st == PS_OK && slow->done == batches, "slow trainer: %d of %d batches: %s", slow->done, batches,
              slow->msg);
}

static void test_sync(void) {
    server s;
    if (start(&s, new_model(), PS_CONS_SYNC, 2, 0)) return;
    enum { B = 3 };
    trainer fast, slow;
    run_pair(s.addr, B, &fast, &slow);
    ps_StatusResponse st = status_of(s.addr);
    printf("sync%s: fast trainer %ld retries; contexts applied %llu, model version %llu, rounds of 2\n",
           g_one_call ? ", one call a batch" : "", fast.retries, (unsigned long long)st.contexts_applied,
           (unsigned long long)st.model_version);
    CHECK_MSG(fast.retries > 0, "the fast trainer's %s never outlived their deadline: the case was not tested",
              g_one_call ? "Forwards with step" : "Steps");
    CHECK_MSG(st.contexts_applied == 2 * B, "%llu contexts applied for %d batches: a batch applied twice",
              (unsigned long long)st.contexts_applied, 2 * B);
    /* (a Forward that outlived its deadline leaves a context nobody steps:
     * it expires; live_contexts need not be 0) */
    CHECK_MSG(st.model_version == B, "%llu optimizer steps for %d rounds of 2", (unsigned long long)st.model_version, B);
    stop(&s);
}

static void test_sync_late(void) {
    server s;
    g_sync_timeout_s = 1.0;
    int rc = start(&s, new_model(), PS_CONS_SYNC, 2, 0);
    g_sync_timeout_s = 60;
    if (rc) return;
    enum { B = 3 };
    trainer fast = {.addr = s.addr, .deadline_ms = 20000, .batches = B, .rank = 1};
    trainer slow = {.addr = s.addr, .deadline_ms = 20000, .batches = B, .rank = 2, .pause_before_step_s = 2.5,
                    .pause_batches = 1};
    pthread_t a, b;
    pthread_create(&a, NULL, trainer_main, &fast);
    pthread_create(&b, NULL, trainer_main, &slow);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    ps_StatusResponse st = status_of(s.addr);
    printf("sync, a straggler: %llu late steps dropped and run again; contexts applied %llu, model version %llu\n",
           (unsigned long long)st.sync_dropped, (unsigned long long)st.contexts_applied,
           (unsigned long long)st.model_version);
    CHECK_MSG(fast.st == PS_OK && fast.done == B, "fast trainer: %d of %d batches: %s", fast.done, B, fast.msg);
    CHECK_MSG(slow.st == PS_OK && slow.done == B, "slow trainer: %d of %d batches: %s", slow.done, B, slow.msg);
    CHECK_MSG(st.sync_dropped >= 1, "no step was late: the case was not tested");
    CHECK_MSG(st.contexts_applied == 2 * B, "%llu contexts applied for %d batches",
              (unsigned long long)st.contexts_applied, 2 * B);
    stop(&s);
}

/* A Step claiming a closed round (StepRequest.round) for a context of the
 * open round: psd uses the round it recorded, so the forged id neither
 * drops the context nor raises the round's membership (which made every
 * later round wait for its timeout). */
static void test_forged_round(void) {
    server s;
    g_sync_timeout_s = 0.5;
    int rc = start(&s, new_model(), PS_CONS_SYNC, 2, 0);
    g_sync_timeout_s = 60;
    if (rc) return;
    ps_err err = {0};
    ps_client *cl = ps_client_create(s.addr, 20000, MAXMSG, &err);
    float x[NB * 784] = {0}, out[NB * 10], grad[NB * 10] = {0};
    for (int i = 0; i < NB; i++) grad[i * 10 + i] = -1.0f / NB;
    int64_t cols;
    ps_client_step_out so;
    for (uint64_t ctx = 0xf0f0000000000001ULL; ctx <= 0xf0f0000000000003ULL; ctx++) {
        CHECK(ps_client_forward(cl, ctx, 1, 1, x, NB, 1, 28, 28, out, NB * 10, &cols, NULL, &err) == PS_OK);
        CHECK(ps_client_backward(cl, ctx, grad, NB, 10, 0, NULL, &err) == PS_OK);
        /* the first: alone, its round closes by the timeout (one trainer left); the
         * others name that closed round */
        ps_status st = ps_client_step_ex(cl, ctx, ctx == 0xf0f0000000000001ULL ? 0 : 1, &so, &err);
        CHECK_MSG(st == PS_OK, "Step of context %llx: %s", (unsigned long long)ctx, err.msg);
        CHECK_MSG(so.round == ctx - 0xf0f0000000000000ULL && so.round_contexts == 1, "round %llu of %u", (unsigned long long)so.round, so.round_contexts);
    }
    ps_StatusResponse st = status_of(s.addr);
    CHECK_MSG(st.sync_members == 1 && st.sync_dropped == 0, "after forged round ids: membership %u, %llu dropped",
              st.sync_members, (unsigned long long)st.sync_dropped);
    ps_client_free(cl);
    stop(&s);
}

static void test_ssp(void) {
    server s;
    if (start(&s, new_model(), PS_CONS_SSP, 0, 0)) return;
    enum { B = 3 };
    trainer fast, slow;
    run_pair(s.addr, B, &fast, &slow);
    ps_StatusResponse st = status_of(s.addr);
    printf("ssp%s: fast trainer %ld retries, %llu Forwards held; contexts applied %llu, model version %llu\n",
           g_one_call ? ", one call a batch" : "", fast.retries, (unsigned long long)st.ssp_deferred,
           (unsigned long long)st.contexts_applied, (unsigned long long)st.model_version);
    CHECK_MSG(st.ssp_deferred > 0, "no Forward was held: the case was not tested");
    CHECK_MSG(fast.retries > 0, "no held Forward outlived its deadline: the case was not tested");
    CHECK_MSG(st.contexts_applied == 2 * B && st.model_version == 2 * B, "%llu contexts applied, version %llu, for %d "
              "batches", (unsigned long long)st.contexts_applied, (unsigned long long)st.model_version, 2 * B);
    stop(&s);
}

/* ssp, max_staleness 0: a second client's refused Forwards (a wrong shape)
 * under another rank do not make that rank active - the trainer is never
 * held behind it. */
static void test_ssp_invalid_forward(void) {
    server s;
    if (start(&s, new_model(), PS_CONS_SSP, 2, 0)) return;
    ps_err err = {0};
    ps_client *cl = ps_client_create(s.addr, 3000, MAXMSG, &err);
    float x[NB * 784] = {0}, out[NB * 10], grad[NB * 10] = {0}, bad[NB * 700] = {0};
    for (int i = 0; i < NB; i++) grad[i * 10 + i] = -1.0f / NB;
    int64_t cols;
    int ok = 0;
    for (uint64_t k = 1; k <= 3; k++) {
        /* rank 2: a training Forward of 28x25 images, refused */
        CHECK(ps_client_forward(cl, 0xbad0000000000000ULL + k, 2, 1, bad, NB, 1, 28, 25, out, NB * 10, &cols, NULL,
                                &err) == PS_ERR_INVALID_ARGUMENT);
        uint64_t ctx = 0x900d000000000000ULL + k;
        ps_status st = ps_client_forward(cl, ctx, 1, 1, x, NB, 1, 28, 28, out, NB * 10, &cols, NULL, &err);
        CHECK_MSG(st == PS_OK, "rank 1's Forward %llu: %s", (unsigned long long)k, err.msg);
        if (st) break;
        CHECK(ps_client_backward(cl, ctx, grad, NB, 10, 0, NULL, &err) == PS_OK);
        ok += ps_client_step(cl, ctx, NULL, &err) == PS_OK;
    }
    ps_StatusResponse st = status_of(s.addr);
    CHECK_MSG(ok == 3 && st.ssp_deferred == 0, "%d of 3 batches, %llu Forwards held", ok,
              (unsigned long long)st.ssp_deferred);
    ps_client_free(cl);
    stop(&s);
}

/* A step acknowledged, a checkpoint, a restored psd: the retried Step is
 * answered from the checkpoint's records. */
static void test_restart(void) {
    char dir[] = "/tmp/test_sync_once.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    ps_err err = {0};
    server s;
    if (start(&s, new_model(), PS_CONS_HOGWILD, 0, 0)) return;
    ps_client *cl = ps_client_create(s.addr, 10000, MAXMSG, &err);
    float x[NB * 784] = {0}, out[NB * 10], grad[NB * 10] = {0};
    for (int i = 0; i < NB; i++) grad[i * 10 + i] = -1.0f / NB;
    int64_t cols;
    uint64_t v[3] = {0}, again = 0;
    const uint64_t ctx[3] = {0xabc0000000000001ULL, 0xabc0000000000002ULL, 0xabc0000000000003ULL};
    for (int k = 0; k < 3; k++) {
        CHECK(ps_client_forward(cl, ctx[k], 1, 1, x, NB, 1, 28, 28, out, NB * 10, &cols, NULL, &err) == PS_OK);
        CHECK(ps_client_backward(cl, ctx[k], grad, NB, 10, 0, NULL, &err) == PS_OK);
        if (k < 2) CHECK(ps_client_step(cl, ctx[k], &v[k], &err) == PS_OK);
    }
    ps_ckpt_ident id = {"psd", ""};
    ps_ckpt_save_opts so = {.id = &id, .samples = 12, .keep = 2, .contexts = ps_service_contexts(s.svc)};
    ps_ckpt_info info;
    CHECK_MSG(ps_ckpt_save_with(s.model, dir, &so, &info, &err) == PS_OK, "%s", err.msg);
    /* after the checkpoint: acknowledged here, not in the checkpoint */
    CHECK(ps_client_step(cl, ctx[2], &v[2], &err) == PS_OK);
    ps_client_free(cl);
    stop(&s);

    ps_model *m = new_model();
    ps_ckpt_settle settle = {0};
    CHECK_MSG(ps_ckpt_load_with(m, info.path, &id, NULL, &settle, &err) == PS_OK, "%s", err.msg);
    CHECK(settle.present && settle.n == 2 && settle.applied == 2 && ps_model_version(m) == v[1]);
    if (start(&s, m, PS_CONS_HOGWILD, 0, 0)) return;
    ps_ctx_table_import(ps_service_contexts(s.svc), settle.rec, settle.n, settle.applied);
    ps_ckpt_settle_free(&settle);
    cl = ps_client_create(s.addr, 10000, MAXMSG, &err);
    for (int k = 0; k < 2; k++) {
        ps_status st = ps_client_step(cl, ctx[k], &again, &err);
        CHECK_MSG(st == PS_OK && again == v[k], "retried Step of context %d after the restart: %s (version %llu, "
                  "acknowledged %llu)", k, st ? err.msg : "OK", (unsigned long long)again, (unsigned long long)v[k]);
    }
    /* the step the checkpoint does not hold is unknown: not applied here, run it again */
    CHECK(ps_client_step(cl, ctx[2], &again, &err) == PS_ERR_NOT_FOUND);
    CHECK(status_of(s.addr).contexts_applied == 2);
    ps_client_free(cl);
    stop(&s);
    CHECK(test_rmtree(dir) == 0);
}

static void params_of(const char *addr, ps_wire_tensor_list *l) {
    ps_err err = {0};
    ps_client *c = ps_client_create(addr, 10000, MAXMSG, &err);
    ps_wire_tensor_list_init(l, MAXMSG);
    CHECK_MSG(c && ps_client_get_parameters(c, l, NULL, &err) == PS_OK, "GetParameters: %s", err.msg);
    ps_client_free(c);
}

static void test_one_call_matches(void) {
    server a, b;
    if (start(&a, new_model(), PS_CONS_HOGWILD, 0, 0) || start(&b, new_model(), PS_CONS_HOGWILD, 0, 0)) return;
    ps_err err = {0};
    ps_client *ca = ps_client_create(a.addr, 20000, MAXMSG, &err), *cb = ps_client_create(b.addr, 20000, MAXMSG, &err);
    CHECK_MSG(ca && cb, "%s", err.msg);
    static float x[NB * 784], lp[NB * 10], grad[NB * 10], gin[NB * 784];
    int64_t y[NB];
    for (int i = 0; i < NB * 784; i++) x[i] = (float)((i * 7 + 3) % 13) / 13.0f;
    for (int i = 0; i < NB; i++) y[i] = (3 * i + 1) % 10;
    ps_wire_tensor_list w0, wa, wb;
    params_of(a.addr, &w0);
    const uint64_t ctx = 0x5eed0001;
    /* psd A: one call */
    for (int i = 0; i < NB * 784; i++) gin[i] = 1234.0f;
    ps_client_fwd f = {.ctx = ctx, .rank = 1, .train = 1, .input = {PS_CLIENT_F32, 4, {NB, 1, 28, 28}, x},
                       .targets = {PS_CLIENT_I64, 1, {NB}, y}, .step = 1, .skip_input_grad = 1};
    ps_client_fwd_out o = {.input_grad = gin, .input_grad_cap = NB * 784};
    CHECK_MSG(ps_client_forward_ex(ca, &f, &o, &err) == PS_OK, "one call: %s", err.msg);
    CHECK_MSG(o.step_version == 1 && !o.skipped, "one call: step version %llu, skipped %d",
              (unsigned long long)o.step_version, o.skipped);
    CHECK_MSG(gin[0] == 1234.0f && gin[NB * 784 - 1] == 1234.0f, "skip_input_grad: an input gradient came back");
    /* psd B: Forward, the NLL's gradient here, Backward, Step */
    int64_t cols = 0;
    uint64_t vb = 0;
    CHECK(ps_client_forward(cb, ctx, 1, 1, x, NB, 1, 28, 28, lp, NB * 10, &cols, NULL, &err) == PS_OK && cols == 10);
    double loss = 0;
    memset(grad, 0, sizeof grad);
    for (int i = 0; i < NB; i++) {
        loss -= lp[i * 10 + y[i]] / NB;
        grad[i * 10 + y[i]] = -1.0f / NB;
    }
    CHECK(ps_client_backward(cb, ctx, grad, NB, 10, 0, NULL, &err) == PS_OK);
    CHECK(ps_client_step(cb, ctx, &vb, &err) == PS_OK && vb == 1);
    CHECK_MSG(fabs(o.loss - loss) <= 1e-5 * fabs(loss), "loss: one call %.8f, three calls %.8f", o.loss, loss);
    params_of(a.addr, &wa);
    params_of(b.addr, &wb);
    CHECK(wa.n == w0.n && wb.n == w0.n && w0.n >= 4);
    double worst = 0;
    const char *where = "";
    for (size_t k = 0; k < w0.n && k < wa.n && k < wb.n; k++) {
        if (w0.items[k].dtype != ps_DType_FLOAT32) continue;
        size_t n = w0.items[k].bytes / sizeof(float);
        double dmax = 0, diff = 0;
        for (size_t i = 0; i < n; i++) {
            double da = (double)wa.items[k].data[i] - w0.items[k].data[i];
            double db = (double)wb.items[k].data[i] - w0.items[k].data[i];
            dmax = fmax(dmax, fabs(db));
            diff = fmax(diff, fabs(da - db));
        }
        CHECK_MSG(dmax > 0, "%s: the three calls' step did not change it", w0.items[k].name);
        if (dmax > 0 && diff / dmax > worst) worst = diff / dmax, where = w0.items[k].name;
    }
    printf("one call a batch: loss %.6f (three calls %.6f); parameters' change max|diff| / max|change| %.2e (%s)\n",
           o.loss, loss, worst, where);
    CHECK_MSG(worst <= 1e-4, "the one call's step differs from the three calls' by %.2e of the change (%s)", worst,
              where);
    /* a Step of the context settles it: answered from the record, not applied again */
    uint64_t again = 0;
    CHECK_MSG(ps_client_step(ca, ctx, &again, &err) == PS_OK && again == 1, "settling Step: %s (version %llu)",
              err.msg, (unsigned long long)again);
    ps_StatusResponse st = status_of(a.addr);
    CHECK_MSG(st.contexts_applied == 1 && st.model_version == 1, "after the settling Step: %llu applied, version %llu",
              (unsigned long long)st.contexts_applied, (unsigned long long)st.model_version);
    /* without skip_input_grad the input gradient comes back */
    f.ctx = ctx + 1;
    f.skip_input_grad = 0;
    CHECK_MSG(ps_client_forward_ex(ca, &f, &o, &err) == PS_OK && o.step_version == 2, "%s", err.msg);
    CHECK_MSG(gin[0] != 1234.0f, "no input gradient without skip_input_grad");
    /* refused without targets, naming the field; nothing applied */
    ps_client_fwd bad = {.ctx = ctx + 2, .rank = 1, .train = 1, .input = f.input, .step = 1};
    ps_client_fwd_out bo = {.out = lp, .out_cap = NB * 10};
    CHECK_MSG(ps_client_forward_ex(ca, &bad, &bo, &err) == PS_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "ForwardRequest.step"), "step without targets: %s", err.msg);
    bad = (ps_client_fwd){.ctx = ctx + 3, .rank = 1, .train = 1, .input = f.input, .skip_input_grad = 1};
    CHECK_MSG(ps_client_forward_ex(ca, &bad, &bo, &err) == PS_ERR_INVALID_ARGUMENT &&
              strstr(err.msg, "ForwardRequest.skip_input_grad"), "skip_input_grad without targets: %s", err.msg);
    CHECK(status_of(a.addr).model_version == 2);
    ps_wire_tensor_list_free(&w0);
    ps_wire_tensor_list_free(&wa);
    ps_wire_tensor_list_free(&wb);
    ps_client_free(ca);
    ps_client_free(cb);
    stop(&a);
    stop(&b);
}

int main(void) {
    grpc_init();
    test_one_call_matches();
    test_sync();
    g_one_call = 1;
    test_sync();
    g_one_call = 0;
    test_sync_late();
    test_forged_round();
    test_ssp();
    g_one_call = 1;
    test_ssp();
    g_one_call = 0;
    test_ssp_invalid_forward();
    test_restart();
    grpc_shutdown();
    return check_summary("test_sync_once");
}
