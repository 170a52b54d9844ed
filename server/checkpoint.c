/* checkpoint.c - psd's checkpoints: write the model and optimizer state
 * as safetensors (atomically, keeping the newest few), find and load the
 * newest good one, refuse a broken or mismatched file by name (checkpoint.h). */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "dims.h"
#include "log.h"
#include "safetensors.h"

#define CKPT_PREFIX "ckpt-"
#define CKPT_SUFFIX ".safetensors"
#define OPTIM_SUFFIX ".optim.safetensors"

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

/* ---- one server per directory: the lock file ------------------------------ */

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

/* CRC-32 of the parameters' data in parameter order. */
static uint32_t crc_of(const void *const *data, const size_t *bytes, int n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < n; i++) {
        const unsigned char *p = (const unsigned char *)data[i];
        size_t left = bytes[i];
        while (left) {  /* crc32 takes a uInt length */
            uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
            crc = crc32(crc, p, chunk);
            p += chunk;
            left -= chunk;
        }
    }
    return (uint32_t)crc;
}

/* "ckpt-000000001234.safetensors" -> 1234; -1 for any other name. At
 * least 12 digits (the "%012" padding), more for versions from 10^12 on. */
static int parse_name(const char *name, const char *suffix, uint64_t *version) {
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
static void clean_tmp(const char *dir) {
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
static long list_versions(const char *dir, const char *suffix, uint64_t **out, ps_err *err) {
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
        if (parse_name(e->d_name, suffix, &ver)) continue;
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

static void file_path(char *buf, size_t cap, const char *dir, uint64_t version, const char *suffix) {
    snprintf(buf, cap, "%s/" CKPT_PREFIX "%012" PRIu64 "%s", dir, version, suffix);
}

/* Delete all but the keep newest checkpoints, and optimizer files older
 * than the oldest one kept that lost their weights file. */
static void retain(const char *dir, int keep) {
    uint64_t *v = NULL, *o = NULL;
    long n = list_versions(dir, CKPT_SUFFIX, &v, NULL);
    long no = list_versions(dir, OPTIM_SUFFIX, &o, NULL);
    char path[PS_CKPT_PATH_MAX];
    for (long i = keep; i < n; i++) {
        file_path(path, sizeof path, dir, v[i], CKPT_SUFFIX);
        if (unlink(path) != 0 && errno != ENOENT)
            ps_log(PS_LOG_WARN, "cannot delete old checkpoint %s: %s", path, strerror(errno));
        file_path(path, sizeof path, dir, v[i], OPTIM_SUFFIX);
        if (unlink(path) != 0 && errno != ENOENT)
            ps_log(PS_LOG_WARN, "cannot delete old checkpoint %s: %s", path, strerror(errno));
    }
    if (n > 0) {
        uint64_t oldest_kept = v[n < keep ? n - 1 : keep - 1];
        for (long i = 0; i < no; i++) {
            if (o[i] >= oldest_kept) continue;
            file_path(path, sizeof path, dir, o[i], OPTIM_SUFFIX);
            unlink(path);
        }
    }
    free(v);
    free(o);
}

static const ps_ckpt_ident single = {"psd", ""};

/* psd.params: every parameter of the model's definition (hosted here or
 * not), "<name>@<stage>:<d0>,<d1>,..." with ":shard" for a table that may be
 * split by rows, joined by ';' - what ps-ckpt merge checks the parts
 * against. NULL when out of memory. */
static char *params_meta(ps_model *m) {
    size_t cap = 256, o = 0;
    int n = ps_model_num_def_params(m);
    for (int i = 0; i < n; i++) cap += strlen(ps_model_def_param(m, i)->name) + 160;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        const ps_param_info *pi = ps_model_def_param(m, i);
        o += (size_t)snprintf(buf + o, cap - o, "%s%s@%s:", i ? ";" : "", pi->name, pi->stage ? pi->stage : "");
        for (int d = 0; d < pi->ndim; d++) o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, d ? "," : "", pi->dims[d]);
        if (pi->sparse) o += (size_t)snprintf(buf + o, cap - o, ":shard");
    }
    return buf;
}

/* Metadata of a part: psd.cluster, psd.server, psd.hosted and
 * psd.rows.<param> of shards, appended to kv (key, value pairs) from
 * index *n; the strings live in buf (cap bytes). 0 when it does not fit. */
static int part_meta(ps_model *m, const ps_ckpt_ident *id, const char **kv, int *n, int max, char *buf,
                     size_t cap) {
    size_t o = 0;
    kv[(*n)++] = "psd.cluster";
    kv[(*n)++] = id->cluster ? id->cluster : "";
    kv[(*n)++] = "psd.server";
    kv[(*n)++] = id->server ? id->server : "";
    kv[(*n)++] = "psd.hosted";
    kv[(*n)++] = buf;
    for (int s = 0; s < ps_model_num_stages(m) && o < cap; s++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", s ? "," : "", ps_model_stage(m, s)->name);
    if (o++ >= cap) return 0;
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        if (!pi->rows_total) continue;
        if (*n + 2 > max) return 0;
        kv[(*n)++] = buf + o;
        o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, "psd.rows.%s", pi->name) + 1;
        kv[(*n)++] = buf + o;
        o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, "%" PRId64 ",%" PRId64 ",%" PRId64, pi->row_offset,
                              pi->row_offset + pi->dims[0], pi->rows_total) + 1;
        if (o > cap) return 0;
    }
    return 1;
}

/* ---- the finished-context records (psd.settle) ---------------------------- */

void ps_ckpt_settle_free(ps_ckpt_settle *s) {
    if (!s) return;
    free(s->rec);
    *s = (ps_ckpt_settle){0};
}

/* "<id, 16 hex>:<version>[s|d]" separated by single spaces, oldest first;
 * NULL when out of memory. */
