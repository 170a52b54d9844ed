/* rpc_admission.c - who may call and how many calls the server holds:
 * bearer tokens (in the transport and per call), the method table, the
 * per-class and per-client call caps (stalled calls, capacity kept for
 * clients holding none, a reserved call per connection), the counters of
 * what was refused,
 * and refusal log lines that a flood cannot turn into a flood of writes. */
#include "rpc_server_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <grpc/grpc_security.h>

#include "clock.h"
#include "log.h"
#include "security.h"

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

void rpc_escape_slice(char *dst, size_t n, grpc_slice sl) {
    escape(dst, n, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl));
}

void rpc_escape_str(char *dst, size_t n, const char *src) {
    escape(dst, n, (const unsigned char *)(src ? src : "?"), src ? strlen(src) : 1);
}

/* The client a call is counted for: its token's name, or the peer host
 * ("ipv4:127.0.0.1:5678" -> "ipv4:127.0.0.1", "ipv6:[::1]:5" ->
 * "ipv6:[::1]"). */
_Static_assert(sizeof "token:" + PS_TOKEN_NAME_MAX <= PS_RPC_CLIENT_KEY,
               "a token's client key is whole: clients are told apart by their whole name");

static void client_key(char *dst, size_t n, const char *token_name, const char *peer) {
    if (token_name) {
        snprintf(dst, n, "token:%s", token_name);
        return;
    }
    rpc_peer_host(dst, n, peer);
}

static client_slot *client_find(ps_rpc_server *s, const char *key, int create) {
    return rpc_slot_find(&s->clients, &s->nclients, &s->cap_clients, key, create);
}

static void client_drop_if_idle(ps_rpc_server *s, client_slot *k) {
    for (int i = 0; i < NCLASSES; i++)
        if (k->n[i] > 0) return;
    if (k->stalled > 0) return;
    *k = s->clients[--s->nclients];
}

void rpc_client_unstall_locked(ps_rpc_server *s, ps_rpc_call *c) {
    if (!c->stalled) return;
    client_slot *k = client_find(s, c->client, 0);
    c->stalled = 0;
    s->nstalled--;
    if (k) k->stalled--;
    if (c->stalled_old) {
        c->stalled_old = 0;
        s->nold--;
        if (k) k->old--;
    }
}

/* All clients together may hold max_calls / 4 stalled calls, though one
 * holding none may always hold one. */
static int stalled_all(const ps_rpc_server *s) {
    return s->opts.max_calls / 4 > 0 ? s->opts.max_calls / 4 : 1;
}

int rpc_client_stall_old_locked(ps_rpc_server *s, ps_rpc_call *c) {
    if (!c->stalled || c->stalled_old) return 1;
    client_slot *k = client_find(s, c->client, 0);
    if (!k) return 1;
    if (k->old >= s->opts.max_stalled_per_client || (k->old > 0 && s->nold >= stalled_all(s))) return 0;
    c->stalled_old = 1;
    k->old++;
    s->nold++;
    return 1;
}

