/* rpc.c - see rpc.h.
 *
 * Server call life cycle (a ps_rpc_call is allocated per armed request;
 * E = event thread, W = worker, A = any thread):
 *
 *   requested --E: request_call ok--> accepted: arm the next request;
 *     tokens, method and call cap checked; a refused call gets one batch
 *     {SEND_INITIAL_METADATA, SEND_STATUS, RECV_CLOSE_ON_SERVER} and its
 *     message is never read. Otherwise two batches: {RECV_CLOSE_ON_SERVER}
 *     (tag CLOSE) and {RECV_MESSAGE} (tag RECV); initial metadata goes
 *     with the reply.
 *   --E: RECV ok--> queued on the class's FIFO
 *   --W: handler--> replied: {SEND_MESSAGE, SEND_STATUS} (tag SEND)
 *                or deferred --A: ps_rpc_call_complete--> replied
 *   --E: CLOSE and SEND done--> finished.
 * Limits (rpc.h, docs/security.md): per-class and per-client call caps at
 * accept; scan_timeouts (every 200 ms on an event thread) cancels calls
 * waiting too long for their message or for the client to take the reply;
 * a connection that resets streams faster than allowed, or holds far more
 * call objects than its stream limit allows, is cut (cut_connection).
 * CLOSE completing before a reply was sent means cancelled: a queued call
 * is then dropped unhandled, a deferred one gets on_cancel (never while its
 * handler runs) and its later complete sends nothing.
 *
 * "finished" (call_unlock_maybe_finish) = no batch outstanding and the
 * application no longer holds the call (not queued, not in its handler, not
 * deferred-and-uncompleted-and-uncancelled): the grpc_call, metadata and
 * buffers are released and s->live drops. The struct itself is reference
 * counted and outlives that while a deferred call's owner holds it; once
 * finished it no longer points to the server. Every batch of a call is
 * started under c->mu, so batches never race.
 *
 * Shutdown ordering (see shared/notes/grpc-core-and-nanopb.md):
 *   1. stopping = 1; grpc_server_shutdown_and_notify on shutdown_cq
 *      (registered before start). Pending request_calls fail; no new ones
 *      are armed.
 *   2. wait for the tag up to grace_ms (deferred calls may still be
 *      completed meanwhile), then grpc_server_cancel_all_calls (every CLOSE
 *      completes; deferred owners get on_cancel) and wait for the tag.
 *   3. join the event thread: it leaves only when s->live == 0, i.e. no
 *      live call or request can start a batch on s->cq; then stop and join
 *      the workers (their queues are empty by then).
 *   4. grpc_server_destroy, then shut down, drain and destroy the queues.
 * The caller calls grpc_shutdown() afterwards.
 */
#include "rpc.h"

#include <errno.h>
#include <pthread.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>

#include "log.h"

/* ---- status mapping ---------------------------------------------------- */

ps_status ps_status_from_grpc(grpc_status_code code) {
    switch (code) {
    case GRPC_STATUS_OK: return PS_OK;
    case GRPC_STATUS_CANCELLED: return PS_ERR_UNAVAILABLE;
    case GRPC_STATUS_UNKNOWN: return PS_ERR_INTERNAL;
    case GRPC_STATUS_INVALID_ARGUMENT: return PS_ERR_INVALID_ARGUMENT;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return PS_ERR_DEADLINE_EXCEEDED;
    case GRPC_STATUS_NOT_FOUND: return PS_ERR_NOT_FOUND;
    case GRPC_STATUS_ALREADY_EXISTS: return PS_ERR_ALREADY_EXISTS;
    case GRPC_STATUS_PERMISSION_DENIED: return PS_ERR_PERMISSION_DENIED;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return PS_ERR_RESOURCE_EXHAUSTED;
    case GRPC_STATUS_FAILED_PRECONDITION: return PS_ERR_FAILED_PRECONDITION;
    case GRPC_STATUS_ABORTED: return PS_ERR_ABORTED;
    case GRPC_STATUS_OUT_OF_RANGE: return PS_ERR_INVALID_ARGUMENT;
    case GRPC_STATUS_UNIMPLEMENTED: return PS_ERR_UNIMPLEMENTED;
    case GRPC_STATUS_INTERNAL: return PS_ERR_INTERNAL;
    case GRPC_STATUS_UNAVAILABLE: return PS_ERR_UNAVAILABLE;
    case GRPC_STATUS_DATA_LOSS: return PS_ERR_IO;
    case GRPC_STATUS_UNAUTHENTICATED: return PS_ERR_UNAUTHENTICATED;
    default: return PS_ERR_INTERNAL;
    }
}

grpc_status_code ps_grpc_from_status(ps_status s) {
    switch (s) {
    case PS_OK: return GRPC_STATUS_OK;
    case PS_ERR_INVALID_ARGUMENT: return GRPC_STATUS_INVALID_ARGUMENT;
    case PS_ERR_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case PS_ERR_ALREADY_EXISTS: return GRPC_STATUS_ALREADY_EXISTS;
    case PS_ERR_FAILED_PRECONDITION: return GRPC_STATUS_FAILED_PRECONDITION;
    case PS_ERR_RESOURCE_EXHAUSTED: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case PS_ERR_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
    case PS_ERR_DEADLINE_EXCEEDED: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case PS_ERR_IO: return GRPC_STATUS_INTERNAL;
    case PS_ERR_FORMAT: return GRPC_STATUS_INVALID_ARGUMENT;
    case PS_ERR_UNAUTHENTICATED: return GRPC_STATUS_UNAUTHENTICATED;
    case PS_ERR_PERMISSION_DENIED: return GRPC_STATUS_PERMISSION_DENIED;
    case PS_ERR_UNIMPLEMENTED: return GRPC_STATUS_UNIMPLEMENTED;
    case PS_ERR_INTERNAL: return GRPC_STATUS_INTERNAL;
    case PS_ERR_ABORTED: return GRPC_STATUS_ABORTED;
    }
    return GRPC_STATUS_UNKNOWN;
}

const char *ps_grpc_code_name(grpc_status_code code) {
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
        "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
    };
    if ((int)code >= 0 && (size_t)code < sizeof names / sizeof names[0])
        return names[code];
    return "UNKNOWN_CODE";
}

/* ---- credentials: the one place that knows about transport security ---- */

int ps_rpc_addr_is_loopback(const char *a) {
    if (!a) return 0;
    if (!strncmp(a, "unix:", 5) || !strncmp(a, "unix-abstract:", 14)) return 1;
    static const char *const schemes[] = {"dns:///", "dns:", "ipv4:", "ipv6:"};
    for (size_t i = 0; i < sizeof schemes / sizeof schemes[0]; i++) {
        size_t n = strlen(schemes[i]);
        if (!strncmp(a, schemes[i], n)) { a += n; break; }
    }
    if (!strcmp(a, "localhost") || !strncmp(a, "localhost:", 10)) return 1;
    if (!strcmp(a, "[::1]") || !strncmp(a, "[::1]:", 6)) return 1;
    if (strncmp(a, "127.", 4)) return 0;
    /* 127.x.y.z, not a host name such as 127.example.com */
    const char *colon = strrchr(a, ':');
    size_t hl = colon ? (size_t)(colon - a) : strlen(a);
    for (size_t i = 0; i < hl; i++)
        if (!(a[i] == '.' || (a[i] >= '0' && a[i] <= '9'))) return 0;
    return 1;
}

/* A whole PEM file (at most 1 MiB) that holds "-----BEGIN <...marker...>". */
static char *read_pem(const char *what, const char *path, const char *marker, ps_err *err) {
    if (!path || !*path) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "TLS: %s: no file given", what);
        return NULL;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        ps_err_set(err, PS_ERR_NOT_FOUND, "TLS: %s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    if (buf) n = fread(buf, 1, cap + 1, f);
    int bad_read = ferror(f);
    fclose(f);
    if (!buf) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "TLS: %s %s: out of memory", what, path);
        return NULL;
    }
    if (bad_read || n > cap) {
        ps_err_set(err, bad_read ? PS_ERR_IO : PS_ERR_INVALID_ARGUMENT, "TLS: %s %s: %s", what, path,
                   bad_read ? "read error" : "larger than 1 MiB; not a PEM file");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    int found = 0;
    for (const char *p = strstr(buf, "-----BEGIN "); p && !found; p = strstr(p + 1, "-----BEGIN ")) {
        const char *end = strstr(p + 11, "-----");
        if (end && strstr(p, marker) && strstr(p, marker) < end) found = 1;
    }
    if (!found || strlen(buf) != n) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "TLS: %s %s: not a PEM file with a %s block", what,
                   path, marker);
        free(buf);
        return NULL;
    }
    return buf;
}

static int has(const char *s) { return s && *s; }

