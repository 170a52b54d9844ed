/* test_dataset.c - the data loaders of ps-train fit (trainer/dataset.h):
 * IDX, .npy (every dtype, both byte orders, versions 1, 2 and 3, gzip'ed),
 * .npz (stored and deflated, zip64 members) and safetensors, against files
 * written by numpy, zipfile, gzip and PyTorch (scripts/gen_data_fixtures.py,
 * run here with /usr/bin/python3 into a fresh directory) with their values
 * as float64 written by numpy beside them; the broken files the script
 * writes must be refused with the message it names; every format refuses
 * an array over the data limit before reading it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dataset.h"
#include "support/tmpdir.h"

static char g_dir[] = "/tmp/ps_test_dataset_XXXXXX";

static double *read_ref(const char *name, size_t n) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s.ref", g_dir, name);
    FILE *f = fopen(p, "rb");
    double *v = calloc(n ? n : 1, sizeof *v);
    size_t got = f ? fread(v, sizeof *v, n, f) : 0;
    if (f) fclose(f);
    CHECK_MSG(got == n, "%s: %zu of %zu reference values", p, got, n);
    return v;
}

static void check_good(const char *name, const char *spec, const char *dtype, int ndim, const int64_t *dims) {
    ps_array a;
    ps_err e = {0};
    ps_status st = ps_data_load(spec, PS_DATA_MAX_BYTES, &a, &e);
    CHECK_MSG(st == PS_OK, "%s: %s", name, e.msg);
    if (st) return;
    CHECK_MSG(!strcmp(ps_array_dtype_name(a.dtype), dtype), "%s: dtype %s, numpy says %s", name,
              ps_array_dtype_name(a.dtype), dtype);
    int same = a.ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = a.dims[i] == dims[i];
    char s1[128], s2[128];
    CHECK_MSG(same, "%s: shape %s, numpy says %s", name, ps_array_shape_str(a.dims, a.ndim, s1, sizeof s1),
              ps_array_shape_str(dims, ndim, s2, sizeof s2));
    int64_t n = ps_array_numel(&a);
    CHECK_MSG(a.bytes == (size_t)n * ps_array_dtype_size(a.dtype), "%s: %zu bytes", name, a.bytes);
    double *ref = read_ref(name, (size_t)n);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    int64_t *q = malloc((size_t)(n ? n : 1) * sizeof *q);
    if (n) ps_array_to_f32(&a, 0, n, f);
    int64_t bad = -1;
    for (int64_t i = 0; i < n && bad < 0; i++)
        if (f[i] != (float)ref[i]) bad = i;
    CHECK_MSG(bad < 0, "%s: element %" PRId64 " is %.9g as float32, numpy's %.17g", name, bad, bad < 0 ? 0 : f[bad],
              bad < 0 ? 0 : ref[bad]);
    if (ps_array_dtype_is_int(a.dtype)) {
        CHECK_MSG(n == 0 || ps_array_to_i64(&a, 0, n, q, &e) == PS_OK, "%s: to int64: %s", name, e.msg);
        bad = -1;
        for (int64_t i = 0; i < n && bad < 0; i++)
            if (q[i] != (int64_t)ref[i]) bad = i;
        CHECK_MSG(bad < 0, "%s: element %" PRId64 " is %" PRId64 " as int64, numpy's %.17g", name, bad,
                  bad < 0 ? 0 : q[bad], bad < 0 ? 0 : ref[bad]);
    } else if (n) {
        CHECK_MSG(ps_array_to_i64(&a, 0, 1, q, &e) == PS_ERR_INVALID_ARGUMENT && strstr(e.msg, "integers"),
                  "%s: float values as int64 must be refused (%s)", name, e.msg);
    }
    free(ref);
    free(f);
    free(q);
    ps_array_free(&a);
}

static void check_bad(const char *name, const char *spec, const char *needle) {
    ps_array a;
    ps_err e = {0};
    const char *want = needle;
    ps_status st = ps_data_load(spec, PS_DATA_MAX_BYTES, &a, &e);
    CHECK_MSG(st != PS_OK, "%s: loaded, must be refused (%s)", name, want);
    if (st == PS_OK) { ps_array_free(&a); return; }
    CHECK_MSG(strstr(e.msg, want) != NULL, "%s: message '%s' lacks '%s'", name, e.msg, want);
    /* the message names the file */
    char path[1100];
    snprintf(path, sizeof path, "%s", spec);
    char *colon = strrchr(path, ':');
    if (colon && access(path, F_OK)) *colon = 0;
    CHECK_MSG(strstr(e.msg, path) != NULL, "%s: message '%s' does not name %s", name, e.msg, path);
    CHECK(a.data == NULL && a.ndim == 0);
}

