/* model.c - a hosted model: building it from its model file (modeldef.h:
 * attributes resolved, shapes inferred in topological order, parameters and
 * buffers laid out), its weights, the weights lock around the executor's
 * calls, versions, placement and the optimizer step (see model.h). The
 * executor is exec.c, accumulated gradients grads.c. */
#include "model_impl.h"
#include "clock.h"
#include "prof.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parses "cpu" or "cuda:N". Returns 0 on success. */
static int parse_device(const char *dev, int *is_cpu, int *index) {
    if (!strcmp(dev, "cpu")) { *is_cpu = 1; *index = 0; return 0; }
    if (!strncmp(dev, "cuda:", 5) && dev[5]) {
        char *end;
        long v = strtol(dev + 5, &end, 10);
        if (*end || v < 0 || v > 63) return -1;
        *is_cpu = 0; *index = (int)v;
        return 0;
    }
    return -1;
}

/* Start of a compute call: size its threads so that the calls computing
 * at once share the budget (two trainers on two cores: one thread each,
 * rather than four threads fighting over two cores). Returns the thread
 * count; pair with ps_model_call_end (not after an exclusive call).
 * The share is of the most calls seen computing at once in the last
 * second, not only of those computing at this instant: a call that starts
 * while the other trainers' calls are between two RPCs would otherwise
 * take every thread, and its fork-join regions then wait, at every
 * primitive, for a thread that shares its core with the next call. */
#define PS_CONCURRENCY_WINDOW_MS 1000
int ps_model_call_begin(ps_model *m, int exclusive) {
    int k = exclusive ? 1 : __atomic_add_fetch(&m->inflight, 1, __ATOMIC_RELAXED);
    if (!exclusive) {   /* racy by design: a heuristic, read and written atomically */
        long long now = ps_mono_ms();
        int peak = __atomic_load_n(&m->peak_calls, __ATOMIC_RELAXED);
        if (k >= peak || now - __atomic_load_n(&m->peak_ms, __ATOMIC_RELAXED) > PS_CONCURRENCY_WINDOW_MS) {
            __atomic_store_n(&m->peak_calls, k, __ATOMIC_RELAXED);
            __atomic_store_n(&m->peak_ms, now, __ATOMIC_RELAXED);
        } else {
            k = peak;
        }
    }
    int nt = m->thread_budget / (k > 0 ? k : 1);
    if (nt < 1) nt = 1;
    for (int s = 0; s < m->nstages; s++)
        if (m->stages[s].be->ops->set_threads) m->stages[s].be->ops->set_threads(m->stages[s].be->impl, nt);
    return nt;
}

void ps_model_call_end(ps_model *m) { __atomic_sub_fetch(&m->inflight, 1, __ATOMIC_RELAXED); }

/* ---- Snapshot steps ----
 * The weights (parameters and float32 buffers of every stage) live in
 * copies, m->sets; sets[cur] is the current one, and each stage's w and
 * bufw point into it. A forward or backward pins the current copy (under
 * wmu, a counter) and computes with it, holding the weights lock shared.
 * An in-place step (snapshots off) takes the lock exclusively and writes
 * sets[0]. A snapshot step takes the lock shared too - only set_param and
 * the other administrative writers, which take it exclusively, exclude
 * it - picks a copy no call reads (allocating one, up to PS_WSETS; waiting
 * for one only when all are read), copies the current weights into it,
 * applies the optimizer there, and publishes it with the new version under
 * wmu: the running calls finish with the copy they pinned, the next ones
 * see the new version. Steps run one at a time (step_mu); the optimizer
 * state has one copy, which only steps touch. Row-sparse parameters
 * (embedding tables, up to millions of rows updated a few rows at a time)
 * are not worth a copy per step: a model with any steps in place. */

/* The current copy, pinned; *version: the version it holds. */
static wset *pin(ps_model *m, uint64_t *version) {
    pthread_mutex_lock(&m->wmu);
    wset *ws = &m->sets[m->cur];
    ws->refs++;
    if (version) *version = ps_model_version(m);
    pthread_mutex_unlock(&m->wmu);
    return ws;
}

static void unpin(ps_model *m, wset *ws) {
    pthread_mutex_lock(&m->wmu);
    if (--ws->refs == 0) pthread_cond_broadcast(&m->wcv);
    pthread_mutex_unlock(&m->wmu);
}

static void stage_free(stage *st) {
    ps_exec_plan_free(st);
    free(st->layers);
    free(st->slots);
    free(st->order);
    free(st->in_val);
    free(st->val_layout);
    free(st->rg[0]);
    free(st->rg[1]);
    free(st->bufi);
    st->layers = NULL;
    st->slots = NULL;
    st->order = st->in_val = st->val_layout = NULL;
    st->rg[0] = st->rg[1] = NULL;
    st->bufi = NULL;
}

void ps_model_free(ps_model *m) {
    if (!m) return;
    for (int s = 0; s < m->nstages; s++) {
        stage *st = &m->stages[s];
        if (st->be) {
            if (!m->nsets) {   /* creation failed before the first copy was complete */
                ps_backend_release(st->be, st->w);
                ps_backend_release(st->be, st->bufw);
            }
            for (int k = 0; k < m->nsets; k++) {
                ps_backend_release(st->be, m->sets[k].w[s]);
                ps_backend_release(st->be, m->sets[k].bufw[s]);
            }
            for (int j = 0; j < PS_OPTIM_MAX_STATE; j++) ps_backend_release(st->be, st->state[j]);
        }
        ps_backend_free(st->be);
        stage_free(st);
    }
    if (m->params)
        for (int i = 0; i < m->nparams; i++) free((char *)m->params[i].name);
    free(m->params);
    if (m->def_params)
        for (int i = 0; i < m->ndef_params; i++) free((char *)m->def_params[i].name);
    free(m->def_params);
    if (m->buffers)
        for (int i = 0; i < m->nbuffers; i++) free((char *)m->buffers[i].name);
    free(m->buffers);
    free(m->bloc);
    if (m->def_buffers)
        for (int i = 0; i < m->ndef_buffers; i++) free((char *)m->def_buffers[i].name);
    free(m->def_buffers);
    free(m->loc);
    free(m->ost);
    ps_model_def_free(m->def);
    pthread_rwlock_destroy(&m->lock);
    pthread_mutex_destroy(&m->version_mu);
    pthread_mutex_destroy(&m->wmu);
    pthread_cond_destroy(&m->wcv);
    pthread_mutex_destroy(&m->step_mu);
    free(m);
}

/* The model's value of size key (the file's default unless given). */
static double size_of(const ps_model *m, const char *key) {
    return ps_model_def_size_value(m->def, key, m->def->nsizes, m->size_keys, m->sizes);
}

