/* server_opts.h - the option structs of psd's modules that the
 * configuration fills: the server.* keys of the rpc server (rpc_server.h),
 * the service (service.h), consistency (consistency.h), round metrics
 * (round_metrics.h) and checkpoints (daemon.h), with the enums and name
 * lists of their enum keys.
 *
 * ps_config (config.h) holds these structs by value, so config.c's table
 * writes the fields and psd hands them to their modules as they are. They
 * are defined here, in common/, so that config.h needs nothing from
 * server/: ps-train and every other trainer-side user of the config
 * compiles and links without psd's modules. Each module's header includes
 * this one; what a field means for the module is said here, next to it.
 */
#ifndef PS_SERVER_OPTS_H
#define PS_SERVER_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- consistency (server/consistency.h) --------------------------------- */

/* The modes and their names (server.consistency): X(value, name). The
 * one list; the config's names come from it. */
#define PS_CONS_MODES(X) X(PS_CONS_HOGWILD, "hogwild") X(PS_CONS_SYNC, "sync") X(PS_CONS_SSP, "ssp")
/* How a sync round combines its members' gradients (server.sync_reduce). */
#define PS_SYNC_REDUCES(X) X(PS_SYNC_SUM, "sum") X(PS_SYNC_MEAN, "mean")

#define PS_CONS_ENUM_ROW(value, name) value,
typedef enum { PS_CONS_MODES(PS_CONS_ENUM_ROW) } ps_cons_mode;
typedef enum { PS_SYNC_REDUCES(PS_CONS_ENUM_ROW) } ps_sync_reduce;
#undef PS_CONS_ENUM_ROW

/* The server.* keys of consistency (config.c fills them; docs/config.md). */
typedef struct ps_cons_opts {
    ps_cons_mode mode;          /* server.consistency */
    int sync_workers;           /* server.sync_workers: contexts per round (>= 1) */
    double sync_timeout_s;      /* server.sync_timeout_s: a round open this long closes with whom it has (> 0) */
    ps_sync_reduce sync_reduce; /* server.sync_reduce: average the round's gradients, or sum them */
    int max_staleness;          /* server.max_staleness: steps a rank may run ahead of the slowest active one */
    int ssp_world_size;         /* server.ssp_world_size: ranks must be below this; 0 = any (4096 tracked at once) */
    double active_s;            /* ssp: a rank not seen for this long no longer holds others back
                                   (not a key: the service passes server.context_ttl_s) */
    double idle_s;              /* server.ssp_idle_s: ssp: a rank without a Step this long stops holding the
                                   others back (until it steps); 0 = no limit */
} ps_cons_opts;

/* ---- round metrics (server/round_metrics.h) ----------------------------- */

#define PS_RM_NAME_MAX 32     /* buffer size, incl. NUL */

/* Which statistic of a round the EMA follows (server.metrics_ema_of):
 * X(value, name), the one list of the names. */
#define PS_RM_EMA_OFS(X) X(PS_RM_EMA_MIN, "min") X(PS_RM_EMA_MEAN, "mean") X(PS_RM_EMA_MAX, "max")
#define PS_RM_ENUM_ROW(value, name) value,
typedef enum { PS_RM_EMA_OFS(PS_RM_ENUM_ROW) } ps_rm_ema_of;
#undef PS_RM_ENUM_ROW

/* The server.metrics_* and stop_* keys (config.c fills them). */
typedef struct ps_rmetrics_opts {
    double alpha;              /* server.metrics_ema_alpha: EMA weight of the newest round, (0, 1] */
    ps_rm_ema_of ema_of;       /* server.metrics_ema_of */
    int round_steps;           /* server.metrics_round_steps: hogwild/ssp Steps per round (>= 1) */
    char stop_metric[PS_RM_NAME_MAX]; /* server.stop_metric; "": no stop */
    double stop_threshold;     /* server.stop_threshold: solved when EMA(stop_metric) > this */
} ps_rmetrics_opts;

