#include "service.h"

#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "health.pb.h"
#include "log.h"
#include "methods.h"
#include "wire.h"

struct ps_service {
    ps_model *model;
    ps_ctx_table *ctx;
    size_t max_tensor_bytes;
    double start;
    uint64_t samples;            /* __atomic */
    uint64_t nonfinite_rejected; /* __atomic */
    uint64_t nonfinite_skipped;  /* __atomic */
    int nonfinite_skip;
    uint64_t trimmed_at;         /* work counter at the last malloc_trim (expire's caller only) */
    char consistency[256];
    int draining;                /* __atomic */
    pthread_mutex_t ckpt_mu;     /* guards ckpt, has_ckpt */
    int has_ckpt;
    ps_ckpt_info ckpt;
};

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

ps_service *ps_service_create(ps_model *model, const ps_service_opts *o, ps_err *err) {
    ps_service *s = calloc(1, sizeof *s);
    if (!s) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
    s->model = model;
    s->ctx = ps_ctx_table_create(o->context_ttl_s, o->max_contexts);
    if (!s->ctx) { free(s); ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
    s->max_tensor_bytes = o->max_message_bytes;
    s->start = mono_now();
    snprintf(s->consistency, sizeof s->consistency, "%s", o->consistency ? o->consistency : "");
    pthread_mutex_init(&s->ckpt_mu, NULL);
    s->nonfinite_skip = o->nonfinite_skip;
    return s;
}

void ps_service_free(ps_service *s) {
    if (!s) return;
    pthread_mutex_destroy(&s->ckpt_mu);
    ps_ctx_table_free(s->ctx);
    free(s);
}

size_t ps_service_expire(ps_service *s) {
    size_t n = ps_ctx_table_expire(s->ctx);
#ifdef __GLIBC__
    /* Hand freed tapes' pages back to the OS: after contexts of vanished
     * trainers expire, and once whenever psd goes idle (no live context)
     * after work, so a burst of load does not stay in psd's RSS. */
    ps_ctx_stats st;
    ps_ctx_table_stats(s->ctx, &st);
    uint64_t work = st.opened + __atomic_load_n(&s->samples, __ATOMIC_RELAXED);
    if (n || (st.live == 0 && work != s->trimmed_at)) {
        malloc_trim(0);
        s->trimmed_at = work;
    }
#endif
    return n;
}

void ps_service_stats(ps_service *s, ps_ctx_stats *ctx, uint64_t *samples) {
    ps_ctx_table_stats(s->ctx, ctx);
    *samples = __atomic_load_n(&s->samples, __ATOMIC_RELAXED);
}

void ps_service_set_draining(ps_service *s) { __atomic_store_n(&s->draining, 1, __ATOMIC_SEQ_CST); }
int ps_service_draining(ps_service *s) { return __atomic_load_n(&s->draining, __ATOMIC_SEQ_CST); }
void ps_service_set_samples(ps_service *s, uint64_t n) { __atomic_store_n(&s->samples, n, __ATOMIC_RELAXED); }
double ps_service_uptime(ps_service *s) { return mono_now() - s->start; }

void ps_service_note_checkpoint(ps_service *s, const ps_ckpt_info *info) {
    pthread_mutex_lock(&s->ckpt_mu);
    s->ckpt = *info;
    s->has_ckpt = 1;
    pthread_mutex_unlock(&s->ckpt_mu);
}

int ps_service_checkpoint(ps_service *s, ps_ckpt_info *out) {
    pthread_mutex_lock(&s->ckpt_mu);
    int has = s->has_ckpt;
    if (has) *out = s->ckpt;
    pthread_mutex_unlock(&s->ckpt_mu);
    return has;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
void ps_service_nonfinite_counts(ps_service *s, uint64_t *rejected, uint64_t *skipped) {
    *rejected = __atomic_load_n(&s->nonfinite_rejected, __ATOMIC_RELAXED);
    *skipped = __atomic_load_n(&s->nonfinite_skipped, __ATOMIC_RELAXED);
}

static void count(uint64_t *c) { __atomic_add_fetch(c, 1, __ATOMIC_RELAXED); }

/* Reply with an error from err. */
static void fail(grpc_status_code *code, char *details, size_t dlen, const ps_err *err) {
    *code = ps_grpc_from_status(err->code);
    snprintf(details, dlen, "%s", err->msg);
}

static void reply(const pb_msgdesc_t *fields, const void *msg, grpc_byte_buffer **response,
                  grpc_status_code *code, char *details, size_t dlen) {
    ps_err err = {0};
    if (ps_wire_encode(fields, msg, response, &err) != PS_OK) fail(code, details, dlen, &err);
}

static ps_status check_finite(const float *x, size_t n, const char *what, ps_err *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: element %zu is %s; inputs must be "
                              "finite", what, i, isnan(x[i]) ? "NaN" : "infinite");
    return PS_OK;
}

/* Are the parameter gradients Backward computed into the tape finite?
 * PS_OK, INVALID_ARGUMENT naming the parameter and element, or another
 * error (out of memory, device copy). */
static ps_status check_grads_finite(ps_service *s, const ps_tape *tape, ps_err *err) {
    int np = ps_model_num_params(s->model);
    int64_t biggest = 0;
    for (int i = 0; i < np; i++)
        if (ps_model_param(s->model, i)->numel > biggest) biggest = ps_model_param(s->model, i)->numel;
    float *buf = malloc((size_t)biggest * sizeof(float));
    if (!buf) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    ps_status st = PS_OK;
    for (int i = 0; i < np && st == PS_OK; i++) {
        const ps_param_info *pi = ps_model_param(s->model, i);
        if ((st = ps_tape_get_grad(s->model, tape, i, buf, err))) break;
        char what[160];
        snprintf(what, sizeof what, "gradient of %s (computed from grad_output)", pi->name);
        st = check_finite(buf, (size_t)pi->numel, what, err);
    }
    free(buf);
    return st;
}

/* A non-finite value reached context c (err says where). Policy reject:
 * refuse; the context is marked only if its tape now holds non-finite
 * gradients (so a later Step is refused too, and a new Backward may
 * replace them). Policy skip: mark it and go on. Returns what the handler should fail with, or
 * PS_OK to continue. */
static ps_status nonfinite(ps_service *s, ps_ctx *c, int tape_tainted, ps_err *err) {
    if (c && (s->nonfinite_skip || tape_tainted)) c->nonfinite = 1;
    if (s->nonfinite_skip) return PS_OK;
    count(&s->nonfinite_rejected);
    return ps_err_prefix(err, "step rejected (server.nonfinite_policy: reject)");
}

/* Finish a marked context without applying its step. */
static uint64_t skip_step(ps_service *s, ps_ctx *c) {
    uint64_t v = ps_model_version(s->model);
    ps_log(PS_LOG_WARN, "context %llx: step skipped: non-finite values (server.nonfinite_policy: skip)",
           (unsigned long long)c->id);
    ps_ctx_table_finish(s->ctx, c, v);  /* frees c */
    count(&s->nonfinite_skipped);
    return v;
}

static void format_shape(char *buf, size_t len, const int64_t *dims, int ndim) {
    size_t o = 0;
    o += snprintf(buf + o, len - o, "(");
    for (int i = 0; i < ndim && o < len; i++)
        o += snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (o < len) snprintf(buf + o, len - o, ")");
}

/* Samples per slice of an inference Forward (see handle_forward). */
#define PS_EVAL_SLICE 64

/* Distinct, reproducible dropout streams per context. */
static uint64_t dropout_seed(uint64_t ctx_id) { return ctx_id * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL; }

static void handle_forward(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                           grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, s->max_tensor_bytes);
    in.err = &err;
    ps_wire_tensor_decode_bind(&req.input, &in);
    float *out = NULL;
    ps_tape *tape = NULL;
    if (ps_service_draining(s)) {
        ps_err_set(&err, PS_ERR_UNAVAILABLE, "psd is shutting down: no new work is accepted (open "
                   "contexts may still finish their Backward and Step); retry when it is back");
        goto fail;
    }
    if (ps_wire_decode(request, ps_ForwardRequest_fields, &req, &err) ||
        (!req.has_input && ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.input is missing")) ||
        ps_wire_tensor_check(&req.input, &in, "ForwardRequest.input", &err))
        goto fail;
    int c, h, w;
    ps_model_input_shape(s->model, &c, &h, &w);
    if (req.input.shape_count != 4 || req.input.shape[1] != c || req.input.shape[2] != h ||
        req.input.shape[3] != w) {
        char got[96];
        format_shape(got, sizeof got, req.input.shape, (int)req.input.shape_count);
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.input: shape %s does not match the "
                   "model's input (N, %d, %d, %d)", got, c, h, w);
        goto fail;
    }
    int64_t n = req.input.shape[0];
    if (n > ps_model_max_batch(s->model)) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.input: batch %lld is larger than "
                   "the maximum %d", (long long)n, ps_model_max_batch(s->model));
        goto fail;
    }
    if (req.train && req.context_id == 0) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.context_id: a training forward "
                   "needs a non-zero context id");
        goto fail;
    }
    int bad_input = 0;
    if (check_finite(in.data, in.bytes / sizeof(float), "ForwardRequest.input", &err)) {
        if (!req.train || !s->nonfinite_skip) {  /* eval: nothing to skip, always refused */
            count(&s->nonfinite_rejected);
            goto fail;
        }
        bad_input = 1;
        ps_err_clear(&err);
    }
    int outsz = ps_model_output_size(s->model);
    out = malloc((size_t)n * outsz * sizeof(float));
    if (!out) { ps_err_set(&err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); goto fail; }
    uint64_t version = 0;
    if (req.train) {
        if (ps_model_forward(s->model, in.data, (int)n, 1, NULL, dropout_seed(req.context_id), out, &tape,
                             &version, &err))
            goto fail;
    } else {
        /* Inference keeps nothing, so it runs in slices: a large evaluation
         * batch then needs the activations of PS_EVAL_SLICE samples at a
         * time instead of all of them (under load, one 500-sample forward
         * per serving thread was most of psd's peak memory). The reported
         * version is the first slice's. */
        const int64_t per = (int64_t)c * h * w;
        for (int64_t o = 0; o < n; o += PS_EVAL_SLICE) {
            int len = (int)(n - o < PS_EVAL_SLICE ? n - o : PS_EVAL_SLICE);
            if (ps_model_forward(s->model, in.data + o * per, len, 0, NULL, 0, out + o * outsz, NULL,
                                 o ? NULL : &version, &err))
                goto fail;
        }
    }
    if (req.train) {
        ps_ctx_table_note_rank(s->ctx, req.trainer_rank);
        if (ps_ctx_table_insert(s->ctx, req.context_id, req.trainer_rank, tape, &err)) goto fail;
        tape = NULL;  /* the table owns it now */
        if (bad_input) {
            ps_ctx *c = ps_ctx_table_acquire(s->ctx, req.context_id, NULL, NULL, &err);
            if (c) {
                c->nonfinite = 1;
                ps_ctx_table_release(s->ctx, c);
            }
        }
        __atomic_add_fetch(&s->samples, (uint64_t)n, __ATOMIC_RELAXED);
    }
    ps_ForwardResponse resp = ps_ForwardResponse_init_zero;
    int64_t dims[2] = {n, outsz};
    resp.has_output = true;
    ps_wire_tensor_encode_bind(&resp.output, NULL, 2, dims, out);
    resp.model_version = version;
    reply(ps_ForwardResponse_fields, &resp, response, code, details, dlen);
    goto done;
