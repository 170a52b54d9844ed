#!/usr/bin/python3
"""tests/it_export.sh's Python half: runs psd-export (tools/psd-export, loaded
as a module so PyTorch is imported once) on

  - the tutorials' Net, Policy and word_language_model's RNNModel
    (examples/models/rpc_tutorials.py) with the cuts their shipped files
    document, and compares each result with configs/models/*.yaml
    (tests/export/compare.py: nodes, kinds, attributes, names, stages);
  - a function returning a module whose parameterless module is called
    twice (two nodes, act and act_1);
  - modules it must refuse (tests/export/refused.py), checking the message
    names the culprit and the source line;
  - the hard activations (ReLU6, Hardtanh, Hardswish, Hardsigmoid) as
    modules and functions, to their kinds and attributes; a squeeze-and-
    excitation block's `scale * x` to Mul (and `x * 0.5` to MulConstant);
    torchvision's StochasticDepth and stochastic_depth to StochasticDepth
    (p, mode), at p 0 or outside training to nothing; AdaptiveAvgPool2d
    and adaptive_avg_pool2d to any output size (None entries: null);
    convnext's pieces: x.permute / torch.permute to Permute (one moving the
    batch refused), F.layer_norm of a module's weight and bias to that
    module's LayerNorm, `self.layer_scale * x` to a Scale named by its
    module with its weights under the state_dict names (the same parameter
    multiplied in twice refused);
    densenet's torch.cat of a growing list (of one tensor: nothing);
    shufflenet's x.chunk, torch.split and channel shuffles;
    attention's pieces: torch.bmm, torch.matmul, Tensor.matmul and @ to
    MatMul (a transpose only it reads folded into transpose_b), numbers
    multiplied and divided to MulConstant, x.softmax(-1), x.transpose,
    view/reshape of sizes computed from x.shape (a product of two ranks,
    a transpose of the batch and a tensor divided by one of another rank
    refused); numpy broadcasting (eltwise.py's Broadcasts: x - x.mean(dim=1,
    keepdim=True), x.std, x.norm and a / b node for node; a - b of two
    ranks refused);
    swin's steps written by hand: F.pad to Pad, torch.roll and x.roll to
    Roll, x[..., i::2, j::2, :] and y[:, :2, 1, 4:] to (strided) Narrows
    (a roll without dims and a reflect pad refused);
  - the Proxy.__iter__ fix: RNNModel's `output, hidden = self.rnn(...)`
    does not trace with torch 1.13's own Proxy.__iter__ on this Python
    (else the fix is not what makes rnn_lm export - said, not failed) and
    traces with psd-export's;

and checks each weights file holds the module's state_dict (same names,
values). Writes into the directory given as argv[1].
"""
import contextlib
import importlib.machinery
import importlib.util
import io
import json
import os
import struct
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "export"))
import compare  # noqa: E402

import torch.fx  # noqa: E402

TORCH_PROXY_ITER = torch.fx.Proxy.__iter__       # before psd-export replaces it
loader = importlib.machinery.SourceFileLoader("psd_export", os.path.join(ROOT, "tools", "psd-export"))
spec = importlib.util.spec_from_loader("psd_export", loader)
pe = importlib.util.module_from_spec(spec)
loader.exec_module(pe)

out = sys.argv[1]
TUT = os.path.join(ROOT, "examples", "models", "rpc_tutorials.py")
REF = os.path.join(ROOT, "tests", "export", "refused.py")
failures = []


def run(args):
    err, so = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(so):
        rc = pe.main(args)
    return rc, so.getvalue() + err.getvalue()


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        data = f.read()
    h.pop("__metadata__", None)
    res = {}
    for k, v in h.items():
        a, b = v["data_offsets"]
        dt = {"F32": torch.float32, "I64": torch.int64}[v["dtype"]]
        res[k] = torch.frombuffer(bytearray(data[a:b]), dtype=dt).reshape(v["shape"]) if b > a else \
            torch.zeros(v["shape"], dtype=dt)
    return res


