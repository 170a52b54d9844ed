#include "ctx_table.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBUCKETS 1024
#define FIN_BUCKETS 65536
#define MAX_RANKS 65536
#define BLOOM_BITS (1u << 21)          /* per generation: 256 KiB */
#define BLOOM_GEN_IDS 150000           /* ids per generation before rotating (~1 % false positives) */

/* A finished context: in a hash chain by id and a FIFO by finish time. */
typedef struct fin_entry {
    uint64_t id;
    uint64_t version;
    double time;
    struct fin_entry *chain;
    struct fin_entry *fifo_next;
} fin_entry;

struct ps_ctx_table {
    pthread_mutex_t mu;
    ps_ctx_table_opts o;
    ps_ctx *buckets[NBUCKETS];
    fin_entry **fin;               /* FIN_BUCKETS chains */
    fin_entry *fifo_head, *fifo_tail;
    size_t nfin;
    unsigned char *bloom[2];       /* ids evicted from fin: [0] current, [1] previous generation */
    size_t bloom_n;
    uint64_t live, expired, opened, trainers_seen, bytes;
    unsigned char *ranks;  /* bitmap of ranks seen */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t id) {
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdULL;
    id ^= id >> 33;
    id *= 0xc4ceb9fe1a85ec53ULL;
    id ^= id >> 33;
    return id;
}

static size_t bucket_of(uint64_t id) { return (size_t)(mix(id) % NBUCKETS); }
static size_t fin_bucket_of(uint64_t id) { return (size_t)(mix(id) % FIN_BUCKETS); }

/* ---- the filter of ids finished too long ago ---------------------------- */

static void bloom_bits(uint64_t id, uint32_t bit[3]) {
    uint64_t h = mix(id ^ 0x9e3779b97f4a7c15ULL), g = mix(h + id);
    for (int i = 0; i < 3; i++) bit[i] = (uint32_t)((h + (uint64_t)i * g) % BLOOM_BITS);
}

static void bloom_add_locked(ps_ctx_table *t, uint64_t id) {
    if (t->bloom_n >= BLOOM_GEN_IDS) {   /* rotate: forget the oldest generation */
        unsigned char *old = t->bloom[1];
        t->bloom[1] = t->bloom[0];
        memset(old, 0, BLOOM_BITS / 8);
        t->bloom[0] = old;
        t->bloom_n = 0;
    }
    uint32_t b[3];
    bloom_bits(id, b);
    for (int i = 0; i < 3; i++) t->bloom[0][b[i] / 8] |= (unsigned char)(1u << (b[i] % 8));
    t->bloom_n++;
}

static int bloom_has_locked(const ps_ctx_table *t, uint64_t id) {
    uint32_t b[3];
    bloom_bits(id, b);
    for (int g = 0; g < 2; g++) {
        int all = 1;
        for (int i = 0; i < 3 && all; i++) all = (t->bloom[g][b[i] / 8] >> (b[i] % 8)) & 1;
        if (all) return 1;
    }
    return 0;
}

/* ---- finished ids --------------------------------------------------------- */

static const fin_entry *find_finished_locked(const ps_ctx_table *t, uint64_t id) {
    for (const fin_entry *f = t->fin[fin_bucket_of(id)]; f; f = f->chain)
        if (f->id == id) return f;
    return NULL;
}

static void evict_oldest_locked(ps_ctx_table *t) {
    fin_entry *f = t->fifo_head;
    t->fifo_head = f->fifo_next;
    if (!t->fifo_head) t->fifo_tail = NULL;
    fin_entry **pp = &t->fin[fin_bucket_of(f->id)];
    while (*pp && *pp != f) pp = &(*pp)->chain;
    if (*pp) *pp = f->chain;
    t->nfin--;
    bloom_add_locked(t, f->id);
    free(f);
}

static void trim_finished_locked(ps_ctx_table *t, double now) {
    while (t->fifo_head && (t->nfin > t->o.max_finished || now - t->fifo_head->time > t->o.settle_window_s))
        evict_oldest_locked(t);
}

