"""Conversion between torch.fx graphs and the fxdp wire format (``fxdp.v1.GraphDef``).

``fx_to_graphdef`` encodes an aten-level FX graph (as produced by :func:`fxdp.trace`);
``graphdef_to_fx`` decodes any GraphDef whose call nodes are dispatcher ops
(``ns::name`` + overload, resolved as ``torch.ops.<ns>.<name>.<overload or default>``) or
``operator.getitem`` into a runnable ``torch.fx.GraphModule``.  The decoder is deliberately
general (all argument kinds, any namespace, references to any output of a multi-output
node) so that it can also run graphs rewritten by the C++ side as a PyTorch oracle.

Placeholder metadata (role, state name, batch dim), output specs and ``grad_of`` marks
travel in ``node.meta`` under the keys ``fxdp_placeholder`` (a ``(role, state_name,
batch_dim)`` tuple of proto enum/str/int), ``fxdp_output_specs`` (list of ``(role,
state_name)``), ``fxdp_grad_of`` (str) and ``fxdp_requires_grad`` (bool).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.fx as fx

from .errors import GraphFormatError, TraceError
from .sizes import SizeArg, SizeWriter
from .trace_errors import node_source
from .v1 import graph_pb2 as pb

PRODUCER = "fxdp-python 0.1.0"

# --------------------------------------------------------------------------- enum tables

DTYPE_TO_PB: Dict[torch.dtype, int] = {
    torch.float32: pb.FLOAT32,
    torch.float64: pb.FLOAT64,
    torch.float16: pb.FLOAT16,
    torch.bfloat16: pb.BFLOAT16,
    torch.int64: pb.INT64,
    torch.int32: pb.INT32,
    torch.int16: pb.INT16,
    torch.int8: pb.INT8,
    torch.uint8: pb.UINT8,
    torch.bool: pb.BOOL,
    torch.complex64: pb.COMPLEX64,
    torch.complex128: pb.COMPLEX128,
    torch.complex32: pb.COMPLEX32,
    torch.float8_e4m3fn: pb.FLOAT8_E4M3FN,
    torch.float8_e5m2: pb.FLOAT8_E5M2,
    torch.uint16: pb.UINT16,
    torch.uint32: pb.UINT32,
    torch.uint64: pb.UINT64,
}
PB_TO_DTYPE = {v: k for k, v in DTYPE_TO_PB.items()}

DEVICE_TO_PB = {"cpu": pb.CPU, "cuda": pb.CUDA, "meta": pb.META}
PB_TO_DEVICE = {v: k for k, v in DEVICE_TO_PB.items()}

LAYOUT_TO_PB = {
    torch.strided: pb.STRIDED,
    torch.sparse_coo: pb.SPARSE_COO,
    torch.sparse_csr: pb.SPARSE_CSR,
}
PB_TO_LAYOUT = {v: k for k, v in LAYOUT_TO_PB.items()}

MEMFMT_TO_PB = {
    torch.contiguous_format: pb.CONTIGUOUS_FORMAT,
    torch.channels_last: pb.CHANNELS_LAST,
    torch.channels_last_3d: pb.CHANNELS_LAST_3D,
    torch.preserve_format: pb.PRESERVE_FORMAT,
}
PB_TO_MEMFMT = {v: k for k, v in MEMFMT_TO_PB.items()}


def _err(msg: str) -> Exception:
    return TraceError(msg)


# --------------------------------------------------------------------------- encode


def target_of(fn: Any) -> tuple[str, str]:
    """(schema name, overload) for an FX call_function target."""
    if fn is operator.getitem:
        return "operator.getitem", ""
    if isinstance(fn, torch._ops.OpOverload):
        name = fn._schema.name  # "aten::addmm"
        overload = fn._overloadname
        return name, "" if overload == "default" else overload
    raise _err(
        f"op {fn!r} is not a dispatcher op (torch.ops.<ns>.<name>.<overload>) or operator.getitem"
    )


def _device_pb(dev: torch.device, out: "pb.Device", where: str) -> None:
    dev = torch.device(dev)
    if dev.type not in DEVICE_TO_PB:
        raise _err(f"{where}: device type '{dev.type}' is not representable in the wire format")
    out.type = DEVICE_TO_PB[dev.type]
    out.index = -1 if dev.index is None else dev.index


def encode_argument(
    a: Any,
    out: "pb.Argument",
    ref: Callable[[fx.Node], tuple[int, int]],
    where: str,
    sizes: "Optional[SizeWriter]" = None,
) -> None:
    if isinstance(a, SizeArg):
        if sizes is None:
            raise _err(f"{where}: a size computed from the batch's shape ({a}) in a static graph")
        out.int_value = a.hint
        out.size_expr = sizes.expr(a.expr, where)
    elif isinstance(a, fx.Node):
        n, k = ref(a)
        out.ref.node = n
        out.ref.output = k
    elif isinstance(a, bool):
        out.bool_value = a
    elif isinstance(a, int):
        out.int_value = a
    elif isinstance(a, float):
        out.float_value = a
    elif isinstance(a, complex):
        out.scalar.complex_value.real = a.real
        out.scalar.complex_value.imag = a.imag
    elif isinstance(a, str):
        out.string_value = a
    elif a is None:
        out.none.SetInParent()
    elif isinstance(a, torch.dtype):
        if a not in DTYPE_TO_PB:
            raise _err(f"{where}: dtype {a} is not representable in the wire format")
        out.dtype = DTYPE_TO_PB[a]
    elif isinstance(a, torch.device):
        _device_pb(a, out.device, where)
    elif isinstance(a, torch.layout):
        out.layout = LAYOUT_TO_PB[a]
    elif isinstance(a, torch.memory_format):
        out.memory_format = MEMFMT_TO_PB[a]
    elif isinstance(a, (list, tuple)):
        lst = out.list
        lst.SetInParent()
        for item in a:
            encode_argument(item, lst.items.add(), ref, where, sizes)
    elif isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        # never int(): that would specialise the symbol (fxdp.graph_passes.fold_sizes folds them)
        raise _err(f"{where}: symbolic value {a} was not folded into a size argument")
    else:
        raise _err(f"{where}: cannot encode argument {a!r} of type {type(a).__name__}")


def _value_meta(
    v: Any,
    out: "pb.ValueMeta",
    requires_grad: bool,
    where: str,
    device: Any = None,
    sizes: "Optional[SizeWriter]" = None,
) -> None:
    if isinstance(v, torch.Tensor):
        out.kind = pb.TENSOR
        t = out.tensor
        if sizes is not None:
            sizes.tensor(v, t, where)
        elif any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride(), v.storage_offset())):
            # never int() a SymInt: that specialises the symbol to the example's value
            raise _err(f"{where}: a tensor of symbolic shape {tuple(v.shape)} in a static graph")
        else:
            t.shape.extend(int(s) for s in v.shape)
            t.stride.extend(int(s) for s in v.stride())
            t.storage_offset = int(v.storage_offset())
        if v.dtype not in DTYPE_TO_PB:
            raise _err(f"{where}: dtype {v.dtype} is not representable in the wire format")
        t.dtype = DTYPE_TO_PB[v.dtype]
        _device_pb(device if device is not None else v.device, t.device, where)
        t.requires_grad = bool(requires_grad)
    elif v is None:
        out.kind = pb.NONE_VALUE
    elif isinstance(v, bool):
        out.kind = pb.BOOL_VALUE
    elif isinstance(v, int):
        out.kind = pb.INT_VALUE
    elif isinstance(v, float):
        out.kind = pb.FLOAT_VALUE
    else:
        raise _err(f"{where}: cannot describe value {v!r} of type {type(v).__name__}")


def _size_writer(gm: fx.GraphModule, shape_env) -> "Optional[SizeWriter]":
    if shape_env is None:
        return None
    inputs = [
        (i, n.meta["fxdp_placeholder"][1], n.meta["val"])
        for i, n in enumerate(gm.graph.nodes)
        if n.op == "placeholder" and n.meta.get("fxdp_placeholder", (None,))[0] == pb.INPUT
    ]
    return SizeWriter(shape_env, inputs)


def fx_to_graphdef(
    gm: fx.GraphModule, metadata: Sequence[tuple[str, str]] = (), shape_env=None
) -> "pb.GraphDef":
    """Encode an aten-level FX graph (with fxdp node metadata) as a GraphDef; a symbolic trace's
    (``shape_env``: its ShapeEnv) with its sizes' expressions, symbols and guards (fxdp.sizes)."""
    sizes = _size_writer(gm, shape_env)
    g = pb.GraphDef()
    g.format_version = pb.FORMAT_VERSION_1
    g.producer = PRODUCER
    g.torch_version = torch.__version__
    index: Dict[fx.Node, int] = {}

    def ref(n: fx.Node) -> tuple[int, int]:
        if n not in index:
            raise _err(f"node {n.name} is used before it is defined")
        return index[n], 0

    for node in gm.graph.nodes:
        where = f"node '{node.name}'"
        p = g.nodes.add()
        p.name = node.name
        if node.op == "placeholder":
            _encode_placeholder(node, p, where, sizes)
        elif node.op == "call_function":
            _encode_call(node, p, index, ref, where, sizes)
        elif node.op == "get_attr":
            p.kind = pb.GET_ATTR
            p.target.name = str(node.target)
            _value_meta(
                node.meta.get("val"), p.outputs.add(), False, where, node.meta.get("fxdp_device")
            )
        elif node.op == "output":
            _encode_output(node, p, ref, where)
        else:
            raise _err(f"{where}: unsupported FX node kind '{node.op}'")
        index[node] = len(g.nodes) - 1
    for k, v in metadata:
        kv = g.metadata.add()
        kv.key = k
        kv.value = v
    if sizes is not None:
        sizes.write(g)
    return g


