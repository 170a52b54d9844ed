/* rpc_server.h - psd's gRPC server over the gRPC core C API (1.51): unary
 * calls dispatched on the method path to handlers, with admission control
 * and limits against hostile clients. The shared half (status mapping,
 * transport security, the client) is common/rpc.h; the files behind this
 * header: rpc_call.c (a call's life cycle), rpc_admission.c (tokens, call
 * caps, refusals), rpc_policing.c (stalled calls, rapid resets, cut
 * connections), rpc_setup.c (create, start, shut down).
 *
 * Threading model (calls are objects, not threads):
 *  - PS_RPC_EVENT_THREADS event threads drive a single completion queue
 *    (one polls; the others stand by and join it while it is busy without
 *    a pause, e.g. in a flood: rpc_call.c, rpc_event_loop):
 *    they accept calls, check tokens, refuse what they must, and start the
 *    asynchronous receive of each request message. They never run a
 *    handler and never wait on the network, so a client that never sends
 *    its message holds one call object, not a thread (and only until
 *    opts.recv_timeout_ms). They also enforce the limits against hostile
 *    clients listed with ps_rpc_server_opts.
 *  - PS_RPC_REQUESTS_ARMED generic grpc_server_request_call()s are kept
 *    outstanding: a fresh one is armed as soon as one is matched, so the
 *    number of accepted calls is bounded only by opts.max_calls (ordinary
 *    methods) and opts.max_reserved_calls (reserved methods), counted
 *    separately. A call beyond its cap is refused with RESOURCE_EXHAUSTED
 *    before its message is read.
 *  - Handlers run on worker threads that take received calls from a FIFO:
 *    opts.threads workers for ordinary methods, opts.reserved_threads
 *    dedicated workers for methods marked `reserved` in the method table
 *    (health, Status), which therefore never wait behind slow Forward or
 *    Backward handlers nor behind an exhausted ordinary call cap. Up to
 *    threads + reserved_threads handlers run concurrently: handlers
 *    synchronise shared state themselves. Received calls beyond the free
 *    workers wait in the FIFO, holding their request message.
 *  - A handler answers synchronously (sets its response and code), or DEFERS:
 *    ps_rpc_call_defer() hands it a ps_rpc_call handle and its worker is
 *    free as soon as it returns; any thread later answers with
 *    ps_rpc_call_complete(). Deferred calls cost no thread.
 *  - Per call: at accept, batch {RECV_MESSAGE}; after the handler or
 *    ps_rpc_call_complete, batch {SEND_INITIAL_METADATA, SEND_MESSAGE (only
 *    on OK), SEND_STATUS_FROM_SERVER} (initial metadata with the reply: a
 *    call reset before its message costs no write). RECV_CLOSE_ON_SERVER
 *    (completes when the call ends: reply sent, client cancelled, deadline
 *    passed, server cancelled) is started where it is first needed: before
 *    a received call waits for a worker, when a handler defers, else in
 *    the reply batch (one completion per call; PS_RPC_LATE_CLOSE=0: at
 *    accept, as its own batch). Batches of one call never race: each is
 *    started by the one thread that holds the call at that step, under its
 *    lock (rpc_server_impl.h).
 *  - The local transport (opts.local_socket, rpc_local.c; common/rpc_local.h):
 *    the same method table on a unix socket for clients on this host.
 *    Each of its connections has a thread of its own that reads a call,
 *    runs the handler itself (reserved methods too: no worker, no FIFO) and
 *    answers; a deferred call holds that thread, which cancels it (on_cancel)
 *    when its client hangs up, its deadline passes or the shutdown grace
 *    ends. Its calls are not in ps_rpc_server_admission's call counts but in
 *    local_connections / local_calls; its caps are per connection (one call
 *    each): server.max_connections_per_client per client, max_calls in all.
 *  - Nothing interrupts a running handler; info->deadline (monotonic clock)
 *    says when the client gives up. A call whose deadline passed while it
 *    waited for a worker is answered DEADLINE_EXCEEDED without running the
 *    handler; one known to be cancelled (client gone) by the time a worker
 *    takes it is dropped without running the handler (a call that waited
 *    in the FIFO always has its close batch, so its cancellation is known).
 */
