"""fxdp.trace_step: the user's own training step (backward, clipping, micro-batches, any torch.optim
optimizer, a learning-rate schedule, bf16) traced into one graph.

Every step function here is ordinary eager PyTorch, and the reference is that same function run
eagerly with a scheduler stepped after each step. Checked:

* run_local for 3 steps equals eager (rtol 1e-5, atol 1e-6) for every zoo model (AdamW,
  warmup + decay schedule, clip_grad_norm_ with a max_norm that binds, 2 micro-batches) and for
  every torch.optim optimizer with its options, foreach and single-tensor, on a small MLP;
* a tensor lr, named extra outputs, hyper-parameter guards;
* bf16: a step under torch.autocast("cpu", bfloat16) and a model kept in bf16 equal eager bf16
  training within bf16 tolerance;
* TraceErrors naming the user's line: control flow on a tensor value, GradScaler, LBFGS,
  optimizer.step() twice or never.

Data parallel (analysis, expansion, real workers): test_trace_step_workers.py.
"""

from __future__ import annotations

import fxdp
import pytest
import torch
import torch.nn as nn
from _trace_steps import (
    STEPS,
    O,
    _mlp,
    _mlp_batches,
    _mse,
    accumulating_step,
    assert_params,
    run_eager,
    run_eager_last,
    run_local_outputs,
    run_traced,
    warmup_decay,
)
from _util import ATOL, RTOL
from fxdp import schedule as S
from fxdp import zoo

# --------------------------------------------------------------------------- zoo x AdamW


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_zoo_step_with_schedule_clipping_and_micro_batches_matches_eager(name):
    e = zoo.get(name)
    train_step = accumulating_step(e.loss_fn, 2, 0.05, e.batch_dim)

    def make():
        m = e.model(0)
        o = O.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01)
        return m, o, warmup_decay(o)

    batches = [e.batch(i) for i in range(STEPS)]
    m, o, sched = make()
    step = fxdp.trace_step(
        train_step, m, o, batches[0], batch_dim=e.batch_dim, input_names=e.input_names
    )
    assert step.hyperparameter_names() == [
        "optim.group0.lr",
        "optim.group0.beta1",
        "optim.group0.beta2",
        "optim.group0.weight_decay",
    ]
    state, losses, values = run_traced(step, batches, sched)
    assert (
        len({v["optim.group0.lr"] for v in values}) == STEPS
    )  # the schedule changes lr every step
    m2, o2, s2 = make()
    want = run_eager(train_step, m2, o2, s2, batches)
    assert_params(state, m2)
    torch.testing.assert_close(torch.stack(losses), torch.stack(want), rtol=RTOL, atol=ATOL)


def test_clipping_binds_in_the_zoo_steps():
    for name in zoo.MODELS:
        e = zoo.get(name)
        m = e.model(0)
        x, y = e.batch(0)
        e.loss_fn(m(x), y).backward()
        norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
        assert norm > 0.5, (name, norm)


# --------------------------------------------------------------------------- every optimizer

OPTIMIZER_CASES = [
    (O.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01), False),
    (O.SGD, dict(lr=0.1, momentum=0.9, maximize=True), True),
    (O.Adam, dict(lr=0.01, amsgrad=True, weight_decay=0.01), True),
    (O.Adam, dict(lr=0.01, decoupled_weight_decay=True, weight_decay=0.1), False),
    (O.AdamW, dict(lr=0.01, weight_decay=0.1, maximize=True, betas=(0.8, 0.95)), False),
    (O.RMSprop, dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.01), True),
    (O.RMSprop, dict(lr=0.01, alpha=0.9), False),
    (
        O.Adagrad,
        dict(lr=0.1, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1),
        True,
    ),
    (O.Adagrad, dict(lr=0.1), False),
    (O.Adadelta, dict(lr=1.0, rho=0.8, weight_decay=0.01), True),
    (O.Adamax, dict(lr=0.01, weight_decay=0.01), False),
    (O.NAdam, dict(lr=0.01, weight_decay=0.01, momentum_decay=0.005), True),
    (O.NAdam, dict(lr=0.01, weight_decay=0.01, decoupled_weight_decay=True), False),
    (O.RAdam, dict(lr=0.01, weight_decay=0.01), True),
    (O.RAdam, dict(lr=0.01, weight_decay=0.01, decoupled_weight_decay=True), False),
    (O.ASGD, dict(lr=0.01, weight_decay=0.01, t0=1), True),
    (O.Rprop, dict(lr=0.01, etas=(0.4, 1.3)), False),
    (O.Rprop, dict(lr=0.01, maximize=True), True),
]


