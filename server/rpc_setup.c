/* rpc_setup.c - the server's set-up and end: options and their defaults,
 * credentials (TLS, mutual TLS, the token check in the transport), channel
 * args, the listening port, starting the workers and event threads, and
 * the shutdown sequence (rpc_server_impl.h). */
#include "rpc_server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>

#include "clock.h"
#include "log.h"

#define MAX_ARGS 16

static int has(const char *s) { return s && *s; }

static void drain_and_destroy(grpc_completion_queue *cq);

static grpc_server_credentials *server_credentials(const ps_rpc_security *sec, ps_err *err) {
    if (!sec || !sec->tls) return grpc_insecure_server_credentials_create();
    grpc_server_credentials *creds = NULL;
    char *cert = ps_rpc_read_pem("server certificate", sec->cert_file, "CERTIFICATE", err);
    char *key = cert ? ps_rpc_read_pem("server key", sec->key_file, "PRIVATE KEY", err) : NULL;
    char *ca = NULL;
    if (key && sec->mutual_tls) {
        if (!has(sec->ca_file))
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                       "TLS: mutual TLS needs a CA file to verify client certificates (security.ca)");
        else
            ca = ps_rpc_read_pem("client CA", sec->ca_file, "CERTIFICATE", err);
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

/* Whether gRPC takes creds for a listening port: the PEM files are read by
 * server_credentials, but gRPC's TLS layer parses them (and pairs the key
 * with the certificate, loads the CA) only when a port is added. A
 * throwaway server on an ephemeral loopback port, never started, tells. */
static ps_status tls_usable(grpc_server_credentials *creds, const ps_rpc_security *sec, ps_err *err) {
    if (!sec || !sec->tls) return PS_OK;
    grpc_server *srv = grpc_server_create(NULL, NULL);
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(srv, cq, NULL);
    int port = grpc_server_add_http2_port(srv, "127.0.0.1:0", creds);
    grpc_server_shutdown_and_notify(srv, cq, srv);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if ((ev.type == GRPC_OP_COMPLETE && ev.tag == srv) || ev.type == GRPC_QUEUE_SHUTDOWN) break;
    }
    grpc_server_destroy(srv);
    drain_and_destroy(cq);
    if (port) return PS_OK;
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "TLS: gRPC refused the server certificate %s with key %s%s%s "
                      "(does the key match the certificate? is each a valid PEM certificate/key?)",
                      sec->cert_file, sec->key_file, sec->mutual_tls ? " and client CA " : "",
                      sec->mutual_tls && sec->ca_file ? sec->ca_file : "");
}

/* The server's channel args; args must hold MAX_ARGS entries. */
static grpc_channel_args server_args(grpc_arg *args, const ps_rpc_server_opts *o, grpc_resource_quota *quota) {
    int n = 0;
    if (o->max_message_bytes > 0) {
        ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, o->max_message_bytes);
        ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, o->max_message_bytes);
    }
    /* gRPC sets SO_REUSEPORT by default on Linux, which would let a
     * second psd bind a port that is already in use without an error. */
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_ALLOW_REUSEPORT, 0);
    /* Accept the clients' keepalive pings (common/rpc.c), and probe idle
     * connections of vanished peers so they are closed. */
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 4000);
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
    /* Limits against hostile clients (docs/security.md): streams per
     * connection, connection age, no BDP probing (its window growth lets
     * a client make gRPC buffer megabytes per stream before psd reads
     * them), the transport's memory under a quota. */
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_MAX_CONCURRENT_STREAMS, o->max_streams_per_connection);
    ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_HTTP2_BDP_PROBE, 0);
    if (o->max_connection_age_s > 0) {
        ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_MAX_CONNECTION_AGE_MS,
                       o->max_connection_age_s * 1000 > 2e9 ? 2000000000 : (int)(o->max_connection_age_s * 1000));
        ps_rpc_arg_int(args, &n, MAX_ARGS, GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, o->max_connection_age_grace_ms);
    }
    if (quota) {
        PS_ASSERT(n < MAX_ARGS);
        args[n].type = GRPC_ARG_POINTER;
        args[n].key = (char *)GRPC_ARG_RESOURCE_QUOTA;
        args[n].value.pointer.p = quota;
        args[n].value.pointer.vtable = grpc_resource_quota_arg_vtable();
        n++;
    }
    grpc_channel_args ca = {(size_t)n, args};
    return ca;
}

