/* test_ckpt_merge - ps-ckpt merge (tools/ps_ckpt.c) against the
 * single-server model.
 *
 * rnn_lm over two servers as a cluster places it: ps0 holds rows [0, 10) of
 * the embedding table, ps1 rows [10, 21), the decoder and the LSTM's
 * parameters. Both parts and the whole model (same seed) take the same
 * training steps (each batch's ids routed to their shard), each part is
 * checkpointed as psd does (ps_ckpt_save_part), and build/bin/ps-ckpt merge
 * must give a state_dict whose every tensor equals the whole model's, bit
 * for bit. Then the refusals: a missing part (rows not covered, a stage in
 * no part), the same part twice, another cluster's part, parts of different
 * versions (and --allow-mixed-versions, which merges with a warning).
 * Lying parts (rewritten from real ones) are refused: a hosted stage without
 * its tensors, an empty part, a wrong shape, a name the model lacks, one
 * server twice, a tensor of a stage the part does not host, shard rows on a
 * dense tensor, parts that disagree on the parameter list.
 * ps-ckpt info prints the metadata, escaping what a terminal would run. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "checkpoint.h"
#include "log.h"
#include "model.h"
#include "safetensors.h"
#include "support/tmpdir.h"

enum { V = 21, E = 5, H = 4, NID = 8, CUT = 10 };

static char g_dir[] = "/tmp/ps_test_merge_XXXXXX";
static char g_tool[512];

static ps_model *lm(int n_hosted, const char *h0, const char *h1, const char *h2, int64_t lo, int64_t hi) {
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = "dnnl", .seed = 17, .compute_threads = 1, .lr = 0.3f,
                       .n_sizes = 4, .size_key = {"ntoken", "ninp", "nhid", "dropout"}, .size_value = {V, E, H, 0},
                       .n_hosted = n_hosted, .hosted = {h0, h1, h2}, .shard_stage = hi ? "emb" : NULL,
                       .shard_lo = lo, .shard_hi = hi};
    ps_err e = {0};
    ps_model *m = ps_model_create(&o, &e);
    CHECK_MSG(m, "%s", e.msg);
    return m;
}

/* Add to acc the emb forward/backward of the ids in [lo, hi) (positions'
 * output gradients gout), and with dec the decoder's on h. */
static void accumulate(ps_model *m, ps_grads *acc, const int64_t *ids, const float *gout, int64_t lo, int64_t hi,
                       int dec, const float *h, const float *gd) {
    ps_err e = {0};
    int64_t sel[NID];
    float g[NID * E], out[NID * V];
    int k = 0;
    for (int i = 0; i < NID; i++)
        if (ids[i] >= lo && ids[i] < hi) {
            sel[k] = ids[i];
            memcpy(g + k * E, gout + i * E, sizeof(float) * E);
            k++;
        }
    ps_tape *t = NULL;
    if (k) {
        CHECK(ps_model_forward_range(m, 0, 0, sel, k, 1, NULL, 5, out, &t, NULL, &e) == PS_OK);
        CHECK_MSG(t && ps_model_backward_acc(m, t, g, NULL, acc, &e) == PS_OK, "%s", e.msg);
        ps_tape_free(t);
    }
    if (!dec) return;
    int d = ps_model_find_stage(m, "decoder");
    CHECK(ps_model_forward_range(m, d, d, h, NID, 1, NULL, 6, out, &t, NULL, &e) == PS_OK);
    CHECK(t && ps_model_backward_acc(m, t, gd, NULL, acc, &e) == PS_OK);
    ps_tape_free(t);
}

