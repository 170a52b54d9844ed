/* task.h - what ps-train trains: a table of tasks behind one CLI.
 *
 * `ps-train [TASK] [options]`: TASK names a row of the task table (tasks.c,
 * the one place that knows which tasks exist; default "mnist"). The driver
 * (ps_train.c) owns what every task shares: config file and common flags,
 * TLS, the connections to the psd servers (cluster.h) and waiting for them, psd's parameter list, the
 * retry policy and context ids, epochs, progress lines and the summary. A
 * task owns its data, its flags, what one round sends to psd, and its
 * evaluation.
 *
 * A round is the unit of work that ends with one optimizer step, run under
 * one context id (with ps_retry_once, retry.h, so its step is applied once):
 *  - mnist: one batch - Forward, local NLL loss, Backward, Step;
 *  - cartpole: one episode - act with Forwards under one context, then
 *    Backward of the returns, Step;
 *  - fit: one batch of any model psd hosts - Forward through its stages,
 *    a loss from the table here, Backward, Step (task_fit.c);
 *  - lm: one BPTT window - Forward the embedding, run the local LSTM,
 *    Forward the decoder (with the targets: psd's loss), Backward the
 *    embedding, PushGradients of the LSTM, Step (task_lm.c).
 *
 * Lifecycle, on one thread:
 *   create -> set_flag (task flags without a config key) -> init (config
 *   final, not connected: load and check the data) -> for each epoch:
 *   begin_epoch, run_round x rounds, end_epoch -> evaluate -> destroy.
 * Functions return a ps_status with the message in err; the driver prints
 * it and exits 1.
 *
 * Adding a task: a task_<name>.c defining a `const ps_task ps_task_<name>`,
 * and its row in tasks.c.
 */
#ifndef PS_TRAINER_TASK_H
#define PS_TRAINER_TASK_H

#include <stdint.h>

#include "config.h"
#include "ps_client.h"
#include "retry.h"
#include "status.h"

/* A task's command-line flag. */
typedef struct ps_task_flag {
    const char *lng, *shrt; /* "--data", "-d" (shrt may be NULL) */
    const char *arg;        /* the value's name in --help ("DIR"); NULL: a switch, no value */
    const char *key;        /* config key the value sets through ps_config_set (a switch
                               sets "true"); NULL: passed to the task's set_flag */
    const char *help;
} ps_task_flag;

#define PS_ONE_CALL_ASKED 1
#define PS_ONE_CALL_DEFAULT 2

/* What the driver gives a task. */
typedef struct ps_task_env {
    const ps_config *cfg;   /* final: defaults, file, then flags */
    long rank;              /* 1..world_size-1 */
    int world_size;         /* the PS plus the trainers */
    int fuse_step;          /* --fuse-step: Backward and Step as one RPC */
    int one_call;           /* one RPC a batch (Forward with targets and step=true) where the task
                               can: PS_ONE_CALL_ASKED (--one-call: say once when it cannot apply),
                               PS_ONE_CALL_DEFAULT (neither --split-calls nor --fuse-step given:
                               silently the split calls where it cannot), 0 (the split calls) */
    int no_eval;            /* --no-eval: the task evaluates nothing (benchmarks); end_epoch still runs and
                               reports the epoch's training figures */
    /* Set once connected; NULL in init. */
    struct ps_cluster *cluster;       /* every server of the config (cluster.h) */
    ps_client *cl;                    /* the server hosting every stage; NULL when the stages span
                                         several servers (then calls go through cluster) */
    const char *model;                /* the model psd serves */
    const ps_wire_param_list *params; /* its parameters (ListParameters) */
    ps_retry *retry;                  /* the trainer's retry policy and counters */
    ps_ctx_ids *ids;                  /* fresh context ids */
} ps_task_env;

/* What one round did, for progress lines and the summary. */
typedef struct ps_task_round {
    double loss;
    long samples;           /* samples (or environment steps) it trained on */
    uint64_t version;       /* psd's model version after its step */
    int printed;            /* the task printed its own progress line: the driver prints none */
    int stop;               /* the task is done (e.g. psd says it is solved): no further rounds */
} ps_task_round;

typedef struct ps_task {
    const char *name;        /* "mnist" */
    const char *description; /* one line for --help */
    const char *unit;        /* a round in progress lines: "batch" ("training batch 3 loss ...") */
    const ps_task_flag *flags; /* ends with an all-zero row */

    /* A zeroed state; NULL when out of memory. */
    void *(*create)(void);
    /* A flag of this task whose row has no key; may be NULL if none. */
    ps_status (*set_flag)(void *t, const char *flag, const char *value, ps_err *err);
    /* Load and check the data (env->cl is NULL: nothing is sent yet). */
    ps_status (*init)(void *t, const ps_task_env *env, ps_err *err);
    /* Prepare epoch (0-based, e.g. shuffle); *rounds = its number of rounds. */
    ps_status (*begin_epoch)(void *t, const ps_task_env *env, int epoch, int *rounds, ps_err *err);
    /* Round `round` of the epoch, its step applied once. */
    ps_status (*run_round)(void *t, const ps_task_env *env, int epoch, int round, ps_task_round *out,
                           ps_err *err);
    /* After epoch's rounds (the epoch's training loss; held-out loss and
     * accuracy, say, unless env->no_eval); may be NULL. */
    ps_status (*end_epoch)(void *t, const ps_task_env *env, int epoch, ps_err *err);
    /* Evaluate psd's current weights and print the result lines. */
    ps_status (*evaluate)(void *t, const ps_task_env *env, ps_err *err);
    /* Free everything; NULL is a no-op. */
    void (*destroy)(void *t);
} ps_task;

/* The table (tasks.c). */
const ps_task *ps_task_find(const char *name); /* NULL when unknown */
const ps_task *ps_task_default(void);
int ps_task_count(void);
const ps_task *ps_task_at(int i);

#endif
