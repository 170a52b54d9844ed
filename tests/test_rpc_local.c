/* test_rpc_local.c - the local transport (common/rpc_local.h,
 * server/rpc_local.c): psd's methods over a unix SOCK_SEQPACKET socket and
 * a memfd both ends map, beside the gRPC port of the same ps_rpc_server.
 *
 * Through ps_rpc_client ("local:PATH"): replies byte for byte (echo with a
 * checksum, empty and multi-slice requests, 6 MiB and region-sized
 * messages), error codes and details, UNIMPLEMENTED, the retry hint; the
 * region's limits both ways and the hello refused for a region over
 * server.max_message_mb; threads sharing one client (concurrent
 * connections); server.transport_memory_mb; deferred calls (completed from
 * another thread, with an error or a retry hint, cancelled by the client's
 * deadline, by psd's own deadline, by a client that hangs up, and by the
 * end of a shutdown grace; completed within the grace; completed after the
 * server was freed); the connection caps (per client, per token, total);
 * tokens (none, wrong, a prefix, a restricted one, the principal a handler
 * sees); the socket file (mode 0600, removed at free, a second server on
 * the path refused, a stale socket replaced, a regular file left alone).
 * With a client of its own on the socket: every malformed hello and
 * request message, a client that never sends its hello - each refused with
 * its status and psd serving on, no descriptor or connection left behind.
 *
 * No assertion bounds wall-clock time from above: waits are for events
 * with a generous give-up (WAIT_MS), so that a bug fails instead of
 * hanging.
 *
 * At shutdown: a client that never says hello, or does not take its
 * replies, does not hold psd's shutdown (the shutdown returns; without the
 * cut it would wait server.recv_timeout_s / send_timeout_s, set to an hour
 * here); a refusal for the per-client cap carries a retry hint (an idle
 * pooled connection holds its share); a server and client both left at
 * the default message size talk. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "check.h"
#include "support/rpc_fixtures.h"
#include "clock.h"
#include "rpc_local.h"
#include "rpc_server.h"

#ifndef F_SEAL_SHRINK
#define F_ADD_SEALS 1033
#define F_GET_SEALS 1034
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#define F_SEAL_WRITE 0x0008
#endif

#define MAX_MSG (16 << 20)      /* the servers' max_message_bytes */
#define KB 1024
#define MB (1024 * 1024)
#define M_ECHO "/test.Test/Echo"
#define M_BIG "/test.Test/Big"
#define M_FAIL "/test.Test/Fail"
#define M_BUSY "/test.Test/Busy"
#define M_BUSY_LONG "/test.Test/BusyLong"
#define M_GATE "/test.Test/Gate"
#define M_DEFER "/test.Test/Defer"
#define M_DEFER_QUIET "/test.Test/DeferQuiet"
#define M_DEFER_SELF "/test.Test/DeferSelf"
#define M_PING "/test.Test/Ping"
#define M_WHO "/test.Test/Who"

/* Give-up time of every wait for an event: only reached when something is
 * broken, never a performance bound. */
#define WAIT_MS 30000

static char g_dir[64];

/* ---- bytes --------------------------------------------------------------- */

static grpc_byte_buffer *bb_new(const void *p, size_t n) {
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)p, n);
    grpc_byte_buffer *b = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return b;
}

/* A malloc'd copy of b's bytes (at least 1 byte allocated); NULL b: empty. */
static unsigned char *bb_bytes(const grpc_byte_buffer *b, size_t *n) {
    *n = b ? grpc_byte_buffer_length((grpc_byte_buffer *)b) : 0;
    unsigned char *out = malloc(*n + 1), *dst = out;
    if (!b) return out;
    grpc_byte_buffer_reader rd;
    PS_ASSERT(grpc_byte_buffer_reader_init(&rd, (grpc_byte_buffer *)b));
    grpc_slice sl;
    while (grpc_byte_buffer_reader_next(&rd, &sl)) {
        memcpy(dst, GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl));
        dst += GRPC_SLICE_LENGTH(sl);
        grpc_slice_unref(sl);
    }
    grpc_byte_buffer_reader_destroy(&rd);
    return out;
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static unsigned char *rand_bytes(size_t n, uint32_t seed) {
    unsigned char *p = malloc(n + 1);
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = (unsigned char)(x >> 11);
    }
    return p;
}

/* What Echo must answer for in[0..n): the bytes reversed, then their
 * FNV-1a hash (8 bytes, host order). Computed here, independently. */
static int echo_ok(const unsigned char *in, size_t n, const unsigned char *got, size_t got_n) {
    if (got_n != n + 8) return 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != in[n - 1 - i]) return 0;
    uint64_t h = fnv1a(in, n);
    return memcmp(got + n, &h, 8) == 0;
}

static unsigned char big_byte(size_t i) { return (unsigned char)((i * 131 + 7) & 0xff); }

/* ---- handlers -------------------------------------------------------------- */

static atomic_int echo_calls;    /* Echo handlers run */

static unsigned char *req_bytes(const grpc_byte_buffer *request, size_t *n) { return bb_bytes(request, n); }

static uint64_t req_u64(const grpc_byte_buffer *request) {
    size_t n;
    unsigned char *p = req_bytes(request, &n);
    uint64_t v = 0;
    if (n >= 8) memcpy(&v, p, 8);
    free(p);
    return v;
}

/* The request reversed, then its FNV-1a hash. */
static void h_echo(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                   grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)info, (void)code, (void)details, (void)details_len;
    atomic_fetch_add(&echo_calls, 1);
    size_t n;
    unsigned char *in = req_bytes(request, &n);
    unsigned char *out = malloc(n + 8);
    for (size_t i = 0; i < n; i++) out[i] = in[n - 1 - i];
    uint64_t h = fnv1a(in, n);
    memcpy(out + n, &h, 8);
    *response = bb_new(out, n + 8);
    free(in);
    free(out);
}

/* A reply of (request as u64) bytes, big_byte(i) each. */
static void h_big(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                  grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)info, (void)code, (void)details, (void)details_len;
    size_t n = (size_t)req_u64(request);
    unsigned char *out = malloc(n + 1);
    for (size_t i = 0; i < n; i++) out[i] = big_byte(i);
    *response = bb_new(out, n);
    free(out);
}

/* INVALID_ARGUMENT; leaves a response and a retry hint behind, neither of
 * which may reach the client. */
static void h_fail(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                   grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)request;
    *response = bb_new("leaked?", 7);
    ps_rpc_call_retry_after(info->call, 500);
    *code = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(details, details_len, "%s: fail 42", info->method);
}

/* RESOURCE_EXHAUSTED with the hint 250 ms (BusyLong: 90 s, past what a
 * client reads). */
static void h_busy(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                   grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)request, (void)response;
    ps_rpc_call_retry_after(info->call, strcmp(info->method, M_BUSY) == 0 ? 250 : 90000);
    *code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    snprintf(details, details_len, "busy, come back later");
}

static void h_ping(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                   grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)info, (void)request, (void)code, (void)details, (void)details_len;
    *response = bb_new("pong", 4);
}

/* "<principal>|<client>" */
static void h_who(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                  grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)request, (void)code, (void)details, (void)details_len;
    char b[256];
    int n = snprintf(b, sizeof b, "%s|%s", info->principal, info->client ? info->client : "(null)");
    *response = bb_new(b, (size_t)n);
}

/* Blocks until the gate opens; replies the request's length (u64). */
static void h_gate(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                   grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)info, (void)code, (void)details, (void)details_len;
    gate_pass();  /* the gate: rpc_fixtures.h */
    uint64_t n = request ? grpc_byte_buffer_length((grpc_byte_buffer *)request) : 0;
    *response = bb_new(&n, 8);
}

/* ---- deferred calls: a table of pending handles, as psd's rounds keep --- */

static atomic_int cancel_complete_bad; /* ... whose ps_rpc_call_complete did not return 0 */

static void on_cancel(void *arg, ps_rpc_call *call) {
    (void)arg;
    if (!def_cancel(call)) return;  /* the normal path took it and completes it */
    /* Nobody will read this: the call is gone. Must not crash or leak. */
    if (ps_rpc_call_complete(call, bb_new("nobody", 6), GRPC_STATUS_OK, NULL) != 0)
        atomic_fetch_add(&cancel_complete_bad, 1);
    atomic_fetch_add(&cancels, 1);
}

/* Defers; the test completes the call later through def_take(id), id the
 * request's u64. Quiet: no on_cancel (the owner polls
 * ps_rpc_call_cancelled). */
static void h_defer(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                    grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user;
    int quiet = strcmp(info->method, M_DEFER_QUIET) == 0;
    uint64_t id = req_u64(request);
    ps_rpc_call *c = ps_rpc_call_defer(info, quiet ? NULL : on_cancel, NULL);
    CHECK(c != NULL);
    if (!c) return;
    def_put(c, id);
    /* What a deferring handler leaves behind is ignored, not sent. */
    *response = bb_new("must not be sent", 16);
    *code = GRPC_STATUS_INTERNAL;
    snprintf(details, details_len, "must not be sent");
}

