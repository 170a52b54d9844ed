/* reinforce.c - REINFORCE for one observer's episode: discounted returns
 * and the policy-gradient loss with its gradients (reinforce.h). */
#include "reinforce.h"

#include <math.h>

#define FLOAT32_EPS 1.1920928955078125e-07  /* np.finfo(np.float32).eps */
#define P_MIN 1e-30

void ps_reinforce_returns(const double *rewards, int T, double gamma, int normalize, double *returns) {
    double R = 0;
    for (int i = T - 1; i >= 0; i--) {
        R = rewards[i] + gamma * R;
        returns[i] = R;
    }
    if (!normalize || T < 1) return;
    double mean = 0, var = 0;
    for (int i = 0; i < T; i++) mean += returns[i];
    mean /= T;
    for (int i = 0; i < T; i++) var += (returns[i] - mean) * (returns[i] - mean);
    double sd = T > 1 ? sqrt(var / (T - 1)) : 0;
    for (int i = 0; i < T; i++) returns[i] = (returns[i] - mean) / (sd + FLOAT32_EPS);
}

double ps_reinforce_grads(const float *probs, int T, int K, const int *actions, const double *returns, double beta,
                          float *grads) {
    double loss = 0;
    for (int i = 0; i < T; i++) {
        const float *p = probs + (long)i * K;
        float *g = grads + (long)i * K;
        int a = actions[i];
        double pa = p[a] > P_MIN ? p[a] : P_MIN;
        loss -= log(pa) * returns[i];
        for (int k = 0; k < K; k++) g[k] = 0;
        double ga = -returns[i] / pa;
        for (int k = 0; k < K; k++) {
            double gk = k == a ? ga : 0;
            if (beta > 0) {
                double pk = p[k] > P_MIN ? p[k] : P_MIN;
                loss += beta * pk * log(pk);
                gk += beta * (log(pk) + 1);
            }
            g[k] = (float)gk;
        }
    }
    return loss;
}
