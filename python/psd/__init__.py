"""psd from Python: PyTorch modules and contexts over psd's gRPC service.

    import psd
    client = psd.connect("configs/local.yaml")          # the YAML ps-train reads
    conv, fc = psd.RemoteStage("conv"), psd.RemoteStage("fc")
    for x, y in loader:
        for ctx in psd.attempts():                       # again only if psd lost the batch
            with ctx:
                loss = F.nll_loss(fc(conv(x)), y)
                loss.backward()                          # Backwards to psd
                ctx.step()                               # applied exactly once

docs/python.md is the guide; docs/protocol.md the retry and settle rules
this package follows, as ps-train does.
"""
from .checkpoint import read_safetensors, state_dict
from .client import Client, connect
from .context import Context, StepResult, attempts, context, current
from .errors import ContextLost, Error, RoundClosed
from .modules import HostedModule, RemoteStage

from ._proto import version as __version__  # noqa: E402 (VERSION, written by make)

__all__ = ["connect", "Client", "RemoteStage", "HostedModule", "context", "attempts", "current", "Context",
           "StepResult", "state_dict", "read_safetensors", "Error", "ContextLost", "RoundClosed", "__version__"]
