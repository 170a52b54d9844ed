/* bench_trainer - one ps-train-like trainer that times every RPC.
 *
 * Does what ps-train does per batch (Forward(train) under a fresh context,
 * local NLL loss gradient, Backward, Step; or Backward with step=true under
 * --fuse-step; --loss ce: the cross-entropy's gradient, softmax(output) -
 * onehot, for a model whose output is logits rather than log-probabilities,
 * such as the small ResNet: NLL's constant gradient on logits pushes them
 * up without bound until, a thousand batches on, a gradient overflows; or,
 * under --one-call, one Forward with the batch's targets, step=true and
 * skip_input_grad: psd's fused cross-entropy, backward and step in one call) on real MNIST batches, but calls the rpc and wire layers
 * directly so that it can time, per RPC, the client's serialisation
 * (encode the request + decode the reply) apart from the call itself
 * (transport + server). W warm-up batches, then N timed ones.
 *
 * Writes to --out FILE one line per timed RPC:
 *   rpc <Forward|Backward|Step> <total_us> <call_us> <ser_us>
 * the same as "wrpc" for the warm-up batches' RPCs, and per batch (warm-up
 * included) its whole time, batch preparation and loss gradient included,
 * and when it ended (CLOCK_MONOTONIC seconds, as t_start below):
 *   batch <wall_us> <end_s>
 * (psd's phase counters count every call, so a table set beside them
 * uses every batch).
 * With --probe, after every timed batch (outside its timing) three RPCs
 * that psd refuses after decoding them and before any compute: a training
 * Forward of the same input with context id 0, a Backward and a Step of an
 * unknown context. Their latency is the RPC cost of a batch without the
 * compute (client encode/decode + transport + psd's decode and reply):
 *   probe <Forward|Backward|Step> <total_us>
 * and at the end (also to stdout):
 *   trainer rank=R batches=N samples=S t_start=<s> t_end=<s> wall_s=<s> probe_s=<s> cpu_s=<s> vcs=<n> ics=<n>
 * t_start/t_end are CLOCK_MONOTONIC seconds (one clock for all processes
 * of the machine), so a driver can compute the combined throughput of
 * concurrent trainers. cpu_s: this process's CPU-seconds (user + system, all
 * threads, gRPC's included) over the timed batches, probes left out: what a
 * trainer costs per sample, which load changes far less than wall time.
 * vcs, ics: its voluntary and involuntary context switches over the same
 * batches (all threads, probes left out): what a call costs the client in
 * wake-ups.
 *
 * --start-together DIR N: after its warm-up each trainer creates
 * DIR/ready.<rank> and waits (up to 60 s) until N such files exist, so N
 * concurrent trainers start their timed batches together. Without it a
 * driver's "all samples / (last end - first start)" also counts the time
 * one trainer ran alone while the others were still starting (process
 * start-up and warm-up differ by ~0.1 s, 10-15 % of a short timed run).
 *
 * --inflight K (with --one-call; default 1): K batches in flight at once,
 * each on its own thread over the one channel (a trainer that sends its
 * next batch before its last reply has come); the lines of the K lanes
 * interleave.
 *
 * usage: bench_trainer --server ADDR [--rank R] [--batches N] [--warmup W]
 *                      [--batch-size B] [--fuse-step | --one-call [--inflight K]] [--loss nll|ce] [--probe]
 *                      [--data DIR] [--out FILE] [--start-together DIR N]
 */
#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "mnist.h"
#include "rpc.h"
#include "wire.h"

/* This process's CPU (all threads: user + system, seconds) and context
 * switches (voluntary, involuntary), from one getrusage. */
typedef struct usage {
    double cpu_s;
    long vcs, ics;
} usage;

