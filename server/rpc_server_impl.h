/* rpc_server_impl.h - the server's insides, shared by its files (see
 * rpc_server.h): the call and server structs and the functions one file
 * offers the others. Not for use outside server/rpc_*.c.
 *
 * Server call life cycle (a ps_rpc_call is allocated per armed request;
 * E = event thread, W = worker, A = any thread):
 *
 *   requested --E: request_call ok--> accepted: arm the next request;
 *     tokens, method and call cap checked; a refused call gets one batch
 *     {SEND_INITIAL_METADATA, SEND_STATUS, RECV_CLOSE_ON_SERVER} and its
 *     message is never read. Otherwise {RECV_MESSAGE} (tag RECV); initial
 *     metadata goes with the reply.
 *   --E: RECV ok--> handed to an idle worker, or queued on the class's FIFO
 *   --W: handler--> replied: {SEND_MESSAGE, SEND_STATUS} (tag SEND)
 *                or deferred --A: ps_rpc_call_complete--> replied
 *   --E: CLOSE and SEND done--> finished.
 * RECV_CLOSE_ON_SERVER (which reports a cancelled call) is started once
 * per call, where it is needed first: before a call waits in the FIFO
 * (its cancellation then drops it unhandled), at ps_rpc_call_defer (for
 * on_cancel), else in the reply batch itself (tag SEND), so that a call
 * run at once ends in one completion, one wake-up of the event thread,
 * not two (the close completes a moment after the send, nearly always in
 * a wake-up of its own: docs/performance.md item 17). With
 * PS_RPC_LATE_CLOSE=0 every accepted call starts it at accept, in a batch
 * of its own (tag CLOSE), as before.
 * Limits (rpc_server.h, docs/security.md): per-class and per-client call
 * caps at accept (rpc_admission.c); rpc_scan_timeouts (every 200 ms on an
 * event thread) cancels calls waiting too long for their message or for the
 * client to take the reply; a connection that resets streams faster than
 * allowed, or holds far more call objects than its stream limit allows, is
 * cut (rpc_policing.c). CLOSE completing before a reply was sent means
 * cancelled: a queued call is then dropped unhandled, a deferred one gets
 * on_cancel (never while its handler runs) and its later complete sends
 * nothing.
 *
 * "finished" (rpc_call_unlock_maybe_finish) = no batch outstanding and the
 * application no longer holds the call (not queued, not in its handler, not
 * deferred-and-uncompleted-and-uncancelled): the grpc_call, metadata and
 * buffers are released and s->live drops. The struct itself is reference
 * counted and outlives that while a deferred call's owner holds it; once
 * finished it no longer points to the server. The batches at accept are
 * started under c->mu before anyone else can see the call; the reply, the
 * call's one send batch, is started with c->mu released (c->sending keeps
 * the call unfinished meanwhile), so batches never race.
 *
 * Shutdown ordering (see shared/notes/grpc-core-and-nanopb.md):
 *   1. stopping = 1; grpc_server_shutdown_and_notify on shutdown_cq
 *      (registered before start). Pending request_calls fail; no new ones
 *      are armed.
 *   2. wait for the tag up to grace_ms (deferred calls may still be
 *      completed meanwhile; calls waiting on their client are cancelled
 *      after PS_RPC_SHUTDOWN_CLIENT_MS by rpc_scan_timeouts; once no
 *      accepted call is left, PS_RPC_SHUTDOWN_CLIENT_MS into the shutdown,
 *      the wait ends early: what is left are connections gRPC waits to
 *      close), then log what is still open, grpc_server_cancel_all_calls
 *      (every CLOSE completes, every connection closes; deferred owners get
 *      on_cancel) and wait for the tag.
 *   3. join the event thread: it leaves only when s->live == 0, i.e. no
 *      live call or request can start a batch on s->cq; then stop and join
 *      the workers (their queues are empty by then).
 *   4. grpc_server_destroy, then shut down, drain and destroy the queues.
 * The caller calls grpc_shutdown() afterwards.
 */
