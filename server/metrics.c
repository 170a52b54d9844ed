/* metrics.c - psd's HTTP port: Prometheus /metrics (counters from the
 * instrumented method table, gauges read when scraped), /healthz, and the
 * dashboard's routes (dashboard.h); plain HTTP or HTTPS. */
#include "metrics.h"
#include "dashboard.h"
#include "round_metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "log.h"
#include "procstat.h"
#include "prof.h"

#define N_CODES 17 /* gRPC status codes 0..16 */
#define N_BUCKETS 14

/* Upper bounds of the latency buckets, seconds (+Inf is implicit). */
static const double g_bounds[N_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                           0.1,    0.25,  0.5,    1,     2.5,   5,     10};

/* One HTTP connection, for the request deadlines (libmicrohttpd's own
 * timeout is an idle one: a client that trickles a byte a second, or reads
 * its reply a byte a second, would hold its connection forever). */
typedef struct http_conn {
    int fd;                       /* -1: a free slot; -2: shut down, closing */
    int replying;                 /* 0: waiting for a request's headers; 1: its reply queued */
    double since;                 /* monotonic s: opened or last reply done / reply queued */
} http_conn;

typedef struct method_stats {
    const char *name;             /* "Forward" (points into path) */
    uint64_t calls[N_CODES];      /* __atomic */
    uint64_t bucket[N_BUCKETS + 1]; /* __atomic; not cumulative; last = above all bounds */
    uint64_t sum_ns;              /* __atomic */
} method_stats;

struct ps_metrics {
    ps_service *svc;
    ps_model *model;
    void *inner_user;
    int n;
    ps_rpc_method *inner;         /* copies of the service's entries */
    ps_rpc_method *outer;         /* same paths, instrumented handler */
    char **paths;
    method_stats *stats;
    uint64_t ckpt_ok, ckpt_err;   /* __atomic */
    int in_flight;                /* __atomic */
    struct MHD_Daemon *http;
    struct ps_dashboard *dash;    /* set before listening */
    char *tls_cert, *tls_key;     /* PEM text while HTTPS serves */
    /* request deadlines: the sweeper shuts down the socket of a connection
     * past its bound; libmicrohttpd then closes it as any broken one */
    pthread_mutex_t conn_mu;
    pthread_cond_t conn_cv;
    http_conn *conns;             /* ncap slots: at most max_connections are open */
    unsigned ncap;
    double recv_s, send_s;        /* the bounds */
    int sweeping, stop_sweep;     /* a sweeper thread runs; asked to stop */
    pthread_t sweeper;
    uint64_t http_expired;        /* __atomic: connections closed past a bound */
};

static void instrumented(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                         grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    ps_metrics *m = user;
    int i = 0;
    while (i < m->n && m->inner[i].id != info->method_id) i++;
    PS_ASSERT(i < m->n); /* the server only dispatches paths of the table */
    __atomic_add_fetch(&m->in_flight, 1, __ATOMIC_SEQ_CST);
    double t0 = ps_mono_s();
    m->inner[i].fn(m->inner_user, info, request, response, code, details, dlen);
    double dt = ps_mono_s() - t0;
    __atomic_sub_fetch(&m->in_flight, 1, __ATOMIC_SEQ_CST);
    method_stats *s = &m->stats[i];
    int c = (int)*code >= 0 && (int)*code < N_CODES ? (int)*code : GRPC_STATUS_UNKNOWN;
    __atomic_add_fetch(&s->calls[c], 1, __ATOMIC_RELAXED);
    int b = 0;
    while (b < N_BUCKETS && dt > g_bounds[b]) b++;
    __atomic_add_fetch(&s->bucket[b], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->sum_ns, (uint64_t)(dt * 1e9), __ATOMIC_RELAXED);
}

ps_metrics *ps_metrics_create(ps_service *svc, ps_model *model, const ps_rpc_method *methods, int n,
                              ps_err *err) {
    ps_metrics *m = calloc(1, sizeof *m);
    if (!m) goto oom;
    m->svc = svc;
    m->model = model;
    m->inner_user = svc;
    m->n = n;
    pthread_mutex_init(&m->conn_mu, NULL);
    pthread_cond_init(&m->conn_cv, NULL);
    m->inner = calloc((size_t)n, sizeof *m->inner);
    m->outer = calloc((size_t)n, sizeof *m->outer);
    m->paths = calloc((size_t)n, sizeof *m->paths);
    m->stats = calloc((size_t)n, sizeof *m->stats);
    if (!m->inner || !m->outer || !m->paths || !m->stats) goto oom;
    for (int i = 0; i < n; i++) {
        if (!(m->paths[i] = strdup(methods[i].path))) goto oom;
        m->inner[i] = methods[i];
        m->outer[i].path = m->paths[i];
        m->outer[i].fn = instrumented;
        m->outer[i].reserved = methods[i].reserved;
        m->outer[i].id = methods[i].id;
        const char *slash = strrchr(m->paths[i], '/');
        m->stats[i].name = slash ? slash + 1 : m->paths[i];
    }
    return m;
oom:
    ps_metrics_free(m);
    ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "metrics: out of memory");
    return NULL;
}

