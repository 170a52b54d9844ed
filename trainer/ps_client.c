/* ps_client.c - the trainer's typed client of psd (ps_client.h): each call
 * encodes its request, calls the method's path from the method table
 * (methods.h) and decodes the reply or names what psd refused. */
#include "ps_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pb_encode.h>

#include "methods.h"
#include "retry.h"
#include "rpc.h"

struct ps_client {
    ps_rpc_client *rpc;
    int timeout_ms;
    size_t max_bytes;
    int tls, client_cert;   /* how it dials: for the hints on a connection psd closed */
    char target[256];
    ps_retry *busy;         /* backoff after psd's admission refusals; NULL: they are final */
};

ps_client *ps_client_create(const char *target, int timeout_ms, int max_message_bytes, ps_err *err) {
    return ps_client_create_secure(target, timeout_ms, max_message_bytes, NULL, err);
}

ps_client *ps_client_create_secure(const char *target, int timeout_ms, int max_message_bytes,
                                   const ps_rpc_security *sec, ps_err *err) {
    ps_client *c = calloc(1, sizeof *c);
    if (!c) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
    c->rpc = ps_rpc_client_create_secure(target, max_message_bytes, sec, err);
    if (!c->rpc) { free(c); return NULL; }
    c->timeout_ms = timeout_ms;
    c->max_bytes = (size_t)max_message_bytes;
    c->tls = sec && sec->tls;
    c->client_cert = sec && sec->cert_file && sec->cert_file[0];
    snprintf(c->target, sizeof c->target, "%s", target);
    return c;
}

void ps_client_free(ps_client *c) {
    if (!c) return;
    ps_rpc_client_free(c->rpc);
    free(c->busy);
    free(c);
}

