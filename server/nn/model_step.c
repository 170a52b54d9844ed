/* model_step.c - the optimizer step of a hosted model (see model.h): the
 * gradients as the optimizer sees them (dense, or row-sparse copied to the
 * device), the updates in place or from the current copy of the weights
 * into a spare one published with the new version (snapshot steps,
 * model.c), and the running statistics (BatchNorm) folded in at the step. */
#include "model_impl.h"
#include "prof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One parameter's gradient as the optimizer sees it: dense (on the
 * stage's device) or row-sparse (host rows). */
typedef struct param_grad {
    const float *dense;
    const ps_rows *rows;
    const int64_t *idx;      /* rows->rows where the optimizer reads them: host, or the copy below */
    const float *grad;       /* rows->grad likewise */
    int64_t *dev_idx;        /* (nrows) copies on a device stage's device, made before the step */
    float *dev_grad;         /* (nrows, width) */
} param_grad;

/* One optimizer update of parameter i through the optimizer module (its
 * dense or row-sparse rule, optim.h). Runs under the exclusive lock, after
 * every allocation, copy and check of the step: it only computes and
 * writes. The rows are distinct and in range by construction of ps_rows
 * (merged, sorted, ids checked at the forward) and the spec passed
 * ps_optim_check for both rules at creation, hence the unchecked
 * row-sparse entry. */
static ps_status update_param(ps_model *m, int i, const param_grad *g, float *const *wbase, ps_err *err) {
    const param_loc *pl = &m->loc[i];
    stage *st = &m->stages[pl->stage];
    float *w = wbase[pl->stage] + pl->off;
    if (g->dense) return ps_optim_step(st->be, &m->optim, m->params[i].numel, w, g->dense, &m->ost[i], err);
    return ps_optim_step_rows_checked(st->be, &m->optim, g->rows->width, g->idx, g->rows->nrows, w, g->grad,
                                      &m->ost[i], err);
}

/* A snapshot step's dense stages (see "Snapshot steps", model.c): their
 * next version written into copy next from the current copy cur in one
 * pass - each parameter with a gradient stepped out of place (the
 * optimizer reads cur and writes next; its state is updated in place, as
 * in place), each without one copied, and the float32 buffers copied
 * (the folds then update them in next). A stage's parameters tile its
 * weight block (model_build.c), so every float of next is written. After
 * a failed update the remaining parameters are still copied, so next
 * holds what an in-place step leaves behind when it stops there.
 * *wrote: some parameter was stepped. */
static ps_status write_dense_next(ps_model *m, const param_grad *pg, const wset *cur, wset *next, int *wrote,
                                  ps_err *err) {
    ps_status rc = PS_OK;
    for (int s = 0; s < m->nstages; s++) {
        stage *st = &m->stages[s];
        if (st->inplace || !st->nbufw) continue;
        ps_status c = ps_stage_copy(st, next->bufw[s], cur->bufw[s], st->nbufw, rc == PS_OK ? err : NULL);
        if (rc == PS_OK) rc = c;
    }
    for (int i = 0; i < m->nparams; i++) {
        const param_loc *pl = &m->loc[i];
        stage *st = &m->stages[pl->stage];
        if (st->inplace) continue;   /* written in place, under rows_lock */
        float *dst = next->w[pl->stage] + pl->off;
        const float *src = cur->w[pl->stage] + pl->off;
        const int64_t n = m->params[i].numel;
        if (rc == PS_OK && pg[i].dense) {
            rc = ps_optim_step_to(st->be, &m->optim, n, dst, src, pg[i].dense, &m->ost[i], err);
            *wrote = 1;
            continue;
        }
        PS_ASSERT(!pg[i].rows);   /* a row-sparse parameter makes its stage in place (model_build.c) */
        ps_status c = ps_stage_copy(st, dst, src, n, rc == PS_OK ? err : NULL);
        if (rc == PS_OK) rc = c;
    }
    return rc;
}

/* Put parameter i's gradient rows where its stage's optimizer ops read
 * them (a device stage: copies on the device). */
static ps_status stage_rows(ps_model *m, int i, const ps_rows *r, param_grad *pg, ps_err *err) {
    stage *st = &m->stages[m->loc[i].stage];
    pg->rows = r;
    pg->idx = r->rows;
    pg->grad = r->grad;
    if (st->host_memory) return PS_OK;
    const ps_backend_ops *ops = st->be->ops;
    const size_t ib = (size_t)r->nrows * sizeof(int64_t), gb = (size_t)r->nrows * r->width * sizeof(float);
    pg->dev_idx = ops->alloc(st->be->impl, ib);
    pg->dev_grad = ops->alloc(st->be->impl, gb ? gb : sizeof(float));
    if (!pg->dev_idx || !pg->dev_grad)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of device memory for the %s step", m->params[i].name);
    ps_status rc = ops->copy_to_device(st->be->impl, pg->dev_idx, r->rows, ib, err);
    if (rc == PS_OK) rc = ops->copy_to_device(st->be->impl, pg->dev_grad, r->grad, gb, err);
    pg->idx = pg->dev_idx;
    pg->grad = pg->dev_grad;
    return rc;
}

