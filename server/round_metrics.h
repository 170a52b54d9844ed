/* round_metrics.h - named scalars that trainers attach to Step (episode
 * reward, loss, tokens), aggregated per round.
 *
 * A round is a sync round (all of its members' scalars, closed when the
 * round is applied) or, under hogwild and ssp, every `round_steps` Steps.
 * For each name that appeared in a round the report holds the count, min,
 * mean and max of its values in that round and an exponential moving
 * average across rounds: ema = alpha * x + (1 - alpha) * ema, where x is
 * the round's min, mean or max (ema_of) and the first round's x starts it.
 * With a stop metric configured, the report is `solved` from the first
 * round whose EMA of that metric exceeds the threshold on (sticky: it
 * stays solved) - the tutorial's "running reward > 475".
 *
 * At most PS_RM_MAX_NAMES names are tracked, for good. The configured stop
 * metric's name is reserved from the start; every other name is taken by
 * the first Step that brings it (ps_rmetrics_admit), at most
 * PS_RM_NAMES_PER_CLIENT per client (token, or host), and a Step bringing a
 * name no slot is left for, or past its client's share, is refused before
 * anything applies - so junk names cannot push the stop metric out.
 * Names are 1..31 characters of [A-Za-z0-9_.-].
 * Thread-safe; knows neither gRPC nor the model.
 */
#ifndef PS_ROUND_METRICS_H
#define PS_ROUND_METRICS_H

#include <stdint.h>

#include "server_opts.h"
#include "status.h"

#define PS_RM_MAX_SCALARS 8   /* scalars one Step carries (proto/ps.options) */
#define PS_RM_MAX_NAMES 8     /* names tracked; also the report's capacity */
#define PS_RM_NAMES_PER_CLIENT 4  /* names one client may bring in */

/* PS_RM_NAME_MAX, ps_rm_ema_of and ps_rmetrics_opts (the server.metrics_*
 * and stop_* keys) are in server_opts.h. */

typedef struct ps_scalar {
    char name[PS_RM_NAME_MAX];
    double value;
} ps_scalar;

/* A list of one Step's scalars. */
typedef struct ps_scalar_set {
    int n;
    ps_scalar s[PS_RM_MAX_SCALARS];
} ps_scalar_set;

typedef struct ps_round_stat {
    char name[PS_RM_NAME_MAX];
    uint32_t count;
    double min, mean, max, ema;
} ps_round_stat;

typedef struct ps_round_report {
    uint64_t round;            /* metrics rounds closed so far (0: none yet) */
    int n;
    ps_round_stat s[PS_RM_MAX_NAMES];
    int solved;
} ps_round_report;


typedef struct ps_rmetrics ps_rmetrics;

ps_rmetrics *ps_rmetrics_create(const ps_rmetrics_opts *o, ps_err *err);
void ps_rmetrics_free(ps_rmetrics *m);   /* NULL ok */

/* The scalar names the shipped trainers report in their Steps: "reward" and
 * "loss" (ps-train cartpole, trainer/task_cartpole.c, and
 * examples/reinforce_observer.py), "loss" (ps-train mnist, lm and cluster
 * runs). The one list: psd warns about a server.stop_metric not in it (a
 * user's trainer may report its own names, so only a warning). NULL-ended. */
const char *const *ps_rmetrics_shipped_names(void);
int ps_rmetrics_is_shipped_name(const char *name);

/* Validate what a peer sent: names well-formed and distinct, values
 * finite. INVALID_ARGUMENT naming the scalar otherwise. */
ps_status ps_scalar_set_check(const ps_scalar_set *set, ps_err *err);

/* Admit the names of a Step's scalars (checked) from client owner (NULL =
 * ""): names already tracked, or new ones while slots are left and owner
 * has brought fewer than PS_RM_NAMES_PER_CLIENT; the new ones are taken
 * then. INVALID_ARGUMENT naming the scalar otherwise (nothing taken). */
ps_status ps_rmetrics_admit(ps_rmetrics *m, const ps_scalar_set *set, const char *owner, ps_err *err);

/* Close one sync round from its members' scalar sets (NULL entries are
 * members without scalars) and report it. */
void ps_rmetrics_close_round(ps_rmetrics *m, const ps_scalar_set *const *sets, int n, ps_round_report *out);
/* hogwild/ssp: add one Step's scalars (set may be NULL); every
 * round_steps-th call closes a round. *out = the newest closed round (its
 * round is 0 before the first closes). */
void ps_rmetrics_add_step(ps_rmetrics *m, const ps_scalar_set *set, ps_round_report *out);
/* The newest closed round. */
void ps_rmetrics_latest(ps_rmetrics *m, ps_round_report *out);

#endif
