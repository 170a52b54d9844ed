/* exec.c - the graph executor: plans each stage's memory once, runs a
 * consecutive run of stages forward on a tape, and backward from a tape
 * into accumulated gradients (see model.h, model_impl.h).
 *
 * Inside a stage the nodes form a DAG, run in a topological order. The
 * plan (per stage, for training and for eval forwards) decides:
 *  - layouts: kinds that prefer it (Conv2d) work on the backend's blocked
 *    layout, kinds that keep layouts (ReLU, pools, Add) keep the one they
 *    get, the rest and the stage output are plain; an input is reordered
 *    where its value's layout is not the one its node computes in;
 *  - storage: a view (Flatten, Reshape, Dropout in eval) shares its input's
 *    memory; an in-place kind (ReLU, Dropout, Add) writes over its input
 *    when no later node reads it and no backward needs it; every other
 *    activation is released right after its last reader unless backward
 *    reads it (the kind says whether its backward reads its inputs or its
 *    output) - an eval forward keeps nothing but the stage output.
 * Backward runs in reverse topological order: gradients are summed where a
 * value fans out, views and Add route them through, an in-place kind
 * writes d input over d output, and a node whose inputs need no gradient
 * and that has no parameters is skipped. Nothing here knows which model it
 * runs. No locks and no optimizer: model.c takes the weights lock around
 * these calls and owns the step. */
#include "model_impl.h"
#include "prof.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IV(st, l, i) ((st)->in_val[(st)->in_off[l] + (i)])
/* storage id of the reorder of node l's input i */
#define RBUF(st, l, i) (1 + (st)->nlayers + (st)->in_off[l] + (i))

/* ---------------------------------------------------------------- layouts */

/* 1 when the stage's backend offers a blocked layout for c channels. */
static int blocked_ok(const stage *st, int64_t c) {
    if (!st->be) return 0;   /* a shapes-only build (the stage table) */
    const ps_backend_ops *ops = st->be->ops;
    return ops->blocked_layout && ops->reorder && ops->blocked_layout(st->be->impl, (int)c) > 0;
}

/* The backend's channel block for c channels (0: none). */
static int block_of(const stage *st, int64_t c) {
    return blocked_ok(st, c) ? st->be->ops->blocked_layout(st->be->impl, (int)c) : 0;
}

static void plan_layouts(stage *st) {
    st->val_layout[0] = PS_LAYOUT_PLAIN;
    for (int k = 0; k < st->nlayers; k++) {
        int l = st->order[k];
        ps_layer *ly = &st->layers[l];
        int is_out = l + 1 == st->out_val;
        unsigned f = ly->flags;
        for (int i = 0; i < ly->nin; i++) ly->in_layout[i] = PS_LAYOUT_PLAIN;
        ly->out_layout = PS_LAYOUT_PLAIN;
        if ((f & PS_KIND_LAYOUT_BLOCKED) && ly->in[0].ndim == 3 && ly->outs.ndim == 3) {
            if (blocked_ok(st, ly->in[0].dims[0])) ly->in_layout[0] = PS_LAYOUT_BLOCKED;
            if (!is_out && blocked_ok(st, ly->outs.dims[0])) ly->out_layout = PS_LAYOUT_BLOCKED;
        } else if ((f & PS_KIND_LAYOUT_KEEP) && !is_out && ly->outs.ndim == 3) {
            /* blocked only where every input and the output have the same
             * block (a backend may block channel counts differently: a
             * Concat of two 8-channel tensors into 16 channels) */
            int lay = st->val_layout[IV(st, l, 0)];
            for (int i = 0; i < ly->nin; i++)
                if (st->val_layout[IV(st, l, i)] != lay || ly->in[i].ndim != 3 ||
                    (lay == PS_LAYOUT_BLOCKED && block_of(st, ly->in[i].dims[0]) != block_of(st, ly->outs.dims[0])))
                    lay = PS_LAYOUT_PLAIN;
            for (int i = 0; i < ly->nin; i++) ly->in_layout[i] = lay;
            ly->out_layout = lay;
        }
        st->val_layout[l + 1] = ly->out_layout;
    }
}

/* ------------------------------------------------- BatchNorm + activation
 * A ReLU right after a BatchNorm (every block of a ResNet; ReLU6 in
 * MobileNetV2's, LeakyReLU in DCGAN's) costs two passes over memory of its
 * own in training: its forward, and its backward reading what it kept.
 * Where the stage's backend folds it into its batch norm
 * (ops->batchnorm_relu) and it is all that reads the BatchNorm's output,
 * the BatchNorm applies it and takes its backward's dy through its
 * gradient itself (its fused: ps_chan_desc.act),
 * and the activation becomes a view whose backward passes the gradient
 * through: its output is the BatchNorm's, in the BatchNorm's layout, never
 * kept for the backward. Neither is the stage's output (its layout is
 * plain). PS_FUSE=0 in psd's environment leaves every pair as it is (a
 * benchmark's or a test's comparison). Returns the pairs folded. */

/* Node ly as the activation a batch norm folds in (act->on 0: not one it can). */
static void foldable_act(const ps_layer *ly, ps_bn_act *act) {
    const char *k = ly->kind->name;
    *act = (ps_bn_act){0, INFINITY, 0.0f};
    if (!strcmp(k, "ReLU")) act->on = 1;
    if (!strcmp(k, "LeakyReLU")) *act = (ps_bn_act){1, INFINITY, (float)ly->a.slope};
    if ((!strcmp(k, "ReLU6") || !strcmp(k, "Hardtanh")) && ly->a.min_val == 0.0 && ly->a.max_val > 0.0)
        *act = (ps_bn_act){1, (float)ly->a.max_val, 0.0f};
}

static int fuse_bn_relu(stage *st) {
    const char *off = getenv("PS_FUSE");
    if (!st->be || !st->be->ops->batchnorm_relu || (off && !strcmp(off, "0"))) return 0;
    int nl = st->nlayers, fused = 0;
    int *readers = calloc((size_t)nl + 1, sizeof *readers);   /* per value: the inputs reading it */
    if (!readers) return 0;                                   /* (then nothing is folded) */
    for (int l = 0; l < nl; l++)
        for (int i = 0; i < st->layers[l].nin; i++) readers[IV(st, l, i)]++;
    for (int l = 0; l < nl; l++) {
        ps_layer *ly = &st->layers[l];
        int v = IV(st, l, 0);
        ps_bn_act act;
        foldable_act(ly, &act);
        if (!act.on || v == 0 || readers[v] != 1 || v == st->out_val || l + 1 == st->out_val) continue;
        ps_layer *bn = &st->layers[v - 1];
        if (strcmp(bn->kind->name, "BatchNorm2d") && strcmp(bn->kind->name, "BatchNorm1d")) continue;
        bn->fused = act;
        ly->flags = PS_KIND_VIEW | PS_KIND_LAYOUT_KEEP | PS_KIND_GRAD_PASS;
        fused++;
    }
    free(readers);
    return fused;
}

