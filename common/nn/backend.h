/* backend.h - the compute backend function table.
 *
 * Every layer the models use is one entry of ps_backend_ops. Exactly one
 * place (backend.c) knows which backends exist: "ref" (plain C, slow,
 * obviously correct; the tests' ground truth) and "dnnl" (oneDNN 2.6 CPU
 * primitives, created once per shape and cached), plus "cuda" (cuDNN,
 * cuBLAS and a few kernels; backend_cuda.c) when the build found nvcc.
 *
 * Contract for every op:
 *  - Tensors are dense float32 in plain row-major layouts: activations NCHW,
 *    conv weights (cout, cin, kh, kw), linear weights (out, in) as in
 *    PyTorch. Pointers are device pointers of the backend (for the CPU
 *    backends, ordinary host memory from ps_backend_alloc).
 *  - Gradients are written, never accumulated: dw/db/dx are overwritten.
 *  - An optional output given as NULL is not computed (dx of the first layer).
 *  - Ops are safe to call concurrently from several threads on the same
 *    backend with distinct output buffers (psd serves many trainers at once).
 *  - Ops return PS_OK or PS_ERR_INTERNAL (a library failure, with a message
 *    in err naming the failed call); shapes are validated by the caller.
 *
 * Activation layouts (optional, for speed). A backend may offer a
 * channel-blocked layout for 4-D activations (blocked_layout != NULL and it
 * returns a block size B > 0 for the channel count; then B divides c):
 * element (n, c, h, w) of an (N, C, H, W) tensor lives at
 *     ((n * (C/B) + c/B) * H * W + h * W + w) * B + c % B
 * (oneDNN's nChw16c / nChw8c), the same N*C*H*W floats as plain NCHW, so
 * elementwise ops (relu, act, mul, add, add_out, fill) work on either.
 * Conv, pooling (max and average), batch normalisation and mul_channels
 * take the layout of their activations in the descriptor (PS_LAYOUT_PLAIN,
 * the zero value, unless the model executor asked blocked_layout first);
 * layer normalisation, softmax and linear are plain only. Weights, biases,
 * statistics and gradients of parameters are always plain. reorder
 * converts between the two. Backends without blocked_layout are only ever
 * called with plain layouts.
 */
#ifndef PS_NN_BACKEND_H
#define PS_NN_BACKEND_H

#include <stddef.h>
#include <math.h>
#include <stdint.h>

#include "status.h"

#define PS_LAYOUT_PLAIN   0  /* NCHW */
#define PS_LAYOUT_BLOCKED 1  /* the backend's channel-blocked layout (see above) */

/* 2-D convolution (nn.Conv2d). Two ways to fill it:
 *  - square form (the MNIST CNN's; positional initialisers keep working):
 *    stride and pad apply to both axes, no dilation, one group;
 *  - general form, selected by stride_h > 0: stride_h/stride_w,
 *    pad_h/pad_w (zero padding on both sides of the axis, as PyTorch's
 *    padding=(ph, pw)), dil_h/dil_w (0 means 1) and groups (0 means 1);
 *    stride and pad are then ignored. Use designated initialisers.
 * With groups g, cin and cout are divisible by g and the weight is
 * (cout, cin/g, kh, kw) as in PyTorch; groups == cin (== cout or a
 * multiple) is the depthwise convolution. y is (n, cout, oh, ow) with
 *   oh = (h + 2*pad_h - dil_h*(kh-1) - 1) / stride_h + 1   (floor)
 * and likewise ow. ps_conv_resolve() gives the general form of either. */
typedef struct ps_conv_desc {
    int n, cin, h, w;
    int cout, kh, kw;
    int stride, pad;            /* square form; ignored when stride_h > 0 */
    int src_layout, dst_layout; /* of x/dx and y/dy; PS_LAYOUT_PLAIN when 0 */
    int stride_h, stride_w, pad_h, pad_w; /* general form (stride_h > 0) */
    int dil_h, dil_w;           /* dilation; 0 = 1 */
    int groups;                 /* 0 = 1 */
} ps_conv_desc;

/* d in the general form with every field explicit (stride = pad = 0,
 * dil_h, dil_w, groups >= 1): what backends compute from. */
static inline ps_conv_desc ps_conv_resolve(const ps_conv_desc *d) {
    ps_conv_desc r = *d;
    if (r.stride_h <= 0) {
        r.stride_h = r.stride_w = d->stride;
        r.pad_h = r.pad_w = d->pad;
    }
    r.stride = r.pad = 0;
    if (r.dil_h <= 0) r.dil_h = 1;
    if (r.dil_w <= 0) r.dil_w = 1;
    if (r.groups <= 0) r.groups = 1;
    return r;
}

static inline int ps_conv_out_h(const ps_conv_desc *d) {
    const ps_conv_desc r = ps_conv_resolve(d);
    return (r.h + 2 * r.pad_h - r.dil_h * (r.kh - 1) - 1) / r.stride_h + 1;
}
static inline int ps_conv_out_w(const ps_conv_desc *d) {
    const ps_conv_desc r = ps_conv_resolve(d);
    return (r.w + 2 * r.pad_w - r.dil_w * (r.kw - 1) - 1) / r.stride_w + 1;
}
/* Elements of the weight: cout * (cin / groups) * kh * kw. */
static inline int64_t ps_conv_weight_count(const ps_conv_desc *d) {
    const ps_conv_desc r = ps_conv_resolve(d);
    return (int64_t)r.cout * (r.cin / r.groups) * r.kh * r.kw;
}

/* 2-D pooling (nn.MaxPool2d, nn.AvgPool2d). Two
 * forms, as for convolution:
 *  - square form: k x k window, stride, no padding (positional
 *    initialisers { n, c, h, w, k, stride, layout } keep working);
 *  - general form, selected by kh > 0: kh x kw window, stride_h/stride_w,
 *    pad_h/pad_w (implicit padding on both sides; PyTorch requires
 *    pad <= kernel/2, the caller checks); k and stride are then ignored.
 * y is (n, c, oh, ow), oh = (h + 2*pad_h - kh) / stride_h + 1 (floor);
 * with ceil_mode, PyTorch's rule: the division rounds up, but the last
 * window must start inside the input or its left/top padding
 * (ps_pool_out_dim), so the last window may reach past the padded input.
 * Max pooling never picks a padded position (padding is -inf). Average
 * pooling divides by the window clipped to the padded input when
 * count_include_pad (PyTorch's default; kh*kw unless ceil_mode's last
 * window reaches past it) and by the number of window positions inside
 * the input otherwise.
 * AdaptiveAvgPool2d((1, 1)) is average pooling with kh = h, kw = w,
 * stride 1, no padding. */
typedef struct ps_pool_desc {
    int n, c, h, w;
    int k, stride;              /* square form; ignored when kh > 0 */
    int layout;                 /* of x, y, dx, dy; PS_LAYOUT_PLAIN when 0 */
    int kh, kw, stride_h, stride_w, pad_h, pad_w; /* general form (kh > 0) */
    int count_include_pad;      /* average pooling only */
    int ceil_mode;              /* PyTorch's ceil_mode: the output size rounds up */
} ps_pool_desc;

/* d in the general form with every field explicit (k = stride = 0). */
static inline ps_pool_desc ps_pool_resolve(const ps_pool_desc *d) {
    ps_pool_desc r = *d;
    if (r.kh <= 0) {
        r.kh = r.kw = d->k;
        r.stride_h = r.stride_w = d->stride;
        r.pad_h = r.pad_w = 0;
    }
    r.k = r.stride = 0;
    return r;
}

/* PyTorch's pooling_output_shape (dilation 1): in + 2*pad >= k. */
static inline int ps_pool_out_dim(int in, int k, int s, int pad, int ceil_mode) {
    int o = (in + 2 * pad - k + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (o - 1) * s >= in + pad) o--;   /* the last window starts in the padding on the right */
    return o;
}
static inline int ps_pool_out_h(const ps_pool_desc *d) {
    const ps_pool_desc r = ps_pool_resolve(d);
    return ps_pool_out_dim(r.h, r.kh, r.stride_h, r.pad_h, r.ceil_mode);
}
static inline int ps_pool_out_w(const ps_pool_desc *d) {
    const ps_pool_desc r = ps_pool_resolve(d);
    return ps_pool_out_dim(r.w, r.kw, r.stride_w, r.pad_w, r.ceil_mode);
}
/* Rows (or columns) ceil_mode adds past the padding on the bottom (right):
 * the last window's end beyond in + pad, at least 0. */
static inline int ps_pool_extra_dim(int in, int k, int s, int pad, int ceil_mode) {
    const int e = (ps_pool_out_dim(in, k, s, pad, ceil_mode) - 1) * s + k - in - 2 * pad;
    return e > 0 ? e : 0;
}
static inline int ps_pool_ceil_extra(const ps_pool_desc *d) {
    const ps_pool_desc r = ps_pool_resolve(d);
    return ps_pool_extra_dim(r.h, r.kh, r.stride_h, r.pad_h, r.ceil_mode) ||
           ps_pool_extra_dim(r.w, r.kw, r.stride_w, r.pad_w, r.ceil_mode);
}

/* Adaptive average pooling (nn.AdaptiveAvgPool2d to (oh, ow)) where the
 * bins are not one average pool's windows: output (i, j) of each plane
 * averages input rows [ps_adaptive_start(i, h, oh), ps_adaptive_end(i, h,
 * oh)) and the columns likewise - PyTorch's bins, uneven and overlapping
 * where oh does not divide h, each input row repeated where oh > h. Plain
 * layout: x (n, c, h, w), y (n, c, oh, ow). (Where oh divides h and ow
 * divides w the bins are average pooling's windows, kernel = stride =
 * h / oh, and the layer kind uses avgpool_forward.) */
