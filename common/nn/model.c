/* model.c - a hosted model: building it from the registry, its weights,
 * the weights lock around the executor's calls, versions, placement and
 * the optimizer step (see model.h). The executor is exec.c, accumulated
 * gradients grads.c. */
#include "model_impl.h"
#include "clock.h"
#include "prof.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const *ps_model_arch_names(void) { return ps_model_def_names(); }

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

void ps_model_free(ps_model *m) {
    if (!m) return;
    for (int s = 0; s < m->nstages; s++) {
        stage *st = &m->stages[s];
        if (st->be) {
            ps_backend_release(st->be, st->w);
            for (int j = 0; j < PS_OPTIM_MAX_STATE; j++) ps_backend_release(st->be, st->state[j]);
        }
        ps_backend_free(st->be);
        free(st->layers);
        free(st->slots);
    }
    if (m->params)
        for (int i = 0; i < m->nparams; i++) free((char *)m->params[i].name);
    free(m->params);
    if (m->def_params)
        for (int i = 0; i < m->ndef_params; i++) free((char *)m->def_params[i].name);
    free(m->def_params);
    free(m->loc);
    free(m->ost);
    pthread_rwlock_destroy(&m->lock);
    pthread_mutex_destroy(&m->version_mu);
    free(m);
}

/* The model's value of size key (registry default unless given). */
static double size_of(const ps_model *m, const char *key) {
    for (int i = 0; i < m->def->nsizes; i++)
        if (!strcmp(m->def->sizes[i].key, key)) return m->sizes[i];
    PS_ASSERT(!"layer refers to a size its model does not declare");
    return 0;
}

