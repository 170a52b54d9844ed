/* test_ctx_table - request contexts: lifecycle, busy protection, TTL
 * expiry, idempotent-Step memory, limits, and a concurrent stress of
 * Forward/Backward/Step on one model from several threads (run it under
 * `make asan` to check memory safety). */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ctx_table.h"
#include "model.h"
#include "support/model_run.h"

static ps_model *model;

static ps_tape *make_tape(uint64_t seed) {
    float x[784], out[10];
    for (int i = 0; i < 784; i++) x[i] = (float)((i * 31 + (int)seed) % 17) / 17.0f;
    ps_tape *t = NULL;
    ps_err err = {0};
    CHECK(run_forward(model, x, 1, 1, NULL, seed, out, &t, NULL, &err) == PS_OK);
    return t;
}

static ps_ctx_table *table(double ttl, size_t max_live) {
    ps_ctx_table_opts o = {.ttl_s = ttl, .max_live = max_live, .grads_free = free};
    return ps_ctx_table_create(&o);
}

/* What a training Forward does: open (or find) the context, record one
 * forward, release. Returns the open status. */
static ps_status open_fwd(ps_ctx_table *t, uint64_t id, uint32_t seq, ps_err *err) {
    ps_ctx *c = ps_ctx_table_open(t, id, 1, NULL, err);
    if (!c) return err->code;
    ps_tape *tp = make_tape(id + seq);
    ps_status st = ps_ctx_add_fwd(t, c, seq, tp, 0, 1000, err);
    if (st) ps_tape_free(tp);
    ps_ctx_table_release(t, c);
    return st;
}

static void test_lifecycle(void) {
    ps_err err = {0};
    ps_ctx_table *t = table(0.3, 3);
    CHECK(open_fwd(t, 1, 0, &err) == PS_OK);
    CHECK(open_fwd(t, 1, 1, &err) == PS_OK);  /* a second forward of the same context */
    CHECK(open_fwd(t, 2, 0, &err) == PS_OK);
    CHECK(open_fwd(t, 3, 0, &err) == PS_OK);
    CHECK(open_fwd(t, 4, 0, &err) == PS_ERR_RESOURCE_EXHAUSTED);
    CHECK(strstr(err.msg, "too many open contexts") != NULL && err.retry_after_ms == PS_CTX_RETRY_AFTER_MS);

    ps_ctx *c = ps_ctx_table_acquire(t, 1, NULL, NULL, &err);
    CHECK(c != NULL && c->id == 1 && c->nfwd == 2);
    if (!c) return;
    CHECK(ps_ctx_find_fwd(c, 1) && ps_ctx_find_fwd(c, 1)->tape && !ps_ctx_find_fwd(c, 7));
    uint32_t first = 99;
    CHECK(ps_ctx_pending(c, &first) == 2 && first == 0);
    ps_ctx_fwd_done(t, c, ps_ctx_find_fwd(c, 0));
    CHECK(ps_ctx_pending(c, &first) == 1 && first == 1 && ps_ctx_find_fwd(c, 0)->tape == NULL);
    /* A busy context can be acquired or opened by nobody else and never expires.
     * "In use" decides nothing (its Step may still be running or waiting in a
     * sync round): UNAVAILABLE, ask again - never a code the settle rules read
     * as "not applied" (FAILED_PRECONDITION, NOT_FOUND). */
    CHECK(ps_ctx_table_acquire(t, 1, NULL, NULL, &err) == NULL && err.code == PS_ERR_UNAVAILABLE);
    CHECK_MSG(strstr(err.msg, "in use") && strstr(err.msg, "ask again"), "%s", err.msg);
    CHECK(ps_ctx_table_open(t, 1, 1, NULL, &err) == NULL && err.code == PS_ERR_UNAVAILABLE);
    CHECK(ps_ctx_table_acquire(t, 99, NULL, NULL, &err) == NULL && err.code == PS_ERR_NOT_FOUND);

    ps_ctx_stats st;
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 3 && st.opened == 3 && st.expired == 0);
    CHECK(st.bytes == 3000);  /* 4 forwards of 1000 bytes, one backwarded */

    usleep(450 * 1000);  /* past the TTL */
    CHECK(ps_ctx_table_expire(t) == 2);  /* 2 and 3; 1 is busy */
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 1 && st.expired == 2 && st.bytes == 1000);
    CHECK(ps_ctx_table_acquire(t, 2, NULL, NULL, &err) == NULL && err.code == PS_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "expired") != NULL);

    /* Finishing remembers the version for a repeated Step. */
    ps_ctx_table_finish(t, c, 42);
    int finished = 0;
    uint64_t v = 0;
    CHECK(ps_ctx_table_acquire(t, 1, &finished, &v, &err) == NULL);
    CHECK(finished == 1 && v == 42 && err.code == PS_ERR_NOT_FOUND);
    CHECK(open_fwd(t, 1, 5, &err) == PS_ERR_ALREADY_EXISTS);
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 0 && st.bytes == 0 && st.finished_kept == 1);

    /* A context opened by a Forward that failed (no forward recorded) is gone. */
    c = ps_ctx_table_open(t, 8, 1, NULL, &err);
    CHECK(c != NULL);
    if (c) ps_ctx_table_release(t, c);
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 0);

    ps_ctx_table_note_rank(t, 1);
    ps_ctx_table_note_rank(t, 1);
    ps_ctx_table_note_rank(t, 5);
    ps_ctx_table_stats(t, &st);
    CHECK(st.trainers_seen == 2);
    ps_ctx_table_free(t);
}

