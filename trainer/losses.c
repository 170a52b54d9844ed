/* losses.c - the loss table of ps-train fit (losses.h). */
#include "losses.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "loss.h"

/* ---- class losses: out (n, c, inner), y (n, inner) ------------------------ */

/* Targets of y[0..m) that count (not ignore). */
static int64_t counted(const int64_t *y, int64_t m, int64_t ignore) {
    int64_t k = 0;
    for (int64_t i = 0; i < m; i++) k += y[i] != ignore;
    return k;
}

/* The mean over the targets that count, as PyTorch's reduction='mean' with
 * ignore_index; none counting: 0 and a zero gradient (losses.h). */
static double nll_forward(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore,
                          float *grad) {
    const int64_t *y = targets;
    const int64_t m = counted(y, n * inner, ignore);
    double loss = 0;
    memset(grad, 0, (size_t)(n * c * inner) * sizeof *grad);
    if (!m) return 0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t i = 0; i < inner; i++) {
            if (y[s * inner + i] == ignore) continue;
            int64_t k = (s * c + y[s * inner + i]) * inner + i;
            loss -= out[k];
            grad[k] = (float)(-1.0 / (double)m);
        }
    return loss / (double)m;
}

/* log-softmax over c at (s, i), stride inner. */
static double ce_forward(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore,
                         float *grad) {
    const int64_t *y = targets;
    const int64_t m = counted(y, n * inner, ignore);
    if (inner == 1 && m == n) return ps_cross_entropy(out, y, n, c, grad); /* psd's vectorised one (common/nn/loss.h) */
    memset(grad, 0, (size_t)(n * c * inner) * sizeof *grad);
    if (!m) return 0;
    double loss = 0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t i = 0; i < inner; i++) {
            int64_t t = y[s * inner + i];
            if (t == ignore) continue;
            const float *o = out + s * c * inner + i;
            float *g = grad + s * c * inner + i;
            double mx = -INFINITY, sum = 0;
            for (int64_t k = 0; k < c; k++) mx = o[k * inner] > mx ? o[k * inner] : mx;
            for (int64_t k = 0; k < c; k++) sum += exp((double)o[k * inner] - mx);
            double lse = mx + log(sum);
            loss += lse - o[t * inner];
            for (int64_t k = 0; k < c; k++)
                g[k * inner] = (float)((exp((double)o[k * inner] - lse) - (k == t)) / (double)m);
        }
    return loss / (double)m;
}

static int64_t argmax_correct(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner,
                              int64_t ignore) {
    const int64_t *y = targets;
    int64_t ok = 0;
    for (int64_t s = 0; s < n; s++)
        for (int64_t i = 0; i < inner; i++) {
            if (y[s * inner + i] == ignore) continue;
            const float *o = out + s * c * inner + i;
            int64_t best = 0;
            for (int64_t k = 1; k < c; k++)
                if (o[k * inner] > o[best * inner]) best = k;
            ok += best == y[s * inner + i];
        }
    return ok;
}

/* ---- dense losses: out and t of n*c*inner floats ---------------------------- */

static double mse_forward(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore,
                          float *grad) {
    (void)ignore;
    const float *t = targets;
    const int64_t m = n * c * inner;
    double loss = 0;
    for (int64_t k = 0; k < m; k++) {
        double d = (double)out[k] - t[k];
        loss += d * d;
        grad[k] = (float)(2.0 * d / (double)m);
    }
    return loss / (double)m;
}

/* max(x, 0) - x t + log(1 + exp(-|x|)): PyTorch's stable form. */
static double bce_forward(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore,
                          float *grad) {
    (void)ignore;
    const float *t = targets;
    const int64_t m = n * c * inner;
    double loss = 0;
    for (int64_t k = 0; k < m; k++) {
        double x = out[k];
        loss += (x > 0 ? x : 0) - x * t[k] + log1p(exp(-fabs(x)));
        double sig = x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
        grad[k] = (float)((sig - t[k]) / (double)m);
    }
    return loss / (double)m;
}

static int64_t bce_correct(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner,
                           int64_t ignore) {
    (void)ignore;
    const float *t = targets;
    int64_t ok = 0;
    for (int64_t k = 0; k < n * c * inner; k++) ok += (out[k] > 0) == (t[k] > 0.5f);
    return ok;
}

/* F.binary_cross_entropy of probabilities: each log clamped at -100 and the
 * gradient's denominator at 1e-12, as PyTorch's. */
