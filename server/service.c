#include "service.h"

#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "consistency.h"
#include "round_metrics.h"
#include "trainers.h"
#include "health.pb.h"
#include "log.h"
#include "loss.h"
#include "methods.h"
#include "wire.h"

typedef struct fwd_node fwd_node;

struct ps_service {
    ps_model *model;
    ps_ctx_table *ctx;
    ps_cons *cons;               /* server.consistency */
    ps_rmetrics *rm;             /* round metrics of the Steps' scalars */
    char stop_metric[PS_RM_NAME_MAX];
    double stop_threshold;
    /* ssp: Forwards released from their wait run here, not on the
     * releasing thread (a Step's reply must not wait for them) */
    pthread_t exec;
    int exec_started;
    pthread_mutex_t exec_mu;
    pthread_cond_t exec_cv;
    fwd_node *exec_head, *exec_tail;
    int exec_stop;
    char optimizer[16];
    const char *(*cpu_isa)(void);
    size_t max_tensor_bytes;
    double start;
    uint64_t samples;            /* __atomic */
    uint64_t nonfinite_rejected; /* __atomic */
    uint64_t nonfinite_skipped;  /* __atomic */
    int nonfinite_skip;
    uint64_t trimmed_at;         /* work counter at the last malloc_trim (expire's caller only) */
    char consistency[256];
    int draining;                /* __atomic */
    ps_rpc_server *rpc;          /* admission counters (set before start) */
    size_t max_context_bytes;
    double saturated_limit_s;
    char cluster[32];            /* cluster.name */
    char server_name[32];        /* servers.<name>; "" = single-server form */
    uint64_t partial_applied;    /* __atomic: ReportPartial, applied here */
    uint64_t partial_lost;       /* __atomic: ReportPartial, lost here */
    pthread_mutex_t ckpt_mu;     /* guards ckpt, has_ckpt */
    int has_ckpt;
    ps_ckpt_info ckpt;
    ps_trainers *trainers;       /* the dashboard's view of each trainer; NULL = none */
};

static void grads_free_cb(void *g) { ps_grads_free(g); }
static ps_status sync_apply(void *user, void *const *grads, void *const *args, int n, int average, uint64_t *version,
                            ps_err *err);
static void *exec_main(void *p);

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

ps_service *ps_service_create(ps_model *model, const ps_service_opts *o, ps_err *err) {
    ps_service *s = calloc(1, sizeof *s);
    if (!s) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
    s->model = model;
    ps_ctx_table_opts to = {.ttl_s = o->context_ttl_s, .max_live = o->max_contexts,
                            .settle_window_s = o->settle_window_s, .max_finished = o->max_finished,
                            .grads_free = grads_free_cb, .max_bytes = o->max_context_bytes};
    s->ctx = ps_ctx_table_create(&to);
    if (!s->ctx) { free(s); ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
    ps_cons_opts co = {.mode = o->mode, .sync_workers = o->sync_workers, .sync_timeout_s = o->sync_timeout_s,
                       .sync_average = o->sync_average, .max_staleness = o->max_staleness,
                       .active_s = o->context_ttl_s};
    if (!(s->cons = ps_cons_create(&co, sync_apply, s, err))) {
        ps_ctx_table_free(s->ctx);
        free(s);
        return NULL;
    }
    ps_rmetrics_opts ro = {.alpha = o->metrics_ema_alpha > 0 ? o->metrics_ema_alpha : 0.05,
                           .ema_of = (ps_rm_ema_of)o->metrics_ema_of,
                           .round_steps = o->metrics_round_steps > 0 ? o->metrics_round_steps : 1,
                           .stop_metric = o->stop_metric, .stop_threshold = o->stop_threshold};
    if (!(s->rm = ps_rmetrics_create(&ro, err))) {
        ps_cons_free(s->cons);
        ps_ctx_table_free(s->ctx);
        free(s);
        return NULL;
    }
    snprintf(s->stop_metric, sizeof s->stop_metric, "%s", o->stop_metric ? o->stop_metric : "");
    s->stop_threshold = o->stop_threshold;
    pthread_mutex_init(&s->exec_mu, NULL);
    pthread_cond_init(&s->exec_cv, NULL);
    if (o->mode == PS_CONS_SSP) {
        if (pthread_create(&s->exec, NULL, exec_main, s)) {
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
    s->start = mono_now();
    snprintf(s->consistency, sizeof s->consistency, "%s", o->consistency ? o->consistency : "");
    snprintf(s->cluster, sizeof s->cluster, "%s", o->cluster ? o->cluster : "");
    snprintf(s->server_name, sizeof s->server_name, "%s", o->server_name ? o->server_name : "");
    pthread_mutex_init(&s->ckpt_mu, NULL);
    s->nonfinite_skip = o->nonfinite_skip;
    s->max_context_bytes = o->max_context_bytes;
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
    ps_cons_free(s->cons);
    ps_rmetrics_free(s->rm);
    pthread_mutex_destroy(&s->exec_mu);
    pthread_cond_destroy(&s->exec_cv);
    pthread_mutex_destroy(&s->ckpt_mu);
    ps_ctx_table_free(s->ctx);
    free(s);
}

size_t ps_service_expire(ps_service *s) {
    ps_cons_tick(s->cons);  /* sync round timeouts, ssp activity */
    size_t n = ps_ctx_table_expire(s->ctx);
#ifdef __GLIBC__
    /* Hand freed tapes' pages back to the OS: after contexts of vanished
     * trainers expire, and once whenever psd goes idle (no live context)
     * after work, so a burst of load does not stay in psd's RSS. */
    ps_ctx_stats st;
    ps_ctx_table_stats(s->ctx, &st);
    uint64_t work = st.opened + __atomic_load_n(&s->samples, __ATOMIC_RELAXED);
    if (n || (st.live == 0 && work != s->trimmed_at)) {
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

void ps_service_set_draining(ps_service *s) { __atomic_store_n(&s->draining, 1, __ATOMIC_SEQ_CST); }
int ps_service_draining(ps_service *s) { return __atomic_load_n(&s->draining, __ATOMIC_SEQ_CST); }

void ps_service_set_admission(ps_service *s, ps_rpc_server *srv, double saturated_limit_s) {
    s->rpc = srv;
    s->saturated_limit_s = saturated_limit_s;
}

int ps_service_admission(ps_service *s, ps_rpc_admission *a) {
    ps_rpc_server_admission(s->rpc, a);  /* zeros for NULL */
    return s->rpc != NULL;
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
void ps_service_set_samples(ps_service *s, uint64_t n) { __atomic_store_n(&s->samples, n, __ATOMIC_RELAXED); }
double ps_service_uptime(ps_service *s) { return mono_now() - s->start; }

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

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
void ps_service_mode(ps_service *s, ps_service_mode_stats *out) {
    ps_cons_stats cs;
    ps_cons_stats_get(s->cons, &cs);
    int sync = ps_cons_mode_of(s->cons) == PS_CONS_SYNC;
    *out = (ps_service_mode_stats){sync ? cs.round : 0, sync ? cs.members : 0, cs.dropped, cs.timeouts,
                                   cs.ssp_deferred};
}

void ps_service_nonfinite_counts(ps_service *s, uint64_t *rejected, uint64_t *skipped) {
    *rejected = __atomic_load_n(&s->nonfinite_rejected, __ATOMIC_RELAXED);
    *skipped = __atomic_load_n(&s->nonfinite_skipped, __ATOMIC_RELAXED);
}

static void count(uint64_t *c) { __atomic_add_fetch(c, 1, __ATOMIC_RELAXED); }

/* Reply with an error from err. */
static void fail(grpc_status_code *code, char *details, size_t dlen, const ps_err *err) {
    *code = ps_grpc_from_status(err->code);
    snprintf(details, dlen, "%s", err->msg);
}

static void reply(const pb_msgdesc_t *fields, const void *msg, grpc_byte_buffer **response,
                  grpc_status_code *code, char *details, size_t dlen) {
    ps_err err = {0};
    if (ps_wire_encode(fields, msg, response, &err) != PS_OK) fail(code, details, dlen, &err);
}

static ps_status check_finite(const float *x, size_t n, const char *what, ps_err *err) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: element %zu is %s; inputs must be "
                              "finite", what, i, isnan(x[i]) ? "NaN" : "infinite");
    return PS_OK;
}

/* A non-finite value reached context c (err says where). Policy reject:
 * refuse (nothing non-finite is ever added to a context, so it stays
 * usable). Policy skip: mark the context, whose step will then not be
 * applied, and go on. Returns what the handler should fail with, or PS_OK
 * to continue. */
static ps_status nonfinite(ps_service *s, ps_ctx *c, ps_err *err) {
    if (c && s->nonfinite_skip) c->nonfinite = 1;
    if (s->nonfinite_skip) return PS_OK;
    count(&s->nonfinite_rejected);
    return ps_err_prefix(err, "step rejected (server.nonfinite_policy: reject)");
}

static void format_shape(char *buf, size_t len, const int64_t *dims, int ndim) {
    size_t o = 0;
    o += snprintf(buf + o, len - o, "(");
    for (int i = 0; i < ndim && o < len; i++)
        o += snprintf(buf + o, len - o, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (o < len) snprintf(buf + o, len - o, ")");
}

/* ---- stages, shapes ------------------------------------------------------ */

/* Distinct, reproducible dropout streams per (context, forward). */
/* Dropout masks of a training forward. From the low 32 bits of the context
 * id (ps-train's ids are a random base | a batch counter), the trainer's
 * rank and seq: ps-train's run with a given --seed draws the same masks
 * every time (reproducible on the same ISA and thread count), while
 * trainers of different ranks and batches draw different ones. */
static uint64_t dropout_seed(uint64_t ctx_id, uint32_t rank, uint32_t seq) {
    uint64_t z = (ctx_id & 0xffffffffULL) * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL +
                 (uint64_t)seq * 0xbf58476d1ce4e5b9ULL + ((uint64_t)rank << 32) * 0xd6e8feb86659fd93ULL;
    z ^= z >> 31;
    return z * 0x94d049bb133111ebULL;
}

/* The run of stages a request names: both empty = all; only stage = that
 * one; only last = from the first up to it. */
static ps_status resolve_stages(ps_service *s, const char *first_name, const char *last_name, const char *what,
                                int *first, int *last, ps_err *err) {
    int ns = ps_model_num_stages(s->model);
    *first = 0;
    *last = ns - 1;
    if (first_name[0] && (*first = ps_model_find_stage(s->model, first_name)) < 0)
        goto unknown;
    if (last_name[0]) {
        if ((*last = ps_model_find_stage(s->model, last_name)) < 0) {
            first_name = last_name;
            goto unknown;
        }
    } else if (first_name[0]) {
        *last = *first;
    }
    if (*last < *first)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: last_stage '%s' comes before stage '%s' in model %s",
                          what, last_name, first_name, ps_model_arch(s->model));
    return PS_OK;
unknown:;
    char names[256] = "";
    for (int i = 0; i < ns; i++) {
        size_t o = strlen(names);
        snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "", ps_model_stage(s->model, i)->name);
    }
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: model %s has no stage '%s' (stages: %s)", what,
                      ps_model_arch(s->model), first_name, names);
}

/* "(N, 1, 28, 28)"-style description of leading dims + per-sample dims. */
static void format_expected(char *buf, size_t len, const int64_t *dims, int ndim) {
    size_t o = (size_t)snprintf(buf, len, "(N");
    for (int i = 0; i < ndim && o < len; i++) o += (size_t)snprintf(buf + o, len - o, ", %lld", (long long)dims[i]);
    if (o < len) snprintf(buf + o, len - o, ")");
}

/* A tensor shaped (leading..., per-sample dims): checks the trailing dims
 * and returns the product of the leading ones (at least one leading dim). */
static ps_status split_batch(const ps_Tensor *t, const int64_t *per, int per_ndim, const char *what,
                             const char *whose, int64_t *n, int *nlead, ps_err *err) {
    int nd = (int)t->shape_count;
    int ok = nd >= per_ndim + 1;
    for (int i = 0; ok && i < per_ndim; i++) ok = t->shape[nd - per_ndim + i] == per[i];
    if (!ok) {
        char got[96], want[96];
        format_shape(got, sizeof got, t->shape, nd);
        format_expected(want, sizeof want, per, per_ndim);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: shape %s does not match %s %s (N = any leading dims)",
                          what, got, whose, want);
    }
    *nlead = nd - per_ndim;
    int64_t p = 1;
    for (int i = 0; i < *nlead; i++) p *= t->shape[i];  /* wire-checked: no overflow */
    *n = p;
    return PS_OK;
}

/* Forward output / input gradient dims: the request's leading dims + per-sample dims. */
static int join_dims(int64_t *out, const int64_t *lead, int nlead, const int64_t *per, int per_ndim) {
    int nd = 0;
    if (nlead + per_ndim > PS_WIRE_MAX_DIMS) {  /* fold leading dims into one */
        int64_t p = 1;
        for (int i = 0; i < nlead; i++) p *= lead[i];
        out[nd++] = p;
    } else {
        for (int i = 0; i < nlead; i++) out[nd++] = lead[i];
    }
    for (int i = 0; i < per_ndim && nd < PS_WIRE_MAX_DIMS; i++) out[nd++] = per[i];
    return nd;
}

/* ---- Forward ---------------------------------------------------------------- */

/* Whom a call's contexts belong to (ctx_table.h "Fair shares"): the
 * caller's token name, or its peer host without tokens (every connection
 * from a host is one client; trainer_rank is whatever a client claims). */
static void owner_of(const ps_rpc_call_info *info, char *dst, size_t n) {
    if (info && info->principal && info->principal[0]) {
        snprintf(dst, n, "token:%s", info->principal);
        return;
    }
    snprintf(dst, n, "%s", info && info->peer ? info->peer : "");
    if (!strncmp(dst, "unix", 4)) return;
    char *colon = strrchr(dst, ':'), *bracket = strrchr(dst, ']');
    if (colon && (!bracket || colon > bracket) && colon != strchr(dst, ':')) *colon = '\0';
}

/* A context the caller may use: its own (the owner that opened it). */
static ps_ctx *acquire_own(ps_service *s, const ps_rpc_call_info *info, uint64_t id, int *finished,
                           uint64_t *version, ps_err *err) {
    char owner[64];
    owner_of(info, owner, sizeof owner);
    return ps_ctx_table_acquire_as(s->ctx, id, owner, finished, version, err);
}

/* A decoded Forward: what forward_run needs, also after an ssp wait. */
typedef struct fwd_req {
    char owner[64];
    ps_service *svc;
    ps_ForwardRequest req;
    ps_wire_tensor_in in;
    ps_wire_tensor_in tin;   /* targets */
    ps_err err;
    ps_rpc_call *call;       /* when deferred */
} fwd_req;

static void fwd_req_free(fwd_req *f) {
    if (!f) return;
    ps_wire_tensor_in_free(&f->in);
    ps_wire_tensor_in_free(&f->tin);
    free(f);
}

typedef struct fwd_node {
    fwd_req *f;
    struct fwd_node *next;
} fwd_node;

static ps_status backward_one(ps_service *s, ps_ctx *c, uint32_t seq, const ps_Tensor *g, const float *gdata,
                              size_t gbytes, int finite, const char *what, float *gin, ps_err *err);

/* The fused decoder mode's loss: targets outside 0..k-1 are refused
 * (INVALID_ARGUMENT naming the first), then the shared cross-entropy. */
static ps_status fused_ce(const float *logits, const int64_t *tgt, int64_t n, int64_t k, float *grad, double *loss,
                          ps_err *err) {
    for (int64_t i = 0; i < n; i++)
        if (tgt[i] < 0 || tgt[i] >= k)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.targets[%lld] = %lld: outside the %lld "
                              "classes of the output", (long long)i, (long long)tgt[i], (long long)k);
    *loss = ps_cross_entropy(logits, tgt, n, k, grad);
    return PS_OK;
}

