/* model.c - sequential models split into placed stages (see model.h).
 *
 * An architecture is a table: stages, each a list of layers. The executor
 * below walks that table for forward and, in reverse, for backward; nothing
 * in it knows about MNIST. Adding a model means adding a table (and, if it
 * needs one, a layer kind).
 */
#include "model.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rng.h"

/* ---------------------------------------------------------------- tables */

typedef enum {
    LK_CONV,       /* out channels, k, stride, pad; params weight, bias */
    LK_RELU,
    LK_MAXPOOL,    /* k, stride */
    LK_DROPOUT,    /* p; elementwise (nn.Dropout) */
    LK_FLATTEN,    /* (c,h,w) -> (c*h*w,1,1); a view */
    LK_LINEAR,     /* out features; params weight, bias */
    LK_LOGSOFTMAX, /* over the feature dimension */
} layer_kind;

typedef struct layer_def {
    layer_kind kind;
    const char *name; /* parameter prefix for layers with parameters */
    int out, k, stride, pad;
    float p;
} layer_def;

typedef struct stage_def {
    const char *name;
    const layer_def *layers;
    int n;
} stage_def;

typedef struct arch_def {
    const char *name;
    int c, h, w;      /* per-sample input */
    int max_batch;
    const stage_def *stages;
    int nstages;
} arch_def;

/* PyTorch's RPC parameter-server tutorial network. Its forward is:
 * conv1, relu, conv2, max_pool2d(2), dropout(0.25), flatten | fc1, relu,
 * dropout(0.5), fc2, log_softmax. The "|" is the tutorial's device split. */
static const layer_def mnist_conv_layers[] = {
    {.kind = LK_CONV, .name = "conv1", .out = 32, .k = 3, .stride = 1, .pad = 0},
    {.kind = LK_RELU},
    {.kind = LK_CONV, .name = "conv2", .out = 64, .k = 3, .stride = 1, .pad = 0},
    {.kind = LK_MAXPOOL, .k = 2, .stride = 2},
    {.kind = LK_DROPOUT, .p = 0.25f},
    {.kind = LK_FLATTEN},
};
static const layer_def mnist_fc_layers[] = {
    {.kind = LK_LINEAR, .name = "fc1", .out = 128},
    {.kind = LK_RELU},
    {.kind = LK_DROPOUT, .p = 0.5f},
    {.kind = LK_LINEAR, .name = "fc2", .out = 10},
    {.kind = LK_LOGSOFTMAX},
};
static const stage_def mnist_stages[] = {
    {"conv", mnist_conv_layers, sizeof mnist_conv_layers / sizeof mnist_conv_layers[0]},
    {"fc", mnist_fc_layers, sizeof mnist_fc_layers / sizeof mnist_fc_layers[0]},
};
static const arch_def arch_table[] = {
    {"mnist_cnn", 1, 28, 28, 512, mnist_stages, 2},
};
static const char *const arch_names[] = {"mnist_cnn", NULL};

const char *const *ps_model_arch_names(void) { return arch_names; }

/* ------------------------------------------------------------- instances */

typedef struct layer {
    const layer_def *def;
    int in_c, in_h, in_w;    /* per-sample input shape */
    int out_c, out_h, out_w; /* per-sample output shape */
    int64_t w_off, b_off;    /* offsets into the stage's parameter block; -1 if none */
    int w_idx;               /* index of the weight in the model's param list, -1 if none */
    int dropout_idx;         /* index among dropout layers, -1 if not dropout */
    int in_layout;           /* PS_LAYOUT_* this layer computes its input in */
    int out_layout;          /* PS_LAYOUT_* of its output */
} layer;

typedef struct stage {
    const stage_def *def;
    char device[32];
    int host_memory;         /* device memory is host memory (cpu) */
    ps_backend *be;
    layer *layers;
    int nlayers;
    int64_t nweights;        /* floats in the parameter block */
    float *w;                /* (nweights) parameters, on the stage's device */
    float *mom;              /* (nweights) momentum buffers, NULL when momentum == 0 */
} stage;

struct ps_model {
    const arch_def *arch;
    stage stages[PS_MODEL_MAX_STAGES];
    int nstages;
    ps_param_info *params;
    int *param_stage;        /* stage of each param */
    int64_t *param_off;      /* offset in its stage block */
    unsigned char *first_step; /* per param: momentum buffer not yet started */
    int nparams;
    int ndropout;
    int64_t total_weights;
    float lr, momentum, weight_decay;
    pthread_rwlock_t lock;   /* weights: shared for forward/backward, exclusive for step */
    pthread_mutex_t version_mu;
    uint64_t version;
    int thread_budget;       /* compute threads shared by the calls computing at once */
    int inflight;            /* __atomic: forward/backward calls computing now */
};

