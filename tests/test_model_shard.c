/* test_model_shard - hosted subsets and shards of a model (model.h
 * n_hosted/hosted, shard_stage/shard_lo/shard_hi: several PS nodes), each
 * against the whole model built with the same seed as the reference:
 *  - rnn_lm's "emb" table split in two shards: initial rows, a forward on a
 *    list of ids, the row-sparse backward and SGD / SparseAdam steps give,
 *    row for row, what the whole model gives (ref and dnnl backends);
 *    ids outside a shard's range are refused naming the id and the range;
 *  - mnist_cnn hosting only "fc" has only fc's parameters, with the whole
 *    model's initial values; conv on one model then fc on another equals
 *    the whole model's forward, and the backward through both equals its
 *    gradients;
 *  - a run over stages that are not consecutive in the definition, an
 *    unknown hosted stage, a shard of a non-embedding stage and a bad row
 *    range are INVALID_ARGUMENT. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "model.h"
#include "support/model_run.h"

enum { V = 21, E = 6, H = 5, NID = 9 };

static ps_model *lm(const char *backend, const ps_optim_spec *opt, const char *shard, int64_t lo, int64_t hi,
                    int n_hosted, const char *h0, const char *h1) {
    ps_err err = {0};
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = backend, .seed = 11, .compute_threads = 1, .lr = 0.5f,
                       .optim = opt, .n_sizes = 4, .size_key = {"ntoken", "ninp", "nhid", "dropout"},
                       .size_value = {V, E, H, 0}, .n_hosted = n_hosted, .hosted = {h0, h1},
                       .shard_stage = shard, .shard_lo = lo, .shard_hi = hi};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m, "%s", err.msg);
    return m;
}

static float *param(ps_model *m, const char *name) {
    int i = ps_model_find_param(m, name);
    CHECK_MSG(i >= 0, "no %s", name);
    if (i < 0) return calloc(1, sizeof(float));
    float *w = malloc((size_t)ps_model_param(m, i)->numel * sizeof *w);
    ps_err err = {0};
    CHECK(ps_model_get_param(m, i, w, &err) == PS_OK);
    return w;
}

/* Rows [lo, hi) of the whole table equal the shard's table. */
static int rows_equal(const float *whole, const float *shard, int64_t lo, int64_t hi) {
    return !memcmp(whole + lo * E, shard, (size_t)(hi - lo) * E * sizeof(float));
}

/* Forward + backward + step of the ids in [lo, hi) of ids on m (a shard
 * when shard != 0), with the output gradient rows of those positions. */
static void train_ids(ps_model *m, const int64_t *ids, const float *gout, int64_t lo, int64_t hi,
                      float *out_rows) {
    int64_t sel[NID];
    float g[NID * E];
    int k = 0;
    for (int i = 0; i < NID; i++)
        if (ids[i] >= lo && ids[i] < hi) {
            sel[k] = ids[i];
            memcpy(g + k * E, gout + i * E, E * sizeof(float));
            k++;
        }
    if (!k) return;
    ps_err err = {0};
    float out[NID * E];
    ps_tape *t = NULL;
    CHECK_MSG(ps_model_forward_range(m, 0, 0, sel, k, 1, NULL, 1, out, &t, NULL, &err) == PS_OK, "%s", err.msg);
    if (!t) return;
    for (int i = 0, j = 0; i < NID; i++)   /* scatter back to the positions */
        if (ids[i] >= lo && ids[i] < hi) memcpy(out_rows + i * E, out + (j++) * E, E * sizeof(float));
    ps_grads *acc = ps_grads_create(m, &err);
    CHECK(acc && ps_model_backward_acc(m, t, g, NULL, acc, &err) == PS_OK);
    uint64_t v = 0;
    CHECK_MSG(ps_model_step_grads(m, acc, &v, &err) == PS_OK, "%s", err.msg);
    ps_grads_free(acc);
    ps_tape_free(t);
}

