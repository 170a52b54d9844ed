/* fit_data.c - a data set checked against a model, split, and batched for
 * ps-train fit (fit_data.h). */
#include "fit_data.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mnist.h"

/* Shapes equal once size-1 dims are dropped. */
static int squeezed_equal(const int64_t *a, int na, const int64_t *b, int nb) {
    int i = 0, j = 0;
    for (;;) {
        while (i < na && a[i] == 1) i++;
        while (j < nb && b[j] == 1) j++;
        if (i == na || j == nb) return i == na && j == nb;
        if (a[i++] != b[j++]) return 0;
    }
}

static int64_t prod(const int64_t *d, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= d[i];
    return p;
}

int64_t ps_fit_channels(const ps_fit_model *m) { return m->in_ndim == 3 && !m->in_int64 ? m->in_dims[0] : 0; }

ps_status ps_fit_check_samples(const ps_array *x, const char *xname, const ps_array *y, const char *yname,
                               ps_err *err) {
    char s1[160], s2[160];
    if (x->ndim < 1) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s: a scalar; samples go along dim 0", xname);
    if (y->ndim < 1) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "labels %s: a scalar; samples go along dim 0", yname);
    if (x->dims[0] != y->dims[0])
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s hold %lld samples %s, but labels %s hold %lld %s",
                          xname, (long long)x->dims[0], ps_array_shape_str(x->dims, x->ndim, s1, sizeof s1), yname,
                          (long long)y->dims[0], ps_array_shape_str(y->dims, y->ndim, s2, sizeof s2));
    if (x->dims[0] == 0) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s hold no samples", xname);
    if (x->dims[0] > UINT32_MAX)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s: more than 2^32-1 samples", xname);
    const ps_array *a[2] = {x, y};
    const char *kind[2] = {"inputs", "labels"}, *name[2] = {xname, yname};
    for (int i = 0; i < 2; i++)
        if (ps_array_row_numel(a[i]) == 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s %s: each of the %lld samples is %s, no values",
                              kind[i], name[i], (long long)a[i]->dims[0],
                              ps_array_shape_str(a[i]->dims + 1, a[i]->ndim - 1, s1, sizeof s1));
    return PS_OK;
}

ps_status ps_fit_join(const ps_array *parts, const char *const *names, int n, size_t max_bytes, ps_array *out,
                      ps_err *err) {
    char s1[160], s2[160];
    memset(out, 0, sizeof *out);
    if (n < 1 || n > PS_FIT_MAX_INPUTS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%d input arrays; fit joins 1..%d", n, PS_FIT_MAX_INPUTS);
    int all_int = 1;
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        const ps_array *a = &parts[i];
        if (a->ndim < 1)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s: a scalar; samples go along dim 0", names[i]);
        if (a->dims[0] != parts[0].dims[0])
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s hold %lld samples %s, but inputs %s hold "
                              "%lld %s: the arrays of a model's several inputs hold the same samples, row for row",
                              names[i], (long long)a->dims[0], ps_array_shape_str(a->dims, a->ndim, s1, sizeof s1),
                              names[0], (long long)parts[0].dims[0],
                              ps_array_shape_str(parts[0].dims, parts[0].ndim, s2, sizeof s2));
        if (ps_array_row_numel(a) == 0)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s: each sample is %s, no values", names[i],
                              ps_array_shape_str(a->dims + 1, a->ndim - 1, s1, sizeof s1));
        all_int &= ps_array_dtype_is_int(a->dtype);
        total += ps_array_row_numel(a);
    }
    int64_t rows = parts[0].dims[0], dims[2] = {rows, total};
    size_t esize = all_int ? sizeof(int64_t) : sizeof(float), bytes;
    ps_status st = ps_array_check_size(dims, 2, esize, max_bytes, "the joined inputs", &bytes, err);
    if (st) return st;
    out->dtype = all_int ? PS_ARRAY_I64 : PS_ARRAY_F32;
    out->ndim = 2;
    out->dims[0] = rows;
    out->dims[1] = total;
    out->bytes = bytes;
    if (!(out->data = malloc(bytes ? bytes : 1)))
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory joining the inputs (%zu bytes)", bytes);
    int64_t *tmp = NULL, off = 0;
    for (int i = 0; i < n && st == PS_OK; i++) {
        const ps_array *a = &parts[i];
        int64_t k = ps_array_row_numel(a);
        if (!all_int && ps_array_dtype_is_int(a->dtype) && !tmp && !(tmp = malloc((size_t)k * sizeof *tmp)))
            st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory joining the inputs");
        for (int64_t r = 0; r < rows && st == PS_OK; r++) {
            if (all_int) {
                st = ps_array_to_i64(a, r * k, k, (int64_t *)out->data + r * total + off, err);
                if (st) ps_err_prefix(err, "inputs %s", names[i]);
                continue;
            }
            float *o = (float *)out->data + r * total + off;
            if (!ps_array_dtype_is_int(a->dtype)) {
                ps_array_to_f32(a, r * k, k, o);
                continue;
            }
            if ((st = ps_array_to_i64(a, r * k, k, tmp, err))) {
                ps_err_prefix(err, "inputs %s", names[i]);
                break;
            }
            for (int64_t j = 0; j < k; j++) {
                if (tmp[j] >= (1 << 24) || tmp[j] <= -(1 << 24)) {
                    st = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s: sample %lld value %lld (position %lld) "
                                    "is not exact in float32: joined with float inputs, ids travel as float32 "
                                    "integers, below 2^24 = 16777216", names[i], (long long)r, (long long)tmp[j],
                                    (long long)j);
                    break;
                }
                o[j] = (float)tmp[j];
            }
        }
        off += k;
    }
    free(tmp);
    if (st) ps_array_free(out);
    return st;
}