int ps_rpc_calls_per_client(const ps_rpc_server_opts *o) {
    if (o->max_calls_per_client > 0) return o->max_calls_per_client;
    int max_calls = o->max_calls > 0 ? o->max_calls : PS_RPC_DEFAULT_MAX_CALLS;
    return max_calls / 4 > 0 ? max_calls / 4 : 1;
}

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
    if (o.max_calls_per_client == 0) o.max_calls_per_client = ps_rpc_calls_per_client(&o);
    if (o.max_streams_per_connection == 0) o.max_streams_per_connection = PS_RPC_DEFAULT_MAX_STREAMS;
    if (o.recv_timeout_s == 0) o.recv_timeout_s = PS_RPC_DEFAULT_RECV_TIMEOUT_S;
    if (o.send_timeout_s == 0) o.send_timeout_s = PS_RPC_DEFAULT_SEND_TIMEOUT_S;
    if (o.max_connection_age_grace_ms <= 0) o.max_connection_age_grace_ms = 60000;
    if (o.max_resets_per_s == 0) o.max_resets_per_s = PS_RPC_DEFAULT_MAX_RESETS;
    if (o.max_stalled_per_client == 0) o.max_stalled_per_client = PS_RPC_DEFAULT_MAX_STALLED;
    if (o.max_connections_per_client == 0) o.max_connections_per_client = PS_RPC_DEFAULT_MAX_CONNECTIONS;
    if (o.threads < 1 || o.reserved_threads < 1 || o.max_calls < 1 || o.max_reserved_calls < 1 ||
        o.max_calls_per_client < 1 || o.max_stalled_per_client < 1 || o.max_connections_per_client < 1 || o.max_streams_per_connection < 1 || !(o.recv_timeout_s >= 0.001) ||
        !(o.send_timeout_s >= 0.001) || o.transport_memory_mb < 0 || o.idle_poll_us < 0 ||
        nmethods < 0 || (nmethods > 0 && !methods)) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                   "rpc server %s: need >= 1 threads (got %d), >= 1 reserved threads (got %d), "
                   "call limits >= 1 (got %d, %d) and a method table",
                   listen_addr, o.threads, o.reserved_threads, o.max_calls, o.max_reserved_calls);
        return NULL;
    }
    if (ps_rpc_check_plaintext(listen_addr, sec, "rpc server: listen address", err)) return NULL;
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
    pthread_mutex_init(&s->standby_mu, NULL);
    ps_cond_init_mono(&s->standby_cv);
    if (sec && sec->ntokens > 0) {
        if (!(s->tokens = copy_tokens(sec->tokens, sec->ntokens))) goto oom;
        s->ntokens = sec->ntokens;
    }
    atomic_init(&s->stopping, 0);
    s->user = user;
    s->opts = o;
    s->recv_timeout_ms = o.recv_timeout_s * 1000 > 2e9 ? 2000000000 : (int)(o.recv_timeout_s * 1000);
    s->send_timeout_ms = o.send_timeout_s * 1000 > 2e9 ? 2000000000 : (int)(o.send_timeout_s * 1000);

    /* readers (tokens restricted to some methods) get workers of their own */
    for (int i = 0; sec && i < sec->ntokens; i++)
        if (sec->tokens[i].methods) s->has_readers = 1;
    s->nworkers = o.threads + o.reserved_threads + (s->has_readers ? o.reserved_threads : 0);
    s->addr = strdup(listen_addr);
    s->workers = calloc((size_t)s->nworkers, sizeof *s->workers);
    s->methods = calloc((size_t)(nmethods ? nmethods : 1), sizeof *s->methods);
    if (o.profile && !(s->prof = calloc((size_t)(nmethods ? nmethods : 1), sizeof *s->prof))) goto oom;
    if (!s->addr || !s->workers || !s->methods) goto oom;
    for (int i = 0; i < nmethods; i++) {
        PS_ASSERT(methods[i].path && methods[i].fn);
        s->methods[i] = methods[i];
        s->methods[i].path = strdup(methods[i].path);
        if (!s->methods[i].path) goto oom;
        s->nmethods = i + 1;
    }
    for (int i = 0; i < s->nworkers; i++)
        s->workers[i] = (rpc_worker){s, i < o.threads ? CLASS_ORDINARY
                                        : i < o.threads + o.reserved_threads ? CLASS_RESERVED : CLASS_READER, 0, 0};
    for (int i = 0; i < s->nworkers; i++) {
        pthread_cond_init(&s->workers[i].cv, NULL);
        s->workers[i].poll_us = o.idle_poll_us;
    }
    s->ncv = s->nworkers;
    /* a call goes to its connection's last worker (rpc_worker); =0 for
     * one FIFO per class taken by whichever worker wakes, to compare */
    const char *e = getenv("PS_RPC_AFFINITY");
    s->affinity = !(e && *e == '0');
    e = getenv("PS_RPC_LATE_CLOSE");
    s->late_close = !(e && *e == '0');

    grpc_server_credentials *creds = server_credentials(sec, err);
    if (!creds) {
        ps_err_prefix(err, "rpc server %s", listen_addr);
        ps_rpc_server_free(s);
        return NULL;
    }
    /* Tokens checked in the transport, before a call is created for the
     * application: a client without a valid token costs no call object. */
    if (s->ntokens > 0) {
        grpc_auth_metadata_processor proc = {rpc_transport_auth, NULL, s};
        grpc_server_credentials_set_auth_metadata_processor(creds, proc);
    }
    if (o.transport_memory_mb > 0) {
        s->quota = grpc_resource_quota_create("psd");
        grpc_resource_quota_resize(s->quota, (size_t)o.transport_memory_mb << 20);
    }
    grpc_arg args[MAX_ARGS];
    grpc_channel_args ca = server_args(args, &o, s->quota);
    s->server = grpc_server_create(&ca, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->cq, NULL);
    s->shutdown_cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->server, s->shutdown_cq, NULL);

    s->port = grpc_server_add_http2_port(s->server, listen_addr, creds);
    grpc_server_credentials_release(creds);
    if (s->port == 0) {
        /* a certificate gRPC's TLS layer refuses fails here too: say so */
        grpc_server_credentials *again = sec && sec->tls ? server_credentials(sec, NULL) : NULL;
        ps_status tls = again ? tls_usable(again, sec, err) : PS_OK;
        if (again) grpc_server_credentials_release(again);
        if (tls)
            ps_err_prefix(err, "rpc server %s", listen_addr);
        else
            ps_err_set(err, PS_ERR_UNAVAILABLE,
                       "rpc server: cannot listen on \"%s\" (address in use, "
                       "not local, or not a valid host:port)", listen_addr);
        ps_rpc_server_free(s);
        return NULL;
    }
    if (strncmp(listen_addr, "unix:", 5) == 0) s->port = 0;
    if (o.local_socket[0] && rpc_local_create(s, o.local_socket, err)) {
        ps_rpc_server_free(s);
        return NULL;
    }
    return s;

