/* test_retry - the trainer's retry policy and exactly-once steps
 * (trainer/retry.h), driven by fake calls and, mostly, a fake clock.
 *
 *  - only UNAVAILABLE and DEADLINE_EXCEEDED are retried; every other code
 *    ends the call at its first attempt;
 *  - an admission refusal (RESOURCE_EXHAUSTED with psd's hint) is busy,
 *    one without the hint is not; its waits are at least the hint, within
 *    the budget, and the give-up names the admission limits;
 *  - attempts follow the scripted codes; the waits start at backoff_s,
 *    double up to backoff_max_s with jitter in [0.5, 1) of that, and their
 *    sum never exceeds retry_max_s (measured on the fake clock, and on the
 *    real clock as a lower bound only: the budget is used, not skipped);
 *  - settling: an unanswered step is asked again; OK / NOT_FOUND /
 *    FAILED_PRECONDITION decide applied / re-run;
 *  - ps_retry_once against a fake psd that loses answers or its contexts:
 *    every unit's step is applied exactly once, re-runs use fresh ids; a
 *    unit with a push after its Backward (ps-train lm) whose Backward reply
 *    is lost runs again instead of being settled into a step without its
 *    push (marks_step; without it, the older rule, it is - shown);
 *  - ps_retry_once_multi (a batch over several servers) against fake
 *    servers that each apply a context at most once: only touched servers
 *    step; an unanswered Step is settled on its server; lost everywhere =
 *    run again under a fresh id; applied on some and lost on others = a
 *    partial step, not run again (no server applies the batch twice) and
 *    reported to every server with the right names; a failure before the
 *    Steps runs again without any Step of the old id.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "retry.h"

/* ---- a fake clock -------------------------------------------------------- */

typedef struct fake_clock {
    double t;
    double waits[256];
    int nwaits;
} fake_clock;

static double fake_now(void *arg) { return ((fake_clock *)arg)->t; }

static void fake_sleep(void *arg, double s) {
    fake_clock *c = arg;
    CHECK_MSG(s >= 0, "negative wait %g", s);
    if (c->nwaits < 256) c->waits[c->nwaits++] = s;
    c->t += s;
}

static ps_retry_policy fake_policy(fake_clock *c, double max_s, double backoff_s, double backoff_max_s) {
    return (ps_retry_policy){.max_s = max_s, .backoff_s = backoff_s, .backoff_max_s = backoff_max_s,
                             .seed = 42, .who = "test", .log = NULL, .now = fake_now, .sleep = fake_sleep,
                             .clock_arg = c};
}

/* ---- a fake call: returns a scripted sequence of codes ----------------- */

typedef struct script {
    const ps_status *codes;
    int n;          /* after the script: the last code again */
    int calls;
    double cost_s;  /* each call advances the fake clock by this */
    fake_clock *clock;
} script;

static ps_status scripted(void *arg, ps_err *err) {
    script *s = arg;
    ps_status st = s->codes[s->calls < s->n ? s->calls : s->n - 1];
    s->calls++;
    if (s->clock) s->clock->t += s->cost_s;
    if (st == PS_OK) return PS_OK;
    return ps_err_set(err, st, "fake call %d: %s", s->calls, ps_status_name(st));
}

static void test_retryable(void) {
    for (int st = PS_OK; st <= PS_ERR_INTERNAL; st++) {
        bool want = st == PS_ERR_UNAVAILABLE || st == PS_ERR_DEADLINE_EXCEEDED;
        CHECK_MSG(ps_retry_retryable((ps_status)st) == want, "%s", ps_status_name((ps_status)st));
    }
}

static void test_codes_sequence(void) {
    fake_clock c = {.t = 100};
    ps_retry_policy p = fake_policy(&c, 30, 0.2, 10);
    ps_retry r;
    ps_retry_init(&r, &p);
    ps_err e = {0};

    /* Transient failures, then success: one attempt per code. */
    const ps_status ok_after_two[] = {PS_ERR_UNAVAILABLE, PS_ERR_DEADLINE_EXCEEDED, PS_OK};
    script s = {ok_after_two, 3};
    CHECK(ps_retry_call(&r, "call", scripted, &s, &e) == PS_OK);
    CHECK(s.calls == 3 && c.nwaits == 2 && r.tries == 2 && r.total == 2);

    /* Non-retryable codes end the call at once, with their message. */
    const ps_status finals[] = {PS_ERR_INVALID_ARGUMENT, PS_ERR_NOT_FOUND, PS_ERR_FAILED_PRECONDITION,
                                PS_ERR_RESOURCE_EXHAUSTED, PS_ERR_UNAUTHENTICATED,
                                PS_ERR_PERMISSION_DENIED, PS_ERR_INTERNAL};
    for (size_t i = 0; i < sizeof finals / sizeof finals[0]; i++) {
        ps_retry_reset(&r);
        c.nwaits = 0;
        script f = {&finals[i], 1};
        CHECK(ps_retry_call(&r, "call", scripted, &f, &e) == finals[i]);
        CHECK_MSG(f.calls == 1 && c.nwaits == 0, "%s: %d calls, %d waits", ps_status_name(finals[i]), f.calls,
                  c.nwaits);
        CHECK(strstr(e.msg, ps_status_name(finals[i])) != NULL);
    }

    /* A final code after transient ones stops there. */
    ps_retry_reset(&r);
    c.nwaits = 0;
    const ps_status mixed[] = {PS_ERR_UNAVAILABLE, PS_ERR_PERMISSION_DENIED, PS_OK};
    script m = {mixed, 3};
    CHECK(ps_retry_call(&r, "call", scripted, &m, &e) == PS_ERR_PERMISSION_DENIED);
    CHECK(m.calls == 2 && c.nwaits == 1);

    /* max_s = 0: no retries at all. */
    fake_clock c0 = {.t = 5};
    ps_retry_policy p0 = fake_policy(&c0, 0, 0.2, 10);
    ps_retry r0;
    ps_retry_init(&r0, &p0);
    script z = {ok_after_two, 3};
    CHECK(ps_retry_call(&r0, "call", scripted, &z, &e) == PS_ERR_UNAVAILABLE);
    CHECK(z.calls == 1 && c0.nwaits == 0 && r0.total == 0);
}

