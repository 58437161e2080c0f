"""Launching ranks on 127.0.0.1: the benchmarks (run_util.py, step_vs_ddp.py,
fully_shard_vs_fsdp2.py), the GPU check (gpu/worker_runs.py) and the Python tests (tests/python/_util.py)
take free_port and clean_env from here."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """An ephemeral TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra) -> dict:
    """This process's environment without any launcher's rank variables, plus `extra` (the
    benchmarks pass OMP_NUM_THREADS there)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
            "SLURM_PROCID",
            "SLURM_NTASKS",
            "SLURM_LOCALID",
        )
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def rank_env(rank: int, world: int, port: int, **extra) -> dict:
    """clean_env for rank `rank` of `world` whose rendezvous is 127.0.0.1:`port` (torchrun's
    variables)."""
    return clean_env(
        RANK=rank,
        WORLD_SIZE=world,
        LOCAL_RANK=rank,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=port,
        **extra,
    )
