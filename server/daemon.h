/* daemon.h - the service-manager side of psd: log destination, systemd
 * notification, readable bind errors and the checkpoint schedule. Kept out
 * of psd.c so that main() reads as the lifecycle and the pieces are tested.
 */
#ifndef PS_DAEMON_H
#define PS_DAEMON_H

#include <stddef.h>
#include <stdint.h>

#include "server_opts.h"
#include "status.h"

/* Point stderr (fd 2, so gRPC's own messages too) at path, opened for
 * appending (created 0640). Called at start-up and again on SIGHUP, after
 * logrotate moved the file. On error stderr is unchanged. */
ps_status ps_daemon_open_log(const char *path, ps_err *err);

/* When stderr is the journal (systemd sets JOURNAL_STREAM to its
 * device:inode), log with syslog priorities and no timestamps. Returns 1
 * when it did. */
int ps_daemon_use_journal_if_attached(void);

/* sd_notify(state) when NOTIFY_SOCKET is set (under systemd Type=notify);
 * a no-op otherwise. */
void ps_daemon_notify(const char *state);

/* Why "host:port" cannot be listened on, found by binding it once
 * ("127.0.0.1:50051 is already in use (another psd?)"); "unix:PATH" by
 * PATH's directory (it must take a new file) and PATH (none, or a socket).
 * Writes "" and returns 0 when it can bind it or the address is one of
 * gRPC's other forms (dns:, ipv4:, ...); else returns EADDRINUSE when
 * something listens there (psd itself, maybe: --check-config only warns),
 * another errno when it never could (not an address of this machine, no
 * such host, no ":PORT", no such directory). */
int ps_daemon_explain_bind(const char *addr, char *buf, size_t cap);

/* What ps_daemon_open_log(path) would refuse, without creating or writing
 * anything: path a directory or not writable, its directory missing or not
 * writable. The error names path. */
ps_status ps_daemon_check_log(const char *path, ps_err *err);

/* ps_ckpt_opts (the server.checkpoint_* keys) is in server_opts.h. */

/* When to write a checkpoint: opts->every_steps > 0 and that many steps
 * since the last one, or opts->every_s > 0, that many seconds since the
 * last one, and the model changed. Times are monotonic seconds. */
typedef struct ps_ckpt_sched {
    const ps_ckpt_opts *opts;
    uint64_t last_version;
    double last_time;
} ps_ckpt_sched;

int ps_ckpt_sched_due(const ps_ckpt_sched *s, uint64_t version, double now);
/* Record a checkpoint of version at now. */
void ps_ckpt_sched_done(ps_ckpt_sched *s, uint64_t version, double now);

#endif
