"""Dataset directories (docs/datasets.md): ``fxdp.write_dataset`` writes an epoch's batches as
safetensors shards plus ``index.json``; the workers read each step's rows themselves, each rank only
its own, when the step runs. An epoch read from the directory trains equal to the same batches
streamed by the client (through the server) and to one batch file per step (``fxdp-worker run``),
on 2 and 3 ranks with uneven splits (7 rows: 4 + 3, 3 + 2 + 2); bad indexes and shards fail
naming the dataset, the shard, the tensor, the step and the rank."""

from __future__ import annotations

import json

import fxdp
import grpc
import pytest
import torch
from _util import expand_json, fxdp_binary, local_server, mse_step, run_worker_ranks
from safetensors.torch import load_file, save_file

ROWS, STEPS = 7, 5


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(ROWS, 6, generator=g), torch.randn(ROWS, 3, generator=g)) for _ in range(STEPS)
    ]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("datasets")
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    batches = _batches()
    step = fxdp.trace_step(mse_step, model, opt, batches[0], input_names=["x", "y"])
    # About two steps per shard (36 bytes a row): steps 2 and 4 start at row 7 of their shard.
    n = fxdp.write_dataset(d / "ds", batches, step=step, shard_mb=500 / 2**20)
    assert n == STEPS
    return {"dir": d, "step": step, "batches": batches}


def test_write_dataset_layout(data):
    index = json.loads((data["dir"] / "ds" / "index.json").read_text())
    assert index["fxdp_dataset"] == 1
    assert [s["rows"] for s in index["steps"]] == [[0, 7], [7, 14], [0, 7], [7, 14], [0, 7]]
    assert [s["file"] for s in index["steps"]][::2] == [
        f"shard-0000{i}.safetensors" for i in range(3)
    ]
    shard = load_file(str(data["dir"] / "ds" / "shard-00000.safetensors"))
    assert torch.equal(shard["x"][7:14], data["batches"][1][0])
    assert torch.equal(shard["y"][:7], data["batches"][0][1])