static void remember_finished_locked(ps_ctx_table *t, uint64_t id, uint64_t version) {
    fin_entry *f = malloc(sizeof *f);
    if (!f) {  /* cannot remember it: at least the filter says "too old" */
        bloom_add_locked(t, id);
        return;
    }
    f->id = id;
    f->version = version;
    f->time = now_s();
    size_t b = fin_bucket_of(id);
    f->chain = t->fin[b];
    t->fin[b] = f;
    f->fifo_next = NULL;
    if (t->fifo_tail) t->fifo_tail->fifo_next = f;
    else t->fifo_head = f;
    t->fifo_tail = f;
    t->nfin++;
    trim_finished_locked(t, f->time);
}

/* ---- contexts ------------------------------------------------------------ */

ps_ctx_table *ps_ctx_table_create(const ps_ctx_table_opts *o) {
    ps_ctx_table *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->o = *o;
    if (t->o.settle_window_s <= 0) t->o.settle_window_s = 600;
    if (t->o.max_finished == 0) t->o.max_finished = (size_t)1 << 20;
    t->ranks = calloc(MAX_RANKS / 8, 1);
    t->fin = calloc(FIN_BUCKETS, sizeof *t->fin);
    t->bloom[0] = calloc(BLOOM_BITS / 8, 1);
    t->bloom[1] = calloc(BLOOM_BITS / 8, 1);
    if (!t->ranks || !t->fin || !t->bloom[0] || !t->bloom[1]) {
        free(t->ranks);
        free(t->fin);
        free(t->bloom[0]);
        free(t->bloom[1]);
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

static void ctx_free(ps_ctx_table *t, ps_ctx *c) {
    for (size_t i = 0; i < c->nfwd; i++) ps_tape_free(c->fwd[i].tape);
    free(c->fwd);
    if (c->grads) {
        if (t->o.grads_free) t->o.grads_free(c->grads);
        else free(c->grads);
    }
    free(c);
}

void ps_ctx_table_free(ps_ctx_table *t) {
    if (!t) return;
    for (size_t b = 0; b < NBUCKETS; b++) {
        ps_ctx *c = t->buckets[b];
        while (c) {
            ps_ctx *next = c->next;
            ctx_free(t, c);
            c = next;
        }
    }
    while (t->fifo_head) {
        fin_entry *n = t->fifo_head->fifo_next;
        free(t->fifo_head);
        t->fifo_head = n;
    }
    pthread_mutex_destroy(&t->mu);
    free(t->fin);
    free(t->bloom[0]);
    free(t->bloom[1]);
    free(t->ranks);
    free(t);
}

static ps_ctx *find_locked(ps_ctx_table *t, uint64_t id) {
    for (ps_ctx *c = t->buckets[bucket_of(id)]; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

static void unlink_locked(ps_ctx_table *t, ps_ctx *c) {
    ps_ctx **pp = &t->buckets[bucket_of(c->id)];
    while (*pp && *pp != c) pp = &(*pp)->next;
    if (*pp) *pp = c->next;
    t->live--;
    t->bytes -= c->bytes;
}

ps_ctx *ps_ctx_table_open(ps_ctx_table *t, uint64_t id, uint32_t rank, int *created, ps_err *err) {
    if (created) *created = 0;
    pthread_mutex_lock(&t->mu);
    ps_ctx *c = find_locked(t, id);
    if (c) {
        if (c->busy) {
            ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu is in use by another request",
                       (unsigned long long)id);
            c = NULL;
        } else {
            c->busy = 1;
        }
    } else if (find_finished_locked(t, id) || bloom_has_locked(t, id)) {
        ps_err_set(err, PS_ERR_ALREADY_EXISTS, "context %llu was already used and stepped; "
                   "use a new context id for every batch", (unsigned long long)id);
    } else if (t->live >= t->o.max_live) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "too many open contexts (%zu); finish or "
                   "abandon some (they expire after %.0f s)", t->o.max_live, t->o.ttl_s);
    } else if (!(c = calloc(1, sizeof *c))) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        c->id = id;
        c->rank = rank;
        c->busy = 1;
        c->last_used = now_s();
        size_t b = bucket_of(id);
        c->next = t->buckets[b];
        t->buckets[b] = c;
        t->live++;
        t->opened++;
        if (created) *created = 1;
    }
    pthread_mutex_unlock(&t->mu);
    return c;
}