void ps_metrics_free(ps_metrics *m) {
    if (!m) return;
    if (m->sweeping) {
        pthread_mutex_lock(&m->conn_mu);
        m->stop_sweep = 1;
        pthread_cond_signal(&m->conn_cv);
        pthread_mutex_unlock(&m->conn_mu);
        pthread_join(m->sweeper, NULL);
    }
    if (m->http) MHD_stop_daemon(m->http);  /* notifies every connection closed */
    free(m->conns);
    pthread_mutex_destroy(&m->conn_mu);
    pthread_cond_destroy(&m->conn_cv);
    free(m->tls_cert);
    free(m->tls_key);
    for (int i = 0; m->paths && i < m->n; i++) free(m->paths[i]);
    free(m->paths);
    free(m->inner);
    free(m->outer);
    free(m->stats);
    free(m);
}

const ps_rpc_method *ps_metrics_methods(ps_metrics *m, int *n) {
    *n = m->n;
    return m->outer;
}

void ps_metrics_set_dashboard(ps_metrics *m, struct ps_dashboard *d) { m->dash = d; }

int ps_metrics_in_flight(ps_metrics *m) { return __atomic_load_n(&m->in_flight, __ATOMIC_SEQ_CST); }

void ps_metrics_note_checkpoint(ps_metrics *m, int ok) {
    __atomic_add_fetch(ok ? &m->ckpt_ok : &m->ckpt_err, 1, __ATOMIC_RELAXED);
}

/* ---- rendering ---------------------------------------------------------- */

typedef struct buf {
    char *p;
    size_t len, cap;
    int oom;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) { b->oom = 1; return; }
        if ((size_t)n < b->cap - b->len) { b->len += (size_t)n; return; }
        size_t cap = (b->cap + (size_t)n) * 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
}

static void family(buf *b, const char *name, const char *type, const char *help) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The Prometheus client libraries' standard process_* series (procstat.h):
 * what an operator alerts on (a daemon's memory growing, its descriptors
 * running out) without a node exporter. Each is left out when unknown. */
static void process_metrics(buf *b) {
    ps_proc_stats p;
    ps_proc_self(&p);
    static const struct { const char *name, *type, *help, *fmt; size_t off; } rows[] = {
        {"process_cpu_seconds_total", "counter", "User and system CPU time spent, seconds.", "%.2f",
         offsetof(ps_proc_stats, cpu_s)},
        {"process_resident_memory_bytes", "gauge", "Resident memory size, bytes.", "%.0f",
         offsetof(ps_proc_stats, rss_bytes)},
        {"process_virtual_memory_bytes", "gauge", "Virtual memory size, bytes.", "%.0f",
         offsetof(ps_proc_stats, vm_bytes)},
        {"process_start_time_seconds", "gauge", "Start time since the Unix epoch, seconds.", "%.2f",
         offsetof(ps_proc_stats, start_time_s)},
        {"process_open_fds", "gauge", "Open file descriptors.", "%.0f", offsetof(ps_proc_stats, open_fds)},
        {"process_max_fds", "gauge", "Maximum number of open file descriptors.", "%.0f",
         offsetof(ps_proc_stats, max_fds)},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const double v = *(const double *)((const char *)&p + rows[i].off);
        if (v < 0) continue;
        family(b, rows[i].name, rows[i].type, rows[i].help);
        char num[64];
        snprintf(num, sizeof num, rows[i].fmt, v);
        put(b, "%s %s\n", rows[i].name, num);
    }
}

/* A counter family with one label and two values of it:
 * name{label="v1"} n1 and name{label="v2"} n2. */
static void counter2(buf *b, const char *name, const char *help, const char *label, const char *v1, uint64_t n1,
                     const char *v2, uint64_t n2) {
    family(b, name, "counter", help);
    put(b, "%s{%s=\"%s\"} %llu\n", name, label, v1, (unsigned long long)n1);
    put(b, "%s{%s=\"%s\"} %llu\n", name, label, v2, (unsigned long long)n2);
}