typedef struct tape_stage {
    float **acts;            /* nlayers+1 activations; acts[0] is the stage input */
    float **masks;           /* per layer: dropout mask or NULL */
    void **ws;               /* per layer: pooling workspace or NULL */
    float **rin;             /* per layer: its input reordered to in_layout, or NULL */
    float *grads;            /* (nweights) this context's gradients, NULL before backward */
    unsigned char *owned;    /* per activation: allocated here (1) or aliased (0) */
} tape_stage;

struct ps_tape {
    ps_model *m;
    int n;
    int has_grads;
    tape_stage st[PS_MODEL_MAX_STAGES];
};

static int64_t act_numel(int n, int c, int h, int w) { return (int64_t)n * c * h * w; }

static const arch_def *find_arch(const char *name) {
    for (size_t i = 0; i < sizeof arch_table / sizeof arch_table[0]; i++)
        if (name && !strcmp(arch_table[i].name, name)) return &arch_table[i];
    return NULL;
}

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

/* 1 when the stage's backend offers a blocked layout for c channels. */
static int blocked_ok(const stage *st, int c) {
    const ps_backend_ops *ops = st->be->ops;
    return ops->blocked_layout && ops->reorder && ops->blocked_layout(st->be->impl, c) > 0;
}

static int prev_layout(const stage *st, int l) {
    return l == 0 ? PS_LAYOUT_PLAIN : st->layers[l - 1].out_layout;
}

/* Activation layouts: convolutions work on the backend's blocked layout
 * where it has one (much faster kernels), relu and max-pool keep the layout
 * they get, everything else (dropout with its masks in PyTorch order,
 * flatten, linear, log-softmax) and the stage's output are plain. The
 * executor reorders where consecutive layers disagree. */
static void plan_layouts(stage *st) {
    int cur = PS_LAYOUT_PLAIN;
    for (int l = 0; l < st->nlayers; l++) {
        layer *ly = &st->layers[l];
        int last = l == st->nlayers - 1;
        ly->in_layout = ly->out_layout = PS_LAYOUT_PLAIN;
        switch (ly->def->kind) {
        case LK_CONV:
            if (blocked_ok(st, ly->in_c)) ly->in_layout = PS_LAYOUT_BLOCKED;
            if (!last && blocked_ok(st, ly->out_c)) ly->out_layout = PS_LAYOUT_BLOCKED;
            break;
        case LK_RELU:
        case LK_MAXPOOL:
            if (!last) ly->in_layout = ly->out_layout = cur;
            break;
        default:
            break;
        }
        cur = ly->out_layout;
    }
}

/* Start of a compute call: size its threads so that the calls computing
 * at once share the budget (two trainers on two cores: one thread each,
 * rather than four threads fighting over two cores). Returns the thread
 * count; pair with call_end. */
static int call_begin(ps_model *m, int exclusive) {
    int k = exclusive ? 1 : __atomic_add_fetch(&m->inflight, 1, __ATOMIC_RELAXED);
    int nt = m->thread_budget / (k > 0 ? k : 1);
    if (nt < 1) nt = 1;
    for (int s = 0; s < m->nstages; s++)
        if (m->stages[s].be->ops->set_threads) m->stages[s].be->ops->set_threads(m->stages[s].be->impl, nt);
    return nt;
}

static void call_end(ps_model *m) { __atomic_sub_fetch(&m->inflight, 1, __ATOMIC_RELAXED); }

/* PyTorch's default init for Conv2d and Linear: kaiming_uniform_(a=sqrt(5))
 * for the weight and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias; both
 * reduce to U(-1/sqrt(fan_in), 1/sqrt(fan_in)). */
static void init_uniform(float *p, int64_t n, int64_t fan_in, ps_rng *r) {
    float bound = 1.0f / sqrtf((float)fan_in);
    for (int64_t i = 0; i < n; i++) p[i] = (2.0f * ps_rng_uniform(r) - 1.0f) * bound;
}

void ps_model_free(ps_model *m) {
    if (!m) return;
    for (int s = 0; s < m->nstages; s++) {
        stage *st = &m->stages[s];
        if (st->be) {
            ps_backend_release(st->be, st->w);
            ps_backend_release(st->be, st->mom);
        }
        ps_backend_free(st->be);
        free(st->layers);
    }
    if (m->params)
        for (int i = 0; i < m->nparams; i++) free((char *)m->params[i].name);
    free(m->params);
    free(m->param_stage);
    free(m->param_off);
    free(m->first_step);
    pthread_rwlock_destroy(&m->lock);
    pthread_mutex_destroy(&m->version_mu);
    free(m);
}

