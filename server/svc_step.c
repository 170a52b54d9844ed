/* svc_step.c - the handlers that change the weights: Backward (gradients
 * of recorded forwards into the context, optionally its step), Step (the
 * optimizer, once per context; a retry answers what the first one did),
 * PushGradients (a parameter-only stage's gradients from the trainer), and
 * the sync rounds that gather several contexts' steps into one. */
#include "service_impl.h"
#include "trainers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "dims.h"

/* ---- the step (shared by Step and Backward(step)) ----------------------- */

/* Finish a marked context without applying its step. */
static uint64_t skip_step(ps_service *s, ps_ctx *c) {
    uint64_t v = ps_model_version(s->model);
    ps_log(PS_LOG_WARN, "context %llx: step skipped: non-finite values (server.nonfinite_policy: skip)",
           (unsigned long long)c->id);
    ps_ctx_table_finish(s->ctx, c, v);  /* frees c */
    svc_count(&s->nonfinite_skipped);
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

/* A request's scalars as a checked set whose names the caller's client may
 * bring (round_metrics.h: reserved names, a share per client). */
static ps_status scalars_in(ps_svc_call *call, const ps_ScalarValue *v, pb_size_t n, ps_scalar_set *set,
                            ps_err *err) {
    set->n = 0;
    for (pb_size_t i = 0; i < n && i < PS_RM_MAX_SCALARS; i++) {
        snprintf(set->s[set->n].name, PS_RM_NAME_MAX, "%s", v[i].name);
        set->s[set->n++].value = v[i].value;
    }
    if (ps_scalar_set_check(set, err)) return err->code;
    return ps_rmetrics_admit(call->svc->rm, set, call->owner, err);
}

/* r into the call's response: a BackwardResponse (with the input
 * gradients in call->out) or a StepResponse. */
static void put_step_result(ps_svc_call *call, const step_result *r) {
    if (call->m->id == PS_M_FORWARD) {  /* a fused forward with step */
        ps_ForwardResponse *resp = call->resp;
        resp->step_version = r->version;
        resp->skipped = r->skipped;
        if (r->round) resp->round = r->round;
        return;
    }
    if (call->m->id == PS_M_BACKWARD) {
        ps_BackwardResponse *resp = call->resp;
        resp->model_version = r->version;
        resp->skipped = r->skipped;
        resp->round = r->round;
        resp->grad_sq_norm = r->sq_norm;
        if (call->out.n) ps_wire_tensors_encode_bind(&resp->input_grads, &call->out);
        return;
    }
    ps_StepResponse *resp = call->resp;
    resp->model_version = r->version;
    resp->skipped = r->skipped;
    resp->round = r->round;
    resp->round_contexts = r->members;
    ps_round_report latest;
    const ps_round_report *m = r->metrics;
    if (!m) {
        ps_rmetrics_latest(call->svc->rm, &latest);
        m = &latest;
    }
    svc_put_round_scalars(m, resp->round_scalars, &resp->round_scalars_count,
                          (pb_size_t)(sizeof resp->round_scalars / sizeof resp->round_scalars[0]));
    resp->metrics_round = m->round;
    resp->solved = m->solved;
}

/* A context waiting in a sync round; its call is deferred. */
typedef struct sync_wait {
    ps_svc_call *call;
    ps_ctx *ctx;
    ps_scalar_set scalars;          /* its contribution to the round's metrics */
    ps_round_report report;         /* the round's metrics (set by svc_sync_apply) */
    int finished, skipped;          /* set by svc_sync_apply: ctx finished (and freed) with the round */
    uint32_t rank;                  /* ... and what is left of it */
    uint64_t id;
} sync_wait;

static void sync_done(void *arg, ps_status st, const ps_err *err, uint64_t version, uint64_t round,
                      uint32_t members) {
    sync_wait *w = arg;
    ps_svc_call *call = w->call;
    ps_service *s = call->svc;
    if (st != PS_OK) {
        ps_ctx_table_release(s->ctx, w->ctx);  /* kept: a retry of the Step may rejoin */
        ps_err_set(&call->err, st, "%s", err ? err->msg : "");
    } else {
        int skipped = w->skipped;  /* svc_sync_apply finished the context with its round */
        if (skipped) svc_count(&s->nonfinite_skipped);
        ps_trainers_step(s->trainers, w->rank, w->id, &w->scalars);
        step_result r = {.version = version, .round = round, .members = members, .skipped = skipped,
                         .metrics = &w->report};
        put_step_result(call, &r);
    }
    ps_svc_finish(call, st);
    free(w);
}

ps_status svc_sync_apply(void *user, void *const *grads, void *const *args, int n, int average, uint64_t *version,
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
    if (average && used > 1 && ps_grads_scale(s->model, acc, 1.0f / (float)used, err)) return err->code;
    /* the update and the members' records under the apply lock (ctx_table.h) */
    ps_ctx_table_apply_begin(s->ctx);
    ps_status st = PS_OK;
    if (!acc) *version = ps_model_version(s->model);  /* every member skipped: the version stays */
    else st = ps_model_step_grads(s->model, acc, version, err);
    for (int i = 0; st == PS_OK && i < n; i++) {
        sync_wait *w = args[i];
        w->skipped = w->ctx->nonfinite;
        w->rank = w->ctx->rank;
        w->id = w->ctx->id;
        ps_ctx_table_finish(s->ctx, w->ctx, *version);  /* frees its gradients (acc too) */
        w->ctx = NULL;
        w->finished = 1;
    }
    ps_ctx_table_apply_end(s->ctx);
    return st;
}

/* Apply (or, under sync, queue) the step of context c, which the caller
 * holds and hands over: on return c was finished or released, and the
 * call's response is filled (PS_OK) or err says why not - or, under sync,
 * the call was deferred to its round (PS_OK; the caller then touches
 * neither the call nor err again). */
static ps_status step_context(ps_svc_call *call, ps_ctx *c, uint64_t round, float grad_scale,
                              const ps_scalar_set *scalars, ps_err *err) {
    ps_service *s = call->svc;
    uint32_t pending_seq = 0;
    size_t pending = ps_ctx_pending(c, &pending_seq);
    if (pending) {  /* c may be freed by its release (ReleaseContext meanwhile): nothing of it after */
        ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "context %llu: %zu recorded forward%s not backwarded yet (first: "
                   "seq %u); call Backward first, for every forward of the context", (unsigned long long)c->id,
                   pending, pending == 1 ? "" : "s", pending_seq);
        ps_ctx_table_release(s->ctx, c);
        return err->code;
    }
    if (c->nonfinite && !s->nonfinite_skip) {
        svc_count(&s->nonfinite_rejected);
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
    if (ps_cons_mode_of(s->cons) == PS_CONS_SYNC) {
        sync_wait *w = calloc(1, sizeof *w);
        if (!w || !ps_svc_defer(call, NULL, NULL)) {
            free(w);
            ps_ctx_table_release(s->ctx, c);
            return ps_err_set(err, w ? PS_ERR_UNAVAILABLE : PS_ERR_RESOURCE_EXHAUSTED,
                              w ? "sync step outside a server" : "out of memory");
        }
        *w = (sync_wait){call, c, *scalars, {0}};
        /* The round psd recorded at the context's first Forward (0: the open
         * one); the request's round is a claim and is ignored, so an id of a
         * closed round cannot make the context a straggler of it. */
        (void)round;
        round = c->round;
        ps_status st = ps_cons_sync_submit(s->cons, round, c->nonfinite ? NULL : c->grads, sync_done, w, err);
        if (st != PS_OK) {  /* not submitted: sync_done will not run */
            if (st == PS_ERR_ABORTED) ps_ctx_table_finish_as(s->ctx, c, ps_model_version(s->model), PS_CTX_DROPPED);
            else ps_ctx_table_release(s->ctx, c);
            ps_svc_finish(call, st);
            free(w);
        }
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
        ps_ctx_table_apply_begin(s->ctx);  /* the update and its record together (ctx_table.h) */
        if (ps_model_step_grads(s->model, c->grads, &r.version, err)) {
            ps_ctx_table_apply_end(s->ctx);
            ps_ctx_table_release(s->ctx, c);
            return err->code;
        }
        ps_ctx_table_finish(s->ctx, c, r.version);
        ps_ctx_table_apply_end(s->ctx);
        ps_cons_stepped(s->cons, rank, call->owner);
    }
    ps_trainers_step(s->trainers, who, cid, scalars);
    ps_rmetrics_add_step(s->rm, scalars, &rep);  /* a skipped step's scalars still describe its work */
    r.metrics = &rep;
    put_step_result(call, &r);
    return PS_OK;
}

ps_status svc_step_context(ps_svc_call *call, ps_ctx *c, double loss, ps_err *err) {
    ps_scalar_set sc = {0};
    if (isfinite(loss)) {  /* what a trainer's Step brings as "loss" (the round metrics, the stop rule) */
        snprintf(sc.s[0].name, sizeof sc.s[0].name, "loss");
        sc.s[0].value = loss;
        sc.n = 1;
    }
    return step_context(call, c, 0, 1.0f, &sc, err);
}

/* ---- Backward ---------------------------------------------------------------- */

/* Backward of one recorded forward f (checked: recorded, not backwarded)
 * into the scratch accumulator *acc (created on first use): its parameter
 * gradients, optionally its input gradient into gin. The context is not
 * changed: backward_commit does that, for every forward of a call at once,
 * so a call refused half-way changes nothing. *skip = 1 when a NaN/Inf
 * reached it under policy skip (the context's step will not apply); under
 * reject such a call is refused (never anything non-finite added). */
static ps_status backward_into(ps_service *s, ps_ctx *c, ps_ctx_fwd *f, const ps_Tensor *g, const float *gdata,
                               size_t gbytes, int finite, const char *what, float *gin, ps_grads **acc, int *skip,
                               ps_err *err) {
    const ps_stage_info *so = ps_model_stage(s->model, ps_tape_last_stage(f->tape));
    int64_t n;
    int nlead;
    char whose[128];
    snprintf(whose, sizeof whose, "the output of stage '%s'", so->name);
    if (svc_split_batch(g, so->out_dims, so->out_ndim, what, whose, &n, &nlead, err)) {
        /* a scalar output travels as (N, 1) */
        if (!(so->out_ndim == 0 && g->shape_count == 2 && g->shape[1] == 1)) return err->code;
        n = g->shape[0];
        ps_err_clear(err);
    }
    if (n != ps_tape_batch(f->tape)) {
        char got[96];
        ps_dims_format(got, sizeof got, g->shape, (int)g->shape_count);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: shape %s does not match the context's output "
                          "(%d samples of forward %u)", what, got, ps_tape_batch(f->tape), f->seq);
    }
    if (g->dtype != ps_DType_FLOAT32)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: dtype %s; gradients are float32", what,
                          ps_wire_dtype_name(g->dtype));
    if (*skip || (c->nonfinite && s->nonfinite_skip)) return PS_OK;  /* the step will not apply anyway */
    if (!finite && svc_check_finite(gdata, gbytes / sizeof(float), what, err)) {
        ps_status st = svc_nonfinite(s, NULL, err);
        if (!st) *skip = 1;
        return st;
    }
    ps_status st = svc_backward_train(s, f->tape, gdata, gin, acc, err);   /* batched when on (svc_batch.c) */
    int bad_param = -1;
    int64_t bad_elem = -1;
    int fin = st ? 1 : ps_grads_check_finite(s->model, *acc, &bad_param, &bad_elem);
    if (!st && fin < 0) st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "cannot check the gradients (out of memory)");
    if (!st && fin == 0) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradient of %s (computed from grad_output): element %lld is "
                   "not finite", ps_model_param(s->model, bad_param)->name, (long long)bad_elem);
        st = svc_nonfinite(s, NULL, err);
        if (!st) *skip = 1;
    }
    return st;
}