#ifndef PS_RPC_SERVER_H
#define PS_RPC_SERVER_H

#include <stdbool.h>

#include "rpc.h"
#include "server_opts.h"

#define PS_RPC_REQUESTS_ARMED 64   /* grpc_server_request_call()s kept outstanding */
#define PS_RPC_EVENT_THREADS 2     /* threads polling the server's completion queue */
#define PS_RPC_DEFAULT_MAX_CALLS 256         /* see ps_rpc_server_opts */
#define PS_RPC_DEFAULT_MAX_RESERVED_CALLS 32
#define PS_RPC_DEFAULT_RESERVED_THREADS 1

/* ---- server ------------------------------------------------------------ */

typedef struct ps_rpc_server ps_rpc_server;

/* One server call: an opaque object with its own lifetime (see
 * ps_rpc_call_defer). */
typedef struct ps_rpc_call ps_rpc_call;

typedef struct ps_rpc_call_info {
    const char *method;    /* "/ps.ParameterServer/Forward" */
    const char *peer;      /* "ipv4:127.0.0.1:51234" */
    gpr_timespec deadline; /* GPR_CLOCK_MONOTONIC; inf_future when none */
    const char *principal; /* name of the caller's token; "" without tokens */
    ps_rpc_call *call;     /* the call being handled, for ps_rpc_call_defer;
                              NULL when a handler is called outside a server */
    int method_id;         /* the id of the method's entry (ps_rpc_method.id) */
    const char *client;    /* whom the call is counted for (per-client caps):
                              "token:<name>" with tokens, else the peer's host
                              ("ipv4:127.0.0.1"); NULL outside a server */
} ps_rpc_call_info;
/* The strings of ps_rpc_call_info are valid while the handler runs only;
 * copy what a deferred reply needs. */

/* A method handler. On entry *code == GRPC_STATUS_OK, *response == NULL,
 * details[0] == '\0'. request is NULL or a buffer owned by the server (treat
 * NULL as an empty message; ps_wire_decode does), valid while the handler
 * runs. On OK set *response to a new byte buffer (ownership passes to the
 * server; leaving it NULL sends an empty message). On error set *code and
 * write a message into details (details_len bytes incl. NUL); a *response
 * left set on error is destroyed by the server, never sent, so error paths
 * cannot leak it. A handler that called ps_rpc_call_defer answers through
 * ps_rpc_call_complete instead: whatever it leaves in *response, *code and
 * details is ignored (a *response is destroyed). */
typedef void (*ps_rpc_handler)(void *user, const ps_rpc_call_info *info,
                               const grpc_byte_buffer *request,
                               grpc_byte_buffer **response,
                               grpc_status_code *code,
                               char *details, size_t details_len);

typedef struct ps_rpc_method {
    const char *path;   /* "/ps.ParameterServer/Forward" */
    ps_rpc_handler fn;
    int reserved;       /* 1: run by the reserved workers, counted against
                           max_reserved_calls (cheap methods that must answer
                           under load: health, Status); 0: ordinary */
    int id;             /* the caller's number for the method (e.g. its row
                           in a table), passed as ps_rpc_call_info.method_id */
} ps_rpc_method;

/* ---- deferred replies ---------------------------------------------------
 *
 * Called by a handler (on its worker thread, at most once per call, with
 * the info it was given): the reply will come later through
 * ps_rpc_call_complete, from any thread. Returns the call's handle, or NULL
 * when info->call is NULL (handler called outside a server: answer
 * synchronously then).
 *
 * Lifetime: the handle is reference counted. The owner's reference, taken
 * here, is released by ps_rpc_call_complete, which must be called EXACTLY
 * ONCE per deferred call, whatever happens to the call meanwhile (client
 * gone, deadline passed, server shut down or even freed): until then the
 * handle stays valid, afterwards it must not be used.
 *
 * Cancellation: when the call ends without a reply (client cancelled or
 * disconnected, deadline passed, server shutdown cancelling it),
 * ps_rpc_call_cancelled() becomes 1 and on_cancel (if not NULL) is called
 * once with (cancel_arg, call), on a server thread (the event thread, or the
 * worker right after the deferring handler returned: never while that
 * handler still runs), without any server lock held. It is not called once
 * ps_rpc_call_complete has returned for the call, but it may run
 * concurrently with a ps_rpc_call_complete on another thread: the handle
 * stays valid for the duration of the callback either way. The usual
 * pattern: the owner keeps its deferred handles in a table under its own
 * lock; whoever (the normal path or on_cancel) removes a handle from the
 * table calls ps_rpc_call_complete on it. on_cancel may call
 * ps_rpc_call_complete itself. It runs on the thread that receives every
 * call, so it must be quick and must not block (take a lock briefly, never
 * wait for another call).
 *
 * Shutdown: ps_rpc_server_shutdown gives deferred calls the grace period to
 * be completed, then cancels them (clients see CANCELLED or UNAVAILABLE,
 * on_cancel runs) and returns without waiting for their owners. */
