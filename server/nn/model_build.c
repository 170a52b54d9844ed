/* model_build.c - a hosted model built from its model file (modeldef.h,
 * see model.h): devices and sizes resolved, each stage's nodes made in
 * topological order with their shapes inferred, parameters and buffers laid
 * out and initialised, the definition's whole parameter list; its teardown;
 * and `psd --describe` (ps_model_describe), which builds the shapes only. */
#include "model_impl.h"

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

static void stage_free(stage *st) {
    ps_exec_plan_free(st);
    free(st->layers);
    free(st->slots);
    free(st->order);
    free(st->in_off);
    free(st->in_val);
    free(st->in_shape);
    free(st->in_dtype);
    free(st->in_layout);
    free(st->val_layout);
    free(st->rg[0]);
    free(st->rg[1]);
    free(st->bufi);
    st->layers = NULL;
    st->slots = NULL;
    st->order = st->in_off = st->in_val = st->in_layout = st->val_layout = NULL;
    st->in_shape = NULL;
    st->in_dtype = NULL;
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
                if (k > 0 && st->inplace) break;   /* one copy, shared by every set */
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
    for (int i = 0; i < m->nalias; i++) free(m->alias_name[i]);
    free(m->alias_name);
    free(m->alias_owner);
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
    pthread_rwlock_destroy(&m->rows_lock);
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

/* "<node>.<suffix>", or the node's name alone for an empty suffix (a
 * tensor at the top of the module: vit's class_token). */
static char *join_name(const char *node, const char *suffix) {
    char *name = malloc(strlen(node) + strlen(suffix) + 2);
    if (name) sprintf(name, "%s%s%s", node, suffix[0] ? "." : "", suffix);
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
    pi->sparse = lp->sparse && !st->slots[l].shared[j];
    if (lp->sparse && ly->row_total) {
        pi->row_offset = ly->row_lo;
        pi->rows_total = ly->row_total;
    }
    m->loc[m->nparams] = (param_loc){s, l, j, off, goff};
    st->slots[l].param[j] = m->nparams;
    st->slots[l].w_off[j] = off;
    st->slots[l].g_off[j] = goff;
    m->nsparse += pi->sparse;
    m->nparams++;
    return PS_OK;
}

static ps_buffer_info buffer_info(const stage *st, const ps_layer *ly, int j, int stage_index, char *name) {
    const ps_layer_buffer *b = &ly->buffer[j];
    ps_buffer_info bi = {.name = name, .ndim = b->ndim, .numel = b->numel, .dtype = b->dtype, .stage = st->def->name,
                         .device = st->device, .stage_index = stage_index, .external = b->external};
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

/* "[origin: ]path:line: node 'x' (Kind)" before an error about node nd. */
static ps_status node_err(const ps_model *m, const ps_node_def *nd, ps_err *err) {
    return ps_err_prefix(err, "%s%s%s:%d: node '%s' (%s)", m->origin, m->origin[0] ? ": " : "", m->def->path, nd->line,
                         nd->name, nd->kind_name);
}

/* "origin: " before an error naming the model file (origin given). */
static ps_status origin_err(const char *origin, ps_err *err) {
    return origin && *origin ? ps_err_prefix(err, "%s", origin) : (err ? err->code : PS_ERR_INVALID_ARGUMENT);
}

/* ---- shared parameters (share: / tie:, modeldef.h) ---- */

/* The stage-local index of parameter suffix of ly, or -1. */
static int param_index(const ps_layer *ly, const char *suffix) {
    for (int j = 0; j < ly->nparams; j++)
        if (!strcmp(ly->param[j].suffix, suffix)) return j;
    return -1;
}

/* The line of nd's init: for suffix, 0 when none. */
static int init_given(const ps_node_def *nd, const char *suffix) {
    for (int i = 0; i < nd->ninit; i++)
        if (!strcmp(nd->inits[i].suffix, suffix)) return nd->inits[i].line;
    return 0;
}

/* Node l borrows parameter j from node o's parameter oj: checked (shapes,
 * no shard, not held for a trainer), recorded in the slots. */
static ps_status borrow(ps_model *m, stage *st, int l, int j, int o, int oj, int line, ps_err *err) {
    const ps_layer *ly = &st->layers[l], *ow = &st->layers[o];
    const ps_layer_param *p = &ly->param[j], *q = &ow->param[oj];
    char b1[64], b2[64];
    ps_shape s1 = {.ndim = p->ndim}, s2 = {.ndim = q->ndim};
    memcpy(s1.dims, p->dims, sizeof p->dims);
    memcpy(s2.dims, q->dims, sizeof q->dims);
    int same = p->ndim == q->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = p->dims[d] == q->dims[d];
    if (!same)
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: %s%s%s %s uses %s%s%s %s of node '%s' (%s, line %d): "
                   "shared parameters have one shape", line, ly->name, p->suffix[0] ? "." : "", p->suffix,
                   ps_shape_format(&s1, b1, sizeof b1), ow->name, q->suffix[0] ? "." : "", q->suffix,
                   ps_shape_format(&s2, b2, sizeof b2), ow->name, ow->kind->name, ow->def->line);
    else if (ly->row_total || ow->row_total)
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: %s is a shard's table (model.shard_stage) and shares its "
                   "weight with '%s' (line %d): a shared parameter is held whole", line,
                   ly->row_total ? ly->name : ow->name, ly->row_total ? ow->name : ly->name,
                   (ly->row_total ? ow : ly)->def->line);
    else if ((ly->flags | ow->flags) & PS_KIND_PARAMS_ONLY)
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: shares parameters with '%s' (line %d), but a trainer "
                   "runs %s (a parameter-only stage): psd shares parameters of nodes it runs", line, ow->name,
                   ow->def->line, (ly->flags & PS_KIND_PARAMS_ONLY) ? ly->name : ow->name);
    else if (init_given(ly->def, p->suffix))
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: init.%s of a parameter it uses from '%s' (line %d): give "
                   "the owner's init", init_given(ly->def, p->suffix), p->suffix, ow->name, ow->def->line);
    else {
        st->slots[l].owner[j] = o;
        st->slots[l].owner_j[j] = oj;
        st->slots[l].shared[j] = st->slots[o].shared[oj] = 1;
        return PS_OK;
    }
    return node_err(m, ly->def, err);
}