#ifndef PS_RPC_SERVER_IMPL_H
#define PS_RPC_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <grpc/grpc_security.h>

#include "prof.h"
#include "rpc_server.h"

enum { TAG_REQUEST, TAG_RECV, TAG_CLOSE, TAG_SEND, NTAGS };
#define PS_RPC_CLIENT_KEY 96

/* Streams a connection reset before sending their message, in the
 * current one-second window (HTTP/2 rapid reset detection). */
#define PS_RPC_RESET_SLOTS 64
typedef struct conn_resets {
    char peer[PS_RPC_CLIENT_KEY];
    long long window;   /* now_ms() / 1000 of the window */
    int n;
    int cut;            /* already cut in this window */
} conn_resets;

/* Hosts (peer addresses without the port) recently seen resetting
 * streams, with a decaying count (half-life 1 s: about 1.44 x resets per
 * second at a steady rate); a host past max_resets_per_s over all its
 * connections is cut off (every connection from it closed, and any it
 * opens while its count stays high). Bounded: the slot with the lowest
 * count is reused. */
#define PS_RPC_HOST_SLOTS 256
/* At most this many hosts (IPv4) have their new connections refused at
 * once (a socket filter on the listener; rpc_scan_connections). */
#define PS_RPC_REFUSED_HOSTS 32
typedef struct host_resets {
    char host[PS_RPC_CLIENT_KEY];
    double score;
    long long t_ms;      /* when score was last decayed */
    long long cut_until; /* monotonic ms: its connections are closed until then */
} host_resets;

/* Call classes: each has its own call cap, FIFO and workers. Readers'
 * ordinary calls (tokens restricted to reader methods) do not share the
 * trainers' cap. */
enum { CLASS_ORDINARY = 0, CLASS_RESERVED = 1, CLASS_READER = 2, NCLASSES };

/* Calls a client holds (s->clients: n per class, stalled = of those, the
 * ones whose request message has not arrived), or a connection holds
 * (s->conns: n[0] call objects, n[1] cut, reserved = its reserved calls);
 * under s->mu. */
typedef struct client_slot {
    char key[PS_RPC_CLIENT_KEY];
    int n[NCLASSES];
    int stalled;        /* of its calls, those whose message is not in */
    int old;            /* of those, the ones waiting longer than PS_RPC_STALL_GRACE_MS */
    int reserved;
} client_slot;

/* What a connection has delivered, for rpc_scan_connections: gRPC 1.51
 * buffers a header block that never ends (HEADERS, then CONTINUATION
 * frames without END_HEADERS) without any limit, and psd never sees its
 * call. A connection makes progress when psd sees one of its calls (its
 * headers ended), one of its request messages (all its bytes came) or the
 * end of one of its calls (what it was receiving is spent);
 * between those, the bytes its socket receives (TCP_INFO) may be no more
 * than PS_RPC_NO_PROGRESS_BYTES plus server.max_message_mb per call it
 * holds (each may be receiving its message), and for the first
 * PS_RPC_OVERSIZE_GRACE_MS also server.transport_memory_mb per call (gRPC
 * reads a message larger than max_message_mb whole, up to its quota,
 * before it refuses it: its client hears why); else it is closed. */
typedef struct conn_progress {
    char key[PS_RPC_CLIENT_KEY];        /* the peer ("ipv4:1.2.3.4:5") */
    unsigned long long seq;             /* its last progress event (s->prog_seq) */
    unsigned long long seen;            /* seq as the last scan saw it */
    unsigned long long base;            /* its socket's bytes received then */
    long long t_ms;                     /* monotonic ms: when base was taken */
    int present;                        /* found by the scan under way */
} conn_progress;
#define PS_RPC_NO_PROGRESS_BYTES (1ull << 20)
#define PS_RPC_OVERSIZE_GRACE_MS 2000
/* How often rpc_scan_connections runs. What a header block that never
 * ends costs is set by how long it goes on: gRPC 1.51 keeps ~6 bytes of
 * parsed metadata per byte of CONTINUATION frames (a loopback flood sent
 * 35-56 MB in the 1 s scans had between cuts, and psd's RSS grew 200-370
 * MiB for each), so the scan runs four times a second; it costs a walk of
 * psd's descriptors (/proc/self/fd) and a TCP_INFO per connection. */
