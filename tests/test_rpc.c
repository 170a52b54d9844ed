/* test_rpc.c - the generic unary server and client over loopback: normal
 * calls, > 4 MiB messages, error propagation, unknown methods, deadlines,
 * concurrent clients, bind failures and shutdown with calls in flight;
 * deferred replies (completed from other threads, many more than workers,
 * cancelled by the client, by the deadline, by shutdown), clients that
 * never send their message (also at shutdown: cancelled, not waited
 * for), the call cap, and reserved methods served
 * while every ordinary worker is blocked.
 *
 * No assertion bounds wall-clock time from above: waits are for events
 * (with a generous give-up so that a bug fails instead of hanging), and
 * checks are about order ("answered while the handler was still blocked"). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/slice.h>

#include "check.h"
#include "clock.h"
#include "support/rpc_fixtures.h"
#include "rpc_server.h"
#include "wire.h"

#define MAX_MSG (16 << 20)
#define M_FORWARD "/ps.ParameterServer/Forward"
#define M_FAIL "/test.Test/Fail"
#define M_SLEEP "/test.Test/Sleep"
#define M_GATE "/test.Test/Gate"
#define M_DEFER "/test.Test/Defer"
#define M_DEFER_QUIET "/test.Test/DeferQuiet"
#define M_DEFER_SELF "/test.Test/DeferSelf"
#define M_PING "/test.Test/Ping"
#define M_TID "/test.Test/Tid"

/* Give-up time of every wait for an event: only reached when something is
 * broken, never a performance bound. */
#define WAIT_MS 30000

static atomic_int sleeps_started;
static atomic_int sleeps_done;

static void reply_err(const ps_err *err, grpc_status_code *code, char *details, size_t len) {
    *code = ps_grpc_from_status(err->code);
    snprintf(details, len, "%s", err->msg);
}

/* Echo: ForwardResponse.output = ForwardRequest.input, model_version = context_id. */
static void h_forward(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                      grpc_byte_buffer **response, grpc_status_code *code, char *details,
                      size_t details_len) {
    (void)user;
    (void)info;
    ps_err err;
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, MAX_MSG);
    in.err = &err;
    ps_wire_tensor_decode_bind(&req.input, &in);
    if (ps_wire_decode(request, ps_ForwardRequest_fields, &req, &err) != PS_OK ||
        ps_wire_tensor_check(&req.input, &in, "ForwardRequest.input", &err) != PS_OK) {
        reply_err(&err, code, details, details_len);
        ps_wire_tensor_in_free(&in);
        return;
    }
    ps_ForwardResponse resp = ps_ForwardResponse_init_zero;
    resp.has_output = true;
    resp.model_version = req.context_id;
    ps_wire_tensor_encode_bind(&resp.output, req.input.name, (int)req.input.shape_count,
                               req.input.shape, in.data);
    if (ps_wire_encode(ps_ForwardResponse_fields, &resp, response, &err) != PS_OK)
        reply_err(&err, code, details, details_len);
    ps_wire_tensor_in_free(&in);
}

/* Always INVALID_ARGUMENT; also leaves a response behind, which the server
 * must destroy rather than send or leak. */
static void h_fail(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                   grpc_byte_buffer **response, grpc_status_code *code, char *details,
                   size_t details_len) {
    (void)user;
    (void)request;
    ps_StepResponse r = {.model_version = 1};
    ps_wire_encode(ps_StepResponse_fields, &r, response, NULL);
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(details, details_len, "%s: StepRequest.context_id 42 is unknown", info->method);
}

/* Sleeps StepRequest.context_id milliseconds, replies model_version = that. */
static void h_sleep(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                    grpc_byte_buffer **response, grpc_status_code *code, char *details,
                    size_t details_len) {
    (void)user;
    (void)info;
    ps_err err;
    ps_StepRequest req = ps_StepRequest_init_zero;
    if (ps_wire_decode(request, ps_StepRequest_fields, &req, &err) != PS_OK) {
        reply_err(&err, code, details, details_len);
        return;
    }
    atomic_fetch_add(&sleeps_started, 1);
    sleep_ms((int)req.context_id);
    atomic_fetch_add(&sleeps_done, 1);
    ps_StepResponse r = {.model_version = req.context_id};
    if (ps_wire_encode(ps_StepResponse_fields, &r, response, &err) != PS_OK)
        reply_err(&err, code, details, details_len);
}

static grpc_byte_buffer *step_response(uint64_t v) {
    ps_StepResponse r = {.model_version = v};
    grpc_byte_buffer *b = NULL;
    ps_err err;
    CHECK(ps_wire_encode(ps_StepResponse_fields, &r, &b, &err) == PS_OK);
    return b;
}

/* Blocks until the gate (rpc_fixtures.h) opens; replies model_version 5. */
static void h_gate(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                   grpc_byte_buffer **response, grpc_status_code *code, char *details,
                   size_t details_len) {
    (void)user, (void)info, (void)request, (void)code, (void)details, (void)details_len;
    gate_pass();  /* the gate: rpc_fixtures.h */
    *response = step_response(5);
}

/* Reserved method: replies model_version 7 at once. */
static void h_ping(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                   grpc_byte_buffer **response, grpc_status_code *code, char *details,
                   size_t details_len) {
    (void)user, (void)info, (void)request, (void)code, (void)details, (void)details_len;
    *response = step_response(7);
}

/* Replies model_version = the id of the thread that ran it. */
static void h_tid(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                  grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)info, (void)request, (void)code, (void)details, (void)details_len;
    *response = step_response((uint64_t)syscall(SYS_gettid));
}

/* ---- deferred calls: handles in the table of rpc_fixtures.h, as psd's rounds keep theirs --- */

static void on_cancel(void *arg, ps_rpc_call *call) {
    (void)arg;
    if (!def_cancel(call)) return;  /* the normal path took it and completes it */
    atomic_fetch_add(&cancels, 1);
    /* Nobody will read this: the call is gone. Must not crash or leak. */
    CHECK(ps_rpc_call_complete(call, step_response(0), GRPC_STATUS_OK, NULL) == 0);
}

/* Defers; the test completes the call later through def_take(context_id).
 * Quiet variant: no on_cancel (the owner polls ps_rpc_call_cancelled). */
static void defer_common(const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                         grpc_status_code *code, char *details, size_t details_len, int quiet) {
    ps_err err;
    ps_StepRequest req = ps_StepRequest_init_zero;
    if (ps_wire_decode(request, ps_StepRequest_fields, &req, &err) != PS_OK) {
        reply_err(&err, code, details, details_len);
        return;
    }
    ps_rpc_call *c = ps_rpc_call_defer(info, quiet ? NULL : on_cancel, NULL);
    CHECK(c != NULL);
    if (!c) return;
    def_put(c, req.context_id);
    /* What a deferring handler leaves behind is ignored, not sent. */
    *code = GRPC_STATUS_INTERNAL;
    snprintf(details, details_len, "must not be sent");
}

static void h_defer(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                    grpc_byte_buffer **response, grpc_status_code *code, char *details,
                    size_t details_len) {
    (void)user;
    defer_common(info, request, code, details, details_len, 0);
    *response = step_response(666);  /* destroyed by the server */
}

static void h_defer_quiet(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                          grpc_byte_buffer **response, grpc_status_code *code, char *details,
                          size_t details_len) {
    (void)user, (void)response;
    defer_common(info, request, code, details, details_len, 1);
}

/* Defers and completes at once, from inside the handler. The callers that
 * wait for the reply check it arrived (value 9, OK); complete returns 0
 * only for a call already cancelled: the silent reader call of
 * test_stalled_caps, cancelled by its client, can still reach this handler
 * with no message (a NULL request is an empty one) when its cancellation
 * lands after the message batch ended. */
static void h_defer_self(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                         grpc_byte_buffer **response, grpc_status_code *code, char *details,
                         size_t details_len) {
    (void)user, (void)response, (void)code, (void)details, (void)details_len;
    ps_rpc_call *c = ps_rpc_call_defer(info, on_cancel, NULL);
    CHECK(c != NULL);
    int sent = ps_rpc_call_complete(c, step_response(9), GRPC_STATUS_OK, NULL);
    CHECK_MSG(sent == 1 || (sent == 0 && request == NULL), "complete returned %d for a call with %s message", sent,
              request ? "a" : "no");
}

