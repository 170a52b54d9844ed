/* svc_batch.c - batched training Forwards and Backwards
 * (server.batch_wait_ms, server.batch_max_samples, server.batch_backward,
 * server.batch_executors;
 * docs/performance.md, "Many trainers on one GPU"): concurrent training
 * forwards of the same run of stages are held
 * up to the wait and computed as one (ps_model_forward_group), each
 * context receiving its own tape - its own dropout masks, its own slice of
 * the activations - so that its Backward gives what its own forward would
 * have given. The grouping is the batcher's (batcher.h); a held forward
 * keeps its handler thread and its call (it counts against
 * server.max_calls like any running call) and its tape's bytes are
 * reserved in the context budget before it is held. Runs with a
 * batch-coupled node (BatchNorm in training, ...) are never combined.
 * Backwards likewise, on a batcher of their own (a forward group and a
 * backward group may compute at once): concurrent training backwards of
 * the same run are computed as one (ps_model_backward_group) - every input
 * gradient in one pass, each context's parameter gradients from its own
 * samples into an accumulator of its own - whether or not their forwards
 * were combined. A held backward keeps its call and its context, whose
 * gradient bytes are reserved before (svc_step.c). */
#include "service_impl.h"

#include <stdlib.h>

#include "batcher.h"
#include "log.h"

typedef struct fwd_item {
    ps_batch_item it;
    int first, last, n;
    const void *x;
    uint64_t seed;
    float *out;
    ps_tape *tape;
    uint64_t version;
    ps_status st;
    ps_err err;
    int done;                /* s->batch_mu */
} fwd_item;

/* One forward alone, as without batching. */
static void run_alone(ps_service *s, fwd_item *f) {
    f->st = ps_model_forward_range(s->model, f->first, f->last, f->x, f->n, 1, NULL, f->seed, f->out, &f->tape,
                                   &f->version, &f->err);
}

/* The batcher's run: a group of forwards of one run of stages. */
static void run_group(void *user, ps_batch_item **items, int k) {
    ps_service *s = user;
    fwd_item *f0 = (fwd_item *)items[0];
    ps_status st = PS_ERR_INTERNAL;
    if (k > 1) {
        const void **x = malloc((size_t)k * sizeof *x);
        int *n = malloc((size_t)k * sizeof *n);
        uint64_t *seeds = malloc((size_t)k * sizeof *seeds);
        float **out = malloc((size_t)k * sizeof *out);
        ps_tape **tapes = malloc((size_t)k * sizeof *tapes);
        if (x && n && seeds && out && tapes) {
            for (int i = 0; i < k; i++) {
                fwd_item *f = (fwd_item *)items[i];
                x[i] = f->x;
                n[i] = f->n;
                seeds[i] = f->seed;
                out[i] = f->out;
            }
            uint64_t version = 0;
            ps_err err = {0};
            st = ps_model_forward_group(s->model, f0->first, f0->last, k, x, n, seeds, out, tapes, &version, &err);
            if (st == PS_OK) {
                for (int i = 0; i < k; i++) {
                    fwd_item *f = (fwd_item *)items[i];
                    f->tape = tapes[i];
                    f->version = version;
                    f->st = PS_OK;
                }
                __atomic_add_fetch(&s->batch_combined, (uint64_t)k, __ATOMIC_RELAXED);
            }
        }
        free(x);
        free(n);
        free(seeds);
        free(out);
        free(tapes);
    }
    if (st != PS_OK)   /* alone, or the group failed: each alone, with its own answer */
        for (int i = 0; i < k; i++) run_alone(s, (fwd_item *)items[i]);
    pthread_mutex_lock(&s->batch_mu);
    for (int i = 0; i < k; i++) ((fwd_item *)items[i])->done = 1;
    pthread_cond_broadcast(&s->batch_cv);
    pthread_mutex_unlock(&s->batch_mu);
}

/* ---- Backwards ---- */

typedef struct bwd_item {
    ps_batch_item it;
    ps_tape *tape;
    const float *gout;
    float *gin;
    ps_grads **acc;          /* the caller's (*acc NULL: not created yet) */
    ps_status st;
    ps_err err;
    int done;                /* s->batch_mu */
} bwd_item;