oom:
    ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "rpc server %s: out of memory", listen_addr);
    ps_rpc_server_free(s);
    return NULL;
}

ps_status ps_rpc_server_check(const char *listen_addr, const ps_rpc_security *sec, ps_err *err) {
    if (ps_rpc_check_plaintext(listen_addr, sec, "rpc server: listen address", err)) return err ? err->code : PS_ERR_PERMISSION_DENIED;
    for (int i = 0; sec && i < sec->ntokens; i++)
        if (!sec->tokens[i].token || strlen(sec->tokens[i].token) < 16)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "rpc server: token '%s' is shorter than 16 "
                              "characters; use a long random secret",
                              sec->tokens[i].name ? sec->tokens[i].name : "?");
    grpc_server_credentials *creds = server_credentials(sec, err);
    ps_status st = creds ? tls_usable(creds, sec, err) : (err ? err->code : PS_ERR_INVALID_ARGUMENT);
    if (creds) grpc_server_credentials_release(creds);
    if (st) ps_err_prefix(err, "rpc server %s", listen_addr);
    return st;
}

static void stop_workers(ps_rpc_server *s) {
    pthread_mutex_lock(&s->mu);
    s->workers_stop = 1;
    for (int i = 0; i < NCLASSES; i++) pthread_cond_broadcast(&s->q[i].cv);
    for (int i = 0; i < s->nworkers; i++) pthread_cond_signal(&s->workers[i].cv);
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
        int rc = pthread_create(&w->thread, NULL, rpc_worker_main, w);
        if (rc != 0) {
            stop_workers(s);
            s->workers_stop = 0;
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                              "rpc server %s: cannot start worker %d: %s", s->addr, i,
                              strerror(rc));
        }
        w->running = 1;
    }
    ps_status lst = rpc_local_start(s, err);
    if (lst) {
        stop_workers(s);
        s->workers_stop = 0;
        return lst;
    }
    grpc_server_start(s->server);
    s->started = 1;
    for (int i = 0; i < PS_RPC_REQUESTS_ARMED; i++) rpc_arm_request(s);
    for (int i = 0; i < PS_RPC_EVENT_THREADS; i++) {
        int rc = pthread_create(&s->event_threads[i], NULL, rpc_event_main, s);
        if (rc != 0) {  /* with none, ps_rpc_server_shutdown runs the event loop itself */
            if (s->event_running) break;
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                              "rpc server %s: cannot start the event thread: %s", s->addr,
                              strerror(rc));
        }
        s->event_running++;
    }
    /* without it the event threads still scan, only later under a flood */
    s->watch_running = pthread_create(&s->watch_thread, NULL, rpc_watch_main, s) == 0;
    return PS_OK;
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

