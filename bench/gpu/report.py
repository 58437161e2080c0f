"""gpu_report.md and gpu_report.json of the GPU check (bench/gpu/gpu_check.py)."""

from __future__ import annotations

import json
import math
import os
import time


def _f(x, spec=".3g"):
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return format(x, spec) if isinstance(x, (int, float)) else str(x)


def _table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += [
        "| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in r) + " |"
        for r in rows
    ]
    return out


def _kv(name, d) -> list:
    # The traceback of a failed step follows in its own block.
    return [f"- {k}: {v}" for k, v in d.items() if k != "traceback"]


def _tests_md(name, d) -> list:
    tests = d.get("tests") or d.get("failed") or []
    md = _table(["test", "result", "message"], [(t[0], t[1], t[2][:200]) for t in tests])
    if name == "unit":
        md.append(f"\n{d.get('passed', 0)} passed")
    return md


def _zoo_md(name, d) -> list:
    steps = len(d["rows"][0]["losses_cpu"]) if d.get("rows") else "-"
    head = ["case", "nodes", f"loss cpu (step {steps})", "loss device", "loss rel diff"]
    head += ["state max rel err", "worst tensor", "bitwise", "ok", "note"]
    rows = [
        (
            x["case"],
            x["nodes"],
            _f((x["losses_cpu"] or [None])[-1], ".8g"),
            _f((x["losses_device"] or [None])[-1], ".8g"),
            _f(x.get("loss_rel_diff")),
            _f(x.get("max_rel_err")),
            x.get("worst_tensor", ""),
            x.get("bitwise", "-"),
            x["ok"],
            x.get("note") or (x.get("error") or "")[:300],
        )
        for x in d.get("rows", [])
    ]
    return _table(head, rows) + [f"\nbounds: {d.get('tolerance')}"]


def _n2_md(name, d) -> list:
    head = ["case", "losses (N=2)", "loss rel diff vs N=1", "state max rel err vs N=1"]
    head += ["worst tensor", "ok", "error"]
    rows = [
        (
            x["case"],
            ", ".join(_f(v, ".8g") for v in x["losses"]),
            _f(x.get("loss_rel_diff")),
            _f(x.get("max_rel_err")),
            x.get("worst_tensor", ""),
            x["ok"],
            (x.get("error") or "")[:300],
        )
        for x in d.get("rows", [])
    ]
    return _table(head, rows) + [f"\nbounds: {d.get('tolerance')}"]


def _overhead_md(name, d) -> list:
    if not d:
        return []
    md = _table(
        ["", "ms/step", "us per graph op"],
        [
            ("fxdp-worker", _f(d["fxdp_ms_per_step"]), _f(d["fxdp_us_per_op"])),
            ("eager PyTorch", _f(d["eager_ms_per_step"]), _f(d["eager_us_per_op_equiv"])),
        ],
    )
    md.append(
        f"\n{d['case']}: {d['ops']} ops per step; step-1 loss rel diff {_f(d['loss_rel_diff_step1'])}"
    )
    return md


def _gpt2_md(name, d) -> list:
    if not d.get("fxdp"):
        return []
    rows = []
    for mode in ("fxdp", "eager", "compile"):
        m = d.get(mode, {})
        rows.append(
            (
                mode,
                _f(m.get("median_ms")),
                _f(m.get("first_step_ms")),
                _f(m.get("peak_mb")),
                _f(m.get("loss_rel_diff_vs_fxdp")),
                (m.get("error") or m.get("skipped") or "")[:300],
            )
        )
    md = _table(
        ["", "median ms/step", "first step ms", "peak MB", "loss rel diff vs fxdp", "note"], rows
    )
    md.append(f"\n{d['case']} {d.get('size')}, {d['steps']} steps, median over steps 3..")
    return md


# Each step's section of gpu_report.md, from its details.
_STEP_MD = {
    "env": _kv,
    "build": _kv,
    "ctest_gpu": _tests_md,
    "nccl_ws1": _tests_md,
    "unit": _tests_md,
    "zoo": _zoo_md,
    "n2_gloo": _n2_md,
    "fully_shard": _n2_md,
    "overhead": _overhead_md,
    "gpt2": _gpt2_md,
}


def _step_md(r) -> list:
    d, name = r["details"] or {}, r["step"]
    md = _STEP_MD[name](name, d) if name in _STEP_MD else []
    if r["status"] == "FAILED" and d.get("traceback"):
        md += ["```", d["traceback"][-1500:], "```"]
    return md


def write_report(out: str, results: list, total_s: float, dry_run: bool, device: str) -> None:
    env = next((r["details"] for r in results if r["step"] == "env"), {}) or {}
    doc = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "dry_run": dry_run,
        "device": device,
        "total_s": total_s,
        "steps": results,
    }
    with open(os.path.join(out, "gpu_report.json"), "w") as fh:
        json.dump(doc, fh, indent=1, default=str)
    md = [
        f"# fxdp GPU check{' (DRY RUN on the CPU)' if dry_run else ''}",
        "",
        f"{doc['when']}; device {device} ({env.get('gpu') or 'no GPU'}); torch {env.get('torch')} "
        f"(CUDA {env.get('torch_cuda')}); graphs traced with {env.get('traced_with')}; "
        f"{total_s} s in all.",
        "",
    ]
    md += _table(
        ["step", "status", "seconds", "message"],
        [(r["step"], r["status"], r["seconds"], r["message"][:300]) for r in results],
    )
    for r in results:
        body = _step_md(r)
        if body:
            md += ["", f"## {r['step']}", ""] + body
    with open(os.path.join(out, "gpu_report.md"), "w") as fh:
        fh.write("\n".join(md) + "\n")