/* One backward alone, as without batching. */
static void bwd_alone(ps_service *s, bwd_item *b) {
    if (!*b->acc && !(*b->acc = ps_grads_create(s->model, &b->err))) {
        b->st = b->err.code;
        return;
    }
    b->st = ps_model_backward_acc(s->model, b->tape, b->gout, b->gin, *b->acc, &b->err);
}

/* The backward batcher's run: a group of backwards of one run of stages.
 * Each part's parameter gradients go into a fresh accumulator of its own,
 * handed to the caller (or added into the caller's) only when the whole
 * group succeeded, so that a failed group leaves every caller's as it was
 * and each part then runs alone with its own answer. */
static void bwd_group(void *user, ps_batch_item **items, int k) {
    ps_service *s = user;
    ps_status st = PS_ERR_INTERNAL;
    if (k > 1) {
        ps_tape **tapes = malloc((size_t)k * sizeof *tapes);
        const float **gout = malloc((size_t)k * sizeof *gout);
        float **gin = malloc((size_t)k * sizeof *gin);
        ps_grads **accs = calloc((size_t)k, sizeof *accs);
        ps_err err = {0};
        int ok = tapes && gout && gin && accs;
        for (int i = 0; ok && i < k; i++) {
            bwd_item *b = (bwd_item *)items[i];
            tapes[i] = b->tape;
            gout[i] = b->gout;
            gin[i] = b->gin;
            ok = (accs[i] = ps_grads_create(s->model, &err)) != NULL;
        }
        if (ok) st = ps_model_backward_group(s->model, k, tapes, gout, gin, accs, &err);
        for (int i = 0; st == PS_OK && i < k; i++) {   /* each its own gradients */
            bwd_item *b = (bwd_item *)items[i];
            b->st = PS_OK;
            if (!*b->acc) {
                *b->acc = accs[i];
                accs[i] = NULL;
            } else {
                b->st = ps_grads_add(s->model, *b->acc, accs[i], &b->err);
            }
        }
        if (st == PS_OK) __atomic_add_fetch(&s->bbatch_combined, (uint64_t)k, __ATOMIC_RELAXED);
        for (int i = 0; accs && i < k; i++) ps_grads_free(accs[i]);
        free(tapes);
        free(gout);
        free(gin);
        free(accs);
    }
    if (st != PS_OK)   /* alone, or the group failed: each alone, with its own answer */
        for (int i = 0; i < k; i++) bwd_alone(s, (bwd_item *)items[i]);
    pthread_mutex_lock(&s->batch_mu);
    for (int i = 0; i < k; i++) ((bwd_item *)items[i])->done = 1;
    pthread_cond_broadcast(&s->batch_cv);
    pthread_mutex_unlock(&s->batch_mu);
}
/* Hands a call's item to batcher bt, keyed by its stage run first..last,
 * counts it in *held and waits until the batcher's worker marks *done
 * (under s->batch_mu). */
static void hold(ps_service *s, ps_batcher *bt, ps_batch_item *it, int first, int last, int samples, uint64_t *held,
                 const int *done) {
    it->key = ((uint64_t)first << 16 | (uint64_t)last) + 1;
    it->samples = samples;
    __atomic_add_fetch(held, 1, __ATOMIC_RELAXED);
    ps_batcher_submit(bt, it);
    pthread_mutex_lock(&s->batch_mu);
    while (!*done) pthread_cond_wait(&s->batch_cv, &s->batch_mu);
    pthread_mutex_unlock(&s->batch_mu);
}

ps_status svc_backward_train(ps_service *s, ps_tape *tape, const float *grad_out, float *grad_in, ps_grads **acc,
                             ps_err *err) {
    int first = ps_tape_first_stage(tape), last = ps_tape_last_stage(tape);
    bwd_item b = {.tape = tape, .gout = grad_out, .gin = grad_in, .acc = acc};
    if (!s->batcher_bwd || ps_cons_mode_of(s->cons) == PS_CONS_SSP || !ps_model_can_group(s->model, first, last)) {
        bwd_alone(s, &b);
    } else {
        b.it.arg = &b;
        hold(s, s->batcher_bwd, &b.it, first, last, ps_tape_batch(tape), &s->bbatch_held, &b.done);
    }
    if (b.st != PS_OK) *err = b.err;
    return b.st;
}

