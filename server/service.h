/* service.h - the ParameterServer gRPC service: request validation and the
 * distributed-autograd context protocol on top of a model.
 *
 * Forward(ctx, seq, input, stages, train) runs a run of the hosted stages
 * (all by default); with train the context records the forward under its
 * sequence number, with the tape Backward needs, and a retried Forward of a
 * recorded (ctx, seq) is answered from the record, never computed or
 * recorded twice. Each forward draws its own dropout masks, seeded by
 * (context, seq). Backward(ctx, seq [+ more_seqs], grad_output[s]) covers
 * recorded forwards: it ADDS their parameter gradients into the context
 * (never into shared state), returns the gradients of their inputs when
 * asked (want_input_grad; off by default, so nobody pays for a backward-data
 * they do not use), and with step=true also steps (one round trip).
 * GetGradients(ctx) returns the accumulated gradients; Step(ctx) refuses
 * while a recorded forward has not been backwarded, otherwise applies the
 * optimizer once - when, depends on server.consistency (consistency.h):
 * at once (hogwild, ssp) or with its sync round, the reply deferred without
 * holding a server thread - and frees the context; a repeated Step of a
 * finished context answers the version it produced (idempotent) for
 * settle_window_s, and "too old to settle" after that.
 *
 * Non-finite values (NaN/Inf in a training input, in grad_output, or in the
 * parameter gradients Backward computes) never reach the weights. With
 * nonfinite_policy reject the call is refused with INVALID_ARGUMENT naming the
 * tensor and element (counted in Status.nonfinite_rejected); with skip the
 * calls succeed, the context is marked, and its step is not applied: Step
 * (or Backward with step=true) answers OK with skipped=true and the
 * current version (counted in Status.nonfinite_skipped). An eval Forward
 * with a non-finite input is always refused.
 *
 * Every handler validates what a peer sends and answers INVALID_ARGUMENT,
 * NOT_FOUND, FAILED_PRECONDITION, ALREADY_EXISTS or RESOURCE_EXHAUSTED with
 * a message naming the field; nothing a request contains can stop psd.
 *
 * The method table also holds the standard health service
 * (/grpc.health.v1.Health/Check, proto/health.proto): SERVING while psd
 * serves, NOT_SERVING while it drains, for the service names "" and
 * "ps.ParameterServer"; any other name is NOT_FOUND.
 */
#ifndef PS_SERVICE_H
#define PS_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint.h"
#include "consistency.h"
#include "ctx_table.h"
#include "model.h"
#include "round_metrics.h"
#include "rpc_server.h"
#include "server_opts.h"

typedef struct ps_service ps_service;

/* ps_nonfinite_policy and ps_service_opts (the service's server.* keys)
 * are in server_opts.h. */

/* The service uses (does not own) the model. */
ps_service *ps_service_create(ps_model *model, const ps_service_opts *opts, ps_err *err);
void ps_service_free(ps_service *s);

/* The method table to hand to ps_rpc_server_create with s as user data. */
const ps_rpc_method *ps_service_methods(int *n);

/* Expire idle contexts; returns how many. Call periodically. */
size_t ps_service_expire(ps_service *s);

void ps_service_stats(ps_service *s, ps_ctx_stats *ctx, uint64_t *samples);
/* Batched Forwards (server.batch_wait_ms): training forwards held for
 * company, and those that ran combined with others. */
void ps_service_batch_stats(ps_service *s, uint64_t *held, uint64_t *combined);
/* The same for batched Backwards (server.batch_backward). */
void ps_service_batch_bwd_stats(ps_service *s, uint64_t *held, uint64_t *combined);
/* The context table: what checkpoints keep of it (checkpoint.h psd.settle). */
ps_ctx_table *ps_service_contexts(ps_service *s);

/* ---- lifecycle (psd) ----
 * Draining: from ps_service_set_draining on, Forward (any kind) is refused
 * with UNAVAILABLE "psd is shutting down", while Backward, GetGradients
 * and Step of contexts already open still run, so in-flight batches can
 * finish; the health service answers NOT_SERVING and Status draining=true.
 * One-way. */
void ps_service_set_draining(ps_service *s);
int ps_service_draining(ps_service *s);

/* Admission state for health and Status: the rpc server whose admission
 * counters Status reports (and whose saturation, past
 * opts.health_saturated_s, health reports as NOT_SERVING). Set once before
 * the server starts; srv NULL = none. */
void ps_service_set_admission(ps_service *s, ps_rpc_server *srv);
/* 1 while serving; 0 while draining or saturated for longer than the
 * limit, with the reason in why (may be NULL). */
int ps_service_serving(ps_service *s, char *why, size_t n);
/* The rpc server's admission counters; 0 (and zeros) when none is set. */
int ps_service_admission(ps_service *s, ps_rpc_admission *a);
/* The rpc server's phase accounting of method id (ps_rpc_server_phases);
 * 0 (and zeros) when none is set or it does not profile. */
struct ps_prof_acc;
int ps_service_phases(ps_service *s, int method_id, struct ps_prof_acc *out);

/* Answers every waiting sync Step and held-back ssp Forward with
 * UNAVAILABLE and stops the ssp executor; call before shutting the server
 * down (ps_service_free does it too). Idempotent. */
void ps_service_close(ps_service *s);

/* Training samples counted so far (e.g. restored from a checkpoint). */
void ps_service_set_samples(ps_service *s, uint64_t samples);

/* The newest checkpoint written or restored, reported by Status and the
 * metrics. ps_service_checkpoint returns 0 when there is none. */
void ps_service_note_checkpoint(ps_service *s, const ps_ckpt_info *info);
int ps_service_checkpoint(ps_service *s, ps_ckpt_info *out);

/* What the consistency mode is doing (Status and /metrics). */
typedef struct ps_service_mode_stats {
    uint64_t sync_round;      /* 0 unless sync */
    uint32_t sync_members;
    uint64_t sync_dropped, sync_timeouts, ssp_deferred;
    uint64_t sync_queued;     /* Steps moved to the open round (their round filled up without them) */
} ps_service_mode_stats;
void ps_service_mode(ps_service *s, ps_service_mode_stats *out);

/* The newest closed metrics round (Status, /metrics); stop_metric and
 * stop_threshold as configured (NULL ok). */
struct ps_round_report;
void ps_service_round_metrics(ps_service *s, struct ps_round_report *out, const char **stop_metric,
                              double *stop_threshold);

/* Seconds since the service was created. */
double ps_service_uptime(ps_service *s);
/* Non-finite counters: calls refused (policy reject) and steps skipped. */
void ps_service_nonfinite_counts(ps_service *s, uint64_t *rejected, uint64_t *skipped);

/* Partial steps reported by trainers (ReportPartial): batches applied here
 * but lost on another server, and lost here but applied elsewhere. */
void ps_service_partial_counts(ps_service *s, uint64_t *applied, uint64_t *lost);

/* The dashboard's per-trainer view (trainers.h), fed by the handlers from
 * now on; NULL = none. Set before the server starts; t outlives s. */
struct ps_trainers;
void ps_service_set_trainers(ps_service *s, struct ps_trainers *t);

/* What this psd hosts, in words: "emb rows [0, 5000) on cpu, decoder on
 * cpu" (Status.hosted). */
void ps_service_hosted(ps_service *s, char *buf, size_t n);

#endif
