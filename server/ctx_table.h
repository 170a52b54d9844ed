/* ctx_table.h - the request contexts psd keeps between a trainer's RPCs
 * (PyTorch's distributed-autograd contexts).
 *
 * A context is opened by the first Forward(train) under the id the trainer
 * chose and records every Forward made under it, by sequence number: its
 * tape (activations for the backward pass). Backward covers recorded
 * forwards and accumulates parameter gradients into the context's gradient
 * accumulator (opaque here: a ps_grads of the model, freed with the
 * grads_free callback); a forward's tape is released once it has been
 * backwarded. Step applies the accumulated gradients once and finishes the
 * context. Contexts idle for longer than the TTL (a trainer that vanished)
 * are expired by ps_ctx_table_expire.
 *
 * Concurrency: the table has one mutex. An RPC works on a context between
 * ps_ctx_table_open/_acquire and _release/_finish; meanwhile the context is
 * busy: a second RPC on it gets UNAVAILABLE "in use" (nothing is decided
 * yet: ask again later - a Step waiting in its sync round is busy) and the
 * expiry skips it, so a tape is never freed under a running computation.
 * The fields of a busy context belong to the RPC holding it.
 *
 * Finished contexts are remembered by time: for settle_window_s after their
 * Step (and at most max_finished of them), a repeated Step is answered with
 * what its step did - the version it produced, skipped, or dropped from a
 * sync round - instead of a second update (steps are idempotent). Past that
 * window the id is kept in a compact filter, and a Step for it is answered
 * ALREADY_EXISTS "too old to settle": the batch was applied once and must
 * not be re-run. (The filter can, rarely, take a never-used id for an old
 * one; it errs on the side of not re-running.)
 *
 * Checkpoints keep the records (ps_ctx_table_export / _import) so that a
 * restarted psd answers for the steps its weights hold. For the records to
 * match a weights snapshot exactly, every step holds the table's apply lock
 * shared from before its optimizer update until its record is written
 * (ps_ctx_table_apply_begin/_end), and a checkpoint takes its snapshot under
 * the lock held exclusively (ps_ctx_table_freeze/_thaw): no step is then
 * between its update and its record.
 *
 * Memory: each context carries `bytes` (tapes + gradients) that the caller
 * keeps up to date with ps_ctx_table_account; the table sums them
 * (ps_ctx_stats.bytes) so limits and metrics can read one number.
 *
 * Fair shares: every context belongs to an owner (the caller's token name,
 * or its peer host without tokens; never what a client claims about
 * itself). With max_bytes set, ps_ctx_table_reserve admits bytes while the
 * total stays within max_bytes; past it, an owner within its fair share
 * (max_bytes / owners holding contexts) gets room by evicting the least
 * recently used idle contexts of the owner furthest over its share, and an
 * owner over its share is refused (RESOURCE_EXHAUSTED). The count limit
 * max_live is shared the same way. So one client filling the table cannot
 * lock the others out until its contexts expire.
 */
#ifndef PS_CTX_TABLE_H
#define PS_CTX_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

typedef struct ps_ctx_table ps_ctx_table;

/* One recorded Forward. */
typedef struct ps_ctx_fwd {
    uint32_t seq;
    int backwarded;         /* its Backward ran: tape released */
    ps_tape *tape;          /* owned until backwarded; NULL after */
    uint64_t version;       /* weights version the forward used */
    size_t bytes;           /* tape bytes, for accounting */
} ps_ctx_fwd;

/* The admission hint (ps_err.retry_after_ms) of a refusal for a client's
 * share of contexts or their memory: contexts end at their Step, a batch
 * or so later. */
#define PS_CTX_RETRY_AFTER_MS 200

typedef struct ps_ctx {
    uint64_t id;
    uint32_t rank;
    ps_ctx_fwd *fwd;        /* recorded forwards, in arrival order */
    size_t nfwd;
    void *grads;            /* accumulated parameter gradients (ps_grads); NULL before a Backward */
    int nonfinite;          /* a NaN/Inf reached this context: its step is not applied */
    uint64_t round;         /* consistency "sync": the round the context belongs to */
    int pushed;             /* a PushGradients was added (a repeat is not added again) */
    size_t bytes;           /* tapes + gradients held (ps_ctx_table_account) */
    /* private */
    size_t reserved;        /* admitted by ps_ctx_table_reserve, not yet accounted */
    struct ctx_owner *own;
    size_t cap;
    double last_used;
    int busy;
    int discard;            /* released by its owner while busy: freed when the call holding it releases it */
    struct ps_ctx *next;
} ps_ctx;

