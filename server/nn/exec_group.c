/* exec_group.c - combined forwards and backwards: what lets one training
 * forward over several callers' samples stand in for each caller's own
 * forward (psd's batched Forwards, model.h ps_model_forward_group), and one
 * backward for each caller's own (ps_model_backward_group). The pieces:
 *  - whether a run of stages may be combined at all: every node
 *    per-sample (ps_layer_per_sample; BatchNorm in training and other
 *    batch-coupled kinds never are);
 *  - each caller's dropout masks, drawn from its own stream exactly as its
 *    own forward would draw them, laid side by side for the combined one;
 *  - cutting the combined tape into each caller's tape: its slice of every
 *    storage and saved state the forward kept (all sample-major), copied,
 *    so that a backward of it is the backward of the caller's own forward
 *    (its own input and parameter gradients, nothing summed across
 *    callers);
 *  - the reverse for combined backwards: several callers' tapes laid side
 *    by side into one, and a node with parameters computed as one call
 *    for every caller's input gradient plus one parameter-gradient call
 *    per caller on its own slice (each caller keeps its own parameter
 *    gradients) - or, for a kind with PS_KIND_BWD_PARTS, one call told each
 *    caller's slice and gradients (ps_layer_parts): MultiheadAttention,
 *    whose parameter gradients need its whole backward, and Conv2d/Conv1d,
 *    whose backend may compute every caller's weight gradient in one call
 *    (backend.h conv2d_wgrad_parts: one GEMM over every image on a GPU). */
#include "model_impl.h"

#include <stdlib.h>
#include <string.h>

#include "rng.h"

int ps_exec_group_ok(const ps_model *m, int first, int last) {
    for (int s = first; s <= last; s++) {
        const stage *st = &m->stages[s];
        for (int l = 0; l < st->nlayers; l++) {
            size_t sz[PS_LAYER_MAX_SAVED];
            if (!ps_layer_per_sample(&st->layers[l], st->be, 1, sz)) return 0;
        }
    }
    return 1;
}

/* The run's d-th dropout node (executor order), or NULL. */
static const ps_layer *dropout_node(const ps_model *m, int first, int last, int d) {
    int base = m->stages[first].dropout_base;
    for (int s = first; s <= last; s++) {
        const stage *st = &m->stages[s];
        for (int l = 0; l < st->nlayers; l++)
            if (st->layers[l].dropout_idx >= 0 && st->layers[l].dropout_idx - base == d) return &st->layers[l];
    }
    return NULL;
}

int ps_exec_group_ndropout(const ps_model *m, int first, int last) {
    int n = 0;
    for (int s = first; s <= last; s++)
        for (int l = 0; l < m->stages[s].nlayers; l++) n += m->stages[s].layers[l].dropout_idx >= 0;
    return n;
}

int64_t ps_exec_group_mask_len(const ps_model *m, int first, int last, int d, int n) {
    const ps_layer *ly = dropout_node(m, first, last, d);
    return ly ? ps_layer_dropout_draws(ly, n) : 0;
}

void ps_exec_group_masks(const ps_model *m, int first, int last, uint64_t seed, int off, int n, int total,
                         float *const *masks) {
    ps_rng rng;
    ps_rng_seed(&rng, seed);
    int base = m->stages[first].dropout_base;
    for (int s = first; s <= last; s++) {   /* forward_stages' order: stages, then each one's node order */
        const stage *st = &m->stages[s];
        for (int k = 0; k < st->nlayers; k++) {
            const ps_layer *ly = &st->layers[st->order[k]];
            if (ly->dropout_idx < 0) continue;
            int64_t per = ps_layer_dropout_draws(ly, total) / total;
            ps_layer_dropout_mask(ly, n, &rng, masks[ly->dropout_idx - base] + (int64_t)off * per);
        }
    }
}

