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
    """

    def __init__(self, code, details, method=None, server=None):
        self.code = code
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
    return cls(code, details, method, server)
