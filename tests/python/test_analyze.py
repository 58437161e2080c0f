"""`fxdp analyze GRAPH.pb --world-size N [--json]` on real traced training steps.

Drives the C++ CLI ($FXDP_BIN or <repo>/build/bin/fxdp; the test fails, it does not skip, when
the binary is missing) on:

* every zoo model x optimizer: no warnings; INPUT placeholders S(batch_dim); parameters, buffers,
  optimizer state and constants R; every gradient and the loss P(avg) and all-reduced with op "avg"
  for MSE (a mean over the batch rows), P(sum) for cross-entropy (traced as a sum divided by the
  all-reduced count of targets: fxdp.decompositions); the updated parameters and optimizer state R;
* small models built to defeat size matching (hidden width == feature count == batch size, a batch
  folded into another dim and split back, sequence length == batch size with the batch on dim 1)
  and losses reduced by sum;
* bad command lines and bad graphs (exit codes and messages).

Where the batch really is comes from an oracle independent of the analyzer: the same step traced
again at half the batch. The dims whose size changes are, by construction, exactly the batch dims,
whatever coincidences of sizes the full-batch trace has (see test_batch_size_visibility.py).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import re
import subprocess
from typing import Dict, List, Optional, Tuple

import fxdp
import pytest
import torch
import torch.nn as nn
from _util import MODELS, OPTIMS, output_node, target_str, traced
from fxdp import zoo
from fxdp.v1 import graph_pb2 as pb

REPO = pathlib.Path(__file__).resolve().parents[2]
CASES = [(m, o) for m in MODELS for o in OPTIMS]
ROLE_NAMES = {
    pb.PARAMETER: "PARAMETER",
    pb.BUFFER: "BUFFER",
    pb.OPTIMIZER_STATE: "OPTIMIZER_STATE",
    pb.INPUT: "INPUT",
    pb.CONSTANT: "CONSTANT",
    pb.HYPERPARAMETER: "HYPERPARAMETER",
}
STATE_ROLES = {pb.PARAMETER, pb.BUFFER, pb.OPTIMIZER_STATE, pb.CONSTANT, pb.HYPERPARAMETER}
PLACEMENT_RE = re.compile(r"S\(\d+\)|R|P\((sum|avg)\)")


# --------------------------------------------------------------------------- running the CLI


def fxdp_bin() -> str:
    path = os.environ.get("FXDP_BIN") or str(REPO / "build" / "bin" / "fxdp")
    assert os.path.isfile(path) and os.access(
        path, os.X_OK
    ), f"C++ CLI not found at {path}: build it first (make test builds it) or set FXDP_BIN"
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([fxdp_bin(), *map(str, args)], capture_output=True, text=True, timeout=60)


@functools.lru_cache(maxsize=None)
def analyze_json(path: str, world_size: int = 2) -> dict:
    proc = run_cli("analyze", path, "--world-size", str(world_size), "--json")
    assert proc.returncode == 0, f"fxdp analyze {path} failed ({proc.returncode}): {proc.stderr}"
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise AssertionError(
            f"fxdp analyze --json printed no single JSON object ({e}): {proc.stdout[:500]}"
        )


class Analysed:
    """A GraphDef and the analyzer's JSON for it, with lookups by node name."""

    def __init__(self, g: "pb.GraphDef", result: dict):
        self.g = g
        self.r = result
        self.index = {n.name: i for i, n in enumerate(g.nodes)}
        assert [n["name"] for n in result["nodes"]] == [
            n.name for n in g.nodes
        ], "the JSON's nodes are not the graph's nodes in graph order"
        self.json = {n["name"]: n for n in result["nodes"]}

    def node(self, name: str) -> "pb.Node":
        return self.g.nodes[self.index[name]]

    def placements(self, name: str) -> List[Optional[str]]:
        """One placement string per output of the node (None for a non-tensor output)."""
        return output_placements(self.json[name], self.node(name))

    def placement_of(self, ref: "pb.ValueRef") -> Optional[str]:
        return self.placements(self.g.nodes[ref.node].name)[ref.output]

    def describe(self, name: str) -> str:
        j = self.json[name]
        shapes = [list(o.tensor.shape) for o in self.node(name).outputs]
        return f"{name} ({j['target']}, shapes {shapes}): placement {j['placement']!r}, reason {j['reason']!r}"