static char *settle_encode(const ps_ctx_finished *r, size_t n) {
    size_t cap = n * 40 + 1, o = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    buf[0] = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%016" PRIx64 ":%" PRIu64 "%s", i ? " " : "", r[i].id,
                              r[i].version, r[i].how == PS_CTX_SKIPPED ? "s" : r[i].how == PS_CTX_DROPPED ? "d" : "");
    return buf;
}

/* Strictly the format above; every version <= max_version, at most
 * PS_CKPT_SETTLE_MAX records. */
static ps_status settle_decode(const char *path, const char *s, uint64_t max_version, ps_ckpt_settle *out,
                               ps_err *err) {
    size_t n = *s ? 1 : 0;
    for (const char *p = s; *p; p++) n += *p == ' ';
    if (n > PS_CKPT_SETTLE_MAX)
        return ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.settle holds %zu records (at most %d)", path, n,
                          PS_CKPT_SETTLE_MAX);
    ps_ctx_finished *r = n ? malloc(n * sizeof *r) : NULL;
    if (n && !r) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "%s: out of memory reading psd.settle", path);
    const char *p = s;
    for (size_t i = 0; i < n; i++) {
        char *end;
        size_t hex = strspn(p, "0123456789abcdef");
        if (hex != 16 || p[16] != ':' || p[17] < '0' || p[17] > '9') goto bad;
        r[i].id = strtoull(p, NULL, 16);
        errno = 0;
        r[i].version = strtoull(p + 17, &end, 10);
        if (errno || end - (p + 17) > 20 || r[i].version > max_version) goto bad;
        r[i].how = *end == 's' ? PS_CTX_SKIPPED : *end == 'd' ? PS_CTX_DROPPED : PS_CTX_APPLIED;
        if (*end == 's' || *end == 'd') end++;
        if (i + 1 < n ? *end != ' ' : *end != '\0') goto bad;
        p = end + 1;
        continue;
    bad:
        free(r);
        return ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.settle: record %zu is not <16 hex digits>:<version "
                          "<= %" PRIu64 ">[s|d]", path, i, max_version);
    }
    out->rec = r;
    out->n = n;
    return PS_OK;
}

ps_status ps_ckpt_save(ps_model *m, const char *dir, uint64_t samples, int keep, ps_ckpt_info *out,
                       ps_err *err) {
    return ps_ckpt_save_part(m, dir, NULL, samples, keep, out, err);
}

ps_status ps_ckpt_save_part(ps_model *m, const char *dir, const ps_ckpt_ident *id, uint64_t samples, int keep,
                            ps_ckpt_info *out, ps_err *err) {
    ps_ckpt_save_opts o = {.id = id, .samples = samples, .keep = keep};
    return ps_ckpt_save_with(m, dir, &o, out, err);
}

