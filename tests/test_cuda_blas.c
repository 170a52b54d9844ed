/* test_cuda_blas.c - cuBLAS is opened by the CUDA backend when it needs it,
 * not linked into every program (backend_cuda.c: libcublasLt's start-up
 * costs ~0.5 s of CPU per process, GPU or not). No GPU needed: the library
 * is not in this program's memory at start, it opens from the run path the
 * programs are linked with, and its status strings are cuBLAS's own
 * descriptions of the codes (cublas_api.h). Skipped when built without
 * CUDA. */
#include <stdio.h>
#include <string.h>

#include "check.h"

#ifdef PS_HAVE_CUDA
#include <cublas_api.h>

#include "backend_cuda.h"

/* 1 when a file whose name contains `lib` is mapped into this process. */
static int mapped(const char *lib) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, lib)) { found = 1; break; }
    fclose(f);
    return found;
}

int main(void) {
    CHECK_MSG(mapped("libcublas") == 0, "libcublas is loaded at start: linked again (-lcublas)?");
    const char *why = NULL;
    int ok = ps_cuda_blas_load(&why);
    CHECK_MSG(ok, "cuBLAS did not open: %s", why ? why : "?");
    CHECK(ps_cuda_blas_load(NULL) == ok);  /* opened once, the same answer */
    if (ok) {
        CHECK(mapped("libcublas.so") == 1);
        /* cuBLAS's own descriptions ("success", "the library was not initialized") */
        const char *s = ps_cuda_blas_status_string(CUBLAS_STATUS_SUCCESS);
        CHECK_MSG(s && strstr(s, "success"), "status string %s", s ? s : "(null)");
        s = ps_cuda_blas_status_string(CUBLAS_STATUS_NOT_INITIALIZED);
        CHECK_MSG(s && strstr(s, "not initialized"), "status string %s", s ? s : "(null)");
    }
    return check_summary("test_cuda_blas");
}
#else
int main(void) { return check_skip("test_cuda_blas", "built without CUDA (make NVCC=)"); }
#endif
