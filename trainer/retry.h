/* retry.h - retrying calls to psd, and applying a step at most once.
 *
 * Retries: a call that failed with PS_ERR_UNAVAILABLE (psd down, restarting
 * or unreachable) or PS_ERR_DEADLINE_EXCEEDED (no answer within the RPC
 * deadline) is tried again after an exponential backoff with jitter; every
 * other status is final - except psd's admission refusals
 * (ps_retry_busy), which the client (ps_client_set_busy_retry) sends again
 * as they are, each call on a budget of its own. A ps_retry holds one retry budget (policy.max_s):
 * it starts at the first failure after ps_retry_reset, and no wait goes
 * past it. The trainer resets it for every unit of work (a batch), so the
 * budget is "per batch", not per call.
 *
 * Settling: a unit of work runs Forward ... Step under one context id. When
 * a call of it goes unanswered, psd may or may not have applied its step.
 * Step(ctx) is idempotent on psd, so asking again settles it
 * (ps_retry_settled; docs/protocol.md "Statuses"): OK, or
 * ALREADY_EXISTS ("too old to settle"), means the step was (or now is)
 * applied once; UNAVAILABLE or DEADLINE_EXCEEDED - psd down, or the context
 * in use because its first Step still runs or waits in its sync round -
 * means nothing is decided yet: ask again after a backoff; NOT_FOUND (psd
 * restarted without it, the context expired), FAILED_PRECONDITION (no
 * gradients yet) or ABORTED (its sync round closed without it) means
 * nothing was applied, and the unit runs again under a fresh context id.
 *
 * Nothing here knows about gRPC or psd's messages: the calls are function
 * pointers (tests/test_retry.c drives it with fakes). Not thread-safe: one
 * ps_retry per trainer thread.
 *
 * docs/protocol.md writes these rules down for every client (ps-train and
 * python/psd, which follows them); change both together.
 */
#ifndef PS_TRAINER_RETRY_H
#define PS_TRAINER_RETRY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef struct ps_retry_policy {
    double max_s;           /* budget from the first failure; 0 = never retry */
    double backoff_s;       /* first wait, before jitter (> 0) */
    double backoff_max_s;   /* waits double up to this */
    uint64_t seed;          /* jitter stream */
    const char *who;        /* message prefix, e.g. "ps-train: rank 1" */
    FILE *log;              /* where retries and give-ups are reported; NULL: nowhere */
    /* Clock and sleep, for tests; NULL: CLOCK_MONOTONIC and nanosleep. */
    double (*now)(void *clock_arg);
    void (*sleep)(void *clock_arg, double s);
    void *clock_arg;
} ps_retry_policy;

typedef struct ps_retry {
    ps_retry_policy p;
    bool failed;            /* a failure since the last reset */
    double t_first;         /* its time */
    double next;            /* next wait before jitter */
    int tries;              /* retries since the last reset */
    long total;             /* retries over the object's life (for summaries) */
    uint64_t rng;
} ps_retry;

/* A call: returns PS_OK or a status with its message in err. */
typedef ps_status (*ps_retry_fn)(void *arg, ps_err *err);

void ps_retry_init(ps_retry *r, const ps_retry_policy *p);
/* Start a fresh budget (a new unit of work). */
void ps_retry_reset(ps_retry *r);
/* UNAVAILABLE and DEADLINE_EXCEEDED. */
bool ps_retry_retryable(ps_status st);

/* What a Step's answer says about its context's step. */
typedef enum {
    PS_SETTLED_APPLIED,     /* OK, ALREADY_EXISTS: applied once; never run the unit again */
    PS_SETTLED_UNKNOWN,     /* UNAVAILABLE, DEADLINE_EXCEEDED: ask again later */
    PS_SETTLED_NOT_APPLIED, /* NOT_FOUND, FAILED_PRECONDITION, ABORTED: nothing applied; run again, fresh id */
    PS_SETTLED_FINAL,       /* anything else: an error to report */
} ps_settled;
ps_settled ps_retry_settled(ps_status st);
/* After a failure of `what` (err): if the budget allows, report it, sleep
 * the next backoff (cut to what is left of the budget) and return true;
 * else report the give-up and return false. */
