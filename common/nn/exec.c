/* exec.c - the executor: runs a consecutive run of stages forward on a
 * tape, and backward from a tape into accumulated gradients (see model.h).
 * It walks the layers of the model's stages through the layer-kind table;
 * nothing here knows which model it runs. No locks and no optimizer:
 * model.c takes the weights lock around these calls and owns the step. */
#include "model_impl.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- layouts */

/* 1 when the stage's backend offers a blocked layout for c channels. */
static int blocked_ok(const stage *st, int64_t c) {
    const ps_backend_ops *ops = st->be->ops;
    return ops->blocked_layout && ops->reorder && ops->blocked_layout(st->be->impl, (int)c) > 0;
}

static int prev_layout(const stage *st, int l) {
    return l == 0 ? PS_LAYOUT_PLAIN : st->layers[l - 1].out_layout;
}

/* Activation layouts: kinds that prefer it (convolutions) work on the
 * backend's blocked layout where it has one (much faster kernels), kinds
 * that keep layouts (relu, max-pool) keep the one they get, everything else
 * (dropout with its masks in PyTorch order, flatten, linear, softmax) and
 * the stage's output are plain. The executor reorders where consecutive
 * layers disagree. Only 4-D activations (per-sample (c, h, w)) block. */
void ps_exec_plan_layouts(stage *st) {
    int cur = PS_LAYOUT_PLAIN;
    for (int l = 0; l < st->nlayers; l++) {
        ps_layer *ly = &st->layers[l];
        int last = l == st->nlayers - 1;
        unsigned f = ly->kind->flags;
        ly->in_layout = ly->out_layout = PS_LAYOUT_PLAIN;
        if ((f & PS_KIND_LAYOUT_BLOCKED) && ly->in.ndim == 3 && ly->outs.ndim == 3) {
            if (blocked_ok(st, ly->in.dims[0])) ly->in_layout = PS_LAYOUT_BLOCKED;
            if (!last && blocked_ok(st, ly->outs.dims[0])) ly->out_layout = PS_LAYOUT_BLOCKED;
        } else if ((f & PS_KIND_LAYOUT_KEEP) && !last) {
            ly->in_layout = ly->out_layout = cur;
        }
        cur = ly->out_layout;
    }
}

/* ------------------------------------------------------------------ tapes */

static size_t act_bytes(const ps_shape *s, ps_dtype t, int n) {
    return (size_t)n * (size_t)ps_shape_numel(s) * ps_dtype_size(t);
}

static ps_tape *tape_new(ps_model *m, int first, int last, int n) {
    ps_tape *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->m = m;
    t->first = first;
    t->last = last;
    t->n = n;
    for (int s = first; s <= last; s++) {
        int nl = m->stages[s].nlayers;
        tape_stage *ts = &t->st[s];
        ts->acts = calloc(nl + 1, sizeof *ts->acts);
        ts->owned = calloc(nl + 1, 1);
        ts->saved = calloc(nl, sizeof *ts->saved);
        ts->rin = calloc(nl, sizeof *ts->rin);
        if (!ts->acts || !ts->owned || !ts->saved || !ts->rin) {
            ps_tape_free(t);
            return NULL;
        }
    }
    return t;
}

void ps_tape_free(ps_tape *t) {
    if (!t) return;
    ps_model *m = t->m;
    for (int s = t->first; s <= t->last; s++) {
        stage *st = &m->stages[s];
        tape_stage *ts = &t->st[s];
        if (ts->acts)
            for (int l = 0; l <= st->nlayers; l++)
                if (ts->owned[l]) ps_backend_release(st->be, ts->acts[l]);
        if (ts->saved)
            for (int l = 0; l < st->nlayers; l++) ps_backend_release(st->be, ts->saved[l].dev);
        if (ts->rin)
            for (int l = 0; l < st->nlayers; l++) ps_backend_release(st->be, ts->rin[l]);
        free(ts->acts);
        free(ts->saved);
        free(ts->rin);
        free(ts->owned);
    }
    ps_grads_free(t->own);
    free(t);
}

int ps_tape_has_grads(const ps_tape *t) { return t->own != NULL; }
int ps_tape_batch(const ps_tape *t) { return t->n; }
int ps_tape_first_stage(const ps_tape *t) { return t->first; }
int ps_tape_last_stage(const ps_tape *t) { return t->last; }

