"""Training step time at N=2 on CPU: fxdp (fxdp expand + 2 fxdp-worker processes) against
PyTorch DistributedDataParallel (Gloo), same model, batch, optimizer and bucket size.

For each model: trace one step of the model with ``fxdp.trace`` (global batch B), expand it
with ``fxdp expand --world-size 2 --bucket-mb X`` and run, interleaved, ``--reps`` times:

  fxdp-worker N=2     2 ``fxdp-worker run`` processes (Gloo); step times from rank 0's
                      ``step i/K loss L (T ms)`` lines
  DDP N=2             2 Python processes, ``DistributedDataParallel(bucket_cap_mb=X)`` over
                      Gloo, each on its B/2 slice: zero_grad, forward, loss, backward,
                      optimizer.step, loss.item() timed per step on rank 0
  fxdp_step_bench N=2 the worker's step loop with every Work::Wait timed
                      (bench/step_bench.cc): the time rank 0 waits on communication, and
                      per collective (--detail) its time in flight before its wait and
                      the time blocked there (JSON: "fxdp collectives (rank 0)")
  fxdp N=1, eager N=1 one process on the B/2 slice, no communication (the step traced at
                      B/2, a single-device graph; the plain eager step): compute alone

Every process uses 1 intra-op thread. Each run: K steps, the median after the warm-up steps;
over the repetitions: median, min and max of those medians. The JSON also records the 1-minute
load average as each fxdp and DDP run starts ("load average per run").

usage: .venv/bin/python bench/step_vs_ddp.py [--build build] [--models mlp,transformer,gpt2]
           [--steps 30] [--warmup 5] [--reps 5] [--bucket-mb 25] [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from fxdp.zoo import models as zm  # noqa: E402
from launch_util import (  # noqa: E402,F401  (fully_shard_vs_fsdp2 uses them as sv.*)
    clean_env,
    free_port,
    rank_env,
)

LR = 1e-3


# --------------------------------------------------------------------------- models


class WideMLP(nn.Module):
    """4 Linear layers (1024 wide) with ReLU: 3.4M parameters, two DDP buckets."""

    def __init__(self, d: int = 1024, d_out: int = 256):
        super().__init__()
        self.fc1 = nn.Linear(d, d)
        self.fc2 = nn.Linear(d, d)
        self.fc3 = nn.Linear(d, d)
        self.fc4 = nn.Linear(d, d_out)

    def forward(self, x):
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        x = torch.relu(self.fc3(x))
        return self.fc4(x)


class GPT2(nn.Module):
    """A GPT-2 from Hugging Face transformers, built from a config in code (no weights; GPT2_FULL:
    6 layers, hidden 256, 4 heads, 128 positions, vocabulary 8192, dropout off: 6.9M parameters,
    27 MB of gradients per step). Returns the logits."""

    def __init__(self, layers: int, hidden: int, seq: int, vocab: int):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=vocab,
            n_positions=seq,
            n_embd=hidden,
            n_layer=layers,
            n_head=4 if hidden % 4 == 0 else 1,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        self.lm = GPT2LMHeadModel(cfg)

    def forward(self, tokens):
        return self.lm(input_ids=tokens).logits


# name -> (make model, loss, make global batch, input names)
def _mlp_batch(g):
    return torch.randn(128, 1024, generator=g), torch.randn(128, 256, generator=g)


def _lm_batch(g):
    toks = torch.randint(0, 2048, (16, 65), generator=g)
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()


# The GPT-2's size: (layers, hidden, seq, vocab, global batch). --quick: a tiny one (tests).
GPT2_FULL = (6, 256, 128, 8192, 4)  # 2 sequences of 128 tokens per rank at N=2
GPT2_QUICK = (2, 32, 16, 128, 4)
GPT2_SIZE = GPT2_FULL


def _gpt2_batch(g):
    _, _, seq, vocab, batch = GPT2_SIZE
    toks = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return toks[:, :-1].contiguous(), toks[:, 1:].contiguous()


MODELS = {
    # global batch 128 x 1024 -> 256
    "mlp": (lambda: WideMLP(), nn.MSELoss(), _mlp_batch, ("x", "target")),
    # the zoo's TransformerLM at d_model 256, 2 layers, vocab 2048; global batch 16 x 64 tokens
    "transformer": (
        lambda: zm.TransformerLM(vocab=2048, d_model=256, heads=4, ff=1024, layers=2, max_seq=64),
        zm.lm_loss,
        _lm_batch,
        ("tokens", "target"),
    ),
    # Hugging Face GPT-2 (6 x 256, seq 128, vocab 8192) with AdamW; global batch 4 x 128 tokens
    "gpt2": (lambda: GPT2(*GPT2_SIZE[:4]), zm.lm_loss, _gpt2_batch, ("tokens", "target")),
}
# Per-model defaults where --steps/--warmup/--reps are not given (a GPT-2 step is ~10x the
# others': fewer steps and repetitions keep the benchmark at a few minutes).
DEFAULTS = {"steps": 30, "warmup": 5, "reps": 5}
MODEL_DEFAULTS = {"gpt2": {"steps": 12, "warmup": 2, "reps": 3}}
QUICK_DEFAULTS = {"steps": 3, "warmup": 1, "reps": 1}
# AdamW for the GPT-2, Adam for the others (single-tensor, as traced)
OPTIMIZER = {"gpt2": lambda params: torch.optim.AdamW(params, lr=LR, weight_decay=0.01)}


def make(name: str, wrap=None):
    """The model (seed 0), its optimizer, loss, global batch and input names. ``wrap(model)``, when
    given, runs before the optimizer is built (FSDP2's fully_shard replaces the parameters)."""
    make_model, loss_fn, make_batch, names = MODELS[name]
    torch.manual_seed(0)
    model = make_model()
    if wrap is not None:
        wrap(model)
    opt = OPTIMIZER.get(name, lambda params: torch.optim.Adam(params, lr=LR))(model.parameters())
    batch = make_batch(torch.Generator().manual_seed(1234))
    return model, opt, loss_fn, batch, names


def shard(batch, rank: int, world: int):
    out = []
    for x in batch:
        b = x.shape[0]
        sizes = [b // world + (r < b % world) for r in range(world)]
        out.append(x.narrow(0, sum(sizes[:rank]), sizes[rank]).contiguous())
    return out


# --------------------------------------------------------------------------- eager / DDP child


def timed_steps(net, opt, loss_fn, x, y, steps: int) -> list:
    """`steps` eager training steps of `net` on (x, y): each one's wall time in ms, the loss read
    back (`.item()`) so that the step has finished."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        loss.item()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def eager_child(args) -> None:
    """One rank of the DDP run (world 2), or the plain eager step on the B/2 slice (world 1)."""
    torch.set_num_threads(1)
    from datetime import timedelta

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, opt, loss_fn, batch, _ = make(args.model)
    world = args.world
    if world > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port}",
            rank=args.rank,
            world_size=world,
            timeout=timedelta(seconds=120),
        )
        net = DDP(model, bucket_cap_mb=args.bucket_mb)
        x, y = shard(batch, args.rank, world)
    else:
        net = model
        x, y = shard(batch, 0, 2)  # the B/2 slice one rank of N=2 gets
    times = timed_steps(net, opt, loss_fn, x, y, args.steps)
    if world > 1:
        dist.barrier()
        del net  # the reducer goes before the process group
        dist.destroy_process_group()
    if args.rank == 0:
        print(json.dumps({"ms": times}))


# --------------------------------------------------------------------------- drivers


def launch(cmds_envs, timeout: float = 600, stderr: bool = False) -> list:
    """Runs the processes together; returns their stdouts, or (stdout, stderr) pairs (raises on
    failure)."""
    procs = [
        subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for c, e in cmds_envs
    ]
    outs = []
    for p, (c, _) in zip(procs, cmds_envs):
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{' '.join(c)} exited {p.returncode}:\n{err[-3000:]}")
        outs.append((out, err) if stderr else out)
    return outs


WORKER_STEP = re.compile(r"^step (\d+)/(\d+) loss (\S+) \(([\d.]+) ms\)((?: \S+=\S+)*)$")
BENCH_STEP = re.compile(
    r"^rank (\d+) step (\d+)/(\d+) loss (\S+) ms ([\d.]+) wait ([\d.]+) "
    r"start ([\d.]+) collectives (\d+) bytes (\d+)$"
)
# fxdp_step_bench --detail (stderr): per collective, in the order started
BENCH_DETAIL = re.compile(r"\[(\d+) B: ([\d.]+) ms in flight, ([\d.]+) ms waited\]")


def rank_graph(files, rank: int) -> str:
    """Rank `rank`'s expanded graph: one file for all ranks, or one per rank (`fxdp expand` writes
    X.rank<r>.expanded when the ranks differ, e.g. when they slice a replicated value's rows)."""
    return (
        files["expanded"]
        if files["identical"]
        else files["expanded"].replace(".expanded", f".rank{rank}.expanded")
    )


def rank_command(program: list, files, rank: int, steps: int, data: str = "") -> list:
    """`program` (fxdp-worker run, fxdp_step_bench) on rank `rank`'s graph, the state and `data`
    (default: the global batch) for `steps` steps on one thread: the arguments every worker
    benchmark gives."""
    return [
        *program,
        "--graph",
        rank_graph(files, rank),
        "--state",
        files["state"],
        "--data",
        data or files["batch"],
        "--steps",
        str(steps),
        "--threads",
        "1",
    ]


def run_worker(build, files, world: int, steps: int) -> list[float]:
    """fxdp-worker run on `world` ranks: the expanded graph on the global batch, or (world 1)
    the single-device graph of the B/2 slice."""
    port = free_port()
    if world == 1:
        files = {**files, "expanded": files["local_graph"], "identical": True}
    data = files["batch"] if world > 1 else files["local"]
    worker = [str(build / "bin" / "fxdp-worker"), "run"]
    cmd = lambda r: rank_command(worker, files, r, steps, data)  # noqa: E731
    out = launch([(cmd(r), rank_env(r, world, port)) for r in range(world)])[0]
    return [float(m.group(4)) for m in map(WORKER_STEP.match, out.splitlines()) if m]


def run_step_bench(build, files, world: int, steps: int):
    port = free_port()
    bench = [str(build / "bin" / "fxdp_step_bench")]
    cmd = lambda r: [*rank_command(bench, files, r, steps), "--detail"]  # noqa: E731
    outs = launch([(cmd(r), rank_env(r, world, port)) for r in range(world)], stderr=True)
    per_rank = []
    for out, err in outs:
        rows = [m for m in map(BENCH_STEP.match, out.splitlines()) if m]
        # per step: [(bytes, in flight ms, waited ms)] for each collective
        detail = [
            [(int(b), float(f), float(w)) for b, f, w in BENCH_DETAIL.findall(line)]
            for line in err.splitlines()
            if " collectives: [" in line
        ]
        per_rank.append(
            {
                "ms": [float(m.group(5)) for m in rows],
                "wait": [float(m.group(6)) for m in rows],
                "start": [float(m.group(7)) for m in rows],
                "collectives": int(rows[0].group(8)),
                "bytes": int(rows[0].group(9)),
                "detail": detail,
            }
        )
    return per_rank


def per_collective(detail, warmup: int) -> list[dict]:
    """Median over the steps after warm-up of each collective's time in flight before its wait
    and time blocked in the wait (the step bench's --detail lines)."""
    steps = detail[warmup:] or detail
    out = []
    for k in range(min(len(d) for d in steps)):
        out.append(
            {
                "bytes": steps[0][k][0],
                "in_flight_ms": statistics.median(d[k][1] for d in steps),
                "wait_ms": statistics.median(d[k][2] for d in steps),
            }
        )
    return out


def run_eager(model: str, world: int, steps: int, bucket_mb: float) -> list[float]:
    port = free_port()
    cmds = []
    for r in range(world):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--model",
            model,
            "--rank",
            str(r),
            "--world",
            str(world),
            "--port",
            str(port),
            "--steps",
            str(steps),
            "--bucket-mb",
            str(bucket_mb),
        ]
        if GPT2_SIZE == GPT2_QUICK:
            cmd.append("--quick")
        cmds.append((cmd, clean_env(OMP_NUM_THREADS=1)))
    out = launch(cmds)[0]
    return json.loads(out.strip().splitlines()[-1])["ms"]


def prepare(
    model_name: str, d: str, fxdp_bin: str, bucket_mb: float, style: str = "replicate"
) -> dict:
    """Traces `model_name`, writes its graph, state and batches under `d` and expands it for 2 ranks
    (`fxdp expand --style style`); the files' names say the style unless it is replicate."""
    import fxdp
    from safetensors.torch import save_file

    model, opt, loss_fn, batch, names = make(model_name)
    step = fxdp.trace(model, opt, loss_fn, batch, batch_dim=0, input_names=names)
    stem = model_name if style == "replicate" else f"{model_name}.{style}"
    files = {
        k: os.path.join(d, f"{stem}.{k}")
        for k in ("graph", "state", "batch", "local", "local_graph", "expanded")
    }
    step.save(files["graph"])
    step.to_safetensors(files["state"])
    save_file(dict(zip(names, batch)), files["batch"])
    local = shard(batch, 0, 2)
    save_file(dict(zip(names, local)), files["local"])
    # fxdp-worker N=1 runs one device's graph of the B/2 slice: a launch of one rank refuses a
    # graph expanded for 2 (run_rank.cc CheckExpandedFor).
    fxdp.trace(model, opt, loss_fn, local, batch_dim=0, input_names=names).save(
        files["local_graph"]
    )
    r = subprocess.run(
        [
            fxdp_bin,
            "expand",
            files["graph"],
            "--world-size",
            "2",
            "--bucket-mb",
            str(bucket_mb),
            "-o",
            files["expanded"],
            "--json",
        ]
        + (["--style", style] if style != "replicate" else []),
        check=True,
        capture_output=True,
        text=True,
    )
    report = json.loads(r.stdout)
    files["identical"] = os.path.exists(files["expanded"])
    nparams = sum(p.numel() for p in model.parameters())
    files["info"] = {
        "params": nparams,
        "graph_nodes": len(step.graph.nodes),
        "buckets": [b["bytes"] for b in report["buckets"]],
        "bytes_per_step": report["bytes_per_step"],
        "largest_gather": max(
            (
                c["bytes"]
                for c in report.get("collectives", [])
                if c.get("purpose", "").startswith("gather unit")
            ),
            default=0,
        ),
        "global_batch": list(batch[0].shape),
    }
    return files


def summary(per_run: list[float]) -> dict:
    return {
        "median": statistics.median(per_run),
        "min": min(per_run),
        "max": max(per_run),
        "runs": per_run,
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--models", default="mlp,transformer,gpt2")
    ap.add_argument("--steps", type=int, help="steps per run (default 30; gpt2 12)")
    ap.add_argument(
        "--warmup", type=int, help="steps left out of each run's median (default 5; gpt2 2)"
    )
    ap.add_argument("--reps", type=int, help="repetitions (default 5; gpt2 3)")
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a tiny GPT-2, 3 steps, 1 repetition, only the fxdp-worker and DDP runs (tests)",
    )
    ap.add_argument("--json")
    # child mode (one eager/DDP rank)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global GPT2_SIZE
    if args.quick:
        GPT2_SIZE = GPT2_QUICK
    if args.child:
        eager_child(args)
        return 0

    build = pathlib.Path(args.build).resolve()
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for name in args.models.split(","):
            base = QUICK_DEFAULTS if args.quick else {**DEFAULTS, **MODEL_DEFAULTS.get(name, {})}
            cfg = {
                k: getattr(args, k) if getattr(args, k) is not None else base[k]
                for k in ("steps", "warmup", "reps")
            }
            results[name] = bench_model(name, build, d, args, cfg)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "torch": torch.__version__,
                    "steps": args.steps or DEFAULTS["steps"],
                    "warmup": args.warmup or DEFAULTS["warmup"],
                    "reps": args.reps or DEFAULTS["reps"],
                    "bucket_mb": args.bucket_mb,
                    "quick": args.quick,
                    "results": results,
                },
                f,
                indent=1,
            )
    return 0