static usage usage_now(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (usage){(double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
                       ru.ru_stime.tv_usec * 1e-6,
                   ru.ru_nvcsw, ru.ru_nivcsw};
}

/* *acc += to - from */
static void usage_add(usage *acc, usage from, usage to) {
    acc->cpu_s += to.cpu_s - from.cpu_s;
    acc->vcs += to.vcs - from.vcs;
    acc->ics += to.ics - from.ics;
}

/* --start-together: announce this trainer ready in dir, then wait until n
 * trainers are (polling every 0.2 ms; 60 s at most, then go on with a
 * warning rather than hang the bench). */
static void start_together(const char *dir, long n, long rank) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ready.%ld", dir, rank);
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    if (fd < 0) {
        fprintf(stderr, "bench_trainer: cannot create %s: %s (starting alone)\n", path, strerror(errno));
        return;
    }
    close(fd);
    double t0 = ps_mono_s();
    for (;;) {
        long ready = 0;
        DIR *d = opendir(dir);
        for (struct dirent *e; d && (e = readdir(d));)
            if (!strncmp(e->d_name, "ready.", 6)) ready++;
        if (d) closedir(d);
        if (ready >= n) return;
        if (ps_mono_s() - t0 > 60) {
            fprintf(stderr, "bench_trainer: rank %ld: %ld of %ld trainers ready after 60 s; starting\n", rank, ready, n);
            return;
        }
        usleep(200);
    }
}

typedef struct timing {
    double ser, call;
} timing;

/* encode, call, decode; fills t. expect: the gRPC status the call should
 * end with (GRPC_STATUS_OK normally; the probes expect refusals). */
static int rpc_expect(ps_rpc_client *cl, const char *method, const pb_msgdesc_t *qf, const void *q,
                      const pb_msgdesc_t *rf, void *r, timing *t, grpc_status_code expect, ps_err *err);

static int rpc(ps_rpc_client *cl, const char *method, const pb_msgdesc_t *qf, const void *q,
               const pb_msgdesc_t *rf, void *r, timing *t, ps_err *err) {
    return rpc_expect(cl, method, qf, q, rf, r, t, GRPC_STATUS_OK, err);
}

static int rpc_expect(ps_rpc_client *cl, const char *method, const pb_msgdesc_t *qf, const void *q,
                      const pb_msgdesc_t *rf, void *r, timing *t, grpc_status_code expect, ps_err *err) {
    double t0 = ps_mono_s();
    grpc_byte_buffer *rq = NULL, *rs = NULL;
    if (ps_wire_encode(qf, q, &rq, err)) return -1;
    double t1 = ps_mono_s();
    grpc_status_code code;
    char details[PS_RPC_DETAILS_MAX] = "";
    ps_status st = ps_rpc_client_call(cl, method, rq, &rs, 60000, &code, details, sizeof details, err);
    double t2 = ps_mono_s();
    grpc_byte_buffer_destroy(rq);
    if (st) return -1;
    if (code != expect) {
        ps_err_set(err, ps_status_from_grpc(code), "%s: %s: %s", method, ps_grpc_code_name(code), details);
        return -1;
    }
    if (code != GRPC_STATUS_OK) {
        t->ser = t1 - t0;
        t->call = t2 - t1;
        return 0;
    }
    st = ps_wire_decode(rs, rf, r, err);
    if (rs) grpc_byte_buffer_destroy(rs);
    double t3 = ps_mono_s();
    t->ser = (t1 - t0) + (t3 - t2);
    t->call = t2 - t1;
    return st ? -1 : 0;
}

/* A training Forward of batch x (dims: its 4 dims) for context ctx; one:
 * with the class ids y (tdims: {batch}), step and skip_input_grad - the
 * whole step in this call. The reply's output is decoded into in. dims,
 * tdims, x and y must outlive the call (the request points at them). */
static void forward_request(ps_ForwardRequest *fq, ps_ForwardResponse *fr, ps_wire_tensor_in *in, uint64_t ctx,
                            uint32_t rank, int64_t *dims, float *x, int64_t *tdims, int64_t *y, int one, ps_err *err) {
    *fq = (ps_ForwardRequest)ps_ForwardRequest_init_zero;
    fq->context_id = ctx;
    fq->train = true;
    fq->trainer_rank = rank;
    fq->has_input = true;
    ps_wire_tensor_encode_bind(&fq->input, NULL, 4, dims, x);
    if (one) {  /* the fused loss, its backward and the step in this call */
        fq->has_targets = true;
        ps_wire_tensor_encode_bind_typed(&fq->targets, NULL, 1, tdims, y, ps_DType_INT64);
        fq->step = true;
        fq->skip_input_grad = true;
    }
    *fr = (ps_ForwardResponse)ps_ForwardResponse_init_zero;
    ps_wire_tensor_in_init(in, 64 << 20);
    in->err = err;
    ps_wire_tensor_decode_bind(&fr->output, in);
}

