"""`fxdp expand|analyze GRAPH --shape NAME=AxB` on a graph traced with symbolic sizes (issue 26,
docs/shapes.md step 3): the graph instantiated at the shapes expands and analyses exactly like a
static trace at those shapes (the same rank graphs byte for byte, the same report), locally and
through fxdp-server; a batch the trace's guards refuse, a missing --shape, or a static graph at
another shape fail naming the input, the guard, the user's line and what to do."""

from __future__ import annotations

import pathlib
import subprocess

import pytest
from _util import fxdp_binary, local_server
from fxdp.v1 import graph_pb2 as gpb

# The step at batch {B} and sequence {S} ({BS} = B*S): the C++ tests' graph too
# (tests/analysis/symbolic_graph.h).
STATIC = (
    pathlib.Path(__file__).resolve().parents[1] / "testdata" / "sized_step.txt.in"
).read_text()


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def static_graph(d: pathlib.Path, b: int, s: int) -> pathlib.Path:
    text = STATIC.replace("{BS}", str(b * s)).replace("{B}", str(b)).replace("{S}", str(s))
    src, out = d / f"static_{b}x{s}.txt", d / f"static_{b}x{s}.pb"
    src.write_text(text)
    r = cli("graph", "parse", src, out)
    assert r.returncode == 0, r.stderr
    return out


def symbolic_graph(d: pathlib.Path) -> pathlib.Path:
    """The graph above traced at 8x6 with symbolic B and S (x's dims s0, s1; y's s2, s3), guards
    s2 == s0, s3 == s1, and the sizes of every shape, stride and size argument as expressions."""
    g = gpb.GraphDef()
    g.ParseFromString(static_graph(d, 8, 6).read_bytes())
    nodes = {n.name: n for n in g.nodes}
    for name, node, dim in [("s0", 1, 0), ("s1", 1, 1), ("s2", 2, 0), ("s3", 2, 1)]:
        g.symbols.add(name=name, input_node=node, dim=dim, hint=8 if dim == 0 else 6, min=2)

    def expr(op, *operands, value=0, symbol=0) -> int:
        g.size_exprs.add(op=op, value=value, symbol=symbol, operands=[o - 1 for o in operands])
        return len(g.size_exprs)  # 1 + its index

    b, s = (expr(gpb.SIZE_OP_SYMBOL, symbol=i) for i in (0, 1))
    b2, s2 = (expr(gpb.SIZE_OP_SYMBOL, symbol=i) for i in (2, 3))
    bs = expr(gpb.SIZE_OP_MUL, b, s)
    s3 = expr(gpb.SIZE_OP_MUL, s, expr(gpb.SIZE_OP_CONST, value=3))
    s4 = expr(gpb.SIZE_OP_MUL, s, expr(gpb.SIZE_OP_CONST, value=4))
    g.guards.add(kind=gpb.GUARD_EQ, lhs=b2 - 1, rhs=b - 1, source="train.py:9: loss = step(x, y)")
    g.guards.add(kind=gpb.GUARD_EQ, lhs=s2 - 1, rhs=s - 1, source="model.py:7: d = s - y")
    exprs = {  # node: (shape, stride) expressions, 0: static
        "x": ([b, s, 0], [s4, 0, 0]),
        "y": ([b2, s2], [s2, 0]),
        "flat": ([bs, 0], []),
        "mm": ([bs, 0], []),
        "v": ([b, s, 0], [s3, 0, 0]),
        "s": ([b, s], [s, 0]),
        "d": ([b, s], [s, 0]),
        "g": ([b, s], []),
        "gd": ([b, s], [s, 0]),
        "gv": ([b, s, 0], [s, 0, 0]),
        "ge": ([b, s, 0], [s, 0, 0]),
        "gc": ([b, s, 0], [s3, 0, 0]),
        "gf": ([bs, 0], []),
        "ft": ([0, bs], []),
    }
    for name, (shape, stride) in exprs.items():
        t = nodes[name].outputs[0].tensor
        t.shape_expr.extend(shape)
        t.stride_expr.extend(stride)
    sizes = {"flat": [bs, 0], "v": [b, s, 0], "g": [b, s], "ge": [b, s, 0], "gf": [bs, 0]}
    for name, exprs_of_items in sizes.items():
        for item, e in zip(nodes[name].args[1].list.items, exprs_of_items):
            item.size_expr = e
    nodes["gd"].args[1].size_expr = bs  # mean's backward divides by B*S
    out = d / "symbolic.pb"
    out.write_bytes(g.SerializeToString())
    return out


def rank_files(out: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(out.parent.glob(out.stem + "*"))}