fail:
    fail(code, details, dlen, &err);
done:
    ps_tape_free(tape);
    free(out);
    ps_wire_tensor_in_free(&in);
}

static void handle_backward(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                            grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_BackwardRequest req = ps_BackwardRequest_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, s->max_tensor_bytes);
    in.err = &err;
    ps_wire_tensor_decode_bind(&req.grad_output, &in);
    ps_ctx *c = NULL;
    if (ps_wire_decode(request, ps_BackwardRequest_fields, &req, &err) ||
        (!req.has_grad_output && ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "BackwardRequest.grad_output is missing")) ||
        ps_wire_tensor_check(&req.grad_output, &in, "BackwardRequest.grad_output", &err))
        goto fail;
    c = ps_ctx_table_acquire(s->ctx, req.context_id, NULL, NULL, &err);
    if (!c) goto fail;
    int n = ps_tape_batch(c->tape), outsz = ps_model_output_size(s->model);
    if (req.grad_output.shape_count != 2 || req.grad_output.shape[0] != n || req.grad_output.shape[1] != outsz) {
        char got[96];
        format_shape(got, sizeof got, req.grad_output.shape, (int)req.grad_output.shape_count);
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "BackwardRequest.grad_output: shape %s does not match "
                   "the context's output (%d, %d)", got, n, outsz);
        goto fail;
    }
    if (check_finite(in.data, in.bytes / sizeof(float), "BackwardRequest.grad_output", &err)) {
        if (nonfinite(s, c, 0, &err)) goto fail;
    } else if (!(s->nonfinite_skip && c->nonfinite)) {
        if (ps_model_backward(s->model, c->tape, in.data, &err)) goto fail;
        ps_status gs = check_grads_finite(s, c->tape, &err);
        if (gs != PS_OK && gs != PS_ERR_INVALID_ARGUMENT) goto fail;
        c->nonfinite = gs != PS_OK;
        if (gs && nonfinite(s, c, 1, &err)) goto fail;
    }
    c->state = PS_CTX_BACKWARDED;
    ps_BackwardResponse resp = ps_BackwardResponse_init_zero;
    if (req.step && c->nonfinite) {
        resp.model_version = skip_step(s, c);
        resp.skipped = true;
        c = NULL;
    } else if (req.step) {
        uint64_t v;
        if (ps_model_step(s->model, c->tape, &v, &err)) goto fail;
        ps_ctx_table_finish(s->ctx, c, v);
        c = NULL;
        resp.model_version = v;
    } else {
        resp.model_version = ps_model_version(s->model);
    }
    reply(ps_BackwardResponse_fields, &resp, response, code, details, dlen);
    goto done;
