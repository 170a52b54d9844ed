/* history.h - a bounded time series of what psd did, for the dashboard's
 * charts: samples and steps per second, loss, the trainers' round metrics,
 * context memory.
 *
 * Named series (at most PS_HIST_MAX_SERIES, added on first use) of three
 * kinds: RATE (a count per second: samples, steps), MEAN (the mean of the
 * values reported in an interval: loss) and LAST (a gauge: the value at the
 * end of the interval). Values go into the open point; ps_history_tick
 * closes it once it spans the current interval. The history holds at most
 * `cap` closed points: when full, adjacent pairs are merged (sums and
 * counts add, so rates and means stay exact) and the interval doubles. A
 * run of any length thus fits in `cap` points, the newest at the finest
 * resolution that fits, and memory never grows.
 *
 * Readers ask for what they lack: ps_history_json(since) sends only the
 * points closed after `since` while no merge happened in between, else
 * everything (the answer says which).
 *
 * Thread-safe (one mutex): one writer (the dashboard's sampler), any number
 * of readers. Knows neither HTTP nor the service.
 */
#ifndef PS_HISTORY_H
#define PS_HISTORY_H

#include <stdint.h>

#include "textbuf.h"

#define PS_HIST_MAX_SERIES 32
#define PS_HIST_NAME_MAX 48

typedef enum { PS_HIST_RATE = 0, PS_HIST_MEAN, PS_HIST_LAST } ps_hist_kind;

typedef struct ps_history ps_history;

/* cap: closed points kept (even, >= 2); interval_s: the first interval.
 * NULL when out of memory or the arguments are unusable. */
ps_history *ps_history_create(int cap, double interval_s);
void ps_history_free(ps_history *h);   /* NULL ok */

/* Index of the series `name` (kind fixed by its first use); -1 when
 * PS_HIST_MAX_SERIES exist already or the name is too long. */
int ps_history_series(ps_history *h, const char *name, ps_hist_kind kind);

/* Into the open point. RATE: adds sum (count ignored). MEAN: adds sum
 * over count values. LAST: the value is sum (count ignored). A series
 * index < 0 is ignored. */
void ps_history_add(ps_history *h, int series, double sum, double count);

/* Close the open point if it spans the interval: mono is a monotonic
 * clock (its span), wall the time shown (Unix seconds). The first call
 * only starts the first point. Returns 1 when a point was closed. */
int ps_history_tick(ps_history *h, double mono, double wall);

/* What the history holds now. */
typedef struct ps_history_info {
    int points;            /* closed points held */
    double interval_s;     /* the current interval */
    uint64_t gen;          /* merges so far */
    uint64_t next;         /* sequence number of the next point to close */
} ps_history_info;
void ps_history_get_info(ps_history *h, ps_history_info *out);

/* The value of series s at closed point i (0 = oldest): RATE sum / span,
 * MEAN sum / count, LAST the value; NaN where the point has none. */
double ps_history_value(ps_history *h, int s, int i);

/* Closed point i's end (wall time) and the seconds it covers (monotonic);
 * 0 when i is out of range. */
int ps_history_point(ps_history *h, int i, double *wall, double *span);

/* Appends a JSON object:
 *   {"gen":G,"next":N,"full":true|false,"interval_s":I,
 *    "t":[wall time at each point's end],"span":[seconds each covers],
 *    "series":[{"name":..,"kind":"rate"|"mean"|"last","v":[..., null where none]}]}
 * full=false (only points with sequence >= since_next) when since_gen is
 * the current gen and since_next is within what is held; else every
 * point. */
void ps_history_json(ps_history *h, ps_textbuf *b, uint64_t since_gen, uint64_t since_next);

#endif
