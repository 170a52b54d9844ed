/* test_cartpole.c - the C CartPole-v1 (trainer/cartpole.c) against the
 * trajectories of an independent Python port of gym's cartpole.py
 * (tests/golden/cartpole_trajectory.txt, scripts/gen_golden_cartpole.py),
 * and physical checks that need no reference: the mirrored state with the
 * mirrored action gives the mirrored trajectory; termination happens exactly
 * past the thresholds (strict inequalities); truncation at max_steps; reset
 * draws in [-0.05, 0.05) and are reproducible per seed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cartpole.h"
#include "check.h"

static void golden(void) {
    FILE *f = fopen("tests/golden/cartpole_trajectory.txt", "r");
    CHECK_MSG(f != NULL, "tests/golden/cartpole_trajectory.txt missing");
    if (!f) return;
    char line[1024];
    ps_cartpole e;
    ps_cartpole_init(&e, 1, 0);
    int episodes = 0, steps = 0, bad = 0, truncs = 0, terms = 0;
    double worst = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        int k, t, a, term, trunc;
        double s[4], w[4], o[4];
        if (sscanf(line, "episode %d %lf %lf %lf %lf", &k, &s[0], &s[1], &s[2], &s[3]) == 5) {
            CHECK_MSG(e.done || episodes == 0, "episode %d: the previous one did not end", k);
            ps_cartpole_set_state(&e, s);
            episodes++;
            continue;
        }
        if (sscanf(line, "step %d %d %lf %lf %lf %lf %lf %lf %lf %lf %d %d", &t, &a, &w[0], &w[1], &w[2], &w[3],
                   &o[0], &o[1], &o[2], &o[3], &term, &trunc) != 12) {
            CHECK_MSG(0, "bad golden line: %s", line);
            continue;
        }
        float obs[4];
        double r = 0;
        int gterm = -1, gtrunc = -1;
        int rc = ps_cartpole_step(&e, a, obs, &r, &gterm, &gtrunc);
        steps++;
        for (int i = 0; i < 4; i++) {
            double d = fabs(e.s[i] - w[i]);
            if (d > worst) worst = d;
            /* libm's cos/sin may differ by an ulp between libraries: allow
             * a few ulps of drift, nothing like a wrong formula */
            if (d > 1e-12 * (1 + fabs(w[i])) || fabs((double)obs[i] - o[i]) > 1e-6 * (1 + fabs(o[i]))) bad++;
        }
        if (rc != 0 || r != 1.0 || gterm != term || gtrunc != trunc || e.steps != t) {
            CHECK_MSG(0, "episode %d step %d: rc %d reward %g terminated %d/%d truncated %d/%d steps %d", episodes - 1,
                      t, rc, r, gterm, term, gtrunc, trunc, e.steps);
            bad++;
        }
        terms += term;
        truncs += trunc;
    }
    fclose(f);
    CHECK_MSG(bad == 0, "%d mismatches against the Python port (worst state difference %.3g)", bad, worst);
    CHECK(episodes == 8);
    CHECK(steps > 600);
    CHECK(terms == 7 && truncs == 1);
    printf("golden: %d episodes, %d steps, worst float64 state difference %.3g\n", episodes, steps, worst);
}

static void mirror(void) {
    ps_cartpole a, b;
    ps_cartpole_init(&a, 7, 0);
    ps_cartpole_init(&b, 7, 0);
    float oa[4], ob[4];
    ps_cartpole_reset(&a, oa);
    double m[4];
    for (int i = 0; i < 4; i++) m[i] = -a.s[i];
    ps_cartpole_set_state(&b, m);
    ps_rng r;
    ps_rng_seed(&r, 3);
    int n = 0, exact = 1;
    for (;;) {
        int act = (int)ps_rng_below(&r, 2), ta, tb, ua, ub;
        double ra, rb;
        ps_cartpole_step(&a, act, oa, &ra, &ta, &ua);
        ps_cartpole_step(&b, 1 - act, ob, &rb, &tb, &ub);
        n++;
        for (int i = 0; i < 4; i++) exact &= b.s[i] == -a.s[i] && ob[i] == -oa[i];
        CHECK(ta == tb && ua == ub);
        if (ta || ua) break;
    }
    CHECK_MSG(exact, "mirrored trajectory differs (after %d steps)", n);
    CHECK(n > 3);
}

