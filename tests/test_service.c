/* test_service - the ParameterServer service over real gRPC on loopback.
 *
 * Starts the service in-process on 127.0.0.1:<free port> (or, with
 * PSD_ADDR=host:port, talks to an already running psd, as the integration
 * test does while trainers train) and checks the protocol: parameter
 * listing, a full Forward/Backward/GetGradients/Step cycle with a gradient
 * larger than gRPC's 4 MiB default, idempotent Step, and that malformed
 * requests, wrong shapes, unknown contexts and unknown methods get precise
 * statuses while the server keeps serving. With PSD_DUMP_GRADIENTS it only
 * writes a context's gradients, fetched by the C client (dump_gradients). */
#include <grpc/grpc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pb_encode.h>

#include "check.h"
#include "clock.h"
#include "health.pb.h"
#include "metrics.h"
#include "model.h"
#include "ps_client.h"
#include "rpc_server.h"
#include "safetensors.h"
#include "service.h"
#include "support/model_run.h"
#include "wire.h"

#define MAXMSG (64 << 20)

static ps_client *cl;
static ps_rpc_client *raw;

/* Send raw bytes to method; returns the status code, details in det. */
static grpc_status_code send_raw(const char *method, const void *bytes, size_t len, char *det, size_t dlen) {
    grpc_slice s = grpc_slice_from_copied_buffer(bytes, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    grpc_byte_buffer *resp = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    ps_err err = {0};
    det[0] = 0;
    CHECK(ps_rpc_client_call(raw, method, bb, &resp, 10000, &code, det, dlen, &err) == PS_OK);
    grpc_byte_buffer_destroy(bb);
    if (resp) grpc_byte_buffer_destroy(resp);
    return code;
}

/* Writes exactly the bytes given, whatever shape the message declares. */
typedef struct raw_data { const float *data; size_t bytes; } raw_data;
static bool raw_data_encode(pb_ostream_t *stream, const pb_field_t *field, void *const *arg) {
    const raw_data *r = *arg;
    return pb_encode_tag_for_field(stream, field) &&
           pb_encode_string(stream, (const pb_byte_t *)r->data, r->bytes);
}

/* Encode a ForwardRequest whose declared shape may differ from its data. */
static grpc_status_code send_forward(uint64_t ctx, int train, const int64_t *dims, int ndim, const float *data,
                                     int64_t data_floats, char *det, size_t dlen) {
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    req.context_id = ctx;
    req.train = train;
    req.has_input = true;
    raw_data rd = {data, (size_t)data_floats * sizeof(float)};
    req.input.data.funcs.encode = raw_data_encode;
    req.input.data.arg = &rd;
    req.input.shape_count = (pb_size_t)ndim;
    for (int i = 0; i < ndim; i++) req.input.shape[i] = dims[i];
    grpc_byte_buffer *bb = NULL, *resp = NULL;
    ps_err err = {0};
    CHECK(ps_wire_encode(ps_ForwardRequest_fields, &req, &bb, &err) == PS_OK);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    det[0] = 0;
    CHECK(ps_rpc_client_call(raw, "/ps.ParameterServer/Forward", bb, &resp, 10000, &code, det, dlen, &err) == PS_OK);
    grpc_byte_buffer_destroy(bb);
    if (resp) grpc_byte_buffer_destroy(resp);
    return code;
}

/* grpc.health.v1.Health/Check for service; returns the gRPC code, the
 * serving status in *status. */
static grpc_status_code health_check(const char *service, int *status, char *det, size_t dlen) {
    unsigned char req[64];
    size_t len = strlen(service);
    req[0] = 0x0a; /* field 1, length-delimited */
    req[1] = (unsigned char)len;
    memcpy(req + 2, service, len);
    grpc_slice sl = grpc_slice_from_copied_buffer((const char *)req, len ? len + 2 : 0);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    grpc_byte_buffer *resp = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    ps_err err = {0};
    det[0] = 0;
    CHECK(ps_rpc_client_call(raw, "/grpc.health.v1.Health/Check", bb, &resp, 10000, &code, det, dlen, &err) ==
          PS_OK);
    grpc_byte_buffer_destroy(bb);
    grpc_health_v1_HealthCheckResponse r = grpc_health_v1_HealthCheckResponse_init_zero;
    *status = -1;
    if (code == GRPC_STATUS_OK && ps_wire_decode(resp, grpc_health_v1_HealthCheckResponse_fields, &r, &err) == PS_OK)
        *status = (int)r.status;
    if (resp) grpc_byte_buffer_destroy(resp);
    return code;
}

/* Step or Backward over the raw client, decoding skipped/model_version. */
static grpc_status_code step_raw(uint64_t ctx, uint64_t *version, int *skipped, char *det, size_t dlen) {
    ps_StepRequest req = ps_StepRequest_init_zero;
    req.context_id = ctx;
    grpc_byte_buffer *bb = NULL, *resp = NULL;
    ps_err err = {0};
    CHECK(ps_wire_encode(ps_StepRequest_fields, &req, &bb, &err) == PS_OK);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    CHECK(ps_rpc_client_call(raw, "/ps.ParameterServer/Step", bb, &resp, 10000, &code, det, dlen, &err) == PS_OK);
    grpc_byte_buffer_destroy(bb);
    ps_StepResponse r = ps_StepResponse_init_zero;
    if (code == GRPC_STATUS_OK) CHECK(ps_wire_decode(resp, ps_StepResponse_fields, &r, &err) == PS_OK);
    if (resp) grpc_byte_buffer_destroy(resp);
    *version = r.model_version;
    *skipped = r.skipped;
    return code;
}

static grpc_status_code backward_raw(uint64_t ctx, const float *grad, int n, int step, uint64_t *version,
                                     int *skipped, char *det, size_t dlen) {
    ps_BackwardRequest req = ps_BackwardRequest_init_zero;
    req.context_id = ctx;
    req.step = step;
    req.has_grad_output = true;
    int64_t dims[2] = {n, 10};
    ps_wire_tensor_encode_bind(&req.grad_output, NULL, 2, dims, grad);
    grpc_byte_buffer *bb = NULL, *resp = NULL;
    ps_err err = {0};
    CHECK(ps_wire_encode(ps_BackwardRequest_fields, &req, &bb, &err) == PS_OK);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    CHECK(ps_rpc_client_call(raw, "/ps.ParameterServer/Backward", bb, &resp, 10000, &code, det, dlen, &err) == PS_OK);
    grpc_byte_buffer_destroy(bb);
    ps_BackwardResponse r = ps_BackwardResponse_init_zero;
    if (code == GRPC_STATUS_OK) CHECK(ps_wire_decode(resp, ps_BackwardResponse_fields, &r, &err) == PS_OK);
    if (resp) grpc_byte_buffer_destroy(resp);
    *version = r.model_version;
    *skipped = r.skipped;
    return code;
}

static void fill_input(float *x, int n) {
    for (int i = 0; i < n * 784; i++) x[i] = (float)((i * 7919) % 255) / 255.0f - 0.4f;
}

/* server.nonfinite_policy: skip - calls succeed, steps are not applied, counted. */
static void test_skip_policy(ps_model *model, const float *x, const float *grad, int n) {
    ps_err err = {0};
    ps_service_opts so = {.context_ttl_s = 60, .max_contexts = 64, .max_message_bytes = MAXMSG,
                          .nonfinite_policy = PS_NONFINITE_SKIP};
    ps_service *svc = ps_service_create(model, &so, &err);
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    ps_rpc_server *srv = ps_rpc_server_create("127.0.0.1:0", 2, MAXMSG, methods, nm, svc, &err);
    CHECK(srv && ps_rpc_server_start(srv, &err) == PS_OK);
    char addr[64], det[PS_RPC_DETAILS_MAX];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_rpc_server_port(srv));
    ps_client *sc = ps_client_create(addr, 30000, MAXMSG, &err);
    ps_rpc_client *keep = raw;
    raw = ps_rpc_client_create(addr, MAXMSG, &err);
    ps_StatusResponse st;
    CHECK(ps_client_status(sc, &st, &err) == PS_OK);
    CHECK(!strcmp(st.nonfinite_policy, "skip"));
    uint64_t v0 = st.model_version, v;
    int skipped;
    float out[40], xn[4 * 784], g[40];
    int64_t cols;
    memcpy(xn, x, sizeof xn);
    xn[5] = -INFINITY;
    /* 1: a NaN/Inf input to a training Forward: accepted, its step skipped. */
    CHECK(ps_client_forward(sc, 0x51, 3, 1, xn, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
    CHECK(backward_raw(0x51, grad, n, 0, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK);
    CHECK(step_raw(0x51, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK && skipped && v == v0);
    /* A repeated Step of it is answered, not applied. */
    CHECK_MSG(step_raw(0x51, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK && v == v0 && skipped,
              "a retried Step of a skipped step says skipped=%d", skipped);
    /* 2: NaN in grad_output with the fused step. */
    memcpy(g, grad, sizeof g);
    g[0] = NAN;
    CHECK(ps_client_forward(sc, 0x52, 3, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
    CHECK(backward_raw(0x52, g, n, 1, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK && skipped && v == v0);
    /* 3: finite grad_output whose parameter gradients overflow. */
    for (int i = 0; i < 40; i++) g[i] = 3e38f;
    CHECK(ps_client_forward(sc, 0x53, 3, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
    CHECK(backward_raw(0x53, g, n, 0, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK);
    CHECK(step_raw(0x53, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK && skipped && v == v0);
    /* An inference Forward with NaN is still refused: there is no step to skip. */
    CHECK(ps_client_forward(sc, 0, 3, 0, xn, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    /* A clean batch still trains. */
    CHECK(ps_client_forward(sc, 0x54, 3, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
    CHECK(backward_raw(0x54, grad, n, 1, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK && !skipped &&
          v == v0 + 1);
    CHECK(ps_client_status(sc, &st, &err) == PS_OK);
    CHECK_MSG(st.nonfinite_skipped == 3 && st.nonfinite_rejected == 1, "skipped %llu rejected %llu",
              (unsigned long long)st.nonfinite_skipped, (unsigned long long)st.nonfinite_rejected);
    CHECK(st.model_version == v0 + 1 && st.live_contexts == 0);
    ps_client_free(sc);
    ps_rpc_client_free(raw);
    raw = keep;
    ps_rpc_server_free(srv);
    ps_service_free(svc);
}

/* GetParameters larger than one message: a psd and a client limited to
 * 1 MiB page fc1.weight (4.7 MB) between rows; the client reassembles every
 * parameter bit for bit. */
static void test_paged_parameters(ps_model *model) {
    const int lim = 1 << 20;
    ps_err err = {0};
    ps_service_opts so = {.context_ttl_s = 60, .max_contexts = 64, .max_message_bytes = lim};
    ps_service *svc = ps_service_create(model, &so, &err);
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    ps_rpc_server *srv = ps_rpc_server_create("127.0.0.1:0", 2, lim, methods, nm, svc, &err);
    CHECK(srv && ps_rpc_server_start(srv, &err) == PS_OK);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_rpc_server_port(srv));
    ps_client *sc = ps_client_create(addr, 30000, lim, &err);
    ps_wire_tensor_list gp;
    uint64_t v = 99;
    CHECK_MSG(ps_client_get_parameters(sc, &gp, &v, &err) == PS_OK, "%s", err.msg);
    CHECK(v == ps_model_version(model));
    CHECK(gp.n == (size_t)ps_model_num_params(model));
    for (size_t i = 0; i < gp.n && i < (size_t)ps_model_num_params(model); i++) {
        const ps_param_info *p = ps_model_param(model, (int)i);
        float *want = malloc((size_t)p->numel * sizeof(float));
        CHECK(ps_model_get_param(model, (int)i, want, &err) == PS_OK);
        CHECK_MSG(!strcmp(gp.items[i].name, p->name) && gp.items[i].dims[0] == p->dims[0] &&
                  gp.items[i].bytes == (size_t)p->numel * sizeof(float) &&
                  !memcmp(gp.items[i].data, want, gp.items[i].bytes), "paged %s differs", p->name);
        free(want);
    }
    ps_wire_tensor_list_free(&gp);
    ps_client_free(sc);
    ps_rpc_server_free(srv);
    ps_service_free(svc);
}

/* psd's dropout seed of a training forward (docs/protocol.md, "Dropout
 * masks"), written out from the documented rule for the reference run. */
static uint64_t doc_dropout_seed(uint64_t ctx, uint32_t rank, uint32_t seq) {
    uint64_t z = (ctx & 0xffffffffULL) * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL +
                 (uint64_t)seq * 0xbf58476d1ce4e5b9ULL + ((uint64_t)rank << 32) * 0xd6e8feb86659fd93ULL;
    z ^= z >> 31;
    return z * 0x94d049bb133111ebULL;
}

static grpc_status_code call_msg(ps_rpc_client *rc, const char *method, const pb_msgdesc_t *qf, const void *req,
                                 const pb_msgdesc_t *rf, void *resp, char *det, size_t dlen);

/* GetGradients' pages (context ctx of model m's mnist_cnn, one training
 * forward of x by rank 7, seq 0, then a Backward of grad, not stepped):
 * assembled by the client at several page sizes, each equals the plain
 * reference backend's gradients of the same forward (same initial weights,
 * the dropout masks psd documents) computed in-process; one raw page's
 * cut is the arithmetic of max_bytes; a bad first / first_row / max_bytes
 * is refused naming the field. */
static void check_gradient_pages(ps_model *ref, uint64_t ctx, const float *x, int n, const float *grad) {
    ps_err err = {0};
    char det[PS_RPC_DETAILS_MAX];
    ps_tape *tape = NULL;
    float out[40];
    ps_grads *rg = NULL;
    CHECK_MSG(run_forward(ref, x, n, 1, NULL, doc_dropout_seed(ctx, 7, 0), out, &tape, NULL, &err) == PS_OK, "%s",
              err.msg);
    if (tape) rg = run_backward(ref, tape, grad, &err);
    CHECK_MSG(rg, "reference backward: %s", err.msg);
    /* 0: psd's limit (one page here); 40000: one row of fc1.weight (36864 bytes) a page, ~140 pages; 3 rows +
     * 100 bytes: fc1.weight cut after 3 rows, several small tensors a page */
    static const uint64_t sizes[] = {0, 40000, 3 * 36864 + 100};
    for (size_t si = 0; rg && si < sizeof sizes / sizeof sizes[0]; si++) {
        ps_wire_tensor_list gl;
        CHECK_MSG(ps_client_get_gradients_paged(cl, ctx, sizes[si], &gl, &err) == PS_OK, "max_bytes %llu: %s",
                  (unsigned long long)sizes[si], err.msg);
        CHECK_MSG(gl.n == (size_t)ps_model_num_params(ref), "max_bytes %llu: %zu tensors",
                  (unsigned long long)sizes[si], gl.n);
        for (size_t t = 0; t < gl.n && t < (size_t)ps_model_num_params(ref); t++) {
            const ps_param_info *pi = ps_model_param(ref, (int)t);
            int shape = !strcmp(gl.items[t].name, pi->name) && gl.items[t].ndim == pi->ndim &&
                        gl.items[t].bytes == (size_t)pi->numel * sizeof(float);
            for (int d = 0; shape && d < pi->ndim; d++) shape = gl.items[t].dims[d] == pi->dims[d];
            CHECK_MSG(shape, "max_bytes %llu: tensor %zu is %s of %zu bytes, expected %s",
                      (unsigned long long)sizes[si], t, gl.items[t].name, gl.items[t].bytes, pi->name);
            if (!shape) continue;
            float *want = malloc(sizeof(float) * (size_t)pi->numel);
            CHECK(want && ps_grads_get(ref, rg, (int)t, want, &err) == PS_OK);
            double md = 0, mx = 0;
            for (int64_t j = 0; want && j < pi->numel; j++) {
                md = fmax(md, fabs(gl.items[t].data[j] - want[j]));
                mx = fmax(mx, fabs(want[j]));
            }
            CHECK_MSG(mx > 0 && md <= 1e-4 * mx + 1e-7, "max_bytes %llu: gradient of %s off the reference by %g "
                      "(largest %g)", (unsigned long long)sizes[si], pi->name, md, mx);
            free(want);
        }
        ps_wire_tensor_list_free(&gl);
    }
    ps_grads_free(rg);
    ps_tape_free(tape);

    /* one raw page: conv1.weight (1152 bytes) and conv1.bias (128) whole, then 16 rows of conv2.weight (1152
     * bytes a row): (20000 - 1280) / 1152 = 16.25 */
    ps_GetGradientsRequest q = ps_GetGradientsRequest_init_zero;
    ps_GetGradientsResponse r = ps_GetGradientsResponse_init_zero;
    q.context_id = ctx;
    q.max_bytes = 20000;
    const char *m = "/ps.ParameterServer/GetGradients";
    CHECK_MSG(call_msg(raw, m, ps_GetGradientsRequest_fields, &q, ps_GetGradientsResponse_fields, &r, det,
                       sizeof det) == GRPC_STATUS_OK, "%s", det);
    CHECK_MSG(r.more && r.next == 2 && r.next_row == 16 && r.first_rows_count == 3 && r.first_rows[2] == 0,
              "page of 20000 bytes: more %d next %u row %lld, %u tensors", r.more, (unsigned)r.next,
              (long long)r.next_row, (unsigned)r.first_rows_count);
    /* the next one goes on from there: 17 rows of conv2.weight (17 * 1152 = 19584), 16..33 */
    q.first = 2, q.first_row = 16;
    r = (ps_GetGradientsResponse)ps_GetGradientsResponse_init_zero;
    CHECK(call_msg(raw, m, ps_GetGradientsRequest_fields, &q, ps_GetGradientsResponse_fields, &r, det,
                   sizeof det) == GRPC_STATUS_OK);
    CHECK(r.more && r.next == 2 && r.next_row == 33 && r.first_rows_count == 1 && r.first_rows[0] == 16);
    /* refused, naming the field: past the 8 parameters, a row outside fc1.weight's 128, a negative row, less
     * than one row of fc1.weight */
    struct { uint32_t first; int64_t row; uint64_t max; const char *field, *also; } bad[] = {
        {9, 0, 0, "GetGradientsRequest.first 9", "8 tensors"},
        {4, 128, 0, "GetGradientsRequest.first_row 128", "fc1.weight"},
        {4, -1, 0, "GetGradientsRequest.first_row -1", "fc1.weight"},
        {8, 1, 0, "GetGradientsRequest.first_row 1", "end of the selection"},
        {4, 0, 36863, "GetGradientsRequest.max_bytes 36863", "one row of fc1.weight (36864 bytes)"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        q.first = bad[b].first, q.first_row = bad[b].row, q.max_bytes = bad[b].max;
        grpc_status_code code = call_msg(raw, m, ps_GetGradientsRequest_fields, &q, ps_GetGradientsResponse_fields,
                                         &r, det, sizeof det);
        CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && strstr(det, bad[b].field) && strstr(det, bad[b].also),
                  "%s: %d %s", bad[b].field, (int)code, det);
    }
    /* exactly one row is enough */
    q.first = 4, q.first_row = 127, q.max_bytes = 36864;
    r = (ps_GetGradientsResponse)ps_GetGradientsResponse_init_zero;
    CHECK(call_msg(raw, m, ps_GetGradientsRequest_fields, &q, ps_GetGradientsResponse_fields, &r, det,
                   sizeof det) == GRPC_STATUS_OK && r.more && r.next == 5 && r.next_row == 0);
}

/* Call method with req, decode into resp; the gRPC code, details in det. */
static grpc_status_code call_msg(ps_rpc_client *rc, const char *method, const pb_msgdesc_t *qf, const void *req,
                                 const pb_msgdesc_t *rf, void *resp, char *det, size_t dlen) {
    grpc_byte_buffer *bb = NULL, *out = NULL;
    ps_err err = {0};
    CHECK(ps_wire_encode(qf, req, &bb, &err) == PS_OK);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    det[0] = 0;
    CHECK(ps_rpc_client_call(rc, method, bb, &out, 10000, &code, det, dlen, &err) == PS_OK);
    grpc_byte_buffer_destroy(bb);
    if (out && code == GRPC_STATUS_OK) CHECK_MSG(ps_wire_decode(out, rf, resp, &err) == PS_OK, "%s", err.msg);
    if (out) grpc_byte_buffer_destroy(out);
    return code;
}

static grpc_status_code report_partial(ps_rpc_client *rc, uint64_t ctx, const char *applied, const char *lost,
                                       uint64_t *count, char *det, size_t dlen) {
    ps_ReportPartialRequest q = ps_ReportPartialRequest_init_zero;
    ps_ReportPartialResponse r = ps_ReportPartialResponse_init_zero;
    q.context_id = ctx;
    q.trainer_rank = 1;
    const char *lists[2] = {applied, lost};
    for (int k = 0; k < 2; k++) {   /* comma-separated names */
        char (*names)[32] = k ? q.lost_on : q.applied_on;
        pb_size_t *n = k ? &q.lost_on_count : &q.applied_on_count;
        for (const char *p = lists[k]; p && *p && *n < 8;) {
            size_t len = strcspn(p, ",");
            snprintf(names[(*n)++], 32, "%.*s", (int)len, p);
            p += len + (p[len] == ',');
        }
    }
    grpc_status_code code = call_msg(rc, "/ps.ParameterServer/ReportPartial", ps_ReportPartialRequest_fields, &q,
                                     ps_ReportPartialResponse_fields, &r, det, dlen);
    if (count) *count = r.partial_steps;
    return code;
}

/* One psd of a cluster: the shard ps1 of rnn_lm's emb table (rows [10, 21))
 * and the decoder: ListParameters and Status say which rows and which
 * cluster, a Forward of another shard's id is refused naming it and the
 * range (the server keeps serving), ReportPartial counts, validates and
 * shows in Status and /metrics. */
static void test_cluster_service(void) {
    printf("cluster: shard ps1 of lm-demo\n");
    ps_err err = {0};
    ps_model_opts mo = {.arch = "rnn_lm", .cpu_backend = "ref", .seed = 4, .compute_threads = 1, .lr = 0.1f,
                        .n_sizes = 3, .size_key = {"ntoken", "ninp", "nhid"}, .size_value = {21, 6, 5},
                        .n_hosted = 2, .hosted = {"emb", "decoder"}, .shard_stage = "emb", .shard_lo = 10,
                        .shard_hi = 21};
    ps_model *model = ps_model_create(&mo, &err);
    CHECK_MSG(model, "%s", err.msg);
    if (!model) return;
    ps_service_opts so = {.context_ttl_s = 60, .max_contexts = 64, .max_message_bytes = MAXMSG,
                          .cluster = "lm-demo", .server_name = "ps1"};
    ps_service *svc = ps_service_create(model, &so, &err);
    int nm;
    const ps_rpc_method *methods = ps_service_methods(&nm);
    ps_metrics *met = svc ? ps_metrics_create(svc, model, methods, nm, &err) : NULL;
    CHECK_MSG(met, "%s", err.msg);
    if (!met) { ps_service_free(svc); ps_model_free(model); return; }
    const ps_rpc_method *mm = ps_metrics_methods(met, &nm);
    ps_rpc_server *srv = ps_rpc_server_create("127.0.0.1:0", 2, MAXMSG, mm, nm, met, &err);
    CHECK_MSG(srv && ps_rpc_server_start(srv, &err) == PS_OK, "%s", err.msg);
    char addr[64], det[PS_RPC_DETAILS_MAX];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", srv ? ps_rpc_server_port(srv) : 0);
    ps_rpc_client *rc = ps_rpc_client_create(addr, MAXMSG, &err);
    ps_client *c = ps_client_create(addr, 30000, MAXMSG, &err);

    ps_ListParametersRequest lq = ps_ListParametersRequest_init_zero;
    ps_ListParametersResponse lr = ps_ListParametersResponse_init_zero;
    ps_wire_param_list pl;
    ps_wire_param_list_init(&pl, 64);
    ps_wire_params_decode_bind(&lr.parameters, &pl);
    CHECK(call_msg(rc, "/ps.ParameterServer/ListParameters", ps_ListParametersRequest_fields, &lq,
                   ps_ListParametersResponse_fields, &lr, det, sizeof det) == GRPC_STATUS_OK);
    CHECK(!strcmp(lr.cluster, "lm-demo") && !strcmp(lr.server_name, "ps1"));
    CHECK(lr.stages_count == 2 && !strcmp(lr.stages[0].name, "emb") && !strcmp(lr.stages[1].name, "decoder"));
    CHECK(lr.stages[0].row_lo == 10 && lr.stages[0].row_hi == 21 && lr.stages[1].row_hi == 0);
    CHECK(pl.n == 3);
    if (pl.n == 3) {
        CHECK(!strcmp(pl.items[0].name, "encoder.weight") && pl.items[0].shape[0] == 11);
        CHECK(pl.items[0].row_offset == 10 && pl.items[0].rows_total == 21);
        CHECK(pl.items[1].rows_total == 0 && !strcmp(pl.items[1].name, "decoder.weight"));
    }
    ps_wire_param_list_free(&pl);

    /* Ids travel global: 12 and 20 are here, 3 is not. */
    ps_ForwardRequest fq = ps_ForwardRequest_init_zero;
    ps_ForwardResponse fr = ps_ForwardResponse_init_zero;
    int64_t ids[3] = {12, 20, 3};
    raw_data rd = {(const float *)ids, sizeof ids};
    fq.has_input = true;
    fq.input.dtype = ps_DType_INT64;
    fq.input.data.funcs.encode = raw_data_encode;
    fq.input.data.arg = &rd;
    fq.input.shape_count = 1;
    fq.input.shape[0] = 3;
    snprintf(fq.stage, sizeof fq.stage, "emb");
    snprintf(fq.last_stage, sizeof fq.last_stage, "emb");
    CHECK(call_msg(rc, "/ps.ParameterServer/Forward", ps_ForwardRequest_fields, &fq, ps_ForwardResponse_fields, &fr,
                   det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    CHECK_MSG(strstr(det, "input[2] = 3") && strstr(det, "[10, 21)"), "%s", det);
    fq.input.shape[0] = 2;
    rd.bytes = 2 * sizeof(int64_t);
    CHECK_MSG(call_msg(rc, "/ps.ParameterServer/Forward", ps_ForwardRequest_fields, &fq, ps_ForwardResponse_fields,
                       &fr, det, sizeof det) == GRPC_STATUS_OK, "%s", det);

    /* ReportPartial: counted on this server's side; bad reports refused.
     * Context 7 is applied here (a real step), 8 is unknown here. */
    int64_t ids7[2] = {12, 20};
    float g7[2 * 6];
    for (int i = 0; i < 12; i++) g7[i] = 0.01f * (float)(i + 1);
    ps_client_fwd f7 = {.ctx = 7, .train = 1, .rank = 1, .stage = "emb", .input = {PS_CLIENT_I64, 1, {2}, ids7}};
    float o7[2 * 6];
    ps_client_fwd_out fo7 = {.out = o7, .out_cap = 12};
    CHECK_MSG(ps_client_forward_ex(c, &f7, &fo7, &err) == PS_OK, "%s", err.msg);
    uint32_t s7 = 0;
    ps_client_tensor gt7 = {PS_CLIENT_F32, 2, {2, 6}, g7};
    ps_client_bwd b7 = {.ctx = 7, .n = 1, .seqs = &s7, .grads = &gt7, .step = 1};
    CHECK_MSG(ps_client_backward_ex(c, &b7, NULL, &err) == PS_OK, "%s", err.msg);
    uint64_t cnt = 0;
    CHECK(report_partial(rc, 7, "ps1,ps2", "ps0", &cnt, det, sizeof det) == GRPC_STATUS_OK && cnt == 1);
    CHECK(report_partial(rc, 8, "ps0", "ps1", &cnt, det, sizeof det) == GRPC_STATUS_OK && cnt == 1);
    CHECK(report_partial(rc, 9, "ps0", "ps2", &cnt, det, sizeof det) == GRPC_STATUS_OK && cnt == 1);
    /* a repeat (a retried report) counts once; a report contradicting this
     * server's records is refused, not counted */
    CHECK(report_partial(rc, 7, "ps1,ps2", "ps0", &cnt, det, sizeof det) == GRPC_STATUS_OK && cnt == 1);
    CHECK(report_partial(rc, 11, "ps1", "ps0", NULL, det, sizeof det) == GRPC_STATUS_FAILED_PRECONDITION);
    CHECK_MSG(strstr(det, "reported applied here") && strstr(det, "no record of applying"), "%s", det);
    CHECK(report_partial(rc, 7, "ps0", "ps1", NULL, det, sizeof det) == GRPC_STATUS_FAILED_PRECONDITION);
    CHECK(report_partial(rc, 0, "ps1", "ps0", NULL, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    CHECK_MSG(strstr(det, "context_id"), "%s", det);
    CHECK(report_partial(rc, 10, "ps1", "", NULL, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    CHECK(report_partial(rc, 10, "ps1", "ps 0", NULL, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    CHECK_MSG(strstr(det, "lost_on[0]") && strstr(det, "'ps 0'"), "%s", det);
    CHECK(report_partial(rc, 10, "ps1", "ps1", NULL, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    ps_StatusResponse st;
    CHECK(ps_client_status(c, &st, &err) == PS_OK);
    CHECK(st.partial_steps == 1 && st.partial_steps_lost == 1);
    CHECK(!strcmp(st.cluster, "lm-demo") && !strcmp(st.server_name, "ps1"));
    CHECK_MSG(!strcmp(st.hosted, "emb rows [10, 21) on cpu, decoder on cpu"), "%s", st.hosted);
    char *text = ps_metrics_render(met, NULL);
    CHECK(text && strstr(text, "psd_partial_steps_total{side=\"applied\"} 1\n") &&
          strstr(text, "psd_partial_steps_total{side=\"lost\"} 1\n"));
    free(text);
    /* spam: 200 'lost here' reports of distinct contexts at once - the
     * client's rate (a burst of 20) bounds what is counted; the rest are
     * refused RESOURCE_EXHAUSTED, counting nothing */
    int took = 0, refused = 0;
    double t0 = ps_mono_s();
    for (uint64_t k = 0; k < 200; k++) {
        grpc_status_code rcode = report_partial(rc, 1000 + k, "ps0", "ps1", NULL, det, sizeof det);
        took += rcode == GRPC_STATUS_OK;
        refused += rcode == GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    double spent = ps_mono_s() - t0;  /* the bucket refills 5 a second meanwhile (a loaded machine is slow) */
    CHECK(ps_client_status(c, &st, &err) == PS_OK);
    CHECK_MSG(took + refused == 200 && took >= 10 && took <= 20 + (int)(5 * spent) + 1 &&
              st.partial_steps_lost == 1 + (uint64_t)took, "%d counted in %.1f s, %d refused, lost %llu", took, spent,
              refused, (unsigned long long)st.partial_steps_lost);

    ps_client_free(c);
    ps_rpc_client_free(rc);
    ps_rpc_server_free(srv);
    ps_metrics_free(met);
    ps_service_free(svc);
    ps_model_free(model);
}

/* PSD_DUMP_GRADIENTS=CONTEXT:PATH with PSD_ADDR: only fetch that context's
 * gradients with the C client (every page, assembled) and write them to
 * PATH as safetensors, for tests/python/mnist_exact.py to hold against
 * PyTorch; exit 0 when written. */
static int dump_gradients(const char *addr, const char *spec) {
    ps_err err = {0};
    char *end = NULL;
    unsigned long long ctx = strtoull(spec, &end, 0);
    if (!end || *end != ':' || !end[1]) {
        fprintf(stderr, "test_service: PSD_DUMP_GRADIENTS is CONTEXT:PATH, not '%s'\n", spec);
        return 2;
    }
    ps_client *c = ps_client_create(addr, 30000, MAXMSG, &err);
    ps_wire_tensor_list gl = {0};
    ps_st_tensor *st = NULL;
    int rc = !c || ps_client_get_gradients(c, ctx, &gl, &err);
    if (!rc && !(st = calloc(gl.n + 1, sizeof *st))) rc = ps_err_set(&err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; !rc && i < gl.n; i++) {
        snprintf(st[i].name, sizeof st[i].name, "%s", gl.items[i].name);
        st[i].dtype = PS_ST_F32;
        st[i].ndim = gl.items[i].ndim;
        memcpy(st[i].dims, gl.items[i].dims, sizeof(int64_t) * (size_t)gl.items[i].ndim);
        st[i].data = gl.items[i].data;
        st[i].bytes = gl.items[i].bytes;
    }
    if (!rc) rc = ps_st_write(end + 1, st, gl.n, NULL, &err);
    if (rc) fprintf(stderr, "test_service: gradients of context %llx: %s\n", ctx, err.msg);
    free(st);
    ps_wire_tensor_list_free(&gl);
    ps_client_free(c);
    return rc ? 1 : 0;
}

int main(void) {
    const char *ext = getenv("PSD_ADDR");
    grpc_init();
    if (ext && getenv("PSD_DUMP_GRADIENTS")) return dump_gradients(ext, getenv("PSD_DUMP_GRADIENTS"));
    ps_err err = {0};
    ps_model *model = NULL, *ref = NULL;
    ps_service *svc = NULL;
    ps_rpc_server *srv = NULL;
    char addr[64];
    if (ext) {
        snprintf(addr, sizeof addr, "%s", ext);
    } else {
        ps_model_opts mo = {.arch = "mnist_cnn", .cpu_backend = "dnnl", .seed = 1, .compute_threads = 2,
                            .lr = 0.03f};
        model = ps_model_create(&mo, &err);
        CHECK_MSG(model, "%s", err.msg);
        mo.cpu_backend = "ref";
        ref = ps_model_create(&mo, &err);  /* same seed: same initial weights */
        CHECK_MSG(ref, "%s", err.msg);
        ps_service_opts so = {.context_ttl_s = 60, .max_contexts = 64, .max_message_bytes = MAXMSG};
        svc = ps_service_create(model, &so, &err);
        int nm;
        const ps_rpc_method *methods = ps_service_methods(&nm);
        srv = ps_rpc_server_create("127.0.0.1:0", 2, MAXMSG, methods, nm, svc, &err);
        CHECK_MSG(srv, "%s", err.msg);
        if (!srv || ps_rpc_server_start(srv, &err)) return check_summary("test_service");
        snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_rpc_server_port(srv));
    }
    cl = ps_client_create(addr, 30000, MAXMSG, &err);
    raw = ps_rpc_client_create(addr, MAXMSG, &err);
    CHECK(cl && raw);
    char det[PS_RPC_DETAILS_MAX];

    /* Parameters as in PyTorch's state_dict. */
    ps_wire_param_list pl;
    char mname[64];
    CHECK(ps_client_list_parameters(cl, &pl, mname, sizeof mname, &err) == PS_OK);
    static const char *names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                  "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    static const int64_t numel[] = {288, 32, 18432, 64, 1179648, 128, 1280, 10};
    CHECK(pl.n == 8);
    CHECK(!strcmp(mname, "mnist_cnn"));
    for (size_t i = 0; i < pl.n && i < 8; i++) {
        int64_t c = 1;
        for (pb_size_t d = 0; d < pl.items[i].shape_count; d++) c *= pl.items[i].shape[d];
        CHECK_MSG(!strcmp(pl.items[i].name, names[i]) && c == numel[i], "param %zu: %s", i, pl.items[i].name);
        CHECK(!strcmp(pl.items[i].stage, i < 4 ? "conv" : "fc"));
        CHECK(!strcmp(pl.items[i].device, "cpu"));
    }
    ps_wire_param_list_free(&pl);

    const int n = 4;
    float x[4 * 784], out[40], ref_out[40];
    fill_input(x, n);
    int64_t cols;

    /* Eval forward over the wire equals the reference backend in-process. */
    if (ref) {
        CHECK(ps_client_forward(cl, 0, 1, 0, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
        CHECK(cols == 10);
        CHECK(run_forward(ref, x, n, 0, NULL, 0, ref_out, NULL, NULL, &err) == PS_OK);
        double md = 0;
        for (int i = 0; i < 40; i++) md = fmax(md, fabs(out[i] - ref_out[i]));
        CHECK_MSG(md < 1e-4, "wire forward vs reference: %g", md);

        /* A batch psd evaluates in several slices (2 full + a partial one)
         * matches the reference's single pass row for row. */
        enum { NB = 130 };
        float *bx = malloc(sizeof(float) * NB * 784), *bo = malloc(sizeof(float) * NB * 10),
              *br = malloc(sizeof(float) * NB * 10);
        for (int i = 0; i < NB * 784; i++) bx[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        CHECK(ps_client_forward(cl, 0, 1, 0, bx, NB, 1, 28, 28, bo, NB * 10, &cols, NULL, &err) == PS_OK);
        CHECK(run_forward(ref, bx, NB, 0, NULL, 0, br, NULL, NULL, &err) == PS_OK);
        md = 0;
        for (int i = 0; i < NB * 10; i++) md = fmax(md, fabs(bo[i] - br[i]));
        CHECK_MSG(md < 1e-4, "sliced eval forward vs reference: %g", md);
        free(bx);
        free(bo);
        free(br);
    }

    /* A full cycle. */
    uint64_t ctx = 0x5eed000000000001ULL + (uint64_t)(ext ? 1000 : 0), v0 = 0, v1 = 0, v2 = 0;
    ps_StatusResponse st;
    CHECK(ps_client_status(cl, &st, &err) == PS_OK);
    v0 = st.model_version;
    CHECK(ps_client_forward(cl, ctx, 7, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
    float grad[40] = {0};
    int y[4] = {3, 1, 4, 1};
    for (int i = 0; i < n; i++) grad[i * 10 + y[i]] = -1.0f / n;
    /* Step before Backward: nothing to apply. */
    CHECK(ps_client_step(cl, ctx, NULL, &err) == PS_ERR_FAILED_PRECONDITION);
    CHECK(strstr(err.msg, "Backward first") != NULL);
    /* Wrong gradient shape: refused, context still usable. */
    CHECK(ps_client_backward(cl, ctx, grad, n, 9, 0, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(err.msg, "grad_output") && strstr(err.msg, "(4, 9)"));
    CHECK(ps_client_backward(cl, ctx, grad, n, 10, 0, NULL, &err) == PS_OK);
    ps_wire_tensor_list gl;
    CHECK(ps_client_get_gradients(cl, ctx, &gl, &err) == PS_OK);
    CHECK(gl.n == 8);
    if (gl.n == 8) {
        CHECK(!strcmp(gl.items[4].name, "fc1.weight") && gl.items[4].bytes == 1179648 * 4);  /* > 4 MiB */
        /* fc2.bias gradient = sum_i (softmax_i - onehot_i) / n, from the outputs alone. */
        double md = 0;
        for (int c = 0; c < 10; c++) {
            double want = 0;
            for (int i = 0; i < n; i++) want += (exp(out[i * 10 + c]) - (y[i] == c)) / n;
            md = fmax(md, fabs(want - gl.items[7].data[c]));
        }
        CHECK_MSG(md < 1e-5, "fc2.bias gradient off by %g", md);
        int finite = 1;
        for (size_t t = 0; t < gl.n; t++)
            for (size_t j = 0; j < gl.items[t].bytes / 4; j++) finite &= isfinite(gl.items[t].data[j]);
        CHECK(finite);
    }
    ps_wire_tensor_list_free(&gl);
    if (ref && v0 == 0) check_gradient_pages(ref, ctx, x, n, grad);
    /* a page asked for after the context was stepped: NOT_FOUND naming the page */
    ps_GetGradientsRequest gq = {.context_id = ctx, .first = 4, .first_row = 3};
    ps_GetGradientsResponse gr = ps_GetGradientsResponse_init_zero;
    CHECK(ps_client_step(cl, ctx, &v1, &err) == PS_OK);
    CHECK(v1 > v0);
    CHECK(call_msg(raw, "/ps.ParameterServer/GetGradients", ps_GetGradientsRequest_fields, &gq,
                   ps_GetGradientsResponse_fields, &gr, det, sizeof det) == GRPC_STATUS_NOT_FOUND);
    CHECK_MSG(strstr(det, "GetGradients page from parameter 4 row 3") && strstr(det, "already stepped"), "%s", det);
    /* A retried Step is answered, not applied twice. */
    CHECK(ps_client_step(cl, ctx, &v2, &err) == PS_OK);
    CHECK(v2 == v1);
    if (!ext) {
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        CHECK(st.model_version == v1);
        CHECK(st.live_contexts == 0);
    }
    /* The context is gone after Step. */
    CHECK(ps_client_backward(cl, ctx, grad, n, 10, 0, NULL, &err) == PS_ERR_NOT_FOUND);
    /* Reusing a finished context id is refused. */
    CHECK(ps_client_forward(cl, ctx, 7, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_ERR_ALREADY_EXISTS);
    /* Fused Backward+Step. */
    CHECK(ps_client_forward(cl, ctx + 1, 7, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
    CHECK(ps_client_backward(cl, ctx + 1, grad, n, 10, 1, &v2, &err) == PS_OK);
    CHECK(v2 > v1);
    CHECK(ps_client_step(cl, ctx + 1, &v1, &err) == PS_OK && v1 == v2);

    /* ReleaseContext: a context abandoned unstepped is freed at once (its
     * Step then finds nothing); a stepped one keeps its record. */
    {
        uint64_t rc = ctx + 3, rv = 0;
        int released = -1;
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        uint64_t live0 = st.live_contexts, rel0 = st.contexts_released;
        CHECK(ps_client_forward(cl, rc, 7, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
        CHECK(ps_client_backward(cl, rc, grad, n, 10, 0, NULL, &err) == PS_OK);
        CHECK_MSG(ps_client_release_context(cl, rc, 7, &released, &err) == PS_OK && released == 1, "%s", err.msg);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        CHECK_MSG(st.contexts_released == rel0 + 1 && (ext || st.live_contexts == live0), "released %llu, live %llu",
                  (unsigned long long)st.contexts_released, (unsigned long long)st.live_contexts);
        CHECK(ps_client_step(cl, rc, &rv, &err) == PS_ERR_NOT_FOUND);  /* never applied */
        CHECK(ps_client_release_context(cl, rc, 7, &released, &err) == PS_OK && released == 0);
        CHECK(ps_client_release_context(cl, ctx + 1, 7, &released, &err) == PS_OK && released == 0);
        CHECK(ps_client_step(cl, ctx + 1, &rv, &err) == PS_OK && rv == v2);  /* its record answers */
        CHECK(ps_client_release_context(cl, 0, 7, &released, &err) == PS_ERR_INVALID_ARGUMENT);
    }

    /* Round metrics (hogwild: a round per Step by default): the Step's
     * scalars come back as its round's stats; bad scalars are refused
     * naming the scalar, before anything is applied. */
    if (!ext) {
        uint64_t c3 = ctx + 2, vb = 0;
        CHECK(ps_client_forward(cl, c3, 7, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
        CHECK(ps_client_backward(cl, c3, grad, n, 10, 0, NULL, &err) == PS_OK);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        vb = st.model_version;
        ps_client_scalar bad[2] = {{"reward", 3}, {"reward", 4}};
        CHECK(ps_client_step_scalars(cl, c3, 0, bad, 2, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(err.msg, "StepRequest") && strstr(err.msg, "twice"), "%s", err.msg);
        ps_client_scalar nan_sc[1] = {{"loss", NAN}};
        CHECK(ps_client_step_scalars(cl, c3, 0, nan_sc, 1, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(err.msg, "'loss'") && strstr(err.msg, "not finite"), "%s", err.msg);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK && st.model_version == vb);  /* nothing applied */
        ps_client_scalar good[2] = {{"reward", 17}, {"tokens", 4}};
        ps_client_step_out so;
        ps_client_round rep;
        CHECK(ps_client_step_scalars(cl, c3, 0, good, 2, &so, &rep, &err) == PS_OK);
        CHECK(so.version == vb + 1);
        const ps_client_round_scalar *rw = ps_client_round_find(&rep, "reward");
        CHECK(rep.n == 2 && rw && rw->count == 1 && rw->min == 17 && rw->mean == 17 && rw->max == 17 &&
              rw->ema == 17 && !rep.solved);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        CHECK(st.metrics_round == rep.metrics_round && st.round_scalars_count == 2 &&
              !strcmp(st.round_scalars[0].name, "reward") && st.round_scalars[0].max == 17);
        /* ... and with Backward(step) */
        uint64_t c4 = ctx + 3;
        CHECK(ps_client_forward(cl, c4, 7, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
        uint32_t seq0 = 0;
        ps_client_tensor gt = {.dtype = PS_CLIENT_F32, .ndim = 2, .dims = {n, 10}, .data = grad};
        ps_client_scalar bsc[1] = {{"bad name!", 1}};
        ps_client_bwd b = {.ctx = c4, .n = 1, .seqs = &seq0, .grads = &gt, .step = 1, .scalars = bsc, .nscalars = 1};
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(err.msg, "BackwardRequest") && strstr(err.msg, "scalars[0].name"), "%s", err.msg);
        bsc[0].name = "reward";
        bsc[0].value = 5;
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_OK && so.version == vb + 2);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        CHECK(st.metrics_round == rep.metrics_round + 1 && st.round_scalars_count == 1 &&
              st.round_scalars[0].max == 5 && st.round_scalars[0].ema == 5 * 0.05 + 17 * 0.95);
    }

    /* Unknown contexts. */
    CHECK(ps_client_backward(cl, 0xdeadbeefULL, grad, n, 10, 0, NULL, &err) == PS_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "unknown context") != NULL);
    CHECK(ps_client_step(cl, 0xdeadbeefULL, NULL, &err) == PS_ERR_NOT_FOUND);
    ps_wire_tensor_list gl2;
    CHECK(ps_client_get_gradients(cl, 0xdeadbeefULL, &gl2, &err) == PS_ERR_NOT_FOUND);
    ps_wire_tensor_list_free(&gl2);

    /* Malformed protobuf. */
    static const unsigned char garbage[] = {0x12, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02};
    CHECK(send_raw("/ps.ParameterServer/Forward", garbage, sizeof garbage, det, sizeof det) ==
          GRPC_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(det, "malformed") != NULL);
    CHECK(send_raw("/ps.ParameterServer/Backward", garbage, 3, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    /* Unknown method. */
    CHECK(send_raw("/ps.ParameterServer/Explode", "", 0, det, sizeof det) == GRPC_STATUS_UNIMPLEMENTED);
    /* Wrong input shape. */
    int64_t bad[4] = {n, 1, 28, 29};
    CHECK(send_forward(0, 0, bad, 4, x, (int64_t)n * 784, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    int64_t bad2[4] = {n, 1, 784, 1};
    CHECK(send_forward(0, 0, bad2, 4, x, (int64_t)n * 784, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(det, "(4, 1, 784, 1)") && strstr(det, "(N, 1, 28, 28)"));
    /* Declared shape larger than the data sent. */
    int64_t more[4] = {n + 1, 1, 28, 28};
    CHECK(send_forward(0, 0, more, 4, x, (int64_t)n * 784, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    /* Absurd shape (a memory bomb) with little data. */
    int64_t bomb[4] = {1000000000000LL, 1, 28, 28};
    CHECK(send_forward(0, 0, bomb, 4, x, 784, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    /* Training forward without a context id. */
    int64_t good[4] = {n, 1, 28, 28};
    CHECK(send_forward(0, 1, good, 4, x, (int64_t)n * 784, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(det, "context_id") != NULL);
    /* NaN in the input. */
    float xn[4 * 784];
    memcpy(xn, x, sizeof xn);
    xn[100] = NAN;
    CHECK(send_forward(0, 0, good, 4, xn, (int64_t)n * 784, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
    CHECK(strstr(det, "NaN") != NULL);
    /* The first non-finite element is named wherever it lies: psd scans
     * blocks of 256 floats branch-free and looks for the element only in a
     * block that has one (block edges, a later block, the tail past the last
     * whole block: 4 x 784 = 12 blocks and 64 floats), a later one too. */
    static const int at[] = {0, 255, 256, 2000, 3071, 3072, 3135};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        memcpy(xn, x, sizeof xn);
        xn[at[k]] = k % 2 ? -INFINITY : NAN;
        if (at[k] < 3000) xn[3000] = INFINITY;
        char want[48];
        snprintf(want, sizeof want, "element %d is %s;", at[k], k % 2 ? "infinite" : "NaN");
        CHECK(send_forward(0, 0, good, 4, xn, (int64_t)n * 784, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
        CHECK_MSG(strstr(det, want) != NULL, "%s: %s", want, det);
    }
    memcpy(xn, x, sizeof xn);
    xn[100] = NAN;

    /* NaN/Inf under the "reject" policy: nothing reaches the weights. */
    if (!ext) {
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        uint64_t vbefore = st.model_version, rej0 = st.nonfinite_rejected;
        CHECK(!strcmp(st.nonfinite_policy, "reject") && st.nonfinite_skipped == 0);
        CHECK(send_forward(0x77, 1, good, 4, xn, (int64_t)n * 784, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
        CHECK(strstr(det, "element 100 is NaN") != NULL);
        uint64_t c2 = 0x5eed0000000000a1ULL, v;
        int skipped;
        CHECK(ps_client_forward(cl, c2, 7, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
        float gi[40];
        memcpy(gi, grad, sizeof gi);
        gi[13] = INFINITY;
        CHECK(backward_raw(c2, gi, n, 0, &v, &skipped, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
        CHECK_MSG(strstr(det, "step rejected") && strstr(det, "grad_output: element 13 is infinite"), "%s", det);
        /* Finite but huge: the computed parameter gradients overflow. */
        float gh[40];
        for (int i = 0; i < 40; i++) gh[i] = 3e38f;
        CHECK(backward_raw(c2, gh, n, 0, &v, &skipped, det, sizeof det) == GRPC_STATUS_INVALID_ARGUMENT);
        CHECK_MSG(strstr(det, "gradient of") && strstr(det, "computed from grad_output"), "%s", det);
        /* Refused Backwards added nothing: the forward still waits for one. */
        CHECK(step_raw(c2, &v, &skipped, det, sizeof det) == GRPC_STATUS_FAILED_PRECONDITION);
        CHECK_MSG(strstr(det, "not backwarded"), "%s", det);
        /* A good Backward then accumulates the only gradients; the step applies once. */
        CHECK(backward_raw(c2, grad, n, 0, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK);
        CHECK(step_raw(c2, &v, &skipped, det, sizeof det) == GRPC_STATUS_OK && !skipped && v == vbefore + 1);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        CHECK(st.model_version == vbefore + 1);
        CHECK_MSG(st.nonfinite_rejected == rej0 + 3, "%llu", (unsigned long long)st.nonfinite_rejected);
        CHECK(st.live_contexts == 0);
        ps_wire_tensor_list gp;
        CHECK(ps_client_get_parameters(cl, &gp, NULL, &err) == PS_OK);
        int finite = 1;
        for (size_t t = 0; t < gp.n; t++)
            for (size_t j = 0; j < gp.items[t].bytes / 4; j++) finite &= isfinite(gp.items[t].data[j]);
        CHECK(finite);
        ps_wire_tensor_list_free(&gp);
    }

    /* A Backward covering several forwards is all or nothing: refused for
     * one of them (an unrecorded seq, a seq twice, a bad shape), it changes
     * nothing - the good forward stays pending, so Step is refused and no
     * gradient was added; the retried call then applies once. */
    if (!ext) {
        uint64_t cm = 0x5eed0000000000e1ULL;
        ps_client_fwd f = {.ctx = cm, .seq = 3, .train = 1, .rank = 3, .input = {PS_CLIENT_F32, 4, {n, 1, 28, 28}, x}};
        ps_client_fwd_out o = {.out = out, .out_cap = 40};
        CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK);
        float bad[4 * 9] = {0};
        ps_client_tensor g2[2] = {{PS_CLIENT_F32, 2, {n, 10}, grad}, {PS_CLIENT_F32, 2, {n, 10}, grad}};
        uint32_t s_missing[2] = {3, 9}, s_twice[2] = {3, 3};
        ps_client_bwd b = {.ctx = cm, .n = 2, .seqs = s_missing, .grads = g2};
        ps_client_step_out so;
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_ERR_NOT_FOUND);
        CHECK_MSG(strstr(err.msg, "more_seqs[0]") && strstr(err.msg, "seq 9"), "%s", err.msg);
        b.seqs = s_twice;
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(err.msg, "covered twice"), "%s", err.msg);
        /* a bad grad_output after a good one: nothing added either */
        f.seq = 4;
        CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK);
        uint32_t s34[2] = {3, 4};
        ps_client_tensor g3[2] = {{PS_CLIENT_F32, 2, {n, 10}, grad}, {PS_CLIENT_F32, 2, {n, 9}, bad}};
        b = (ps_client_bwd){.ctx = cm, .n = 2, .seqs = s34, .grads = g3};
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK(ps_client_step(cl, cm, NULL, &err) == PS_ERR_FAILED_PRECONDITION);
        CHECK_MSG(strstr(err.msg, "2 recorded forwards not backwarded"), "%s", err.msg);
        ps_wire_tensor_list gx;
        CHECK(ps_client_get_gradients(cl, cm, &gx, &err) == PS_ERR_FAILED_PRECONDITION);  /* none added */
        ps_wire_tensor_list_free(&gx);
        g3[1] = g3[0];
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_OK);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        uint64_t vb = st.model_version, va = 0;
        CHECK(ps_client_step(cl, cm, &va, &err) == PS_OK && va == vb + 1);
    }

    /* The stage-addressed client calls: conv then fc (eval) equals the whole
     * model; a training context with one forward per stage, both covered by
     * one Backward (input gradient of fc asked), then a Step. */
    {
        static float feat[4 * 9216], out2[40], gin[4 * 9216];
        ps_client_fwd f;
        ps_client_fwd_out o;
        /* it_train runs this against a psd that trainers are stepping: compare
         * only three forwards that saw the same weights version */
        uint64_t v1 = 1, v2 = 2, v3 = 3;
        for (int tries = 0; tries < 50 && !(v1 == v2 && v2 == v3); tries++) {
            f = (ps_client_fwd){.input = {PS_CLIENT_F32, 4, {n, 1, 28, 28}, x}, .stage = "conv"};
            o = (ps_client_fwd_out){.out = feat, .out_cap = 4 * 9216};
            CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK);
            CHECK(o.ndim == 2 && o.dims[0] == n && o.dims[1] == 9216);
            v1 = o.version;
            f = (ps_client_fwd){.input = {PS_CLIENT_F32, 2, {n, 9216}, feat}, .stage = "fc"};
            o = (ps_client_fwd_out){.out = out2, .out_cap = 40};
            CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK);
            v2 = o.version;
            f = (ps_client_fwd){.input = {PS_CLIENT_F32, 4, {n, 1, 28, 28}, x}};
            o = (ps_client_fwd_out){.out = out, .out_cap = 40};
            CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK);
            v3 = o.version;
        }
        CHECK_MSG(v1 == v2 && v2 == v3, "no three forwards on one weights version in 50 tries (%llu %llu %llu)",
                  (unsigned long long)v1, (unsigned long long)v2, (unsigned long long)v3);
        double md = 0;
        for (int i = 0; i < 40; i++) md = fmax(md, fabs(out[i] - out2[i]));
        CHECK_MSG(md < 1e-5, "conv | fc vs the whole model (version %llu): %g", (unsigned long long)v3, md);
        uint64_t cx = 0x5eed0000000000c1ULL;
        f = (ps_client_fwd){.ctx = cx, .seq = 0, .train = 1, .rank = 3, .stage = "conv",
                            .input = {PS_CLIENT_F32, 4, {n, 1, 28, 28}, x}};
        o = (ps_client_fwd_out){.out = feat, .out_cap = 4 * 9216};
        CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK && !o.replayed);
        f = (ps_client_fwd){.ctx = cx, .seq = 1, .train = 1, .rank = 3, .stage = "fc",
                            .input = {PS_CLIENT_F32, 2, {n, 9216}, feat}};
        o = (ps_client_fwd_out){.out = out2, .out_cap = 40};
        CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK);
        CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK && o.replayed);  /* a retry: from the record */
        /* fc's input gradient for the conv stage's backward: one call covers both
         * forwards, fc's gradient first so conv's arrives in the same call. */
        float zero_conv[4 * 9216] = {0};
        uint32_t seqs[2] = {1, 0};
        ps_client_tensor g[2] = {{PS_CLIENT_F32, 2, {n, 10}, grad}, {PS_CLIENT_F32, 2, {n, 9216}, zero_conv}};
        ps_client_bwd b = {.ctx = cx, .n = 2, .seqs = seqs, .grads = g};
        ps_client_step_out so;
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_OK);
        /* the same fc backward again is refused: each forward once */
        b.n = 1;
        float *gins[1] = {gin};
        int64_t caps[1] = {4 * 9216};
        b.input_grads = gins;
        b.input_caps = caps;
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_ERR_FAILED_PRECONDITION);
        uint64_t before = 0;
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        before = st.model_version;
        /* against a psd that trainers are stepping (PSD_ADDR), other steps may come between */
        int live = getenv("PSD_ADDR") != NULL;
        CHECK(ps_client_step_ex(cl, cx, 0, &so, &err) == PS_OK && !so.skipped &&
              (live ? so.version > before : so.version == before + 1));
        /* input gradients: fc's, of the context's features */
        uint64_t cy = cx + 1;
        f = (ps_client_fwd){.ctx = cy, .seq = 0, .train = 1, .rank = 3, .stage = "fc",
                            .input = {PS_CLIENT_F32, 2, {n, 9216}, feat}};
        CHECK(ps_client_forward_ex(cl, &f, &o, &err) == PS_OK);
        b = (ps_client_bwd){.ctx = cy, .n = 1, .seqs = seqs + 1, .grads = g, .input_grads = gins,
                            .input_caps = caps, .step = 1};
        CHECK(ps_client_backward_ex(cl, &b, &so, &err) == PS_OK &&
              (live ? so.version > before + 1 : so.version == before + 2));
        int nz = 0, fin = 1;
        for (int i = 0; i < n * 9216; i++) { nz += gin[i] != 0; fin &= isfinite(gin[i]); }
        CHECK(fin && nz > 0);
    }

    /* Still serving. */
    CHECK(ps_client_forward(cl, 0, 1, 0, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
    CHECK(ps_client_status(cl, &st, &err) == PS_OK);

    /* GetParameters returns exactly the model's weights, in state_dict order. */
    if (model) {
        ps_wire_tensor_list wp;
        uint64_t wv = 0;
        CHECK(ps_client_get_parameters(cl, &wp, &wv, &err) == PS_OK);
        CHECK(wp.n == (size_t)ps_model_num_params(model) && wv == ps_model_version(model));
        for (size_t i = 0; i < wp.n && i < (size_t)ps_model_num_params(model); i++) {
            const ps_param_info *pi = ps_model_param(model, (int)i);
            float *w = malloc((size_t)pi->numel * sizeof(float));
            CHECK(ps_model_get_param(model, (int)i, w, &err) == PS_OK);
            CHECK_MSG(!strcmp(wp.items[i].name, pi->name) && wp.items[i].bytes == (size_t)pi->numel * 4 &&
                      !memcmp(wp.items[i].data, w, wp.items[i].bytes), "GetParameters %s", pi->name);
            free(w);
        }
        ps_wire_tensor_list_free(&wp);
    }

    if (!ext) test_paged_parameters(model);
    if (!ext) test_skip_policy(model, x, grad, n);

    /* Health: SERVING for "" and the service's name, NOT_FOUND otherwise. */
    int hs = -1;
    CHECK(health_check("", &hs, det, sizeof det) == GRPC_STATUS_OK && hs == 1);
    CHECK(health_check("ps.ParameterServer", &hs, det, sizeof det) == GRPC_STATUS_OK && hs == 1);
    CHECK(health_check("ps.Other", &hs, det, sizeof det) == GRPC_STATUS_NOT_FOUND);
    CHECK(strstr(det, "unknown service 'ps.Other'") != NULL);
    CHECK(send_raw("/grpc.health.v1.Health/Check", garbage, sizeof garbage, det, sizeof det) ==
          GRPC_STATUS_INVALID_ARGUMENT);

    if (svc) {
        /* Draining: a context opened before may finish; new Forwards are
         * refused with UNAVAILABLE; health says NOT_SERVING. */
        CHECK(!st.draining);
        uint64_t open_ctx = 0x5151;
        CHECK(ps_client_forward(cl, open_ctx, 1, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_OK);
        ps_service_set_draining(svc);
        CHECK(ps_client_forward(cl, open_ctx + 1, 1, 1, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) ==
              PS_ERR_UNAVAILABLE);
        CHECK(strstr(err.msg, "UNAVAILABLE: psd is shutting down") != NULL);
        CHECK(ps_client_forward(cl, 0, 1, 0, x, n, 1, 28, 28, out, 40, &cols, NULL, &err) == PS_ERR_UNAVAILABLE);
        for (int i = 0; i < n * 10; i++) grad[i] = (i % 10 == 3) ? -0.25f : 0.0f;
        uint64_t v0 = ps_model_version(model), v1 = 0;
        CHECK(ps_client_backward(cl, open_ctx, grad, n, 10, 1, &v1, &err) == PS_OK);
        CHECK(v1 == v0 + 1);
        CHECK(health_check("", &hs, det, sizeof det) == GRPC_STATUS_OK && hs == 2);
        CHECK(health_check("ps.ParameterServer", &hs, det, sizeof det) == GRPC_STATUS_OK && hs == 2);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK && st.draining);
        CHECK(st.checkpoint_age_s == -1 && st.last_checkpoint[0] == 0);
        ps_ckpt_info ck = {.version = 7, .samples = 9, .time = (double)time(NULL) - 5};
        snprintf(ck.path, sizeof ck.path, "/x/ckpt-000000000007.safetensors");
        ps_service_note_checkpoint(svc, &ck);
        CHECK(ps_client_status(cl, &st, &err) == PS_OK);
        CHECK(st.last_checkpoint_step == 7 && !strcmp(st.last_checkpoint, ck.path));
        CHECK(st.checkpoint_age_s >= 4.5 && st.checkpoint_age_s < 60);
    }

    ps_client_free(cl);
    ps_rpc_client_free(raw);
    ps_rpc_server_free(srv);
    ps_service_free(svc);
    ps_model_free(model);
    ps_model_free(ref);
    if (!ext) test_cluster_service();
    grpc_shutdown();
    return check_summary("test_service");
}