fail:
    fail(code, details, dlen, &err);
done:
    if (c) ps_ctx_table_release(s->ctx, c);
    ps_wire_tensor_in_free(&in);
}

/* The model's parameters as a list for the wire: names, shapes, stages and
 * devices, and - with want_data - a host copy of each parameter's weights,
 * or of its gradient in tape when tape is not NULL. The caller frees
 * *items and *buf (both NULL on error). */
static ps_status named_params(ps_service *s, int want_data, const ps_tape *tape, ps_wire_named **items,
                              float **buf, ps_err *err) {
    int np = ps_model_num_params(s->model);
    *items = calloc(np, sizeof **items);
    *buf = want_data ? malloc((size_t)ps_model_num_weights(s->model) * sizeof(float)) : NULL;
    ps_status rc = PS_OK;
    if (!*items || (want_data && !*buf)) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    float *p = *buf;
    for (int i = 0; i < np && rc == PS_OK; i++) {
        const ps_param_info *pi = ps_model_param(s->model, i);
        ps_wire_named *it = &(*items)[i];
        it->name = pi->name;
        it->ndim = pi->ndim;
        memcpy(it->dims, pi->dims, sizeof pi->dims);
        it->device = pi->device;
        it->stage = pi->stage;
        if (!want_data) continue;
        rc = tape ? ps_tape_get_grad(s->model, tape, i, p, err) : ps_model_get_param(s->model, i, p, err);
        it->data = p;
        p += pi->numel;
    }
    if (rc != PS_OK) {
        free(*items);
        free(*buf);
        *items = NULL;
        *buf = NULL;
    }
    return rc;
}

