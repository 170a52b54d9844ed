/* dashboard.h - psd's web dashboard: what a person watching training
 * wants on one page, served read-only on the metrics HTTP port
 * (metrics.c) beside /metrics and /healthz.
 *
 *   /                    the page (web/index.html; its script and styles and
 *                        the chart library are compiled in: web_assets.h)
 *   /api/dashboard       everything the page shows, as JSON: psd and model
 *                        (version, weights, optimizer, consistency), the
 *                        cluster (servers, placement, what this psd hosts),
 *                        trainers (trainers.h), contexts and the memory
 *                        budget, checkpoints, CPU ISA and devices, round
 *                        metrics, admission counters, and the history
 *                        (history.h); ?since=GEN.NEXT sends only the points
 *                        the page lacks
 *
 * A sampler thread adds one history point per second: samples and steps
 * per second, the loss (psd's fused cross-entropy where it computes one,
 * and the `loss` scalar trainers send with Step), every scalar trainers
 * send, the round metrics' running averages, context memory. The history
 * is bounded (history.h: 1024 points, merged in pairs when full).
 */
#ifndef PS_DASHBOARD_H
#define PS_DASHBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "model.h"
#include "service.h"
#include "status.h"
#include "trainers.h"

typedef struct ps_dashboard ps_dashboard;

typedef struct ps_dashboard_opts {
    ps_service *svc;           /* used, not owned; outlive the dashboard */
    ps_model *model;
    ps_trainers *trainers;     /* may be NULL: no trainer table */
    const ps_config *cfg;      /* copied: the cluster, placement, checkpoint policy */
    double sample_s;           /* history interval (0: 1 s) */
} ps_dashboard_opts;

/* Starts the sampler. NULL with err set when out of memory. */
ps_dashboard *ps_dashboard_create(const ps_dashboard_opts *o, ps_err *err);
void ps_dashboard_free(ps_dashboard *d);   /* stops the sampler; NULL ok */

/* Take one history sample now (tests; the sampler does it every second). */
void ps_dashboard_sample(ps_dashboard *d);

/* The /api/dashboard JSON (caller frees), history from `since` ("" or
 * NULL: all; "GEN.NEXT" as the previous answer's history.gen and .next).
 * NULL when out of memory. */
char *ps_dashboard_json(ps_dashboard *d, const char *since, size_t *len);

/* An HTTP answer of the dashboard. */
typedef struct ps_dashboard_reply {
    unsigned status;           /* 200, 404 */
    const char *type;          /* Content-Type */
    const void *body;          /* static (asset) or malloc'ed (must_free) */
    size_t len;
    int must_free;
} ps_dashboard_reply;

/* Route a GET: 1 when url is the dashboard's (/, /api/dashboard, an asset),
 * with *r filled; 0 otherwise. query_since: the ?since= value or NULL. */
int ps_dashboard_route(ps_dashboard *d, const char *url, const char *query_since, ps_dashboard_reply *r);

#endif
