"""Data-parallel expansion checked with PyTorch as the oracle.

For zoo models, ``fxdp expand`` rewrites the traced step for N ranks; N real processes
(python -m fxdp.dp_oracle) load the expanded graph back into torch.fx and run 3 steps under a Gloo process
group, each on its own slice of every global batch (torch's ``_c10d_functional`` collectives do
the all-reduces). Parameters and optimizer state must equal single-device training on the
global batch, and all ranks must agree bit for bit. (Adam at N=3 and N=4 is left out
here: per-rank sums and the 1/3 or B_r/B scaling round differently from one mean over B, and Adam's normalisation
amplifies that on near-zero gradients to ~2e-5 relative on single elements.) The cnn model is left out: its BatchNorm
uses local batch statistics by design (docs/architecture.md), so it matches DDP, not one device.
"""

from __future__ import annotations

import json
import os
import subprocess

import fxdp
import pytest
import torch
from _util import ATOL, RTOL, run_dp_oracle, target_str, traced
from fxdp import zoo
from fxdp.v1 import graph_pb2 as pb

HERE = os.path.dirname(os.path.abspath(__file__))
FXDP = os.environ.get("FXDP_BIN", os.path.join(HERE, "..", "..", "build", "bin", "fxdp"))
STEPS = 3


def expand(graph: str, out: str, world: int, *extra: str) -> dict:
    r = subprocess.run(
        [FXDP, "expand", graph, "--world-size", str(world), "-o", out, "--json", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


CASES = [
    ("mlp", "adamw", 2, ()),
    ("mlp", "sgd", 5, ()),  # B=12: uneven 3,3,2,2,2
    ("transformer", "sgd", 4, ()),  # B=6: uneven 2,2,1,1
    ("transformer", "adam", 2, ()),
    ("seqfirst", "sgd", 3, ()),  # batch_dim 1, folded into [T*B] by linear
    ("transformer", "sgd", 2, ("--first-bucket-mb", "0.002", "--bucket-mb", "0.004")),
    # the last bucket split into 1, 2, 4, ... KiB pieces; DDP's order (no overlap schedule)
    (
        "transformer",
        "adamw",
        2,
        ("--first-bucket-mb", "0.01", "--bucket-mb", "0.1", "--last-bucket-mb", "0.001"),
    ),
    ("mlp", "adamw", 3, ("--no-overlap",)),
]


def check_against_one_device(
    tmp_path, step, batches, world, extra=(), rtol=RTOL, atol=ATOL, reductions=0
):
    """Expand `step` for `world` ranks, run it on real Gloo processes, compare with one device.
    `reductions`: all-reduces of partial values in the step besides the buckets, the loss and
    cross-entropy's counts."""
    graph, state, data = (str(tmp_path / f) for f in ("g.pb", "s.safetensors", "d.pt"))
    step.save(graph)
    step.to_safetensors(state)
    torch.save(batches, data)
    report = expand(graph, str(tmp_path / "x.pb"), world, *extra)
    # + the loss, + the count of targets of each cross-entropy mean (fxdp.decompositions)
    counts = sum(target_str(n) == "aten::nll_loss_forward" for n in step.graph.nodes)
    assert len(report["collectives"]) == len(report["buckets"]) + 1 + counts + reductions
    # x.pb, or x.rank<r>.pb per rank (an uneven split, or a replicated value sliced per rank)
    paths = [next(f["path"] for f in report["files"] if r in f["ranks"]) for r in range(world)]
    results = run_dp_oracle(paths, state, data, tmp_path)

    ref = step.initial_state()
    ref_losses = []
    for i, b in enumerate(batches):  # step i + 1: the key of its random draws, as the ranks'
        ref, loss = step.run_local(ref, b, step=i + 1)
        ref_losses.append(loss)
    for name, want in ref.items():
        got = results[0]["state"][name]
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
        for r in range(1, world):
            assert torch.equal(results[r]["state"][name], got), f"rank {r} differs on {name}"
    torch.testing.assert_close(
        torch.stack(results[0]["losses"]), torch.stack(ref_losses), rtol=rtol, atol=atol
    )
    assert len(results[0]["local_losses"]) == STEPS
    return report


@pytest.mark.parametrize(
    "model,optim,world,extra",
    CASES,
    ids=[f"{m}-{o}-N{n}{'-buckets' if e else ''}" for m, o, n, e in CASES],
)
def test_expanded_graph_trains_like_one_device(tmp_path, model, optim, world, extra):
    entry = zoo.get(model)
    report = check_against_one_device(
        tmp_path, traced(model, optim), [entry.batch(i) for i in range(STEPS)], world, extra
    )
    if "--bucket-mb" in extra:
        assert len(report["buckets"]) > 2


def test_sum_reduced_loss_with_uneven_split(tmp_path):
    """Loss reduced by sum, B=10 over 4 ranks (3,3,2,2): gradients are P(sum), weight 1."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(5)
    batches = [
        (torch.randn(10, 8, generator=g), torch.randn(10, 3, generator=g)) for _ in range(STEPS)
    ]
    step = fxdp.trace(model, opt, lambda out, y: ((out - y) ** 2).sum(), batches[0])
    report = check_against_one_device(tmp_path, step, batches, 4)
    assert [s["size"] for s in report["slices"]] == [3, 3, 2, 2]
    assert {b["op"] for b in report["buckets"]} == {"sum"}


def test_batchnorm_model_trains_like_ddp(tmp_path):
    """cnn has BatchNorm: each rank normalises with its local batch statistics, as DDP does.
    Its parameters must equal PyTorch DDP's on the same shards; ranks agree bit for bit,
    running statistics included (fxdp averages them over ranks every step)."""
    model, optim, world = "cnn", "sgd", 2
    step = traced(model, optim)
    graph, state, data = (str(tmp_path / f) for f in ("g.pb", "s.safetensors", "d.pt"))
    step.save(graph)
    step.to_safetensors(state)
    torch.save([zoo.get(model).batch(i) for i in range(STEPS)], data)
    report = expand(graph, str(tmp_path / "x.pb"), world)
    assert any("bn.running_mean" in n for n in report["notes"])
    results = run_dp_oracle([str(tmp_path / "x.pb")] * world, state, data, tmp_path, model, optim)
    for name, want in results[0]["ddp"].items():
        torch.testing.assert_close(
            results[0]["state"][name], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{name}: {m}"
        )
    for name, got in results[0]["state"].items():
        assert torch.equal(results[1]["state"][name], got), f"rank 1 differs on {name}"


def test_expand_report_and_errors(tmp_path):
    step = traced("mlp", "sgd")
    graph = str(tmp_path / "g.pb")
    step.save(graph)
    rep = expand(graph, str(tmp_path / "x.pb"), 4)
    assert [s["size"] for s in rep["slices"]] == [3, 3, 3, 3]
    assert rep["bytes_per_step"] == sum(c["bytes"] for c in rep["collectives"])
    assert {c["op"] for c in rep["collectives"]} == {"all_reduce"}
    assert rep["bytes_gathered_per_step"] == 0 and rep["bytes_reduce_scattered_per_step"] == 0
    b0 = rep["buckets"][0]
    assert b0["op"] == "avg" and b0["start_position"] < b0["wait_position"]
    # Every gradient is in exactly one bucket.
    grads = [g for b in rep["buckets"] for g in b["gradients"]]
    n_params = sum(p.placeholder.role == pb.PARAMETER for p in step.placeholders)
    assert sorted(grads) == sorted(set(grads)) and len(grads) == n_params
    # No global batch size left in any size list of the expanded graph (B=12 -> 3).
    text = subprocess.run(
        [FXDP, "graph", "print", str(tmp_path / "x.pb")], capture_output=True, text=True, check=True
    ).stdout
    for line in text.splitlines():
        if "aten::view(" in line or "aten::_unsafe_view(" in line or "aten::expand(" in line:
            assert "[12," not in line and ", 12]" not in line, line

    r = subprocess.run(
        [FXDP, "expand", graph, "--world-size", "13", "-o", str(tmp_path / "y.pb")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1 and "larger than the batch (12 samples)" in r.stderr
    r = subprocess.run(
        [FXDP, "expand", graph, "-o", str(tmp_path / "y.pb")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "missing --world-size" in r.stderr


def test_group_norm_batch_size_argument_is_localised(tmp_path):
    """native_group_norm(input, w, b, N, C, HxW, group, eps) spells the batch size N as an int:
    the expansion rewrites it per rank (B=6 over 4 ranks: 2,2,1,1), or the kernel would fail."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.GroupNorm(2, 4),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 3),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(7)
    batches = [
        (torch.randn(6, 3, 6, 6, generator=g), torch.randn(6, 3, generator=g)) for _ in range(STEPS)
    ]
    step = fxdp.trace(model, opt, torch.nn.functional.mse_loss, batches[0])
    targets = {n.target.name for n in step.graph.nodes}
    assert "aten::native_group_norm" in targets and "aten::native_group_norm_backward" in targets
    report = check_against_one_device(tmp_path, step, batches, 4)
    assert [s["size"] for s in report["slices"]] == [2, 2, 1, 1]


def check_every_op_has_a_rule_and_one_device(tmp_path, step, batches):
    """`step` analyzes without a warning (no op falls back to size matching), and expanded for 4
    ranks (B=6: 2,2,1,1) it trains like one device."""
    graph = str(tmp_path / "g.pb")
    step.save(graph)
    r = subprocess.run(
        [FXDP, "analyze", graph, "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(r.stdout)["warnings"] == []
    (tmp_path / "run").mkdir()
    report = check_against_one_device(tmp_path / "run", step, batches, 4)
    assert [s["size"] for s in report["slices"]] == [2, 2, 1, 1]


class _SdpaBlock(torch.nn.Module):
    """Causal self-attention through F.scaled_dot_product_attention (one fused aten kernel)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 4)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, 16)).mean(1)


def test_fused_attention_kernel(tmp_path):
    """_scaled_dot_product_flash_attention_for_cpu and its backward have rules (no fallback);
    B=6 over 4 ranks (2,2,1,1) equals one device."""
    torch.manual_seed(0)
    model = _SdpaBlock()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(11)
    batches = [
        (torch.randn(6, 5, 16, generator=g), torch.randn(6, 4, generator=g)) for _ in range(STEPS)
    ]
    step = fxdp.trace(model, opt, torch.nn.functional.mse_loss, batches[0])
    check_every_op_has_a_rule_and_one_device(tmp_path, step, batches)


def test_prelu_model(tmp_path):
    """PReLU's kernels (_prelu_kernel and its backward, pointwise rows of op_rules.cc) have rules
    (no size-matching fallback): its weight per channel after a conv and shared after a linear,
    B=6 over 4 ranks (2,2,1,1), equals one device."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.PReLU(4),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 4 * 4, 3),
        torch.nn.PReLU(),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(7)
    batches = [
        (torch.randn(6, 3, 6, 6, generator=g), torch.randn(6, 3, generator=g)) for _ in range(STEPS)
    ]
    step = fxdp.trace(model, opt, torch.nn.functional.mse_loss, batches[0])
    assert {"aten::_prelu_kernel", "aten::_prelu_kernel_backward"} <= {
        n.target.name for n in step.graph.nodes
    }
    check_every_op_has_a_rule_and_one_device(tmp_path, step, batches)


class _RnnClassifier(torch.nn.Module):
    """The text-classification tutorial's shape: embedding, a batch-first RNN, the last step's state."""

    def __init__(self, cell):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.rnn = cell(8, 16, num_layers=2, batch_first=True)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.out(h[:, -1])


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU], ids=["lstm", "gru"])
def test_rnn_classifier_traces_on_cpu_and_trains_like_one_device(tmp_path, cell):
    """nn.LSTM on CPU records oneDNN's mkldnn_rnn_layer_backward, whose workspace make_fx leaves
    undefined: the tracer turns oneDNN off, so LSTM (and GRU) trace to plain aten ops; every op has
    a rule, and B=6 over 2 ranks, then 4 (2,2,1,1), equals one device."""
    torch.manual_seed(0)
    model = _RnnClassifier(cell)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(3)
    batches = [
        (torch.randint(0, 20, (6, 5), generator=g), torch.randint(0, 3, (6,), generator=g))
        for _ in range(STEPS)
    ]
    step = fxdp.trace(model, opt, torch.nn.functional.cross_entropy, batches[0])
    assert not any("mkldnn" in n.target.name for n in step.graph.nodes)
    (tmp_path / "n2").mkdir()
    check_against_one_device(tmp_path / "n2", step, batches, 2)
    check_every_op_has_a_rule_and_one_device(tmp_path, step, batches)


def test_lstm_classifier_on_three_uneven_ranks_with_adamw(tmp_path):
    """Issue 23's Done-means for the LSTM classifier: N=3 with B=7 (3,2,2) under AdamW (rtol
    1e-4/atol 5e-5) equals one device too."""
    torch.manual_seed(0)
    model = _RnnClassifier(torch.nn.LSTM)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(4)
    batches = [
        (torch.randint(0, 20, (7, 5), generator=g), torch.randint(0, 3, (7,), generator=g))
        for _ in range(STEPS)
    ]
    step = fxdp.trace(model, opt, torch.nn.functional.cross_entropy, batches[0])
    check_against_one_device(tmp_path, step, batches, 3, rtol=1e-4, atol=5e-5)


class _SumPlusOne(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


def _sum_plus_one_loss(out, _):
    t = out.sum(0) + 1.0  # a sum over the batch, then a number added: once, not once per rank
    return (t * t).sum()


@pytest.mark.parametrize("world", [2, 3])
def test_a_number_added_to_a_sum_over_the_batch_is_added_once(tmp_path, world):
    """x.sum(0) + 1.0 is partial on each rank; the 1.0 is added on every rank, so the sum of the
    ranks' values was x.sum(0) + N and the weights trained differently from one device (the
    analysis took a number argument of an additive op for 0). Now the partial sum is all-reduced
    first (one reduction, and the loss whole)."""
    torch.manual_seed(0)
    model = _SumPlusOne()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(7, 3, generator=g), torch.zeros(7, 2)) for _ in range(STEPS)]
    step = fxdp.trace(model, opt, _sum_plus_one_loss, batches[0])
    check_against_one_device(tmp_path, step, batches, world)  # the sum, not the loss, is reduced
