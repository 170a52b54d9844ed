/* fit_data.h - a data set against a model: the checks `ps-train fit` makes
 * before it sends anything, the split into training and held-out samples,
 * and the batches it sends.
 *
 * Inputs and labels are arrays (array.h) whose dim 0 counts samples. The
 * model is what psd's ListParameters says per sample: the first stage's
 * input shape and dtype, the last stage's output shape.
 *
 * Inputs: a sample's shape must equal the model's per-sample input shape
 * with size-1 dims ignored ((28, 28) images feed a model taking (1, 28, 28));
 * for a model whose first stage takes int64 ids (an embedding), the sample
 * may also carry extra leading dims before that shape ((T,) token ids per
 * sample into a stage taking one id): the output then has them too, and
 * the loss treats each position as a prediction. Float models take any
 * numeric dtype, converted as (x * scale - mean[ch]) / std[ch] (ch: the
 * channel, dim 0 of a 3-dim per-sample shape; one mean/std serves all);
 * scale defaults to 1/255 for uint8 data (torchvision's ToTensor) and 1
 * otherwise. int64 models take integer dtypes only, unscaled.
 *
 * Labels: their count must equal the inputs'. Class losses (losses.h) need
 * integer class ids, one per prediction: a sample's label shape is the
 * output's without its class dim (extra dims included), size-1 dims
 * ignored; every id is checked to lie in 0..classes-1 here, naming the
 * sample (ps_fit_check_class: the classes may be the output's last dim,
 * and a label equal to the ignore_index passes whatever its value). Dense
 * losses need one number per output element, any numeric
 * dtype, converted to float32.
 *
 * Every error names the file (the name given) and says what does not fit.
 */
#ifndef PS_TRAINER_FIT_DATA_H
#define PS_TRAINER_FIT_DATA_H

#include <stdint.h>

#include "array.h"
#include "losses.h"
#include "status.h"

#define PS_FIT_MAX_DIMS 4     /* = the wire's: a batch's dims, batch dim included */
#define PS_FIT_MAX_CHANNELS 16

/* The model per sample (from ListParameters' StageInfo). */
typedef struct ps_fit_model {
    int in_ndim;
    int64_t in_dims[PS_FIT_MAX_DIMS];
    int in_int64;             /* the first stage takes int64 ids */
    int out_ndim;
    int64_t out_dims[PS_FIT_MAX_DIMS];
    const char *first_stage;  /* names in messages */
} ps_fit_model;

/* Input conversion (float models). */
typedef struct ps_fit_norm {
    double scale;             /* < 0: the default for the dtype */
    int nmean, nstd;          /* 0: mean 0, std 1; 1: every channel; else one per channel */
    double mean[PS_FIT_MAX_CHANNELS], std[PS_FIT_MAX_CHANNELS];
} ps_fit_norm;

/* How the arrays meet the model (ps_fit_check fills it). */
typedef struct ps_fit_layout {
    int extra_ndim;                      /* leading per-sample dims before the model's input */
    int64_t extra[PS_FIT_MAX_DIMS];
    int64_t x_numel;                     /* input elements per sample */
    int in_ndim;                         /* the batch tensor: (n, extra..., model input...) */
    int64_t in_dims[PS_FIT_MAX_DIMS];    /* in_dims[0] is set per batch */
    int64_t out_numel;                   /* output floats per sample (extra included) */
    int64_t rows;                        /* positions per sample: prod(extra) */
    int64_t loss_rows;                   /* loss rows per sample: rows; classes last: rows * the output's dims
                                          * before its last */
    int64_t classes;                     /* c: output dim after extra (dense losses: its size too) */
    int64_t inner;                       /* elements per (row, class) */
    int64_t y_numel;                     /* label elements per sample */
    int64_t t_per_row;                   /* a forward_t loss's targets per row (vae_bce: the recon's size) */
    double scale;                        /* resolved input scale */
} ps_fit_layout;

/* What holds whatever the model: x and y have samples along dim 0, as many
 * in each, 1..2^32-1 of them, and each sample of either holds at least one
 * value (a (N, 0) array feeds no model, and its N sample indices would be
 * allocated for nothing: two 128-byte files of shape (2^32-1, 0) asked for
 * 37 GB). ps-train fit checks this right after loading, before the split;
 * ps_fit_check checks it first. */
