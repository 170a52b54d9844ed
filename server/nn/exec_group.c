/* exec_group.c - combined forwards: what lets one training forward over
 * several callers' samples stand in for each caller's own forward (psd's
 * batched Forwards, model.h ps_model_forward_group). Three pieces:
 *  - whether a run of stages may be combined at all: every node
 *    per-sample (ps_layer_per_sample; BatchNorm in training and other
 *    batch-coupled kinds never are);
 *  - each caller's dropout masks, drawn from its own stream exactly as its
 *    own forward would draw them, laid side by side for the combined one;
 *  - cutting the combined tape into each caller's tape: its slice of every
 *    storage and saved state the forward kept (all sample-major), copied,
 *    so that a backward of it is the backward of the caller's own forward
 *    (its own input and parameter gradients, nothing summed across
 *    callers). */
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