LM_KW = '{"rnn_type": "LSTM", "ntoken": 10000, "ninp": 200, "nhid": 200, "nlayers": 2, "dropout": 0.2}'
CASES = [
    ("mnist_cnn", [TUT + ":Net", "--input-shape", "1,28,28", "--stage", "conv=conv1:flatten",
                   "--stage", "fc=fc1:log_softmax", "--max-batch", "512"], "Net", {}),
    ("cartpole_policy", [TUT + ":Policy", "--input-shape", "4", "--max-batch", "4096",
                         "--stage", "policy=affine1:softmax"], "Policy", {}),
    ("rnn_lm", [TUT + ":RNNModel", "--kwargs", LM_KW, "--input-shape", "", "--input-dtype", "int64",
                "--stage", "emb=encoder:drop", "--stage", "decoder=drop_1:decoder", "--trainer-side", "rnn",
                "--max-batch", "4096"], "RNNModel", json.loads(LM_KW)),
]
spec_t = importlib.util.spec_from_file_location("rpc_tutorials", TUT)
tut = importlib.util.module_from_spec(spec_t)
spec_t.loader.exec_module(tut)

for name, args, cls, kw in CASES:
    y = os.path.join(out, name + ".yaml")
    rc, msg = run(args + ["--name", name, "--seed", "7", "-o", y])
    if rc:
        failures.append(f"{name}: psd-export failed: {msg}")
        continue
    a, b = compare.load(os.path.join(ROOT, "configs", "models", name + ".yaml")), compare.load(y)
    diffs = []
    compare.diff(a, b, "model", diffs)
    if diffs:
        failures.append(f"{name}: the export differs from configs/models/{name}.yaml:\n  " + "\n  ".join(diffs))
    else:
        print(f"ok: {name}: the export of {cls} equals configs/models/{name}.yaml "
              f"({sum(len(s['nodes']) for s in a['stages'])} nodes, {len(a['stages'])} stages)")
    torch.manual_seed(7)
    sd = getattr(tut, cls)(**kw).state_dict()
    w = read_safetensors(os.path.join(out, name + ".safetensors"))
    if set(w) != set(sd):
        failures.append(f"{name}: weights hold {sorted(w)} but the state_dict is {sorted(sd)}")
    elif any(not torch.equal(w[k], sd[k].to(w[k].dtype)) for k in sd):
        failures.append(f"{name}: weights differ from the module's state_dict")
    else:
        print(f"ok: {name}: weights file = the module's state_dict ({len(w)} tensors)")

def traces(module):
    try:
        pe.Tracer(["rnn"]).trace(module)
        return None
    except Exception as e:  # torch's own __iter__ fails on 3.11 (IndexError or TraceError)
        return f"{type(e).__name__}: {e}"


lm = tut.RNNModel("LSTM", 20, 4, 4, 2, 0.0)
torch.fx.Proxy.__iter__ = TORCH_PROXY_ITER
try:
    unfixed = traces(lm)
finally:
    torch.fx.Proxy.__iter__ = pe._proxy_iter
fixed = traces(lm)
if fixed is not None:
    failures.append(f"RNNModel does not trace with psd-export's Proxy.__iter__: {fixed}")
elif unfixed is None:
    print(f"ok: RNNModel traces (torch {torch.__version__} on Python {sys.version.split()[0]} traces "
          f"`output, hidden = self.rnn(...)` without the fix too)")
else:
    print(f"ok: `output, hidden = self.rnn(...)` traces with psd-export's Proxy.__iter__ (torch's own: {unfixed})")

def exported_nodes(target, shape, file, row, want, ok):
    """psd-export REF:target (--input-shape shape) into out/file; its nodes, each
    as row(node), must equal want (else a failure naming them), then ok is printed."""
    path = os.path.join(out, file)
    rc, msg = run([REF + ":" + target, "--input-shape", shape, "-o", path])
    got = [row(n) for n in compare.load(path)["stages"][0]["nodes"]] if rc == 0 else msg
    if got != want:
        failures.append(f"{target}: nodes {got}, expected {want}")
    else:
        print("ok: " + ok)


def name_kind_inputs(n):
    return n["name"], n["kind"], n["inputs"]


exported_nodes("make_shared_activation", "4", "sa.yaml", lambda n: n["name"], ["fc1", "act", "fc2", "act_1"],
               "a function returning the module; a parameterless module called twice is two nodes (act, act_1)")
exported_nodes("HardActivations", "4", "hard.yaml",
               lambda n: (n["name"], n["kind"], n["attrs"].get("min_val"), n["attrs"].get("max_val")),
               [("fc", "Linear", None, None), ("r6", "ReLU6", None, None), ("ht", "Hardtanh", -2.0, 3.0),
                ("hs", "Hardswish", None, None), ("hg", "Hardsigmoid", None, None), ("relu6", "ReLU6", None, None),
                ("hardtanh", "Hardtanh", 0.5, 2.5), ("hardswish", "Hardswish", None, None),
                ("hardsigmoid", "Hardsigmoid", None, None), ("hardtanh_1", "Hardtanh", None, None)],
               "nn.ReLU6/Hardtanh/Hardswish/Hardsigmoid and F.relu6/hardtanh/hardswish/hardsigmoid export as "
               "ReLU6, Hardtanh (min_val, max_val), Hardswish, Hardsigmoid")
