/* log.h - leveled logging to stderr (journald keeps it) or a log file.
 *
 * ps_log() skips formatting entirely below the current level. Thread-safe:
 * each line is written with a single fprintf under a lock.
 */
#ifndef PS_LOG_H
#define PS_LOG_H

typedef enum { PS_LOG_DEBUG = 0, PS_LOG_INFO, PS_LOG_WARN, PS_LOG_ERROR } ps_log_level;

void ps_log_set_level(ps_log_level lvl);
ps_log_level ps_log_get_level(void);
/* "debug", "info", "warn", "error" (NULL-terminated, indexed by level):
 * the one list of the names (server.log_level). */
const char *const *ps_log_level_names(void);
/* Prefix every line with this program name (not copied; pass a literal). */
void ps_log_set_prog(const char *prog);

/* Start every line with a syslog priority, "<6>psd[info] ...", and leave
 * out the timestamp: what journald reads from a service's stderr (it adds
 * its own time and keeps the level). psd turns it on under systemd. */
void ps_log_set_syslog_prefix(int on);

void ps_log_impl(ps_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define ps_log(lvl, ...) \
    do { if ((lvl) >= ps_log_get_level()) ps_log_impl((lvl), __VA_ARGS__); } while (0)

#endif