static ps_status check_plaintext(const char *addr, const ps_rpc_security *sec, const char *side,
                                 ps_err *err) {
    if ((sec && sec->tls) || ps_rpc_addr_is_loopback(addr) || (sec && sec->allow_insecure))
        return PS_OK;
    return ps_err_set(err, PS_ERR_PERMISSION_DENIED,
                      "%s \"%s\": plaintext gRPC is only allowed on loopback addresses; "
                      "enable TLS (security.tls with security.cert/security.key/security.ca) "
                      "or set security.allow_insecure: true to send it unencrypted", side, addr);
}

static grpc_server_credentials *server_credentials(const ps_rpc_security *sec, ps_err *err) {
    if (!sec || !sec->tls) return grpc_insecure_server_credentials_create();
    grpc_server_credentials *creds = NULL;
    char *cert = read_pem("server certificate", sec->cert_file, "CERTIFICATE", err);
    char *key = cert ? read_pem("server key", sec->key_file, "PRIVATE KEY", err) : NULL;
    char *ca = NULL;
    if (key && sec->mutual_tls) {
        if (!has(sec->ca_file))
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                       "TLS: mutual TLS needs a CA file to verify client certificates (security.ca)");
        else
            ca = read_pem("client CA", sec->ca_file, "CERTIFICATE", err);
    }
    if (key && (!sec->mutual_tls || ca)) {
        grpc_ssl_pem_key_cert_pair pair = {key, cert};
        creds = grpc_ssl_server_credentials_create_ex(
            ca, &pair, 1,
            sec->mutual_tls ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            NULL);
        if (!creds) ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "TLS: gRPC refused the server certificate/key");
    }
    free(cert);
    free(key);
    free(ca);
    return creds;
}

static grpc_channel_credentials *channel_credentials(const ps_rpc_security *sec, ps_err *err) {
    if (!sec || !sec->tls) return grpc_insecure_credentials_create();
    char *ca = NULL, *cert = NULL, *key = NULL;
    grpc_channel_credentials *creds = NULL;
    if (has(sec->ca_file) && !(ca = read_pem("CA", sec->ca_file, "CERTIFICATE", err))) goto out;
    if (has(sec->cert_file) != has(sec->key_file)) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                   "TLS: a client certificate needs both its certificate and its key file");
        goto out;
    }
    if (has(sec->cert_file) &&
        (!(cert = read_pem("client certificate", sec->cert_file, "CERTIFICATE", err)) ||
         !(key = read_pem("client key", sec->key_file, "PRIVATE KEY", err))))
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {key, cert};
    creds = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
    if (!creds) ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "TLS: gRPC refused the client credentials");
out:
    free(ca);
    free(cert);
    free(key);
    return creds;
}

#define MAX_ARGS 16

static void arg_int(grpc_arg *args, int *n, const char *key, int value) {
    if (value < 0) return;
    PS_ASSERT(*n < MAX_ARGS);
    args[*n].type = GRPC_ARG_INTEGER;
    args[*n].key = (char *)key;
    args[*n].value.integer = value;
    (*n)++;
}