/* Activations and workspaces a forward of stages first..last keeps for n
 * samples, plus (with_grads) the stages' dense gradient blocks. */
static size_t range_bytes(const ps_model *m, int first, int last, int n, int with_grads) {
    size_t bytes = 0;
    for (int s = first; s <= last; s++) {
        const stage *st = &m->stages[s];
        if (with_grads) bytes += (size_t)st->ngrads * sizeof(float);
        bytes += act_bytes(&st->layers[0].in, st->layers[0].in_dtype, n);
        for (int l = 0; l < st->nlayers; l++) {
            const ps_layer *ly = &st->layers[l];
            bytes += act_bytes(&ly->outs, ly->out_dtype, n) + ly->kind->tape_bytes(ly, n);
            if (ly->in_layout != prev_layout(st, l)) bytes += act_bytes(&ly->in, ly->in_dtype, n);
        }
    }
    return bytes;
}

size_t ps_model_tape_bytes(const ps_model *m, int n) { return range_bytes(m, 0, m->nstages - 1, n, 1); }

size_t ps_tape_bytes(const ps_tape *t) { return range_bytes(t->m, t->first, t->last, t->n, 0); }

/* Move a host or device buffer of stage `from` into a buffer usable by stage
 * `to`. Host-memory stages share pointers; host <-> device is one copy by
 * the device side's backend; two devices of one backend use its
 * copy_from_peer (peer copy, or pinned host staging inside the backend);
 * anything else goes through a host bounce buffer. On success *dst is
 * either src (aliased, *owned = 0) or a new buffer of `to` (*owned = 1). */
static ps_status cross_stage(stage *from, stage *to, const void *src, size_t bytes, void **dst, int *owned,
                             ps_err *err) {
    if (from->host_memory && to->host_memory) {
        *dst = (void *)src;
        *owned = 0;
        return PS_OK;
    }
    void *out = to->be->ops->alloc(to->be->impl, bytes ? bytes : 4);
    void *bounce = NULL;
    ps_status rc;
    if (!out) goto oom;
    if (from->host_memory) {
        rc = to->be->ops->copy_to_device(to->be->impl, out, src, bytes, err);
    } else if (to->host_memory) {
        rc = from->be->ops->copy_to_host(from->be->impl, out, src, bytes, err);
    } else if (from->be->ops == to->be->ops && to->be->ops->copy_from_peer) {
        rc = to->be->ops->copy_from_peer(to->be->impl, out, from->be->impl, src, bytes, err);
    } else {
        bounce = malloc(bytes);
        if (!bounce) goto oom;
        rc = from->be->ops->copy_to_host(from->be->impl, bounce, src, bytes, err);
        if (rc == PS_OK) rc = to->be->ops->copy_to_device(to->be->impl, out, bounce, bytes, err);
        free(bounce);
    }
    if (rc != PS_OK) {
        ps_backend_release(to->be, out);
        return ps_err_prefix(err, "stage boundary %s -> %s", from->def->name, to->def->name);
    }
    *dst = out;
    *owned = 1;
    return PS_OK;
oom:
    ps_backend_release(to->be, out);
    return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory moving %zu bytes from stage %s to stage %s",
                      bytes, from->def->name, to->def->name);
}

ps_status ps_stage_copy(stage *st, float *dst, const float *src, int64_t count, ps_err *err) {
    size_t bytes = (size_t)count * sizeof(float);
    if (st->host_memory) { memcpy(dst, src, bytes); return PS_OK; }
    float *bounce = malloc(bytes ? bytes : 4);
    if (!bounce) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory copying gradients");
    ps_status rc = st->be->ops->copy_to_host(st->be->impl, bounce, src, bytes, err);
    if (rc == PS_OK) rc = st->be->ops->copy_to_device(st->be->impl, dst, bounce, bytes, err);
    free(bounce);
    return rc;
}

/* ---------------------------------------------------------------- forward */

static void layer_params(stage *st, int l, float **w) {
    for (int j = 0; j < st->layers[l].nparams; j++) w[j] = st->w + st->slots[l].w_off[j];
}

