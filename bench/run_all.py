"""`make bench`: every performance claim of fxdp measured next to its baseline, in one run.

Runs the benchmarks of seven areas (AREAS below), each fxdp number with its baseline in the same
run, and writes bench/RESULTS.md (one table per area: what was measured, fxdp, baseline, ratio, the
command to reproduce it; medians over repetitions with min and max; the machine, date, git
commit and load average) and bench/results.json (every raw number). Raw per-program outputs
go to --raw (default bench/out/latest, not committed).

  pipeline   graph decode + analysis + expansion, 10k/100k/1M nodes, µs/node and peak RSS:
             fxdp_pipeline_bench against bench/fx_baseline.py (torch.fx + DTensor's view rules)
  executor   host overhead per node, 10k tiny ops: bench/executor_baselines.py (fxdp's
             interpreter, C++ direct, eager PyTorch, torch.fx.Interpreter, fx GraphModule)
  step       training step at N=2 on CPU against DDP (Gloo): bench/step_vs_ddp.py
  compile    compile RPC latency p50/p99, 1/4/16 clients, cache on/off: fxdp_compile_load
             against a real fxdp-server; the floor: the same compile in-process
  allreduce  all-reduce 1 KB-64 MB, 2 ranks on 127.0.0.1: fxdp's communicator against c10d's
             ProcessGroupGloo called directly and torch.distributed from Python; NCCL where
             two GPUs exist
  fsdp       FULLY_SHARD against REPLICATE against PyTorch FSDP2 (fully_shard, Gloo) at N=2
             on CPU, the GPT-2 of `step`: step time and memory per rank:
             bench/fully_shard_vs_fsdp2.py

usage: .venv/bin/python bench/run_all.py [--build build] [--areas pipeline,executor,...]
           [--merge] [--quick] [--md bench/RESULTS.md] [--json bench/results.json] [--raw DIR]

--quick runs every area in a tiny configuration (seconds; the test suite uses it): its
numbers mean nothing. ``render_markdown(results)`` (bench/results_markdown.py) turns
results.json back into RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from launch_util import free_port, rank_env
from results_markdown import render_markdown

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable
AREAS = ["pipeline", "executor", "step", "compile", "allreduce", "fsdp", "trace"]

FULL = {
    # nodes -> (fxdp reps, torch.fx reps)
    "pipeline_sizes": {10_000: (5, 5), 100_000: (5, 3), 1_000_000: (3, 2)},
    "world_size": 8,
    "executor": ["--reps", "7"],
    "step": [],  # step_vs_ddp.py's defaults: 5 repetitions of 30 steps; gpt2 3 of 12
    "compile_clients": [1, 4, 16],
    "compile_reps": 3,
    "compile_duration_s": 2.0,
    "allreduce": {"min": 1024, "max": 64 << 20, "factor": 2, "reps": 5, "budget_mb": 64},
    "fsdp": [],  # fully_shard_vs_fsdp2.py's defaults: the GPT-2, 3 repetitions of 12 steps
    "trace": [],  # trace_memory.py's defaults: 2-layer Llamas of hidden 512, 2048, 4096 on meta
}
QUICK = {
    "pipeline_sizes": {1_000: (1, 1)},
    "world_size": 8,
    "executor": ["--reps", "1"],
    "step": ["--reps", "1", "--models", "mlp", "--steps", "4", "--warmup", "1"],
    "compile_clients": [1, 2],
    "compile_reps": 1,
    "compile_duration_s": 0.2,
    "allreduce": {"min": 1024, "max": 16384, "factor": 4, "reps": 1, "budget_mb": 1},
    "fsdp": ["--quick"],
    "trace": ["--quick"],
}

N4_REASON = (
    "not run: this machine has 2 CPU cores, so 4 single-threaded ranks would be 2x "
    "oversubscribed and time the scheduler (ranks waiting for a core inside collectives), not "
    "fxdp or DDP; bench/step_vs_ddp.py also runs N=2 only (its world size is fixed). Run it on "
    "a machine with >= 4 free cores after adding a --world-size flag there."
)


# --------------------------------------------------------------------------- helpers


def summ(xs) -> dict:
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "n": len(xs),
        "values": list(xs),
    }


def load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def run(cmd, timeout=900, env=None, log=None) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env
    )
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(map(str, cmd))}\n{r.stdout}\n{r.stderr}\n")
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return r


def rel(p) -> str:
    try:
        return str(pathlib.Path(p).resolve().relative_to(REPO))
    except ValueError:
        return str(p)


def launch_ranks(cmd, world: int, timeout: float = 600, log=None) -> None:
    """Runs `cmd` as `world` ranks on 127.0.0.1 (RANK/WORLD_SIZE/MASTER_*)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [str(c) for c in cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=rank_env(r, world, port, OMP_NUM_THREADS=1),
        )
        for r in range(world)
    ]
    errors = []
    deadline = time.monotonic() + timeout
    for r, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{' '.join(map(str, cmd))}: rank {r} timed out after {timeout} s")
        if log is not None:
            with open(log, "a") as f:
                f.write(f"$ RANK={r} {' '.join(map(str, cmd))}\n{out}\n{err}\n")
        if p.returncode != 0:
            errors.append(f"rank {r} exited {p.returncode}: {err[-2000:]}")
    if errors:
        raise RuntimeError(f"{' '.join(map(str, cmd))}:\n" + "\n".join(errors))


