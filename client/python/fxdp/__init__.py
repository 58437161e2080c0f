"""fxdp: trace one PyTorch training step into an aten graph and run it data-parallel."""

__version__ = "0.1.0"

from .errors import GraphFormatError, TraceError  # noqa: E402
from .traced import TracedStep, load  # noqa: E402
from .tracer import DEFAULT_DECOMPOSITIONS, SUPPORTED_OPTIMIZERS, trace  # noqa: E402

__all__ = [
    "trace",
    "load",
    "TracedStep",
    "TraceError",
    "GraphFormatError",
    "DEFAULT_DECOMPOSITIONS",
    "SUPPORTED_OPTIMIZERS",
    "__version__",
]