/* ---- running statistics: the folds a step applies ---- */

/* The nodes g's records touch, each with host copies of its float32
 * buffers; the records in fold order. Built before the weights lock. A
 * node that uses another's buffers (share: of a BatchNorm called at several
 * sites, layer_slot.buf_owner) is that node here: every site folds into
 * the one host copy, in record order. */
typedef struct fold_plan {
    int *order;              /* (nrecs) record indices in (key, seq) order, stable */
    int nlayers;
    int (*at)[2];            /* (nlayers) stage, layer */
    float *(*fbuf)[PS_LAYER_MAX_BUFFERS]; /* per node: host copies of its float32 buffers */
} fold_plan;

static const ps_grads *g_sort;   /* qsort has no context; the sort runs under fold_mu */
static pthread_mutex_t fold_mu = PTHREAD_MUTEX_INITIALIZER;

/* The node whose buffers a record of (stage s, layer l) folds into. */
static int buffers_of(const ps_model *m, int s, int l) {
    int o = m->stages[s].slots[l].buf_owner;
    return o >= 0 ? o : l;
}

/* The index in fp of the node whose buffers rec folds into, -1 if none yet. */
static int plan_node(const ps_model *m, const fold_plan *fp, const fold_record *rec) {
    int l = buffers_of(m, rec->stage, rec->layer);
    for (int k = 0; k < fp->nlayers; k++)
        if (fp->at[k][0] == rec->stage && fp->at[k][1] == l) return k;
    return -1;
}

static int cmp_rec(const void *a, const void *b) {
    const fold_record *x = &g_sort->recs[*(const int *)a], *y = &g_sort->recs[*(const int *)b];
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return *(const int *)a - *(const int *)b;   /* stable */
}

static void fold_plan_free(fold_plan *fp) {
    for (int k = 0; fp->fbuf && k < fp->nlayers; k++)
        for (int j = 0; j < PS_LAYER_MAX_BUFFERS; j++) free(fp->fbuf[k][j]);
    free(fp->fbuf);
    free(fp->at);
    free(fp->order);
}

static ps_status fold_prepare(ps_model *m, const ps_grads *g, fold_plan *fp, ps_err *err) {
    memset(fp, 0, sizeof *fp);
    if (!g->nrecs) return PS_OK;
    fp->order = malloc((size_t)g->nrecs * sizeof *fp->order);
    fp->at = calloc((size_t)g->nrecs, sizeof *fp->at);
    fp->fbuf = calloc((size_t)g->nrecs, sizeof *fp->fbuf);
    if (!fp->order || !fp->at || !fp->fbuf) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the step");
    for (int r = 0; r < g->nrecs; r++) fp->order[r] = r;
    pthread_mutex_lock(&fold_mu);
    g_sort = g;
    qsort(fp->order, (size_t)g->nrecs, sizeof *fp->order, cmp_rec);
    pthread_mutex_unlock(&fold_mu);
    for (int r = 0; r < g->nrecs; r++) {
        const fold_record *rec = &g->recs[r];
        if (plan_node(m, fp, rec) >= 0) continue;
        int k = fp->nlayers++;
        fp->at[k][0] = rec->stage;
        fp->at[k][1] = buffers_of(m, rec->stage, rec->layer);
        const ps_layer *ly = &m->stages[rec->stage].layers[fp->at[k][1]];
        for (int j = 0; j < ly->nbuffers; j++)
            if (ly->buffer[j].dtype == PS_DTYPE_F32 &&
                !(fp->fbuf[k][j] = malloc((size_t)ly->buffer[j].numel * sizeof(float))))
                return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the step");
    }
    return PS_OK;
}

/* With the step's hold on the weights: every record, in order, into the
 * buffers of the copy being written (bufw, per stage). */