/* Runs a decoded, validated Forward; *response or err. */
static ps_status forward_run(ps_service *s, const char *owner, const ps_ForwardRequest *req,
                             const ps_wire_tensor_in *in, const ps_wire_tensor_in *tin,
                             grpc_byte_buffer **response, ps_err *err) {
    int first, last;
    if (resolve_stages(s, req->stage, req->last_stage, "ForwardRequest.stage", &first, &last, err)) return err->code;
    const ps_stage_info *si = ps_model_stage(s->model, first), *so = ps_model_stage(s->model, last);
    if ((int)req->input.dtype != (int)si->in_dtype)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.input: dtype %s, but stage '%s' takes %s",
                          ps_wire_dtype_name(req->input.dtype), si->name, ps_wire_dtype_name(si->in_dtype));
    char whose[96];
    snprintf(whose, sizeof whose, "the input of stage '%s'", si->name);
    int64_t n;
    int nlead;
    if (split_batch(&req->input, si->in_dims, si->in_ndim, "ForwardRequest.input", whose, &n, &nlead, err))
        return err->code;
    if (req->train && n > ps_model_max_batch(s->model))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.input: batch %lld is larger than the "
                          "maximum %d", (long long)n, ps_model_max_batch(s->model));
    if (!req->train && n > (int64_t)1 << 24)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.input: %lld samples in one inference "
                          "call; send at most %d", (long long)n, 1 << 24);
    if (req->train && req->context_id == 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.context_id: a training forward needs a "
                          "non-zero context id");
    int fused = req->has_targets;
    if (fused) {
        if (!req->train)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.targets: a fused loss needs train=true");
        if (so->out_ndim != 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.targets: stage '%s' does not output "
                              "logits (one vector per sample)", so->name);
        if (req->targets.dtype != ps_DType_INT64 || tin->bytes != (size_t)n * sizeof(int64_t))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.targets: %s of %zu bytes; the fused "
                              "loss takes %lld int64 class ids (one per sample)", ps_wire_dtype_name(req->targets.dtype),
                              tin->bytes, (long long)n);
    }
    int bad_input = 0;
    if (si->in_dtype == PS_DTYPE_F32 &&
        check_finite(in->data, in->bytes / sizeof(float), "ForwardRequest.input", err)) {
        if (!req->train || !s->nonfinite_skip) {  /* eval: nothing to skip, always refused */
            count(&s->nonfinite_rejected);
            return err->code;
        }
        bad_input = 1;
        ps_err_clear(err);
    }
    int64_t outper = 1;
    for (int i = 0; i < so->out_ndim; i++) outper *= so->out_dims[i];
    /* fused: the logits stay in the tape (below) */
    float *out = fused ? NULL : malloc((size_t)(n * outper) * sizeof(float) + 1), *logits = NULL;
    if (!fused && !out) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for a %lld x %lld output",
                                (long long)n, (long long)outper);
    uint64_t version = 0;
    ps_tape *tape = NULL;
    ps_ctx *c = NULL;
    float *gin = NULL;
    int replayed = 0;
    ps_status st = PS_OK;
    if (req->train) {
        ps_ctx_table_note_rank(s->ctx, req->trainer_rank);
        if (!(c = ps_ctx_table_open_as(s->ctx, req->context_id, req->trainer_rank, owner, NULL, err))) {
            st = err->code;
            goto out;
        }
        ps_ctx_fwd *rec = ps_ctx_find_fwd(c, req->seq);
        if (rec && fused) {
            st = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu: forward %u with targets is recorded "
                            "and backwarded; a fused forward is not repeated: run the round again under a new "
                            "context", (unsigned long long)req->context_id, req->seq);
            goto out;
        }
        if (rec) {  /* a retried Forward: answer from the record */
            if (!rec->tape) {
                st = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu: forward %u was already "
                                "backwarded; use a new sequence number for a new forward",
                                (unsigned long long)req->context_id, req->seq);
            } else if (ps_tape_first_stage(rec->tape) != first || ps_tape_last_stage(rec->tape) != last ||
                       ps_tape_batch(rec->tape) != n) {
                st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "context %llu: forward %u is recorded for other "
                                "stages or another batch size; a retry must repeat the request",
                                (unsigned long long)req->context_id, req->seq);
            } else if (!(st = ps_tape_get_output(s->model, rec->tape, out, err))) {
                version = rec->version;
                replayed = 1;
            }
            if (st) goto out;
        }
        /* the tape's memory, admitted before it is computed */
        if (!replayed && (st = ps_ctx_table_reserve(s->ctx, c, ps_model_tape_bytes(s->model, (int)n), err)))
            goto out;
        if (!replayed && (st = ps_model_forward_range(s->model, first, last, in->data, (int)n, 1, NULL,
                                         dropout_seed(req->context_id, req->trainer_rank, req->seq), out, &tape, &version, err)))
            goto out;
        if (!replayed) ps_tape_set_key(tape, req->context_id, req->seq);   /* running statistics fold in seq order */
        if (fused) {  /* read and overwritten with their gradient in place, or a copy (a device stage) */
            if (!(logits = ps_tape_output_writable(tape))) {
                if (!(out = malloc((size_t)(n * outper) * sizeof(float) + 1))) {
                    st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for a %lld x %lld output",
                                    (long long)n, (long long)outper);
                    goto out;
                }
                if ((st = ps_tape_get_output(s->model, tape, out, err))) goto out;
                logits = out;
            }
        }
        if (!replayed) {
            if ((st = ps_ctx_add_fwd(s->ctx, c, req->seq, tape, version, ps_tape_bytes(tape), err))) goto out;
            tape = NULL;  /* the context owns it now */
            if (bad_input) c->nonfinite = 1;
            __atomic_add_fetch(&s->samples, (uint64_t)n, __ATOMIC_RELAXED);
        }
    } else {
        if ((st = ps_model_forward_range(s->model, first, last, in->data, (int)n, 0, NULL, 0, out, NULL,
                                         &version, err)))
            goto out;
    }
    ps_ForwardResponse resp = ps_ForwardResponse_init_zero;
    int64_t dims[PS_WIRE_MAX_DIMS];
    int nd = join_dims(dims, req->input.shape, nlead, so->out_dims, so->out_ndim);
    if (nd == 1) dims[nd++] = 1;  /* a scalar per sample travels as (N, 1) */
    if (fused) {   /* the loss here, the backward of this forward at once */
        int64_t inper = 1;
        for (int i = 0; i < si->in_ndim; i++) inper *= si->in_dims[i];
        gin = si->in_dtype == PS_DTYPE_F32 ? malloc((size_t)(n * inper) * sizeof(float) + 1) : NULL;
        if (si->in_dtype == PS_DTYPE_F32 && !gin) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the fused loss");
            goto out;
        }
        /* the logits' gradient replaces them in place: they do not travel; a
         * finite loss means a finite gradient (every softmax term <= 1) */
        st = fused_ce(logits, (const int64_t *)tin->data, n, outper, logits, &resp.loss, err);
        ps_Tensor gt = ps_Tensor_init_zero;
        gt.shape_count = (pb_size_t)nd;
        memcpy(gt.shape, dims, sizeof(int64_t) * (size_t)nd);
        gt.dtype = ps_DType_FLOAT32;
        if (!st) st = backward_one(s, c, req->seq, &gt, logits, (size_t)(n * outper) * sizeof(float),
                                   isfinite(resp.loss), "ForwardRequest.targets", gin, err);
        if (st) goto out;
        if (req->want_grad_sq_norm && c->grads &&
            (st = ps_grads_sq_norm(s->model, c->grads, &resp.grad_sq_norm, err)))
            goto out;
        size_t tb = 0;
        for (size_t k = 0; k < c->nfwd; k++) tb += c->fwd[k].bytes;
        ps_ctx_table_account(s->ctx, c, (c->grads ? ps_grads_bytes(c->grads) : 0) + tb);
        if (gin) {
            resp.has_input_grad = true;
            ps_wire_tensor_encode_bind(&resp.input_grad, NULL, (int)req->input.shape_count, req->input.shape, gin);
        }
    } else {
        resp.has_output = true;
        ps_wire_tensor_encode_bind(&resp.output, NULL, nd, dims, out);
    }
    resp.model_version = version;
    resp.replayed = replayed;
    if (req->train) ps_trainers_forward(s->trainers, req->trainer_rank, n, replayed, fused ? resp.loss : NAN);
    if (ps_cons_mode_of(s->cons) == PS_CONS_SYNC) resp.round = c && c->round ? c->round : ps_cons_round(s->cons);
    if (c && !c->round && ps_cons_mode_of(s->cons) == PS_CONS_SYNC) c->round = resp.round;
    st = ps_wire_encode(ps_ForwardResponse_fields, &resp, response, err);
