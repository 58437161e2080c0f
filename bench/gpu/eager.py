"""The eager PyTorch side of the GPU check (bench/gpu/gpu_check.py runs it in the device's python3):
a GPT-2 case of bench/gpu/gpt2_model.py, eagerly or under torch.compile, with the state and batch the
fxdp run uses, timed per step; or the full state file of a case carried as a skeleton.

  python eager.py run --case DIR/cases/gpt2_tiny --name gpt2_tiny --device cuda:0 --steps 20
                      [--compile] [--state FILE]   -> one JSON line on stdout
  python eager.py materialize --name gpt2_step --skeleton S --spec J --out STATE.safetensors
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_model  # noqa: E402


def materialize(name: str, skeleton: str, spec_path: str, out: str) -> dict:
    """The case's full state: parameters from the model's seeded initialization (this machine's
    transformers), zeros, and the skeleton's entries; every shape and dtype checked against the
    spec written where it was traced."""
    from safetensors.torch import load_file, save_file

    model, _ = gpt2_model.make(name)
    params = dict(model.named_parameters())
    kept = load_file(skeleton)
    with open(spec_path) as fh:
        spec = json.load(fh)
    state = {}
    for k, s in spec.items():
        dtype = getattr(torch, s["dtype"])
        if s["from"] == "param":
            t = params[k].detach()
        elif s["from"] == "zeros":
            t = torch.zeros(s["shape"], dtype=dtype)
        else:
            t = kept[k]
        if list(t.shape) != s["shape"] or t.dtype != dtype:
            raise SystemExit(
                f"materialize: {k} is {t.dtype}{list(t.shape)} here, the trace has "
                f"{s['dtype']}{s['shape']}"
            )
        state[k] = t.contiguous()
    save_file(state, out)
    return {
        "entries": len(state),
        "bytes": sum(t.numel() * t.element_size() for t in state.values()),
    }


def run(name: str, state: str, batch: str, device: str, steps: int, compiled: bool) -> dict:
    from safetensors.torch import load_file

    dev = torch.device(device)
    model, _ = gpt2_model.make(name)
    sd = load_file(state)
    params = dict(model.named_parameters())
    missing = [k for k in params if k not in sd]
    if missing:
        raise SystemExit(f"eager: the state file has no {missing[:3]}")
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(sd[k])
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=gpt2_model.LR, weight_decay=0.01)
    b = load_file(batch)
    tokens, target = b["tokens"].to(dev), b["target"].to(dev)
    fwd = torch.compile(model) if compiled else model
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    losses, ms = [], []
    t_first = None
    for i in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = gpt2_model.lm_loss(fwd(tokens), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # syncs the device, as the worker's step does
        dt = (time.perf_counter() - t0) * 1e3
        ms.append(dt)
        if t_first is None:
            t_first = dt
    warm = ms[2:] if len(ms) > 4 else ms
    return {
        "mode": "compile" if compiled else "eager",
        "torch": torch.__version__,
        "device": device,
        "steps": steps,
        "losses": losses,
        "step_ms": ms,
        "median_ms": statistics.median(warm),
        "first_step_ms": t_first,
        "peak_mb": torch.cuda.max_memory_allocated(dev) / 1e6 if cuda else None,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--name", required=True)
    r.add_argument("--state", required=True)
    r.add_argument("--batch", required=True)
    r.add_argument("--device", default="cpu")
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--compile", action="store_true")
    m = sub.add_parser("materialize")
    m.add_argument("--name", required=True)
    m.add_argument("--skeleton", required=True)
    m.add_argument("--spec", required=True)
    m.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "run":
        out = run(a.name, a.state, a.batch, a.device, a.steps, a.compile)
    else:
        out = materialize(a.name, a.skeleton, a.spec, a.out)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
