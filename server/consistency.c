/* consistency.c - the rules of server.consistency (consistency.h): sync
 * rounds and their stragglers, ssp clocks and the Forwards held back, with
 * the service's callbacks run outside the module's lock. */
#include "consistency.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

#define MAX_CLOCKS 4096   /* ssp: ranks tracked at once; an inactive rank's slot is reused */
#define CLOSED_RING 64    /* sync: closed rounds remembered, for the Steps that name them */

typedef struct closed_round {   /* sync: a round that has closed */
    uint64_t round;             /* 0: an empty slot */
    double closed_at;
    int by_timeout;             /* closed by server.sync_timeout_s, short of members */
    int members, expected;      /* who it had, and waited for */
    int missing;                /* stragglers whose late Step may still raise the membership */
} closed_round;

typedef struct member {
    void *grads;
    ps_cons_done_fn done;
    void *arg;
} member;

typedef struct held {       /* a Forward held back by ssp */
    uint32_t rank;
    const void *key;        /* for ps_cons_ssp_cancel; NULL = none */
    ps_cons_ready_fn ready;
    void *arg;
    struct held *next;
} held;

typedef struct rank_clock {   /* ssp: one trainer rank */
    uint32_t rank;
    uint64_t clock;
    double last_seen;
    double last_step;           /* its latest Step (or when it joined) */
    int nheld;                  /* its Forwards held now (its slot is not reused meanwhile) */
    char *owner;                /* the identity that first used the rank (malloc'ed) */
} rank_clock;

struct ps_cons {
    pthread_mutex_t mu;
    ps_cons_opts o;
    ps_cons_apply_fn apply;
    void *user;
    int closed;
    /* sync */
    uint64_t round;
    int expected;           /* members the open round waits for */
    member *members;        /* queued in the open round */
    int nmembers, cap;
    double first_arrival;   /* when the open round's first member came */
    uint64_t dropped, timeouts, queued;
    closed_round closed_rounds[CLOSED_RING];  /* by round % CLOSED_RING */
    /* ssp */
    rank_clock clocks[MAX_CLOCKS];  /* [0, nclocks) in use */
    int nclocks;
    held *held_head;
    uint64_t ssp_deferred, ssp_waiting;
};

#define MODE_NAME(value, name) [value] = name,
static const char *const mode_names[] = {PS_CONS_MODES(MODE_NAME)};
#undef MODE_NAME

const char *ps_cons_mode_name(ps_cons_mode m) {
    return (unsigned)m < sizeof mode_names / sizeof mode_names[0] ? mode_names[m] : NULL;
}

int ps_cons_mode_parse(const char *name) {
    for (size_t i = 0; i < sizeof mode_names / sizeof mode_names[0]; i++)
        if (name && !strcmp(name, mode_names[i])) return (int)i;
    return -1;
}

void ps_cons_describe(const ps_cons_opts *o, char *buf, size_t n) {
    switch (o->mode) {
    case PS_CONS_SYNC:
        snprintf(buf, n, "sync: rounds of %d contexts, gradients %s into one step; stragglers dropped after %g s",
                 o->sync_workers, o->sync_reduce == PS_SYNC_MEAN ? "averaged" : "summed", o->sync_timeout_s);
        break;
    case PS_CONS_SSP:
        snprintf(buf, n, "ssp: a trainer at most %d steps ahead of the slowest active one; steps applied as they "
                 "arrive", o->max_staleness);
        break;
    default:
        snprintf(buf, n, "hogwild: asynchronous steps; each Forward/Backward reads one consistent weight snapshot "
                 "(readers/writer lock), each Step is atomic");
    }
}

ps_cons *ps_cons_create(const ps_cons_opts *o, ps_cons_apply_fn apply, void *user, ps_err *err) {
    if (!ps_cons_mode_name(o->mode)) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "consistency mode %d is unknown", (int)o->mode);
        return NULL;
    }
    if (o->mode == PS_CONS_SYNC && (o->sync_workers < 1 || !(o->sync_timeout_s > 0))) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "consistency sync needs server.sync_workers >= 1 (got %d) "
                   "and server.sync_timeout_s > 0 (got %g)", o->sync_workers, o->sync_timeout_s);
        return NULL;
    }
    if (o->mode == PS_CONS_SSP && (o->max_staleness < 0 || !(o->active_s > 0))) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "consistency ssp needs server.max_staleness >= 0 (got %d) "
                   "and an activity window > 0 (got %g s)", o->max_staleness, o->active_s);
        return NULL;
    }
    ps_cons *c = calloc(1, sizeof *c);
    if (!c) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->o = *o;
    c->apply = apply;
    c->user = user;
    c->round = 1;
    c->expected = o->sync_workers > 0 ? o->sync_workers : 1;
    return c;
}

