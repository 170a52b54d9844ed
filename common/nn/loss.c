#include "loss.h"

#include <math.h>

double ps_cross_entropy(const float *logits, const int64_t *tgt, int64_t n, int64_t k, float *grad) {
    double loss = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *z = logits + i * k;
        float mx = z[0];
        for (int64_t v = 1; v < k; v++) mx = z[v] > mx ? z[v] : mx;
        double s = 0;
        for (int64_t v = 0; v < k; v++) s += exp((double)z[v] - mx);
        double lse = mx + log(s);
        loss += lse - z[tgt[i]];
        if (grad) {
            float *g = grad + i * k;
            for (int64_t v = 0; v < k; v++) g[v] = (float)(exp((double)z[v] - lse) / (double)n);
            g[tgt[i]] -= 1.0f / (float)n;
        }
    }
    return loss / (double)n;
}
