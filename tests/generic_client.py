#!/usr/bin/python3
"""Drive psd's stage-addressed, typed, multi-forward and sync calls from a
Python grpcio client generated from proto/ps.proto (by python3-grpc-tools,
as any user's client would be), and check every answer against numpy.

    generic_client.py lm ADDR LR      psd hosting rnn_lm (ntoken 50, ninp 8, nhid 8, dropout 0), sgd LR
    generic_client.py sync ADDR       psd hosting cartpole_policy, consistency sync, 2 workers, sum
    generic_client.py modes ADDR MODE psd hosting cartpole_policy with 2 server threads and MODE
                                      (hogwild; sync with 6 workers; ssp with max_staleness 1)

The expected values are computed here from the weights GetParameters
returns, independently of psd's C code. Exit 0 and a last line "...: OK"
when everything holds; an AssertionError names what did not.
"""
import sys
import threading

import grpc
import numpy as np

import ps_pb2
import ps_pb2_grpc

F32, I64 = ps_pb2.FLOAT32, ps_pb2.INT64


def tensor(a, dtype=F32):
    a = np.ascontiguousarray(a, dtype=np.float32 if dtype == F32 else np.int64)
    return ps_pb2.Tensor(shape=list(a.shape), data=a.tobytes(), dtype=dtype)


def array(t):
    dt = np.float32 if t.dtype == F32 else np.int64
    return np.frombuffer(t.data, dtype=dt).reshape(tuple(t.shape))


def params(stub):
    r = stub.GetParameters(ps_pb2.GetParametersRequest())
    return {t.name: array(t).copy() for t in r.parameters}, r.model_version


def expect_error(fn, code, *words):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() == code, f"expected {code}, got {e.code()}: {e.details()}"
        for w in words:
            assert w in e.details(), f"'{w}' not in '{e.details()}'"
        return e.details()
    raise AssertionError(f"expected {code}, the call succeeded")


def pages(call, req, field, max_bytes):
    """Every page of a paged read (GetParameters, GetGradients) of at most
    max_bytes of tensor data, joined: (name -> array, number of pages)."""
    got, n = {}, 0
    while True:
        r = call(req)
        n += 1
        tensors = getattr(r, field)
        assert len(r.first_rows) == len(tensors) and sum(len(t.data) for t in tensors) <= max_bytes
        for t, r0 in zip(tensors, r.first_rows):
            a = array(t)
            assert r0 == (got[t.name].shape[0] if t.name in got else 0), (t.name, r0)
            got[t.name] = np.concatenate([got[t.name], a]) if t.name in got else a
        if not r.more:
            return got, n
        req.first, req.first_row = r.next, r.next_row


def close(a, b, what, tol=1e-5):
    err = float(np.max(np.abs(a - b) / (np.abs(b) + 1.0))) if a.size else 0.0
    assert a.shape == b.shape and err < tol, f"{what}: shape {a.shape} vs {b.shape}, rel err {err:g}"


