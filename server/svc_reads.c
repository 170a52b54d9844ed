/* svc_reads.c - the handlers that read: GetGradients (a context's
 * accumulated gradients), ListParameters (names, shapes, stages),
 * GetParameters (the weights, paged), Status, the health check, and
 * ReportPartial (a trainer's report of a step applied on some servers only:
 * counted and logged, nothing else changes). */
#include "service_impl.h"
#include "trainers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"

/* The model's parameters as a list for the wire, in call->out: names,
 * shapes, stages and devices, and - with want_data - a host copy of each
 * parameter's weights, or of its accumulated gradient in grads when grads
 * is not NULL. */
static ps_status named_params(ps_svc_call *call, int want_data, const ps_grads *grads, ps_err *err) {
    ps_service *s = call->svc;
    int np = ps_model_num_params(s->model);
    ps_wire_named *items = ps_svc_keep(call, calloc(np, sizeof *items));
    float *buf = want_data ? ps_svc_keep(call, malloc((size_t)ps_model_num_weights(s->model) * sizeof(float))) : NULL;
    ps_status rc = PS_OK;
    if (!items || (want_data && !buf)) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    float *p = buf;
    for (int i = 0; i < np && rc == PS_OK; i++) {
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
        if (!want_data) continue;
        rc = grads ? ps_grads_get(s->model, grads, i, p, err) : ps_model_get_param(s->model, i, p, err);
        it->data = p;
        p += pi->numel;
    }
    if (rc == PS_OK) call->out = (ps_wire_named_list){items, (size_t)np};
    return rc;
}

/* named_params' list with the model's buffers (BatchNorm's running
 * statistics) after the parameters, as buffers (ListParameters). */
static ps_status named_params_and_buffers(ps_svc_call *call, ps_err *err) {
    ps_service *s = call->svc;
    if (named_params(call, 0, NULL, err)) return err->code;
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
        o = (sel_entry){pi->name, pi->ndim, {0}, pi->numel, pi->dims[0], 0, sizeof(float)};
        memcpy(o.dims, pi->dims, sizeof o.dims);
    } else {
        const ps_buffer_info *bi = ps_model_buffer(s->model, e - np);
        o = (sel_entry){bi->name, bi->ndim, {0}, bi->numel, bi->ndim ? bi->dims[0] : 1, (int)bi->dtype,
                        (int64_t)ps_dtype_size(bi->dtype)};
        memcpy(o.dims, bi->dims, sizeof o.dims);
    }
    return o;
}

