#!/usr/bin/python3
"""tests/it_upsampling.sh's Python half: decoders and U-Nets through psd.

tests/export/upsampling.py's ConvAutoencoder (strided Conv2d down,
ConvTranspose2d with output_padding up; Fashion-MNIST's 1x28x28) and UNet
(strided convolutions down; nn.UpsamplingNearest2d, nn.Upsample bilinear,
F.interpolate nearest to the skip's size (read from its shape), nn.UpsamplingBilinear2d (align_corners)
and a 2x2 stride-2 ConvTranspose2d up; the skips joined by torch.cat):

  - psd-export writes the nodes expected (kinds and attributes);
  - psd (dnnl backend) started with the exported model file and --init-from
    the module's state_dict holds those values exactly;
  - an eval Forward and a training Forward against the module in float64
    (within 1e-5 of the output's largest |value|), and one Backward of a
    mean-squared-error gradient (the autoencoder's against its input):
    the input gradient and every parameter gradient within 1e-4 of that
    tensor's largest |value| of float64 autograd's;
  - the same through the module's ONNX export (opset 13, training mode:
    psd's ONNX import reads ConvTranspose and Resize), where the importer
    takes it;
  - what psd-export refuses (ConvTranspose2d called with output_size,
    bicubic, nearest-exact, a size computed from the batch size, a
    1-d Upsample) is refused naming the call and its line.

    check_upsampling.py BUILD_DIR TMP_DIR
"""
import contextlib
import copy
import io
import os
import random
import sys
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "export"))
import check_resnet as cr  # noqa: E402  (its helpers: psd over gRPC; argv BUILD_DIR TMP_DIR)
import compare  # noqa: E402
import upsampling  # noqa: E402

TMP = sys.argv[2]
SRC = os.path.join(ROOT, "tests", "export", "upsampling.py")


def rel_close(got, want, tol, what):
    got, want = np.asarray(got, dtype=np.float64).reshape(np.shape(want)), np.asarray(want, dtype=np.float64)
    e = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
    cr.check(e <= tol, "%s: within %g of its largest |value| of float64 autograd's (%.3g)" % (what, tol, e))