/* psd's admission refusals: RESOURCE_EXHAUSTED with psd's hint is "busy"
 * (sent again), without it final; the waits are at least the hint, within
 * the budget, and the give-up names the admission limits. */
static void test_busy(void) {
    ps_err e = {0};
    ps_err_set(&e, PS_ERR_RESOURCE_EXHAUSTED, "Forward to x failed: RESOURCE_EXHAUSTED: too many calls");
    CHECK(!ps_retry_busy(&e));                     /* no hint: a message too large, an older psd */
    CHECK(ps_err_retry_after(&e, 500) == PS_ERR_RESOURCE_EXHAUSTED && ps_retry_busy(&e));
    ps_err_prefix(&e, "ps0");
    CHECK(ps_retry_busy(&e));                      /* a prefix keeps the hint */
    ps_err_set(&e, PS_ERR_RESOURCE_EXHAUSTED, "again");
    CHECK(!ps_retry_busy(&e));                     /* a new error clears it */
    ps_err_set(&e, PS_ERR_UNAVAILABLE, "down");
    ps_err_retry_after(&e, 500);
    CHECK(!ps_retry_busy(&e));                     /* only RESOURCE_EXHAUSTED */
    CHECK(!ps_retry_busy(NULL));

    fake_clock c = {.t = 10};
    ps_retry_policy p = fake_policy(&c, 9, 0.2, 10);
    char logbuf[4096] = "";
    FILE *log = fmemopen(logbuf, sizeof logbuf, "w");
    p.log = log;
    ps_retry r;
    ps_retry_init(&r, &p);
    ps_err_set(&e, PS_ERR_RESOURCE_EXHAUSTED, "busy");
    ps_err_retry_after(&e, 2000);
    int n = 0;
    while (ps_retry_wait_busy(&r, "Forward", &e)) n++;
    fclose(log);
    double sum = 0;
    for (int i = 0; i < c.nwaits; i++) {
        sum += c.waits[i];
        /* at least the hint (the last wait may be cut to the budget) */
        if (i < c.nwaits - 1) CHECK_MSG(c.waits[i] >= 2.0, "wait %d: %.3f s, below psd's 2 s hint", i, c.waits[i]);
    }
    CHECK_MSG(n == c.nwaits && n >= 3 && n <= 5, "%d waits", n);
    CHECK_MSG(sum <= 9 + 1e-9, "waited %.3f s of a 9 s budget", sum);
    CHECK_MSG(strstr(logbuf, "psd kept refusing it for its admission limits") &&
              strstr(logbuf, "server.max_calls_per_client"), "%s", logbuf);
}

/* Always UNAVAILABLE: the waits grow as the policy says, and together with
 * the calls' own time they stay within the budget. */
static void test_budget(double cost_s) {
    fake_clock c = {.t = 1e6};  /* a large clock value, like a long uptime */
    const double max_s = 20, b0 = 0.1, bmax = 2;
    ps_retry_policy p = fake_policy(&c, max_s, b0, bmax);
    ps_retry r;
    ps_retry_init(&r, &p);
    ps_err e = {0};
    const ps_status down[] = {PS_ERR_UNAVAILABLE};
    script s = {down, 1, .cost_s = cost_s, .clock = &c};
    double t0 = c.t;
    CHECK(ps_retry_call(&r, "call", scripted, &s, &e) == PS_ERR_UNAVAILABLE);
    double first_failure = t0 + cost_s, sum = 0, want = b0;
    CHECK(s.calls == c.nwaits + 1);
    CHECK(c.nwaits > 5 && c.nwaits < 256);
    for (int i = 0; i < c.nwaits; i++) {
        double w = c.waits[i];
        sum += w;
        CHECK_MSG(w <= want + 1e-12, "wait %d: %g > backoff %g", i, w, want);
        /* Jitter keeps at least half, except where the budget cuts the wait. */
        if (i < c.nwaits - 1) CHECK_MSG(w >= 0.5 * want - 1e-12, "wait %d: %g < half of %g", i, w, want);
        CHECK(w <= bmax + 1e-12);
        want = want * 2 > bmax ? bmax : want * 2;
    }
    double used = c.t - first_failure;
    CHECK_MSG(used <= max_s + cost_s + 1e-9, "used %g s of a %g s budget", used, max_s);
    CHECK_MSG(sum <= max_s + 1e-9, "waits sum to %g s, budget %g s", sum, max_s);
    /* The budget was used, not abandoned early. */
    CHECK_MSG(used >= max_s - 2 * (cost_s + 1e-3), "gave up after %g of %g s", used, max_s);
    CHECK(r.tries == c.nwaits);

    /* Reset: a new budget, and the backoff starts small again. */
    ps_retry_reset(&r);
    c.nwaits = 0;
    const ps_status once[] = {PS_ERR_DEADLINE_EXCEEDED, PS_OK};
    script s2 = {once, 2};
    CHECK(ps_retry_call(&r, "call", scripted, &s2, &e) == PS_OK);
    CHECK(c.nwaits == 1 && c.waits[0] <= b0 + 1e-12 && c.waits[0] >= 0.5 * b0 - 1e-12);
}

