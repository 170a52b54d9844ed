/* metrics.h - psd's Prometheus metrics: RPC counters and latency
 * histograms (by wrapping the service's method table), plus gauges read from
 * the service and the model when scraped, served over HTTP by libmicrohttpd
 * at http://HOST:PORT/metrics (text exposition format 0.0.4).
 *
 * The same HTTP port serves psd's web dashboard (dashboard.h) at / once
 * one is attached, and /healthz. Plain HTTP, or HTTPS with the gRPC port's
 * certificate (server.metrics_tls); connections are capped in all and per
 * client address as the gRPC port caps calls (server.max_calls,
 * server.max_calls_per_client), and idle ones closed.
 *
 * Metric names (all prefixed psd_), see docs/operations.md, "Metrics":
 *   build_info{version,model} 1, uptime_seconds, serving (1, 0 draining),
 *   steps_total, model_version, samples_total,
 *   rpcs_total{method,code}, rpc_duration_seconds{method} (histogram of
 *   handler time), contexts_live, contexts_opened_total,
 *   contexts_expired_total, trainers_seen,
 *   checkpoint_last_step, checkpoint_age_seconds (only once a checkpoint
 *   exists), checkpoint_writes_total{result="ok"|"error"}.
 *
 * Thread-safety: the wrapped handlers run on gRPC workers and record with
 * atomics; the HTTP thread renders with the service's and model's own
 * locking. The user pointer of the wrapped table is the ps_metrics.
 */
#ifndef PS_METRICS_H
#define PS_METRICS_H

#include <stddef.h>

#include "model.h"
#include "rpc_server.h"
#include "service.h"
#include "status.h"

typedef struct ps_metrics ps_metrics;

/* Wraps methods (n entries, user data svc, as ps_service_methods gives
 * them). Uses svc and model (does not own them). */
ps_metrics *ps_metrics_create(ps_service *svc, ps_model *model, const ps_rpc_method *methods, int n,
                              ps_err *err);
/* Free (stops the HTTP endpoint first). NULL ok. */
void ps_metrics_free(ps_metrics *m);

/* The instrumented method table; pass it with m as the user data to
 * ps_rpc_server_create. Valid until ps_metrics_free. */
const ps_rpc_method *ps_metrics_methods(ps_metrics *m, int *n);

typedef struct ps_metrics_http_opts {
    const char *cert_file, *key_file;  /* PEM files: HTTPS; NULL = plain HTTP */
    unsigned max_connections;          /* 0: 256 */
    unsigned max_per_client;           /* connections from one address; 0: max_connections / 4 */
    unsigned idle_timeout_s;           /* 0: 10; also the bound on a request's headers: a
                                        * connection that has not sent a whole request this
                                        * long after it opened (or after its previous reply)
                                        * is closed, however slowly it trickles bytes */
    unsigned send_timeout_s;           /* a reply not taken this long after it was queued
                                        * closes its connection; 0: 10 */
} ps_metrics_http_opts;
/* Serve /metrics (and the dashboard) on hostport (as server.metrics_listen:
 * "IP:PORT", "[IPv6]:PORT", "localhost:PORT"), with TLS and limits o. A
 * port in use, a bad address, or a certificate that cannot be read or used
 * is an error naming it. Once. */
ps_status ps_metrics_listen_opts(ps_metrics *m, const char *hostport, const ps_metrics_http_opts *o, ps_err *err);

/* What ps_metrics_listen_opts would refuse in o's certificate and key (a
 * file missing, not PEM, or a key libmicrohttpd's TLS will not pair with
 * the certificate), without listening: for psd --check-config. PS_OK when
 * o has no certificate (plain HTTP). */
ps_status ps_metrics_check_tls(const ps_metrics_http_opts *o, ps_err *err);

/* Serve the dashboard at / (and its JSON and files) from now on; d
 * outlives m's HTTP endpoint. */
struct ps_dashboard;
void ps_metrics_set_dashboard(ps_metrics *m, struct ps_dashboard *d);

/* Calls running in a handler right now (for draining). */
int ps_metrics_in_flight(ps_metrics *m);

/* Count a checkpoint write (ok != 0) or failure. */
void ps_metrics_note_checkpoint(ps_metrics *m, int ok);

/* The exposition text as /metrics serves it, malloc'ed (caller frees);
 * NULL when out of memory. */
char *ps_metrics_render(ps_metrics *m, size_t *len);

#endif
