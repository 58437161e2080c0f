"""Hyper-parameters fed per step through the job path: HYPERPARAMETER placeholders (lr, weight
decay) get a value each step from a schedule, and one compiled graph serves the whole run.

The graph is tests/testdata/mlp_sgd_hyper.txt (Linear(4, 3), MSE mean, SGD with ``lr`` and
``weight_decay`` as HYPERPARAMETER placeholders), turned into a GraphDef with ``fxdp graph parse``;
the reference is eager ``torch.optim.SGD`` with a ``torch.optim.lr_scheduler`` that changes lr
every step (rtol 1e-5, atol 1e-6):

* ``fxdp.Client.train(..., schedule=scheduler)`` through a real ``fxdp-server --local-workers 2``
  (streamed batches, values with each step's batch) equals eager; a second job with the same graph
  and another schedule (a callable) is a compile-cache hit and equals eager with that schedule;
* a ``data_path`` job (values in the JobSpec) equals eager;
* ``fxdp run --schedule FILE`` (a closed form) against the same server, and ``fxdp-worker run
  --schedule FILE`` on 2 real Gloo processes equal one device and eager with transformers'
  warmup + cosine formula;
* a real traced step (``fxdp.trace_step``: MLP, MSE, binding ``clip_grad_norm_``, AdamW with
  transformers' warmup + cosine through ``LambdaLR``) through the server on 2 workers with
  ``schedule=scheduler``, and on 3 uneven ``fxdp-worker run`` ranks (10 samples: 4 + 3 + 3) with the
  C++ closed form ``linear_warmup_cosine``, equals the eager loop (``train_step``;
  ``scheduler.step()``);
* errors: a name that is not a hyper-parameter (worker, server, CLI), too few values, a
  non-scalar HYPERPARAMETER placeholder, each naming what is wrong; a bad schedule fails a
  2-rank ``fxdp-worker run`` before the rendezvous (no rank waits for the other).
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import time

import fxdp
import grpc
import pytest
import torch
from _util import ATOL, RTOL, clean_env, free_port, fxdp_binary, local_server, run_ranks
from fxdp.schedule import hyperparameter_names, save_schedule, schedule_values
from fxdp.traced import TracedStep
from fxdp.v1 import graph_pb2 as gpb
from fxdp.v1 import jobs_pb2 as jpb
from fxdp.v1 import jobs_pb2_grpc as jgrpc
from safetensors.torch import load_file, save_file

REPO = pathlib.Path(__file__).resolve().parents[2]
GRAPH_TXT = REPO / "tests" / "testdata" / "mlp_sgd_hyper.txt"
LR, WD = 0.2, 0.05
STEPS = 4


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hyper")
    pb_path = d / "g.pb"
    r = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "graph", "parse", str(GRAPH_TXT), str(pb_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return d, pb_path


def initial_state():
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3)
    return {
        "fc.weight": m.weight.detach().clone(),
        "fc.bias": m.bias.detach().clone(),
        "optim.group0.lr": torch.tensor(LR),
        "optim.group0.weight_decay": torch.tensor(WD),
    }


def batches(n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [
        {"input.0": torch.randn(8, 4, generator=g), "input.1": torch.randn(8, 3, generator=g)}
        for _ in range(n)
    ]


def hyper_step(pb_path) -> TracedStep:
    g = gpb.GraphDef()
    g.ParseFromString(pathlib.Path(pb_path).read_bytes())
    return TracedStep(g, initial_state())


def optimizer_and_model():
    s = initial_state()
    m = torch.nn.Linear(4, 3)
    with torch.no_grad():
        m.weight.copy_(s["fc.weight"])
        m.bias.copy_(s["fc.bias"])
    return m, torch.optim.SGD(m.parameters(), lr=LR, weight_decay=WD)


def eager(make_scheduler, data):
    """Eager training on ``data``; ``make_scheduler(opt)`` returns the scheduler stepped after
    each step. Returns the parameters and the per-step losses."""
    m, opt = optimizer_and_model()
    sched = make_scheduler(opt)
    losses = []
    for b in data:
        loss = ((m(b["input.0"]) - b["input.1"]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return {"fc.weight": m.weight.detach(), "fc.bias": m.bias.detach()}, losses


def lambda_sched(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.7**s + 0.1 * s)


def warmup_cosine_lambda(warmup, total):
    # transformers.get_cosine_schedule_with_warmup's lr_lambda
    return (
        lambda s: s / max(1, warmup)
        if s < warmup
        else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, total - warmup)))
    )


def assert_params(state, want):
    for k, v in want.items():
        torch.testing.assert_close(state[k], v, rtol=RTOL, atol=ATOL, msg=lambda m: f"{k}: {m}")


@pytest.fixture(scope="module")
def server():
    with local_server() as (address, log):
        yield address, log


def test_client_train_with_a_scheduler_equals_eager_and_compiles_once(files, server):
    _, pb_path = files
    address, log = server
    data = batches()
    want, want_losses = eager(lambda_sched, data)
    # The scheduler the user would step in their loop; schedule_values leaves it untouched.
    _, opt = optimizer_and_model()
    sched = lambda_sched(opt)
    with fxdp.Client(address) as c:
        r = c.train(hyper_step(pb_path), world_size=2, batches=data, schedule=sched)
        assert_params(r.state, want)
        torch.testing.assert_close(
            torch.tensor(r.losses), torch.tensor(want_losses), rtol=RTOL, atol=ATOL
        )
        info = c.job(r.job_id)
        assert list(info.hyperparameters) == ["optim.group0.lr", "optim.group0.weight_decay"]
        assert not info.compile_cached  # the first job with this graph compiled it
        # The same graph with another schedule (a callable changing lr and weight decay): the
        # compile cache hits, one graph serves both runs.
        lrs = [0.3, 0.1, 0.25, 0.05]
        r2 = c.train(
            hyper_step(pb_path),
            world_size=2,
            batches=data,
            schedule=lambda i: {
                "optim.group0.lr": lrs[i - 1],
                "optim.group0.weight_decay": 0.01 * i,
            },
        )
        assert c.job(r2.job_id).compile_cached
    assert any("compile cache hit" in line for line in log)

    m, opt = optimizer_and_model()
    for i, b in enumerate(data, 1):
        for g in opt.param_groups:
            g["lr"], g["weight_decay"] = lrs[i - 1], 0.01 * i
        loss = ((m(b["input.0"]) - b["input.1"]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert_params(r2.state, {"fc.weight": m.weight.detach(), "fc.bias": m.bias.detach()})
    # The state comes back with the last step's values.
    assert r2.state["optim.group0.lr"].item() == pytest.approx(lrs[-1])


def test_data_path_job_takes_the_schedule_in_the_spec(files, server):
    d, pb_path = files
    address, _ = server
    b = batches(1)[0]
    save_file(b, str(d / "batch.safetensors"))
    want, want_losses = eager(lambda_sched, [b] * 3)
    _, opt = optimizer_and_model()
    with fxdp.Client(address) as c:
        r = c.train(
            hyper_step(pb_path),
            world_size=2,
            data_path=d / "batch.safetensors",
            steps=3,
            schedule=lambda_sched(opt),
        )
    assert_params(r.state, want)
    torch.testing.assert_close(
        torch.tensor(r.losses), torch.tensor(want_losses), rtol=RTOL, atol=ATOL
    )


def save_run_inputs(d, data):
    save_file({k: v.contiguous() for k, v in initial_state().items()}, str(d / "state.safetensors"))
    paths = []
    for i, b in enumerate(data):
        save_file(b, str(d / f"b{i}.safetensors"))
        paths.append(str(d / f"b{i}.safetensors"))
    return str(d / "state.safetensors"), paths


def warmup_cosine_file(d, steps):
    path = d / "cosine.json"
    path.write_text(
        json.dumps(
            {
                "optim.group0.lr": {
                    "linear_warmup_cosine": {"peak": LR, "warmup_steps": 1, "total_steps": steps}
                }
            }
        )
    )
    return str(path)


def test_fxdp_run_schedule_file(files, server):
    d, pb_path = files
    address, _ = server
    data = batches()
    state, paths = save_run_inputs(d, data)
    sched = warmup_cosine_file(d, STEPS)
    out = d / "run_final.safetensors"
    cmd = [
        fxdp_binary("FXDP_BIN", "fxdp"),
        "run",
        str(pb_path),
        "--server",
        address,
        "--world-size",
        "2",
        "--state",
        state,
        "--steps",
        str(STEPS),
        "--schedule",
        sched,
        "--out",
        str(out),
    ]
    for p in paths:
        cmd += ["--data", p]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    want, _ = eager(
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, warmup_cosine_lambda(1, STEPS)), data
    )
    assert_params(load_file(str(out)), want)

    # A name that is not a hyper-parameter of the graph: refused before anything is sent.
    bad = d / "bad.json"
    bad.write_text(json.dumps({"optim.group0.momentum": [0.9] * STEPS}))
    r = subprocess.run(
        cmd[:-4] + ["--schedule", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1
    assert (
        "'optim.group0.momentum' is not a hyper-parameter of the graph (no placeholder has that "
        "state name; its hyper-parameters: optim.group0.lr, optim.group0.weight_decay)"
    ) in r.stderr


def worker_run(args, env, timeout=120):
    return subprocess.run(
        [fxdp_binary("FXDP_WORKER", "fxdp-worker"), "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_worker_run_schedule_two_ranks_equal_one_device(files, tmp_path):
    _, pb_path = files
    data = batches()
    state, paths = save_run_inputs(tmp_path, data)
    sched = warmup_cosine_file(tmp_path, STEPS)
    base = ["--state", state, "--steps", str(STEPS), "--schedule", sched, "--timeout-s", "60"]
    for p in paths:
        base += ["--data", p]
    one = worker_run(
        ["--graph", str(pb_path), "--out", str(tmp_path / "one.safetensors"), *base], clean_env()
    )
    assert one.returncode == 0, one.stderr

    x = tmp_path / "x.pb"
    r = subprocess.run(
        [
            fxdp_binary("FXDP_BIN", "fxdp"),
            "expand",
            str(pb_path),
            "--world-size",
            "2",
            "-o",
            str(x),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    run_ranks(
        [
            fxdp_binary("FXDP_WORKER", "fxdp-worker"),
            "run",
            "--graph",
            str(x),
            "--out",
            str(tmp_path / "two{rank}.safetensors"),
            "--check-outputs",
            *base,
        ],
        2,
        tmp_path,
    )
    want, _ = eager(
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, warmup_cosine_lambda(1, STEPS)), data
    )
    single = load_file(str(tmp_path / "one.safetensors"))
    assert_params(single, want)
    for rank in range(2):
        assert_params(load_file(str(tmp_path / f"two{rank}.safetensors")), single)
    # The final state holds the last step's lr: 0.5 * (1 + cos(pi * 2 / 3)) * LR.
    assert single["optim.group0.lr"].item() == pytest.approx(
        LR * 0.5 * (1 + math.cos(math.pi * 2 / 3)), rel=1e-6
    )


def test_worker_run_schedule_errors(files, tmp_path):
    _, pb_path = files
    state, paths = save_run_inputs(tmp_path, batches(1))
    base = ["--graph", str(pb_path), "--state", state, "--data", paths[0], "--steps", "3"]

    short = tmp_path / "short.json"
    short.write_text(json.dumps({"optim.group0.lr": [0.1, 0.2]}))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"fc.weight": [0.1, 0.2, 0.3]}))
    # Rank 0 of 2 with no peer: a bad schedule fails at once, before the rendezvous.
    env = clean_env(RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_port())
    for path, want in [
        (short, f"{short}: 'optim.group0.lr': 2 values for 3 steps"),
        (
            unknown,
            "'fc.weight' is not a hyper-parameter of the graph (it is the state of "
            "placeholder 'w'; its hyper-parameters: optim.group0.lr, "
            "optim.group0.weight_decay)",
        ),
    ]:
        t0 = time.monotonic()
        r = worker_run(base + ["--schedule", str(path), "--timeout-s", "30"], env, timeout=60)
        assert r.returncode == 1 and want in r.stderr, r.stderr
        assert time.monotonic() - t0 < 20 and "rendezvous" not in r.stderr
    r = worker_run(base + ["--schedule", str(tmp_path / "missing.json")], clean_env())
    assert r.returncode == 3 and "cannot read the schedule file" in r.stderr, r.stderr
    r = worker_run(["--help"], clean_env())
    assert r.returncode == 0 and "--schedule FILE" in r.stdout

    # A HYPERPARAMETER placeholder that is not 0-d does not verify, naming the node.
    bad = tmp_path / "bad.txt"
    bad.write_text(
        GRAPH_TXT.read_text().replace("%lr: f32[] = placeholder()", "%lr: f32[1] = placeholder()")
    )
    r = subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), "graph", "parse", str(bad), str(tmp_path / "bad.pb")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert (
        "node 'lr' (#2): HYPERPARAMETER placeholder 'optim.group0.lr' must be a 0-d tensor (one value "
        "per step), got f32[1]"
    ) in r.stderr


def test_server_refuses_a_schedule_naming_no_hyperparameter(files, server):
    _, pb_path = files
    address, _ = server
    step = hyper_step(pb_path)
    spec = jpb.JobSpec(
        graph=step.graph,
        world_size=2,
        steps=2,
        num_state_tensors=0,
        schedule=[jpb.HyperparameterSeries(name="optim.group0.beta1", values=[0.9, 0.9])],
    )
    with grpc.insecure_channel(address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            list(jgrpc.JobServiceStub(ch).Submit(iter([jpb.SubmitJobRequest(spec=spec)])))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "JobSpec.schedule: 'optim.group0.beta1' is not a hyper-parameter of the graph (no placeholder "
        "has that state name; its hyper-parameters: optim.group0.lr, optim.group0.weight_decay)"
    ) in e.value.details()
    # The client checks names too, before anything is sent.
    with fxdp.Client(address) as c:
        with pytest.raises(ValueError, match="'optim.group0.beta1' is not a hyper-parameter"):
            c.train(
                step, world_size=2, batches=batches(2), schedule=[{"optim.group0.beta1": 0.9}] * 2
            )
        with pytest.raises(ValueError, match="the schedule lists 1 steps, the run has 2"):
            c.train(step, world_size=2, batches=batches(2), schedule=[{"optim.group0.lr": 0.9}])
        # A graph without hyper-parameters: a schedule would silently change nothing.
        plain = gpb.GraphDef()
        plain.CopyFrom(step.graph)
        for n in plain.nodes:
            if n.placeholder.role == gpb.HYPERPARAMETER:
                n.placeholder.role = gpb.CONSTANT
        _, opt = optimizer_and_model()
        with pytest.raises(ValueError, match="the graph has no HYPERPARAMETER placeholders"):
            c.train(
                TracedStep(plain, initial_state()),
                world_size=2,
                batches=batches(2),
                schedule=lambda_sched(opt),
            )


# ---- a step traced from the user's own train_step (fxdp.trace_step) -------------------------------

TSTEPS = 5


def traced_setup():
    """A real traced step: MLP, MSE, clip_grad_norm_ (binding), AdamW whose lr follows transformers'
    warmup + cosine (LambdaLR); the model, optimizer and scheduler as an eager loop makes them."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine_lambda(2, TSTEPS))
    return m, opt, sched


