"""Two `make bench` runs side by side (issue 29: "make bench before and after shows no
regression"): each area's headline numbers (medians) before and after, and each fxdp number's
ratio to its baseline measured in the same run, which the load on a shared machine moves less
than the raw times.

  .venv/bin/python bench/before_after.py BEFORE.json AFTER.json --into bench/results.json

writes the comparison into results.json["before_after"] (results_markdown.py renders it into
RESULTS.md) and prints it as markdown.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from results_markdown import md_before_after


def _med(x):
    return x.get("median") if isinstance(x, dict) else x


def _pipeline(a: dict):
    for s in a["sizes"]:
        fx, base = s["fxdp_us_per_node"]["total"], s["torch_fx_us_per_node"]["total"]
        yield f"pipeline {s['nodes']} nodes: fxdp µs/node (CPU)", _med(fx), _med(fx) / _med(base)


def _executor(a: dict):
    ns = a["ns_per_node"]
    run, direct = _med(ns["fxdp Program::Run"]), _med(ns["C++ direct at::"])
    yield "executor: Program::Run ns/node (baseline: C++ direct at::)", run, run / direct


def _step(a: dict):
    for model, r in a["raw"]["results"].items():
        if "fxdp-worker N=2" in r:
            yield (
                f"step {model} N=2: fxdp-worker ms/step (baseline: DDP)",
                _med(r["fxdp-worker N=2"]),
                _med(r["fxdp-worker / DDP (per repetition)"]),
            )


def _compile(a: dict):
    floor = {r["rpc"]: _med(r["p50_ms"]) for r in a["rows"] if r["mode"] == "in-process"}
    for r in a["rows"]:
        if r["mode"] != "in-process":
            p50 = _med(r["p50_ms"])
            yield (
                f"compile {r['rpc']} {r['mode']}, {r['clients']} clients: p50 ms (baseline: "
                "in-process)",
                p50,
                p50 / floor[r["rpc"]] if floor.get(r["rpc"]) else None,
            )


def _allreduce(a: dict):
    for row in a["table"]:
        if row["bytes"] in (1024, 1 << 20, 64 << 20):
            t, base = _med(row["fxdp"]["time_us"]), _med(row["c10d Gloo"]["time_us"])
            yield f"allreduce {row['bytes']} B: fxdp µs (baseline: c10d Gloo)", t, t / base


def _trace(a: dict):
    for row in a["raw"]["rows"]:
        yield f"trace hidden {row['hidden']}: client RSS growth MiB", row["growth"] / 2**20, None


HEADLINES = {
    "pipeline": _pipeline,
    "executor": _executor,
    "step": _step,
    "compile": _compile,
    "allreduce": _allreduce,
    "trace": _trace,
}


def compare(before: dict, after: dict) -> dict:
    """{"before": meta, "after": meta, "rows": [[what, before, after, ratio before, ratio after]]}
    for every area both runs measured without an error."""
    rows = []
    for name, headline in HEADLINES.items():
        b, a = before["areas"].get(name), after["areas"].get(name)
        if not b or not a or "error" in b or "error" in a:
            continue
        got = {what: (v, r) for what, v, r in headline(a)}
        for what, v, r in headline(b):
            if what in got:
                rows.append([what, v, got[what][0], r, got[what][1]])
    keep = ("date", "git_commit", "load_start", "load_end", "wall_s")
    return {
        "before": {k: before["meta"].get(k) for k in keep},
        "after": {k: after["meta"].get(k) for k in keep},
        "areas": {
            n: [before["areas"][n].get("load"), after["areas"][n].get("load")]
            for n in HEADLINES
            if n in before["areas"] and n in after["areas"]
        },
        "rows": rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--into", help="a results.json to store the comparison in (before_after)")
    args = ap.parse_args(argv)
    cmp = compare(
        json.loads(pathlib.Path(args.before).read_text()),
        json.loads(pathlib.Path(args.after).read_text()),
    )
    if args.into:
        p = pathlib.Path(args.into)
        results = json.loads(p.read_text())
        results["before_after"] = cmp
        p.write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(md_before_after(cmp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
