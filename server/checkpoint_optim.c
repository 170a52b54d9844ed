/* checkpoint_optim.c - the optimizer state file of a checkpoint
 * (ckpt-<N>.optim.safetensors, checkpoint.h): written generic over the kinds
 * of optim.h, read back with every tensor, step and CRC checked. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_impl.h"
#include "log.h"

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
            crc = ckpt_crc_bytes(crc, x->data, x->bytes);
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
    return ckpt_check_tensor(path, t, &pi, 0, err);
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
    if (ckpt_parse_u64(ps_st_metadata(f, "psd.model_version"), &fversion) || fversion != version) {
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
            if (TS(i, j)) crc = ckpt_crc_bytes(crc, TS(i, j)->data, TS(i, j)->bytes);
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
