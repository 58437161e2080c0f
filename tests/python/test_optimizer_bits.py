"""The traced optimizer update equals eager torch.optim bit for bit (single-tensor groups on the CPU).

Eager's default (non-capturable, single-tensor) code computes the step-dependent numbers in Python
doubles (``bias_correction1 = 1 - beta1 ** step``, ``step_size = lr / bias_correction1``,
``bias_correction2 ** 0.5``, ``1 - lr * weight_decay``, ``1 - beta1``) and a float32 kernel rounds
each once; ``step`` and NAdam's ``mu_product`` are read as doubles (``.item()``); a number with a
0-d tensor (the update of a 0-d parameter) keeps the tensor's dtype; ``add(b, alpha=a)`` is one
fused multiply-add. The traced step computes the same numbers from float64 hyper-parameter
placeholders (fxdp.optimizers, "Exactness"), so ``run_local`` and a real ``fxdp-worker run`` (N=1,
the schedule fed per step) give eager's parameters and optimizer state exactly, every step, while a
schedule changes ``lr``. Before, the bias corrections were float32 (``0.999`` fed as float32,
``1 - 0.999f ** 3`` off by 6.6e-6 relative) and ``1 - beta1`` was ``1 - float32(0.9)``: 71% of an
MLP's AdamW values differed after one step, 95% after two.

Tolerance-level agreement of every optimizer (foreach, capturable paths): test_trace_step.py.
"""

from __future__ import annotations

import math
import subprocess

import fxdp
import pytest
import torch
import torch.nn as nn
from _util import fxdp_binary, run_ranks
from fxdp import schedule as S
from safetensors.torch import load_file, save_file

O = torch.optim
STEPS = 4

EXACT_CASES = [
    (O.AdamW, dict(lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95))),
    (O.AdamW, dict(lr=1e-2, amsgrad=True)),
    (O.Adam, dict(lr=1e-2, weight_decay=0.01)),  # coupled: grad.add(param, alpha=weight_decay)
    (O.Adam, dict(lr=1e-2, maximize=True, decoupled_weight_decay=True, weight_decay=0.1)),
    (O.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (O.RAdam, dict(lr=1e-2, weight_decay=0.01)),
    (O.Adamax, dict(lr=1e-2, weight_decay=0.01)),  # the default (non-capturable) path, as eager
    (O.NAdam, dict(lr=1e-2, weight_decay=0.01)),  # mu, mu_product: doubles as eager's .item()
    (O.RMSprop, dict(lr=1e-2, alpha=0.9, weight_decay=0.01)),
    (O.Adagrad, dict(lr=0.1, weight_decay=0.01, lr_decay=0.01)),
    (O.Rprop, dict(lr=1e-2)),
]


class _Model(nn.Module):
    """An MLP (1096 + 520 values) and a 0-d parameter, whose update runs on 0-d tensors."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 8))
        self.temperature = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.net(x) * self.temperature


def _make(cls, kw):
    torch.manual_seed(0)
    model = _Model()
    opt = cls(model.parameters(), foreach=False, **kw)
    warmup_cosine = O.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 2) * 0.5 * (1 + math.cos(math.pi * s / 8))
    )
    return model, opt, warmup_cosine


def _batches():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(12, 16, generator=g), torch.randn(12, 8, generator=g)) for _ in range(STEPS)
    ]


def _step(model, opt, batch):
    x, y = batch
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _eager_state(model, opt):
    """The model's parameters and the optimizer's state under fxdp's state names."""
    name = {id(p): n for n, p in model.named_parameters()}
    out = {n: p.detach() for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for k, v in st.items():
            out[f"optim.{name[id(p)]}.{k}"] = torch.as_tensor(v)
    return out


def _assert_equal(got, want, where):
    for n, w in want.items():
        g = got[n].to(w.dtype)
        differ = int((g != w).sum())
        assert differ == 0, (
            f"{where}: '{n}' differs from eager in {differ} of {w.numel()} values "
            f"(max abs {float((g.double() - w.double()).abs().max()):.3g})"
        )


def _traced(cls, kw):
    model, opt, _ = _make(cls, kw)
    return fxdp.trace_step(_step, model, opt, _batches()[0])


@pytest.mark.parametrize(
    "cls,kw", EXACT_CASES, ids=[f"{c.__name__}-{'-'.join(k)}" for c, k in EXACT_CASES]
)
def test_run_local_equals_eager_bit_for_bit_every_step(cls, kw):
    step = _traced(cls, kw)
    model, opt, sched = _make(cls, kw)
    state = step.initial_state()
    for i, batch in enumerate(_batches()):
        values = fxdp.optimizers.optimizer_hyperparameters(opt)
        state, _ = step.run_local(state, batch, hyperparameters=values)
        _step(model, opt, batch)
        sched.step()
        _assert_equal(state, _eager_state(model, opt), f"{cls.__name__} step {i + 1}")
    hyper = [ph for ph in step.placeholders if ph.placeholder.state_name.startswith("optim.group")]
    assert hyper and all(ph.outputs[0].tensor.dtype == fxdp.v1.graph_pb2.FLOAT64 for ph in hyper)


def test_one_worker_equals_eager_adamw_bit_for_bit_with_a_schedule(tmp_path):
    """A real `fxdp-worker run` at N=1 fed the float64 schedule: eager AdamW's state exactly."""
    cls, kw = EXACT_CASES[0]
    step = _traced(cls, kw)
    model, opt, sched = _make(cls, kw)
    values = S.schedule_values(sched, STEPS, step)
    assert len({v["optim.group0.lr"] for v in values}) == STEPS
    step.save(tmp_path / "g.pb")
    step.to_safetensors(tmp_path / "s.safetensors")
    S.save_schedule(tmp_path / "sched.json", values)
    fxdp_cli = fxdp_binary("FXDP_BIN", "fxdp")
    subprocess.run(
        [
            fxdp_cli,
            "expand",
            str(tmp_path / "g.pb"),
            "--world-size",
            "1",
            "-o",
            str(tmp_path / "x.pb"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    args = [fxdp_binary("FXDP_WORKER", "fxdp-worker"), "run", "--graph", str(tmp_path / "x.pb")]
    args += ["--state", str(tmp_path / "s.safetensors"), "--steps", str(STEPS), "--timeout", "60"]
    args += ["--schedule", str(tmp_path / "sched.json")]
    args += ["--out", str(tmp_path / "final{rank}.safetensors")]
    for i, (x, y) in enumerate(_batches()):
        save_file({"input.0": x, "input.1": y}, str(tmp_path / f"d{i}.safetensors"))
        args += ["--data", str(tmp_path / f"d{i}.safetensors")]
    run_ranks(args, 1, tmp_path)
    for batch in _batches():
        _step(model, opt, batch)
        sched.step()
    final = load_file(str(tmp_path / "final0.safetensors"))
    _assert_equal(final, _eager_state(model, opt), f"fxdp-worker N=1 after {STEPS} steps")
