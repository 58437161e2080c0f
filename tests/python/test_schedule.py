"""fxdp.schedule: per-step hyper-parameter values (LR schedulers, callables, lists) and the file form."""

import json
import math

import pytest
import torch
from fxdp import schedule as S
from fxdp.optimizers import optimizer_hyperparameters
from fxdp.v1 import graph_pb2 as pb


def _graph(names):
    g = pb.GraphDef(format_version=pb.FORMAT_VERSION_1)
    for n in ["w"] + list(names) + ["x"]:
        node = g.nodes.add(name=n.replace(".", "_"), kind=pb.PLACEHOLDER)
        node.placeholder.state_name = n
        node.placeholder.role = (
            pb.HYPERPARAMETER
            if n.startswith("optim.")
            else (pb.INPUT if n == "x" else pb.PARAMETER)
        )
    return g


def _opt(**kw):
    m = torch.nn.Linear(3, 2)
    return torch.optim.AdamW(
        [{"params": [m.weight]}, {"params": [m.bias], "lr": 0.5}], lr=0.1, **kw
    )


def test_hyperparameter_names_in_graph_order():
    g = _graph(["optim.group0.lr", "optim.group0.beta1"])
    assert S.hyperparameter_names(g) == ["optim.group0.lr", "optim.group0.beta1"]


def test_optimizer_hyperparameters_split_betas_per_group():
    vals = optimizer_hyperparameters(_opt(betas=(0.8, 0.95), weight_decay=0.01))
    assert vals["optim.group0.beta1"] == 0.8 and vals["optim.group0.beta2"] == 0.95
    assert vals["optim.group1.lr"] == 0.5 and vals["optim.group0.weight_decay"] == 0.01


def test_scheduler_values_match_an_eager_loop_and_leave_the_scheduler_alone():
    def make():
        opt = _opt()
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=2)
        cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
        return opt, torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[2])

    names = ["optim.group0.lr", "optim.group1.lr"]
    opt, sched = make()
    vals = S.schedule_values(sched, 5, names)
    assert opt.param_groups[0]["lr"] == 0.1 * 0.25 and sched.last_epoch == 0  # restored
    eopt, esched = make()
    for i in range(5):
        assert vals[i] == {
            "optim.group0.lr": eopt.param_groups[0]["lr"],
            "optim.group1.lr": eopt.param_groups[1]["lr"],
        }
        eopt.step()
        esched.step()
    assert len({v["optim.group0.lr"] for v in vals}) == 5


def test_tensor_lr_is_read_as_float():
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(m.parameters(), lr=torch.tensor(0.01))
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.5)
    vals = S.schedule_values(sched, 3, ["optim.group0.lr"])
    assert [v["optim.group0.lr"] for v in vals] == pytest.approx([0.01, 0.005, 0.0025])


def test_callable_list_and_none():
    names = ["optim.group0.lr"]
    assert S.schedule_values(lambda s: {"optim.group0.lr": 0.1 * s}, 2, names) == [
        {"optim.group0.lr": 0.1},
        {"optim.group0.lr": 0.2},
    ]
    assert S.schedule_values([{"optim.group0.lr": 1}, {}], 2, names) == [
        {"optim.group0.lr": 1.0},
        {},
    ]
    assert S.schedule_values(None, 2, _graph(names)) == [{}, {}]


def test_bad_schedules_name_what_is_wrong():
    names = ["optim.group0.lr"]
    with pytest.raises(
        ValueError, match=r"step 2: 'optim.group0.momentum' is not a hyper-parameter"
    ):
        S.schedule_values([{}, {"optim.group0.momentum": 0.9}], 2, names)
    with pytest.raises(ValueError, match="lists 1 steps, the run has 3"):
        S.schedule_values([{}], 3, names)
    with pytest.raises(ValueError, match="step 1: value of 'optim.group0.lr' is nan"):
        S.schedule_values(lambda s: {"optim.group0.lr": math.nan}, 1, names)
    with pytest.raises(TypeError, match="ReduceLROnPlateau"):
        S.schedule_values(torch.optim.lr_scheduler.ReduceLROnPlateau(_opt()), 1, names)


def test_file_form_round_trips(tmp_path):
    vals = [
        {"optim.group0.lr": 0.1, "optim.group0.beta1": 0.9},
        {"optim.group0.lr": 0.05, "optim.group0.beta1": 0.8},
    ]
    p = tmp_path / "s.json"
    S.save_schedule(p, vals)
    assert json.loads(p.read_text()) == {
        "optim.group0.lr": [0.1, 0.05],
        "optim.group0.beta1": [0.9, 0.8],
    }
    assert S.load_schedule(p) == vals
    with pytest.raises(ValueError, match="same names on every step"):
        S.save_schedule(p, [{"optim.group0.lr": 0.1}, {}])
