/* test_losses.c - the loss table of ps-train fit (trainer/losses.h) against
 * PyTorch: every case of tests/golden/losses.safetensors
 * (scripts/gen_golden_losses.py) gives the same mean loss (torch's, in
 * float64), the same gradient (autograd, float32) and the same number of
 * correct predictions (vae_bce: the targets cover each row's recon only); and every row of
 * the table has a case. Cases with "<case>.ignore" pass PyTorch's ignore_index (the mean and
 * accuracy over the targets not ignored; all ignored: PyTorch's nan, psd's 0 and no gradient),
 * "*_last" cases are (N, T, V) logits flattened as loss_fn(logits.reshape(-1, V), tgt.reshape(-1)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "losses.h"
#include "safetensors.h"

#define GOLDEN "tests/golden/losses.safetensors"

int main(void) {
    ps_err e = {0};
    ps_st_file *g = ps_st_read(GOLDEN, &e);
    CHECK_MSG(g != NULL, "%s", e.msg);
    if (!g) return check_summary("test_losses");
    int covered[16] = {0}, cases = 0;
    for (size_t i = 0; i < ps_st_metadata_count(g); i++) {
        const char *key = ps_st_metadata_key(g, i);
        size_t kl = strlen(key);
        if (kl < 10 || strcmp(key + kl - 10, ".loss_name")) continue;
        char cs[96], k2[128];
        snprintf(cs, sizeof cs, "%.*s", (int)(kl - 10), key);
        const ps_loss *l = ps_loss_find(ps_st_metadata_value(g, i));
        CHECK_MSG(l != NULL, "%s: loss '%s' is not in the table", cs, ps_st_metadata_value(g, i));
        if (!l) continue;
        for (int r = 0; r < ps_loss_count(); r++) covered[r] |= ps_loss_at(r) == l;
        long long n = 0, c = 0, inner = 0;
        snprintf(k2, sizeof k2, "%s.shape", cs);
        CHECK(sscanf(ps_st_metadata(g, k2) ? ps_st_metadata(g, k2) : "", "%lld,%lld,%lld", &n, &c, &inner) == 3);
        snprintf(k2, sizeof k2, "%s.loss", cs);
        double want_loss = ps_st_metadata(g, k2) ? strtod(ps_st_metadata(g, k2), NULL) : -1;
        const ps_st_tensor *out, *tgt, *grad, *corr;
        snprintf(k2, sizeof k2, "%s.out", cs);
        out = ps_st_find(g, k2);
        snprintf(k2, sizeof k2, "%s.target", cs);
        tgt = ps_st_find(g, k2);
        snprintf(k2, sizeof k2, "%s.grad", cs);
        grad = ps_st_find(g, k2);
        snprintf(k2, sizeof k2, "%s.correct", cs);
        corr = ps_st_find(g, k2);
        int64_t numel = n * c * inner, ignore = PS_LOSS_NO_IGNORE;
        snprintf(k2, sizeof k2, "%s.ignore", cs);
        if (ps_st_metadata(g, k2)) ignore = strtoll(ps_st_metadata(g, k2), NULL, 10);
        snprintf(k2, sizeof k2, "%s.torch_loss", cs);   /* all ignored: PyTorch's nan */
        if (ps_st_metadata(g, k2)) CHECK_MSG(isnan(strtod(ps_st_metadata(g, k2), NULL)), "%s: torch_loss", cs);
        long long tper = c * inner;   /* targets per row: the row's (dense), or the case's t (forward_t) */
        snprintf(k2, sizeof k2, "%s.t", cs);
        if (l->forward_t) CHECK_MSG(ps_st_metadata(g, k2) && sscanf(ps_st_metadata(g, k2), "%lld", &tper) == 1 &&
                                        tgt && ps_st_numel(tgt) == n * tper, "%s: targets per row", cs);
        CHECK_MSG(out && grad && tgt && ps_st_numel(out) == numel && ps_st_numel(grad) == numel, "%s: tensors", cs);
        CHECK_MSG(tgt && tgt->dtype == (l->class_targets ? PS_ST_I64 : PS_ST_F32), "%s: target dtype", cs);
        if (!out || !grad || !tgt || ps_st_numel(out) != numel) continue;
        float *g2 = malloc((size_t)numel * sizeof *g2);
        double loss = l->forward_t ? l->forward_t(out->data, tgt->data, n, c * inner, tper, g2)
                                   : l->forward(out->data, tgt->data, n, c, inner, ignore, g2);
        CHECK_CLOSE(loss, want_loss, 1e-7, 1e-6);
        char what[128];
        snprintf(what, sizeof what, "%s gradient", cs);
        check_array(what, g2, grad->data, (size_t)numel, 1e-8, 2e-5);
        if (l->correct) {
            CHECK_MSG(corr && corr->dtype == PS_ST_I64, "%s: no correct count", cs);
            if (corr) {
                int64_t got = l->correct(out->data, tgt->data, n, c, inner, ignore), want = *(const int64_t *)corr->data;
                CHECK_MSG(got == want, "%s: %lld correct, PyTorch %lld", cs, (long long)got, (long long)want);
            }
        } else {
            CHECK_MSG(!corr, "%s: PyTorch counts accuracy for a loss the table has none for", cs);
        }
        if (l->class_targets) {   /* the count the mean divides by: the targets not ignored */
            const int64_t *ty = tgt->data;
            int64_t want_n = 0;
            for (int64_t k = 0; k < n * inner; k++) want_n += ty[k] != ignore;
            CHECK(ps_loss_counted(l, ty, n, c, inner, ignore) == want_n);
        }
        free(g2);
        cases++;
        printf("%-12s %-16s n=%lld c=%lld inner=%lld  loss %.9f (torch %.9f)\n", cs, l->name, n, c, inner, loss,
               want_loss);
    }
    for (int r = 0; r < ps_loss_count(); r++)
        CHECK_MSG(covered[r], "loss %s has no PyTorch case in %s", ps_loss_at(r)->name, GOLDEN);
    CHECK(cases >= 17);
    char names[128];
    CHECK(!strcmp(ps_loss_names(names, sizeof names), "nll, cross_entropy, mse, bce_with_logits, bce, vae_bce"));
    CHECK(ps_loss_find("hinge") == NULL);
    CHECK(ps_loss_predictions(ps_loss_find("nll"), 10, 6) == 6 && ps_loss_predictions(ps_loss_find("mse"), 10, 6) == 60);
    CHECK(ps_loss_predictions(ps_loss_find("vae_bce"), 824, 1) == 1);
    ps_st_free(g);
    return check_summary("test_losses");
}
