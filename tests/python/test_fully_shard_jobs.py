"""FULLY_SHARD jobs through fxdp-server (JobSpec.style, `fxdp run --style`, `Client.train(style=)`).

Starts ``fxdp-server --listen 127.0.0.1:0 --local-workers 3`` (as test_server_jobs.py) and checks
the style's surface: the style a job was submitted with is in its JobInfo (and `fxdp job`), an
unknown style is refused naming the accepted ones (the wire, the CLI and the Python client).
"""

from __future__ import annotations

import subprocess

import grpc
import pytest

import fxdp
from _util import fxdp_binary, local_server, traced
from fxdp import zoo
from fxdp.v1 import compile_pb2 as cpb
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import jobs_pb2_grpc as jgrpc

MODEL, OPTIM = "mlp", "adamw"


@pytest.fixture(scope="module")
def server():
    with local_server(workers=3) as (address, log):
        ch = grpc.insecure_channel(address)
        yield fxdp.Client(address), jgrpc.JobServiceStub(ch), address, log
        ch.close()


def batches(n: int):
    return [zoo.get(MODEL).batch(i) for i in range(n)]


def test_job_info_says_the_style(server):
    client, _, address, _ = server
    r = client.train(traced(MODEL, OPTIM), world_size=2, batches=batches(1))
    info = client.job(r.job_id)
    assert info.style == cpb.DATA_PARALLEL_STYLE_REPLICATE
    out = subprocess.run([fxdp_binary("FXDP_BIN", "fxdp"), "job", r.job_id, "--server", address],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "style      replicate" in out.stdout


def test_unknown_style_is_refused_naming_the_accepted_ones(server, tmp_path):
    client, jobs, address, _ = server
    step = traced(MODEL, OPTIM)
    with pytest.raises(ValueError, match="unknown data-parallel style 'zero3'; accepted: replicate, fully_shard"):
        client.train(step, world_size=2, batches=batches(1), style="zero3")
    spec = jpb.JobSpec(graph=step.graph, world_size=2, steps=1, num_state_tensors=0, style=9)
    with pytest.raises(grpc.RpcError) as e:
        list(jobs.Submit(iter([jpb.SubmitJobRequest(spec=spec)]), timeout=30))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "JobSpec.style: unknown data-parallel style 9; accepted: 0 (DATA_PARALLEL_STYLE_REPLICATE" in e.value.details()
    g = tmp_path / "g.pb"
    step.save(g)
    step.to_safetensors(tmp_path / "s.safetensors")
    out = subprocess.run([fxdp_binary("FXDP_BIN", "fxdp"), "run", g, "--state", tmp_path / "s.safetensors",
                          "--data", tmp_path / "s.safetensors", "--style", "zero3", "--server", address],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "--style: unknown data-parallel style 'zero3': expected 'replicate' or 'fully_shard'" in out.stderr
