"""Issue 27's "Done means", as a run anyone can repeat: a Llama-shaped model saved by
``save_pretrained`` (random init, sharded) trains 3 steps with FULLY_SHARD on 2 CPU workers (real
``fxdp-worker`` processes of a real ``fxdp-server``) from that checkpoint, traced on ``meta``; the
client never holds a weight (its peak RSS is measured) and no tensor of the state passes through
the server (its peak RSS too); the result equals one device (eager PyTorch from the same
checkpoint, in a process of its own) after every step, each element outside the tolerance explained
(bench/llama_explain.py: a gradient at the level of AdamW's eps, which the 2 ranks' summation order
changes, recomputed through AdamW, or the check fails naming the element); the workers' checkpoint
of step 2 resumes on 1 REPLICATE rank equal to the uninterrupted run; ``fxdp export --hf`` gives a
checkpoint ``from_pretrained`` loads with the same weights.

    .venv/bin/python bench/llama300m_check.py [--size 300m|small] [--json OUT] [--workdir DIR]
        [--optimizer adamw|sgd]

``--size 300m`` (the default, ``make llama-check``): 297 M parameters (vocabulary 32000, hidden
1024, 18 layers), batch 2 x 64; about 12 min on 2 cores and 25 GB of disk (a checkpoint per step).
``--optimizer sgd``: SGD instead of AdamW, nothing amplifies a gradient's rounding, the tolerance
is rtol 1e-5 / atol 1e-6. ``--size small`` (18 M
parameters, a 216 MB state; tests/python/test_llama_check.py): the same phases in seconds. Each
phase runs in a process of its own; the numbers (seconds, peak RSS, max abs differences) are
printed as JSON and written to ``--json``. Exit 1 when a check fails, naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import llama_explain as lx

ROOT = pathlib.Path(__file__).resolve().parents[1]

SIZES = {
    "300m": {
        "config": dict(
            vocab_size=32000,
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=18,
            num_attention_heads=16,
            num_key_value_heads=16,
        ),
        "shard": "200MB",
        "batch": 2,
        "seq": 64,
    },
    "small": {
        "config": dict(
            vocab_size=32000,
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
        ),
        "shard": "20MB",
        "batch": 2,
        "seq": 16,
    },
}
STEPS, LR = 3, 1e-4
# The tolerance of the tests (issue 23 and 27): AdamW's rtol 1e-4 / atol 5e-5; SGD's 1e-5 / 1e-6.
TOLERANCE = {"adamw": (1e-4, 5e-5), "sgd": (1e-5, 1e-6)}
RTOL, ATOL = TOLERANCE["adamw"]


# ---------------------------------------------------------------------------------- helpers ----
def status_kib(pid: str, field: str) -> int:
    """A /proc/PID/status field in KiB (VmRSS, VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def mb(kib: int) -> float:
    return round(kib / 1024, 1)


_PEAKS = []  # this process's VmHWM before each reset_peak, KiB


def reset_peak(pid: str = "self") -> int:
    """VmHWM of ``pid`` back to its RSS (Linux >= 4.0: clear_refs 5); that RSS, KiB."""
    if pid == "self":
        _PEAKS.append(status_kib(pid, "VmHWM"))
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return status_kib(pid, "VmRSS")


def peak_mb() -> float:
    """This process's peak RSS over its life (ru_maxrss forgets what reset_peak cleared)."""
    return mb(max(_PEAKS + [status_kib("self", "VmHWM")]))


def _loss(model, batch):
    return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


def train_step(model, opt, batch):
    loss = _loss(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def batches(size: dict, n: int = STEPS):
    import torch

    g = torch.Generator().manual_seed(1)
    shape = (size["batch"], size["seq"])
    return [
        {"input_ids": torch.randint(0, size["config"]["vocab_size"], shape, generator=g)}
        for _ in range(n)
    ]


def optimizer(model, name: str = "adamw"):
    """AdamW (the default: the tolerance rtol 1e-4 / atol 5e-5) or SGD (``--optimizer sgd``: no
    amplification of a gradient's rounding, so rtol 1e-5 / atol 1e-6), lr 1e-4."""
    import torch

    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=LR)
    return torch.optim.AdamW(model.parameters(), lr=LR)


def max_diff(a, b) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def outside_tolerance(a, b) -> int:
    """Elements of ``a`` not within ``ATOL + RTOL * |b|`` of ``b`` (torch.testing.assert_close)."""
    return int(lx.outside_mask(a, b, RTOL, ATOL).sum())


# ----------------------------------------------------------------------------------- phases ----
def phase_save(a, size) -> dict:
    """The model on the CPU, random init, saved sharded by save_pretrained."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**size["config"], max_position_embeddings=size["seq"])
    t0 = time.monotonic()
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(a.hf, max_shard_size=size["shard"])
    files = sorted(p.name for p in pathlib.Path(a.hf).glob("*.safetensors"))
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "shards": len(files),
        "seconds": round(time.monotonic() - t0, 1),
    }


def _client_train(a, size, step, plan, world, style, steps, ck) -> dict:
    """Client.train in this process, its RSS before and its peak during the call."""
    import fxdp

    before = reset_peak()
    server_before = reset_peak(a.server_pid)
    t0 = time.monotonic()
    with fxdp.Client(a.server) as c:
        r = c.train(
            step,
            world,
            batches=steps,
            style=style,
            initial_checkpoint=plan,
            checkpoints=ck,
            collective_timeout_s=600,
        )
    return {
        "job": r.job_id,
        "losses": r.losses,
        "checkpoint": r.checkpoint,
        "seconds": round(time.monotonic() - t0, 1),
        "rss_before_mb": mb(before),
        "peak_during_mb": mb(status_kib("self", "VmHWM")),
        "growth_mb": mb(status_kib("self", "VmHWM") - before),
        "server_growth_mb": mb(status_kib(a.server_pid, "VmHWM") - server_before),
    }


def phase_client(a, size) -> dict:
    """The client: the model on meta, traced, trained from the Hugging Face checkpoint; then the
    workers' checkpoint of step 2 resumed on 1 REPLICATE rank."""
    import fxdp
    import torch
    import transformers
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig.from_pretrained(a.hf)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).train()
    opt = optimizer(model, a.optimizer)
    bs = batches(size)
    rss_model = status_kib("self", "VmRSS")
    t0 = time.monotonic()
    step = fxdp.trace_step(train_step, model, opt, bs[0])
    trace_s = time.monotonic() - t0
    rope = LlamaRotaryEmbedding(config=cfg)  # non-persistent buffers: not in the checkpoint
    sent = {f"model.rotary_emb.{n}": b for n, b in rope.named_buffers()}
    plan = fxdp.initial_checkpoint(step, a.hf, model=model, optimizer=opt, state=sent)
    out = {
        "graph_nodes": len(step.graph.nodes),
        "trace_seconds": round(trace_s, 1),
        "rss_after_model_mb": mb(rss_model),
        "rss_after_trace_mb": mb(status_kib("self", "VmRSS")),
        "peak_trace_mb": mb(status_kib("self", "VmHWM")),
        "read_by_workers": len(plan.tensors),
        "filled_by_workers": len(plan.fills),
        "sent": len(plan.sent),
        "sent_bytes": sum(t.numel() * t.element_size() for t in plan.sent.values()),
    }
    out.update(
        _client_train(
            a, size, step, plan, 2, "fully_shard", bs, {"dir": a.ck, "every": 1, "keep": 0}
        )
    )
    out["peak_rss_mb"] = peak_mb()
    # The checkpoint of step 2 (2 FULLY_SHARD ranks) on 1 REPLICATE rank, for step 3.
    plan = fxdp.initial_checkpoint(step, os.path.join(a.ck, "step-2"))
    resume = _client_train(a, size, step, plan, 1, "replicate", bs[2:], {"dir": a.ck_resume})
    resume["sent"] = len(plan.sent)
    resume["peak_rss_mb"] = peak_mb()
    return {"train": out, "resume": resume}


