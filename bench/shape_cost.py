"""What a new batch shape costs a job whose graph has symbolic sizes (issue 26: "a new shape costs
at most 2 s for a 12-layer GPT-2 on this machine"; docs/shapes.md).

An HF GPT-2 (``--layers`` layers of ``--hidden``, vocabulary 50257, dropout 0) with AdamW and
``clip_grad_norm_`` over a padded batch ``{input_ids, attention_mask, labels}`` is traced once with
``dynamic=True`` at ``--example`` (B x S); then ``fxdp_shape_bench`` (bench/shape_bench.cc) runs the
server's own ShapeVariants over that graph: the example pinned (the job's graph 0) and each of
``--shapes`` compiled as a job's step meets it (instantiation, analysis and expansion for
``--world-size`` ranks: ``JobInfo.shapes[].compile_ms``), ``--reps`` times. The client traces
nothing per shape (docs/shapes.md), so this is a new shape's cost before the workers load the
program.

    .venv/bin/python bench/shape_cost.py --build build --json OUT.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time


def batch(b: int, s: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed(b * 1000 + s)
    ids = torch.randint(1, vocab, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[-1, s // 2 :] = 0  # one padded row
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def gpt2_step(model, opt, batch):
    import torch

    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return loss


def trace(args, graph: pathlib.Path) -> dict:
    import fxdp
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=args.vocab,
        n_embd=args.hidden,
        n_layer=args.layers,
        n_head=args.heads,
        n_positions=1024,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    b, s = args.example
    t0, c0 = time.monotonic(), time.process_time()
    step = fxdp.trace_step(gpt2_step, model, opt, batch(b, s, args.vocab), dynamic=True)
    out = {"trace_s": time.monotonic() - t0, "trace_cpu_s": time.process_time() - c0}
    step.save(str(graph))
    out["params"] = sum(p.numel() for p in model.parameters())
    out["nodes"] = len(step.graph.nodes)
    return out


def shape_args(b: int, s: int) -> str:
    return f"--shape=attention_mask={b}x{s},input_ids={b}x{s},labels={b}x{s}"


def parse_shape(text: str):
    b, s = text.lower().split("x")
    return int(b), int(s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--build", default="build")
    ap.add_argument("--json", required=True)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--example", type=parse_shape, default=(8, 64))
    ap.add_argument("--shapes", default="8x60,5x64,7x133")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="2 layers of 64, vocabulary 1000, 1 rep")
    args = ap.parse_args()
    if args.quick:
        args.layers, args.hidden, args.heads, args.vocab, args.reps = 2, 64, 4, 1000, 1
        args.example, args.shapes = (4, 16), "4x24,3x16"
    shapes = [parse_shape(x) for x in args.shapes.split(",")]
    bench = pathlib.Path(args.build).resolve() / "bin" / "fxdp_shape_bench"
    with tempfile.TemporaryDirectory() as d:
        graph = pathlib.Path(d) / "gpt2_symbolic.pb"
        out = {"layers": args.layers, "hidden": args.hidden, "example": list(args.example)}
        out.update(trace(args, graph))
        out["graph_bytes"] = graph.stat().st_size
        cmd = [str(bench), f"--graph={graph}", shape_args(*args.example)]
        cmd += [shape_args(b, s) for b, s in shapes]
        cmd += [f"--world_size={args.world_size}", f"--reps={args.reps}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
    out["world_size"] = args.world_size
    out["target_ms"] = 2000
    out["rows"] = []
    for line in r.stdout.splitlines():
        x = json.loads(line)
        x["median_ms"] = statistics.median(x["compile_ms"])
        x["median_cpu_ms"] = statistics.median(x["cpu_ms"])
        out["rows"].append(x)
        print(f"{x['shape']}: compile {x['median_ms']:.0f} ms (CPU {x['median_cpu_ms']:.0f} ms)")
    pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
