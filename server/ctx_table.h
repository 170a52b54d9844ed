/* ctx_table.h - the request contexts psd keeps between a trainer's RPCs
 * (PyTorch's distributed-autograd contexts).
 *
 * A context is opened by Forward(train) under the id the trainer chose and
 * holds the model tape (activations, then gradients). Backward, GetGradients
 * and Step look it up; Step frees it. Contexts idle for longer than the TTL
 * (a trainer that vanished) are expired by ps_ctx_table_expire.
 *
 * Concurrency: the table has one mutex. An RPC works on a context between
 * ps_ctx_table_acquire and _release/_finish; meanwhile the context is busy:
 * a second RPC on it gets FAILED_PRECONDITION and the expiry skips it, so a
 * tape is never freed under a running computation.
 *
 * Finished ids are remembered (a bounded ring) so a repeated Step of the
 * same context is answered with the version of the step that was applied,
 * instead of NOT_FOUND or a second update: steps are idempotent.
 */
#ifndef PS_CTX_TABLE_H
#define PS_CTX_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

typedef struct ps_ctx_table ps_ctx_table;

typedef enum { PS_CTX_FORWARDED = 0, PS_CTX_BACKWARDED = 1 } ps_ctx_state;

typedef struct ps_ctx {
    uint64_t id;
    uint32_t rank;
    ps_ctx_state state;
    ps_tape *tape;          /* owned */
    int nonfinite;          /* a NaN/Inf reached this context: its step is not applied */
    /* private */
    double last_used;
    int busy;
    struct ps_ctx *next;
} ps_ctx;

typedef struct ps_ctx_stats {
    uint64_t live;
    uint64_t expired;       /* total since start */
    uint64_t opened;        /* total since start */
    uint64_t trainers_seen; /* distinct ranks */
} ps_ctx_stats;

/* ttl_s: idle time after which a context expires. max_live: contexts held
 * at once before new ones are refused (RESOURCE_EXHAUSTED). */
ps_ctx_table *ps_ctx_table_create(double ttl_s, size_t max_live);
void ps_ctx_table_free(ps_ctx_table *t);   /* frees every tape; NULL ok */

/* Adds a context that owns tape, busy=0. ALREADY_EXISTS if the id is live
 * or was recently finished; on error the caller keeps the tape. */
ps_status ps_ctx_table_insert(ps_ctx_table *t, uint64_t id, uint32_t rank, ps_tape *tape, ps_err *err);

/* Finds a live context and marks it busy. NOT_FOUND (unknown or expired),
 * FAILED_PRECONDITION (another RPC is using it). When the id belongs to a
 * recently finished context, *finished_version (if not NULL) receives the
 * model version its step produced and NOT_FOUND is returned with
 * *finished = 1. */
ps_ctx *ps_ctx_table_acquire(ps_ctx_table *t, uint64_t id, int *finished,
                             uint64_t *finished_version, ps_err *err);

/* Ends an RPC's use of the context, which stays. */
void ps_ctx_table_release(ps_ctx_table *t, ps_ctx *c);

/* Removes the context and frees its tape; remembers it as finished with
 * the given version (the result of its step) for repeated Steps. */
void ps_ctx_table_finish(ps_ctx_table *t, ps_ctx *c, uint64_t version);

/* Expires contexts idle for longer than the TTL; returns how many. */
size_t ps_ctx_table_expire(ps_ctx_table *t);

/* Notes that a trainer of this rank was seen. */
void ps_ctx_table_note_rank(ps_ctx_table *t, uint32_t rank);

void ps_ctx_table_stats(ps_ctx_table *t, ps_ctx_stats *out);

#endif
