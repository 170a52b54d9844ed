/* svc_reads.c - the handlers that read: GetGradients (a context's
 * accumulated gradients) and GetParameters (the weights), both paged by
 * one pager (svc_page), ListParameters (names, shapes, stages), Status,
 * the health check, and ReportPartial (a trainer's report of a step
 * applied on some servers only: counted and logged, nothing else
 * changes). */
#include "service_impl.h"
#include "trainers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "report_limit.h"

/* The model's parameters as a list for the wire, in call->out: names,
 * shapes, stages and devices (ListParameters; no data). */
static ps_status named_params(ps_svc_call *call, ps_err *err) {
    ps_service *s = call->svc;
    int np = ps_model_num_params(s->model);
    ps_wire_named *items = ps_svc_keep(call, calloc((size_t)np + 1, sizeof *items));
    if (!items) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < np; i++) {
        const ps_param_info *pi = ps_model_param(s->model, i);
        ps_wire_named *it = &items[i];
        it->name = pi->name;
        it->ndim = pi->ndim;
        memcpy(it->dims, pi->dims, sizeof pi->dims);
        it->device = pi->device;
        it->stage = pi->stage;
        it->sparse = pi->sparse;
        it->row_offset = pi->row_offset;
        it->rows_total = pi->rows_total;
    }
    call->out = (ps_wire_named_list){items, (size_t)np};
    return PS_OK;
}

/* named_params' list with the model's buffers (BatchNorm's running
 * statistics) after the parameters, as buffers (ListParameters). */
static ps_status named_params_and_buffers(ps_svc_call *call, ps_err *err) {
    ps_service *s = call->svc;
    if (named_params(call, err)) return err->code;
    int np = ps_model_num_params(s->model), nb = ps_model_num_buffers(s->model);
    ps_wire_named *items = ps_svc_keep(call, calloc((size_t)(np + nb) + 1, sizeof *items));
    if (!items) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(items, call->out.items, (size_t)np * sizeof *items);
    for (int b = 0; b < nb; b++) {
        const ps_buffer_info *bi = ps_model_buffer(s->model, b);
        items[np + b] = (ps_wire_named){.name = bi->name, .ndim = bi->ndim, .device = bi->device, .stage = bi->stage,
                                        .dtype = (int)bi->dtype, .buffer = 1};
        memcpy(items[np + b].dims, bi->dims, sizeof bi->dims);
    }
    call->out = (ps_wire_named_list){items, (size_t)(np + nb)};
    return PS_OK;
}

/* Entry e of GetParameters' selection: parameter e, or buffer e - np. */
typedef struct sel_entry {
    const char *name;
    int ndim;
    int64_t dims[4];
    int64_t numel, rows;     /* rows: dims[0], 1 for a scalar */
    int dtype;
    int64_t esz;
} sel_entry;

static sel_entry sel_entry_of(ps_service *s, int e) {
    int np = ps_model_num_params(s->model);
    sel_entry o = {0};
    if (e < np) {
        const ps_param_info *pi = ps_model_param(s->model, e);
        o = (sel_entry){pi->name, pi->ndim, {0}, pi->numel, pi->ndim ? pi->dims[0] : 1, 0, sizeof(float)};
        memcpy(o.dims, pi->dims, sizeof o.dims);
    } else {
        const ps_buffer_info *bi = ps_model_buffer(s->model, e - np);
        o = (sel_entry){bi->name, bi->ndim, {0}, bi->numel, bi->ndim ? bi->dims[0] : 1, (int)bi->dtype,
                        (int64_t)ps_dtype_size(bi->dtype)};
        memcpy(o.dims, bi->dims, sizeof o.dims);
    }
    return o;
}

/* A paged read: the selection sel[0..n) of model entries (parameters, then
 * buffers as np + b) and where their data comes from - the weights, or the
 * accumulated gradients grads (parameters only). */
typedef struct page_src {
    const char *req;          /* "GetParametersRequest", for errors */
    const int *sel;
    int n;
    const ps_grads *grads;
} page_src;

/* The request's paging fields, and the reply's. */
typedef struct page_req {
    uint32_t first;
    int64_t first_row;
    uint64_t max_bytes;
} page_req;
typedef struct page_out {
    int64_t *first_rows;      /* the reply's array, room for cap */
    size_t cap, n;
    bool more;
    uint32_t next;
    int64_t next_row;
} page_out;

