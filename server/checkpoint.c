/* checkpoint.c - psd's checkpoints (checkpoint.h): save the model's
 * weights, buffers and optimizer state as one consistent snapshot, load
 * one with everything checked before the model changes, and initialise the
 * weights from a state_dict file (--init-from). The directory (lock, names,
 * retention, restore) is checkpoint_dir.c, the optimizer file
 * checkpoint_optim.c, psd.settle checkpoint_settle.c. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checkpoint_impl.h"
#include "dims.h"
#include "log.h"

/* crc32 over any length (zlib takes a uInt length). */
uLong ckpt_crc_bytes(uLong crc, const void *data, size_t left) {
    const unsigned char *p = data;
    while (left) {
        uInt chunk = left > (1u << 30) ? (1u << 30) : (uInt)left;
        crc = crc32(crc, p, chunk);
        p += chunk;
        left -= chunk;
    }
    return crc;
}

/* CRC-32 of the parameters' data in parameter order. */
static uint32_t crc_of(const void *const *data, const size_t *bytes, int n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < n; i++) crc = ckpt_crc_bytes(crc, data[i], bytes[i]);
    return (uint32_t)crc;
}

static const ps_ckpt_ident single = {"psd", ""};

/* psd.params: every parameter of the model's definition (hosted here or
 * not), "<name>@<stage>:<d0>,<d1>,..." with ":shard" for a table that may be
 * split by rows, joined by ';' - what ps-ckpt merge checks the parts
 * against. NULL when out of memory. */
static char *params_meta(ps_model *m) {
    size_t cap = 256, o = 0;
    int n = ps_model_num_def_params(m);
    int na = ps_model_num_aliases(m);
    for (int i = 0; i < n; i++) cap += strlen(ps_model_def_param(m, i)->name) + 160;
    for (int i = 0; i < na; i++) cap += strlen(ps_model_alias(m, i, NULL)) + 160;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    buf[0] = 0;
    for (int i = 0; i < n + na; i++) {   /* tied parameters' aliases after the parameters: tensors of the part */
        int owner = i;
        const char *name = i < n ? ps_model_def_param(m, i)->name : ps_model_alias(m, i - n, &owner);
        const ps_param_info *pi = ps_model_def_param(m, owner);
        o += (size_t)snprintf(buf + o, cap - o, "%s%s@%s:", i ? ";" : "", name, pi->stage ? pi->stage : "");
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
    int nb = ps_model_num_buffers(m), na = ps_model_num_aliases(m);
    float *w = malloc((size_t)nw * sizeof(float));
    float *sb[PS_OPTIM_MAX_STATE] = {0};   /* state buffer j of every parameter, laid out as w */
    int64_t *steps = calloc((size_t)np + 1, sizeof *steps);
    ps_st_tensor *t = calloc((size_t)(np + nb + na) + 1, sizeof *t);   /* parameters, buffers, tied aliases */
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
        settle = ckpt_settle_encode(rec, nrec);
        free(rec);
        if (!settle) {
            rc = ps_err_set(err, PS_ERR_RESOURCE_EXHAUSTED, "checkpoint: out of memory for the settle records");
            goto done;
        }
    }

    char wpath[PS_CKPT_PATH_MAX], opath[PS_CKPT_PATH_MAX], oname[64], vbuf[32], sbuf[32], tbuf[32],
        crcbuf[16];
    ckpt_file_path(wpath, sizeof wpath, dir, version, CKPT_SUFFIX);
    ckpt_file_path(opath, sizeof opath, dir, version, OPTIM_SUFFIX);
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
    int nt = np + nb;
    for (int a = 0; a < na; a++) {   /* tied parameters: the alias key too (PyTorch's state_dict has both) */
        int owner;
        const char *name = ps_model_alias(m, a, &owner);
        int i = ps_model_find_param(m, ps_model_def_param(m, owner)->name);
        if (i < 0) continue;   /* its stage is hosted elsewhere */
        t[nt] = t[i];
        snprintf(t[nt].name, sizeof t[nt].name, "%s", name);
        nt++;
    }
    snprintf(crcbuf, sizeof crcbuf, "%08" PRIx32, crc_of(ptrs, numel, np + nb));   /* aliases: equal their owners */
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
    if ((rc = ps_st_write(wpath, t, (size_t)nt, wmeta, err))) goto done;
    if (out) {
        out->version = version;
        out->samples = samples;
        out->time = now;
        snprintf(out->path, sizeof out->path, "%s", wpath);
    }
    ckpt_retain(dir, keep);
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
int ckpt_parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s || s[strspn(s, "0123456789")] != '\0' || strlen(s) > 20) return -1;
    errno = 0;
    unsigned long long x = strtoull(s, NULL, 10);
    if (errno) return -1;
    *out = x;
    return 0;
}

