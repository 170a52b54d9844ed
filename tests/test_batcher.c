/* test_batcher - the dynamic batcher's grouping (server/batcher.h): items of
 * one key held together run as one group in arrival order, groups never
 * pass max_samples, keys never mix, a lone item waits for company at least
 * max_wait and then runs alone, an oversized item runs alone, freeing runs
 * what is held, and items submitted from many threads each run once. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "batcher.h"
#include "check.h"
#include "prof.h"

#define MAXLOG 4096

typedef struct rec {
    pthread_mutex_t mu;
    int ngroups;
    int group_of[MAXLOG];      /* per item arg (an index): its group number */
    int pos_in[MAXLOG];        /* its position in the group */
    int gsize[MAXLOG];         /* per group */
    int gsamples[MAXLOG];
    uint64_t gkey[MAXLOG];
    int runs[MAXLOG];          /* per item: times run */
    int64_t t_run[MAXLOG];
} rec;

static void run_fn(void *user, ps_batch_item **items, int n) {
    rec *r = user;
    pthread_mutex_lock(&r->mu);
    int g = r->ngroups++;
    r->gsize[g] = n;
    r->gkey[g] = items[0]->key;
    int s = 0;
    for (int i = 0; i < n; i++) {
        int a = (int)(intptr_t)items[i]->arg;
        r->group_of[a] = g;
        r->pos_in[a] = i;
        r->runs[a]++;
        r->t_run[a] = ps_prof_now();
        s += items[i]->samples;
        if (items[i]->key != items[0]->key) r->gkey[g] = ~0ULL;   /* mixed: flagged */
    }
    r->gsamples[g] = s;
    pthread_mutex_unlock(&r->mu);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int ran(rec *r, int a) {
    pthread_mutex_lock(&r->mu);
    int v = r->runs[a];
    pthread_mutex_unlock(&r->mu);
    return v;
}

static void wait_ran(rec *r, int a) {
    for (int i = 0; i < 20000 && !ran(r, a); i++) sleep_ms(1);
}

static rec *rec_new(void) {
    static rec R;
    memset(&R, 0, sizeof R);
    pthread_mutex_init(&R.mu, NULL);
    return &R;
}

typedef struct sub_arg {
    ps_batcher *b;
    ps_batch_item *items;
    int base, n;
} sub_arg;

static void *submitter(void *p) {
    sub_arg *s = p;
    for (int i = 0; i < s->n; i++) {
        ps_batch_item *it = &s->items[s->base + i];
        it->key = (uint64_t)(s->base + i) % 3;
        it->samples = 1 + (s->base + i) % 7;
        it->arg = (void *)(intptr_t)(s->base + i);
        ps_batcher_submit(s->b, it);
    }
    return NULL;
}

/* Tests 5 and 6: eight threads submit 400 items each, of three keys, to a batcher with that many executors
 * (wait 2 ms, 32 samples at most): each item runs exactly once, a group holds one key and at most 32
 * samples (or one item). */
static void many_submitters(int executors) {
    ps_err err = {0};
    rec *r = rec_new();
    ps_batcher *b = ps_batcher_create(2000, 32, executors, run_fn, r, &err);
    CHECK(b != NULL);
    if (!b) return;
    static ps_batch_item many[3200];
    memset(many, 0, sizeof many);
    pthread_t th[8];
    sub_arg sa[8];
    for (int t = 0; t < 8; t++) {
        sa[t] = (sub_arg){b, many, t * 400, 400};
        CHECK(pthread_create(&th[t], NULL, submitter, &sa[t]) == 0);
    }
    for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
    ps_batcher_free(b);
    int once = 1, mixed = 0, over = 0;
    for (int i = 0; i < 3200; i++) once &= r->runs[i] == 1;
    for (int g = 0; g < r->ngroups; g++) {
        mixed += r->gkey[g] == ~0ULL;
        over += r->gsamples[g] > 32 && r->gsize[g] > 1;
    }
    CHECK_MSG(once, "%d executor(s): an item ran other than once", executors);
    CHECK_MSG(mixed == 0, "%d executor(s): %d groups mixed keys", executors, mixed);
    CHECK_MSG(over == 0, "%d executor(s): %d groups over 32 samples", executors, over);
}

/* Run fn for test 7: counts the groups inside a run at once and waits (up to wait_ms) for a second. */
typedef struct overlap { pthread_mutex_t mu; pthread_cond_t cv; int inside, most, wait_ms; } overlap;

static void overlap_fn(void *user, ps_batch_item **items, int n) {
    (void)items; (void)n;
    overlap *o = user;
    pthread_mutex_lock(&o->mu);
    if (++o->inside > o->most) o->most = o->inside;
    pthread_cond_broadcast(&o->cv);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)o->wait_ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    while (o->inside < 2 && pthread_cond_timedwait(&o->cv, &o->mu, &ts) == 0) {}
    o->inside--;
    pthread_mutex_unlock(&o->mu);
}

static int most_at_once(int executors, int wait_ms) {
    overlap o = {.wait_ms = wait_ms};
    pthread_mutex_init(&o.mu, NULL);
    pthread_cond_init(&o.cv, NULL);
    ps_err err = {0};
    ps_batcher *b = ps_batcher_create(0, 1, executors, overlap_fn, &o, &err);
    CHECK(b != NULL);
    if (!b) return -1;
    ps_batch_item it[2] = {{.key = 10, .samples = 1}, {.key = 11, .samples = 1}};
    ps_batcher_submit(b, &it[0]);
    ps_batcher_submit(b, &it[1]);
    ps_batcher_free(b);   /* runs both */
    pthread_cond_destroy(&o.cv);
    pthread_mutex_destroy(&o.mu);
    return o.most;
}