def _reference_state(model, opt):
    """The eager model's and optimizer's state under the job's names."""
    from fxdp import optimizers as optim_table

    pname = {id(p): n for n, p in model.named_parameters()}
    have = dict(model.named_parameters())
    for pn, st in optim_table.initial_state(opt, pname).items():
        have.update((f"optim.{pn}.{k}", t) for k, t in st.items())
    return have


def _reference(a, size) -> dict:
    """One device: eager PyTorch from the same checkpoint, compared after every step, tensor by
    tensor, with the workers' checkpoint of that step; then each element outside the tolerance
    explained (bench/llama_explain.py) from a second eager run recording it."""
    import torch
    import transformers
    from fxdp.checkpoints import CheckpointState

    transformers.logging.set_verbosity_error()

    def load():
        m = transformers.LlamaForCausalLM.from_pretrained(a.hf, torch_dtype=torch.float32)
        return m.train()

    model = load()
    opt = optimizer(model, a.optimizer)
    acc, losses, seconds = lx.new_acc(STEPS), [], 0.0
    for s, b in enumerate(batches(size), start=1):
        t0 = time.monotonic()
        losses.append(float(train_step(model, opt, b).detach()))
        seconds += time.monotonic() - t0
        ours = CheckpointState(os.path.join(a.ck, f"step-{s}"))
        lx.compare_step(ours, _reference_state(model, opt), s, (a.rtol, a.atol), acc)
    out = {
        "optimizer": a.optimizer,
        "rtol": a.rtol,
        "atol": a.atol,
        "losses": losses,
        "seconds_3_steps": round(seconds, 1),
        "tensors_compared": acc["tensors_compared"],
        "of": len(ours),
        "max_abs_diff": acc["max_abs_diff"],
        "per_step": acc["per_step"],
        "elements_outside_tolerance": acc["elements_outside_tolerance"],
        "elements_flagged": len(acc["flagged"]),
    }
    del model, opt
    if acc["flagged"] and a.optimizer == "adamw":
        fx = lx.fxdp_history(a.ck, acc["flagged"], STEPS)
        model = load()
        eg = lx.eager_history(
            model, optimizer(model, a.optimizer), batches(size), _loss, acc["flagged"]
        )
        out["explained"] = lx.explain_all(acc, fx, eg, LR, a.atol)
    elif acc["flagged"]:
        out["explained"] = [
            {"element": k, "first_step_outside": s, "explained": False}
            for k, (_, _, s) in list(acc["flagged"].items())[: lx.MAX_ROWS]
        ]
    out["peak_rss_mb"] = mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return out