/* ------------------------------------------------------------ memory plan */

static int is_view(const ps_layer *ly, int train) {
    return (ly->flags & PS_KIND_VIEW) || (!train && (ly->flags & PS_KIND_EVAL_VIEW));
}

/* The plan of one mode; see node_plan in model_impl.h. Contents (what a
 * storage holds at some point) use storage ids too: 0 the stage input,
 * 1 + l node l's output (when not a view), RBUF(l, i) a reorder. */
static ps_status plan_mode(stage *st, int train, ps_err *err) {
    int nl = st->nlayers, nb = 1 + nl + st->nins;
    stage_plan *p = &st->plan[train];
    p->nbufs = nb;
    p->node = calloc((size_t)nl, sizeof *p->node);
    p->kept = calloc((size_t)nb, 1);
    p->in_bufs = calloc((size_t)(st->nins ? st->nins : 1), sizeof *p->in_bufs);
    p->reorders = calloc((size_t)(st->nins ? st->nins : 1), sizeof *p->reorders);
    int *pos = calloc((size_t)nl, sizeof *pos);
    int *croot = calloc((size_t)nl + 1, sizeof *croot);      /* per value: its content */
    int *last_read = malloc((size_t)nb * sizeof *last_read); /* per content */
    unsigned char *kept_c = calloc((size_t)nb, 1);           /* per content: backward reads it */
    int *store = malloc((size_t)nb * sizeof *store);         /* per content: its storage */
    int *chain_last = malloc((size_t)nb * sizeof *chain_last); /* per storage: its last content */
    int *free_at = malloc((size_t)nb * sizeof *free_at);     /* per storage: position after which it goes */
    int *nfree = calloc((size_t)nl, sizeof *nfree);
    unsigned char *exists = calloc((size_t)nb, 1);          /* per storage: allocated by the plan */
    ps_status rc = PS_OK;
    if (!p->node || !p->kept || !p->in_bufs || !p->reorders || !pos || !croot || !last_read || !kept_c || !store ||
        !chain_last || !free_at || !nfree || !exists) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory planning stage '%s'", st->def->name);
        goto done;
    }
    for (int l = 0; l < nl; l++) {
        p->node[l].in_buf = p->in_bufs + st->in_off[l];
        p->node[l].reorder = p->reorders + st->in_off[l];
    }
    for (int c = 0; c < nb; c++) { last_read[c] = -1; store[c] = c; chain_last[c] = c; free_at[c] = -1; }
    for (int k = 0; k < nl; k++) pos[st->order[k]] = k;

    /* contents of values, reorders, reads */
    croot[0] = 0;
    for (int k = 0; k < nl; k++) {
        int l = st->order[k];
        const ps_layer *ly = &st->layers[l];
        node_plan *np = &p->node[l];
        for (int i = 0; i < ly->nin; i++) {
            int v = IV(st, l, i);
            np->reorder[i] = ly->in_layout[i] != st->val_layout[v];
            np->in_buf[i] = np->reorder[i] ? RBUF(st, l, i) : croot[v];   /* a content, for now */
            if (last_read[croot[v]] < k) last_read[croot[v]] = k;
            if (np->reorder[i]) last_read[RBUF(st, l, i)] = k;
            if (train && (ly->flags & PS_KIND_BWD_X)) kept_c[np->in_buf[i]] = 1;
        }
        croot[l + 1] = is_view(ly, train) ? np->in_buf[0] : 1 + l;
        if (train && (ly->flags & PS_KIND_BWD_Y) && !is_view(ly, train)) kept_c[1 + l] = 1;
    }
    int cout = croot[st->out_val];

    /* storages: in place where the input's content dies here */
    for (int k = 0; k < nl; k++) {
        int l = st->order[k];
        const ps_layer *ly = &st->layers[l];
        node_plan *np = &p->node[l];
        int c0 = np->in_buf[0];
        int dup = 0;
        for (int i = 1; i < ly->nin; i++) dup |= np->in_buf[i] == c0 || croot[IV(st, l, i)] == c0;
        int inplace = !is_view(ly, train) && (ly->flags & PS_KIND_INPLACE) && c0 != 0 && c0 != cout &&
                      last_read[c0] == k && !dup && !kept_c[c0] && ly->in_dtype[0] == PS_DTYPE_F32 &&
                      ly->out_dtype == PS_DTYPE_F32 && ps_shape_numel(&ly->in[0]) == ps_shape_numel(&ly->outs) &&
                      ly->in_layout[0] == ly->out_layout;
        if (!is_view(ly, train)) {
            if (inplace) {
                store[1 + l] = store[c0];
                chain_last[store[c0]] = 1 + l;
            }
            np->alloc = !inplace;
        }
    }
    /* storage ids of every read and write, release points: a storage goes
     * after the last read of the last content it holds, unless that content
     * is the stage's output or (training) backward reads it */
    for (int k = 0; k < nl; k++) {
        int l = st->order[k];
        const ps_layer *ly = &st->layers[l];
        node_plan *np = &p->node[l];
        for (int i = 0; i < ly->nin; i++) {
            np->in_buf[i] = store[np->in_buf[i]];
            if (np->reorder[i]) exists[RBUF(st, l, i)] = 1;
        }
        np->out_buf = store[croot[l + 1]];
        if (np->alloc) exists[1 + l] = 1;
    }
    p->out_buf = store[cout];
    for (int c = 1; c < nb; c++) {
        if (!exists[c]) continue;
        int last = chain_last[c];
        if (last == cout || (train && kept_c[last])) {
            p->kept[c] = (unsigned char)train;
            continue;
        }
        if (last_read[last] >= 0) free_at[c] = last_read[last];
    }
    p->kept[0] = (unsigned char)train;   /* the stage input stays in the tape */
    for (int c = 0; c < nb; c++)
        if (free_at[c] >= 0) nfree[st->order[free_at[c]]]++;
    for (int l = 0; l < nl; l++) {
        if (!nfree[l]) continue;
        if (!(p->node[l].free_buf = calloc((size_t)nfree[l], sizeof(int)))) {
            rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory planning stage '%s'", st->def->name);
            goto done;
        }
    }
    for (int c = 0; c < nb; c++) {
        if (free_at[c] < 0) continue;
        node_plan *np = &p->node[st->order[free_at[c]]];
        np->free_buf[np->nfree++] = c;
    }
    {
        const ps_layer *ol = ps_stage_out_layer(st);
        p->out_writable = train && cout != 0 && !is_view(ol, train) && !(ol->flags & PS_KIND_BWD_Y) && !kept_c[cout] &&
                          ol->out_dtype == PS_DTYPE_F32;
    }
