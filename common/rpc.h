/* rpc.h - generic unary gRPC over the gRPC core C API (1.51): what the
 * client and the server share, and the client.
 *
 * Messages are opaque grpc_byte_buffers here; wire.h turns them into nanopb
 * structs. This header: the mapping between ps_status and gRPC codes, the
 * transport security settings both ends read, and one blocking client call.
 * The server (psd's side: call life cycle, admission, connection policing,
 * set-up) is server/rpc_server.h.
 *
 * Library lifetime: the caller owns grpc_init()/grpc_shutdown(). Call
 * grpc_init() once before creating any server or client and grpc_shutdown()
 * after every server and client has been freed. Block SIGINT/SIGTERM (and
 * anything else you want to handle in one place) with pthread_sigmask BEFORE
 * grpc_init(), so that gRPC's internal threads inherit the mask; this module
 * blocks no signals itself.
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

#define PS_RPC_DETAILS_MAX 512     /* size of the details buffer handlers get */

/* Trailing metadata psd sends with a RESOURCE_EXHAUSTED of its admission
 * control (a client over its fair share of calls or context memory): the
 * call did nothing, and may be sent again as it is after at least this
 * many milliseconds (a decimal number). A RESOURCE_EXHAUSTED without it
 * (a message over server.max_message_mb, out of memory) is final
 * (docs/protocol.md, "Statuses"). */
#define PS_RPC_RETRY_AFTER_KEY "psd-retry-after-ms"
#define PS_RPC_RETRY_AFTER_MAX_MS 60000  /* a client reads no longer hint */

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
 * "dns:///localhost:5", "ipv4:127.0.0.1:5", "local:/x") names this host only. */
int ps_rpc_addr_is_loopback(const char *addr);

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
/* The same; on RESOURCE_EXHAUSTED *retry_after_ms (may be NULL) receives
 * psd's admission hint (PS_RPC_RETRY_AFTER_KEY), else 0. */
ps_status ps_rpc_client_call_ex(ps_rpc_client *c, const char *method,
                                const grpc_byte_buffer *request,
                                grpc_byte_buffer **response, int timeout_ms,
                                grpc_status_code *code, char *details,
                                size_t details_len, int *retry_after_ms, ps_err *err);


/* ---- for the two halves (common/rpc.c, server/rpc_*.c) ---------------- */

/* A whole PEM file (at most 1 MiB) that holds "-----BEGIN <...marker...>";
 * what names it in errors. The caller frees it. */
char *ps_rpc_read_pem(const char *what, const char *path, const char *marker, ps_err *err);
/* PERMISSION_DENIED naming addr when sec allows no plaintext there
 * (ps_rpc_security); side names the end ("rpc server: listen address"). */
ps_status ps_rpc_check_plaintext(const char *addr, const ps_rpc_security *sec, const char *side, ps_err *err);
/* Append the integer channel argument key = value to args (cap entries,
 * *n used); value < 0 appends nothing. */
void ps_rpc_arg_int(grpc_arg *args, int *n, int cap, const char *key, int value);

#endif