def test_lm(stub, lr):
    lp = stub.ListParameters(ps_pb2.ListParametersRequest())
    assert lp.model == "rnn_lm", lp.model
    shapes = {p.name: tuple(p.shape) for p in lp.parameters}
    want = {"encoder.weight": (50, 8), "decoder.weight": (50, 8), "decoder.bias": (50,)}
    for l in range(2):  # the trainer's nn.LSTM(8, 8, 2): parameter-only stage "rnn"
        want.update({f"rnn.weight_ih_l{l}": (32, 8), f"rnn.weight_hh_l{l}": (32, 8), f"rnn.bias_ih_l{l}": (32,),
                     f"rnn.bias_hh_l{l}": (32,)})
    assert shapes == want, shapes
    assert [p.sparse for p in lp.parameters if p.name == "encoder.weight"] == [True]
    st = {s.name: s for s in lp.stages}
    assert list(st) == ["emb", "decoder", "rnn"], list(st)
    assert st["emb"].input_dtype == I64 and list(st["emb"].input_shape) == [] and list(st["emb"].output_shape) == [8]
    assert st["decoder"].input_dtype == F32 and list(st["decoder"].input_shape) == [8]
    assert list(st["decoder"].output_shape) == [50] and st["decoder"].device == "cpu"

    w, v0 = params(stub)
    enc, dec, bias = w["encoder.weight"], w["decoder.weight"], w["decoder.bias"]
    # Paged GetParameters: 200-byte pages cut parameters between rows; reassembled, they are the weights.
    got, n = pages(stub.GetParameters, ps_pb2.GetParametersRequest(max_bytes=200), "parameters", 200)
    assert n > 10 and sorted(got) == sorted(w) and all(np.array_equal(got[k], w[k]) for k in w), n
    expect_error(lambda: stub.GetParameters(ps_pb2.GetParametersRequest(max_bytes=16)),
                 grpc.StatusCode.INVALID_ARGUMENT, "max_bytes 16", "less than one row", "encoder.weight")
    expect_error(lambda: stub.GetParameters(ps_pb2.GetParametersRequest(first=99)),
                 grpc.StatusCode.INVALID_ARGUMENT, "GetParametersRequest.first 99", "selection")
    expect_error(lambda: stub.GetParameters(ps_pb2.GetParametersRequest(first=0, first_row=50)),
                 grpc.StatusCode.INVALID_ARGUMENT, "GetParametersRequest.first_row 50", "encoder.weight")
    rng = np.random.default_rng(5)
    ids = np.array([[3, 7], [7, 49], [0, 3]], dtype=np.int64)      # (seq 3, batch 2); rows 3, 7 repeat

    # Inference through one stage: the embedding rows themselves.
    r = stub.Forward(ps_pb2.ForwardRequest(input=tensor(ids, I64), stage="emb"))
    close(array(r.output), enc[ids], "eval emb forward")
    # Typed input refusals name what was wrong.
    expect_error(lambda: stub.Forward(ps_pb2.ForwardRequest(input=tensor(ids.astype(np.float32)), stage="emb")),
                 grpc.StatusCode.INVALID_ARGUMENT, "dtype float32", "int64")
    expect_error(lambda: stub.Forward(ps_pb2.ForwardRequest(input=tensor(ids + 47, I64), stage="emb")),
                 grpc.StatusCode.INVALID_ARGUMENT, "50")
    expect_error(lambda: stub.Forward(ps_pb2.ForwardRequest(input=tensor(ids, I64), stage="lstm")),
                 grpc.StatusCode.INVALID_ARGUMENT, "no stage 'lstm'", "emb, decoder")

    # One training step over both stages, the LSTM's output faked by h.
    ctx = 0x1000001
    f0 = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                            input=tensor(ids, I64), stage="emb"))
    close(array(f0.output), enc[ids], "train emb forward (dropout 0)")
    again = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=1,
                                               input=tensor(ids, I64), stage="emb"))
    assert again.replayed and again.output.data == f0.output.data, "a retried Forward is answered from the record"
    h = rng.standard_normal((3, 2, 8)).astype(np.float32)
    f1 = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=1, train=True, trainer_rank=1,
                                            input=tensor(h), stage="decoder"))
    assert not f1.replayed
    close(array(f1.output), h @ dec.T + bias, "decoder forward")
    # Step before every forward was backwarded: refused, nothing applied.
    expect_error(lambda: stub.Step(ps_pb2.StepRequest(context_id=ctx)), grpc.StatusCode.FAILED_PRECONDITION,
                 "not backwarded")
    g1 = rng.standard_normal((3, 2, 50)).astype(np.float32)
    b1 = stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=1, grad_output=tensor(g1), want_input_grad=True))
    assert len(b1.input_grads) == 1
    close(array(b1.input_grads[0]).reshape(3, 2, 8), g1 @ dec, "decoder input gradient")
    g0 = rng.standard_normal((3, 2, 8)).astype(np.float32)
    b0 = stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=tensor(g0)))
    assert len(b0.input_grads) == 0, "input gradients only when asked"
    expect_error(lambda: stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=tensor(g0))),
                 grpc.StatusCode.FAILED_PRECONDITION, "already backwarded")
    gr = {t.name: array(t) for t in stub.GetGradients(ps_pb2.GetGradientsRequest(context_id=ctx)).gradients}
    g_dec = np.einsum("sbo,sbi->oi", g1, h)
    g_enc = np.zeros_like(enc)
    np.add.at(g_enc, ids.reshape(-1), g0.reshape(-1, 8))
    close(gr["decoder.weight"], g_dec, "decoder.weight gradient")
    close(gr["decoder.bias"], g1.sum(axis=(0, 1)), "decoder.bias gradient")
    close(gr["encoder.weight"], g_enc, "encoder.weight gradient (scatter-add of repeated rows)")
    # Paged GetGradients: 100-byte pages (3 rows of 8 floats) cut the row-sparse table and decoder.weight between
    # rows; joined, they are the same scatter-add and products
    pg, n = pages(stub.GetGradients, ps_pb2.GetGradientsRequest(context_id=ctx, max_bytes=100), "gradients", 100)
    assert n > 30 and sorted(pg) == sorted(gr), (n, sorted(pg))
    close(pg["encoder.weight"], g_enc, "encoder.weight gradient in 100-byte pages")
    close(pg["decoder.weight"], g_dec, "decoder.weight gradient in 100-byte pages")
    close(pg["decoder.bias"], g1.sum(axis=(0, 1)), "decoder.bias gradient in 100-byte pages")
    s = stub.Step(ps_pb2.StepRequest(context_id=ctx))
    assert s.model_version == v0 + 1 and not s.skipped
    assert stub.Step(ps_pb2.StepRequest(context_id=ctx)).model_version == s.model_version, "idempotent Step"
    w2, v2 = params(stub)
    assert v2 == v0 + 1
    close(w2["decoder.weight"], dec - lr * g_dec, "decoder.weight after SGD")
    close(w2["decoder.bias"], bias - lr * g1.sum(axis=(0, 1)), "decoder.bias after SGD")
    touched = np.unique(ids)
    untouched = np.setdiff1d(np.arange(50), touched)
    assert np.array_equal(w2["encoder.weight"][untouched], enc[untouched]), "untouched embedding rows are bit-identical"
    close(w2["encoder.weight"][touched], enc[touched] - lr * g_enc[touched], "touched embedding rows after SGD")

    # One Backward covering two forwards (more_seqs) accumulates both.
    ctx2 = 0x1000002
    hs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2)]
    gs = [rng.standard_normal((4, 50)).astype(np.float32) for _ in range(2)]
    for k in range(2):
        stub.Forward(ps_pb2.ForwardRequest(context_id=ctx2, seq=k, train=True, trainer_rank=1, input=tensor(hs[k]),
                                           stage="decoder"))
    b = stub.Backward(ps_pb2.BackwardRequest(context_id=ctx2, seq=0, grad_output=tensor(gs[0]), more_seqs=[1],
                                             more_grad_outputs=[tensor(gs[1])], want_input_grad=True))
    assert len(b.input_grads) == 2
    close(array(b.input_grads[1]), gs[1] @ w2["decoder.weight"], "second covered forward's input gradient")
    gr = {t.name: array(t) for t in stub.GetGradients(ps_pb2.GetGradientsRequest(context_id=ctx2)).gradients}
    close(gr["decoder.bias"], gs[0].sum(0) + gs[1].sum(0), "accumulated bias gradient of two forwards")
    assert not gr["encoder.weight"].any(), "the embedding got no gradient in this context"
    expect_error(lambda: stub.Backward(ps_pb2.BackwardRequest(context_id=ctx2, seq=5, grad_output=tensor(gs[0]))),
                 grpc.StatusCode.NOT_FOUND, "seq 5")
    s2 = stub.Step(ps_pb2.StepRequest(context_id=ctx2))
    w3, _ = params(stub)
    assert np.array_equal(w3["encoder.weight"], w2["encoder.weight"]), "a step without embedding gradient leaves it"
    st = stub.Status(ps_pb2.StatusRequest())
    assert st.model == "rnn_lm" and st.optimizer == "sgd" and st.model_version == s2.model_version
    assert st.live_contexts == 0

    # The LSTM's parameters: a parameter-only stage. GetParameters of one stage,
    # gradients pushed under a context, norms in the replies, a scaled Step.
    expect_error(lambda: stub.Forward(ps_pb2.ForwardRequest(input=tensor(hs[0]), stage="rnn")),
                 grpc.StatusCode.FAILED_PRECONDITION, "parameters only", "PushGradients")
    rp = stub.GetParameters(ps_pb2.GetParametersRequest(stage="rnn"))
    rnn = {t.name: array(t).copy() for t in rp.parameters}
    assert sorted(rnn) == sorted(k for k in want if k.startswith("rnn.")), sorted(rnn)
    bound = 1 / np.sqrt(8)  # nn.LSTM's init U(-1/sqrt(H), 1/sqrt(H))
    assert all(np.abs(v).max() <= bound and np.abs(v).max() > 0.5 * bound for v in rnn.values())
    expect_error(lambda: stub.GetParameters(ps_pb2.GetParametersRequest(stage="lstm")),
                 grpc.StatusCode.INVALID_ARGUMENT, "no stage 'lstm'", "emb, decoder, rnn")
    w4, v4 = params(stub)
    ctx3 = 0x1000003
    stub.Forward(ps_pb2.ForwardRequest(context_id=ctx3, seq=0, train=True, trainer_rank=1, input=tensor(ids, I64),
                                       stage="emb"))
    b3 = stub.Backward(ps_pb2.BackwardRequest(context_id=ctx3, seq=0, grad_output=tensor(g0)))
    g_enc_sq = float((g_enc.astype(np.float64) ** 2).sum())  # repeated rows summed first, as clip_grad_norm_
    assert abs(b3.grad_sq_norm - g_enc_sq) <= 1e-5 * g_enc_sq, (b3.grad_sq_norm, g_enc_sq)
    g_rnn = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in rnn.items()}
    push = [ps_pb2.Tensor(name=k, shape=list(v.shape), data=v.tobytes(), dtype=F32) for k, v in g_rnn.items()]
    expect_error(lambda: stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=ctx3, gradients=[
        ps_pb2.Tensor(name="encoder.weight", shape=[50, 8], data=g_enc.tobytes(), dtype=F32)])),
        grpc.StatusCode.INVALID_ARGUMENT, "encoder.weight", "parameter-only")
    expect_error(lambda: stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=ctx3, gradients=[
        ps_pb2.Tensor(name="rnn.bias_ih_l0", shape=[31], data=np.zeros(31, np.float32).tobytes(), dtype=F32)])),
        grpc.StatusCode.INVALID_ARGUMENT, "rnn.bias_ih_l0", "(32)")
    expect_error(lambda: stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=ctx3, gradients=[
        ps_pb2.Tensor(name="rnn.nope", shape=[32], data=np.zeros(32, np.float32).tobytes(), dtype=F32)])),
        grpc.StatusCode.NOT_FOUND, "rnn.nope")
    # One parameter twice in one push: refused whole (it used to be added twice).
    expect_error(lambda: stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=ctx3, gradients=push + push[:1])),
                 grpc.StatusCode.INVALID_ARGUMENT, f"gradients[{len(push)}]", push[0].name, "twice")
    # A push opens its context when no Forward did (a psd that hosts only the rnn stage sees none).
    p_open = stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=0x7777, gradients=push, trainer_rank=1))
    rnn_sq = sum(float((v.astype(np.float64) ** 2).sum()) for v in g_rnn.values())
    assert abs(p_open.grad_sq_norm - rnn_sq) <= 1e-5 * rnn_sq, (p_open.grad_sq_norm, rnn_sq)
    go = {t.name: array(t) for t in stub.GetGradients(ps_pb2.GetGradientsRequest(context_id=0x7777)).gradients}
    for k, v in g_rnn.items():
        close(go[k], v, f"pushed gradient {k} in a context the push opened")
    expect_error(lambda: stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=0, gradients=push)),
                 grpc.StatusCode.INVALID_ARGUMENT, "context_id")
    p3 = stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=ctx3, gradients=push, trainer_rank=1))
    total = g_enc_sq + sum(float((v.astype(np.float64) ** 2).sum()) for v in g_rnn.values())
    assert abs(p3.grad_sq_norm - total) <= 1e-5 * total, (p3.grad_sq_norm, total)
    p3b = stub.PushGradients(ps_pb2.PushGradientsRequest(context_id=ctx3, gradients=push, trainer_rank=1))
    assert abs(p3b.grad_sq_norm - total) <= 1e-5 * total, "a repeated push (a retry) is not added again"
    gr = {t.name: array(t) for t in stub.GetGradients(ps_pb2.GetGradientsRequest(context_id=ctx3)).gradients}
    for k, v in g_rnn.items():
        close(gr[k], v, f"pushed gradient {k}")
    expect_error(lambda: stub.Step(ps_pb2.StepRequest(context_id=ctx3, grad_scale=-1)),
                 grpc.StatusCode.INVALID_ARGUMENT, "grad_scale")
    s3 = stub.Step(ps_pb2.StepRequest(context_id=ctx3, grad_scale=0.25))
    w5, v5 = params(stub)
    assert v5 == v4 + 1 == s3.model_version
    for k, v in g_rnn.items():
        close(w5[k], rnn[k] - lr * 0.25 * v, f"{k} after a Step with grad_scale 0.25")
    close(w5["encoder.weight"][touched], w4["encoder.weight"][touched] - lr * 0.25 * g_enc[touched],
          "embedding rows after a Step with grad_scale 0.25")
    assert np.array_equal(w5["decoder.weight"], w4["decoder.weight"]), "no decoder gradient: unchanged"

    # The fused decoder: targets in, the mean cross-entropy and the decoder's input gradient out, no logits.
    dec5, b5 = w5["decoder.weight"], w5["decoder.bias"]
    ctx4 = 0x1000004
    hf = rng.standard_normal((3, 2, 8)).astype(np.float32)
    tg = np.array([[1, 49], [0, 7], [7, 3]], dtype=np.int64)
    expect_error(lambda: stub.Forward(ps_pb2.ForwardRequest(input=tensor(hf), stage="decoder", targets=tensor(tg, I64))),
                 grpc.StatusCode.INVALID_ARGUMENT, "train=true")
    expect_error(lambda: stub.Forward(ps_pb2.ForwardRequest(context_id=ctx4 + 9, seq=0, train=True, input=tensor(hf),
                                                            stage="decoder", targets=tensor(tg + 1, I64))),
                 grpc.StatusCode.INVALID_ARGUMENT, "targets[1]", "50")
    ff = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx4, seq=0, train=True, trainer_rank=1, input=tensor(hf),
                                            stage="decoder", targets=tensor(tg, I64), want_grad_sq_norm=True))
    z = (hf.reshape(-1, 8).astype(np.float64) @ dec5.T + b5)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    t = tg.reshape(-1)
    want_loss = float(-np.log(p[np.arange(6), t]).mean())
    assert not ff.HasField("output") and abs(ff.loss - want_loss) < 1e-5 * abs(want_loss), (ff.loss, want_loss)
    dz = p.copy()
    dz[np.arange(6), t] -= 1
    dz /= 6
    close(array(ff.input_grad), (dz @ dec5).reshape(3, 2, 8).astype(np.float32), "fused decoder input gradient")
    gr = {t.name: array(t) for t in stub.GetGradients(ps_pb2.GetGradientsRequest(context_id=ctx4)).gradients}
    close(gr["decoder.weight"], (dz.T @ hf.reshape(-1, 8)).astype(np.float32), "fused decoder.weight gradient")
    close(gr["decoder.bias"], dz.sum(0).astype(np.float32), "fused decoder.bias gradient")
    want_sq = float(((dz.T @ hf.reshape(-1, 8)) ** 2).sum() + (dz.sum(0) ** 2).sum())
    assert abs(ff.grad_sq_norm - want_sq) <= 1e-4 * want_sq, ("fused forward's grad_sq_norm", ff.grad_sq_norm, want_sq)
    expect_error(lambda: stub.Forward(ps_pb2.ForwardRequest(context_id=ctx4, seq=0, train=True, input=tensor(hf),
                                                            stage="decoder", targets=tensor(tg, I64))),
                 grpc.StatusCode.FAILED_PRECONDITION, "not repeated")
    s4 = stub.Step(ps_pb2.StepRequest(context_id=ctx4))
    assert s4.model_version == v5 + 1, "the fused forward's gradients step without a Backward"
    print("generic_client lm: stages, int64 ids, replayed forward, input gradients, more_seqs, sparse rows, "
          "parameter-only rnn stage (PushGradients, norms, grad_scale), fused decoder loss: OK")