/* Defers and completes at once, from inside the handler: "self". */
static void h_defer_self(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                         grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t details_len) {
    (void)user, (void)request, (void)response, (void)code, (void)details, (void)details_len;
    ps_rpc_call *c = ps_rpc_call_defer(info, on_cancel, NULL);
    CHECK(c != NULL);
    CHECK(ps_rpc_call_complete(c, bb_new("self", 4), GRPC_STATUS_OK, NULL) == 1);
}

static const ps_rpc_method methods[] = {
    {M_ECHO, h_echo, 0, 0},       {M_BIG, h_big, 0, 0},        {M_FAIL, h_fail, 0, 0},
    {M_BUSY, h_busy, 0, 0},       {M_BUSY_LONG, h_busy, 0, 0}, {M_GATE, h_gate, 0, 0},
    {M_DEFER, h_defer, 0, 0},     {M_DEFER_QUIET, h_defer, 0, 0}, {M_DEFER_SELF, h_defer_self, 0, 0},
    {M_PING, h_ping, 1, 0},       {M_WHO, h_who, 0, 0},
};
#define NMETHODS ((int)(sizeof methods / sizeof methods[0]))

/* ---- servers and clients --------------------------------------------------- */

static void sock_path(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s.sock", g_dir, name); }

/* A started server on 127.0.0.1:0 with its local socket at g_dir/name.sock
 * (path: the socket's path). o: threads and max_message_bytes default to
 * 2 and MAX_MSG. */
static ps_rpc_server *local_server(const char *name, ps_rpc_server_opts o, const ps_rpc_security *sec,
                                   char *path, size_t plen) {
    sock_path(path, plen, name);
    snprintf(o.local_socket, sizeof o.local_socket, "%.107s", path);
    if (!o.threads) o.threads = 2;
    if (!o.max_message_bytes) o.max_message_bytes = MAX_MSG;
    ps_err err;
    ps_rpc_server *s = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, NMETHODS, NULL, sec, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (!s) return NULL;
    CHECK(ps_rpc_server_start(s, &err) == PS_OK);
    return s;
}

static ps_rpc_client *local_client(const char *path, int region, const char *token) {
    char target[256];
    snprintf(target, sizeof target, "local:%s", path);
    ps_rpc_security sec = {.token = token};
    ps_err err;
    ps_rpc_client *c = ps_rpc_client_create_secure(target, region, token ? &sec : NULL, &err);
    CHECK_MSG(c != NULL, "%s", err.msg);
    return c;
}

typedef struct res {
    grpc_status_code code;
    unsigned char *data;  /* the reply's bytes on OK (malloc'd), else NULL */
    size_t n;
    int hint;
    int response_set;     /* ps_rpc_client_call_ex left a response on a non-OK code */
    char details[PS_RPC_DETAILS_MAX];
} res;

/* A call of method with the request rb (NULL: none) and a deadline of
 * timeout_ms; the caller frees .data. */
static res call_req(ps_rpc_client *c, const char *method, const grpc_byte_buffer *rb, int timeout_ms) {
    res r;
    memset(&r, 0, sizeof r);
    grpc_byte_buffer *resp = (grpc_byte_buffer *)1;  /* must be overwritten */
    ps_err err;
    r.hint = -1;
    ps_status st = ps_rpc_client_call_ex(c, method, rb, &resp, timeout_ms, &r.code, r.details, sizeof r.details,
                                         &r.hint, &err);
    CHECK_MSG(st == PS_OK, "%s", err.msg);
    if (r.code == GRPC_STATUS_OK) {
        r.data = bb_bytes(resp, &r.n);
        if (resp) grpc_byte_buffer_destroy(resp);
    } else {
        r.response_set = resp != NULL;
        if (resp && resp != (grpc_byte_buffer *)1) grpc_byte_buffer_destroy(resp);
    }
    return r;
}

/* ... with the request req[0..n) (req NULL: a NULL request). */
static res call_bytes(ps_rpc_client *c, const char *method, const void *req, size_t n, int timeout_ms) {
    grpc_byte_buffer *rb = req ? bb_new(req, n) : NULL;
    res r = call_req(c, method, rb, timeout_ms);
    if (rb) grpc_byte_buffer_destroy(rb);
    return r;
}

static res call_u64(ps_rpc_client *c, const char *method, uint64_t v, int timeout_ms) {
    return call_bytes(c, method, &v, 8, timeout_ms);
}

static int res_is(const res *r, const char *s) { return r->code == GRPC_STATUS_OK && r->n == strlen(s) && memcmp(r->data, s, r->n) == 0; }

/* An echo of n pseudo-random bytes: 1 if the reply is right. */
static int echo_call(ps_rpc_client *c, size_t n, uint32_t seed, res *out) {
    unsigned char *in = rand_bytes(n, seed);
    res r = call_bytes(c, M_ECHO, in, n, 20000);
    int ok = r.code == GRPC_STATUS_OK && echo_ok(in, n, r.data, r.n);
    free(in);
    if (out) *out = r;
    else free(r.data);
    return ok;
}

static int local_conns(ps_rpc_server *s) {
    ps_rpc_admission a;
    ps_rpc_server_admission(s, &a);
    return a.local_connections;
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;  /* the directory's own */
}

/* Mappings of memfds in this process (client and server sides). */
static int memfd_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, "/memfd:") != NULL;
    fclose(f);
    return n;
}

/* ---- a client of our own on the socket ------------------------------------ */

