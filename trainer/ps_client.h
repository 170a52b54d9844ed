/* ps_client.h - typed client of psd's ParameterServer service.
 *
 * Wraps rpc.h + wire.h: each call encodes the request, performs the RPC with
 * the client's deadline, and decodes the reply. A non-OK gRPC status becomes
 * a ps_status with the server's message, prefixed with the method name, so
 * a trainer can print exactly what the server refused and why.
 * One ps_client per thread (or external locking).
 */
#ifndef PS_CLIENT_H
#define PS_CLIENT_H

#include <stdint.h>

#include "retry.h"
#include "rpc.h"
#include "status.h"
#include "wire.h"

typedef struct ps_client ps_client;

ps_client *ps_client_create(const char *target, int timeout_ms, int max_message_bytes, ps_err *err);
/* With TLS / a token (rpc.h; NULL = plaintext, loopback only). */
ps_client *ps_client_create_secure(const char *target, int timeout_ms, int max_message_bytes,
                                   const ps_rpc_security *sec, ps_err *err);
void ps_client_free(ps_client *c);
/* Back off after psd's admission refusals (RESOURCE_EXHAUSTED with psd's
 * retry hint: a client over its fair share of calls or context memory;
 * retry.h ps_retry_busy): such a call did nothing on psd, so every call of
 * c sends it again as it is - exactly once holds, a fused Forward with step
 * included - after a backoff of at least the hint, within p's budget per
 * call (p->max_s from the first refusal; 0: never), then fails with the
 * give-up on p->log. Without it (the default) an admission refusal is final. */
ps_status ps_client_set_busy_retry(ps_client *c, const ps_retry_policy *p, ps_err *err);
/* Calls sent again after admission refusals so far (0 without a policy or c). */
long ps_client_busy_retries(const ps_client *c);
const char *ps_client_target(const ps_client *c);

/* x is (n, c, h, w); out receives n*out_size floats (out_cap floats room). */
ps_status ps_client_forward(ps_client *c, uint64_t ctx, uint32_t rank, int train, const float *x,
                            int n, int ch, int h, int w, float *out, int64_t out_cap,
                            int64_t *out_cols, uint64_t *version, ps_err *err);
/* grad is (n, cols). With step != 0 the server also applies the optimizer. */
ps_status ps_client_backward(ps_client *c, uint64_t ctx, const float *grad, int n, int cols, int step,
                             uint64_t *version, ps_err *err);
ps_status ps_client_step(ps_client *c, uint64_t ctx, uint64_t *version, ps_err *err);
/* Gradients of the context, decoded into list (caller frees with
 * ps_wire_tensor_list_free): every page of GetGradients, a parameter cut
 * between pages put back together, so each tensor is whole. */
ps_status ps_client_get_gradients(ps_client *c, uint64_t ctx, ps_wire_tensor_list *list, ps_err *err);
/* The same with pages of at most max_bytes of tensor data each
 * (GetGradientsRequest.max_bytes; 0 = psd's message limit). */
ps_status ps_client_get_gradients_paged(ps_client *c, uint64_t ctx, uint64_t max_bytes, ps_wire_tensor_list *list,
                                        ps_err *err);
ps_status ps_client_list_parameters(ps_client *c, ps_wire_param_list *list, char *model, size_t model_len,
                                    ps_err *err);
ps_status ps_client_get_parameters(ps_client *c, ps_wire_tensor_list *list, uint64_t *version, ps_err *err);
/* The stages psd hosts (ListParametersResponse.stages: per-sample input
 * shape and dtype, output shape, shard rows), in model order: at most cap
 * into out, *n how many. */
ps_status ps_client_list_stages(ps_client *c, ps_StageInfo *out, int cap, int *n, ps_err *err);
ps_status ps_client_status(ps_client *c, ps_StatusResponse *out, ps_err *err);

/* ---- stage-addressed, typed, multi-forward calls (any model) ---------------- */