static const ps_rpc_method methods[] = {
    {M_FORWARD, h_forward, 0},
    {M_FAIL, h_fail, 0},
    {M_SLEEP, h_sleep, 0},
    {M_GATE, h_gate, 0},
    {M_DEFER, h_defer, 0},
    {M_DEFER_QUIET, h_defer_quiet, 0},
    {M_DEFER_SELF, h_defer_self, 0},
    {M_PING, h_ping, 1},
    {M_TID, h_tid, 0},
};
#define NMETHODS ((int)(sizeof methods / sizeof methods[0]))

static ps_rpc_server *start_server_opts(const ps_rpc_server_opts *o) {
    ps_err err;
    ps_rpc_server *s = ps_rpc_server_create_opts("127.0.0.1:0", o, methods, NMETHODS, NULL, NULL, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (!s) return NULL;
    CHECK(ps_rpc_server_port(s) > 0);
    CHECK(ps_rpc_server_start(s, &err) == PS_OK);
    return s;
}

static ps_rpc_server *start_server(int nthreads) {
    ps_rpc_server_opts o = {.threads = nthreads, .max_message_bytes = MAX_MSG};
    return start_server_opts(&o);
}

static ps_rpc_client *connect_to(const ps_rpc_server *s, int max_msg) {
    char target[64];
    ps_err err;
    snprintf(target, sizeof target, "127.0.0.1:%d", ps_rpc_server_port(s));
    ps_rpc_client *c = ps_rpc_client_create(target, max_msg, &err);
    CHECK_MSG(c != NULL, "%s", err.msg);
    return c;
}

/* Forward round trip of a (d0, d1) tensor filled from seed; returns the
 * gRPC code, and checks the echo when it is OK. */
static grpc_status_code forward_echo(ps_rpc_client *c, int64_t d0, int64_t d1, uint32_t seed,
                                     char *details, size_t dlen, int *same) {
    size_t n = (size_t)(d0 * d1);
    float *data = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) data[i] = (float)(seed + i) * 0.5f;
    int64_t dims[2] = {d0, d1};
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    req.context_id = seed;
    req.has_input = true;
    ps_wire_tensor_encode_bind(&req.input, "x", 2, dims, data);
    grpc_byte_buffer *rb = NULL, *resp = NULL;
    ps_err err;
    CHECK(ps_wire_encode(ps_ForwardRequest_fields, &req, &rb, &err) == PS_OK);
    grpc_status_code code;
    ps_status st = ps_rpc_client_call(c, M_FORWARD, rb, &resp, 10000, &code, details, dlen, &err);
    CHECK_MSG(st == PS_OK, "%s", err.msg);
    *same = 0;
    if (code == GRPC_STATUS_OK) {
        ps_ForwardResponse fr = ps_ForwardResponse_init_zero;
        ps_wire_tensor_in in;
        ps_wire_tensor_in_init(&in, MAX_MSG);
        ps_wire_tensor_decode_bind(&fr.output, &in);
        *same = ps_wire_decode(resp, ps_ForwardResponse_fields, &fr, &err) == PS_OK &&
                ps_wire_tensor_check(&fr.output, &in, "out", &err) == PS_OK &&
                fr.model_version == seed && fr.output.shape[0] == d0 &&
                fr.output.shape[1] == d1 && strcmp(fr.output.name, "x") == 0 &&
                in.bytes == n * 4 && memcmp(in.data, data, n * 4) == 0;
        ps_wire_tensor_in_free(&in);
    } else {
        CHECK(resp == NULL);
    }
    /* The request is still the caller's: sending it again must work. */
    CHECK(grpc_byte_buffer_length(rb) == grpc_byte_buffer_length(rb));
    grpc_byte_buffer_destroy(rb);
    if (resp) grpc_byte_buffer_destroy(resp);
    free(data);
    return code;
}

/* A call of method with StepRequest{context_id = arg}; *version is the
 * reply's model_version on OK. */
static grpc_status_code step_call(ps_rpc_client *c, const char *method, uint64_t arg, int timeout_ms,
                                  char *details, size_t dlen, uint64_t *version) {
    ps_StepRequest req = {.context_id = arg};
    grpc_byte_buffer *rb = NULL, *resp = NULL;
    ps_err err;
    ps_wire_encode(ps_StepRequest_fields, &req, &rb, &err);
    grpc_status_code code;
    CHECK(ps_rpc_client_call(c, method, rb, &resp, timeout_ms, &code, details, dlen, &err) == PS_OK);
    if (code == GRPC_STATUS_OK) {
        ps_StepResponse r = ps_StepResponse_init_zero;
        CHECK(ps_wire_decode(resp, ps_StepResponse_fields, &r, &err) == PS_OK);
        if (version) *version = r.model_version;
    }
    grpc_byte_buffer_destroy(rb);
    if (resp) grpc_byte_buffer_destroy(resp);
    return code;
}

static grpc_status_code sleep_call(ps_rpc_client *c, int ms, int timeout_ms, char *details,
                                   size_t dlen, uint64_t *version) {
    return step_call(c, M_SLEEP, (uint64_t)ms, timeout_ms, details, dlen, version);
}

/* ---- concurrent clients ------------------------------------------------ */

typedef struct worker_arg { ps_rpc_client *c; int id; int ok; } worker_arg;

static void *client_thread(void *p) {
    worker_arg *a = p;
    char details[256];
    for (int i = 0; i < 50; i++) {
        int same = 0;
        grpc_status_code code = forward_echo(a->c, 1 + (i % 7), 100 + a->id,
                                             (uint32_t)(a->id * 1000 + i), details,
                                             sizeof details, &same);
        if (code == GRPC_STATUS_OK && same) a->ok++;
    }
    return NULL;
}

typedef struct sleeper_arg { ps_rpc_client *c; int ms; grpc_status_code code; uint64_t v; } sleeper_arg;

static void *sleeper_thread(void *p) {
    sleeper_arg *a = p;
    char details[256];
    a->code = sleep_call(a->c, a->ms, 20000, details, sizeof details, &a->v);
    return NULL;
}

/* ---- tests ------------------------------------------------------------- */

