/* test_consistency - the sync / ssp rules of server/consistency.c with
 * counting callbacks (no model, no gRPC): exactly-once application under
 * concurrency with more trainer threads than the server has, straggler
 * timeouts that shrink and regrow the round, late steps that never count
 * toward a later round, ssp's bound, and shutdown answering every waiter. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "consistency.h"

/* ---- a fake model: counts rounds and what they combined ---------------- */

typedef struct fake {
    pthread_mutex_t mu;
    uint64_t version;
    int rounds;
    int64_t grads_seen;     /* sum over rounds of the members' "gradients" */
    int last_n, last_average;
} fake;

static ps_status fake_apply(void *user, void *const *grads, void *const *args, int n, int average, uint64_t *version,
                            ps_err *err) {
    (void)err;
    fake *f = user;
    for (int i = 0; i < n; i++) CHECK(args[i] != NULL);  /* every member's done argument */
    pthread_mutex_lock(&f->mu);
    for (int i = 0; i < n; i++)
        if (grads[i]) f->grads_seen += *(const int *)grads[i];
    f->rounds++;
    f->last_n = n;
    f->last_average = average;
    *version = ++f->version;
    pthread_mutex_unlock(&f->mu);
    return PS_OK;
}

/* One Step waiting for its answer. */
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int answered;
    ps_status st;
    uint64_t version, round;
    uint32_t members;
    char msg[PS_ERR_MSG_MAX];
} waiter;

static void waiter_init(waiter *w) {
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
}

