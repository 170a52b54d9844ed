/* prof.h - where a call's wall-clock time goes: per-phase accounting of
 * psd's calls (docs/performance.md, "Where the time goes").
 *
 * A call's phases, in the order they happen:
 *
 *   recv     accepted (metadata arrived) -> its request message received
 *   queue    received -> a worker takes it (all workers busy)
 *   decode   the request's protobuf and tensors decoded
 *   ctx      waiting for the context table's lock
 *   lock     waiting for the weights lock (readers/writer)
 *   compute  forward, backward or optimizer step, holding the weights lock
 *   handler  the rest of the handler: validation, NaN checks, gradient
 *            bookkeeping, accounting
 *   encode   the response encoded
 *   send     handing the reply to gRPC (which writes what it can at once)
 *   held     a deferred call waiting to be answered (a sync round, ssp's
 *            staleness bound, a combined batch)
 *
 * The rpc layer times recv, queue, send and the handler as a whole; the
 * dispatcher times decode and encode; the context table and the model time
 * their waits and the compute. Those deeper layers know nothing of calls:
 * they add to the record the rpc layer bound to the calling thread
 * (ps_prof_bind), and add nothing when none is bound (a trainer, a test,
 * a bench, or psd with server.profile off). A bound record belongs to one
 * call and one thread at a time, so adding needs no atomics; the rpc layer
 * folds finished calls into per-method accumulators (ps_prof_acc) with
 * relaxed atomics.
 *
 * Cost: two clock reads per timed section (a vDSO call, ~20-50 ns); waits
 * are timed only when the lock is taken (a failed trylock first).
 */
#ifndef PS_PROF_H
#define PS_PROF_H

#include <pthread.h>
#include <stdint.h>

typedef enum {
    PS_PHASE_RECV,
    PS_PHASE_QUEUE,
    PS_PHASE_DECODE,
    PS_PHASE_CTX,
    PS_PHASE_LOCK,
    PS_PHASE_COMPUTE,
    PS_PHASE_HANDLER,
    PS_PHASE_ENCODE,
    PS_PHASE_SEND,
    PS_PHASE_HELD,
    PS_PHASE_COUNT
} ps_phase;

/* "recv", "queue", ... */
const char *ps_phase_name(ps_phase p);

/* One call's phase times, nanoseconds. */
typedef struct ps_prof_call {
    int64_t ns[PS_PHASE_COUNT];
} ps_prof_call;

/* Phases the calling thread times from now on go to rec (NULL: none). */
void ps_prof_bind(ps_prof_call *rec);
/* The record bound to the calling thread, or NULL. */
ps_prof_call *ps_prof_bound(void);

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t ps_prof_now(void);

/* rec->ns[p] += ns for the thread's bound record (none: nothing). */
void ps_prof_add(ps_phase p, int64_t ns);

/* Timing a section into the bound record: t = ps_prof_begin(); ...;
 * ps_prof_end(PHASE, t). Without a bound record neither reads the clock. */
int64_t ps_prof_begin(void);
void ps_prof_end(ps_phase p, int64_t t0);

/* Lock acquisitions whose waits count as phase p (PS_PHASE_LOCK,
 * PS_PHASE_CTX): a trylock first; only a lock already held is timed. */
void ps_prof_rdlock(pthread_rwlock_t *l, ps_phase p);
void ps_prof_wrlock(pthread_rwlock_t *l, ps_phase p);
void ps_prof_mutex_lock(pthread_mutex_t *m, ps_phase p);

/* Finished calls of one method, summed (relaxed atomics). span: accepted
 * -> reply handed to gRPC, the call's whole time in psd; rpc = span minus the
 * phases: the rpc layer's own work between them. A deferred call's
 * encode is not counted (it happens on whichever thread answers it). */
typedef struct ps_prof_acc {
    uint64_t calls;
    uint64_t span_ns;
    uint64_t ns[PS_PHASE_COUNT];
} ps_prof_acc;

void ps_prof_acc_add(ps_prof_acc *a, const ps_prof_call *c, int64_t span_ns);
/* A consistent-enough copy (each field read atomically). */
void ps_prof_acc_read(const ps_prof_acc *a, ps_prof_acc *out);

#endif
