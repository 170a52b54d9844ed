/* backend_impl.h - private to common/nn: the op tables of the backends
 * compiled in. Only backend.c refers to them; everything else goes through
 * ps_backend_create(). Each backend_<name>.c defines exactly one table.
 */
#ifndef PS_NN_BACKEND_IMPL_H
#define PS_NN_BACKEND_IMPL_H

#include "backend.h"

extern const ps_backend_ops ps_backend_ref_ops;   /* backend_ref.c */
extern const ps_backend_ops ps_backend_dnnl_ops;  /* backend_dnnl.c */
/* backend_dnnl.c: oneDNN's effective ISA, and the fallback check behind
 * ps_backend_cpu_isa / ps_backend_fallbacks (impl is a dnnl backend's). */
const char *ps_backend_dnnl_isa(void);
int ps_backend_dnnl_fallbacks(void *impl, char *buf, size_t size);
void ps_backend_dnnl_trim(void);
/* backend_cuda.c, compiled and registered only when the build defines
 * PS_HAVE_CUDA (the Makefile does when it finds nvcc). */
extern const ps_backend_ops ps_backend_cuda_ops;
/* "built (runtime X.Y, cuDNN A.B.C)"; no device is touched. */
void ps_backend_cuda_build_info(char *buf, size_t size);

#endif
