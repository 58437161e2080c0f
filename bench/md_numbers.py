"""How results_markdown.py writes a number into RESULTS.md: ``f`` (a value), ``mm`` (median (min-max)
of a summary), ``ratio`` (a / b as "1.23x"), ``bytes_str`` (a byte count)."""

from __future__ import annotations


def f(x, digits=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}f}"


def mm(s: dict, digits=2) -> str:
    """median (min-max) of a summary: ours (n, values) or step_vs_ddp.py's (runs)."""
    if not s or s.get("median") is None:
        return "-"
    n = s.get("n") or len(s.get("runs") or s.get("values") or [])
    if n <= 1:
        return f"{f(s['median'], digits)} (1 run)"
    return f"{f(s['median'], digits)} ({f(s['min'], digits)}-{f(s['max'], digits)})"


def ratio(a, b) -> str:
    if a is None or b in (None, 0):
        return "-"
    return f"{a / b:.2f}x"


def bytes_str(n: int) -> str:
    for unit, k in (("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"