typedef void (*ps_rpc_cancel_fn)(void *cancel_arg, ps_rpc_call *call);

ps_rpc_call *ps_rpc_call_defer(const ps_rpc_call_info *info, ps_rpc_cancel_fn on_cancel,
                               void *cancel_arg);

/* Answer a deferred call and release the owner's reference: same rules as a
 * synchronous handler's outputs (ownership of response passes, whatever
 * happens; on OK a NULL response sends an empty message; on error the
 * response is destroyed and details (NULL = "") is sent). May be called
 * from the deferring handler itself. Returns 1 if the reply was handed to
 * gRPC, 0 if the call had already been cancelled (nothing is sent). */
int ps_rpc_call_complete(ps_rpc_call *call, grpc_byte_buffer *response,
                         grpc_status_code code, const char *details);

/* Before a RESOURCE_EXHAUSTED reply for an admission limit (a client over
 * its fair share of context memory), by the handler (info->call) or the
 * owner of a deferred call: the reply carries PS_RPC_RETRY_AFTER_KEY = ms
 * (rpc.h), telling the client that the call did nothing and may be sent
 * again as it is after ms. No effect on another status; call NULL: none. */
void ps_rpc_call_retry_after(ps_rpc_call *call, int ms);

/* 1 once the call ended without a reply having been sent (see above). */
int ps_rpc_call_cancelled(ps_rpc_call *call);

/* ---- server options ---------------------------------------------------- */

/* ps_rpc_server_opts (the server.* keys of the rpc server) is in
 * server_opts.h. */

/* The per-client cap opts give: max_calls_per_client, or max_calls / 4
 * (at least 1). */
int ps_rpc_calls_per_client(const ps_rpc_server_opts *opts);

/* The admission hint (PS_RPC_RETRY_AFTER_KEY) of a call refused for the
 * call caps: calls last milliseconds, a slot frees soon. */
#define PS_RPC_RETRY_AFTER_CALLS_MS 100

#define PS_RPC_DEFAULT_MAX_STREAMS 64
#define PS_RPC_DEFAULT_RECV_TIMEOUT_S 30.0
#define PS_RPC_DEFAULT_SEND_TIMEOUT_S 60.0
#define PS_RPC_DEFAULT_MAX_RESETS 200
#define PS_RPC_DEFAULT_MAX_STALLED 16
#define PS_RPC_DEFAULT_MAX_CONNECTIONS 64

/* What admission control did, since the server started (a snapshot). */
typedef struct ps_rpc_admission {
    int calls, reserved_calls;      /* accepted and unfinished, per class */
    int reader_calls;               /* readers' ordinary calls (their own cap) */
    int stalled_calls;              /* ordinary and reader calls whose message is not in */
    int clients;                    /* clients holding calls now */
    unsigned long long refused_busy;    /* call cap reached */
    unsigned long long refused_client;  /* per-client cap reached */
    unsigned long long refused_auth;    /* no/unknown token, method not allowed */
    unsigned long long recv_timeouts;   /* request message never came */
    unsigned long long send_timeouts;   /* reply never taken */
    unsigned long long conns_cut;       /* connections closed for rapid reset */
    unsigned long long bytes_received;  /* request message bytes (serialized protobuf) */
    unsigned long long bytes_sent;      /* response message bytes handed to gRPC */
    unsigned long long polls_hit;       /* idle workers' polls (server.idle_poll_us) that caught a call */
    unsigned long long polls_missed;    /* ... that ended in sleep */
    double poll_s;                      /* the time workers spent polling */
    int local_connections;              /* open connections of the local transport (opts.local_socket) */
    unsigned long long local_calls;     /* calls it carried */
    double saturated_s;             /* how long ordinary calls have been
                                       refused for the call cap without a
                                       break of more than 1 s; 0 = not now */
} ps_rpc_admission;