/* The real clock: a spent budget means at least max_s passed (sleeps never
 * end early); no upper bound tighter than "it ended" on a loaded machine. */
static void test_real_clock(void) {
    const double max_s = 0.3;
    ps_retry_policy p = {.max_s = max_s, .backoff_s = 0.02, .backoff_max_s = 0.1, .seed = 7};
    ps_retry r;
    ps_retry_init(&r, &p);
    ps_err e = {0};
    const ps_status down[] = {PS_ERR_DEADLINE_EXCEEDED};
    script s = {down, 1};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    CHECK(ps_retry_call(&r, "call", scripted, &s, &e) == PS_ERR_DEADLINE_EXCEEDED);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double el = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    CHECK_MSG(el >= max_s - 2e-3, "gave up after %.3f s of a %.1f s budget", el, max_s);
    CHECK(s.calls >= 3 && s.calls == r.tries + 1);
    printf("real clock: %d attempts in %.3f s (budget %.1f s)\n", s.calls, el, max_s);
}

static void test_settle(void) {
    fake_clock c = {.t = 0};
    ps_retry_policy p = fake_policy(&c, 10, 0.1, 1);
    ps_retry r;
    ps_retry_init(&r, &p);
    ps_err e = {0};
    struct {
        ps_status codes[3];
        int n;
        ps_status want;
        int calls;
    } cases[] = {
        {{PS_OK}, 1, PS_OK, 1},                                              /* it was applied */
        {{PS_ERR_UNAVAILABLE, PS_OK}, 2, PS_OK, 2},                          /* psd back, applied */
        {{PS_ERR_UNAVAILABLE, PS_ERR_NOT_FOUND}, 2, PS_ERR_NOT_FOUND, 2},    /* psd restarted: lost */
        {{PS_ERR_FAILED_PRECONDITION}, 1, PS_ERR_FAILED_PRECONDITION, 1},    /* no gradients yet */
        {{PS_ERR_ALREADY_EXISTS}, 1, PS_ERR_ALREADY_EXISTS, 1},              /* too old to settle: applied */
        /* in use (the first Step waits in its sync round), then applied */
        {{PS_ERR_UNAVAILABLE, PS_ERR_UNAVAILABLE, PS_OK}, 3, PS_OK, 3},
        {{PS_ERR_INVALID_ARGUMENT}, 1, PS_ERR_INVALID_ARGUMENT, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_retry_reset(&r);
        ps_err_set(&e, PS_ERR_DEADLINE_EXCEEDED, "Step: no answer");
        script s = {cases[i].codes, cases[i].n};
        ps_status st = ps_retry_settle(&r, scripted, &s, &e);
        CHECK_MSG(st == cases[i].want && s.calls == cases[i].calls, "case %zu: %s after %d calls", i,
                  ps_status_name(st), s.calls);
    }
    /* psd never comes back: the budget ends it with the transport error. */
    ps_retry_reset(&r);
    ps_err_set(&e, PS_ERR_UNAVAILABLE, "Step: connection refused");
    const ps_status down[] = {PS_ERR_UNAVAILABLE};
    script s = {down, 1};
    double t0 = c.t;
    CHECK(ps_retry_settle(&r, scripted, &s, &e) == PS_ERR_UNAVAILABLE);
    CHECK(s.calls > 1 && c.t - t0 <= 10 + 1e-9);
    /* No budget: nothing is called, the original failure stands. */
    ps_retry_policy p0 = fake_policy(&c, 0, 0.1, 1);
    ps_retry r0;
    ps_retry_init(&r0, &p0);
    ps_err_set(&e, PS_ERR_DEADLINE_EXCEEDED, "Backward: deadline");
    script s0 = {down, 1};
    CHECK(ps_retry_settle(&r0, scripted, &s0, &e) == PS_ERR_DEADLINE_EXCEEDED && s0.calls == 0);
}

/* ---- a fake psd for ps_retry_once ------------------------------------- */

enum { FWD, BWD, STEP, PUSH };
typedef struct fault {
    int unit;        /* which unit (0-based) */
    int call;        /* FWD, BWD, STEP */
    int attempt;     /* of that call within the unit (0-based) */
    ps_status code;  /* what the trainer sees */
    int applied;     /* STEP, BWD: psd applied it before the answer was lost */
    int restart;     /* psd forgets every context (before answering) */
    int in_use;      /* STEP only: the step stays pending (a sync round) for this many more Step
                      * calls, each answered UNAVAILABLE "in use"; then it is applied */
    int forget;      /* STEP only, with applied: the record is gone ("too old to settle") */
} fault;

#define MAX_CTX 64
typedef struct fake_psd {
    uint64_t ctx[MAX_CTX];
    int state[MAX_CTX];  /* 1 forwarded, 2 backwarded, 3 applied */
    int nctx;
    int applied_per_unit[16];
    int unit;
    int attempts[4];
    uint64_t ids_seen[MAX_CTX];
    int nids;
    const fault *faults;
    int nfaults;
    int steps_asked;
    int pending;     /* Step calls still answered "in use" before the pending step applies */
    uint64_t pending_ctx;
    int too_old;     /* the next Steps find no record: ALREADY_EXISTS */
    int with_push;   /* units send PUSH after BWD (ps-train lm's PushGradients): state 4 = complete */
    int incomplete;  /* steps applied to a context without its PUSH */
    int marks_step;  /* ps_once_ops.marks_step: the run says PS_KEPT_STEP before its Step */
    int release;     /* ps_once_ops.release set: abandoned contexts are released (state 5) */
    int released, released_applied;  /* releases of a held context; of an applied one (never) */
} fake_psd;

/* Contexts the fake psd still holds unstepped (forwarded, backwarded,
 * pushed): what a re-run leaves behind until its TTL. */
static int held_ctx(const fake_psd *f) {
    int n = 0;
    for (int i = 0; i < f->nctx; i++) n += f->state[i] == 1 || f->state[i] == 2 || f->state[i] == 4;
    return n;
}

static int find_ctx(fake_psd *f, uint64_t ctx) {
    for (int i = 0; i < f->nctx; i++)
        if (f->ctx[i] == ctx) return i;
    return -1;
}

static const fault *fault_for(fake_psd *f, int call) {
    int a = f->attempts[call]++;
    for (int i = 0; i < f->nfaults; i++)
        if (f->faults[i].unit == f->unit && f->faults[i].call == call && f->faults[i].attempt == a)
            return &f->faults[i];
    return NULL;
}

/* Step(ctx) on the fake psd: idempotent, as psd's. */
static ps_status fake_step_apply(fake_psd *f, uint64_t ctx, ps_err *err) {
    int i = find_ctx(f, ctx);
    if (i < 0) return ps_err_set(err, PS_ERR_NOT_FOUND, "Step: context %llx not found", (unsigned long long)ctx);
    if (f->state[i] == 1) return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "Step: no gradients");
    if (f->state[i] == 2 || f->state[i] == 4) {  /* psd cannot tell a context that lacks its push */
        if (f->with_push && f->state[i] == 2) f->incomplete++;
        f->state[i] = 3;
        f->applied_per_unit[f->unit]++;
    }
    return PS_OK;
}