done:
    free(pos);
    free(croot);
    free(last_read);
    free(kept_c);
    free(store);
    free(chain_last);
    free(free_at);
    free(nfree);
    free(exists);
    return rc;
}

/* ------------------------------------------------------ node profile
 * PS_EXEC_PROFILE=FILE: every node's forward and backward time, CPU (the
 * calling thread's) and wall, summed over the stage's life and appended to
 * FILE when the stage is freed, one line per node and direction. For
 * comparing where a call's time goes in psd and in-process
 * (bench_compute); off (one branch per node) when unset. A node's first
 * NP_SKIP calls each way are left out. */
enum { NP_FCPU, NP_FWALL, NP_FN, NP_BCPU, NP_BWALL, NP_BN, NP_FSEEN, NP_BSEEN, NP_COUNT };
#define NP_SKIP 10   /* the first calls of a node (primitive creation, first touch) are not counted */

static int64_t thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

typedef struct nprof_t { int64_t cpu, wall; } nprof_t;

static nprof_t nprof_begin(const stage *st) {
    nprof_t t = {0, 0};
    if (st->nprof) { t.cpu = thread_cpu_ns(); t.wall = ps_prof_now(); }
    return t;
}

static void nprof_end(const stage *st, int l, int bwd, nprof_t t) {
    if (!st->nprof) return;
    if (__atomic_add_fetch(&st->nprof[l * NP_COUNT + (bwd ? NP_BSEEN : NP_FSEEN)], 1, __ATOMIC_RELAXED) <= NP_SKIP)
        return;
    int64_t *c = &st->nprof[l * NP_COUNT + (bwd ? NP_BCPU : NP_FCPU)];
    __atomic_add_fetch(&c[0], thread_cpu_ns() - t.cpu, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c[1], ps_prof_now() - t.wall, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c[2], 1, __ATOMIC_RELAXED);
}

static void nprof_dump(const stage *st) {
    const char *path = getenv("PS_EXEC_PROFILE");
    FILE *f = path && *path ? fopen(path, "a") : NULL;
    if (!f) return;
    for (int l = 0; l <= st->nlayers; l++) {   /* nlayers: whole calls of runs starting here */
        const int64_t *c = &st->nprof[l * NP_COUNT];
        for (int d = 0; d < 2; d++) {
            const int64_t *e = c + d * 3;
            if (!e[2]) continue;
            fprintf(f, "exec_profile stage=%s node=%s kind=%s dir=%s calls=%lld cpu_us=%.1f wall_us=%.1f\n",
                    st->def->name, l < st->nlayers ? st->layers[l].name : "(call)",
                    l < st->nlayers ? st->layers[l].kind->name : "-", d ? "bwd" : "fwd",
                    (long long)e[2], e[0] / 1e3 / (double)e[2], e[1] / 1e3 / (double)e[2]);
        }
    }
    fclose(f);
}

void ps_exec_plan_free(stage *st) {
    if (st->nprof) nprof_dump(st);
    free(st->nprof);
    st->nprof = NULL;
    for (int m = 0; m < 2; m++) {
        stage_plan *p = &st->plan[m];
        if (p->node)
            for (int l = 0; l < st->nlayers; l++) free(p->node[l].free_buf);
        free(p->node);
        free(p->kept);
        free(p->in_bufs);
        free(p->reorders);
        memset(p, 0, sizeof *p);
    }
}

