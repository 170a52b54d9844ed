/* grads.c - accumulated parameter gradients of one context (see model.h):
 * a dense block per stage on the stage's device, allocated when a backward
 * first touches the stage, and row-sparse rows in host memory for embedding
 * tables (memory proportional to the rows touched, not to the table). */
#include "model_impl.h"
#include "loss.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

ps_grads *ps_grads_create(ps_model *m, ps_err *err) {
    ps_grads *g = calloc(1, sizeof *g);
    if (g) g->rows = calloc((size_t)m->nparams + 1, sizeof *g->rows);
    if (!g || !g->rows) {
        free(g);
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
        return NULL;
    }
    g->m = m;
    return g;
}

void ps_grads_free(ps_grads *g) {
    if (!g) return;
    ps_model *m = g->m;
    for (int s = 0; s < m->nstages; s++) ps_backend_release(m->stages[s].be, g->dense[s]);
    for (int i = 0; i < m->nparams; i++) ps_rows_clear(&g->rows[i]);
    for (int r = 0; r < g->nrecs; r++)
        for (int k = 0; k < g->recs[r].nstats; k++) free(g->recs[r].stats[k]);
    free(g->recs);
    free(g->rows);
    free(g);
}

/* Room for one more record. */
static fold_record *rec_push(ps_grads *g) {
    if (g->nrecs == g->caprecs) {
        int cap = g->caprecs ? 2 * g->caprecs : 8;
        fold_record *r = realloc(g->recs, (size_t)cap * sizeof *r);
        if (!r) return NULL;
        g->recs = r;
        g->caprecs = cap;
    }
    fold_record *r = &g->recs[g->nrecs];
    memset(r, 0, sizeof *r);
    return r;
}

ps_status ps_grads_record(ps_model *m, ps_grads *g, ps_tape *t, ps_err *err) {
    if (!t->train || t->folded) return PS_OK;
    ps_status rc = PS_OK;
    for (int s = t->first; s <= t->last && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        for (int o = 0; o < st->nlayers && rc == PS_OK; o++) {   /* forward order: a shared BatchNorm's sites */
            const int l = st->order[o];                          /* fold in the order PyTorch calls them */
            const ps_layer *ly = &st->layers[l];
            const float *dev[4];
            int64_t len[4];
            int k = ly->kind->stats ? ly->kind->stats(ly, &t->st[s].saved[l], dev, len) : 0;
            if (!k) continue;
            fold_record *r = rec_push(g);
            if (!r) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for running statistics");
            *r = (fold_record){.key = t->key, .seq = t->seq, .stage = s, .layer = l};
            for (int j = 0; j < k && rc == PS_OK; j++) {
                r->len[j] = len[j];
                if (!(r->stats[j] = malloc((size_t)len[j] * sizeof(float))))
                    rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for running statistics");
                else
                    rc = st->be->ops->copy_to_host(st->be->impl, r->stats[j], dev[j], (size_t)len[j] * sizeof(float),
                                                   err);
                r->nstats = j + 1;
            }
            g->nrecs++;
        }
    }
    if (rc == PS_OK) t->folded = 1;
    return rc;
}

/* dst gets copies of src's records (after its own). */
static ps_status recs_add(ps_grads *dst, const ps_grads *src, ps_err *err) {
    for (int r = 0; r < src->nrecs; r++) {
        const fold_record *sr = &src->recs[r];
        fold_record *d = rec_push(dst);
        if (!d) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for running statistics");
        *d = *sr;
        d->nstats = 0;
        dst->nrecs++;
        for (int k = 0; k < sr->nstats; k++) {
            if (!(d->stats[k] = malloc((size_t)sr->len[k] * sizeof(float))))
                return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for running statistics");
            memcpy(d->stats[k], sr->stats[k], (size_t)sr->len[k] * sizeof(float));
            d->nstats = k + 1;
        }
    }
    return PS_OK;
}

