"""Tracing without running the model: where FakeTensor layouts may not be the kernels' (issue 27).

``tracing_mode="auto"`` (the default) traces on FakeTensors: no step runs, and a model on ``meta``
traces too. A FakeTensor's strides come from the op's meta kernel; where they differ from the real
kernel's, a ``reshape``/``matmul`` traced afterwards may have chosen a ``view`` the real tensor
cannot take (it fails at run time) or a copy. Tracing every zoo and Hugging Face test model both
ways (tests/python/test_tracing_modes.py) finds the ops of :data:`LAYOUT_UNSURE`: their meta kernel
gives a layout other than the CPU kernel's when an input is not contiguous. Everywhere else the
graphs are the same, byte for byte (strides of size-1 dims aside, which address nothing).

:func:`check` runs each such node's op alone on zero tensors of its inputs' exact shapes and strides
(one op, not the step: an elementwise backward of one activation) and returns the nodes whose real
layout differs from the FakeTensor's. The tracer then traces again with real tensors
(``tracing_mode="real"``, which runs the step) or, for a model on ``meta``, raises a TraceError
naming the node, the op, the user's line and both layouts.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
import torch.fx as fx

# op -> the layout its CPU kernel gives where its meta kernel does not (what the zoo/HF traces showed)
LAYOUT_UNSURE = {
    "aten::mse_loss_backward": "contiguous, where meta follows a non-contiguous input's strides",
    "aten::native_layer_norm_backward": "contiguous grad_input, where meta follows the input's",
}


def _op_name(n: fx.Node) -> str:
    schema = getattr(n.target, "_schema", None)
    return schema.name if schema is not None else ""


def _tensors(v) -> List[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for t in v if isinstance(t, torch.Tensor)]
    return []


def _layout(t: torch.Tensor) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    """Shape and the strides that address memory (those of dims of size > 1)."""
    return tuple(t.shape), tuple(s if d > 1 else 0 for d, s in zip(t.shape, t.stride()))


def _val(n: fx.Node):
    return n.meta.get("val")


def unsure_nodes(gm: fx.GraphModule, val_of: Callable = _val) -> List[fx.Node]:
    """Nodes of an op of LAYOUT_UNSURE with an input that is not contiguous."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or _op_name(n) not in LAYOUT_UNSURE:
            continue
        ins = [val_of(a) for a in n.all_input_nodes]
        if any(isinstance(v, torch.Tensor) and not v.is_contiguous() for v in ins):
            out.append(n)
    return out


def _zeros_like_val(v, device: torch.device):
    """Zeros with ``v``'s exact shape, strides and offset (a view of a buffer just large enough)."""
    if not isinstance(v, torch.Tensor):
        return v
    span = v.storage_offset() + 1 + sum((d - 1) * s for d, s in zip(v.shape, v.stride()) if d > 0)
    buf = torch.zeros(span if v.numel() else 0, dtype=v.dtype, device=device)
    return buf.as_strided(v.shape, v.stride(), v.storage_offset())


def _real_outputs(n: fx.Node, device: torch.device, val_of: Callable = _val):
    def arg(a):
        return _zeros_like_val(val_of(a), device) if isinstance(a, fx.Node) else a

    args = fx.node.map_aggregate(n.args, lambda a: arg(a) if isinstance(a, fx.Node) else a)
    kwargs = fx.node.map_aggregate(n.kwargs, lambda a: arg(a) if isinstance(a, fx.Node) else a)
    with torch.no_grad():
        return n.target(*args, **kwargs)


def check(
    gm: fx.GraphModule, device: torch.device, val_of: Callable = _val
) -> List[Tuple[fx.Node, str, str]]:
    """(node, FakeTensor layout, real layout) of each unsure node whose real layout differs; every
    unsure node when ``device`` cannot run ops here (a CUDA trace without CUDA). ``val_of(node)``:
    the node's FakeTensor (a symbolic trace's at the example's sizes: fxdp.dynamic.hinted)."""
    bad = []
    for n in unsure_nodes(gm, val_of):
        fake = [_layout(t) for t in _tensors(val_of(n))]
        real: Optional[list] = None
        if device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_available()):
            real = [_layout(t) for t in _tensors(_real_outputs(n, device, val_of))]
        if real != fake:
            bad.append((n, _describe(fake), _describe(real) if real is not None else "unknown"))
    return bad


def _describe(layouts) -> str:
    return "; ".join(f"shape {list(s)} strides {list(st)}" for s, st in layouts)
