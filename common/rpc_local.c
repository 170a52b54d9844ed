/* rpc_local.c - the local transport's client (rpc_local.h): a pool of
 * connections to psd's local socket, each with its memfd, one call at a
 * time on each. */
#include "rpc_local.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "clock.h"
#include "log.h"
#include "rpc.h"

#define LOCAL_HELLO_TIMEOUT_MS 30000  /* psd's answer to a hello, without a call deadline */

typedef struct local_conn {
    int fd;
    unsigned char *map;
    uint32_t seq;
    struct local_conn *next;
} local_conn;

struct ps_local_client {
    char path[sizeof ((struct sockaddr_un *)0)->sun_path];
    size_t region;
    char *token;
    pthread_mutex_t mu;
    local_conn *idle;              /* connections between calls */
};

int ps_local_copy_out(const grpc_byte_buffer *b, unsigned char *dst) {
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, (grpc_byte_buffer *)b)) return -1;
    grpc_slice sl;
    while (grpc_byte_buffer_reader_next(&rd, &sl)) {
        memcpy(dst, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl));
        dst += GRPC_SLICE_LENGTH(sl);
        grpc_slice_unref(sl);
    }
    grpc_byte_buffer_reader_destroy(&rd);
    return 0;
}

/* psd's retry hint as a client takes it: 0..PS_RPC_RETRY_AFTER_MAX_MS (rpc.h). */
static int hint_ms(int32_t ms) {
    return ms < 0 ? 0 : ms > PS_RPC_RETRY_AFTER_MAX_MS ? PS_RPC_RETRY_AFTER_MAX_MS : ms;
}

ps_local_client *ps_local_client_create(const char *path, size_t region, const char *token, ps_err *err) {
    if (!path || !*path || strlen(path) >= sizeof ((struct sockaddr_un *)0)->sun_path) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "local transport: socket path \"%s\" is empty or longer than %zu "
                   "bytes", path ? path : "", sizeof ((struct sockaddr_un *)0)->sun_path - 1);
        return NULL;
    }
    if (token && strlen(token) > PS_LOCAL_TOKEN_MAX) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "local transport: token longer than %d bytes", PS_LOCAL_TOKEN_MAX);
        return NULL;
    }
    ps_local_client *c = calloc(1, sizeof *c);
    if (!c || (token && *token && !(c->token = strdup(token)))) {
        free(c);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "local transport: out of memory");
        return NULL;
    }
    snprintf(c->path, sizeof c->path, "%s", path);
    c->region = region < PS_LOCAL_REGION_MIN ? PS_LOCAL_REGION_MIN : region;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void conn_free(ps_local_client *c, local_conn *k) {
    if (!k) return;
    if (k->map) munmap(k->map, 2 * c->region);
    if (k->fd >= 0) close(k->fd);
    free(k);
}

void ps_local_client_free(ps_local_client *c) {
    if (!c) return;
    while (c->idle) {
        local_conn *k = c->idle;
        c->idle = k->next;
        conn_free(c, k);
    }
    pthread_mutex_destroy(&c->mu);
    free(c->token);
    free(c);
}

/* Wait for a message on fd for up to timeout_ms (< 0: forever); its size,
 * 0 at EOF, -1 on error (errno; ETIMEDOUT for the timeout). */
