"""psd from Python: PyTorch modules and contexts over psd's gRPC service.

    import psd
    client = psd.connect("configs/local.yaml")          # the YAML ps-train reads
    conv, fc = psd.RemoteStage("conv"), psd.RemoteStage("fc")
    for x, y in loader:
        for ctx in psd.attempts():                       # again only if nothing was applied
            with ctx:
                loss = F.nll_loss(fc(conv(x)), y)
                loss.backward()                          # Backwards to psd
                ctx.step()                               # applied exactly once

docs/python.md is the guide; docs/protocol.md the retry and settle rules
this package follows, as ps-train does.
"""
import sys as _sys

# Debian's packages, not PyPI's (docs/python.md, "Install"): another python3
# first on PATH may lack them; say which interpreter and what to use.
for _mod, _deb in (("torch", "python3-torch"), ("grpc", "python3-grpcio"), ("numpy", "python3-numpy"),
                   ("google.protobuf", "python3-protobuf")):
    try:
        __import__(_mod)
    except ImportError as _e:
        raise ImportError(f"psd needs {_mod} (Debian's {_deb}), which {_sys.executable} cannot import ({_e}); "
                          "run it with Debian's /usr/bin/python3 (docs/python.md, Install)") from None
del _mod, _deb

from .checkpoint import read_safetensors, state_dict  # noqa: E402
from .client import Client, connect  # noqa: E402
from .context import Context, StepResult, attempts, context, current  # noqa: E402
from .errors import ContextLost, Error, RoundClosed  # noqa: E402
from .modules import HostedModule, RemoteStage  # noqa: E402

from ._proto import version as __version__  # noqa: E402 (VERSION, written by make)

__all__ = ["connect", "Client", "RemoteStage", "HostedModule", "context", "attempts", "current", "Context",
           "StepResult", "state_dict", "read_safetensors", "Error", "ContextLost", "RoundClosed", "__version__"]
