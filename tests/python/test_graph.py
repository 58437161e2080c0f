"""Properties of the traced GraphDef: functional, roles complete, metadata exact."""

import operator

import fxdp
import pytest
import torch
from _util import MODELS, OPTIMS, output_node, placeholders, target_str, traced
from fxdp import convert, zoo
from fxdp.v1 import graph_pb2 as pb

CASES = [(m, o) for m in MODELS for o in OPTIMS]
# trailing underscore is part of these functional op names
FUNCTIONAL_UNDERSCORE = set()
VIEW_OPS = {
    "aten::view",
    "aten::reshape",
    "aten::_unsafe_view",
    "aten::expand",
    "aten::permute",
    "aten::transpose",
    "aten::t",
    "aten::select",
    "aten::slice",
    "aten::unsqueeze",
    "aten::squeeze",
}


@pytest.mark.parametrize("model,optim", CASES)
def test_graph_is_functional_aten(model, optim):
    g = traced(model, optim).graph
    for n in g.nodes:
        if n.kind != pb.CALL_FUNCTION:
            continue
        t = target_str(n)
        assert n.target.name != "aten::copy_", t
        assert (
            not n.target.name.endswith("_") or n.target.name in FUNCTIONAL_UNDERSCORE
        ), f"in-place op {t}"
        assert not n.target.overload.endswith("_"), f"in-place overload {t}"
        assert "out" not in n.target.overload.split("_"), f"out= overload {t}"
        assert n.target.name == "operator.getitem" or n.target.name.startswith(
            "aten::"
        ), f"non-aten op {t}"
        fn = convert.resolve_target(n.target.name, n.target.overload)
        if fn is not operator.getitem:
            for a in fn._schema.arguments:
                assert a.alias_info is None or not a.alias_info.is_write, f"{t} mutates {a.name}"
    assert not any(n.kind == pb.GET_ATTR for n in g.nodes)


@pytest.mark.parametrize("model,optim", CASES)
def test_roles_and_gradients_complete(model, optim):
    step = traced(model, optim)
    g = step.graph
    assert g.format_version == pb.FORMAT_VERSION_1
    assert g.producer == "fxdp-python 0.1.0"
    assert g.torch_version == torch.__version__
    meta = {kv.key: kv.value for kv in g.metadata}
    assert meta["loss_reduction"] in ("mean", "sum") and meta["model"] and meta["optimizer"]

    names = [n.name for n in g.nodes]
    assert len(set(names)) == len(names), "node names must be unique"
    phs = placeholders(g)
    by_name = {}
    for ph in phs:
        spec = ph.placeholder
        assert spec.role != pb.PLACEHOLDER_ROLE_UNSPECIFIED and spec.state_name, ph.name
        assert spec.state_name not in by_name, f"duplicate state name {spec.state_name}"
        by_name[spec.state_name] = ph
        assert ph.target.name == ph.name
        if spec.role == pb.INPUT:
            assert spec.batch_dim == -1 or 0 <= spec.batch_dim < len(ph.outputs[0].tensor.shape)
        else:
            assert spec.batch_dim == 0
        if spec.role == pb.OPTIMIZER_STATE:
            assert spec.state_name.startswith("optim.")
    # placeholders come first, then calls, output last
    kinds = [n.kind for n in g.nodes]
    assert kinds[-1] == pb.OUTPUT and kinds.count(pb.OUTPUT) == 1
    first_call = kinds.index(pb.CALL_FUNCTION)
    assert all(k == pb.PLACEHOLDER for k in kinds[:first_call])

    out = output_node(g)
    assert len(out.args) == 1 and out.args[0].WhichOneof("value") == "list"
    assert len(out.output_specs) == len(out.args[0].list.items)
    assert len(out.outputs) == 0
    matching = {
        pb.UPDATED_PARAMETER: pb.PARAMETER,
        pb.UPDATED_BUFFER: pb.BUFFER,
        pb.UPDATED_OPTIMIZER_STATE: pb.OPTIMIZER_STATE,
    }
    losses = 0
    updated = set()
    for spec, item in zip(out.output_specs, out.args[0].list.items):
        assert spec.role != pb.OUTPUT_ROLE_UNSPECIFIED
        assert item.WhichOneof("value") == "ref"
        if spec.role in matching:
            assert spec.state_name in by_name, spec.state_name
            assert by_name[spec.state_name].placeholder.role == matching[spec.role]
            assert spec.state_name not in updated
            updated.add(spec.state_name)
            src = g.nodes[item.ref.node].outputs[item.ref.output].tensor
            dst = by_name[spec.state_name].outputs[0].tensor
            assert list(src.shape) == list(dst.shape) and src.dtype == dst.dtype, spec.state_name
        elif spec.role == pb.LOSS:
            losses += 1
            assert list(g.nodes[item.ref.node].outputs[item.ref.output].tensor.shape) == []
    assert losses == 1
    # every trainable parameter is updated, every optimizer state tensor too
    for ph in phs:
        if ph.placeholder.role in (pb.PARAMETER, pb.OPTIMIZER_STATE):
            assert ph.placeholder.state_name in updated, ph.placeholder.state_name

    grad_nodes = {}
    for n in g.nodes:
        if n.grad_of:
            assert n.grad_of not in grad_nodes, f"two gradients for {n.grad_of}"
            grad_nodes[n.grad_of] = n
    for ph in phs:
        if ph.placeholder.role == pb.PARAMETER and ph.outputs[0].tensor.requires_grad:
            gn = grad_nodes.pop(ph.placeholder.state_name)
            assert list(gn.outputs[0].tensor.shape) == list(ph.outputs[0].tensor.shape)
            assert gn.kind == pb.CALL_FUNCTION
    assert (
        not grad_nodes
    ), f"grad_of names something that is not a trainable parameter: {list(grad_nodes)}"


