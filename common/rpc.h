/* rpc.h - generic unary gRPC over the gRPC core C API (1.51).
 *
 * Messages are opaque grpc_byte_buffers here; wire.h turns them into nanopb
 * structs. One server type that dispatches on the method path, one blocking
 * client call.
 *
 * Library lifetime: the caller owns grpc_init()/grpc_shutdown(). Call
 * grpc_init() once before creating any server or client and grpc_shutdown()
 * after every server and client has been freed. Block SIGINT/SIGTERM (and
 * anything else you want to handle in one place) with pthread_sigmask BEFORE
 * grpc_init(), so that gRPC's internal threads inherit the mask; this module
 * blocks no signals itself.
 *
 * Server threading model:
 *  - nthreads worker threads, each with its own completion queue and a few
 *    outstanding generic grpc_server_request_call()s (PS_RPC_SLOTS_PER_THREAD).
 *  - Per call, on the worker that accepted it: batch {SEND_INITIAL_METADATA,
 *    RECV_MESSAGE}; then the handler runs on that worker thread; then batch
 *    {SEND_MESSAGE (only on OK), SEND_STATUS_FROM_SERVER,
 *    RECV_CLOSE_ON_SERVER}. So up to nthreads handlers run concurrently:
 *    handlers must synchronise any shared state themselves, and a slow
 *    handler holds up the other calls queued on its worker.
 *  - Nothing interrupts a running handler; info->deadline (monotonic clock)
 *    says when the client gives up.
 *
 * Client: one channel per ps_rpc_client; each call creates its own
 * completion queue, so a client may be used by several threads at once
 * (they share the HTTP/2 connection).
 */
#ifndef PS_RPC_H
#define PS_RPC_H

#include <stddef.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/status.h>
#include <grpc/support/time.h>

#include "status.h"

#define PS_RPC_SLOTS_PER_THREAD 4  /* outstanding request_calls per worker */
#define PS_RPC_DETAILS_MAX 512     /* size of the details buffer handlers get */

/* ---- status mapping ---------------------------------------------------- */

ps_status ps_status_from_grpc(grpc_status_code code);
grpc_status_code ps_grpc_from_status(ps_status s);
/* "OK", "INVALID_ARGUMENT", ...; never NULL. */
const char *ps_grpc_code_name(grpc_status_code code);

/* ---- transport security and authentication ---------------------------- *
 *
 * One struct for both ends; each end reads the fields marked for it.
 *  - tls = 0: plaintext, allowed only on loopback addresses (127.0.0.0/8,
 *    [::1], localhost, unix:) unless allow_insecure is set; anything else
 *    is refused with PERMISSION_DENIED naming the address.
 *  - tls = 1, server: cert_file/key_file are its PEM certificate chain and
 *    key; with mutual_tls it requires a client certificate signed by a CA in
 *    ca_file. Client: ca_file holds the CA(s) that signed the server's
 *    certificate (NULL or "": the system's roots); cert_file/key_file, when
 *    set, are its own certificate for mutual TLS; server_name, when set, is
 *    the name checked in the server's certificate instead of the target's
 *    host.
 *  - Tokens (server): with ntokens > 0 every call must carry the metadata
 *    "authorization: Bearer <token>" of one of them; the check happens
 *    before the request message is read. No or an unknown token ->
 *    UNAUTHENTICATED; a token whose methods list lacks the method ->
 *    PERMISSION_DENIED. Tokens are compared in constant time.
 *    Client: token, when set, is sent with every call.
 * Files are read when the server or client is created; a missing or
 * non-PEM file is an error naming the file. */
typedef struct ps_rpc_token {
    const char *token;          /* the secret */
    const char *name;           /* who holds it, for logs (call_info.principal) */
    const char *const *methods; /* NULL-terminated paths it may call; NULL = all */
} ps_rpc_token;

typedef struct ps_rpc_security {
    int tls;
    const char *cert_file, *key_file, *ca_file;
    int mutual_tls;             /* server */
    const char *server_name;    /* client */
    int allow_insecure;         /* plaintext beyond loopback */
    const ps_rpc_token *tokens; /* server; copied */
    int ntokens;
    const char *token;          /* client */
} ps_rpc_security;

/* 1 if addr ("127.0.0.1:5", "[::1]:5", "localhost:5", "unix:/x",
 * "dns:///localhost:5", "ipv4:127.0.0.1:5") names this host only. */
int ps_rpc_addr_is_loopback(const char *addr);

/* ---- server ------------------------------------------------------------ */

typedef struct ps_rpc_server ps_rpc_server;

typedef struct ps_rpc_call_info {
    const char *method;    /* "/ps.ParameterServer/Forward" */
    const char *peer;      /* "ipv4:127.0.0.1:51234" */
    gpr_timespec deadline; /* GPR_CLOCK_MONOTONIC; inf_future when none */
    const char *principal; /* name of the caller's token; "" without tokens */
} ps_rpc_call_info;

