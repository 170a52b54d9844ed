/* dashboard.c - psd's web dashboard (dashboard.h): the sampler that keeps
 * the history, the /api/dashboard JSON, and routing to the compiled-in
 * page. Reads the service and the model through their own locked
 * accessors; writes nothing but its history. */
#include "dashboard.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "clock.h"
#include "history.h"
#include "placement.h"
#include "procstat.h"
#include "round_metrics.h"
#include "textbuf.h"
#include "web_assets.h"

#define HISTORY_POINTS 1024
#define MAX_ROWS 256           /* trainer rows sent (the busiest psd has world_size - 1 of them) */

/* Series the sampler always feeds (names as the page reads them). */
enum { S_SAMPLES, S_STEPS, S_LOSS_FUSED, S_CTX_BYTES, S_CTX_LIVE, S_BYTES_IN, S_BYTES_OUT, S_FIXED };
static const struct { const char *name; ps_hist_kind kind; } g_fixed[S_FIXED] = {
    [S_SAMPLES] = {"samples", PS_HIST_RATE},         [S_STEPS] = {"steps", PS_HIST_RATE},
    [S_LOSS_FUSED] = {"loss.fused", PS_HIST_MEAN},   [S_CTX_BYTES] = {"contexts.bytes", PS_HIST_LAST},
    [S_CTX_LIVE] = {"contexts.live", PS_HIST_LAST},  [S_BYTES_IN] = {"bytes.received", PS_HIST_RATE},
    [S_BYTES_OUT] = {"bytes.sent", PS_HIST_RATE},
};

struct ps_dashboard {
    ps_service *svc;
    ps_model *model;
    ps_trainers *trainers;
    ps_config cfg;
    ps_placement place;
    int have_place;
    ps_history *hist;
    int series[S_FIXED];
    int fused_seen;            /* __atomic: psd computed a loss (the fused decoder, one call a batch) */
    int tokens_seen;           /* __atomic: ... over token sequences (the fused decoder) */
    /* sampler */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    double interval;
    uint64_t prev_samples, prev_version, prev_in, prev_out, prev_round;
    int primed;
};

/* ---- sampling ------------------------------------------------------------ */

void ps_dashboard_sample(ps_dashboard *d) {
    ps_ctx_stats cs;
    uint64_t samples;
    ps_service_stats(d->svc, &cs, &samples);
    uint64_t version = ps_model_version(d->model);
    ps_rpc_admission ad;
    ps_service_admission(d->svc, &ad);
    if (d->primed) {  /* restored samples and versions are not this run's throughput */
        ps_history_add(d->hist, d->series[S_SAMPLES], (double)(samples - d->prev_samples), 1);
        ps_history_add(d->hist, d->series[S_STEPS], (double)(version - d->prev_version), 1);
        ps_history_add(d->hist, d->series[S_BYTES_IN], (double)(ad.bytes_received - d->prev_in), 1);
        ps_history_add(d->hist, d->series[S_BYTES_OUT], (double)(ad.bytes_sent - d->prev_out), 1);
    }
    d->primed = 1;
    d->prev_samples = samples;
    d->prev_version = version;
    d->prev_in = ad.bytes_received;
    d->prev_out = ad.bytes_sent;
    ps_history_add(d->hist, d->series[S_CTX_BYTES], (double)cs.bytes, 1);
    ps_history_add(d->hist, d->series[S_CTX_LIVE], (double)cs.live, 1);
    if (d->trainers) {
        ps_trainers_delta td;
        ps_trainers_take(d->trainers, &td);
        if (td.fused_tokens_n) __atomic_store_n(&d->tokens_seen, 1, __ATOMIC_RELAXED);
        if (td.fused_loss_n) {
            __atomic_store_n(&d->fused_seen, 1, __ATOMIC_RELAXED);
            ps_history_add(d->hist, d->series[S_LOSS_FUSED], td.fused_loss_sum, (double)td.fused_loss_n);
        }
        for (int i = 0; i < td.n; i++) {
            char name[PS_HIST_NAME_MAX];
            snprintf(name, sizeof name, "scalar.%s", td.s[i].name);
            ps_history_add(d->hist, ps_history_series(d->hist, name, PS_HIST_MEAN), td.s[i].sum,
                           (double)td.s[i].count);
        }
    }
    ps_round_report rr;
    ps_service_round_metrics(d->svc, &rr, NULL, NULL);
    for (int i = 0; rr.round != d->prev_round && i < rr.n; i++) {   /* a running average moves when rounds close */
        char name[PS_HIST_NAME_MAX];
        snprintf(name, sizeof name, "ema.%s", rr.s[i].name);
        ps_history_add(d->hist, ps_history_series(d->hist, name, PS_HIST_LAST), rr.s[i].ema, 1);
    }
    d->prev_round = rr.round;
    ps_history_tick(d->hist, ps_mono_s(), ps_wall_s());
}

