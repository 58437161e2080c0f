"""`fxdp analyze` on small models built to defeat size matching: hidden width == feature count ==
batch size, a batch folded into another dim and split back, sequence length == batch size with the
batch on dim 1, and losses reduced by sum. Where the batch really is comes from tracing the same
step again at half the batch (_analyze_oracle.py); the zoo models and bad input: test_analyze.py.
"""

from __future__ import annotations

import pathlib
import re
from typing import Dict, Tuple

import fxdp
import pytest
import torch
import torch.nn as nn
from _analyze_oracle import (
    Analysed,
    analyze_json,
    assert_batch_dims_follow_provenance,
    assert_step_semantics,
    batch_dims_by_shape,
    save,
)
from _util import target_str
from fxdp.v1 import graph_pb2 as pb

# --------------------------------------------------------------------------- size-matching traps


class SquareMLP(nn.Module):
    """Input features == hidden width == output width == batch size: every activation is (B, B)."""

    def __init__(self, n: int = 8):
        super().__init__()
        self.fc1 = nn.Linear(n, n)
        self.fc2 = nn.Linear(n, n)

    def forward(self, x):
        h = torch.relu(self.fc1(x))  # (B, n): batch on dim 0
        h = h.t() * 2.0  # (n, B): batch on dim 1
        return self.fc2(h.t())


class FoldBatch(nn.Module):
    """(B, T, F) -> (B*T, F) -> Linear -> (B, T, H) -> mean over T -> Linear, with B == T == F."""

    def __init__(self, f: int = 4, h: int = 6, o: int = 4):
        super().__init__()
        self.inner = nn.Linear(f, h)
        self.head = nn.Linear(h, o)

    def forward(self, x):
        b, t, f = x.shape
        y = torch.tanh(self.inner(x.reshape(b * t, f)))  # (B*T, H)
        return self.head(y.reshape(b, t, -1).mean(dim=1))  # (B, T, H) -> (B, H) -> (B, O)


class SeqFirstMean(nn.Module):
    """Input (S, B, F) with S == B == F, batch on dim 1; mean over the sequence (dim 0)."""

    def __init__(self, f: int = 6, d: int = 5, o: int = 3):
        super().__init__()
        self.inp = nn.Linear(f, d)
        self.out = nn.Linear(d, o)

    def forward(self, x):
        return self.out(torch.tanh(self.inp(x)).mean(dim=0))  # (S, B, D) -> (B, D) -> (B, O)


def _narrow(batch, dims):
    return tuple(t.narrow(d, 0, t.shape[d] // 2).contiguous() for t, d in zip(batch, dims))


def trace_trap(
    make_model, make_opt, loss_fn, batch, batch_dims, **kw
) -> Tuple[fxdp.TracedStep, Dict]:
    """Trace the step at the given batch and at half of it; returns the step and the oracle."""

    def one(b):
        torch.manual_seed(0)
        model = make_model()
        return fxdp.trace(model, make_opt(model), loss_fn, b, batch_dim=list(batch_dims), **kw)

    step = one(batch)
    return step, batch_dims_by_shape(step.graph, one(_narrow(batch, batch_dims)).graph)


@pytest.fixture(scope="module")
def trap_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("traps")


def _gen():
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="module")
def square_mlp(trap_dir):
    g = _gen()
    batch = (torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g))
    step, oracle = trace_trap(
        SquareMLP,
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        nn.MSELoss(),
        batch,
        (0, 0),
        input_names=("x", "y"),
    )
    return Analysed(step.graph, analyze_json(save(step, trap_dir, "square_mlp"))), oracle


def test_square_mlp_step_semantics(square_mlp):
    a, _ = square_mlp
    assert_step_semantics(a, "avg", 8)


def test_square_mlp_batch_dims_follow_provenance(square_mlp):
    a, oracle = square_mlp
    assert assert_batch_dims_follow_provenance(a, oracle) > 10
    # Spelled out for the forward: fc1's (8, 8) output is S(0); its transpose S(1), not S(0).
    fwd = [n for n in a.g.nodes if n.kind == pb.CALL_FUNCTION and target_str(n) == "aten::relu"]
    assert len(fwd) == 1
    relu = fwd[0]
    assert a.json[relu.name]["placement"] == "S(0)", a.describe(relu.name)
    i = a.index[relu.name]
    users = [
        n
        for n in a.g.nodes
        if any(x.WhichOneof("value") == "ref" and x.ref.node == i for x in n.args)
    ]
    transposed = [n for n in users if target_str(n) == "aten::t"]
    assert transposed, [target_str(n) for n in users]
    for n in transposed:
        assert a.json[n.name]["placement"] == "S(1)", a.describe(n.name)
        assert a.json[n.name]["batch_dim"] == 1, a.describe(n.name)
    # every (8, 8) weight and weight-derived value stays R: fc1.weight's transpose is one of them
    w = a.index[next(n.name for n in a.g.nodes if n.placeholder.state_name == "fc1.weight")]
    wt = [
        n
        for n in a.g.nodes
        if target_str(n) == "aten::t" and n.args[0].ref.node == w and not n.grad_of
    ]
    assert wt and all(a.json[n.name]["placement"] == "R" for n in wt), [
        a.describe(n.name) for n in wt
    ]