char *ps_metrics_render(ps_metrics *m, size_t *len) {
    buf b = {malloc(8192), 0, 8192, 0};
    if (!b.p) return NULL;
    b.p[0] = '\0';
    ps_ctx_stats cs;
    uint64_t samples;
    ps_service_stats(m->svc, &cs, &samples);
    uint64_t version = ps_model_version(m->model);

    family(&b, "psd_build_info", "gauge", "psd version and model (value 1).");
    put(&b, "psd_build_info{version=\"%s\",model=\"%s\"} 1\n", PS_VERSION, ps_model_arch(m->model));
    family(&b, "psd_cpu_isa_info", "gauge",
           "Instruction set the CPU backend's kernels use (oneDNN's effective ISA; value 1).");
    put(&b, "psd_cpu_isa_info{isa=\"%s\"} 1\n", ps_backend_cpu_isa());
    family(&b, "psd_uptime_seconds", "gauge", "Seconds since psd started.");
    put(&b, "psd_uptime_seconds %.3f\n", ps_service_uptime(m->svc));
    process_metrics(&b);
    ps_device_memory dm[PS_MODEL_MAX_STAGES];
    int ndev = ps_model_device_memory(m->model, dm, PS_MODEL_MAX_STAGES);
    if (ndev > 0) {   /* GPU stages: what psd holds of each device's memory, and the device's own account */
        family(&b, "psd_device_memory_bytes", "gauge", "Device memory psd's GPU stages hold from the device's "
               "memory pool, by state: live (in use: weights, gradients, activations kept for backwards) or "
               "cached (freed, kept for the next request of its size; PS_CUDA_CACHE_MB). cuDNN's workspaces and "
               "the libraries' own handles are not included.");
        for (int i = 0; i < ndev; i++) {
            put(&b, "psd_device_memory_bytes{device=\"%s\",state=\"live\"} %llu\n", dm[i].device,
                (unsigned long long)dm[i].live);
            put(&b, "psd_device_memory_bytes{device=\"%s\",state=\"cached\"} %llu\n", dm[i].device,
                (unsigned long long)dm[i].cached);
        }
        family(&b, "psd_device_memory_free_bytes", "gauge", "Free memory of each device psd computes on, as its "
               "driver counts it (every process).");
        for (int i = 0; i < ndev; i++)
            put(&b, "psd_device_memory_free_bytes{device=\"%s\"} %llu\n", dm[i].device,
                (unsigned long long)dm[i].device_free);
        family(&b, "psd_device_memory_total_bytes", "gauge", "Total memory of each device psd computes on.");
        for (int i = 0; i < ndev; i++)
            put(&b, "psd_device_memory_total_bytes{device=\"%s\"} %llu\n", dm[i].device,
                (unsigned long long)dm[i].device_total);
    }
    family(&b, "psd_serving", "gauge", "1 while serving, 0 while draining for shutdown or saturated for "
           "longer than server.health_saturated_s.");
    put(&b, "psd_serving %d\n", ps_service_serving(m->svc, NULL, 0));
    ps_rpc_admission ad;
    ps_service_admission(m->svc, &ad);
    family(&b, "psd_calls_refused_total", "counter", "Calls refused before their message was read, by reason.");
    put(&b, "psd_calls_refused_total{reason=\"busy\"} %llu\n", ad.refused_busy);
    put(&b, "psd_calls_refused_total{reason=\"client_limit\"} %llu\n", ad.refused_client);
    put(&b, "psd_calls_refused_total{reason=\"auth\"} %llu\n", ad.refused_auth);
    counter2(&b, "psd_calls_stalled_total", "Calls cancelled because the client never sent its request (recv) or "
             "never took its reply (send).", "phase", "recv", ad.recv_timeouts, "send", ad.send_timeouts);
    counter2(&b, "psd_message_bytes_total", "Serialized request messages received and response messages sent "
             "(payloads, without HTTP/2 and TLS framing).", "dir", "received", ad.bytes_received, "sent", ad.bytes_sent);
    family(&b, "psd_connections_closed_total", "counter", "Connections closed for HTTP/2 rapid reset (the "
           "connection, or its whole host), for bytes without progress (a header block that never ends), or past "
           "server.max_connections_per_client.");
    put(&b, "psd_connections_closed_total %llu\n", ad.conns_cut);
    family(&b, "psd_http_connections_expired_total", "counter", "Connections to this HTTP port closed because "
           "a request's headers did not all arrive, or its reply was not taken, within its bound.");
    put(&b, "psd_http_connections_expired_total %llu\n",
        (unsigned long long)__atomic_load_n(&m->http_expired, __ATOMIC_RELAXED));
    counter2(&b, "psd_worker_polls_total", "Idle workers' polls for their next call (server.idle_poll_us), by how "
             "they ended: a call came, or the worker went to sleep.", "outcome", "call", ad.polls_hit, "slept",
             ad.polls_missed);
    family(&b, "psd_worker_poll_seconds_total", "counter", "Time idle workers spent polling (on a CPU, yielding "
           "it to anything runnable).");
    put(&b, "psd_worker_poll_seconds_total %.6f\n", ad.poll_s);
    family(&b, "psd_local_connections", "gauge", "Open connections of the local transport "
           "(server.local_socket): trainers on psd's host.");
    put(&b, "psd_local_connections %d\n", ad.local_connections);
    family(&b, "psd_local_calls_total", "counter", "Calls the local transport carried (they count in "
           "psd_rpcs_total too).");
    put(&b, "psd_local_calls_total %llu\n", ad.local_calls);
    family(&b, "psd_calls_in_progress", "gauge", "Accepted calls not finished, by class.");
    put(&b, "psd_calls_in_progress{class=\"ordinary\"} %d\n", ad.calls);
    put(&b, "psd_calls_in_progress{class=\"reserved\"} %d\n", ad.reserved_calls);
    put(&b, "psd_calls_in_progress{class=\"reader\"} %d\n", ad.reader_calls);
    family(&b, "psd_calls_waiting_for_request", "gauge", "Accepted ordinary and reader calls whose request "
           "message has not arrived (server.max_stalled_per_client).");
    put(&b, "psd_calls_waiting_for_request %d\n", ad.stalled_calls);
    family(&b, "psd_admission_saturated_seconds", "gauge", "How long every new ordinary call has been "
           "refused for the call cap (0: not saturated).");
    put(&b, "psd_admission_saturated_seconds %.3f\n", ad.saturated_s);
    family(&b, "psd_contexts_applied_total", "counter", "Contexts whose step reached the weights (each member "
           "of a sync round counts; restored with a checkpoint).");
    put(&b, "psd_contexts_applied_total %llu\n", (unsigned long long)cs.applied);
    family(&b, "psd_contexts_evicted_total", "counter", "Contexts freed to make room for a client within its "
           "fair share of server.max_context_bytes or of the context count.");
    put(&b, "psd_contexts_evicted_total %llu\n", (unsigned long long)cs.evicted);
    family(&b, "psd_contexts_refused_total", "counter", "Forwards/Backwards refused for the context memory "
           "budget or the context count.");
    put(&b, "psd_contexts_refused_total %llu\n", (unsigned long long)cs.refused);
    family(&b, "psd_contexts_released_total", "counter", "Contexts their trainer released unstepped "
           "(ReleaseContext: the unit runs again under a fresh id) before server.context_ttl_s.");
    put(&b, "psd_contexts_released_total %llu\n", (unsigned long long)cs.released);
    family(&b, "psd_steps_total", "counter",
           "Optimizer steps applied to the model, including those restored from a checkpoint.");
    put(&b, "psd_steps_total %llu\n", (unsigned long long)version);
    family(&b, "psd_model_version", "gauge", "Model version (= optimizer steps applied).");
    put(&b, "psd_model_version %llu\n", (unsigned long long)version);
    family(&b, "psd_samples_total", "counter", "Training samples received by Forward(train).");
    put(&b, "psd_samples_total %llu\n", (unsigned long long)samples);
    uint64_t held, combined;
    ps_service_batch_stats(m->svc, &held, &combined);
    counter2(&b, "psd_batched_forwards_total", "Training Forwards held for company (server.batch_wait_ms), and "
             "those of them computed combined with others.", "ran", "held", held, "combined", combined);
    ps_service_batch_bwd_stats(m->svc, &held, &combined);
    counter2(&b, "psd_batched_backwards_total", "Training Backwards (and the backward halves of fused Forwards) "
             "held for company (server.batch_wait_ms, server.batch_backward), and those of them computed combined "
             "with others.", "ran", "held", held, "combined", combined);

    family(&b, "psd_rpcs_total", "counter", "RPCs handled, by method and gRPC status code.");
    for (int i = 0; i < m->n; i++)
        for (int c = 0; c < N_CODES; c++) {
            uint64_t v = __atomic_load_n(&m->stats[i].calls[c], __ATOMIC_RELAXED);
            if (v || c == 0)
                put(&b, "psd_rpcs_total{method=\"%s\",code=\"%s\"} %llu\n", m->stats[i].name,
                    ps_grpc_code_name((grpc_status_code)c), (unsigned long long)v);
        }
    family(&b, "psd_rpc_duration_seconds", "histogram", "Time spent in each method's handler, seconds.");
    for (int i = 0; i < m->n; i++) {
        const method_stats *s = &m->stats[i];
        uint64_t cum = 0;
        for (int k = 0; k <= N_BUCKETS; k++) {
            cum += __atomic_load_n(&s->bucket[k], __ATOMIC_RELAXED);
            if (k < N_BUCKETS)
                put(&b, "psd_rpc_duration_seconds_bucket{method=\"%s\",le=\"%g\"} %llu\n", s->name, g_bounds[k],
                    (unsigned long long)cum);
            else
                put(&b, "psd_rpc_duration_seconds_bucket{method=\"%s\",le=\"+Inf\"} %llu\n", s->name,
                    (unsigned long long)cum);
        }
        put(&b, "psd_rpc_duration_seconds_sum{method=\"%s\"} %.9f\n", s->name,
            (double)__atomic_load_n(&s->sum_ns, __ATOMIC_RELAXED) * 1e-9);
        put(&b, "psd_rpc_duration_seconds_count{method=\"%s\"} %llu\n", s->name, (unsigned long long)cum);
    }

    family(&b, "psd_call_phase_seconds_total", "counter", "Where finished calls' time went in psd, by method and "
           "phase (server.profile; docs/performance.md): recv, queue, decode, ctx (context table lock wait), "
           "lock (weights lock wait), compute, handler, encode, send, held; span = accepted to reply written.");
    for (int i = 0; i < m->n; i++) {
        ps_prof_acc pa;
        if (!ps_service_phases(m->svc, m->inner[i].id, &pa) || !pa.calls) continue;
        for (int p = 0; p < PS_PHASE_COUNT; p++)
            put(&b, "psd_call_phase_seconds_total{method=\"%s\",phase=\"%s\"} %.9f\n", m->stats[i].name,
                ps_phase_name((ps_phase)p), (double)pa.ns[p] * 1e-9);
        put(&b, "psd_call_phase_seconds_total{method=\"%s\",phase=\"span\"} %.9f\n", m->stats[i].name,
            (double)pa.span_ns * 1e-9);
    }
    family(&b, "psd_call_phase_calls_total", "counter", "Finished calls counted in psd_call_phase_seconds_total.");
    for (int i = 0; i < m->n; i++) {
        ps_prof_acc pa;
        if (ps_service_phases(m->svc, m->inner[i].id, &pa) && pa.calls)
            put(&b, "psd_call_phase_calls_total{method=\"%s\"} %llu\n", m->stats[i].name,
                (unsigned long long)pa.calls);
    }

    family(&b, "psd_contexts_live", "gauge", "Training contexts held (forward done, step not yet).");
    put(&b, "psd_contexts_live %llu\n", (unsigned long long)cs.live);
    family(&b, "psd_contexts_opened_total", "counter", "Training contexts opened.");
    put(&b, "psd_contexts_opened_total %llu\n", (unsigned long long)cs.opened);
    family(&b, "psd_contexts_expired_total", "counter", "Contexts dropped after server.context_ttl_s idle.");
    put(&b, "psd_contexts_expired_total %llu\n", (unsigned long long)cs.expired);
    family(&b, "psd_trainers_seen", "gauge", "Distinct trainer ranks that have sent training work.");
    put(&b, "psd_trainers_seen %llu\n", (unsigned long long)cs.trainers_seen);
    family(&b, "psd_context_bytes", "gauge", "Bytes held by live contexts (recorded forwards' tapes and gradients).");
    put(&b, "psd_context_bytes %llu\n", (unsigned long long)cs.bytes);
    ps_service_mode_stats ms;
    ps_service_mode(m->svc, &ms);
    family(&b, "psd_sync_round", "gauge", "consistency sync: the round now open (0 in other modes).");
    put(&b, "psd_sync_round %llu\n", (unsigned long long)ms.sync_round);
    family(&b, "psd_sync_members", "gauge", "consistency sync: contexts the open round waits for.");
    put(&b, "psd_sync_members %u\n", ms.sync_members);
    family(&b, "psd_sync_dropped_total", "counter", "consistency sync: late Steps of closed rounds (stragglers).");
    put(&b, "psd_sync_dropped_total %llu\n", (unsigned long long)ms.sync_dropped);
    family(&b, "psd_sync_queued_total", "counter", "consistency sync: Steps of a round that filled up without "
           "them (more trainers than server.sync_workers), moved to the open round.");
    put(&b, "psd_sync_queued_total %llu\n", (unsigned long long)ms.sync_queued);
    family(&b, "psd_sync_timeouts_total", "counter", "consistency sync: rounds closed by server.sync_timeout_s.");
    put(&b, "psd_sync_timeouts_total %llu\n", (unsigned long long)ms.sync_timeouts);
    family(&b, "psd_ssp_deferred_total", "counter", "consistency ssp: training Forwards that waited for the slowest trainer.");
    put(&b, "psd_ssp_deferred_total %llu\n", (unsigned long long)ms.ssp_deferred);
    ps_round_report rr;
    const char *stop_metric;
    double stop_threshold;
    ps_service_round_metrics(m->svc, &rr, &stop_metric, &stop_threshold);
    family(&b, "psd_metrics_rounds_total", "counter", "Metrics rounds closed (sync rounds, or server.metrics_round_steps Steps).");
    put(&b, "psd_metrics_rounds_total %llu\n", (unsigned long long)rr.round);
    family(&b, "psd_round_scalar", "gauge",
           "The newest metrics round's scalars from the Steps: stat min, mean, max, count and ema (across rounds).");
    for (int i = 0; i < rr.n; i++) {
        const ps_round_stat *st = &rr.s[i];
        put(&b, "psd_round_scalar{name=\"%s\",stat=\"min\"} %.17g\n", st->name, st->min);
        put(&b, "psd_round_scalar{name=\"%s\",stat=\"mean\"} %.17g\n", st->name, st->mean);
        put(&b, "psd_round_scalar{name=\"%s\",stat=\"max\"} %.17g\n", st->name, st->max);
        put(&b, "psd_round_scalar{name=\"%s\",stat=\"count\"} %u\n", st->name, st->count);
        put(&b, "psd_round_scalar{name=\"%s\",stat=\"ema\"} %.17g\n", st->name, st->ema);
    }
    if (stop_metric && stop_metric[0]) {
        family(&b, "psd_solved", "gauge", "1 once the EMA of server.stop_metric exceeded server.stop_threshold.");
        put(&b, "psd_solved{metric=\"%s\"} %d\n", stop_metric, rr.solved);
    }

    uint64_t pa, pl;
    ps_service_partial_counts(m->svc, &pa, &pl);
    counter2(&b, "psd_partial_steps_total", "Batches a trainer reported as partial steps (ReportPartial): applied "
             "here but lost on another server, or lost here but applied on another.", "side", "applied", pa, "lost",
             pl);

    ps_ckpt_info ck;
    if (ps_service_checkpoint(m->svc, &ck)) {
        family(&b, "psd_checkpoint_last_step", "gauge", "Model version of the newest checkpoint.");
        put(&b, "psd_checkpoint_last_step %llu\n", (unsigned long long)ck.version);
        family(&b, "psd_checkpoint_age_seconds", "gauge", "Seconds since the newest checkpoint was written.");
        put(&b, "psd_checkpoint_age_seconds %.3f\n", ps_wall_s() - ck.time);
    }
    family(&b, "psd_checkpoint_writes_total", "counter", "Checkpoint writes, by result.");
    put(&b, "psd_checkpoint_writes_total{result=\"ok\"} %llu\n",
        (unsigned long long)__atomic_load_n(&m->ckpt_ok, __ATOMIC_RELAXED));
    put(&b, "psd_checkpoint_writes_total{result=\"error\"} %llu\n",
        (unsigned long long)__atomic_load_n(&m->ckpt_err, __ATOMIC_RELAXED));
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len) *len = b.len;
    return b.p;
}

