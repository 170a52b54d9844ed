/* onnx_model.h - an ONNX file as psd's model: its definition and its
 * initial weights (model.onnx: FILE, or model.file naming a .onnx file).
 *
 * ps_onnx_load_def maps the file, parses it (onnx.h), imports the graph
 * (onnx_import.h) and parses the resulting model file text (modeldef.h);
 * modeldef's ps_model_def_load_file calls it for an ONNX file, so every
 * user of model files (psd, --check-config, the stage table) takes ONNX
 * files alike. Errors name the file and the ONNX node, or the imported
 * node with "FILE (imported):LINE".
 *
 * ps_onnx_init_weights sets a built model's parameters and buffers from the
 * file's initializers (psd does this at start-up unless a checkpoint is
 * resumed or --init-from is given): every parameter and buffer the import
 * bound, hosted stages only (a shard takes its rows); BatchNorm's
 * num_batches_tracked, which ONNX does not carry, stays 0.
 */
#ifndef PS_NN_ONNX_MODEL_H
#define PS_NN_ONNX_MODEL_H

#include "model.h"
#include "modeldef.h"
#include "onnx_import.h"
#include "status.h"

ps_model_def *ps_onnx_load_def(const char *path, ps_err *err);
ps_status ps_onnx_init_weights(ps_model *m, const char *path, ps_err *err);

/* Both from an import already made (tests feeding extra inputs). */
ps_model_def *ps_onnx_import_def(const ps_onnx_import *im, const char *label, ps_err *err);
ps_status ps_onnx_import_weights(ps_model *m, const ps_onnx_import *im, const char *label, ps_err *err);

#endif