typedef struct ps_ctx_stats {
    uint64_t live;
    uint64_t expired;       /* total since start */
    uint64_t opened;        /* total since start */
    uint64_t trainers_seen; /* distinct ranks */
    uint64_t bytes;         /* sum of live contexts' bytes */
    uint64_t finished_kept; /* finished ids remembered for repeated Steps */
    uint64_t evicted;       /* total since start: freed to make room for another owner */
    uint64_t refused;       /* total since start: reservations/opens refused for memory or count */
    uint64_t owners;        /* owners holding contexts now */
    uint64_t applied;       /* total: contexts whose step reached the weights (kept by checkpoints) */
    uint64_t released;      /* total since start: contexts their owner released unstepped (ps_ctx_table_discard_as) */
} ps_ctx_stats;

/* What a finished context's step did. */
typedef enum {
    PS_CTX_APPLIED = 0,     /* its gradients reached the weights */
    PS_CTX_SKIPPED = 1,     /* not applied: non-finite values (server.nonfinite_policy skip) */
    PS_CTX_DROPPED = 2,     /* not applied: its sync round closed without it */
} ps_ctx_fin_how;

/* One finished context, as a checkpoint keeps it. */
typedef struct ps_ctx_finished {
    uint64_t id;
    uint64_t version;       /* the model version its step produced (or the version when it finished) */
    int how;                /* ps_ctx_fin_how */
} ps_ctx_finished;

typedef struct ps_ctx_table_opts {
    double ttl_s;           /* idle time after which a context expires */
    size_t max_live;        /* contexts held at once before new ones are refused */
    double settle_window_s; /* finished contexts answer repeated Steps this long (0: 600 s) */
    size_t max_finished;    /* and at most this many (0: 1 << 20) */
    void (*grads_free)(void *grads); /* frees ps_ctx.grads; NULL: free() */
    size_t max_bytes;       /* live contexts' bytes, shared fairly by owners; 0 = unlimited */
} ps_ctx_table_opts;

ps_ctx_table *ps_ctx_table_create(const ps_ctx_table_opts *opts);
void ps_ctx_table_free(ps_ctx_table *t);   /* frees every tape; NULL ok */

/* For a training Forward: the live context id (marked busy), or a new empty
 * one (busy, no forwards). ALREADY_EXISTS when id belongs to a finished
 * context; RESOURCE_EXHAUSTED past max_live; UNAVAILABLE when busy.
 * *created (may be NULL) says whether it is new; a new context that gets no
 * forward is removed again by ps_ctx_table_release. */
ps_ctx *ps_ctx_table_open(ps_ctx_table *t, uint64_t id, uint32_t rank, int *created, ps_err *err);
/* The same for an owner (see "Fair shares"; NULL or "" = one anonymous
 * owner). A live context opened by another owner is FAILED_PRECONDITION:
 * one client cannot add to or read another's context. */
ps_ctx *ps_ctx_table_open_as(ps_ctx_table *t, uint64_t id, uint32_t rank, const char *owner, int *created,
                             ps_err *err);
/* Admit `more` bytes for busy context c (before computing them): OK, or
 * RESOURCE_EXHAUSTED naming the budget and the owner's share. May evict idle
 * contexts of owners over their share. The reservation counts in the total
 * until the next ps_ctx_table_account / ps_ctx_add_fwd of c (which set its
 * real bytes) or its release. */
ps_status ps_ctx_table_reserve(ps_ctx_table *t, ps_ctx *c, size_t more, ps_err *err);

/* Finds a live context and marks it busy. NOT_FOUND (unknown or expired),
 * UNAVAILABLE (another RPC is using it), ALREADY_EXISTS (finished too long
 * ago to settle; *finished = 2 then). When the id belongs to a recently finished
 * context, *finished = 1, *finished_version (if not NULL) receives the model
 * version its step produced, and NOT_FOUND is returned. */
ps_ctx *ps_ctx_table_acquire(ps_ctx_table *t, uint64_t id, int *finished,
                             uint64_t *finished_version, ps_err *err);
/* The same for the client `owner` (as ps_ctx_table_open_as; NULL = no
 * check): a live context opened by another owner is PERMISSION_DENIED, so
 * no client can backward, step or read another's context. */
ps_ctx *ps_ctx_table_acquire_as(ps_ctx_table *t, uint64_t id, const char *owner, int *finished,
                                uint64_t *finished_version, ps_err *err);

/* The record of forward seq in c, or NULL. */
ps_ctx_fwd *ps_ctx_find_fwd(ps_ctx *c, uint32_t seq);
/* Record a forward (c busy, seq not yet recorded): the context owns tape
 * from now on. RESOURCE_EXHAUSTED when out of memory (tape stays the
 * caller's). */
ps_status ps_ctx_add_fwd(ps_ctx_table *t, ps_ctx *c, uint32_t seq, ps_tape *tape, uint64_t version,
                         size_t bytes, ps_err *err);