int ps_grads_touched(const ps_grads *g) {
    const ps_model *m = g->m;
    for (int s = 0; s < m->nstages; s++)
        if (g->dense[s]) return 1;
    for (int i = 0; i < m->nparams; i++)
        if (g->rows[i].nrows) return 1;
    return g->nrecs > 0;   /* running statistics alone (a stage of buffers and no parameters) */
}

size_t ps_grads_bytes(const ps_grads *g) {
    const ps_model *m = g->m;
    size_t b = sizeof *g + (size_t)m->nparams * sizeof *g->rows;
    for (int s = 0; s < m->nstages; s++)
        if (g->dense[s]) b += (size_t)m->stages[s].ngrads * sizeof(float);
    for (int i = 0; i < m->nparams; i++)
        b += (size_t)g->rows[i].nrows * (sizeof(int64_t) + (size_t)g->rows[i].width * sizeof(float));
    for (int r = 0; r < g->nrecs; r++) {
        b += sizeof g->recs[r];
        for (int k = 0; k < g->recs[r].nstats; k++) b += (size_t)g->recs[r].len[k] * sizeof(float);
    }
    return b;
}

ps_status ps_rows_merge(ps_rows *dst, const ps_rows *src, ps_err *err) {
    if (!src->nrows) return PS_OK;
    int64_t w = src->width;
    ps_rows r = {0};
    r.width = w;
    r.rows = malloc((size_t)(dst->nrows + src->nrows) * sizeof(int64_t));
    r.grad = malloc((size_t)(dst->nrows + src->nrows) * w * sizeof(float));
    if (!r.rows || !r.grad) {
        ps_rows_clear(&r);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory merging gradient rows");
    }
    int64_t a = 0, b = 0;
    while (a < dst->nrows || b < src->nrows) {   /* both sorted: a merge */
        float *out = r.grad + r.nrows * w;
        if (b >= src->nrows || (a < dst->nrows && dst->rows[a] < src->rows[b])) {
            r.rows[r.nrows] = dst->rows[a];
            memcpy(out, dst->grad + a * w, (size_t)w * sizeof(float));
            a++;
        } else if (a >= dst->nrows || src->rows[b] < dst->rows[a]) {
            r.rows[r.nrows] = src->rows[b];
            memcpy(out, src->grad + b * w, (size_t)w * sizeof(float));
            b++;
        } else {
            r.rows[r.nrows] = dst->rows[a];
            for (int64_t j = 0; j < w; j++) out[j] = dst->grad[a * w + j] + src->grad[b * w + j];
            a++;
            b++;
        }
        r.nrows++;
    }
    ps_rows_clear(dst);
    *dst = r;
    return PS_OK;
}

ps_status ps_grads_get(ps_model *m, const ps_grads *g, int i, float *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    return ps_grads_get_rows(m, g, i, 0, m->params[i].ndim ? m->params[i].dims[0] : 1, host_dst, err);
}

ps_status ps_grads_get_rows(ps_model *m, const ps_grads *g, int i, int64_t row0, int64_t nrows, float *host_dst,
                            ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    if (g->m != m) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradients of another model");
    const ps_param_info *pi = &m->params[i];
    size_t off, bytes;
    if (ps_model_row_range(pi->name, pi->ndim, pi->dims, pi->numel, sizeof(float), row0, nrows, &off, &bytes, err))
        return err->code;
    const param_loc *pl = &m->loc[i];
    if (pi->sparse) {   /* the touched rows (sorted) that fall in the range; zeros elsewhere */
        const ps_rows *r = &g->rows[i];
        memset(host_dst, 0, bytes);
        for (int64_t k = 0; k < r->nrows; k++)
            if (r->rows[k] >= row0 && r->rows[k] < row0 + nrows)
                memcpy(host_dst + (r->rows[k] - row0) * r->width, r->grad + k * r->width,
                       (size_t)r->width * sizeof(float));
        return PS_OK;
    }
    stage *st = &m->stages[pl->stage];
    if (!g->dense[pl->stage]) { memset(host_dst, 0, bytes); return PS_OK; }
    return st->be->ops->copy_to_host(st->be->impl, host_dst, g->dense[pl->stage] + pl->goff + off / sizeof(float),
                                     bytes, err);
}