/* ---- checkpoints (server/daemon.h) --------------------------------------- */

#define PS_CKPT_DIR_MAX 1024

/* The server.checkpoint_* keys (config.c fills them; docs/config.md). */
typedef struct ps_ckpt_opts {
    char dir[PS_CKPT_DIR_MAX]; /* server.checkpoint_dir: "" = no checkpoints */
    int every_steps;           /* server.checkpoint_every_steps: 0 = not by steps */
    double every_s;            /* server.checkpoint_every_s: 0 = not by time */
    int keep;                  /* server.checkpoint_keep: newest checkpoints kept, >= 1 */
} ps_ckpt_opts;

/* ---- the rpc server (server/rpc_server.h) -------------------------------- */

/* The server.* keys of the rpc server are fields here, in the config's
 * units (config.c fills them; docs/config.md, docs/security.md); the rest
 * are set by the caller. Zero means the default where one is given. */
typedef struct ps_rpc_server_opts {
    int threads;            /* server.threads: workers for ordinary methods, >= 1 */
    int reserved_threads;   /* workers for reserved methods; 0 = default (1) */
    int max_calls;          /* server.max_calls: ordinary calls accepted and
                               not finished (queued, in a handler, deferred or
                               sending); 0 = PS_RPC_DEFAULT_MAX_CALLS. The
                               ordinary calls of reader tokens (a token
                               restricted to some methods) count in a cap of
                               their own, max_calls / 2, run by their own
                               reserved_threads workers: readers never take
                               the trainers' calls or workers. */
    int max_reserved_calls; /* same for reserved methods; 0 = default */
    int max_message_bytes;  /* server.max_message_mb: > 0 sets the receive and
                               send limits (gRPC's default is 4 MiB) */
    /* Limits against hostile or careless clients (docs/security.md). A
     * "client" is the caller's token with tokens configured, else its peer
     * host (the address without the port: every connection from a host is
     * one client). */
    int max_calls_per_client;    /* server.max_calls_per_client: ordinary
                                    calls one client may hold at once; 0 =
                                    max_calls / 4 (at least 1). Reserved
                                    calls: the same fraction of
                                    max_reserved_calls (at least 2). Past it:
                                    RESOURCE_EXHAUSTED naming the limit. */
    int max_stalled_per_client;  /* server.max_stalled_per_client: ordinary
                                    calls one client may hold whose request
                                    message has not arrived (all clients
                                    together: max_calls / 4, though a client
                                    holding none may always start one);
                                    0 = PS_RPC_DEFAULT_MAX_STALLED. Past it:
                                    RESOURCE_EXHAUSTED naming the limit.
                                    Whatever the caps, a client that holds
                                    no ordinary call may use the last
                                    max_calls / 8 of the cap (kept for
                                    it), and each connection may hold one
                                    reserved call (a monitor on a busy
                                    client's host is answered). */
    int max_streams_per_connection; /* server.max_streams_per_connection: HTTP/2
                                       SETTINGS_MAX_CONCURRENT_STREAMS;
                                       0 = PS_RPC_DEFAULT_MAX_STREAMS */
    double max_connection_age_s; /* server.max_connection_age_s: > 0: GOAWAY
                                    after this long (clients reconnect); calls
                                    in flight get max_connection_age_grace_ms;
                                    0 = unlimited */
    int max_connection_age_grace_ms;
    int transport_memory_mb;     /* server.transport_memory_mb: gRPC resource
                                    quota for the transport's buffers; 0 = none */
    double recv_timeout_s;       /* server.recv_timeout_s: an accepted call must
                                    deliver its request message within this;
                                    then it is cancelled (DEADLINE_EXCEEDED);
                                    0 = default */
    double send_timeout_s;       /* server.send_timeout_s: a reply the client
                                    does not take (flow control) within this is
                                    cancelled; 0 = default */
    int max_connections_per_client; /* server.max_connections_per_client:
                                    connections one host may hold to the
                                    server's port (counted every second; the
                                    newest past it are closed); 0 =
                                    PS_RPC_DEFAULT_MAX_CONNECTIONS */
    int max_resets_per_s;        /* a connection whose streams end before
                                    their request message more often than
                                    this in one second (HTTP/2 rapid reset)
                                    is closed, and a host whose connections
                                    together do is cut off (all its
                                    connections closed while it goes on);
                                    0 = default */
    int idle_poll_us;            /* server.idle_poll_us: an idle worker polls
                                    for its next call up to this long before
                                    it sleeps (adaptive per worker, see
                                    rpc_server_impl.h); 0 = never polls */
    char local_socket[108];      /* server.local_socket: the local transport's
                                    unix socket (common/rpc_local.h); "" = none */
    bool profile;                /* time every call's phases (prof.h),
                                    read with ps_rpc_server_phases */
} ps_rpc_server_opts;