/* Channel args shared by server and client. args must hold MAX_ARGS entries. */
static grpc_channel_args make_args(grpc_arg *args, int max_message_bytes,
                                   int is_server, const ps_rpc_security *sec,
                                   const ps_rpc_server_opts *o, grpc_resource_quota *quota) {
    int n = 0;
    if (max_message_bytes > 0) {
        arg_int(args, &n, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, max_message_bytes);
        arg_int(args, &n, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, max_message_bytes);
    }
    if (is_server) {
        /* gRPC sets SO_REUSEPORT by default on Linux, which would let a
         * second psd bind a port that is already in use without an error. */
        arg_int(args, &n, GRPC_ARG_ALLOW_REUSEPORT, 0);
        /* Accept the clients' keepalive pings (below), and probe idle
         * connections of vanished peers so they are closed. */
        arg_int(args, &n, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 4000);
        arg_int(args, &n, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
        arg_int(args, &n, GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
        arg_int(args, &n, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
        /* Limits against hostile clients (docs/security.md): streams per
         * connection, connection age, no BDP probing (its window growth lets
         * a client make gRPC buffer megabytes per stream before psd reads
         * them), the transport's memory under a quota. */
        arg_int(args, &n, GRPC_ARG_MAX_CONCURRENT_STREAMS, o->max_streams_per_connection);
        arg_int(args, &n, GRPC_ARG_HTTP2_BDP_PROBE, 0);
        if (o->max_connection_age_ms > 0) {
            arg_int(args, &n, GRPC_ARG_MAX_CONNECTION_AGE_MS, o->max_connection_age_ms);
            arg_int(args, &n, GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, o->max_connection_age_grace_ms);
        }
        if (quota) {
            PS_ASSERT(n < MAX_ARGS);
            args[n].type = GRPC_ARG_POINTER;
            args[n].key = (char *)GRPC_ARG_RESOURCE_QUOTA;
            args[n].value.pointer.p = quota;
            args[n].value.pointer.vtable = grpc_resource_quota_arg_vtable();
            n++;
        }
    } else {
        /* A cut link shows up within ~15 s as UNAVAILABLE while a call waits. */
        arg_int(args, &n, GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
        arg_int(args, &n, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
        arg_int(args, &n, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
        /* Reconnect within 5 s once a cut link or a restarted psd is back;
         * ps_rpc_client_call resets the backoff after UNAVAILABLE. The
         * resolver's cooldown between re-resolutions (30 s by default)
         * otherwise keeps pick_first failing fast with the old error for
         * 5-10 s after the server is back (measured on a killed and
         * restarted psd): 200 ms. */
        arg_int(args, &n, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
        arg_int(args, &n, GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 200);
        if (sec && sec->tls && has(sec->server_name)) {
            args[n].type = GRPC_ARG_STRING;
            args[n].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
            args[n].value.string = (char *)sec->server_name;
            n++;
        }
    }
    grpc_channel_args ca = {(size_t)n, args};
    return ca;
}

/* ---- server ------------------------------------------------------------ */

enum { TAG_REQUEST, TAG_RECV, TAG_CLOSE, TAG_SEND, NTAGS };
#define PS_RPC_CLIENT_KEY 96

/* Calls a client holds, per class (s->mu). */
/* Streams a connection reset before sending their message, in the
 * current one-second window (HTTP/2 rapid reset detection). */
#define PS_RPC_RESET_SLOTS 64
typedef struct conn_resets {
    char peer[PS_RPC_CLIENT_KEY];
    long long window;   /* now_ms() / 1000 of the window */
    int n;
    int cut;            /* already cut in this window */
} conn_resets;

typedef struct client_slot {
    char key[PS_RPC_CLIENT_KEY];
    int n[2];
} client_slot;
enum { CLASS_ORDINARY = 0, CLASS_RESERVED = 1, NCLASSES };

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
    int close_cancelled;         /* RECV_CLOSE_ON_SERVER's output */
    const ps_rpc_method *m;
    int cls;                     /* CLASS_*, counted in s->ncalls[cls] if counted */
    int counted;
    int who;                     /* index of the caller's token, -1 if none */
    int batches;                 /* outstanding batches */
    int queued;                  /* waiting for a worker */
    int handler_running;
    int deferred, completed;     /* ps_rpc_call_defer / ps_rpc_call_complete called */
    int replied;                 /* status handed to gRPC */
    int cancelled;               /* ended (or will end) without our reply */
    int cancel_fired;
    int finished;                /* gRPC side released; s no longer used */
    ps_rpc_cancel_fn on_cancel;
    void *cancel_arg;
    struct ps_rpc_call *next;    /* work queue link */
    /* admission (s->mu): the client it is counted for, the watch list of
     * accepted calls (until finished), and since when (monotonic ms, 0 =
     * not) it waits for its request message / for its reply to be taken
     * (__atomic: set under c->mu, read by the scan under s->mu) */
    char client[PS_RPC_CLIENT_KEY];
    char peer[PS_RPC_CLIENT_KEY];   /* "ipv4:127.0.0.1:5678": the connection */
    int got_message;                /* RECV_MESSAGE succeeded */
    int timed_out;                  /* cancelled by scan_timeouts */
    int conn_counted;               /* in s->conns */
    struct ps_rpc_call *wprev, *wnext;
    int watched;
    long long recv_since, send_since;
};

typedef struct work_queue {
    ps_rpc_call *head, *tail;
    pthread_cond_t cv;
} work_queue;

typedef struct rpc_worker {
    ps_rpc_server *s;
    int cls;
    pthread_t thread;
    int running;
} rpc_worker;

struct ps_rpc_server {
    grpc_server *server;
    grpc_completion_queue *cq;          /* every call's batches and requests */
    grpc_completion_queue *shutdown_cq;
    pthread_t event_threads[PS_RPC_EVENT_THREADS];
    int event_running;                  /* event threads started */
    rpc_worker *workers;                /* opts.threads ordinary, then reserved */
    int nworkers;
    ps_rpc_server_opts opts;            /* defaults filled in */
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
    unsigned long long conns_cut;
    atomic_ullong bytes_received, bytes_sent; /* message payloads, both ways */
    int ncalls[NCLASSES];               /* accepted, unfinished calls */
    work_queue q[NCLASSES];
    int workers_stop;
    client_slot *clients;               /* clients holding calls */
    int nclients, cap_clients;
    client_slot *conns;                 /* connections (peers) holding call objects: n[0] calls, n[1] cut */
    int nconns, cap_conns;
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
};

static long long now_ms(void) {
    gpr_timespec t = gpr_now(GPR_CLOCK_MONOTONIC);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Copy what a peer controls (method path, peer string) into dst for a log
 * line: printable ASCII as is, everything else (newlines, ESC, bytes >=
 * 0x7f) as \xNN, cut at n - 1 bytes with "..." so nothing can forge or
 * flood a log line. */
static void escape(char *dst, size_t n, const unsigned char *src, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = src[i];
        int plain = ch >= 0x20 && ch < 0x7f && ch != '\\';
        size_t need = plain ? 1 : 4;
        if (o + need + 4 > n) {
            if (o + 4 <= n) memcpy(dst + o, "...", 3), o += 3;
            break;
        }
        if (plain) dst[o++] = (char)ch;
        else o += (size_t)snprintf(dst + o, n - o, "\\x%02x", ch);
    }
    if (n) dst[o < n ? o : n - 1] = '\0';
}

static void escape_slice(char *dst, size_t n, grpc_slice sl) {
    escape(dst, n, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl));
}

static void escape_str(char *dst, size_t n, const char *src) {
    escape(dst, n, (const unsigned char *)(src ? src : "?"), src ? strlen(src) : 1);
}

/* The client a call is counted for: its token's name, or the peer host
 * ("ipv4:127.0.0.1:5678" -> "ipv4:127.0.0.1", "ipv6:[::1]:5" ->
 * "ipv6:[::1]"). */
static void client_key(char *dst, size_t n, const char *token_name, const char *peer) {
    if (token_name) {
        snprintf(dst, n, "token:%s", token_name);
        return;
    }
    snprintf(dst, n, "%s", peer ? peer : "?");
    if (strncmp(dst, "unix", 4) == 0) return;
    char *colon = strrchr(dst, ':');
    char *bracket = strrchr(dst, ']');
    if (colon && (!bracket || colon > bracket) && colon != strchr(dst, ':')) *colon = '\0';
}

/* With s->mu held: the slot of key in a table of slots. */
static client_slot *slot_find(client_slot **tab, int *n, int *cap, const char *key, int create) {
    for (int i = 0; i < *n; i++)
        if (!strcmp((*tab)[i].key, key)) return &(*tab)[i];
    if (!create) return NULL;
    if (*n == *cap) {
        int ncap = *cap ? 2 * *cap : 16;
        client_slot *c = realloc(*tab, (size_t)ncap * sizeof *c);
        if (!c) return NULL;
        *tab = c;
        *cap = ncap;
    }
    client_slot *c = &(*tab)[(*n)++];
    memset(c, 0, sizeof *c);
    snprintf(c->key, sizeof c->key, "%s", key);
    return c;
}

static client_slot *client_find(ps_rpc_server *s, const char *key, int create) {
    return slot_find(&s->clients, &s->nclients, &s->cap_clients, key, create);
}

/* With s->mu held: one more call object from connection peer. 1 when the
 * connection should be cut: it holds more call objects than any client
 * that keeps to SETTINGS_MAX_CONCURRENT_STREAMS could (its streams end
 * faster than psd can even finish them: HTTP/2 rapid reset). */
static int conn_add_locked(ps_rpc_server *s, const char *peer) {
    client_slot *c = slot_find(&s->conns, &s->nconns, &s->cap_conns, peer, 1);
    if (!c) return 0;
    c->n[0]++;
    if (c->n[0] <= 8 * s->opts.max_streams_per_connection + 64 || c->n[1]) return 0;
    c->n[1] = 1;
    s->conns_cut++;
    return 1;
}

static void conn_release_locked(ps_rpc_server *s, const char *peer) {
    client_slot *c = slot_find(&s->conns, &s->nconns, &s->cap_conns, peer, 0);
    if (c && --c->n[0] <= 0) *c = s->conns[--s->nconns];
}

/* With s->mu held: one call of class cls of client key ended. */
static void client_release(ps_rpc_server *s, const char *key, int cls) {
    client_slot *c = client_find(s, key, 0);
    if (!c) return;
    c->n[cls]--;
    if (c->n[0] <= 0 && c->n[1] <= 0) *c = s->clients[--s->nclients];
}

/* With s->mu held: connection peer reset one more stream before sending its
 * message. 1 when it passed opts.max_resets_per_s in this second and
 * should be cut (once per window). */
static int note_reset_locked(ps_rpc_server *s, const char *peer) {
    long long w = now_ms() / 1000;
    conn_resets *slot = NULL, *oldest = &s->resets[0];
    for (int i = 0; i < PS_RPC_RESET_SLOTS; i++) {
        conn_resets *r = &s->resets[i];
        if (!strcmp(r->peer, peer)) { slot = r; break; }
        if (r->window < oldest->window) oldest = r;
    }
    if (!slot) {
        slot = oldest;
        snprintf(slot->peer, sizeof slot->peer, "%s", peer);
        slot->window = w;
        slot->n = 0;
        slot->cut = 0;
    }
    if (slot->window != w) {
        slot->window = w;
        slot->n = 0;
        slot->cut = 0;
    }
    if (++slot->n <= s->opts.max_resets_per_s || slot->cut) return 0;
    slot->cut = 1;
    s->conns_cut++;
    return 1;
}

/* The "ipv4:1.2.3.4:5" / "ipv6:[::1]:5" form gRPC gives peers. */
static int format_peer(const struct sockaddr_storage *ss, char *dst, size_t n) {
    char host[INET6_ADDRSTRLEN];
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(dst, n, "ipv4:%s:%u", host, ntohs(a->sin_port));
        return 1;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
            inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], host, sizeof host);
            snprintf(dst, n, "ipv4:%s:%u", host, ntohs(a->sin6_port));
        } else {
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            snprintf(dst, n, "ipv6:[%s]:%u", host, ntohs(a->sin6_port));
        }
        return 1;
    }
    return 0;
}

/* Close the connection to peer (HTTP/2 rapid reset: gRPC 1.51 has no limit
 * of its own, and its core API cannot close one connection). psd finds the
 * connection's socket among its descriptors and shuts it down: gRPC sees the
 * end of the stream and closes the transport with all its calls; the fd
 * itself stays gRPC's to close. */
static void cut_connection(ps_rpc_server *s, const char *peer, const char *why) {
    (void)s;
    DIR *d = opendir("/proc/self/fd");
    int cut = 0;
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || fd < 0 || fd == dirfd(d)) continue;
        struct stat st;
        if (fstat((int)fd, &st) || !S_ISSOCK(st.st_mode)) continue;
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        char name[PS_RPC_CLIENT_KEY];
        if (getpeername((int)fd, (struct sockaddr *)&ss, &len) || !format_peer(&ss, name, sizeof name) ||
            strcmp(name, peer))
            continue;
        if (shutdown((int)fd, SHUT_RDWR) == 0) cut++;
    }
    if (d) closedir(d);
    char esc[160];
    escape_str(esc, sizeof esc, peer);
    ps_log(PS_LOG_WARN, "rpc: connection %s %s (HTTP/2 rapid reset?): %s", esc, why,
           cut ? "connection closed" : "its socket was not found");
}

/* A refusal worth a log line, at most 10 lines a second (a flood of
 * refused calls must not become a flood of log writes). */
