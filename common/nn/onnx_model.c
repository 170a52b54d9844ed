/* onnx_model.c - an ONNX file as a model definition (see onnx_model.h): glue
 * between the ONNX reader, the importer and the model file parser. The
 * initial weights from its initializers are onnx_weights.c (psd's side). */
#include "onnx_model.h"

#include <stdio.h>
#include <string.h>

#include "onnx.h"

ps_model_def *ps_onnx_import_def(const ps_onnx_import *im, const char *label, ps_err *err) {
    size_t len;
    const char *text = ps_onnx_import_yaml(im, &len);
    char where[1024];
    snprintf(where, sizeof where, "%s (imported)", label);
    return ps_model_def_parse(text, len, where, err);
}

ps_onnx_import *ps_onnx_import_file(const char *path, ps_onnx_file **f, ps_onnx_model **m, ps_err *err) {
    *m = NULL;
    if (!(*f = ps_onnx_map_file(path, err))) return NULL;
    if (!(*m = ps_onnx_parse((*f)->data, (*f)->len, path, err))) return NULL;
    return ps_onnx_import_model(*m, path, NULL, err);
}

ps_model_def *ps_onnx_load_def(const char *path, ps_err *err) {
    ps_onnx_file *f = NULL;
    ps_onnx_model *m = NULL;
    ps_onnx_import *im = ps_onnx_import_file(path, &f, &m, err);
    ps_model_def *d = im ? ps_onnx_import_def(im, path, err) : NULL;
    ps_onnx_import_free(im);
    ps_onnx_free(m);
    ps_onnx_unmap(f);
    return d;
}