/* ---- the service (server/service.h) ------------------------------------- */

/* server.nonfinite_policy: X(value, name), the one list of the names. */
#define PS_NONFINITE_POLICIES(X) X(PS_NONFINITE_REJECT, "reject") X(PS_NONFINITE_SKIP, "skip")
#define PS_NONFINITE_ENUM_ROW(value, name) value,
typedef enum { PS_NONFINITE_POLICIES(PS_NONFINITE_ENUM_ROW) } ps_nonfinite_policy;
#undef PS_NONFINITE_ENUM_ROW

#define PS_SERVICE_NAME_MAX 32

/* The service's server.* keys are fields here (config.c fills them;
 * docs/config.md); the last few are set by the caller. */
typedef struct ps_service_opts {
    double context_ttl_s;     /* server.context_ttl_s: an idle context expires */
    int max_message_bytes;    /* server.max_message_mb: the largest tensor a request carries */
    ps_nonfinite_policy nonfinite_policy; /* server.nonfinite_policy: reject NaN/Inf
                                 (INVALID_ARGUMENT) or skip the step */
    double settle_window_s;   /* server.settle_window_s: repeated Steps answered this long (0: 600 s) */
    int max_finished;         /* server.max_finished: ... for at most this many contexts (0: 1 << 20) */
    uint64_t max_context_bytes; /* server.max_context_bytes: live contexts' bytes, shared
                                 fairly per client; 0 = unlimited */
    double health_saturated_s; /* server.health_saturated_s: health says NOT_SERVING after
                                 every ordinary call was refused this long; 0 = never */
    double batch_wait_ms;     /* server.batch_wait_ms: a training Forward waits up to this long
                                 for concurrent ones of the same stages to be computed with
                                 (0 = off; svc_batch.c) */
    int batch_max_samples;    /* server.batch_max_samples: samples computed together at most */
    int batch_executors;      /* server.batch_executors: groups computed at once (each of the Forward
                                 and Backward batchers' threads; 0: 1) */
    int batch_backward;       /* server.batch_backward: training Backwards are batched too
                                 (with batch_wait_ms > 0) */
    ps_cons_opts cons;        /* server.consistency and its keys (above) */
    ps_rmetrics_opts round_metrics; /* server.metrics_* and stop_* (above; alpha 0:
                                 0.05, round_steps 0: 1) */
    char cluster[PS_SERVICE_NAME_MAX];     /* cluster.name (ListParameters, Status) */
    char server_name[PS_SERVICE_NAME_MAX]; /* servers.<name> this psd is; "" = the single-server
                                 form (ps_config_select_server sets it) */
    /* Not keys: set by the caller. */
    size_t max_contexts;      /* live contexts; 0: 4096 */
    const char *optimizer;    /* reported by Status ("sgd"); NULL: "sgd" */
    const char *(*cpu_isa)(void); /* reported by Status; NULL: "" */
} ps_service_opts;

#endif