static int raw_connect(const char *path) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%.107s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        CHECK_MSG(0, "connect %s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* A memfd of size bytes with seals (0: none). */
static int memfd_make(size_t size, int seals) {
    int fd = memfd_create("test-local", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    PS_ASSERT(fd >= 0);
    PS_ASSERT(ftruncate(fd, (off_t)size) == 0);
    if (seals) PS_ASSERT(fcntl(fd, F_ADD_SEALS, seals) == 0);
    return fd;
}

/* Send msg[0..n) with fds attached (nfds 0: none); 0 on success. */
static int send_fds(int fd, const void *msg, size_t n, const int *fds, int nfds) {
    union {
        char buf[CMSG_SPACE(16 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct iovec iov = {(void *)msg, n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        m.msg_control = ctl.buf;
        m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
    }
    return sendmsg(fd, &m, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* A message within ms: its size, 0 at EOF, -1 on error, -2 on timeout. */
static ssize_t recv_within(int fd, void *buf, size_t n, int ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int pr;
    while ((pr = poll(&p, 1, ms)) < 0 && errno == EINTR) {}
    if (pr == 0) return -2;
    if (pr < 0) return -1;
    return recv(fd, buf, n, MSG_DONTWAIT);
}

/* The hello's answer on fd: its code, or -1 when none came (EOF, timeout,
 * not a welcome); w filled. */
static int read_welcome(int fd, ps_local_welcome *w) {
    memset(w, 0, sizeof *w);
    ssize_t n = recv_within(fd, w, sizeof *w, WAIT_MS);
    if (n < (ssize_t)offsetof(ps_local_welcome, details) + 1 || w->magic != PS_LOCAL_MAGIC) return -1;
    w->details[sizeof w->details - 1] = '\0';
    return w->code;
}

/* 1 if psd closed fd (EOF within WAIT_MS, nothing else before it). */
static int closed_by_psd(int fd) {
    char b[16];
    return recv_within(fd, b, sizeof b, WAIT_MS) == 0;
}

static ps_local_hello hello_msg(size_t region, const char *token, size_t *len) {
    ps_local_hello h;
    memset(&h, 0, sizeof h);
    h.magic = PS_LOCAL_MAGIC;
    h.version = PS_LOCAL_VERSION;
    h.region = region;
    h.token_len = token ? (uint32_t)strlen(token) : 0;
    if (token) memcpy(h.token, token, h.token_len);
    *len = offsetof(ps_local_hello, token) + h.token_len;
    return h;
}

typedef struct raw_conn {
    int fd;
    unsigned char *map;  /* 2 x region */
    size_t region;
} raw_conn;

/* Connect and say a correct hello: the welcome's code (k set up on OK,
 * k->fd open either way unless -1). */
static int raw_open(const char *path, size_t region, const char *token, raw_conn *k, ps_local_welcome *w) {
    memset(k, 0, sizeof *k);
    k->region = region;
    k->fd = raw_connect(path);
    if (k->fd < 0) return -1;
    int mfd = memfd_make(2 * region, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    k->map = mmap(NULL, 2 * region, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    PS_ASSERT(k->map != MAP_FAILED);
    size_t n;
    ps_local_hello h = hello_msg(region, token, &n);
    int rc = send_fds(k->fd, &h, n, &mfd, 1);
    close(mfd);
    ps_local_welcome ww;
    if (!w) w = &ww;
    return rc != 0 ? -1 : read_welcome(k->fd, w);
}

static void raw_close(raw_conn *k) {
    if (k->map) munmap(k->map, 2 * k->region);
    if (k->fd >= 0) close(k->fd);
    k->map = NULL;
    k->fd = -1;
}

static ps_local_request request_msg(uint32_t seq, const char *path, uint64_t len, int64_t timeout_ms, size_t *n) {
    ps_local_request q;
    memset(&q, 0, sizeof q);
    q.magic = PS_LOCAL_MAGIC;
    q.seq = seq;
    q.len = len;
    q.timeout_ms = timeout_ms;
    q.path_len = (uint32_t)strlen(path);
    memcpy(q.path, path, q.path_len);
    *n = offsetof(ps_local_request, path) + q.path_len;
    return q;
}

/* Send a request message of n bytes and read the reply: its code, or -1
 * when none came; r filled. */
static int raw_exchange(raw_conn *k, const ps_local_request *q, size_t n, ps_local_reply *r) {
    memset(r, 0, sizeof *r);
    if (send(k->fd, q, n, MSG_NOSIGNAL) != (ssize_t)n) return -1;
    ssize_t got = recv_within(k->fd, r, sizeof *r, WAIT_MS);
    if (got < (ssize_t)offsetof(ps_local_reply, details) + 1 || r->magic != PS_LOCAL_MAGIC) return -1;
    r->details[sizeof r->details - 1] = '\0';
    return r->code;
}

/* An echo of in[0..n) on k, seq: 1 if the reply is right. */
static int raw_echo(raw_conn *k, uint32_t seq, const unsigned char *in, size_t n) {
    memcpy(k->map, in, n);
    size_t qn;
    ps_local_request q = request_msg(seq, M_ECHO, n, 0, &qn);
    ps_local_reply r;
    int code = raw_exchange(k, &q, qn, &r);
    return code == GRPC_STATUS_OK && r.seq == seq && echo_ok(in, n, k->map + k->region, (size_t)r.len);
}

/* ---- 1. calls ---------------------------------------------------------------- */

static void test_calls(ps_rpc_server *s, const char *path) {
    ps_rpc_client *c = local_client(path, MAX_MSG, NULL);
    if (!c) return;
    res r;

    /* Echo: the reply's bytes are the handler's. */
    CHECK(echo_call(c, 1000, 1, NULL));
    CHECK(echo_call(c, 1, 2, NULL));
    /* A request of several slices arrives as their concatenation. */
    {
        grpc_slice sl[3] = {grpc_slice_from_copied_string("abc"), grpc_slice_from_copied_string(""),
                            grpc_slice_from_copied_string("defgh")};
        grpc_byte_buffer *rb = grpc_raw_byte_buffer_create(sl, 3);
        for (int i = 0; i < 3; i++) grpc_slice_unref(sl[i]);
        r = call_req(c, M_ECHO, rb, 10000);
        CHECK_MSG(r.code == GRPC_STATUS_OK && echo_ok((const unsigned char *)"abcdefgh", 8, r.data, r.n),
                  "%s: %s", ps_grpc_code_name(r.code), r.details);
        CHECK(grpc_byte_buffer_length(rb) == 8);  /* still the caller's */
        grpc_byte_buffer_destroy(rb);
        free(r.data);
    }
    /* Empty requests: NULL and zero bytes. */
    r = call_bytes(c, M_ECHO, NULL, 0, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_OK && echo_ok((const unsigned char *)"", 0, r.data, r.n), "%s: %s",
              ps_grpc_code_name(r.code), r.details);
    free(r.data);
    r = call_bytes(c, M_ECHO, "", 0, 10000);
    CHECK(r.code == GRPC_STATUS_OK && echo_ok((const unsigned char *)"", 0, r.data, r.n));
    free(r.data);
    /* An empty reply. */
    r = call_u64(c, M_BIG, 0, 10000);
    CHECK(r.code == GRPC_STATUS_OK && r.n == 0);
    free(r.data);

    /* 6 MiB each way, then the region's edge: a request of region - 8
     * bytes has a reply of exactly the region. */
    CHECK(echo_call(c, 6 * MB, 3, NULL));
    CHECK(echo_call(c, MAX_MSG - 8, 4, NULL));
    /* Sequential calls use one connection. */
    CHECK(WAIT_UNTIL(local_conns(s) == 1, WAIT_MS));

    /* Error code and details, no response, no hint (the handler set one,
     * but its status is not RESOURCE_EXHAUSTED). */
    r = call_bytes(c, M_FAIL, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_INVALID_ARGUMENT && !r.response_set && r.hint == 0, "%s, hint %d",
              ps_grpc_code_name(r.code), r.hint);
    CHECK_MSG(strcmp(r.details, M_FAIL ": fail 42") == 0, "%s", r.details);
    CHECK(ps_status_from_grpc(r.code) == PS_ERR_INVALID_ARGUMENT);

    /* Unknown method: UNIMPLEMENTED naming it. */
    r = call_bytes(c, "/ps.ParameterServer/Nope", "x", 1, 10000);
    CHECK(r.code == GRPC_STATUS_UNIMPLEMENTED && !r.response_set);
    CHECK_MSG(strstr(r.details, "/ps.ParameterServer/Nope") != NULL, "%s", r.details);
    /* A method path longer than the protocol carries. */
    char longpath[200];
    memset(longpath, 'a', sizeof longpath - 1);
    longpath[0] = '/';
    longpath[sizeof longpath - 1] = '\0';
    r = call_bytes(c, longpath, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_INVALID_ARGUMENT, "%s: %s", ps_grpc_code_name(r.code), r.details);

    /* RESOURCE_EXHAUSTED with the handler's retry hint; one past what a
     * client reads is cut to PS_RPC_RETRY_AFTER_MAX_MS. */
    r = call_bytes(c, M_BUSY, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && r.hint == 250, "%s, hint %d", ps_grpc_code_name(r.code),
              r.hint);
    CHECK_MSG(strcmp(r.details, "busy, come back later") == 0, "%s", r.details);
    r = call_bytes(c, M_BUSY_LONG, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && r.hint == 60000, "%s, hint %d", ps_grpc_code_name(r.code),
              r.hint);

    /* Deferred and completed by the handler itself. */
    r = call_bytes(c, M_DEFER_SELF, NULL, 0, 10000);
    CHECK_MSG(res_is(&r, "self"), "%s: %s", ps_grpc_code_name(r.code), r.details);
    free(r.data);

    /* A handler slower than the deadline: DEADLINE_EXCEEDED while it still
     * runs (the gate opens only after the client returned). */
    gate_set(0);
    int passed = atomic_load(&gate_passed);
    double t0 = ps_mono_s() * 1e3;
    r = call_bytes(c, M_GATE, "x", 1, 200);
    double dt = ps_mono_s() * 1e3 - t0;
    CHECK_MSG(r.code == GRPC_STATUS_DEADLINE_EXCEEDED, "%s: %s", ps_grpc_code_name(r.code), r.details);
    CHECK_MSG(dt >= 190, "a 200 ms deadline passed after %.0f ms", dt);
    CHECK(atomic_load(&gate_passed) == passed);
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 1, WAIT_MS));
    gate_set(1);
    /* Its late reply goes nowhere; psd lets the connection go, and the
     * client's next call works on a new one. */
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 0, WAIT_MS));
    CHECK(echo_call(c, 100, 5, NULL));
    CHECK(WAIT_UNTIL(local_conns(s) == 1, WAIT_MS));

    /* The same server's gRPC port serves the same methods. */
    char target[64];
    ps_err err;
    snprintf(target, sizeof target, "127.0.0.1:%d", ps_rpc_server_port(s));
    ps_rpc_client *g = ps_rpc_client_create(target, MAX_MSG, &err);
    CHECK(g && echo_call(g, 5000, 6, NULL));
    ps_rpc_client_free(g);
    ps_rpc_client_free(c);
}

/* ---- 2. the region ---------------------------------------------------------- */

static void test_region(ps_rpc_server *s, const char *path) {
    ps_rpc_client *c = local_client(path, 64 * KB, NULL);
    if (!c) return;
    res r;
    /* Request and reply each just fit. */
    CHECK(echo_call(c, 64 * KB - 8, 10, NULL));
    /* A request over the region: refused before it is sent. */
    int before = atomic_load(&echo_calls);
    unsigned char *in = rand_bytes(64 * KB + 1, 11);
    r = call_bytes(c, M_ECHO, in, 64 * KB + 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && r.hint == 0 && strstr(r.details, "region"), "%s: %s",
              ps_grpc_code_name(r.code), r.details);
    CHECK(atomic_load(&echo_calls) == before);
    /* A request of the region whose reply is 8 bytes over it: the handler
     * runs, the reply is refused (final: no hint). */
    r = call_bytes(c, M_ECHO, in, 64 * KB, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && r.hint == 0 && strstr(r.details, "region") &&
              !r.response_set, "%s: %s, hint %d", ps_grpc_code_name(r.code), r.details, r.hint);
    CHECK(atomic_load(&echo_calls) == before + 1);
    free(in);
    in = NULL;
    r = call_u64(c, M_BIG, 64 * KB + 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: %s", ps_grpc_code_name(r.code), r.details);
    r = call_u64(c, M_BIG, 64 * KB, 10000);
    int same = r.code == GRPC_STATUS_OK && r.n == 64 * KB;
    for (size_t i = 0; same && i < r.n; i++) same = r.data[i] == big_byte(i);
    CHECK_MSG(same, "%s: %s, %zu bytes", ps_grpc_code_name(r.code), r.details, r.n);
    free(r.data);
    /* ... and the connection serves on after those refusals. */
    CHECK(echo_call(c, 1000, 12, NULL));
    ps_rpc_client_free(c);
    /* ... refused by the client itself: a fresh client whose first call
     * is too large opens no connection. */
    CHECK(WAIT_UNTIL(local_conns(s) == 0, WAIT_MS));
    c = local_client(path, 64 * KB, NULL);
    in = rand_bytes(64 * KB + 1, 14);
    r = call_bytes(c, M_ECHO, in, 64 * KB + 1, 10000);
    CHECK(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED);
    free(in);
    CHECK(local_conns(s) == 0);  /* a connection would have been counted at its welcome */
    ps_rpc_client_free(c);

    /* A region under PS_LOCAL_REGION_MIN is raised to it. */
    c = local_client(path, 100, NULL);
    CHECK(echo_call(c, PS_LOCAL_REGION_MIN - 8, 13, NULL));
    r = call_bytes(c, M_ECHO, NULL, 0, 10000);
    CHECK(r.code == GRPC_STATUS_OK);
    free(r.data);
    ps_rpc_client_free(c);

    /* A client whose region is over server.max_message_mb: its hello is
     * refused, naming the key. */
    c = local_client(path, 2 * MAX_MSG, NULL);
    before = atomic_load(&echo_calls);
    r = call_bytes(c, M_ECHO, "abc", 3, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_INVALID_ARGUMENT && strstr(r.details, "server.max_message_mb"), "%s: %s",
              ps_grpc_code_name(r.code), r.details);
    CHECK(atomic_load(&echo_calls) == before);
    ps_rpc_client_free(c);
    /* One byte over, too. */
    c = local_client(path, MAX_MSG + 1, NULL);
    r = call_bytes(c, M_ECHO, "abc", 3, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_INVALID_ARGUMENT, "%s: %s", ps_grpc_code_name(r.code), r.details);
    ps_rpc_client_free(c);

    /* No psd on the path: UNAVAILABLE. */
    char nopath[128];
    sock_path(nopath, sizeof nopath, "nobody");
    c = local_client(nopath, 64 * KB, NULL);
    r = call_bytes(c, M_ECHO, "abc", 3, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_UNAVAILABLE && strstr(r.details, nopath), "%s: %s", ps_grpc_code_name(r.code),
              r.details);
    ps_rpc_client_free(c);
}

/* ---- 3. threads on one client --------------------------------------------------- */

/* A client thread: echo_thread makes `calls` echoes (ok: the right ones);
 * call_thread one call of method with the u64 id, deadline timeout_ms. */
typedef struct thr_arg { ps_rpc_client *c; int id, calls, ok, timeout_ms; const char *method; res r; } thr_arg;

static void *echo_thread(void *p) {
    thr_arg *a = p;
    for (int i = 0; i < a->calls; i++) {
        size_t n = (size_t)((a->id * 7919 + i * 1013) % 60000);
        a->ok += echo_call(a->c, n, (uint32_t)(a->id * 100000 + i), NULL);
    }
    return NULL;
}

static void *call_thread(void *p) {
    thr_arg *a = p;
    a->r = call_u64(a->c, a->method, (uint64_t)a->id, a->timeout_ms);
    return NULL;
}

static void test_threads(ps_rpc_server *s, const char *path) {
    ps_rpc_client *c = local_client(path, 1 * MB, NULL);
    if (!c) return;
    /* 4 calls in one gated handler at once: 4 connections. */
    gate_set(0);
    pthread_t th[6];
    thr_arg ta[6];
    for (int i = 0; i < 4; i++) {
        ta[i] = (thr_arg){.c = c, .id = 100 + i, .timeout_ms = 20000, .method = M_GATE};
        pthread_create(&th[i], NULL, call_thread, &ta[i]);
    }
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 4, WAIT_MS));
    CHECK(local_conns(s) >= 4);
    gate_set(1);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        uint64_t want = 8, got = 0;
        if (ta[i].r.code == GRPC_STATUS_OK && ta[i].r.n == 8) memcpy(&got, ta[i].r.data, 8);
        CHECK_MSG(ta[i].r.code == GRPC_STATUS_OK && got == want, "gate call %d: %s: %s", i,
                  ps_grpc_code_name(ta[i].r.code), ta[i].r.details);
        free(ta[i].r.data);
    }
    /* 6 threads x 100 echoes of different sizes on the one client. */
    for (int i = 0; i < 6; i++) {
        ta[i] = (thr_arg){.c = c, .id = i, .calls = 100};
        pthread_create(&th[i], NULL, echo_thread, &ta[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        CHECK_MSG(ta[i].ok == 100, "thread %d: %d of 100 echoes right", i, ta[i].ok);
    }
    CHECK(local_conns(s) <= 6 + 4);
    ps_rpc_client_free(c);
    /* psd lets the client's connections go. */
    CHECK(WAIT_UNTIL(local_conns(s) == 0, WAIT_MS));
}

/* ---- server.transport_memory_mb: requests held at once ----------------------- */

/* A call of M_GATE with 700 KiB of request, held in the gate. */
typedef struct held { ps_rpc_client *c; const unsigned char *p; res r; } held;

static void *held_main(void *p) {
    held *h = p;
    h->r = call_bytes(h->c, M_GATE, h->p, 700 * KB, 20000);
    return NULL;
}

static void test_transport_memory(void) {
    char path[128];
    ps_rpc_server *s = local_server("mem", (ps_rpc_server_opts){.transport_memory_mb = 1}, NULL, path, sizeof path);
    if (!s) return;
    ps_rpc_client *c = local_client(path, 1 * MB, NULL);
    gate_set(0);
    unsigned char *big = rand_bytes(700 * KB, 20);
    pthread_t t;
    held h = {c, big, {0}};
    pthread_create(&t, NULL, held_main, &h);
    CHECK(WAIT_UNTIL(atomic_load(&gate_blocked) == 1, WAIT_MS));
    /* another 700 KiB would pass the 1 MiB: refused with the calls' hint */
    res r = call_bytes(c, M_ECHO, big, 700 * KB, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && r.hint == PS_RPC_RETRY_AFTER_CALLS_MS, "%s: %s, hint %d",
              ps_grpc_code_name(r.code), r.details, r.hint);
    /* 200 KiB more fits */
    CHECK(echo_call(c, 200 * KB, 21, NULL));
    gate_set(1);
    pthread_join(t, NULL);
    uint64_t got = 0;
    if (h.r.code == GRPC_STATUS_OK && h.r.n == 8) memcpy(&got, h.r.data, 8);
    CHECK_MSG(got == 700 * KB, "%s: %s", ps_grpc_code_name(h.r.code), h.r.details);
    free(h.r.data);
    /* the held request is released: 700 KiB pass again */
    CHECK(echo_call(c, 700 * KB, 22, NULL));
    free(big);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

/* ---- 4. deferred calls ----------------------------------------------------------- */

static void test_deferred(ps_rpc_server *s, const char *path) {
    ps_rpc_client *c = local_client(path, 1 * MB, NULL);
    if (!c) return;
    pthread_t t;
    thr_arg a;

    /* Completed from another thread: the client gets that reply. */
    a = (thr_arg){.c = c, .id = 1, .timeout_ms = 20000, .method = M_DEFER};
    pthread_create(&t, NULL, call_thread, &a);
    CHECK(WAIT_UNTIL(def_has(1), WAIT_MS));
    ps_rpc_call *h = def_take(1);
    CHECK(h && ps_rpc_call_cancelled(h) == 0);
    if (h) CHECK(ps_rpc_call_complete(h, bb_new("reply-for-1", 11), GRPC_STATUS_OK, NULL) == 1);
    pthread_join(t, NULL);
    CHECK_MSG(res_is(&a.r, "reply-for-1"), "%s: %s", ps_grpc_code_name(a.r.code), a.r.details);
    free(a.r.data);

    /* ... with an error: code and details, no response. */
    a = (thr_arg){.c = c, .id = 2, .timeout_ms = 20000, .method = M_DEFER};
    pthread_create(&t, NULL, call_thread, &a);
    CHECK(WAIT_UNTIL(def_has(2), WAIT_MS));
    h = def_take(2);
    if (h) CHECK(ps_rpc_call_complete(h, bb_new("dropped", 7), GRPC_STATUS_NOT_FOUND, "no such thing 2") == 1);
    pthread_join(t, NULL);
    CHECK_MSG(a.r.code == GRPC_STATUS_NOT_FOUND && strcmp(a.r.details, "no such thing 2") == 0 && !a.r.response_set,
              "%s: %s", ps_grpc_code_name(a.r.code), a.r.details);

    /* ... RESOURCE_EXHAUSTED with the owner's retry hint. */
    a = (thr_arg){.c = c, .id = 3, .timeout_ms = 20000, .method = M_DEFER};
    pthread_create(&t, NULL, call_thread, &a);
    CHECK(WAIT_UNTIL(def_has(3), WAIT_MS));
    h = def_take(3);
    if (h) {
        ps_rpc_call_retry_after(h, 321);
        CHECK(ps_rpc_call_complete(h, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED, "later") == 1);
    }
    pthread_join(t, NULL);
    CHECK_MSG(a.r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && a.r.hint == 321, "%s: %s, hint %d",
              ps_grpc_code_name(a.r.code), a.r.details, a.r.hint);

    /* Never completed, the client's deadline passes: DEADLINE_EXCEEDED;
     * psd cancels the call (quiet: no on_cancel, the owner polls the
     * flag), and a late complete sends nothing. */
    int cancels0 = atomic_load(&cancels), seen0 = atomic_load(&cancels_seen_flag);
    res r = call_u64(c, M_DEFER_QUIET, 4, 300);
    CHECK_MSG(r.code == GRPC_STATUS_DEADLINE_EXCEEDED, "%s: %s", ps_grpc_code_name(r.code), r.details);
    CHECK(WAIT_UNTIL(def_has(4), WAIT_MS));  /* on a loaded machine the handler may run after the deadline */
    CHECK(WAIT_UNTIL(def_cancelled(4) == 1, WAIT_MS));
    h = def_take(4);
    if (h) CHECK(ps_rpc_call_complete(h, bb_new("late", 4), GRPC_STATUS_OK, NULL) == 0);
    CHECK(atomic_load(&cancels) == cancels0);  /* quiet: no on_cancel */

    /* ... with on_cancel: it runs, once, and sees the flag. */
    r = call_u64(c, M_DEFER, 5, 300);
    CHECK_MSG(r.code == GRPC_STATUS_DEADLINE_EXCEEDED, "%s: %s", ps_grpc_code_name(r.code), r.details);
    CHECK(WAIT_UNTIL(atomic_load(&cancels) == cancels0 + 1, WAIT_MS));
    CHECK(atomic_load(&cancels_seen_flag) == seen0 + 1);
    CHECK(!def_has(5));

    /* psd's own deadline (a client of our own that waits longer than the
     * deadline it sent): psd answers DEADLINE_EXCEEDED and cancels. */
    raw_conn k;
    CHECK(raw_open(path, 64 * KB, NULL, &k, NULL) == GRPC_STATUS_OK);
    uint64_t id = 6;
    memcpy(k.map, &id, 8);
    size_t qn;
    ps_local_request q = request_msg(77, M_DEFER, 8, 200, &qn);
    ps_local_reply rep;
    int code = raw_exchange(&k, &q, qn, &rep);
    CHECK_MSG(code == GRPC_STATUS_DEADLINE_EXCEEDED && rep.seq == 77 && rep.len == 0, "%d: %s", code, rep.details);
    CHECK(WAIT_UNTIL(atomic_load(&cancels) == cancels0 + 2, WAIT_MS));
    /* the connection serves on */
    unsigned char in[300];
    for (int i = 0; i < 300; i++) in[i] = (unsigned char)(i * 3);
    CHECK(raw_echo(&k, 78, in, sizeof in));

    /* A deadline too far to add to the clock is no deadline (not one in
     * the past): the call waits for its completion. */
    id = 8;
    memcpy(k.map, &id, 8);
    q = request_msg(80, M_DEFER, 8, INT64_MAX - 1, &qn);
    CHECK(send(k.fd, &q, qn, MSG_NOSIGNAL) == (ssize_t)qn);
    CHECK(WAIT_UNTIL(def_has(8), WAIT_MS));
    sleep_ms(120);  /* past a wait slice of the connection's thread */
    CHECK(def_cancelled(8) == 0);
    ps_rpc_call *h8 = def_take(8);
    if (h8) CHECK(ps_rpc_call_complete(h8, bb_new("far", 3), GRPC_STATUS_OK, NULL) == 1);
    {
        ssize_t got = recv_within(k.fd, &rep, sizeof rep, WAIT_MS);
        CHECK_MSG(got > 0 && rep.code == GRPC_STATUS_OK && rep.seq == 80 && rep.len == 3 &&
                  memcmp(k.map + k.region, "far", 3) == 0, "%zd: %d %s", got, rep.code, rep.details);
    }

    /* A client that hangs up while its call is deferred: on_cancel runs. */
    id = 7;
    memcpy(k.map, &id, 8);
    q = request_msg(79, M_DEFER, 8, 0, &qn);
    CHECK(send(k.fd, &q, qn, MSG_NOSIGNAL) == (ssize_t)qn);
    CHECK(WAIT_UNTIL(def_has(7), WAIT_MS));
    raw_close(&k);
    CHECK(WAIT_UNTIL(atomic_load(&cancels) == cancels0 + 3, WAIT_MS));
    CHECK(!def_has(7));
    CHECK(atomic_load(&cancels_seen_flag) == seen0 + 3);
    CHECK(atomic_load(&cancel_complete_bad) == 0);

    /* The client's pooled connection is still good. */
    CHECK(echo_call(c, 5000, 30, NULL));
    ps_rpc_client_free(c);
    CHECK(WAIT_UNTIL(local_conns(s) == 0, WAIT_MS));
    CHECK(atomic_load(&def_count) == 0);
}

/* Shutdown with deferred calls open. */
typedef struct shut_arg { ps_rpc_server *s; int grace; atomic_int done; } shut_arg;

static void *shutdown_thread(void *p) {
    shut_arg *a = p;
    ps_rpc_server_shutdown(a->s, a->grace);
    atomic_store(&a->done, 1);
    return NULL;
}

/* Wait for the shutdown in thread t; one that never returns fails the
 * test (it cannot go on). */
static void shutdown_join(pthread_t t, shut_arg *a) {
    if (!WAIT_UNTIL(atomic_load(&a->done), a->grace + WAIT_MS)) {
        CHECK_MSG(0, "ps_rpc_server_shutdown(%d) did not return", a->grace);
        exit(check_summary("test_rpc_local"));
    }
    pthread_join(t, NULL);
}

/* ps_rpc_server_shutdown(s, grace), which must return. */
static void shutdown_within(ps_rpc_server *s, int grace) {
    pthread_t t;
    shut_arg a = {s, grace, 0};
    pthread_create(&t, NULL, shutdown_thread, &a);
    shutdown_join(t, &a);
}

static void test_shutdown_deferred(void) {
    char path[128];
    struct stat st;
    /* Completed within the grace: the client gets its reply; no new
     * connection is taken meanwhile. */
    ps_rpc_server *s = local_server("shut1", (ps_rpc_server_opts){0}, NULL, path, sizeof path);
    if (!s) return;
    ps_rpc_client *c = local_client(path, 1 * MB, NULL);
    CHECK(echo_call(c, 10, 40, NULL));
    pthread_t t, ts;
    thr_arg a = {.c = c, .id = 10, .timeout_ms = 60000, .method = M_DEFER};
    pthread_create(&t, NULL, call_thread, &a);
    CHECK(WAIT_UNTIL(def_has(10), WAIT_MS));
    shut_arg sa = {s, 60000, 0};
    pthread_create(&ts, NULL, shutdown_thread, &sa);
    CHECK(WAIT_UNTIL(lstat(path, &st) != 0, WAIT_MS));  /* stopped: the socket file is gone */
    ps_rpc_client *late = local_client(path, 1 * MB, NULL);
    res r = call_bytes(late, M_ECHO, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_UNAVAILABLE, "%s: %s", ps_grpc_code_name(r.code), r.details);
    ps_rpc_client_free(late);
    ps_rpc_call *h = def_take(10);
    if (h) CHECK(ps_rpc_call_complete(h, bb_new("in-grace", 8), GRPC_STATUS_OK, NULL) == 1);
    pthread_join(t, NULL);
    CHECK_MSG(res_is(&a.r, "in-grace"), "%s: %s", ps_grpc_code_name(a.r.code), a.r.details);
    free(a.r.data);
    shutdown_join(ts, &sa);  /* returns once the call is answered, well before the grace ends */
    /* the client's connection was closed by the shutdown */
    r = call_bytes(c, M_ECHO, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_UNAVAILABLE, "%s: %s", ps_grpc_code_name(r.code), r.details);
    ps_rpc_server_free(s);
    ps_rpc_client_free(c);

    /* Not completed within the grace: cancelled (on_cancel; the quiet
     * one's flag), the clients get UNAVAILABLE or CANCELLED, shutdown
     * returns; completing after the server is freed sends nothing. */
    s = local_server("shut2", (ps_rpc_server_opts){0}, NULL, path, sizeof path);
    if (!s) return;
    c = local_client(path, 1 * MB, NULL);
    int cancels0 = atomic_load(&cancels);
    pthread_t t2;
    thr_arg a2 = {.c = c, .id = 12, .timeout_ms = 60000, .method = M_DEFER_QUIET};
    a = (thr_arg){.c = c, .id = 11, .timeout_ms = 60000, .method = M_DEFER};
    pthread_create(&t, NULL, call_thread, &a);
    pthread_create(&t2, NULL, call_thread, &a2);
    CHECK(WAIT_UNTIL(def_has(11) && def_has(12), WAIT_MS));
    /* and a client whose connection sits idle in its pool */
    ps_rpc_client *idle = local_client(path, 64 * KB, NULL);
    CHECK(echo_call(idle, 10, 41, NULL));
    CHECK(WAIT_UNTIL(local_conns(s) == 3, WAIT_MS));
    shutdown_within(s, 300);
    pthread_join(t, NULL);
    pthread_join(t2, NULL);
    CHECK_MSG(a.r.code == GRPC_STATUS_UNAVAILABLE || a.r.code == GRPC_STATUS_CANCELLED, "%s: %s",
              ps_grpc_code_name(a.r.code), a.r.details);
    CHECK_MSG(a2.r.code == GRPC_STATUS_UNAVAILABLE || a2.r.code == GRPC_STATUS_CANCELLED, "%s: %s",
              ps_grpc_code_name(a2.r.code), a2.r.details);
    CHECK(WAIT_UNTIL(atomic_load(&cancels) == cancels0 + 1, WAIT_MS));
    CHECK(!def_has(11));
    CHECK(def_cancelled(12) == 1);
    r = call_bytes(idle, M_ECHO, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_UNAVAILABLE, "%s: %s", ps_grpc_code_name(r.code), r.details);
    ps_rpc_client_free(idle);
    ps_rpc_server_free(s);
    h = def_take(12);
    if (h) CHECK(ps_rpc_call_complete(h, bb_new("after free", 10), GRPC_STATUS_OK, NULL) == 0);
    CHECK(lstat(path, &st) != 0);
    ps_rpc_client_free(c);
}

/* ---- 5. a client of our own: malformed messages ------------------------------ */

/* A hello message of n bytes from h with fds; the welcome's code (-1:
 * none) and details; 1 in *closed if psd closed the connection after it. */
static int bad_hello(const char *path, const void *h, size_t n, const int *fds, int nfds, char *details,
                     int *closed) {
    int fd = raw_connect(path);
    if (fd < 0) return -1;
    ps_local_welcome w;
    int code = send_fds(fd, h, n, fds, nfds) == 0 ? read_welcome(fd, &w) : -1;
    snprintf(details, PS_LOCAL_DETAILS_MAX, "%s", code >= 0 ? w.details : "(no welcome)");
    *closed = closed_by_psd(fd);
    close(fd);
    return code;
}

#define EXPECT_HELLO(want, substr, h, n, fds, nfds) do { \
    char d_[PS_LOCAL_DETAILS_MAX]; int closed_; \
    int code_ = bad_hello(path, h, n, fds, nfds, d_, &closed_); \
    CHECK_MSG(code_ == (int)(want) && strstr(d_, substr) && closed_, "hello: %d (%s), closed %d; want %d with %s", \
              code_, d_, closed_, (int)(want), substr); \
} while (0)

/* A request message on a fresh connection: the reply's code (-1: none),
 * 1 in *closed if psd closed the connection after it. */
static int bad_request(const char *path, const void *q, size_t n, ps_local_reply *r, int *closed) {
    raw_conn k;
    int code = -1;
    *closed = 0;
    if (raw_open(path, 64 * KB, NULL, &k, NULL) == GRPC_STATUS_OK) {
        code = raw_exchange(&k, q, n, r);
        *closed = closed_by_psd(k.fd);
    }
    raw_close(&k);
    return code;
}

static void test_raw(void) {
    char path[128];
    ps_rpc_server *s = local_server("raw", (ps_rpc_server_opts){.recv_timeout_s = 1.5}, NULL, path, sizeof path);
    if (!s) return;
    ps_rpc_client *c = local_client(path, 1 * MB, NULL);
    CHECK(echo_call(c, 100, 50, NULL));
    int fds0 = open_fds(), maps0 = memfd_maps();
    CHECK(maps0 >= 2);  /* the client's connection: its mapping and psd's */
    const size_t R = 64 * KB;
    const int good_seals = F_SEAL_SHRINK | F_SEAL_GROW;
    size_t n;
    ps_local_hello h = hello_msg(R, NULL, &n);

    /* Hellos. */
    EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "no shared memory", &h, n, NULL, 0);
    int m = memfd_make(2 * R, 0);  /* not sealed */
    EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "sealed", &h, n, &m, 1);
    close(m);
    m = memfd_make(2 * R, F_SEAL_SHRINK);  /* may grow */
    EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "sealed", &h, n, &m, 1);
    close(m);
    m = memfd_make(2 * R, F_SEAL_GROW);  /* may shrink */
    EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "sealed", &h, n, &m, 1);
    close(m);
    m = memfd_make(2 * R + 4096, good_seals);  /* not 2 x region */
    EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "region", &h, n, &m, 1);
    close(m);
    m = memfd_make(R, good_seals);
    EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "region", &h, n, &m, 1);
    close(m);
    {
        ps_local_hello small = hello_msg(1024, NULL, &n);  /* under PS_LOCAL_REGION_MIN */
        m = memfd_make(2048, good_seals);
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "region", &small, n, &m, 1);
        close(m);
        ps_local_hello huge = hello_msg(2 * (size_t)MAX_MSG, NULL, &n);  /* over server.max_message_mb */
        m = memfd_make(4 * (size_t)MAX_MSG, good_seals);
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "server.max_message_mb", &huge, n, &m, 1);
        close(m);
    }
    m = memfd_make(2 * R, good_seals);
    {
        ps_local_hello b = h;
        b.magic ^= 1;
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "malformed", &b, n, &m, 1);
        b = h;
        b.version = PS_LOCAL_VERSION + 1;
        char want[64];
        snprintf(want, sizeof want, "version %d", PS_LOCAL_VERSION + 1);
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, want, &b, n, &m, 1);
        b = h;
        b.token_len = PS_LOCAL_TOKEN_MAX + 1;
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "malformed", &b, sizeof b, &m, 1);
        b = h;  /* the whole struct, though token_len is 0 */
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "malformed", &b, sizeof b, &m, 1);
        b = h;
        b.token_len = 5;  /* says 5 token bytes, sends none */
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "malformed", &b, n, &m, 1);
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "malformed", &h, 4, &m, 1);  /* 4 bytes */
    }
    close(m);
    {
        int p[2];
        PS_ASSERT(pipe(p) == 0);
        EXPECT_HELLO(GRPC_STATUS_INVALID_ARGUMENT, "memfd", &h, n, &p[0], 1);
        close(p[0]);
        close(p[1]);
    }
    /* Sealed against writing too: psd cannot map it writable. */
    m = memfd_make(2 * R, good_seals | F_SEAL_WRITE);
    {
        char d[PS_LOCAL_DETAILS_MAX];
        int closed;
        int code = bad_hello(path, &h, n, &m, 1, d, &closed);
        CHECK_MSG(code > 0 && closed, "write-sealed memfd: %d (%s)", code, d);
    }
    close(m);
    /* Two descriptors: the first is the memfd, the other is closed. */
    {
        int fd = raw_connect(path);
        int two[2] = {memfd_make(2 * R, good_seals), memfd_make(16, 0)};
        ps_local_welcome w;
        CHECK(send_fds(fd, &h, n, two, 2) == 0 && read_welcome(fd, &w) == GRPC_STATUS_OK);
        close(two[0]);
        close(two[1]);
        close(fd);
    }

    /* More descriptors than psd takes: none of them stays open in psd
     * (the descriptor count at the end). */
    {
        int fd = raw_connect(path);
        int many[12];
        many[0] = memfd_make(2 * R, good_seals);
        for (int i = 1; i < 12; i++) many[i] = memfd_make(16, 0);
        ps_local_welcome w;
        int code = send_fds(fd, &h, n, many, 12) == 0 ? read_welcome(fd, &w) : -2;
        CHECK_MSG(code >= 0, "12 descriptors: %d", code);
        for (int i = 0; i < 12; i++) close(many[i]);
        close(fd);
    }

    /* Silent: no hello within server.recv_timeout_s: DEADLINE_EXCEEDED,
     * closed. Connect-and-close: nothing. */
    {
        int fd = raw_connect(path);
        ps_local_welcome w;
        int code = read_welcome(fd, &w);
        CHECK_MSG(code == GRPC_STATUS_DEADLINE_EXCEEDED, "silent client: %d (%s)", code, w.details);
        CHECK(closed_by_psd(fd));
        close(fd);
        close(raw_connect(path));
    }
    CHECK(echo_call(c, 2000, 51, NULL));

    /* Requests on a good connection. */
    raw_conn k;
    CHECK(raw_open(path, R, NULL, &k, NULL) == GRPC_STATUS_OK);
    unsigned char *in = rand_bytes(R - 8, 52);
    CHECK(raw_echo(&k, 1, in, R - 8));
    CHECK(raw_echo(&k, 0xfffffff0u, in, 17));
    ps_local_reply rep;
    size_t qn;
    /* over the region: refused unread, the connection serves on */
    ps_local_request q = request_msg(2, M_ECHO, R + 1, 0, &qn);
    int before = atomic_load(&echo_calls);
    int code = raw_exchange(&k, &q, qn, &rep);
    CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED && rep.seq == 2 && rep.len == 0, "%d: %s", code, rep.details);
    q = request_msg(3, M_ECHO, UINT64_MAX, 0, &qn);
    code = raw_exchange(&k, &q, qn, &rep);
    CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED && rep.seq == 3, "%d: %s", code, rep.details);
    CHECK(atomic_load(&echo_calls) == before);
    /* unknown method: UNIMPLEMENTED, serves on */
    q = request_msg(4, "/x/y", 0, 0, &qn);
    code = raw_exchange(&k, &q, qn, &rep);
    CHECK_MSG(code == GRPC_STATUS_UNIMPLEMENTED && rep.seq == 4 && strstr(rep.details, "/x/y"), "%d: %s", code,
              rep.details);
    CHECK(raw_echo(&k, 5, in, 1000));
    /* a reply over the region (Big R + 1): RESOURCE_EXHAUSTED, serves on */
    uint64_t want = R + 1;
    memcpy(k.map, &want, 8);
    q = request_msg(6, M_BIG, 8, 0, &qn);
    code = raw_exchange(&k, &q, qn, &rep);
    CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED && rep.len == 0, "%d: %s", code, rep.details);
    CHECK(raw_echo(&k, 7, in, 1000));
    /* truncated: answered INVALID_ARGUMENT, then closed */
    q = request_msg(8, M_ECHO, 10, 0, &qn);
    code = raw_exchange(&k, &q, 10, &rep);
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT, "%d: %s", code, rep.details);
    CHECK(closed_by_psd(k.fd));
    raw_close(&k);

    int closed;
    q = request_msg(9, M_ECHO, 10, 0, &qn);
    q.path_len = PS_LOCAL_PATH_MAX + 72;  /* path_len too large, whole struct sent */
    code = bad_request(path, &q, sizeof q, &rep, &closed);
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && closed, "path_len %u: %d (%s)", q.path_len, code, rep.details);
    q.path_len = UINT32_MAX;
    code = bad_request(path, &q, sizeof q, &rep, &closed);
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && closed, "path_len %u: %d (%s)", q.path_len, code, rep.details);
    q = request_msg(10, M_ECHO, 10, 0, &qn);
    q.path_len = 0;
    code = bad_request(path, &q, offsetof(ps_local_request, path), &rep, &closed);
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && closed, "path_len 0: %d (%s)", code, rep.details);
    q = request_msg(11, M_ECHO, 10, 0, &qn);
    code = bad_request(path, &q, qn + 3, &rep, &closed);  /* 3 bytes more than path_len says */
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && closed, "length mismatch: %d (%s)", code, rep.details);
    q = request_msg(12, M_ECHO, 10, 0, &qn);
    q.magic = 0x12345678;
    code = bad_request(path, &q, qn, &rep, &closed);
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && closed, "bad magic: %d (%s)", code, rep.details);
    q = request_msg(13, M_ECHO, 10, 0, &qn);
    code = bad_request(path, &q, 3, &rep, &closed);
    CHECK_MSG(code == GRPC_STATUS_INVALID_ARGUMENT && closed, "3 bytes: %d (%s)", code, rep.details);
    free(in);

    /* psd serves on; every connection and descriptor of the above is gone. */
    CHECK(echo_call(c, 3000, 53, NULL));
    CHECK(WAIT_UNTIL(local_conns(s) == 1, WAIT_MS));
    CHECK_MSG(WAIT_UNTIL(open_fds() == fds0, WAIT_MS), "%d descriptors open, %d before", open_fds(), fds0);
    CHECK_MSG(WAIT_UNTIL(memfd_maps() == maps0, WAIT_MS), "%d memfd mappings, %d before", memfd_maps(), maps0);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