ps_status ps_client_set_busy_retry(ps_client *c, const ps_retry_policy *p, ps_err *err) {
    if (!c->busy && !(c->busy = malloc(sizeof *c->busy)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    ps_retry_init(c->busy, p);
    return PS_OK;
}

long ps_client_busy_retries(const ps_client *c) { return c && c->busy ? c->busy->total : 0; }

const char *ps_client_target(const ps_client *c) { return c->target; }

/* One try of method with the encoded request rq; decode the reply into
 * resp. An admission refusal carries psd's hint in err->retry_after_ms. */
static ps_status call_once(ps_client *c, const ps_method_desc *m, const grpc_byte_buffer *rq, void *resp,
                           int timeout_ms, ps_err *err) {
    grpc_byte_buffer *rs = NULL;
    grpc_status_code code;
    char details[PS_RPC_DETAILS_MAX] = "";
    int retry_ms = 0;
    ps_status rc = ps_rpc_client_call_ex(c->rpc, m->path, rq, &rs, timeout_ms, &code, details, sizeof details,
                                         &retry_ms, err);
    const char *short_name = m->name;
    if (rc) return ps_err_prefix(err, "%s", short_name);
    if (code != GRPC_STATUS_OK) {
        if (rs) grpc_byte_buffer_destroy(rs);
        /* A plaintext client of a TLS psd, or a TLS client without a certificate of a psd that wants
         * one, hears only "Socket closed" (psd drops the connection in its handshake): on the calls
         * that connect and monitor, say what may be wrong. */
        const char *hint = "";
        if (code == GRPC_STATUS_UNAVAILABLE && (m->id == PS_M_LIST_PARAMETERS || m->id == PS_M_STATUS) &&
            strstr(details, "Socket closed")) {
            if (!c->tls)
                hint = " (this client dials plaintext: if psd serves TLS, set security.tls: true and security.ca)";
            else if (!c->client_cert)
                hint = " (this client sends no certificate: if psd requires one (security.mutual_tls), set "
                       "security.client_cert and security.client_key)";
        }
        rc = ps_err_set(err, ps_status_from_grpc(code), "%s to %s failed: %s: %s%s", short_name, c->target,
                        ps_grpc_code_name(code), details[0] ? details : "(no details)", hint);
        ps_err_retry_after(err, retry_ms);
        return rc;
    }
    rc = ps_wire_decode(rs, m->response, resp, err);
    if (rs) grpc_byte_buffer_destroy(rs);
    if (rc) ps_err_prefix(err, "%s reply", short_name);
    return rc;
}

/* Encode req, call method, decode the reply into resp (callbacks bound by
 * the caller). A call psd refused for its admission limits did nothing
 * there: with a busy policy it is sent again as it is after a backoff (at
 * least psd's hint), within the policy's budget (ps_retry_busy). */
static ps_status call(ps_client *c, ps_method_id id, const void *req, void *resp, ps_err *err) {
    const ps_method_desc *m = ps_method(id);
    grpc_byte_buffer *rq = NULL;
    ps_err local;
    if (!err) err = &local;
    ps_status rc = ps_wire_encode(m->request, req, &rq, err);
    if (rc) return rc;
    if (c->busy) ps_retry_reset(c->busy);
    while ((rc = call_once(c, m, rq, resp, c->timeout_ms, err)) && c->busy && ps_retry_busy(err) &&
           ps_retry_wait_busy(c->busy, m->name, err)) {}
    grpc_byte_buffer_destroy(rq);
    return rc;
}

ps_status ps_client_forward(ps_client *c, uint64_t ctx, uint32_t rank, int train, const float *x, int n,
                            int ch, int h, int w, float *out, int64_t out_cap, int64_t *out_cols,
                            uint64_t *version, ps_err *err) {
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    req.context_id = ctx;
    req.train = train != 0;
    req.trainer_rank = rank;
    req.has_input = true;
    int64_t dims[4] = {n, ch, h, w};
    ps_wire_tensor_encode_bind(&req.input, NULL, 4, dims, x);
    ps_ForwardResponse resp = ps_ForwardResponse_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, c->max_bytes);
    in.err = err;
    ps_wire_tensor_decode_bind(&resp.output, &in);
    ps_status rc = call(c, PS_M_FORWARD, &req, &resp, err);
    if (rc == PS_OK) rc = ps_wire_tensor_check(&resp.output, &in, "ForwardResponse.output", err);
    if (rc == PS_OK && (resp.output.shape_count != 2 || resp.output.shape[0] != n ||
                        resp.output.shape[0] * resp.output.shape[1] > out_cap))
        rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Forward reply: output has an unexpected shape");
    if (rc == PS_OK) {
        memcpy(out, in.data, in.bytes);
        if (out_cols) *out_cols = resp.output.shape[1];
        if (version) *version = resp.model_version;
    }
    ps_wire_tensor_in_free(&in);
    return rc;
}

ps_status ps_client_backward(ps_client *c, uint64_t ctx, const float *grad, int n, int cols, int step,
                             uint64_t *version, ps_err *err) {
    ps_BackwardRequest req = ps_BackwardRequest_init_zero;
    req.context_id = ctx;
    req.step = step != 0;
    req.has_grad_output = true;
    int64_t dims[2] = {n, cols};
    ps_wire_tensor_encode_bind(&req.grad_output, NULL, 2, dims, grad);
    ps_BackwardResponse resp = ps_BackwardResponse_init_zero;
    ps_status rc = call(c, PS_M_BACKWARD, &req, &resp, err);
    if (rc == PS_OK && version) *version = resp.model_version;
    return rc;
}

ps_status ps_client_step(ps_client *c, uint64_t ctx, uint64_t *version, ps_err *err) {
    ps_StepRequest req = ps_StepRequest_init_zero;
    req.context_id = ctx;
    ps_StepResponse resp = ps_StepResponse_init_zero;
    ps_status rc = call(c, PS_M_STEP, &req, &resp, err);
    if (rc == PS_OK && version) *version = resp.model_version;
    return rc;
}

ps_status ps_client_get_gradients(ps_client *c, uint64_t ctx, ps_wire_tensor_list *list, ps_err *err) {
    return ps_client_get_gradients_paged(c, ctx, 0, list, err);
}

ps_status ps_client_list_parameters(ps_client *c, ps_wire_param_list *list, char *model, size_t model_len,
                                    ps_err *err) {
    ps_ListParametersRequest req = ps_ListParametersRequest_init_zero;
    ps_ListParametersResponse resp = ps_ListParametersResponse_init_zero;
    ps_wire_param_list_init(list, 4096);
    list->err = err;
    ps_wire_params_decode_bind(&resp.parameters, list);
    ps_status rc = call(c, PS_M_LIST_PARAMETERS, &req, &resp, err);
    if (rc == PS_OK && model) snprintf(model, model_len, "%s", resp.model);
    return rc;
}

ps_status ps_client_list_stages(ps_client *c, ps_StageInfo *out, int cap, int *n, ps_err *err) {
    ps_ListParametersRequest req = ps_ListParametersRequest_init_zero;
    ps_ListParametersResponse resp = ps_ListParametersResponse_init_zero; /* parameters unbound: skipped */
    *n = 0;
    ps_status rc = call(c, PS_M_LIST_PARAMETERS, &req, &resp, err);
    if (rc) return rc;
    for (pb_size_t i = 0; i < resp.stages_count && *n < cap; i++) out[(*n)++] = resp.stages[i];
    return PS_OK;
}

ps_status ps_client_get_parameters(ps_client *c, ps_wire_tensor_list *list, uint64_t *version, ps_err *err) {
    return ps_client_get_stage_parameters(c, NULL, list, version, err);
}

ps_status ps_client_status(ps_client *c, ps_StatusResponse *out, ps_err *err) {
    ps_StatusRequest req = ps_StatusRequest_init_zero;
    *out = (ps_StatusResponse)ps_StatusResponse_init_zero;
    return call(c, PS_M_STATUS, &req, out, err);
}

/* ---- stage-addressed, typed, multi-forward calls ---------------------------- */

ps_status ps_client_train_step(ps_client *c, ps_client_fwd *f, double *loss, uint64_t *version, ps_err *err) {
    f->step = 1;
    f->skip_input_grad = 1;
    ps_client_fwd_out o = {0};
    ps_status st = ps_client_forward_ex(c, f, &o, err);
    if (st) return st;
    if (o.step_version == 0 && !o.skipped)   /* a step leaves version >= 1: psd ignored step (an older psd) */
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "psd answered a one-call Forward without stepping it "
                          "(a psd older than one call a batch?); run ps-train with --split-calls");
    *loss = o.loss;
    *version = o.step_version;
    return PS_OK;
}