ps_status ps_ckpt_save_with(ps_model *m, const char *dir, const ps_ckpt_save_opts *so, ps_ckpt_info *out,
                            ps_err *err) {
    const ps_ckpt_ident *id = so->id ? so->id : &single;
    uint64_t samples = so->samples;
    int keep = so->keep;
    PS_ASSERT(keep >= 1);
    char *settle = NULL, *params = NULL;
    int np = ps_model_num_params(m);
    int64_t nw = ps_model_num_weights(m);
    const ps_optim_spec *spec = ps_model_optim(m);
    const int ns = ps_optim_num_state(spec);
    int nb = ps_model_num_buffers(m);
    float *w = malloc((size_t)nw * sizeof(float));
    float *sb[PS_OPTIM_MAX_STATE] = {0};   /* state buffer j of every parameter, laid out as w */
    int64_t *steps = calloc((size_t)np + 1, sizeof *steps);
    ps_st_tensor *t = calloc((size_t)(np + nb) + 1, sizeof *t);
    const void **ptrs = calloc((size_t)(np + nb) + 1, sizeof *ptrs);
    size_t *numel = calloc((size_t)(np + nb) + 1, sizeof *numel);   /* bytes of each tensor, for the CRC */
    ps_ckpt_optim_param *op = calloc((size_t)np + 1, sizeof *op);
    void **bufs = calloc((size_t)nb + 1, sizeof *bufs);   /* the buffers (BatchNorm's running statistics) */
    ps_status rc = PS_OK;
    int have = bufs != NULL;
    for (int j = 0; j < ns; j++) have &= (sb[j] = malloc((size_t)nw * sizeof(float))) != NULL;
    for (int b = 0; have && b < nb; b++) {
        const ps_buffer_info *bi = ps_model_buffer(m, b);
        have &= (bufs[b] = malloc((size_t)bi->numel * ps_dtype_size(bi->dtype) + 1)) != NULL;
    }
    if (!w || !have || !steps || !t || !ptrs || !numel || !op) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "checkpoint: out of memory");
        goto done;
    }
    /* Weights, steps, state and buffers under one shared weights lock: consistent.
     * With the contexts' records: no step between its update and its record
     * meanwhile, so the records are exactly the steps the snapshot holds. */
    uint64_t version, applied = 0;
    if (so->contexts) ps_ctx_table_freeze(so->contexts);
    rc = ps_model_snapshot_ex(m, w, steps, sb, bufs, &version, err);
    ps_ctx_finished *rec = NULL;
    size_t nrec = 0;
    if (!rc && so->contexts) nrec = ps_ctx_table_export(so->contexts, version, PS_CKPT_SETTLE_MAX, &rec, &applied);
    if (so->contexts) ps_ctx_table_thaw(so->contexts);
    if (rc) goto done;
    if (so->contexts) {
        settle = settle_encode(rec, nrec);
        free(rec);
        if (!settle) {
            rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "checkpoint: out of memory for the settle records");
            goto done;
        }
    }

    char wpath[PS_CKPT_PATH_MAX], opath[PS_CKPT_PATH_MAX], oname[64], vbuf[32], sbuf[32], tbuf[32],
        crcbuf[16];
    file_path(wpath, sizeof wpath, dir, version, CKPT_SUFFIX);
    file_path(opath, sizeof opath, dir, version, OPTIM_SUFFIX);
    snprintf(oname, sizeof oname, CKPT_PREFIX "%012" PRIu64 OPTIM_SUFFIX, version);
    snprintf(vbuf, sizeof vbuf, "%" PRIu64, version);
    snprintf(sbuf, sizeof sbuf, "%" PRIu64, samples);
    double now = (double)time(NULL);
    snprintf(tbuf, sizeof tbuf, "%.0f", now);

    /* The optimizer file first: the weights file marks a complete pair.
     * A parameter's state exists once it took a step (PyTorch's rule). */
    int64_t off = 0;
    for (int i = 0; i < np; i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        ps_ckpt_optim_param *q = &op[i];
        q->name = pi->name;
        q->ndim = pi->ndim;
        memcpy(q->dims, pi->dims, sizeof q->dims);
        q->numel = pi->numel;
        q->step = steps[i];
        for (int j = 0; j < ns; j++) q->state[j] = steps[i] > 0 ? sb[j] + off : NULL;
        off += pi->numel;
    }
    const ps_ckpt_optim o = { spec->kind, np, op };
    if ((rc = ps_ckpt_optim_write(opath, &o, ps_model_arch(m), version, err))) goto done;

    off = 0;
    for (int i = 0; i < np; i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        ps_st_tensor *x = &t[i];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", pi->name);
        x->dtype = PS_ST_F32;
        x->ndim = pi->ndim;
        memcpy(x->dims, pi->dims, (size_t)pi->ndim * sizeof x->dims[0]);
        x->data = w + off;
        x->bytes = (size_t)pi->numel * sizeof(float);
        ptrs[i] = w + off;
        numel[i] = x->bytes;
        off += pi->numel;
    }
    for (int b = 0; b < nb; b++) {   /* buffers after the parameters, under their state_dict names */
        const ps_buffer_info *bi = ps_model_buffer(m, b);
        ps_st_tensor *x = &t[np + b];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", bi->name);
        x->dtype = bi->dtype == PS_DTYPE_I64 ? PS_ST_I64 : PS_ST_F32;
        x->ndim = bi->ndim;
        memcpy(x->dims, bi->dims, (size_t)bi->ndim * sizeof x->dims[0]);
        x->data = bufs[b];
        x->bytes = (size_t)bi->numel * ps_dtype_size(bi->dtype);
        ptrs[np + b] = bufs[b];
        numel[np + b] = x->bytes;
    }
    snprintf(crcbuf, sizeof crcbuf, "%08" PRIx32, crc_of(ptrs, numel, np + nb));
    const char *wmeta[72] = {"format", "pt",
                             "psd.arch", ps_model_arch(m),
                             "psd.model_version", vbuf,
                             "psd.global_step", vbuf,
                             "psd.samples", sbuf,
                             "psd.time", tbuf,
                             "psd.version", PS_VERSION,
                             "psd.optimizer", ps_optim_kind_name(o.kind),
                             "psd.optimizer_file", oname,
                             "psd.crc32", crcbuf};
    int nmeta = 20;
    char abuf[32];
    if (settle) {  /* the steps this snapshot holds, for settling after a restart */
        snprintf(abuf, sizeof abuf, "%" PRIu64, applied);
        wmeta[nmeta++] = "psd.contexts_applied";
        wmeta[nmeta++] = abuf;
        wmeta[nmeta++] = "psd.settle";
        wmeta[nmeta++] = settle;
    }
    if (!(params = params_meta(m))) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "checkpoint: out of memory");
        goto done;
    }
    wmeta[nmeta++] = "psd.params";
    wmeta[nmeta++] = params;
    char pbuf[2048];
    PS_ASSERT(part_meta(m, id, wmeta, &nmeta, 70, pbuf, sizeof pbuf) && "part metadata fits");
    wmeta[nmeta] = NULL;
    if ((rc = ps_st_write(wpath, t, (size_t)(np + nb), wmeta, err))) goto done;
    if (out) {
        out->version = version;
        out->samples = samples;
        out->time = now;
        snprintf(out->path, sizeof out->path, "%s", wpath);
    }
    retain(dir, keep);
done:
    free(settle);
    free(params);
    free(w);
    for (int j = 0; j < PS_OPTIM_MAX_STATE; j++) free(sb[j]);
    for (int b = 0; bufs && b < nb; b++) free(bufs[b]);
    free(bufs);
    free(steps);
    free(t);
    free(ptrs);
    free(numel);
    free(op);
    return rc;
}

/* Strict decimal uint64 from a metadata value. */
static int parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || s[strspn(s, "0123456789")] != '\0' || strlen(s) > 20) return -1;
    errno = 0;
    unsigned long long x = strtoull(s, NULL, 10);
    if (errno) return -1;
    *out = x;
    return 0;
}

/* Tensor t must be parameter pi: dtype (F32, or F64 when allow_f64) and shape. */
static ps_status check_tensor(const char *path, const ps_st_tensor *t, const ps_param_info *pi,
                              int allow_f64, ps_err *err) {
    if (t->dtype != PS_ST_F32 && !(allow_f64 && t->dtype == PS_ST_F64))
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has dtype %s; expected F32%s", path,
                          t->name, ps_st_dtype_name(t->dtype), allow_f64 ? " or F64" : "");
    int same = t->ndim == pi->ndim;
    for (int d = 0; same && d < pi->ndim; d++) same = t->dims[d] == pi->dims[d];
    if (!same) {
        char got[96], want[96];
        ps_dims_format(got, sizeof got, t->dims, t->ndim);
        ps_dims_format(want, sizeof want, pi->dims, pi->ndim);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has shape %s; the model's %s is %s",
                          path, t->name, got, pi->name, want);
    }
    int64_t n = ps_st_numel(t);
    for (int64_t j = 0; j < n; j++) {
        double x = t->dtype == PS_ST_F32 ? ((const float *)t->data)[j] : ((const double *)t->data)[j];
        if (!isfinite(x))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': element %" PRId64 " is %s", path,
                              t->name, j, isnan(x) ? "NaN" : "infinite");
    }
    return PS_OK;
}