#define PS_RPC_CONN_SCAN_MS 250
/* After a connection is closed for bytes without progress, psd hands freed
 * memory back to the OS (malloc_trim) this long later, at a scan. */
#define PS_RPC_TRIM_AFTER_CUT_MS 300

/* A call whose request message has not arrived this long after its
 * headers counts against server.max_stalled_per_client: a client's burst
 * of calls whose messages are on their way is never refused for it. */
#define PS_RPC_STALL_GRACE_MS 1000

/* While the server stops, a call waits at most this long for its client
 * (its request message to arrive, its reply to be taken) before it is
 * cancelled (UNAVAILABLE), however long server.recv_timeout_s and
 * server.send_timeout_s are: the shutdown grace is for calls psd is working
 * on (queued, in a handler, deferred), not for clients that stall. */
#define PS_RPC_SHUTDOWN_CLIENT_MS 2000

/* A completion-queue tag: which call, which batch. */
typedef struct call_tag {
    struct ps_rpc_call *c;
    int kind;
} call_tag;

struct ps_rpc_call {
    ps_rpc_server *s;            /* valid until the call is finished */
    pthread_mutex_t mu;          /* everything below; batches start under it */
    atomic_int refs;             /* server side until finished, owner until
                                    complete, each running on_cancel */
    call_tag tags[NTAGS];
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *recv;      /* request message, NULL if none */
    grpc_byte_buffer *send;      /* response message once replied */
    grpc_slice status_details;   /* once replied */
    int retry_after_ms;          /* > 0: a RESOURCE_EXHAUSTED reply carries PS_RPC_RETRY_AFTER_KEY */
    char retry_val[16];          /* its value, and the entry: valid until the call is freed */
    grpc_metadata retry_md;
    int close_cancelled;         /* RECV_CLOSE_ON_SERVER's output */
    int close_started;           /* RECV_CLOSE_ON_SERVER started (its own batch or the reply's) */
    int close_in_reply;          /* ... as part of the reply batch (s->late_close) */
    const ps_rpc_method *m;
    int cls;                     /* CLASS_*, counted in s->ncalls[cls] if counted */
    int counted;
    int who;                     /* index of the caller's token, -1 if none */
    int batches;                 /* outstanding batches */
    int queued;                  /* waiting for a worker */
    int handler_running;
    int deferred, completed;     /* ps_rpc_call_defer / ps_rpc_call_complete called */
    int replied;                 /* status handed to gRPC */
    int sending;                 /* reply_locked: the reply batch is being started, c->mu released */
    int send_done;               /* the reply batch completed while sending */
    int cancelled;               /* ended (or will end) without our reply */
    int cancel_fired;
    int finished;                /* gRPC side released; s no longer used */
    ps_rpc_cancel_fn on_cancel;
    void *cancel_arg;
    struct ps_rpc_call *next;    /* work queue link */
    uint64_t key;                /* affinity: a hash of its connection (peer), never 0 */
    /* admission (s->mu): the client it is counted for, the watch list of
     * accepted calls (until finished), and since when (monotonic ms, 0 =
     * not) it waits for its request message / for its reply to be taken
     * (__atomic: set under c->mu, read by the scan under s->mu) */
    char client[PS_RPC_CLIENT_KEY];
    char peer[PS_RPC_CLIENT_KEY];   /* "ipv4:127.0.0.1:5678": the connection */
    int got_message;                /* RECV_MESSAGE succeeded */
    int timed_out;                  /* cancelled by scan_timeouts */
    int conn_counted;               /* in s->conns */
    int stalled;                    /* counted as stalled (s->mu): accepted, message not yet in */
    int stalled_old;                /* ... and as waiting longer than PS_RPC_STALL_GRACE_MS */
    int conn_reserved;              /* counted in its connection's reserved calls (s->mu) */
    struct ps_rpc_call *wprev, *wnext;
    int watched;
    long long recv_since, send_since;
    long long accepted_ms;          /* monotonic ms when its headers came (for shutdown's log) */
    /* opts.profile (prof.h): the phases, and when it was accepted, received,
     * deferred and replied (ns); the phases are written by the thread
     * running the handler, and under mu by the rest */
    ps_prof_call prof;
    int64_t t_accept, t_recv, t_defer, t_reply;
    /* A call of the local transport (rpc_local.c) has the connection that
     * carries it here, and uses only mu, refs, m, who, handler_running,
     * deferred, completed, cancelled, cancel_fired, on_cancel, cancel_arg,
     * retry_after_ms, prof, t_defer, send and the fields below; NULL for a
     * gRPC call. */
    struct rpc_local_conn *local;
    pthread_cond_t local_cv;        /* signalled by ps_rpc_call_complete */
    grpc_status_code local_code;    /* the deferred answer */
    char local_details[PS_RPC_DETAILS_MAX];
};