/* Node l uses the buffers of node o (share: of a node with buffers, a
 * BatchNorm called at several sites: PyTorch's module holds one set, which
 * each call's training forward updates): the same buffers, of one shape
 * each; recorded in buf_owner. */
static ps_status share_buffers(ps_model *m, stage *st, int l, int o, int line, ps_err *err) {
    const ps_layer *ly = &st->layers[l], *ow = &st->layers[o];
    if (!ly->nbuffers && !ow->nbuffers) return PS_OK;
    int same = ly->nbuffers == ow->nbuffers;
    for (int j = 0; same && j < ly->nbuffers; j++) {
        const ps_layer_buffer *a = &ly->buffer[j], *b = &ow->buffer[j];
        same = !strcmp(a->suffix, b->suffix) && a->dtype == b->dtype && a->ndim == b->ndim &&
               !memcmp(a->dims, b->dims, (size_t)a->ndim * sizeof a->dims[0]);
    }
    if (!same) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: share: '%s' (line %d) has %d buffers%s%s%s, this node "
                   "%d that do not match them: a module called at several sites holds one set; give both the same "
                   "attributes", line, ow->name, ow->def->line, ow->nbuffers, ow->nbuffers ? " (" : "",
                   ow->nbuffers ? ow->buffer[0].suffix : "", ow->nbuffers ? ", ...)" : "", ly->nbuffers);
        return node_err(m, ly->def, err);
    }
    if (ly->a.eps != ow->a.eps || ly->a.momentum != ow->a.momentum || ly->a.momentum_null != ow->a.momentum_null) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: share: '%s' (line %d) updates the buffers it lends with "
                   "eps %g, momentum %g%s; this node with eps %g, momentum %g%s: one module has one of each",
                   line, ow->name, ow->def->line, ow->a.eps, ow->a.momentum, ow->a.momentum_null ? " (null)" : "",
                   ly->a.eps, ly->a.momentum, ly->a.momentum_null ? " (null)" : "");
        return node_err(m, ly->def, err);
    }
    if ((ly->flags | ow->flags) & PS_KIND_PARAMS_ONLY) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: shares buffers with '%s' (line %d), but a trainer runs "
                   "%s (a parameter-only stage)", line, ow->name, ow->def->line,
                   (ly->flags & PS_KIND_PARAMS_ONLY) ? ly->name : ow->name);
        return node_err(m, ly->def, err);
    }
    st->slots[l].buf_owner = o;
    return PS_OK;
}

