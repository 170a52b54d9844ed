/* checkpoint_dir.c - psd's checkpoint directory (checkpoint.h): creating
 * it, one server per directory (the lock file), the checkpoints' file names,
 * keeping the newest few, and restoring the newest one that loads. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "log.h"

/* What --check-config creates, and removes at once, to learn whether
 * start-up could create there (mkdtemp/mkstemp fill in the X's). */
#define PROBE_NAME ".psd-check-XXXXXX"

ps_status ps_ckpt_prepare_dir(const char *dir, ps_err *err) {
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno != ENOENT)
            return ps_err_set(err, PS_ERR_IO, "checkpoint dir %s: %s", dir, strerror(errno));
        /* mkdir -p: a cluster's parts live in server.checkpoint_dir/<name>,
         * and neither level need exist yet */
        char path[4096];
        if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "checkpoint dir %s: path too long", dir);
        for (char *p = path + 1; ; p++) {
            if (*p != '/' && *p != '\0') continue;
            char c = *p;
            *p = '\0';
            if (mkdir(path, 0750) != 0 && errno != EEXIST)
                return ps_err_set(err, PS_ERR_IO, "checkpoint dir %s: cannot create %s: %s", dir, path,
                                  strerror(errno));
            *p = c;
            if (!c) break;
        }
        ps_log(PS_LOG_INFO, "created checkpoint dir %s", dir);
        return PS_OK;
    }
    if (!S_ISDIR(sb.st_mode))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "checkpoint dir %s: not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return ps_err_set(err, PS_ERR_PERMISSION_DENIED, "checkpoint dir %s: not writable: %s", dir,
                          strerror(errno));
    return PS_OK;
}

ps_status ps_ckpt_check_create(const char *dir, ps_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "checkpoint dir %s: path too long", dir);
    struct stat sb;
    for (;;) {
        char *slash = strrchr(path, '/');
        while (slash && slash > path && slash[1] == '\0') {  /* "a/b/" */
            *slash = '\0';
            slash = strrchr(path, '/');
        }
        if (!slash) snprintf(path, sizeof path, ".");
        else if (slash == path) path[1] = '\0';
        else *slash = '\0';
        if (stat(path, &sb) == 0) break;
        if (errno != ENOENT || !slash || slash == path)
            return ps_err_set(err, PS_ERR_IO, "checkpoint dir %s: cannot create it: %s: %s", dir, path,
                              strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "checkpoint dir %s: cannot create it: %s is not a directory",
                          dir, path);
    if (access(path, W_OK | X_OK) != 0)
        return ps_err_set(err, PS_ERR_PERMISSION_DENIED, "checkpoint dir %s: cannot create it in %s: %s", dir, path,
                          strerror(errno));
    /* access() is not the last word (root, procfs, sysfs, some network file
     * systems): create a directory where start-up would, and remove it */
    char probe[4096 + 32];
    snprintf(probe, sizeof probe, "%s%s" PROBE_NAME, path, path[strlen(path) - 1] == '/' ? "" : "/");
    if (!mkdtemp(probe))
        return ps_err_set(err, PS_ERR_PERMISSION_DENIED, "checkpoint dir %s: cannot create it in %s: %s", dir, path,
                          strerror(errno));
    if (rmdir(probe) != 0)
        ps_log(PS_LOG_WARN, "checkpoint dir %s: cannot remove the probe directory %s: %s", dir, probe, strerror(errno));
    return PS_OK;
}

ps_status ps_ckpt_check_writable(const char *dir, ps_err *err) {
    char probe[PS_CKPT_PATH_MAX];
    if (snprintf(probe, sizeof probe, "%s/" PROBE_NAME, dir) >= (int)sizeof probe)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "checkpoint dir %s: path too long", dir);
    int fd = mkstemp(probe);
    if (fd < 0)
        return ps_err_set(err, PS_ERR_PERMISSION_DENIED, "checkpoint dir %s: cannot create files in it: %s", dir,
                          strerror(errno));
    close(fd);
    if (unlink(probe) != 0)
        ps_log(PS_LOG_WARN, "checkpoint dir %s: cannot remove the probe file %s: %s", dir, probe, strerror(errno));
    return PS_OK;
}

