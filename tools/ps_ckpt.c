/* ps_ckpt.c - ps-ckpt: checkpoint parts of a cluster with several PS nodes.
 *
 *   ps-ckpt merge -o OUT.safetensors [--allow-mixed-versions] PART...
 *       Joins the parts (each psd's ckpt-<N>.safetensors, server/checkpoint.h)
 *       into one safetensors state_dict that PyTorch loads with
 *       load_state_dict(strict=True): unsharded tensors as they are, each
 *       sharded table rebuilt from its parts' rows (psd.rows.<param> =
 *       "lo,hi,R"; every row covered exactly once). Refuses parts of
 *       different clusters or models, two parts of one server, an empty
 *       part, a tensor in two parts, rows missing or covered twice, a stage
 *       of the model in no part, and - unless --allow-mixed-versions - parts
 *       of different model versions. A part is not taken at its word: its
 *       tensors are checked against the model's parameter list psd writes
 *       into every part (psd.params: names, stages, whole shapes, which
 *       tables may be sharded), which all parts must agree on - a tensor the
 *       model lacks, of a stage the part does not host, of another shape or
 *       dtype, a shard of a table that is not shardable, or a hosted stage's
 *       tensor missing from its part is refused. Parts written before
 *       psd.params existed get the other checks only (a warning says so).
 *       The optimizer state files (ckpt-<N>.optim.safetensors) are not
 *       merged.
 *   ps-ckpt info PART...
 *       Prints each file's metadata and tensors, control characters and
 *       non-ASCII bytes escaped (\xNN), long values cut.
 *
 * Exit status: 0 done, 1 refused or failed (the reason on stderr), 2 usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dims.h"
#include "modeldef.h"
#include "safetensors.h"
#include "status.h"

#define MAX_PARTS 64
#define MAX_OUT 512

static void usage(FILE *f) {
    fprintf(f, "usage: ps-ckpt merge -o OUT.safetensors [--allow-mixed-versions] PART...\n"
               "       ps-ckpt info PART...\n"
               "\n"
               "merge joins the checkpoint parts written by the psd servers of one cluster\n"
               "(servers.* in the config; each part holds that server's stages and, for a\n"
               "sharded embedding table, its rows) into one safetensors state_dict that\n"
               "PyTorch loads with load_state_dict(strict=True). Every row of a sharded\n"
               "table must come from exactly one part. Parts of different clusters or models\n"
               "are refused; parts of different model versions too, unless\n"
               "--allow-mixed-versions. Optimizer state files are not merged.\n"
               "info prints each file's metadata (psd.cluster, psd.server, psd.hosted,\n"
               "psd.model_version, psd.rows.*) and tensors.\n");
}

static const char *meta(const ps_st_file *f, const char *key) {
    const char *v = ps_st_metadata(f, key);
    return v ? v : "";
}

/* s as a terminal may show it: printable ASCII as is, everything else
 * (escape sequences, newlines, UTF-8) as \xNN, '\\' doubled; at most max
 * bytes of s, then "... (N bytes)". A file's metadata is whatever its
 * writer put there. */
static void put_safe(FILE *out, const char *s, size_t max) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') fputs("\\\\", out);
        else if (c >= 0x20 && c < 0x7f) fputc(c, out);
        else fprintf(out, "\\x%02x", c);
    }
    if (n > max) fprintf(out, "... (%zu bytes)", n);
}

static int cmd_info(int argc, char **argv) {
    if (argc < 1) { usage(stderr); return 2; }
    int rc = 0;
    for (int i = 0; i < argc; i++) {
        ps_err err = {0};
        ps_st_file *f = ps_st_read(argv[i], &err);
        if (!f) { fprintf(stderr, "ps-ckpt: "); put_safe(stderr, err.msg, 4096); fputc('\n', stderr); rc = 1; continue; }
        put_safe(stdout, argv[i], 4096);
        printf(":\n");
        for (size_t k = 0; k < ps_st_metadata_count(f); k++) {
            printf("  ");
            put_safe(stdout, ps_st_metadata_key(f, k), 200);
            printf(" = ");
            put_safe(stdout, ps_st_metadata_value(f, k), 300);
            printf("\n");
        }
        for (size_t k = 0; k < ps_st_count(f); k++) {
            const ps_st_tensor *t = ps_st_get(f, k);
            printf("  tensor ");
            put_safe(stdout, t->name, 200);
            char shape[160];
            printf(" %s %s\n", ps_st_dtype_name(t->dtype), ps_dims_format(shape, sizeof shape, t->dims, t->ndim));
        }
        ps_st_free(f);
    }
    return rc;
}