ps_status ps_exec_plan(stage *st, ps_err *err) {
    int nl = st->nlayers;
    st->val_layout = calloc((size_t)nl + 1, sizeof *st->val_layout);
    st->rg[0] = calloc((size_t)nl + 1, 1);
    st->rg[1] = calloc((size_t)nl + 1, 1);
    if (!st->val_layout || !st->rg[0] || !st->rg[1])
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory planning stage '%s'", st->def->name);
    st->info.fused_bn_relu = fuse_bn_relu(st);
    plan_layouts(st);
    const char *prof = getenv("PS_EXEC_PROFILE");
    if (prof && *prof && !(st->nprof = calloc(((size_t)nl + 1) * NP_COUNT, sizeof *st->nprof)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory planning stage '%s'", st->def->name);
    for (int want = 0; want < 2; want++) {   /* which values need a gradient */
        unsigned char *rg = st->rg[want];
        rg[0] = want && st->info.in_dtype == PS_DTYPE_F32;
        for (int k = 0; k < nl; k++) {
            int l = st->order[k];
            const ps_layer *ly = &st->layers[l];
            int g = ly->nparams > 0 && !(ly->flags & PS_KIND_PARAMS_ONLY);
            for (int i = 0; i < ly->nin; i++) g |= rg[IV(st, l, i)];
            rg[l + 1] = (unsigned char)(g && ly->out_dtype == PS_DTYPE_F32);
        }
    }
    ps_status rc = plan_mode(st, 0, err);
    if (rc == PS_OK) rc = plan_mode(st, 1, err);
    return rc;
}

/* ------------------------------------------------------------------ tapes */

static size_t act_bytes(const ps_shape *s, ps_dtype t, int n) {
    return (size_t)n * (size_t)ps_shape_numel(s) * ps_dtype_size(t);
}

/* Bytes of storage id b of stage st for n samples. */
size_t ps_exec_buf_bytes(const stage *st, int b, int n) {
    ps_shape tmp;
    if (b == 0) return act_bytes(ps_stage_in_shape(st, &tmp), st->info.in_dtype, n);
    if (b <= st->nlayers) return act_bytes(&st->layers[b - 1].outs, st->layers[b - 1].out_dtype, n);
    int j = b - 1 - st->nlayers;   /* a reorder of an input: entry j of the per-input arrays */
    return act_bytes(&st->in_shape[j], st->in_dtype[j], n);
}

ps_tape *ps_exec_tape_new(ps_model *m, int first, int last, int n) {
    ps_tape *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->m = m;
    t->first = first;
    t->last = last;
    t->n = n;
    for (int s = first; s <= last; s++) {
        const stage *st = &m->stages[s];
        tape_stage *ts = &t->st[s];
        ts->buf = calloc((size_t)st->plan[1].nbufs, sizeof *ts->buf);
        ts->owned = calloc((size_t)st->plan[1].nbufs, 1);
        ts->saved = calloc((size_t)(st->nlayers ? st->nlayers : 1), sizeof *ts->saved);
        if (!ts->buf || !ts->owned || !ts->saved) {
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
        if (ts->buf)
            for (int b = 0; b < st->plan[1].nbufs; b++)
                if (ts->owned[b]) ps_backend_release(st->be, ts->buf[b]);
        if (ts->saved)
            for (int l = 0; l < st->nlayers; l++)
                for (int j = 0; j < PS_LAYER_MAX_SAVED; j++) ps_backend_release(st->be, ts->saved[l].dev[j]);
        free(ts->buf);
        free(ts->saved);
        free(ts->owned);
    }
    free(t);
}

int ps_tape_batch(const ps_tape *t) { return t->n; }
int ps_tape_first_stage(const ps_tape *t) { return t->first; }
int ps_tape_last_stage(const ps_tape *t) { return t->last; }

/* What a training forward of stages first..last keeps for n samples (the
 * storages the plan keeps, the nodes' workspaces and masks), plus
 * (with_grads) the stages' dense gradient blocks. */
static size_t range_bytes(const ps_model *m, int first, int last, int n, int with_grads) {
    size_t bytes = 0;
    for (int s = first; s <= last; s++) {
        const stage *st = &m->stages[s];
        const stage_plan *p = &st->plan[1];
        if (with_grads) bytes += (size_t)st->ngrads * sizeof(float);
        for (int b = 0; b < p->nbufs; b++)
            if (p->kept[b]) bytes += ps_exec_buf_bytes(st, b, n);
        for (int l = 0; l < st->nlayers; l++) {
            const ps_layer *ly = &st->layers[l];
            if (ly->kind->tape_bytes) bytes += ly->kind->tape_bytes(ly, n);
        }
    }
    return bytes;
}

size_t ps_model_tape_bytes(const ps_model *m, int n) { return range_bytes(m, 0, m->nstages - 1, n, 1); }

size_t ps_tape_bytes(const ps_tape *t) { return range_bytes(t->m, t->first, t->last, t->n, 0); }

size_t ps_exec_tape_bytes(const ps_model *m, int first, int last, int n) { return range_bytes(m, first, last, n, 0); }

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
        bounce = malloc(bytes ? bytes : 4);
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
    if (st->be->ops->copy2d)   /* on the device */
        return st->be->ops->copy2d(st->be->impl, 1, count, src, count, dst, count, 0, err);
    float *bounce = malloc(bytes ? bytes : 4);
    if (!bounce) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory copying gradients");
    ps_status rc = st->be->ops->copy_to_host(st->be->impl, bounce, src, bytes, err);
    if (rc == PS_OK) rc = st->be->ops->copy_to_device(st->be->impl, dst, bounce, bytes, err);
    free(bounce);
    return rc;
}

/* ---------------------------------------------------------------- forward */

/* Node l's parameters and float32 buffers in the copy of the weights the
 * call computes with (ts->w, ts->bufw), and its int64 buffers (the stage's,
 * host memory: swin's relative_position_index). */
static void layer_params(const stage *st, const tape_stage *ts, int l, float **w, float **bw,
                         const int64_t **ib) {
    const ps_layer *ly = &st->layers[l];
    for (int j = 0; j < ly->nparams; j++) w[j] = ts->w + st->slots[l].w_off[j];
    for (int j = 0; j < ly->nbuffers; j++) {
        int f32 = ly->buffer[j].dtype == PS_DTYPE_F32;
        bw[j] = f32 ? ts->bufw + st->slots[l].b_off[j] : NULL;
        ib[j] = f32 ? NULL : st->bufi + st->slots[l].b_off[j];
    }
}

/* The call's weights into t's stages. */
static void tape_weights(ps_tape *t, const wset *ws) {
    for (int s = t->first; s <= t->last; s++) {
        t->st[s].w = ws->w[s];
        t->st[s].bufw = ws->bufw[s];
    }
}

static void release(stage *st, tape_stage *ts, int b) {
    if (ts->owned[b]) ps_backend_release(st->be, ts->buf[b]);
    ts->buf[b] = NULL;
    ts->owned[b] = 0;
}

/* A reorder of an (n, c, h, w) activation between layouts. */
static ps_status reorder(stage *st, const ps_shape *s, int n, const void *src, int from, void *dst, int to,
                         ps_err *err) {
    return st->be->ops->reorder(st->be->impl, n, (int)s->dims[0], (int)s->dims[1], (int)s->dims[2], src, from, dst,
                                to, err);
}

static ps_status node_forward(ps_model *m, stage *st, tape_stage *ts, const stage_plan *p, int l, int n, int train,
                              const float *mask, ps_rng *rng, ps_err *err) {
    ps_layer *ly = &st->layers[l];
    const node_plan *np = &p->node[l];
    ps_status rc = PS_OK;
    (void)m;
    for (int i = 0; i < ly->nin && rc == PS_OK; i++) {
        if (!np->reorder[i]) continue;
        int b = np->in_buf[i], v = IV(st, l, i);
        void *r = ps_backend_alloc_floats(st->be, ps_layer_in_count(ly, i, n));
        if (!r) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for activations");
        ts->buf[b] = r;
        ts->owned[b] = 1;
        int src = v ? p->node[v - 1].out_buf : 0;
        rc = reorder(st, &ly->in[i], n, ts->buf[src], st->val_layout[v], r, ly->in_layout[i], err);
    }
    if (rc != PS_OK) return rc;
    if (is_view(ly, train)) return PS_OK;   /* out_buf is in_buf[0] */
    if (np->alloc) {
        size_t ob = act_bytes(&ly->outs, ly->out_dtype, n);
        void *y = st->be->ops->alloc(st->be->impl, ob ? ob : 4);
        if (!y) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for activations");
        ts->buf[np->out_buf] = y;
        ts->owned[np->out_buf] = 1;
    }
    float *w[PS_LAYER_MAX_PARAMS] = {0}, *bw[PS_LAYER_MAX_BUFFERS] = {0};
    const int64_t *ib[PS_LAYER_MAX_BUFFERS] = {0};
    layer_params(st, ts, l, w, bw, ib);
    const void *xs[PS_NODE_MAX_INPUTS];
    for (int i = 0; i < ly->nin; i++) xs[i] = ts->buf[np->in_buf[i]];
    ps_layer_call c = {.ly = ly, .be = st->be, .n = n, .xs = xs, .x = xs[0], .y = ts->buf[np->out_buf], .w = w,
                       .buf = bw, .ibuf = ib, .saved = &ts->saved[l], .train = train, .mask = mask, .rng = rng};
    return ly->kind->forward(&c, err);
}

/* Forward of t's stages on x (host). keep: x is copied (a training tape
 * outlives the caller's buffer). */
static ps_status forward_stages(ps_model *m, ps_tape *t, const void *x, int keep, const float *const *masks,
                                ps_rng *rng, ps_err *err) {
    int n = t->n;
    stage *s0 = &m->stages[t->first];
    ps_shape tmp;
    size_t in_bytes = act_bytes(ps_stage_in_shape(s0, &tmp), s0->info.in_dtype, n);
    ps_status rc = PS_OK;
    tape_stage *t0 = &t->st[t->first];
    if (s0->host_memory && !keep) {
        t0->buf[0] = (void *)x;
        t0->owned[0] = 0;
    } else {
        void *xd = s0->be->ops->alloc(s0->be->impl, in_bytes ? in_bytes : 4);
        if (!xd) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for input");
        t0->buf[0] = xd;
        t0->owned[0] = 1;
        rc = s0->be->ops->copy_to_device(s0->be->impl, xd, x, in_bytes, err);
    }
    const stage_plan *pp = NULL;
    for (int s = t->first; s <= t->last && rc == PS_OK; s++) {
        stage *st = &m->stages[s];
        tape_stage *ts = &t->st[s];
        const stage_plan *p = &st->plan[t->train];
        if (s > t->first) {
            stage *prev = &m->stages[s - 1];
            const ps_layer *pl = ps_stage_out_layer(prev);
            int owned;
            rc = cross_stage(prev, st, t->st[s - 1].buf[pp->out_buf], act_bytes(&pl->outs, pl->out_dtype, n),
                             &ts->buf[0], &owned, err);
            ts->owned[0] = (unsigned char)owned;
        }
        for (int k = 0; k < st->nlayers && rc == PS_OK; k++) {
            int l = st->order[k];
            const ps_layer *ly = &st->layers[l];
            const float *mask = masks && ly->dropout_idx >= 0
                                    ? masks[ly->dropout_idx - m->stages[t->first].dropout_base] : NULL;
            nprof_t t0 = nprof_begin(st);
            rc = node_forward(m, st, ts, p, l, n, t->train, mask, rng, err);
            const node_plan *np = &p->node[l];
            for (int j = 0; j < np->nfree && rc == PS_OK; j++) release(st, ts, np->free_buf[j]);
            nprof_end(st, l, 0, t0);
        }
        pp = p;
    }
    return rc;
}

static const void *tape_out_ptr(const ps_model *m, const ps_tape *t) {
    const stage *last = &m->stages[t->last];
    return t->st[t->last].buf[last->plan[t->train].out_buf];
}

static ps_status tape_output(ps_model *m, const ps_tape *t, float *out, ps_err *err) {
    stage *last = &m->stages[t->last];
    const ps_layer *ly = ps_stage_out_layer(last);
    return last->be->ops->copy_to_host(last->be->impl, out, tape_out_ptr(m, t), act_bytes(&ly->outs, ly->out_dtype, t->n),
                                       err);
}

ps_status ps_tape_get_output(ps_model *m, const ps_tape *t, float *host_out, ps_err *err) {
    return tape_output(m, t, host_out, err);
}

float *ps_tape_output_writable(ps_tape *t) {
    stage *last = &t->m->stages[t->last];
    const stage_plan *p = &last->plan[1];
    if (!t->train || !last->host_memory || !p->out_writable || !t->st[t->last].owned[p->out_buf]) return NULL;
    return t->st[t->last].buf[p->out_buf];
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
        const ps_layer *a = ps_stage_out_layer(&m->stages[s]);
        ps_shape bin;
        ps_stage_in_shape(&m->stages[s + 1], &bin);
        if (!ps_shape_equal(&a->outs, &bin) || a->out_dtype != m->stages[s + 1].info.in_dtype) {
            char b1[64], b2[64];
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stage '%s' (output %s) does not feed stage '%s' "
                              "(input %s %s): run them separately", m->stages[s].def->name,
                              ps_shape_format(&a->outs, b1, sizeof b1), m->stages[s + 1].def->name,
                              ps_shape_format(&bin, b2, sizeof b2), ps_dtype_name(m->stages[s + 1].info.in_dtype));
        }
    }
    return PS_OK;
}

