/* test_client_step - ps_client_train_step (one call a batch, ps-train's
 * default) against a scripted server instead of psd: what the trainer
 * makes of each reply, independent of psd's own code.
 *  - a reply with a step version: the loss and the version come back, and
 *    the request carried targets, step and skip_input_grad;
 *  - a reply without one and not skipped (a psd that ignores `step`, older
 *    than one call a batch): refused FAILED_PRECONDITION naming
 *    --split-calls, not taken for an applied step;
 *  - a skipped step (server.nonfinite_policy skip) at version 0 is a step's
 *    answer, not an older psd's. */
#include <stdio.h>
#include <string.h>

#include <grpc/grpc.h>

#include "check.h"
#include "ps_client.h"
#include "rpc_server.h"
#include "wire.h"

#define M_FORWARD "/ps.ParameterServer/Forward"

/* What the scripted server answers and what it saw. */
static struct {
    uint64_t step_version;
    int skipped;
    int saw_targets, saw_step, saw_skip;
} g;

static void h_forward(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                      grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user;
    (void)info;
    ps_err err = {0};
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    ps_wire_tensor_in in, tin;
    ps_wire_tensor_in_init(&in, 1 << 20);
    ps_wire_tensor_in_init(&tin, 1 << 20);
    in.err = tin.err = &err;
    ps_wire_tensor_decode_bind(&req.input, &in);
    ps_wire_tensor_decode_bind(&req.targets, &tin);
    if (ps_wire_decode(request, ps_ForwardRequest_fields, &req, &err) != PS_OK) {
        *code = GRPC_STATUS_INVALID_ARGUMENT;
        snprintf(details, details_len, "%s", err.msg);
    } else {
        g.saw_targets = req.has_targets;
        g.saw_step = req.step;
        g.saw_skip = req.skip_input_grad;
        ps_ForwardResponse resp = ps_ForwardResponse_init_zero;
        resp.model_version = 3;
        resp.loss = 0.25;
        resp.step_version = g.step_version;
        resp.skipped = g.skipped != 0;
        if (ps_wire_encode(ps_ForwardResponse_fields, &resp, response, &err) != PS_OK) {
            *code = GRPC_STATUS_INTERNAL;
            snprintf(details, details_len, "%s", err.msg);
        }
    }
    ps_wire_tensor_in_free(&in);
    ps_wire_tensor_in_free(&tin);
}

static const ps_rpc_method methods[] = {{M_FORWARD, h_forward, 0}};

static ps_status one_step(ps_client *cl, double *loss, uint64_t *version, ps_err *err) {
    float x[2 * 4] = {0};
    int64_t y[2] = {1, 3};
    ps_client_fwd f = {.ctx = 7, .rank = 1, .train = 1, .input = {PS_CLIENT_F32, 2, {2, 4}, x},
                       .targets = {PS_CLIENT_I64, 1, {2}, y}};
    return ps_client_train_step(cl, &f, loss, version, err);
}

int main(void) {
    grpc_init();
    ps_err err = {0};
    ps_rpc_server_opts o = {.threads = 2, .max_message_bytes = 4 << 20};
    ps_rpc_server *s = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, 1, NULL, NULL, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (s && ps_rpc_server_start(s, &err) == PS_OK) {
        char target[64];
        snprintf(target, sizeof target, "127.0.0.1:%d", ps_rpc_server_port(s));
        ps_client *cl = ps_client_create(target, 10000, 4 << 20, &err);
        CHECK_MSG(cl != NULL, "%s", err.msg);
        double loss = 0;
        uint64_t version = 0;

        g.step_version = 4;   /* psd stepped: the version after it */
        ps_status st = one_step(cl, &loss, &version, &err);
        CHECK_MSG(st == PS_OK, "%s", err.msg);
        CHECK(version == 4 && loss == 0.25);
        CHECK(g.saw_targets && g.saw_step && g.saw_skip);

        g.step_version = 0;   /* an older psd: no step, no step version */
        err = (ps_err){0};
        st = one_step(cl, &loss, &version, &err);
        CHECK(st == PS_ERR_FAILED_PRECONDITION);
        CHECK_MSG(strstr(err.msg, "without stepping it") && strstr(err.msg, "--split-calls"), "%s", err.msg);

        g.skipped = 1;        /* the first step skipped (non-finite): version 0 is its answer */
        err = (ps_err){0};
        st = one_step(cl, &loss, &version, &err);
        CHECK_MSG(st == PS_OK, "%s", err.msg);
        CHECK(version == 0);
        ps_client_free(cl);
    }
    if (s) {
        ps_rpc_server_shutdown(s, 1000);
        ps_rpc_server_free(s);
    }
    grpc_shutdown();
    return check_summary("test_client_step");
}
