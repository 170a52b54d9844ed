#!/usr/bin/python3
"""tests/it_ids2.sh's Python half: recommender models of several int64 id inputs (tests/export/ids2.py) through
psd-export and psd, against PyTorch. psd's input is the ids joined flat (np.concatenate([u.reshape(n, -1),
i.reshape(n, -1)], 1)); each nn.Embedding / nn.EmbeddingBag called on an input is an Embedding reading its slice
(ids_start, ids_shape), which psd checks and reads alone.

  NCF      user and item ids (one each a sample): a GMF part (the two rows' product and its dot product), an MLP
           part (two other tables' rows joined, Linears), a head: 4 logits
  History  a user id and a history of 5 item ids (0 pads): the user's row, nn.EmbeddingBag's mean of the history,
           the history's rows (nn.Embedding, padding_idx 0) flattened, joined, a Linear (user.to(torch.long))
  SharedItems  a user id, a candidate item id and a history of 5 item ids: one item table called at two sites (the
           candidate's row, the history's mean), two Embeddings of two slices sharing it (user.long())

Each: every parameter moved off its initial value, psd started with --init-from those values, and checked by
check_rnn.checked (check_resnet's run() with ref64: psd's initial parameters named and valued as the state_dict,
eval and training forwards, every parameter gradient of one backward against float64 autograd, the step, a strict
load_state_dict of psd's tensors; then 30 SGD steps on one batch, each step's loss within 1e-5 of PyTorch's own
loop), the reference the module called on the pieces of the joined ids (its X subclass). psd refuses a Forward
whose ids in a slice are not rows of that slice's table (naming sample, position and table) and reads ids outside
every slice as no id. psd-export refuses an id input read by anything else (user + 1, torch.stack of two inputs),
naming the input. ps-train fit trains NCF through psd on (N, 2) int64 .npy ids whose label is (user % 2) * 2 +
item % 2: test accuracy from chance (25 %) to at least 90 %.

    check_ids2.py BUILD_DIR TMP_DIR
"""
import os
import sys

import grpc
import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import ids2  # noqa: E402
from ids2 import HIST, ITEMS, USERS  # noqa: E402
from psd._proto.ps_pb2 import ForwardRequest  # noqa: E402 (check_resnet put python/ on the path)

BATCH = 8


def export(pe, cls, name, shapes):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "ids2.py") + ":" + cls.__name__, "--seed", "3", "-o", y, "--input-dtype",
                  "int64"] + [a for s in shapes for a in ("--input-shape", s)])
    return rc, y


def ncf_ids(g, n):
    return np.stack([g.integers(0, USERS, n), g.integers(0, ITEMS, n)], 1).astype(np.int64)


def main():
    pe = cr.load_psd_export()
    g = np.random.default_rng(7)
    hist = np.concatenate([g.integers(0, USERS, (BATCH, 1)), g.integers(0, ITEMS, (BATCH, HIST))], 1)
    hist[:, -2:] = 0                     # padded histories (id 0: items' padding row, a row of the bag's mean)
    for label, cls, ref, shapes, x in (("NCF", ids2.NCF, ids2.NCFX, ["", ""], ncf_ids(g, BATCH)),
                                       ("History", ids2.History, ids2.HistoryX, ["", str(HIST)], hist),
                                       ("SharedItems", ids2.SharedItems, ids2.SharedItemsX, ["", "", str(HIST)],
                                        np.concatenate([ncf_ids(g, BATCH), hist[:, 1:]], 1))):
        rc, y = export(pe, cls, label, shapes)
        cr.check(rc == 0, "psd-export of %s with int64 inputs of per-sample shapes %s" % (label, shapes))
        if rc:
            continue
        text = open(y).read()
        cr.check("input: {shape: [%d], dtype: int64}" % x.shape[1] in text and "ids_start: 1" in text,
                 "%s: psd's input is the %d ids joined; Embeddings read slices" % (label, x.shape[1]))
        model, w = cr.moved(ref, label, seed=3,
                            after=(lambda m: m.items.weight[0].zero_()) if cls is ids2.History else None)
        xt = torch.from_numpy(x)
        if cls is ids2.SharedItems:
            cr.check("share: items" in text, "SharedItems: the item table's second site shares the first's")
        target = torch.randint(0, 4 if cls is ids2.NCF else 3, (BATCH,), generator=torch.Generator().manual_seed(1))
        check_rnn.checked(label, label, y, w, model, xt, target, steps=30,
                          after=bad_ids if cls is ids2.NCF else None)
    refusals(pe)
    fit(pe)


def bad_ids(stub):
    """NCF's psd: an item id past item tables' 13 rows refused naming it; ids in range forward."""
    x = np.array([[3, 4], [2, ITEMS]], dtype=np.int64)
    try:
        stub.Forward(ForwardRequest(input=cr.tensor(x), train=False), timeout=60)
        msg = "accepted"
    except grpc.RpcError as e:
        msg = e.details()
    cr.check("input[1][1] = 13" in msg and "item_gmf.weight (0..12)" in msg,
             "NCF: psd refuses item id 13 of sample 1, naming the table (%s)" % msg)
    x[1, 0] = -1
    x[1, 1] = 0
    try:
        stub.Forward(ForwardRequest(input=cr.tensor(x), train=False), timeout=60)
        msg = "accepted"
    except grpc.RpcError as e:
        msg = e.details()
    cr.check("input[1][0] = -1" in msg and "user_gmf.weight" in msg, "NCF: psd refuses user id -1 (%s)" % msg)


def refusals(pe):
    cr.refused(lambda cls, name: export(pe, cls, name, ["", ""]),
               ((ids2.IdArithmetic, "reads the int64 input 'user'"), (ids2.IdsJoined, "torch.stack at")),
               also="nn.Embedding")


def fit(pe):
    """ps-train fit trains NCF through psd on (N, 2) int64 .npy ids, the label (user % 2) * 2 + item % 2."""
    rc, y = export(pe, ids2.NCF, "ncf_fit", ["", ""])
    if rc:
        cr.check(False, "psd-export of NCF for ps-train fit")
        return
    g = np.random.default_rng(5)
    files = {}
    for part, n in (("train", 3000), ("test", 500)):
        ids = ncf_ids(g, n)
        files[part] = (os.path.join(cr.TMP, "ncf_%s_x.npy" % part), os.path.join(cr.TMP, "ncf_%s_y.npy" % part))
        np.save(files[part][0], ids)
        np.save(files[part][1], ((ids[:, 0] % 2) * 2 + ids[:, 1] % 2).astype(np.int64))
    check_rnn.fit_accuracy("ncf_fit", y, files, 6, "NCF through psd on (N, 2) int64 ids, the label "
                           "(user % 2) * 2 + item % 2")


if __name__ == "__main__":
    cr.run_main(main)
