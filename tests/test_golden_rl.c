/* test_golden_rl.c - one full round of the cartpole task against PyTorch
 * (tests/golden/cartpole_round.safetensors, scripts/gen_golden_rl.py):
 * two observers' episodes (T = 9 and 6), one (1, 4) forward per step
 * through the cartpole_policy model with the stored dropout masks, the
 * observers' returns and d loss / d probs from trainer/reinforce.c (the
 * code ps-train cartpole runs) given the stored actions and rewards, each
 * observer's backward into its own context gradients, the round's sum (as
 * psd's sync round with sync_reduce sum adds its members) and one SGD or
 * Adam (lr 1e-2, the shipped config's) step - for the ref and dnnl
 * backends. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "model.h"
#include "reinforce.h"
#include "safetensors.h"

#define ATOL 1e-6
#define RTOL 1e-4
#define OKE(call) CHECK_MSG((call) == PS_OK, "%s: %s", label, err.msg)

static const void *tensor(const ps_st_file *g, const char *name, int dtype, int64_t numel) {
    const ps_st_tensor *t = ps_st_find(g, name);
    CHECK_MSG(t && t->dtype == dtype && ps_st_numel(t) == numel, "golden %s: missing or wrong dtype/size", name);
    return t && t->dtype == dtype && ps_st_numel(t) == numel ? t->data : NULL;
}

static void round_test(const char *backend, int adam) {
    char label[64], what[192], name[96];
    snprintf(label, sizeof label, "%s cartpole round (%s)", backend, adam ? "adam" : "sgd");
    ps_err err = {0};
    ps_st_file *g = ps_st_read("tests/golden/cartpole_round.safetensors", &err);
    CHECK_MSG(g, "%s", err.msg);
    ps_optim_spec spec;
    ps_optim_spec_default(PS_OPTIM_ADAM, &spec);
    spec.lr = 0.01;
    ps_model_opts o = {.arch = "cartpole_policy", .cpu_backend = backend, .seed = 3, .compute_threads = 2,
                       .lr = 0.01f, .optim = adam ? &spec : NULL};
    ps_model *m = ps_model_create(&o, &err);
    CHECK_MSG(m, "%s", err.msg);
    if (!g || !m) { ps_st_free(g); ps_model_free(m); return; }
    for (int i = 0; i < ps_model_num_params(m); i++) {
        const ps_param_info *p = ps_model_param(m, i);
        snprintf(name, sizeof name, "init.%s", p->name);
        const float *w = tensor(g, name, PS_ST_F32, p->numel);
        if (w) OKE(ps_model_set_param(m, i, w, &err));
    }
    const int Ts[2] = {9, 6};
    ps_grads *acc[2] = {NULL, NULL};
    double round_loss = 0;
    for (int k = 0; k < 2; k++) {
        int T = Ts[k];
        char nm[5][32];
        const char *sfx[5] = {"input", "mask", "action", "reward", "return"};
        for (int j = 0; j < 5; j++) snprintf(nm[j], sizeof nm[j], "o%d.%s", k, sfx[j]);
        const float *x = tensor(g, nm[0], PS_ST_F32, T * 4), *mask = tensor(g, nm[1], PS_ST_F32, T * 128);
        const int64_t *act = tensor(g, nm[2], PS_ST_I64, T);
        const float *rew = tensor(g, nm[3], PS_ST_F32, T), *want_ret = tensor(g, nm[4], PS_ST_F32, T);
        snprintf(name, sizeof name, "o%d.output", k);
        const float *want_out = tensor(g, name, PS_ST_F32, T * 2);
        snprintf(name, sizeof name, "o%d.grad_output", k);
        const float *want_gout = tensor(g, name, PS_ST_F32, T * 2);
        acc[k] = ps_grads_create(m, &err);
        if (!x || !mask || !act || !rew || !want_ret || !want_out || !want_gout || !acc[k]) continue;
        float probs[18], gout[18];
        int actions[9];
        double rewards[9], ret[9];
        ps_tape *tapes[9] = {0};
        for (int t = 0; t < T; t++) {   /* one forward per step, as the observer sends them */
            const float *masks[1] = {mask + t * 128};
            OKE(ps_model_forward_range(m, 0, 0, x + t * 4, 1, 1, masks, 0, probs + t * 2, &tapes[t], NULL, &err));
            actions[t] = (int)act[t];
            rewards[t] = rew[t];
        }
        snprintf(what, sizeof what, "%s observer %d probs", label, k);
        check_array(what, probs, want_out, (size_t)T * 2, ATOL, RTOL);
        ps_reinforce_returns(rewards, T, 0.99, 1, ret);
        float retf[9];
        for (int t = 0; t < T; t++) retf[t] = (float)ret[t];
        snprintf(what, sizeof what, "%s observer %d normalised returns", label, k);
        check_array(what, retf, want_ret, (size_t)T, 1e-6, 1e-5);
        round_loss += ps_reinforce_grads(probs, T, 2, actions, ret, 0.01, gout);
        /* PyTorch's Categorical renormalises probs, which adds a per-row
         * constant to d loss / d probs; softmax's backward removes any such
         * constant, so compare the part that reaches the logits:
         * g_k - sum_j p_j g_j. */
        float gp[18], wp[18];
        for (int t = 0; t < T; t++) {
            double dg = 0, dw = 0;
            for (int j = 0; j < 2; j++) dg += probs[t * 2 + j] * gout[t * 2 + j], dw += probs[t * 2 + j] * want_gout[t * 2 + j];
            for (int j = 0; j < 2; j++) gp[t * 2 + j] = (float)(gout[t * 2 + j] - dg), wp[t * 2 + j] = (float)(want_gout[t * 2 + j] - dw);
        }
        snprintf(what, sizeof what, "%s observer %d d loss / d probs (projected)", label, k);
        check_array(what, gp, wp, (size_t)T * 2, ATOL, RTOL);
        for (int t = 0; t < T; t++) {
            if (tapes[t]) OKE(ps_model_backward_acc(m, tapes[t], gout + t * 2, NULL, acc[k], &err));
            ps_tape_free(tapes[t]);
        }
    }
    const float *want_loss = tensor(g, "round_loss", PS_ST_F32, 1);
    if (want_loss) CHECK_CLOSE(round_loss, want_loss[0], 1e-5, 1e-4);
    if (acc[0] && acc[1]) {
        OKE(ps_grads_add(m, acc[0], acc[1], &err));   /* the sync round: sum */
        for (int i = 0; i < ps_model_num_params(m); i++) {
            const ps_param_info *p = ps_model_param(m, i);
            float *got = malloc((size_t)p->numel * sizeof(float));
            snprintf(name, sizeof name, "grad.%s", p->name);
            const float *want = tensor(g, name, PS_ST_F32, p->numel);
            OKE(ps_grads_get(m, acc[0], i, got, &err));
            snprintf(what, sizeof what, "%s %s", label, name);
            if (want) check_array(what, got, want, (size_t)p->numel, ATOL, RTOL);
            free(got);
        }
        uint64_t v = 0;
        OKE(ps_model_step_grads(m, acc[0], &v, &err));
        CHECK(v == 1);
        for (int i = 0; i < ps_model_num_params(m); i++) {
            const ps_param_info *p = ps_model_param(m, i);
            float *got = malloc((size_t)p->numel * sizeof(float));
            snprintf(name, sizeof name, "%s.%s", adam ? "final_adam" : "final", p->name);
            const float *want = tensor(g, name, PS_ST_F32, p->numel);
            OKE(ps_model_get_param(m, i, got, &err));
            snprintf(what, sizeof what, "%s %s", label, name);
            if (want) check_array(what, got, want, (size_t)p->numel, ATOL, RTOL);
            free(got);
        }
    }
    ps_grads_free(acc[0]);
    ps_grads_free(acc[1]);
    ps_model_free(m);
    ps_st_free(g);
}

/* Properties of the returns that need no reference. */
static void returns_props(void) {
    double r[4] = {1, 1, 1, 1}, R[4];
    ps_reinforce_returns(r, 4, 0.5, 0, R);
    CHECK(R[3] == 1 && R[2] == 1.5 && R[1] == 1.75 && R[0] == 1.875);
    ps_reinforce_returns(r, 4, 0.5, 1, R);
    double mean = (R[0] + R[1] + R[2] + R[3]) / 4;
    CHECK(fabs(mean) < 1e-12);
    ps_reinforce_returns(r, 1, 0.99, 1, R);
    CHECK(R[0] == 0);   /* one step: nothing to prefer */
}

int main(void) {
    returns_props();
    for (int adam = 0; adam < 2; adam++) {
        round_test("ref", adam);
        round_test("dnnl", adam);
    }
    return check_summary("test_golden_rl");
}
