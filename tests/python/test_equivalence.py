"""run_local of the traced graph for k steps == eager PyTorch training for k steps."""

import fxdp
import pytest
import torch
from _util import ATOL, MODELS, OPTIMS, RTOL, assert_state_matches, eager_steps, local_steps, traced
from fxdp import zoo


@pytest.mark.parametrize("optim", OPTIMS)
@pytest.mark.parametrize("model", MODELS)
def test_three_steps_match_eager(model, optim):
    step = traced(model, optim)
    state, losses = local_steps(step, model, 3)
    m, opt, eager_losses = eager_steps(model, optim, 3)
    for a, b in zip(losses, eager_losses):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    assert_state_matches(state, m, opt)


# optimizer variants: (model, optimizer, overrides)
VARIANTS = [
    ("mlp", "sgd", (("foreach", True),)),
    ("mlp", "sgd", (("foreach", False),)),
    ("mlp", "sgd", (("nesterov", True), ("foreach", True))),
    ("mlp", "sgd", (("nesterov", True), ("foreach", False), ("weight_decay", 0.01))),
    ("mlp", "sgd", (("momentum", 0.0), ("weight_decay", 0.05))),
    ("mlp", "sgd", (("maximize", True), ("foreach", True))),
    ("cnn", "sgd", (("foreach", True), ("weight_decay", 1e-3))),
    ("mlp", "adam", (("foreach", True),)),
    ("mlp", "adam", (("foreach", False), ("amsgrad", True))),
    ("mlp", "adam", (("foreach", True), ("amsgrad", True), ("weight_decay", 0.01))),
    ("mlp", "adam", (("betas", (0.8, 0.95)), ("eps", 1e-6), ("weight_decay", 0.1))),
    ("cnn", "adam", (("foreach", True),)),
    ("transformer", "adamw", (("foreach", True),)),
    ("mlp", "adamw", (("foreach", False), ("amsgrad", True))),
    ("mlp", "adamw", (("foreach", True), ("amsgrad", True), ("betas", (0.85, 0.99)))),
    ("seqfirst", "sgd", (("foreach", True), ("nesterov", True))),
]


@pytest.mark.parametrize(
    "model,optim,overrides", VARIANTS, ids=[f"{m}-{o}-{dict(v)}" for m, o, v in VARIANTS]
)
def test_optimizer_variants_match_eager(model, optim, overrides):
    step = traced(model, optim, overrides)
    state, losses = local_steps(step, model, 3)
    m, opt, eager_losses = eager_steps(model, optim, 3, overrides)
    for a, b in zip(losses, eager_losses):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)
    assert_state_matches(state, m, opt)


def test_foreach_flag_is_recorded():
    assert traced("mlp", "adam", (("foreach", True),)).metadata()["optimizer.foreach"] == "true"
    assert traced("mlp", "adam", (("foreach", False),)).metadata()["optimizer.foreach"] == "false"
    names = {n.target.name for n in traced("mlp", "adam", (("foreach", True),)).graph.nodes}
    assert any(x.startswith("aten::_foreach_") for x in names)
    names = {n.target.name for n in traced("mlp", "adam", (("foreach", False),)).graph.nodes}
    assert not any(x.startswith("aten::_foreach_") for x in names)


@pytest.mark.parametrize(
    "optim,overrides",
    [
        ("sgd", (("dampening", 0.3), ("foreach", True))),
        ("sgd", (("dampening", 0.3),)),
        ("adam", ()),
        ("sgd", ()),
    ],
)
def test_trace_against_existing_state(optim, overrides):
    """An optimizer that has already stepped is traced with its state as it is."""
    e = zoo.get("mlp")
    model, opt, _ = eager_steps("mlp", optim, 1, overrides)
    step = fxdp.trace(model, opt, e.loss_fn, e.batch(0), input_names=e.input_names)
    # continue eagerly and with the graph from the same point
    state = step.initial_state()
    for i in range(1, 4):
        state, loss = step.run_local(state, e.batch(i))
    m2, opt2, _ = eager_steps("mlp", optim, 3, overrides, warmup=1)
    assert_state_matches(state, m2, opt2)