static ps_status add_param(ps_model *m, int s, const char *prefix, const char *suffix, int ndim,
                           const int64_t *dims, int64_t off, ps_err *err) {
    ps_param_info *pi = &m->params[m->nparams];
    char *name = malloc(strlen(prefix) + strlen(suffix) + 2);
    if (!name) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    sprintf(name, "%s.%s", prefix, suffix);
    pi->name = name;
    pi->ndim = ndim;
    pi->numel = 1;
    for (int d = 0; d < ndim; d++) { pi->dims[d] = dims[d]; pi->numel *= dims[d]; }
    pi->stage = m->stages[s].def->name;
    pi->device = m->stages[s].device;
    m->param_stage[m->nparams] = s;
    m->param_off[m->nparams] = off;
    m->first_step[m->nparams] = 1;
    m->nparams++;
    return PS_OK;
}

ps_model *ps_model_create(const ps_model_opts *o, ps_err *err) {
    const arch_def *a = find_arch(o->arch);
    if (!a) {
        ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "unknown model '%s' (known: mnist_cnn)",
                   o->arch ? o->arch : "(null)");
        return NULL;
    }
    for (int i = 0; i < o->n_placement; i++) {
        int found = 0;
        for (int s = 0; s < a->nstages; s++) found |= !strcmp(a->stages[s].name, o->placement_stage[i]);
        if (!found) {
            char known[256] = "";
            for (int s = 0; s < a->nstages; s++) {
                strncat(known, s ? ", " : "", sizeof known - strlen(known) - 1);
                strncat(known, a->stages[s].name, sizeof known - strlen(known) - 1);
            }
            ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                       "model.placement: model '%s' has no stage '%s' (stages: %s)", a->name,
                       o->placement_stage[i], known);
            return NULL;
        }
    }
    ps_model *m = calloc(1, sizeof *m);
    if (!m) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); return NULL; }
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* Steps must not starve behind a stream of forwards. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&m->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&m->version_mu, NULL);
    m->arch = a;
    m->lr = o->lr;
    m->momentum = o->momentum;
    m->weight_decay = o->weight_decay;
    m->thread_budget = o->compute_threads;
    if (m->thread_budget <= 0) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        m->thread_budget = ncpu > 0 ? (int)ncpu : 1;
    }

    int maxp = 0;
    for (int s = 0; s < a->nstages; s++) maxp += 2 * a->stages[s].n;
    m->params = calloc(maxp, sizeof *m->params);
    m->param_stage = calloc(maxp, sizeof *m->param_stage);
    m->param_off = calloc(maxp, sizeof *m->param_off);
    m->first_step = calloc(maxp, 1);
    if (!m->params || !m->param_stage || !m->param_off || !m->first_step) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }

    ps_rng rng;
    ps_rng_seed(&rng, o->seed);
    int c = a->c, h = a->h, w = a->w;
    for (int s = 0; s < a->nstages; s++) {
        stage *st = &m->stages[s];
        st->def = &a->stages[s];
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
        st->nlayers = st->def->n;
        st->layers = calloc(st->nlayers, sizeof *st->layers);
        if (!st->layers) { ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); goto fail; }
        for (int l = 0; l < st->nlayers; l++) {
            layer *ly = &st->layers[l];
            const layer_def *d = &st->def->layers[l];
            ly->def = d;
            ly->in_c = c; ly->in_h = h; ly->in_w = w;
            ly->w_off = ly->b_off = -1;
            ly->w_idx = -1;
            ly->dropout_idx = -1;
            switch (d->kind) {
            case LK_CONV: {
                int64_t wd[4] = {d->out, c, d->k, d->k}, bd[1] = {d->out};
                ly->w_idx = m->nparams;
                ly->w_off = st->nweights;
                st->nweights += wd[0] * wd[1] * wd[2] * wd[3];
                ly->b_off = st->nweights;
                st->nweights += d->out;
                if (add_param(m, s, d->name, "weight", 4, wd, ly->w_off, err) ||
                    add_param(m, s, d->name, "bias", 1, bd, ly->b_off, err))
                    goto fail;
                c = d->out;
                h = (h + 2 * d->pad - d->k) / d->stride + 1;
                w = (w + 2 * d->pad - d->k) / d->stride + 1;
                break;
            }
            case LK_LINEAR: {
                int in = c * h * w;
                int64_t wd[2] = {d->out, in}, bd[1] = {d->out};
                ly->w_idx = m->nparams;
                ly->w_off = st->nweights;
                st->nweights += (int64_t)d->out * in;
                ly->b_off = st->nweights;
                st->nweights += d->out;
                if (add_param(m, s, d->name, "weight", 2, wd, ly->w_off, err) ||
                    add_param(m, s, d->name, "bias", 1, bd, ly->b_off, err))
                    goto fail;
                c = d->out; h = 1; w = 1;
                break;
            }
            case LK_MAXPOOL:
                h = (h - d->k) / d->stride + 1;
                w = (w - d->k) / d->stride + 1;
                break;
            case LK_FLATTEN:
                c = c * h * w; h = 1; w = 1;
                break;
            case LK_DROPOUT:
                ly->dropout_idx = m->ndropout++;
                break;
            case LK_RELU:
            case LK_LOGSOFTMAX:
                break;
            }
            ly->out_c = c; ly->out_h = h; ly->out_w = w;
        }
        plan_layouts(st);
        /* Initialise on the host in state_dict order, then move to the device. */
        float *host = malloc((size_t)st->nweights * sizeof(float));
        st->w = ps_backend_alloc_floats(st->be, st->nweights);
        if (m->momentum > 0) st->mom = ps_backend_alloc_floats(st->be, st->nweights);
        if (!host || !st->w || (m->momentum > 0 && !st->mom)) {
            free(host);
            ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for stage '%s' weights",
                       st->def->name);
            goto fail;
        }
        for (int l = 0; l < st->nlayers; l++) {
            layer *ly = &st->layers[l];
            if (ly->w_idx < 0) continue;
            const ps_param_info *pw = &m->params[ly->w_idx];
            int64_t fan_in = pw->numel / pw->dims[0];
            init_uniform(host + ly->w_off, pw->numel, fan_in, &rng);
            init_uniform(host + ly->b_off, m->params[ly->w_idx + 1].numel, fan_in, &rng);
        }
        ps_status rc = st->be->ops->copy_to_device(st->be->impl, st->w, host,
                                                   (size_t)st->nweights * sizeof(float), err);
        if (rc == PS_OK && st->mom) {
            memset(host, 0, (size_t)st->nweights * sizeof(float));
            rc = st->be->ops->copy_to_device(st->be->impl, st->mom, host,
                                             (size_t)st->nweights * sizeof(float), err);
        }
        free(host);
        if (rc != PS_OK) goto fail;
        m->total_weights += st->nweights;
    }
    return m;
