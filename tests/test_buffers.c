/* test_buffers.c - BatchNorm's buffers through psd's service, checkpoints
 * and --init-from, against statistics computed here in double from the
 * inputs (the BatchNorm is the model's first node, so a forward's batch
 * statistics are those of its input):
 *
 *  - ListParameters lists running_mean, running_var (float32) and
 *    num_batches_tracked (int64, shape []) with buffer = true after the
 *    parameters; GetParameters returns their values; GetGradients and
 *    PushGradients never take them;
 *  - a context with forwards seq 0 and 1, a retried forward 0 (answered
 *    from the record), backwarded in the order 1, 0, then stepped: the
 *    running statistics are PyTorch's momentum rule over the batches of
 *    seq 0 then seq 1 (unbiased variance), num_batches_tracked 2;
 *  - a context never stepped, and one whose Backward is refused (NaN
 *    gradient under server.nonfinite_policy: reject) and then its Step,
 *    change nothing;
 *  - an eval Forward uses the running statistics;
 *  - a checkpoint holds the buffers under their names (num_batches_tracked
 *    as an I64 scalar) and restores them into a fresh model;
 *  - an --init-from file whose running_mean has another shape is refused,
 *    naming the model file's line of the node.
 */
#include <grpc/grpc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "model.h"
#include "ps_client.h"
#include "rpc.h"
#include "safetensors.h"
#include "service.h"

#include "check.h"
#include "support/tmpdir.h"

#define MAXMSG (4 << 20)
#define C 3
#define HW 4
#define N 4
#define MOM 0.25

static const char *MODEL =
    "name: bn_test\n"
    "stages:\n"
    "  - name: s\n"
    "    input: {shape: [3, 2, 2], dtype: float32}\n"
    "    nodes:\n"
    "      - {name: bn, kind: BatchNorm2d, momentum: 0.25}\n"
    "      - {name: flat, kind: Flatten}\n"
    "      - {name: fc, kind: Linear, out_features: 2}\n";

/* Per channel: the mean and the unbiased variance of x (N, C, HW). */
static void batch_stats(const float *x, double *mean, double *var) {
    for (int c = 0; c < C; c++) {
        double s = 0, q = 0;
        for (int n = 0; n < N; n++)
            for (int p = 0; p < HW; p++) s += x[(n * C + c) * HW + p];
        mean[c] = s / (N * HW);
        for (int n = 0; n < N; n++)
            for (int p = 0; p < HW; p++) q += pow(x[(n * C + c) * HW + p] - mean[c], 2);
        var[c] = q / (N * HW - 1);
    }
}

static void fold(double *rm, double *rv, const float *x) {
    double m[C], v[C];
    batch_stats(x, m, v);
    for (int c = 0; c < C; c++) {
        rm[c] = (1 - MOM) * rm[c] + MOM * m[c];
        rv[c] = (1 - MOM) * rv[c] + MOM * v[c];
    }
}

static const ps_wire_tensor *find_t(const ps_wire_tensor_list *l, const char *name) {
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].name, name)) return &l->items[i];
    return NULL;
}

/* The buffers as GetParameters returns them vs the expected running statistics. */
static void check_buffers(ps_client *cl, const char *what, const double *rm, const double *rv, int64_t nbt) {
    ps_err err = {0};
    ps_wire_tensor_list tl;
    uint64_t v;
    CHECK_MSG(ps_client_get_parameters(cl, &tl, &v, &err) == PS_OK, "%s: %s", what, err.msg);
    const ps_wire_tensor *m = find_t(&tl, "bn.running_mean"), *r = find_t(&tl, "bn.running_var"),
                         *k = find_t(&tl, "bn.num_batches_tracked");
    CHECK_MSG(m && r && k && m->ndim == 1 && m->dims[0] == C && k->ndim == 0 && k->dtype == PS_CLIENT_I64,
              "%s: buffers missing or mis-shaped", what);
    if (m && r && k) {
        for (int c = 0; c < C; c++) {
            CHECK_CLOSE(m->data[c], rm[c], 1e-5, 1e-4);
            CHECK_CLOSE(r->data[c], rv[c], 1e-5, 1e-4);
        }
        CHECK_MSG(*(const int64_t *)k->data == nbt, "%s: num_batches_tracked %lld, want %lld", what,
                  (long long)*(const int64_t *)k->data, (long long)nbt);
    }
    ps_wire_tensor_list_free(&tl);
}