static void *sampler_main(void *p) {
    ps_dashboard *d = p;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        pthread_mutex_unlock(&d->mu);
        ps_dashboard_sample(d);
        pthread_mutex_lock(&d->mu);
        struct timespec until = ps_mono_deadline_ms((long long)(d->interval * 1e3));
        while (!d->stop && pthread_cond_timedwait(&d->cv, &d->mu, &until) == 0) {}
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

ps_dashboard *ps_dashboard_create(const ps_dashboard_opts *o, ps_err *err) {
    ps_dashboard *d = calloc(1, sizeof *d);
    if (!d) goto oom;
    d->svc = o->svc;
    d->model = o->model;
    d->trainers = o->trainers;
    d->cfg = *o->cfg;
    d->interval = o->sample_s > 0 ? o->sample_s : 1.0;
    ps_err perr = {0};
    d->have_place = ps_placement_resolve(&d->cfg, &d->place, &perr) == PS_OK;
    if (!(d->hist = ps_history_create(HISTORY_POINTS, d->interval))) goto oom;
    for (int i = 0; i < S_FIXED; i++) d->series[i] = ps_history_series(d->hist, g_fixed[i].name, g_fixed[i].kind);
    pthread_mutex_init(&d->mu, NULL);
    ps_cond_init_mono(&d->cv);
    if (pthread_create(&d->thread, NULL, sampler_main, d) != 0) {
        ps_dashboard_free(d);
        ps_err_set(err, PS_ERR_INTERNAL, "dashboard: cannot start its sampler thread");
        return NULL;
    }
    d->started = 1;
    return d;
oom:
    if (d) ps_history_free(d->hist);
    free(d);
    ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "dashboard: out of memory");
    return NULL;
}

void ps_dashboard_free(ps_dashboard *d) {
    if (!d) return;
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        d->stop = 1;
        pthread_cond_signal(&d->cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->thread, NULL);
    }
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    ps_history_free(d->hist);
    free(d);
}

/* ---- /api/dashboard ------------------------------------------------------ */

static void key(ps_textbuf *b, int *first, const char *k) {
    ps_textbuf_printf(b, "%s\"%s\":", *first ? "" : ",", k);
    *first = 0;
}
static void kstr(ps_textbuf *b, int *first, const char *k, const char *v) { key(b, first, k); ps_textbuf_json_str(b, v); }
static void knum(ps_textbuf *b, int *first, const char *k, double v) { key(b, first, k); ps_textbuf_json_num(b, v); }
static void kbool(ps_textbuf *b, int *first, const char *k, int v) {
    key(b, first, k);
    ps_textbuf_printf(b, "%s", v ? "true" : "false");
}

/* "http://HOST:PORT/" of server i's dashboard, from its address's host and
 * its metrics port; "" when it has none. */