/* "lo,hi,R" -> 0 on success. */
static int parse_rows(const char *s, int64_t *lo, int64_t *hi, int64_t *r) {
    char tail;
    long long a, b, c;
    if (sscanf(s, "%lld,%lld,%lld%c", &a, &b, &c, &tail) != 3 || a < 0 || b <= a || c < b) return -1;
    *lo = a, *hi = b, *r = c;
    return 0;
}

/* One tensor of the output: whole from one part, or rebuilt from pieces. */
typedef struct piece {
    int part;
    const ps_st_tensor *t;
    int64_t lo, hi;
} piece;

typedef struct out_tensor {
    char name[PS_ST_NAME_MAX];
    int sharded;                 /* 1: rows from pieces */
    int64_t rows;                /* sharded: R */
    int npieces;
    piece pieces[MAX_PARTS];
} out_tensor;

static int cmp_piece(const void *a, const void *b) {
    const piece *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static out_tensor *find_out(out_tensor *o, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(o[i].name, name)) return &o[i];
    return NULL;
}

/* ---- psd.params: the model's parameters as psd wrote them ------------------ */

#define MAX_DECL 1024

typedef struct decl {
    char name[PS_ST_NAME_MAX];
    char stage[64];
    int ndim;
    int64_t dims[PS_ST_MAX_DIMS];
    int shard;                   /* a table that may be split by rows */
} decl;

/* "<name>@<stage>:<d0>,<d1>...[:shard];..." into d; the count, or -1. */
static int parse_params(const char *s, decl *d, int max) {
    int n = 0;
    while (*s) {
        if (n == max) return -1;
        decl *x = &d[n++];
        memset(x, 0, sizeof *x);
        size_t len = strcspn(s, "@;");
        if (!len || len >= sizeof x->name || s[len] != '@') return -1;
        memcpy(x->name, s, len);
        s += len + 1;
        len = strcspn(s, ":;");
        if (!len || len >= sizeof x->stage || s[len] != ':') return -1;
        memcpy(x->stage, s, len);
        s += len + 1;
        for (;;) {  /* dims */
            char *end;
            errno = 0;
            long long v = strtoll(s, &end, 10);
            if (end == s || errno || v < 0 || x->ndim == PS_ST_MAX_DIMS) return -1;
            x->dims[x->ndim++] = v;
            s = end;
            if (*s != ',') break;
            s++;
        }
        if (!strncmp(s, ":shard", 6)) x->shard = 1, s += 6;
        if (*s == ';') s++;
        else if (*s) return -1;
    }
    return n;
}

static const decl *find_decl(const decl *d, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(d[i].name, name)) return &d[i];
    return NULL;
}

/* Does the comma-separated list contain item? */
static int list_has(const char *list, const char *item) {
    size_t n = strlen(item);
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, item, n)) return 1;
        p += len + (p[len] == ',');
    }
    return 0;
}

