/* service_impl.h - what the service's files share: the ps_service struct
 * and the helpers its handlers use. Not for use outside server/service.c,
 * dispatch.c and the handler files svc_*.c:
 *   service.c      the service object: create, free, lifecycle, counters
 *                  and the helpers below
 *   svc_forward.c  Forward: validation, batch splitting, the fused loss,
 *                  ssp's held-back forwards
 *   svc_step.c     Backward, Step, PushGradients and sync rounds
 *   svc_reads.c    GetGradients, ListParameters, GetParameters, Status,
 *                  ReportPartial, health
 */
#ifndef PS_SERVICE_IMPL_H
#define PS_SERVICE_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "consistency.h"
#include "dispatch.h"
#include "round_metrics.h"
#include "service.h"
#include "trainers.h"

typedef struct svc_fwd_node svc_fwd_node;

struct ps_service {
    ps_service_opts opts;        /* as given (server.* keys): a handler reads its key here, nothing
                                    copies it (docs/hacking.md); strings are the config's */
    ps_model *model;
    ps_ctx_table *ctx;
    ps_cons *cons;               /* server.consistency */
    ps_rmetrics *rm;             /* round metrics of the Steps' scalars */
    char stop_metric[PS_RM_NAME_MAX];
    double stop_threshold;
    /* ssp: Forwards released from their wait run here, not on the
     * releasing thread (a Step's reply must not wait for them) */
    pthread_t exec;
    int exec_started;
    pthread_mutex_t exec_mu;
    pthread_cond_t exec_cv;
    svc_fwd_node *exec_head, *exec_tail;
    int exec_stop;
    /* ssp: request bytes of the Forwards held back, per client (under
     * exec_mu; svc_forward.c): a byte share of server.max_context_bytes / 4 */
    struct svc_held *held;
    int nheld, cap_held;
    char optimizer[16];
    const char *(*cpu_isa)(void);
    size_t max_tensor_bytes;
    double start;
    uint64_t samples;            /* __atomic */
    uint64_t eval_draws;         /* __atomic: eval Forwards without a context (their RandnLike noise) */
    uint64_t nonfinite_rejected; /* __atomic */
    uint64_t nonfinite_skipped;  /* __atomic */
    int nonfinite_skip;
    uint64_t trimmed_at;         /* work counter at the last malloc_trim (expire's caller only) */
    uint64_t seen_work;          /* work counter at the previous expire tick (expire's caller only) */
    int idle_ticks;              /* expire ticks in a row with no live context and no new work */
    char consistency[256];
    int draining;                /* __atomic */
    ps_rpc_server *rpc;          /* admission counters (set before start) */
    size_t max_context_bytes;
    double saturated_limit_s;
    char cluster[32];            /* cluster.name */
    char server_name[32];        /* servers.<name>; "" = single-server form */
    uint64_t partial_applied;    /* __atomic: ReportPartial, applied here */
    uint64_t partial_lost;       /* __atomic: ReportPartial, lost here */
    pthread_mutex_t ckpt_mu;     /* guards ckpt, has_ckpt */
    int has_ckpt;
    ps_ckpt_info ckpt;
    ps_trainers *trainers;       /* the dashboard's view of each trainer; NULL = none */
    struct ps_report_limit *reports; /* ReportPartial per client: repeats, rate, log lines */
    /* batched training Forwards (svc_batch.c); batcher NULL = off */
    struct ps_batcher *batcher;
    pthread_mutex_t batch_mu;    /* a held forward's done flag */
    pthread_cond_t batch_cv;
    int batch_inited;
    uint64_t batch_held;         /* __atomic: forwards handed to the batcher */
    uint64_t batch_combined;     /* __atomic: ... that ran in a combined forward */
    struct ps_batcher *batcher_bwd; /* batched training Backwards (server.batch_backward); NULL = off */
    uint64_t bbatch_held;        /* __atomic: backwards handed to it */
    uint64_t bbatch_combined;    /* __atomic: ... that ran in a combined backward */
};

/* ---- service.c: helpers the handlers share ---- */

/* The tensor limit the dispatcher decodes with (server.max_message_bytes). */
size_t ps_service_max_tensor_bytes(ps_service *s);

void svc_count(uint64_t *c);  /* += 1, relaxed atomic */

