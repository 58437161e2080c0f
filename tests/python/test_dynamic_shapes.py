"""Symbolic sizes, Python side (issue 26, docs/shapes.md build plan steps 2 and 3):
``trace_step(..., dynamic=True)`` traces once, the GraphDef carries the input dims' symbols, the
size expressions and the guards, and ``TracedStep.instantiate`` / ``run_local`` run any batch shape
the guards allow, equal to eager; a batch they do not allow is refused naming the input, the guard
and the user's line."""

from __future__ import annotations

import collections
import copy
import subprocess

import fxdp
import pytest
import sympy
import torch
from _tiny_gpt2 import CONFIG, train_step
from _util import ATOL, RTOL, fxdp_binary, local_server
from fxdp import sizes
from fxdp.errors import ShapeError, TraceError
from fxdp.v1 import graph_pb2 as pb

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

V = CONFIG["vocab_size"]


def gpt2():
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**CONFIG, "n_positions": 64}))
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def ids(b: int, s: int, seed: int = 1):
    return {"input_ids": torch.randint(0, V, (b, s), generator=torch.Generator().manual_seed(seed))}


def eager(model, step_fn, batch):
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
    loss = step_fn(m, opt, batch)
    return m, float(loss)


@pytest.fixture(scope="module")
def symbolic():
    model, opt = gpt2()
    start = copy.deepcopy(model)
    return fxdp.trace_step(train_step, model, opt, ids(4, 16), dynamic=True), start


@pytest.mark.parametrize("shape", [(4, 16), (4, 24), (3, 16), (5, 37)])
def test_one_symbolic_trace_runs_every_shape_like_eager(symbolic, shape):
    step, start = symbolic
    batch = ids(*shape, seed=shape[0] * 100 + shape[1])
    new, loss = step.run_local(step.initial_state(), batch)
    ref, ref_loss = eager(start, train_step, batch)
    assert float(loss) == pytest.approx(ref_loss, rel=1e-6)
    for n, p in ref.named_parameters():
        torch.testing.assert_close(new[n], p.detach(), rtol=RTOL, atol=ATOL, msg=n)
    assert step.instantiate(batch).graph.nodes[-1].kind == pb.OUTPUT


def test_symbols_survive_the_trace(symbolic):
    """convert must never int() a SymInt: that makes the ShapeEnv specialise every symbol to the
    example's value, and the graph is quietly static (docs/shapes.md)."""
    g = symbolic[0].graph
    assert [(s.dim, s.hint, s.min, s.max) for s in g.symbols] == [(0, 4, 2, 0), (1, 16, 2, 0)]
    x = next(n for n in g.nodes if n.kind == pb.PLACEHOLDER and n.placeholder.role == pb.INPUT)
    assert list(x.outputs[0].tensor.shape) == [4, 16] and all(x.outputs[0].tensor.shape_expr)
    assert g.symbols[0].input_node == list(g.nodes).index(x)
    views = [
        n for n in g.nodes if n.target.name == "aten::view" and n.args[1].list.items[0].size_expr
    ]
    assert views, "no view takes a symbolic size"
    text = sizes.render(g, views[0].args[1].list.items[0].size_expr - 1)
    assert "s" in text and "fxdp.specialized" not in symbolic[0].metadata()
    assert symbolic[0].is_symbolic() and not symbolic[0].instantiate(ids(5, 37)).is_symbolic()


def test_static_trace_has_no_symbols():
    model, opt = gpt2()
    step = fxdp.trace_step(train_step, model, opt, ids(4, 16))
    g = step.graph
    assert not g.symbols and not g.size_exprs and not g.guards and not step.is_symbolic()
    assert all(not o.tensor.shape_expr for n in g.nodes for o in n.outputs)
    assert step.instantiate(ids(4, 16)) is step


