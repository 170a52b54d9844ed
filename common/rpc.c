/* rpc.c - the half of the gRPC layer both sides use (rpc.h): status
 * mapping, transport security (loopback check, PEM files, the plaintext
 * rule) and the blocking client. The server is server/rpc_*.c. */
#include "rpc.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>

#include "log.h"
#include "rpc_local.h"

#define MAX_ARGS 16

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

int ps_rpc_addr_is_loopback(const char *a) {
    if (!a) return 0;
    if (!strncmp(a, "unix:", 5) || !strncmp(a, "unix-abstract:", 14) || !strncmp(a, PS_LOCAL_PREFIX, 6)) return 1;
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
char *ps_rpc_read_pem(const char *what, const char *path, const char *marker, ps_err *err) {
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

ps_status ps_rpc_check_plaintext(const char *addr, const ps_rpc_security *sec, const char *side,
                                 ps_err *err) {
    if ((sec && sec->tls) || ps_rpc_addr_is_loopback(addr) || (sec && sec->allow_insecure))
        return PS_OK;
    return ps_err_set(err, PS_ERR_PERMISSION_DENIED,
                      "%s \"%s\": plaintext gRPC is only allowed on loopback addresses; "
                      "enable TLS (security.tls with security.cert/security.key/security.ca) "
                      "or set security.allow_insecure: true to send it unencrypted", side, addr);
}

static grpc_channel_credentials *channel_credentials(const ps_rpc_security *sec, ps_err *err) {
    if (!sec || !sec->tls) return grpc_insecure_credentials_create();
    char *ca = NULL, *cert = NULL, *key = NULL;
    grpc_channel_credentials *creds = NULL;
    if (has(sec->ca_file) && !(ca = ps_rpc_read_pem("CA", sec->ca_file, "CERTIFICATE", err))) goto out;
    if (has(sec->cert_file) != has(sec->key_file)) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                   "TLS: a client certificate needs both its certificate and its key file");
        goto out;
    }
    if (has(sec->cert_file) &&
        (!(cert = ps_rpc_read_pem("client certificate", sec->cert_file, "CERTIFICATE", err)) ||
         !(key = ps_rpc_read_pem("client key", sec->key_file, "PRIVATE KEY", err))))
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

void ps_rpc_arg_int(grpc_arg *args, int *n, int cap, const char *key, int value) {
    if (value < 0) return;
    PS_ASSERT(*n < cap);
    args[*n].type = GRPC_ARG_INTEGER;
    args[*n].key = (char *)key;
    args[*n].value.integer = value;
    (*n)++;
}

/* The client's channel args; args must hold MAX_ARGS entries. */
static grpc_channel_args client_args(grpc_arg *args, int max_message_bytes, const ps_rpc_security *sec) {
    int n = 0;
    if (max_message_bytes > 0) {
        ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, max_message_bytes);
        ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, max_message_bytes);
    }
    /* A cut link shows up within ~15 s as UNAVAILABLE while a call waits. */
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    /* Reconnect within 5 s once a cut link or a restarted psd is back;
     * ps_rpc_client_call resets the backoff after UNAVAILABLE. The
     * resolver's cooldown between re-resolutions (30 s by default)
     * otherwise keeps pick_first failing fast with the old error for
     * 5-10 s after the server is back (measured on a killed and
     * restarted psd): 200 ms. */
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 200);
    if (sec && sec->tls && has(sec->server_name)) {
        args[n].type = GRPC_ARG_STRING;
        args[n].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[n].value.string = (char *)sec->server_name;
        n++;
    }
    grpc_channel_args ca = {(size_t)n, args};
    return ca;
}

/* ---- client ------------------------------------------------------------ */

struct ps_rpc_client {
    ps_local_client *local;  /* target "local:PATH" (rpc_local.h); then no channel */
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
    if (strncmp(target, PS_LOCAL_PREFIX, strlen(PS_LOCAL_PREFIX)) == 0) {
        /* psd's local socket: on this host, for psd's user only; no TLS to speak */
        ps_rpc_client *c = calloc(1, sizeof *c);
        if (!c || !(c->target = strdup(target))) {
            free(c);
            ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "rpc client %s: out of memory", target);
            return NULL;
        }
        size_t region = max_message_bytes > 0 ? (size_t)max_message_bytes : (size_t)4 << 20;
        c->local = ps_local_client_create(target + strlen(PS_LOCAL_PREFIX), region, sec ? sec->token : NULL, err);
        if (!c->local) {
            free(c->target);
            free(c);
            return NULL;
        }
        return c;
    }
    if (ps_rpc_check_plaintext(target, sec, "rpc client: server address", err)) return NULL;
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
    grpc_channel_args ca = client_args(args, max_message_bytes, sec);
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
    if (c->local) ps_local_client_free(c->local);
    if (c->channel) grpc_channel_destroy(c->channel);
    free(c->auth);
    free(c->target);
    free(c);
}

ps_status ps_rpc_client_call(ps_rpc_client *c, const char *method,
                             const grpc_byte_buffer *request,
                             grpc_byte_buffer **response, int timeout_ms,
                             grpc_status_code *code, char *details,
                             size_t details_len, ps_err *err) {
    return ps_rpc_client_call_ex(c, method, request, response, timeout_ms, code, details, details_len, NULL, err);
}

/* The value of PS_RPC_RETRY_AFTER_KEY in md, in ms (1..PS_RPC_RETRY_AFTER_MAX_MS); 0 when absent or not a
 * plain decimal number. */
static int retry_after_of(const grpc_metadata_array *md) {
    for (size_t i = 0; i < md->count; i++) {
        if (grpc_slice_str_cmp(md->metadata[i].key, PS_RPC_RETRY_AFTER_KEY)) continue;
        size_t n = GRPC_SLICE_LENGTH(md->metadata[i].value);
        const unsigned char *v = GRPC_SLICE_START_PTR(md->metadata[i].value);
        long ms = 0;
        if (n == 0 || n > 9) return 0;
        for (size_t k = 0; k < n; k++) {
            if (v[k] < '0' || v[k] > '9') return 0;
            ms = ms * 10 + (v[k] - '0');
        }
        if (ms > PS_RPC_RETRY_AFTER_MAX_MS) ms = PS_RPC_RETRY_AFTER_MAX_MS;
        return (int)ms;
    }
    return 0;
}

ps_status ps_rpc_client_call_ex(ps_rpc_client *c, const char *method,
                                const grpc_byte_buffer *request,
                                grpc_byte_buffer **response, int timeout_ms,
                                grpc_status_code *code, char *details,
                                size_t details_len, int *retry_after_ms, ps_err *err) {
    if (c->local)
        return ps_local_client_call(c->local, method, request, response, timeout_ms, code, details, details_len,
                                    retry_after_ms, err);
    *response = NULL;
    if (retry_after_ms) *retry_after_ms = 0;
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
        if (status == GRPC_STATUS_RESOURCE_EXHAUSTED && retry_after_ms) *retry_after_ms = retry_after_of(&trailing_md);
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