/* ---- 6. the connection caps -------------------------------------------------------- */

static void test_caps(void) {
    char path[128];
    ps_local_welcome w;
    /* server.max_connections_per_client = 2: a third connection of the
     * client ("local": every process of psd's user) is refused at its hello,
     * with a retry hint; once one closes, a new one is taken. */
    ps_rpc_server *s = local_server("cap", (ps_rpc_server_opts){.max_connections_per_client = 2}, NULL, path,
                                    sizeof path);
    if (!s) return;
    raw_conn a, b, x;
    CHECK(raw_open(path, 64 * KB, NULL, &a, NULL) == GRPC_STATUS_OK);
    CHECK(raw_open(path, 64 * KB, NULL, &b, NULL) == GRPC_STATUS_OK);
    int code = raw_open(path, 64 * KB, NULL, &x, &w);
    CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED && strstr(w.details, "max_connections_per_client"), "%d: %s",
              code, w.details);
    CHECK_MSG(w.retry_after_ms > 0, "the cap's refusal has no retry hint (%d)", w.retry_after_ms);
    CHECK(closed_by_psd(x.fd));
    raw_close(&x);
    /* through a client: the same refusal */
    ps_rpc_client *c = local_client(path, 64 * KB, NULL);
    res r = call_bytes(c, M_ECHO, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && r.hint > 0, "%s: %s (hint %d)", ps_grpc_code_name(r.code),
              r.details, r.hint);
    /* the two taken ones serve */
    unsigned char in[64] = "the quick brown fox";
    CHECK(raw_echo(&a, 1, in, sizeof in));
    CHECK(raw_echo(&b, 1, in, sizeof in));
    raw_close(&a);
    /* psd notices the close: a new connection is taken */
    CHECK(WAIT_UNTIL(local_conns(s) == 1, WAIT_MS));
    CHECK(echo_call(c, 100, 60, NULL));
    raw_close(&b);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);

    /* server.max_calls = 3 in all: the fourth connection is refused at
     * once, before its hello. */
    s = local_server("total", (ps_rpc_server_opts){.max_calls = 3, .max_connections_per_client = 8}, NULL, path,
                     sizeof path);
    if (!s) return;
    raw_conn k[3];
    for (int i = 0; i < 3; i++) CHECK(raw_open(path, 64 * KB, NULL, &k[i], NULL) == GRPC_STATUS_OK);
    int fd = raw_connect(path);
    code = read_welcome(fd, &w);
    CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED && strstr(w.details, "max_calls"), "%d: %s", code, w.details);
    CHECK(closed_by_psd(fd));
    close(fd);
    raw_close(&k[1]);
    CHECK(WAIT_UNTIL(local_conns(s) == 2, WAIT_MS));
    /* the accept thread reaps the closed one before it counts */
    CHECK(raw_open(path, 64 * KB, NULL, &k[1], &w) == GRPC_STATUS_OK);
    CHECK(raw_echo(&k[1], 9, in, sizeof in));
    for (int i = 0; i < 3; i++) raw_close(&k[i]);
    ps_rpc_server_free(s);
}

