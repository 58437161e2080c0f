"""The fxdp demo, at the current stage of the pipeline.

Traces a real model's training step (forward, loss, backward, AdamW update) into one aten graph,
saves it, has the C++ side decode, verify and re-encode it byte for byte, checks that the traced
graph trains exactly like eager PyTorch, analyses where the batch flows (placements), expands it
for 2 ranks and trains the expanded graphs on 2 Gloo processes, once with PyTorch executing
them (the reference) and once with 2 fxdp-worker processes (LibTorch), comparing each with
single-device training; finally starts fxdp-server with 2 local CPU workers and trains through
it with fxdp.Client, comparing with single-device training, and stops the server.
"""

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import fxdp
import torch
from fxdp import zoo


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="mlp", choices=sorted(zoo.MODELS))
    ap.add_argument("--optim", default="adamw", choices=sorted(zoo.OPTIMIZERS))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fxdp", default="build/bin/fxdp")
    ap.add_argument("--worker", default="build/bin/fxdp-worker")
    ap.add_argument("--server", default="build/bin/fxdp-server")
    ap.add_argument("--out", default="build/demo")
    return ap.parse_args()


def free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def max_diff(got, want) -> float:
    """The largest |got - want| over the tensors of ``want`` (a state dict)."""
    return max((got[n] - v).abs().max().item() for n, v in want.items())


def trace(args, out: Path):
    print(f"== 1. trace one {args.model} + {args.optim} training step into an aten graph")
    step, model, opt = zoo.trace_entry(args.model, args.optim)
    path = out / f"{args.model}_{args.optim}.pb"
    step.save(path)
    step.to_safetensors(out / f"{args.model}_{args.optim}.safetensors")
    print(f"   {step!r}\n   saved {path} ({path.stat().st_size} bytes)")
    return step, model, opt, path


def roundtrip_and_print(args, out: Path, path: Path) -> bool:
    """Steps 2 and 3; whether the C++ side re-encoded the graph byte for byte."""
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
    return same


def against_eager(args, step, model, opt, entry):
    """Step 4: the traced graph's state after the steps, and its worst difference from eager."""
    print(f"== 4. {args.steps} steps: traced graph (torch.fx) vs eager PyTorch")
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
        print(
            f"   step {k + 1}: loss graph {loss.item():.6f}  eager {eager_loss.item():.6f}  "
            f"max |param diff| {diff:.2e}"
        )
    return state, worst


def analyze_and_expand(args, out: Path, path: Path) -> Path:
    """Steps 5 and 6; the expanded graph's path."""
    print("== 5. C++ BatchDimAnalyzer: placements for 2 ranks (`fxdp analyze` prints every node)")
    an = json.loads(sh(args.fxdp, "analyze", str(path), "--world-size", "2", "--json"))
    counts = collections.Counter(n["placement"] for n in an["nodes"] if n["placement"] != "-")
    print(
        f"   batch size {an['batch_size']}; placements: "
        + ", ".join(f"{k} x{v}" for k, v in counts.most_common())
    )
    for n in an["nodes"]:
        if n.get("role") == "INPUT" or (n.get("grad_of") and n["grad_of"].endswith("weight")):
            print(f"   {n['name']:<24} {n['placement']:<7} {n['reason']}")
    print(f"   gradients all-reduced: {len(an['reductions'])}; warnings: {len(an['warnings'])}")

    print("== 6. C++ expansion for 2 ranks (`fxdp expand`)")
    xpath = out / "expanded.pb"
    rep = json.loads(
        sh(
            args.fxdp,
            "expand",
            str(path),
            "--world-size",
            "2",
            "-o",
            str(xpath),
            "--json",
        )
    )
    for b in rep["buckets"]:
        print(
            f"   bucket {b['index']}: {len(b['gradients'])} gradients, {b['bytes']} bytes, "
            f"all-reduce after {b['start_after']}, wait before {b['wait_before']}"
        )
    print(
        f"   rank slices: {[(s['start'], s['start'] + s['size']) for s in rep['slices']]}; "
        f"{rep['bytes_per_step']} bytes all-reduced per step"
    )
    return xpath


def on_dp_oracle(args, out: Path, entry, xpath: Path, state):
    """Step 7: the expanded graph on 2 Gloo processes (PyTorch); (ok, worst state difference)."""
    print(f"== 7. {args.steps} steps of the expanded graph on 2 Gloo processes vs one device")
    data = out / "batches.pt"
    torch.save([entry.batch(k) for k in range(args.steps)], data)
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fxdp.dp_oracle",
                str(r),
                "2",
                str(port),
                str(xpath),
                str(out / f"{args.model}_{args.optim}.safetensors"),
                str(data),
                str(out / f"rank{r}.pt"),
            ]
        )
        for r in range(2)
    ]
    dp_ok = all(p.wait(timeout=300) == 0 for p in procs)
    dp_worst = float("inf")
    if dp_ok:
        r0 = torch.load(out / "rank0.pt")
        for k, loss in enumerate(r0["losses"]):
            print(f"   step {k + 1}: global loss {loss.item():.6f}")
        dp_worst = max_diff(r0["state"], state)
        print(f"   max |state diff| vs single device after {args.steps} steps: {dp_worst:.2e}")
    return dp_ok, dp_worst


