/* svc_forward.c - the Forward handler: validation of the input against the
 * stages it names, batch splitting, the training context's record of each
 * forward (a retry is answered from it), the fused loss (targets: the
 * cross-entropy and this forward's backward at once), and under ssp the
 * forwards held back until the slowest trainer catches up, run on the
 * service's executor thread. */
#include "service_impl.h"
#include "trainers.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loss.h"

/* A Forward held back by ssp: the call and its checked tensors, and the
 * bytes it is charged for in its client's held share. */
struct svc_fwd_node {
    ps_svc_call *c;
    const ps_wire_tensor_in *in, *tin;
    struct svc_fwd_node *next;
    size_t bytes;   /* charged (held_charge), 0 = not */
    char owner[PS_SVC_OWNER_MAX];  /* whom (the call may be gone when it is freed) */
};

/* Request bytes a client's held-back Forwards hold (s->exec_mu). */
struct svc_held {
    char owner[PS_SVC_OWNER_MAX];
    size_t bytes;
};

/* ssp: may this client hold `bytes` more in Forwards held back? All held
 * Forwards together get server.max_context_bytes / 4, shared fairly by
 * the clients holding some; a client holding none may always hold one
 * (an honest trainer holds one at a time). OK and charged (node->bytes),
 * or RESOURCE_EXHAUSTED naming the share. */
static ps_status held_charge(ps_service *s, svc_fwd_node *node, const char *owner, size_t bytes, ps_err *err) {
    if (!s->max_context_bytes) return PS_OK;
    size_t budget = s->max_context_bytes / 4;
    pthread_mutex_lock(&s->exec_mu);
    struct svc_held *mine = NULL;
    for (int i = 0; i < s->nheld; i++)
        if (!strcmp(s->held[i].owner, owner)) mine = &s->held[i];
    int holders = s->nheld + (mine ? 0 : 1);
    size_t share = budget / (size_t)holders;
    if (mine && mine->bytes + bytes > share) {
        size_t have = mine->bytes;
        pthread_mutex_unlock(&s->exec_mu);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "ssp: this client's Forwards held back for the slowest "
                   "rank hold %zu bytes and this one brings %zu more; its share of server.max_context_bytes "
                   "/ 4 (%zu) among %d clients holding some is %zu bytes; wait for their replies", have,
                   bytes, budget, holders, share);
        return ps_err_retry_after(err, PS_CTX_RETRY_AFTER_MS);  /* refused before it ran or waited */
    }
    if (!mine) {
        if (s->nheld == s->cap_held) {
            int ncap = s->cap_held ? 2 * s->cap_held : 8;
            struct svc_held *h = realloc(s->held, (size_t)ncap * sizeof *h);
            if (!h) {
                pthread_mutex_unlock(&s->exec_mu);
                return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
            }
            s->held = h;
            s->cap_held = ncap;
        }
        mine = &s->held[s->nheld++];
        snprintf(mine->owner, sizeof mine->owner, "%s", owner);
        mine->bytes = 0;
    }
    mine->bytes += bytes;
    node->bytes = bytes;
    snprintf(node->owner, sizeof node->owner, "%s", owner);
    pthread_mutex_unlock(&s->exec_mu);
    return PS_OK;
}

/* Give back what node was charged and free it. */
static void node_free(ps_service *s, svc_fwd_node *node) {
    if (node->bytes) {
        pthread_mutex_lock(&s->exec_mu);
        for (int i = 0; i < s->nheld; i++)
            if (!strcmp(s->held[i].owner, node->owner)) {
                s->held[i].bytes -= node->bytes;
                if (!s->held[i].bytes) s->held[i] = s->held[--s->nheld];
                break;
            }
        pthread_mutex_unlock(&s->exec_mu);
    }
    free(node);
}

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
    char names[256];
    svc_stage_names(s, names, sizeof names);
    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: model %s has no stage '%s' (stages: %s)", what,
                      ps_model_arch(s->model), first_name, names);
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

