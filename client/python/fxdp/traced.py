"""TracedStep: a traced training step (GraphDef) plus its state, runnable locally with torch.fx."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional, Sequence, Union

import torch

from . import convert
from .errors import GraphFormatError
from .v1 import graph_pb2 as pb

StateDict = "OrderedDict[str, torch.Tensor]"


class TracedStep:
    """One training step as an fxdp graph.

    Attributes:
        graph: the ``fxdp.v1.GraphDef`` protobuf.
    """

    def __init__(self, graph: "pb.GraphDef", state: Optional[Mapping[str, torch.Tensor]] = None):
        self.graph = graph
        self._state = OrderedDict(state) if state is not None else None
        self._gm = None
        self._instances: "OrderedDict[tuple, TracedStep]" = OrderedDict()  # symbolic: per shape

    # ----------------------------------------------------------------- description
    @property
    def placeholders(self) -> List["pb.Node"]:
        return [n for n in self.graph.nodes if n.kind == pb.PLACEHOLDER]

    @property
    def output_node(self) -> "pb.Node":
        return next(n for n in self.graph.nodes if n.kind == pb.OUTPUT)

    def state_names(self) -> List[str]:
        """Names of the non-input placeholders (parameters, buffers, optimizer state, constants), in order."""
        return [
            n.placeholder.state_name for n in self.placeholders if n.placeholder.role != pb.INPUT
        ]

    def input_names(self) -> List[str]:
        return [
            n.placeholder.state_name for n in self.placeholders if n.placeholder.role == pb.INPUT
        ]

    def metadata(self) -> Dict[str, str]:
        return {kv.key: kv.value for kv in self.graph.metadata}

    # ----------------------------------------------------------------- persistence
    def serialize(self) -> bytes:
        return self.graph.SerializeToString(deterministic=True)

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write the binary-serialized GraphDef to ``path``."""
        with open(path, "wb") as f:
            f.write(self.serialize())

    def initial_state(self) -> "OrderedDict[str, torch.Tensor]":
        """Parameters, buffers, optimizer state and lifted constants, by stable name (copies)."""
        if self._state is None:
            raise GraphFormatError(
                "this TracedStep has no state: it was loaded from a graph alone; pass state= to fxdp.load"
            )
        return OrderedDict((k, v.detach().clone()) for k, v in self._state.items())

    def to_safetensors(
        self, path: Union[str, os.PathLike], state: Optional[Mapping[str, torch.Tensor]] = None
    ) -> None:
        """Write ``state`` (default: the initial state) as a safetensors file, same names."""
        from safetensors.torch import save_file

        st = self.initial_state() if state is None else state
        save_file({k: v.detach().contiguous().cpu() for k, v in st.items()}, str(path))

    # ----------------------------------------------------------------- symbolic sizes
    def is_symbolic(self) -> bool:
        """True for a graph traced with ``dynamic=...`` (sizes as expressions of the input dims)."""
        return len(self.graph.symbols) > 0

    def instantiate(
        self, batch: Union[Sequence[torch.Tensor], Mapping[str, torch.Tensor], torch.Tensor]
    ) -> "TracedStep":
        """The static TracedStep of this symbolic one for ``batch``'s shapes (its tensors, or their
        shapes: ``{name: (8, 60)}``), sharing the state; a static step returns itself, for its own
        shapes. The last 16 shapes are kept. Raises :class:`fxdp.ShapeError` (a ValueError) naming the
        input, the dim or guard and the user's line, when the trace does not hold for them."""
        from .instantiate import instantiate

        shapes = self._batch_shapes(batch)
        if not self.is_symbolic():
            instantiate(self.graph, shapes)  # checks the shapes
            return self
        key = tuple(tuple(shapes[n]) for n in self.input_names())
        hit = self._instances.get(key)
        if hit is None:
            hit = TracedStep(instantiate(self.graph, shapes), self._state)
            self._instances[key] = hit
            while len(self._instances) > 16:
                self._instances.popitem(last=False)
        self._instances.move_to_end(key)
        return hit

    def _batch_by_name(self, batch) -> Dict[str, object]:
        """The batch's item of each input, in trace order: ``batch`` is one tensor, a sequence in
        trace order or a mapping by input name."""
        names = self.input_names()
        if isinstance(batch, torch.Tensor):
            batch = (batch,)
        if isinstance(batch, Mapping):
            missing = [n for n in names if n not in batch]
            if missing:
                raise KeyError(f"batch lacks inputs {missing}")
            return {n: batch[n] for n in names}
        batch = list(batch)
        if len(batch) != len(names):
            raise ValueError(
                f"batch has {len(batch)} tensors, the graph takes {len(names)} inputs {names}"
            )
        return dict(zip(names, batch))

    def _batch_shapes(self, batch) -> Dict[str, List[int]]:
        return {
            n: list(t.shape) if isinstance(t, torch.Tensor) else [int(d) for d in t]
            for n, t in self._batch_by_name(batch).items()
        }

    # ----------------------------------------------------------------- execution
    def graph_module(self) -> torch.fx.GraphModule:
        """The GraphDef converted to a runnable torch.fx.GraphModule (cached)."""
        if self._gm is None:
            self._gm = convert.graphdef_to_fx(self.graph)
        return self._gm

    def hyperparameter_names(self) -> List[str]:
        """Names of the HYPERPARAMETER placeholders (``optim.group0.lr``...), fed per step."""
        return [
            n.placeholder.state_name
            for n in self.placeholders
            if n.placeholder.role == pb.HYPERPARAMETER
        ]

    def non_persistent_buffers(self) -> List[str]:
        """The model's buffers that are not in its ``state_dict()`` (registered with
        ``persistent=False``, e.g. a rotary embedding's ``inv_freq``), as the tracer recorded them
        (metadata ``fxdp.non_persistent_buffers``; empty for a graph traced without it).
        ``fxdp export`` leaves them out of a Hugging Face checkpoint."""
        text = self.metadata().get("fxdp.non_persistent_buffers", "")
        return text.split("\n") if text else []

    def random_nodes(self) -> List[str]:
        """Names of the nodes that draw random values (dropout...: fxdp.random_ops.TABLE)."""
        from .random_ops import TABLE

        return [
            n.name
            for n in self.graph.nodes
            if n.kind == pb.CALL_FUNCTION and (n.target.name, n.target.overload) in TABLE
        ]

    def seed(self) -> int:
        """The seed of the step's random ops (metadata ``fxdp.seed``; 0 when it has none)."""
        return int(self.metadata().get("fxdp.seed", "0"))

    def set_seed(self, seed: int) -> None:
        """Records ``seed`` (0 <= seed < 2**64) as the graph's ``fxdp.seed``."""
        from .philox import check_key

        check_key(int(seed), 0)
        kept = [(kv.key, kv.value) for kv in self.graph.metadata if kv.key != "fxdp.seed"]
        del self.graph.metadata[:]
        for k, v in kept + [("fxdp.seed", str(int(seed)))]:
            self.graph.metadata.add(key=k, value=v)

    def output_names(self) -> List[str]:
        """Names of the extra (OTHER) outputs ``train_step`` returned beside the loss."""
        import json

        return json.loads(self.metadata().get("extra_outputs", "[]"))

    def run_local(
        self,
        state: Mapping[str, torch.Tensor],
        batch: Union[Sequence[torch.Tensor], Mapping[str, torch.Tensor], torch.Tensor],
        *,
        hyperparameters: Optional[Mapping[str, float]] = None,
        schedule=None,
        step: int = 1,
        outputs: bool = False,
        seed: Optional[int] = None,
    ):
        """Execute the graph with PyTorch: returns ``(new_state, loss)``, or
        ``(new_state, loss, {name: tensor})`` with ``outputs=True`` (the extra outputs).

        ``state`` maps every state name (see :meth:`state_names`) to a tensor; ``batch`` is a
        sequence of inputs in trace order or a mapping by input name. Hyper-parameters
        (``optim.group0.lr``...) are fed from ``state`` unless ``hyperparameters`` (a dict of
        values) or ``schedule`` (anything :func:`fxdp.schedule.schedule_values` takes, evaluated
        at the 1-based ``step``) gives them. ``new_state`` holds every entry of ``state``,
        replaced where the step updates it. Inputs are not modified.

        Random ops (dropout...) draw from fxdp's generator keyed by ``seed`` (default: the graph's,
        :meth:`seed`), ``step`` and the node, exactly what N ranks draw together for that step
        (docs/randomness.md).

        A symbolic step (``trace_step(..., dynamic=True)``) runs its instance for the batch's
        shapes (:meth:`instantiate`).
        """
        if self.is_symbolic():
            return self.instantiate(batch).run_local(
                state,
                batch,
                hyperparameters=hyperparameters,
                schedule=schedule,
                step=step,
                outputs=outputs,
                seed=seed,
            )
        from .hyperparameter_mode import check_guards
        from .schedule import hyperparameter_guards

        init_kernel_libraries()
        state = self._with_hyperparameters(state, hyperparameters, schedule, step)
        check_guards(
            hyperparameter_guards(self),
            {k: float(state[k]) for k in self.hyperparameter_names() if k in state},
        )
        batch_by_name = self._batch_by_name(batch)
        args = []
        for ph in self.placeholders:
            spec = ph.placeholder
            if spec.role == pb.INPUT:
                args.append(_checked(ph, batch_by_name[spec.state_name]))
            else:
                if spec.state_name not in state:
                    raise KeyError(f"state lacks '{spec.state_name}'")
                args.append(_checked(ph, state[spec.state_name]))
        with torch.no_grad():
            outs = self._run_graph(args, seed, step)
        return self._results(state, outs, outputs)

    def _with_hyperparameters(self, state, hyperparameters, schedule, step: int):
        """``state`` with the hyper-parameters ``hyperparameters`` or ``schedule`` (at ``step``)
        give, as tensors of the state's dtype and device (float32 on the CPU where it has none)."""
        from .schedule import schedule_values

        hv: Dict[str, float] = {}
        if schedule is not None:
            hv.update(schedule_values(schedule, step, self)[step - 1])
        if hyperparameters is not None:
            hv.update(schedule_values([hyperparameters], 1, self)[0])
        if not hv:
            return state
        state = OrderedDict(state.items())
        for k, v in hv.items():
            ref = state.get(k)
            state[k] = torch.tensor(
                v,
                dtype=ref.dtype if ref is not None else torch.float32,
                device=ref.device if ref is not None else "cpu",
            )
        return state

    def _run_graph(self, args: List[torch.Tensor], seed: Optional[int], step: int):
        """The graph's outputs on ``args`` (placeholder order); random ops draw from fxdp's
        generator keyed by ``seed`` (default the graph's), ``step`` and the node."""
        if not self.random_nodes():
            return self.graph_module()(*args)
        from .random_ops import RandomInterpreter

        metas = {n.name: n.outputs[0].tensor for n in self.graph.nodes if n.outputs}
        shapes = {
            name: (tuple(metas[name].shape), convert.PB_TO_DTYPE[metas[name].dtype])
            for name in self.random_nodes()
        }
        s = self.seed() if seed is None else int(seed)
        return RandomInterpreter(self.graph_module(), shapes, s, step).run(*args)

    def _results(self, state, outs, outputs: bool):
        """``(new_state, loss)`` (with ``outputs``, the named extra outputs too) from the graph's
        outputs: UPDATED_* entries replace ``state``'s."""
        new_state = OrderedDict(state.items())
        loss = None
        others = []
        for spec, v in zip(self.output_node.output_specs, outs):
            if spec.role in (pb.UPDATED_PARAMETER, pb.UPDATED_BUFFER, pb.UPDATED_OPTIMIZER_STATE):
                new_state[spec.state_name] = v
            elif spec.role == pb.LOSS:
                loss = v
            elif spec.role == pb.OTHER:
                others.append(v)
        if outputs:
            names = self.output_names()
            return new_state, loss, OrderedDict(zip(names, others[: len(names)]))
        return new_state, loss

    def __repr__(self) -> str:
        return (
            f"TracedStep({len(self.graph.nodes)} nodes, {len(self.state_names())} state tensors, "
            f"inputs={self.input_names()})"
        )


