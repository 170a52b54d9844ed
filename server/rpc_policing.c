/* rpc_policing.c - limits against hostile or careless clients that act
 * on connections and calls already accepted: calls stalled before their
 * message or after their reply (cancelled), connections that reset streams
 * faster than allowed or hold far more calls than their stream limit
 * (HTTP/2 rapid reset: closed). docs/security.md. */
#include "rpc_server_impl.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "clock.h"
#include "log.h"

/* With s->mu held: the slot of key in a table of slots. */
client_slot *rpc_slot_find(client_slot **tab, int *n, int *cap, const char *key, int create) {
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

/* With s->mu held: one more call object from connection peer. 1 when the
 * connection should be cut: it holds more call objects than any client
 * that keeps to SETTINGS_MAX_CONCURRENT_STREAMS could (its streams end
 * faster than psd can even finish them: HTTP/2 rapid reset). */
int rpc_conn_add_locked(ps_rpc_server *s, const char *peer) {
    client_slot *c = rpc_slot_find(&s->conns, &s->nconns, &s->cap_conns, peer, 1);
    if (!c) return 0;
    c->n[0]++;
    if (c->n[0] <= 8 * s->opts.max_streams_per_connection + 64 || c->n[1]) return 0;
    c->n[1] = 1;
    s->conns_cut++;
    return 1;
}

void rpc_conn_release_locked(ps_rpc_server *s, const char *peer) {
    client_slot *c = rpc_slot_find(&s->conns, &s->nconns, &s->cap_conns, peer, 0);
    if (c && --c->n[0] <= 0) *c = s->conns[--s->nconns];
}

/* With s->mu held: connection peer reset one more stream before sending its
 * message. 1 when it passed opts.max_resets_per_s in this second and
 * should be cut (once per window). */
int rpc_note_reset_locked(ps_rpc_server *s, const char *peer) {
    long long w = ps_mono_ms() / 1000;
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
void rpc_cut_connection(ps_rpc_server *s, const char *peer, const char *why) {
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
    rpc_escape_str(esc, sizeof esc, peer);
    ps_log(PS_LOG_WARN, "rpc: connection %s %s (HTTP/2 rapid reset?): %s", esc, why,
           cut ? "connection closed" : "its socket was not found");
}

/* Cancel calls that waited too long for their request message or for the
 * client to take their reply (a stalled or silent client): they hold a
 * call of their client's share and, for replies, the reply's bytes. */
void rpc_scan_timeouts(ps_rpc_server *s) {
    enum { MAXCUT = 256 };
    ps_rpc_call *cut[MAXCUT];
    int why[MAXCUT];
    int n = 0;
    long long now = ps_mono_ms();
    pthread_mutex_lock(&s->mu);
    for (ps_rpc_call *c = s->watch; c && n < MAXCUT; c = c->wnext) {
        long long r = __atomic_load_n(&c->recv_since, __ATOMIC_RELAXED);
        long long w = __atomic_load_n(&c->send_since, __ATOMIC_RELAXED);
        int k = r && now - r > s->recv_timeout_ms ? 1 : w && now - w > s->send_timeout_ms ? 2 : 0;
        /* past the grace, a stalled call counts against the stalled caps,
         * or is cancelled when they are full */
        if (!k && r && now - r > PS_RPC_STALL_GRACE_MS && !rpc_client_stall_old_locked(s, c)) k = 3;
        if (!k) continue;
        atomic_fetch_add(&c->refs, 1);
        why[n] = k;
        cut[n++] = c;
        if (k == 2) s->send_timeouts++;
        else if (k == 1) s->recv_timeouts++;
        else s->refused_client++;
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++) {
        ps_rpc_call *c = cut[i];
        pthread_mutex_lock(&c->mu);
        __atomic_store_n(why[i] == 2 ? &c->send_since : &c->recv_since, 0, __ATOMIC_RELAXED);
        c->timed_out = 1;
        if (!c->finished && c->call) {
            char msg[360];
            if (why[i] == 3)
                snprintf(msg, sizeof msg, "request message not received within %d ms while %s already holds %d "
                         "such calls (server.max_stalled_per_client) or all clients hold %d (server.max_calls / 4 "
                         "in all); retry later", PS_RPC_STALL_GRACE_MS, c->client, s->opts.max_stalled_per_client,
                         s->opts.max_calls / 4 > 0 ? s->opts.max_calls / 4 : 1);
            else
                snprintf(msg, sizeof msg, why[i] == 1
                         ? "request message not received within %d ms (server.recv_timeout_s)"
                         : "reply not taken by the client within %d ms (server.send_timeout_s)",
                         why[i] == 1 ? s->recv_timeout_ms : s->send_timeout_ms);
            grpc_call_cancel_with_status(c->call, why[i] == 3 ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                                              : GRPC_STATUS_DEADLINE_EXCEEDED, msg, NULL);
        }
        pthread_mutex_unlock(&c->mu);
        rpc_call_unref(c);
    }
    if (n) rpc_log_refusal(s, "rpc: cancelled %d call%s that stalled (request never sent or reply never read)",
                       n, n == 1 ? "" : "s");
}