/* Tensor t must be parameter pi: dtype (F32, or F64 when allow_f64) and shape. */
ps_status ckpt_check_tensor(const char *path, const ps_st_tensor *t, const ps_param_info *pi,
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

/* Tied parameters' alias keys in f: each must hold its owner's values
 * (the same tensor in PyTorch); a file without them is fine. */
static ps_status check_aliases(const char *path, const ps_st_file *f, ps_model *m, ps_err *err) {
    for (int a = 0; a < ps_model_num_aliases(m); a++) {
        int owner;
        const char *name = ps_model_alias(m, a, &owner);
        const ps_param_info *pi = ps_model_def_param(m, owner);
        const ps_st_tensor *t = ps_st_find(f, name), *o = ps_st_find(f, pi->name);
        if (!t) continue;
        ps_status rc = ckpt_check_tensor(path, t, pi, 1, err);
        if (rc) return rc;
        int same = o && o->dtype == t->dtype && o->bytes == t->bytes;
        for (int64_t j = 0, n = ps_st_numel(t); same && j < n; j++)
            same = t->dtype == PS_ST_F32 ? ((const float *)t->data)[j] == ((const float *)o->data)[j]
                                         : ((const double *)t->data)[j] == ((const double *)o->data)[j];
        if (!same)
            return ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' differs from '%s'%s: the model ties "
                              "them (tie: one tensor), so a file holding both must hold one value", path, name,
                              pi->name, o ? "" : " (missing)");
    }
    return PS_OK;
}

static int is_alias(ps_model *m, const char *name) {
    for (int a = 0; a < ps_model_num_aliases(m); a++)
        if (!strcmp(ps_model_alias(m, a, NULL), name)) return 1;
    return 0;
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
        if (!sl && is_alias(m, base)) continue;   /* checked by check_aliases */
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
    if (ckpt_parse_u64(ps_st_metadata(wf, "psd.model_version"), &version) ||
        ckpt_parse_u64(ps_st_metadata(wf, "psd.global_step"), &step) ||
        ckpt_parse_u64(ps_st_metadata(wf, "psd.samples"), &samples) ||
        ckpt_parse_u64(ps_st_metadata(wf, "psd.time"), &when) || step != version) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.model_version/global_step/samples/time missing "
                        "or not numbers", path);
        goto done;
    }
    /* The finished-context records: checked with the rest, before anything changes. */
    const char *sv = ps_st_metadata(wf, "psd.settle"), *av = ps_st_metadata(wf, "psd.contexts_applied");
    if (!sv != !av || (av && ckpt_parse_u64(av, &rs.applied))) {
        rc = ps_err_set(err, PS_ERR_FORMAT, "%s: metadata psd.settle and psd.contexts_applied (a number) come "
                        "together", path);
        goto done;
    }
    if (sv && (rc = ckpt_settle_decode(path, sv, version, &rs, err))) goto done;
    rs.present = sv != NULL;
    for (int i = 0; i < np; i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        wt[i] = ps_st_find(wf, pi->name);
        if (!wt[i]) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is missing", path, pi->name);
            goto done;
        }
        if ((rc = ckpt_check_tensor(path, wt[i], pi, 0, err))) goto done;
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
    if ((rc = check_aliases(path, wf, m, err))) goto done;
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
        if ((rc = ckpt_check_tensor(path, t, pi, 1, err))) { rc = with_where(m, pi->name, err); goto done; }
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
        known |= is_alias(m, name);   /* a tied parameter's other key: checked below */
        if (!known) {
            rc = ps_err_set(err, PS_ERR_INVALID_ARGUMENT, "%s: unexpected tensor '%s' (not a parameter or buffer "
                            "of model %s)", path, name, ps_model_arch(m));
            rc = with_where(m, name, err);
            goto done;
        }
    }
    if ((rc = check_aliases(path, f, m, err))) goto done;
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