static ps_status resolve_sizes(ps_model *m, const ps_model_opts *o, ps_err *err) {
    const ps_model_def *d = m->def;
    for (int i = 0; i < d->nsizes; i++) {
        m->sizes[i] = d->sizes[i].def;
        m->size_keys[i] = d->sizes[i].key;
    }
    for (int j = 0; j < o->n_sizes; j++) {
        const ps_size_key *k = ps_model_def_size(d, o->size_key[j]);
        if (!k) {
            char known[256] = "";
            for (int i = 0; i < d->nsizes; i++) {
                strncat(known, i ? ", " : "", sizeof known - strlen(known) - 1);
                strncat(known, d->sizes[i].key, sizeof known - strlen(known) - 1);
            }
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model.sizes.%s: model '%s' has no size '%s' "
                              "(sizes: %s)", o->size_key[j], d->name, o->size_key[j], *known ? known : "none");
        }
        double v = o->size_value[j];
        if (!(v >= k->lo && (k->hi_open ? v < k->hi : v <= k->hi)) || (k->integer && v != floor(v)))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model.sizes.%s: %g is outside %g..%g%s%s",
                              k->key, v, k->lo, k->hi, k->hi_open ? " (excluded)" : "",
                              k->integer ? " or not a whole number" : "");
        m->sizes[k - d->sizes] = v;
    }
    return PS_OK;
}

static char *join_name(const char *node, const char *suffix) {
    char *name = malloc(strlen(node) + strlen(suffix) + 2);
    if (name) sprintf(name, "%s.%s", node, suffix);
    return name;
}

static ps_status add_param(ps_model *m, int s, int l, int j, int64_t off, int64_t goff, ps_err *err) {
    stage *st = &m->stages[s];
    const ps_layer *ly = &st->layers[l];
    const ps_layer_param *lp = &ly->param[j];
    ps_param_info *pi = &m->params[m->nparams];
    char *name = join_name(ly->name, lp->suffix);
    if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    pi->name = name;
    pi->ndim = lp->ndim;
    pi->numel = lp->numel;
    for (int d = 0; d < lp->ndim; d++) pi->dims[d] = lp->dims[d];
    pi->stage = st->def->name;
    pi->device = st->device;
    pi->stage_index = s;
    pi->sparse = lp->sparse;
    if (lp->sparse && ly->row_total) {
        pi->row_offset = ly->row_lo;
        pi->rows_total = ly->row_total;
    }
    m->loc[m->nparams] = (param_loc){s, l, j, off, goff};
    st->slots[l].param[j] = m->nparams;
    st->slots[l].w_off[j] = off;
    st->slots[l].g_off[j] = goff;
    m->nsparse += lp->sparse;
    m->nparams++;
    return PS_OK;
}

static ps_buffer_info buffer_info(const stage *st, const ps_layer *ly, int j, int stage_index, char *name) {
    const ps_layer_buffer *b = &ly->buffer[j];
    ps_buffer_info bi = {.name = name, .ndim = b->ndim, .numel = b->numel, .dtype = b->dtype, .stage = st->def->name,
                         .device = st->device, .stage_index = stage_index};
    memcpy(bi.dims, b->dims, sizeof bi.dims);
    return bi;
}

static ps_status add_buffer(ps_model *m, int s, int l, int j, ps_err *err) {
    stage *st = &m->stages[s];
    const ps_layer *ly = &st->layers[l];
    char *name = join_name(ly->name, ly->buffer[j].suffix);
    if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    m->buffers[m->nbuffers] = buffer_info(st, ly, j, s, name);
    m->bloc[m->nbuffers] = (buffer_loc){s, l, j, st->slots[l].b_off[j]};
    st->slots[l].buffer[j] = m->nbuffers++;
    return PS_OK;
}

/* What one ps_model_create builds beyond the model itself. */
typedef struct build_ctx {
    const ps_model_opts *o;
    int shard_def;           /* definition index of opts->shard_stage, -1 = none */
} build_ctx;

/* A shape's elements within PS_NUMEL_MAX, every dimension 1..PS_DIM_MAX
 * (products checked before they are taken). */
static int numel_ok(int ndim, const int64_t *dims) {
    int64_t k = 1;
    for (int d = 0; d < ndim; d++) {
        if (dims[d] < 1 || dims[d] > PS_DIM_MAX || k > PS_NUMEL_MAX / dims[d]) return 0;
        k *= dims[d];
    }
    return 1;
}

/* The inferred output, parameters and buffers are not absurdly large. */
static ps_status check_sizes(const ps_layer *ly, ps_err *err) {
    char b[64];
    if (!numel_ok(ly->outs.ndim, ly->outs.dims))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "output %s is too large (at most 2^40 elements per sample)",
                          ps_shape_format(&ly->outs, b, sizeof b));
    for (int j = 0; j < ly->nparams; j++)
        if (!numel_ok(ly->param[j].ndim, ly->param[j].dims))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "parameter %s is too large (at most 2^40 elements)",
                              ly->param[j].suffix);
    for (int j = 0; j < ly->nbuffers; j++)
        if (!numel_ok(ly->buffer[j].ndim, ly->buffer[j].dims))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "buffer %s is too large", ly->buffer[j].suffix);
    return PS_OK;
}

/* "path:line: node 'x' (Kind)" before an error about node nd. */
static ps_status node_err(const ps_model *m, const ps_node_def *nd, ps_err *err) {
    return ps_err_prefix(err, "%s:%d: node '%s' (%s)", m->def->path, nd->line, nd->name, nd->kind_name);
}

/* Build stage st (definition index st->def_index): resolve attributes,
 * infer shapes in topological order, lay out parameters. s is its index
 * among the hosted stages, or -1 for a stage hosted elsewhere: then only
 * the shapes are inferred (no backend, no parameters here). *shape and
 * *dtype carry the previous stage's output in and this stage's out. */
