/* test_checkpoint.c - psd's checkpoints (server/checkpoint.c): round trip of
 * weights, momentum buffers and version (a resumed model must take the next
 * step bit-identically to the one that never stopped), the file layout a
 * PyTorch user sees, retention, and refusal of truncated, corrupt and
 * incomplete checkpoints with fallback to the previous one; --init-from
 * files (PyTorch-style, no metadata) with every mismatch named. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "checkpoint.h"
#include "log.h"
#include "model.h"
#include "safetensors.h"

static char g_dir[] = "/tmp/ps_test_ckpt_XXXXXX";

#define CONTAINS(msg, s) CHECK_MSG(strstr((msg), (s)) != NULL, "'%s' not in: %s", (s), (msg))

static ps_model *make_model(uint64_t seed, float momentum) {
    ps_model_opts o = {0};
    o.arch = "mnist_cnn";
    o.cpu_backend = "ref";
    o.seed = seed;
    o.compute_threads = 1;
    o.lr = 0.05f;
    o.momentum = momentum;
    o.weight_decay = 0.001f;
    ps_err e = {0};
    ps_model *m = ps_model_create(&o, &e);
    if (!m) fprintf(stderr, "model: %s\n", e.msg);
    return m;
}

/* One training step on a fixed batch derived from k. */
static void train_step(ps_model *m, int k) {
    enum { N = 2 };
    static float x[N * 28 * 28], out[N * 10], g[N * 10];
    for (int i = 0; i < N * 28 * 28; i++) x[i] = (float)((i * 7 + k * 13) % 29) / 29.0f;
    ps_tape *t = NULL;
    ps_err e = {0};
    CHECK(ps_model_forward(m, x, N, 1, NULL, 1000 + (uint64_t)k, out, &t, NULL, &e) == PS_OK);
    for (int i = 0; i < N * 10; i++) g[i] = (i % 10 == (k + i / 10) % 10) ? -0.5f : 0.05f;
    CHECK(ps_model_backward(m, t, g, &e) == PS_OK);
    CHECK(ps_model_step(m, t, NULL, &e) == PS_OK);
    ps_tape_free(t);
}

static float *weights(ps_model *m) {
    float *w = malloc((size_t)ps_model_num_weights(m) * sizeof(float));
    float *p = w;
    ps_err e = {0};
    for (int i = 0; i < ps_model_num_params(m); i++) {
        CHECK(ps_model_get_param(m, i, p, &e) == PS_OK);
        p += ps_model_param(m, i)->numel;
    }
    return w;
}

static int same_weights(ps_model *a, ps_model *b) {
    float *x = weights(a), *y = weights(b);
    int same = !memcmp(x, y, (size_t)ps_model_num_weights(a) * sizeof(float));
    free(x);
    free(y);
    return same;
}

static void path_of(char *buf, size_t cap, const char *dir, uint64_t v, const char *suffix) {
    snprintf(buf, cap, "%s/ckpt-%012" PRIu64 "%s", dir, v, suffix);
}

static int exists(const char *p) { return access(p, F_OK) == 0; }

static long file_size(const char *p) {
    struct stat sb;
    return stat(p, &sb) ? -1 : (long)sb.st_size;
}

