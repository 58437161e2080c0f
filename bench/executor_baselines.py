"""Host overhead per node: fxdp's interpreter against PyTorch from Python, on one graph.

The graph is a chain of N one-element ops (alternating ``aten::add.Tensor(v, x)`` and
``aten::mul.Tensor(v, y)``) that ``fxdp_executor_bench --write_chain`` writes as a binary
``fxdp.v1.GraphDef``. Measured, each as wall time of one whole run / N, repeated:

  fxdp Program::Run      ``BM_ProgramRun/N`` of bench/executor_bench.cc (C++ interpreter)
  C++ direct at::        ``BM_DirectAten/N``: the same ops called from C++, no interpreter
  eager (torch.add/mul)  a Python loop ``v = torch.add(v, x); v = torch.mul(v, y)``
  eager (OpOverload)     a Python loop over the graph's nodes calling ``torch.ops.aten.*``
  torch.fx.Interpreter   ``torch.fx.Interpreter(gm).run(x, y)``, gm = fxdp.convert.graphdef_to_fx
  fx GraphModule         ``gm(x, y)``: the generated Python code (what TracedStep.run_local runs)

Everything runs under ``torch.inference_mode()`` (as Program::Run) with 1 intra-op thread.

usage: .venv/bin/python bench/executor_baselines.py [--bench build/bin/fxdp_executor_bench]
           [--nodes 10000] [--reps 7] [--json bench/out/executor_baselines.json]
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
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

import torch  # noqa: E402
import torch.fx  # noqa: E402
from fxdp import convert  # noqa: E402
from fxdp.v1 import graph_pb2 as pb  # noqa: E402

X, Y = 1e-3, 0.999  # as in executor_bench.cc


def timed_runs(fn, reps: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t0)
    return out


def python_baselines(graph_path: str, reps: int) -> tuple[int, dict[str, list[float]]]:
    g = pb.GraphDef()
    with open(graph_path, "rb") as f:
        g.ParseFromString(f.read())
    gm = convert.graphdef_to_fx(g)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    nodes = len(calls)
    x, y = torch.full((1,), X), torch.full((1,), Y)
    expect = None
    results: dict[str, list[float]] = {}

    # The op sequence, as (OpOverload, which input) pairs.
    seq = []
    for n in calls:
        other = n.args[1]
        seq.append((n.target, 0 if other.name == "x" else 1))

    def eager_torch():
        v = x
        for i in range(nodes):
            v = torch.add(v, x) if i % 2 == 0 else torch.mul(v, y)
        return v

    def eager_ops():
        v = x
        xy = (x, y)
        for op, k in seq:
            v = op(v, xy[k])
        return v

    interp = torch.fx.Interpreter(gm)

    def fx_interpreter():
        return interp.run(x, y)

    def fx_module():
        return gm(x, y)

    with torch.inference_mode():
        for name, fn in [
            ("eager (torch.add/mul)", eager_torch),
            ("eager (OpOverload)", eager_ops),
            ("torch.fx.Interpreter", fx_interpreter),
            ("fx GraphModule", fx_module),
        ]:
            out = fn()
            out = out[0] if isinstance(out, (tuple, list)) else out
            if expect is None:
                expect = out
            assert torch.equal(out, expect), (name, out, expect)
            results[name] = [ns / nodes for ns in timed_runs(fn, reps)]
    return nodes, results


def cpp_bench(bench: str, nodes: int, reps: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "b.json")
        r = subprocess.run(
            [
                bench,
                f"--benchmark_filter=BM_(ProgramRun|DirectAten)/{nodes}/",
                f"--benchmark_repetitions={reps}",
                "--benchmark_min_time=0.2",
                f"--benchmark_out={out}",
                "--benchmark_out_format=json",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        if r.returncode != 0:
            raise RuntimeError(f"{bench} exited {r.returncode}:\n{r.stderr}")
        with open(out) as f:
            data = json.load(f)
    res: dict[str, list[float]] = {"fxdp Program::Run": [], "C++ direct at::": []}
    for b in data["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        key = "fxdp Program::Run" if b["name"].startswith("BM_ProgramRun") else "C++ direct at::"
        res[key].append(b["ns_per_node"])
    return res


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--bench", default=str(REPO / "build" / "bin" / "fxdp_executor_bench"))
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", help="also write the raw numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as d:
        graph = os.path.join(d, "chain.pb")
        subprocess.run(
            [args.bench, f"--write_chain={graph}", f"--chain_nodes={args.nodes}"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        nodes, results = python_baselines(graph, args.reps)
    results = {**cpp_bench(args.bench, args.nodes, args.reps), **results}

    base = statistics.median(results["fxdp Program::Run"])
    print(
        f"chain of {nodes} one-element ops (add/mul), {args.reps} repetitions, "
        f"torch {torch.__version__}, 1 thread, inference mode"
    )
    print(f"| {'executor':<24} | median ns/node | min | max | time / fxdp's |")
    print(f"|{'-' * 26}|---:|---:|---:|---:|")
    for name, v in results.items():
        m = statistics.median(v)
        print(f"| {name:<24} | {m:,.0f} | {min(v):,.0f} | {max(v):,.0f} | {m / base:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"nodes": nodes, "torch": torch.__version__, "ns_per_node": results}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