typedef struct ps_adaptive_desc {
    int n, c, h, w, oh, ow;
} ps_adaptive_desc;

/* PyTorch's start_index / end_index: floor(i * in / out), ceil((i + 1) * in / out). */
static inline int ps_adaptive_start(int i, int in, int out) { return (int)((int64_t)i * in / out); }
static inline int ps_adaptive_end(int i, int in, int out) {
    return (int)((((int64_t)i + 1) * in + out - 1) / out);
}

/* ---- upsampling (Upsample / F.interpolate; ConvTranspose2d's bias) ----
 * Resizing each (h, w) plane of x (n, c, h, w) to (oh, ow), plain layout,
 * by PyTorch's rules (aten/src/ATen/native/UpSample.h), in float as its CPU
 * kernels compute them. scale_h / scale_w are the source-index scales:
 * align_corners (bilinear): (in - 1) / (out - 1), 0 for out 1; else 1 /
 * scale_factor where the caller gave one (and did not ask to recompute
 * it), in / out otherwise (ps_resize_scale). */
typedef struct ps_resize_desc {
    int n, c, h, w, oh, ow;
    int bilinear;               /* 0: 'nearest' (PyTorch's legacy nearest: floor), 1: 'bilinear' */
    int align_corners;          /* bilinear only */
    float scale_h, scale_w;
} ps_resize_desc;

/* compute_scales_value / area_pixel_compute_scale; scale_factor <= 0: none given. */
static inline float ps_resize_scale(int in, int out, double scale_factor, int align_corners) {
    if (align_corners) return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    return scale_factor > 0 ? (float)(1.0 / scale_factor) : (float)in / (float)out;
}

/* nearest_idx: the source index of output o. */
static inline int ps_resize_nearest(int o, int in, int out, float scale) {
    if (out == in) return o;
    if (out == 2 * in) return o >> 1;
    const float f = floorf((float)o * scale);
    return f < (float)(in - 1) ? (int)f : in - 1;
}

/* The two source indices of output o and the second's weight (the
 * first's is 1 - *l1): area_pixel_compute_source_index and
 * guard_index_and_lambda; out == in copies. */
static inline void ps_resize_linear(int o, int in, int out, float scale, int align_corners, int *i0, int *i1,
                                    float *l1) {
    if (out == in) { *i0 = *i1 = o; *l1 = 0.0f; return; }
    float src = align_corners ? scale * (float)o : scale * ((float)o + 0.5f) - 0.5f;
    if (src < 0.0f) src = 0.0f;
    int i = (int)floorf(src);
    if (i > in - 1) i = in - 1;
    float l = src - (float)i;
    *i0 = i;
    *i1 = i < in - 1 ? i + 1 : i;
    *l1 = l < 0.0f ? 0.0f : l > 1.0f ? 1.0f : l;
}

/* A per-channel view of an activation for batch normalisation and channel
 * masks: n samples, c channels, s elements per (sample, channel) - H*W for
 * (N, C, H, W), L for (N, C, L), 1 for (N, C). Element (i, j, p) of a plain
 * tensor is at (i*c + j)*s + p; a blocked one (layout PS_LAYOUT_BLOCKED,
 * only for 4-D activations with blocked_layout(c) > 0, s = H*W) follows
 * the formula at the top of this file. eps: batch normalisation only. */
/* An activation a batch norm applies to its own output v (a backend with
 * batchnorm_relu): y = v > 0 ? min(v, hi) : slope * v when on. */
typedef struct ps_bn_act {
    int on;        /* 0: none */
    float hi;      /* ReLU6 / Hardtanh(0, max): the cap; INFINITY: none (ReLU, LeakyReLU) */
    float slope;   /* LeakyReLU's negative_slope; 0 (ReLU, ReLU6) */
} ps_bn_act;

typedef struct ps_chan_desc {
    int n, c;
    int64_t s;
    int layout;
    float eps;
    ps_bn_act act;   /* batch normalisation only: an activation folded in (batchnorm_relu) */
} ps_chan_desc;

/* Layer normalisation (nn.LayerNorm): each of rows rows of cols contiguous
 * floats (cols = the product of normalized_shape, the trailing dims) is
 * normalised with its own mean and biased variance; gamma, beta have cols
 * elements. Plain layout only. */
typedef struct ps_ln_desc {
    int64_t rows, cols;
    float eps;
} ps_ln_desc;

/* Group normalisation (nn.GroupNorm; InstanceNorm1d/2d are groups = c): x
 * (n, c, s) in the plain layout, its c channels in `groups` groups of
 * c / groups; each (sample, group) row of (c / groups) * s values
 * normalised with its own mean and biased variance, then per channel
 * y = xhat * gamma[ch] + beta[ch] (gamma, beta c each; both NULL without
 * affine). mean and rstd hold n * groups values, the row (i, g) at
 * i * groups + g. */
typedef struct ps_gn_desc {
    int64_t n, c, s;
    int64_t groups;
    float eps;
} ps_gn_desc;

/* L2 normalisation over one dimension (F.normalize, p 2): x seen as (outer,
 * dim, inner) like ps_softmax_desc; each of the outer * inner vectors of
 * dim elements (stride inner) divided by max(its 2-norm, eps). */
typedef struct ps_l2norm_desc {
    int64_t outer;
    int dim;
    int64_t inner;
    float eps;
} ps_l2norm_desc;

/* Softmax over one dimension of a tensor seen as (outer, dim, inner):
 * element (o, k, i) at (o*dim + k)*inner + i; softmax over k. inner = 1 is
 * the last dimension (the row-wise softmax_forward); dim 1 of (N, C, H, W)
 * is outer N, dim C, inner H*W. log selects log-softmax. Plain layout. */
typedef struct ps_softmax_desc {
    int64_t outer;
    int dim;
    int64_t inner;
    int log;
} ps_softmax_desc;

/* A permutation of each sample's dimensions (torch.permute with the batch
 * fixed at dim 0): x holds n samples of ndim (1..PS_PERMUTE_MAX_DIMS)
 * dims[] each, plain row-major; y's per-sample dimension k is x's
 * dimension perm[k], so y (n, dims[perm[0]], ..., dims[perm[ndim-1]]) with
 *   y[i][j_0]...[j_{ndim-1}] = x[i][k_0]...[k_{ndim-1}], k_{perm[m]} = j_m.
 * The backward is the same op with the inverse permutation on y's dims
 * (ps_permute_inverse). Plain layout only. */
#define PS_PERMUTE_MAX_DIMS 4
typedef struct ps_permute_desc {
    int64_t n;
    int ndim;
    int64_t dims[PS_PERMUTE_MAX_DIMS];  /* x's per-sample dims */
    int perm[PS_PERMUTE_MAX_DIMS];      /* a permutation of 0..ndim-1 */
} ps_permute_desc;

/* The permutation back: y's dims, perm's inverse (dx from dy). */
static inline ps_permute_desc ps_permute_inverse(const ps_permute_desc *d) {
    ps_permute_desc r = *d;
    for (int k = 0; k < d->ndim; k++) {
        r.dims[k] = d->dims[d->perm[k]];
        r.perm[d->perm[k]] = k;
    }
    return r;
}

/* The permutation as strides: y's per-sample dims (odim) and, along each,
 * the step in x (ostr), so that y[o_0, ..., o_k] = x[sum o_j * ostr[j]]
 * within a sample. Returns the elements of a sample. */
static inline int64_t ps_permute_strides(const ps_permute_desc *d, int64_t odim[PS_PERMUTE_MAX_DIMS],
                                         int64_t ostr[PS_PERMUTE_MAX_DIMS]) {
    int64_t istr[PS_PERMUTE_MAX_DIMS], per = 1;
    for (int k = d->ndim - 1; k >= 0; k--) {
        istr[k] = per;
        per *= d->dims[k];
    }
    for (int k = 0; k < d->ndim; k++) {
        odim[k] = d->dims[d->perm[k]];
        ostr[k] = istr[d->perm[k]];
    }
    return per;
}

/* A batched matrix product (torch.matmul of two stacks of matrices with
 * the same batch dims): for each of batch pairs,
 *   c (m, n) = op(a) (m, k) . op(b) (k, n)
 * where op(a) is a as stored, (m, k), or with trans_a a stored (k, m)
 * transposed; op(b) likewise, b (k, n) or with trans_b (n, k). Matrix i
 * of a starts at a + i*m*k, of b at b + i*k*n, of c at c + i*m*n (dense,
 * plain row-major); c overlaps neither. The backward is two more of the
 * same op (ps_matmul_grad_a / ps_matmul_grad_b).
 * Broadcasting (MatMul's broadcast batch dims and parameter operand): with
 * bcast_a, a is one matrix read for every pair (stride 0), likewise
 * bcast_b; with accumulate, c += the products instead of c = (a broadcast
 * operand's gradient summed over the matrices it faced). Zero-initialised
 * fields keep the plain product. */
typedef struct ps_matmul_desc {
    int64_t batch;
    int m, n, k;
    int trans_a, trans_b;
    int bcast_a, bcast_b;       /* that operand's one matrix for every pair */
    int accumulate;             /* c += op(a) . op(b) */
} ps_matmul_desc;