static ps_status layer_forward(stage *st, tape_stage *ts, int l, int n, int train, const float *mask, ps_rng *rng,
                               ps_err *err) {
    ps_layer *ly = &st->layers[l];
    const ps_backend_ops *ops = st->be->ops;
    const void *x = ts->acts[l];
    int pl = prev_layout(st, l);
    if (ly->in_layout != pl) {  /* kept in the tape: backward needs the input in this layout */
        float *r = ps_backend_alloc_floats(st->be, ps_layer_in_count(ly, n));
        if (!r) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for activations");
        ts->rin[l] = r;
        ps_status rc = ops->reorder(st->be->impl, n, (int)ly->in.dims[0], (int)ly->in.dims[1], (int)ly->in.dims[2],
                                    x, pl, r, ly->in_layout, err);
        if (rc != PS_OK) return rc;
        x = r;
    }
    unsigned f = ly->kind->flags;
    if ((f & PS_KIND_VIEW) || ((f & PS_KIND_EVAL_VIEW) && !train)) {
        ts->acts[l + 1] = (void *)x;   /* a view of the input */
        ts->owned[l + 1] = 0;
        return PS_OK;
    }
    size_t ob = act_bytes(&ly->outs, ly->out_dtype, n);
    void *y = ops->alloc(st->be->impl, ob ? ob : 4);
    if (!y) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for activations");
    ts->acts[l + 1] = y;
    ts->owned[l + 1] = 1;
    float *w[PS_LAYER_MAX_PARAMS] = {0};
    layer_params(st, l, w);
    ps_layer_call c = {.ly = ly, .be = st->be, .n = n, .x = x, .y = y, .w = w, .saved = &ts->saved[l],
                       .train = train, .mask = mask, .rng = rng};
    return ly->kind->forward(&c, err);
}

/* Forward of t's stages on x (host). keep: x is copied (a training tape
 * outlives the caller's buffer). */
static ps_status forward_stages(ps_model *m, ps_tape *t, const void *x, int keep, const float *const *masks,
                                ps_rng *rng, ps_err *err) {
    int n = t->n;
    stage *s0 = &m->stages[t->first];
    const ps_layer *l0 = &s0->layers[0];
    size_t in_bytes = act_bytes(&l0->in, l0->in_dtype, n);
    ps_status rc = PS_OK;
    if (s0->host_memory && !keep) {
        t->st[t->first].acts[0] = (void *)x;
        t->st[t->first].owned[0] = 0;
    } else {
        void *xd = s0->be->ops->alloc(s0->be->impl, in_bytes ? in_bytes : 4);
        if (!xd) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for input");
        t->st[t->first].acts[0] = xd;
        t->st[t->first].owned[0] = 1;
        rc = s0->be->ops->copy_to_device(s0->be->impl, xd, x, in_bytes, err);
    }
    for (int s = t->first; s <= t->last && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        tape_stage *ts = &t->st[s];
        if (s > t->first) {
            stage *prev = &m->stages[s - 1];
            const ps_layer *pl = &prev->layers[prev->nlayers - 1];
            int owned;
            rc = cross_stage(prev, st, t->st[s - 1].acts[prev->nlayers], act_bytes(&pl->outs, pl->out_dtype, n),
                             &ts->acts[0], &owned, err);
            ts->owned[0] = (unsigned char)owned;
        }
        for (int l = 0; l < st->nlayers && rc == PS_OK; l++) {
            const ps_layer *ly = &st->layers[l];
            const float *mask = masks && ly->dropout_idx >= 0
                                    ? masks[ly->dropout_idx - m->stages[t->first].dropout_base] : NULL;
            rc = layer_forward(st, ts, l, n, t->train, mask, rng, err);
        }
    }
    return rc;
}

static ps_status tape_output(ps_model *m, const ps_tape *t, float *out, ps_err *err) {
    stage *last = &m->stages[t->last];
    const ps_layer *ly = &last->layers[last->nlayers - 1];
    return last->be->ops->copy_to_host(last->be->impl, out, t->st[t->last].acts[last->nlayers],
                                       act_bytes(&ly->outs, ly->out_dtype, t->n), err);
}

ps_status ps_tape_get_output(ps_model *m, const ps_tape *t, float *host_out, ps_err *err) {
    return tape_output(m, t, host_out, err);
}

float *ps_tape_output_writable(ps_tape *t) {
    stage *last = &t->m->stages[t->last];
    int l = last->nlayers - 1;
    const ps_layer *ly = &last->layers[l];
    if (!t->train || !last->host_memory || !(ly->kind->flags & PS_KIND_OUTPUT_FREE) || ly->out_dtype != PS_DTYPE_F32 ||
        !t->st[t->last].owned[l + 1])
        return NULL;
    return t->st[t->last].acts[l + 1];
}

