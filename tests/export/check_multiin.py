#!/usr/bin/python3
"""tests/it_multiin.sh's Python half: models of mixed inputs - int64 categorical ids and float32 dense features
(tests/export/multiin.py) - through psd-export (--input-dtype once per input) and psd, and ps-train fit reading
one array per input, against PyTorch.

psd's input is every input flattened and joined in forward's order as float32, the ids exact integers in it; each
nn.Embedding / nn.EmbeddingBag called on an id input (or on ids[:, k] of one) an Embedding of its slice, each float
input a Narrow (and a Reshape where it has several dims).

  WideDeep       ids (N, 3) - user, item, category, read as ids[:, k] - and 6 features: a wide Linear of the
                 features plus a deep MLP of the three rows and the features
  WideDeepSplit  the same with four inputs, ids and features interleaved: forward(user, feats, item, cat)
  HistoryFeats   a user id, (2, 3) features and a history of 4 item ids (nn.EmbeddingBag's mean)

Each: every parameter moved off its initial value, psd started with --init-from those values and checked by
check_rnn.checked (psd's initial parameters named and valued as the state_dict, eval and training forwards, every
parameter gradient of one backward against float64 autograd, the input gradient against autograd's (0 through
the ids, as .long() has none), a strict load_state_dict, 30 SGD steps each within 1e-5 of PyTorch's own loop); the
reference is the module called on the pieces of psd's joined input (its X subclass). psd refuses a Forward whose
id slot holds 2.5, -1 or 2^24 (not an exact id) or an id past its table, naming sample, position and table.
psd-export refuses an id input used as a number and a count of --input-dtype that fits neither rule, and
hints at --input-dtype per input when ids reach an nn.Embedding as float32 (none given).

ps-train fit trains WideDeep through psd from two .npy files (--inputs ids.npy --inputs feats.npy; the label the
user id's parity XOR the first feature's sign; the test arrays two members of one .npz, --test-inputs t.npz:ids
--test-inputs t.npz:feats) beside PyTorch's own loop from the same initial weights (plain
SGD, lr 0.1, batch 32, 8 epochs): both reach at least 90 % test accuracy and lie within 3 points and 0.1 of test
loss of each other. Refused by ps-train naming what is wrong: arrays of different row counts, arrays whose values
together are not the model's, --input-mean with several inputs, an id of 2^24 joined with float features, and the
arrays given in the wrong order (psd names the feature value that is not an id).

    check_multiin.py BUILD_DIR TMP_DIR
"""
import os
import subprocess
import sys

import grpc
import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import multiin  # noqa: E402
from multiin import FEATS, HIST, ITEMS  # noqa: E402
from psd._proto.ps_pb2 import ForwardRequest  # noqa: E402 (check_resnet put python/ on the path)

BATCH = 8


def export(pe, cls, name, shapes, dtypes):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "multiin.py") + ":" + cls.__name__, "--seed", "3", "-o", y] +
                 [a for s in shapes for a in ("--input-shape", s)] + [a for d in dtypes for a in ("--input-dtype", d)])
    return rc, y


def joined(*parts):
    """psd's input: each part flattened, joined in order, as float32 (the ids exact)."""
    n = parts[0].shape[0]
    return np.concatenate([p.reshape(n, -1).astype(np.float32) for p in parts], 1)


def main():
    pe = cr.load_psd_export()
    g = np.random.default_rng(7)
    ids, feats, _ = multiin.synthetic(g, BATCH)
    hist = g.integers(0, ITEMS, (BATCH, HIST))
    f23 = g.standard_normal((BATCH, 2, 3)).astype(np.float32)
    cases = (("WideDeep", multiin.WideDeep, multiin.WideDeepX, ["3", str(FEATS)], ["int64", "float32"],
              joined(ids, feats), 2),
             ("WideDeepSplit", multiin.WideDeepSplit, multiin.WideDeepSplitX, ["", str(FEATS), "", ""],
              ["int64", "float32", "int64", "int64"], joined(ids[:, 0], feats, ids[:, 1], ids[:, 2]), 2),
             ("HistoryFeats", multiin.HistoryFeats, multiin.HistoryFeatsX, ["", "2,3", str(HIST)],
              ["int64", "float32", "int64"], joined(ids[:, 0], f23, hist), 3))
    for label, cls, ref, shapes, dtypes, x, classes in cases:
        rc, y = export(pe, cls, label, shapes, dtypes)
        cr.check(rc == 0, "psd-export of %s with inputs %s of per-sample shapes %s" % (label, dtypes, shapes))
        if rc:
            continue
        text = open(y).read()
        cr.check("input: {shape: [%d], dtype: float32}" % x.shape[1] in text and "ids_start: " in text and
                 "kind: Narrow" in text, "%s: psd's input is the %d values joined as float32; Embeddings read "
                 "slices, Narrows the features" % (label, x.shape[1]))
        model, w = cr.moved(ref, label, seed=3)
        xt = torch.from_numpy(x)
        target = torch.randint(0, classes, (BATCH,), generator=torch.Generator().manual_seed(1))
        check_rnn.checked(label, label, y, w, model, xt, target, input_grad=True, steps=30,
                          after=bad_ids if cls is multiin.WideDeep else None)
        log = open(os.path.join(cr.TMP, label + ".log")).read()
        cr.check("cpu ISA " in log and "kernel check failed" not in log,
                 "%s: psd's start-up kernel check probes the mixed input (ids 0 where its pixels are not ids)" % label)
    refusals(pe)
    fit(pe)


