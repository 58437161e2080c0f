"""Turning what cannot be one graph into TraceErrors that name the module, the user's line and the op.

* :class:`DataDependenceGuard` (a dispatch mode active while tracing) raises on ops whose result
  feeds Python control flow or a shape (``.item()``, ``bool(tensor)``, ``nonzero``, boolean-mask
  indexing, ``unique``...), which real-mode tracing would otherwise bake in silently.
* :class:`ModuleStack` tracks which submodule is executing.
* :func:`as_trace_error` classifies any exception raised while tracing.
"""

from __future__ import annotations

import os
import traceback
from typing import List

import torch
import torch.nn as nn

from .errors import TraceError

_DATA_DEPENDENT_OPS = {
    "aten::_local_scalar_dense",
    "aten::item",
    "aten::is_nonzero",
    "aten::equal",
    "aten::nonzero",
    "aten::argwhere",
    "aten::masked_select",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::unique_dim_consecutive",
    "aten::bincount",
    "aten::repeat_interleave",
    "aten::allclose",
}


class DataDependenceError(RuntimeError):
    def __init__(self, func):
        super().__init__(
            f"{func} makes the step depend on tensor values (Python control flow on a tensor, .item(), "
            "or an op whose output shape depends on the data)"
        )
        self.func = func


class DataDependenceGuard(torch.utils._python_dispatch.TorchDispatchMode):
    """Raises on ops whose result feeds Python control flow or shapes (works in real tracing mode)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in _DATA_DEPENDENT_OPS:
            raise DataDependenceError(func)
        if name == "aten::index" and len(args) > 1:
            # boolean-mask indexing: the result's shape depends on the mask's values
            if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
                raise DataDependenceError(func)
        return func(*args, **(kwargs or {}))


class ModuleStack:
    """Tracks which submodule is executing, so errors can name it."""

    def __init__(self, model: nn.Module):
        self.names = {id(m): (n or "<root>") for n, m in model.named_modules(remove_duplicate=False)}
        self.stack: List[nn.Module] = []
        self.handles = []

    def __enter__(self):
        def pre(mod, args):
            self.stack.append(mod)

        def post(mod, args, out):
            if self.stack and self.stack[-1] is mod:
                self.stack.pop()

        self.handles = [
            nn.modules.module.register_module_forward_pre_hook(pre),
            nn.modules.module.register_module_forward_hook(post),
        ]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        return False

    def where(self) -> str:
        if not self.stack:
            return ""
        mod = self.stack[-1]
        name = self.names.get(id(mod), "<loss_fn>")
        return f"module '{name}' ({type(mod).__name__})"


def user_frame(tb) -> str:
    """The innermost traceback frame outside torch and fxdp, as 'file:line (source)'."""
    torch_dir = os.path.dirname(torch.__file__)
    fxdp_dir = os.path.dirname(__file__)
    best = ""
    for fr in traceback.extract_tb(tb):
        if fr.filename.startswith(torch_dir) or fr.filename.startswith(fxdp_dir):
            continue
        best = f"{fr.filename}:{fr.lineno} ({fr.line})"
    return best


def _is_data_dependent(e: BaseException) -> bool:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    names = {"GuardOnDataDependentSymNode", "DataDependentOutputException", "DynamicOutputShapeException",
             "DataDependenceError", "UserError", "PendingUnbackedSymbolNotFound"}
    if isinstance(e, (DataDependentOutputException, DynamicOutputShapeException)):
        return True
    if type(e).__name__ in names:
        return True
    msg = str(e)
    return "data-dependent" in msg or "data dependent" in msg or "_local_scalar_dense" in msg


def _op_of(e: BaseException) -> str:
    fn = getattr(e, "func", None)
    return f" at op {fn}" if fn is not None else ""


def as_trace_error(e: BaseException, mstack: ModuleStack) -> TraceError:
    """A TraceError naming the module, the user's source line and the op where ``e`` happened."""
    where = mstack.where()
    frame = user_frame(e.__traceback__)
    loc = (f" in {where}" if where else "") + (f" at {frame}" if frame else "")
    if isinstance(e, TraceError):
        return TraceError(f"{e}{f' (at {frame})' if frame and frame not in str(e) else ''}")
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if _is_data_dependent(e):
        msg = f"data-dependent control flow{loc}{_op_of(e)}: {first}"
    elif "device" in str(e).lower():
        msg = f"tensors on mixed devices{loc}{_op_of(e)}: {first}"
    else:
        msg = f"cannot trace the training step{loc}{_op_of(e)}: {type(e).__name__}: {first}"
    return TraceError(msg)
