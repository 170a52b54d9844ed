#!/usr/bin/python3
"""Write tests/golden/kinds.safetensors: every layer kind of model files
(common/nn/layers.c), over its attribute combinations, and a small DAG,
computed by PyTorch autograd. tests/test_kinds.c runs the same model files
through psd's executor (ref and dnnl backends) and compares.

    /usr/bin/python3 scripts/gen_golden_kinds.py [output file]

Each case is a model file (YAML, the format of docs/models.md) with one
stage. This script builds the PyTorch twin of the file node by node (each
node the torch.nn module of its kind, in file order, the Dropout nodes
multiplying by stored masks) and runs, in training mode:

    y1 = net(x1); y1.backward(go1)          -> out1, grad_input, grad.<P>
    y2 = net(x2); y2.backward(go2)          (cases with BatchNorm: a second
                                             forward whose statistics fold)
    torch.optim.SGD(lr=0.1).step()          -> final.<P>, buf.<B> (buffers)
    net.eval(); ye = net(xe)                -> eval_out

Stored per case C (tensor names "C.<what>"): x1, go1, x2, go2, xe, out1,
grad_input (float inputs), init.<P> and initbuf.<B> (the weights and
buffers before; BatchNorm's are perturbed from PyTorch's ones/zeros so the
affine gradients and the fold are tested; rpb_rect's relative_position_index
reversed, so psd must gather by the buffer it loads), ownbuf.<B> (int64
buffers but BatchNorm's count as the module builds them: psd's own
initial values), grad.<P>, final.<P>, buf.<B>,
eval_out, and masks "C.mask<k>.<f>" (dropout node k in file order, forward
f = 1, 2): bernoulli(1-p)/(1-p), shaped like the node's input (Dropout),
(N, C) (Dropout2d), (N) or (1) (StochasticDepth 'row' or 'batch': the
noise torchvision.ops.stochastic_depth drew, recorded as it ran), (N, H,
L, L) (MultiheadAttention's attention weights; every one is a dropout
node, its mask all ones at dropout 0).
Metadata: "cases" (comma-separated), "C.yaml" (the model file), "C.n"
(batch), "C.forwards" (1 or 2).

Randomness: torch.manual_seed(1000 + case index) before each case.
"""
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision.models.swin_transformer as swin
import torchvision.ops
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import read_safetensors, write_safetensors  # noqa: E402

LR = 0.1
N = 3


def stage(shape, nodes, dtype="float32"):
    return ("name: k\nmax_batch: 64\nstages:\n  - name: s\n    input: {shape: %s, dtype: %s}\n    nodes:\n%s"
            % (json.dumps(shape), dtype, "".join("      - %s\n" % n for n in nodes)))