static void on_done(void *arg, ps_status st, const ps_err *err, uint64_t version, uint64_t round,
                    uint32_t members) {
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->answered++;  /* checked by the waiting side: exactly 1 */
    w->st = st;
    w->version = version;
    w->round = round;
    w->members = members;
    if (err) snprintf(w->msg, sizeof w->msg, "%s", err->msg);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void waiter_wait(waiter *w) {
    pthread_mutex_lock(&w->mu);
    while (!w->answered) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* ---- sync: many trainers, exactly once ------------------------------------ */

#define TRAINERS 6
#define ROUNDS 40

typedef struct trainer_arg {
    ps_cons *c;
    int rank;
    uint64_t versions[ROUNDS];
    uint64_t rounds[ROUNDS];
    int ok, members_ok;
} trainer_arg;

static void *trainer(void *p) {
    trainer_arg *a = p;
    int one = 1;
    uint64_t round = 0;  /* join the open round first, then follow the answers */
    static waiter ws[TRAINERS][ROUNDS];  /* never reused: the answering thread may still hold one */
    for (int i = 0; i < ROUNDS; i++) {
        waiter *wp = &ws[a->rank][i];
        waiter_init(wp);
#define w (*wp)
        ps_err err = {0};
        if (ps_cons_sync_submit(a->c, round, &one, on_done, &w, &err) != PS_OK) {
            return NULL;  /* a->ok stays short: checked after the join */
        }
        waiter_wait(&w);
        if (w.st != PS_OK) return NULL;
        a->versions[i] = w.version;
        a->rounds[i] = w.round;
        a->members_ok += w.members == TRAINERS && w.answered == 1;
        round = w.round + 1;
        a->ok++;
        if (i % 7 == a->rank) usleep(1000);  /* uneven speeds */
#undef w
    }
    return NULL;
}

static void test_sync_exactly_once(void) {
    fake f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    ps_cons_opts o = {.mode = PS_CONS_SYNC, .sync_workers = TRAINERS, .sync_timeout_s = 600};
    ps_err err = {0};
    ps_cons *c = ps_cons_create(&o, fake_apply, &f, &err);
    CHECK_MSG(c != NULL, "%s", err.msg);
    pthread_t th[TRAINERS];
    trainer_arg a[TRAINERS];
    for (int i = 0; i < TRAINERS; i++) {
        a[i] = (trainer_arg){.c = c, .rank = i};
        pthread_create(&th[i], NULL, trainer, &a[i]);
    }
    for (int i = 0; i < TRAINERS; i++) pthread_join(th[i], NULL);
    /* One optimizer step per round, each combining every trainer's gradient once. */
    CHECK(f.rounds == ROUNDS);
    CHECK(f.grads_seen == (int64_t)TRAINERS * ROUNDS);
    CHECK(f.last_n == TRAINERS && f.last_average == 0);
    for (int i = 0; i < TRAINERS; i++) {
        CHECK(a[i].ok == ROUNDS && a[i].members_ok == ROUNDS);
        for (int r = 0; r < ROUNDS; r++) {
            /* every member of a round saw the same version and round */
            CHECK(a[i].versions[r] == a[0].versions[r] && a[i].rounds[r] == a[0].rounds[r]);
            CHECK(a[i].rounds[r] == (uint64_t)r + 1 && a[i].versions[r] == (uint64_t)r + 1);
        }
    }
    ps_cons_stats st;
    ps_cons_stats_get(c, &st);
    CHECK(st.round == ROUNDS + 1 && st.waiting == 0 && st.dropped == 0 && st.timeouts == 0);
    ps_cons_free(c);
}

/* ---- sync: stragglers ---------------------------------------------------------- */

static void test_sync_straggler(void) {
    fake f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    ps_cons_opts o = {.mode = PS_CONS_SYNC, .sync_workers = 3, .sync_timeout_s = 0.05, .sync_reduce = PS_SYNC_MEAN};
    ps_err err = {0};
    ps_cons *c = ps_cons_create(&o, fake_apply, &f, &err);
    int one = 1;
    waiter w1, w2, w3;
    waiter_init(&w1);
    waiter_init(&w2);
    waiter_init(&w3);
    CHECK(ps_cons_sync_submit(c, 1, &one, on_done, &w1, &err) == PS_OK);
    CHECK(ps_cons_sync_submit(c, 0, &one, on_done, &w2, &err) == PS_OK);
    ps_cons_tick(c);  /* may already be past the timeout on a slow machine */
    usleep(60 * 1000);
    ps_cons_tick(c);
    waiter_wait(&w1);
    waiter_wait(&w2);
    CHECK(f.rounds == 1 && f.last_n == 2 && f.last_average == 1);
    CHECK(w1.st == PS_OK && w1.round == 1 && w1.members == 2 && w1.version == w2.version);
    ps_cons_stats st;
    ps_cons_stats_get(c, &st);
    CHECK(st.round == 2 && st.members == 2 && st.timeouts == 1);
    /* Round 2 now completes with two: a dead third worker stalls nothing. */
    waiter_init(&w1);
    waiter_init(&w2);
    CHECK(ps_cons_sync_submit(c, 2, &one, on_done, &w1, &err) == PS_OK);
    CHECK(ps_cons_sync_submit(c, 2, &one, on_done, &w2, &err) == PS_OK);
    waiter_wait(&w1);
    CHECK(f.rounds == 2 && w1.round == 2 && w1.members == 2);
    /* The straggler's late step for round 1 never counts toward round 3. */
    CHECK(ps_cons_sync_submit(c, 1, &one, on_done, &w3, &err) == PS_ERR_ABORTED);
    CHECK_MSG(strstr(err.msg, "round 1 closed") && strstr(err.msg, "round 3"), "%s", err.msg);
    CHECK(!w3.answered);
    ps_cons_stats_get(c, &st);
    CHECK(st.dropped == 1 && st.members == 3 && st.waiting == 0);  /* membership grows back */
    /* A round not open yet is refused. */
    CHECK(ps_cons_sync_submit(c, 9, &one, on_done, &w3, &err) == PS_ERR_INVALID_ARGUMENT);
    /* Shutdown answers the waiting member. */
    CHECK(ps_cons_sync_submit(c, 3, &one, on_done, &w3, &err) == PS_OK);
    ps_cons_close(c);
    waiter_wait(&w3);
    CHECK(w3.st == PS_ERR_UNAVAILABLE);
    CHECK(ps_cons_sync_submit(c, 0, &one, on_done, &w1, &err) == PS_ERR_UNAVAILABLE);
    CHECK(f.rounds == 2);
    ps_cons_free(c);
}

/* ---- sync: more trainers than sync_workers, late and forged round ids ----------- */

static void test_sync_queue(void) {
    fake f = {.mu = PTHREAD_MUTEX_INITIALIZER};
    ps_cons_opts o = {.mode = PS_CONS_SYNC, .sync_workers = 2, .sync_timeout_s = 0.3};
    ps_err err = {0};
    ps_cons *c = ps_cons_create(&o, fake_apply, &f, &err);
    int one = 1;
    waiter w[6];
    for (int i = 0; i < 6; i++) waiter_init(&w[i]);
    /* Three trainers' contexts belong to round 1; two fill it. */
    CHECK(ps_cons_sync_submit(c, 1, &one, on_done, &w[0], &err) == PS_OK);
    CHECK(ps_cons_sync_submit(c, 1, &one, on_done, &w[1], &err) == PS_OK);
    CHECK(w[0].answered && w[0].round == 1 && w[0].members == 2);
    /* The third came in time, only too many: it joins round 2, never dropped. */
    CHECK_MSG(ps_cons_sync_submit(c, 1, &one, on_done, &w[2], &err) == PS_OK, "%s", err.msg);
    CHECK(!w[2].answered);
    CHECK(ps_cons_sync_submit(c, 2, &one, on_done, &w[3], &err) == PS_OK);
    CHECK(w[2].answered == 1 && w[2].st == PS_OK && w[2].round == 2 && w[2].members == 2 && w[3].round == 2);
    ps_cons_stats st;
    ps_cons_stats_get(c, &st);
    CHECK(st.queued == 1 && st.dropped == 0 && st.timeouts == 0 && f.rounds == 2 && f.grads_seen == 4);
    /* A complete round's step coming more than sync_timeout_s after it
     * closed is too stale for the open round: ABORTED, saying so. */
    usleep(400 * 1000);
    CHECK(ps_cons_sync_submit(c, 2, &one, on_done, &w[4], &err) == PS_ERR_ABORTED);
    CHECK_MSG(strstr(err.msg, "round 2 closed complete") && strstr(err.msg, "server.sync_timeout_s") &&
              strstr(err.msg, "run the batch again"), "%s", err.msg);
    CHECK(!w[4].answered);
    /* Round 3 times out short of one member: the membership shrinks to 1. */
    waiter_init(&w[4]);
    CHECK(ps_cons_sync_submit(c, 0, &one, on_done, &w[4], &err) == PS_OK);
    usleep(400 * 1000);
    CHECK(ps_cons_tick(c) == 1);
    waiter_wait(&w[4]);
    ps_cons_stats_get(c, &st);
    CHECK(st.members == 1 && st.timeouts == 1 && st.round == 4);
    /* Its straggler: ABORTED, saying what happened and when; the membership
     * grows back by one. Steps naming round 3 again (forged, or more late
     * contexts than the round was short) change nothing more. */
    CHECK(ps_cons_sync_submit(c, 3, &one, on_done, &w[5], &err) == PS_ERR_ABORTED);
    CHECK_MSG(strstr(err.msg, "round 3 closed without this step") && strstr(err.msg, "1 of 2 members") &&
              strstr(err.msg, "joins round 4") && !strstr(err.msg, "later than"), "%s", err.msg);
    for (int i = 0; i < 5; i++) CHECK(ps_cons_sync_submit(c, 3, &one, on_done, &w[5], &err) == PS_ERR_ABORTED);
    ps_cons_stats_get(c, &st);
    CHECK_MSG(st.members == 2, "membership %u after 6 late steps of a round short of 1", st.members);
    ps_cons_close(c);
    ps_cons_free(c);
    /* A dead trainer shrinks the membership; a new (or restarted) one, whose
     * first round fills up without it, grows it back: its step is queued and
     * the rounds after have both. */
    o.sync_timeout_s = 0.2;
    c = ps_cons_create(&o, fake_apply, &f, &err);
    for (int i = 0; i < 4; i++) waiter_init(&w[i]);
    CHECK(ps_cons_sync_submit(c, 0, &one, on_done, &w[0], &err) == PS_OK);
    usleep(300 * 1000);
    CHECK(ps_cons_tick(c) == 1);               /* round 1 closed by its timeout: membership 1 */
    CHECK(ps_cons_sync_submit(c, 2, &one, on_done, &w[1], &err) == PS_OK && w[1].answered);  /* round 2: alone */
    CHECK_MSG(ps_cons_sync_submit(c, 2, &one, on_done, &w[2], &err) == PS_OK, "%s", err.msg);  /* the newcomer */
    ps_cons_stats_get(c, &st);
    CHECK(!w[2].answered && st.members == 2 && st.queued == 1 && st.round == 3);
    CHECK(ps_cons_sync_submit(c, 3, &one, on_done, &w[3], &err) == PS_OK);
    CHECK(w[2].answered && w[2].round == 3 && w[2].members == 2 && w[3].round == 3);
    ps_cons_free(c);
    /* A round closed long ago, beyond what is remembered: ABORTED, the
     * membership unchanged. */
    o.sync_workers = 1;
    c = ps_cons_create(&o, fake_apply, &f, &err);
    for (int i = 0; i < 100; i++) {
        waiter_init(&w[0]);
        CHECK(ps_cons_sync_submit(c, 0, &one, on_done, &w[0], &err) == PS_OK && w[0].answered);
    }
    CHECK(ps_cons_sync_submit(c, 2, &one, on_done, &w[1], &err) == PS_ERR_ABORTED);
    CHECK_MSG(strstr(err.msg, "round 2 closed long ago"), "%s", err.msg);
    ps_cons_stats_get(c, &st);
    CHECK(st.members == 1);
    ps_cons_free(c);
}

/* ---- ssp ------------------------------------------------------------------------ */

typedef struct ready_rec {
    int called;
    ps_status st;
} ready_rec;

static void on_ready(void *arg, ps_status st, const ps_err *err) {
    (void)err;
    ready_rec *r = arg;
    r->called++;
    r->st = st;
}

static void test_ssp(void) {
    ps_cons_opts o = {.mode = PS_CONS_SSP, .max_staleness = 1, .active_s = 0.2};
    ps_err err = {0};
    ps_cons *c = ps_cons_create(&o, fake_apply, NULL, &err);
    ready_rec r = {0}, r2 = {0};
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 1);
    CHECK(ps_cons_ssp_admit(c, 2, "h", NULL, on_ready, &r, &err) == 1);
    ps_cons_stepped(c, 1, "h");
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 1);   /* 1 ahead: within the bound */
    ps_cons_stepped(c, 1, "h");
    CHECK(ps_cons_clock(c, 1) == 2 && ps_cons_clock(c, 2) == 0);
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 0);   /* 2 ahead: held back */
    CHECK(ps_cons_ssp_admit(c, 2, "h", NULL, on_ready, &r2, &err) == 1);  /* the slowest always runs */
    CHECK(r.called == 0);
    ps_cons_stepped(c, 2, "h");                               /* slowest catches up to 1 */
    CHECK(r.called == 1 && r.st == PS_OK);
    ps_cons_stats st;
    ps_cons_stats_get(c, &st);
    CHECK(st.ssp_deferred == 1 && st.ssp_waiting == 0);
    /* A rank that goes quiet stops holding the others back. */
    ps_cons_stepped(c, 1, "h");
    ps_cons_stepped(c, 1, "h");
    r = (ready_rec){0};
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 0);
    usleep(300 * 1000);                                  /* rank 2 inactive now; rank 1 is waiting */
    ps_cons_tick(c);
    CHECK(r.called == 1 && r.st == PS_OK);
    /* Shutdown answers a held Forward. */
    ps_cons_stepped(c, 2, "h");
    ps_cons_stepped(c, 1, "h");
    ps_cons_stepped(c, 1, "h");
    ps_cons_stepped(c, 1, "h");
    r = (ready_rec){0};
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 0);
    ps_cons_close(c);
    CHECK(r.called == 1 && r.st == PS_ERR_UNAVAILABLE);
    ps_cons_free(c);
    /* A newcomer joins at the present: rank 7 starts at the slowest active
     * clock and holds nobody back for the steps it never saw. */
    o = (ps_cons_opts){.mode = PS_CONS_SSP, .max_staleness = 0, .active_s = 60};
    c = ps_cons_create(&o, fake_apply, NULL, &err);
    for (int i = 0; i < 5; i++) {
        ps_cons_stepped(c, 1, "h");
        ps_cons_stepped(c, 2, "h");
    }
    r = (ready_rec){0};
    CHECK(ps_cons_ssp_admit(c, 7, "h", NULL, on_ready, &r, &err) == 1);
    CHECK(ps_cons_clock(c, 7) == 5);
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 1);  /* 1 is not ahead of the newcomer */
    ps_cons_stepped(c, 1, "h");
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 0);  /* now it is, with bound 0 */
    ps_cons_stepped(c, 7, "h");
    ps_cons_stepped(c, 2, "h");
    CHECK(r.called == 1 && r.st == PS_OK);
    ps_cons_free(c);
    /* hogwild admits everything and holds nothing. */
    o.mode = PS_CONS_HOGWILD;
    c = ps_cons_create(&o, fake_apply, NULL, &err);
    for (int i = 0; i < 10; i++) ps_cons_stepped(c, 1, "h");
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 1);
    ps_cons_free(c);
}