void ps_service_batch_bwd_stats(ps_service *s, uint64_t *held, uint64_t *combined) {
    *held = __atomic_load_n(&s->bbatch_held, __ATOMIC_RELAXED);
    *combined = __atomic_load_n(&s->bbatch_combined, __ATOMIC_RELAXED);
}

/* ---- both ---- */

ps_status svc_batch_start(ps_service *s, ps_err *err) {
    pthread_mutex_init(&s->batch_mu, NULL);
    pthread_cond_init(&s->batch_cv, NULL);
    s->batch_inited = 1;
    if (!(s->opts.batch_wait_ms > 0)) return PS_OK;
    int max = s->opts.batch_max_samples > 0 ? s->opts.batch_max_samples : 256;
    int ex = s->opts.batch_executors > 0 ? s->opts.batch_executors : 1;
    if (!(s->batcher = ps_batcher_create((int64_t)(s->opts.batch_wait_ms * 1000.0), max, ex, run_group, s, err)))
        return err->code;
    if (s->opts.batch_backward &&
        !(s->batcher_bwd = ps_batcher_create((int64_t)(s->opts.batch_wait_ms * 1000.0), max, ex, bwd_group, s, err)))
        return err->code;
    ps_log(PS_LOG_INFO, "batching training Forwards%s: up to %g ms for company, up to %d samples together, %d "
           "group%s at once", s->batcher_bwd ? " and Backwards" : "", s->opts.batch_wait_ms, max, ex,
           ex == 1 ? "" : "s");
    for (int i = 0; i < ps_model_num_stages(s->model); i++) {
        const ps_stage_info *si = ps_model_stage(s->model, i);
        if (!si->params_only && !ps_model_can_group(s->model, i, i))
            ps_log(PS_LOG_WARN, "server.batch_wait_ms: stage '%s' has a node that is not per-sample (BatchNorm in "
                   "training couples a batch's samples; docs/performance.md): Forwards through it run unbatched",
                   si->name);
    }
    if (ps_cons_mode_of(s->cons) == PS_CONS_SSP)
        ps_log(PS_LOG_WARN, "server.batch_wait_ms: under ssp Forwards run one at a time; none is batched");
    return PS_OK;
}

void svc_batch_stop(ps_service *s) {
    ps_batcher_free(s->batcher);   /* runs what is held */
    s->batcher = NULL;
    ps_batcher_free(s->batcher_bwd);
    s->batcher_bwd = NULL;
    if (s->batch_inited) {
        pthread_cond_destroy(&s->batch_cv);
        pthread_mutex_destroy(&s->batch_mu);
        s->batch_inited = 0;
    }
}

ps_status svc_forward_train(ps_service *s, int first, int last, const void *x, int n, uint64_t seed, float *out,
                            ps_tape **tape, uint64_t *version, ps_err *err) {
    if (!s->batcher || ps_cons_mode_of(s->cons) == PS_CONS_SSP || !ps_model_can_group(s->model, first, last))
        return ps_model_forward_range(s->model, first, last, x, n, 1, NULL, seed, out, tape, version, err);
    fwd_item f = {.first = first, .last = last, .n = n, .x = x, .seed = seed, .out = out};
    f.it.arg = &f;
    hold(s, s->batcher, &f.it, first, last, n, &s->batch_held, &f.done);
    *tape = f.tape;
    *version = f.version;
    if (f.st != PS_OK) *err = f.err;
    return f.st;
}

void ps_service_batch_stats(ps_service *s, uint64_t *held, uint64_t *combined) {
    *held = __atomic_load_n(&s->batch_held, __ATOMIC_RELAXED);
    *combined = __atomic_load_n(&s->batch_combined, __ATOMIC_RELAXED);
}
