#!/usr/bin/python3
"""python/psd's retry and settle rules (docs/protocol.md) against scripted
servers: no psd, no network; a fake clock (tests/python/exact.py --rules
runs it, as tests/test_retry.c drives trainer/retry.c with fakes).

Each case scripts what each server answers to each call (a reply, or a
status) and checks the outcome: applied (and how many settling Steps), not
applied (ContextLost, and psd.attempts running the batch again), a final
error, a partial step on several servers (ReportPartial to every server),
RoundClosed, and the budget's give-up.
"""
import types

import grpc
import torch

import psd
from psd._proto import ps_pb2
from psd.context import Context, attempts
from psd.modules import _Whole
from psd.retry import Budget, ContextIds

UNAV, NF, FP = grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION
AE = grpc.StatusCode.ALREADY_EXISTS


class Clock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def sleep(self, s):
        self.t += s


class Conn:
    """A server: script[method] is a list of outcomes (a StatusCode raises,
    anything else is a reply; the last one repeats)."""

    def __init__(self, index, name, script):
        self.index, self.name, self.script, self.calls = index, name, script, []
        self.params = []
        self.released = []   # context ids the client released here (ReleaseContext; not in calls)

    def __str__(self):
        return self.name

    def call(self, method, req, timeout=None):
        self.calls.append(method)
        seq = self.script.get(method)
        assert seq, f"{self.name}: unexpected {method}"
        out = seq.pop(0) if len(seq) > 1 else seq[0]
        if isinstance(out, grpc.StatusCode):
            cls = psd.RoundClosed if out == grpc.StatusCode.ABORTED else psd.Error
            raise cls(out, f"scripted {out.name}", method, self.name)
        return out

    def call_once(self, method, req, timeout=None):
        assert method == "ReleaseContext", f"{self.name}: unexpected call_once({method})"
        assert timeout is not None and timeout <= 2.0, timeout
        self.released.append(req.context_id)
        out = self.script.get(method, [ps_pb2.ReleaseContextResponse(released=True)])[0]
        if isinstance(out, grpc.StatusCode):
            raise psd.Error(out, f"scripted {out.name}", method, self.name)
        return out


class Client:
    def __init__(self, max_s=30.0):
        self.clock = Clock()
        self.ids, self.rank, self.who = ContextIds(1 << 32), 1, "rules"
        self.max_s = max_s
        self.retries = self.reruns = self.partial_steps = self.released = 0
        self.reports = []
        self.seen_version = {}
        self.cfg = types.SimpleNamespace(rpc_timeout_s=5.0)

    def new_budget(self):
        return Budget(self.max_s, 0.1, 1.0, who=self.who, seed=1, sleep=self.clock.sleep, now=self.clock.now,
                      stats=self)

    def note_version(self, conn, v):
        self.seen_version[conn.index] = v

    def report_partial(self, ctx_id, applied, lost):
        self.reports.append(([c.name for c in applied], [c.name for c in lost]))


def fwd(v=1):
    return ps_pb2.ForwardResponse(output=ps_pb2.Tensor(shape=[1, 2], data=b"\0" * 8), model_version=v)


def bwd(v=0):
    return ps_pb2.BackwardResponse(model_version=v, grad_sq_norm=1.0)


def step(v):
    return ps_pb2.StepResponse(model_version=v)


def batch(ctx, conns):
    """One Forward per server, its gradient queued (no input gradient)."""
    for c in conns:
        rec = ctx.new_record(f"stage on {c.name}")
        ctx.forward_part(c, ps_pb2.ForwardRequest(), rec)
        ctx.backward(rec, torch.ones(1, 2), need_input=False)


def run(client, conns, **kw):
    with Context(client) as ctx:
        batch(ctx, conns)
        return ctx.step(**kw)


def expect(exc, fn, *words):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), f"'{w}' not in {e}"
        return e
    raise AssertionError(f"expected {exc.__name__}")