static void emb_shards(const char *backend, ps_optim_kind kind) {
    printf("emb shards: %s, %s\n", backend, ps_optim_kind_name(kind));
    ps_optim_spec opt;
    ps_optim_spec_default(kind, &opt);
    opt.lr = 0.5;
    ps_model *whole = lm(backend, &opt, NULL, 0, 0, 0, NULL, NULL);
    const int64_t cut = V / 2;   /* 10 */
    ps_model *s0 = lm(backend, &opt, "emb", 0, cut, 1, "emb", NULL);
    ps_model *s1 = lm(backend, &opt, "emb", cut, V, 1, "emb", NULL);
    if (!whole || !s0 || !s1) goto out;

    /* Only the table, with its shard's rows and metadata. */
    CHECK(ps_model_num_stages(s0) == 1 && ps_model_num_params(s0) == 1);
    const ps_param_info *p1 = ps_model_param(s1, 0);
    CHECK(!strcmp(p1->name, "encoder.weight") && p1->dims[0] == V - cut && p1->dims[1] == E);
    CHECK(p1->row_offset == cut && p1->rows_total == V && p1->sparse);
    CHECK(ps_model_param(whole, 0)->rows_total == 0 && ps_model_param(whole, 0)->row_offset == 0);
    const ps_stage_info *si = ps_model_stage(s1, 0);
    CHECK(si->row_lo == cut && si->row_hi == V);
    CHECK(ps_model_stage(whole, 0)->row_lo == 0 && ps_model_stage(whole, 0)->row_hi == 0);
    CHECK(ps_model_num_weights(s1) == (V - cut) * E);
    /* The definition's parameters: whole shapes, the others hosted elsewhere. */
    CHECK(ps_model_num_def_params(s1) == ps_model_num_def_params(whole) && ps_model_num_def_params(s1) == 11);
    for (int i = 0; i < ps_model_num_def_params(s1); i++) {
        const ps_param_info *d = ps_model_def_param(s1, i), *wp = ps_model_param(whole, i);
        CHECK_MSG(!strcmp(d->name, wp->name) && d->numel == wp->numel && d->dims[0] == wp->dims[0] &&
                  d->rows_total == 0, "%s", d->name);
        CHECK(d->stage_index == (i == 0 ? 0 : -1));
    }

    float *w = param(whole, "encoder.weight"), *a = param(s0, "encoder.weight"), *b = param(s1, "encoder.weight");
    CHECK(rows_equal(w, a, 0, cut));
    CHECK(rows_equal(w, b, cut, V));
    free(w), free(a), free(b);

    /* Two steps; repeated ids, ids on both shards. */
    const int64_t ids[2][NID] = {{3, 12, 3, 20, 0, 11, 9, 10, 12}, {10, 9, 9, 2, 17, 17, 17, 5, 0}};
    for (int it = 0; it < 2; it++) {
        float gout[NID * E], ow[NID * E], os[NID * E];
        for (int i = 0; i < NID * E; i++) gout[i] = (float)((i * 37 + it * 11) % 19 - 9) / 7.0f;
        memset(os, 0, sizeof os);
        train_ids(whole, ids[it], gout, 0, V, ow);
        train_ids(s0, ids[it], gout, 0, cut, os);
        train_ids(s1, ids[it], gout, cut, V, os);
        CHECK(!memcmp(ow, os, sizeof ow));   /* each position's row from its shard */
        w = param(whole, "encoder.weight"), a = param(s0, "encoder.weight"), b = param(s1, "encoder.weight");
        CHECK_MSG(rows_equal(w, a, 0, cut), "step %d, shard 0", it);
        CHECK_MSG(rows_equal(w, b, cut, V), "step %d, shard 1", it);
        free(w), free(a), free(b);
    }
    CHECK(ps_model_version(s0) == 2 && ps_model_version(s1) == 2);

    /* Ids travel global: the other shard's rows and rows past the table are refused. */
    ps_err err = {0};
    int64_t bad[2] = {12, 3};
    float out[2 * E];
    CHECK(ps_model_forward_range(s1, 0, 0, bad, 2, 0, NULL, 1, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "input[1] = 3") && strstr(err.msg, "[10, 21)"), "%s", err.msg);
    bad[0] = 21;
    CHECK(ps_model_forward_range(s1, 0, 0, bad, 1, 0, NULL, 1, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "= 21"), "%s", err.msg);
out:
    ps_model_free(whole);
    ps_model_free(s0);
    ps_model_free(s1);
}

static ps_model *mnist(const char *backend, int n_hosted, const char *h, ps_err *err) {
    ps_model_opts o = {.arch = "mnist_cnn", .cpu_backend = backend, .seed = 5, .compute_threads = 1, .lr = 0.01f,
                       .n_hosted = n_hosted, .hosted = {h}};
    return ps_model_create(&o, err);
}