/* ---- HTTP ---------------------------------------------------------------- */

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *type, char *body,
                              size_t len, enum MHD_ResponseMemoryMode mode) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (!strncmp(type, "text/html", 9)) {  /* the dashboard: its own files only, never framed */
        MHD_add_response_header(r, "Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'");
        MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    }
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    (void)upload_data;
    (void)con_cls;
    ps_metrics *m = cls;
    static const char text[] = "text/plain; charset=utf-8";
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    http_conn *hc = ci ? ci->socket_context : NULL;
    if (hc) {  /* its headers are in: from now on the reply's bound */
        pthread_mutex_lock(&m->conn_mu);
        if (!hc->replying) hc->replying = 1, hc->since = ps_mono_s();
        pthread_mutex_unlock(&m->conn_mu);
    }
    if (*upload_data_size) { *upload_data_size = 0; return MHD_YES; } /* ignore bodies */
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        static char msg[] = "only GET and HEAD\n";
        return answer(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, msg, sizeof msg - 1, MHD_RESPMEM_PERSISTENT);
    }
    if (!strcmp(url, "/metrics")) {
        size_t len = 0;
        char *body = ps_metrics_render(m, &len);
        if (!body) {
            static char msg[] = "out of memory\n";
            return answer(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text, msg, sizeof msg - 1, MHD_RESPMEM_PERSISTENT);
        }
        return answer(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len,
                      MHD_RESPMEM_MUST_FREE);
    }
    if (!strcmp(url, "/healthz")) {
        char why[160];
        int serving = ps_service_serving(m->svc, why, sizeof why - 1);
        strcat(why, "\n");
        return answer(c, serving ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, text, why, strlen(why),
                      MHD_RESPMEM_MUST_COPY);
    }
    ps_dashboard_reply dr;
    if (m->dash && ps_dashboard_route(m->dash, url, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since"),
                                      &dr))
        return answer(c, dr.status, dr.type, (char *)dr.body, dr.len,
                      dr.must_free ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!strcmp(url, "/")) {
        static char msg[] = "psd: metrics at /metrics (Prometheus text format), health at /healthz\n";
        return answer(c, MHD_HTTP_OK, text, msg, sizeof msg - 1, MHD_RESPMEM_PERSISTENT);
    }
    static char nf[] = "not found: try / (the dashboard), /metrics or /healthz\n";
    return answer(c, MHD_HTTP_NOT_FOUND, text, nf, sizeof nf - 1, MHD_RESPMEM_PERSISTENT);
}