@pytest.fixture(scope="module")
def fold_batch(trap_dir):
    g = _gen()
    batch = (torch.randn(4, 4, 4, generator=g), torch.randn(4, 4, generator=g))
    step, oracle = trace_trap(
        FoldBatch, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2), nn.MSELoss(), batch, (0, 0)
    )
    return Analysed(step.graph, analyze_json(save(step, trap_dir, "fold_batch"))), oracle


def test_fold_batch_step_semantics(fold_batch):
    a, _ = fold_batch
    assert_step_semantics(a, "avg", 4)


def test_fold_batch_dims_follow_provenance(fold_batch):
    a, oracle = fold_batch
    assert assert_batch_dims_follow_provenance(a, oracle) > 10
    # the folded (B*T, .) values and the split-back (B, T, H) values are all sharded on dim 0
    shapes = {"folded": [], "split": [], "mean": []}
    for n in a.g.nodes:
        if n.kind != pb.CALL_FUNCTION or len(n.outputs) != 1:
            continue
        s = list(n.outputs[0].tensor.shape)
        if s in ([16, 4], [16, 6]):
            shapes["folded"].append(n.name)
        elif s == [4, 4, 6]:
            shapes["split"].append(n.name)
        elif s == [4, 6] and target_str(n) == "aten::mean.dim":
            shapes["mean"].append(n.name)
    assert all(shapes.values()), shapes
    for kind, names in shapes.items():
        for name in names:
            assert a.json[name]["placement"] == "S(0)", f"{kind}: {a.describe(name)}"


def _sq_err(out, y):
    return (out - y) ** 2


SUM_LOSSES = {
    # name: (loss_fn, loss_reduction passed to trace, the loss's reduce op, the gradients' reduce op)
    "mse_sum": (nn.MSELoss(reduction="sum"), None, "sum", "sum"),
    "pow_sum": (lambda out, y: _sq_err(out, y).sum(), "sum", "sum", "sum"),
    # a mean over the features, then a sum over the batch: a sum loss (features == batch size)
    "mean_features_sum_batch": (
        lambda out, y: _sq_err(out, y).mean(dim=1).sum(),
        "sum",
        "sum",
        "sum",
    ),
    # a sum over the features, then aten::mean over the batch: a mean loss, P(avg) (the local mean
    # divides by the local batch). Its backward divides by the literal B (expand, div.Scalar(B)),
    # which the per-rank graph keeps: each rank's gradient is (1/B) * its rows' sum, a P(sum).
    "sum_features_mean_batch": (
        lambda out, y: _sq_err(out, y).sum(dim=1).mean(),
        None,
        "avg",
        "sum",
    ),
    # the reduction only the graph tells: trace() records its default ("mean") in the metadata
    "pow_sum_unannotated": (lambda out, y: _sq_err(out, y).sum(), None, "sum", "sum"),
}


@pytest.mark.parametrize("case", list(SUM_LOSSES))
def test_loss_reduction(trap_dir, case):
    loss_fn, reduction, op, grad_op = SUM_LOSSES[case]
    g = _gen()
    batch = (torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g))
    step, oracle = trace_trap(
        SquareMLP,
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
        loss_fn,
        batch,
        (0, 0),
        loss_reduction=reduction,
    )
    a = Analysed(step.graph, analyze_json(save(step, trap_dir, f"loss_{case}")))
    assert_step_semantics(a, op, 8, grad_reduce=grad_op)
    assert assert_batch_dims_follow_provenance(a, oracle) > 10
    kinds = {m for n in a.g.nodes for m in re.findall(r"P\((\w+)\)", a.json[n.name]["placement"])}
    assert kinds == {op, grad_op}, f"partial values of kinds {kinds}"


@pytest.fixture(scope="module")
def seq_first(trap_dir):
    g = _gen()
    batch = (
        torch.randn(6, 6, 6, generator=g),
        torch.randn(6, 3, generator=g),
    )  # x (S, B, F), target (B, O)
    step, oracle = trace_trap(
        SeqFirstMean,
        lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
        nn.MSELoss(),
        batch,
        (1, 0),
        input_names=("x", "target"),
    )
    return Analysed(step.graph, analyze_json(save(step, trap_dir, "seq_first"))), oracle


def test_seq_first_step_semantics(seq_first):
    a, _ = seq_first
    assert_step_semantics(a, "avg", 6)
    x = next(n for n in a.g.nodes if n.placeholder.state_name == "x")
    assert a.json[x.name]["placement"] == "S(1)", a.describe(x.name)


def test_seq_first_dims_follow_provenance(seq_first):
    a, oracle = seq_first
    assert assert_batch_dims_follow_provenance(a, oracle) > 5
    # the mean over the sequence (dim 0 of a (6, 6, 5) value) keeps the batch: S(1) -> S(0)
    means = [n for n in a.g.nodes if target_str(n) == "aten::mean.dim"]
    assert len(means) == 1
    assert a.json[means[0].name]["placement"] == "S(0)", a.describe(means[0].name)