static void test_round_trip(void) {
    char dir[256], p[PS_CKPT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/rt", g_dir);
    ps_err e = {0};
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK);
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK); /* exists: fine */

    ps_model *a = make_model(1, 0.9f);
    train_step(a, 0);
    train_step(a, 1);
    ps_ckpt_info info;
    CHECK(ps_ckpt_save(a, dir, 64, 3, &info, &e) == PS_OK);
    CHECK(info.version == 2 && info.samples == 64);
    path_of(p, sizeof p, dir, 2, ".safetensors");
    CHECK(!strcmp(info.path, p) && exists(p));
    path_of(p, sizeof p, dir, 2, ".optim.safetensors");
    CHECK(exists(p));

    /* What a PyTorch user sees: state_dict names and shapes, F32, metadata. */
    ps_st_file *f = ps_st_read(info.path, &e);
    CHECK(f != NULL);
    if (f) {
        CHECK(ps_st_count(f) == (size_t)ps_model_num_params(a));
        for (int i = 0; i < ps_model_num_params(a); i++) {
            const ps_param_info *pi = ps_model_param(a, i);
            const ps_st_tensor *t = ps_st_find(f, pi->name);
            CHECK_MSG(t != NULL, "%s missing", pi->name);
            if (!t) continue;
            CHECK(t->dtype == PS_ST_F32 && t->ndim == pi->ndim);
            for (int d = 0; d < pi->ndim; d++) CHECK(t->dims[d] == pi->dims[d]);
        }
        CHECK(ps_st_find(f, "conv1.weight") && ps_st_find(f, "fc2.bias"));
        CHECK(!strcmp(ps_st_metadata(f, "format"), "pt"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.model_version"), "2"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.global_step"), "2"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.samples"), "64"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.arch"), "mnist_cnn"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.optimizer_file"), "ckpt-000000000002.optim.safetensors"));
        ps_st_free(f);
    }
    f = ps_st_read(p, &e);
    CHECK(f != NULL);
    if (f) {
        CHECK(ps_st_count(f) == (size_t)ps_model_num_params(a)); /* every buffer started */
        const ps_st_tensor *t = ps_st_find(f, "fc1.weight.momentum_buffer");
        CHECK(t && t->ndim == 2 && t->dims[0] == 128 && t->dims[1] == 9216);
        ps_st_free(f);
    }

    /* Resume into a differently initialised model: same weights, version,
     * and the next step identical (so the momentum buffers came back). */
    ps_model *b = make_model(7, 0.9f);
    CHECK(!same_weights(a, b));
    ps_ckpt_info got;
    CHECK(ps_ckpt_load(b, info.path, &got, &e) == PS_OK);
    CHECK(got.version == 2 && got.samples == 64 && got.time == info.time);
    CHECK(ps_model_version(b) == 2);
    CHECK(same_weights(a, b));
    /* Control: weights alone (momentum restarted) give a different step. */
    ps_model *c = make_model(7, 0.9f);
    CHECK(ps_ckpt_init_from(c, info.path, &e) == PS_OK);
    CHECK(same_weights(a, c) && ps_model_version(c) == 0);
    train_step(a, 2);
    train_step(b, 2);
    train_step(c, 2);
    CHECK(same_weights(a, b));
    CHECK(!same_weights(a, c));
    CHECK(ps_model_version(b) == 3);

    /* A model without momentum writes an optimizer file with no tensors. */
    ps_model *plain = make_model(3, 0.0f);
    train_step(plain, 0);
    char dir2[256];
    snprintf(dir2, sizeof dir2, "%s/plain", g_dir);
    CHECK(ps_ckpt_prepare_dir(dir2, &e) == PS_OK);
    CHECK(ps_ckpt_save(plain, dir2, 2, 1, &info, &e) == PS_OK);
    ps_model *plain2 = make_model(4, 0.0f);
    CHECK(ps_ckpt_load(plain2, info.path, NULL, &e) == PS_OK);
    CHECK(same_weights(plain, plain2) && ps_model_version(plain2) == 1);
    /* ... which a model with momentum loads with its buffers not started. */
    ps_model *mom = make_model(4, 0.9f);
    CHECK(ps_ckpt_load(mom, info.path, NULL, &e) == PS_OK);
    CHECK(same_weights(plain, mom));

    ps_model_free(a);
    ps_model_free(b);
    ps_model_free(c);
    ps_model_free(plain);
    ps_model_free(plain2);
    ps_model_free(mom);
}