static void mnist_split(const char *backend) {
    printf("mnist conv | fc over two models: %s\n", backend);
    ps_err err = {0};
    ps_model *whole = mnist(backend, 0, NULL, &err), *a = mnist(backend, 1, "conv", &err),
             *b = mnist(backend, 1, "fc", &err);
    CHECK_MSG(whole && a && b, "%s", err.msg);
    if (!whole || !a || !b) goto out;
    CHECK(ps_model_num_stages(b) == 1 && !strcmp(ps_model_stage(b, 0)->name, "fc"));
    CHECK(ps_model_stage(b, 0)->in_ndim == 1 && ps_model_stage(b, 0)->in_dims[0] == 9216);
    CHECK(ps_model_find_stage(b, "conv") == -1 && ps_model_find_stage(a, "fc") == -1);
    CHECK(ps_model_num_params(b) == 4);
    for (int i = 0; i < ps_model_num_params(b); i++) {
        const ps_param_info *p = ps_model_param(b, i);
        CHECK_MSG(!strcmp(p->stage, "fc") && p->stage_index == 0 && !strncmp(p->name, "fc", 2), "%s", p->name);
        float *x = param(b, p->name), *y = param(whole, p->name);
        CHECK_MSG(!memcmp(x, y, (size_t)p->numel * sizeof(float)), "%s differs from the whole model's", p->name);
        free(x), free(y);
    }
    CHECK(ps_model_num_params(a) == 4 && !strcmp(ps_model_param(a, 0)->name, "conv1.weight"));
    CHECK(ps_model_num_weights(a) + ps_model_num_weights(b) == ps_model_num_weights(whole));

    enum { N = 3 };
    float *x = malloc(N * 784 * sizeof *x), *mid = malloc(N * 9216 * sizeof *mid);
    float ow[N * 10], os[N * 10];
    for (int i = 0; i < N * 784; i++) x[i] = (float)((i * 7919) % 255) / 255.0f;
    CHECK(run_forward(whole, x, N, 0, NULL, 1, ow, NULL, NULL, &err) == PS_OK);
    CHECK(ps_model_forward_range(a, 0, 0, x, N, 0, NULL, 1, mid, NULL, NULL, &err) == PS_OK);
    CHECK(ps_model_forward_range(b, 0, 0, mid, N, 0, NULL, 1, os, NULL, NULL, &err) == PS_OK);
    for (int i = 0; i < N * 10; i++) CHECK_CLOSE(os[i], ow[i], 1e-6, 1e-5);

    /* Backward through both (dropout masks injected: all ones scaled). */
    float *m2d = malloc(N * 64 * sizeof *m2d), *m1 = malloc(N * 128 * sizeof *m1);
    for (int i = 0; i < N * 64; i++) m2d[i] = (i % 5) ? 1.0f / 0.75f : 0.0f;
    for (int i = 0; i < N * 128; i++) m1[i] = (i % 3) ? 2.0f : 0.0f;
    const float *masks_all[2] = {m2d, m1}, *masks_a[1] = {m2d}, *masks_b[1] = {m1};
    ps_tape *tw = NULL, *ta = NULL, *tb = NULL;
    CHECK(run_forward(whole, x, N, 1, masks_all, 1, ow, &tw, NULL, &err) == PS_OK);
    CHECK(ps_model_forward_range(a, 0, 0, x, N, 1, masks_a, 1, mid, &ta, NULL, &err) == PS_OK);
    CHECK(ps_model_forward_range(b, 0, 0, mid, N, 1, masks_b, 1, os, &tb, NULL, &err) == PS_OK);
    for (int i = 0; i < N * 10; i++) CHECK_CLOSE(os[i], ow[i], 1e-6, 1e-5);
    float gout[N * 10];
    for (int i = 0; i < N * 10; i++) gout[i] = (float)(i % 7 - 3) / 10.0f;
    float *gmid = malloc(N * 9216 * sizeof *gmid);
    ps_grads *gw = ps_grads_create(whole, &err), *ga = ps_grads_create(a, &err), *gb = ps_grads_create(b, &err);
    CHECK(tw && ta && tb && gw && ga && gb);
    if (tw && ta && tb && gw && ga && gb) {
        CHECK(ps_model_backward_acc(whole, tw, gout, NULL, gw, &err) == PS_OK);
        CHECK(ps_model_backward_acc(b, tb, gout, gmid, gb, &err) == PS_OK);
        CHECK(ps_model_backward_acc(a, ta, gmid, NULL, ga, &err) == PS_OK);
        for (int i = 0; i < ps_model_num_params(whole); i++) {
            const ps_param_info *p = ps_model_param(whole, i);
            ps_model *h = ps_model_find_param(a, p->name) >= 0 ? a : b;
            ps_grads *gh = h == a ? ga : gb;
            float *x1 = malloc((size_t)p->numel * sizeof *x1), *x2 = malloc((size_t)p->numel * sizeof *x2);
            CHECK(ps_grads_get(whole, gw, i, x1, &err) == PS_OK);
            CHECK(ps_grads_get(h, gh, ps_model_find_param(h, p->name), x2, &err) == PS_OK);
            int bad = 0;
            for (int64_t k = 0; k < p->numel; k++) bad += !(fabs(x1[k] - x2[k]) <= 1e-5 + 1e-4 * fabs(x1[k]));
            CHECK_MSG(!bad, "%s: %d gradients differ", p->name, bad);
            free(x1), free(x2);
        }
    }
    ps_grads_free(gw), ps_grads_free(ga), ps_grads_free(gb);
    ps_tape_free(tw), ps_tape_free(ta), ps_tape_free(tb);
    free(x), free(mid), free(gmid), free(m2d), free(m1);
out:
    ps_model_free(whole);
    ps_model_free(a);
    ps_model_free(b);
}

