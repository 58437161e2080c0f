"""Clear TraceErrors for what cannot be traced."""

import pytest
import torch
import torch.nn as nn

import fxdp
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


@pytest.mark.parametrize("mode", ["real", "fake"])
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
    with pytest.raises(fxdp.TraceError, match=r"data-dependent.*'<root>' \(ItemUser\).*_local_scalar_dense"):
        fxdp.trace(model, opt, nn.MSELoss(), _batch())


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
        fxdp.trace(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5),
                   nn.MSELoss(), _batch())
    with pytest.raises(fxdp.TraceError, match="tensor hyper-parameter 'eps'"):
        fxdp.trace(model, torch.optim.Adam(model.parameters(), eps=torch.tensor(1e-8)), nn.MSELoss(), _batch())


def test_mixed_devices_parameter_names_the_module():
    model = zoo.get("mlp").model(0)
    model.fc2.to("meta")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(fxdp.TraceError, match=r"mixed devices.*'fc2\.weight'.*module 'fc2' \(Linear\).*meta"):
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
