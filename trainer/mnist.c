/* mnist.c - an MNIST split in memory: load, batches and a seeded shuffle
 * (mnist.h). */
#include "mnist.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "idx.h"

/* Find <dir>/<base> or <dir>/<base>.gz; the raw file wins. */
static ps_status find_file(const char *dir, const char *base, char *path, size_t cap,
                           ps_err *err) {
    struct stat sb;
    int n = snprintf(path, cap, "%s/%s", dir, base);
    if (n < 0 || (size_t)n + 3 >= cap)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "mnist: directory name too long: '%s'", dir);
    if (stat(path, &sb) == 0) return PS_OK;
    strcat(path, ".gz");
    if (stat(path, &sb) == 0) return PS_OK;
    return ps_err_set(err, PS_ERR_NOT_FOUND,
                      "mnist: neither %s/%s nor %s/%s.gz exists "
                      "(scripts/fetch-mnist.sh %s writes them)", dir, base, dir, base, dir);
}

ps_status ps_mnist_load(const char *dir, const char *split, ps_mnist *out, ps_err *err) {
    memset(out, 0, sizeof *out);
    const char *img_base, *lbl_base;
    if (split && !strcmp(split, "train")) {
        img_base = "train-images-idx3-ubyte";
        lbl_base = "train-labels-idx1-ubyte";
    } else if (split && !strcmp(split, "test")) {
        img_base = "t10k-images-idx3-ubyte";
        lbl_base = "t10k-labels-idx1-ubyte";
    } else {
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                          "mnist: unknown split '%s' (expected \"train\" or \"test\")",
                          split ? split : "(null)");
    }

    char img_path[PATH_MAX], lbl_path[PATH_MAX];
    ps_status st = find_file(dir, img_base, img_path, sizeof img_path, err);
    if (st != PS_OK) return st;
    st = find_file(dir, lbl_base, lbl_path, sizeof lbl_path, err);
    if (st != PS_OK) return st;

    ps_idx img, lbl;
    memset(&lbl, 0, sizeof lbl);
    st = ps_idx_load(img_path, &img, err);
    if (st != PS_OK) return st;
    st = ps_idx_load(lbl_path, &lbl, err);
    if (st != PS_OK) goto fail;

    if (img.ndim != 3) {
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: images must have 3 dimensions (n, rows, cols), this file has %d",
                        img_path, img.ndim);
        goto fail;
    }
    if (lbl.ndim != 1) {
        st = ps_err_set(err, PS_ERR_FORMAT,
                        "%s: labels must have 1 dimension (n), this file has %d",
                        lbl_path, lbl.ndim);
        goto fail;
    }
    if (img.dims[0] != lbl.dims[0]) {
        st = ps_err_set(err, PS_ERR_FORMAT, "mnist: %s holds %u images but %s holds %u labels",
                        img_path, img.dims[0], lbl_path, lbl.dims[0]);
        goto fail;
    }
    for (size_t i = 0; i < lbl.size; i++) {
        if (lbl.data[i] >= PS_MNIST_CLASSES) {
            st = ps_err_set(err, PS_ERR_FORMAT, "%s: label %zu is %u; expected 0..%d",
                            lbl_path, i, lbl.data[i], PS_MNIST_CLASSES - 1);
            goto fail;
        }
    }

    float *images = malloc(img.size * sizeof *images);
    if (!images) {
        st = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED,
                        "mnist: out of memory for %zu normalised pixels", img.size);
        goto fail;
    }
    float lut[256];
    for (int v = 0; v < 256; v++)
        lut[v] = ((float)v / 255.0f - PS_MNIST_MEAN) / PS_MNIST_STD;
    for (size_t i = 0; i < img.size; i++) images[i] = lut[img.data[i]];

    out->n = img.dims[0];
    out->rows = img.dims[1];
    out->cols = img.dims[2];
    out->images = images;
    out->labels = lbl.data; /* exactly n bytes, already validated */
    lbl.data = NULL;
    ps_idx_free(&img);
    return PS_OK;

fail:
    ps_idx_free(&img);
    ps_idx_free(&lbl);
    return st;
}

void ps_mnist_free(ps_mnist *m) {
    if (!m) return;
    free(m->images);
    free(m->labels);
    memset(m, 0, sizeof *m);
}

ps_status ps_mnist_batch(const ps_mnist *m, const uint32_t *idx, int n, float *x,
                         int64_t *y, ps_err *err) {
    if (n < 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "mnist batch: negative size %d", n);
    size_t pix = (size_t)m->rows * m->cols;
    for (int i = 0; i < n; i++) {
        if (idx[i] >= m->n)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT,
                              "mnist batch: index %u at position %d is out of range (n = %u)",
                              idx[i], i, m->n);
        if (x) memcpy(x + (size_t)i * pix, m->images + (size_t)idx[i] * pix, pix * sizeof *x);
        if (y) y[i] = m->labels[idx[i]];
    }
    return PS_OK;
}

void ps_shuffle_u32(uint32_t *a, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)ps_splitmix64_below(&s, i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

void ps_iota_u32(uint32_t *a, size_t n) {
    for (size_t i = 0; i < n; i++) a[i] = (uint32_t)i;
}
