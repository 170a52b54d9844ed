/* rpc_local.c - the local transport's server (common/rpc_local.h,
 * rpc_server.h "Local transport"): a unix socket beside psd's gRPC port
 * whose connections carry calls of the same method table, the request and
 * reply bytes in memory the client shares.
 *
 * Threads: one accept thread; one thread per connection, which reads the
 * connection's call, runs its handler itself (no hand-off, no queue: a
 * connection has one call at a time) and writes the reply. A deferred call
 * (sync rounds, SSP waits, batching) holds its connection's thread, never a
 * worker: the thread waits for ps_rpc_call_complete, and cancels the call
 * (on_cancel) when its client goes away, its deadline passes or the server's
 * shutdown grace ends.
 *
 * Limits (docs/security.md): at most server.max_calls connections in all
 * and server.max_connections_per_client per client (the token's name, else "local":
 * every process of psd's user is one client, as every loopback connection
 * is one host for gRPC); a hello must arrive within server.recv_timeout_s;
 * a reply the client does not take within server.send_timeout_s closes the
 * connection; a request longer than the client's region or
 * server.max_message_mb is refused unread; a malformed message closes the
 * connection. What a connection costs psd while idle: a thread (its stack)
 * and the mapping of the client's memfd (only the pages psd touched are
 * resident in psd). */
#include "rpc_server_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "rpc_local.h"

typedef struct rpc_local_conn rpc_local_conn;

struct rpc_local_conn {
    rpc_local *l;
    int fd;
    unsigned char *map;          /* 2 x region bytes: requests, then replies */
    size_t region;               /* also the longest request: at most server.max_message_mb (hello) */
    int who;                     /* the token's index, -1 without tokens */
    char client[PS_RPC_CLIENT_KEY];
    char peer[64];               /* "local:pid=123" */
    pthread_t thread;
    int done;                    /* its thread returned (l->mu): join it */
    int wait;                    /* what its thread waits for (l->mu): WAIT_* */
    long long wait_since;        /* ps_mono_ms() when it began waiting for its reply to be taken */
    int counted;                 /* in its client's count (l->mu) */
    int poll_us;                 /* its polling window now (next_request) */
    int retry_after_ms;          /* a refused hello's hint (welcome) */
    rpc_local_conn *next;
};

struct rpc_local {
    ps_rpc_server *s;
    char path[sizeof ((struct sockaddr_un *)0)->sun_path];
    int listen_fd;
    int stop_pipe[2];
    pthread_t accept_thread;
    int accept_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* a connection's thread ended */
    rpc_local_conn *conns;
    int nconns;                  /* threads not yet joined */
    client_slot *clients;        /* connections per client (n[0]) */
    int nclients, cap_clients;
    atomic_int stopping;         /* no new connections or calls */
    atomic_int cancel_all;       /* the shutdown grace ended: cancel deferred calls */
    atomic_ullong calls;         /* calls run, since the start */
    atomic_ullong held;          /* request bytes copied out and not yet freed */
};

#define PS_LOCAL_RETRY_CONNECT_MS 100  /* a hello refused for a cap: connections close often */
#define LOCAL_WAIT_SLICE_MS 50   /* a deferred call's thread checks its client this often */

/* What a connection's thread waits for; a stopping server closes the
 * connection (shutdown(2) wakes the thread) of one waiting for its client:
 * at once when no call is in flight (WAIT_CLIENT: the hello, the next
 * request), after PS_RPC_SHUTDOWN_CLIENT_MS when the client does not take
 * its reply (WAIT_REPLY), as the gRPC side cancels such calls. */
enum { WAIT_NONE, WAIT_CLIENT, WAIT_REPLY };

static void set_wait(rpc_local_conn *k, int w) {
    pthread_mutex_lock(&k->l->mu);
    k->wait = w;
    k->wait_since = w == WAIT_REPLY ? ps_mono_ms() : 0;
    pthread_mutex_unlock(&k->l->mu);
}

/* With l->mu held: close the connections a stopping server does not wait for. */
static void cut_waiting_locked(rpc_local *l) {
    long long now = ps_mono_ms();
    for (rpc_local_conn *k = l->conns; k; k = k->next)
        if (!k->done && (k->wait == WAIT_CLIENT ||
                         (k->wait == WAIT_REPLY && now - k->wait_since >= PS_RPC_SHUTDOWN_CLIENT_MS)))
            shutdown(k->fd, SHUT_RDWR);
}