/* Every node's share: and tie: of stage st into its slots (owner,
 * owner_j, shared), once the shapes are inferred. */
static ps_status link_shared(ps_model *m, stage *st, ps_err *err) {
    int first = st->def->first;
    for (int l = 0; l < st->nlayers; l++) {
        for (int j = 0; j < PS_LAYER_MAX_PARAMS; j++) st->slots[l].owner[j] = -1;
        st->slots[l].buf_owner = -1;
    }
    for (int l = 0; l < st->nlayers; l++) {
        const ps_layer *ly = &st->layers[l];
        const ps_node_def *nd = ly->def;
        if (nd->share >= 0) {
            int o = nd->share - first;
            const ps_layer *ow = &st->layers[o];
            if (ly->nparams != ow->nparams) {   /* one kind, so one parameter list unless attributes differ */
                ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: share: '%s' (line %d) has %d parameters, this "
                           "node %d: give both the same attributes", nd->share_line, ow->name, ow->def->line,
                           ow->nparams, ly->nparams);
                return node_err(m, nd, err);
            }
            if (!ly->nparams && !ly->nbuffers && !ow->nbuffers) {
                ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: share: %s has no parameters to share",
                           nd->share_line, ly->kind->name);
                return node_err(m, nd, err);
            }
            ps_status brc = share_buffers(m, st, l, o, nd->share_line, err);
            if (brc != PS_OK) return brc;
            for (int j = 0; j < ly->nparams; j++) {
                ps_status rc = borrow(m, st, l, j, o, j, nd->share_line, err);
                if (rc != PS_OK) return rc;
            }
        }
        for (int t = 0; t < nd->ntie; t++) {
            const ps_tie_def *td = &nd->ties[t];
            int o = td->node - first, j = param_index(ly, td->suffix);
            int oj = param_index(&st->layers[o], td->owner_suffix);
            if (j < 0 || oj < 0) {
                const ps_layer *bad = j < 0 ? ly : &st->layers[o];
                char list[256] = "";
                for (int k = 0; k < bad->nparams; k++) {
                    size_t n = strlen(list);
                    snprintf(list + n, sizeof list - n, "%s%s", k ? ", " : "", bad->param[k].suffix);
                }
                ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "line %d: tie.%s: %s '%s' (line %d) has no parameter '%s' "
                           "(it has: %s)", td->line, td->suffix, bad->kind->name, bad->name, bad->def->line,
                           j < 0 ? td->suffix : td->owner_suffix, list[0] ? list : "none");
                return node_err(m, nd, err);
            }
            ps_status rc = borrow(m, st, l, j, o, oj, td->line, err);
            if (rc != PS_OK) return rc;
        }
    }
    return PS_OK;
}

/* Borrowed parameters and buffers take their owners' offsets (the owners
 * are laid out); add_dw marks every site after the first in backward order
 * (the reverse of the topological order), whose gradient is added to what
 * the sites before it wrote. */