CASES = [
    ("conv_pad", stage([4, 7, 7], ["{name: c, kind: Conv2d, out_channels: 6, kernel_size: 3, padding: 1}"])),
    ("conv_stride_nobias", stage([4, 7, 7], ["{name: c, kind: Conv2d, out_channels: 5, kernel_size: 3, stride: 2, "
                                              "bias: false}"])),
    ("conv_rect_dil", stage([4, 9, 8], ["{name: c, kind: Conv2d, out_channels: 6, kernel_size: [3, 2], "
                                         "stride: [2, 1], padding: [1, 0], dilation: [2, 1]}"])),
    ("conv_groups", stage([4, 6, 6], ["{name: c, kind: Conv2d, out_channels: 6, kernel_size: 3, groups: 2, "
                                       "padding: 1}"])),
    ("conv_depthwise", stage([16, 6, 6], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, groups: 16, "
                                           "padding: 1, bias: false}"])),
    ("linear", stage([5], ["{name: l, kind: Linear, out_features: 4}"])),
    ("linear_nobias_2d", stage([3, 5], ["{name: l, kind: Linear, in_features: 5, out_features: 4, bias: false}"])),
    ("bn2d", stage([4, 5, 5], ["{name: bn, kind: BatchNorm2d}"])),
    ("bn2d_blocked", stage([16, 4, 4], ["{name: bn, kind: BatchNorm2d, momentum: 0.3, eps: 0.001}"])),
    ("bn2d_noaffine_cumulative", stage([4, 3, 3], ["{name: bn, kind: BatchNorm2d, affine: false, momentum: null}"])),
    ("bn2d_untracked", stage([4, 3, 3], ["{name: bn, kind: BatchNorm2d, track_running_stats: false}"])),
    ("bn1d", stage([6], ["{name: bn, kind: BatchNorm1d, num_features: 6}"])),
    ("bn1d_len", stage([4, 5], ["{name: bn, kind: BatchNorm1d}"])),
    ("layernorm", stage([3, 6], ["{name: ln, kind: LayerNorm, normalized_shape: 6}"])),
    ("layernorm_2d_noaffine", stage([2, 3, 4], ["{name: ln, kind: LayerNorm, normalized_shape: [3, 4], "
                                                 "elementwise_affine: false, eps: 0.001}"])),
    ("maxpool", stage([3, 6, 6], ["{name: p, kind: MaxPool2d, kernel_size: 2}"])),
    ("maxpool_pad", stage([3, 7, 7], ["{name: p, kind: MaxPool2d, kernel_size: 3, stride: 2, padding: 1}"])),
    ("maxpool_rect", stage([16, 6, 5], ["{name: p, kind: MaxPool2d, kernel_size: [3, 2], stride: [1, 2], "
                                         "padding: [1, 0]}"])),
    ("avgpool", stage([3, 6, 6], ["{name: p, kind: AvgPool2d, kernel_size: 2}"])),
    ("avgpool_pad_incl", stage([16, 7, 7], ["{name: p, kind: AvgPool2d, kernel_size: 3, stride: 2, padding: 1}"])),
    ("avgpool_pad_excl", stage([3, 7, 6], ["{name: p, kind: AvgPool2d, kernel_size: [3, 2], stride: 2, "
                                            "padding: 1, count_include_pad: false}"])),
    ("adaptive", stage([5, 4, 3], ["{name: p, kind: AdaptiveAvgPool2d, output_size: 1}"])),
    # the 1-d kinds (Conv1d, pools over (N, C, L)): time series, audio, text CNNs
    ("conv1d_pad", stage([4, 12], ["{name: c, kind: Conv1d, out_channels: 6, kernel_size: 3, padding: 1}"])),
    ("conv1d_stride_dil_groups", stage([4, 15], ["{name: c, kind: Conv1d, in_channels: 4, out_channels: 6, "
                                                  "kernel_size: 3, stride: 2, dilation: 2, groups: 2, bias: false}"])),
    ("conv1d_depthwise", stage([8, 10], ["{name: c, kind: Conv1d, out_channels: 8, kernel_size: 5, padding: 2, "
                                          "groups: 8}"])),
    ("maxpool1d_pad", stage([3, 11], ["{name: p, kind: MaxPool1d, kernel_size: 3, stride: 2, padding: 1}"])),
    ("maxpool1d_ceil", stage([3, 10], ["{name: p, kind: MaxPool1d, kernel_size: 3, ceil_mode: true}"])),
    ("avgpool1d", stage([3, 10], ["{name: p, kind: AvgPool1d, kernel_size: 2}"])),
    ("avgpool1d_pad_excl", stage([3, 9], ["{name: p, kind: AvgPool1d, kernel_size: 3, stride: 2, padding: 1, "
                                           "count_include_pad: false, ceil_mode: true}"])),
    ("adaptive1d", stage([5, 12], ["{name: p, kind: AdaptiveAvgPool1d, output_size: 1}"])),
    ("adaptive1d_uneven", stage([5, 10], ["{name: p, kind: AdaptiveAvgPool1d, output_size: 3}"])),
    ("conv1d_net", stage([3, 20], [
        "{name: c1, kind: Conv1d, out_channels: 8, kernel_size: 5, padding: 2}",
        "{name: bn, kind: BatchNorm1d}",
        "{name: r, kind: ReLU}",
        "{name: p, kind: MaxPool1d, kernel_size: 2}",
        "{name: c2, kind: Conv1d, out_channels: 16, kernel_size: 3}",
        "{name: g, kind: AdaptiveAvgPool1d, output_size: 1}",
        "{name: f, kind: Flatten}",
        "{name: fc, kind: Linear, out_features: 4}"])),
    ("embedding", stage([4], ["{name: e, kind: Embedding, num_embeddings: 7, embedding_dim: 3}"], "int64")),
    # padding_idx (its row gets no gradient; the batch holds that id): positive and from the end
    ("embedding_pad", stage([6], ["{name: e, kind: Embedding, num_embeddings: 7, embedding_dim: 3, padding_idx: 2}"],
                            "int64")),
    ("embedding_pad_neg", stage([6], ["{name: e, kind: Embedding, num_embeddings: 7, embedding_dim: 3, "
                                      "padding_idx: -1}"], "int64")),
    ("relu", stage([2, 3, 4], ["{name: a, kind: ReLU}"])),
    ("leaky_relu", stage([2, 3, 4], ["{name: a, kind: LeakyReLU, negative_slope: 0.2}"])),
    ("gelu", stage([7], ["{name: a, kind: GELU}"])),
    ("gelu_tanh", stage([7], ["{name: a, kind: GELU, approximate: tanh}"])),
    ("silu", stage([7], ["{name: a, kind: SiLU}"])),
    ("tanh", stage([7], ["{name: a, kind: Tanh}"])),
    ("sigmoid", stage([7], ["{name: a, kind: Sigmoid}"])),
    ("softmax_last", stage([2, 5], ["{name: a, kind: Softmax, dim: -1}"])),
    ("softmax_channels", stage([4, 2, 3], ["{name: a, kind: Softmax, dim: 1}"])),
    ("log_softmax_last", stage([6], ["{name: a, kind: LogSoftmax, dim: 1}"])),
    ("log_softmax_mid", stage([3, 4, 2], ["{name: a, kind: LogSoftmax, dim: 2}"])),
    ("dropout", stage([2, 5], ["{name: l, kind: Linear, out_features: 4}", "{name: d, kind: Dropout, p: 0.3}"])),
    ("dropout2d", stage([4, 3, 3], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
                                     "{name: d, kind: Dropout2d, p: 0.4}"])),
    ("flatten_reshape", stage([2, 3, 4], ["{name: f, kind: Flatten, start_dim: 2}",
                                           "{name: r, kind: Reshape, shape: [-1, 6]}",
                                           "{name: l, kind: Linear, out_features: 2}"])),
    ("add", stage([6], ["{name: a, kind: Linear, out_features: 6, input: input}",
                        "{name: s, kind: Add, inputs: [a, input, a]}"])),
    ("concat_channels", stage([16, 3, 3], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1, input: input}",
                                            "{name: j, kind: Concat, inputs: [c, input], dim: 1}"])),
    ("concat_width", stage([2, 3, 2], ["{name: a, kind: Tanh, input: input}",
                                        "{name: j, kind: Concat, inputs: [input, a, input], dim: -1}"])),
    # a DAG: fan-out, a residual Add of three, Concat, pools, BatchNorm, on 16 channels (blocked layouts)
    ("dag", stage([3, 6, 6], [
        "{name: stem, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1, bias: false}",
        "{name: bn, kind: BatchNorm2d}",
        "{name: relu, kind: ReLU}",
        "{name: b1, kind: Conv2d, out_channels: 16, kernel_size: 1, input: relu}",
        "{name: b2, kind: MaxPool2d, kernel_size: 3, stride: 1, padding: 1, input: relu}",
        "{name: sum, kind: Add, inputs: [b1, b2, relu]}",
        "{name: act, kind: SiLU}",
        "{name: cat, kind: Concat, inputs: [act, relu], dim: 1}",
        "{name: drop, kind: Dropout2d, p: 0.25}",
        "{name: pool, kind: AvgPool2d, kernel_size: 2}",
        "{name: gap, kind: AdaptiveAvgPool2d, output_size: 1}",
        "{name: flat, kind: Flatten}",
        "{name: fc, kind: Linear, out_features: 5}",
        "{name: out, kind: LogSoftmax, dim: 1}"])),
    # the kinds ONNX import adds (issue 19): a learned tensor broadcast into an Add and a Concat, and
    # index_select with a repeated index (its gradient adds)
    ("parameter_add", stage([3, 4], ["{name: p, kind: Parameter, input: input, shape: [4], expand: [3, 4]}",
                                     "{name: a, kind: Add, inputs: [input, p]}"])),
    ("parameter_concat", stage([2, 3], ["{name: t, kind: Tanh, input: input}",
                                        "{name: p, kind: Parameter, input: input, shape: [2, 1], expand: [2, 2]}",
                                        "{name: j, kind: Concat, inputs: [t, p], dim: 2}"])),
    ("index_select", stage([5, 3], ["{name: s, kind: IndexSelect, dim: 1, index: [4, 0, 4]}"])),
    ("index_select_last", stage([2, 3, 4], ["{name: s, kind: IndexSelect, dim: -1, index: [2, 1]}"])),
    # the hard activations (mobilenet_v2/v3); their inputs scaled (SCALE) to cross every kink
    ("hardtanh", stage([2, 3, 4], ["{name: a, kind: Hardtanh, min_val: -0.5, max_val: 2.0}"])),
    ("hardtanh_default", stage([7], ["{name: a, kind: Hardtanh}"])),
    ("relu6", stage([2, 3, 4], ["{name: a, kind: ReLU6}"])),
    ("hardswish", stage([2, 3, 4], ["{name: a, kind: Hardswish}"])),
    ("hardsigmoid", stage([2, 3, 4], ["{name: a, kind: Hardsigmoid}"])),
    # on 16 channels (dnnl's blocked layout), in place where psd may, fanned out into an Add
    ("hard_blocked", stage([3, 5, 5], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: r6, kind: ReLU6}",
        "{name: hs, kind: Hardswish, input: c}",
        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: sg, kind: Hardsigmoid}",
        "{name: ht, kind: Hardtanh, min_val: 0.2, max_val: 0.7}",
        "{name: sum, kind: Add, inputs: [ht, r6, hs]}"])),
    # Mul: one shape; squeeze-and-excitation's (C, 1, 1) by (C, H, W), either order, after blocked convolutions;
    # a (3, 1) by (3, 4)
    ("mul_same", stage([2, 3], ["{name: t, kind: Tanh}", "{name: m, kind: Mul, inputs: [input, t]}"])),
    ("mul_se", stage([16, 4, 4], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: p, kind: AdaptiveAvgPool2d, output_size: 1}",
        "{name: f, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: g, kind: Hardsigmoid}",
        "{name: m, kind: Mul, inputs: [g, c]}",
        "{name: m2, kind: Mul, inputs: [m, g]}"])),
    ("mul_rows", stage([3, 4], ["{name: l, kind: Linear, out_features: 1}",
                                "{name: m, kind: Mul, inputs: [input, l]}"])),
    # ceil_mode (squeezenet, googlenet): the last window reaching past the input (and past its padding: the
    # average's divisor counts only the padded input), the last window dropped where it would start in the
    # right padding (5 + 1 with stride 2: 3 outputs, not 4), after blocked convolutions (oneDNN's right padding;
    # the include-padding average computes in the plain layout)
    ("maxpool_ceil", stage([3, 6, 5], ["{name: p, kind: MaxPool2d, kernel_size: 3, stride: 2, ceil_mode: true}"])),
    ("maxpool_ceil_drop", stage([3, 5, 5], ["{name: p, kind: MaxPool2d, kernel_size: 2, stride: 2, padding: 1, "
                                             "ceil_mode: true}"])),
    ("maxpool_ceil_blocked", stage([16, 8, 8], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: p, kind: MaxPool2d, kernel_size: 3, stride: 2, padding: 1, ceil_mode: true}",
        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    ("avgpool_ceil", stage([3, 6, 6], ["{name: p, kind: AvgPool2d, kernel_size: 3, stride: 2, ceil_mode: true}"])),
    ("avgpool_ceil_excl", stage([3, 6, 5], ["{name: p, kind: AvgPool2d, kernel_size: [3, 2], stride: 2, "
                                             "padding: [1, 0], count_include_pad: false, ceil_mode: true}"])),
    ("avgpool_ceil_blocked", stage([16, 8, 8], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: p, kind: AvgPool2d, kernel_size: 3, stride: 2, padding: 1, ceil_mode: true}",
        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    ("avgpool_ceil_excl_blocked", stage([16, 8, 8], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: p, kind: AvgPool2d, kernel_size: 3, stride: 2, padding: 1, count_include_pad: false, "
        "ceil_mode: true}",
        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    # AdaptiveAvgPool2d to any size, PyTorch's bins: shrinking with uneven overlapping bins (7 -> 3, 5 -> 2),
    # growing (vgg's 2x2 -> 7x7, alexnet's 1x1 -> 6x6), identity, a null entry (that side kept), uniform bins
    # (an average pool, blocked on dnnl) and uneven ones between blocked convolutions (plain, reordered)
    ("adaptive_uneven", stage([3, 7, 5], ["{name: p, kind: AdaptiveAvgPool2d, output_size: [3, 2]}"])),
    ("adaptive_grow", stage([4, 2, 3], ["{name: p, kind: AdaptiveAvgPool2d, output_size: [7, 5]}"])),
    ("adaptive_one_to_six", stage([5, 1, 1], ["{name: p, kind: AdaptiveAvgPool2d, output_size: 6}"])),
    ("adaptive_identity", stage([3, 4, 5], ["{name: p, kind: AdaptiveAvgPool2d, output_size: [4, 5]}"])),
    ("adaptive_null", stage([3, 4, 5], ["{name: p, kind: AdaptiveAvgPool2d, output_size: [null, 3]}"])),
    ("adaptive_uniform_blocked", stage([3, 6, 4], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: p, kind: AdaptiveAvgPool2d, output_size: [3, 2]}",
        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    ("adaptive_uneven_blocked", stage([3, 5, 5], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: p, kind: AdaptiveAvgPool2d, output_size: 7}",
        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 3}",
        "{name: q, kind: AdaptiveAvgPool2d, output_size: [2, 3]}"])),
    # StochasticDepth (torchvision.ops.stochastic_depth, its own draws recorded as the masks): per sample on
    # a residual branch of blocked convolutions, once per batch, and p 1 (every sample dropped)
    ("stochastic_depth_row", stage([16, 3, 3], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: sd, kind: StochasticDepth, p: 0.5, mode: row}",
        "{name: sum, kind: Add, inputs: [sd, input]}"])),
    ("stochastic_depth_batch", stage([5], ["{name: l, kind: Linear, out_features: 4}",
                                           "{name: sd, kind: StochasticDepth, p: 0.3, mode: batch}"])),
    ("stochastic_depth_all", stage([2, 3], ["{name: t, kind: Tanh}",
                                            "{name: sd, kind: StochasticDepth, p: 1.0, mode: row}"])),
    # Permute (convnext, swin): each sample's dims reordered (PyTorch's dims, the batch kept; negative ones),
    # over 1 to 4 dims per sample
    ("permute_2d", stage([3, 5], ["{name: p, kind: Permute, dims: [0, -1, 1]}"])),
    ("permute_1d", stage([5], ["{name: p, kind: Permute, dims: [0, 1]}"])),
    ("permute_4d", stage([2, 3, 4, 5], ["{name: p, kind: Permute, dims: [0, 3, 1, 4, 2]}"])),
    # Scale: a learned tensor multiplied in, numpy's broadcast: (C,) over (H, W, C); (1, 1, 3, 1) over
    # (N, 2, 3, 4) (a leading 1 facing the batch; outer and inner runs both)
    ("scale_last", stage([2, 3, 4], ["{name: s, kind: Scale, shape: [4]}"])),
    ("scale_mid", stage([2, 3, 4], ["{name: s, kind: Scale, shape: [1, 1, 3, 1], parameter: gamma}"])),
    # convnext's CNBlock on 16 channels (blocked layouts around the plain Permute): depthwise 7x7,
    # Permute([0, 2, 3, 1]), LayerNorm over C, Linear to 4C and back on the last dim, GELU, Permute([0, 3, 1, 2]),
    # the layer scale (C, 1, 1) under its state_dict name 'features.1.0.layer_scale', the residual Add; then
    # LayerNorm2d's permute, LayerNorm and permute back before a strided convolution (its downsampling)
    ("cnblock", stage([16, 5, 5], [
        "{name: features.1.0.block.0, kind: Conv2d, out_channels: 16, kernel_size: 7, padding: 3, groups: 16}",
        "{name: features.1.0.block.1, kind: Permute, dims: [0, 2, 3, 1]}",
        "{name: features.1.0.block.2, kind: LayerNorm, normalized_shape: 16, eps: 1.0e-6}",
        "{name: features.1.0.block.3, kind: Linear, out_features: 64}",
        "{name: features.1.0.block.4, kind: GELU}",
        "{name: features.1.0.block.5, kind: Linear, out_features: 16}",
        "{name: features.1.0.block.6, kind: Permute, dims: [0, 3, 1, 2]}",
        "{name: features.1.0, kind: Scale, shape: [16, 1, 1], parameter: layer_scale}",
        "{name: features.1.0.add, kind: Add, inputs: [features.1.0, input]}",
        "{name: features.2.0.permute, kind: Permute, dims: [0, 2, 3, 1]}",
        "{name: features.2.0, kind: LayerNorm, normalized_shape: 16, eps: 1.0e-6}",
        "{name: features.2.0.permute_1, kind: Permute, dims: [0, 3, 1, 2]}",
        "{name: features.2.1, kind: Conv2d, out_channels: 16, kernel_size: 2, stride: 2}"])),
    # many inputs (densenet joins up to 49): 30 of three values, plain (the stage input among them: the
    # blocked ones reordered, one reorder per input); 30 of blocked values into 480 blocked channels, the way a
    # dense block feeds BatchNorm and a convolution; 64 (the most a node takes) along the width; an Add of 20
    ("concat_30", stage([16, 3, 3], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1, input: input}",
        "{name: t, kind: ReLU}",
        "{name: j, kind: Concat, inputs: [%s]}" % ", ".join(["input", "c", "t"] * 10),
        "{name: o, kind: Conv2d, out_channels: 8, kernel_size: 1}"])),
    ("concat_30_blocked", stage([3, 4, 4], [
        "{name: a, kind: Conv2d, out_channels: 16, kernel_size: 1, input: input}",
        "{name: b, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1, input: input}",
        "{name: t, kind: Tanh, input: a}",
        "{name: j, kind: Concat, inputs: [%s], dim: 1}" % ", ".join(["a", "b", "t"] * 10),
        "{name: bn, kind: BatchNorm2d}",
        "{name: o, kind: Conv2d, out_channels: 4, kernel_size: 1}"])),
    ("concat_64_width", stage([2, 3, 1], [
        "{name: t, kind: Tanh, input: input}",
        "{name: j, kind: Concat, inputs: [%s], dim: -1}" % ", ".join(["input", "t"] * 32),
        "{name: l, kind: Linear, out_features: 3}"])),
    ("add_20", stage([5], ["{name: a, kind: Linear, out_features: 5, input: input}",
                           "{name: s, kind: Add, inputs: [%s]}" % ", ".join(["a", "input"] * 10)])),
    # shufflenet_v2's pieces: nn.ChannelShuffle (one copy per channel: 6 channels, 3 samples x 3 groups; one per
    # sample and group: 16 channels after a blocked convolution), x.narrow / x.chunk, and its unit: chunk, a
    # convolution of the second half, cat, shuffle
    ("channel_shuffle", stage([6, 2, 3], ["{name: s, kind: ChannelShuffle, groups: 3}"])),
    ("channel_shuffle_blocked", stage([3, 4, 4], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: s, kind: ChannelShuffle, groups: 2}",
        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    ("narrow_last", stage([2, 5], ["{name: n, kind: Narrow, dim: -1, start: 1, length: 3}"])),
    ("shuffle_unit", stage([16, 3, 3], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: a, kind: Narrow, start: 0, length: 8, input: c}",
        "{name: b, kind: Narrow, dim: 1, start: 8, length: 8, input: c}",
        "{name: bc, kind: Conv2d, out_channels: 8, kernel_size: 3, padding: 1}",
        "{name: j, kind: Concat, inputs: [a, bc]}",
        "{name: s, kind: ChannelShuffle, groups: 2}"])),
    # vit's pieces: nn.MultiheadAttention as self-attention (1, 2 and 4 heads, with and without bias, attention
    # dropout with stored masks, a sequence of one, batches of 1, 3 and 5); the class token (1, 1, E) under its
    # top-level name, prepended along the sequence; the positional embedding added; token 0 taken
    ("mha_h1", stage([5, 8], ["{name: a, kind: MultiheadAttention, embed_dim: 8, num_heads: 1, batch_first: true}"])),
    ("mha_h2_nobias", stage([4, 8], ["{name: a, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, bias: false, "
                                     "batch_first: true}"])),
    ("mha_h4_n1", stage([6, 16], ["{name: a, kind: MultiheadAttention, embed_dim: 16, num_heads: 4, "
                                  "batch_first: true}"])),
    ("mha_h2_dropout_n5", stage([5, 8], ["{name: a, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
                                         "dropout: 0.25, batch_first: true}"])),
    ("mha_len1", stage([1, 6], ["{name: a, kind: MultiheadAttention, embed_dim: 6, num_heads: 2, batch_first: true}"])),
    ("vit_block", stage([4, 8], [
        "{name: class_token, kind: Parameter, shape: [1, 1, 8], expand: [1, 8], parameter: null}",
        "{name: cat, kind: Concat, inputs: [class_token, input], dim: 1}",
        "{name: encoder, kind: Parameter, shape: [1, 5, 8], expand: [5, 8], parameter: pos_embedding}",
        "{name: encoder.add, kind: Add, inputs: [cat, encoder]}",
        "{name: encoder.layers.encoder_layer_0.ln_1, kind: LayerNorm, normalized_shape: 8, eps: 1.0e-6}",
        "{name: encoder.layers.encoder_layer_0.self_attention, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
        "dropout: 0.1, batch_first: true}",
        "{name: encoder.layers.encoder_layer_0.add, kind: Add, inputs: [encoder.layers.encoder_layer_0."
        "self_attention, encoder.add]}",
        "{name: select, kind: Narrow, dim: 1, start: 0, length: 1}",
        "{name: flatten, kind: Flatten}",
        "{name: heads.head, kind: Linear, out_features: 3}"])),
] + [
    # ---- MatMul and MulConstant: attention written by hand (q @ k.transpose(-2, -1) / sqrt(d), softmax, @ v).
    # Both operands computed (Linear, Tanh, Permute of the input) so both gradients reach parameters; each
    # transpose combination; per-sample rank 2 and 3; a product of a value with itself (its gradients add)
    ("matmul_2d", stage([3, 4], ["{name: a, kind: Tanh, input: input}",
                                 "{name: t, kind: Permute, dims: [0, 2, 1], input: input}",
                                 "{name: b, kind: Linear, out_features: 5}",
                                 "{name: m, kind: MatMul, inputs: [a, b]}"])),
    ("matmul_3d", stage([2, 3, 4], ["{name: a, kind: Linear, out_features: 6, input: input}",
                                    "{name: a2, kind: Linear, out_features: 4}",
                                    "{name: t, kind: Permute, dims: [0, 1, 3, 2], input: input}",
                                    "{name: b, kind: Linear, out_features: 5}",
                                    "{name: m, kind: MatMul, inputs: [a2, b], transpose_a: false}"])),
    ("matmul_ta", stage([2, 3, 4], ["{name: a, kind: Linear, out_features: 5, input: input}",
                                    "{name: b, kind: Linear, out_features: 6, input: input}",
                                    "{name: m, kind: MatMul, inputs: [a, b], transpose_a: true}"])),
    ("matmul_tb", stage([2, 3, 4], ["{name: a, kind: Linear, out_features: 5, input: input}",
                                    "{name: b, kind: Sigmoid, input: input}",
                                    "{name: c, kind: Linear, out_features: 5}",
                                    "{name: m, kind: MatMul, inputs: [a, c], transpose_b: true}"])),
    ("matmul_tab", stage([3, 4], ["{name: a, kind: Permute, dims: [0, 2, 1], input: input}",
                                  "{name: b, kind: Linear, out_features: 5, input: input}",
                                  "{name: m, kind: MatMul, inputs: [b, a], transpose_a: true, transpose_b: true}"])),
    ("matmul_self", stage([4, 3], ["{name: a, kind: Linear, out_features: 5}",
                                   "{name: m, kind: MatMul, inputs: [a, a], transpose_b: true}"])),
    ("mul_constant", stage([2, 5], ["{name: a, kind: Linear, out_features: 3}",
                                    "{name: s, kind: MulConstant, value: -0.35355339059327373}",
                                    "{name: t, kind: Tanh}"])),
    ("mul_constant_blocked", stage([3, 4, 4], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
                                               "{name: s, kind: MulConstant, value: 2.5}",
                                               "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    # minGPT's CausalSelfAttention without the mask, on (S, E) = (4, 8) per sample, 2 heads of 4: q, k, v
    # viewed (S, heads, d) and permuted to (heads, S, d), q @ k^T * 1/sqrt(d), softmax over the last dim, @ v,
    # the heads permuted back and merged (transpose(1, 2).reshape), the output projection
    ("attention", stage([4, 8], [
        "{name: q, kind: Linear, out_features: 8, input: input}",
        "{name: k, kind: Linear, out_features: 8, input: input}",
        "{name: v, kind: Linear, out_features: 8, input: input}",
        "{name: qv, kind: Reshape, shape: [4, 2, 4], input: q}",
        "{name: kv, kind: Reshape, shape: [4, 2, 4], input: k}",
        "{name: vv, kind: Reshape, shape: [4, 2, 4], input: v}",
        "{name: qh, kind: Permute, dims: [0, 2, 1, 3], input: qv}",
        "{name: kh, kind: Permute, dims: [0, 2, 1, 3], input: kv}",
        "{name: vh, kind: Permute, dims: [0, 2, 1, 3], input: vv}",
        "{name: att, kind: MatMul, inputs: [qh, kh], transpose_b: true}",
        "{name: scaled, kind: MulConstant, value: 0.5}",
        "{name: sm, kind: Softmax, dim: -1}",
        "{name: y, kind: MatMul, inputs: [sm, vh]}",
        "{name: yt, kind: Permute, dims: [0, 2, 1, 3]}",
        "{name: ym, kind: Reshape, shape: [4, 8]}",
        "{name: proj, kind: Linear, out_features: 8}"])),
] + [
    # ---- attention masks: MaskedFill (a triangle of the last two dims set to a value; its twin torch.triu /
    # torch.tril's mask, or minGPT's own tril buffer sliced to T) and MultiheadAttention's causal attn_mask.
    # -inf only before a Softmax (an -inf output compares as nan); finite values where the fill is the output
    ("masked_fill_causal", stage([2, 4, 3], ["{name: a, kind: Linear, out_features: 4}",
                                             "{name: m, kind: MaskedFill, mask: triu, diagonal: 1, value: -inf}",
                                             "{name: s, kind: Softmax, dim: -1}"])),
    ("masked_fill_tril", stage([2, 3, 4], ["{name: a, kind: Linear, out_features: 5}",
                                           "{name: m, kind: MaskedFill, mask: tril, diagonal: -1, value: 2.5}"])),
    ("masked_fill_triu_wide", stage([4, 3], ["{name: a, kind: Linear, out_features: 6}",
                                             "{name: m, kind: MaskedFill, mask: triu, diagonal: 2, value: -3.0}",
                                             "{name: s, kind: Softmax, dim: -1}"])),
    ("masked_fill_tril_3d", stage([3, 5, 5], ["{name: t, kind: Tanh}",
                                              "{name: m, kind: MaskedFill, mask: tril, diagonal: -1, value: -.inf}",
                                              "{name: s, kind: Softmax, dim: -1}"])),
    # minGPT's CausalSelfAttention as written upstream: c_attn split in three, the heads, q @ k^T * 1/sqrt(4),
    # att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf')) with the bias tril(ones(n, n)) of block
    # size n 8 at T 5 (T < n; the twin slices it) and at T 4 = n, softmax, attn_dropout (p 0.2, stored masks)
    # or none, @ v, the heads merged, c_proj
    ("mingpt_masked_t5_n8", stage([5, 8], [
        "{name: c_attn, kind: Linear, out_features: 24, input: input}",
        "{name: q, kind: Narrow, dim: -1, start: 0, length: 8}",
        "{name: k, kind: Narrow, dim: -1, start: 8, length: 8, input: c_attn}",
        "{name: v, kind: Narrow, dim: -1, start: 16, length: 8, input: c_attn}",
        "{name: qv, kind: Reshape, shape: [5, 2, 4], input: q}",
        "{name: kv, kind: Reshape, shape: [5, 2, 4], input: k}",
        "{name: vv, kind: Reshape, shape: [5, 2, 4], input: v}",
        "{name: qh, kind: Permute, dims: [0, 2, 1, 3], input: qv}",
        "{name: kh, kind: Permute, dims: [0, 2, 1, 3], input: kv}",
        "{name: vh, kind: Permute, dims: [0, 2, 1, 3], input: vv}",
        "{name: att, kind: MatMul, inputs: [qh, kh], transpose_b: true}",
        "{name: scaled, kind: MulConstant, value: 0.5}",
        "{name: masked, kind: MaskedFill, mask: triu, diagonal: 1, value: -inf}",
        "{name: sm, kind: Softmax, dim: -1}",
        "{name: attn_dropout, kind: Dropout, p: 0.2}",
        "{name: y, kind: MatMul, inputs: [attn_dropout, vh]}",
        "{name: yt, kind: Permute, dims: [0, 2, 1, 3]}",
        "{name: ym, kind: Reshape, shape: [5, 8]}",
        "{name: c_proj, kind: Linear, out_features: 8}"])),
    ("mingpt_masked_t4_n4", stage([4, 8], [
        "{name: c_attn, kind: Linear, out_features: 24, input: input}",
        "{name: q, kind: Narrow, dim: -1, start: 0, length: 8}",
        "{name: k, kind: Narrow, dim: -1, start: 8, length: 8, input: c_attn}",
        "{name: v, kind: Narrow, dim: -1, start: 16, length: 8, input: c_attn}",
        "{name: qv, kind: Reshape, shape: [4, 2, 4], input: q}",
        "{name: kv, kind: Reshape, shape: [4, 2, 4], input: k}",
        "{name: vv, kind: Reshape, shape: [4, 2, 4], input: v}",
        "{name: qh, kind: Permute, dims: [0, 2, 1, 3], input: qv}",
        "{name: kh, kind: Permute, dims: [0, 2, 1, 3], input: kv}",
        "{name: vh, kind: Permute, dims: [0, 2, 1, 3], input: vv}",
        "{name: att, kind: MatMul, inputs: [qh, kh], transpose_b: true}",
        "{name: scaled, kind: MulConstant, value: 0.5}",
        "{name: masked, kind: MaskedFill, mask: triu, diagonal: 1, value: -inf}",
        "{name: sm, kind: Softmax, dim: -1}",
        "{name: y, kind: MatMul, inputs: [sm, vh]}",
        "{name: yt, kind: Permute, dims: [0, 2, 1, 3]}",
        "{name: ym, kind: Reshape, shape: [4, 8]}",
        "{name: c_proj, kind: Linear, out_features: 8}"])),
    # nn.MultiheadAttention(attn_mask=the causal mask): as a bool torch.triu(ones, 1) or a float
    # generate_square_subsequent_mask (MHA_MASK), 1 and 2 heads, with and without bias, with attention dropout
    ("mha_causal_h2", stage([5, 8], ["{name: a, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
                                     "batch_first: true, causal: true}"])),
    ("mha_causal_h1_nobias", stage([4, 6], ["{name: a, kind: MultiheadAttention, embed_dim: 6, num_heads: 1, "
                                            "bias: false, batch_first: true, causal: true}"])),
    ("mha_causal_dropout", stage([5, 8], ["{name: a, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
                                          "dropout: 0.25, batch_first: true, causal: true}"])),
    # ---- swin's shifted windows: Roll (torch.roll: one dim, two with a negative shift as swin's (H, W, C),
    # three with a shift past the size and a negative dim, the dims of a blocked convolution's output), Pad
    # (F.pad constant: swin's (0, 0, 0, pad_r, 0, pad_b) before a Linear, every dim with a value, the first
    # dim only, one dim), Narrow's step (x[:, 1::2]; swin's patch merging: x[..., i::2, j::2, :] of four
    # pieces joined on the last dim, LayerNorm, Linear)
    ("roll_one", stage([5, 3], ["{name: l, kind: Linear, out_features: 3}",
                                "{name: r, kind: Roll, shifts: 2, dims: 1}",
                                "{name: o, kind: Linear, out_features: 2}"])),
    ("roll_two", stage([4, 5, 3], ["{name: l, kind: Linear, out_features: 3}",
                                   "{name: r, kind: Roll, shifts: [-1, 3], dims: [1, 2]}",
                                   "{name: o, kind: Linear, out_features: 2}"])),
    ("roll_three", stage([3, 4, 2, 2], ["{name: t, kind: Tanh}",
                                        "{name: r, kind: Roll, shifts: [1, -2, 5], dims: [-1, 1, 2]}",
                                        "{name: o, kind: Linear, out_features: 3}"])),
    ("roll_blocked", stage([3, 4, 5], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1}",
                                       "{name: r, kind: Roll, shifts: [-2, 1], dims: [2, 3]}",
                                       "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    ("pad_swin", stage([3, 4, 5], ["{name: l, kind: Linear, out_features: 5}",
                                   "{name: p, kind: Pad, pad: [0, 0, 0, 2, 0, 3]}",
                                   "{name: o, kind: Linear, out_features: 4}"])),
    ("pad_all_value", stage([2, 3, 4], ["{name: t, kind: Tanh}",
                                        "{name: p, kind: Pad, pad: [1, 2, 2, 1, 1, 0], value: -0.5}",
                                        "{name: o, kind: Linear, out_features: 3}"])),
    ("pad_first_dim", stage([3, 2, 2], ["{name: t, kind: Sigmoid}",
                                        "{name: p, kind: Pad, pad: [0, 0, 0, 0, 1, 2], value: 0.25}",
                                        "{name: o, kind: Linear, out_features: 3}"])),
    ("pad_1d", stage([5], ["{name: l, kind: Linear, out_features: 4}",
                           "{name: p, kind: Pad, pad: [2, 1]}",
                           "{name: o, kind: Linear, out_features: 3}"])),
    # Pad's other modes (CycleGAN's ReflectionPad2d, convolutions' padding_mode): borders taken from the input, the
    # corners of 2 and 3 padded dims, pads up to each mode's limit (reflect L - 1, circular L)
    ("pad_reflect_2d", stage([2, 4, 5], ["{name: t, kind: Tanh}",
                                         "{name: p, kind: Pad, pad: [2, 1, 3, 1], mode: reflect}",
                                         "{name: o, kind: Linear, out_features: 3}"])),
    ("pad_replicate_2d", stage([2, 4, 5], ["{name: t, kind: Tanh}",
                                           "{name: p, kind: Pad, pad: [1, 3, 2, 2], mode: replicate}",
                                           "{name: o, kind: Linear, out_features: 3}"])),
    ("pad_circular_2d", stage([2, 4, 5], ["{name: t, kind: Tanh}",
                                          "{name: p, kind: Pad, pad: [2, 1, 1, 4], mode: circular}",
                                          "{name: o, kind: Linear, out_features: 3}"])),
    ("pad_reflect_1d", stage([3, 5], ["{name: l, kind: Linear, out_features: 5}",
                                      "{name: p, kind: Pad, pad: [4, 2], mode: reflect}",
                                      "{name: o, kind: Linear, out_features: 3}"])),
    ("pad_reflect_3d", stage([2, 3, 4, 5], ["{name: t, kind: Sigmoid}",
                                            "{name: p, kind: Pad, pad: [1, 1, 1, 0, 2, 1], mode: reflect}",
                                            "{name: o, kind: Linear, out_features: 3}"])),
    ("pad_circular_3d", stage([2, 3, 4, 5], ["{name: t, kind: Sigmoid}",
                                             "{name: p, kind: Pad, pad: [0, 2, 1, 1, 3, 0], mode: circular}",
                                             "{name: o, kind: Linear, out_features: 3}"])),
    ("pad_replicate_conv", stage([3, 6, 6], ["{name: p, kind: Pad, pad: [1, 1, 1, 1], mode: replicate}",
                                             "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3}"])),
    ("narrow_step", stage([6, 5], ["{name: l, kind: Linear, out_features: 5}",
                                   "{name: n, kind: Narrow, dim: 1, start: 1, length: 3, step: 2}",
                                   "{name: o, kind: Linear, out_features: 2}"])),
    ("patch_merging", stage([4, 4, 3], [
        "{name: x0h, kind: Narrow, dim: 1, start: 0, length: 2, step: 2, input: input}",
        "{name: x0, kind: Narrow, dim: 2, start: 0, length: 2, step: 2}",
        "{name: x1h, kind: Narrow, dim: 1, start: 1, length: 2, step: 2, input: input}",
        "{name: x1, kind: Narrow, dim: 2, start: 0, length: 2, step: 2}",
        "{name: x2, kind: Narrow, dim: 2, start: 1, length: 2, step: 2, input: x0h}",
        "{name: x3, kind: Narrow, dim: -2, start: 1, length: 2, step: 2, input: x1h}",
        "{name: cat, kind: Concat, inputs: [x0, x1, x2, x3], dim: -1}",
        "{name: norm, kind: LayerNorm, normalized_shape: 12}",
        "{name: reduction, kind: Linear, out_features: 6, bias: false}"])),
    # swin's relative position bias (torchvision's own table, index and _get_relative_position_bias) added to
    # scores of each window and head, softmax over the keys (so the shifted-window mask's -100 shows), a Linear:
    # 2x2 windows of a 4x4 grid shifted by 1 both ways, 2x3 windows without a shift, a shift along the columns
    # only (torchvision's mask then has one region of rows)
    ("rpb_shift", stage([4, 2, 4, 4], [
        "{name: t, kind: Tanh, input: input}",
        "{name: attn, kind: RelativePositionBias, window_size: 2, num_heads: 2, windows: 2, shift_size: 1, "
        "input: input}",
        "{name: s, kind: Add, inputs: [t, attn]}",
        "{name: sm, kind: Softmax, dim: -1}",
        "{name: o, kind: Linear, out_features: 3}"])),
    ("rpb_rect", stage([2, 3, 6, 6], [
        "{name: t, kind: Sigmoid, input: input}",
        "{name: attn, kind: RelativePositionBias, window_size: [2, 3], num_heads: 3, windows: [1, 2], input: input}",
        "{name: s, kind: Add, inputs: [attn, t]}",
        "{name: sm, kind: Softmax, dim: -1}",
        "{name: o, kind: Linear, out_features: 2}"])),
    ("rpb_shift_cols", stage([4, 1, 6, 6], [
        "{name: attn, kind: RelativePositionBias, window_size: [3, 2], num_heads: 1, windows: [2, 2], "
        "shift_size: [0, 1], input: input}",
        "{name: s, kind: Add, inputs: [input, attn]}",
        "{name: sm, kind: Softmax, dim: -1}",
        "{name: o, kind: Linear, out_features: 2}"])),
]