_kernels_ready = threading.Event()
_kernels_lock = threading.Lock()


def init_kernel_libraries() -> None:
    """MKL's vector math (VML: torch's tanh, erf, exp, log... of float tensors) caches the CPU type
    it detects on its first call without a lock, storing the raw type before the mapped one, so a
    thread calling it in between runs other kernels (tanh off by up to 1342 ulp); torch splits an
    elementwise op of >= 4096 elements over its threads, whose first VML calls then race. One call
    here, on this thread, before run_local's first op (as the workers do, executor/kernel_init.h;
    docs/randomness.md)."""
    if _kernels_ready.is_set():
        return
    with _kernels_lock:
        if not _kernels_ready.is_set():
            x = torch.zeros(1)  # one element: below every grain size, computed on this thread
            for op in (torch.tanh, torch.erf, torch.exp, torch.log1p):
                op(x)
            _kernels_ready.set()


def _type_text(dtype: str, shape) -> str:
    return f"{dtype}[{', '.join(str(int(d)) for d in shape)}]"


def _checked(ph: "pb.Node", t) -> torch.Tensor:
    """``t`` when it is the tensor the placeholder declares (dtype and shape, as the workers check what
    they are sent), else a ValueError naming the input or state entry and both types."""
    spec = ph.placeholder
    what = f"input '{spec.state_name}'" if spec.role == pb.INPUT else f"state '{spec.state_name}'"
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"run_local: {what} is a {type(t).__name__}, not a tensor")
    meta = ph.outputs[0].tensor
    want_dtype = convert.PB_TO_DTYPE.get(meta.dtype)
    if t.dtype == want_dtype and list(t.shape) == list(meta.shape):
        return t
    short = lambda d: str(d).replace("torch.", "")  # noqa: E731
    msg = (
        f"run_local: {what} is {_type_text(short(t.dtype), t.shape)}, the graph's placeholder '{ph.name}' "
        f"declares {_type_text(short(want_dtype), meta.shape)}"
    )
    d = spec.batch_dim
    if (
        spec.role == pb.INPUT
        and d >= 0
        and t.dim() == len(meta.shape)
        and t.dtype == want_dtype
        and [s for i, s in enumerate(t.shape) if i != d]
        == [s for i, s in enumerate(meta.shape) if i != d]
    ):
        msg += (
            f": the step was traced with a batch of {meta.shape[d]} (dim {d}) and this batch has {t.shape[d]}; "
            "a traced graph runs the batch size it was traced with: trace it again with this batch size"
        )
    raise ValueError(msg)


def load(
    path: Union[str, os.PathLike],
    state: Union[None, str, os.PathLike, Mapping[str, torch.Tensor]] = None,
) -> TracedStep:
    """Read a GraphDef written by :meth:`TracedStep.save`.

    ``state`` may be a mapping or a safetensors path; without it, a sibling ``<stem>.safetensors``
    is used when present, so ``initial_state()`` works for exported zoo graphs.
    """
    with open(path, "rb") as f:
        data = f.read()
    g = pb.GraphDef()
    g.ParseFromString(data)
    if g.format_version != pb.FORMAT_VERSION_1:
        raise GraphFormatError(f"{path}: unsupported format_version {g.format_version}")
    if state is None:
        sibling = os.path.splitext(str(path))[0] + ".safetensors"
        if os.path.exists(sibling):
            state = sibling
    if isinstance(state, (str, os.PathLike)):
        from safetensors.torch import load_file

        loaded = load_file(str(state))
        names = [
            n.placeholder.state_name
            for n in g.nodes
            if n.kind == pb.PLACEHOLDER and n.placeholder.role != pb.INPUT
        ]
        state = OrderedDict((k, loaded[k]) for k in names if k in loaded)
    return TracedStep(g, state)