ps_status ps_fit_check(const ps_array *x, const char *xname, const ps_array *y, const char *yname,
                       const ps_fit_model *m, const ps_loss *loss, const ps_fit_norm *norm, ps_fit_layout *lay,
                       ps_err *err) {
    return ps_fit_check_class(x, xname, y, yname, m, loss, NULL, norm, lay, err);
}

ps_status ps_fit_check_class(const ps_array *x, const char *xname, const ps_array *y, const char *yname,
                             const ps_fit_model *m, const ps_loss *loss, const ps_fit_class *cls,
                             const ps_fit_norm *norm, ps_fit_layout *lay, ps_err *err) {
    char s1[160], s2[160];
    const int64_t ignore = cls ? cls->ignore : PS_LOSS_NO_IGNORE;
    const int last = cls && cls->last && loss->class_targets && m->out_ndim > 1;
    memset(lay, 0, sizeof *lay);
    ps_status st0 = ps_fit_check_samples(x, xname, y, yname, err);
    if (st0) return st0;

    /* inputs against the model's first stage */
    const int64_t *xs = x->dims + 1;
    int nxs = x->ndim - 1;
    if (squeezed_equal(xs, nxs, m->in_dims, m->in_ndim)) {
        lay->extra_ndim = 0;
    } else if (m->in_int64 && nxs >= m->in_ndim && !memcmp(xs + nxs - m->in_ndim, m->in_dims,
                                                            sizeof(int64_t) * (size_t)m->in_ndim)) {
        lay->extra_ndim = nxs - m->in_ndim;
        memcpy(lay->extra, xs, sizeof(int64_t) * (size_t)lay->extra_ndim);
    } else {
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s: each sample is %s, but the model's first stage "
                          "'%s' takes %s per sample%s", xname, ps_array_shape_str(xs, nxs, s1, sizeof s1),
                          m->first_stage, ps_array_shape_str(m->in_dims, m->in_ndim, s2, sizeof s2),
                          m->in_int64 ? " (or ids with extra leading dims before it)" : "");
    }
    lay->in_ndim = 1 + lay->extra_ndim + m->in_ndim;
    if (lay->in_ndim > PS_FIT_MAX_DIMS)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s: a batch would have %d dims; psd takes at most %d",
                          xname, lay->in_ndim, PS_FIT_MAX_DIMS);
    memcpy(lay->in_dims + 1, lay->extra, sizeof(int64_t) * (size_t)lay->extra_ndim);
    memcpy(lay->in_dims + 1 + lay->extra_ndim, m->in_dims, sizeof(int64_t) * (size_t)m->in_ndim);
    lay->x_numel = ps_array_row_numel(x);
    if (m->in_int64 && !ps_array_dtype_is_int(x->dtype))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "inputs %s are %s, but the model's first stage '%s' takes int64 "
                          "ids", xname, ps_array_dtype_name(x->dtype), m->first_stage);

    /* the output and the labels */
    lay->rows = lay->loss_rows = prod(lay->extra, lay->extra_ndim);
    int64_t want[2 * PS_FIT_MAX_DIMS];
    int nwant = 0;
    for (int i = 0; i < lay->extra_ndim; i++) want[nwant++] = lay->extra[i];
    if (last) { /* (d..., C): rows of C logits, the labels (d...) */
        lay->classes = m->out_dims[m->out_ndim - 1];
        lay->inner = 1;
        lay->loss_rows *= prod(m->out_dims, m->out_ndim - 1);
        for (int i = 0; i < m->out_ndim - 1; i++) want[nwant++] = m->out_dims[i];
    } else {
        lay->classes = m->out_ndim ? m->out_dims[0] : 1;
        lay->inner = m->out_ndim > 1 ? prod(m->out_dims + 1, m->out_ndim - 1) : 1;
        for (int i = loss->class_targets ? 1 : 0; i < m->out_ndim; i++) want[nwant++] = m->out_dims[i];
    }
    lay->out_numel = lay->rows * prod(m->out_dims, m->out_ndim);
    if (loss->class_targets && m->out_ndim < 1)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "loss %s needs an output with a class dim; the model outputs a "
                          "scalar per sample", loss->name);
    if (loss->forward_t) {   /* targets: the first t of each row's values, the rest (mu, logvar) pairs */
        int64_t per_row = lay->classes * lay->inner, yn = ps_array_row_numel(y);
        lay->t_per_row = yn / (lay->rows ? lay->rows : 1);
        if (yn % (lay->rows ? lay->rows : 1) || !(lay->t_per_row < per_row) || (per_row - lay->t_per_row) % 2)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "labels %s: each sample's label is %s (%lld values), but "
                              "loss %s on the model's output %s per sample needs fewer targets than outputs, the rest "
                              "a mean and a log-variance of one size ([recon, mu, logvar])", yname,
                              ps_array_shape_str(y->dims + 1, y->ndim - 1, s1, sizeof s1), (long long)yn, loss->name,
                              ps_array_shape_str(m->out_dims, m->out_ndim, s2, sizeof s2));
    } else if (!squeezed_equal(y->dims + 1, y->ndim - 1, want, nwant)) {
        char s3[160];
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "labels %s: each sample's label is %s, but loss %s on the "
                          "model's output %s per sample needs %s (%s)", yname,
                          ps_array_shape_str(y->dims + 1, y->ndim - 1, s1, sizeof s1), loss->name,
                          ps_array_shape_str(m->out_dims, m->out_ndim, s2, sizeof s2),
                          ps_array_shape_str(want, nwant, s3, sizeof s3),
                          loss->class_targets ? "one class id per prediction" : "one number per output element");
    }
    lay->y_numel = ps_array_row_numel(y);
    if (loss->class_targets) {
        if (!ps_array_dtype_is_int(y->dtype))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "labels %s are %s, but loss %s needs integer class ids",
                              yname, ps_array_dtype_name(y->dtype), loss->name);
        int64_t buf[4096], total = ps_array_numel(y);
        for (int64_t o = 0; o < total; o += 4096) {
            int64_t n = total - o < 4096 ? total - o : 4096;
            ps_status st = ps_array_to_i64(y, o, n, buf, err);
            if (st) return ps_err_prefix(err, "labels %s", yname);
            for (int64_t k = 0; k < n; k++)
                if ((buf[k] < 0 || buf[k] >= lay->classes) && buf[k] != ignore) {
                    char ig[64] = "";
                    if (ignore != PS_LOSS_NO_IGNORE) snprintf(ig, sizeof ig, " or --ignore-index %lld", (long long)ignore);
                    return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "labels %s: sample %lld has class %lld at "
                                      "position %lld, but the model outputs %lld classes (0..%lld%s)%s", yname,
                                      (long long)((o + k) / lay->y_numel), (long long)buf[k],
                                      (long long)((o + k) % lay->y_numel), (long long)lay->classes,
                                      (long long)lay->classes - 1, ig,
                                      last || m->out_ndim < 2 ? ""
                                                              : " along the output's dim 1 (PyTorch's (N, C, d...); "
                                                                "--class-dim last for a (T, V) output)");
                }
        }
    }

    /* input conversion */
    lay->scale = norm->scale >= 0 ? norm->scale : x->dtype == PS_ARRAY_U8 ? 1.0 / 255.0 : 1.0;
    int64_t ch = ps_fit_channels(m);
    if ((norm->nmean > 1 || norm->nstd > 1) && m->in_int64)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--input-mean/--input-std: the model takes int64 ids");
    if ((norm->nmean > 1 && norm->nmean != ch) || (norm->nstd > 1 && norm->nstd != ch))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--input-mean/--input-std give %d/%d values; the model's "
                          "input %s has %lld channels (give 1 value or one per channel)", norm->nmean, norm->nstd,
                          ps_array_shape_str(m->in_dims, m->in_ndim, s1, sizeof s1), (long long)ch);
    for (int i = 0; i < norm->nstd; i++)
        if (!(norm->std[i] > 0)) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--input-std must be > 0");
    return PS_OK;
}