/* Only the owner that opened a context may backward, step or read it. */
static void test_owner_only(void) {
    ps_err err = {0};
    ps_ctx_table *t = table(60, 16);
    ps_ctx *c = ps_ctx_table_open_as(t, 42, 1, "token:alice", NULL, &err);
    CHECK(c != NULL);
    if (!c) return;
    ps_tape *tp = make_tape(42);
    CHECK(ps_ctx_add_fwd(t, c, 0, tp, 0, 100, &err) == PS_OK);
    ps_ctx_table_release(t, c);
    CHECK(ps_ctx_table_acquire_as(t, 42, "token:mallory", NULL, NULL, &err) == NULL);
    CHECK(err.code == PS_ERR_PERMISSION_DENIED && strstr(err.msg, "belongs to another client"));
    CHECK((c = ps_ctx_table_acquire_as(t, 42, "token:alice", NULL, NULL, &err)) != NULL);
    if (c) ps_ctx_table_release(t, c);
    /* Whole identities: two token names of 63 characters (the most a tokens
     * file takes) sharing their first 57 are two clients. */
    char a[80], b[80];
    snprintf(a, sizeof a, "token:%057dA12345", 0);
    snprintf(b, sizeof b, "token:%057dB12345", 0);
    CHECK(strlen(a) == 6 + 63 && strncmp(a, b, 63) == 0);
    CHECK((c = ps_ctx_table_open_as(t, 43, 1, a, NULL, &err)) != NULL);
    if (c) {
        ps_tape *tp2 = make_tape(43);
        CHECK(ps_ctx_add_fwd(t, c, 0, tp2, 0, 100, &err) == PS_OK);
        ps_ctx_table_release(t, c);
    }
    CHECK(ps_ctx_table_acquire_as(t, 43, b, NULL, NULL, &err) == NULL && err.code == PS_ERR_PERMISSION_DENIED);
    CHECK(ps_ctx_table_open_as(t, 43, 1, b, NULL, &err) == NULL && err.code == PS_ERR_FAILED_PRECONDITION);
    CHECK((c = ps_ctx_table_acquire_as(t, 43, a, NULL, NULL, &err)) != NULL);
    if (c) ps_ctx_table_release(t, c);
    ps_ctx_stats st;
    ps_ctx_table_stats(t, &st);
    CHECK(st.owners == 2);
    ps_ctx_table_free(t);
}

/* ReleaseContext: an owner abandons its unstepped context - freed at
 * once (bytes, count and its share back), or when the call holding it
 * releases it; never another owner's, never a finished one's record. */