out:
    if (c) ps_ctx_table_release(s->ctx, c);
    ps_tape_free(tape);
    free(out);
    free(gin);
    return st;
}

/* ssp: a held-back Forward may run (or psd shuts down). Runs on the
 * service's executor thread, never on the thread that released it. */
static void fwd_ready(void *arg, ps_status st, const ps_err *err) {
    fwd_req *f = arg;
    ps_service *s = f->svc;
    if (st != PS_OK) {
        ps_rpc_call_complete(f->call, NULL, ps_grpc_from_status(st), err ? err->msg : "");
        fwd_req_free(f);
        return;
    }
    pthread_mutex_lock(&s->exec_mu);
    fwd_node *node = malloc(sizeof *node);
    if (!node) {
        pthread_mutex_unlock(&s->exec_mu);
        ps_rpc_call_complete(f->call, NULL, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        fwd_req_free(f);
        return;
    }
    node->f = f;
    node->next = NULL;
    if (s->exec_tail) s->exec_tail->next = node;
    else s->exec_head = node;
    s->exec_tail = node;
    pthread_cond_signal(&s->exec_cv);
    pthread_mutex_unlock(&s->exec_mu);
}

static void *exec_main(void *p) {
    ps_service *s = p;
    pthread_mutex_lock(&s->exec_mu);
    for (;;) {
        while (!s->exec_head && !s->exec_stop) pthread_cond_wait(&s->exec_cv, &s->exec_mu);
        if (!s->exec_head) break;
        fwd_node *node = s->exec_head;
        s->exec_head = node->next;
        if (!s->exec_head) s->exec_tail = NULL;
        pthread_mutex_unlock(&s->exec_mu);
        fwd_req *f = node->f;
        free(node);
        grpc_byte_buffer *resp = NULL;
        ps_err err = {0};
        if (forward_run(s, f->owner, &f->req, &f->in, &f->tin, &resp, &err) == PS_OK)
            ps_rpc_call_complete(f->call, resp, GRPC_STATUS_OK, NULL);
        else
            ps_rpc_call_complete(f->call, NULL, ps_grpc_from_status(err.code), err.msg);
        fwd_req_free(f);
        pthread_mutex_lock(&s->exec_mu);
    }
    pthread_mutex_unlock(&s->exec_mu);
    return NULL;
}

static void handle_forward(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                           grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    ps_service *s = user;
    fwd_req *f = calloc(1, sizeof *f);
    ps_err err = {0};
    if (!f) {
        ps_err_set(&err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        fail(code, details, dlen, &err);
        return;
    }
    f->svc = s;
    owner_of(info, f->owner, sizeof f->owner);
    f->req = (ps_ForwardRequest)ps_ForwardRequest_init_zero;
    ps_wire_tensor_in_init(&f->in, s->max_tensor_bytes);
    f->in.err = &err;
    ps_wire_tensor_decode_bind(&f->req.input, &f->in);
    ps_wire_tensor_in_init(&f->tin, s->max_tensor_bytes);
    f->tin.err = &err;
    ps_wire_tensor_decode_bind(&f->req.targets, &f->tin);
    if (ps_service_draining(s)) {
        ps_err_set(&err, PS_ERR_UNAVAILABLE, "psd is shutting down: no new work is accepted (open "
                   "contexts may still finish their Backward and Step); retry when it is back");
        goto fail;
    }
    if (ps_wire_decode(request, ps_ForwardRequest_fields, &f->req, &err) ||
        (!f->req.has_input && ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.input is missing")) ||
        ps_wire_tensor_check(&f->req.input, &f->in, "ForwardRequest.input", &err) ||
        (f->req.has_targets && ps_wire_tensor_check(&f->req.targets, &f->tin, "ForwardRequest.targets", &err)))
        goto fail;
    f->in.err = NULL;
    f->tin.err = NULL;
    /* ssp: a trainer too far ahead waits, without holding this thread. */
    if (f->req.train && ps_cons_mode_of(s->cons) == PS_CONS_SSP && info->call) {
        f->call = ps_rpc_call_defer(info, NULL, NULL);
        if (!ps_cons_ssp_admit(s->cons, f->req.trainer_rank, fwd_ready, f)) return;  /* answered later */
        grpc_byte_buffer *resp = NULL;
        if (forward_run(s, f->owner, &f->req, &f->in, &f->tin, &resp, &err) == PS_OK)
            ps_rpc_call_complete(f->call, resp, GRPC_STATUS_OK, NULL);
        else
            ps_rpc_call_complete(f->call, NULL, ps_grpc_from_status(err.code), err.msg);
        fwd_req_free(f);
        return;
    }
    if (forward_run(s, f->owner, &f->req, &f->in, &f->tin, response, &err)) goto fail;
    fwd_req_free(f);
    return;
fail:
    fail(code, details, dlen, &err);
    fwd_req_free(f);
}

/* ---- Step (shared by Step and Backward(step)) --------------------------------- */

/* Finish a marked context without applying its step. */
static uint64_t skip_step(ps_service *s, ps_ctx *c) {
    uint64_t v = ps_model_version(s->model);
    ps_log(PS_LOG_WARN, "context %llx: step skipped: non-finite values (server.nonfinite_policy: skip)",
           (unsigned long long)c->id);
    ps_ctx_table_finish(s->ctx, c, v);  /* frees c */
    count(&s->nonfinite_skipped);
    return v;
}

/* A step's answer, as Step or Backward sends it. */
typedef struct step_result {
    uint64_t version, round;
    uint32_t members;
    int skipped;
    double sq_norm;         /* Backward without step: the context's gradient norm squared */
    const ps_round_report *metrics;  /* NULL: the newest closed metrics round */
} step_result;

static void put_round_scalars(const ps_round_report *r, ps_RoundScalar *out, pb_size_t *count, pb_size_t cap) {
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

/* A request's scalars as a checked set. */
static ps_status scalars_in(const ps_ScalarValue *v, pb_size_t n, ps_scalar_set *set, ps_err *err) {
    set->n = 0;
    for (pb_size_t i = 0; i < n && i < PS_RM_MAX_SCALARS; i++) {
        snprintf(set->s[set->n].name, PS_RM_NAME_MAX, "%s", v[i].name);
        set->s[set->n++].value = v[i].value;
    }
    return ps_scalar_set_check(set, err);
}

static ps_status encode_step_result(ps_service *svc, int as_backward, const step_result *r,
                                    const ps_wire_named_list *input_grads, grpc_byte_buffer **response, ps_err *err) {
    if (as_backward) {
        ps_BackwardResponse resp = ps_BackwardResponse_init_zero;
        resp.model_version = r->version;
        resp.skipped = r->skipped;
        resp.round = r->round;
        resp.grad_sq_norm = r->sq_norm;
        if (input_grads && input_grads->n) ps_wire_tensors_encode_bind(&resp.input_grads, input_grads);
        return ps_wire_encode(ps_BackwardResponse_fields, &resp, response, err);
    }
    ps_StepResponse resp = ps_StepResponse_init_zero;
    resp.model_version = r->version;
    resp.skipped = r->skipped;
    resp.round = r->round;
    resp.round_contexts = r->members;
    ps_round_report latest;
    const ps_round_report *m = r->metrics;
    if (!m && svc) {
        ps_rmetrics_latest(svc->rm, &latest);
        m = &latest;
    }
    if (m) {
        put_round_scalars(m, resp.round_scalars, &resp.round_scalars_count,
                          (pb_size_t)(sizeof resp.round_scalars / sizeof resp.round_scalars[0]));
        resp.metrics_round = m->round;
        resp.solved = m->solved;
    }
    return ps_wire_encode(ps_StepResponse_fields, &resp, response, err);
}

/* A context waiting in a sync round. */
typedef struct sync_wait {
    ps_service *svc;
    ps_ctx *ctx;
    ps_rpc_call *call;
    int as_backward;
    ps_wire_named_list grads_list;  /* Backward(step, want_input_grad): what to send back */
    ps_wire_named *items;
    float *gbuf;
    ps_scalar_set scalars;          /* its contribution to the round's metrics */
    ps_round_report report;         /* the round's metrics (set by sync_apply) */
} sync_wait;

static void sync_wait_free(sync_wait *w) {
    free(w->items);
    free(w->gbuf);
    free(w);
}

static void sync_done(void *arg, ps_status st, const ps_err *err, uint64_t version, uint64_t round,
                      uint32_t members) {
    sync_wait *w = arg;
    ps_service *s = w->svc;
    if (st != PS_OK) {
        ps_ctx_table_release(s->ctx, w->ctx);  /* kept: a retry of the Step may rejoin */
        ps_rpc_call_complete(w->call, NULL, ps_grpc_from_status(st), err ? err->msg : "");
        sync_wait_free(w);
        return;
    }
    int skipped = w->ctx->nonfinite;
    if (skipped) count(&s->nonfinite_skipped);
    ps_trainers_step(s->trainers, w->ctx->rank, w->ctx->id, &w->scalars);
    ps_ctx_table_finish(s->ctx, w->ctx, version);
    step_result r = {.version = version, .round = round, .members = members, .skipped = skipped, .metrics = &w->report};
    grpc_byte_buffer *resp = NULL;
    ps_err e = {0};
    if (encode_step_result(s, w->as_backward, &r, &w->grads_list, &resp, &e) == PS_OK)
        ps_rpc_call_complete(w->call, resp, GRPC_STATUS_OK, NULL);
    else
        ps_rpc_call_complete(w->call, NULL, ps_grpc_from_status(e.code), e.msg);
    sync_wait_free(w);
}

/* sync: sum (or average) the round's gradients into the first and step. */
static ps_status sync_apply(void *user, void *const *grads, void *const *args, int n, int average, uint64_t *version,
                            ps_err *err) {
    ps_service *s = user;
    /* the round's metrics, once, into every member's answer */
    const ps_scalar_set **sets = calloc((size_t)(n > 0 ? n : 1), sizeof *sets);
    if (!sets) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory closing the round's metrics");
    for (int i = 0; i < n; i++) sets[i] = &((const sync_wait *)args[i])->scalars;
    ps_round_report rep;
    ps_rmetrics_close_round(s->rm, sets, n, &rep);
    free(sets);
    for (int i = 0; i < n; i++) ((sync_wait *)args[i])->report = rep;
    ps_grads *acc = NULL;
    int used = 0;
    for (int i = 0; i < n; i++) {
        if (!grads[i]) continue;
        if (!acc) acc = grads[i];
        else if (ps_grads_add(s->model, acc, grads[i], err)) return err->code;
        used++;
    }
    if (!acc) {  /* every member skipped: nothing to apply, the version stays */
        *version = ps_model_version(s->model);
        return PS_OK;
    }
    if (average && used > 1 && ps_grads_scale(s->model, acc, 1.0f / (float)used, err)) return err->code;
    return ps_model_step_grads(s->model, acc, version, err);
}

/* Apply (or, under sync, queue) the step of context c, which the caller
 * holds. On return either c was finished or released and *response / err
 * say what to answer (returns PS_OK or an error), or the answer was
 * deferred: *deferred = 1 and c belongs to the round. */
static ps_status step_context(ps_service *s, const ps_rpc_call_info *info, ps_ctx *c, uint64_t round,
                              float grad_scale, const ps_scalar_set *scalars, int as_backward, ps_wire_named *items,
                              float *gbuf, size_t nitems, grpc_byte_buffer **response, int *deferred, ps_err *err) {
    *deferred = 0;
    uint32_t pending_seq = 0;
    size_t pending = ps_ctx_pending(c, &pending_seq);
    if (pending) {
        ps_ctx_table_release(s->ctx, c);
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu: %zu recorded forward%s not backwarded "
                          "yet (first: seq %u); call Backward first, for every forward of the context",
                          (unsigned long long)c->id, pending, pending == 1 ? "" : "s", pending_seq);
    }
    if (c->nonfinite && !s->nonfinite_skip) {
        count(&s->nonfinite_rejected);
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "context %llu has non-finite gradients; step rejected "
                   "(server.nonfinite_policy: reject)", (unsigned long long)c->id);
        ps_ctx_table_release(s->ctx, c);
        return err->code;
    }
    if (!c->grads && !c->nonfinite) {
        uint64_t id = c->id;
        ps_ctx_table_release(s->ctx, c);
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu has no gradients to apply (call "
                          "Backward first)", (unsigned long long)id);
    }
    if (!isfinite(grad_scale) || grad_scale < 0) {
        ps_ctx_table_release(s->ctx, c);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "StepRequest.grad_scale %g: must be finite and >= 0 "
                          "(0 = 1)", (double)grad_scale);
    }
    if (grad_scale != 0 && grad_scale != 1 && c->grads && !c->nonfinite &&
        ps_grads_scale(s->model, c->grads, grad_scale, err)) {
        ps_ctx_table_release(s->ctx, c);
        return err->code;
    }
    ps_wire_named_list list = {items, nitems};
    if (ps_cons_mode_of(s->cons) == PS_CONS_SYNC) {
        sync_wait *w = calloc(1, sizeof *w);
        ps_rpc_call *call = w ? ps_rpc_call_defer(info, NULL, NULL) : NULL;
        if (!call) {
            free(w);
            ps_ctx_table_release(s->ctx, c);
            return ps_err_set(err, w ? PS_ERR_UNAVAILABLE : PS_ERR_RESOURCE_EXHAUSTED,
                              w ? "sync step outside a server" : "out of memory");
        }
        *w = (sync_wait){s, c, call, as_backward, list, items, gbuf, *scalars, {0}};
        if (round == 0) round = c->round;
        ps_status st = ps_cons_sync_submit(s->cons, round, c->nonfinite ? NULL : c->grads, sync_done, w, err);
        if (st != PS_OK) {
            if (st == PS_ERR_ABORTED) ps_ctx_table_finish(s->ctx, c, ps_model_version(s->model));
            else ps_ctx_table_release(s->ctx, c);
            ps_rpc_call_complete(call, NULL, ps_grpc_from_status(st), err->msg);
            sync_wait_free(w);
        }
        *deferred = 1;
        return PS_OK;
    }
    step_result r = {0};
    ps_round_report rep;
    uint32_t who = c->rank;
    uint64_t cid = c->id;
    if (c->nonfinite) {
        r.version = skip_step(s, c);
        r.skipped = 1;
    } else {
        uint32_t rank = c->rank;
        if (ps_model_step_grads(s->model, c->grads, &r.version, err)) {
            ps_ctx_table_release(s->ctx, c);
            return err->code;
        }
        ps_ctx_table_finish(s->ctx, c, r.version);
        ps_cons_stepped(s->cons, rank);
    }
    ps_trainers_step(s->trainers, who, cid, scalars);
    ps_rmetrics_add_step(s->rm, scalars, &rep);  /* a skipped step's scalars still describe its work */
    r.metrics = &rep;
    return encode_step_result(s, as_backward, &r, &list, response, err);
}

/* ---- Backward --------------------------------------------------------------- */

/* Backward of one recorded forward: accumulate its parameter gradients into
 * the context (never non-finite ones under "reject"), optionally its input
 * gradient into gin. */
static ps_status backward_one(ps_service *s, ps_ctx *c, uint32_t seq, const ps_Tensor *g, const float *gdata,
                              size_t gbytes, int finite, const char *what, float *gin, ps_err *err) {
    ps_ctx_fwd *f = ps_ctx_find_fwd(c, seq);
    if (!f)
        return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: context %llu has no forward with seq %u",
                          what, (unsigned long long)c->id, seq);
    if (!f->tape)
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: forward %u of context %llu was already "
                          "backwarded", what, seq, (unsigned long long)c->id);
    const ps_stage_info *so = ps_model_stage(s->model, ps_tape_last_stage(f->tape));
    int64_t n;
    int nlead;
    char whose[128];
    snprintf(whose, sizeof whose, "the output of stage '%s'", so->name);
    if (split_batch(g, so->out_dims, so->out_ndim, what, whose, &n, &nlead, err)) {
        /* a scalar output travels as (N, 1) */
        if (!(so->out_ndim == 0 && g->shape_count == 2 && g->shape[1] == 1)) return err->code;
        n = g->shape[0];
        ps_err_clear(err);
    }
    if (n != ps_tape_batch(f->tape)) {
        char got[96];
        format_shape(got, sizeof got, g->shape, (int)g->shape_count);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: shape %s does not match the context's output "
                          "(%d samples of forward %u)", what, got, ps_tape_batch(f->tape), seq);
    }
    if (g->dtype != ps_DType_FLOAT32)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: dtype %s; gradients are float32", what,
                          ps_wire_dtype_name(g->dtype));
    if (!finite && check_finite(gdata, gbytes / sizeof(float), what, err)) {
        ps_status st = nonfinite(s, c, err);
        if (st) return st;
        ps_ctx_fwd_done(s->ctx, c, f);  /* skip: the context's step will not apply */
        return PS_OK;
    }
    if (c->nonfinite && s->nonfinite_skip) {
        ps_ctx_fwd_done(s->ctx, c, f);
        return PS_OK;
    }
    /* Into the context's accumulator directly when it is empty; otherwise
     * through a scratch one, so a refused backward adds nothing. */
    int direct = c->grads == NULL;
    ps_grads *g2 = ps_grads_create(s->model, err);
    if (!g2) return err->code;
    ps_status st = ps_model_backward_acc(s->model, f->tape, gdata, gin, g2, err);
    int bad_param = -1;
    int64_t bad_elem = -1;
    int fin = st ? 1 : ps_grads_check_finite(s->model, g2, &bad_param, &bad_elem);
    if (!st && fin < 0) st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cannot check the gradients (out of memory)");
    if (!st && fin == 0) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradient of %s (computed from grad_output): element %lld is "
                   "not finite", ps_model_param(s->model, bad_param)->name, (long long)bad_elem);
        st = nonfinite(s, c, err);
        if (!st) {  /* skip: nonfinite() marked it; the step will not apply */
            ps_grads_free(g2);
            ps_ctx_fwd_done(s->ctx, c, f);
            return PS_OK;
        }
    }
    if (!st && !direct) st = ps_grads_add(s->model, c->grads, g2, err);
    if (st) {
        ps_grads_free(g2);
        return st;
    }
    if (direct) c->grads = g2;
    else ps_grads_free(g2);
    ps_ctx_fwd_done(s->ctx, c, f);
    return PS_OK;
}

