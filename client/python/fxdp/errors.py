"""Exceptions raised by fxdp."""


class TraceError(Exception):
    """A training step cannot be traced into an fxdp graph.

    The message names the module, parameter, input or op that is at fault.
    """


class GraphFormatError(ValueError):
    """A GraphDef cannot be converted (unknown op, bad reference, ...)."""


class ShapeError(ValueError):
    """A batch a symbolic graph does not hold for (an input's dim, a symbol's range or a guard the
    trace assumed): ``TracedStep.instantiate`` (fxdp/instantiate.py)."""