ps_status ps_exec_forward(ps_model *m, const wset *ws, int first, int last, const void *x, int n, int train,
                          int keep, const float *const *masks, ps_rng *rng, float *out, ps_tape **tape, ps_err *err) {
    if (tape) *tape = NULL;
    nprof_t t0 = nprof_begin(&m->stages[first]);
    ps_tape *t = ps_exec_tape_new(m, first, last, n);
    if (!t) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    t->train = train;
    tape_weights(t, ws);
    ps_status rc = forward_stages(m, t, x, keep, masks, rng, err);
    if (rc == PS_OK && out) rc = tape_output(m, t, out, err);
    if (rc == PS_OK && keep && tape) *tape = t;
    else ps_tape_free(t);
    nprof_end(&m->stages[first], m->stages[first].nlayers, 0, t0);
    return rc;
}

/* --------------------------------------------------------------- backward */

/* What one backward computes before it is committed to the accumulator. */
typedef struct pending {
    float *dense[PS_MODEL_MAX_STAGES];  /* this tape's stage gradients */
    int fresh[PS_MODEL_MAX_STAGES];     /* dense[s] becomes acc's block (acc had none) */
    ps_rows *rows;                      /* per parameter */
    const ps_bwd_parts *parts;          /* a combined backward: parameter gradients go to each part's own */
} pending;

static void pending_free(ps_model *m, pending *p) {
    for (int s = 0; s < m->nstages; s++) ps_backend_release(m->stages[s].be, p->dense[s]);
    if (p->rows)
        for (int i = 0; i < m->nparams; i++) ps_rows_clear(&p->rows[i]);
    free(p->rows);
}

