/* modeldef.h - model files: a model is data (YAML), not C.
 *
 * A model file (docs/models.md) names the model, its sizes (model.sizes.<key>
 * in the config overrides them) and its stages; each stage is a named group
 * of nodes with a per-sample input shape and dtype, and each node is a layer
 * kind (layers.h, PyTorch's class names: Conv2d, BatchNorm2d, Linear, ...)
 * with attributes and named inputs. Inside a stage the nodes form any DAG
 * (fan-out, residual Add, Concat); between stages exactly one tensor
 * crosses (the previous stage's output, read as the stage's `input`).
 * A node's name is its PyTorch module path ("layer1.0.conv1"): its
 * parameters and buffers are the state_dict keys "<name>.<suffix>".
 *
 * Loading checks everything that does not depend on size values: the YAML
 * structure, names (unique, well-formed), kinds and their attributes,
 * inputs (known nodes of the same stage), shared parameters (share/tie:
 * an owner of the same stage that owns them itself), cycles, dangling nodes, the stage
 * cuts and the sizes the attributes refer to. Shapes are inferred when a
 * model is built (model.h), where the sizes are known; every error from
 * either step names file:line and the node.
 *
 * `model.arch: NAME` resolves to the shipped NAME.yaml on the model search
 * path (ps_model_def_search): $PSD_MODEL_PATH (colon-separated), then the
 * installed $(PREFIX)/share/psd/models relative to the running binary, then
 * the checkout's configs/models relative to the binary and to the working
 * directory, then the compiled-in install directory. `model.file: PATH`
 * takes a file directly.
 *
 * A ps_model_def owns all its memory (one arena); it is immutable once
 * loaded and may be shared by threads. ps_model_def_free(NULL) is a no-op.
 */
#ifndef PS_NN_MODELDEF_H
#define PS_NN_MODELDEF_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"
#include "tensor.h"

#define PS_MODEL_MAX_STAGES 8
#define PS_MODEL_MAX_SIZES 8
/* Inputs of one node (Add, Concat): torchvision's densenet201 joins 49
 * tensors. Per-node storage is sized by the node's own count (nin); only
 * scratch arrays on the stack use the bound. */
#define PS_NODE_MAX_INPUTS 64
#define PS_ATTR_MAX_VALUES 8

struct ps_layer_kind;

/* A size the nodes refer to by name (model.sizes.<key> in the config). */
typedef struct ps_size_key {
    const char *key;            /* "ntoken" */
    double def;                 /* default */
    double lo, hi;              /* allowed range, inclusive; hi_open excludes hi */
    int hi_open;
    int integer;                /* 1: a whole number */
    const char *doc;
    int line;
} ps_size_key;

/* One attribute as written: a scalar (nvals 1, is_list 0) or a list of
 * scalars. A value is a number, a size name, true/false, null or a word
 * (layers.h resolves it against the kind's attribute table). */
typedef struct ps_attr_def {
    const char *key;
    int line;
    int is_list;
    int nvals;
    const char *vals[PS_ATTR_MAX_VALUES]; /* NULL: YAML null */
} ps_attr_def;

/* A parameter's initialisation given in the file (init: {weight: ...}). */
typedef struct ps_init_def {
    const char *suffix;         /* "weight" */
    const char *spec;           /* "uniform(-0.1, 0.1)", "zeros", ... (layers.h parses it) */
    int line;
} ps_init_def;

/* A parameter a node uses from another node of its stage (docs/models.md,
 * "Shared parameters"): `share: NODE` (every parameter, suffix NULL, and
 * every buffer: model_build.c) or
 * `tie: {SUFFIX: NODE.SUFFIX}` (one). The owner holds it (one storage, one
 * optimizer state, listed and checkpointed under the owner's name). */
typedef struct ps_tie_def {
    const char *suffix;         /* this node's parameter ("weight"); NULL: share, every parameter */
    const char *target;         /* as written: "encoder.weight" (tie) or "enc" (share) */
    int node;                   /* the owner: node index in the model */
    const char *owner_suffix;   /* the owner's parameter ("weight"); NULL: share, the same suffix */
    int line;
} ps_tie_def;

