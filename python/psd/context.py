"""Training contexts: PyTorch's dist_autograd.context() for psd
(docs/python.md; the rules are docs/protocol.md's).

    with psd.context(client) as ctx:         # one context id, on every server it touches
        loss = F.nll_loss(fc(conv(x)), y)    # training Forwards, recorded under (id, seq)
        loss.backward()                      # Backwards (input gradients only where autograd needs them)
        ctx.step()                           # Step on every touched server, exactly once

A context records each training Forward of a RemoteStage (one seq each).
loss.backward() sends a Backward at once for a forward whose input needs a
gradient (the input gradient comes back); the others wait and travel
together in one Backward per server with the step (with step=true when one
server is touched and nothing is scaled: one round trip, as ps-train
--fuse-step). HostedModules' gradients go by PushGradients before the step.

Failures follow docs/protocol.md: UNAVAILABLE and DEADLINE_EXCEEDED are
retried within the context's budget (trainer.retry_max_s, from the first
failure); an unanswered Step is settled by asking Step again (applied /
not applied); a context psd no longer knows raises ContextLost - nothing of
it was applied anywhere - and `psd.attempts()` runs the batch again under
a new context, at most three times, and one a sync round closed without
(RoundClosed: a straggler, nothing applied) into the open round, at most
four times in a row, as ps-train does; a cluster step applied on some servers
and lost on others is a partial step: logged, reported (ReportPartial),
not run again.
"""
import logging
import math
import threading
import warnings

import grpc
import torch

from ._proto import ps_pb2
from .client import default_client, read_pages
from .errors import ContextLost, Error, RoundClosed
from .retry import MAX_LATE, MAX_LOST
from .tensors import from_wire, to_wire

log = logging.getLogger("psd")
_tls = threading.local()

_LOST = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)
RELEASE_TIMEOUT_S = 2.0   # ReleaseContext's deadline (or trainer.rpc_timeout_s when shorter), as ps-train's


def current(client=None):
    """The innermost open context of this thread (for `client`, if given)."""
    for c in reversed(getattr(_tls, "stack", [])):
        if client is None or c.client is client:
            return c
    return None


class Record:
    """One training Forward: its seq and, per server part, what Backward needs."""
    __slots__ = ("seq", "parts", "backwarded", "what")

    def __init__(self, seq, what):
        self.seq, self.what = seq, what
        self.parts = []           # [(conn, out_shape, positions or None)]
        self.backwarded = False


class StepResult:
    """What ctx.step() did.

    version:        the model version after the step (the largest over servers)
    skipped:        psd skipped it (non-finite values, server.nonfinite_policy skip)
    round, round_contexts: consistency sync: the round it was applied in, and its contexts
    round_scalars:  {name: {count, min, mean, max, ema}} of the step's metrics round
    metrics_round, solved: psd's round metrics (server.stop_metric crossed)
    grad_norm:      the global gradient norm, when clip_grad_norm_ computed it
    partial:        a cluster step applied on applied_on and lost on lost_on
    """

    def __init__(self):
        self.version = 0
        self.skipped = False
        self.round = 0
        self.round_contexts = 0
        self.round_scalars = {}
        self.metrics_round = 0
        self.solved = False
        self.grad_norm = None
        self.partial = False
        self.applied_on, self.lost_on = [], []

    def __repr__(self):
        extra = f", partial (applied on {self.applied_on}, lost on {self.lost_on})" if self.partial else ""
        return f"<psd.StepResult version {self.version}{', skipped' if self.skipped else ''}{extra}>"


