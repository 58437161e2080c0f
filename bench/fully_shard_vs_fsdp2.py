"""FULLY_SHARD against REPLICATE against PyTorch FSDP2 at N=2 on CPU: step time and memory per
rank, same model, same global batches, same optimizer, side by side in one run.

The model, its optimizer, its batches and the fxdp graphs come from bench/step_vs_ddp.py (the
GPT-2 there by default: Hugging Face GPT-2, 6 layers, hidden 256, seq 128, vocabulary 8192,
6.9M parameters, AdamW; global batch 4 x 128 tokens, 2 sequences per rank). Each repetition
runs, back to back in rotating order:

  fxdp fully_shard  ``fxdp expand --style fully_shard --bucket-mb 4`` (units of about one
                    transformer block, as FSDP2 below) + 2 ``fxdp-worker run`` processes
  fxdp replicate    ``fxdp expand --style replicate`` + 2 ``fxdp-worker run`` processes
  FSDP2             2 Python processes, ``torch.distributed.fsdp.fully_shard`` on every
                    ``nn.ModuleList`` element (the transformer blocks) and on the root, over
                    Gloo, each on its B/2 slice: zero_grad, forward, loss, backward,
                    optimizer.step, loss.item() timed per step on rank 0

Every process uses 1 intra-op thread. Step time: the median of the steps after the warm-up of
rank 0, then median (min-max) over the repetitions.

Memory, three numbers per rank:
  * live tensor bytes (a separate 3-step run per fxdp style under FXDP_MEMORY_TRACE, which counts
    every CPU tensor allocation at LibTorch's allocator): the state held between steps and the peak
    during a step, next to issue 15's formula (see `formula`); not for FSDP2 (Python has no such
    counter: its RSS and state bytes stand for it).
  * peak RSS delta: the process' peak resident set (its VmHWM, sampled every 10 ms: the whole
    run, loading the state and every step) minus the peak of the same program training the tiny
    GPT-2 (2 layers, hidden 32, vocabulary 128: ~40K parameters) with the same batch shape
    layout, so the runtime's own footprint (LibTorch, Python, Gloo) cancels out. It includes
    activations, gathered parameters and communication buffers: what the process really needs.
  * state bytes: parameters + gradients + optimizer state a rank holds between steps, counted
    from the tensors: for fxdp from its rank graph's PARAMETER and OPTIMIZER_STATE placeholders
    (a gradient per parameter, the same size: a flat shard under fully_shard), for FSDP2 from
    the local tensors of its DTensor parameters, gradients and optimizer state after the last
    step. Under fully_shard about 1/N of replicate's; during a step a rank also holds the
    unsharded parameters of the unit in use (FSDP2: one block; fxdp: see docs/fully_shard.md).

usage: .venv/bin/python bench/fully_shard_vs_fsdp2.py [--build build] [--model gpt2]
           [--steps 12] [--warmup 2] [--reps 3] [--systems ...] [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import step_vs_ddp as sv  # noqa: E402  (the models, batches, graphs and launch helpers)
import torch  # noqa: E402

SYSTEMS = ("fxdp fully_shard", "fxdp replicate", "FSDP2")
WORLD = 2


# --------------------------------------------------------------------------- processes


def vm_hwm(pid: int) -> int:
    """The process' peak resident set so far (VmHWM, bytes); 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def launch_peak(cmds_envs, timeout: float = 900) -> list:
    """Runs the processes together; returns (stdout, stderr, peak RSS bytes) per process (raises on
    failure or timeout). The peak is the process' own VmHWM, read every 10 ms while it runs (it
    only grows; wait4's ru_maxrss would also count the parent's RSS at fork, Linux carries the
    forked image's high-water mark across exec)."""
    procs = []
    for cmd, env in cmds_envs:
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        procs.append(
            (subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True), out, err, cmd)
        )
    peaks = [0] * len(procs)
    done = threading.Event()

    def sample():
        while not done.is_set():
            for i, (p, *_) in enumerate(procs):
                peaks[i] = max(peaks[i], vm_hwm(p.pid))
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    deadline = time.monotonic() + timeout
    results, failed = [], []
    try:
        for p, out, err, cmd in procs:
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q, *_ in procs:
                    q.kill()
                raise RuntimeError(f"{' '.join(map(str, cmd))} timed out after {timeout} s")
    finally:
        done.set()
        sampler.join()
    for i, (p, out, err, cmd) in enumerate(procs):
        out.seek(0)
        err.seek(0)
        o, e = out.read(), err.read()
        if p.returncode != 0:
            failed.append(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{e[-3000:]}")
        results.append((o, e, peaks[i]))
    if failed:
        raise RuntimeError("\n".join(failed))
    return results


def run_fxdp(build: pathlib.Path, files: dict, steps: int, trace_dir: str | None = None) -> dict:
    """Two fxdp-worker ranks. With `trace_dir`, under FXDP_MEMORY_TRACE (live tensor bytes counted at
    the CPU allocator; slower, so the timed runs go without it): adds "memory", per rank."""
    port = sv.free_port()
    worker = [str(build / "bin" / "fxdp-worker"), "run"]
    cmd = lambda r: sv.rank_command(worker, files, r, steps)  # noqa: E731

    def env(r):
        e = sv.rank_env(r, WORLD, port)
        if trace_dir:
            e["FXDP_MEMORY_TRACE"] = os.path.join(trace_dir, "memory.{rank}.json")
        return e

    res = launch_peak([(cmd(r), env(r)) for r in range(WORLD)])
    ms = [float(m.group(4)) for m in map(sv.WORKER_STEP.match, res[0][0].splitlines()) if m]
    out = {"ms": ms, "peak_rss": [r[2] for r in res]}
    if trace_dir:
        out["memory"] = [
            memory_summary(os.path.join(trace_dir, f"memory.{r}.json")) for r in range(WORLD)
        ]
    return out


def memory_summary(path: str) -> dict:
    """One rank's FXDP_MEMORY_TRACE (executor/worker/memory_trace.h), live tensor bytes: the state held
    between steps; at the end of backward (before the first wait for a gradient bucket, fxdp's
    `fxdp_wait_bucket<k>` nodes: every gradient exists, the activations are gone): the parameters +
    gradients + optimizer state; the peak during the steps and its node. And the resident set peak."""
    t = json.loads(pathlib.Path(path).read_text())
    nodes = t["nodes"]
    node = max(nodes, key=lambda n: n[3])
    at = next((i for i, n in enumerate(nodes) if n[0].startswith("fxdp_wait_bucket")), None)
    return {
        "state": t["load"]["live"],
        "peak": max(s["peak"] for s in t["steps"]),
        "peak_node": f"{node[0]} ({node[1]})",
        "load_peak": t["load"]["peak"],
        "end_of_backward": nodes[at - 1][2] if at else None,
        "rss_peak": t["steps"][-1]["hwm"],
    }


def run_fsdp2(model: str, steps: int, tiny: bool) -> dict:
    tiny = tiny or sv.GPT2_SIZE == sv.GPT2_QUICK
    port = sv.free_port()
    cmds = []
    for r in range(WORLD):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--model",
            model,
            "--rank",
            str(r),
            "--port",
            str(port),
            "--steps",
            str(steps),
        ] + (["--tiny"] if tiny else [])
        cmds.append((cmd, sv.clean_env(OMP_NUM_THREADS=1)))
    res = launch_peak(cmds)
    rows = [json.loads(o.strip().splitlines()[-1]) for o, _, _ in res]
    return {
        "ms": rows[0]["ms"],
        "peak_rss": [r[2] for r in res],
        "state_bytes": [row["state_bytes"] for row in rows],
    }