def _encode_placeholder(node: fx.Node, p: "pb.Node", where: str, sizes) -> None:
    p.kind = pb.PLACEHOLDER
    p.target.name = str(node.target)
    spec = node.meta.get("fxdp_placeholder")
    if spec is None:
        raise _err(f"{where}: placeholder without an fxdp role")
    role, state_name, batch_dim = spec
    p.placeholder.role = role
    p.placeholder.state_name = state_name
    p.placeholder.batch_dim = batch_dim
    _value_meta(
        node.meta["val"],
        p.outputs.add(),
        node.meta.get("fxdp_requires_grad", False),
        where,
        node.meta.get("fxdp_device"),
        sizes,
    )


def _encode_call(
    node: fx.Node, p: "pb.Node", index: Dict[fx.Node, int], ref, where: str, sizes
) -> None:
    p.kind = pb.CALL_FUNCTION
    p.target.name, p.target.overload = target_of(node.target)
    if node.target is operator.getitem:
        src, i = node.args
        if not isinstance(src, fx.Node) or not isinstance(i, int):
            raise _err(f"{where}: getitem must take (node, int)")
        a = p.args.add()
        a.ref.node = index[src]
        a.ref.output = i
        p.args.add().int_value = i
    else:
        for a in node.args:
            encode_argument(a, p.args.add(), ref, where, sizes)
        for k, a in node.kwargs.items():
            kw = p.kwargs.add()
            kw.name = k
            encode_argument(a, kw.value, ref, where, sizes)
    val = node.meta.get("val")
    rg = node.meta.get("fxdp_requires_grad", False)
    dev = node.meta.get("fxdp_device")
    if isinstance(val, (tuple, list)):
        devs = dev if isinstance(dev, (tuple, list)) else [None] * len(val)
        for v, d in zip(val, devs):
            _value_meta(v, p.outputs.add(), rg, where, d, sizes)
    else:
        _value_meta(val, p.outputs.add(), rg, where, dev, sizes)
    if node.meta.get("fxdp_grad_of"):
        p.grad_of = node.meta["fxdp_grad_of"]
    source = node_source(node)
    if source:
        p.source = source