static void server_dashboard_url(const ps_config *c, int i, char *out, size_t n) {
    out[0] = '\0';
    const char *ml = c->servers[i].metrics_listen[0] ? c->servers[i].metrics_listen : c->server.metrics_listen;
    char mhost[PS_CONFIG_ADDR_MAX], ahost[PS_CONFIG_ADDR_MAX];
    int mport, aport;
    if (!ml[0] || !ps_config_parse_hostport(ml, mhost, sizeof mhost, &mport)) return;
    const char *host = mhost;
    if ((!strcmp(mhost, "0.0.0.0") || !strcmp(mhost, "::")) &&
        ps_config_parse_hostport(c->servers[i].address, ahost, sizeof ahost, &aport))
        host = ahost;
    snprintf(out, n, "%s://%s%s%s:%d/", c->server.metrics_tls ? "https" : "http", strchr(host, ':') ? "[" : "",
             host, strchr(host, ':') ? "]" : "", mport);
}

static void render_cluster(ps_dashboard *d, ps_textbuf *b) {
    const ps_config *c = &d->cfg;
    int f = 1;
    ps_textbuf_printf(b, "{");
    kstr(b, &f, "name", c->cluster.name);
    kstr(b, &f, "self", c->self >= 0 ? c->servers[c->self].name : "");
    key(b, &f, "servers");
    ps_textbuf_printf(b, "[");
    for (int i = 0; i < c->n_servers; i++) {
        char url[PS_CONFIG_ADDR_MAX + 16];
        server_dashboard_url(c, i, url, sizeof url);
        int g = 1;
        ps_textbuf_printf(b, "%s{", i ? "," : "");
        kstr(b, &g, "name", c->servers[i].name);
        kstr(b, &g, "address", c->servers[i].address);
        kstr(b, &g, "dashboard", url);
        kbool(b, &g, "self", i == c->self);
        ps_textbuf_printf(b, "}");
    }
    ps_textbuf_printf(b, "]");
    key(b, &f, "placement");
    ps_textbuf_printf(b, "[");
    for (int s = 0; d->have_place && s < d->place.n_stages; s++) {
        const ps_place_stage *ps = &d->place.stages[s];
        int g = 1;
        ps_textbuf_printf(b, "%s{", s ? "," : "");
        kstr(b, &g, "stage", ps->name);
        if (!ps->n_shards) {
            kstr(b, &g, "server", d->place.server_name[ps->server]);
            kstr(b, &g, "device", ps->device);
        } else {
            kstr(b, &g, "table", ps->table);
            knum(b, &g, "rows", (double)ps->rows);
            key(b, &g, "shards");
            ps_textbuf_printf(b, "[");
            for (int k = 0; k < ps->n_shards; k++) {
                int h = 1;
                ps_textbuf_printf(b, "%s{", k ? "," : "");
                kstr(b, &h, "server", d->place.server_name[ps->shards[k].server]);
                kstr(b, &h, "device", ps->shards[k].device);
                knum(b, &h, "lo", (double)ps->shards[k].lo);
                knum(b, &h, "hi", (double)ps->shards[k].hi);
                ps_textbuf_printf(b, "}");
            }
            ps_textbuf_printf(b, "]");
        }
        ps_textbuf_printf(b, "}");
    }
    ps_textbuf_printf(b, "]}");
}

static void render_trainers(ps_dashboard *d, ps_textbuf *b, double now) {
    ps_textbuf_printf(b, "[");
    if (d->trainers) {
        ps_trainer_row *rows = malloc(sizeof *rows * MAX_ROWS);
        int n = rows ? ps_trainers_rows(d->trainers, rows, MAX_ROWS) : 0;
        if (n > MAX_ROWS) n = MAX_ROWS;
        for (int i = 0; i < n; i++) {
            const ps_trainer_row *r = &rows[i];
            int f = 1;
            ps_textbuf_printf(b, "%s{", i ? "," : "");
            knum(b, &f, "rank", r->rank);
            knum(b, &f, "first_seen_s", now - r->first_seen);
            knum(b, &f, "last_seen_s", now - r->last_seen);
            knum(b, &f, "samples", (double)r->samples);
            knum(b, &f, "forwards", (double)r->forwards);
            knum(b, &f, "replayed_forwards", (double)r->replayed);
            knum(b, &f, "steps", (double)r->steps);
            knum(b, &f, "repeated_steps", (double)r->repeated_steps);
            knum(b, &f, "partial_applied", (double)r->partial_applied);
            knum(b, &f, "partial_lost", (double)r->partial_lost);
            knum(b, &f, "loss", r->loss);
            ps_textbuf_printf(b, "}");
        }
        free(rows);
    }
    ps_textbuf_printf(b, "]");
}