ps_status ps_svc_GetGradients(ps_svc_call *call, const ps_GetGradientsRequest *req, ps_GetGradientsResponse *resp,
                              ps_err *err) {
    ps_service *s = call->svc;
    ps_ctx *c = svc_acquire_own(call, req->context_id, NULL, NULL, err);
    if (!c) return err->code;
    ps_status st = PS_OK;
    if (!c->grads)
        st = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu has no gradients yet (call Backward first)",
                        (unsigned long long)req->context_id);
    if (!st && !(st = named_params(call, 1, c->grads, err)))
        ps_wire_tensors_encode_bind(&resp->gradients, &call->out);
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
    ps_wire_named *items = ps_svc_keep(call, calloc((size_t)(np + nb) + 1, sizeof *items));
    if (!sel || !items) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    int nsel = 0;
    for (int i = 0; i < np; i++)
        if (!req->stage[0] || !strcmp(ps_model_param(s->model, i)->stage, req->stage)) sel[nsel++] = i;
    for (int b = 0; b < nb; b++)
        if (!req->stage[0] || !strcmp(ps_model_buffer(s->model, b)->stage, req->stage)) sel[nsel++] = np + b;
    if (req->first > (uint32_t)nsel || (req->first == (uint32_t)nsel && req->first_row) ||
        (req->first < (uint32_t)nsel && (req->first_row < 0 ||
                                        req->first_row >= sel_entry_of(s, sel[req->first]).rows))) {
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "GetParametersRequest: first %u, first_row %lld is outside "
                          "the selection (%d parameters)", (unsigned)req->first, (long long)req->first_row, nsel);
    }
    /* room for tensor data in one reply: the message limit less headers */
    uint64_t limit = s->max_tensor_bytes > (1u << 17) ? s->max_tensor_bytes - (1u << 16) : s->max_tensor_bytes / 2;
    uint64_t budget = req->max_bytes && req->max_bytes < limit ? req->max_bytes : limit;
    /* plan the page: [first, k) whole or cut, then copy just those */
    int k = (int)req->first;
    int64_t row = req->first_row;
    size_t n = 0;
    int64_t total = 0;   /* bytes */
    while (k < nsel && n < (sizeof resp->first_rows / sizeof resp->first_rows[0])) {
        sel_entry pi = sel_entry_of(s, sel[k]);
        int64_t rows = pi.rows, per = pi.numel / rows, row_bytes = per * pi.esz;
        int64_t fit = (int64_t)(budget / (uint64_t)row_bytes);
        if (fit <= 0) {
            if (n == 0)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "GetParametersRequest.max_bytes %llu: less than one "
                                  "row of %s (%lld bytes)", (unsigned long long)budget, pi.name, (long long)row_bytes);
            break;
        }
        int64_t take = rows - row < fit ? rows - row : fit;
        items[n].name = pi.name;
        items[n].ndim = pi.ndim;
        items[n].dtype = pi.dtype;
        memcpy(items[n].dims, pi.dims, sizeof pi.dims);
        if (pi.ndim) items[n].dims[0] = take;
        resp->first_rows[n] = row;
        n++;
        total += pi.numel * pi.esz; /* the whole parameter is copied, then cut */
        budget -= (uint64_t)(take * row_bytes);
        row += take;
        if (row < rows) break;
        k++;
        row = 0;
    }
    resp->first_rows_count = (pb_size_t)n;
    resp->more = k < nsel;
    resp->next = (uint32_t)k;
    resp->next_row = row;
    char *buf = ps_svc_keep(call, malloc((size_t)total + 1));
    if (!buf) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    resp->model_version = ps_model_version(s->model);
    char *p = buf;
    for (size_t j = 0; j < n; j++) {
        int i = sel[(int)req->first + (int)j];
        sel_entry pi = sel_entry_of(s, i);
        if (i < np ? ps_model_get_param(s->model, i, (float *)p, err) : ps_model_get_buffer(s->model, i - np, p, err))
            return err->code;
        items[j].data = p + resp->first_rows[j] * (pi.numel / pi.rows) * pi.esz;
        p += pi.numel * pi.esz;
    }
    call->out = (ps_wire_named_list){items, n};
    ps_wire_tensors_encode_bind(&resp->parameters, &call->out);
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
 * the log). */
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
    char a[8 * 34] = "", l[8 * 34] = "";
    for (pb_size_t i = 0; i < req->applied_on_count; i++)
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%s", i ? "," : "", req->applied_on[i]);
    for (pb_size_t i = 0; i < req->lost_on_count; i++)
        snprintf(l + strlen(l), sizeof l - strlen(l), "%s%s", i ? "," : "", req->lost_on[i]);
    if (applied) __atomic_add_fetch(&s->partial_applied, 1, __ATOMIC_RELAXED);
    if (lost) __atomic_add_fetch(&s->partial_lost, 1, __ATOMIC_RELAXED);
    if (applied || lost) ps_trainers_partial(s->trainers, req->trainer_rank, applied);
    ps_log(PS_LOG_WARN, "partial step: context %llx of trainer %u applied on %s, lost on %s%s",
           (unsigned long long)req->context_id, (unsigned)req->trainer_rank, a, l,
           applied ? " (applied here)" : lost ? " (lost here)"
                                             : " (this server is in neither list: not counted here)");
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