def output_placements(j: dict, n: "pb.Node") -> List[Optional[str]]:
    """The node's "placements" list (one per output, None for a non-tensor one), checked against
    the joined "placement" string."""
    each = j["placements"]
    tensor = [o.kind == pb.TENSOR for o in n.outputs]
    assert len(each) == len(tensor), f"{n.name}: {len(each)} placements for {len(tensor)} outputs"
    assert [
        p is not None for p in each
    ] == tensor, f"{n.name}: placements {each} for outputs {tensor}"
    for p in each:
        assert p is None or PLACEMENT_RE.fullmatch(p), f"{n.name}: malformed placement {p!r}"
    present = [p for p in each if p is not None]
    if not present:
        want = "-"
    elif len(set(present)) == 1 and all(tensor):
        want = present[0]
    else:
        want = "(" + ", ".join(p or "-" for p in each) + ")"
    assert j["placement"] == want, f"{n.name}: placement {j['placement']!r}, placements {each}"
    return each


def save(step: fxdp.TracedStep, d: pathlib.Path, name: str) -> str:
    path = d / f"{name}.pb"
    step.save(path)
    return str(path)


# --------------------------------------------------------------------------- the half-batch oracle


def batch_dims_by_shape(
    g_full: "pb.GraphDef", g_half: "pb.GraphDef"
) -> Dict[Tuple[str, int], List[int]]:
    """(node name, output) -> the dims whose size differs between the full- and half-batch traces."""
    assert [(n.name, target_str(n)) for n in g_full.nodes] == [
        (n.name, target_str(n)) for n in g_half.nodes
    ], "the half-batch trace has a different structure"
    out = {}
    for nf, nh in zip(g_full.nodes, g_half.nodes):
        for k, (of, oh) in enumerate(zip(nf.outputs, nh.outputs)):
            if of.kind == pb.TENSOR:
                assert len(of.tensor.shape) == len(oh.tensor.shape), f"{nf.name}: rank differs"
                out[(nf.name, k)] = [
                    d for d, (a, b) in enumerate(zip(of.tensor.shape, oh.tensor.shape)) if a != b
                ]
    return out


def refs_of(n: "pb.Node") -> List["pb.ValueRef"]:
    out = []

    def walk(a: "pb.Argument"):
        kind = a.WhichOneof("value")
        if kind == "ref":
            out.append(a.ref)
        elif kind == "list":
            for x in a.list.items:
                walk(x)

    for a in n.args:
        walk(a)
    for kw in n.kwargs:
        walk(kw.value)
    return out


def assert_batch_dims_follow_provenance(
    a: Analysed, oracle: Dict[Tuple[str, int], List[int]]
) -> int:
    """Every value with one batch-sized dim is S(that dim), or R when it is computed from replicated
    values only (e.g. the seed gradient of a sum expanded to the batch's shape): then every sharded
    node reading it must be listed in sharded_reads (it slices its rows). A value without a
    batch-sized dim is never S. Returns how many values were sharded."""
    bad, sharded = [], 0
    reduced = {(x["value"], x["output"]) for x in a.r["reductions"]}
    sliced = {(x["value"], x["output"], x["user"]) for x in a.r.get("sharded_reads", [])}
    users: Dict[Tuple[int, int], List["pb.Node"]] = {}
    for n in a.g.nodes:
        for ref in refs_of(n):
            users.setdefault((ref.node, ref.output), []).append(n)

    def read(ref: "pb.ValueRef") -> Optional[str]:
        name = a.g.nodes[ref.node].name
        return "R" if (name, ref.output) in reduced else a.placements(name)[ref.output]

    for i, n in enumerate(a.g.nodes):
        for k, p in enumerate(a.placements(n.name)):
            dims = oracle.get((n.name, k))
            if dims is None or p is None:
                continue
            if len(dims) == 1 and p == "R" and n.kind == pb.CALL_FUNCTION:
                not_r = [
                    f"{a.g.nodes[r.node].name}:{read(r)}"
                    for r in refs_of(n)
                    if read(r) not in ("R", None)
                ]
                if not_r:
                    bad.append(
                        f"{a.describe(n.name)} output {k}: expected S({dims[0]}); R although it reads {not_r}"
                    )
                for u in users.get((i, k), []):
                    if (
                        u.kind == pb.CALL_FUNCTION
                        and any(q and q.startswith("S(") for q in a.placements(u.name))
                        and (n.name, k, u.name) not in sliced
                    ):
                        bad.append(
                            f"{a.describe(n.name)} output {k}: R and batch-shaped, read by sharded "
                            f"{a.describe(u.name)} without a sharded read"
                        )
            elif len(dims) == 1:
                sharded += 1
                if p != f"S({dims[0]})":
                    bad.append(f"{a.describe(n.name)} output {k}: expected S({dims[0]})")
            elif not dims and p.startswith("S("):
                bad.append(
                    f"{a.describe(n.name)} output {k}: expected no shard (no dim scales with the batch)"
                )
    assert not bad, "placements contradict where the batch is:\n  " + "\n  ".join(bad)
    return sharded


# --------------------------------------------------------------------------- the step's semantics