static void test_calls(ps_rpc_server *s) {
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    char details[PS_RPC_DETAILS_MAX];
    int same = 0;
    ps_err err;

    /* Normal call: an MNIST-sized input batch. */
    CHECK(forward_echo(c, 64, 784, 1, details, sizeof details, &same) == GRPC_STATUS_OK && same);

    /* 6 MiB each way. */
    CHECK(forward_echo(c, 1536, 1024, 2, details, sizeof details, &same) == GRPC_STATUS_OK && same);

    /* A client left at gRPC's 4 MiB default cannot receive the 6 MiB reply. */
    ps_rpc_client *small = connect_to(s, 0);
    grpc_status_code code = forward_echo(small, 1536, 1024, 3, details, sizeof details, &same);
    CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: %s", ps_grpc_code_name(code), details);
    ps_rpc_client_free(small);
    /* A request over the server's limit: RESOURCE_EXHAUSTED from gRPC
     * without the admission hint - final for every client
     * (docs/protocol.md), never retried. */
    {
        ps_rpc_client *big = connect_to(s, 4 * MAX_MSG);
        int64_t dims[2] = {MAX_MSG / 1024 + 1, 1024};   /* just over the server's limit */
        float *data = calloc((size_t)(dims[0] * dims[1]), sizeof(float));
        ps_ForwardRequest req = ps_ForwardRequest_init_zero;
        req.has_input = true;
        ps_wire_tensor_encode_bind(&req.input, "x", 2, dims, data);
        grpc_byte_buffer *rb = NULL, *resp = NULL;
        CHECK(ps_wire_encode(ps_ForwardRequest_fields, &req, &rb, &err) == PS_OK);
        int hint = -1;
        CHECK(ps_rpc_client_call_ex(big, M_FORWARD, rb, &resp, 10000, &code, details, sizeof details, &hint, &err) ==
              PS_OK);
        CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED && hint == 0, "%s: %s, hint %d", ps_grpc_code_name(code),
                  details, hint);
        grpc_byte_buffer_destroy(rb);
        free(data);
        ps_rpc_client_free(big);
    }

    /* INVALID_ARGUMENT with details, and no response. */
    grpc_byte_buffer *resp = (grpc_byte_buffer *)1;
    CHECK(ps_rpc_client_call(c, M_FAIL, NULL, &resp, 5000, &code, details, sizeof details, &err) == PS_OK);
    CHECK(code == GRPC_STATUS_INVALID_ARGUMENT && resp == NULL);
    CHECK_MSG(strcmp(details, M_FAIL ": StepRequest.context_id 42 is unknown") == 0, "%s", details);
    CHECK(ps_status_from_grpc(code) == PS_ERR_INVALID_ARGUMENT);

    /* Malformed request body -> INVALID_ARGUMENT from the decoder. */
    unsigned char junk[32];
    memset(junk, 0xff, sizeof junk);
    grpc_slice js = grpc_slice_from_copied_buffer((const char *)junk, sizeof junk);
    grpc_byte_buffer *jb = grpc_raw_byte_buffer_create(&js, 1);
    grpc_slice_unref(js);
    CHECK(ps_rpc_client_call(c, M_FORWARD, jb, &resp, 5000, &code, details, sizeof details, &err) == PS_OK);
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && strstr(details, "malformed"), "%s", details);
    /* Empty request: decodes as defaults, then the missing input is refused. */
    CHECK(ps_rpc_client_call(c, M_FORWARD, NULL, &resp, 5000, &code, details, sizeof details, &err) == PS_OK);
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && strstr(details, "ForwardRequest.input"), "%s", details);
    /* Request buffer still intact and reusable after a call. */
    CHECK(grpc_byte_buffer_length(jb) == sizeof junk);
    grpc_byte_buffer_destroy(jb);

    /* Unknown method. */
    CHECK(ps_rpc_client_call(c, "/ps.ParameterServer/Nope", NULL, &resp, 5000, &code, details,
                             sizeof details, &err) == PS_OK);
    CHECK(code == GRPC_STATUS_UNIMPLEMENTED && resp == NULL);
    CHECK_MSG(strstr(details, "/ps.ParameterServer/Nope") != NULL, "%s", details);

    /* Deadline shorter than the handler: the client gets DEADLINE_EXCEEDED
     * before the handler can have finished (the gate opens only after the
     * client returned), and not before the deadline. */
    gate_set(0);
    double t0 = (ps_mono_s() * 1e3);
    code = step_call(c, M_GATE, 0, 100, details, sizeof details, NULL);
    double dt = (ps_mono_s() * 1e3) - t0;
    CHECK_MSG(code == GRPC_STATUS_DEADLINE_EXCEEDED, "%s", ps_grpc_code_name(code));
    CHECK_MSG(dt >= 90, "deadline call took %.0f ms", dt);
    CHECK(atomic_load(&gate_passed) == 0);
    gate_set(1);
    /* The late reply goes to nobody and the server lets go of the call. */
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0 && atomic_load(&gate_blocked) == 0, WAIT_MS));
    uint64_t v = 0;
    CHECK(sleep_call(c, 10, 5000, details, sizeof details, &v) == GRPC_STATUS_OK && v == 10);

    /* 4 threads x 50 calls on one shared client. */
    pthread_t th[4];
    worker_arg wa[4];
    for (int i = 0; i < 4; i++) {
        wa[i] = (worker_arg){c, i, 0};
        pthread_create(&th[i], NULL, client_thread, &wa[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(wa[i].ok == 50, "thread %d: %d of 50 correct", i, wa[i].ok);
    }
    /* ... and 4 threads with a client each. */
    ps_rpc_client *cs[4];
    for (int i = 0; i < 4; i++) {
        cs[i] = connect_to(s, MAX_MSG);
        wa[i] = (worker_arg){cs[i], i + 4, 0};
        pthread_create(&th[i], NULL, client_thread, &wa[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(wa[i].ok == 50, "thread %d: %d of 50 correct", i + 4, wa[i].ok);
        ps_rpc_client_free(cs[i]);
    }
    ps_rpc_client_free(c);
}

static void test_unreachable_and_bind(ps_rpc_server *s) {
    ps_err err;
    char details[256];
    grpc_status_code code;
    grpc_byte_buffer *resp = NULL;

    /* Nothing listens on port 1: the call completes with UNAVAILABLE. */
    ps_rpc_client *c = ps_rpc_client_create("127.0.0.1:1", 0, &err);
    CHECK(c != NULL);
    CHECK(ps_rpc_client_call(c, M_FORWARD, NULL, &resp, 3000, &code, details, sizeof details, &err) == PS_OK);
    CHECK_MSG(code == GRPC_STATUS_UNAVAILABLE, "%s: %s", ps_grpc_code_name(code), details);
    CHECK(ps_status_from_grpc(code) == PS_ERR_UNAVAILABLE);
    ps_rpc_client_free(c);

    /* Port already in use. */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ps_rpc_server_port(s));
    ps_rpc_server *s2 = ps_rpc_server_create(addr, 1, 0, methods, NMETHODS, NULL, &err);
    CHECK(s2 == NULL);
    CHECK_MSG(err.code == PS_ERR_UNAVAILABLE && strstr(err.msg, addr), "%s", err.msg);
    ps_rpc_server_free(s2);

    /* Not an address. */
    s2 = ps_rpc_server_create("no-such-host.invalid:zz", 1, 0, methods, NMETHODS, NULL, &err);
    CHECK(s2 == NULL);
    CHECK_MSG(strstr(err.msg, "no-such-host.invalid:zz") != NULL, "%s", err.msg);
    s2 = ps_rpc_server_create("127.0.0.1:0", 0, 0, methods, NMETHODS, NULL, &err);
    CHECK(s2 == NULL && err.code == PS_ERR_INVALID_ARGUMENT);

    /* Created, never started, freed. */
    s2 = ps_rpc_server_create("127.0.0.1:0", 2, 0, methods, NMETHODS, NULL, &err);
    CHECK(s2 != NULL);
    ps_rpc_server_free(s2);
    ps_rpc_server_free(NULL);
    ps_rpc_client_free(NULL);
}

/* A call in flight at shutdown finishes within the grace period. */
static void test_graceful_shutdown(void) {
    ps_rpc_server *s = start_server(2);
    if (!s) return;
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    atomic_store(&sleeps_started, 0);
    atomic_store(&sleeps_done, 0);
    sleeper_arg a = {c, 400, GRPC_STATUS_UNKNOWN, 0};
    pthread_t th;
    pthread_create(&th, NULL, sleeper_thread, &a);
    while (atomic_load(&sleeps_started) == 0) sleep_ms(5);
    double t0 = (ps_mono_s() * 1e3);
    ps_rpc_server_shutdown(s, 5000);
    double dt = (ps_mono_s() * 1e3) - t0;
    pthread_join(th, NULL);
    CHECK_MSG(a.code == GRPC_STATUS_OK && a.v == 400, "in-flight call: %s", ps_grpc_code_name(a.code));
    CHECK_MSG(dt < 3000, "graceful shutdown took %.0f ms", dt);
    CHECK(atomic_load(&sleeps_done) == 1);

    /* New calls are refused after shutdown. */
    char details[256];
    grpc_status_code code = sleep_call(c, 1, 2000, details, sizeof details, NULL);
    CHECK_MSG(code != GRPC_STATUS_OK, "after shutdown: %s", ps_grpc_code_name(code));
    ps_rpc_server_shutdown(s, 0); /* idempotent */
    ps_rpc_server_free(s);
    ps_rpc_client_free(c);
}

/* A call longer than the grace period is cancelled; shutdown still waits
 * for the handler to return and then tears down cleanly. */
static void test_forced_shutdown(void) {
    ps_rpc_server *s = start_server(2);
    if (!s) return;
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    atomic_store(&sleeps_started, 0);
    atomic_store(&sleeps_done, 0);
    sleeper_arg a = {c, 800, GRPC_STATUS_UNKNOWN, 0};
    pthread_t th;
    pthread_create(&th, NULL, sleeper_thread, &a);
    while (atomic_load(&sleeps_started) == 0) sleep_ms(5);
    double t0 = (ps_mono_s() * 1e3);
    ps_rpc_server_shutdown(s, 100);
    double dt = (ps_mono_s() * 1e3) - t0;
    pthread_join(th, NULL);
    CHECK_MSG(a.code == GRPC_STATUS_CANCELLED || a.code == GRPC_STATUS_UNAVAILABLE,
              "cancelled call: %s", ps_grpc_code_name(a.code));
    CHECK(atomic_load(&sleeps_done) == 1); /* handler ran to its end */
    CHECK_MSG(dt >= 90 && dt < 3000, "forced shutdown took %.0f ms", dt);
    ps_rpc_server_free(s);
    ps_rpc_client_free(c);
}

/* ---- raw gRPC core client calls (what ps_rpc_client cannot do) -------- */

typedef struct raw_call {
    grpc_call *call;
    grpc_metadata_array initial_md, trailing_md;
    grpc_byte_buffer *send, *recv;
    grpc_status_code status;
    grpc_slice status_details;
} raw_call;

/* own: a connection of its own (not shared with other channels). */
static grpc_channel *raw_channel_own(const ps_rpc_server *s, int own) {
    char target[64];
    snprintf(target, sizeof target, "127.0.0.1:%d", ps_rpc_server_port(s));
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_arg arg = {.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                    .value.integer = 1};
    grpc_channel_args args = {1, &arg};
    grpc_channel *ch = grpc_channel_create(target, creds, own ? &args : NULL);
    grpc_channel_credentials_release(creds);
    return ch;
}

static grpc_channel *raw_channel(const ps_rpc_server *s) { return raw_channel_own(s, 0); }

/* Start a call of method on cq. With message == 0 only the initial
 * metadata is sent (the request message never comes); otherwise
 * StepRequest{context_id = arg} and the half-close. Either way a second
 * batch waits for the status. Two events (tags &r->call, r) follow. */
static const char *raw_token;  /* "Bearer <token>" metadata on raw calls when set */

static void raw_start(raw_call *r, grpc_channel *ch, grpc_completion_queue *cq, const char *method,
                      int message, uint64_t arg) {
    memset(r, 0, sizeof *r);
    grpc_metadata_array_init(&r->initial_md);
    grpc_metadata_array_init(&r->trailing_md);
    r->status_details = grpc_empty_slice();
    grpc_slice m = grpc_slice_from_static_string(method);
    gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_millis(WAIT_MS, GPR_TIMESPAN));
    r->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, m, NULL, dl, NULL);
    CHECK(r->call != NULL);
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    grpc_metadata auth;
    char bearer[128];
    if (raw_token) {
        snprintf(bearer, sizeof bearer, "Bearer %s", raw_token);
        auth.key = grpc_slice_from_static_string("authorization");
        auth.value = grpc_slice_from_copied_string(bearer);
        ops[n].data.send_initial_metadata.count = 1;
        ops[n].data.send_initial_metadata.metadata = &auth;
    }
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (message) {
        ps_StepRequest req = {.context_id = arg};
        ps_err err;
        CHECK(ps_wire_encode(ps_StepRequest_fields, &req, &r->send, &err) == PS_OK);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = r->send;
        ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    }
    CHECK(grpc_call_start_batch(r->call, ops, n, &r->call, NULL) == GRPC_CALL_OK);
    if (raw_token) grpc_slice_unref(auth.value);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &r->initial_md;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &r->recv;
    ops[2].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[2].data.recv_status_on_client.trailing_metadata = &r->trailing_md;
    ops[2].data.recv_status_on_client.status = &r->status;
    ops[2].data.recv_status_on_client.status_details = &r->status_details;
    CHECK(grpc_call_start_batch(r->call, ops, 3, r, NULL) == GRPC_CALL_OK);
}

