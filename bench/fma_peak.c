/* fma_peak - the CPU's measured FP32 FMA peak, for the FLOP-rate targets of
 * `make bench-lm` (bench/lm.sh).
 *
 * Picks the vector width of the ISA oneDNN uses here (ps_backend_cpu_isa():
 * avx512_* -> 512-bit FMA, avx2* -> 256-bit FMA, otherwise 128-bit SSE
 * multiply + add) and runs independent chains of fused multiply-adds - more
 * chains than FMA latency x FMA ports, so the loop is bound by FMA
 * throughput, not latency - from one thread, then from THREADS threads at
 * once. Each run repeats REPS times; the best is kept (other jobs on the
 * machine only ever slow a run down). The single core's rate is FLOPs over
 * the thread's CPU time, so time slices other jobs took do not count;
 * THREADS together are timed by the wall clock. Prints:
 *
 *   fma_peak: isa avx512_core_bf16 (512-bit FMA) per core 123.4 GFLOP/s,
 *             2 threads together 246.1 GFLOP/s, peak (per core x 2 CPUs) 246.8 GFLOP/s
 *
 * One FMA on a W-lane vector counts 2 W FLOPs. The peak used for the
 * targets is the best single core times the CPUs (nproc): the machine's
 * all-core rate is printed beside it, and is lower when other jobs run.
 *
 * usage: fma_peak [--threads N] [--reps R]
 *        fma_peak --isa      only the name of the ISA oneDNN uses (as above)
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h" /* ps_backend_cpu_isa: the ISA oneDNN uses */
#include "cli.h"
#include "clock.h"

#define ITERS 20000000L /* inner iterations per run */

/* the calling thread's CPU time: a single core's rate does not count the
 * time other jobs held the core */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static volatile float sink;

/* 16 chains of 512-bit FMAs (32 zmm registers: 16 accumulators + 2 operands) */
__attribute__((target("avx512f"))) static double run512(long iters) {
    __m512 m = _mm512_set1_ps(0.9999999f), a = _mm512_set1_ps(1e-7f);
    __m512 c0 = _mm512_set1_ps(1.0f), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    __m512 c8 = c0, c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0, c15 = c0;
    for (long i = 0; i < iters; i++) {
        c0 = _mm512_fmadd_ps(c0, m, a); c1 = _mm512_fmadd_ps(c1, m, a);
        c2 = _mm512_fmadd_ps(c2, m, a); c3 = _mm512_fmadd_ps(c3, m, a);
        c4 = _mm512_fmadd_ps(c4, m, a); c5 = _mm512_fmadd_ps(c5, m, a);
        c6 = _mm512_fmadd_ps(c6, m, a); c7 = _mm512_fmadd_ps(c7, m, a);
        c8 = _mm512_fmadd_ps(c8, m, a); c9 = _mm512_fmadd_ps(c9, m, a);
        c10 = _mm512_fmadd_ps(c10, m, a); c11 = _mm512_fmadd_ps(c11, m, a);
        c12 = _mm512_fmadd_ps(c12, m, a); c13 = _mm512_fmadd_ps(c13, m, a);
        c14 = _mm512_fmadd_ps(c14, m, a); c15 = _mm512_fmadd_ps(c15, m, a);
        /* keep every chain distinct and in a register (no merging of equal chains) */
        __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7));
        __asm__ volatile("" : "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11), "+v"(c12), "+v"(c13), "+v"(c14), "+v"(c15));
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                                       _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))));
    sink = _mm512_reduce_add_ps(s);
    return 16.0 * 16 * 2 * (double)iters;
}

/* 12 chains of 256-bit FMAs (16 ymm registers) */
__attribute__((target("avx2,fma"))) static double run256(long iters) {
    __m256 m = _mm256_set1_ps(0.9999999f), a = _mm256_set1_ps(1e-7f);
    __m256 c0 = _mm256_set1_ps(1.0f), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    __m256 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    for (long i = 0; i < iters; i++) {
        c0 = _mm256_fmadd_ps(c0, m, a); c1 = _mm256_fmadd_ps(c1, m, a);
        c2 = _mm256_fmadd_ps(c2, m, a); c3 = _mm256_fmadd_ps(c3, m, a);
        c4 = _mm256_fmadd_ps(c4, m, a); c5 = _mm256_fmadd_ps(c5, m, a);
        c6 = _mm256_fmadd_ps(c6, m, a); c7 = _mm256_fmadd_ps(c7, m, a);
        c8 = _mm256_fmadd_ps(c8, m, a); c9 = _mm256_fmadd_ps(c9, m, a);
        c10 = _mm256_fmadd_ps(c10, m, a); c11 = _mm256_fmadd_ps(c11, m, a);
        __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5));
        __asm__ volatile("" : "+x"(c6), "+x"(c7), "+x"(c8), "+x"(c9), "+x"(c10), "+x"(c11));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
    float f[8];
    _mm256_storeu_ps(f, s);
    sink = f[0] + f[7];
    return 12.0 * 8 * 2 * (double)iters;
}