/* A host tensor for the calls below: ndim 1..4 dims, data of dtype
 * (PS_CLIENT_F32 or PS_CLIENT_I64 = the wire's DType values). */
#define PS_CLIENT_F32 0
#define PS_CLIENT_I64 1
typedef struct ps_client_tensor {
    int dtype;
    int ndim;
    int64_t dims[PS_WIRE_MAX_DIMS];
    const void *data;
} ps_client_tensor;

typedef struct ps_client_fwd {
    uint64_t ctx;              /* 0 with train = 0 */
    uint32_t seq;              /* the forward's number in the context */
    uint32_t rank;
    int train;
    const char *stage, *last_stage;  /* NULL or "" = see proto/ps.proto */
    ps_client_tensor input;
    ps_client_tensor targets;  /* data != NULL: the fused loss (ForwardRequest.targets, int64) */
    int want_sq_norm;          /* with targets: ask for the context's gradient norm (fwd_out.sq_norm) */
    int step;                  /* with targets: also step the context (ForwardRequest.step; fwd_out.step_version) */
    int skip_input_grad;       /* with targets: no input gradient (fwd_out.input_grad untouched) */
} ps_client_fwd;

typedef struct ps_client_fwd_out {
    float *out;                /* caller's buffer of out_cap floats */
    int64_t out_cap;
    int ndim;                  /* the output's shape */
    int64_t dims[PS_WIRE_MAX_DIMS];
    uint64_t version, round;
    int replayed;
    /* with targets: the loss, and the input gradient into input_grad (input_grad_cap floats); out unused */
    double loss;
    float *input_grad;
    int64_t input_grad_cap;
    double sq_norm;            /* with targets and want_sq_norm: the context's gradient norm squared after it */
    uint64_t step_version;     /* with step: the version after the step */
    int skipped;               /* with step: not applied (non-finite, policy "skip") */
} ps_client_fwd_out;

/* Forward of a run of stages. INVALID_ARGUMENT when the output does not fit
 * out_cap. */
ps_status ps_client_forward_ex(ps_client *c, const ps_client_fwd *f, ps_client_fwd_out *o, ps_err *err);

/* A whole training step in one call: f (with targets) sent with step and
 * skip_input_grad set; on success *loss is psd's mean cross-entropy and
 * *version the model version after the step. Under ps_retry_once the unit
 * counts as kept before this is called: psd may have applied it though
 * the reply is lost, and a Step of the context settles it. */
ps_status ps_client_train_step(ps_client *c, ps_client_fwd *f, double *loss, uint64_t *version, ps_err *err);

/* Backward covering n recorded forwards seqs[i] with gradients grads[i]
 * (float32, shaped like the forward's output). With input_grads != NULL
 * (n buffers of input_caps[i] floats) the server returns each forward's
 * input gradient into them. step/round as StepRequest. */
/* A named scalar for psd's round metrics (docs/rl.md, "Round metrics"). */
#define PS_CLIENT_MAX_SCALARS 8
typedef struct ps_client_scalar {
    const char *name;          /* 1..31 characters of [A-Za-z0-9_.-] */
    double value;              /* finite */
} ps_client_scalar;

typedef struct ps_client_bwd {
    uint64_t ctx;
    int n;
    const uint32_t *seqs;
    const ps_client_tensor *grads;
    float *const *input_grads;   /* NULL: not asked */
    const int64_t *input_caps;
    int step;
    uint64_t round;
    const ps_client_scalar *scalars;  /* with step: as ps_client_step_scalars (<= 8) */
    int nscalars;
} ps_client_bwd;

typedef struct ps_client_step_out {
    uint64_t version, round;
    uint32_t round_contexts;
    int skipped;
    double sq_norm;            /* Backward without step: the context's gradient norm squared */
} ps_client_step_out;