static void refusals(void) {
    ps_err err = {0};
    /* emb and rnn hosted, decoder elsewhere: not a run. */
    ps_model *m = lm("ref", NULL, NULL, 0, 0, 2, "emb", "rnn");
    if (m) {
        CHECK(ps_model_num_stages(m) == 2 && !strcmp(ps_model_stage(m, 1)->name, "rnn"));
        CHECK(ps_model_find_param(m, "decoder.weight") == -1 && ps_model_find_param(m, "rnn.weight_ih_l0") >= 0);
        int64_t ids[1] = {1};
        float out[64];
        CHECK(ps_model_forward_range(m, 0, 1, ids, 1, 0, NULL, 1, out, NULL, NULL, &err) == PS_ERR_INVALID_ARGUMENT);
        CHECK_MSG(strstr(err.msg, "not consecutive"), "%s", err.msg);
        ps_model_free(m);
    }
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = "ref", .seed = 1, .lr = 0.1f, .n_hosted = 1,
                       .hosted = {"embedding"}};
    CHECK(!ps_model_create(&o, &err) && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "no stage 'embedding'"), "%s", err.msg);
    o.hosted[0] = "decoder";
    o.shard_stage = "decoder";
    o.shard_lo = 0, o.shard_hi = 10;
    CHECK(!ps_model_create(&o, &err) && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "cannot be sharded"), "%s", err.msg);
    o.shard_stage = "emb";
    CHECK(!ps_model_create(&o, &err) && strstr(err.msg, "not among the hosted"));
    o.hosted[0] = "emb";
    o.shard_lo = 5, o.shard_hi = 10001;
    CHECK(!ps_model_create(&o, &err) && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "[5, 10001)"), "%s", err.msg);
}

/* An Embedding reading a slice of the ids (ids_start: several id inputs joined) first in a stage: the trainer
 * routes a sharded stage's whole input by id, so it cannot be sharded. */
static void sliced_refused(void) {
    char dir[] = "/tmp/ps-test-model-shard.XXXXXX", path[600];
    if (!mkdtemp(dir)) { CHECK_MSG(0, "mkdtemp failed"); return; }
    snprintf(path, sizeof path, "%s/ids.yaml", dir);
    FILE *f = fopen(path, "w");
    CHECK_MSG(f, "cannot write %s", path);
    if (!f) return;
    fputs("name: ids\nstages:\n  - name: emb\n    input: {shape: [2], dtype: int64}\n    nodes:\n"
          "      - {name: item, kind: Embedding, num_embeddings: 20, embedding_dim: 4, ids_start: 1}\n", f);
    fclose(f);
    ps_err err = {0};
    ps_model_opts o = {.file = path, .cpu_backend = "ref", .seed = 1, .lr = 0.1f, .n_hosted = 1, .hosted = {"emb"},
                       .shard_stage = "emb", .shard_lo = 0, .shard_hi = 10};
    ps_model *m = ps_model_create(&o, &err);
    CHECK(!m && err.code == PS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(err.msg, "cannot be sharded") && strstr(err.msg, "'item' reads a slice of the ids"), "%s",
              err.msg);
    ps_model_free(m);
    remove(path);
    rmdir(dir);
}

int main(void) {
    emb_shards("ref", PS_OPTIM_SGD);
    emb_shards("ref", PS_OPTIM_ADAM);
    emb_shards("dnnl", PS_OPTIM_SGD);
    emb_shards("dnnl", PS_OPTIM_ADAM);
    mnist_split("ref");
    mnist_split("dnnl");
    refusals();
    sliced_refused();
    return check_summary("test_model_shard");
}
