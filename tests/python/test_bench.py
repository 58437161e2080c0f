"""`make bench`'s programs in a tiny configuration (bench/run_all.py --quick): they run, their JSON
is well formed, the Python baseline does the same work as fxdp (same expanded graph), and the
RESULTS.md writer produces every area's table. The benchmarks themselves are not run here.

Binaries come from the build folder of $FXDP_BIN (<build>/bin/fxdp; `make test` sets it), else
<repo>/build; the test fails, it does not skip, when they are missing.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import results_markdown  # noqa: E402
import run_all  # noqa: E402


def build_dir() -> pathlib.Path:
    fx = os.environ.get("FXDP_BIN")
    return pathlib.Path(fx).resolve().parents[1] if fx else REPO / "build"


def binary(name: str) -> pathlib.Path:
    p = build_dir() / "bin" / name
    assert p.is_file() and os.access(
        p, os.X_OK
    ), f"{p} is missing: build it first (make test builds it)"
    return p


PHASES = ("decode", "analyze", "expand")


def check_pipeline_json(d: dict, reps: int) -> None:
    for k in (
        "impl",
        "nodes",
        "wire_bytes",
        "world_size",
        "reps",
        "expanded_nodes",
        "buckets",
        "peak_rss_bytes",
    ):
        assert k in d, k
    assert d["reps"] == reps and d["nodes"] > 0 and d["expanded_nodes"] > d["nodes"]
    assert d["peak_rss_bytes"] > 0
    for ph in PHASES:
        for kind in ("wall", "cpu"):
            v = d[f"{ph}_{kind}_s"]
            assert len(v) == reps and all(x >= 0 for x in v), (ph, v)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    for name in (
        "fxdp_pipeline_bench",
        "fxdp_compile_load",
        "fxdp_allreduce_bench",
        "fxdp_random_bench",
        "fxdp-server",
    ):
        binary(name)
    d = tmp_path_factory.mktemp("bench")
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "run_all.py"),
            "--quick",
            "--build",
            str(build_dir()),
            "--areas",
            "pipeline,compile,allreduce,random",
            "--md",
            str(d / "RESULTS.md"),
            "--json",
            str(d / "results.json"),
            "--raw",
            str(d / "raw"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return d


def test_pipeline_programs_write_json_and_agree(quick_run):
    raw = quick_run / "raw"
    fx = json.loads((raw / "pipeline_fxdp_1000.json").read_text())
    py = json.loads((raw / "pipeline_fx_1000.json").read_text())
    check_pipeline_json(fx, 1)
    check_pipeline_json(py, 1)
    # The baseline does the same work: the same graph in, a rank graph of about the same size and
    # buckets out (equal for DDP's bucket rule; fxdp may split its last bucket further).
    assert fx["nodes"] == py["nodes"]
    assert abs(fx["expanded_nodes"] - py["expanded_nodes"]) <= max(10, 0.02 * fx["expanded_nodes"])
    assert abs(fx["buckets"] - py["buckets"]) <= max(2, 0.1 * fx["buckets"])
    assert py["warnings"] == 0, py["warning_ops"]


def test_fx_baseline_follows_dtensor(tmp_path):
    g = tmp_path / "g.pb"
    subprocess.run(
        [str(binary("fxdp_pipeline_bench")), "--write_synthetic=500", f"--out={g}"], check=True
    )
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "fx_baseline.py"),
            "--graph",
            str(g),
            "--reps",
            "1",
            "--world-size",
            "2",
            "--check-dtensor",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    # every view node's walk was checked against DTensor's propagate_shape_and_sharding
    assert d["view_checks"] > 50


def test_compile_load_json(quick_run):
    res = json.loads((quick_run / "results.json").read_text())["areas"]["compile"]
    assert "error" not in res, res.get("error")
    modes = {(r["rpc"], r["mode"], r["clients"]) for r in res["rows"]}
    for rpc in ("analyze", "expand"):
        assert (rpc, "in-process", 1) in modes
        for c in (1, 2):
            assert (rpc, "cache on", c) in modes and (rpc, "cache off", c) in modes
    for row in res["rows"]:
        for run in row["runs"]:
            assert run["errors"] == 0 and run["requests"] > 0
            assert 0 < run["p50_ms"] <= run["p99_ms"] <= run["max_ms"]
            assert run["graph_nodes"] > 100
        if row["mode"] == "cache on":
            assert row["cached_fraction"] == 1.0
        elif row["mode"] == "cache off":
            assert row["cached_fraction"] == 0.0


def test_allreduce_json(quick_run):
    raw = quick_run / "raw"
    c = json.loads((raw / "allreduce_fxdp.json").read_text())
    p = json.loads((raw / "allreduce_torch.json").read_text())
    assert c["bytes"] == p["bytes"] == [1024, 4096, 16384]
    assert set(c["time_us"]) == {"fxdp", "fxdp (copy)", "c10d Gloo"}
    for impl in (*c["time_us"].values(), *p["time_us"].values()):
        assert len(impl) == 3 and all(len(reps) == 1 and reps[0] > 0 for reps in impl)
    res = json.loads((quick_run / "results.json").read_text())["areas"]["allreduce"]
    assert res["nccl"].startswith("not run") or isinstance(res["nccl"], dict)
    row = res["table"][0]
    assert row["fxdp"]["busbw_gbs"]["median"] == pytest.approx(
        row["fxdp"]["algbw_gbs"]["median"]
    )  # n = 2


def test_results_md_has_every_table(quick_run):
    md = (quick_run / "RESULTS.md").read_text()
    for heading in (
        "## 1. Graph decode",
        "## 4. Compile RPC latency",
        "## 5. All-reduce",
        "## 8. ",
    ):
        assert heading in md
    assert "| native_dropout | 65,536 | 1 |" in md and "| bernoulli.p | 65,536 | 1 |" in md
    assert "| nodes | phase | fxdp µs/node | torch.fx µs/node | ratio |" in md
    assert "| Analyze | 1 |" in md and "| Expand | 2 |" in md
    assert "| 1 KB |" in md and "**NCCL**" in md
    assert "git commit" in md and "load average" in md
    # results.json renders back to the same file
    results = json.loads((quick_run / "results.json").read_text())
    assert run_all.render_markdown(results) == md


def _step_area_result(s) -> dict:
    """A step area result in the shape bench/step_vs_ddp.py writes (`s`: run_all.summ)."""
    return {
        "raw": {
            "torch": "2.13.0",
            "steps": 30,
            "warmup": 5,
            "reps": 2,
            "bucket_mb": 25,
            "results": {
                "mlp": {
                    "fxdp-worker N=2": s(46.0, 48.0),
                    "DDP N=2": s(44.0, 45.0),
                    "fxdp_step_bench N=2": s(47.0, 47.5),
                    "fxdp wait (rank 0)": s(13.0, 12.0),
                    "fxdp wait (rank 1)": s(12.0, 13.0),
                    "fxdp start (rank 0)": s(0.4, 0.5),
                    "fxdp-worker N=1": s(30.0, 31.0),
                    "eager N=1": s(29.0, 29.5),
                    "fxdp-worker / DDP (per repetition)": s(1.02, 1.04),
                    "load average": [1.5, 1.6],
                    "info": {
                        "params": 3411200,
                        "graph_nodes": 234,
                        "global_batch": [128, 1024],
                        "buckets": [1049600, 12595200],
                        "bytes_per_step": 13644804,
                    },
                    "collectives_per_step": 3,
                }
            },
        },
        "n4": run_all.N4_REASON,
        "command": "bench/step_vs_ddp.py --reps 2",
        "load": [1, 1],
        "wall_s": 1,
    }


def _executor_area_result(s) -> dict:
    """An executor area result in the shape bench/executor_baselines.py writes."""
    return {
        "nodes": 10000,
        "command": "bench/executor_baselines.py",
        "load": [1, 1],
        "wall_s": 1,
        "ns_per_node": {
            "fxdp Program::Run": s(430, 440),
            "C++ direct at::": s(425, 430),
            "torch.fx.Interpreter": s(5200, 5300),
        },
    }


def _bench_meta() -> dict:
    """results.json's machine and run record, as run_all.py writes it."""
    return {
        "date": "2026-01-01 00:00 UTC",
        "git_commit": "0" * 40,
        "git_dirty": False,
        "cpu": "cpu",
        "cores": 2,
        "memory_gib": 23.5,
        "gpus": 0,
        "os": "Debian",
        "kernel": "6",
        "python": "3.11",
        "torch": "2.13.0",
        "build_dir": "build",
        "build_type": "Release",
        "load_start": [1, 1, 1],
        "load_end": [1, 1, 1],
        "wall_s": 60,
    }


