/* isa_check.c - one probe training step and the backends' fallback reports
 * (see isa_check.h). */
#include "isa_check.h"

#include <stdlib.h>
#include <string.h>

ps_status ps_isa_check(const ps_model_opts *opts, int batch, ps_isa_report *r, ps_err *err) {
    memset(r, 0, sizeof *r);
    r->isa = ps_backend_cpu_isa();
    ps_model_opts o = *opts;
    o.n_placement = 0;              /* every stage on the CPU backend */
    ps_model *m = ps_model_create(&o, err);
    if (!m) return err->code ? err->code : PS_ERR_INTERNAL;
    if (batch > ps_model_max_batch(m)) batch = ps_model_max_batch(m);
    int c, h, w, k = ps_model_output_size(m);
    ps_model_input_shape(m, &c, &h, &w);
    size_t in = (size_t)batch * c * h * w;
    float *x = malloc(in * sizeof *x), *out = malloc((size_t)batch * k * sizeof *out);
    float *g = calloc((size_t)batch * k, sizeof *g);
    ps_status st = PS_OK;
    if (!x || !out || !g) st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "isa check: out of memory");
    if (st == PS_OK) {
        /* Deterministic inputs in [0, 1) like pixels; every sample's loss
         * gradient on class i % k. */
        uint32_t s = 12345;
        for (size_t i = 0; i < in; i++) {
            s = s * 1664525u + 1013904223u;
            x[i] = (float)(s >> 8) / 16777216.0f;
        }
        for (int i = 0; i < batch; i++) g[(size_t)i * k + i % k] = -1.0f / batch;
        ps_tape *t = NULL;
        st = ps_model_forward(m, x, batch, 1, NULL, 1, out, &t, NULL, err);
        if (st == PS_OK) st = ps_model_backward(m, t, g, err);
        if (st == PS_OK) st = ps_model_step(m, t, NULL, err);
        ps_tape_free(t);
    }
    size_t len = 0;
    for (int s = 0; st == PS_OK && ps_model_stage_backend(m, s); s++) {
        r->nfallback += ps_backend_fallbacks(ps_model_stage_backend(m, s), r->fallbacks + len,
                                             sizeof r->fallbacks - len);
        len = strlen(r->fallbacks);
    }
    free(x);
    free(out);
    free(g);
    ps_model_free(m);
    return st;
}
