/* model.c - a hosted model's weights (see model.h): the copies calls pin,
 * the compute calls' thread shares, what a model holds (parameters, buffers,
 * stages, versions), reading and writing weights, forward and backward
 * through the executor, and what checkpoints read and restore. Building it
 * is model_build.c, the optimizer step model_step.c, the executor exec.c,
 * accumulated gradients grads.c. */
#include "model_impl.h"
#include "clock.h"
#include "prof.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
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

/* CPU placement of one-thread calls. Two trainers' calls computing at
 * once on two cores, one thread each, are left to the kernel's scheduler,
 * which places a woken thread near its waker: the worker that sends a
 * reply wakes its trainer onto its own CPU, and two compute calls end up
 * queued on one CPU while the other idles until the load balancer moves
 * one (bench section 2b: psd's threads waited ~8 ms a batch for a CPU with
 * the CPUs busy 1.58 of 2). A call computing on one thread while others
 * compute therefore holds one of psd's CPUs (m->cpus_held) for its
 * compute, and its thread is bound to that CPU. The binding outlives the
 * call: the thread's next call takes the same CPU again when it is free,
 * with no system call and no migration (one syscall per call pair costs a
 * small model's calls more than it gives); only when another call holds
 * it does the thread move, to the free CPU it runs on or the first free
 * one. A backward asks first for the CPU its forward held (recorded in
 * the tape): the forward's activations are in that CPU's caches, and a
 * batch whose phases alternate CPUs computes up to ~40 % slower
 * (docs/performance.md, the small ResNet's session 7); PS_PIN_NEAR=0 in
 * the environment turns that preference off, for comparison. With no CPU
 * free, or before a call on several threads (whose
 * OpenMP team would inherit a one-CPU mask), the thread gets all of psd's
 * CPUs back. A call computes on its caller's thread, so what a thread is
 * bound to and holds is thread-local. */
static __thread int bound_slot = -1;   /* index into m->cpus this thread is bound to */
static __thread int held_slot = -1;    /* ... and holds for the call computing now */
static __thread ps_model *held_model;

/* Binds the calling thread to cpus[slot], or to all of them (slot < 0). */
static int bind_cpus(const ps_model *m, int slot) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < m->ncpus; i++)
        if (slot < 0 || i == slot) CPU_SET(m->cpus[i], &set);
    return sched_setaffinity(0, sizeof set, &set);
}

static void unbind_cpu(ps_model *m) {
    if (bind_cpus(m, -1) == 0) bound_slot = -1;
}