/* ---- one server per directory: the lock file */

#define LOCK_NAME "psd.lock"

/* The identity a lock file names: "cluster NAME" and "server NAME" lines
 * (server "" = the single-server form). 0 when the file holds none. */
static int lock_ident(int fd, char *cluster, char *server, char *who, size_t n) {
    char buf[1024];
    ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
    if (got <= 0) return 0;
    buf[got] = 0;
    int have = 0;
    cluster[0] = server[0] = who[0] = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "cluster ", 8)) snprintf(cluster, n, "%s", line + 8), have |= 1;
        else if (!strncmp(line, "server ", 7)) snprintf(server, n, "%s", line + 7), have |= 2;
        else if (!strncmp(line, "server", 7)) server[0] = 0, have |= 2;   /* "server" alone: single-server */
        else if (!strncmp(line, "by ", 3)) snprintf(who, n, "%s", line + 3);
    }
    return have == 3;
}

static const char *ident_name(const char *server) { return *server ? server : "(single-server form)"; }

/* Opens dir's lock file and checks whose it is; *fd open on success. With
 * take, also locks it (flock, exclusive) and writes this identity. */
static ps_status lock_open(const char *dir, const ps_ckpt_ident *id, int take, int *fd, ps_err *err) {
    static const ps_ckpt_ident single_id = {"psd", ""};
    if (!id) id = &single_id;
    const char *mycl = id->cluster ? id->cluster : "", *mysv = id->server ? id->server : "";
    char path[PS_CKPT_PATH_MAX];
    snprintf(path, sizeof path, "%s/" LOCK_NAME, dir);
    *fd = open(path, take ? O_RDWR | O_CREAT | O_CLOEXEC : O_RDONLY | O_CLOEXEC, 0640);
    if (*fd < 0) {
        if (!take && errno == ENOENT) return PS_OK;
        return ps_err_set(err, PS_ERR_IO, "checkpoint dir %s: cannot open its lock file %s: %s", dir, path,
                          strerror(errno));
    }
    char cl[256], sv[256], who[256];
    int named = lock_ident(*fd, cl, sv, who, sizeof cl);
    if (named && (strcmp(cl, mycl) || strcmp(sv, mysv))) {
        close(*fd);
        *fd = -1;
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "checkpoint dir %s belongs to server %s of cluster %s "
                          "(%s names it%s%s); this psd is server %s of cluster %s: give each server its own "
                          "directory (servers.<name>.checkpoint_dir), or remove the lock file if that server is "
                          "gone for good", dir, ident_name(sv), cl, path, who[0] ? ", written by " : "", who,
                          ident_name(mysv), mycl);
    }
    if (flock(*fd, (take ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        if (e == EWOULDBLOCK) {  /* its holder may have written its names meanwhile */
            int rfd = open(path, O_RDONLY | O_CLOEXEC);
            if (rfd >= 0 && lock_ident(rfd, cl, sv, who, sizeof cl)) mycl = cl, mysv = sv;
            if (rfd >= 0) close(rfd);
            return ps_err_set(err, PS_ERR_UNAVAILABLE, "checkpoint dir %s is in use by a running psd (server %s of "
                              "cluster %s%s%s): one psd per directory", dir, ident_name(mysv), mycl,
                              who[0] ? ", " : "", who);
        }
        return ps_err_set(err, PS_ERR_IO, "checkpoint dir %s: cannot lock %s: %s", dir, path, strerror(e));
    }
    if (!take) return PS_OK;
    char host[256] = "?", text[1024];
    gethostname(host, sizeof host - 1);
    int len = snprintf(text, sizeof text, "# psd: this directory holds the checkpoints of one server\ncluster %s\n"
                       "server %s\nby %s pid %ld\n", mycl, mysv, host, (long)getpid());
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, text, (size_t)len, 0) != len || fsync(*fd) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return ps_err_set(err, PS_ERR_IO, "checkpoint dir %s: cannot write %s: %s", dir, path, strerror(e));
    }
    return PS_OK;
}