/* What a Forward's checks found out. */
typedef struct fwd_plan {
    int first, last;           /* the stages it runs */
    const ps_stage_info *si, *so;
    int64_t n;                 /* samples */
    int nlead;                 /* leading dims of the input */
    int fused;                 /* targets: the fused loss */
    int bad_input;             /* a NaN/Inf input under policy skip */
} fwd_plan;

/* Everything about a Forward that can be refused without running it: the
 * stages, the input's dtype and shape, the batch size, the context id, the
 * targets, non-finite inputs. Nothing of psd's state changes. */
static ps_status forward_check(ps_service *s, const ps_ForwardRequest *req, const ps_wire_tensor_in *in,
                               const ps_wire_tensor_in *tin, fwd_plan *p, ps_err *err) {
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
    if (svc_split_batch(&req->input, si->in_dims, si->in_ndim, "ForwardRequest.input", whose, &n, &nlead, err))
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
    } else if (req->step || req->skip_input_grad) {
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "ForwardRequest.%s: only with targets (a fused loss, whose "
                          "backward runs in the same call)", req->step ? "step" : "skip_input_grad");
    }
    int bad_input = 0;
    if (si->in_dtype == PS_DTYPE_F32 &&
        svc_check_finite(in->data, in->bytes / sizeof(float), "ForwardRequest.input", err)) {
        if (!req->train || !s->nonfinite_skip) {  /* eval: nothing to skip, always refused */
            svc_count(&s->nonfinite_rejected);
            return err->code;
        }
        bad_input = 1;
        ps_err_clear(err);
    }
    *p = (fwd_plan){first, last, si, so, n, nlead, fused, bad_input};
    return PS_OK;
}