static ps_status fold_apply(ps_model *m, const ps_grads *g, fold_plan *fp, float *const *bufw, ps_err *err) {
    ps_status rc = PS_OK;
    for (int k = 0; k < fp->nlayers && rc == PS_OK; k++) {   /* the float32 buffers to the host */
        stage *st = &m->stages[fp->at[k][0]];
        const ps_layer *ly = &st->layers[fp->at[k][1]];
        for (int j = 0; j < ly->nbuffers && rc == PS_OK; j++)
            if (fp->fbuf[k][j])
                rc = st->be->ops->copy_to_host(st->be->impl, fp->fbuf[k][j], bufw[fp->at[k][0]] + st->slots[fp->at[k][1]].b_off[j],
                                               (size_t)ly->buffer[j].numel * sizeof(float), err);
    }
    for (int r = 0; r < g->nrecs && rc == PS_OK; r++) {
        const fold_record *rec = &g->recs[fp->order[r]];
        int k = plan_node(m, fp, rec);
        PS_ASSERT(k >= 0 && "fold_prepare planned every record's node");
        stage *st = &m->stages[rec->stage];
        const ps_layer *ly = &st->layers[rec->layer];
        int64_t *ibuf[PS_LAYER_MAX_BUFFERS] = {0};
        for (int j = 0; j < ly->nbuffers; j++)
            if (ly->buffer[j].dtype == PS_DTYPE_I64) ibuf[j] = st->bufi + st->slots[rec->layer].b_off[j];
        ly->kind->fold(ly, fp->fbuf[k], ibuf, (const float *const *)rec->stats);
    }
    for (int k = 0; k < fp->nlayers && rc == PS_OK; k++) {   /* and back */
        stage *st = &m->stages[fp->at[k][0]];
        const ps_layer *ly = &st->layers[fp->at[k][1]];
        for (int j = 0; j < ly->nbuffers && rc == PS_OK; j++)
            if (fp->fbuf[k][j])
                rc = st->be->ops->copy_to_device(st->be->impl, bufw[fp->at[k][0]] + st->slots[fp->at[k][1]].b_off[j],
                                                 fp->fbuf[k][j], (size_t)ly->buffer[j].numel * sizeof(float), err);
    }
    return rc;
}

/* A copy no call reads, for the next version (step_mu held; with the
 * weights lock shared): a free one, a new one while fewer than PS_WSETS
 * exist, or the first one its readers release. NULL: out of memory. */
static wset *spare_copy(ps_model *m) {
    pthread_mutex_lock(&m->wmu);
    for (;;) {
        for (int k = 0; k < m->nsets; k++)
            if (k != m->cur && m->sets[k].refs == 0) {
                pthread_mutex_unlock(&m->wmu);
                return &m->sets[k];
            }
        if (m->nsets < PS_WSETS) break;
        pthread_cond_wait(&m->wcv, &m->wmu);
    }
    pthread_mutex_unlock(&m->wmu);
    wset *ws = &m->sets[m->nsets];   /* only the step (step_mu) adds copies */
    memset(ws, 0, sizeof *ws);
    for (int s = 0; s < m->nstages; s++) {
        stage *st = &m->stages[s];
        if (st->inplace) {   /* one copy, which every set shares (model.c, "Snapshot steps") */
            ws->w[s] = m->sets[0].w[s];
            ws->bufw[s] = m->sets[0].bufw[s];
            continue;
        }
        ws->w[s] = ps_backend_alloc_floats(st->be, st->nweights ? st->nweights : 1);
        ws->bufw[s] = ps_backend_alloc_floats(st->be, st->nbufw ? st->nbufw : 1);
        if (!ws->w[s] || !ws->bufw[s]) {
            for (int k = 0; k <= s; k++) {
                if (m->stages[k].inplace) continue;
                ps_backend_release(m->stages[k].be, ws->w[k]);
                ps_backend_release(m->stages[k].be, ws->bufw[k]);
            }
            return NULL;
        }
    }
    pthread_mutex_lock(&m->wmu);
    m->nsets++;
    pthread_mutex_unlock(&m->wmu);
    return ws;
}

/* A snapshot step (see "Snapshot steps"): the next version in a spare
 * copy, published at once. */
