"""`fxdp analyze GRAPH.pb --world-size N [--json]` on real traced training steps.

Drives the C++ CLI ($FXDP_BIN or <repo>/build/bin/fxdp; the test fails, it does not skip, when
the binary is missing) on:

* every zoo model x optimizer: no warnings; INPUT placeholders S(batch_dim); parameters, buffers,
  optimizer state and constants R; every gradient and the loss P(avg) and all-reduced with op "avg"
  for MSE (a mean over the batch rows), P(sum) for cross-entropy (traced as a sum divided by the
  all-reduced count of targets: fxdp.decompositions); the updated parameters and optimizer state R;
* bad command lines and bad graphs (exit codes and messages).

Small models built to defeat size matching: test_analyze_traps.py. The oracles: _analyze_oracle.py.

Where the batch really is comes from an oracle independent of the analyzer: the same step traced
again at half the batch. The dims whose size changes are, by construction, exactly the batch dims,
whatever coincidences of sizes the full-batch trace has (see test_batch_size_visibility.py).
"""

from __future__ import annotations

import pathlib
import re
from typing import Tuple

import fxdp
import pytest
from _analyze_oracle import (
    CASES,
    Analysed,
    analyze_json,
    assert_batch_dims_follow_provenance,
    assert_step_semantics,
    batch_dims_by_shape,
    run_cli,
    save,
)
from _util import MODELS, target_str, traced
from fxdp import zoo
from fxdp.v1 import graph_pb2 as pb

# --------------------------------------------------------------------------- zoo graphs


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def zoo_analysed(zoo_dir):
    cache = {}

    def get(model: str, optim: str) -> Tuple[Analysed, str]:
        if (model, optim) not in cache:
            step = traced(model, optim)
            path = save(step, zoo_dir, f"{model}_{optim}")
            cache[model, optim] = Analysed(step.graph, analyze_json(path)), path
        return cache[model, optim]

    return get


def _zoo_batch_size(model: str) -> int:
    e = zoo.get(model)
    dims = (
        e.batch_dim
        if isinstance(e.batch_dim, (list, tuple))
        else [e.batch_dim] * len(e.input_names)
    )
    return e.batch(0)[0].shape[dims[0]]


@pytest.mark.parametrize("model,optim", CASES)
def test_zoo_step_semantics(zoo_analysed, model, optim):
    a, _ = zoo_analysed(model, optim)
    assert zoo.get(model).loss_reduction == "mean"
    # cross-entropy's mean is a sum over the targets divided by their all-reduced count: P(sum)
    cross_entropy = any(target_str(n).startswith("aten::nll_loss") for n in a.g.nodes)
    assert_step_semantics(a, "sum" if cross_entropy else "avg", _zoo_batch_size(model))


@pytest.mark.parametrize("model", MODELS)
def test_zoo_inputs_sharded_on_their_batch_dim(zoo_analysed, model):
    a, _ = zoo_analysed(model, "adam")
    e = zoo.get(model)
    inputs = [n for n in a.g.nodes if n.kind == pb.PLACEHOLDER and n.placeholder.role == pb.INPUT]
    assert [n.placeholder.state_name for n in inputs] == list(e.input_names)
    want = 1 if model == "seqfirst" else 0
    for n in inputs:
        assert a.json[n.name]["placement"] == f"S({want})", a.describe(n.name)
        assert a.json[n.name]["batch_dim"] == want, a.describe(n.name)