/* d loss / d a = dc (m, n) . op(b)^T, or transposed (k, m) when trans_a:
 * op(b) . dc^T; computed as matmul(dc, b) or matmul(b, dc) with these
 * descriptors (the first operand is dc when *dc_first). */
static inline ps_matmul_desc ps_matmul_grad_a(const ps_matmul_desc *d, int *dc_first) {
    ps_matmul_desc r = {.batch = d->batch};
    if (!d->trans_a) {          /* da (m, k) = dc (m, n) . op(b)^T (n, k) */
        *dc_first = 1;
        r.m = d->m, r.n = d->k, r.k = d->n;
        r.trans_a = 0, r.trans_b = !d->trans_b;
    } else {                    /* da (k, m) = op(b) (k, n) . dc^T (n, m) */
        *dc_first = 0;
        r.m = d->k, r.n = d->m, r.k = d->n;
        r.trans_a = d->trans_b, r.trans_b = 1;
    }
    return r;
}
/* d loss / d b = op(a)^T . dc (k, n), or transposed (n, k) when trans_b:
 * dc^T . op(a); the first operand is dc when *dc_first. */
static inline ps_matmul_desc ps_matmul_grad_b(const ps_matmul_desc *d, int *dc_first) {
    ps_matmul_desc r = {.batch = d->batch};
    if (!d->trans_b) {          /* db (k, n) = op(a)^T (k, m) . dc (m, n) */
        *dc_first = 0;
        r.m = d->k, r.n = d->n, r.k = d->m;
        r.trans_a = !d->trans_a, r.trans_b = 0;
    } else {                    /* db (n, k) = dc^T (n, m) . op(a) (m, k) */
        *dc_first = 1;
        r.m = d->n, r.n = d->k, r.k = d->m;
        r.trans_a = 1, r.trans_b = d->trans_a;
    }
    return r;
}

/* A triangle of each of a batch of (rows, cols) matrices (tri_fill;
 * attention masks): element (i, j) is in it when j - i >= diagonal (upper:
 * the elements torch.triu(ones, diagonal) keeps) or j - i <= diagonal
 * (lower: torch.tril's). minGPT's causal mask fills the upper triangle
 * above the main diagonal (upper, diagonal 1) with -inf. */
typedef struct ps_tri_desc {
    int64_t batch;
    int64_t rows, cols;
    int upper;
    int64_t diagonal;
    float value;
} ps_tri_desc;

static inline int ps_tri_in(const ps_tri_desc *d, int64_t i, int64_t j) {
    return d->upper ? j - i >= d->diagonal : j - i <= d->diagonal;
}

/* Attention scores (batch, heads, rows, cols) and a key padding mask
 * (batch, cols): one value per sample and key, the same for every head and
 * query row (key_pad). */
typedef struct ps_keypad_desc {
    int64_t batch;
    int64_t heads, rows, cols;
    int additive;     /* 1: the mask is added (PyTorch's float form); 0: nonzero masks the key (-inf) */
} ps_keypad_desc;

/* One time step of a recurrent layer (rnn_cell_forward/backward), n rows
 * of H hidden units, PyTorch's gates:
 *   LSTM (G = 4, i f g o): i = sig(gx_i + gh_i), f = sig(..f), g = tanh(..g),
 *        o = sig(..o); c = f * c_prev + i * g; h = o * tanh(c)
 *   GRU (G = 3, r z n):    r = sig(gx_r + gh_r), z = sig(gx_z + gh_z),
 *        n = tanh(gx_n + r * gh_n); h = (1 - z) * n + z * h_prev
 * Row i's gate k is at [i*G*H + k*H, i*G*H + (k+1)*H). */
typedef struct ps_rnn_cell_desc {
    int gru;                    /* 0 LSTM, 1 GRU */
    int64_t n, H;
} ps_rnn_cell_desc;

/* Elementwise activations (act_forward / act_backward). alpha is
 * LeakyReLU's negative_slope and Hardtanh's min_val, beta Hardtanh's
 * max_val (min_val < max_val); the others ignore them. Formulas
 * (PyTorch's):
 *   RELU       max(x, 0)
 *   LEAKY_RELU x > 0 ? x : alpha * x
 *   GELU       x * 0.5 * (1 + erf(x / sqrt(2)))       (approximate='none')
 *   GELU_TANH  0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
 *   SILU       x * sigmoid(x)
 *   TANH       tanh(x)
 *   SIGMOID    1 / (1 + exp(-x))
 *   HARDTANH   min(max(x, alpha), beta); gradient 1 strictly inside
 *              (alpha, beta), else 0 (ReLU6 is alpha 0, beta 6)
 *   HARDSWISH  x * min(max(x + 3, 0), 6) / 6; gradient 0 below -3,
 *              x / 3 + 1/2 on [-3, 3], 1 above
 *   HARDSIGMOID min(max(x + 3, 0), 6) / 6; gradient 1/6 strictly inside
 *              (-3, 3), else 0
 * Elementwise math (users' own layers; alpha and beta as listed):
 *   ELU        x > 0 ? x : alpha * (exp(x) - 1)          (alpha: ELU's)
 *   SELU       1.0507009873554805 * ELU(x) with alpha 1.6732632423543772
 *   SOFTPLUS   alpha * x > beta ? x : log(1 + exp(alpha * x)) / alpha
 *              (alpha: softplus's beta, beta: its threshold; gradient 1
 *              above the threshold, else sigmoid(alpha * x))
 *   MISH       x * tanh(softplus(x))
 *   LOGSIGMOID log(sigmoid(x))
 *   EXP, LOG, ABS, SQRT  exp(x), log(x), |x| (gradient sign(x), 0 at 0),
 *              sqrt(x)
 *   POW        x ** alpha (gradient alpha * x ** (alpha - 1), 0 where
 *              alpha is 0)
 *   LINEAR     alpha * x + beta (AddConstant: 1, value); its backward
 *              reads neither x nor y (counted as y: it may run in place)
 * Shrinks and thresholds (alpha, beta as listed):
 *   CELU       x > 0 ? x : alpha * (exp(x / alpha) - 1)  (alpha: CELU's)
 *   SOFTSIGN   x / (1 + |x|)
 *   TANHSHRINK x - tanh(x)
 *   HARDSHRINK |x| > alpha ? x : 0 (gradient 1 there, else 0; alpha: lambd)
 *   SOFTSHRINK x > alpha ? x - alpha : x < -alpha ? x + alpha : 0 (gradient
 *              1 outside [-alpha, alpha], else 0; alpha: lambd)
 *   THRESHOLD  x > alpha ? x : beta (alpha: threshold, beta: value;
 *              gradient 1 above the threshold, else 0)
 * The backward of RELU, TANH, SIGMOID and HARDTANH reads y (the forward's
 * output; HARDTANH's y is strictly inside (alpha, beta) exactly when x is),
 * the others read x (the input): ps_act_backward_reads_x says which, so
 * the executor keeps the right one (and may run those forwards in place,
 * x == y, only when the backward reads y). */
typedef enum {
    PS_ACT_RELU = 0,
    PS_ACT_LEAKY_RELU,
    PS_ACT_GELU,
    PS_ACT_GELU_TANH,
    PS_ACT_SILU,
    PS_ACT_TANH,
    PS_ACT_SIGMOID,
    PS_ACT_HARDTANH,
    PS_ACT_HARDSWISH,
    PS_ACT_HARDSIGMOID,
    /* elementwise math */
    PS_ACT_ELU,
    PS_ACT_SELU,
    PS_ACT_SOFTPLUS,
    PS_ACT_MISH,
    PS_ACT_LOGSIGMOID,
    PS_ACT_EXP,
    PS_ACT_LOG,
    PS_ACT_ABS,
    PS_ACT_SQRT,
    PS_ACT_POW,
    PS_ACT_LINEAR,
    /* shrinks and thresholds */
    PS_ACT_CELU,
    PS_ACT_SOFTSIGN,
    PS_ACT_TANHSHRINK,
    PS_ACT_HARDSHRINK,
    PS_ACT_SOFTSHRINK,
    PS_ACT_THRESHOLD,
    /* more elementwise math (torch.log1p, expm1, sin, cos) and the
     * comparisons of a tensor with a number (alpha): 1 where x > alpha (GT),
     * x < alpha (LT), x >= alpha (GE), x <= alpha (LE), else 0 (NaN: 0),
     * whose gradient is zero (Where's condition) */
    PS_ACT_LOG1P,
    PS_ACT_EXPM1,
    PS_ACT_SIN,
    PS_ACT_COS,
    PS_ACT_GT,
    PS_ACT_LT,
    PS_ACT_GE,
    PS_ACT_LE,
    PS_ACT_ERF,         /* torch.erf (a GELU written by hand: 0.5 x (1 + erf(x / sqrt 2))) */
    PS_ACT_SIGN,        /* torch.sign: -1, 0 or 1 (NaN: 0); gradient zero, as PyTorch's */
    PS_ACT_COUNT
} ps_act_kind;

typedef struct ps_act_desc {
    int kind;                   /* a ps_act_kind */
    float alpha;                /* LEAKY_RELU's negative_slope, HARDTANH's min_val, ELU's alpha, SOFTPLUS's
                                   beta, POW's exponent, LINEAR's factor, CELU's alpha, the shrinks' lambd,
                                   THRESHOLD's threshold, the comparisons' number */
    float beta;                 /* HARDTANH's max_val, SOFTPLUS's threshold, LINEAR's term, THRESHOLD's value */
} ps_act_desc;