typedef struct work_queue {
    ps_rpc_call *head, *tail;
    pthread_cond_t cv;
} work_queue;

/* A worker. With affinity (s->affinity, the default) a call goes to an
 * idle worker of its class, preferably the one that ran its connection's
 * last call (same thread: same CPU binding, warm caches, oneDNN's
 * thread-local scratchpad, malloc arena), else the one idle longest; it is
 * handed over directly (w->handoff) and the worker woken on its own
 * condition variable. Only when no worker of the class is idle does it go
 * on the class's FIFO, which every worker of the class drains in order:
 * so a call never waits while a worker of its class is idle, and a client
 * cannot hold a worker for itself. Without affinity every worker waits on
 * the FIFO's condition variable, as before.
 *
 * An idle worker first polls for a handoff (yielding its CPU to anything
 * runnable there) for up to poll_us, then sleeps. A sleeping thread's CPU
 * goes idle, and on a virtual machine without guest halt-polling an idle
 * vCPU takes ~0.1 ms, at times several, to wake (docs/performance.md item
 * 18), which a call boundary pays two or three times. The window adapts as
 * the kernel's haltpoll governor's does: after a spell in which the poll
 * gave up and the worker slept, a spell no longer than opts.idle_poll_us
 * (a longer poll would have caught its call) doubles the window (up to
 * that; from PS_RPC_POLL_MIN_US when it was off), a longer one halves it
 * (below PS_RPC_POLL_MIN_US: off), so a worker whose calls come far apart
 * (a trainer computing between them) stops burning its CPU. */
#define PS_RPC_POLL_MIN_US 50  /* a polling window below this is none */
/* After a poll that ended in sleep: the window *poll_us grows (doubled, up
 * to max) when the sleep was no longer than max, else halves (off below
 * PS_RPC_POLL_MIN_US). Workers and local connections alike. */
void rpc_poll_adapt(int *poll_us, int max, double slept_us);

typedef struct rpc_worker {
    ps_rpc_server *s;
    int cls;
    pthread_t thread;
    int running;
    /* affinity: under s->mu, but for finishing */
    pthread_cond_t cv;
    ps_rpc_call *handoff;        /* a call handed to this idle worker */
    int idle;                    /* waiting for a call, nothing handed over yet */
    int sleeping;                /* in pthread_cond_wait on cv: a handoff signals it */
    int finishing;               /* its handler returned (set by it unlocked, cleared under s->mu) */
    uint64_t last_key;           /* the connection of the last call it ran */
    unsigned long long idle_seq; /* when it went idle (s->idle_seq): the oldest is taken for a stranger */
    int poll_us;                 /* its polling window now (rpc_call.c worker_next_locked) */
} rpc_worker;

