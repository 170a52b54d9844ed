/* dims.h - tensor shapes in words, for messages: the one formatter every
 * "shape (2, 3) does not match ..." goes through. */
#ifndef PS_DIMS_H
#define PS_DIMS_H

#include <stddef.h>
#include <stdint.h>

/* dims as "(2, 3)" ("()" for ndim 0) into buf (n bytes, cut to fit);
 * returns buf. */
const char *ps_dims_format(char *buf, size_t n, const int64_t *dims, int ndim);
/* per-sample dims behind any leading (batch) dims: "(N, 1, 28, 28)". */
const char *ps_dims_format_batch(char *buf, size_t n, const int64_t *dims, int ndim);
/* The same with the brackets and separator given: ("[", ", ", "]") makes
 * "[2, 3]", ("", "x", "") makes "2x3". */
const char *ps_dims_format_as(char *buf, size_t n, const int64_t *dims, int ndim, const char *open,
                               const char *sep, const char *close);

#endif
