"""Running fxdp-worker for the GPU check (bench/gpu/gpu_check.py): one rank or N ranks of a case,
their losses, step times, op counts and peak device memory read off its output, and final states
compared tensor by tensor."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launch_util import free_port  # noqa: E402 (bench/launch_util.py)

STEP_RE = re.compile(r"^step (\d+)/(\d+) loss (\S+) \(([\d.]+) ms\)((?: \S+=\S+)*)$", re.M)
SUMMARY_RE = re.compile(r"([\d.]+) ms/step, ([\d.]+) us/op over (\d+) ops")
PEAK_RE = re.compile(r"peak ([\d.]+) MB allocated, ([\d.]+) MB reserved")


def parse(stdout: str, stderr: str) -> dict:
    steps = [(int(m[1]), float(m[3]), float(m[4])) for m in STEP_RE.finditer(stdout)]
    out = {"losses": [s[1] for s in steps], "step_ms": [s[2] for s in steps]}
    m = SUMMARY_RE.search(stderr)
    if m:
        out.update(ms_per_step=float(m[1]), us_per_op=float(m[2]), ops=int(m[3]))
    m = PEAK_RE.search(stderr)
    if m:
        out.update(peak_mb=float(m[1]), reserved_mb=float(m[2]))
    return out


def run_ranks(
    worker: str,
    graph: str,
    state: str,
    batch: str,
    steps: int,
    device: str,
    out: str,
    world: int = 1,
    communicator: str = "auto",
    threads: int = 0,
    timeout: float = 300,
    env_extra: dict | None = None,
) -> dict:
    """Runs `world` ranks of fxdp-worker run; the result of rank 0 (losses, times, ...) with
    rc (the first non-zero exit status), seconds, and the last stderr lines of a failing rank."""
    port = free_port()
    procs = []
    t0 = time.time()
    for r in range(world):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(world),
            LOCAL_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            **(env_extra or {}),
        )
        cmd = [
            worker,
            "run",
            "--graph",
            graph,
            "--state",
            state,
            "--data",
            batch,
            "--steps",
            str(steps),
            "--device",
            device,
            "--out",
            out,
            "--timeout",
            "120",
        ]
        if world > 1:
            cmd += ["--communicator", communicator]
        if threads:
            cmd += ["--threads", str(threads)]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
            se += f"\n(killed after {timeout} s)"
        outs.append((p.returncode, so, se))
    res = parse(outs[0][1], outs[0][2])
    bad = [(r, o) for r, o in enumerate(outs) if o[0] != 0]
    res.update(
        rc=bad[0][1][0] if bad else 0,
        seconds=round(time.time() - t0, 2),
        command=" ".join(procs[0].args),
    )
    if bad:
        r, (_, _, se) = bad[0]
        res["error"] = f"rank {r}: " + "\n".join(se.strip().splitlines()[-6:])
    return res


def compare_states(a: str, b: str) -> dict:
    """Max over tensors of |a - b| / max|b| (relative to each tensor's scale), the worst tensor,
    and whether every tensor is bitwise equal."""
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(a), load_file(b)
    if set(ta) != set(tb):
        return {"error": f"entries differ: {sorted(set(ta) ^ set(tb))[:5]}"}
    worst, worst_name, bitwise = 0.0, "", True
    for k in sorted(ta):
        x, y = ta[k], tb[k]
        if x.shape != y.shape or x.dtype != y.dtype:
            return {"error": f"{k}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"}
        if not torch.equal(x, y):
            bitwise = False
        if x.is_floating_point() and x.numel():
            x64, y64 = x.double(), y.double()
            scale = max(float(y64.abs().max()), 1e-30)
            err = float((x64 - y64).abs().max()) / scale
            if worst == worst and (err != err or err > worst):  # a NaN stays the worst
                worst, worst_name = err, k
    return {
        "max_rel_err": worst,
        "worst_tensor": worst_name,
        "bitwise": bitwise,
        "tensors": len(ta),
    }


def rel_diff(a: list, b: list) -> float:
    """Largest |a_i - b_i| / |b_i| over two loss lists (inf when their lengths differ)."""
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))
