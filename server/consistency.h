/* consistency.h - when a context's gradients reach the weights
 * (server.consistency).
 *
 *  - hogwild: every Step applies at once (the weights lock keeps each step
 *    atomic and each forward/backward on one consistent set of weights).
 *  - sync: a round gathers server.sync_workers contexts. Each Step names its
 *    round (StepRequest.round; 0 = the round now open) and waits - without
 *    holding a server thread: the reply is deferred - until the round is
 *    complete; then the gradients of all its contexts are summed (or
 *    averaged: server.sync_reduce) and applied as ONE optimizer step, and
 *    every member is answered with the same version and round. With more
 *    trainers than sync_workers a round fills up without some of them: a
 *    Step naming a round that closed complete joins the open round (it is
 *    queued), when it comes at most sync_timeout_s after that round closed;
 *    a membership that had shrunk grows back by one with it (a returning
 *    or new trainer).
 *    When a round has waited server.sync_timeout_s since its first member
 *    arrived, it closes with the members it has: the missing ones are
 *    stragglers, the expected membership shrinks to what arrived (so a dead
 *    worker does not stall every later round). A straggler's late Step
 *    never counts toward a later round: it is refused with ABORTED (its
 *    context dropped; the trainer runs the batch again under a new context,
 *    which joins the open round), and raises the membership back by one -
 *    at most as many times as its round was short, up to sync_workers. A
 *    Step naming a round closed long ago, or a complete round more than
 *    sync_timeout_s after it closed, is ABORTED too, changing nothing.
 *  - ssp (stale synchronous parallel, Petuum): each trainer rank has a
 *    clock, the number of its steps applied. A training Forward of a rank
 *    whose clock is more than server.max_staleness ahead of the slowest
 *    ACTIVE rank (seen within the activity window) waits - its reply
 *    deferred - until the slowest catches up or goes inactive. Nothing is
 *    refused, and no forward runs on weights older than the bound. Steps
 *    apply as under hogwild. A rank seen for the first time, or back after
 *    being inactive, joins at the present (its clock raised to the slowest
 *    active one) rather than stalling everyone while it replays the past.
 *    A rank that has not stepped for idle_s (server.ssp_idle_s; a new rank
 *    counts from its first Forward) leaves the slowest-clock computation
 *    until it steps again: Forwards alone - let alone refused ones, which
 *    never reach this module - do not keep a rank holding the others back.
 *    A rank belongs to the identity (token, or host) that first used it
 *    while it is active: another client's Forward under it is refused
 *    PERMISSION_DENIED, and its Steps do not move that rank's clock. With
 *    ssp_world_size set, ranks must be below it; without, at most 4096
 *    ranks are tracked at once (an inactive one's slot is reused). Every
 *    uint32 is a rank: nothing in the value space means "no rank".
 *    A held Forward whose client goes away (deadline, cancel) is taken back
 *    (ps_cons_ssp_cancel): it never runs, so a trainer retrying a long wait
 *    does not pile up stale Forwards that would run ahead of its live
 *    retry, and it no longer keeps its rank active. A rank that finished
 *    still holds the others until idle_s after its last Step (psd cannot
 *    tell finished from slow).
 *
 * This module holds the rules and the waiting lists; it knows neither gRPC
 * nor the model. The service hands it callbacks: `apply` (sum/average a
 * round's gradients and step the model), `done` (answer one Step) and
 * `ready` (run a Forward that was held back). Callbacks are never called
 * with the module's lock held; each waiter's callback is called exactly
 * once, also at shutdown (ps_cons_close: UNAVAILABLE).
 *
 * Thread-safe: any number of handler threads may call in at once.
 */
#ifndef PS_CONSISTENCY_H
#define PS_CONSISTENCY_H

#include <stddef.h>
#include <stdint.h>

#include "server_opts.h"
#include "status.h"

/* ps_cons_mode, ps_sync_reduce and ps_cons_opts (the server.* keys of
 * consistency) are in server_opts.h. */

/* Applies one round: grads[0..n-1] are the members' gradient accumulators
 * (NULL for a member whose step is skipped, e.g. non-finite values) and
 * args[0..n-1] the members' done arguments (what the service keeps per
 * member, e.g. its round metrics); average says whether to divide the sum
 * by the number of non-NULL ones. Called once per round, before any done.
 * Returns PS_OK and the new model version, or an error (nothing applied). */
typedef ps_status (*ps_cons_apply_fn)(void *user, void *const *grads, void *const *args, int n, int average,
                                      uint64_t *version, ps_err *err);
/* Answers one sync member: st == PS_OK with the round's version, round and
 * member count, or an error in err (round not applied, or shutdown). */
