/* dims.c - see dims.h. */
#include "dims.h"

#include <inttypes.h>
#include <stdio.h>

const char *ps_dims_format_as(char *buf, size_t n, const int64_t *dims, int ndim, const char *open,
                               const char *sep, const char *close) {
    if (!n) return buf;
    size_t o = (size_t)snprintf(buf, n, "%s", open);
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, i ? sep : "", dims[i]);
    if (o < n) snprintf(buf + o, n - o, "%s", close);
    return buf;
}

const char *ps_dims_format(char *buf, size_t n, const int64_t *dims, int ndim) {
    return ps_dims_format_as(buf, n, dims, ndim, "(", ", ", ")");
}

const char *ps_dims_format_batch(char *buf, size_t n, const int64_t *dims, int ndim) {
    return ps_dims_format_as(buf, n, dims, ndim, ndim ? "(N, " : "(N", ", ", ")");
}