/* Send one message: 0, -1 when the client is gone, -2 when it did not take
 * the message within timeout_ms (0: only what the socket takes at once). */
static int send_all(rpc_local_conn *k, const void *msg, size_t n, int timeout_ms) {
    struct pollfd p = {.fd = k->fd, .events = POLLOUT};
    int rc = 1, waiting = 0;
    while (rc == 1) {
        ssize_t r = send(k->fd, msg, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r == (ssize_t)n) rc = 0;
        else if (r >= 0) rc = -1;  /* SEQPACKET: all or nothing */
        else if (errno == EINTR) continue;
        else if (errno != EAGAIN && errno != EWOULDBLOCK) rc = -1;
        else if (timeout_ms <= 0) rc = -2;
        else {
            if (!waiting) set_wait(k, WAIT_REPLY);
            waiting = 1;
            int pr = poll(&p, 1, timeout_ms);
            if (pr == 0) rc = -2;  /* the client does not take its reply */
            else if (pr < 0 && errno != EINTR) rc = -1;
        }
    }
    if (waiting) set_wait(k, WAIT_NONE);
    return rc;
}

static int reply_send(rpc_local_conn *k, uint32_t seq, grpc_status_code code, int retry_after_ms,
                      grpc_byte_buffer *resp, const char *details) {
    ps_rpc_server *s = k->l->s;
    ps_local_reply r;
    r.magic = PS_LOCAL_MAGIC;
    r.seq = seq;
    r.len = 0;
    char why[PS_LOCAL_DETAILS_MAX];
    if (code == GRPC_STATUS_OK && resp) {
        size_t len = grpc_byte_buffer_length(resp);
        if (len > k->region) {
            snprintf(why, sizeof why, "the reply (%zu bytes) is larger than the local connection's region (%zu "
                     "bytes: the client's max message size)", len, k->region);
            code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            details = why;
        } else if (ps_local_copy_out(resp, k->map + k->region) != 0) {
            code = GRPC_STATUS_INTERNAL;
            details = "cannot read the reply";
        } else {
            r.len = len;
            atomic_fetch_add(&s->bytes_sent, len);
        }
    }
    if (code != GRPC_STATUS_OK) r.len = 0;
    r.code = code;
    r.retry_after_ms = code == GRPC_STATUS_RESOURCE_EXHAUSTED && retry_after_ms > 0 ? retry_after_ms : 0;
    snprintf(r.details, sizeof r.details, "%s", details ? details : "");
    size_t n = offsetof(ps_local_reply, details) + strlen(r.details) + 1;
    return send_all(k, &r, n, s->send_timeout_ms);
}

/* ---- calls ----------------------------------------------------------- */

ps_rpc_call *rpc_local_defer(ps_rpc_call *c, ps_rpc_cancel_fn on_cancel, void *cancel_arg) {
    pthread_mutex_lock(&c->mu);
    PS_ASSERT(c->handler_running && !c->deferred); /* from the handler, once */
    c->deferred = 1;
    c->on_cancel = on_cancel;
    c->cancel_arg = cancel_arg;
    if (c->local->l->s->prof) c->t_defer = ps_prof_now();
    atomic_fetch_add(&c->refs, 1);  /* the owner's, released by ps_rpc_call_complete */
    pthread_mutex_unlock(&c->mu);
    return c;
}

int rpc_local_complete(ps_rpc_call *c, grpc_byte_buffer *response, grpc_status_code code, const char *details) {
    pthread_mutex_lock(&c->mu);
    PS_ASSERT(c->deferred && !c->completed); /* exactly once per deferred call */
    c->completed = 1;
    int sent = 0;
    if (c->cancelled) {
        if (response) grpc_byte_buffer_destroy(response);
    } else {
        if (c->t_defer) c->prof.ns[PS_PHASE_HELD] = ps_prof_now() - c->t_defer;
        c->send = response;
        c->local_code = code;
        snprintf(c->local_details, sizeof c->local_details, "%s", details ? details : "");
        sent = 1;
        pthread_cond_signal(&c->local_cv);
    }
    pthread_mutex_unlock(&c->mu);
    rpc_call_unref(c);
    return sent;
}

/* Has the client hung up (EOF on its socket)? A message it sent meanwhile
 * (a protocol error) is left for the loop to refuse. */
