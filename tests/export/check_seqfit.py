#!/usr/bin/python3
"""ps-train fit of a sequence model the way PyTorch users train one (tests/it_seqfit.sh).

tests/export/seqfit.py's SeqLM (Embedding + nn.LSTM(batch_first) + Linear: (N, T) ids -> (N, T, V) logits) goes
through psd-export into psd, initialised from a state_dict both sides share, and ps-train fit trains it with
`--loss cross_entropy --ignore-index 0 --class-dim last` on padded next-token data, full batches (the whole
training set one batch, so that PyTorch's loop takes exactly the same batches) - beside PyTorch's own loop:
nn.CrossEntropyLoss(ignore_index=0)(logits.reshape(-1, V), tgt.reshape(-1)) with torch.optim.SGD. Checked: every
epoch's training loss within 2e-3 of PyTorch's (and far from the loss with the padding counted, so that a broken
mask shows), the final test loss within 2e-3 and the accuracy over the non-padding targets within 1 point of
PyTorch's; --one-call says why psd's fused loss cannot serve (--ignore-index) and trains as three calls; refusals
naming what is wrong: --ignore-index with a dense loss, a bad --class-dim, a label out of range that is not the
ignore_index (naming sample and position), (N, T) labels without --class-dim last; a batch of padding only left
out of the epoch's mean (PyTorch's nan) with psd's weights unchanged.

Then the translation tutorial's Seq2SeqTransformer (seqfit.Translator: tests/export/tdec.py's Seq2Seq with the
tutorial's padding masks, PAD_IDX 1, returning (N, T, V)) on a copy task with teacher forcing (ids = [src,
tgt_input], labels tgt_out) the same way with --ignore-index 1: 30 full-batch epochs each within 2e-3 of the
tutorial's loop, the test loss within 2e-3 and the accuracy within 1 point.
"""
import os
import subprocess
import sys

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import seqfit  # noqa: E402
from seqfit import T, V  # noqa: E402

NTRAIN, NTEST, EPOCHS, LR = 64, 32, 30, 0.5


def torch_loop(model, data, epochs, lr, V=V, pad=0):
    """PyTorch's loop, full batches: the training loss of each epoch (before its step), the loss with the padding
    counted, the test loss and accuracy % over the non-padding targets."""
    (x, y), (tx, ty) = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in data]
    loss_fn = nn.CrossEntropyLoss(ignore_index=pad)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses, counted = [], []
    for _ in range(epochs):
        opt.zero_grad()
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, V), y.reshape(-1))
        with torch.no_grad():
            counted.append(float(nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))))
        loss.backward()
        opt.step()
        losses.append(float(loss))
    with torch.no_grad():
        out = model(tx).reshape(-1, V)
        t = ty.reshape(-1)
        keep = t != pad
        acc = 100.0 * float(((out.argmax(1) == t) & keep).sum()) / float(keep.sum())
        return losses, counted, float(loss_fn(out, t)), acc