typedef struct rpc_local rpc_local;

struct ps_rpc_server {
    grpc_server *server;
    rpc_local *local;                   /* opts.local_socket's transport (rpc_local.c); NULL: none */
    grpc_completion_queue *cq;          /* every call's batches and requests */
    grpc_completion_queue *shutdown_cq;
    pthread_t event_threads[PS_RPC_EVENT_THREADS];
    int event_running;                  /* event threads started */
    pthread_t watch_thread;             /* runs rpc_scan_connections while the event threads are busy */
    int watch_running;
    atomic_int watch_stop;
    /* The first event thread polls; the others stand by (rpc_call.c,
     * rpc_event_loop) and poll too only while it is busy: a backlog of
     * events (a flood of calls or resets) or a slow callback. */
    atomic_int event_roles;             /* event threads that took a role */
    atomic_llong event_busy_since;      /* ps_mono_ms() since the polling thread
                                           handles events without a pause; 0 = idle */
    pthread_mutex_t standby_mu;
    pthread_cond_t standby_cv;          /* CLOCK_MONOTONIC; wakes the standby threads */
    rpc_worker *workers;                /* opts.threads ordinary, then reserved, then reader */
    int nworkers;
    int ncv;                            /* workers whose cv is initialised */
    ps_rpc_server_opts opts;            /* defaults filled in */
    int recv_timeout_ms, send_timeout_ms; /* opts' timeouts in ms */
    ps_rpc_method *methods;             /* paths owned */
    int nmethods;
    void *user;
    int port;
    char *addr;
    ps_rpc_token *tokens;               /* deep copies */
    int ntokens;
    int started;                        /* grpc_server_start called */
    int shut_down;
    atomic_int stopping;
    pthread_mutex_t mu;                 /* the fields below */
    int live;                           /* armed requests + unfinished calls */
    conn_resets resets[PS_RPC_RESET_SLOTS]; /* recent resets by connection */
    host_resets hosts[PS_RPC_HOST_SLOTS];   /* recent resets by host */
    atomic_llong next_conn_scan;            /* connections per host counted (rpc_scan_connections) */
    atomic_llong trim_at;                   /* ps_mono_ms() of a malloc_trim due after a cut; 0: none */
    uint32_t refused_hosts[PS_RPC_REFUSED_HOSTS]; /* IPv4 hosts whose new connections the listener drops */
    int nrefused_hosts;                     /* (event thread running the connection scan only) */
    unsigned long long conns_cut;
    unsigned long long polls_hit, polls_missed; /* idle workers' polls (rpc_worker), under mu */
    double poll_s;                      /* ... the time they took, under mu */
    atomic_ullong bytes_received, bytes_sent; /* message payloads, both ways */
    int ncalls[NCLASSES];               /* accepted, unfinished calls */
    int nstalled;                       /* of those, ordinary and reader calls whose message is not in */
    int nold;                           /* of those, the ones waiting longer than PS_RPC_STALL_GRACE_MS */
    int has_readers;                    /* some token is restricted: a reader queue and worker */
    work_queue q[NCLASSES];
    int workers_stop;
    int affinity;                       /* PS_RPC_AFFINITY (default 1): see rpc_worker */
    int late_close;                     /* PS_RPC_LATE_CLOSE (default 1): see "Server call life cycle" */
    unsigned long long idle_seq;
    client_slot *clients;               /* clients holding calls */
    int nclients, cap_clients;
    client_slot *conns;                 /* connections (peers) holding call objects: n[0] calls, n[1] cut */
    int nconns, cap_conns;
    conn_progress *prog;                /* every connection the last scan found, and new callers */
    int nprog, cap_prog;
    unsigned long long prog_seq;        /* numbers the progress events */
    ps_rpc_call *watch;                 /* accepted, unfinished calls */
    unsigned long long refused_busy, refused_client, recv_timeouts, send_timeouts;
    double sat_start, sat_last;         /* current streak of cap refusals */
    double log_window;                  /* refusal log lines: at most 10 a second */
    int log_lines;
    unsigned long long log_dropped;
    atomic_ullong refused_auth;
    atomic_llong auth_window;           /* transport_auth: failures in this second */
    atomic_int auth_fails;
    grpc_resource_quota *quota;
    atomic_llong next_scan;
    ps_prof_acc *prof;                  /* opts.profile: per method (nmethods), else NULL */
};