/* Rows [row0, row0 + nrows) of selection entry e into dst. */
static ps_status page_copy(ps_service *s, const page_src *src, int e, int64_t row0, int64_t nrows, void *dst,
                           ps_err *err) {
    int np = ps_model_num_params(s->model);
    if (src->grads) return ps_grads_get_rows(s->model, src->grads, e, row0, nrows, dst, err);
    return e < np ? ps_model_get_param_rows(s->model, e, row0, nrows, dst, err)
                  : ps_model_get_buffer_rows(s->model, e - np, row0, nrows, dst, err);
}

/* One page of src from req->first / first_row, in call->out (bind it to the
 * reply's tensors) and *o: the whole entries that fit req->max_bytes (0 or
 * more than the message limit: the limit less room for headers), the next
 * one cut between rows of its first dimension, at most o->cap tensors.
 * Only the rows sent are copied, so a page allocates at most the limit
 * whatever the request. A first / first_row outside the selection, or a
 * max_bytes that holds no row of the first entry, is INVALID_ARGUMENT naming
 * the field; a row larger than the limit itself RESOURCE_EXHAUSTED. Shared
 * by GetParameters and GetGradients. */
static ps_status svc_page(ps_svc_call *call, const page_src *src, const page_req *req, page_out *o, ps_err *err) {
    ps_service *s = call->svc;
    int nsel = src->n;
    if (req->first > (uint32_t)nsel)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s.first %u: past the %d tensors of the selection",
                          src->req, (unsigned)req->first, nsel);
    int in = req->first < (uint32_t)nsel;
    sel_entry e0 = in ? sel_entry_of(s, src->sel[req->first]) : (sel_entry){.name = "", .rows = 0};
    if (req->first_row < 0 || (req->first_row && req->first_row >= e0.rows))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s.first_row %lld: outside %s%s (%lld rows)", src->req,
                          (long long)req->first_row, in ? "tensor " : "the end of the selection", e0.name,
                          (long long)e0.rows);
    /* room for tensor data in one reply: the message limit less headers */
    uint64_t limit = s->max_tensor_bytes > (1u << 17) ? s->max_tensor_bytes - (1u << 16) : s->max_tensor_bytes / 2;
    uint64_t budget = req->max_bytes && req->max_bytes < limit ? req->max_bytes : limit;
    ps_wire_named *items = ps_svc_keep(call, calloc(o->cap + 1, sizeof *items));
    int64_t *takes = ps_svc_keep(call, calloc(o->cap + 1, sizeof *takes));
    if (!items || !takes) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    /* plan the page: [first, k) whole or cut, then copy just those rows */
    int k = (int)req->first;
    int64_t row = req->first_row;
    size_t n = 0;
    uint64_t total = 0;   /* bytes */
    while (k < nsel && n < o->cap) {
        sel_entry pi = sel_entry_of(s, src->sel[k]);
        int64_t rows = pi.rows, row_bytes = rows ? pi.numel / rows * pi.esz : 0;
        int64_t fit = row_bytes ? (int64_t)(budget / (uint64_t)row_bytes) : INT64_MAX;  /* empty rows: all */
        if (fit <= 0) {
            if (n == 0 && req->max_bytes && req->max_bytes < limit)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s.max_bytes %llu: less than one row of %s (%lld "
                                  "bytes)", src->req, (unsigned long long)budget, pi.name, (long long)row_bytes);
            if (n == 0)
                return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: one row of %s (%lld bytes) is more than a "
                                  "message holds (%llu bytes of tensor data; server.max_message_mb)", src->req,
                                  pi.name, (long long)row_bytes, (unsigned long long)limit);
            break;
        }
        int64_t take = rows - row < fit ? rows - row : fit;
        items[n].name = pi.name;
        items[n].ndim = pi.ndim;
        items[n].dtype = pi.dtype;
        memcpy(items[n].dims, pi.dims, sizeof pi.dims);
        if (pi.ndim) items[n].dims[0] = take;
        o->first_rows[n] = row;
        takes[n] = take;
        n++;
        total += (uint64_t)(take * row_bytes);
        budget -= (uint64_t)(take * row_bytes);
        row += take;
        if (row < rows) break;
        k++;
        row = 0;
    }
    o->n = n;
    o->more = k < nsel;
    o->next = (uint32_t)k;
    o->next_row = row;
    char *buf = ps_svc_keep(call, malloc((size_t)total + 1));
    if (!buf) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    char *p = buf;
    for (size_t j = 0; j < n; j++) {
        int e = src->sel[(int)req->first + (int)j];
        sel_entry pi = sel_entry_of(s, e);
        if (page_copy(s, src, e, o->first_rows[j], takes[j], p, err)) return err->code;
        items[j].data = p;
        p += pi.rows ? takes[j] * (pi.numel / pi.rows) * pi.esz : 0;
    }
    call->out = (ps_wire_named_list){items, n};
    return PS_OK;
}