/* bytes at byte offset off of src (stage st's memory) into a new buffer. */
static ps_status copy_slice(stage *st, const void *src, size_t off, size_t bytes, void **dst, ps_err *err) {
    *dst = st->be->ops->alloc(st->be->impl, bytes ? bytes : 4);
    if (!*dst) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory cutting a combined forward");
    if (st->host_memory) {
        memcpy(*dst, (const char *)src + off, bytes);
        return PS_OK;
    }
    if (off % sizeof(float) || bytes % sizeof(float))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "stage '%s': a saved state of %zu bytes per part is "
                          "not whole floats", st->def->name, bytes);
    return ps_stage_copy(st, *dst, (const float *)((const char *)src + off), (int64_t)(bytes / sizeof(float)), err);
}

ps_status ps_exec_tape_slice(ps_model *m, const ps_tape *big, int off, int n, ps_tape **out, ps_err *err) {
    *out = NULL;
    int total = big->n;
    ps_tape *t = ps_exec_tape_new(m, big->first, big->last, n);
    if (!t) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    t->train = big->train;
    ps_status rc = PS_OK;
    for (int s = big->first; s <= big->last && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        const tape_stage *bs = &big->st[s];
        tape_stage *ts = &t->st[s];
        ts->w = bs->w;
        ts->bufw = bs->bufw;
        for (int b = 0; b < st->plan[1].nbufs && rc == PS_OK; b++) {
            if (!bs->buf[b]) continue;
            size_t per = ps_exec_buf_bytes(st, b, total) / (size_t)total;
            rc = copy_slice(st, bs->buf[b], per * (size_t)off, per * (size_t)n, &ts->buf[b], err);
            if (ts->buf[b]) ts->owned[b] = 1;
        }
        for (int l = 0; l < st->nlayers && rc == PS_OK; l++) {
            size_t all[PS_LAYER_MAX_SAVED], part[PS_LAYER_MAX_SAVED];
            if (!ps_layer_per_sample(&st->layers[l], st->be, total, all) ||
                !ps_layer_per_sample(&st->layers[l], st->be, n, part)) {
                rc = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "node '%s' is not per-sample: its forward cannot "
                                "be combined", st->layers[l].name);
                break;
            }
            for (int j = 0; j < PS_LAYER_MAX_SAVED && rc == PS_OK; j++) {
                if (!bs->saved[l].dev[j]) continue;
                if (all[j] % (size_t)total || all[j] / (size_t)total * (size_t)n != part[j]) {
                    rc = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "node '%s': its saved state (%zu bytes for %d "
                                    "samples, %zu for %d) is not the same per sample", st->layers[l].name, all[j],
                                    total, part[j], n);
                    break;
                }
                rc = copy_slice(st, bs->saved[l].dev[j], all[j] / (size_t)total * (size_t)off, part[j],
                                &ts->saved[l].dev[j], err);
            }
        }
    }
    if (rc != PS_OK) {
        ps_tape_free(t);
        return rc;
    }
    *out = t;
    return PS_OK;
}

/* ---- combined backwards ---- */

/* bytes of src into dst at byte offset off (stage st's memory). */
static ps_status copy_into(stage *st, void *dst, size_t off, const void *src, size_t bytes, ps_err *err) {
    if (!bytes) return PS_OK;
    if (st->host_memory) {
        memcpy((char *)dst + off, src, bytes);
        return PS_OK;
    }
    if (off % sizeof(float) || bytes % sizeof(float))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "stage '%s': a saved state of %zu bytes per part is "
                          "not whole floats", st->def->name, bytes);
    return ps_stage_copy(st, (float *)((char *)dst + off), src, (int64_t)(bytes / sizeof(float)), err);
}

/* A new buffer of per * total bytes holding each part's per * n[i] bytes
 * of src[i] side by side (stage st's memory). */
static ps_status concat_bytes(stage *st, const void *const *src, const int *n, int k, size_t per, int total,
                              void **dst, ps_err *err) {
    size_t bytes = per * (size_t)total;
    *dst = st->be->ops->alloc(st->be->impl, bytes ? bytes : 4);
    if (!*dst) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory combining backwards");
    ps_status rc = PS_OK;
    for (int i = 0, o = 0; i < k && rc == PS_OK; o += n[i++]) rc = copy_into(st, *dst, per * (size_t)o, src[i], per * (size_t)n[i], err);
    return rc;
}