def main():
    n = 0
    # one server: the fused Backward(step) unanswered twice, then Step settles it applied
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [UNAV], "Step": [UNAV, step(7)]})
    r = run(cl, [c])
    assert r.version == 7 and c.calls == ["Forward", "Backward", "Step", "Step"] and cl.retries == 2, (r, c.calls)
    n += 1
    # settled as not applied (NOT_FOUND, a restart): ContextLost; attempts runs the batch again
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [UNAV, bwd(5)], "Step": [NF]})
    outcomes = []
    for ctx in attempts(cl):
        with ctx:
            batch(ctx, [c])
            outcomes.append(ctx.step())
    assert len(outcomes) == 1 and outcomes[0].version == 5 and c.calls.count("Forward") == 2, (outcomes, c.calls)
    n += 1
    # settled as not applied (FAILED_PRECONDITION while settling)
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [UNAV], "Step": [UNAV, FP]})
    expect(psd.ContextLost, lambda: run(cl, [c]), "not applied")
    n += 1
    # settled "too old to settle" (ALREADY_EXISTS while settling): applied once, its version forgotten -
    # applied, never run again (ps_retry_settled); outside settling ALREADY_EXISTS is a final error
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [UNAV], "Step": [UNAV, AE]})
    outcomes = []
    for ctx in attempts(cl):
        with ctx:
            batch(ctx, [c])
            outcomes.append(ctx.step())
    assert len(outcomes) == 1 and outcomes[0].version == 0 and c.calls == ["Forward", "Backward", "Step", "Step"], \
        (outcomes, c.calls)
    n += 1
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [bwd()], "Step": [AE]})
    e = expect(psd.Error, lambda: run(cl, [c], grad_scale=0.5))
    assert not isinstance(e, psd.ContextLost) and e.code == AE and c.calls == ["Forward", "Backward", "Step"], c.calls
    n += 1
    # a first FAILED_PRECONDITION of a Step on one server is final (ps_retry_once); scaled: Backward then Step
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [bwd()], "Step": [FP]})
    e = expect(psd.Error, lambda: run(cl, [c], grad_scale=0.5))
    assert not isinstance(e, psd.ContextLost) and e.code == FP and c.calls == ["Forward", "Backward", "Step"], c.calls
    n += 1
    # several servers: applied on ps0, lost on ps1 (NOT_FOUND; then a first FAILED_PRECONDITION): partial steps
    for lost in (NF, FP):
        cl = Client()
        a = Conn(0, "ps0", {"Forward": [fwd()], "Backward": [bwd()], "Step": [step(3)]})
        b = Conn(1, "ps1", {"Forward": [fwd()], "Backward": [bwd()], "Step": [UNAV, lost] if lost == NF else [lost]})
        r = run(cl, [a, b])
        assert r.partial and r.applied_on == ["ps0"] and r.lost_on == ["ps1"] and r.version == 3, r
        assert cl.reports == [(["ps0"], ["ps1"])] and cl.partial_steps == 1, cl.reports
        n += 1
    # several servers, lost on both: nothing applied anywhere
    cl = Client()
    a = Conn(0, "ps0", {"Forward": [fwd()], "Backward": [bwd()], "Step": [NF]})
    b = Conn(1, "ps1", {"Forward": [fwd()], "Backward": [bwd()], "Step": [FP]})
    expect(psd.ContextLost, lambda: run(cl, [a, b]), "not applied on any server")
    assert cl.reports == []
    n += 1
    # sync: a closed round
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [bwd()], "Step": [grpc.StatusCode.ABORTED]})
    expect(psd.RoundClosed, lambda: run(cl, [c], scalars={"reward": 1}))
    n += 1

    # ... under attempts: the batch runs again under a new context (it joins the open round), as
    # ps-train's late_again: at most max_late times in a row, then RoundClosed
    def late_batch(cl, c, **kw):
        runs, ids, res = [], [], []
        for ctx in attempts(cl, **kw):
            with ctx:
                runs.append(1)
                ids.append(ctx.id)
                batch(ctx, [c])
                res.append(ctx.step(scalars={"reward": 1}))
        return runs, ids, res
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [bwd()], "Step": [grpc.StatusCode.ABORTED, step(7)]})
    runs, ids, res = late_batch(cl, c)
    assert len(runs) == 2 and len(set(ids)) == 2 and [r.version for r in res] == [7] and cl.reruns == 1, \
        (runs, ids, res, cl.reruns)
    n += 1
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [bwd()], "Step": [grpc.StatusCode.ABORTED]})
    e = expect(psd.RoundClosed, lambda: late_batch(cl, c), "late for its sync round 5 times in a row")
    assert c.calls.count("Step") == 5 and cl.reruns == 4, (c.calls, cl.reruns)
    n += 1
    cl = Client()   # max_late=0: raised at once (a trainer that goes on with the next batch)
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [bwd()], "Step": [grpc.StatusCode.ABORTED]})
    expect(psd.RoundClosed, lambda: late_batch(cl, c, max_late=0))
    assert c.calls.count("Step") == 1 and cl.reruns == 0, (c.calls, cl.reruns)
    n += 1
    # the budget: psd never answers again; give up after retry_max_s with the last error
    cl = Client(max_s=3.0)
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [UNAV], "Step": [UNAV]})
    e = expect(psd.Error, lambda: run(cl, [c]), "UNAVAILABLE")
    assert 2.9 <= cl.clock.t <= 3.0 and cl.retries >= 3, (cl.clock.t, cl.retries)
    n += 1
    # a Backward with the input gradient, retried after no answer, refused: its input gradient is gone
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [UNAV, FP]})
    with Context(cl) as ctx:
        rec = ctx.new_record("stage")
        ctx.forward_part(c, ps_pb2.ForwardRequest(), rec)
        expect(psd.ContextLost, lambda: ctx.backward(rec, torch.ones(1, 2), need_input=True), "retried Backward")
    n += 1
    # a context lost every time: attempts gives up after 3 runs again
    cl = Client()
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [NF]})
    runs = []

    def forever():
        for ctx in attempts(cl):
            with ctx:
                runs.append(1)
                batch(ctx, [c])
                ctx.step()
    expect(psd.ContextLost, forever, "4 times in a row")
    assert len(runs) == 4, runs
    n += 1
    # a Forward retried in place, and the order rules: step before backward; backward twice
    cl = Client()
    c = Conn(0, "ps", {"Forward": [UNAV, fwd()], "Backward": [bwd(1)]})
    with Context(cl) as ctx:
        rec = ctx.new_record("stage")
        ctx.forward_part(c, ps_pb2.ForwardRequest(), rec)
        expect(psd.Error, ctx.step, "got no gradient")
        ctx.backward(rec, torch.ones(1, 2), need_input=False)
        expect(psd.Error, lambda: ctx.backward(rec, torch.ones(1, 2), need_input=False), "already backwarded")
        assert ctx.step().version == 1 and c.calls == ["Forward", "Forward", "Backward"], c.calls
    n += 1
    # context_known: not on a context's first Forward to a server (its retry may open it), on a later Forward
    # and on a HostedModule's push there (after a restart psd answers NOT_FOUND: lost, never opened afresh)
    cl = Client()
    a, b = Conn(0, "a", {"Forward": [fwd()]}), Conn(1, "b", {"Forward": [fwd()]})
    with Context(cl) as ctx:
        reqs = [ps_pb2.ForwardRequest() for _ in range(3)]
        for conn, req in zip([a, b, a], reqs):
            ctx.forward_part(conn, req, ctx.new_record("stage"))
        assert [r.context_known for r in reqs] == [False, False, True], reqs
        ctx.state = "lost"   # never stepped: nothing to check beyond the requests
    n += 1
    # one call a batch (RemoteStage.train_step): answered; unanswered and settled applied by Step (the
    # loss was in the lost reply: NaN); settled never opened (NOT_FOUND: attempts runs it again) or
    # opened and failed before its backward (FAILED_PRECONDITION while settling): not applied
    def one(client, conn):
        with Context(client) as ctx:
            return ctx.train_step(_Whole(conn, "", "", "the model"), torch.zeros(1, 2), torch.zeros(1))
    answered = ps_pb2.ForwardResponse(model_version=3, step_version=4, loss=0.5)
    cl = Client()
    c = Conn(0, "ps", {"Forward": [answered]})
    loss, r = one(cl, c)
    assert r.version == 4 and abs(float(loss) - 0.5) < 1e-7 and c.calls == ["Forward"], (r, c.calls)
    n += 1
    cl = Client()
    c = Conn(0, "ps", {"Forward": [UNAV], "Step": [UNAV, step(9)]})
    loss, r = one(cl, c)
    assert r.version == 9 and torch.isnan(loss) and c.calls == ["Forward", "Step", "Step"], (r, c.calls)
    n += 1
    cl = Client()
    c = Conn(0, "ps", {"Forward": [UNAV, answered], "Step": [NF]})
    outcomes = []
    for ctx in attempts(cl):
        with ctx:
            outcomes.append(ctx.train_step(_Whole(c, "", "", "the model"), torch.zeros(1, 2), torch.zeros(1)))
    assert len(outcomes) == 1 and outcomes[0][1].version == 4 and c.calls == ["Forward", "Step", "Forward"], c.calls
    n += 1
    cl = Client()
    c = Conn(0, "ps", {"Forward": [UNAV], "Step": [UNAV, FP]})
    expect(psd.ContextLost, lambda: one(cl, c), "not applied")
    n += 1
    cl = Client()
    c = Conn(0, "ps", {"Forward": [UNAV], "Step": [UNAV, AE]})
    loss, r = one(cl, c)
    assert r.version == 0 and torch.isnan(loss) and c.calls == ["Forward", "Step", "Step"], (r, c.calls)
    n += 1
    # a psd that ignores `step` (older than one call a batch) answers with no step version: refused, not
    # taken for applied
    cl = Client()
    c = Conn(0, "ps", {"Forward": [ps_pb2.ForwardResponse(model_version=3, loss=0.5)]})
    e = expect(psd.Error, lambda: one(cl, c), "without stepping it")
    assert not isinstance(e, psd.ContextLost) and e.code == FP, e
    n += 1
    # ReleaseContext: a context that ends unstepped is released on every server it touched (psd frees
    # it now, not after server.context_ttl_s), best effort; never one whose step applied
    cl = Client()   # a retried Backward refused (lost, ContextLost): released, the batch runs again
    c = Conn(0, "ps", {"Forward": [fwd()], "Backward": [UNAV, FP, bwd(2)], "Step": [step(3)]})
    ids, res = [], []
    for ctx in attempts(cl):
        with ctx:
            ids.append(ctx.id)
            batch(ctx, [c])
            res.append(ctx.step(grad_scale=0.5))
    assert len(ids) == 2 and c.released == ids[:1] and cl.released == 1 and res[0].version == 3, (ids, c.released)
    n += 1
    cl = Client()   # several servers, lost on both: released on both (ps1 holds it: FAILED_PRECONDITION)
    a = Conn(0, "ps0", {"Forward": [fwd()], "Backward": [bwd()], "Step": [NF]})
    b = Conn(1, "ps1", {"Forward": [fwd()], "Backward": [bwd()], "Step": [FP]})
    with Context(cl) as ctx0:
        pass
    expect(psd.ContextLost, lambda: run(cl, [a, b]), "not applied on any server")
    assert len(a.released) == 1 and a.released == b.released and ctx0.id not in a.released, (a.released, b.released)
    n += 1
    cl = Client()   # applied, or a partial step (applied on ps0): nothing released anywhere
    a = Conn(0, "ps0", {"Forward": [fwd()], "Backward": [bwd()], "Step": [step(3)]})
    b = Conn(1, "ps1", {"Forward": [fwd()], "Backward": [bwd()], "Step": [NF]})
    assert run(cl, [a, b]).partial and a.released == b.released == [], (a.released, b.released)
    n += 1
    cl = Client()   # the trainer's own exception inside the block; an older psd (UNIMPLEMENTED) is ignored
    c = Conn(0, "ps", {"Forward": [fwd()], "ReleaseContext": [grpc.StatusCode.UNIMPLEMENTED]})
    try:
        with Context(cl) as ctx:
            batch(ctx, [c])
            raise KeyError("the trainer's own error")
    except KeyError:
        pass
    assert c.released == [ctx.id] and cl.released == 0, c.released
    n += 1
    # psd's admission refusals (RESOURCE_EXHAUSTED with its retry hint, psd-retry-after-ms): the real
    # psd.client.Conn.call sends the call again as it is, after at least the hint, on a budget of its own;
    # without the hint (a message over server.max_message_mb) it is final at once
    class Refused(grpc.RpcError):
        def __init__(self, code, md):
            self._code, self._md = code, md

        def code(self):
            return self._code

        def details(self):
            return f"scripted {self._code.name}"

        def trailing_metadata(self):
            return self._md

    RE = grpc.StatusCode.RESOURCE_EXHAUSTED

    def real_conn(cl, outcomes):
        from psd.client import Conn as RealConn
        conn = RealConn.__new__(RealConn)
        conn.client, conn.index, conn.server, conn.name = cl, 0, "ps", "ps"
        cl.cfg, cl.metadata = types.SimpleNamespace(rpc_timeout_s=5.0), None
        sent = []

        def forward(req, timeout=None, metadata=None):
            sent.append(req)
            out = outcomes.pop(0) if len(outcomes) > 1 else outcomes[0]
            if isinstance(out, Exception):
                raise out
            return out
        conn.stub = types.SimpleNamespace(Forward=forward)
        return conn, sent
    busy = Refused(RE, (("psd-retry-after-ms", "1500"),))
    cl = Client()
    conn, sent = real_conn(cl, [busy, busy, fwd(5)])
    req = ps_pb2.ForwardRequest(context_id=7, seq=3)
    assert conn.call("Forward", req).model_version == 5 and len(sent) == 3 and all(r is req for r in sent), sent
    assert cl.retries == 2 and cl.clock.t >= 3.0, (cl.retries, cl.clock.t)   # two waits of at least 1.5 s
    n += 1
    cl = Client()
    conn, sent = real_conn(cl, [Refused(RE, ()), fwd(5)])    # no hint: a message too large, an older psd
    e = expect(psd.Error, lambda: conn.call("Forward", req), "RESOURCE_EXHAUSTED")
    assert not e.busy and len(sent) == 1 and cl.clock.t == 0, (e, sent)
    n += 1
    cl = Client(max_s=4.0)                                     # refused for good: the budget, then the refusal
    conn, sent = real_conn(cl, [busy])
    e = expect(psd.Error, lambda: conn.call("Forward", req), "RESOURCE_EXHAUSTED")
    assert e.busy and e.retry_after_ms == 1500 and 3.9 <= cl.clock.t <= 4.0 and len(sent) >= 2, (cl.clock.t, sent)
    n += 1
    print(f"rules: {n} scripted cases of docs/protocol.md's retry and settle rules: OK")


if __name__ == "__main__":
    main()
