"""psd.state_dict: a PyTorch state_dict from psd (GetParameters), from a
checkpoint file, or from the parts a cluster's servers wrote.

A checkpoint is a safetensors file (server.checkpoint_dir/ckpt-<N>.safetensors)
holding the model's state_dict and psd's metadata (psd.model_version,
psd.cluster, psd.arch, ...). A part of a cluster's checkpoint holds its
server's stages; a part of a sharded table holds rows [lo, hi) of R
(metadata psd.rows.<name> = "lo,hi,R"). Parts are joined as `ps-ckpt merge`
joins them: every row of a sharded table from exactly one part, no tensor
in two parts, one cluster and model, one model version unless
allow_mixed_versions.
"""
import collections
import json
import os
import re
import struct

import torch

__all__ = ["state_dict", "read_safetensors"]

_DT = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
       "BOOL": torch.bool}
_CKPT = re.compile(r"^ckpt-(\d{12,20})\.safetensors$")


def read_safetensors(path):
    """(OrderedDict name -> tensor, metadata dict) of a safetensors file;
    a malformed file is refused naming the file and what is wrong."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header size)")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8 or n > 100 << 20:
        raise ValueError(f"{path}: header of {n} bytes does not fit the file's {len(raw)} bytes")
    try:
        head = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=collections.OrderedDict)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: the header is not JSON: {e}") from None
    meta = head.pop("__metadata__", None) or {}
    data = memoryview(raw)[8 + n:]
    out = collections.OrderedDict()
    for name, t in head.items():
        dt = _DT.get(t.get("dtype"))
        if dt is None:
            raise ValueError(f"{path}: tensor {name}: dtype {t.get('dtype')!r} is not one of {', '.join(_DT)}")
        shape, (a, b) = [int(d) for d in t["shape"]], t["data_offsets"]
        want = torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
        if not 0 <= a <= b <= len(data) or b - a != want:
            raise ValueError(f"{path}: tensor {name} {shape}: bytes [{a}, {b}) of {len(data)}, expected {want} bytes")
        buf = bytearray(data[a:b])
        out[name] = (torch.frombuffer(buf, dtype=dt) if want else torch.empty(0, dtype=dt)).reshape(shape)
    return out, meta


def _newest(d):
    best = None
    for p in os.listdir(d):
        m = _CKPT.match(p)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), os.path.join(d, p))
    return best[1] if best else None


def _files(path):
    """The checkpoint file(s) a path names: a file; a directory's newest
    ckpt-<N>.safetensors; or, for a cluster's server.checkpoint_dir, the
    newest of each server's subdirectory."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such checkpoint file or directory")
    one = _newest(path)
    if one:
        return [one]
    parts = [_newest(os.path.join(path, s)) for s in sorted(os.listdir(path)) if os.path.isdir(os.path.join(path, s))]
    parts = [p for p in parts if p]
    if not parts:
        raise FileNotFoundError(f"{path}: no ckpt-<N>.safetensors in it or in its servers' subdirectories")
    return parts


def _merge(paths, allow_mixed_versions):
    out = collections.OrderedDict()
    rows = {}               # name -> [(lo, hi, path)]
    first = None
    for p in paths:
        tensors, meta = read_safetensors(p)
        ident = (meta.get("psd.cluster", ""), meta.get("psd.arch", ""))
        if first is None:
            first = (p, ident, meta.get("psd.model_version"))
        elif ident != first[1]:
            raise ValueError(f"{p}: a part of cluster {ident[0]!r} (model {ident[1]!r}), but {first[0]} is of cluster "
                             f"{first[1][0]!r} (model {first[1][1]!r})")
        elif meta.get("psd.model_version") != first[2] and not allow_mixed_versions:
            raise ValueError(f"{p}: model version {meta.get('psd.model_version')}, but {first[0]} is at {first[2]} "
                             "(allow_mixed_versions=True joins them anyway)")
        for name, t in tensors.items():
            spec = meta.get(f"psd.rows.{name}")
            if spec:
                try:
                    lo, hi, total = (int(x) for x in spec.split(","))
                except ValueError:
                    raise ValueError(f"{p}: psd.rows.{name} = {spec!r} is not 'lo,hi,R'") from None
                if hi - lo != t.shape[0] or not 0 <= lo < hi <= total:
                    raise ValueError(f"{p}: {name} holds {t.shape[0]} rows, psd.rows.{name} says [{lo}, {hi}) of {total}")
                if name not in out:
                    out[name] = torch.empty((total,) + tuple(t.shape[1:]), dtype=t.dtype)
                    rows[name] = []
                if out[name].shape[0] != total:
                    raise ValueError(f"{p}: {name} has {total} rows here, {out[name].shape[0]} in another part")
                for a, b, q in rows[name]:
                    if lo < b and a < hi:
                        raise ValueError(f"{p}: rows [{lo}, {hi}) of {name} overlap rows [{a}, {b}) of {q}")
                out[name][lo:hi] = t
                rows[name].append((lo, hi, p))
            elif name in out:
                raise ValueError(f"{p}: tensor {name} is in another part too")
            else:
                out[name] = t
    for name, rs in rows.items():
        if sum(b - a for a, b, _ in rs) != out[name].shape[0]:
            have = ", ".join(f"[{a}, {b})" for a, b, _ in sorted(rs))
            raise ValueError(f"{name}: the parts hold rows {have} of its {out[name].shape[0]}: a part is missing")
    return out


def state_dict(path_or_client, allow_mixed_versions=False):
    """A PyTorch state_dict (name -> tensor) of psd's model, from:
    - a psd.Client: the current weights of every server (GetParameters,
      paged; a sharded table put back together);
    - a checkpoint file ckpt-<N>.safetensors, or a checkpoint directory
      (its newest file; a cluster's server.checkpoint_dir: the newest part
      of each server);
    - a list of a cluster's checkpoint parts (files, or each server's
      directory: its newest file).
    Loads into the model with load_state_dict(strict=True)."""
    if hasattr(path_or_client, "state_dict") and hasattr(path_or_client, "conns"):
        return path_or_client.state_dict()
    if isinstance(path_or_client, (list, tuple)):
        paths = [f for p in path_or_client for f in _files(os.fspath(p))]
    else:
        paths = _files(os.fspath(path_or_client))
    if not paths:
        raise ValueError("psd.state_dict: no checkpoint files given")
    return _merge(paths, allow_mixed_versions)