static int client_gone(rpc_local_conn *k) {
    struct pollfd p = {.fd = k->fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR)) return 1;
    char b;
    ssize_t r = recv(k->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0;
}

/* The deferred call c: wait for its answer, or cancel it. Returns with
 * c->mu held; c->completed or c->cancelled. *why, for a cancelled call:
 * the status its client gets, or -1 when the client is gone (nothing to
 * answer); 0 for an answered one. */
static void wait_deferred(rpc_local_conn *k, ps_rpc_call *c, gpr_timespec deadline, int *why) {
    rpc_local *l = k->l;
    *why = 0;
    pthread_mutex_lock(&c->mu);
    while (!c->completed && !c->cancelled) {
        struct timespec ts = ps_mono_deadline_ms(LOCAL_WAIT_SLICE_MS);
        pthread_cond_timedwait(&c->local_cv, &c->mu, &ts);
        if (c->completed) break;
        pthread_mutex_unlock(&c->mu);
        int gone = client_gone(k);
        int late = gpr_time_cmp(deadline, gpr_now(GPR_CLOCK_MONOTONIC)) <= 0;
        int stop = atomic_load(&l->cancel_all);
        pthread_mutex_lock(&c->mu);
        if (c->completed || !(gone || late || stop)) continue;
        c->cancelled = 1;
        *why = gone ? -1 : late ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_UNAVAILABLE;
        if (c->on_cancel && !c->cancel_fired) {
            c->cancel_fired = 1;
            pthread_mutex_unlock(&c->mu);
            c->on_cancel(c->cancel_arg, c);  /* may complete c: our reference keeps it */
            pthread_mutex_lock(&c->mu);
        }
    }
}

static const ps_rpc_method *find_method(const ps_rpc_server *s, const char *path, size_t n) {
    for (int i = 0; i < s->nmethods; i++)
        if (strlen(s->methods[i].path) == n && memcmp(s->methods[i].path, path, n) == 0) return &s->methods[i];
    return NULL;
}

static int token_allows(const ps_rpc_server *s, int who, const char *path) {
    if (who < 0) return 1;
    const char *const *m = s->tokens[who].methods;
    if (!m) return 1;
    for (; *m; m++)
        if (strcmp(*m, path) == 0) return 1;
    return 0;
}

/* One call: q is the request message (n bytes). Returns 0 to go on, -1 to
 * close the connection. */