char *ps_dashboard_json(ps_dashboard *d, const char *since, size_t *len) {
    ps_textbuf tb = {0}, *b = &tb;
    const ps_config *c = &d->cfg;
    double now = ps_wall_s();
    ps_ctx_stats cs;
    uint64_t samples;
    ps_service_stats(d->svc, &cs, &samples);
    char why[160] = "";
    int serving = ps_service_serving(d->svc, why, sizeof why);
    int f = 1, g;
    ps_textbuf_printf(b, "{");
    key(b, &f, "psd");
    g = 1;
    ps_textbuf_printf(b, "{");
    kstr(b, &g, "version", PS_VERSION);
    knum(b, &g, "time", now);
    knum(b, &g, "uptime_s", ps_service_uptime(d->svc));
    ps_proc_stats ps;
    ps_proc_self(&ps);
    if (ps.rss_bytes >= 0) knum(b, &g, "rss_bytes", ps.rss_bytes);   /* absent when /proc cannot say */
    if (ps.cpu_s >= 0) knum(b, &g, "cpu_s", ps.cpu_s);
    kbool(b, &g, "serving", serving);
    kstr(b, &g, "state", why);
    kbool(b, &g, "draining", ps_service_draining(d->svc));
    kstr(b, &g, "listen", c->server.listen);
    kbool(b, &g, "tls", c->security.tls);
    ps_textbuf_printf(b, "}");

    /* the model: a token model (first stage takes ids, or psd computes a
     * cross-entropy over token sequences) reports tokens and perplexity */
    const ps_stage_info *s0 = ps_model_stage(d->model, 0);
    int fused = __atomic_load_n(&d->fused_seen, __ATOMIC_RELAXED);
    int tokens = (s0 && s0->in_dtype == PS_DTYPE_I64) || __atomic_load_n(&d->tokens_seen, __ATOMIC_RELAXED);
    key(b, &f, "model");
    g = 1;
    ps_textbuf_printf(b, "{");
    kstr(b, &g, "name", ps_model_arch(d->model));
    knum(b, &g, "version", (double)ps_model_version(d->model));
    knum(b, &g, "weights", (double)ps_model_num_weights(d->model));
    knum(b, &g, "samples", (double)samples);
    kstr(b, &g, "unit", tokens ? "tokens" : "samples");
    kbool(b, &g, "perplexity", tokens);
    kstr(b, &g, "loss_source", fused ? "psd's fused cross-entropy" : "the trainers' Step scalar 'loss'");
    kstr(b, &g, "optimizer", ps_config_enum_name("optimizer.type", (int)c->optimizer.kind));
    knum(b, &g, "lr", c->optimizer.lr);
    kstr(b, &g, "consistency", ps_config_enum_name("server.consistency", (int)c->server.service.cons.mode));
    kstr(b, &g, "nonfinite_policy", ps_config_enum_name("server.nonfinite_policy", (int)c->server.service.nonfinite_policy));
    uint64_t rej, skip;
    ps_service_nonfinite_counts(d->svc, &rej, &skip);
    knum(b, &g, "nonfinite_rejected", (double)rej);
    knum(b, &g, "nonfinite_skipped", (double)skip);
    char hosted[512];
    ps_service_hosted(d->svc, hosted, sizeof hosted);
    kstr(b, &g, "hosted", hosted);
    key(b, &g, "stages");
    ps_textbuf_printf(b, "[");
    for (int i = 0; i < ps_model_num_stages(d->model); i++) {
        const ps_stage_info *si = ps_model_stage(d->model, i);
        int64_t weights = 0;
        for (int p = 0; p < ps_model_num_params(d->model); p++)
            if (ps_model_param(d->model, p)->stage_index == i) weights += ps_model_param(d->model, p)->numel;
        int h = 1;
        ps_textbuf_printf(b, "%s{", i ? "," : "");
        kstr(b, &h, "name", si->name);
        kstr(b, &h, "device", si->device);
        knum(b, &h, "params", si->params);
        knum(b, &h, "weights", (double)weights);
        kbool(b, &h, "params_only", si->params_only);
        if (si->row_hi > si->row_lo) {
            knum(b, &h, "row_lo", (double)si->row_lo);
            knum(b, &h, "row_hi", (double)si->row_hi);
        }
        ps_textbuf_printf(b, "}");
    }
    ps_textbuf_printf(b, "]}");

    key(b, &f, "cluster");
    render_cluster(d, b);

    key(b, &f, "devices");
    g = 1;
    ps_textbuf_printf(b, "{");
    kstr(b, &g, "cpu_isa", ps_backend_cpu_isa());
    char build[192];
    ps_backend_build_info(build, sizeof build);
    kstr(b, &g, "build", build);
    kstr(b, &g, "cpu_backend", ps_config_enum_name("model.backend", (int)c->model.backend));
    knum(b, &g, "compute_threads",
         c->server.compute_threads > 0 ? c->server.compute_threads : (double)sysconf(_SC_NPROCESSORS_ONLN));
    /* each GPU psd computes on: what its stages hold (as /metrics'
     * psd_device_memory_bytes) and the device's own free and total; [] on CPU */
    ps_device_memory dm[PS_MODEL_MAX_STAGES];
    int ndev = ps_model_device_memory(d->model, dm, PS_MODEL_MAX_STAGES);
    key(b, &g, "memory");
    ps_textbuf_printf(b, "[");
    for (int i = 0; i < ndev; i++) {
        int h = 1;
        ps_textbuf_printf(b, "%s{", i ? "," : "");
        kstr(b, &h, "device", dm[i].device);
        knum(b, &h, "live", (double)dm[i].live);
        knum(b, &h, "cached", (double)dm[i].cached);
        knum(b, &h, "free", (double)dm[i].device_free);
        knum(b, &h, "total", (double)dm[i].device_total);
        ps_textbuf_printf(b, "}");
    }
    ps_textbuf_printf(b, "]}");

    key(b, &f, "contexts");
    g = 1;
    ps_textbuf_printf(b, "{");
    knum(b, &g, "live", (double)cs.live);
    knum(b, &g, "opened", (double)cs.opened);
    knum(b, &g, "expired", (double)cs.expired);
    knum(b, &g, "bytes", (double)cs.bytes);
    knum(b, &g, "budget", (double)c->server.service.max_context_bytes);
    knum(b, &g, "evicted", (double)cs.evicted);
    knum(b, &g, "refused", (double)cs.refused);
    knum(b, &g, "clients", (double)cs.owners);
    knum(b, &g, "trainers_seen", (double)cs.trainers_seen);
    knum(b, &g, "ttl_s", c->server.service.context_ttl_s);
    ps_textbuf_printf(b, "}");

    key(b, &f, "checkpoint");
    g = 1;
    ps_textbuf_printf(b, "{");
    kstr(b, &g, "dir", c->server.checkpoint.dir);
    knum(b, &g, "every_steps", c->server.checkpoint.every_steps);
    knum(b, &g, "every_s", c->server.checkpoint.every_s);
    knum(b, &g, "keep", c->server.checkpoint.keep);
    ps_ckpt_info ck;
    if (ps_service_checkpoint(d->svc, &ck)) {
        knum(b, &g, "last_step", (double)ck.version);
        knum(b, &g, "age_s", now - ck.time);
        kstr(b, &g, "path", ck.path);
    }
    ps_textbuf_printf(b, "}");

    key(b, &f, "trainers");
    render_trainers(d, b, now);
    uint64_t pa, pl;
    ps_service_partial_counts(d->svc, &pa, &pl);
    key(b, &f, "partial_steps");
    ps_textbuf_printf(b, "{\"applied\":%llu,\"lost\":%llu}", (unsigned long long)pa, (unsigned long long)pl);

    ps_round_report rr;
    const char *stop_metric = NULL;
    double threshold = 0;
    ps_service_round_metrics(d->svc, &rr, &stop_metric, &threshold);
    key(b, &f, "rounds");
    g = 1;
    ps_textbuf_printf(b, "{");
    knum(b, &g, "round", (double)rr.round);
    kbool(b, &g, "solved", rr.solved);
    kstr(b, &g, "stop_metric", stop_metric ? stop_metric : "");
    knum(b, &g, "stop_threshold", threshold);
    key(b, &g, "scalars");
    ps_textbuf_printf(b, "[");
    for (int i = 0; i < rr.n; i++) {
        int h = 1;
        ps_textbuf_printf(b, "%s{", i ? "," : "");
        kstr(b, &h, "name", rr.s[i].name);
        knum(b, &h, "count", rr.s[i].count);
        knum(b, &h, "min", rr.s[i].min);
        knum(b, &h, "mean", rr.s[i].mean);
        knum(b, &h, "max", rr.s[i].max);
        knum(b, &h, "ema", rr.s[i].ema);
        ps_textbuf_printf(b, "}");
    }
    ps_textbuf_printf(b, "]}");

    ps_rpc_admission ad;
    ps_service_admission(d->svc, &ad);
    key(b, &f, "admission");
    g = 1;
    ps_textbuf_printf(b, "{");
    knum(b, &g, "calls", ad.calls);
    knum(b, &g, "max_calls", c->server.rpc.max_calls);
    knum(b, &g, "refused", (double)(ad.refused_busy + ad.refused_client + ad.refused_auth));
    knum(b, &g, "stalled", (double)(ad.recv_timeouts + ad.send_timeouts));
    knum(b, &g, "connections_closed", (double)ad.conns_cut);
    knum(b, &g, "bytes_received", (double)ad.bytes_received);
    knum(b, &g, "bytes_sent", (double)ad.bytes_sent);
    knum(b, &g, "saturated_s", ad.saturated_s);
    ps_textbuf_printf(b, "}");

    unsigned long long gen = ~0ULL, next = 0;
    if (since && since[0]) {
        char *end;
        gen = strtoull(since, &end, 10);
        if (*end == '.') next = strtoull(end + 1, &end, 10);
        if (*end) gen = ~0ULL;  /* malformed: everything */
    }
    key(b, &f, "history");
    ps_history_json(d->hist, b, gen, next);
    ps_textbuf_printf(b, "}\n");
    return ps_textbuf_take(b, len);
}

/* ---- routing --------------------------------------------------------------- */

int ps_dashboard_route(ps_dashboard *d, const char *url, const char *query_since, ps_dashboard_reply *r) {
    if (!strcmp(url, "/api/dashboard")) {
        size_t len = 0;
        char *body = ps_dashboard_json(d, query_since, &len);
        if (!body) {
            static const char oom[] = "{\"error\":\"out of memory\"}\n";
            *r = (ps_dashboard_reply){500, "application/json", oom, sizeof oom - 1, 0};
            return 1;
        }
        *r = (ps_dashboard_reply){200, "application/json", body, len, 1};
        return 1;
    }
    const ps_web_asset *a = ps_web_asset_find(url);
    if (!a) return 0;
    *r = (ps_dashboard_reply){200, a->type, a->data, a->len, 0};
    return 1;
}
