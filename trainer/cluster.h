/* cluster.h - the trainer's view of the psd servers of a cluster: where
 * each stage lives, one client per server, and batches that span servers.
 *
 * Open from a config: the placement is resolved (common/placement.h, the
 * same answer psd and --check-config get) and one ps_client is dialled per
 * server that hosts a stage (TLS per server: security.ca, the server's
 * servers.<n>.server_name or security.server_name, security.token_file).
 * The single-server form (no servers.* in the config) is a cluster of one
 * server, named by its address.
 *
 * A batch whose stages live on several servers runs under one context id
 * on all of them (ps_cluster_run): the task's function sends its stage
 * calls through ps_cluster_forward / _backward / _push_gradients, which
 * record the servers it touched and the context's gradient norm on each;
 * then every touched server gets Step(ctx) with one grad_scale, each Step
 * settled on its own server, and the partial-step rule of retry.h applies
 * (ps_retry_once_multi): applied on some servers and lost on others =
 * counted, logged, reported to every server (ReportPartial), not re-run.
 *
 * When one server hosts every stage (ps_cluster_single), tasks keep their
 * single-call paths with that server's client.
 *
 * Not thread-safe: one cluster per trainer thread. The config given to
 * ps_cluster_open must outlive the cluster.
 */
#ifndef PS_TRAINER_CLUSTER_H
#define PS_TRAINER_CLUSTER_H

#include <stdint.h>
#include <stdio.h>

#include "config.h"
#include "placement.h"
#include "ps_client.h"
#include "retry.h"
#include "status.h"

typedef struct ps_cluster ps_cluster;

/* Resolve cfg's placement and dial every server it uses (no RPC yet).
 * rank: this trainer's (for ReportPartial); log: where partial steps and
 * report failures are logged (NULL: stderr). */
ps_status ps_cluster_open(const ps_config *cfg, long rank, FILE *log, ps_cluster **out, ps_err *err);
void ps_cluster_free(ps_cluster *c); /* NULL: no-op */

/* Wait up to wait_s seconds for every used server to answer ListParameters;
 * *params receives the parameters of all of them (in server order; a
 * sharded table once per shard, with row_offset / rows_total), model the
 * model's name. INVALID_ARGUMENT when servers serve different models. */
ps_status ps_cluster_connect(ps_cluster *c, double wait_s, ps_wire_param_list *params, char *model,
                             size_t model_len, ps_err *err);

/* The placement lines ("stage conv: ps0 (cpu) at 127.0.0.1:5001"), and, with
 * more than one server, each one's model version (Status), with a warning
 * line when they differ. */
void ps_cluster_print(ps_cluster *c, FILE *f);

const ps_placement *ps_cluster_placement(const ps_cluster *c);
/* The index of the only server every stage lives on, or -1 when the stages
 * span several servers. */
int ps_cluster_single(const ps_cluster *c);
/* Server i's client (NULL when no stage lives there), its name in messages
 * ("ps0", or the address in the single-server form). */
ps_client *ps_cluster_client(const ps_cluster *c, int server);
const char *ps_cluster_name(const ps_cluster *c, int server);
/* The server hosting stage `stage` whole; -1 when sharded or unknown. */
int ps_cluster_stage_server(const ps_cluster *c, const char *stage);
/* Batches that lost their context on some servers but were applied on
 * others (partial steps), and re-runs with nothing applied, so far. */
long ps_cluster_partial_steps(const ps_cluster *c);
long ps_cluster_reruns(const ps_cluster *c);
/* Calls sent again after psd's admission refusals, over every server. */
long ps_cluster_busy_retries(const ps_cluster *c);

/* One batch over several servers (fields read-only for the task except
 * grad_scale). */
typedef struct ps_cluster_batch {
    ps_cluster *cluster;
    uint64_t ctx;                        /* the context id of this run */
    unsigned touched;                    /* bit i: server i holds state of ctx */
    double sq_norm[PS_CONFIG_MAX_SERVERS]; /* the context's gradient norm^2 on each server (latest reply) */
    float grad_scale;                    /* the Steps' StepRequest.grad_scale; the task may set it (1) */
    int has_loss;                        /* the task sets these: the Steps carry the scalar "loss" */
    double loss;
    uint64_t version;                    /* the largest model version its Steps returned */
    ps_multi_result result;              /* how it ended (partial, reruns) */
} ps_cluster_batch;

/* Stage calls of a batch on server `server` (f->ctx / b->ctx are set to the
 * batch's context). They mark the server touched before sending. */
ps_status ps_cluster_forward(ps_cluster_batch *b, int server, ps_client_fwd *f, ps_client_fwd_out *o, ps_err *err);
ps_status ps_cluster_backward(ps_cluster_batch *b, int server, ps_client_bwd *bw, ps_err *err);
ps_status ps_cluster_push_gradients(ps_cluster_batch *b, int server, const ps_wire_named *items, size_t n,
                                    ps_err *err);
/* Sum of sq_norm over the touched servers: the global gradient norm^2. */
double ps_cluster_batch_sq_norm(const ps_cluster_batch *b);

/* A batch's Forwards and Backwards (no Step), run through the calls above. */
typedef ps_status (*ps_cluster_run_fn)(void *arg, ps_cluster_batch *b, ps_err *err);

/* Run the batch until applied (retry.h ps_retry_once_multi): fn under a
 * fresh context, then Step on every touched server. *b (caller's) holds
 * the last run's record. PS_OK also for a partial step (b->result.partial). */
ps_status ps_cluster_run(ps_cluster *c, ps_retry *r, ps_ctx_ids *ids, const char *unit, ps_cluster_run_fn fn,
                         void *arg, ps_cluster_batch *b, ps_err *err);

/* `ps-train status` of a cluster config: every server's Status (name,
 * address, hosted stages, model version, partial steps) on f. Returns 0
 * when every server answered. */
int ps_cluster_print_status(const ps_config *cfg, double timeout_s, FILE *f);

#endif