static ps_status resolve_sizes(ps_model *m, const ps_model_opts *o, ps_err *err) {
    const ps_model_def *d = m->def;
    for (int i = 0; i < d->nsizes; i++) m->sizes[i] = d->sizes[i].def;
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

static ps_status add_param(ps_model *m, int s, int l, int j, int64_t off, int64_t goff, ps_err *err) {
    stage *st = &m->stages[s];
    const ps_layer *ly = &st->layers[l];
    const ps_layer_param *lp = &ly->param[j];
    ps_param_info *pi = &m->params[m->nparams];
    char *name = malloc(strlen(ly->def->name) + strlen(lp->suffix) + 2);
    if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    sprintf(name, "%s.%s", ly->def->name, lp->suffix);
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

/* What one ps_model_create builds beyond the model itself. */
typedef struct build_ctx {
    const ps_model_opts *o;
    int shard_def;           /* definition index of opts->shard_stage, -1 = none */
} build_ctx;

/* Build stage st (definition index st->def_index): resolve sizes, infer
 * shapes, lay out parameters. s is its index among the hosted stages, or -1
 * for a stage hosted elsewhere: then only the shapes are inferred (no
 * backend, no parameters here). */
static ps_status build_stage(ps_model *m, stage *st, int s, const build_ctx *bc, ps_shape *shape,
                             ps_dtype *dtype, ps_err *err) {
    const ps_stage_def *sd = st->def;
    char b1[64];
    if (!sd->inherit || st->def_index == 0) {
        shape->ndim = sd->in_ndim;
        for (int d = 0; d < sd->in_ndim; d++)
            shape->dims[d] = sd->in_keys[d] ? (int64_t)size_of(m, sd->in_keys[d]) : sd->in_dims[d];
        *dtype = sd->in_dtype;
    }
    st->nlayers = sd->nlayers;
    st->layers = calloc(st->nlayers, sizeof *st->layers);
    st->slots = calloc(st->nlayers, sizeof *st->slots);
    if (!st->layers || !st->slots) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    st->info.name = sd->name;
    st->info.device = st->device;
    st->info.in_ndim = shape->ndim;
    memcpy(st->info.in_dims, shape->dims, sizeof st->info.in_dims);
    st->info.in_dtype = *dtype;
    st->dropout_base = m->ndropout;
    for (int l = 0; l < st->nlayers; l++) {
        ps_layer *ly = &st->layers[l];
        const ps_layer_def *d = &sd->layers[l];
        ly->def = d;
        ly->kind = ps_layer_kind_find(d->kind);
        PS_ASSERT(ly->kind && "the registry names a layer kind the table lacks");
        ly->out = d->out_key ? (int)size_of(m, d->out_key) : d->out;
        ly->num = d->num_key ? (int)size_of(m, d->num_key) : d->num;
        ly->p = d->p_key ? (float)size_of(m, d->p_key) : d->p;
        ly->k = d->k;
        ly->stride = d->stride;
        ly->pad = d->pad;
        ly->in = *shape;
        ly->in_dtype = *dtype;
        ly->dropout_idx = (ly->kind->flags & PS_KIND_DROPOUT) ? m->ndropout++ : -1;
        if (l == 0 && st->def_index == bc->shard_def) {
            const ps_model_opts *o = bc->o;
            if (strcmp(ly->kind->name, "embedding"))
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': stage '%s' cannot be sharded: its "
                                  "first layer is %s, not an embedding", m->def->name, sd->name, ly->kind->name);
            if (o->shard_lo < 0 || o->shard_lo >= o->shard_hi || o->shard_hi > ly->num)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': shard rows [%lld, %lld) of stage "
                                  "'%s' are not a non-empty range within its %d rows", m->def->name,
                                  (long long)o->shard_lo, (long long)o->shard_hi, sd->name, ly->num);
            ly->row_lo = o->shard_lo;
            ly->row_total = ly->num;
            ly->num = (int)(o->shard_hi - o->shard_lo);
            st->info.row_lo = o->shard_lo;
            st->info.row_hi = o->shard_hi;
        }
        ps_status rc = ps_layer_infer(ly, err);
        if (rc) return ps_err_prefix(err, "model '%s', stage '%s' (input %s)", m->def->name, sd->name,
                                     ps_shape_format(shape, b1, sizeof b1));
        if (s >= 0) {
            const char *missing = ly->kind->missing_op(st->be->ops);
            if (missing)
                return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model.placement.%s: %s: backend '%s' has no %s "
                                  "(layer kind '%s')", sd->name, st->device, st->be->ops->name, missing,
                                  ly->kind->name);
        }
        for (int j = 0; j < ly->nparams; j++) {
            int64_t goff = -1;
            if (!ly->param[j].sparse) { goff = st->ngrads; st->ngrads += ly->param[j].numel; }
            if (s >= 0 && (rc = add_param(m, s, l, j, st->nweights, goff, err)) != PS_OK) return rc;
            st->nweights += ly->param[j].numel;
        }
        *shape = ly->outs;
        *dtype = ly->out_dtype;
    }
    st->info.out_ndim = shape->ndim;
    memcpy(st->info.out_dims, shape->dims, sizeof st->info.out_dims);
    st->info.params = 0;
    for (int l = 0; l < st->nlayers; l++) st->info.params += st->layers[l].nparams;
    st->info.params_only = st->nlayers > 0;
    for (int l = 0; l < st->nlayers; l++)
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
        full.num = (int)ly->row_total;
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
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory drawing the initial %s.%s",
                          ly->def->name, p->suffix);
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
                char *name = malloc(strlen(ly->def->name) + strlen(lp->suffix) + 2);
                if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
                sprintf(name, "%s.%s", ly->def->name, lp->suffix);
                m->ndef_params++;
                *pi = (ps_param_info){.name = name, .ndim = lp->ndim, .numel = lp->numel, .stage = st->def->name,
                                      .device = st->device, .stage_index = hosted[ds] ? h : -1,
                                      .sparse = lp->sparse};
                memcpy(pi->dims, lp->dims, sizeof pi->dims);
                if (lp->sparse && ly->row_total) {   /* the whole table */
                    pi->dims[0] = ly->row_total;
                    pi->numel = lp->numel / ly->num * ly->row_total;
                }
            }
        }
        h += hosted[ds];
    }
    return PS_OK;
}

static void ghosts_free(stage *ghost) {
    for (int s = 0; s < PS_MODEL_MAX_STAGES; s++) {
        free(ghost[s].layers);
        free(ghost[s].slots);
        ghost[s].layers = NULL;
        ghost[s].slots = NULL;
    }
}