static void raw_free(raw_call *r) {
    if (r->send) grpc_byte_buffer_destroy(r->send);
    if (r->recv) grpc_byte_buffer_destroy(r->recv);
    grpc_metadata_array_destroy(&r->initial_md);
    grpc_metadata_array_destroy(&r->trailing_md);
    grpc_slice_unref(r->status_details);
    if (r->call) grpc_call_unref(r->call);
}

/* Take n events from cq (gives up after WAIT_MS); how many came. */
static int raw_events(grpc_completion_queue *cq, int n) {
    int got = 0;
    gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(WAIT_MS, GPR_TIMESPAN));
    while (got < n) {
        grpc_event ev = grpc_completion_queue_next(cq, dl, NULL);
        if (ev.type != GRPC_OP_COMPLETE) break;
        got++;
    }
    return got;
}

static void raw_cq_destroy(grpc_completion_queue *cq) {
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN) {}
    grpc_completion_queue_destroy(cq);
}

/* ---- deferred calls ---------------------------------------------------- */

typedef struct step_arg {
    ps_rpc_client *c;
    const char *method;
    uint64_t id;
    int timeout_ms;
    grpc_status_code code;
    uint64_t v;
    atomic_int done;
} step_arg;

static void *step_thread(void *p) {
    step_arg *a = p;
    char details[256];
    a->code = step_call(a->c, a->method, a->id, a->timeout_ms, details, sizeof details, &a->v);
    atomic_store(&a->done, 1);
    return NULL;
}

/* Index of a call of a[0..n) that has returned, or -1. */
static int first_done(step_arg *a, int n) {
    for (int i = 0; i < n; i++)
        if (atomic_load(&a[i].done)) return i;
    return -1;
}

typedef struct completer_arg { const uint64_t *ids; int n; int sent; } completer_arg;

/* Completes the deferred calls of ids, in that order, with model_version
 * id * 3 (from a thread that is neither a worker nor a client). */
static void *completer_thread(void *p) {
    completer_arg *a = p;
    for (int i = 0; i < a->n; i++) {
        ps_rpc_call *c = def_take(a->ids[i]);
        CHECK_MSG(c != NULL, "deferred call %llu not found", (unsigned long long)a->ids[i]);
        if (c) a->sent += ps_rpc_call_complete(c, step_response(a->ids[i] * 3), GRPC_STATUS_OK, NULL);
    }
    return NULL;
}

static void complete_from_thread(const uint64_t *ids, int n, int *sent) {
    completer_arg a = {ids, n, 0};
    pthread_t th;
    pthread_create(&th, NULL, completer_thread, &a);
    pthread_join(th, NULL);
    *sent = a.sent;
}

/* One worker; a deferred call waits while 20 other calls are served on
 * that same worker, then another thread completes it. */
static void test_defer_frees_worker(void) {
    ps_rpc_server *s = start_server(1);
    if (!s) return;
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    int cancels0 = atomic_load(&cancels);
    step_arg a = {c, M_DEFER, 1001, WAIT_MS, GRPC_STATUS_UNKNOWN, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, step_thread, &a);
    CHECK(WAIT_UNTIL(atomic_load(&def_count) == 1, WAIT_MS));
    char details[256];
    int served = 0;
    for (int i = 0; i < 20; i++) {
        int same = 0;
        if (forward_echo(c, 2, 10, (uint32_t)i, details, sizeof details, &same) == GRPC_STATUS_OK && same)
            served++;
    }
    CHECK_MSG(served == 20, "%d of 20 calls served while a call was deferred", served);
    CHECK(atomic_load(&a.done) == 0);  /* still waiting for its reply */
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 1, WAIT_MS));
    uint64_t id = 1001;
    int sent = 0;
    complete_from_thread(&id, 1, &sent);
    CHECK(sent == 1);
    pthread_join(th, NULL);
    CHECK_MSG(a.code == GRPC_STATUS_OK && a.v == 3003, "deferred call: %s, version %llu",
              ps_grpc_code_name(a.code), (unsigned long long)a.v);

    /* A handler may complete its own deferred call before returning. */
    uint64_t v = 0;
    CHECK(step_call(c, M_DEFER_SELF, 0, WAIT_MS, details, sizeof details, &v) == GRPC_STATUS_OK && v == 9);
    CHECK(atomic_load(&cancels) == cancels0);  /* no spurious cancellation */
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

/* 64 deferred calls on a server with 2 workers, completed in reverse order
 * from another thread: each client gets its own reply. */
