#!/usr/bin/python3
"""`make test-zoo`: which torchvision classification models psd can host.

For each model builder below that this torchvision has, built with
num_classes=10 at a small input (3x64x64, or the smallest it takes), two
paths:

  psd-export  tools/psd-export NAME --kwargs '{"num_classes": 10, ...}'
              --input-shape 3,H,W --no-weights, then psd --check-config on
              a config naming the model file;
  onnx        torch.onnx.export(..., training=TrainingMode.TRAINING,
              do_constant_folding=False, opset_version=13), then
              psd --check-config on a config naming model.onnx.

Prints one line per model and path: OK, or the first refusal (psd-export's
message, the exporter's exception, or psd's error line), and a summary.
--markdown prints docs/models.md's "torchvision models" table instead.
It reports; it does not fail on a refusal (exit 0 unless the script itself
breaks or psd crashes: a signal, or an error status without a message).

    zoo.py BUILD_DIR TMP_DIR [--markdown] [MODEL ...]
"""
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import time
import warnings

import torch
import torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (builder, extra kwargs, per-sample input). One or two of each family; the
# biggest members of a family add nothing but minutes.
ZOO = [
    ("resnet18", {}, (3, 64, 64)),
    ("resnet50", {}, (3, 64, 64)),
    ("resnext50_32x4d", {}, (3, 64, 64)),
    ("wide_resnet50_2", {}, (3, 64, 64)),
    ("mobilenet_v2", {}, (3, 64, 64)),
    ("mobilenet_v3_small", {}, (3, 64, 64)),
    ("mobilenet_v3_large", {}, (3, 64, 64)),
    ("efficientnet_b0", {}, (3, 64, 64)),
    ("efficientnet_v2_s", {}, (3, 64, 64)),
    ("mnasnet0_5", {}, (3, 64, 64)),
    ("shufflenet_v2_x0_5", {}, (3, 64, 64)),
    ("squeezenet1_0", {}, (3, 64, 64)),
    ("squeezenet1_1", {}, (3, 64, 64)),
    ("densenet121", {}, (3, 64, 64)),
    ("vgg11", {}, (3, 64, 64)),
    ("vgg11_bn", {}, (3, 64, 64)),
    ("alexnet", {}, (3, 64, 64)),
    ("googlenet", {"aux_logits": False, "init_weights": False}, (3, 64, 64)),
    ("inception_v3", {"aux_logits": False, "init_weights": False}, (3, 75, 75)),
    ("regnet_x_400mf", {}, (3, 64, 64)),
    ("regnet_y_400mf", {}, (3, 64, 64)),
    ("convnext_tiny", {}, (3, 64, 64)),
    ("vit_b_16", {"image_size": 64}, (3, 64, 64)),
    ("swin_t", {}, (3, 64, 64)),
]
# Not here: maxvit_t (it takes 224x224 only: each block's size must divide by 7), the larger members of the
# families above.


def load_psd_export():
    loader = importlib.machinery.SourceFileLoader("psd_export", os.path.join(ROOT, "tools", "psd-export"))
    spec = importlib.util.spec_from_loader("psd_export", loader)
    pe = importlib.util.module_from_spec(spec)
    loader.exec_module(pe)
    return pe


def first_line(text):
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line
    return "(no message)"


def shorten(msg, limit=300):
    msg = re.sub(r"\s+", " ", msg)
    msg = re.sub(r" \(psd-export knows: [^)]*\)", "", msg)
    msg = re.sub(r"/usr/lib/python3/dist-packages/", "", msg)
    return msg if len(msg) <= limit else msg[:limit - 3] + "..."


def cell(msg):
    """A refusal as a table cell: without psd's config/file prefix and PyTorch's issue boilerplate."""
    msg = re.sub(r"^psd: \S+\.conf\.yaml: model\.file: \S+?: ", "psd: ", msg)
    msg = re.sub(r"\. Please feel free to request support.*$", "", msg)
    msg = re.sub(r"^torch\.onnx\.export: SymbolicValueError: ", "torch.onnx.export: ", msg)
    msg = msg.replace("|", "\\|").replace("`", "'")
    return "`%s`" % (msg if len(msg) <= 160 else msg[:157] + "...")