/* ssp clocks: every uint32 is a rank (no sentinel), ranks never share a
 * clock, a rank belongs to the identity that first used it, and
 * ssp_world_size bounds them. */
static void test_ssp_ranks(void) {
    ps_cons_opts o = {.mode = PS_CONS_SSP, .max_staleness = 0, .active_s = 60};
    ps_err err = {0};
    ps_cons *c = ps_cons_create(&o, fake_apply, NULL, &err);
    ready_rec r = {0}, r2 = {0};
    const uint32_t top = UINT32_MAX;
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 1);
    CHECK(ps_cons_ssp_admit(c, top, "x", NULL, on_ready, &r, &err) == 1);
    ps_cons_stepped(c, 1, "h");
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 0);   /* 1 ahead of rank 2^32-1 */
    ps_cons_stepped(c, top, "x");                                  /* the top rank steps like any */
    CHECK_MSG(ps_cons_clock(c, top) == 1 && r.called == 1 && r.st == PS_OK, "rank %u clock %llu, released %d",
              top, (unsigned long long)ps_cons_clock(c, top), r.called);
    /* ranks past 4095 each have their own clock */
    CHECK(ps_cons_ssp_admit(c, 5000, "y", NULL, on_ready, &r2, &err) == 1);
    CHECK(ps_cons_ssp_admit(c, 6000, "y", NULL, on_ready, &r2, &err) == 1);
    uint64_t c6 = ps_cons_clock(c, 6000);
    ps_cons_stepped(c, 5000, "y");
    ps_cons_stepped(c, 5000, "y");
    CHECK(ps_cons_clock(c, 6000) == c6 && ps_cons_clock(c, 5000) == c6 + 2);
    /* another identity: refused while the rank is active; its steps move nothing */
    r2 = (ready_rec){0};
    CHECK(ps_cons_ssp_admit(c, 1, "intruder", NULL, on_ready, &r2, &err) == -1 && err.code == PS_ERR_PERMISSION_DENIED);
    CHECK_MSG(strstr(err.msg, "trainer_rank 1") && strstr(err.msg, "another client"), "%s", err.msg);
    uint64_t c1 = ps_cons_clock(c, 1);
    ps_cons_stepped(c, 1, "intruder");
    CHECK(ps_cons_clock(c, 1) == c1 && r2.called == 0);
    ps_cons_free(c);
    /* ssp_world_size: ranks below it only */
    o.ssp_world_size = 4;
    c = ps_cons_create(&o, fake_apply, NULL, &err);
    CHECK(ps_cons_ssp_admit(c, 3, "h", NULL, on_ready, &r, &err) == 1);
    CHECK(ps_cons_ssp_admit(c, 4, "h", NULL, on_ready, &r, &err) == -1 && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "server.ssp_world_size is 4"), "%s", err.msg);
    CHECK(ps_cons_ssp_admit(c, top, "h", NULL, on_ready, &r, &err) == -1);
    ps_cons_free(c);
    /* without it, at most 4096 active ranks; an inactive one's slot is reused.
     * The 4096 admissions must all fall within active_s of each other for the
     * table to be full: on a loaded machine the window doubles until they do
     * (a property of the table, not a speed bound). */
    int tried = 0;
    for (double as = 0.2; as < 30; as *= 2) {
        o = (ps_cons_opts){.mode = PS_CONS_SSP, .max_staleness = 1000, .active_s = as};
        c = ps_cons_create(&o, fake_apply, NULL, &err);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int ok = 0;
        for (uint32_t k = 0; k < 4096; k++) ok += ps_cons_ssp_admit(c, 100000 + k, "many", NULL, on_ready, &r, &err) == 1;
        int full = ps_cons_ssp_admit(c, 7, "h", NULL, on_ready, &r, &err) == -1 && err.code == PS_ERR_RESOURCE_EXHAUSTED;
        clock_gettime(CLOCK_MONOTONIC, &b);
        double took = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
        if (took < as / 2) {   /* no admission went stale meanwhile: the checks hold */
            tried = 1;
            CHECK(ok == 4096);
            CHECK(full);
            /* retryable: psd's hint is when the first rank's activity ends (within active_s), and
             * sent again after it, the Forward is admitted into that slot */
            int hint = err.retry_after_ms;
            CHECK_MSG(hint >= 50 && hint <= as * 1000 + 1 && strstr(err.msg, "may go idle in"), "hint %d ms for an "
                      "activity window of %g s: %s", hint, as, err.msg);
            usleep((useconds_t)(hint + 20) * 1000);
            CHECK_MSG(ps_cons_ssp_admit(c, 7, "h", NULL, on_ready, &r, &err) == 1, "%s", err.msg);
        }
        ps_cons_free(c);
        if (tried) break;
    }
    CHECK_MSG(tried, "4096 ssp admissions never fitted in a 25 s activity window");
}

