/* status.c - ps_status names, ps_err messages and the invariant check
 * (status.h). */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ps_status_name(ps_status s) {
    switch (s) {
    case PS_OK: return "OK";
    case PS_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case PS_ERR_NOT_FOUND: return "NOT_FOUND";
    case PS_ERR_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case PS_ERR_FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case PS_ERR_RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case PS_ERR_UNAVAILABLE: return "UNAVAILABLE";
    case PS_ERR_DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case PS_ERR_IO: return "IO";
    case PS_ERR_FORMAT: return "FORMAT";
    case PS_ERR_UNAUTHENTICATED: return "UNAUTHENTICATED";
    case PS_ERR_PERMISSION_DENIED: return "PERMISSION_DENIED";
    case PS_ERR_UNIMPLEMENTED: return "UNIMPLEMENTED";
    case PS_ERR_INTERNAL: return "INTERNAL";
    case PS_ERR_ABORTED: return "ABORTED";
    }
    return "UNKNOWN";
}

ps_status ps_err_set(ps_err *e, ps_status code, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        e->code = code;
        e->retry_after_ms = 0;
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

ps_status ps_err_prefix(ps_err *e, const char *fmt, ...) {
    if (!e) return PS_ERR_INTERNAL;
    char head[PS_ERR_MSG_MAX], old[PS_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t hl = strlen(head);
    if (hl > sizeof e->msg - 3) hl = sizeof e->msg - 3;
    memcpy(e->msg, head, hl);
    memcpy(e->msg + hl, ": ", 2);
    size_t room = sizeof e->msg - hl - 3;
    size_t ol = strnlen(old, room);
    memcpy(e->msg + hl + 2, old, ol);
    e->msg[hl + 2 + ol] = '\0';
    return e->code;
}

void ps_err_clear(ps_err *e) {
    if (e) { e->code = PS_OK; e->msg[0] = '\0'; e->retry_after_ms = 0; }
}

ps_status ps_err_retry_after(ps_err *e, int ms) {
    if (!e) return PS_ERR_RESOURCE_EXHAUSTED;
    e->retry_after_ms = ms > 0 ? ms : 0;
    return e->code;
}

void ps_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "%s:%d: assertion failed: %s\n", file, line, expr);
    fflush(stderr);
    abort();
}