#define NDEFER 64
static void test_many_deferred(void) {
    ps_rpc_server *s = start_server(2);
    if (!s) return;
    ps_rpc_client *cl[4];
    for (int i = 0; i < 4; i++) cl[i] = connect_to(s, MAX_MSG);
    int cancels0 = atomic_load(&cancels);
    static step_arg a[NDEFER];
    pthread_t th[NDEFER];
    uint64_t ids[NDEFER];
    for (int i = 0; i < NDEFER; i++) {
        a[i] = (step_arg){cl[i % 4], M_DEFER, 2000 + (uint64_t)i, WAIT_MS, GRPC_STATUS_UNKNOWN, 0, 0};
        ids[NDEFER - 1 - i] = 2000 + (uint64_t)i;
        pthread_create(&th[i], NULL, step_thread, &a[i]);
    }
    CHECK_MSG(WAIT_UNTIL(atomic_load(&def_count) == NDEFER, WAIT_MS), "%d of %d calls deferred",
              atomic_load(&def_count), NDEFER);
    CHECK(ps_rpc_server_calls(s) == NDEFER);
    int done = 0;
    for (int i = 0; i < NDEFER; i++) done += atomic_load(&a[i].done);
    CHECK(done == 0);
    int sent = 0;
    complete_from_thread(ids, NDEFER, &sent);
    CHECK(sent == NDEFER);
    int ok = 0;
    for (int i = 0; i < NDEFER; i++) {
        pthread_join(th[i], NULL);
        if (a[i].code == GRPC_STATUS_OK && a[i].v == a[i].id * 3) ok++;
    }
    CHECK_MSG(ok == NDEFER, "%d of %d deferred calls got their reply", ok, NDEFER);
    CHECK(atomic_load(&cancels) == cancels0);
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    for (int i = 0; i < 4; i++) ps_rpc_client_free(cl[i]);
    ps_rpc_server_free(s);
}

/* 40 calls that never send their message (more than the 2 workers and the
 * old 8 slots) are accepted (with server.max_stalled_per_client 64), and
 * other calls are still served. */
#define NSILENT 40
static void test_silent_clients(void) {
    ps_rpc_server_opts o = {.threads = 2, .max_message_bytes = MAX_MSG, .max_stalled_per_client = 64};
    ps_rpc_server *s = start_server_opts(&o);
    if (!s) return;
    grpc_channel *ch = raw_channel(s);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    static raw_call r[NSILENT];
    for (int i = 0; i < NSILENT; i++) raw_start(&r[i], ch, cq, M_FORWARD, 0, 0);
    CHECK_MSG(WAIT_UNTIL(ps_rpc_server_calls(s) == NSILENT, WAIT_MS), "%d of %d silent calls accepted",
              ps_rpc_server_calls(s), NSILENT);
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    char details[256];
    int served = 0;
    for (int i = 0; i < 20; i++) {
        int same = 0;
        if (forward_echo(c, 3, 5, (uint32_t)i, details, sizeof details, &same) == GRPC_STATUS_OK && same)
            served++;
    }
    CHECK_MSG(served == 20, "%d of 20 calls served beside %d silent ones", served, NSILENT);
    /* The served calls are released just after their replies; the silent
     * ones stay open. */
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == NSILENT, WAIT_MS));
    for (int i = 0; i < NSILENT; i++) grpc_call_cancel(r[i].call, NULL);
    CHECK(raw_events(cq, 2 * NSILENT) == 2 * NSILENT);
    int cancelled = 0;
    for (int i = 0; i < NSILENT; i++) {
        cancelled += r[i].status == GRPC_STATUS_CANCELLED;
        raw_free(&r[i]);
    }
    CHECK(cancelled == NSILENT);
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    raw_cq_destroy(cq);
    grpc_channel_destroy(ch);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

/* Start n silent calls of method (no request message) on ch with token
 * tok, of which refuse are expected to be refused RESOURCE_EXHAUSTED with
 * details naming what; wait for every call's send batch and the refused
 * calls' ends, then until the server holds want calls in all. Returns how
 * many were refused. The accepted ones stay open in r[0..n) (the caller
 * cancels them). The server's count before is want - (n - refuse), waited
 * for, not read: a call refused or answered in the step before may still be
 * counted for a moment after its client saw it end. */
static int silent_calls(ps_rpc_server *s, grpc_channel *ch, grpc_completion_queue *cq, raw_call *r, int n,
                        const char *method, const char *tok, int want, int refuse, const char *what) {
    /* settle first: the calls of the step before (answered, refused) are
     * released, so the server holds what this step starts from */
    int before = want - (n - refuse);
    CHECK_MSG(WAIT_UNTIL(ps_rpc_server_calls(s) == before, WAIT_MS), "%s: server holds %d calls before, want %d",
              tok, ps_rpc_server_calls(s), before);
    raw_token = tok;
    for (int i = 0; i < n; i++) raw_start(&r[i], ch, cq, method, 0, 0);
    raw_token = NULL;
    /* every call's send batch completes; the refused ones also end (both
     * batches of a raw call have the same tag; the status stays 0 = OK
     * until the call ends) */
    int events = n + refuse;
    int got = raw_events(cq, events);
    CHECK_MSG(got == events, "%s: %d of %d events", tok, got, events);
    CHECK_MSG(WAIT_UNTIL(ps_rpc_server_calls(s) == want, WAIT_MS), "%s: server holds %d calls, want %d",
              tok, ps_rpc_server_calls(s), want);
    int refused = 0;
    for (int i = 0; i < n; i++) {
        char *d = grpc_slice_to_c_string(r[i].status_details);
        if (r[i].status == GRPC_STATUS_RESOURCE_EXHAUSTED) {
            CHECK_MSG(strstr(d, what) != NULL, "refusal '%s' does not name %s", d, what);
            refused++;
        } else {
            CHECK_MSG(r[i].status == GRPC_STATUS_OK, "%s: call ended %s: %s", tok, ps_grpc_code_name(r[i].status), d);
        }
        gpr_free(d);
    }
    return refused;
}

static void cancel_all(grpc_completion_queue *cq, raw_call *r, int n, int ended) {
    for (int i = 0; i < n; i++) grpc_call_cancel(r[i].call, NULL);
    CHECK(raw_events(cq, n - ended) == n - ended);
    for (int i = 0; i < n; i++) raw_free(&r[i]);
}

/* Issue 23 item 8: four clients (tokens here; hosts without tokens) that
 * open calls and never send their request cannot fill the call cap:
 * server.max_stalled_per_client each and max_calls / 4 in all, though a
 * client holding none still starts one; the last max_calls / 8 are kept
 * for clients holding none; readers have their own cap; a connection may
 * hold one reserved call whatever its client holds. */