/* A rank that only sends Forwards (no Step for idle_s) stops holding the
 * others back, until it steps again. */
static void test_ssp_idle(void) {
    ps_cons_opts o = {.mode = PS_CONS_SSP, .max_staleness = 0, .active_s = 60, .idle_s = 0.2};
    ps_err err = {0};
    ps_cons *c = ps_cons_create(&o, fake_apply, NULL, &err);
    ready_rec r = {0}, r2 = {0};
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 1);
    CHECK(ps_cons_ssp_admit(c, 2, "x", NULL, on_ready, &r2, &err) == 1);
    ps_cons_stepped(c, 1, "h");
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 0);  /* held: rank 2 is at 0 */
    /* rank 2 keeps forwarding, never steps */
    for (int i = 0; i < 4; i++) {
        usleep(100 * 1000);
        CHECK(ps_cons_ssp_admit(c, 2, "x", NULL, on_ready, &r2, &err) == 1);
        ps_cons_tick(c);
    }
    CHECK_MSG(r.called == 1 && r.st == PS_OK, "rank 1 still held by a rank that never steps (%d)", r.called);
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 1);
    /* rank 2 steps: it counts again (joining at the present: the slowest
     * active clock, 2, then its step), and holds rank 1 to the bound */
    ps_cons_stepped(c, 1, "h");
    ps_cons_stepped(c, 2, "x");
    r = (ready_rec){0};
    CHECK_MSG(ps_cons_clock(c, 1) == 2 && ps_cons_clock(c, 2) == 3, "clocks %llu %llu",
              (unsigned long long)ps_cons_clock(c, 1), (unsigned long long)ps_cons_clock(c, 2));
    ps_cons_stepped(c, 1, "h");
    ps_cons_stepped(c, 1, "h");
    CHECK(ps_cons_ssp_admit(c, 1, "h", NULL, on_ready, &r, &err) == 0);  /* 4 > 3 */
    ps_cons_stepped(c, 2, "x");
    CHECK(r.called == 1);
    ps_cons_free(c);
}