static ps_status build_stage(ps_model *m, stage *st, int s, const build_ctx *bc, ps_shape *shape,
                             ps_dtype *dtype, ps_err *err) {
    const ps_stage_def *sd = st->def;
    const ps_model_def *d = m->def;
    if (!sd->inherit || st->def_index == 0) {
        shape->ndim = sd->in_ndim;
        for (int k = 0; k < sd->in_ndim; k++) {
            double v = sd->in_keys[k] ? size_of(m, sd->in_keys[k]) : (double)sd->in_dims[k];
            if (!(v >= 1) || v != floor(v) || v > (double)PS_DIM_MAX)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s:%d: stage '%s': input dimension %d is %g (%s%s): "
                                  "not a whole number in 1..2^30", d->path, sd->line, sd->name, k + 1, v,
                                  sd->in_keys[k] ? "size " : "a literal", sd->in_keys[k] ? sd->in_keys[k] : "");
            shape->dims[k] = (int64_t)v;
        }
        *dtype = sd->in_dtype;
        if (!numel_ok(shape->ndim, shape->dims))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s:%d: stage '%s': the input is too large (at most 2^40 "
                              "elements per sample)", d->path, sd->line, sd->name);
    }
    int nl = st->nlayers = sd->count;
    st->layers = calloc((size_t)nl, sizeof *st->layers);
    st->slots = calloc((size_t)nl, sizeof *st->slots);
    st->order = calloc((size_t)nl, sizeof *st->order);
    st->in_val = calloc((size_t)nl * PS_NODE_MAX_INPUTS, sizeof *st->in_val);
    if (!st->layers || !st->slots || !st->order || !st->in_val)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    st->info.name = sd->name;
    st->info.device = st->device;
    st->info.in_ndim = shape->ndim;
    memcpy(st->info.in_dims, shape->dims, sizeof st->info.in_dims);
    st->info.in_dtype = *dtype;
    st->out_val = sd->output - sd->first + 1;
    st->dropout_base = m->ndropout;
    for (int l = 0; l < nl; l++) {   /* file order: dropout indices */
        ps_layer *ly = &st->layers[l];
        const ps_node_def *nd = &d->nodes[sd->first + l];
        ly->def = nd;
        ly->kind = nd->kind;
        ly->name = nd->name;
        ly->nin = nd->nin;
        ly->dropout_idx = (ly->kind->flags & PS_KIND_DROPOUT) ? m->ndropout++ : -1;
        for (int i = 0; i < nd->nin; i++) st->in_val[l * PS_NODE_MAX_INPUTS + i] = nd->in[i] < 0 ? 0 : nd->in[i] - sd->first + 1;
        st->order[l] = sd->order[l] - sd->first;
    }
    const ps_shape in_shape = *shape;
    const ps_dtype in_dtype = *dtype;
    for (int k = 0; k < nl; k++) {   /* topological order: inputs inferred first */
        int l = st->order[k];
        ps_layer *ly = &st->layers[l];
        const ps_node_def *nd = ly->def;
        ps_status rc = ps_layer_resolve(ly, d, d->nsizes, m->size_keys, m->sizes, err);
        if (rc) return node_err(m, nd, err);
        for (int i = 0; i < ly->nin; i++) {
            int v = st->in_val[l * PS_NODE_MAX_INPUTS + i];
            ly->in[i] = v ? st->layers[v - 1].outs : in_shape;
            ly->in_dtype[i] = v ? st->layers[v - 1].out_dtype : in_dtype;
        }
        if (l == 0 && st->def_index == bc->shard_def) {
            const ps_model_opts *o = bc->o;
            if (strcmp(ly->kind->name, "Embedding"))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': stage '%s' cannot be sharded: its "
                                  "first node is %s, not an Embedding", d->name, sd->name, ly->kind->name);
            if (o->shard_lo < 0 || o->shard_lo >= o->shard_hi || o->shard_hi > ly->a.num)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': shard rows [%lld, %lld) of stage "
                                  "'%s' are not a non-empty range within its %lld rows", d->name,
                                  (long long)o->shard_lo, (long long)o->shard_hi, sd->name, (long long)ly->a.num);
            ly->row_lo = o->shard_lo;
            ly->row_total = ly->a.num;
            ly->a.num = o->shard_hi - o->shard_lo;
            st->info.row_lo = o->shard_lo;
            st->info.row_hi = o->shard_hi;
        }
        if ((rc = ps_layer_infer(ly, err)) == PS_OK) rc = check_sizes(ly, err);
        if (rc != PS_OK) {
            char b1[64], b2[64] = "";
            for (int i = 1; i < ly->nin; i++) {
                size_t o = strlen(b2);
                ps_shape_format(&ly->in[i], b2 + o, sizeof b2 - o);
            }
            ps_err_prefix(err, "input %s%s%s", ps_shape_format(&ly->in[0], b1, sizeof b1), *b2 ? ", " : "", b2);
            return node_err(m, nd, err);
        }
        if (s >= 0 && st->be) {
            const char *missing = ly->kind->missing_op(ly, st->be->ops);
            if (missing)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model.placement.%s: %s: backend '%s' has no %s "
                                  "(node '%s', kind %s)", sd->name, st->device, st->be->ops->name, missing,
                                  ly->name, ly->kind->name);
        }
    }
    for (int l = 0; l < nl; l++) {   /* file order: state_dict order */
        ps_layer *ly = &st->layers[l];
        for (int j = 0; j < ly->nparams; j++) {
            int64_t goff = -1;
            if (!ly->param[j].sparse) { goff = st->ngrads; st->ngrads += ly->param[j].numel; }
            ps_status rc;
            if (s >= 0 && (rc = add_param(m, s, l, j, st->nweights, goff, err)) != PS_OK) return rc;
            st->nweights += ly->param[j].numel;
        }
        for (int j = 0; j < ly->nbuffers; j++) {
            const ps_layer_buffer *b = &ly->buffer[j];
            st->slots[l].buffer[j] = -1;
            if (b->dtype == PS_DTYPE_I64) { st->slots[l].b_off[j] = st->nbufi; st->nbufi += b->numel; }
            else { st->slots[l].b_off[j] = st->nbufw; st->nbufw += b->numel; }
            ps_status rc;
            if (s >= 0 && (rc = add_buffer(m, s, l, j, err)) != PS_OK) return rc;
        }
    }
    const ps_layer *ol = ps_stage_out_layer(st);
    *shape = ol->outs;
    *dtype = ol->out_dtype;
    st->info.out_ndim = shape->ndim;
    memcpy(st->info.out_dims, shape->dims, sizeof st->info.out_dims);
    st->info.params = 0;
    for (int l = 0; l < nl; l++) st->info.params += st->layers[l].nparams;
    for (int l = 0; l < nl; l++)   /* batch statistics in eval too: eval forwards are not sliced */
        if ((st->layers[l].flags & PS_KIND_BUFFERS_EVAL) && !st->layers[l].nbuffers) m->eval_whole = 1;
    st->info.params_only = nl > 0;
    for (int l = 0; l < nl; l++)
        if (!(st->layers[l].kind->flags & PS_KIND_PARAMS_ONLY)) st->info.params_only = 0;
    return PS_OK;
}

/* Initial values of parameter j of layer ly into host (ly's numel floats),
 * drawing from rng exactly what the whole model draws for it: a shard's
 * table draws the whole table and keeps its rows, so that shard's rows
 * equal the same rows of the whole model built with the same seed. host
 * NULL: draw and discard (a stage hosted elsewhere keeps the stream in
 * step). */
static ps_status init_param(const ps_layer *ly, int j, float *host, ps_rng *rng, ps_err *err) {
    ps_layer full = *ly;
    if (ly->row_total) {
        full.a.num = ly->row_total;
        full.row_lo = 0;
        full.row_total = 0;
        ps_status rc = ps_layer_infer(&full, err);
        PS_ASSERT(rc == PS_OK && "a shard's table inferred once already");
    }
    if (host && !ly->row_total) {
        ps_layer_init_param(ly, j, host, rng);
        return PS_OK;
    }
    const ps_layer_param *p = &full.param[j];
    float *scratch = malloc((size_t)(p->numel ? p->numel : 1) * sizeof(float));
    if (!scratch)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory drawing the initial %s.%s", ly->name,
                          p->suffix);
    ps_layer_init_param(&full, j, scratch, rng);
    if (host) {
        int64_t width = p->numel / p->dims[0];
        memcpy(host, scratch + ly->row_lo * width, (size_t)ly->param[j].numel * sizeof(float));
    }
    free(scratch);
    return PS_OK;
}

