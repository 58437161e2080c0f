"""FULLY_SHARD jobs through fxdp-server (JobSpec.style, `fxdp run --style`, `Client.train(style=)`).

Starts ``fxdp-server --listen 127.0.0.1:0 --local-workers 3`` (real workers, as test_server_jobs.py):

* zoo mlp/AdamW on 2 and 3 workers and transformer/SGD-momentum on 3 (parameters of 5, 16, 23 and
  368 elements: not divisible by N, so the last ranks hold padding): the server splits the whole
  initial state into the ranks' shards, and the losses and the final state (whole tensors, from
  every rank's shards) equal one device and the same job under REPLICATE;
* cnn/AdamW (BatchNorm buffers, replicated) on 2 workers equals REPLICATE; `FetchState` in small
  chunks gives the whole tensors, in the order REPLICATE's does;
* `fxdp run --style fully_shard --out` writes the same whole tensors as `--style replicate`;
* JobInfo (and `fxdp job`) say the style; a sharded tensor of the wrong shape is INVALID_ARGUMENT
  naming it; an unknown style is refused naming the accepted ones (wire, CLI, Python client).
"""

from __future__ import annotations

import subprocess

import fxdp
import grpc
import pytest
import torch
from _util import (
    ATOL,
    RTOL,
    ServerProcess,
    assert_same_run,
    batch_files,
    data_paths_requests,
    fetch,
    fxdp_binary,
    local_steps,
    resumed_after_sigkill,
    traced,
)
from fxdp import zoo
from fxdp.v1 import compile_pb2 as cpb
from fxdp.v1 import jobs_pb2 as jpb
from safetensors.torch import load_file, save_file

MODEL, OPTIM = "mlp", "adamw"


@pytest.fixture(scope="module")
def server():
    with ServerProcess(workers=3) as s:
        yield fxdp.Client(s.address), s.jobs, s.address, s.log


def batches(n: int, model: str = MODEL):
    return [zoo.get(model).batch(i) for i in range(n)]


def assert_states_equal(got, want, what):
    assert list(got) == list(want), what
    for k, w in want.items():
        assert got[k].dtype == w.dtype and got[k].shape == w.shape, f"{what}: {k}"
        torch.testing.assert_close(
            got[k], w, rtol=RTOL, atol=ATOL, msg=lambda m: f"{what}: {k}: {m}"
        )