/* 12 chains of 128-bit multiply + add (SSE has no FMA: a pair counts 2 W FLOPs) */
static double run128(long iters) {
    __m128 m = _mm_set1_ps(0.9999999f), a = _mm_set1_ps(1e-7f);
    __m128 c0 = _mm_set1_ps(1.0f), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    __m128 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
    for (long i = 0; i < iters; i++) {
        c0 = _mm_add_ps(_mm_mul_ps(c0, m), a); c1 = _mm_add_ps(_mm_mul_ps(c1, m), a);
        c2 = _mm_add_ps(_mm_mul_ps(c2, m), a); c3 = _mm_add_ps(_mm_mul_ps(c3, m), a);
        c4 = _mm_add_ps(_mm_mul_ps(c4, m), a); c5 = _mm_add_ps(_mm_mul_ps(c5, m), a);
        c6 = _mm_add_ps(_mm_mul_ps(c6, m), a); c7 = _mm_add_ps(_mm_mul_ps(c7, m), a);
        c8 = _mm_add_ps(_mm_mul_ps(c8, m), a); c9 = _mm_add_ps(_mm_mul_ps(c9, m), a);
        c10 = _mm_add_ps(_mm_mul_ps(c10, m), a); c11 = _mm_add_ps(_mm_mul_ps(c11, m), a);
        __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5));
        __asm__ volatile("" : "+x"(c6), "+x"(c7), "+x"(c8), "+x"(c9), "+x"(c10), "+x"(c11));
    }
    __m128 s = _mm_add_ps(_mm_add_ps(_mm_add_ps(c0, c1), _mm_add_ps(c2, c3)),
                          _mm_add_ps(_mm_add_ps(c4, c5), _mm_add_ps(c6, c7)));
    s = _mm_add_ps(s, _mm_add_ps(_mm_add_ps(c8, c9), _mm_add_ps(c10, c11)));
    sink = _mm_cvtss_f32(s);
    return 12.0 * 4 * 2 * (double)iters;
}

static double (*kernel)(long);

typedef struct {
    double flops, secs, cpu_secs;
} job;

static void *thread_main(void *arg) {
    job *j = arg;
    double t0 = ps_mono_s(), c0 = thread_cpu_s();
    j->flops = kernel(ITERS);
    j->secs = ps_mono_s() - t0;
    j->cpu_secs = thread_cpu_s() - c0;
    return NULL;
}

/* GFLOP/s of n threads running the kernel at once: their FLOPs over the slowest */
static double together(int n) {
    pthread_t th[256];
    job jobs[256];
    for (int i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, thread_main, &jobs[i])) {
            fprintf(stderr, "fma_peak: cannot start thread %d\n", i);
            exit(1);
        }
    double flops = 0, secs = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        flops += jobs[i].flops;
        if (jobs[i].secs > secs) secs = jobs[i].secs;
    }
    return flops / secs / 1e9;
}

int main(int argc, char **argv) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    long threads = ncpu > 0 ? ncpu : 1, reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            if (ps_cli_long("fma_peak", "--threads", argv[++i], 1, 256, &threads)) return 2;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            if (ps_cli_long("fma_peak", "--reps", argv[++i], 1, 1000000, &reps)) return 2;
        } else if (!strcmp(argv[i], "--isa")) {
            printf("%s\n", ps_backend_cpu_isa());
            return 0;
        } else {
            fprintf(stderr, "usage: fma_peak [--threads N] [--reps R] | --isa\n");
            return 2;
        }
    }
    const char *isa = ps_backend_cpu_isa();
    const char *width;
    if (!strncmp(isa, "avx512", 6) && __builtin_cpu_supports("avx512f")) kernel = run512, width = "512-bit FMA";
    else if (!strncmp(isa, "avx2", 4) && __builtin_cpu_supports("fma")) kernel = run256, width = "256-bit FMA";
    else kernel = run128, width = "128-bit multiply+add";
    kernel(ITERS / 10); /* warm up: clocks, pages */
    double one = 0, all = 0;
    for (int r = 0; r < reps; r++) { /* one core: FLOPs over the thread's CPU time */
        job j;
        thread_main(&j);
        double g = j.flops / j.cpu_secs / 1e9;
        if (g > one) one = g;
    }
    for (int r = 0; r < reps; r++) {
        double g = together(threads);
        if (g > all) all = g;
    }
    printf("fma_peak: isa %s (%s) per core %.1f GFLOP/s, %ld threads together %.1f GFLOP/s, "
           "peak (per core x %ld CPUs) %.1f GFLOP/s\n",
           isa, width, one, threads, all, ncpu, one * (double)ncpu);
    return 0;
}