/* The definition index of a stage named in opts (hosted, shard_stage),
 * or -1 with INVALID_ARGUMENT naming the key. */
static int def_stage_index(const ps_model_def *a, const char *key, const char *name, ps_err *err) {
    int i = name ? ps_model_def_stage(a, name) : -1;
    if (i < 0) {
        char known[256];
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: model '%s' has no stage '%s' (stages: %s)", key, a->name,
                   name ? name : "(null)", ps_model_def_stage_list(a, known, sizeof known));
    }
    return i;
}

/* m->def_params: every parameter of the definition, whole shapes. */
static ps_status list_def_params(ps_model *m, stage *const *seq, const int *hosted, ps_err *err) {
    int n = 0, h = 0;
    for (int ds = 0; ds < m->def->nstages; ds++)
        for (int l = 0; l < seq[ds]->nlayers; l++) n += seq[ds]->layers[l].nparams;
    if (!(m->def_params = calloc((size_t)n + 1, sizeof *m->def_params)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (int ds = 0; ds < m->def->nstages; ds++) {
        const stage *st = seq[ds];
        for (int l = 0; l < st->nlayers; l++) {
            const ps_layer *ly = &st->layers[l];
            for (int j = 0; j < ly->nparams; j++) {
                const ps_layer_param *lp = &ly->param[j];
                ps_param_info *pi = &m->def_params[m->ndef_params];
                char *name = join_name(ly->name, lp->suffix);
                if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
                m->ndef_params++;
                *pi = (ps_param_info){.name = name, .ndim = lp->ndim, .numel = lp->numel, .stage = st->def->name,
                                      .device = st->device, .stage_index = hosted[ds] ? h : -1,
                                      .sparse = lp->sparse};
                memcpy(pi->dims, lp->dims, sizeof pi->dims);
                if (lp->sparse && ly->row_total) {   /* the whole table */
                    pi->dims[0] = ly->row_total;
                    pi->numel = lp->numel / ly->a.num * ly->row_total;
                }
            }
        }
        h += hosted[ds];
    }
    int nb = 0;   /* and every buffer */
    for (int ds = 0; ds < m->def->nstages; ds++)
        for (int l = 0; l < seq[ds]->nlayers; l++) nb += seq[ds]->layers[l].nbuffers;
    if (!(m->def_buffers = calloc((size_t)nb + 1, sizeof *m->def_buffers)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    h = 0;
    for (int ds = 0; ds < m->def->nstages; ds++) {
        const stage *st = seq[ds];
        for (int l = 0; l < st->nlayers; l++)
            for (int j = 0; j < st->layers[l].nbuffers; j++) {
                char *name = join_name(st->layers[l].name, st->layers[l].buffer[j].suffix);
                if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
                m->def_buffers[m->ndef_buffers++] = buffer_info(st, &st->layers[l], j, hosted[ds] ? h : -1, name);
            }
        h += hosted[ds];
    }
    return PS_OK;
}

static void ghosts_free(stage *ghost) {
    for (int s = 0; s < PS_MODEL_MAX_STAGES; s++) stage_free(&ghost[s]);
}

/* Build the model; shapes_only: every stage of the definition, shapes,
 * parameters and memory plans only (no backend, no weights: the stage
 * table of --check-config). */
static ps_model *model_build(const ps_model_opts *o, int shapes_only, ps_err *err) {
    ps_model_def *a = ps_model_def_load(o->arch, o->file, err);
    if (!a) return NULL;
    for (int i = 0; i < o->n_placement; i++) {
        if (ps_model_def_stage(a, o->placement_stage[i]) < 0) {
            char known[256];
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                       "model.placement: model '%s' has no stage '%s' (stages: %s)", a->name,
                       o->placement_stage[i], ps_model_def_stage_list(a, known, sizeof known));
            ps_model_def_free(a);
            return NULL;
        }
    }
    int hosted[PS_MODEL_MAX_STAGES] = {0};
    build_ctx bc = {o, -1};
    if (o->n_hosted < 0 || o->n_hosted > a->nstages) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': %d hosted stages (it has %d)", a->name, o->n_hosted,
                   a->nstages);
        ps_model_def_free(a);
        return NULL;
    }
    for (int s = 0; s < a->nstages; s++) hosted[s] = o->n_hosted == 0 || shapes_only;
    for (int i = 0; i < o->n_hosted && !shapes_only; i++) {
        int s = def_stage_index(a, "hosted stages", o->hosted[i], err);
        if (s < 0) { ps_model_def_free(a); return NULL; }
        hosted[s] = 1;
    }
    if (o->shard_stage && !shapes_only) {
        if ((bc.shard_def = def_stage_index(a, "shard stage", o->shard_stage, err)) < 0) {
            ps_model_def_free(a);
            return NULL;
        }
        if (!hosted[bc.shard_def]) {
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': shard stage '%s' is not among the hosted stages",
                       a->name, o->shard_stage);
            ps_model_def_free(a);
            return NULL;
        }
    }
    ps_model *m = calloc(1, sizeof *m);
    if (!m) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); ps_model_def_free(a); return NULL; }
    stage ghost[PS_MODEL_MAX_STAGES];   /* stages hosted elsewhere: shapes only */
    stage *seq[PS_MODEL_MAX_STAGES];    /* every stage in definition order */
    memset(ghost, 0, sizeof ghost);
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* Steps must not starve behind a stream of forwards. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&m->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&m->version_mu, NULL);
    pthread_mutex_init(&m->wmu, NULL);
    pthread_cond_init(&m->wcv, NULL);
    pthread_mutex_init(&m->step_mu, NULL);
    m->def = a;
    if (o->optim) {
        m->optim = *o->optim;
    } else {
        ps_optim_spec_default(PS_OPTIM_SGD, &m->optim);
        m->optim.lr = o->lr;
        m->optim.momentum = o->momentum;
        m->optim.weight_decay = o->weight_decay;
    }
    if (ps_optim_check(&m->optim, 0, err) != PS_OK) {
        ps_err_prefix(err, "model '%s'", a->name);
        goto fail;
    }
    m->nstate = ps_optim_num_state(&m->optim);
    m->thread_budget = o->compute_threads;
    if (m->thread_budget <= 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        m->thread_budget = ncpu > 0 ? (int)ncpu : 1;
    }
    if (resolve_sizes(m, o, err) != PS_OK) goto fail;

    int maxp = 0;
    for (int i = 0; i < a->nnodes; i++) maxp += PS_LAYER_MAX_PARAMS;
    m->params = calloc(maxp + 1, sizeof *m->params);
    m->loc = calloc(maxp + 1, sizeof *m->loc);
    m->ost = calloc(maxp + 1, sizeof *m->ost);
    m->buffers = calloc((size_t)a->nnodes * PS_LAYER_MAX_BUFFERS + 1, sizeof *m->buffers);
    m->bloc = calloc((size_t)a->nnodes * PS_LAYER_MAX_BUFFERS + 1, sizeof *m->bloc);
    if (!m->params || !m->loc || !m->ost || !m->buffers || !m->bloc) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }

    ps_rng rng;
    ps_rng_seed(&rng, o->seed);
    ps_shape shape = {0};
    ps_dtype dtype = PS_DTYPE_F32;
    for (int ds = 0; ds < a->nstages; ds++) {
        if (!hosted[ds]) {
            stage *g = seq[ds] = &ghost[ds];
            g->def = &a->stages[ds];
            g->def_index = ds;
            snprintf(g->device, sizeof g->device, "elsewhere");
            if (build_stage(m, g, -1, &bc, &shape, &dtype, err) != PS_OK) goto fail;
            continue;
        }
        int s = m->nstages;
        stage *st = seq[ds] = &m->stages[s];
        st->def = &a->stages[ds];
        st->def_index = ds;
        m->nstages = s + 1;
        snprintf(st->device, sizeof st->device, "cpu");
        for (int i = 0; i < o->n_placement; i++)
            if (!strcmp(o->placement_stage[i], st->def->name))
                snprintf(st->device, sizeof st->device, "%s", o->placement_device[i]);
        int is_cpu, index;
        if (parse_device(st->device, &is_cpu, &index)) {
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                       "model.placement.%s: '%s' is not a device (use cpu or cuda:N)",
                       st->def->name, st->device);
            goto fail;
        }
        st->host_memory = is_cpu;
        if (!shapes_only)
            st->be = ps_backend_create(is_cpu ? o->cpu_backend : "cuda", index, o->compute_threads, err);
        if (!st->be && !shapes_only) {
            ps_err_prefix(err, "model.placement.%s: %s", st->def->name, st->device);
            goto fail;
        }
        if (build_stage(m, st, s, &bc, &shape, &dtype, err) != PS_OK) goto fail;
        if (ps_exec_plan(st, err) != PS_OK) goto fail;
    }
    if (shapes_only) {
        ghosts_free(ghost);
        return m;
    }
    if (m->nsparse && ps_optim_check(&m->optim, 1, err) != PS_OK) {
        for (int i = 0; i < m->nparams; i++)
            if (m->params[i].sparse) {
                ps_err_prefix(err, "model '%s': %s is a row-sparse parameter (embedding table), updated "
                              "with %s", a->name, m->params[i].name,
                              m->optim.kind == PS_OPTIM_ADAM ? "torch.optim.SparseAdam's rule"
                                                             : "plain SGD only");
                break;
            }
        goto fail;
    }
    /* Initialise on the host in state_dict order, then move to the device.
     * Every stage of the definition draws from the one stream, hosted or
     * not, so a hosted subset starts from the whole model's values. */
    for (int ds = 0; ds < a->nstages; ds++) {
        stage *st = seq[ds];
        if (!hosted[ds]) {
            for (int l = 0; l < st->nlayers; l++)
                for (int j = 0; j < st->layers[l].nparams; j++)
                    if (init_param(&st->layers[l], j, NULL, &rng, err) != PS_OK) goto fail;
            continue;
        }
        int64_t nh = st->nweights > st->nbufw ? st->nweights : st->nbufw;
        float *host = malloc((size_t)(nh ? nh : 1) * sizeof(float));
        st->w = ps_backend_alloc_floats(st->be, st->nweights ? st->nweights : 1);
        st->bufw = ps_backend_alloc_floats(st->be, st->nbufw ? st->nbufw : 1);
        st->bufi = calloc((size_t)(st->nbufi ? st->nbufi : 1), sizeof *st->bufi);
        int have = 1;
        for (int j = 0; j < m->nstate; j++)
            have &= (st->state[j] = ps_backend_alloc_floats(st->be, st->nweights ? st->nweights : 1)) != NULL;
        if (!host || !st->w || !st->bufw || !st->bufi || !have) {
            free(host);
            ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for stage '%s' weights", st->def->name);
            goto fail;
        }
        ps_status rc = PS_OK;
        for (int l = 0; l < st->nlayers && rc == PS_OK; l++)
            for (int j = 0; j < st->layers[l].nparams && rc == PS_OK; j++)
                rc = init_param(&st->layers[l], j, host + st->slots[l].w_off[j], &rng, err);
        if (rc == PS_OK)
            rc = st->be->ops->copy_to_device(st->be->impl, st->w, host, (size_t)st->nweights * sizeof(float), err);
        if (m->nstate) memset(host, 0, (size_t)st->nweights * sizeof(float));
        for (int j = 0; j < m->nstate && rc == PS_OK; j++)
            rc = st->be->ops->copy_to_device(st->be->impl, st->state[j], host,
                                             (size_t)st->nweights * sizeof(float), err);
        for (int l = 0; l < st->nlayers; l++)   /* buffers: their initial values */
            for (int j = 0; j < st->layers[l].nbuffers; j++) {
                const ps_layer_buffer *b = &st->layers[l].buffer[j];
                for (int64_t k = 0; k < b->numel; k++) {
                    if (b->dtype == PS_DTYPE_I64) st->bufi[st->slots[l].b_off[j] + k] = (int64_t)b->init;
                    else host[st->slots[l].b_off[j] + k] = b->init;
                }
            }
        if (rc == PS_OK && st->nbufw)
            rc = st->be->ops->copy_to_device(st->be->impl, st->bufw, host, (size_t)st->nbufw * sizeof(float), err);
        free(host);
        if (rc != PS_OK) goto fail;
        m->total_weights += st->nweights;
    }
    for (int s = 0; s < m->nstages; s++) {   /* the first copy of the weights */
        m->sets[0].w[s] = m->stages[s].w;
        m->sets[0].bufw[s] = m->stages[s].bufw;
    }
    m->nsets = 1;
    m->snapshots = o->snapshot_steps && !m->nsparse && !shapes_only;
    if (list_def_params(m, seq, hosted, err) != PS_OK) goto fail;
    ghosts_free(ghost);
    for (int i = 0; i < m->nparams; i++)
        for (int j = 0; j < m->nstate; j++) m->ost[i].buf[j] = m->stages[m->loc[i].stage].state[j] + m->loc[i].off;
    return m;