/* Tensor t must be buffer bi: its dtype (F32, or I64 for counters) and
 * shape; float values finite. */
static ps_status check_buffer(const char *path, const ps_st_tensor *t, const ps_buffer_info *bi, ps_model *m,
                              ps_err *err) {
    char where[PS_ERR_MSG_MAX / 2];
    int want = bi->dtype == PS_DTYPE_I64 ? PS_ST_I64 : PS_ST_F32;
    if (t->dtype != want)
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has dtype %s; the buffer is %s (%s)", path,
                          t->name, ps_st_dtype_name(t->dtype), ps_st_dtype_name(want),
                          ps_model_where(m, bi->name, where, sizeof where));
    int same = t->ndim == bi->ndim;
    for (int d = 0; same && d < bi->ndim; d++) same = t->dims[d] == bi->dims[d];
    if (!same) {
        char got[96], shp[96];
        ps_dims_format(got, sizeof got, t->dims, t->ndim);
        ps_dims_format(shp, sizeof shp, bi->dims, bi->ndim);
        return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has shape %s; the model's %s is %s (%s)",
                          path, t->name, got, bi->name, shp, ps_model_where(m, bi->name, where, sizeof where));
    }
    for (int64_t j = 0, n = ps_st_numel(t); want == PS_ST_F32 && j < n; j++)
        if (!isfinite(((const float *)t->data)[j]))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s': element %" PRId64 " is not finite",
                              path, t->name, j);
    return PS_OK;
}

/* Every tensor of f is one of the model's parameters (with suffix). */
static ps_status check_no_extra(const char *path, const ps_st_file *f, ps_model *m, const char *suffix,
                                ps_err *err) {
    size_t sl = strlen(suffix);
    for (size_t i = 0; i < ps_st_count(f); i++) {
        const char *name = ps_st_get(f, i)->name;
        size_t n = strlen(name);
        char base[PS_ST_NAME_MAX];
        if (n < sl || strcmp(name + n - sl, suffix) || n - sl >= sizeof base)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: unexpected tensor '%s' (not a parameter of "
                              "model %s)", path, name, ps_model_arch(m));
        memcpy(base, name, n - sl);
        base[n - sl] = '\0';
        if (ps_model_find_param(m, base) < 0 && (sl || ps_model_find_buffer(m, base) < 0))
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: unexpected tensor '%s' (not a parameter of "
                              "model %s)", path, name, ps_model_arch(m));
    }
    return PS_OK;
}

/* The tensors' CRC against the file's psd.crc32 (tensors in list order). */
static ps_status check_crc(const char *path, const ps_st_file *f, const ps_st_tensor *const *ts, int n,
                           ps_err *err) {
    const char *want = ps_st_metadata(f, "psd.crc32");
    if (!want) return ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.crc32 is missing", path);
    const void **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    size_t *numel = calloc((size_t)n + 1, sizeof *numel);
    if (!ptrs || !numel) {
        free(ptrs);
        free(numel);
        return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        ptrs[i] = ts[i]->data;
        numel[i] = ts[i]->bytes;
    }
    char got[16];
    snprintf(got, sizeof got, "%08" PRIx32, crc_of(ptrs, numel, n));
    free(ptrs);
    free(numel);
    if (strcmp(got, want))
        return ps_err_set(err, PS_ERR_FORMAT, "%s: data is corrupt (CRC-32 %s, the file says %s)", path, got,
                          want);
    return PS_OK;
}

/* ---- optimizer state (generic over the kinds of optim.h) ---------------- */

static uLong crc_bytes(uLong crc, const void *data, size_t left) {
    const unsigned char *p = data;
    while (left) {  /* crc32 takes a uInt length */
        uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
        crc = crc32(crc, p, chunk);
        p += chunk;
        left -= chunk;
    }
    return crc;
}

/* "exp_avg,exp_avg_sq" */
static void state_list(ps_optim_kind kind, char *buf, size_t cap) {
    int n;
    const char *const *names = ps_optim_state_names(kind, &n);
    size_t o = 0;
    buf[0] = '\0';
    for (int j = 0; j < n && o < cap; j++) o += (size_t)snprintf(buf + o, cap - o, "%s%s", j ? "," : "", names[j]);
}

ps_status ps_ckpt_optim_write(const char *path, const ps_ckpt_optim *o, const char *arch, uint64_t version,
                              ps_err *err) {
    int ns;
    const char *const *snames = ps_optim_state_names(o->kind, &ns);
    if (!snames) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: optimizer kind %d unknown", path, (int)o->kind);
    ps_st_tensor *t = calloc((size_t)o->nparams * (PS_OPTIM_MAX_STATE + 1) + 1, sizeof *t);
    if (!t) return ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "checkpoint: out of memory");
    size_t n = 0;
    uLong crc = crc32(0L, Z_NULL, 0);
    ps_status rc = PS_OK;
    for (int i = 0; i < o->nparams && rc == PS_OK; i++) {
        const ps_ckpt_optim_param *q = &o->params[i];
        if (q->step <= 0) continue; /* no state yet, as in PyTorch */
        for (int j = 0; j <= ns; j++) {
            if (j < ns && !q->state[j]) continue;
            ps_st_tensor *x = &t[n];
            int len = snprintf(x->name, sizeof x->name, "%s.%s", q->name, j < ns ? snames[j] : "step");
            if (len < 0 || (size_t)len >= sizeof x->name) {
                rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor name '%s.%s' too long", path, q->name,
                                j < ns ? snames[j] : "step");
                break;
            }
            if (j < ns) {
                x->dtype = PS_ST_F32;
                x->ndim = q->ndim;
                memcpy(x->dims, q->dims, (size_t)q->ndim * sizeof x->dims[0]);
                x->data = q->state[j];
                x->bytes = (size_t)q->numel * sizeof(float);
            } else {
                x->dtype = PS_ST_I64; /* a scalar; PyTorch's Adam keeps state['step'] as a tensor too */
                x->ndim = 0;
                x->data = (void *)&q->step;
                x->bytes = sizeof q->step;
            }
            crc = crc_bytes(crc, x->data, x->bytes);
            n++;
        }
    }
    if (rc == PS_OK) {
        char vbuf[32], crcbuf[16], list[128];
        snprintf(vbuf, sizeof vbuf, "%" PRIu64, version);
        snprintf(crcbuf, sizeof crcbuf, "%08" PRIx32, (uint32_t)crc);
        state_list(o->kind, list, sizeof list);
        const char *meta[] = {"psd.arch", arch, "psd.model_version", vbuf,
                              "psd.optimizer", ps_optim_kind_name(o->kind), "psd.optim_state", list,
                              "psd.crc32", crcbuf, NULL};
        rc = ps_st_write(path, t, n, meta, err);
    }
    free(t);
    return rc;
}