def git(*args) -> str:
    try:
        return subprocess.run(
            ["git", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine(build: pathlib.Path) -> dict:
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    osname = platform.platform()
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    build_type = ""
    try:
        m = re.search(
            r"^CMAKE_BUILD_TYPE:STRING=(.*)$", (build / "CMakeCache.txt").read_text(), re.M
        )
        build_type = m.group(1) if m else ""
    except OSError:
        pass
    import torch

    gpus = 0
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        gpus = (
            sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
            if r.returncode == 0
            else 0
        )
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(dirty),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem / 2**30, 1),
        "gpus": gpus,
        "os": osname,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "build_dir": rel(build),
        "build_type": build_type,
        "load_start": load(),
    }


# --------------------------------------------------------------------------- areas


def area_pipeline(ctx) -> dict:
    cfg, bindir, raw = ctx["cfg"], ctx["bin"], ctx["raw"]
    world = cfg["world_size"]
    out = {"world_size": world, "sizes": []}
    with tempfile.TemporaryDirectory() as d:
        for target, (fx_reps, py_reps) in cfg["pipeline_sizes"].items():
            graph = pathlib.Path(d) / f"synthetic_{target}.pb"
            run(
                [bindir / "fxdp_pipeline_bench", f"--write_synthetic={target}", f"--out={graph}"],
                log=ctx["log"],
            )
            fj, pj = raw / f"pipeline_fxdp_{target}.json", raw / f"pipeline_fx_{target}.json"
            l0 = load()
            run(
                [
                    bindir / "fxdp_pipeline_bench",
                    f"--graph={graph}",
                    f"--reps={fx_reps}",
                    f"--world_size={world}",
                    f"--json={fj}",
                ],
                timeout=1800,
                log=ctx["log"],
            )
            run(
                [
                    PY,
                    REPO / "bench" / "fx_baseline.py",
                    "--graph",
                    graph,
                    "--reps",
                    py_reps,
                    "--world-size",
                    world,
                    "--json",
                    pj,
                ],
                timeout=1800,
                log=ctx["log"],
            )
            fx, py = json.loads(fj.read_text()), json.loads(pj.read_text())
            row = {
                "target_nodes": target,
                "nodes": fx["nodes"],
                "wire_bytes": fx["wire_bytes"],
                "load": [l0, load()],
                "fxdp": fx,
                "torch_fx": py,
            }
            for side, r in (("fxdp", fx), ("torch_fx", py)):
                n = r["nodes"]
                per = {}
                for ph in ("decode", "analyze", "expand"):
                    per[ph] = summ([t / n * 1e6 for t in r[f"{ph}_cpu_s"]])
                tot = [
                    sum(r[f"{ph}_cpu_s"][i] for ph in ("decode", "analyze", "expand"))
                    for i in range(r["reps"])
                ]
                per["total"] = summ([t / n * 1e6 for t in tot])
                per["total_wall"] = summ(
                    [
                        sum(r[f"{ph}_wall_s"][i] for ph in ("decode", "analyze", "expand"))
                        / n
                        * 1e6
                        for i in range(r["reps"])
                    ]
                )
                per["peak_rss_kb_per_node"] = r["peak_rss_bytes"] / n / 1024
                row[f"{side}_us_per_node"] = per
            out["sizes"].append(row)
    out["commands"] = {
        "fxdp": f"{rel(bindir)}/fxdp_pipeline_bench --write_synthetic=N --out=G.pb && "
        f"{rel(bindir)}/fxdp_pipeline_bench --graph=G.pb --reps=R --world_size={world}",
        "baseline": f".venv/bin/python bench/fx_baseline.py --graph G.pb --reps R --world-size {world}",
    }
    return out


