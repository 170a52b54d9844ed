/* trainers.h - what psd sees of each trainer, for the dashboard: per
 * trainer rank its first and last call, training samples, Forwards,
 * retries as psd sees them (a replayed Forward: a retry answered from the
 * context's record; a repeated Step: a retry answered with the version the
 * first one produced), Steps applied, partial steps it reported, and the
 * last loss it reported (psd's fused loss of its Forward, else the `loss`
 * scalar of its Step).
 *
 * It also sums, for the dashboard's history, what arrived since the last
 * ps_trainers_take: psd's fused losses, and every Step scalar by name.
 *
 * Ranks are what clients claim (trainer_rank); ranks >= PS_TRAINERS_MAX_RANK
 * are counted in one row of rank -1 ("other"). A repeated Step carries no
 * rank: it is attributed through a small cache of recently stepped context
 * ids, and to "other" when the id has left it. Totals are exact.
 *
 * Thread-safe (one mutex, O(1) per call). Every function takes t == NULL as
 * a no-op, so the service calls them whether or not a dashboard is on.
 */
#ifndef PS_TRAINERS_H
#define PS_TRAINERS_H

#include <stdint.h>

#include "round_metrics.h"

#define PS_TRAINERS_MAX_RANK 1024

typedef struct ps_trainers ps_trainers;

typedef struct ps_trainer_row {
    int rank;                 /* -1: ranks beyond PS_TRAINERS_MAX_RANK and unattributed repeats */
    double first_seen, last_seen; /* Unix seconds */
    uint64_t samples, forwards, replayed;
    uint64_t steps, repeated_steps;
    uint64_t partial_applied, partial_lost;
    double loss;              /* NaN before the first */
} ps_trainer_row;

/* What arrived since the previous take. */
typedef struct ps_trainers_delta {
    double fused_loss_sum;
    uint64_t fused_loss_n;
    uint64_t fused_tokens_n;  /* of those, losses over token sequences (targets of 2+ dims: a language model) */
    int n;                    /* scalar names */
    struct {
        char name[PS_RM_NAME_MAX];
        double sum;
        uint64_t count;
    } s[PS_RM_MAX_NAMES];
} ps_trainers_delta;

ps_trainers *ps_trainers_create(void);   /* NULL when out of memory */
void ps_trainers_free(ps_trainers *t);   /* NULL ok */

/* A training Forward of n samples by rank; replayed: answered from the
 * record; loss: psd's fused loss, NaN when it computed none; tokens: its
 * targets were token sequences (2+ dims, the LM's decoder), not one class
 * per sample (a classifier's one call a batch). */
void ps_trainers_forward(ps_trainers *t, uint32_t rank, int64_t n, int replayed, double loss, int tokens);
/* Context ctx_id of rank stepped (applied or skipped) with these scalars
 * (may be NULL). */
void ps_trainers_step(ps_trainers *t, uint32_t rank, uint64_t ctx_id, const ps_scalar_set *scalars);
/* A Step of the finished context ctx_id answered again. */
void ps_trainers_step_repeated(ps_trainers *t, uint64_t ctx_id);
/* ReportPartial from rank: this server applied the batch (applied = 1) or
 * lost it (0). */
void ps_trainers_partial(ps_trainers *t, uint32_t rank, int applied);

/* The rows (at most cap, in rank order, "other" last when it has
 * anything); returns how many there are in all. */
int ps_trainers_rows(ps_trainers *t, ps_trainer_row *rows, int cap);
/* The sums since the previous call; they start again at zero. */
void ps_trainers_take(ps_trainers *t, ps_trainers_delta *out);

#endif