/* The parameter and state index (ns = "step") a tensor name denotes, or -1. */
static int match_state(const ps_ckpt_optim *o, const char *const *snames, int ns, const char *name, int *j) {
    for (int i = 0; i < o->nparams; i++) {
        size_t pl = strlen(o->params[i].name);
        if (strncmp(name, o->params[i].name, pl) || name[pl] != '.') continue;
        const char *suffix = name + pl + 1;
        for (int k = 0; k <= ns; k++) {
            if (!strcmp(suffix, k < ns ? snames[k] : "step")) {
                *j = k;
                return i;
            }
        }
    }
    return -1;
}

static ps_status check_state_tensor(const char *path, const ps_st_tensor *t, const ps_ckpt_optim_param *q,
                                    ps_err *err) {
    ps_param_info pi = { .name = q->name, .ndim = q->ndim, .numel = q->numel };
    memcpy(pi.dims, q->dims, sizeof pi.dims);
    return check_tensor(path, t, &pi, 0, err);
}

ps_status ps_ckpt_optim_read(const char *path, ps_ckpt_optim *o, const char *arch, uint64_t version,
                             ps_err *err) {
    int ns;
    const char *const *snames = ps_optim_state_names(o->kind, &ns);
    if (!snames) return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: optimizer kind %d unknown", path, (int)o->kind);
    ps_st_file *f = ps_st_read(path, err);
    if (!f) return err ? err->code : PS_ERR_FORMAT;
    ps_status rc = PS_OK;
    const int np = o->nparams;
    const ps_st_tensor **ts = calloc((size_t)np * (PS_OPTIM_MAX_STATE + 1) + 1, sizeof *ts);
    int64_t *steps = calloc((size_t)np + 1, sizeof *steps);
    if (!ts || !steps) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); goto done; }
#define TS(i, j) ts[(size_t)(i) * (PS_OPTIM_MAX_STATE + 1) + (size_t)(j)]

    const char *farch = ps_st_metadata(f, "psd.arch");
    if (!farch || strcmp(farch, arch)) {
        rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: optimizer state of model '%s'; psd runs '%s'", path,
                        farch ? farch : "(no psd.arch metadata)", arch);
        goto done;
    }
    uint64_t fversion;
    if (parse_u64(ps_st_metadata(f, "psd.model_version"), &fversion) || fversion != version) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: psd.model_version is not %" PRIu64, path, version);
        goto done;
    }
    /* The kind: files written before psd.optimizer existed hold SGD momentum. */
    const char *kname = ps_st_metadata(f, "psd.optimizer");
    const int legacy = kname == NULL;
    ps_optim_kind fkind = PS_OPTIM_SGD;
    if (kname && ps_optim_kind_parse(kname, &fkind, NULL) != PS_OK) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: psd.optimizer '%s' is not an optimizer this build knows", path,
                        kname);
        goto done;
    }
    if (fkind != o->kind) {
        char have[128];
        state_list(fkind, have, sizeof have);
        rc = ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: optimizer state of %s (%s); psd runs %s, whose "
                        "state it is not. Resume with optimizer.type: %s, or move the checkpoints away and "
                        "start from the weights alone (psd --init-from <the weights file>)", path,
                        ps_optim_kind_name(fkind), have, ps_optim_kind_name(o->kind), ps_optim_kind_name(fkind));
        goto done;
    }
    /* Every tensor is a known parameter's state or step, with its shape. */
    for (size_t k = 0; k < ps_st_count(f); k++) {
        const ps_st_tensor *t = ps_st_get(f, k);
        int j, i = match_state(o, snames, ns, t->name, &j);
        if (i < 0) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: unexpected tensor '%s' (not the %s state of a "
                            "parameter of model %s)", path, t->name, ps_optim_kind_name(o->kind), arch);
            goto done;
        }
        if (j < ns) {
            if ((rc = check_state_tensor(path, t, &o->params[i], err))) goto done;
        } else {
            if (t->dtype != PS_ST_I64 || ps_st_numel(t) != 1 || t->ndim > 1) {
                rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' must be an I64 scalar", path,
                                t->name);
                goto done;
            }
            memcpy(&steps[i], t->data, sizeof steps[i]);
            if (steps[i] < 0) {
                rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is %" PRId64 " (negative)", path,
                                t->name, steps[i]);
                goto done;
            }
        }
        TS(i, j) = t;
    }
    /* Completeness, then the CRC in writing order. */
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < np; i++) {
        int have = 0;
        for (int j = 0; j < ns; j++) have += TS(i, j) != NULL;
        if (legacy) steps[i] = version; /* psd stepped every parameter at every version */
        if (have && steps[i] == 0) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: parameter %s has optimizer state but no step "
                            "(tensor '%s.step' missing or 0)", path, o->params[i].name, o->params[i].name);
            goto done;
        }
        if (o->kind == PS_OPTIM_ADAM && steps[i] > 0 && have != ns) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: parameter %s took %" PRId64 " steps but its "
                            "tensor '%s.%s' is missing (Adam cannot resume exactly without it)", path,
                            o->params[i].name, steps[i], o->params[i].name, snames[TS(i, 0) ? 1 : 0]);
            goto done;
        }
        for (int j = 0; j <= ns; j++)
            if (TS(i, j)) crc = crc_bytes(crc, TS(i, j)->data, TS(i, j)->bytes);
    }
    const char *want = ps_st_metadata(f, "psd.crc32");
    char got[16];
    snprintf(got, sizeof got, "%08" PRIx32, (uint32_t)crc);
    if (!want) { rc = ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.crc32 is missing", path); goto done; }
    if (strcmp(got, want)) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: data is corrupt (CRC-32 %s, the file says %s)", path, got, want);
        goto done;
    }
    /* Everything checked: fill the caller's buffers. */
    int unused = 0;
    for (int i = 0; i < np; i++) {
        ps_ckpt_optim_param *q = &o->params[i];
        int wanted = 0, loaded = 0;
        q->step = steps[i];
        for (int j = 0; j < ns; j++) {
            if (!q->state[j]) { unused += TS(i, j) != NULL; continue; }
            wanted++;
            if (TS(i, j)) {
                memcpy(q->state[j], TS(i, j)->data, TS(i, j)->bytes);
                loaded++;
            } else {
                memset(q->state[j], 0, (size_t)q->numel * sizeof(float));
            }
        }
        q->has_state = wanted > 0 && loaded == wanted;
    }
    if (unused)
        ps_log(PS_LOG_WARN, "%s: %d optimizer state tensors not used (the running %s keeps no such state, e.g. "
               "optimizer.momentum is 0)", path, unused, ps_optim_kind_name(o->kind));
