/* history.c - bounded, self-compacting time series for the dashboard
 * (history.h). Points live in one array of cap x series sums and counts;
 * a merge halves the points in place. */
#include "history.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct series {
    char name[PS_HIST_NAME_MAX];
    ps_hist_kind kind;
} series;

typedef struct cell {
    double sum, count;
} cell;

struct ps_history {
    pthread_mutex_t mu;
    int cap, n;                 /* closed points held */
    double interval;
    uint64_t gen, base;         /* base: sequence number of point 0 */
    int nseries;
    series ser[PS_HIST_MAX_SERIES];
    double *t, *span;           /* (cap) end wall time, seconds covered */
    cell *cells;                /* (cap, PS_HIST_MAX_SERIES) */
    cell open[PS_HIST_MAX_SERIES];
    double open_mono;           /* start of the open point; < 0 before the first tick */
};

ps_history *ps_history_create(int cap, double interval_s) {
    if (cap < 2 || cap % 2 || !(interval_s > 0)) return NULL;
    ps_history *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->cap = cap;
    h->interval = interval_s;
    h->open_mono = -1;
    h->t = calloc((size_t)cap, sizeof *h->t);
    h->span = calloc((size_t)cap, sizeof *h->span);
    h->cells = calloc((size_t)cap * PS_HIST_MAX_SERIES, sizeof *h->cells);
    if (!h->t || !h->span || !h->cells) {
        ps_history_free(h);
        return NULL;
    }
    pthread_mutex_init(&h->mu, NULL);
    return h;
}

void ps_history_free(ps_history *h) {
    if (!h) return;
    if (h->cells) pthread_mutex_destroy(&h->mu);
    free(h->t);
    free(h->span);
    free(h->cells);
    free(h);
}

int ps_history_series(ps_history *h, const char *name, ps_hist_kind kind) {
    if (strlen(name) >= PS_HIST_NAME_MAX) return -1;
    pthread_mutex_lock(&h->mu);
    int i = 0;
    while (i < h->nseries && strcmp(h->ser[i].name, name)) i++;
    if (i == h->nseries) {
        if (i == PS_HIST_MAX_SERIES) {
            i = -1;
        } else {
            strcpy(h->ser[i].name, name);
            h->ser[i].kind = kind;
            h->nseries++;
        }
    }
    pthread_mutex_unlock(&h->mu);
    return i;
}

void ps_history_add(ps_history *h, int s, double sum, double count) {
    if (s < 0 || s >= PS_HIST_MAX_SERIES || !isfinite(sum)) return;
    pthread_mutex_lock(&h->mu);
    cell *c = &h->open[s];
    switch (h->ser[s].kind) {
    case PS_HIST_RATE: c->sum += sum; c->count = 1; break;
    case PS_HIST_MEAN: if (count > 0) { c->sum += sum; c->count += count; } break;
    case PS_HIST_LAST: c->sum = sum; c->count = 1; break;
    }
    pthread_mutex_unlock(&h->mu);
}

/* Merge b into a (a older). */
static void merge_cell(ps_hist_kind k, cell *a, const cell *b) {
    if (k == PS_HIST_LAST) {
        if (b->count > 0) *a = *b;
    } else {
        a->sum += b->sum;
        a->count += b->count;
    }
}

/* Full: pairs become one point; the interval doubles. */
static void compact(ps_history *h) {
    int half = h->n / 2;
    for (int i = 0; i < half; i++) {
        cell *dst = &h->cells[(size_t)i * PS_HIST_MAX_SERIES];
        const cell *a = &h->cells[(size_t)(2 * i) * PS_HIST_MAX_SERIES];
        const cell *b = &h->cells[(size_t)(2 * i + 1) * PS_HIST_MAX_SERIES];
        for (int s = 0; s < h->nseries; s++) {
            cell m = a[s];
            merge_cell(h->ser[s].kind, &m, &b[s]);
            dst[s] = m;
        }
        h->span[i] = h->span[2 * i] + h->span[2 * i + 1];
        h->t[i] = h->t[2 * i + 1];
    }
    if (h->n % 2) {  /* never with an even cap, kept for safety */
        memcpy(&h->cells[(size_t)half * PS_HIST_MAX_SERIES], &h->cells[(size_t)(h->n - 1) * PS_HIST_MAX_SERIES],
               sizeof(cell) * PS_HIST_MAX_SERIES);
        h->span[half] = h->span[h->n - 1];
        h->t[half] = h->t[h->n - 1];
        half++;
    }
    h->base += (uint64_t)(h->n - half);
    h->n = half;
    memset(&h->cells[(size_t)h->n * PS_HIST_MAX_SERIES], 0,
           sizeof(cell) * PS_HIST_MAX_SERIES * (size_t)(h->cap - h->n));
    h->interval *= 2;
    h->gen++;
}