static void handle_backward(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                            grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    ps_service *s = user;
    ps_err err = {0};
    ps_BackwardRequest req = ps_BackwardRequest_init_zero;
    ps_wire_tensor_in in;
    ps_wire_tensor_in_init(&in, s->max_tensor_bytes);
    in.err = &err;
    ps_wire_tensor_decode_bind(&req.grad_output, &in);
    ps_wire_tensor_list more;
    ps_wire_tensor_list_init(&more, s->max_tensor_bytes);
    more.err = &err;
    ps_wire_tensors_decode_bind(&req.more_grad_outputs, &more);
    ps_ctx *c = NULL;
    ps_wire_named *items = NULL;
    float *gbuf = NULL;
    size_t nitems = 0;
    if (ps_wire_decode(request, ps_BackwardRequest_fields, &req, &err) ||
        (!req.has_grad_output && ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "BackwardRequest.grad_output is missing")) ||
        ps_wire_tensor_check(&req.grad_output, &in, "BackwardRequest.grad_output", &err))
        goto fail;
    if (req.more_seqs_count != more.n) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "BackwardRequest: %u more_seqs but %zu more_grad_outputs; "
                   "they go in pairs", (unsigned)req.more_seqs_count, more.n);
        goto fail;
    }
    ps_scalar_set sc;   /* refused before anything is accumulated */
    if (scalars_in(req.scalars, req.scalars_count, &sc, &err)) {
        ps_err_prefix(&err, "BackwardRequest");
        goto fail;
    }
    if (!(c = acquire_own(s, info, req.context_id, NULL, NULL, &err))) goto fail;
    /* the first Backward of a context allocates its gradient accumulator */
    if (!c->grads && ps_ctx_table_reserve(s->ctx, c, (size_t)ps_model_num_weights(s->model) * sizeof(float), &err))
        goto fail;
    size_t ncov = 1 + more.n;
    if (req.want_input_grad) {
        /* one input gradient per covered forward: sizes from their tapes */
        items = calloc(ncov, sizeof *items);
        size_t total = 0;
        for (size_t k = 0; items && k < ncov; k++) {
            uint32_t seq = k ? req.more_seqs[k - 1] : req.seq;
            ps_ctx_fwd *f = ps_ctx_find_fwd(c, seq);
            if (!f || !f->tape) continue;  /* backward_one explains */
            const ps_stage_info *si = ps_model_stage(s->model, ps_tape_first_stage(f->tape));
            if (si->in_dtype != PS_DTYPE_F32) {
                ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "BackwardRequest.want_input_grad: the input of stage "
                           "'%s' is %s ids; it has no gradient", si->name, ps_wire_dtype_name(si->in_dtype));
                goto fail;
            }
            int64_t per = 1;
            for (int i = 0; i < si->in_ndim; i++) per *= si->in_dims[i];
            items[k].ndim = 1 + si->in_ndim;
            items[k].dims[0] = ps_tape_batch(f->tape);
            for (int i = 0; i < si->in_ndim; i++) items[k].dims[1 + i] = si->in_dims[i];
            if (items[k].ndim > PS_WIRE_MAX_DIMS) items[k].ndim = PS_WIRE_MAX_DIMS;
            total += (size_t)(ps_tape_batch(f->tape) * per);
        }
        gbuf = items ? malloc(total * sizeof(float) + 1) : NULL;
        if (!gbuf) {
            ps_err_set(&err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for input gradients");
            goto fail;
        }
        float *p = gbuf;
        for (size_t k = 0; k < ncov; k++) {
            int64_t cnt = 1;
            for (int i = 0; i < items[k].ndim; i++) cnt *= items[k].dims[i];
            items[k].data = p;
            items[k].name = "";
            if (items[k].ndim) p += cnt;
        }
        nitems = ncov;
    }
    for (size_t k = 0; k < ncov; k++) {
        char what[96];
        if (k == 0) snprintf(what, sizeof what, "BackwardRequest.grad_output");
        else snprintf(what, sizeof what, "BackwardRequest.more_grad_outputs[%zu]", k - 1);
        const ps_Tensor *gt = &req.grad_output;
        ps_Tensor mt = ps_Tensor_init_zero;
        const float *gd = in.data;
        size_t gb = in.bytes;
        if (k) {
            const ps_wire_tensor *w = &more.items[k - 1];
            mt.shape_count = (pb_size_t)w->ndim;
            memcpy(mt.shape, w->dims, sizeof(int64_t) * (size_t)w->ndim);
            mt.dtype = (ps_DType)w->dtype;
            gt = &mt;
            gd = w->data;
            gb = w->bytes;
        }
        float *gin = nitems && items[k].ndim ? (float *)items[k].data : NULL;
        if (backward_one(s, c, k ? req.more_seqs[k - 1] : req.seq, gt, gd, gb, 0, what, gin, &err)) goto fail;
    }
    size_t tb = 0;
    for (size_t k = 0; k < c->nfwd; k++) tb += c->fwd[k].bytes;
    ps_ctx_table_account(s->ctx, c, (c->grads ? ps_grads_bytes(c->grads) : 0) + tb);
    if (req.step) {
        int deferred;
        ps_ctx *held = c;
        c = NULL;  /* step_context finishes, releases or queues it */
        if (step_context(s, info, held, req.round, 1.0f, &sc, 1, items, gbuf, nitems, response, &deferred, &err))
            goto fail;
        if (deferred) items = NULL, gbuf = NULL;  /* the round owns them */
        goto done;
    }
    step_result r = {.version = ps_model_version(s->model)};
    if (c->grads && ps_grads_sq_norm(s->model, c->grads, &r.sq_norm, &err)) goto fail;
    ps_wire_named_list list = {items, nitems};
    if (encode_step_result(s, 1, &r, &list, response, &err)) goto fail;
    goto done;