exported_nodes("SqueezeExcite", "4,5,5", "se.yaml", name_kind_inputs,
               [("adaptive_avg_pool2d", "AdaptiveAvgPool2d", ["input"]), ("fc", "Conv2d", ["adaptive_avg_pool2d"]),
                ("sigmoid", "Sigmoid", ["fc"]), ("mul", "Mul", ["sigmoid", "input"])],
               "squeeze-and-excitation's `scale * x` exports as Mul [sigmoid, input]")
exported_nodes("residual_drop_off", "4", "rd.yaml", name_kind_inputs,  # stochastic depth at p 0: the identity
               [("fc", "Linear", ["input"]), ("add", "Add", ["fc", "input"]), ("add_1", "Add", ["add", "add"]),
                ("add_2", "Add", ["add_1", "add_1"])],
               "torchvision's StochasticDepth and stochastic_depth at p 0 export as the identity")
exported_nodes("ResidualDrop", "4", "rdp.yaml",
               lambda n: (n["name"], n["kind"], n["inputs"], n["attrs"].get("p"), n["attrs"].get("mode")),
               [("fc", "Linear", ["input"], None, None), ("drop", "StochasticDepth", ["fc"], 0.2, "row"),
                ("add", "Add", ["drop", "input"], None, None),
                ("stochastic_depth", "StochasticDepth", ["add"], 0.3, "batch"),
                ("add_1", "Add", ["stochastic_depth", "add"], None, None),
                ("add_2", "Add", ["add_1", "add_1"], None, None)],
               "torchvision's StochasticDepth (module) and stochastic_depth (function) export as StochasticDepth "
               "with p and mode; outside training as the identity")
exported_nodes("AdaptivePools", "4,2,2", "ap.yaml",
               lambda n: (n["name"], n["kind"], n["attrs"].get("output_size")),
               [("grow", "AdaptiveAvgPool2d", 7), ("keep_h", "AdaptiveAvgPool2d", [None, 3]),
                ("adaptive_avg_pool2d", "AdaptiveAvgPool2d", [2, 5])],
               "nn.AdaptiveAvgPool2d and F.adaptive_avg_pool2d to any size export with output_size (None: null)")
exported_nodes("SpatialMean", "4,5,5", "mean.yaml", name_kind_inputs,
               [("mean", "AdaptiveAvgPool2d", ["input"]), ("mean_1", "AdaptiveAvgPool2d", ["input"]),
                ("mean_1_flatten", "Flatten", ["mean_1"]), ("view", "Reshape", ["mean_1_flatten"]),
                ("add", "Add", ["mean", "view"])],
               "x.mean([2, 3]) exports as AdaptiveAvgPool2d and Flatten, with keepdim=True as AdaptiveAvgPool2d")
exported_nodes("CeilPools", "2,9,9", "ceil.yaml",
               lambda n: (n["name"], n["kind"], n["attrs"].get("ceil_mode"), n["attrs"].get("count_include_pad")),
               [("mp", "MaxPool2d", True, None), ("ap", "AvgPool2d", True, False),
                ("max_pool2d", "MaxPool2d", True, None), ("avg_pool2d", "AvgPool2d", True, None)],
               "nn.MaxPool2d/AvgPool2d and F.max_pool2d/avg_pool2d with ceil_mode=True export with ceil_mode: true")
exported_nodes("DenseJoin", "2,3,3", "dense.yaml", name_kind_inputs,
               [("convs.0", "Conv2d", ["input"]), ("cat", "Concat", ["input", "convs.0"]),
                ("convs.1", "Conv2d", ["cat"]), ("cat_1", "Concat", ["input", "convs.0", "convs.1"]),
                ("convs.2", "Conv2d", ["cat_1"]), ("cat_2", "Concat", ["input", "convs.0", "convs.1", "convs.2"])],
               "densenet's torch.cat of a growing list: of one tensor the identity (no node), then Concats")
