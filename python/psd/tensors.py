"""torch tensors <-> ps.Tensor (proto/ps.proto): little-endian bytes of
the dtype plus a shape. float32 by default; int64 for ids (DType INT64).
Floating tensors travel as float32, integer ones as int64."""
import numpy as np
import torch

from ._proto import ps_pb2

F32, I64 = ps_pb2.FLOAT32, ps_pb2.INT64
_NP = {F32: np.dtype("<f4"), I64: np.dtype("<i8")}


def to_wire(t, name=""):
    """ps.Tensor of torch tensor t (detached, on the CPU)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_floating_point():
        dt, t = F32, t.to(torch.float32)
    elif t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        dt, t = I64, t.to(torch.int64)
    else:
        raise TypeError(f"psd: tensor of dtype {t.dtype}: psd takes floating (float32) or integer (int64) tensors")
    a = t.contiguous().numpy()
    if a.dtype.byteorder == ">":
        a = a.astype(_NP[dt])
    return ps_pb2.Tensor(name=name, shape=list(t.shape), data=a.tobytes(), dtype=dt)


def from_wire(m):
    """torch tensor (a copy) of ps.Tensor m."""
    dt = _NP.get(m.dtype)
    if dt is None:
        raise ValueError(f"psd: tensor '{m.name}' has dtype {m.dtype}, which this client does not know")
    shape = tuple(m.shape)
    n = int(np.prod(shape)) if shape else 1
    if len(m.data) != n * dt.itemsize:
        raise ValueError(f"psd: tensor '{m.name}' of shape {list(shape)} has {len(m.data)} bytes, expected "
                         f"{n * dt.itemsize}")
    a = np.frombuffer(m.data, dtype=dt).reshape(shape)
    return torch.from_numpy(a.astype(a.dtype.newbyteorder("="), copy=True))
