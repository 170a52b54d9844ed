/* rpc_local.h - the local transport: psd's methods over a unix socket and
 * shared memory, for trainers on psd's own host (docs/protocol.md, "The
 * local transport"). What both ends share: the messages on the socket and
 * the layout of the shared memory. The server is server/rpc_local.c, the
 * client common/rpc_local.c behind ps_rpc_client (rpc.h, target
 * "local:PATH").
 *
 * Why: a call through gRPC on loopback costs psd a hand-off between gRPC's
 * threads and a worker, and ~5 wake-ups (docs/performance.md items 17, 23);
 * here the thread that reads a connection's request runs its handler, and
 * the request and reply bytes are copied once each way through memory both
 * processes map.
 *
 * The connection: an AF_UNIX SOCK_SEQPACKET socket (message boundaries
 * kept, the peer's uid known). The client opens it and sends one hello
 * with a memfd attached (SCM_RIGHTS): 2 x region bytes, sealed against
 * shrinking and growing, so that psd's mapping cannot fault under it. The
 * first region carries requests, the second replies. psd answers with a
 * hello reply (a status); then each call is one request message (the
 * method's path, the request's length in the first region, a deadline) and
 * one reply message (a status, the reply's length in the second region,
 * psd's retry hint, the details). One call at a time per connection: a
 * client with several threads opens several connections.
 *
 * psd copies a request out of the shared memory before it reads it (a
 * client may go on writing there) and writes a reply there only while the
 * client waits for it; lengths are checked against the region and
 * server.max_message_mb. Messages are in the host's byte order (both ends
 * are on one host). */
#ifndef PS_RPC_LOCAL_H
#define PS_RPC_LOCAL_H

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/status.h>

#include "status.h"

/* memfd seals (fcntl.h has them since glibc 2.27; both ends use them) */
#ifndef F_SEAL_SHRINK
#define F_ADD_SEALS 1033
#define F_GET_SEALS 1034
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#endif

#define PS_LOCAL_PREFIX "local:"           /* a target "local:/run/psd/local.sock" */
#define PS_LOCAL_MAGIC 0x314c5350u         /* "PSL1" */
#define PS_LOCAL_VERSION 1
#define PS_LOCAL_TOKEN_MAX 512             /* the longest bearer token a hello carries */
#define PS_LOCAL_PATH_MAX 128              /* the longest method path */
#define PS_LOCAL_DETAILS_MAX 512           /* details in a reply (incl. NUL) */
#define PS_LOCAL_REGION_MIN 4096           /* a region smaller than this is refused */

/* Client -> psd, once, with the memfd (SCM_RIGHTS). */
typedef struct ps_local_hello {
    uint32_t magic, version;
    uint64_t region;                       /* bytes per region; the memfd holds 2 x region */
    uint32_t token_len;                    /* 0: no token */
    char token[PS_LOCAL_TOKEN_MAX];
} ps_local_hello;

/* psd -> client: the hello's answer. code 0 (OK): calls may follow;
 * otherwise psd closes the socket after it. */
typedef struct ps_local_welcome {
    uint32_t magic;
    int32_t code;                          /* a grpc_status_code */
    int32_t retry_after_ms;                /* a refusal for a cap: connect again after this long; 0: final */
    uint32_t reserved;                     /* 0 */
    uint64_t max_request;                  /* the longest request psd takes (min(region, max_message)) */
    char details[PS_LOCAL_DETAILS_MAX];
} ps_local_welcome;

/* Client -> psd: a call. The request's bytes are at offset 0 of the memfd. */
typedef struct ps_local_request {
    uint32_t magic, seq;                   /* seq: the client's number for the call, echoed */
    uint64_t len;                          /* request bytes */
    int64_t timeout_ms;                    /* <= 0: no deadline */
    uint32_t path_len;
    char path[PS_LOCAL_PATH_MAX];          /* "/ps.ParameterServer/Forward", path_len bytes, no NUL */
} ps_local_request;

/* psd -> client: its answer. On OK the reply's bytes are at offset region. */
typedef struct ps_local_reply {
    uint32_t magic, seq;
    int32_t code;                          /* a grpc_status_code */
    int32_t retry_after_ms;                /* PS_RPC_RETRY_AFTER_KEY's value; 0: none */
    uint64_t len;                          /* reply bytes (0 unless OK) */
    char details[PS_LOCAL_DETAILS_MAX];    /* NUL-terminated */
} ps_local_reply;

/* Copy b's bytes (grpc_byte_buffer_length of them) to dst, the shared
 * memory, slice by slice; both ends write messages so. 0, or -1 when b
 * cannot be read. */
int ps_local_copy_out(const grpc_byte_buffer *b, unsigned char *dst);

/* ---- the client (common/rpc_local.c; used by ps_rpc_client) ----------- */

typedef struct ps_local_client ps_local_client;

/* A client of psd's local socket at path (connects on the first call).
 * region: bytes of shared memory each way (the largest request and reply:
 * the caller's max message size; at least PS_LOCAL_REGION_MIN); token: the
 * bearer token or NULL. Connections are opened as calls need them (one per
 * concurrent call) and kept. */
ps_local_client *ps_local_client_create(const char *path, size_t region, const char *token, ps_err *err);
void ps_local_client_free(ps_local_client *c);
/* ps_rpc_client_call_ex over the local transport (rpc.h has the contract).
 * A failure to reach psd is UNAVAILABLE, a passed deadline
 * DEADLINE_EXCEEDED (the connection is closed: psd cancels the call if it
 * still runs). */
ps_status ps_local_client_call(ps_local_client *c, const char *method, const grpc_byte_buffer *request,
                               grpc_byte_buffer **response, int timeout_ms, grpc_status_code *code,
                               char *details, size_t details_len, int *retry_after_ms, ps_err *err);

#endif
