"""A model whose replicated training state does not fit a worker trains under `--style fully_shard`.

The model: a 4-layer 1024-wide MLP with AdamW (4.2M parameters: 16.8 MB of parameters, as much
again of gradients and twice that of Adam moments). `fxdp analyze --style` says what each rank holds:
68 MiB under `replicate`, half of the parameters, gradients and moments under `fully_shard` on 2
ranks (plus two gathered units and a bucket). Each worker gets a real memory limit just under what
`replicate` needs (`fxdp-server --worker-memory-limit`, i.e. `fxdp-worker attach --memory-limit`:
the worker's tensors can never hold more, the CPU analogue of a device's memory), so:

* `fxdp analyze --style fully_shard` marks the sharded state S(0) with the reason and prints the
  per-rank memory, the same locally and through the server (`--server`, `Client.analyze(style=)`);
* `fxdp workers` / `Client.workers()` show each worker's memory and where it comes from;
* `fxdp run --style replicate` and `Client.train(style="replicate")` are refused before anything
  runs: FAILED_PRECONDITION naming the rank, the worker, the bytes needed against the bytes it has,
  and suggesting `--style fully_shard`;
* `fxdp run --style fully_shard` trains it on the same 2 workers, under the limit (the workers log
  the most their tensors held), and the final state equals one device;
* without the server's admission (`fxdp-worker run --memory-limit`, the same limit) `replicate`
  really runs out: every rank fails at once naming the node, the limit and the bytes, never a hang,
  while the `fully_shard` graphs run to the end;
* a size that is not one, or `--worker-memory-limit` without `--local-workers`, is a usage error.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import fxdp
import grpc
import pytest
import torch
import torch.nn as nn
from _util import RTOL, fxdp_binary, local_server, spawn_ranks, wait_all
from safetensors.torch import load_file, save_file

WIDTH, LAYERS, BATCH, STEPS, BUCKET_MB = 1024, 4, 8, 2, "4"


def batch(i: int):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    torch.manual_seed(0)
    mods = []
    for _ in range(LAYERS):
        mods += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = nn.Sequential(*mods[:-1])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = fxdp.trace(model, opt, nn.MSELoss(), batch(0))
    d = tmp_path_factory.mktemp("fit")
    step.save(d / "g.pb")
    step.to_safetensors(d / "s.safetensors")
    data = []
    for i in range(STEPS):
        x, y = batch(i)
        save_file({"input.0": x, "input.1": y}, str(d / f"d{i}.safetensors"))
        data += ["--data", str(d / f"d{i}.safetensors")]
    # one device
    state = step.initial_state()
    for i in range(STEPS):
        state, _ = step.run_local(state, batch(i))
    return step, d, data, state


def fxdp_cli(*args, timeout=120):
    return subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def memory(d, style, *server):
    r = fxdp_cli(
        "analyze",
        d / "g.pb",
        "--world-size",
        "2",
        "--style",
        style,
        "--bucket-mb",
        BUCKET_MB,
        "--json",
        *server,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def limits(files):
    _, d, _, _ = files
    rep, fs = memory(d, "replicate"), memory(d, "fully_shard")
    # just under what replicate's state needs: refused at admission, and really out of memory without it
    return rep, fs, rep["memory"]["total_bytes"] - (1 << 20)


def test_analyze_style_shows_the_sharded_state_and_what_each_rank_holds(files, limits):
    step, d, _, _ = files
    rep, fs, _ = limits
    r, f = rep["memory"], fs["memory"]
    params = sum(
        t.numel() * t.element_size()
        for n, t in step.initial_state().items()
        if not n.startswith("optim.")
    )
    assert (
        r["parameter_bytes"] == r["gradient_bytes"] == params
        and r["optimizer_state_bytes"] >= 2 * params
    )
    # fully_shard on 2 ranks: half of each (N divides every tensor here: no padding)
    for k in ("parameter_bytes", "gradient_bytes"):
        assert f[k] == r[k] // 2, k
    scalars = sum(
        t.numel() * t.element_size()
        for n, t in step.initial_state().items()
        if n.startswith("optim.") and not n.startswith("optim.group") and t.dim() == 0
    )  # the `step`s
    assert f["optimizer_state_bytes"] == (r["optimizer_state_bytes"] - scalars) // 2 + scalars
    assert f["gathered_bytes"] == 2 * f["largest_unit_bytes"] > 0 and r["gathered_bytes"] == 0
    assert f["total_bytes"] < 0.7 * r["total_bytes"]
    sharded = [
        n for n in fs["nodes"] if n["placement"] == "S(0)" and n.get("role") not in (None, "INPUT")
    ]
    assert len(sharded) == 3 * 2 * LAYERS  # parameters, exp_avg, exp_avg_sq
    assert all(n["reason"].startswith("fully_shard: flat shard of ") for n in sharded)
    assert not [
        n for n in rep["nodes"] if n["placement"] == "S(0)" and n.get("role") not in (None, "INPUT")
    ]
    table = fxdp_cli(
        "analyze",
        d / "g.pb",
        "--world-size",
        "2",
        "--style",
        "fully_shard",
        "--bucket-mb",
        BUCKET_MB,
    )
    assert table.returncode == 0, table.stderr
    assert "state per rank (fully_shard, 2 ranks): " in table.stdout and "gathered" in table.stdout


def test_a_model_that_does_not_fit_replicated_trains_fully_sharded(files, limits):
    step, d, data, ref = files
    rep, fs, limit = limits
    with local_server(workers=2, extra_args=("--worker-memory-limit", str(limit))) as (
        address,
        log,
    ):
        # the analysis through the server is the local one
        for style, local in (("replicate", rep), ("fully_shard", fs)):
            assert memory(d, style, "--server", address) == local
        client = fxdp.Client(address)
        assert client.analyze(step, 2, style="fully_shard", bucket_mb=float(BUCKET_MB)) == fs
        deadline = time.monotonic() + 30
        while sum(w.get("state") == "WORKER_STATE_IDLE" for w in client.workers()) < 2:
            assert time.monotonic() < deadline, (client.workers(), log)
            time.sleep(0.1)
        workers = client.workers()
        assert [(w["memory_bytes"], w["memory_source"]) for w in workers] == [
            (str(limit), "--memory-limit")
        ] * 2

        run = [
            "run",
            d / "g.pb",
            "--world-size",
            "2",
            "--state",
            d / "s.safetensors",
            *data,
            "--bucket-mb",
            BUCKET_MB,
            "--server",
            address,
        ]
        r = fxdp_cli(*run, "--style", "replicate")
        need = rep["memory"]["total_bytes"]
        assert r.returncode == 1, r.stdout + r.stderr
        assert re.search(
            rf"FAILED \(FAILED_PRECONDITION\): job \S+: rank 0 does not fit worker local-0: its state "
            rf"under replicate on 2 ranks needs [\d.]+ MiB \({need} bytes\) \(parameters",
            r.stderr,
        ), r.stderr
        assert (
            f"the worker has 67.1 MiB ({limit} bytes) (--memory-limit); with --style fully_shard"
            in r.stderr
        )
        with pytest.raises(fxdp.ServerError) as e:
            client.train(
                step,
                world_size=2,
                batches=[batch(0)],
                style="replicate",
                bucket_mb=float(BUCKET_MB),
            )
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION and "does not fit worker" in str(
            e.value
        )

        out = d / "fully_shard.safetensors"
        r = fxdp_cli(*run, "--style", "fully_shard", "--out", out)
        assert r.returncode == 0, r.stdout + r.stderr
        final = load_file(str(out))
        assert sorted(final) == sorted(ref)
        # AdamW normalises each element's update by its own gradient size, so elements whose
        # gradient is rounding-sized move by rounding noise: on this session's machine 68 of 1M
        # elements of 0.weight are up to 5.9e-6 apart with 8a6a11a's binaries as with today's
        # (the float sums' order depends on the CPU's kernels); atol 1e-5 keeps every real error out.
        for k, want in ref.items():
            torch.testing.assert_close(
                final[k], want, rtol=RTOL, atol=1e-5, msg=lambda m: f"{k}: {m}"
            )
        peaks = [
            int(m.group(1))
            for line in list(log)
            for m in [re.search(r"tensors held at most (\d+) bytes at once", line)]
            if m
        ]
        assert len(peaks) == 2 and all(p <= limit for p in peaks), peaks
        client.close()


def test_without_admission_replicate_runs_out_of_memory_and_fully_shard_does_not(
    files, limits, tmp_path
):
    """`fxdp-worker run --memory-limit`: the limit is real, not only the server's arithmetic."""
    _, d, _, _ = files
    _, _, limit = limits
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    for style in ("replicate", "fully_shard"):
        r = fxdp_cli(
            "expand",
            d / "g.pb",
            "--world-size",
            "2",
            "--bucket-mb",
            BUCKET_MB,
            "--style",
            style,
            "-o",
            tmp_path / f"{style}.pb",
        )
        assert r.returncode == 0, r.stderr
        run_dir = tmp_path / style
        run_dir.mkdir()
        procs = spawn_ranks(
            [
                worker,
                "run",
                "--graph",
                str(tmp_path / f"{style}.pb"),
                "--state",
                str(d / "s.safetensors"),
                "--data",
                str(d / "d0.safetensors"),
                "--steps",
                "1",
                "--timeout",
                "30",
                "--memory-limit",
                str(limit),
                "--job",
                style,
            ],
            2,
            run_dir,
        )
        wait_all(procs, 60)
        errs = [(run_dir / f"err{r}").read_text() for r in range(2)]
        if style == "fully_shard":
            assert [p.returncode for p in procs] == [0, 0], errs
            continue
        assert [p.returncode for p in procs] == [1, 1], errs
        for rank, err in enumerate(errs):
            assert re.search(
                rf"\[job replicate rank {rank} step 1/1\] error: step 1/1 failed: node '\S+' \(aten::\S+\)(?: \[.*\])?: "
                rf"out of memory: fxdp-worker --memory-limit 67.1 MiB \({limit} bytes\): cannot allocate "
                rf"\d+ bytes with \d+ bytes of tensors held",
                err,
            ), err


def test_bad_memory_limits_are_usage_errors():
    server, worker = (
        fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"),
        fxdp_binary("FXDP_WORKER", "fxdp-worker"),
    )
    for args, message in (
        (
            [server, "--local-workers", "1", "--worker-memory-limit", "12XB"],
            "--worker-memory-limit needs a size in bytes (300MB, 4GiB), got '12XB'",
        ),
        (
            [server, "--worker-memory-limit", "1GiB"],
            "--worker-memory-limit applies to --local-workers",
        ),
        (
            [worker, "attach", "--memory-limit", "-5MB"],
            "--memory-limit needs a size in bytes (300MB, 4GiB), got '-5MB'",
        ),
        ([worker, "run", "--memory-limit", "0"], "--memory-limit needs a size in bytes"),
    ):
        r = subprocess.run(args, capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