fail:
    ghosts_free(ghost);
    ps_model_free(m);
    return NULL;
}

ps_model *ps_model_create(const ps_model_opts *o, ps_err *err) { return model_build(o, 0, err); }

/* "(1, 28, 28) float32" into buf. */
static const char *shape_dtype(const ps_shape *s, ps_dtype t, char *buf, size_t cap) {
    char b[80];
    snprintf(buf, cap, "%s %s", ps_shape_format(s, b, sizeof b), t == PS_DTYPE_I64 ? "int64" : "f32");
    return buf;
}

static const char *human(double v, char *buf, size_t cap) {
    const char *unit[] = {"", "K", "M", "G", "T"};
    int u = 0;
    while (v >= 1000 && u < 4) { v /= 1000; u++; }
    snprintf(buf, cap, u ? "%.3g%s" : "%.0f%s", v, unit[u]);
    return buf;
}

ps_status ps_model_describe(const ps_model_opts *o, const char *const *where, FILE *f, ps_err *err) {
    ps_model *m = model_build(o, 1, err);
    if (!m) return err && err->code ? err->code : PS_ERR_INVALID_ARGUMENT;
    fprintf(f, "model %s (%s)%s%s\n", m->def->name, m->def->path, m->def->about[0] ? ": " : "", m->def->about);
    fprintf(f, "  %-12s %-22s %-22s %12s %12s %16s  %s\n", "stage", "input (per sample)", "output", "parameters",
            "FLOPs/sample", "act. bytes/sample", "placement");
    int64_t tp = 0, ta = 0;
    double tf = 0;
    for (int s = 0; s < m->nstages; s++) {
        const stage *st = &m->stages[s];
        ps_shape in;
        const ps_layer *ol = ps_stage_out_layer(st);
        int64_t params = 0;
        double flops = 0;
        for (int l = 0; l < st->nlayers; l++) {
            for (int j = 0; j < st->layers[l].nparams; j++) params += st->layers[l].param[j].numel;
            flops += ps_layer_flops(&st->layers[l]);
        }
        int64_t act = st->info.params_only ? 0 : (int64_t)ps_exec_tape_bytes(m, s, s, 1);
        char b1[96], b2[96], b3[32], b4[32], b5[32];
        fprintf(f, "  %-12s %-22s %-22s %12s %12s %16s  %s%s\n", st->def->name,
                shape_dtype(ps_stage_in_shape(st, &in), st->info.in_dtype, b1, sizeof b1),
                st->info.params_only ? "(parameters only)" : shape_dtype(&ol->outs, ol->out_dtype, b2, sizeof b2),
                human((double)params, b3, sizeof b3), st->info.params_only ? "-" : human(flops, b4, sizeof b4),
                st->info.params_only ? "-" : human((double)act, b5, sizeof b5),
                where && where[s] ? where[s] : st->device,
                st->info.params_only ? " (the trainer runs it: GetParameters / PushGradients)" : "");
        tp += params;
        if (!st->info.params_only) { tf += flops; ta += act; }
    }
    char b3[32], b4[32], b5[32];
    fprintf(f, "  %-12s %-22s %-22s %12s %12s %16s\n", "total", "", "", human((double)tp, b3, sizeof b3),
            human(tf, b4, sizeof b4), human((double)ta, b5, sizeof b5));
    ps_model_free(m);
    return PS_OK;
}