/* GetGradients: the context's accumulated gradients, one tensor per
 * parameter (a row-sparse one dense, zero where no row was touched), paged
 * as GetParameters. The pages of one context are consistent as long as no
 * Backward adds to it between them; a context that expired or was stepped
 * between pages is NOT_FOUND naming the page. */
ps_status ps_svc_GetGradients(ps_svc_call *call, const ps_GetGradientsRequest *req, ps_GetGradientsResponse *resp,
                              ps_err *err) {
    ps_service *s = call->svc;
    ps_ctx *c = svc_acquire_own(call, req->context_id, NULL, NULL, err);
    if (!c) {
        if (req->first || req->first_row)
            ps_err_prefix(err, "GetGradients page from parameter %u row %lld (the earlier pages are stale)",
                          (unsigned)req->first, (long long)req->first_row);
        return err->code;
    }
    ps_status st = PS_OK;
    int np = ps_model_num_params(s->model);
    int *sel = ps_svc_keep(call, malloc(sizeof *sel * (size_t)(np + 1)));
    if (!c->grads)
        st = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu has no gradients yet (call Backward first)",
                        (unsigned long long)req->context_id);
    else if (!sel)
        st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    if (!st) {
        for (int i = 0; i < np; i++) sel[i] = i;
        page_src src = {"GetGradientsRequest", sel, np, c->grads};
        page_req pr = {req->first, req->first_row, req->max_bytes};
        page_out o = {.first_rows = resp->first_rows, .cap = sizeof resp->first_rows / sizeof resp->first_rows[0]};
        if (!(st = svc_page(call, &src, &pr, &o, err))) {
            ps_wire_tensors_encode_bind(&resp->gradients, &call->out);
            resp->first_rows_count = (pb_size_t)o.n;
            resp->more = o.more;
            resp->next = o.next;
            resp->next_row = o.next_row;
        }
    }
    ps_ctx_table_release(s->ctx, c);
    return st;
}

ps_status ps_svc_ListParameters(ps_svc_call *call, const ps_ListParametersRequest *req,
                                ps_ListParametersResponse *resp, ps_err *err) {
    (void)req;
    ps_service *s = call->svc;
    if (named_params_and_buffers(call, err)) return err->code;
    ps_wire_params_encode_bind(&resp->parameters, &call->out);
    int ns = ps_model_num_stages(s->model);
    for (int i = 0; i < ns && i < (int)(sizeof resp->stages / sizeof resp->stages[0]); i++) {
        const ps_stage_info *si = ps_model_stage(s->model, i);
        ps_StageInfo *o = &resp->stages[resp->stages_count++];
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
    snprintf(resp->model, sizeof resp->model, "%s", ps_model_arch(s->model));
    snprintf(resp->cluster, sizeof resp->cluster, "%s", s->cluster);
    snprintf(resp->server_name, sizeof resp->server_name, "%s", s->server_name);
    return PS_OK;
}

/* GetParameters: the weights of every parameter (then the buffers), or of one stage's, paged
 * by max_bytes (or the message limit): a parameter that does not fit is cut
 * between rows. Each tensor is copied under the weights lock; a page's
 * model_version is read before its copies, and the pages of one selection
 * may span steps (training goes on between them). */
ps_status ps_svc_GetParameters(ps_svc_call *call, const ps_GetParametersRequest *req,
                               ps_GetParametersResponse *resp, ps_err *err) {
    ps_service *s = call->svc;
    int np = ps_model_num_params(s->model);
    if (req->stage[0] && ps_model_find_stage(s->model, req->stage) < 0) {
        char names[256];
        svc_stage_names(s, names, sizeof names);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "GetParametersRequest.stage: model '%s' has no stage '%s' "
                          "(stages: %s)", ps_model_arch(s->model), req->stage, names);
    }
    /* the selection: parameters, then buffers (entry np + b) */
    int nb = ps_model_num_buffers(s->model);
    int *sel = ps_svc_keep(call, malloc(sizeof *sel * (size_t)(np + nb + 1)));
    if (!sel) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    int nsel = 0;
    for (int i = 0; i < np; i++)
        if (!req->stage[0] || !strcmp(ps_model_param(s->model, i)->stage, req->stage)) sel[nsel++] = i;
    for (int b = 0; b < nb; b++)
        if (!req->stage[0] || !strcmp(ps_model_buffer(s->model, b)->stage, req->stage)) sel[nsel++] = np + b;
    page_src src = {"GetParametersRequest", sel, nsel, NULL};
    page_req pr = {req->first, req->first_row, req->max_bytes};
    page_out o = {.first_rows = resp->first_rows, .cap = sizeof resp->first_rows / sizeof resp->first_rows[0]};
    resp->model_version = ps_model_version(s->model);
    if (svc_page(call, &src, &pr, &o, err)) return err->code;
    ps_wire_tensors_encode_bind(&resp->parameters, &call->out);
    resp->first_rows_count = (pb_size_t)o.n;
    resp->more = o.more;
    resp->next = o.next;
    resp->next_row = o.next_row;
    return PS_OK;
}

