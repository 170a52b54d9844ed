/* dnnl_check.h - the one checking macro for oneDNN calls (STYLE: one per
 * foreign library), shared by the dnnl backend and the trainer's LSTM. In a
 * function returning ps_status with a `ps_err *err` in scope: a failed call
 * returns PS_ERR_INTERNAL naming the call, file and line. */
#ifndef PS_NN_DNNL_CHECK_H
#define PS_NN_DNNL_CHECK_H

#include <oneapi/dnnl/dnnl.h>

#include "status.h"

#define PS_DNNL_CHECK(call) do { \
    dnnl_status_t dnnl_st_ = (call); \
    if (dnnl_st_ != dnnl_success) \
        return ps_err_set(err, PS_ERR_INTERNAL, "%s:%d: %s failed: status %d", \
                          __FILE__, __LINE__, #call, (int)dnnl_st_); \
} while (0)

#endif
