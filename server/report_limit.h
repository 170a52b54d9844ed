/* report_limit.h - what one client may make psd count and log:
 * ReportPartial calls (a trainer's report of a step applied on some
 * servers only), attributed to the calling client (token, or host).
 *
 *  - a repeated report of one context by one client (a retry) counts once;
 *  - each client has a token bucket of `rate` reports a second (`burst` at
 *    once): past it a report is refused RESOURCE_EXHAUSTED, neither
 *    counted nor logged;
 *  - each client's reports are logged at most once a second; the lines
 *    held back are counted and named in the next line.
 * The caller checks a report against what psd knows (its finished-context
 * records) before counting it. At most PS_REPORT_CLIENTS clients are
 * tracked (the least recently seen is forgotten) and PS_REPORT_RECENT
 * recent (client, context) pairs. Thread-safe; knows neither gRPC nor psd.
 */
#ifndef PS_REPORT_LIMIT_H
#define PS_REPORT_LIMIT_H

#include <stdint.h>

#include "status.h"

#define PS_REPORT_CLIENTS 256
#define PS_REPORT_RECENT 4096

typedef struct ps_report_limit ps_report_limit;

/* rate > 0 reports a second, burst >= 1. NULL when out of memory. */
ps_report_limit *ps_report_limit_create(double rate, double burst);
void ps_report_limit_free(ps_report_limit *r);   /* NULL ok */

/* A report of context ctx from client at time now (seconds, monotonic):
 * PS_OK - count it; *log = 1 when a line may be logged, *held = the lines
 * of this client held back since its last one. ALREADY_EXISTS - the same
 * client reported ctx already: answer it, count nothing. RESOURCE_EXHAUSTED
 * (err names the rate) - over the client's rate. */
ps_status ps_report_limit_admit(ps_report_limit *r, const char *client, uint64_t ctx, double now, int *log,
                                uint64_t *held, ps_err *err);

#endif