def test_results_md_step_and_executor_tables():
    """The tables of the two areas whose programs are too slow for the test suite, rendered from
    results in the shape bench/step_vs_ddp.py and bench/executor_baselines.py write."""
    s = lambda *v: run_all.summ(list(v))  # noqa: E731
    md = run_all.render_markdown(
        {
            "meta": _bench_meta(),
            "areas": {
                "executor": _executor_area_result(s),
                "step": _step_area_result(s),
                "pipeline": {"error": "boom", "wall_s": 0},
            },
        }
    )
    assert "## 2. Executor host overhead per node" in md
    assert "| **fxdp Program::Run** | 435 (430-440) | 1.00x |" in md
    assert "| torch.fx.Interpreter | 5,250 (5,200-5,300) | 0.08x |" in md
    assert "## 3. Training step at N=2" in md
    assert (
        "| mlp | 47.0 (46.0-48.0) | 44.5 (44.0-45.0) | 1.03 (1.02-1.04) | 12.5 (12.0-13.0) | 30.5 / 29.2 |"
        in md
    )
    assert "**N=4**: not run" in md
    assert "**failed**: `boom`" in md


def test_step_vs_ddp_quick_gpt2(tmp_path):
    """bench/step_vs_ddp.py --quick on the Hugging Face GPT-2 (a tiny config, AdamW): traced,
    expanded, run on 2 fxdp-worker processes and under DDP (Gloo), both timed, and rendered into
    the step table. The full size runs in `make bench`."""
    for name in ("fxdp", "fxdp-worker"):
        binary(name)
    j = tmp_path / "step.json"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "step_vs_ddp.py"),
            "--quick",
            "--models",
            "gpt2",
            "--build",
            str(build_dir()),
            "--json",
            str(j),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(j.read_text())
    g = d["results"]["gpt2"]
    assert d["quick"] and g["config"] == {"steps": 3, "warmup": 1, "reps": 1}
    assert g["info"]["params"] > 0 and g["info"]["graph_nodes"] > 500 and g["info"]["buckets"]
    for k in ("fxdp-worker N=2", "DDP N=2"):
        assert len(g[k]["runs"]) == 1 and g[k]["median"] > 0, k
    assert g["fxdp-worker / DDP (per repetition)"]["median"] > 0
    md = "\n".join(
        results_markdown.md_step(
            {"raw": d, "n4": run_all.N4_REASON, "command": "step_vs_ddp.py --quick"}
        )
    )
    assert "| gpt2 | " in md and "steps/warm-up/repetitions 3/1/1" in md