@pytest.mark.parametrize(
    "cls,kw,foreach",
    OPTIMIZER_CASES,
    ids=[
        f"{c.__name__}-{'-'.join(k for k in kw if k != 'lr') or 'default'}-"
        f"{'foreach' if f else 'single'}"
        for c, kw, f in OPTIMIZER_CASES
    ],
)
def test_every_optimizer_matches_eager(cls, kw, foreach):
    train_step = accumulating_step(_mse, 2, 0.05)

    def make():
        m = _mlp()
        o = cls(m.parameters(), foreach=foreach, **kw)
        return m, o, O.lr_scheduler.LambdaLR(o, lambda i: 1.0 / (i + 1))

    batches = _mlp_batches()
    m, o, sched = make()
    step = fxdp.trace_step(train_step, m, o, batches[0])
    assert step.metadata()["optimizer"] == cls.__name__
    assert step.metadata()["optimizer.foreach"] == ("true" if foreach else "false")
    state, losses, _ = run_traced(step, batches, sched)
    m2, o2, s2 = make()
    want = run_eager(train_step, m2, o2, s2, batches)
    assert_params(state, m2)
    torch.testing.assert_close(torch.stack(losses), torch.stack(want), rtol=RTOL, atol=ATOL)


def test_every_optimizer_in_the_table_is_tested():
    assert {c for c, _, _ in OPTIMIZER_CASES} == set(fxdp.SUPPORTED_OPTIMIZERS)


