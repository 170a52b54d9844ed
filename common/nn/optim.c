/* optim.c - the optimizer kinds (one table) and one update of one parameter
 * through the backend's optimizer ops. See optim.h. */
#include "optim.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ps_optim_kind_info kKinds[PS_OPTIM_KIND_COUNT] = {
    [PS_OPTIM_SGD] = { "sgd", "torch.optim.SGD", 1, { "momentum_buffer" } },
    [PS_OPTIM_ADAM] = { "adam", "torch.optim.Adam", 2, { "exp_avg", "exp_avg_sq" } },
};

const ps_optim_kind_info *ps_optim_kind_get(ps_optim_kind kind) {
    return (unsigned)kind < PS_OPTIM_KIND_COUNT ? &kKinds[kind] : NULL;
}

const char *ps_optim_kind_name(ps_optim_kind kind) {
    const ps_optim_kind_info *k = ps_optim_kind_get(kind);
    return k ? k->name : NULL;
}

static const char *kind_names[PS_OPTIM_KIND_COUNT + 1];
static pthread_once_t kind_names_once = PTHREAD_ONCE_INIT;

static void kind_names_fill(void) {
    for (int i = 0; i < PS_OPTIM_KIND_COUNT; i++) kind_names[i] = kKinds[i].name;
}

const char *const *ps_optim_kind_names(void) {
    pthread_once(&kind_names_once, kind_names_fill);
    return kind_names;
}

ps_status ps_optim_kind_parse(const char *name, ps_optim_kind *out, ps_err *err) {
    char known[128] = "";
    size_t len = 0;
    for (int i = 0; i < PS_OPTIM_KIND_COUNT; i++) {
        if (name && !strcmp(name, kKinds[i].name)) {
            *out = (ps_optim_kind)i;
            return PS_OK;
        }
        if (len < sizeof known)
            len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", kKinds[i].name);
    }
    return ps_err_set(err, PS_ERR_NOT_FOUND, "unknown optimizer '%s' (known: %s)", name ? name : "(null)",
                      known);
}

void ps_optim_spec_default(ps_optim_kind kind, ps_optim_spec *s) {
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->lr = kind == PS_OPTIM_ADAM ? 1e-3 : 0.03;
    s->beta1 = 0.9;
    s->beta2 = 0.999;
    s->eps = 1e-8;
}

ps_status ps_optim_check(const ps_optim_spec *s, int sparse, ps_err *err) {
    const char *kn = ps_optim_kind_name(s->kind);
    if (!kn) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer kind %d is not one of this build's",
                               (int)s->kind);
    if (!(s->lr > 0 && isfinite(s->lr)))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer %s: lr %g must be > 0", kn, s->lr);
    if (!(s->weight_decay >= 0 && isfinite(s->weight_decay)))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer %s: weight_decay %g must be >= 0", kn,
                          s->weight_decay);
    if (s->kind == PS_OPTIM_SGD) {
        if (!(s->momentum >= 0 && s->momentum < 1))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer sgd: momentum %g must be in [0, 1)",
                              s->momentum);
        if (sparse && s->momentum != 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer sgd: momentum %g is not supported for "
                              "row-sparse updates (use momentum 0, or adam for SparseAdam)", s->momentum);
    } else {
        if (s->momentum != 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer adam: momentum %g is not an Adam "
                              "setting (beta1 is its momentum); set it to 0", s->momentum);
        if (!(s->beta1 >= 0 && s->beta1 < 1))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer adam: beta1 %g must be in [0, 1)",
                              s->beta1);
        if (!(s->beta2 >= 0 && s->beta2 < 1))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer adam: beta2 %g must be in [0, 1)",
                              s->beta2);
        if (!(s->eps > 0 && isfinite(s->eps)))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer adam: eps %g must be > 0", s->eps);
    }
    if (sparse && s->weight_decay != 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "optimizer %s: weight_decay %g is not supported for "
                          "row-sparse updates (%s)", kn, s->weight_decay,
                          s->kind == PS_OPTIM_ADAM ? "torch.optim.SparseAdam has none"
                                                   : "it would change every row");
    return PS_OK;
}

int ps_optim_num_state(const ps_optim_spec *s) {
    if (s->kind == PS_OPTIM_SGD) return s->momentum != 0 ? 1 : 0;
    const ps_optim_kind_info *k = ps_optim_kind_get(s->kind);
    return k ? k->max_state : 0;
}

const char *ps_optim_state_name(ps_optim_kind kind, int j) {
    const ps_optim_kind_info *k = ps_optim_kind_get(kind);
    return k && j >= 0 && j < k->max_state ? k->state_names[j] : NULL;
}

const char *const *ps_optim_state_names(ps_optim_kind kind, int *n) {
    const ps_optim_kind_info *k = ps_optim_kind_get(kind);
    *n = k ? k->max_state : 0;
    return k ? k->state_names : NULL;
}

