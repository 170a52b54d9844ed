/* test_history.c - the dashboard's bounded history (server/history.c), its
 * trainer table (server/trainers.c) and JSON text (server/textbuf.c).
 * History: a synthetic stream of rates, means and gauges is fed one tick
 * at a time; after every tick each held point's value is recomputed from
 * the raw stream over exactly the ticks the point covers, independently of
 * the merging code, and the history never holds more than its cap. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "history.h"
#include "textbuf.h"
#include "trainers.h"

#define N_TICKS 300
#define CAP 8

typedef struct raw {
    double rate;            /* added to the RATE series at tick k */
    double msum, mcount;    /* MEAN: a sum over mcount values (mcount may be 0) */
    double last;            /* LAST: NaN = nothing set at tick k */
} raw;

static void history_merges(void) {
    ps_history *h = ps_history_create(CAP, 1.0);
    CHECK(h != NULL);
    if (!h) return;
    int sr = ps_history_series(h, "samples", PS_HIST_RATE);
    int sm = ps_history_series(h, "loss", PS_HIST_MEAN);
    int sl = ps_history_series(h, "gauge", PS_HIST_LAST);
    CHECK(sr == 0 && sm == 1 && sl == 2);
    CHECK(ps_history_series(h, "loss", PS_HIST_RATE) == sm);   /* found by name, kind kept */
    raw r[N_TICKS + 1];
    ps_history_tick(h, 0, 1000);   /* starts the first point */
    int merges = 0, last_closed = 0;
    uint64_t gen0 = 0, next0 = 0;
    for (int k = 1; k <= N_TICKS; k++) {
        r[k].rate = 10.0 * k;
        r[k].mcount = k % 3;                     /* some ticks report no loss */
        r[k].msum = r[k].mcount * (1.0 / k);
        r[k].last = k % 5 == 0 ? NAN : k * 0.5;  /* some ticks set no gauge */
        ps_history_add(h, sr, r[k].rate, 1);
        ps_history_add(h, sm, r[k].msum, r[k].mcount);
        if (!isnan(r[k].last)) ps_history_add(h, sl, r[k].last, 1);
        ps_history_add(h, sm, NAN, 1);           /* non-finite values are ignored */
        int closed = ps_history_tick(h, k, 1000 + k);
        ps_history_info in;
        ps_history_get_info(h, &in);
        CHECK(in.points <= CAP && in.points >= 1);
        CHECK(in.next == next0 + (uint64_t)closed);   /* sequence numbers count closed points */
        next0 = in.next;
        if (in.gen != gen0) merges++, gen0 = in.gen;
        if (closed) last_closed = k;
        /* a point closes once it spans the interval, never later */
        CHECK_MSG(k - last_closed < in.interval_s, "tick %d: open for %d s at interval %g", k, k - last_closed,
                  in.interval_s);
        /* every held point against the raw stream */
        int bad = 0;
        double covered = 0;
        for (int i = 0; i < in.points; i++) {
            double wall, span;
            if (!ps_history_point(h, i, &wall, &span)) { bad++; continue; }
            int hi = (int)lround(wall - 1000), lo = hi - (int)lround(span) + 1;   /* ticks lo..hi */
            covered += span;
            double rs = 0, ms = 0, mc = 0, last = NAN;
            for (int j = lo; j <= hi; j++) {
                rs += r[j].rate;
                ms += r[j].msum;
                mc += r[j].mcount;
                if (!isnan(r[j].last)) last = r[j].last;
            }
            double want_m = mc > 0 ? ms / mc : NAN;
            double got_r = ps_history_value(h, sr, i), got_m = ps_history_value(h, sm, i), got_l = ps_history_value(h, sl, i);
            if (fabs(got_r - rs / span) > 1e-9 * rs) bad++;
            if (isnan(want_m) != isnan(got_m) || (!isnan(want_m) && fabs(got_m - want_m) > 1e-12)) bad++;
            if (isnan(last) != isnan(got_l) || (!isnan(last) && got_l != last)) bad++;
        }
        CHECK_MSG(bad == 0, "tick %d: %d point values differ from the raw stream", k, bad);
        CHECK_MSG(covered == last_closed, "tick %d: the points cover %g s, want %d (nothing lost in merges)", k,
                  covered, last_closed);
    }
    ps_history_info in;
    ps_history_get_info(h, &in);
    /* 300 ticks in 8 points: merged until one point spans >= 300/8 s */
    CHECK(merges >= 5 && in.interval_s == (double)(1 << merges));
    CHECK(ps_history_value(h, sr, in.points) != ps_history_value(h, sr, in.points));   /* out of range: NaN */
    ps_history_free(h);
}

