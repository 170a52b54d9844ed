/* rpc_policing.c - limits against hostile or careless clients that act
 * on connections and calls already accepted: calls stalled before their
 * message or after their reply (cancelled), connections that reset streams
 * faster than allowed or hold far more calls than their stream limit
 * (HTTP/2 rapid reset: closed), hosts whose connections together reset
 * faster than one may (cut off), hosts holding more connections than
 * server.max_connections_per_client (the newest closed). docs/security.md. */
#include "rpc_server_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/filter.h>
#include <dirent.h>
#include <math.h>
#include <linux/tcp.h>  /* struct tcp_info with tcpi_bytes_received (glibc's lacks it) */
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

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
    rpc_conn_progress_locked(s, peer);  /* its headers ended */
    client_slot *c = rpc_slot_find(&s->conns, &s->nconns, &s->cap_conns, peer, 1);
    if (!c) return 0;
    c->n[0]++;
    if (c->n[1]) return 0;  /* cut already */
    if (c->n[0] <= 8 * s->opts.max_streams_per_connection + 64) return 0;
    c->n[1] = 1;
    s->conns_cut++;
    return 1;
}

/* With s->mu held: the progress record of peer (create: a new one); NULL
 * when absent or out of memory. */
static conn_progress *progress_new(ps_rpc_server *s, const char *peer);

static conn_progress *progress_find(ps_rpc_server *s, const char *peer, int create) {
    for (int i = 0; i < s->nprog; i++)
        if (!strcmp(s->prog[i].key, peer)) return &s->prog[i];
    return create ? progress_new(s, peer) : NULL;
}

/* With s->mu held: a new progress record of peer, at the end (NULL: out of memory). */
static conn_progress *progress_new(ps_rpc_server *s, const char *peer) {
    if (s->nprog == s->cap_prog) {
        int ncap = s->cap_prog ? 2 * s->cap_prog : 64;
        conn_progress *p = realloc(s->prog, (size_t)ncap * sizeof *p);
        if (!p) return NULL;
        s->prog = p;
        s->cap_prog = ncap;
    }
    conn_progress *p = &s->prog[s->nprog++];
    memset(p, 0, sizeof *p);
    snprintf(p->key, sizeof p->key, "%s", peer);
    return p;
}

void rpc_conn_progress_locked(ps_rpc_server *s, const char *peer) {
    if (!s->port) return;  /* a unix socket: not scanned */
    conn_progress *p = progress_find(s, peer, 1);
    if (p) p->seq = ++s->prog_seq;
}

void rpc_peer_host(char *dst, size_t n, const char *peer) {
    snprintf(dst, n, "%s", peer ? peer : "?");
    if (strncmp(dst, "unix", 4) == 0) return;
    char *colon = strrchr(dst, ':');
    char *bracket = strrchr(dst, ']');
    if (colon && (!bracket || colon > bracket) && colon != strchr(dst, ':')) *colon = '\0';
}

static void host_decay(host_resets *h, long long now) {
    if (now <= h->t_ms) return;
    h->score *= exp2(-(double)(now - h->t_ms) / 1000.0);
    h->t_ms = now;
}

/* With s->mu held: the slot of peer's host (create: reuse the least
 * worth keeping: empty, else the lowest count of a host not cut off). */
static host_resets *host_slot(ps_rpc_server *s, const char *peer, long long now, int create) {
    char host[PS_RPC_CLIENT_KEY];
    rpc_peer_host(host, sizeof host, peer);
    host_resets *low = NULL;
    double lowv = 0;
    for (int i = 0; i < PS_RPC_HOST_SLOTS; i++) {
        host_resets *h = &s->hosts[i];
        if (h->host[0] && !strcmp(h->host, host)) {
            host_decay(h, now);
            return h;
        }
        double v = !h->host[0] ? -1 : h->score * exp2(-(double)(now - h->t_ms) / 1000.0) +
                                          (h->cut_until > now ? 1e12 : 0);
        if (!low || v < lowv) low = h, lowv = v;
    }
    if (!create) return NULL;
    memset(low, 0, sizeof *low);
    snprintf(low->host, sizeof low->host, "%s", host);
    low->t_ms = now;
    return low;
}