/* The forwards fs[0..n-1] were backwarded into acc (NULL: nothing to add;
 * taken): add it into the context's gradients, mark the context when skip,
 * and release the forwards' tapes - all of it, or (an error) nothing. */
static ps_status backward_commit(ps_service *s, ps_ctx *c, ps_ctx_fwd *const *fs, size_t n, ps_grads *acc, int skip,
                                 ps_err *err) {
    if (acc && !skip && c->grads && ps_grads_add(s->model, c->grads, acc, err)) {
        ps_grads_free(acc);
        return err->code;
    }
    if (acc && !skip && !c->grads) c->grads = acc;
    else ps_grads_free(acc);
    if (skip) c->nonfinite = 1;
    for (size_t k = 0; k < n; k++) ps_ctx_fwd_done(s->ctx, c, fs[k]);
    return PS_OK;
}

ps_status svc_backward_one(ps_service *s, ps_ctx *c, uint32_t seq, const ps_Tensor *g, const float *gdata,
                           size_t gbytes, int finite, const char *what, float *gin, ps_err *err) {
    ps_ctx_fwd *f = ps_ctx_find_fwd(c, seq);
    if (!f)
        return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: context %llu has no forward with seq %u",
                          what, (unsigned long long)c->id, seq);
    if (!f->tape)
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: forward %u of context %llu was already "
                          "backwarded", what, seq, (unsigned long long)c->id);
    ps_grads *acc = NULL;
    int skip = 0;
    ps_status st = backward_into(s, c, f, g, gdata, gbytes, finite, what, gin, &acc, &skip, err);
    if (st) {
        ps_grads_free(acc);
        return st;
    }
    return backward_commit(s, c, &f, 1, acc, skip, err);
}