def test_fully_shard_vs_fsdp2_quick(tmp_path):
    """bench/fully_shard_vs_fsdp2.py --quick (the tiny GPT-2, 3 steps): fxdp fully_shard, fxdp
    replicate and PyTorch FSDP2 (fully_shard, Gloo) on 2 ranks each, timed, with every rank's peak
    RSS and the state it holds, rendered into section 6. A fully_shard rank and an FSDP2 rank hold
    about half of the state of a replicated one."""
    for name in ("fxdp", "fxdp-worker"):
        binary(name)
    j = tmp_path / "fsdp.json"
    systems = "fxdp fully_shard,fxdp replicate,FSDP2"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "fully_shard_vs_fsdp2.py"),
            "--quick",
            "--systems",
            systems,
            "--build",
            str(build_dir()),
            "--json",
            str(j),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(j.read_text())
    assert d["quick"] and d["steps"] == 3 and d["reps"] == 1 and d["info"]["params"] > 0
    for k in systems.split(","):
        assert d["ms_per_step"][k]["median"] > 0, k
        assert len(d["peak_rss"][k]) == 2 and all(x > 50e6 for x in d["peak_rss"][k]), k
    rep, fsdp2 = d["state_bytes"]["fxdp replicate"], d["state_bytes"]["FSDP2"]
    shard = d["state_bytes"]["fxdp fully_shard"]
    # AdamW: parameter + gradient + exp_avg + exp_avg_sq, whole on every rank
    assert rep[0] == rep[1] == 4 * 4 * d["info"]["params"]
    # FSDP2 shards dim 0 of every parameter, fxdp each flattened parameter: about half each, the
    # two halves summing to the whole (fxdp: plus < N elements of padding per tensor)
    assert sum(fsdp2) == pytest.approx(rep[0], rel=0.02) and max(fsdp2) < 0.6 * rep[0]
    assert shard[0] == shard[1] and sum(shard) == pytest.approx(rep[0], rel=0.02)
    # live tensor bytes (FXDP_MEMORY_TRACE, counted at the CPU allocator): between steps a rank holds
    # the state the formula says ((1+k)P, /N sharded; plus 0-d state and padding), a fully_shard rank
    # about half of a replicate one's
    mem, fm = d["memory"], d["formula"]
    assert fm["k"] == 2 and fm["P"] == 4 * d["info"]["params"] and fm["U"] > 0
    for k in ("fxdp fully_shard", "fxdp replicate"):
        assert len(mem[k]) == 2 and all(m["peak"] >= m["state"] > 0 for m in mem[k]), k
        assert mem[k][0]["state"] == pytest.approx(fm[k]["state"], rel=0.05), k
        assert mem[k][0]["end_of_backward"] > mem[k][0]["state"], k
    assert mem["fxdp fully_shard"][0]["state"] < 0.6 * mem["fxdp replicate"][0]["state"]
    md = "\n".join(
        results_markdown.md_fsdp({"raw": d, "command": "fully_shard_vs_fsdp2.py --quick"})
    )
    assert "params + grads + optimizer state MB: measured / formula" in md
    assert "## 6. FULLY_SHARD against REPLICATE against PyTorch FSDP2" in md
    assert "| **fxdp fully_shard** | " in md and "| fxdp replicate | " in md and "| FSDP2 | " in md


