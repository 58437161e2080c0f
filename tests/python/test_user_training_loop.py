"""Acceptance (issues 13 and 14, "Done means"): a user's own transformer training loop, moved onto
fxdp without rewriting it, trains on N ranks exactly like one device.

The loop is what a Hugging Face user writes: a ``transformers`` GPT-2 built from a tiny config (no
weights, dropout off) computing its own LM loss (``model(input_ids=ids, labels=ids).loss``),
AdamW, warmup + cosine through ``torch.optim.lr_scheduler`` (``SequentialLR`` of ``LinearLR`` and
``CosineAnnealingLR``, and transformers' ``get_cosine_schedule_with_warmup``, which starts at lr = 0), 2 accumulation micro-batches
(``chunk``), ``clip_grad_norm_(..., 1.0)``, optionally bf16 autocast. It is traced with
``fxdp.trace_step`` and trained for 4 steps on 4 different global batches through a real
``fxdp-server --local-workers 2`` with ``fxdp.Client.train(..., schedule=scheduler)``; the
reference is the same ``train_step`` run eagerly with ``scheduler.step()`` after each step.

* float32: parameters, AdamW state and per-step losses equal one device at rtol 1e-5 / atol 1e-6
  (the attention key bias, whose gradient is zero and whose updates are rounding noise, at 1e-5).
* bf16 autocast: each rank runs its share of each micro-batch. Per-step losses equal eager DDP
  semantics on those rows (each rank's micro-batches in bf16 on a replica, gradients
  averaged, then clipping and AdamW) and one device at rtol 1e-3, step 1's loss bit for bit; the
  total parameter update is within 2% of eager DDP's and 10% of one device's (bf16 tolerance:
  see the test).
* transformers' ``get_cosine_schedule_with_warmup`` starts at lr = 0, where torch's capturable
  Adam path divides 0 by 0: the traced Adam/AdamW (single-tensor and foreach) equal eager there.
"""

from __future__ import annotations

import copy
import math

import fxdp
import pytest
import torch
from _tiny_gpt2 import CONFIG
from _util import ATOL, RTOL, local_server, mse_step

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

STEPS, ACCUM, B, S, V, WORLD = 4, 2, 8, 8, 64, 2
LR = 1e-3


def make(bf16: bool, hf_schedule: bool = False):
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**CONFIG))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    if hf_schedule:  # transformers' warmup + cosine (a LambdaLR): lr = 0 at step 1
        sched = transformers.get_cosine_schedule_with_warmup(
            opt, num_warmup_steps=2, num_training_steps=STEPS
        )
    else:
        sched = torch.optim.lr_scheduler.SequentialLR(
            opt,
            [
                torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=2),  # warmup
                torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS - 2),
            ],
            milestones=[2],
        )  # cosine

    def train_step(model, opt, batch):  # the user's eager step, unchanged
        total = 0.0
        for ids in batch["input_ids"].chunk(ACCUM):  # gradient accumulation
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=ids, labels=ids).loss / ACCUM
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return total

    return model, opt, sched, train_step


def batches():
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, V, (B, S), generator=g)} for _ in range(STEPS)]


def eager_one_device(bf16: bool, hf_schedule: bool = False):
    model, opt, sched, train_step = make(bf16, hf_schedule)
    losses = []
    for b in batches():
        losses.append(train_step(model, opt, b).item())
        sched.step()
    return model, opt, losses


