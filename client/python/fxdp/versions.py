"""The torch versions fxdp supports, and the check ``fxdp.trace`` makes.

fxdp-worker runs LibTorch 2.13 and the server checks every op of a graph against torch 2.13's
schemas (analysis/op_schemas.inc), so a graph traced with another torch may call an op or overload
the workers do not have, or one whose meaning changed. Tested: torch 2.13.0 (the CPU wheel).
``fxdp.trace`` and ``fxdp.trace_step`` refuse any torch outside 2.13.x with a
:class:`fxdp.TraceError` naming the version; ``FXDP_ALLOW_UNTESTED_TORCH=1`` traces anyway (the
server still refuses, naming the node, any op or argument list that torch 2.13 does not have).
"""

from __future__ import annotations

import os

import torch

from .errors import TraceError

#: The torch release line graphs must be traced with (major, minor): what fxdp-worker runs.
SUPPORTED_TORCH = (2, 13)
#: Versions the test suite runs on.
TESTED_TORCH = ("2.13.0",)
ALLOW_ENV = "FXDP_ALLOW_UNTESTED_TORCH"


def _major_minor(version: str):
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def check_torch(version: str = None) -> None:
    """Raises TraceError unless ``version`` (default: the installed torch) is 2.13.x, or
    $FXDP_ALLOW_UNTESTED_TORCH is 1."""
    version = torch.__version__ if version is None else version
    if _major_minor(version) == SUPPORTED_TORCH or os.environ.get(ALLOW_ENV) == "1":
        return
    want = ".".join(map(str, SUPPORTED_TORCH))
    raise TraceError(
        f"torch {version} is not supported: fxdp traces with torch {want}.x, the version "
        f"fxdp-worker runs (tested: {', '.join(TESTED_TORCH)}); install torch=={want}.* or set "
        f"{ALLOW_ENV}=1 to trace anyway (the server then refuses any op torch {want} does not have)"
    )