def test_trace_memory_quick(tmp_path):
    """bench/trace_memory.py --quick: two tiny Llamas built on meta, traced each in its own
    process; rows with parameters, nodes, seconds and the RSS growth, rendered into section 7."""
    j = tmp_path / "trace.json"
    r = subprocess.run(
        [sys.executable, str(REPO / "bench" / "trace_memory.py"), "--quick", "--json", str(j)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(j.read_text())
    rows = d["rows"]
    assert [x["hidden"] for x in rows] == [64, 128] and rows[0]["params"] < rows[1]["params"]
    assert rows[0]["nodes"] == rows[1]["nodes"] > 0  # the same graph, wider tensors
    assert all(x["peak_rss"] >= x["rss_before"] > 0 and x["seconds"] > 0 for x in rows)
    md = "\n".join(results_markdown.md_trace({"raw": d, "command": "trace_memory.py --quick"}))
    assert "## 7. Client memory of tracing a model built on meta" in md and "| 128 | " in md


def test_shape_cost_quick(tmp_path):
    """bench/shape_cost.py --quick: a 2-layer GPT-2 traced with dynamic=True, two new shapes
    compiled by the server's ShapeVariants (fxdp_shape_bench); rendered into section 10."""
    pytest.importorskip("transformers")
    j = tmp_path / "shapes.json"
    cmd = [sys.executable, str(REPO / "bench" / "shape_cost.py"), "--quick", "--json", str(j)]
    binary("fxdp_shape_bench")
    r = subprocess.run(
        [*cmd, "--build", str(build_dir())], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads(j.read_text())
    assert [x["shape"] for x in d["rows"]] == [
        "attention_mask=4x24 input_ids=4x24 labels=4x24",
        "attention_mask=3x16 input_ids=3x16 labels=3x16",
    ]
    assert all(len(x["compile_ms"]) == 1 and x["compile_ms"][0] > 0 for x in d["rows"])
    assert d["nodes"] > 0 and d["rows"][0]["rank_graph_bytes"] > 0
    md = "\n".join(results_markdown.md_shapes({"raw": d, "command": "shape_cost.py --quick"}))
    assert "## 10. A new batch shape of a symbolic graph" in md and "| attention_mask=3x16" in md


def test_before_after_compares_two_runs_area_by_area():
    """bench/before_after.py: the committed results against themselves give every headline row
    once, each unchanged (1.00x), and RESULTS.md renders them."""
    import before_after

    results = json.loads((REPO / "bench" / "results.json").read_text())
    c = before_after.compare(results, results)
    whats = [r[0] for r in c["rows"]]
    assert len(whats) == len(set(whats)) and len(whats) >= 6, whats
    assert {w.split()[0].rstrip(":") for w in whats} >= {
        "pipeline",
        "executor",
        "compile",
        "allreduce",
    }
    assert all(r[1] == r[2] and r[3] == r[4] for r in c["rows"]), c["rows"]
    md = run_all.render_markdown({**results, "before_after": c})
    assert "## Before and after (bench/before_after.py)" in md and "| 1.00x |" in md