static void test_discard(void) {
    ps_err err = {0};
    ps_ctx_table_opts o = {.ttl_s = 60, .max_live = 16, .grads_free = free, .max_bytes = 2500};
    ps_ctx_table *t = ps_ctx_table_create(&o);
    ps_ctx_stats st;
    /* alice holds two contexts of 1000 bytes; a third does not fit the budget */
    for (uint64_t id = 1; id <= 3; id++) {
        ps_ctx *c = ps_ctx_table_open_as(t, id, 1, "alice", NULL, &err);
        CHECK(c != NULL);
        if (!c) return;
        ps_status rs = ps_ctx_table_reserve(t, c, 1000, &err);
        CHECK(rs == (id < 3 ? PS_OK : PS_ERR_RESOURCE_EXHAUSTED));
        if (!rs) {
            ps_tape *tp = make_tape(id);
            CHECK(ps_ctx_add_fwd(t, c, 0, tp, 0, 1000, &err) == PS_OK);
        }
        ps_ctx_table_release(t, c);
    }
    CHECK(ps_ctx_table_discard_as(t, 1, "mallory", &err) == -1 && err.code == PS_ERR_PERMISSION_DENIED);
    CHECK(ps_ctx_table_discard_as(t, 1, "alice", &err) == PS_CTX_DISCARD_FREED);
    ps_ctx_table_stats(t, &st);
    CHECK_MSG(st.live == 1 && st.bytes == 1000 && st.released == 1, "live %llu, bytes %llu, released %llu",
              (unsigned long long)st.live, (unsigned long long)st.bytes, (unsigned long long)st.released);
    CHECK(ps_ctx_table_acquire_as(t, 1, "alice", NULL, NULL, &err) == NULL && err.code == PS_ERR_NOT_FOUND);
    CHECK(ps_ctx_table_discard_as(t, 1, "alice", &err) == PS_CTX_DISCARD_NONE);  /* again: nothing */
    /* the room it held is the client's again at once (not after the TTL) */
    ps_ctx *c = ps_ctx_table_open_as(t, 3, 1, "alice", NULL, &err);
    CHECK(c != NULL && ps_ctx_table_reserve(t, c, 1000, &err) == PS_OK);
    if (c) ps_ctx_table_release(t, c);
    /* busy: freed when the call holding it releases it */
    c = ps_ctx_table_acquire_as(t, 2, "alice", NULL, NULL, &err);
    CHECK(c != NULL);
    if (!c) return;
    CHECK(ps_ctx_table_discard_as(t, 2, "alice", &err) == PS_CTX_DISCARD_PENDING);
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 1 && st.released == 2);
    ps_ctx_table_release(t, c);
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 0 && st.bytes == 0);
    /* a finished context keeps its record: a Step of it still answers its version */
    CHECK(open_fwd(t, 5, 0, &err) == PS_OK);
    CHECK((c = ps_ctx_table_acquire_as(t, 5, NULL, NULL, NULL, &err)) != NULL);
    if (c) ps_ctx_table_finish(t, c, 77);
    CHECK(ps_ctx_table_discard_as(t, 5, "alice", &err) == PS_CTX_DISCARD_NONE);
    int finished = 0;
    uint64_t v = 0;
    CHECK(ps_ctx_table_acquire(t, 5, &finished, &v, &err) == NULL && finished == 1 && v == 77);
    ps_ctx_table_free(t);
}

/* A released context's idle clock restarts: of two contexts opened
 * together, the one used in between survives an expiry that takes the
 * other. Margins are 40 % of a 3 s TTL, not milliseconds. */
static void test_idle_restart(void) {
    ps_err err = {0};
    ps_ctx_table *t = table(3.0, 16);
    CHECK(open_fwd(t, 1, 0, &err) == PS_OK);
    CHECK(open_fwd(t, 2, 0, &err) == PS_OK);
    usleep(1800 * 1000);
    ps_ctx *c = ps_ctx_table_acquire(t, 1, NULL, NULL, &err);
    CHECK(c != NULL);
    if (c) ps_ctx_table_release(t, c);
    usleep(1800 * 1000);
    CHECK(ps_ctx_table_expire(t) == 1);
    CHECK((c = ps_ctx_table_acquire(t, 1, NULL, NULL, &err)) != NULL);
    if (c) ps_ctx_table_release(t, c);
    CHECK(ps_ctx_table_acquire(t, 2, NULL, NULL, &err) == NULL && err.code == PS_ERR_NOT_FOUND);
    ps_ctx_table_free(t);
}

/* Finished contexts are kept by time and by a cap; past either, a Step is
 * answered "too old to settle" - never as unknown (which invites a re-run)
 * and never applied again. */