def _half_batch_trace(model: str, optim: str) -> fxdp.TracedStep:
    e = zoo.get(model)
    batch = e.batch(0)
    dims = e.batch_dim if isinstance(e.batch_dim, (list, tuple)) else [e.batch_dim] * len(batch)
    half = tuple(t.narrow(d, 0, t.shape[d] // 2).contiguous() for t, d in zip(batch, dims))
    model = e.model(0)
    return fxdp.trace(
        model,
        zoo.make_optimizer(optim, model),
        e.loss_fn,
        half,
        batch_dim=e.batch_dim,
        input_names=e.input_names,
        loss_reduction=e.loss_reduction,
    )


@pytest.mark.parametrize("model", MODELS)
def test_zoo_batch_dims_follow_provenance(zoo_analysed, model):
    # The forward and backward are the same for every optimizer: SGD is the cheapest to re-trace.
    a, _ = zoo_analysed(model, "sgd")
    oracle = batch_dims_by_shape(a.g, _half_batch_trace(model, "sgd").graph)
    assert assert_batch_dims_follow_provenance(a, oracle) > 5


def test_zoo_batchnorm_note(zoo_analysed):
    # docs/architecture.md (Semantics): BatchNorm in training uses local batch statistics, and the report says so.
    a, _ = zoo_analysed("cnn", "adam")
    assert any("statistic" in note.lower() for note in a.r["notes"]), a.r["notes"]


@pytest.mark.parametrize("model,optim", CASES)
def test_zoo_table(zoo_analysed, model, optim):
    a, path = zoo_analysed(model, optim)
    proc = run_cli("analyze", path, "--world-size", "2")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    rows = {}
    for line in text.splitlines():
        if line and not line[0].isspace():
            rows.setdefault(line.split()[0], line)
    missing = [n.name for n in a.g.nodes if n.name not in rows]
    assert not missing, f"the table has no row for {missing[:10]}"
    wrong = [rows[n.name] for n in a.g.nodes if a.json[n.name]["placement"] not in rows[n.name]]
    assert not wrong, f"table rows disagree with --json: {wrong[:5]}"
    for word in ("placement", "reason", "reduction"):
        assert word in text.lower()
    assert re.search(r"P\((avg|sum)\)", text) and "S(" in text


def test_placements_do_not_depend_on_world_size(zoo_analysed):
    a, path = zoo_analysed("mlp", "adam")
    for ws in (1, 5):  # 5 does not divide the batch of 12: uneven shards are supported
        r = analyze_json(path, ws)
        assert r["world_size"] == ws
        assert r["batch_size"] == 12
        assert [(n["name"], n["placement"]) for n in r["nodes"]] == [
            (n["name"], n["placement"]) for n in a.r["nodes"]
        ]
        assert [(x["value"], x["op"]) for x in r["reductions"]] == [
            (x["value"], x["op"]) for x in a.r["reductions"]
        ]


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def mlp_path(zoo_dir) -> str:
    return save(traced("mlp", "sgd"), zoo_dir, "mlp_sgd_bad_input_base")


def _edited(mlp_path: str, out: pathlib.Path, state_name: str, batch_dim: int) -> Tuple[str, str]:
    g = pb.GraphDef()
    g.ParseFromString(pathlib.Path(mlp_path).read_bytes())
    node = next(
        n for n in g.nodes if n.kind == pb.PLACEHOLDER and n.placeholder.state_name == state_name
    )
    assert node.placeholder.role == pb.INPUT
    node.placeholder.batch_dim = batch_dim
    out.write_bytes(g.SerializeToString())
    return str(out), node.name


@pytest.mark.parametrize("ws", ["0", "-1"])
def test_bad_world_size(mlp_path, ws):
    proc = run_cli("analyze", mlp_path, "--world-size", ws)
    assert proc.returncode in (1, 2), (proc.returncode, proc.stderr)
    assert "world" in proc.stderr.lower(), proc.stderr


def test_world_size_not_a_number(mlp_path):
    proc = run_cli("analyze", mlp_path, "--world-size", "abc", "--json")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "world" in proc.stderr.lower(), proc.stderr


def test_batch_dim_out_of_range(mlp_path, tmp_path):
    path, name = _edited(mlp_path, tmp_path / "bad_dim.pb", "x", 7)
    proc = run_cli("analyze", path, "--world-size", "2", "--json")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert name in proc.stderr and "batch_dim" in proc.stderr and "7" in proc.stderr, proc.stderr


def test_inputs_disagree_on_batch_size(mlp_path, tmp_path):
    # target is (12, 5): its dim 1 has 5 rows where x has 12
    path, name = _edited(mlp_path, tmp_path / "disagree.pb", "target", 1)
    proc = run_cli("analyze", path, "--world-size", "2", "--json")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert name in proc.stderr and "batch" in proc.stderr.lower(), proc.stderr


def test_missing_file(tmp_path):
    proc = run_cli("analyze", tmp_path / "nope.pb", "--world-size", "2")
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "nope.pb" in proc.stderr


def test_no_arguments():
    proc = run_cli("analyze")
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stderr.strip()


def test_help():
    proc = run_cli("analyze", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--world-size" in proc.stdout