static int count_char(const char *s, const char *from, char c) {
    const char *p = strstr(s, from);
    int n = 0;
    if (!p) return -1;
    for (p += strlen(from); *p && *p != ']'; p++) n += *p == c;
    return n;
}

static void history_json(void) {
    ps_history *h = ps_history_create(4, 1.0);
    int s = ps_history_series(h, "x", PS_HIST_MEAN);
    ps_history_tick(h, 0, 0);
    for (int k = 1; k <= 3; k++) {
        if (k != 2) ps_history_add(h, s, k, 1);
        ps_history_tick(h, k, k);
    }
    ps_textbuf b = {0};
    ps_history_json(h, &b, ~0ULL, 0);
    char *j = ps_textbuf_take(&b, NULL);
    CHECK(j && strstr(j, "\"gen\":0,\"next\":3,\"full\":true"));
    CHECK(j && strstr(j, "\"name\":\"x\",\"kind\":\"mean\",\"v\":[1,null,3]"));
    free(j);
    /* only what the reader lacks */
    ps_history_add(h, s, 4, 1);
    ps_history_tick(h, 4, 4);
    ps_history_json(h, &b, 0, 3);
    j = ps_textbuf_take(&b, NULL);
    CHECK(j && strstr(j, "\"full\":false") && strstr(j, "\"t\":[4.000]") && strstr(j, "\"v\":[4]"));
    free(j);
    /* a merge since: everything again */
    ps_history_tick(h, 5, 5);
    ps_history_json(h, &b, 0, 4);
    j = ps_textbuf_take(&b, NULL);
    CHECK(j && strstr(j, "\"gen\":1") && strstr(j, "\"full\":true"));
    CHECK(j && count_char(j, "\"t\":[", ',') == 2);   /* 5 points merged to 2, then the 5th: 3 */
    free(j);
    /* series limit and name length */
    char name[PS_HIST_NAME_MAX + 8];
    int last = 0;
    for (int i = 0; i < PS_HIST_MAX_SERIES + 2; i++) {
        snprintf(name, sizeof name, "s%d", i);
        last = ps_history_series(h, name, PS_HIST_LAST);
    }
    CHECK(last == -1);
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = 0;
    CHECK(ps_history_series(h, name, PS_HIST_LAST) == -1);
    ps_history_add(h, -1, 1, 1);   /* ignored */
    ps_history_free(h);
    CHECK(ps_history_create(3, 1) == NULL && ps_history_create(4, 0) == NULL);
}

static void textbuf_json(void) {
    ps_textbuf b = {0};
    ps_textbuf_json_str(&b, "a\"b\\c\n\x01 \xc3\xa9");
    ps_textbuf_printf(&b, " ");
    ps_textbuf_json_num(&b, NAN);
    ps_textbuf_printf(&b, " ");
    ps_textbuf_json_num(&b, INFINITY);
    ps_textbuf_printf(&b, " ");
    ps_textbuf_json_num(&b, 42);
    ps_textbuf_printf(&b, " ");
    ps_textbuf_json_num(&b, 0.1);
    ps_textbuf_printf(&b, " ");
    ps_textbuf_json_num(&b, 1796133770.125);
    size_t len = 0;
    char *s = ps_textbuf_take(&b, &len);
    CHECK_MSG(s && !strcmp(s, "\"a\\\"b\\\\c\\u000a\\u0001 \xc3\xa9\" null null 42 0.1 1796133770.125"), "%s", s ? s : "(null)");
    CHECK(s && len == strlen(s));
    free(s);
    for (int i = 0; i < 20000; i++) ps_textbuf_printf(&b, "%d,", i);   /* grows */
    s = ps_textbuf_take(&b, &len);
    CHECK(s && len > 100000 && !strncmp(s + len - 6, "19999,", 6));
    free(s);
}

