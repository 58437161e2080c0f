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


def _step_md(r) -> list:
    d, name = r["details"] or {}, r["step"]
    md = []
    if name == "env":
        md += [f"- {k}: {v}" for k, v in d.items()]
    elif name == "build":
        md += [f"- {k}: {v}" for k, v in d.items()]
    elif name in ("ctest_gpu", "nccl_ws1", "unit"):
        tests = d.get("tests") or d.get("failed") or []
        md += _table(["test", "result", "message"], [(t[0], t[1], t[2][:200]) for t in tests])
        if name == "unit":
            md.append(f"\n{d.get('passed', 0)} passed")
    elif name == "zoo":
        md += _table(
            [
                "case",
                "nodes",
                f"loss cpu (step {len(d['rows'][0]['losses_cpu']) if d.get('rows') else '-'})",
                "loss device",
                "loss rel diff",
                "state max rel err",
                "worst tensor",
                "bitwise",
                "ok",
                "note",
            ],
            [
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
            ],
        )
        md.append(f"\nbounds: {d.get('tolerance')}")
    elif name in ("n2_gloo", "fully_shard"):
        md += _table(
            [
                "case",
                "losses (N=2)",
                "loss rel diff vs N=1",
                "state max rel err vs N=1",
                "worst tensor",
                "ok",
                "error",
            ],
            [
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
            ],
        )
        md.append(f"\nbounds: {d.get('tolerance')}")
    elif name == "overhead" and d:
        md += _table(
            ["", "ms/step", "us per graph op"],
            [
                ("fxdp-worker", _f(d["fxdp_ms_per_step"]), _f(d["fxdp_us_per_op"])),
                ("eager PyTorch", _f(d["eager_ms_per_step"]), _f(d["eager_us_per_op_equiv"])),
            ],
        )
        md.append(
            f"\n{d['case']}: {d['ops']} ops per step; step-1 loss rel diff {_f(d['loss_rel_diff_step1'])}"
        )
    elif name == "gpt2" and d.get("fxdp"):
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
        md += _table(
            ["", "median ms/step", "first step ms", "peak MB", "loss rel diff vs fxdp", "note"],
            rows,
        )
        md.append(f"\n{d['case']} {d.get('size')}, {d['steps']} steps, median over steps 3..")
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
