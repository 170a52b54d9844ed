/* optim.h - optimizers on parameter buffers: one update of one parameter,
 * dense or row-sparse, with PyTorch 1.13's semantics, through the backend's
 * ops (sgd_update, adam_update, sgd_update_rows, adam_update_rows); dense
 * updates in place or from one copy of the weights into another.
 *
 * The module owns nothing: the caller (the model executor) owns each
 * parameter's weights w, its gradient g and its state (ps_optim_state: the
 * kind's state buffers, device memory of the backend, numel floats each,
 * zero-filled before the first update, plus the update count), and
 * serialises updates of one parameter (e.g. under its weights lock).
 *
 * Kinds are rows of one table (optim.c): name, PyTorch class, state buffers
 * and their names. The state names are PyTorch's state keys, so checkpoints
 * store them as "<param>.<state name>" ("fc1.weight.exp_avg") and a
 * PyTorch user can put them into optimizer.state[p][name] as they are
 * (the step is an int64 count here; torch.optim.Adam 1.13 keeps
 * state['step'] as a float32 scalar tensor: convert with .float()).
 *
 *   kind   dense update            row-sparse update          state buffers
 *   sgd    torch.optim.SGD         plain SGD on the rows       momentum_buffer (only when
 *          (dampening 0, no          (momentum 0 and                momentum > 0)
 *          Nesterov)                 weight_decay 0 only)
 *   adam   torch.optim.Adam        torch.optim.SparseAdam      exp_avg, exp_avg_sq
 *          (amsgrad off, L2          (lazy: only touched rows'
 *          weight decay, not AdamW)  moments change; weight_decay
 *                                    0 only)
 *
 * step: every kind counts the updates applied to a parameter (dense and
 * row-sparse alike, one count per parameter tensor as PyTorch's
 * state['step']). Adam's bias corrections use it; for SGD it only says
 * whether the momentum buffer exists yet (step 0: PyTorch has not created
 * it; the first update sets it to the gradient). A zero-filled momentum
 * buffer with step > 0 gives the same update (momentum * 0 + g = g), so a
 * restored step without its buffer restarts momentum as PyTorch would. A
 * parameter mixing dense and sparse updates under adam shares exp_avg,
 * exp_avg_sq and step between the two formulas (PyTorch would need two
 * optimizers for that; avoid it).
 *
 * Errors: a bad spec (range, kind, a combination the sparse update refuses)
 * is PS_ERR_INVALID_ARGUMENT; bad row indices (out of range, repeated) are
 * PS_ERR_INVALID_ARGUMENT naming the index - they come from peers, so they
 * are statuses, never asserts. A refused update changes nothing, step
 * included; when the backend op itself fails (a device error) the step is
 * not counted but the buffers' contents are unspecified.
 */
#ifndef PS_NN_OPTIM_H
#define PS_NN_OPTIM_H

#include <stdint.h>

#include "backend.h"
#include "status.h"

typedef enum { PS_OPTIM_SGD = 0, PS_OPTIM_ADAM, PS_OPTIM_KIND_COUNT } ps_optim_kind;

#define PS_OPTIM_MAX_STATE 2

/* One row of the kind table. */
typedef struct ps_optim_kind_info {
    const char *name;          /* "sgd", "adam": config and checkpoint metadata */
    const char *torch_class;   /* "torch.optim.SGD" (dense updates) */
    int max_state;             /* state buffers per parameter at most */
    const char *state_names[PS_OPTIM_MAX_STATE]; /* PyTorch's state keys */
} ps_optim_kind_info;

/* Kind and hyper-parameters. Doubles, as PyTorch's Python floats; the ops
 * round them to float where PyTorch does. betas/eps are ignored for sgd;
 * momentum must be 0 for adam (ps_optim_check refuses it: beta1 is Adam's
 * momentum, and a silently ignored setting would mislead). */
typedef struct ps_optim_spec {
    ps_optim_kind kind;
    double lr;             /* > 0 */
    double momentum;       /* sgd: [0, 1) */
    double weight_decay;   /* >= 0; L2 added to the gradient (both kinds) */
    double beta1, beta2;   /* adam: [0, 1) each */
    double eps;            /* adam: > 0 */
} ps_optim_spec;