def main():
    pe = cr.load_psd_export()
    y = os.path.join(cr.TMP, "seqlm.yaml")
    rc = pe.main([os.path.join(HERE, "seqfit.py") + ":SeqLM", "--input-shape", str(T), "--input-dtype", "int64",
                  "-o", y])
    cr.check(rc == 0, "psd-export of SeqLM ((N, %d) ids -> (N, %d, %d) logits)" % (T, T, V))
    if rc:
        return
    g = np.random.default_rng(11)
    data, f = [seqfit.synthetic(g, NTRAIN), seqfit.synthetic(g, NTEST)], {}
    for part, (xa, ya) in zip(("train", "test"), data):
        for k, a in (("x", xa), ("y", ya)):
            f[part, k] = os.path.join(cr.TMP, "seq_%s_%s.npy" % (part, k))
            np.save(f[part, k], a)
    pad = float((data[0][1] == 0).mean())
    torch.manual_seed(5)
    ref = seqfit.SeqLM()
    w = os.path.join(cr.TMP, "seqlm_init.safetensors")
    pe.write_safetensors(w, list(ref.state_dict().items()), {})
    t_losses, t_counted, t_loss, t_acc = torch_loop(ref, data, EPOCHS, LR)

    addr, cfg, p = cr.fit_psd("seqlm", y, "type: sgd\n  lr: %g" % LR, ["--init-from", w])

    def ps_fit(extra=(), labels=None, epochs=EPOCHS, cls=("--ignore-index", "0", "--class-dim", "last"),
               loss="cross_entropy"):
        args = [os.path.join(cr.BUILD, "bin", "ps-train"), "fit", "--config", cfg, "--server", addr,
                "--world-size", "2", "--inputs", f["train", "x"], "--labels", labels or f["train", "y"],
                "--test-inputs", f["test", "x"], "--test-labels", f["test", "y"], "--loss", loss,
                "--batch-size", str(NTRAIN), "--epochs", str(epochs), "--seed", "3", "--wait-s", "60",
                "--log-every", "100000"] + list(cls)
        return subprocess.run(args + list(extra), capture_output=True, text=True, timeout=300)

    # refusals first: nothing is trained (psd's weights stay the shared initial ones)
    bad = data[0][1].copy()
    bad[5, 3] = V
    bad_path = os.path.join(cr.TMP, "seq_bad_y.npy")
    np.save(bad_path, bad)
    yf = os.path.join(cr.TMP, "seq_train_yf.npy")
    np.save(yf, np.zeros((NTRAIN, T, V), np.float32))
    for what, r, words in (
            ("--ignore-index with mse", ps_fit(loss="mse", labels=yf),
             "--ignore-index and --class-dim are for the class losses (nll, cross_entropy), not mse"),
            ("--class-dim 2", ps_fit(cls=("--class-dim", "2")), "--class-dim 2: 1 (PyTorch's (N, C, d...)"),
            ("a label of %d for %d classes" % (V, V), ps_fit(labels=bad_path),
             "sample 5 has class %d at position 3, but the model outputs %d classes (0..%d or --ignore-index 0)"
             % (V, V, V - 1)),
            ("(N, T) labels with the classes taken from dim 1", ps_fit(cls=("--ignore-index", "0")),
             "needs (%d,)" % V)):
        cr.check(r.returncode != 0 and words in r.stdout + r.stderr,
                 "ps-train fit refuses %s: %s" % (what, (r.stdout + r.stderr).strip().splitlines()[-1:]))

    r = ps_fit(["--one-call"])
    out = r.stdout + r.stderr
    if r.returncode:
        cr.check(False, "ps-train fit of SeqLM (exit %d): %s" % (r.returncode, out[-800:]))
        return
    cr.check("no --ignore-index (psd's fused loss has none)" in out,
             "--one-call with --ignore-index says psd's fused loss cannot serve and sends three calls")
    ep = [float(ln.split("training loss ")[1].split()[0]) for ln in r.stdout.splitlines() if "training loss " in ln]
    cr.check(len(ep) == EPOCHS, "%d epochs reported, want %d" % (len(ep), EPOCHS))
    worst = max((abs(a - b) for a, b in zip(ep, t_losses)), default=1e9)
    cr.check(len(ep) == EPOCHS and worst <= 2e-3,
             "SeqLM, %d full-batch epochs of SGD lr %g, ignore_index 0 (%.0f%% of the targets padding): psd's "
             "training losses %s..%s, PyTorch's %.4f..%.4f, worst difference %.2g"
             % (EPOCHS, LR, 100 * pad, ep[:1], ep[-1:], t_losses[0], t_losses[-1], worst))
    cr.check(len(ep) == len(t_counted) and all(abs(a - b) > 5 * 2e-3 for a, b in zip(ep, t_counted)),
             "the padding matters: PyTorch's loss with it counted (%.4f at epoch 1) is far from the ignored one"
             % t_counted[0])
    acc = [ln for ln in r.stdout.splitlines() if " test loss " in ln]
    if not acc:
        cr.check(False, "no test line: %s" % r.stdout[-400:])
        return
    p_loss = float(acc[-1].split("test loss ")[1].split()[0])
    p_acc = float(acc[-1].split("accuracy ")[1].split("%")[0])
    npred = int(acc[-1].split("/")[1].split()[0])
    cr.check(npred == int((data[1][1] != 0).sum()),
             "the test accuracy counts the %d non-padding targets (%s)" % (int((data[1][1] != 0).sum()), acc[-1]))
    cr.check(abs(p_loss - t_loss) <= 2e-3 and abs(p_acc - t_acc) <= 1.0,
             "test set after training: psd loss %.4f accuracy %.2f%%, PyTorch %.4f and %.2f%%"
             % (p_loss, p_acc, t_loss, t_acc))
    # a batch of padding only: loss 0, no gradient (PyTorch: nan), left out of the epoch's mean and said so
    zeros = os.path.join(cr.TMP, "seq_zero_y.npy")
    np.save(zeros, np.zeros((NTRAIN, T), np.int64))
    r = ps_fit(labels=zeros, epochs=1)
    cr.check(r.returncode == 0 and "training loss 0.0000 (mean of 0 batches); 1 batch of only --ignore-index targets "
             "left out" in r.stdout and "nan" not in r.stdout,
             "a batch of padding only is left out of the epoch's mean: %s"
             % [ln for ln in (r.stdout + r.stderr).splitlines() if "loss" in ln or "rror" in ln][-3:])
    cr.check("test loss %.4f accuracy %.2f%%" % (p_loss, p_acc) in r.stdout,
             "the zero gradient of a batch of padding only leaves psd's weights (plain SGD) as they were")
    print("seqfit: psd training losses %s, PyTorch %s; test %s, PyTorch loss %.4f accuracy %.2f%%"
          % (" ".join("%.4f" % v for v in ep[::6]), " ".join("%.4f" % v for v in t_losses[::6]), acc[-1].strip(),
             t_loss, t_acc))
    p.kill()
    translator(pe)