/* ---- 7. tokens ----------------------------------------------------------------- */

#define TOK_TRAINER "trainer-secret-0123456789abcdef"
#define TOK_READER "reader-secret-0123456789abcdef"

static void test_tokens(void) {
    static const char *const reader_methods[] = {M_PING, M_WHO, NULL};
    ps_rpc_token toks[2] = {{TOK_TRAINER, "trainer", NULL}, {TOK_READER, "reader", reader_methods}};
    ps_rpc_security sec = {.tokens = toks, .ntokens = 2};
    char path[128];
    ps_rpc_server *s = local_server("tok", (ps_rpc_server_opts){0}, &sec, path, sizeof path);
    if (!s) return;
    int before = atomic_load(&echo_calls);
    res r;

    ps_rpc_client *c = local_client(path, 64 * KB, NULL);
    r = call_bytes(c, M_ECHO, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_UNAUTHENTICATED && strstr(r.details, "token"), "no token: %s: %s",
              ps_grpc_code_name(r.code), r.details);
    ps_rpc_client_free(c);
    c = local_client(path, 64 * KB, "wrong-secret-0123456789abcdef");
    r = call_bytes(c, M_PING, NULL, 0, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_UNAUTHENTICATED && strstr(r.details, "invalid token"), "wrong token: %s: %s",
              ps_grpc_code_name(r.code), r.details);
    ps_rpc_client_free(c);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%.20s", TOK_TRAINER);
    c = local_client(path, 64 * KB, prefix);
    r = call_bytes(c, M_PING, NULL, 0, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_UNAUTHENTICATED, "prefix: %s: %s", ps_grpc_code_name(r.code), r.details);
    ps_rpc_client_free(c);
    c = local_client(path, 64 * KB, TOK_TRAINER "x");
    r = call_bytes(c, M_PING, NULL, 0, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_UNAUTHENTICATED, "longer: %s: %s", ps_grpc_code_name(r.code), r.details);
    ps_rpc_client_free(c);

    /* The restricted token: its methods only. */
    c = local_client(path, 64 * KB, TOK_READER);
    r = call_bytes(c, M_ECHO, "x", 1, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_PERMISSION_DENIED && strstr(r.details, M_ECHO) && strstr(r.details, "reader"),
              "reader Echo: %s: %s", ps_grpc_code_name(r.code), r.details);
    r = call_bytes(c, M_PING, NULL, 0, 10000);
    CHECK_MSG(res_is(&r, "pong"), "reader Ping: %s: %s", ps_grpc_code_name(r.code), r.details);
    free(r.data);
    r = call_bytes(c, M_WHO, NULL, 0, 10000);
    CHECK_MSG(res_is(&r, "reader|token:reader"), "reader Who: %s: %s %.*s", ps_grpc_code_name(r.code), r.details,
              (int)r.n, r.data ? (char *)r.data : "");
    free(r.data);
    /* the connection serves on after the refusal */
    r = call_bytes(c, M_FAIL, NULL, 0, 10000);
    CHECK(r.code == GRPC_STATUS_PERMISSION_DENIED);
    ps_rpc_client_free(c);
    CHECK(atomic_load(&echo_calls) == before);

    /* The unrestricted one: everything. */
    c = local_client(path, 64 * KB, TOK_TRAINER);
    CHECK(echo_call(c, 500, 70, NULL));
    r = call_bytes(c, M_WHO, NULL, 0, 10000);
    CHECK_MSG(res_is(&r, "trainer|token:trainer"), "trainer Who: %s: %s", ps_grpc_code_name(r.code), r.details);
    free(r.data);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);

    /* The per-client cap counts per token: with 1 each, a second
     * connection of the trainer is refused, the reader's first is not. */
    s = local_server("tokcap", (ps_rpc_server_opts){.max_connections_per_client = 1}, &sec, path, sizeof path);
    if (!s) return;
    raw_conn a, b, x;
    ps_local_welcome w;
    CHECK(raw_open(path, 64 * KB, TOK_TRAINER, &a, NULL) == GRPC_STATUS_OK);
    int code = raw_open(path, 64 * KB, TOK_TRAINER, &x, &w);
    CHECK_MSG(code == GRPC_STATUS_RESOURCE_EXHAUSTED && strstr(w.details, "token:trainer"), "%d: %s", code,
              w.details);
    raw_close(&x);
    CHECK(raw_open(path, 64 * KB, TOK_READER, &b, NULL) == GRPC_STATUS_OK);
    /* and an unknown token is not a client with a share */
    code = raw_open(path, 64 * KB, "nobody-secret-0123456789abcdef", &x, &w);
    CHECK_MSG(code == GRPC_STATUS_UNAUTHENTICATED, "%d: %s", code, w.details);
    raw_close(&x);
    raw_close(&a);
    raw_close(&b);
    ps_rpc_server_free(s);
}

