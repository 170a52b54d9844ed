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

#define MAX_CLOCKS 4096   /* ssp: ranks tracked (ranks beyond share the last slot) */

typedef struct member {
    void *grads;
    ps_cons_done_fn done;
    void *arg;
} member;

typedef struct held {       /* a Forward held back by ssp */
    uint32_t rank;
    ps_cons_ready_fn ready;
    void *arg;
    struct held *next;
} held;

typedef struct rank_clock {
    uint64_t clock;
    double last_seen;
    int used;
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
    uint64_t dropped, timeouts;
    /* ssp */
    rank_clock clocks[MAX_CLOCKS];
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

/* ---- sync ------------------------------------------------------------------ */

uint64_t ps_cons_round(ps_cons *c) {
    pthread_mutex_lock(&c->mu);
    uint64_t r = c->round;
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* Takes the open round's members out (lock held) when it may close: full,
 * or (force) timed out. Advances the round. Returns the count taken. */
static int take_round_locked(ps_cons *c, member **out, uint64_t *round) {
    *out = c->members;
    *round = c->round;
    int n = c->nmembers;
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

ps_status ps_cons_sync_submit(ps_cons *c, uint64_t round, void *grads, ps_cons_done_fn done, void *arg,
                              ps_err *err) {
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        return ps_err_set(err, PS_ERR_UNAVAILABLE, "psd is shutting down: the sync round was not applied");
    }
    if (round == 0) round = c->round;
    if (round < c->round) {
        /* A straggler: its round closed without it. It never counts toward
         * a later round; its return grows the membership back. */
        c->dropped++;
        if (c->expected < c->o.sync_workers) c->expected++;
        uint64_t open = c->round;
        pthread_mutex_unlock(&c->mu);
        return ps_err_set(err, PS_ERR_ABORTED, "round %llu closed without this step (it came later than "
                          "server.sync_timeout_s = %g s after the round's first step); its gradients are "
                          "dropped - continue with round %llu", (unsigned long long)round,
                          c->o.sync_timeout_s, (unsigned long long)open);
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
    if (c->nmembers >= c->expected) n = take_round_locked(c, &m, &r);
    pthread_mutex_unlock(&c->mu);
    if (n) run_round(c, m, n, r);
    return PS_OK;
}

int ps_cons_tick(ps_cons *c) {
    if (c->o.mode != PS_CONS_SYNC) {
        if (c->o.mode == PS_CONS_SSP) ps_cons_stepped(c, UINT32_MAX);  /* re-check activity */
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    member *m = NULL;
    int n = 0;
    uint64_t r = 0;
    if (!c->closed && c->nmembers > 0 && ps_mono_s() - c->first_arrival >= c->o.sync_timeout_s) {
        c->timeouts++;
        c->expected = c->nmembers;   /* the missing ones are stragglers */
        n = take_round_locked(c, &m, &r);
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
    out->ssp_deferred = c->ssp_deferred;
    out->ssp_waiting = c->ssp_waiting;
    pthread_mutex_unlock(&c->mu);
}

/* ---- ssp ------------------------------------------------------------------- */

static rank_clock *clock_of_locked(ps_cons *c, uint32_t rank) {
    return &c->clocks[rank < MAX_CLOCKS ? rank : MAX_CLOCKS - 1];
}

/* Slowest clock among the active ranks (UINT64_MAX when none is active). */
static uint64_t slowest_locked(ps_cons *c, double now) {
    uint64_t lo = UINT64_MAX;
    for (int i = 0; i < MAX_CLOCKS; i++) {
        const rank_clock *k = &c->clocks[i];
        if (k->used && now - k->last_seen <= c->o.active_s && k->clock < lo) lo = k->clock;
    }
    return lo;
}

static int may_run_locked(ps_cons *c, uint32_t rank, double now) {
    uint64_t lo = slowest_locked(c, now);
    return lo == UINT64_MAX || clock_of_locked(c, rank)->clock <= lo + (uint64_t)c->o.max_staleness;
}

/* A rank seen for the first time, or back after being inactive, joins at
 * the present: its clock is raised to the slowest active clock, so a new or
 * returning trainer is held to the bound from now on instead of stalling
 * everyone until it has replayed the steps it missed. */
static rank_clock *touch_locked(ps_cons *c, uint32_t rank, double now) {
    rank_clock *k = clock_of_locked(c, rank);
    if (!k->used || now - k->last_seen > c->o.active_s) {
        k->used = 0;  /* not counted while finding the others' slowest */
        uint64_t lo = slowest_locked(c, now);
        if (lo != UINT64_MAX && lo > k->clock) k->clock = lo;
        k->used = 1;
    }
    k->last_seen = now;
    return k;
}

int ps_cons_ssp_admit(ps_cons *c, uint32_t rank, ps_cons_ready_fn ready, void *arg) {
    if (c->o.mode != PS_CONS_SSP) return 1;
    double now = ps_mono_s();
    pthread_mutex_lock(&c->mu);
    touch_locked(c, rank, now);
    int ok = c->closed || may_run_locked(c, rank, now);
    if (!ok) {
        held *h = malloc(sizeof *h);
        if (!h) {
            ok = 1;  /* cannot hold it: run it (the bound is a goal, not worth failing a call) */
        } else {
            *h = (held){rank, ready, arg, c->held_head};
            c->held_head = h;
            c->ssp_deferred++;
            c->ssp_waiting++;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return ok;
}

void ps_cons_stepped(ps_cons *c, uint32_t rank) {
    if (c->o.mode != PS_CONS_SSP) return;
    double now = ps_mono_s();
    held *go = NULL;
    pthread_mutex_lock(&c->mu);
    if (rank != UINT32_MAX) touch_locked(c, rank, now)->clock++;
    held **pp = &c->held_head;
    while (*pp) {
        held *h = *pp;
        if (may_run_locked(c, h->rank, now)) {
            *pp = h->next;
            h->next = go;
            go = h;
            c->ssp_waiting--;
            /* a held rank is waiting, not idle */
            clock_of_locked(c, h->rank)->last_seen = now;
        } else {
            pp = &h->next;
        }
    }
    pthread_mutex_unlock(&c->mu);
    while (go) {
        held *n = go->next;
        go->ready(go->arg, PS_OK, NULL);
        free(go);
        go = n;
    }
}

uint64_t ps_cons_clock(ps_cons *c, uint32_t rank) {
    pthread_mutex_lock(&c->mu);
    uint64_t v = clock_of_locked(c, rank)->clock;
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
    pthread_mutex_destroy(&c->mu);
    free(c);
}