const char *ps_model_arch(const ps_model *m) { return m->def->name; }
const ps_backend *ps_model_stage_backend(const ps_model *m, int s) {
    return s >= 0 && s < m->nstages ? m->stages[s].be : NULL;
}
int ps_model_num_params(const ps_model *m) { return m->nparams; }
const ps_param_info *ps_model_param(const ps_model *m, int i) {
    return (i >= 0 && i < m->nparams) ? &m->params[i] : NULL;
}
int ps_model_find_param(const ps_model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name)) return i;
    return -1;
}
int64_t ps_model_num_weights(const ps_model *m) { return m->total_weights; }
int ps_model_num_def_params(const ps_model *m) { return m->ndef_params; }
const ps_param_info *ps_model_def_param(const ps_model *m, int i) {
    return (i >= 0 && i < m->ndef_params) ? &m->def_params[i] : NULL;
}

const char *ps_model_where(const ps_model *m, const char *name, char *buf, size_t cap) {
    const char *dot = name ? strrchr(name, '.') : NULL;
    for (int i = 0; dot && i < m->def->nnodes; i++) {
        const ps_node_def *nd = &m->def->nodes[i];
        if (strlen(nd->name) == (size_t)(dot - name) && !strncmp(nd->name, name, (size_t)(dot - name))) {
            snprintf(buf, cap, "%s:%d: node '%s'", m->def->path, nd->line, nd->name);
            return buf;
        }
    }
    snprintf(buf, cap, "%s", m->def->path);
    return buf;
}

int ps_model_num_buffers(const ps_model *m) { return m->nbuffers; }
const ps_buffer_info *ps_model_buffer(const ps_model *m, int i) {
    return (i >= 0 && i < m->nbuffers) ? &m->buffers[i] : NULL;
}
int ps_model_find_buffer(const ps_model *m, const char *name) {
    for (int i = 0; name && i < m->nbuffers; i++)
        if (!strcmp(m->buffers[i].name, name)) return i;
    return -1;
}
int ps_model_num_def_buffers(const ps_model *m) { return m->ndef_buffers; }
const ps_buffer_info *ps_model_def_buffer(const ps_model *m, int i) {
    return (i >= 0 && i < m->ndef_buffers) ? &m->def_buffers[i] : NULL;
}

/* Buffer i's memory in copy ws: float32 on the stage's device, int64 on
 * the host (one copy: only steps write them). */
static void *buffer_mem(ps_model *m, const wset *ws, int i) {
    stage *st = &m->stages[m->bloc[i].stage];
    return m->buffers[i].dtype == PS_DTYPE_I64 ? (void *)(st->bufi + m->bloc[i].off)
                                               : (void *)(ws->bufw[m->bloc[i].stage] + m->bloc[i].off);
}

/* Under the weights lock (either), ws pinned. */
static ps_status copy_buffer_out(ps_model *m, const wset *ws, int i, void *host_dst, ps_err *err) {
    stage *st = &m->stages[m->bloc[i].stage];
    size_t bytes = (size_t)m->buffers[i].numel * ps_dtype_size(m->buffers[i].dtype);
    if (m->buffers[i].dtype == PS_DTYPE_I64) { memcpy(host_dst, buffer_mem(m, ws, i), bytes); return PS_OK; }
    return st->be->ops->copy_to_host(st->be->impl, host_dst, buffer_mem(m, ws, i), bytes, err);
}

ps_status ps_model_get_buffer(ps_model *m, int i, void *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nbuffers) return ps_err_set(err, PS_ERR_NOT_FOUND, "no buffer %d", i);
    pthread_rwlock_rdlock(&m->lock);
    wset *ws = pin(m, NULL);
    ps_status rc = copy_buffer_out(m, ws, i, host_dst, err);
    unpin(m, ws);
    pthread_rwlock_unlock(&m->lock);
    return rc;
}