static void handle_get_gradients(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                 grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                 size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_GetGradientsRequest req = ps_GetGradientsRequest_init_zero;
    ps_ctx *c = NULL;
    float *buf = NULL;
    ps_wire_named *items = NULL;
    if (ps_wire_decode(request, ps_GetGradientsRequest_fields, &req, &err)) goto fail;
    c = ps_ctx_table_acquire(s->ctx, req.context_id, NULL, NULL, &err);
    if (!c) goto fail;
    if (!ps_tape_has_grads(c->tape)) {
        ps_err_set(&err, PS_ERR_FAILED_PRECONDITION, "context %llu has no gradients yet (call Backward first)",
                   (unsigned long long)req.context_id);
        goto fail;
    }
    if (named_params(s, 1, c->tape, &items, &buf, &err)) goto fail;
    ps_wire_named_list list = {items, (size_t)ps_model_num_params(s->model)};
    ps_GetGradientsResponse resp = ps_GetGradientsResponse_init_zero;
    ps_wire_tensors_encode_bind(&resp.gradients, &list);
    reply(ps_GetGradientsResponse_fields, &resp, response, code, details, dlen);
    goto done;
fail:
    fail(code, details, dlen, &err);
done:
    if (c) ps_ctx_table_release(s->ctx, c);
    free(items);
    free(buf);
}

