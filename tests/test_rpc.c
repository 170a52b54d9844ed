/* test_rpc.c - the generic unary server and client over loopback: normal
 * calls, > 4 MiB messages, error propagation, unknown methods, deadlines,
 * concurrent clients, bind failures and shutdown with calls in flight. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "check.h"
#include "rpc.h"
#include "wire.h"

#define MAX_MSG (16 << 20)
#define M_FORWARD "/ps.ParameterServer/Forward"
#define M_FAIL "/test.Test/Fail"
#define M_SLEEP "/test.Test/Sleep"

static atomic_int sleeps_started;
static atomic_int sleeps_done;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

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

static const ps_rpc_method methods[] = {
    {M_FORWARD, h_forward},
    {M_FAIL, h_fail},
    {M_SLEEP, h_sleep},
};

static ps_rpc_server *start_server(int nthreads) {
    ps_err err;
    ps_rpc_server *s = ps_rpc_server_create("127.0.0.1:0", nthreads, MAX_MSG, methods, 3, NULL, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (!s) return NULL;
    CHECK(ps_rpc_server_port(s) > 0);
    CHECK(ps_rpc_server_start(s, &err) == PS_OK);
    return s;
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

static grpc_status_code sleep_call(ps_rpc_client *c, int ms, int timeout_ms, char *details,
                                   size_t dlen, uint64_t *version) {
    ps_StepRequest req = {.context_id = (uint64_t)ms};
    grpc_byte_buffer *rb = NULL, *resp = NULL;
    ps_err err;
    ps_wire_encode(ps_StepRequest_fields, &req, &rb, &err);
    grpc_status_code code;
    CHECK(ps_rpc_client_call(c, M_SLEEP, rb, &resp, timeout_ms, &code, details, dlen, &err) == PS_OK);
    if (code == GRPC_STATUS_OK) {
        ps_StepResponse r = ps_StepResponse_init_zero;
        CHECK(ps_wire_decode(resp, ps_StepResponse_fields, &r, &err) == PS_OK);
        if (version) *version = r.model_version;
    }
    grpc_byte_buffer_destroy(rb);
    if (resp) grpc_byte_buffer_destroy(resp);
    return code;
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

    /* Deadline shorter than the handler. */
    double t0 = now_ms();
    code = sleep_call(c, 600, 100, details, sizeof details, NULL);
    double dt = now_ms() - t0;
    CHECK_MSG(code == GRPC_STATUS_DEADLINE_EXCEEDED, "%s", ps_grpc_code_name(code));
    CHECK_MSG(dt >= 90 && dt < 450, "deadline call took %.0f ms", dt);
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
    ps_rpc_server *s2 = ps_rpc_server_create(addr, 1, 0, methods, 3, NULL, &err);
    CHECK(s2 == NULL);
    CHECK_MSG(err.code == PS_ERR_UNAVAILABLE && strstr(err.msg, addr), "%s", err.msg);
    ps_rpc_server_free(s2);

    /* Not an address. */
    s2 = ps_rpc_server_create("no-such-host.invalid:zz", 1, 0, methods, 3, NULL, &err);
    CHECK(s2 == NULL);
    CHECK_MSG(strstr(err.msg, "no-such-host.invalid:zz") != NULL, "%s", err.msg);
    s2 = ps_rpc_server_create("127.0.0.1:0", 0, 0, methods, 3, NULL, &err);
    CHECK(s2 == NULL && err.code == PS_ERR_INVALID_ARGUMENT);

    /* Created, never started, freed. */
    s2 = ps_rpc_server_create("127.0.0.1:0", 2, 0, methods, 3, NULL, &err);
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
    double t0 = now_ms();
    ps_rpc_server_shutdown(s, 5000);
    double dt = now_ms() - t0;
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
    double t0 = now_ms();
    ps_rpc_server_shutdown(s, 100);
    double dt = now_ms() - t0;
    pthread_join(th, NULL);
    CHECK_MSG(a.code == GRPC_STATUS_CANCELLED || a.code == GRPC_STATUS_UNAVAILABLE,
              "cancelled call: %s", ps_grpc_code_name(a.code));
    CHECK(atomic_load(&sleeps_done) == 1); /* handler ran to its end */
    CHECK_MSG(dt >= 90 && dt < 3000, "forced shutdown took %.0f ms", dt);
    ps_rpc_server_free(s);
    ps_rpc_client_free(c);
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
    grpc_shutdown();
    return check_summary("test_rpc");
}