/* A PEM file's text (caller frees); NULL with err naming it. */
static char *read_pem(const char *what, const char *path, ps_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "metrics: server.metrics_tls: %s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *p = malloc(cap);
    if (p) n = fread(p, 1, cap - 1, f);
    fclose(f);
    if (p) p[n] = '\0';
    if (!p || !strstr(p, "-----BEGIN ")) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "metrics: server.metrics_tls: %s %s: %s", what, path,
                   p ? "not a PEM file" : "out of memory");
        free(p);
        return NULL;
    }
    return p;
}

/* o's certificate and key, read (the caller frees both). */
static ps_status read_tls(const ps_metrics_http_opts *o, char **cert, char **key, ps_err *err) {
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
        return ps_err_set(err, PS_ERR_UNIMPLEMENTED, "metrics: server.metrics_tls: this libmicrohttpd was built "
                          "without TLS");
    if (!(*cert = read_pem("security.cert", o->cert_file, err)) ||
        !(*key = read_pem("security.key", o->key_file ? o->key_file : "", err)))
        return err ? err->code : PS_ERR_INVALID_ARGUMENT;
    return PS_OK;
}

#define TLS_REFUSED " with TLS (does security.key match security.cert?)"

ps_status ps_metrics_check_tls(const ps_metrics_http_opts *o, ps_err *err) {
    if (!o->cert_file || !o->cert_file[0]) return PS_OK;
    char *cert = NULL, *key = NULL;
    ps_status st = read_tls(o, &cert, &key, err);
    if (st == PS_OK) {
        /* a daemon without a listening socket sets up TLS as the real one
         * does, and binds nothing */
        struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_NO_LISTEN_SOCKET | MHD_USE_TLS, 0, NULL, NULL, on_request,
                                                NULL, MHD_OPTION_HTTPS_MEM_KEY, key, MHD_OPTION_HTTPS_MEM_CERT, cert,
                                                MHD_OPTION_END);
        if (d) MHD_stop_daemon(d);
        else st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "metrics: server.metrics_tls: libmicrohttpd could not "
                             "start" TLS_REFUSED);
    }
    free(cert);
    free(key);
    return st;
}