def test_sync(stub):
    lp = stub.ListParameters(ps_pb2.ListParametersRequest())
    assert lp.model == "cartpole_policy"
    assert [(p.name, tuple(p.shape)) for p in lp.parameters] == [
        ("affine1.weight", (128, 4)), ("affine1.bias", (128,)), ("affine2.weight", (2, 128)), ("affine2.bias", (2,))]
    st0 = stub.Status(ps_pb2.StatusRequest())
    assert st0.consistency.startswith("sync") and st0.sync_members == 2, st0
    round0, v0 = st0.sync_round, st0.model_version
    results, errors = {}, []

    def observer(rank):
        try:
            rng = np.random.default_rng(rank)
            ctx = 0x2000000 + rank
            for seq in range(5):   # five environment steps, one Forward each
                f = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=seq, train=True, trainer_rank=rank,
                                                       input=tensor(rng.uniform(-0.05, 0.05, (1, 4)))))
                p = array(f.output)
                assert p.shape == (1, 2) and abs(float(p.sum()) - 1) < 1e-5 and (p >= 0).all(), p
                assert f.round == round0
                stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=seq, grad_output=tensor(-1 / (p + 1e-6))))
            results[rank] = stub.Step(ps_pb2.StepRequest(context_id=ctx, round=f.round), timeout=60)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"observer {rank}: {e!r}")

    th = [threading.Thread(target=observer, args=(r,)) for r in (1, 2)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors, errors
    a, b = results[1], results[2]
    assert a.model_version == b.model_version == v0 + 1, (a, b)
    assert a.round == b.round == round0 and a.round_contexts == 2
    st = stub.Status(ps_pb2.StatusRequest())
    assert st.sync_round == round0 + 1 and st.model_version == v0 + 1 and st.live_contexts == 0
    # More contexts than sync_workers in one round: the two that step first
    # fill it; the third, on time, joins the next round (never dropped).
    r1 = st.sync_round
    ctxs = [0x2000100 + k for k in range(3)]
    for k, ctx in enumerate(ctxs):
        f = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=3 + k,
                                               input=tensor(np.zeros((1, 4)))))
        assert f.round == r1
        stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=tensor(np.ones((1, 2)))))
    answers = {}

    def step(ctx, round_=r1):
        answers[ctx] = stub.Step(ps_pb2.StepRequest(context_id=ctx, round=round_), timeout=60)
    th = [threading.Thread(target=step, args=(c,)) for c in ctxs[:2]]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert {answers[c].round for c in ctxs[:2]} == {r1}, answers
    third = threading.Thread(target=step, args=(ctxs[2],))
    third.start()
    ctx = 0x2000200   # a context of the open round completes the third's round
    f = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=9,
                                           input=tensor(np.zeros((1, 4)))))
    assert f.round == r1 + 1
    stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=tensor(np.ones((1, 2)))))
    step(ctx, f.round)
    third.join()
    a = answers[ctxs[2]]
    assert a.round == r1 + 1 and a.round_contexts == 2 and a.model_version == answers[ctx].model_version, a
    st = stub.Status(ps_pb2.StatusRequest())
    assert st.sync_queued == 1 and st.sync_dropped == 0 and st.model_version == v0 + 3, st
    assert st.contexts_applied == 6 and st.live_contexts == 0, st
    print("generic_client sync: two observers, one summed step per round, a third context queued into the next "
          "round: OK")


