"""bench/llama300m_check.py's "equal to one device", step by step, and the proof of each element
outside the tolerance.

Eager PyTorch (one device) is compared after every step, tensor by tensor, with the workers'
checkpoint of that step (read one tensor at a time). AdamW moves an element by about
``lr * m_hat / (sqrt(v_hat) + eps)``: where a gradient is at the level of ``eps`` (1e-8) or of its
own rounding, the other summation order of 2 ranks (a reduce-scatter of partial gradients against
one device's single sum) changes that step's update by up to ~2 lr, and Adam carries it on. An
element outside the tolerance is *explained* when

* some step ``s <= t`` (``t``: the first step it is outside) had a gradient within ``K_EPS * eps``
  of 0 in either run, or of opposite signs in the two runs (each run's gradients recovered from its
  AdamW moments: ``g_1 = m_1 / (1 - b1)``, ``g_s = (m_s - b1 m_{s-1}) / (1 - b1)``), and
* torch's own AdamW, run on that one element from the initial weight with each run's recovered
  gradients, reproduces each run's parameter at every step (within ``MATCH`` of the tolerance's
  ``atol``), so the difference of the two runs is what Adam makes of the two gradient sequences and
  nothing else.

Anything else is a real difference: the check fails naming the element.
"""

from __future__ import annotations

import math
import os

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
K_EPS = 10  # "at the level of eps": |g| <= K_EPS * eps
MATCH = 0.02  # the recomputed parameters within MATCH * atol of the observed ones
MAX_ROWS = 20  # elements explained (more outside the tolerance fail as too many)
KEYS = ("param", "exp_avg", "exp_avg_sq")


def outside_mask(a, b, rtol: float, atol: float):
    """Elements of ``a`` not within ``atol + rtol * |b|`` of ``b`` (torch.testing.assert_close)."""
    return (a.double() - b.double()).abs() > atol + rtol * b.double().abs()


def kind_of(name: str) -> str:
    return "param" if not name.startswith("optim.") else name.rsplit(".", 1)[1]


def key_of(param: str, kind: str) -> str:
    return param if kind == "param" else f"optim.{param}.{kind}"


def compare_step(ours, have: dict, step: int, tol, acc: dict) -> None:
    """Every tensor of ``ours`` (the workers' checkpoint of ``step``) against ``have`` (eager's
    state after that step): max abs difference per kind, elements outside ``tol`` (rtol, atol), and
    the first step each parameter element is outside, into ``acc``."""
    import torch

    per = acc.setdefault("per_step", {}).setdefault(str(step), {"max_abs_diff": {}, "outside": 0})
    with torch.no_grad():
        for name in ours:
            if name not in have:
                continue
            t, ref = ours[name], have[name]
            kind = kind_of(name)
            d = float((t.double() - ref.double()).abs().max()) if t.numel() else 0.0
            per["max_abs_diff"][kind] = max(per["max_abs_diff"].get(kind, 0.0), d)
            acc["max_abs_diff"][kind] = max(acc["max_abs_diff"].get(kind, 0.0), d)
            bad = outside_mask(t, ref, *tol).reshape(-1)
            n = int(bad.sum())
            per["outside"] += n
            if step == acc["last_step"]:
                acc["tensors_compared"] += 1
                acc["elements_outside_tolerance"] += n
            if n and kind == "param":
                for i in bad.nonzero().reshape(-1).tolist():
                    acc["flagged"].setdefault(f"{name}[{i}]", (name, i, step))


def new_acc(last_step: int) -> dict:
    return {
        "last_step": last_step,
        "max_abs_diff": {},
        "tensors_compared": 0,
        "elements_outside_tolerance": 0,
        "flagged": {},
    }


def by_tensor(flagged: dict) -> dict:
    """{tensor: [index, ...]} of the flagged elements, the first MAX_ROWS."""
    out = {}
    for name, i, _ in list(flagged.values())[:MAX_ROWS]:
        out.setdefault(name, []).append(i)
    return out


def fxdp_history(ck_dir: str, flagged: dict, steps: int) -> dict:
    """Each flagged element's parameter and moments in the workers' checkpoint of every step:
    {element: {kind: [value at step 1..steps]}}."""
    from fxdp.checkpoints import CheckpointState

    out = {}
    for s in range(1, steps + 1):
        ours = CheckpointState(os.path.join(ck_dir, f"step-{s}"))
        for name, idx in by_tensor(flagged).items():
            for kind in KEYS:
                t = ours[key_of(name, kind)].reshape(-1)
                for i in idx:
                    h = out.setdefault(f"{name}[{i}]", {})
                    h.setdefault(kind, []).append(float(t[i]))
    return out


