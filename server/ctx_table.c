/* ctx_table.c - the table of psd's request contexts (ctx_table.h): open,
 * acquire and release by id and owner, the finished contexts that answer a
 * repeated Step, expiry, and the fair shares of context memory per client. */
#include "ctx_table.h"
#include "prof.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

#define NBUCKETS 1024
#define FIN_BUCKETS 65536
#define MAX_RANKS 65536
#define BLOOM_BITS (1u << 21)          /* per generation: 256 KiB */
#define BLOOM_GEN_IDS 150000           /* ids per generation before rotating (~1 % false positives) */

/* A finished context: in a hash chain by id and a FIFO by finish time. */
typedef struct fin_entry {
    uint64_t id;
    uint64_t version;
    int how;                       /* ps_ctx_fin_how: applied, skipped (non-finite) or dropped */
    double time;
    struct fin_entry *chain;
    struct fin_entry *fifo_next;
} fin_entry;

/* Who holds contexts: bytes and count per owner (t->mu). The key is the
 * whole identity, compared whole. */
typedef struct ctx_owner {
    size_t bytes, count;
    struct ctx_owner *next;
    char key[];
} ctx_owner;

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
    uint64_t evicted, refused, released;
    uint64_t applied;              /* contexts whose step reached the weights (imported + since) */
    pthread_rwlock_t apply_lk;     /* held shared from a step's application to its record; a
                                    * checkpoint's snapshot holds it exclusively */
    ctx_owner *owners;
    size_t nowners;
    unsigned char *ranks;  /* bitmap of ranks seen */
};

static ctx_owner *owner_get_locked(ps_ctx_table *t, const char *key, int create) {
    if (!key) key = "";
    for (ctx_owner *o = t->owners; o; o = o->next)
        if (!strcmp(o->key, key)) return o;
    if (!create) return NULL;
    size_t len = strlen(key);
    ctx_owner *o = calloc(1, sizeof *o + len + 1);
    if (!o) return NULL;
    memcpy(o->key, key, len + 1);
    o->next = t->owners;
    t->owners = o;
    t->nowners++;
    return o;
}

/* A context's bytes (held + reserved) change by delta, for the total and
 * its owner. */
static void bytes_add_locked(ps_ctx_table *t, ps_ctx *c, long long delta) {
    t->bytes += (uint64_t)delta;
    if (c->own) c->own->bytes += (size_t)delta;
}

