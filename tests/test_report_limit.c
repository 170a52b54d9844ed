/* test_report_limit.c - what one client may make psd count and log through
 * ReportPartial (server/report_limit.h): repeats count once, each client has
 * its own rate and burst, log lines are one a second per client and say how
 * many were held back. Time is passed in, so nothing here waits. */
#include <string.h>

#include "check.h"
#include "report_limit.h"

static ps_status admit(ps_report_limit *r, const char *who, uint64_t ctx, double now, int *log, uint64_t *held) {
    ps_err err = {0};
    return ps_report_limit_admit(r, who, ctx, now, log, held, &err);
}

static void test_rate_and_repeats(void) {
    ps_report_limit *r = ps_report_limit_create(5, 20);
    CHECK(r != NULL);
    int log = 0, ok = 0;
    uint64_t held = 0;
    /* a burst of 20 at once, then nothing until the bucket refills */
    for (uint64_t k = 1; k <= 50; k++) ok += admit(r, "ipv4:10.0.0.1", k, 100.0, &log, &held) == PS_OK;
    CHECK_MSG(ok == 20, "%d of 50 reports at once counted", ok);
    ps_err err = {0};
    int tmp_log;
    uint64_t tmp_held;
    CHECK(ps_report_limit_admit(r, "ipv4:10.0.0.1", 999, 100.0, &tmp_log, &tmp_held, &err) ==
          PS_ERR_RESOURCE_EXHAUSTED);
    CHECK_MSG(strstr(err.msg, "5 reports a second"), "%s", err.msg);
    /* another client has its own bucket */
    CHECK(admit(r, "token:alice", 1, 100.0, &log, &held) == PS_OK);
    /* a second later: 5 more */
    ok = 0;
    for (uint64_t k = 100; k < 120; k++) ok += admit(r, "ipv4:10.0.0.1", k, 101.0, &log, &held) == PS_OK;
    CHECK_MSG(ok == 5, "%d counted after 1 s at 5/s", ok);
    /* a repeat of a counted report (a retry) is answered, not counted again,
     * and costs no token */
    CHECK(admit(r, "ipv4:10.0.0.1", 3, 101.0, &log, &held) == PS_ERR_ALREADY_EXISTS);
    CHECK(admit(r, "token:alice", 1, 100.5, &log, &held) == PS_ERR_ALREADY_EXISTS);
    /* ... but the same context from another client is that client's report */
    CHECK(admit(r, "token:bob", 3, 101.0, &log, &held) == PS_OK);
    ps_report_limit_free(r);
}

static void test_log_lines(void) {
    ps_report_limit *r = ps_report_limit_create(1000, 1000);
    int log = 0, lines = 0;
    uint64_t held = 0, held_sum = 0;
    /* 100 reports in 0.99 s: one line, the rest held */
    for (uint64_t k = 1; k <= 100; k++) {
        CHECK(admit(r, "h", k, 10.0 + 0.01 * (double)(k - 1), &log, &held) == PS_OK);
        lines += log;
        held_sum += held;
    }
    CHECK_MSG(lines == 1 && held_sum == 0, "%d lines in the first second", lines);
    /* the next second's first report logs, naming the 99 held back */
    CHECK(admit(r, "h", 500, 11.5, &log, &held) == PS_OK);
    CHECK_MSG(log == 1 && held == 99, "log %d, held %llu", log, (unsigned long long)held);
    /* another client logs on its own */
    CHECK(admit(r, "other", 1, 11.6, &log, &held) == PS_OK && log == 1 && held == 0);
    ps_report_limit_free(r);
    /* bad limits are refused */
    CHECK(ps_report_limit_create(0, 10) == NULL && ps_report_limit_create(1, 0.5) == NULL);
}

int main(void) {
    test_rate_and_repeats();
    test_log_lines();
    return check_summary("test_report_limit");
}