def train_step(model, opt, batch):
    x, y = batch
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    opt.zero_grad()
    return loss


def traced_batches():
    g = torch.Generator().manual_seed(5)
    return [
        (torch.randn(10, 6, generator=g), torch.randn(10, 3, generator=g)) for _ in range(TSTEPS)
    ]


def traced_eager():
    m, opt, sched = traced_setup()
    losses = []
    for b in traced_batches():
        losses.append(train_step(m, opt, b).item())
        sched.step()
    return {k: p.detach() for k, p in m.named_parameters()}, losses


def test_traced_adamw_with_warmup_cosine_through_the_server_equals_eager(server):
    address, _ = server
    m, opt, sched = traced_setup()
    step = fxdp.trace_step(train_step, m, opt, traced_batches()[0])
    assert hyperparameter_names(step) == [
        "optim.group0.lr",
        "optim.group0.beta1",
        "optim.group0.beta2",
        "optim.group0.weight_decay",
    ]
    want, want_losses = traced_eager()
    with fxdp.Client(address) as c:
        r = c.train(step, world_size=2, batches=traced_batches(), schedule=sched)
    assert_params(r.state, want)
    torch.testing.assert_close(
        torch.tensor(r.losses), torch.tensor(want_losses), rtol=RTOL, atol=ATOL
    )