/* INVALID_ARGUMENT naming what and the first NaN/Inf element of x. */
ps_status svc_check_finite(const float *x, size_t n, const char *what, ps_err *err);

/* A non-finite value reached context c (err says where). Policy reject:
 * refuse (nothing non-finite is ever added to a context, so it stays
 * usable). Policy skip: mark the context, whose step will then not be
 * applied, and go on. Returns what the handler should fail with, or PS_OK
 * to continue. */
ps_status svc_nonfinite(ps_service *s, ps_ctx *c, ps_err *err);

/* "stage 'x'"-free list of the model's stage names: "conv, fc". */
void svc_stage_names(ps_service *s, char *buf, size_t n);

/* A tensor shaped (leading..., per-sample dims): checks the trailing dims
 * and returns the product of the leading ones (at least one leading dim). */
ps_status svc_split_batch(const ps_Tensor *t, const int64_t *per, int per_ndim, const char *what,
                          const char *whose, int64_t *n, int *nlead, ps_err *err);

/* The call's own context (the owner that opened it), acquired. */
ps_ctx *svc_acquire_own(ps_svc_call *c, uint64_t id, int *finished, uint64_t *version, ps_err *err);

/* The context a training call names, acquired: opened when this is its
 * first call here, unless the client says an earlier call of it came here
 * (known: a request's context_known). Then an unknown context was lost with
 * what it held (a restart, an expiry) and is never opened afresh:
 * NOT_FOUND, prefixed with lost (which field said so, what is gone).
 * created (may be NULL): set when this call opened it. */
ps_ctx *svc_open_or_known(ps_svc_call *c, uint64_t id, uint32_t rank, int known, const char *lost, int *created,
                          ps_err *err);

/* Bytes a context holds now (its tapes and gradients), for the table's accounting. */
void svc_account(ps_service *s, ps_ctx *c);

/* A round report's scalars into a reply's repeated RoundScalar. */
void svc_put_round_scalars(const ps_round_report *r, ps_RoundScalar *out, pb_size_t *count, pb_size_t cap);

/* ---- svc_batch.c ---- */

/* Start / stop the batching of training Forwards (server.batch_wait_ms > 0). */
ps_status svc_batch_start(ps_service *s, ps_err *err);
void svc_batch_stop(ps_service *s);
/* A training forward (ps_model_forward_range's, train = 1, with a tape):
 * combined with concurrent ones of the same stages when batching is on and
 * the stages allow it, else alone. */
ps_status svc_forward_train(ps_service *s, int first, int last, const void *x, int n, uint64_t seed, float *out,
                            ps_tape **tape, uint64_t *version, ps_err *err);
/* A training backward of tape (ps_model_backward_acc's) into *acc (created
 * when NULL): combined with concurrent ones of the same stages when
 * backward batching is on and the stages allow it, else alone. On error
 * *acc may hold part of it: the caller discards it. */
ps_status svc_backward_train(ps_service *s, ps_tape *tape, const float *grad_out, float *grad_in, ps_grads **acc,
                             ps_err *err);

/* ---- svc_forward.c ---- */
void *svc_exec_main(void *p);   /* the ssp executor thread */

/* ---- svc_step.c ---- */

/* Backward of one recorded forward seq of context c with gradient g
 * (gdata, gbytes; finite: already known finite): accumulates its
 * parameter gradients into the context (never non-finite ones under
 * "reject"), optionally its input gradient into gin. */
ps_status svc_backward_one(ps_service *s, ps_ctx *c, uint32_t seq, const ps_Tensor *g, const float *gdata,
                           size_t gbytes, int finite, const char *what, float *gin, ps_err *err);

/* The step of context c after a fused Forward with step (ForwardRequest.
 * step), as Backward's step=true, with the fused loss as the step's "loss"
 * scalar (a Step's round metrics): takes c (finished or released on return);
 * the call's ForwardResponse step fields are filled, or err says why not,
 * or under sync the call is deferred to its round (PS_OK). */
ps_status svc_step_context(ps_svc_call *call, ps_ctx *c, double loss, ps_err *err);

/* sync: sum (or average) a round's gradients into the first and step
 * (ps_cons_apply_fn). */
ps_status svc_sync_apply(void *user, void *const *grads, void *const *args, int n, int average,
                         uint64_t *version, ps_err *err);

#endif
