/* test_lm_step - one training step of the model-parallel language model,
 * assembled from the pieces ps-train lm and psd use (rnn_lm's emb and
 * decoder stages with their row-sparse and dense gradients, the LSTM of
 * trainer/lstm.h on each CPU implementation, the LSTM's gradients added
 * as PushGradients adds them, the global squared norm, the clip scale and
 * the SGD step), against PyTorch's RNNModel with the same weights and
 * injected dropout masks (tests/golden/lm_step.safetensors from
 * scripts/gen_golden_lm_step.py): hidden state out, loss, every gradient,
 * clip_grad_norm_'s total norm, every weight after the clipped step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lstm.h"
#include "model.h"
#include "safetensors.h"
#include "support/golden_replay.h"

enum { V = 20, E = 6, H = 5, L = 2, T = 4, N = 3, NS = T * N };
#define LR 20.0f
#define CLIP 0.25
#define TOL 2e-5

static const float *gt(const ps_st_file *g, const char *name, int64_t n) { return golden_tensor(g, name, n); }

static double ce(const float *z, const int64_t *tgt, float *grad) {
    double loss = 0;
    for (int i = 0; i < NS; i++) {
        double mx = z[i * V], s = 0;
        for (int v = 1; v < V; v++) mx = z[i * V + v] > mx ? z[i * V + v] : mx;
        for (int v = 0; v < V; v++) s += exp(z[i * V + v] - mx);
        double lse = mx + log(s);
        loss += lse - z[i * V + tgt[i]];
        for (int v = 0; v < V; v++) grad[i * V + v] = (float)(exp(z[i * V + v] - lse) / NS);
        grad[i * V + tgt[i]] -= 1.0f / NS;
    }
    return loss / NS;
}

static void step(const ps_st_file *g, const char *backend, ps_lstm_impl impl) {
    char label[64], name[96];
    snprintf(label, sizeof label, "%s stages, %s LSTM", backend, ps_lstm_impl_name(impl));
    printf("%s\n", label);
    ps_err err = {0};
    ps_model_opts o = {.arch = "rnn_lm", .cpu_backend = backend, .seed = 3, .compute_threads = 2, .lr = LR,
                       .n_sizes = 4, .size_key = {"ntoken", "ninp", "nhid", "dropout"}, .size_value = {V, E, H, 0.5}};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!m) return;
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        snprintf(name, sizeof name, "init.%s", p->name);
        const float *w = gt(g, name, p->numel);
        if (w) CHECK(ps_model_set_param(m, i, w, &err) == PS_OK);
    }
    const int64_t *ids;
    const ps_st_tensor *ti = ps_st_find(g, "ids"), *tt = ps_st_find(g, "target");
    CHECK(ti && tt && ti->dtype == PS_ST_I64 && tt->dtype == PS_ST_I64);
    if (!ti || !tt) { ps_model_free(m); return; }
    ids = ti->data;
    const int64_t *tgt = tt->data;
    const float *me = gt(g, "mask.emb", NS * E), *mm = gt(g, "mask.mid", NS * H), *md = gt(g, "mask.dec", NS * H);
    const float *h0 = gt(g, "h0", L * N * H), *c0 = gt(g, "c0", L * N * H);
    ps_lstm_weights w[L];
    for (int k = 0; k < L; k++) {
        int64_t in = k ? H : E;
        snprintf(name, sizeof name, "init.rnn.weight_ih_l%d", k); w[k].w_ih = gt(g, name, 4 * H * in);
        snprintf(name, sizeof name, "init.rnn.weight_hh_l%d", k); w[k].w_hh = gt(g, name, 4 * H * H);
        snprintf(name, sizeof name, "init.rnn.bias_ih_l%d", k); w[k].b_ih = gt(g, name, 4 * H);
        snprintf(name, sizeof name, "init.rnn.bias_hh_l%d", k); w[k].b_hh = gt(g, name, 4 * H);
    }
    ps_lstm *lay[L] = {0};
    for (int k = 0; k < L; k++) {
        ps_lstm_shape s = {T, N, k ? H : E, H};
        CHECK(ps_lstm_create(impl, s, &lay[k], &err) == PS_OK);
    }
    float e[NS * E], y0[NS * H], y1[NS * H], z[NS * V], dz[NS * V], dy1[NS * H], dx1[NS * H], dx0[NS * E];
    float hn[L * N * H], cn[L * N * H];
    ps_tape *te = NULL, *td = NULL;
    ps_grads *acc = ps_grads_create(m, &err);
    const float *emask[1] = {me}, *dmask[1] = {md};
    float *gw[L][4];
    for (int k = 0; k < L; k++) {
        int64_t sz[4] = {4 * H * (k ? H : E), 4 * H * H, 4 * H, 4 * H};
        for (int q = 0; q < 4; q++) gw[k][q] = calloc((size_t)sz[q], sizeof(float));
    }
    if (lay[0] && lay[1] && acc && me && mm && md && h0 && c0 &&
        ps_model_forward_range(m, 0, 0, ids, NS, 1, emask, 0, e, &te, NULL, &err) == PS_OK &&
        ps_lstm_forward(lay[0], &w[0], e, h0, c0, y0, hn, cn, &err) == PS_OK) {
        for (int i = 0; i < NS * H; i++) y0[i] *= mm[i];
        CHECK(ps_lstm_forward(lay[1], &w[1], y0, h0 + N * H, c0 + N * H, y1, hn + N * H, cn + N * H, &err) == PS_OK);
        check_array("hn", hn, gt(g, "hn", L * N * H), L * N * H, TOL, TOL);
        check_array("cn", cn, gt(g, "cn", L * N * H), L * N * H, TOL, TOL);
        CHECK(ps_model_forward_range(m, 1, 1, y1, NS, 1, dmask, 0, z, &td, NULL, &err) == PS_OK);
        double loss = ce(z, tgt, dz);
        const float *gl = gt(g, "loss", 1);
        if (gl) CHECK_CLOSE(loss, gl[0], 1e-5, 1e-5);
        /* backward: decoder (input gradient), the LSTM, the embedding, then the LSTM's gradients pushed */
        CHECK(ps_model_backward_acc(m, td, dz, dy1, acc, &err) == PS_OK);
        ps_lstm_grads g1 = {gw[1][0], gw[1][1], gw[1][2], gw[1][3]}, g0 = {gw[0][0], gw[0][1], gw[0][2], gw[0][3]};
        CHECK(ps_lstm_backward(lay[1], &w[1], dy1, NULL, NULL, dx1, NULL, NULL, &g1, &err) == PS_OK);
        for (int i = 0; i < NS * H; i++) dx1[i] *= mm[i];
        CHECK(ps_lstm_backward(lay[0], &w[0], dx1, NULL, NULL, dx0, NULL, NULL, &g0, &err) == PS_OK);
        CHECK(ps_model_backward_acc(m, te, dx0, NULL, acc, &err) == PS_OK);
        static const char *pn[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
        for (int k = 0; k < L; k++)
            for (int q = 0; q < 4; q++) {
                snprintf(name, sizeof name, "rnn.%s_l%d", pn[q], k);
                CHECK(ps_grads_add_dense(m, acc, ps_model_find_param(m, name), gw[k][q], &err) == PS_OK);
            }
        for (int i = 0; i < ps_model_num_params(m); i++) {
            const ps_param_info *p = ps_model_param(m, i);
            float *got = malloc((size_t)p->numel * sizeof(float));
            CHECK(ps_grads_get(m, acc, i, got, &err) == PS_OK);
            snprintf(name, sizeof name, "grad.%s", p->name);
            const float *want = gt(g, name, p->numel);
            if (want) check_array(name, got, want, (size_t)p->numel, TOL, 1e-4);
            free(got);
        }
        double sq = 0;
        CHECK(ps_grads_sq_norm(m, acc, &sq, &err) == PS_OK);
        const float *gn = gt(g, "norm", 1);
        if (gn) CHECK_CLOSE(sqrt(sq), gn[0], 0, 2e-6); /* tight: the embedding rows are a small share */
        double coef = CLIP / (sqrt(sq) + 1e-6);
        CHECK(coef < 1);  /* the clip bites */
        CHECK(ps_grads_scale(m, acc, (float)coef, &err) == PS_OK);
        uint64_t v = 0;
        CHECK(ps_model_step_grads(m, acc, &v, &err) == PS_OK && v == 1);
        for (int i = 0; i < ps_model_num_params(m); i++) {
            const ps_param_info *p = ps_model_param(m, i);
            float *got = malloc((size_t)p->numel * sizeof(float));
            CHECK(ps_model_get_param(m, i, got, &err) == PS_OK);
            snprintf(name, sizeof name, "final.%s", p->name);
            const float *want = gt(g, name, p->numel);
            if (want) check_array(name, got, want, (size_t)p->numel, TOL, 1e-4);
            free(got);
        }
    } else {
        CHECK_MSG(0, "%s: setup failed: %s", label, err.msg);
    }
    for (int k = 0; k < L; k++) {
        ps_lstm_free(lay[k]);
        for (int q = 0; q < 4; q++) free(gw[k][q]);
    }
    ps_grads_free(acc);
    ps_tape_free(te);
    ps_tape_free(td);
    ps_model_free(m);
}

int main(void) {
    ps_err err = {0};
    ps_st_file *g = ps_st_read("tests/golden/lm_step.safetensors", &err);
    CHECK_MSG(g, "%s", err.msg);
    if (g) {
        step(g, "dnnl", PS_LSTM_DNNL);
        step(g, "ref", PS_LSTM_REF);
        ps_st_free(g);
    }
    return check_summary("test_lm_step");
}