static ps_status step_snapshot(ps_model *m, const ps_grads *g, const param_grad *pg, fold_plan *fp,
                               uint64_t *version, ps_err *err) {
    ps_prof_mutex_lock(&m->step_mu, PS_PHASE_LOCK);
    ps_prof_rdlock(&m->lock, PS_PHASE_LOCK);   /* only set_param & co, which write in place, exclude it */
    int64_t tw = ps_prof_begin();
    wset *next = spare_copy(m);
    ps_prof_end(PS_PHASE_LOCK, tw);
    ps_status rc = PS_OK;
    if (!next) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for a copy of the weights (the step is not "
                        "applied)");
        goto out;
    }
    int64_t t0 = ps_prof_begin();
    ps_model_call_begin(m, 0);   /* others compute meanwhile: a share of the threads */
    ps_model_run_begin(m, 0, m->nstages - 1);
    const wset *cur = &m->sets[m->cur];   /* steady: only steps change cur */
    int wrote = 0, rows = 0;
    rc = write_dense_next(m, pg, cur, next, &wrote, err);   /* the copy's stages: nobody reads them yet */
    for (int i = 0; i < m->nparams; i++)
        if ((pg[i].dense || pg[i].rows) && m->stages[m->loc[i].stage].inplace) rows = 1;
    if (rc == PS_OK && (rows || (fp->nlayers && m->ninplace))) {   /* the in-place stages: their readers held off */
        ps_prof_end(PS_PHASE_COMPUTE, t0);   /* the wait counts as lock, not compute */
        ps_prof_wrlock(&m->rows_lock, PS_PHASE_LOCK);
        t0 = ps_prof_begin();
        rows = 1;
    } else {
        rows = 0;
    }
    for (int i = 0; rows && i < m->nparams && rc == PS_OK; i++) {
        if ((!pg[i].dense && !pg[i].rows) || !m->stages[m->loc[i].stage].inplace) continue;
        rc = update_param(m, i, &pg[i], next->w, err);
        wrote = 1;
    }
    if (rc == PS_OK && fp->nlayers) {
        rc = fold_apply(m, g, fp, next->bufw, err);
        wrote = 1;
    }
    rc = ps_model_run_end(m, 0, m->nstages - 1, rc, err);   /* the copy complete before it is published */
    ps_model_call_end(m);
    if (wrote) {   /* published: a device failure half-way still changed weights, as in place */
        pthread_mutex_lock(&m->wmu);
        m->cur = (int)(next - m->sets);
        for (int s = 0; s < m->nstages; s++) {
            m->stages[s].w = next->w[s];
            m->stages[s].bufw = next->bufw[s];
        }
        pthread_mutex_lock(&m->version_mu);
        m->version++;
        pthread_mutex_unlock(&m->version_mu);
        pthread_mutex_unlock(&m->wmu);
    }
    if (rows) pthread_rwlock_unlock(&m->rows_lock);
    ps_prof_end(PS_PHASE_COMPUTE, t0);
out:
    if (version) *version = ps_model_version(m);
    pthread_rwlock_unlock(&m->lock);
    pthread_mutex_unlock(&m->step_mu);
    return rc;
}

ps_status ps_model_step_grads(ps_model *m, const ps_grads *g, uint64_t *version, ps_err *err) {
    if (!g || g->m != m)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradients of another model");
    if (!ps_grads_touched(g))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "no gradients to apply (Backward first)");
    /* Everything that can fail before any weight is written. The optimizer
     * state needs nothing here: it was allocated with the weights. */
    param_grad *pg = calloc((size_t)m->nparams + 1, sizeof *pg);
    if (!pg) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the step");
    fold_plan fp;
    ps_status rc = fold_prepare(m, g, &fp, err);
    for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
        const param_loc *pl = &m->loc[i];
        if (m->params[i].sparse) {
            const ps_rows *r = &g->rows[i];
            if (!r->nrows) continue;
            rc = stage_rows(m, i, r, &pg[i], err);
        } else if (g->dense[pl->stage]) {
            pg[i].dense = g->dense[pl->stage] + pl->goff;
        }
    }
    if (rc == PS_OK && m->snapshots) {
        rc = step_snapshot(m, g, pg, &fp, version, err);
    } else if (rc == PS_OK) {
        int wrote = 0;
        ps_prof_wrlock(&m->lock, PS_PHASE_LOCK);
        int64_t t0 = ps_prof_begin();
        ps_model_call_begin(m, 1);  /* nothing else computes while the weights are written */
        ps_model_run_begin(m, 0, m->nstages - 1);
        for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
            if (!pg[i].dense && !pg[i].rows) continue;
            rc = update_param(m, i, &pg[i], m->sets[0].w, err);
            wrote = 1;
        }
        if (rc == PS_OK && fp.nlayers) {
            rc = fold_apply(m, g, &fp, m->sets[0].bufw, err);
            wrote = 1;
        }
        rc = ps_model_run_end(m, 0, m->nstages - 1, rc, err);   /* written before the lock goes */
        uint64_t v;
        pthread_mutex_lock(&m->version_mu);
        if (wrote) m->version++;  /* a device failure half-way still changed weights */
        v = m->version;
        pthread_mutex_unlock(&m->version_mu);
        ps_prof_end(PS_PHASE_COMPUTE, t0);
        pthread_rwlock_unlock(&m->lock);
        if (version) *version = v;
    }
    for (int i = 0; i < m->nparams; i++) {
        ps_backend_release(m->stages[m->loc[i].stage].be, pg[i].dev_idx);
        ps_backend_release(m->stages[m->loc[i].stage].be, pg[i].dev_grad);
    }
    free(pg);
    fold_plan_free(&fp);
    return rc;
}