/* want_input_grad: one buffer per covered forward, sized from its tape,
 * listed in call->out (the response's input_grads). */
static ps_status input_grads_alloc(ps_svc_call *call, const ps_BackwardRequest *req, ps_ctx *c, size_t ncov,
                                   ps_err *err) {
    ps_service *s = call->svc;
    ps_wire_named *items = ps_svc_keep(call, calloc(ncov, sizeof *items));
    size_t total = 0;
    for (size_t k = 0; items && k < ncov; k++) {
        uint32_t seq = k ? req->more_seqs[k - 1] : req->seq;
        ps_ctx_fwd *f = ps_ctx_find_fwd(c, seq);
        if (!f || !f->tape) continue;  /* svc_backward_one explains */
        const ps_stage_info *si = ps_model_stage(s->model, ps_tape_first_stage(f->tape));
        if (si->in_dtype != PS_DTYPE_F32)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "BackwardRequest.want_input_grad: the input of stage "
                              "'%s' is %s ids; it has no gradient", si->name, ps_wire_dtype_name(si->in_dtype));
        int64_t per = 1;
        for (int i = 0; i < si->in_ndim; i++) per *= si->in_dims[i];
        items[k].ndim = 1 + si->in_ndim;
        items[k].dims[0] = ps_tape_batch(f->tape);
        for (int i = 0; i < si->in_ndim; i++) items[k].dims[1 + i] = si->in_dims[i];
        if (items[k].ndim > PS_WIRE_MAX_DIMS) items[k].ndim = PS_WIRE_MAX_DIMS;
        total += (size_t)(ps_tape_batch(f->tape) * per);
    }
    float *gbuf = items ? ps_svc_keep(call, malloc(total * sizeof(float) + 1)) : NULL;
    if (!gbuf) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for input gradients");
    float *p = gbuf;
    for (size_t k = 0; k < ncov; k++) {
        int64_t cnt = 1;
        for (int i = 0; i < items[k].ndim; i++) cnt *= items[k].dims[i];
        items[k].data = p;
        items[k].name = "";
        if (items[k].ndim) p += cnt;
    }
    call->out = (ps_wire_named_list){items, ncov};
    return PS_OK;
}