/* What an accepted call waits for now (log_outstanding); under c->mu. */
enum { WAIT_MESSAGE, WAIT_QUEUE, WAIT_HANDLER, WAIT_DEFERRED, WAIT_TAKEN, WAIT_CLOSE, NWAITS };
static const char *const wait_names[NWAITS] = {
    "waiting for their request message", "queued for a worker", "in their handler",
    "deferred by the service", "replies not taken by their client", "ending"};

static int call_wait_locked(const ps_rpc_call *c) {
    if (c->queued) return WAIT_QUEUE;
    if (c->handler_running) return WAIT_HANDLER;
    if (c->deferred && !c->completed && !c->cancelled) return WAIT_DEFERRED;
    if (__atomic_load_n(&c->send_since, __ATOMIC_RELAXED)) return WAIT_TAKEN;
    if (!c->got_message && !c->replied && !c->cancelled) return WAIT_MESSAGE;
    return WAIT_CLOSE;
}

/* The grace period is over and calls are still open: say which, by what
 * they wait for, with the oldest of each kind, so an operator can tell a
 * slow handler from a client that holds psd up. */
static void log_outstanding(ps_rpc_server *s, int grace_ms) {
    enum { MAXC = 1024 };
    ps_rpc_call **cs = malloc(MAXC * sizeof *cs);
    if (!cs) return;
    int n = 0;
    pthread_mutex_lock(&s->mu);
    int live = s->live;
    for (ps_rpc_call *c = s->watch; c && n < MAXC; c = c->wnext) {
        atomic_fetch_add(&c->refs, 1);
        cs[n++] = c;
    }
    pthread_mutex_unlock(&s->mu);
    int count[NWAITS] = {0}, open = 0;
    char oldest[NWAITS][200];
    long long now = ps_mono_ms();
    for (int i = 0; i < n; i++) {  /* the list is newest first: the oldest are last */
        ps_rpc_call *c = cs[n - 1 - i];
        pthread_mutex_lock(&c->mu);
        if (!c->finished) {
            int w = call_wait_locked(c);
            if (!count[w]++) {
                char method[80], peer[80];
                rpc_escape_slice(method, sizeof method, c->details.method);
                rpc_escape_str(peer, sizeof peer, c->peer);
                snprintf(oldest[w], sizeof oldest[w], "%s from %s, %.1f s old", method, peer,
                         (now - c->accepted_ms) / 1000.0);
            }
            open++;
        }
        pthread_mutex_unlock(&c->mu);
        rpc_call_unref(c);
    }
    free(cs);
    char line[1500];
    int o = snprintf(line, sizeof line, "rpc: shutdown grace (%d ms) over with %d accepted calls open", grace_ms, open);
    for (int w = 0; w < NWAITS; w++)
        if (count[w] && o < (int)sizeof line)
            o += snprintf(line + o, sizeof line - (size_t)o, "; %d %s (oldest: %s)", count[w], wait_names[w], oldest[w]);
    if (live > open && o < (int)sizeof line)  /* refused calls still sending their status */
        o += snprintf(line + o, sizeof line - (size_t)o, "; %d other calls", live - open);
    int nconn = rpc_count_connections(s);
    if (o < (int)sizeof line)
        o += snprintf(line + o, sizeof line - (size_t)o, "; %d connection%s open", nconn, nconn == 1 ? "" : "s");
    if (o < (int)sizeof line) snprintf(line + o, sizeof line - (size_t)o, ": cancelling them");
    ps_log(PS_LOG_WARN, "%s", line);
}

