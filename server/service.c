/* service.c - the ParameterServer service object (service.h): its life
 * (create, drain, close, free), what it reports to psd and the metrics, the
 * method table it hands to the rpc server, and the helpers its handler
 * files share (service_impl.h). The handlers: svc_forward.c, svc_step.c,
 * svc_reads.c; the dispatch path that calls them: dispatch.c. */
#include "service_impl.h"
#include "trainers.h"

#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "clock.h"
#include "log.h"
#include "dims.h"
#include "report_limit.h"

static void grads_free_cb(void *g) { ps_grads_free(g); }

ps_service *ps_service_create(ps_model *model, const ps_service_opts *o, ps_err *err) {
    ps_service *s = calloc(1, sizeof *s);
    if (!s) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
    s->opts = *o;
    s->model = model;
    ps_ctx_table_opts to = {.ttl_s = o->context_ttl_s, .max_live = o->max_contexts ? o->max_contexts : 4096,
                            .settle_window_s = o->settle_window_s, .max_finished = o->max_finished,
                            .grads_free = grads_free_cb, .max_bytes = o->max_context_bytes};
    s->ctx = ps_ctx_table_create(&to);
    if (!s->ctx) { free(s); ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
    ps_cons_opts co = o->cons;
    co.active_s = o->context_ttl_s;
    if (!(s->cons = ps_cons_create(&co, svc_sync_apply, s, err))) {
        ps_ctx_table_free(s->ctx);
        free(s);
        return NULL;
    }
    ps_rmetrics_opts ro = o->round_metrics;
    if (!(ro.alpha > 0)) ro.alpha = 0.05;
    if (ro.round_steps < 1) ro.round_steps = 1;
    if (!(s->rm = ps_rmetrics_create(&ro, err))) {
        ps_cons_free(s->cons);
        ps_ctx_table_free(s->ctx);
        free(s);
        return NULL;
    }
    snprintf(s->stop_metric, sizeof s->stop_metric, "%s", ro.stop_metric);
    s->stop_threshold = ro.stop_threshold;
    pthread_mutex_init(&s->exec_mu, NULL);
    pthread_cond_init(&s->exec_cv, NULL);
    if (o->cons.mode == PS_CONS_SSP) {
        if (pthread_create(&s->exec, NULL, svc_exec_main, s)) {
            ps_rmetrics_free(s->rm);
            ps_cons_free(s->cons);
            ps_ctx_table_free(s->ctx);
            free(s);
            ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cannot start the ssp executor thread");
            return NULL;
        }
        s->exec_started = 1;
    }
    snprintf(s->optimizer, sizeof s->optimizer, "%s", o->optimizer ? o->optimizer : "sgd");
    s->cpu_isa = o->cpu_isa;
    s->max_tensor_bytes = o->max_message_bytes;
    s->start = ps_mono_s();
    ps_cons_describe(&o->cons, s->consistency, sizeof s->consistency);
    snprintf(s->cluster, sizeof s->cluster, "%.*s", (int)sizeof o->cluster, o->cluster);
    snprintf(s->server_name, sizeof s->server_name, "%.*s", (int)sizeof o->server_name, o->server_name);
    pthread_mutex_init(&s->ckpt_mu, NULL);
    /* a trainer reports a partial step once: 5 a second per client (20 at once) is plenty */
    if (!(s->reports = ps_report_limit_create(5, 20))) {
        ps_service_free(s);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    s->nonfinite_skip = o->nonfinite_policy == PS_NONFINITE_SKIP;
    s->max_context_bytes = o->max_context_bytes;
    s->saturated_limit_s = o->health_saturated_s;
    if (svc_batch_start(s, err)) {
        ps_service_free(s);
        return NULL;
    }
    return s;
}

void ps_service_close(ps_service *s) {
    ps_cons_close(s->cons);  /* answers waiting sync steps and held Forwards */
    if (s->exec_started) {
        pthread_mutex_lock(&s->exec_mu);
        s->exec_stop = 1;
        pthread_cond_signal(&s->exec_cv);
        pthread_mutex_unlock(&s->exec_mu);
        pthread_join(s->exec, NULL);   /* runs what was released before the close */
        s->exec_started = 0;
    }
}

void ps_service_free(ps_service *s) {
    if (!s) return;
    ps_service_close(s);
    svc_batch_stop(s);
    ps_cons_free(s->cons);
    ps_rmetrics_free(s->rm);
    pthread_mutex_destroy(&s->exec_mu);
    free(s->held);
    pthread_cond_destroy(&s->exec_cv);
    pthread_mutex_destroy(&s->ckpt_mu);
    ps_report_limit_free(s->reports);
    ps_ctx_table_free(s->ctx);
    free(s);
}

/* Expire ticks (one a second, psd's main loop) psd must be idle before it
 * hands pooled memory back (see ps_service_expire). */
#define PS_IDLE_TRIM_TICKS 5

size_t ps_service_expire(ps_service *s) {
    ps_cons_tick(s->cons);  /* sync round timeouts, ssp activity */
    size_t n = ps_ctx_table_expire(s->ctx);
#ifdef __GLIBC__
    /* Hand freed tapes' pages and the backends' pooled buffers back to the
     * OS: after contexts of vanished trainers expire, and once psd has been
     * idle (no live context, no new work) for PS_IDLE_TRIM_TICKS ticks
     * after work, so a burst of load does not stay in psd's RSS. Not at the
     * first idle tick: with a few trainers no context is live for a moment
     * between their batches, and emptying the pool there made the next
     * batches fault their working set in again (2 trainers: 8 -> 52 page
     * faults a batch); nor after one idle second, which trainers that
     * restart (a job's next epoch, a bench's next round: 16 processes
     * starting on 2 cores) also leave (16 trainers: 524 faults a batch). */
    ps_ctx_stats st;
    ps_ctx_table_stats(s->ctx, &st);
    uint64_t work = st.opened + __atomic_load_n(&s->samples, __ATOMIC_RELAXED);
    s->idle_ticks = st.live == 0 && work == s->seen_work ? s->idle_ticks + 1 : 0;
    s->seen_work = work;
    if (n || (s->idle_ticks >= PS_IDLE_TRIM_TICKS && work != s->trimmed_at)) {
        ps_backend_trim();
        malloc_trim(0);
        s->trimmed_at = work;
    }
#endif
    return n;
}

void ps_service_stats(ps_service *s, ps_ctx_stats *ctx, uint64_t *samples) {
    ps_ctx_table_stats(s->ctx, ctx);
    *samples = __atomic_load_n(&s->samples, __ATOMIC_RELAXED);
}

ps_ctx_table *ps_service_contexts(ps_service *s) { return s->ctx; }

void ps_service_set_draining(ps_service *s) { __atomic_store_n(&s->draining, 1, __ATOMIC_SEQ_CST); }
int ps_service_draining(ps_service *s) { return __atomic_load_n(&s->draining, __ATOMIC_SEQ_CST); }

void ps_service_set_admission(ps_service *s, ps_rpc_server *srv) { s->rpc = srv; }

int ps_service_admission(ps_service *s, ps_rpc_admission *a) {
    ps_rpc_server_admission(s->rpc, a);  /* zeros for NULL */
    return s->rpc != NULL;
}

int ps_service_phases(ps_service *s, int method_id, struct ps_prof_acc *out) {
    return ps_rpc_server_phases(s->rpc, method_id, out);
}

int ps_service_serving(ps_service *s, char *why, size_t n) {
    if (ps_service_draining(s)) {
        if (why) snprintf(why, n, "draining");
        return 0;
    }
    if (s->rpc && s->saturated_limit_s > 0) {
        ps_rpc_admission a;
        ps_rpc_server_admission(s->rpc, &a);
        if (a.saturated_s > s->saturated_limit_s) {
            if (why) snprintf(why, n, "saturated: every new call refused for %.0f s (server.max_calls)",
                              a.saturated_s);
            return 0;
        }
    }
    if (why) snprintf(why, n, "serving");
    return 1;
}
void ps_service_set_trainers(ps_service *s, ps_trainers *t) { s->trainers = t; }

void ps_service_set_samples(ps_service *s, uint64_t n) { __atomic_store_n(&s->samples, n, __ATOMIC_RELAXED); }
double ps_service_uptime(ps_service *s) { return ps_mono_s() - s->start; }

void ps_service_note_checkpoint(ps_service *s, const ps_ckpt_info *info) {
    pthread_mutex_lock(&s->ckpt_mu);
    s->ckpt = *info;
    s->has_ckpt = 1;
    pthread_mutex_unlock(&s->ckpt_mu);
}

int ps_service_checkpoint(ps_service *s, ps_ckpt_info *out) {
    pthread_mutex_lock(&s->ckpt_mu);
    int has = s->has_ckpt;
    if (has) *out = s->ckpt;
    pthread_mutex_unlock(&s->ckpt_mu);
    return has;
}

void ps_service_mode(ps_service *s, ps_service_mode_stats *out) {
    ps_cons_stats cs;
    ps_cons_stats_get(s->cons, &cs);
    int sync = ps_cons_mode_of(s->cons) == PS_CONS_SYNC;
    *out = (ps_service_mode_stats){sync ? cs.round : 0, sync ? cs.members : 0, cs.dropped, cs.timeouts,
                                   cs.ssp_deferred, cs.queued};
}

void ps_service_nonfinite_counts(ps_service *s, uint64_t *rejected, uint64_t *skipped) {
    *rejected = __atomic_load_n(&s->nonfinite_rejected, __ATOMIC_RELAXED);
    *skipped = __atomic_load_n(&s->nonfinite_skipped, __ATOMIC_RELAXED);
}

void ps_service_partial_counts(ps_service *s, uint64_t *applied, uint64_t *lost) {
    if (applied) *applied = __atomic_load_n(&s->partial_applied, __ATOMIC_RELAXED);
    if (lost) *lost = __atomic_load_n(&s->partial_lost, __ATOMIC_RELAXED);
}

void ps_service_hosted(ps_service *s, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < ps_model_num_stages(s->model) && o < n; i++) {
        const ps_stage_info *si = ps_model_stage(s->model, i);
        if (si->row_hi > si->row_lo)
            o += (size_t)snprintf(buf + o, n - o, "%s%s rows [%lld, %lld) on %s", i ? ", " : "", si->name,
                                  (long long)si->row_lo, (long long)si->row_hi, si->device);
        else
            o += (size_t)snprintf(buf + o, n - o, "%s%s on %s", i ? ", " : "", si->name, si->device);
    }
}

void ps_service_round_metrics(ps_service *s, struct ps_round_report *out, const char **stop_metric,
                              double *stop_threshold) {
    ps_rmetrics_latest(s->rm, out);
    if (stop_metric) *stop_metric = s->stop_metric;
    if (stop_threshold) *stop_threshold = s->stop_threshold;
}

/* ---- the method table ---------------------------------------------------- */

static ps_rpc_method methods[PS_M_COUNT];
static pthread_once_t methods_once = PTHREAD_ONCE_INIT;

static void methods_fill(void) {
    for (int i = 0; i < PS_M_COUNT; i++) {
        const ps_method_desc *m = ps_method((ps_method_id)i);
        methods[i] = (ps_rpc_method){m->path, ps_svc_dispatch, (m->flags & PS_MF_RESERVED) != 0, m->id};
    }
}

const ps_rpc_method *ps_service_methods(int *n) {
    pthread_once(&methods_once, methods_fill);
    *n = PS_M_COUNT;
    return methods;
}

/* ---- helpers of the handlers (service_impl.h) ------------------------------ */

size_t ps_service_max_tensor_bytes(ps_service *s) { return s->max_tensor_bytes; }

void svc_count(uint64_t *c) { __atomic_add_fetch(c, 1, __ATOMIC_RELAXED); }

/* 1 when one of the FINITE_BLOCK floats at x is NaN or infinite (every
 * exponent bit set): no branch per element, so the compiler vectorises it
 * (a fixed count, a multiple of any vector width); the element is looked
 * for only in a block that has one. Every Forward input, Backward gradient
 * and pushed gradient passes here - ~0.92 M floats a window of the LM. */
#define FINITE_BLOCK 256
static int block_nonfinite(const float *x) {
    uint32_t bad = 0;
    for (int i = 0; i < FINITE_BLOCK; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        bad |= (u & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}

ps_status svc_check_finite(const float *x, size_t n, const char *what, ps_err *err) {
    size_t i = 0;
    while (i + FINITE_BLOCK <= n && !block_nonfinite(x + i)) i += FINITE_BLOCK;
    for (; i < n; i++)
        if (!isfinite(x[i]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: element %zu is %s; inputs must be "
                              "finite", what, i, isnan(x[i]) ? "NaN" : "infinite");
    return PS_OK;
}

ps_status svc_nonfinite(ps_service *s, ps_ctx *c, ps_err *err) {
    if (c && s->nonfinite_skip) c->nonfinite = 1;
    if (s->nonfinite_skip) return PS_OK;
    svc_count(&s->nonfinite_rejected);
    return ps_err_prefix(err, "step rejected (server.nonfinite_policy: reject)");
}

void svc_stage_names(ps_service *s, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = '\0';
    for (int i = 0; i < ps_model_num_stages(s->model) && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", ps_model_stage(s->model, i)->name);
}

ps_status svc_split_batch(const ps_Tensor *t, const int64_t *per, int per_ndim, const char *what,
                          const char *whose, int64_t *n, int *nlead, ps_err *err) {
    int nd = (int)t->shape_count;
    int ok = nd >= per_ndim + 1;
    for (int i = 0; ok && i < per_ndim; i++) ok = t->shape[nd - per_ndim + i] == per[i];
    if (!ok) {
        char got[96], want[96];
        ps_dims_format(got, sizeof got, t->shape, nd);
        ps_dims_format_batch(want, sizeof want, per, per_ndim);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: shape %s does not match %s %s (N = any leading dims)",
                          what, got, whose, want);
    }
    *nlead = nd - per_ndim;
    int64_t p = 1;
    for (int i = 0; i < *nlead; i++) p *= t->shape[i];  /* wire-checked: no overflow */
    *n = p;
    return PS_OK;
}

ps_ctx *svc_acquire_own(ps_svc_call *c, uint64_t id, int *finished, uint64_t *version, ps_err *err) {
    return ps_ctx_table_acquire_as(c->svc->ctx, id, c->owner, finished, version, err);
}

ps_ctx *svc_open_or_known(ps_svc_call *c, uint64_t id, uint32_t rank, int known, const char *lost, int *created,
                          ps_err *err) {
    if (created) *created = 0;
    if (!known) return ps_ctx_table_open_as(c->svc->ctx, id, rank, c->owner, created, err);
    ps_ctx *x = svc_acquire_own(c, id, NULL, NULL, err);
    if (!x && err->code == PS_ERR_NOT_FOUND) ps_err_prefix(err, "%s", lost);
    return x;
}

void svc_account(ps_service *s, ps_ctx *c) {
    size_t tb = 0;
    for (size_t k = 0; k < c->nfwd; k++) tb += c->fwd[k].bytes;
    ps_ctx_table_account(s->ctx, c, (c->grads ? ps_grads_bytes(c->grads) : 0) + tb);
}

void svc_put_round_scalars(const ps_round_report *r, ps_RoundScalar *out, pb_size_t *count, pb_size_t cap) {
    *count = 0;
    for (int i = 0; i < r->n && *count < cap; i++) {
        ps_RoundScalar *o = &out[(*count)++];
        snprintf(o->name, sizeof o->name, "%s", r->s[i].name);
        o->count = r->s[i].count;
        o->min = r->s[i].min;
        o->mean = r->s[i].mean;
        o->max = r->s[i].max;
        o->ema = r->s[i].ema;
    }
}
