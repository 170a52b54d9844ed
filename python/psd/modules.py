"""psd's stages as PyTorch modules (docs/python.md).

RemoteStage: an nn.Module whose forward runs stages on psd. Inside a
psd.context (module in training mode, autograd on) it is a
torch.autograd.Function: a training Forward under the context's id and
the next seq, and on backward a Backward that asks for the input gradient
only when autograd needs it (an image batch or token ids need none).
Outside a context (or under torch.no_grad() / .eval()) it is an inference
Forward: dropout off, nothing recorded.

A stage range is chained across servers as ps-train does (conv on ps0, fc
on ps1: Forward there, its output here, Forward on the other, and back);
an embedding table sharded by rows gets, on each shard's server, the ids
that fall in its rows (1-D, global ids), and its rows are scattered back.

HostedModule: a local module whose parameters psd holds (rnn_lm's "rnn",
the LSTM the trainer runs): psd's weights are fetched when psd's version
changed, and its gradients go to psd by PushGradients when the context
steps.
"""
import grpc
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ._proto import ps_pb2
from .client import default_client
from .context import current
from .errors import Error
from .tensors import from_wire, to_wire

__all__ = ["RemoteStage", "HostedModule"]


class _Whole:
    """Stages first..last, all on one server."""

    def __init__(self, conn, first, last, label):
        self.conn, self.first, self.last, self.label = conn, first, last, label

    def request(self, x):
        return ps_pb2.ForwardRequest(input=to_wire(x), stage=self.first, last_stage=self.last)

    def train(self, ctx, x):
        rec = ctx.new_record(self.label)
        r = ctx.forward_part(self.conn, self.request(x), rec)
        return from_wire(r.output), rec

    def train_loss(self, ctx, x, target):
        req = self.request(x)
        req.targets.CopyFrom(to_wire(target.to(torch.int64)))
        req.want_grad_sq_norm = True
        rec = ctx.new_record(self.label + " (fused loss)")
        r = ctx.forward_part(self.conn, req, rec, out_shape=())
        return r.loss, from_wire(r.input_grad) if r.HasField("input_grad") else None

    def infer(self, client, x):
        req = self.request(x)
        req.trainer_rank = client.rank
        r = client.retrying(self.conn, "Forward", req, what="inference Forward")
        client.note_version(self.conn, r.model_version)
        return from_wire(r.output)


class _Sharded:
    """An embedding stage whose table is split by rows over servers."""

    def __init__(self, stage):
        self.stage, self.label = stage, stage.name
        self.dim = stage.output_shape[-1] if stage.output_shape else 1

    def _split(self, x):
        if x.is_floating_point():
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"stage '{self.label}' takes int64 ids, not {x.dtype}")
        flat = x.reshape(-1).to(torch.int64)
        bad = (flat < 0) | (flat >= self.stage.rows)
        if bool(bad.any()):
            v = int(flat[bad.nonzero()[0, 0]])
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"token id {v} is outside the embedding's "
                        f"{self.stage.rows} rows (stage '{self.label}')")
        for conn, lo, hi in self.stage.shards:
            pos = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            if pos.numel():     # a shard no id falls in is not touched
                yield conn, pos, flat[pos]

    def train(self, ctx, x):
        rec = ctx.new_record(self.label)
        out = torch.empty((x.numel(), self.dim))
        for conn, pos, ids in self._split(x):
            r = ctx.forward_part(conn, ps_pb2.ForwardRequest(input=to_wire(ids), stage=self.label), rec,
                                 positions=pos, out_shape=(ids.numel(), self.dim))
            out[pos] = from_wire(r.output).reshape(-1, self.dim)
        return out.reshape(tuple(x.shape) + (self.dim,)), rec

    def infer(self, client, x):
        out = torch.empty((x.numel(), self.dim))
        for conn, pos, ids in self._split(x):
            req = ps_pb2.ForwardRequest(input=to_wire(ids), stage=self.label, trainer_rank=client.rank)
            r = client.retrying(conn, "Forward", req, what="inference Forward")
            client.note_version(conn, r.model_version)
            out[pos] = from_wire(r.output).reshape(-1, self.dim)
        return out.reshape(tuple(x.shape) + (self.dim,))


class _StageFn(torch.autograd.Function):
    """One segment's training Forward; its Backward on the way back."""

    @staticmethod
    def forward(fctx, seg, ctx, x, anchor):
        out, rec = seg.train(ctx, x)
        fctx.ctx, fctx.rec, fctx.x_shape, fctx.x_dtype = ctx, rec, x.shape, x.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(fctx, g):
        gx = fctx.ctx.backward(fctx.rec, g, fctx.needs_input_grad[2])
        if gx is not None:
            gx = gx.reshape(fctx.x_shape).to(fctx.x_dtype)
        return None, None, gx, None


