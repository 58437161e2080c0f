"""Write every zoo model x optimizer as ``<model>_<optim>.pb`` plus ``<model>_<optim>.safetensors``.

Usage: ``python -m fxdp.zoo.export OUTDIR [--models mlp,cnn] [--optims sgd,adam]``
Also writes ``<model>_<optim>.batch.safetensors`` (the example batch, by input name).
"""

from __future__ import annotations

import argparse
import os
import sys

from . import MODELS, OPTIMIZERS, trace_entry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fxdp.zoo.export", description=__doc__)
    ap.add_argument("outdir")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--optims", default=",".join(OPTIMIZERS))
    args = ap.parse_args(argv)
    from safetensors.torch import save_file

    os.makedirs(args.outdir, exist_ok=True)
    for m in args.models.split(","):
        for o in args.optims.split(","):
            step, _, _ = trace_entry(m, o)
            base = os.path.join(args.outdir, f"{m}_{o}")
            step.save(base + ".pb")
            step.to_safetensors(base + ".safetensors")
            batch = MODELS[m].named_batch(0)
            save_file({k: v.contiguous() for k, v in batch.items()}, base + ".batch.safetensors")
            print(f"wrote {base}.pb ({len(step.graph.nodes)} nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