static void log_refusal(ps_rpc_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_refusal(ps_rpc_server *s, const char *fmt, ...) {
    double now = now_ms() / 1000.0;
    unsigned long long dropped = 0;
    pthread_mutex_lock(&s->mu);
    if (now - s->log_window >= 1.0) {
        dropped = s->log_dropped;
        s->log_dropped = 0;
        s->log_window = now;
        s->log_lines = 0;
    }
    int ok = s->log_lines < 10;
    if (ok) s->log_lines++;
    else s->log_dropped++;
    pthread_mutex_unlock(&s->mu);
    if (dropped)
        ps_log(PS_LOG_WARN, "rpc: %llu more refusals in the last second not logged", dropped);
    if (!ok) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    ps_log(PS_LOG_WARN, "%s", line);
}

static void arm_request(ps_rpc_server *s);

static ps_rpc_call *call_new(ps_rpc_server *s) {
    ps_rpc_call *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->s = s;
    pthread_mutex_init(&c->mu, NULL);
    atomic_init(&c->refs, 1);
    for (int i = 0; i < NTAGS; i++) c->tags[i] = (call_tag){c, i};
    c->who = -1;
    grpc_call_details_init(&c->details);
    grpc_metadata_array_init(&c->md);
    return c;
}

static void call_unref(ps_rpc_call *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* Does the application side still hold the call (so its grpc_call and
 * request must stay)? */
static int call_busy(const ps_rpc_call *c) {
    return c->queued || c->handler_running || (c->deferred && !c->completed && !c->cancelled);
}

/* Called with c->mu held; unlocks it. Releases the gRPC side of the call
 * once no batch is outstanding and the application is done with it; the
 * struct itself lives on while the owner of a deferred call holds it. */
static void call_unlock_maybe_finish(ps_rpc_call *c) {
    if (c->finished || c->batches > 0 || call_busy(c)) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->finished = 1;
    ps_rpc_server *s = c->s;
    c->s = NULL;
    if (c->recv) grpc_byte_buffer_destroy(c->recv);
    if (c->send) grpc_byte_buffer_destroy(c->send);
    c->recv = c->send = NULL;
    if (c->replied) grpc_slice_unref(c->status_details);
    grpc_call_details_destroy(&c->details);
    grpc_metadata_array_destroy(&c->md);
    if (c->call) grpc_call_unref(c->call);
    c->call = NULL;
    int counted = c->counted, cls = c->cls;
    /* a stream that ended, unanswered, before its request message arrived */
    int reset = c->peer[0] && !c->got_message && !c->timed_out && (c->cancelled || c->close_cancelled);
    pthread_mutex_unlock(&c->mu);
    /* The server outlives every unfinished call (the event thread leaves
     * only at live == 0); s must not be touched after this unlock. */
    pthread_mutex_lock(&s->mu);
    s->live--;
    if (counted) {
        s->ncalls[cls]--;
        client_release(s, c->client, cls);
    }
    if (c->watched) {
        if (c->wprev) c->wprev->wnext = c->wnext;
        else s->watch = c->wnext;
        if (c->wnext) c->wnext->wprev = c->wprev;
        c->watched = 0;
    }
    int cut = reset && note_reset_locked(s, c->peer);
    if (c->conn_counted) conn_release_locked(s, c->peer);
    pthread_mutex_unlock(&s->mu);
    if (cut) {
        char why[120];
        snprintf(why, sizeof why, "reset more than %d streams in one second before sending their messages",
                 s->opts.max_resets_per_s);
        cut_connection(s, c->peer, why);
    }
    call_unref(c);
}

/* Arm one more generic request for a new call (unless stopping). */
static void arm_request(ps_rpc_server *s) {
    if (atomic_load(&s->stopping)) return;
    pthread_mutex_lock(&s->mu);
    s->live++;
    pthread_mutex_unlock(&s->mu);
    ps_rpc_call *c = call_new(s);
    if (!c) {
        ps_log(PS_LOG_ERROR, "rpc: out of memory for a new call; one fewer request armed");
        pthread_mutex_lock(&s->mu);
        s->live--;
        pthread_mutex_unlock(&s->mu);
        return;
    }
    /* After shutdown has begun gRPC fails the request with an event, so a
     * race with ps_rpc_server_shutdown still ends in on_request. */
    grpc_call_error e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md,
                                                 s->cq, s->cq, &c->tags[TAG_REQUEST]);
    if (e != GRPC_CALL_OK) {
        ps_log(PS_LOG_ERROR, "rpc: grpc_server_request_call: %s", grpc_call_error_to_string(e));
        pthread_mutex_lock(&c->mu);
        call_unlock_maybe_finish(c);
    }
}

static const ps_rpc_method *find_method(const ps_rpc_server *s, grpc_slice path) {
    for (int i = 0; i < s->nmethods; i++)
        if (grpc_slice_str_cmp(path, s->methods[i].path) == 0) return &s->methods[i];
    return NULL;
}

/* Constant-time comparison of a token with the bytes a client sent. */
static int token_equal(const char *tok, const unsigned char *got, size_t n) {
    size_t tl = strlen(tok);
    unsigned char diff = (unsigned char)(tl != n);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(got[i] ^ (unsigned char)tok[i < tl ? i : 0]);
    return diff == 0 && tl > 0;
}

/* With tokens configured: who may make this call? GRPC_STATUS_OK and
 * c->who set, or UNAUTHENTICATED / PERMISSION_DENIED with details. */
static grpc_status_code call_authorize(ps_rpc_call *c, char *details, size_t dlen) {
    const ps_rpc_server *s = c->s;
    if (s->ntokens == 0) return GRPC_STATUS_OK;
    const grpc_slice *val = NULL;
    for (size_t i = 0; i < c->md.count; i++)
        if (grpc_slice_str_cmp(c->md.metadata[i].key, "authorization") == 0) {
            val = &c->md.metadata[i].value;
            break;
        }
    if (!val) {
        snprintf(details, dlen, "no credentials: this server needs the metadata "
                 "'authorization: Bearer <token>' (security.token_file on the trainer)");
        return GRPC_STATUS_UNAUTHENTICATED;
    }
    const unsigned char *v = GRPC_SLICE_START_PTR(*val);
    size_t n = GRPC_SLICE_LENGTH(*val);
    if (n < 7 || strncasecmp((const char *)v, "Bearer ", 7) != 0) {
        snprintf(details, dlen, "authorization metadata is not 'Bearer <token>'");
        return GRPC_STATUS_UNAUTHENTICATED;
    }
    v += 7;
    n -= 7;
    int who = -1;
    for (int i = 0; i < s->ntokens; i++)  /* no early exit: same time for every token */
        if (token_equal(s->tokens[i].token, v, n) && who < 0) who = i;
    if (who < 0) {
        snprintf(details, dlen, "invalid token");
        return GRPC_STATUS_UNAUTHENTICATED;
    }
    c->who = who;
    const char *const *m = s->tokens[who].methods;
    if (!m) return GRPC_STATUS_OK;
    for (; *m; m++)
        if (grpc_slice_str_cmp(c->details.method, *m) == 0) return GRPC_STATUS_OK;
    char method[160];
    escape_slice(method, sizeof method, c->details.method);
    snprintf(details, dlen, "token '%s' may not call %s", s->tokens[who].name, method);
    return GRPC_STATUS_PERMISSION_DENIED;
}

/* gRPC's auth metadata processor (runs on a gRPC thread for every new
 * stream, before the call reaches the application): is there a valid
 * bearer token? Which methods it may call is checked later, in
 * call_authorize, which also names the holder. */
static void transport_auth(void *state, grpc_auth_context *ctx, const grpc_metadata *md, size_t nmd,
                           grpc_process_auth_metadata_done_cb cb, void *user_data) {
    (void)ctx;
    ps_rpc_server *s = state;
    const grpc_slice *val = NULL;
    for (size_t i = 0; i < nmd; i++)
        if (grpc_slice_str_cmp(md[i].key, "authorization") == 0) val = &md[i].value;
    int ok = 0;
    if (val && GRPC_SLICE_LENGTH(*val) > 7 &&
        strncasecmp((const char *)GRPC_SLICE_START_PTR(*val), "Bearer ", 7) == 0) {
        const unsigned char *v = GRPC_SLICE_START_PTR(*val) + 7;
        size_t n = GRPC_SLICE_LENGTH(*val) - 7;
        for (int i = 0; i < s->ntokens; i++) ok |= token_equal(s->tokens[i].token, v, n);
    }
    if (ok) {
        /* consumed nothing: call_authorize reads the header again */
        cb(user_data, NULL, 0, NULL, 0, GRPC_STATUS_OK, NULL);
        return;
    }
    /* A flood of calls without a valid token (more than max_resets_per_s in
     * a second): pass them on to call_authorize, which refuses them just
     * the same but knows their connection, so that a connection that
     * floods is found and closed (on_request) - here gRPC says nothing
     * about where a call comes from. */
    long long w = now_ms() / 1000;
    long long cur = atomic_load(&s->auth_window);
    if (cur != w && atomic_compare_exchange_strong(&s->auth_window, &cur, w)) atomic_store(&s->auth_fails, 0);
    if (atomic_fetch_add(&s->auth_fails, 1) >= s->opts.max_resets_per_s) {
        cb(user_data, NULL, 0, NULL, 0, GRPC_STATUS_OK, NULL);
        return;
    }
    atomic_fetch_add(&s->refused_auth, 1);
    cb(user_data, NULL, 0, NULL, 0, GRPC_STATUS_UNAUTHENTICATED,
       val ? "invalid token" : "no credentials: this server needs the metadata "
       "'authorization: Bearer <token>' (security.token_file on the trainer)");
}

static void start_batch_locked(ps_rpc_call *c, const grpc_op *ops, size_t n, int tag, const char *what) {
    c->batches++;
    grpc_call_error e = grpc_call_start_batch(c->call, ops, n, &c->tags[tag], NULL);
    if (e != GRPC_CALL_OK) {
        c->batches--;
        c->cancelled = 1;
        ps_log(PS_LOG_ERROR, "rpc: start_batch (%s): %s", what, grpc_call_error_to_string(e));
    }
}

/* With c->mu held: hand the reply to gRPC. Takes resp. Returns 1 if sent,
 * 0 if the call was cancelled (resp destroyed). */
static int reply_locked(ps_rpc_call *c, grpc_byte_buffer *resp, grpc_status_code code,
                        const char *details) {
    PS_ASSERT(!c->replied);
    if ((code != GRPC_STATUS_OK || c->cancelled || c->finished) && resp) { /* never sent, never leaked */
        grpc_byte_buffer_destroy(resp);
        resp = NULL;
    }
    if (c->cancelled || c->finished) return 0;
    if (code == GRPC_STATUS_OK && !resp) resp = grpc_raw_byte_buffer_create(NULL, 0);
    if (resp) atomic_fetch_add(&c->s->bytes_sent, grpc_byte_buffer_length(resp));
    c->send = resp;
    c->status_details = grpc_slice_from_copied_string(details);
    c->replied = 1;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    /* initial metadata goes with the reply, not with the receive: a call
     * reset before its message costs psd no write */
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = 0;
    n++;
    if (resp) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = resp;
        n++;
    }
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.trailing_metadata_count = 0;
    ops[n].data.send_status_from_server.status = code;
    ops[n].data.send_status_from_server.status_details = &c->status_details;
    n++;
    if (c->counted) __atomic_store_n(&c->send_since, now_ms(), __ATOMIC_RELAXED);
    start_batch_locked(c, ops, n, TAG_SEND, "reply");
    return 1;
}

