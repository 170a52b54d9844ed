#!/usr/bin/python3
"""tests/it_wnorm.sh's Python half: weight normalisation (nn.utils.weight_norm) through psd-export and psd, against
PyTorch (tests/export/wnorm.py):

  WNConvNet  weight_norm(Conv1d) (dim 0), weight_norm(Conv1d, dim=None) without bias, weight_norm(Linear)
  WNUpNet    weight_norm(Conv2d), weight_norm(ConvTranspose2d) (dim 0: its in_channels), a plain Linear

Each is exported (nodes with weight_norm: true, weight_norm_dim: null for dim=None; weights weight_g and weight_v as
PyTorch names them), every parameter moved off its initial value (weight_g off ||weight_v||, so the weight is not
weight_v), psd started with --init-from those values and checked by check_rnn.checked: the input gradient, and
check_resnet.py's run() with ref64 - psd's initial parameters named and valued as the state_dict, the eval and
training forwards, every gradient (weight_g, weight_v, bias) of one backward against float64 autograd (within 8x
PyTorch float32's own error or 1e-4 of the tensor's largest), the step, psd's tensors loading into the module with
load_state_dict(strict=True); then 30 SGD steps through psd, each step's loss within 1e-5 of PyTorch's own loop.
psd's own initialisation (no --init-from): every weight_g is ||weight_v|| over all dims but weight_norm's dim, as
nn.utils.weight_norm sets it (so the weight starts as weight_v, PyTorch's default layer's). Both models' training-mode
ONNX exports (weight_norm as ReduceL2, Div and Mul of the initializers before the Gemm / Conv / ConvTranspose) through
psd's ONNX import, checked by run() the same way (weight_g and weight_v under their names). And psd-export's refusals,
each naming the module and what to do: nn.utils.spectral_norm, torch.nn.utils.prune, weight_norm(dim=1), weight_norm
of an LSTM's weight_hh_l0, a Linear holding a buffer its kind does not
read, a Linear under torch.nn.utils.parametrizations.orthogonal.

    check_wnorm.py BUILD_DIR TMP_DIR
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import wnorm  # noqa: E402

BATCH = 6
CASES = [("WNConvNet", wnorm.WNConvNet, [4, 16]), ("WNUpNet", wnorm.WNUpNet, [3, 5, 5])]


def export(pe, cls, name, shape):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "wnorm.py") + ":" + cls.__name__, "--seed", "3", "-o", y,
                  "--input-shape", ",".join(map(str, shape))])
    return rc, y


def own_init(label, y, model):
    """psd without --init-from: weight_g = ||weight_v|| over every dim but weight_norm's (PyTorch's
    norm_except_dim), the dim read from the module's hook (-1: dim=None, one norm)."""
    stub, p = cr.start_psd(label + "_own", "file: %s" % y, [])
    got = cr.get_parameters(stub)
    p.kill()
    dims = {name + "." + h.name + "_g": h.dim for name, m in model.named_modules()
            for h in m._forward_pre_hooks.values() if type(h).__name__ == "WeightNorm"}
    worst = 0.0
    for k, dim in dims.items():
        v = torch.from_numpy(np.array(got[k[:-2] + "_v"])).double()
        want = torch.norm_except_dim(v, 2, dim).numpy()
        g = np.array(got[k]).reshape(want.shape)
        worst = max(worst, float(np.max(np.abs(g - want) / np.abs(want))))
    cr.check(len(dims) >= 2 and worst <= 1e-6, "%s: psd's own init: %d weight_g are ||weight_v|| of its draw, as "
             "weight_norm sets them (worst relative error %.3g)" % (label, len(dims), worst))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls, shape) in enumerate(CASES):
        name = "wnorm_%d" % i
        rc, y = export(pe, cls, name, shape)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        text = open(y).read()
        cr.check(text.count("weight_norm: true") == (3 if cls is wnorm.WNConvNet else 2) and
                 ("weight_norm_dim: null" in text) == (cls is wnorm.WNConvNet),
                 "%s: psd-export writes weight_norm (and weight_norm_dim null for dim=None) on its nodes" % label)
        model, w = cr.moved(cls, name, seed=3)
        torch.manual_seed(20 + i)
        x, target = torch.randn([BATCH] + shape), torch.randint(0, 4, (BATCH,))
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=True, steps=30)
        own_init(label, y, model)
        cr.onnx_run(label + " (ONNX)", model, x, target, "wnorm_onnx_%d" % i)
    cr.refused(lambda cls, name: export(pe, cls, name, [3, 8] if cls is wnorm.WNLstm else [8]), (
        (wnorm.SpectralNet, "by SpectralNorm from bias, weight_orig, weight_u, weight_v (its state_dict), which psd's "
                            "Linear cannot read: remove it with torch.nn.utils.remove_spectral_norm(module)"),
        (wnorm.PrunedNet, "by L1Unstructured from bias, weight_orig, weight_mask (its state_dict), which psd's Linear "
                          "cannot read: make the pruning permanent with torch.nn.utils.prune.remove"),
        (wnorm.WNDim1, "nn.utils.weight_norm(dim=1): psd maps nn.utils.weight_norm(module) of a Linear"),
        (wnorm.WNLstm, "'weight_hh_l0' is under nn.utils.weight_norm(dim=0)"),
        (wnorm.ExtraBuffer, "it holds weight, bias, scale, and psd's Linear reads weight, bias"),
        (wnorm.Orthogonal, "its weight is computed by torch.nn.utils.parametrize from bias, parametrizations.weight."
                           "original, parametrizations.weight.0.base: psd reads plain tensors; remove it with")))


if __name__ == "__main__":
    cr.run_main(main)