exported_nodes("ShuffleUnit", "4,3,3", "shuffle.yaml",
               lambda n: (n["name"], n["kind"], n["inputs"], n["attrs"].get("start"), n["attrs"].get("length"),
                          n["attrs"].get("groups")),
               [("chunk", "Narrow", ["input"], 0, 2, None), ("chunk_1", "Narrow", ["input"], 2, 2, None),
                ("conv", "Conv2d", ["chunk_1"], None, None, None), ("cat", "Concat", ["chunk", "conv"], None, None, None),
                ("channel_shuffle", "ChannelShuffle", ["cat"], None, None, 2),
                ("mix", "ChannelShuffle", ["channel_shuffle"], None, None, 2),
                ("chunk_2", "Narrow", ["mix"], 0, 1, None), ("chunk_3", "Narrow", ["mix"], 1, 2, None),
                ("chunk_4", "Narrow", ["mix"], 3, 1, None),
                ("cat_1", "Concat", ["chunk_4", "chunk_3", "chunk_2"], None, None, None)],
               "shufflenet's x.chunk and torch.split export as Narrow pieces, torchvision's channel_shuffle and "
               "nn.ChannelShuffle as ChannelShuffle")

exported_nodes("LayerScaled", "4,3,3", "ls.yaml",   # eps as a number (YAML 1.1 reads "1e-06" as a string)
               lambda n: (n["name"], n["kind"], {k: float(v) if k == "eps" else v for k, v in n["attrs"].items()}),
               [("conv", "Conv2d", {"out_channels": 4, "kernel_size": 3, "padding": 1, "groups": 4}),
                ("permute", "Permute", {"dims": [0, 2, 3, 1]}), ("norm", "LayerNorm", {"normalized_shape": 4}),
                ("fc", "Linear", {"out_features": 4}), ("permute_1", "Permute", {"dims": [0, -1, 1, 2]}),
                ("block.permute", "Permute", {"dims": [0, 2, 3, 1]}),
                ("block.ln", "LayerNorm", {"normalized_shape": 4, "eps": 1e-06}),
                ("block.permute_1", "Permute", {"dims": [0, 3, 1, 2]}),
                ("block", "Scale", {"shape": [4, 1, 1], "parameter": "layer_scale"}),
                ("add", "Add", {})],
               "x.permute / torch.permute export as Permute, F.layer_norm of a module's weight and bias as that "
               "module's LayerNorm, `self.layer_scale * x` as Scale named by its module (block.layer_scale)")
rc, msg = run([REF + ":LayerScaled", "--input-shape", "4,3,3", "-o", os.path.join(out, "ls.yaml")])
w = read_safetensors(os.path.join(out, "ls.safetensors")) if rc == 0 else {}
torch.manual_seed(0)
want = set(__import__("refused").LayerScaled().state_dict())
if set(w) != want:
    failures.append(f"LayerScaled: weights hold {sorted(w)}, the state_dict {sorted(want)}")
else:
    print(f"ok: LayerScaled: weights file = the state_dict's names, block.layer_scale and block.ln.* among them")

exported_nodes("TinyViT", "2,4,4", "vit.yaml", lambda n: (n["name"], n["kind"], n["inputs"], n["attrs"]),
               [("proj", "Conv2d", ["input"], {"out_channels": 4, "kernel_size": 2, "stride": 2}),
                ("reshape", "Reshape", ["proj"], {"shape": [4, 4]}),
                ("permute", "Permute", ["reshape"], {"dims": [0, 2, 1]}),
                ("class_token", "Parameter", ["input"], {"shape": [1, 1, 4], "expand": [1, 4], "parameter": None}),
                ("cat", "Concat", ["class_token", "permute"], {}),
                ("enc", "Parameter", ["cat"], {"shape": [1, 5, 4], "expand": [5, 4], "parameter": "pos"}),
                ("add", "Add", ["cat", "enc"], {}),
                ("attn", "MultiheadAttention", ["add"], {"embed_dim": 4, "num_heads": 2, "batch_first": True}),
                ("getitem", "Narrow", ["attn"], {"start": 0, "length": 1}),
                ("getitem_view", "Reshape", ["getitem"], {"shape": [4]}),
                ("head", "Linear", ["getitem_view"], {"out_features": 3})],
               "vit's pieces: `n, c, h, w = x.shape` and torch._assert evaluated, a reshape of computed sizes, "
               "the class token expanded (a Parameter of the top module, parameter: null) and joined, a "
               "parameter added (a Parameter named by its module, then Add), self-attention, x[:, 0]")