static double bce_prob_term(double x, double y, double *g) {
    double lx = x > 0 ? log(x) : -100.0, l1 = x < 1 ? log1p(-x) : -100.0, den = (1.0 - x) * x;
    *g = (x - y) / (den > 1e-12 ? den : 1e-12);
    return -(y * (lx > -100.0 ? lx : -100.0) + (1.0 - y) * (l1 > -100.0 ? l1 : -100.0));
}

static double bcep_forward(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore,
                          float *grad) {
    (void)ignore;
    const float *t = targets;
    const int64_t m = n * c * inner;
    double loss = 0, g;
    for (int64_t k = 0; k < m; k++) {
        loss += bce_prob_term(out[k], t[k], &g);
        grad[k] = (float)(g / (double)m);
    }
    return loss / (double)m;
}

static int64_t bcep_correct(const float *out, const void *targets, int64_t n, int64_t c, int64_t inner,
                           int64_t ignore) {
    (void)ignore;
    const float *t = targets;
    int64_t ok = 0;
    for (int64_t k = 0; k < n * c * inner; k++) ok += (out[k] > 0.5f) == (t[k] > 0.5f);
    return ok;
}

/* PyTorch's examples/vae loss per row [recon (t), mu (L), logvar (L)]: the
 * binary cross-entropy of the recon (bce_prob_term) summed over
 * the t targets, plus the KL divergence from N(0, 1) summed over the L
 * latents; the mean over rows. */
static double vae_forward(const float *out, const float *tg, int64_t n, int64_t c, int64_t t, float *grad) {
    const int64_t L = (c - t) / 2;
    double loss = 0;
    for (int64_t s = 0; s < n; s++) {
        const float *o = out + s * c, *y = tg + s * t;
        float *g = grad + s * c;
        for (int64_t j = 0; j < t; j++) {
            double gj;
            loss += bce_prob_term(o[j], y[j], &gj);
            g[j] = (float)(gj / (double)n);
        }
        for (int64_t l = 0; l < L; l++) {
            double mu = o[t + l], lv = o[t + L + l];
            loss += -0.5 * (1.0 + lv - mu * mu - exp(lv));
            g[t + l] = (float)(mu / (double)n);
            g[t + L + l] = (float)(0.5 * (exp(lv) - 1.0) / (double)n);
        }
    }
    return loss / (double)n;
}

static const ps_loss g_losses[] = {
    {"nll", "F.nll_loss: the model outputs log-probabilities (LogSoftmax), targets are class ids", 1, nll_forward,
     argmax_correct},
    {"cross_entropy", "F.cross_entropy: the model outputs logits, targets are class ids", 1, ce_forward,
     argmax_correct},
    {"mse", "F.mse_loss: targets are numbers shaped like the output", 0, mse_forward, NULL},
    {"bce_with_logits", "F.binary_cross_entropy_with_logits: logits, targets in [0, 1] shaped like the output", 0,
     bce_forward, bce_correct},
    {"bce", "F.binary_cross_entropy: probabilities (a final sigmoid), targets in [0, 1] shaped like the output", 0,
     bcep_forward, bcep_correct},
    {"vae_bce", "a VAE's loss (PyTorch's examples/vae): binary cross-entropy of the recon, summed, plus the KL "
     "divergence; the output is [recon, mu, logvar] (psd-export joins a module's tuple), targets the recon's size "
     "(--labels inputs)", 0, NULL, NULL, vae_forward},
};
#define N_LOSSES ((int)(sizeof g_losses / sizeof g_losses[0]))

const ps_loss *ps_loss_find(const char *name) {
    for (int i = 0; i < N_LOSSES; i++)
        if (!strcmp(g_losses[i].name, name)) return &g_losses[i];
    return NULL;
}

int ps_loss_count(void) { return N_LOSSES; }
const ps_loss *ps_loss_at(int i) { return i >= 0 && i < N_LOSSES ? &g_losses[i] : NULL; }

const char *ps_loss_names(char *buf, size_t len) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < N_LOSSES && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", g_losses[i].name);
    return buf;
}

int64_t ps_loss_counted(const ps_loss *l, const void *targets, int64_t n, int64_t c, int64_t inner, int64_t ignore) {
    if (l->class_targets) return counted(targets, n * inner, ignore);
    return n * ps_loss_predictions(l, c, inner);
}

int64_t ps_loss_predictions(const ps_loss *l, int64_t c, int64_t inner) {
    return l->forward_t ? 1 : l->class_targets ? inner : c * inner;
}