static int serve_call(rpc_local_conn *k, const ps_local_request *q, size_t n) {
    rpc_local *l = k->l;
    ps_rpc_server *s = l->s;
    if (n < offsetof(ps_local_request, path) || q->magic != PS_LOCAL_MAGIC || q->path_len == 0 ||
        q->path_len > PS_LOCAL_PATH_MAX || n != offsetof(ps_local_request, path) + q->path_len) {
        rpc_log_refusal(s, "rpc: local connection %s: malformed request message (%zu bytes): closed", k->peer, n);
        reply_send(k, n >= 8 ? q->seq : 0, GRPC_STATUS_INVALID_ARGUMENT, 0, NULL,
                   "malformed local request message: the connection is closed");
        return -1;
    }
    char path[PS_LOCAL_PATH_MAX + 1];
    memcpy(path, q->path, q->path_len);
    path[q->path_len] = '\0';
    char esc[200], details[PS_RPC_DETAILS_MAX];  /* rpc_escape_str cuts with "..." */
    const ps_rpc_method *m = find_method(s, q->path, q->path_len);
    if (!m) {
        rpc_escape_str(esc, sizeof esc, path);
        snprintf(details, sizeof details, "unknown method %s", esc);
        return reply_send(k, q->seq, GRPC_STATUS_UNIMPLEMENTED, 0, NULL, details);
    }
    if (!token_allows(s, k->who, path)) {
        snprintf(details, sizeof details, "token '%s' may not call %s", s->tokens[k->who].name, path);
        return reply_send(k, q->seq, GRPC_STATUS_PERMISSION_DENIED, 0, NULL, details);
    }
    if (q->len > k->region) {
        snprintf(details, sizeof details, "request of %llu bytes is larger than %zu bytes (the smaller of the "
                 "connection's region and server.max_message_mb)", (unsigned long long)q->len, k->region);
        return reply_send(k, q->seq, GRPC_STATUS_RESOURCE_EXHAUSTED, 0, NULL, details);
    }
    if (atomic_load(&l->stopping))
        return reply_send(k, q->seq, GRPC_STATUS_UNAVAILABLE, 0, NULL, "psd is shutting down");
    /* The requests held at once share server.transport_memory_mb, as gRPC's
     * receive buffers do; one request alone is always taken. */
    unsigned long long cap = (unsigned long long)s->opts.transport_memory_mb << 20;
    unsigned long long before = atomic_fetch_add(&l->held, q->len);
    if (cap && before > 0 && before + q->len > cap) {
        atomic_fetch_sub(&l->held, q->len);
        rpc_log_refusal(s, "rpc: local connection %s: request of %llu bytes refused: requests held reach "
                        "server.transport_memory_mb", k->peer, (unsigned long long)q->len);
        snprintf(details, sizeof details, "psd holds server.transport_memory_mb of requests: try again shortly");
        return reply_send(k, q->seq, GRPC_STATUS_RESOURCE_EXHAUSTED, PS_RPC_RETRY_AFTER_CALLS_MS, NULL, details);
    }

    ps_rpc_call *c = calloc(1, sizeof *c);
    grpc_slice sl = grpc_slice_malloc((size_t)q->len);
    if (!c) {
        grpc_slice_unref(sl);
        atomic_fetch_sub(&l->held, q->len);
        return reply_send(k, q->seq, GRPC_STATUS_RESOURCE_EXHAUSTED, 0, NULL, "out of memory");
    }
    int64_t t_accept = s->prof ? ps_prof_now() : 0;
    /* copied out first: the client may write on while psd reads */
    memcpy(GRPC_SLICE_START_PTR(sl), k->map, (size_t)q->len);
    grpc_byte_buffer *req = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    atomic_fetch_add(&s->bytes_received, q->len);
    atomic_fetch_add(&l->calls, 1);
    pthread_mutex_init(&c->mu, NULL);
    ps_cond_init_mono(&c->local_cv);  /* wait_deferred times its slices on CLOCK_MONOTONIC */
    atomic_init(&c->refs, 1);
    c->local = k;
    c->m = m;
    c->who = k->who;
    c->handler_running = 1;

    gpr_timespec deadline = q->timeout_ms > 0
        ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(q->timeout_ms, GPR_TIMESPAN))
        : gpr_inf_future(GPR_CLOCK_MONOTONIC);
    int64_t t_handler = 0;
    if (s->prof) {
        t_handler = ps_prof_now();
        c->prof.ns[PS_PHASE_RECV] = t_handler - t_accept;
        ps_prof_bind(&c->prof);
    }
    grpc_status_code code = GRPC_STATUS_OK;
    details[0] = '\0';
    grpc_byte_buffer *resp = NULL;
    ps_rpc_call_info info = {path, k->peer, deadline, k->who >= 0 ? s->tokens[k->who].name : "", c, m->id,
                             k->client};
    m->fn(s->user, &info, req, &resp, &code, details, sizeof details);
    details[sizeof details - 1] = '\0';
    if (t_handler) {
        ps_prof_bind(NULL);
        const int64_t *ns = c->prof.ns;
        c->prof.ns[PS_PHASE_HANDLER] = ps_prof_now() - t_handler - ns[PS_PHASE_DECODE] - ns[PS_PHASE_CTX] -
                                       ns[PS_PHASE_LOCK] - ns[PS_PHASE_COMPUTE] - ns[PS_PHASE_ENCODE];
    }
    grpc_byte_buffer_destroy(req);
    atomic_fetch_sub(&l->held, q->len);

    pthread_mutex_lock(&c->mu);
    c->handler_running = 0;
    int deferred = c->deferred, retry = c->retry_after_ms;
    pthread_mutex_unlock(&c->mu);
    int rc = 0;
    if (deferred) {
        if (resp) grpc_byte_buffer_destroy(resp);
        int why;
        wait_deferred(k, c, deadline, &why);  /* returns with c->mu held */
        if (c->completed && !c->cancelled) {
            resp = c->send;
            c->send = NULL;
            code = c->local_code;
            snprintf(details, sizeof details, "%s", c->local_details);
        } else {
            resp = NULL;
            code = why < 0 ? GRPC_STATUS_CANCELLED : (grpc_status_code)why;
            snprintf(details, sizeof details, "%s", why == GRPC_STATUS_DEADLINE_EXCEEDED
                     ? "deadline passed before psd answered" : "psd shut down before it answered");
        }
        retry = c->retry_after_ms;  /* the owner's, set before it completed */
        pthread_mutex_unlock(&c->mu);
        if (why == -1) rc = -1;  /* the client is gone: nothing to answer, the connection closes */
    }
    if (rc == 0) {
        int64_t t_send = s->prof ? ps_prof_now() : 0;
        rc = reply_send(k, q->seq, code, retry, resp, details);
        if (s->prof && code == GRPC_STATUS_OK) {
            int64_t t_sent = ps_prof_now();
            c->prof.ns[PS_PHASE_SEND] = t_sent - t_send;
            ps_prof_acc_add(&s->prof[m - s->methods], &c->prof, t_sent - t_accept);
        }
        if (rc == -2) rpc_log_refusal(s, "rpc: local connection %s did not take its reply within "
                                      "server.send_timeout_s: closed", k->peer);
    }
    if (resp) grpc_byte_buffer_destroy(resp);
    rpc_call_unref(c);
    return rc;
}