typedef struct ps_node_def {
    const char *name;           /* module path, "layer1.0.conv1" */
    int line;
    const char *kind_name;      /* as written */
    const struct ps_layer_kind *kind;
    int stage;                  /* index of its stage */
    int nin;
    const char **in_names;      /* (max(nin, 1)) as written ("input": the stage input) */
    int *in;                    /* (max(nin, 1)) resolved: node index in the model, -1 = the stage input */
    int nattr;
    const ps_attr_def *attrs;
    int ninit;
    const ps_init_def *inits;
    const char *share_name;     /* share: NODE as written, NULL = none ... */
    int share;                  /* ... the owner's node index, -1 = none */
    int share_line;
    int ntie;                   /* tie: {SUFFIX: NODE.SUFFIX, ...} */
    const ps_tie_def *ties;
} ps_node_def;

typedef struct ps_stage_def {
    const char *name;           /* "conv" */
    int line;
    /* Per-sample input. inherit = 1: the previous stage's output.
     * Otherwise in_ndim dims, each the literal in_dims[d] or the size in_keys[d]. */
    int inherit;
    int in_ndim;
    int64_t in_dims[PS_SHAPE_MAX_DIMS];
    const char *in_keys[PS_SHAPE_MAX_DIMS];
    ps_dtype in_dtype;
    int first, count;           /* its nodes: [first, first + count) of the model's, in file order */
    const int *order;           /* (count) node indices in a topological order (file order where it is one) */
    int output;                 /* node index of the stage's output */
} ps_stage_def;

typedef struct ps_model_def {
    const char *name;           /* "mnist_cnn" */
    const char *about;          /* one line */
    const char *path;           /* the file it came from */
    int max_batch;              /* largest training forward (samples) */
    int nsizes;
    ps_size_key sizes[PS_MODEL_MAX_SIZES];
    int nstages;
    ps_stage_def stages[PS_MODEL_MAX_STAGES];
    int nnodes;
    const ps_node_def *nodes;   /* stage by stage, file order */
    struct ps_arena *arena;
} ps_model_def;

/* Parse a model file's text (len bytes; need not be NUL-terminated). path
 * names it in errors ("configs/models/x.yaml:12: ..."). */
ps_model_def *ps_model_def_parse(const char *text, size_t len, const char *path, ps_err *err);
/* Read and parse the file at path. */
ps_model_def *ps_model_def_load_file(const char *path, ps_err *err);
/* The file of model.arch NAME (see above) into path; NOT_FOUND naming the
 * directories searched and the models they hold. */
ps_status ps_model_def_find_arch(const char *arch, char *path, size_t cap, ps_err *err);
/* file when given (non-NULL, non-empty), else arch's shipped file. */
ps_model_def *ps_model_def_load(const char *arch, const char *file, ps_err *err);
void ps_model_def_free(ps_model_def *d);

/* The model search path, ':'-separated, into buf (for messages). */
const char *ps_model_def_search_path(char *buf, size_t cap);
/* Names of the models on the search path (NAME of every NAME.yaml, first
 * hit of each, sorted), comma-separated, into buf. */
const char *ps_model_def_list_shipped(char *buf, size_t cap);

/* The size key of that name in def, or NULL. */
const ps_size_key *ps_model_def_size(const ps_model_def *def, const char *key);
/* Stage index of that name in def, or -1. */
int ps_model_def_stage(const ps_model_def *def, const char *name);
/* "conv, fc" into buf. */
const char *ps_model_def_stage_list(const ps_model_def *def, char *buf, size_t size);
/* The value of size key: values[] (parallel to keys[], n of them) when it
 * names it, else the file's default. key must be a size of def. */
double ps_model_def_size_value(const ps_model_def *def, const char *key, int n, const char *const *keys,
                               const double *values);

#endif
