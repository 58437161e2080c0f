"""fxdp: trace one PyTorch training step into an aten graph and run it data-parallel."""

__version__ = "0.1.0"

from .checkpoints import InitialCheckpoint, initial_checkpoint  # noqa: E402
from .compiled import CompiledStep, compile  # noqa: E402,A004
from .dataset import write_dataset  # noqa: E402
from .errors import GraphFormatError, ShapeError, TraceError  # noqa: E402
from .evaluation import trace_eval  # noqa: E402
from .state_io import load_into, state_of  # noqa: E402
from .traced import TracedStep, load  # noqa: E402
from .tracer import DEFAULT_DECOMPOSITIONS, SUPPORTED_OPTIMIZERS, trace, trace_step  # noqa: E402


def __getattr__(name):
    # The gRPC client is imported on first use (it needs grpcio and the generated stubs).
    if name in ("Client", "ServerError"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'fxdp' has no attribute {name!r}")


__all__ = [
    "Client",
    "ServerError",
    "trace",
    "trace_step",
    "trace_eval",
    "compile",
    "CompiledStep",
    "load",
    "load_into",
    "initial_checkpoint",
    "InitialCheckpoint",
    "state_of",
    "write_dataset",
    "TracedStep",
    "TraceError",
    "GraphFormatError",
    "ShapeError",
    "DEFAULT_DECOMPOSITIONS",
    "SUPPORTED_OPTIMIZERS",
    "__version__",
]
