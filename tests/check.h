/* check.h - tiny test harness shared by the tests/test_*.c programs.
 *
 * CHECK(expr) records a failure with the expression and file:line and goes
 * on; CHECK_CLOSE compares floats with an absolute+relative tolerance.
 * Each program ends with `return check_summary("name");`, which prints
 * "name: N checks, M failed" and returns non-zero when anything failed.
 * A test that cannot run here (no GPU, say) calls check_skip(), which
 * prints "skipped: <why>" and returns the special exit code 77 - a skip is
 * never counted as a pass by tests/run.sh.
 *
 * The counters live in tests/support/check.c, which every test program
 * links, so checks made by shared test code (tests/support/) count too.
 */
#ifndef PS_TEST_CHECK_H
#define PS_TEST_CHECK_H

#include <math.h>
#include <stddef.h>
#include <stdio.h>

extern int check_count_, check_failed_;

#define CHECK(expr) do { \
    check_count_++; \
    if (!(expr)) { check_failed_++; \
        fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #expr); } \
} while (0)

#define CHECK_MSG(expr, ...) do { \
    check_count_++; \
    if (!(expr)) { check_failed_++; \
        fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #expr); \
        fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } \
} while (0)

#define CHECK_CLOSE(a, b, atol, rtol) do { \
    double ca_ = (a), cb_ = (b); \
    check_count_++; \
    if (!(fabs(ca_ - cb_) <= (atol) + (rtol) * fabs(cb_)) || isnan(ca_) || isnan(cb_)) { \
        check_failed_++; \
        fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.9g vs %s = %.9g\n", \
                __FILE__, __LINE__, #a, ca_, #b, cb_); } \
} while (0)

/* One check per array: every |got - want| <= atol + rtol * |want| (NaN
 * fails); the message names the worst element. */
void check_array(const char *what, const float *got, const float *want, size_t n, double atol, double rtol);
/* Backend comparison: check_array with atol = tol * max|want|, rtol = tol. */
void check_scaled(const char *what, const float *got, const float *want, size_t n, double tol);

/* Print "name: N checks, M failed"; returns 1 when anything failed. */
int check_summary(const char *name);
/* Print "name: skipped: why"; returns 77, tests/run.sh's skip code. */
int check_skip(const char *name, const char *why);

#endif