def fsdp2_child(args) -> None:
    """One rank of the FSDP2 run: fully_shard on every ModuleList element and the root."""
    torch.set_num_threads(1)
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    if args.tiny:
        sv.GPT2_SIZE = sv.GPT2_QUICK
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=WORLD,
        timeout=timedelta(seconds=120),
    )

    def wrap(m: torch.nn.Module) -> None:
        for sub in list(m.modules()):
            if isinstance(sub, torch.nn.ModuleList):
                for unit in sub:
                    fully_shard(unit)
        fully_shard(m)

    model, opt, loss_fn, batch, _ = sv.make(args.model, wrap=wrap)
    x, y = sv.shard(batch, args.rank, WORLD)
    times = sv.timed_steps(model, opt, loss_fn, x, y, args.steps)

    def local_bytes(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    held = sum(local_bytes(p) for p in model.parameters())
    held += sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    held += sum(
        local_bytes(v)
        for st in opt.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() > 0
    )
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"ms": times, "state_bytes": held}))


# --------------------------------------------------------------------------- fxdp state bytes


def graph_state_bytes(path: str) -> int:
    """Parameters + gradients + optimizer state one rank holds between steps, from its graph's
    placeholders: PARAMETER twice (the parameter and its gradient), OPTIMIZER_STATE once (0-d
    entries, the step counters, left out as for FSDP2)."""
    from fxdp.v1 import graph_pb2 as gpb

    g = gpb.GraphDef()
    g.ParseFromString(pathlib.Path(path).read_bytes())
    itemsize = {
        gpb.FLOAT32: 4,
        gpb.FLOAT64: 8,
        gpb.FLOAT16: 2,
        gpb.BFLOAT16: 2,
        gpb.INT64: 8,
        gpb.INT32: 4,
    }
    total = 0
    for n in g.nodes:
        if n.kind != gpb.PLACEHOLDER or not n.outputs:
            continue
        t = n.outputs[0].tensor
        if len(t.shape) == 0:
            continue
        numel = 1
        for d in t.shape:
            numel *= d
        nbytes = numel * itemsize.get(t.dtype, 4)
        if n.placeholder.role == gpb.PARAMETER:
            total += 2 * nbytes
        elif n.placeholder.role == gpb.OPTIMIZER_STATE:
            total += nbytes
    return total


