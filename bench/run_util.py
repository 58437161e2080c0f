"""The helpers of `make bench` (bench/run_all.py and bench/areas.py): running a command or one per
rank with a log, summaries (median, min, max), the load average, and what the machine is."""

from __future__ import annotations

import datetime
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

from launch_util import free_port, rank_env

REPO = pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable


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