ps_status ps_client_backward_ex(ps_client *c, const ps_client_bwd *b, ps_client_step_out *o, ps_err *err);
/* Step of a context under sync round `round` (0 = the open one). */
ps_status ps_client_step_ex(ps_client *c, uint64_t ctx, uint64_t round, ps_client_step_out *o, ps_err *err);
/* The same with the context's gradients multiplied by grad_scale first
 * (StepRequest.grad_scale: clipping by the global norm). */
ps_status ps_client_step_scaled(ps_client *c, uint64_t ctx, uint64_t round, float grad_scale, ps_client_step_out *o,
                                ps_err *err);
/* The parameters of one stage (GetParametersRequest.stage), as
 * ps_client_get_parameters. */
ps_status ps_client_get_stage_parameters(ps_client *c, const char *stage, ps_wire_tensor_list *list,
                                         uint64_t *version, ps_err *err);
/* Add the gradients of a parameter-only stage's parameters (n named float32
 * tensors) into context ctx (PushGradients); *sq_norm (may be NULL)
 * receives the context's gradient norm squared after it. context_known: a
 * Forward of ctx went to this psd before (PushGradientsRequest.context_known):
 * NOT_FOUND when psd no longer knows ctx, instead of opening a fresh one. */
ps_status ps_client_push_gradients(ps_client *c, uint64_t ctx, uint32_t rank, int context_known,
                                   const ps_wire_named *items, size_t n, double *sq_norm, ps_err *err);

/* Abandon context ctx, never stepped, whose unit runs again under a fresh
 * id (ReleaseContext, docs/protocol.md): psd frees it now rather than after
 * server.context_ttl_s. One try within PS_CLIENT_RELEASE_TIMEOUT_MS, no
 * admission retries: best effort, and
 * the caller ignores failures (an older psd: UNIMPLEMENTED). *released
 * (may be NULL): psd held it live (ReleaseContextResponse.released). */
#define PS_CLIENT_RELEASE_TIMEOUT_MS 2000  /* its deadline (or trainer.rpc_timeout_s when shorter) */
ps_status ps_client_release_context(ps_client *c, uint64_t ctx, uint32_t rank, int *released, ps_err *err);

/* Several PS nodes: tell a psd that context ctx was applied on the servers
 * applied_on and lost on lost_on (<= 8 names each; proto/ps.proto
 * ReportPartialRequest); *partial_steps (may be NULL) receives that psd's
 * count after it. A psd without the RPC answers UNIMPLEMENTED. */
ps_status ps_client_report_partial(ps_client *c, uint64_t ctx, uint32_t rank, const char *const *applied_on,
                                   int n_applied, const char *const *lost_on, int n_lost, uint64_t *partial_steps,
                                   ps_err *err);

/* ---- round metrics (docs/rl.md, "Round metrics") ---- */
typedef struct ps_client_round_scalar {
    char name[32];
    uint32_t count;
    double min, mean, max, ema;
} ps_client_round_scalar;
typedef struct ps_client_round {
    uint64_t metrics_round;    /* metrics rounds closed so far */
    int solved;                /* psd's stop metric crossed its threshold */
    int n;
    ps_client_round_scalar s[PS_CLIENT_MAX_SCALARS];
} ps_client_round;
/* Step with n (<= 8) named scalars; rep (may be NULL) receives the
 * metrics of the step's round (sync) or the newest closed one. */
ps_status ps_client_step_scalars(ps_client *c, uint64_t ctx, uint64_t round, const ps_client_scalar *sc, int n,
                                 ps_client_step_out *o, ps_client_round *rep, ps_err *err);
/* Step with everything: grad_scale (0 = 1) as ps_client_step_scaled and
 * the scalars as ps_client_step_scalars (sc may be NULL when n is 0). */
ps_status ps_client_step_full(ps_client *c, uint64_t ctx, uint64_t round, float grad_scale, const ps_client_scalar *sc,
                              int n, ps_client_step_out *o, ps_client_round *rep, ps_err *err);
/* The scalar called name in r; NULL when absent. */
const ps_client_round_scalar *ps_client_round_find(const ps_client_round *r, const char *name);

#endif
