/* test_checkpoint.c - psd's checkpoints (server/checkpoint.c): round trip of
 * weights, momentum buffers and version (a resumed model must take the next
 * step bit-identically to the one that never stopped), the file layout a
 * PyTorch user sees, retention, and refusal of truncated, corrupt and
 * incomplete checkpoints with fallback to the previous one; --init-from
 * files (PyTorch-style, no metadata) with every mismatch named. The generic
 * optimizer state (ps_ckpt_optim_*): Adam interrupted by a checkpoint
 * resumes bit-identically to an uninterrupted run; a checkpoint of one
 * optimizer is refused by another; files from before psd.optimizer read as
 * SGD; incomplete Adam state, stray tensors, bad steps, corruption refused.
 * Through the model (ps_ckpt_save / ps_ckpt_load): rnn_lm under Adam
 * (SparseAdam on its embedding) and mnist_cnn under Adam with weight decay
 * trained N steps, checkpointed, loaded into a differently initialised
 * model and trained M more equal N+M uninterrupted steps bit for bit -
 * weights, every state buffer and every parameter's step count (the
 * embedding skips some steps, so its count is not the version); a model
 * whose optimizer differs from the checkpoint's refuses it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "checkpoint.h"
#include "backend.h"
#include "log.h"
#include "model.h"
#include "optim.h"
#include "safetensors.h"
#include "support/model_run.h"
#include "support/tmpdir.h"

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
    CHECK(run_forward(m, x, N, 1, NULL, 1000 + (uint64_t)k, out, &t, NULL, &e) == PS_OK);
    for (int i = 0; i < N * 10; i++) g[i] = (i % 10 == (k + i / 10) % 10) ? -0.5f : 0.05f;
    ps_grads *gr = run_backward(m, t, g, &e);
    CHECK(gr != NULL);
    CHECK(gr && ps_model_step_grads(m, gr, NULL, &e) == PS_OK);
    ps_grads_free(gr);
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
        /* every buffer started, and every parameter's step */
        CHECK(ps_st_count(f) == 2 * (size_t)ps_model_num_params(a));
        const ps_st_tensor *t = ps_st_find(f, "fc1.weight.momentum_buffer");
        CHECK(t && t->ndim == 2 && t->dims[0] == 128 && t->dims[1] == 9216);
        t = ps_st_find(f, "fc1.weight.step");
        CHECK(t && t->dtype == PS_ST_I64 && t->ndim == 0 && *(const int64_t *)t->data == 2);
        CHECK(!strcmp(ps_st_metadata(f, "psd.optimizer"), "sgd"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.optim_state"), "momentum_buffer"));
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
    /* psd --check-config's dry run: the same choice, nothing renamed */
    int refused = -1;
    found = 0;
    CHECK(ps_ckpt_check_restore(b, dir, NULL, &found, &refused, &info, &e) == PS_OK);
    CHECK(found && refused == 1 && info.version == 4 && same_weights(b, snap[4]));
    CHECK(exists(p));
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
    e.msg[0] = '\0';
    CHECK(ps_ckpt_check_restore(b, dir, NULL, &found, &refused, &info, &e) == PS_ERR_FORMAT && !found);
    CONTAINS(e.msg, "none of the 1 checkpoints can be used");

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
enum { EDIT_NONE, EDIT_SHAPE, EDIT_MISSING, EDIT_EXTRA, EDIT_F64, EDIT_NAN, EDIT_F64_HUGE };
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
        if (edit == EDIT_F64 || edit == EDIT_F64_HUGE) {
            d64[i] = malloc((size_t)pi->numel * sizeof(double));
            for (int64_t j = 0; j < pi->numel; j++) d64[i][j] = p[j];
            if (edit == EDIT_F64_HUGE && !strcmp(pi->name, "fc2.bias")) d64[i][4] = 1e300;  /* finite, not in float32 */
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
    write_export(src, path, EDIT_F64_HUGE);
    CHECK(ps_ckpt_init_from(fresh, path, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "tensor 'fc2.bias' element 4 is 1e+300, beyond float32's range");
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

/* ---- generic optimizer state: Adam ---- */

enum { OP_N = 3 };
static const char *const kOpNames[OP_N] = { "emb.weight", "fc.weight", "fc.bias" };
static const int64_t kOpDims[OP_N][2] = { { 10, 4 }, { 3, 5 }, { 3, 0 } };

typedef struct adam_run {
    ps_backend *b;
    ps_optim_spec spec;
    int64_t numel[OP_N];
    float *w[OP_N];             /* device */
    ps_optim_state st[OP_N];
} adam_run;

static void run_init(adam_run *r, ps_backend *b) {
    memset(r, 0, sizeof *r);
    r->b = b;
    ps_optim_spec_default(PS_OPTIM_ADAM, &r->spec);
    r->spec.lr = 0.01;
    r->spec.weight_decay = 0.02;
    r->spec.beta1 = 0.8;
    for (int p = 0; p < OP_N; p++) {
        r->numel[p] = kOpDims[p][0] * (kOpDims[p][1] ? kOpDims[p][1] : 1);
        float *h = calloc((size_t)r->numel[p], sizeof *h);
        for (int64_t i = 0; i < r->numel[p]; i++) h[i] = (float)((i * 37 + p * 11) % 23) / 23.0f - 0.5f;
        ps_err e = {0};
        r->w[p] = ps_backend_alloc_floats(b, r->numel[p]);
        CHECK(b->ops->copy_to_device(b->impl, r->w[p], h, (size_t)r->numel[p] * sizeof *h, &e) == PS_OK);
        for (int j = 0; j < 2; j++) {
            r->st[p].buf[j] = ps_backend_alloc_floats(b, r->numel[p]);
            memset(h, 0, (size_t)r->numel[p] * sizeof *h);
            CHECK(b->ops->copy_to_device(b->impl, r->st[p].buf[j], h, (size_t)r->numel[p] * sizeof *h, &e) == PS_OK);
        }
        free(h);
    }
}

static void run_free(adam_run *r) {
    for (int p = 0; p < OP_N; p++) {
        ps_backend_release(r->b, r->w[p]);
        ps_backend_release(r->b, r->st[p].buf[0]);
        ps_backend_release(r->b, r->st[p].buf[1]);
    }
}

/* Global step k (1-based): emb.weight takes row-sparse steps (SparseAdam),
 * fc.weight dense ones, fc.bias only from k = 3 (so a checkpoint after
 * step 2 holds no state for it). */
static void run_step(adam_run *r, int k) {
    ps_err e = {0};
    for (int p = 0; p < OP_N; p++) {
        if (p == 2 && k < 3) continue;
        float g[64];
        for (int64_t i = 0; i < r->numel[p]; i++) g[i] = (float)(((i + 3) * (k + 5) * 7 + p) % 19) / 9.5f - 1.0f;
        float *gd = ps_backend_alloc_floats(r->b, r->numel[p]);
        CHECK(r->b->ops->copy_to_device(r->b->impl, gd, g, (size_t)r->numel[p] * sizeof(float), &e) == PS_OK);
        if (p == 0) {
            const int64_t rows[3] = { k % 10, (k * 3 + 1) % 10, (k * 7 + 5) % 10 };
            ps_optim_spec sp = r->spec;
            sp.weight_decay = 0; /* SparseAdam has none */
            CHECK_MSG(ps_optim_step_rows(r->b, &sp, 10, 4, rows, rows[2] == rows[0] || rows[2] == rows[1] ? 2 : 3,
                                         r->w[p], gd, &r->st[p], &e) == PS_OK, "%s", e.msg);
        } else {
            CHECK_MSG(ps_optim_step(r->b, &r->spec, r->numel[p], r->w[p], gd, &r->st[p], &e) == PS_OK, "%s", e.msg);
        }
        ps_backend_release(r->b, gd);
    }
}

/* Host copies of the run's state as the checkpoint sees it. */
static void run_export(adam_run *r, ps_ckpt_optim_param *q, float *host) {
    ps_err e = {0};
    for (int p = 0; p < OP_N; p++) {
        q[p].name = kOpNames[p];
        q[p].ndim = kOpDims[p][1] ? 2 : 1;
        q[p].dims[0] = kOpDims[p][0];
        q[p].dims[1] = kOpDims[p][1];
        q[p].numel = r->numel[p];
        q[p].step = r->st[p].step;
        for (int j = 0; j < 2; j++) {
            q[p].state[j] = host + (p * 2 + j) * 64;
            CHECK(r->b->ops->copy_to_host(r->b->impl, q[p].state[j], r->st[p].buf[j],
                                          (size_t)r->numel[p] * sizeof(float), &e) == PS_OK);
        }
    }
}

static int runs_equal(adam_run *a, adam_run *b) {
    int same = 1;
    float ha[64], hb[64];
    ps_err e = {0};
    for (int p = 0; p < OP_N; p++) {
        float *da[3] = { a->w[p], a->st[p].buf[0], a->st[p].buf[1] }, *db[3] = { b->w[p], b->st[p].buf[0], b->st[p].buf[1] };
        for (int k = 0; k < 3; k++) {
            a->b->ops->copy_to_host(a->b->impl, ha, da[k], (size_t)a->numel[p] * sizeof(float), &e);
            b->b->ops->copy_to_host(b->b->impl, hb, db[k], (size_t)b->numel[p] * sizeof(float), &e);
            same &= !memcmp(ha, hb, (size_t)a->numel[p] * sizeof(float));
        }
        same &= a->st[p].step == b->st[p].step;
    }
    return same;
}

/* Write a small safetensors file with the given tensors and metadata. */
static void write_raw(const char *path, const ps_st_tensor *t, size_t n, const char *const *meta) {
    ps_err e = {0};
    CHECK_MSG(ps_st_write(path, t, n, meta, &e) == PS_OK, "%s", e.msg);
}

static void test_optim_state(void) {
    char path[512], sgd_path[512], p2[512];
    ps_err e = {0};
    ps_backend *b = ps_backend_create("ref", 0, 0, &e);
    PS_ASSERT(b);

    /* A: 5 uninterrupted steps. B: 2 steps, checkpoint, a fresh run whose
     * state comes only from the file (buffers start as garbage), 3 steps. */
    adam_run a, bb, c;
    run_init(&a, b);
    run_init(&bb, b);
    for (int k = 1; k <= 5; k++) run_step(&a, k);
    for (int k = 1; k <= 2; k++) run_step(&bb, k);
    static float host[OP_N * 2 * 64], back[OP_N * 2 * 64];
    ps_ckpt_optim_param q[OP_N] = {{0}}, r[OP_N] = {{0}};
    run_export(&bb, q, host);
    CHECK(q[2].step == 0 && q[0].step == 2 && q[1].step == 2);
    ps_ckpt_optim o = { PS_OPTIM_ADAM, OP_N, q };
    snprintf(path, sizeof path, "%s/adam.optim.safetensors", g_dir);
    CHECK_MSG(ps_ckpt_optim_write(path, &o, "toy", 2, &e) == PS_OK, "%s", e.msg);
    ps_st_file *f = ps_st_read(path, &e);
    CHECK(f != NULL);
    if (f) {  /* what a PyTorch user sees: state keys under the parameter's name */
        CHECK(ps_st_count(f) == 6); /* fc.bias has no state yet */
        CHECK(ps_st_find(f, "emb.weight.exp_avg") && ps_st_find(f, "fc.weight.exp_avg_sq"));
        CHECK(ps_st_find(f, "fc.weight.step") && !ps_st_find(f, "fc.bias.step") && !ps_st_find(f, "fc.bias.exp_avg"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.optimizer"), "adam"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.optim_state"), "exp_avg,exp_avg_sq"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.model_version"), "2"));
        ps_st_free(f);
    }
    for (size_t i = 0; i < sizeof back / sizeof back[0]; i++) back[i] = 7.0f;
    memcpy(r, q, sizeof r);
    for (int p = 0; p < OP_N; p++) {
        r[p].step = 99;
        for (int j = 0; j < 2; j++) r[p].state[j] = back + (p * 2 + j) * 64;
    }
    ps_ckpt_optim in = { PS_OPTIM_ADAM, OP_N, r };
    CHECK_MSG(ps_ckpt_optim_read(path, &in, "toy", 2, &e) == PS_OK, "%s", e.msg);
    CHECK(r[0].step == 2 && r[1].step == 2 && r[2].step == 0);
    CHECK(r[0].has_state && r[1].has_state && !r[2].has_state);
    CHECK(r[2].state[0][0] == 0.0f && r[2].state[1][2] == 0.0f); /* zero-filled, not left at 7 */
    run_init(&c, b);
    for (int p = 0; p < OP_N; p++) {  /* weights come from the weights file; here from bb */
        float hw[64];
        CHECK(b->ops->copy_to_host(b->impl, hw, bb.w[p], (size_t)bb.numel[p] * sizeof(float), &e) == PS_OK);
        CHECK(b->ops->copy_to_device(b->impl, c.w[p], hw, (size_t)c.numel[p] * sizeof(float), &e) == PS_OK);
        for (int j = 0; j < 2; j++)
            CHECK(b->ops->copy_to_device(b->impl, c.st[p].buf[j], r[p].state[j], (size_t)c.numel[p] * sizeof(float),
                                         &e) == PS_OK);
        c.st[p].step = r[p].step;
    }
    for (int k = 3; k <= 5; k++) run_step(&c, k);
    CHECK_MSG(runs_equal(&a, &c), "Adam resumed from a checkpoint differs from the uninterrupted run");
    /* Control: the same resume without the moments (step kept) differs. */
    adam_run d;
    run_init(&d, b);
    for (int p = 0; p < OP_N; p++) {
        float hw[64];
        b->ops->copy_to_host(b->impl, hw, bb.w[p], (size_t)bb.numel[p] * sizeof(float), &e);
        b->ops->copy_to_device(b->impl, d.w[p], hw, (size_t)d.numel[p] * sizeof(float), &e);
        d.st[p].step = r[p].step;
    }
    for (int k = 3; k <= 5; k++) run_step(&d, k);
    CHECK(!runs_equal(&a, &d));

    /* Other readers of the same file. */
    CHECK(ps_ckpt_optim_read(path, &in, "toy", 3, &e) == PS_ERR_FORMAT);
    CONTAINS(e.msg, "psd.model_version is not 3");
    CHECK(ps_ckpt_optim_read(path, &in, "mnist_cnn", 2, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "optimizer state of model 'toy'; psd runs 'mnist_cnn'");
    ps_ckpt_optim as_sgd = { PS_OPTIM_SGD, OP_N, r };
    CHECK(ps_ckpt_optim_read(path, &as_sgd, "toy", 2, &e) == PS_ERR_FAILED_PRECONDITION);
    CONTAINS(e.msg, "optimizer state of adam (exp_avg,exp_avg_sq); psd runs sgd");
    CONTAINS(e.msg, "psd --init-from");

    /* An SGD checkpoint is refused by Adam, and read by SGD. */
    for (int p = 0; p < OP_N; p++) q[p].state[1] = NULL;
    ps_ckpt_optim so = { PS_OPTIM_SGD, OP_N, q };
    snprintf(sgd_path, sizeof sgd_path, "%s/sgd.optim.safetensors", g_dir);
    CHECK_MSG(ps_ckpt_optim_write(sgd_path, &so, "toy", 2, &e) == PS_OK, "%s", e.msg);
    CHECK(ps_ckpt_optim_read(sgd_path, &in, "toy", 2, &e) == PS_ERR_FAILED_PRECONDITION);
    CONTAINS(e.msg, "optimizer state of sgd (momentum_buffer); psd runs adam, whose state it is not");
    CHECK(ps_ckpt_optim_read(sgd_path, &as_sgd, "toy", 2, &e) == PS_OK);
    CHECK(r[0].has_state && !memcmp(r[0].state[0], q[0].state[0], 40 * sizeof(float)));

    /* A file from before psd.optimizer: SGD momentum, steps = the version. */
    const int64_t dims_fw[2] = { 3, 5 };
    ps_st_tensor legacy = { .name = "fc.weight.momentum_buffer", .dtype = PS_ST_F32, .ndim = 2,
                            .dims = { dims_fw[0], dims_fw[1] }, .data = q[1].state[0], .bytes = 15 * sizeof(float) };
    char crc[16];
    {   /* its CRC is over the momentum tensors, as psd wrote it */
        uLong x = crc32(0L, Z_NULL, 0);
        x = crc32(x, (const unsigned char *)q[1].state[0], 15 * sizeof(float));
        snprintf(crc, sizeof crc, "%08lx", (unsigned long)x);
    }
    const char *lmeta[] = { "psd.arch", "toy", "psd.model_version", "4", "psd.crc32", crc, NULL };
    snprintf(p2, sizeof p2, "%s/legacy.optim.safetensors", g_dir);
    write_raw(p2, &legacy, 1, lmeta);
    CHECK(ps_ckpt_optim_read(p2, &in, "toy", 4, &e) == PS_ERR_FAILED_PRECONDITION);
    CONTAINS(e.msg, "optimizer state of sgd");
    CHECK_MSG(ps_ckpt_optim_read(p2, &as_sgd, "toy", 4, &e) == PS_OK, "%s", e.msg);
    CHECK(r[1].has_state && !r[0].has_state && r[0].step == 4 && r[1].step == 4);

    /* Incomplete Adam state, stray tensors, bad steps, corruption. */
    int64_t three = 3, minus = -1;
    ps_st_tensor half[2] = {
        { .name = "fc.weight.exp_avg", .dtype = PS_ST_F32, .ndim = 2, .dims = { 3, 5 }, .data = q[1].state[0],
          .bytes = 15 * sizeof(float) },
        { .name = "fc.weight.step", .dtype = PS_ST_I64, .ndim = 0, .data = &three, .bytes = 8 },
    };
    const char *ameta[] = { "psd.arch", "toy", "psd.model_version", "2", "psd.optimizer", "adam", "psd.crc32",
                            "00000000", NULL };
    write_raw(p2, half, 2, ameta);
    CHECK(ps_ckpt_optim_read(p2, &in, "toy", 2, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "parameter fc.weight took 3 steps but its tensor 'fc.weight.exp_avg_sq' is missing");
    ps_st_tensor stray = half[0];
    snprintf(stray.name, sizeof stray.name, "fc.weight.momentum_buffer");
    write_raw(p2, &stray, 1, ameta);
    CHECK(ps_ckpt_optim_read(p2, &in, "toy", 2, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "unexpected tensor 'fc.weight.momentum_buffer' (not the adam state of a parameter of model toy)");
    ps_st_tensor neg = half[1];
    neg.data = &minus;
    write_raw(p2, &neg, 1, ameta);
    CHECK(ps_ckpt_optim_read(p2, &in, "toy", 2, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "tensor 'fc.weight.step' is -1 (negative)");
    ps_st_tensor nostep = half[0];
    write_raw(p2, &nostep, 1, ameta);
    CHECK(ps_ckpt_optim_read(p2, &in, "toy", 2, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "parameter fc.weight has optimizer state but no step");
    const char *kmeta[] = { "psd.arch", "toy", "psd.model_version", "2", "psd.optimizer", "adagrad", NULL };
    write_raw(p2, NULL, 0, kmeta);
    CHECK(ps_ckpt_optim_read(p2, &in, "toy", 2, &e) == PS_ERR_FORMAT);
    CONTAINS(e.msg, "psd.optimizer 'adagrad' is not an optimizer this build knows");
    {   /* one flipped bit in the Adam file's data */
        FILE *fp = fopen(path, "r+b");
        CHECK(fp != NULL);
        if (fp) {
            fseek(fp, -3, SEEK_END);
            int ch = fgetc(fp);
            fseek(fp, -3, SEEK_END);
            fputc(ch ^ 0x10, fp);
            fclose(fp);
        }
        CHECK(ps_ckpt_optim_read(path, &in, "toy", 2, &e) == PS_ERR_FORMAT);
        CONTAINS(e.msg, "data is corrupt (CRC-32");
    }
    run_free(&a);
    run_free(&bb);
    run_free(&c);
    run_free(&d);
    ps_backend_free(b);
}

/* Names and leftovers in the checkpoint directory: a FIFO named like the
 * newest checkpoint is refused without blocking, versions of 13+ digits
 * are found, and *.tmp files left by a crash are deleted at restore. */
static void test_dir_oddities(void) {
    char dir[256], p[PS_CKPT_PATH_MAX], q[PS_CKPT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/odd", g_dir);
    ps_err e = {0};
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK);
    ps_model *a = make_model(1, 0.5f);
    train_step(a, 1);
    CHECK(ps_ckpt_save(a, dir, 1, 3, NULL, &e) == PS_OK);
    ps_model *b = make_model(5, 0.5f);
    int found = 0;
    ps_ckpt_info info;

    /* a version past 10^12: "%012" gives 13 digits */
    path_of(p, sizeof p, dir, 1, ".safetensors");
    snprintf(q, sizeof q, "%s/ckpt-1000000000000.safetensors", dir);
    CHECK(rename(p, q) == 0);
    CHECK(ps_ckpt_restore_latest(b, dir, &found, &info, &e) == PS_OK);
    CHECK_MSG(found && ps_model_version(b) == 1, "a 13-digit checkpoint name was %s", found ? "used" : "ignored");
    CHECK(rename(q, p) == 0);

    /* a FIFO as the newest: refused (not a regular file), version 1 used */
    alarm(60);  /* a hang is a failure, not a stuck test run */
    path_of(q, sizeof q, dir, 9, ".safetensors");
    CHECK(mkfifo(q, 0600) == 0);
    ps_model *c = make_model(6, 0.5f);
    CHECK(ps_ckpt_restore_latest(c, dir, &found, &info, &e) == PS_OK);
    CHECK(found && ps_model_version(c) == 1);
    alarm(0);

    /* leftovers of a write cut by a crash */
    snprintf(q, sizeof q, "%s/ckpt-000000000007.safetensors.tmp", dir);
    FILE *f = fopen(q, "wb");
    CHECK(f != NULL);
    if (f) { fputs("partial", f); fclose(f); }
    CHECK(ps_ckpt_restore_latest(c, dir, &found, &info, &e) == PS_OK);
    CHECK_MSG(!exists(q), "%s was not cleaned up", q);
    ps_model_free(a);
    ps_model_free(b);
    ps_model_free(c);
}

/* ---- Adam through the model ---- */

static ps_model *make_adam(const char *arch, uint64_t seed, double weight_decay) {
    ps_optim_spec s;
    ps_optim_spec_default(PS_OPTIM_ADAM, &s);
    s.lr = 0.01;
    s.beta1 = 0.8;
    s.weight_decay = weight_decay;
    ps_model_opts o = {.arch = arch, .cpu_backend = "dnnl", .seed = seed, .compute_threads = 1, .optim = &s};
    if (!strcmp(arch, "rnn_lm")) {
        o.n_sizes = 3;
        o.size_key[0] = "ntoken"; o.size_value[0] = 40;
        o.size_key[1] = "ninp";   o.size_value[1] = 6;
        o.size_key[2] = "nhid";   o.size_value[2] = 6;
    }
    ps_err e = {0};
    ps_model *m = ps_model_create(&o, &e);
    CHECK_MSG(m != NULL, "%s adam: %s", arch, e.msg);
    return m;
}

/* rnn_lm step k: both stages, except every third step the decoder alone
 * (so the embedding's step count falls behind the version). */
static void lm_step(ps_model *m, int k) {
    enum { N = 8, W = 6, V = 40 };
    int64_t ids[N];
    float e[N * W], h[N * W], out[N * V], ge[N * W], gd[N * V];
    for (int i = 0; i < N; i++) ids[i] = (i * 7 + k * 5) % 17;   /* rows 0..16 of 40 */
    for (int i = 0; i < N * W; i++) {
        h[i] = (float)((i * 5 + k * 3) % 11) / 11.0f - 0.5f;
        ge[i] = (float)((i * 3 + k) % 13) / 13.0f - 0.4f;
    }
    for (int i = 0; i < N * V; i++) gd[i] = (float)((i * 11 + k * 7) % 23) / 23.0f - 0.45f;
    ps_err err = {0};
    ps_grads *g = ps_grads_create(m, &err);
    ps_tape *te = NULL, *td = NULL;
    if (k % 3 != 2) {
        CHECK(ps_model_forward_range(m, 0, 0, ids, N, 1, NULL, 50 + (uint64_t)k, e, &te, NULL, &err) == PS_OK);
        CHECK(ps_model_backward_acc(m, te, ge, NULL, g, &err) == PS_OK);
    }
    CHECK(ps_model_forward_range(m, 1, 1, h, N, 1, NULL, 90 + (uint64_t)k, out, &td, NULL, &err) == PS_OK);
    CHECK(ps_model_backward_acc(m, td, gd, NULL, g, &err) == PS_OK);
    CHECK_MSG(ps_model_step_grads(m, g, NULL, &err) == PS_OK, "%s", err.msg);
    ps_tape_free(te);
    ps_tape_free(td);
    ps_grads_free(g);
}

/* Weights, steps and both Adam buffers of a and b are identical. */
static int same_training_state(ps_model *a, ps_model *b) {
    const int64_t nw = ps_model_num_weights(a);
    const int np = ps_model_num_params(a);
    float *w[2], *s[2][2];
    int64_t *st[2];
    ps_model *m[2] = {a, b};
    ps_err e = {0};
    for (int x = 0; x < 2; x++) {
        w[x] = malloc((size_t)nw * sizeof(float));
        s[x][0] = malloc((size_t)nw * sizeof(float));
        s[x][1] = malloc((size_t)nw * sizeof(float));
        st[x] = calloc((size_t)np, sizeof *st[x]);
        CHECK(ps_model_snapshot(m[x], w[x], st[x], s[x], NULL, &e) == PS_OK);
    }
    const size_t bytes = (size_t)nw * sizeof(float);
    int same = !memcmp(w[0], w[1], bytes) && !memcmp(s[0][0], s[1][0], bytes) && !memcmp(s[0][1], s[1][1], bytes) &&
               !memcmp(st[0], st[1], (size_t)np * sizeof *st[0]);
    for (int x = 0; x < 2; x++) {
        free(w[x]);
        free(s[x][0]);
        free(s[x][1]);
        free(st[x]);
    }
    return same;
}

static void test_model_adam(void) {
    enum { N = 4, M = 3 };
    ps_err e = {0};
    char dir[256];
    snprintf(dir, sizeof dir, "%s/adam", g_dir);
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK);

    /* rnn_lm: SparseAdam on the embedding, Adam on the decoder. */
    ps_model *a = make_adam("rnn_lm", 5, 0), *b = make_adam("rnn_lm", 5, 0), *c = make_adam("rnn_lm", 6, 0);
    if (!a || !b || !c) goto lm_done;
    for (int k = 0; k < N + M; k++) lm_step(a, k);
    for (int k = 0; k < N; k++) lm_step(b, k);
    ps_ckpt_info info;
    CHECK_MSG(ps_ckpt_save(b, dir, 0, 5, &info, &e) == PS_OK, "%s", e.msg);
    CHECK(info.version == N);
    {   /* the file: Adam state under PyTorch's keys, the embedding's own count */
        char p[PS_CKPT_PATH_MAX];
        path_of(p, sizeof p, dir, N, ".optim.safetensors");
        ps_st_file *f = ps_st_read(p, &e);
        CHECK(f != NULL);
        if (f) {
            CHECK(!strcmp(ps_st_metadata(f, "psd.optimizer"), "adam"));
            const ps_st_tensor *t = ps_st_find(f, "encoder.weight.exp_avg_sq");
            CHECK(t && t->ndim == 2 && t->dims[0] == 40 && t->dims[1] == 6);
            t = ps_st_find(f, "encoder.weight.step");  /* steps 0, 1, 3 of 0..3 touched it */
            CHECK(t && t->dtype == PS_ST_I64 && *(const int64_t *)t->data == 3);
            t = ps_st_find(f, "decoder.bias.step");
            CHECK(t && *(const int64_t *)t->data == N);
            CHECK(ps_st_find(f, "decoder.weight.exp_avg") != NULL);
            ps_st_free(f);
        }
    }
    CHECK(!same_weights(b, c));
    CHECK_MSG(ps_ckpt_load(c, info.path, NULL, &e) == PS_OK, "%s", e.msg);
    CHECK(ps_model_version(c) == N);
    CHECK(same_training_state(b, c));
    for (int k = N; k < N + M; k++) {
        lm_step(b, k);
        lm_step(c, k);
    }
    CHECK(same_training_state(a, c));
    CHECK(same_training_state(a, b));
    /* Control: the weights alone (state restarted) do not resume Adam. */
    ps_model *d = make_adam("rnn_lm", 6, 0);
    if (d) {
        CHECK(ps_ckpt_init_from(d, info.path, &e) == PS_OK);
        ps_model_set_version(d, N);
        for (int k = N; k < N + M; k++) lm_step(d, k);
        CHECK(!same_weights(a, d));
        ps_model_free(d);
    }
lm_done:
    ps_model_free(a);
    ps_model_free(b);
    ps_model_free(c);

    /* mnist_cnn: dense Adam with weight decay; and optimizers do not mix. */
    snprintf(dir, sizeof dir, "%s/adam_cnn", g_dir);
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK);
    a = make_adam("mnist_cnn", 1, 0.01);
    b = make_adam("mnist_cnn", 1, 0.01);
    c = make_adam("mnist_cnn", 2, 0.01);
    ps_model *sgd = make_model(2, 0.9f);
    if (a && b && c && sgd) {
        for (int k = 0; k < 3; k++) train_step(a, k);
        for (int k = 0; k < 2; k++) train_step(b, k);
        CHECK(ps_ckpt_save(b, dir, 0, 5, &info, &e) == PS_OK);
        CHECK(ps_ckpt_load(sgd, info.path, NULL, &e) == PS_ERR_FAILED_PRECONDITION);
        CONTAINS(e.msg, "optimizer state of adam");
        CHECK_MSG(ps_ckpt_load(c, info.path, NULL, &e) == PS_OK, "%s", e.msg);
        train_step(c, 2);
        CHECK(same_training_state(a, c));
    }
    ps_model_free(a);
    ps_model_free(b);
    ps_model_free(c);
    ps_model_free(sgd);
}

/* ---- parts of a cluster (several PS nodes) ---- */

static ps_model *lm_part(int n_hosted, const char *h0, const char *h1, const char *h2, int64_t lo, int64_t hi) {
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = "ref", .seed = 9, .compute_threads = 1, .lr = 0.1f,
                       .n_sizes = 3, .size_key = {"ntoken", "ninp", "nhid"}, .size_value = {21, 4, 3},
                       .n_hosted = n_hosted, .hosted = {h0, h1, h2}, .shard_stage = hi ? "emb" : NULL,
                       .shard_lo = lo, .shard_hi = hi};
    ps_err e = {0};
    ps_model *m = ps_model_create(&o, &e);
    CHECK_MSG(m, "%s", e.msg);
    return m;
}

/* The whole model's state_dict into path; bad: a tensor named so gets a
 * wrong shape; extra: one more tensor of that name. */
static void write_dict(ps_model *m, const char *path, const char *bad, const char *extra) {
    int np = ps_model_num_params(m);
    float *w = weights(m), *p = w;
    static float x3[3] = {1, 2, 3};
    ps_st_tensor t[32];
    int n = 0;
    for (int i = 0; i < np; i++, n++) {
        const ps_param_info *pi = ps_model_param(m, i);
        memset(&t[n], 0, sizeof t[n]);
        snprintf(t[n].name, sizeof t[n].name, "%s", pi->name);
        t[n].dtype = PS_ST_F32;
        t[n].ndim = pi->ndim;
        memcpy(t[n].dims, pi->dims, sizeof pi->dims);
        t[n].data = p;
        t[n].bytes = (size_t)pi->numel * sizeof(float);
        if (bad && !strcmp(bad, pi->name)) { t[n].ndim = 1; t[n].dims[0] = pi->numel; }
        p += pi->numel;
    }
    if (extra) {
        memset(&t[n], 0, sizeof t[n]);
        snprintf(t[n].name, sizeof t[n].name, "%s", extra);
        t[n].dtype = PS_ST_F32;
        t[n].ndim = 1;
        t[n].dims[0] = 3;
        t[n].data = x3;
        t[n].bytes = sizeof x3;
        n++;
    }
    ps_err e = {0};
    CHECK_MSG(ps_st_write(path, t, (size_t)n, NULL, &e) == PS_OK, "%s", e.msg);
    free(w);
}

/* Parameter name of a and b (a shard's rows of b's table when a is one) equal. */
static int same_param(ps_model *a, ps_model *b, const char *name) {
    int i = ps_model_find_param(a, name), j = ps_model_find_param(b, name);
    if (i < 0 || j < 0) return 0;
    const ps_param_info *pa = ps_model_param(a, i);
    float *x = malloc((size_t)pa->numel * sizeof *x), *y = malloc((size_t)ps_model_param(b, j)->numel * sizeof *y);
    ps_err e = {0};
    CHECK(ps_model_get_param(a, i, x, &e) == PS_OK && ps_model_get_param(b, j, y, &e) == PS_OK);
    int64_t first = pa->rows_total ? pa->row_offset * (pa->numel / pa->dims[0]) : 0;
    int same = !memcmp(x, y + first, (size_t)pa->numel * sizeof *x);
    free(x);
    free(y);
    return same;
}

static void test_parts(void) {
    char d0[256], d1[256], p[PS_CKPT_PATH_MAX], full[300];
    snprintf(d0, sizeof d0, "%s/ps0", g_dir);
    snprintf(d1, sizeof d1, "%s/ps1", g_dir);
    snprintf(full, sizeof full, "%s/full.safetensors", g_dir);
    ps_err e = {0};
    CHECK(ps_ckpt_prepare_dir(d0, &e) == PS_OK && ps_ckpt_prepare_dir(d1, &e) == PS_OK);
    /* ps0: emb rows [0, 10); ps1: emb rows [10, 21), decoder and rnn. */
    ps_model *whole = lm_part(0, NULL, NULL, NULL, 0, 0), *a = lm_part(1, "emb", NULL, NULL, 0, 10),
             *b = lm_part(3, "emb", "decoder", "rnn", 10, 21);
    if (!whole || !a || !b) goto out;
    const ps_ckpt_ident i0 = {"lm-demo", "ps0"}, i1 = {"lm-demo", "ps1"};
    ps_model_set_version(a, 5);
    ps_model_set_version(b, 7);
    CHECK(ps_ckpt_save_part(a, d0, &i0, 0, 2, NULL, &e) == PS_OK);
    CHECK(ps_ckpt_save_part(b, d1, &i1, 0, 2, NULL, &e) == PS_OK);
    path_of(p, sizeof p, d0, 5, ".safetensors");
    ps_st_file *f = ps_st_read(p, &e);
    CHECK_MSG(f, "%s", e.msg);
    if (f) {
        const char *v;
        CHECK((v = ps_st_metadata(f, "psd.cluster")) && !strcmp(v, "lm-demo"));
        CHECK((v = ps_st_metadata(f, "psd.server")) && !strcmp(v, "ps0"));
        CHECK((v = ps_st_metadata(f, "psd.hosted")) && !strcmp(v, "emb"));
        CHECK((v = ps_st_metadata(f, "psd.rows.encoder.weight")) && !strcmp(v, "0,10,21"));
        CHECK(ps_st_count(f) == 1 && ps_st_find(f, "encoder.weight")->dims[0] == 10);
        ps_st_free(f);
    }
    path_of(p, sizeof p, d1, 7, ".safetensors");
    if ((f = ps_st_read(p, &e))) {
        const char *v;
        CHECK((v = ps_st_metadata(f, "psd.hosted")) && !strcmp(v, "emb,decoder,rnn"));
        CHECK((v = ps_st_metadata(f, "psd.rows.encoder.weight")) && !strcmp(v, "10,21,21"));
        CHECK(!ps_st_metadata(f, "psd.rows.decoder.weight"));
        ps_st_free(f);
    }

    /* Resume: its own part loads; another server's, cluster's or row range's is refused naming both. */
    int found = 0;
    ps_model *a2 = lm_part(1, "emb", NULL, NULL, 0, 10), *a3 = lm_part(1, "emb", NULL, NULL, 1, 11);
    CHECK(ps_ckpt_restore_latest_part(a2, d0, &i0, &found, NULL, &e) == PS_OK && found);
    CHECK(ps_model_version(a2) == 5 && same_param(a2, a, "encoder.weight"));
    path_of(p, sizeof p, d0, 5, ".safetensors");
    const ps_ckpt_ident other = {"lm-other", "ps0"}, single = {"psd", ""};
    CHECK(ps_ckpt_load_part(a2, p, &i1, NULL, &e) == PS_ERR_FAILED_PRECONDITION);
    CONTAINS(e.msg, "part of server 'ps0'; this psd is server 'ps1'");
    CHECK(ps_ckpt_load_part(a2, p, &other, NULL, &e) == PS_ERR_FAILED_PRECONDITION);
    CONTAINS(e.msg, "part of cluster 'lm-demo'; this psd is of cluster 'lm-other'");
    CHECK(ps_ckpt_load_part(a2, p, &single, NULL, &e) == PS_ERR_FAILED_PRECONDITION);
    CHECK(ps_ckpt_load_part(a3, p, &i0, NULL, &e) == PS_ERR_FAILED_PRECONDITION);
    CONTAINS(e.msg, "holds rows 0,10,21; this psd holds 1,11,21");
    /* A single-server checkpoint is not a cluster server's part, and vice versa. */
    char ds[256];
    snprintf(ds, sizeof ds, "%s/single", g_dir);
    CHECK(ps_ckpt_prepare_dir(ds, &e) == PS_OK);
    CHECK(ps_ckpt_save(whole, ds, 0, 1, NULL, &e) == PS_OK);
    path_of(p, sizeof p, ds, 0, ".safetensors");
    CHECK(ps_ckpt_load(whole, p, NULL, &e) == PS_OK);
    CHECK(ps_ckpt_load_part(whole, p, &i0, NULL, &e) == PS_ERR_FAILED_PRECONDITION);
    ps_model_free(a3);

    /* --init-from a full state_dict: each part takes its tensors and rows. */
    for (int k = 0; k < 3; k++) {   /* make the whole model's values differ from the parts' */
        int64_t ids[4] = {k, 9 + k, 10 + k, 20 - k};
        float out[4 * 4], g[4 * 4];
        for (int i = 0; i < 16; i++) g[i] = (float)(i % 5) - 2.0f;
        ps_tape *t = NULL;
        ps_grads *acc = ps_grads_create(whole, &e);
        CHECK(ps_model_forward_range(whole, 0, 0, ids, 4, 1, NULL, 3, out, &t, NULL, &e) == PS_OK);
        CHECK(ps_model_backward_acc(whole, t, g, NULL, acc, &e) == PS_OK);
        CHECK(ps_model_step_grads(whole, acc, NULL, &e) == PS_OK);
        ps_tape_free(t);
        ps_grads_free(acc);
    }
    CHECK(!same_param(a2, whole, "encoder.weight"));
    write_dict(whole, full, NULL, NULL);
    int skipped = -1;
    CHECK_MSG(ps_ckpt_init_from_part(a2, full, &skipped, &e) == PS_OK, "%s", e.msg);
    CHECK(skipped == 10 && same_param(a2, whole, "encoder.weight"));
    CHECK_MSG(ps_ckpt_init_from_part(b, full, &skipped, &e) == PS_OK, "%s", e.msg);
    CHECK(skipped == 0);
    for (int i = 0; i < ps_model_num_params(whole); i++)
        CHECK_MSG(same_param(b, whole, ps_model_param(whole, i)->name), "%s", ps_model_param(whole, i)->name);
    write_dict(whole, full, "decoder.weight", NULL);   /* hosted elsewhere, still checked */
    CHECK(ps_ckpt_init_from_part(a2, full, NULL, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "'decoder.weight' has shape");
    write_dict(whole, full, NULL, "fc3.bias");
    CHECK(ps_ckpt_init_from_part(a2, full, NULL, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "unexpected tensor 'fc3.bias'");
    write_dict(a2, full, NULL, NULL);   /* only the shard's rows: not a whole state_dict */
    CHECK(ps_ckpt_init_from_part(a2, full, NULL, &e) == PS_ERR_INVALID_ARGUMENT);
    CONTAINS(e.msg, "'encoder.weight' has shape (10, 4); the model's encoder.weight is (21, 4)");
    ps_model_free(a2);
out:
    ps_model_free(whole);
    ps_model_free(a);
    ps_model_free(b);
}

/* Rewrite a checkpoint's weights file with one metadata value replaced
 * (the tensors, hence the CRC, unchanged). */
static void set_meta(const char *path, const char *key, const char *value) {
    ps_err e = {0};
    ps_st_file *f = ps_st_read(path, &e);
    CHECK_MSG(f != NULL, "%s", e.msg);
    if (!f) return;
    size_t nt = ps_st_count(f), nm = ps_st_metadata_count(f);
    ps_st_tensor *t = calloc(nt, sizeof *t);
    const char **kv = calloc(2 * nm + 3, sizeof *kv);
    for (size_t i = 0; i < nt; i++) t[i] = *ps_st_get(f, i);
    size_t k = 0;
    for (size_t i = 0; i < nm; i++) {
        if (!strcmp(ps_st_metadata_key(f, i), key)) continue;
        kv[k++] = ps_st_metadata_key(f, i);
        kv[k++] = ps_st_metadata_value(f, i);
    }
    if (value) kv[k++] = key, kv[k++] = value;
    kv[k] = NULL;
    CHECK_MSG(ps_st_write(path, t, nt, kv, &e) == PS_OK, "%s", e.msg);
    free(t);
    free(kv);
    ps_st_free(f);
}

/* The finished-context records (psd.settle): written under the snapshot,
 * only those the weights hold, read back; a malformed or inconsistent set
 * refuses the checkpoint (the restore falls back to an older one). */
static void test_settle_records(void) {
    char dir[256], p[PS_CKPT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s/settle", g_dir);
    ps_err e = {0};
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK);
    ps_model *m = make_model(21, 0);
    ps_ctx_table_opts to = {.ttl_s = 60, .max_live = 64, .grads_free = free};
    ps_ctx_table *t = ps_ctx_table_create(&to);
    for (uint64_t id = 1; id <= 3; id++) {
        train_step(m, (int)id);
        ps_ctx *c = ps_ctx_table_open(t, 0xfeed00000000ULL + id, 1, NULL, &e);
        c->grads = malloc(8);
        ps_ctx_table_finish(t, c, ps_model_version(m));
    }
    ps_ctx *c = ps_ctx_table_open(t, 0xfeed0000000fULL, 1, NULL, &e);
    c->grads = malloc(8);
    ps_ctx_table_finish(t, c, ps_model_version(m) + 5);  /* a step these weights do not hold */
    ps_ckpt_save_opts so = {.samples = 6, .keep = 3, .contexts = t};
    ps_ckpt_info info;
    CHECK_MSG(ps_ckpt_save_with(m, dir, &so, &info, &e) == PS_OK, "%s", e.msg);
    ps_model *r = make_model(22, 0);
    ps_ckpt_settle st = {0};
    CHECK_MSG(ps_ckpt_load_with(r, info.path, NULL, NULL, &st, &e) == PS_OK, "%s", e.msg);
    CHECK(st.present && st.n == 3 && st.applied == 4);  /* 4 applied, 3 of them in these weights' records */
    for (size_t i = 0; i < st.n && i < 3; i++)
        CHECK(st.rec[i].id == 0xfeed00000001ULL + i && st.rec[i].version == i + 1 && st.rec[i].how == PS_CTX_APPLIED);
    ps_ckpt_settle_free(&st);
    /* plain ps_ckpt_save: no records (present = 0), and loads as before */
    snprintf(dir, sizeof dir, "%s/settle2", g_dir);
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK);
    CHECK(ps_ckpt_save(m, dir, 6, 3, &info, &e) == PS_OK);
    CHECK(ps_ckpt_load_with(r, info.path, NULL, NULL, &st, &e) == PS_OK && !st.present && st.n == 0);
    /* refused: malformed records, a version beyond the weights', a lone count */
    struct { const char *settle, *applied, *want; } bad[] = {
        {"00000000000000zz:1", "1", "psd.settle"},
        {"0000feed00000001:1 0000feed00000002:", "1", "record 1"},
        {"0000feed00000001:99", "1", "version"},
        {"0000feed00000001:1x", "1", "record 0"},
        {"0000feed00000001:1", NULL, "come together"},
        {"0000feed00000001:1", "-1", "come together"},
    };
    path_of(p, sizeof p, dir, 3, ".safetensors");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        set_meta(p, "psd.settle", bad[i].settle);
        set_meta(p, "psd.contexts_applied", bad[i].applied);
        CHECK_MSG(ps_ckpt_load_with(r, p, NULL, NULL, &st, &e) == PS_ERR_FORMAT, "case %zu loaded", i);
        CONTAINS(e.msg, bad[i].want);
    }
    set_meta(p, "psd.settle", "0000feed00000001:1 0000feed00000002:2s 0000feed00000003:3d");
    set_meta(p, "psd.contexts_applied", "1");
    CHECK(ps_ckpt_load_with(r, p, NULL, NULL, &st, &e) == PS_OK && st.n == 3 && st.rec[1].how == PS_CTX_SKIPPED &&
          st.rec[2].how == PS_CTX_DROPPED && st.applied == 1);
    ps_ckpt_settle_free(&st);
    ps_ctx_table_free(t);
    ps_model_free(m);
    ps_model_free(r);
}

/* One server per directory: the lock file names it; a held directory and
 * one named for another server are refused; the same server takes it back
 * after a restart. */
static void test_dir_lock(void) {
    char dir[256];
    snprintf(dir, sizeof dir, "%s/lock", g_dir);
    ps_err e = {0};
    CHECK(ps_ckpt_prepare_dir(dir, &e) == PS_OK);
    const ps_ckpt_ident a = {"mnist-2", "ps0"}, b = {"mnist-2", "ps1"};
    CHECK(ps_ckpt_check_lock(dir, &a, &e) == PS_OK);  /* no lock file yet */
    int fd = -1, fd2 = -1;
    CHECK_MSG(ps_ckpt_lock_dir(dir, &a, &fd, &e) == PS_OK && fd >= 0, "%s", e.msg);
    CHECK(ps_ckpt_lock_dir(dir, &a, &fd2, &e) == PS_ERR_UNAVAILABLE && fd2 < 0);
    CONTAINS(e.msg, "in use by a running psd (server ps0 of cluster mnist-2");
    CHECK(ps_ckpt_check_lock(dir, &a, &e) == PS_ERR_UNAVAILABLE);
    CHECK(ps_ckpt_lock_dir(dir, &b, &fd2, &e) == PS_ERR_FAILED_PRECONDITION);
    CONTAINS(e.msg, "belongs to server ps0 of cluster mnist-2");
    ps_ckpt_unlock_dir(fd);
    /* ps0 is gone: ps1 is still refused (the file names ps0), ps0 takes it back */
    CHECK(ps_ckpt_check_lock(dir, &b, &e) == PS_ERR_FAILED_PRECONDITION);
    CHECK(ps_ckpt_lock_dir(dir, NULL, &fd2, &e) == PS_ERR_FAILED_PRECONDITION);
    CONTAINS(e.msg, "this psd is server (single-server form) of cluster psd");
    CHECK(ps_ckpt_check_lock(dir, &a, &e) == PS_OK);
    CHECK_MSG(ps_ckpt_lock_dir(dir, &a, &fd, &e) == PS_OK, "%s", e.msg);
    ps_ckpt_unlock_dir(fd);
}

int main(void) {
    ps_log_set_level(PS_LOG_ERROR);
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    test_round_trip();
    test_fallback();
    test_init_from();
    test_optim_state();
    test_dir_oddities();
    test_model_adam();
    test_parts();
    test_settle_records();
    test_dir_lock();
    test_rmtree(g_dir);
    return check_summary("test_checkpoint");
}