static void bind_tensor(ps_Tensor *t, const ps_client_tensor *x) {
    ps_wire_tensor_encode_bind_typed(t, NULL, x->ndim, x->dims, x->data, x->dtype);
}

ps_status ps_client_forward_ex(ps_client *c, const ps_client_fwd *f, ps_client_fwd_out *o, ps_err *err) {
    ps_ForwardRequest req = ps_ForwardRequest_init_zero;
    req.context_id = f->ctx;
    req.seq = f->seq;
    req.trainer_rank = f->rank;
    req.train = f->train != 0;
    if (f->stage) snprintf(req.stage, sizeof req.stage, "%s", f->stage);
    if (f->last_stage) snprintf(req.last_stage, sizeof req.last_stage, "%s", f->last_stage);
    req.has_input = true;
    bind_tensor(&req.input, &f->input);
    int fused = f->targets.data != NULL;
    if (fused) {
        req.has_targets = true;
        bind_tensor(&req.targets, &f->targets);
        req.want_grad_sq_norm = f->want_sq_norm != 0;
    }
    req.step = f->step != 0;  /* without targets psd refuses them, naming the field */
    req.skip_input_grad = f->skip_input_grad != 0;
    ps_ForwardResponse resp = ps_ForwardResponse_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, c->max_bytes);
    in.err = err;
    ps_wire_tensor_decode_bind(fused ? &resp.input_grad : &resp.output, &in);
    ps_status rc = call(c, PS_M_FORWARD, &req, &resp, err);
    if (rc == PS_OK && fused) {
        if (resp.has_input_grad && o->input_grad) {
            rc = ps_wire_tensor_check(&resp.input_grad, &in, "ForwardResponse.input_grad", err);
            if (rc == PS_OK && in.bytes > (size_t)o->input_grad_cap * sizeof(float))
                rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Forward reply: input gradient of %zu bytes does "
                                "not fit %lld floats", in.bytes, (long long)o->input_grad_cap);
            if (rc == PS_OK) memcpy(o->input_grad, in.data, in.bytes);
        }
        if (rc == PS_OK) {
            o->loss = resp.loss;
            o->sq_norm = resp.grad_sq_norm;
            o->version = resp.model_version;
            o->round = resp.round;
            o->replayed = resp.replayed;
            o->step_version = resp.step_version;
            o->skipped = resp.skipped;
            o->ndim = 0;
        }
        ps_wire_tensor_in_free(&in);
        return rc;
    }
    if (rc == PS_OK) rc = ps_wire_tensor_check(&resp.output, &in, "ForwardResponse.output", err);
    if (rc == PS_OK && (resp.output.dtype != ps_DType_FLOAT32 || in.bytes > (size_t)o->out_cap * sizeof(float)))
        rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Forward reply: output of %zu bytes does not fit %lld floats",
                        in.bytes, (long long)o->out_cap);
    if (rc == PS_OK) {
        memcpy(o->out, in.data, in.bytes);
        o->ndim = (int)resp.output.shape_count;
        memcpy(o->dims, resp.output.shape, sizeof(int64_t) * resp.output.shape_count);
        o->version = resp.model_version;
        o->round = resp.round;
        o->replayed = resp.replayed;
    }
    ps_wire_tensor_in_free(&in);
    return rc;
}