static inline int ps_act_backward_reads_x(int kind) {
    return kind != PS_ACT_RELU && kind != PS_ACT_TANH && kind != PS_ACT_SIGMOID && kind != PS_ACT_HARDTANH &&
           kind != PS_ACT_LINEAR;
}

/* Numpy broadcasting of two tensors (Add, Sub, Mul, Div of computed
 * tensors: x - x.mean(1, keepdim=True), x / x.norm(...), a (N, C, 1, 1)
 * gate): y = a op b with y's dims y[0..ndim-1] (dim 0 the batch, plain
 * row-major) and each operand's dims a[k], b[k] either y[k] or 1 (1:
 * that operand's one value read along dim k). The backward of operand
 * `which` (0: a, 1: b) writes its gradient, of its own dims, the sum over
 * the dims where it is 1 and y is not of
 *   which 0: add dy, sub dy,  mul dy * b, div dy / b
 *   which 1: add dy, sub -dy, mul dy * a, div -dy * a / b^2
 * and for max (torch.maximum) and min (torch.minimum) dy to the operand
 * that is larger (smaller), half of it to each where a == b, as
 * PyTorch's; y is NaN where either operand is.
 * (a and b are read only by mul, div, max and min (ps_binary_reads); add
 * and sub may pass NULL). */
#define PS_BCAST_MAX_DIMS 5
typedef enum {
    PS_BINARY_ADD, PS_BINARY_SUB, PS_BINARY_MUL, PS_BINARY_DIV,
    PS_BINARY_MAX, PS_BINARY_MIN        /* Maximum, Minimum */
} ps_binary_op;
typedef struct ps_bcast_desc {
    int op;                             /* a ps_binary_op */
    int ndim;                           /* 1..PS_BCAST_MAX_DIMS */
    int64_t y[PS_BCAST_MAX_DIMS], a[PS_BCAST_MAX_DIMS], b[PS_BCAST_MAX_DIMS];
} ps_bcast_desc;

/* The same broadcast with y's dims of 1 dropped and neighbouring dims
 * merged where neither operand changes from kept to broadcast (so a
 * (N, C, 1, 1) by (N, C, H, W) is (N*C, H*W) with a's stride 0 along the
 * second): nd dims (0: one element), each > 1, and along each the element
 * strides of y, a and b (0: broadcast). count: y's elements. */
typedef struct ps_bcast_geom {
    int nd;
    int64_t dims[PS_BCAST_MAX_DIMS], sy[PS_BCAST_MAX_DIMS], sa[PS_BCAST_MAX_DIMS], sb[PS_BCAST_MAX_DIMS];
    int64_t count;
} ps_bcast_geom;

static inline ps_bcast_geom ps_bcast_geometry(const ps_bcast_desc *d) {
    ps_bcast_geom g = {0};
    int ka[PS_BCAST_MAX_DIMS], kb[PS_BCAST_MAX_DIMS];
    for (int k = 0; k < d->ndim; k++) {
        if (d->y[k] == 1) continue;
        const int ia = d->a[k] != 1, ib = d->b[k] != 1;
        if (g.nd && ka[g.nd - 1] == ia && kb[g.nd - 1] == ib) {
            g.dims[g.nd - 1] *= d->y[k];
        } else {
            ka[g.nd] = ia;
            kb[g.nd] = ib;
            g.dims[g.nd++] = d->y[k];
        }
    }
    int64_t sy = 1, sa = 1, sb = 1;
    for (int k = g.nd - 1; k >= 0; k--) {
        g.sy[k] = sy;
        g.sa[k] = ka[k] ? sa : 0;
        g.sb[k] = kb[k] ? sb : 0;
        sy *= g.dims[k];
        if (ka[k]) sa *= g.dims[k];
        if (kb[k]) sb *= g.dims[k];
    }
    g.count = sy;
    return g;
}

/* One element of ps_bcast_desc's op and of its gradient term (before
 * the sum over the broadcast dims); a, b are read where ps_binary_reads. */
static inline int ps_binary_reads(int op) { return op != PS_BINARY_ADD && op != PS_BINARY_SUB; }

static inline float ps_binary_apply(int op, float a, float b) {
    if (op == PS_BINARY_MAX) return a > b || a != a ? a : b;   /* a NaN on either side: NaN */
    if (op == PS_BINARY_MIN) return a < b || a != a ? a : b;
    return op == PS_BINARY_ADD ? a + b : op == PS_BINARY_SUB ? a - b : op == PS_BINARY_MUL ? a * b : a / b;
}

/* max / min: dy to the winner, dy / 2 to each on a tie */
static inline double ps_binary_extreme_grad(int op, int which, double dy, double a, double b) {
    const double mine = which ? b : a, other = which ? a : b;
    if (mine == other) return dy / 2;
    return (op == PS_BINARY_MAX ? mine > other : mine < other) ? dy : 0.0;
}

static inline double ps_binary_grad(int op, int which, double dy, double a, double b) {
    if (op == PS_BINARY_ADD) return dy;
    if (op == PS_BINARY_SUB) return which ? -dy : dy;
    if (op == PS_BINARY_MUL) return which ? dy * a : dy * b;
    if (op == PS_BINARY_MAX || op == PS_BINARY_MIN) return ps_binary_extreme_grad(op, which, dy, a, b);
    return which ? -dy * a / (b * b) : dy / b;
}

/* Element j of operand `which`'s gradient (of its own kept elements):
 * the sum in double of ps_binary_grad over the red positions of the dims
 * where it is broadcast (sx: its strides in g, 0 where broadcast). The
 * plain loop every CPU backend's binary_bcast_backward runs per element. */
static inline double ps_bcast_grad_sum(const ps_bcast_geom *g, const int64_t *sx, int op, int which, int64_t j,
                                       int64_t red, const float *a, const float *b, const float *dy) {
    const int reads = ps_binary_reads(op);
    double s = 0;
    for (int64_t r = 0; r < red; r++) {
        int64_t rj = j, rr = r, oy = 0, oa = 0, ob = 0;
        for (int k = g->nd - 1; k >= 0; k--) {
            int64_t *rest = sx[k] ? &rj : &rr;
            const int64_t i = *rest % g->dims[k];
            *rest /= g->dims[k];
            oy += i * g->sy[k];
            oa += i * g->sa[k];
            ob += i * g->sb[k];
        }
        s += ps_binary_grad(op, which, dy[oy], reads ? a[oa] : 0, reads ? b[ob] : 0);
    }
    return s;
}

/* Fully connected: y (n, out) = x (n, in) . w (out, in)^T + b (out). */
typedef struct ps_linear_desc {
    int n, in, out;
} ps_linear_desc;

/* SGD hyper-parameters with PyTorch's torch.optim.SGD semantics
 * (dampening 0, no Nesterov):
 *   g' = g + weight_decay * w
 *   buf = momentum ? (first step ? g' : momentum*buf + g') : -
 *   w  -= lr * (momentum ? buf : g')
 * The caller zero-fills buf and passes first_step=1 on the first update. */
typedef struct ps_sgd_desc {
    float lr, momentum, weight_decay;
    int first_step;
} ps_sgd_desc;

/* Adam hyper-parameters and the step number, with PyTorch 1.13's
 * torch.optim.Adam semantics (_single_tensor_adam; amsgrad and maximize off,
 * weight decay added to the gradient - Adam, not AdamW). step is the
 * parameter's update count INCLUDING this update (1 on the first), as
 * PyTorch's state['step'] after its increment. Per element, in float:
 *   g' = weight_decay ? g + weight_decay * w : g
 *   m  = beta1 * m + (1 - beta1) * g'
 *   v  = beta2 * v + (1 - beta2) * g' * g'
 *   w += -step_size * (m / (sqrt(v) / bc2_sqrt + eps))
 * with, in double as Python computes them, then rounded to float:
 *   step_size = lr / (1 - beta1^step), bc2_sqrt = sqrt(1 - beta2^step).
 * The caller zero-fills m and v before step 1.
 *
 * The row-sparse variant (adam_update_rows) is torch.optim.SparseAdam: only
 * the given rows change (weight_decay must be 0; SparseAdam has none):
 *   m += (1 - beta1) * (g - m_old)            (per touched element)
 *   v += (1 - beta2) * (g * g - v_old)
 *   w += -step_size_sp * (m / (sqrt(v) + eps))
 * with step_size_sp = lr * sqrt(1 - beta2^step) / (1 - beta1^step) (double,
 * then float) - note eps is not scaled as in dense Adam. */
typedef struct ps_adam_desc {
    double lr, beta1, beta2, eps, weight_decay; /* double, as the Python floats */
    int64_t step;
} ps_adam_desc;

/* The float scalars every backend uses for an Adam update (see above). */
typedef struct ps_adam_scalars {
    float one_minus_beta1, one_minus_beta2;
    float beta1, beta2, eps, weight_decay; /* the desc's, rounded to float */
    float step_size;      /* dense: lr / bc1 */
    float bc2_sqrt;       /* dense: sqrt(bc2) */
    float step_size_sp;   /* sparse: lr * sqrt(bc2) / bc1 */
} ps_adam_scalars;

/* Computes them in double as Python does (bc = 1 - beta ** step), then
 * rounds each to float, as PyTorch does when a Python scalar meets a float32
 * tensor. d->step >= 1. */
ps_adam_scalars ps_adam_scalars_of(const ps_adam_desc *d);