static void test_stalled_caps(void) {
    static const char *const reader_methods[] = {M_DEFER_SELF, M_PING, NULL};
    static const ps_rpc_token tok[] = {
        {"aaaaaaaaaaaaaaaa-token-a", "a", NULL}, {"bbbbbbbbbbbbbbbb-token-b", "b", NULL},
        {"cccccccccccccccc-token-c", "c", NULL}, {"dddddddddddddddd-token-d", "d", NULL},
        {"rrrrrrrrrrrrrrrr-token-r", "r", reader_methods}};
    ps_rpc_security sec = {.tokens = tok, .ntokens = 5};
    /* cap 32: 8 per client, 4 stalled per client, 8 stalled in all, the
     * last 4 kept; reserved 8: 2 per client */
    ps_rpc_server_opts o = {.threads = 2, .max_calls = 32, .max_reserved_calls = 8, .max_stalled_per_client = 4,
                            .max_message_bytes = MAX_MSG};
    ps_err err;
    ps_rpc_server *s = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, NMETHODS, NULL, &sec, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (!s) return;
    CHECK(ps_rpc_server_start(s, &err) == PS_OK);
    grpc_channel *ch = raw_channel(s);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    static raw_call ra[8], rb[8], rc[2], rr[1], rp[3];
    /* a and b: 8 calls each (their share) without a message: a second
     * later 4 each count as stalled, the rest are cancelled naming the cap */
    CHECK(silent_calls(s, ch, cq, ra, 8, M_FORWARD, tok[0].token, 4, 4, "server.max_stalled_per_client") == 4);
    CHECK(silent_calls(s, ch, cq, rb, 8, M_FORWARD, tok[1].token, 8, 4, "server.max_stalled_per_client") == 4);
    /* a holds 4 stalled calls: its next one is refused at once */
    raw_call r;
    CHECK(silent_calls(s, ch, cq, &r, 1, M_FORWARD, tok[0].token, 8, 1, "server.max_stalled_per_client") == 1);
    raw_free(&r);
    /* 8 stalled in all: c, holding none, still starts one, not two */
    CHECK(silent_calls(s, ch, cq, rc, 2, M_FORWARD, tok[2].token, 9, 1, "in all") == 1);
    /* d, holding none, is served */
    raw_token = tok[3].token;
    raw_start(&r, ch, cq, M_DEFER_SELF, 1, 1);
    raw_token = NULL;
    CHECK(raw_events(cq, 2) == 2);
    CHECK_MSG(r.status == GRPC_STATUS_OK, "d: %s", ps_grpc_code_name(r.status));
    raw_free(&r);
    /* the reader's calls have their own cap */
    CHECK(silent_calls(s, ch, cq, rr, 1, M_DEFER_SELF, tok[4].token, 10, 0, "-") == 0);
    ps_rpc_admission ad;
    ps_rpc_server_admission(s, &ad);
    CHECK_MSG(ad.calls == 9 && ad.reader_calls == 1 && ad.stalled_calls == 10, "calls %d, reader %d, stalled %d",
              ad.calls, ad.reader_calls, ad.stalled_calls);
    /* a fills its reserved share (2) with pings that never send their
     * message on this connection (the first on it is the connection's own) */
    CHECK(silent_calls(s, ch, cq, rp, 3, M_PING, tok[0].token, 12, 1, "server.max_calls_per_client") == 1);
    /* a monitor with a's token on a connection of its own is answered */
    grpc_channel *ch2 = raw_channel_own(s, 1);
    raw_token = tok[0].token;
    raw_start(&r, ch2, cq, M_PING, 1, 0);
    raw_token = NULL;
    CHECK(raw_events(cq, 2) == 2);
    CHECK_MSG(r.status == GRPC_STATUS_OK, "monitor: %s", ps_grpc_code_name(r.status));
    raw_free(&r);
    cancel_all(cq, ra, 8, 4);
    cancel_all(cq, rb, 8, 4);
    cancel_all(cq, rc, 2, 1);
    cancel_all(cq, rr, 1, 0);
    cancel_all(cq, rp, 3, 1);
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    ps_rpc_server_admission(s, &ad);
    CHECK(ad.stalled_calls == 0 && ad.clients == 0);

    grpc_channel_destroy(ch2);
    raw_cq_destroy(cq);
    grpc_channel_destroy(ch);
    ps_rpc_server_free(s);

    /* capacity kept: a holds 28 deferred calls (received, not stalled) of
     * 32 with a per-client share of 32; its 29th is refused, while b,
     * holding none, gets one of the last 4 */
    o = (ps_rpc_server_opts){.threads = 2, .max_calls = 32, .max_calls_per_client = 32,
                             .max_message_bytes = MAX_MSG};
    s = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, NMETHODS, NULL, &sec, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (!s) return;
    CHECK(ps_rpc_server_start(s, &err) == PS_OK);
    ch = raw_channel(s);
    cq = grpc_completion_queue_create_for_next(NULL);
    int total0 = atomic_load(&def_total);
    static raw_call rd[29];
    raw_token = tok[0].token;
    for (int i = 0; i < 28; i++) raw_start(&rd[i], ch, cq, M_DEFER, 1, 5000 + (uint64_t)i);
    CHECK_MSG(WAIT_UNTIL(atomic_load(&def_total) == total0 + 28, WAIT_MS), "%d of 28 deferred",
              atomic_load(&def_total) - total0);
    raw_start(&rd[28], ch, cq, M_DEFER, 1, 5028);
    raw_token = tok[1].token;
    raw_start(&r, ch, cq, M_DEFER_SELF, 1, 1);
    raw_token = NULL;
    CHECK(raw_events(cq, 28 + 2 + 2) == 32);  /* send batches, and the two answered calls */
    CHECK_MSG(rd[28].status == GRPC_STATUS_RESOURCE_EXHAUSTED, "a's 29th: %s", ps_grpc_code_name(rd[28].status));
    char *d = grpc_slice_to_c_string(rd[28].status_details);
    CHECK_MSG(strstr(d, "kept for clients holding none") != NULL, "%s", d);
    gpr_free(d);
    CHECK_MSG(r.status == GRPC_STATUS_OK, "b: %s", ps_grpc_code_name(r.status));
    raw_free(&r);
    for (int i = 0; i < 28; i++) {
        ps_rpc_call *h = def_take(5000 + (uint64_t)i);
        CHECK(h != NULL);
        if (h) ps_rpc_call_complete(h, step_response(1), GRPC_STATUS_OK, NULL);
    }
    CHECK(raw_events(cq, 28) == 28);
    for (int i = 0; i < 29; i++) raw_free(&rd[i]);
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    raw_cq_destroy(cq);
    grpc_channel_destroy(ch);
    ps_rpc_server_free(s);
}

/* A client cancelling a deferred call: on_cancel runs (and finds
 * ps_rpc_call_cancelled() true); the deadline passing on a quiet deferred
 * call makes ps_rpc_call_cancelled() true, and completing it then sends
 * nothing. */
static void test_deferred_cancel(void) {
    ps_rpc_server *s = start_server(2);
    if (!s) return;
    grpc_channel *ch = raw_channel(s);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    int cancels0 = atomic_load(&cancels), seen0 = atomic_load(&cancels_seen_flag);
    int total0 = atomic_load(&def_total);
    raw_call r;
    raw_start(&r, ch, cq, M_DEFER, 1, 77);
    CHECK(WAIT_UNTIL(atomic_load(&def_total) == total0 + 1, WAIT_MS));
    CHECK(atomic_load(&cancels) == cancels0);
    grpc_call_cancel(r.call, NULL);
    CHECK_MSG(WAIT_UNTIL(atomic_load(&cancels) == cancels0 + 1, WAIT_MS), "on_cancel not called");
    CHECK(atomic_load(&cancels_seen_flag) == seen0 + 1);
    CHECK(def_take(77) == NULL);  /* on_cancel took (and completed) it */
    CHECK(raw_events(cq, 2) == 2);
    CHECK_MSG(r.status == GRPC_STATUS_CANCELLED, "%s", ps_grpc_code_name(r.status));
    raw_free(&r);
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));

    /* Deadline on a deferred call without on_cancel. */
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    char details[256];
    grpc_status_code code = step_call(c, M_DEFER_QUIET, 78, 200, details, sizeof details, NULL);
    CHECK_MSG(code == GRPC_STATUS_DEADLINE_EXCEEDED, "%s", ps_grpc_code_name(code));
    ps_rpc_call *h = def_take(78);
    CHECK(h != NULL);
    if (h) {
        CHECK(WAIT_UNTIL(ps_rpc_call_cancelled(h), WAIT_MS));
        CHECK(ps_rpc_call_complete(h, step_response(1), GRPC_STATUS_OK, NULL) == 0);
    }
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    CHECK(atomic_load(&cancels) == cancels0 + 1);
    ps_rpc_client_free(c);
    raw_cq_destroy(cq);
    grpc_channel_destroy(ch);
    ps_rpc_server_free(s);
}

/* Shutdown with 8 deferred calls (6 with on_cancel, 2 quiet) nobody
 * completes: it returns, every client sees CANCELLED or UNAVAILABLE, each
 * on_cancel runs, and the quiet handles stay valid after the server is
 * freed, to be completed once. */
static void test_shutdown_deferred(void) {
    ps_rpc_server *s = start_server(2);
    if (!s) return;
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    int cancels0 = atomic_load(&cancels);
    step_arg a[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (step_arg){c, i < 6 ? M_DEFER : M_DEFER_QUIET, 3000 + (uint64_t)i, WAIT_MS,
                          GRPC_STATUS_UNKNOWN, 0, 0};
        pthread_create(&th[i], NULL, step_thread, &a[i]);
    }
    CHECK(WAIT_UNTIL(atomic_load(&def_count) == 8, WAIT_MS));
    ps_rpc_server_shutdown(s, 100);
    CHECK(atomic_load(&cancels) == cancels0 + 6);
    int failed = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        failed += a[i].code == GRPC_STATUS_CANCELLED || a[i].code == GRPC_STATUS_UNAVAILABLE;
    }
    CHECK_MSG(failed == 8, "%d of 8 clients saw CANCELLED/UNAVAILABLE", failed);
    CHECK(ps_rpc_server_calls(s) == 0);
    ps_rpc_server_free(s);
    for (uint64_t id = 3006; id < 3008; id++) {
        ps_rpc_call *h = def_take(id);
        CHECK(h != NULL);
        CHECK(ps_rpc_call_cancelled(h));
        CHECK(ps_rpc_call_complete(h, step_response(1), GRPC_STATUS_OK, NULL) == 0);
    }
    CHECK(atomic_load(&def_count) == 0);
    ps_rpc_client_free(c);
}