/* The count a host's resets may reach: max_resets_per_s a second over
 * all its connections (a steady rate r gives about r / ln 2). */
static double host_limit(const ps_rpc_server *s) { return s->opts.max_resets_per_s / log(2.0); }

int rpc_note_host_reset_locked(ps_rpc_server *s, const char *peer) {
    long long now = ps_mono_ms();
    host_resets *h = host_slot(s, peer, now, 1);
    h->score += 1;
    if (h->score <= host_limit(s)) return 0;
    int was = h->cut_until > now;
    h->cut_until = now + 2000;  /* while it goes on, and 2 s after */
    return !was;
}

int rpc_host_cut_locked(ps_rpc_server *s, const char *peer) {
    long long now = ps_mono_ms();
    host_resets *h = host_slot(s, peer, now, 0);
    return h && h->cut_until > now;
}

void rpc_conn_release_locked(ps_rpc_server *s, const char *peer) {
    rpc_conn_progress_locked(s, peer);  /* its call ended: what it was receiving is spent */
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

/* Calls fn(fd, arg) for each socket among psd's own descriptors that is on
 * the server's port (any, for a unix socket: s->port 0) and, when listening,
 * is the listener itself (SO_ACCEPTCONN); else connections and listener alike
 * (a listener has no peer: each_conn skips it). */
static void each_socket(ps_rpc_server *s, int listening, void (*fn)(int fd, void *arg), void *arg) {
    DIR *d = opendir("/proc/self/fd");
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || fd < 0 || fd == dirfd(d)) continue;
        struct stat st;
        if (fstat((int)fd, &st) || !S_ISSOCK(st.st_mode)) continue;
        if (listening) {
            int acc = 0;
            socklen_t ol = sizeof acc;
            if (getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &ol) || !acc) continue;
        }
        struct sockaddr_storage ss;
        socklen_t len = sizeof ss;
        if (getsockname((int)fd, (struct sockaddr *)&ss, &len)) continue;
        unsigned port = ss.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&ss)->sin_port)
                      : ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) : 0;
        if (s->port && port != (unsigned)s->port) continue;
        fn((int)fd, arg);
    }
    if (d) closedir(d);
}

typedef struct conn_visit { void (*fn)(int fd, const char *peer, void *arg); void *arg; } conn_visit;

static void visit_conn(int fd, void *arg) {
    conn_visit *v = arg;
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char name[PS_RPC_CLIENT_KEY];
    if (getpeername(fd, (struct sockaddr *)&ss, &len) || !format_peer(&ss, name, sizeof name)) return;
    v->fn(fd, name, v->arg);
}

/* Calls fn(fd, peer, arg) for each connection to the server's port. */
static void each_conn(ps_rpc_server *s, void (*fn)(int fd, const char *peer, void *arg), void *arg) {
    conn_visit v = {fn, arg};
    each_socket(s, 0, visit_conn, &v);
}

typedef struct cut_arg { const char *match; int by_host, cut; } cut_arg;

static void cut_one(int fd, const char *peer, void *arg) {
    cut_arg *a = arg;
    char host[PS_RPC_CLIENT_KEY];
    if (a->by_host) rpc_peer_host(host, sizeof host, peer);
    if (strcmp(a->by_host ? host : peer, a->match)) return;
    if (shutdown(fd, SHUT_RDWR) == 0) a->cut++;
}

/* Close the connection to peer (HTTP/2 rapid reset: gRPC 1.51 has no limit
 * of its own, and its core API cannot close one connection). psd finds the
 * connection's socket among its descriptors and shuts it down: gRPC sees the
 * end of the stream and closes the transport with all its calls; the fd
 * itself stays gRPC's to close. */