/* ---- connections ------------------------------------------------------ */

static client_slot *client_find(rpc_local *l, const char *key, int create) {
    return rpc_slot_find(&l->clients, &l->nclients, &l->cap_clients, key, create);
}

/* The hello: token, memfd. 0 and k set up, or a status to refuse with. */
static grpc_status_code hello(rpc_local_conn *k, char *details, size_t dlen) {
    rpc_local *l = k->l;
    ps_rpc_server *s = l->s;
    struct pollfd p = {.fd = k->fd, .events = POLLIN};
    pthread_mutex_lock(&l->mu);
    int stop = atomic_load(&l->stopping);
    k->wait = WAIT_CLIENT;  /* a stopping server closes it now: no call is in flight */
    pthread_mutex_unlock(&l->mu);
    int pr = stop ? 0 : poll(&p, 1, s->recv_timeout_ms);
    set_wait(k, WAIT_NONE);
    if (stop || atomic_load(&l->stopping)) {  /* the stop closed it meanwhile */
        snprintf(details, dlen, "psd is shutting down");
        return GRPC_STATUS_UNAVAILABLE;
    }
    if (pr <= 0) {
        snprintf(details, dlen, "no hello within server.recv_timeout_s");
        return GRPC_STATUS_DEADLINE_EXCEEDED;
    }
    ps_local_hello h;
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {&h, sizeof h};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(k->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    int fd = -1;
    for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL; cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        int nfd = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < nfd; i++) {
            int f;
            memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
            if (fd < 0) fd = f;
            else close(f);  /* one memfd; the rest is not ours to keep */
        }
    }
    grpc_status_code code = GRPC_STATUS_INVALID_ARGUMENT;
    struct stat st;
    int seals;
    if (n < (ssize_t)offsetof(ps_local_hello, token) || h.magic != PS_LOCAL_MAGIC ||
        h.token_len > PS_LOCAL_TOKEN_MAX || n != (ssize_t)(offsetof(ps_local_hello, token) + h.token_len))
        snprintf(details, dlen, "malformed hello (not psd's local transport?)");
    else if (h.version != PS_LOCAL_VERSION)
        snprintf(details, dlen, "local transport version %u; this psd speaks %d", h.version, PS_LOCAL_VERSION);
    else if (fd < 0)
        snprintf(details, dlen, "the hello carries no shared memory (memfd)");
    else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (seals = fcntl(fd, F_GET_SEALS)) < 0 ||
             (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        snprintf(details, dlen, "the shared memory is not a memfd sealed against shrinking and growing");
    else if (h.region < PS_LOCAL_REGION_MIN || h.region > rpc_max_message(s) || (uint64_t)st.st_size != 2 * h.region)
        snprintf(details, dlen, "the shared memory's region of %llu bytes (file %lld bytes) is not 2 x %d..%llu bytes "
                 "(server.max_message_mb)", (unsigned long long)h.region, (long long)st.st_size,
                 PS_LOCAL_REGION_MIN, (unsigned long long)rpc_max_message(s));
    else
        code = GRPC_STATUS_OK;
    if (code == GRPC_STATUS_OK && s->ntokens > 0) {
        int who = rpc_token_index(s, (const unsigned char *)h.token, h.token_len);
        if (who < 0) {
            code = GRPC_STATUS_UNAUTHENTICATED;
            snprintf(details, dlen, h.token_len ? "invalid token"
                     : "no credentials: this server needs a token (security.token_file on the trainer)");
        }
        k->who = who;
    }
    if (code == GRPC_STATUS_OK) {
        void *map = mmap(NULL, 2 * (size_t)h.region, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            code = GRPC_STATUS_RESOURCE_EXHAUSTED;
            snprintf(details, dlen, "cannot map the shared memory: %s", strerror(errno));
        } else {
            k->map = map;
            k->region = (size_t)h.region;
        }
    }
    if (fd >= 0) close(fd);
    if (code != GRPC_STATUS_OK) return code;
    if (k->who >= 0) snprintf(k->client, sizeof k->client, "token:%s", s->tokens[k->who].name);
    else snprintf(k->client, sizeof k->client, "local");
    int cap = s->opts.max_connections_per_client;
    pthread_mutex_lock(&l->mu);
    client_slot *c = client_find(l, k->client, 1);
    if (c && c->n[0] < cap) {
        c->n[0]++;
        k->counted = 1;
    }
    pthread_mutex_unlock(&l->mu);
    if (!k->counted) {
        snprintf(details, dlen, "client %s holds %d local connections, its share "
                 "(server.max_connections_per_client); connect again when one closes", k->client, cap);
        k->retry_after_ms = PS_LOCAL_RETRY_CONNECT_MS;
        return GRPC_STATUS_RESOURCE_EXHAUSTED;
    }
    return GRPC_STATUS_OK;
}

