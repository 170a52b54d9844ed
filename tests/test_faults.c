/* test_faults - a trainer killed with SIGKILL in the middle of its steps.
 *
 * Starts the real psd (build/bin/psd, loopback, server.context_ttl_s = 2)
 * and a healthy trainer (a thread here) that keeps running
 * Forward/Backward/Step cycles. Once it has warmed up, psd's RSS is the
 * baseline. Then a helper trainer process (this program re-run with
 * --open-and-die) opens 6 training contexts of batch 128 with Forward and
 * kills itself with SIGKILL before their Backward/Step - a trainer dying
 * mid-step. Checks properties, not timings (CI is a loaded 2-core machine;
 * every wait is a poll with a generous deadline that only guards a hang):
 *  - the dead trainer's contexts are live, and psd's RSS grew by them;
 *  - they expire after the TTL (expired_contexts), live contexts fall to at
 *    most the healthy trainer's one, and psd's RSS comes back to within
 *    half of that growth above the baseline (memory returned);
 *  - the healthy trainer never failed and kept stepping; at the end live
 *    contexts are 0 and the model version equals its steps.
 * Also: every RPC has a deadline - a call to a psd that is stopped
 * (SIGSTOP) ends with DEADLINE_EXCEEDED instead of hanging. */
#include <errno.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "ps_client.h"
#include "support/ports.h"

extern char **environ;

#define MAXMSG (64 << 20)
#define DEAD_CTXS 6
#define DEAD_BATCH 128
/* Deadline of every wait: far beyond what an idle machine needs; it only
 * turns a hang into a failure. */
#define POLL_S 60

static void fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(((i + seed) * 7919) % 255) / 255.0f - 0.4f;
}

/* The dying trainer: open contexts, then SIGKILL itself (never returns). */
static int open_and_die(const char *addr) {
    grpc_init();
    ps_err err = {0};
    ps_client *c = ps_client_create(addr, 30000, MAXMSG, &err);
    float *x = malloc((size_t)DEAD_BATCH * 784 * sizeof(float));
    float *out = malloc((size_t)DEAD_BATCH * 10 * sizeof(float));
    if (!c || !x || !out) return 3;
    fill(x, (size_t)DEAD_BATCH * 784, 1);
    int64_t cols;
    for (int i = 0; i < DEAD_CTXS; i++)
        if (ps_client_forward(c, 0xdead000000000000ULL + (uint64_t)i, 9, 1, x, DEAD_BATCH, 1, 28, 28, out,
                              (int64_t)DEAD_BATCH * 10, &cols, NULL, &err)) {
            fprintf(stderr, "open-and-die: %s\n", err.msg);
            return 4;
        }
    raise(SIGKILL);
    return 5;
}

static long rss_kb(pid_t pid) {
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "r");
    long kb = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
    fclose(f);
    return kb;
}

/* 'R', 'S', 'T' (stopped), ... from /proc/<pid>/stat. */
static char proc_state(pid_t pid) {
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "r");
    if (!f) return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *r = strrchr(buf, ')');
    return r && r[1] == ' ' ? r[2] : '?';
}

typedef struct healthy {
    const char *addr;
    volatile int stop;  /* set by main */
    int steps, failures;  /* written by the thread, read atomically by main */
    char last_err[PS_ERR_MSG_MAX];
} healthy;

static void *healthy_main(void *arg) {
    healthy *h = arg;
    ps_err err = {0};
    ps_client *c = ps_client_create(h->addr, 30000, MAXMSG, &err);
    float x[8 * 784], out[80], g[80] = {0};
    fill(x, sizeof x / sizeof x[0], 2);
    for (int i = 0; i < 8; i++) g[i * 10 + i % 10] = -1.0f / 8;
    uint64_t ctx = 0xbeef000000000000ULL;
    int64_t cols;
    while (c && !__atomic_load_n(&h->stop, __ATOMIC_RELAXED)) {
        ++ctx;
        if (ps_client_forward(c, ctx, 1, 1, x, 8, 1, 28, 28, out, 80, &cols, NULL, &err) ||
            ps_client_backward(c, ctx, g, 8, 10, 0, NULL, &err) || ps_client_step(c, ctx, NULL, &err)) {
            __atomic_add_fetch(&h->failures, 1, __ATOMIC_RELAXED);
            snprintf(h->last_err, sizeof h->last_err, "%s", err.msg);
        } else {
            __atomic_add_fetch(&h->steps, 1, __ATOMIC_RELAXED);
        }
    }
    ps_client_free(c);
    return NULL;
}