ps_ctx *ps_ctx_table_acquire(ps_ctx_table *t, uint64_t id, int *finished, uint64_t *finished_version,
                             ps_err *err) {
    if (finished) *finished = 0;
    pthread_mutex_lock(&t->mu);
    ps_ctx *c = find_locked(t, id);
    if (!c) {
        const fin_entry *f = find_finished_locked(t, id);
        if (f) {
            if (finished) *finished = 1;
            if (finished_version) *finished_version = f->version;
            ps_err_set(err, PS_ERR_NOT_FOUND, "context %llu was already stepped and freed",
                       (unsigned long long)id);
        } else if (bloom_has_locked(t, id)) {
            if (finished) *finished = 2;
            ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu is too old to settle: it was "
                       "stepped more than %.0f s (server.settle_window_s) or %zu steps "
                       "(server.max_finished) ago; its step was applied once - do not re-run the batch",
                       (unsigned long long)id, t->o.settle_window_s, t->o.max_finished);
        } else {
            ps_err_set(err, PS_ERR_NOT_FOUND, "unknown context %llu (never opened by a training "
                       "Forward, or expired after %.0f s idle)", (unsigned long long)id, t->o.ttl_s);
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

ps_ctx_fwd *ps_ctx_find_fwd(ps_ctx *c, uint32_t seq) {
    for (size_t i = 0; i < c->nfwd; i++)
        if (c->fwd[i].seq == seq) return &c->fwd[i];
    return NULL;
}

ps_status ps_ctx_add_fwd(ps_ctx_table *t, ps_ctx *c, uint32_t seq, ps_tape *tape, uint64_t version,
                         size_t bytes, ps_err *err) {
    if (c->nfwd == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 4;
        ps_ctx_fwd *p = realloc(c->fwd, ncap * sizeof *p);
        if (!p) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory recording a forward");
        c->fwd = p;
        c->cap = ncap;
    }
    c->fwd[c->nfwd++] = (ps_ctx_fwd){.seq = seq, .tape = tape, .version = version, .bytes = bytes};
    ps_ctx_table_account(t, c, c->bytes + bytes);
    return PS_OK;
}

void ps_ctx_fwd_done(ps_ctx_table *t, ps_ctx *c, ps_ctx_fwd *f) {
    ps_tape_free(f->tape);
    f->tape = NULL;
    f->backwarded = 1;
    ps_ctx_table_account(t, c, c->bytes >= f->bytes ? c->bytes - f->bytes : 0);
    f->bytes = 0;
}

size_t ps_ctx_pending(const ps_ctx *c, uint32_t *first_seq) {
    size_t n = 0;
    for (size_t i = 0; i < c->nfwd; i++)
        if (!c->fwd[i].backwarded) {
            if (!n && first_seq) *first_seq = c->fwd[i].seq;
            n++;
        }
    return n;
}

void ps_ctx_table_account(ps_ctx_table *t, ps_ctx *c, size_t bytes) {
    pthread_mutex_lock(&t->mu);
    t->bytes = t->bytes - c->bytes + bytes;
    c->bytes = bytes;
    pthread_mutex_unlock(&t->mu);
}

void ps_ctx_table_release(ps_ctx_table *t, ps_ctx *c) {
    pthread_mutex_lock(&t->mu);
    int empty = c->nfwd == 0 && !c->grads;
    if (empty) unlink_locked(t, c);  /* opened by a Forward that failed: nothing to keep */
    c->busy = 0;
    c->last_used = now_s();
    pthread_mutex_unlock(&t->mu);
    if (empty) ctx_free(t, c);
}

void ps_ctx_table_finish(ps_ctx_table *t, ps_ctx *c, uint64_t version) {
    pthread_mutex_lock(&t->mu);
    unlink_locked(t, c);
    remember_finished_locked(t, c->id, version);
    pthread_mutex_unlock(&t->mu);
    ctx_free(t, c);
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
            if (!c->busy && now - c->last_used > t->o.ttl_s) {
                *pp = c->next;
                c->next = dead;
                dead = c;
                t->live--;
                t->bytes -= c->bytes;
                t->expired++;
                n++;
            } else {
                pp = &c->next;
            }
        }
    }
    trim_finished_locked(t, now);
    pthread_mutex_unlock(&t->mu);
    while (dead) {   /* free outside the lock: tapes can be large */
        ps_ctx *next = dead->next;
        ctx_free(t, dead);
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
    out->bytes = t->bytes;
    out->finished_kept = t->nfin;
    pthread_mutex_unlock(&t->mu);
}