/* Value gradients of one stage's backward. */
typedef struct vgrads {
    float **g;               /* per value: d loss / d value, in the value's layout (NULL: none yet) */
    unsigned char *owned;    /* allocated here (and writable) */
} vgrads;

static ps_status copy_floats(stage *st, float *dst, const float *src, int64_t count, ps_err *err) {
    return ps_stage_copy(st, dst, src, count, err);
}

/* d value v += g (count floats). g_owned: g may be taken over (and is
 * released when it is not). */
static ps_status deliver(stage *st, vgrads *vg, int v, float *g, int g_owned, int64_t count, ps_err *err) {
    ps_status rc = PS_OK;
    if (!vg->g[v]) {
        if (g_owned) {
            vg->g[v] = g;
            vg->owned[v] = 1;
            return PS_OK;
        }
        vg->g[v] = g;   /* aliased until someone adds to it */
        vg->owned[v] = 0;
        return PS_OK;
    }
    if (!vg->owned[v]) {   /* copy on write */
        float *c = ps_backend_alloc_floats(st->be, count);
        if (!c) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
        if (rc == PS_OK) rc = copy_floats(st, c, vg->g[v], count, err);
        if (rc != PS_OK) {
            ps_backend_release(st->be, c);
            if (g_owned) ps_backend_release(st->be, g);
            return rc;
        }
        vg->g[v] = c;
        vg->owned[v] = 1;
    }
    rc = st->be->ops->add(st->be->impl, count, vg->g[v], g, err);
    if (g_owned) ps_backend_release(st->be, g);
    return rc;
}

/* d input i of node l arrives as g in the layout node l computed in: back
 * to the value's layout, then into the value's gradient. */
static ps_status deliver_input(stage *st, const stage_plan *p, vgrads *vg, int l, int i, float *g, int g_owned, int n,
                               ps_err *err) {
    const ps_layer *ly = &st->layers[l];
    int v = IV(st, l, i);
    int64_t count = ps_layer_in_count(ly, i, n);
    if (p->node[l].reorder[i]) {
        float *r = ps_backend_alloc_floats(st->be, count);
        ps_status rc = r ? reorder(st, &ly->in[i], n, g, ly->in_layout[i], r, st->val_layout[v], err)
                         : ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        if (g_owned) ps_backend_release(st->be, g);
        if (rc != PS_OK) { ps_backend_release(st->be, r); return rc; }
        g = r;
        g_owned = 1;
    }
    return deliver(st, vg, v, g, g_owned, count, err);
}

/* ------------------------------------------- shared parameters' gradients */

ps_status ps_exec_dw_begin(stage *st, int l, float *dense, ps_rows *rows, float **dw, ps_rows **crows,
                           ps_dw_sites *f, ps_err *err) {
    const ps_layer *ly = &st->layers[l];
    const layer_slot *sl = &st->slots[l];
    memset(f, 0, sizeof *f);
    f->rj = -1;
    memset(dw, 0, PS_LAYER_MAX_PARAMS * sizeof *dw);
    *crows = NULL;
    for (int j = 0; j < ly->nparams; j++) {
        if (ly->param[j].sparse && !sl->shared[j]) { *crows = &rows[sl->param[j]]; continue; }
        f->dst[j] = dense + sl->g_off[j];
        if (sl->add_dw[j] && !(f->tmp[j] = ps_backend_alloc_floats(st->be, ly->param[j].numel))) {
            ps_exec_dw_end(st, l, f, PS_ERR_RESOURCE_EXHAUSTED, err);
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for the gradient of %s.%s",
                              ly->name, ly->param[j].suffix);
        }
        if (ly->param[j].sparse) { f->rj = j; *crows = &f->rows; }   /* rows, scattered after */
        else dw[j] = f->tmp[j] ? f->tmp[j] : f->dst[j];
    }
    return PS_OK;
}

/* Rows r of a (numel) parameter as a dense gradient into dst (device). */
static ps_status scatter_rows(stage *st, const ps_rows *r, int64_t numel, float *dst, ps_err *err) {
    float *h = calloc((size_t)(numel ? numel : 1), sizeof *h);
    if (!h) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory scattering gradient rows");
    for (int64_t i = 0; i < r->nrows; i++)
        for (int64_t c = 0; c < r->width; c++) h[r->rows[i] * r->width + c] += r->grad[i * r->width + c];
    ps_status rc = st->be->ops->copy_to_device(st->be->impl, dst, h, (size_t)numel * sizeof *h, err);
    free(h);
    return rc;
}

ps_status ps_exec_dw_end(stage *st, int l, ps_dw_sites *f, ps_status rc, ps_err *err) {
    const ps_layer *ly = &st->layers[l];
    if (rc == PS_OK && f->rj >= 0) {
        int j = f->rj;
        rc = scatter_rows(st, &f->rows, ly->param[j].numel, f->tmp[j] ? f->tmp[j] : f->dst[j], err);
    }
    for (int j = 0; j < PS_LAYER_MAX_PARAMS; j++) {
        if (!f->tmp[j]) continue;
        if (rc == PS_OK) rc = st->be->ops->add(st->be->impl, ly->param[j].numel, f->dst[j], f->tmp[j], err);
        ps_backend_release(st->be, f->tmp[j]);
        f->tmp[j] = NULL;
    }
    ps_rows_clear(&f->rows);
    return rc;
}

