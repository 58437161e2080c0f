"""fxdp: trace one PyTorch training step into an aten graph and run it data-parallel."""

__version__ = "0.1.0"
