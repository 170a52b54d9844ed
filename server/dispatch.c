/* dispatch.c - the one path every RPC of the method table takes: decode,
 * refuse while draining, call the typed handler, encode or fail (see
 * dispatch.h). */
#include "dispatch.h"

#include <pb_common.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prof.h"
#include "security.h"
#include "service_impl.h"

_Static_assert(sizeof "token:" + PS_TOKEN_NAME_MAX <= PS_SVC_OWNER_MAX,
               "a token's identity fits ps_svc_call.owner: identities are compared whole");

/* The handlers by row, each behind a thunk that gives it its types. */
#define PS_SVC_THUNK(ID, Fn, name, path, Req, Resp, flags) \
    static ps_status thunk_##Fn(ps_svc_call *c) { return ps_svc_##Fn(c, c->req, c->resp, &c->err); }
PS_METHODS(PS_SVC_THUNK)
#undef PS_SVC_THUNK

typedef ps_status (*svc_thunk)(ps_svc_call *c);
static const svc_thunk thunks[PS_M_COUNT] = {
#define PS_SVC_ROW(ID, Fn, name, path, Req, Resp, flags) [PS_M_##ID] = thunk_##Fn,
    PS_METHODS(PS_SVC_ROW)
#undef PS_SVC_ROW
};

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* A call of row m with its request and response structs zeroed (= nanopb's
 * _init_zero) and its Tensor fields bound to the call's buffers. */
static ps_svc_call *call_new(ps_service *s, const ps_method_desc *m) {
    size_t head = align16(sizeof(ps_svc_call)), rq = align16(m->request_size);
    ps_svc_call *c = calloc(1, head + rq + m->response_size);
    if (!c) return NULL;
    c->svc = s;
    c->m = m;
    c->req = (char *)c + head;
    c->resp = (char *)c + head + rq;
    size_t limit = ps_service_max_tensor_bytes(s);
    int nt = 0, nl = 0;
    pb_field_iter_t it;
    if (pb_field_iter_begin(&it, m->request, c->req)) {
        do {
            if (it.submsg_desc != ps_Tensor_fields) continue;
            if (PB_ATYPE(it.type) == PB_ATYPE_CALLBACK) {   /* repeated Tensor */
                PS_ASSERT(nl < PS_SVC_LISTS);
                ps_wire_tensor_list_init(&c->tl[nl], limit);
                c->tl[nl].err = &c->err;
                c->tl_of[nl] = it.pData;
                ps_wire_tensors_decode_bind(it.pData, &c->tl[nl++]);
            } else {
                PS_ASSERT(nt < PS_SVC_TENSORS && PB_HTYPE(it.type) != PB_HTYPE_REPEATED);
                ps_wire_tensor_in_init(&c->tin[nt], limit);
                c->tin[nt].err = &c->err;
                c->tin_of[nt] = it.pData;
                ps_wire_tensor_decode_bind(it.pData, &c->tin[nt++]);
            }
        } while (pb_field_iter_next(&it));
    }
    return c;
}

static void call_free(ps_svc_call *c) {
    for (int i = 0; i < PS_SVC_TENSORS; i++) ps_wire_tensor_in_free(&c->tin[i]);
    for (int i = 0; i < PS_SVC_LISTS; i++) ps_wire_tensor_list_free(&c->tl[i]);
    for (int i = 0; i < c->nkept; i++) free(c->kept[i]);
    free(c);
}

/* The reply of a handler that returned st: the encoded response or the error. */
static void reply(ps_svc_call *c, ps_status st, grpc_byte_buffer **response, grpc_status_code *code) {
    int64_t t0 = ps_prof_begin();
    if (st == PS_OK) st = ps_wire_encode(c->m->response, c->resp, response, &c->err);
    ps_prof_end(PS_PHASE_ENCODE, t0);
    if (st != PS_OK) {
        *code = ps_grpc_from_status(c->err.code ? c->err.code : st);
        if (*response) grpc_byte_buffer_destroy(*response);
        *response = NULL;
    }
}