/* ---- rpc_call.c: the call life cycle ---- */
void rpc_arm_request(ps_rpc_server *s);
/* Called with c->mu held; unlocks it (see "finished" above). */
void rpc_call_unlock_maybe_finish(ps_rpc_call *c);
void rpc_call_unref(ps_rpc_call *c);
void *rpc_event_main(void *arg);   /* an event thread */
/* standby: 0 for the polling thread (and a caller serving without event
 * threads), 1 for a thread that polls only while that one is busy. */
void rpc_event_loop(ps_rpc_server *s, int standby);
void *rpc_worker_main(void *arg);  /* a worker (rpc_worker) */

/* The largest message each way: server.max_message_mb, or gRPC's default
 * (4 MiB) where the server leaves it 0. */
static inline uint64_t rpc_max_message(const ps_rpc_server *s) {
    return s->opts.max_message_bytes > 0 ? (uint64_t)s->opts.max_message_bytes : (uint64_t)4 << 20;
}

/* ---- rpc_local.c: the local transport (common/rpc_local.h) ---- */
/* Bind opts.local_socket (s->local set even on failure: rpc_local_free). */
ps_status rpc_local_create(ps_rpc_server *s, const char *path, ps_err *err);
ps_status rpc_local_start(ps_rpc_server *s, ps_err *err);
/* Stop accepting connections and calls; idle connections close. */
void rpc_local_stop(ps_rpc_server *s);
/* rpc_local_stop, then wait for the connections' calls until deadline_ms
 * (ps_mono_ms), cancel deferred ones then, and join every thread. */
void rpc_local_finish(ps_rpc_server *s, long long deadline_ms);
void rpc_local_free(ps_rpc_server *s);
/* Its open connections and the calls it carried (0 without it). */
void rpc_local_counts(ps_rpc_server *s, int *connections, unsigned long long *calls);
/* ps_rpc_call_defer / ps_rpc_call_complete of a local call (c->local). */
ps_rpc_call *rpc_local_defer(ps_rpc_call *c, ps_rpc_cancel_fn on_cancel, void *cancel_arg);
int rpc_local_complete(ps_rpc_call *c, grpc_byte_buffer *response, grpc_status_code code, const char *details);

/* ---- rpc_admission.c: who may call, how many calls ---- */
/* The index of the token whose secret is the n bytes v (constant time over
 * every token), -1 if none. */
int rpc_token_index(const ps_rpc_server *s, const unsigned char *v, size_t n);
/* Copy what a peer controls into dst for a log line: printable ASCII as
 * is, everything else as \xNN, cut with "..." (nothing can forge or flood
 * a log line). */
