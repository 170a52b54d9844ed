/* test_pin_compute - CPU placement of compute calls (server.pin_compute,
 * model.c): while two calls compute at once on one thread each, each
 * call's thread is bound to one of psd's CPUs and the two threads to
 * different ones; a backward moves its thread to the CPU its forward ran
 * on when that CPU is free (the activations are in its caches); a later call on several threads (one call alone) gets
 * every CPU back before its OpenMP team could inherit a one-CPU mask; with
 * pin_compute off no thread is ever bound. Read from outside the model:
 * the threads' own affinity masks after their calls (a binding outlives
 * its call, model.c says why). Needs two CPUs; exits 77 (skipped) with
 * fewer. */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "model.h"
#include "support/model_run.h"

#define BATCH 32

typedef struct {
    ps_model *m;
    volatile int *stop;   /* the background caller runs until *stop */
    int calls;            /* the foreground caller makes this many ... */
    volatile int *alone;  /* ... then, once *alone, one more (pin on) */
    cpu_set_t mask;       /* the thread's affinity after its calls beside the other */
    cpu_set_t mask_alone; /* ... and after its call alone */
    cpu_set_t mask_bwd;   /* background: after the backward of the foreground's last forward */
    ps_tape *tape;        /* foreground: its last forward's tape (a training forward) */
    ps_tape *const *other_tape;  /* background: the foreground's tape, backward after stop */
    int failed;
} caller;

static float g_x[BATCH * 784];

static int one_call(ps_model *m) {
    static __thread float out[BATCH * 10];
    ps_err err = {0};
    return run_forward(m, g_x, BATCH, 0, NULL, 1, out, NULL, NULL, &err) == PS_OK;
}

static void *background(void *arg) {
    caller *c = arg;
    while (!*c->stop)
        if (!one_call(c->m)) c->failed = 1;
    if (!one_call(c->m)) c->failed = 1;   /* one more, still seeing two callers lately */
    sched_getaffinity(0, sizeof c->mask, &c->mask);
    ps_tape *t = c->other_tape ? __atomic_load_n(c->other_tape, __ATOMIC_ACQUIRE) : NULL;
    if (t) {   /* within the window: still a one-thread call */
        static float gout[BATCH * 10];
        for (int i = 0; i < BATCH * 10; i++) gout[i] = (i % 10 == 3 ? -1.0f : 0.1f) / BATCH;
        ps_err err = {0};
        ps_grads *g = run_backward(c->m, t, gout, &err);
        if (!g) c->failed = 1;
        ps_grads_free(g);
        sched_getaffinity(0, sizeof c->mask_bwd, &c->mask_bwd);
    }
    return NULL;
}

static void *foreground(void *arg) {
    caller *c = arg;
    for (int i = 0; i < c->calls; i++)
        if (!one_call(c->m)) c->failed = 1;
    {   /* the last one a training forward, whose backward the other caller runs */
        static float out[BATCH * 10];
        ps_err err = {0};
        ps_tape *t = NULL;
        if (run_forward(c->m, g_x, BATCH, 1, NULL, 7, out, &t, NULL, &err) != PS_OK) c->failed = 1;
        __atomic_store_n(&c->tape, t, __ATOMIC_RELEASE);
    }
    sched_getaffinity(0, sizeof c->mask, &c->mask);
    if (!c->alone) return NULL;
    *c->stop = 1;
    while (!*c->alone) usleep(1000);
    /* alone, after the model's one-second window: a call on both threads */
    usleep(1200 * 1000);
    if (!one_call(c->m)) c->failed = 1;
    sched_getaffinity(0, sizeof c->mask_alone, &c->mask_alone);
    return NULL;
}

static int only_cpu(const cpu_set_t *s) {   /* the CPU of a one-CPU mask, else -1 */
    if (CPU_COUNT(s) != 1) return -1;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, s)) return c;
    return -1;
}

/* Two callers at once; then (pin on) the foreground caller alone after the
 * model's one-second concurrency window. */
static void run_pair(int pin, const cpu_set_t *all) {
    ps_model_opts o = {.arch = "mnist_cnn", .cpu_backend = "dnnl", .seed = 1, .compute_threads = 2,
                       .lr = 0.01f, .pin_compute = pin};
    ps_err err = {0};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (!m) return;
    volatile int stop = 0, alone = 0;
    caller fg = {.m = m, .calls = 20, .stop = &stop, .alone = &alone};
    caller bg = {.m = m, .stop = &stop, .other_tape = &fg.tape};
    pthread_t tb, tf;
    pthread_create(&tb, NULL, background, &bg);
    usleep(50 * 1000);
    pthread_create(&tf, NULL, foreground, &fg);   /* sets stop after its calls */
    pthread_join(tb, NULL);
    alone = 1;
    pthread_join(tf, NULL);
    CHECK(!bg.failed && !fg.failed);
    int cb = only_cpu(&bg.mask), cf = only_cpu(&fg.mask);
    if (pin) {
        CHECK_MSG(cb >= 0, "pin on: the background caller is bound to one CPU (%d CPUs)", CPU_COUNT(&bg.mask));
        CHECK_MSG(cf >= 0, "pin on: the foreground caller is bound to one CPU (%d CPUs)", CPU_COUNT(&fg.mask));
        CHECK_MSG(cb != cf, "pin on: the two callers hold different CPUs (both %d)", cb);
        CHECK(cb < 0 || CPU_ISSET(cb, all));
        CHECK_MSG(fg.tape != NULL, "the foreground's training forward kept its tape");
        CHECK_MSG(only_cpu(&bg.mask_bwd) == cf && cf >= 0,
                  "pin on: the backward of a forward that ran on CPU %d moved its thread there (now %d CPUs, "
                  "CPU %d)", cf, CPU_COUNT(&bg.mask_bwd), only_cpu(&bg.mask_bwd));
        CHECK(cf < 0 || CPU_ISSET(cf, all));
        CHECK_MSG(CPU_EQUAL(&fg.mask_alone, all), "pin on: a call alone gets all %d CPUs back (got %d)",
                  CPU_COUNT(all), CPU_COUNT(&fg.mask_alone));
    } else {
        CHECK_MSG(CPU_EQUAL(&bg.mask, all) && CPU_EQUAL(&fg.mask, all) && CPU_EQUAL(&fg.mask_alone, all),
                  "pin off: no caller is bound (%d and %d CPUs of %d)", CPU_COUNT(&bg.mask), CPU_COUNT(&fg.mask),
                  CPU_COUNT(all));
    }
    ps_tape_free(fg.tape);
    ps_model_free(m);
}

int main(void) {
    cpu_set_t all;
    if (sched_getaffinity(0, sizeof all, &all) != 0 || CPU_COUNT(&all) < 2)
        return check_skip("test_pin_compute", "fewer than two CPUs to place calls on");
    for (int i = 0; i < BATCH * 784; i++) g_x[i] = (float)((i * 37) % 101) / 101.0f;
    run_pair(0, &all);
    run_pair(1, &all);
    return check_summary("test_pin_compute");
}
