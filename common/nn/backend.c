/* backend.c - the one place that knows which backends exist.
 *
 * ps_backend_create() looks a name up in a const table of op tables, runs
 * the backend's init and wraps the result in a ps_backend the caller frees
 * with ps_backend_free(). Adding a backend = one line in kBackends plus its
 * backend_<name>.c exporting a ps_backend_ops. The CUDA backend is the one
 * optional entry: PS_HAVE_CUDA (set by the Makefile when nvcc is present)
 * registers it; this file is the only place that looks at that flag.
 */
#include "backend.h"
#include "backend_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ps_backend_ops *const kBackends[] = {
    &ps_backend_ref_ops,
    &ps_backend_dnnl_ops,
#ifdef PS_HAVE_CUDA
    &ps_backend_cuda_ops,
#endif
};
#define PS_NBACKENDS (sizeof kBackends / sizeof kBackends[0])

/* The names of kBackends, in the same order (tests/test_nn_layers checks). */
static const char *const kBackendNames[] = { "ref", "dnnl",
#ifdef PS_HAVE_CUDA
    "cuda",
#endif
    NULL };

void ps_backend_build_info(char *buf, size_t size) {
#ifdef PS_HAVE_CUDA
    char info[160];
    ps_backend_cuda_build_info(info, sizeof info);
    snprintf(buf, size, "CUDA: %s", info);
#else
    snprintf(buf, size, "CUDA: not built");
#endif
}

const char *const *ps_backend_names(void) {
    return kBackendNames;
}

static const char *cpu_names[PS_NBACKENDS + 1];
static pthread_once_t cpu_names_once = PTHREAD_ONCE_INIT;

static void cpu_names_fill(void) {
    size_t n = 0;
    for (size_t i = 0; i < PS_NBACKENDS; i++)
        if (!kBackends[i]->device_kind) cpu_names[n++] = kBackends[i]->name;
}

const char *const *ps_backend_cpu_names(void) {
    pthread_once(&cpu_names_once, cpu_names_fill);
    return cpu_names;
}

ps_backend *ps_backend_create(const char *name, int device, int nthreads, ps_err *err) {
    const ps_backend_ops *ops = NULL;
    for (size_t i = 0; i < PS_NBACKENDS; i++) {
        if (name && strcmp(name, kBackends[i]->name) == 0) {
            ops = kBackends[i];
            break;
        }
    }
    if (!ops && name && !strcmp(name, "cuda")) {
        ps_err_set(err, PS_ERR_UNAVAILABLE, "this binary was built without CUDA support "
                   "(nvcc was not found at build time; see docs/gpu.md)");
        return NULL;
    }
    if (!ops) {
        char known[128] = "";
        size_t len = 0;
        for (size_t i = 0; i < PS_NBACKENDS && len < sizeof known; i++)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s",
                                    i ? ", " : "", kBackends[i]->name);
        ps_err_set(err, PS_ERR_NOT_FOUND, "unknown backend '%s' (known: %s)",
                   name ? name : "(null)", known);
        return NULL;
    }
    ps_backend *b = calloc(1, sizeof *b);
    if (!b) {
        ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "backend '%s': out of memory", name);
        return NULL;
    }
    if (ops->init(&b->impl, device, nthreads, err) != PS_OK) {
        ps_err_prefix(err, "backend '%s'", name);
        free(b);
        return NULL;
    }
    b->ops = ops;
    b->device = device;
    if (ops->device_kind)
        snprintf(b->label, sizeof b->label, "%s/%s:%d", ops->name, ops->device_kind, device);
    else
        snprintf(b->label, sizeof b->label, "%s/cpu", ops->name);
    return b;
}

void ps_backend_free(ps_backend *b) {
    if (!b) return;
    b->ops->destroy(b->impl);
    free(b);
}

float *ps_backend_alloc_floats(ps_backend *b, int64_t count) {
    if (count < 0) return NULL;
    return b->ops->alloc(b->impl, (size_t)count * sizeof(float));
}

void ps_backend_release(ps_backend *b, void *p) {
    if (p) b->ops->free(b->impl, p);
}

ps_adam_scalars ps_adam_scalars_of(const ps_adam_desc *d) {
    const double st = (double)d->step;
    const double bc1 = 1.0 - pow(d->beta1, st), bc2 = 1.0 - pow(d->beta2, st);
    ps_adam_scalars s;
    s.one_minus_beta1 = (float)(1.0 - d->beta1);
    s.one_minus_beta2 = (float)(1.0 - d->beta2);
    s.beta1 = (float)d->beta1;
    s.beta2 = (float)d->beta2;
    s.eps = (float)d->eps;
    s.weight_decay = (float)d->weight_decay;
    s.step_size = (float)(d->lr / bc1);
    s.bc2_sqrt = (float)sqrt(bc2);
    s.step_size_sp = (float)(d->lr * sqrt(bc2) / bc1);
    return s;
}

void ps_backend_trim(void) { ps_backend_dnnl_trim(); }

const char *ps_backend_cpu_isa(void) {
    return ps_backend_dnnl_isa();
}

int ps_backend_fallbacks(const ps_backend *b, char *buf, size_t size) {
    if (buf && size) buf[0] = 0;
    if (!b || b->ops != &ps_backend_dnnl_ops) return 0;
    return ps_backend_dnnl_fallbacks(b->impl, buf, size);
}