void rpc_cut_connection(ps_rpc_server *s, const char *peer, const char *why) {
    cut_arg a = {peer, 0, 0};
    each_conn(s, cut_one, &a);
    char esc[160];
    rpc_escape_str(esc, sizeof esc, peer);
    rpc_log_refusal(s, "rpc: connection %s %s (HTTP/2 rapid reset?): %s", esc, why,
                    a.cut ? "connection closed" : "its socket was not found");
}

void rpc_cut_host(ps_rpc_server *s, const char *peer, const char *why) {
    char host[PS_RPC_CLIENT_KEY];
    rpc_peer_host(host, sizeof host, peer);
    cut_arg a = {host, 1, 0};
    each_conn(s, cut_one, &a);
    pthread_mutex_lock(&s->mu);
    s->conns_cut += a.cut;
    pthread_mutex_unlock(&s->mu);
    atomic_store(&s->next_conn_scan, 0);  /* refuse its new connections now */
    char esc[160];
    rpc_escape_str(esc, sizeof esc, host);
    ps_log(PS_LOG_WARN, "rpc: host %s %s (HTTP/2 rapid reset over many connections?): %d connection%s closed, "
           "and those it opens for the next 2 s", esc, why, a.cut, a.cut == 1 ? "" : "s");
}

static void count_one(int fd, const char *peer, void *arg) {
    (void)fd, (void)peer;
    ++*(int *)arg;
}

int rpc_count_connections(ps_rpc_server *s) {
    int n = 0;
    each_conn(s, count_one, &n);
    return n;
}

/* ---- connections per host ---- */

typedef struct conn_ent {
    int fd;
    char host[PS_RPC_CLIENT_KEY], peer[PS_RPC_CLIENT_KEY];
    unsigned long long received;  /* bytes its socket received (TCP_INFO) */
    unsigned long long over;      /* scan_progress: what it received past its allowance (0: within it) */
    unsigned long long calls;     /* its open calls then */
    int tcp;                      /* received is known */
} conn_ent;
typedef struct conn_list { conn_ent *e; int n, cap; } conn_list;

static void collect(int fd, const char *peer, void *arg) {
    conn_list *l = arg;
    if (l->n == l->cap) {
        int ncap = l->cap ? 2 * l->cap : 256;
        conn_ent *e = realloc(l->e, (size_t)ncap * sizeof *e);
        if (!e) return;
        l->e = e;
        l->cap = ncap;
    }
    conn_ent *e = &l->e[l->n++];
    e->fd = fd;
    rpc_peer_host(e->host, sizeof e->host, peer);
    snprintf(e->peer, sizeof e->peer, "%s", peer);
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    memset(&ti, 0, sizeof ti);
    e->tcp = getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 &&
             tl >= offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received;
    e->received = e->tcp ? ti.tcpi_bytes_received : 0;
    e->over = e->calls = 0;
}

static int by_host_fd(const void *a, const void *b) {
    const conn_ent *x = a, *y = b;
    int c = strcmp(x->host, y->host);
    return c ? c : (x->fd > y->fd) - (x->fd < y->fd);
}

typedef struct filter_arg { ps_rpc_server *s; const struct sock_fprog *fp; } filter_arg;

static void attach_filter(int fd, void *arg) {
    filter_arg *a = arg;
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, a->fp, sizeof *a->fp))
        rpc_log_refusal(a->s, "rpc: cannot filter new connections on the listener: %s", strerror(errno));
}

/* Put the IPv4 hosts of ban (network order) on the listening socket's
 * socket filter: the kernel drops their connection attempts (SYN) before
 * gRPC ever accepts them - gRPC 1.51's C API has no accept hook, and
 * closing connections only makes a client come back at once. Other
 * packets and every IPv6 packet pass. */