int ps_history_tick(ps_history *h, double mono, double wall) {
    pthread_mutex_lock(&h->mu);
    int closed = 0;
    if (h->open_mono < 0) {
        h->open_mono = mono;
        memset(h->open, 0, sizeof h->open);
    } else if (mono - h->open_mono >= h->interval * 0.999) {  /* a tick's jitter does not skip a point */
        if (h->n == h->cap) compact(h);
        memcpy(&h->cells[(size_t)h->n * PS_HIST_MAX_SERIES], h->open, sizeof h->open);
        h->span[h->n] = mono - h->open_mono;
        h->t[h->n] = wall;
        h->n++;
        memset(h->open, 0, sizeof h->open);
        h->open_mono = mono;
        closed = 1;
    }
    pthread_mutex_unlock(&h->mu);
    return closed;
}

void ps_history_get_info(ps_history *h, ps_history_info *out) {
    pthread_mutex_lock(&h->mu);
    *out = (ps_history_info){h->n, h->interval, h->gen, h->base + (uint64_t)h->n};
    pthread_mutex_unlock(&h->mu);
}

static double value_locked(const ps_history *h, int s, int i) {
    const cell *c = &h->cells[(size_t)i * PS_HIST_MAX_SERIES + (size_t)s];
    switch (h->ser[s].kind) {
    case PS_HIST_RATE: return h->span[i] > 0 ? c->sum / h->span[i] : NAN;
    case PS_HIST_MEAN: return c->count > 0 ? c->sum / c->count : NAN;
    case PS_HIST_LAST: return c->count > 0 ? c->sum : NAN;
    }
    return NAN;
}

double ps_history_value(ps_history *h, int s, int i) {
    pthread_mutex_lock(&h->mu);
    double v = s >= 0 && s < h->nseries && i >= 0 && i < h->n ? value_locked(h, s, i) : NAN;
    pthread_mutex_unlock(&h->mu);
    return v;
}

int ps_history_point(ps_history *h, int i, double *wall, double *span) {
    pthread_mutex_lock(&h->mu);
    int ok = i >= 0 && i < h->n;
    if (ok) *wall = h->t[i], *span = h->span[i];
    pthread_mutex_unlock(&h->mu);
    return ok;
}

void ps_history_json(ps_history *h, ps_textbuf *b, uint64_t since_gen, uint64_t since_next) {
    static const char *const kinds[] = {"rate", "mean", "last"};
    pthread_mutex_lock(&h->mu);
    uint64_t next = h->base + (uint64_t)h->n;
    int full = !(since_gen == h->gen && since_next >= h->base && since_next <= next);
    int from = full ? 0 : (int)(since_next - h->base);
    ps_textbuf_printf(b, "{\"gen\":%llu,\"next\":%llu,\"full\":%s,\"interval_s\":", (unsigned long long)h->gen,
                      (unsigned long long)next, full ? "true" : "false");
    ps_textbuf_json_num(b, h->interval);
    ps_textbuf_printf(b, ",\"t\":[");
    for (int i = from; i < h->n; i++) ps_textbuf_printf(b, "%s%.3f", i > from ? "," : "", h->t[i]);
    ps_textbuf_printf(b, "],\"span\":[");
    for (int i = from; i < h->n; i++) {   /* exact: rate x span gives the count back */
        if (i > from) ps_textbuf_printf(b, ",");
        ps_textbuf_json_num(b, h->span[i]);
    }
    ps_textbuf_printf(b, "],\"series\":[");
    for (int s = 0; s < h->nseries; s++) {
        ps_textbuf_printf(b, "%s{\"name\":", s ? "," : "");
        ps_textbuf_json_str(b, h->ser[s].name);
        ps_textbuf_printf(b, ",\"kind\":\"%s\",\"v\":[", kinds[h->ser[s].kind]);
        for (int i = from; i < h->n; i++) {
            if (i > from) ps_textbuf_printf(b, ",");
            ps_textbuf_json_num(b, value_locked(h, s, i));
        }
        ps_textbuf_printf(b, "]}");
    }
    ps_textbuf_printf(b, "]}");
    pthread_mutex_unlock(&h->mu);
}
