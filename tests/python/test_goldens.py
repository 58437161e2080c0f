"""Golden outputs (tests/testdata/golden/): the analysis table, the expansion report and every
expanded rank graph of each case of goldens.CASES (the text graphs of tests/testdata/ and the zoo's
traced steps), and each zoo step as traced, compared byte for byte with what the real CLI and
tracer produce now. After an intended change: scripts/regen_goldens.sh, then review the diff."""

from __future__ import annotations

import difflib

import goldens
import pytest


@pytest.mark.parametrize("case", goldens.CASES, ids=lambda c: c.name)
def test_golden(case, tmp_path):
    for name, text in sorted(goldens.render(case, str(tmp_path)).items()):
        path = goldens.GOLDEN_DIR / name
        assert path.exists(), f"{path} is missing: run {goldens.REGEN_COMMAND}"
        want = path.read_bytes()
        if want != text.encode():
            diff = difflib.unified_diff(
                want.decode().splitlines(),
                text.splitlines(),
                f"golden/{name}",
                "now",
                lineterm="",
                n=2,
            )
            shown = "\n".join(list(diff)[:60])
            pytest.fail(
                f"{name} differs from its golden (first lines of the diff below); if the change is "
                f"intended, run {goldens.REGEN_COMMAND} and review the diff\n{shown}"
            )


def test_no_stale_goldens():
    assert (
        not goldens.stale_files()
    ), f"golden files no case renders: {goldens.stale_files()}; delete them or add their case"