def test_tensor_lr_param_groups_and_autograd_grad():
    """A tensor lr, two param groups with their own lr, and autograd.grad assigned to .grad by hand."""

    def train_step(model, opt, batch):
        x, y = batch
        loss = _mse(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        for p, g in zip(model.parameters(), grads):
            p.grad = g
        opt.step()
        opt.zero_grad()
        return loss, {"pred": model(x)}

    def make():
        m = _mlp()
        o = O.Adam(
            [{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 0.05}],
            lr=torch.tensor(0.01),
        )
        return m, o, O.lr_scheduler.ExponentialLR(o, gamma=0.5)

    batches = _mlp_batches()
    m, o, sched = make()
    step = fxdp.trace_step(train_step, m, o, batches[0])
    assert {"optim.group0.lr", "optim.group1.lr"} <= set(step.hyperparameter_names())
    assert step.output_names() == ["pred"]
    values = S.schedule_values(sched, STEPS, step)
    assert values[1]["optim.group1.lr"] == pytest.approx(0.025)
    state, outs = run_local_outputs(step, batches, values)
    m2, out = run_eager_last(train_step, make, batches)
    assert_params(state, m2)
    torch.testing.assert_close(outs["pred"], out[1]["pred"].detach(), rtol=RTOL, atol=ATOL)


def test_two_losses_clip_grad_value_and_a_dict_batch():
    """Two forward passes and losses, backward on their sum, clip_grad_value_, a dict batch."""

    def train_step(model, opt, batch):
        opt.zero_grad()
        main = _mse(model(batch["x"]), batch["y"])
        aux = model(batch["x"] * 0.5).abs().mean()
        (main + 0.1 * aux).backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
        opt.step()
        return {"loss": main, "aux": aux}

    def make():
        m = _mlp()
        o = O.RMSprop(m.parameters(), lr=0.01, momentum=0.5)
        return m, o, O.lr_scheduler.StepLR(o, step_size=1, gamma=0.5)

    batches = [{"x": x, "y": y} for x, y in _mlp_batches()]
    m, o, sched = make()
    step = fxdp.trace_step(train_step, m, o, batches[0])
    assert step.input_names() == ["x", "y"] and step.output_names() == ["aux"]
    values = S.schedule_values(sched, STEPS, step)
    state, outs = run_local_outputs(step, batches, values)
    m2, want = run_eager_last(train_step, make, batches)
    assert_params(state, m2)
    torch.testing.assert_close(outs["aux"], want["aux"].detach(), rtol=RTOL, atol=ATOL)


def test_compile_decorator_trains_the_live_model_like_eager():
    """@fxdp.compile: traced on the first call, then the graph runs and writes the live model and
    optimizer back; an eager scheduler stepped between calls takes effect; eager steps can follow."""
    inner = accumulating_step(_mse, 2, 0.05)
    compiled = fxdp.compile()(inner)

    def make():
        m = _mlp()
        o = O.Adam(m.parameters(), lr=0.01, weight_decay=0.01)
        return m, o, warmup_decay(o)

    batches = _mlp_batches(n=4)
    m, o, sched = make()
    m2, o2, s2 = make()
    for i in range(STEPS):
        loss = compiled(m, o, batches[i])
        want = inner(m2, o2, batches[i])
        sched.step()
        s2.step()
        torch.testing.assert_close(loss, want, rtol=RTOL, atol=ATOL)
    assert (
        compiled.traced is not None
        and compiled.traced.hyperparameter_names()[0] == "optim.group0.lr"
    )
    inner(m, o, batches[3])  # eager continues from the state the graph wrote
    inner(m2, o2, batches[3])
    for (n, p), p2 in zip(m.named_parameters(), m2.parameters()):
        torch.testing.assert_close(p, p2, rtol=RTOL, atol=ATOL, msg=lambda msg: f"{n}: {msg}")
        for k, v in o2.state[p2].items():
            torch.testing.assert_close(o.state[p][k], v, rtol=RTOL, atol=ATOL)


def test_guards_refuse_values_that_change_the_code_path():
    m = _mlp()
    o = O.SGD(m.parameters(), lr=0.1, momentum=0.9)
    step = fxdp.trace_step(accumulating_step(_mse, 1, 1.0), m, o, _mlp_batches()[0])
    assert S.hyperparameter_guards(step) == {
        "optim.group0.momentum != 0": True,
        "optim.group0.weight_decay != 0": False,
    }
    with pytest.raises(
        ValueError,
        match=r"step 2: optim.group0.weight_decay = 0.1 makes "
        r"'optim.group0.weight_decay != 0' True",
    ):
        S.schedule_values([{}, {"optim.group0.weight_decay": 0.1}], 2, step)
    S.schedule_values([{"optim.group0.momentum": 0.5}], 1, step)  # same side: fine


# --------------------------------------------------------------------------- bf16


def test_autocast_bf16_step_matches_eager():
    train_step_fp32 = accumulating_step(_mse, 2, 0.05)

    def train_step(model, opt, batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return train_step_fp32(model, opt, batch)

    def make():
        m = _mlp()
        o = O.AdamW(m.parameters(), lr=1e-2)
        return m, o, warmup_decay(o)

    batches = _mlp_batches()
    m, o, sched = make()
    step = fxdp.trace_step(train_step, m, o, batches[0])
    ops = {n.target.name for n in step.graph.nodes}
    assert "aten::_to_copy" in ops  # autocast's casts are in the graph
    state, losses, _ = run_traced(step, batches, sched)
    m2, o2, s2 = make()
    want = run_eager(train_step, m2, o2, s2, batches)
    assert_params(state, m2, rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(torch.stack(losses), torch.stack(want), rtol=2e-2, atol=1e-3)


def test_bf16_model_matches_eager():
    train_step = accumulating_step(_mse, 2, 0.05)

    def make():
        m = _mlp().to(torch.bfloat16)
        o = O.Adam(m.parameters(), lr=1e-2)
        return m, o, warmup_decay(o)

    batches = [(x.bfloat16(), y.bfloat16()) for x, y in _mlp_batches()]
    m, o, sched = make()
    step = fxdp.trace_step(train_step, m, o, batches[0])
    assert step.initial_state()["optim.0.weight.exp_avg"].dtype == torch.bfloat16
    state, _, _ = run_traced(step, batches, sched)
    m2, o2, s2 = make()
    run_eager(train_step, m2, o2, s2, batches)
    assert_params(state, m2, rtol=2e-2, atol=2e-2)


def test_readme_training_loop():
    """The loop of client/python/README.md: AdamW, warmup + cosine, 4 micro-batches
    under bf16 autocast, clip_grad_norm_(..., 1.0): run_local equals eager."""

    def make():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 5))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.SequentialLR(
            opt,
            [
                torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=100),
                torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=900),
            ],
            milestones=[100],
        )
        return model, opt, sched

    def train_step(model, opt, batch):
        x, y = batch
        total = 0.0
        for xm, ym in zip(x.chunk(4), y.chunk(4)):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(xm), ym) / 4
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return total

    g = torch.Generator().manual_seed(2)
    batches = [
        (torch.randn(16, 8, generator=g), torch.randint(0, 5, (16,), generator=g))
        for _ in range(STEPS)
    ]
    model, opt, sched = make()
    step = fxdp.trace_step(train_step, model, opt, batches[0])
    state = step.initial_state()
    for i, b in enumerate(batches, start=1):
        state, loss = step.run_local(state, b, schedule=sched, step=i)
    m2, o2, s2 = make()
    want = run_eager(train_step, m2, o2, s2, batches)
    assert_params(state, m2, rtol=2e-2, atol=1e-3)
    torch.testing.assert_close(loss, want[-1], rtol=2e-2, atol=1e-3)


