/* isa_check.c - one probe training step per stage and the backends'
 * fallback reports (see isa_check.h). */
#include "isa_check.h"

#include <stdlib.h>
#include <string.h>

#include "tensor.h"

static int64_t per_sample(int ndim, const int64_t *dims) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= dims[i];
    return n;
}

/* Forward (training, with a tape), backward and an optimizer step of stage
 * s alone on batch synthetic samples: pixels in [0, 1) for float inputs;
 * for int64 ones ids 1, 0, 1, 0, ... along each sample (not all one id: a
 * key padding mask, Eq of a pad id, would mask every key of a sample, which
 * psd refuses), and where the model refuses those (a one-row embedding, a
 * pad id of 1 with a causal mask) id 0 throughout, a row every embedding
 * has (a mixed float32 input of ids and features, whose id slots refuse
 * the pixels, likewise). The input gradient is computed for every stage but the first, as a
 * whole-model backward does. */
static ps_status probe_stage(ps_model *m, int s, int batch, ps_err *err) {
    const ps_stage_info *si = ps_model_stage(m, s);
    int64_t in = batch * per_sample(si->in_ndim, si->in_dims);
    int64_t out = batch * per_sample(si->out_ndim, si->out_dims);
    void *x = calloc((size_t)in, ps_dtype_size(si->in_dtype));
    float *y = malloc((size_t)out * sizeof *y), *g = malloc((size_t)out * sizeof *g);
    float *gin = s > 0 && si->in_dtype == PS_DTYPE_F32 ? malloc((size_t)in * sizeof *gin) : NULL;
    ps_grads *acc = ps_grads_create(m, err);
    ps_status st = PS_OK;
    if (!x || !y || !g || (s > 0 && si->in_dtype == PS_DTYPE_F32 && !gin) || !acc)
        st = acc ? ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "isa check: out of memory")
                 : (err->code ? err->code : PS_ERR_INTERNAL);
    if (st == PS_OK) {
        if (si->in_dtype == PS_DTYPE_F32) {
            uint32_t r = 12345;
            for (int64_t i = 0; i < in; i++) {
                r = r * 1664525u + 1013904223u;
                ((float *)x)[i] = (float)(r >> 8) / 16777216.0f;
            }
        }
        for (int64_t i = 0; i < out; i++) g[i] = (i % 7 == 0 ? -1.0f : 0.1f) / batch;
        if (si->in_dtype == PS_DTYPE_I64)
            for (int64_t i = 0, per = in / batch; i < in; i++) ((int64_t *)x)[i] = (i % per) & 1 ? 0 : 1;
        ps_tape *t = NULL;
        st = ps_model_forward_range(m, s, s, x, batch, 1, NULL, 1, y, &t, NULL, err);
        if (st != PS_OK) {   /* the model refused ids 1, or a mixed float32 input's pixels as ids: all 0 */
            memset(x, 0, (size_t)in * ps_dtype_size(si->in_dtype));
            ps_err_clear(err);
            st = ps_model_forward_range(m, s, s, x, batch, 1, NULL, 1, y, &t, NULL, err);
        }
        if (st == PS_OK) st = ps_model_backward_acc(m, t, g, gin, acc, err);
        if (st == PS_OK) st = ps_model_step_grads(m, acc, NULL, err);
        ps_tape_free(t);
    }
    ps_grads_free(acc);
    free(x);
    free(y);
    free(g);
    free(gin);
    return st;
}

ps_status ps_isa_check(const ps_model_opts *opts, int batch, ps_isa_report *r, ps_err *err) {
    memset(r, 0, sizeof *r);
    r->isa = ps_backend_cpu_isa();
    ps_model_opts o = *opts;
    o.n_placement = 0;              /* every stage on the CPU backend */
    ps_model *m = ps_model_create(&o, err);
    if (!m) return err->code ? err->code : PS_ERR_INTERNAL;
    if (batch > ps_model_max_batch(m)) batch = ps_model_max_batch(m);
    ps_status st = PS_OK;
    for (int s = 0; s < ps_model_num_stages(m) && st == PS_OK; s++)
        if (!ps_model_stage(m, s)->params_only)  /* computed on the trainers, never here */
            st = probe_stage(m, s, batch, err);
    size_t len = 0;
    for (int s = 0; st == PS_OK && ps_model_stage_backend(m, s); s++) {
        r->nfallback += ps_backend_fallbacks(ps_model_stage_backend(m, s), r->fallbacks + len,
                                             sizeof r->fallbacks - len);
        len = strlen(r->fallbacks);
    }
    ps_model_free(m);
    return st;
}
