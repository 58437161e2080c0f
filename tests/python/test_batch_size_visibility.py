"""The batch size appears only where the trace put it, in places the analyzer can see.

Tracing the same step at global batch B and at B/2 must give structurally identical graphs
whose only differences are plain numbers (int/float arguments, tensor shapes and strides) that
scale with the batch (ratio 2 or 1/2). A batch-dependent value hidden in a lifted tensor
constant, a string, or a different graph structure would be a global-batch assumption the
BatchDimAnalyzer and the expansion could not rewrite.
"""

import fxdp
import pytest
import torch
from fxdp import zoo
from fxdp.v1 import graph_pb2 as pb


def _half_batch(entry, batch):
    dims = (
        entry.batch_dim
        if isinstance(entry.batch_dim, (list, tuple))
        else [entry.batch_dim] * len(batch)
    )
    # A rank receives its shard as a contiguous tensor, as a real input would be.
    return tuple(t.narrow(d, 0, t.shape[d] // 2).contiguous() for t, d in zip(batch, dims))


def _trace(entry, batch):
    model = entry.model(0)
    opt = zoo.make_optimizer("adamw", model)
    return fxdp.trace(model, opt, entry.loss_fn, batch, batch_dim=entry.batch_dim)


def _scales(a: float, b: float) -> bool:
    return b != 0 and abs(a / b - 2.0) < 1e-9 or a != 0 and abs(b / a - 2.0) < 1e-9


def _diff_args(path, a: pb.Argument, b: pb.Argument, out):
    kind = a.WhichOneof("value")
    assert kind == b.WhichOneof("value"), f"{path}: argument kind {kind} vs {b.WhichOneof('value')}"
    if kind == "list":
        assert len(a.list.items) == len(b.list.items), f"{path}: list length differs"
        for i, (x, y) in enumerate(zip(a.list.items, b.list.items)):
            _diff_args(f"{path}[{i}]", x, y, out)
    elif a != b:
        assert kind in (
            "int_value",
            "float_value",
        ), f"{path}: a {kind} argument depends on the batch"
        out.append((path, getattr(a, kind), getattr(b, kind)))


@pytest.mark.parametrize("model", sorted(zoo.MODELS))
def test_batch_size_only_in_visible_numbers(model):
    entry = zoo.get(model)
    full = entry.batch(0)
    g_full = _trace(entry, full).graph
    half = _trace(entry, _half_batch(entry, full))
    g_half = half.graph
    assert [(n.name, n.kind, n.target.name, n.target.overload) for n in g_full.nodes] == [
        (n.name, n.kind, n.target.name, n.target.overload) for n in g_half.nodes
    ], "graph structure depends on the batch size"

    diffs = []
    for nf, nh in zip(g_full.nodes, g_half.nodes):
        assert len(nf.args) == len(nh.args) and [k.name for k in nf.kwargs] == [
            k.name for k in nh.kwargs
        ]
        for i, (x, y) in enumerate(zip(nf.args, nh.args)):
            _diff_args(f"{nf.name}.args[{i}]", x, y, diffs)
        for kf, kh in zip(nf.kwargs, nh.kwargs):
            _diff_args(f"{nf.name}.{kf.name}", kf.value, kh.value, diffs)
        for of, oh in zip(nf.outputs, nh.outputs):
            for k, (s, t) in enumerate(zip(of.tensor.shape, oh.tensor.shape)):
                if s != t:
                    diffs.append((f"{nf.name}.shape[{k}]", s, t))
        assert nf.placeholder == nh.placeholder and list(nf.output_specs) == list(nh.output_specs)
        assert nf.grad_of == nh.grad_of

    assert diffs, "halving the batch changed nothing: the trace did not see the batch"
    bad = [d for d in diffs if not _scales(d[1], d[2])]
    assert not bad, f"batch-dependent numbers that do not scale with the batch: {bad[:5]}"
    # Lifted constants never depend on the batch.
    full_state = _trace(entry, full).initial_state()
    for name, value in half.initial_state().items():
        if name.startswith("const."):
            assert torch.equal(value, full_state[name]), name