def assert_step_semantics(
    a: Analysed,
    reduce: str,
    batch_size: int,
    world_size: int = 2,
    grad_reduce: Optional[str] = None,
) -> None:
    """Roles, gradients, reductions, loss and updates, for a loss reduced by `reduce` ("avg"/"sum")
    over the batch. The gradients are reduced the same way unless `grad_reduce` says otherwise."""
    r, g = a.r, a.g
    partial = f"P({reduce})"
    grad_reduce = grad_reduce or reduce
    grad_partial = f"P({grad_reduce})"
    assert r["world_size"] == world_size
    assert r["batch_size"] == batch_size
    assert r["warnings"] == [], f"ops fell back to size matching: {r['warnings']}"
    bad = []

    # every node: the target, and batch_dim consistent with the placement
    for n in g.nodes:
        j = a.json[n.name]
        want = {pb.PLACEHOLDER: "placeholder", pb.OUTPUT: "output"}.get(n.kind) or target_str(n)
        if j["target"] != want:
            bad.append(f"{n.name}: target {j['target']!r}, expected {want!r}")
        p = j["placement"]
        if PLACEMENT_RE.fullmatch(p):
            want_bd = int(p[2:-1]) if p.startswith("S(") else None
            if j["batch_dim"] != want_bd:
                bad.append(f"{n.name}: batch_dim {j['batch_dim']!r} with placement {p}")

    # placeholders
    for n in g.nodes:
        if n.kind != pb.PLACEHOLDER:
            continue
        j, spec = a.json[n.name], n.placeholder
        if j.get("role") != ROLE_NAMES[spec.role] or j.get("state_name") != spec.state_name:
            bad.append(
                f"{n.name}: role/state_name {j.get('role')!r}/{j.get('state_name')!r}, expected "
                f"{ROLE_NAMES[spec.role]}/{spec.state_name}"
            )
        if spec.role == pb.INPUT:
            want = f"S({spec.batch_dim})" if spec.batch_dim >= 0 else "R"
        else:
            assert spec.role in STATE_ROLES
            want = "R"
        if j["placement"] != want:
            bad.append(f"{a.describe(n.name)}: expected {want} ({ROLE_NAMES[spec.role]})")

    # gradients: partial, and each all-reduced with its parameter's name
    red = {}
    for x in r["reductions"]:
        red.setdefault((x["value"], x["output"]), []).append(x)
    grads = [n for n in g.nodes if n.grad_of]
    assert grads, "the step has no gradient nodes"
    for n in grads:
        j = a.json[n.name]
        if j.get("grad_of") != n.grad_of:
            bad.append(f"{n.name}: JSON grad_of {j.get('grad_of')!r}, graph says {n.grad_of!r}")
        if a.placements(n.name)[0] != grad_partial:
            bad.append(f"gradient of {n.grad_of}: {a.describe(n.name)}: expected {grad_partial}")
        rs = red.get((n.name, 0), [])
        if len(rs) != 1:
            bad.append(f"gradient of {n.grad_of} ({n.name}): {len(rs)} reductions, expected 1")
            continue
        if rs[0]["op"] != grad_reduce or rs[0].get("grad_of") != n.grad_of:
            bad.append(
                f"gradient of {n.grad_of} ({n.name}): reduction {rs[0]}, expected op {grad_reduce!r}"
            )
    assert set(a.json[n.name].get("grad_of") for n in g.nodes if a.json[n.name].get("grad_of")) == {
        n.grad_of for n in grads
    }, "JSON grad_of marks differ from the graph's"

    # every reduction: a partial value with that reduce op, first needed by a later node
    for x in r["reductions"]:
        if x["value"] not in a.index or x["first_use"] not in a.index:
            bad.append(f"reduction {x}: unknown node")
            continue
        got = a.placements(x["value"])[x["output"]]
        if got != f"P({x['op']})":
            bad.append(f"reduction {x}: the value is {got}")
        if a.index[x["first_use"]] <= a.index[x["value"]]:
            bad.append(f"reduction {x}: first use precedes the value")

    # outputs: the loss is partial, updated parameters and optimizer state replicated
    out = output_node(g)
    refs = [item.ref for item in out.args[0].list.items]
    assert len(refs) == len(out.output_specs)
    roles = [s.role for s in out.output_specs]
    assert roles.count(pb.LOSS) == 1
    for ref, spec in zip(refs, out.output_specs):
        src = g.nodes[ref.node].name
        got = a.placement_of(ref)
        if spec.role == pb.LOSS and got != partial:
            bad.append(f"loss: {a.describe(src)} output {ref.output}: expected {partial}")
        if spec.role in (pb.UPDATED_PARAMETER, pb.UPDATED_OPTIMIZER_STATE) and got != "R":
            bad.append(f"new {spec.state_name}: {a.describe(src)} output {ref.output}: expected R")
    assert not bad, f"{len(bad)} problem(s):\n  " + "\n  ".join(bad)


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