/* Mark forward f backwarded and free its tape. */
void ps_ctx_fwd_done(ps_ctx_table *t, ps_ctx *c, ps_ctx_fwd *f);
/* Number of recorded forwards not yet backwarded; *first_seq (may be NULL)
 * gets the first such sequence number. */
size_t ps_ctx_pending(const ps_ctx *c, uint32_t *first_seq);
/* Set c->bytes (c busy) and the table's total accordingly. */
void ps_ctx_table_account(ps_ctx_table *t, ps_ctx *c, size_t bytes);

/* Ends an RPC's use of the context, which stays (unless it has no forward,
 * or its owner released it meanwhile: ps_ctx_table_discard_as) - so c may
 * be freed: the caller must not touch it afterwards. */
void ps_ctx_table_release(ps_ctx_table *t, ps_ctx *c);

/* What ps_ctx_table_discard_as did. */
typedef enum {
    PS_CTX_DISCARD_NONE = 0,     /* no live context of that id: unknown, expired or finished (its record kept) */
    PS_CTX_DISCARD_FREED = 1,    /* freed now */
    PS_CTX_DISCARD_PENDING = 2,  /* a call holds it: freed when that call releases it (a Step that finishes it
                                    first wins) */
} ps_ctx_discard_how;
/* The owner abandons live context id without stepping it (ReleaseContext:
 * its trainer runs the unit again under a fresh id): its tapes and
 * gradients are freed at once instead of after the TTL, so they no longer
 * count against the owner's share; nothing is applied and no finished
 * record is made (a later call of id finds it unknown: NOT_FOUND). A
 * finished context's record is never touched. Returns the
 * ps_ctx_discard_how, or -1 with PERMISSION_DENIED in err when another
 * owner opened it (owner NULL = no check). */
int ps_ctx_table_discard_as(ps_ctx_table *t, uint64_t id, const char *owner, ps_err *err);

/* Removes the context and frees its tapes and gradients; remembers it as
 * finished with the given version (the result of its step): applied, or
 * skipped when c->nonfinite. */
void ps_ctx_table_finish(ps_ctx_table *t, ps_ctx *c, uint64_t version);
/* The same, saying what its step did (PS_CTX_DROPPED: a sync straggler). */
void ps_ctx_table_finish_as(ps_ctx_table *t, ps_ctx *c, uint64_t version, ps_ctx_fin_how how);

/* Expires contexts idle for longer than the TTL and forgets finished ids
 * older than the settle window; returns how many contexts expired. */
size_t ps_ctx_table_expire(ps_ctx_table *t);

/* 1 if the recently finished context id had its step skipped (a NaN/Inf
 * reached it), so a repeated Step can say so too. */
int ps_ctx_table_finished_skipped(ps_ctx_table *t, uint64_t id);
/* What the recently finished context id's step did (ps_ctx_fin_how); -1
 * when it is not remembered. */
int ps_ctx_table_finished_how(ps_ctx_table *t, uint64_t id);
/* 1 when this table applied context id's step as far as it knows: a
 * recent record that says so, or an id finished too long ago to tell (the
 * filter); 0 otherwise (unknown, live, skipped or dropped). */
int ps_ctx_table_applied(ps_ctx_table *t, uint64_t id);

/* A step's optimizer update and its record (ps_ctx_table_finish*) happen
 * between apply_begin and apply_end (a shared lock; many steps at once). */
void ps_ctx_table_apply_begin(ps_ctx_table *t);
void ps_ctx_table_apply_end(ps_ctx_table *t);
/* A checkpoint's weights snapshot: between freeze and thaw no step is
 * between its update and its record. Not while holding apply_begin. */
void ps_ctx_table_freeze(ps_ctx_table *t);
void ps_ctx_table_thaw(ps_ctx_table *t);

/* The finished records of steps that produced a version <= max_version (at
 * most max_records, the newest; oldest first) in a malloc'ed *out, and the
 * applied count; returns how many. Call it frozen, right after the
 * snapshot of version max_version. */
size_t ps_ctx_table_export(ps_ctx_table *t, uint64_t max_version, size_t max_records, ps_ctx_finished **out,
                           uint64_t *applied);
/* Remember records from a checkpoint (a fresh settle window starts for
 * them) and set the applied count. At start-up, before serving. */
void ps_ctx_table_import(ps_ctx_table *t, const ps_ctx_finished *r, size_t n, uint64_t applied);

/* Notes that a trainer of this rank was seen. */
void ps_ctx_table_note_rank(ps_ctx_table *t, uint32_t rank);

void ps_ctx_table_stats(ps_ctx_table *t, ps_ctx_stats *out);

#endif