static void test_settle_window(void) {
    ps_err err = {0};
    ps_ctx_table_opts o = {.ttl_s = 60, .max_live = 4096, .settle_window_s = 0.2, .max_finished = 1000,
                           .grads_free = free};
    ps_ctx_table *t = ps_ctx_table_create(&o);
    /* 1500 steps: the first 500 fall out by count. */
    for (uint64_t id = 1; id <= 1500; id++) {
        ps_ctx *c = ps_ctx_table_open(t, id, 1, NULL, &err);
        c->grads = malloc(8);  /* not empty: release would drop it */
        ps_ctx_table_finish(t, c, id * 10);
    }
    int finished = 0;
    uint64_t v = 0;
    CHECK(ps_ctx_table_acquire(t, 1400, &finished, &v, &err) == NULL && finished == 1 && v == 14000);
    CHECK(ps_ctx_table_acquire(t, 3, &finished, &v, &err) == NULL && finished == 2);
    /* applied once: ALREADY_EXISTS, which the settle rules read as applied */
    CHECK(err.code == PS_ERR_ALREADY_EXISTS && strstr(err.msg, "too old to settle"));
    CHECK(strstr(err.msg, "do not re-run"));
    int old = 0;
    for (uint64_t id = 1; id <= 500; id++) {
        ps_ctx_table_acquire(t, id, &finished, &v, &err);
        old += finished == 2;
    }
    CHECK(old == 500);  /* the filter has no false negatives */
    /* ... and reusing an old id for a new context is refused too. */
    CHECK(ps_ctx_table_open(t, 3, 1, NULL, &err) == NULL && err.code == PS_ERR_ALREADY_EXISTS);
    /* By time: after the window every id is "too old". */
    usleep(300 * 1000);
    ps_ctx_table_expire(t);
    ps_ctx_stats st;
    ps_ctx_table_stats(t, &st);
    CHECK(st.finished_kept == 0);
    CHECK(ps_ctx_table_acquire(t, 1400, &finished, &v, &err) == NULL && finished == 2);
    /* Ids never used stay unknown (NOT_FOUND), up to the filter's rare false positives. */
    int unknown = 0;
    for (uint64_t id = 1000000; id < 1001000; id++) {
        ps_ctx_table_acquire(t, id, &finished, &v, &err);
        unknown += finished == 0 && err.code == PS_ERR_NOT_FOUND;
    }
    CHECK_MSG(unknown >= 980, "%d of 1000 never-used ids taken for old ones", 1000 - unknown);
    ps_ctx_table_free(t);
}