# key padding masks computed from the token ids: nn.MultiheadAttention(x, x, x, key_padding_mask=ids == pad) as
# Embedding, Eq (pad id 0) and MultiheadAttention's second input; the bool mask (with and without causal, with
# attention dropout) and the float one ((ids == 0) * -1e4, added to the scores). The ids of each case are KPM_IDS'
# rows: several padded keys, all but one padded, padding in the middle and none (right padding with causal).
KPM_EMB = "{name: emb, kind: Embedding, num_embeddings: 9, embedding_dim: 8}"
KPM_EQ = "{name: pad, kind: Eq, value: 0, input: input}"
CASES += [
    ("kpm_bool_h2", stage([6], [KPM_EMB, KPM_EQ, "{name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
                                "batch_first: true, inputs: [emb, pad]}"], "int64")),
    ("kpm_causal_h2", stage([6], [KPM_EMB, KPM_EQ, "{name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, "
                                  "batch_first: true, causal: true, inputs: [emb, pad]}"], "int64")),
    ("kpm_dropout_h4", stage([6], [KPM_EMB, KPM_EQ, "{name: attn, kind: MultiheadAttention, embed_dim: 8, "
                                   "num_heads: 4, dropout: 0.25, batch_first: true, inputs: [emb, pad]}",
                                   "{name: o, kind: Linear, out_features: 3}"], "int64")),
    ("kpm_float_h1_nobias", stage([6], [KPM_EMB, KPM_EQ, "{name: neg, kind: MulConstant, value: -10000.0}",
                                        "{name: attn, kind: MultiheadAttention, embed_dim: 8, num_heads: 1, "
                                        "bias: false, batch_first: true, key_padding_mask: float, inputs: [emb, neg]}"],
                              "int64")),
]
# MatMul broadcasting (bcast): numpy's rule over the leading dims of two computed operands - the right one
# broadcast over the heads (one GEMM of the heads' rows), the left one, both at once over different dims with
# transposes - and a learned operand (`parameter`, the same for every sample): x @ W, x @ W.t() (transpose_b)
# under a top-level name, W.t() @ x on the left with a leading 1, per-head weights (H, D, E), a rank above the
# sample's (leading 1 facing the batch), a vector per sample (x (N, k) @ W, then @ V.t()); multi-query attention (q per head, one k and v for all heads) with a
# parameter projection. The gradient of a broadcast operand is summed over what it faced.
CASES += [
    ("mm_bc_right", stage([2, 3, 4], ["{name: a, kind: Linear, out_features: 4, input: input}",
                                      "{name: n1, kind: Narrow, dim: 1, start: 1, length: 1, input: input}",
                                      "{name: t, kind: Permute, dims: [0, 1, 3, 2]}",
                                      "{name: b, kind: Linear, out_features: 5}",
                                      "{name: m, kind: MatMul, inputs: [a, b]}"])),
    ("mm_bc_left_tb", stage([2, 3, 4], ["{name: n1, kind: Narrow, dim: 1, start: 0, length: 1, input: input}",
                                        "{name: a, kind: Tanh}",
                                        "{name: b, kind: Linear, out_features: 4, input: input}",
                                        "{name: m, kind: MatMul, inputs: [a, b], transpose_b: true}"])),
    ("mm_bc_mixed_ta", stage([2, 3, 4, 3], ["{name: n1, kind: Narrow, dim: 2, start: 1, length: 1, input: input}",
                                            "{name: a, kind: Linear, out_features: 5}",
                                            "{name: n2, kind: Narrow, dim: 1, start: 0, length: 1, input: input}",
                                            "{name: b, kind: Sigmoid}",
                                            "{name: m, kind: MatMul, inputs: [a, b], transpose_a: true}"])),
    ("mm_param_right", stage([3, 4], ["{name: lin, kind: MatMul, parameter: W, shape: [4, 5]}",
                                      "{name: t, kind: Tanh}"])),
    ("mm_param_tb_top", stage([2, 3, 4], ["{name: a, kind: Sigmoid}",
                                          "{name: W_q, kind: MatMul, parameter: null, shape: [5, 4], "
                                          "transpose_b: true}"])),
    ("mm_param_left_ta", stage([2, 4, 5], ["{name: a, kind: Tanh}",
                                           "{name: mix, kind: MatMul, parameter: W, shape: [1, 4, 3], "
                                           "parameter_side: left, transpose_a: true}"])),
    ("mm_param_heads", stage([2, 3, 4], ["{name: a, kind: Tanh}",
                                         "{name: heads, kind: MatMul, parameter: weight, shape: [2, 4, 3]}"])),
    ("mm_param_lead1", stage([3, 4], ["{name: p, kind: MatMul, parameter: W, shape: [1, 4, 2]}"])),
    ("mm_param_vector", stage([6], ["{name: a, kind: Tanh}",
                                    "{name: lin.W, kind: MatMul, parameter: null, shape: [6, 4]}",
                                    "{name: lin.V, kind: MatMul, parameter: null, shape: [3, 4], transpose_b: true}"])),
    ("mm_mqa", stage([4, 8], [
        "{name: q, kind: MatMul, parameter: W_q, shape: [8, 8], input: input}",
        "{name: qh, kind: Reshape, shape: [4, 2, 4]}",
        "{name: qp, kind: Permute, dims: [0, 2, 1, 3]}",
        "{name: k, kind: Linear, out_features: 4, input: input}",
        "{name: kh, kind: Reshape, shape: [1, 4, 4]}",
        "{name: v, kind: Linear, out_features: 4, input: input}",
        "{name: vh, kind: Reshape, shape: [1, 4, 4]}",
        "{name: att, kind: MatMul, inputs: [qp, kh], transpose_b: true}",
        "{name: s, kind: MulConstant, value: 0.5}",
        "{name: sm, kind: Softmax, dim: -1}",
        "{name: y, kind: MatMul, inputs: [sm, vh]}",
        "{name: yp, kind: Permute, dims: [0, 2, 1, 3]}",
        "{name: ym, kind: Reshape, shape: [4, 8]}",
        "{name: proj, kind: MatMul, parameter: W, shape: [8, 8]}"])),
]

# upsampling (decoders, autoencoders, U-Nets): ConvTranspose2d (stride 2 with output_padding, rectangular with
# dilation and groups, no bias, the U-Net's 2x2 stride 2, between blocked convolutions) and Upsample (nearest and
# bilinear with both align_corners, integer, fractional and per-axis scale factors, sizes up, down and kept, and
# recompute_scale_factor), and a U-Net's step: a strided conv down, Upsample, the skip joined by Concat
CASES += [
    ("upconv_s2_op", stage([4, 5, 5], ["{name: u, kind: ConvTranspose2d, out_channels: 6, kernel_size: 3, stride: 2, "
                                       "padding: 1, output_padding: 1}"])),
    ("upconv_rect_dil_groups", stage([4, 4, 5], ["{name: u, kind: ConvTranspose2d, in_channels: 4, out_channels: 6, "
                                                 "kernel_size: [3, 2], stride: [2, 1], padding: [1, 0], "
                                                 "output_padding: [1, 0], dilation: [2, 1], groups: 2, "
                                                 "bias: false}"])),
    ("upconv_k2s2", stage([8, 3, 4], ["{name: u, kind: ConvTranspose2d, out_channels: 4, kernel_size: 2, "
                                      "stride: 2}"])),
    ("upconv_blocked", stage([16, 4, 4], ["{name: c1, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}",
                                          "{name: u, kind: ConvTranspose2d, out_channels: 16, kernel_size: 2, "
                                          "stride: 2}",
                                          "{name: r, kind: ReLU}",
                                          "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}"])),
    ("up_nearest_x2", stage([3, 4, 5], ["{name: u, kind: Upsample, scale_factor: 2}"])),
    ("up_nearest_frac", stage([3, 5, 4], ["{name: u, kind: Upsample, scale_factor: 1.7}"])),
    ("up_nearest_axes", stage([2, 3, 4], ["{name: u, kind: Upsample, scale_factor: [1.5, 3], mode: nearest}"])),
    ("up_nearest_size", stage([3, 4, 5], ["{name: u, kind: Upsample, size: [7, 9]}"])),
    ("up_nearest_down", stage([2, 7, 5], ["{name: u, kind: Upsample, size: [3, 2]}"])),
    ("up_bilinear_x2", stage([3, 4, 5], ["{name: u, kind: Upsample, scale_factor: 2, mode: bilinear}"])),
    ("up_bilinear_x2_ac", stage([3, 4, 5], ["{name: u, kind: Upsample, scale_factor: 2, mode: bilinear, "
                                            "align_corners: true}"])),
    ("up_bilinear_frac", stage([2, 4, 5], ["{name: u, kind: Upsample, scale_factor: [1.5, 2.3], mode: bilinear}"])),
    ("up_bilinear_frac_ac", stage([2, 4, 5], ["{name: u, kind: Upsample, scale_factor: 1.5, mode: bilinear, "
                                              "align_corners: true}"])),
    ("up_bilinear_size", stage([3, 4, 5], ["{name: u, kind: Upsample, size: [4, 8], mode: bilinear}"])),
    ("up_bilinear_size_ac", stage([3, 4, 5], ["{name: u, kind: Upsample, size: [7, 3], mode: bilinear, "
                                              "align_corners: true}"])),
    ("up_bilinear_recompute", stage([2, 5, 4], ["{name: u, kind: Upsample, scale_factor: 1.7, mode: bilinear, "
                                                "recompute_scale_factor: true}"])),
    ("up_nearest_recompute", stage([2, 5, 4], ["{name: u, kind: Upsample, scale_factor: 1.7, "
                                               "recompute_scale_factor: true}"])),
    ("unet_step", stage([4, 6, 6], [
        "{name: down, kind: Conv2d, out_channels: 8, kernel_size: 3, stride: 2, padding: 1, input: input}",
        "{name: r, kind: ReLU}",
        "{name: up, kind: Upsample, scale_factor: 2, mode: bilinear}",
        "{name: cat, kind: Concat, inputs: [up, input], dim: 1}",
        "{name: out, kind: Conv2d, out_channels: 3, kernel_size: 3, padding: 1}"])),
]