static ps_scalar_set scalars(const char *a, double va, const char *b, double vb) {
    ps_scalar_set s = {.n = 2};
    snprintf(s.s[0].name, sizeof s.s[0].name, "%s", a);
    s.s[0].value = va;
    snprintf(s.s[1].name, sizeof s.s[1].name, "%s", b);
    s.s[1].value = vb;
    return s;
}

static const ps_trainer_row *find_rank(const ps_trainer_row *r, int n, int rank) {
    for (int i = 0; i < n; i++)
        if (r[i].rank == rank) return &r[i];
    return NULL;
}

static void trainers(void) {
    ps_trainers *t = ps_trainers_create();
    CHECK(t != NULL);
    ps_trainers_forward(NULL, 1, 32, 0, NAN, 0);   /* NULL: no-op */
    ps_trainers_forward(t, 1, 32, 0, NAN, 0);
    ps_trainers_forward(t, 1, 32, 1, NAN, 0);      /* replayed: no new samples */
    ps_trainers_forward(t, 2, 700, 0, 5.5, 1);  /* a fused loss over tokens */
    ps_trainers_forward(t, 5000, 8, 0, NAN, 0);    /* beyond the table: "other" */
    ps_scalar_set s1 = scalars("loss", 2.0, "acc", 0.5), s2 = scalars("loss", 4.0, "reward", 10);
    ps_trainers_step(t, 1, 0x1001, &s1);
    ps_trainers_step(t, 2, 0x2001, &s2);
    ps_trainers_step_repeated(t, 0x1001);       /* rank 1's context, from the cache */
    ps_trainers_step_repeated(t, 0x1001);
    ps_trainers_step_repeated(t, 0x9999);       /* unknown: "other" */
    ps_trainers_partial(t, 2, 1);
    ps_trainers_partial(t, 2, 0);
    ps_trainer_row rows[8];
    int n = ps_trainers_rows(t, rows, 8);
    CHECK(n == 3);
    const ps_trainer_row *r1 = find_rank(rows, n, 1), *r2 = find_rank(rows, n, 2), *ro = find_rank(rows, n, -1);
    CHECK(r1 && r1->samples == 32 && r1->forwards == 2 && r1->replayed == 1 && r1->steps == 1 && r1->repeated_steps == 2);
    CHECK(r1 && r1->loss == 2.0);               /* the Step's scalar */
    CHECK(r2 && r2->samples == 700 && r2->loss == 5.5);   /* psd's fused loss wins over the scalar */
    CHECK(r2 && r2->partial_applied == 1 && r2->partial_lost == 1);
    CHECK(ro && ro->samples == 8 && ro->repeated_steps == 1);
    CHECK(rows[n - 1].rank == -1);              /* "other" last */
    CHECK(r1 && r1->last_seen >= r1->first_seen && r1->first_seen > 1e9);
    ps_trainers_delta d;
    ps_trainers_take(t, &d);
    CHECK(d.fused_loss_n == 1 && d.fused_loss_sum == 5.5);
    CHECK(d.fused_tokens_n == 1);
    CHECK(d.n == 3);
    double loss_sum = 0, loss_n = 0;
    for (int i = 0; i < d.n; i++)
        if (!strcmp(d.s[i].name, "loss")) loss_sum = d.s[i].sum, loss_n = (double)d.s[i].count;
    CHECK(loss_sum == 6.0 && loss_n == 2);
    ps_trainers_take(t, &d);
    CHECK(d.fused_loss_n == 0 && d.n == 0);     /* taken: starts again */
    ps_trainers_forward(t, 2, 32, 0, 1.5, 0);   /* a classifier's one call a batch: no tokens */
    ps_trainers_take(t, &d);
    CHECK(d.fused_loss_n == 1 && d.fused_tokens_n == 0);
    CHECK(ps_trainers_rows(t, rows, 1) == 3);   /* counts all, fills cap */
    ps_trainers_free(t);
    ps_trainers_free(NULL);
}

int main(void) {
    history_merges();
    history_json();
    textbuf_json();
    trainers();
    return check_summary("test_history");
}
