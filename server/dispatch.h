/* dispatch.h - the service's one dispatch path, between the rpc layer and
 * the typed handlers.
 *
 * Every row of the method table (methods.h) is served by one wrapper that
 *   1. refuses a PS_MF_NEW_WORK method while psd drains (UNAVAILABLE),
 *   2. decodes the request into the row's nanopb struct, with every Tensor
 *      field's data and every repeated Tensor field decoded into buffers of
 *      the call (limit: server.max_message_bytes),
 *   3. calls the row's typed handler
 *          ps_status ps_svc_<Fn>(ps_svc_call *c, const Req *req, Resp *resp, ps_err *err);
 *      (declared below from the table; err is &c->err),
 *   4. on PS_OK encodes *resp; otherwise answers err's status mapped to a
 *      gRPC code with err's message.
 * A handler may instead defer its reply (ps_svc_defer) and answer later,
 * from any thread, with ps_svc_finish: the same encode-or-fail step.
 *
 * The response's callbacks (tensors, lists) may point at memory the
 * handler allocated: hand it to ps_svc_keep and it is freed once the reply
 * is encoded, on every path.
 */
#ifndef PS_DISPATCH_H
#define PS_DISPATCH_H

#include <stdbool.h>

#include "methods.h"
#include "rpc_server.h"
#include "status.h"
#include "wire.h"

typedef struct ps_service ps_service;

#define PS_SVC_TENSORS 2   /* Tensor fields a request may have */
#define PS_SVC_LISTS 1     /* repeated Tensor fields a request may have */
#define PS_SVC_KEEP 4      /* allocations a handler may hand to ps_svc_keep */
/* The rpc layer's client key: "token:" + a token name (security.h: longer
 * names are refused at load) or a peer's host - it always fits, so
 * identities are compared whole (dispatch.c checks). */
#define PS_SVC_OWNER_MAX 128

/* One call of a method, from decode to reply. */
typedef struct ps_svc_call {
    ps_service *svc;
    const ps_method_desc *m;           /* its row */
    const ps_rpc_call_info *info;      /* valid while the handler runs */
    char owner[PS_SVC_OWNER_MAX];      /* whose contexts (ctx_table.h "Fair shares"):
                                          the rpc layer's client (info->client) */
    ps_err err;
    void *req, *resp;                  /* the row's nanopb structs */
    ps_wire_named_list out;            /* for a response's repeated field: lives
                                          as long as the call */
    /* private */
    ps_rpc_call *rpc;                  /* deferred: the rpc layer's handle */
    int *deferred;                     /* the dispatcher's flag */
    ps_wire_tensor_in tin[PS_SVC_TENSORS];
    const ps_Tensor *tin_of[PS_SVC_TENSORS];
    ps_wire_tensor_list tl[PS_SVC_LISTS];
    const pb_callback_t *tl_of[PS_SVC_LISTS];
    void *kept[PS_SVC_KEEP];
    int nkept;
} ps_svc_call;

/* The typed handlers, one per row (server/svc_*.c). */
#define PS_SVC_HANDLER_DECL(ID, Fn, name, path, Req, Resp, flags) \
    ps_status ps_svc_##Fn(ps_svc_call *c, const Req *req, Resp *resp, ps_err *err);
PS_METHODS(PS_SVC_HANDLER_DECL)
#undef PS_SVC_HANDLER_DECL

/* The rpc handler of every row (user = the ps_service); ps_service_methods
 * binds it. */
void ps_svc_dispatch(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                     grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen);

/* The data of the request's Tensor field t (&req->input; has = its has_
 * flag), checked as ps_wire_tensor_check does with what naming it. Absent:
 * INVALID_ARGUMENT "<what> is missing" when required, else *out = NULL. */
ps_status ps_svc_tensor(ps_svc_call *c, const ps_Tensor *t, bool has, const char *what, int required,
                        const ps_wire_tensor_in **out, ps_err *err);

/* The tensors decoded from the request's repeated Tensor field cb
 * (&req->gradients); each was checked while decoding. */
const ps_wire_tensor_list *ps_svc_tensors(ps_svc_call *c, const pb_callback_t *cb);

/* Free p (may be NULL) once the reply is encoded; returns p. */
void *ps_svc_keep(ps_svc_call *c, void *p);

/* The reply will come later, from any thread, through ps_svc_finish; the
 * handler returns PS_OK at once (its return value is then ignored) and
 * touches c no more unless it finishes it itself. Returns 0, doing
 * nothing, when the handler runs outside a server (answer synchronously). */
int ps_svc_defer(ps_svc_call *c);

/* Answer a deferred call: st == PS_OK encodes c->resp, otherwise c->err is
 * sent (st is its code). Frees c. */
void ps_svc_finish(ps_svc_call *c, ps_status st);

#endif