typedef void (*ps_cons_done_fn)(void *arg, ps_status st, const ps_err *err, uint64_t version,
                                uint64_t round, uint32_t members);
/* Runs (st == PS_OK) or refuses (err) a Forward held back by ssp. */
typedef void (*ps_cons_ready_fn)(void *arg, ps_status st, const ps_err *err);

typedef struct ps_cons ps_cons;

ps_cons *ps_cons_create(const ps_cons_opts *o, ps_cons_apply_fn apply, void *user, ps_err *err);
/* Answers every waiter with UNAVAILABLE; later calls are refused. */
void ps_cons_close(ps_cons *c);
void ps_cons_free(ps_cons *c);   /* closes first; NULL ok */

ps_cons_mode ps_cons_mode_of(const ps_cons *c);
/* "hogwild", "sync", "ssp"; NULL for an unknown value. */
const char *ps_cons_mode_name(ps_cons_mode m);
/* Parses a mode name; -1 when unknown. */
int ps_cons_mode_parse(const char *name);
/* What the options mean, in words (Status.consistency): "sync: rounds of 2
 * contexts, gradients averaged into one step; stragglers dropped after 30 s". */
void ps_cons_describe(const ps_cons_opts *o, char *buf, size_t n);

/* ---- sync ---- */

/* The round now open (starts at 1). */
uint64_t ps_cons_round(ps_cons *c);

/* Submit one context's Step for round (0 = the open round). On PS_OK the
 * member is queued and done(arg, ...) will be called exactly once - maybe
 * before this returns, by this thread, when it completes the round.
 * A round that closed complete, recently, is taken as the open one (see
 * above). Errors (nothing kept, done not called): ABORTED for a round that
 * closed without it (counted as dropped; err says what happened and when),
 * INVALID_ARGUMENT for a round not open yet, UNAVAILABLE after close. */
ps_status ps_cons_sync_submit(ps_cons *c, uint64_t round, void *grads, ps_cons_done_fn done,
                              void *arg, ps_err *err);

/* Close a round that has waited past its timeout; call about once a second.
 * Returns 1 when it closed one. */
int ps_cons_tick(ps_cons *c);

typedef struct ps_cons_stats {
    uint64_t round;         /* open round */
    uint32_t members;       /* contexts the open round waits for */
    uint32_t waiting;       /* contexts queued in it now */
    uint64_t dropped;       /* late Steps refused (stragglers) */
    uint64_t timeouts;      /* rounds closed by their timeout */
    uint64_t queued;        /* Steps of a round that filled up without them, moved to the open round */
    uint64_t ssp_deferred;  /* Forwards held back */
    uint64_t ssp_waiting;   /* held back now */
} ps_cons_stats;
void ps_cons_stats_get(ps_cons *c, ps_cons_stats *out);

/* ---- ssp ---- */

/* May a training Forward of rank, from the client identity owner (NULL =
 * ""), run now? Returns 1: run it (ready is not called). Returns 0: held
 * back; ready(arg, ...) is called exactly once later, from the thread whose
 * step (or tick) released it, or with UNAVAILABLE at close - unless
 * ps_cons_ssp_cancel(key) takes it back first. Returns -1: refused, err says
 * why (PERMISSION_DENIED: another identity's active rank; INVALID_ARGUMENT:
 * not below ssp_world_size; RESOURCE_EXHAUSTED: every rank slot active);
 * ready is not called. In modes other than ssp always 1. key names the
 * held Forward for ps_cons_ssp_cancel (unique among the held ones, e.g. its
 * call; NULL = it cannot be cancelled). */
int ps_cons_ssp_admit(ps_cons *c, uint32_t rank, const char *owner, const void *key, ps_cons_ready_fn ready,
                      void *arg, ps_err *err);

/* The client of the held Forward `key` went away: it is taken back - it will
 * never run, ready is not called, it no longer counts as its rank waiting
 * (a rank whose waits were all cancelled is not kept active by them). Returns
 * its arg, for the caller to answer and free; NULL when no Forward with that
 * key is held (already released - ready is or was being called - or never
 * held). */
void *ps_cons_ssp_cancel(ps_cons *c, const void *key);

/* A step of rank, from owner, was applied (hogwild application under ssp):
 * advance the rank's clock (not when the rank is another identity's) and
 * release the Forwards that may run now. */
void ps_cons_stepped(ps_cons *c, uint32_t rank, const char *owner);

/* Clock of a rank (steps applied); 0 for an unknown rank. */
uint64_t ps_cons_clock(ps_cons *c, uint32_t rank);

#endif