class Crash(Exception):
    pass


def check_config(build, tmp, name, model_line):
    cfg = os.path.join(tmp, name + ".conf.yaml")
    with open(cfg, "w") as f:
        f.write("model:\n  %s\n" % model_line)
    p = subprocess.run([os.path.join(build, "bin", "psd"), "--check-config", cfg], capture_output=True,
                       text=True, timeout=600)
    if p.returncode == 0:
        return "OK"
    if p.returncode < 0 or p.returncode > 125 or not p.stderr.strip():
        raise Crash("psd --check-config %s: exit status %d: %s" % (cfg, p.returncode, p.stderr[-2000:]))
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    # psd's error line names the config and the model; keep what follows the model's path
    msg = lines[0] if lines else "(no message)"
    msg = msg.replace(tmp + "/", "")
    return msg


def via_export(pe, build, tmp, name, kwargs, shape):
    y = os.path.join(tmp, name + ".yaml")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = pe.main([name, "--kwargs", json.dumps(kwargs), "--input-shape", ",".join(map(str, shape)),
                          "--no-weights", "-o", y])
        except Exception as e:          # noqa: BLE001 - a tool crash is a finding, reported as such
            return "psd-export raised %s: %s" % (type(e).__name__, first_line(str(e)))
    if rc != 0:
        return first_line(err.getvalue())
    return check_config(build, tmp, name + "_export", "file: %s" % y)


def via_onnx(build, tmp, name, kwargs, shape):
    path = os.path.join(tmp, name + ".onnx")
    torch.manual_seed(0)
    try:
        m = getattr(torchvision.models, name)(**kwargs)
    except Exception as e:              # noqa: BLE001
        return "torchvision.models.%s: %s: %s" % (name, type(e).__name__, first_line(str(e)))
    m.train()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(m, torch.randn((2,) + tuple(shape)), path, opset_version=13,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    except Exception as e:              # noqa: BLE001
        return "torch.onnx.export: %s: %s" % (type(e).__name__, first_line(str(e)))
    try:
        return check_config(build, tmp, name + "_onnx", "onnx: %s" % path)
    finally:
        os.unlink(path)                 # the big ones are hundreds of MB


def main(argv):
    warnings.simplefilter("ignore")
    args = [a for a in argv if not a.startswith("--")]
    markdown = "--markdown" in argv
    build, tmp, only = args[0], args[1], set(args[2:])
    pe = load_psd_export()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    rows = []
    t0 = time.time()
    for name, extra, shape in ZOO:
        if only and name not in only:
            continue
        if not hasattr(torchvision.models, name):
            continue
        kwargs = dict({"num_classes": 10}, **extra)
        res = {}
        for path, f in (("psd-export", lambda: via_export(pe, build, tmp, name, kwargs, shape)),
                        ("onnx", lambda: via_onnx(build, tmp, name, kwargs, shape))):
            res[path] = shorten(f())
            if not markdown:
                print("%-20s %-10s %s" % (name, path, res[path]), flush=True)
        rows.append((name, shape, res))
    ok = {p: sum(r[2][p] == "OK" for r in rows) for p in ("psd-export", "onnx")}
    if markdown:
        print("| model (num_classes 10, input) | psd-export | ONNX (training export, opset 13) |")
        print("|---|---|---|")
        for name, shape, res in rows:
            cells = [("OK" if res[p] == "OK" else cell(res[p])) for p in ("psd-export", "onnx")]
            print("| %s (%s) | %s | %s |" % (name, "x".join(map(str, shape)), cells[0], cells[1]))
        print()
        print("torchvision %s, torch %s, %s: psd-export %d of %d, ONNX %d of %d."
              % (torchvision.__version__, torch.__version__, time.strftime("%Y-%m-%d"), ok["psd-export"], len(rows),
                 ok["onnx"], len(rows)))
    else:
        print("zoo: torchvision %s: psd-export OK %d of %d, onnx OK %d of %d (%.0f s)"
              % (torchvision.__version__, ok["psd-export"], len(rows), ok["onnx"], len(rows), time.time() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
