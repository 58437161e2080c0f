"""All-reduce time from Python: ``torch.distributed.all_reduce`` over Gloo (what a DDP user's
collectives go through), with the sizes, iteration counts and JSON of
``fxdp_allreduce_bench`` (bench/allreduce_bench.cc), so bench/run_all.py can put them side
by side.

One process per rank: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun sets them).

usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P .venv/bin/python
           bench/allreduce_torch.py [--min-bytes 1024] [--max-bytes 67108864] [--factor 2]
           [--reps 3] [--budget-mb 128] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

NAME = "torch.distributed (Python)"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--factor", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--budget-mb", type=int, default=128)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    sizes = []
    b = args.min_bytes
    while b <= args.max_bytes:
        sizes.append(b // 4 * 4)
        b *= args.factor
    budget = args.budget_mb << 20
    iters = [max(5, min(1000, budget // s)) for s in sizes]
    times = [[] for _ in sizes]
    want = float(world * (world + 1) // 2)
    for _ in range(args.reps):
        for i, s in enumerate(sizes):
            t = torch.full((s // 4,), float(rank + 1))
            dist.all_reduce(t)
            if t[0].item() != want or t[-1].item() != want:
                raise SystemExit(f"wrong sum: {t[0].item()} (want {want})")
            t.zero_()
            dist.all_reduce(t)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters[i]):
                dist.all_reduce(t)
            times[i].append(round((time.perf_counter() - t0) / iters[i] * 1e6, 3))
    dist.barrier()
    if rank == 0:
        out = {
            "device": "cpu",
            "world_size": world,
            "reps": args.reps,
            "dtype": "float32",
            "bytes": sizes,
            "iterations": iters,
            "time_us": {NAME: times},
            "torch": torch.__version__,
        }
        text = json.dumps(out, indent=1)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        else:
            print(text)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
