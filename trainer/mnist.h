/* mnist.h - the MNIST (or Fashion-MNIST) data set in memory, batching and
 * a seeded shuffle.
 *
 * ps_mnist_load reads one split from a directory holding the standard file
 * names, each either raw or with ".gz" (the raw file wins when both exist):
 *   "train": train-images-idx3-ubyte, train-labels-idx1-ubyte
 *   "test":  t10k-images-idx3-ubyte,  t10k-labels-idx1-ubyte
 * (scripts/fetch-mnist.sh writes them; Debian's dataset-fashion-mnist ships
 * them gzip'ed under /usr/share/datasets/fashion-mnist.) It checks that the
 * images are 3-D (n, rows, cols), the labels 1-D (n) with the same n, and
 * every label < PS_MNIST_CLASSES. Pixels are normalised as in the PyTorch
 * MNIST example: (x / 255 - PS_MNIST_MEAN) / PS_MNIST_STD. Image size is
 * not checked here; the model checks the shape it needs.
 *
 * *out owns images and labels; ps_mnist_free releases them (NULL and a
 * zeroed struct are fine). On failure *out is left zeroed.
 */
#ifndef PS_MNIST_H
#define PS_MNIST_H

#include <stddef.h>
#include <stdint.h>

#include "rng.h"
#include "status.h"

#define PS_MNIST_CLASSES 10
#define PS_MNIST_MEAN 0.1307f
#define PS_MNIST_STD 0.3081f

typedef struct ps_mnist {
    uint32_t n, rows, cols;
    float *images;   /* (n, rows, cols), normalised */
    uint8_t *labels; /* (n), each < PS_MNIST_CLASSES */
} ps_mnist;

/* split is "train" or "test". */
ps_status ps_mnist_load(const char *dir, const char *split, ps_mnist *out, ps_err *err);
void ps_mnist_free(ps_mnist *m);

/* Copy samples idx[0..n-1] into x (n, rows, cols) and y (n); either output
 * may be NULL. An index >= m->n is PS_ERR_INVALID_ARGUMENT (nothing is
 * guaranteed about the outputs then). */
ps_status ps_mnist_batch(const ps_mnist *m, const uint32_t *idx, int n, float *x,
                         int64_t *y, ps_err *err);

/* Fisher-Yates shuffle of a[0..n-1] with a splitmix64 stream seeded with
 * seed: for i = n-1 down to 1, swap a[i] and a[ps_splitmix64_below(i + 1)]. The
 * same (seed, n, input) gives the same permutation everywhere. */
void ps_shuffle_u32(uint32_t *a, size_t n, uint64_t seed);

/* Fill a[0..n-1] with 0..n-1. */
void ps_iota_u32(uint32_t *a, size_t n);

#endif