fail:
    fail(code, details, dlen, &err);
done:
    if (c) ps_ctx_table_release(s->ctx, c);
    free(items);
    free(gbuf);
    ps_wire_tensor_list_free(&more);
    ps_wire_tensor_in_free(&in);
}

/* The model's parameters as a list for the wire: names, shapes, stages and
 * devices, and - with want_data - a host copy of each parameter's weights,
 * or of its accumulated gradient in grads when grads is not NULL. The caller frees
 * *items and *buf (both NULL on error). */
static ps_status named_params(ps_service *s, int want_data, const ps_grads *grads, ps_wire_named **items,
                              float **buf, ps_err *err) {
    int np = ps_model_num_params(s->model);
    *items = calloc(np, sizeof **items);
    *buf = want_data ? malloc((size_t)ps_model_num_weights(s->model) * sizeof(float)) : NULL;
    ps_status rc = PS_OK;
    if (!*items || (want_data && !*buf)) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    float *p = *buf;
    for (int i = 0; i < np && rc == PS_OK; i++) {
        const ps_param_info *pi = ps_model_param(s->model, i);
        ps_wire_named *it = &(*items)[i];
        it->name = pi->name;
        it->ndim = pi->ndim;
        memcpy(it->dims, pi->dims, sizeof pi->dims);
        it->device = pi->device;
        it->stage = pi->stage;
        it->sparse = pi->sparse;
        it->row_offset = pi->row_offset;
        it->rows_total = pi->rows_total;
        if (!want_data) continue;
        rc = grads ? ps_grads_get(s->model, grads, i, p, err) : ps_model_get_param(s->model, i, p, err);
        it->data = p;
        p += pi->numel;
    }
    if (rc != PS_OK) {
        free(*items);
        free(*buf);
        *items = NULL;
        *buf = NULL;
    }
    return rc;
}

