"""`make bench`: every performance claim of fxdp measured next to its baseline, in one run.

Runs the benchmarks of ten areas (AREAS below), each fxdp number with its baseline in the same
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
  trace      client memory of tracing a Llama built on meta: bench/trace_memory.py
  random     dropout (and bernoulli.p) through fxdp's generator against torch's CPU kernel on
             the same tensor: fxdp_random_bench (target: within 1.2x, issue 24)
  llama      issue 27's Done means: a 300 M Llama from a sharded save_pretrained checkpoint,
             FULLY_SHARD on 2 workers, client and server RSS, equal to eager, resume, export:
             bench/llama300m_check.py
  shapes     a new batch shape of a 12-layer GPT-2 traced once with symbolic sizes: the
             server's compile of it (bench/shape_cost.py + fxdp_shape_bench; target: 2 s,
             issue 26)

usage: .venv/bin/python bench/run_all.py [--build build] [--areas pipeline,executor,...]
           [--merge] [--quick] [--md bench/RESULTS.md] [--json bench/results.json] [--raw DIR]

--quick runs every area in a tiny configuration (seconds; the test suite uses it): its
numbers mean nothing. ``render_markdown(results)`` (bench/results_markdown.py) turns
results.json back into RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from areas import N4_REASON, RUNNERS, area_step
from results_markdown import render_markdown
from run_util import REPO, load, machine, rel, summ  # noqa: F401 - summ: tests/python/test_bench.py

AREAS = [
    "pipeline",
    "executor",
    "step",
    "compile",
    "allreduce",
    "fsdp",
    "trace",
    "random",
    "llama",
    "shapes",
]

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
    "llama": [],  # llama300m_check.py's default: the 300 M Llama (~10 min, ~20 GB of disk)
    "random": [(1 << 22, 1, 21), (1 << 22, 2, 21), (1 << 20, 1, 21)],  # (numel, threads, reps)
    "shapes": [],  # shape_cost.py's defaults: the 12-layer GPT-2, 3 new shapes, 3 repetitions
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
    "llama": ["--size", "small"],
    "random": [(1 << 16, 1, 3)],
    "shapes": ["--quick"],
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


def arg_parser() -> argparse.ArgumentParser:
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
    return ap


def run_areas(areas: list, ctx: dict) -> tuple:
    """Runs each area in turn, one failing area not losing the others: (results by area, the
    names of those that failed)."""
    out, failed = {}, []
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
        out[name] = res
        print(f"   {name}: {res['wall_s']:.0f} s", flush=True)
    return out, failed


def merge_into(path: str, results: dict) -> dict:
    """--merge: the results in ``path`` with the areas just run replaced (each says when and at
    which commit it was measured)."""
    meta = results["meta"]
    merged = json.loads(pathlib.Path(path).read_text())
    for name, res in results["areas"].items():
        res["measured"] = {
            "date": meta["date"],
            "git_commit": meta["git_commit"],
            "load": res["load"],
        }
        merged["areas"][name] = res
    return merged


def main(argv=None) -> int:
    ap = arg_parser()
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
    raw = pathlib.Path(args.raw).resolve()
    raw.mkdir(parents=True, exist_ok=True)
    log = raw / "commands.log"
    log.write_text("")
    t_start = time.monotonic()
    meta = machine(build)
    meta["quick"] = args.quick
    ctx = {
        "cfg": QUICK if args.quick else FULL,
        "bin": build / "bin",
        "build": build,
        "raw": raw,
        "log": log,
        "meta": meta,
    }
    by_area, failed = run_areas(areas, ctx)
    results = {"meta": meta, "areas": by_area}
    meta["load_end"] = load()
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    if args.merge:
        results = merge_into(args.json, results)
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