/* c leaves the table: its owner loses it (and is forgotten at zero). */
static void owner_drop_locked(ps_ctx_table *t, ps_ctx *c) {
    ctx_owner *o = c->own;
    if (!o) return;
    c->own = NULL;
    o->bytes -= c->bytes + c->reserved;
    if (--o->count > 0) return;
    ctx_owner **pp = &t->owners;
    while (*pp && *pp != o) pp = &(*pp)->next;
    if (*pp) *pp = o->next;
    t->nowners--;
    free(o);
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

static void remember_finished_locked(ps_ctx_table *t, uint64_t id, uint64_t version, int how, double time) {
    fin_entry *f = malloc(sizeof *f);
    if (!f) {  /* cannot remember it: at least the filter says "too old" */
        bloom_add_locked(t, id);
        return;
    }
    f->id = id;
    f->version = version;
    f->how = how;
    f->time = time;
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
    /* writer-preferring: a checkpoint's snapshot is not starved by steps */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&t->apply_lk, &ra);
    pthread_rwlockattr_destroy(&ra);
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

static void free_dead(ps_ctx_table *t, ps_ctx *dead) {
    while (dead) {
        ps_ctx *next = dead->next;
        ctx_free(t, dead);
        dead = next;
    }
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
    while (t->owners) {
        ctx_owner *n = t->owners->next;
        free(t->owners);
        t->owners = n;
    }
    pthread_mutex_destroy(&t->mu);
    pthread_rwlock_destroy(&t->apply_lk);
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
    t->bytes -= c->bytes + c->reserved;
    owner_drop_locked(t, c);
}

/* The least recently used idle context of the owner holding the most
 * (bytes if by_bytes, else contexts) beyond share, not of `spare`; NULL if
 * no owner is over its share or it has no idle context. */
static ps_ctx *victim_locked(ps_ctx_table *t, const ctx_owner *spare, size_t share, int by_bytes) {
    ctx_owner *worst = NULL;
    for (ctx_owner *o = t->owners; o; o = o->next) {
        size_t v = by_bytes ? o->bytes : o->count;
        if (o != spare && v > share && (!worst || v > (by_bytes ? worst->bytes : worst->count))) worst = o;
    }
    if (!worst) return NULL;
    ps_ctx *lru = NULL;
    for (size_t b = 0; b < NBUCKETS; b++)
        for (ps_ctx *c = t->buckets[b]; c; c = c->next)
            if (c->own == worst && !c->busy && (!lru || c->last_used < lru->last_used)) lru = c;
    return lru;
}

/* Evict one context (make room for another owner); it is freed by the
 * caller after unlocking, from the *dead list. */
static void evict_locked(ps_ctx_table *t, ps_ctx *c, ps_ctx **dead) {
    unlink_locked(t, c);
    c->next = *dead;
    *dead = c;
    t->evicted++;
}

/* A context another call holds (still running, or its Step waiting in a sync
 * round): nothing is decided yet, so the answer is "ask again later". */
static void in_use(ps_err *err, uint64_t id) {
    ps_err_set(err, PS_ERR_UNAVAILABLE, "context %llu is in use by another request (still running, or its Step "
               "waits in its sync round); ask again later", (unsigned long long)id);
}

ps_ctx *ps_ctx_table_open(ps_ctx_table *t, uint64_t id, uint32_t rank, int *created, ps_err *err) {
    return ps_ctx_table_open_as(t, id, rank, NULL, created, err);
}

ps_ctx *ps_ctx_table_open_as(ps_ctx_table *t, uint64_t id, uint32_t rank, const char *owner, int *created,
                             ps_err *err) {
    if (created) *created = 0;
    if (!owner) owner = "";
    ps_ctx *dead = NULL;
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    ps_ctx *c = find_locked(t, id);
    ctx_owner *me = owner_get_locked(t, owner, 0);
    if (!c && t->live >= t->o.max_live && !find_finished_locked(t, id) && !bloom_has_locked(t, id)) {
        /* the count limit, shared fairly: room by evicting from whoever
         * holds the most contexts beyond its share */
        size_t share = t->o.max_live / (t->nowners + (me ? 0 : 1));
        if ((me ? me->count : 0) < share) {
            ps_ctx *v = victim_locked(t, me, share, 0);
            if (v) evict_locked(t, v, &dead);
        }
    }
    if (c && c->own && strcmp(c->own->key, owner)) {
        ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu belongs to another client; "
                   "choose context ids at random (64 bits)", (unsigned long long)id);
        c = NULL;
    } else if (c) {
        if (c->busy) {
            in_use(err, id);
            c = NULL;
        } else {
            c->busy = 1;
        }
    } else if (find_finished_locked(t, id) || bloom_has_locked(t, id)) {
        ps_err_set(err, PS_ERR_ALREADY_EXISTS, "context %llu was already used and stepped; "
                   "use a new context id for every batch", (unsigned long long)id);
    } else if (t->live >= t->o.max_live) {
        t->refused++;
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "too many open contexts (%zu); this client holds %zu "
                   "of them, its fair share among %zu clients is %zu; finish or abandon some (they expire "
                   "after %.0f s)", t->o.max_live, me ? me->count : 0, t->nowners + (me ? 0 : 1),
                   t->o.max_live / (t->nowners + (me ? 0 : 1)), t->o.ttl_s);
        ps_err_retry_after(err, PS_CTX_RETRY_AFTER_MS);  /* nothing opened: the Forward may come again */
    } else if (!(c = calloc(1, sizeof *c)) || !(me = owner_get_locked(t, owner, 1))) {
        free(c);
        c = NULL;
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        c->own = me;
        me->count++;
        c->id = id;
        c->rank = rank;
        c->busy = 1;
        c->last_used = ps_mono_s();
        size_t b = bucket_of(id);
        c->next = t->buckets[b];
        t->buckets[b] = c;
        t->live++;
        t->opened++;
        if (created) *created = 1;
    }
    pthread_mutex_unlock(&t->mu);
    free_dead(t, dead);
    return c;
}

