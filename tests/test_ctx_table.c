/* test_ctx_table - request contexts: lifecycle, busy protection, TTL
 * expiry, idempotent-Step memory, limits, and a concurrent stress of
 * Forward/Backward/Step on one model from several threads (run it under
 * `make asan` to check memory safety). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ctx_table.h"
#include "model.h"

static ps_model *model;

static ps_tape *make_tape(uint64_t seed) {
    float x[784], out[10];
    for (int i = 0; i < 784; i++) x[i] = (float)((i * 31 + (int)seed) % 17) / 17.0f;
    ps_tape *t = NULL;
    ps_err err = {0};
    CHECK(ps_model_forward(model, x, 1, 1, NULL, seed, out, &t, NULL, &err) == PS_OK);
    return t;
}

static void test_lifecycle(void) {
    ps_err err = {0};
    ps_ctx_table *t = ps_ctx_table_create(0.3, 3);
    CHECK(ps_ctx_table_insert(t, 1, 1, make_tape(1), &err) == PS_OK);
    ps_tape *dup = make_tape(2);
    CHECK(ps_ctx_table_insert(t, 1, 1, dup, &err) == PS_ERR_ALREADY_EXISTS);
    ps_tape_free(dup);  /* on error the caller keeps the tape */
    CHECK(ps_ctx_table_insert(t, 2, 2, make_tape(2), &err) == PS_OK);
    CHECK(ps_ctx_table_insert(t, 3, 2, make_tape(3), &err) == PS_OK);
    ps_tape *over = make_tape(4);
    CHECK(ps_ctx_table_insert(t, 4, 2, over, &err) == PS_ERR_RESOURCE_EXHAUSTED);
    CHECK(strstr(err.msg, "too many open contexts") != NULL);
    ps_tape_free(over);

    ps_ctx *c = ps_ctx_table_acquire(t, 1, NULL, NULL, &err);
    CHECK(c != NULL && c->id == 1);
    /* A busy context can be acquired by nobody else and never expires. */
    CHECK(ps_ctx_table_acquire(t, 1, NULL, NULL, &err) == NULL && err.code == PS_ERR_FAILED_PRECONDITION);
    CHECK(ps_ctx_table_acquire(t, 99, NULL, NULL, &err) == NULL && err.code == PS_ERR_NOT_FOUND);

    ps_ctx_stats st;
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 3 && st.opened == 3 && st.expired == 0);

    usleep(450 * 1000);  /* past the TTL */
    CHECK(ps_ctx_table_expire(t) == 2);  /* 2 and 3; 1 is busy */
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 1 && st.expired == 2);
    CHECK(ps_ctx_table_acquire(t, 2, NULL, NULL, &err) == NULL && err.code == PS_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "expired") != NULL);

    /* Finishing remembers the version for a repeated Step. */
    ps_ctx_table_finish(t, c, 42);
    int finished = 0;
    uint64_t v = 0;
    CHECK(ps_ctx_table_acquire(t, 1, &finished, &v, &err) == NULL);
    CHECK(finished == 1 && v == 42 && err.code == PS_ERR_NOT_FOUND);
    ps_tape *again = make_tape(5);
    CHECK(ps_ctx_table_insert(t, 1, 1, again, &err) == PS_ERR_ALREADY_EXISTS);
    ps_tape_free(again);
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 0);

    /* A released context stays and its idle clock restarts. */
    CHECK(ps_ctx_table_insert(t, 7, 1, make_tape(7), &err) == PS_OK);
    usleep(200 * 1000);
    c = ps_ctx_table_acquire(t, 7, NULL, NULL, &err);
    CHECK(c != NULL);
    ps_ctx_table_release(t, c);
    usleep(200 * 1000);
    CHECK(ps_ctx_table_expire(t) == 0);  /* idle 0.2 s < 0.3 s */

    ps_ctx_table_note_rank(t, 1);
    ps_ctx_table_note_rank(t, 1);
    ps_ctx_table_note_rank(t, 5);
    ps_ctx_table_stats(t, &st);
    CHECK(st.trainers_seen == 2);
    ps_ctx_table_free(t);  /* frees the live context's tape */
}

typedef struct worker_arg {
    ps_ctx_table *t;
    int id;
    int ok;
} worker_arg;

/* One trainer: forward, backward, step, like the service does. */
static void *worker(void *p) {
    worker_arg *a = p;
    ps_err err = {0};
    float grad[10] = {0};
    grad[a->id % 10] = -1.0f;
    for (int i = 0; i < 30; i++) {
        uint64_t id = ((uint64_t)a->id << 32) | (uint64_t)(i + 1);
        if (ps_ctx_table_insert(a->t, id, (uint32_t)a->id, make_tape(id), &err)) continue;
        ps_ctx *c = ps_ctx_table_acquire(a->t, id, NULL, NULL, &err);
        if (!c) continue;  /* expired by the reaper: allowed */
        uint64_t v;
        if (ps_model_backward(model, c->tape, grad, &err) == PS_OK && ps_model_step(model, c->tape, &v, &err) == PS_OK) {
            ps_ctx_table_finish(a->t, c, v);
            a->ok++;
        } else {
            ps_ctx_table_release(a->t, c);
        }
    }
    return NULL;
}

static void *reaper(void *p) {
    ps_ctx_table *t = p;
    for (int i = 0; i < 200; i++) {
        ps_ctx_table_expire(t);
        usleep(1000);
    }
    return NULL;
}

static void test_concurrent(void) {
    ps_ctx_table *t = ps_ctx_table_create(0.0005, 1024);  /* tiny TTL: the reaper races the workers */
    uint64_t v0 = ps_model_version(model);
    pthread_t th[4], r;
    worker_arg args[4];
    pthread_create(&r, NULL, reaper, t);
    for (int i = 0; i < 4; i++) {
        args[i] = (worker_arg){t, i + 1, 0};
        pthread_create(&th[i], NULL, worker, &args[i]);
    }
    int ok = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ok += args[i].ok;
    }
    pthread_join(r, NULL);
    CHECK(ok > 0);
    CHECK(ps_model_version(model) == v0 + (uint64_t)ok);  /* every finished step applied exactly once */
    ps_ctx_table_free(t);
}

int main(void) {
    ps_model_opts o = {.arch = "mnist_cnn", .cpu_backend = "dnnl", .seed = 3, .compute_threads = 1, .lr = 0.01f,
                       .momentum = 0.9f};
    ps_err err = {0};
    model = ps_model_create(&o, &err);
    CHECK_MSG(model != NULL, "%s", err.msg);
    if (!model) return check_summary("test_ctx_table");
    test_lifecycle();
    test_concurrent();
    ps_model_free(model);
    return check_summary("test_ctx_table");
}