/* Refuse an accepted call without reading its message. */
static void call_refuse(ps_rpc_call *c, grpc_status_code code, const char *details) {
    pthread_mutex_lock(&c->mu);
    c->status_details = grpc_slice_from_copied_string(details);
    c->replied = 1;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 0;
    ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[1].data.send_status_from_server.trailing_metadata_count = 0;
    ops[1].data.send_status_from_server.status = code;
    ops[1].data.send_status_from_server.status_details = &c->status_details;
    ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[2].data.recv_close_on_server.cancelled = &c->close_cancelled;
    start_batch_locked(c, ops, 3, TAG_SEND, "refuse");
    call_unlock_maybe_finish(c);
}

/* Event thread: a requested call arrived (metadata only). */
static void on_request(ps_rpc_call *c, int success) {
    ps_rpc_server *s = c->s;
    if (!success) { /* server shutting down */
        pthread_mutex_lock(&c->mu);
        call_unlock_maybe_finish(c);
        return;
    }
    arm_request(s);  /* the next call needs no worker to be free */

    char details[PS_RPC_DETAILS_MAX];
    details[0] = '\0';
    char method[160], peer[160];
    escape_slice(method, sizeof method, c->details.method);
    char *rawpeer = grpc_call_get_peer(c->call);
    snprintf(c->peer, sizeof c->peer, "%s", rawpeer ? rawpeer : "");
    pthread_mutex_lock(&s->mu);
    int cut = conn_add_locked(s, c->peer);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&c->mu);
    c->conn_counted = 1;
    pthread_mutex_unlock(&c->mu);
    if (cut) cut_connection(s, c->peer, "holds far more calls than its concurrent stream limit allows "
                            "(server.max_streams_per_connection)");
    escape_str(peer, sizeof peer, rawpeer);
    grpc_status_code code = call_authorize(c, details, sizeof details);
    if (code != GRPC_STATUS_OK) {
        atomic_fetch_add(&s->refused_auth, 1);
        log_refusal(s, "rpc: %s from %s refused: %s: %s", method, peer, ps_grpc_code_name(code), details);
        gpr_free(rawpeer);
        call_refuse(c, code, details);
        return;
    }
    c->m = find_method(s, c->details.method);
    if (!c->m) {
        snprintf(details, sizeof details, "unknown method %s", method);
        ps_log(PS_LOG_DEBUG, "rpc: %s from %s -> UNIMPLEMENTED", method, peer);
        gpr_free(rawpeer);
        call_refuse(c, GRPC_STATUS_UNIMPLEMENTED, details);
        return;
    }
    c->cls = c->m->reserved ? CLASS_RESERVED : CLASS_ORDINARY;
    client_key(c->client, sizeof c->client, c->who >= 0 ? s->tokens[c->who].name : NULL, rawpeer);
    gpr_free(rawpeer);
    int cap = c->cls == CLASS_RESERVED ? s->opts.max_reserved_calls : s->opts.max_calls;
    /* reserved calls: the same fraction of their cap, at least 2 */
    int ccap = s->opts.max_calls_per_client;
    if (c->cls == CLASS_RESERVED) {
        ccap = (int)((long long)s->opts.max_reserved_calls * s->opts.max_calls_per_client / s->opts.max_calls);
        if (ccap < 2) ccap = 2;
    }
    double now = now_ms() / 1000.0;
    pthread_mutex_lock(&s->mu);
    int n = s->ncalls[c->cls], mine = -1;
    client_slot *cs = NULL;
    if (n < cap) {
        cs = client_find(s, c->client, 1);
        mine = cs ? cs->n[c->cls] : ccap;
        if (mine < ccap) {
            s->ncalls[c->cls]++;
            cs->n[c->cls]++;
            c->counted = 1;
            c->watched = 1;
            c->wprev = NULL;
            c->wnext = s->watch;
            if (s->watch) s->watch->wprev = c;
            s->watch = c;
        } else {
            s->refused_client++;
            if (cs && cs->n[0] <= 0 && cs->n[1] <= 0) *cs = s->clients[--s->nclients];
        }
    } else {
        s->refused_busy++;
        if (c->cls == CLASS_ORDINARY) {
            if (now - s->sat_last > 1.0) s->sat_start = now;
            s->sat_last = now;
        }
    }
    pthread_mutex_unlock(&s->mu);
    if (!c->counted) {
        if (mine < 0)
            snprintf(details, sizeof details, "server busy: %d %scalls in progress (limit %d); retry later",
                     n, c->cls == CLASS_RESERVED ? "reserved " : "", cap);
        else
            snprintf(details, sizeof details, "too many calls from one client: %s holds %d %scalls "
                     "(limit %d per client, server.max_calls_per_client); retry later", c->client, mine,
                     c->cls == CLASS_RESERVED ? "reserved " : "", ccap);
        log_refusal(s, "rpc: %s from %s refused: RESOURCE_EXHAUSTED: %s", method, peer, details);
        call_refuse(c, GRPC_STATUS_RESOURCE_EXHAUSTED, details);
        return;
    }
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->recv_since, now_ms(), __ATOMIC_RELAXED);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[0].data.recv_close_on_server.cancelled = &c->close_cancelled;
    start_batch_locked(c, ops, 1, TAG_CLOSE, "close");
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_MESSAGE;
    ops[0].data.recv_message.recv_message = &c->recv;
    if (!c->cancelled) start_batch_locked(c, ops, 1, TAG_RECV, "recv");
    call_unlock_maybe_finish(c);
}