# --------------------------------------------------------------------------- errors


def _trace(train_step, opt_cls=O.SGD, **kw):
    m = _mlp()
    return fxdp.trace_step(train_step, m, opt_cls(m.parameters(), lr=0.1, **kw), _mlp_batches()[0])


def test_control_flow_on_a_tensor_names_the_users_line():
    def train_step(model, opt, batch):
        loss = _mse(model(batch[0]), batch[1])
        loss.backward()
        if loss > 1.0:  # the line the error names
            opt.step()
        return loss

    with pytest.raises(
        fxdp.TraceError,
        match=r"data-dependent control flow.*test_trace_step.py:\d+ " r"\(if loss > 1.0:",
    ):
        _trace(train_step)


def test_gradscaler_is_refused():
    def train_step(model, opt, batch):
        scaler = torch.amp.GradScaler("cpu")
        loss = _mse(model(batch[0]), batch[1])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    with pytest.raises(
        fxdp.TraceError, match=r"GradScaler cannot be traced.*inf/nan.*test_trace_step.py"
    ):
        _trace(train_step)


def test_lbfgs_is_refused():
    with pytest.raises(fxdp.TraceError, match=r"LBFGS re-evaluates a closure"):
        _trace(accumulating_step(_mse, 1, 1.0), O.LBFGS)


def test_step_twice_or_never():
    def twice(model, opt, batch):
        _mse(model(batch[0]), batch[1]).backward()
        opt.step()
        opt.step()
        return _mse(model(batch[0]), batch[1])

    def never(model, opt, batch):
        loss = _mse(model(batch[0]), batch[1])
        loss.backward()
        return loss

    with pytest.raises(
        fxdp.TraceError, match=r"more than once \(again at .*test_trace_step.py:\d+\)"
    ):
        _trace(twice)
    with pytest.raises(fxdp.TraceError, match="never calls optimizer.step"):
        _trace(never)


def test_tracing_leaves_model_and_optimizer_unchanged():
    m = _mlp()
    o = O.Adam(m.parameters(), lr=0.1)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    fxdp.trace_step(accumulating_step(_mse, 2, 0.05), m, o, _mlp_batches()[0])
    assert not o.state and "step" not in o.__dict__ and isinstance(o.param_groups[0]["lr"], float)
    assert all(p.grad is None and torch.equal(p, before[n]) for n, p in m.named_parameters())
    assert o.param_groups[0]["params"][0] is m[0].weight