ps_status ps_exec_tape_concat(ps_model *m, ps_tape *const *parts, int k, ps_tape **out, ps_err *err) {
    *out = NULL;
    int first = parts[0]->first, last = parts[0]->last, total = 0;
    for (int i = 0; i < k; i++) {
        if (parts[i]->first != first || parts[i]->last != last || !parts[i]->train)
            return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "backwards of different stages or of an eval forward "
                              "are not combined");
        if (total > (1 << 24) - parts[i]->n)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "too many samples to combine");
        total += parts[i]->n;
    }
    if (!ps_exec_group_ok(m, first, last))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "stages %s..%s have a node that is not per-sample: their "
                          "backwards are not combined", m->stages[first].def->name, m->stages[last].def->name);
    const void **src = malloc((size_t)k * sizeof *src);
    int *n = malloc((size_t)k * sizeof *n);
    ps_tape *t = src && n ? ps_exec_tape_new(m, first, last, total) : NULL;
    if (!t) {
        free(src);
        free(n);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int i = 0; i < k; i++) n[i] = parts[i]->n;
    t->train = 1;
    ps_status rc = PS_OK;
    for (int s = first; s <= last && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        tape_stage *ts = &t->st[s];
        for (int b = 0; b < st->plan[1].nbufs && rc == PS_OK; b++) {
            int have = 0;
            for (int i = 0; i < k; i++) have += (src[i] = parts[i]->st[s].buf[b]) != NULL;
            if (!have) continue;
            if (have != k) {
                rc = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "stage '%s': the tapes kept different storages",
                                st->def->name);
                break;
            }
            rc = concat_bytes(st, src, n, k, ps_exec_buf_bytes(st, b, 1), total, &ts->buf[b], err);
            if (ts->buf[b]) ts->owned[b] = 1;
        }
        for (int l = 0; l < st->nlayers && rc == PS_OK; l++) {
            size_t one[PS_LAYER_MAX_SAVED], all[PS_LAYER_MAX_SAVED];
            if (!ps_layer_per_sample(&st->layers[l], st->be, 1, one) ||
                !ps_layer_per_sample(&st->layers[l], st->be, total, all)) {
                rc = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "node '%s' is not per-sample", st->layers[l].name);
                break;
            }
            for (int j = 0; j < PS_LAYER_MAX_SAVED && rc == PS_OK; j++) {
                int have = 0;
                for (int i = 0; i < k; i++) have += (src[i] = parts[i]->st[s].saved[l].dev[j]) != NULL;
                if (!have) continue;
                if (have != k || all[j] != one[j] * (size_t)total) {
                    rc = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "node '%s': its saved state is not the same "
                                    "per sample in every tape", st->layers[l].name);
                    break;
                }
                rc = concat_bytes(st, src, n, k, one[j], total, &ts->saved[l].dev[j], err);
            }
        }
    }
    free(src);
    free(n);
    if (rc != PS_OK) {
        ps_tape_free(t);
        return rc;
    }
    *out = t;
    return PS_OK;
}

/* p + bytes (NULL stays NULL). */
static const void *at(const void *p, size_t bytes) { return p ? (const char *)p + bytes : NULL; }

/* A PS_KIND_BWD_PARTS node: one call of its backward, each part's
 * parameter gradients handed to it (ps_layer_parts). */
