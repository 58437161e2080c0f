"""``fxdp-worker run`` (the C++ LibTorch interpreter) against ``TracedStep.run_local`` (torch.fx).

For every zoo model x optimizer: save the traced graph, its state and three batches, run
``fxdp-worker run ... --steps 3`` and compare the final state (every entry) and the per-step
losses with three ``run_local`` steps on the same batches (rtol 1e-5, atol 1e-6). Also: one
batch file reused every step (the ``python -m fxdp.zoo.export`` layout), two and five real
Gloo ranks running ``fxdp expand``'s graphs, and the worker's errors.

The worker is $FXDP_WORKER or <repo>/build/bin/fxdp-worker, ``fxdp`` (for ``expand``) $FXDP_BIN
or <repo>/build/bin/fxdp; the tests fail (they do not skip) when a binary is missing.
"""

from __future__ import annotations

import inspect
import pathlib
import subprocess

import fxdp
import pytest
import torch
from _util import (
    ATOL,
    MODELS,
    OPTIMS,
    RTOL,
    clean_env,
    free_port,
    fxdp_binary,
    losses_of,
    run_ranks,
    traced,
)
from fxdp import zoo
from safetensors.torch import load_file, save_file

REPO = pathlib.Path(__file__).resolve().parents[2]
STEPS = 3


def worker() -> str:
    return fxdp_binary("FXDP_WORKER", "fxdp-worker")


