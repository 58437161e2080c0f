"""``fxdp expand`` on every zoo graph for N in {2, 3, 4}: the per-rank graphs verify (the CLI
re-decodes them), there is one gradient all-reduce per bucket, buckets cover every gradient
once, and no global batch size is left in any size argument: every size list of a view,
reshape, expand, factory or *_backward equals the local shape its node produces."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest
from _util import INCONSISTENT, MODELS, OPTIMS, traced
from fxdp.v1 import graph_pb2 as pb

HERE = os.path.dirname(os.path.abspath(__file__))
FXDP = os.environ.get("FXDP_BIN", os.path.join(HERE, "..", "..", "build", "bin", "fxdp"))

# op -> index of the size list that spells the output's shape.
SIZE_ARGS = {
    "aten::view": 1,
    "aten::_unsafe_view": 1,
    "aten::reshape": 1,
    "aten::expand": 1,
    "aten::new_zeros": 1,
    "aten::new_ones": 1,
    "aten::new_empty": 1,
    "aten::new_full": 1,
    "aten::zeros": 0,
    "aten::ones": 0,
    "aten::full": 0,
    "aten::empty": 0,
    "aten::select_backward": 1,
    "aten::slice_backward": 1,
}


def ints(arg: "pb.Argument"):
    if arg.WhichOneof("value") != "list":
        return None
    out = []
    for e in arg.list.items:
        if e.WhichOneof("value") != "int_value":
            return None
        out.append(e.int_value)
    return out


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    paths = {}
    for m in MODELS:
        for o in OPTIMS:
            p = d / f"{m}_{o}.pb"
            traced(m, o).save(str(p))
            paths[(m, o)] = p
    return paths


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("optim", OPTIMS)
@pytest.mark.parametrize("model", MODELS)
def test_expand_zoo(graphs, tmp_path, model, optim, world):
    src = graphs[(model, optim)]
    out = tmp_path / "x.pb"
    r = subprocess.run(
        [FXDP, "expand", str(src), "--world-size", str(world), "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    sizes = [s["size"] for s in rep["slices"]]
    assert sum(sizes) == rep["batch_size"] and max(sizes) - min(sizes) <= 1
    # The report lists what was written (one file for all ranks, else x.rank<r>.pb), and only that.
    files = [pathlib.Path(f["path"]) for f in rep["files"]]
    assert sorted(tmp_path.glob("x*.pb")) == sorted(files)
    if len(files) == 1:
        assert files == [out] and rep["files"][0]["ranks"] == list(range(world))
    else:
        assert files == [tmp_path / f"x.rank{k}.pb" for k in range(world)]
        assert [f["ranks"] for f in rep["files"]] == [[k] for k in range(world)]
    if len(set(sizes)) > 1:
        assert len(files) == world
    n_params = sum(p.placeholder.role == pb.PARAMETER for p in traced(model, optim).placeholders)
    grads = [g for b in rep["buckets"] for g in b["gradients"]]
    assert len(grads) == len(set(grads)) == n_params
    for b in rep["buckets"]:
        assert b["start_position"] < b["wait_position"]
    for f in files:
        chk = subprocess.run([FXDP, "graph", "check", str(f)], capture_output=True, text=True)
        assert chk.returncode == 0, chk.stderr
        g = pb.GraphDef()
        g.ParseFromString(f.read_bytes())
        targets = [n.target.name for n in g.nodes]
        all_reduces = targets.count("_c10d_functional::all_reduce")
        assert all_reduces == targets.count("_c10d_functional::wait_tensor")
        # one per bucket, one for the loss, one per synchronised buffer, one per cross-entropy
        # mean's count of targets (fxdp.decompositions)
        synced = sum("running" in s for s in rep["notes"] if s.startswith("updated state"))
        counts = sum(c["purpose"].startswith("reduce ") for c in rep["collectives"])
        assert counts == (model in ("cnn", "transformer")), rep["collectives"]
        assert all_reduces == len(rep["buckets"]) + 1 + synced + counts, (
            all_reduces,
            rep["buckets"],
        )
        for n in g.nodes:
            k = SIZE_ARGS.get(n.target.name)
            if k is None or len(n.args) <= k or not n.outputs:
                continue
            want = list(n.outputs[0].tensor.shape)
            got = ints(n.args[k])
            assert got is not None and len(got) == len(want), n.name
            for gi, wi in zip(got, want):
                assert (
                    gi == wi or gi == -1
                ), f"{n.name} ({n.target.name}): size list {got} vs local shape {want}"


def test_a_graph_that_cannot_run_is_refused_at_expand_time(tmp_path):
    """A deliberately inconsistent graph (6 indices per sample, gradients for 5): the shape check
    of the expanded rank graph refuses it, naming rank, node and both shapes, with exit code 1
    (INVALID_ARGUMENT), before any worker could fail on it."""
    (tmp_path / "g.txt").write_text(INCONSISTENT)
    r = subprocess.run(
        [FXDP, "graph", "parse", str(tmp_path / "g.txt"), str(tmp_path / "g.pb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [FXDP, "expand", str(tmp_path / "g.pb"), "--world-size", "2", "-o", str(tmp_path / "x.pb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert (
        "rank 0's expanded graph: node 'ge' (aten::embedding_dense_backward): grad_output "
        "[2, 5, 3] does not match indices [2, 6]"
    ) in r.stderr, r.stderr
    assert not (tmp_path / "x.pb").exists()