# --------------------------------------------------------------------------- driver


def summary(xs) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": list(xs)}


def bench(args) -> dict:
    build = pathlib.Path(args.build).resolve()
    fxdp_bin = str(build / "bin" / "fxdp")
    steps, warm = args.steps, args.warmup
    out = {
        "model": args.model,
        "world_size": WORLD,
        "steps": steps,
        "warmup": warm,
        "reps": args.reps,
        "bucket_mb": args.bucket_mb,
        "unit_mb": args.unit_mb,
        "quick": args.quick,
        "torch": torch.__version__,
    }
    # fully_shard's units (parameters gathered together) are capped by --bucket-mb like REPLICATE's
    # buckets; --unit-mb caps them about as FSDP2 is wrapped here (a unit per transformer block).
    cap = lambda style: args.unit_mb if style == "fully_shard" else args.bucket_mb  # noqa: E731
    systems = [k for k in SYSTEMS if k in args.systems.split(",")]
    styles = [k.split()[1] for k in systems if k.startswith("fxdp ")]
    with tempfile.TemporaryDirectory() as d:
        files = {s: sv.prepare(args.model, d, fxdp_bin, cap(s), style=s) for s in styles}
        info = (
            next(iter(files.values()))["info"]
            if files
            else sv.prepare(args.model, d, fxdp_bin, args.bucket_mb)["info"]
        )
        out["info"] = {k: info[k] for k in ("params", "global_batch", "graph_nodes")}
        out["state_bytes"] = {
            f"fxdp {s}": [graph_state_bytes(sv.rank_graph(files[s], r)) for r in range(WORLD)]
            for s in files
        }
        print(
            f"== {args.model}: {info['params']:,} parameters, global batch {info['global_batch']}, "
            f"N={WORLD}; steps {steps}, warm-up {warm}, repetitions {args.reps}",
            flush=True,
        )
        runners = {
            "fxdp fully_shard": lambda: run_fxdp(build, files["fully_shard"], steps),
            "fxdp replicate": lambda: run_fxdp(build, files["replicate"], steps),
            "FSDP2": lambda: run_fsdp2(args.model, steps, tiny=False),
        }
        ms, peak, loads = _timed_reps(args, systems, runners, out)
        # Live tensor bytes, counted at the CPU allocator, in a separate short run per style.
        out["memory"] = {}
        for st in styles:
            with tempfile.TemporaryDirectory() as td:
                out["memory"][f"fxdp {st}"] = run_fxdp(build, files[st], 3, trace_dir=td)["memory"]
        out["formula"] = formula(out, files, styles)
        base = _baseline_peak_rss(args, d, fxdp_bin, styles, systems, cap)
    out["load average"] = loads
    out["ms_per_step"] = {k: summary(v) for k, v in ms.items()}
    # per rank: the median over repetitions of the peak RSS
    out["peak_rss"] = {
        k: [statistics.median(p[r] for p in v) for r in range(WORLD)] for k, v in peak.items()
    }
    out["baseline_peak_rss"] = base
    out["peak_rss_delta"] = {
        k: [out["peak_rss"][k][r] - base[k][r] for r in range(WORLD)] for k in base
    }
    _print_table(out, systems)
    print_memory(out)
    return out


