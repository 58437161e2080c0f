"""Never guess (issue 23): an op without a batch-dim rule is refused on the compile path (``fxdp
expand``, the server's Expand, ``Client.train``) with INVALID_ARGUMENT naming the node, the op, the
user's line and the rule-table row to add, while ``fxdp analyze`` shows the size-matching guess
labelled as one; every traced node records the user's line (``Node.source``) and compile errors quote
it."""

from __future__ import annotations

import inspect
import json
import subprocess

import fxdp
import grpc
import pytest
import torch
import torch.nn as nn
from _util import fxdp_binary, idle_client
from fxdp.v1 import graph_pb2 as pb

B = 6


class CumModel(nn.Module):
    """logcumsumexp has no batch-dim rule (pick another op without one if it ever gets a rule)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)

    def forward(self, x):
        h = self.fc(x)
        return torch.logcumsumexp(h, dim=1)


class BatchSoftmax(nn.Module):
    """A softmax across the batch: its backward (_softmax_backward_data) records the forward's
    line as "backward of ..." (exact on N ranks since issue 23's B_r/B rescaling)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)

    def forward(self, x):
        h = self.fc(x)
        return h.softmax(dim=0)


class BatchProduct(nn.Module):
    """Samples mixed by a product of two batch-sharded operands under a mean-reduced loss: the
    backward adds a gradient scaled by each rank's own mean (B/B_r times its rows) to one at true
    scale; each rank reads the scaled one times B_r/B for that sum (issue 23; it was refused)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)

    def forward(self, x):
        h = self.fc(x)
        return (h @ h.T) @ h


class BatchMax(nn.Module):
    """A max over the batch: no sum or mean of per-rank results, refused at compile time."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)

    def forward(self, x):
        h = self.fc(x)
        return h - h.amax(dim=0)


def line_of(cls, needle: str) -> int:
    lines, first = inspect.getsourcelines(cls.forward)
    return first + next(i for i, s in enumerate(lines) if needle in s)


def traced(model: nn.Module, reduction: str = "mean") -> fxdp.TracedStep:
    torch.manual_seed(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = (torch.randn(B, 5), torch.randn(B, 4))
    return fxdp.trace(model, opt, nn.MSELoss(reduction=reduction), batch)


def line_of_traced() -> int:
    lines, first = inspect.getsourcelines(traced)
    return first + next(i for i, s in enumerate(lines) if "fxdp.trace(" in s)


def fxdp_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_names_the_op_and_line(msg: str) -> None:
    line = line_of(CumModel, "logcumsumexp")
    assert "node 'logcumsumexp' (aten::logcumsumexp) [" in msg, msg
    assert f"test_never_guess.py:{line} in model: return torch.logcumsumexp(h, dim=1)]" in msg, msg
    assert "no batch-dim rule for aten::logcumsumexp" in msg, msg
    assert "nor do aten::logcumsumexp_backward" in msg or "logcumsumexp_backward" not in msg, msg
    assert '{"aten::logcumsumexp", "*", F::' in msg and "analysis/op_rules.cc" in msg, msg


class ExpertCounts(nn.Module):
    """Tokens per expert counted with bincount, whose output size is the data's largest id + 1."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)

    def forward(self, x):
        h = self.fc(x)
        return h * torch.bincount(h.argmax(1), minlength=4)[:4].float()


def test_bincount_is_refused_at_trace_naming_the_op_and_line():
    """bincount (issue 23 lists it beside histc): its size depends on the data, so the trace
    refuses it, naming the op and the user's line (histc with fixed bins is the counted form)."""
    with pytest.raises(fxdp.TraceError) as err:
        traced(ExpertCounts())
    line = line_of(ExpertCounts, "bincount")
    msg = str(err.value)
    assert f"test_never_guess.py:{line} (return h * torch.bincount(" in msg, msg
    assert "aten.bincount.default makes the step depend on tensor values" in msg, msg


def test_every_node_records_the_users_line():
    step = traced(BatchSoftmax())
    calls = [n for n in step.graph.nodes if n.kind == pb.CALL_FUNCTION]
    assert calls and all(n.source for n in calls), [n.name for n in calls if not n.source]
    by_name = {n.name: n.source for n in calls}
    line = line_of(BatchSoftmax, "softmax")
    assert by_name[
        "_softmax"
    ] == f"tests/python/test_never_guess.py:{line} in model: return h.softmax(dim=0)" or by_name[
        "_softmax"
    ].endswith(f"test_never_guess.py:{line} in model: return h.softmax(dim=0)"), by_name
    fc = line_of(BatchSoftmax, "self.fc(x)")
    assert by_name["addmm"].endswith(
        f"test_never_guess.py:{fc} in model.fc: h = self.fc(x)"
    ), by_name
    # the backward of the softmax points at the forward line; the loss module is named by its type; the
    # optimizer's ops (fxdp.trace's own step calls optimizer.step()) at the user's fxdp.trace call
    assert by_name["_softmax_backward_data"].startswith("backward of ") and by_name[
        "_softmax_backward_data"
    ].endswith(by_name["_softmax"]), by_name
    call = "return fxdp.trace(model, opt, nn.MSELoss(reduction=reduction), batch)"
    assert by_name["mse_loss"].endswith(f"in <MSELoss>: {call}"), by_name
    assert any(s.endswith(f".py:{line_of_traced()}: {call}") for s in by_name.values()), by_name
    assert all(len(s) <= 400 for s in by_name.values())


def test_compile_errors_quote_the_users_line(tmp_path):
    path = tmp_path / "g.pb"
    traced(BatchMax()).save(path)
    r = fxdp_cli("expand", path, "--world-size", 2, "-o", tmp_path / "x.pb")
    line = line_of(BatchMax, "amax")
    assert r.returncode == 1, r.stderr
    assert "node 'amax' (aten::amax) [" in r.stderr, r.stderr
    assert f"test_never_guess.py:{line} in model: return h - h.amax(dim=0)]" in r.stderr, r.stderr
    assert "not a sum or mean of per-rank results" in r.stderr, r.stderr
    r = fxdp_cli("graph", "print", path, "--source")
    assert f'test_never_guess.py:{line} in model: return h - h.amax(dim=0)"' in r.stdout, r.stderr
    assert "source=" not in fxdp_cli("graph", "print", path).stdout


@pytest.mark.parametrize("world,b", [(2, 6), (3, 7)], ids=["N2", "N3-uneven"])
def test_a_mean_scaled_gradient_added_to_one_at_true_scale(tmp_path, world, b):
    """(h @ h.T) @ h under MSE's mean: h's gradient adds gY @ (h h^T)^T-terms scaled by each
    rank's mean to the gathered operand's, which is at true scale; the scaled term is read times
    B_r/B on each rank (a note says so) and N ranks equal one device (it was refused)."""
    from test_expand_oracle import check_against_one_device

    torch.manual_seed(0)
    model = BatchProduct()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(b, 5, generator=g), torch.randn(b, 4, generator=g)) for _ in range(3)]
    step = fxdp.trace(model, opt, nn.MSELoss(), batches[0])
    # + the gather of h; the all-reduces of mm_2 and permute_1, partial over the whole batch
    report = check_against_one_device(tmp_path, step, batches, world, reductions=3)
    assert any("to add it to a value at that scale" in n for n in report["notes"]), report


