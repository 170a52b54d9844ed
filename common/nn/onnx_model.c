/* onnx_model.c - an ONNX file as psd's model definition and initial weights
 * (see onnx_model.h): glue between the ONNX reader, the importer, the model
 * file parser and the built model. */
#include "onnx_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx.h"

ps_model_def *ps_onnx_import_def(const ps_onnx_import *im, const char *label, ps_err *err) {
    size_t len;
    const char *text = ps_onnx_import_yaml(im, &len);
    char where[1024];
    snprintf(where, sizeof where, "%s (imported)", label);
    return ps_model_def_parse(text, len, where, err);
}

/* Map, parse and import path; the caller frees all three. */
static ps_onnx_import *import_file(const char *path, ps_onnx_file **f, ps_onnx_model **m, ps_err *err) {
    *m = NULL;
    if (!(*f = ps_onnx_map_file(path, err))) return NULL;
    if (!(*m = ps_onnx_parse((*f)->data, (*f)->len, path, err))) return NULL;
    return ps_onnx_import_model(*m, path, NULL, err);
}

ps_model_def *ps_onnx_load_def(const char *path, ps_err *err) {
    ps_onnx_file *f = NULL;
    ps_onnx_model *m = NULL;
    ps_onnx_import *im = import_file(path, &f, &m, err);
    ps_model_def *d = im ? ps_onnx_import_def(im, path, err) : NULL;
    ps_onnx_import_free(im);
    ps_onnx_free(m);
    ps_onnx_unmap(f);
    return d;
}

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
    ps_onnx_import *im = import_file(path, &f, &om, err);
    ps_status rc = im ? ps_onnx_import_weights(m, im, path, err) : (err ? err->code : PS_ERR_INVALID_ARGUMENT);
    ps_onnx_import_free(im);
    ps_onnx_free(om);
    ps_onnx_unmap(f);
    return rc;
}