def eager_history(model, opt, bs, train, flagged: dict) -> dict:
    """Eager again from the same initial state (``model``, a fresh ``opt``), each flagged element's
    initial weight, autograd's gradient, parameter and moments after every step:
    {element: {"p0": x, "grad": [...], kind: [...]}}."""
    import torch

    params = dict(model.named_parameters())
    want = by_tensor(flagged)
    out = {
        f"{n}[{i}]": {"p0": float(params[n].detach().reshape(-1)[i])}
        for n, idx in want.items()
        for i in idx
    }

    def record(key, kind, t):
        for i in want[key]:
            out[f"{key}[{i}]"].setdefault(kind, []).append(float(t.reshape(-1)[i]))

    for b in bs:
        loss = train(model, b)
        loss.backward()
        for n in want:
            record(n, "grad", params[n].grad)
            scale = float(params[n].grad.abs().max())
            for i in want[n]:
                out[f"{n}[{i}]"].setdefault("tensor max |grad|", []).append(scale)
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for n in want:
                st = opt.state[params[n]]
                record(n, "param", params[n])
                record(n, "exp_avg", st["exp_avg"])
                record(n, "exp_avg_sq", st["exp_avg_sq"])
    return out


def recovered_gradients(m: list, v: list) -> list:
    """Each step's gradient from AdamW's moments (float64): from exp_avg, and its size from
    exp_avg_sq."""
    out, m_prev, v_prev = [], 0.0, 0.0
    for ms, vs in zip(m, v):
        g = (ms - BETA1 * m_prev) / (1 - BETA1)
        size = math.sqrt(max(vs - BETA2 * v_prev, 0.0) / (1 - BETA2))
        out.append((g, size))
        m_prev, v_prev = ms, vs
    return out


def adamw_on_one_element(p0: float, grads: list, lr: float) -> list:
    """torch's AdamW (the optimizer both runs traced or ran, its defaults) on one float32 element
    from ``p0`` with ``grads``: the parameter after each step."""
    import torch

    p = torch.nn.Parameter(torch.tensor([p0], dtype=torch.float32))
    opt = torch.optim.AdamW([p], lr=lr, betas=(BETA1, BETA2), eps=EPS)
    out = []
    for g in grads:
        p.grad = torch.tensor([g], dtype=torch.float32)
        opt.step()
        out.append(float(p.detach()[0]))
    return out


def explain(element: str, first: int, f: dict, e: dict, lr: float, atol: float) -> dict:
    """The proof of one element outside the tolerance (module docstring): both runs' recovered
    gradients per step, the step(s) that make it ill-conditioned, AdamW's recomputed parameters."""
    gf = recovered_gradients(f["exp_avg"], f["exp_avg_sq"])
    ge = recovered_gradients(e["exp_avg"], e["exp_avg_sq"])
    sim_f = adamw_on_one_element(e["p0"], [g for g, _ in gf], lr)
    sim_e = adamw_on_one_element(e["p0"], [g for g, _ in ge], lr)
    steps, why = [], []
    for s, ((a, sa), (b, sb)) in enumerate(zip(gf, ge), start=1):
        small = a != b and min(abs(a), abs(b)) <= K_EPS * EPS  # equal: the same update
        flip = a * b < 0
        if s <= first and (small or flip):
            why.append(f"step {s}: " + ("signs differ" if flip else f"|g| <= {K_EPS} eps"))
        steps.append(
            {
                "step": s,
                "g fxdp": a,
                "g eager": b,
                "|g| from exp_avg_sq fxdp / eager": [sa, sb],
                "g autograd eager": e["grad"][s - 1],
                "tensor max |g| eager": e["tensor max |grad|"][s - 1],
                "param fxdp": f["param"][s - 1],
                "param eager": e["param"][s - 1],
                "adamw(g fxdp)": sim_f[s - 1],
                "adamw(g eager)": sim_e[s - 1],
            }
        )
    off = max(
        max(abs(x - y) for x, y in zip(sim_f, f["param"])),
        max(abs(x - y) for x, y in zip(sim_e, e["param"])),
    )
    matches = off <= MATCH * atol
    scale = max(max(abs(a), abs(b)) for (a, _), (b, _) in zip(gf, ge))
    return {
        "element": element,
        "first_step_outside": first,
        "p0": e["p0"],
        "diff": f["param"][-1] - e["param"][-1],
        "recomputed diff": sim_f[-1] - sim_e[-1],
        "recomputed off by": off,
        "max |g fxdp - g eager| / max |g|": max(abs(a - b) for (a, _), (b, _) in zip(gf, ge))
        / scale
        if scale
        else 0.0,
        "ill_conditioned": why,
        "explained": bool(why) and matches,
        "steps": steps,
    }


def explain_all(acc: dict, fx: dict, eg: dict, lr: float, atol: float) -> list:
    """One proof per flagged element (the first MAX_ROWS)."""
    rows = []
    for key, (_, _, first) in list(acc["flagged"].items())[:MAX_ROWS]:
        rows.append(explain(key, first, fx[key], eg[key], lr, atol))
    return rows


def unexplained(ref: dict) -> list:
    """The elements outside the tolerance that are not explained, by name (all of them past
    MAX_ROWS: too many to be what one ill-conditioned element makes)."""
    rows = ref.get("explained", [])
    bad = [r["element"] for r in rows if not r["explained"]]
    n = ref.get("elements_flagged", 0)
    if n > len(rows):
        bad.append(
            f"{n - len(rows)} more elements outside the tolerance (only {MAX_ROWS} explained)"
        )
    return bad