ps_status ps_svc_Status(ps_svc_call *call, const ps_StatusRequest *req, ps_StatusResponse *resp, ps_err *err) {
    (void)req, (void)err;
    ps_service *s = call->svc;
    ps_ctx_stats st;
    uint64_t samples;
    ps_service_stats(s, &st, &samples);
    snprintf(resp->version, sizeof resp->version, "%s", PS_VERSION);
    snprintf(resp->model, sizeof resp->model, "%s", ps_model_arch(s->model));
    resp->uptime_s = ps_mono_s() - s->start;
    resp->model_version = ps_model_version(s->model);
    resp->live_contexts = st.live;
    resp->expired_contexts = st.expired;
    resp->trainers_seen = st.trainers_seen;
    resp->samples = samples;
    snprintf(resp->consistency, sizeof resp->consistency, "%s", s->consistency);
    ps_ckpt_info ck;
    resp->checkpoint_age_s = -1;
    if (ps_service_checkpoint(s, &ck)) {
        resp->last_checkpoint_step = ck.version;
        resp->checkpoint_age_s = ps_wall_s() - ck.time;
        snprintf(resp->last_checkpoint, sizeof resp->last_checkpoint, "%.*s",
                 (int)sizeof resp->last_checkpoint - 1, ck.path);
    }
    resp->draining = ps_service_draining(s) != 0;
    snprintf(resp->nonfinite_policy, sizeof resp->nonfinite_policy, "%s", s->nonfinite_skip ? "skip" : "reject");
    ps_service_nonfinite_counts(s, &resp->nonfinite_rejected, &resp->nonfinite_skipped);
    snprintf(resp->optimizer, sizeof resp->optimizer, "%s", s->optimizer);
    if (s->cpu_isa) snprintf(resp->cpu_isa, sizeof resp->cpu_isa, "%s", s->cpu_isa());
    ps_cons_stats cs;
    ps_cons_stats_get(s->cons, &cs);
    if (ps_cons_mode_of(s->cons) == PS_CONS_SYNC) {
        resp->sync_round = cs.round;
        resp->sync_members = cs.members;
    }
    resp->sync_dropped = cs.dropped;
    resp->ssp_deferred = cs.ssp_deferred;
    resp->contexts_applied = st.applied;
    resp->sync_queued = cs.queued;
    resp->context_bytes = st.bytes;
    resp->max_context_bytes = s->max_context_bytes;
    resp->contexts_evicted = st.evicted;
    resp->contexts_released = st.released;
    resp->contexts_refused = st.refused;
    resp->context_clients = (uint32_t)st.owners;
    ps_rpc_admission ad;
    ps_service_admission(s, &ad);
    resp->calls_refused = ad.refused_busy + ad.refused_client + ad.refused_auth;
    resp->calls_stalled = ad.recv_timeouts + ad.send_timeouts;
    resp->connections_closed = ad.conns_cut;
    resp->admission_saturated_s = ad.saturated_s;
    ps_round_report rep;
    ps_rmetrics_latest(s->rm, &rep);
    svc_put_round_scalars(&rep, resp->round_scalars, &resp->round_scalars_count,
                      (pb_size_t)(sizeof resp->round_scalars / sizeof resp->round_scalars[0]));
    resp->metrics_round = rep.round;
    resp->solved = rep.solved;
    snprintf(resp->stop_metric, sizeof resp->stop_metric, "%s", s->stop_metric);
    resp->stop_threshold = s->stop_threshold;
    snprintf(resp->cluster, sizeof resp->cluster, "%s", s->cluster);
    snprintf(resp->server_name, sizeof resp->server_name, "%s", s->server_name);
    ps_service_hosted(s, resp->hosted, sizeof resp->hosted);
    ps_service_partial_counts(s, &resp->partial_steps, &resp->partial_steps_lost);
    return PS_OK;
}