ps_status ps_ctx_table_reserve(ps_ctx_table *t, ps_ctx *c, size_t more, ps_err *err) {
    size_t max = t->o.max_bytes;
    if (!max) return PS_OK;
    ps_ctx *dead = NULL;
    ps_status st = PS_OK;
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    size_t nown = t->nowners ? t->nowners : 1;
    size_t share = max / nown;
    size_t mine = c->own ? c->own->bytes : c->bytes + c->reserved;
    if (t->bytes + more > max && mine + more > share) {
        st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "context memory budget: this client holds %zu bytes "
                        "in %zu contexts and asks for %zu more; its fair share of server.max_context_bytes "
                        "(%zu) among %zu clients is %zu bytes; Step or abandon contexts, or use smaller "
                        "batches", mine, c->own ? c->own->count : 1, more, max, nown, share);
        if (more <= max) ps_err_retry_after(err, PS_CTX_RETRY_AFTER_MS);  /* nothing reserved: it may come again */
    } else {
        while (t->bytes + more > max) {
            ps_ctx *v = victim_locked(t, c->own, share, 1);
            if (!v) break;
            evict_locked(t, v, &dead);
        }
        if (t->bytes + more > max) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "context memory budget server.max_context_bytes "
                            "(%zu) is in use (%llu bytes by %zu clients) by contexts that are busy; retry "
                            "later", max, (unsigned long long)t->bytes, nown);
            ps_err_retry_after(err, PS_CTX_RETRY_AFTER_MS);
        }
    }
    if (st) t->refused++;
    else {
        c->reserved += more;
        bytes_add_locked(t, c, (long long)more);
    }
    pthread_mutex_unlock(&t->mu);
    free_dead(t, dead);
    return st;
}

ps_ctx *ps_ctx_table_acquire(ps_ctx_table *t, uint64_t id, int *finished, uint64_t *finished_version,
                             ps_err *err) {
    return ps_ctx_table_acquire_as(t, id, NULL, finished, finished_version, err);
}

ps_ctx *ps_ctx_table_acquire_as(ps_ctx_table *t, uint64_t id, const char *owner, int *finished,
                                uint64_t *finished_version, ps_err *err) {
    if (finished) *finished = 0;
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
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
            ps_err_set(err, PS_ERR_ALREADY_EXISTS, "context %llu is too old to settle: it was "
                       "stepped more than %.0f s (server.settle_window_s) or %zu steps "
                       "(server.max_finished) ago; its step was applied once - do not re-run the batch",
                       (unsigned long long)id, t->o.settle_window_s, t->o.max_finished);
        } else {
            ps_err_set(err, PS_ERR_NOT_FOUND, "unknown context %llu (never opened by a training "
                       "Forward, or expired after %.0f s idle)", (unsigned long long)id, t->o.ttl_s);
        }
    } else if (owner && c->own && strcmp(c->own->key, owner)) {
        ps_err_set(err, PS_ERR_PERMISSION_DENIED, "context %llu belongs to another client (token or host); "
                   "only the client that opened a context may use it", (unsigned long long)id);
        c = NULL;
    } else if (c->busy) {
        in_use(err, id);
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
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    bytes_add_locked(t, c, (long long)bytes - (long long)(c->bytes + c->reserved));
    c->bytes = bytes;
    c->reserved = 0;
    pthread_mutex_unlock(&t->mu);
}

void ps_ctx_table_release(ps_ctx_table *t, ps_ctx *c) {
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    if (c->reserved) {  /* admitted but never accounted: the call failed */
        bytes_add_locked(t, c, -(long long)c->reserved);
        c->reserved = 0;
    }
    int empty = (c->nfwd == 0 && !c->grads) || c->discard;
    if (empty) unlink_locked(t, c);  /* opened by a Forward that failed, or released by its owner: nothing to keep */
    c->busy = 0;
    c->last_used = ps_mono_s();
    pthread_mutex_unlock(&t->mu);
    if (empty) ctx_free(t, c);
}

int ps_ctx_table_discard_as(ps_ctx_table *t, uint64_t id, const char *owner, ps_err *err) {
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    ps_ctx *c = find_locked(t, id);
    int how = PS_CTX_DISCARD_NONE;
    if (c && owner && c->own && strcmp(c->own->key, owner)) {
        ps_err_set(err, PS_ERR_PERMISSION_DENIED, "context %llu belongs to another client (token or host); only the "
                   "client that opened a context may release it", (unsigned long long)id);
        how = -1;
        c = NULL;
    } else if (c && c->busy) {
        how = c->discard ? PS_CTX_DISCARD_PENDING : (t->released++, PS_CTX_DISCARD_PENDING);
        c->discard = 1;
        c = NULL;
    } else if (c) {
        unlink_locked(t, c);
        t->released++;
        how = PS_CTX_DISCARD_FREED;
    }
    pthread_mutex_unlock(&t->mu);
    if (c) ctx_free(t, c);
    return how;
}

void ps_ctx_table_finish(ps_ctx_table *t, ps_ctx *c, uint64_t version) {
    ps_ctx_table_finish_as(t, c, version, c->nonfinite ? PS_CTX_SKIPPED : PS_CTX_APPLIED);
}