fail:
    ps_model_free(m);
    return NULL;
}

const char *ps_model_arch(const ps_model *m) { return m->arch->name; }
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
void ps_model_input_shape(const ps_model *m, int *c, int *h, int *w) {
    *c = m->arch->c; *h = m->arch->h; *w = m->arch->w;
}
int ps_model_output_size(const ps_model *m) {
    const stage *st = &m->stages[m->nstages - 1];
    const layer *ly = &st->layers[st->nlayers - 1];
    return ly->out_c * ly->out_h * ly->out_w;
}
int ps_model_max_batch(const ps_model *m) { return m->arch->max_batch; }

uint64_t ps_model_version(const ps_model *m) {
    ps_model *mm = (ps_model *)m;
    pthread_mutex_lock(&mm->version_mu);
    uint64_t v = mm->version;
    pthread_mutex_unlock(&mm->version_mu);
    return v;
}

ps_status ps_model_get_param(ps_model *m, int i, float *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    stage *st = &m->stages[m->param_stage[i]];
    pthread_rwlock_rdlock(&m->lock);
    ps_status rc = st->be->ops->copy_to_host(st->be->impl, host_dst, st->w + m->param_off[i],
                                             (size_t)m->params[i].numel * sizeof(float), err);
    pthread_rwlock_unlock(&m->lock);
    return rc;
}

ps_status ps_model_set_param(ps_model *m, int i, const float *host_src, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    stage *st = &m->stages[m->param_stage[i]];
    pthread_rwlock_wrlock(&m->lock);
    ps_status rc = st->be->ops->copy_to_device(st->be->impl, st->w + m->param_off[i], host_src,
                                               (size_t)m->params[i].numel * sizeof(float), err);
    m->first_step[i] = 1;
    pthread_rwlock_unlock(&m->lock);
    return rc;
}

/* ----------------------------------------------------------------- tapes */

void ps_tape_free(ps_tape *t) {
    if (!t) return;
    ps_model *m = t->m;
    for (int s = 0; s < m->nstages; s++) {
        stage *st = &m->stages[s];
        tape_stage *ts = &t->st[s];
        if (ts->acts)
            for (int l = 0; l <= st->nlayers; l++)
                if (ts->owned[l]) ps_backend_release(st->be, ts->acts[l]);
        if (ts->masks)
            for (int l = 0; l < st->nlayers; l++) ps_backend_release(st->be, ts->masks[l]);
        if (ts->ws)
            for (int l = 0; l < st->nlayers; l++) ps_backend_release(st->be, ts->ws[l]);
        if (ts->rin)
            for (int l = 0; l < st->nlayers; l++) ps_backend_release(st->be, ts->rin[l]);
        ps_backend_release(st->be, ts->grads);
        free(ts->acts);
        free(ts->masks);
        free(ts->ws);
        free(ts->rin);
        free(ts->owned);
    }
    free(t);
}

