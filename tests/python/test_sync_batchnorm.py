"""Synchronized batch norm (``fxdp expand/run --sync-batchnorm``, ``Client.train(sync_batchnorm=
True)``): BatchNorm models trained data-parallel on real ``fxdp-worker`` processes (Gloo,
127.0.0.1) equal one device (``TracedStep.run_local`` on the full batches) after 3 steps on 3
different global batches: parameters, running statistics, num_batches_tracked, optimizer state
and per-step losses, all ranks bit-identical, for even and uneven splits (B=10 over N=3: 4,3,3;
over N=4: 3,3,2,2), with the loss reduced by mean (gradients scaled by the local batch, weighted
per rank; float32, rtol 1e-5, atol 1e-6) and by sum (float64, rtol 1e-9: see CASES). The default stays DDP's local statistics, and both
reports say which is in force.
"""

from __future__ import annotations

import json
import subprocess
from typing import Dict, List

import fxdp
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from _util import ATOL, RTOL, fxdp_binary, local_server, run_ranks, traced
from fxdp import zoo
from safetensors.torch import load_file, save_file

STEPS = 3
TIMEOUT_S = 60


class BNNet(nn.Module):
    """BatchNorm2d on [B, 4, 6, 6] and BatchNorm1d on [B, 8]; the layers before them have no
    bias (BatchNorm cancels it; its gradient would be rounding noise)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn2d = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 6 * 6, 8, bias=False)
        self.bn1d = nn.BatchNorm1d(8, momentum=0.3)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        x = F.relu(self.bn2d(self.conv(x)))
        return self.fc2(F.relu(self.bn1d(self.fc1(x.flatten(1)))))


def bn_batch(i: int, b: int = 10):
    g = torch.Generator().manual_seed(100 + i)
    # an offset and scale per channel, so the statistics are far from (0, 1)
    x = torch.randn(b, 3, 6, 6, generator=g) * torch.tensor([1.0, 3.0, 0.5]).view(1, 3, 1, 1) + 2.0
    return x, torch.randint(0, 3, (b,), generator=g)


def sum_ce(out, y):
    return F.cross_entropy(out, y, reduction="sum")


def bn_batches(dtype=torch.float32):
    return [(x.to(dtype), y) for x, y in (bn_batch(i) for i in range(STEPS))]


def trace_bnnet(loss: str, dtype=torch.float32) -> fxdp.TracedStep:
    torch.manual_seed(0)
    model = BNNet().to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss() if loss == "mean" else sum_ce
    return fxdp.trace(
        model, opt, loss_fn, bn_batches(dtype)[0], batch_dim=0, input_names=("x", "target")
    )


def expand(graph: str, world: int, out: str, sync: bool) -> dict:
    cmd = [
        fxdp_binary("FXDP_BIN", "fxdp"),
        "expand",
        graph,
        "--world-size",
        str(world),
        "-o",
        out,
        "--json",
    ] + (["--sync-batchnorm"] if sync else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def run_workers(tmp, step: fxdp.TracedStep, batches, world: int) -> dict:
    """fxdp expand --sync-batchnorm, then `world` fxdp-worker run processes for STEPS steps."""
    graph, state = str(tmp / "g.pb"), str(tmp / "s.safetensors")
    step.save(graph)
    step.to_safetensors(state)
    names = step.input_names()
    data = []
    for i, b in enumerate(batches):
        data.append(str(tmp / f"b{i}.safetensors"))
        save_file({n: t.contiguous() for n, t in zip(names, b)}, data[-1])
    report = expand(graph, world, str(tmp / "x.pb"), sync=True)
    uneven = len({s["size"] for s in report["slices"]}) > 1
    template = str(tmp / "x.rank{rank}.pb") if uneven else str(tmp / "x.pb")
    args = [
        fxdp_binary("FXDP_WORKER", "fxdp-worker"),
        "run",
        "--graph",
        template,
        "--state",
        state,
        "--steps",
        str(STEPS),
        "--out",
        str(tmp / "final{rank}.safetensors"),
        "--timeout",
        str(TIMEOUT_S),
        "--job",
        f"syncbn-n{world}",
    ]
    for d in data:
        args += ["--data", d]
    outs = run_ranks(args, world, tmp, TIMEOUT_S + 30)
    losses = [
        float(line.split()[3]) for line in outs[0][0].splitlines() if line.startswith("step ")
    ]
    return {
        "report": report,
        "losses": losses,
        "finals": [load_file(str(tmp / f"final{r}.safetensors")) for r in range(world)],
    }


def one_device(step: fxdp.TracedStep, batches):
    state, losses = step.initial_state(), []
    for b in batches:
        state, loss = step.run_local(state, b)
        losses.append(float(loss))
    return state, losses


def assert_equals_one_device(
    run: dict,
    ref_state: Dict[str, torch.Tensor],
    ref_losses: List[float],
    rtol: float = RTOL,
    atol: float = ATOL,
):
    finals = run["finals"]
    for r, f in enumerate(finals[1:], start=1):
        for k, v in finals[0].items():
            assert torch.equal(f[k], v), f"rank {r} differs from rank 0 on {k}"
    assert set(ref_state) <= set(finals[0])
    for k, want in ref_state.items():
        got = finals[0][k]
        assert got.dtype == want.dtype and got.shape == want.shape, k
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")
    # the worker prints losses with 8 significant digits
    torch.testing.assert_close(
        torch.tensor(run["losses"], dtype=torch.float64),
        torch.tensor(ref_losses, dtype=torch.float64),
        rtol=RTOL,
        atol=ATOL,
    )


# (loss reduction, dtype, rtol, atol). In float64 the rewrite is exact to rounding (1e-13 seen):
# that shows the math, including the weighting of uneven splits, is one device's. In float32
# the all-reduced partial sums round differently from one sum over the batch; with the loss
# reduced by sum the gradients are B=10 times larger and so is that rounding (1.6e-6 seen on a
# momentum buffer element of 0.04 at N=3), so the sum case is checked in float64.
CASES = {
    "mean-f32": ("mean", torch.float32, RTOL, ATOL),
    "sum-f64": ("sum", torch.float64, 1e-9, 1e-11),
}


@pytest.mark.parametrize("case", ["mean-f32", "sum-f64"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_bnnet_equals_one_device(tmp_path, world, case):
    loss, dtype, rtol, atol = CASES[case]
    step = trace_bnnet(loss, dtype)
    batches = bn_batches(dtype)
    run = run_workers(tmp_path, step, batches, world)
    assert run["report"]["batch_norm"] == "global"
    purposes = [c["purpose"] for c in run["report"]["collectives"]]
    # per BatchNorm: two all-reduces in forward (sum, then the sum of squared deviations), one in
    # backward (sum(dy), sum(dy * (x - mean)) packed) where the input needs a gradient
    assert sum(p.startswith("bn stats ") for p in purposes) == 2 * 2, purposes
    assert sum(p.startswith("bn grad ") for p in purposes) == 2, purposes
    ref_state, ref_losses = one_device(step, batches)
    assert_equals_one_device(run, ref_state, ref_losses, rtol, atol)
    # the running statistics moved (the check is not vacuous)
    assert not torch.allclose(ref_state["bn2d.running_var"], torch.ones(4, dtype=dtype))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_zoo_cnn_equals_one_device(tmp_path, world):
    """The zoo's BatchNorm cnn (AdamW), B=6: N=4 splits 2,2,1,1 (a rank with one sample: only the
    global statistics make its batch norm defined)."""
    step = traced("cnn", "adamw")
    e = zoo.get("cnn")
    batches = [e.batch(i) for i in range(STEPS)]
    run = run_workers(tmp_path, step, batches, world)
    ref_state, ref_losses = one_device(step, batches)
    assert_equals_one_device(run, ref_state, ref_losses)


def test_default_stays_local_and_reports_say_which(tmp_path):
    step = traced("cnn", "sgd")
    graph = str(tmp_path / "g.pb")
    step.save(graph)
    local = expand(graph, 2, str(tmp_path / "l.pb"), sync=False)
    sync = expand(graph, 2, str(tmp_path / "s.pb"), sync=True)
    assert local["batch_norm"] == "local" and sync["batch_norm"] == "global"
    assert any(c["purpose"].startswith("bn stats ") for c in sync["collectives"])
    assert not any(c["purpose"].startswith("bn ") for c in local["collectives"])
    # local statistics average the running statistics over ranks; global ones need nothing
    assert any(c["purpose"].startswith("sync bn.running") for c in local["collectives"])
    fxdp_bin = fxdp_binary("FXDP_BIN", "fxdp")
    table = subprocess.run(
        [
            fxdp_bin,
            "expand",
            graph,
            "--world-size",
            "2",
            "-o",
            str(tmp_path / "t.pb"),
            "--sync-batchnorm",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "batch norm statistics: global" in table
    for flag, word in (
        ([], "local batch statistics"),
        (["--sync-batchnorm"], "global batch statistics"),
    ):
        a = json.loads(
            subprocess.run(
                [fxdp_bin, "analyze", graph, "--json", *flag],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        bn = next(n for n in a["nodes"] if n["target"].startswith("aten::_native_batch_norm_legit"))
        assert word in bn["reason"], bn
        assert any(word in note for note in a["notes"]), a["notes"]


def test_client_and_cli_through_the_server(tmp_path):
    """Client.expand/train(sync_batchnorm=True) and `fxdp expand|run --sync-batchnorm --server`
    against `fxdp-server --local-workers 2`."""
    step = trace_bnnet("mean")
    batches = bn_batches()
    ref_state, ref_losses = one_device(step, batches)
    graph, state = str(tmp_path / "g.pb"), str(tmp_path / "s.safetensors")
    step.save(graph)
    step.to_safetensors(state)
    data = []
    for i, (x, y) in enumerate(batches):
        data += ["--data", str(tmp_path / f"b{i}.safetensors")]
        save_file({"x": x, "target": y}, data[-1])
    fxdp_bin = fxdp_binary("FXDP_BIN", "fxdp")
    with local_server(workers=2) as (address, log), fxdp.Client(address) as client:
        assert (
            client.expand(step, world_size=2, sync_batchnorm=True).report["batch_norm"] == "global"
        )
        assert client.expand(step, world_size=2).report["batch_norm"] == "local"
        a = client.analyze(step, world_size=2, sync_batchnorm=True)
        assert any("global batch statistics" in note for note in a["notes"])
        result = client.train(step, world_size=2, batches=batches, sync_batchnorm=True)
        local = client.train(step, world_size=2, batches=batches)
        r = subprocess.run(
            [
                fxdp_bin,
                "expand",
                graph,
                "--world-size",
                "3",
                "-o",
                str(tmp_path / "x.pb"),
                "--sync-batchnorm",
                "--json",
                "--server",
                address,
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["batch_norm"] == "global"
        r = subprocess.run(
            [
                fxdp_bin,
                "run",
                graph,
                "--world-size",
                "2",
                "--state",
                state,
                *data,
                "--sync-batchnorm",
                "--out",
                str(tmp_path / "final.safetensors"),
                "--server",
                address,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    torch.testing.assert_close(
        torch.tensor(result.losses), torch.tensor(ref_losses), rtol=RTOL, atol=ATOL
    )
    cli_final = load_file(str(tmp_path / "final.safetensors"))
    for k, want in ref_state.items():
        torch.testing.assert_close(
            result.state[k], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}"
        )
        torch.testing.assert_close(
            cli_final[k], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"fxdp run: {k}: {m}"
        )
    # DDP's local statistics give other running statistics (and losses)
    assert not torch.allclose(
        local.state["bn2d.running_var"], ref_state["bn2d.running_var"], rtol=1e-4
    )


class HFResNet(nn.Module):
    """Hugging Face transformers' ResNet from a tiny config (no weights): 6 BatchNorm2d layers
    (embedder, basic blocks, shortcut), returning the logits."""

    def __init__(self):
        super().__init__()
        from transformers import ResNetConfig, ResNetForImageClassification

        cfg = ResNetConfig(
            num_channels=3,
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            layer_type="basic",
            num_labels=3,
        )
        self.net = ResNetForImageClassification(cfg)

    def forward(self, x):
        return self.net(pixel_values=x).logits


def resnet_batch(i: int):
    g = torch.Generator().manual_seed(7 + i)
    return torch.randn(10, 3, 16, 16, generator=g), torch.randint(0, 3, (10,), generator=g)


@pytest.mark.parametrize("world", [2, 3])
def test_hf_resnet_equals_one_device(tmp_path, world):
    torch.manual_seed(0)
    model = HFResNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = [resnet_batch(i) for i in range(STEPS)]
    step = fxdp.trace(
        model, opt, nn.CrossEntropyLoss(), batches[0], batch_dim=0, input_names=("x", "target")
    )
    run = run_workers(tmp_path, step, batches, world)
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert n_bn == 6
    assert sum(c["purpose"].startswith("bn ") for c in run["report"]["collectives"]) == 3 * n_bn
    ref_state, ref_losses = one_device(step, batches)
    assert_equals_one_device(run, ref_state, ref_losses)


@pytest.mark.parametrize("world", [2, 3])
def test_fully_shard_with_sync_batchnorm_equals_one_device(world):
    """FULLY_SHARD and sync_batchnorm together (B=10: N=3 splits 4,3,3): the batch norms read
    their gathered weight and bias, and their gradients go to FULLY_SHARD's reduce-scatter. The
    rewrite used to read the rank's flat shard ("operands [8], [4] do not broadcast" at expand)."""
    step = trace_bnnet("mean")
    batches = bn_batches()
    ref_state, ref_losses = one_device(step, batches)
    with local_server(workers=world) as (address, log), fxdp.Client(address) as client:
        report = client.expand(
            step, world_size=world, sync_batchnorm=True, style="fully_shard"
        ).report
        assert report["batch_norm"] == "global"
        result = client.train(
            step, world_size=world, batches=batches, sync_batchnorm=True, style="fully_shard"
        )
    torch.testing.assert_close(
        torch.tensor(result.losses), torch.tensor(ref_losses), rtol=RTOL, atol=ATOL
    )
    for k, want in ref_state.items():
        torch.testing.assert_close(
            result.state[k], want, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}"
        )