bool ps_retry_wait(ps_retry *r, const char *what, const ps_err *err);
/* psd's admission refusal (docs/protocol.md, "Statuses"): RESOURCE_EXHAUSTED
 * with psd's retry hint (err->retry_after_ms > 0, psd's trailing metadata
 * PS_RPC_RETRY_AFTER_KEY) - a client over its fair share of calls or
 * context memory. psd did nothing with the call: it may be sent again as it
 * is, whatever it was (a fused Forward with step too). A RESOURCE_EXHAUSTED
 * without the hint (a message over server.max_message_mb, out of memory, an
 * older psd) is final. */
bool ps_retry_busy(const ps_err *err);
/* ps_retry_wait after an admission refusal: the wait is at least psd's hint,
 * and the give-up says that psd kept refusing, and what to change. */
bool ps_retry_wait_busy(ps_retry *r, const char *what, const ps_err *err);
/* Call fn until it returns something not retryable or the budget is spent;
 * returns its last status (err holds its message). Does not reset. */
ps_status ps_retry_call(ps_retry *r, const char *what, ps_retry_fn fn, void *arg, ps_err *err);
/* Settle an unanswered step whose failure is in err: wait, then call the
 * idempotent step until its answer decides (ps_retry_settled is not
 * UNKNOWN), or the budget runs out (the last retryable failure). */
ps_status ps_retry_settle(ps_retry *r, ps_retry_fn step, void *arg, ps_err *err);

/* Context ids: a random high half per process, a counter in the low half,
 * so a re-run never reuses an id psd may remember. */
typedef struct ps_ctx_ids {
    uint64_t base, n;
} ps_ctx_ids;
void ps_ctx_ids_init(ps_ctx_ids *ids);
uint64_t ps_ctx_ids_next(ps_ctx_ids *ids);

/* What psd may hold of a unit's context (ps_once_ops.run's *kept). */
#define PS_KEPT_NONE 0      /* nothing: a failure is simply retried */
#define PS_KEPT_HELD 1      /* its state (a Forward answered), no call that steps sent yet */
#define PS_KEPT_STEP 2      /* a call that steps it (Step, Backward or Forward with step) was sent */

/* A unit of work whose step must be applied at most once. */
typedef struct ps_once_ops {
    const char *unit;       /* "batch": for messages */
    /* Run the whole unit under ctx, ending with its step. Set *kept =
     * PS_KEPT_HELD as soon as psd may hold state for ctx (its Forward
     * answered), and PS_KEPT_STEP just before sending the call that steps
     * it. A failure before HELD is simply retried; a retryable one at HELD
     * (no step asked: nothing can have been applied) runs the unit again
     * under a fresh id - settling there could apply the context without
     * the calls the unit had still to send (its PushGradients, its
     * grad_scale); one at STEP is settled. */
    ps_status (*run)(void *arg, uint64_t ctx, int *kept, ps_err *err);
    /* Step(ctx) alone (idempotent). */
    ps_status (*step)(void *arg, uint64_t ctx, ps_err *err);
    void *arg;
    /* 0 (a run that never says PS_KEPT_STEP): every retryable failure
     * after HELD is settled, as before PS_KEPT_STEP existed. */
    int marks_step;
    /* Abandon ctx, which psd may still hold unstepped, as the unit runs
     * again under a fresh id (ReleaseContext: psd frees it now instead of
     * after server.context_ttl_s, so it stops counting against this
     * client's share): after a retryable failure before the call that
     * steps, and when settling found it not applicable (FAILED_PRECONDITION).
     * Best effort, its failures ignored. NULL: contexts expire on psd. */
    void (*release)(void *arg, uint64_t ctx);
} ps_once_ops;

