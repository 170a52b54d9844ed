/* reinforce.h - the REINFORCE loss of one observer's episode (the cartpole
 * task, task_cartpole.c), apart so tests compare it with PyTorch.
 *
 * Returns are the observer's own: R_t = r_t + gamma * R_{t+1}, never
 * carried across observers (the tutorial concatenates all observers'
 * rewards; that is a bug we do not copy). With normalize they are
 * standardised over the episode, (R - mean) / (std + eps) with torch's
 * unbiased std and eps = float32 epsilon, as PyTorch's reinforce.py; one
 * step gives std 0 and all-zero normalised returns.
 *
 * The loss of an episode of T steps over K actions is
 *     L = -sum_t log p[t, a_t] * R_t  -  beta * sum_t H(p[t])
 * with H(p) = -sum_k p_k log p_k (an entropy bonus, beta >= 0), and its
 * gradient with respect to the probabilities is what the observer sends in
 * Backward: dL/dp[t, k] = -R_t / p[t, a_t] [k = a_t] + beta (log p[t, k] + 1).
 * Probabilities below 1e-30 are taken as 1e-30 (no infinities).
 */
#ifndef PS_TRAINER_REINFORCE_H
#define PS_TRAINER_REINFORCE_H

void ps_reinforce_returns(const double *rewards, int T, double gamma, int normalize, double *returns);
/* probs, grads: (T, K); returns L. */
double ps_reinforce_grads(const float *probs, int T, int K, const int *actions, const double *returns, double beta,
                          float *grads);

#endif