def test_trace_leaves_model_and_optimizer_untouched():
    e = zoo.get("cnn")
    model = e.model(0)
    opt = zoo.make_optimizer("adam", model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    groups = [dict(g) for g in opt.param_groups]
    fxdp.trace(model, opt, e.loss_fn, e.batch(0))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert len(opt.state) == 0
    assert [dict(g) for g in opt.param_groups] == groups
    assert all(p.grad is None for p in model.parameters())


def test_frozen_parameter_and_parameter_outside_optimizer():
    e = zoo.get("mlp")
    model = e.model(0)
    model.fc1.bias.requires_grad_(False)
    opt = torch.optim.SGD([model.fc1.weight, model.fc2.weight], lr=0.1, momentum=0.9)
    step = fxdp.trace(model, opt, e.loss_fn, e.batch(0), input_names=e.input_names)
    state = step.initial_state()
    for i in range(3):
        state, _ = step.run_local(state, e.batch(i))
    m2 = e.model(0)
    m2.fc1.bias.requires_grad_(False)
    opt2 = torch.optim.SGD([m2.fc1.weight, m2.fc2.weight], lr=0.1, momentum=0.9)
    for i in range(3):
        b = e.batch(i)
        opt2.zero_grad()
        e.loss_fn(m2(b[0]), b[1]).backward()
        opt2.step()
    assert_state_matches(state, m2, opt2)
    specs = {s.state_name for s in step.output_node.output_specs}
    assert "fc1.bias" not in specs and "fc2.bias" not in specs  # not updated
    grads = {n.grad_of for n in step.graph.nodes if n.grad_of}
    assert grads == {
        "fc1.weight",
        "fc2.weight",
    }  # fc2.bias is not in the optimizer: no gradient computed


def test_batch_dim_per_input_and_replicated_input():
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(10, 5)

        def forward(self, x, scale):
            return self.fc(x) * scale

    torch.manual_seed(0)
    model = Scaled()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, scale, y = torch.randn(12, 10), torch.randn(5), torch.randn(12, 5)
    step = fxdp.trace(
        model, opt, torch.nn.MSELoss(), (x, scale, y), batch_dim=[0, -1, 0], num_model_inputs=2
    )
    from fxdp.v1 import graph_pb2 as pb

    dims = {
        n.placeholder.state_name: n.placeholder.batch_dim
        for n in step.placeholders
        if n.placeholder.role == pb.INPUT
    }
    assert dims == {"input.0": 0, "input.1": -1, "input.2": 0}
    state, loss = step.run_local(
        step.initial_state(), {"input.0": x, "input.1": scale, "input.2": y}
    )
    ref = torch.nn.functional.mse_loss(model(x, scale), y)
    torch.testing.assert_close(loss, ref)


def test_seqfirst_batch_dim_is_one():
    from fxdp.v1 import graph_pb2 as pb

    step = traced("seqfirst", "sgd")
    dims = [n.placeholder.batch_dim for n in step.placeholders if n.placeholder.role == pb.INPUT]
    assert dims == [1, 1]
    assert step.metadata()["batch_size"] == "12"


def test_fake_tracing_mode_gives_a_runnable_graph():
    e = zoo.get("mlp")
    model = e.model(0)
    opt = zoo.make_optimizer("adam", model)
    step = fxdp.trace(model, opt, e.loss_fn, e.batch(0), tracing_mode="fake")
    state, _ = local_steps(step, "mlp", 3)
    m, o, _ = eager_steps("mlp", "adam", 3)
    assert_state_matches(state, m, o)


def test_loss_fn_none_model_returns_loss():
    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(10, 5)

        def forward(self, x, y):
            return ((self.fc(x) - y) ** 2).sum()

    torch.manual_seed(0)
    model = WithLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x, y = torch.randn(12, 10), torch.randn(12, 5)
    step = fxdp.trace(model, opt, None, (x, y), loss_reduction="sum")
    assert step.metadata()["loss_reduction"] == "sum"
    state, loss = step.run_local(step.initial_state(), (x, y))
    torch.testing.assert_close(loss, model(x, y))


def test_tied_weights():
    """A parameter shared by two modules appears once (first name) and gets the summed gradient."""
    from fxdp.zoo.models import TransformerLM, lm_loss

    e = zoo.get("transformer")

    def make():
        torch.manual_seed(0)
        m = TransformerLM()
        m.head.weight = m.tok.weight
        return m

    model = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    step = fxdp.trace(model, opt, lm_loss, e.batch(0), input_names=e.input_names)
    assert "head.weight" not in step.state_names() and "tok.weight" in step.state_names()
    state, _ = local_steps(step, "transformer", 3)
    m2 = make()
    o2 = torch.optim.AdamW(m2.parameters(), lr=1e-2, foreach=True)
    for i in range(3):
        b = e.batch(i)
        o2.zero_grad()
        lm_loss(m2(b[0]), b[1]).backward()
        o2.step()
    assert_state_matches(state, m2, o2)
