#!/usr/bin/env python3
"""PyTorch's examples/vae model (examples/models/vae.py) exported to ONNX by torch.onnx.export and read by psd's
ONNX import: torch.randn_like is a RandomNormalLike node (psd's RandnLike), the graph's three outputs (recon, mu,
logvar) are flattened and joined into psd's one output of 784 + 20 + 20 = 824 values, in the graph's order.

    /usr/bin/python3 tests/export/check_vae_onnx.py BUILD TMP     (tests/it_vae.sh runs it)

Checks: --check-config's stage table shows the joined (824) output; an eval Forward through psd gives PyTorch's mu
and logvar for the same weights (the deterministic parts, max|diff| <= 1e-5 x max|ref|), and a recon in (0, 1)
whose noise differs between two calls and is not the decoded mean (a RandnLike draws eps); tests/test_onnx_import.c
has the refusals. Writes TMP/vae.onnx (the weights of torch.manual_seed(1)) for it_vae's training run."""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "models"))
import check_resnet as cr  # noqa: E402  (BUILD and TMP from argv)
import vae  # noqa: E402
from check_resnet import check, ps_pb2  # noqa: E402


def export(model, path):
    torch.onnx.export(model, torch.rand(2, 1, 28, 28), path, opset_version=13, input_names=["x"],
                      output_names=["recon", "mu", "logvar"],
                      dynamic_axes={n: {0: "N"} for n in ("x", "recon", "mu", "logvar")})


def main():
    torch.manual_seed(1)
    model = vae.VAE().eval()
    path = os.path.join(cr.TMP, "vae.onnx")
    export(model, path)
    rc, out = cr.check_config(path)
    check(rc == 0 and "(824) f32" in out, "--check-config: the joined output (824) per sample: " +
          (out.strip().splitlines() or ["?"])[-1])

    stub, p = cr.start_psd("vae_onnx", "onnx: %s" % path, [])
    x = torch.rand(8, 1, 28, 28)
    outs = []
    for ctx in (11, 12, 11, 0, 0):   # eval noise: from the context id, rank and seq; fresh without a context
        r = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, input=cr.tensor(x.numpy()), train=False), timeout=120)
        outs.append(torch.from_numpy(cr.array(r.output).copy()))
    p.kill()
    got = outs[0]
    check(tuple(got.shape) == (8, 824), "psd's output is (8, 824): %s" % (tuple(got.shape),))
    with torch.no_grad():
        mu, logvar = model.encode(x.view(-1, 784))
    for name, ref, part in (("mu", mu, got[:, 784:804]), ("logvar", logvar, got[:, 804:824])):
        d = (part - ref).abs().max().item()
        check(d <= 1e-5 * ref.abs().max().item(), "%s (values %s of psd's output) = PyTorch's: max|diff| %.2e" %
              (name, "784..803" if name == "mu" else "804..823", d))
    recon = got[:, :784]
    check(bool(((recon > 0) & (recon < 1)).all()), "recon (values 0..783) in (0, 1): a sigmoid's")
    def differ(a, b, part=slice(0, 784)):
        return (outs[a][:, part] - outs[b][:, part]).abs().max().item()
    check(differ(0, 1) > 1e-4 and differ(0, 1, slice(784, 824)) == 0, "a call of another context id draws other "
          "noise (recon moves by up to %.3g) and the same mu, logvar" % differ(0, 1))
    check(differ(0, 2) == 0, "the same context id draws the same noise again (a retried call)")
    check(differ(3, 4) > 1e-4, "two calls without a context draw fresh noise each (recon moves by up to %.3g), as "
          "PyTorch's module samples in eval" % differ(3, 4))
    with torch.no_grad():   # the mean's reconstruction, no noise: psd's recon is not it
        mean_recon = model.decode(mu)
    check((recon - mean_recon).abs().max().item() > 1e-4, "recon is decoded from mu + eps * std, not from mu")


if __name__ == "__main__":
    cr.run_main(main)