#undef TS
done:
    free(ts);
    free(steps);
    ps_st_free(f);
    return rc;
}

/* The part identity of file f (path) against this psd's (id, the model's
 * shard rows): FAILED_PRECONDITION naming both when it is another's. */
static ps_status check_part(const char *path, const ps_st_file *f, ps_model *m, const ps_ckpt_ident *id,
                            ps_err *err) {
    const char *cl = ps_st_metadata(f, "psd.cluster"), *sv = ps_st_metadata(f, "psd.server");
    const char *mycl = id->cluster ? id->cluster : "", *mysv = id->server ? id->server : "";
    if (!cl || !sv) {
        if (!*mysv) return PS_OK;   /* written before clusters: the single-server form's */
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: checkpoint of a single-server psd (no psd.cluster/"
                          "psd.server metadata); this psd is server '%s' of cluster '%s'", path, mysv, mycl);
    }
    if (strcmp(cl, mycl))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: checkpoint part of cluster '%s'; this psd is of "
                          "cluster '%s' (cluster.name)", path, cl, mycl);
    if (strcmp(sv, mysv))
        return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: checkpoint part of server '%s'; this psd is "
                          "server '%s'", path, *sv ? sv : "(single-server form)", *mysv ? mysv : "(single-server form)");
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        char key[PS_ST_NAME_MAX + 16], want[80] = "";
        snprintf(key, sizeof key, "psd.rows.%s", pi->name);
        if (pi->rows_total)
            snprintf(want, sizeof want, "%" PRId64 ",%" PRId64 ",%" PRId64, pi->row_offset,
                     pi->row_offset + pi->dims[0], pi->rows_total);
        const char *got = ps_st_metadata(f, key);
        if (strcmp(got ? got : "", want))
            return ps_err_set(err, PS_ERR_FAILED_PRECONDITION, "%s: %s holds rows %s; this psd holds %s", path,
                              pi->name, got ? got : "all (not a shard)", *want ? want : "all (not a shard)");
    }
    return PS_OK;
}

ps_status ps_ckpt_load(ps_model *m, const char *path, ps_ckpt_info *out, ps_err *err) {
    return ps_ckpt_load_part(m, path, NULL, out, err);
}

ps_status ps_ckpt_load_part(ps_model *m, const char *path, const ps_ckpt_ident *id, ps_ckpt_info *out,
                            ps_err *err) {
    return ps_ckpt_load_with(m, path, id, out, NULL, err);
}