static void handle_step(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                        grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_StepRequest req = ps_StepRequest_init_zero;
    ps_StepResponse resp = ps_StepResponse_init_zero;
    ps_ctx *c = NULL;
    if (ps_wire_decode(request, ps_StepRequest_fields, &req, &err)) goto fail;
    int finished = 0;
    uint64_t v = 0;
    c = ps_ctx_table_acquire(s->ctx, req.context_id, &finished, &v, &err);
    if (!c && finished) {   /* a retried Step: answer what the first one did */
        resp.model_version = v;
        reply(ps_StepResponse_fields, &resp, response, code, details, dlen);
        return;
    }
    if (!c) goto fail;
    if (c->nonfinite && (c->state == PS_CTX_BACKWARDED || ps_tape_has_grads(c->tape))) {
        if (!s->nonfinite_skip) {
            count(&s->nonfinite_rejected);
            ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "context %llu has non-finite gradients; step "
                       "rejected (server.nonfinite_policy: reject)", (unsigned long long)req.context_id);
            goto fail;
        }
        resp.model_version = skip_step(s, c);
        resp.skipped = true;
        reply(ps_StepResponse_fields, &resp, response, code, details, dlen);
        return;
    }
    if (!ps_tape_has_grads(c->tape)) {
        ps_err_set(&err, PS_ERR_FAILED_PRECONDITION, "context %llu has no gradients to apply (call "
                   "Backward first)", (unsigned long long)req.context_id);
        goto fail;
    }
    if (ps_model_step(s->model, c->tape, &v, &err)) goto fail;
    ps_ctx_table_finish(s->ctx, c, v);
    c = NULL;
    resp.model_version = v;
    reply(ps_StepResponse_fields, &resp, response, code, details, dlen);
    return;
fail:
    if (c) ps_ctx_table_release(s->ctx, c);
    fail(code, details, dlen, &err);
}

static void handle_list_parameters(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                   grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                   size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_ListParametersRequest req = ps_ListParametersRequest_init_zero;
    if (ps_wire_decode(request, ps_ListParametersRequest_fields, &req, &err)) {
        fail(code, details, dlen, &err);
        return;
    }
    ps_wire_named *items;
    float *none;
    if (named_params(s, 0, NULL, &items, &none, &err)) {
        fail(code, details, dlen, &err);
        return;
    }
    ps_wire_named_list list = {items, (size_t)ps_model_num_params(s->model)};
    ps_ListParametersResponse resp = ps_ListParametersResponse_init_zero;
    ps_wire_params_encode_bind(&resp.parameters, &list);
    snprintf(resp.model, sizeof resp.model, "%s", ps_model_arch(s->model));
    reply(ps_ListParametersResponse_fields, &resp, response, code, details, dlen);
    free(items);
}

static void handle_get_parameters(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                  grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                  size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_GetParametersRequest req = ps_GetParametersRequest_init_zero;
    float *buf = NULL;
    ps_wire_named *items = NULL;
    if (ps_wire_decode(request, ps_GetParametersRequest_fields, &req, &err)) goto fail;
    ps_GetParametersResponse resp = ps_GetParametersResponse_init_zero;
    resp.model_version = ps_model_version(s->model);
    if (named_params(s, 1, NULL, &items, &buf, &err)) goto fail;
    ps_wire_named_list list = {items, (size_t)ps_model_num_params(s->model)};
    ps_wire_tensors_encode_bind(&resp.parameters, &list);
    reply(ps_GetParametersResponse_fields, &resp, response, code, details, dlen);
    goto done;
fail:
    fail(code, details, dlen, &err);
done:
    free(items);
    free(buf);
}

