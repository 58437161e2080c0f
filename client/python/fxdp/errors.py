"""Exceptions raised by fxdp."""


class TraceError(Exception):
    """A training step cannot be traced into an fxdp graph.

    The message names the module, parameter, input or op that is at fault.
    """


class GraphFormatError(ValueError):
    """A GraphDef cannot be converted (unknown op, bad reference, ...)."""
