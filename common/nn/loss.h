/* loss.h - losses computed on the host, shared by psd (the fused decoder
 * mode) and the trainer (the tutorial's logits mode, evaluation). */
#ifndef PS_NN_LOSS_H
#define PS_NN_LOSS_H

#include <stdint.h>

/* Mean cross-entropy of logits (n, k) against int64 targets, each already
 * checked to lie in 0..k-1, computed with a max-shifted log-sum-exp in
 * double. grad (may be NULL) receives d loss / d logits, (n, k). */
double ps_cross_entropy(const float *logits, const int64_t *tgt, int64_t n, int64_t k, float *grad);

#endif
