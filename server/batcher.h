/* batcher.h - dynamic batching: concurrent calls of one kind are held for a
 * bounded time and handed over together, so that one combined computation
 * serves them (server.batch_wait_ms, server.batch_max_samples; see
 * docs/performance.md, "Many trainers on one GPU").
 *
 * A handler that may combine its call defers it (ps_svc_defer), then
 * submits an item: a key (items with equal keys may run together: same
 * method, run of stages, per-sample shape), its sample count and its own
 * argument. An executor thread of the batcher's takes the oldest item, gathers
 * every held item of its key in arrival order up to max_samples samples,
 * waits while the group is not full - at most until the oldest item has
 * been held max_wait_us - and calls run with the group. run answers every
 * item of the group (the batcher neither inspects nor frees them).
 *
 * An item alone past its wait runs alone: nothing waits longer than
 * max_wait_us for company. One item larger than max_samples runs alone at
 * once. Items of other keys never delay a group: the oldest item of any
 * key is served first, and a full group runs without waiting.
 *
 * Threads: submit from any thread; run is called on the batcher's executor
 * threads (server.batch_executors), each running one group at a time -
 * with several, groups run at once, so that callers in different groups do
 * not wait for each other's computation - never with the batcher's lock
 * held. ps_batcher_free runs what is still held (no waiting) and stops.
 */
#ifndef PS_BATCHER_H
#define PS_BATCHER_H

#include <stdint.h>

#include "status.h"

typedef struct ps_batcher ps_batcher;

typedef struct ps_batch_item {
    uint64_t key;                 /* equal keys may run together */
    int samples;                  /* this item's batch (>= 1) */
    void *arg;                    /* the submitter's */
    /* private */
    int64_t t_in;                 /* when submitted (ns, CLOCK_MONOTONIC) */
    struct ps_batch_item *next;
} ps_batch_item;

/* Run a group (n >= 1 items of one key, in arrival order, their samples
 * summing to at most max_samples unless n == 1); answer every item. */
typedef void (*ps_batch_run_fn)(void *user, ps_batch_item **items, int n);

/* max_wait_us >= 0 (0: only items already held together are combined),
 * max_samples >= 1, executors 1-64 (threads running groups). */
ps_batcher *ps_batcher_create(int64_t max_wait_us, int max_samples, int executors, ps_batch_run_fn run,
                              void *user, ps_err *err);
/* Runs every held item (in groups, without waiting), stops the executor.
 * NULL is a no-op. */
void ps_batcher_free(ps_batcher *b);

/* Hand it over (the batcher owns it until run is given it). */
void ps_batcher_submit(ps_batcher *b, ps_batch_item *it);

/* Totals since creation: groups run, items run, and items that ran with
 * company (in a group of more than one). */
typedef struct ps_batcher_stats {
    uint64_t groups, items, combined;
} ps_batcher_stats;
void ps_batcher_stats_get(ps_batcher *b, ps_batcher_stats *out);

#endif