ps_status ps_ckpt_load_with(ps_model *m, const char *path, const ps_ckpt_ident *id, ps_ckpt_info *out,
                            ps_ckpt_settle *settle, ps_err *err) {
    if (!id) id = &single;
    ps_ckpt_settle rs = {0};
    if (settle) *settle = rs;
    int np = ps_model_num_params(m), nb = ps_model_num_buffers(m);
    ps_status rc = PS_OK;
    ps_st_file *wf = NULL;
    ps_ckpt_optim_param *op = NULL;
    float *sb[PS_OPTIM_MAX_STATE] = {0};
    const ps_st_tensor **wt = calloc((size_t)(np + nb) + 1, sizeof *wt);   /* parameters, then buffers */
    if (!wt) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); goto done; }
    if (!(wf = ps_st_read(path, err))) { rc = err ? err->code : PS_ERR_FORMAT; goto done; }

    const char *arch = ps_st_metadata(wf, "psd.arch");
    uint64_t version = 0, step = 0, samples = 0, when = 0;
    if (!arch || strcmp(arch, ps_model_arch(m))) {
        rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: checkpoint of model '%s'; psd runs '%s'", path,
                        arch ? arch : "(no psd.arch metadata)", ps_model_arch(m));
        goto done;
    }
    if ((rc = check_part(path, wf, m, id, err))) goto done;
    if (parse_u64(ps_st_metadata(wf, "psd.model_version"), &version) ||
        parse_u64(ps_st_metadata(wf, "psd.global_step"), &step) ||
        parse_u64(ps_st_metadata(wf, "psd.samples"), &samples) ||
        parse_u64(ps_st_metadata(wf, "psd.time"), &when) || step != version) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.model_version/global_step/samples/time missing "
                        "or not numbers", path);
        goto done;
    }
    /* The finished-context records: checked with the rest, before anything changes. */
    const char *sv = ps_st_metadata(wf, "psd.settle"), *av = ps_st_metadata(wf, "psd.contexts_applied");
    if (!sv != !av || (av && parse_u64(av, &rs.applied))) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.settle and psd.contexts_applied (a number) come "
                        "together", path);
        goto done;
    }
    if (sv && (rc = settle_decode(path, sv, version, &rs, err))) goto done;
    rs.present = sv != NULL;
    for (int i = 0; i < np; i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        wt[i] = ps_st_find(wf, pi->name);
        if (!wt[i]) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is missing", path, pi->name);
            goto done;
        }
        if ((rc = check_tensor(path, wt[i], pi, 0, err))) goto done;
    }
    for (int b = 0; b < nb; b++) {
        const ps_buffer_info *bi = ps_model_buffer(m, b);
        wt[np + b] = ps_st_find(wf, bi->name);
        if (!wt[np + b]) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' (a buffer) is missing", path, bi->name);
            goto done;
        }
        if ((rc = check_buffer(path, wt[np + b], bi, m, err))) goto done;
    }
    if ((rc = check_no_extra(path, wf, m, "", err))) goto done;
    if ((rc = check_crc(path, wf, wt, np + nb, err))) goto done;

    /* The optimizer sibling, named in the metadata, in the same directory. */
    const char *oname = ps_st_metadata(wf, "psd.optimizer_file");
    if (!oname || strchr(oname, '/') || !*oname) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.optimizer_file missing or not a file name", path);
        goto done;
    }
    char opath[PS_CKPT_PATH_MAX];
    const char *slash = strrchr(path, '/');
    snprintf(opath, sizeof opath, "%.*s%s", slash ? (int)(slash - path + 1) : 0, path, oname);
    /* The running optimizer's state: ns buffers per parameter. */
    const ps_optim_spec *spec = ps_model_optim(m);
    const int ns = ps_optim_num_state(spec);
    int have = (op = calloc((size_t)np, sizeof *op)) != NULL;
    for (int j = 0; j < ns; j++) have &= (sb[j] = malloc((size_t)ps_model_num_weights(m) * sizeof(float))) != NULL;
    if (!have) {
        rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    int64_t off = 0;
    for (int i = 0; i < np; i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        ps_ckpt_optim_param *q = &op[i];
        q->name = pi->name;
        q->ndim = pi->ndim;
        memcpy(q->dims, pi->dims, sizeof q->dims);
        q->numel = pi->numel;
        for (int j = 0; j < ns; j++) q->state[j] = sb[j] + off;
        off += pi->numel;
    }
    ps_ckpt_optim o = { spec->kind, np, op };
    if ((rc = ps_ckpt_optim_read(opath, &o, ps_model_arch(m), version, err))) {
        ps_err_prefix(err, "optimizer state of %s", path);
        goto done;
    }

    /* Everything checked: apply. Buffers the file lacks were zero-filled
     * by ps_ckpt_optim_read (SGD: momentum restarts; Adam: only with step
     * 0, it refuses a half state). */
    for (int i = 0; i < np && rc == PS_OK; i++) {
        rc = ps_model_set_param(m, i, wt[i]->data, err);
        if (rc == PS_OK)
            rc = ps_model_set_optim_state(m, i, op[i].step, (const float *const *)op[i].state, err);
    }
    for (int b = 0; b < nb && rc == PS_OK; b++) rc = ps_model_set_buffer(m, b, wt[np + b]->data, err);
    if (rc) goto done;
    ps_model_set_version(m, version);
    if (out) {
        out->version = version;
        out->samples = samples;
        out->time = (double)when;
        snprintf(out->path, sizeof out->path, "%s", path);
    }
    if (settle) *settle = rs, rs = (ps_ckpt_settle){0};
done:
    ps_ckpt_settle_free(&rs);
    free(wt);
    free(op);
    for (int j = 0; j < PS_OPTIM_MAX_STATE; j++) free(sb[j]);
    ps_st_free(wf);
    return rc;
}

ps_status ps_ckpt_restore_latest(ps_model *m, const char *dir, int *found, ps_ckpt_info *out, ps_err *err) {
    return ps_ckpt_restore_latest_part(m, dir, NULL, found, out, err);
}

ps_status ps_ckpt_restore_latest_part(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found,
                                      ps_ckpt_info *out, ps_err *err) {
    return ps_ckpt_restore_latest_with(m, dir, id, found, out, NULL, err);
}

ps_status ps_ckpt_restore_latest_with(ps_model *m, const char *dir, const ps_ckpt_ident *id, int *found,
                                      ps_ckpt_info *out, ps_ckpt_settle *settle, ps_err *err) {
    *found = 0;
    uint64_t *v = NULL;
    clean_tmp(dir);
    long n = list_versions(dir, CKPT_SUFFIX, &v, err);
    if (n < 0) return err ? err->code : PS_ERR_IO;
    if (n == 0) { free(v); return PS_OK; }
    ps_status rc = PS_OK;
    char first_reason[PS_ERR_MSG_MAX] = "";
    long i;
    for (i = 0; i < n; i++) {
        char path[PS_CKPT_PATH_MAX];
        file_path(path, sizeof path, dir, v[i], CKPT_SUFFIX);
        ps_err e = {0};
        if (ps_ckpt_load_with(m, path, id, out, settle, &e) == PS_OK) break;
        ps_log(PS_LOG_WARN, "checkpoint refused: %s", e.msg);
        if (!first_reason[0]) snprintf(first_reason, sizeof first_reason, "%s", e.msg);
    }
    if (i == n) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: none of the %ld checkpoints can be used (newest: %s); move "
                        "them away to start from scratch", dir, n, first_reason);
    } else {
        *found = 1;
        /* Newer ones were refused: rename them so they stop shadowing this one. */
        for (long j = 0; j < i; j++) {
            for (int k = 0; k < 2; k++) {
                char path[PS_CKPT_PATH_MAX], to[PS_CKPT_PATH_MAX + 8];
                file_path(path, sizeof path, dir, v[j], k ? OPTIM_SUFFIX : CKPT_SUFFIX);
                snprintf(to, sizeof to, "%s.refused", path);
                if (rename(path, to) == 0 && !k) ps_log(PS_LOG_WARN, "renamed %s to %s", path, to);
            }
        }
    }
    free(v);
    return rc;
}

