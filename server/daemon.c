/* daemon.c - psd's service-manager side (daemon.h): log destination,
 * sd_notify, readable bind errors and the checkpoint schedule. */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "log.h"

ps_status ps_daemon_open_log(const char *path, ps_err *err) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) return ps_err_set(err, PS_ERR_IO, "log file %s: %s", path, strerror(errno));
    fflush(stderr);
    if (dup2(fd, STDERR_FILENO) < 0) {
        int e = errno;
        close(fd);
        return ps_err_set(err, PS_ERR_IO, "log file %s: dup2: %s", path, strerror(e));
    }
    close(fd);
    return PS_OK;
}

int ps_daemon_use_journal_if_attached(void) {
    const char *js = getenv("JOURNAL_STREAM");
    if (!js) return 0;
    unsigned long long dev, ino;
    char tail;
    if (sscanf(js, "%llu:%llu%c", &dev, &ino, &tail) != 2) return 0;
    struct stat sb;
    if (fstat(STDERR_FILENO, &sb) != 0 || (unsigned long long)sb.st_dev != dev ||
        (unsigned long long)sb.st_ino != ino)
        return 0;
    ps_log_set_syslog_prefix(1);
    return 1;
}

void ps_daemon_notify(const char *state) {
    if (!getenv("NOTIFY_SOCKET")) return;
    int r = sd_notify(0, state);
    if (r < 0) ps_log(PS_LOG_WARN, "sd_notify(%s): %s", state, strerror(-r));
}

/* The directory a new file at path goes into ("." for a bare name, "/" at
 * the root) into dir; -1 when it does not fit in cap. */
static int parent_dir(const char *path, char *dir, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, cap, ".");
    else if (slash == path) snprintf(dir, cap, "/");
    else if ((size_t)(slash - path) < cap) snprintf(dir, cap, "%.*s", (int)(slash - path), path);
    else return -1;
    return 0;
}

/* gRPC's "unix:PATH" (or "unix://PATH"): gRPC removes a socket left at PATH
 * and binds a new one there, in a directory that must exist. */
static int explain_unix(const char *addr, char *buf, size_t cap) {
    const char *path = addr + 5;
    if (!strncmp(path, "//", 2)) path += 2;
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!*path || (slash && slash[1] == '\0')) {
        snprintf(buf, cap, "'%.200s' names no socket file (unix:PATH)", addr);
        return EINVAL;
    }
    size_t max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
    if (strlen(path) > max) {  /* gRPC would only say it cannot listen */
        snprintf(buf, cap, "the socket path %.64s... is %zu bytes; a unix socket path holds at most %zu", path,
                 strlen(path), max);
        return ENAMETOOLONG;
    }
    if (parent_dir(path, dir, sizeof dir) != 0) {
        snprintf(buf, cap, "'%.64s...': path too long", addr);
        return EINVAL;
    }
    struct stat sb;
    int e = 0;
    if (stat(dir, &sb) != 0) e = errno;
    else if (!S_ISDIR(sb.st_mode)) e = ENOTDIR;
    else if (access(dir, W_OK | X_OK) != 0) e = errno;
    if (e) {
        snprintf(buf, cap, "cannot create the socket %s: directory %s: %s", path, dir, strerror(e));
        return e;
    }
    if (lstat(path, &sb) == 0 && !S_ISSOCK(sb.st_mode)) {
        snprintf(buf, cap, "%s exists and is not a socket", path);
        return EEXIST;
    }
    return 0;
}

int ps_daemon_explain_bind(const char *addr, char *buf, size_t cap) {
    buf[0] = '\0';
    if (!strncmp(addr, "unix:", 5)) return explain_unix(addr, buf, cap);
    if (strchr(addr, '/') || !strncmp(addr, "unix-abstract:", 14) ||
        !strncmp(addr, "dns:", 4) || !strncmp(addr, "ipv4:", 5) || !strncmp(addr, "ipv6:", 5))
        return 0;
    const char *colon = strrchr(addr, ':');
    if (!colon || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
        (addr[0] == '[' && colon[-1] != ']')) {  /* "host", "host:", "[::1]" */
        snprintf(buf, cap, "'%.200s' is not HOST:PORT (PORT a number)", addr);
        return EINVAL;
    }
    char host[256];
    size_t hl = (size_t)(colon - addr);
    if (hl >= sizeof host) {
        snprintf(buf, cap, "'%.64s...': the host is longer than %zu characters", addr, sizeof host - 1);
        return EINVAL;
    }
    memcpy(host, addr, hl);
    host[hl] = '\0';
    if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gr = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &res);
    if (gr != 0) {
        snprintf(buf, cap, "cannot resolve '%s': %s", host, gai_strerror(gr));
        return EINVAL;
    }
    int why = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        /* As gRPC binds: SO_REUSEADDR, so connections of a psd that just
         * stopped (TIME_WAIT) do not count, while a listener still does. */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        int rc = bind(fd, a->ai_addr, a->ai_addrlen), e = errno;
        close(fd);
        if (rc == 0) continue;
        why = e;
        if (e == EADDRINUSE)
            snprintf(buf, cap, "%s is already in use: another process listens there (another psd?)", addr);
        else if (e == EADDRNOTAVAIL)
            snprintf(buf, cap, "%s is not an address of this machine", addr);
        else if (e == EACCES)
            snprintf(buf, cap, "%s: permission denied (ports below 1024 need privileges)", addr);
        else
            snprintf(buf, cap, "%s: %s", addr, strerror(e));
        break;
    }
    freeaddrinfo(res);
    return why;
}

ps_status ps_daemon_check_log(const char *path, ps_err *err) {
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "log file %s: is a directory", path);
        if (access(path, W_OK) != 0)
            return ps_err_set(err, PS_ERR_PERMISSION_DENIED, "log file %s: not writable by this user: %s", path,
                              strerror(errno));
        return PS_OK;
    }
    if (errno != ENOENT) return ps_err_set(err, PS_ERR_IO, "log file %s: %s", path, strerror(errno));
    /* to be created: its directory must exist and take a new file */
    char dir[4096];
    if (parent_dir(path, dir, sizeof dir) != 0)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "log file %.64s...: path too long", path);
    if (stat(dir, &sb) != 0)
        return ps_err_set(err, PS_ERR_IO, "log file %s: directory %s: %s", path, dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "log file %s: %s is not a directory", path, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return ps_err_set(err, PS_ERR_PERMISSION_DENIED, "log file %s: cannot create it in %s: %s", path, dir,
                          strerror(errno));
    return PS_OK;
}

int ps_ckpt_sched_due(const ps_ckpt_sched *s, uint64_t version, double now) {
    if (version == s->last_version) return 0;
    const ps_ckpt_opts *o = s->opts;
    if (o->every_steps > 0 && version - s->last_version >= (uint64_t)o->every_steps) return 1;
    return o->every_s > 0 && now - s->last_time >= o->every_s;
}

void ps_ckpt_sched_done(ps_ckpt_sched *s, uint64_t version, double now) {
    s->last_version = version;
    s->last_time = now;
}
