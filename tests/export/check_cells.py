#!/usr/bin/python3
"""tests/it_cells.sh's Python half: recurrent cells called in a Python loop (tests/export/cells.py: nn.LSTMCell /
nn.GRUCell over 5 steps, torch.fx unrolling the loop into one call per step) through psd-export and psd, against
PyTorch:

  LSTMLoop      an LSTMCell from x.new_zeros states, the last h into a Linear
  GRULoop       a GRUCell whose first call has no state, then cell(x_t, h)
  StackedCells  two LSTMCells stacked (x.new_zeros, torch.zeros_like states), a Linear per step (one module,
                shared too), torch.stack(outs, 1) into the head
  MixedCells    a GRUCell from h = None into an LSTMCell(bias=False) from state = None, (h, c) passed on whole
  Decoder       a seq2seq decoder: a GRUCell from an encoder's h, each step's output (a shared Linear) the next
                step's input

Each export is checked for its shape: a node per call, the later calls of a cell with share: its first
(psd --check-config lists them), the cell parameters once under PyTorch's names (weight_ih, weight_hh,
bias_ih, bias_hh). Every parameter is moved off its initial value, psd started with --init-from those values,
and each model checked by check_rnn.checked: the input gradient, check_resnet's run() with ref64 (psd's initial
parameters named and valued as the state_dict, the eval and training forwards, every parameter gradient of
one backward - the sum over the steps of a shared cell - against float64 autograd, the step, a strict
load_state_dict of psd's tensors), then 80 SGD steps through psd on one batch, each step's loss within 1e-5
of PyTorch's own loop. And psd-export's refusal of an LSTMCell whose h alone is zeros.

    check_cells.py BUILD_DIR TMP_DIR
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
import cells  # noqa: E402

BATCH = 6
# (label, class, cell modules: {module: (kind, calls)})
CASES = [("LSTMLoop", cells.LSTMLoop, {"cell": ("LSTMCell", 5)}),
         ("GRULoop", cells.GRULoop, {"cell": ("GRUCell", 5)}),
         ("StackedCells", cells.StackedCells, {"lstm1": ("LSTMCell", 5), "lstm2": ("LSTMCell", 5)}),
         ("MixedCells", cells.MixedCells, {"gru": ("GRUCell", 5), "lstm": ("LSTMCell", 5)}),
         ("Decoder", cells.Decoder, {"cell": ("GRUCell", 5)})]


def export(pe, cls, name):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "cells.py") + ":" + cls.__name__, "--seed", "3", "-o", y,
                  "--input-shape", "%d,%d" % (cells.STEPS, cells.FEATURES)])
    return rc, y


def shape_of_export(label, y, cls, mods):
    """A node per call, the later ones share: the first; --check-config lists them; the parameters PyTorch's."""
    import yaml
    nodes = yaml.safe_load(open(y))["stages"][0]["nodes"]
    for mod, (kind, calls) in mods.items():
        sites = [nd for nd in nodes if nd["kind"] == kind and (nd["name"] == mod or nd.get("share") == mod)]
        cr.check(len(sites) == calls and sum(1 for nd in sites if "share" in nd) == calls - 1,
                 "%s: %s is %d %s nodes, %d of them share: %s (%s)"
                 % (label, mod, calls, kind, calls - 1, mod, [(nd["name"], nd.get("share")) for nd in sites]))
        first = next(nd for nd in nodes if nd["name"] == mod)
        given = cls is cells.Decoder      # its first call's h is the encoder's
        cr.check(bool(first.get("inputs")) == given, "%s: %s's first call %s: %s"
                 % (label, mod, "takes the encoder's h" if given else "starts from zeros (no state input)",
                    first.get("inputs")))
    with open(y + ".conf.yaml", "w") as f:
        f.write("model:\n  file: %s\n" % y)
    r = subprocess.run([os.path.join(cr.BUILD, "bin", "psd"), "--check-config", y + ".conf.yaml"],
                       capture_output=True, text=True, timeout=60)
    shared = r.stdout.count("uses the parameters of") + r.stderr.count("uses the parameters of")
    want = sum(calls - 1 for _, calls in mods.values()) + (4 if cls in (cells.StackedCells, cells.Decoder) else 0)
    cr.check(r.returncode == 0 and shared == want, "%s: psd --check-config OK, %d shared nodes listed (%d)"
             % (label, want, shared))
    torch.manual_seed(3)
    sd = cls().state_dict()
    for mod in mods:
        keys = sorted(k for k in sd if k.startswith(mod + "."))
        want_keys = sorted(mod + "." + k for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
                           if mod + "." + k in sd)
        cr.check(keys == want_keys and len(keys) in (2, 4), "%s: %s's parameters %s" % (label, mod, keys))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls, mods) in enumerate(CASES):
        name = "cells_%d" % i
        rc, y = export(pe, cls, name)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        shape_of_export(label, y, cls, mods)
        model, w = cr.moved(cls, name, seed=3)
        torch.manual_seed(20 + i)
        x = torch.randn(BATCH, cells.STEPS, cells.FEATURES)
        target = torch.randint(0, cells.CLASSES, (BATCH,))
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=True, steps=80)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc, _ = export(pe, cells.HalfZeros, "refused_halfzeros")
    msg = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
    cr.check(rc != 0 and "h or c alone is zeros" in msg, "psd-export refuses HalfZeros naming it: %s" % msg)


if __name__ == "__main__":
    cr.run_main(main)
