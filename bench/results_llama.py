"""RESULTS.md's section 9 (bench/llama300m_check.py, issue 27), for bench/results_markdown.py."""

from __future__ import annotations


def md_llama_explained(ref: dict) -> list:
    """bench/llama_explain.py's proof of each parameter element outside the tolerance: both runs'
    gradients per step recovered from their AdamW moments, and torch's AdamW on that element with
    them against the parameters observed."""
    rows = ref.get("explained", [])
    if not rows:
        return []
    L = [
        "",
        "Each parameter element outside the tolerance at some step, explained (bench/"
        "llama_explain.py): g is each run's gradient recovered from its AdamW moments "
        "(g_1 = m_1 / 0.1, g_s = (m_s - 0.9 m_{s-1}) / 0.1; eager's equals autograd's), "
        "`adamw(g)` torch's AdamW on that one element from the initial weight with that run's "
        "gradients, against the parameter the run holds. Adam moves an element by about lr "
        "whatever its gradient's size, so a gradient within a few eps (1e-8) of 0, where the 2 "
        "ranks' summation order changes it, changes that step's update by up to 2 lr:",
        "",
        "| element | step | g fxdp | g eager | param fxdp | adamw(g fxdp) | param eager | "
        "adamw(g eager) | |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for x in rows:
        for st in x.get("steps", []):
            note = ""
            if st["step"] == 1:
                note = ("explained: " if x["explained"] else "**NOT explained**: ") + "; ".join(
                    x["ill_conditioned"]
                )
                note += f"; difference {x['diff']:.3g}, recomputed {x['recomputed diff']:.3g}"
            L.append(
                f"| {x['element'] if st['step'] == 1 else ''} | {st['step']} | "
                f"{st['g fxdp']:.4g} | {st['g eager']:.4g} | {st['param fxdp']:.7g} | "
                f"{st['adamw(g fxdp)']:.7g} | {st['param eager']:.7g} | "
                f"{st['adamw(g eager)']:.7g} | {note} |"
            )
        if not x.get("steps"):
            L.append(
                f"| {x['element']} | {x['first_step_outside']} | | | | | | | **NOT explained** |"
            )
    return L


def _per_step(ref: dict) -> str:
    """After which step how many elements were outside the tolerance (compared after every step)."""
    per = ref.get("per_step")
    if not per:
        return ""
    return f" after step {len(per)}; compared after every step: " + ", ".join(
        f"step {s} {x['outside']} outside (param {x['max_abs_diff'].get('param', 0):.2g})"
        for s, x in per.items()
    )


def md_llama(r: dict) -> list:
    raw = r["raw"]
    t, res, ref, cmp_ = raw["train"], raw["resume"], raw["reference"], raw["compare"]
    diffs = ", ".join(f"{k} {v:.2g}" for k, v in ref["max_abs_diff"].items())
    w = raw.get("phase_wall_seconds", {})
    L = [
        "## 9. A Llama from a Hugging Face checkpoint: FULLY_SHARD, resume, export (issue 27)",
        "",
        f"`bench/llama300m_check.py`: a Llama of {raw['save']['params']:,} parameters saved by "
        f"`save_pretrained` in {raw['save']['shards']} shards, traced on `meta`, "
        f"{raw['steps']} steps (AdamW, batch {raw['batch']} x {raw['seq']}) FULLY_SHARD on 2 "
        "`fxdp-worker`s reading it, the workers writing checkpoints; the checkpoint of step 2 "
        "resumed on 1 REPLICATE rank; `fxdp export --hf`; one device is eager PyTorch from the "
        "same checkpoint. Each phase a process of its own: peak RSS is `ru_maxrss`, growth the "
        "peak (VmHWM, reset before the call) over the RSS before `Client.train`.",
        "",
        "| phase | s | peak RSS MB | notes |",
        "|---|---:|---:|---|",
        f"| save_pretrained (a process) | {w.get('save', 0):.0f} | - | |",
        f"| client (a process): trace on meta | {t['trace_seconds']:.0f} | "
        f"{t['peak_trace_mb']:.0f} | {t['graph_nodes']:,} nodes |",
        f"| client: train, 2 FULLY_SHARD workers | {t['seconds']:.0f} | {t['peak_rss_mb']:.0f} | "
        f"growth {t['growth_mb']:.0f} MB, the server's {t['server_growth_mb']:.0f} MB; sent "
        f"{t['sent_bytes']} bytes of state |",
        f"| client: resume on 1 REPLICATE rank | {res['seconds']:.0f} | {res['peak_rss_mb']:.0f} | "
        f"growth {res['growth_mb']:.0f} MB, the server's {res['server_growth_mb']:.0f} MB |",
        f"| fxdp export --hf | {raw['export']['seconds']:.0f} | "
        f"{raw['export']['peak_rss_mb']:.0f} | |",
        f"| one device, eager, 3 steps (a process) | {ref['seconds_3_steps']:.0f} | "
        f"{ref['peak_rss_mb']:.0f} | with the comparisons: {w.get('check', 0):.0f} s |",
        "",
        "Peak RSS over the run: "
        + ", ".join(f"{k} {v:.0f} MB" for k, v in raw["server_peak_mb"].items())
        + f" (the state: {raw['save']['params'] * 12 / 2**20:.0f} MB). Against one device, max "
        f"abs difference: {diffs}; {ref['elements_outside_tolerance']} elements outside rtol "
        f"{ref.get('rtol', 1e-4):g} / atol {ref.get('atol', 5e-5):g}{_per_step(ref)}. Resumed against uninterrupted: {cmp_['max_abs_diff']:.2g} over "
        f"{cmp_['tensors']} tensors. Checks: "
        + "; ".join(("ok " if ok else "**FAILED** ") + what for ok, what in raw["checks"])
        + ".",
    ]
    L += md_llama_explained(ref)
    L += ["", f"Command: `{r['command']}`."]
    return L