def run_py_bench(ctx, name: str, args: list, timeout: int, keep_stdout: bool = True) -> dict:
    """Runs bench/<name>.py `args` --json RAW/<name>.json (its stdout kept as RAW/<name>.txt): the
    area's "raw" (that JSON), "load" (before and after) and "command" (as RESULTS.md shows it)."""
    j = ctx["raw"] / f"{name}.json"
    cmd = [PY, REPO / "bench" / f"{name}.py", *args, "--json", j]
    l0 = load()
    r = run(cmd, timeout=timeout, log=ctx["log"])
    if keep_stdout:
        (ctx["raw"] / f"{name}.txt").write_text(r.stdout)
    return {
        "raw": json.loads(j.read_text()),
        "load": [l0, load()],
        "command": " ".join(
            rel(c) if isinstance(c, pathlib.Path) else str(c) for c in cmd[1:]
        ).replace(str(ctx["raw"]), "OUT"),
    }


def area_executor(ctx) -> dict:
    res = run_py_bench(
        ctx,
        "executor_baselines",
        ["--bench", ctx["bin"] / "fxdp_executor_bench", *ctx["cfg"]["executor"]],
        900,
        keep_stdout=False,
    )
    data = res["raw"]
    return {
        "nodes": data.get("nodes"),
        **res,
        "ns_per_node": {k: summ(v) for k, v in data["ns_per_node"].items()},
    }


def area_step(ctx) -> dict:
    return {
        **run_py_bench(ctx, "step_vs_ddp", ["--build", ctx["build"], *ctx["cfg"]["step"]], 1500),
        "n4": N4_REASON,
    }