def _encode_output(node: fx.Node, p: "pb.Node", ref, where: str) -> None:
    p.kind = pb.OUTPUT
    p.target.name = str(node.target)
    (ret,) = node.args
    if not isinstance(ret, (list, tuple)):
        ret = [ret]
    encode_argument(list(ret), p.args.add(), ref, where)
    specs = node.meta.get("fxdp_output_specs")
    if specs is None or len(specs) != len(ret):
        raise _err(f"{where}: output specs missing or of the wrong length")
    for role, name in specs:
        s = p.output_specs.add()
        s.role = role
        s.state_name = name


# --------------------------------------------------------------------------- decode


def resolve_target(name: str, overload: str) -> Any:
    """The Python callable for a wire target: ``torch.ops.<ns>.<name>.<overload>`` or getitem."""
    if name == "operator.getitem":
        return operator.getitem
    if "::" not in name:
        raise GraphFormatError(f"target '{name}' is not a schema name 'ns::op'")
    ns, op = name.split("::", 1)
    try:
        packet = getattr(getattr(torch.ops, ns), op)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError) as e:
        raise GraphFormatError(f"unknown op {name}.{overload or 'default'}: {e}") from None


def returns_sequence(fn: Any) -> bool:
    """True when the op returns a tuple or a Tensor[] (its elements are taken apart by getitem)."""
    if fn is operator.getitem or not isinstance(fn, torch._ops.OpOverload):
        return False
    rets = fn._schema.returns
    if len(rets) != 1:
        return len(rets) > 1
    return isinstance(rets[0].type, torch.ListType)


