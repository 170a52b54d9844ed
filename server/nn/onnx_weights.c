/* onnx_weights.c - a built model's parameters and buffers from an ONNX
 * file's initializers (see onnx_weights.h); psd's side of model.onnx. */
#include "onnx_weights.h"

#include <stdlib.h>

#include "onnx_model.h"

ps_status ps_onnx_import_weights(ps_model *m, const ps_onnx_import *im, const char *label, ps_err *err) {
    ps_status rc = PS_OK;
    float *buf = NULL;
    int64_t cap = 0;
    for (int i = 0; i < ps_onnx_import_num_values(im) && rc == PS_OK; i++) {
        const char *name = ps_onnx_import_value_name(im, i);
        int64_t n = ps_onnx_import_value_numel(im, i);
        int p = ps_model_find_param(m, name), b = p < 0 ? ps_model_find_buffer(m, name) : -1;
        if (p < 0 && b < 0) continue;   /* a stage hosted elsewhere */
        if (n > cap) {
            float *nb = realloc(buf, (size_t)n * sizeof *nb);
            if (!nb) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory for '%s'", label, name); break; }
            buf = nb;
            cap = n;
        }
        if ((rc = ps_onnx_import_value(im, i, buf, err))) break;
        if (p >= 0) {
            const ps_param_info *pi = ps_model_param(m, p);
            int64_t first = pi->rows_total ? pi->row_offset * (pi->numel / pi->dims[0]) : 0;
            if (first + pi->numel > n) {
                rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' has %lld values, the model's parameter %lld",
                                label, name, (long long)n, (long long)pi->numel);
                break;
            }
            rc = ps_model_set_param(m, p, buf + first, err);
        } else {
            const ps_buffer_info *bi = ps_model_buffer(m, b);
            if (bi->dtype != PS_DTYPE_F32 || bi->numel != n) {
                rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: '%s' does not fit the model's buffer", label, name);
                break;
            }
            rc = ps_model_set_buffer(m, b, buf, err);
        }
    }
    free(buf);
    return rc;
}

ps_status ps_onnx_init_weights(ps_model *m, const char *path, ps_err *err) {
    ps_onnx_file *f = NULL;
    ps_onnx_model *om = NULL;
    ps_onnx_import *im = ps_onnx_import_file(path, &f, &om, err);
    ps_status rc = im ? ps_onnx_import_weights(m, im, path, err) : (err ? err->code : PS_ERR_INVALID_ARGUMENT);
    ps_onnx_import_free(im);
    ps_onnx_free(om);
    ps_onnx_unmap(f);
    return rc;
}