void ps_rpc_server_admission(ps_rpc_server *s, ps_rpc_admission *out);

/* With opts.profile: the phases (prof.h) of the finished calls of the
 * method whose ps_rpc_method.id is method_id, summed since the start.
 * Returns 0 (and zeros) when not profiling or no such method. */
struct ps_prof_acc;
int ps_rpc_server_phases(ps_rpc_server *s, int method_id, struct ps_prof_acc *out);

/* Create a server listening on listen_addr ("0.0.0.0:50051",
 * "127.0.0.1:0" for any free port, "[::]:50051", "unix:/path") with
 * options opts, transport security and tokens sec (NULL = plaintext,
 * loopback only). methods (array and path strings) and tokens are copied.
 * SO_REUSEPORT is off, so a port already in use is an error. Binding
 * failure -> NULL with PS_ERR_UNAVAILABLE naming the address; a bad
 * certificate or key file, or plaintext on a non-loopback address without
 * allow_insecure -> NULL and a message naming it. Methods not in the table
 * are answered UNIMPLEMENTED naming the path, before the message is read. */
ps_rpc_server *ps_rpc_server_create_opts(const char *listen_addr, const ps_rpc_server_opts *opts,
                                         const ps_rpc_method *methods, int nmethods,
                                         void *user, const ps_rpc_security *sec,
                                         ps_err *err);

/* The same with opts {nthreads, defaults..., max_message_bytes}. */
ps_rpc_server *ps_rpc_server_create(const char *listen_addr, int nthreads,
                                    int max_message_bytes,
                                    const ps_rpc_method *methods, int nmethods,
                                    void *user, ps_err *err);

ps_rpc_server *ps_rpc_server_create_secure(const char *listen_addr, int nthreads,
                                           int max_message_bytes,
                                           const ps_rpc_method *methods, int nmethods,
                                           void *user, const ps_rpc_security *sec,
                                           ps_err *err);

/* What ps_rpc_server_create_opts would refuse about the address and the
 * security settings (plaintext beyond loopback, short tokens, missing or
 * non-PEM certificate/key/CA files, a key gRPC's TLS will not pair with the
 * certificate), without binding listen_addr: gRPC parses the TLS files only
 * when a port is added, so with TLS a never-started server adds an
 * ephemeral loopback port once. For `psd --check-config`. Needs
 * grpc_init(). */
ps_status ps_rpc_server_check(const char *listen_addr, const ps_rpc_security *sec, ps_err *err);

/* Start accepting calls and the worker threads. Once only. */
ps_status ps_rpc_server_start(ps_rpc_server *s, ps_err *err);

/* Stop accepting new calls; let calls in flight (deferred ones included)
 * finish for up to grace_ms (<= 0: cancel at once) - except calls waiting
 * for their client (request message not in, reply not taken), cancelled
 * (UNAVAILABLE) once they have waited 2 s, and connections that are all
 * that is left 2 s into the shutdown (a client that does not read cannot
 * take the GOAWAY), closed - then log what is still open and cancel the rest
 * (their clients see CANCELLED/UNAVAILABLE; deferred calls get their
 * on_cancel); wait for running handlers to return and join the threads.
 * Does not wait for owners of deferred calls to call ps_rpc_call_complete.
 * Idempotent; not to be called from a handler or an on_cancel callback. */
void ps_rpc_server_shutdown(ps_rpc_server *s, int grace_ms);

/* Shut down (grace 0) if still running, then release everything. NULL ok. */
void ps_rpc_server_free(ps_rpc_server *s);

/* The port actually bound (useful with port 0); 0 for unix sockets. */
int ps_rpc_server_port(const ps_rpc_server *s);

/* Calls accepted and not finished (both classes; refused calls are not
 * counted): queued, in a handler, deferred or sending. A snapshot. */
int ps_rpc_server_calls(ps_rpc_server *s);

#endif