/* The backward of every forward the request covers, into context c. */
static ps_status backward_covered(ps_svc_call *call, const ps_BackwardRequest *req, const ps_wire_tensor_in *in,
                                  const ps_wire_tensor_list *more, ps_ctx *c, ps_err *err) {
    ps_service *s = call->svc;
    /* the first Backward of a context allocates its gradient accumulator */
    if (!c->grads && ps_ctx_table_reserve(s->ctx, c, (size_t)ps_model_num_weights(s->model) * sizeof(float), err))
        return err->code;
    size_t ncov = 1 + more->n;
    if (req->want_input_grad && input_grads_alloc(call, req, c, ncov, err)) return err->code;
    const ps_wire_named *items = call->out.items;
    /* All or nothing: every covered forward is checked, then backwarded into
     * a scratch accumulator, and only then added and marked backwarded - a
     * call refused for any of them changes nothing (its forwards stay
     * pending, a retry of the whole call works). */
    ps_ctx_fwd **fs = ps_svc_keep(call, calloc(ncov, sizeof *fs));
    if (!fs) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t k = 0; k < ncov; k++) {
        uint32_t seq = k ? req->more_seqs[k - 1] : req->seq;
        char what[96];
        if (k == 0) snprintf(what, sizeof what, "BackwardRequest.seq");
        else snprintf(what, sizeof what, "BackwardRequest.more_seqs[%zu]", k - 1);
        if (!(fs[k] = ps_ctx_find_fwd(c, seq)))
            return ps_err_set(err, PS_ERR_NOT_FOUND, "%s: context %llu has no forward with seq %u", what,
                              (unsigned long long)c->id, seq);
        if (!fs[k]->tape)
            return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: forward %u of context %llu was already "
                              "backwarded", what, seq, (unsigned long long)c->id);
        for (size_t j = 0; j < k; j++)
            if (fs[j] == fs[k])
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: forward %u is covered twice in one call", what,
                                  seq);
    }
    ps_grads *acc = NULL;
    int skip = 0;
    for (size_t k = 0; k < ncov; k++) {
        char what[96];
        if (k == 0) snprintf(what, sizeof what, "BackwardRequest.grad_output");
        else snprintf(what, sizeof what, "BackwardRequest.more_grad_outputs[%zu]", k - 1);
        const ps_Tensor *gt = &req->grad_output;
        ps_Tensor mt = ps_Tensor_init_zero;
        const float *gd = in->data;
        size_t gb = in->bytes;
        if (k) {
            const ps_wire_tensor *w = &more->items[k - 1];
            mt.shape_count = (pb_size_t)w->ndim;
            memcpy(mt.shape, w->dims, sizeof(int64_t) * (size_t)w->ndim);
            mt.dtype = (ps_DType)w->dtype;
            gt = &mt;
            gd = w->data;
            gb = w->bytes;
        }
        float *gin = call->out.n && items[k].ndim ? (float *)items[k].data : NULL;
        if (backward_into(s, c, fs[k], gt, gd, gb, 0, what, gin, &acc, &skip, err)) {
            ps_grads_free(acc);
            return err->code;
        }
    }
    if (backward_commit(s, c, fs, ncov, acc, skip, err)) return err->code;
    svc_account(s, c);
    return PS_OK;
}