static void enqueue(ps_rpc_server *s, ps_rpc_call *c) {
    pthread_mutex_lock(&s->mu);
    work_queue *q = &s->q[c->cls];
    c->next = NULL;
    if (q->tail) q->tail->next = c;
    else q->head = c;
    q->tail = c;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Event thread: the request message arrived (or the call died first). */
static void on_recv(ps_rpc_call *c, int success) {
    pthread_mutex_lock(&c->mu);
    c->batches--;
    __atomic_store_n(&c->recv_since, 0, __ATOMIC_RELAXED);
    if (success && !c->cancelled) {
        c->got_message = 1;
        c->queued = 1;
        ps_rpc_server *s = c->s;
        if (c->recv) atomic_fetch_add(&s->bytes_received, grpc_byte_buffer_length(c->recv));
        pthread_mutex_unlock(&c->mu);
        enqueue(s, c);
        return;
    }
    c->cancelled = 1;  /* the close batch reports the end of the call */
    call_unlock_maybe_finish(c);
}

/* With c->mu held: should on_cancel run now? Takes a reference if so. */
static int cancel_due_locked(ps_rpc_call *c) {
    if (!c->deferred || c->completed || !c->cancelled || c->handler_running || c->cancel_fired ||
        !c->on_cancel)
        return 0;
    c->cancel_fired = 1;
    atomic_fetch_add(&c->refs, 1);
    return 1;
}

static void fire_cancel(ps_rpc_call *c) {
    c->on_cancel(c->cancel_arg, c);
    call_unref(c);
}

/* Event thread: the call ended (reply sent, or cancelled). */
static void on_close(ps_rpc_call *c, int success) {
    pthread_mutex_lock(&c->mu);
    c->batches--;
    if (!success || c->close_cancelled || !c->replied) c->cancelled = 1;
    int fire = cancel_due_locked(c);
    call_unlock_maybe_finish(c);
    if (fire) fire_cancel(c);
}

static void on_send(ps_rpc_call *c, int success) {
    (void)success;  /* a failed send shows up as cancelled on the close batch */
    pthread_mutex_lock(&c->mu);
    c->batches--;
    __atomic_store_n(&c->send_since, 0, __ATOMIC_RELAXED);
    call_unlock_maybe_finish(c);
}

static void call_event(call_tag *t, int success) {
    switch (t->kind) {
    case TAG_REQUEST: on_request(t->c, success); return;
    case TAG_RECV: on_recv(t->c, success); return;
    case TAG_CLOSE: on_close(t->c, success); return;
    case TAG_SEND: on_send(t->c, success); return;
    }
    PS_ASSERT(!"unknown call tag");
}

/* Worker: run the handler of a received call (or answer for it). */
static void run_call(ps_rpc_call *c) {
    pthread_mutex_lock(&c->mu);
    c->queued = 0;
    if (c->cancelled) {  /* the client went away while the call waited */
        call_unlock_maybe_finish(c);
        return;
    }
    c->handler_running = 1;
    ps_rpc_server *s = c->s;
    pthread_mutex_unlock(&c->mu);

    grpc_status_code code = GRPC_STATUS_OK;
    char details[PS_RPC_DETAILS_MAX];
    details[0] = '\0';
    grpc_byte_buffer *resp = NULL;
    char *method = grpc_slice_to_c_string(c->details.method);
    gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
    gpr_timespec deadline = gpr_convert_clock_type(c->details.deadline, GPR_CLOCK_MONOTONIC);
    if (gpr_time_cmp(deadline, now) <= 0) {
        code = GRPC_STATUS_DEADLINE_EXCEEDED;
        snprintf(details, sizeof details, "%s: deadline passed before the handler ran", method);
    } else {
        char *peer = grpc_call_get_peer(c->call);
        ps_rpc_call_info info = {method, peer ? peer : "", deadline,
                                 c->who >= 0 ? s->tokens[c->who].name : "", c};
        c->m->fn(s->user, &info, c->recv, &resp, &code, details, sizeof details);
        details[sizeof details - 1] = '\0';
        gpr_free(peer);
    }

    pthread_mutex_lock(&c->mu);
    c->handler_running = 0;
    int fire = 0;
    if (c->deferred) {
        if (resp) grpc_byte_buffer_destroy(resp);
        fire = cancel_due_locked(c);
    } else {
        if (code != GRPC_STATUS_OK && PS_LOG_DEBUG >= ps_log_get_level()) {
            char esc[PS_RPC_DETAILS_MAX];  /* details may quote what the client sent */
            escape_str(esc, sizeof esc, details);
            ps_log(PS_LOG_DEBUG, "rpc: %s -> %s: %s", method, ps_grpc_code_name(code), esc);
        }
        reply_locked(c, resp, code, details);
    }
    gpr_free(method);
    call_unlock_maybe_finish(c);
    if (fire) fire_cancel(c);
}

static void *worker_main(void *arg) {
    rpc_worker *w = arg;
    ps_rpc_server *s = w->s;
    work_queue *q = &s->q[w->cls];
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!q->head && !s->workers_stop) pthread_cond_wait(&q->cv, &s->mu);
        ps_rpc_call *c = q->head;
        if (c) {
            q->head = c->next;
            if (!q->head) q->tail = NULL;
        }
        pthread_mutex_unlock(&s->mu);
        if (!c) break;  /* stopping and nothing left */
        run_call(c);
    }
    return NULL;
}

/* Cancel calls that waited too long for their request message or for the
 * client to take their reply (a stalled or silent client): they hold a
 * call of their client's share and, for replies, the reply's bytes. */
static void scan_timeouts(ps_rpc_server *s) {
    enum { MAXCUT = 256 };
    ps_rpc_call *cut[MAXCUT];
    int why[MAXCUT];
    int n = 0;
    long long now = now_ms();
    pthread_mutex_lock(&s->mu);
    for (ps_rpc_call *c = s->watch; c && n < MAXCUT; c = c->wnext) {
        long long r = __atomic_load_n(&c->recv_since, __ATOMIC_RELAXED);
        long long w = __atomic_load_n(&c->send_since, __ATOMIC_RELAXED);
        int k = r && now - r > s->opts.recv_timeout_ms ? 1 : w && now - w > s->opts.send_timeout_ms ? 2 : 0;
        if (!k) continue;
        atomic_fetch_add(&c->refs, 1);
        why[n] = k;
        cut[n++] = c;
        if (k == 1) s->recv_timeouts++;
        else s->send_timeouts++;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        ps_rpc_call *c = cut[i];
        pthread_mutex_lock(&c->mu);
        __atomic_store_n(why[i] == 1 ? &c->recv_since : &c->send_since, 0, __ATOMIC_RELAXED);
        c->timed_out = 1;
        if (!c->finished && c->call) {
            char msg[200];
            snprintf(msg, sizeof msg, why[i] == 1
                     ? "request message not received within %d ms (server.recv_timeout_s)"
                     : "reply not taken by the client within %d ms (server.send_timeout_s)",
                     why[i] == 1 ? s->opts.recv_timeout_ms : s->opts.send_timeout_ms);
            grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED, msg, NULL);
        }
        pthread_mutex_unlock(&c->mu);
        call_unref(c);
    }
    if (n) log_refusal(s, "rpc: cancelled %d call%s that stalled (request never sent or reply never read)",
                       n, n == 1 ? "" : "s");
}

/* Serve events until stopping and no call or request is left, i.e. no live
 * call can start a batch on s->cq any more. */
static void event_loop(ps_rpc_server *s) {
    for (;;) {
        long long now = now_ms();
        long long due = atomic_load(&s->next_scan);
        if (now >= due && atomic_compare_exchange_strong(&s->next_scan, &due, now + 200))
            scan_timeouts(s);  /* one event thread at a time */
        pthread_mutex_lock(&s->mu);
        int done = atomic_load(&s->stopping) && s->live == 0;
        pthread_mutex_unlock(&s->mu);
        if (done) break;
        gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                       gpr_time_from_millis(100, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(s->cq, dl, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
        PS_ASSERT(ev.type == GRPC_OP_COMPLETE); /* queue shut down only after this loop */
        call_event(ev.tag, ev.success);
    }
}

static void *event_main(void *arg) {
    event_loop(arg);
    return NULL;
}

static void drain_and_destroy(grpc_completion_queue *cq) {
    if (!cq) return;
    grpc_completion_queue_shutdown(cq);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN) break;
    }
    grpc_completion_queue_destroy(cq);
}

/* ---- deferred replies -------------------------------------------------- */

ps_rpc_call *ps_rpc_call_defer(const ps_rpc_call_info *info, ps_rpc_cancel_fn on_cancel,
                               void *cancel_arg) {
    ps_rpc_call *c = info ? info->call : NULL;
    if (!c) return NULL;
    pthread_mutex_lock(&c->mu);
    PS_ASSERT(c->handler_running && !c->deferred); /* from the handler, once */
    c->deferred = 1;
    c->on_cancel = on_cancel;
    c->cancel_arg = cancel_arg;
    atomic_fetch_add(&c->refs, 1);  /* the owner's, released by ps_rpc_call_complete */
    pthread_mutex_unlock(&c->mu);
    return c;
}

int ps_rpc_call_complete(ps_rpc_call *c, grpc_byte_buffer *response, grpc_status_code code,
                         const char *details) {
    if (!c) {
        if (response) grpc_byte_buffer_destroy(response);
        return 0;
    }
    pthread_mutex_lock(&c->mu);
    PS_ASSERT(c->deferred && !c->completed); /* exactly once per deferred call */
    c->completed = 1;
    int sent = reply_locked(c, response, code, details ? details : "");
    if (!sent && !c->finished && code != GRPC_STATUS_OK)
        ps_log(PS_LOG_DEBUG, "rpc: deferred reply dropped: call already cancelled");
    call_unlock_maybe_finish(c);
    call_unref(c);
    return sent;
}