ps_status ps_exec_check_run(const ps_model *m, int first, int last, ps_err *err) {
    if (first < 0 || last >= m->nstages || first > last)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stages %d..%d are not a run of the model's 0..%d", first,
                          last, m->nstages - 1);
    for (int s = first; s < last; s++) {
        if (m->stages[s + 1].def_index != m->stages[s].def_index + 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stages '%s' and '%s' are not consecutive in model '%s' "
                              "(the stage between them is hosted elsewhere): run them separately",
                              m->stages[s].def->name, m->stages[s + 1].def->name, m->def->name);
        const ps_layer *a = &m->stages[s].layers[m->stages[s].nlayers - 1], *b = &m->stages[s + 1].layers[0];
        if (!ps_shape_equal(&a->outs, &b->in) || a->out_dtype != b->in_dtype) {
            char b1[64], b2[64];
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stage '%s' (output %s) does not feed stage '%s' "
                              "(input %s %s): run them separately", m->stages[s].def->name,
                              ps_shape_format(&a->outs, b1, sizeof b1), m->stages[s + 1].def->name,
                              ps_shape_format(&b->in, b2, sizeof b2), ps_dtype_name(b->in_dtype));
        }
    }
    return PS_OK;
}

ps_status ps_exec_forward(ps_model *m, int first, int last, const void *x, int n, int train, int keep,
                          const float *const *masks, ps_rng *rng, float *out, ps_tape **tape, ps_err *err) {
    if (tape) *tape = NULL;
    ps_tape *t = tape_new(m, first, last, n);
    if (!t) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    t->train = train;
    ps_status rc = forward_stages(m, t, x, keep, masks, rng, err);
    if (rc == PS_OK && out) rc = tape_output(m, t, out, err);
    if (rc == PS_OK && keep && tape) *tape = t;
    else ps_tape_free(t);
    return rc;
}

/* --------------------------------------------------------------- backward */

/* What one backward computes before it is committed to the accumulator. */
typedef struct pending {
    float *dense[PS_MODEL_MAX_STAGES];  /* this tape's stage gradients */
    int fresh[PS_MODEL_MAX_STAGES];     /* dense[s] becomes acc's block (acc had none) */
    ps_rows *rows;                      /* per parameter */
} pending;

static void pending_free(ps_model *m, pending *p) {
    for (int s = 0; s < m->nstages; s++) ps_backend_release(m->stages[s].be, p->dense[s]);
    if (p->rows)
        for (int i = 0; i < m->nparams; i++) ps_rows_clear(&p->rows[i]);
    free(p->rows);
}

static ps_status stage_backward(ps_model *m, ps_tape *t, int s, void **carry, int *carry_owned, int want_dx,
                                pending *p, ps_err *err) {
    stage *st = &m->stages[s];
    tape_stage *ts = &t->st[s];
    const ps_backend_ops *ops = st->be->ops;
    int n = t->n;
    float *dy = *carry;
    int dy_owned = *carry_owned;
    ps_status rc = PS_OK;
    for (int l = st->nlayers - 1; l >= 0 && rc == PS_OK; l--) {
        ps_layer *ly = &st->layers[l];
        unsigned f = ly->kind->flags;
        int need_dx = want_dx || l > 0;
        if (!((f & PS_KIND_VIEW) || ((f & PS_KIND_EVAL_VIEW) && !t->train))) {
            float *dx = NULL;
            if (need_dx) {
                dx = ps_backend_alloc_floats(st->be, ps_layer_in_count(ly, n));
                if (!dx) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); break; }
            }
            float *w[PS_LAYER_MAX_PARAMS] = {0};
            layer_params(st, l, w);
            ps_layer_call c = {.ly = ly, .be = st->be, .n = n, .x = ts->rin[l] ? (void *)ts->rin[l] : ts->acts[l],
                               .y = ts->acts[l + 1], .w = w, .saved = &ts->saved[l], .train = 1, .dy = dy,
                               .dx = dx};
            for (int j = 0; j < ly->nparams; j++) {
                if (ly->param[j].sparse) c.rows = &p->rows[st->slots[l].param[j]];
                else c.dw[j] = p->dense[s] + st->slots[l].g_off[j];
            }
            rc = ly->kind->backward(&c, err);
            if (dy_owned) ps_backend_release(st->be, dy);
            dy = dx;
            dy_owned = dx != NULL;
        }   /* else a view: dy passes through unchanged */
        if (ts->rin[l] && dy && rc == PS_OK) {  /* back to the layout of this layer's input */
            float *r = ps_backend_alloc_floats(st->be, ps_layer_in_count(ly, n));
            if (!r) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); break; }
            rc = ops->reorder(st->be->impl, n, (int)ly->in.dims[0], (int)ly->in.dims[1], (int)ly->in.dims[2], dy,
                              ly->in_layout, r, prev_layout(st, l), err);
            if (dy_owned) ps_backend_release(st->be, dy);
            dy = r;
            dy_owned = 1;
        }
    }
    *carry = dy;
    *carry_owned = dy_owned;
    return rc;
}

