/* isa_check.h - does the CPU backend run its fast kernels on this machine?
 *
 * oneDNN picks a kernel per primitive when it is first created; when no
 * JIT kernel fits (an ISA without one for a layout, a shape it does not
 * cover) it silently falls back to its reference C kernels, 10-100x slower.
 * ps_isa_check() builds the model `opts` describes with every stage on the
 * CPU, runs one training step of each stage alone on `batch` synthetic
 * samples of the stage's input dtype (forward with a tape, backward,
 * optimizer step) so that every training primitive gets created, and
 * collects what the stages' backends report (ps_backend_fallbacks).
 * The probe model is freed before it returns; nothing of the caller's is
 * touched. psd runs it at start-up and logs the result; tests/test_isa.c
 * holds every ISA the host can run to zero fallbacks.
 */
#ifndef PS_NN_ISA_CHECK_H
#define PS_NN_ISA_CHECK_H

#include "model.h"
#include "status.h"

typedef struct ps_isa_report {
    const char *isa;        /* ps_backend_cpu_isa(), e.g. "avx2" */
    int nfallback;          /* disallowed reference kernels over all stages */
    char fallbacks[2048];   /* their descriptions, one per line ("" when none) */
} ps_isa_report;

/* PS_OK with *r filled, or the error that stopped the probe step. */
ps_status ps_isa_check(const ps_model_opts *opts, int batch, ps_isa_report *r, ps_err *err);

#endif
