"""Checkpoints the workers write themselves (issue 27, docs/checkpoints.md): after every K-th step
each rank writes its part to DIR/step-K/rank-R-of-N.safetensors (FULLY_SHARD its flat shards,
REPLICATE the tensors spread over the ranks) and rank 0 the index fxdp-checkpoint.json; the server
names the newest complete one (JobInfo.checkpoint_path) and the workers keep the ``keep`` newest.
The parts put together equal the job's state bit for bit; the checkpoint of the last step is the
final state, which the server does not collect (FetchState names it, ``TrainResult.state`` reads
it); a directory outside the workers' data roots, through a link or over an existing file fails
the job naming the path and the rank."""

from __future__ import annotations

import json
import os
import subprocess

import fxdp
import grpc
import pytest
import torch
from _util import fxdp_binary, local_server, traced_mlp_adamw
from safetensors.torch import load_file, save_file

STEPS = 3


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 10, generator=g), torch.randn(6, 1, generator=g)) for _ in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    outside = tmp_path_factory.mktemp("outside")
    step = traced_mlp_adamw(batches(1)[0])
    with local_server(workers=3, extra_args=["--data-root", str(root)]) as (address, log):
        with fxdp.Client(address) as c:
            yield c, log, step, root, outside


def consolidated(step_dir):
    """Every tensor of the checkpoint in ``step_dir``, whole, from the parts its index lists."""
    index = json.loads((step_dir / "fxdp-checkpoint.json").read_text())
    files = [load_file(str(step_dir / f)) for f in index["files"]]
    out = {}
    for name, t in index["tensors"].items():
        parts = [files[f][name].reshape(-1) for f, b, e in t["parts"]]
        assert [e - b for _, b, e in t["parts"]] == [p.numel() for p in parts], name
        flat = torch.cat(parts) if parts else torch.empty(0)
        out[name] = flat.reshape(t["shape"])
    return index, out


def test_fully_shard_ranks_write_their_shards_and_keep_the_newest(setup):
    c, log, step, root, _ = setup
    ck = root / "fs"
    r = c.train(
        step,
        2,
        batches=batches(STEPS),
        style="fully_shard",
        checkpoints={"dir": str(ck), "every": 1, "keep": 2},
    )
    info = c.job(r.job_id)
    assert (info.checkpoint_step, info.checkpoint_path) == (3, str(ck / "step-3"))
    assert sorted(os.listdir(ck)) == ["step-2", "step-3"]  # step-1 removed (keep 2)
    for d in ("step-2", "step-3"):
        assert sorted(os.listdir(ck / d)) == [
            "fxdp-checkpoint.json",
            "rank-0-of-2.safetensors",
            "rank-1-of-2.safetensors",
        ]
    # The checkpoint of the last step is the final state: the server collected none.
    assert r.checkpoint == str(ck / "step-3") and not info.has_state
    assert isinstance(r.state, fxdp.checkpoints.CheckpointState)
    with pytest.raises(fxdp.ServerError) as e:
        c.fetch_state(r.job_id)
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"its final state is the checkpoint its workers wrote, {ck / 'step-3'}" in str(e.value)
    index, state = consolidated(ck / "step-3")
    assert (index["step"], index["world_size"], index["style"]) == (3, 2, "fully_shard")
    # FULLY_SHARD: a parameter's shards in both files (33 * 10 elements: 165 each).
    assert index["tensors"]["0.weight"]["parts"] == [[0, 0, 165], [1, 165, 330]]
    assert index["tensors"]["0.weight"]["role"] == "PARAMETER"
    assert sorted(state) == sorted(r.state)
    for n, t in r.state.items():
        assert torch.equal(state[n], t), n


def test_replicate_ranks_spread_the_tensors_after_the_last_step(setup):
    c, _, step, root, _ = setup
    ck = root / "rep"
    r = c.train(step, 3, batches=batches(STEPS), checkpoints={"dir": str(ck)})
    assert c.job(r.job_id).checkpoint_path == str(ck / "step-3")
    assert os.listdir(ck) == ["step-3"]  # every 0: after the last step only
    index, state = consolidated(ck / "step-3")
    held = [
        sum(1 for t in index["tensors"].values() if t["parts"] and t["parts"][0][0] == r_)
        for r_ in range(3)
    ]
    assert min(held) >= len(index["tensors"]) // 3, held  # each rank writes about a third
    for n, t in r.state.items():
        assert torch.equal(state[n], t), n


def test_bad_checkpoint_dirs_fail_the_job_naming_path_and_rank(setup):
    c, _, step, root, outside = setup
    (root / "link").symlink_to(outside)
    (root / "taken" / "step-1").mkdir(parents=True)
    (root / "taken" / "step-1" / "rank-1-of-2.safetensors").write_bytes(b"someone's")
    cases = [
        (
            str(outside / "ck"),
            grpc.StatusCode.PERMISSION_DENIED,
            "outside this worker's data roots",
        ),
        (str(root / "link" / "ck"), grpc.StatusCode.PERMISSION_DENIED, "symbolic link ('link')"),
        (str(root / "a" / ".." / "b"), grpc.StatusCode.INVALID_ARGUMENT, "'..' component"),
        (str(root / "taken"), grpc.StatusCode.ALREADY_EXISTS, "exists already"),
    ]
    for path, code, words in cases:
        with pytest.raises(fxdp.ServerError) as e:
            c.train(step, 2, batches=batches(1), checkpoints={"dir": path, "every": 1})
        assert e.value.code == code, (path, e.value)
        assert words in str(e.value) and "step 1" in str(e.value), (path, e.value)
        assert "rank" in str(e.value), e.value
    assert os.listdir(outside) == []
    assert (root / "taken" / "step-1" / "rank-1-of-2.safetensors").read_bytes() == b"someone's"
    with pytest.raises(fxdp.ServerError) as e:  # open-ended: no last step to write after
        c.train(step, 2, batches=iter(batches(1)), checkpoints={"dir": str(root / "x")})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "open-ended" in str(e.value)
    with pytest.raises(ValueError, match="unknown keys"):
        c.train(step, 2, batches=batches(1), checkpoints={"dir": "d", "evry": 1})


def test_fxdp_run_writes_checkpoints_and_prints_the_newest(setup, tmp_path):
    c, _, step, root, _ = setup
    step.save(str(tmp_path / "step.pb"))
    save_file(dict(step.initial_state()), str(tmp_path / "state.safetensors"))
    data = []
    for i, (x, y) in enumerate(batches(2)):
        data += ["--data", str(tmp_path / f"b{i}.safetensors")]
        save_file({n: t for n, t in zip(step.input_names(), (x, y))}, data[-1])
    ck = root / "cli"
    args = ["run", str(tmp_path / "step.pb"), "--server", c.address, "--world-size", "2"]
    args += ["--state", str(tmp_path / "state.safetensors"), *data, "--style", "fully_shard"]
    args += ["--checkpoint-dir", str(ck), "--checkpoint-every", "1", "--keep-checkpoints", "1"]
    p = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *args], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    assert f"checkpoint of step 2: {ck / 'step-2'} (on the workers)" in p.stdout, p.stdout
    assert os.listdir(ck) == ["step-2"]
    p = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "run", "x.pb", "--state", "s", "--data", "d"]
        + ["--keep-checkpoints", "2"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "need --checkpoint-dir" in p.stderr, p.stderr
    p = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *args, "--out", str(tmp_path / "out.safetensors")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and "--out with --checkpoint-dir" in p.stderr, p.stderr