void ps_ctx_table_finish_as(ps_ctx_table *t, ps_ctx *c, uint64_t version, ps_ctx_fin_how how) {
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    unlink_locked(t, c);
    remember_finished_locked(t, c->id, version, (int)how, ps_mono_s());
    if (how == PS_CTX_APPLIED) t->applied++;
    pthread_mutex_unlock(&t->mu);
    ctx_free(t, c);
}

size_t ps_ctx_table_expire(ps_ctx_table *t) {
    ps_ctx *dead = NULL;
    size_t n = 0;
    double now = ps_mono_s();
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    for (size_t b = 0; b < NBUCKETS; b++) {
        ps_ctx **pp = &t->buckets[b];
        while (*pp) {
            ps_ctx *c = *pp;
            if (!c->busy && now - c->last_used > t->o.ttl_s) {
                *pp = c->next;
                c->next = dead;
                dead = c;
                t->live--;
                t->bytes -= c->bytes + c->reserved;
                owner_drop_locked(t, c);
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

int ps_ctx_table_finished_how(ps_ctx_table *t, uint64_t id) {
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    const fin_entry *f = find_finished_locked(t, id);
    int how = f ? f->how : -1;
    pthread_mutex_unlock(&t->mu);
    return how;
}

int ps_ctx_table_applied(ps_ctx_table *t, uint64_t id) {
    pthread_mutex_lock(&t->mu);
    const fin_entry *f = find_finished_locked(t, id);
    int applied = f ? f->how == PS_CTX_APPLIED : bloom_has_locked(t, id);
    pthread_mutex_unlock(&t->mu);
    return applied;
}

int ps_ctx_table_finished_skipped(ps_ctx_table *t, uint64_t id) {
    return ps_ctx_table_finished_how(t, id) == PS_CTX_SKIPPED;
}

/* ---- the order of steps and their records (checkpoints) ------------------ */

void ps_ctx_table_apply_begin(ps_ctx_table *t) { pthread_rwlock_rdlock(&t->apply_lk); }
void ps_ctx_table_apply_end(ps_ctx_table *t) { pthread_rwlock_unlock(&t->apply_lk); }
void ps_ctx_table_freeze(ps_ctx_table *t) { pthread_rwlock_wrlock(&t->apply_lk); }
void ps_ctx_table_thaw(ps_ctx_table *t) { pthread_rwlock_unlock(&t->apply_lk); }

size_t ps_ctx_table_export(ps_ctx_table *t, uint64_t max_version, size_t max_records, ps_ctx_finished **out,
                           uint64_t *applied) {
    *out = NULL;
    pthread_mutex_lock(&t->mu);
    *applied = t->applied;
    size_t n = 0, skip = 0;
    for (const fin_entry *f = t->fifo_head; f; f = f->fifo_next) n += f->version <= max_version;
    if (n > max_records) skip = n - max_records, n = max_records;  /* the oldest go */
    ps_ctx_finished *r = n ? malloc(n * sizeof *r) : NULL;
    size_t k = 0;
    for (const fin_entry *f = t->fifo_head; r && f && k < n; f = f->fifo_next) {
        if (f->version > max_version) continue;
        if (skip) { skip--; continue; }
        r[k++] = (ps_ctx_finished){f->id, f->version, f->how};
    }
    pthread_mutex_unlock(&t->mu);
    *out = r;
    return r ? k : 0;
}

void ps_ctx_table_import(ps_ctx_table *t, const ps_ctx_finished *r, size_t n, uint64_t applied) {
    double now = ps_mono_s();
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < n; i++)
        if (!find_finished_locked(t, r[i].id)) remember_finished_locked(t, r[i].id, r[i].version, r[i].how, now);
    t->applied = applied;
    pthread_mutex_unlock(&t->mu);
}

void ps_ctx_table_note_rank(ps_ctx_table *t, uint32_t rank) {
    if (rank >= MAX_RANKS) return;
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    if (!(t->ranks[rank / 8] & (1u << (rank % 8)))) {
        t->ranks[rank / 8] |= (unsigned char)(1u << (rank % 8));
        t->trainers_seen++;
    }
    pthread_mutex_unlock(&t->mu);
}

void ps_ctx_table_stats(ps_ctx_table *t, ps_ctx_stats *out) {
    ps_prof_mutex_lock(&t->mu, PS_PHASE_CTX);
    out->live = t->live;
    out->expired = t->expired;
    out->opened = t->opened;
    out->trainers_seen = t->trainers_seen;
    out->bytes = t->bytes;
    out->finished_kept = t->nfin;
    out->evicted = t->evicted;
    out->released = t->released;
    out->refused = t->refused;
    out->owners = t->nowners;
    out->applied = t->applied;
    pthread_mutex_unlock(&t->mu);
}
