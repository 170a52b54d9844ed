/* methods.h - the one table of psd's RPC methods.
 *
 * Every method psd serves is one row of PS_METHODS below: its id, the name
 * of its handler, its short name and path, its request and response message
 * types, and flags saying what it does to psd's state. Everything else is
 * made from the rows:
 *  - the ps_method_id enum and the ps_method_desc table (this file and
 *    methods.c), which the client (ps_client.c) takes paths and descriptors
 *    from and the security module reads the "reader" role from;
 *  - the server's dispatch (server/dispatch.c): one wrapper decodes the
 *    request, refuses it while draining when the row says so, calls the
 *    typed handler ps_svc_<Fn>(call, request, response, err) and encodes the
 *    response or fails with the handler's status;
 *  - the service fuzzer's list (tests/fuzz/fuzz_service.c walks every row).
 *
 * Adding an RPC: the messages and the rpc in proto/ps.proto (plus their
 * proto/ps.options lines when they hold strings or repeated fields), a row
 * here and the handler ps_svc_<Fn> under server/ (docs/hacking.md).
 */
#ifndef PS_METHODS_H
#define PS_METHODS_H

#include <pb.h>

#include "health.pb.h"
#include "ps.pb.h"

/* Row flags. */
#define PS_MF_MUTATING 1u  /* changes training state (contexts, weights) */
#define PS_MF_READER 2u    /* allowed to the tokens file's "reader" role */
#define PS_MF_RESERVED 4u  /* served by the reserved pool: answered even
                              while every ordinary worker is busy */
#define PS_MF_NEW_WORK 8u  /* starts new work: refused with UNAVAILABLE
                              while psd drains (before its message is decoded) */

#define PS_SVC "/ps.ParameterServer/"

/* X(ID, Fn, name, path, request type, response type, flags) */
#define PS_METHODS(X)                                                                                        \
    X(FORWARD, Forward, "Forward", PS_SVC "Forward", ps_ForwardRequest, ps_ForwardResponse,                  \
      PS_MF_MUTATING | PS_MF_NEW_WORK)                                                                       \
    X(BACKWARD, Backward, "Backward", PS_SVC "Backward", ps_BackwardRequest, ps_BackwardResponse,            \
      PS_MF_MUTATING)                                                                                        \
    /* read-only for the weights, but it names a context: not for readers */                                \
    X(GET_GRADIENTS, GetGradients, "GetGradients", PS_SVC "GetGradients", ps_GetGradientsRequest,            \
      ps_GetGradientsResponse, 0)                                                                            \
    X(STEP, Step, "Step", PS_SVC "Step", ps_StepRequest, ps_StepResponse, PS_MF_MUTATING)                    \
    X(LIST_PARAMETERS, ListParameters, "ListParameters", PS_SVC "ListParameters", ps_ListParametersRequest,  \
      ps_ListParametersResponse, PS_MF_READER)                                                               \
    X(GET_PARAMETERS, GetParameters, "GetParameters", PS_SVC "GetParameters", ps_GetParametersRequest,       \
      ps_GetParametersResponse, PS_MF_READER)                                                                \
    X(STATUS, Status, "Status", PS_SVC "Status", ps_StatusRequest, ps_StatusResponse,                        \
      PS_MF_READER | PS_MF_RESERVED)                                                                         \
    X(PUSH_GRADIENTS, PushGradients, "PushGradients", PS_SVC "PushGradients", ps_PushGradientsRequest,       \
      ps_PushGradientsResponse, PS_MF_MUTATING)                                                              \
    /* a trainer's report: counters, trainer role */                                                         \
    X(REPORT_PARTIAL, ReportPartial, "ReportPartial", PS_SVC "ReportPartial", ps_ReportPartialRequest,       \
      ps_ReportPartialResponse, PS_MF_MUTATING)                                                              \
    /* frees a context its trainer abandons: trainer role; not new work (allowed while draining) */          \
    X(RELEASE_CONTEXT, ReleaseContext, "ReleaseContext", PS_SVC "ReleaseContext", ps_ReleaseContextRequest,  \
      ps_ReleaseContextResponse, PS_MF_MUTATING)                                                             \
    /* for anyone who may connect: readers too */                                                            \
    X(HEALTH_CHECK, HealthCheck, "Health/Check", "/grpc.health.v1.Health/Check",                             \
      grpc_health_v1_HealthCheckRequest, grpc_health_v1_HealthCheckResponse, PS_MF_READER | PS_MF_RESERVED)

typedef enum {
#define PS_METHOD_ENUM(ID, Fn, name, path, Req, Resp, flags) PS_M_##ID,
    PS_METHODS(PS_METHOD_ENUM)
#undef PS_METHOD_ENUM
    PS_M_COUNT
} ps_method_id;

typedef struct ps_method_desc {
    ps_method_id id;
    const char *path;             /* "/ps.ParameterServer/Forward" */
    const char *name;             /* "Forward" */
    const pb_msgdesc_t *request;  /* nanopb descriptors */
    const pb_msgdesc_t *response;
    size_t request_size, response_size; /* sizeof the nanopb structs */
    unsigned flags;               /* PS_MF_* */
} ps_method_desc;

/* The row of id; NULL when id is not a method. */
const ps_method_desc *ps_method(ps_method_id id);
/* NULL-terminated paths of the PS_MF_READER rows (static storage). */
const char *const *ps_method_reader_paths(void);

#endif
