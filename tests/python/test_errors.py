"""Clear TraceErrors for what cannot be traced."""

import fxdp
import pytest
import torch
import torch.nn as nn
from fxdp import zoo


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 5)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:  # data-dependent control flow
            return y
        return -y


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(10, 10)
        self.branchy = Branchy()

    def forward(self, x):
        return self.branchy(self.pre(x))


class ItemUser(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 5)

    def forward(self, x):
        return self.fc(x) * x.abs().max().item()


def _batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(12, 10, generator=g), torch.randn(12, 5, generator=g)


@pytest.mark.parametrize("mode", ["auto", "real", "fake"])
def test_data_dependent_control_flow_names_the_module(mode):
    torch.manual_seed(0)
    model = Outer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(fxdp.TraceError) as ei:
        fxdp.trace(model, opt, nn.MSELoss(), _batch(), tracing_mode=mode)
    msg = str(ei.value)
    assert "data-dependent" in msg
    assert "'branchy'" in msg and "Branchy" in msg
    assert "test_errors.py" in msg  # the user's source line


def test_item_names_the_module_and_op():
    torch.manual_seed(0)
    model = ItemUser()
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(
        fxdp.TraceError, match=r"data-dependent.*'<root>' \(ItemUser\).*_local_scalar_dense"
    ):
        fxdp.trace(model, opt, nn.MSELoss(), _batch())


_GENERATED = {}
exec("def flip(x):\n    return x if x.sum() > 0 else -x\n", _GENERATED)  # code without a file


class GeneratedCodeUser(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 5)

    def forward(self, x):
        return self.fc(_GENERATED["flip"](x))


def test_control_flow_in_generated_code_names_the_users_line():
    """A branch on a tensor inside exec'd code (what a generated __init__ or forward is): the
    error names the user's line that called it, the generated frame after it (it named only
    '<string>:2 ()', issue 23)."""
    model = GeneratedCodeUser()
    with pytest.raises(fxdp.TraceError) as err:
        fxdp.trace(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.MSELoss(), _batch())
    msg = str(err.value)
    assert (
        "test_errors.py:" in msg
        and '(return self.fc(_GENERATED["flip"](x))) in <string>:2 at' in msg
    ), msg


def test_data_dependent_loss_is_rejected():
    torch.manual_seed(0)
    model = nn.Linear(10, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(out, y):
        return out[out > 0].sum()  # output shape depends on the data

    with pytest.raises(fxdp.TraceError, match="data-dependent"):
        fxdp.trace(model, opt, loss_fn, _batch())


@pytest.mark.parametrize("cls", [torch.optim.LBFGS, torch.optim.SparseAdam])
def test_unsupported_optimizer(cls):
    model = nn.Linear(10, 5)
    opt = cls(model.parameters(), lr=0.1)
    with pytest.raises(fxdp.TraceError, match=cls.__name__) as ei:
        fxdp.trace(model, opt, nn.MSELoss(), _batch())
    assert "SGD" in str(ei.value) and "RMSprop" in str(ei.value)


def test_unsupported_optimizer_options():
    model = nn.Linear(10, 5)
    with pytest.raises(fxdp.TraceError, match="fused"):
        fxdp.trace(model, torch.optim.Adam(model.parameters(), fused=True), nn.MSELoss(), _batch())
    with pytest.raises(fxdp.TraceError, match="dampening"):
        fxdp.trace(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5),
            nn.MSELoss(),
            _batch(),
        )
    with pytest.raises(fxdp.TraceError, match="tensor hyper-parameter 'eps'"):
        fxdp.trace(
            model,
            torch.optim.Adam(model.parameters(), eps=torch.tensor(1e-8)),
            nn.MSELoss(),
            _batch(),
        )


def test_mixed_devices_parameter_names_the_module():
    model = zoo.get("mlp").model(0)
    model.fc2.to("meta")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(
        fxdp.TraceError, match=r"mixed devices.*'fc2\.weight'.*module 'fc2' \(Linear\).*meta"
    ):
        fxdp.trace(model, opt, nn.MSELoss(), _batch())