static ps_status node_backward_parts(stage *st, const ps_layer_call *c, int l, int s, const ps_bwd_parts *parts,
                                     ps_err *err) {
    const ps_layer *ly = c->ly;
    for (int j = 0; j < ly->nparams; j++)
        if (ly->param[j].sparse)
            return ps_err_set(err, PS_ERR_INTERNAL, "node '%s': a kind that computes each part's parameter "
                              "gradients has a row-sparse parameter", ly->name);
    float **dw = calloc((size_t)parts->k * PS_LAYER_MAX_PARAMS, sizeof *dw);
    ps_dw_sites *f = calloc((size_t)parts->k, sizeof *f);   /* shared parameters: each part's scratch */
    if (!dw || !f) {
        free(dw);
        free(f);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory combining backwards");
    }
    ps_status rc = PS_OK;
    int begun = 0;
    for (int p = 0; p < parts->k && rc == PS_OK; p++, begun++) {
        ps_rows *none;   /* no row-sparse parameter here (above) */
        rc = ps_exec_dw_begin(st, l, parts->dense[p * PS_MODEL_MAX_STAGES + s], NULL,
                              dw + (size_t)p * PS_LAYER_MAX_PARAMS, &none, &f[p], err);
        if (rc != PS_OK) break;
    }
    if (rc == PS_OK) {
        const ps_layer_parts lp = {parts->k, parts->off, parts->n, dw};
        ps_layer_call w = *c;
        memset(w.dw, 0, sizeof w.dw);
        w.rows = NULL;
        w.parts = &lp;
        rc = ly->kind->backward(&w, err);
    }
    for (int p = 0; p < begun; p++) rc = ps_exec_dw_end(st, l, &f[p], rc, err);
    free(dw);
    free(f);
    return rc;
}

ps_status ps_exec_group_node_backward(stage *st, const ps_layer_call *c, int l, int s, const ps_bwd_parts *parts,
                                      ps_err *err) {
    const ps_layer *ly = c->ly;
    if (ly->flags & PS_KIND_BWD_PARTS) return node_backward_parts(st, c, l, s, parts, err);
    ps_status rc = PS_OK;
    size_t one[PS_LAYER_MAX_SAVED];
    if (!ps_layer_per_sample(ly, st->be, 1, one))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "node '%s' is not per-sample", ly->name);
    size_t in_per[PS_NODE_MAX_INPUTS];
    for (int i = 0; i < ly->nin; i++) in_per[i] = (size_t)ps_shape_numel(&ly->in[i]) * ps_dtype_size(ly->in_dtype[i]);
    size_t out_per = (size_t)ps_shape_numel(&ly->outs) * ps_dtype_size(ly->out_dtype);
    float *no_dx[PS_NODE_MAX_INPUTS] = {0};
    for (int p = 0; p < parts->k && rc == PS_OK; p++) {   /* each part's parameter gradients, from its samples */
        size_t o = (size_t)parts->off[p];
        const void *xs[PS_NODE_MAX_INPUTS];
        for (int i = 0; i < ly->nin; i++) xs[i] = at(c->xs[i], in_per[i] * o);
        ps_layer_saved sv = {{0}};
        for (int j = 0; j < PS_LAYER_MAX_SAVED; j++) sv.dev[j] = (void *)at(c->saved->dev[j], one[j] * o);
        ps_layer_call pc = *c;
        pc.n = parts->n[p];
        pc.xs = xs;
        pc.x = xs[0];
        pc.y = (void *)at(c->y, out_per * o);
        pc.dy = at(c->dy, (size_t)ps_layer_out_count(ly, 1) * sizeof(float) * o);
        pc.saved = &sv;
        pc.dxs = no_dx;
        pc.dx = NULL;
        ps_dw_sites f;
        rc = ps_exec_dw_begin(st, l, parts->dense[p * PS_MODEL_MAX_STAGES + s], parts->rows[p], pc.dw, &pc.rows, &f,
                              err);
        if (rc == PS_OK) rc = ps_exec_dw_end(st, l, &f, ly->kind->backward(&pc, err), err);
    }
    int any_dx = 0;
    for (int i = 0; i < ly->nin; i++) any_dx |= c->dxs[i] != NULL;
    if (rc == PS_OK && any_dx) {   /* then every part's input gradients at once (dx may overwrite dy) */
        ps_layer_call w = *c;
        memset(w.dw, 0, sizeof w.dw);
        w.rows = NULL;
        rc = ly->kind->backward(&w, err);
    }
    return rc;
}