int ps_rpc_call_cancelled(ps_rpc_call *c) {
    if (!c) return 1;
    pthread_mutex_lock(&c->mu);
    int r = c->cancelled;
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* ---- server set-up and shutdown ---------------------------------------- */

ps_rpc_server *ps_rpc_server_create(const char *listen_addr, int nthreads,
                                    int max_message_bytes,
                                    const ps_rpc_method *methods, int nmethods,
                                    void *user, ps_err *err) {
    return ps_rpc_server_create_secure(listen_addr, nthreads, max_message_bytes, methods, nmethods,
                                       user, NULL, err);
}

ps_rpc_server *ps_rpc_server_create_secure(const char *listen_addr, int nthreads,
                                           int max_message_bytes,
                                           const ps_rpc_method *methods, int nmethods,
                                           void *user, const ps_rpc_security *sec,
                                           ps_err *err) {
    ps_rpc_server_opts o = {.threads = nthreads, .max_message_bytes = max_message_bytes};
    return ps_rpc_server_create_opts(listen_addr, &o, methods, nmethods, user, sec, err);
}

static void free_tokens(ps_rpc_token *t, int n) {
    if (!t) return;
    for (int i = 0; i < n; i++) {
        free((char *)t[i].token);
        free((char *)t[i].name);
        if (t[i].methods)
            for (const char *const *m = t[i].methods; *m; m++) free((char *)*m);
        free((void *)t[i].methods);
    }
    free(t);
}

/* Deep copy; NULL on out of memory (partial copies freed). */
static ps_rpc_token *copy_tokens(const ps_rpc_token *src, int n) {
    ps_rpc_token *t = calloc((size_t)n, sizeof *t);
    if (!t) return NULL;
    for (int i = 0; i < n; i++) {
        t[i].token = strdup(src[i].token ? src[i].token : "");
        t[i].name = strdup(src[i].name ? src[i].name : "");
        int ok = t[i].token && t[i].name;
        if (ok && src[i].methods) {
            size_t k = 0;
            while (src[i].methods[k]) k++;
            const char **m = calloc(k + 1, sizeof *m);
            t[i].methods = m;
            ok = m != NULL;
            for (size_t j = 0; ok && j < k; j++) ok = (m[j] = strdup(src[i].methods[j])) != NULL;
        }
        if (!ok) { free_tokens(t, i + 1); return NULL; }
    }
    return t;
}

ps_rpc_server *ps_rpc_server_create_opts(const char *listen_addr, const ps_rpc_server_opts *opts,
                                         const ps_rpc_method *methods, int nmethods,
                                         void *user, const ps_rpc_security *sec,
                                         ps_err *err) {
    if (!listen_addr || !*listen_addr) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "rpc server: empty listen address");
        return NULL;
    }
    ps_rpc_server_opts o = opts ? *opts : (ps_rpc_server_opts){0};
    if (o.reserved_threads == 0) o.reserved_threads = PS_RPC_DEFAULT_RESERVED_THREADS;
    if (o.max_calls == 0) o.max_calls = PS_RPC_DEFAULT_MAX_CALLS;
    if (o.max_reserved_calls == 0) o.max_reserved_calls = PS_RPC_DEFAULT_MAX_RESERVED_CALLS;
    if (o.max_calls_per_client == 0) o.max_calls_per_client = o.max_calls;
    if (o.max_streams_per_connection == 0) o.max_streams_per_connection = PS_RPC_DEFAULT_MAX_STREAMS;
    if (o.transport_memory_bytes == 0) o.transport_memory_bytes = PS_RPC_DEFAULT_TRANSPORT_MEMORY;
    if (o.recv_timeout_ms == 0) o.recv_timeout_ms = PS_RPC_DEFAULT_RECV_TIMEOUT_MS;
    if (o.send_timeout_ms == 0) o.send_timeout_ms = PS_RPC_DEFAULT_SEND_TIMEOUT_MS;
    if (o.max_connection_age_grace_ms <= 0) o.max_connection_age_grace_ms = 60000;
    if (o.max_resets_per_s == 0) o.max_resets_per_s = PS_RPC_DEFAULT_MAX_RESETS;
    if (o.threads < 1 || o.reserved_threads < 1 || o.max_calls < 1 || o.max_reserved_calls < 1 ||
        o.max_calls_per_client < 1 || o.max_streams_per_connection < 1 || o.recv_timeout_ms < 1 ||
        o.send_timeout_ms < 1 ||
        nmethods < 0 || (nmethods > 0 && !methods)) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                   "rpc server %s: need >= 1 threads (got %d), >= 1 reserved threads (got %d), "
                   "call limits >= 1 (got %d, %d) and a method table",
                   listen_addr, o.threads, o.reserved_threads, o.max_calls, o.max_reserved_calls);
        return NULL;
    }
    if (check_plaintext(listen_addr, sec, "rpc server: listen address", err)) return NULL;
    for (int i = 0; sec && i < sec->ntokens; i++)
        if (!sec->tokens[i].token || strlen(sec->tokens[i].token) < 16) {
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "rpc server: token '%s' is shorter than 16 "
                       "characters; use a long random secret", sec->tokens[i].name ? sec->tokens[i].name : "?");
            return NULL;
        }
    ps_rpc_server *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    pthread_mutex_init(&s->mu, NULL);
    for (int i = 0; i < NCLASSES; i++) pthread_cond_init(&s->q[i].cv, NULL);
    if (sec && sec->ntokens > 0) {
        if (!(s->tokens = copy_tokens(sec->tokens, sec->ntokens))) goto oom;
        s->ntokens = sec->ntokens;
    }
    atomic_init(&s->stopping, 0);
    s->user = user;
    s->opts = o;

    s->nworkers = o.threads + o.reserved_threads;
    s->addr = strdup(listen_addr);
    s->workers = calloc((size_t)s->nworkers, sizeof *s->workers);
    s->methods = calloc((size_t)(nmethods ? nmethods : 1), sizeof *s->methods);
    if (!s->addr || !s->workers || !s->methods) goto oom;
    for (int i = 0; i < nmethods; i++) {
        PS_ASSERT(methods[i].path && methods[i].fn);
        s->methods[i] = methods[i];
        s->methods[i].path = strdup(methods[i].path);
        if (!s->methods[i].path) goto oom;
        s->nmethods = i + 1;
    }
    for (int i = 0; i < s->nworkers; i++)
        s->workers[i] = (rpc_worker){s, i < o.threads ? CLASS_ORDINARY : CLASS_RESERVED, 0, 0};

    grpc_server_credentials *creds = server_credentials(sec, err);
    if (!creds) {
        ps_err_prefix(err, "rpc server %s", listen_addr);
        ps_rpc_server_free(s);
        return NULL;
    }
    /* Tokens checked in the transport, before a call is created for the
     * application: a client without a valid token costs no call object. */
    if (s->ntokens > 0) {
        grpc_auth_metadata_processor proc = {transport_auth, NULL, s};
        grpc_server_credentials_set_auth_metadata_processor(creds, proc);
    }
    if (o.transport_memory_bytes > 0) {
        s->quota = grpc_resource_quota_create("psd");
        grpc_resource_quota_resize(s->quota, (size_t)o.transport_memory_bytes);
    }
    grpc_arg args[MAX_ARGS];
    grpc_channel_args ca = make_args(args, o.max_message_bytes, 1, sec, &o, s->quota);
    s->server = grpc_server_create(&ca, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    s->shutdown_cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->shutdown_cq, NULL);

    s->port = grpc_server_add_http2_port(s->server, listen_addr, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0) {
        ps_err_set(err, PS_ERR_UNAVAILABLE,
                   "rpc server: cannot listen on \"%s\" (address in use, "
                   "not local, or not a valid host:port)", listen_addr);
        ps_rpc_server_free(s);
        return NULL;
    }
    if (strncmp(listen_addr, "unix:", 5) == 0) s->port = 0;
    return s;

oom:
    ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "rpc server %s: out of memory", listen_addr);
    ps_rpc_server_free(s);
    return NULL;
}

ps_status ps_rpc_server_check(const char *listen_addr, const ps_rpc_security *sec, ps_err *err) {
    if (check_plaintext(listen_addr, sec, "rpc server: listen address", err)) return err ? err->code : PS_ERR_PERMISSION_DENIED;
    for (int i = 0; sec && i < sec->ntokens; i++)
        if (!sec->tokens[i].token || strlen(sec->tokens[i].token) < 16)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "rpc server: token '%s' is shorter than 16 "
                              "characters; use a long random secret",
                              sec->tokens[i].name ? sec->tokens[i].name : "?");
    grpc_server_credentials *creds = server_credentials(sec, err);
    if (!creds) {
        ps_err_prefix(err, "rpc server %s", listen_addr);
        return err ? err->code : PS_ERR_INVALID_ARGUMENT;
    }
    grpc_server_credentials_release(creds);
    return PS_OK;
}

static void stop_workers(ps_rpc_server *s) {
    pthread_mutex_lock(&s->mu);
    s->workers_stop = 1;
    for (int i = 0; i < NCLASSES; i++) pthread_cond_broadcast(&s->q[i].cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nworkers; i++) {
        if (!s->workers[i].running) continue;
        pthread_join(s->workers[i].thread, NULL);
        s->workers[i].running = 0;
    }
}

ps_status ps_rpc_server_start(ps_rpc_server *s, ps_err *err) {
    if (s->started || s->shut_down)
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION,
                          "rpc server %s: already started or shut down", s->addr);
    /* Workers first: a received call must always find its workers. */
    for (int i = 0; i < s->nworkers; i++) {
        rpc_worker *w = &s->workers[i];
        int rc = pthread_create(&w->thread, NULL, worker_main, w);
        if (rc != 0) {
            stop_workers(s);
            s->workers_stop = 0;
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                              "rpc server %s: cannot start worker %d: %s", s->addr, i,
                              strerror(rc));
        }
        w->running = 1;
    }
    grpc_server_start(s->server);
    s->started = 1;
    for (int i = 0; i < PS_RPC_REQUESTS_ARMED; i++) arm_request(s);
    for (int i = 0; i < PS_RPC_EVENT_THREADS; i++) {
        int rc = pthread_create(&s->event_threads[i], NULL, event_main, s);
        if (rc != 0) {  /* with none, ps_rpc_server_shutdown runs the event loop itself */
            if (s->event_running) break;
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                              "rpc server %s: cannot start the event thread: %s", s->addr,
                              strerror(rc));
        }
        s->event_running++;
    }
    return PS_OK;
}

