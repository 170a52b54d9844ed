/* test_malloc_tune.c - psd's glibc malloc thresholds (server/malloc_tune.c).
 * The property psd relies on: once tuned, working memory that is freed and
 * allocated again costs no page faults (it stayed mapped), where glibc's
 * defaults can hand it back to the kernel and fault it in again. A child process checks that a
 * GLIBC_TUNABLES naming a malloc tunable leaves the settings alone (and
 * prints what the defaults cost); the parent tunes and counts the faults
 * of the same free-and-reallocate cycle with getrusage's minor faults. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "malloc_tune.h"

#define NBLK 16
#define BLK ((size_t)512 << 10)   /* 16 x 512 KiB = 8 MiB of working memory */

static long minflt(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

static int fill(char **b, int v) {
    for (int i = 0; i < NBLK; i++) {
        if (!(b[i] = malloc(BLK))) return -1;
        memset(b[i], v, BLK);
    }
    return 0;
}

static void drop(char **b) {
    for (int i = NBLK - 1; i >= 0; i--) free(b[i]);
}

/* Page faults of a batch's working memory (NBLK blocks written, then freed)
 * the second time round, after glibc has seen a 1 MiB block come and go
 * (with its defaults that sets the mmap threshold to 1 MiB and the trim
 * threshold to 2 MiB, so the 8 MiB freed at the top of the heap go back to
 * the kernel). */
static long refault_cost(void) {
    char *big = malloc((size_t)1 << 20), *b[NBLK];
    if (!big) return -1;
    memset(big, 0, (size_t)1 << 20);
    free(big);
    if (fill(b, 1)) return -1;
    drop(b);
    long f0 = minflt();
    if (fill(b, 2)) return -1;
    long f1 = minflt();
    drop(b);
    return f1 - f0;
}

int main(void) {
#if defined(__SANITIZE_ADDRESS__)
    return check_skip("test_malloc_tune", "AddressSanitizer's allocator replaces glibc's malloc (make asan)");
#elif !defined(__GLIBC__)
    return check_skip("test_malloc_tune", "not glibc");
#else
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=4", 1);
        int tuned = ps_malloc_tune();
        long f = refault_cost();
        printf("GLIBC_TUNABLES set: ps_malloc_tune() = %d; glibc's defaults: %ld page faults re-using %zu KiB\n",
               tuned, f, NBLK * BLK >> 10);
        fflush(stdout);
        _exit(tuned == 0 ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "with GLIBC_TUNABLES naming a malloc tunable ps_malloc_tune must change nothing");
    unsetenv("GLIBC_TUNABLES");
    CHECK(ps_malloc_tune() == 1);
    long f = refault_cost();
    printf("tuned: %ld page faults re-using %zu KiB (%zu pages)\n", f, NBLK * BLK >> 10, NBLK * BLK / 4096);
    CHECK_MSG(f >= 0 && f < (long)(NBLK * BLK / 4096 / 16), "freed working memory of %zu KiB came back with %ld "
              "page faults", NBLK * BLK >> 10, f);
    return check_summary("test_malloc_tune");
#endif
}