static ps_adam_desc adam_desc(const ps_optim_spec *s, int64_t step) {
    ps_adam_desc d = { .lr = s->lr, .beta1 = s->beta1, .beta2 = s->beta2, .eps = s->eps,
                       .weight_decay = s->weight_decay, .step = step };
    return d;
}

ps_status ps_optim_step_to(ps_backend *b, const ps_optim_spec *s, int64_t count, float *w_out, const float *w,
                           const float *g, ps_optim_state *st, ps_err *err) {
    ps_status rc = ps_optim_check(s, 0, err);
    if (rc) return rc;
    const int64_t step = st->step + 1;
    if (s->kind == PS_OPTIM_SGD) {
        ps_sgd_desc d = { .lr = (float)s->lr, .momentum = (float)s->momentum,
                          .weight_decay = (float)s->weight_decay, .first_step = step == 1 };
        rc = b->ops->sgd_update(b->impl, count, w_out, w, g, s->momentum != 0 ? st->buf[0] : NULL, &d, err);
    } else {
        const ps_adam_desc d = adam_desc(s, step);
        rc = b->ops->adam_update(b->impl, count, w_out, w, g, st->buf[0], st->buf[1], &d, err);
    }
    if (rc == PS_OK) st->step = step;
    return rc;
}

ps_status ps_optim_step(ps_backend *b, const ps_optim_spec *s, int64_t count, float *w, const float *g,
                        ps_optim_state *st, ps_err *err) {
    return ps_optim_step_to(b, s, count, w, w, g, st, err);
}

/* rows must be distinct and in [0, total_rows). */
static ps_status check_rows(int64_t total_rows, const int64_t *rows, int64_t nrows, ps_err *err) {
    unsigned char *seen = calloc((size_t)(total_rows + 7) / 8, 1);
    if (!seen) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "row-sparse update: out of memory");
    ps_status rc = PS_OK;
    for (int64_t i = 0; i < nrows; i++) {
        const int64_t r = rows[i];
        if (r < 0 || r >= total_rows) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "row-sparse update: row index %lld (entry %lld) is "
                            "out of range [0, %lld)", (long long)r, (long long)i, (long long)total_rows);
            break;
        }
        if (seen[r / 8] & (1u << (r % 8))) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "row-sparse update: row index %lld is repeated "
                            "(entry %lld); indices must be distinct", (long long)r, (long long)i);
            break;
        }
        seen[r / 8] |= (unsigned char)(1u << (r % 8));
    }
    free(seen);
    return rc;
}

ps_status ps_optim_step_rows_checked(ps_backend *b, const ps_optim_spec *s, int64_t width, const int64_t *drows,
                                     int64_t nrows, float *w, const float *g_rows, ps_optim_state *st,
                                     ps_err *err) {
    const int64_t step = st->step + 1;
    ps_status rc = PS_OK;
    if (nrows == 0 || width == 0) {
        st->step = step;
        return PS_OK;
    }
    if (s->kind == PS_OPTIM_SGD) {
        rc = b->ops->sgd_update_rows(b->impl, nrows, width, drows, w, g_rows, (float)s->lr, err);
    } else {
        const ps_adam_desc d = adam_desc(s, step);
        rc = b->ops->adam_update_rows(b->impl, nrows, width, drows, w, g_rows, st->buf[0], st->buf[1], &d, err);
    }
    if (rc == PS_OK) st->step = step;
    return rc;
}

ps_status ps_optim_step_rows(ps_backend *b, const ps_optim_spec *s, int64_t total_rows, int64_t width,
                             const int64_t *rows, int64_t nrows, float *w, const float *g_rows,
                             ps_optim_state *st, ps_err *err) {
    ps_status rc = ps_optim_check(s, 1, err);
    if (rc) return rc;
    if (total_rows < 0 || width < 0 || nrows < 0 || nrows > total_rows)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "row-sparse update: %lld rows of a (%lld, %lld) "
                          "parameter", (long long)nrows, (long long)total_rows, (long long)width);
    if ((rc = check_rows(total_rows, rows, nrows, err))) return rc;
    if (nrows == 0 || width == 0) return ps_optim_step_rows_checked(b, s, width, rows, nrows, w, g_rows, st, err);
    /* The ops take the indices in device memory. */
    const int64_t *drows = rows;
    int64_t *copy = NULL;
    const size_t bytes = (size_t)nrows * sizeof *rows;
    if (b->ops->device_kind) {
        copy = b->ops->alloc(b->impl, bytes);
        if (!copy)
            return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "row-sparse update: cannot allocate %zu bytes "
                              "on %s", bytes, b->label);
        if ((rc = b->ops->copy_to_device(b->impl, copy, rows, bytes, err))) goto done;
        drows = copy;
    }
    rc = ps_optim_step_rows_checked(b, s, width, drows, nrows, w, g_rows, st, err);
done:
    if (copy) b->ops->free(b->impl, copy);
    return rc;
}