def _compare(a) -> dict:
    """The resumed run's final checkpoint against the uninterrupted run's, every state tensor."""
    from fxdp.checkpoints import CheckpointState

    whole = CheckpointState(os.path.join(a.ck, "step-3"))
    resumed = CheckpointState(os.path.join(a.ck_resume, "step-1"))
    diff, outside = 0.0, 0
    for name in whole:
        x, y = resumed[name], whole[name]
        diff = max(diff, max_diff(x, y))
        outside += outside_tolerance(x, y)
    return {
        "names_equal": sorted(whole) == sorted(resumed),
        "tensors": len(whole),
        "max_abs_diff": diff,
        "elements_outside_tolerance": outside,
    }


def _load(a) -> dict:
    """``from_pretrained`` of the export, against the checkpoint's parameters."""
    import torch
    import transformers
    from fxdp.checkpoints import CheckpointState

    transformers.logging.set_verbosity_error()
    model, info = transformers.LlamaForCausalLM.from_pretrained(
        a.export, torch_dtype=torch.float32, output_loading_info=True
    )
    ours = CheckpointState(os.path.join(a.ck, "step-3"))
    sd = model.state_dict()
    unequal = [n for n in sd if n in ours and not torch.equal(sd[n], ours[n])]
    # The export leaves the non-persistent rotary buffers out (the tracer records them).
    return {
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(info["unexpected_keys"]),
        "mismatched": sorted(str(m) for m in info["mismatched_keys"]),
        "tensors": len(sd),
        "not_in_checkpoint": [n for n in sd if n not in ours],
        "unequal": unequal,
    }


