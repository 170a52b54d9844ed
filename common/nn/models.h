/* models.h - the model registry: every model psd can host, in one table.
 *
 * A model is a list of stages (the unit of placement and of the
 * Forward/Backward RPCs), each a list of layers (layers.h) with PyTorch's
 * state_dict names and initialisation, plus named sizes (model.sizes.<key>
 * in the config) that layers refer to. Config (model.name,
 * model.placement.<stage>, model.sizes.<key>), psd and the trainer read
 * this table; adding a model is adding a row here (and its golden test).
 */
#ifndef PS_NN_MODELS_H
#define PS_NN_MODELS_H

#include "layers.h"
#include "tensor.h"

/* A size a model's layers refer to by name. */
typedef struct ps_size_key {
    const char *key;            /* "ntoken" */
    double def;                 /* default */
    double lo, hi;              /* allowed range, inclusive; hi_open excludes hi */
    int hi_open;
    int integer;                /* 1: a whole number */
    const char *doc;
} ps_size_key;

typedef struct ps_stage_def {
    const char *name;           /* "conv" */
    /* Per-sample input. inherit = 1: the previous stage's output. Otherwise
     * in_ndim dims, each the literal in_dims[d] or the size in_keys[d]. */
    int inherit;
    int in_ndim;
    int64_t in_dims[PS_SHAPE_MAX_DIMS];
    const char *in_keys[PS_SHAPE_MAX_DIMS];
    ps_dtype in_dtype;
    const ps_layer_def *layers;
    int nlayers;
} ps_stage_def;

#define PS_MODEL_MAX_SIZES 8

typedef struct ps_model_def {
    const char *name;           /* "mnist_cnn" */
    const char *about;          /* one line: where it comes from */
    int max_batch;              /* largest training forward (samples) */
    const ps_stage_def *stages;
    int nstages;
    const ps_size_key *sizes;
    int nsizes;
} ps_model_def;

/* The registry. */
int ps_model_def_count(void);
const ps_model_def *ps_model_def_at(int i);
const ps_model_def *ps_model_def_find(const char *name);   /* NULL if unknown */
/* Names of all models, NULL-terminated, in registry order. */
const char *const *ps_model_def_names(void);

/* The size key of that name in def, or NULL. */
const ps_size_key *ps_model_def_size(const ps_model_def *def, const char *key);
/* A size key of that name in any model (for the config's range check), or NULL. */
const ps_size_key *ps_model_any_size(const char *key);
/* Stage index of that name in def, or -1. */
int ps_model_def_stage(const ps_model_def *def, const char *name);
/* "conv, fc" into buf. */
const char *ps_model_def_stage_list(const ps_model_def *def, char *buf, size_t size);

#endif
