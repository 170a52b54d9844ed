/* batcher.c - the held items and the executor threads that group and run
 * them (see batcher.h). */
#include "batcher.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "prof.h"

#define PS_BATCH_MAX_GROUP 1024   /* items in one group at most */
#define PS_BATCH_MAX_EXECUTORS 64

struct ps_batcher {
    int64_t max_wait_ns;
    int max_samples;
    ps_batch_run_fn run;
    void *user;
    pthread_t thread[PS_BATCH_MAX_EXECUTORS];
    int started;                  /* executor threads running */
    pthread_mutex_t mu;
    pthread_cond_t cv;            /* CLOCK_MONOTONIC */
    ps_batch_item *head, *tail;   /* held, oldest first */
    int stop;
    ps_batcher_stats stats;       /* under mu */
};

/* With mu held: take the group of key (arrival order, up to max_samples)
 * out of the list into g; returns its size. */
static int take_group_locked(ps_batcher *b, uint64_t key, ps_batch_item **g) {
    int n = 0, samples = 0;
    ps_batch_item **pp = &b->head, *prev = NULL;
    while (*pp && n < PS_BATCH_MAX_GROUP) {
        ps_batch_item *it = *pp;
        if (it->key != key) {
            prev = it;
            pp = &it->next;
            continue;
        }
        if (n > 0 && samples + it->samples > b->max_samples) break;
        g[n++] = it;
        samples += it->samples;
        *pp = it->next;   /* unlink */
        if (b->tail == it) b->tail = prev;
        if (samples >= b->max_samples) break;
    }
    return n;
}

/* With mu held: is the group of key, starting at its oldest item first,
 * full now (so it need not wait)? */
static int group_full_locked(const ps_batcher *b, const ps_batch_item *first) {
    int samples = 0, n = 0;
    for (const ps_batch_item *it = first; it; it = it->next) {
        if (it->key != first->key) continue;
        if (n > 0 && samples + it->samples > b->max_samples) return 1;
        samples += it->samples;
        if (samples >= b->max_samples || ++n >= PS_BATCH_MAX_GROUP) return 1;
    }
    return 0;
}

/* With mu held: a key whose group may run now - the first full group in
 * arrival order of their oldest items, else the oldest item's once it has
 * waited max_wait (or when stopping). 0 when none is ready; *due then
 * says until when to wait. */
static int ready_locked(const ps_batcher *b, uint64_t *key, int64_t *due) {
    for (const ps_batch_item *it = b->head; it; it = it->next) {
        int first = 1;   /* the oldest of its key? */
        for (const ps_batch_item *o = b->head; o != it; o = o->next)
            if (o->key == it->key) { first = 0; break; }
        if (first && group_full_locked(b, it)) {
            *key = it->key;
            return 1;
        }
    }
    *due = b->head->t_in + b->max_wait_ns;
    if (b->stop || ps_prof_now() >= *due) {
        *key = b->head->key;
        return 1;
    }
    return 0;
}

static void deadline(struct timespec *ts, int64_t t_ns) {
    ts->tv_sec = (time_t)(t_ns / 1000000000);
    ts->tv_nsec = (long)(t_ns % 1000000000);
}

static void *executor_main(void *arg) {
    ps_batcher *b = arg;
    ps_batch_item **g = malloc(PS_BATCH_MAX_GROUP * sizeof *g);
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->head && !b->stop) pthread_cond_wait(&b->cv, &b->mu);
        if (!b->head) break;   /* stopping, nothing held */
        /* a full group runs at once; the oldest item's group waits for
         * company until its deadline */
        uint64_t key;
        int64_t due;
        if (!ready_locked(b, &key, &due)) {
            struct timespec ts;
            deadline(&ts, due);
            pthread_cond_timedwait(&b->cv, &b->mu, &ts);
            continue;   /* look again: new items, or the deadline */
        }
        int n = g ? take_group_locked(b, key, g) : 0;
        if (!g) {   /* out of memory at start: run items one by one */
            ps_batch_item *it = b->head;
            b->head = it->next;
            if (!b->head) b->tail = NULL;
            pthread_mutex_unlock(&b->mu);
            b->run(b->user, &it, 1);
            pthread_mutex_lock(&b->mu);
            b->stats.groups++;
            b->stats.items++;
            continue;
        }
        b->stats.groups++;
        b->stats.items += (uint64_t)n;
        if (n > 1) b->stats.combined += (uint64_t)n;
        pthread_mutex_unlock(&b->mu);
        b->run(b->user, g, n);
        pthread_mutex_lock(&b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    free(g);
    return NULL;
}

static void stop_and_join(ps_batcher *b) {
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->started; i++) pthread_join(b->thread[i], NULL);
}

ps_batcher *ps_batcher_create(int64_t max_wait_us, int max_samples, int executors, ps_batch_run_fn run,
                              void *user, ps_err *err) {
    if (max_wait_us < 0 || max_samples < 1 || executors < 1 || executors > PS_BATCH_MAX_EXECUTORS || !run) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "batcher: wait %lld us, %d samples and %d executors (need >= 0, "
                   ">= 1 and 1-%d)", (long long)max_wait_us, max_samples, executors, PS_BATCH_MAX_EXECUTORS);
        return NULL;
    }
    ps_batcher *b = calloc(1, sizeof *b);
    if (!b) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "batcher: out of memory");
        return NULL;
    }
    b->max_wait_ns = max_wait_us * 1000;
    b->max_samples = max_samples;
    b->run = run;
    b->user = user;
    pthread_mutex_init(&b->mu, NULL);
    ps_cond_init_mono(&b->cv);
    for (; b->started < executors; b->started++) {
        int rc = pthread_create(&b->thread[b->started], NULL, executor_main, b);
        if (rc != 0) {
            ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "batcher: cannot start its thread: %s", strerror(rc));
            stop_and_join(b);
            pthread_cond_destroy(&b->cv);
            pthread_mutex_destroy(&b->mu);
            free(b);
            return NULL;
        }
    }
    return b;
}

void ps_batcher_free(ps_batcher *b) {
    if (!b) return;
    stop_and_join(b);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

void ps_batcher_submit(ps_batcher *b, ps_batch_item *it) {
    it->t_in = ps_prof_now();
    it->next = NULL;
    pthread_mutex_lock(&b->mu);
    if (b->tail) b->tail->next = it;
    else b->head = it;
    b->tail = it;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

void ps_batcher_stats_get(ps_batcher *b, ps_batcher_stats *out) {
    pthread_mutex_lock(&b->mu);
    *out = b->stats;
    pthread_mutex_unlock(&b->mu);
}