def test_the_instance_is_the_concrete_trace_less_full_slices(symbolic):
    """A symbolic trace records full-range slices (with their slice_backward) and dropout(p=0)'s
    clones, which a concrete trace never does (elide_full_slices, drop_noop_clones): the instance
    at the example has the concrete trace's ops but the slices of ``cat``'s backward that cover a
    whole dim (one per key and value cache per layer)."""
    model, opt = gpt2()
    concrete = fxdp.trace_step(train_step, model, opt, ids(4, 16)).graph
    inst = symbolic[0].instantiate(ids(4, 16)).graph
    ops = lambda g: collections.Counter((n.target.name, n.target.overload) for n in g.nodes)  # noqa: E731
    assert ops(concrete) - ops(inst) == {("aten::slice", "Tensor"): 2 * CONFIG["n_layer"]}
    assert ops(inst) - ops(concrete) == {}


def test_a_dict_names_the_dynamic_dims():
    model, opt = gpt2()
    step = fxdp.trace_step(train_step, model, opt, ids(4, 16), dynamic={"input_ids": [0]})
    assert [(s.dim, s.hint) for s in step.graph.symbols] == [(0, 4)]
    step.instantiate(ids(3, 16))
    with pytest.raises(
        ShapeError,
        match=r"input 'input_ids' is 4x24: dim 1 is 24, but the trace has it static \(16",
    ):
        step.instantiate(ids(4, 24))
    with pytest.raises(
        TraceError,
        match=r"dynamic names \['mask'\], which are not inputs; the inputs are \['input_ids'\]",
    ):
        fxdp.trace_step(train_step, model, opt, ids(4, 16), dynamic={"mask": [0]})


@pytest.mark.parametrize("shape", [(5, 37), (3, 16)])
def test_the_python_instance_is_the_cpp_one(symbolic, tmp_path, shape):
    """TracedStep.instantiate mirrors analysis/ir/instantiate: ``fxdp expand G --shape`` of the
    symbolic graph and ``fxdp expand`` of the Python instance give the same rank graphs, byte for
    byte (2 uneven ranks at 5 rows)."""
    step = symbolic[0]
    step.save(tmp_path / "sym.pb")
    step.instantiate(ids(*shape)).save(tmp_path / "inst.pb")
    outs = []
    for name, extra in (("sym", ["--shape", f"input_ids={shape[0]}x{shape[1]}"]), ("inst", [])):
        (tmp_path / name).mkdir()
        cmd = [fxdp_binary("FXDP_BIN", "fxdp"), "expand", str(tmp_path / f"{name}.pb")]
        cmd += ["--world-size", "2", "-o", str(tmp_path / name / "g.pb"), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append({p.name: p.read_bytes() for p in sorted((tmp_path / name).iterdir())})
    assert outs[0] == outs[1] and len(outs[0]) == 2


def test_client_train_sends_the_symbolic_step_and_runs_every_shape(symbolic):
    """Client.train sends the symbolic graph as it is: a job of another shape than the trace's
    trains on 2 workers exactly as a concrete trace at that shape does, and one job of two shapes
    (4x24, then the traced 4x16) equals run_local per step (docs/shapes.md step 5)."""
    step = symbolic[0]
    model, opt = gpt2()
    concrete = fxdp.trace_step(train_step, model, opt, ids(4, 24))
    batches = [ids(4, 24, seed=s) for s in (7, 8)]
    mixed = [ids(4, 24, seed=7), ids(4, 16, seed=9)]
    state, want = step.initial_state(), []
    for i, b in enumerate(mixed, 1):
        state, loss = step.run_local(state, b, step=i)
        want.append(float(loss))
    with local_server(workers=2) as (address, _), fxdp.Client(address) as c:
        r, ref = c.train(step, 2, batches), c.train(concrete, 2, batches)
        assert r.losses == ref.losses
        for n, t in ref.state.items():
            assert torch.equal(r.state[n], t), n
        m = c.train(step, 2, mixed)
        assert m.losses == pytest.approx(want, rel=RTOL, abs=ATOL)
        assert [s.shape for s in c.job(m.job_id).shapes] == ["input_ids=4x16", "input_ids=4x24"]


# --------------------------------------------------------------------------- guards


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)