/* How often a unit whose context psd no longer knows (NOT_FOUND after its
 * Forward) runs again before that is an error. */
#define PS_RETRY_MAX_LOST 3
/* How often a unit whose sync round closed without its step (ABORTED: a
 * straggler, dropped) runs again under a new context, which joins the open
 * round, before that is an error. */
#define PS_RETRY_MAX_LATE 4

/* Reset the budget and run the unit until its step is applied exactly once
 * (PS_OK) or a final error / the spent budget stops it. Each run gets a
 * fresh id from ids. */
ps_status ps_retry_once(ps_retry *r, ps_ctx_ids *ids, const ps_once_ops *ops, ps_err *err);

/* ---- a unit of work over several servers (trainer/cluster.h) ------------
 *
 * A batch whose stages live on several psd runs its Forwards and Backwards
 * under one context id on every server it touches, then finishes with
 * Step(ctx) on each of them. Each server applies a context at most once,
 * and each Step is settled on its own server (ps_retry_settle). The rule
 * for the outcome, per batch:
 *  - every touched server applied it: done;
 *  - a failure before the Steps (run): no server was asked to step, nothing
 *    is applied anywhere: retried / run again under a fresh id as
 *    ps_retry_once does;
 *  - no server applied it (each Step answered NOT_FOUND or
 *    FAILED_PRECONDITION): nothing applied, the batch runs again under a
 *    fresh id (today's single-server rule), at most PS_RETRY_MAX_LOST times;
 *  - some applied it and others lost the context (a restart, an expiry): a
 *    PARTIAL step. The batch is not run again - that would apply it twice
 *    where it was applied - it is logged, counted (ps_multi_result) and
 *    reported to every server (ops->report: ReportPartial);
 *  - any other answer of a Step is final (the error names the server).
 */
#define PS_RETRY_MAX_SERVERS 8 /* = PS_CONFIG_MAX_SERVERS; masks are unsigned bit sets */

typedef struct ps_multi_ops {
    const char *unit;                 /* "batch": for messages */
    int n_servers;                    /* 1..PS_RETRY_MAX_SERVERS */
    const char *const *names;         /* names[i]: server i in messages ("ps0") */
    /* The unit's Forwards and Backwards under ctx, no Step. Set bit i of
     * *touched as soon as server i may hold state for ctx. */
    ps_status (*run)(void *arg, uint64_t ctx, unsigned *touched, ps_err *err);
    /* Step(ctx) on server i (idempotent there). */
    ps_status (*step)(void *arg, int server, uint64_t ctx, ps_err *err);
    /* ReportPartial to server i (best effort: the callee logs failures);
     * may be NULL. */
    void (*report)(void *arg, int server, uint64_t ctx, unsigned applied, unsigned lost);
    /* Abandon ctx on server i as the unit runs again under a fresh id (as
     * ps_once_ops.release): on every touched server after a failure before
     * the Steps, on the servers that lost it when none applied it. May be
     * NULL. */
    void (*release)(void *arg, int server, uint64_t ctx);
    void *arg;
} ps_multi_ops;

typedef struct ps_multi_result {
    uint64_t ctx;                     /* the context that finished */
    unsigned touched, applied, lost;  /* server bit sets of that context */
    int partial;                      /* applied on some servers, lost on others */
    int reruns;                       /* runs again with nothing applied anywhere */
} ps_multi_result;

/* Reset the budget and run the unit as above. PS_OK: applied on every
 * touched server, or a partial step (res->partial). */
ps_status ps_retry_once_multi(ps_retry *r, ps_ctx_ids *ids, const ps_multi_ops *ops, ps_multi_result *res,
                              ps_err *err);

/* "ps0, ps1" of the servers in mask (names as ops->names). */
void ps_retry_mask_names(unsigned mask, int n, const char *const *names, char *buf, size_t len);

#endif