/* The hello's answer; timeout_ms as send_all's (a fresh socket takes it at once). */
static void welcome(rpc_local_conn *k, grpc_status_code code, const char *details, int timeout_ms) {
    ps_local_welcome w;
    memset(&w, 0, sizeof w);
    w.magic = PS_LOCAL_MAGIC;
    w.code = code;
    w.retry_after_ms = code == GRPC_STATUS_RESOURCE_EXHAUSTED ? k->retry_after_ms : 0;
    w.max_request = k->region;
    snprintf(w.details, sizeof w.details, "%s", details);
    send_all(k, &w, offsetof(ps_local_welcome, details) + strlen(w.details) + 1, timeout_ms);
}

/* The connection's next request message into q: its size, 0 at EOF, -1
 * on an error. As an idle worker does (rpc_server_impl.h, rpc_worker), it
 * first polls for up to k->poll_us, yielding its CPU to anything runnable
 * there, so that a trainer's next call finds its thread on a CPU instead
 * of waking an idle vCPU (~0.1 ms and more on a VM); the window adapts the
 * same way: doubled after a sleep a longer poll would have caught (up to
 * server.idle_poll_us), halved after a longer one (below
 * PS_RPC_POLL_MIN_US: off). Counted with the workers' polls. */
static ssize_t next_request(rpc_local_conn *k, ps_local_request *q) {
    ps_rpc_server *s = k->l->s;
    const int max = s->opts.idle_poll_us;
    double t0 = max > 0 ? ps_mono_s() : 0;
    ssize_t n;
    if (k->poll_us > 0) {
        double until = t0 + k->poll_us * 1e-6;
        int hit;
        for (;;) {
            n = recv(k->fd, q, sizeof *q, MSG_DONTWAIT);
            hit = n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);  /* a message, EOF or an error */
            if (hit || ps_mono_s() >= until) break;
            sched_yield();
        }
        pthread_mutex_lock(&s->mu);
        s->poll_s += ps_mono_s() - t0;
        if (hit) s->polls_hit++;
        else s->polls_missed++;
        pthread_mutex_unlock(&s->mu);
        if (hit) return n;
    }
    do n = recv(k->fd, q, sizeof *q, 0);
    while (n < 0 && errno == EINTR);
    if (max > 0 && n > 0) rpc_poll_adapt(&k->poll_us, max, (ps_mono_s() - t0) * 1e6);  /* it slept */
    return n;
}