def net():
    torch.manual_seed(0)
    m = Net()
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def guarded_step(model, opt, batch):
    x = batch["x"]
    if x.shape[0] < 6:  # the guard
        loss = model(x).pow(2).mean()
    else:
        loss = model(x).abs().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def test_a_broken_guard_names_it_and_the_users_line():
    model, opt = net()
    step = fxdp.trace_step(guarded_step, model, opt, {"x": torch.randn(4, 8)}, dynamic={"x": [0]})
    (g,) = step.graph.guards
    assert "test_dynamic_shapes.py:" in g.source and "if x.shape[0] < 6:" in g.source
    step.instantiate({"x": torch.randn(5, 8)})
    with pytest.raises(ShapeError) as e:
        step.instantiate({"x": torch.randn(6, 8)})
    msg = str(e.value)
    with pytest.raises(
        ShapeError, match=r"input 'x': dim 0 is 1, the trace holds for 2\.\.5 \(x 1x8\)"
    ):
        step.instantiate({"x": torch.randn(1, 8)})
    assert "breaks the guard x.shape[0] < 6 (6 vs 6)" in msg and "if x.shape[0] < 6:" in msg
    assert "trace again with this batch as the example" in msg


def pinned_step(model, opt, batch):
    x = batch["x"] + torch.zeros(4, 1, 8)  # broadcasting pins x's batch dim to 4
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    return loss


def test_a_dim_the_step_pins_is_reported_and_checked():
    model, opt = net()
    x = {"x": torch.randn(4, 6, 8)}
    with pytest.warns(
        UserWarning,
        match=r"input 'x' dim 0 = 4: the step requires it \(.*test_dynamic_shapes.py:\d+: x = ",
    ):
        step = fxdp.trace_step(pinned_step, model, opt, x, dynamic={"x": [0, 1]})
    assert '"input": "x", "dim": 0, "value": 4' in step.metadata()["fxdp.specialized"]
    assert [(s.dim, s.hint) for s in step.graph.symbols] == [(1, 6)]
    step.instantiate({"x": torch.randn(4, 7, 8)})
    with pytest.raises(
        ShapeError, match=r"input 'x' is 5x6x8: dim 0 is 5, but the trace has it static \(4"
    ):
        step.instantiate({"x": torch.randn(5, 6, 8)})


def test_an_example_dim_of_size_one_stays_static_and_is_reported():
    model, opt = net()
    with pytest.warns(
        UserWarning, match=r"input 'x' dim 1 = 1: the example's size 1: sizes 0 and 1"
    ):
        step = fxdp.trace_step(
            plain_step, model, opt, {"x": torch.randn(4, 1, 8)}, dynamic={"x": [0, 1]}
        )
    assert [(s.dim, s.hint) for s in step.graph.symbols] == [(0, 4)]
    step.instantiate({"x": torch.randn(3, 1, 8)})
    with pytest.raises(
        ShapeError, match=r"input 'x' is 3x2x8: dim 1 is 2, but the trace has it static \(1"
    ):
        step.instantiate({"x": torch.randn(3, 2, 8)})


def plain_step(model, opt, batch):
    loss = model(batch["x"]).pow(2).mean()
    loss.backward()
    opt.step()
    return loss


def value_step(model, opt, batch):
    loss = model(batch["x"]).pow(2).mean()
    if loss > 1:  # data-dependent
        loss = loss * 2
    loss.backward()
    opt.step()
    return loss


def test_data_dependent_control_flow_is_a_trace_error_at_the_users_line():
    model, opt = net()
    with pytest.raises(
        TraceError, match=r"data-dependent control flow.*test_dynamic_shapes.py:\d+ \(if loss > 1:"
    ):
        fxdp.trace_step(value_step, model, opt, {"x": torch.randn(4, 8)}, dynamic=True)


def test_a_fake_layout_the_kernel_does_not_give_is_refused():
    """tracing_mode="auto" checks fxdp.layouts' unsure ops at the example's sizes; a symbolic trace
    cannot fall back to real tensors, so a difference is a TraceError naming the node."""
    from fxdp import zoo

    e = zoo.get("seqfirst")
    m = e.model(0)
    with pytest.raises(TraceError) as err:
        fxdp.trace(
            m, zoo.make_optimizer("adam", m), e.loss_fn, e.batch(0), batch_dim=e.batch_dim,
            input_names=e.input_names, loss_reduction=e.loss_reduction, dynamic=True,
        )  # fmt: skip
    msg = str(err.value)
    assert "node 'mse_loss_backward' (aten::mse_loss_backward) at backward of " in msg
    assert "FakeTensor says shape [5, 12, 4] strides [4, 20, 1]" in msg and "dynamic=False" in msg