/* Encodes more_grad_outputs from the client tensors 1..n-1. */
typedef struct more_grads {
    const ps_client_tensor *t;
    int n;
} more_grads;

static bool more_grads_encode(pb_ostream_t *stream, const pb_field_t *field, void *const *arg) {
    const more_grads *m = *arg;
    for (int i = 0; i < m->n; i++) {
        ps_Tensor t = ps_Tensor_init_zero;
        bind_tensor(&t, &m->t[i]);
        if (!pb_encode_tag_for_field(stream, field) || !pb_encode_submessage(stream, ps_Tensor_fields, &t))
            return false;
    }
    return true;
}

ps_status ps_client_backward_ex(ps_client *c, const ps_client_bwd *b, ps_client_step_out *o, ps_err *err) {
    if (b->n < 1 || b->n - 1 > (int)(sizeof ((ps_BackwardRequest *)0)->more_seqs / sizeof(uint32_t)))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Backward: %d forwards in one call (1..4097)", b->n);
    ps_BackwardRequest req = ps_BackwardRequest_init_zero;
    req.context_id = b->ctx;
    req.seq = b->seqs[0];
    req.has_grad_output = true;
    bind_tensor(&req.grad_output, &b->grads[0]);
    req.more_seqs_count = (pb_size_t)(b->n - 1);
    for (int i = 1; i < b->n; i++) req.more_seqs[i - 1] = b->seqs[i];
    more_grads mg = {b->grads + 1, b->n - 1};
    req.more_grad_outputs.funcs.encode = more_grads_encode;
    req.more_grad_outputs.arg = &mg;
    req.want_input_grad = b->input_grads != NULL;
    req.step = b->step != 0;
    req.round = b->round;
    if (b->nscalars < 0 || b->nscalars > (int)(sizeof req.scalars / sizeof req.scalars[0]))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Backward: %d scalars, at most %d", b->nscalars,
                          (int)(sizeof req.scalars / sizeof req.scalars[0]));
    for (int i = 0; i < b->nscalars; i++) {
        if (strlen(b->scalars[i].name) >= sizeof req.scalars[i].name)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Backward: scalar name '%s' is too long", b->scalars[i].name);
        snprintf(req.scalars[i].name, sizeof req.scalars[i].name, "%s", b->scalars[i].name);
        req.scalars[i].value = b->scalars[i].value;
    }
    req.scalars_count = (pb_size_t)b->nscalars;
    ps_BackwardResponse resp = ps_BackwardResponse_init_zero;
    ps_wire_tensor_list gl;
    ps_wire_tensor_list_init(&gl, c->max_bytes);
    gl.err = err;
    ps_wire_tensors_decode_bind(&resp.input_grads, &gl);
    ps_status rc = call(c, PS_M_BACKWARD, &req, &resp, err);
    if (rc == PS_OK && b->input_grads) {
        if (gl.n != (size_t)b->n)
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Backward reply: %zu input gradients for %d forwards",
                            gl.n, b->n);
        for (size_t i = 0; rc == PS_OK && i < gl.n; i++) {
            if (gl.items[i].bytes > (size_t)b->input_caps[i] * sizeof(float))
                rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Backward reply: input gradient %zu does not fit", i);
            else
                memcpy(b->input_grads[i], gl.items[i].data, gl.items[i].bytes);
        }
    }
    if (rc == PS_OK && o)
        *o = (ps_client_step_out){resp.model_version, resp.round, 0, resp.skipped, resp.grad_sq_norm};
    ps_wire_tensor_list_free(&gl);
    return rc;
}

