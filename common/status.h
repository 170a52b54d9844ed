/* status.h - error reporting shared by every module.
 *
 * Two tiers (see ../shared/notes/STYLE.md):
 *  - anything a peer, a file or a user can cause is reported through a
 *    returned ps_status plus a human-readable message in a ps_err that names
 *    what was wrong (file, line, field, value);
 *  - broken internal invariants use PS_ASSERT, which prints file:line and
 *    aborts. Never use PS_ASSERT for input validation.
 *
 * A ps_err pointer may always be NULL: the message is then dropped.
 */
#ifndef PS_STATUS_H
#define PS_STATUS_H

#include <stddef.h>

typedef enum {
    PS_OK = 0,
    PS_ERR_INVALID_ARGUMENT,   /* bad value from a user, file or peer */
    PS_ERR_NOT_FOUND,          /* unknown context, file, key, parameter */
    PS_ERR_ALREADY_EXISTS,
    PS_ERR_FAILED_PRECONDITION,/* right value, wrong time (e.g. step before backward) */
    PS_ERR_RESOURCE_EXHAUSTED, /* out of memory, too large */
    PS_ERR_UNAVAILABLE,        /* peer unreachable, shutting down */
    PS_ERR_DEADLINE_EXCEEDED,
    PS_ERR_IO,                 /* read/write failure */
    PS_ERR_FORMAT,             /* malformed file or message */
    PS_ERR_UNAUTHENTICATED,
    PS_ERR_PERMISSION_DENIED,
    PS_ERR_UNIMPLEMENTED,
    PS_ERR_INTERNAL,           /* a library call failed unexpectedly */
    PS_ERR_ABORTED,            /* the operation was overtaken (a closed sync round); do not retry it as is */
} ps_status;

#define PS_ERR_MSG_MAX 512

typedef struct ps_err {
    ps_status code;
    char msg[PS_ERR_MSG_MAX];
    /* > 0: the refusal is psd's admission control (a client's fair share of
     * calls or context memory, RESOURCE_EXHAUSTED): the call did nothing and
     * may be sent again as it is, not before this many ms (psd sends it as
     * the trailing metadata PS_RPC_RETRY_AFTER_KEY; docs/protocol.md,
     * "Statuses"). 0: no such hint. ps_err_set clears it, ps_err_prefix
     * keeps it. */
    int retry_after_ms;
} ps_err;

/* Name of a status code, e.g. "INVALID_ARGUMENT". Never NULL. */
const char *ps_status_name(ps_status s);

/* Record an error (printf-style) in e (may be NULL) and return code, so that
 * callers can write `return ps_err_set(err, PS_ERR_IO, "...", ...);`. */
ps_status ps_err_set(ps_err *e, ps_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepend context to an existing message: "ctx: old message". */
ps_status ps_err_prefix(ps_err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void ps_err_clear(ps_err *e);

/* Mark the error in e as an admission refusal that may be retried as it
 * is after ms (> 0) milliseconds (ps_err.retry_after_ms); returns e's code. */
ps_status ps_err_retry_after(ps_err *e, int ms);

/* Invariant check: prints expression, file and line, then aborts. */
void ps_assert_fail(const char *expr, const char *file, int line)
    __attribute__((noreturn));
#define PS_ASSERT(x) \
    do { if (!(x)) ps_assert_fail(#x, __FILE__, __LINE__); } while (0)

#endif