static void listener_filter(ps_rpc_server *s, const uint32_t *ban, int n) {
    struct sock_filter prog[4 + PS_RPC_REFUSED_HOSTS + 2];
    int k = 0;
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_B | BPF_ABS, (uint32_t)SKF_NET_OFF);
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 4);
    prog[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 4, 0, (uint8_t)(n + 1));
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)(SKF_NET_OFF + 12));
    for (int i = 0; i < n; i++)
        prog[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ntohl(ban[i]), (uint8_t)(n - i), 0);
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, 0xffffffffu);
    prog[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, 0);
    struct sock_fprog fp = {(unsigned short)k, prog};
    filter_arg a = {s, &fp};
    each_socket(s, 1, attach_filter, &a);
}

static int by_peer(const void *a, const void *b) {
    return strcmp(((const conn_ent *)a)->peer, ((const conn_ent *)b)->peer);
}

/* conn_progress and client_slot records: by their key, their first member */
static int by_key(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

/* Close the connections that received more than they may without
 * progress (conn_progress), and forget the records of those gone. The
 * connections, the progress records and the connection slots are sorted
 * by peer and walked side by side under s->mu: n log n a scan (the scan
 * runs four times a second; a lookup per connection was n squared, ~45,000
 * key comparisons a scan at 300 connections). The tables' order means
 * nothing to their other users, who search them linearly. */
static void scan_progress(ps_rpc_server *s, conn_list *l) {
    /* what gRPC may buffer for one call: its message; and for the first
     * PS_RPC_OVERSIZE_GRACE_MS, what it reads of one larger than
     * server.max_message_mb before it refuses it (it reads it whole, up to
     * the transport's quota), so that such a client hears why */
    unsigned long long per_call = rpc_max_message(s);
    unsigned long long oversize = (s->opts.transport_memory_mb > 0 ? (unsigned long long)s->opts.transport_memory_mb
                                                                   : 1024ull) << 20;
    long long now_ms = ps_mono_ms();
    if (l->n > 1) qsort(l->e, (size_t)l->n, sizeof *l->e, by_peer);
    pthread_mutex_lock(&s->mu);
    if (s->nprog > 1) qsort(s->prog, (size_t)s->nprog, sizeof *s->prog, by_key);
    if (s->nconns > 1) qsort(s->conns, (size_t)s->nconns, sizeof *s->conns, by_key);
    const int nprog = s->nprog;   /* the sorted ones; records made below go after them */
    int ip = 0, ic = 0;
    for (int i = 0; i < l->n; i++) {
        conn_ent *e = &l->e[i];
        if (!e->tcp) continue;
        while (ip < nprog && strcmp(s->prog[ip].key, e->peer) < 0) ip++;
        while (ic < s->nconns && strcmp(s->conns[ic].key, e->peer) < 0) ic++;
        conn_progress *p = ip < nprog && !strcmp(s->prog[ip].key, e->peer) ? &s->prog[ip] : progress_new(s, e->peer);
        const client_slot *c = ic < s->nconns && !strcmp(s->conns[ic].key, e->peer) ? &s->conns[ic] : NULL;
        unsigned long long calls = c && c->n[0] > 0 ? (unsigned long long)c->n[0] : 0;
        if (!p) continue;
        if (!p->present) p->base = 0, p->t_ms = now_ms;  /* new to the scans: from the connection's start */
        if (p->seq != p->seen || e->received < p->base) p->base = e->received, p->seen = p->seq, p->t_ms = now_ms;
        p->present = 2;  /* found by this scan */
        unsigned long long may = PS_RPC_NO_PROGRESS_BYTES + calls * per_call;
        if (now_ms - p->t_ms < PS_RPC_OVERSIZE_GRACE_MS) may += calls * oversize;
        if (e->received - p->base > may) {
            e->over = e->received - p->base;
            e->calls = calls;
            p->base = e->received;
            s->conns_cut++;
            /* as for rapid reset: its host is cut off for 2 s (its other
             * connections closed and new ones refused by the listener,
             * below in rpc_scan_connections), so it cannot come back at once */
            host_resets *h = host_slot(s, e->peer, now_ms, 1);
            h->cut_until = now_ms + 2000;
        }
    }
    for (int i = 0; i < s->nprog;) {
        conn_progress *p = &s->prog[i];
        if (p->present == 1) {
            *p = s->prog[--s->nprog];  /* its connection is gone */
        } else {
            p->present = 1;  /* found, or made by a call since: gone unless the next scan finds it */
            i++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < l->n; i++) {
        conn_ent *e = &l->e[i];
        if (!e->over || shutdown(e->fd, SHUT_RDWR)) continue;
        /* what gRPC buffered for it is freed once it has seen the close: hand
         * it back to the OS a moment later (psd's malloc thresholds keep
         * freed memory otherwise, and a flood of such connections would add
         * up in psd's RSS) */
        atomic_store(&s->trim_at, now_ms + PS_RPC_TRIM_AFTER_CUT_MS);
        char esc[160];
        rpc_escape_str(esc, sizeof esc, e->peer);
        rpc_log_refusal(s, "rpc: connection %s sent %llu bytes without completing a call's headers or message "
                        "(%llu call%s open; an HTTP/2 header block that never ends, or a request message larger than "
                        "server.max_message_mb?): connection closed, its host cut off for 2 s", esc, e->over,
                        e->calls, e->calls == 1 ? "" : "s");
    }
}

void rpc_scan_connections(ps_rpc_server *s) {
    if (!s->port) return;  /* unix socket: one host */
#ifdef __GLIBC__
    long long trim = atomic_load(&s->trim_at);
    if (trim && ps_mono_ms() >= trim && atomic_compare_exchange_strong(&s->trim_at, &trim, 0)) malloc_trim(0);
#endif
    conn_list l = {0};
    each_conn(s, collect, &l);
    scan_progress(s, &l);
    if (l.n > 1) qsort(l.e, (size_t)l.n, sizeof *l.e, by_host_fd);  /* l.e is NULL with no connection */
    int cap = s->opts.max_connections_per_client;
    uint32_t ban[PS_RPC_REFUSED_HOSTS];
    int nban = 0;
    for (int i = 0; i < l.n;) {
        int j = i;
        while (j < l.n && !strcmp(l.e[j].host, l.e[i].host)) j++;
        /* a host cut off for resetting streams: every connection it opened
         * since; else the highest descriptors past the cap (the newest,
         * mostly) */
        pthread_mutex_lock(&s->mu);
        int off = rpc_host_cut_locked(s, l.e[i].host);
        pthread_mutex_unlock(&s->mu);
        /* at its cap, or cut off: its new connections are refused until
         * the next scan finds it below */
        struct in_addr a4;
        if ((off || j - i >= cap) && nban < PS_RPC_REFUSED_HOSTS && !strncmp(l.e[i].host, "ipv4:", 5) &&
            inet_pton(AF_INET, l.e[i].host + 5, &a4) == 1)
            ban[nban++] = a4.s_addr;
        int cut = 0;
        for (int k = off ? i : i + cap; k < j; k++)
            cut += shutdown(l.e[k].fd, SHUT_RDWR) == 0;
        if (cut && off) {
            pthread_mutex_lock(&s->mu);
            s->conns_cut += cut;
            pthread_mutex_unlock(&s->mu);
            i = j;
            continue;
        }
        if (cut) {
            pthread_mutex_lock(&s->mu);
            s->conns_cut += cut;
            pthread_mutex_unlock(&s->mu);
            char esc[160];
            rpc_escape_str(esc, sizeof esc, l.e[i].host);
            rpc_log_refusal(s, "rpc: host %s holds %d connections (limit %d, server.max_connections_per_client): "
                            "closed %d", esc, j - i, cap, cut);
        }
        i = j;
    }
    free(l.e);
    /* hosts cut off with no connection open now stay refused too */
    pthread_mutex_lock(&s->mu);
    long long now = ps_mono_ms();
    for (int h = 0; h < PS_RPC_HOST_SLOTS && nban < PS_RPC_REFUSED_HOSTS; h++) {
        struct in_addr a4;
        const host_resets *hr = &s->hosts[h];
        if (hr->cut_until <= now || strncmp(hr->host, "ipv4:", 5) || inet_pton(AF_INET, hr->host + 5, &a4) != 1)
            continue;
        int dup = 0;
        for (int b = 0; b < nban; b++) dup |= ban[b] == a4.s_addr;
        if (!dup) ban[nban++] = a4.s_addr;
    }
    pthread_mutex_unlock(&s->mu);
    int same = nban == s->nrefused_hosts;
    for (int b = 0; same && b < nban; b++) same = ban[b] == s->refused_hosts[b];
    if (same) return;
    listener_filter(s, ban, nban);
    memcpy(s->refused_hosts, ban, sizeof ban[0] * (size_t)nban);
    s->nrefused_hosts = nban;
}

/* Cancel calls that waited too long for their request message or for the
 * client to take their reply (a stalled or silent client): they hold a
 * call of their client's share and, for replies, the reply's bytes. Once
 * the server is stopping, "too long" is at most PS_RPC_SHUTDOWN_CLIENT_MS:
 * shutdown waits its grace period for calls psd is working on, not for
 * clients that hold theirs (rpc_server_impl.h). */
void rpc_scan_timeouts(ps_rpc_server *s) {
    enum { MAXCUT = 256 };
    ps_rpc_call *cut[MAXCUT];
    int why[MAXCUT];
    int n = 0;
    long long now = ps_mono_ms();
    int stopping = atomic_load(&s->stopping);
    int recv_ms = s->recv_timeout_ms, send_ms = s->send_timeout_ms;
    if (stopping && recv_ms > PS_RPC_SHUTDOWN_CLIENT_MS) recv_ms = PS_RPC_SHUTDOWN_CLIENT_MS;
    if (stopping && send_ms > PS_RPC_SHUTDOWN_CLIENT_MS) send_ms = PS_RPC_SHUTDOWN_CLIENT_MS;
    pthread_mutex_lock(&s->mu);
    for (ps_rpc_call *c = s->watch; c && n < MAXCUT; c = c->wnext) {
        long long r = __atomic_load_n(&c->recv_since, __ATOMIC_RELAXED);
        long long w = __atomic_load_n(&c->send_since, __ATOMIC_RELAXED);
        int k = r && now - r > recv_ms ? 1 : w && now - w > send_ms ? 2 : 0;
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
                         ? "%srequest message not received within %d ms (server.recv_timeout_s%s)"
                         : "%sreply not taken by the client within %d ms (server.send_timeout_s%s)",
                         stopping ? "server shutting down: " : "", why[i] == 1 ? recv_ms : send_ms,
                         stopping ? ", or less while stopping" : "");
            /* past the stalled caps: nothing of the call was read, so it
             * ends with psd's retry hint like an admission refusal (a slow
             * client - a GC pause, a loaded host - sends it again after the
             * grace; one that stalls again is ended again, its share
             * bounded as before). The time limits cancel: the client has
             * had its time. */
            if (why[i] != 3 || !rpc_call_end_unread_locked(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg,
                                                          PS_RPC_STALL_GRACE_MS))
                grpc_call_cancel_with_status(c->call, why[i] == 3 ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                                      : stopping ? GRPC_STATUS_UNAVAILABLE
                                                                 : GRPC_STATUS_DEADLINE_EXCEEDED, msg, NULL);
        }
        pthread_mutex_unlock(&c->mu);
        rpc_call_unref(c);
    }
    if (n) rpc_log_refusal(s, "rpc: cancelled %d call%s that stalled (request never sent or reply never read)%s",
                       n, n == 1 ? "" : "s", stopping ? " while stopping" : "");
}