ps_status ps_ckpt_lock_dir(const char *dir, const ps_ckpt_ident *id, int *fd, ps_err *err) {
    return lock_open(dir, id, 1, fd, err);
}

ps_status ps_ckpt_check_lock(const char *dir, const ps_ckpt_ident *id, ps_err *err) {
    int fd = -1;
    ps_status st = lock_open(dir, id, 0, &fd, err);
    if (fd >= 0) close(fd);
    return st;
}

void ps_ckpt_unlock_dir(int fd) {
    if (fd >= 0) close(fd);  /* closing drops the flock */
}

/* ---- the files: names, listing, retention */

/* "ckpt-000000001234.safetensors" -> 1234; -1 for any other name. At
 * least 12 digits (the "%012" padding), more for versions from 10^12 on. */
static int ckpt_parse_name(const char *name, const char *suffix, uint64_t *version) {
    size_t pl = strlen(CKPT_PREFIX), sl = strlen(suffix), n = strlen(name);
    if (n < pl + 12 + sl || n > pl + 20 + sl || strncmp(name, CKPT_PREFIX, pl) || strcmp(name + n - sl, suffix))
        return -1;
    uint64_t v = 0;
    for (size_t i = pl; i < n - sl; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        uint64_t d = (uint64_t)(name[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    if (n - sl - pl > 12 && name[pl] == '0') return -1;  /* padded beyond 12: not a name psd writes */
    *version = v;
    return 0;
}

/* Delete ckpt-*.tmp files: writes that a crash cut between write and
 * rename (psd renames a finished file over its final name, so a .tmp is
 * never a checkpoint). Called at start-up, before anything is written. */
static void ckpt_clean_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    size_t pl = strlen(CKPT_PREFIX);
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n <= pl + 4 || strncmp(e->d_name, CKPT_PREFIX, pl) || strcmp(e->d_name + n - 4, ".tmp")) continue;
        char path[PS_CKPT_PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0) ps_log(PS_LOG_WARN, "deleted %s, an unfinished checkpoint write", path);
    }
    closedir(d);
}

static int cmp_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Versions of the files in dir named ckpt-<N><suffix>, newest first.
 * *out is malloc'ed (free it); returns the count, or -1 with err set. */
static long ckpt_list_versions(const char *dir, const char *suffix, uint64_t **out, ps_err *err) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) {
        ps_err_set(err, PS_ERR_IO, "checkpoint dir %s: %s", dir, strerror(errno));
        return -1;
    }
    size_t n = 0, cap = 0;
    uint64_t *v = NULL;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t ver;
        if (ckpt_parse_name(e->d_name, suffix, &ver)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) {
                free(v);
                closedir(d);
                ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
                return -1;
            }
            v = nv;
        }
        v[n++] = ver;
    }
    closedir(d);
    if (n) qsort(v, n, sizeof *v, cmp_desc);
    *out = v;
    return (long)n;
}

void ckpt_file_path(char *buf, size_t cap, const char *dir, uint64_t version, const char *suffix) {
    snprintf(buf, cap, "%s/" CKPT_PREFIX "%012" PRIu64 "%s", dir, version, suffix);
}

/* Delete all but the keep newest checkpoints, and optimizer files older
 * than the oldest one kept that lost their weights file. */