static void hold_cpu(ps_model *m, int one_thread, int pref) {
    if (!m->pin_calls || m->ncpus < 2 || held_slot >= 0) return;
    if (!one_thread) {
        if (bound_slot >= 0) unbind_cpu(m);
        return;
    }
    unsigned long long held = __atomic_load_n(&m->cpus_held, __ATOMIC_RELAXED);
    int here = -1, slot;
    for (;;) {
        slot = pref >= 0 && pref < m->ncpus && !(held >> pref & 1) ? pref
             : bound_slot >= 0 && bound_slot < m->ncpus && !(held >> bound_slot & 1) ? bound_slot : -1;
        if (slot < 0) {
            if (here < 0) here = sched_getcpu();
            for (int i = 0; i < m->ncpus; i++)
                if (!(held >> i & 1) && (slot < 0 || m->cpus[i] == here)) slot = i;
        }
        if (slot < 0) {   /* every CPU held: run where the scheduler puts us */
            if (bound_slot >= 0) unbind_cpu(m);
            return;
        }
        if (__atomic_compare_exchange_n(&m->cpus_held, &held, held | 1ULL << slot, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            break;
    }
    if (slot != bound_slot) {
        if (bind_cpus(m, slot) != 0) {
            __atomic_fetch_and(&m->cpus_held, ~(1ULL << slot), __ATOMIC_RELEASE);
            return;
        }
        bound_slot = slot;
    }
    held_slot = slot;
    held_model = m;
}

static void release_cpu(ps_model *m) {
    if (held_slot < 0 || held_model != m) return;
    __atomic_fetch_and(&m->cpus_held, ~(1ULL << held_slot), __ATOMIC_RELEASE);
    held_slot = -1;
    held_model = NULL;
}

void ps_model_cpus_init(ps_model *m, int pin) {
    cpu_set_t set;
    m->ncpus = 0;
    m->pin_calls = pin;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    for (int c = 0; c < CPU_SETSIZE && m->ncpus < 64; c++)
        if (CPU_ISSET(c, &set)) m->cpus[m->ncpus++] = c;
}

/* The CPU slot a backward of tape t asks for first: its forward's (-1: none). */
static int near_slot(const ps_model *m, const ps_tape *t) {
    static int off = -1;
    if (off < 0) { const char *e = getenv("PS_PIN_NEAR"); off = e && *e == '0'; }
    return off || !t || t->m != m ? -1 : t->cpu_slot1 - 1;
}

/* ps_model_call_begin, asking for CPU slot pref first (-1: none). */
static int call_begin(ps_model *m, int exclusive, int pref) {
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
    hold_cpu(m, !exclusive && nt == 1 && k > 1, pref);   /* an exclusive call: unbound, not held */
    return nt;
}

int ps_model_call_begin(ps_model *m, int exclusive) { return call_begin(m, exclusive, -1); }

void ps_model_call_end(ps_model *m) {
    release_cpu(m);
    __atomic_sub_fetch(&m->inflight, 1, __ATOMIC_RELAXED);
}

/* ---- Snapshot steps ----
 * The weights (parameters and float32 buffers of every stage) live in
 * copies, m->sets; sets[cur] is the current one, and each stage's w and
 * bufw point into it. A forward or backward pins the current copy (under
 * wmu, a counter) and computes with it, holding the weights lock shared.
 * An in-place step (snapshots off) takes the lock exclusively and writes
 * sets[0]. A snapshot step takes the lock shared too - only set_param and
 * the other administrative writers, which take it exclusively, exclude
 * it - picks a copy no call reads (allocating one, up to PS_WSETS; waiting
 * for one only when all are read), writes the next version into it in one
 * pass (the optimizer reads the current copy and writes the spare one;
 * parameters without a gradient are copied), and publishes it with the
 * new version under wmu: the running calls finish with the copy they
 * pinned, the next ones see the new version. Steps run one at a time
 * (step_mu); the optimizer state has one copy, which only steps touch.
 *
 * Row-sparse parameters (embedding tables, up to millions of rows updated
 * a few rows at a time) are not worth a copy per step: a stage holding
 * one is "in place" (stage.inplace) - it has a single copy, which every
 * set points to - and rows_lock guards it. A call whose stages include an
 * in-place one holds rows_lock shared from before it pins a copy until it
 * unpins it; a snapshot step writes the dense stages into its spare copy
 * first, then takes rows_lock exclusively, updates the in-place stages'
 * rows and publishes the copy and the version, and releases it. So a call
 * reading an in-place stage sees that stage at the version of the copy it
 * pinned, and calls on the other stages (the LM's decoder) never wait for
 * a step. A model without snapshots steps every stage in place under the
 * exclusive weights lock. */

/* 1 when a snapshot step writes one of stages first..last in place: the
 * call holds rows_lock shared around its pin (see above). */
static int reads_inplace(const ps_model *m, int first, int last) {
    for (int s = first; m->ninplace && s <= last; s++)
        if (m->stages[s].inplace) return 1;
    return 0;
}

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
int ps_model_num_aliases(const ps_model *m) { return m->nalias; }
const char *ps_model_alias(const ps_model *m, int i, int *owner) {
    if (i < 0 || i >= m->nalias) return NULL;
    if (owner) *owner = m->alias_owner[i];
    return m->alias_name[i];
}
const ps_param_info *ps_model_def_param(const ps_model *m, int i) {
    return (i >= 0 && i < m->ndef_params) ? &m->def_params[i] : NULL;
}

const char *ps_model_where(const ps_model *m, const char *name, char *buf, size_t cap) {
    const ps_node_def *best = NULL;   /* the longest node name that is the parameter's, or a prefix before a '.' */
    for (int i = 0; name && i < m->def->nnodes; i++) {
        const ps_node_def *nd = &m->def->nodes[i];
        const size_t k = strlen(nd->name);
        if (!strncmp(nd->name, name, k) && (name[k] == '.' || !name[k]) && (!best || k > strlen(best->name)))
            best = nd;
    }
    if (best)
        snprintf(buf, cap, "%s%s%s:%d: node '%s'", m->origin, m->origin[0] ? ": " : "", m->def->path, best->line,
                 best->name);
    else
        snprintf(buf, cap, "%s%s%s", m->origin, m->origin[0] ? ": " : "", m->def->path);
    return buf;
}

int ps_model_num_buffers(const ps_model *m) { return m->nbuffers; }
const char *ps_model_unset_constant(const ps_model *m) {
    for (int i = 0; i < m->nbuffers; i++)
        if (m->buffers[i].external) return m->buffers[i].name;
    return NULL;
}
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

/* Under the weights lock (either), ws pinned: bytes [off, off + bytes) of buffer i. */
static ps_status copy_buffer_out(ps_model *m, const wset *ws, int i, size_t off, size_t bytes, void *host_dst,
                                 ps_err *err) {
    stage *st = &m->stages[m->bloc[i].stage];
    char *src = (char *)buffer_mem(m, ws, i) + off;
    if (m->buffers[i].dtype == PS_DTYPE_I64) { memcpy(host_dst, src, bytes); return PS_OK; }
    return st->be->ops->copy_to_host(st->be->impl, host_dst, src, bytes, err);
}

ps_status ps_model_row_range(const char *name, int ndim, const int64_t *dims, int64_t numel, size_t esz, int64_t row0,
                           int64_t nrows, size_t *off, size_t *bytes, ps_err *err) {
    int64_t rows = ndim ? dims[0] : 1;
    if (row0 < 0 || nrows < 0 || row0 > rows || nrows > rows - row0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: rows [%lld, %lld) outside its %lld rows", name,
                          (long long)row0, (long long)(row0 + nrows), (long long)rows);
    size_t row_bytes = rows ? (size_t)(numel / rows) * esz : 0;
    *off = (size_t)row0 * row_bytes;
    *bytes = (size_t)nrows * row_bytes;
    return PS_OK;
}

ps_status ps_model_get_buffer(ps_model *m, int i, void *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nbuffers) return ps_err_set(err, PS_ERR_NOT_FOUND, "no buffer %d", i);
    return ps_model_get_buffer_rows(m, i, 0, m->buffers[i].ndim ? m->buffers[i].dims[0] : 1, host_dst, err);
}

ps_status ps_model_get_buffer_rows(ps_model *m, int i, int64_t row0, int64_t nrows, void *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nbuffers) return ps_err_set(err, PS_ERR_NOT_FOUND, "no buffer %d", i);
    const ps_buffer_info *bi = &m->buffers[i];
    size_t off, bytes;
    if (ps_model_row_range(bi->name, bi->ndim, bi->dims, bi->numel, ps_dtype_size(bi->dtype), row0, nrows, &off,
                           &bytes, err))
        return err->code;
    int rows = reads_inplace(m, m->bloc[i].stage, m->bloc[i].stage);
    pthread_rwlock_rdlock(&m->lock);
    if (rows) pthread_rwlock_rdlock(&m->rows_lock);
    wset *ws = pin(m, NULL);
    ps_status rc = copy_buffer_out(m, ws, i, off, bytes, host_dst, err);
    unpin(m, ws);
    if (rows) pthread_rwlock_unlock(&m->rows_lock);
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

int ps_model_device_memory(const ps_model *m, ps_device_memory *out, int max) {
    int n = 0;
    for (int s = 0; s < m->nstages; s++) {
        const stage *st = &m->stages[s];
        ps_backend_memory bm;
        ps_err err = {0};
        if (!st->be || !st->be->ops->memory_stats || st->be->ops->memory_stats(st->be->impl, &bm, &err) != PS_OK)
            continue;
        int i = 0;
        while (i < n && strcmp(out[i].device, st->device)) i++;
        if (i == n) {
            if (n == max) continue;
            memset(&out[n], 0, sizeof out[n]);
            snprintf(out[n].device, sizeof out[n].device, "%s", st->device);
            out[n].device_free = bm.device_free;
            out[n].device_total = bm.device_total;
            n++;
        }
        out[i].live += bm.used > bm.cached ? bm.used - bm.cached : 0;
        out[i].cached += bm.cached;
    }
    return n;
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
    return ps_model_get_param_rows(m, i, 0, m->params[i].ndim ? m->params[i].dims[0] : 1, host_dst, err);
}

ps_status ps_model_get_param_rows(ps_model *m, int i, int64_t row0, int64_t nrows, float *host_dst, ps_err *err) {
    if (i < 0 || i >= m->nparams) return ps_err_set(err, PS_ERR_NOT_FOUND, "no parameter %d", i);
    const ps_param_info *pi = &m->params[i];
    size_t off, bytes;
    if (ps_model_row_range(pi->name, pi->ndim, pi->dims, pi->numel, sizeof(float), row0, nrows, &off, &bytes, err))
        return err->code;
    stage *st = &m->stages[m->loc[i].stage];
    int rows = reads_inplace(m, m->loc[i].stage, m->loc[i].stage);
    pthread_rwlock_rdlock(&m->lock);
    if (rows) pthread_rwlock_rdlock(&m->rows_lock);
    wset *ws = pin(m, NULL);
    ps_status rc = st->be->ops->copy_to_host(st->be->impl, host_dst,
                                             ws->w[m->loc[i].stage] + m->loc[i].off + off / sizeof(float), bytes, err);
    unpin(m, ws);
    if (rows) pthread_rwlock_unlock(&m->rows_lock);
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

/* Nodes reading stage first's input check it (ids in range). */
static ps_status check_input(const ps_model *m, int first, const void *x, int n, ps_err *err) {
    const stage *s0 = &m->stages[first];
    ps_shape ins;
    ps_stage_in_shape(s0, &ins);
    for (int l = 0; l < s0->nlayers; l++) {
        const ps_layer *ly = &s0->layers[l];
        int reads = 0;
        for (int i = 0; i < ly->nin; i++) reads |= s0->in_val[s0->in_off[l] + i] == 0;
        if (reads && ly->kind->check_input && ly->kind->check_input(ly, x, n * ps_shape_numel(&ins), err) != PS_OK)
            return ps_err_prefix(err, "stage '%s'", s0->def->name);
    }
    return PS_OK;
}

/* A model call's ops on stages first..last run as one asynchronous run on
 * each backend that offers it (backend.h async_begin: a GPU's ops queue
 * without a wait apiece); run_end waits for them all - before the call's
 * locks are released and its buffers handed on - and turns a failure there
 * into the call's error when it had none (model_impl.h). */
void ps_model_run_begin(ps_model *m, int first, int last) {
    for (int s = first; s <= last; s++) {
        ps_backend *be = m->stages[s].be;
        if (be->ops->async_begin) be->ops->async_begin(be->impl);
    }
}

ps_status ps_model_run_end(ps_model *m, int first, int last, ps_status rc, ps_err *err) {
    for (int s = first; s <= last; s++) {
        ps_backend *be = m->stages[s].be;
        if (!be->ops->async_end) continue;
        ps_err e = {0};
        if (be->ops->async_end(be->impl, &e) != PS_OK && rc == PS_OK) {
            *err = e;
            rc = e.code;
        }
    }
    return rc;
}

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
    if ((rc = check_input(m, first, x, n, err)) != PS_OK) return rc;
    size_t in_sample = (size_t)ps_shape_numel(&ins) * ps_dtype_size(s0->info.in_dtype);
    int64_t out_sample = ps_shape_numel(&ps_stage_out_layer(sl)->outs);
    ps_rng rng;
    ps_rng_seed(&rng, dropout_seed);
    /* One shared acquisition for the whole call: one weights version, even
     * for an eval forward run in slices (bounded memory). */
    int rows = reads_inplace(m, first, last);
    ps_model_call_begin(m, 0);
    ps_prof_rdlock(&m->lock, PS_PHASE_LOCK);
    if (rows) ps_prof_rdlock(&m->rows_lock, PS_PHASE_LOCK);
    int64_t t0 = ps_prof_begin();
    wset *ws = pin(m, version_used);
    int slice = train || m->eval_whole ? n : EVAL_SLICE;
    ps_model_run_begin(m, first, last);
    for (int o = 0; o < n && rc == PS_OK; o += slice) {
        int k = n - o < slice ? n - o : slice;
        rc = ps_exec_forward(m, ws, first, last, (const char *)x + (size_t)o * in_sample, k, train,
                             train && tape_out, dropout_masks, &rng, out ? out + (size_t)o * out_sample : NULL,
                             tape_out, err);
    }
    rc = ps_model_run_end(m, first, last, rc, err);
    unpin(m, ws);
    ps_prof_end(PS_PHASE_COMPUTE, t0);
    if (rows) pthread_rwlock_unlock(&m->rows_lock);
    pthread_rwlock_unlock(&m->lock);
    if (rc == PS_OK && tape_out && *tape_out) (*tape_out)->cpu_slot1 = held_slot + 1;
    ps_model_call_end(m);
    return rc;
}

int ps_model_can_group(const ps_model *m, int first, int last) {
    return ps_exec_check_run(m, first, last, &(ps_err){0}) == PS_OK && ps_exec_group_ok(m, first, last);
}

ps_status ps_model_forward_group(ps_model *m, int first, int last, int k, const void *const *x, const int *n,
                                 const uint64_t *seeds, float *const *out, ps_tape **tapes, uint64_t *version_used,
                                 ps_err *err) {
    for (int i = 0; i < k; i++) tapes[i] = NULL;
    ps_status rc = ps_exec_check_run(m, first, last, err);
    if (rc != PS_OK) return rc;
    if (!ps_exec_group_ok(m, first, last))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "stages %s..%s have a node that is not per-sample "
                          "(BatchNorm, ...): their forwards are not combined", m->stages[first].def->name,
                          m->stages[last].def->name);
    int total = 0;
    for (int i = 0; i < k; i++) {
        if (n[i] < 1 || n[i] > m->def->max_batch)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "batch size %d is outside 1..%d", n[i], m->def->max_batch);
        if (total > (1 << 24)) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "too many samples to combine");
        total += n[i];
        if ((rc = check_input(m, first, x[i], n[i], err)) != PS_OK) return rc;
    }
    const stage *s0 = &m->stages[first];
    ps_shape ins;
    size_t in_sample = (size_t)ps_shape_numel(ps_stage_in_shape(s0, &ins)) * ps_dtype_size(s0->info.in_dtype);
    int nd = ps_exec_group_ndropout(m, first, last);
    char *xs = malloc(in_sample * (size_t)total + 1);
    float **masks = calloc((size_t)nd + 1, sizeof *masks);
    ps_tape *big = NULL;
    if (!xs || !masks) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory combining %d forwards", k);
        goto out;
    }
    for (int d = 0; d < nd; d++)
        if (!(masks[d] = malloc((size_t)ps_exec_group_mask_len(m, first, last, d, total) * sizeof(float) + 1))) {
            rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for dropout masks");
            goto out;
        }
    for (int i = 0, o = 0; i < k; o += n[i++]) {   /* each part: its input, its own masks */
        memcpy(xs + (size_t)o * in_sample, x[i], (size_t)n[i] * in_sample);
        ps_exec_group_masks(m, first, last, seeds[i], o, n[i], total, masks);
    }
    ps_rng unused;
    ps_rng_seed(&unused, 0);
    int rows = reads_inplace(m, first, last);
    ps_model_call_begin(m, 0);
    ps_prof_rdlock(&m->lock, PS_PHASE_LOCK);
    if (rows) ps_prof_rdlock(&m->rows_lock, PS_PHASE_LOCK);
    int64_t t0 = ps_prof_begin();
    wset *ws = pin(m, version_used);
    ps_model_run_begin(m, first, last);
    rc = ps_exec_forward(m, ws, first, last, xs, total, 1, 1, (const float *const *)masks, &unused, NULL, &big, err);
    rc = ps_model_run_end(m, first, last, rc, err);
    unpin(m, ws);
    ps_prof_end(PS_PHASE_COMPUTE, t0);
    if (rows) pthread_rwlock_unlock(&m->rows_lock);
    pthread_rwlock_unlock(&m->lock);
    ps_model_call_end(m);
    for (int i = 0, o = 0; i < k && rc == PS_OK; o += n[i++]) {   /* each part's own tape */
        rc = ps_exec_tape_slice(m, big, o, n[i], &tapes[i], err);
        if (rc == PS_OK && out && out[i]) rc = ps_tape_get_output(m, tapes[i], out[i], err);
    }
    if (rc != PS_OK)
        for (int i = 0; i < k; i++) {
            ps_tape_free(tapes[i]);
            tapes[i] = NULL;
        }