/* One list of ReportPartialRequest (applied_on / lost_on): 1..8 names of
 * 1..31 characters, letters, digits, '_' or '-' (servers.<name>). Sets
 * *here when this psd's name is among them. */
static ps_status partial_names(const char *field, const char names[][32], pb_size_t count, const char *self, int *here,
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
 * the log). What a client can make psd count and log is bounded
 * (report_limit.h): a report contradicting this psd's own records (applied
 * here, but psd has no record of applying it; lost here, but psd applied
 * it) is refused, a repeat counts once, each client has a rate, and its
 * log lines are one a second. */
ps_status ps_svc_ReportPartial(ps_svc_call *call, const ps_ReportPartialRequest *req,
                               ps_ReportPartialResponse *resp, ps_err *err) {
    ps_service *s = call->svc;
    int applied = 0, lost = 0;
    if (req->context_id == 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ReportPartialRequest.context_id: must be non-zero");
    if (!req->applied_on_count || !req->lost_on_count)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ReportPartialRequest: a partial step names at least one "
                          "server in applied_on and one in lost_on (got %u and %u)", (unsigned)req->applied_on_count,
                          (unsigned)req->lost_on_count);
    if (partial_names("applied_on", req->applied_on, req->applied_on_count, s->server_name, &applied, err) ||
        partial_names("lost_on", req->lost_on, req->lost_on_count, s->server_name, &lost, err))
        return err->code;
    if (applied && lost)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ReportPartialRequest: server '%s' is in both applied_on and "
                          "lost_on", s->server_name);
    int mine = ps_ctx_table_applied(s->ctx, req->context_id);
    if ((applied && !mine) || (lost && mine))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "ReportPartialRequest: context %llx is reported %s here, "
                          "but this server %s it; not counted", (unsigned long long)req->context_id,
                          applied ? "applied" : "lost", mine ? "applied" : "has no record of applying");
    int log = 0;
    uint64_t held = 0;
    ps_status st = ps_report_limit_admit(s->reports, call->owner, req->context_id, ps_mono_s(), &log, &held, err);
    if (st == PS_ERR_ALREADY_EXISTS) {  /* a retried report: answered, counted once */
        ps_err_clear(err);
        resp->partial_steps = __atomic_load_n(&s->partial_applied, __ATOMIC_RELAXED);
        return PS_OK;
    }
    if (st) return st;
    char a[8 * 34] = "", l[8 * 34] = "";
    for (pb_size_t i = 0; i < req->applied_on_count; i++)
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%s", i ? "," : "", req->applied_on[i]);
    for (pb_size_t i = 0; i < req->lost_on_count; i++)
        snprintf(l + strlen(l), sizeof l - strlen(l), "%s%s", i ? "," : "", req->lost_on[i]);
    if (applied) __atomic_add_fetch(&s->partial_applied, 1, __ATOMIC_RELAXED);
    if (lost) __atomic_add_fetch(&s->partial_lost, 1, __ATOMIC_RELAXED);
    if (applied || lost) ps_trainers_partial(s->trainers, req->trainer_rank, applied);
    if (log)
        ps_log(PS_LOG_WARN, "partial step: context %llx of trainer %u (client %s) applied on %s, lost on %s%s "
               "(%llu more reports of this client counted since its last line)", (unsigned long long)req->context_id,
               (unsigned)req->trainer_rank, call->owner, a, l,
               applied ? " (applied here)" : lost ? " (lost here)"
                                                 : " (this server is in neither list: not counted here)",
               (unsigned long long)held);
    resp->partial_steps = __atomic_load_n(&s->partial_applied, __ATOMIC_RELAXED);
    return PS_OK;
}

/* grpc.health.v1.Health/Check */
ps_status ps_svc_HealthCheck(ps_svc_call *call, const grpc_health_v1_HealthCheckRequest *req,
                             grpc_health_v1_HealthCheckResponse *resp, ps_err *err) {
    if (req->service[0] && strcmp(req->service, "ps.ParameterServer"))
        return ps_err_set(err, PS_ERR_NOT_FOUND, "HealthCheckRequest.service: unknown service '%s' (psd serves "
                          "\"\" and \"ps.ParameterServer\")", req->service);
    resp->status = !ps_service_serving(call->svc, NULL, 0)
                       ? grpc_health_v1_HealthCheckResponse_ServingStatus_NOT_SERVING
                       : grpc_health_v1_HealthCheckResponse_ServingStatus_SERVING;
    return PS_OK;
}