def meta_from_pb(vm: "pb.ValueMeta") -> Any:
    """A meta-device tensor (or python placeholder value) describing a ValueMeta."""
    if vm.kind == pb.TENSOR:
        t = vm.tensor
        return torch.empty_strided(
            list(t.shape), list(t.stride), dtype=PB_TO_DTYPE[t.dtype], device="meta"
        )
    return None


class _Decoder:
    """Arguments of a GraphDef as FX values: references to earlier nodes, an inserted getitem
    per element taken from a node returning a tuple/Tensor[]."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self.env: List[fx.Node] = []
        self.seq: List[bool] = []
        self.extracted: Dict[tuple[int, int], fx.Node] = {}

    def value(self, r: "pb.ValueRef", where: str) -> fx.Node:
        env = self.env
        if r.node >= len(env):
            raise GraphFormatError(
                f"{where}: reference to node {r.node} which is not earlier in the graph"
            )
        if not self.seq[r.node]:
            if r.output != 0:
                raise GraphFormatError(
                    f"{where}: output {r.output} of single-output node {env[r.node].name}"
                )
            return env[r.node]
        key = (r.node, r.output)
        if key not in self.extracted:
            self.extracted[key] = self.graph.call_function(
                operator.getitem, (env[r.node], r.output)
            )
        return self.extracted[key]

    def argument(self, a: "pb.Argument", where: str) -> Any:
        which = a.WhichOneof("value")
        if which == "ref":
            return self.value(a.ref, where)
        if which in ("int_value", "float_value", "bool_value", "string_value"):
            return getattr(a, which)
        if which == "none":
            return None
        if which == "dtype":
            return PB_TO_DTYPE[a.dtype]
        if which == "device":
            t = PB_TO_DEVICE[a.device.type]
            return torch.device(t) if a.device.index < 0 else torch.device(t, a.device.index)
        if which == "layout":
            return PB_TO_LAYOUT[a.layout]
        if which == "memory_format":
            return PB_TO_MEMFMT[a.memory_format]
        if which == "scalar":
            s = a.scalar
            w = s.WhichOneof("value")
            if w == "complex_value":
                return complex(s.complex_value.real, s.complex_value.imag)
            return getattr(s, w)
        if which == "list":
            return [self.argument(x, where) for x in a.list.items]
        raise GraphFormatError(f"{where}: empty argument")

    def call(self, n: "pb.Node", where: str) -> tuple[fx.Node, bool]:
        """The FX node of a CALL_FUNCTION node, and whether it returns a sequence."""
        fn = resolve_target(n.target.name, n.target.overload)
        if fn is not operator.getitem:
            args = tuple(self.argument(a, where) for a in n.args)
            kwargs = {kw.name: self.argument(kw.value, where) for kw in n.kwargs}
            return self.graph.call_function(fn, args, kwargs), returns_sequence(fn)
        if len(n.args) < 1 or n.args[0].WhichOneof("value") != "ref":
            raise GraphFormatError(f"{where}: getitem needs a reference argument")
        r = n.args[0].ref
        if r.node >= len(self.env):
            raise GraphFormatError(f"{where}: reference to node {r.node} which is not earlier")
        return self.graph.call_function(operator.getitem, (self.env[r.node], r.output)), False


def graphdef_to_fx(
    g: "pb.GraphDef", attrs: Optional[Dict[str, torch.Tensor]] = None
) -> fx.GraphModule:
    """Build a runnable GraphModule from a GraphDef.

    Placeholders keep GraphDef order. A reference to element i of a node returning a
    tuple/Tensor[] from anything but ``operator.getitem`` gets an inserted getitem node.
    ``attrs`` supplies the tensors of GET_ATTR nodes, if any.
    """
    graph = fx.Graph()
    root = torch.nn.Module()
    dec = _Decoder(graph)
    for i, n in enumerate(g.nodes):
        where = f"node {i} '{n.name}'"
        is_seq = False
        if n.kind == pb.PLACEHOLDER:
            node = graph.placeholder(n.name)
        elif n.kind == pb.GET_ATTR:
            if attrs is None or n.target.name not in attrs:
                raise GraphFormatError(f"{where}: GET_ATTR '{n.target.name}' has no value")
            qual = n.target.name.replace(".", "_")
            setattr(root, qual, attrs[n.target.name])
            node = graph.get_attr(qual)
        elif n.kind == pb.CALL_FUNCTION:
            node, is_seq = dec.call(n, where)
        elif n.kind == pb.OUTPUT:
            if len(n.args) != 1:
                raise GraphFormatError(f"{where}: OUTPUT takes exactly one (list) argument")
            node = graph.output(dec.argument(n.args[0], where))
            node.meta["fxdp_output_specs"] = [(s.role, s.state_name) for s in n.output_specs]
        else:
            raise GraphFormatError(f"{where}: unknown node kind {n.kind}")
        _set_meta(node, n, is_seq)
        dec.env.append(node)
        dec.seq.append(is_seq)
    graph.lint()
    return fx.GraphModule(root, graph)


def _set_meta(node: fx.Node, n: "pb.Node", is_seq: bool) -> None:
    """The fxdp metadata of wire node ``n`` on its FX node (what fx_to_graphdef reads back)."""
    if n.kind == pb.PLACEHOLDER:
        ph = n.placeholder
        node.meta["fxdp_placeholder"] = (ph.role, ph.state_name, ph.batch_dim)
    node.meta["fxdp_name"] = n.name  # torch.fx may name it otherwise
    if n.grad_of:
        node.meta["fxdp_grad_of"] = n.grad_of
    if n.source:
        node.meta["stack_trace"] = n.source
    if len(n.outputs) == 1 and not is_seq:
        node.meta["fxdp_value_meta"] = n.outputs[0]