out:
    ps_tape_free(big);
    for (int d = 0; masks && d < nd; d++) free(masks[d]);
    free(masks);
    free(xs);
    return rc;
}

ps_status ps_model_backward_acc(ps_model *m, ps_tape *t, const float *grad_out, float *grad_in, ps_grads *acc,
                                ps_err *err) {
    int rows = t && t->m == m && reads_inplace(m, t->first, t->last);
    call_begin(m, 0, near_slot(m, t));
    ps_prof_rdlock(&m->lock, PS_PHASE_LOCK);
    if (rows) ps_prof_rdlock(&m->rows_lock, PS_PHASE_LOCK);
    int64_t t0 = ps_prof_begin();
    wset *ws = pin(m, NULL);
    const int ok = t && t->m == m;   /* ps_exec_backward refuses another model's tape */
    if (ok) ps_model_run_begin(m, t->first, t->last);
    ps_status rc = ps_exec_backward(m, ws, t, grad_out, grad_in, acc, err);
    if (ok) rc = ps_model_run_end(m, t->first, t->last, rc, err);
    unpin(m, ws);
    ps_prof_end(PS_PHASE_COMPUTE, t0);
    if (rows) pthread_rwlock_unlock(&m->rows_lock);
    pthread_rwlock_unlock(&m->lock);
    ps_model_call_end(m);
    return rc;
}