/* Run the tool; its output in *out (static). Returns the exit status. */
static int tool(const char *args, char **out) {
    static char buf[16384];
    char cmd[8192 + 1300], log[600];
    snprintf(log, sizeof log, "%s/tool.log", g_dir);
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>&1", g_tool, args, log);
    int rc = system(cmd);
    FILE *f = fopen(log, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    *out = buf;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* A lying part: src rewritten to dst without the tensors named drop (a
 * prefix; NULL: none), with `reshape`'s first dim set to dim0, with an extra
 * copy of tensor `copy` under the name `add`, and metadata key set to val
 * (NULL val: removed). */
typedef struct lie {
    const char *drop, *reshape;
    int64_t dim0;
    const char *copy, *add;
    const char *key, *val;
} lie;

static void rewrite(const char *src, const char *dst, const lie *l) {
    ps_err e = {0};
    ps_st_file *f = ps_st_read(src, &e);
    CHECK_MSG(f, "%s", e.msg);
    if (!f) return;
    size_t nt = ps_st_count(f), nm = ps_st_metadata_count(f), k = 0;
    ps_st_tensor *t = calloc(nt + 1, sizeof *t);
    const char **kv = calloc(2 * nm + 3, sizeof *kv);
    for (size_t i = 0; i < nt; i++) {
        const ps_st_tensor *x = ps_st_get(f, i);
        if (l->drop && !strncmp(x->name, l->drop, strlen(l->drop))) continue;
        t[k] = *x;
        if (l->reshape && !strcmp(x->name, l->reshape)) {
            t[k].bytes = t[k].bytes / (size_t)t[k].dims[0] * (size_t)l->dim0;
            t[k].dims[0] = l->dim0;
        }
        k++;
        if (l->copy && !strcmp(x->name, l->copy)) {
            t[k] = *x;
            snprintf(t[k].name, sizeof t[k].name, "%s", l->add);
            k++;
        }
    }
    size_t m = 0;
    for (size_t i = 0; i < nm; i++) {
        if (l->key && !strcmp(ps_st_metadata_key(f, i), l->key)) continue;
        kv[m++] = ps_st_metadata_key(f, i);
        kv[m++] = ps_st_metadata_value(f, i);
    }
    if (l->key && l->val) kv[m++] = l->key, kv[m++] = l->val;
    kv[m] = NULL;
    CHECK_MSG(ps_st_write(dst, t, k, kv, &e) == PS_OK, "%s", e.msg);
    free(t);
    free(kv);
    ps_st_free(f);
}

#define REFUSED(args, pattern) do { \
    char *o_; \
    int rc_ = tool(args, &o_); \
    CHECK_MSG(rc_ == 1 && strstr(o_, pattern), "ps-ckpt %s: exit %d, wanted '%s' in: %s", args, rc_, pattern, o_); \
} while (0)

int main(void) {
    ps_log_set_level(PS_LOG_ERROR);
    const char *build = getenv("BUILD");
    snprintf(g_tool, sizeof g_tool, "%s/bin/ps-ckpt", build && *build ? build : "build");
    if (access(g_tool, X_OK)) {
        fprintf(stderr, "%s is not built (make all)\n", g_tool);
        return 1;
    }
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 2; }
    ps_model *whole = lm(0, NULL, NULL, NULL, 0, 0), *p0 = lm(1, "emb", NULL, NULL, 0, CUT),
             *p1 = lm(3, "emb", "decoder", "rnn", CUT, V);
    if (!whole || !p0 || !p1) return check_summary("test_ckpt_merge");
    ps_err e = {0};
    for (int k = 0; k < 4; k++) {
        int64_t ids[NID];
        float gout[NID * E], h[NID * H], gd[NID * V];
        for (int i = 0; i < NID; i++) ids[i] = (i * 5 + k * 3) % V;
        for (int i = 0; i < NID * E; i++) gout[i] = (float)((i * 7 + k) % 11) / 11.0f - 0.5f;
        for (int i = 0; i < NID * H; i++) h[i] = (float)((i * 3 + k * 5) % 13) / 13.0f - 0.4f;
        for (int i = 0; i < NID * V; i++) gd[i] = (float)((i * 11 + k) % 17) / 17.0f - 0.45f;
        ps_grads *gw = ps_grads_create(whole, &e), *g0 = ps_grads_create(p0, &e), *g1 = ps_grads_create(p1, &e);
        accumulate(whole, gw, ids, gout, 0, V, 1, h, gd);
        accumulate(p0, g0, ids, gout, 0, CUT, 0, h, gd);
        accumulate(p1, g1, ids, gout, CUT, V, 1, h, gd);
        CHECK(ps_model_step_grads(whole, gw, NULL, &e) == PS_OK);
        CHECK(ps_model_step_grads(p0, g0, NULL, &e) == PS_OK);
        CHECK(ps_model_step_grads(p1, g1, NULL, &e) == PS_OK);
        ps_grads_free(gw), ps_grads_free(g0), ps_grads_free(g1);
    }
    CHECK(ps_model_version(whole) == 4 && ps_model_version(p0) == 4 && ps_model_version(p1) == 4);

    char d0[300], d1[300], dx[300], dv[300], a0[PS_CKPT_PATH_MAX], a1[PS_CKPT_PATH_MAX], ax[PS_CKPT_PATH_MAX],
        av[PS_CKPT_PATH_MAX], merged[400], args[8192];
    snprintf(d0, sizeof d0, "%s/ps0", g_dir);
    snprintf(d1, sizeof d1, "%s/ps1", g_dir);
    snprintf(dx, sizeof dx, "%s/other", g_dir);
    snprintf(dv, sizeof dv, "%s/later", g_dir);
    snprintf(merged, sizeof merged, "%s/merged.safetensors", g_dir);
    const ps_ckpt_ident i0 = {"lm-demo", "ps0"}, i1 = {"lm-demo", "ps1"}, ix = {"lm-other", "ps1"};
    CHECK(ps_ckpt_prepare_dir(d0, &e) == PS_OK && ps_ckpt_prepare_dir(d1, &e) == PS_OK &&
          ps_ckpt_prepare_dir(dx, &e) == PS_OK && ps_ckpt_prepare_dir(dv, &e) == PS_OK);
    ps_ckpt_info c0, c1, cx, cv;
    CHECK(ps_ckpt_save_part(p0, d0, &i0, 0, 1, &c0, &e) == PS_OK);
    CHECK(ps_ckpt_save_part(p1, d1, &i1, 0, 1, &c1, &e) == PS_OK);
    CHECK(ps_ckpt_save_part(p1, dx, &ix, 0, 1, &cx, &e) == PS_OK);
    ps_model_set_version(p1, 6);
    CHECK(ps_ckpt_save_part(p1, dv, &i1, 0, 1, &cv, &e) == PS_OK);
    snprintf(a0, sizeof a0, "%s", c0.path);
    snprintf(a1, sizeof a1, "%s", c1.path);
    snprintf(ax, sizeof ax, "%s", cx.path);
    snprintf(av, sizeof av, "%s", cv.path);

    /* The merge equals the single-server model, tensor for tensor. */
    char *out;
    snprintf(args, sizeof args, "merge -o %s %s %s", merged, a1, a0);
    int rc = tool(args, &out);
    CHECK_MSG(rc == 0, "exit %d: %s", rc, out);
    printf("%s", out);
    CHECK(strstr(out, "cluster lm-demo, server ps0, model rnn_lm, version 4, hosts emb"));
    CHECK(strstr(out, "server ps1, model rnn_lm, version 4, hosts emb,decoder,rnn"));
    CHECK(strstr(out, "optimizer state") && strstr(out, "not merged"));
    ps_st_file *f = ps_st_read(merged, &e);
    CHECK_MSG(f, "%s", e.msg);
    if (f) {
        CHECK(ps_st_count(f) == (size_t)ps_model_num_params(whole));
        for (int i = 0; i < ps_model_num_params(whole); i++) {
            const ps_param_info *pi = ps_model_param(whole, i);
            const ps_st_tensor *t = ps_st_find(f, pi->name);
            CHECK_MSG(t && t->dtype == PS_ST_F32 && t->ndim == pi->ndim && t->dims[0] == pi->dims[0], "%s", pi->name);
            if (!t || ps_st_numel(t) != pi->numel) continue;
            float *w = malloc((size_t)pi->numel * sizeof *w);
            CHECK(ps_model_get_param(whole, i, w, &e) == PS_OK);
            CHECK_MSG(!memcmp(w, t->data, (size_t)pi->numel * sizeof *w), "%s differs from the single-server "
                      "model's", pi->name);
            free(w);
        }
        const char *v = ps_st_metadata(f, "psd.model_version");
        CHECK(v && !strcmp(v, "4") && !strcmp(ps_st_metadata(f, "format"), "pt"));
        /* The merged file is a whole state_dict: --init-from takes it, and a shard its rows. */
        ps_st_free(f);
        ps_model *fresh = lm(1, "emb", NULL, NULL, CUT, V);
        int skipped = 0;
        CHECK(fresh && ps_ckpt_init_from_part(fresh, merged, &skipped, &e) == PS_OK && skipped == 10);
        float a[(V - CUT) * E], b[V * E];
        CHECK(ps_model_get_param(fresh, 0, a, &e) == PS_OK && ps_model_get_param(whole, 0, b, &e) == PS_OK);
        CHECK(!memcmp(a, b + CUT * E, sizeof a));
        ps_model_free(fresh);
    }

    /* Refusals. */
    snprintf(args, sizeof args, "merge -o %s %s", merged, a1);
    REFUSED(args, "encoder.weight: rows [0, 10) are in no part");
    snprintf(args, sizeof args, "merge -o %s %s", merged, a0);
    REFUSED(args, "stage 'decoder' of model rnn_lm is in none of the parts");
    snprintf(args, sizeof args, "merge -o %s %s %s %s", merged, a0, a1, a0);
    REFUSED(args, "both parts of server 'ps0'");
    snprintf(args, sizeof args, "merge -o %s %s %s", merged, a0, ax);
    REFUSED(args, "of cluster 'lm-other'");
    snprintf(args, sizeof args, "merge -o %s %s %s", merged, a0, av);
    REFUSED(args, "different model versions (ps0@4,ps1@6)");
    snprintf(args, sizeof args, "merge --allow-mixed-versions -o %s %s %s", merged, a0, av);
    rc = tool(args, &out);
    CHECK_MSG(rc == 0 && strstr(out, "warning: merging parts of different model versions"), "exit %d: %s", rc, out);
    if ((f = ps_st_read(merged, &e))) {
        CHECK(!ps_st_metadata(f, "psd.model_version"));
        CHECK(!strcmp(ps_st_metadata(f, "psd.merged_from"), "ps0@4,ps1@6"));
        ps_st_free(f);
    }
    snprintf(args, sizeof args, "merge %s %s", a0, a1);
    CHECK(tool(args, &out) == 2);   /* no -o */

    /* Lying parts. */
    char lp[400], lq[400];
    snprintf(lp, sizeof lp, "%s/lie.safetensors", g_dir);
    snprintf(lq, sizeof lq, "%s/lie2.safetensors", g_dir);
    rewrite(a1, lp, &(lie){.drop = "decoder."});     /* hosts decoder, holds none of it */
    snprintf(args, sizeof args, "merge -o %s %s %s", merged, a0, lp);
    REFUSED(args, "hosts stage 'decoder' (psd.hosted) but holds no tensor 'decoder.weight'");
    rewrite(a1, lp, &(lie){.drop = ""});             /* an empty part */
    REFUSED(args, "holds no tensors");
    rewrite(a1, lp, &(lie){.reshape = "decoder.bias", .dim0 = 20});
    REFUSED(args, "tensor 'decoder.bias' is F32 (20); the model's is F32 (21)");
    rewrite(a1, lp, &(lie){.copy = "decoder.bias", .add = "evil.bias"});
    REFUSED(args, "tensor 'evil.bias' is not a parameter of model rnn_lm");
    snprintf(args, sizeof args, "merge -o %s %s %s %s", merged, a1, a0, a0);  /* one server twice, not first */
    REFUSED(args, "both parts of server 'ps0'");
    /* a tensor moved to a part whose server does not host its stage */
    rewrite(a0, lp, &(lie){.copy = "encoder.weight", .add = "decoder.bias"});
    rewrite(a1, lq, &(lie){.drop = "decoder.bias"});
    snprintf(args, sizeof args, "merge -o %s %s %s", merged, lp, lq);
    REFUSED(args, "tensor 'decoder.bias' belongs to stage 'decoder', which this part does not host");
    /* fake shard rows on a dense tensor */
    rewrite(a1, lp, &(lie){.key = "psd.rows.decoder.weight", .val = "0,21,21"});
    snprintf(args, sizeof args, "merge -o %s %s %s", merged, a0, lp);
    REFUSED(args, "'decoder.weight' carries shard rows (psd.rows.decoder.weight = 0,21,21) but is not a table");
    /* parts that disagree on the model's parameters */
    rewrite(a1, lp, &(lie){.key = "psd.params", .val = "encoder.weight@emb:22,5:shard"});
    REFUSED(args, "list different parameters for model rnn_lm (psd.params)");
    rewrite(a1, lp, &(lie){.key = "psd.params", .val = NULL});
    REFUSED(args, "only 1 of the 2 parts list the model's parameters");
    /* ps-ckpt info: a metadata value that would drive the terminal is escaped */
    rewrite(a0, lp, &(lie){.key = "psd.note", .val = "\x1b[31mred\nline2"});
    snprintf(args, sizeof args, "info %s", lp);
    CHECK(tool(args, &out) == 0);
    CHECK_MSG(strstr(out, "psd.note = \\x1b[31mred\\x0aline2") && !strchr(out, 0x1b), "%s", out);
    snprintf(args, sizeof args, "info %s", a0);
    CHECK(tool(args, &out) == 0 && strstr(out, "psd.rows.encoder.weight = 0,10,21") &&
          strstr(out, "psd.server = ps0") && strstr(out, "tensor encoder.weight F32 (10, 5)"));

    ps_model_free(whole);
    ps_model_free(p0);
    ps_model_free(p1);
    test_rmtree(g_dir);
    return check_summary("test_ckpt_merge");
}