/* Retention, then fallbacks: truncated, corrupt, sibling missing, none. */
static void test_fallback(void) {
    char dir[256], p[PS_CKPT_PATH_MAX], q[PS_CKPT_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/fb", g_dir);
    ps_err e = {0};
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK);
    ps_model *a = make_model(1, 0.5f);
    ps_model *snap[6] = {0};
    for (int k = 1; k <= 5; k++) {
        train_step(a, k);
        CHECK(ps_ckpt_save(a, dir, (uint64_t)k, 3, NULL, &e) == PS_OK);
        snap[k] = make_model(99, 0.5f);
        path_of(p, sizeof p, dir, (uint64_t)k, ".safetensors");
        CHECK(ps_ckpt_load(snap[k], p, NULL, &e) == PS_OK);
    }
    /* keep = 3: versions 3, 4, 5 remain, with their optimizer files. */
    for (int k = 1; k <= 5; k++) {
        path_of(p, sizeof p, dir, (uint64_t)k, ".safetensors");
        CHECK_MSG(exists(p) == (k >= 3), "version %d present: %d", k, exists(p));
        path_of(p, sizeof p, dir, (uint64_t)k, ".optim.safetensors");
        CHECK(exists(p) == (k >= 3));
    }

    ps_model *b = make_model(5, 0.5f);
    int found = 0;
    ps_ckpt_info info;
    CHECK(ps_ckpt_restore_latest(b, dir, &found, &info, &e) == PS_OK);
    CHECK(found && info.version == 5 && ps_model_version(b) == 5 && same_weights(b, snap[5]));

    /* Truncate the newest: refused, 4 used, 5 renamed out of the way. */
    path_of(p, sizeof p, dir, 5, ".safetensors");
    long sz = file_size(p);
    CHECK(sz > 1000 && truncate(p, sz / 2) == 0);
    e.msg[0] = '\0';
    CHECK(ps_ckpt_load(b, p, NULL, &e) != PS_OK);
    CONTAINS(e.msg, p);
    CHECK(ps_ckpt_restore_latest(b, dir, &found, &info, &e) == PS_OK);
    CHECK(found && info.version == 4 && ps_model_version(b) == 4 && same_weights(b, snap[4]));
    snprintf(q, sizeof q, "%s.refused", p);
    CHECK(!exists(p) && exists(q));

    /* Flip one byte of tensor data (structure intact): the CRC catches it. */
    path_of(p, sizeof p, dir, 4, ".safetensors");
    FILE *f = fopen(p, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, -100, SEEK_END);
        int ch = fgetc(f);
        fseek(f, -100, SEEK_END);
        fputc(ch ^ 0x10, f);
        fclose(f);
    }
    CHECK(ps_ckpt_load(b, p, NULL, &e) == PS_ERR_FORMAT);
    CONTAINS(e.msg, "data is corrupt (CRC-32");
    CHECK(ps_ckpt_restore_latest(b, dir, &found, &info, &e) == PS_OK);
    CHECK(found && info.version == 3 && same_weights(b, snap[3]));

    /* All refused: an error, and nothing renamed (a restart says it again). */
    path_of(p, sizeof p, dir, 3, ".optim.safetensors");
    CHECK(unlink(p) == 0);
    path_of(p, sizeof p, dir, 3, ".safetensors");
    CHECK(ps_ckpt_load(b, p, NULL, &e) == PS_ERR_NOT_FOUND);
    CONTAINS(e.msg, "optimizer state of");
    CHECK(ps_ckpt_restore_latest(b, dir, &found, &info, &e) == PS_ERR_FORMAT);
    CHECK(!found);
    CONTAINS(e.msg, "none of the 1 checkpoints can be used");
    CHECK(exists(p));

    /* An empty directory: nothing to restore, not an error. */
    char empty[256];
    snprintf(empty, sizeof empty, "%s/empty", g_dir);
    CHECK(ps_ckpt_prepare_dir(empty, &e) == PS_OK);
    CHECK(ps_ckpt_restore_latest(b, empty, &found, &info, &e) == PS_OK && !found);

    ps_model_free(a);
    ps_model_free(b);
    for (int k = 1; k <= 5; k++) ps_model_free(snap[k]);
}