/* A cumulative sum (torch.cumsum, ONNX's CumSum) along the middle axis
 * of an (outer, len, inner) view: y[o, i, k] = the sum of x[o, j, k] over
 * j <= i (reverse: j >= i; exclusive: the element itself left out, j < i
 * or j > i; the first element of a line then 0). The backward is the same
 * op with reverse flipped (exclusive kept). */
typedef struct ps_cumsum_desc {
    int64_t outer, len, inner;
    int reverse, exclusive;
} ps_cumsum_desc;

/* im2col and col2im (F.unfold and F.fold): n images of (c, h, w) and
 * their columns (c kh kw, oh ow), column row (ci kh + i) kw + j, column
 * p ow + q reading image pixel (p sh - ph + i dh, q sw - pw + j dw) (0 when
 * outside the image). im2col writes every column element; col2im writes
 * every image element, the sum of the column elements reading it (0 for
 * pixels no window reads): each is the other's adjoint, so Unfold's
 * backward is col2im of dy and Fold's is im2col. oh, ow >= 1. */
typedef struct ps_im2col_desc {
    int64_t n, c, h, w;
    int64_t kh, kw, sh, sw, ph, pw, dh, dw;
    int64_t oh, ow;
} ps_im2col_desc;
/* ---- spatial transformers (AffineGrid, GridSample: F.affine_grid,
 * F.grid_sample; aten/src/ATen/native/AffineGridGenerator.cpp and
 * GridSampler.h, PyTorch 1.13) ----
 * affine_grid: theta (n, 2, 3) -> grid (n, h, w, 2), grid[i, y, x] =
 * theta[i] @ (bx[x], by[y], 1), bx / by PyTorch's base coordinates
 * (ps_affgrid_base). grid_sample: x (n, c, h, w) read at grid (n, oh, ow,
 * 2) (x then y, in [-1, 1] across the input) -> y (n, c, oh, ow). Plain
 * layout. The source-index helpers below compute in float as PyTorch's
 * CPU kernels do, and give the derivative of the index with respect to
 * the grid value (the chain of unnormalise, clip and reflect). */
typedef struct ps_affgrid_desc {
    int n, h, w;
    int align_corners;
} ps_affgrid_desc;

enum { PS_GS_BILINEAR = 0, PS_GS_NEAREST = 1 };                        /* ps_gridsample_desc.mode */
enum { PS_GS_ZEROS = 0, PS_GS_BORDER = 1, PS_GS_REFLECTION = 2 };      /* ps_gridsample_desc.padding */

typedef struct ps_gridsample_desc {
    int n, c, h, w, oh, ow;
    int mode;                   /* PS_GS_BILINEAR, PS_GS_NEAREST */
    int padding;                /* PS_GS_ZEROS, PS_GS_BORDER, PS_GS_REFLECTION */
    int align_corners;
} ps_gridsample_desc;

/* linspace_from_neg_one: coordinate k of size points, linspace(-1, 1,
 * size) (at::linspace's two halves), times (size - 1) / size without
 * align_corners; 0 for one point. */
static inline float ps_affgrid_base(int k, int size, int align_corners) {
    if (size <= 1) return 0.0f;
    const float step = 2.0f / (float)(size - 1);
    float v = k < size / 2 ? -1.0f + step * (float)k : 1.0f - step * (float)(size - 1 - k);
    if (!align_corners) v = v * (float)(size - 1) / (float)size;
    return v;
}

/* clip_coordinates_set_grad: borders count as outside (gradient 0 there). */
static inline float ps_gs_clip(float in, int size, float *g) {
    if (in <= 0.0f) { *g = 0.0f; return 0.0f; }
    const float max = (float)(size - 1);
    if (in >= max) { *g = 0.0f; return max; }
    *g = 1.0f;
    return in;
}

/* reflect_coordinates_set_grad over [twice_low / 2, twice_high / 2]. */
static inline float ps_gs_reflect(float in, int twice_low, int twice_high, float *g) {
    if (twice_low == twice_high) { *g = 0.0f; return 0.0f; }
    const float min = (float)twice_low / 2.0f, span = (float)(twice_high - twice_low) / 2.0f;
    float mult = 1.0f;
    in = in - min;
    if (in < 0.0f) { mult = -1.0f; in = -in; }
    const float extra = fmodf(in, span);
    const int flips = (int)floorf(in / span);
    if (flips % 2 == 0) { *g = mult; return extra + min; }
    *g = -mult;
    return span - extra + min;
}

/* grid_sampler_compute_source_index_set_grad: the input coordinate of grid
 * value coord along an axis of size points, and d index / d coord. */
static inline float ps_gs_source(float coord, int size, int padding, int align_corners, float *g) {
    float gc, gr;
    if (align_corners) {
        *g = (float)(size - 1) / 2.0f;
        coord = (coord + 1.0f) / 2.0f * (float)(size - 1);
    } else {
        *g = (float)size / 2.0f;
        coord = ((coord + 1.0f) * (float)size - 1.0f) / 2.0f;
    }
    if (padding == PS_GS_BORDER) {
        coord = ps_gs_clip(coord, size, &gc);
        *g *= gc;
    } else if (padding == PS_GS_REFLECTION) {
        coord = align_corners ? ps_gs_reflect(coord, 0, 2 * (size - 1), &gr)
                              : ps_gs_reflect(coord, -1, 2 * size - 1, &gr);
        coord = ps_gs_clip(coord, size, &gc);
        *g *= gr * gc;
    }
    return coord;
}

/* floor (nearest: round half to even, nearbyint) of a source coordinate
 * as an index, held to [-2, size + 1] (a NaN to -2): every tap outside the
 * input is then out of bounds without an overflowing conversion. */
static inline int ps_gs_index(float v, int size, int nearest) {
    if (!(v > -2.0f)) return -2;
    if (!(v < (float)size + 1.0f)) return size + 1;
    return (int)(nearest ? nearbyintf(v) : floorf(v));
}

/* memory_stats' answer (bytes). */
typedef struct ps_backend_memory {
    uint64_t used;           /* held from the device's pool: in use plus cached (not included: cuDNN's
                                workspaces and the libraries' own handles) */
    uint64_t cached;         /* of used, freed blocks kept for the next request (PS_CUDA_CACHE_MB) */
    uint64_t device_free, device_total;   /* the whole device, every process */
} ps_backend_memory;