def phase_check(a, size) -> dict:
    """One device against the job, the resumed run against the uninterrupted one, the export
    loaded: each tensor read from the checkpoints one at a time."""
    return {"reference": _reference(a, size), "compare": _compare(a), "load": _load(a)}


def phase_reference(a, size) -> dict:
    """One device against the job alone (tests/python/test_llama_check.py reruns it with another
    tolerance on the same workdir)."""
    return {"reference": _reference(a, size)}


PHASES = {
    "save": phase_save,
    "client": phase_client,
    "check": phase_check,
    "reference": phase_reference,
}


# ----------------------------------------------------------------------------- orchestration ----
def run_phase(name: str, a) -> dict:
    """``name`` in a process of its own (its peak RSS is its own); its JSON line."""
    args = [sys.executable, __file__, "--phase", name, "--size", a.size, "--workdir", a.workdir]
    args += ["--optimizer", a.optimizer, "--rtol", repr(a.rtol), "--atol", repr(a.atol)]
    if a.server:
        args += ["--server", a.server, "--server-pid", a.server_pid]
    t0 = time.monotonic()
    p = subprocess.run(args, capture_output=True, text=True, env=_env())
    if p.returncode != 0:
        raise SystemExit(f"phase {name} failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    a.walls[name] = round(time.monotonic() - t0, 1)
    print(f"{name}: {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "client" / "python")] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    return env


def binary(name: str, a) -> str:
    path = os.path.join(a.bin, name)
    if not os.access(path, os.X_OK):
        raise SystemExit(f"{path} not found: build it first (make build)")
    return path


class Server:
    """``fxdp-server --local-workers 2 --data-root WORKDIR``: its address, log, and the peak RSS
    of the server and of each worker (VmHWM, read while they run)."""

    def __init__(self, a):
        cmd = [binary("fxdp-server", a), "--listen", "127.0.0.1:0", "--local-workers", "2"]
        cmd += ["--data-root", a.workdir, "--worker-binary", binary("fxdp-worker", a)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
        if not m:
            self.stop()
            raise SystemExit(f"fxdp-server printed {line!r}")
        self.address = m.group(1)
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def peaks_mb(self) -> dict:
        pid = str(self.proc.pid)
        out = {"server": mb(status_kib(pid, "VmHWM"))}
        kids = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += f.read().split()
        for i, k in enumerate(sorted(kids, key=int)):
            try:
                out[f"worker{i}"] = mb(status_kib(k, "VmHWM"))
            except (OSError, KeyError):
                pass
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def export(a) -> dict:
    """``fxdp export DIR --hf OUT --config config.json`` under a Python parent of its own, whose
    RUSAGE_CHILDREN is the export's peak RSS alone."""
    cmd = [binary("fxdp", a), "export", os.path.join(a.ck, "step-3"), "--hf", a.export]
    cmd += ["--config", os.path.join(a.hf, "config.json")]
    wrapper = (
        "import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)"
    )
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"fxdp export failed: {p.stderr}")
    lines = p.stdout.strip().splitlines()
    return {
        "seconds": round(time.monotonic() - t0, 1),
        "peak_rss_mb": mb(int(lines[-1])),
        "printed": lines[0] if len(lines) > 1 else "",
    }


def _equal_what(ref: dict, unexplained: list) -> str:
    what = (
        f"equal to one device after every step: {ref['elements_flagged']} parameter elements "
        f"outside rtol {ref['rtol']:g} / atol {ref['atol']:g} at some step, each explained (a "
        f"gradient within {lx.K_EPS} eps or of opposite signs, and AdamW on that element with "
        "each run's gradients reproducing each run's parameter)"
    )
    return what + (f"; NOT explained: {', '.join(unexplained)}" if unexplained else "")


def checks(r: dict, size: str) -> list:
    """What the Done-means asks, each as (ok, what)."""
    t, ref, cmp_, ld = r["train"], r["reference"], r["compare"], r["load"]
    state_mb = r["save"]["params"] * 12 / 2**20  # parameters + AdamW's two moments, fp32
    unexplained = lx.unexplained(ref)
    growth_bound = state_mb / 4
    out = [
        (t["peak_rss_mb"] < 1024, f"client peak RSS {t['peak_rss_mb']} MB < 1024 MB"),
        (
            t["growth_mb"] < growth_bound,
            f"client RSS growth in train {t['growth_mb']} MB < {growth_bound:.0f} MB "
            f"(the state is {state_mb:.0f} MB)",
        ),
        (
            t["server_growth_mb"] < state_mb / 4,
            f"server RSS growth in the job {t['server_growth_mb']} MB < {state_mb / 4:.0f} MB",
        ),
        (not unexplained, _equal_what(ref, unexplained)),
        (ref["tensors_compared"] > 0, "tensors compared with one device"),
        (
            max(abs(x - y) for x, y in zip(t["losses"], ref["losses"])) < 1e-4,
            "losses equal to one device",
        ),
        (cmp_["names_equal"] and cmp_["elements_outside_tolerance"] == 0, "resume equals"),
        (
            not ld["missing"]
            and not ld["unexpected"]
            and not ld["mismatched"]
            and not ld["unequal"],
            "export loads",
        ),
    ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="300m")
    ap.add_argument("--workdir", help="where the checkpoints go (default: a temporary directory)")
    ap.add_argument("--json", help="write the numbers here")
    ap.add_argument("--bin", default=str(ROOT / "build" / "bin"), help="fxdp's binaries")
    ap.add_argument("--keep", action="store_true", help="keep the workdir")
    ap.add_argument(
        "--optimizer",
        choices=sorted(TOLERANCE),
        default="adamw",
        help="sgd: no amplification of a gradient's rounding, a tolerance of 1e-5 / 1e-6",
    )
    ap.add_argument(
        "--rtol", type=float, help="the tolerance against one device (default: the " "optimizer's)"
    )
    ap.add_argument("--atol", type=float)
    ap.add_argument("--phase", choices=sorted(PHASES), help=argparse.SUPPRESS)
    ap.add_argument("--server", help=argparse.SUPPRESS)
    ap.add_argument("--server-pid", help=argparse.SUPPRESS)
    a = ap.parse_args()
    size = SIZES[a.size]
    a.rtol = TOLERANCE[a.optimizer][0] if a.rtol is None else a.rtol
    a.atol = TOLERANCE[a.optimizer][1] if a.atol is None else a.atol
    made = a.workdir is None
    a.workdir = os.path.realpath(a.workdir or tempfile.mkdtemp(prefix="fxdp-llama-"))
    for k in ("hf", "ck", "ck_resume", "export"):
        setattr(a, k, os.path.join(a.workdir, k))
    if a.phase:
        print(json.dumps(PHASES[a.phase](a, size)))
        return 0
    results = {"size": a.size, "batch": size["batch"], "seq": size["seq"], "steps": STEPS}
    results["optimizer"] = a.optimizer
    t0 = time.monotonic()
    try:
        a.walls = results["phase_wall_seconds"] = {}
        results["save"] = run_phase("save", a)
        server = Server(a)
        a.server, a.server_pid = server.address, str(server.proc.pid)
        try:
            results.update(run_phase("client", a))
            results["server_peak_mb"] = server.peaks_mb()
        finally:
            server.stop()
        results["export"] = export(a)
        results.update(run_phase("check", a))
    finally:
        if made and not a.keep:
            shutil.rmtree(a.workdir, ignore_errors=True)
    results["total_seconds"] = round(time.monotonic() - t0, 1)
    results["checks"] = [[ok, what] for ok, what in checks(results, a.size)]
    text = json.dumps(results, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    failed = [what for ok, what in results["checks"] if not ok]
    for what in failed:
        print(f"FAILED: {what}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
