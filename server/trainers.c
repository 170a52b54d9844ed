/* trainers.c - per-trainer view for the dashboard (trainers.h). */
#include "trainers.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

#define REPEAT_CACHE 8192   /* recently stepped context ids -> rank (direct-mapped) */
#define OTHER PS_TRAINERS_MAX_RANK

struct ps_trainers {
    pthread_mutex_t mu;
    ps_trainer_row rows[PS_TRAINERS_MAX_RANK + 1];   /* [OTHER] = rank -1 */
    unsigned char seen[PS_TRAINERS_MAX_RANK + 1];
    unsigned char fused[PS_TRAINERS_MAX_RANK + 1];   /* psd computed this rank's loss: Step's scalar not shown */
    struct { uint64_t id; uint32_t rank; } cache[REPEAT_CACHE];
    ps_trainers_delta delta;
};

ps_trainers *ps_trainers_create(void) {
    ps_trainers *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    pthread_mutex_init(&t->mu, NULL);
    for (int i = 0; i <= PS_TRAINERS_MAX_RANK; i++) {
        t->rows[i].rank = i == OTHER ? -1 : i;
        t->rows[i].loss = NAN;
    }
    return t;
}

void ps_trainers_free(ps_trainers *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* The row of rank, marked seen now (caller holds mu). */
static ps_trainer_row *row(ps_trainers *t, uint32_t rank) {
    int i = rank < PS_TRAINERS_MAX_RANK ? (int)rank : OTHER;
    ps_trainer_row *r = &t->rows[i];
    double now = ps_wall_s();
    if (!t->seen[i]) {
        t->seen[i] = 1;
        r->first_seen = now;
    }
    r->last_seen = now;
    return r;
}

static size_t slot(uint64_t id) { return (size_t)((id * 0x9e3779b97f4a7c15ULL) >> 51) % REPEAT_CACHE; }

void ps_trainers_forward(ps_trainers *t, uint32_t rank, int64_t n, int replayed, double loss, int tokens) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    ps_trainer_row *r = row(t, rank);
    r->forwards++;
    if (replayed) r->replayed++;
    else r->samples += n > 0 ? (uint64_t)n : 0;
    if (isfinite(loss)) {
        r->loss = loss;
        t->fused[rank < PS_TRAINERS_MAX_RANK ? rank : OTHER] = 1;
        if (!replayed) {
            t->delta.fused_loss_sum += loss;
            t->delta.fused_loss_n++;
            if (tokens) t->delta.fused_tokens_n++;
        }
    }
    pthread_mutex_unlock(&t->mu);
}

void ps_trainers_step(ps_trainers *t, uint32_t rank, uint64_t ctx_id, const ps_scalar_set *sc) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    ps_trainer_row *r = row(t, rank);
    r->steps++;
    size_t k = slot(ctx_id);
    t->cache[k].id = ctx_id;
    t->cache[k].rank = rank;
    for (int i = 0; sc && i < sc->n; i++) {
        const ps_scalar *s = &sc->s[i];
        if (!isfinite(s->value)) continue;
        if (!strcmp(s->name, "loss") && !t->fused[rank < PS_TRAINERS_MAX_RANK ? rank : OTHER]) r->loss = s->value;
        int j = 0;
        while (j < t->delta.n && strcmp(t->delta.s[j].name, s->name)) j++;
        if (j == t->delta.n) {
            if (j == PS_RM_MAX_NAMES) continue;
            memcpy(t->delta.s[j].name, s->name, PS_RM_NAME_MAX);
            t->delta.s[j].sum = 0;
            t->delta.s[j].count = 0;
            t->delta.n++;
        }
        t->delta.s[j].sum += s->value;
        t->delta.s[j].count++;
    }
    pthread_mutex_unlock(&t->mu);
}

void ps_trainers_step_repeated(ps_trainers *t, uint64_t ctx_id) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    size_t k = slot(ctx_id);
    uint32_t rank = t->cache[k].id == ctx_id && ctx_id ? t->cache[k].rank : (uint32_t)OTHER;
    row(t, rank)->repeated_steps++;
    pthread_mutex_unlock(&t->mu);
}

void ps_trainers_partial(ps_trainers *t, uint32_t rank, int applied) {
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    ps_trainer_row *r = row(t, rank);
    if (applied) r->partial_applied++;
    else r->partial_lost++;
    pthread_mutex_unlock(&t->mu);
}

int ps_trainers_rows(ps_trainers *t, ps_trainer_row *rows, int cap) {
    int n = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i <= PS_TRAINERS_MAX_RANK; i++) {
        if (!t->seen[i]) continue;
        if (n < cap) rows[n] = t->rows[i];
        n++;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

void ps_trainers_take(ps_trainers *t, ps_trainers_delta *out) {
    pthread_mutex_lock(&t->mu);
    *out = t->delta;
    memset(&t->delta, 0, sizeof t->delta);
    pthread_mutex_unlock(&t->mu);
}