class _LossFn(torch.autograd.Function):
    """psd's fused cross-entropy: the loss and the input gradient in one
    Forward; the stage's gradients are already in the context."""

    @staticmethod
    def forward(fctx, seg, ctx, x, target, anchor):
        loss, gx = seg.train_loss(ctx, x, target)
        fctx.gx, fctx.x_dtype, fctx.label = gx, x.dtype, seg.label
        return torch.tensor(loss, dtype=torch.float32)

    @staticmethod
    @once_differentiable
    def backward(fctx, g):
        w = float(g)
        if abs(w - 1.0) > 1e-6:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT,
                        f"the fused loss of stage '{fctx.label}' reached the backward with weight {w:g}: psd added its "
                        "gradients with weight 1 when it computed it. Backward the loss itself (or a sum it is a term "
                        "of), or compute F.cross_entropy(stage(x), target) here")
        gx = fctx.gx.to(fctx.x_dtype) if fctx.needs_input_grad[2] and fctx.gx is not None else None
        return None, None, gx, None, None


def _plan(client, stage):
    """The segments of `stage`: a name, (first, last), [names] or None."""
    if stage is None and client.single is not None:
        return [_Whole(client.single, "", "", "the model")]
    if isinstance(stage, str):
        names = [stage]
    elif stage is None:
        names = list(client.stages)
    elif isinstance(stage, tuple) and len(stage) == 2:
        order = list(client.stages)
        for s in stage:
            client.stage(s)
        a, b = order.index(stage[0]), order.index(stage[1])
        if a > b:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"stages ({stage[0]!r}, {stage[1]!r}): {stage[0]} comes "
                        f"after {stage[1]} (stages in order: {', '.join(order)})")
        names = order[a:b + 1]
    elif isinstance(stage, (list, tuple)):
        names = list(stage)
    else:
        raise TypeError(f"psd.RemoteStage: stage must be a name, (first, last), a list of names or None, not {stage!r}")
    segs = []
    for n in names:
        st = client.stage(n)
        if st.shards:
            segs.append(_Sharded(st))
        elif segs and isinstance(segs[-1], _Whole) and segs[-1].conn is st.conn:
            segs[-1].last = n
            segs[-1].label = f"stages {segs[-1].first}..{n}"
        else:
            segs.append(_Whole(st.conn, n, "", f"stage {n}"))
    for i in range(1, len(names)):
        a, b = client.stage(names[i - 1]), client.stage(names[i])
        if a.output_shape != b.input_shape:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"stage {a.name} outputs {list(a.output_shape)} per "
                        f"sample but {b.name} takes {list(b.input_shape)}: name the stages to chain in model order")
    return segs


class RemoteStage(nn.Module):
    """Stages of psd's model as a module.

    stage: "conv" (one stage), ("conv", "fc") (a range, in model order),
    ["emb", ...] (a chain) or None (the whole model, as the tutorial's
    TrainerNet calls its ParameterServer). client: None = the latest
    psd.connect(). Input: (leading dims..., the first stage's per-sample
    shape), float or int64 ids; output float32."""

    def __init__(self, stage, client=None):
        super().__init__()
        self.client = default_client(client)
        self.stage = stage
        self.segments = _plan(self.client, stage)

    def extra_repr(self):
        return f"stage={self.stage!r}, model={self.client.model!r}"

    def _context(self):
        ctx = current(self.client)
        if ctx is not None and self.training and torch.is_grad_enabled():
            return ctx
        if ctx is None and self.training and torch.is_grad_enabled():
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        f"RemoteStage({self.stage!r}) in training mode outside psd.context(): run it inside `with "
                        "psd.context():` to train, or under torch.no_grad() (or after .eval()) for inference")
        return None

    def forward(self, x):
        ctx = self._context()
        if ctx is None:
            with torch.no_grad():
                for seg in self.segments:
                    x = seg.infer(self.client, x)
            return x
        for seg in self.segments:
            x = _StageFn.apply(seg, ctx, x, ctx.anchor)
        return x

    def cross_entropy(self, x, target):
        """F.cross_entropy(self(x), target) with the last stage's loss
        computed on psd (ForwardRequest.targets): only the mean loss and
        the input gradient travel, not the logits. In a context the loss
        must be backwarded with weight 1 (loss.backward()); outside, the
        logits come back and the loss is computed here."""
        ctx = self._context()
        if ctx is None:
            with torch.no_grad():
                for seg in self.segments:
                    x = seg.infer(self.client, x)
            return F.cross_entropy(x.reshape(-1, x.shape[-1]), target.reshape(-1))
        *head, last = self.segments
        if not isinstance(last, _Whole):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"cross_entropy: the last stage of {self.stage!r} is a "
                        "sharded table, not logits")
        for seg in head:
            x = _StageFn.apply(seg, ctx, x, ctx.anchor)
        return _LossFn.apply(last, ctx, x, target, ctx.anchor)

    def train_step(self, x, target):
        """A whole training step in one call (ps-train's default): the
        Forward carries the batch's class ids, and psd computes the mean
        cross-entropy of the stages' output, its backward and the step -
        F.cross_entropy(self(x), target), loss.backward() and ctx.step()
        in one round trip, without the input's gradient. It is the
        context's only call: the stages on one server, an input that needs
        no gradient. Returns (loss, StepResult); a lost reply is settled as
        ctx.step() settles (the loss is then NaN: the reply that carried it
        was lost, the step is known applied)."""
        ctx = self._context()
        if ctx is None:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION, f"RemoteStage({self.stage!r}).train_step: inside "
                        "`with psd.context():`, in training mode")
        if len(self.segments) != 1 or not isinstance(self.segments[0], _Whole):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"train_step: the stages of {self.stage!r} are not all on "
                        "one server (or include a sharded table); use cross_entropy(x, target), loss.backward() and "
                        "ctx.step()")
        if x.requires_grad:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, "train_step: the input requires a gradient, which one call "
                        "a batch does not return; use cross_entropy(x, target), loss.backward() and ctx.step()")
        return ctx.train_step(self.segments[0], x, target)