int main(void) {
    ps_err err = {0};
    CHECK(ps_batcher_create(-1, 4, 1, run_fn, NULL, &err) == NULL && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK(ps_batcher_create(10, 0, 1, run_fn, NULL, &err) == NULL);
    CHECK(ps_batcher_create(10, 4, 0, run_fn, NULL, &err) == NULL && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK(ps_batcher_create(10, 4, 65, run_fn, NULL, &err) == NULL && strstr(err.msg, "executors"));
    ps_batcher_free(NULL);

    /* 1. a long wait: three items of key 7 submitted together run as one
     * group, in order; an item of another key runs apart */
    rec *r = rec_new();
    ps_batcher *b = ps_batcher_create(200000, 100, 1, run_fn, r, &err);   /* 200 ms */
    CHECK(b != NULL);
    ps_batch_item it[16];
    memset(it, 0, sizeof it);
    for (int i = 0; i < 3; i++) it[i] = (ps_batch_item){.key = 7, .samples = 10, .arg = (void *)(intptr_t)i};
    it[3] = (ps_batch_item){.key = 8, .samples = 10, .arg = (void *)(intptr_t)3};
    int64_t t0 = ps_prof_now();
    for (int i = 0; i < 4; i++) ps_batcher_submit(b, &it[i]);
    wait_ran(r, 3);
    wait_ran(r, 2);
    CHECK(r->runs[0] == 1 && r->runs[1] == 1 && r->runs[2] == 1 && r->runs[3] == 1);
    CHECK(r->group_of[0] == r->group_of[1] && r->group_of[1] == r->group_of[2]);
    CHECK(r->pos_in[0] == 0 && r->pos_in[1] == 1 && r->pos_in[2] == 2);
    CHECK(r->group_of[3] != r->group_of[0]);
    CHECK(r->gsize[r->group_of[0]] == 3 && r->gsamples[r->group_of[0]] == 30);
    /* neither group was full: each waited for company for the whole wait */
    CHECK_MSG(r->t_run[0] - t0 >= 200000000 - 1000000, "ran after %lld ns", (long long)(r->t_run[0] - t0));
    CHECK(r->t_run[3] - t0 >= 200000000 - 1000000);
    ps_batcher_stats st;
    ps_batcher_stats_get(b, &st);
    CHECK(st.groups == 2 && st.items == 4 && st.combined == 3);
    ps_batcher_free(b);

    /* 2. max_samples 25: five items of 10 samples run as 2, 2, 1, never
     * above 25; a full group does not wait (wait: 10 s) */
    r = rec_new();
    b = ps_batcher_create(10000000, 25, 1, run_fn, r, &err);
    for (int i = 0; i < 5; i++) it[i] = (ps_batch_item){.key = 1, .samples = 10, .arg = (void *)(intptr_t)i};
    /* an item larger than the maximum runs alone, at once */
    it[5] = (ps_batch_item){.key = 2, .samples = 40, .arg = (void *)(intptr_t)5};
    for (int i = 0; i < 6; i++) ps_batcher_submit(b, &it[i]);
    wait_ran(r, 5);
    wait_ran(r, 3);
    CHECK(r->runs[5] == 1 && r->gsize[r->group_of[5]] == 1);
    CHECK(r->runs[0] == 1 && r->runs[1] == 1 && r->runs[2] == 1 && r->runs[3] == 1);
    CHECK(r->group_of[0] == r->group_of[1] && r->group_of[2] == r->group_of[3] && r->group_of[1] != r->group_of[2]);
    CHECK(r->runs[4] == 0);   /* alone and not full: still waiting for company */
    /* 3. freeing runs what is held, without waiting out the 10 s */
    ps_batcher_free(b);
    CHECK(r->runs[4] == 1 && r->gsize[r->group_of[4]] == 1);
    for (int g = 0; g < r->ngroups; g++) CHECK(r->gsamples[g] <= 25 || r->gsize[g] == 1);

    /* 4. no wait (0): an item runs at once, alone unless others are held */
    r = rec_new();
    b = ps_batcher_create(0, 64, 1, run_fn, r, &err);
    it[0] = (ps_batch_item){.key = 3, .samples = 1, .arg = (void *)(intptr_t)0};
    ps_batcher_submit(b, &it[0]);
    wait_ran(r, 0);
    CHECK(r->runs[0] == 1);
    ps_batcher_free(b);

    /* 5. eight threads submit 400 items of three keys: each runs exactly once, groups hold one key and
     * at most 32 samples; 6. the same with 4 executors (server.batch_executors) */
    many_submitters(1);
    many_submitters(4);

    /* 7. two groups held at once run at once with 2 executors (each run waits up to 5 s for the other),
     * one after the other with 1 (each waits 200 ms for a second that never comes) */
    CHECK_MSG(most_at_once(2, 5000) == 2, "2 executors: the two groups did not run at once");
    CHECK_MSG(most_at_once(1, 200) == 1, "1 executor: two groups ran at once");
    return check_summary("test_batcher");
}