/* A connection opened (a slot, its clock started) or closed (its slot
 * freed: libmicrohttpd notifies before it closes the socket, so the sweeper
 * never shuts down a descriptor reused by another file). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    ps_metrics *m = cls;
    pthread_mutex_lock(&m->conn_mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = NULL;
        for (unsigned i = 0; ci && i < m->ncap; i++)
            if (m->conns[i].fd == -1) {
                m->conns[i] = (http_conn){ci->connect_fd, 0, ps_mono_s()};
                *socket_context = &m->conns[i];
                break;
            }
        if (!*socket_context && ci) shutdown(ci->connect_fd, SHUT_RDWR);  /* no slot: not kept unbounded */
    } else if (*socket_context) {
        ((http_conn *)*socket_context)->fd = -1;
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&m->conn_mu);
}

/* A request's reply was sent (or it ended otherwise): the connection waits
 * for its next request's headers, on a fresh clock. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)con_cls;
    (void)toe;
    ps_metrics *m = cls;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    http_conn *hc = ci ? ci->socket_context : NULL;
    if (!hc) return;
    pthread_mutex_lock(&m->conn_mu);
    hc->replying = 0;
    hc->since = ps_mono_s();
    pthread_mutex_unlock(&m->conn_mu);
}

/* Every quarter second: shut down the connections past their bound. */
static void *sweeper_main(void *p) {
    ps_metrics *m = p;
    pthread_mutex_lock(&m->conn_mu);
    while (!m->stop_sweep) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&m->conn_cv, &m->conn_mu, &ts);
        double now = ps_mono_s();
        unsigned closed = 0;
        for (unsigned i = 0; i < m->ncap && !m->stop_sweep; i++) {
            http_conn *hc = &m->conns[i];
            if (hc->fd < 0 || now - hc->since <= (hc->replying ? m->send_s : m->recv_s)) continue;
            shutdown(hc->fd, SHUT_RDWR);
            hc->fd = -2;
            closed++;
        }
        if (closed) __atomic_add_fetch(&m->http_expired, closed, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&m->conn_mu);
    return NULL;
}