void rpc_escape_str(char *dst, size_t n, const char *src);
void rpc_escape_slice(char *dst, size_t n, grpc_slice sl);
/* A refusal worth a log line, at most 10 lines a second. */
void rpc_log_refusal(ps_rpc_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Accept or refuse a call that arrived (event thread): token, method,
 * caps. GRPC_STATUS_OK with c->m, c->cls, c->client set and the call
 * counted; otherwise the code and details to refuse it with (already
 * counted and logged). peer: escaped for logs. */
grpc_status_code rpc_admit(ps_rpc_call *c, const char *rawpeer, const char *method, const char *peer,
                           char *details, size_t dlen);
/* With s->mu held: call c ended (counted, it gives back its share). */
void rpc_client_release_locked(ps_rpc_server *s, ps_rpc_call *c);
/* With s->mu held: call c's request message arrived (no longer stalled). */
void rpc_client_unstall_locked(ps_rpc_server *s, ps_rpc_call *c);
/* With s->mu held: stalled call c has waited PS_RPC_STALL_GRACE_MS; 1 if
 * it now counts as stalled, 0 if it is past the stalled caps (to cancel). */
int rpc_client_stall_old_locked(ps_rpc_server *s, ps_rpc_call *c);
/* gRPC's auth metadata processor (grpc_auth_metadata_processor.process). */
void rpc_transport_auth(void *state, grpc_auth_context *ctx, const grpc_metadata *md, size_t nmd,
                        grpc_process_auth_metadata_done_cb cb, void *user_data);

/* ---- rpc_policing.c: connections and stalled calls ---- */
/* With s->mu held: one more call object from connection peer; 1 when the
 * connection should be cut (rapid reset). */
int rpc_conn_add_locked(ps_rpc_server *s, const char *peer);
void rpc_conn_release_locked(ps_rpc_server *s, const char *peer);
/* With s->mu held: connection peer made progress (a call seen, a request
 * message received): see conn_progress. */
void rpc_conn_progress_locked(ps_rpc_server *s, const char *peer);
/* With s->mu held: peer reset one more stream before its message; 1 when
 * it passed opts.max_resets_per_s in this second (once per window). */
int rpc_note_reset_locked(ps_rpc_server *s, const char *peer);
/* With s->mu held: peer's host reset one more stream; 1 when the host
 * just passed opts.max_resets_per_s over all its connections (cut it off:
 * rpc_cut_host). */
int rpc_note_host_reset_locked(ps_rpc_server *s, const char *peer);
/* With s->mu held: is peer's host cut off now (its new connections are
 * closed)? */
int rpc_host_cut_locked(ps_rpc_server *s, const char *peer);
/* Close the connection to peer, logging why. */
void rpc_cut_connection(ps_rpc_server *s, const char *peer, const char *why);
/* Close every connection from peer's host, logging why. */
void rpc_cut_host(ps_rpc_server *s, const char *peer, const char *why);
/* Count the connections to the server's port per host (its sockets) and
 * close those past opts.max_connections_per_client, newest first, and
 * those that received too much without progress (conn_progress). */
void rpc_scan_connections(ps_rpc_server *s);
/* The watch thread: every PS_RPC_CONN_SCAN_MS rpc_scan_connections (as
 * the event threads do between events), also while gRPC keeps the event
 * threads parsing what a flooding client sends. */
void *rpc_watch_main(void *arg);
/* The connections to the server's port open now (psd's sockets). */
int rpc_count_connections(ps_rpc_server *s);
/* "ipv4:1.2.3.4:5" -> "ipv4:1.2.3.4" (unix peers as they are). */
void rpc_peer_host(char *dst, size_t n, const char *peer);
/* ---- rpc_call.c ---- */
/* With c->mu held: end call c, whose message was not read, with a status
 * (and, for RESOURCE_EXHAUSTED with retry_after_ms > 0, psd's retry hint
 * in the trailers) instead of cancelling it; a message arriving later is
 * dropped unread. 0 if c was already replied, cancelled or finished, or
 * the batch could not start (cancel it then). */
int rpc_call_end_unread_locked(ps_rpc_call *c, grpc_status_code code, const char *details, int retry_after_ms);
/* Cancel calls that waited too long for their message or for the client
 * to take their reply. */
void rpc_scan_timeouts(ps_rpc_server *s);
/* With s->mu held: the slot of key in a table of slots (create: add it). */
client_slot *rpc_slot_find(client_slot **tab, int *n, int *cap, const char *key, int create);

#endif