@pytest.mark.parametrize("b,s", [(8, 6), (5, 7), (3, 2)])
def test_expand_at_a_shape_equals_expanding_its_static_trace(tmp_path, b, s):
    sym = symbolic_graph(tmp_path)
    shape = ["--shape", f"x={b}x{s}x4", "--shape", f"y={b}x{s}"]
    got, want = tmp_path / "got" / "g.pb", tmp_path / "want" / "g.pb"
    got.parent.mkdir(), want.parent.mkdir()
    r = cli("expand", sym, "--world-size", 2, "-o", got, *shape)
    assert r.returncode == 0, r.stderr
    r0 = cli("expand", static_graph(tmp_path, b, s), "--world-size", 2, "-o", want)
    assert r0.returncode == 0, r0.stderr
    assert r.stdout == r0.stdout
    assert rank_files(got) == rank_files(want)
    a = cli("analyze", sym, "--world-size", 2, "--source", *shape)
    a0 = cli("analyze", static_graph(tmp_path, b, s), "--world-size", 2, "--source")
    assert a.returncode == 0 and a.stdout == a0.stdout, a.stderr


def test_the_server_gets_the_instantiated_graph(tmp_path):
    sym = symbolic_graph(tmp_path)
    shape = ["--shape", "x=5x7x4", "--shape", "y=5x7"]
    with local_server(workers=0) as (address, _):
        got, want = tmp_path / "got" / "g.pb", tmp_path / "want" / "g.pb"
        got.parent.mkdir(), want.parent.mkdir()
        r = cli("expand", sym, "--world-size", 2, "-o", got, "--server", address, *shape)
        assert r.returncode == 0, r.stderr
        assert cli("expand", sym, "--world-size", 2, "-o", want, *shape).returncode == 0
        assert rank_files(got) == rank_files(want)
        a = cli("analyze", sym, "--server", address, *shape)
        assert a.returncode == 0 and a.stdout == cli("analyze", sym, *shape).stdout, a.stderr
        # Without --shape the server refuses the symbolic graph, as the CLI does.
        r = cli("expand", sym, "--world-size", 2, "-o", got, "--server", address)
        assert r.returncode == 1 and "instantiate it at" in r.stderr, r.stderr


def test_refusals_say_what_is_wrong_and_what_to_do(tmp_path):
    sym = symbolic_graph(tmp_path)
    out = tmp_path / "o.pb"
    r = cli("expand", sym, "--world-size", 2, "-o", out)
    assert r.returncode == 1, r.stderr
    assert "no shape was given for input 'x' (traced at [8, 6, 4]; its dim 0 is s0)" in r.stderr
    assert "--shape x=8x6x4" in r.stderr
    r = cli("expand", sym, "--world-size", 2, "-o", out, "--shape", "x=5x7x4", "--shape", "y=4x7")
    assert r.returncode == 1, r.stderr
    assert (
        "at x=5x7x4, y=4x7: the trace assumed s2 == s0 [train.py:9: loss = step(x, y)], which does "
        "not hold here: 4 against 5" in r.stderr
    ), r.stderr
    assert "drop_last=True" in r.stderr and "re-trace with this batch" in r.stderr
    r = cli("analyze", sym, "--shape", "x=1x7x4", "--shape", "y=1x7")
    assert r.returncode == 1 and "s0 in [2, inf]" in r.stderr, r.stderr
    r = cli("expand", sym, "--world-size", 2, "-o", out, "--shape", "x=5x7x4")
    assert r.returncode == 1 and "no shape was given for input 'y'" in r.stderr, r.stderr
    r = cli("expand", sym, "--world-size", 2, "-o", out, "--shape", "x=5by7")
    assert r.returncode == 2 and "--shape: 'x=5by7' is not NAME=SHAPE" in r.stderr, r.stderr
    r = cli(
        "expand", static_graph(tmp_path, 8, 6), "--world-size", 2, "-o", out, "--shape", "x=5x6x4"
    )
    assert r.returncode == 1, r.stderr
    assert "input 'x' is [5, 6, 4], but the graph is static, traced at [8, 6, 4]" in r.stderr


def test_graph_instantiate_print_and_check_take_shapes(tmp_path):
    sym = symbolic_graph(tmp_path)
    shape = ["--shape", "x=5x7x4", "--shape=y=5x7"]
    out = tmp_path / "at_5x7.pb"
    r = cli("graph", "instantiate", sym, out, *shape)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == static_graph(tmp_path, 5, 7).read_bytes()
    p = cli("graph", "print", sym, *shape)
    assert p.returncode == 0 and p.stdout == cli("graph", "print", out).stdout, p.stderr
    c = cli("graph", "check", sym, *shape)
    assert c.returncode == 0 and ": ok: 20 nodes" in c.stdout, c.stderr
    r = cli("graph", "print", sym)
    assert r.returncode == 1 and "no shape was given for input 'x'" in r.stderr, r.stderr
    r = cli("graph", "roundtrip", sym, out, *shape)
    assert r.returncode == 2 and "roundtrip takes no --shape" in r.stderr, r.stderr