/* --one-call's batches on K lanes (--inflight K, default 1): threads on the
 * one channel, each sending its own batches one call at a time, so the
 * trainer keeps K calls in flight (K > 1: a trainer that sends its next
 * batch before its last reply has come; ps-train sends one at a time).
 * Batches are numbered from one counter: the warm-up ones first (all
 * lanes, then joined), the timed ones after. */
typedef struct lanes {
    ps_rpc_client *cl;
    const ps_mnist *data;
    const uint32_t *order;
    long bs, rank, nb, end, warmup;
    uint64_t ctx_base;
    long next;                 /* __atomic: the next batch number (lanes_run sets it) */
    long samples;              /* __atomic: timed samples done */
    FILE *out;
    pthread_mutex_t out_mu;
    int failed;                /* __atomic */
    ps_err err;                /* the first failure's (under out_mu) */
} lanes;

static void *lane_main(void *arg) {
    lanes *L = arg;
    const int img = (int)(L->data->rows * L->data->cols);
    float *x = malloc((size_t)L->bs * img * sizeof(float));
    int64_t *y = malloc((size_t)L->bs * sizeof(int64_t));
    ps_err err = {0};
    if (!x || !y) {
        ps_err_set(&err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    for (;;) {
        long b = __atomic_fetch_add(&L->next, 1, __ATOMIC_RELAXED);
        if (b >= L->end || __atomic_load_n(&L->failed, __ATOMIC_RELAXED)) break;
        double bs0 = ps_mono_s();
        if (ps_mnist_batch(L->data, L->order + (size_t)(b % L->nb) * L->bs, (int)L->bs, x, y, &err)) goto fail;
        int64_t dims[4] = {L->bs, 1, L->data->rows, L->data->cols}, tdims[1] = {L->bs};
        ps_ForwardRequest fq;
        ps_ForwardResponse fr;
        ps_wire_tensor_in in;
        forward_request(&fq, &fr, &in, L->ctx_base | (uint64_t)(b + 1), (uint32_t)L->rank, dims, x, tdims, y, 1, &err);
        timing tf;
        double b0 = ps_mono_s();
        int bad = rpc(L->cl, "/ps.ParameterServer/Forward", ps_ForwardRequest_fields, &fq, ps_ForwardResponse_fields,
                      &fr, &tf, &err);
        double b1 = ps_mono_s();
        ps_wire_tensor_in_free(&in);
        if (bad) goto fail;
        if (b >= L->warmup) __atomic_add_fetch(&L->samples, L->bs, __ATOMIC_RELAXED);
        if (L->out) {
            pthread_mutex_lock(&L->out_mu);
            fprintf(L->out, "%s Forward+Step %.1f %.1f %.1f\nbatch %.1f %.6f\n", b < L->warmup ? "wrpc" : "rpc",
                    (b1 - b0) * 1e6, tf.call * 1e6, tf.ser * 1e6, (b1 - bs0) * 1e6, b1);
            pthread_mutex_unlock(&L->out_mu);
        }
    }
    free(x);
    free(y);
    return NULL;
fail:
    if (!__atomic_exchange_n(&L->failed, 1, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&L->out_mu);
        L->err = err;
        pthread_mutex_unlock(&L->out_mu);
    }
    free(x);
    free(y);
    return NULL;
}

/* Batches [start, end) on k lanes; 0, or -1 with L->err set. (Each lane
 * takes one number past end before it stops, so the counter restarts.) */
static int lanes_run(lanes *L, long start, long end, int k) {
    pthread_t t[16];
    L->next = start;
    L->end = end;
    int n = 0;
    for (; n < k; n++)
        if (pthread_create(&t[n], NULL, lane_main, L)) {
            ps_err_set(&L->err, PS_ERR_RESOURCE_EXHAUSTED, "cannot start lane %d", n);
            __atomic_store_n(&L->failed, 1, __ATOMIC_RELAXED);
            break;
        }
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    return L->failed ? -1 : 0;
}

int main(int argc, char **argv) {
    const char *server = NULL, *data_dir = "data/mnist", *out_path = NULL, *together = NULL;
    long rank = 1, batches = 200, warmup = 20, bs = 32, fuse = 0, probe = 0, ntogether = 0, ce = 0, one = 0, inflight = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--fuse-step")) { fuse = 1; continue; }
        if (!strcmp(a, "--one-call")) { one = 1; continue; }
        if (!strcmp(a, "--probe")) { probe = 1; continue; }
        if (!v) { fprintf(stderr, "bench_trainer: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--start-together")) {
            together = v;
            if (i + 1 >= argc) { fprintf(stderr, "bench_trainer: --start-together needs DIR and N\n"); return 2; }
            if (ps_cli_long("bench_trainer", a, argv[++i], 1, 1023, &ntogether)) return 2;
            continue;
        }
        if (!strcmp(a, "--loss")) {
            if (strcmp(v, "nll") && strcmp(v, "ce")) { fprintf(stderr, "bench_trainer: --loss is nll or ce, not '%s'\n", v); return 2; }
            ce = !strcmp(v, "ce");
        } else if (!strcmp(a, "--server")) server = v;
        else if (!strcmp(a, "--data")) data_dir = v;
        else if (!strcmp(a, "--out")) out_path = v;
        else if (!strcmp(a, "--rank")) { if (ps_cli_long("bench_trainer", a, v, 1, 1023, &rank)) return 2; }
        else if (!strcmp(a, "--batches")) { if (ps_cli_long("bench_trainer", a, v, 1, 1000000, &batches)) return 2; }
        else if (!strcmp(a, "--warmup")) { if (ps_cli_long("bench_trainer", a, v, 0, 1000000, &warmup)) return 2; }
        else if (!strcmp(a, "--batch-size")) { if (ps_cli_long("bench_trainer", a, v, 1, 512, &bs)) return 2; }
        else if (!strcmp(a, "--inflight")) { if (ps_cli_long("bench_trainer", a, v, 1, 16, &inflight)) return 2; }
        else { fprintf(stderr, "bench_trainer: unknown option '%s'\n", a); return 2; }
    }
    if (!server) { fprintf(stderr, "bench_trainer: --server ADDR is required\n"); return 2; }
    if (one && (fuse || probe)) { fprintf(stderr, "bench_trainer: --one-call goes with neither --fuse-step nor --probe\n"); return 2; }
    if (inflight > 1 && !one) { fprintf(stderr, "bench_trainer: --inflight goes with --one-call\n"); return 2; }
    ps_err err = {0};
    ps_mnist data = {0};
    if (ps_mnist_load(data_dir, "train", &data, &err)) { fprintf(stderr, "bench_trainer: %s\n", err.msg); return 1; }
    FILE *out = out_path ? fopen(out_path, "w") : NULL;
    if (out_path && !out) { fprintf(stderr, "bench_trainer: cannot write %s: %s\n", out_path, strerror(errno)); return 1; }
    grpc_init();
    int rc = 1;
    ps_rpc_client *cl = ps_rpc_client_create(server, 64 << 20, &err);
    const int k = 10, img = (int)(data.rows * data.cols);
    float *x = malloc((size_t)bs * img * sizeof(float)), *grad = malloc((size_t)bs * k * sizeof(float));
    int64_t *y = malloc((size_t)bs * sizeof(int64_t));
    uint32_t *order = malloc((size_t)data.n * sizeof(uint32_t));
    if (!cl || !x || !grad || !y || !order) { fprintf(stderr, "bench_trainer: %s\n", cl ? "out of memory" : err.msg); goto done; }
    for (uint32_t i = 0; i < data.n; i++) order[i] = i;
    ps_shuffle_u32(order, data.n, (uint64_t)rank);
    uint64_t ctx_base = ((uint64_t)getpid() << 32) ^ ((uint64_t)rank << 56);
    /* Wait for psd (Status until it answers). */
    for (int tries = 0;; tries++) {
        ps_StatusRequest q = ps_StatusRequest_init_zero;
        ps_StatusResponse r = ps_StatusResponse_init_zero;
        timing t;
        if (rpc(cl, "/ps.ParameterServer/Status", ps_StatusRequest_fields, &q, ps_StatusResponse_fields, &r, &t, &err) == 0)
            break;
        if (tries > 150) { fprintf(stderr, "bench_trainer: psd at %s: %s\n", server, err.msg); goto done; }
        usleep(100 * 1000);
    }
    long nb = data.n / (uint32_t)bs, samples = 0;
    double t_start = 0, t_probe = 0;
    usage u_start = {0}, u_probe = {0};  /* at the first timed batch; the probes' */
    if (one) {
        lanes L = {.cl = cl, .data = &data, .order = order, .bs = bs, .rank = rank, .nb = nb, .warmup = warmup,
                   .ctx_base = ctx_base, .out = out};
        pthread_mutex_init(&L.out_mu, NULL);
        int bad = lanes_run(&L, 0, warmup, (int)inflight);
        if (!bad && together) start_together(together, ntogether, rank);
        t_start = ps_mono_s();
        u_start = usage_now();
        bad = bad || lanes_run(&L, warmup, warmup + batches, (int)inflight);
        pthread_mutex_destroy(&L.out_mu);
        if (bad) {
            err = L.err;
            goto fail;
        }
        samples = L.samples;
        goto timed_done;
    }
    for (long b = 0; b < warmup + batches; b++) {
        if (b == warmup) {
            if (together) start_together(together, ntogether, rank);
            t_start = ps_mono_s();
            u_start = usage_now();
        }
        double bs0 = ps_mono_s();
        if (ps_mnist_batch(&data, order + (size_t)(b % nb) * bs, (int)bs, x, y, &err)) goto fail;
        uint64_t ctx = ctx_base | (uint64_t)(b + 1);
        timing tf, tb, ts = {0, 0};
        double b0 = ps_mono_s();
        int64_t dims[4] = {bs, 1, data.rows, data.cols}, tdims[1] = {bs};
        ps_ForwardRequest fq;
        ps_ForwardResponse fr;
        ps_wire_tensor_in in;
        forward_request(&fq, &fr, &in, ctx, (uint32_t)rank, dims, x, tdims, y, 0, &err);
        int bad = rpc(cl, "/ps.ParameterServer/Forward", ps_ForwardRequest_fields, &fq, ps_ForwardResponse_fields, &fr,
                      &tf, &err) ||
                  ps_wire_tensor_check(&fr.output, &in, "ForwardResponse.output", &err) ||
                  in.bytes != (size_t)bs * k * sizeof(float);
        double b1 = ps_mono_s();
        if (!bad) {  /* the loss's gradient */
            memset(grad, 0, (size_t)bs * k * sizeof(float));
            for (long i = 0; i < bs; i++) {
                float *g = grad + i * k;
                if (ce) {  /* (softmax(logits) - onehot) / batch */
                    const float *z = in.data + i * k;
                    float m = z[0], sum = 0;
                    for (int c = 1; c < k; c++) m = z[c] > m ? z[c] : m;
                    for (int c = 0; c < k; c++) sum += g[c] = expf(z[c] - m);
                    for (int c = 0; c < k; c++) g[c] = g[c] / sum / (float)bs;
                }
                g[y[i]] -= 1.0f / (float)bs;
            }
        }
        ps_wire_tensor_in_free(&in);
        if (bad) goto fail;
        double b2 = ps_mono_s();
        ps_BackwardRequest bq = ps_BackwardRequest_init_zero;
        bq.context_id = ctx;
        bq.step = fuse != 0;
        bq.has_grad_output = true;
        int64_t gd[2] = {bs, k};
        ps_wire_tensor_encode_bind(&bq.grad_output, NULL, 2, gd, grad);
        ps_BackwardResponse br = ps_BackwardResponse_init_zero;
        if (rpc(cl, "/ps.ParameterServer/Backward", ps_BackwardRequest_fields, &bq, ps_BackwardResponse_fields, &br, &tb,
                &err))
            goto fail;
        double b3 = ps_mono_s(), b4 = b3;
        if (!fuse) {
            ps_StepRequest sq = ps_StepRequest_init_zero;
            sq.context_id = ctx;
            ps_StepResponse sr = ps_StepResponse_init_zero;
            if (rpc(cl, "/ps.ParameterServer/Step", ps_StepRequest_fields, &sq, ps_StepResponse_fields, &sr, &ts, &err))
                goto fail;
            b4 = ps_mono_s();
        }
        if (b < warmup) {
            if (out) {
                fprintf(out, "wrpc Forward %.1f %.1f %.1f\n", (b1 - b0) * 1e6, tf.call * 1e6, tf.ser * 1e6);
                fprintf(out, "wrpc %s %.1f %.1f %.1f\n", fuse ? "Backward+Step" : "Backward", (b3 - b2) * 1e6,
                        tb.call * 1e6, tb.ser * 1e6);
                if (!fuse) fprintf(out, "wrpc Step %.1f %.1f %.1f\n", (b4 - b3) * 1e6, ts.call * 1e6, ts.ser * 1e6);
                fprintf(out, "batch %.1f %.6f\n", (b4 - bs0) * 1e6, b4);
            }
            continue;
        }
        if (out) fprintf(out, "batch %.1f %.6f\n", (b4 - bs0) * 1e6, b4);
        samples += bs;
        if (probe) {
            double p0 = ps_mono_s();
            usage u0 = usage_now();
            timing tp[3];
            ps_ForwardRequest pq = fq;  /* same input, context 0: refused after decoding */
            pq.context_id = 0;
            ps_wire_tensor_encode_bind(&pq.input, NULL, 4, dims, x);
            ps_ForwardResponse pr = ps_ForwardResponse_init_zero;
            ps_BackwardRequest pb = bq;  /* unknown context */
            pb.context_id = ctx ^ 0x8000000000000000ULL;
            ps_wire_tensor_encode_bind(&pb.grad_output, NULL, 2, gd, grad);
            ps_BackwardResponse pbr = ps_BackwardResponse_init_zero;
            ps_StepRequest ps = ps_StepRequest_init_zero;
            ps.context_id = pb.context_id;
            ps_StepResponse psr = ps_StepResponse_init_zero;
            if (rpc_expect(cl, "/ps.ParameterServer/Forward", ps_ForwardRequest_fields, &pq, ps_ForwardResponse_fields,
                           &pr, &tp[0], GRPC_STATUS_INVALID_ARGUMENT, &err) ||
                rpc_expect(cl, "/ps.ParameterServer/Backward", ps_BackwardRequest_fields, &pb,
                           ps_BackwardResponse_fields, &pbr, &tp[1], GRPC_STATUS_NOT_FOUND, &err) ||
                rpc_expect(cl, "/ps.ParameterServer/Step", ps_StepRequest_fields, &ps, ps_StepResponse_fields, &psr,
                           &tp[2], GRPC_STATUS_NOT_FOUND, &err))
                goto fail;
            if (out)
                fprintf(out, "probe Forward %.1f\nprobe Backward %.1f\nprobe Step %.1f\n", (tp[0].ser + tp[0].call) * 1e6,
                        (tp[1].ser + tp[1].call) * 1e6, (tp[2].ser + tp[2].call) * 1e6);
            t_probe += ps_mono_s() - p0;
            usage_add(&u_probe, u0, usage_now());
        }
        if (out) {
            fprintf(out, "rpc Forward %.1f %.1f %.1f\n", (b1 - b0) * 1e6, tf.call * 1e6, tf.ser * 1e6);
            fprintf(out, "rpc %s %.1f %.1f %.1f\n", fuse ? "Backward+Step" : "Backward", (b3 - b2) * 1e6,
                    tb.call * 1e6, tb.ser * 1e6);
            if (!fuse) fprintf(out, "rpc Step %.1f %.1f %.1f\n", (b4 - b3) * 1e6, ts.call * 1e6, ts.ser * 1e6);
        }
    }
timed_done:;
    double t_end = ps_mono_s();
    usage u = {0};  /* the timed batches'... */
    usage_add(&u, u_start, usage_now());
    usage_add(&u, u_probe, (usage){0});  /* ... less the probes' */
    char line[400];
    snprintf(line, sizeof line,
             "trainer rank=%ld batches=%ld samples=%ld t_start=%.6f t_end=%.6f wall_s=%.4f probe_s=%.4f cpu_s=%.4f "
             "vcs=%ld ics=%ld\n",
             rank, batches, samples, t_start, t_end, t_end - t_start - t_probe, t_probe,
             u.cpu_s, u.vcs, u.ics);
    fputs(line, stdout);
    if (out) fputs(line, out);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench_trainer: rank %ld: %s\n", rank, err.msg);
done:
    if (out) fclose(out);
    free(x); free(grad); free(y); free(order);
    ps_rpc_client_free(cl);
    ps_mnist_free(&data);
    grpc_shutdown();
    return rc;
}