static ps_status forward(ps_client *cl, uint64_t ctx, uint32_t seq, int train, const float *x, float *out, int *replayed,
                         ps_err *err) {
    ps_client_fwd f = {.ctx = ctx, .seq = seq, .rank = 1, .train = train,
                       .input = {PS_CLIENT_F32, 4, {N, C, 2, 2}, x}};
    ps_client_fwd_out o = {.out = out, .out_cap = N * 2};
    ps_status st = ps_client_forward_ex(cl, &f, &o, err);
    if (replayed) *replayed = o.replayed;
    return st;
}

int main(void) {
    grpc_init();
    ps_err err = {0};
    char dir[] = "/tmp/ps-test-buffers.XXXXXX";
    if (!mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    char path[256];
    snprintf(path, sizeof path, "%s/bn_test.yaml", dir);
    FILE *f = fopen(path, "w");
    if (!f) return 1;
    fputs(MODEL, f);
    fclose(f);
    ps_model_opts mo = {.file = path, .cpu_backend = "dnnl", .seed = 1, .compute_threads = 2, .lr = 0.05f};
    ps_model *model = ps_model_create(&mo, &err);
    CHECK_MSG(model, "%s", err.msg);
    if (!model) return check_summary("test_buffers");
    ps_service_opts so = {.context_ttl_s = 60, .max_contexts = 64, .max_message_bytes = MAXMSG};
    ps_service *svc = ps_service_create(model, &so, &err);
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    ps_rpc_server *srv = ps_rpc_server_create("127.0.0.1:0", 2, MAXMSG, methods, nm, svc, &err);
    CHECK_MSG(srv, "%s", err.msg);
    if (!srv || ps_rpc_server_start(srv, &err)) return check_summary("test_buffers");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_rpc_server_port(srv));
    ps_client *cl = ps_client_create(addr, 30000, MAXMSG, &err);
    CHECK(cl != NULL);

    /* ListParameters: the parameters, then the buffers */
    ps_wire_param_list pl;
    char mname[64];
    CHECK(ps_client_list_parameters(cl, &pl, mname, sizeof mname, &err) == PS_OK);
    const char *names[] = {"bn.weight", "bn.bias", "fc.weight", "fc.bias", "bn.running_mean", "bn.running_var",
                           "bn.num_batches_tracked"};
    CHECK_MSG(pl.n == 7, "%zu entries", pl.n);
    for (size_t i = 0; i < pl.n && i < 7; i++) {
        CHECK_MSG(!strcmp(pl.items[i].name, names[i]), "entry %zu is %s", i, pl.items[i].name);
        CHECK(pl.items[i].buffer == (i >= 4));
        CHECK(pl.items[i].dtype == (i == 6 ? ps_DType_INT64 : ps_DType_FLOAT32));
    }
    CHECK(pl.n == 7 && pl.items[6].shape_count == 0 && pl.items[4].shape_count == 1 && pl.items[4].shape[0] == C);
    ps_wire_param_list_free(&pl);

    double rm[C] = {0, 0, 0}, rv[C] = {1, 1, 1};
    check_buffers(cl, "initial", rm, rv, 0);

    /* context 11: forwards 0 and 1, a retry of 0, backwards 1 then 0, step */
    float x[4][N * C * HW], out[N * 2], g[N * 2];
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < N * C * HW; i++) x[b][i] = (float)(sin(1.7 * i + b) * (1 + b) + 0.3 * b);
    for (int i = 0; i < N * 2; i++) g[i] = (float)cos(0.9 * i);
    int rep = -1;
    CHECK(forward(cl, 11, 0, 1, x[0], out, &rep, &err) == PS_OK && !rep);
    CHECK(forward(cl, 11, 1, 1, x[1], out, &rep, &err) == PS_OK && !rep);
    CHECK(forward(cl, 11, 0, 1, x[0], out, &rep, &err) == PS_OK && rep);   /* retried: answered from the record */
    ps_client_tensor gt = {PS_CLIENT_F32, 2, {N, 2}, g};
    uint32_t s1 = 1, s0 = 0;
    ps_client_bwd b1 = {.ctx = 11, .n = 1, .seqs = &s1, .grads = &gt}, b0 = {.ctx = 11, .n = 1, .seqs = &s0, .grads = &gt};
    ps_client_step_out so1;
    CHECK_MSG(ps_client_backward_ex(cl, &b1, &so1, &err) == PS_OK, "%s", err.msg);
    CHECK_MSG(ps_client_backward_ex(cl, &b0, &so1, &err) == PS_OK, "%s", err.msg);
    /* no gradient of a buffer */
    ps_wire_tensor_list gl;
    CHECK(ps_client_get_gradients(cl, 11, &gl, &err) == PS_OK && gl.n == 4 && !find_t(&gl, "bn.running_mean"));
    ps_wire_tensor_list_free(&gl);
    check_buffers(cl, "before the step", rm, rv, 0);
    uint64_t v = 0;
    CHECK_MSG(ps_client_step(cl, 11, &v, &err) == PS_OK && v == 1, "%s", err.msg);
    fold(rm, rv, x[0]);
    fold(rm, rv, x[1]);
    check_buffers(cl, "after context 11", rm, rv, 2);
    CHECK(ps_client_step(cl, 11, &v, &err) == PS_OK && v == 1);   /* a repeated Step: answered, not re-applied */
    check_buffers(cl, "after a repeated step", rm, rv, 2);

    /* context 12 never steps; context 13's backward is refused, then its step */
    CHECK(forward(cl, 12, 0, 1, x[2], out, NULL, &err) == PS_OK);
    CHECK(forward(cl, 13, 0, 1, x[2], out, NULL, &err) == PS_OK);
    float bad[N * 2];
    memcpy(bad, g, sizeof bad);
    bad[3] = NAN;
    ps_client_tensor bt = {PS_CLIENT_F32, 2, {N, 2}, bad};
    ps_client_bwd b13 = {.ctx = 13, .n = 1, .seqs = &s0, .grads = &bt};
    CHECK(ps_client_backward_ex(cl, &b13, &so1, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK(ps_client_step(cl, 13, &v, &err) != PS_OK);
    check_buffers(cl, "after contexts 12 and 13", rm, rv, 2);

    /* PushGradients cannot name a buffer */
    float zeros[C] = {0};
    ps_wire_named pg = {.name = "bn.running_mean", .ndim = 1, .dims = {C}, .data = zeros};
    ps_status pst = ps_client_push_gradients(cl, 14, 1, 0, &pg, 1, NULL, &err);
    CHECK_MSG(pst != PS_OK && strstr(err.msg, "bn.running_mean"), "%s: %s", ps_status_name(pst), err.msg);
    /* ... and with context_known (the trainer's Forward opened it here) an
     * unknown context is NOT_FOUND: never opened afresh (docs/protocol.md) */
    pst = ps_client_push_gradients(cl, 15, 1, 1, &pg, 1, NULL, &err);
    CHECK_MSG(pst == PS_ERR_NOT_FOUND && strstr(err.msg, "context_known"), "%s: %s", ps_status_name(pst), err.msg);

    /* eval: the running statistics, computed here with psd's weights */
    ps_wire_tensor_list tl;
    CHECK(ps_client_get_parameters(cl, &tl, &v, &err) == PS_OK);
    const ps_wire_tensor *gw = find_t(&tl, "bn.weight"), *gb = find_t(&tl, "bn.bias"), *fw = find_t(&tl, "fc.weight"),
                         *fb = find_t(&tl, "fc.bias");
    CHECK(forward(cl, 0, 0, 0, x[3], out, NULL, &err) == PS_OK);
    if (gw && gb && fw && fb) {
        for (int n = 0; n < N; n++)
            for (int o = 0; o < 2; o++) {
                double acc = fb->data[o];
                for (int c = 0; c < C; c++)
                    for (int p = 0; p < HW; p++) {
                        double xn = (x[3][(n * C + c) * HW + p] - rm[c]) / sqrt(rv[c] + 1e-5) * gw->data[c] + gb->data[c];
                        acc += xn * fw->data[o * C * HW + c * HW + p];
                    }
                CHECK_CLOSE(out[n * 2 + o], acc, 1e-4, 1e-4);
            }
    }
    ps_wire_tensor_list_free(&tl);

    /* checkpoint: the buffers by name, restored into a fresh model */
    ps_ckpt_info info;
    CHECK_MSG(ps_ckpt_save(model, dir, 0, 1, &info, &err) == PS_OK, "%s", err.msg);
    ps_st_file *ck = ps_st_read(info.path, &err);
    CHECK_MSG(ck, "%s", err.msg);
    if (ck) {
        const ps_st_tensor *t = ps_st_find(ck, "bn.num_batches_tracked");
        CHECK(t && t->dtype == PS_ST_I64 && t->ndim == 0 && *(const int64_t *)t->data == 2);
        t = ps_st_find(ck, "bn.running_var");
        CHECK(t && t->dtype == PS_ST_F32 && t->ndim == 1 && fabs(((const float *)t->data)[1] - rv[1]) < 1e-4);
    }
    ps_model *fresh = ps_model_create(&mo, &err);
    CHECK(fresh != NULL);
    if (fresh) {
        CHECK_MSG(ps_ckpt_load(fresh, info.path, NULL, &err) == PS_OK, "%s", err.msg);
        float got[C];
        int64_t cnt = 0;
        CHECK(ps_model_get_buffer(fresh, ps_model_find_buffer(fresh, "bn.running_mean"), got, &err) == PS_OK);
        for (int c = 0; c < C; c++) CHECK_CLOSE(got[c], rm[c], 1e-5, 1e-4);
        CHECK(ps_model_get_buffer(fresh, ps_model_find_buffer(fresh, "bn.num_batches_tracked"), &cnt, &err) == PS_OK &&
              cnt == 2);
    }

    /* --init-from: a running_mean of another shape names the node's line */
    if (ck && fresh) {
        ps_st_tensor ts[8];
        size_t k = 0;
        float wrong[C + 1] = {0};
        for (size_t i = 0; i < ps_st_count(ck) && k < 8; i++) {
            ts[k] = *ps_st_get(ck, i);
            if (!strcmp(ts[k].name, "bn.running_mean")) {
                ts[k].dims[0] = C + 1;
                ts[k].data = wrong;
                ts[k].bytes = sizeof wrong;
            }
            k++;
        }
        char bad_path[300];
        snprintf(bad_path, sizeof bad_path, "%s/init.safetensors", dir);
        CHECK(ps_st_write(bad_path, ts, k, NULL, &err) == PS_OK);
        CHECK(ps_ckpt_init_from(fresh, bad_path, &err) == PS_ERR_INVALID_ARGUMENT);
        char want[320];
        snprintf(want, sizeof want, "%s:6: node 'bn'", path);
        CHECK_MSG(strstr(err.msg, "bn.running_mean") && strstr(err.msg, want), "%s", err.msg);
    }
    ps_st_free(ck);
    ps_model_free(fresh);

    ps_client_free(cl);
    ps_rpc_server_free(srv);
    ps_service_free(svc);
    ps_model_free(model);
    test_rmtree(dir);
    return check_summary("test_buffers");
}
