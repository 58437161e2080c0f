"""A checkpoint the workers wrote, read back on another world size and style (issue 27,
docs/checkpoints.md): written by 2 FULLY_SHARD ranks after step 2, read by 1 REPLICATE rank and by 3
FULLY_SHARD ranks (each reading only its range of each tensor from the files that hold it), the
rest of the run equals an uninterrupted one; a checkpoint of another graph is refused naming the
tensor and both shapes."""

from __future__ import annotations

import re
import subprocess

import fxdp
import pytest
import torch
from _util import ATOL, RTOL, fxdp_binary, local_server, traced_mlp_adamw, wait_log
from safetensors.torch import load_file, save_file
from test_worker_checkpoints import batches

STEPS = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    step = traced_mlp_adamw(batches(1)[0])
    with local_server(workers=3, extra_args=["--data-root", str(root)]) as (address, log):
        with fxdp.Client(address) as c:
            whole = c.train(step, 2, batches=batches(STEPS), style="fully_shard")
            ck = root / "ck"
            first = c.train(
                step,
                2,
                batches=batches(STEPS)[:2],
                style="fully_shard",
                checkpoints={"dir": str(ck), "every": 1},
            )
            yield c, log, step, ck, whole, first


@pytest.mark.parametrize("style,world", [("replicate", 1), ("fully_shard", 3), ("replicate", 2)])
def test_resumed_on_another_world_size_and_style_equals_an_uninterrupted_run(setup, style, world):
    c, log, step, ck, whole, first = setup
    plan = fxdp.initial_checkpoint(step, ck / "step-2" / "fxdp-checkpoint.json")
    assert not plan.sent and not plan.fills and len(plan.tensors) == len(whole.state)
    r = c.train(step, world, batches=batches(STEPS)[2:], style=style, initial_checkpoint=plan)
    losses = first.losses + r.losses
    torch.testing.assert_close(
        torch.tensor(losses), torch.tensor(whole.losses), rtol=RTOL, atol=ATOL
    )
    assert sorted(r.state) == sorted(whole.state)
    for n, t in whole.state.items():
        torch.testing.assert_close(r.state[n], t, rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}")
    text = wait_log(log, [rf"\[job {r.job_id} rank {world - 1}\b.*initial_checkpoint"])
    got, listed = map(
        int,
        re.findall(
            rf"\[job {r.job_id} rank 0\b.*initial_checkpoint .*\((\d+) of their (\d+) bytes", text
        )[-1],
    )
    # REPLICATE reads every byte; FULLY_SHARD each rank its flat shard's (the whole small tensors).
    assert got == listed if style == "replicate" else got < listed // 2, (got, listed)


def test_a_checkpoint_from_another_graph_is_refused_naming_the_tensor(setup):
    c, _, _, ck, _, _ = setup
    other = traced_mlp_adamw(batches(1)[0], hidden=34)
    plan = fxdp.initial_checkpoint(other, ck / "step-2")
    with pytest.raises(fxdp.ServerError) as e:
        c.train(other, 2, batches=batches(1), initial_checkpoint=plan)
    assert "f32[33, 10], the graph expects f32[34, 10]" in str(e.value), e.value
    assert "rank" in str(e.value)


def test_fxdp_run_initial_checkpoint_reads_the_whole_state_on_the_workers(setup, tmp_path):
    c, _, step, ck, whole, _ = setup
    step.save(str(tmp_path / "step.pb"))
    args = ["run", str(tmp_path / "step.pb"), "--server", c.address, "--world-size", "2"]
    for i, (x, y) in enumerate(batches(STEPS)[2:]):
        save_file(dict(zip(step.input_names(), (x, y))), str(tmp_path / f"b{i}.safetensors"))
        args += ["--data", str(tmp_path / f"b{i}.safetensors")]
    args += ["--initial-checkpoint", str(ck / "step-2"), "--out", str(tmp_path / "out.safetensors")]
    p = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *args], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    out = load_file(str(tmp_path / "out.safetensors"))
    assert sorted(out) == sorted(whole.state)
    for n, t in whole.state.items():
        torch.testing.assert_close(out[n], t, rtol=RTOL, atol=ATOL, msg=lambda m: f"{n}: {m}")
