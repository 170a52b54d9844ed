/* onnx_weights.h - a built model's initial weights from an ONNX file
 * (model.onnx: FILE); the definition is onnx_model.h.
 *
 * ps_onnx_init_weights sets a built model's parameters and buffers from the
 * file's initializers (psd does this at start-up unless a checkpoint is
 * resumed or --init-from is given): every parameter and buffer the import
 * bound, hosted stages only (a shard takes its rows); BatchNorm's
 * num_batches_tracked, which ONNX does not carry, stays 0.
 * ps_onnx_import_weights does the same from an import already made (tests
 * feeding extra inputs).
 */
#ifndef PS_NN_ONNX_WEIGHTS_H
#define PS_NN_ONNX_WEIGHTS_H

#include "model.h"
#include "onnx_import.h"
#include "status.h"

ps_status ps_onnx_init_weights(ps_model *m, const char *path, ps_err *err);
ps_status ps_onnx_import_weights(ps_model *m, const ps_onnx_import *im, const char *label, ps_err *err);

#endif