int ps_tape_has_grads(const ps_tape *t) { return t->has_grads; }
int ps_tape_batch(const ps_tape *t) { return t->n; }

size_t ps_model_tape_bytes(const ps_model *m, int n) {
    size_t bytes = 0;
    for (int s = 0; s < m->nstages; s++) {
        const stage *st = &m->stages[s];
        bytes += (size_t)st->nweights * sizeof(float);
        const layer *l0 = &st->layers[0];
        bytes += (size_t)act_numel(n, l0->in_c, l0->in_h, l0->in_w) * sizeof(float);
        for (int l = 0; l < st->nlayers; l++) {
            const layer *ly = &st->layers[l];
            size_t out = (size_t)act_numel(n, ly->out_c, ly->out_h, ly->out_w) * sizeof(float);
            bytes += out;
            if (ly->def->kind == LK_DROPOUT) bytes += out;
            if (ly->in_layout != prev_layout(st, l))
                bytes += (size_t)act_numel(n, ly->in_c, ly->in_h, ly->in_w) * sizeof(float);
        }
    }
    return bytes;
}

/* Move a host or device buffer of stage `from` into a buffer usable by stage
 * `to`. Host-memory stages share pointers; host <-> device is one copy by
 * the device side's backend; two devices of one backend use its
 * copy_from_peer (peer copy, or pinned host staging inside the backend);
 * anything else goes through a host bounce buffer. On success *dst is
 * either src (aliased, *owned = 0) or a new buffer of `to` (*owned = 1). */
static ps_status cross_stage(stage *from, stage *to, const float *src, int64_t count, float **dst,
                             int *owned, ps_err *err) {
    if (from->host_memory && to->host_memory) {
        *dst = (float *)src;
        *owned = 0;
        return PS_OK;
    }
    size_t bytes = (size_t)count * sizeof(float);
    float *out = ps_backend_alloc_floats(to->be, count);
    float *bounce = NULL;
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
    return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory moving %lld floats "
                      "from stage %s to stage %s", (long long)count, from->def->name, to->def->name);
}

static ps_status layer_forward(stage *st, tape_stage *ts, int l, int n, int train,
                               const float *const *dropout_masks, ps_rng *rng, ps_err *err) {
    layer *ly = &st->layers[l];
    const layer_def *d = ly->def;
    const ps_backend_ops *ops = st->be->ops;
    void *impl = st->be->impl;
    const float *x = ts->acts[l];
    int64_t out_count = act_numel(n, ly->out_c, ly->out_h, ly->out_w);
    int pl = prev_layout(st, l);
    if (ly->in_layout != pl) {  /* kept in the tape: backward needs the input in this layout */
        float *r = ps_backend_alloc_floats(st->be, act_numel(n, ly->in_c, ly->in_h, ly->in_w));
        if (!r) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for activations");
        ts->rin[l] = r;
        ps_status rc = ops->reorder(impl, n, ly->in_c, ly->in_h, ly->in_w, x, pl, r, ly->in_layout, err);
        if (rc != PS_OK) return rc;
        x = r;
    }
    if (d->kind == LK_FLATTEN || (d->kind == LK_DROPOUT && !train)) {
        ts->acts[l + 1] = (float *)x;   /* a view of the input */
        ts->owned[l + 1] = 0;
        return PS_OK;
    }
    float *y = ps_backend_alloc_floats(st->be, out_count);
    if (!y) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for activations");
    ts->acts[l + 1] = y;
    ts->owned[l + 1] = 1;
    switch (d->kind) {
    case LK_CONV: {
        ps_conv_desc cd = {n, ly->in_c, ly->in_h, ly->in_w, d->out, d->k, d->k, d->stride, d->pad,
                           ly->in_layout, ly->out_layout};
        return ops->conv2d_forward(impl, &cd, x, st->w + ly->w_off, st->w + ly->b_off, y, err);
    }
    case LK_LINEAR: {
        ps_linear_desc ld = {n, ly->in_c * ly->in_h * ly->in_w, d->out};
        return ops->linear_forward(impl, &ld, x, st->w + ly->w_off, st->w + ly->b_off, y, err);
    }
    case LK_RELU:
        return ops->relu_forward(impl, out_count, x, y, err);
    case LK_MAXPOOL: {
        ps_pool_desc pd = {n, ly->in_c, ly->in_h, ly->in_w, d->k, d->stride, ly->in_layout};
        size_t wsb = ops->maxpool_workspace_size(impl, &pd);
        ts->ws[l] = wsb ? ops->alloc(impl, wsb) : NULL;
        if (wsb && !ts->ws[l]) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for pooling");
        return ops->maxpool_forward(impl, &pd, x, y, ts->ws[l], err);
    }
    case LK_DROPOUT: {
        float *mask = ps_backend_alloc_floats(st->be, out_count);
        if (!mask) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for dropout");
        ts->masks[l] = mask;
        ps_status rc;
        if (dropout_masks) {
            rc = ops->copy_to_device(impl, mask, dropout_masks[ly->dropout_idx],
                                     (size_t)out_count * sizeof(float), err);
        } else {
            float *host = malloc((size_t)out_count * sizeof(float));
            if (!host) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for dropout");
            float keep = 1.0f / (1.0f - d->p);
            for (int64_t i = 0; i < out_count; i++) host[i] = ps_rng_uniform(rng) < d->p ? 0.0f : keep;
            rc = ops->copy_to_device(impl, mask, host, (size_t)out_count * sizeof(float), err);
            free(host);
        }
        if (rc != PS_OK) return rc;
        return ops->mul(impl, out_count, x, mask, y, err);
    }
    case LK_LOGSOFTMAX:
        return ops->log_softmax_forward(impl, n, ly->in_c * ly->in_h * ly->in_w, x, y, err);
    case LK_FLATTEN:
        break;
    }
    return PS_OK;
}