void ps_svc_dispatch(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                     grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    ps_service *s = user;
    const ps_method_desc *m = ps_method((ps_method_id)info->method_id);
    PS_ASSERT(m != NULL);  /* the server only dispatches the rows it was given */
    ps_svc_call *c = call_new(s, m);
    if (!c) {
        *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(details, dlen, "out of memory");
        return;
    }
    c->info = info;
    snprintf(c->owner, sizeof c->owner, "%s", info->client ? info->client : "");
    int deferred = 0;
    c->deferred = &deferred;
    ps_status st;
    if ((m->flags & PS_MF_NEW_WORK) && ps_service_draining(s))
        st = ps_err_set(&c->err, PS_ERR_UNAVAILABLE, "psd is shutting down: no new work is accepted (open "
                        "contexts may still finish their Backward and Step); retry when it is back");
    else {
        int64_t t0 = ps_prof_begin();
        st = ps_wire_decode(request, m->request, c->req, &c->err);
        ps_prof_end(PS_PHASE_DECODE, t0);
        if (!st) st = thunks[m->id](c);
    }
    if (deferred) return;  /* c belongs to whoever answers it */
    reply(c, st, response, code);
    if (*code != GRPC_STATUS_OK) snprintf(details, dlen, "%s", c->err.msg);
    if (*code == GRPC_STATUS_RESOURCE_EXHAUSTED) ps_rpc_call_retry_after(info->call, c->err.retry_after_ms);
    call_free(c);
}

ps_status ps_svc_tensor(ps_svc_call *c, const ps_Tensor *t, bool has, const char *what, int required,
                        const ps_wire_tensor_in **out, ps_err *err) {
    *out = NULL;
    if (!has)
        return required ? ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s is missing", what) : PS_OK;
    for (int i = 0; i < PS_SVC_TENSORS; i++) {
        if (c->tin_of[i] != t) continue;
        if (ps_wire_tensor_check(t, &c->tin[i], what, err)) return err->code;
        *out = &c->tin[i];
        return PS_OK;
    }
    PS_ASSERT(!"ps_svc_tensor: not a Tensor field of the request");
    return PS_ERR_INTERNAL;
}

const ps_wire_tensor_list *ps_svc_tensors(ps_svc_call *c, const pb_callback_t *cb) {
    for (int i = 0; i < PS_SVC_LISTS; i++)
        if (c->tl_of[i] == cb) return &c->tl[i];
    PS_ASSERT(!"ps_svc_tensors: not a repeated Tensor field of the request");
    return NULL;
}

void *ps_svc_keep(ps_svc_call *c, void *p) {
    PS_ASSERT(c->nkept < PS_SVC_KEEP);
    if (p) c->kept[c->nkept++] = p;
    return p;
}

int ps_svc_defer(ps_svc_call *c, ps_rpc_cancel_fn on_cancel, void *cancel_arg) {
    if (!c->info || !c->info->call) return 0;
    c->rpc = ps_rpc_call_defer(c->info, on_cancel, cancel_arg);
    if (!c->rpc) return 0;
    *c->deferred = 1;
    c->deferred = NULL;
    c->info = NULL;  /* the rpc layer's strings are the handler's only */
    return 1;
}

void ps_svc_finish(ps_svc_call *c, ps_status st) {
    grpc_byte_buffer *resp = NULL;
    grpc_status_code code = GRPC_STATUS_OK;
    /* this thread's bound record (prof.h) may be another call's */
    ps_prof_call *bound = ps_prof_bound();
    ps_prof_bind(NULL);
    reply(c, st, &resp, &code);
    if (code == GRPC_STATUS_RESOURCE_EXHAUSTED) ps_rpc_call_retry_after(c->rpc, c->err.retry_after_ms);
    ps_rpc_call_complete(c->rpc, resp, code, code == GRPC_STATUS_OK ? NULL : c->err.msg);
    ps_prof_bind(bound);
    call_free(c);
}