ps_status ps_fit_check_samples(const ps_array *x, const char *xname, const ps_array *y, const char *yname,
                               ps_err *err);

/* Several input arrays (a model of several inputs: psd-export's forward(self, ids, feats)) joined into the
 * one input psd takes, *out (N, total): each sample's values of parts[0], then parts[1], ... flattened in C
 * order - np.concatenate([a.reshape(n, -1) for a in parts], 1), which is also psd-export's join along dim 1 of
 * inputs differing only there (ps-train fit gives *out the model's per-sample shape once connected). Every
 * part holds at least one dim and the same N samples as parts[0], each with at least one value (names[i] in
 * the errors). All integer parts: int64; any float part: float32, the integer parts' values exact in it (ids
 * of a mixed input, below 2^24 in magnitude; a larger value is refused naming its part, sample and value).
 * At most PS_FIT_MAX_INPUTS parts; *out is allocated (ps_array_free). */
#define PS_FIT_MAX_INPUTS 8
ps_status ps_fit_join(const ps_array *parts, const char *const *names, int n, size_t max_bytes, ps_array *out,
                      ps_err *err);

/* Check x (named xname) and y (yname) against the model and the loss; fill
 * *lay. nclass_check: check every class id's range (class losses). */
ps_status ps_fit_check(const ps_array *x, const char *xname, const ps_array *y, const char *yname,
                       const ps_fit_model *m, const ps_loss *loss, const ps_fit_norm *norm, ps_fit_layout *lay,
                       ps_err *err);

/* The class losses' options of ps-train fit: PyTorch's ignore_index and where the class dim is. */
typedef struct ps_fit_class {
    int64_t ignore;           /* PS_LOSS_NO_IGNORE: none; else a label equal to it is no prediction (any value) */
    int last;                 /* 1: the output's LAST dim holds the classes, (d..., C) per sample - a language
                               * model's (T, V) trained as loss_fn(logits.reshape(-1, V), tgt.reshape(-1)); labels
                               * (d...); 0: PyTorch's (C, d...) */
} ps_fit_class;

/* ps_fit_check with cls (NULL: no ignore_index, classes first). Class ids
 * out of 0..classes-1 are refused naming the sample unless equal to
 * cls->ignore. */
ps_status ps_fit_check_class(const ps_array *x, const char *xname, const ps_array *y, const char *yname,
                             const ps_fit_model *m, const ps_loss *loss, const ps_fit_class *cls,
                             const ps_fit_norm *norm, ps_fit_layout *lay, ps_err *err);

/* The channel count norm's per-channel values must match (0: no check
 * possible): dim 0 of a 3-dim model input. */
int64_t ps_fit_channels(const ps_fit_model *m);

/* Samples idx[0..n-1] of x converted for the model: floats (float models,
 * normalised) into xf or int64 into xi (the other may be NULL). */
ps_status ps_fit_inputs(const ps_array *x, const ps_fit_layout *lay, const ps_fit_norm *norm, int in_int64,
                        const uint32_t *idx, int n, float *xf, int64_t *xi, ps_err *err);
/* Their targets: int64 class ids (class losses) or floats (dense) into t. */
ps_status ps_fit_targets(const ps_array *y, const ps_fit_layout *lay, const ps_loss *loss, const uint32_t *idx,
                         int n, void *t, ps_err *err);

/* The held-out split: of n samples, round(val_fraction * n) chosen by a
 * shuffle seeded with seed (the same on every rank) are held out (*val,
 * ascending), the rest (*train, ascending) are for training; with
 * share_of > 1 this rank (1-based rank of share_of) keeps its contiguous
 * 1/share_of of the training samples. Arrays malloc'ed (the caller frees);
 * INVALID_ARGUMENT when a part would be empty. */
ps_status ps_fit_split(uint32_t n, double val_fraction, uint64_t seed, int rank, int share_of, uint32_t **train,
                       uint32_t *ntrain, uint32_t **val, uint32_t *nval, ps_err *err);

#endif