static void handle_status(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                          grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_StatusRequest req = ps_StatusRequest_init_zero;
    if (ps_wire_decode(request, ps_StatusRequest_fields, &req, &err)) {
        fail(code, details, dlen, &err);
        return;
    }
    ps_StatusResponse resp = ps_StatusResponse_init_zero;
    ps_ctx_stats st;
    uint64_t samples;
    ps_service_stats(s, &st, &samples);
    snprintf(resp.version, sizeof resp.version, "%s", PS_VERSION);
    snprintf(resp.model, sizeof resp.model, "%s", ps_model_arch(s->model));
    resp.uptime_s = mono_now() - s->start;
    resp.model_version = ps_model_version(s->model);
    resp.live_contexts = st.live;
    resp.expired_contexts = st.expired;
    resp.trainers_seen = st.trainers_seen;
    resp.samples = samples;
    snprintf(resp.consistency, sizeof resp.consistency, "%s", s->consistency);
    ps_ckpt_info ck;
    resp.checkpoint_age_s = -1;
    if (ps_service_checkpoint(s, &ck)) {
        resp.last_checkpoint_step = ck.version;
        resp.checkpoint_age_s = wall_now() - ck.time;
        snprintf(resp.last_checkpoint, sizeof resp.last_checkpoint, "%.*s",
                 (int)sizeof resp.last_checkpoint - 1, ck.path);
    }
    resp.draining = ps_service_draining(s) != 0;
    snprintf(resp.nonfinite_policy, sizeof resp.nonfinite_policy, "%s", s->nonfinite_skip ? "skip" : "reject");
    ps_service_nonfinite_counts(s, &resp.nonfinite_rejected, &resp.nonfinite_skipped);
    reply(ps_StatusResponse_fields, &resp, response, code, details, dlen);
}

/* grpc.health.v1.Health/Check */
static void handle_health_check(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    grpc_health_v1_HealthCheckRequest req = grpc_health_v1_HealthCheckRequest_init_zero;
    if (ps_wire_decode(request, grpc_health_v1_HealthCheckRequest_fields, &req, &err)) {
        fail(code, details, dlen, &err);
        return;
    }
    if (req.service[0] && strcmp(req.service, "ps.ParameterServer")) {
        ps_err_set(&err, PS_ERR_NOT_FOUND, "HealthCheckRequest.service: unknown service '%s' (psd serves "
                   "\"\" and \"ps.ParameterServer\")", req.service);
        fail(code, details, dlen, &err);
        return;
    }
    grpc_health_v1_HealthCheckResponse resp = grpc_health_v1_HealthCheckResponse_init_zero;
    resp.status = ps_service_draining(s) ? grpc_health_v1_HealthCheckResponse_ServingStatus_NOT_SERVING
                                         : grpc_health_v1_HealthCheckResponse_ServingStatus_SERVING;
    reply(grpc_health_v1_HealthCheckResponse_fields, &resp, response, code, details, dlen);
}

/* Handlers by method id; paths and descriptors come from common/methods.c. */
static const ps_rpc_handler handlers[PS_M_COUNT] = {
    [PS_M_FORWARD] = handle_forward,
    [PS_M_BACKWARD] = handle_backward,
    [PS_M_GET_GRADIENTS] = handle_get_gradients,
    [PS_M_STEP] = handle_step,
    [PS_M_LIST_PARAMETERS] = handle_list_parameters,
    [PS_M_GET_PARAMETERS] = handle_get_parameters,
    [PS_M_STATUS] = handle_status,
    [PS_M_HEALTH_CHECK] = handle_health_check,
};

static ps_rpc_method methods[PS_M_COUNT];
static pthread_once_t methods_once = PTHREAD_ONCE_INIT;

static void methods_fill(void) {
    for (int i = 0; i < PS_M_COUNT; i++) {
        methods[i].path = ps_method((ps_method_id)i)->path;
        methods[i].fn = handlers[i];
        methods[i].reserved = ps_method((ps_method_id)i)->reserved;  /* rpc.h: own workers */
    }
}

const ps_rpc_method *ps_service_methods(int *n) {
    pthread_once(&methods_once, methods_fill);
    *n = PS_M_COUNT;
    return methods;
}
