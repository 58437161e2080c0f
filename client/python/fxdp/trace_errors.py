"""Turning what cannot be one graph into TraceErrors that name the module, the user's line and the op.

* :class:`DataDependenceGuard` (a dispatch mode active while tracing) raises on ops whose result
  feeds Python control flow or a shape (``.item()``, ``bool(tensor)``, ``nonzero``, boolean-mask
  indexing, ``unique``...), which real-mode tracing would otherwise bake in silently.
* :class:`ModuleStack` tracks which submodule is executing.
* :class:`SourceRecorder` gives every node of the trace the user's line that produced it (the
  GraphDef's ``Node.source``, which every compile error quotes).
* :func:`as_trace_error` classifies any exception raised while tracing.
"""

from __future__ import annotations

import linecache
import os
import sys
import traceback
from typing import Dict, List, Optional

import torch
import torch.fx.traceback as fx_traceback
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
            if any(
                isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                for i in args[1]
            ):
                raise DataDependenceError(func)
        return func(*args, **(kwargs or {}))


class ModuleStack:
    """Tracks which submodule is executing, so errors can name it."""

    def __init__(self, model: nn.Module):
        self.names = {
            id(m): (n or "<root>") for n, m in model.named_modules(remove_duplicate=False)
        }
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

    def path(self) -> str:
        """The executing submodule's path from the model ("model.layers.0.mlp"), or ""."""
        if not self.stack:
            return ""
        name = self.names.get(id(self.stack[-1]))
        if name is None:
            return (
                f"<{type(self.stack[-1]).__name__}>"  # a module outside the model (a loss module)
            )
        return "model" if name == "<root>" else f"model.{name}"

    def where(self) -> str:
        if not self.stack:
            return ""
        mod = self.stack[-1]
        name = self.names.get(id(mod), "<loss_fn>")
        return f"module '{name}' ({type(mod).__name__})"


_TORCH_DIR = os.path.dirname(torch.__file__)
_FXDP_DIR = os.path.dirname(__file__)
_FXDP_USER_DIRS = (os.path.join(_FXDP_DIR, "zoo"),)  # fxdp's own models are user code
SOURCE_MAX = 400  # bytes of Node.source (graph.proto)


def _is_library(filename: str) -> bool:
    if filename.startswith(_FXDP_USER_DIRS):
        return False
    return (
        filename.startswith(_TORCH_DIR)
        or filename.startswith(_FXDP_DIR)
        or filename.startswith("<")
    )


def _installed_dirs() -> tuple:
    import site
    import sysconfig

    dirs = {sysconfig.get_paths().get(k, "") for k in ("purelib", "platlib")}
    dirs.update(getattr(site, "getsitepackages", lambda: [])())
    return tuple(sorted(os.path.join(d, "") for d in dirs if d))


_INSTALLED_DIRS = _installed_dirs()  # site-packages: transformers, timm, ... (not the user's code)


def _is_installed(filename: str) -> bool:
    """A file of an installed package (site-packages), fxdp's own models excepted."""
    return filename.startswith(_INSTALLED_DIRS) and not filename.startswith(_FXDP_USER_DIRS)


def _short_path(filename: str) -> str:
    for d in _INSTALLED_DIRS:
        if filename.startswith(d):
            return filename[len(d) :]  # transformers/masking_utils.py
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def user_line(frame) -> str:
    """The innermost frame from `frame` outward that is outside torch and fxdp, as "file:line:
    code" (Node.source's format). When that frame is in an installed package (a guard made in
    transformers' masking_utils.py), the user's line is the innermost frame outside installed
    packages too: "train.py:12: out = model(ids) (in transformers/masking_utils.py:340: ...)"."""
    f = frame
    while f is not None and _is_library(f.f_code.co_filename):
        f = f.f_back
    if f is None:
        return ""
    inner = _frame_text(f.f_code.co_filename, f.f_lineno)
    if not _is_installed(f.f_code.co_filename):
        return inner
    u = f.f_back
    while u is not None and (
        _is_library(u.f_code.co_filename) or _is_installed(u.f_code.co_filename)
    ):
        u = u.f_back
    return inner if u is None else f"{_frame_text(u.f_code.co_filename, u.f_lineno)} (in {inner})"


