"""The oracles of test_analyze.py and test_analyze_traps.py: `fxdp analyze --json` run on a saved
step (the C++ CLI, $FXDP_BIN or <repo>/build/bin/fxdp; a missing binary fails, it does not skip),
the analyzer's JSON with lookups by node name, and two checks independent of the analyzer: the batch
dims found by tracing the same step again at half the batch, and the step's semantics (inputs
sharded, state replicated, gradients and loss partial and all-reduced, updates replicated).
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import subprocess
from typing import Dict, List, Optional, Tuple

import fxdp
from _util import MODELS, OPTIMS, fxdp_binary, output_node, target_str
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


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


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
    assert r["world_size"] == world_size
    assert r["batch_size"] == batch_size
    assert r["warnings"] == [], f"ops fell back to size matching: {r['warnings']}"
    bad = []
    _check_nodes(a, g, bad)
    _check_placeholders(a, g, bad)
    _check_gradients(a, r, g, grad_reduce, bad)
    _check_reductions(a, r, bad)
    _check_outputs(a, g, partial, bad)
    assert not bad, f"{len(bad)} problem(s):\n  " + "\n  ".join(bad)


def _check_nodes(a, g, bad) -> None:
    """Every node: the target, and batch_dim consistent with the placement."""
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


def _check_placeholders(a, g, bad) -> None:
    """Placeholders: role and state name as the graph says; inputs sharded on their batch dim,
    state replicated."""
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


def _check_gradients(a, r, g, grad_reduce, bad) -> None:
    """Gradients: partial, and each all-reduced with its parameter's name."""
    grad_partial = f"P({grad_reduce})"
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


def _check_reductions(a, r, bad) -> None:
    """Every reduction: a partial value with that reduce op, first needed by a later node."""
    for x in r["reductions"]:
        if x["value"] not in a.index or x["first_use"] not in a.index:
            bad.append(f"reduction {x}: unknown node")
            continue
        got = a.placements(x["value"])[x["output"]]
        if got != f"P({x['op']})":
            bad.append(f"reduction {x}: the value is {got}")
        if a.index[x["first_use"]] <= a.index[x["value"]]:
            bad.append(f"reduction {x}: first use precedes the value")


def _check_outputs(a, g, partial, bad) -> None:
    """Outputs: the loss is partial, updated parameters and optimizer state replicated."""
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
