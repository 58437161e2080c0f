"""The fxdp demo, at the current stage of the pipeline.

Traces a real model's training step (forward, loss, backward, AdamW update) into one aten graph,
saves it, has the C++ side decode, verify and re-encode it byte for byte, prints its text form,
and checks that the traced graph trains exactly like eager PyTorch.
It grows with the pipeline (analysis, expansion, workers, server).
"""
import argparse
import subprocess
import sys
from pathlib import Path

import torch

import fxdp
from fxdp import zoo


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="mlp", choices=sorted(zoo.MODELS))
    ap.add_argument("--optim", default="adamw", choices=sorted(zoo.OPTIMIZERS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fxdp", default="build/bin/fxdp")
    ap.add_argument("--out", default="build/demo")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    print(f"== 1. trace one {args.model} + {args.optim} training step into an aten graph")
    step, model, opt = zoo.trace_entry(args.model, args.optim)
    path = out / f"{args.model}_{args.optim}.pb"
    step.save(path)
    step.to_safetensors(out / f"{args.model}_{args.optim}.safetensors")
    print(f"   {step!r}\n   saved {path} ({path.stat().st_size} bytes)")

    print("== 2. C++: decode + verify + re-encode byte for byte")
    print("   " + sh(args.fxdp, "graph", "check", str(path)).strip())
    sh(args.fxdp, "graph", "roundtrip", str(path), str(out / "roundtrip.pb"))
    same = path.read_bytes() == (out / "roundtrip.pb").read_bytes()
    print(f"   re-encoded bytes identical: {same}")

    print("== 3. the graph's text form (first lines; `fxdp graph print` shows all)")
    text = sh(args.fxdp, "graph", "print", str(path)).splitlines()
    for line in text[:14]:
        print("   " + line)
    print(f"   ... {len(text) - 14} more lines")

    print(f"== 4. {args.steps} steps: traced graph (torch.fx) vs eager PyTorch")
    entry = zoo.get(args.model)
    state = step.initial_state()
    worst = 0.0
    for k in range(args.steps):
        batch = entry.batch(k)
        state, loss = step.run_local(state, batch)
        opt.zero_grad()
        eager_loss = entry.loss_fn(model(*batch[:-1]), batch[-1])
        eager_loss.backward()
        opt.step()
        params = dict(model.named_parameters())
        diff = max((state[n] - p.detach()).abs().max().item() for n, p in params.items())
        worst = max(worst, diff)
        print(f"   step {k + 1}: loss graph {loss.item():.6f}  eager {eager_loss.item():.6f}  "
              f"max |param diff| {diff:.2e}")
    ok = same and worst <= 1e-5
    print("demo: OK" if ok else "demo: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
