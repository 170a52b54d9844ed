"""psd's statuses as Python exceptions (docs/protocol.md, "Statuses").

Every call psd refuses, and every call this package gives up on, raises a
`psd.Error` carrying psd's gRPC status code and message, the method and
the server, so a trainer can print exactly what was refused and why:

    Forward to ps0 (127.0.0.1:50061) failed: INVALID_ARGUMENT: stage 'conv': ...

Two subclasses name the outcomes of the retry and settle rules:
`ContextLost` (nothing of the context was applied anywhere: run the batch
again under a new context, as `psd.attempts` does) and `RoundClosed` (a
sync round closed without this context's step: it was dropped, not
applied; `psd.attempts` runs the batch again under a new context).
"""
import grpc

__all__ = ["Error", "ContextLost", "RoundClosed", "RETRYABLE"]

# psd's trailing metadata on an admission refusal (RESOURCE_EXHAUSTED: a
# client over its fair share of calls or context memory): the call did
# nothing and may be sent again as it is after at least this many ms
# (common/rpc.h PS_RPC_RETRY_AFTER_KEY). Without it a RESOURCE_EXHAUSTED (a
# message over server.max_message_mb, out of memory) is final.
RETRY_AFTER_KEY = "psd-retry-after-ms"
RETRY_AFTER_MAX_MS = 60000

# UNAVAILABLE (psd down, restarting, unreachable) and DEADLINE_EXCEEDED (no
# answer within trainer.rpc_timeout_s): the outcome is unknown, the call may
# be tried again (trainer/retry.c ps_retry_retryable).
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class Error(Exception):
    """A call psd refused, or one this client could not complete.

    code:    a grpc.StatusCode (psd's status; docs/protocol.md)
    status:  its name, e.g. "NOT_FOUND"
    details: psd's message (or the client's, for what it refused itself)
    method:  the RPC ("Forward", "Step", ...) or None
    server:  the server in words ("ps0 (127.0.0.1:50061)") or None
    retry_after_ms: psd's admission hint (RETRY_AFTER_KEY) of a
             RESOURCE_EXHAUSTED, else 0 (see busy)
    """

    def __init__(self, code, details, method=None, server=None, retry_after_ms=0):
        self.code = code
        self.retry_after_ms = retry_after_ms
        self.status = code.name if isinstance(code, grpc.StatusCode) else str(code)
        self.details = details
        self.method = method
        self.server = server
        if method and server:
            text = f"{method} to {server} failed: {self.status}: {details}"
        elif method:
            text = f"{method}: {self.status}: {details}"
        else:
            text = f"{self.status}: {details}"
        super().__init__(text)

    @property
    def retryable(self):
        """UNAVAILABLE or DEADLINE_EXCEEDED: the outcome is unknown."""
        return self.code in RETRYABLE

    @property
    def busy(self):
        """psd's admission refusal (RESOURCE_EXHAUSTED with its retry hint):
        the call did nothing there and may be sent again as it is."""
        return self.code == grpc.StatusCode.RESOURCE_EXHAUSTED and self.retry_after_ms > 0


class ContextLost(Error):
    """Nothing of the context was applied on any server (psd restarted, the
    context expired, or a retried call found it unusable): run the batch
    again under a new context. `psd.attempts()` does that for you."""


class RoundClosed(Error):
    """consistency sync: the round this context belonged to closed without
    it (a straggler). psd dropped its gradients; nothing was applied. Not
    under the same context: `psd.attempts()` runs the batch again under a
    new one, which joins the open round (at most four times in a row, as
    ps-train); a bare `psd.context()` leaves it to you (go on, or run the
    batch again)."""


def from_rpc(e, method, server):
    """The Error (or subclass) for a grpc.RpcError of `method` to `server`."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else None) or "(no details)"
    cls = RoundClosed if code == grpc.StatusCode.ABORTED else Error
    return cls(code, details, method, server, retry_after_of(e) if code == grpc.StatusCode.RESOURCE_EXHAUSTED else 0)


def retry_after_of(e):
    """psd's admission hint (RETRY_AFTER_KEY) of a grpc.RpcError, in ms; 0
    when it has none."""
    try:
        md = e.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - an RpcError without metadata
        return 0
    for k, v in md:
        if k == RETRY_AFTER_KEY:
            v = v.decode() if isinstance(v, bytes) else str(v)
            if v.isdigit() and len(v) <= 9:
                return min(int(v), RETRY_AFTER_MAX_MS)
            return 0
    return 0