def numeric(label, stub, model, x, target):
    """psd's parameters, forwards and one backward against the module in float64."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    got = cr.get_parameters(stub)
    bad = [k for k in sd if k not in got or not np.array_equal(got[k].reshape(sd[k].shape), sd[k])]
    cr.check(set(got) == set(sd) and not bad, "%s: psd's parameters are the state_dict's, exactly (%s %s)"
             % (label, sorted(set(got) ^ set(sd))[:3], bad[:3]))
    m64 = copy.deepcopy(model).double()
    with torch.no_grad():
        want = m64(x.double()).numpy()
    r = stub.Forward(cr.ps_pb2.ForwardRequest(input=cr.tensor(x.numpy()), train=False), timeout=60)
    rel_close(cr.array(r.output), want, 1e-5, "%s: eval forward" % label)
    ctx = random.randint(1, 1 << 60)
    r = stub.Forward(cr.ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                              input=cr.tensor(x.numpy())), timeout=60)
    rel_close(cr.array(r.output), want, 1e-5, "%s: training forward" % label)
    xr = x.double().clone().requires_grad_(True)
    y = m64(xr)
    gy = 2.0 * (y.detach() - target.double()) / y.numel()        # d mse / d y
    y.backward(gy)
    r = stub.Backward(cr.ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=cr.tensor(gy.float().numpy()),
                                                want_input_grad=True), timeout=60)
    rel_close(cr.array(r.input_grads[0]), xr.grad.numpy(), 1e-4, "%s: input gradient" % label)
    grads = cr.get_gradients(stub, ctx)
    for k, p in m64.named_parameters():
        if k not in grads:
            cr.check(False, "%s: psd has no gradient of %s" % (label, k))
            continue
        rel_close(grads[k], p.grad.numpy(), 1e-4, "%s: gradient of %s" % (label, k))


def export(pe, cls, shape):
    y = os.path.join(TMP, cls + ".yaml")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        rc = pe.main([SRC + ":" + cls, "--input-shape", ",".join(map(str, shape)), "--no-weights", "-o", y])
    cr.check(rc == 0, "psd-export %s %s" % (cls, err.getvalue().strip()[-300:] if rc else ""))
    return y


def both_ways(pe, cls, shape, want_nodes, onnx=True, seed=3):
    y = export(pe, cls, shape)
    got = [(n["name"], n["kind"], n["inputs"], n["attrs"]) for n in compare.load(y)["stages"][0]["nodes"]]
    for w in want_nodes:
        cr.check(w in got, "%s: psd-export writes %s (nodes: %s)" % (cls, w, [g for g in got if g[0] == w[0]]))
    torch.manual_seed(seed)
    model = getattr(upsampling, cls)()
    x = torch.rand((4,) + tuple(shape), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out_shape = model(x).shape
    target = x if out_shape == x.shape else torch.rand(out_shape, generator=torch.Generator().manual_seed(seed + 1))
    w = os.path.join(TMP, cls + ".safetensors")
    pe.write_safetensors(w, list(model.state_dict().items()), {})
    stub, p = cr.start_psd(cls + "_export", "file: %s" % y, ["--init-from", w])
    numeric("%s psd-export" % cls, stub, model, x, target)
    p.kill()
    if onnx is not True:
        print("skipped: %s onnx: %s" % (cls, onnx))
        return
    path = os.path.join(TMP, cls + ".onnx")
    torch.onnx.export(copy.deepcopy(model).train(), x, path, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, opset_version=13)
    stub, p = cr.start_psd(cls + "_onnx", "onnx: %s" % path, [])
    numeric("%s onnx training export" % cls, stub, model, x, target)
    p.kill()


# psd's ONNX import of ConvTranspose and Resize (True), or why it is not checked
ONNX = True

REFUSALS = [   # class, input shape, the line, what the message says
    ("UpOutputSize", "4,4,4", "upsampling.py:55", "called with output_size"),
    ("Bicubic", "2,4,4", "upsampling.py:60", "mode 'bicubic'"),
    ("SizeFromBatch", "2,4,4", "upsampling.py:65", "size or scale_factor computed from the batch size"),
    ("NearestExact", "2,4,4", "upsampling.py:74", "mode 'nearest-exact'"),
    ("Upsample1d", "2,4", "upsampling.py:83", "Upsample of a 2-d sample"),
]


def main():
    warnings.simplefilter("ignore")
    pe = cr.load_psd_export()
    both_ways(pe, "ConvAutoencoder", (1, 28, 28), [
        ("dec1", "ConvTranspose2d", ["relu_1"], {"out_channels": 8, "kernel_size": 3, "stride": 2, "padding": 1,
                                                 "output_padding": 1}),
        ("dec2", "ConvTranspose2d", ["relu_2"], {"out_channels": 1, "kernel_size": 3, "stride": 2, "padding": 1,
                                                 "output_padding": 1})],
        onnx=ONNX)
    both_ways(pe, "UNet", (3, 16, 16), [
        ("up2", "Upsample", ["relu_2"], {"scale_factor": 2.0}),
        ("up1", "Upsample", ["relu_3"], {"scale_factor": 2.0, "mode": "bilinear"}),
        ("interpolate", "Upsample", ["relu_2"], {"size": 8}),
        ("side", "Upsample", ["interpolate"], {"size": 16, "mode": "bilinear", "align_corners": True}),
        ("up0", "ConvTranspose2d", ["relu_3"], {"out_channels": 8, "kernel_size": 2, "stride": 2}),
        ("cat_1", "Concat", ["up1", "side", "up0", "relu"], {})],
        onnx=ONNX)
    for cls, shape, line, needle in REFUSALS:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            rc = pe.main([SRC + ":" + cls, "--input-shape", shape, "--no-weights", "-o",
                          os.path.join(TMP, "refused.yaml")])
        msg = err.getvalue()
        cr.check(rc != 0 and line in msg and needle in msg, "psd-export refuses %s naming '%s' at %s: %s"
                 % (cls, needle, line, msg.strip()[-200:]))


if __name__ == "__main__":
    cr.run_main(main)