/* Shutdown waits its grace for calls the server works on, not for clients
 * that stall: with one call blocked in its handler (the gate) and one whose
 * request message never comes, the stalled call is cancelled (UNAVAILABLE)
 * while the handler is still blocked and shutdown still
 * waiting, long before its grace (2 x WAIT_MS) is over; the blocked call is
 * answered once its handler returns, and only then does shutdown return. */
typedef struct shut_arg { ps_rpc_server *s; int grace_ms; atomic_int done; } shut_arg;

static void *shutdown_thread(void *p) {
    shut_arg *a = p;
    ps_rpc_server_shutdown(a->s, a->grace_ms);
    atomic_store(&a->done, 1);
    return NULL;
}

static void test_shutdown_stalled_client(void) {
    ps_rpc_server *s = start_server(2);
    if (!s) return;
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    gate_set(0);
    step_arg g = {c, M_GATE, 0, 2 * WAIT_MS, GRPC_STATUS_UNKNOWN, 0, 0};
    pthread_t gth, sth;
    pthread_create(&gth, NULL, step_thread, &g);
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 1, WAIT_MS));
    grpc_channel *ch = raw_channel(s);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    raw_call r;
    raw_start(&r, ch, cq, M_FORWARD, 0, 0);  /* metadata only: its message never comes */
    CHECK(raw_events(cq, 1) == 1);
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 2, WAIT_MS));
    shut_arg sa = {s, 2 * WAIT_MS, 0};
    pthread_create(&sth, NULL, shutdown_thread, &sa);
    /* the stalled call ends (its own deadline, WAIT_MS, is the give-up) */
    CHECK(raw_events(cq, 1) == 1);
    char *d = grpc_slice_to_c_string(r.status_details);
    /* (UNAVAILABLE: "server shutting down: ...", or the transport's "Socket
     * closed" when the connection goes with its last call first; the
     * stalled call's own deadline would give DEADLINE_EXCEEDED) */
    CHECK_MSG(r.status == GRPC_STATUS_UNAVAILABLE, "stalled call at shutdown: %s: %s",
              ps_grpc_code_name(r.status), d);
    gpr_free(d);
    CHECK_MSG(atomic_load(&gate_blocked) == 1 && !atomic_load(&sa.done),
              "the stalled call ended only after the handler returned or shutdown gave up");
    gate_set(1);
    pthread_join(gth, NULL);
    CHECK_MSG(g.code == GRPC_STATUS_OK && g.v == 5, "the call in its handler at shutdown: %s",
              ps_grpc_code_name(g.code));
    pthread_join(sth, NULL);
    raw_free(&r);
    raw_cq_destroy(cq);
    grpc_channel_destroy(ch);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

/* Both ordinary workers blocked in the gate, more calls queued behind them
 * and the ordinary call cap (3) reached: the reserved Ping is answered
 * while the gate is still closed, and a 4th ordinary call is refused with
 * RESOURCE_EXHAUSTED before its message is read. */
static void test_reserved_and_cap(void) {
    ps_rpc_server_opts o = {.threads = 2, .max_calls = 3, .max_calls_per_client = 3, .max_message_bytes = MAX_MSG};
    ps_rpc_server *s = start_server_opts(&o);
    if (!s) return;
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    gate_set(0);
    int passed0 = atomic_load(&gate_passed);
    step_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (step_arg){c, M_GATE, 0, WAIT_MS, GRPC_STATUS_UNKNOWN, 0, 0};
        pthread_create(&th[i], NULL, step_thread, &a[i]);
    }
    /* Two in the gate, one queued, one refused. */
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 2, WAIT_MS));
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 3, WAIT_MS));
    int refused = -1;
    CHECK(WAIT_UNTIL((refused = first_done(a, 4)) >= 0, WAIT_MS));
    if (refused >= 0)
        CHECK_MSG(a[refused].code == GRPC_STATUS_RESOURCE_EXHAUSTED, "%s",
                  ps_grpc_code_name(a[refused].code));
    char details[256];
    uint64_t v = 0;
    /* An admission refusal carries psd's retry hint (rpc.h
     * PS_RPC_RETRY_AFTER_KEY): the call was not read, it may come again. */
    {
        grpc_byte_buffer *resp = NULL;
        grpc_status_code code;
        int hint = -1;
        ps_err err;
        CHECK(ps_rpc_client_call_ex(c, M_GATE, NULL, &resp, WAIT_MS, &code, details, sizeof details, &hint, &err) ==
              PS_OK);
        CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED && hint == PS_RPC_RETRY_AFTER_CALLS_MS, "%s (%s), hint %d",
                  ps_grpc_code_name(code), details, hint);
    }
    for (int i = 0; i < 3; i++) {
        grpc_status_code code = step_call(c, M_PING, 0, WAIT_MS, details, sizeof details, &v);
        CHECK_MSG(code == GRPC_STATUS_OK && v == 7, "ping: %s: %s", ps_grpc_code_name(code), details);
    }
    CHECK(atomic_load(&gate_passed) == passed0 && atomic_load(&gate_blocked) == 2);
    gate_set(1);
    int ok = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ok += a[i].code == GRPC_STATUS_OK && a[i].v == 5;
    }
    CHECK_MSG(ok == 3, "%d of 3 accepted gate calls answered", ok);
    /* Capacity is back once they finished. */
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    CHECK(step_call(c, M_GATE, 0, WAIT_MS, details, sizeof details, &v) == GRPC_STATUS_OK && v == 5);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

/* Refusals come before the request message is read: a client that sends
 * only its metadata is answered UNAUTHENTICATED (no token), and
 * UNIMPLEMENTED (unknown method), instead of waiting for its message. */
static void test_refused_before_message(void) {
    static const ps_rpc_token tok[] = {{"0123456789abcdef-test-token", "trainer", NULL}};
    ps_rpc_security sec = {.tokens = tok, .ntokens = 1};
    ps_rpc_server_opts o = {.threads = 1};
    ps_err err;
    ps_rpc_server *s = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, NMETHODS, NULL, &sec, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (!s) return;
    CHECK(ps_rpc_server_start(s, &err) == PS_OK);
    grpc_channel *ch = raw_channel(s);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    raw_call r;
    raw_start(&r, ch, cq, M_FORWARD, 0, 0);
    CHECK(raw_events(cq, 2) == 2);
    CHECK_MSG(r.status == GRPC_STATUS_UNAUTHENTICATED, "%s", ps_grpc_code_name(r.status));
    raw_free(&r);
    raw_cq_destroy(cq);
    grpc_channel_destroy(ch);
    ps_rpc_server_free(s);

    s = start_server(1);
    if (!s) return;
    ch = raw_channel(s);
    cq = grpc_completion_queue_create_for_next(NULL);
    raw_start(&r, ch, cq, "/test.Test/Nope", 0, 0);
    CHECK(raw_events(cq, 2) == 2);
    CHECK_MSG(r.status == GRPC_STATUS_UNIMPLEMENTED, "%s", ps_grpc_code_name(r.status));
    raw_free(&r);
    CHECK(ps_rpc_server_calls(s) == 0);  /* refused calls are not counted */
    raw_cq_destroy(cq);
    grpc_channel_destroy(ch);
    ps_rpc_server_free(s);
}

/* start_server(threads) with the environment variable name set to value
 * while the server is created (which reads PS_RPC_AFFINITY and
 * PS_RPC_LATE_CLOSE), then as it was */
static ps_rpc_server *start_server_env(const char *name, const char *value, int threads) {
    const char *was = getenv(name);
    char saved[16];
    snprintf(saved, sizeof saved, "%s", was ? was : "");
    setenv(name, value, 1);
    ps_rpc_server *s = start_server(threads);
    if (was) setenv(name, saved, 1);
    else unsetenv(name);
    return s;
}

/* With PS_RPC_AFFINITY=1 (rpc_worker): a connection's calls run on one
 * worker thread while it is free, two connections' on two; a call whose
 * worker is busy (its earlier call blocked in the gate) runs on another at
 * once, and so does another connection's while every other worker is held:
 * no call waits behind another while a worker of its class is idle. */