/* A method handler. On entry *code == GRPC_STATUS_OK, *response == NULL,
 * details[0] == '\0'. request is NULL or a buffer owned by the server (treat
 * NULL as an empty message; ps_wire_decode does). On OK set *response to a
 * new byte buffer (ownership passes to the server; leaving it NULL sends an
 * empty message). On error set *code and write a message into details
 * (details_len bytes incl. NUL); a *response left set on error is destroyed
 * by the server, never sent, so error paths cannot leak it. */
typedef void (*ps_rpc_handler)(void *user, const ps_rpc_call_info *info,
                               const grpc_byte_buffer *request,
                               grpc_byte_buffer **response,
                               grpc_status_code *code,
                               char *details, size_t details_len);

typedef struct ps_rpc_method {
    const char *path;   /* "/ps.ParameterServer/Forward" */
    ps_rpc_handler fn;
} ps_rpc_method;

/* Create a server listening on listen_addr ("0.0.0.0:50051",
 * "127.0.0.1:0" for any free port, "[::]:50051", "unix:/path") with
 * nthreads >= 1 workers. max_message_bytes > 0 sets the receive and send
 * limits (gRPC's default is 4 MiB). methods (array and path strings) are
 * copied. SO_REUSEPORT is off, so a port already in use is an error.
 * Binding failure -> NULL with PS_ERR_UNAVAILABLE naming the address.
 * Methods not in the table are answered UNIMPLEMENTED naming the path. */
ps_rpc_server *ps_rpc_server_create(const char *listen_addr, int nthreads,
                                    int max_message_bytes,
                                    const ps_rpc_method *methods, int nmethods,
                                    void *user, ps_err *err);

/* Same with transport security and tokens (sec NULL = plaintext, loopback
 * only). A bad certificate or key file, or plaintext on a non-loopback
 * address without allow_insecure -> NULL and a message naming it. */
ps_rpc_server *ps_rpc_server_create_secure(const char *listen_addr, int nthreads,
                                           int max_message_bytes,
                                           const ps_rpc_method *methods, int nmethods,
                                           void *user, const ps_rpc_security *sec,
                                           ps_err *err);

/* Start accepting calls and the worker threads. Once only. */
ps_status ps_rpc_server_start(ps_rpc_server *s, ps_err *err);

/* Stop accepting new calls; let calls in flight finish for up to grace_ms
 * (<= 0: cancel at once), then cancel the rest (their clients see
 * CANCELLED/UNAVAILABLE); wait for running handlers to return and join the
 * workers. Idempotent; not to be called from a handler. */
void ps_rpc_server_shutdown(ps_rpc_server *s, int grace_ms);

/* Shut down (grace 0) if still running, then release everything. NULL ok. */
void ps_rpc_server_free(ps_rpc_server *s);

/* The port actually bound (useful with port 0); 0 for unix sockets. */
int ps_rpc_server_port(const ps_rpc_server *s);

/* ---- client ------------------------------------------------------------ */

typedef struct ps_rpc_client ps_rpc_client;

/* Channel to target ("127.0.0.1:50051", "dns:///host:port", "unix:/path").
 * Connects lazily: an unreachable server shows up as UNAVAILABLE on the
 * first call, not here. max_message_bytes > 0 sets both limits. */
ps_rpc_client *ps_rpc_client_create(const char *target, int max_message_bytes,
                                    ps_err *err);
/* Same with transport security and a token (sec NULL = plaintext, loopback
 * only). Channels keep the connection alive with HTTP/2 pings while calls
 * are in flight, so a dead peer surfaces as UNAVAILABLE, not a hang. */
ps_rpc_client *ps_rpc_client_create_secure(const char *target, int max_message_bytes,
                                           const ps_rpc_security *sec, ps_err *err);
void ps_rpc_client_free(ps_rpc_client *c);

/* Blocking unary call of method ("/ps.ParameterServer/Forward") with request
 * (NULL = empty message; not modified, still the caller's) and a deadline of
 * timeout_ms from now (<= 0: none). Returns PS_OK whenever the RPC completed,
 * whatever its status: *code and details (may be NULL / 0) carry it, and on
 * GRPC_STATUS_OK *response is the reply (the caller destroys it; NULL if
 * the server sent no message, which ps_wire_decode treats as empty). On any
 * other code *response is NULL. Returns an error (and *code = UNKNOWN) only
 * for local failures (call creation). */
ps_status ps_rpc_client_call(ps_rpc_client *c, const char *method,
                             const grpc_byte_buffer *request,
                             grpc_byte_buffer **response, int timeout_ms,
                             grpc_status_code *code, char *details,
                             size_t details_len, ps_err *err);

#endif