rc, msg = run([REF + ":TinyViT", "--input-shape", "2,4,4", "-o", os.path.join(out, "vit.yaml")])
w = read_safetensors(os.path.join(out, "vit.safetensors")) if rc == 0 else {}
want = set(__import__("refused").TinyViT().state_dict())
if set(w) != want:
    failures.append(f"TinyViT: weights hold {sorted(w)}, the state_dict {sorted(want)}")
else:
    print("ok: TinyViT: weights file = the state_dict's names (class_token, enc.pos, attn.out_proj.weight, ...)")
# attention written by hand: products of computed tensors, transposes, numbers, sizes computed from x.shape
exported_nodes("ScaleByConstant", "4", "sc.yaml", lambda n: (n["name"], n["kind"], n["attrs"]),
               [("mul", "MulConstant", {"value": 0.5})], "`x * 0.5` exports as MulConstant 0.5")
exported_nodes("Products", "3,4", "prod.yaml",
               lambda n: (n["name"], n["kind"], n["inputs"], {k: v for k, v in n["attrs"].items()
                                                            if k != "out_features"}),
               [("fc", "Linear", ["input"], {}),
                ("matmul", "MatMul", ["fc", "fc"], {"transpose_b": True}),
                ("mul", "MulConstant", ["matmul"], {"value": 0.25}),
                ("softmax", "Softmax", ["mul"], {"dim": -1}),
                ("matmul_1", "MatMul", ["softmax", "fc"], {}),
                ("div", "MulConstant", ["matmul_1"], {"value": 0.5}),
                ("transpose_1", "Permute", ["div"], {"dims": [0, 2, 1]}),
                ("matmul_2", "MatMul", ["transpose_1", "div"], {}),
                ("matmul_3", "MatMul", ["transpose_1", "div"], {}),
                ("add", "Add", ["matmul_2", "matmul_3"], {}),
                ("reshape", "Reshape", ["add"], {"shape": [2, 18]})],
               "torch.bmm, torch.matmul, Tensor.matmul and @ export as MatMul (a transpose of the last two dims "
               "that one product alone reads as its transpose_b, one read twice as a Permute), `0.25 * x` and "
               "`x / 2` as MulConstant, x.softmax(-1) as Softmax, reshape(n, 2, t * c + 6) of x.shape's sizes as "
               "Reshape [2, 18]")

exported_nodes("ShiftedWindows", "5,6,3", "sw.yaml", lambda n: (n["name"], n["kind"], n["inputs"], n["attrs"]),
               [("fc", "Linear", ["input"], {"out_features": 3}),
                ("pad", "Pad", ["fc"], {"pad": [0, 0, 0, 2, 0, 1]}),
                ("roll", "Roll", ["pad"], {"shifts": [-1, 2], "dims": [1, 2]}),
                ("roll_1", "Roll", ["roll"], {"shifts": [3], "dims": [-2]}),
                ("getitem", "Narrow", ["roll_1"], {"start": 0, "length": 3, "step": 2}),
                ("getitem_1", "Narrow", ["getitem"], {"dim": 2, "start": 0, "length": 4, "step": 2}),
                ("getitem_2", "Narrow", ["roll_1"], {"start": 1, "length": 3, "step": 2}),
                ("getitem_3", "Narrow", ["getitem_2"], {"dim": 2, "start": 1, "length": 4, "step": 2}),
                ("cat", "Concat", ["getitem_1", "getitem_3"], {"dim": -1}),
                ("getitem_4", "Narrow", ["cat"], {"start": 0, "length": 2}),
                ("getitem_5", "Narrow", ["getitem_4"], {"dim": 2, "start": 1, "length": 1}),
                ("getitem_6", "Narrow", ["getitem_5"], {"dim": 3, "start": 4, "length": 2}),
                ("getitem_6_view", "Reshape", ["getitem_6"], {"shape": [2, 2]})],
               "swin's steps as a user writes them: F.pad (constant) as Pad, torch.roll and x.roll as Roll, "
               "x[..., i::2, j::2, :] as two strided Narrows, y[:, :2, 1, 4:] as three Narrows and a view")

# the 1-d kinds (tests/export/oned.py)
ONED = os.path.join(ROOT, "tests", "export", "oned.py")
rc, msg = run([ONED + ":SameConv1d", "--input-shape", "3,16", "-o", os.path.join(out, "oned.yaml")])
got = [(n["name"], n["kind"], n["attrs"]) for n in compare.load(os.path.join(out, "oned.yaml"))["stages"][0]["nodes"]] \
    if rc == 0 else msg