typedef struct ps_backend_ops {
    const char *name;
    /* NULL for backends computing in host memory (CPU); otherwise the device
     * family, e.g. "cuda": pointers are device memory that only the op
     * table's copy functions may touch, and the backend is labelled
     * "<name>/<device_kind>:<index>". */
    const char *device_kind;

    /* Create the backend's private state. device is the device index
     * (ignored by CPU backends); nthreads the compute threads (0 = default). */
    ps_status (*init)(void **impl, int device, int nthreads, ps_err *err);
    void (*destroy)(void *impl);

    /* Memory on the backend's device. alloc returns 64-byte aligned memory
     * or NULL. copy_* move bytes between host and this device. */
    void *(*alloc)(void *impl, size_t bytes);
    void (*free)(void *impl, void *p);
    ps_status (*copy_to_device)(void *impl, void *dst, const void *host_src, size_t bytes, ps_err *err);
    ps_status (*copy_to_host)(void *impl, void *host_dst, const void *src, size_t bytes, ps_err *err);
    /* Optional (NULL for CPU backends): copy bytes from src, memory of
     * another instance of the same backend (src_impl, possibly on another
     * device), to dst on this backend's device - a stage boundary between
     * two devices, without a trip through pageable host memory. */
    ps_status (*copy_from_peer)(void *impl, void *dst, void *src_impl, const void *src, size_t bytes,
                                ps_err *err);
    /* Optional (NULL: the caller copies x to the host and sums there, as
     * CPU backends need no op). *out = the sum of x[i]^2 over n floats of
     * this device's memory, in double (ps_sum_squares' contract, summed in
     * another order): a gradient's norm and finiteness without moving it
     * off the device. */
    ps_status (*sum_squares)(void *impl, const float *x, int64_t n, double *out, ps_err *err);
    /* Optional (NULL: every op's work is complete when it returns). From
     * async_begin to the matching async_end (one thread; pairs nest), the
     * ops this thread calls on this backend may return before their work
     * is done: they run in call order on one queue of the thread's, and a
     * buffer freed in between is released at async_end, which waits for
     * all of it and reports any failure (e.g. a kernel's). A copy from the
     * host returns once it has read the host's bytes (its caller may reuse
     * them), a copy_from_peer between two runs of this thread on one device
     * is ordered on their queues; copies to the host and sum_squares
     * complete before returning. Between the two, no buffer written may be handed to
     * another thread, nor the weights released to writers: the executor
     * opens a run per model call and ends it before its locks go. */
    void (*async_begin)(void *impl);
    ps_status (*async_end)(void *impl, ps_err *err);
    /* Optional (NULL for CPU backends): what this backend holds of its
     * device's memory, and the device's free and total (every process's). */
    ps_status (*memory_stats)(void *impl, struct ps_backend_memory *out, ps_err *err);

    /* x (n,cin,h,w), w (cout,cin/groups,kh,kw), b (cout; NULL: no bias)
     * -> y (n,cout,oh,ow); either form of ps_conv_desc. */
    ps_status (*conv2d_forward)(void *impl, const ps_conv_desc *d, const float *x,
                                const float *w, const float *b, float *y, ps_err *err);
    /* From dy (n,cout,oh,ow): dx, dw, db, each may be NULL: not computed
     * (db NULL: no bias; dw NULL: a combined backward's input gradients
     * only, exec_group.c). */
    ps_status (*conv2d_backward)(void *impl, const ps_conv_desc *d, const float *x,
                                 const float *w, const float *dy, float *dx, float *dw,
                                 float *db, ps_err *err);
    /* A combined backward's weight and bias gradients part by part
     * (exec_group.c, ps_layer_parts): of d->n images, part p is the cnt[p]
     * images from off[p]; dw[p] (and db[p] when db is not NULL) from that
     * part's images alone - what conv2d_backward gives for them - in one
     * call. NULL: not offered (Conv2d's backward calls conv2d_backward part
     * by part). */
    ps_status (*conv2d_wgrad_parts)(void *impl, const ps_conv_desc *d, const float *x, const float *dy,
                                    int k, const int *off, const int *cnt, float *const *dw,
                                    float *const *db, ps_err *err);

    /* y = max(x, 0) elementwise over count elements (x == y allowed). */
    ps_status (*relu_forward)(void *impl, int64_t count, const float *x, float *y, ps_err *err);
    /* dx = dy where y > 0 else 0; y is relu's output (dx == dy allowed). */
    ps_status (*relu_backward)(void *impl, int64_t count, const float *y, const float *dy,
                               float *dx, ps_err *err);

    /* Bytes of workspace maxpool_forward needs to remember argmax positions
     * for maxpool_backward (opaque, backend-specific). */
    size_t (*maxpool_workspace_size)(void *impl, const ps_pool_desc *d);
    ps_status (*maxpool_forward)(void *impl, const ps_pool_desc *d, const float *x, float *y,
                                 void *workspace, ps_err *err);
    /* dx (n,c,h,w) from dy (n,c,oh,ow) and the forward's workspace. Ties go
     * to the first maximum in row-major window order, as in PyTorch. The
     * max-pool ops take either form of ps_pool_desc (padding included). */
    ps_status (*maxpool_backward)(void *impl, const ps_pool_desc *d, const void *workspace,
                                  const float *dy, float *dx, ps_err *err);

    /* x (n,in), w (out,in), b (out) -> y (n,out). */
    ps_status (*linear_forward)(void *impl, const ps_linear_desc *d, const float *x,
                                const float *w, const float *b, float *y, ps_err *err);

    /* ---- appended for issue 9 (models beyond MNIST). Optional: a layer
     * kind whose op a backend lacks is refused at model creation, naming
     * the stage, the kind and the backend. ---- */

    /* Row-wise softmax of x (rows, cols). */
    ps_status (*softmax_forward)(void *impl, int64_t rows, int cols, const float *x, float *y,
                                 ps_err *err);
    /* dx = y * (dy - sum_row(dy * y)), y the forward's output. */
    ps_status (*softmax_backward)(void *impl, int64_t rows, int cols, const float *y,
                                  const float *dy, float *dx, ps_err *err);
    /* y (n, dim) = w[ids[i]] row by row; ids (n) int64 on the device, each
     * already checked to lie in 0..rows of w. */
    ps_status (*embedding_forward)(void *impl, int64_t n, int dim, const int64_t *ids,
                                   const float *w, float *y, ps_err *err);
    /* Row-sparse weight gradient: grows (nrows, dim) = 0, then
     * grows[slot[i]] += dy[i] for i < n (slot: device int64, each in
     * 0..nrows-1; the caller maps ids to slots of the unique rows). */
    ps_status (*embedding_backward)(void *impl, int64_t n, int dim, const int64_t *slot,
                                    const float *dy, int64_t nrows, float *grows, ps_err *err);
    /* x *= s elementwise (averaging accumulated gradients). */
    ps_status (*scale)(void *impl, int64_t count, float *x, float s, ps_err *err);
    /* dx (n,in), dw (out,in), db (out) from dy (n,out); each may be NULL:
     * not computed. */
    ps_status (*linear_backward)(void *impl, const ps_linear_desc *d, const float *x,
                                 const float *w, const float *dy, float *dx, float *dw,
                                 float *db, ps_err *err);

    /* Row-wise log-softmax of x (rows, cols). */
    ps_status (*log_softmax_forward)(void *impl, int rows, int cols, const float *x, float *y,
                                     ps_err *err);
    /* dx = dy - exp(y) * sum_row(dy), y the forward's output. */
    ps_status (*log_softmax_backward)(void *impl, int rows, int cols, const float *y,
                                      const float *dy, float *dx, ps_err *err);

    /* y = x * mask elementwise; mask holds 0 or 1/(1-p) (inverted dropout).
     * Used for dropout's forward and backward (x == y allowed). */
    ps_status (*mul)(void *impl, int64_t count, const float *x, const float *mask, float *y,
                     ps_err *err);

    /* One SGD update of count parameters (see ps_sgd_desc): the updated
     * weights of w go to w_out, which is w itself (in place) or a buffer
     * not overlapping it (snapshot steps write the next version of the
     * weights into a spare copy this way, with no copy first); w is then
     * only read. buf may be NULL when momentum is 0. */
    ps_status (*sgd_update)(void *impl, int64_t count, float *w_out, const float *w, const float *g, float *buf,
                            const ps_sgd_desc *s, ps_err *err);

    /* dst += src elementwise (accumulating gradients of batched requests). */
    ps_status (*add)(void *impl, int64_t count, float *dst, const float *src, ps_err *err);

    /* Optional (NULL: plain layouts only). Block size B of the blocked
     * layout the backend offers for 4-D activations with c channels, or 0
     * when it offers none for c (then only plain is used). */
    int (*blocked_layout)(void *impl, int c);
    /* Copy an (n, c, h, w) activation from src_layout to dst_layout
     * (src != dst). Required when blocked_layout is set. */
    ps_status (*reorder)(void *impl, int n, int c, int h, int w, const float *src, int src_layout,
                         float *dst, int dst_layout, ps_err *err);

    /* Optional (NULL: init's nthreads only). Compute threads for the ops
     * the calling thread runs from now on (n >= 1), overriding init's
     * nthreads for that thread: the model executor sizes each call by how
     * many calls compute at once (see model.h). */
    void (*set_threads)(void *impl, int n);

    /* ---- optimizers (see common/nn/optim.h for the module that calls them) ---- */

    /* One Adam update of count parameters (see ps_adam_desc) from w into
     * w_out, as sgd_update (w_out == w: in place); m and v are the
     * exp_avg and exp_avg_sq buffers (count floats each), updated in place. */
    ps_status (*adam_update)(void *impl, int64_t count, float *w_out, const float *w, const float *g, float *m,
                             float *v, const ps_adam_desc *d, ps_err *err);
    /* Row-sparse updates of a (total_rows, width) parameter w: rows holds
     * nrows distinct row indices in [0, total_rows) (int64, device memory;
     * the caller validates them) and g_rows the (nrows, width) gradient rows
     * in that order. Rows not listed are not touched, nor is their state.
     * sgd_update_rows: w[r] -= lr * g (plain SGD; identical to the dense
     * update with zero gradient elsewhere). adam_update_rows:
     * torch.optim.SparseAdam (see ps_adam_desc; d->weight_decay is ignored,
     * the caller refuses it). */
    ps_status (*sgd_update_rows)(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                 const float *g_rows, float lr, ps_err *err);
    ps_status (*adam_update_rows)(void *impl, int64_t nrows, int64_t width, const int64_t *rows, float *w,
                                  const float *g_rows, float *m, float *v, const ps_adam_desc *d,
                                  ps_err *err);

    /* ---- appended for issue 18 (models as files: the layer kinds PyTorch
     * users reach for). All three backends implement all of them; a
     * backend may leave one NULL, and the model then refuses the kind on
     * it. Shapes are validated by the caller, as above. ---- */

    /* Average pooling (either form of ps_pool_desc, count_include_pad as
     * documented there): y (n,c,oh,ow) from x; dx (n,c,h,w) from dy. */
    ps_status (*avgpool_forward)(void *impl, const ps_pool_desc *d, const float *x, float *y, ps_err *err);
    ps_status (*avgpool_backward)(void *impl, const ps_pool_desc *d, const float *dy, float *dx, ps_err *err);

    /* Batch normalisation (nn.BatchNorm2d over N,H,W per channel; BatchNorm1d
     * over N or N,L), d->eps. gamma, beta (c) are both NULL when
     * affine=False (then gamma = 1, beta = 0).
     * Training forward, with batch statistics over the m = n*s elements
     * of each channel:
     *   mean = sum(x)/m, var = sum((x - mean)^2)/m          (biased)
     *   y = (x - mean) * invstd * gamma + beta,  invstd = 1/sqrt(var + eps)
     * writes y and, per channel, mean and invstd (both required: the
     * backward's inputs, PyTorch's save_mean/save_invstd) and, when
     * var_unbiased is not NULL, var * m/(m-1): what PyTorch folds into
     * running_var (running_var = (1-momentum)*running_var + momentum *
     * var_unbiased; running_mean likewise with mean) - the folding is the
     * caller's. m >= 2 (PyTorch refuses training with one value per
     * channel; so does the caller). */
    ps_status (*batchnorm_forward_training)(void *impl, const ps_chan_desc *d, const float *x,
                                            const float *gamma, const float *beta, float *y, float *mean,
                                            float *invstd, float *var_unbiased, ps_err *err);
    /* Eval forward from the running statistics (c each):
     *   y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta
     * and, when invstd is not NULL, invstd = 1/sqrt(running_var + eps) per
     * channel (for batchnorm_backward in eval mode). */
    ps_status (*batchnorm_forward_inference)(void *impl, const ps_chan_desc *d, const float *x,
                                             const float *gamma, const float *beta, const float *running_mean,
                                             const float *running_var, float *y, float *invstd, ps_err *err);
    /* Backward from dy, x and the statistics the forward used: mean and
     * invstd from the training forward (batch_stats = 1), or running_mean
     * and the inference forward's invstd (batch_stats = 0; the statistics
     * are then constants). With xhat = (x - mean) * invstd, per channel:
     *   dbeta = sum(dy), dgamma = sum(dy * xhat)
     *   dx = gamma * invstd * (dy - dbeta/m - xhat * dgamma/m)  (batch_stats)
     *   dx = gamma * invstd * dy                                (otherwise)
     * dx, dgamma, dbeta may each be NULL (not computed; dgamma and dbeta
     * are NULL without affine, and gamma and beta are then NULL; beta is
     * read only with d->act.on). */
    ps_status (*batchnorm_backward)(void *impl, const ps_chan_desc *d, int batch_stats, const float *x,
                                    const float *dy, const float *gamma, const float *beta, const float *mean,
                                    const float *invstd, float *dx, float *dgamma, float *dbeta, ps_err *err);
    /* 1: the three batch-norm ops above take d->act.on = 1 (the executor sets
     * it where a ReLU, ReLU6, Hardtanh(0, max) or LeakyReLU alone reads the
     * output, server/nn/exec.c): both forwards write act(y) (ps_chan_desc;
     * NaN stays NaN), and the backward's dy is d loss / d act(y), taken
     * through act's gradient at y (PyTorch's: 1 above 0 and below a cap, 0
     * at or above it, the slope at or below 0) before the formulas above -
     * y recomputed from x as the training forward computed it, so the mask
     * is the forward's exactly. 0: d->act.on is always 0. */
    int batchnorm_relu;

    /* Layer normalisation (see ps_ln_desc); gamma, beta (cols) both NULL
     * without elementwise_affine. Per row: mean, biased var, rstd =
     * 1/sqrt(var + eps), y = (x - mean) * rstd * gamma + beta; mean and
     * rstd (rows each) are written when not NULL (the backward needs them). */
    ps_status (*layernorm_forward)(void *impl, const ps_ln_desc *d, const float *x, const float *gamma,
                                   const float *beta, float *y, float *mean, float *rstd, ps_err *err);
    /* With xhat = (x - mean) * rstd and g = dy * gamma, per row:
     *   dx = rstd * (g - mean_row(g) - xhat * mean_row(g * xhat))
     * and over all rows dgamma = sum(dy * xhat), dbeta = sum(dy). dx,
     * dgamma, dbeta may each be NULL. */
    ps_status (*layernorm_backward)(void *impl, const ps_ln_desc *d, const float *x, const float *dy,
                                    const float *gamma, const float *mean, const float *rstd, float *dx,
                                    float *dgamma, float *dbeta, ps_err *err);

    /* Elementwise activation of count elements (see ps_act_desc); x == y
     * allowed. */
    ps_status (*act_forward)(void *impl, const ps_act_desc *d, int64_t count, const float *x, float *y,
                             ps_err *err);
    /* dx = dy * f'(x); reads x or y as ps_act_backward_reads_x says (the
     * other may be NULL); dx == dy allowed. */
    ps_status (*act_backward)(void *impl, const ps_act_desc *d, int64_t count, const float *x, const float *y,
                              const float *dy, float *dx, ps_err *err);

    /* Softmax / log-softmax over one dimension (see ps_softmax_desc).
     * Backward from the forward's output y:
     *   softmax:     dx = y * (dy - sum_k(dy * y))
     *   log-softmax: dx = dy - exp(y) * sum_k(dy) */
    ps_status (*softmax_dim_forward)(void *impl, const ps_softmax_desc *d, const float *x, float *y,
                                     ps_err *err);
    ps_status (*softmax_dim_backward)(void *impl, const ps_softmax_desc *d, const float *y, const float *dy,
                                      float *dx, ps_err *err);

    /* y = x * mask[sample, channel] broadcast over the s elements of each
     * (sample, channel) (see ps_chan_desc; either layout): nn.Dropout2d's
     * forward and backward with a (n, c) mask of 0 or 1/(1-p). x == y
     * allowed. */
    ps_status (*mul_channels)(void *impl, const ps_chan_desc *d, const float *x, const float *mask, float *y,
                              ps_err *err);

    /* Strided copy of rows x cols floats: dst[r*dst_ld + j] = src[r*src_ld
     * + j] (accumulate = 0) or += (accumulate = 1); rows, cols >= 0, lds
     * >= cols, the two regions do not overlap. Concat along dim d of a
     * plain tensor: rows = the product of the dims before d, cols = the
     * part's dims from d on, dst_ld = the output's (and the backward's
     * split is the same copy the other way). Along the channels of a
     * blocked 4-D activation this holds too when every part's channel
     * count is a multiple of the block (part i's block of sample n is
     * then contiguous: cols = c_i*H*W, dst_ld = C*H*W). */
    ps_status (*copy2d)(void *impl, int64_t rows, int64_t cols, const float *src, int64_t src_ld, float *dst,
                        int64_t dst_ld, int accumulate, ps_err *err);
    /* y = a + b elementwise (the residual add's forward; y may be a or b). */
    ps_status (*add_out)(void *impl, int64_t count, const float *a, const float *b, float *y, ps_err *err);
    /* x[i] = value for i < count (zeroing gradient buffers on the device). */
    ps_status (*fill)(void *impl, int64_t count, float *x, float value, ps_err *err);

    /* ---- appended for AdaptiveAvgPool2d to any size (vgg, alexnet) ---- */

    /* Adaptive average pooling with PyTorch's bins (ps_adaptive_desc; plain
     * layout): y (n,c,oh,ow) from x; dx (n,c,h,w) from dy, each input
     * element the sum of dy / bin area over the bins that hold it. */
    ps_status (*adaptive_avgpool_forward)(void *impl, const ps_adaptive_desc *d, const float *x, float *y,
                                          ps_err *err);
    ps_status (*adaptive_avgpool_backward)(void *impl, const ps_adaptive_desc *d, const float *dy, float *dx,
                                           ps_err *err);

    /* ---- appended for convnext: y = x with each sample's dims permuted
     * (ps_permute_desc; plain layout, x and y do not overlap). ---- */
    ps_status (*permute)(void *impl, const ps_permute_desc *d, const float *x, float *y, ps_err *err);

    /* ---- appended for attention (MatMul: q @ k.transpose(-2, -1), att @ v;
     * MultiheadAttention): the batched product of ps_matmul_desc, c written. ---- */
    ps_status (*matmul)(void *impl, const ps_matmul_desc *d, const float *a, const float *b, float *c, ps_err *err);

    /* ---- appended for attention masks (MaskedFill, MultiheadAttention's
     * causal): y = x but the elements of ps_tri_desc's triangle of each
     * matrix, which are d->value (-inf for a mask before a softmax; 0 for
     * the gradient's backward through it); y may be x. ---- */
    ps_status (*tri_fill)(void *impl, const ps_tri_desc *d, const float *x, float *y, ps_err *err);

    /* ---- appended for key padding masks computed from the token ids
     * (Eq, MultiheadAttention's key_padding_mask): ---- */
    /* y[i] = x[i] == value ? 1 : 0 for i < count; x int64 (token ids), y
     * float32; both device memory. */
    ps_status (*eq_const)(void *impl, int64_t count, const int64_t *x, int64_t value, float *y, ps_err *err);
    /* The scores s of ps_keypad_desc, mask (batch, cols) of each sample's
     * keys: s[b, h, i, j] += mask[b, j] (additive), else s[b, h, i, j] =
     * -inf where mask[b, j] != 0 (PyTorch's bool key_padding_mask). */
    ps_status (*key_pad)(void *impl, const ps_keypad_desc *d, const float *mask, float *s, ps_err *err);

    /* ---- appended for upsampling (Upsample, ConvTranspose2d; decoders, U-Nets) ---- */
    /* y (n,c,oh,ow) = x (n,c,h,w) resized (ps_resize_desc); dx (n,c,h,w)
     * = the resize's adjoint of dy: each output's gradient added to the
     * input elements it read, with their weights (dx overwritten). */
    ps_status (*resize_forward)(void *impl, const ps_resize_desc *d, const float *x, float *y, ps_err *err);
    ps_status (*resize_backward)(void *impl, const ps_resize_desc *d, const float *dy, float *dx, ps_err *err);
    /* Per channel of a plain (n, c, s) tensor (ps_chan_desc, layout plain):
     * y[i, j, p] += b[j] (bias_add), db[j] = sum over i, p of dy[i, j, p]
     * (bias_grad, overwritten) - ConvTranspose2d's bias. */
    ps_status (*bias_add)(void *impl, const ps_chan_desc *d, const float *b, float *y, ps_err *err);
    ps_status (*bias_grad)(void *impl, const ps_chan_desc *d, const float *dy, float *db, ps_err *err);
    /* Group normalisation (see ps_gn_desc): mean and rstd written when not
     * NULL (the backward needs them). The backward, with xhat = (x - mean)
     * * rstd and g = dy * gamma[ch], per row: dx = rstd * (g - mean_row(g)
     * - xhat * mean_row(g * xhat)); per channel dgamma = sum(dy * xhat),
     * dbeta = sum(dy) over the samples and s. dx, dgamma, dbeta may each be
     * NULL. */
    ps_status (*groupnorm_forward)(void *impl, const ps_gn_desc *d, const float *x, const float *gamma,
                                   const float *beta, float *y, float *mean, float *rstd, ps_err *err);
    ps_status (*groupnorm_backward)(void *impl, const ps_gn_desc *d, const float *x, const float *dy,
                                    const float *gamma, const float *mean, const float *rstd, float *dx,
                                    float *dgamma, float *dbeta, ps_err *err);

    /* L2 normalisation (see ps_l2norm_desc): y = x / max(|x|, eps) per
     * vector. The backward from x: with n = |x| and y as above, dx = (dy -
     * y * sum(dy * y)) / n where n >= eps (PyTorch's clamp_min passes its
     * gradient at equality), else dy / eps. */
    ps_status (*l2norm_forward)(void *impl, const ps_l2norm_desc *d, const float *x, float *y, ps_err *err);
    ps_status (*l2norm_backward)(void *impl, const ps_l2norm_desc *d, const float *x, const float *dy, float *dx,
                                 ps_err *err);
    /* ---- appended for recurrent layers run by psd (LSTM, GRU): one time
     * step's gate arithmetic (ps_rnn_cell_desc); the layer kind does the
     * GEMMs with linear_forward / linear_backward. ---- */
    /* From gx = W_ih x_t + b_ih and gh = W_hh h_{t-1} + b_hh (n, G*H each,
     * gates in PyTorch's order): h (n, H), c (n, H; LSTM, else unused) and
     * act (n, 4H), what rnn_cell_backward reads: LSTM i, f, g, o
     * (activated), GRU r, z, n (activated) and gh's n part. h_prev, c_prev:
     * the previous step's (zeros at t = 0). */
    ps_status (*rnn_cell_forward)(void *impl, const ps_rnn_cell_desc *d, const float *gx, const float *gh,
                                  const float *h_prev, const float *c_prev, float *h, float *c, float *act,
                                  ps_err *err);
    /* From dh = d loss / d h_t (n, H) and, LSTM, dc (n, H) = d loss / d c_t
     * through c_{t+1} (overwritten with d loss / d c_{t-1}): the gradients
     * of the step's pre-activations, dgx (n, G*H; for gx, b_ih) and dgh
     * (for gh, b_hh; LSTM: the same values, dgh may be dgx), and dh_prev
     * (n, H), the part of d loss / d h_{t-1} that does not go through W_hh
     * (GRU dh * z, LSTM 0); written. */
    ps_status (*rnn_cell_backward)(void *impl, const ps_rnn_cell_desc *d, const float *act, const float *h_prev,
                                   const float *c_prev, const float *c, const float *dh, float *dc, float *dgx,
                                   float *dgh, float *dh_prev, ps_err *err);
    /* ---- appended for PReLU (nn.PReLU): over an activation of d->n
     * samples of d->c channels of d->s values each, one slope w[k] per
     * channel k: y = x > 0 ? x : w[k] * x. d->layout is PS_LAYOUT_PLAIN
     * unless d->c is 1 (one slope for every element: any layout). ---- */
    ps_status (*prelu_forward)(void *impl, const ps_chan_desc *d, const float *x, const float *w, float *y,
                               ps_err *err);
    /* dx = x > 0 ? dy : w[k] * dy; dw[k] = the sum over the samples and
     * values of channel k of (x > 0 ? 0 : x * dy). dx or dw may be NULL
     * (not computed); both are overwritten. */
    ps_status (*prelu_backward)(void *impl, const ps_chan_desc *d, const float *x, const float *w, const float *dy,
                                float *dx, float *dw, ps_err *err);

    /* ---- appended for numpy broadcasting of computed tensors (Add, Sub,
     * Mul, Div; ps_bcast_desc): y = a op b, and one operand's gradient
     * summed over the dims it was broadcast along (written, never
     * accumulated; y and dx overlap nothing). ---- */
    ps_status (*binary_bcast)(void *impl, const ps_bcast_desc *d, const float *a, const float *b, float *y,
                              ps_err *err);
    ps_status (*binary_bcast_backward)(void *impl, const ps_bcast_desc *d, int which, const float *a,
                                       const float *b, const float *dy, float *dx, ps_err *err);

    /* ---- appended for torch.where (Where): y = cond != 0 ? a : b over
     * count elements of one shape; a NULL a (b) reads the number av (bv)
     * instead. The backward writes da = cond != 0 ? dy : 0 and db = cond
     * != 0 ? 0 : dy (either NULL: not computed); none to cond. ---- */
    ps_status (*where)(void *impl, int64_t count, const float *cond, const float *a, float av, const float *b,
                       float bv, float *y, ps_err *err);
    ps_status (*where_backward)(void *impl, int64_t count, const float *cond, const float *dy, float *da,
                                float *db, ps_err *err);

    /* ---- appended for torch.cumsum (CumSum; ps_cumsum_desc): y written,
     * each line summed in double and rounded once; y overlaps nothing. ---- */
    ps_status (*cumsum)(void *impl, const ps_cumsum_desc *d, const float *x, float *y, ps_err *err);

    /* ---- appended for F.unfold / F.fold (Unfold, Fold; ps_im2col_desc):
     * col (x) written whole; the two overlap nothing. ---- */
    ps_status (*im2col)(void *impl, const ps_im2col_desc *d, const float *x, float *col, ps_err *err);
    ps_status (*col2im)(void *impl, const ps_im2col_desc *d, const float *col, float *x, ps_err *err);

    /* ---- appended for spatial transformers (AffineGrid, GridSample; the
     * STN tutorial). ---- */
    /* grid (n, h, w, 2) = theta (n, 2, 3) applied to the base coordinates
     * (ps_affgrid_desc); the backward writes dtheta (n, 2, 3) from dgrid. */
    ps_status (*affine_grid)(void *impl, const ps_affgrid_desc *d, const float *theta, float *grid, ps_err *err);
    ps_status (*affine_grid_backward)(void *impl, const ps_affgrid_desc *d, const float *dgrid, float *dtheta,
                                      ps_err *err);
    /* y (n, c, oh, ow) = x (n, c, h, w) sampled at grid (n, oh, ow, 2)
     * (ps_gridsample_desc: PyTorch's grid_sampler_2d; corners outside the
     * input read 0 with zeros padding). The backward writes dx (each
     * output's gradient added to the input elements it read, with their
     * weights) and dgrid (the output's derivative along x and y, summed
     * over the channels, times the source index's d index / d grid; zero
     * for nearest); either may be NULL (not computed). */
    ps_status (*grid_sample)(void *impl, const ps_gridsample_desc *d, const float *x, const float *grid, float *y,
                             ps_err *err);
    ps_status (*grid_sample_backward)(void *impl, const ps_gridsample_desc *d, const float *x, const float *grid,
                                      const float *dy, float *dx, float *dgrid, ps_err *err);
} ps_backend_ops;

