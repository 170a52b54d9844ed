#!/usr/bin/python3
"""tests/it_tdec.sh's Python half: encoder-decoder Transformers (tests/export/tdec.py) through psd-export and
psd, against PyTorch:

  Seq2Seq       the translation tutorial's Seq2SeqTransformer (token embeddings * sqrt(E), a positional
                encoding buffer, nn.Transformer(batch_first=True) of 2 + 2 layers, a generator): source (5 ids)
                and target (4 ids) split from one id tensor by ids[:, :S] / ids[:, S:]; post-norm relu with
                generate_square_subsequent_mask's float mask as a buffer; pre-norm F.gelu with a bool
                torch.triu made in forward; and, as forward(src, tgt) of two id inputs (psd-export's several
                inputs, joined flat), pre-norm gelu with the buffer
  Decoder       features -> two nn.Linear (a 5-row memory, a 4-row target) -> nn.TransformerDecoder (2 layers,
                post-norm gelu, a final LayerNorm, a causal tgt_mask buffer) -> nn.Linear; the input gradient
                reaches the memory's rows only through the cross-attention
  DecoderLayer  the same with one nn.TransformerDecoderLayer called directly (pre-norm, F.gelu)

Every parameter is moved off its initial value (check_resnet.moved), psd started with --init-from those values,
and each model checked by check_rnn.checked: psd's initial parameters named and valued as the state_dict
(transformer.decoder.layers.0.multihead_attn.in_proj_weight, ...), the eval and training forwards, every
parameter gradient of one backward against float64 autograd (within 8x PyTorch float32's own error or 1e-4 of
the tensor's largest), the feature models' input gradients, the step, a strict load_state_dict, then 30 SGD
steps through psd on one batch (10 for the post-norm Seq2Seq: over 30 PyTorch's own float32 loop drifts up to 7e-6
from float64's there), each step's loss within 1e-5 of PyTorch's own loop. The causal mask is shown to
change the output (the test sees it). Then the model files: a MultiheadAttention with cross: true per decoder
layer reading the memory, causal: true on the decoder's self-attentions only, pre-norm's node order, Dropout
nodes and the attention's dropout at p 0.1, nn.GELU() as a GELU node; and psd-export's refusals naming what: a tgt_mask other than the
causal one, a memory_key_padding_mask, an activation other than ReLU / GELU; psd's build refusing cross-attention
model files that do not fit (one input, a memory of another width, causal with cross, three inputs without cross).

    check_tdec.py BUILD_DIR TMP_DIR
"""
import copy
import json
import os
import re
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_resnet as cr  # noqa: E402 (reads BUILD_DIR TMP_DIR from sys.argv, as this script takes them)
import check_rnn  # noqa: E402
import tdec  # noqa: E402
from tdec import Decoder, DecoderLayer, PaddedDecoder, Seq2Seq, Seq2SeqTwo  # noqa: E402

S, T, BATCH, FEATURES = 5, 4, 6, 3

CASES = [
    # (label, class psd-export reads, the reference module's class, kwargs)
    ("Seq2Seq post-norm relu, tgt_mask buffer", Seq2Seq, Seq2Seq, {}),
    ("Seq2Seq pre-norm F.gelu, tgt_mask torch.triu in forward", Seq2Seq, Seq2Seq,
     {"norm_first": True, "activation": "F.gelu", "tgt_mask": "triu"}),
    ("Seq2Seq of forward(src, tgt), pre-norm gelu", Seq2SeqTwo, Seq2Seq, {"norm_first": True, "activation": "gelu"}),
    ("Seq2Seq with the key padding masks (src, tgt, memory) of pad id 1", Seq2Seq, Seq2Seq, {"padding": True}),
    ("Seq2Seq of forward(src, tgt), pre-norm relu, key padding masks", Seq2SeqTwo, Seq2Seq,
     {"norm_first": True, "padding": True}),
    ("TransformerDecoder post-norm gelu, final norm", Decoder, Decoder, {}),
    ("TransformerDecoderLayer pre-norm F.gelu", DecoderLayer, DecoderLayer, {}),
]


def shape_args(cls):
    if cls is Seq2SeqTwo:
        return ["--input-dtype", "int64", "--input-shape", str(S), "--input-shape", str(T)]
    if cls is Seq2Seq:
        return ["--input-dtype", "int64", "--input-shape", str(S + T)]
    return ["--input-shape", "%d,%d" % (S + T, FEATURES)]