class Server:
    def __init__(self, binary, cache_entries: int):
        self.proc = subprocess.Popen(
            [str(binary), "--listen", "127.0.0.1:0", "--cache-entries", str(cache_entries)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(
                f"fxdp-server did not start: {line!r} {self.proc.stderr.read()[-2000:]}"
            )
        self.address = m.group(1)

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err


def area_compile(ctx) -> dict:
    cfg, bindir, raw = ctx["cfg"], ctx["bin"], ctx["raw"]
    clients, reps, dur = cfg["compile_clients"], cfg["compile_reps"], cfg["compile_duration_s"]
    zoo = raw / "zoo"
    run(
        [PY, "-m", "fxdp.zoo.export", zoo, "--models", "transformer", "--optims", "adam"],
        log=ctx["log"],
    )
    graph = zoo / "transformer_adam.pb"
    load_bin = bindir / "fxdp_compile_load"
    l0 = load()
    # Two servers at once (each idle while the other is measured), so that every repetition
    # measures both modes back to back.
    servers = {
        "cache on": Server(bindir / "fxdp-server", 256),
        "cache off": Server(bindir / "fxdp-server", 0),
    }
    runs = {}
    try:
        for rep in range(reps):
            for rpc in ("analyze", "expand"):
                r = run(
                    [
                        load_bin,
                        "--inprocess",
                        f"--graph={graph}",
                        f"--rpc={rpc}",
                        f"--duration_s={dur}",
                    ],
                    log=ctx["log"],
                )
                runs.setdefault((rpc, "in-process", 1), []).append(json.loads(r.stdout))
                for c in clients:
                    for mode in (
                        ("cache on", "cache off") if rep % 2 == 0 else ("cache off", "cache on")
                    ):
                        r = run(
                            [
                                load_bin,
                                f"--server={servers[mode].address}",
                                f"--graph={graph}",
                                f"--rpc={rpc}",
                                f"--clients={c}",
                                f"--duration_s={dur}",
                            ],
                            timeout=300,
                            log=ctx["log"],
                        )
                        runs.setdefault((rpc, mode, c), []).append(json.loads(r.stdout))
    finally:
        stops = {m: s.stop() for m, s in servers.items()}
    rows = []
    for (rpc, mode, c), rs in runs.items():
        rows.append(
            {
                "rpc": rpc,
                "mode": mode,
                "clients": c,
                "p50_ms": summ([x["p50_ms"] for x in rs]),
                "p99_ms": summ([x["p99_ms"] for x in rs]),
                "qps": summ([x["qps"] for x in rs]),
                "requests": sum(x["requests"] for x in rs),
                "cached_fraction": summ([x["cached_fraction"] for x in rs])["median"],
                "runs": rs,
            }
        )
    first = next(iter(runs.values()))[0]
    return {
        "graph": "zoo transformer + Adam (python -m fxdp.zoo.export DIR --models transformer --optims adam)",
        "graph_nodes": first["graph_nodes"],
        "request_bytes": first["request_bytes"],
        "world_size": first["world_size"],
        "duration_s": dur,
        "reps": reps,
        "rows": rows,
        "server_stderr": {m: e.strip().splitlines()[-1:] for m, e in stops.items()},
        "load": [l0, load()],
        "commands": {
            "server": f"{rel(bindir)}/fxdp-server --listen 127.0.0.1:0 [--cache-entries 0]",
            "load": f"{rel(bindir)}/fxdp_compile_load --server=ADDR --graph=transformer_adam.pb "
            f"--rpc=analyze|expand --clients=N --duration_s={dur}",
            "floor": f"{rel(bindir)}/fxdp_compile_load --inprocess --graph=transformer_adam.pb "
            f"--rpc=analyze|expand --duration_s={dur}",
        },
    }


def area_allreduce(ctx) -> dict:
    a, bindir, raw = ctx["cfg"]["allreduce"], ctx["bin"], ctx["raw"]
    flags = [
        f"--min_bytes={a['min']}",
        f"--max_bytes={a['max']}",
        f"--factor={a['factor']}",
        f"--reps={a['reps']}",
        f"--budget_mb={a['budget_mb']}",
    ]
    l0 = load()
    cj, pj = raw / "allreduce_fxdp.json", raw / "allreduce_torch.json"
    launch_ranks(
        [bindir / "fxdp_allreduce_bench", "--device=cpu", *flags, f"--json={cj}"], 2, log=ctx["log"]
    )
    launch_ranks(
        [
            PY,
            REPO / "bench" / "allreduce_torch.py",
            "--min-bytes",
            a["min"],
            "--max-bytes",
            a["max"],
            "--factor",
            a["factor"],
            "--reps",
            a["reps"],
            "--budget-mb",
            a["budget_mb"],
            "--json",
            pj,
        ],
        2,
        log=ctx["log"],
    )
    c, p = json.loads(cj.read_text()), json.loads(pj.read_text())
    assert c["bytes"] == p["bytes"], (c["bytes"], p["bytes"])
    world = c["world_size"]
    impls = {**c["time_us"], **p["time_us"]}
    table = []
    for i, nbytes in enumerate(c["bytes"]):
        row = {"bytes": nbytes, "iterations": c["iterations"][i]}
        for name, per_size in impls.items():
            t = summ(per_size[i])
            algbw = summ([nbytes / (x * 1e-6) / 1e9 for x in per_size[i]])  # GB/s
            row[name] = {
                "time_us": t,
                "algbw_gbs": algbw,
                "busbw_gbs": summ([x * 2 * (world - 1) / world for x in algbw["values"]]),
            }
        table.append(row)
    nccl = "not run: no GPU on this machine"
    if ctx["meta"].get("gpus", 0) >= 2:
        nj = raw / "allreduce_nccl.json"
        try:
            launch_ranks(
                [bindir / "fxdp_allreduce_bench", "--device=cuda", *flags, f"--json={nj}"],
                2,
                log=ctx["log"],
            )
            nccl = json.loads(nj.read_text())
        except RuntimeError as e:
            nccl = f"failed: {e}"
    elif ctx["meta"].get("gpus", 0) == 1:
        nccl = "not run: one GPU (NCCL needs one GPU per rank, 2 ranks)"
    return {
        "world_size": world,
        "dtype": c["dtype"],
        "reps": a["reps"],
        "impls": list(impls),
        "table": table,
        "nccl": nccl,
        "load": [l0, load()],
        "raw": {"cpp": c, "torch": p},
        "commands": {
            "fxdp + c10d": "RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P "
            f"{rel(bindir)}/fxdp_allreduce_bench --device=cpu " + " ".join(flags),
            "torch.distributed": "RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P "
            ".venv/bin/python bench/allreduce_torch.py "
            f"--min-bytes {a['min']} --max-bytes {a['max']} --factor {a['factor']} "
            f"--reps {a['reps']} --budget-mb {a['budget_mb']}",
            "nccl": "... fxdp_allreduce_bench --device=cuda (a GPU per rank, built with NCCL)",
        },
    }


def area_fsdp(ctx) -> dict:
    return run_py_bench(
        ctx, "fully_shard_vs_fsdp2", ["--build", ctx["build"], *ctx["cfg"]["fsdp"]], 1500
    )


def area_trace(ctx) -> dict:
    return run_py_bench(ctx, "trace_memory", ctx["cfg"]["trace"], 1800)


RUNNERS = {
    "pipeline": area_pipeline,
    "executor": area_executor,
    "step": area_step,
    "compile": area_compile,
    "allreduce": area_allreduce,
    "fsdp": area_fsdp,
    "trace": area_trace,
}


# --------------------------------------------------------------------------- main


def update_step_models(args) -> int:
    """--step-models: measure some models of the step area and merge them into --json."""
    results = json.loads(pathlib.Path(args.json).read_text())
    raw = pathlib.Path(args.raw).resolve()
    raw.mkdir(parents=True, exist_ok=True)
    build = pathlib.Path(args.build).resolve()
    meta = machine(build)
    ctx = {
        "cfg": {**FULL, "step": ["--models", args.step_models]},
        "bin": build / "bin",
        "build": build,
        "raw": raw,
        "log": raw / "commands.log",
        "meta": meta,
    }
    ctx["log"].write_text("")
    res = area_step(ctx)
    step = results["areas"].setdefault(
        "step",
        {"raw": {"results": {}}, "load": res["load"], "n4": N4_REASON, "command": res["command"]},
    )
    for name, m in res["raw"]["results"].items():
        m["measured"] = {
            "date": meta["date"],
            "git_commit": meta["git_commit"],
            "load": res["load"],
            "command": res["command"],
        }
        step["raw"]["results"][name] = m
    pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    pathlib.Path(args.md).write_text(render_markdown(results))
    print(f"merged {args.step_models} into {rel(args.json)} and {rel(args.md)}", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--areas", default=",".join(AREAS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--md", default=str(REPO / "bench" / "RESULTS.md"))
    ap.add_argument("--json", default=str(REPO / "bench" / "results.json"))
    ap.add_argument("--raw", default=str(REPO / "bench" / "out" / "latest"))
    ap.add_argument(
        "--render", metavar="RESULTS_JSON", help="only write --md from an existing results.json"
    )
    ap.add_argument(
        "--step-models",
        metavar="MODELS",
        help="run only the step area for these models (bench/step_vs_ddp.py --models) and "
        "replace their rows in the existing --json results (each keeps when and at "
        "which commit it was measured); then write --md",
    )
    ap.add_argument(
        "--merge",
        action="store_true",
        help="replace only the --areas run in the existing --json results (each keeps when "
        "and at which commit it was measured), keep the others; then write --md",
    )
    args = ap.parse_args(argv)
    if args.step_models:
        return update_step_models(args)
    if args.render:
        results = json.loads(pathlib.Path(args.render).read_text())
        pathlib.Path(args.md).write_text(render_markdown(results))
        return 0
    areas = [a for a in args.areas.split(",") if a]
    unknown = [a for a in areas if a not in RUNNERS]
    if unknown:
        ap.error(f"unknown area(s) {unknown}; known: {AREAS}")
    build = pathlib.Path(args.build).resolve()
    bindir = build / "bin"
    raw = pathlib.Path(args.raw).resolve()
    raw.mkdir(parents=True, exist_ok=True)
    log = raw / "commands.log"
    log.write_text("")
    t_start = time.monotonic()
    meta = machine(build)
    meta["quick"] = args.quick
    ctx = {
        "cfg": QUICK if args.quick else FULL,
        "bin": bindir,
        "build": build,
        "raw": raw,
        "log": log,
        "meta": meta,
    }
    results = {"meta": meta, "areas": {}}
    failed = []
    for name in areas:
        t0, l0 = time.monotonic(), load()
        print(f"== {name} (load {l0})", flush=True)
        try:
            res = RUNNERS[name](ctx)
        except Exception as e:  # noqa: BLE001 - one failing area must not lose the others
            res = {"error": f"{type(e).__name__}: {e}", "load": [load()]}
            failed.append(name)
            print(f"   {name} FAILED: {e}", file=sys.stderr, flush=True)
        res["wall_s"] = round(time.monotonic() - t0, 1)
        res["load"] = [l0, load()]
        results["areas"][name] = res
        print(f"   {name}: {res['wall_s']:.0f} s", flush=True)
    meta["load_end"] = load()
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    if args.merge:
        merged = json.loads(pathlib.Path(args.json).read_text())
        for name, res in results["areas"].items():
            res["measured"] = {
                "date": meta["date"],
                "git_commit": meta["git_commit"],
                "load": res["load"],
            }
            merged["areas"][name] = res
        results = merged
    pathlib.Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    pathlib.Path(args.md).write_text(render_markdown(results))
    print(
        f"wrote {rel(args.md)} and {rel(args.json)} in {meta['wall_s'] / 60:.1f} min"
        + (f"; FAILED: {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