ps_status ps_client_step_ex(ps_client *c, uint64_t ctx, uint64_t round, ps_client_step_out *o, ps_err *err) {
    return ps_client_step_scalars(c, ctx, round, NULL, 0, o, NULL, err);
}

ps_status ps_client_step_scalars(ps_client *c, uint64_t ctx, uint64_t round, const ps_client_scalar *sc, int n,
                                 ps_client_step_out *o, ps_client_round *rep, ps_err *err) {
    return ps_client_step_full(c, ctx, round, 0.0f, sc, n, o, rep, err);
}

ps_status ps_client_step_full(ps_client *c, uint64_t ctx, uint64_t round, float grad_scale, const ps_client_scalar *sc,
                              int n, ps_client_step_out *o, ps_client_round *rep, ps_err *err) {
    ps_StepRequest req = ps_StepRequest_init_zero;
    req.context_id = ctx;
    req.round = round;
    req.grad_scale = grad_scale;
    if (n < 0 || n > (int)(sizeof req.scalars / sizeof req.scalars[0]))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Step: %d scalars, at most %d", n,
                          (int)(sizeof req.scalars / sizeof req.scalars[0]));
    for (int i = 0; i < n; i++) {
        if (strlen(sc[i].name) >= sizeof req.scalars[i].name)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "Step: scalar name '%s' is too long", sc[i].name);
        snprintf(req.scalars[i].name, sizeof req.scalars[i].name, "%s", sc[i].name);
        req.scalars[i].value = sc[i].value;
    }
    req.scalars_count = (pb_size_t)n;
    ps_StepResponse resp = ps_StepResponse_init_zero;
    ps_status rc = call(c, PS_M_STEP, &req, &resp, err);
    if (rc == PS_OK && o) *o = (ps_client_step_out){resp.model_version, resp.round, resp.round_contexts, resp.skipped};
    if (rc == PS_OK && rep) {
        memset(rep, 0, sizeof *rep);
        rep->metrics_round = resp.metrics_round;
        rep->solved = resp.solved;
        for (pb_size_t i = 0; i < resp.round_scalars_count && i < PS_CLIENT_MAX_SCALARS; i++) {
            const ps_RoundScalar *r = &resp.round_scalars[i];
            ps_client_round_scalar *d = &rep->s[rep->n++];
            snprintf(d->name, sizeof d->name, "%s", r->name);
            d->count = r->count;
            d->min = r->min, d->mean = r->mean, d->max = r->max, d->ema = r->ema;
        }
    }
    return rc;
}

ps_status ps_client_step_scaled(ps_client *c, uint64_t ctx, uint64_t round, float grad_scale, ps_client_step_out *o,
                                ps_err *err) {
    return ps_client_step_full(c, ctx, round, grad_scale, NULL, 0, o, NULL, err);
}

/* Append page item it (first row r0 of its parameter) to out: a new tensor,
 * or the rows that continue out's last one. Takes it->data. */
static ps_status page_append(ps_wire_tensor_list *out, ps_wire_tensor *it, int64_t r0, const char *what, ps_err *err) {
    if (r0 == 0) {
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 16;
            ps_wire_tensor *n = realloc(out->items, cap * sizeof *n);
            if (!n) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's tensors", what);
            out->items = n;
            out->cap = cap;
        }
        out->items[out->n++] = *it;
        out->total_bytes += it->bytes;
        it->data = NULL;
        return PS_OK;
    }
    ps_wire_tensor *last = out->n ? &out->items[out->n - 1] : NULL;
    if (!last || strcmp(last->name, it->name) || last->dims[0] != r0 || last->ndim != it->ndim)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s reply: rows from %lld of %s do not continue the "
                          "previous page", what, (long long)r0, it->name);
    void *d = NULL;
    if (posix_memalign(&d, 64, last->bytes + it->bytes + 1) != 0)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s", it->name);
    memcpy(d, last->data, last->bytes);
    memcpy((char *)d + last->bytes, it->data, it->bytes);
    free(last->data);
    last->data = d;
    last->bytes += it->bytes;
    last->dims[0] += it->dims[0];
    out->total_bytes += it->bytes;
    return PS_OK;
}