void rpc_client_release_locked(ps_rpc_server *s, ps_rpc_call *c) {
    if (c->conn_reserved) {
        client_slot *conn = rpc_slot_find(&s->conns, &s->nconns, &s->cap_conns, c->peer, 0);
        if (conn) conn->reserved--;
        c->conn_reserved = 0;
    }
    rpc_client_unstall_locked(s, c);
    if (!c->counted) return;
    s->ncalls[c->cls]--;
    client_slot *k = client_find(s, c->client, 0);
    if (!k) return;
    k->n[c->cls]--;
    client_drop_if_idle(s, k);
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

int rpc_token_index(const ps_rpc_server *s, const unsigned char *v, size_t n) {
    int who = -1;
    for (int i = 0; i < s->ntokens; i++)  /* no early exit: same time for every token */
        if (token_equal(s->tokens[i].token, v, n) && who < 0) who = i;
    return who;
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
    int who = rpc_token_index(s, v + 7, n - 7);
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
    rpc_escape_slice(method, sizeof method, c->details.method);
    snprintf(details, dlen, "token '%s' may not call %s", s->tokens[who].name, method);
    return GRPC_STATUS_PERMISSION_DENIED;
}

/* gRPC's auth metadata processor (runs on a gRPC thread for every new
 * stream, before the call reaches the application): is there a valid
 * bearer token? Which methods it may call is checked later, in
 * call_authorize, which also names the holder. */
void rpc_transport_auth(void *state, grpc_auth_context *ctx, const grpc_metadata *md, size_t nmd,
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
    long long w = ps_mono_ms() / 1000;
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

void rpc_log_refusal(ps_rpc_server *s, const char *fmt, ...) {
    double now = ps_mono_ms() / 1000.0;
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

/* The call cap of a class: max_calls, max_reserved_calls, and readers
 * max_calls / 2 of their own. */
static int rpc_class_cap(const ps_rpc_server *s, int cls) {
    if (cls == CLASS_RESERVED) return s->opts.max_reserved_calls;
    if (cls == CLASS_READER) return s->opts.max_calls / 2 > 0 ? s->opts.max_calls / 2 : 1;
    return s->opts.max_calls;
}

grpc_status_code rpc_admit(ps_rpc_call *c, const char *rawpeer, const char *method, const char *peer,
                           char *details, size_t dlen) {
    ps_rpc_server *s = c->s;
    grpc_status_code code = call_authorize(c, details, dlen);
    if (code != GRPC_STATUS_OK) {
        atomic_fetch_add(&s->refused_auth, 1);
        rpc_log_refusal(s, "rpc: %s from %s refused: %s: %s", method, peer, ps_grpc_code_name(code), details);
        return code;
    }
    c->m = find_method(s, c->details.method);
    if (!c->m) {
        snprintf(details, dlen, "unknown method %s", method);
        ps_log(PS_LOG_DEBUG, "rpc: %s from %s -> UNIMPLEMENTED", method, peer);
        return GRPC_STATUS_UNIMPLEMENTED;
    }
    /* a token restricted to some methods is a reader: its ordinary calls
     * have their own cap and workers */
    c->cls = c->m->reserved ? CLASS_RESERVED
           : c->who >= 0 && s->tokens[c->who].methods ? CLASS_READER : CLASS_ORDINARY;
    client_key(c->client, sizeof c->client, c->who >= 0 ? s->tokens[c->who].name : NULL, rawpeer);
    int cap = rpc_class_cap(s, c->cls);
    /* reserved calls: the same fraction of their cap, at least 2 */
    int ccap = s->opts.max_calls_per_client;
    if (c->cls == CLASS_RESERVED) {
        ccap = (int)((long long)s->opts.max_reserved_calls * s->opts.max_calls_per_client / s->opts.max_calls);
        if (ccap < 2) ccap = 2;
    }
    if (ccap > cap) ccap = cap;
    int keep = cap / 8;                     /* kept for clients holding none */
    int all = stalled_all(s);
    enum { OK, BUSY, KEPT, CLIENT, STALLED, STALLED_ALL } why = OK;
    double now = ps_mono_ms() / 1000.0;
    pthread_mutex_lock(&s->mu);
    int n = s->ncalls[c->cls], mine = 0, stalled = 0;  /* stalled: past the grace */
    client_slot *cs = client_find(s, c->client, 1);
    client_slot *conn = rpc_slot_find(&s->conns, &s->nconns, &s->cap_conns, c->peer, 0);
    if (cs) {
        mine = cs->n[c->cls];
        stalled = cs->old;
    }
    if (!cs) why = BUSY;  /* out of memory for the table */
    else if (n >= cap) why = BUSY;
    else if (mine >= ccap) why = CLIENT;
    else if (c->cls == CLASS_RESERVED) why = OK;
    else if (stalled >= s->opts.max_stalled_per_client) why = STALLED;
    else if (mine > 0 && n >= cap - keep) why = KEPT;
    else if (stalled > 0 && s->nold >= all) why = STALLED_ALL;
    /* each connection may hold one reserved call whatever the caps: a
     * monitor on the host of a client that fills its share is answered */
    int conn_pass = why != OK && cs && c->cls == CLASS_RESERVED && conn && conn->reserved == 0;
    if (why == OK || conn_pass) {
        why = OK;
        s->ncalls[c->cls]++;
        cs->n[c->cls]++;
        c->counted = 1;
        if (c->cls != CLASS_RESERVED) {
            c->stalled = 1;
            cs->stalled++;
            s->nstalled++;
        } else if (conn) {
            c->conn_reserved = 1;
            conn->reserved++;
        }
        c->watched = 1;
        c->wprev = NULL;
        c->wnext = s->watch;
        if (s->watch) s->watch->wprev = c;
        s->watch = c;
    } else {
        if (why == CLIENT || why == STALLED) s->refused_client++;
        else s->refused_busy++;
        if (why == BUSY && c->cls == CLASS_ORDINARY) {
            if (now - s->sat_last > 1.0) s->sat_start = now;
            s->sat_last = now;
        }
        if (cs) client_drop_if_idle(s, cs);
    }
    int nstalled = s->nold;
    pthread_mutex_unlock(&s->mu);
    if (why == OK) return GRPC_STATUS_OK;
    const char *kind = c->cls == CLASS_RESERVED ? "reserved " : c->cls == CLASS_READER ? "reader " : "";
    switch (why) {
    case CLIENT:
        snprintf(details, dlen, "too many calls from one client: %s holds %d %scalls "
                 "(limit %d per client, server.max_calls_per_client); retry later", c->client, mine, kind, ccap);
        break;
    case STALLED:
        snprintf(details, dlen, "too many calls without their request message from one client: %s holds %d "
                 "(limit %d per client, server.max_stalled_per_client); retry later", c->client, stalled,
                 s->opts.max_stalled_per_client);
        break;
    case KEPT:
        snprintf(details, dlen, "server busy: %d %scalls in progress (limit %d, the last %d kept for clients "
                 "holding none; %s holds %d); retry later", n, kind, cap, keep, c->client, mine);
        break;
    case STALLED_ALL:
        snprintf(details, dlen, "server busy: %d calls wait for their request message (limit %d in all, "
                 "server.max_calls / 4; %s holds %d of them); retry later", nstalled, all, c->client,
                 stalled);
        break;
    default:
        snprintf(details, dlen, "server busy: %d %scalls in progress (limit %d); retry later", n, kind, cap);
    }
    rpc_log_refusal(s, "rpc: %s from %s refused: RESOURCE_EXHAUSTED: %s", method, peer, details);
    /* the call was not read: the client may send it again as it is (a
     * stalled client's calls free their slots no sooner than their grace) */
    c->retry_after_ms = why == STALLED || why == STALLED_ALL ? PS_RPC_STALL_GRACE_MS : PS_RPC_RETRY_AFTER_CALLS_MS;
    return GRPC_STATUS_RESOURCE_EXHAUSTED;
}

int ps_rpc_server_calls(ps_rpc_server *s) {
    if (!s) return 0;
    pthread_mutex_lock(&s->mu);
    int n = 0;
    for (int i = 0; i < NCLASSES; i++) n += s->ncalls[i];
    pthread_mutex_unlock(&s->mu);
    return n;
}

void ps_rpc_server_admission(ps_rpc_server *s, ps_rpc_admission *out) {
    memset(out, 0, sizeof *out);
    if (!s) return;
    double now = ps_mono_ms() / 1000.0;
    pthread_mutex_lock(&s->mu);
    out->calls = s->ncalls[CLASS_ORDINARY];
    out->reserved_calls = s->ncalls[CLASS_RESERVED];
    out->reader_calls = s->ncalls[CLASS_READER];
    out->stalled_calls = s->nstalled;
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
    out->polls_hit = s->polls_hit;
    out->polls_missed = s->polls_missed;
    out->poll_s = s->poll_s;
    pthread_mutex_unlock(&s->mu);
    out->bytes_received = atomic_load(&s->bytes_received);
    out->bytes_sent = atomic_load(&s->bytes_sent);
    rpc_local_counts(s, &out->local_connections, &out->local_calls);
}