static ps_status node_backward(stage *st, tape_stage *ts, const stage_plan *p, const unsigned char *rg, vgrads *vg,
                               int l, int n, int s, pending *pd, ps_err *err) {
    ps_layer *ly = &st->layers[l];
    const node_plan *np = &p->node[l];
    int ov = l + 1;
    float *dy = vg->g[ov];
    int dy_owned = vg->owned[ov];
    vg->g[ov] = NULL;
    vg->owned[ov] = 0;
    PS_ASSERT(dy && "every value of a stage reaches its output");
    ps_status rc = PS_OK;
    int wanted[PS_NODE_MAX_INPUTS] = {0}, nwanted = 0;
    for (int i = 0; i < ly->nin; i++) nwanted += wanted[i] = rg[IV(st, l, i)];
    if ((ly->flags & (PS_KIND_VIEW | PS_KIND_GRAD_PASS)) && !ly->nparams) {
        /* d input_i = d output: a copy for all but the last taker */
        int left = nwanted;
        for (int i = 0; i < ly->nin && rc == PS_OK; i++) {
            if (!wanted[i]) continue;
            int last = --left == 0;
            if (last) {
                rc = deliver_input(st, p, vg, l, i, dy, dy_owned, n, err);
                dy_owned = 0;
                dy = NULL;
            } else {
                int64_t count = ps_layer_in_count(ly, i, n);
                float *c = ps_backend_alloc_floats(st->be, count);
                rc = c ? copy_floats(st, c, dy, count, err) : ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
                if (rc == PS_OK) rc = deliver_input(st, p, vg, l, i, c, 1, n, err);
                else ps_backend_release(st->be, c);
            }
        }
        if (dy_owned) ps_backend_release(st->be, dy);
        return rc;
    }
    float *dxs[PS_NODE_MAX_INPUTS] = {0};
    int dx_is_dy = 0;
    for (int i = 0; i < ly->nin && rc == PS_OK; i++) {
        if (!wanted[i]) continue;
        int v = IV(st, l, i);
        if (i == 0 && (ly->flags & PS_KIND_INPLACE) && dy_owned && !np->reorder[0] && !vg->g[v] &&
            ps_layer_in_count(ly, 0, n) == ps_layer_out_count(ly, n)) {
            int again = 0;
            for (int j = 1; j < ly->nin; j++) again |= IV(st, l, j) == v;
            if (!again) { dxs[0] = dy; dx_is_dy = 1; continue; }
        }
        if (!(dxs[i] = ps_backend_alloc_floats(st->be, ps_layer_in_count(ly, i, n))))
            rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
    }
    if (rc == PS_OK) {
        float *w[PS_LAYER_MAX_PARAMS] = {0}, *bw[PS_LAYER_MAX_BUFFERS] = {0};
        const int64_t *ib[PS_LAYER_MAX_BUFFERS] = {0};
        layer_params(st, ts, l, w, bw, ib);
        const void *xs[PS_NODE_MAX_INPUTS];
        for (int i = 0; i < ly->nin; i++) xs[i] = ts->buf[np->in_buf[i]];
        ps_layer_call c = {.ly = ly, .be = st->be, .n = n, .xs = xs, .x = xs[0], .y = ts->buf[np->out_buf], .w = w,
                           .buf = bw, .ibuf = ib, .saved = &ts->saved[l], .train = 1, .dy = dy, .dxs = dxs,
                           .dx = dxs[0]};
        if (pd->parts && ly->nparams) {   /* input gradients at once, parameter gradients part by part */
            rc = ps_exec_group_node_backward(st, &c, l, s, pd->parts, err);
        } else {
            ps_dw_sites f;
            rc = ps_exec_dw_begin(st, l, pd->dense[s], pd->rows, c.dw, &c.rows, &f, err);
            if (rc == PS_OK) rc = ps_exec_dw_end(st, l, &f, ly->kind->backward(&c, err), err);
        }
    }
    for (int i = 0; i < ly->nin; i++) {   /* deliver_input takes each dx over, even when it fails */
        if (!dxs[i]) continue;
        if (rc == PS_OK) {
            rc = deliver_input(st, p, vg, l, i, dxs[i], 1, n, err);
            if (i == 0 && dx_is_dy) dy_owned = 0;
        } else if (!(i == 0 && dx_is_dy)) {
            ps_backend_release(st->be, dxs[i]);
        }
    }
    if (dy_owned) ps_backend_release(st->be, dy);
    return rc;
}

/* Backward of stage s: *carry is d loss / d stage output on entry (owned
 * or not) and d loss / d stage input on exit (NULL when not wanted). */
static ps_status stage_backward(ps_model *m, ps_tape *t, int s, void **carry, int *carry_owned, int want_dx,
                                pending *pd, ps_err *err) {
    stage *st = &m->stages[s];
    tape_stage *ts = &t->st[s];
    const stage_plan *p = &st->plan[1];
    const unsigned char *rg = st->rg[want_dx ? 1 : 0];
    int nv = st->nlayers + 1;
    vgrads vg = {calloc((size_t)nv, sizeof(float *)), calloc((size_t)nv, 1)};
    ps_status rc = PS_OK;
    if (!vg.g || !vg.owned) rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    if (rc == PS_OK) {
        vg.g[st->out_val] = *carry;
        vg.owned[st->out_val] = (unsigned char)*carry_owned;
        *carry = NULL;
        *carry_owned = 0;
    }
    for (int k = st->nlayers - 1; k >= 0 && rc == PS_OK; k--) {
        int l = st->order[k];
        if (!rg[l + 1]) {   /* no parameters here or upstream, and no input gradient wanted */
            if (vg.owned[l + 1]) ps_backend_release(st->be, vg.g[l + 1]);
            vg.g[l + 1] = NULL;
            vg.owned[l + 1] = 0;
            continue;
        }
        nprof_t t0 = nprof_begin(st);
        rc = node_backward(st, ts, p, rg, &vg, l, t->n, s, pd, err);
        nprof_end(st, l, 1, t0);
    }
    if (rc == PS_OK && want_dx) {
        *carry = vg.g[0];
        *carry_owned = vg.owned[0];
        vg.g[0] = NULL;
    }
    for (int v = 0; vg.g && vg.owned && v < nv; v++)
        if (vg.owned[v]) ps_backend_release(st->be, vg.g[v]);
    free(vg.g);
    free(vg.owned);
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

/* The backward pass of t's stages from grad_out (host) into p, and d loss /
 * d input into grad_in (host) when not NULL. */
static ps_status backward_pass(ps_model *m, ps_tape *t, const float *grad_out, float *grad_in, pending *p,
                               ps_err *err) {
    stage *s0 = &m->stages[t->first];
    int n = t->n;
    ps_status rc = PS_OK;
    void *carry = NULL;
    int carry_owned = 0;
    stage *carry_stage = NULL;

    for (int s = t->last; s >= t->first && rc == PS_OK; s--) {
        stage *st = &m->stages[s];
        const ps_layer *ll = ps_stage_out_layer(st);
        size_t ob = act_bytes(&ll->outs, ll->out_dtype, n);
        if (s == t->last && st->host_memory) {   /* read in place: never written (copy on write) */
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
        if (rc == PS_OK) rc = stage_backward(m, t, s, &carry, &carry_owned, s > t->first || grad_in, p, err);
    }
    if (rc == PS_OK && grad_in) {
        ps_shape tmp;
        rc = s0->be->ops->copy_to_host(s0->be->impl, grad_in, carry,
                                       act_bytes(ps_stage_in_shape(s0, &tmp), PS_DTYPE_F32, n), err);
    }
    if (carry_owned && carry) ps_backend_release(carry_stage->be, carry);
    return rc;
}

/* p's dense blocks for t's stages (what a backward writes its parameter
 * gradients into), fresh where acc has none yet. */
static ps_status pending_alloc(ps_model *m, const ps_tape *t, const ps_grads *acc, pending *p, ps_err *err) {
    p->rows = calloc((size_t)m->nparams + 1, sizeof *p->rows);
    if (!p->rows) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    for (int s = t->first; s <= t->last; s++) {
        stage *st = &m->stages[s];
        if (!st->ngrads) continue;
        p->fresh[s] = acc->dense[s] == NULL;
        p->dense[s] = ps_backend_alloc_floats(st->be, st->ngrads);
        if (!p->dense[s]) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
    }
    return PS_OK;
}

ps_status ps_exec_backward(ps_model *m, const wset *ws, ps_tape *t, const float *grad_out, float *grad_in,
                           ps_grads *acc, ps_err *err) {
    if (!t || t->m != m || !acc || acc->m != m)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "tape or gradients of another model");
    tape_weights(t, ws);   /* the weights now, not the forward's (model.h) */
    if (!t->train) return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "an eval forward keeps no tape");
    stage *s0 = &m->stages[t->first];
    if (grad_in && s0->info.in_dtype != PS_DTYPE_F32)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stage '%s' takes %s input: it has no input gradient",
                          s0->def->name, ps_dtype_name(s0->info.in_dtype));
    acc->sq_valid = 0;   /* its cached norm (grads.c) */
    nprof_t t0 = nprof_begin(s0);
    pending p = {0};
    ps_status rc = pending_alloc(m, t, acc, &p, err);
    if (rc == PS_OK) rc = backward_pass(m, t, grad_out, grad_in, &p, err);
    if (rc == PS_OK) rc = commit(m, acc, &p, t->first, t->last, err);
    if (rc == PS_OK) rc = ps_grads_record(m, acc, t, err);   /* BatchNorm's batch statistics, for the step */
    pending_free(m, &p);
    nprof_end(s0, s0->nlayers, 1, t0);
    return rc;
}