ps_status ps_grads_add(ps_model *m, ps_grads *dst, const ps_grads *src, ps_err *err) {
    if (dst->m != m || src->m != m) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradients of another model");
    dst->sq_valid = 0;
    ps_status rc = PS_OK;
    for (int s = 0; s < m->nstages && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        if (!src->dense[s]) continue;
        if (dst->dense[s]) {
            rc = st->be->ops->add(st->be->impl, st->ngrads, dst->dense[s], src->dense[s], err);
            continue;
        }
        float *b = ps_backend_alloc_floats(st->be, st->ngrads);
        if (!b) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
        rc = ps_stage_copy(st, b, src->dense[s], st->ngrads, err);
        if (rc == PS_OK) dst->dense[s] = b;
        else ps_backend_release(st->be, b);
    }
    for (int i = 0; i < m->nparams && rc == PS_OK; i++) rc = ps_rows_merge(&dst->rows[i], &src->rows[i], err);
    if (rc == PS_OK) rc = recs_add(dst, src, err);
    return rc;
}

ps_status ps_grads_scale(ps_model *m, ps_grads *g, float s, ps_err *err) {
    if (g->m != m) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradients of another model");
    g->sq_valid = 0;
    ps_status rc = PS_OK;
    for (int k = 0; k < m->nstages && rc == PS_OK; k++) {
        stage *st = &m->stages[k];
        if (!g->dense[k]) continue;
        if (st->be->ops->scale) {
            rc = st->be->ops->scale(st->be->impl, st->ngrads, g->dense[k], s, err);
            continue;
        }
        float *h = malloc((size_t)st->ngrads * sizeof(float));   /* a backend without scale */
        if (!h) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory scaling gradients");
        rc = st->be->ops->copy_to_host(st->be->impl, h, g->dense[k], (size_t)st->ngrads * sizeof(float), err);
        for (int64_t j = 0; rc == PS_OK && j < st->ngrads; j++) h[j] *= s;
        if (rc == PS_OK)
            rc = st->be->ops->copy_to_device(st->be->impl, g->dense[k], h, (size_t)st->ngrads * sizeof(float), err);
        free(h);
    }
    for (int i = 0; i < m->nparams; i++)
        for (int64_t j = 0; j < g->rows[i].nrows * g->rows[i].width; j++) g->rows[i].grad[j] *= s;
    return rc;
}

static ps_status grads_sq(ps_model *m, const ps_grads *g, double *out, ps_err *err);

int ps_grads_check_finite(ps_model *m, const ps_grads *g, int *param, int64_t *elem) {
    if (g->m != m) return -1;
    /* One vectorised pass: squares summed in double are finite exactly
     * when every value is (a float's square is below 1.2e77, so no sum of
     * finite values overflows). The element is looked for only when not. */
    double sq;
    ps_err e;
    if (grads_sq(m, g, &sq, &e) == PS_OK && isfinite(sq)) return 1;
    float *h[PS_MODEL_MAX_STAGES] = {0};
    int result = 1;
    for (int s = 0; s < m->nstages && result == 1; s++) {
        stage *st = &m->stages[s];
        if (!g->dense[s]) continue;
        ps_err err;
        if (st->host_memory) { h[s] = g->dense[s]; continue; }
        float *b = malloc((size_t)st->ngrads * sizeof(float));
        if (!b || st->be->ops->copy_to_host(st->be->impl, b, g->dense[s], (size_t)st->ngrads * sizeof(float), &err)) {
            free(b);
            result = -1;
            break;
        }
        h[s] = b;
    }
    for (int i = 0; i < m->nparams && result == 1; i++) {
        const param_loc *pl = &m->loc[i];
        if (m->params[i].sparse) {
            const ps_rows *r = &g->rows[i];
            for (int64_t k = 0; k < r->nrows && result == 1; k++)
                for (int64_t j = 0; j < r->width; j++)
                    if (!isfinite(r->grad[k * r->width + j])) {
                        if (param) *param = i;
                        if (elem) *elem = r->rows[k] * r->width + j;
                        result = 0;
                        break;
                    }
            continue;
        }
        const float *d = h[pl->stage];
        if (!d) continue;
        for (int64_t j = 0; j < m->params[i].numel; j++)
            if (!isfinite(d[pl->goff + j])) {
                if (param) *param = i;
                if (elem) *elem = j;
                result = 0;
                break;
            }
    }
    for (int s = 0; s < m->nstages; s++)
        if (!m->stages[s].host_memory) free(h[s]);
    return result;
}