/* A created backend: the op table plus its private state. */
typedef struct ps_backend {
    const ps_backend_ops *ops;
    void *impl;
    int device;      /* device index, 0 for CPU backends */
    char label[32];  /* e.g. "dnnl/cpu", "ref/cpu", "cuda/cuda:1" */
} ps_backend;

/* Names of the backends compiled in, NULL-terminated (e.g. {"ref","dnnl",NULL}). */
const char *const *ps_backend_names(void);
/* The backends that compute in host memory (device_kind NULL): "ref",
 * "dnnl"; NULL-terminated, in registry order (model.backend). */
const char *const *ps_backend_cpu_names(void);

/* Create a backend by name; unknown names give PS_ERR_NOT_FOUND listing the
 * known ones. ps_backend_free(NULL) is a no-op. */
ps_backend *ps_backend_create(const char *name, int device, int nthreads, ps_err *err);
void ps_backend_free(ps_backend *b);

/* One line saying which device support this binary carries, e.g.
 * "CUDA: not built" or "CUDA: built (runtime 13.0, cuDNN 9.19.0)" (for
 * `psd --version`). Does not initialise any device. */
void ps_backend_build_info(char *buf, size_t size);

/* The instruction set the CPU backend's kernels run on in this process:
 * oneDNN's effective ISA, lower case ("avx512_core_bf16", "avx2", "sse41",
 * ...; ONEDNN_MAX_CPU_ISA in the environment can only lower it), "unknown"
 * when oneDNN does not say. Freezes oneDNN's ISA choice. */
const char *ps_backend_cpu_isa(void);

/* How many of b's primitives so far were created with a reference (plain
 * C) kernel where the backend's allow-list forbids one (convolution, inner
 * product, pooling and eltwise may not; see kKindInfo in backend_dnnl.c).
 * Their descriptions, one per line, go into buf (may be NULL). Always 0
 * for backends without such a check (ref, cuda). */
int ps_backend_fallbacks(const ps_backend *b, char *buf, size_t size);

/* Frees the buffers the CPU backends keep for reuse (the dnnl backend's
 * buffer pool, up to 256 MB), so that malloc_trim can hand their pages back
 * to the OS; the next calls allocate afresh. Any thread, any time: buffers
 * in use are not touched. psd calls it when contexts expire and when it
 * goes idle. */
void ps_backend_trim(void);

/* Convenience wrappers over ops->alloc/free. */
float *ps_backend_alloc_floats(ps_backend *b, int64_t count);
void ps_backend_release(ps_backend *b, void *p);

#endif