static ps_status commit(ps_model *m, ps_grads *acc, pending *p, int first, int last, ps_err *err) {
    ps_status rc = PS_OK;
    for (int s = first; s <= last && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        if (!p->dense[s]) continue;
        if (p->fresh[s]) {
            acc->dense[s] = p->dense[s];
            p->dense[s] = NULL;
        } else {
            rc = st->be->ops->add(st->be->impl, st->ngrads, acc->dense[s], p->dense[s], err);
        }
    }
    for (int i = 0; i < m->nparams && rc == PS_OK; i++)
        if (p->rows[i].nrows) rc = ps_rows_merge(&acc->rows[i], &p->rows[i], err);
    return rc;
}

ps_status ps_exec_backward(ps_model *m, ps_tape *t, const float *grad_out, float *grad_in, ps_grads *acc,
                           ps_err *err) {
    if (!t || t->m != m || !acc || acc->m != m)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "tape or gradients of another model");
    if (!t->train) return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "an eval forward keeps no tape");
    stage *s0 = &m->stages[t->first];
    if (grad_in && s0->layers[0].in_dtype != PS_DTYPE_F32)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stage '%s' takes %s input: it has no input gradient",
                          s0->def->name, ps_dtype_name(s0->layers[0].in_dtype));
    int n = t->n;
    acc->sq_valid = 0;   /* its cached norm (grads.c) */
    pending p = {0};
    p.rows = calloc((size_t)m->nparams + 1, sizeof *p.rows);
    if (!p.rows) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    ps_status rc = PS_OK;
    for (int s = t->first; s <= t->last && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        if (!st->ngrads) continue;
        p.fresh[s] = acc->dense[s] == NULL;
        p.dense[s] = ps_backend_alloc_floats(st->be, st->ngrads);
        if (!p.dense[s]) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
    }
    void *carry = NULL;
    int carry_owned = 0;
    stage *carry_stage = NULL;

    for (int s = t->last; s >= t->first && rc == PS_OK; s--) {
        stage *st = &m->stages[s];
        const ps_layer *ll = &st->layers[st->nlayers - 1];
        size_t ob = act_bytes(&ll->outs, ll->out_dtype, n);
        if (s == t->last && st->host_memory) {   /* read in place: no backward writes its dy */
            carry = (void *)grad_out;
            carry_owned = 0;
        } else if (s == t->last) {   /* d loss / d output onto this stage's device */
            carry = st->be->ops->alloc(st->be->impl, ob ? ob : 4);
            carry_owned = 1;
            if (!carry) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); break; }
            rc = st->be->ops->copy_to_device(st->be->impl, carry, grad_out, ob, err);
        } else {
            void *moved;
            int moved_owned;
            rc = cross_stage(carry_stage, st, carry, ob, &moved, &moved_owned, err);
            if (rc == PS_OK && moved_owned) {
                if (carry_owned) ps_backend_release(carry_stage->be, carry);
                carry = moved;
                carry_owned = 1;
            }   /* else same memory space: hand over */
        }
        carry_stage = st;
        if (rc == PS_OK) rc = stage_backward(m, t, s, &carry, &carry_owned, s > t->first || grad_in, &p, err);
    }
    if (rc == PS_OK && grad_in)
        rc = s0->be->ops->copy_to_host(s0->be->impl, grad_in, carry,
                                       act_bytes(&s0->layers[0].in, PS_DTYPE_F32, n), err);
    if (carry_owned && carry) ps_backend_release(carry_stage->be, carry);
    if (rc == PS_OK) rc = commit(m, acc, &p, t->first, t->last, err);
    pending_free(m, &p);
    return rc;
}