@pytest.mark.parametrize(
    "model,optim,world", [("mlp", "adamw", 2), ("mlp", "adamw", 3), ("transformer", "sgd", 3)]
)
def test_fully_shard_job_equals_one_device_and_replicate(server, model, optim, world):
    client = server[0]
    step, steps = traced(model, optim), 3
    fs = client.train(step, world_size=world, batches=batches(steps, model), style="fully_shard")
    rep = client.train(step, world_size=world, batches=batches(steps, model), style="replicate")
    ref, ref_losses = local_steps(step, model, steps)
    for a, b, want in zip(fs.losses, rep.losses, ref_losses):
        assert (
            abs(a - float(want)) <= RTOL * abs(float(want)) + ATOL
            and abs(a - b) <= 1e-6 * abs(b) + 1e-7
        )
    full = {k: v for k, v in step.initial_state().items()}
    assert_states_equal(fs.state, rep.state, "fully_shard vs replicate")
    assert_states_equal({k: fs.state[k] for k in ref}, ref, "fully_shard vs one device")
    assert {k: v.shape for k, v in fs.state.items()} == {k: v.shape for k, v in full.items()}
    info = client.job(fs.job_id)
    assert info.style == cpb.DATA_PARALLEL_STYLE_FULLY_SHARD and info.world_size == world
    # the expansion the job ran: what each rank held
    ex = client.expand(step, world, style="fully_shard")
    assert ex.style == "fully_shard" and {s.name for s in ex.sharded_state} >= {
        n for n in full if not n.startswith("optim.") and full[n].dim() > 0 and "running" not in n
    }
    for s in ex.sharded_state:
        assert (
            s.shard_numel == -(-full[s.name].numel() // world)
            and list(full[s.name].shape) == s.shape
        )


def test_buffers_stay_replicated_and_fetch_state_is_whole(server):
    client, jobs, _, _ = server
    step, steps = traced("cnn", "adamw"), 2
    fs = client.train(step, world_size=2, batches=batches(steps, "cnn"), style="fully_shard")
    rep = client.train(step, world_size=2, batches=batches(steps, "cnn"))
    assert_states_equal(fs.state, rep.state, "cnn fully_shard vs replicate")
    # FetchState itself, in 100-byte chunks: whole tensors, in the order REPLICATE's rank 0 sends
    assert_states_equal(fetch(jobs, fs.job_id, 100), fetch(jobs, rep.job_id, 100), "FetchState")


def test_fxdp_run_out_is_whole(server, tmp_path):
    _, _, address, _ = server
    step = traced("transformer", "sgd")
    step.save(tmp_path / "g.pb")
    step.to_safetensors(tmp_path / "s.safetensors")
    data = []
    for i in range(2):
        save_file(
            {n: t.contiguous() for n, t in zoo.get("transformer").named_batch(i).items()},
            str(tmp_path / f"d{i}.safetensors"),
        )
        data += ["--data", tmp_path / f"d{i}.safetensors"]
    outs = {}
    for style in ("fully_shard", "replicate"):
        out = tmp_path / f"{style}.safetensors"
        r = subprocess.run(
            [
                fxdp_binary("FXDP_BIN", "fxdp"),
                "run",
                tmp_path / "g.pb",
                "--world-size",
                "3",
                "--state",
                tmp_path / "s.safetensors",
                *data,
                "--style",
                style,
                "--out",
                out,
                "--server",
                address,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        outs[style] = load_file(str(out))
    assert_states_equal(outs["fully_shard"], outs["replicate"], "fxdp run --out")
    ref, _ = local_steps(step, "transformer", 2)
    assert_states_equal(
        {k: outs["fully_shard"][k] for k in ref}, ref, "fxdp run --out vs one device"
    )


def test_a_sharded_tensor_of_the_wrong_shape_is_refused(server):
    client = server[0]
    step = traced(MODEL, OPTIM)
    state = step.initial_state()
    state["fc1.weight"] = state["fc1.weight"].t().contiguous()  # [10, 16] for [16, 10]
    with pytest.raises(fxdp.ServerError) as e:
        client.train(step, world_size=2, batches=batches(1), state=state, style="fully_shard")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "initial state: tensor 'fc1.weight' is f32[10, 16], the graph's placeholder 'p_fc1_weight' declares "
        "f32[16, 10]"
    ) in str(e.value)


def test_job_info_says_the_style(server):
    client, _, address, _ = server
    r = client.train(traced(MODEL, OPTIM), world_size=2, batches=batches(1))
    info = client.job(r.job_id)
    assert info.style == cpb.DATA_PARALLEL_STYLE_REPLICATE
    out = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "job", r.job_id, "--server", address],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "style      replicate" in out.stdout


def test_unknown_style_is_refused_naming_the_accepted_ones(server, tmp_path):
    client, jobs, address, _ = server
    step = traced(MODEL, OPTIM)
    with pytest.raises(
        ValueError, match="unknown data-parallel style 'zero3'; accepted: replicate, fully_shard"
    ):
        client.train(step, world_size=2, batches=batches(1), style="zero3")
    spec = jpb.JobSpec(graph=step.graph, world_size=2, steps=1, num_state_tensors=0, style=9)
    with pytest.raises(grpc.RpcError) as e:
        list(jobs.Submit(iter([jpb.SubmitJobRequest(spec=spec)]), timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "JobSpec.style: unknown data-parallel style 9; accepted: 0 (DATA_PARALLEL_STYLE_REPLICATE"
        in e.value.details()
    )
    g = tmp_path / "g.pb"
    step.save(g)
    step.to_safetensors(tmp_path / "s.safetensors")
    out = subprocess.run(
        [
            fxdp_binary("FXDP_BIN", "fxdp"),
            "run",
            g,
            "--state",
            tmp_path / "s.safetensors",
            "--data",
            tmp_path / "s.safetensors",
            "--style",
            "zero3",
            "--server",
            address,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert (
        "--style: unknown data-parallel style 'zero3': expected 'replicate' or 'fully_shard'"
        in out.stderr
    )


def test_a_fully_shard_data_paths_job_resumes_from_its_checkpoint(tmp_path):
    """fxdp-server --state-dir --checkpoint-every 5 (test_durable_jobs.py's resume, under fully_shard):
    each checkpoint is every rank's shards reassembled into whole tensors, so a job killed mid-run
    (server SIGKILL) resumes after the restart and ends with the same final state and losses as an
    uninterrupted run. 200 steps (as test_durable_jobs): the ~5 ms steps after the kill point must
    outlast a test process descheduled between its polls on a loaded machine (60 steps left ~0.2 s)."""
    files = batch_files(tmp_path, MODEL, 3)
    step, steps = traced(MODEL, OPTIM), 200
    requests = data_paths_requests(step, files, steps, style=cpb.DATA_PARALLEL_STYLE_FULLY_SHARD)
    with resumed_after_sigkill(tmp_path / "state", requests, 13, "--checkpoint-every", "5") as (
        server,
        job,
        info,
        _,
    ):
        assert any("resumed from the checkpoint of step" in line for line in server.log), "".join(
            server.log
        )
        assert info.steps_done == steps
        final = fetch(server.jobs, job)
        with fxdp.Client(server.address) as client:
            plain = client.train(
                step, world_size=2, data_path=files, steps=steps, style="fully_shard"
            )
        assert_same_run(info.losses, final, plain)