def test_traced_step_on_three_uneven_worker_ranks_with_a_closed_form_schedule(tmp_path):
    """fxdp-worker run --schedule on 3 Gloo ranks (10 samples: 4 + 3 + 3); the C++ closed form
    linear_warmup_cosine gives the lr that LambdaLR gives eager training."""
    m, opt, _ = traced_setup()
    step = fxdp.trace_step(train_step, m, opt, traced_batches()[0])
    step.save(tmp_path / "g.pb")
    step.to_safetensors(tmp_path / "state.safetensors")
    base = [
        "--state",
        str(tmp_path / "state.safetensors"),
        "--steps",
        str(TSTEPS),
        "--timeout-s",
        "60",
    ]
    for i, (x, y) in enumerate(traced_batches()):
        save_file({"input.0": x, "input.1": y}, str(tmp_path / f"b{i}.safetensors"))
        base += ["--data", str(tmp_path / f"b{i}.safetensors")]
    sched = tmp_path / "s.json"
    sched.write_text(
        json.dumps(
            {
                "optim.group0.lr": {
                    "linear_warmup_cosine": {"peak": 3e-2, "warmup_steps": 2, "total_steps": TSTEPS}
                }
            }
        )
    )
    base += ["--schedule", str(sched)]
    r = subprocess.run(
        [
            fxdp_binary("FXDP_BIN", "fxdp"),
            "expand",
            str(tmp_path / "g.pb"),
            "--world-size",
            "3",
            "-o",
            str(tmp_path / "x.pb"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    run_ranks(
        [
            fxdp_binary("FXDP_WORKER", "fxdp-worker"),
            "run",
            "--graph",
            str(tmp_path / "x.rank{rank}.pb"),
            "--out",
            str(tmp_path / "f{rank}.safetensors"),
            *base,
        ],
        3,
        tmp_path,
    )
    want, _ = traced_eager()
    finals = [load_file(str(tmp_path / f"f{rank}.safetensors")) for rank in range(3)]
    assert_params(finals[0], want)
    for f in finals[1:]:
        for k in want:
            assert torch.equal(f[k], finals[0][k]), f"ranks disagree on {k}"


def test_a_schedule_saved_from_python_drives_fxdp_worker_run(tmp_path):
    """fxdp.schedule.save_schedule (the list form, from the user's LRScheduler) is the file
    fxdp-worker run --schedule reads."""
    m, opt, sched = traced_setup()
    step = fxdp.trace_step(train_step, m, opt, traced_batches()[0])
    step.save(tmp_path / "g.pb")
    step.to_safetensors(tmp_path / "state.safetensors")
    save_schedule(tmp_path / "s.json", schedule_values(sched, TSTEPS, step))
    args = [
        "--graph",
        str(tmp_path / "g.pb"),
        "--state",
        str(tmp_path / "state.safetensors"),
        "--steps",
        str(TSTEPS),
        "--schedule",
        str(tmp_path / "s.json"),
        "--out",
        str(tmp_path / "f.safetensors"),
    ]
    for i, (x, y) in enumerate(traced_batches()):
        save_file({"input.0": x, "input.1": y}, str(tmp_path / f"b{i}.safetensors"))
        args += ["--data", str(tmp_path / f"b{i}.safetensors")]
    r = worker_run(args, clean_env())
    assert r.returncode == 0, r.stderr
    want, _ = traced_eager()
    assert_params(load_file(str(tmp_path / "f.safetensors")), want)