void ps_rpc_server_shutdown(ps_rpc_server *s, int grace_ms) {
    if (!s || !s->server || s->shut_down) return;
    s->shut_down = 1;
    atomic_store(&s->stopping, 1);
    grpc_server_shutdown_and_notify(s->server, s->shutdown_cq, s);
    long long t0 = ps_mono_ms();
    rpc_local_stop(s);
    gpr_timespec dl = grace_ms > 0
        ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(grace_ms, GPR_TIMESPAN))
        : gpr_inf_past(GPR_CLOCK_MONOTONIC);
    /* In slices: once no accepted call is open (calls waiting on their
     * client are cancelled after PS_RPC_SHUTDOWN_CLIENT_MS), what gRPC still
     * waits for is its connections: one whose client does not read cannot
     * take the GOAWAY, and holds the shutdown for the whole grace. */
    grpc_event ev;
    int idle = 0;
    for (;;) {
        gpr_timespec slice = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(100, GPR_TIMESPAN));
        int last = gpr_time_cmp(slice, dl) >= 0;
        ev = grpc_completion_queue_next(s->shutdown_cq, last ? dl : slice, NULL);
        if (ev.type != GRPC_QUEUE_TIMEOUT || last) break;
        if (ps_mono_ms() - t0 < PS_RPC_SHUTDOWN_CLIENT_MS) continue;
        pthread_mutex_lock(&s->mu);
        int none = s->watch == NULL;  /* every accepted call finished */
        pthread_mutex_unlock(&s->mu);
        if (none) {
            idle = 1;
            break;
        }
    }
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        if (idle) {
            int n = rpc_count_connections(s);
            ps_log(PS_LOG_WARN, "rpc: every call ended %lld ms into the shutdown, but gRPC still waits for %d "
                   "connection%s (clients not reading what psd sends?): closing them", ps_mono_ms() - t0, n,
                   n == 1 ? "" : "s");
        } else if (grace_ms > 0)
            log_outstanding(s, grace_ms);
        grpc_server_cancel_all_calls(s->server);
        if (s->started && !s->event_running) rpc_event_loop(s, 0);  /* no event thread: serve here */
        ev = grpc_completion_queue_next(s->shutdown_cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    }
    PS_ASSERT(ev.type == GRPC_OP_COMPLETE && ev.tag == s);
    rpc_local_finish(s, t0 + (grace_ms > 0 ? grace_ms : 0));
    if (s->watch_running) {
        atomic_store(&s->watch_stop, 1);
        pthread_join(s->watch_thread, NULL);
        s->watch_running = 0;
    }
    if (s->event_running) {
        for (int i = 0; i < s->event_running; i++) pthread_join(s->event_threads[i], NULL);
        s->event_running = 0;
    } else if (s->started) {
        rpc_event_loop(s, 0);
    }
    stop_workers(s);
}

void ps_rpc_server_free(ps_rpc_server *s) {
    if (!s) return;
    if (s->server) {
        ps_rpc_server_shutdown(s, 0);
        grpc_server_destroy(s->server);
    }
    rpc_local_free(s);
    drain_and_destroy(s->cq);
    drain_and_destroy(s->shutdown_cq);
    if (s->methods)
        for (int i = 0; i < s->nmethods; i++) free((char *)s->methods[i].path);
    free(s->methods);
    free(s->prof);
    free_tokens(s->tokens, s->ntokens);
    if (s->quota) grpc_resource_quota_unref(s->quota);
    free(s->clients);
    free(s->conns);
    free(s->prog);
    for (int i = 0; i < s->ncv; i++) pthread_cond_destroy(&s->workers[i].cv);
    free(s->workers);
    free(s->addr);
    for (int i = 0; i < NCLASSES; i++) pthread_cond_destroy(&s->q[i].cv);
    pthread_cond_destroy(&s->standby_cv);
    pthread_mutex_destroy(&s->standby_mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int ps_rpc_server_phases(ps_rpc_server *s, int method_id, ps_prof_acc *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; s && s->prof && i < s->nmethods; i++)
        if (s->methods[i].id == method_id) {
            ps_prof_acc_read(&s->prof[i], out);
            return 1;
        }
    return 0;
}

int ps_rpc_server_port(const ps_rpc_server *s) {
    return s ? s->port : 0;
}