ps_cons_mode ps_cons_mode_of(const ps_cons *c) { return c->o.mode; }

static void ssp_tick(ps_cons *c);

/* ---- sync ------------------------------------------------------------------ */

uint64_t ps_cons_round(ps_cons *c) {
    pthread_mutex_lock(&c->mu);
    uint64_t r = c->round;
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* Takes the open round's members out (lock held) when it may close: full,
 * or (by_timeout) timed out. Remembers the round as closed and advances.
 * Returns the count taken. */
static int take_round_locked(ps_cons *c, member **out, uint64_t *round, int by_timeout) {
    *out = c->members;
    *round = c->round;
    int n = c->nmembers;
    closed_round *k = &c->closed_rounds[c->round % CLOSED_RING];
    *k = (closed_round){.round = c->round, .closed_at = ps_mono_s(), .by_timeout = by_timeout, .members = n,
                        .expected = c->expected, .missing = by_timeout ? c->expected - n : 0};
    c->members = NULL;
    c->nmembers = c->cap = 0;
    c->round++;
    return n;
}

/* Apply a taken round outside the lock and answer its members. */
static void run_round(ps_cons *c, member *m, int n, uint64_t round) {
    void **grads = calloc((size_t)n * 2, sizeof *grads);
    ps_err err = {0};
    uint64_t version = 0;
    ps_status st;
    if (!grads) {
        st = ps_err_set(&err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory applying round %llu",
                        (unsigned long long)round);
    } else {
        for (int i = 0; i < n; i++) grads[i] = m[i].grads, grads[n + i] = m[i].arg;
        st = c->apply(c->user, grads, grads + n, n, c->o.sync_reduce == PS_SYNC_MEAN, &version, &err);
        if (st) ps_err_prefix(&err, "round %llu not applied", (unsigned long long)round);
    }
    free(grads);
    for (int i = 0; i < n; i++) m[i].done(m[i].arg, st, &err, version, round, (uint32_t)n);
    free(m);
}

/* A Step naming round r, which has closed (lock held): 0 when it may join
 * the open round instead - r closed complete (more trainers than
 * sync_workers) no longer than sync_timeout_s before this step came; else
 * 1 and err says why it is dropped. A straggler of a round that closed by
 * its timeout raises the membership back by one, at most as many times as
 * that round was short: the membership follows the trainers that exist, and
 * a Step naming an old round cannot raise it again and again. */
static int late_locked(ps_cons *c, uint64_t r, ps_err *err) {
    const closed_round *k = &c->closed_rounds[r % CLOSED_RING];
    double now = ps_mono_s();
    if (k->round == r && !k->by_timeout && now - k->closed_at <= c->o.sync_timeout_s) return 0;
    c->dropped++;
    unsigned long long open = c->round;
    if (k->round != r) {
        ps_err_set(err, PS_ERR_ABORTED, "round %llu closed long ago (the open round is %llu); this context's "
                   "gradients were computed for it and are dropped: run the batch again under a new context",
                   (unsigned long long)r, open);
    } else if (k->by_timeout) {
        closed_round *w = &c->closed_rounds[r % CLOSED_RING];
        if (w->missing > 0 && c->expected < c->o.sync_workers) {
            w->missing--;
            c->expected++;
        }
        ps_err_set(err, PS_ERR_ABORTED, "round %llu closed without this step: it waited server.sync_timeout_s = "
                   "%g s after its first step and closed with %d of %d members, %.1f s before this step came; "
                   "this context's gradients were computed for that round and are dropped: run the batch again "
                   "under a new context (it joins round %llu)", (unsigned long long)r, c->o.sync_timeout_s,
                   k->members, k->expected, now - k->closed_at, open);
    } else {
        ps_err_set(err, PS_ERR_ABORTED, "round %llu closed complete %.1f s before this step came, more than "
                   "server.sync_timeout_s = %g s: too stale to join round %llu; this context's gradients are "
                   "dropped: run the batch again under a new context", (unsigned long long)r,
                   now - k->closed_at, c->o.sync_timeout_s, open);
    }
    return 1;
}

ps_status ps_cons_sync_submit(ps_cons *c, uint64_t round, void *grads, ps_cons_done_fn done, void *arg,
                              ps_err *err) {
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        return ps_err_set(err, PS_ERR_UNAVAILABLE, "psd is shutting down: the sync round was not applied");
    }
    if (round == 0) round = c->round;
    if (round < c->round && late_locked(c, round, err)) {
        pthread_mutex_unlock(&c->mu);
        return PS_ERR_ABORTED;
    }
    if (round < c->round) {  /* its round filled up without it: it joins the open one */
        c->queued++;
        round = c->round;
        /* more trainers than the membership: a shrunk one grows back */
        if (c->expected < c->o.sync_workers) c->expected++;
    }
    if (round > c->round) {
        uint64_t open = c->round;
        pthread_mutex_unlock(&c->mu);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "StepRequest.round %llu is not open yet (the open "
                          "round is %llu)", (unsigned long long)round, (unsigned long long)open);
    }
    if (c->nmembers == c->cap) {
        int ncap = c->cap ? c->cap * 2 : 8;
        member *p = realloc(c->members, (size_t)ncap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&c->mu);
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory joining round %llu",
                              (unsigned long long)round);
        }
        c->members = p;
        c->cap = ncap;
    }
    c->members[c->nmembers++] = (member){grads, done, arg};
    if (c->nmembers == 1) c->first_arrival = ps_mono_s();
    member *m = NULL;
    int n = 0;
    uint64_t r = 0;
    if (c->nmembers >= c->expected) n = take_round_locked(c, &m, &r, 0);
    pthread_mutex_unlock(&c->mu);
    if (n) run_round(c, m, n, r);
    return PS_OK;
}