class Context:
    """One context id on every server it touches; see the module comment."""

    def __init__(self, client=None, _budget=None, _attempts=None):
        self.client = default_client(client)
        self.id = self.client.ids.next()
        self.budget = _budget or self.client.new_budget()
        self._attempts = _attempts
        self.seq = 0
        self.records = []
        self.pending = {}        # conn index -> [(seq, grad)] Backwards that wait for the step
        self.touched = []        # conns that may hold state of this context, in order
        self.sq_norm = {}        # conn index -> the context's squared gradient norm there (latest reply)
        self.round = {}          # conn index -> ForwardResponse.round of the context's first Forward there
        self.versions = {}       # conn index -> model_version of this context's latest Forward there
        self.hosted = []         # HostedModules that ran in this context
        self.pushed = set()      # ... whose gradients were sent
        self.clip = 1.0
        self.grad_norm = None
        self.state = "new"       # new, open, stepped, closed
        self.result = None
        self.anchor = torch.zeros((), requires_grad=True)  # makes remote outputs require grad

    # ---- with ------------------------------------------------------------

    def __enter__(self):
        if self.state != "new":
            raise Error(grpc.StatusCode.FAILED_PRECONDITION, "a psd.context is entered once; make a new one")
        if current(self.client) is not None:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION, "psd.context() inside another psd.context() of the "
                        "same client: contexts do not nest")
        _tls.stack = getattr(_tls, "stack", []) + [self]
        self.state = "open"
        return self

    def __exit__(self, typ, exc, tb):
        _tls.stack = [c for c in _tls.stack if c is not self]
        was = self.state
        self.state = "closed"
        if typ is None and was == "open" and self.touched:
            warnings.warn(f"psd context {self.id:x} ended without ctx.step(): its gradients were not applied "
                          "(released on psd)", stacklevel=2)
        if was != "stepped":
            self._release()
        if isinstance(exc, ContextLost) and self._attempts is not None:
            return self._attempts._lost(self, exc)
        if isinstance(exc, RoundClosed) and self._attempts is not None:
            return self._attempts._late(self, exc)
        return False

    def _release(self):
        """ReleaseContext on every server the context touched: it ends
        unstepped (lost, refused, an exception, no ctx.step()) and the batch
        may run again under a new context, so psd frees it now rather than
        after server.context_ttl_s, and it stops counting against this
        client's share (docs/protocol.md). Never un-applies anything: a
        context psd stepped keeps its record. One try each, on a short
        deadline, every failure ignored (an older psd: UNIMPLEMENTED)."""
        timeout = min(self.client.cfg.rpc_timeout_s, RELEASE_TIMEOUT_S)
        for conn in self.touched:
            try:
                conn.call_once("ReleaseContext", ps_pb2.ReleaseContextRequest(context_id=self.id,
                                                                              trainer_rank=self.client.rank),
                               timeout=timeout)
                self.client.released += 1
            except Error:
                pass

    def _need_open(self, what):
        if self.state != "open":
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        f"{what}: the context is {self.state}; use it inside its `with` block"
                        + (" (ctx.step() already applied it)" if self.state == "stepped" else ""))

    def _touch(self, conn):
        if conn not in self.touched:
            self.touched.append(conn)

    def _lost(self, e, why):
        self.state = "lost"
        if isinstance(e, ContextLost):
            return e
        return ContextLost(e.code, f"context {self.id:x}: {why}: {e.details}", e.method, e.server)

    # ---- calls under the context ------------------------------------------

    def _call(self, conn, method, req, idempotent):
        """conn.call with the context's budget: retryable failures are
        retried (the call is safe to repeat: a Forward is answered from
        psd's record, a PushGradients adds once); NOT_FOUND: ContextLost.
        Returns (reply, retried)."""
        retried = False
        while True:
            try:
                return conn.call(method, req), retried
            except Error as e:
                if e.retryable and idempotent and self.budget.wait(method, str(e)):
                    retried = True
                    continue
                if e.code == grpc.StatusCode.NOT_FOUND:
                    raise self._lost(e, "psd no longer knows it (restarted, or the context expired)") from None
                e.retried = retried
                raise

    def new_record(self, what):
        """The next training Forward of the context (its seq)."""
        self._need_open(what)
        rec = Record(self.seq, what)
        self.seq += 1
        self.records.append(rec)
        return rec

    def forward_part(self, conn, req, rec, positions=None, out_shape=None):
        """One server's part of record rec's Forward (req: input, stage,
        targets set): the whole forward, or a shard's rows (positions: the
        rows of the output they fill). Returns the reply."""
        req.context_id, req.train, req.trainer_rank, req.seq = self.id, True, self.client.rank, rec.seq
        # an earlier Forward of the context went there: psd must still hold it (a retry after a restart is
        # NOT_FOUND instead of opening a fresh context without the earlier forwards' gradients)
        req.context_known = conn in self.touched
        self._touch(conn)
        fused = req.HasField("targets")
        try:
            r, _ = self._call(conn, "Forward", req, idempotent=True)
        except ContextLost:
            raise
        except Error as e:
            # a fused Forward is not answered from the record: psd refuses its retry; nothing applied
            if fused and e.code == grpc.StatusCode.FAILED_PRECONDITION and getattr(e, "retried", False):
                raise self._lost(e, "a retried fused-loss Forward") from None
            raise
        if conn.index not in self.round:
            self.round[conn.index] = r.round
        self.versions[conn.index] = r.model_version
        self.client.note_version(conn, r.model_version)
        if fused:
            self.sq_norm[conn.index] = r.grad_sq_norm
            rec.backwarded = True   # psd backwarded it with the loss
        rec.parts.append((conn, out_shape if out_shape is not None else tuple(r.output.shape), positions))
        return r

    def backward(self, rec, grad, need_input):
        """Autograd's gradient of record rec's output: a Backward now (with
        the input gradient) when need_input, else queued for the step.
        Returns the input gradient (flat rows, as sent) or None."""
        self._need_open("backward")
        if rec.backwarded:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        f"{rec.what} (seq {rec.seq}) of context {self.id:x} was already backwarded: psd adds each "
                        "forward's gradient once (one loss.backward() per context; retain_graph does not help)")
        rec.backwarded = True
        conn, out_shape, positions = rec.parts[0]
        if positions is not None or not need_input:
            flat = grad.reshape(-1, grad.shape[-1]) if positions is not None else grad
            for conn, out_shape, pos in rec.parts:
                g = flat[pos].reshape(out_shape) if pos is not None else grad.reshape(out_shape)
                self.pending.setdefault(conn.index, []).append((rec.seq, g))
            return None
        r = self._backward_call(conn, [(rec.seq, grad.reshape(out_shape))], want_input=True)
        return from_wire(r.input_grads[0])

    def _backward_call(self, conn, items, want_input=False, step=False, scalars=None):
        req = ps_pb2.BackwardRequest(context_id=self.id, seq=items[0][0], grad_output=to_wire(items[0][1]),
                                     want_input_grad=want_input, step=step)
        if len(items) > 1:
            req.more_seqs.extend(s for s, _ in items[1:])
            req.more_grad_outputs.extend(to_wire(g) for _, g in items[1:])
        if step:
            req.round = self.round.get(conn.index, 0)
            if scalars:
                req.scalars.extend(ps_pb2.ScalarValue(name=k, value=float(v)) for k, v in scalars.items())
        # Retried when unanswered: psd applied it or not. A retry psd refuses
        # (FAILED_PRECONDITION: already backwarded) leaves the context with
        # gradients whose input gradients are gone: not applied, run again.
        retried = False
        while True:
            try:
                r, _ = self._call(conn, "Backward", req, idempotent=False)
                break
            except ContextLost:
                raise
            except Error as e:
                if e.retryable and not step and self.budget.wait("Backward", str(e)):
                    retried = True
                    continue
                if e.code == grpc.StatusCode.FAILED_PRECONDITION and retried:
                    raise self._lost(e, "a retried Backward was refused") from None
                raise
        if not step:
            self.sq_norm[conn.index] = r.grad_sq_norm
        return r

    def _flush(self, step_conn=None, scalars=None):
        """The queued Backwards, one call per server (more_seqs, at most
        4096 a call). With step_conn: that server's last call with
        step=true; returns its reply."""
        last = None
        for conn in self.touched:
            items = self.pending.pop(conn.index, None)
            if not items:
                continue
            chunks = [items[k:k + 4096] for k in range(0, len(items), 4096)]
            for i, ch in enumerate(chunks):
                if conn is step_conn and i == len(chunks) - 1:
                    last = self._backward_call(conn, ch, step=True, scalars=scalars)
                else:
                    self._backward_call(conn, ch)
        return last

    def _push(self):
        """PushGradients of every HostedModule that ran in the context."""
        for h in self.hosted:
            if id(h) in self.pushed:
                continue
            conn = h.conn
            grads = h.take_gradients()
            # a Forward of the context went there first: psd must still hold it (after a restart it answers
            # NOT_FOUND instead of opening a fresh context that would step these gradients alone)
            req = ps_pb2.PushGradientsRequest(context_id=self.id, trainer_rank=self.client.rank,
                                              gradients=[to_wire(g, name) for name, g in grads],
                                              context_known=conn in self.touched)
            self._touch(conn)
            r, _ = self._call(conn, "PushGradients", req, idempotent=True)
            self.sq_norm[conn.index] = r.grad_sq_norm
            self.pushed.add(id(h))

    def use_hosted(self, h):
        if h not in self.hosted:
            self.hosted.append(h)

    def _check_backwarded(self, what):
        left = [r for r in self.records if not r.backwarded]
        if left:
            names = ", ".join(f"{r.what} (seq {r.seq})" for r in left[:8]) + (" ..." if len(left) > 8 else "")
            raise Error(grpc.StatusCode.FAILED_PRECONDITION,
                        f"{what}: {len(left)} training forward(s) of context {self.id:x} got no gradient: {names}. "
                        "psd steps a context once every recorded forward was backwarded: call loss.backward() "
                        "first, on a loss every training output of the context contributes to")

    # ---- public -------------------------------------------------------------

    def gradients(self):
        """The context's gradients on psd, named as the state_dict
        (dist_autograd.get_gradients; GetGradients on every touched server,
        a sharded table's shards put back together). Sends the queued
        Backwards and the HostedModules' gradients first."""
        self._need_open("ctx.gradients()")
        self._push()
        self._flush()
        out = {}
        info = {}
        for c in self.touched:
            info = {p.name: p for p in c.params}
            got, _ = read_pages(lambda req, c=c: self._call(c, "GetGradients", req, idempotent=True)[0],
                                ps_pb2.GetGradientsRequest(context_id=self.id),
                                "gradients", str(c))
            for name, g in got.items():
                p = info.get(name)
                if p is not None and p.rows_total:
                    full = out.setdefault(name, torch.zeros((p.rows_total,) + tuple(g.shape[1:])))
                    full[p.row_offset:p.row_offset + g.shape[0]] = g
                elif name in out:
                    out[name] = out[name] + g
                else:
                    out[name] = g
        return out

    def clip_grad_norm_(self, max_norm, parameters=None):
        """torch.nn.utils.clip_grad_norm_ over every parameter of the
        context: psd's (each touched server reports its part of the norm)
        and, with `parameters`, local ones whose .grad is scaled here. psd's
        are scaled by the step (StepRequest.grad_scale), the same factor on
        every server. Returns the total norm before clipping."""
        self._need_open("ctx.clip_grad_norm_()")
        self._check_backwarded("ctx.clip_grad_norm_()")
        self._push()
        self._flush()
        local = [p for p in (parameters or []) if p.grad is not None]
        sq = sum(self.sq_norm.get(c.index, 0.0) for c in self.touched)
        sq += sum(float(p.grad.detach().double().pow(2).sum()) for p in local)
        norm = math.sqrt(sq)
        coef = float(max_norm) / (norm + 1e-6)
        self.clip = coef if coef < 1 else 1.0
        if coef < 1:
            for p in local:
                p.grad.detach().mul_(coef)
        self.grad_norm = norm
        return torch.tensor(norm)

    def step(self, grad_scale=None, scalars=None):
        """Apply the context's gradients exactly once on every server it
        touched, then free it. grad_scale multiplies them first (with plain
        SGD an lr schedule; clip_grad_norm_'s factor is applied too).
        scalars: {name: value} for psd's round metrics (at most 8). Returns a
        StepResult. Raises ContextLost (nothing applied: run the batch again)
        or RoundClosed (sync: dropped as a straggler)."""
        self._need_open("ctx.step()")
        if not self.touched and not self.hosted:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION, "ctx.step(): nothing to apply: no training forward "
                        "ran in this context (a RemoteStage in training mode, inside the with block)")
        self._check_backwarded("ctx.step()")
        scale = self.clip * (1.0 if grad_scale is None else float(grad_scale))
        if not (scale > 0 and math.isfinite(scale)):
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"ctx.step(): grad_scale {scale}: a positive number")
        if scalars and len(scalars) > 8:
            raise Error(grpc.StatusCode.INVALID_ARGUMENT, f"ctx.step(): {len(scalars)} scalars; at most 8")
        self._push()
        res = StepResult()
        res.grad_norm = self.grad_norm
        fuse = len(self.touched) == 1 and self.pending.get(self.touched[0].index) and scale == 1.0 and not scalars
        outcome = {}
        if fuse:  # the queued Backwards with step=true: one round trip
            conn = self.touched[0]
            outcome[conn.index] = self._settle(conn, lambda: self._flush(step_conn=conn), scale, scalars)
        else:
            self._flush()
            for conn in self.touched:
                outcome[conn.index] = self._settle(conn, None, scale, scalars)
        applied = [c for c in self.touched if outcome[c.index][0] == "applied"]
        lost = [c for c in self.touched if outcome[c.index][0] == "lost"]
        for c in applied:
            self._fill(res, c, outcome[c.index][1])
        if lost and not applied:
            e = outcome[lost[0].index][1]
            self.client.reruns += 1
            if len(self.touched) > 1:
                self.state = "lost"
                raise ContextLost(e.code, f"context {self.id:x} not applied on any server "
                                  f"({', '.join(c.name for c in lost)} lost it): {e}", "Step", None)
            raise self._lost(e, "not applied")
        if lost:
            res.partial = True
            res.applied_on, res.lost_on = [c.name for c in applied], [c.name for c in lost]
            self.client.partial_steps += 1
            an, ln = ", ".join(res.applied_on), ", ".join(res.lost_on)
            log.warning("%s: partial step: batch of context %x applied on %s, lost on %s (context gone there: "
                        "restarted or expired); not run again, that would apply it twice on %s", self.client.who,
                        self.id, an, ln, an)
            self.client.report_partial(self.id, applied, lost)
        self.state = "stepped"
        self.result = res
        return res

    def train_step(self, seg, x, target):
        """RemoteStage.train_step's call: one Forward with targets,
        step=true and skip_input_grad on seg's server, settled as a step.
        Returns (loss tensor, StepResult)."""
        self._need_open("train_step")
        if self.touched or self.hosted:
            raise Error(grpc.StatusCode.FAILED_PRECONDITION, "train_step: the context already ran other calls; one "
                        "call a batch is the whole batch (a fresh psd.context() for it)")
        conn = seg.conn
        req = seg.request(x)
        req.targets.CopyFrom(to_wire(target.to(torch.int64)))
        req.step, req.skip_input_grad = True, True
        rec = self.new_record(seg.label + " (one call a batch)")
        req.context_id, req.train, req.trainer_rank, req.seq = self.id, True, self.client.rank, rec.seq
        self._touch(conn)
        rec.backwarded = True    # psd backwards it with the loss
        # kept from the moment it is sent: unanswered, a Step says whether
        # psd applied it (docs/protocol.md, "A whole unit in one call")
        kind, r = self._settle(conn, lambda: conn.call("Forward", req), 1.0, None)
        if kind == "lost":
            self.client.reruns += 1
            raise self._lost(r, "not applied")
        res = StepResult()
        if isinstance(r, ps_pb2.ForwardResponse):
            if r.step_version == 0 and not r.skipped:   # a step leaves version >= 1: psd ignored `step`
                self.state = "closed"
                raise Error(grpc.StatusCode.FAILED_PRECONDITION, "train_step: psd answered the Forward without "
                            "stepping it (a psd older than one call a batch?); use cross_entropy(x, target), "
                            "loss.backward() and ctx.step()", "Forward", conn.name)
            res.version, res.skipped, res.round = r.step_version, r.skipped, r.round
            self.client.note_version(conn, r.step_version)
            loss = r.loss
        else:
            self._fill(res, conn, r)
            loss = float("nan")
        self.state = "stepped"
        self.result = res
        return torch.tensor(loss, dtype=torch.float32), res

    def _settle(self, conn, first, scale, scalars):
        """Step on conn (or `first`, the fused Backward), settled when
        unanswered: ("applied", reply) or ("lost", error); anything else
        raises (RoundClosed for a closed sync round)."""
        req = ps_pb2.StepRequest(context_id=self.id, round=self.round.get(conn.index, 0),
                                 grad_scale=0.0 if scale == 1.0 else scale)
        if scalars:
            req.scalars.extend(ps_pb2.ScalarValue(name=k, value=float(v)) for k, v in scalars.items())
        call = first or (lambda: conn.call("Step", req))
        try:
            return "applied", call()
        except ContextLost as e:
            return "lost", e
        except Error as e:
            err = e
        settled = False
        # unanswered: was it applied? Step is idempotent on psd: ask until it answers
        while err.retryable:
            if not self.budget.wait("settling the step", str(err)):
                raise err
            settled = True
            try:
                r = conn.call("Step", req)
            except Error as e:
                err = e
                continue
            # OK: psd answered its version (its record; after a restart, its
            # checkpoint's) - as ps-train logs it
            log.warning("%s: context %x was applied once (its Step answers OK); not running the batch again",
                        self.client.who, self.id)
            return "applied", r
        if settled and err.code == grpc.StatusCode.ALREADY_EXISTS:
            # "too old to settle": applied once, longer ago than psd remembers
            # its version - applied, never run again (ps_retry_settled); the
            # version is unknown (0 in the result)
            log.warning("%s: context %x was applied once (%s); not running the batch again", self.client.who,
                        self.id, err.details)
            return "applied", ps_pb2.StepResponse()
        if isinstance(err, RoundClosed):
            self.state = "closed"
            raise err
        several = len(self.touched) > 1
        # NOT_FOUND: the context is gone. FAILED_PRECONDITION: no gradients
        # yet - when settling, or on several servers (ps_retry_once_multi);
        # from one server's first answer it is final (ps_retry_once).
        if err.code == grpc.StatusCode.NOT_FOUND or (err.code in _LOST and (settled or several)):
            if not several:
                log.warning("%s: context %x not applied (%s); running the batch again", self.client.who, self.id,
                            err.status)
            return "lost", err
        if several:
            raise Error(err.code, f"Step of context {self.id:x} on {conn.name}: {err.details}", err.method,
                        err.server) from None
        raise err

    def _fill(self, res, conn, r):
        res.version = max(res.version, r.model_version)
        res.skipped = res.skipped or r.skipped
        res.round = r.round
        if isinstance(r, ps_pb2.StepResponse):
            res.round_contexts = r.round_contexts
            res.metrics_round = r.metrics_round
            res.solved = res.solved or r.solved
            res.round_scalars = {s.name: {"count": s.count, "min": s.min, "mean": s.mean, "max": s.max,
                                          "ema": s.ema} for s in r.round_scalars}
        self.client.note_version(conn, r.model_version)