def policy_step(stub, ctx, rank, seq, rng, round_=0, step=True):
    """One observer step on cartpole_policy: Forward, Backward, (Step)."""
    f = stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=seq, train=True, trainer_rank=rank,
                                           input=tensor(rng.uniform(-0.05, 0.05, (1, 4)))))
    p = array(f.output)
    stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=seq, grad_output=tensor(-0.01 / (p + 1e-6))))
    if step:
        return f, stub.Step(ps_pb2.StepRequest(context_id=ctx, round=round_ or f.round), timeout=120)
    return f, None


def run_threads(fn, ranks):
    errors = []

    def wrap(r):
        try:
            fn(r)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"rank {r}: {e!r}")
    th = [threading.Thread(target=wrap, args=(r,)) for r in ranks]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors, errors


def test_modes(stub, mode):
    """More trainers than psd has threads (psd runs with server.threads=2):
    every step is applied exactly once, in each consistency mode."""
    v0 = stub.Status(ps_pb2.StatusRequest()).model_version
    if mode == "hogwild":
        def trainer(rank):
            rng = np.random.default_rng(rank)
            for i in range(5):
                policy_step(stub, 0x3000000 + rank * 100 + i, rank, 0, rng)
        run_threads(trainer, range(1, 7))
        st = stub.Status(ps_pb2.StatusRequest())
        assert st.model_version == v0 + 30 and st.live_contexts == 0, st
    elif mode == "sync":
        answers = {}

        def trainer(rank):
            rng = np.random.default_rng(rank)
            round_ = 0
            for i in range(4):
                _, s = policy_step(stub, 0x4000000 + rank * 100 + i, rank, 0, rng, round_)
                answers[(rank, i)] = (s.model_version, s.round, s.round_contexts)
                round_ = s.round + 1
        run_threads(trainer, range(1, 7))
        st = stub.Status(ps_pb2.StatusRequest())
        assert st.model_version == v0 + 4, f"4 rounds of 6 contexts are 4 steps, not {st.model_version - v0}"
        for i in range(4):
            got = {answers[(r, i)] for r in range(1, 7)}
            assert len(got) == 1 and next(iter(got))[2] == 6, f"round {i}: {got}"
        assert st.live_contexts == 0 and st.sync_dropped == 0, st
    else:  # ssp, max_staleness 1: two fast trainers and a slow one
        done = {1: 0, 2: 0, 3: 0}
        lag = []
        lock = threading.Lock()
        joined = threading.Event()   # the slow trainer is known to psd before the fast ones start

        def trainer(rank):
            rng = np.random.default_rng(rank)
            if rank != 3:
                assert joined.wait(60), "the slow trainer never made its first Forward"
            for i in range(6 if rank == 3 else 8):
                ctx = 0x5000000 + rank * 100 + i
                stub.Forward(ps_pb2.ForwardRequest(context_id=ctx, seq=0, train=True, trainer_rank=rank,
                                                   input=tensor(rng.uniform(-0.05, 0.05, (1, 4)))), timeout=120)
                joined.set()
                with lock:
                    if rank != 3 and done[3] < 6:
                        lag.append(done[rank] - done[3])
                stub.Backward(ps_pb2.BackwardRequest(context_id=ctx, seq=0, grad_output=tensor(np.ones((1, 2)))))
                if rank == 3:
                    import time
                    time.sleep(0.3)
                stub.Step(ps_pb2.StepRequest(context_id=ctx))
                with lock:
                    done[rank] += 1
        run_threads(trainer, (1, 2, 3))
        st = stub.Status(ps_pb2.StatusRequest())
        assert st.model_version == v0 + 22 and st.live_contexts == 0, st
        assert st.ssp_deferred > 0, "the fast trainers never waited"
        # A Forward runs only within the bound (+1: the slow step's reply may trail its application).
        assert max(lag) <= 1 + 1, f"a fast trainer ran {max(lag)} steps ahead of the slow one"
    print(f"generic_client modes {mode}: exactly once with more trainers than server threads: OK")


def main():
    mode, addr = sys.argv[1], sys.argv[2]
    with grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20)]) as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        stub = ps_pb2_grpc.ParameterServerStub(ch)
        if mode == "lm":
            test_lm(stub, float(sys.argv[3]))
        elif mode == "sync":
            test_sync(stub)
        else:
            test_modes(stub, sys.argv[3])


if __name__ == "__main__":
    main()