static int status(ps_client *c, ps_StatusResponse *st) {
    ps_err err = {0};
    if (ps_client_status(c, st, &err)) {
        fprintf(stderr, "Status: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--open-and-die")) return open_and_die(argv[2]);
    const char *build = getenv("BUILD") ? getenv("BUILD") : "build";
    char psd_bin[256];
    snprintf(psd_bin, sizeof psd_bin, "%s/bin/psd", build);
    if (access(psd_bin, X_OK) != 0) return check_skip("test_faults", "build/bin/psd not built");

    srand((unsigned)getpid());
    int port = test_free_port();   /* reserved: no other test's psd takes it between here and psd's bind */
    if (port < 0) return 1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    char *psd_argv[] = {psd_bin, "--listen", addr, "--set", "server.context_ttl_s=2", "--log-level", "warn", NULL};
    pid_t psd;
    if (posix_spawn(&psd, psd_bin, NULL, NULL, psd_argv, environ) != 0) { perror("spawn psd"); return 1; }

    grpc_init();
    ps_err err = {0};
    ps_client *c = ps_client_create(addr, 5000, MAXMSG, &err);
    ps_StatusResponse st;
    double t0 = ps_mono_s();
    int up = 0;
    while (!up && ps_mono_s() - t0 < 120) {
        up = ps_client_status(c, &st, &err) == PS_OK;
        if (!up) usleep(100000);
    }
    CHECK_MSG(up, "psd did not come up on %s: %s", addr, err.msg);
    if (!up) { kill(psd, SIGKILL); waitpid(psd, NULL, 0); return check_summary("test_faults"); }
    healthy h = {.addr = addr};
    pthread_t th;
    pthread_create(&th, NULL, healthy_main, &h);
    /* Baseline: psd with the healthy trainer running (its buffers and
     * allocator arenas are part of it). */
    t0 = ps_mono_s();
    while (__atomic_load_n(&h.steps, __ATOMIC_RELAXED) < 10 && __atomic_load_n(&h.failures, __ATOMIC_RELAXED) == 0 && ps_mono_s() - t0 < POLL_S)
        usleep(50000);
    CHECK_MSG(h.steps >= 10, "healthy trainer: %d steps after %.0f s (%d failures: %s)", h.steps, ps_mono_s() - t0,
              h.failures, h.last_err);
    long rss0 = rss_kb(psd);
    CHECK(status(c, &st) == 0);
    uint64_t expired_before = st.expired_contexts;

    /* The trainer that dies mid-step. */
    char *child_argv[] = {"/proc/self/exe", "--open-and-die", addr, NULL};
    pid_t child;
    CHECK(posix_spawn(&child, "/proc/self/exe", NULL, NULL, child_argv, environ) == 0);
    int ws = 0;
    waitpid(child, &ws, 0);
    CHECK_MSG(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "helper ended with status %d", ws);
    CHECK(status(c, &st) == 0);
    long rss1 = rss_kb(psd), grew = rss1 - rss0;
    /* Its contexts are live, or already expired on a slow machine (TTL 2 s). */
    CHECK_MSG(st.live_contexts + (st.expired_contexts - expired_before) >= DEAD_CTXS, "live %llu, expired %llu",
              (unsigned long long)st.live_contexts, (unsigned long long)(st.expired_contexts - expired_before));
    uint64_t expired0 = expired_before;
    printf("after SIGKILL of the trainer: %llu live contexts, psd RSS %ld -> %ld MiB\n",
           (unsigned long long)st.live_contexts, rss0 >> 10, rss1 >> 10);
    /* Six batch-128 tapes are hundreds of MiB; without a clear growth the
     * "memory returned" check below would prove nothing. */
    CHECK_MSG(grew > 50 * 1024, "the dead trainer's contexts should hold > 50 MiB (RSS %ld -> %ld kB)", rss0, rss1);

    /* They expire after the TTL (2 s; psd checks once a second). */
    t0 = ps_mono_s();
    while (ps_mono_s() - t0 < POLL_S && status(c, &st) == 0 && st.expired_contexts < expired0 + DEAD_CTXS)
        usleep(200000);
    double took = ps_mono_s() - t0;
    CHECK_MSG(st.expired_contexts >= expired0 + DEAD_CTXS, "expired %llu of %llu + %d after %.0f s",
              (unsigned long long)st.expired_contexts, (unsigned long long)expired0, DEAD_CTXS, took);
    /* Only the healthy trainer's context (one at a time) may be left. */
    CHECK_MSG(st.live_contexts <= 1, "live %llu after the expiry", (unsigned long long)st.live_contexts);

    /* Memory returns: RSS back to within half the growth of the baseline. */
    long limit = rss0 + grew / 2, rss2 = rss_kb(psd);
    double t1 = ps_mono_s();
    while (rss2 > limit && ps_mono_s() - t1 < POLL_S) {
        usleep(200000);
        rss2 = rss_kb(psd);
    }
    printf("after expiry (%.1f s): %llu expired, psd RSS %ld MiB (baseline %ld, peak %ld)\n", took,
           (unsigned long long)st.expired_contexts, rss2 >> 10, rss0 >> 10, rss1 >> 10);
    CHECK_MSG(rss2 <= limit, "memory not returned: RSS %ld -> %ld -> %ld kB (limit %ld)", rss0, rss1, rss2, limit);

    /* The healthy trainer was never disturbed and keeps stepping. */
    int steps_then = __atomic_load_n(&h.steps, __ATOMIC_RELAXED);
    t0 = ps_mono_s();
    while (__atomic_load_n(&h.steps, __ATOMIC_RELAXED) < steps_then + 3 && ps_mono_s() - t0 < POLL_S) usleep(50000);
    __atomic_store_n(&h.stop, 1, __ATOMIC_RELAXED);
    pthread_join(th, NULL);
    CHECK_MSG(h.failures == 0, "healthy trainer: %d failures, last: %s", h.failures, h.last_err);
    CHECK_MSG(h.steps >= steps_then + 3, "healthy trainer stalled at %d steps", h.steps);
    CHECK(status(c, &st) == 0);
    CHECK_MSG(st.live_contexts == 0, "live %llu", (unsigned long long)st.live_contexts);
    CHECK(st.model_version == (uint64_t)h.steps);
    printf("healthy trainer: %d steps, 0 failures; live contexts now %llu\n", h.steps,
           (unsigned long long)st.live_contexts);

    /* Every call has a deadline: a frozen psd gives DEADLINE_EXCEEDED, not a hang. */
    ps_client *quick = ps_client_create(addr, 1000, MAXMSG, &err);
    kill(psd, SIGSTOP);
    for (int i = 0; i < 100 && proc_state(psd) != 'T'; i++) usleep(10000);  /* stopped for sure */
    CHECK(proc_state(psd) == 'T');
    t0 = ps_mono_s();
    ps_status rc = ps_client_status(quick, &st, &err);
    double waited = ps_mono_s() - t0;
    kill(psd, SIGCONT);
    CHECK_MSG(rc == PS_ERR_DEADLINE_EXCEEDED, "rc %s after %.2f s: %s", ps_status_name(rc), waited, err.msg);
    /* Only a hang guard: how late a 1 s deadline fires depends on the load. */
    CHECK_MSG(waited < POLL_S, "call to a frozen psd took %.1f s with a 1 s deadline", waited);
    CHECK(ps_client_status(quick, &st, &err) == PS_OK);  /* and it serves again */
    ps_client_free(quick);

    ps_client_free(c);
    grpc_shutdown();
    kill(psd, SIGTERM);
    waitpid(psd, &ws, 0);
    CHECK_MSG(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "psd exit status %d", ws);
    return check_summary("test_faults");
}
