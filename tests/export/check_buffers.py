#!/usr/bin/python3
"""tests/it_buffers.sh's Python half: registered buffers read as values (tests/export/buffers.py) through
psd-export and psd, against PyTorch:

  PosEncNet      a sinusoidal positional encoding, batch first: x + self.pe[:, :x.size(1)] with pe (1, max_len,
                 d) in a submodule (pos.pe), on token embeddings
  TablePos       a (max_len, d) table sliced to the tokens (pe[:T], no leading 1), a (d,) gain read twice (Mul,
                 Div); top-level buffers
  Normalized     (x - mean) / std with (3, 1, 1) buffers before a convolution, a (1, 4, 1, 1) shift after; the
                 input gradient too
  NonPersistent  x * scale with scale registered persistent=False (psd holds it; PyTorch's state_dict does not)
  Stepped        x + pe[:, ::2] (a Narrow with a step); the input gradient too

Each buffer is a Constant node holding the tensor under its state_dict name; psd starts with --init-from the
module's parameters (moved off their initial values) and buffers, and each model is checked by check_resnet.py's
run() with ref64: psd's parameters and buffers named and valued as the state_dict, the eval and training
forwards, every parameter gradient against float64 autograd, the step, a strict load_state_dict of psd's
tensors (the buffers unchanged by training). Then 30 SGD steps through psd, each loss within 1e-5 of PyTorch's
own loop. psd refuses to start, and --check-config to pass, without the buffers' values (no --init-from),
naming the buffer; psd-export says which buffers are non-persistent, and refuses a buffer computed on (2 * pe)
and one whose leading dim would face the batch, naming them.

    check_buffers.py BUILD_DIR TMP_DIR
"""
import contextlib
import io
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import buffers  # noqa: E402
from buffers import VOCAB, Normalized, NonPersistent, PosEncNet, Stepped, TablePos  # noqa: E402

SEQ, BATCH = 5, 6
CASES = [("PosEncNet", PosEncNet), ("TablePos", TablePos), ("Normalized", Normalized),
         ("NonPersistent", NonPersistent), ("Stepped", Stepped)]
FEATURES = {TablePos: [SEQ, 8], Normalized: [3, 6, 6], NonPersistent: [6], Stepped: [16, 8],
            buffers.BatchSized: [16, 8], buffers.Derived: [16, 8]}   # float inputs; PosEncNet takes token ids


def export(pe, cls, name):
    y = os.path.join(cr.TMP, name + ".yaml")
    shape = ["--input-shape", ",".join(map(str, FEATURES[cls]))] if cls in FEATURES else \
        ["--input-shape", str(SEQ), "--input-dtype", "int64"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = pe.main([os.path.join(HERE, "buffers.py") + ":" + cls.__name__, "--seed", "3", "-o", y] + shape)
    return rc, y, out.getvalue()


def moved(cls, name):
    """cr.moved's module and a weights file holding its non-persistent buffers too, which the check then
    treats as persistent (psd lists them; PyTorch's state_dict would not)."""
    model, w = cr.moved(cls, name, seed=3)
    for m in model.modules():
        m._non_persistent_buffers_set.clear()
    cr.load_psd_export().write_safetensors(w, list(model.state_dict().items()), {})
    return model, w


def inputs(cls, seed):
    torch.manual_seed(seed)
    if cls in FEATURES:
        return torch.randn([BATCH] + FEATURES[cls]), torch.randint(0, 2, (BATCH,))
    return torch.randint(0, VOCAB, (BATCH, SEQ)), torch.randint(0, 4, (BATCH,))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls) in enumerate(CASES):
        name = "buffers_%d" % i
        rc, y, said = export(pe, cls, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        with open(y) as f:
            text = f.read()
        held = [k for k, _ in cls().named_buffers()]
        cr.check(text.count("kind: Constant") == len(held), "%s: a Constant node per buffer (%s)" % (label, held))
        if cls is NonPersistent:
            cr.check("persistent=False that psd holds as Constants" in said and "scale" in said,
                     "NonPersistent: psd-export names the non-persistent buffer it holds")
        model, w = moved(cls, name)
        x, target = inputs(cls, i)
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=cls in FEATURES, steps=30,
                          after=lambda stub: unchanged(label, stub, model))
    no_values(y)
    refusals(pe)


def unchanged(label, stub, model):
    """Training moved no buffer: psd's are the module's values."""
    got = cr.get_parameters(stub)
    same = all(torch.equal(torch.from_numpy(got[k].reshape(v.shape)), v) for k, v in model.named_buffers())
    cr.check(same, "%s: the buffers are unchanged after training" % label)


def no_values(y):
    """Without --init-from (or a checkpoint) a Constant has no values: --check-config and a start both refuse,
    naming the buffer and what gives it."""
    cfg = os.path.join(cr.TMP, "no_values.conf.yaml")
    with open(cfg, "w") as f:
        f.write("model:\n  file: %s\n" % y)
    psd = os.path.join(cr.BUILD, "bin", "psd")
    r = subprocess.run([psd, "--check-config", cfg], capture_output=True, text=True, timeout=60)
    cr.check(r.returncode != 0 and "buffer 'pe' (" in r.stderr and "--init-from" in r.stderr,
             "--check-config without --init-from refuses the Constant's buffer naming it (%s)" % r.stderr.strip())
    r = subprocess.run([psd, "--config", cfg, "--listen", "127.0.0.1:%d" % cr.free_port()], capture_output=True,
                       text=True, timeout=60)
    cr.check(r.returncode != 0 and "buffer 'pe' (" in r.stderr, "psd without --init-from does not start (%s)"
             % r.stderr.strip().splitlines()[-1:])


def refusals(pe):
    cr.refused(lambda cls, name: export(pe, cls, name), (
        (buffers.BatchSized, "the buffer 'b' of shape (2, 16, 8)"),
        (buffers.Derived, "reads a constant tensor (computed from the buffer pe)")))


if __name__ == "__main__":
    cr.run_main(main)