/* An array over the limit is refused before its data is read. */
static void check_limit(const char *spec, size_t limit) {
    ps_array a;
    ps_err e = {0};
    ps_status st = ps_data_load(spec, limit, &a, &e);
    CHECK_MSG(st == PS_ERR_RESOURCE_EXHAUSTED, "%s with a %zu-byte limit: status %d (%s)", spec, limit, st, e.msg);
    if (st == PS_OK) ps_array_free(&a);
}

int main(void) {
    if (access("/usr/bin/python3", X_OK) || system("/usr/bin/python3 -c 'import numpy' 2>/dev/null"))
        return check_skip("test_dataset", "/usr/bin/python3 with numpy is needed to write the reference files");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 scripts/gen_data_fixtures.py %s", g_dir);
    if (system(cmd)) { fprintf(stderr, "%s failed\n", cmd); return 1; }
    char man[600];
    snprintf(man, sizeof man, "%s/manifest.txt", g_dir);
    FILE *f = fopen(man, "r");
    if (!f) { perror(man); return 1; }
    char line[2048];
    int ngood = 0, nbad = 0;
    while (fgets(line, sizeof line, f)) {
        char kind[8], name[128], spec[1024], third[256];
        int off = 0;
        if (!strncmp(line, "bad\t", 4)) {
            line[strcspn(line, "\n")] = 0;
            char *nm = strtok(line + 4, "\t"), *sp = strtok(NULL, "\t"), *needle = strtok(NULL, "\t");
            CHECK_MSG(nm && sp && needle, "manifest line: %s", line);
            if (nm && sp && needle) check_bad(nm, sp, needle);
            nbad++;
            continue;
        }
        if (sscanf(line, "%7s %127s %1023s %255s %n", kind, name, spec, third, &off) < 4) continue;
        int ndim = 0, k = 0;
        const char *p = line + off;
        sscanf(p, "%d%n", &ndim, &k);
        p += k;
        int64_t dims[PS_ARRAY_MAX_DIMS] = {0};
        for (int i = 0; i < ndim && i < PS_ARRAY_MAX_DIMS; i++) {
            sscanf(p, "%" SCNd64 "%n", &dims[i], &k);
            p += k;
        }
        check_good(name, spec, third, ndim, dims);
        ngood++;
    }
    fclose(f);
    CHECK_MSG(ngood >= 40 && nbad >= 25, "the manifest holds %d good and %d bad files", ngood, nbad);

    /* The data limit, per format: one byte less than the array needs. */
    char p[700];
    snprintf(p, sizeof p, "%s/imgs.npy", g_dir);
    check_limit(p, 7 * 28 * 28 - 1);
    snprintf(p, sizeof p, "%s/gz.npy.gz", g_dir);
    check_limit(p, 5 * 4 * 8 - 1);
    snprintf(p, sizeof p, "%s/c.npz:x", g_dir);
    check_limit(p, 10 * 16 * 4 - 1);
    snprintf(p, sizeof p, "%s/idx_0e", g_dir);
    check_limit(p, 4 * 3 * 2 * 8 - 1);
    snprintf(p, sizeof p, "%s/d.safetensors:feat", g_dir);
    check_limit(p, 6 * 2 * 4 - 1);
    /* ... and exactly at the limit it loads */
    ps_array a;
    ps_err e = {0};
    snprintf(p, sizeof p, "%s/imgs.npy", g_dir);
    CHECK_MSG(ps_data_load(p, 7 * 28 * 28, &a, &e) == PS_OK, "%s", e.msg);
    ps_array_free(&a);
    snprintf(p, sizeof p, "%s/c.npz", g_dir);
    CHECK(ps_data_format(p, &e) && !strcmp(ps_data_format(p, &e), "npz"));
    snprintf(p, sizeof p, "%s/idx_08.gz", g_dir);
    CHECK(ps_data_format(p, &e) && !strcmp(ps_data_format(p, &e), "IDX"));
    snprintf(p, sizeof p, "%s/gz.npy.gz", g_dir);
    CHECK(ps_data_format(p, &e) && !strcmp(ps_data_format(p, &e), "npy"));
    snprintf(p, sizeof p, "%s/d.safetensors", g_dir);
    CHECK(ps_data_format(p, &e) && !strcmp(ps_data_format(p, &e), "safetensors"));
    ps_array_free(NULL);

    test_rmtree(g_dir);
    return check_summary("test_dataset");
}
