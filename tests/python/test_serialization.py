"""save/load, safetensors, zoo export, and the GraphDef -> FX converter."""

import fxdp
import pytest
import torch
from _util import MODELS, traced
from fxdp import convert, zoo
from fxdp.v1 import graph_pb2 as pb
from safetensors.torch import load_file


@pytest.mark.parametrize("model", MODELS)
def test_save_load_roundtrip(tmp_path, model):
    step = traced(model, "adamw")
    path = tmp_path / "g.pb"
    step.save(path)
    data = path.read_bytes()
    assert data == step.graph.SerializeToString()
    loaded = fxdp.load(path)
    assert loaded.graph == step.graph
    assert loaded.graph.SerializeToString() == data
    batch = zoo.get(model).batch(1)
    s1, l1 = step.run_local(step.initial_state(), batch)
    s2, l2 = loaded.run_local(step.initial_state(), batch)
    assert torch.equal(l1, l2)
    for k in s1:
        assert torch.equal(s1[k], s2[k]), k


def test_safetensors_same_names_and_values(tmp_path):
    step = traced("cnn", "adam")
    path = tmp_path / "s.safetensors"
    step.to_safetensors(path)
    loaded = load_file(str(path))
    init = step.initial_state()
    assert set(loaded) == set(init) == set(step.state_names())
    for k, v in init.items():
        assert torch.equal(loaded[k], v), k
    # fxdp.load picks up the sibling safetensors file
    step.save(tmp_path / "s.pb")
    again = fxdp.load(tmp_path / "s.pb")
    assert list(again.initial_state()) == step.state_names()
    state, loss = again.run_local(again.initial_state(), zoo.get("cnn").batch(0))
    assert loss.dim() == 0


def test_load_without_state_has_no_initial_state(tmp_path):
    step = traced("mlp", "sgd")
    step.save(tmp_path / "only.pb")
    g = fxdp.load(tmp_path / "only.pb")
    with pytest.raises(fxdp.GraphFormatError):
        g.initial_state()
    g.run_local(step.initial_state(), zoo.get("mlp").batch(0))


def test_zoo_export(tmp_path):
    from fxdp.zoo import export

    assert export.main([str(tmp_path), "--models", "mlp,seqfirst", "--optims", "sgd"]) == 0
    for m in ("mlp", "seqfirst"):
        assert (tmp_path / f"{m}_sgd.pb").exists()
        st = load_file(str(tmp_path / f"{m}_sgd.safetensors"))
        assert set(st) == set(traced(m, "sgd").state_names())
        assert (tmp_path / f"{m}_sgd.pb").read_bytes() == traced(m, "sgd").graph.SerializeToString()


def _node(g, name, kind, target="", overload=""):
    n = g.nodes.add()
    n.name = name
    n.kind = kind
    n.target.name = target or name
    n.target.overload = overload
    return n


def _tensor_out(n, shape, dtype=pb.FLOAT32):
    vm = n.outputs.add()
    vm.kind = pb.TENSOR
    vm.tensor.shape.extend(shape)
    vm.tensor.dtype = dtype
    return vm


def test_converter_handles_general_graphs():
    """Multi-output refs without getitem, kwargs, dtype/device/list/scalar/none arguments."""
    g = pb.GraphDef()
    g.format_version = pb.FORMAT_VERSION_1
    x = _node(g, "x", pb.PLACEHOLDER)
    x.placeholder.role = pb.INPUT
    x.placeholder.state_name = "x"
    # 1: split x into 2 chunks along dim 0 (Tensor[] result)
    sp = _node(g, "split", pb.CALL_FUNCTION, "aten::split", "Tensor")
    sp.args.add().ref.node = 0
    sp.args.add().int_value = 2
    sp.args.add().int_value = 0
    # 2: add(chunk1, chunk0, alpha=Scalar 2) referencing the list elements directly
    ad = _node(g, "add", pb.CALL_FUNCTION, "aten::add", "Tensor")
    a0 = ad.args.add().ref
    a0.node, a0.output = 1, 1
    a1 = ad.args.add().ref
    a1.node, a1.output = 1, 0
    kw = ad.kwargs.add()
    kw.name = "alpha"
    kw.value.scalar.int_value = 2
    # 3: _to_copy(add, dtype=float64, device=cpu, layout=strided, memory_format=None->none)
    tc = _node(g, "to", pb.CALL_FUNCTION, "aten::_to_copy")
    tc.args.add().ref.node = 2
    for name, setter in (
        ("dtype", lambda v: setattr(v, "dtype", pb.FLOAT64)),
        ("layout", lambda v: setattr(v, "layout", pb.STRIDED)),
        ("memory_format", lambda v: v.none.SetInParent()),
    ):
        k = tc.kwargs.add()
        k.name = name
        setter(k.value)
    k = tc.kwargs.add()
    k.name = "device"
    k.value.device.type = pb.CPU
    k.value.device.index = -1
    # 4: sum over a list of dims
    sm = _node(g, "sum", pb.CALL_FUNCTION, "aten::sum", "dim_IntList")
    sm.args.add().ref.node = 3
    lst = sm.args.add().list
    lst.items.add().int_value = 0
    sm.args.add().bool_value = True
    # 5: getitem of the split, 6: output
    gi = _node(g, "getitem", pb.CALL_FUNCTION, "operator.getitem")
    r = gi.args.add().ref
    r.node, r.output = 1, 1
    gi.args.add().int_value = 1
    out = _node(g, "output", pb.OUTPUT)
    items = out.args.add().list
    for i in (4, 5):
        items.items.add().ref.node = i
    out.output_specs.add().role = pb.OTHER
    out.output_specs.add().role = pb.OTHER
    gm = convert.graphdef_to_fx(g)
    xv = torch.arange(8.0).reshape(4, 2)
    s, second = gm(xv)
    c0, c1 = xv.split(2)
    torch.testing.assert_close(s, (c1 + 2 * c0).double().sum(0, keepdim=True))
    assert torch.equal(second, c1)


def test_converter_rejects_unknown_ops():
    g = pb.GraphDef()
    _node(g, "bad", pb.CALL_FUNCTION, "aten::definitely_not_an_op")
    with pytest.raises(fxdp.GraphFormatError, match="definitely_not_an_op"):
        convert.graphdef_to_fx(g)