static void lay_out_shared(stage *st) {
    for (int l = 0; l < st->nlayers; l++) {
        layer_slot *sl = &st->slots[l];
        if (sl->buf_owner < 0) continue;
        for (int j = 0; j < st->layers[l].nbuffers; j++) {
            sl->buffer[j] = st->slots[sl->buf_owner].buffer[j];
            sl->b_off[j] = st->slots[sl->buf_owner].b_off[j];
        }
    }
    for (int l = 0; l < st->nlayers; l++)
        for (int j = 0; j < st->layers[l].nparams; j++) {
            layer_slot *sl = &st->slots[l];
            if (sl->owner[j] < 0) continue;
            const layer_slot *os = &st->slots[sl->owner[j]];
            sl->param[j] = os->param[sl->owner_j[j]];
            sl->w_off[j] = os->w_off[sl->owner_j[j]];
            sl->g_off[j] = os->g_off[sl->owner_j[j]];
        }
    for (int k = st->nlayers - 1; k >= 0; k--) {
        int l = st->order[k];
        for (int j = 0; j < st->layers[l].nparams; j++) {
            if (!st->slots[l].shared[j]) continue;
            int before = 0;   /* a site later in topological order uses the same storage */
            for (int k2 = k + 1; k2 < st->nlayers && !before; k2++) {
                int l2 = st->order[k2];
                for (int j2 = 0; j2 < st->layers[l2].nparams && !before; j2++)
                    before = st->slots[l2].shared[j2] && st->slots[l2].w_off[j2] == st->slots[l].w_off[j];
            }
            st->slots[l].add_dw[j] = (unsigned char)before;
        }
    }
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
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s%s%s:%d: stage '%s': input dimension %d is %g "
                                  "(%s%s): not a whole number in 1..2^30", m->origin, m->origin[0] ? ": " : "",
                                  d->path, sd->line, sd->name, k + 1, v, sd->in_keys[k] ? "size " : "a literal",
                                  sd->in_keys[k] ? sd->in_keys[k] : "");
            shape->dims[k] = (int64_t)v;
        }
        *dtype = sd->in_dtype;
        if (!numel_ok(shape->ndim, shape->dims))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s%s%s:%d: stage '%s': the input is too large (at most "
                              "2^40 elements per sample)", m->origin, m->origin[0] ? ": " : "", d->path, sd->line,
                              sd->name);
    }
    int nl = st->nlayers = sd->count;
    st->layers = calloc((size_t)nl, sizeof *st->layers);
    st->slots = calloc((size_t)nl, sizeof *st->slots);
    st->order = calloc((size_t)nl, sizeof *st->order);
    st->in_off = calloc((size_t)nl + 1, sizeof *st->in_off);
    if (!st->layers || !st->slots || !st->order || !st->in_off)
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (int l = 0; l < nl; l++) st->in_off[l + 1] = st->in_off[l] + d->nodes[sd->first + l].nin;
    int ni = st->nins = st->in_off[nl], nia = ni ? ni : 1;
    st->in_val = calloc((size_t)nia, sizeof *st->in_val);
    st->in_shape = calloc((size_t)nia, sizeof *st->in_shape);
    st->in_dtype = calloc((size_t)nia, sizeof *st->in_dtype);
    st->in_layout = calloc((size_t)nia, sizeof *st->in_layout);
    if (!st->in_val || !st->in_shape || !st->in_dtype || !st->in_layout)
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
        ly->in = st->in_shape + st->in_off[l];
        ly->in_dtype = st->in_dtype + st->in_off[l];
        ly->in_layout = st->in_layout + st->in_off[l];
        ly->dropout_idx = (ly->kind->flags & PS_KIND_DROPOUT) ? m->ndropout++ : -1;
        for (int i = 0; i < nd->nin; i++) st->in_val[st->in_off[l] + i] = nd->in[i] < 0 ? 0 : nd->in[i] - sd->first + 1;
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
            int v = st->in_val[st->in_off[l] + i];
            ly->in[i] = v ? st->layers[v - 1].outs : in_shape;
            ly->in_dtype[i] = v ? st->layers[v - 1].out_dtype : in_dtype;
        }
        if (l == 0 && st->def_index == bc->shard_def) {
            const ps_model_opts *o = bc->o;
            if (strcmp(ly->kind->name, "Embedding"))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': stage '%s' cannot be sharded: its "
                                  "first node is %s, not an Embedding", d->name, sd->name, ly->kind->name);
            if (ly->a.ids_sliced)   /* the trainer routes each id of a sharded stage's input to its shard */
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': stage '%s' cannot be sharded: its "
                                  "Embedding '%s' reads a slice of the ids (ids_start), not the whole input",
                                  d->name, sd->name, ly->name);
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
            for (int i = 1; i < ly->nin; i++) {   /* the inputs after the first, ", " between them */
                size_t o = strlen(b2);
                if (i > 1 && o + 2 < sizeof b2) { strcpy(b2 + o, ", "); o += 2; }
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
    ps_status lrc = link_shared(m, st, err);
    if (lrc != PS_OK) return lrc;
    for (int l = 0; l < nl; l++) {   /* file order: state_dict order */
        ps_layer *ly = &st->layers[l];
        for (int j = 0; j < ly->nparams; j++) {
            if (st->slots[l].owner[j] >= 0) continue;   /* borrowed: laid out below */
            int64_t goff = -1;
            if (!ly->param[j].sparse || st->slots[l].shared[j]) { goff = st->ngrads; st->ngrads += ly->param[j].numel; }
            ps_status rc;
            if (s >= 0 && (rc = add_param(m, s, l, j, st->nweights, goff, err)) != PS_OK) return rc;
            st->slots[l].w_off[j] = st->nweights;
            st->slots[l].g_off[j] = goff;
            st->nweights += ly->param[j].numel;
        }
        for (int j = 0; j < ly->nbuffers && st->slots[l].buf_owner < 0; j++) {   /* shared: laid out below */
            const ps_layer_buffer *b = &ly->buffer[j];
            st->slots[l].buffer[j] = -1;
            if (b->dtype == PS_DTYPE_I64) { st->slots[l].b_off[j] = st->nbufi; st->nbufi += b->numel; }
            else { st->slots[l].b_off[j] = st->nbufw; st->nbufw += b->numel; }
            ps_status rc;
            if (s >= 0 && (rc = add_buffer(m, s, l, j, err)) != PS_OK) return rc;
        }
    }
    lay_out_shared(st);
    const ps_layer *ol = ps_stage_out_layer(st);
    *shape = ol->outs;
    *dtype = ol->out_dtype;
    st->info.out_ndim = shape->ndim;
    memcpy(st->info.out_dims, shape->dims, sizeof st->info.out_dims);
    st->info.params = 0;
    for (int l = 0; l < nl; l++)
        for (int j = 0; j < st->layers[l].nparams; j++) st->info.params += st->slots[l].owner[j] < 0;
    for (int l = 0; l < nl; l++)   /* batch statistics in eval too: eval forwards are not sliced */
        if ((st->layers[l].flags & PS_KIND_BUFFERS_EVAL) && !st->layers[l].nbuffers) m->eval_whole = 1;
    int po = 0;   /* flags, not the kind's: an LSTM over one step is held for the trainer, one over (L, in) runs */
    for (int l = 0; l < nl; l++) po += !!(st->layers[l].flags & PS_KIND_PARAMS_ONLY);
    if (po && po != nl) {   /* an LSTM fed one step by a node psd runs: the model file's parse let it through */
        for (int l = 0; l < nl; l++)
            if (st->layers[l].flags & PS_KIND_PARAMS_ONLY) {
                ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "per-sample input of one dimension: psd runs an LSTM over "
                           "(L, input_size) sequences; one that reads one step is held for a trainer and must be "
                           "alone in its stage, reading its input");
                return node_err(m, st->layers[l].def, err);
            }
    }
    st->info.params_only = nl > 0 && po == nl;
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
                if (st->slots[l].owner[j] >= 0) continue;   /* borrowed: listed under its owner */
                const ps_layer_param *lp = &ly->param[j];
                ps_param_info *pi = &m->def_params[m->ndef_params];
                char *name = join_name(ly->name, lp->suffix);
                if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
                m->ndef_params++;
                *pi = (ps_param_info){.name = name, .ndim = lp->ndim, .numel = lp->numel, .stage = st->def->name,
                                      .device = st->device, .stage_index = hosted[ds] ? h : -1,
                                      .sparse = lp->sparse && !st->slots[l].shared[j]};
                memcpy(pi->dims, lp->dims, sizeof pi->dims);
                if (lp->sparse && ly->row_total) {   /* the whole table */
                    pi->dims[0] = ly->row_total;
                    pi->numel = lp->numel / ly->a.num * ly->row_total;
                }
            }
        }
        h += hosted[ds];
    }
    int na = 0;   /* tied parameters' other names (tie:, not share:) */
    for (int ds = 0; ds < m->def->nstages; ds++)
        for (int l = 0; l < seq[ds]->nlayers; l++) na += seq[ds]->layers[l].def->ntie;
    m->alias_name = calloc((size_t)na + 1, sizeof *m->alias_name);
    m->alias_owner = calloc((size_t)na + 1, sizeof *m->alias_owner);
    if (!m->alias_name || !m->alias_owner) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (int ds = 0; ds < m->def->nstages; ds++) {
        const stage *st = seq[ds];
        for (int l = 0; l < st->nlayers; l++) {
            const ps_node_def *nd = st->layers[l].def;
            for (int t = 0; t < nd->ntie; t++) {
                char *owner = join_name(m->def->nodes[nd->ties[t].node].name, nd->ties[t].owner_suffix);
                char *name = join_name(nd->name, nd->ties[t].suffix);
                int o = -1;
                for (int i = 0; owner && i < m->ndef_params && o < 0; i++)
                    if (!strcmp(m->def_params[i].name, owner)) o = i;
                free(owner);
                if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
                PS_ASSERT(o >= 0 && "a tie's owner is a parameter of the definition");
                m->alias_name[m->nalias] = name;
                m->alias_owner[m->nalias++] = o;
            }
        }
    }
    int nb = 0;   /* and every buffer */
    for (int ds = 0; ds < m->def->nstages; ds++)
        for (int l = 0; l < seq[ds]->nlayers; l++)
            if (seq[ds]->slots[l].buf_owner < 0) nb += seq[ds]->layers[l].nbuffers;   /* shared: once */
    if (!(m->def_buffers = calloc((size_t)nb + 1, sizeof *m->def_buffers)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    h = 0;
    for (int ds = 0; ds < m->def->nstages; ds++) {
        const stage *st = seq[ds];
        for (int l = 0; l < st->nlayers; l++)
            for (int j = 0; j < st->layers[l].nbuffers && st->slots[l].buf_owner < 0; j++) {
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
    if (!a) { origin_err(o->origin, err); return NULL; }
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
    pthread_rwlock_init(&m->rows_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&m->version_mu, NULL);
    pthread_mutex_init(&m->wmu, NULL);
    pthread_cond_init(&m->wcv, NULL);
    pthread_mutex_init(&m->step_mu, NULL);
    m->def = a;
    snprintf(m->origin, sizeof m->origin, "%s", o->origin ? o->origin : "");
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
    ps_model_cpus_init(m, o->pin_compute);
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
                    if (st->slots[l].owner[j] < 0 && init_param(&st->layers[l], j, NULL, &rng, err) != PS_OK)
                        goto fail;
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
            double gib = ((double)nh + (double)st->nweights * (1 + m->nstate) + (double)st->nbufw) * sizeof(float) /
                         (1024.0 * 1024 * 1024);
            ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for stage '%s' weights (%lld parameters, "
                       "%.1f GiB with the optimizer state: model.sizes too large for this machine?)", st->def->name,
                       (long long)st->nweights, gib);
            goto fail;
        }
        ps_status rc = PS_OK;
        for (int l = 0; l < st->nlayers && rc == PS_OK; l++)
            for (int j = 0; j < st->layers[l].nparams && rc == PS_OK; j++)
                if (st->slots[l].owner[j] < 0)   /* borrowed: its owner's values */
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
                    if (b->dtype == PS_DTYPE_I64)
                        st->bufi[st->slots[l].b_off[j] + k] =
                            b->init_i64 ? b->init_i64(&st->layers[l], k) : (int64_t)b->init;
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
    m->snapshots = o->snapshot_steps && !shapes_only;
    for (int i = 0; m->snapshots && i < m->nparams; i++)   /* row-sparse stages step in place */
        if (m->params[i].sparse && !m->stages[m->loc[i].stage].inplace) {
            m->stages[m->loc[i].stage].inplace = 1;
            m->ninplace++;
        }
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
            for (int j = 0; j < st->layers[l].nparams; j++)
                if (st->slots[l].owner[j] < 0) params += st->layers[l].param[j].numel;   /* shared: once */
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
    for (int i = 0; i < m->def->nnodes; i++) {   /* shared parameters: counted once, under their owners */
        const ps_node_def *nd = &m->def->nodes[i];
        if (nd->share >= 0) {
            const ps_layer *ly = NULL;   /* its layer: buffers used too (a BatchNorm called at several sites) */
            for (int s = 0; s < m->nstages && !ly; s++)
                for (int l = 0; l < m->stages[s].nlayers && !ly; l++)
                    if (m->stages[s].layers[l].def == nd) ly = &m->stages[s].layers[l];
            const char *what = ly && ly->nbuffers ? (ly->nparams ? "parameters and buffers" : "buffers") : "parameters";
            fprintf(f, "  shared: %s uses the %s of %s (share, stage %s)\n", nd->name, what,
                    m->def->nodes[nd->share].name, m->def->stages[nd->stage].name);
        }
        for (int t = 0; t < nd->ntie; t++)
            fprintf(f, "  shared: %s%s%s is %s (tie, stage %s)\n", nd->name, nd->ties[t].suffix[0] ? "." : "",
                    nd->ties[t].suffix, nd->ties[t].target, m->def->stages[nd->stage].name);
    }
    ps_model_free(m);
    return PS_OK;
}