/* ------------------------------------------------------ combined backward */

ps_status ps_exec_backward_group(ps_model *m, const wset *ws, int k, ps_tape *const *tapes,
                                 const float *const *grad_out, float *const *grad_in, ps_grads *const *accs,
                                 ps_err *err) {
    for (int i = 0; i < k; i++) {
        if (!tapes[i] || tapes[i]->m != m || !accs[i] || accs[i]->m != m)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "tape or gradients of another model");
        for (int j = 0; j < i; j++)
            if (accs[j] == accs[i]) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "two parts share gradients");
    }
    ps_tape *big = NULL;
    ps_status rc = ps_exec_tape_concat(m, tapes, k, &big, err);   /* same run, training, per-sample: checked */
    if (rc != PS_OK) return rc;
    tape_weights(big, ws);
    stage *s0 = &m->stages[big->first], *sl = &m->stages[big->last];
    ps_shape tmp;
    int64_t in_per = ps_shape_numel(ps_stage_in_shape(s0, &tmp)), out_per = ps_shape_numel(&ps_stage_out_layer(sl)->outs);
    int want_in = 0;
    for (int i = 0; i < k; i++) want_in |= grad_in[i] != NULL;
    if (want_in && s0->info.in_dtype != PS_DTYPE_F32) {
        ps_tape_free(big);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "stage '%s' takes %s input: it has no input gradient",
                          s0->def->name, ps_dtype_name(s0->info.in_dtype));
    }
    int *off = calloc((size_t)k, sizeof *off), *cnt = calloc((size_t)k, sizeof *cnt);
    float **dense = calloc((size_t)k * PS_MODEL_MAX_STAGES, sizeof *dense);
    ps_rows **rows = calloc((size_t)k, sizeof *rows);
    float *gout = malloc((size_t)(big->n * out_per) * sizeof(float) + 1);
    float *gin = want_in ? malloc((size_t)(big->n * in_per) * sizeof(float) + 1) : NULL;
    pending p = {0};
    ps_bwd_parts parts = {k, off, cnt, dense, rows};
    p.parts = &parts;
    if (!off || !cnt || !dense || !rows || !gout || (want_in && !gin))
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory combining %d backwards", k);
    for (int i = 0, o = 0; i < k && rc == PS_OK; o += tapes[i++]->n) {   /* each part: d output, its gradients */
        off[i] = o;
        cnt[i] = tapes[i]->n;
        memcpy(gout + (size_t)o * (size_t)out_per, grad_out[i], (size_t)(cnt[i] * out_per) * sizeof(float));
        if (!(rows[i] = calloc((size_t)m->nparams + 1, sizeof *rows[i])))
            rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        for (int s = big->first; s <= big->last && rc == PS_OK; s++) {
            stage *st = &m->stages[s];
            if (st->ngrads && !(dense[i * PS_MODEL_MAX_STAGES + s] = ps_backend_alloc_floats(st->be, st->ngrads)))
                rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for gradients");
        }
    }
    if (rc == PS_OK) rc = backward_pass(m, big, gout, gin, &p, err);
    for (int i = 0; i < k && rc == PS_OK; i++) {   /* each part's input gradient and its own parameter gradients */
        if (grad_in[i]) memcpy(grad_in[i], gin + (size_t)off[i] * (size_t)in_per, (size_t)(cnt[i] * in_per) * sizeof(float));
        pending pi = {0};
        for (int s = big->first; s <= big->last; s++) {
            pi.dense[s] = dense[i * PS_MODEL_MAX_STAGES + s];
            pi.fresh[s] = accs[i]->dense[s] == NULL;
        }
        pi.rows = rows[i];
        accs[i]->sq_valid = 0;
        rc = commit(m, accs[i], &pi, big->first, big->last, err);
        for (int s = big->first; s <= big->last; s++) dense[i * PS_MODEL_MAX_STAGES + s] = pi.dense[s];   /* not taken */
        if (rc == PS_OK) rc = ps_grads_record(m, accs[i], tapes[i], err);
    }
    for (int i = 0; dense && rows && i < k; i++) {
        pending pi = {0};
        for (int s = 0; s < m->nstages; s++) pi.dense[s] = dense[i * PS_MODEL_MAX_STAGES + s];
        pi.rows = rows[i];
        pending_free(m, &pi);
    }
    pending_free(m, &p);
    free(off);
    free(cnt);
    free(dense);
    free(rows);
    free(gout);
    free(gin);
    ps_tape_free(big);
    return rc;
}