/* Write the model's weights as PyTorch's save_file would, with edits. */
enum { EDIT_NONE, EDIT_SHAPE, EDIT_MISSING, EDIT_EXTRA, EDIT_F64, EDIT_NAN };
static void write_export(ps_model *m, const char *path, int edit) {
    int np = ps_model_num_params(m);
    float *w = weights(m);
    ps_st_tensor t[16];
    double *d64[16] = {0};
    int n = 0;
    float *p = w;
    static float extra[3] = {1, 2, 3};
    for (int i = 0; i < np; i++) {
        const ps_param_info *pi = ps_model_param(m, i);
        ps_st_tensor *x = &t[n];
        memset(x, 0, sizeof *x);
        snprintf(x->name, sizeof x->name, "%s", pi->name);
        x->dtype = PS_ST_F32;
        x->ndim = pi->ndim;
        memcpy(x->dims, pi->dims, sizeof pi->dims);
        x->data = p;
        x->bytes = (size_t)pi->numel * sizeof(float);
        if (edit == EDIT_SHAPE && !strcmp(pi->name, "fc1.weight")) { x->dims[0] = 9216; x->dims[1] = 128; }
        if (edit == EDIT_NAN && !strcmp(pi->name, "fc2.bias")) p[3] = NAN;
        if (edit == EDIT_F64) {
            d64[i] = malloc((size_t)pi->numel * sizeof(double));
            for (int64_t j = 0; j < pi->numel; j++) d64[i][j] = p[j];
            x->dtype = PS_ST_F64;
            x->data = d64[i];
            x->bytes = (size_t)pi->numel * sizeof(double);
        }
        p += pi->numel;
        if (!(edit == EDIT_MISSING && !strcmp(pi->name, "conv2.bias"))) n++;
    }
    if (edit == EDIT_EXTRA) {
        memset(&t[n], 0, sizeof t[n]);
        snprintf(t[n].name, sizeof t[n].name, "fc3.bias");
        t[n].dtype = PS_ST_F32;
        t[n].ndim = 1;
        t[n].dims[0] = 3;
        t[n].data = extra;
        t[n].bytes = sizeof extra;
        n++;
    }
    ps_err e = {0};
    CHECK_MSG(ps_st_write(path, t, (size_t)n, NULL, &e) == PS_OK, "%s", e.msg);
    for (int i = 0; i < 16; i++) free(d64[i]);
    free(w);
}

static void test_init_from(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/export.safetensors", g_dir);
    ps_model *src = make_model(11, 0.9f);
    train_step(src, 0);
    ps_model *m = make_model(12, 0.9f);
    ps_err e = {0};

    write_export(src, path, EDIT_NONE);
    CHECK(ps_ckpt_init_from(m, path, &e) == PS_OK);
    CHECK(same_weights(src, m) && ps_model_version(m) == 0);
    /* ... and not as a checkpoint: no psd metadata. */
    CHECK(ps_ckpt_load(m, path, NULL, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "no psd.arch metadata");

    ps_model *f = make_model(13, 0.9f);
    write_export(src, path, EDIT_F64);
    CHECK(ps_ckpt_init_from(f, path, &e) == PS_OK);
    CHECK(same_weights(src, f));

    ps_model *fresh = make_model(12, 0.9f);
    write_export(src, path, EDIT_SHAPE);
    CHECK(ps_ckpt_init_from(fresh, path, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "tensor 'fc1.weight' has shape (9216, 128); the model's fc1.weight is (128, 9216)");
    write_export(src, path, EDIT_MISSING);
    CHECK(ps_ckpt_init_from(fresh, path, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "tensor 'conv2.bias' is missing");
    write_export(src, path, EDIT_EXTRA);
    CHECK(ps_ckpt_init_from(fresh, path, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "unexpected tensor 'fc3.bias'");
    write_export(src, path, EDIT_NAN);
    CHECK(ps_ckpt_init_from(fresh, path, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "tensor 'fc2.bias': element 3 is NaN");
    /* Refusals change nothing. */
    ps_model *ref = make_model(12, 0.9f);
    CHECK(same_weights(fresh, ref));
    snprintf(path, sizeof path, "%s/nothing.safetensors", g_dir);
    CHECK(ps_ckpt_init_from(fresh, path, &e) == PS_ERR_NOT_FOUND);
    CONTAINS(e.msg, path);

    ps_model_free(src);
    ps_model_free(m);
    ps_model_free(f);
    ps_model_free(fresh);
    ps_model_free(ref);
}

int main(void) {
    ps_log_set_level(PS_LOG_ERROR);
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_round_trip();
    test_fallback();
    test_init_from();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "test_checkpoint: could not remove %s\n", g_dir);
    return check_summary("test_checkpoint");
}