static void handle_get_gradients(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                 grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                 size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_GetGradientsRequest req = ps_GetGradientsRequest_init_zero;
    ps_ctx *c = NULL;
    float *buf = NULL;
    ps_wire_named *items = NULL;
    if (ps_wire_decode(request, ps_GetGradientsRequest_fields, &req, &err)) goto fail;
    c = acquire_own(s, info, req.context_id, NULL, NULL, &err);
    if (!c) goto fail;
    if (!c->grads) {
        ps_err_set(&err, PS_ERR_FAILED_PRECONDITION, "context %llu has no gradients yet (call Backward first)",
                   (unsigned long long)req.context_id);
        goto fail;
    }
    if (named_params(s, 1, c->grads, &items, &buf, &err)) goto fail;
    ps_wire_named_list list = {items, (size_t)ps_model_num_params(s->model)};
    ps_GetGradientsResponse resp = ps_GetGradientsResponse_init_zero;
    ps_wire_tensors_encode_bind(&resp.gradients, &list);
    reply(ps_GetGradientsResponse_fields, &resp, response, code, details, dlen);
    goto done;
fail:
    fail(code, details, dlen, &err);
done:
    if (c) ps_ctx_table_release(s->ctx, c);
    free(items);
    free(buf);
}

static void handle_step(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                        grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    ps_service *s = user;
    ps_err err = {0};
    ps_StepRequest req = ps_StepRequest_init_zero;
    if (ps_wire_decode(request, ps_StepRequest_fields, &req, &err)) goto fail;
    ps_scalar_set sc;
    if (scalars_in(req.scalars, req.scalars_count, &sc, &err)) {
        ps_err_prefix(&err, "StepRequest");
        goto fail;
    }
    int finished = 0;
    uint64_t v = 0;
    ps_ctx *c = acquire_own(s, info, req.context_id, &finished, &v, &err);
    if (!c && finished == 1) {   /* a retried Step: answer what the first one did */
        ps_trainers_step_repeated(s->trainers, req.context_id);
        step_result r = {.version = v, .skipped = ps_ctx_table_finished_skipped(s->ctx, req.context_id)};
        if (encode_step_result(s, 0, &r, NULL, response, &err)) goto fail;
        return;
    }
    if (!c) goto fail;
    int deferred;
    if (step_context(s, info, c, req.round, req.grad_scale, &sc, 0, NULL, NULL, 0, response, &deferred, &err))
        goto fail;
    return;
fail:
    fail(code, details, dlen, &err);
}

/* PushGradients: gradients of a parameter-only stage's parameters (the
 * trainer's LSTM) added into a live context, applied by its Step. Once per
 * context: a repeat (a retry whose first reply was lost) is answered
 * without adding again. */
static void handle_push_gradients(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                  grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                  size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_PushGradientsRequest req = ps_PushGradientsRequest_init_zero;
    ps_wire_tensor_list gl;
    ps_wire_tensor_list_init(&gl, s->max_tensor_bytes);
    gl.err = &err;
    ps_wire_tensors_decode_bind(&req.gradients, &gl);
    ps_ctx *c = NULL;
    ps_grads *g2 = NULL;
    if (ps_wire_decode(request, ps_PushGradientsRequest_fields, &req, &err)) goto fail;
    if (!gl.n) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.gradients is empty");
        goto fail;
    }
    /* Open the context when this is its first call here: a psd that hosts
     * only a parameter-only stage (rnn_lm's "rnn" on its own server) sees
     * no Forward of the batch. */
    if (req.context_id == 0) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.context_id is 0 (gradients belong to a "
                   "training context)");
        goto fail;
    }
    char owner[64];
    owner_of(info, owner, sizeof owner);
    int created = 0;
    if (!(c = ps_ctx_table_open_as(s->ctx, req.context_id, req.trainer_rank, owner, &created, &err))) goto fail;
    if (created) {
        size_t more = 0;
        for (size_t k = 0; k < gl.n; k++) more += gl.items[k].bytes;
        if (ps_ctx_table_reserve(s->ctx, c, more, &err)) goto fail;
    }
    if (!c->pushed) {
        /* check everything into a scratch accumulator first: a refused push adds nothing */
        if (!(g2 = ps_grads_create(s->model, &err))) goto fail;
        for (size_t k = 0; k < gl.n; k++) {
            const ps_wire_tensor *t = &gl.items[k];
            int i = ps_model_find_param(s->model, t->name);
            if (i < 0) {
                ps_err_set(&err, PS_ERR_NOT_FOUND, "PushGradientsRequest.gradients[%zu]: model '%s' has no parameter "
                           "'%s'", k, ps_model_arch(s->model), t->name);
                goto fail;
            }
            const ps_param_info *pi = ps_model_param(s->model, i);
            const ps_stage_info *si = ps_model_stage(s->model, pi->stage_index);
            if (!si->params_only) {
                ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.gradients[%zu]: %s belongs to stage "
                           "'%s', which psd computes (its gradients come from Backward); only a parameter-only "
                           "stage's gradients are pushed", k, t->name, si->name);
                goto fail;
            }
            int same = t->ndim == pi->ndim;
            for (int d = 0; same && d < pi->ndim; d++) same = t->dims[d] == pi->dims[d];
            if (!same || t->dtype != ps_DType_FLOAT32) {
                char got[96], want[96];
                format_shape(got, sizeof got, t->dims, t->ndim);
                format_shape(want, sizeof want, pi->dims, pi->ndim);
                ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.gradients[%zu] (%s): %s %s; the "
                           "parameter is float32 %s", k, t->name, ps_wire_dtype_name(t->dtype), got, want);
                goto fail;
            }
            if (check_finite(t->data, t->bytes / sizeof(float), t->name, &err)) {
                if (nonfinite(s, c, &err)) goto fail;
                c->nonfinite = 1;   /* skip: marked; the step will not apply */
                continue;
            }
            if (ps_grads_add_dense(s->model, g2, i, t->data, &err)) goto fail;
        }
        if (c->grads) {
            if (ps_grads_add(s->model, c->grads, g2, &err)) goto fail;
        } else {
            c->grads = g2;
            g2 = NULL;
        }
        c->pushed = 1;
        size_t tb = 0;
        for (size_t k = 0; k < c->nfwd; k++) tb += c->fwd[k].bytes;
        ps_ctx_table_account(s->ctx, c, ps_grads_bytes(c->grads) + tb);
    }
    ps_PushGradientsResponse resp = ps_PushGradientsResponse_init_zero;
    resp.model_version = ps_model_version(s->model);
    if (c->grads && ps_grads_sq_norm(s->model, c->grads, &resp.grad_sq_norm, &err)) goto fail;
    reply(ps_PushGradientsResponse_fields, &resp, response, code, details, dlen);
    goto done;
