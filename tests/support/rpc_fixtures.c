/* rpc_fixtures.c - see rpc_fixtures.h. */
#include "rpc_fixtures.h"

#include <pthread.h>
#include <time.h>

#include "status.h"

void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_open = 1;
atomic_int gate_blocked;
atomic_int gate_passed;

void gate_set(int open) {
    pthread_mutex_lock(&gate_mu);
    gate_open = open;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

void gate_pass(void) {
    pthread_mutex_lock(&gate_mu);
    atomic_fetch_add(&gate_blocked, 1);
    while (!gate_open) pthread_cond_wait(&gate_cv, &gate_mu);
    atomic_fetch_sub(&gate_blocked, 1);
    atomic_fetch_add(&gate_passed, 1);
    pthread_mutex_unlock(&gate_mu);
}

typedef struct pending { ps_rpc_call *call; uint64_t id; } pending;
static pthread_mutex_t def_mu = PTHREAD_MUTEX_INITIALIZER;
static pending def_tab[MAX_DEFERRED];
atomic_int def_count;
atomic_int def_total;
atomic_int cancels;
atomic_int cancels_seen_flag;

void def_put(ps_rpc_call *c, uint64_t id) {
    pthread_mutex_lock(&def_mu);
    int i = 0;
    while (i < MAX_DEFERRED && def_tab[i].call) i++;
    PS_ASSERT(i < MAX_DEFERRED);
    def_tab[i] = (pending){c, id};
    atomic_fetch_add(&def_count, 1);
    atomic_fetch_add(&def_total, 1);
    pthread_mutex_unlock(&def_mu);
}

ps_rpc_call *def_take(uint64_t id) {
    ps_rpc_call *c = NULL;
    pthread_mutex_lock(&def_mu);
    for (int i = 0; i < MAX_DEFERRED && !c; i++)
        if (def_tab[i].call && def_tab[i].id == id) {
            c = def_tab[i].call;
            def_tab[i].call = NULL;
            atomic_fetch_sub(&def_count, 1);
        }
    pthread_mutex_unlock(&def_mu);
    return c;
}

int def_has(uint64_t id) {
    int found = 0;
    pthread_mutex_lock(&def_mu);
    for (int i = 0; i < MAX_DEFERRED; i++) found |= def_tab[i].call && def_tab[i].id == id;
    pthread_mutex_unlock(&def_mu);
    return found;
}

int def_cancelled(uint64_t id) {
    int r = -1;
    pthread_mutex_lock(&def_mu);
    for (int i = 0; i < MAX_DEFERRED; i++)
        if (def_tab[i].call && def_tab[i].id == id) r = ps_rpc_call_cancelled(def_tab[i].call);
    pthread_mutex_unlock(&def_mu);
    return r;
}

int def_cancel(ps_rpc_call *call) {
    int found = 0;
    pthread_mutex_lock(&def_mu);
    for (int i = 0; i < MAX_DEFERRED; i++)
        if (def_tab[i].call == call) {
            def_tab[i].call = NULL;
            atomic_fetch_sub(&def_count, 1);
            found = 1;
        }
    pthread_mutex_unlock(&def_mu);
    if (!found) return 0;  /* the normal path took it and completes it */
    if (ps_rpc_call_cancelled(call)) atomic_fetch_add(&cancels_seen_flag, 1);
    return 1;
}