ps_status ps_svc_Backward(ps_svc_call *call, const ps_BackwardRequest *req, ps_BackwardResponse *resp,
                          ps_err *err) {
    (void)resp;  /* put_step_result fills it */
    ps_service *s = call->svc;
    const ps_wire_tensor_in *in;
    const ps_wire_tensor_list *more = ps_svc_tensors(call, &req->more_grad_outputs);
    if (ps_svc_tensor(call, &req->grad_output, req->has_grad_output, "BackwardRequest.grad_output", 1, &in, err))
        return err->code;
    if (req->more_seqs_count != more->n)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "BackwardRequest: %u more_seqs but %zu more_grad_outputs; "
                          "they go in pairs", (unsigned)req->more_seqs_count, more->n);
    ps_scalar_set sc;   /* refused before anything is accumulated */
    if (scalars_in(call, req->scalars, req->scalars_count, &sc, err)) return ps_err_prefix(err, "BackwardRequest");
    ps_ctx *c = svc_acquire_own(call, req->context_id, NULL, NULL, err);
    if (!c) return err->code;
    ps_status st = backward_covered(call, req, in, more, c, err);
    if (!st && req->step) return step_context(call, c, req->round, 1.0f, &sc, err);  /* takes c */
    step_result r = {.version = ps_model_version(s->model)};
    if (!st && c->grads) st = ps_grads_sq_norm(s->model, c->grads, &r.sq_norm, err);
    if (!st) put_step_result(call, &r);
    ps_ctx_table_release(s->ctx, c);
    return st;
}