static ssize_t recv_within(int fd, void *buf, size_t n, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    long long until = timeout_ms >= 0 ? ps_mono_ms() + timeout_ms : 0;
    for (;;) {
        int left = timeout_ms < 0 ? -1 : (int)(until - ps_mono_ms());
        if (timeout_ms >= 0 && left < 0) left = 0;
        int pr = poll(&p, 1, left);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return -1;
        if (pr == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        ssize_t r = recv(fd, buf, n, MSG_DONTWAIT);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        return r;
    }
}

/* A new connection: socket, memfd, hello, welcome. NULL with *code and
 * details on failure. */
static local_conn *conn_open(ps_local_client *c, int timeout_ms, grpc_status_code *code, char *details,
                             size_t dlen, int *retry_after_ms) {
    local_conn *k = calloc(1, sizeof *k);
    int mfd = -1;
    if (!k) {
        *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(details, dlen, "out of memory");
        return NULL;
    }
    k->fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, c->path, strlen(c->path) + 1);
    if (k->fd < 0 || connect(k->fd, (struct sockaddr *)&a, sizeof a) != 0) {
        *code = GRPC_STATUS_UNAVAILABLE;
        snprintf(details, dlen, "cannot connect to psd's local socket %s: %s", c->path, strerror(errno));
        goto fail;
    }
    mfd = memfd_create("psd-local", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mfd < 0 || ftruncate(mfd, (off_t)(2 * c->region)) != 0 ||
        fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(details, dlen, "local transport: cannot make its shared memory (%zu bytes): %s", 2 * c->region,
                 strerror(errno));
        goto fail;
    }
    k->map = mmap(NULL, 2 * c->region, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (k->map == MAP_FAILED) {
        k->map = NULL;
        *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(details, dlen, "local transport: cannot map its shared memory: %s", strerror(errno));
        goto fail;
    }
    ps_local_hello h;
    memset(&h, 0, sizeof h);
    h.magic = PS_LOCAL_MAGIC;
    h.version = PS_LOCAL_VERSION;
    h.region = c->region;
    h.token_len = c->token ? (uint32_t)strlen(c->token) : 0;
    if (h.token_len) memcpy(h.token, c->token, h.token_len);
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {&h, offsetof(ps_local_hello, token) + h.token_len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &mfd, sizeof mfd);
    if (sendmsg(k->fd, &msg, MSG_NOSIGNAL) != (ssize_t)iov.iov_len) {
        *code = GRPC_STATUS_UNAVAILABLE;
        snprintf(details, dlen, "psd's local socket %s: cannot send the hello: %s", c->path, strerror(errno));
        goto fail;
    }
    close(mfd);
    mfd = -1;
    ps_local_welcome w;
    ssize_t n = recv_within(k->fd, &w, sizeof w, timeout_ms > 0 ? timeout_ms : LOCAL_HELLO_TIMEOUT_MS);
    if (n < (ssize_t)offsetof(ps_local_welcome, details) + 1 || w.magic != PS_LOCAL_MAGIC) {
        *code = n < 0 && errno == ETIMEDOUT ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_UNAVAILABLE;
        snprintf(details, dlen, "psd's local socket %s: no answer to the hello (%s)", c->path,
                 n < 0 ? strerror(errno) : n == 0 ? "connection closed" : "not psd's local transport");
        goto fail;
    }
    w.details[sizeof w.details - 1] = '\0';
    if (w.code != GRPC_STATUS_OK) {
        *code = (grpc_status_code)w.code;
        snprintf(details, dlen, "%s", w.details);
        if (w.code == GRPC_STATUS_RESOURCE_EXHAUSTED && retry_after_ms)  /* a cap: psd's hint */
            *retry_after_ms = hint_ms(w.retry_after_ms);
        goto fail;
    }
    return k;
fail:
    if (mfd >= 0) close(mfd);
    conn_free(c, k);
    return NULL;
}

ps_status ps_local_client_call(ps_local_client *c, const char *method, const grpc_byte_buffer *request,
                               grpc_byte_buffer **response, int timeout_ms, grpc_status_code *code,
                               char *details, size_t details_len, int *retry_after_ms, ps_err *err) {
    (void)err;
    *response = NULL;
    if (retry_after_ms) *retry_after_ms = 0;
    char dbuf[PS_LOCAL_DETAILS_MAX];
    if (!details || !details_len) {
        details = dbuf;
        details_len = sizeof dbuf;
    }
    details[0] = '\0';
    *code = GRPC_STATUS_UNKNOWN;
    long long until = timeout_ms > 0 ? ps_mono_ms() + timeout_ms : 0;
    size_t plen = strlen(method);
    size_t len = request ? grpc_byte_buffer_length((grpc_byte_buffer *)request) : 0;
    if (plen == 0 || plen > PS_LOCAL_PATH_MAX) {
        *code = GRPC_STATUS_INVALID_ARGUMENT;
        snprintf(details, details_len, "method path of %zu bytes", plen);
        return PS_OK;
    }
    if (len > c->region) {
        *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(details, details_len, "request of %zu bytes is larger than the local transport's region (%zu "
                 "bytes: the max message size)", len, c->region);
        return PS_OK;
    }
    pthread_mutex_lock(&c->mu);
    local_conn *k = c->idle;
    if (k) c->idle = k->next;
    pthread_mutex_unlock(&c->mu);
    if (k) {  /* closed by psd meanwhile (restarted, stopped)? Then nothing was sent on it: a new one */
        struct pollfd p = {.fd = k->fd, .events = POLLIN};
        if (poll(&p, 1, 0) != 0) {
            conn_free(c, k);
            k = NULL;
        }
    }
    if (!k && !(k = conn_open(c, timeout_ms, code, details, details_len, retry_after_ms))) return PS_OK;

    if (request && ps_local_copy_out(request, k->map) != 0) {
        conn_free(c, k);
        *code = GRPC_STATUS_INTERNAL;
        snprintf(details, details_len, "cannot read the request");
        return PS_OK;
    }
    ps_local_request q;
    q.magic = PS_LOCAL_MAGIC;
    q.seq = ++k->seq;
    q.len = len;
    q.timeout_ms = timeout_ms > 0 ? (int64_t)(until - ps_mono_ms()) : 0;
    if (timeout_ms > 0 && q.timeout_ms < 1) q.timeout_ms = 1;
    q.path_len = (uint32_t)plen;
    memcpy(q.path, method, plen);
    size_t qn = offsetof(ps_local_request, path) + plen;
    ps_local_reply r;
    ssize_t n = -1;
    if (send(k->fd, &q, qn, MSG_NOSIGNAL) == (ssize_t)qn) {
        int left = timeout_ms > 0 ? (int)(until - ps_mono_ms()) : -1;
        if (timeout_ms > 0 && left < 0) left = 0;
        n = recv_within(k->fd, &r, sizeof r, left);
    }
    if (n < (ssize_t)offsetof(ps_local_reply, details) + 1 || r.magic != PS_LOCAL_MAGIC || r.seq != q.seq ||
        r.len > c->region || (r.code != GRPC_STATUS_OK && r.len != 0)) {
        int late = n < 0 && errno == ETIMEDOUT;
        *code = late ? GRPC_STATUS_DEADLINE_EXCEEDED : GRPC_STATUS_UNAVAILABLE;
        snprintf(details, details_len, late ? "deadline passed (psd's local socket %s)"
                 : n <= 0 ? "psd closed the local connection %s (it stopped or restarted)"
                          : "psd's local socket %s sent a malformed reply", c->path);
        conn_free(c, k);  /* a call may still run there: psd cancels it when the connection closes */
        return PS_OK;
    }
    r.details[sizeof r.details - 1] = '\0';
    *code = (grpc_status_code)r.code;
    snprintf(details, details_len, "%s", r.details);
    if (r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && retry_after_ms) *retry_after_ms = hint_ms(r.retry_after_ms);
    if (r.code == GRPC_STATUS_OK) {
        grpc_slice sl = grpc_slice_malloc((size_t)r.len);
        memcpy(GRPC_SLICE_START_PTR(sl), k->map + c->region, (size_t)r.len);
        *response = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
    }
    pthread_mutex_lock(&c->mu);
    k->next = c->idle;
    c->idle = k;
    pthread_mutex_unlock(&c->mu);
    return PS_OK;
}