def export(pe, cls, name, kwargs=None):
    y = os.path.join(cr.TMP, name + ".yaml")
    rc = pe.main([os.path.join(HERE, "tdec.py") + ":" + cls.__name__, "--seed", "3", "-o", y] + shape_args(cls) +
                 (["--kwargs", json.dumps(kwargs)] if kwargs else []))
    with open(y) if rc == 0 else open(os.devnull) as f:
        return rc, y, f.read()


def inputs(cls, seed, padded=False):
    torch.manual_seed(seed)
    if cls in (Seq2Seq, Seq2SeqTwo):
        ids = torch.cat([torch.randint(2, 11, (BATCH, S)), torch.randint(2, 9, (BATCH, T))], 1)
        if padded:   # pad id 1 at the ends: the source's 0..4 and the target's 0..3 last ids (token 0 kept)
            for b, (ks, kt) in enumerate(((0, 0), (2, 1), (4, 3), (1, 2), (3, 0), (0, 3))):
                ids[b, S - ks:S] = 1
                ids[b, S + T - kt:] = 1

        return ids, torch.randint(0, T * 9, (BATCH,))
    return torch.randn(BATCH, S + T, FEATURES), torch.randint(0, 5, (BATCH,))


def main():
    pe = cr.load_psd_export()
    for i, (label, cls, ref, kw) in enumerate(CASES):
        name = "tdec_%d" % i
        rc, y, text = export(pe, cls, name, kw)
        cr.check(rc == 0, "psd-export of %s" % label)
        if rc:
            continue
        layers = 1 if cls is DecoderLayer else 2
        cr.check(text.count("cross: true") == layers and text.count("causal: true") == layers,
                 "%s: %d cross-attentions and %d causal self-attentions in the model file" % (label, layers, layers))
        model, w = cr.moved(lambda: ref(**kw), name, seed=3)
        x, target = inputs(cls, i, kw.get("padding", False))
        if kw.get("padding"):
            cr.check(text.count("kind: Eq") == 2,
                     "%s: an Eq of the ids per mask (source and target), each narrowed to its slice" % label)
            cr.check(sum("kind: MultiheadAttention" in ln and re.search(r"eq_narrow(_[0-9]+)?\]", ln) is not None
                         for ln in nodes(text)) == 6, "%s: all 6 attentions read a padding mask" % label)
            with torch.no_grad():
                plain = copy.deepcopy(model).eval()
                plain.padding = False
                cr.check(not torch.allclose(plain(x), model.eval()(x), atol=1e-5),
                         "%s: the padding masks change the output" % label)
        with torch.no_grad():   # the causal mask changes the output: the test would see it ignored
            plain = copy.deepcopy(model).eval()
            if isinstance(plain, Seq2Seq):
                plain.mask_mode = "none"
            else:
                plain.causal = torch.zeros_like(plain.causal)
            cr.check(not torch.allclose(plain(x), model.eval()(x), atol=1e-5),
                     "%s: the causal tgt_mask changes the output" % label)
        # post-norm Seq2Seq (E 8): 10 steps - over 30, PyTorch's own float32 loop drifts up to 7e-6 from float64's
        # (LayerNorm of 8 features after each residual), the step comparison's own order
        steps = 10 if cls in (Seq2Seq, Seq2SeqTwo) and not kw.get("norm_first") else 30
        check_rnn.checked(label, name, y, w, model, x, target, input_grad=cls in (Decoder, DecoderLayer), steps=steps)
    structure(pe)
    refusals(pe)
    builds_refused()


def nodes(text):
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("- {name:")]