want = [("conv", "Conv1d", {"out_channels": 4, "kernel_size": 5, "padding": 4, "dilation": 2}),
        ("valid", "Conv1d", {"out_channels": 4, "kernel_size": 3, "bias": False}),
        ("avg_pool1d", "AvgPool1d", {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
        ("max_pool1d", "MaxPool1d", {"kernel_size": 2, "ceil_mode": True}),
        ("adaptive_avg_pool1d", "AdaptiveAvgPool1d", {"output_size": 3})]
if got != want:
    failures.append(f"SameConv1d: nodes {got}, expected {want}")
else:
    print("ok: Conv1d padding='same' (dilated) and 'valid', F.avg_pool1d, F.max_pool1d and F.adaptive_avg_pool1d "
          "export as Conv1d, AvgPool1d, MaxPool1d, AdaptiveAvgPool1d with their attributes")
for cls, line, needle in [("EvenSameConv1d", "oned.py:26", "Conv1d padding='same' with an even kernel"),
                          ("DilatedMaxPool1d", "oned.py:35", "MaxPool1d with return_indices or dilation")]:
    rc, msg = run([ONED + ":" + cls, "--input-shape", "3,16", "-o", os.path.join(out, "x.yaml")])
    if rc == 0 or line not in msg or needle not in msg:
        failures.append(f"{cls}: expected a refusal naming '{needle}' at {line}, got rc {rc}: {msg}")
    else:
        print(f"ok: refused {cls}: {msg.strip()[:150]}")

# elementwise math (tests/export/eltwise.py)
ELT = os.path.join(ROOT, "tests", "export", "eltwise.py")
rc, msg = run([ELT + ":Arith", "--input-shape", "6", "-o", os.path.join(out, "eltwise.yaml")])
got = [(n["name"], n["kind"], n.get("inputs"), n["attrs"])
       for n in compare.load(os.path.join(out, "eltwise.yaml"))["stages"][0]["nodes"]] if rc == 0 else msg
want = [("fc", "Linear", ["input"], {"out_features": 6}),
        ("rsub", "MulConstant", ["fc"], {"value": -1.0}),
        ("rsub_1", "AddConstant", ["rsub"], {"value": 2.0}),
        ("sub", "AddConstant", ["fc"], {"value": -0.5}),
        ("sub_1", "Sub", ["rsub_1", "sub"], {}),
        ("pow", "Pow", ["sub_1"], {"exponent": 2.0}),
        ("clamp", "Hardtanh", ["pow"], {"min_val": "-inf", "max_val": 3.0}),
        ("clamp_min", "Hardtanh", ["clamp"], {"max_val": "inf"}),          # min_val -1.0: the default
        ("elu", "ELU", ["clamp_min"], {"alpha": 0.5}),
        ("sp", "Softplus", ["elu"], {"beta": 2.0, "threshold": 10.0}),
        ("unsqueeze", "Reshape", ["sp"], {"shape": [1, 6]}),
        ("squeeze", "Reshape", ["unsqueeze"], {"shape": [6]}),
        ("clamp_1", "ReLU", ["squeeze"], {}),
        ("relu", "ReLU", ["clamp_1"], {}),
        ("neg", "MulConstant", ["relu"], {"value": -1.0})]
got = [(nm, k, ins if ins and len(ins) > 1 or nm == "fc" else None, a) for nm, k, ins, a in got] \
    if isinstance(got, list) else got
want = [(nm, k, ins if len(ins) > 1 or nm == "fc" else None, a) for nm, k, ins, a in want]
if got != want:
    failures.append(f"Arith: nodes {got}, expected {want}")
else:
    print("ok: c - x, x - c, x + 0, a - b, ** 2, clamp(max=), clamp_min, nn.ELU, nn.Softplus, unsqueeze, squeeze, "
          "clamp(min=0), ** 1 and -x export as MulConstant, AddConstant, Sub, Pow, Hardtanh with an infinite side, "
          "ELU, Softplus, Reshape, ReLU (nothing for + 0 and ** 1)")
for cls, line, needle in [("PowByTensor", "eltwise.py:27", "pow of a tensor by a number only"),
                          ("ClampByTensor", "eltwise.py:32", "clamp by tensors"),
                          ("SqueezeBatch", "eltwise.py:37", "unsqueeze of dim 0: the batch"),
                          ("UnevenAdaptiveMax", "eltwise.py:46", "AdaptiveMaxPool2d of (2, 3) to (4, 4): psd pools "
                                                                 "adaptively to sizes that divide"),
                          ("SubOfTwoRanks", "eltwise.py:51", "a - b of a (6,) and a (1, 6) tensor (per sample): psd "
                                                             "broadcasts two computed tensors of one rank")]:
    rc, msg = run([ELT + ":" + cls, "--input-shape", "6", "-o", os.path.join(out, "x.yaml")])
    if rc == 0 or line not in msg or needle not in msg:
        failures.append(f"{cls}: expected a refusal naming '{needle}' at {line}, got rc {rc}: {msg}")
    else:
        print(f"ok: refused {cls}: {msg.strip()[:150]}")

# numpy broadcasting, norms and variances as values (tests/export/eltwise.py's Broadcasts)
rc, msg = run([ELT + ":Broadcasts", "--input-shape", "6", "-o", os.path.join(out, "bcast.yaml")])
got = [(n["name"], n["kind"], n.get("inputs"), n["attrs"])
       for n in compare.load(os.path.join(out, "bcast.yaml"))["stages"][0]["nodes"]] if rc == 0 else msg
MEAN6 = [("Reshape", {"shape": [1, 6, 1]}), ("AdaptiveAvgPool2d", {"output_size": [1, None]}),
         ("Reshape", {"shape": [1]})]
want = [("mean_view", *MEAN6[0]), ("mean", *MEAN6[1]), ("mean_view_1", *MEAN6[2]),
        ("sub", "Sub", {}), ("std", *MEAN6[0]), ("std_1", *MEAN6[1]), ("std_2", *MEAN6[2]), ("std_3", "Sub", {}),
        ("std_4", "Pow", {"exponent": 2.0}), ("std_5", *MEAN6[0]), ("std_6", *MEAN6[1]), ("std_7", *MEAN6[2]),
        ("std_8", "MulConstant", {"value": 1.2}), ("std_9", "Sqrt", {}), ("div", "Div", {}),
        ("norm", *MEAN6[0]), ("norm_1", "Normalize", {"dim": 2}), ("norm_2", "Mul", {}), ("norm_3", *MEAN6[1]),
        ("norm_4", "MulConstant", {"value": 6.0}), ("norm_5", *MEAN6[2]), ("div_1", "Div", {})]
pairs = {"sub": ["input", "mean_view_1"], "std_3": ["input", "std_2"], "div": ["sub", "std_9"],
         "norm_2": ["norm", "norm_1"], "div_1": ["div", "norm_5"]}
want = [(nm, k, pairs.get(nm), a) for nm, k, a in want]
got = [(nm, k, ins if nm in pairs else None, a) for nm, k, ins, a in got] if isinstance(got, list) else got
if got != want:
    failures.append(f"Broadcasts: nodes {got}, expected {want}")
else:
    print("ok: x - x.mean(dim=1, keepdim=True), x.std(1, keepdim=True) and s.norm(dim=1, keepdim=True) export as the "
          "mean's Reshape / AdaptiveAvgPool2d / Reshape, Sub, Pow, MulConstant, Sqrt, the norm as sum(x * "
          "Normalize(x)); a / b of tensors as Div")

REFUSALS = [
    ("UsesMatmul", "refused.py:14", "Tensor.t"),
    ("Shared", "refused.py:23", "module 'fc' (Linear) is called at several sites"),
    ("DirectParameter", "refused.py:33", "'scale' is used directly in forward"),
    ("UnknownModule", "refused.py:43", "module 'act' (LPPool1d)"),
    ("MeanOverFeatures", "refused.py:128", "method Tensor.mean over dim 0 of a (2, 4) tensor"),
    ("PermuteBatch", "refused.py:170", "moves the batch dimension"),
    ("ScaleTwice", "refused.py:180", "'inner.gamma' is used at several sites"),
    ("AssertFails", "refused.py:234", "AssertionError: five features"),
    ("AttentionWeights", "refused.py:244", "the attention weights of 'attn' are read"),
    ("CrossAttention", "refused.py:255", "psd's MultiheadAttention is self-attention"),
    ("ProductBroadcast", "refused.py:279", "of a (2, 1, 3, 4) and a (2, 4, 3) tensor", "3,4"),
    ("ProductBroadcast", "refused.py:279", "psd's MatMul takes two computed stacks of matrices of one rank", "3,4"),
    ("TransposeBatch", "refused.py:284", "moves the batch dimension", "3,4"),
    ("DivideByTensor", "refused.py:289", "a / b of a (4,) and a (1, 4) tensor (per sample): psd broadcasts"),
    ("RollFlattened", "refused.py:307", "torch.roll without dims"),
    ("PadCrop", "refused.py:312", "F.pad with pad (-1, 1): psd takes (before, after) pairs of constant sizes, 0 or more"),
]
for cls, line, needle, *shape in REFUSALS:
    rc, msg = run([REF + ":" + cls, "--input-shape", shape[0] if shape else "4", "-o", os.path.join(out, "x.yaml")])
    if rc == 0 or line not in msg or needle not in msg:
        failures.append(f"{cls}: expected a refusal naming '{needle}' at {line}, got rc {rc}: {msg}")
    else:
        print(f"ok: refused {cls}: {msg.strip()[:150]}")

# shrinks, thresholds, PReLU, RReLU, alpha dropout (tests/export/shrink.py)
SHR = os.path.join(ROOT, "tests", "export", "shrink.py")
rc, msg = run([SHR + ":Shrinks", "--input-shape", "4,3", "-o", os.path.join(out, "shrink.yaml")])
got = [(n["name"], n["kind"], n["attrs"]) for n in compare.load(os.path.join(out, "shrink.yaml"))["stages"][0]["nodes"]] \
    if rc == 0 else msg
want = [("prelu", "PReLU", {"num_parameters": 4}), ("prelu1", "PReLU", {}), ("celu", "CELU", {"alpha": 0.5}),
        ("sg", "Softsign", {}), ("ts", "Tanhshrink", {}), ("hs", "Hardshrink", {}),
        ("ss", "Softshrink", {"lambd": 0.25}), ("th", "Threshold", {"threshold": 0.1, "value": -1.0}),
        ("rr", "RReLU", {"lower": 0.1, "upper": 0.3}), ("ad", "AlphaDropout", {"p": 0.2}),
        ("fad", "FeatureAlphaDropout", {"p": 0.3}), ("celu_1", "CELU", {"alpha": 2.0}),
        ("tanhshrink", "Tanhshrink", {}), ("softsign", "Softsign", {}), ("hardshrink", "Hardshrink", {"lambd": 0.3}),
        ("softshrink", "Softshrink", {"lambd": 0.2}), ("_threshold", "Threshold", {"threshold": 0.5, "value": 0.0}),
        ("rrelu", "LeakyReLU", {"negative_slope": 0.22916667}), ("rrelu_1", "RReLU", {"lower": 0.2, "upper": 0.4}),
        ("alpha_dropout", "AlphaDropout", {"p": 0.1}), ("feature_alpha_dropout", "FeatureAlphaDropout", {"p": 0.2})]
sd = read_safetensors(os.path.join(out, "shrink.safetensors")) if rc == 0 else {}
if got != want or sorted(sd) != ["prelu.weight", "prelu1.weight"] or abs(sd["prelu1.weight"].item() - 0.1) > 1e-7:
    failures.append(f"Shrinks: nodes {got}, weights {sorted(sd)}, expected {want} and prelu.weight, prelu1.weight")
else:
    print("ok: nn.PReLU (one slope, per channel; its weights), CELU, Softsign, Tanhshrink, Hardshrink, Softshrink, "
          "Threshold, RReLU, AlphaDropout, FeatureAlphaDropout and their F.* functions export as psd's kinds "
          "(F.rrelu outside training: LeakyReLU at the mean slope; F.alpha_dropout outside training: nothing)")
rc, msg = run([SHR + ":FunctionalPReLU", "--input-shape", "4,3", "-o", os.path.join(out, "fprelu.yaml")])
got = [(n["name"], n["kind"], n["attrs"]) for n in compare.load(os.path.join(out, "fprelu.yaml"))["stages"][0]["nodes"]] \
    if rc == 0 else msg
if got != [("act", "PReLU", {"num_parameters": 4})]:
    failures.append(f"FunctionalPReLU: nodes {got}, expected one PReLU 'act' of 4 slopes")
else:
    print("ok: F.prelu(x, self.act.weight) exports as PReLU 'act' (the weight's state_dict name kept)")
rc, msg = run([SHR + ":PReLUOwnSlope", "--input-shape", "4", "-o", os.path.join(out, "x.yaml")])
if rc == 0 or "shrink.py:51" not in msg or "names its slopes <node>.weight" not in msg:
    failures.append(f"PReLUOwnSlope: expected a refusal naming the slope at shrink.py:51, got rc {rc}: {msg}")
else:
    print(f"ok: refused PReLUOwnSlope: {msg.strip()[:150]}")

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