ps_status ps_metrics_listen_opts(ps_metrics *m, const char *hostport, const ps_metrics_http_opts *o, ps_err *err) {
    PS_ASSERT(!m->http);
    unsigned maxc = o->max_connections ? o->max_connections : 256;
    unsigned per = o->max_per_client ? o->max_per_client : (maxc / 4 ? maxc / 4 : 1);
    unsigned idle = o->idle_timeout_s ? o->idle_timeout_s : 10;
    m->recv_s = idle;
    m->send_s = o->send_timeout_s ? o->send_timeout_s : 10;
    m->ncap = maxc + 16;  /* closed ones may linger a moment past the cap */
    if (!(m->conns = malloc(m->ncap * sizeof *m->conns)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "metrics: out of memory");
    for (unsigned i = 0; i < m->ncap; i++) m->conns[i].fd = -1;
    int tls = o->cert_file && o->cert_file[0];
    if (tls && read_tls(o, &m->tls_cert, &m->tls_key, err)) return err ? err->code : PS_ERR_INVALID_ARGUMENT;
    char host[64];
    int port;
    if (!ps_config_parse_hostport(hostport, host, sizeof host, &port))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "metrics: '%s' is not HOST:PORT", hostport);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t sl;
    int v6 = strchr(host, ':') != NULL;
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        inet_pton(AF_INET6, host, &a->sin6_addr);
        sl = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, host, &a->sin_addr);
        sl = sizeof *a;
    }
    /* Bind here rather than in libmicrohttpd, to report errno precisely. */
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ps_err_set(err, PS_ERR_INTERNAL, "metrics: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 64) != 0) {
        int e = errno;
        close(fd);
        return ps_err_set(err, PS_ERR_UNAVAILABLE, "metrics: cannot listen on %s (server.metrics_listen): %s%s",
                          hostport, strerror(e),
                          e == EADDRINUSE ? " - another process (another psd?) uses that port" : "");
    }
    unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | (v6 ? MHD_USE_IPv6 : 0);
    if (tls)
        m->http = MHD_start_daemon(flags | MHD_USE_TLS, 0, NULL, NULL, on_request, m, MHD_OPTION_LISTEN_SOCKET, fd,
                                   MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_CONNECTION_LIMIT, maxc,
                                   MHD_OPTION_PER_IP_CONNECTION_LIMIT, per, MHD_OPTION_NOTIFY_CONNECTION,
                                   on_connection, m, MHD_OPTION_NOTIFY_COMPLETED, on_completed, m,
                                   MHD_OPTION_HTTPS_MEM_KEY, m->tls_key,
                                   MHD_OPTION_HTTPS_MEM_CERT, m->tls_cert, MHD_OPTION_END);
    else
        m->http = MHD_start_daemon(flags, 0, NULL, NULL, on_request, m, MHD_OPTION_LISTEN_SOCKET, fd,
                                   MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_CONNECTION_LIMIT, maxc,
                                   MHD_OPTION_PER_IP_CONNECTION_LIMIT, per, MHD_OPTION_NOTIFY_CONNECTION,
                                   on_connection, m, MHD_OPTION_NOTIFY_COMPLETED, on_completed, m, MHD_OPTION_END);
    if (!m->http) {
        close(fd);
        return ps_err_set(err, PS_ERR_INTERNAL, "metrics: libmicrohttpd could not start on %s%s", hostport,
                          tls ? TLS_REFUSED : "");
    }
    if (pthread_create(&m->sweeper, NULL, sweeper_main, m) != 0) {
        MHD_stop_daemon(m->http);
        m->http = NULL;
        return ps_err_set(err, PS_ERR_INTERNAL, "metrics: cannot start a thread");
    }
    m->sweeping = 1;
    return PS_OK;
}