def on_workers(args, out: Path, entry, xpath: Path, state):
    """Step 8: the same on 2 fxdp-worker processes; (ok, worst state difference)."""
    print(f"== 8. the same {args.steps} steps on 2 fxdp-worker processes (LibTorch + Gloo)")
    from safetensors.torch import load_file, save_file

    datas = []
    for k in range(args.steps):
        f = out / f"batch{k}.safetensors"
        save_file({n: t.contiguous() for n, t in entry.named_batch(k).items()}, str(f))
        datas += ["--data", str(f)]
    port = free_port()
    workers = []
    for r in range(2):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        workers.append(
            subprocess.Popen(
                [
                    args.worker,
                    "run",
                    "--graph",
                    str(xpath),
                    "--state",
                    str(out / f"{args.model}_{args.optim}.safetensors"),
                    *datas,
                    "--steps",
                    str(args.steps),
                    "--out",
                    str(out / "worker_final.safetensors"),
                    "--job",
                    "demo",
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    outs = [w.communicate(timeout=300)[0] for w in workers]
    wk_ok = all(w.returncode == 0 for w in workers)
    wk_worst = float("inf")
    if wk_ok:
        for line in outs[0].splitlines():
            print("   " + line)
        final = load_file(str(out / "worker_final.safetensors"))
        wk_worst = max_diff(final, state)
        print(f"   max |state diff| vs single device after {args.steps} steps: {wk_worst:.2e}")
    return wk_ok, wk_worst


def train_on_server(client, step, entry, steps: int):
    """Step 9 inside the server: waits for its 2 workers, analyzes, trains; the TrainResult."""
    deadline = time.monotonic() + 30
    while sum(w.get("state") == "WORKER_STATE_IDLE" for w in client.workers()) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers did not attach: {client.workers()}")
        time.sleep(0.1)
    for w in client.workers():
        print(f"   worker {w['worker_id']}: {w.get('device', '?')}, pid {w.get('pid', '?')}")
    an = client.analyze(step, world_size=2)
    counts = collections.Counter(n["placement"] for n in an["nodes"] if n["placement"] != "-")
    print("   placements (server): " + ", ".join(f"{k} x{v}" for k, v in counts.most_common()))
    # A generator: each global batch is made and streamed while the job runs; the server
    # sends each worker only its shard.
    return client.train(
        step,
        world_size=2,
        batches=(entry.batch(k) for k in range(steps)),
        on_step=lambda i, loss: print(f"   step {i}: global loss {loss:.6f}"),
    )


def on_server(args, step, entry, state):
    """Step 9: fxdp-server with 2 local workers, through fxdp.Client; (ok, worst state diff)."""
    print(
        "== 9. the product: fxdp-server with 2 local CPU workers, the job submitted with fxdp.Client"
    )
    sv_ok, sv_worst = False, float("inf")
    server = subprocess.Popen(
        [args.server, "--listen", "127.0.0.1:0", "--local-workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        addr = server.stdout.readline().strip().removeprefix("listening on ")
        print(f"   fxdp-server at {addr}")
        with fxdp.Client(addr) as client:
            result = train_on_server(client, step, entry, args.steps)
        sv_worst = max_diff(result.state, state)
        print(f"   job {result.job_id}: max |state diff| vs single device: {sv_worst:.2e}")
        sv_ok = True
    except Exception as e:  # report and fail the demo, never hang
        print(f"   FAILED: {e}")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        print(f"   fxdp-server stopped (exit {server.returncode})")
    return sv_ok, sv_worst


def main() -> int:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    step, model, opt, path = trace(args, out)
    entry = zoo.get(args.model)
    same = roundtrip_and_print(args, out, path)
    state, worst = against_eager(args, step, model, opt, entry)
    xpath = analyze_and_expand(args, out, path)
    dp_ok, dp_worst = on_dp_oracle(args, out, entry, xpath, state)
    wk_ok, wk_worst = on_workers(args, out, entry, xpath, state)
    sv_ok, sv_worst = on_server(args, step, entry, state)
    ok = same and worst <= 1e-5 and dp_ok and wk_ok and sv_ok
    ok = ok and max(dp_worst, wk_worst, sv_worst) <= 1e-5
    print("demo: OK" if ok else "demo: MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