/* A paged read (GetParameters, GetGradients): the request and its paging
 * fields, and the reply's, which fetch_pages resets before each page. */
typedef struct paged {
    int method;
    const char *what;           /* "GetParameters", for errors */
    void *req;
    uint32_t *first;
    int64_t *first_row;
    void *resp;
    const void *resp_init;
    size_t resp_size;
    pb_callback_t *tensors;
    bool *more;
    uint32_t *next;
    int64_t *next_row;
    pb_size_t *first_rows_count;
    const int64_t *first_rows;
} paged;

/* Every page of p into list, tensors cut between pages put back together.
 * on_page (may be NULL) sees each reply after it was decoded. A psd
 * without paging sends no first_rows and no `more`: whole tensors. */
static ps_status fetch_pages(ps_client *c, const paged *p, ps_wire_tensor_list *list,
                             void (*on_page)(const void *resp, int first_page, void *arg), void *arg, ps_err *err) {
    ps_wire_tensor_list_init(list, c->max_bytes);
    ps_status rc = PS_OK;
    for (int page_no = 0;; page_no++) {
        memcpy(p->resp, p->resp_init, p->resp_size);
        ps_wire_tensor_list page;
        ps_wire_tensor_list_init(&page, c->max_bytes);
        page.err = err;
        ps_wire_tensors_decode_bind(p->tensors, &page);
        rc = call(c, p->method, p->req, p->resp, err);
        if (rc != PS_OK && page_no)
            ps_err_prefix(err, "%s page %d (from tensor %u row %lld)", p->what, page_no + 1, (unsigned)*p->first,
                          (long long)*p->first_row);
        if (rc == PS_OK && *p->first_rows_count != page.n && (*p->first_rows_count || *p->more))
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s reply: %zu tensors, %u first_rows", p->what, page.n,
                            (unsigned)*p->first_rows_count);
        for (size_t i = 0; rc == PS_OK && i < page.n; i++)
            rc = page_append(list, &page.items[i], *p->first_rows_count ? p->first_rows[i] : 0, p->what, err);
        ps_wire_tensor_list_free(&page);
        if (rc != PS_OK) break;
        if (on_page) on_page(p->resp, page_no == 0, arg);
        if (!*p->more) break;
        if (*p->next < *p->first || (*p->next == *p->first && *p->next_row <= *p->first_row)) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s reply: paging does not advance", p->what);
            break;
        }
        *p->first = *p->next;
        *p->first_row = *p->next_row;
    }
    if (rc != PS_OK) ps_wire_tensor_list_free(list);
    return rc;
}

static void params_version(const void *resp, int first_page, void *arg) {
    if (first_page && arg) *(uint64_t *)arg = ((const ps_GetParametersResponse *)resp)->model_version;
}

ps_status ps_client_get_stage_parameters(ps_client *c, const char *stage, ps_wire_tensor_list *list,
                                         uint64_t *version, ps_err *err) {
    ps_GetParametersRequest req = ps_GetParametersRequest_init_zero;
    snprintf(req.stage, sizeof req.stage, "%s", stage ? stage : "");
    static const ps_GetParametersResponse init = ps_GetParametersResponse_init_zero;
    ps_GetParametersResponse resp;
    paged p = {PS_M_GET_PARAMETERS, "GetParameters", &req, &req.first, &req.first_row, &resp, &init, sizeof resp,
               &resp.parameters, &resp.more, &resp.next, &resp.next_row, &resp.first_rows_count, resp.first_rows};
    return fetch_pages(c, &p, list, params_version, version, err);
}

