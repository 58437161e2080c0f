"""Client memory of tracing a model built on ``meta`` against its parameter count (issue 27).

For each hidden size, a Llama-shaped ``transformers`` model (``--layers`` layers, intermediate
2.6875 x hidden rounded to 256, 32 heads, vocabulary 32000) is built on the ``meta`` device and
its training step (AdamW, ``model(input_ids, labels=input_ids).loss``, batch ``--batch`` x
``--seq``) traced by ``fxdp.trace_step``'s default mode, each in a fresh process. The child reports
the parameter count, the graph's nodes, the trace's seconds, its RSS before the trace (after
building the model) and its peak RSS (``ru_maxrss``); the growth is their difference. With weights
on ``meta`` the growth should not depend on the parameter count, only on the graph.

    .venv/bin/python bench/trace_memory.py --json OUT.json [--hidden 512,2048,4096] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def child(hidden: int, layers: int, batch: int, seq: int) -> dict:
    import fxdp
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=(int(hidden * 2.6875) + 255) // 256 * 256,
        num_hidden_layers=layers,
        num_attention_heads=32 if hidden >= 1024 else 8,
        max_position_embeddings=seq,
    )
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step(model, opt, batch):
        loss = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    ids = torch.zeros(batch, seq, dtype=torch.long)
    before = _rss_bytes()
    t0 = time.monotonic()
    step = fxdp.trace_step(train_step, model, opt, {"input_ids": ids})
    seconds = time.monotonic() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "hidden": hidden,
        "layers": layers,
        "params": sum(p.numel() for p in model.parameters()),
        "nodes": len(step.graph.nodes),
        "seconds": seconds,
        "rss_before": before,
        "peak_rss": peak,
        "growth": peak - before,
    }


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--hidden", default="512,2048,4096")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="two tiny models (test_bench)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quick:
        a.hidden, a.layers, a.batch, a.seq = "64,128", 1, 2, 8
    if a.child:
        print(json.dumps(child(a.child, a.layers, a.batch, a.seq)))
        return 0
    rows = []
    for h in (int(x) for x in a.hidden.split(",")):
        cmd = [sys.executable, __file__, "--json", "-", "--child", str(h), "--layers",
               str(a.layers), "--batch", str(a.batch), "--seq", str(a.seq)]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=os.environ)
        if r.returncode != 0:
            raise SystemExit(f"hidden {h}: {r.stderr[-2000:]}")
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    out = {"layers": a.layers, "batch": a.batch, "seq": a.seq, "rows": rows}
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