/* ---- 8. the socket file -------------------------------------------------------------- */

static void test_socket_file(void) {
    char path[128];
    struct stat st;
    ps_err err;
    mode_t um = umask(022);
    ps_rpc_server *s = local_server("file", (ps_rpc_server_opts){0}, NULL, path, sizeof path);
    if (!s) return;
    CHECK(umask(022) == 022);  /* the server put the process's umask back */
    CHECK(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
    CHECK_MSG((st.st_mode & 07777) == 0600, "mode %o", (unsigned)(st.st_mode & 07777));
    CHECK(st.st_uid == getuid());

    /* A second server on the path: refused, naming it; the first serves on. */
    ps_rpc_server_opts o = {.threads = 1, .max_message_bytes = MAX_MSG};
    snprintf(o.local_socket, sizeof o.local_socket, "%.107s", path);
    ps_rpc_server *s2 = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, NMETHODS, NULL, NULL, &err);
    CHECK(s2 == NULL);
    CHECK_MSG(s2 == NULL && strstr(err.msg, path), "%s", s2 ? "(created)" : err.msg);
    ps_rpc_server_free(s2);
    CHECK(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
    ps_rpc_client *c = local_client(path, 64 * KB, NULL);
    CHECK(echo_call(c, 10, 80, NULL));
    ps_rpc_client_free(c);
    /* Freed: the file is gone. */
    ps_rpc_server_free(s);
    CHECK(lstat(path, &st) != 0 && errno == ENOENT);

    /* A stale socket (its process died without unlinking it): replaced. */
    {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        snprintf(a.sun_path, sizeof a.sun_path, "%.107s", path);
        CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
        close(fd);
        CHECK(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
    }
    s = local_server("file", (ps_rpc_server_opts){0}, NULL, path, sizeof path);
    c = local_client(path, 64 * KB, NULL);
    CHECK(s && echo_call(c, 10, 81, NULL));
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
    CHECK(lstat(path, &st) != 0);

    /* A server created and freed without being started leaves nothing. */
    o.threads = 1;
    s = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, NMETHODS, NULL, NULL, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    CHECK(lstat(path, &st) == 0);
    ps_rpc_server_free(s);
    CHECK(lstat(path, &st) != 0);

    /* Something else on the path: refused, naming it, and left alone. */
    unlink(path);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs("keep me", f);
    fclose(f);
    s2 = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, NMETHODS, NULL, NULL, &err);
    CHECK_MSG(s2 == NULL && strstr(err.msg, path), "%s", s2 ? "(created)" : err.msg);
    ps_rpc_server_free(s2);
    char buf[16] = {0};
    f = fopen(path, "r");
    CHECK(f && fread(buf, 1, sizeof buf - 1, f) == 7 && strcmp(buf, "keep me") == 0);
    if (f) fclose(f);
    unlink(path);
    umask(um);
}

/* ---- clients that hold psd's shutdown, idle connections and the cap ---------------- */

static void test_shutdown_clients(void) {
    char path[128];
    /* A client that never sends its hello: the shutdown closes it (had it
     * waited for the hello's timeout, an hour here, it would not return
     * within the give-up). */
    ps_rpc_server *s = local_server("nohello", (ps_rpc_server_opts){.recv_timeout_s = 3600}, NULL, path, sizeof path);
    if (s) {
        int fd = raw_connect(path);
        CHECK(WAIT_UNTIL(local_conns(s) == 1, WAIT_MS));  /* accepted, its thread waits for the hello */
        shutdown_within(s, 100);
        ps_local_welcome w;
        CHECK_MSG(read_welcome(fd, &w) != GRPC_STATUS_DEADLINE_EXCEEDED, "shutdown waited for the hello's timeout");
        close(fd);
        ps_rpc_server_free(s);
    }
    /* A client that does not take its replies (its receive buffer made
     * small, requests sent without reading): psd's thread waits to send;
     * the shutdown closes it PS_RPC_SHUTDOWN_CLIENT_MS into the wait,
     * not after server.send_timeout_s (an hour here). */
    s = local_server("noread", (ps_rpc_server_opts){.send_timeout_s = 3600}, NULL, path, sizeof path);
    if (s) {
        raw_conn k;
        int small = 1024;
        CHECK(raw_open(path, 64 * KB, NULL, &k, NULL) == GRPC_STATUS_OK);
        setsockopt(k.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
        size_t n;
        ps_local_request q = request_msg(1, M_PING, 0, 0, &n);
        int sent = 0;
        for (int i = 0; i < 4000; i++) {  /* until psd stops taking them: its thread waits on us */
            struct pollfd p = {.fd = k.fd, .events = POLLOUT};
            if (poll(&p, 1, 200) <= 0) break;
            if (send(k.fd, &q, n, MSG_DONTWAIT | MSG_NOSIGNAL) != (ssize_t)n) break;
            sent++;
        }
        CHECK_MSG(sent > 10, "only %d requests sent", sent);
        shutdown_within(s, 100);
        raw_close(&k);
        ps_rpc_server_free(s);
    }
    /* An idle pooled connection keeps its share of
     * server.max_connections_per_client while its client lives: another
     * client's hello past the cap is refused with a retry hint, so that
     * it is not taken as final (docs/protocol.md). */
    s = local_server("idlecap", (ps_rpc_server_opts){.max_connections_per_client = 1}, NULL, path, sizeof path);
    if (s) {
        ps_rpc_client *c1 = local_client(path, 64 * KB, NULL), *c2 = local_client(path, 64 * KB, NULL);
        CHECK(echo_call(c1, 10, 90, NULL));  /* c1 now holds an idle connection */
        res r = call_bytes(c2, M_ECHO, "x", 1, 10000);
        CHECK_MSG(r.code == GRPC_STATUS_RESOURCE_EXHAUSTED && r.hint > 0,
                  "a call while another client's connection sits idle: %s (%s), retry hint %d",
                  ps_grpc_code_name(r.code), r.details, r.hint);
        free(r.data);
        ps_rpc_client_free(c1);
        ps_rpc_client_free(c2);
        ps_rpc_server_free(s);
    }
}

/* A server left at gRPC's default message size (max_message_bytes 0,
 * rpc_server.h: "gRPC's default is 4 MiB") and a client left at its
 * default (0: a 4 MiB region) talk. */
static void test_default_sizes(void) {
    char path[128];
    sock_path(path, sizeof path, "defaults");
    ps_rpc_server_opts o = {.threads = 1};
    snprintf(o.local_socket, sizeof o.local_socket, "%.107s", path);
    ps_err err;
    ps_rpc_server *s = ps_rpc_server_create_opts("127.0.0.1:0", &o, methods, NMETHODS, NULL, NULL, &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    if (!s) return;
    CHECK(ps_rpc_server_start(s, &err) == PS_OK);
    ps_rpc_client *c = local_client(path, 0, NULL);
    res r = call_bytes(c, M_PING, NULL, 0, 10000);
    CHECK_MSG(r.code == GRPC_STATUS_OK, "max_message_bytes 0 on both ends: %s (%s)", ps_grpc_code_name(r.code),
              r.details);
    free(r.data);
    ps_rpc_client_free(c);
    ps_rpc_server_free(s);
}

int main(void) {
    grpc_init();
    snprintf(g_dir, sizeof g_dir, "/tmp/test_rpc_local.XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[128];
    ps_rpc_server *s = local_server("main", (ps_rpc_server_opts){0}, NULL, path, sizeof path);
    if (s) {
        test_calls(s, path);
        test_region(s, path);
        test_threads(s, path);
        test_deferred(s, path);
        shutdown_within(s, 1000);
        ps_rpc_server_free(s);
    }
    test_transport_memory();
    test_shutdown_deferred();
    test_raw();
    test_caps();
    test_tokens();
    test_socket_file();
    test_shutdown_clients();
    test_default_sizes();
    rmdir(g_dir);
    grpc_shutdown();
    return check_summary("test_rpc_local");
}
