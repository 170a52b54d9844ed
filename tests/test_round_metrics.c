/* test_round_metrics.c - server/round_metrics.c: per-round min/mean/max and
 * the EMA computed by hand, sync rounds from members' sets, hogwild rounds
 * every round_steps Steps, the sticky stop threshold (strictly above),
 * the name limit, and the refusals of bad scalars. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "round_metrics.h"

static ps_scalar_set set2(double reward, double loss) {
    ps_scalar_set s = {.n = 2};
    snprintf(s.s[0].name, sizeof s.s[0].name, "reward");
    s.s[0].value = reward;
    snprintf(s.s[1].name, sizeof s.s[1].name, "loss");
    s.s[1].value = loss;
    return s;
}

static const ps_round_stat *find(const ps_round_report *r, const char *name) {
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->s[i].name, name)) return &r->s[i];
    return NULL;
}

static void sync_rounds(void) {
    ps_err err = {0};
    ps_rmetrics_opts o = {.alpha = 0.05, .ema_of = PS_RM_EMA_MIN, .round_steps = 1, .stop_metric = "reward",
                          .stop_threshold = 475};
    ps_rmetrics *m = ps_rmetrics_create(&o, &err);
    CHECK(m != NULL);
    ps_scalar_set a = set2(20, 1.5), b = set2(30, -0.5);
    const ps_scalar_set *sets[3] = {&a, &b, NULL};  /* a member without scalars */
    ps_round_report r;
    ps_rmetrics_close_round(m, sets, 3, &r);
    const ps_round_stat *rw = find(&r, "reward"), *ls = find(&r, "loss");
    CHECK(r.round == 1 && r.n == 2 && rw && ls && !r.solved);
    if (rw) CHECK(rw->count == 2 && rw->min == 20 && rw->max == 30 && rw->mean == 25 && rw->ema == 20);
    if (ls) CHECK(ls->count == 2 && ls->min == -0.5 && ls->max == 1.5 && ls->mean == 0.5 && ls->ema == -0.5);
    /* the EMA by hand over rounds of min 500: 20 -> 0.05*500 + 0.95*ema ... */
    double ema = 20;
    int solved_at = 0;
    for (int k = 2; k <= 200 && !solved_at; k++) {
        ps_scalar_set c = set2(500, 0), d = set2(600, 0);
        const ps_scalar_set *s2[2] = {&c, &d};
        ps_rmetrics_close_round(m, s2, 2, &r);
        ema = 0.05 * 500 + 0.95 * ema;
        rw = find(&r, "reward");
        CHECK(rw && fabs(rw->ema - ema) < 1e-9);
        if (ema > 475) {
            CHECK(r.solved);
            solved_at = k;
        } else {
            CHECK(!r.solved);
        }
    }
    CHECK(solved_at > 2);
    /* sticky: a bad round later does not un-solve */
    ps_scalar_set e = set2(9, 0);
    const ps_scalar_set *s3[1] = {&e};
    ps_rmetrics_close_round(m, s3, 1, &r);
    CHECK(r.solved && r.round == (uint64_t)solved_at + 1);
    ps_rmetrics_latest(m, &r);
    CHECK(r.solved && find(&r, "reward") && find(&r, "reward")->count == 1);
    ps_rmetrics_free(m);
}

static void hogwild_rounds(void) {
    ps_err err = {0};
    ps_rmetrics_opts o = {.alpha = 0.5, .ema_of = PS_RM_EMA_MEAN, .round_steps = 3};
    ps_rmetrics *m = ps_rmetrics_create(&o, &err);
    ps_round_report r;
    ps_scalar_set a = set2(1, 0), b = set2(2, 0), c = set2(6, 0);
    ps_rmetrics_add_step(m, &a, &r);
    CHECK(r.round == 0 && r.n == 0);
    ps_rmetrics_add_step(m, &b, &r);
    CHECK(r.round == 0);
    ps_rmetrics_add_step(m, &c, &r);
    const ps_round_stat *rw = find(&r, "reward");
    CHECK(r.round == 1 && rw && rw->count == 3 && rw->mean == 3 && rw->ema == 3 && rw->min == 1 && rw->max == 6);
    ps_rmetrics_add_step(m, &c, &r);
    ps_rmetrics_add_step(m, NULL, &r);   /* a Step without scalars counts as a step */
    ps_rmetrics_add_step(m, &c, &r);
    rw = find(&r, "reward");
    CHECK(r.round == 2 && rw && rw->count == 2 && rw->mean == 6 && rw->ema == 0.5 * 6 + 0.5 * 3);
    CHECK(!r.solved);  /* no stop metric */
    ps_rmetrics_free(m);
}