ps_status ps_client_get_gradients_paged(ps_client *c, uint64_t ctx, uint64_t max_bytes, ps_wire_tensor_list *list,
                                        ps_err *err) {
    ps_GetGradientsRequest req = ps_GetGradientsRequest_init_zero;
    req.context_id = ctx;
    req.max_bytes = max_bytes;
    static const ps_GetGradientsResponse init = ps_GetGradientsResponse_init_zero;
    ps_GetGradientsResponse resp;
    paged p = {PS_M_GET_GRADIENTS, "GetGradients", &req, &req.first, &req.first_row, &resp, &init, sizeof resp,
               &resp.gradients, &resp.more, &resp.next, &resp.next_row, &resp.first_rows_count, resp.first_rows};
    return fetch_pages(c, &p, list, NULL, NULL, err);
}

ps_status ps_client_push_gradients(ps_client *c, uint64_t ctx, uint32_t rank, int context_known,
                                   const ps_wire_named *items, size_t n, double *sq_norm, ps_err *err) {
    ps_PushGradientsRequest req = ps_PushGradientsRequest_init_zero;
    req.context_id = ctx;
    req.trainer_rank = rank;
    req.context_known = context_known != 0;
    ps_wire_named_list list = {items, n};
    ps_wire_tensors_encode_bind(&req.gradients, &list);
    ps_PushGradientsResponse resp = ps_PushGradientsResponse_init_zero;
    ps_status rc = call(c, PS_M_PUSH_GRADIENTS, &req, &resp, err);
    if (rc == PS_OK && sq_norm) *sq_norm = resp.grad_sq_norm;
    return rc;
}

const ps_client_round_scalar *ps_client_round_find(const ps_client_round *r, const char *name) {
    for (int i = 0; r && i < r->n; i++)
        if (!strcmp(r->s[i].name, name)) return &r->s[i];
    return NULL;
}

ps_status ps_client_release_context(ps_client *c, uint64_t ctx, uint32_t rank, int *released, ps_err *err) {
    const ps_method_desc *m = ps_method(PS_M_RELEASE_CONTEXT);
    ps_ReleaseContextRequest req = ps_ReleaseContextRequest_init_zero;
    req.context_id = ctx;
    req.trainer_rank = rank;
    ps_ReleaseContextResponse resp = ps_ReleaseContextResponse_init_zero;
    grpc_byte_buffer *rq = NULL;
    ps_err local;
    if (!err) err = &local;
    ps_status rc = ps_wire_encode(m->request, &req, &rq, err);
    /* once, on a short deadline: best effort, never the busy retries, and a
     * psd too slow to answer must not hold up the unit's next run long */
    int ms = c->timeout_ms > 0 && c->timeout_ms < PS_CLIENT_RELEASE_TIMEOUT_MS ? c->timeout_ms
                                                                                : PS_CLIENT_RELEASE_TIMEOUT_MS;
    if (rc == PS_OK) rc = call_once(c, m, rq, &resp, ms, err);
    grpc_byte_buffer_destroy(rq);
    if (released) *released = rc == PS_OK && resp.released;
    return rc;
}

ps_status ps_client_report_partial(ps_client *c, uint64_t ctx, uint32_t rank, const char *const *applied_on,
                                   int n_applied, const char *const *lost_on, int n_lost, uint64_t *partial_steps,
                                   ps_err *err) {
    ps_ReportPartialRequest req = ps_ReportPartialRequest_init_zero;
    const int cap = (int)(sizeof req.applied_on / sizeof req.applied_on[0]);
    if (n_applied < 0 || n_applied > cap || n_lost < 0 || n_lost > cap)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ReportPartial: %d applied and %d lost servers (at most %d "
                          "each)", n_applied, n_lost, cap);
    req.context_id = ctx;
    req.trainer_rank = rank;
    for (int i = 0; i < n_applied; i++) snprintf(req.applied_on[i], sizeof req.applied_on[i], "%s", applied_on[i]);
    for (int i = 0; i < n_lost; i++) snprintf(req.lost_on[i], sizeof req.lost_on[i], "%s", lost_on[i]);
    req.applied_on_count = (pb_size_t)n_applied;
    req.lost_on_count = (pb_size_t)n_lost;
    ps_ReportPartialResponse resp = ps_ReportPartialResponse_init_zero;
    ps_status rc = call(c, PS_M_REPORT_PARTIAL, &req, &resp, err);
    if (rc == PS_OK && partial_steps) *partial_steps = resp.partial_steps;
    return rc;
}