ps_status ps_model_forward(ps_model *m, const float *x, int n, int train,
                           const float *const *dropout_masks, uint64_t dropout_seed, float *out,
                           ps_tape **tape_out, uint64_t *version_used, ps_err *err) {
    if (tape_out) *tape_out = NULL;
    if (n < 1 || n > m->arch->max_batch)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "batch size %d is outside 1..%d", n,
                          m->arch->max_batch);
    ps_tape *t = calloc(1, sizeof *t);
    if (!t) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    t->m = m;
    t->n = n;
    ps_status rc = PS_OK;
    for (int s = 0; s < m->nstages; s++) {
        int nl = m->stages[s].nlayers;
        tape_stage *ts = &t->st[s];
        ts->acts = calloc(nl + 1, sizeof *ts->acts);
        ts->owned = calloc(nl + 1, 1);
        ts->masks = calloc(nl, sizeof *ts->masks);
        ts->ws = calloc(nl, sizeof *ts->ws);
        ts->rin = calloc(nl, sizeof *ts->rin);
        if (!ts->acts || !ts->owned || !ts->masks || !ts->ws || !ts->rin) {
            ps_tape_free(t);
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    ps_rng rng;
    ps_rng_seed(&rng, dropout_seed);

    call_begin(m, 0);
    pthread_rwlock_rdlock(&m->lock);
    if (version_used) *version_used = ps_model_version(m);
    /* The input enters the first stage's device. Eval passes on a host
     * stage read the caller's buffer in place; a tape kept for backward
     * owns a copy. */
    stage *s0 = &m->stages[0];
    const layer *l0 = &s0->layers[0];
    int64_t in_count = act_numel(n, l0->in_c, l0->in_h, l0->in_w);
    int keep = train && tape_out;
    if (s0->host_memory && !keep) {
        t->st[0].acts[0] = (float *)x;
        t->st[0].owned[0] = 0;
    } else {
        float *xd = ps_backend_alloc_floats(s0->be, in_count);
        if (!xd) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for input");
        else {
            t->st[0].acts[0] = xd;
            t->st[0].owned[0] = 1;
            rc = s0->be->ops->copy_to_device(s0->be->impl, xd, x, (size_t)in_count * sizeof(float), err);
        }
    }
    for (int s = 0; s < m->nstages && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        tape_stage *ts = &t->st[s];
        if (s > 0) {
            stage *prev = &m->stages[s - 1];
            const layer *pl = &prev->layers[prev->nlayers - 1];
            int owned;
            rc = cross_stage(prev, st, t->st[s - 1].acts[prev->nlayers],
                             act_numel(n, pl->out_c, pl->out_h, pl->out_w), &ts->acts[0], &owned, err);
            ts->owned[0] = (unsigned char)owned;
        }
        for (int l = 0; l < st->nlayers && rc == PS_OK; l++)
            rc = layer_forward(st, ts, l, n, train, dropout_masks, &rng, err);
    }
    pthread_rwlock_unlock(&m->lock);
    call_end(m);

    if (rc == PS_OK) {
        stage *last = &m->stages[m->nstages - 1];
        int outsz = ps_model_output_size(m);
        rc = last->be->ops->copy_to_host(last->be->impl, out, t->st[m->nstages - 1].acts[last->nlayers],
                                         (size_t)n * outsz * sizeof(float), err);
    }
    if (rc != PS_OK || !keep) {
        ps_tape_free(t);
        return rc;
    }
    *tape_out = t;
    return PS_OK;
}

static ps_status layer_backward(stage *st, tape_stage *ts, int l, int n, const float *dy, float *dx,
                                ps_err *err) {
    layer *ly = &st->layers[l];
    const layer_def *d = ly->def;
    const ps_backend_ops *ops = st->be->ops;
    void *impl = st->be->impl;
    const float *x = ts->rin[l] ? ts->rin[l] : ts->acts[l], *y = ts->acts[l + 1];
    int64_t out_count = act_numel(n, ly->out_c, ly->out_h, ly->out_w);
    switch (d->kind) {
    case LK_CONV: {
        ps_conv_desc cd = {n, ly->in_c, ly->in_h, ly->in_w, d->out, d->k, d->k, d->stride, d->pad,
                           ly->in_layout, ly->out_layout};
        return ops->conv2d_backward(impl, &cd, x, st->w + ly->w_off, dy, dx, ts->grads + ly->w_off,
                                    ts->grads + ly->b_off, err);
    }
    case LK_LINEAR: {
        ps_linear_desc ld = {n, ly->in_c * ly->in_h * ly->in_w, d->out};
        return ops->linear_backward(impl, &ld, x, st->w + ly->w_off, dy, dx, ts->grads + ly->w_off,
                                    ts->grads + ly->b_off, err);
    }
    case LK_RELU:
        return dx ? ops->relu_backward(impl, out_count, y, dy, dx, err) : PS_OK;
    case LK_MAXPOOL: {
        ps_pool_desc pd = {n, ly->in_c, ly->in_h, ly->in_w, d->k, d->stride, ly->in_layout};
        return dx ? ops->maxpool_backward(impl, &pd, ts->ws[l], dy, dx, err) : PS_OK;
    }
    case LK_DROPOUT:
        return dx ? ops->mul(impl, out_count, dy, ts->masks[l], dx, err) : PS_OK;
    case LK_LOGSOFTMAX:
        return dx ? ops->log_softmax_backward(impl, n, ly->in_c * ly->in_h * ly->in_w, y, dy, dx, err)
                  : PS_OK;
    case LK_FLATTEN:
        break;
    }
    return PS_OK;
}

ps_status ps_model_backward(ps_model *m, ps_tape *t, const float *grad_out, ps_err *err) {
    int n = t->n;
    ps_status rc = PS_OK;
    float *carry = NULL;          /* dy for the current layer, on the current stage's device */
    stage *carry_stage = NULL;
    int carry_owned = 0;

    call_begin(m, 0);
    pthread_rwlock_rdlock(&m->lock);
    for (int s = m->nstages - 1; s >= 0 && rc == PS_OK; s--) {
        stage *st = &m->stages[s];
        tape_stage *ts = &t->st[s];
        if (!ts->grads) {
            ts->grads = ps_backend_alloc_floats(st->be, st->nweights);
            if (!ts->grads) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients"); break; }
        }
        /* Bring dy onto this stage's device. */
        const layer *last = &st->layers[st->nlayers - 1];
        int64_t cnt = act_numel(n, last->out_c, last->out_h, last->out_w);
        float *dy = NULL;
        int dy_owned = 0;
        if (s == m->nstages - 1) {
            dy = ps_backend_alloc_floats(st->be, cnt);
            dy_owned = 1;
            if (!dy) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); break; }
            rc = st->be->ops->copy_to_device(st->be->impl, dy, grad_out, (size_t)cnt * sizeof(float), err);
        } else {
            float *moved;
            int moved_owned;
            rc = cross_stage(carry_stage, st, carry, cnt, &moved, &moved_owned, err);
            if (rc == PS_OK && !moved_owned) {
                dy = carry;                 /* same memory space: hand over */
                dy_owned = carry_owned;
            } else {
                if (carry_owned) ps_backend_release(carry_stage->be, carry);
                if (rc == PS_OK) { dy = moved; dy_owned = 1; }
            }
            carry = NULL;
            carry_owned = 0;
        }
        for (int l = st->nlayers - 1; l >= 0 && rc == PS_OK; l--) {
            layer *ly = &st->layers[l];
            int first = (s == 0 && l == 0);
            int64_t in_count = act_numel(n, ly->in_c, ly->in_h, ly->in_w);
            if (!(ly->def->kind == LK_FLATTEN || (ly->def->kind == LK_DROPOUT && !ts->masks[l]))) {
                float *dx = NULL;
                if (!first) {
                    dx = ps_backend_alloc_floats(st->be, in_count);
                    if (!dx) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); break; }
                }
                rc = layer_backward(st, ts, l, n, dy, dx, err);
                if (dy_owned) ps_backend_release(st->be, dy);
                dy = dx;
                dy_owned = dx != NULL;
            }   /* else a view: dy passes through unchanged */
            if (ts->rin[l] && dy && rc == PS_OK) {  /* back to the layout of this layer's input */
                float *r = ps_backend_alloc_floats(st->be, in_count);
                if (!r) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); break; }
                rc = st->be->ops->reorder(st->be->impl, n, ly->in_c, ly->in_h, ly->in_w, dy, ly->in_layout, r,
                                          prev_layout(st, l), err);
                if (dy_owned) ps_backend_release(st->be, dy);
                dy = r;
                dy_owned = 1;
            }
        }
        carry = dy;
        carry_owned = dy_owned;
        carry_stage = st;
    }
    pthread_rwlock_unlock(&m->lock);
    call_end(m);
    if (carry_owned && carry) ps_backend_release(carry_stage->be, carry);
    if (rc == PS_OK) t->has_grads = 1;
    return rc;
}