static void limits_and_refusals(void) {
    ps_err err = {0};
    ps_rmetrics_opts bad = {.alpha = 0, .round_steps = 1};
    CHECK(ps_rmetrics_create(&bad, &err) == NULL && strstr(err.msg, "alpha"));
    ps_scalar_set s = {.n = 1};
    snprintf(s.s[0].name, sizeof s.s[0].name, "bad name");
    s.s[0].value = 1;
    CHECK(ps_scalar_set_check(&s, &err) == PS_ERR_INVALID_ARGUMENT && strstr(err.msg, "scalars[0].name"));
    snprintf(s.s[0].name, sizeof s.s[0].name, "x");
    s.s[0].value = NAN;
    CHECK(ps_scalar_set_check(&s, &err) == PS_ERR_INVALID_ARGUMENT && strstr(err.msg, "not finite"));
    s = set2(1, 2);
    snprintf(s.s[1].name, sizeof s.s[1].name, "reward");
    CHECK(ps_scalar_set_check(&s, &err) == PS_ERR_INVALID_ARGUMENT && strstr(err.msg, "twice"));
    s.s[0].name[0] = 0;
    CHECK(ps_scalar_set_check(&s, &err) == PS_ERR_INVALID_ARGUMENT);
    s = set2(1, 2);
    CHECK(ps_scalar_set_check(&s, &err) == PS_OK);
    /* at most PS_RM_MAX_NAMES names tracked, further ones ignored */
    ps_rmetrics_opts o = {.alpha = 1, .round_steps = 1};
    ps_rmetrics *m = ps_rmetrics_create(&o, &err);
    ps_scalar_set many = {.n = PS_RM_MAX_SCALARS};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < many.n; i++) {
            snprintf(many.s[i].name, sizeof many.s[i].name, "n%d", k * 100 + i);
            many.s[i].value = i;
        }
        ps_round_report r;
        ps_rmetrics_add_step(m, &many, &r);
        CHECK(r.n == (k == 0 ? PS_RM_MAX_SCALARS : 0) || PS_RM_MAX_NAMES > PS_RM_MAX_SCALARS);
    }
    ps_rmetrics_free(m);
}

/* Junk names cannot push out the stop metric: it is reserved; every client
 * brings at most PS_RM_NAMES_PER_CLIENT names, and a Step with a name no
 * slot is left for is refused (nothing taken). */
static void reserved_names(void) {
    ps_err err = {0};
    ps_rmetrics_opts o = {.alpha = 1, .ema_of = PS_RM_EMA_MEAN, .round_steps = 1, .stop_metric = "reward",
                          .stop_threshold = 475};
    ps_rmetrics *m = ps_rmetrics_create(&o, &err);
    ps_scalar_set junk = {.n = PS_RM_MAX_SCALARS};
    for (int i = 0; i < junk.n; i++) snprintf(junk.s[i].name, sizeof junk.s[i].name, "junk%d", i);
    /* 8 junk names at once: past one client's share, refused whole */
    CHECK(ps_rmetrics_admit(m, &junk, "ipv4:10.0.0.9", &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "scalars[4]: 'junk4' is a new name") && strstr(err.msg, "at most 4 per client"),
              "%s", err.msg);
    /* four of them: taken; a fifth later: refused */
    junk.n = 4;
    CHECK_MSG(ps_rmetrics_admit(m, &junk, "ipv4:10.0.0.9", &err) == PS_OK, "%s", err.msg);
    ps_scalar_set one = {.n = 1};
    snprintf(one.s[0].name, sizeof one.s[0].name, "junk9");
    CHECK(ps_rmetrics_admit(m, &one, "ipv4:10.0.0.9", &err) == PS_ERR_INVALID_ARGUMENT);
    /* another client takes the last three slots; then nobody brings a new name */
    for (int i = 0; i < 3; i++) {
        snprintf(one.s[0].name, sizeof one.s[0].name, "more%d", i);
        CHECK(ps_rmetrics_admit(m, &one, "token:other", &err) == PS_OK);
    }
    snprintf(one.s[0].name, sizeof one.s[0].name, "loss");
    CHECK(ps_rmetrics_admit(m, &one, "token:trainer", &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "all taken (reward, junk0"), "%s", err.msg);
    /* the stop metric was never pushed out: an honest client's reward counts and solves */
    snprintf(one.s[0].name, sizeof one.s[0].name, "reward");
    one.s[0].value = 500;
    CHECK(ps_rmetrics_admit(m, &one, "token:trainer", &err) == PS_OK);
    ps_round_report r;
    ps_rmetrics_add_step(m, &one, &r);
    CHECK(find(&r, "reward") && find(&r, "reward")->mean == 500 && r.solved);
    ps_rmetrics_free(m);
}

int main(void) {
    sync_rounds();
    hogwild_rounds();
    limits_and_refusals();
    reserved_names();
    return check_summary("test_round_metrics");
}