ps_status ps_model_set_buffer(ps_model *m, int i, const void *host_src, ps_err *err) {
    if (i < 0 || i >= m->nbuffers) return ps_err_set(err, PS_ERR_NOT_FOUND, "no buffer %d", i);
    stage *st = &m->stages[m->bloc[i].stage];
    size_t bytes = (size_t)m->buffers[i].numel * ps_dtype_size(m->buffers[i].dtype);
    ps_status rc = PS_OK;
    pthread_rwlock_wrlock(&m->lock);   /* exclusive: nobody holds a copy; the current one is written */
    const wset *ws = &m->sets[m->cur];
    if (m->buffers[i].dtype == PS_DTYPE_I64) memcpy(buffer_mem(m, ws, i), host_src, bytes);
    else rc = st->be->ops->copy_to_device(st->be->impl, buffer_mem(m, ws, i), host_src, bytes, err);
    pthread_rwlock_unlock(&m->lock);
    return rc;
}

void ps_tape_set_key(ps_tape *t, uint64_t key, uint32_t seq) {
    t->key = key;
    t->seq = seq;
}

int ps_model_num_stages(const ps_model *m) { return m->nstages; }
const ps_stage_info *ps_model_stage(const ps_model *m, int s) {
    return s >= 0 && s < m->nstages ? &m->stages[s].info : NULL;
}
int ps_model_find_stage(const ps_model *m, const char *name) {
    for (int s = 0; s < m->nstages; s++)
        if (name && !strcmp(m->stages[s].def->name, name)) return s;
    return -1;
}

int ps_model_max_batch(const ps_model *m) { return m->def->max_batch; }

uint64_t ps_model_version(const ps_model *m) {
    ps_model *mm = (ps_model *)m;
    pthread_mutex_lock(&mm->version_mu);
    uint64_t v = mm->version;
    pthread_mutex_unlock(&mm->version_mu);
    return v;
}

ps_status ps_model_get_param(ps_model *m, int i, float *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    stage *st = &m->stages[m->loc[i].stage];
    pthread_rwlock_rdlock(&m->lock);
    wset *ws = pin(m, NULL);
    ps_status rc = st->be->ops->copy_to_host(st->be->impl, host_dst, ws->w[m->loc[i].stage] + m->loc[i].off,
                                             (size_t)m->params[i].numel * sizeof(float), err);
    unpin(m, ws);
    pthread_rwlock_unlock(&m->lock);
    return rc;
}

/* Parameter i's optimizer state := step and state[j] (host), zeros when
 * state is NULL (zeros is a host buffer of numel zero floats then).
 * Under the exclusive lock. */
static ps_status put_optim_state(ps_model *m, int i, int64_t step, const float *const *state,
                                 const float *zeros, ps_err *err) {
    stage *st = &m->stages[m->loc[i].stage];
    ps_status rc = PS_OK;
    m->ost[i].step = 0;
    for (int j = 0; j < m->nstate && rc == PS_OK; j++)
        rc = st->be->ops->copy_to_device(st->be->impl, m->ost[i].buf[j], state ? state[j] : zeros,
                                         (size_t)m->params[i].numel * sizeof(float), err);
    if (rc == PS_OK) m->ost[i].step = step;
    return rc;
}

static float *zeros_for(const ps_model *m, int i, ps_err *err) {
    float *z = m->nstate ? calloc((size_t)m->params[i].numel + 1, sizeof *z) : NULL;
    if (m->nstate && !z)
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %s's optimizer state", m->params[i].name);
    return z;
}

ps_status ps_model_set_param(ps_model *m, int i, const float *host_src, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    stage *st = &m->stages[m->loc[i].stage];
    float *zeros = zeros_for(m, i, err);
    if (m->nstate && !zeros) return PS_ERR_RESOURCE_EXHAUSTED;
    pthread_rwlock_wrlock(&m->lock);
    ps_status rc = st->be->ops->copy_to_device(st->be->impl, st->w + m->loc[i].off, host_src,
                                               (size_t)m->params[i].numel * sizeof(float), err);
    if (rc == PS_OK) rc = put_optim_state(m, i, 0, NULL, zeros, err);
    pthread_rwlock_unlock(&m->lock);
    free(zeros);
    return rc;
}

/* ----------------------------------------------- forward and backward */

#define EVAL_SLICE 64   /* samples per slice of an eval forward */

ps_status ps_model_forward_range(ps_model *m, int first, int last, const void *x, int n, int train,
                                 const float *const *dropout_masks, uint64_t dropout_seed, float *out,
                                 ps_tape **tape_out, uint64_t *version_used, ps_err *err) {
    if (tape_out) *tape_out = NULL;
    ps_status rc = ps_exec_check_run(m, first, last, err);
    if (rc != PS_OK) return rc;
    if (n < 1 || (train && n > m->def->max_batch))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "batch size %d is outside 1..%d", n, m->def->max_batch);
    const stage *s0 = &m->stages[first], *sl = &m->stages[last];
    ps_shape ins;
    ps_stage_in_shape(s0, &ins);
    for (int l = 0; l < s0->nlayers; l++) {   /* nodes reading the stage input check it (ids in range) */
        const ps_layer *ly = &s0->layers[l];
        int reads = 0;
        for (int i = 0; i < ly->nin; i++) reads |= s0->in_val[l * PS_NODE_MAX_INPUTS + i] == 0;
        if (reads && ly->kind->check_input &&
            (rc = ly->kind->check_input(ly, x, n * ps_shape_numel(&ins), err)) != PS_OK)
            return ps_err_prefix(err, "stage '%s'", s0->def->name);
    }
    size_t in_sample = (size_t)ps_shape_numel(&ins) * ps_dtype_size(s0->info.in_dtype);
    int64_t out_sample = ps_shape_numel(&ps_stage_out_layer(sl)->outs);
    ps_rng rng;
    ps_rng_seed(&rng, dropout_seed);
    /* One shared acquisition for the whole call: one weights version, even
     * for an eval forward run in slices (bounded memory). */
    ps_model_call_begin(m, 0);
    ps_prof_rdlock(&m->lock, PS_PHASE_LOCK);
    int64_t t0 = ps_prof_begin();
    wset *ws = pin(m, version_used);
    int slice = train || m->eval_whole ? n : EVAL_SLICE;
    for (int o = 0; o < n && rc == PS_OK; o += slice) {
        int k = n - o < slice ? n - o : slice;
        rc = ps_exec_forward(m, ws, first, last, (const char *)x + (size_t)o * in_sample, k, train,
                             train && tape_out, dropout_masks, &rng, out ? out + (size_t)o * out_sample : NULL,
                             tape_out, err);
    }
    unpin(m, ws);
    ps_prof_end(PS_PHASE_COMPUTE, t0);
    pthread_rwlock_unlock(&m->lock);
    ps_model_call_end(m);
    return rc;
}

ps_status ps_model_backward_acc(ps_model *m, ps_tape *t, const float *grad_out, float *grad_in, ps_grads *acc,
                                ps_err *err) {
    ps_model_call_begin(m, 0);
    ps_prof_rdlock(&m->lock, PS_PHASE_LOCK);
    int64_t t0 = ps_prof_begin();
    wset *ws = pin(m, NULL);
    ps_status rc = ps_exec_backward(m, ws, t, grad_out, grad_in, acc, err);
    unpin(m, ws);
    ps_prof_end(PS_PHASE_COMPUTE, t0);
    pthread_rwlock_unlock(&m->lock);
    ps_model_call_end(m);
    return rc;
}