static void test_affinity(void) {
    ps_rpc_server *s = start_server_env("PS_RPC_AFFINITY", "1", 4);
    if (!s) return;
    /* every worker waiting before the first call: one not yet started on a
     * loaded machine is not idle, and the second connection's first call
     * would then share the first's worker */
    usleep(200 * 1000);
    /* channels with other arguments: connections of their own */
    ps_rpc_client *a = connect_to(s, MAX_MSG), *b = connect_to(s, MAX_MSG - 1);
    char details[256];
    uint64_t ta = 0, tb = 0, v = 0;
    int same_a = 0, same_b = 0, ok = 0;
    for (int i = 0; i < 40; i++) {  /* the two connections' calls interleaved, one at a time */
        ok += step_call(a, M_TID, 0, WAIT_MS, details, sizeof details, &v) == GRPC_STATUS_OK;
        if (i == 0) ta = v;
        same_a += v == ta;
        ok += step_call(b, M_TID, 0, WAIT_MS, details, sizeof details, &v) == GRPC_STATUS_OK;
        if (i == 0) tb = v;
        same_b += v == tb;
    }
    CHECK_MSG(ok == 80, "%d of 80 calls answered", ok);
    CHECK_MSG(same_a == 40 && same_b == 40, "calls on their connection's first thread: %d and %d of 40",
              same_a, same_b);
    CHECK_MSG(ta != tb, "two connections' calls on one thread %llu", (unsigned long long)ta);

    /* a's worker held in the gate: a's next call, and b's, run elsewhere */
    gate_set(0);
    step_arg g[3];
    pthread_t th[3];
    g[0] = (step_arg){a, M_GATE, 0, WAIT_MS, GRPC_STATUS_UNKNOWN, 0, 0};
    pthread_create(&th[0], NULL, step_thread, &g[0]);
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 1, WAIT_MS));
    CHECK(step_call(a, M_TID, 0, WAIT_MS, details, sizeof details, &v) == GRPC_STATUS_OK && v != ta);
    /* two more of a's held: b's call takes the one worker left */
    for (int i = 1; i < 3; i++) {
        g[i] = (step_arg){a, M_GATE, 0, WAIT_MS, GRPC_STATUS_UNKNOWN, 0, 0};
        pthread_create(&th[i], NULL, step_thread, &g[i]);
    }
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 3, WAIT_MS));
    CHECK(step_call(b, M_TID, 0, WAIT_MS, details, sizeof details, &v) == GRPC_STATUS_OK);
    CHECK(atomic_load(&gate_blocked) == 3);   /* answered while a's three were held */
    gate_set(1);
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(g[i].code == GRPC_STATUS_OK && g[i].v == 5, "gate call %d: %s", i, ps_grpc_code_name(g[i].code));
    }
    ps_rpc_client_free(a);
    ps_rpc_client_free(b);
    ps_rpc_server_free(s);
}

/* n Ping calls on c, one at a time, gap_ms apart; how many were answered OK. */
static int pings(ps_rpc_client *c, int n, int gap_ms) {
    char details[256];
    uint64_t v = 0;
    int ok = 0;
    for (int i = 0; i < n; i++) {
        if (gap_ms) usleep((useconds_t)gap_ms * 1000);
        ok += step_call(c, M_PING, 0, WAIT_MS, details, sizeof details, &v) == GRPC_STATUS_OK;
    }
    return ok;
}

/* A call waiting in the FIFO whose client cancels is dropped without
 * running its handler, with PS_RPC_LATE_CLOSE on (the default: the close
 * batch is started only when a call has to wait, rpc_server_impl.h) and
 * off; and calls run at once (their close in the reply batch) are all
 * answered and finished. */
static void test_queued_cancel(int late_close) {
    ps_rpc_server *s = start_server_env("PS_RPC_LATE_CLOSE", late_close ? "1" : "0", 1);
    if (!s) return;
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    int ok = pings(c, 20, 0);
    CHECK_MSG(ok == 20, "late_close %d: %d of 20 calls answered", late_close, ok);
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    /* the one worker held in the gate; a second gate call waits in the FIFO */
    gate_set(0);
    int passed0 = atomic_load(&gate_passed);
    step_arg g = {c, M_GATE, 0, WAIT_MS, GRPC_STATUS_UNKNOWN, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, step_thread, &g);
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 1, WAIT_MS));
    grpc_channel *ch = raw_channel(s);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    raw_call r;
    raw_start(&r, ch, cq, M_GATE, 1, 0);
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 2, WAIT_MS));
    usleep(100 * 1000);   /* its message in, the call queued */
    grpc_call_cancel(r.call, NULL);
    CHECK(raw_events(cq, 2) == 2);
    CHECK_MSG(r.status == GRPC_STATUS_CANCELLED, "%s", ps_grpc_code_name(r.status));
    usleep(200 * 1000);   /* the server sees the cancellation */
    gate_set(1);
    pthread_join(th, NULL);
    CHECK_MSG(g.code == GRPC_STATUS_OK && g.v == 5, "gate call: %s", ps_grpc_code_name(g.code));
    CHECK(WAIT_UNTIL(ps_rpc_server_calls(s) == 0, WAIT_MS));
    CHECK_MSG(atomic_load(&gate_passed) == passed0 + 1, "late_close %d: %d handlers ran, 1 expected (the cancelled "
              "queued call ran)", late_close, atomic_load(&gate_passed) - passed0);
    raw_free(&r);
    raw_cq_destroy(cq);
    grpc_channel_destroy(ch);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

/* server.idle_poll_us (rpc_worker): a worker polls for its next call
 * before it sleeps, and its window adapts. Calls 2 ms apart are caught by
 * the poll (a 50 ms window); calls 150 ms apart shrink the window to
 * nothing within ~11 spells, so a worker whose calls come rarely stops
 * polling (its poll time stays bounded); short spells grow it again. A
 * call that comes while its worker is still finishing the last one is
 * taken without polling at all (a loaded machine makes that common), so
 * the counts below are lower bounds a loaded run still reaches. */
static void test_idle_poll(void) {
    ps_rpc_server_opts o = {.threads = 2, .max_message_bytes = MAX_MSG, .idle_poll_us = 50000};
    ps_rpc_server *s = start_server_opts(&o);
    if (!s) return;
    ps_rpc_client *c = connect_to(s, MAX_MSG);
    usleep(200 * 1000);   /* the workers' first polls, at start, end */
    ps_rpc_admission a0, a1, a2, a3;
    ps_rpc_server_admission(s, &a0);
    CHECK(pings(c, 30, 2) == 30);
    ps_rpc_server_admission(s, &a1);
    CHECK_MSG(a1.polls_hit - a0.polls_hit >= 3, "2 ms apart: %llu of 30 calls caught polling",
              a1.polls_hit - a0.polls_hit);
    CHECK(pings(c, 16, 150) == 16);
    ps_rpc_server_admission(s, &a2);
    unsigned long long missed = a2.polls_missed - a1.polls_missed;
    double polled = a2.poll_s - a1.poll_s;
    CHECK_MSG(missed <= 12, "150 ms apart: %llu of 16 spells polled in vain (the window does not shrink)", missed);
    CHECK_MSG(polled < 0.3, "150 ms apart: %.3f s spent polling (without the halving: 0.4-0.8)", polled);
    CHECK(pings(c, 30, 2) == 30);
    ps_rpc_server_admission(s, &a3);
    CHECK_MSG(a3.polls_hit - a2.polls_hit >= 3, "2 ms apart again: %llu of 30 calls caught polling (the window "
              "does not grow back)", a3.polls_hit - a2.polls_hit);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

int main(void) {
    grpc_init();
    ps_rpc_server *s = start_server(2);
    if (s) {
        test_calls(s);
        test_unreachable_and_bind(s);
        /* Shutdown of an idle server. */
        ps_rpc_server_shutdown(s, 1000);
        ps_rpc_server_free(s);
    }
    test_graceful_shutdown();
    test_forced_shutdown();
    test_defer_frees_worker();
    test_many_deferred();
    test_silent_clients();
    test_stalled_caps();
    test_deferred_cancel();
    test_shutdown_deferred();
    test_shutdown_stalled_client();
    test_reserved_and_cap();
    test_refused_before_message();
    test_affinity();
    test_queued_cancel(1);
    test_queued_cancel(0);
    test_idle_poll();
    grpc_shutdown();
    return check_summary("test_rpc");
}
