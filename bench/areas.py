"""The areas of `make bench` (bench/run_all.py): each runs its fxdp benchmark and its baseline in
the same run and returns their numbers (the raw JSON, medians, load, the commands); RUNNERS maps
an area's name to its function, which takes the run's context (cfg, bin, build, raw, log, meta)."""

from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import tempfile

from run_util import PY, REPO, launch_ranks, load, rel, run, summ

N4_REASON = (
    "not run: this machine has 2 CPU cores, so 4 single-threaded ranks would be 2x "
    "oversubscribed and time the scheduler (ranks waiting for a core inside collectives), not "
    "fxdp or DDP; bench/step_vs_ddp.py also runs N=2 only (its world size is fixed). Run it on "
    "a machine with >= 4 free cores after adding a --world-size flag there."
)


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


def _compile_runs(ctx, graph, servers: dict) -> dict:
    """fxdp_compile_load's JSON by (rpc, mode, clients), a list of one per repetition: in-process,
    then each client count against both servers, the order of the modes alternating."""
    cfg, load_bin = ctx["cfg"], ctx["bin"] / "fxdp_compile_load"
    dur = f"--duration_s={cfg['compile_duration_s']}"
    runs = {}
    for rep in range(cfg["compile_reps"]):
        for rpc in ("analyze", "expand"):
            r = run(
                [load_bin, "--inprocess", f"--graph={graph}", f"--rpc={rpc}", dur], log=ctx["log"]
            )
            runs.setdefault((rpc, "in-process", 1), []).append(json.loads(r.stdout))
            for c in cfg["compile_clients"]:
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
                            dur,
                        ],
                        timeout=300,
                        log=ctx["log"],
                    )
                    runs.setdefault((rpc, mode, c), []).append(json.loads(r.stdout))
    return runs


def area_compile(ctx) -> dict:
    cfg, bindir, raw = ctx["cfg"], ctx["bin"], ctx["raw"]
    reps, dur = cfg["compile_reps"], cfg["compile_duration_s"]
    zoo = raw / "zoo"
    run(
        [PY, "-m", "fxdp.zoo.export", zoo, "--models", "transformer", "--optims", "adam"],
        log=ctx["log"],
    )
    graph = zoo / "transformer_adam.pb"
    l0 = load()
    # Two servers at once (each idle while the other is measured), so that every repetition
    # measures both modes back to back.
    servers = {
        "cache on": Server(bindir / "fxdp-server", 256),
        "cache off": Server(bindir / "fxdp-server", 0),
    }
    try:
        runs = _compile_runs(ctx, graph, servers)
    finally:
        stops = {m: s.stop() for m, s in servers.items()}
    rows = [
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
        for (rpc, mode, c), rs in runs.items()
    ]
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


def _allreduce_table(c: dict, impls: dict) -> list:
    """A row per size: each implementation's time, algorithm and bus bandwidth (nccl-tests'
    2(n-1)/n factor), as medians with min and max."""
    world, table = c["world_size"], []
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
    return table


def _allreduce_nccl(ctx, flags: list):
    """fxdp_allreduce_bench --device=cuda's JSON where two GPUs exist, else why it did not run."""
    gpus = ctx["meta"].get("gpus", 0)
    if gpus == 1:
        return "not run: one GPU (NCCL needs one GPU per rank, 2 ranks)"
    if gpus < 2:
        return "not run: no GPU on this machine"
    nj = ctx["raw"] / "allreduce_nccl.json"
    try:
        launch_ranks(
            [ctx["bin"] / "fxdp_allreduce_bench", "--device=cuda", *flags, f"--json={nj}"],
            2,
            log=ctx["log"],
        )
        return json.loads(nj.read_text())
    except RuntimeError as e:
        return f"failed: {e}"


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
    return {
        "world_size": world,
        "dtype": c["dtype"],
        "reps": a["reps"],
        "impls": list(impls),
        "table": _allreduce_table(c, impls),
        "nccl": _allreduce_nccl(ctx, flags),
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


def area_random(ctx) -> dict:
    """Dropout through fxdp's generator against torch's CPU kernel on the same tensor
    (fxdp_random_bench --json: every run's time, the two measured alternately in one process)."""
    rows, commands, l0 = [], [], load()
    for numel, threads, reps in ctx["cfg"]["random"]:
        flags = ["--numel", str(numel), "--threads", str(threads), "--reps", str(reps)]
        r = run([ctx["bin"] / "fxdp_random_bench", *flags, "--json"], log=ctx["log"])
        (ctx["raw"] / f"random_{numel}_{threads}.json").write_text(r.stdout)
        for line in r.stdout.splitlines():
            x = json.loads(line)
            fx, th = summ(x["fxdp_ms"]), summ(x["torch_ms"])
            rows.append({**x, "fxdp_ms": fx, "torch_ms": th, "ratio": fx["median"] / th["median"]})
        commands.append(f"{rel(ctx['bin'])}/fxdp_random_bench " + " ".join(flags))
    return {"target": 1.2, "rows": rows, "load": [l0, load()], "commands": commands}


def area_llama(ctx) -> dict:
    """Issue 27's Done-means run (bench/llama300m_check.py: the 300 M Llama; --quick: 18 M)."""
    return run_py_bench(ctx, "llama300m_check", ["--bin", ctx["bin"], *ctx["cfg"]["llama"]], 3600)


def area_shapes(ctx) -> dict:
    """A new batch shape of a 12-layer GPT-2 traced once with symbolic sizes: the server's
    compile of it (ShapeVariants, fxdp_shape_bench) against issue 26's 2 s."""
    return run_py_bench(ctx, "shape_cost", ["--build", ctx["build"], *ctx["cfg"]["shapes"]], 1800)


RUNNERS = {
    "pipeline": area_pipeline,
    "executor": area_executor,
    "step": area_step,
    "compile": area_compile,
    "allreduce": area_allreduce,
    "fsdp": area_fsdp,
    "trace": area_trace,
    "random": area_random,
    "llama": area_llama,
    "shapes": area_shapes,
}