def test_dynamic_with_a_model_on_the_meta_device_is_refused():
    """Symbolic tracing runs on FakeTensors made from the model's weights: a meta model (no weights)
    is refused by name, for every tracing_mode."""
    with torch.device("meta"):
        model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for mode in ("auto", "fake"):
        with pytest.raises(
            TraceError, match="this one is on the meta device: build it with weights"
        ):
            fxdp.trace_step(
                value_step, model, opt, {"x": torch.randn(4, 8)}, dynamic=True, tracing_mode=mode
            )


def test_dynamic_with_real_tracing_mode_is_refused():
    model, opt = net()
    with pytest.raises(TraceError, match="tracing_mode='real' runs one shape: use dynamic=False"):
        fxdp.trace_step(
            value_step, model, opt, {"x": torch.randn(4, 8)}, dynamic=True, tracing_mode="real"
        )


# --------------------------------------------------------------------------- micro-batches


def chunked_step(model, opt, batch):
    for part in batch["input_ids"].chunk(2):
        (model(input_ids=part, labels=part).loss / 2).backward()
    opt.step()
    opt.zero_grad()
    return torch.zeros(())


def test_micro_batches_give_floor_divisions_and_guards():
    """chunk(2) of a symbolic batch: sizes ``(B + 1) // 2`` and guards on the last chunk; 5 rows
    (3 + 2) run like eager, 2 rows (1 + 1: a chunk the trace assumed has 2 rows or more) are refused."""
    model, opt = gpt2()
    start = copy.deepcopy(model)
    step = fxdp.trace_step(chunked_step, model, opt, ids(4, 8), dynamic=True)
    g = step.graph
    assert any(e.op == pb.SIZE_OP_FLOORDIV for e in g.size_exprs) and g.guards
    batch = ids(5, 8, seed=3)
    new, _ = step.run_local(step.initial_state(), batch)
    ref, _ = eager(start, chunked_step, batch)
    for n, p in ref.named_parameters():
        torch.testing.assert_close(new[n], p.detach(), rtol=RTOL, atol=ATOL, msg=n)
    with pytest.raises(
        ShapeError,
        match=r"breaks the guard .*input_ids\.shape\[0\].* at .*test_dynamic_shapes.py:\d+",
    ):
        step.instantiate(ids(2, 8))


# --------------------------------------------------------------------------- the expression table


def test_an_expression_outside_the_table_is_refused_by_name():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    w = sizes.SizeWriter(ShapeEnv(), [])
    s = sympy.Symbol("s0", integer=True, positive=True)
    with pytest.raises(TraceError, match=r"node 'n': the size s0 is not a dim of any input"):
        w.expr(s, "node 'n'")
    w.symbol_of[s] = 0
    with pytest.raises(TraceError, match=r"node 'n': the size sqrt\(s0\) uses Pow.*dynamic=False"):
        w.expr(sympy.sqrt(s), "node 'n'")


def test_the_table_evaluates_with_pythons_floor_semantics():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.utils._sympy.functions import CeilDiv, FloorDiv, Mod

    w = sizes.SizeWriter(ShapeEnv(), [])
    s = sympy.Symbol("s0", integer=True)
    w.symbol_of[s] = 0
    g = pb.GraphDef()
    idx = [w.expr(e, "t") - 1 for e in (FloorDiv(s, 2), Mod(s, 3), CeilDiv(s, 4), -s + 1, s * s)]
    g.size_exprs.extend(w.table)
    for v in (-7, 5, 9):
        got = sizes.evaluate(g, [v])
        assert [got[i] for i in idx] == [v // 2, v % 3, -(-v // 4), 1 - v, v * v]
    g.size_exprs.add(op=pb.SIZE_OP_FLOORDIV, operands=[0, len(g.size_exprs) - 1])
    with pytest.raises(ValueError, match="divides by zero"):
        sizes.evaluate(g, [0])
