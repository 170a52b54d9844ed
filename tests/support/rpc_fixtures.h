/* rpc_fixtures.h - what the rpc layer's tests (test_rpc over gRPC,
 * test_rpc_local over the local transport) share: a sleep, a wait for an
 * event with a give-up, a gate handlers block in until the test opens it,
 * and the table of deferred calls a test completes or sees cancelled (as
 * psd's sync rounds keep theirs). */
#ifndef PS_TEST_RPC_FIXTURES_H
#define PS_TEST_RPC_FIXTURES_H

#include <stdatomic.h>
#include <stdint.h>

#include "clock.h"
#include "rpc_server.h"

void sleep_ms(int ms);

/* Poll cond every 2 ms until it holds or ms pass; its final value. */
#define WAIT_UNTIL(cond, ms) __extension__({ \
    double until_ = (ps_mono_s() * 1e3) + (ms); \
    while (!(cond) && (ps_mono_s() * 1e3) < until_) sleep_ms(2); \
    (cond); })

/* ---- the gate (open at the start) ---- */
extern atomic_int gate_blocked;  /* handlers waiting in it now */
extern atomic_int gate_passed;   /* handlers that went through */
void gate_set(int open);
/* A handler's wait: returns once the gate is open. */
void gate_pass(void);

/* ---- deferred calls ---- */
#define MAX_DEFERRED 256
extern atomic_int def_count;          /* handles in the table */
extern atomic_int def_total;          /* calls deferred so far */
extern atomic_int cancels;            /* on_cancel calls that found their handle (theirs to count,
                                         once they completed it) */
extern atomic_int cancels_seen_flag;  /* ... of which ps_rpc_call_cancelled() said 1 */
/* A deferred call c under the test's id (the table holds MAX_DEFERRED). */
void def_put(ps_rpc_call *c, uint64_t id);
/* Whoever removes a handle from the table completes it: the call of id,
 * removed (NULL: none). */
ps_rpc_call *def_take(uint64_t id);
int def_has(uint64_t id);
/* ps_rpc_call_cancelled of the pending call id (-1: not in the table). */
int def_cancelled(uint64_t id);
/* on_cancel's half: remove call from the table (counting
 * cancels_seen_flag); 1 when it was there (on_cancel completes it, then
 * counts cancels), 0 when the normal path took it first (and completes
 * it). */
int def_cancel(ps_rpc_call *call);

#endif
