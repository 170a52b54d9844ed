/* retry.c - backoff, settling and exactly-once units of work (retry.h). */
#include "retry.h"

#include <errno.h>
#include <sys/random.h>
#include <time.h>

#include "clock.h"
#include "rng.h"

/* A remainder of the budget below this is spent: waiting it out would only
 * add a call that cannot be retried anyway. */
#define MIN_WAIT_S 1e-3

static double clock_now(void *arg) {
    (void)arg;
    return ps_mono_s();
}

static void clock_sleep(void *arg, double s) {
    (void)arg;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

void ps_retry_init(ps_retry *r, const ps_retry_policy *p) {
    *r = (ps_retry){.p = *p, .rng = p->seed};
    if (!r->p.now) r->p.now = clock_now;
    if (!r->p.sleep) r->p.sleep = clock_sleep;
    if (!r->p.who) r->p.who = "ps-train";
    ps_retry_reset(r);
}

void ps_retry_reset(ps_retry *r) {
    r->failed = false;
    r->t_first = 0;
    r->tries = 0;
    r->next = r->p.backoff_s;
}

bool ps_retry_retryable(ps_status st) { return st == PS_ERR_UNAVAILABLE || st == PS_ERR_DEADLINE_EXCEEDED; }

ps_settled ps_retry_settled(ps_status st) {
    switch (st) {
    case PS_OK:
    case PS_ERR_ALREADY_EXISTS:      /* "too old to settle": applied once, its version forgotten */
        return PS_SETTLED_APPLIED;
    case PS_ERR_UNAVAILABLE:         /* psd down, or the context in use (its Step still running or */
    case PS_ERR_DEADLINE_EXCEEDED:   /* waiting in its sync round): nothing decided yet */
        return PS_SETTLED_UNKNOWN;
    case PS_ERR_NOT_FOUND:           /* psd holds no record: never applied (restart, expiry) */
    case PS_ERR_FAILED_PRECONDITION: /* refused as it stands (a forward not backwarded, no gradients) */
    case PS_ERR_ABORTED:             /* dropped: its sync round closed without it */
        return PS_SETTLED_NOT_APPLIED;
    default:
        return PS_SETTLED_FINAL;
    }
}

/* After a failure of `what` (err): wait the next backoff, at least min_s,
 * within the budget (busy: psd refused for its admission limits, which the
 * give-up names). */
static bool wait_next(ps_retry *r, const char *what, const ps_err *err, double min_s, bool busy) {
    double now = r->p.now(r->p.clock_arg);
    if (!r->failed) {
        r->failed = true;
        r->t_first = now;
    }
    double used = now - r->t_first;
    if (r->p.max_s <= 0 || used >= r->p.max_s - MIN_WAIT_S) {
        if (r->p.max_s > 0 && r->p.log && busy)
            fprintf(r->p.log, "%s: %s: giving up after %d retries in %.1f s (trainer.retry_max_s = %g); psd kept "
                    "refusing it for its admission limits (last error: %s). Run fewer trainers or threads per "
                    "host (or token), smaller batches, or raise psd's server.max_calls_per_client or "
                    "server.max_context_bytes; steps it acknowledged are kept\n",
                    r->p.who, what, r->tries, used, r->p.max_s, err && err->msg[0] ? err->msg : "none");
        else if (r->p.max_s > 0 && r->p.log)
            fprintf(r->p.log, "%s: %s: giving up after %d retries in %.1f s (trainer.retry_max_s = %g); "
                    "psd did not come back (last error: %s). Restart this trainer once psd serves again; "
                    "steps it acknowledged are kept\n",
                    r->p.who, what, r->tries, used, r->p.max_s, err && err->msg[0] ? err->msg : "none");
        return false;
    }
    /* Jitter: a uniform fraction in [0.5, 1) of the backoff, so trainers
     * that failed together do not come back together; never below psd's
     * hint. */
    double u = (double)(ps_splitmix64(&r->rng) >> 11) / 9007199254740992.0;
    double d = r->next * (0.5 + 0.5 * u);
    if (d < min_s) d = min_s;
    if (used + d > r->p.max_s) d = r->p.max_s - used;
    r->tries++;
    r->total++;
    if (r->p.log)
        fprintf(r->p.log, "%s: %s: %s; retry %d in %.2f s (%.1f of %g s retry budget used)\n", r->p.who, what,
                err ? err->msg : "failed", r->tries, d, used, r->p.max_s);
    r->p.sleep(r->p.clock_arg, d);
    r->next *= 2;
    if (r->next > r->p.backoff_max_s) r->next = r->p.backoff_max_s;
    return true;
}

bool ps_retry_wait(ps_retry *r, const char *what, const ps_err *err) { return wait_next(r, what, err, 0, false); }

bool ps_retry_busy(const ps_err *err) {
    return err && err->code == PS_ERR_RESOURCE_EXHAUSTED && err->retry_after_ms > 0;
}

bool ps_retry_wait_busy(ps_retry *r, const char *what, const ps_err *err) {
    return wait_next(r, what, err, err ? err->retry_after_ms / 1000.0 : 0, true);
}

ps_status ps_retry_call(ps_retry *r, const char *what, ps_retry_fn fn, void *arg, ps_err *err) {
    for (;;) {
        ps_status st = fn(arg, err);
        if (st == PS_OK || !ps_retry_retryable(st) || !ps_retry_wait(r, what, err)) return st;
    }
}

ps_status ps_retry_settle(ps_retry *r, ps_retry_fn step, void *arg, ps_err *err) {
    ps_status st = err ? err->code : PS_ERR_UNAVAILABLE;
    if (!ps_retry_retryable(st)) st = PS_ERR_UNAVAILABLE;
    for (;;) {
        if (!ps_retry_wait(r, "settling the step", err)) return st;
        st = step(arg, err);
        if (ps_retry_settled(st) != PS_SETTLED_UNKNOWN) return st;
    }
}

void ps_ctx_ids_init(ps_ctx_ids *ids) {
    uint64_t base;
    if (getrandom(&base, sizeof base, 0) != sizeof base) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        base = (uint64_t)ts.tv_sec * 2654435761u ^ (uint64_t)ts.tv_nsec << 20;
    }
    ids->base = base & ~0xffffffffULL;
    ids->n = 0;
}

