#!/usr/bin/python3
"""Write tests/fuzz/corpus/onnx: seeds for fuzz_onnx (make fuzz), each a
small ONNX model (under the fuzzer's 70 KB input limit):

  tiny_train_13.onnx   a tiny CNN exported by PyTorch in training mode
                       (opset 13): Conv, BatchNormalization (5 outputs),
                       Relu, a zero Pad before AveragePool, Dropout with its
                       ratio and training_mode inputs, Flatten, Gemm, the
                       GELU, SiLU and LayerNorm decompositions, Reshape with
                       its shape computed from constants
  tiny_eval_11.onnx    the same module's eval export at opset 11 (BatchNorm
                       folded, onnx::* names, constant-folded shapes)
  lm_train_13.onnx     word_language_model's RNNModel (ntoken 20, 4 wide, 2
                       layers) in training mode: Gather, the LSTM weight glue
                       (Slice, Concat, Unsqueeze of weight_ih_l<k>...), two
                       LSTM layers with their hidden state in and out,
                       MatMul of a Transpose, the trainer's Reshape tail
  mha_train_13.onnx    a tiny vit block in training mode: a class token's
                       Expand, Concat, a positional embedding's Add, and
                       nn.MultiheadAttention (8 wide, 2 heads, dropout 0.1)
                       as the exporter decomposes it (Transposes, the
                       in-projection's Slices by Shape arithmetic, Reshapes
                       into the heads, Div, Softmax, Dropout, Gemm)
  users_13.onnx        users' ops in training mode: nn.PixelShuffle
                       (DepthToSpace), attention by torch.einsum (Einsum),
                       torch.sign, torch.randn_like (RandomNormalLike) and
                       two graph outputs (a VAE's mu and sample)
  rnn_dyn_13.onnx      an nn.LSTM exported with a dynamic batch: its initial
                       states a ConstantOfShape of Shape arithmetic
  node_*.onnx          a few of Debian libonnx-testdata's node test models
                       (Gather, Concat, Softmax, Gemm, DepthToSpace,
                       GridSample, Split with two outputs)
  conv_stride0.onnx    a make fuzz finding kept as a seed (a Conv with a
                       stride of 0); not written by this script

    /usr/bin/python3 tests/fuzz/make_onnx_corpus.py
"""
import os
import shutil
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus/onnx")
NODE = "/usr/share/libonnx-testdata/data/node"


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.AvgPool2d(3, 1, 1)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(4 * 4 * 4, 8)
        self.ln = nn.LayerNorm(8)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv(x))))
        x = self.drop(torch.flatten(x, 1))
        x = F.silu(F.gelu(self.ln(self.fc(x))))
        return x.view(x.size(0), 2, 4)


class TinyVit(nn.Module):
    def __init__(self):
        super().__init__()
        self.class_token = nn.Parameter(torch.randn(1, 1, 8))
        self.pos_embedding = nn.Parameter(torch.randn(1, 4, 8))
        self.attn = nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True)

    def forward(self, x):
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        return self.attn(x, x, x, need_weights=False)[0]


class Users(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, 3, padding=1)
        self.up = nn.PixelShuffle(2)
        self.q, self.k = nn.Linear(4, 4), nn.Linear(4, 4)
        self.mu, self.logvar = nn.Linear(16, 4), nn.Linear(16, 4)

    def forward(self, x):
        h = self.up(self.conv(x)).flatten(2).transpose(1, 2)          # (N, 16, 4): 16 tokens of 4
        h = h * torch.sign(h)
        a = torch.einsum("bqd,bkd->bqk", self.q(h), self.k(h)).softmax(-1)
        h = torch.einsum("bqk,bkd->bqd", a, h).mean(-1)                # (N, 16)
        mu, logvar = self.mu(h), self.logvar(h)
        return mu, mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)


class RnnDyn(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.fc = nn.LSTM(3, 4, batch_first=True), nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


def main():
    warnings.simplefilter("ignore")
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    m, x = Tiny(), torch.randn(2, 2, 4, 4)
    torch.onnx.export(m, x, os.path.join(OUT, "tiny_train_13.onnx"), opset_version=13,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    torch.onnx.export(m.eval(), x, os.path.join(OUT, "tiny_eval_11.onnx"), opset_version=11)
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(OUT), "..", "..", "..", "examples", "models"))
    from rpc_tutorials import RNNModel
    lm = RNNModel("LSTM", 20, 4, 4, 2, 0.0)
    ids = torch.randint(0, 20, (3, 2))
    torch.onnx.export(lm, (ids, lm.init_hidden(2)), os.path.join(OUT, "lm_train_13.onnx"), opset_version=13,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    torch.onnx.export(TinyVit(), torch.randn(2, 3, 8), os.path.join(OUT, "mha_train_13.onnx"), opset_version=13,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    torch.onnx.export(Users(), torch.randn(2, 1, 2, 2), os.path.join(OUT, "users_13.onnx"), opset_version=13,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    torch.onnx.export(RnnDyn(), torch.randn(2, 5, 3), os.path.join(OUT, "rnn_dyn_13.onnx"), opset_version=13,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "N"}, "y": {0: "N"}})
    for t in ("test_gather_1", "test_concat_2d_axis_0", "test_softmax_axis_1", "test_gemm_default_matrix_bias",
              "test_conv_with_autopad_same", "test_reshape_negative_dim", "test_batchnorm_example",
              "test_depthtospace_crd_mode", "test_gridsample", "test_split_equal_parts_2d"):
        shutil.copy(os.path.join(NODE, t, "model.onnx"), os.path.join(OUT, "node_%s.onnx" % t[5:]))
    for f in sorted(os.listdir(OUT)):
        print(f, os.path.getsize(os.path.join(OUT, f)))


if __name__ == "__main__":
    main()
