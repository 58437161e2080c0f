"""Tracing one training step (forward, loss, backward, optimizer update) into an aten graph.

How it works
------------
1. The step is written as a function of flat tensors
   ``step(*params, *buffers, *optimizer_state, *inputs)``: it runs the user's module with
   ``torch.func.functional_call``, the user's loss function, ``torch.autograd.grad`` for the
   trainable parameters, and then the user's own ``torch.optim`` object (``optimizer.step()``),
   re-pointed for the duration of the call at the traced parameters and state.
2. Pass 1: ``make_fx(step, tracing_mode=..., decomposition_table=...)`` records every aten op
   below autograd (so the backward ops are explicit nodes). The default ``"real"`` mode runs the
   step once on the real example tensors, so layouts and view decisions are exactly those of the
   real kernels; a dispatch guard turns data-dependent ops (``.item()``/``bool()`` on tensors,
   ``nonzero``, boolean masks...) into TraceErrors. ``"fake"`` traces on FakeTensors.
3. Pass 2: the pass-1 graph is re-traced under ``torch.func.functionalize(remove="mutations")``,
   which turns every in-place op (optimizer ``add_``/``_foreach_*_``, BatchNorm running-stat
   updates, ``num_batches_tracked += 1``) into its functional variant. View ops are kept as views.
4. Clean-up: ``detach``/``alias``, profiler record-function ops and the clones the step function
   makes of its inputs are removed; tensor constants are lifted to CONSTANT placeholders;
   gradients are marked with ``grad_of``; outputs that did not change are dropped. In real mode
   the finished graph is run once more to record each value's exact shape/stride/offset.

Decomposition table
-------------------
``DEFAULT_DECOMPOSITIONS`` holds a single entry: ``aten.native_batch_norm.default`` is rewritten
to ``aten._native_batch_norm_legit`` (PyTorch's own decomposition). ``native_batch_norm`` updates
the running statistics in place without saying so in its schema, so functionalization cannot see
the mutation; ``_native_batch_norm_legit`` has the right alias annotations and functionalizes to
``_native_batch_norm_legit_functional``, which returns the new running stats.

Nothing else is decomposed: the graph stays at the level that autograd and the
CompositeImplicitAutograd kernels produce (``t``/``addmm``/``mm``, ``view``/``_unsafe_view``/
``expand``/``permute``/``transpose``, ``native_layer_norm(_backward)``, ``convolution(_backward)``,
``nll_loss_forward``/``_log_softmax``...). Every one of these is a dispatcher op that the C++
executor can call by schema name, view ops stay intact for the analyzer's DimMap rules, and no
``prims.*`` op can appear (the core-ATen / inductor tables would introduce prims and rewrite views).
``trace(..., decompositions=...)`` adds entries on top of the default table.

Optimizer state (step 1 and step k with one graph)
--------------------------------------------------
State that the optimizer does not have yet is created the way a real first step creates it,
in a form that makes the steady-state algorithm reproduce step 1 exactly:

* Adam/AdamW: ``step = 0`` (float32 scalar), ``exp_avg``/``exp_avg_sq``/``max_exp_avg_sq`` zeros -
  this *is* what ``torch.optim`` creates lazily, so the graph is the real algorithm for every step.
* SGD with momentum: ``momentum_buffer`` zeros. Torch creates it as ``grad.clone()`` on step 1;
  with ``dampening == 0`` the steady-state update ``buf*momentum + grad`` gives exactly ``grad``
  from a zero buffer, so step 1 is reproduced bit for bit. With ``dampening != 0`` it would not be,
  so tracing a *fresh* SGD optimizer with dampening raises TraceError (take one eager step first;
  existing state is always traced as it is).

Existing state (an optimizer that has already stepped) is used as it is.

Adam/AdamW are traced through torch.optim's ``capturable`` code path with
``torch.compiler.is_compiling()`` reporting True for the duration of ``optimizer.step()``: the
step counter stays a tensor (no ``.item()``), so one graph serves every step. The result agrees
with the default eager path to fp32 rounding. ``foreach=None`` is resolved the way eager resolves
it for the real tensors before tracing. ``fused=True`` and ``differentiable=True`` are rejected.
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import torch
import torch.fx as fx
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

from . import convert
from .errors import TraceError
from .v1 import graph_pb2 as pb

aten = torch.ops.aten

__all__ = ["trace", "DEFAULT_DECOMPOSITIONS", "SUPPORTED_OPTIMIZERS"]


def _default_decompositions() -> Dict[Any, Callable]:
    from torch._decomp.decompositions import native_batch_norm_decomposition

    return {aten.native_batch_norm.default: native_batch_norm_decomposition}


DEFAULT_DECOMPOSITIONS = _default_decompositions()

SUPPORTED_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)

_STATE_KEYS = {
    "sgd": ("momentum_buffer",),
    "adam": ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
}


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _compiling():
    """Make torch.optim take its compile-friendly (tensor step, no .item()) path."""
    orig = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling = orig


class _ModuleStack:
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


def _user_frame(tb) -> str:
    """The innermost traceback frame outside torch and fxdp, as 'file:line'."""
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
             "DataDependenceError",
             "UserError", "PendingUnbackedSymbolNotFound"}
    if isinstance(e, (DataDependentOutputException, DynamicOutputShapeException)):
        return True
    if type(e).__name__ in names:
        return True
    msg = str(e)
    return "data-dependent" in msg or "data dependent" in msg or "_local_scalar_dense" in msg


def _op_of(e: BaseException) -> str:
    fn = getattr(e, "func", None)
    if fn is not None:
        return f" at op {fn}"
    return ""


def _normalize_inputs(example_inputs, input_names) -> tuple[List[torch.Tensor], List[str]]:
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(example_inputs, dict):
        names = [str(k) for k in example_inputs]
        values = list(example_inputs.values())
    else:
        values = list(example_inputs)
        names = list(input_names) if input_names is not None else [f"input.{i}" for i in range(len(values))]
    if len(names) != len(values):
        raise TraceError(f"{len(names)} input names for {len(values)} inputs")
    if len(set(names)) != len(names):
        raise TraceError(f"input names are not unique: {names}")
    for n, v in zip(names, values):
        if not isinstance(v, torch.Tensor):
            raise TraceError(f"input '{n}' is a {type(v).__name__}, not a tensor")
    return values, names


def _normalize_batch_dims(batch_dim, inputs, names) -> List[int]:
    if isinstance(batch_dim, int):
        dims = [batch_dim] * len(inputs)
    else:
        dims = [int(d) for d in batch_dim]
        if len(dims) != len(inputs):
            raise TraceError(f"batch_dim has {len(dims)} entries for {len(inputs)} inputs")
    out = []
    sizes = set()
    for d, x, n in zip(dims, inputs, names):
        if d is None or d == -1:
            out.append(-1)
            continue
        if d < -1:
            d += x.dim()
        if not 0 <= d < x.dim():
            raise TraceError(f"batch_dim {d} is out of range for input '{n}' of shape {tuple(x.shape)}")
        sizes.add(x.shape[d])
        out.append(d)
    if len(sizes) > 1:
        raise TraceError(f"inputs disagree on the batch size along their batch dims: {sorted(sizes)}")
    return out


def _opt_kind(optimizer) -> str:
    if type(optimizer) is torch.optim.SGD:
        return "sgd"
    if type(optimizer) in (torch.optim.Adam, torch.optim.AdamW):
        return "adam"
    raise TraceError(
        f"unsupported optimizer {type(optimizer).__module__}.{type(optimizer).__name__}: "
        "fxdp traces torch.optim.SGD, torch.optim.Adam and torch.optim.AdamW"
    )


def _module_of(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else "<root>"


def _check_devices(model, params, buffers, inputs, input_names) -> torch.device:
    mods = dict(model.named_modules())
    items = [(f"parameter '{n}'", n, t) for n, t in params.items()]
    items += [(f"buffer '{n}'", n, t) for n, t in buffers.items()]
    items += [(f"input '{n}'", None, t) for n, t in zip(input_names, inputs)]
    if not items:
        raise TraceError("nothing to trace: the model has no parameters and there are no inputs")
    ref_desc, _, ref_t = items[0]
    ref = ref_t.device
    for desc, n, t in items[1:]:
        if t.device != ref:
            owner = ""
            if n is not None:
                m = _module_of(n)
                owner = f" of module '{m}' ({type(mods.get(m if m != '<root>' else '', model)).__name__})"
            raise TraceError(
                f"tensors on mixed devices: {desc}{owner} is on {t.device}, but {ref_desc} is on {ref}; "
                "move the model, optimizer state and batch to one device before tracing"
            )
    return ref


def _resolve_foreach(optimizer, params_of_group) -> List[Optional[bool]]:
    from torch.optim.optimizer import _default_to_fused_or_foreach

    out = []
    for group, ps in zip(optimizer.param_groups, params_of_group):
        fe = group.get("foreach")
        if fe is None:
            _, fe = _default_to_fused_or_foreach(ps, group.get("differentiable", False), use_fused=False)
        out.append(bool(fe))
    return out


def _init_state(optimizer, kind: str, pname_of: Dict[int, str]) -> "OrderedDict[str, OrderedDict[str, torch.Tensor]]":
    """Per parameter name: the optimizer state tensors the traced step reads (see module docstring)."""
    from torch.optim.optimizer import _get_scalar_dtype

    state: "OrderedDict[str, OrderedDict[str, torch.Tensor]]" = OrderedDict()
    for group in optimizer.param_groups:
        for p in group["params"]:
            name = pname_of[id(p)]
            if not p.requires_grad:
                continue
            existing = optimizer.state.get(p, {})
            st: "OrderedDict[str, torch.Tensor]" = OrderedDict()
            if kind == "sgd":
                if group["momentum"] == 0:
                    continue
                buf = existing.get("momentum_buffer")
                if buf is None:
                    if group["dampening"] != 0:
                        raise TraceError(
                            f"SGD with momentum and dampening={group['dampening']} has no momentum_buffer yet for "
                            f"parameter '{name}': torch creates it as grad.clone() on the first step, which a "
                            "steady-state graph cannot reproduce when dampening != 0. Take one eager "
                            "optimizer step before tracing (existing state is traced as it is)."
                        )
                    buf = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["momentum_buffer"] = buf.detach().clone()
            else:
                for k in existing:
                    if k not in _STATE_KEYS["adam"]:
                        raise TraceError(f"unexpected Adam state '{k}' for parameter '{name}'")
                if existing:
                    step = existing["step"]
                    st["step"] = torch.as_tensor(step, dtype=_get_scalar_dtype()).detach().clone().to(p.device)
                    st["exp_avg"] = existing["exp_avg"].detach().clone()
                    st["exp_avg_sq"] = existing["exp_avg_sq"].detach().clone()
                    if group["amsgrad"]:
                        st["max_exp_avg_sq"] = existing["max_exp_avg_sq"].detach().clone()
                else:
                    st["step"] = torch.zeros((), dtype=_get_scalar_dtype(), device=p.device)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group["amsgrad"]:
                        st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state[name] = st
    return state


def _check_optimizer_options(optimizer, kind):
    for i, group in enumerate(optimizer.param_groups):
        if group.get("fused"):
            raise TraceError(f"optimizer param group {i}: fused=True is not supported; use foreach or single-tensor")
        if group.get("differentiable"):
            raise TraceError(f"optimizer param group {i}: differentiable=True is not supported")
        for k in ("lr", "weight_decay", "momentum", "dampening", "betas", "eps"):
            v = group.get(k)
            vals = v if isinstance(v, tuple) else (v,)
            if any(isinstance(x, torch.Tensor) for x in vals):
                raise TraceError(f"optimizer param group {i}: tensor hyper-parameter '{k}' is not supported")


# --------------------------------------------------------------------------- graph clean-up

_IDENTITY_OPS = {aten.detach.default, aten.alias.default}


def _is_profiler(n: fx.Node) -> bool:
    t = n.target
    return isinstance(t, torch._ops.OpOverload) and t.namespace == "profiler"


def _cleanup(gm: fx.GraphModule) -> None:
    g = gm.graph
    for n in reversed(list(g.nodes)):
        if n.op == "call_function" and _is_profiler(n):
            if not n.users:
                g.erase_node(n)
    for n in list(g.nodes):
        if n.op == "call_function" and _is_profiler(n):
            for u in list(n.users):
                g.erase_node(u)
            g.erase_node(n)
    for n in list(g.nodes):
        if n.op != "call_function":
            continue
        if n.target in _IDENTITY_OPS:
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
        elif (
            n.target is aten.clone.default
            and isinstance(n.args[0], fx.Node)
            and n.args[0].op == "placeholder"
            and n.kwargs.get("memory_format", torch.preserve_format) == torch.preserve_format
        ):
            n.replace_all_uses_with(n.args[0])
            g.erase_node(n)
    g.eliminate_dead_code()


def _validate_ops(gm: fx.GraphModule) -> None:
    import operator

    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        t = n.target
        if t is operator.getitem:
            continue
        if not isinstance(t, torch._ops.OpOverload):
            raise TraceError(f"node '{n.name}': {t} is not a dispatcher op")
        if t.namespace != "aten":
            raise TraceError(
                f"node '{n.name}': op {t} is not an aten op (prims and other namespaces cannot be called by "
                "schema name from the C++ executor)"
            )
        for a in t._schema.arguments:
            if a.alias_info is not None and a.alias_info.is_write:
                raise TraceError(f"node '{n.name}': in-place op {t} survived functionalization")


# --------------------------------------------------------------------------- data-dependence guard

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


class _DataDependenceGuard(torch.utils._python_dispatch.TorchDispatchMode):
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


def _record_real_meta(gm: fx.GraphModule, args: Sequence[Any]) -> None:
    """Run the graph once on real tensors and store each value's exact layout in node.meta['val']
    (a meta-device tensor with the same shape/stride/offset) and its device in
    node.meta['fxdp_device'], so the wire metadata matches what the kernels really produce."""

    def describe(v):
        if isinstance(v, torch.Tensor):
            m = torch.empty(0, dtype=v.dtype, device="meta").as_strided(v.shape, v.stride(), v.storage_offset())
            return m, v.device
        return v, None

    class _Rec(fx.Interpreter):
        def run_node(self, n):
            r = super().run_node(n)
            if n.op != "output":
                if isinstance(r, (tuple, list)):
                    d = [describe(x) for x in r]
                    n.meta["val"] = type(r)(x for x, _ in d)
                    n.meta["fxdp_device"] = [dev for _, dev in d]
                else:
                    n.meta["val"], n.meta["fxdp_device"] = describe(r)
            return r

    with torch.no_grad():
        _Rec(gm).run(*args)


# --------------------------------------------------------------------------- trace


def trace(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Optional[Callable[..., torch.Tensor]],
    example_inputs: Union[Sequence[torch.Tensor], Dict[str, torch.Tensor], torch.Tensor],
    *,
    batch_dim: Union[int, Sequence[int]] = 0,
    num_model_inputs: Optional[int] = None,
    input_names: Optional[Sequence[str]] = None,
    loss_reduction: Optional[str] = None,
    decompositions: Optional[Dict[Any, Callable]] = None,
    tracing_mode: str = "real",
):
    """Trace one training step of ``model`` with ``optimizer`` into a :class:`fxdp.TracedStep`.

    The step computed is::

        out  = model(*example_inputs[:num_model_inputs])
        loss = loss_fn(out, *example_inputs[num_model_inputs:])   # or loss = out if loss_fn is None
        grads = d loss / d trainable parameters
        optimizer.step()                                          # the user's torch.optim object

    ``num_model_inputs`` defaults to ``len(example_inputs) - 1`` (the last input is the target)
    when a ``loss_fn`` is given, and to all inputs when ``loss_fn`` is None. ``example_inputs``
    may be a dict (its keys name the inputs) or a sequence (inputs are named ``input.0``,
    ``input.1``... unless ``input_names`` is given). ``batch_dim`` is an int applied to every input
    or one entry per input; ``-1`` marks an input without a batch dim.

    ``tracing_mode="real"`` (default) runs the step once on the real example tensors while
    recording it, so every view/reshape decision and every recorded stride is the one the real
    kernels produce (FakeTensor stride propagation is not exact for every op, e.g.
    ``mse_loss_backward``, and a wrongly baked ``view`` fails at run time). Data-dependent
    control flow is detected by a dispatch guard. ``tracing_mode="fake"`` traces without
    computing (for models that are too big to step once), at the price of that fidelity.

    The model, its buffers and the optimizer are left unchanged.
    Raises :class:`fxdp.TraceError` for what cannot be traced.
    """
    from .traced import TracedStep

    if not isinstance(model, nn.Module):
        raise TraceError(f"model must be an nn.Module, got {type(model).__name__}")
    kind = _opt_kind(optimizer)
    _check_optimizer_options(optimizer, kind)
    inputs, names = _normalize_inputs(example_inputs, input_names)
    bdims = _normalize_batch_dims(batch_dim, inputs, names)
    if num_model_inputs is None:
        num_model_inputs = len(inputs) - 1 if loss_fn is not None else len(inputs)
    if not 0 <= num_model_inputs <= len(inputs):
        raise TraceError(f"num_model_inputs={num_model_inputs} out of range for {len(inputs)} inputs")

    params: "OrderedDict[str, torch.Tensor]" = OrderedDict(model.named_parameters())
    buffers: "OrderedDict[str, torch.Tensor]" = OrderedDict(model.named_buffers())
    pname_of = {id(p): n for n, p in params.items()}
    group_params: List[List[torch.Tensor]] = []
    for gi, group in enumerate(optimizer.param_groups):
        for p in group["params"]:
            if id(p) not in pname_of:
                raise TraceError(
                    f"optimizer param group {gi} holds a tensor of shape {tuple(p.shape)} that is not a "
                    "parameter of the model"
                )
        group_params.append(list(group["params"]))
    device = _check_devices(model, params, buffers, inputs, names)
    foreach = _resolve_foreach(optimizer, group_params)
    ostate = _init_state(optimizer, kind, pname_of)
    for pn, st in ostate.items():
        for k, t in st.items():
            if t.device != device and not (t.dim() == 0 and t.device.type == "cpu"):
                raise TraceError(f"tensors on mixed devices: optimizer state '{k}' of parameter '{pn}' is on "
                                 f"{t.device}, the model on {device}")

    pnames = list(params)
    bnames = list(buffers)
    state_names = [(pn, k) for pn, st in ostate.items() for k in st]
    in_optimizer = {pname_of[id(p)] for ps in group_params for p in ps}
    # the graph differentiates w.r.t. the parameters the optimizer updates
    trainable = [n for n in pnames if params[n].requires_grad and n in in_optimizer]
    trainable_set = set(trainable)
    n_p, n_b, n_s, n_x = len(pnames), len(bnames), len(state_names), len(inputs)

    mstack = _ModuleStack(model)

    if tracing_mode not in ("real", "fake"):
        raise TraceError(f"tracing_mode must be 'real' or 'fake', got {tracing_mode!r}")

    def step(*flat):
        with _DataDependenceGuard():
            return _step(*flat)

    def _step(*flat):
        p_in = flat[:n_p]
        b_in = flat[n_p : n_p + n_b]
        s_in = flat[n_p + n_b : n_p + n_b + n_s]
        x_in = flat[n_p + n_b + n_s :]
        leaves = OrderedDict()
        for n, t in zip(pnames, p_in):
            leaf = t.clone()
            if n in trainable_set:
                leaf.requires_grad_(True)
            leaves[n] = leaf
        bufs = OrderedDict((n, t.clone()) for n, t in zip(bnames, b_in))
        with torch.enable_grad():
            out = torch.func.functional_call(model, {**leaves, **bufs}, tuple(x_in[:num_model_inputs]))
            if loss_fn is None:
                loss = out
            else:
                loss = loss_fn(out, *x_in[num_model_inputs:])
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise TraceError(
                f"the loss must be a scalar tensor, got {type(loss).__name__}"
                + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
            )
        if not loss.requires_grad:
            raise TraceError("the loss does not depend on any trainable parameter")
        grads = torch.autograd.grad(loss, [leaves[n] for n in trainable], allow_unused=True)
        grad_of = dict(zip(trainable, grads))
        snaps = [grad_of[n].clone() if grad_of[n] is not None else None for n in trainable]

        # the optimizer update, run by the user's optimizer object on the traced tensors
        st_tensors = OrderedDict()
        it = iter(s_in)
        for pn, st in ostate.items():
            st_tensors[pn] = {k: next(it).clone() for k in st}
        saved_params = [g["params"] for g in optimizer.param_groups]
        saved_opts = [{k: g.get(k) for k in ("foreach", "capturable")} for g in optimizer.param_groups]
        saved_state = optimizer.state
        try:
            from collections import defaultdict

            new_state = defaultdict(dict)
            for gi, group in enumerate(optimizer.param_groups):
                group["params"] = [leaves[pname_of[id(p)]] for p in saved_params[gi]]
                group["foreach"] = foreach[gi]
                if kind == "adam":
                    group["capturable"] = True
            for pn, st in st_tensors.items():
                new_state[leaves[pn]] = st
            optimizer.state = new_state
            for n in trainable:
                leaves[n].grad = grad_of[n]
            with torch.no_grad(), _compiling():
                optimizer.step()
            final_state = [optimizer.state[leaves[pn]][k] for pn, k in state_names]
        finally:
            for gi, group in enumerate(optimizer.param_groups):
                group["params"] = saved_params[gi]
                for k, v in saved_opts[gi].items():
                    if v is None and k not in group:
                        continue
                    group[k] = v
            optimizer.state = saved_state
            for leaf in leaves.values():
                leaf.grad = None
        outs = [leaf.detach() for leaf in leaves.values()] + list(bufs.values()) + final_state
        return outs + [loss.detach()] + snaps

    flat_real = (
        [params[n].detach() for n in pnames]
        + [buffers[n] for n in bnames]
        + [ostate[pn][k] for pn, k in state_names]
        + list(inputs)
    )
    table = dict(DEFAULT_DECOMPOSITIONS)
    if decompositions:
        table.update(decompositions)
    try:
        with mstack:
            gm1 = make_fx(step, tracing_mode=tracing_mode, decomposition_table=table, _allow_non_fake_inputs=True)(
                *flat_real
            )
        gm = make_fx(
            torch.func.functionalize(gm1, remove="mutations"), tracing_mode=tracing_mode, _allow_non_fake_inputs=True
        )(*flat_real)
    except TraceError:
        raise
    except Exception as e:  # noqa: BLE001 - every failure becomes a TraceError naming what it can
        where = mstack.where()
        frame = _user_frame(e.__traceback__)
        loc = (f" in {where}" if where else "") + (f" at {frame}" if frame else "")
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if _is_data_dependent(e):
            msg = f"data-dependent control flow{loc}{_op_of(e)}: {first}"
        elif "device" in str(e).lower():
            msg = f"tensors on mixed devices{loc}{_op_of(e)}: {first}"
        else:
            msg = f"cannot trace the training step{loc}{_op_of(e)}: {type(e).__name__}: {first}"
        raise TraceError(msg) from e

    _cleanup(gm)
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    assert len(placeholders) == len(flat_real), (len(placeholders), len(flat_real))
    out_node = next(n for n in graph.nodes if n.op == "output")
    (ret,) = out_node.args
    ret = list(ret)

    # --- placeholder roles and names
    roles = (
        [(pb.PARAMETER, n, 0) for n in pnames]
        + [(pb.BUFFER, n, 0) for n in bnames]
        + [(pb.OPTIMIZER_STATE, f"optim.{pn}.{k}", 0) for pn, k in state_names]
        + [(pb.INPUT, n, d) for n, d in zip(names, bdims)]
    )
    for ph, spec in zip(placeholders, roles):
        ph.meta["fxdp_placeholder"] = spec
        # requires_grad is True exactly for the parameters whose gradient the graph computes
        # (trainable, in the optimizer, reached by autograd): each has one grad_of node
        ph.meta["fxdp_requires_grad"] = False

    # --- gradients
    n_state_out = n_p + n_b + n_s
    snaps = ret[n_state_out + 1 :]
    marked = set()
    extra = []
    ph_of = dict(zip(pnames, placeholders[:n_p]))
    for pn, s in zip(trainable, snaps):
        if s is None:
            continue
        ph_of[pn].meta["fxdp_requires_grad"] = True
        src = s.args[0] if (s.op == "call_function" and s.target is aten.clone.default) else None
        if src is not None and src.op == "call_function" and src not in marked:
            s.replace_all_uses_with(src)
            graph.erase_node(s)
            s = src
        else:
            # the gradient is a value that cannot carry the mark itself (an input, or a node shared
            # with another parameter's gradient): it keeps its own clone, alive as an OTHER output
            if s.op == "placeholder" or s in marked:
                with graph.inserting_before(out_node):
                    s = graph.call_function(aten.clone.default, (s,))
                s.meta["val"] = s.args[0].meta["val"]
            extra.append(s)
        s.meta["fxdp_grad_of"] = pn
        marked.add(s)
    kept = ret[: n_state_out + 1]
    out_roles = (
        [(pb.UPDATED_PARAMETER, n) for n in pnames]
        + [(pb.UPDATED_BUFFER, n) for n in bnames]
        + [(pb.UPDATED_OPTIMIZER_STATE, f"optim.{pn}.{k}") for pn, k in state_names]
        + [(pb.LOSS, "")]
    )
    final_ret, final_roles = [], []
    for i, (v, r) in enumerate(zip(kept, out_roles)):
        if i < n_state_out and v is placeholders[i]:
            continue  # unchanged state
        final_ret.append(v)
        final_roles.append(r)
    for n in extra:
        final_ret.append(n)
        final_roles.append((pb.OTHER, ""))
    out_node.args = (final_ret,)
    graph.eliminate_dead_code()

    # --- lift tensor constants to CONSTANT placeholders (before the inputs)
    consts: "OrderedDict[str, torch.Tensor]" = OrderedDict()
    first_input = placeholders[n_p + n_b + n_s] if n_x else None
    lifted: Dict[str, fx.Node] = {}
    for n in list(graph.nodes):
        if n.op != "get_attr":
            continue
        if n.target not in lifted:
            val = getattr(gm, n.target)
            if not isinstance(val, torch.Tensor):
                raise TraceError(f"node '{n.name}': non-tensor attribute {n.target}")
            sname = f"const.{n.target}"
            anchor = graph.inserting_before(first_input) if first_input is not None else \
                graph.inserting_after([p for p in graph.nodes if p.op == "placeholder"][-1])
            with anchor:
                ph = graph.placeholder(_ident(str(n.target)))
            ph.meta["val"] = val
            ph.meta["fxdp_placeholder"] = (pb.CONSTANT, sname, 0)
            lifted[n.target] = ph
            consts[sname] = val.detach().clone()
        n.replace_all_uses_with(lifted[n.target])
        graph.erase_node(n)

    _validate_ops(gm)

    # --- rebuild with readable placeholder names
    new = fx.Graph()
    env: Dict[fx.Node, fx.Node] = {}
    used_names = {n.name for n in graph.nodes if n.op != "placeholder"}
    for n in graph.nodes:
        if n.op == "placeholder":
            role, sname, _ = n.meta["fxdp_placeholder"]
            prefix = {pb.PARAMETER: "p", pb.BUFFER: "b", pb.OPTIMIZER_STATE: "s", pb.INPUT: "x", pb.CONSTANT: "c"}[role]
            base = cand = f"{prefix}_{_ident(sname)}"
            k = 1
            while cand in used_names:
                cand = f"{base}_{k}"
                k += 1
            used_names.add(cand)
            nn_ = new.placeholder(cand)
            nn_.meta = dict(n.meta)
            env[n] = nn_
        elif n.op == "output":
            o = new.output(fx.node.map_arg(n.args[0], lambda a: env[a]))
            o.meta["fxdp_output_specs"] = final_roles
        else:
            env[n] = new.node_copy(n, lambda a: env[a])
    new.lint()
    final_gm = fx.GraphModule(torch.nn.Module(), new)
    if tracing_mode == "real":
        by_role = {}
        for n, t in zip(pnames, flat_real[:n_p]):
            by_role[(pb.PARAMETER, n)] = t
        for n in bnames:
            by_role[(pb.BUFFER, n)] = buffers[n]
        for pn, k in state_names:
            by_role[(pb.OPTIMIZER_STATE, f"optim.{pn}.{k}")] = ostate[pn][k]
        for n, t in zip(names, inputs):
            by_role[(pb.INPUT, n)] = t
        for n, t in consts.items():
            by_role[(pb.CONSTANT, n)] = t
        args = [by_role[n.meta["fxdp_placeholder"][:2]] for n in new.nodes if n.op == "placeholder"]
        try:
            _record_real_meta(final_gm, args)
        except Exception as e:  # noqa: BLE001
            raise TraceError(f"the traced graph does not run on the example tensors: {type(e).__name__}: {e}") from e

    red = loss_reduction or getattr(loss_fn, "reduction", None) or "mean"
    meta = [
        ("model", type(model).__name__),
        ("optimizer", type(optimizer).__name__),
        ("optimizer.foreach", ",".join("true" if f else "false" for f in foreach)),
        ("loss_reduction", str(red)),
        ("batch_size", str(next((x.shape[d] for x, d in zip(inputs, bdims) if d >= 0), -1))),
        ("decompositions", "fxdp-default-v1:native_batch_norm"),
        ("device", str(device)),
    ]
    graph_def = convert.fx_to_graphdef(final_gm, meta)

    init = OrderedDict()
    for n in pnames:
        init[n] = params[n].detach().clone()
    for n in bnames:
        init[n] = buffers[n].detach().clone()
    for pn, k in state_names:
        init[f"optim.{pn}.{k}"] = ostate[pn][k].detach().clone()
    init.update(consts)
    return TracedStep(graph_def, init)


def _ident(s: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in s)
    return out or "v"
