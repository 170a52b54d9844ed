/* lstm.h - one LSTM layer as PyTorch's nn.LSTM computes it, forward
 * (training) and backward, for the trainer of the language model.
 *
 * Shapes: x (T, N, I) time-major, h0 and c0 (N, H), y (T, N, H), hT and cT
 * (N, H). Weights in PyTorch's layout and gate order i, f, g, o:
 *   w_ih (4H, I), w_hh (4H, H), b_ih (4H), b_hh (4H)
 *   gates_t = x_t w_ih^T + b_ih + h_{t-1} w_hh^T + b_hh
 *   i, f, o = sigmoid(.), g = tanh(.); c_t = f c_{t-1} + i g; h_t = o tanh(c_t)
 * The two biases are summed forward and both get the same gradient.
 *
 * Two implementations behind one handle: PS_LSTM_REF (plain C loops, the
 * reference) and PS_LSTM_DNNL (oneDNN's sgemm: the input projection, the
 * weight gradients and the input gradient of the whole window as one GEMM
 * each, the recurrent product per step, and a vectorised cell; the weights
 * are read in PyTorch's layout as they are).
 *
 * A handle is made for one shape (T, N, I, H) and remembers its last
 * forward (a copy of x, h0, c0 and the activations), which one backward
 * differentiates and consumes (the oneDNN implementation writes the gates'
 * gradients over the activations). Callers keep one handle per layer and
 * make a new one when T or N change (a short last BPTT window). Not
 * thread-safe; ps_lstm_free(NULL) is a no-op. Errors:
 * PS_ERR_INVALID_ARGUMENT for a bad shape, a backward without a forward of
 * its own; PS_ERR_INTERNAL naming the oneDNN call that failed.
 */
#ifndef PS_NN_LSTM_H
#define PS_NN_LSTM_H

#include <stdint.h>

#include "status.h"

typedef enum { PS_LSTM_REF = 0, PS_LSTM_DNNL = 1 } ps_lstm_impl;

typedef struct ps_lstm_shape {
    int64_t T, N, I, H; /* time steps, batch, input width, hidden width */
} ps_lstm_shape;

typedef struct ps_lstm_weights {
    const float *w_ih; /* (4H, I) */
    const float *w_hh; /* (4H, H) */
    const float *b_ih; /* (4H) */
    const float *b_hh; /* (4H) */
} ps_lstm_weights;

/* Gradients, accumulated (+=) by backward; with set, written (=) instead
 * (no zeroing pass before, no read of the old values). */
typedef struct ps_lstm_grads {
    float *w_ih, *w_hh, *b_ih, *b_hh;
    int set;
} ps_lstm_grads;

typedef struct ps_lstm ps_lstm;

ps_status ps_lstm_create(ps_lstm_impl impl, ps_lstm_shape shape, ps_lstm **out, ps_err *err);
void ps_lstm_free(ps_lstm *l);
/* OpenMP threads oneDNN's sgemm runs on in the LSTM, for every handle, set in
 * the thread that computes before each primitive; 0 (the default) leaves
 * the OpenMP default (OMP_NUM_THREADS, else every CPU). */
void ps_lstm_set_threads(int n);
/* "ref" or "dnnl"; ps_lstm_impl_parse returns -1 for anything else. */
const char *ps_lstm_impl_name(ps_lstm_impl impl);
int ps_lstm_impl_parse(const char *name);

/* y, hT, cT from x, h0, c0 (h0/c0 NULL: zeros); hT/cT may be NULL. */
ps_status ps_lstm_forward(ps_lstm *l, const ps_lstm_weights *w, const float *x, const float *h0, const float *c0,
                          float *y, float *hT, float *cT, ps_err *err);
/* Backward of the last forward (once) with weights w: dy (T,N,H); dhT, dcT (N,H)
 * or NULL for zeros. Writes dx (T,N,I), dh0, dc0 (each may be NULL) and
 * adds the weight gradients to g. */
ps_status ps_lstm_backward(ps_lstm *l, const ps_lstm_weights *w, const float *dy, const float *dhT, const float *dcT,
                           float *dx, float *dh0, float *dc0, ps_lstm_grads *g, ps_err *err);

#endif