static ps_status fake_call(fake_psd *f, int call, uint64_t ctx, ps_err *err) {
    if (call == STEP && f->pending && ctx == f->pending_ctx) {  /* its round has not closed yet */
        f->pending--;
        if (f->pending) return ps_err_set(err, PS_ERR_UNAVAILABLE, "fake: context %llx in use",
                                          (unsigned long long)ctx);
        ps_err scratch;
        fake_step_apply(f, ctx, &scratch);  /* the round closed: applied once */
    }
    if (call == STEP && f->too_old)
        return ps_err_set(err, PS_ERR_ALREADY_EXISTS, "fake: context %llx too old to settle", (unsigned long long)ctx);
    const fault *ft = fault_for(f, call);
    if (ft && call == STEP && ft->in_use) {  /* deferred past the deadline, still in its round */
        f->pending = ft->in_use + 1;
        f->pending_ctx = ctx;
        return ps_err_set(err, PS_ERR_DEADLINE_EXCEEDED, "fake: Step deadline (waiting in its round)");
    }
    if (ft && ft->restart) f->nctx = 0;
    if (ft && call == STEP && ft->applied) {
        ps_err scratch;
        fake_step_apply(f, ctx, &scratch);
        if (ft->forget) f->too_old = 1;
    }
    if (ft && call == BWD && ft->applied) {
        int k = find_ctx(f, ctx);
        if (k >= 0) f->state[k] = 2;
    }
    if (ft && ft->code) return ps_err_set(err, ft->code, "fake %d: %s", call, ps_status_name(ft->code));
    int i = find_ctx(f, ctx);
    switch (call) {
    case FWD:
        PS_ASSERT(f->nctx < MAX_CTX);
        f->ctx[f->nctx] = ctx;
        f->state[f->nctx++] = 1;
        return PS_OK;
    case BWD:
        if (i < 0) return ps_err_set(err, PS_ERR_NOT_FOUND, "Backward: context not found");
        f->state[i] = 2;
        return PS_OK;
    case PUSH:
        if (i < 0) return ps_err_set(err, PS_ERR_NOT_FOUND, "PushGradients: context not found");
        f->state[i] = 4;
        return PS_OK;
    default:
        return fake_step_apply(f, ctx, err);
    }
}