/* One parameter's optimizer state. */
typedef struct ps_optim_state {
    float *buf[PS_OPTIM_MAX_STATE]; /* ps_optim_num_state() device buffers, numel floats each */
    int64_t step;                   /* updates applied so far; 0 before the first */
} ps_optim_state;

/* The kind's row; NULL for a value out of range. */
const ps_optim_kind_info *ps_optim_kind_get(ps_optim_kind kind);
const char *ps_optim_kind_name(ps_optim_kind kind);
/* The kinds' names, NULL-terminated, indexed by kind (optimizer.type). */
const char *const *ps_optim_kind_names(void); /* NULL if out of range */

/* "sgd" -> PS_OPTIM_SGD. An unknown name is PS_ERR_NOT_FOUND naming it and
 * the known ones: "unknown optimizer 'adamw' (known: sgd, adam)". */
ps_status ps_optim_kind_parse(const char *name, ps_optim_kind *out, ps_err *err);

/* PyTorch's defaults for the kind (SGD: lr 0.03 as psd's config, momentum
 * 0; Adam: lr 0.001, betas (0.9, 0.999), eps 1e-8; weight_decay 0). */
void ps_optim_spec_default(ps_optim_kind kind, ps_optim_spec *s);

/* Check a spec: ranges as above, momentum 0 for adam, and with sparse != 0 the row-sparse
 * restrictions (sgd: momentum and weight_decay 0; adam: weight_decay 0).
 * Messages name the field and value, e.g. "optimizer adam: weight_decay
 * 0.01 is not supported for row-sparse updates (torch.optim.SparseAdam
 * has none)". */
ps_status ps_optim_check(const ps_optim_spec *s, int sparse, ps_err *err);

/* State buffers a parameter needs under spec s (sgd: 1 with momentum, else
 * 0; adam: 2), and the name of buffer j (< that count). The names with
 * the step count are the whole state a checkpoint must save. */
int ps_optim_num_state(const ps_optim_spec *s);
const char *ps_optim_state_name(ps_optim_kind kind, int j);

/* Names of the kind's state buffers (max_state of them, *n set), e.g.
 * {"exp_avg", "exp_avg_sq"}; NULL and *n = 0 for a bad kind. */
const char *const *ps_optim_state_names(ps_optim_kind kind, int *n);

/* One dense update of count elements: w, g and st->buf[] are device
 * buffers of b. Increments st->step first (PyTorch's order). s must have
 * passed ps_optim_check(s, 0). */
ps_status ps_optim_step(ps_backend *b, const ps_optim_spec *s, int64_t count, float *w, const float *g,
                        ps_optim_state *st, ps_err *err);

/* ps_optim_step out of place: the updated weights of w go to w_out (device
 * memory of b not overlapping w, or w itself), w is only read; the state
 * is updated in place as by ps_optim_step. Bit-identical to copying w into
 * w_out and stepping w_out in place, in one pass instead of two (the
 * model's snapshot steps write the next version this way). */
ps_status ps_optim_step_to(ps_backend *b, const ps_optim_spec *s, int64_t count, float *w_out, const float *w,
                           const float *g, ps_optim_state *st, ps_err *err);

/* One row-sparse update of a (total_rows, width) parameter: rows (HOST
 * memory, nrows distinct int64 indices in [0, total_rows)) and g_rows
 * ((nrows, width) floats, device memory of b, in the order of rows). Only
 * those rows of w and of the state change; st->step is incremented once.
 * nrows 0 is a step with no touched row (step still counts, as
 * SparseAdam counts a step whose gradient has no entries). s must pass
 * ps_optim_check(s, 1); bad indices are refused before anything changes. */
ps_status ps_optim_step_rows(ps_backend *b, const ps_optim_spec *s, int64_t total_rows, int64_t width,
                             const int64_t *rows, int64_t nrows, float *w, const float *g_rows,
                             ps_optim_state *st, ps_err *err);

/* ps_optim_step_rows without its checks and allocations, for a caller
 * that did them before writing anything (the model's step): drows are in
 * device memory of b (host memory for a host backend), distinct and within
 * the parameter's rows; s passed ps_optim_check(s, 1). Bad indices here
 * are a broken invariant, not a status. Allocates nothing. */
ps_status ps_optim_step_rows_checked(ps_backend *b, const ps_optim_spec *s, int64_t width, const int64_t *drows,
                                     int64_t nrows, float *w, const float *g_rows, ps_optim_state *st,
                                     ps_err *err);

#endif