ps_status ps_model_backward_group(ps_model *m, int k, ps_tape *const *tapes, const float *const *grad_out,
                                  float *const *grad_in, ps_grads *const *accs, ps_err *err) {
    if (k < 1) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "no backward to combine");
    /* like ps_model_backward_acc: an in-place (row-sparse) stage is read
     * under rows_lock; every tape of a group covers the same stages, and
     * ps_exec_backward_group refuses one that does not */
    int rows = 0;
    for (int i = 0; i < k; i++)
        if (tapes[i] && tapes[i]->m == m && reads_inplace(m, tapes[i]->first, tapes[i]->last)) rows = 1;
    ps_model_call_begin(m, 0);
    ps_prof_rdlock(&m->lock, PS_PHASE_LOCK);
    if (rows) ps_prof_rdlock(&m->rows_lock, PS_PHASE_LOCK);
    int64_t t0 = ps_prof_begin();
    wset *ws = pin(m, NULL);
    const int ok = tapes[0] && tapes[0]->m == m;
    if (ok) ps_model_run_begin(m, tapes[0]->first, tapes[0]->last);
    ps_status rc = ps_exec_backward_group(m, ws, k, tapes, grad_out, grad_in, accs, err);
    if (ok) rc = ps_model_run_end(m, tapes[0]->first, tapes[0]->last, rc, err);
    unpin(m, ws);
    ps_prof_end(PS_PHASE_COMPUTE, t0);
    if (rows) pthread_rwlock_unlock(&m->rows_lock);
    pthread_rwlock_unlock(&m->lock);
    ps_model_call_end(m);
    return rc;
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
    for (int i = 0; bufs && i < m->nbuffers && rc == PS_OK; i++)
        rc = copy_buffer_out(m, ws, i, 0, (size_t)m->buffers[i].numel * ps_dtype_size(m->buffers[i].dtype), bufs[i],
                             err);
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