void ckpt_retain(const char *dir, int keep) {
    uint64_t *v = NULL, *o = NULL;
    long n = ckpt_list_versions(dir, CKPT_SUFFIX, &v, NULL);
    long no = ckpt_list_versions(dir, OPTIM_SUFFIX, &o, NULL);
    char path[PS_CKPT_PATH_MAX];
    for (long i = keep; i < n; i++) {
        ckpt_file_path(path, sizeof path, dir, v[i], CKPT_SUFFIX);
        if (unlink(path) != 0 && errno != ENOENT)
            ps_log(PS_LOG_WARN, "cannot delete old checkpoint %s: %s", path, strerror(errno));
        ckpt_file_path(path, sizeof path, dir, v[i], OPTIM_SUFFIX);
        if (unlink(path) != 0 && errno != ENOENT)
            ps_log(PS_LOG_WARN, "cannot delete old checkpoint %s: %s", path, strerror(errno));
    }
    if (n > 0) {
        uint64_t oldest_kept = v[n < keep ? n - 1 : keep - 1];
        for (long i = 0; i < no; i++) {
            if (o[i] >= oldest_kept) continue;
            ckpt_file_path(path, sizeof path, dir, o[i], OPTIM_SUFFIX);
            unlink(path);
        }
    }
    free(v);
    free(o);
}

/* ---- the newest good one */

ps_status ps_ckpt_restore_latest(ps_model *m, const char *dir, int *found, ps_ckpt_info *out, ps_err *err) {
    return ps_ckpt_restore_latest_part(m, dir, NULL, found, out, err);
}

ps_status ps_ckpt_restore_latest_part(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found,
                                      ps_ckpt_info *out, ps_err *err) {
    return ps_ckpt_restore_latest_with(m, dir, id, found, out, NULL, err);
}

/* The newest checkpoint of dir that loads; dry: change nothing on disk. */
static ps_status restore_latest(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found, int *refused,
                                ps_ckpt_info *out, ps_ckpt_settle *settle, int dry, ps_err *err) {
    *found = 0;
    *refused = 0;
    uint64_t *v = NULL;
    if (!dry) ckpt_clean_tmp(dir);
    long n = ckpt_list_versions(dir, CKPT_SUFFIX, &v, err);
    if (n < 0) return err ? err->code : PS_ERR_IO;
    if (n == 0) { free(v); return PS_OK; }
    ps_status rc = PS_OK;
    char first_reason[PS_ERR_MSG_MAX] = "";
    long i;
    for (i = 0; i < n; i++) {
        char path[PS_CKPT_PATH_MAX];
        ckpt_file_path(path, sizeof path, dir, v[i], CKPT_SUFFIX);
        ps_err e = {0};
        if (ps_ckpt_load_with(m, path, id, out, settle, &e) == PS_OK) break;
        if (!dry) ps_log(PS_LOG_WARN, "checkpoint refused: %s", e.msg);
        if (!first_reason[0]) snprintf(first_reason, sizeof first_reason, "%s", e.msg);
    }
    if (i == n) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: none of the %ld checkpoints can be used (newest: %s); move "
                        "them away to start from scratch", dir, n, first_reason);
    } else {
        *found = 1;
        *refused = (int)i;
        /* Newer ones were refused: rename them so they stop shadowing this one. */
        for (long j = 0; j < i && !dry; j++) {
            for (int k = 0; k < 2; k++) {
                char path[PS_CKPT_PATH_MAX], to[PS_CKPT_PATH_MAX + 8];
                ckpt_file_path(path, sizeof path, dir, v[j], k ? OPTIM_SUFFIX : CKPT_SUFFIX);
                snprintf(to, sizeof to, "%s.refused", path);
                if (rename(path, to) == 0 && !k) ps_log(PS_LOG_WARN, "renamed %s to %s", path, to);
            }
        }
    }
    free(v);
    return rc;
}

ps_status ps_ckpt_restore_latest_with(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found,
                                      ps_ckpt_info *out, ps_ckpt_settle *settle, ps_err *err) {
    int refused;
    return restore_latest(m, dir, id, found, &refused, out, settle, 0, err);
}

ps_status ps_ckpt_check_restore(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found, int *refused,
                                ps_ckpt_info *out, ps_err *err) {
    return restore_latest(m, dir, id, found, refused, out, NULL, 1, err);
}