@pytest.mark.parametrize("model,optim", CASES)
def test_references_and_value_meta(model, optim):
    g = traced(model, optim).graph

    def refs(a):
        w = a.WhichOneof("value")
        if w == "ref":
            yield a.ref
        elif w == "list":
            for x in a.list.items:
                yield from refs(x)

    for i, n in enumerate(g.nodes):
        args = list(n.args) + [kw.value for kw in n.kwargs]
        for a in args:
            assert a.WhichOneof("value") is not None, n.name
            for r in refs(a):
                assert r.node < i, f"{n.name} references a later node"
                assert r.output < len(g.nodes[r.node].outputs), n.name
        if n.kind == pb.OUTPUT:
            continue
        assert len(n.outputs) >= 1, n.name
        for vm in n.outputs:
            if vm.kind == pb.TENSOR:
                t = vm.tensor
                assert len(t.shape) == len(t.stride)
                assert (
                    t.dtype != pb.DTYPE_UNSPECIFIED
                    and t.device.type == pb.CPU
                    and t.device.index == -1
                )
            else:
                assert not vm.HasField("tensor")
        if n.target.name == "operator.getitem":
            assert n.target.overload == ""
            assert (
                n.args[0].WhichOneof("value") == "ref"
                and n.args[1].int_value == n.args[0].ref.output
            )
            src = g.nodes[n.args[0].ref.node]
            assert src.outputs[n.args[0].ref.output] == n.outputs[0]


@pytest.mark.parametrize("model,optim", CASES)
def test_recorded_layouts_match_execution(model, optim):
    """Every value's recorded shape/stride/dtype is what running the graph produces."""
    step = traced(model, optim)
    gm = step.graph_module()
    state = step.initial_state()
    batch = dict(zip(step.input_names(), zoo.get(model).batch(0)))
    args = [
        batch[p.placeholder.state_name]
        if p.placeholder.role == pb.INPUT
        else state[p.placeholder.state_name]
        for p in step.placeholders
    ]
    bad = []

    class Check(torch.fx.Interpreter):
        def run_node(self, n):
            r = super().run_node(n)
            vm = n.meta.get("fxdp_value_meta")
            if vm is not None and isinstance(r, torch.Tensor):
                t = vm.tensor
                if (
                    list(r.shape),
                    list(r.stride()),
                    r.storage_offset(),
                    convert.DTYPE_TO_PB[r.dtype],
                ) != (list(t.shape), list(t.stride), t.storage_offset, t.dtype):
                    bad.append(n.name)
            return r

    with torch.no_grad():
        Check(gm).run(*args)
    assert not bad, f"layout mismatch at {bad}"


def test_view_ops_are_kept():
    g = traced("transformer", "adam").graph
    names = {n.target.name for n in g.nodes}
    for op in (
        "aten::view",
        "aten::_unsafe_view",
        "aten::permute",
        "aten::transpose",
        "aten::t",
        "aten::expand",
    ):
        assert op in names, op
    assert not any(n.startswith("prims::") for n in names)


def test_batchnorm_buffers_are_updated_outputs():
    step = traced("cnn", "sgd")
    specs = {s.state_name: s.role for s in step.output_node.output_specs}
    for b in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        assert specs[b] == pb.UPDATED_BUFFER
    assert "aten::_native_batch_norm_legit_functional" in {n.target.name for n in step.graph.nodes}


def test_state_names_and_roles():
    step = traced("mlp", "adam", (("amsgrad", True),))
    roles = {p.placeholder.state_name: p.placeholder.role for p in step.placeholders}
    assert roles["fc1.weight"] == pb.PARAMETER
    for k in ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
        assert roles[f"optim.fc1.weight.{k}"] == pb.OPTIMIZER_STATE
    assert roles["x"] == pb.INPUT and roles["target"] == pb.INPUT
    assert list(step.initial_state()) == step.state_names()
    sgd = traced("mlp", "sgd")
    assert "optim.fc2.bias.momentum_buffer" in sgd.state_names()
    # parameter placeholders are trainable; others are not
    for p in step.placeholders:
        assert p.outputs[0].tensor.requires_grad == (p.placeholder.role == pb.PARAMETER)


def test_tensor_constants_are_lifted_to_constant_placeholders():
    class WithConst(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(10, 5)
            self.scale = torch.linspace(0.5, 1.5, 5)  # plain attribute, not a buffer

        def forward(self, x):
            return self.fc(x) * self.scale + torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])

    torch.manual_seed(0)
    model = WithConst()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(12, 10), torch.randn(12, 5)
    step = fxdp.trace(model, opt, torch.nn.MSELoss(), (x, y))
    consts = [p for p in step.placeholders if p.placeholder.role == pb.CONSTANT]
    assert consts and all(p.placeholder.state_name.startswith("const.") for p in consts)
    assert not any(n.kind == pb.GET_ATTR for n in step.graph.nodes)
    init = step.initial_state()
    assert all(p.placeholder.state_name in init for p in consts)
    state, loss = step.run_local(init, (x, y))
    torch.testing.assert_close(loss, torch.nn.functional.mse_loss(model(x), y))
    # CONSTANT placeholders precede the inputs
    roles = [p.placeholder.role for p in step.placeholders]
    assert roles.index(pb.CONSTANT) < roles.index(pb.INPUT)