static void *conn_main(void *arg) {
    rpc_local_conn *k = arg;
    rpc_local *l = k->l;
    char details[PS_LOCAL_DETAILS_MAX];
    grpc_status_code code = hello(k, details, sizeof details);
    if (code != GRPC_STATUS_OK) {
        rpc_log_refusal(l->s, "rpc: local connection %s refused: %s", k->peer, details);
        welcome(k, code, details, l->s->send_timeout_ms);
    } else {
        welcome(k, GRPC_STATUS_OK, "", l->s->send_timeout_ms);
        ps_local_request q;
        for (;;) {
            pthread_mutex_lock(&l->mu);
            int stop = atomic_load(&l->stopping);
            k->wait = stop ? WAIT_NONE : WAIT_CLIENT;
            pthread_mutex_unlock(&l->mu);
            if (stop) break;
            ssize_t n = next_request(k, &q);
            set_wait(k, WAIT_NONE);
            if (n <= 0) break;  /* the client closed it, or psd's shutdown did */
            if (serve_call(k, &q, (size_t)n) != 0) break;
        }
    }
    if (k->map) munmap(k->map, 2 * k->region);
    k->map = NULL;
    shutdown(k->fd, SHUT_RDWR);
    pthread_mutex_lock(&l->mu);
    if (k->counted) {
        client_slot *c = client_find(l, k->client, 0);
        if (c && --c->n[0] == 0) *c = l->clients[--l->nclients];
        k->counted = 0;
    }
    k->done = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* With l->mu held: join and free the connections whose threads ended. */
static void reap_locked(rpc_local *l) {
    for (rpc_local_conn **pp = &l->conns; *pp;) {
        rpc_local_conn *k = *pp;
        if (!k->done) {
            pp = &k->next;
            continue;
        }
        *pp = k->next;
        pthread_join(k->thread, NULL);
        close(k->fd);
        free(k);
        l->nconns--;
    }
}

static void *accept_main(void *arg) {
    rpc_local *l = arg;
    ps_rpc_server *s = l->s;
    struct pollfd p[2] = {{.fd = l->listen_fd, .events = POLLIN}, {.fd = l->stop_pipe[0], .events = POLLIN}};
    while (!atomic_load(&l->stopping)) {
        int pr = poll(p, 2, 1000);
        pthread_mutex_lock(&l->mu);
        reap_locked(l);
        pthread_mutex_unlock(&l->mu);
        if (pr <= 0 || (p[1].revents & POLLIN)) continue;
        int fd = accept4(l->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) usleep(100000);  /* out of descriptors: not a busy loop */
            continue;
        }
        rpc_local_conn *k = calloc(1, sizeof *k);
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (!k || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
            free(k);
            close(fd);
            continue;
        }
        k->l = l;
        k->fd = fd;
        k->who = -1;
        k->poll_us = s->opts.idle_poll_us;
        snprintf(k->peer, sizeof k->peer, "local:pid=%d", (int)cred.pid);
        pthread_mutex_lock(&l->mu);
        int full = l->nconns >= s->opts.max_calls;
        int ok = 0;
        if (!full) {
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setstacksize(&at, 8u << 20);
            ok = pthread_create(&k->thread, &at, conn_main, k) == 0;
            pthread_attr_destroy(&at);
            if (ok) {
                k->next = l->conns;
                l->conns = k;
                l->nconns++;
            }
        }
        pthread_mutex_unlock(&l->mu);
        if (!ok) {
            char why[160];
            snprintf(why, sizeof why, full ? "psd holds server.max_calls (%d) local connections"
                     : "psd cannot start a thread for the connection", s->opts.max_calls);
            rpc_log_refusal(s, "rpc: local connection %s refused: %s", k->peer, why);
            k->retry_after_ms = PS_LOCAL_RETRY_CONNECT_MS;
            welcome(k, GRPC_STATUS_RESOURCE_EXHAUSTED, why, 0);  /* the accept thread never waits on a client */
            close(fd);
            free(k);
        }
    }
    return NULL;
}

/* ---- life cycle ------------------------------------------------------- */