def context(client=None):
    """A training context (dist_autograd.context()): `with psd.context()
    as ctx:` ... `loss.backward()` ... `ctx.step()`. client: None = the
    latest psd.connect(). Raises ContextLost when psd lost the context
    (nothing applied); psd.attempts() runs the batch again for you."""
    return Context(client)


class _Attempts:
    def __init__(self, client, max_lost, max_late):
        self.client = default_client(client)
        self.max_lost, self.max_late = max_lost, max_late
        self.lost = self.late = 0
        self.again = False

    def _lost(self, ctx, exc):
        self.lost += 1
        if self.lost > self.max_lost:
            exc.args = (f"{exc.args[0]} (the batch lost its context {self.lost} times in a row)",)
            return False
        log.warning("%s: %s; running the batch again (psd restarted or the context expired)", self.client.who, exc)
        self.again = True
        return True

    def _late(self, ctx, exc):
        # sync: the round closed without this context's step (a straggler);
        # nothing applied - run the batch again under a new context, which
        # joins the open round (ps_retry_once's late_again)
        self.late += 1
        if self.late > self.max_late:
            exc.args = (f"{exc.args[0]} (the batch was late for its sync round {self.late} times in a row: is "
                        "this trainer much slower than the others, or server.sync_timeout_s too short?)",)
            return False
        log.warning("%s: %s; running the batch again under a new context (it joins the open round)",
                    self.client.who, exc)
        self.client.reruns += 1
        self.again = True
        return True


def attempts(client=None, max_lost=MAX_LOST, max_late=MAX_LATE):
    """Contexts for one batch, until one is applied:

        for ctx in psd.attempts(client):
            with ctx:
                ...
                ctx.step()

    yields one context, and another only when psd lost the previous one
    (ContextLost: nothing applied), at most max_lost more times, or when a
    sync round closed without it (RoundClosed: a straggler, nothing
    applied; the next context joins the open round), at most max_late
    times in a row - as ps-train runs such a batch again. Past either
    count the error is raised. All attempts share one retry budget."""
    a = _Attempts(client, max_lost, max_late)
    budget = a.client.new_budget()
    while True:
        a.again = False
        yield Context(a.client, _budget=budget, _attempts=a)
        if not a.again:
            return