int ps_cons_tick(ps_cons *c) {
    if (c->o.mode != PS_CONS_SYNC) {
        if (c->o.mode == PS_CONS_SSP) ssp_tick(c);  /* re-check activity */
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    member *m = NULL;
    int n = 0;
    uint64_t r = 0;
    if (!c->closed && c->nmembers > 0 && ps_mono_s() - c->first_arrival >= c->o.sync_timeout_s) {
        c->timeouts++;
        n = take_round_locked(c, &m, &r, 1);
        c->expected = n;   /* the missing ones are stragglers */
    }
    pthread_mutex_unlock(&c->mu);
    if (n) run_round(c, m, n, r);
    return n > 0;
}

void ps_cons_stats_get(ps_cons *c, ps_cons_stats *out) {
    pthread_mutex_lock(&c->mu);
    out->round = c->round;
    out->members = (uint32_t)c->expected;
    out->waiting = (uint32_t)c->nmembers;
    out->dropped = c->dropped;
    out->timeouts = c->timeouts;
    out->queued = c->queued;
    out->ssp_deferred = c->ssp_deferred;
    out->ssp_waiting = c->ssp_waiting;
    pthread_mutex_unlock(&c->mu);
}

/* ---- ssp ------------------------------------------------------------------- */

/* A rank holds the others back while it is active: seen within active_s
 * and stepped within idle_s (a rank that only sends Forwards - or invalid
 * ones - does not pin everyone), or waiting (held), which is not idle. */
static int active(const ps_cons *c, const rank_clock *k, double now) {
    if (k->nheld > 0) return 1;
    return now - k->last_seen <= c->o.active_s && (!(c->o.idle_s > 0) || now - k->last_step <= c->o.idle_s);
}

static rank_clock *find_locked(ps_cons *c, uint32_t rank) {
    for (int i = 0; i < c->nclocks; i++)
        if (c->clocks[i].rank == rank) return &c->clocks[i];
    return NULL;
}

/* Slowest clock among the active ranks but `skip` (UINT64_MAX when none). */
static uint64_t slowest_locked(ps_cons *c, double now, const rank_clock *skip) {
    uint64_t lo = UINT64_MAX;
    for (int i = 0; i < c->nclocks; i++) {
        const rank_clock *k = &c->clocks[i];
        if (k != skip && active(c, k, now) && k->clock < lo) lo = k->clock;
    }
    return lo;
}

static int may_run_locked(ps_cons *c, const rank_clock *k, double now) {
    uint64_t lo = slowest_locked(c, now, NULL);
    return !k || lo == UINT64_MAX || k->clock <= lo + (uint64_t)c->o.max_staleness;
}

/* Every slot active: how long until the first one can be reused - the
 * earliest end of a rank's activity (active_s after it was last seen, or
 * idle_s after its last Step), among those holding no Forward (a held one
 * stays active while it waits; none: active_s). In ms for psd's retry hint,
 * within [PS_CONS_RANK_RETRY_MIN_MS, 60 s]: the refused Forward did nothing,
 * so a trainer sends it again then. A rank seen again meanwhile stays
 * active: the next refusal says how long again. */
#define PS_CONS_RANK_RETRY_MIN_MS 50
static int slot_free_ms_locked(const ps_cons *c, double now) {
    double wait = -1;
    for (int i = 0; i < c->nclocks; i++) {
        const rank_clock *k = &c->clocks[i];
        if (k->nheld > 0) continue;
        double end = k->last_seen + c->o.active_s;
        if (c->o.idle_s > 0 && k->last_step + c->o.idle_s < end) end = k->last_step + c->o.idle_s;
        if (wait < 0 || end - now < wait) wait = end - now;
    }
    double ms = (wait < 0 ? c->o.active_s : wait) * 1000.0 + 1;
    return ms < PS_CONS_RANK_RETRY_MIN_MS ? PS_CONS_RANK_RETRY_MIN_MS : ms > 60000 ? 60000 : (int)ms;
}

/* The clock of rank for owner: found, or a new one (in a free slot, or the
 * slot of the rank idle longest); NULL with err when the rank belongs to
 * another identity, is outside server.ssp_world_size, or every slot is
 * active. A rank seen for the first time, or back after being inactive,
 * joins at the present: its clock is raised to the slowest active clock,
 * so a new or returning trainer is held to the bound from now on instead of
 * stalling everyone until it has replayed the steps it missed. */
static rank_clock *touch_locked(ps_cons *c, uint32_t rank, const char *owner, double now, ps_err *err) {
    if (!owner) owner = "";
    if (c->o.ssp_world_size && rank >= (uint32_t)c->o.ssp_world_size) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "trainer_rank %u: server.ssp_world_size is %d (ranks 0..%d)",
                   rank, c->o.ssp_world_size, c->o.ssp_world_size - 1);
        return NULL;
    }
    rank_clock *k = find_locked(c, rank);
    if (k && strcmp(k->owner, owner) && active(c, k, now)) {
        ps_err_set(err, PS_ERR_PERMISSION_DENIED, "trainer_rank %u belongs to another client (token or host) while "
                   "it is active: each trainer needs its own rank (trainer.rank)", rank);
        return NULL;
    }
    if (!k) {
        if (c->nclocks < MAX_CLOCKS) {
            k = &c->clocks[c->nclocks++];
        } else {  /* reuse the slot of the rank idle longest */
            for (int i = 0; i < c->nclocks; i++)
                if (!active(c, &c->clocks[i], now) && (!k || c->clocks[i].last_seen < k->last_seen)) k = &c->clocks[i];
            if (!k) {
                int ms = slot_free_ms_locked(c, now);
                ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%d trainer ranks are active (the most psd tracks); the "
                           "first may go idle in %.1f s (server.context_ttl_s after its last Forward, "
                           "server.ssp_idle_s after its last Step); set server.ssp_world_size to the trainers' "
                           "world size", MAX_CLOCKS, ms / 1000.0);
                ps_err_retry_after(err, ms);  /* refused before anything ran: it may come again */
                return NULL;
            }
        }
        free(k->owner);
        *k = (rank_clock){.rank = rank, .last_seen = now - 2 * c->o.active_s - 1, .last_step = now};
    }
    if (!k->owner || strcmp(k->owner, owner)) {  /* new, or an inactive rank taken over */
        char *o = strdup(owner);
        if (!o) {
            ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
            return NULL;
        }
        free(k->owner);
        k->owner = o;
    }
    if (!active(c, k, now)) {  /* new, or back: joins at the present (an idle one counts again once it steps) */
        uint64_t lo = slowest_locked(c, now, k);
        if (lo != UINT64_MAX && lo > k->clock) k->clock = lo;
    }
    k->last_seen = now;
    return k;
}