ps_status ps_fit_inputs(const ps_array *x, const ps_fit_layout *lay, const ps_fit_norm *norm, int in_int64,
                        const uint32_t *idx, int n, float *xf, int64_t *xi, ps_err *err) {
    const int64_t k = lay->x_numel;
    for (int i = 0; i < n; i++) {
        if ((int64_t)idx[i] >= x->dims[0])
            return ps_err_set(err, PS_ERR_INTERNAL, "sample %u of %lld", idx[i], (long long)x->dims[0]);
        if (in_int64) {
            ps_status st = ps_array_to_i64(x, (int64_t)idx[i] * k, k, xi + (int64_t)i * k, err);
            if (st) return st;
            continue;
        }
        float *o = xf + (int64_t)i * k;
        ps_array_to_f32(x, (int64_t)idx[i] * k, k, o);
        int nch = norm->nmean > 1 ? norm->nmean : norm->nstd > 1 ? norm->nstd : 1;
        int64_t plane = k / nch;
        for (int c = 0; c < nch; c++) {
            double mean = norm->nmean ? norm->mean[norm->nmean > 1 ? c : 0] : 0.0;
            double sd = norm->nstd ? norm->std[norm->nstd > 1 ? c : 0] : 1.0;
            float a = (float)(lay->scale / sd), b = (float)(-mean / sd);
            if (a == 1.0f && b == 0.0f) continue;
            for (int64_t j = c * plane; j < (c + 1) * plane; j++) o[j] = o[j] * a + b;
        }
    }
    return PS_OK;
}