def test_mixed_devices_input():
    model = zoo.get("mlp").model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch()
    with pytest.raises(fxdp.TraceError, match=r"mixed devices.*input 'input.1'.*meta"):
        fxdp.trace(model, opt, nn.MSELoss(), (x, y.to("meta")))


class MakesMeta(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(10, 5)

    def forward(self, x):
        return self.fc(x) + torch.ones(5, device="meta")


def test_mixed_devices_inside_forward_names_the_module():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), MakesMeta())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(fxdp.TraceError, match=r"module '1' \(MakesMeta\)"):
        fxdp.trace(model, opt, nn.MSELoss(), _batch())


def test_bad_arguments():
    model = nn.Linear(10, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(fxdp.TraceError, match="batch_dim 3 is out of range"):
        fxdp.trace(model, opt, nn.MSELoss(), _batch(), batch_dim=3)
    with pytest.raises(fxdp.TraceError, match="batch size"):
        x, y = _batch()
        fxdp.trace(model, opt, nn.MSELoss(), (x, y[:6]))
    with pytest.raises(fxdp.TraceError, match="scalar"):
        fxdp.trace(model, opt, nn.MSELoss(reduction="none"), _batch())
    other = nn.Linear(3, 3)
    with pytest.raises(fxdp.TraceError, match="not a parameter of the model"):
        fxdp.trace(model, torch.optim.SGD(other.parameters(), lr=0.1), nn.MSELoss(), _batch())


def test_batch_size_disagreement_names_the_inputs():
    model = nn.Linear(10, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch()
    with pytest.raises(fxdp.TraceError) as err:
        fxdp.trace(model, opt, nn.MSELoss(), (x, y[:6]), input_names=["x", "y"])
    assert f"6: 'y' (6, 5) dim 0; {x.shape[0]}: 'x' ({x.shape[0]}, 10) dim 0" in str(
        err.value
    ), err.value


def test_scheduler_stepped_inside_the_step_says_what_to_do():
    model = nn.Linear(10, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    def step(model, opt, batch):
        x, y = batch
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss

    with pytest.warns(UserWarning), pytest.raises(fxdp.TraceError) as err:
        fxdp.trace_step(step, model, opt, _batch())
    msg = str(err.value)
    assert "changes the hyper-parameter 'optim.group0.lr' in place" in msg, msg
    assert "scheduler.step() outside train_step" in msg and "schedule=" in msg, msg
    assert "survived functionalization" not in msg, msg


def test_run_local_checks_its_inputs_as_the_workers_do():
    torch.manual_seed(0)
    model = nn.Linear(64, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = fxdp.trace(
        model,
        opt,
        nn.MSELoss(),
        (torch.randn(128, 64), torch.randn(128, 2)),
        input_names=["x", "y"],
    )
    state = step.initial_state()
    with pytest.raises(ValueError) as err:
        step.run_local(state, (torch.randn(96, 64), torch.randn(96, 2)))
    assert "input 'x' is float32[96, 64], the graph's placeholder" in str(err.value), err.value
    assert (
        "declares float32[128, 64]: the step was traced with a batch of 128 (dim 0) and this batch has 96"
        in str(err.value)
    ), err.value
    with pytest.raises(
        ValueError, match=r"input 'x' is float64\[128, 64\], .* declares float32\[128, 64\]$"
    ):
        step.run_local(state, (torch.randn(128, 64, dtype=torch.float64), torch.randn(128, 2)))
    state["weight"] = torch.zeros(2, 63)
    with pytest.raises(
        ValueError, match=r"state 'weight' is float32\[2, 63\], .* declares float32\[2, 64\]$"
    ):
        step.run_local(state, (torch.randn(128, 64), torch.randn(128, 2)))