ps_status rpc_local_create(ps_rpc_server *s, const char *path, ps_err *err) {
    rpc_local *l = calloc(1, sizeof *l);
    if (!l) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    l->s = s;
    l->listen_fd = -1;
    l->stop_pipe[0] = l->stop_pipe[1] = -1;
    pthread_mutex_init(&l->mu, NULL);
    ps_cond_init_mono(&l->cv);  /* rpc_local_finish times its waits on CLOCK_MONOTONIC */
    s->local = l;
    if (strlen(path) >= sizeof l->path)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.local_socket: %s is longer than %zu bytes", path,
                          sizeof l->path - 1);
    snprintf(l->path, sizeof l->path, "%s", path);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, l->path, strlen(l->path) + 1);
    struct stat st;
    if (lstat(l->path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "server.local_socket: %s exists and is not a socket",
                              l->path);
        /* a socket left by a psd that died: no one answers on it */
        int t = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        int live = t >= 0 && connect(t, (struct sockaddr *)&a, sizeof a) == 0;
        if (t >= 0) close(t);
        if (live)
            return ps_err_set(err, PS_ERR_UNAVAILABLE, "server.local_socket: %s is in use by another process",
                              l->path);
        unlink(l->path);
    }
    if (pipe2(l->stop_pipe, O_CLOEXEC) != 0 ||
        (l->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)) < 0)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "server.local_socket: %s", strerror(errno));
    /* owner only: the socket's mode is what keeps other users out */
    mode_t old = umask(0177);
    int rc = bind(l->listen_fd, (struct sockaddr *)&a, sizeof a);
    int e = errno;
    umask(old);
    if (rc != 0)
        return ps_err_set(err, PS_ERR_UNAVAILABLE, "server.local_socket: cannot bind %s: %s", l->path, strerror(e));
    if (listen(l->listen_fd, 64) != 0) {
        e = errno;
        unlink(l->path);
        return ps_err_set(err, PS_ERR_UNAVAILABLE, "server.local_socket: cannot listen on %s: %s", l->path,
                          strerror(e));
    }
    return PS_OK;
}

ps_status rpc_local_start(ps_rpc_server *s, ps_err *err) {
    rpc_local *l = s->local;
    if (!l) return PS_OK;
    int rc = pthread_create(&l->accept_thread, NULL, accept_main, l);
    if (rc != 0)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "server.local_socket: cannot start its thread: %s",
                          strerror(rc));
    l->accept_running = 1;
    return PS_OK;
}

void rpc_local_stop(ps_rpc_server *s) {
    rpc_local *l = s->local;
    if (!l || atomic_exchange(&l->stopping, 1)) return;
    if (l->stop_pipe[1] >= 0 && write(l->stop_pipe[1], "x", 1) < 0) { /* the poll's timeout ends it anyway */ }
    if (l->accept_running) {
        pthread_join(l->accept_thread, NULL);
        l->accept_running = 0;
    }
    if (l->listen_fd >= 0) {
        close(l->listen_fd);
        l->listen_fd = -1;
        unlink(l->path);
    }
    pthread_mutex_lock(&l->mu);
    cut_waiting_locked(l);  /* wakes their waits: no call is lost */
    pthread_mutex_unlock(&l->mu);
}

void rpc_local_finish(ps_rpc_server *s, long long deadline_ms) {
    rpc_local *l = s->local;
    if (!l) return;
    rpc_local_stop(s);
    pthread_mutex_lock(&l->mu);
    for (;;) {
        reap_locked(l);
        if (l->nconns == 0) break;
        long long left = deadline_ms - ps_mono_ms();
        if (left <= 0 && !atomic_load(&l->cancel_all)) {
            ps_log(PS_LOG_WARN, "rpc: %d local connection%s still busy at the end of the grace period: deferred "
                   "calls cancelled", l->nconns, l->nconns == 1 ? "" : "s");
            atomic_store(&l->cancel_all, 1);
        }
        if (left < 20) left = 20;
        if (left > 100) left = 100;
        struct timespec ts = ps_mono_deadline_ms(left);
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
        cut_waiting_locked(l);  /* those that began waiting since */
    }
    pthread_mutex_unlock(&l->mu);
}

void rpc_local_free(ps_rpc_server *s) {
    rpc_local *l = s->local;
    if (!l) return;
    rpc_local_finish(s, 0);
    if (l->listen_fd >= 0) close(l->listen_fd);
    for (int i = 0; i < 2; i++)
        if (l->stop_pipe[i] >= 0) close(l->stop_pipe[i]);
    free(l->clients);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    free(l);
    s->local = NULL;
}

void rpc_local_counts(ps_rpc_server *s, int *connections, unsigned long long *calls) {
    rpc_local *l = s->local;
    *connections = 0;
    *calls = 0;
    if (!l) return;
    pthread_mutex_lock(&l->mu);
    for (rpc_local_conn *k = l->conns; k; k = k->next) *connections += !k->done;
    pthread_mutex_unlock(&l->mu);
    *calls = atomic_load(&l->calls);
}