fail:
    fail(code, details, dlen, &err);
done:
    if (c) ps_ctx_table_release(s->ctx, c);
    ps_grads_free(g2);
    ps_wire_tensor_list_free(&gl);
}

static void handle_list_parameters(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                   grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                   size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_ListParametersRequest req = ps_ListParametersRequest_init_zero;
    if (ps_wire_decode(request, ps_ListParametersRequest_fields, &req, &err)) {
        fail(code, details, dlen, &err);
        return;
    }
    ps_wire_named *items;
    float *none;
    if (named_params(s, 0, NULL, &items, &none, &err)) {
        fail(code, details, dlen, &err);
        return;
    }
    ps_wire_named_list list = {items, (size_t)ps_model_num_params(s->model)};
    ps_ListParametersResponse resp = ps_ListParametersResponse_init_zero;
    ps_wire_params_encode_bind(&resp.parameters, &list);
    int ns = ps_model_num_stages(s->model);
    for (int i = 0; i < ns && i < (int)(sizeof resp.stages / sizeof resp.stages[0]); i++) {
        const ps_stage_info *si = ps_model_stage(s->model, i);
        ps_StageInfo *o = &resp.stages[resp.stages_count++];
        snprintf(o->name, sizeof o->name, "%s", si->name);
        snprintf(o->device, sizeof o->device, "%s", si->device);
        o->input_dtype = (ps_DType)si->in_dtype;
        o->input_shape_count = (pb_size_t)si->in_ndim;
        memcpy(o->input_shape, si->in_dims, sizeof(int64_t) * (size_t)si->in_ndim);
        o->output_shape_count = (pb_size_t)si->out_ndim;
        memcpy(o->output_shape, si->out_dims, sizeof(int64_t) * (size_t)si->out_ndim);
        o->row_lo = si->row_lo;
        o->row_hi = si->row_hi;
    }
    snprintf(resp.model, sizeof resp.model, "%s", ps_model_arch(s->model));
    snprintf(resp.cluster, sizeof resp.cluster, "%s", s->cluster);
    snprintf(resp.server_name, sizeof resp.server_name, "%s", s->server_name);
    reply(ps_ListParametersResponse_fields, &resp, response, code, details, dlen);
    free(items);
}

/* GetParameters: the weights of every parameter, or of one stage's, paged
 * by max_bytes (or the message limit): a parameter that does not fit is cut
 * between rows. Each tensor is copied under the weights lock; a page's
 * model_version is read before its copies, and the pages of one selection
 * may span steps (training goes on between them). */
static void handle_get_parameters(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                  grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                  size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_GetParametersRequest req = ps_GetParametersRequest_init_zero;
    ps_GetParametersResponse resp = ps_GetParametersResponse_init_zero;
    float *buf = NULL;
    ps_wire_named *items = NULL;
    int *sel = NULL;
    if (ps_wire_decode(request, ps_GetParametersRequest_fields, &req, &err)) goto fail;
    int np = ps_model_num_params(s->model);
    if (req.stage[0] && ps_model_find_stage(s->model, req.stage) < 0) {
        char names[256];
        size_t o = 0;
        names[0] = 0;
        for (int i = 0; i < ps_model_num_stages(s->model) && o < sizeof names; i++)
            o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", i ? ", " : "", ps_model_stage(s->model, i)->name);
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "GetParametersRequest.stage: model '%s' has no stage '%s' "
                   "(stages: %s)", ps_model_arch(s->model), req.stage, names);
        goto fail;
    }
    sel = malloc(sizeof *sel * (size_t)(np + 1));
    items = calloc((size_t)np + 1, sizeof *items);
    if (!sel || !items) { ps_err_set(&err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); goto fail; }
    int nsel = 0;
    for (int i = 0; i < np; i++)
        if (!req.stage[0] || !strcmp(ps_model_param(s->model, i)->stage, req.stage)) sel[nsel++] = i;
    if (req.first > (uint32_t)nsel || (req.first == (uint32_t)nsel && req.first_row) ||
        (req.first < (uint32_t)nsel && (req.first_row < 0 ||
                                        req.first_row >= ps_model_param(s->model, sel[req.first])->dims[0]))) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "GetParametersRequest: first %u, first_row %lld is outside the "
                   "selection (%d parameters)", (unsigned)req.first, (long long)req.first_row, nsel);
        goto fail;
    }
    /* room for tensor data in one reply: the message limit less headers */
    uint64_t limit = s->max_tensor_bytes > (1u << 17) ? s->max_tensor_bytes - (1u << 16) : s->max_tensor_bytes / 2;
    uint64_t budget = req.max_bytes && req.max_bytes < limit ? req.max_bytes : limit;
    /* plan the page: [first, k) whole or cut, then copy just those */
    int k = (int)req.first;
    int64_t row = req.first_row;
    size_t n = 0;
    int64_t floats = 0;
    while (k < nsel && n < (sizeof resp.first_rows / sizeof resp.first_rows[0])) {
        const ps_param_info *pi = ps_model_param(s->model, sel[k]);
        int64_t rows = pi->dims[0], per = pi->numel / rows, row_bytes = per * (int64_t)sizeof(float);
        int64_t fit = (int64_t)(budget / (uint64_t)row_bytes);
        if (fit <= 0) {
            if (n == 0) {
                ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "GetParametersRequest.max_bytes %llu: less than one row "
                           "of %s (%lld bytes)", (unsigned long long)budget, pi->name, (long long)row_bytes);
                goto fail;
            }
            break;
        }
        int64_t take = rows - row < fit ? rows - row : fit;
        items[n].name = pi->name;
        items[n].ndim = pi->ndim;
        memcpy(items[n].dims, pi->dims, sizeof pi->dims);
        items[n].dims[0] = take;
        resp.first_rows[n] = row;
        n++;
        floats += pi->numel; /* the whole parameter is copied, then cut */
        budget -= (uint64_t)(take * row_bytes);
        row += take;
        if (row < rows) break;
        k++;
        row = 0;
    }
    resp.first_rows_count = (pb_size_t)n;
    resp.more = k < nsel;
    resp.next = (uint32_t)k;
    resp.next_row = row;
    buf = malloc((size_t)floats * sizeof(float) + 1);
    if (!buf) { ps_err_set(&err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); goto fail; }
    resp.model_version = ps_model_version(s->model);
    float *p = buf;
    for (size_t j = 0; j < n; j++) {
        int i = sel[(int)req.first + (int)j];
        const ps_param_info *pi = ps_model_param(s->model, i);
        if (ps_model_get_param(s->model, i, p, &err)) goto fail;
        items[j].data = p + resp.first_rows[j] * (pi->numel / pi->dims[0]);
        p += pi->numel;
    }
    ps_wire_named_list list = {items, n};
    ps_wire_tensors_encode_bind(&resp.parameters, &list);
    reply(ps_GetParametersResponse_fields, &resp, response, code, details, dlen);
    goto done;
fail:
    fail(code, details, dlen, &err);
done:
    free(sel);
    free(items);
    free(buf);
}