ps_status ps_fit_targets(const ps_array *y, const ps_fit_layout *lay, const ps_loss *loss, const uint32_t *idx,
                         int n, void *t, ps_err *err) {
    const int64_t k = lay->y_numel;
    for (int i = 0; i < n; i++) {
        if ((int64_t)idx[i] >= y->dims[0])
            return ps_err_set(err, PS_ERR_INTERNAL, "label %u of %lld", idx[i], (long long)y->dims[0]);
        if (loss->class_targets) {
            ps_status st = ps_array_to_i64(y, (int64_t)idx[i] * k, k, (int64_t *)t + (int64_t)i * k, err);
            if (st) return st;
        } else {
            ps_array_to_f32(y, (int64_t)idx[i] * k, k, (float *)t + (int64_t)i * k);
        }
    }
    return PS_OK;
}

ps_status ps_fit_split(uint32_t n, double val_fraction, uint64_t seed, int rank, int share_of, uint32_t **train,
                       uint32_t *ntrain, uint32_t **val, uint32_t *nval, ps_err *err) {
    *train = *val = NULL;
    *ntrain = *nval = 0;
    if (!(val_fraction >= 0 && val_fraction < 1))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--val-fraction %g: must be in [0, 1)", val_fraction);
    uint32_t nv = (uint32_t)llround(val_fraction * n);
    if (val_fraction > 0 && nv == 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--val-fraction %g of %u samples holds out none", val_fraction, n);
    if (nv >= n)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "--val-fraction %g of %u samples leaves none to train on",
                          val_fraction, n);
    uint8_t *held = calloc(n, 1);
    uint32_t *perm = malloc((size_t)n * sizeof *perm);
    uint32_t *tr = malloc((size_t)(n - nv) * sizeof *tr), *va = malloc((size_t)(nv ? nv : 1) * sizeof *va);
    if (!held || !perm || !tr || !va) {
        free(held); free(perm); free(tr); free(va);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory for %u sample indices", n);
    }
    ps_iota_u32(perm, n);
    ps_shuffle_u32(perm, n, seed ^ 0x5eed5bd1ULL);
    for (uint32_t i = 0; i < nv; i++) held[perm[i]] = 1;
    uint32_t a = 0, b = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (held[i]) va[b++] = i;
        else tr[a++] = i;
    }
    free(held);
    free(perm);
    if (share_of > 1) {
        uint32_t per = a / (uint32_t)share_of, first = per * (uint32_t)(rank - 1);
        uint32_t cnt = rank == share_of ? a - first : per;
        if (per == 0) {
            free(tr); free(va);
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%u training samples cannot be shared by %d trainers", a,
                              share_of);
        }
        memmove(tr, tr + first, (size_t)cnt * sizeof *tr);
        a = cnt;
    }
    *train = tr;
    *ntrain = a;
    *val = va;
    *nval = b;
    return PS_OK;
}