def bad_ids(stub):
    """WideDeep's psd: ids that are not exact ids in [0, 2^24), or past a table, refused naming them."""
    base = joined(*multiin.synthetic(np.random.default_rng(1), 2)[:2])
    for col, value, words in ((1, 2.5, "input[1][1] = 2.5 (id 0 of item's slice ids_start 1) is not an id"),
                              (0, -1.0, "input[1][0] = -1 (id 0 of user's slice ids_start 0) is not an id"),
                              (2, 16777216.0, "input[1][2] = 16777216 (id 0 of cat's slice ids_start 2) is not an id"),
                              (1, float(ITEMS), "input[1][1] = 13 (id 0 of item's slice ids_start 1) is not a row of "
                               "item.weight (0..12)")):
        x = base.copy()
        x[1, col] = value
        try:
            stub.Forward(ForwardRequest(input=cr.tensor(x), train=False), timeout=60)
            msg = "accepted"
        except grpc.RpcError as e:
            msg = e.details()
        cr.check(words in msg, "WideDeep: psd refuses %r in id slot %d of sample 1 (%s)" % (value, col, msg))


def refusals(pe):
    cr.refused(lambda cls, name: export(pe, cls, name, ["", str(FEATS)], ["int64", "float32"]),
               ((multiin.IdTimesFeature, "reads the int64 input 'ids'"),))
    cr.refused(lambda cls, name: export(pe, cls, name, ["3", str(FEATS)], ["int64", "float32", "int64"]),
               ((multiin.WideDeep, "3 --input-dtype given for 2 --input-shape"),))
    cr.refused(lambda cls, name: export(pe, cls, name, ["3", str(FEATS)], []),
               ((multiin.WideDeep, "give --input-dtype once per input"),))


def torch_loop(model, data, epochs, lr, batch, seed):
    """PyTorch's own loop: plain SGD on cross_entropy, shuffled batches; the test (loss, accuracy %)."""
    (ids, feats, y), (tids, tfeats, ty) = data
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    xi, xf, yt = torch.from_numpy(ids), torch.from_numpy(feats), torch.from_numpy(y)
    for _ in range(epochs):
        perm = torch.randperm(len(yt), generator=gen)
        for b in range(0, len(yt), batch):
            j = perm[b:b + batch]
            opt.zero_grad()
            F.cross_entropy(model(xi[j], xf[j]), yt[j]).backward()
            opt.step()
    with torch.no_grad():
        out = model(torch.from_numpy(tids), torch.from_numpy(tfeats))
        t = torch.from_numpy(ty)
        return float(F.cross_entropy(out, t)), 100.0 * float((out.argmax(1) == t).float().mean())