def _timed_reps(args, systems, runners, out):
    """args.reps repetitions, each system once per repetition in rotating order: per system the
    median ms per step after the warm-up and the peak RSS per rank of each run; the load average
    as each repetition starts."""
    med = lambda xs: statistics.median(xs[args.warmup :] or xs)  # noqa: E731
    ms = {k: [] for k in systems}
    peak = {k: [] for k in systems}
    loads = []
    for rep in range(args.reps):
        loads.append(os.getloadavg()[0])
        order = systems[rep % len(systems) :] + systems[: rep % len(systems)]
        for k in order:
            r = runners[k]()
            ms[k].append(med(r["ms"]))
            peak[k].append(r["peak_rss"])
            if k == "FSDP2":
                out["state_bytes"]["FSDP2"] = r["state_bytes"]
        print(
            f"  rep {rep + 1} (load {loads[-1]:.1f}): "
            + ", ".join(f"{k} {ms[k][-1]:.1f} ms" for k in systems),
            flush=True,
        )
    return ms, peak, loads


def _baseline_peak_rss(args, d, fxdp_bin, styles, systems, cap) -> dict:
    """The runtime's own footprint: the same programs training the tiny GPT-2 (gpt2, full mode
    only; else {})."""
    base = {}
    if args.quick or args.model != "gpt2":
        return base
    build = pathlib.Path(args.build).resolve()
    sv.GPT2_SIZE = sv.GPT2_QUICK
    tiny_dir = os.path.join(d, "tiny")
    os.makedirs(tiny_dir)
    tiny = {s: sv.prepare("gpt2", tiny_dir, fxdp_bin, cap(s), style=s) for s in styles}
    for s in styles:
        base[f"fxdp {s}"] = run_fxdp(build, tiny[s], 2)["peak_rss"]
    if "FSDP2" in systems:
        base["FSDP2"] = run_fsdp2("gpt2", 2, tiny=True)["peak_rss"]
    sv.GPT2_SIZE = sv.GPT2_FULL
    return base


def _print_table(out: dict, systems: list) -> None:
    MB = 1e6
    print(
        f"| {'N=2, per rank':<18} | ms/step | peak RSS MB (rank 0, 1) | delta over tiny MB | "
        f"state bytes MB |"
    )
    print("|---|---:|---:|---:|---:|")
    for k in systems:
        s = out["ms_per_step"][k]
        delta = out["peak_rss_delta"].get(k)
        print(
            f"| {k:<18} | {s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f}) | "
            f"{', '.join(f'{x / MB:.0f}' for x in out['peak_rss'][k])} | "
            f"{', '.join(f'{x / MB:.0f}' for x in delta) if delta else '-'} | "
            f"{', '.join(f'{x / MB:.1f}' for x in out['state_bytes'].get(k, []))} |",
            flush=True,
        )


