/* onnx_import.h - an ONNX graph as a psd model (model.onnx: FILE).
 *
 * ps_onnx_import turns a parsed ONNX model (onnx.h) into the text of a
 * model file (docs/models.md: one stage "main" whose nodes are psd's layer
 * kinds) and a table saying where each parameter's and buffer's initial
 * values come from (which initializer, transposed or not), so the model
 * file machinery (modeldef.h, layers.h) checks and builds it like any
 * other, and the weights load from the .onnx file itself.
 *
 * The mapping (docs/models.md, "From ONNX"):
 *  - One graph input is the stage input (besides the initializers); its
 *    first dimension is the batch when every op works per sample, else the
 *    whole input is one sample (a Forward then takes (N, *input shape)).
 *  - Supported ops map to kinds (Conv -> Conv2d, Gemm/MatMul(+Add) ->
 *    Linear, BatchNormalization -> BatchNorm2d/1d with momentum 1 - m,
 *    Transpose of a computed value -> Permute, Mul by an initializer ->
 *    Scale, ...);
 *    initializers become the parameters of the node that reads them, named
 *    "<node>.<suffix>" with the node named after the initializer's
 *    state_dict prefix when it has one ("layer1.0.conv1.weight" -> node
 *    "layer1.0.conv1"), else after the ONNX node's scope ("/layer1/layer1.0/
 *    conv1/Conv" -> "layer1.0.conv1").
 *  - Each op follows the file's opset where its meaning changed (Softmax
 *    and LogSoftmax's axis before 13, BatchNormalization's attributes before
 *    7 and 9, Dropout's ratio before 12, Pad's pads before 11, Reshape's
 *    shape before 5).
 *  - The exporter's decompositions are recognised: GELU (Div, Erf, Add, Mul,
 *    Mul), SiLU (Sigmoid, Mul), LayerNorm below opset 17 (ReduceMean, Sub,
 *    Pow, ReduceMean, Add, Sqrt, Div, Mul, Add), a zero Pad before
 *    AveragePool or Conv, shape arithmetic on constants (Shape, Gather,
 *    Unsqueeze, Concat, Cast feeding a Reshape) and bias Adds after MatMul.
 *  - Anything else is PS_ERR_UNIMPLEMENTED naming the node and its op type
 *    (or the attribute value) - the only error that means "not supported";
 *    a malformed graph (unknown value names, wrong input counts, shapes that
 *    do not fit) is PS_ERR_INVALID_ARGUMENT.
 *
 * A ps_onnx_import owns its memory and points into the ps_onnx_model it
 * came from (which must outlive it); ps_onnx_import_free(NULL) is a no-op.
 */
#ifndef PS_NN_ONNX_IMPORT_H
#define PS_NN_ONNX_IMPORT_H

#include <stddef.h>
#include <stdint.h>

#include "onnx.h"
#include "status.h"

typedef struct ps_onnx_import ps_onnx_import;

typedef enum {
    PS_ONNX_BATCH_AUTO = 0,     /* the input's first dimension, unless an op needs the whole input */
    PS_ONNX_BATCH_LEADING,      /* the input's first dimension is the batch */
    PS_ONNX_BATCH_NONE,         /* the whole input is one sample */
} ps_onnx_batch;

typedef struct ps_onnx_import_opts {
    ps_onnx_batch batch;
    const char *name;           /* the model's name; NULL: from the graph's name or the file's */
    /* Graph inputs given as constants (the backend tests' extra inputs):
     * they become initializers, the first graph input not named here is
     * the stage input. */
    int nfeeds;
    const ps_onnx_tensor *const *feeds;   /* each with the input's name */
} ps_onnx_import_opts;

/* Import m (label names it in messages: the file). opts may be NULL. */
ps_onnx_import *ps_onnx_import_model(const ps_onnx_model *m, const char *label, const ps_onnx_import_opts *opts,
                                     ps_err *err);
void ps_onnx_import_free(ps_onnx_import *im);

/* The model file's text (NUL-terminated). */
const char *ps_onnx_import_yaml(const ps_onnx_import *im, size_t *len);
/* 1 when the whole input was taken as one sample. */
int ps_onnx_import_whole_sample(const ps_onnx_import *im);

/* Initial values: one entry per parameter or buffer the .onnx file
 * supplies, by state_dict name; values (numel floats) into dst. Entries the
 * file does not supply (a BatchNorm's num_batches_tracked) are absent. */
int ps_onnx_import_num_values(const ps_onnx_import *im);
const char *ps_onnx_import_value_name(const ps_onnx_import *im, int i);
int64_t ps_onnx_import_value_numel(const ps_onnx_import *im, int i);
ps_status ps_onnx_import_value(const ps_onnx_import *im, int i, float *dst, ps_err *err);

/* 1 when the file at path is an ONNX model: its name ends in ".onnx", or it
 * starts with a protobuf tag a model file (YAML text) cannot start with. */
int ps_onnx_is_onnx_file(const char *path);

#endif