def test_expand_refuses_an_op_without_a_rule_and_analyze_labels_its_guess(tmp_path):
    path = tmp_path / "g.pb"
    traced(CumModel(), "sum").save(path)  # (its backward's abs of a mean-scaled value is refused)
    r = fxdp_cli("expand", path, "--world-size", 2, "-o", tmp_path / "x.pb")
    assert r.returncode == 1, r.stderr
    assert_names_the_op_and_line(r.stderr)
    assert not (tmp_path / "x.pb").exists()
    r = fxdp_cli("analyze", path, "--world-size", 2, "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert any(
        w.startswith("GUESSED: no batch-dim rule for aten::logcumsumexp ") and "refuse" in w
        for w in j["warnings"]
    ), j["warnings"]
    line = line_of(CumModel, "logcumsumexp")
    node = next(n for n in j["nodes"] if n["name"] == "logcumsumexp")
    assert node["reason"].startswith("NO RULE for aten::logcumsumexp: size matching"), node
    assert node["source"].endswith(
        f"test_never_guess.py:{line} in model: return torch.logcumsumexp(h, dim=1)"
    ), node
    # the table shows each node's line on request
    r = fxdp_cli("analyze", path, "--world-size", 2, "--source")
    row = next(s for s in r.stdout.splitlines() if s.startswith("logcumsumexp "))
    assert (
        row.endswith(f"test_never_guess.py:{line} in model: return torch.logcumsumexp(h, dim=1)")
        and " <- " in row
    ), row
    assert " <- " not in fxdp_cli("analyze", path, "--world-size", 2).stdout


@pytest.fixture(scope="module")
def client():
    with idle_client() as c:
        yield c


def test_server_expand_and_train_refuse_an_op_without_a_rule(client):
    step = traced(CumModel(), "sum")
    with pytest.raises(fxdp.ServerError) as err:
        client.expand(step, world_size=2)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert_names_the_op_and_line(str(err.value))
    with pytest.raises(fxdp.ServerError) as err:
        client.train(step, world_size=2, batches=[(torch.randn(B, 5), torch.randn(B, 4))])
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert_names_the_op_and_line(str(err.value))
    # Analyze (exploration) still answers, with the guess labelled.
    warnings = client.analyze(step, world_size=2)["warnings"]
    assert any(
        w.startswith("GUESSED: no batch-dim rule for aten::logcumsumexp ") for w in warnings
    ), warnings