static ps_status unit_run(void *arg, uint64_t ctx, int *kept, ps_err *err) {
    fake_psd *f = arg;
    if (f->nids < MAX_CTX) f->ids_seen[f->nids++] = ctx;
    ps_status st = fake_call(f, FWD, ctx, err);
    if (st) return st;
    *kept = PS_KEPT_HELD;
    if ((st = fake_call(f, BWD, ctx, err))) return st;
    if (f->with_push && (st = fake_call(f, PUSH, ctx, err))) return st;
    if (f->marks_step) *kept = PS_KEPT_STEP;
    return fake_call(f, STEP, ctx, err);
}

static void unit_release(void *arg, uint64_t ctx) {
    fake_psd *f = arg;
    int i = find_ctx(f, ctx);
    if (i < 0) return;
    if (f->state[i] == 3) f->released_applied++;
    else f->released++, f->state[i] = 5;
}

static ps_status unit_step(void *arg, uint64_t ctx, ps_err *err) {
    fake_psd *f = arg;
    f->steps_asked++;
    return fake_call(f, STEP, ctx, err);
}

/* Run units 0..n-1 through ps_retry_once with these faults (f's with_push
 * and marks_step kept). */
static ps_status run_units(fake_psd *f, int n, const fault *faults, int nfaults, double max_s) {
    fake_clock c = {.t = 0};
    ps_retry_policy p = fake_policy(&c, max_s, 0.1, 1);
    ps_retry r;
    ps_retry_init(&r, &p);
    ps_ctx_ids ids;
    ps_ctx_ids_init(&ids);
    int with_push = f->with_push, marks_step = f->marks_step, release = f->release;
    memset(f, 0, sizeof *f);
    f->with_push = with_push;
    f->marks_step = marks_step;
    f->release = release;
    f->faults = faults;
    f->nfaults = nfaults;
    ps_once_ops ops = {.unit = "batch", .run = unit_run, .step = unit_step, .arg = f, .marks_step = f->marks_step,
                       .release = f->release ? unit_release : NULL};
    ps_err e = {0};
    ps_status st = PS_OK;
    for (f->unit = 0; f->unit < n; f->unit++) {
        memset(f->attempts, 0, sizeof f->attempts);
        if ((st = ps_retry_once(&r, &ids, &ops, &e))) break;
    }
    return st;
}

static int ids_distinct(const fake_psd *f) {
    for (int i = 0; i < f->nids; i++)
        for (int j = i + 1; j < f->nids; j++)
            if (f->ids_seen[i] == f->ids_seen[j]) return 0;
    return 1;
}