ps_model *ps_model_create(const ps_model_opts *o, ps_err *err) {
    const ps_model_def *a = ps_model_def_find(o->arch);
    if (!a) {
        char known[256] = "";
        for (const char *const *n = ps_model_def_names(); *n; n++) {
            strncat(known, n != ps_model_def_names() ? ", " : "", sizeof known - strlen(known) - 1);
            strncat(known, *n, sizeof known - strlen(known) - 1);
        }
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "unknown model '%s' (known: %s)", o->arch ? o->arch : "(null)",
                   known);
        return NULL;
    }
    PS_ASSERT(a->nstages <= PS_MODEL_MAX_STAGES && a->nsizes <= PS_MODEL_MAX_SIZES);
    for (int i = 0; i < o->n_placement; i++) {
        if (ps_model_def_stage(a, o->placement_stage[i]) < 0) {
            char known[256];
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                       "model.placement: model '%s' has no stage '%s' (stages: %s)", a->name,
                       o->placement_stage[i], ps_model_def_stage_list(a, known, sizeof known));
            return NULL;
        }
    }
    int hosted[PS_MODEL_MAX_STAGES] = {0};
    build_ctx bc = {o, -1};
    if (o->n_hosted < 0 || o->n_hosted > a->nstages) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': %d hosted stages (it has %d)", a->name, o->n_hosted,
                   a->nstages);
        return NULL;
    }
    for (int s = 0; s < a->nstages; s++) hosted[s] = o->n_hosted == 0;
    for (int i = 0; i < o->n_hosted; i++) {
        int s = def_stage_index(a, "hosted stages", o->hosted[i], err);
        if (s < 0) return NULL;
        hosted[s] = 1;
    }
    if (o->shard_stage) {
        if ((bc.shard_def = def_stage_index(a, "shard stage", o->shard_stage, err)) < 0) return NULL;
        if (!hosted[bc.shard_def]) {
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "model '%s': shard stage '%s' is not among the hosted stages",
                       a->name, o->shard_stage);
            return NULL;
        }
    }
    ps_model *m = calloc(1, sizeof *m);
    if (!m) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
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
    for (int s = 0; s < a->nstages; s++) maxp += PS_LAYER_MAX_PARAMS * a->stages[s].nlayers;
    m->params = calloc(maxp + 1, sizeof *m->params);
    m->loc = calloc(maxp + 1, sizeof *m->loc);
    m->ost = calloc(maxp + 1, sizeof *m->ost);
    if (!m->params || !m->loc || !m->ost) {
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
        st->be = ps_backend_create(is_cpu ? o->cpu_backend : "cuda", index, o->compute_threads, err);
        if (!st->be) {
            ps_err_prefix(err, "model.placement.%s: %s", st->def->name, st->device);
            goto fail;
        }
        if (build_stage(m, st, s, &bc, &shape, &dtype, err) != PS_OK) goto fail;
        ps_exec_plan_layouts(st);
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
        float *host = malloc((size_t)(st->nweights ? st->nweights : 1) * sizeof(float));
        st->w = ps_backend_alloc_floats(st->be, st->nweights ? st->nweights : 1);
        int have = 1;
        for (int j = 0; j < m->nstate; j++)
            have &= (st->state[j] = ps_backend_alloc_floats(st->be, st->nweights ? st->nweights : 1)) != NULL;
        if (!host || !st->w || !have) {
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
        free(host);
        if (rc != PS_OK) goto fail;
        m->total_weights += st->nweights;
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

int ps_model_num_stages(const ps_model *m) { return m->nstages; }
const ps_stage_info *ps_model_stage(const ps_model *m, int s) {
    return s >= 0 && s < m->nstages ? &m->stages[s].info : NULL;
}
int ps_model_find_stage(const ps_model *m, const char *name) {
    for (int s = 0; s < m->nstages; s++)
        if (name && !strcmp(m->stages[s].def->name, name)) return s;
    return -1;
}

void ps_model_input_shape(const ps_model *m, int *c, int *h, int *w) {
    const ps_stage_info *si = &m->stages[0].info;
    *c = si->in_ndim > 0 ? (int)si->in_dims[0] : 1;
    *h = si->in_ndim > 1 ? (int)si->in_dims[1] : 1;
    *w = si->in_ndim > 2 ? (int)si->in_dims[2] : 1;
}
int ps_model_output_size(const ps_model *m) {
    const stage *st = &m->stages[m->nstages - 1];
    return (int)ps_shape_numel(&st->layers[st->nlayers - 1].outs);
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
    ps_status rc = st->be->ops->copy_to_host(st->be->impl, host_dst, st->w + m->loc[i].off,
                                             (size_t)m->params[i].numel * sizeof(float), err);
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
    const ps_layer *l0 = &s0->layers[0];
    if (l0->kind->check_input && (rc = l0->kind->check_input(l0, x, n * ps_shape_numel(&l0->in), err)) != PS_OK)
        return ps_err_prefix(err, "stage '%s'", s0->def->name);
    size_t in_sample = (size_t)ps_shape_numel(&l0->in) * ps_dtype_size(l0->in_dtype);
    int64_t out_sample = ps_shape_numel(&sl->layers[sl->nlayers - 1].outs);
    ps_rng rng;
    ps_rng_seed(&rng, dropout_seed);
    /* One shared acquisition for the whole call: one weights version, even
     * for an eval forward run in slices (bounded memory). */
    ps_model_call_begin(m, 0);
    ps_prof_rdlock(&m->lock, PS_PHASE_LOCK);
    int64_t t0 = ps_prof_begin();
    if (version_used) *version_used = ps_model_version(m);
    int slice = train ? n : EVAL_SLICE;
    for (int o = 0; o < n && rc == PS_OK; o += slice) {
        int k = n - o < slice ? n - o : slice;
        rc = ps_exec_forward(m, first, last, (const char *)x + (size_t)o * in_sample, k, train, train && tape_out,
                             dropout_masks, &rng, out ? out + (size_t)o * out_sample : NULL, tape_out, err);
    }
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
    ps_status rc = ps_exec_backward(m, t, grad_out, grad_in, acc, err);
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
static ps_status update_param(ps_model *m, int i, const param_grad *g, ps_err *err) {
    const param_loc *pl = &m->loc[i];
    stage *st = &m->stages[pl->stage];
    float *w = st->w + pl->off;
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

ps_status ps_model_step_grads(ps_model *m, const ps_grads *g, uint64_t *version, ps_err *err) {
    if (!g || g->m != m)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "gradients of another model");
    if (!ps_grads_touched(g))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "no gradients to apply (Backward first)");
    /* Everything that can fail before any weight is written. The optimizer
     * state needs nothing here: it was allocated with the weights. */
    param_grad *pg = calloc((size_t)m->nparams, sizeof *pg);
    if (!pg) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the step");
    ps_status rc = PS_OK;
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
    if (rc == PS_OK) {
        int wrote = 0;
        ps_prof_wrlock(&m->lock, PS_PHASE_LOCK);
        int64_t t0 = ps_prof_begin();
        ps_model_call_begin(m, 1);  /* nothing else computes while the weights are written */
        for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
            if (!pg[i].dense && !pg[i].rows) continue;
            rc = update_param(m, i, &pg[i], err);
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
    ps_status rc = PS_OK;
    pthread_rwlock_rdlock(&m->lock);
    int64_t o = 0;
    for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
        stage *st = &m->stages[m->loc[i].stage];
        size_t bytes = (size_t)m->params[i].numel * sizeof(float);
        rc = st->be->ops->copy_to_host(st->be->impl, w + o, st->w + m->loc[i].off, bytes, err);
        if (step) step[i] = m->ost[i].step;
        for (int j = 0; state && j < m->nstate && rc == PS_OK; j++) {
            if (m->ost[i].step > 0)
                rc = st->be->ops->copy_to_host(st->be->impl, state[j] + o, m->ost[i].buf[j], bytes, err);
            else
                memset(state[j] + o, 0, bytes);
        }
        o += m->params[i].numel;
    }
    if (version) *version = ps_model_version(m);
    pthread_rwlock_unlock(&m->lock);
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
