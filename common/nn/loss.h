/* loss.h - losses computed on the host, shared by psd (the fused decoder
 * mode) and the trainer (the tutorial's logits mode, evaluation). */
#ifndef PS_NN_LOSS_H
#define PS_NN_LOSS_H

#include <stdint.h>

/* Mean cross-entropy of logits (n, k) against int64 targets, each already
 * checked to lie in 0..k-1: a max-shifted log-sum-exp per row, exp in float
 * (vectorised, ~1 ulp; loss.c), each row's log-sum-exp and the mean in
 * double. grad (may be NULL) receives d loss / d logits, (n, k); it may be
 * logits itself (computed in place, one row at a time). Any NaN or +inf
 * logit makes the loss NaN. */
double ps_cross_entropy(const float *logits, const int64_t *tgt, int64_t n, int64_t k, float *grad);

/* sum of x[i]^2 in double (vectorised like the cross-entropy): the
 * gradient norms of clip_grad_norm_ */
double ps_sum_squares(const float *x, int64_t n);

/* The same with the vector width forced (tests): 512 (AVX-512), 256 (AVX2),
 * 128 (SSE4.1) or 0 (scalar). Returns 0, computing nothing, when this CPU
 * lacks it. */
int ps_cross_entropy_width(int width, const float *logits, const int64_t *tgt, int64_t n, int64_t k, float *grad,
                           double *loss);

#endif