uint64_t ps_ctx_ids_next(ps_ctx_ids *ids) {
    ids->n = (ids->n + 1) & 0xffffffffULL;
    if (ids->n == 0) ids->n = 1;  /* low half 0 would make the id the bare base */
    return ids->base | ids->n;
}

typedef struct step_call {
    const ps_once_ops *ops;
    uint64_t ctx;
} step_call;

static ps_status call_step(void *arg, ps_err *err) {
    step_call *s = arg;
    return s->ops->step(s->ops->arg, s->ctx, err);
}

/* A sync round closed without the unit's step (ABORTED, in err): 1 when the
 * unit should run again under a new context (its step joins the open
 * round), 0 when it was late too often (err says so). */
static int late_again(ps_retry *r, const char *unit, int *late, ps_err *err) {
    if (++*late > PS_RETRY_MAX_LATE) {
        ps_err_prefix(err, "the %s was late for its sync round %d times in a row (is this trainer much slower than "
                      "the others, or server.sync_timeout_s too short?)", unit, *late);
        return 0;
    }
    if (r->p.log)
        fprintf(r->p.log, "%s: %s; running the %s again under a new context (it joins the open round)\n", r->p.who,
                err ? err->msg : "round closed without this step", unit);
    return 1;
}

ps_status ps_retry_once(ps_retry *r, ps_ctx_ids *ids, const ps_once_ops *ops, ps_err *err) {
    ps_retry_reset(r);
    const char *unit = ops->unit ? ops->unit : "unit";
    int lost = 0, late = 0;
    for (;;) {
        uint64_t ctx = ps_ctx_ids_next(ids);
        int kept = 0;
        ps_status st = ops->run(ops->arg, ctx, &kept, err);
        if (st == PS_OK) return PS_OK;
        if (!kept) {  /* psd holds nothing of ctx that a step could apply */
            if (ps_retry_retryable(st) && ps_retry_wait(r, "Forward", err)) continue;
            return st;
        }
        if (st == PS_ERR_NOT_FOUND && ++lost <= PS_RETRY_MAX_LOST) {
            if (r->p.log)
                fprintf(r->p.log, "%s: %s; running the %s again (psd restarted or the context expired)\n",
                        r->p.who, err ? err->msg : "context not found", unit);
            continue;
        }
        if (st == PS_ERR_ABORTED) {  /* sync: its round closed without it; nothing applied */
            if (late_again(r, unit, &late, err)) continue;
            return st;
        }
        if (!ps_retry_retryable(st)) return st;
        if (ops->marks_step && kept == PS_KEPT_HELD) {
            /* Unanswered before any call that steps: nothing of ctx can be
             * applied (it expires on psd). Settling by Step would apply it
             * as it stands, without what the unit had still to send. */
            if (!ps_retry_wait(r, unit, err)) return st;
            if (r->p.log)
                fprintf(r->p.log, "%s: context %llx left unstepped (no Step was sent)%s; running the %s again\n",
                        r->p.who, (unsigned long long)ctx, ops->release ? " and released" : "", unit);
            if (ops->release) ops->release(ops->arg, ctx);
            continue;
        }
        /* Unanswered after the Forward: was the step applied? */
        step_call sc = {ops, ctx};
        st = ps_retry_settle(r, call_step, &sc, err);
        ps_settled how = ps_retry_settled(st);
        if (how == PS_SETTLED_APPLIED) {
            if (r->p.log)  /* OK: psd answered its version (its record; after a restart, its checkpoint's) */
                fprintf(r->p.log, "%s: context %llx was applied once (%s); not running the %s again\n", r->p.who,
                        (unsigned long long)ctx, st == PS_OK ? "its Step answers OK" : err ? err->msg :
                        ps_status_name(st), unit);
            return PS_OK;
        }
        if (how != PS_SETTLED_NOT_APPLIED) return st;
        if (st == PS_ERR_ABORTED) {
            if (late_again(r, unit, &late, err)) continue;
            return st;
        }
        if (r->p.log)
            fprintf(r->p.log, "%s: context %llx not applied (%s); running the %s again\n", r->p.who,
                    (unsigned long long)ctx, ps_status_name(st), unit);
        /* FAILED_PRECONDITION: psd holds it, unstepped (NOT_FOUND: gone) */
        if (st == PS_ERR_FAILED_PRECONDITION && ops->release) ops->release(ops->arg, ctx);
    }
}

