/* log.c - leveled logging to stderr or a log file, one locked write per
 * line (log.h). */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static ps_log_level g_level = PS_LOG_INFO;
static const char *g_prog = "ps";
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_syslog_prefix;

void ps_log_set_level(ps_log_level lvl) { g_level = lvl; }
ps_log_level ps_log_get_level(void) { return g_level; }
void ps_log_set_prog(const char *prog) { g_prog = prog; }
void ps_log_set_syslog_prefix(int on) { g_syslog_prefix = on; }

static const char *const names[] = {
    [PS_LOG_DEBUG] = "debug", [PS_LOG_INFO] = "info", [PS_LOG_WARN] = "warn", [PS_LOG_ERROR] = "error", NULL};

const char *const *ps_log_level_names(void) { return names; }

void ps_log_impl(ps_log_level lvl, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    pthread_mutex_lock(&g_lock);
    if (g_syslog_prefix) {
        static const int prio[] = {7, 6, 4, 3}; /* debug, info, warning, err */
        fprintf(stderr, "<%d>%s[%s] %s\n", prio[lvl], g_prog, names[lvl], line);
        fflush(stderr);
        pthread_mutex_unlock(&g_lock);
        return;
    }
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%s] %s\n",
            tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000000, g_prog, names[lvl], line);
    fflush(stderr);
    pthread_mutex_unlock(&g_lock);
}