static int cmd_merge(int argc, char **argv) {
    const char *out_path = NULL;
    int allow_mixed = 0, nparts = 0;
    const char *paths[MAX_PARTS];
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--output")) {
            if (++i >= argc) { fprintf(stderr, "ps-ckpt: %s needs a file name\n", argv[i - 1]); return 2; }
            out_path = argv[i];
        } else if (!strcmp(argv[i], "--allow-mixed-versions")) {
            allow_mixed = 1;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "ps-ckpt: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (nparts == MAX_PARTS) {
            fprintf(stderr, "ps-ckpt: at most %d parts\n", MAX_PARTS);
            return 2;
        } else {
            paths[nparts++] = argv[i];
        }
    }
    if (!out_path || !nparts) { usage(stderr); return 2; }

    ps_st_file *f[MAX_PARTS] = {0};
    static out_tensor outs[MAX_OUT];
    static decl decls[MAX_DECL];
    int ndecl = 0;
    int nout = 0, rc = 1, mixed = 0;
    float *bufs[MAX_OUT] = {0};
    ps_st_tensor *ts = NULL;
    char from[2048] = "";
    for (int p = 0; p < nparts; p++) {
        ps_err err = {0};
        if (!(f[p] = ps_st_read(paths[p], &err))) { fprintf(stderr, "ps-ckpt: %s\n", err.msg); goto done; }
        const char *cl = ps_st_metadata(f[p], "psd.cluster"), *arch = ps_st_metadata(f[p], "psd.arch"),
                   *ver = ps_st_metadata(f[p], "psd.model_version");
        if (!cl || !arch || !ver || !ps_st_metadata(f[p], "psd.hosted")) {
            fprintf(stderr, "ps-ckpt: %s: not a psd checkpoint part (metadata psd.cluster, psd.arch, "
                    "psd.model_version or psd.hosted missing)\n", paths[p]);
            goto done;
        }
        printf("%s: cluster %s, server %s, model %s, version %s, hosts %s\n", paths[p], cl,
               *meta(f[p], "psd.server") ? meta(f[p], "psd.server") : "(single-server form)", arch, ver,
               meta(f[p], "psd.hosted"));
        snprintf(from + strlen(from), sizeof from - strlen(from), "%s%s@%s", p ? "," : "", meta(f[p], "psd.server"),
                 ver);
        if (p == 0) continue;
        if (strcmp(cl, meta(f[0], "psd.cluster"))) {
            fprintf(stderr, "ps-ckpt: %s is a part of cluster '%s', %s of cluster '%s': parts of one cluster only\n",
                    paths[p], cl, paths[0], meta(f[0], "psd.cluster"));
            goto done;
        }
        if (strcmp(arch, meta(f[0], "psd.arch"))) {
            fprintf(stderr, "ps-ckpt: %s holds model '%s', %s model '%s'\n", paths[p], arch, paths[0],
                    meta(f[0], "psd.arch"));
            goto done;
        }
        for (int q = 0; q < p; q++)  /* every pair: one part per server */
            if (strcmp(meta(f[p], "psd.server"), meta(f[q], "psd.server")) == 0) {
                fprintf(stderr, "ps-ckpt: %s and %s are both parts of server '%s': give one part per server\n",
                        paths[q], paths[p], meta(f[q], "psd.server"));
                goto done;
            }
        if (strcmp(ver, meta(f[0], "psd.model_version"))) mixed = 1;
    }
    if (mixed && !allow_mixed) {
        fprintf(stderr, "ps-ckpt: the parts are at different model versions (%s): each server resumed or "
                "checkpointed on its own; merge them anyway with --allow-mixed-versions\n", from);
        goto done;
    }
    if (mixed)
        fprintf(stderr, "ps-ckpt: warning: merging parts of different model versions (%s): the merged "
                "state_dict mixes them\n", from);

    /* The model's parameters, as every part says (psd.params): all parts must
     * say the same; parts written before psd.params get the other checks. */
    int with_params = 0;
    for (int p = 0; p < nparts; p++) {
        with_params += ps_st_metadata(f[p], "psd.params") != NULL;
        if (!ps_st_count(f[p])) {
            fprintf(stderr, "ps-ckpt: %s holds no tensors (it claims to host %s)\n", paths[p], meta(f[p], "psd.hosted"));
            goto done;
        }
    }
    if (with_params && with_params != nparts) {
        fprintf(stderr, "ps-ckpt: only %d of the %d parts list the model's parameters (psd.params); checkpoint every "
                "server with one psd version\n", with_params, nparts);
        goto done;
    }
    if (with_params) {
        for (int p = 1; p < nparts; p++)
            if (strcmp(meta(f[p], "psd.params"), meta(f[0], "psd.params"))) {
                fprintf(stderr, "ps-ckpt: %s and %s list different parameters for model %s (psd.params): servers "
                        "with other model.sizes, or not parts of one cluster\n", paths[0], paths[p],
                        meta(f[0], "psd.arch"));
                goto done;
            }
        if ((ndecl = parse_params(meta(f[0], "psd.params"), decls, MAX_DECL)) <= 0) {
            fprintf(stderr, "ps-ckpt: %s: metadata psd.params is not a parameter list\n", paths[0]);
            goto done;
        }
    } else {
        fprintf(stderr, "ps-ckpt: warning: the parts do not list the model's parameters (psd.params: written by an "
                "older psd); names, stages and shapes are not checked against the model\n");
    }

    /* Every stage of the model's definition in some part. */
    ps_model_def *def = ps_model_def_load(meta(f[0], "psd.arch"), NULL, NULL);   /* NULL: a model of one's own */
    int missing = 0;
    for (int s = 0; def && s < def->nstages && !missing; s++) {
        int in = 0;
        for (int p = 0; p < nparts && !in; p++) in = list_has(meta(f[p], "psd.hosted"), def->stages[s].name);
        if (!in) {
            fprintf(stderr, "ps-ckpt: stage '%s' of model %s is in none of the parts (they host: ",
                    def->stages[s].name, def->name);
            for (int p = 0; p < nparts; p++) fprintf(stderr, "%s%s", p ? "; " : "", meta(f[p], "psd.hosted"));
            fprintf(stderr, "): give every server's part\n");
            missing = 1;
        }
    }
    ps_model_def_free(def);
    if (missing) goto done;

    /* Collect tensors and pieces. */
    for (int p = 0; p < nparts; p++) {
        for (size_t k = 0; k < ps_st_count(f[p]); k++) {
            const ps_st_tensor *t = ps_st_get(f[p], k);
            char key[PS_ST_NAME_MAX + 16];
            snprintf(key, sizeof key, "psd.rows.%s", t->name);
            const char *rows = ps_st_metadata(f[p], key);
            if (ndecl) {  /* the part's tensor against the model's parameter */
                const decl *dc = find_decl(decls, ndecl, t->name);
                char got[128], want[128];
                if (!dc) {
                    fprintf(stderr, "ps-ckpt: %s: tensor '", paths[p]);
                    put_safe(stderr, t->name, 200);
                    fprintf(stderr, "' is not a parameter of model %s\n", meta(f[p], "psd.arch"));
                    goto done;
                }
                if (!list_has(meta(f[p], "psd.hosted"), dc->stage)) {
                    fprintf(stderr, "ps-ckpt: %s: tensor '%s' belongs to stage '%s', which this part does not host "
                            "(psd.hosted: %s)\n", paths[p], t->name, dc->stage, meta(f[p], "psd.hosted"));
                    goto done;
                }
                if (rows && !dc->shard) {
                    fprintf(stderr, "ps-ckpt: %s: '%s' carries shard rows (%s = %s) but is not a table that is split "
                            "by rows\n", paths[p], t->name, key, rows);
                    goto done;
                }
                ps_dims_format(got, sizeof got, t->dims, t->ndim);
                ps_dims_format(want, sizeof want, dc->dims, dc->ndim);
                int same = t->ndim == dc->ndim;
                for (int d = rows ? 1 : 0; same && d < t->ndim; d++) same = t->dims[d] == dc->dims[d];
                if (!same || t->dtype != PS_ST_F32) {
                    fprintf(stderr, "ps-ckpt: %s: tensor '%s' is %s %s; the model's is F32 %s%s\n", paths[p], t->name,
                            ps_st_dtype_name(t->dtype), got, want, rows ? " (any rows, as a shard)" : "");
                    goto done;
                }
            }
            out_tensor *o = find_out(outs, nout, t->name);
            if (!o) {
                if (nout == MAX_OUT) { fprintf(stderr, "ps-ckpt: more than %d tensors\n", MAX_OUT); goto done; }
                o = &outs[nout++];
                snprintf(o->name, sizeof o->name, "%s", t->name);
                o->sharded = rows != NULL;
            } else if (!o->sharded || !rows) {
                fprintf(stderr, "ps-ckpt: tensor '%s' is in %s and in %s%s: each parameter belongs to one server\n",
                        t->name, paths[o->pieces[0].part], paths[p], rows || o->sharded ? " (one of them a shard)" : "");
                goto done;
            }
            piece *pc = &o->pieces[o->npieces++];
            pc->part = p;
            pc->t = t;
            if (!rows) continue;
            int64_t lo, hi, r;
            if (parse_rows(rows, &lo, &hi, &r) || t->ndim < 1 || t->dims[0] != hi - lo) {
                fprintf(stderr, "ps-ckpt: %s: %s = '%s' does not describe its tensor (%" PRId64 " rows)\n", paths[p],
                        key, rows, t->ndim ? t->dims[0] : 0);
                goto done;
            }
            if (o->npieces > 1 && (r != o->rows || t->ndim != o->pieces[0].t->ndim ||
                                   t->dtype != o->pieces[0].t->dtype ||
                                   memcmp(t->dims + 1, o->pieces[0].t->dims + 1, (size_t)(t->ndim - 1) * sizeof(int64_t)))) {
                fprintf(stderr, "ps-ckpt: shards of '%s' disagree: %s (%s) and %s\n", t->name, paths[p], rows,
                        paths[o->pieces[0].part]);
                goto done;
            }
            const decl *dc = ndecl ? find_decl(decls, ndecl, t->name) : NULL;
            if (dc && r != dc->dims[0]) {
                fprintf(stderr, "ps-ckpt: %s: %s = '%s': the table has %" PRId64 " rows\n", paths[p], key, rows,
                        dc->dims[0]);
                goto done;
            }
            o->rows = r;
            pc->lo = lo;
            pc->hi = hi;
        }
    }
    /* Each part holds every parameter of the stages it says it hosts. */
    for (int p = 0; p < nparts; p++)
        for (int i = 0; i < ndecl; i++)
            if (list_has(meta(f[p], "psd.hosted"), decls[i].stage) && !ps_st_find(f[p], decls[i].name)) {
                fprintf(stderr, "ps-ckpt: %s hosts stage '%s' (psd.hosted) but holds no tensor '%s'\n", paths[p],
                        decls[i].stage, decls[i].name);
                goto done;
            }

    /* Sharded tables: rows [0, R) covered exactly once, then rebuilt. */
    ts = calloc((size_t)nout + 1, sizeof *ts);
    if (!ts) { fprintf(stderr, "ps-ckpt: out of memory\n"); goto done; }
    for (int i = 0; i < nout; i++) {
        out_tensor *o = &outs[i];
        const ps_st_tensor *t0 = o->pieces[0].t;
        ps_st_tensor *x = &ts[i];
        *x = *t0;
        if (!o->sharded) continue;
        qsort(o->pieces, (size_t)o->npieces, sizeof *o->pieces, cmp_piece);
        int64_t at = 0;
        for (int k = 0; k < o->npieces; k++) {
            const piece *pc = &o->pieces[k];
            if (pc->lo != at) {
                if (pc->lo > at)
                    fprintf(stderr, "ps-ckpt: %s: rows [%" PRId64 ", %" PRId64 ") are in no part (next: %s from %s)\n",
                            o->name, at, pc->lo, paths[pc->part], meta(f[pc->part], "psd.server"));
                else
                    fprintf(stderr, "ps-ckpt: %s: rows [%" PRId64 ", %" PRId64 ") are in two parts (%s and %s)\n",
                            o->name, pc->lo, at < pc->hi ? at : pc->hi, paths[o->pieces[k - 1].part], paths[pc->part]);
                goto done;
            }
            at = pc->hi;
        }
        if (at != o->rows) {
            fprintf(stderr, "ps-ckpt: %s: rows [%" PRId64 ", %" PRId64 ") of %" PRId64 " are in no part\n", o->name, at,
                    o->rows, o->rows);
            goto done;
        }
        size_t row_bytes = t0->bytes / (size_t)t0->dims[0];
        x->dims[0] = o->rows;
        x->bytes = row_bytes * (size_t)o->rows;
        if (!(bufs[i] = malloc(x->bytes ? x->bytes : 1))) { fprintf(stderr, "ps-ckpt: out of memory\n"); goto done; }
        for (int k = 0; k < o->npieces; k++)
            memcpy((char *)bufs[i] + row_bytes * (size_t)o->pieces[k].lo, o->pieces[k].t->data, o->pieces[k].t->bytes);
        x->data = bufs[i];
        printf("%s: rows rebuilt from %d shards\n", o->name, o->npieces);
    }
    const char *m[] = {"format", "pt",
                       "psd.arch", meta(f[0], "psd.arch"),
                       "psd.cluster", meta(f[0], "psd.cluster"),
                       "psd.merged_from", from,
                       mixed ? NULL : "psd.model_version", meta(f[0], "psd.model_version"),
                       NULL};
    ps_err err = {0};
    if (ps_st_write(out_path, ts, (size_t)nout, m, &err)) { fprintf(stderr, "ps-ckpt: %s\n", err.msg); goto done; }
    printf("wrote %s: %d tensors from %d parts; optimizer state (ckpt-*.optim.safetensors) is not merged\n",
           out_path, nout, nparts);
    rc = 0;
done:
    for (int i = 0; i < nout; i++) free(bufs[i]);
    free(ts);
    for (int p = 0; p < nparts; p++) ps_st_free(f[p]);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { usage(stdout); return 0; }
    if (!strcmp(argv[1], "merge")) return cmd_merge(argc - 2, argv + 2);
    if (!strcmp(argv[1], "info")) return cmd_info(argc - 2, argv + 2);
    fprintf(stderr, "ps-ckpt: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