/* A held Forward whose client went away (its deadline passed: ps-train
 * retries it) is taken back: it never runs - else every retry of a long
 * wait leaves one more stale Forward to run when the rank is released,
 * ahead of the live retry, whose deadline then passes too - and it no
 * longer keeps its rank active. */
static void test_ssp_cancel(void) {
    ps_cons_opts o = {.mode = PS_CONS_SSP, .max_staleness = 0, .active_s = 0.2};
    ps_err err = {0};
    ps_cons *c = ps_cons_create(&o, fake_apply, NULL, &err);
    ready_rec r1 = {0}, r2 = {0}, r3 = {0};
    int k1, k2, k3;  /* the held Forwards' keys (their calls, in psd) */
    CHECK(ps_cons_ssp_admit(c, 1, "a", NULL, on_ready, &r1, &err) == 1);
    CHECK(ps_cons_ssp_admit(c, 2, "b", NULL, on_ready, &r2, &err) == 1);
    ps_cons_stepped(c, 1, "a");
    CHECK(ps_cons_ssp_admit(c, 1, "a", &k1, on_ready, &r1, &err) == 0);  /* held: rank 2 is at 0 */
    CHECK(ps_cons_ssp_admit(c, 1, "a", &k2, on_ready, &r2, &err) == 0);  /* its retry, held too */
    CHECK(ps_cons_ssp_cancel(c, &k1) == &r1);
    CHECK(ps_cons_ssp_cancel(c, &k1) == NULL && ps_cons_ssp_cancel(c, &k3) == NULL);
    ps_cons_stats st;
    ps_cons_stats_get(c, &st);
    CHECK(st.ssp_waiting == 1 && st.ssp_deferred == 2);
    ps_cons_stepped(c, 2, "b");  /* releases the retry only */
    CHECK_MSG(r1.called == 0 && r2.called == 1 && r2.st == PS_OK, "cancelled ran %d times, retry %d",
              r1.called, r2.called);
    CHECK(ps_cons_ssp_cancel(c, &k2) == NULL);  /* released: ready had it */
    /* rank 1's trainer dies while held: the cancel frees its rank; once
     * inactive, another identity (the restarted trainer on another host)
     * may use it */
    ps_cons_stepped(c, 1, "a");
    CHECK(ps_cons_ssp_admit(c, 1, "a", &k3, on_ready, &r3, &err) == 0);
    CHECK(ps_cons_ssp_cancel(c, &k3) == &r3);
    usleep(300 * 1000);
    ps_cons_tick(c);
    CHECK_MSG(ps_cons_ssp_admit(c, 1, "a-restarted", NULL, on_ready, &r3, &err) != -1, "%s", err.msg);
    CHECK(r3.called == 0);
    ps_cons_free(c);
}

static void test_options(void) {
    ps_err err = {0};
    ps_cons_opts o = {.mode = PS_CONS_SYNC, .sync_workers = 0, .sync_timeout_s = 1};
    CHECK(ps_cons_create(&o, fake_apply, NULL, &err) == NULL && strstr(err.msg, "sync_workers"));
    o = (ps_cons_opts){.mode = PS_CONS_SSP, .max_staleness = -1, .active_s = 1};
    CHECK(ps_cons_create(&o, fake_apply, NULL, &err) == NULL && strstr(err.msg, "max_staleness"));
    CHECK(ps_cons_mode_parse("ssp") == PS_CONS_SSP && ps_cons_mode_parse("bsp") == -1);
}

int main(void) {
    test_options();
    test_sync_exactly_once();
    test_sync_straggler();
    test_sync_queue();
    test_ssp();
    test_ssp_ranks();
    test_ssp_idle();
    test_ssp_cancel();
    return check_summary("test_consistency");
}