class HostedModule(nn.Module):
    """A local module whose parameters psd holds (a parameter-only stage,
    e.g. rnn_lm's "rnn" for nn.LSTM(ninp, nhid, 2)).

    Its forward first fetches psd's weights (GetParameters of the stage)
    when psd's model version moved on since they were fetched (as the
    Forwards of the context show it), then runs the module here. In a
    context its gradients go to psd by PushGradients when the context
    steps (ctx.step / ctx.clip_grad_norm_ / ctx.gradients), and psd's
    optimizer applies them with the stages' own. The module's parameters
    are named as psd's without the stage's prefix ("rnn.weight_ih_l0" is
    the module's "weight_ih_l0")."""

    def __init__(self, module, stage, client=None):
        super().__init__()
        self.module = module
        self.stage = stage
        self.client = default_client(client)
        st = self.client.stage(stage)
        if st.conn is None:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"HostedModule: stage '{stage}' is sharded")
        self.conn = st.conn
        remote = {p["name"]: p["shape"] for p in self.client.parameters
                  if p["stage"] == stage and p["server"] == self.conn.name}
        local = dict(module.named_parameters())
        self.names = []         # (psd name, local name)
        for ln, p in local.items():
            hits = [rn for rn in remote if rn.endswith("." + ln) or rn == ln]
            if len(hits) != 1:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"HostedModule: the module's parameter {ln} is "
                            f"{'not' if not hits else 'ambiguously'} among stage '{stage}''s parameters on psd "
                            f"({', '.join(remote)})")
            if tuple(p.shape) != tuple(remote[hits[0]]):
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"HostedModule: {ln} is {list(p.shape)} here but "
                            f"{hits[0]} is {list(remote[hits[0]])} on psd")
            if p.dtype != torch.float32:
                raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"HostedModule: {ln} is {p.dtype}; psd holds float32")
            self.names.append((hits[0], ln))
        missing = set(remote) - {r for r, _ in self.names}
        if missing:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"HostedModule: psd's {', '.join(sorted(missing))} of stage "
                        f"'{stage}' have no parameter in the module")
        self.version = None
        self.pulls = 0

    def extra_repr(self):
        return f"stage={self.stage!r}"

    def pull(self, budget=None):
        """Fetch psd's weights now (budget: the context's, or a fresh one)."""
        got, v = self.client.get_parameters(self.conn, self.stage, budget)
        params = dict(self.module.named_parameters())
        with torch.no_grad():
            for rn, ln in self.names:
                params[ln].copy_(got[rn].reshape(params[ln].shape))
        self.version = v
        self.pulls += 1

    def forward(self, *args, **kwargs):
        ctx = current(self.client)
        seen = ctx.versions.get(self.conn.index) if ctx is not None else self.client.seen_version.get(self.conn.index)
        if self.version is None or seen is None or seen != self.version:
            self.pull(ctx.budget if ctx is not None else None)
        if ctx is not None and self.training and torch.is_grad_enabled():
            ctx.use_hosted(self)
        return self.module(*args, **kwargs)

    def take_gradients(self):
        """[(psd name, gradient)] of the parameters (zeros where none), and
        clear them here: psd holds them from now on."""
        params = dict(self.module.named_parameters())
        out = []
        for rn, ln in self.names:
            p = params[ln]
            out.append((rn, p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)))
            p.grad = None
        return out
