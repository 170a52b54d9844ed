#include "ctx_table.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBUCKETS 1024
#define FINISHED_RING 4096
#define MAX_RANKS 65536

typedef struct finished_entry {
    uint64_t id;
    uint64_t version;
    int used;
} finished_entry;

struct ps_ctx_table {
    pthread_mutex_t mu;
    double ttl_s;
    size_t max_live;
    ps_ctx *buckets[NBUCKETS];
    finished_entry ring[FINISHED_RING];
    size_t ring_next;
    uint64_t live, expired, opened, trainers_seen;
    unsigned char *ranks;  /* bitmap of ranks seen */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t bucket_of(uint64_t id) {
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    return (size_t)(id % NBUCKETS);
}

ps_ctx_table *ps_ctx_table_create(double ttl_s, size_t max_live) {
    ps_ctx_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->ranks = calloc(MAX_RANKS / 8, 1);
    if (!t->ranks) { free(t); return NULL; }
    pthread_mutex_init(&t->mu, NULL);
    t->ttl_s = ttl_s;
    t->max_live = max_live;
    return t;
}

void ps_ctx_table_free(ps_ctx_table *t) {
    if (!t) return;
    for (size_t b = 0; b < NBUCKETS; b++) {
        ps_ctx *c = t->buckets[b];
        while (c) {
            ps_ctx *next = c->next;
            ps_tape_free(c->tape);
            free(c);
            c = next;
        }
    }
    pthread_mutex_destroy(&t->mu);
    free(t->ranks);
    free(t);
}

static ps_ctx *find_locked(ps_ctx_table *t, uint64_t id) {
    for (ps_ctx *c = t->buckets[bucket_of(id)]; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

static const finished_entry *find_finished_locked(const ps_ctx_table *t, uint64_t id) {
    for (size_t i = 0; i < FINISHED_RING; i++)
        if (t->ring[i].used && t->ring[i].id == id) return &t->ring[i];
    return NULL;
}

static void unlink_locked(ps_ctx_table *t, ps_ctx *c) {
    ps_ctx **pp = &t->buckets[bucket_of(c->id)];
    while (*pp && *pp != c) pp = &(*pp)->next;
    if (*pp) *pp = c->next;
    t->live--;
}

ps_status ps_ctx_table_insert(ps_ctx_table *t, uint64_t id, uint32_t rank, ps_tape *tape, ps_err *err) {
    pthread_mutex_lock(&t->mu);
    ps_status rc = PS_OK;
    if (find_locked(t, id)) {
        rc = ps_err_set(err, PS_ERR_ALREADY_EXISTS, "context %llu is already open", (unsigned long long)id);
    } else if (find_finished_locked(t, id)) {
        rc = ps_err_set(err, PS_ERR_ALREADY_EXISTS, "context %llu was already used and stepped; "
                        "use a new context id for every batch", (unsigned long long)id);
    } else if (t->live >= t->max_live) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "too many open contexts (%zu); finish or "
                        "abandon some (they expire after %.0f s)", t->max_live, t->ttl_s);
    } else {
        ps_ctx *c = calloc(1, sizeof *c);
        if (!c) {
            rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        } else {
            c->id = id;
            c->rank = rank;
            c->tape = tape;
            c->state = PS_CTX_FORWARDED;
            c->last_used = now_s();
            size_t b = bucket_of(id);
            c->next = t->buckets[b];
            t->buckets[b] = c;
            t->live++;
            t->opened++;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

ps_ctx *ps_ctx_table_acquire(ps_ctx_table *t, uint64_t id, int *finished, uint64_t *finished_version,
                             ps_err *err) {
    if (finished) *finished = 0;
    pthread_mutex_lock(&t->mu);
    ps_ctx *c = find_locked(t, id);
    if (!c) {
        const finished_entry *f = find_finished_locked(t, id);
        if (f) {
            if (finished) *finished = 1;
            if (finished_version) *finished_version = f->version;
            ps_err_set(err, PS_ERR_NOT_FOUND, "context %llu was already stepped and freed",
                       (unsigned long long)id);
        } else {
            ps_err_set(err, PS_ERR_NOT_FOUND, "unknown context %llu (never opened by a training "
                       "Forward, or expired after %.0f s idle)", (unsigned long long)id, t->ttl_s);
        }
    } else if (c->busy) {
        ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu is in use by another request",
                   (unsigned long long)id);
        c = NULL;
    } else {
        c->busy = 1;
    }
    pthread_mutex_unlock(&t->mu);
    return c;
}

void ps_ctx_table_release(ps_ctx_table *t, ps_ctx *c) {
    pthread_mutex_lock(&t->mu);
    c->busy = 0;
    c->last_used = now_s();
    pthread_mutex_unlock(&t->mu);
}

void ps_ctx_table_finish(ps_ctx_table *t, ps_ctx *c, uint64_t version) {
    pthread_mutex_lock(&t->mu);
    unlink_locked(t, c);
    finished_entry *f = &t->ring[t->ring_next];
    f->id = c->id;
    f->version = version;
    f->used = 1;
    t->ring_next = (t->ring_next + 1) % FINISHED_RING;
    pthread_mutex_unlock(&t->mu);
    ps_tape_free(c->tape);
    free(c);
}

size_t ps_ctx_table_expire(ps_ctx_table *t) {
    ps_ctx *dead = NULL;
    size_t n = 0;
    double now = now_s();
    pthread_mutex_lock(&t->mu);
    for (size_t b = 0; b < NBUCKETS; b++) {
        ps_ctx **pp = &t->buckets[b];
        while (*pp) {
            ps_ctx *c = *pp;
            if (!c->busy && now - c->last_used > t->ttl_s) {
                *pp = c->next;
                c->next = dead;
                dead = c;
                t->live--;
                t->expired++;
                n++;
            } else {
                pp = &c->next;
            }
        }
    }
    pthread_mutex_unlock(&t->mu);
    while (dead) {   /* free outside the lock: tapes can be large */
        ps_ctx *next = dead->next;
        ps_tape_free(dead->tape);
        free(dead);
        dead = next;
    }
    return n;
}

void ps_ctx_table_note_rank(ps_ctx_table *t, uint32_t rank) {
    if (rank >= MAX_RANKS) return;
    pthread_mutex_lock(&t->mu);
    if (!(t->ranks[rank / 8] & (1u << (rank % 8)))) {
        t->ranks[rank / 8] |= (unsigned char)(1u << (rank % 8));
        t->trainers_seen++;
    }
    pthread_mutex_unlock(&t->mu);
}

void ps_ctx_table_stats(ps_ctx_table *t, ps_ctx_stats *out) {
    pthread_mutex_lock(&t->mu);
    out->live = t->live;
    out->expired = t->expired;
    out->opened = t->opened;
    out->trainers_seen = t->trainers_seen;
    pthread_mutex_unlock(&t->mu);
}