ps_status ps_grads_add_dense(ps_model *m, ps_grads *g, int i, const float *host_src, ps_err *err) {
    if (g->m != m) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradients of another model");
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    if (m->params[i].sparse)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s is row-sparse; only dense gradients can be added",
                          m->params[i].name);
    const param_loc *pl = &m->loc[i];
    stage *st = &m->stages[pl->stage];
    g->sq_valid = 0;
    size_t n = (size_t)m->params[i].numel;
    float *h = malloc(n * sizeof(float) + 1);
    if (!h) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
    ps_status rc = PS_OK;
    int fresh = !g->dense[pl->stage];
    if (fresh) {   /* a new block: zero, then this parameter */
        float *b = ps_backend_alloc_floats(st->be, st->ngrads);
        float *z = b ? calloc((size_t)st->ngrads + 1, sizeof(float)) : NULL;
        if (!b || !z) {
            ps_backend_release(st->be, b);
            free(z);
            free(h);
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
        }
        rc = st->be->ops->copy_to_device(st->be->impl, b, z, (size_t)st->ngrads * sizeof(float), err);
        free(z);
        if (rc) { ps_backend_release(st->be, b); free(h); return rc; }
        g->dense[pl->stage] = b;
    }
    float *dst = g->dense[pl->stage] + pl->goff;
    rc = st->be->ops->copy_to_host(st->be->impl, h, dst, n * sizeof(float), err);
    for (size_t k = 0; rc == PS_OK && k < n; k++) h[k] += host_src[k];
    if (rc == PS_OK) rc = st->be->ops->copy_to_device(st->be->impl, dst, h, n * sizeof(float), err);
    free(h);
    return rc;
}

ps_status ps_grads_sq_norm(ps_model *m, const ps_grads *g, double *out, ps_err *err) {
    if (g->m != m) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradients of another model");
    return grads_sq(m, g, out, err);
}

/* The sum of squares, computed once per content (g->sq caches it: a
 * Backward checks its gradients are finite and answers their norm). The
 * cache is not shared state: a ps_grads belongs to one context. */
static ps_status grads_sq(ps_model *m, const ps_grads *g, double *out, ps_err *err) {
    if (g->sq_valid) {
        *out = g->sq;
        return PS_OK;
    }
    double s = 0;
    for (int k = 0; k < m->nstages; k++) {
        stage *st = &m->stages[k];
        if (!g->dense[k]) continue;
        const float *h = g->dense[k];
        float *b = NULL;
        if (!st->host_memory && st->be->ops->sum_squares) {   /* on the device: one double comes back */
            double part;
            ps_status rc = st->be->ops->sum_squares(st->be->impl, g->dense[k], st->ngrads, &part, err);
            if (rc) return rc;
            s += part;
            continue;
        }
        if (!st->host_memory) {
            b = malloc((size_t)st->ngrads * sizeof(float) + 1);
            if (!b) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the gradient norm");
            ps_status rc = st->be->ops->copy_to_host(st->be->impl, b, g->dense[k], (size_t)st->ngrads * sizeof(float), err);
            if (rc) { free(b); return rc; }
            h = b;
        }
        s += ps_sum_squares(h, st->ngrads);
        free(b);
    }
    for (int i = 0; i < m->nparams; i++) s += ps_sum_squares(g->rows[i].grad, g->rows[i].nrows * g->rows[i].width);
    *out = s;
    ((ps_grads *)g)->sq = s;   /* a cache of g's own content */
    ((ps_grads *)g)->sq_valid = 1;
    return PS_OK;
}