ps_status ps_tape_get_grad(ps_model *m, const ps_tape *t, int i, float *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    if (!t->has_grads) return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "no gradients yet (Backward first)");
    stage *st = &m->stages[m->param_stage[i]];
    return st->be->ops->copy_to_host(st->be->impl, host_dst, t->st[m->param_stage[i]].grads + m->param_off[i],
                                      (size_t)m->params[i].numel * sizeof(float), err);
}

ps_status ps_model_step(ps_model *m, const ps_tape *t, uint64_t *version, ps_err *err) {
    if (!t->has_grads) return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "no gradients to apply (Backward first)");
    ps_status rc = PS_OK;
    pthread_rwlock_wrlock(&m->lock);
    call_begin(m, 1);  /* nothing else computes while the weights are written */
    for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
        int s = m->param_stage[i];
        stage *st = &m->stages[s];
        int64_t off = m->param_off[i];
        ps_sgd_desc sd = {m->lr, m->momentum, m->weight_decay, m->first_step[i]};
        rc = st->be->ops->sgd_update(st->be->impl, m->params[i].numel, st->w + off, t->st[s].grads + off,
                                     st->mom ? st->mom + off : NULL, &sd, err);
        m->first_step[i] = 0;
    }
    pthread_mutex_lock(&m->version_mu);
    uint64_t v = ++m->version;
    pthread_mutex_unlock(&m->version_mu);
    pthread_rwlock_unlock(&m->lock);
    if (version) *version = v;
    return rc;
}