/* ---- Step ---------------------------------------------------------------------- */

ps_status ps_svc_Step(ps_svc_call *call, const ps_StepRequest *req, ps_StepResponse *resp, ps_err *err) {
    (void)resp;  /* put_step_result fills it */
    ps_service *s = call->svc;
    ps_scalar_set sc;
    if (scalars_in(call, req->scalars, req->scalars_count, &sc, err)) return ps_err_prefix(err, "StepRequest");
    int finished = 0;
    uint64_t v = 0;
    ps_ctx *c = svc_acquire_own(call, req->context_id, &finished, &v, err);
    if (!c && finished == 1 && ps_ctx_table_finished_how(s->ctx, req->context_id) == PS_CTX_DROPPED)
        return ps_err_set(err, PS_ERR_ABORTED, "context %llu was dropped: its sync round closed without it, nothing "
                          "was applied; run the batch again under a new context", (unsigned long long)req->context_id);
    if (!c && finished == 1) {   /* a retried Step: answer what the first one did */
        ps_err_clear(err);
        ps_trainers_step_repeated(s->trainers, req->context_id);
        step_result r = {.version = v, .skipped = ps_ctx_table_finished_skipped(s->ctx, req->context_id)};
        put_step_result(call, &r);
        return PS_OK;
    }
    if (!c) return err->code;
    return step_context(call, c, req->round, req->grad_scale, &sc, err);
}

/* ---- ReleaseContext -------------------------------------------------------------- */

/* A context its trainer abandons unstepped (ps_ctx_table_discard_as). */
ps_status ps_svc_ReleaseContext(ps_svc_call *call, const ps_ReleaseContextRequest *req,
                                ps_ReleaseContextResponse *resp, ps_err *err) {
    if (!req->context_id)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ReleaseContextRequest.context_id: must be non-zero");
    int how = ps_ctx_table_discard_as(call->svc->ctx, req->context_id, call->owner, err);
    if (how < 0) return err->code;
    resp->released = how != PS_CTX_DISCARD_NONE;
    resp->pending = how == PS_CTX_DISCARD_PENDING;
    return PS_OK;
}

/* ---- PushGradients ------------------------------------------------------------- */

/* The pushed gradients, checked, into a scratch accumulator (a refused push
 * adds nothing), then into context c. */