ps_status ps_model_forward(ps_model *m, const float *x, int n, int train, const float *const *dropout_masks,
                           uint64_t dropout_seed, float *out, ps_tape **tape_out, uint64_t *version_used,
                           ps_err *err) {
    if (n > m->def->max_batch)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "batch size %d is outside 1..%d", n, m->def->max_batch);
    return ps_model_forward_range(m, 0, m->nstages - 1, x, n, train, dropout_masks, dropout_seed, out, tape_out,
                                  version_used, err);
}


ps_status ps_model_backward(ps_model *m, ps_tape *t, const float *grad_out, ps_err *err) {
    ps_grads_free(t->own);
    t->own = ps_grads_create(m, err);
    if (!t->own) return PS_ERR_RESOURCE_EXHAUSTED;
    ps_status rc = ps_model_backward_acc(m, t, grad_out, NULL, t->own, err);
    if (rc != PS_OK) { ps_grads_free(t->own); t->own = NULL; }
    return rc;
}

ps_status ps_tape_get_grad(ps_model *m, const ps_tape *t, int i, float *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    if (!t->own) return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "no gradients yet (Backward first)");
    return ps_grads_get(m, t->own, i, host_dst, err);
}

/* ------------------------------------------------------------------ step */

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
 * buffers; the records in fold order. Built before the weights lock. */
typedef struct fold_plan {
    int *order;              /* (nrecs) record indices in (key, seq) order, stable */
    int nlayers;
    int (*at)[2];            /* (nlayers) stage, layer */
    float *(*fbuf)[PS_LAYER_MAX_BUFFERS]; /* per node: host copies of its float32 buffers */
} fold_plan;

static const ps_grads *g_sort;   /* qsort has no context; the sort runs under fold_mu */
static pthread_mutex_t fold_mu = PTHREAD_MUTEX_INITIALIZER;

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
        int k = 0;
        while (k < fp->nlayers && (fp->at[k][0] != rec->stage || fp->at[k][1] != rec->layer)) k++;
        if (k < fp->nlayers) continue;
        fp->at[k][0] = rec->stage;
        fp->at[k][1] = rec->layer;
        fp->nlayers++;
        const ps_layer *ly = &m->stages[rec->stage].layers[rec->layer];
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
        int k = 0;
        while (fp->at[k][0] != rec->stage || fp->at[k][1] != rec->layer) k++;
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
        ws->w[s] = ps_backend_alloc_floats(st->be, st->nweights ? st->nweights : 1);
        ws->bufw[s] = ps_backend_alloc_floats(st->be, st->nbufw ? st->nbufw : 1);
        if (!ws->w[s] || !ws->bufw[s]) {
            for (int k = 0; k <= s; k++) {
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
    const wset *cur = &m->sets[m->cur];   /* steady: only steps change cur */
    for (int s = 0; s < m->nstages && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        if (st->nweights) rc = ps_stage_copy(st, next->w[s], cur->w[s], st->nweights, err);
        if (rc == PS_OK && st->nbufw) rc = ps_stage_copy(st, next->bufw[s], cur->bufw[s], st->nbufw, err);
    }
    int wrote = 0;
    for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
        if (!pg[i].dense && !pg[i].rows) continue;
        rc = update_param(m, i, &pg[i], next->w, err);
        wrote = 1;
    }
    if (rc == PS_OK && fp->nlayers) {
        rc = fold_apply(m, g, fp, next->bufw, err);
        wrote = 1;
    }
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
        for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
            if (!pg[i].dense && !pg[i].rows) continue;
            rc = update_param(m, i, &pg[i], m->sets[0].w, err);
            wrote = 1;
        }
        if (rc == PS_OK && fp.nlayers) {
            rc = fold_apply(m, g, &fp, m->sets[0].bufw, err);
            wrote = 1;
        }
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

ps_status ps_model_step(ps_model *m, const ps_tape *t, uint64_t *version, ps_err *err) {
    if (!t->own) return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "no gradients to apply (Backward first)");
    return ps_model_step_grads(m, t->own, version, err);
}

/* ------------------------------------------------- checkpoint support */

const ps_optim_spec *ps_model_optim(const ps_model *m) { return &m->optim; }

ps_status ps_model_snapshot(ps_model *m, float *w, int64_t *step, float *const *state, uint64_t *version,
                            ps_err *err) {
    return ps_model_snapshot_ex(m, w, step, state, NULL, version, err);
}

ps_status ps_model_snapshot_ex(ps_model *m, float *w, int64_t *step, float *const *state, void *const *bufs,
                               uint64_t *version, ps_err *err) {
    ps_status rc = PS_OK;
    /* one version: snapshot steps run beside readers, so they are held off
     * (step_mu, taken before the lock as they take it) while the optimizer
     * state is read */
    if (m->snapshots) pthread_mutex_lock(&m->step_mu);
    pthread_rwlock_rdlock(&m->lock);
    uint64_t v = 0;
    wset *ws = pin(m, &v);
    for (int i = 0; bufs && i < m->nbuffers && rc == PS_OK; i++) rc = copy_buffer_out(m, ws, i, bufs[i], err);
    int64_t o = 0;
    for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
        stage *st = &m->stages[m->loc[i].stage];
        size_t bytes = (size_t)m->params[i].numel * sizeof(float);
        rc = st->be->ops->copy_to_host(st->be->impl, w + o, ws->w[m->loc[i].stage] + m->loc[i].off, bytes, err);
        if (step) step[i] = m->ost[i].step;
        for (int j = 0; state && j < m->nstate && rc == PS_OK; j++) {
            if (m->ost[i].step > 0)
                rc = st->be->ops->copy_to_host(st->be->impl, state[j] + o, m->ost[i].buf[j], bytes, err);
            else
                memset(state[j] + o, 0, bytes);
        }
        o += m->params[i].numel;
    }
    if (version) *version = v;
    unpin(m, ws);
    pthread_rwlock_unlock(&m->lock);
    if (m->snapshots) pthread_mutex_unlock(&m->step_mu);
    return rc;
}

ps_status ps_model_set_optim_state(ps_model *m, int i, int64_t step, const float *const *state, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    if (step < 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: optimizer step %lld is negative", m->params[i].name,
                          (long long)step);
    float *zeros = NULL;
    if (!state && m->nstate && !(zeros = zeros_for(m, i, err))) return PS_ERR_RESOURCE_EXHAUSTED;
    pthread_rwlock_wrlock(&m->lock);
    ps_status rc = put_optim_state(m, i, step, state, zeros, err);
    pthread_rwlock_unlock(&m->lock);
    free(zeros);
    return rc;
}

void ps_model_set_version(ps_model *m, uint64_t version) {
    pthread_mutex_lock(&m->version_mu);
    m->version = version;
    pthread_mutex_unlock(&m->version_mu);
}