def formula(out: dict, files: dict, styles: list) -> dict:
    """Issue 15's formula, per rank, next to the measurement. P: parameter bytes; k: optimizer state
    per parameter (2 for AdamW: from the REPLICATE graph's state); N: ranks; U: the largest unit
    FULLY_SHARD gathers (fxdp expand's collectives); A: activations, measured separately: a style's
    peak live bytes minus the state it holds (the peak is at the loss, before any gradient exists).
                                         REPLICATE          FULLY_SHARD
      state held between steps           (1+k)P             (1+k)P/N
      params + grads + optimizer state   (2+k)P             (2+k)P/N + U   (a unit gathered)
      peak live tensors                  (1+k)P + A         (1+k)P/N + A + U"""
    if "replicate" not in styles or "fully_shard" not in styles:
        return {}
    P = files["replicate"]["info"]["params"] * 4
    rep_state = graph_state_bytes(sv.rank_graph(files["replicate"], 0))
    k = round(rep_state / P - 2)
    U = files["fully_shard"]["info"]["largest_gather"]
    rep = out["memory"]["fxdp replicate"][0]
    A = rep["peak"] - rep["state"]
    N = WORLD
    return {
        "P": P,
        "k": k,
        "N": N,
        "U": U,
        "A": A,
        "fxdp replicate": {"state": (1 + k) * P, "pgo": (2 + k) * P, "peak": (1 + k) * P + A},
        "fxdp fully_shard": {
            "state": (1 + k) * P / N,
            "pgo": (2 + k) * P / N + U,
            "peak": (1 + k) * P / N + A + U,
        },
    }


def print_memory(out: dict) -> None:
    f = out.get("formula")
    if not f:
        return
    MB = 1e6
    print(
        f"live tensor bytes per rank (rank 0), MB; P={f['P'] / MB:.1f} (parameters), k={f['k']}, "
        f"N={f['N']}, U={f['U'] / MB:.1f} (largest gathered unit), A={f['A'] / MB:.1f} (activations "
        "at the peak: REPLICATE's peak minus its state)"
    )
    print(
        "| style | state held: measured / formula | params + grads + optimizer state (end of backward):"
        " measured / formula | peak: measured / formula | peak at | peak RSS (traced run) |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for k in ("fxdp replicate", "fxdp fully_shard"):
        m, g = out["memory"][k][0], f[k]
        eob = f"{m['end_of_backward'] / MB:.1f}" if m["end_of_backward"] is not None else "-"
        print(
            f"| {k} | {m['state'] / MB:.1f} / {g['state'] / MB:.1f} | {eob} / {g['pgo'] / MB:.1f} | "
            f"{m['peak'] / MB:.1f} / {g['peak'] / MB:.1f} | {m['peak_node']} | {m['rss_peak'] / MB:.0f} |",
            flush=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--build", default=str(sv.REPO / "build"))
    ap.add_argument("--model", default="gpt2", choices=sorted(sv.MODELS))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--bucket-mb", type=float, default=25, help="replicate's bucket cap, MiB (DDP's 25)"
    )
    ap.add_argument(
        "--unit-mb",
        type=float,
        default=4,
        help="fully_shard's unit cap, MiB (fxdp expand --bucket-mb): 4 gathers about one "
        "GPT-2 block at a time, as FSDP2's per-block units do (default 4)",
    )
    ap.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"which to run, comma-separated (default: all of {', '.join(SYSTEMS)})",
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the tiny GPT-2, 3 steps, 1 repetition, no baseline runs (tests)",
    )
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.quick:
            args.tiny = True
        fsdp2_child(args)
        return 0
    if args.quick:
        sv.GPT2_SIZE = sv.GPT2_QUICK
        args.steps, args.warmup, args.reps = 3, 1, 1
    res = bench(args)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