def translator(pe):
    """The translation tutorial's Seq2SeqTransformer (PAD_IDX 1, its padding masks) on a copy task with teacher
    forcing, trained by ps-train fit --ignore-index 1 --class-dim last beside the tutorial's loop."""
    y = os.path.join(cr.TMP, "translator.yaml")
    ids_len = seqfit.S_LEN + seqfit.T_LEN
    rc = pe.main([os.path.join(HERE, "seqfit.py") + ":Translator", "--input-shape", str(ids_len), "--input-dtype",
                  "int64", "-o", y])
    cr.check(rc == 0, "psd-export of the translation tutorial's Seq2SeqTransformer returning (N, T, V)")
    if rc:
        return
    g = np.random.default_rng(13)
    data, f = [seqfit.copy_task(g, NTRAIN), seqfit.copy_task(g, NTEST)], {}
    for part, (xa, ya) in zip(("train", "test"), data):
        for k, a in (("x", xa), ("y", ya)):
            f[part, k] = os.path.join(cr.TMP, "tr_%s_%s.npy" % (part, k))
            np.save(f[part, k], a)
    torch.manual_seed(6)
    ref = seqfit.Translator()
    w = os.path.join(cr.TMP, "translator_init.safetensors")
    pe.write_safetensors(w, list(ref.state_dict().items()), {})
    epochs, lr = 30, 0.3
    t_losses, t_counted, t_loss, t_acc = torch_loop(ref, data, epochs, lr, V=seqfit.TV, pad=seqfit.PAD_IDX)
    addr, cfg, p = cr.fit_psd("translator", y, "type: sgd\n  lr: %g" % lr, ["--init-from", w])
    r = subprocess.run([os.path.join(cr.BUILD, "bin", "ps-train"), "fit", "--config", cfg, "--server", addr,
                        "--world-size", "2", "--inputs", f["train", "x"], "--labels", f["train", "y"],
                        "--test-inputs", f["test", "x"], "--test-labels", f["test", "y"], "--loss", "cross_entropy",
                        "--ignore-index", str(seqfit.PAD_IDX), "--class-dim", "last", "--batch-size", str(NTRAIN),
                        "--epochs", str(epochs), "--seed", "3", "--wait-s", "60", "--log-every", "100000"],
                       capture_output=True, text=True, timeout=300)
    p.kill()
    if r.returncode:
        cr.check(False, "ps-train fit of the Translator (exit %d): %s" % (r.returncode, (r.stdout + r.stderr)[-800:]))
        return
    ep = [float(ln.split("training loss ")[1].split()[0]) for ln in r.stdout.splitlines() if "training loss " in ln]
    worst = max((abs(a - b) for a, b in zip(ep, t_losses)), default=1e9)
    cr.check(len(ep) == epochs and worst <= 2e-3 and t_losses[-1] < t_losses[0] - 0.3,
             "Translator, %d full-batch epochs of SGD lr %g, ignore_index %d (%.0f%% of the targets padding): psd's "
             "training losses %s..%s, PyTorch's %.4f..%.4f, worst difference %.2g"
             % (epochs, lr, seqfit.PAD_IDX, 100 * float((data[0][1] == seqfit.PAD_IDX).mean()), ep[:1], ep[-1:],
                t_losses[0], t_losses[-1], worst))
    cr.check(all(abs(a - b) > 5 * 2e-3 for a, b in zip(ep, t_counted)) and len(ep) == len(t_counted),
             "Translator: PyTorch's loss with the padding counted (%.4f at epoch 1) is far from the ignored one"
             % t_counted[0])
    acc = [ln for ln in r.stdout.splitlines() if " test loss " in ln]
    p_loss = float(acc[-1].split("test loss ")[1].split()[0]) if acc else -1
    p_acc = float(acc[-1].split("accuracy ")[1].split("%")[0]) if acc else -1
    cr.check(abs(p_loss - t_loss) <= 2e-3 and abs(p_acc - t_acc) <= 1.0,
             "Translator test set after training: psd loss %.4f accuracy %.2f%%, PyTorch %.4f and %.2f%%"
             % (p_loss, p_acc, t_loss, t_acc))


if __name__ == "__main__":
    cr.run_main(main)