int ps_cons_ssp_admit(ps_cons *c, uint32_t rank, const char *owner, const void *key, ps_cons_ready_fn ready,
                      void *arg, ps_err *err) {
    if (c->o.mode != PS_CONS_SSP) return 1;
    double now = ps_mono_s();
    pthread_mutex_lock(&c->mu);
    rank_clock *k = touch_locked(c, rank, owner, now, err);
    if (!k) {
        pthread_mutex_unlock(&c->mu);
        return -1;
    }
    int ok = c->closed || may_run_locked(c, k, now);
    if (!ok) {
        held *h = malloc(sizeof *h);
        if (!h) {
            ok = 1;  /* cannot hold it: run it (the bound is a goal, not worth failing a call) */
        } else {
            *h = (held){rank, key, ready, arg, c->held_head};
            c->held_head = h;
            k->nheld++;
            c->ssp_deferred++;
            c->ssp_waiting++;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

/* Release the held Forwards that may run now (lock held); they go to *go. */
static void release_locked(ps_cons *c, double now, held **go) {
    held **pp = &c->held_head;
    while (*pp) {
        held *h = *pp;
        rank_clock *k = find_locked(c, h->rank);
        if (may_run_locked(c, k, now)) {
            *pp = h->next;
            h->next = *go;
            *go = h;
            c->ssp_waiting--;
            if (k) {
                k->nheld--;
                k->last_seen = now;  /* it waited, it was not idle */
            }
        } else {
            pp = &h->next;
        }
    }
}

void *ps_cons_ssp_cancel(ps_cons *c, const void *key) {
    if (!key) return NULL;
    void *arg = NULL;
    pthread_mutex_lock(&c->mu);
    for (held **pp = &c->held_head; *pp; pp = &(*pp)->next) {
        held *h = *pp;
        if (h->key != key) continue;
        *pp = h->next;
        c->ssp_waiting--;
        rank_clock *k = find_locked(c, h->rank);
        if (k) k->nheld--;  /* a cancelled wait no longer keeps its rank active */
        arg = h->arg;
        free(h);
        break;
    }
    pthread_mutex_unlock(&c->mu);
    return arg;
}

static void run_released(held *go) {
    while (go) {
        held *n = go->next;
        go->ready(go->arg, PS_OK, NULL);
        free(go);
        go = n;
    }
}

void ps_cons_stepped(ps_cons *c, uint32_t rank, const char *owner) {
    if (c->o.mode != PS_CONS_SSP) return;
    double now = ps_mono_s();
    held *go = NULL;
    ps_err ignored;
    pthread_mutex_lock(&c->mu);
    /* the step was applied; its clock advances only for the rank's own identity */
    rank_clock *k = touch_locked(c, rank, owner, now, &ignored);
    if (k) k->clock++, k->last_step = now;
    release_locked(c, now, &go);
    pthread_mutex_unlock(&c->mu);
    run_released(go);
}

/* ssp: ranks that went inactive no longer hold the others back. */
static void ssp_tick(ps_cons *c) {
    double now = ps_mono_s();
    held *go = NULL;
    pthread_mutex_lock(&c->mu);
    release_locked(c, now, &go);
    pthread_mutex_unlock(&c->mu);
    run_released(go);
}

uint64_t ps_cons_clock(ps_cons *c, uint32_t rank) {
    pthread_mutex_lock(&c->mu);
    const rank_clock *k = find_locked(c, rank);
    uint64_t v = k ? k->clock : 0;
    pthread_mutex_unlock(&c->mu);
    return v;
}

/* ---- shutdown -------------------------------------------------------------- */

void ps_cons_close(ps_cons *c) {
    pthread_mutex_lock(&c->mu);
    c->closed = 1;
    member *m = c->members;
    int n = c->nmembers;
    c->members = NULL;
    c->nmembers = c->cap = 0;
    held *h = c->held_head;
    c->held_head = NULL;
    c->ssp_waiting = 0;
    pthread_mutex_unlock(&c->mu);
    ps_err err = {0};
    ps_err_set(&err, PS_ERR_UNAVAILABLE, "psd is shutting down: the sync round was not applied");
    for (int i = 0; i < n; i++) m[i].done(m[i].arg, PS_ERR_UNAVAILABLE, &err, 0, 0, 0);
    free(m);
    ps_err_set(&err, PS_ERR_UNAVAILABLE, "psd is shutting down: the held-back Forward was not run");
    while (h) {
        held *next = h->next;
        h->ready(h->arg, PS_ERR_UNAVAILABLE, &err);
        free(h);
        h = next;
    }
}

void ps_cons_free(ps_cons *c) {
    if (!c) return;
    ps_cons_close(c);
    for (int i = 0; i < c->nclocks; i++) free(c->clocks[i].owner);
    pthread_mutex_destroy(&c->mu);
    free(c);
}
