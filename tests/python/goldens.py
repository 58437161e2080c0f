"""Golden outputs of the compile pipeline, compared byte for byte by test_goldens.py.

For every case below this renders, with the real C++ CLI (``$FXDP_BIN`` or build/bin/fxdp):

* ``<case>.analysis.txt``: ``fxdp analyze GRAPH --world-size N`` (the placement table);
* ``<case>.expanded.txt``: ``fxdp expand GRAPH --world-size N -o OUT.pb``'s report, then every
  rank graph it wrote as ``fxdp graph print`` shows it (or the error, for a graph it refuses);
* ``zoo_<model>_<optim>.traced.txt`` for each zoo graph: the traced step itself (``fxdp graph print``),
  so a change in the tracer shows up as a diff too.

The files live in tests/testdata/golden/. Regenerate them with ``scripts/regen_goldens.sh`` (this
module with ``--write``) after a change that is meant to change them, and review the diff.

A case is one row of CASES: a graph (a text graph of tests/testdata/ or a zoo model x optimizer),
the world size, CLI arguments for both commands (``args``) or only for expand
(``expand_args``). Adding a case is one row; ``--write`` creates its files.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Dict, Optional, Tuple

REPO = pathlib.Path(__file__).resolve().parents[2]
TESTDATA = REPO / "tests" / "testdata"
GOLDEN_DIR = TESTDATA / "golden"
REGEN_COMMAND = "scripts/regen_goldens.sh"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    text_graph: Optional[str] = None  # a file of tests/testdata/ (text form)
    zoo: Optional[Tuple[str, str]] = None  # (model, optimizer) of fxdp.zoo
    world_size: int = 2
    args: Tuple[str, ...] = ()  # for analyze and expand
    expand_args: Tuple[str, ...] = ()  # for expand only
    analysis: bool = True  # False: expand only (the table is another case's)


_ZOO_MODELS = ("mlp", "cnn", "transformer", "seqfirst")
_ZOO_OPTIMS = ("sgd", "adam", "adamw")

CASES = (
    [
        Case(p.stem, text_graph=p.name)
        for p in sorted(TESTDATA.glob("*.txt"))
        if p.read_text().startswith("graph ")
    ]  # every text graph of tests/testdata/
    + [Case(f"zoo_{m}_{o}", zoo=(m, o)) for m in _ZOO_MODELS for o in _ZOO_OPTIMS]
    + [
        Case(
            "zoo_mlp_adam.ws5", zoo=("mlp", "adam"), world_size=5
        ),  # uneven: 3,3,2,2,2, one graph per rank
        Case("zoo_cnn_sgd.sync_bn", zoo=("cnn", "sgd"), args=("--sync-batchnorm",)),
        Case(
            "zoo_transformer_adamw.no_overlap",
            zoo=("transformer", "adamw"),
            expand_args=("--no-overlap", "--last-bucket-mb", "0"),
            analysis=False,
        ),
    ]
)


def fxdp_bin() -> str:
    path = os.environ.get("FXDP_BIN") or str(REPO / "build" / "bin" / "fxdp")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise FileNotFoundError(
            f"C++ CLI not found at {path}: build it first (make build) or set FXDP_BIN"
        )
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [fxdp_bin(), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def _shown(cmd: Tuple[str, ...], r: subprocess.CompletedProcess, tmp: str) -> str:
    """The command line, its exit code, stdout and stderr, with the temporary folder named OUT."""
    out = [f"$ fxdp {' '.join(cmd)}".replace(tmp, "OUT"), f"exit {r.returncode}"]
    if r.stdout:
        out += ["--- stdout", r.stdout.rstrip("\n").replace(tmp, "OUT")]
    if r.stderr:
        out += ["--- stderr", r.stderr.rstrip("\n").replace(tmp, "OUT")]
    return "\n".join(out) + "\n"


@functools.lru_cache(maxsize=None)
def _zoo_graph_bytes(model: str, optim: str) -> bytes:
    from fxdp import zoo

    step, _, _ = zoo.trace_entry(model, optim)
    return step.graph.SerializeToString()


def file_names(case: Case) -> Tuple[str, ...]:
    """The golden files a case renders."""
    names = ((f"{case.name}.analysis.txt",) if case.analysis else ()) + (
        f"{case.name}.expanded.txt",
    )
    if case.zoo is not None and case.name == "zoo_" + "_".join(case.zoo):
        names += (f"{case.name}.traced.txt",)
    return names


def render(case: Case, tmp: str) -> Dict[str, str]:
    """The golden files of one case: {file name: content}."""
    files: Dict[str, str] = {}
    graph = os.path.join(tmp, "graph.pb")
    if case.text_graph is not None:
        r = _cli("graph", "parse", str(TESTDATA / case.text_graph), graph)
        if r.returncode != 0:
            raise RuntimeError(f"fxdp graph parse {case.text_graph}: {r.stderr}")
        shown_graph = case.text_graph.replace(".txt", ".pb")
    else:
        model, optim = case.zoo
        pathlib.Path(graph).write_bytes(_zoo_graph_bytes(model, optim))
        shown_graph = f"{model}_{optim}.pb"
        if case.name == f"zoo_{model}_{optim}":
            r = _cli("graph", "print", graph)
            if r.returncode != 0:
                raise RuntimeError(f"fxdp graph print {shown_graph}: {r.stderr}")
            files[f"{case.name}.traced.txt"] = r.stdout
    ws = ("--world-size", str(case.world_size))

    if case.analysis:
        cmd = ("analyze", shown_graph, *ws, *case.args)
        files[f"{case.name}.analysis.txt"] = _shown(
            cmd, _cli("analyze", graph, *ws, *case.args), tmp
        )

    out = os.path.join(tmp, "x.pb")
    cmd = ("expand", shown_graph, *ws, *case.args, *case.expand_args, "-o", out)
    r = _cli("expand", graph, *ws, *case.args, *case.expand_args, "-o", out)
    text = _shown(cmd, r, tmp)
    written = sorted(p for p in os.listdir(tmp) if p.startswith("x.") and p.endswith(".pb"))
    for p in written:
        g = _cli("graph", "print", os.path.join(tmp, p))
        if g.returncode != 0:
            raise RuntimeError(f"fxdp graph print {p}: {g.stderr}")
        text += f"\n=== OUT/{p}\n{g.stdout}"
    files[f"{case.name}.expanded.txt"] = text
    assert tuple(sorted(files)) == tuple(sorted(file_names(case))), (
        sorted(files),
        file_names(case),
    )
    return files


def render_all(cases=CASES) -> Dict[str, str]:
    files: Dict[str, str] = {}
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="fxdp-golden-") as tmp:
            files.update(render(case, tmp))
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--write", action="store_true", help="write the files (default: only list what differs)"
    )
    ap.add_argument("--case", action="append", help="only these cases (by name; repeatable)")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if not args.case or c.name in args.case]
    if args.case and len(cases) != len(set(args.case)):
        known = ", ".join(c.name for c in CASES)
        ap.error(f"unknown case in {args.case}; cases: {known}")
    files = render_all(cases)
    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    changed = 0
    for name, text in sorted(files.items()):
        path = GOLDEN_DIR / name
        old = path.read_text() if path.exists() else None
        if old == text:
            continue
        changed += 1
        print(
            f"{'wrote' if args.write else 'differs:'} {path.relative_to(REPO)}"
            f"{' (new)' if old is None else ''}"
        )
        if args.write:
            path.write_text(text)
    if not args.case:
        for name in stale_files():
            print(f"stale (no case renders it; delete it): tests/testdata/golden/{name}")
    print(f"{len(files)} golden files, {changed} {'written' if args.write else 'differ'}")
    return 0 if (args.write or changed == 0) else 1


def stale_files() -> Tuple[str, ...]:
    """Files of tests/testdata/golden/ that no case renders (other generators' files excepted)."""
    expected = {n for c in CASES for n in file_names(c)}
    present = sorted(p.name for p in GOLDEN_DIR.glob("*.txt")) if GOLDEN_DIR.exists() else []
    return tuple(n for n in present if n not in expected and not n.startswith(FOREIGN_PREFIXES))


# Golden files in tests/testdata/golden/ written by other generators (not stale here).
FOREIGN_PREFIXES = ("op_rules",)


if __name__ == "__main__":
    sys.exit(main())