def structure(pe):
    """The model files: the cross-attention reads the target side and the encoder's output (the memory);
    pre-norm's order; Dropout nodes and the attention's dropout where p > 0."""
    _, _, text = export(pe, Seq2Seq, "tdec_struct")
    ns = nodes(text)
    ca = [ln for ln in ns if "name: transformer.decoder.layers.0.multihead_attn," in ln]
    cr.check(len(ca) == 1 and "inputs: [transformer.decoder.layers.0.norm1, transformer.encoder.norm]" in ca[0],
             "Seq2Seq: decoder layer 0's cross-attention reads norm1 and the encoder's final norm (%s)" % ca)
    names = [ln.split(",")[0].split("name: ")[1] for ln in ns]
    want = ["transformer.decoder.layers.0." + s for s in ("self_attn", "add", "norm1", "multihead_attn", "add_1",
                                                         "norm2", "linear1", "relu", "linear2", "add_2", "norm3")]
    at = names.index(want[0]) if want[0] in names else -1
    cr.check(names[at:at + len(want)] == want, "Seq2Seq post-norm: decoder layer 0's nodes in PyTorch's order "
             "(%s)" % names[at:at + len(want)])
    _, _, text = export(pe, Decoder, "tdec_pre", {"norm_first": True})
    names = [ln.split(",")[0].split("name: ")[1] for ln in nodes(text)]
    want = ["decoder.layers.0." + s for s in ("norm1", "self_attn", "add", "norm2", "multihead_attn", "add_1",
                                             "norm3", "linear1", "gelu", "linear2", "add_2")]
    at = names.index(want[0]) if want[0] in names else -1
    cr.check(names[at:at + len(want)] == want, "Decoder pre-norm: layer 0's nodes in PyTorch's order (%s)"
             % names[at:at + len(want)])
    _, _, text = export(pe, DecoderLayer, "tdec_gelu", {"activation": "nn.GELU"})
    cr.check("{name: decoder.activation, kind: GELU}" in text, "DecoderLayer of nn.GELU(): its GELU node named by "
             "the module (not trained here: PyTorch 1.13 deep-copies such a layer as ReLU)")
    _, _, text = export(pe, Decoder, "tdec_drop", {"dropout": 0.1})
    drops = [ln for ln in nodes(text) if "kind: Dropout" in ln and "decoder.layers.0." in ln]
    mha = [ln for ln in nodes(text) if "kind: MultiheadAttention" in ln and "dropout: 0.1" in ln]
    cr.check(len(drops) == 4 and len(mha) == 4, "Decoder at dropout 0.1: dropout1, 2, 3 and the feed-forward's "
             "Dropout per layer, and the attention's dropout (%d, %d)" % (len(drops), len(mha)))


def refusals(pe):
    for label, cls, kw, want in (
            ("a tgt_mask other than the causal one", Seq2Seq, {"tgt_mask": "other"},
             "its tgt_mask (from the buffer tgt_mask) is a bool mask other than the causal one"),
            ("a memory_key_padding_mask of features", PaddedDecoder, {},
             "its memory_key_padding_mask is function operator.eq at tests/export/tdec.py"),
            ("an activation other than ReLU / GELU", Decoder, {"activation": "F.silu"},
             "psd-export takes 'relu', 'gelu', F.relu, F.gelu, nn.ReLU() and nn.GELU()")):
        import contextlib
        import io
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = export(pe, cls, "tdec_refused", kw)[0]
        msg = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""
        cr.check(rc != 0 and want in msg, "psd-export refuses %s naming it: %s" % (label, msg))


def builds_refused():
    """psd --check-config on MultiheadAttention nodes with cross that do not fit: the message names what."""
    narrow = "{name: q, kind: Narrow, dim: 1, start: 0, length: 4}"
    mha = "kind: MultiheadAttention, embed_dim: 8, num_heads: 2, batch_first: true"
    for nodes, want in (
            (["{name: a, %s, cross: true}" % mha], "cross is true but the node has one input"),
            ([narrow, "{name: w, kind: Narrow, input: input, dim: 2, start: 0, length: 4}",
              "{name: a, inputs: [q, w], %s, cross: true}" % mha],
             "input (4, 8), (6, 4): the memory 'w' is (6, 4) float32 per sample; cross-attention reads (S, 8)"),
            ([narrow, "{name: a, inputs: [q, input], %s, cross: true, causal: true}" % mha], "causal with cross"),
            ([narrow, "{name: a, inputs: [q, input, input], %s}" % mha], "three inputs without cross"),
            ([narrow, "{name: a, inputs: [q, input, input], %s, cross: true}" % mha],
             "input (4, 8), (6, 8), (6, 8): the key padding mask 'input' is (6, 8) float32 per sample; it must be "
             "(6) float32")):
        y = os.path.join(cr.TMP, "tdec_bad.yaml")
        with open(y, "w") as f:
            f.write("name: bad\nstages:\n  - name: s\n    input: {shape: [6, 8]}\n    nodes:\n" +
                    "".join("      - %s\n" % n for n in nodes))
        with open(y + ".conf.yaml", "w") as f:
            f.write("model:\n  file: %s\n" % y)
        r = subprocess.run([os.path.join(cr.BUILD, "bin", "psd"), "--check-config", y + ".conf.yaml"],
                           capture_output=True, text=True, timeout=60)
        cr.check(r.returncode != 0 and want in r.stderr, "psd --check-config refuses a MultiheadAttention saying "
                 "'%s' (%s)" % (want, r.stderr.strip()[-200:]))


if __name__ == "__main__":
    cr.run_main(main)
