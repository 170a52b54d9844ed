/* test_prof - the phase accounting (server/prof.h): nothing is added
 * without a bound record, timed sections land in the bound record, a lock
 * wait is timed only when the lock was held by another thread (and then
 * at least as long as the holder kept it), and the accumulators sum calls. */
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "prof.h"

static void sleep_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct holder {
    pthread_rwlock_t *rw;
    pthread_mutex_t *mu;
    int hold_ms;
    volatile int held;
} holder;

static void *hold_write(void *p) {
    holder *h = p;
    pthread_rwlock_wrlock(h->rw);
    h->held = 1;
    sleep_ms(h->hold_ms);
    pthread_rwlock_unlock(h->rw);
    return NULL;
}

static void *hold_mutex(void *p) {
    holder *h = p;
    pthread_mutex_lock(h->mu);
    h->held = 1;
    sleep_ms(h->hold_ms);
    pthread_mutex_unlock(h->mu);
    return NULL;
}

int main(void) {
    /* names */
    CHECK(!strcmp(ps_phase_name(PS_PHASE_COMPUTE), "compute"));
    CHECK(!strcmp(ps_phase_name(PS_PHASE_LOCK), "lock"));
    CHECK(!strcmp(ps_phase_name(PS_PHASE_COUNT), "?"));

    /* unbound: no clock read, nothing added anywhere */
    ps_prof_bind(NULL);
    CHECK(ps_prof_bound() == NULL);
    CHECK(ps_prof_begin() == 0);
    ps_prof_add(PS_PHASE_COMPUTE, 5);   /* a no-op */

    ps_prof_call rec;
    memset(&rec, 0, sizeof rec);
    ps_prof_bind(&rec);
    CHECK(ps_prof_bound() == &rec);
    ps_prof_add(PS_PHASE_DECODE, 7);
    CHECK(rec.ns[PS_PHASE_DECODE] == 7);
    int64_t t0 = ps_prof_begin();
    CHECK(t0 > 0);
    sleep_ms(20);
    ps_prof_end(PS_PHASE_COMPUTE, t0);
    CHECK_MSG(rec.ns[PS_PHASE_COMPUTE] >= 20000000, "compute %lld ns", (long long)rec.ns[PS_PHASE_COMPUTE]);

    /* a free lock: no wait recorded */
    pthread_rwlock_t rw;
    pthread_rwlock_init(&rw, NULL);
    pthread_mutex_t mu;
    pthread_mutex_init(&mu, NULL);
    ps_prof_rdlock(&rw, PS_PHASE_LOCK);
    pthread_rwlock_unlock(&rw);
    ps_prof_wrlock(&rw, PS_PHASE_LOCK);
    pthread_rwlock_unlock(&rw);
    ps_prof_mutex_lock(&mu, PS_PHASE_CTX);
    pthread_mutex_unlock(&mu);
    CHECK(rec.ns[PS_PHASE_LOCK] == 0);
    CHECK(rec.ns[PS_PHASE_CTX] == 0);

    /* a writer holds the weights lock 50 ms: a reader's wait is timed */
    holder h = {&rw, &mu, 50, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, hold_write, &h) == 0);
    while (!h.held) sleep_ms(1);
    ps_prof_rdlock(&rw, PS_PHASE_LOCK);
    pthread_rwlock_unlock(&rw);
    pthread_join(th, NULL);
    int64_t after_read = rec.ns[PS_PHASE_LOCK];
    CHECK_MSG(after_read >= 30000000, "reader waited %lld ns for a 50 ms writer", (long long)after_read);
    /* ... and a writer's wait */
    h.held = 0;
    CHECK(pthread_create(&th, NULL, hold_write, &h) == 0);
    while (!h.held) sleep_ms(1);
    ps_prof_wrlock(&rw, PS_PHASE_LOCK);
    pthread_rwlock_unlock(&rw);
    pthread_join(th, NULL);
    CHECK(rec.ns[PS_PHASE_LOCK] - after_read >= 30000000);
    /* a held mutex counts as the phase given (the context table's) */
    h.held = 0;
    CHECK(pthread_create(&th, NULL, hold_mutex, &h) == 0);
    while (!h.held) sleep_ms(1);
    ps_prof_mutex_lock(&mu, PS_PHASE_CTX);
    pthread_mutex_unlock(&mu);
    pthread_join(th, NULL);
    CHECK(rec.ns[PS_PHASE_CTX] >= 30000000);

    /* unbound again: a held lock is waited for, nothing recorded */
    ps_prof_bind(NULL);
    ps_prof_call before = rec;
    h.held = 0;
    CHECK(pthread_create(&th, NULL, hold_write, &h) == 0);
    while (!h.held) sleep_ms(1);
    ps_prof_rdlock(&rw, PS_PHASE_LOCK);
    pthread_rwlock_unlock(&rw);
    pthread_join(th, NULL);
    CHECK(!memcmp(&before, &rec, sizeof rec));

    /* accumulators: sums of calls and spans */
    ps_prof_acc acc;
    memset(&acc, 0, sizeof acc);
    ps_prof_call a = {{0}}, b = {{0}};
    a.ns[PS_PHASE_COMPUTE] = 100;
    a.ns[PS_PHASE_QUEUE] = 3;
    b.ns[PS_PHASE_COMPUTE] = 50;
    ps_prof_acc_add(&acc, &a, 200);
    ps_prof_acc_add(&acc, &b, 60);
    ps_prof_acc out;
    ps_prof_acc_read(&acc, &out);
    CHECK(out.calls == 2);
    CHECK(out.span_ns == 260);
    CHECK(out.ns[PS_PHASE_COMPUTE] == 150);
    CHECK(out.ns[PS_PHASE_QUEUE] == 3);
    CHECK(out.ns[PS_PHASE_SEND] == 0);

    pthread_rwlock_destroy(&rw);
    pthread_mutex_destroy(&mu);
    return check_summary("test_prof");
}