static ps_status push_into(ps_service *s, const ps_wire_tensor_list *gl, ps_ctx *c, ps_err *err) {
    ps_grads *g2 = ps_grads_create(s->model, err);
    if (!g2) return err->code;
    ps_status st = PS_OK;
    for (size_t k = 0; k < gl->n && !st; k++) {
        const ps_wire_tensor *t = &gl->items[k];
        int i = ps_model_find_param(s->model, t->name);
        if (i < 0) {
            st = ps_err_set(err, PS_ERR_NOT_FOUND, "PushGradientsRequest.gradients[%zu]: model '%s' has no "
                            "parameter '%s'", k, ps_model_arch(s->model), t->name);
            break;
        }
        for (size_t j = 0; j < k && !st; j++)  /* each parameter once: it would be added twice */
            if (!strcmp(gl->items[j].name, t->name))
                st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.gradients[%zu]: '%s' is given "
                                "twice (also gradients[%zu])", k, t->name, j);
        if (st) break;
        const ps_param_info *pi = ps_model_param(s->model, i);
        const ps_stage_info *si = ps_model_stage(s->model, pi->stage_index);
        if (!si->params_only) {
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.gradients[%zu]: %s belongs to stage "
                            "'%s', which psd computes (its gradients come from Backward); only a parameter-only "
                            "stage's gradients are pushed", k, t->name, si->name);
            break;
        }
        int same = t->ndim == pi->ndim;
        for (int d = 0; same && d < pi->ndim; d++) same = t->dims[d] == pi->dims[d];
        if (!same || t->dtype != ps_DType_FLOAT32) {
            char got[96], want[96];
            ps_dims_format(got, sizeof got, t->dims, t->ndim);
            ps_dims_format(want, sizeof want, pi->dims, pi->ndim);
            st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.gradients[%zu] (%s): %s %s; the "
                            "parameter is float32 %s", k, t->name, ps_wire_dtype_name(t->dtype), got, want);
            break;
        }
        if (svc_check_finite(t->data, t->bytes / sizeof(float), t->name, err)) {
            if ((st = svc_nonfinite(s, c, err))) break;
            c->nonfinite = 1;   /* skip: marked; the step will not apply */
            continue;
        }
        st = ps_grads_add_dense(s->model, g2, i, t->data, err);
    }
    if (!st && c->grads) st = ps_grads_add(s->model, c->grads, g2, err);
    else if (!st) {
        c->grads = g2;
        g2 = NULL;
    }
    ps_grads_free(g2);
    return st;
}

/* PushGradients: gradients of a parameter-only stage's parameters (the
 * trainer's LSTM) added into a live context, applied by its Step. Once per
 * context: a repeat (a retry whose first reply was lost) is answered
 * without adding again. */
ps_status ps_svc_PushGradients(ps_svc_call *call, const ps_PushGradientsRequest *req,
                               ps_PushGradientsResponse *resp, ps_err *err) {
    ps_service *s = call->svc;
    const ps_wire_tensor_list *gl = ps_svc_tensors(call, &req->gradients);
    if (!gl->n) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.gradients is empty");
    /* Open the context when this is its first call here: a psd that hosts
     * only a parameter-only stage (rnn_lm's "rnn" on its own server) sees
     * no Forward of the batch. */
    if (req->context_id == 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "PushGradientsRequest.context_id is 0 (gradients belong to "
                          "a training context)");
    /* context_known: the trainer's Forwards opened it here - opening a
     * fresh one would step these gradients without the others */
    int created = 0;
    ps_ctx *c = svc_open_or_known(call, req->context_id, req->trainer_rank, req->context_known,
                                  "PushGradientsRequest.context_known (the trainer's Forwards opened it here: their "
                                  "gradients are gone, nothing of it will be applied here)", &created, err);
    if (!c) return err->code;
    ps_status st = PS_OK;
    if (created) {
        size_t more = 0;
        for (size_t k = 0; k < gl->n; k++) more += gl->items[k].bytes;
        st = ps_ctx_table_reserve(s->ctx, c, more, err);
    }
    if (!st && !c->pushed && !(st = push_into(s, gl, c, err))) {
        c->pushed = 1;
        svc_account(s, c);
    }
    if (!st) {
        resp->model_version = ps_model_version(s->model);
        if (c->grads) st = ps_grads_sq_norm(s->model, c->grads, &resp->grad_sq_norm, err);
    }
    ps_ctx_table_release(s->ctx, c);
    return st;
}
