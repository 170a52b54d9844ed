/* check.c - the counters and summary line of the tests' CHECK macros
 * (tests/check.h). */
#include "../check.h"

int check_count_ = 0, check_failed_ = 0;

int check_summary(const char *name) {
    printf("%s: %d checks, %d failed\n", name, check_count_, check_failed_);
    return check_failed_ ? 1 : 0;
}

int check_skip(const char *name, const char *why) {
    printf("%s: skipped: %s\n", name, why);
    return 77;
}

void check_array(const char *what, const float *got, const float *want, size_t n, double atol, double rtol) {
    size_t bad = 0, worst = 0;
    double worst_excess = -1.0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]), lim = atol + rtol * fabs(want[i]);
        if (!(diff <= lim)) {
            bad++;
            if (isnan(diff) || diff - lim > worst_excess) {
                worst_excess = isnan(diff) ? INFINITY : diff - lim;
                worst = i;
            }
        }
    }
    CHECK_MSG(bad == 0, "%s: %zu of %zu elements off (atol %g rtol %g), worst [%zu] got %.9g want %.9g",
              what, bad, n, atol, rtol, worst, n ? got[worst] : 0.0f, n ? want[worst] : 0.0f);
}

void check_scaled(const char *what, const float *got, const float *want, size_t n, double tol) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(want[i]) > m) m = fabs(want[i]);
    check_array(what, got, want, n, tol * (m > 0 ? m : 1.0), tol);
}
