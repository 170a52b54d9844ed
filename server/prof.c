/* prof.c - per-phase accounting of psd's calls: the thread's bound record,
 * timed sections and lock waits, per-method accumulators (see prof.h). */
#include "prof.h"

#include <time.h>

static const char *const phase_names[PS_PHASE_COUNT] = {
    [PS_PHASE_RECV] = "recv",       [PS_PHASE_QUEUE] = "queue",     [PS_PHASE_DECODE] = "decode",
    [PS_PHASE_CTX] = "ctx",         [PS_PHASE_LOCK] = "lock",       [PS_PHASE_COMPUTE] = "compute",
    [PS_PHASE_HANDLER] = "handler", [PS_PHASE_ENCODE] = "encode",   [PS_PHASE_SEND] = "send",     [PS_PHASE_HELD] = "held",
};

const char *ps_phase_name(ps_phase p) { return p >= 0 && p < PS_PHASE_COUNT ? phase_names[p] : "?"; }

/* The calling thread's record: per thread like errno, set and cleared by
 * the rpc layer around a handler. */
static __thread ps_prof_call *bound;

void ps_prof_bind(ps_prof_call *rec) { bound = rec; }
ps_prof_call *ps_prof_bound(void) { return bound; }

int64_t ps_prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ps_prof_add(ps_phase p, int64_t ns) {
    if (bound) bound->ns[p] += ns;
}

int64_t ps_prof_begin(void) { return bound ? ps_prof_now() : 0; }

void ps_prof_end(ps_phase p, int64_t t0) {
    if (bound) bound->ns[p] += ps_prof_now() - t0;
}

void ps_prof_rdlock(pthread_rwlock_t *l, ps_phase p) {
    if (!bound || pthread_rwlock_tryrdlock(l) != 0) {
        int64_t t0 = ps_prof_begin();
        pthread_rwlock_rdlock(l);
        ps_prof_end(p, t0);
    }
}

void ps_prof_wrlock(pthread_rwlock_t *l, ps_phase p) {
    if (!bound || pthread_rwlock_trywrlock(l) != 0) {
        int64_t t0 = ps_prof_begin();
        pthread_rwlock_wrlock(l);
        ps_prof_end(p, t0);
    }
}

void ps_prof_mutex_lock(pthread_mutex_t *m, ps_phase p) {
    if (!bound || pthread_mutex_trylock(m) != 0) {
        int64_t t0 = ps_prof_begin();
        pthread_mutex_lock(m);
        ps_prof_end(p, t0);
    }
}

void ps_prof_acc_add(ps_prof_acc *a, const ps_prof_call *c, int64_t span_ns) {
    __atomic_add_fetch(&a->calls, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&a->span_ns, (uint64_t)(span_ns > 0 ? span_ns : 0), __ATOMIC_RELAXED);
    for (int p = 0; p < PS_PHASE_COUNT; p++)
        if (c->ns[p] > 0) __atomic_add_fetch(&a->ns[p], (uint64_t)c->ns[p], __ATOMIC_RELAXED);
}

void ps_prof_acc_read(const ps_prof_acc *a, ps_prof_acc *out) {
    out->calls = __atomic_load_n(&a->calls, __ATOMIC_RELAXED);
    out->span_ns = __atomic_load_n(&a->span_ns, __ATOMIC_RELAXED);
    for (int p = 0; p < PS_PHASE_COUNT; p++) out->ns[p] = __atomic_load_n(&a->ns[p], __ATOMIC_RELAXED);
}