/* The state just at a threshold after the step does not terminate; the next
 * double past it does. With zero velocities x and theta do not move. */
static void thresholds(void) {
    ps_cartpole e;
    ps_cartpole_init(&e, 1, 0);
    int term, trunc;
    const double X = PS_CARTPOLE_X_THRESHOLD, TH = 12 * 2 * M_PI / 360;
    CHECK(PS_CARTPOLE_THETA_THRESHOLD == TH);
    struct { double s[4]; int want; } cases[] = {
        {{X, 0, 0, 0}, 0},
        {{nextafter(X, 10), 0, 0, 0}, 1},
        {{-X, 0, 0, 0}, 0},
        {{nextafter(-X, -10), 0, 0, 0}, 1},
        {{0, 0, TH, 0}, 0},
        {{0, 0, nextafter(TH, 1), 0}, 1},
        {{0, 0, -TH, 0}, 0},
        {{0, 0, nextafter(-TH, -1), 0}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ps_cartpole_set_state(&e, cases[i].s);
        double r;
        CHECK(ps_cartpole_step(&e, 1, NULL, &r, &term, &trunc) == 0);
        CHECK(e.s[0] == cases[i].s[0] && e.s[2] == cases[i].s[2]);  /* positions move with the old velocities */
        CHECK_MSG(term == cases[i].want, "case %zu: terminated %d, want %d", i, term, cases[i].want);
        CHECK(r == 1.0);  /* the last step is rewarded too */
        CHECK(ps_cartpole_step(&e, 1, NULL, &r, &term, &trunc) == (cases[i].want ? -1 : 0));
    }
    /* truncation at max_steps; a bad action is refused */
    ps_cartpole_init(&e, 1, 3);
    ps_cartpole_set_state(&e, (double[4]){0, 0, 0, 0});
    CHECK(ps_cartpole_step(&e, 2, NULL, NULL, &term, &trunc) == -1);
    for (int t = 1; t <= 3; t++) {
        CHECK(ps_cartpole_step(&e, t & 1, NULL, NULL, &term, &trunc) == 0);
        CHECK(trunc == (t == 3) && !term);
    }
    CHECK(e.done);
}

static void resets(void) {
    ps_cartpole a, b, c;
    ps_cartpole_init(&a, 42, 0);
    ps_cartpole_init(&b, 42, 0);
    ps_cartpole_init(&c, 43, 0);
    int same = 1, differs = 0, inrange = 1;
    double lo = 1, hi = -1;
    for (int k = 0; k < 2000; k++) {
        float oa[4], ob[4], oc[4];
        ps_cartpole_reset(&a, oa);
        ps_cartpole_reset(&b, ob);
        ps_cartpole_reset(&c, oc);
        for (int i = 0; i < 4; i++) {
            same &= a.s[i] == b.s[i];
            differs |= a.s[i] != c.s[i];
            inrange &= a.s[i] >= -0.05 && a.s[i] < 0.05 && oa[i] == (float)a.s[i];
            if (a.s[i] < lo) lo = a.s[i];
            if (a.s[i] > hi) hi = a.s[i];
        }
        CHECK(!a.done && a.steps == 0);
    }
    CHECK(same && differs && inrange);
    CHECK(lo < -0.049 && hi > 0.049);  /* covers the range */
}

int main(void) {
    golden();
    mirror();
    thresholds();
    resets();
    return check_summary("test_cartpole");
}