def eager_ddp(bf16: bool):
    """fxdp's data parallelism on one process: each rank's share of each of the ACCUM micro-batches
    on a replica (analysis/ir/batch_split.h RankRows), the gradients averaged over ranks, then the
    user's clipping and AdamW on the averaged gradients."""
    model, opt, sched, train_step = make(bf16)
    losses = []
    for b in batches():
        ids = b["input_ids"]
        grads, total = [], 0.0
        for r in range(WORLD):
            replica = copy.deepcopy(model)
            for whole in ids.chunk(ACCUM):  # rank r holds its share of each micro-batch
                mb = whole[r * len(whole) // WORLD : (r + 1) * len(whole) // WORLD]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = replica(input_ids=mb, labels=mb).loss / ACCUM
                loss.backward()
                total += loss.detach() / WORLD
            grads.append([p.grad for p in replica.parameters()])
        for p, *gs in zip(model.parameters(), *grads):
            p.grad = sum(g / WORLD for g in gs)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(total.item())
    return model, opt, losses


@pytest.fixture(scope="module")
def server():
    with local_server(workers=WORLD) as (address, log):
        yield address, log


def train_on_server(address, bf16: bool, hf_schedule: bool = False):
    model, opt, sched, train_step = make(bf16, hf_schedule)
    lr0 = opt.param_groups[0]["lr"]
    step = fxdp.trace_step(train_step, model, opt, batches()[0])
    with fxdp.Client(address) as c:
        r = c.train(step, world_size=WORLD, batches=batches(), schedule=sched)
    # the user's model, optimizer and scheduler are untouched by tracing and training
    assert sched.last_epoch == 0 and opt.param_groups[0]["lr"] == lr0
    return r


# GPT-2's attention key bias has a gradient of exactly zero in exact arithmetic (q.(k + b) adds
# q.b to every key's score of one query, and softmax ignores a shift), so what AdamW does to it is
# rounding noise normalised by its own size: its ~1e-6 values depend on the order of the float sums
# that the CPU's kernels choose. Measured on one machine: 1.07e-6 apart from eager at both 8a6a11a
# and later commits (the suite passed at 1e-6 on an earlier session's machine). It alone is compared
# at KEY_BIAS_ATOL; every other element, its optimizer state included, at the test's tolerance.
KEY_BIAS_ATOL = 1e-5


def assert_close_except_key_bias(name, got, want, rtol, atol, what):
    if "attn.c_attn.bias" in name:
        e = want.shape[-1] // 3  # [q | k | v]
        torch.testing.assert_close(
            got[e : 2 * e],
            want[e : 2 * e],
            rtol=rtol,
            atol=KEY_BIAS_ATOL,
            msg=lambda m: f"{what}: {name} (key bias): {m}",
        )
        got, want = torch.cat([got[:e], got[2 * e :]]), torch.cat([want[:e], want[2 * e :]])
    torch.testing.assert_close(
        got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {name}: {m}"
    )


def assert_state_equals(state, model, opt, rtol, atol, what):
    names = {id(p): n for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        assert_close_except_key_bias(n, state[n], p.detach(), rtol, atol, what)
    for p, st in opt.state.items():
        for k, v in st.items():
            key = f"optim.{names[id(p)]}.{k}"
            want = v.to(state[key].dtype)
            if want.dim() == 0:
                torch.testing.assert_close(
                    state[key], want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {key}: {m}"
                )
            else:
                assert_close_except_key_bias(key, state[key], want, rtol, atol, what)


@pytest.mark.parametrize(
    "hf_schedule", [False, True], ids=["SequentialLR", "get_cosine_schedule_with_warmup"]
)
def test_fp32_loop_on_two_ranks_equals_one_device(server, hf_schedule):
    r = train_on_server(server[0], bf16=False, hf_schedule=hf_schedule)
    model, opt, losses = eager_one_device(bf16=False, hf_schedule=hf_schedule)
    assert all(math.isfinite(x) for x in r.losses)
    assert_state_equals(r.state, model, opt, RTOL, ATOL, "one device")
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(losses), rtol=RTOL, atol=ATOL)


def relative_update_error(state, model) -> float:
    """||fxdp's update - the reference's update|| / ||the reference's update|| over all parameters."""
    init, _, _, _ = make(bf16=False)
    init = dict(init.named_parameters())
    num = sum(((state[n] - p.detach()) ** 2).sum() for n, p in model.named_parameters())
    den = sum(((p.detach() - init[n].detach()) ** 2).sum() for n, p in model.named_parameters())
    return (num / den).sqrt().item()


def test_bf16_autocast_loop_on_two_ranks_equals_ddp_and_one_device(server):
    r = train_on_server(server[0], bf16=True)
    ddp, _, ddp_losses = eager_ddp(bf16=True)
    one, _, losses = eager_one_device(bf16=True)
    # bf16 rounds activations to 8 bits of mantissa: an fp32 rounding difference in the parameters
    # (AdamW's capturable path, the clip norm's summation order) moves single bf16 roundings from
    # step 2 on, and Adam turns them into sign flips of near-zero updates. Measured: the total
    # update is 0.5% off eager DDP and 3% off one device (one device in bf16 vs fp32: 4%).
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(ddp_losses), rtol=1e-3, atol=0)
    torch.testing.assert_close(torch.tensor(r.losses), torch.tensor(losses), rtol=1e-3, atol=0)
    assert (
        r.losses[0] == ddp_losses[0]
    )  # step 1 runs the same bf16 micro-batches on the same parameters
    assert relative_update_error(r.state, ddp) < 0.02
    assert relative_update_error(r.state, one) < 0.1


@pytest.mark.parametrize("cls", [torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("foreach", [False, True])
def test_warmup_from_lr_zero_leaves_zero_gradient_parameters_unchanged(cls, foreach):
    """transformers' get_cosine_schedule_with_warmup starts at lr = 0. torch's capturable Adam path
    divides by lr (0/0 = NaN where exp_avg_sq is 0, e.g. an unused token's embedding row); the
    traced step must give what eager gives: no NaN, the weight unchanged at lr = 0, then the
    same updates as eager for the following steps."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = cls(
        model.parameters(),
        lr=1e-2,
        weight_decay=0.1 if cls is torch.optim.AdamW else 0.0,
        foreach=foreach,
    )
    sched = transformers.get_cosine_schedule_with_warmup(
        opt, num_warmup_steps=2, num_training_steps=4
    )
    assert opt.param_groups[0]["lr"] == 0.0

    x = torch.randn(8, 4)
    x[:, 0] = 0  # the weight's column 0 gets an exactly-zero gradient
    batch = (x, torch.randn(8, 2))
    step = fxdp.trace_step(mse_step, model, opt, batch)
    state, traced = step.initial_state(), []
    for i in range(1, 4):
        state, _ = step.run_local(state, batch, schedule=sched, step=i)
        traced.append(state["weight"])
    w0 = model.weight.detach().clone()
    torch.testing.assert_close(traced[0], w0, rtol=0, atol=0)  # lr = 0: unchanged, as eager
    for i in range(3):
        mse_step(model, opt, batch)
        sched.step()
        torch.testing.assert_close(traced[i], model.weight.detach(), rtol=RTOL, atol=ATOL)
    assert not torch.equal(traced[-1], w0)