static void handle_status(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                          grpc_byte_buffer **response, grpc_status_code *code, char *details, size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_StatusRequest req = ps_StatusRequest_init_zero;
    if (ps_wire_decode(request, ps_StatusRequest_fields, &req, &err)) {
        fail(code, details, dlen, &err);
        return;
    }
    ps_StatusResponse resp = ps_StatusResponse_init_zero;
    ps_ctx_stats st;
    uint64_t samples;
    ps_service_stats(s, &st, &samples);
    snprintf(resp.version, sizeof resp.version, "%s", PS_VERSION);
    snprintf(resp.model, sizeof resp.model, "%s", ps_model_arch(s->model));
    resp.uptime_s = mono_now() - s->start;
    resp.model_version = ps_model_version(s->model);
    resp.live_contexts = st.live;
    resp.expired_contexts = st.expired;
    resp.trainers_seen = st.trainers_seen;
    resp.samples = samples;
    snprintf(resp.consistency, sizeof resp.consistency, "%s", s->consistency);
    ps_ckpt_info ck;
    resp.checkpoint_age_s = -1;
    if (ps_service_checkpoint(s, &ck)) {
        resp.last_checkpoint_step = ck.version;
        resp.checkpoint_age_s = wall_now() - ck.time;
        snprintf(resp.last_checkpoint, sizeof resp.last_checkpoint, "%.*s",
                 (int)sizeof resp.last_checkpoint - 1, ck.path);
    }
    resp.draining = ps_service_draining(s) != 0;
    snprintf(resp.nonfinite_policy, sizeof resp.nonfinite_policy, "%s", s->nonfinite_skip ? "skip" : "reject");
    ps_service_nonfinite_counts(s, &resp.nonfinite_rejected, &resp.nonfinite_skipped);
    snprintf(resp.optimizer, sizeof resp.optimizer, "%s", s->optimizer);
    if (s->cpu_isa) snprintf(resp.cpu_isa, sizeof resp.cpu_isa, "%s", s->cpu_isa());
    ps_cons_stats cs;
    ps_cons_stats_get(s->cons, &cs);
    if (ps_cons_mode_of(s->cons) == PS_CONS_SYNC) {
        resp.sync_round = cs.round;
        resp.sync_members = cs.members;
    }
    resp.sync_dropped = cs.dropped;
    resp.ssp_deferred = cs.ssp_deferred;
    resp.context_bytes = st.bytes;
    resp.max_context_bytes = s->max_context_bytes;
    resp.contexts_evicted = st.evicted;
    resp.contexts_refused = st.refused;
    resp.context_clients = (uint32_t)st.owners;
    ps_rpc_admission ad;
    ps_service_admission(s, &ad);
    resp.calls_refused = ad.refused_busy + ad.refused_client + ad.refused_auth;
    resp.calls_stalled = ad.recv_timeouts + ad.send_timeouts;
    resp.connections_closed = ad.conns_cut;
    resp.admission_saturated_s = ad.saturated_s;
    ps_round_report rep;
    ps_rmetrics_latest(s->rm, &rep);
    put_round_scalars(&rep, resp.round_scalars, &resp.round_scalars_count,
                      (pb_size_t)(sizeof resp.round_scalars / sizeof resp.round_scalars[0]));
    resp.metrics_round = rep.round;
    resp.solved = rep.solved;
    snprintf(resp.stop_metric, sizeof resp.stop_metric, "%s", s->stop_metric);
    resp.stop_threshold = s->stop_threshold;
    snprintf(resp.cluster, sizeof resp.cluster, "%s", s->cluster);
    snprintf(resp.server_name, sizeof resp.server_name, "%s", s->server_name);
    ps_service_hosted(s, resp.hosted, sizeof resp.hosted);
    ps_service_partial_counts(s, &resp.partial_steps, &resp.partial_steps_lost);
    reply(ps_StatusResponse_fields, &resp, response, code, details, dlen);
}

void ps_service_set_trainers(ps_service *s, ps_trainers *t) { s->trainers = t; }

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

/* One list of ReportPartialRequest (applied_on / lost_on): 1..8 names of
 * 1..31 characters, letters, digits, '_' or '-' (servers.<name>). Sets
 * *here when this psd's name is among them. */
static ps_status partial_names(const char *field, char names[][32], pb_size_t count, const char *self, int *here,
                               ps_err *err) {
    *here = 0;
    for (pb_size_t i = 0; i < count; i++) {
        size_t len = strlen(names[i]);
        if (len < 1 || len > 31)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ReportPartialRequest.%s[%u]: a server name has 1..31 "
                              "characters (got %zu)", field, (unsigned)i, len);
        for (size_t k = 0; k < len; k++) {
            char c = names[i][k];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                  c == '-'))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ReportPartialRequest.%s[%u]: '%s' is not a "
                                  "server name (letters, digits, '_' or '-')", field, (unsigned)i, names[i]);
        }
        if (self[0] && !strcmp(names[i], self)) *here = 1;
    }
    return PS_OK;
}

/* ReportPartial: a trainer tells every server it reaches that a batch's
 * Step was applied on some servers and lost on others (service.h). The
 * batch is not re-run; this psd counts it on its side and logs it. A
 * report naming this psd in neither list counts nothing (it says so in
 * the log). */
static void handle_report_partial(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                  grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                  size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    ps_ReportPartialRequest req = ps_ReportPartialRequest_init_zero;
    int applied = 0, lost = 0;
    if (ps_wire_decode(request, ps_ReportPartialRequest_fields, &req, &err)) goto fail;
    if (req.context_id == 0) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "ReportPartialRequest.context_id: must be non-zero");
        goto fail;
    }
    if (!req.applied_on_count || !req.lost_on_count) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "ReportPartialRequest: a partial step names at least one server "
                   "in applied_on and one in lost_on (got %u and %u)", (unsigned)req.applied_on_count,
                   (unsigned)req.lost_on_count);
        goto fail;
    }
    if (partial_names("applied_on", req.applied_on, req.applied_on_count, s->server_name, &applied, &err) ||
        partial_names("lost_on", req.lost_on, req.lost_on_count, s->server_name, &lost, &err))
        goto fail;
    if (applied && lost) {
        ps_err_set(&err, PS_ERR_INVALID_ARGUMENT, "ReportPartialRequest: server '%s' is in both applied_on and "
                   "lost_on", s->server_name);
        goto fail;
    }
    char a[8 * 34] = "", l[8 * 34] = "";
    for (pb_size_t i = 0; i < req.applied_on_count; i++)
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%s", i ? "," : "", req.applied_on[i]);
    for (pb_size_t i = 0; i < req.lost_on_count; i++)
        snprintf(l + strlen(l), sizeof l - strlen(l), "%s%s", i ? "," : "", req.lost_on[i]);
    if (applied) __atomic_add_fetch(&s->partial_applied, 1, __ATOMIC_RELAXED);
    if (lost) __atomic_add_fetch(&s->partial_lost, 1, __ATOMIC_RELAXED);
    if (applied || lost) ps_trainers_partial(s->trainers, req.trainer_rank, applied);
    ps_log(PS_LOG_WARN, "partial step: context %llx of trainer %u applied on %s, lost on %s%s",
           (unsigned long long)req.context_id, (unsigned)req.trainer_rank, a, l,
           applied ? " (applied here)" : lost ? " (lost here)"
                                             : " (this server is in neither list: not counted here)");
    ps_ReportPartialResponse resp = ps_ReportPartialResponse_init_zero;
    resp.partial_steps = __atomic_load_n(&s->partial_applied, __ATOMIC_RELAXED);
    reply(ps_ReportPartialResponse_fields, &resp, response, code, details, dlen);
    return;
fail:
    fail(code, details, dlen, &err);
}

/* grpc.health.v1.Health/Check */
static void handle_health_check(void *user, const ps_rpc_call_info *info, const grpc_byte_buffer *request,
                                grpc_byte_buffer **response, grpc_status_code *code, char *details,
                                size_t dlen) {
    (void)info;
    ps_service *s = user;
    ps_err err = {0};
    grpc_health_v1_HealthCheckRequest req = grpc_health_v1_HealthCheckRequest_init_zero;
    if (ps_wire_decode(request, grpc_health_v1_HealthCheckRequest_fields, &req, &err)) {
        fail(code, details, dlen, &err);
        return;
    }
    if (req.service[0] && strcmp(req.service, "ps.ParameterServer")) {
        ps_err_set(&err, PS_ERR_NOT_FOUND, "HealthCheckRequest.service: unknown service '%s' (psd serves "
                   "\"\" and \"ps.ParameterServer\")", req.service);
        fail(code, details, dlen, &err);
        return;
    }
    grpc_health_v1_HealthCheckResponse resp = grpc_health_v1_HealthCheckResponse_init_zero;
    resp.status = !ps_service_serving(s, NULL, 0) ? grpc_health_v1_HealthCheckResponse_ServingStatus_NOT_SERVING
                                                  : grpc_health_v1_HealthCheckResponse_ServingStatus_SERVING;
    reply(grpc_health_v1_HealthCheckResponse_fields, &resp, response, code, details, dlen);
}

/* Handlers by method id; paths and descriptors come from common/methods.c. */
static const ps_rpc_handler handlers[PS_M_COUNT] = {
    [PS_M_FORWARD] = handle_forward,
    [PS_M_BACKWARD] = handle_backward,
    [PS_M_GET_GRADIENTS] = handle_get_gradients,
    [PS_M_STEP] = handle_step,
    [PS_M_LIST_PARAMETERS] = handle_list_parameters,
    [PS_M_GET_PARAMETERS] = handle_get_parameters,
    [PS_M_STATUS] = handle_status,
    [PS_M_PUSH_GRADIENTS] = handle_push_gradients,
    [PS_M_REPORT_PARTIAL] = handle_report_partial,
    [PS_M_HEALTH_CHECK] = handle_health_check,
};

static ps_rpc_method methods[PS_M_COUNT];
static pthread_once_t methods_once = PTHREAD_ONCE_INIT;

static void methods_fill(void) {
    for (int i = 0; i < PS_M_COUNT; i++) {
        methods[i].path = ps_method((ps_method_id)i)->path;
        methods[i].fn = handlers[i];
        methods[i].reserved = ps_method((ps_method_id)i)->reserved;
    }
}

const ps_rpc_method *ps_service_methods(int *n) {
    pthread_once(&methods_once, methods_fill);
    *n = PS_M_COUNT;
    return methods;
}

void ps_service_round_metrics(ps_service *s, struct ps_round_report *out, const char **stop_metric,
                              double *stop_threshold) {
    ps_rmetrics_latest(s->rm, out);
    if (stop_metric) *stop_metric = s->stop_metric;
    if (stop_threshold) *stop_threshold = s->stop_threshold;
}