# real tokens per sample (the rest pad id 0): right padding (several keys, all but one), padding in the middle
# ("mid": tokens 0, 1 and 5 real), none
KPM_IDS = {"kpm_bool_h2": [3, 1, "mid", 6], "kpm_causal_h2": [2, 1, 6, 4], "kpm_dropout_h4": [4, 1, "mid", 6, 2],
           "kpm_float_h1_nobias": [1, 5, "mid"]}


def kpm_ids(name, shape):
    ids = torch.randint(1, 9, shape)
    for b, k in enumerate(KPM_IDS[name]):
        keep = torch.tensor([0, 1, 5]) if k == "mid" else torch.arange(k)
        row = torch.zeros(shape[1], dtype=torch.int64)
        row[keep] = ids[b, keep]
        ids[b] = row
    return ids


# elementwise math (users' own layers): the activations' ops; Log, Sqrt and Pow 0.5 read Abs + AddConstant's
# positive values
CASES += [
    ("elu", stage([2, 3, 4], ["{name: a, kind: ELU, alpha: 0.7}"])),
    ("selu", stage([7], ["{name: a, kind: SELU}"])),
    ("softplus", stage([7], ["{name: a, kind: Softplus}"])),
    ("softplus_beta_threshold", stage([2, 6], ["{name: a, kind: Softplus, beta: 2.0, threshold: 1.0}"])),
    ("mish", stage([2, 3, 4], ["{name: a, kind: Mish}"])),
    ("logsigmoid", stage([7], ["{name: a, kind: LogSigmoid}"])),
    ("exp", stage([7], ["{name: a, kind: Exp}"])),
    ("abs_log", stage([2, 5], ["{name: a, kind: Abs}", "{name: c, kind: AddConstant, value: 0.1}",
                               "{name: l, kind: Log}"])),
    ("abs_sqrt", stage([9], ["{name: a, kind: Abs}", "{name: c, kind: AddConstant, value: 0.2}",
                             "{name: r, kind: Sqrt}"])),
    ("pow2", stage([7], ["{name: p, kind: Pow, exponent: 2}"])),
    ("pow3", stage([2, 4], ["{name: p, kind: Pow, exponent: 3.0}"])),
    ("pow_half_neg", stage([7], ["{name: a, kind: Abs}", "{name: c, kind: AddConstant, value: 0.3}",
                                 "{name: p, kind: Pow, exponent: 0.5}", "{name: q, kind: Pow, exponent: -1.5}"])),
    ("addconst", stage([2, 3, 4], ["{name: c, kind: AddConstant, value: -0.75}"])),
    ("sub", stage([6], ["{name: a, kind: Linear, out_features: 6, input: input}", "{name: t, kind: Tanh, input: input}",
                        "{name: s, kind: Sub, inputs: [t, a]}"])),
    # group and instance normalisation (each sample's own statistics; weights perturbed from ones/zeros)
    ("groupnorm", stage([6, 4, 5], ["{name: g, kind: GroupNorm, num_groups: 3}"])),
    ("groupnorm_one_group_noaffine", stage([4, 3, 3], ["{name: g, kind: GroupNorm, num_groups: 1, affine: false, "
                                                        "eps: 0.001}"])),
    ("groupnorm_per_channel_1d", stage([4, 7], ["{name: g, kind: GroupNorm, num_groups: 4, num_channels: 4}"])),
    ("groupnorm_flat", stage([6], ["{name: g, kind: GroupNorm, num_groups: 2}"])),
    ("instancenorm2d_affine", stage([3, 4, 4], ["{name: i, kind: InstanceNorm2d, num_features: 3, affine: true}"])),
    ("instancenorm1d", stage([3, 9], ["{name: i, kind: InstanceNorm1d}"])),
    ("groupnorm_blocked", stage([3, 5, 5], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}",
                                            "{name: g, kind: GroupNorm, num_groups: 4}", "{name: r, kind: SiLU}",
                                            "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}"])),
    # F.normalize (p 2): vectors along dim 1, the last dim, the channels of (C, H, W); eps 0.8 at a scale where
    # some norms fall below it (those divided by eps)
    ("normalize", stage([6], ["{name: n, kind: Normalize}"])),
    ("normalize_last", stage([3, 5], ["{name: n, kind: Normalize, dim: -1}"])),
    ("normalize_channels", stage([4, 3, 3], ["{name: c, kind: Conv2d, out_channels: 4, kernel_size: 1}",
                                             "{name: n, kind: Normalize, dim: 1}"])),
    ("normalize_eps", stage([2, 3], ["{name: n, kind: Normalize, dim: 2, eps: 0.8}"])),
    # on 16 channels: blocked layouts through the activations
    ("hardtanh_clamp_min", stage([7], ["{name: a, kind: Hardtanh, min_val: -0.3, max_val: .inf}"])),
    ("hardtanh_clamp_max", stage([7], ["{name: a, kind: Hardtanh, min_val: -.inf, max_val: 0.4}"])),
    ("eltwise_blocked", stage([3, 5, 5], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}",
                                          "{name: e, kind: ELU}", "{name: m, kind: Mish}",
                                          "{name: k, kind: AddConstant, value: 1.5}", "{name: s, kind: Softplus}",
                                          "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
]

# shrinks and thresholds (nn.CELU, Softsign, Tanhshrink, Hardshrink, Softshrink, Threshold) and nn.PReLU (one slope
# or one per channel, its weight perturbed from 0.25 so each channel's gradient differs); on 16 channels the
# blocked layouts (PReLU's per-channel slopes in the plain one)
SHRINK_CHAIN = ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}", "{name: e, kind: CELU, alpha: 0.5}",
                "{name: th, kind: Threshold, threshold: -0.2, value: 0.3}", "{name: s, kind: Softsign}",
                "{name: h, kind: Hardshrink, lambd: 0.1}", "{name: t, kind: Tanhshrink}",
                "{name: k, kind: Softshrink, lambd: 0.01}", "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"]