/* Runs a decoded Forward with its checked tensors into resp, or err. */
static ps_status forward_run(ps_svc_call *call, const ps_ForwardRequest *req, const ps_wire_tensor_in *in,
                             const ps_wire_tensor_in *tin, ps_ForwardResponse *resp, ps_err *err) {
    ps_service *s = call->svc;
    fwd_plan p;
    if (forward_check(s, req, in, tin, &p, err)) return err->code;
    int first = p.first, last = p.last, nlead = p.nlead, fused = p.fused, bad_input = p.bad_input;
    const ps_stage_info *si = p.si, *so = p.so;
    int64_t n = p.n;
    int64_t outper = 1;
    for (int i = 0; i < so->out_ndim; i++) outper *= so->out_dims[i];
    /* fused: the logits stay in the tape (below) */
    float *out = fused ? NULL : ps_svc_keep(call, malloc((size_t)(n * outper) * sizeof(float) + 1)), *logits = NULL;
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
        c = svc_open_or_known(call, req->context_id, req->trainer_rank, req->context_known,
                              "ForwardRequest.context_known (an earlier Forward of it opened it here: what it "
                              "recorded is gone)", NULL, err);
        if (!c) {
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
        if (!replayed && (st = svc_forward_train(s, first, last, in->data, (int)n,
                                         dropout_seed(req->context_id, req->trainer_rank, req->seq), out, &tape, &version, err)))
            goto out;
        if (!replayed) ps_tape_set_key(tape, req->context_id, req->seq);   /* running statistics fold in seq order */
        if (fused) {  /* read and overwritten with their gradient in place, or a copy (a device stage) */
            if (!(logits = ps_tape_output_writable(tape))) {
                if (!(out = ps_svc_keep(call, malloc((size_t)(n * outper) * sizeof(float) + 1)))) {
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
        /* an eval forward's noise (RandnLike: PyTorch samples in eval too): a request naming a context draws what
         * its context id, rank and seq give, as a training one; one without draws fresh noise each call */
        uint64_t seed = req->context_id ? dropout_seed(req->context_id, req->trainer_rank, req->seq)
                                        : dropout_seed(__atomic_add_fetch(&s->eval_draws, 1, __ATOMIC_RELAXED),
                                                       UINT32_MAX, 0);
        if ((st = ps_model_forward_range(s->model, first, last, in->data, (int)n, 0, NULL, seed, out, NULL,
                                         &version, err)))
            goto out;
    }
    int64_t dims[PS_WIRE_MAX_DIMS];
    int nd = join_dims(dims, req->input.shape, nlead, so->out_dims, so->out_ndim);
    if (nd == 1) dims[nd++] = 1;  /* a scalar per sample travels as (N, 1) */
    if (fused) {   /* the loss here, the backward of this forward at once */
        int64_t inper = 1;
        for (int i = 0; i < si->in_ndim; i++) inper *= si->in_dims[i];
        int want_gin = si->in_dtype == PS_DTYPE_F32 && !req->skip_input_grad;
        gin = want_gin ? ps_svc_keep(call, malloc((size_t)(n * inper) * sizeof(float) + 1)) : NULL;
        if (want_gin && !gin) {
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the fused loss");
            goto out;
        }
        /* the logits' gradient replaces them in place: they do not travel; a
         * finite loss means a finite gradient (every softmax term <= 1) */
        st = fused_ce(logits, (const int64_t *)tin->data, n, outper, logits, &resp->loss, err);
        ps_Tensor gt = ps_Tensor_init_zero;
        gt.shape_count = (pb_size_t)nd;
        memcpy(gt.shape, dims, sizeof(int64_t) * (size_t)nd);
        gt.dtype = ps_DType_FLOAT32;
        if (!st) st = svc_backward_one(s, c, req->seq, &gt, logits, (size_t)(n * outper) * sizeof(float),
                                   isfinite(resp->loss), "ForwardRequest.targets", gin, err);
        if (st) goto out;
        if (req->want_grad_sq_norm && c->grads &&
            (st = ps_grads_sq_norm(s->model, c->grads, &resp->grad_sq_norm, err)))
            goto out;
        svc_account(s, c);
        if (gin) {
            resp->has_input_grad = true;
            ps_wire_tensor_encode_bind(&resp->input_grad, NULL, (int)req->input.shape_count, req->input.shape, gin);
        }
    } else {
        resp->has_output = true;
        ps_wire_tensor_encode_bind(&resp->output, NULL, nd, dims, out);
    }
    resp->model_version = version;
    resp->replayed = replayed;
    if (req->train)
        ps_trainers_forward(s->trainers, req->trainer_rank, n, replayed, fused ? resp->loss : NAN,
                            fused && req->targets.shape_count >= 2);
    if (ps_cons_mode_of(s->cons) == PS_CONS_SYNC) resp->round = c && c->round ? c->round : ps_cons_round(s->cons);
    if (c && !c->round && ps_cons_mode_of(s->cons) == PS_CONS_SYNC) c->round = resp->round;
    if (fused && req->step) {  /* the whole training step: svc_step_context takes c (and may defer the call) */
        ps_ctx *held = c;
        c = NULL;
        st = svc_step_context(call, held, resp->loss, err);
    }
out:
    if (c) ps_ctx_table_release(s->ctx, c);
    ps_tape_free(tape);
    return st;
}

/* A held-back Forward runs and is answered; the node is freed. One whose
 * client went away meanwhile (cancelled between its release and now) is
 * not run: nobody waits for it, and a retry of it may be running already. */
static void fwd_node_run(svc_fwd_node *node) {
    ps_svc_call *c = node->c;
    ps_service *s = c->svc;  /* c may be gone once finished */
    if (c->rpc && ps_rpc_call_cancelled(c->rpc)) {
        ps_err_set(&c->err, PS_ERR_UNAVAILABLE, "the client cancelled the held-back Forward");
        ps_svc_finish(c, c->err.code);
    } else {
        ps_svc_finish(c, forward_run(c, c->req, node->in, node->tin, c->resp, &c->err));
    }
    node_free(s, node);
}

/* ssp: the client of a held-back Forward went away (its deadline, or a
 * cancel): take the Forward back so that it never runs and its request
 * (input tensors) is freed now, not when its rank's turn comes. When it
 * was released already, fwd_ready has it (and fwd_node_run skips it). */
static void fwd_cancelled(void *arg, ps_rpc_call *rpc) {
    ps_service *s = arg;
    svc_fwd_node *node = ps_cons_ssp_cancel(s->cons, rpc);
    if (!node) return;
    ps_svc_call *c = node->c;
    ps_err_set(&c->err, PS_ERR_UNAVAILABLE, "the client cancelled the held-back Forward");
    ps_svc_finish(c, c->err.code);
    node_free(s, node);
}

/* ssp: a held-back Forward may run (or psd shuts down). Runs on the
 * service's executor thread, never on the thread that released it. */
static void fwd_ready(void *arg, ps_status st, const ps_err *err) {
    svc_fwd_node *node = arg;
    ps_service *s = node->c->svc;
    if (st != PS_OK) {
        ps_err_set(&node->c->err, st, "%s", err ? err->msg : "");
        ps_svc_finish(node->c, st);
        node_free(s, node);
        return;
    }
    pthread_mutex_lock(&s->exec_mu);
    node->next = NULL;
    if (s->exec_tail) s->exec_tail->next = node;
    else s->exec_head = node;
    s->exec_tail = node;
    pthread_cond_signal(&s->exec_cv);
    pthread_mutex_unlock(&s->exec_mu);
}

void *svc_exec_main(void *p) {
    ps_service *s = p;
    pthread_mutex_lock(&s->exec_mu);
    for (;;) {
        while (!s->exec_head && !s->exec_stop) pthread_cond_wait(&s->exec_cv, &s->exec_mu);
        if (!s->exec_head) break;
        svc_fwd_node *node = s->exec_head;
        s->exec_head = node->next;
        if (!s->exec_head) s->exec_tail = NULL;
        pthread_mutex_unlock(&s->exec_mu);
        fwd_node_run(node);
        pthread_mutex_lock(&s->exec_mu);
    }
    pthread_mutex_unlock(&s->exec_mu);
    return NULL;
}

ps_status ps_svc_Forward(ps_svc_call *c, const ps_ForwardRequest *req, ps_ForwardResponse *resp, ps_err *err) {
    ps_service *s = c->svc;
    const ps_wire_tensor_in *in, *tin;
    if (ps_svc_tensor(c, &req->input, req->has_input, "ForwardRequest.input", 1, &in, err) ||
        ps_svc_tensor(c, &req->targets, req->has_targets, "ForwardRequest.targets", 0, &tin, err))
        return err->code;
    /* ssp: a trainer too far ahead waits, without holding this thread - a
     * request that would be refused is refused first, so it never counts
     * as its rank's activity (an invalid Forward cannot pin the others). */
    fwd_plan plan;
    if (req->train && ps_cons_mode_of(s->cons) == PS_CONS_SSP && forward_check(s, req, in, tin, &plan, err))
        return err->code;
    if (req->train && ps_cons_mode_of(s->cons) == PS_CONS_SSP) {
        svc_fwd_node *node = malloc(sizeof *node);
        if (!node) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        *node = (svc_fwd_node){c, in, tin, NULL, 0, ""};
        /* charged before it may be held: a client past its held share is
         * refused before anything waits (an honest trainer holds one) */
        if (held_charge(s, node, c->owner, in->bytes + (tin ? tin->bytes : 0) + sizeof *node, err)) {
            free(node);
            return err->code;
        }
        if (ps_svc_defer(c, fwd_cancelled, s)) {
            int admit = ps_cons_ssp_admit(s->cons, req->trainer_rank, c->owner, c->rpc, fwd_ready, node, &c->err);
            if (!admit) return PS_OK;  /* answered later */
            if (admit < 0) {  /* another client's rank, or outside server.ssp_world_size */
                ps_err_prefix(&c->err, "ForwardRequest");
                ps_svc_finish(c, c->err.code);
                node_free(s, node);
                return PS_OK;
            }
            fwd_node_run(node);
            return PS_OK;
        }
        node_free(s, node);
    }
    return forward_run(c, req, in, tin, resp, err);
}