def fit(pe):
    """ps-train fit of WideDeep from two arrays through psd, beside PyTorch's loop; its refusals."""
    rc, y = export(pe, multiin.WideDeep, "wd_fit", ["3", str(FEATS)], ["int64", "float32"])
    if rc:
        cr.check(False, "psd-export of WideDeep for ps-train fit")
        return
    g = np.random.default_rng(5)
    data, f = [], {}
    for part, n in (("train", 4000), ("test", 1000)):
        ids, feats, labels = multiin.synthetic(g, n)
        data.append((ids, feats, labels))
        for k, a in (("ids", ids), ("feats", feats), ("y", labels)):
            f[part, k] = os.path.join(cr.TMP, "wd_%s_%s.npy" % (part, k))
            np.save(f[part, k], a)
    epochs, lr = 8, 0.1
    torch.manual_seed(3)
    ref = multiin.WideDeep()
    t_loss, t_acc = torch_loop(ref, data, epochs, lr, 32, 3)
    addr, cfg, p = cr.fit_psd("wd_fit", y, "type: sgd\n  lr: %g" % lr,
                              ["--init-from", os.path.splitext(y)[0] + ".safetensors"])

    def ps_fit(inputs, test_inputs, extra=(), labels=None, epochs_=epochs):
        args = [os.path.join(cr.BUILD, "bin", "ps-train"), "fit", "--config", cfg, "--server", addr,
                "--world-size", "2", "--labels", labels or f["train", "y"], "--test-labels", f["test", "y"],
                "--loss", "cross_entropy", "--batch-size", "32", "--epochs", str(epochs_), "--seed", "3",
                "--wait-s", "60", "--log-every", "100000"]
        for a in inputs:
            args += ["--inputs", a]
        for a in test_inputs:
            args += ["--test-inputs", a]
        return subprocess.run(args + list(extra), capture_output=True, text=True, timeout=300)

    train_in = [f["train", "ids"], f["train", "feats"]]
    npz = os.path.join(cr.TMP, "wd_test.npz")       # the test arrays as two members of one .npz
    np.savez(npz, ids=data[1][0], feats=data[1][1])
    test_in = [npz + ":ids", npz + ":feats"]
    # refusals first (nothing trained; psd's weights still the initial ones)
    short = os.path.join(cr.TMP, "wd_short_feats.npy")
    np.save(short, data[0][1][:100])
    wide = os.path.join(cr.TMP, "wd_wide_feats.npy")
    np.save(wide, np.zeros((4000, FEATS + 1), np.float32))
    big = os.path.join(cr.TMP, "wd_big_ids.npy")
    b = data[0][0].copy()
    b[7, 2] = 1 << 24
    np.save(big, b)
    for what, r, words in (
            ("arrays of different row counts", ps_fit([f["train", "ids"], short], test_in),
             "inputs %s hold 100 samples (100, 6), but inputs %s hold 4000" % (short, f["train", "ids"])),
            ("arrays holding 10 values a sample for the model's 9", ps_fit([f["train", "ids"], wide], test_in),
             "the 2 arrays hold 10 values a sample together, but the model's first stage 'main' takes (9,)"),
            ("--input-mean with several inputs", ps_fit(train_in, test_in, ["--input-mean", "0.5"]),
             "with several --inputs the values reach the model as they are"),
            ("an id of 2^24 joined with float features", ps_fit([big, f["train", "feats"]], test_in),
             "inputs %s: sample 7 value 16777216 (position 2) is not exact in float32" % big),
            ("one --test-inputs for two --inputs", ps_fit(train_in, test_in[:1]),
             "2 --inputs but 1 --test-inputs"),
            ("the arrays in the wrong order", ps_fit([f["train", "feats"], f["train", "ids"]],
                                                     [f["test", "feats"], f["test", "ids"]]),
             "is not an id: the float32 input carries ids as exact integers")):
        cr.check(r.returncode != 0 and words in r.stdout + r.stderr,
                 "ps-train fit refuses %s: %s" % (what, (r.stdout + r.stderr).strip().splitlines()[-1:]))
    r = ps_fit(train_in, test_in)
    p.kill()
    acc = [ln for ln in r.stdout.splitlines() if " test loss " in ln]
    if not acc or r.returncode:
        cr.check(False, "ps-train fit of WideDeep from two arrays (exit %d): %s" % (r.returncode,
                                                                                 (r.stdout + r.stderr)[-600:]))
        return
    p_loss = float(acc[-1].split("test loss ")[1].split()[0])
    p_acc = float(acc[-1].split("accuracy ")[1].split("%")[0])
    cr.check(p_acc >= 90 and t_acc >= 90 and abs(p_acc - t_acc) <= 3 and abs(p_loss - t_loss) <= 0.1,
             "WideDeep from --inputs ids.npy --inputs feats.npy, %d epochs of SGD lr %g: psd test loss %.4f "
             "accuracy %.2f%%, PyTorch's loop %.4f and %.2f%%" % (epochs, lr, p_loss, p_acc, t_loss, t_acc))


if __name__ == "__main__":
    cr.run_main(main)
