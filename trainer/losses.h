/* losses.h - the losses `ps-train fit --loss` computes on the trainer, one
 * row each: the value (the batch mean, as PyTorch's reduction='mean'), its
 * gradient with respect to the model's output, and accuracy where the loss
 * classifies.
 *
 * Shapes. The model's output is (n, c, inner): n samples (times any
 * leading dims), c the class dim (PyTorch's dim 1) and inner the product of
 * the dims after it (1 for a plain classifier, H*W for segmentation).
 *  - class losses (targets = class ids): targets are int64 (n, inner),
 *    each in 0..c-1 (checked by the caller: trainer/fit_data.h);
 *      nll            F.nll_loss(out, y): out holds log-probabilities
 *      cross_entropy  F.cross_entropy(out, y): out holds logits
 *  - dense losses: targets are float32 shaped like the output (n*c*inner
 *    values; c and inner only matter for the count);
 *      mse               F.mse_loss(out, t)
 *      bce_with_logits   F.binary_cross_entropy_with_logits(out, t)
 *      bce               F.binary_cross_entropy(out, t): out holds probabilities
 *  - a VAE's loss (forward_t): targets are float32, the first t values of
 *    each output row; the rest of the row is a Gaussian's mean and
 *    log-variance, L values each;
 *      vae_bce           PyTorch's examples/vae: per sample
 *                        F.binary_cross_entropy(recon, t, reduction='sum')
 *                        - 0.5 * sum(1 + logvar - mu^2 - exp(logvar))
 * The value is the mean over every prediction (n*inner for class losses,
 * n*c*inner for dense), summed in double; grad (n*c*inner floats, not
 * aliasing out) receives d loss / d out.
 *
 * ignore (class losses; PS_LOSS_NO_IGNORE: none): PyTorch's ignore_index -
 * a target equal to it is no prediction: no loss, a zero gradient, not in
 * the mean's count nor in accuracy (ps_loss_counted says how many count).
 * A batch whose targets are all ignored gives 0 and a zero gradient
 * (PyTorch's mean is 0/0 = nan, and nan gradients). Dense losses ignore it.
 * Class layout "last" ((n, d..., C) as a language model's (N, T, V)) is the
 * caller's: rows n*prod(d), c = C, inner 1.
 *
 * Accuracy: class losses count argmax over c == target (the first maximum
 * wins, as torch.argmax); bce_with_logits counts (out > 0) == (t > 0.5);
 * bce counts (out > 0.5) == (t > 0.5); mse has none (correct is NULL). Each is checked against PyTorch by
 * tests/test_losses.c (tests/golden/losses.safetensors).
 */
#ifndef PS_TRAINER_LOSSES_H
#define PS_TRAINER_LOSSES_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_loss {
    const char *name;           /* "cross_entropy" */
    const char *about;          /* one line for --help: PyTorch's equivalent */
    int class_targets;          /* 1: int64 class ids (n, inner); 0: float32 like the output */
    double (*forward)(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore,
                      float *grad);
    /* Correct predictions of the n*inner (class; those not ignored) or
     * n*c*inner (dense) made; NULL when the loss has no accuracy. */
    int64_t (*correct)(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore);
    /* Set (forward then NULL) for a loss whose targets cover only the
     * first t of each output row's c values: n rows, the value the mean
     * over rows of each row's sum, grad (n*c) d loss / d out. vae_bce:
     * the row is [recon (t), mu (L), logvar (L)], c = t + 2L. */
    double (*forward_t)(const float *out, const float *targets, int64_t n, int64_t c, int64_t t, float *grad);
} ps_loss;

const ps_loss *ps_loss_find(const char *name); /* NULL when unknown */
int ps_loss_count(void);
const ps_loss *ps_loss_at(int i);
/* "nll, cross_entropy, mse, bce_with_logits" into buf. */
const char *ps_loss_names(char *buf, size_t len);
#define PS_LOSS_NO_IGNORE INT64_MIN   /* no class id is ignored */

/* Predictions that count in a batch of n rows: class losses the targets
 * other than ignore, dense n * ps_loss_predictions. */
int64_t ps_loss_counted(const ps_loss *l, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore);
/* Predictions one sample makes: inner (class), c*inner (dense), 1 (forward_t: a sum per sample). */
int64_t ps_loss_predictions(const ps_loss *l, int64_t c, int64_t inner);

#endif