def _frame_text(filename: str, lineno: int) -> str:
    code = linecache.getline(filename, lineno).strip()
    return f"{_short_path(filename)}:{lineno}: {code}"


class SourceRecorder(torch.utils._python_dispatch.TorchDispatchMode):
    """Gives every op that ``make_fx`` records the user's line that produced it.

    Active inside pass 1 (with ``torch.fx.traceback.preserve_node_meta()``): for each op it sets the
    current node meta's ``stack_trace`` to a compact one-line form, "FILE:LINE in MODULE: CODE"
    (``Node.source`` in graph.proto), which make_fx copies onto the nodes it creates for the op. An op
    of the backward pass gets "backward of " and its forward op's line (the autograd node running it,
    matched by sequence number); the optimizer's ops get the line calling ``optimizer.step()``."""

    def __init__(self, mstack: ModuleStack):
        super().__init__()
        self.mstack = mstack
        self.forward: Dict[int, str] = {}  # autograd sequence number -> the forward op's source
        self.seq = torch.autograd._get_sequence_nr()
        self.cache: Dict[tuple, tuple] = {}

    def _here(self) -> str:
        f = sys._getframe(2)
        while f is not None and _is_library(f.f_code.co_filename):
            f = f.f_back
        if f is None:
            return ""
        key = (f.f_code.co_filename, f.f_lineno)
        loc = self.cache.get(key)
        if loc is None:
            code = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
            loc = self.cache[key] = f"{_short_path(f.f_code.co_filename)}:{f.f_lineno}", code
        module = self.mstack.path()
        return f"{loc[0]}{f' in {module}' if module else ''}: {loc[1]}"[:SOURCE_MAX]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        grad_fn = torch._C._current_autograd_node()
        src: Optional[str] = None
        if grad_fn is not None:
            fwd = self.forward.get(grad_fn._sequence_nr())
            src = f"backward of {fwd}"[:SOURCE_MAX] if fwd else None
        if src is None:
            src = self._here()
        seq = torch.autograd._get_sequence_nr()
        if (
            grad_fn is None and seq != self.seq
        ):  # the op made an autograd node: its backward's source
            self.forward[seq - 1] = src
        self.seq = seq
        fx_traceback.set_stack_trace([src] if src else [])
        return func(*args, **(kwargs or {}))


def node_source(node: torch.fx.Node) -> str:
    """The compact source SourceRecorder recorded for an FX node, or ""."""
    st = node.meta.get("stack_trace")
    if not isinstance(st, str) or "\n" in st.strip():
        return ""
    return st.strip()[:SOURCE_MAX]


def user_frame(tb) -> str:
    """The innermost traceback frame outside torch and fxdp, as 'file:line (source)'; when it is
    in an installed package (transformers) or in code without a file (exec'd or generated:
    '<string>'), the innermost outside both, with that frame after it: 'train.py:12 (out =
    model(ids)) in transformers/...:340 (...)', 'train.py:9 (h = gen(x)) in <string>:2'."""
    torch_dir = os.path.dirname(torch.__file__)
    fxdp_dir = os.path.dirname(__file__)
    best, lib = "", ""
    for fr in traceback.extract_tb(tb):
        if fr.filename.startswith(torch_dir) or fr.filename.startswith(fxdp_dir):
            continue
        name = _short_path(fr.filename) if _is_installed(fr.filename) else fr.filename
        text = f"{name}:{fr.lineno}" + (f" ({fr.line})" if fr.line else "")
        if _is_installed(fr.filename) or fr.filename.startswith("<"):
            lib = text
        else:
            best, lib = text, ""
    if best and lib:
        return f"{best} in {lib}"
    return best or lib


def _is_data_dependent(e: BaseException) -> bool:
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    names = {
        "GuardOnDataDependentSymNode",
        "DataDependentOutputException",
        "DynamicOutputShapeException",
        "DataDependenceError",
        "UserError",
        "PendingUnbackedSymbolNotFound",
    }
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