def _print_model_table(runs: dict, res: dict, detail: list, loads: list) -> None:
    """bench_model's summary: ms per step per run kind, the last repetition's collectives and the
    fxdp-worker / DDP ratio."""
    print(f"| {'ms per step':<22} | median | min | max |")
    print(f"|{'-' * 24}|---:|---:|---:|")
    for k in runs:
        s = res[k]
        print(f"| {k:<22} | {s['median']:.1f} | {s['min']:.1f} | {s['max']:.1f} |")
    r = res["fxdp-worker / DDP (per repetition)"]
    if detail:
        print(
            "fxdp collectives (rank 0, last repetition): "
            + ", ".join(
                f"{c['bytes']:,} B {c['in_flight_ms']:.1f} ms in flight, "
                f"{c['wait_ms']:.1f} ms waited"
                for c in detail[-1]
            )
        )
    print(
        f"fxdp-worker / DDP: median of medians {res['fxdp-worker N=2']['median'] / res['DDP N=2']['median']:.2f}, "
        f"per repetition median {r['median']:.2f} (min {r['min']:.2f}, max {r['max']:.2f}); "
        f"target <= 0.95; load average {min(loads):.1f}-{max(loads):.1f}\n",
        flush=True,
    )


def bench_model(name: str, build: pathlib.Path, d: str, args, cfg: dict) -> dict:
    steps, w = cfg["steps"], cfg["warmup"]
    med = lambda xs: statistics.median(xs[w:])  # noqa: E731
    files = prepare(name, d, str(build / "bin" / "fxdp"), args.bucket_mb)
    info = files["info"]
    print(
        f"== {name}: {info['params']:,} parameters, {info['graph_nodes']} graph nodes, global "
        f"batch {info['global_batch']}, buckets {info['buckets']} bytes; {cfg}",
        flush=True,
    )
    keys = ["fxdp-worker N=2", "DDP N=2"]
    if not args.quick:
        keys += [
            "fxdp_step_bench N=2",
            "fxdp wait (rank 0)",
            "fxdp wait (rank 1)",
            "fxdp start (rank 0)",
            "fxdp-worker N=1",
            "eager N=1",
        ]
    runs = {k: [] for k in keys}
    ratios, loads, run_loads, detail, sb = [], [], [], [], None
    for rep in range(cfg["reps"]):
        loads.append(os.getloadavg()[0])
        # fxdp and DDP back to back, in alternating order, so that each
        # repetition's ratio compares runs under similar machine load.
        pair = [
            ("fxdp-worker N=2", lambda: run_worker(build, files, 2, steps)),
            ("DDP N=2", lambda: run_eager(name, 2, steps, args.bucket_mb)),
        ]
        rl = {}
        for key, fn in pair if rep % 2 == 0 else pair[::-1]:
            rl[key] = os.getloadavg()[0]  # the 1-minute load average as the run starts
            runs[key].append(med(fn()))
        run_loads.append(rl)
        ratios.append(runs["fxdp-worker N=2"][-1] / runs["DDP N=2"][-1])
        if not args.quick:
            sb = run_step_bench(build, files, 2, steps)
            runs["fxdp_step_bench N=2"].append(med(sb[0]["ms"]))
            runs["fxdp wait (rank 0)"].append(med(sb[0]["wait"]))
            runs["fxdp wait (rank 1)"].append(med(sb[1]["wait"]))
            runs["fxdp start (rank 0)"].append(med(sb[0]["start"]))
            detail.append(per_collective(sb[0]["detail"], w))
            runs["fxdp-worker N=1"].append(med(run_worker(build, files, 1, steps)))
            runs["eager N=1"].append(med(run_eager(name, 1, steps, args.bucket_mb)))
        print(
            f"  rep {rep + 1} (load {loads[-1]:.1f}): "
            + ", ".join(f"{k} {v[-1]:.1f}" for k, v in runs.items())
            + f", ratio {ratios[-1]:.2f}",
            flush=True,
        )
    res = {k: summary(v) for k, v in runs.items()}
    res["fxdp-worker / DDP (per repetition)"] = summary(ratios)
    res["load average"] = loads
    res["load average per run"] = run_loads
    # rank 0 of the step bench, per repetition: every collective in the order started
    res["fxdp collectives (rank 0)"] = detail
    res["info"] = info
    res["config"] = cfg
    res["collectives_per_step"] = sb[0]["collectives"] if sb else None
    _print_model_table(runs, res, detail, loads)
    return res


if __name__ == "__main__":
    sys.exit(main())