CASES += [
    ("celu", stage([2, 3, 4], ["{name: a, kind: CELU, alpha: 0.7}"])),
    ("celu_default", stage([7], ["{name: a, kind: CELU}"])),
    ("celu_alpha2", stage([2, 5], ["{name: a, kind: CELU, alpha: 2.0}"])),
    ("softsign", stage([7], ["{name: a, kind: Softsign}"])),
    ("tanhshrink", stage([2, 5], ["{name: a, kind: Tanhshrink}"])),
    ("hardshrink", stage([2, 6], ["{name: a, kind: Hardshrink}"])),
    ("hardshrink_lambd", stage([7], ["{name: a, kind: Hardshrink, lambd: 1.2}"])),
    ("softshrink", stage([2, 6], ["{name: a, kind: Softshrink}"])),
    ("softshrink_lambd", stage([7], ["{name: a, kind: Softshrink, lambd: 0.3}"])),
    ("threshold", stage([2, 6], ["{name: a, kind: Threshold, threshold: 0.1, value: -2.0}"])),
    ("threshold_relu", stage([7], ["{name: a, kind: Threshold, threshold: 0.0, value: 0.0}"])),
    ("prelu", stage([7], ["{name: p, kind: PReLU}"])),
    ("prelu_channels", stage([3, 4, 4], ["{name: p, kind: PReLU, num_parameters: 3}"])),
    ("prelu_channels_1d", stage([4, 5], ["{name: p, kind: PReLU, num_parameters: 4}"])),
    ("prelu_flat_channels", stage([6], ["{name: p, kind: PReLU, num_parameters: 6}"])),
    ("prelu_blocked", stage([3, 5, 5], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}",
                                        "{name: p, kind: PReLU, num_parameters: 16}", "{name: q, kind: PReLU}",
                                        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    ("shrink_blocked", stage([3, 5, 5], SHRINK_CHAIN)),
    # nn.RReLU: training draws a slope per value (ATen's own, stored as the node's mask), eval the mean slope
    ("rrelu", stage([2, 6], ["{name: r, kind: RReLU}"])),
    ("rrelu_bounds", stage([3, 2, 2], ["{name: r, kind: RReLU, lower: 0.05, upper: 0.6}",
                                       "{name: l, kind: Linear, out_features: 3}"])),
    ("rrelu_fixed_blocked", stage([3, 5, 5], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}",
                                              "{name: r, kind: RReLU, lower: 0.2, upper: 0.2}",
                                              "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
]
# AlphaDropout / FeatureAlphaDropout after SELU (F.alpha_dropout's own draws, stored as the masks psd replays);
# feature-wise on (C, H, W), (C, L), (C) and blocked 16 channels
CASES += [
    ("alpha_dropout", stage([2, 6], ["{name: s, kind: SELU}", "{name: d, kind: AlphaDropout, p: 0.3}"])),
    ("alpha_dropout_default", stage([9], ["{name: d, kind: AlphaDropout}",
                                          "{name: l, kind: Linear, out_features: 4}"])),
    ("feature_alpha_dropout", stage([4, 3, 3], ["{name: s, kind: SELU}",
                                                "{name: d, kind: FeatureAlphaDropout, p: 0.4}"])),
    ("feature_alpha_dropout_1d", stage([5, 4], ["{name: d, kind: FeatureAlphaDropout, p: 0.25}"])),
    ("feature_alpha_dropout_flat", stage([6], ["{name: d, kind: FeatureAlphaDropout, p: 0.5}"])),
    ("feature_alpha_dropout_blocked", stage([3, 5, 5], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}", "{name: s, kind: SELU}",
        "{name: d, kind: FeatureAlphaDropout, p: 0.2}", "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
]

# ---- recurrent layers run by psd (LSTM, GRU over (L, input_size) per sample): nn.LSTM / nn.GRU with
# batch_first=True, the output sequence (out of out, _ = rnn(x)); 1 to 3 layers, without bias, sequences of 1 to 7
# steps, dropout between layers (stored masks, time-major (num_layers - 1, L, N, H)), a batch of 1; a text
# classifier's pieces: Embedding, LSTM / GRU, the last step by Narrow, Flatten, Linear.
RNN_TEXT = ["{name: emb, kind: Embedding, num_embeddings: 7, embedding_dim: 4}"]
CASES += [
    ("lstm_l1", stage([5, 4], ["{name: rnn, kind: LSTM, input_size: 4, hidden_size: 6, batch_first: true}"])),
    ("lstm_l2_len1", stage([1, 3], ["{name: rnn, kind: LSTM, hidden_size: 5, num_layers: 2, batch_first: true}"])),
    ("lstm_l2_nobias", stage([7, 4], ["{name: rnn, kind: LSTM, hidden_size: 3, num_layers: 2, bias: false, "
                                      "batch_first: true}"])),
    ("lstm_l3_dropout", stage([4, 3], ["{name: rnn, kind: LSTM, hidden_size: 5, num_layers: 3, dropout: 0.4, "
                                       "batch_first: true}"])),
    ("lstm_n1", stage([6, 2], ["{name: rnn, kind: LSTM, hidden_size: 4, batch_first: true}"])),
    ("gru_l1", stage([5, 4], ["{name: rnn, kind: GRU, input_size: 4, hidden_size: 6, batch_first: true}"])),
    ("gru_l2_nobias", stage([6, 3], ["{name: rnn, kind: GRU, hidden_size: 4, num_layers: 2, bias: false, "
                                     "batch_first: true}"])),
    ("gru_l2_dropout_len1", stage([1, 4], ["{name: rnn, kind: GRU, hidden_size: 3, num_layers: 2, dropout: 0.5, "
                                           "batch_first: true}"])),
    ("lstm_text", stage([6], RNN_TEXT + [
        "{name: rnn, kind: LSTM, hidden_size: 5, num_layers: 2, batch_first: true}",
        "{name: last, kind: Narrow, dim: 1, start: 5, length: 1}",
        "{name: flat, kind: Flatten}",
        "{name: fc, kind: Linear, out_features: 3}"], "int64")),
    ("gru_text", stage([5], RNN_TEXT + [
        "{name: rnn, kind: GRU, hidden_size: 6, batch_first: true}",
        "{name: last, kind: Narrow, dim: 1, start: 4, length: 1}",
        "{name: flat, kind: Flatten}",
        "{name: fc, kind: Linear, out_features: 2}"], "int64")),
]

# ---- bidirectional recurrent layers: nn.LSTM / nn.GRU(bidirectional=True), each layer's input both directions
# of the layer below (2H), the reverse direction's parameters under PyTorch's *_reverse names; 1 to 4 layers,
# without bias, a sequence of 1, dropout between layers (mask (num_layers - 1, L, N, 2H)), a batch of 1; a text
# classifier reading both directions' last states (out[:, -1] is the forward h_n and the reverse's state after
# its first step; torch.cat((h_n[-2], h_n[-1]), 1) is out[:, -1, :H] joined with out[:, 0, H:]).
CASES += [
    ("lstm_bi_l1", stage([5, 4], ["{name: rnn, kind: LSTM, input_size: 4, hidden_size: 3, batch_first: true, "
                                  "bidirectional: true}"])),
    ("lstm_bi_l2_nobias", stage([4, 3], ["{name: rnn, kind: LSTM, hidden_size: 4, num_layers: 2, bias: false, "
                                         "batch_first: true, bidirectional: true}"])),
    ("lstm_bi_l3_dropout", stage([6, 2], ["{name: rnn, kind: LSTM, hidden_size: 3, num_layers: 3, dropout: 0.4, "
                                          "batch_first: true, bidirectional: true}"])),
    ("lstm_bi_l4_len1", stage([1, 3], ["{name: rnn, kind: LSTM, hidden_size: 2, num_layers: 4, "
                                       "batch_first: true, bidirectional: true}"])),
    ("gru_bi_l1_n1", stage([6, 3], ["{name: rnn, kind: GRU, hidden_size: 4, batch_first: true, "
                                    "bidirectional: true}"])),
    ("gru_bi_l2_dropout", stage([5, 4], ["{name: rnn, kind: GRU, hidden_size: 3, num_layers: 2, dropout: 0.5, "
                                         "batch_first: true, bidirectional: true}"])),
    ("gru_bi_l3_nobias", stage([3, 2], ["{name: rnn, kind: GRU, hidden_size: 3, num_layers: 3, bias: false, "
                                        "batch_first: true, bidirectional: true}"])),
    ("lstm_bi_text", stage([6], RNN_TEXT + [
        "{name: rnn, kind: LSTM, hidden_size: 4, num_layers: 2, batch_first: true, bidirectional: true}",
        "{name: fwd, kind: Narrow, dim: 1, start: 5, length: 1}",
        "{name: fwd_h, kind: Narrow, input: fwd, dim: 2, start: 0, length: 4}",
        "{name: rev, kind: Narrow, input: rnn, dim: 1, start: 0, length: 1}",
        "{name: rev_h, kind: Narrow, input: rev, dim: 2, start: 4, length: 4}",
        "{name: cat, kind: Concat, inputs: [fwd_h, rev_h], dim: 2}",
        "{name: flat, kind: Flatten}",
        "{name: fc, kind: Linear, out_features: 3}"], "int64")),
]
NBATCH_BI = {"gru_bi_l1_n1": 1}   # a batch of one


# ---- numpy broadcasting of two computed tensors (Add, Sub, Mul, Div): the right operand broadcast, the left one,
# a middle dim, both at once (each along a dim of its own), a scalar per sample (1, 1, 1) on either side, a
# (C, 1, 1) gate after a blocked convolution; Div of one shape and broadcast both ways, its denominators kept from
# 0 (Abs + AddConstant); the operands made by Linear out 1, Narrow length 1, AdaptiveAvgPool2d 1, Reshape
POS = ["{name: pa, kind: Abs, input: input}", "{name: pos, kind: AddConstant, value: 0.5}"]
SCALAR = ["{name: f, kind: Flatten, input: input}", "{name: l1, kind: Linear, out_features: 1}",
          "{name: s, kind: Reshape, shape: [1, 1, 1]}"]
CASES += [
    ("bcast_sub_right", stage([4, 5], ["{name: l, kind: Linear, out_features: 1, input: input}",
                                       "{name: d, kind: Sub, inputs: [input, l]}"])),
    ("bcast_sub_left", stage([4, 5], ["{name: l, kind: Linear, out_features: 1, input: input}",
                                      "{name: d, kind: Sub, inputs: [l, input]}"])),
    ("bcast_add_middle", stage([3, 4, 5], ["{name: n, kind: Narrow, dim: 2, start: 1, length: 1, input: input}",
                                           "{name: t, kind: Tanh, input: input}",
                                           "{name: a, kind: Add, inputs: [t, n]}"])),
    ("bcast_add_both", stage([3, 4, 5], ["{name: r, kind: Narrow, dim: 3, start: 2, length: 1, input: input}",
                                         "{name: c, kind: Narrow, dim: 2, start: 0, length: 1, input: input}",
                                         "{name: a, kind: Add, inputs: [r, c]}"])),
    ("bcast_mul_both", stage([4, 5], ["{name: r, kind: Narrow, dim: 1, start: 3, length: 1, input: input}",
                                      "{name: c, kind: Narrow, dim: 2, start: 1, length: 1, input: input}",
                                      "{name: m, kind: Mul, inputs: [c, r]}"])),
    ("bcast_mul_middle_left", stage([3, 4, 5], ["{name: n, kind: Narrow, dim: 2, start: 3, length: 1, input: input}",
                                                "{name: m, kind: Mul, inputs: [n, input]}"])),
    ("bcast_scalar_right", stage([2, 3, 4], SCALAR + ["{name: m, kind: Mul, inputs: [input, s]}",
                                                      "{name: d, kind: Sub, inputs: [m, s]}"])),
    ("bcast_scalar_left", stage([2, 3, 4], SCALAR + POS + ["{name: d, kind: Div, inputs: [s, pos]}",
                                                           "{name: a, kind: Add, inputs: [s, d]}"])),
    ("bcast_gate_blocked", stage([3, 5, 5], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}",
                                             "{name: g, kind: AdaptiveAvgPool2d, output_size: 1}",
                                             "{name: a, kind: Add, inputs: [c, g]}",
                                             "{name: s, kind: Sub, inputs: [g, a]}",
                                             "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
    ("div_same", stage([2, 5], POS + ["{name: t, kind: Tanh, input: input}", "{name: d, kind: Div, inputs: [t, pos]}"])),
    ("div_right", stage([4, 5], POS + ["{name: l, kind: Narrow, dim: 2, start: 0, length: 1}",
                                       "{name: d, kind: Div, inputs: [input, l]}"])),
    ("div_left_middle", stage([3, 4, 2], POS + ["{name: n, kind: Narrow, dim: 2, start: 1, length: 1, input: input}",
                                                "{name: d, kind: Div, inputs: [n, pos]}"])),
]


# ---- CumSum (torch.cumsum along the first, a middle and the last dim; ONNX's reverse and exclusive, alone
# and together) and one value per sample: Reshape to [] (per-sample shape ()), an op on it, back to [1] to gate
# the input, and a stage whose output is () per sample
CASES += [
    ("cumsum_dim1", stage([5, 3], ["{name: l, kind: Linear, out_features: 3}",
                                   "{name: c, kind: CumSum, dim: 1}",
                                   "{name: o, kind: Linear, out_features: 2}"])),
    ("cumsum_middle", stage([2, 4, 3], ["{name: t, kind: Tanh}", "{name: c, kind: CumSum, dim: 2}"])),
    ("cumsum_last", stage([3, 2, 5], ["{name: c, kind: CumSum, dim: -1}",
                                      "{name: o, kind: Linear, out_features: 2}"])),
    ("cumsum_reverse", stage([6], ["{name: c, kind: CumSum, dim: 1, reverse: true}"])),
    ("cumsum_exclusive", stage([3, 4], ["{name: c, kind: CumSum, dim: 1, exclusive: true}"])),
    ("cumsum_reverse_exclusive", stage([4, 3], ["{name: l, kind: Linear, out_features: 3}",
                                                "{name: c, kind: CumSum, dim: -1, reverse: true, exclusive: true}"])),
    ("scalar_gate", stage([6], ["{name: l, kind: Linear, out_features: 1}",
                                "{name: s, kind: Reshape, shape: []}",
                                "{name: e, kind: Tanh}",
                                "{name: g, kind: Reshape, shape: [1]}",
                                "{name: m, kind: Mul, inputs: [input, g]}"])),
    ("scalar_out", stage([3], ["{name: l, kind: Linear, out_features: 1}",
                               "{name: s, kind: Reshape, shape: []}",
                               "{name: e, kind: Exp}"])),
]


def cumsum_module(kind, a):
    """The torch twin of a CumSum node, or None for the other kinds."""
    if kind != "CumSum":
        return None
    dim, rev, exc = a["dim"], a.get("reverse", False), a.get("exclusive", False)

    def cumsum(x):
        x = x.flip(dim) if rev else x
        y = torch.cumsum(x, dim)
        if exc:          # shifted one along: the first 0, the element itself left out
            y = torch.cat([torch.zeros_like(y.narrow(dim, 0, 1)), y.narrow(dim, 0, y.shape[dim] - 1)], dim)
        return y.flip(dim) if rev else y
    return Lambda(cumsum)


# ---- users' elementwise functions: Maximum / Minimum of two tensors (one shape with ties - x against ReLU(x),
# equal wherever x > 0, half the gradient to each - and broadcast either way), the comparisons of a tensor with a
# number feeding Where (both operands tensors, b a number, a a number, b -inf then Exp), Log1p (its input kept above -1),
# Expm1, Sin, Cos, Flip over one dim and over two (one of them negative)
CASES += [
    ("maximum_ties", stage([2, 5], ["{name: r, kind: ReLU, input: input}",
                                    "{name: m, kind: Maximum, inputs: [input, r]}"])),
    ("maximum_bcast_right", stage([4, 5], ["{name: l, kind: Narrow, dim: 2, start: 1, length: 1, input: input}",
                                           "{name: t, kind: Tanh, input: input}",
                                           "{name: m, kind: Maximum, inputs: [t, l]}"])),
    ("minimum_ties", stage([2, 5], ["{name: r, kind: ReLU, input: input}",
                                    "{name: m, kind: Minimum, inputs: [r, input]}"])),
    ("minimum_bcast_left", stage([3, 4, 2], ["{name: n, kind: Narrow, dim: 2, start: 3, length: 1, input: input}",
                                             "{name: m, kind: Minimum, inputs: [n, input]}"])),
    ("where_greater", stage([3, 4], ["{name: t, kind: MulConstant, value: 0.1, input: input}",
                                     "{name: g, kind: Greater, value: 0.2, input: input}",
                                     "{name: w, kind: Where, inputs: [g, input, t]}"])),
    ("where_less_b", stage([3, 4], ["{name: t, kind: Tanh, input: input}",
                                    "{name: c, kind: Less, value: -0.3, input: t}",
                                    "{name: w, kind: Where, inputs: [c, t], b: 0.5}"])),
    ("where_ge_a", stage([12], ["{name: c, kind: GreaterOrEqual, value: 0.0, input: input}",
                                "{name: e, kind: Exp, input: input}",
                                "{name: w, kind: Where, inputs: [c, e], a: -1.5}"])),
    ("where_le_inf", stage([2, 6], ["{name: c, kind: LessOrEqual, value: 0.4, input: input}",
                                    "{name: w, kind: Where, inputs: [c, input], b: -.inf}",
                                    "{name: e, kind: Exp}"])),   # exp(-inf) = 0, no row of NaN
    ("log1p", stage([2, 5], POS + ["{name: l, kind: Log1p}"])),
    ("expm1", stage([2, 5], ["{name: e, kind: Expm1}"])),
    ("sin", stage([3, 4], ["{name: s, kind: Sin}"])),
    ("cos", stage([3, 4], ["{name: c, kind: Cos}"])),
    ("flip_one", stage([3, 4, 5], ["{name: l, kind: Linear, out_features: 4}",
                                   "{name: f, kind: Flip, dims: [2]}"])),
    ("flip_two", stage([3, 4, 5], ["{name: t, kind: Tanh}", "{name: f, kind: Flip, dims: [1, -1]}",
                                   "{name: l, kind: Linear, out_features: 3}"])),
    # after convolutions of 16 channels (dnnl's blocked layout): a comparison, Where, Maximum and Flip between them
    ("elementwise_blocked", stage([3, 5, 5], [
        "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, padding: 1}",
        "{name: g, kind: GreaterOrEqual, value: 0.05}",
        "{name: w, kind: Where, inputs: [g, c], b: 0.0}",
        "{name: c2, kind: Conv2d, out_channels: 16, kernel_size: 1}",
        "{name: m, kind: Maximum, inputs: [w, c2]}",
        "{name: f, kind: Flip, dims: [2]}",
        "{name: c3, kind: Conv2d, out_channels: 16, kernel_size: 1}"])),
]
SCALE_ELEM3 = {"sin": 3.0, "cos": 3.0, "expm1": 1.5}

# ---- nn.Bilinear: y = x1^T W x2 + b of two computed inputs (two Linears of the input); over (3, 4) rows per sample
# without bias, one operand the input itself (its gradient through both paths). torch.erf (a GELU written by hand)
CASES += [
    ("bilinear", stage([6], ["{name: a, kind: Linear, out_features: 4, input: input}",
                             "{name: b, kind: Linear, out_features: 3, input: input}",
                             "{name: bl, kind: Bilinear, inputs: [a, b], out_features: 5}"])),
    ("erf", stage([3, 4], ["{name: l, kind: Linear, out_features: 4}", "{name: e, kind: Erf}"])),
    ("bilinear_rows_nobias", stage([3, 4], ["{name: t, kind: Tanh}",
                                            "{name: bl, kind: Bilinear, inputs: [input, t], out_features: 2, "
                                            "bias: false}"])),
]

# ---- dist: torch.sign (its gradient zero, as PyTorch's): a Linear times its own sign, |h|, whose gradient reaches
# the Linear through the Mul's other side only; exact zeros among its inputs (sign 0)
CASES += [
    ("sign", stage([3, 4], ["{name: l, kind: Linear, out_features: 4}", "{name: s, kind: Sign}",
                            "{name: m, kind: Mul, inputs: [l, s]}", "{name: s2, kind: Sign, input: input}",
                            "{name: j, kind: Concat, inputs: [m, s2], dim: 1}"])),
]
ROUNDED = {"sign"}   # inputs rounded to integers: some exactly 0

# ids2: Embeddings reading a slice of each sample's flat int64 ids (ids_start, ids_shape: a model of several id
# inputs joined), over a 2-D input; an NCF-like stage: a user id, an item id (padding_idx) and a history of 4 item
# ids from one input of 6, the user and item rows multiplied, the history flattened, joined, a Linear
CASES += [
    ("embedding_slice", stage([2, 4], ["{name: e, kind: Embedding, num_embeddings: 7, embedding_dim: 3, "
                                       "ids_start: 3, ids_shape: [2, 2]}"], "int64")),
    ("embedding_slices_ncf", stage([6], [
        "{name: u, kind: Embedding, num_embeddings: 7, embedding_dim: 4, ids_start: 0, ids_shape: [], input: input}",
        "{name: i, kind: Embedding, num_embeddings: 7, embedding_dim: 4, padding_idx: 2, ids_start: 1, "
        "input: input}",
        "{name: h, kind: Embedding, num_embeddings: 7, embedding_dim: 4, ids_start: 2, ids_shape: [4], input: input}",
        "{name: hf, kind: Flatten, input: h}",
        "{name: ui, kind: Mul, inputs: [u, i]}",
        "{name: c, kind: Concat, dim: 1, inputs: [ui, hf]}",
        "{name: fc, kind: Linear, out_features: 2}"], "int64")),
]


class SlicedEmbedding(nn.Embedding):
    """Embedding's ids_start / ids_shape: nn.Embedding of x.reshape(n, -1)[:, start:start + k] as (n, *shape)."""

    def __init__(self, num, dim, padding_idx, start, shape):
        super().__init__(num, dim, padding_idx=padding_idx)
        self.start, self.shape = start, list(shape)

    def forward(self, x):
        n, k = x.shape[0], math.prod(self.shape)
        return super().forward(x.reshape(n, -1)[:, self.start:self.start + k].reshape([n] + self.shape))


def ids2_module(kind, a):
    """The torch twin of an Embedding reading a slice of the ids, or None."""
    if kind == "Embedding" and "ids_start" in a:
        return SlicedEmbedding(a["num_embeddings"], a["embedding_dim"], a.get("padding_idx"), a["ids_start"],
                               a.get("ids_shape", []))
    return None


# ---- recurrent cells (nn.LSTMCell / nn.GRUCell, one step a node): x and the state cut from one input by Narrow
# (the input gradient then holds x's, h's and c's), without a state (zeros: cell(x)), without bias, a batch of
# one; and loops unrolled as psd-export writes them: a node per step, the later ones share: the first's
# parameters (their gradient the sum over the steps), LSTMCell's (2H) output cut into h and c by Narrow.
def cell_loop(kind, steps, feat, H, head=3):
    nodes = []
    for t in range(steps):
        nodes += ["{name: x%d, kind: Narrow, dim: 1, start: %d, length: 1, input: input}" % (t, t),
                  "{name: x%dv, kind: Reshape, shape: [%d]}" % (t, feat)]
        state = [] if t == 0 else ["h%d" % (t - 1)] + (["c%d" % (t - 1)] if kind == "LSTMCell" else [])
        share = ", share: cell0" if t else ""
        nodes.append("{name: cell%d, kind: %s, hidden_size: %d, inputs: [%s]%s}"
                     % (t, kind, H, ", ".join(["x%dv" % t] + state), share))
        nodes.append("{name: h%d, kind: Narrow, dim: 1, start: 0, length: %d, input: cell%d}" % (t, H, t))
        if kind == "LSTMCell" and t < steps - 1:   # the last step's c is read by nothing
            nodes.append("{name: c%d, kind: Narrow, dim: 1, start: %d, length: %d, input: cell%d}" % (t, H, H, t))
    return stage([steps, feat], nodes + ["{name: fc, kind: Linear, out_features: %d, input: h%d}" % (head, steps - 1)])


CELL_SPLIT = ["{name: x, kind: Narrow, dim: 1, start: 0, length: 5, input: input}",
              "{name: h, kind: Narrow, dim: 1, start: 5, length: 4, input: input}",
              "{name: c, kind: Narrow, dim: 1, start: 9, length: 4, input: input}"]
CASES += [
    ("lstmcell_state", stage([13], CELL_SPLIT + [
        "{name: cell, kind: LSTMCell, input_size: 5, hidden_size: 4, inputs: [x, h, c]}"])),
    ("lstmcell_zeros", stage([5], ["{name: cell, kind: LSTMCell, hidden_size: 3}"])),
    ("lstmcell_nobias_n1", stage([13], CELL_SPLIT + [
        "{name: cell, kind: LSTMCell, hidden_size: 4, bias: false, inputs: [x, h, c]}"])),
    ("grucell_state", stage([9], CELL_SPLIT[:2] + [
        "{name: cell, kind: GRUCell, input_size: 5, hidden_size: 4, inputs: [x, h]}"])),
    ("grucell_zeros", stage([4], ["{name: cell, kind: GRUCell, hidden_size: 6}"])),
    ("grucell_nobias", stage([9], CELL_SPLIT[:2] + [
        "{name: cell, kind: GRUCell, hidden_size: 4, bias: false, inputs: [x, h]}"])),
    ("lstmcell_loop", cell_loop("LSTMCell", 4, 3, 5)),
    ("grucell_loop", cell_loop("GRUCell", 3, 4, 3)),
]
NBATCH_CELLS = {"lstmcell_nobias_n1": 1}


class LSTMCellTwin(nn.LSTMCell):
    """psd's LSTMCell: nn.LSTMCell on x and (h, c) (none: zeros), h' and c' joined (N, 2H)."""

    def forward(self, x, h=None, c=None):
        h2, c2 = super().forward(x, None if h is None else (h, c))
        return torch.cat([h2, c2], 1)


class GRUCellTwin(nn.GRUCell):
    """psd's GRUCell: nn.GRUCell on x and h (none: zeros)."""

    def forward(self, x, h=None):
        return super().forward(x, h)


def cell_module(kind, a, shapes):
    """The torch twin of LSTMCell / GRUCell, or None."""
    if kind not in ("LSTMCell", "GRUCell"):
        return None
    cls = LSTMCellTwin if kind == "LSTMCell" else GRUCellTwin
    return cls(shapes[0][0], a["hidden_size"], bias=a.get("bias", True))


def elem3_module(kind, a):
    """The torch twin of Maximum, Minimum, a comparison, Where, Log1p, Expm1, Sin, Cos, Flip, or None."""
    if kind in ("Maximum", "Minimum"):
        return Lambda(torch.maximum if kind == "Maximum" else torch.minimum)
    if kind in ("Greater", "Less", "GreaterOrEqual", "LessOrEqual"):   # a 0/1 float mask, as psd's
        v = a["value"]
        op = {"Greater": torch.gt, "Less": torch.lt, "GreaterOrEqual": torch.ge, "LessOrEqual": torch.le}[kind]
        return Lambda(lambda x: op(x, v).float())
    if kind == "Where":   # torch.where(cond, a, b), a or b a number where the node says so
        va, vb = a.get("a"), a.get("b")

        def where(c, *xs):
            xs = list(xs)
            pa = xs.pop(0) if va is None else float(va)
            pb = xs.pop(0) if vb is None else float(vb)
            return torch.where(c != 0, pa, pb)
        return Lambda(where)
    if kind in ("Log1p", "Expm1", "Sin", "Cos"):
        return Lambda(getattr(torch, kind.lower()))
    if kind == "Flip":
        dims = a["dims"]
        return Lambda(lambda x: torch.flip(x, dims))
    return None


def bcast_module(kind):
    """The torch twin of Div (Add, Sub, Mul broadcast as their own twins do), or None."""
    if kind == "Div":
        return Lambda(lambda x, y: x / y)
    return None

def eltwise_module(kind, a, s0):
    """The torch twin of an elementwise-math node, or None for the other kinds."""
    if kind == "ELU":
        return nn.ELU(a.get("alpha", 1.0))
    if kind == "SELU":
        return nn.SELU()
    if kind == "Softplus":
        return nn.Softplus(a.get("beta", 1.0), a.get("threshold", 20.0))
    if kind == "Mish":
        return nn.Mish()
    if kind == "LogSigmoid":
        return nn.LogSigmoid()
    if kind in ("Exp", "Log", "Abs", "Sqrt"):
        return Lambda(getattr(torch, kind.lower()))
    if kind == "Pow":
        e = a["exponent"]
        return Lambda(lambda x: x ** e)
    if kind == "AddConstant":
        v = a["value"]
        return Lambda(lambda x: x + v)
    if kind == "Sub":
        return Lambda(lambda x, y: x - y)
    if kind == "Normalize":
        d, e = a.get("dim", 1), a.get("eps", 1e-12)
        return Lambda(lambda x: F.normalize(x, p=2.0, dim=d, eps=e))
    if kind == "GroupNorm":
        return nn.GroupNorm(a["num_groups"], s0[0], eps=a.get("eps", 1e-5), affine=a.get("affine", True))
    if kind in ("InstanceNorm1d", "InstanceNorm2d"):
        cls = nn.InstanceNorm1d if kind == "InstanceNorm1d" else nn.InstanceNorm2d
        return cls(s0[0], eps=a.get("eps", 1e-5), affine=a.get("affine", False))
    return None

def shrink_module(kind, a, s0):
    """The torch twin of a shrink, threshold or PReLU node, or None for the other kinds."""
    if kind == "CELU":
        return nn.CELU(a.get("alpha", 1.0))
    if kind == "Softsign":
        return nn.Softsign()
    if kind == "Tanhshrink":
        return nn.Tanhshrink()
    if kind == "Hardshrink":
        return nn.Hardshrink(a.get("lambd", 0.5))
    if kind == "Softshrink":
        return nn.Softshrink(a.get("lambd", 0.5))
    if kind == "Threshold":
        return nn.Threshold(a["threshold"], a["value"])
    if kind == "PReLU":
        return nn.PReLU(a.get("num_parameters", 1))
    return None


# batch per case (default N)
NBATCH = {"mha_h4_n1": 1, "mha_h2_dropout_n5": 5}
NBATCH.update({k: len(v) for k, v in KPM_IDS.items()})
NBATCH["lstm_n1"] = 1   # recurrent layers: a batch of one
NBATCH.update(NBATCH_BI)
NBATCH.update(NBATCH_CELLS)
# attention masks: minGPT's block size per case (MaskedFill's twin is its tril buffer sliced to T); the form of
# the causal attn_mask the MultiheadAttention twin is called with (default: bool torch.triu(ones, 1))
MINGPT_BLOCK = {"mingpt_masked_t5_n8": 8, "mingpt_masked_t4_n4": 4}
MHA_MASK = {"mha_causal_h2": "float", "mha_causal_dropout": "float"}
# input scale per case (default 1): values past the hard activations' kinks
SCALE = {"hardtanh": 2.0, "hardtanh_default": 2.0, "relu6": 5.0, "hardswish": 4.0, "hardsigmoid": 4.0,
         "hard_blocked": 4.0}
SCALE.update({"normalize_eps": 0.7, "elu": 2.0, "selu": 2.0, "softplus": 3.0, "softplus_beta_threshold": 2.0, "mish": 3.0,
              "logsigmoid": 3.0, "pow3": 1.5})
SCALE.update(SCALE_ELEM3)
SCALE.update({"celu": 2.0, "celu_alpha2": 3.0, "softsign": 3.0, "tanhshrink": 2.0, "hardshrink_lambd": 2.0,
              "prelu": 2.0})


class MaskDropout(nn.Module):
    """Dropout / Dropout2d with the mask the test stores (train mode only)."""

    def __init__(self, channels):
        super().__init__()
        self.channels = channels
        self.mask = None

    def forward(self, x):
        if not self.training:
            return x
        m = self.mask
        if self.channels:
            m = m.reshape(m.shape + (1,) * (x.dim() - 2))
        return x * m


class TorchvisionStochasticDepth(nn.Module):
    """torchvision.ops.stochastic_depth itself (training mode), its noise
    recorded as this forward's mask: the draws are redone from the same RNG
    state as torchvision's own (its formula: bernoulli(1 - p) of shape
    [N, 1, ...] for 'row', [1, ...] for 'batch', divided by 1 - p when it is
    not 0) and checked to give torchvision's output."""

    def __init__(self, p, mode):
        super().__init__()
        self.p, self.mode = p, mode
        self.mask = None

    def forward(self, x):
        if not self.training:
            return torchvision.ops.stochastic_depth(x, self.p, self.mode, False)
        state = torch.get_rng_state()
        y = torchvision.ops.stochastic_depth(x, self.p, self.mode, True)
        after = torch.get_rng_state()
        torch.set_rng_state(state)
        size = [x.shape[0] if self.mode == "row" else 1] + [1] * (x.dim() - 1)
        noise = torch.empty(size, dtype=x.dtype).bernoulli_(1 - self.p)
        if self.p < 1:
            noise.div_(1 - self.p)
        assert torch.equal(torch.get_rng_state(), after), "torchvision drew otherwise"
        assert torch.equal(y, x * noise), "torchvision's stochastic depth is not x * noise"
        self.mask = noise.detach().flatten().clone()
        return y


class TorchAlphaDropout(MaskDropout):
    """F.alpha_dropout / F.feature_alpha_dropout themselves (training mode),
    their noise recorded as this forward's mask in psd's form (keep / (1 - p),
    (N, ...) or (N, C)): the draws are redone from the same RNG state as
    ATen's (bernoulli(1 - p) of the input's shape, or (N, C, 1, ...)) and the
    affine PyTorch applies is checked to give its output."""

    def forward(self, x):
        if not self.training:
            return x
        fn = F.feature_alpha_dropout if self.channels else F.alpha_dropout
        state = torch.get_rng_state()
        y = fn(x, self.p, True)
        after = torch.get_rng_state()
        torch.set_rng_state(state)
        shape = tuple(x.shape[:2]) + (1,) * (x.dim() - 2) if self.channels else tuple(x.shape)
        keep = torch.empty(shape, dtype=x.dtype).bernoulli_(1 - self.p)
        assert torch.equal(torch.get_rng_state(), after), "PyTorch drew otherwise"
        A = 1.7580993408473766
        a = 1.0 / math.sqrt((A * A * self.p + 1) * (1 - self.p))
        want = x * (keep * a) + ((keep - 1) * (A * a) + A * a * self.p)
        assert torch.allclose(y, want, rtol=1e-6, atol=1e-6), "PyTorch's alpha dropout is not a x + b"
        self.mask = (keep / (1 - self.p)).reshape(self.mask_shape).detach().clone()
        return y


class TorchRReLU(MaskDropout):
    """nn.RReLU in training through ATen's rrelu_with_noise itself, its
    noise (the slope of every value at or below 0, 1 elsewhere) recorded as
    this forward's mask: the slopes psd takes as injected draws. Eval:
    F.rrelu, the fixed slope (lower + upper) / 2."""

    def __init__(self, lower, upper):
        super().__init__(False)
        self.lower, self.upper = lower, upper

    def forward(self, x):
        if not self.training:
            return F.rrelu(x, self.lower, self.upper, False)
        noise = torch.empty_like(x)
        y = torch._C._nn.rrelu_with_noise(x, noise, self.lower, self.upper, True)
        self.mask = noise.detach().clone()
        return y


# ---- spatial transformers (the STN tutorial): AffineGrid (theta from a Linear of the input, viewed (2, 3)) and
# GridSample reading the input at that grid (the input's gradient through both paths, theta's through the Linear);
# and grids computed per point (a 1x1 Conv2d of the input, permuted to (H', W', 2), tanh times 1.4 so that some
# points lie outside [-1, 1]) under each padding mode, both align_corners, nearest
def stn_stage(shape, size, ac="false", gs=""):
    return stage(shape, ["{name: f, kind: Flatten}",
                         "{name: loc, kind: Linear, out_features: 6}",
                         "{name: theta, kind: Reshape, shape: [2, 3]}",
                         "{name: grid, kind: AffineGrid, size: %s, align_corners: %s}" % (json.dumps(size), ac),
                         "{name: gs, kind: GridSample, inputs: [input, grid], align_corners: %s%s}" % (ac, gs)])


def grid_stage(shape, gs):
    return stage(shape, ["{name: gc, kind: Conv2d, out_channels: 2, kernel_size: 1}",
                         "{name: gp, kind: Permute, dims: [0, 2, 3, 1]}",
                         "{name: gt, kind: Tanh}",
                         "{name: gm, kind: MulConstant, value: 1.4}",
                         "{name: gs, kind: GridSample, inputs: [input, gm]%s}" % gs])


CASES += [
    ("stn_affine", stn_stage([2, 6, 7], [4, 5])),
    ("stn_affine_ac_border", stn_stage([3, 5, 5], [6, 3], "true", ", padding_mode: border")),
    ("stn_affine_one_col", stn_stage([1, 4, 4], [3, 1])),
    ("gridsample_zeros", grid_stage([3, 5, 6], "")),
    ("gridsample_zeros_ac", grid_stage([2, 4, 7], ", align_corners: true")),
    ("gridsample_border", grid_stage([3, 5, 6], ", padding_mode: border")),
    ("gridsample_border_ac", grid_stage([2, 6, 4], ", padding_mode: border, align_corners: true")),
    ("gridsample_reflection", grid_stage([3, 5, 6], ", padding_mode: reflection")),
    ("gridsample_reflection_ac", grid_stage([2, 4, 5], ", padding_mode: reflection, align_corners: true")),
    ("gridsample_nearest", grid_stage([3, 5, 6], ", mode: nearest")),
    ("gridsample_nearest_border_ac", grid_stage([2, 5, 4], ", mode: nearest, padding_mode: border, "
                                                             "align_corners: true")),
]

# inputs at half scale: an eval output after the SGD step moves by ~20x a weight's rounding (grid_sample's
# d out / d grid is the input's differences times size / 2), beyond the tolerance at full scale
SCALE.update({name: 0.5 for name, _ in CASES if name.startswith(("stn_", "gridsample_"))})


def stn_module(kind, a):
    """The torch twin of AffineGrid (theta (N, 2, 3) -> F.affine_grid at (N, 1, H, W)) or GridSample, or None."""
    ac = a.get("align_corners", False)
    if kind == "AffineGrid":
        h, w = pair(a["size"])
        return Lambda(lambda t: F.affine_grid(t, [t.shape[0], 1, h, w], align_corners=ac))
    if kind == "GridSample":
        return Lambda(lambda x, g: F.grid_sample(x, g, mode=a.get("mode", "bilinear"),
                                                 padding_mode=a.get("padding_mode", "zeros"), align_corners=ac))
    return None


# ---- weight normalisation (nn.utils.weight_norm: weight_g, weight_v) of Linear, Conv1d, Conv2d and
# ConvTranspose2d: dim 0 (the default) and None (one norm of the whole weight), with and without bias; weight_g
# moved off ||weight_v|| (case()) so that w differs from v
CASES += [
    ("wnorm_linear", stage([5], ["{name: l, kind: Linear, out_features: 4, weight_norm: true}"])),
    ("wnorm_linear_none_nobias", stage([3, 5], ["{name: l, kind: Linear, out_features: 4, bias: false, "
                                                "weight_norm: true, weight_norm_dim: null}"])),
    ("wnorm_conv1d", stage([4, 12], ["{name: c, kind: Conv1d, out_channels: 6, kernel_size: 3, padding: 2, "
                                     "dilation: 2, weight_norm: true}"])),
    ("wnorm_conv2d_groups", stage([4, 6, 6], ["{name: c, kind: Conv2d, out_channels: 6, kernel_size: 3, groups: 2, "
                                              "padding: 1, weight_norm: true, weight_norm_dim: 0}"])),
    ("wnorm_conv2d_none", stage([16, 5, 5], ["{name: c, kind: Conv2d, out_channels: 16, kernel_size: 3, "
                                             "bias: false, weight_norm: true, weight_norm_dim: null}"])),
    ("wnorm_upconv", stage([4, 5, 5], ["{name: u, kind: ConvTranspose2d, out_channels: 6, kernel_size: 3, stride: 2, "
                                       "padding: 1, output_padding: 1, weight_norm: true}"])),
    ("wnorm_upconv_none", stage([4, 3, 4], ["{name: u, kind: ConvTranspose2d, out_channels: 4, kernel_size: 2, "
                                            "stride: 2, groups: 2, weight_norm: true, weight_norm_dim: null}"])),
    ("wnorm_net", stage([3, 16], ["{name: c, kind: Conv1d, out_channels: 8, kernel_size: 3, padding: 1, "
                                  "weight_norm: true}",
                                  "{name: a, kind: LeakyReLU, negative_slope: 0.1}",
                                  "{name: f, kind: Flatten}",
                                  "{name: l, kind: Linear, out_features: 5, weight_norm: true}"])),
]


def wnorm_module(kind, a, shapes, case_name):
    """nn.utils.weight_norm of the node's module (weight_norm: true), dim weight_norm_dim (default 0), or None."""
    if not a.get("weight_norm"):
        return None
    plain = {k: v for k, v in a.items() if k not in ("weight_norm", "weight_norm_dim")}
    return nn.utils.weight_norm(make_module(kind, plain, shapes, case_name), dim=a.get("weight_norm_dim", 0))


def pair(v):
    return tuple(v) if isinstance(v, list) else (v, v)


# ---- unfold: Unfold (F.unfold, im2col) and Fold (F.fold, col2im: overlaps summed): square and non-square kernels,
# stride 2, padding, dilation, a Fold whose stride skips pixels (their output and gradient 0), and Unfold -> Fold
CASES += [
    ("unfold_rect", stage([3, 5, 6], ["{name: u, kind: Unfold, kernel_size: [2, 3]}"])),
    ("unfold_stride_pad", stage([2, 7, 7], ["{name: u, kind: Unfold, kernel_size: 3, stride: 2, padding: 1}",
                                            "{name: o, kind: Linear, out_features: 3}"])),
    ("unfold_dilation", stage([2, 8, 9], ["{name: t, kind: Tanh}",
                                          "{name: u, kind: Unfold, kernel_size: [3, 2], dilation: [2, 3], "
                                          "padding: [1, 2], stride: [2, 1]}"])),
    ("fold_overlap", stage([12, 9], ["{name: f, kind: Fold, output_size: 4, kernel_size: 2}"])),
    ("fold_all", stage([12, 6], ["{name: f, kind: Fold, output_size: [5, 6], kernel_size: [2, 3], stride: 2, "
                                 "padding: 1, dilation: [1, 2]}",
                                 "{name: c, kind: Conv2d, out_channels: 3, kernel_size: 2}"])),
    ("fold_gaps", stage([8, 4], ["{name: f, kind: Fold, output_size: [5, 5], kernel_size: 2, stride: 3}"])),
    ("unfold_fold", stage([2, 6, 6], ["{name: u, kind: Unfold, kernel_size: 3, padding: 1}",
                                      "{name: s, kind: Sigmoid}",
                                      "{name: f, kind: Fold, output_size: 6, kernel_size: 3, padding: 1}"])),
]


def unfold_module(kind, a):
    """The torch twin of an Unfold or Fold node, or None for the other kinds."""
    if kind not in ("Unfold", "Fold"):
        return None
    kw = dict(kernel_size=a["kernel_size"], dilation=a.get("dilation", 1), padding=a.get("padding", 0),
              stride=a.get("stride", 1))
    if kind == "Unfold":
        return nn.Unfold(**kw)
    return nn.Fold(output_size=a["output_size"], **kw)


def make_module(kind, a, shapes, case_name=""):
    """The torch module of a node of case case_name, built when its input shapes are known."""
    s0 = shapes[0]   # per-sample input shape
    m = wnorm_module(kind, a, shapes, case_name)
    if m is not None:
        return m
    m = elem3_module(kind, a)
    if m is not None:
        return m
    m = ids2_module(kind, a)
    if m is not None:
        return m
    m = stn_module(kind, a)
    if m is not None:
        return m
    m = eltwise_module(kind, a, s0)
    if m is None:
        m = bcast_module(kind)
    if m is not None:
        return m
    m = shrink_module(kind, a, s0)
    if m is not None:
        return m
    m = cumsum_module(kind, a)
    if m is not None:
        return m
    m = unfold_module(kind, a)
    if m is not None:
        return m
    m = cell_module(kind, a, shapes)
    if m is not None:
        return m
    if kind == "Erf":
        return Lambda(torch.erf)
    if kind == "Sign":
        return Lambda(torch.sign)
    if kind == "Bilinear":
        return nn.Bilinear(s0[-1], shapes[1][-1], a["out_features"], bias=a.get("bias", True))
    if kind == "Conv2d":
        return nn.Conv2d(s0[0], a["out_channels"], pair(a["kernel_size"]), stride=pair(a.get("stride", 1)),
                         padding=pair(a.get("padding", 0)), dilation=pair(a.get("dilation", 1)),
                         groups=a.get("groups", 1), bias=a.get("bias", True))
    if kind == "Conv1d":
        return nn.Conv1d(s0[0], a["out_channels"], a["kernel_size"], stride=a.get("stride", 1),
                         padding=a.get("padding", 0), dilation=a.get("dilation", 1), groups=a.get("groups", 1),
                         bias=a.get("bias", True))
    if kind == "MaxPool1d":
        return nn.MaxPool1d(a["kernel_size"], stride=a.get("stride", a["kernel_size"]), padding=a.get("padding", 0),
                            ceil_mode=a.get("ceil_mode", False))
    if kind == "AvgPool1d":
        return nn.AvgPool1d(a["kernel_size"], stride=a.get("stride", a["kernel_size"]), padding=a.get("padding", 0),
                            count_include_pad=a.get("count_include_pad", True), ceil_mode=a.get("ceil_mode", False))
    if kind == "AdaptiveAvgPool1d":
        return nn.AdaptiveAvgPool1d(a["output_size"])
    if kind == "Linear":
        return nn.Linear(s0[-1], a["out_features"], bias=a.get("bias", True))
    if kind in ("BatchNorm2d", "BatchNorm1d"):
        cls = nn.BatchNorm2d if kind == "BatchNorm2d" else nn.BatchNorm1d
        return cls(s0[0], eps=a.get("eps", 1e-5), momentum=a.get("momentum", 0.1), affine=a.get("affine", True),
                   track_running_stats=a.get("track_running_stats", True))
    if kind == "LayerNorm":
        ns = a["normalized_shape"]
        return nn.LayerNorm(ns if isinstance(ns, list) else [ns], eps=a.get("eps", 1e-5),
                            elementwise_affine=a.get("elementwise_affine", True))
    if kind == "MaxPool2d":
        return nn.MaxPool2d(pair(a["kernel_size"]), stride=pair(a.get("stride", a["kernel_size"])),
                            padding=pair(a.get("padding", 0)), ceil_mode=a.get("ceil_mode", False))
    if kind == "AvgPool2d":
        return nn.AvgPool2d(pair(a["kernel_size"]), stride=pair(a.get("stride", a["kernel_size"])),
                            padding=pair(a.get("padding", 0)), count_include_pad=a.get("count_include_pad", True),
                            ceil_mode=a.get("ceil_mode", False))
    if kind == "AdaptiveAvgPool2d":
        o = a["output_size"]
        return nn.AdaptiveAvgPool2d(tuple(o) if isinstance(o, list) else o)
    if kind == "Embedding":
        return nn.Embedding(a["num_embeddings"], a["embedding_dim"], padding_idx=a.get("padding_idx"))
    if kind == "ReLU":
        return nn.ReLU()
    if kind == "LeakyReLU":
        return nn.LeakyReLU(a.get("negative_slope", 0.01))
    if kind == "GELU":
        return nn.GELU(approximate=a.get("approximate", "none"))
    if kind == "SiLU":
        return nn.SiLU()
    if kind == "Tanh":
        return nn.Tanh()
    if kind == "Sigmoid":
        return nn.Sigmoid()
    if kind == "Hardtanh":
        return nn.Hardtanh(a.get("min_val", -1.0), a.get("max_val", 1.0))
    if kind == "ReLU6":
        return nn.ReLU6()
    if kind == "Hardswish":
        return nn.Hardswish()
    if kind == "Hardsigmoid":
        return nn.Hardsigmoid()
    if kind == "Softmax":
        return nn.Softmax(dim=a["dim"])
    if kind == "LogSoftmax":
        return nn.LogSoftmax(dim=a["dim"])
    if kind == "Dropout":
        return MaskDropout(False)
    if kind == "Dropout2d":
        return MaskDropout(True)
    if kind == "RReLU":
        return TorchRReLU(a.get("lower", 1.0 / 8), a.get("upper", 1.0 / 3))
    if kind == "AlphaDropout":
        return TorchAlphaDropout(False)
    if kind == "FeatureAlphaDropout":
        return TorchAlphaDropout(True)
    if kind == "StochasticDepth":
        return TorchvisionStochasticDepth(a["p"], a["mode"])
    if kind == "Flatten":
        return nn.Flatten(a.get("start_dim", 1), a.get("end_dim", -1))
    if kind == "Reshape":
        shape = a["shape"]
        return Lambda(lambda x: x.reshape([x.shape[0]] + shape))
    if kind == "Add":
        return Lambda(lambda *xs: sum(xs[1:], xs[0]))
    if kind == "Mul":
        return Lambda(lambda a, b: a * b)
    if kind == "Concat":
        dim = a.get("dim", 1)
        return Lambda(lambda *xs: torch.cat(xs, dim))
    if kind == "Parameter":
        return Broadcast(a["shape"], a.get("expand", a["shape"]), a.get("parameter", "weight"))
    if kind == "MultiheadAttention" and a.get("cross", False):
        return CrossMHA(a["embed_dim"], a["num_heads"], a.get("dropout", 0.0), a.get("bias", True))
    if kind == "MultiheadAttention":
        assert a["batch_first"]
        causal = MHA_MASK.get(case_name, "bool") if a.get("causal", False) else None
        return MHA(a["embed_dim"], a["num_heads"], a.get("dropout", 0.0), a.get("bias", True), causal)
    if kind in ("LSTM", "GRU"):
        return RNN_KINDS[kind](input_size=shapes[0][1], hidden_size=a["hidden_size"],
                               num_layers=a.get("num_layers", 1), bias=a.get("bias", True),
                               batch_first=a.get("batch_first", False), dropout=a.get("dropout", 0.0),
                               bidirectional=a.get("bidirectional", False))
    if kind == "MaskedFill":
        value = float(a["value"])      # yaml reads -.inf as a float, -inf as a string
        r, c = s0[-2], s0[-1]
        if case_name in MINGPT_BLOCK:   # minGPT's own: its tril buffer of the block size, sliced to T
            n = MINGPT_BLOCK[case_name]
            assert a["mask"] == "triu" and a.get("diagonal", 0) == 1 and r == c and r <= n
            bias = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
            return Lambda(lambda x: x.masked_fill(bias[:, :, :r, :r] == 0, value))
        tri = torch.triu if a["mask"] == "triu" else torch.tril
        mask = tri(torch.ones(r, c), a.get("diagonal", 0)).bool()
        return Lambda(lambda x: x.masked_fill(mask, value))
    if kind == "Permute":
        dims = a["dims"]
        return Lambda(lambda x: x.permute(dims))
    if kind == "Scale":
        return Scale(a["shape"], a.get("parameter", "weight"))
    if kind == "ChannelShuffle":   # torchvision's channel_shuffle (nn.ChannelShuffle's forward; 1.13 has no
        g = a["groups"]              # backward for that one)
        return Lambda(lambda x: x.view(x.shape[0], g, x.shape[1] // g, *x.shape[2:]).transpose(1, 2)
                      .reshape(x.shape))
    if kind == "Narrow":
        dim, start, length, step = a.get("dim", 1), a["start"], a["length"], a.get("step", 1)
        return Lambda(lambda x: x[(slice(None),) * (dim % x.dim()) + (slice(start, start + (length - 1) * step + 1,
                                                                             step),)])
    if kind == "Roll":
        shifts, dims = a["shifts"], a["dims"]
        return Lambda(lambda x: torch.roll(x, shifts, dims))
    if kind == "Pad":
        pad, value, mode = a["pad"], a.get("value", 0.0), a.get("mode", "constant")
        if mode != "constant":
            return Lambda(lambda x: F.pad(x, pad, mode=mode))
        return Lambda(lambda x: F.pad(x, pad, value=value))
    if kind == "MatMul" and "parameter" in a:
        return ParamMatMul(a["shape"], a["parameter"], a.get("parameter_side", "right"),
                           a.get("transpose_a", False), a.get("transpose_b", False))
    if kind == "MatMul":
        ta, tb = a.get("transpose_a", False), a.get("transpose_b", False)
        return Lambda(lambda x, y: torch.matmul(x.transpose(-2, -1) if ta else x, y.transpose(-2, -1) if tb else y))
    if kind == "MulConstant":
        v = a["value"]
        return Lambda(lambda x: x * v)
    if kind == "RelativePositionBias":
        return RelPosBias(pair(a["window_size"]), a["num_heads"], pair(a.get("windows", 1)),
                          pair(a.get("shift_size", 0)))
    # upsampling
    if kind == "ConvTranspose2d":
        return nn.ConvTranspose2d(s0[0], a["out_channels"], pair(a["kernel_size"]), stride=pair(a.get("stride", 1)),
                                  padding=pair(a.get("padding", 0)), output_padding=pair(a.get("output_padding", 0)),
                                  groups=a.get("groups", 1), bias=a.get("bias", True),
                                  dilation=pair(a.get("dilation", 1)))
    if kind == "Upsample":
        sf = a.get("scale_factor")
        mode = a.get("mode", "nearest")
        return nn.Upsample(size=tuple(a["size"]) if "size" in a else None,
                           scale_factor=tuple(float(v) for v in sf) if isinstance(sf, list) else sf, mode=mode,
                           align_corners=a.get("align_corners", False) if mode == "bilinear" else None,
                           recompute_scale_factor=a.get("recompute_scale_factor"))
    if kind == "Eq":   # torch.eq: a bool tensor, as users pass key_padding_mask
        v = a["value"]
        return Lambda(lambda x: x == v)
    if kind == "IndexSelect":
        dim, index = a.get("dim", 1), torch.tensor(a["index"])
        return Lambda(lambda x: x.index_select(dim, index))
    raise ValueError(kind)


class Broadcast(nn.Module):
    """psd's Parameter kind: a tensor of its own (named as the file says; null: the node's name itself),
    broadcast to (N, *expand); leading 1s of its shape face the batch (vit's class_token.expand(n, -1, -1))."""

    def __init__(self, shape, expand, pname):
        super().__init__()
        self.pname = pname or "weight"
        self.top = pname is None
        self.register_parameter(self.pname, nn.Parameter(torch.randn(shape)))
        self.expand = expand

    def forward(self, x):
        w = getattr(self, self.pname)
        while w.dim() > len(self.expand) + 1:
            w = w.squeeze(0)
        return w.expand([x.shape[0]] + list(self.expand))


class MHA(nn.MultiheadAttention):
    """psd's MultiheadAttention kind: nn.MultiheadAttention (batch_first) as self-attention, attn(x, x, x,
    need_weights=False), its own parameters and state_dict names. In training with dropout, the dropout of the
    attention weights multiplies by the mask the test stores (self.mask, (N, H, L, L)): the same computation
    spelled out (F.multi_head_attention_forward's steps), checked against the module itself with a mask of ones
    (dropout off) when built."""

    def __init__(self, e, h, p, bias, causal=None):
        super().__init__(e, h, dropout=p, bias=bias, batch_first=True)
        self.p = p
        self.mask = None
        self.causal = causal   # the attn_mask's form: None (no mask), "bool" or "float"

    def attn_mask(self, L):
        """The causal attn_mask as users write it: torch.triu(ones, 1) as bool (True: not attended), or
        nn.Transformer.generate_square_subsequent_mask's float (-inf above the diagonal, 0 elsewhere)."""
        if self.causal == "bool":
            return torch.triu(torch.ones(L, L, dtype=torch.bool), 1)
        if self.causal == "float":
            return nn.Transformer.generate_square_subsequent_mask(L)
        return None

    def spelled(self, x, mask, kpm=None):
        n, L, e = x.shape
        h = self.num_heads
        d = e // h
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, -1)
        q, k, v = (t.reshape(n, L, h, d).transpose(1, 2) for t in (q, k, v))
        s = (q / math.sqrt(d)) @ k.transpose(-2, -1)
        am = self.attn_mask(L)
        if am is not None:   # as F.multi_head_attention_forward applies it: a bool filled with -inf, a float added
            s = s.masked_fill(am, float("-inf")) if am.dtype == torch.bool else s + am
        if kpm is not None:   # key_padding_mask (n, L): a bool one fills the masked keys with -inf, a float is added
            k4 = kpm[:, None, None, :]
            s = s.masked_fill(k4, float("-inf")) if kpm.dtype == torch.bool else s + k4
        a = torch.softmax(s, -1) * mask
        return self.out_proj((a @ v).transpose(1, 2).reshape(n, L, e))

    def forward(self, x, kpm=None):
        if self.training and self.p > 0:
            return self.spelled(x, self.mask, kpm)
        # with grad on: torch 1.13's no-grad fast path (_native_multi_head_attention) fails without a bias
        with torch.enable_grad():
            return super().forward(x, x, x, need_weights=False, attn_mask=self.attn_mask(x.shape[1]),
                                   key_padding_mask=kpm)[0]

    def check(self, x, kpm=None):
        p, self.dropout = self.dropout, 0.0
        with torch.enable_grad():
            want = super().forward(x, x, x, need_weights=False, attn_mask=self.attn_mask(x.shape[1]),
                                   key_padding_mask=kpm)[0].detach()
        self.dropout = p
        with torch.no_grad():
            got = self.spelled(x, torch.ones(self.mask_shape), kpm)
        assert torch.allclose(got, want, atol=1e-5), "the spelled-out attention is not nn.MultiheadAttention's"


class RNNStack:
    """psd's LSTM / GRU kinds: the module's output sequence (out of out, _ = rnn(x)), its own parameters and
    state_dict names. In training with dropout between layers, the layers one at a time (torch._VF's
    single-layer call, the module's own kernel, on the module's own weights) with the stored mask between
    them, time-major (num_layers - 1, L, N, H) as psd draws it; checked against the module itself with a mask
    of ones (dropout off) when built."""

    def setup(self):
        self.p = self.dropout
        self.mask = None

    def layered(self, x, mask):
        n = x.shape[0]
        for k in range(self.num_layers):
            if k:
                x = x * mask[k - 1].transpose(0, 1)
            names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if self.bias else [])
            dirs = ["", "_reverse"] if self.bidirectional else [""]
            ws = [getattr(self, "%s_l%d%s" % (w, k, r)) for r in dirs for w in names]
            h0 = x.new_zeros(len(dirs), n, self.hidden_size)
            bi = self.bidirectional
            if isinstance(self, nn.LSTM):
                x = torch._VF.lstm(x, (h0, h0), ws, self.bias, 1, 0.0, self.training, bi, True)[0]
            else:
                x = torch._VF.gru(x, h0, ws, self.bias, 1, 0.0, self.training, bi, True)[0]
        return x

    def forward(self, x):
        if self.training and self.p > 0:
            return self.layered(x, self.mask)
        return super().forward(x)[0]

    def check(self, x):
        p, self.dropout = self.dropout, 0.0
        with torch.no_grad():
            want = super().forward(x)[0]
            got = self.layered(x, torch.ones(self.mask_shape))
        self.dropout = p
        assert torch.allclose(got, want, atol=1e-6), "the layered RNN is not the module's"


class LSTMStack(RNNStack, nn.LSTM):
    def __init__(self, **kw):
        nn.LSTM.__init__(self, **kw)
        self.setup()


class GRUStack(RNNStack, nn.GRU):
    def __init__(self, **kw):
        nn.GRU.__init__(self, **kw)
        self.setup()


RNN_KINDS = {"LSTM": LSTMStack, "GRU": GRUStack}


class RelPosBias(nn.Module):
    """psd's RelativePositionBias kind: torchvision's swin table and index (ShiftedWindowAttention's own
    define_* methods) through its _get_relative_position_bias, the same for every window, plus (with a shift)
    the attention mask as shifted_window_attention builds it (its lines, verbatim), for every sample."""

    def __init__(self, window, heads, windows, shift):
        super().__init__()
        self.window_size, self.num_heads = list(window), heads
        swin.ShiftedWindowAttention.define_relative_position_bias_table(self)
        swin.ShiftedWindowAttention.define_relative_position_index(self)
        with torch.no_grad():    # away from trunc_normal_'s 0.02 so the bias shows beside the scores
            self.relative_position_bias_table.normal_(0, 0.5)
        self.windows, self.shift_size = list(windows), list(shift)

    def forward(self, x):
        window_size, shift_size = self.window_size, self.shift_size
        b = swin._get_relative_position_bias(self.relative_position_bias_table, self.relative_position_index,
                                             window_size)                  # (1, heads, N, N)
        num_windows = self.windows[0] * self.windows[1]
        b = b.expand(num_windows, -1, -1, -1)
        if sum(shift_size) > 0:
            pad_H, pad_W = self.windows[0] * window_size[0], self.windows[1] * window_size[1]
            attn_mask = x.new_zeros((pad_H, pad_W))
            h_slices = ((0, -window_size[0]), (-window_size[0], -shift_size[0]), (-shift_size[0], None))
            w_slices = ((0, -window_size[1]), (-window_size[1], -shift_size[1]), (-shift_size[1], None))
            count = 0
            for h in h_slices:
                for w in w_slices:
                    attn_mask[h[0] : h[1], w[0] : w[1]] = count
                    count += 1
            attn_mask = attn_mask.view(pad_H // window_size[0], window_size[0], pad_W // window_size[1],
                                       window_size[1])
            attn_mask = attn_mask.permute(0, 2, 1, 3).reshape(num_windows, window_size[0] * window_size[1])
            attn_mask = attn_mask.unsqueeze(1) - attn_mask.unsqueeze(2)
            attn_mask = attn_mask.masked_fill(attn_mask != 0, float(-100.0)).masked_fill(attn_mask == 0, float(0.0))
            b = b + attn_mask.unsqueeze(1)
        return b.unsqueeze(0).expand(x.shape[0], -1, -1, -1, -1)


class Scale(nn.Module):
    """psd's Scale kind: x times a learned tensor of its own (named as the file says), broadcast."""

    def __init__(self, shape, pname):
        super().__init__()
        self.pname = pname
        self.register_parameter(pname, nn.Parameter(torch.randn(shape)))

    def forward(self, x):
        return getattr(self, self.pname) * x


class ParamMatMul(nn.Module):
    """psd's MatMul with a parameter: torch.matmul of x and a learned tensor of its own (named as the file
    says; null: the node's name itself), on the right (x @ W) or the left (W @ x), either read transposed
    (W.transpose(-2, -1): x @ W.t()); torch.matmul broadcasts it over the batch and the leading dims."""

    def __init__(self, shape, pname, side, ta, tb):
        super().__init__()
        self.pname = pname or "weight"
        self.top = pname is None
        self.register_parameter(self.pname, nn.Parameter(torch.randn(shape) * 0.5))
        self.left, self.ta, self.tb = side == "left", ta, tb

    def forward(self, x):
        w = getattr(self, self.pname)
        a, b = (w, x) if self.left else (x, w)
        return torch.matmul(a.transpose(-2, -1) if self.ta else a, b.transpose(-2, -1) if self.tb else b)


class Lambda(nn.Module):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def forward(self, *xs):
        return self.f(*xs)


# ---- cross-attention (encoder-decoder Transformers: nn.TransformerDecoderLayer's multihead_attn) ----
# MultiheadAttention with cross: true, attn(q, mem, mem, need_weights=False): queries from one tensor, keys and
# values from a memory of another length - cut from one input by Narrows (4 queries, 5 memory rows), so that
# grad_input holds both inputs' gradients; without bias and with attention dropout (stored masks (N, H, 4, 5)),
# the memory through a Linear; and with the memory's key padding mask (Eq of the ids, narrowed to the memory).
CROSS_Q = "{name: q, kind: Narrow, dim: 1, start: 0, length: 4, input: %s}"
CROSS_M = "{name: m, kind: Narrow, dim: 1, start: 4, length: 5, input: %s}"
CASES += [
    ("cross_h2", stage([9, 8], [CROSS_Q % "input", CROSS_M % "input",
                                "{name: a, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true, "
                                "cross: true, inputs: [q, m]}"])),
    ("cross_h4_dropout_nobias", stage([9, 8], [
        CROSS_Q % "input", CROSS_M % "input", "{name: ml, kind: Linear, out_features: 8, input: m}",
        "{name: a, kind: MultiheadAttention, embed_dim: 8, num_heads: 4, dropout: 0.25, bias: false, "
        "batch_first: true, cross: true, inputs: [q, ml]}",
        "{name: o, kind: Linear, out_features: 3}"])),
    ("cross_kpm_h2", stage([9], [KPM_EMB, KPM_EQ, CROSS_Q % "emb", CROSS_M % "emb",
                                 "{name: mp, kind: Narrow, dim: 1, start: 4, length: 5, input: pad}",
                                 "{name: a, kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true, "
                                 "cross: true, inputs: [q, m, mp]}"], "int64")),
]
KPM_IDS["cross_kpm_h2"] = [9, 7, "mid"]   # memory rows 4..8: none padded, two, all but token 5

# ---- BatchNorm then ReLU: the dnnl backend folds the ReLU (ReLU6, Hardtanh(0, max), LeakyReLU) into the batch
# norm (server/nn/exec.c fuse_bn_relu) ----
# BatchNorm1d of (N, C) features, 20 channels (lane groups of 16 and 4); BatchNorm2d without affine on 16 channels
# (blocked); on 5 channels (plain, one channel a group); and a BatchNorm whose output a ReLU and a Conv both read
# (not folded), its ReLU beside it.
CASES += [
    ("bn_relu_mlp", stage([5], ["{name: l, kind: Linear, out_features: 20}", "{name: bn, kind: BatchNorm1d}",
                                "{name: r, kind: ReLU}", "{name: o, kind: Linear, out_features: 4}"])),
    ("bn_relu_noaffine_blocked", stage([16, 4, 4], ["{name: bn, kind: BatchNorm2d, affine: false}",
                                                    "{name: r, kind: ReLU}",
                                                    "{name: o, kind: Conv2d, out_channels: 4, kernel_size: 1}"])),
    ("bn_relu_plain", stage([5, 4, 4], ["{name: bn, kind: BatchNorm2d}", "{name: r, kind: ReLU}",
                                        "{name: o, kind: Conv2d, out_channels: 3, kernel_size: 1}"])),
    ("bn_relu_shared_out", stage([16, 3, 3], ["{name: bn, kind: BatchNorm2d}", "{name: r, kind: ReLU}",
                                              "{name: c, kind: Conv2d, out_channels: 16, kernel_size: 1, input: bn}",
                                              "{name: s, kind: Add, inputs: [r, c]}"])),
    # the other activations it folds: ReLU6 (blocked), LeakyReLU over features, Hardtanh(0, 0.5) (plain: many
    # values at the cap); Hardtanh(-1, 1) is not ReLU-shaped and stays apart
    ("bn_relu6_blocked", stage([16, 4, 4], ["{name: bn, kind: BatchNorm2d}", "{name: r, kind: ReLU6}",
                                            "{name: o, kind: Conv2d, out_channels: 4, kernel_size: 1}"])),
    ("bn_relu_leaky_mlp", stage([5], ["{name: l, kind: Linear, out_features: 20}", "{name: bn, kind: BatchNorm1d}",
                                      "{name: r, kind: LeakyReLU, negative_slope: 0.2}",
                                      "{name: o, kind: Linear, out_features: 4}"])),
    ("bn_relu_hardtanh_plain", stage([5, 4, 4], ["{name: bn, kind: BatchNorm2d}",
                                                 "{name: r, kind: Hardtanh, min_val: 0.0, max_val: 0.5}",
                                                 "{name: o, kind: Conv2d, out_channels: 3, kernel_size: 1}"])),
    ("bn_relu_hardtanh_nofold", stage([16, 3, 3], ["{name: bn, kind: BatchNorm2d}",
                                                   "{name: r, kind: Hardtanh, min_val: -1.0, max_val: 1.0}",
                                                   "{name: o, kind: Conv2d, out_channels: 4, kernel_size: 1}"])),
]


class CrossMHA(MHA):
    """psd's MultiheadAttention with cross: true: nn.MultiheadAttention (batch_first) as attn(q, mem, mem,
    need_weights=False, key_padding_mask=kpm), spelled out in training with dropout (the stored mask (N, H, L,
    S)), checked against the module itself when built."""

    def spelled(self, x, mask, mem=None, kpm=None):
        n, L, e = x.shape
        S = mem.shape[1]
        h = self.num_heads
        d = e // h
        w, b = self.in_proj_weight, self.in_proj_bias
        q = F.linear(x, w[:e], None if b is None else b[:e])
        k = F.linear(mem, w[e:2 * e], None if b is None else b[e:2 * e])
        v = F.linear(mem, w[2 * e:], None if b is None else b[2 * e:])
        q = q.reshape(n, L, h, d).transpose(1, 2)
        k, v = (t.reshape(n, S, h, d).transpose(1, 2) for t in (k, v))
        s = (q / math.sqrt(d)) @ k.transpose(-2, -1)
        if kpm is not None:
            s = s.masked_fill(kpm[:, None, None, :], float("-inf"))
        a = torch.softmax(s, -1) * mask
        return self.out_proj((a @ v).transpose(1, 2).reshape(n, L, e))

    def forward(self, x, mem, kpm=None):
        if self.training and self.p > 0:
            return self.spelled(x, self.mask, mem, kpm)
        with torch.enable_grad():
            return nn.MultiheadAttention.forward(self, x, mem, mem, need_weights=False, key_padding_mask=kpm)[0]

    def check(self, x, mem, kpm=None):
        p, self.dropout = self.dropout, 0.0
        with torch.enable_grad():
            want = nn.MultiheadAttention.forward(self, x, mem, mem, need_weights=False,
                                                 key_padding_mask=kpm)[0].detach()
        self.dropout = p
        with torch.no_grad():
            got = self.spelled(x, torch.ones(self.mask_shape), mem, kpm)
        assert torch.allclose(got, want, atol=1e-5), "the spelled-out cross-attention is not nn.MultiheadAttention's"


class Net(nn.Module):
    """A model file's stage as a torch module (nodes in file order)."""

    def __init__(self, spec, x, case_name=""):
        super().__init__()
        st = spec["stages"][0]
        self.nodes = []
        self.shared = set()   # nodes with share: (their tensors are the owner's, listed once under its name)
        self.mods = nn.ModuleList()
        vals = {"input": x}
        prev = "input"
        for nd in st["nodes"]:
            ins = nd.get("inputs") or [nd.get("input", prev)]
            a = {k: v for k, v in nd.items() if k not in ("name", "kind", "input", "inputs", "init", "share")}
            if "share" in nd:   # a later call of one module: the first node's module itself
                m = next(om for on, _, _, om in self.nodes if on == nd["share"])
                self.shared.add(nd["name"])
            else:
                m = make_module(nd["kind"], a, [tuple(vals[i].shape[1:]) for i in ins], case_name)
            self.mods.append(m)
            self.nodes.append((nd["name"], nd["kind"], ins, m))
            if isinstance(m, MaskDropout):
                m.p = a.get("p", 0.5)
                m.mask_shape = mask_shape(m, vals[ins[0]])
                m.mask = torch.ones(m.mask_shape)
            if isinstance(m, RNNStack):   # the dropout mask between layers, time-major
                xi = vals[ins[0]]
                m.mask_shape = (m.num_layers - 1, xi.shape[1], xi.shape[0], (2 if m.bidirectional else 1) * m.hidden_size)
                m.mask = torch.ones(m.mask_shape)
                m.check(xi)
            if isinstance(m, MHA):
                xi = vals[ins[0]]
                m.mask_shape = (xi.shape[0], m.num_heads, xi.shape[1],
                                vals[ins[1]].shape[1] if isinstance(m, CrossMHA) else xi.shape[1])
                m.mask = torch.ones(m.mask_shape)
                m.check(*[vals[i] for i in ins])
            vals[nd["name"]] = m(*[vals[i] for i in ins])
            prev = nd["name"]
        self.out = st.get("output", prev)

    def forward(self, x):
        vals = {"input": x}
        for name, _, ins, m in self.nodes:
            vals[name] = m(*[vals[i] for i in ins])
        return vals[self.out]


def mask_shape(m, x):
    return tuple(x.shape[:2]) if m.channels else tuple(x.shape)


def key_of(name, m, k):
    """psd's state_dict name of a node's tensor k: <node>.<k>, or the node's name for a top-level Parameter."""
    return name if getattr(m, "top", False) else "%s.%s" % (name, k)


def sd_items(net):
    """(state_dict key, tensor, is_buffer) of every node, named as psd names them."""
    out = []
    for name, kind, _, m in net.nodes:
        if name in net.shared:
            continue
        params = dict(m.named_parameters())
        for k, v in m.state_dict().items():
            out.append((key_of(name, m, k), v, k not in params))
    return out


def case(idx, name, text):
    torch.manual_seed(1000 + idx)
    spec = yaml.safe_load(text)
    st = spec["stages"][0]
    shape = [NBATCH.get(name, N)] + st["input"]["shape"]
    integer = st["input"].get("dtype") == "int64"
    rows = 7 if integer else 0

    def data():
        if name in KPM_IDS:
            return kpm_ids(name, shape)
        if name in ROUNDED:
            return torch.round(torch.randn(shape) * 1.5)
        return torch.randint(0, rows, shape) if integer else torch.randn(shape) * SCALE.get(name, 1.0)
    x1, x2, xe = data(), data(), data()
    net = Net(spec, x1, name)
    t = {}
    for k, v, buf in sd_items(net):   # int64 buffers as the module builds them (psd's own initial values; not
        if buf and v.dtype == torch.int64 and not k.endswith("num_batches_tracked"):   # the count Net's build moved
            t["%s.ownbuf.%s" % (name, k)] = v.detach().clone()
    with torch.no_grad():   # BatchNorm/LayerNorm away from ones/zeros; running stats moved; a count
        for _, kind, _, m in net.nodes:
            if kind in ("BatchNorm2d", "BatchNorm1d", "LayerNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d") \
                    and getattr(m, "weight", None) is not None:
                m.weight.add_(0.2 * torch.randn_like(m.weight))
                m.bias.add_(0.2 * torch.randn_like(m.bias))
            if kind == "MultiheadAttention" and m.in_proj_bias is not None:   # PyTorch's are zeros
                m.in_proj_bias.add_(0.2 * torch.randn_like(m.in_proj_bias))
                m.out_proj.bias.add_(0.2 * torch.randn_like(m.out_proj.bias))
            if kind.startswith("BatchNorm") and m.track_running_stats:
                m.running_mean.add_(0.3 * torch.randn_like(m.running_mean))
                m.running_var.mul_(torch.empty_like(m.running_var).uniform_(0.5, 2.0))
                m.num_batches_tracked.fill_(3)
            if getattr(m, "weight_g", None) is not None:   # weight_norm: g off ||v||, so w is not v
                m.weight_g.mul_(torch.empty_like(m.weight_g).uniform_(0.5, 2.0))
            if kind == "PReLU":   # each slope its own, some above 1, some negative
                m.weight.add_(0.6 * torch.randn_like(m.weight))
            if kind == "RelativePositionBias" and name == "rpb_rect":   # a loaded index other than the formula's:
                m.relative_position_index.copy_(m.relative_position_index.flip(0))   # psd gathers by the buffer
    has_bn = any(k.startswith("BatchNorm") for _, k, _, _ in net.nodes)
    forwards = 2 if has_bn else 1
    for k, v, buf in sd_items(net):
        t["%s.%s.%s" % (name, "initbuf" if buf else "init", k)] = v.detach().clone()
    drops = [m for _, _, _, m in net.nodes if isinstance(m, (MaskDropout, TorchvisionStochasticDepth, MHA, RNNStack))]
    opt = torch.optim.SGD(net.parameters(), lr=LR) if list(net.parameters()) else None
    net.train()
    xs = [x1, x2]
    for f in range(forwards):
        x = xs[f].clone()
        if not integer:
            x.requires_grad_(True)
        for m in drops:   # this forward's masks (every forward has the batch's shapes)
            if isinstance(m, (MaskDropout, MHA, RNNStack)):   # MHA, LSTM, GRU: every one a dropout node (ones at dropout 0)
                m.mask = (torch.rand(m.mask_shape) >= m.p).float() / (1 - m.p)
        y = net(x)
        for k, m in enumerate(drops):   # stochastic depth drew its own in the forward
            t["%s.mask%d.%d" % (name, k, f + 1)] = m.mask.clone()
        go = torch.randn_like(y)
        t["%s.go%d" % (name, f + 1)] = go
        t["%s.x%d" % (name, f + 1)] = xs[f]
        y.backward(go)
        if f == 0:
            t["%s.out1" % name] = y.detach().clone()
            if not integer:
                t["%s.grad_input" % name] = x.grad.detach().clone()
            for nname, kind, _, m in net.nodes:
                if nname in net.shared:
                    continue
                for pn, p in m.named_parameters():
                    g = p.grad if p.grad is not None else torch.zeros_like(p)
                    t["%s.grad.%s" % (name, key_of(nname, m, pn))] = g.detach().clone()
    if opt:
        opt.step()
    for k, v, buf in sd_items(net):
        t["%s.%s.%s" % (name, "buf" if buf else "final", k)] = v.detach().clone()
    net.eval()
    with torch.no_grad():
        t["%s.eval_out" % name] = net(xe).detach().clone()
    t["%s.xe" % name] = xe
    meta = {"%s.yaml" % name: text, "%s.n" % name: str(N), "%s.forwards" % name: str(forwards)}
    return t, meta


def generate(path):
    tensors, meta = {}, {}
    names = []
    for i, (name, text) in enumerate(CASES):
        t, m = case(i, name, text)
        tensors.update(t)
        meta.update(m)
        names.append(name)
    meta["cases"] = ",".join(names)
    write_safetensors(path, tensors, meta)
    back, bmeta = read_safetensors(path)
    assert bmeta["cases"] == meta["cases"]
    for k, v in tensors.items():
        assert torch.equal(back[k], v), k
    print("wrote %s: %d cases, %d tensors, %d bytes" % (path, len(names), len(tensors), os.path.getsize(path)))


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                               "tests", "golden", "kinds.safetensors")
    generate(out)