void ps_rpc_server_shutdown(ps_rpc_server *s, int grace_ms) {
    if (!s || !s->server || s->shut_down) return;
    s->shut_down = 1;
    atomic_store(&s->stopping, 1);
    grpc_server_shutdown_and_notify(s->server, s->shutdown_cq, s);
    gpr_timespec dl = grace_ms > 0
        ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(grace_ms, GPR_TIMESPAN))
        : gpr_inf_past(GPR_CLOCK_MONOTONIC);
    grpc_event ev = grpc_completion_queue_next(s->shutdown_cq, dl, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        grpc_server_cancel_all_calls(s->server);
        if (s->started && !s->event_running) event_loop(s);  /* no event thread: serve here */
        ev = grpc_completion_queue_next(s->shutdown_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    }
    PS_ASSERT(ev.type == GRPC_OP_COMPLETE && ev.tag == s);
    if (s->event_running) {
        for (int i = 0; i < s->event_running; i++) pthread_join(s->event_threads[i], NULL);
        s->event_running = 0;
    } else if (s->started) {
        event_loop(s);
    }
    stop_workers(s);
}

void ps_rpc_server_free(ps_rpc_server *s) {
    if (!s) return;
    if (s->server) {
        ps_rpc_server_shutdown(s, 0);
        grpc_server_destroy(s->server);
    }
    drain_and_destroy(s->cq);
    drain_and_destroy(s->shutdown_cq);
    if (s->methods)
        for (int i = 0; i < s->nmethods; i++) free((char *)s->methods[i].path);
    free(s->methods);
    free_tokens(s->tokens, s->ntokens);
    if (s->quota) grpc_resource_quota_unref(s->quota);
    free(s->clients);
    free(s->conns);
    free(s->workers);
    free(s->addr);
    for (int i = 0; i < NCLASSES; i++) pthread_cond_destroy(&s->q[i].cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int ps_rpc_server_port(const ps_rpc_server *s) {
    return s ? s->port : 0;
}

int ps_rpc_server_calls(ps_rpc_server *s) {
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    int n = s->ncalls[CLASS_ORDINARY] + s->ncalls[CLASS_RESERVED];
    pthread_mutex_unlock(&s->mu);
    return n;
}

void ps_rpc_server_admission(ps_rpc_server *s, ps_rpc_admission *out) {
    memset(out, 0, sizeof *out);
    if (!s) return;
    double now = now_ms() / 1000.0;
    pthread_mutex_lock(&s->mu);
    out->calls = s->ncalls[CLASS_ORDINARY];
    out->reserved_calls = s->ncalls[CLASS_RESERVED];
    out->clients = s->nclients;
    out->refused_busy = s->refused_busy;
    out->refused_client = s->refused_client;
    out->recv_timeouts = s->recv_timeouts;
    out->send_timeouts = s->send_timeouts;
    if (s->sat_last > 0 && now - s->sat_last <= 1.0) out->saturated_s = now - s->sat_start;
    pthread_mutex_unlock(&s->mu);
    out->refused_auth = atomic_load(&s->refused_auth);
    pthread_mutex_lock(&s->mu);
    out->conns_cut = s->conns_cut;
    pthread_mutex_unlock(&s->mu);
    out->bytes_received = atomic_load(&s->bytes_received);
    out->bytes_sent = atomic_load(&s->bytes_sent);
}

/* ---- client ------------------------------------------------------------ */

struct ps_rpc_client {
    grpc_channel *channel;
    char *target;
    char *auth;   /* "Bearer <token>" or NULL */
    atomic_int unavailable;  /* the last call ended UNAVAILABLE */
};

ps_rpc_client *ps_rpc_client_create(const char *target, int max_message_bytes,
                                    ps_err *err) {
    return ps_rpc_client_create_secure(target, max_message_bytes, NULL, err);
}

ps_rpc_client *ps_rpc_client_create_secure(const char *target, int max_message_bytes,
                                           const ps_rpc_security *sec, ps_err *err) {
    if (!target || !*target) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "rpc client: empty target");
        return NULL;
    }
    if (check_plaintext(target, sec, "rpc client: server address", err)) return NULL;
    ps_rpc_client *c = calloc(1, sizeof *c);
    if (!c || !(c->target = strdup(target))) {
        free(c);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "rpc client %s: out of memory", target);
        return NULL;
    }
    if (sec && has(sec->token)) {
        size_t n = strlen(sec->token) + 8;
        if ((c->auth = malloc(n))) snprintf(c->auth, n, "Bearer %s", sec->token);
        if (!c->auth) {
            free(c->target);
            free(c);
            ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "rpc client %s: out of memory", target);
            return NULL;
        }
    }
    grpc_channel_credentials *creds = channel_credentials(sec, err);
    if (!creds) {
        ps_err_prefix(err, "rpc client %s", target);
        free(c->auth);
        free(c->target);
        free(c);
        return NULL;
    }
    grpc_arg args[MAX_ARGS];
    grpc_channel_args ca = make_args(args, max_message_bytes, 0, sec, NULL, NULL);
    c->channel = grpc_channel_create(target, creds, &ca);
    grpc_channel_credentials_release(creds);
    if (!c->channel) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "rpc client: cannot create a channel to \"%s\"",
                   target);
        free(c->auth);
        free(c->target);
        free(c);
        return NULL;
    }
    return c;
}

void ps_rpc_client_free(ps_rpc_client *c) {
    if (!c) return;
    grpc_channel_destroy(c->channel);
    free(c->auth);
    free(c->target);
    free(c);
}

ps_status ps_rpc_client_call(ps_rpc_client *c, const char *method,
                             const grpc_byte_buffer *request,
                             grpc_byte_buffer **response, int timeout_ms,
                             grpc_status_code *code, char *details,
                             size_t details_len, ps_err *err) {
    *response = NULL;
    *code = GRPC_STATUS_UNKNOWN;
    if (details && details_len) details[0] = '\0';
    /* After UNAVAILABLE (psd restarting, a link down) the caller's own
     * retry decides when to try again: let this call reconnect now instead
     * of failing fast until gRPC's reconnect backoff expires (measured:
     * 4-10 s after a restarted psd was serving again). */
    if (atomic_exchange(&c->unavailable, 0)) grpc_channel_reset_connect_backoff(c->channel);

    gpr_timespec deadline = timeout_ms > 0
        ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN))
        : gpr_inf_future(GPR_CLOCK_MONOTONIC);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_slice mslice = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                               mslice, NULL, deadline, NULL);
    grpc_slice_unref(mslice);
    if (!call) {
        grpc_completion_queue_shutdown(cq);
        grpc_completion_queue_destroy(cq);
        return ps_err_set(err, PS_ERR_INTERNAL, "rpc %s %s: cannot create call", c->target, method);
    }

    /* SEND_MESSAGE empties its buffer: send a copy (shares the slices). */
    grpc_byte_buffer *send = request ? grpc_byte_buffer_copy((grpc_byte_buffer *)request)
                                     : grpc_raw_byte_buffer_create(NULL, 0);
    grpc_byte_buffer *recv = NULL;
    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_status_code status = GRPC_STATUS_UNKNOWN;
    grpc_slice status_details = grpc_empty_slice();
    const char *error_string = NULL;

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    grpc_metadata auth_md;
    memset(&auth_md, 0, sizeof auth_md);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 0;
    if (c->auth) {
        auth_md.key = grpc_slice_from_static_string("authorization");
        auth_md.value = grpc_slice_from_static_string(c->auth);
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &auth_md;
    }
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &status;
    ops[5].data.recv_status_on_client.status_details = &status_details;
    ops[5].data.recv_status_on_client.error_string = &error_string;

    ps_status ret = PS_OK;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, ops, NULL);
    if (e != GRPC_CALL_OK) {
        ret = ps_err_set(err, PS_ERR_INTERNAL, "rpc %s %s: grpc_call_start_batch: %s",
                         c->target, method, grpc_call_error_to_string(e));
    } else {
        /* The call's deadline guarantees completion; no timeout here. */
        grpc_event ev = grpc_completion_queue_pluck(cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        PS_ASSERT(ev.type == GRPC_OP_COMPLETE);
        *code = status;
        if (status == GRPC_STATUS_UNAVAILABLE) atomic_store(&c->unavailable, 1);
        if (details && details_len) {
            size_t n = GRPC_SLICE_LENGTH(status_details);
            if (n >= details_len) n = details_len - 1;
            memcpy(details, GRPC_SLICE_START_PTR(status_details), n);
            details[n] = '\0';
        }
        if (status != GRPC_STATUS_OK && error_string)
            ps_log(PS_LOG_DEBUG, "rpc %s %s: %s", c->target, method, error_string);
        if (status == GRPC_STATUS_OK) {
            *response = recv;
            recv = NULL;
        }
    }

    if (recv) grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(status_details);
    gpr_free((void *)error_string);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    grpc_completion_queue_destroy(cq);
    return ret;
}