static void test_once(void) {
    fake_psd f = {0};
    /* No faults: one run per unit. */
    CHECK(run_units(&f, 4, NULL, 0, 10) == PS_OK);
    for (int u = 0; u < 4; u++) CHECK(f.applied_per_unit[u] == 1);
    CHECK(f.nids == 4 && ids_distinct(&f) && f.steps_asked == 0);

    /* Forward unanswered twice (psd down): retried, applied once. */
    const fault fwd_down[] = {{1, FWD, 0, PS_ERR_UNAVAILABLE}, {1, FWD, 1, PS_ERR_DEADLINE_EXCEEDED}};
    CHECK(run_units(&f, 3, fwd_down, 2, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.applied_per_unit[1] == 1 && f.applied_per_unit[2] == 1);
    CHECK(f.nids == 5 && ids_distinct(&f) && f.steps_asked == 0);

    /* The step was applied but its answer lost: settled, not run again. */
    const fault lost_answer[] = {{0, STEP, 0, PS_ERR_DEADLINE_EXCEEDED, .applied = 1}};
    CHECK(run_units(&f, 2, lost_answer, 1, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.applied_per_unit[1] == 1);
    CHECK(f.nids == 2 && f.steps_asked == 1);

    /* Step unanswered and not applied (psd still down once): the settling
     * Step applies it - once. */
    const fault step_down[] = {{0, STEP, 0, PS_ERR_UNAVAILABLE}, {0, STEP, 1, PS_ERR_UNAVAILABLE}};
    CHECK(run_units(&f, 1, step_down, 2, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.nids == 1 && f.steps_asked == 2);

    /* psd restarted during Backward: the settling Step finds nothing, the
     * unit runs again under a fresh id and is applied once. */
    const fault restart[] = {{0, BWD, 0, PS_ERR_UNAVAILABLE, .restart = 1}};
    CHECK(run_units(&f, 2, restart, 1, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.applied_per_unit[1] == 1);
    CHECK(f.nids == 3 && ids_distinct(&f) && f.steps_asked == 1);

    /* Context expired before Backward (NOT_FOUND): re-run at most
     * PS_RETRY_MAX_LOST times, then an error. */
    const fault expired[] = {{0, BWD, 0, .restart = 1}};
    CHECK(run_units(&f, 1, expired, 1, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.nids == 2);
    fault always_expired[PS_RETRY_MAX_LOST + 1];
    for (int i = 0; i <= PS_RETRY_MAX_LOST; i++) always_expired[i] = (fault){0, BWD, i, .restart = 1};
    CHECK(run_units(&f, 1, always_expired, PS_RETRY_MAX_LOST + 1, 10) == PS_ERR_NOT_FOUND);
    CHECK(f.applied_per_unit[0] == 0 && f.nids == PS_RETRY_MAX_LOST + 1);

    /* A final error after the Forward: no settling, no re-run. */
    const fault refused[] = {{0, BWD, 0, PS_ERR_INVALID_ARGUMENT}};
    CHECK(run_units(&f, 1, refused, 1, 10) == PS_ERR_INVALID_ARGUMENT);
    CHECK(f.applied_per_unit[0] == 0 && f.nids == 1 && f.steps_asked == 0);

    /* A sync straggler: its round closed without it (ABORTED, nothing
     * applied, the context dropped): the unit runs again under a fresh id,
     * into the open round - whether the Step said so at once or when it was
     * settled - at most PS_RETRY_MAX_LATE times in a row. */
    const fault late[] = {{0, STEP, 0, PS_ERR_ABORTED}, {1, STEP, 0, PS_ERR_DEADLINE_EXCEEDED},
                          {1, STEP, 1, PS_ERR_ABORTED}};
    CHECK(run_units(&f, 2, late, 3, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.applied_per_unit[1] == 1 && f.nids == 4 && ids_distinct(&f));
    fault always_late[PS_RETRY_MAX_LATE + 1];
    for (int i = 0; i <= PS_RETRY_MAX_LATE; i++) always_late[i] = (fault){0, STEP, i, PS_ERR_ABORTED};
    ps_status lst = run_units(&f, 1, always_late, PS_RETRY_MAX_LATE + 1, 10);
    CHECK(lst == PS_ERR_ABORTED && f.applied_per_unit[0] == 0 && f.nids == PS_RETRY_MAX_LATE + 1);

    /* The Step outlived its deadline while waiting in a sync round: the
     * settling Steps find the context in use (UNAVAILABLE) until the round
     * closes, then its record: applied once, never run again. */
    const fault in_round[] = {{1, STEP, 0, PS_ERR_DEADLINE_EXCEEDED, .in_use = 4}};
    CHECK(run_units(&f, 3, in_round, 1, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.applied_per_unit[1] == 1 && f.applied_per_unit[2] == 1);
    CHECK(f.nids == 3 && f.steps_asked == 5);

    /* Applied, answer lost, and the record gone ("too old to settle",
     * ALREADY_EXISTS): applied once, not run again. */
    const fault forgotten[] = {{0, STEP, 0, PS_ERR_DEADLINE_EXCEEDED, .applied = 1, .forget = 1}};
    CHECK(run_units(&f, 1, forgotten, 1, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.nids == 1 && f.steps_asked == 1);

    /* No budget: an unanswered Backward is the unit's error. */
    const fault bwd_down[] = {{0, BWD, 0, PS_ERR_UNAVAILABLE}};
    CHECK(run_units(&f, 1, bwd_down, 1, 0) == PS_ERR_UNAVAILABLE);
    CHECK(f.nids == 1 && f.steps_asked == 0);

    /* A unit with a call after its Backward (ps-train lm: PushGradients,
     * then Step with the clip factor); the Backward applied, its answer
     * lost. Without marks_step it is settled by Step: applied, but without
     * its push (the gap docs/protocol.md closed); with marks_step no Step
     * was sent, so it runs again under a fresh id: applied once, whole. */
    const fault bwd_lost[] = {{0, BWD, 0, PS_ERR_DEADLINE_EXCEEDED, .applied = 1}};
    f = (fake_psd){.with_push = 1};
    CHECK(run_units(&f, 1, bwd_lost, 1, 10) == PS_OK);
    CHECK_MSG(f.applied_per_unit[0] == 1 && f.incomplete == 1 && f.steps_asked == 1, "legacy: %d applied, %d "
              "incomplete, %d settling Steps", f.applied_per_unit[0], f.incomplete, f.steps_asked);
    f = (fake_psd){.with_push = 1, .marks_step = 1};
    CHECK(run_units(&f, 1, bwd_lost, 1, 10) == PS_OK);
    CHECK_MSG(f.applied_per_unit[0] == 1 && f.incomplete == 0 && f.steps_asked == 0 && f.nids == 2 &&
              ids_distinct(&f), "marks_step: %d applied, %d incomplete, %d settling Steps, %d ids",
              f.applied_per_unit[0], f.incomplete, f.steps_asked, f.nids);
    /* ... the push unanswered (psd down): the same */
    const fault push_down[] = {{0, PUSH, 0, PS_ERR_UNAVAILABLE}};
    CHECK(run_units(&f, 2, push_down, 1, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.applied_per_unit[1] == 1 && f.incomplete == 0 && f.steps_asked == 0);
    /* ... and a lost Step reply is still settled, never run again */
    const fault step_lost[] = {{0, STEP, 0, PS_ERR_DEADLINE_EXCEEDED, .applied = 1}};
    CHECK(run_units(&f, 1, step_lost, 1, 10) == PS_OK);
    CHECK(f.applied_per_unit[0] == 1 && f.nids == 1 && f.steps_asked == 1 && f.incomplete == 0);

    /* The context a re-run abandons (rule 5: the Backward applied, its
     * answer lost) stays on psd until its TTL without release; with it,
     * it is released once - unstepped, never an applied one - and psd
     * holds nothing of the unit afterwards. */
    CHECK(run_units(&f, 1, bwd_lost, 1, 10) == PS_OK);
    CHECK_MSG(held_ctx(&f) == 1 && f.released == 0, "no release: %d held", held_ctx(&f));
    f = (fake_psd){.with_push = 1, .marks_step = 1, .release = 1};
    CHECK(run_units(&f, 1, bwd_lost, 1, 10) == PS_OK);
    CHECK_MSG(held_ctx(&f) == 0 && f.released == 1 && f.released_applied == 0 && f.applied_per_unit[0] == 1 &&
              f.nids == 2, "release: %d held, %d released, %d applied ones released, %d applied", held_ctx(&f),
              f.released, f.released_applied, f.applied_per_unit[0]);
    /* ... and neither a settled Step (applied) nor a context psd lost is released */
    CHECK(run_units(&f, 1, step_lost, 1, 10) == PS_OK);
    CHECK(f.released == 0 && f.released_applied == 0 && f.applied_per_unit[0] == 1);
    const fault lost_ctx[] = {{0, BWD, 0, PS_ERR_NOT_FOUND, .restart = 1}};
    CHECK(run_units(&f, 1, lost_ctx, 1, 10) == PS_OK);
    CHECK(f.released == 0 && f.nids == 2 && f.applied_per_unit[0] == 1);
    f = (fake_psd){0};
}

static void test_ctx_ids(void) {
    ps_ctx_ids a, b;
    ps_ctx_ids_init(&a);
    ps_ctx_ids_init(&b);
    uint64_t x = ps_ctx_ids_next(&a), y = ps_ctx_ids_next(&a);
    CHECK(x != y && (x >> 32) == (y >> 32) && (x & 0xffffffffULL) != 0);
    CHECK(a.base != b.base);  /* two processes: random high halves (fails with p = 2^-32) */
}

/* ---- a batch over several fake servers --------------------------------- */

#define FS 3
typedef struct fake_server {
    uint64_t contexts[64];  /* contexts holding state (forwarded, not stepped) */
    int ncontexts;
    uint64_t applied[64];   /* contexts whose Step was applied */
    int napplied;
    int lose_next;          /* the next Step finds no context (a restart) */
    int drop_next_reply;    /* the next Step is applied but its answer is lost */
    ps_status refuse;       /* the next Step fails with this (final) */
} fake_server;

typedef struct fake_cluster {
    fake_server s[FS];
    unsigned use;           /* servers a run touches */
    int fail_run;           /* the next run fails UNAVAILABLE after touching */
    int lose_always;        /* every Step finds no context */
    int runs, steps_sent;
    uint64_t last_ctx;
    int reports;
    unsigned rep_applied, rep_lost;
    int rep_to[FS];
    int released[FS];       /* ReleaseContext calls per server */
    uint64_t released_ctx;
} fake_cluster;

static int has(const uint64_t *v, int n, uint64_t x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

static ps_status mrun(void *arg, uint64_t ctx, unsigned *touched, ps_err *err) {
    fake_cluster *c = arg;
    c->runs++;
    c->last_ctx = ctx;
    for (int i = 0; i < FS; i++)
        if (c->use & (1u << i)) {
            *touched |= 1u << i;
            c->s[i].contexts[c->s[i].ncontexts++ % 64] = ctx;
            if (c->fail_run) {
                c->fail_run = 0;
                return ps_err_set(err, PS_ERR_UNAVAILABLE, "fake: Forward unanswered");
            }
        }
    return PS_OK;
}

static ps_status mstep(void *arg, int server, uint64_t ctx, ps_err *err) {
    fake_cluster *c = arg;
    fake_server *s = &c->s[server];
    c->steps_sent++;
    if (s->refuse) {
        ps_status st = s->refuse;
        s->refuse = PS_OK;
        return ps_err_set(err, st, "fake: refused");
    }
    if (has(s->applied, s->napplied, ctx)) return PS_OK; /* the finished-Step record */
    if (s->lose_next || c->lose_always) {
        s->lose_next = 0;
        s->ncontexts = 0;
        return ps_err_set(err, PS_ERR_NOT_FOUND, "fake: context %llx not found", (unsigned long long)ctx);
    }
    if (!has(s->contexts, s->ncontexts < 64 ? s->ncontexts : 64, ctx))
        return ps_err_set(err, PS_ERR_NOT_FOUND, "fake: context %llx not found", (unsigned long long)ctx);
    s->applied[s->napplied++ % 64] = ctx;
    if (s->drop_next_reply) {
        s->drop_next_reply = 0;
        return ps_err_set(err, PS_ERR_DEADLINE_EXCEEDED, "fake: Step answer lost");
    }
    return PS_OK;
}

static void mreport(void *arg, int server, uint64_t ctx, unsigned applied, unsigned lost) {
    fake_cluster *c = arg;
    (void)ctx;
    c->reports++;
    c->rep_to[server]++;
    c->rep_applied = applied;
    c->rep_lost = lost;
}

static void mrelease(void *arg, int server, uint64_t ctx) {
    fake_cluster *c = arg;
    c->released[server]++;
    c->released_ctx = ctx;
}

static void test_once_multi(void) {
    fake_clock clk = {.t = 0};
    ps_retry_policy p = fake_policy(&clk, 30, 0.1, 1);
    ps_retry r;
    ps_retry_init(&r, &p);
    ps_ctx_ids ids;
    ps_ctx_ids_init(&ids);
    static const char *const names[FS] = {"ps0", "ps1", "ps2"};
    ps_err e = {0};
    ps_multi_result res;

    /* 1. touched ps0 and ps1 (not ps2): both step once, no partial. */
    fake_cluster c = {.use = 3};
    ps_multi_ops ops = {.unit = "batch", .n_servers = FS, .names = names, .run = mrun, .step = mstep,
                        .report = mreport, .release = mrelease, .arg = &c};
    CHECK(ps_retry_once_multi(&r, &ids, &ops, &res, &e) == PS_OK);
    CHECK(c.s[0].napplied == 1 && c.s[1].napplied == 1 && c.s[2].napplied == 0);
    CHECK(c.steps_sent == 2 && !res.partial && res.applied == 3 && res.lost == 0 && c.reports == 0);

    /* 2. ps1 lost the context (restart): partial, not run again, reported to
     *    every server as applied on ps0 / lost on ps1. */
    c = (fake_cluster){.use = 3};
    c.s[1].lose_next = 1;
    CHECK(ps_retry_once_multi(&r, &ids, &ops, &res, &e) == PS_OK);
    CHECK(res.partial && res.applied == 1 && res.lost == 2 && res.reruns == 0);
    CHECK(c.runs == 1 && c.s[0].napplied == 1 && c.s[1].napplied == 0);
    CHECK(c.released[0] == 0 && c.released[1] == 0);  /* a partial step releases nothing: applied on ps0 */
    CHECK(c.reports == FS && c.rep_to[0] == 1 && c.rep_to[1] == 1 && c.rep_to[2] == 1);
    CHECK(c.rep_applied == 1 && c.rep_lost == 2);
    char buf[64];
    ps_retry_mask_names(res.applied | res.lost, FS, names, buf, sizeof buf);
    CHECK_MSG(!strcmp(buf, "ps0, ps1"), "names '%s'", buf);

    /* 3. both lost it: nothing applied anywhere, the batch runs again under a
     *    fresh id and is then applied once on each. */
    c = (fake_cluster){.use = 3};
    c.s[0].lose_next = c.s[1].lose_next = 1;
    CHECK(ps_retry_once_multi(&r, &ids, &ops, &res, &e) == PS_OK);
    CHECK(c.runs == 2 && res.reruns == 1 && !res.partial && res.applied == 3);
    CHECK(c.s[0].napplied == 1 && c.s[1].napplied == 1 && c.s[0].applied[0] == c.last_ctx);
    CHECK(c.reports == 0 && c.released[0] == 1 && c.released[1] == 1 && c.released[2] == 0);

    /* 4. ps1's Step applied but unanswered: settled on ps1 (its record
     *    answers), applied once, no re-run. */
    c = (fake_cluster){.use = 3};
    c.s[1].drop_next_reply = 1;
    double t0 = clk.t;
    CHECK(ps_retry_once_multi(&r, &ids, &ops, &res, &e) == PS_OK);
    CHECK(c.runs == 1 && c.s[0].napplied == 1 && c.s[1].napplied == 1 && !res.partial);
    CHECK(c.steps_sent == 3 && clk.t > t0);  /* the settle waited a backoff, then asked ps1 again */

    /* 5. a failure before the Steps: no Step of that id anywhere, run again. */
    c = (fake_cluster){.use = 5, .fail_run = 1};
    CHECK(ps_retry_once_multi(&r, &ids, &ops, &res, &e) == PS_OK);
    CHECK(c.runs == 2 && c.steps_sent == 2 && c.s[0].napplied == 1 && c.s[2].napplied == 1);
    CHECK(c.s[0].applied[0] == c.last_ctx && c.s[2].applied[0] == c.last_ctx && res.touched == 5);
    /* the abandoned id released where the failed run touched it (ps0), on no other server */
    CHECK_MSG(c.released[0] == 1 && c.released[1] == 0 && c.released[2] == 0 && c.released_ctx != c.last_ctx,
              "released %d %d %d", c.released[0], c.released[1], c.released[2]);

    /* 6. a final refusal of a Step names the server. */
    c = (fake_cluster){.use = 3};
    c.s[1].refuse = PS_ERR_PERMISSION_DENIED;
    CHECK(ps_retry_once_multi(&r, &ids, &ops, &res, &e) == PS_ERR_PERMISSION_DENIED);
    CHECK_MSG(strstr(e.msg, "ps1") != NULL, "message '%s'", e.msg);

    /* 7. lost everywhere every time: gives up after PS_RETRY_MAX_LOST re-runs. */
    c = (fake_cluster){.use = 1, .lose_always = 1};
    CHECK(ps_retry_once_multi(&r, &ids, &ops, &res, &e) == PS_ERR_NOT_FOUND);
    CHECK(c.runs == PS_RETRY_MAX_LOST + 1 && c.s[0].napplied == 0);
}

int main(void) {
    test_retryable();
    test_codes_sequence();
    test_busy();
    test_budget(0);
    test_budget(0.37);
    test_real_clock();
    test_settle();
    test_once();
    test_ctx_ids();
    test_once_multi();
    return check_summary("test_retry");
}