void ps_retry_mask_names(unsigned mask, int n, const char *const *names, char *buf, size_t len) {
    size_t at = 0;
    if (len) buf[0] = 0;
    for (int i = 0; i < n && at < len; i++)
        if (mask & (1u << i)) at += (size_t)snprintf(buf + at, len - at, "%s%s", at ? ", " : "", names[i]);
}

typedef struct server_step_call {
    const ps_multi_ops *ops;
    int server;
    uint64_t ctx;
} server_step_call;

static ps_status call_server_step(void *arg, ps_err *err) {
    server_step_call *s = arg;
    return s->ops->step(s->ops->arg, s->server, s->ctx, err);
}

/* ReleaseContext of ctx on the servers of mask (best effort). */
static void release_multi(const ps_multi_ops *ops, unsigned mask, uint64_t ctx) {
    for (int i = 0; ops->release && i < ops->n_servers; i++)
        if (mask & (1u << i)) ops->release(ops->arg, i, ctx);
}

ps_status ps_retry_once_multi(ps_retry *r, ps_ctx_ids *ids, const ps_multi_ops *ops, ps_multi_result *res,
                              ps_err *err) {
    PS_ASSERT(ops->n_servers >= 1 && ops->n_servers <= PS_RETRY_MAX_SERVERS);
    ps_retry_reset(r);
    const char *unit = ops->unit ? ops->unit : "unit";
    *res = (ps_multi_result){0};
    int lost_runs = 0;
    for (;;) {
        uint64_t ctx = ps_ctx_ids_next(ids);
        unsigned touched = 0;
        ps_status st = ops->run(ops->arg, ctx, &touched, err);
        if (st != PS_OK) {  /* no Step was asked anywhere: nothing is applied */
            if (ps_retry_retryable(st) && ps_retry_wait(r, unit, err)) {
                release_multi(ops, touched, ctx);
                continue;
            }
            if (st == PS_ERR_NOT_FOUND && touched && ++lost_runs <= PS_RETRY_MAX_LOST) {
                res->reruns++;
                if (r->p.log)
                    fprintf(r->p.log, "%s: %s; running the %s again (a psd restarted or the context expired)\n",
                            r->p.who, err ? err->msg : "context not found", unit);
                release_multi(ops, touched, ctx);  /* the servers that still hold it */
                continue;
            }
            return st;
        }
        unsigned applied = 0, lost = 0;
        for (int i = 0; i < ops->n_servers; i++) {
            if (!(touched & (1u << i))) continue;
            server_step_call sc = {ops, i, ctx};
            st = call_server_step(&sc, err);
            if (ps_retry_retryable(st)) st = ps_retry_settle(r, call_server_step, &sc, err);
            ps_settled how = ps_retry_settled(st);
            if (how == PS_SETTLED_APPLIED) applied |= 1u << i;
            else if (how == PS_SETTLED_NOT_APPLIED) lost |= 1u << i;
            else return ps_err_prefix(err, "Step of context %llx on %s", (unsigned long long)ctx, ops->names[i]);
        }
        *res = (ps_multi_result){.ctx = ctx, .touched = touched, .applied = applied, .lost = lost,
                                 .reruns = res->reruns};
        if (!lost) return PS_OK;
        char an[256], ln[256];
        ps_retry_mask_names(applied, ops->n_servers, ops->names, an, sizeof an);
        ps_retry_mask_names(lost, ops->n_servers, ops->names, ln, sizeof ln);
        if (!applied) {  /* lost everywhere: nothing applied, as on one server */
            if (++lost_runs <= PS_RETRY_MAX_LOST) {
                res->reruns++;
                if (r->p.log)
                    fprintf(r->p.log, "%s: context %llx not applied on any server (%s lost it); running the %s "
                            "again\n", r->p.who, (unsigned long long)ctx, ln, unit);
                release_multi(ops, lost, ctx);  /* those that answered FAILED_PRECONDITION still hold it */
                continue;
            }
            return ps_err_set(err, PS_ERR_NOT_FOUND, "%s lost its context %d times in a row (%s)", unit, lost_runs,
                              ln);
        }
        res->partial = 1;
        if (r->p.log)
            fprintf(r->p.log, "%s: partial step: %s of context %llx applied on %s, lost on %s (context gone there: "
                    "restarted or expired); not run again, that would apply it twice on %s\n", r->p.who, unit,
                    (unsigned long long)ctx, an, ln, an);
        for (int i = 0; ops->report && i < ops->n_servers; i++) ops->report(ops->arg, i, ctx, applied, lost);
        return PS_OK;
    }
}