/* ------------------------------------------------- checkpoint support */

int ps_model_has_momentum(const ps_model *m) { return m->momentum > 0; }

ps_status ps_model_snapshot(ps_model *m, float *w, float *mom, unsigned char *started,
                            uint64_t *version, ps_err *err) {
    ps_status rc = PS_OK;
    pthread_rwlock_rdlock(&m->lock);
    int64_t o = 0;
    for (int i = 0; i < m->nparams && rc == PS_OK; i++) {
        stage *st = &m->stages[m->param_stage[i]];
        size_t bytes = (size_t)m->params[i].numel * sizeof(float);
        rc = st->be->ops->copy_to_host(st->be->impl, w + o, st->w + m->param_off[i], bytes, err);
        if (rc == PS_OK && mom && st->mom) {
            started[i] = !m->first_step[i];
            if (started[i])
                rc = st->be->ops->copy_to_host(st->be->impl, mom + o, st->mom + m->param_off[i], bytes,
                                               err);
            else
                memset(mom + o, 0, bytes);
        } else if (mom) {
            started[i] = 0;
        }
        o += m->params[i].numel;
    }
    if (version) *version = ps_model_version(m);
    pthread_rwlock_unlock(&m->lock);
    return rc;
}

ps_status ps_model_set_momentum(ps_model *m, int i, const float *host_src, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    stage *st = &m->stages[m->param_stage[i]];
    if (!st->mom)
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: the optimizer keeps no momentum buffers "
                          "(optimizer.momentum is 0)", m->params[i].name);
    ps_status rc = PS_OK;
    pthread_rwlock_wrlock(&m->lock);
    if (host_src)
        rc = st->be->ops->copy_to_device(st->be->impl, st->mom + m->param_off[i], host_src,
                                         (size_t)m->params[i].numel * sizeof(float), err);
    m->first_step[i] = host_src == NULL || rc != PS_OK;
    pthread_rwlock_unlock(&m->lock);
    return rc;
}

void ps_model_set_version(ps_model *m, uint64_t version) {
    pthread_mutex_lock(&m->version_mu);
    m->version = version;
    pthread_mutex_unlock(&m->version_mu);
}