def run_worker(args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [worker(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else clean_env(),
    )


def save_inputs(tmp_path, step, batches):
    graph, state = str(tmp_path / "g.pb"), str(tmp_path / "s.safetensors")
    step.save(graph)
    step.to_safetensors(state)
    data = []
    for i, b in enumerate(batches):
        p = str(tmp_path / f"b{i}.safetensors")
        save_file({k: v.contiguous() for k, v in b.items()}, p)
        data.append(p)
    return graph, state, data


def reference(step, batches):
    state = step.initial_state()
    losses = []
    for b in batches:
        state, loss = step.run_local(state, b)
        losses.append(float(loss))
    return state, losses


def assert_same_state(got, want):
    assert set(got) == set(want), f"state names differ: {set(got) ^ set(want)}"
    for k, v in want.items():
        torch.testing.assert_close(
            got[k], v, rtol=RTOL, atol=ATOL, check_dtype=True, msg=lambda m: f"{k}: {m}"
        )


@pytest.mark.parametrize("optim", OPTIMS)
@pytest.mark.parametrize("model", MODELS)
def test_worker_matches_run_local(tmp_path, model, optim):
    step = traced(model, optim)
    e = zoo.get(model)
    batches = [e.named_batch(i) for i in range(STEPS)]
    graph, state, data = save_inputs(tmp_path, step, batches)
    out = str(tmp_path / "final.safetensors")
    args = [
        "run",
        "--graph",
        graph,
        "--state",
        state,
        "--steps",
        str(STEPS),
        "--out",
        out,
        "--check-outputs",
    ]
    for d in data:
        args += ["--data", d]
    r = run_worker(args)
    assert r.returncode == 0, r.stderr
    want_state, want_losses = reference(step, batches)
    losses = losses_of(r.stdout)
    assert len(losses) == STEPS
    torch.testing.assert_close(
        torch.tensor(losses, dtype=torch.float64),
        torch.tensor(want_losses, dtype=torch.float64),
        rtol=RTOL,
        atol=ATOL,
    )
    assert_same_state(load_file(out), want_state)
    assert "[job local rank 0 step 0/3] " in r.stderr and "[job local rank 0 step 3/3] " in r.stderr


def test_one_exported_batch_is_reused_every_step(tmp_path):
    """The zoo export writes one batch per graph: the worker reuses it for every step."""
    r = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "python"),
            "-m",
            "fxdp.zoo.export",
            str(tmp_path),
            "--models",
            "mlp",
            "--optims",
            "adam",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    base = tmp_path / "mlp_adam"
    out = str(tmp_path / "final.safetensors")
    r = run_worker(
        [
            "run",
            f"--graph={base}.pb",
            "--state",
            f"{base}.safetensors",
            "--data",
            f"{base}.batch.safetensors",
            "--steps",
            "3",
            "--out",
            out,
        ]
    )
    assert r.returncode == 0, r.stderr
    step = traced("mlp", "adam")
    batch = zoo.get("mlp").named_batch(0)
    want_state, want_losses = reference(step, [batch] * 3)
    torch.testing.assert_close(
        torch.tensor(losses_of(r.stdout), dtype=torch.float64),
        torch.tensor(want_losses, dtype=torch.float64),
        rtol=RTOL,
        atol=ATOL,
    )
    assert_same_state(load_file(out), want_state)


@pytest.mark.parametrize("model,optim,world", [("mlp", "adamw", 2), ("mlp", "sgd", 5)])
def test_gloo_ranks_match_one_device(tmp_path, model, optim, world):
    """N worker processes over Gloo run fxdp expand's graphs on slices of the global batches."""
    step = traced(model, optim)
    e = zoo.get(model)
    batches = [e.named_batch(i) for i in range(STEPS)]
    graph, state, data = save_inputs(tmp_path, step, batches)
    fxdp = fxdp_binary("FXDP_BIN", "fxdp")
    x = str(tmp_path / "x.pb")
    r = subprocess.run(
        [fxdp, "expand", graph, "--world-size", str(world), "-o", x],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    uneven = (tmp_path / "x.rank0.pb").exists()
    gpath = str(tmp_path / "x.rank{rank}.pb") if uneven else x
    args = [
        worker(),
        "run",
        "--graph",
        gpath,
        "--state",
        state,
        "--steps",
        str(STEPS),
        "--timeout-s",
        "60",
        "--out",
        str(tmp_path / "final{rank}.safetensors"),
        "--check-outputs",
    ]
    for d in data:
        args += ["--data", d]
    outs = [out for out, _ in run_ranks(args, world, tmp_path)]
    want_state, want_losses = reference(step, batches)
    torch.testing.assert_close(
        torch.tensor(losses_of(outs[0]), dtype=torch.float64),
        torch.tensor(want_losses, dtype=torch.float64),
        rtol=RTOL,
        atol=ATOL,
    )
    assert all(o == "" for o in outs[1:]), "only rank 0 prints steps"
    finals = [load_file(str(tmp_path / f"final{r}.safetensors")) for r in range(world)]
    assert_same_state(finals[0], want_state)
    for f in finals[1:]:
        for k in f:
            assert torch.equal(f[k], finals[0][k]), f"ranks disagree on {k}"


def test_errors(tmp_path):
    step = traced("mlp", "sgd")
    graph, state, data = save_inputs(tmp_path, step, [zoo.get("mlp").named_batch(0)])
    base = ["run", "--graph", graph, "--state", state, "--data", data[0], "--steps", "1"]

    r = run_worker(["run", "--help"])
    assert r.returncode == 0 and "--graph" in r.stdout and "WORLD_SIZE" in r.stdout
    r = run_worker(base + ["--bogus"])
    assert r.returncode == 2 and "unknown argument '--bogus'" in r.stderr
    r = run_worker(["run", "--graph", graph, "--state", state, "--data", data[0]])
    assert r.returncode == 2 and "--steps is required" in r.stderr

    # A state file without one parameter.
    st = load_file(state)
    st.pop("fc1.weight")
    save_file(st, str(tmp_path / "partial.safetensors"))
    r = run_worker(
        [
            "run",
            "--graph",
            graph,
            "--state",
            str(tmp_path / "partial.safetensors"),
            "--data",
            data[0],
            "--steps",
            "1",
        ]
    )
    assert r.returncode == 3 and "the state lacks 'fc1.weight'" in r.stderr, r.stderr

    # A batch with the wrong input name / shape.
    save_file({"x": torch.zeros(12, 10)}, str(tmp_path / "nox.safetensors"))
    r = run_worker(base[:5] + ["--data", str(tmp_path / "nox.safetensors"), "--steps", "1"])
    assert r.returncode != 0 and "the batch has no tensor 'target'" in r.stderr, r.stderr
    save_file(
        {"x": torch.zeros(12, 11), "target": torch.zeros(12, 5)}, str(tmp_path / "bad.safetensors")
    )
    r = run_worker(base[:5] + ["--data", str(tmp_path / "bad.safetensors"), "--steps", "1"])
    assert r.returncode == 1 and "expected f32[12, 10], got f32[12, 11]" in r.stderr, r.stderr

    # A truncated data file.
    blob = pathlib.Path(data[0]).read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(blob[: len(blob) - 7])
    r = run_worker(base[:5] + ["--data", str(tmp_path / "trunc.safetensors"), "--steps", "1"])
    assert r.returncode == 1 and "corrupt safetensors data" in r.stderr, r.stderr

    # A single-device graph under a launcher with WORLD_SIZE 2 would train two independent copies.
    env2 = clean_env(RANK=1, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    r = run_worker(base + ["--timeout-s", "2"], env=env2, timeout=60)
    assert (
        r.returncode == 1
        and f"{graph} is a single-device graph (not expanded by fxdp expand) but " "WORLD_SIZE is 2"
        in r.stderr
        and "--world-size 2" in r.stderr
    ), r.stderr
    x2, x3 = str(tmp_path / "x2.pb"), str(tmp_path / "x3.pb")
    for x, n in ((x2, 2), (x3, 3)):
        e = subprocess.run(
            [fxdp_binary("FXDP_BIN", "fxdp"), "expand", graph, "--world-size", str(n), "-o", x],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert e.returncode == 0, e.stderr
    r = run_worker(["run", "--graph", x3, *base[3:], "--timeout-s", "2"], env=env2, timeout=60)
    assert (
        r.returncode == 1 and f"{x3} was expanded for 3 ranks but WORLD_SIZE is 2" in r.stderr
    ), r.stderr
    r = run_worker(["run", "--graph", x2, *base[3:]])
    assert (
        r.returncode == 1 and f"{x2} was expanded for 2 ranks but WORLD_SIZE is 1" in r.stderr
    ), r.stderr

    # A launch environment that names no reachable peers fails within the timeout.
    r = run_worker(["run", "--graph", x2, *base[3:], "--timeout-s", "2"], env=env2, timeout=60)
    assert r.returncode != 0 and "rank 1" in r.stderr, r.stderr
    r = run_worker(base, env=clean_env(RANK=2, WORLD_SIZE=2))
    assert r.returncode == 2 and "RANK 2 is not below WORLD_SIZE 2" in r.stderr


class _Lookup(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return self.emb(ids).sum(1)


def test_run_time_errors_quote_the_users_line(tmp_path):
    """A kernel that fails on the data (a token id past the table) names the node and the user's
    line that produced it (Node.source), as compile-time errors do."""
    torch.manual_seed(0)
    model = _Lookup()
    ids, y = torch.randint(0, 10, (6, 3)), torch.randn(6, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = fxdp.trace(model, opt, torch.nn.functional.mse_loss, (ids, y))
    bad = ids.clone()
    bad[2, 1] = 12
    graph, state, data = save_inputs(tmp_path, step, [{"input.0": bad, "input.1": y}])
    r = run_worker(["run", "--graph", graph, "--state", state, "--data", data[0], "--steps", "1"])
    lines, first = inspect.getsourcelines(_Lookup.forward)
    line = first + next(i for i, s in enumerate(lines) if "self.emb(ids)" in s)
    assert r.returncode == 1, r.stderr
    assert "node 'embedding' (aten::embedding) [" in r.stderr, r.stderr
    assert (
        f"test_worker_local.py:{line} in model.emb: return self.emb(ids).sum(1)]: kernel failed: "
        "index out of range" in r.stderr
    ), r.stderr