static void grads_free(void *g) { ps_grads_free(g); }

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
        if (open_fwd(a->t, id, 0, &err)) continue;
        ps_ctx *c = ps_ctx_table_acquire(a->t, id, NULL, NULL, &err);
        if (!c) continue;  /* expired by the reaper: allowed */
        uint64_t v;
        ps_ctx_fwd *f = ps_ctx_find_fwd(c, 0);
        ps_grads *g = ps_grads_create(model, &err);
        if (g && ps_model_backward_acc(model, f->tape, grad, NULL, g, &err) == PS_OK &&
            ps_model_step_grads(model, g, &v, &err) == PS_OK) {
            c->grads = g;
            ps_ctx_table_finish(a->t, c, v);
            a->ok++;
        } else {
            ps_grads_free(g);
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
    ps_ctx_table_opts o = {.ttl_s = 0.0005, .max_live = 1024, .grads_free = grads_free};
    ps_ctx_table *t = ps_ctx_table_create(&o);  /* tiny TTL: the reaper races the workers */
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

/* Open context id for owner, reserve `bytes` and record a forward of that
 * size (what a training Forward does under a budget). */
static ps_status owned_fwd(ps_ctx_table *t, const char *owner, uint64_t id, size_t bytes, ps_err *err) {
    ps_ctx *c = ps_ctx_table_open_as(t, id, 1, owner, NULL, err);
    if (!c) return err->code;
    ps_status st = ps_ctx_table_reserve(t, c, bytes, err);
    if (!st) {
        ps_tape *tp = make_tape(id);
        if ((st = ps_ctx_add_fwd(t, c, 0, tp, 0, bytes, err))) ps_tape_free(tp);
    }
    ps_ctx_table_release(t, c);
    return st;
}

/* The byte budget and the count limit are shared fairly by owners: a hog
 * is refused once it holds the budget, a newcomer within its share gets
 * room by evicting the hog's least recently used contexts, the total never
 * passes the budget, and a context cannot be taken over by another owner. */
static void test_fair_shares(void) {
    ps_ctx_table_opts o = {.ttl_s = 60, .max_live = 8, .grads_free = free, .max_bytes = 1000};
    ps_ctx_table *t = ps_ctx_table_create(&o);
    ps_err err = {0};
    ps_ctx_stats st;
    int held = 0;
    for (uint64_t id = 1; id <= 20; id++) {
        ps_err_clear(&err);
        if (owned_fwd(t, "hog", id, 300, &err) == PS_OK) held++;
        ps_ctx_table_stats(t, &st);
        CHECK_MSG(st.bytes <= 1000, "total %llu past the budget", (unsigned long long)st.bytes);
    }
    CHECK_MSG(held == 3, "the hog holds %d contexts of 300 bytes under a 1000-byte budget", held);
    CHECK(err.code == PS_ERR_RESOURCE_EXHAUSTED && strstr(err.msg, "max_context_bytes"));
    ps_ctx_table_stats(t, &st);
    CHECK(st.refused == 17 && st.owners == 1 && st.evicted == 0);
    /* a newcomer: its share is 500, it gets room from the hog's oldest */
    ps_err_clear(&err);
    CHECK_MSG(owned_fwd(t, "good", 100, 300, &err) == PS_OK, "%s", err.msg);
    ps_ctx_table_stats(t, &st);
    CHECK(st.evicted == 1 && st.bytes == 900 && st.owners == 2);
    ps_err_clear(&err);
    CHECK(ps_ctx_table_acquire(t, 1, NULL, NULL, &err) == NULL && err.code == PS_ERR_NOT_FOUND); /* the oldest went */
    /* the hog (600 > its share 500) is refused; the newcomer up to its share */
    ps_err_clear(&err);
    CHECK(owned_fwd(t, "hog", 50, 300, &err) == PS_ERR_RESOURCE_EXHAUSTED && strstr(err.msg, "fair share"));
    CHECK(err.retry_after_ms == PS_CTX_RETRY_AFTER_MS);  /* admission: nothing held, it may come again */
    ps_err_clear(&err);
    /* more than the whole budget can never fit: final, no hint */
    CHECK(owned_fwd(t, "hog", 51, 1001, &err) == PS_ERR_RESOURCE_EXHAUSTED && err.retry_after_ms == 0);
    ps_err_clear(&err);
    CHECK(owned_fwd(t, "good", 101, 150, &err) == PS_OK);
    ps_ctx_table_stats(t, &st);
    CHECK(st.bytes <= 1000);
    /* another owner cannot add to someone's context */
    ps_err_clear(&err);
    CHECK(ps_ctx_table_open_as(t, 100, 1, "hog", NULL, &err) == NULL && err.code == PS_ERR_FAILED_PRECONDITION);
    ps_ctx_table_free(t);

    /* the count limit: 8 contexts, a hog fills it, a newcomer still opens */
    ps_ctx_table_opts oc = {.ttl_s = 60, .max_live = 8, .grads_free = free};
    t = ps_ctx_table_create(&oc);
    for (uint64_t id = 1; id <= 8; id++) CHECK(owned_fwd(t, "hog", id, 10, &err) == PS_OK);
    ps_err_clear(&err);
    CHECK(owned_fwd(t, "hog", 9, 10, &err) == PS_ERR_RESOURCE_EXHAUSTED);
    ps_err_clear(&err);
    CHECK_MSG(owned_fwd(t, "good", 10, 10, &err) == PS_OK, "%s", err.msg);
    ps_ctx_table_stats(t, &st);
    CHECK(st.live == 8 && st.evicted == 1);
    ps_ctx_table_free(t);
}

/* Finished records for checkpoints: what a context's step did survives an
 * export and an import into a new table (a restarted psd); only records the
 * snapshot holds are exported, the newest when capped. */
static ps_ctx *open_with_grads(ps_ctx_table *t, uint64_t id) {
    ps_err err = {0};
    ps_ctx *c = ps_ctx_table_open(t, id, 1, NULL, &err);
    CHECK_MSG(c != NULL, "%s", err.msg);
    if (c) c->grads = malloc(8);
    return c;
}

static void test_export_import(void) {
    ps_ctx_table *t = table(60, 64);
    for (uint64_t id = 1; id <= 10; id++) ps_ctx_table_finish(t, open_with_grads(t, id), id);
    ps_ctx *c = open_with_grads(t, 11);
    c->nonfinite = 1;
    ps_ctx_table_finish(t, c, 10);                                     /* skipped */
    ps_ctx_table_finish_as(t, open_with_grads(t, 12), 10, PS_CTX_DROPPED); /* a sync straggler */
    ps_ctx_stats st;
    ps_ctx_table_stats(t, &st);
    CHECK(st.applied == 10);
    ps_ctx_finished *r = NULL;
    uint64_t applied = 0;
    size_t n = ps_ctx_table_export(t, 10, 1000, &r, &applied);
    CHECK(n == 12 && applied == 10);
    for (size_t i = 0; r && i < 10 && i < n; i++) CHECK(r[i].id == i + 1 && r[i].version == i + 1 && r[i].how == 0);
    if (n == 12) CHECK(r[10].how == PS_CTX_SKIPPED && r[11].how == PS_CTX_DROPPED && r[11].version == 10);
    ps_ctx_table *t2 = table(60, 64);
    ps_ctx_table_import(t2, r, n, applied);
    free(r);
    int finished = 0;
    uint64_t v = 0;
    ps_err err = {0};
    CHECK(ps_ctx_table_acquire(t2, 7, &finished, &v, &err) == NULL && finished == 1 && v == 7);
    CHECK(ps_ctx_table_finished_how(t2, 7) == PS_CTX_APPLIED && ps_ctx_table_finished_skipped(t2, 11));
    CHECK(ps_ctx_table_finished_how(t2, 12) == PS_CTX_DROPPED && ps_ctx_table_finished_how(t2, 99) == -1);
    CHECK(ps_ctx_table_open(t2, 3, 1, NULL, &err) == NULL && err.code == PS_ERR_ALREADY_EXISTS);
    ps_ctx_table_stats(t2, &st);
    CHECK(st.applied == 10 && st.finished_kept == 12);
    /* only what a snapshot of version 5 holds; the newest 3 when capped */
    n = ps_ctx_table_export(t, 5, 1000, &r, &applied);
    CHECK(n == 5 && r && r[4].version == 5);
    free(r);
    n = ps_ctx_table_export(t, 10, 3, &r, &applied);
    CHECK(n == 3 && r && r[0].id == 10 && r[2].id == 12);
    free(r);
    ps_ctx_table_free(t);
    ps_ctx_table_free(t2);
}

/* The apply lock: steps on several threads (update a version counter, then
 * record the context) while a checkpoint thread freezes, reads the version
 * and exports. Every export must hold exactly the steps of its version:
 * one applied record per version 1..V, none beyond. Without the lock a
 * snapshot lands between an update and its record. */
typedef struct stepper_arg {
    ps_ctx_table *t;
    pthread_mutex_t *mu;
    uint64_t *version;
    int base, n;
} stepper_arg;

static void *stepper(void *p) {
    stepper_arg *a = p;
    for (int i = 0; i < a->n; i++) {
        ps_ctx *c = open_with_grads(a->t, (uint64_t)a->base + (uint64_t)i);
        if (!c) continue;
        ps_ctx_table_apply_begin(a->t);
        pthread_mutex_lock(a->mu);
        uint64_t v = ++*a->version;   /* the optimizer update */
        pthread_mutex_unlock(a->mu);
        sched_yield();
        ps_ctx_table_finish(a->t, c, v);  /* its record */
        ps_ctx_table_apply_end(a->t);
    }
    return NULL;
}

static void test_snapshot_consistency(void) {
    ps_ctx_table_opts o = {.ttl_s = 60, .max_live = 4096, .grads_free = free};
    ps_ctx_table *t = ps_ctx_table_create(&o);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    uint64_t version = 0;
    enum { TH = 4, PER = 2000 };
    pthread_t th[TH];
    stepper_arg a[TH];
    for (int i = 0; i < TH; i++) {
        a[i] = (stepper_arg){t, &mu, &version, 1000000 * (i + 1), PER};
        pthread_create(&th[i], NULL, stepper, &a[i]);
    }
    int snaps = 0, bad = 0;
    for (int k = 0; k < 200; k++) {
        ps_ctx_table_freeze(t);
        pthread_mutex_lock(&mu);
        uint64_t v = version;       /* the weights snapshot */
        pthread_mutex_unlock(&mu);
        ps_ctx_finished *r = NULL;
        uint64_t applied = 0;
        size_t n = ps_ctx_table_export(t, v, (size_t)1 << 20, &r, &applied);
        ps_ctx_table_thaw(t);
        snaps++;
        if (n != v || applied != v) bad++;
        free(r);
        usleep(100);
    }
    for (int i = 0; i < TH; i++) pthread_join(th[i], NULL);
    CHECK_MSG(bad == 0, "%d of %d snapshots held records that do not match their version", bad, snaps);
    ps_ctx_stats st;
    ps_ctx_table_stats(t, &st);
    CHECK(st.applied == TH * PER && version == TH * PER);
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
    test_owner_only();
    test_discard();
    test_idle_restart();
    test_settle_window();
    test_concurrent();
    test_fair_shares();
    test_export_import();
    test_snapshot_consistency();
    ps_model_free(model);
    return check_summary("test_ctx_table");
}
