/* onnx_model.h - an ONNX file as a model definition (model.onnx: FILE, or
 * model.file naming a .onnx file); its initial weights are onnx_weights.h.
 *
 * ps_onnx_load_def maps the file, parses it (onnx.h), imports the graph
 * (onnx_import.h) and parses the resulting model file text (modeldef.h);
 * modeldef's ps_model_def_load_file calls it for an ONNX file, so every
 * user of model files (psd, --check-config, the stage table) takes ONNX
 * files alike. Errors name the file and the ONNX node, or the imported
 * node with "FILE (imported):LINE".
 *
 * ps_onnx_import_file maps, parses and imports path; the caller frees all
 * three (ps_onnx_import_free, ps_onnx_free, ps_onnx_unmap), also on failure.
 */
#ifndef PS_NN_ONNX_MODEL_H
#define PS_NN_ONNX_MODEL_H

#include "modeldef.h"
#include "onnx.h"
#include "onnx_import.h"
#include "status.h"

ps_model_def *ps_onnx_load_def(const char *path, ps_err *err);
ps_onnx_import *ps_onnx_import_file(const char *path, ps_onnx_file **f, ps_onnx_model **m, ps_err *err);

/* From an import already made (tests feeding extra inputs). */
ps_model_def *ps_onnx_import_def(const ps_onnx_import *im, const char *label, ps_err *err);

#endif