@pytest.mark.parametrize("world", [2, 3])
def test_worker_run_reads_a_dataset_like_batch_files(data, world, tmp_path):
    """`fxdp-worker run --data DIR` on expanded graphs equals `--data FILE` per step, bit for bit,
    and one device (run_local) to float tolerance."""
    step, d = data["step"], tmp_path
    step.save(str(d / "g.pb"))
    step.to_safetensors(str(d / "s.safetensors"))
    files = []
    for i, (x, y) in enumerate(data["batches"]):
        files.append(str(d / f"b{i}.safetensors"))
        save_file({"x": x, "y": y}, files[-1])
    _, graph = expand_json(fxdp_binary("FXDP_BIN", "fxdp"), str(d / "g.pb"), world, d / "x.pb")
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    (d / "a").mkdir()
    (d / "b").mkdir()
    ds = run_worker_ranks(
        worker,
        graph,
        str(d / "s.safetensors"),
        [str(data["dir"] / "ds")],
        world,
        STEPS,
        d / "a",
        "ds",
    )
    fs = run_worker_ranks(
        worker, graph, str(d / "s.safetensors"), files, world, STEPS, d / "b", "fs"
    )
    assert ds["losses"] == fs["losses"]
    for name, t in fs["finals"][0].items():
        for r in range(world):
            assert torch.equal(ds["finals"][r][name], t), (name, r)
    state, losses = step.initial_state(), []
    for b in data["batches"]:
        state, loss = step.run_local(state, b)
        losses.append(float(loss))
    assert ds["losses"] == pytest.approx(losses, rel=1e-5, abs=1e-6)
    for name, t in state.items():
        torch.testing.assert_close(ds["finals"][0][name], t, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def server(data):
    with (
        local_server(workers=3, extra_args=["--data-root", str(data["dir"])]) as (address, log),
        fxdp.Client(address) as c,
    ):
        yield c, log


@pytest.mark.parametrize("world", [2, 3])
def test_a_job_reads_a_dataset_like_streamed_batches(data, server, world):
    """Client.train(data_path=DIR) equals Client.train(batches=...) bit for bit: the same rows
    reach each rank, read by the rank from the shard instead of sliced by the server."""
    client, _ = server
    step = data["step"]
    streamed = client.train(step, world_size=world, batches=data["batches"])
    ds = client.train(step, world_size=world, data_path=data["dir"] / "ds", steps=STEPS)
    assert ds.losses == streamed.losses
    for name, t in streamed.state.items():
        assert torch.equal(ds.state[name], t), name


def _index(d, steps):
    d.mkdir(exist_ok=True)
    (d / "index.json").write_text(json.dumps({"fxdp_dataset": 1, "steps": steps}))
    return d


def test_bad_datasets_fail_naming_what_is_wrong(data, server):
    client, _ = server
    root, step = data["dir"], data["step"]
    x, y = data["batches"][0]
    (root / "noindex").mkdir()
    _index(root / "escape", [{"file": "../ds/shard-00000.safetensors", "rows": [0, 7]}])
    _index(root / "short", [{"file": "s.safetensors", "rows": [3, 10]}])
    save_file({"x": x, "y": y}, str(root / "short" / "s.safetensors"))
    _index(root / "noy", [{"file": "s.safetensors", "rows": [0, 7]}])
    save_file({"x": x}, str(root / "noy" / "s.safetensors"))
    _index(root / "wide", [{"file": "s.safetensors", "rows": [0, 7]}])
    save_file({"x": torch.zeros(7, 5), "y": y}, str(root / "wide" / "s.safetensors"))
    _index(root / "rows", [{"file": "s.safetensors", "rows": [0, 6]}])
    save_file({"x": x, "y": y}, str(root / "rows" / "s.safetensors"))
    (root / "notjson").mkdir()
    (root / "notjson" / "index.json").write_text("secret-password")
    cases = [  # (directory, status, what the error says)
        ("noindex", grpc.StatusCode.FAILED_PRECONDITION, "noindex/index.json' does not exist"),
        ("escape", grpc.StatusCode.INVALID_ARGUMENT, "steps[0].file is not a relative path"),
        ("short", grpc.StatusCode.INVALID_ARGUMENT, "tensor 'x' has 7 rows, fewer than 10"),
        (
            "noy",
            grpc.StatusCode.INVALID_ARGUMENT,
            "the shard has no tensor 'y' (the graph expects f32[",
        ),
        (
            "wide",
            grpc.StatusCode.INVALID_ARGUMENT,
            "tensor 'x' is f32[7, 5] in the shard; its rows must be f32[6]",
        ),
        (
            "rows",
            grpc.StatusCode.INVALID_ARGUMENT,
            "the step has 6 rows, of which this rank gets 3; its graph expects 4",
        ),
        ("notjson", grpc.StatusCode.INVALID_ARGUMENT, "not an fxdp dataset index (15 bytes"),
    ]
    for name, code, what in cases:
        with pytest.raises(fxdp.ServerError) as err:
            client.train(step, world_size=2, data_path=root / name, steps=1)
        msg = str(err.value)
        assert err.value.code == code, (name, msg)
        assert what in msg and "rank" in msg and str(root / name) in msg, (name, msg)
        assert "secret" not in msg, msg
    with pytest.raises(fxdp.ServerError, match="is a directory .* among 2 entries"):
        client.train(step, world_size=2, data_path=[root / "ds", root / "ds"], steps=1)


def test_a_resumed_dataset_job_reads_from_its_checkpoints_step(tmp_path):
    """A dataset job killed mid-run (server SIGKILL) resumes from its checkpoint (a multiple of 5,
    which is a multiple of the dataset's 11 steps only from 55 on) and reads the entries an uninterrupted run reads
    (the workers count steps from 1 again: they add the graph's fxdp.step_offset), ending equal to
    an uninterrupted run over batch files bit for bit."""
    import re

    from _util import (
        assert_same_run,
        batch_files,
        data_paths_requests,
        fetch,
        resumed_after_sigkill,
        traced,
    )
    from fxdp import zoo

    step = traced("mlp", "adamw")
    files = batch_files(tmp_path, "mlp", 11)
    fxdp.write_dataset(tmp_path / "ds", (zoo.get("mlp").named_batch(i) for i in range(11)))
    steps = 200
    with resumed_after_sigkill(
        tmp_path / "state",
        data_paths_requests(step, tmp_path / "ds", steps),
        23,
        "--checkpoint-every",
        "5",
    ) as (server, job, info, _):
        resumed = [line for line in server.log if "resumed from the checkpoint of step" in line]
        assert resumed, "".join(server.log)
        assert int(re.search(r"checkpoint of step (\d+)", resumed[0]).group(1)) > 0
        final = fetch(server.jobs, job)
        with fxdp.Client(server.address) as client:
            plain = client.train(step, world_size=2, data_path=files, steps=steps)
        assert_same_run(info.losses, final, plain)