ps_status ps_ckpt_init_from(ps_model *m, const char *path, ps_err *err) {
    return ps_ckpt_init_from_part(m, path, NULL, err);
}

/* err's message followed by " (where name is defined in the model file)". */
static ps_status with_where(ps_model *m, const char *name, ps_err *err) {
    if (!err) return PS_ERR_INVALID_ARGUMENT;
    char where[PS_ERR_MSG_MAX / 2], msg[PS_ERR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return ps_err_set(err, err->code, "%s (%s)", msg, ps_model_where(m, name, where, sizeof where));
}

ps_status ps_ckpt_init_from_part(ps_model *m, const char *path, int *skipped, ps_err *err) {
    int np = ps_model_num_params(m), nd = ps_model_num_def_params(m), nskip = 0;
    int nbd = ps_model_num_def_buffers(m), nb = ps_model_num_buffers(m);
    if (skipped) *skipped = 0;
    ps_st_file *f = ps_st_read(path, err);
    if (!f) return err ? err->code : PS_ERR_FORMAT;
    ps_status rc = PS_OK;
    float *conv = NULL;
    const ps_st_tensor **ts = calloc((size_t)np + 1, sizeof *ts);
    const ps_st_tensor **tb = calloc((size_t)nb + 1, sizeof *tb);
    if (!ts || !tb) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); goto done; }
    /* Every parameter and buffer of the definition (whole shapes): the hosted
     * ones must be there, the others may be (they are checked and skipped). */
    for (int i = 0; i < nd; i++) {
        const ps_param_info *pi = ps_model_def_param(m, i);
        const ps_st_tensor *t = ps_st_find(f, pi->name);
        int here = ps_model_find_param(m, pi->name);
        if (!t && here >= 0) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is missing (model %s needs every "
                            "parameter under its state_dict name)", path, pi->name, ps_model_arch(m));
            rc = with_where(m, pi->name, err);
            goto done;
        }
        if (!t) continue;
        if ((rc = check_tensor(path, t, pi, 1, err))) { rc = with_where(m, pi->name, err); goto done; }
        if (here >= 0) ts[here] = t;
        else nskip++;
    }
    for (int i = 0; i < nbd; i++) {
        const ps_buffer_info *bi = ps_model_def_buffer(m, i);
        const ps_st_tensor *t = ps_st_find(f, bi->name);
        int here = ps_model_find_buffer(m, bi->name);
        if (!t && here >= 0) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' (a buffer) is missing (model %s needs "
                            "its state_dict's buffers too)", path, bi->name, ps_model_arch(m));
            rc = with_where(m, bi->name, err);
            goto done;
        }
        if (!t) continue;
        if ((rc = check_buffer(path, t, bi, m, err))) goto done;
        if (here >= 0) tb[here] = t;
        else nskip++;
    }
    for (size_t k = 0; k < ps_st_count(f); k++) {
        const char *name = ps_st_get(f, k)->name;
        int known = 0;
        for (int i = 0; i < nd && !known; i++) known = !strcmp(ps_model_def_param(m, i)->name, name);
        for (int i = 0; i < nbd && !known; i++) known = !strcmp(ps_model_def_buffer(m, i)->name, name);
        if (!known) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: unexpected tensor '%s' (not a parameter or buffer "
                            "of model %s)", path, name, ps_model_arch(m));
            rc = with_where(m, name, err);
            goto done;
        }
    }
    /* float64 values must fit float32 - checked before any weight changes */
    for (int i = 0; i < np; i++) {
        if (ts[i]->dtype != PS_ST_F64) continue;
        const double *d = ts[i]->data;
        for (int64_t j = 0, k = ps_st_numel(ts[i]); j < k; j++)
            if (isfinite(d[j]) && !isfinite((float)d[j])) {
                rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' element %lld is %g, beyond "
                                "float32's range (psd's weights are float32)", path, ps_model_param(m, i)->name,
                                (long long)j, d[j]);
                goto done;
            }
    }
    for (int i = 0; i < np && rc == PS_OK; i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        /* A shard takes its rows of the whole table. */
        int64_t first = pi->rows_total ? pi->row_offset * (pi->numel / pi->dims[0]) : 0;
        const void *src = (const char *)ts[i]->data + (size_t)first * ps_st_dtype_size(ts[i]->dtype);
        if (ts[i]->dtype == PS_ST_F64) {
            float *c = realloc(conv, (size_t)pi->numel * sizeof(float));
            if (!c) { rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "out of memory"); break; }
            conv = c;
            const double *d = src;
            for (int64_t j = 0; j < pi->numel; j++) conv[j] = (float)d[j];
            src = conv;
        }
        rc = ps_model_set_param(m, i, src, err);
    }
    for (int b = 0; b < nb && rc == PS_OK; b++) rc = ps_model_set_buffer(m, b, tb[b]->data, err);
    if (rc == PS_OK && nskip)
        ps_log(PS_LOG_INFO, "%s: skipped %d tensors of stages hosted elsewhere", path, nskip);
    if (rc == PS_OK && skipped) *skipped = nskip;
done:
    free(conv);
    free(ts);
    free(tb);
    ps_st_free(f);
    return rc;
}
