"""The GPU check (scripts/gpu_check.sh, bench/gpu/, docs/gpu.md) on this CPU machine.

The fast tests pack one zoo case and run the check's zoo, N=2 Gloo and FULLY_SHARD steps with the
built fxdp-worker (seconds). The whole dry run (the carried-dependency build against another
LibTorch, then every step: minutes on two cores) runs only with FXDP_GPU_DRY_RUN=1:

    FXDP_GPU_DRY_RUN=1 .venv/bin/python -m pytest tests/python/test_gpu_check.py -q -k dry_run
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from _util import fxdp_binary

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU = ROOT / "bench" / "gpu"


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, **kw)
    return r


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    out = tmp_path_factory.mktemp("kit")
    r = _run(
        [
            sys.executable,
            str(GPU / "pack.py"),
            "--out",
            str(out),
            "--fxdp",
            fxdp_binary("FXDP_BIN", "fxdp"),
            "--quick",
            "--no-deps",
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def _check(kit, tmp_path, steps, worker=True):
    build = tmp_path / "build"
    (build / "bin").mkdir(parents=True)
    if worker:
        os.symlink(fxdp_binary("FXDP_WORKER", "fxdp-worker"), build / "bin" / "fxdp-worker")
    out = tmp_path / "out"
    r = _run(
        [
            sys.executable,
            str(GPU / "gpu_check.py"),
            "--dry-run",
            "--kit",
            str(kit),
            "--build",
            str(build),
            "--out",
            str(out),
            "--steps",
            steps,
        ]
    )
    report = json.loads((out / "gpu_report.json").read_text())
    return r, {s["step"]: s for s in report["steps"]}, (out / "gpu_report.md").read_text()


def test_pack_writes_graphs_expansions_and_a_manifest(kit):
    m = json.loads((kit / "manifest.json").read_text())
    (case,) = m["cases"]
    assert case["name"] == "zoo_mlp_adam" and case["nodes"] > 20
    assert m["traced_with"]["torch"].startswith("2.")
    for rel in (case["graph"], case["state"], case["batch"], *case["n2"].values()):
        assert (kit / rel).is_file(), rel


def test_zoo_n2_and_fully_shard_steps_pass_on_the_cpu(kit, tmp_path):
    r, steps, md = _check(kit, tmp_path, "zoo,n2_gloo,fully_shard")
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = steps["zoo"]["details"]["rows"]
    assert row["ok"] and row["bitwise"] and len(row["losses_cpu"]) == 3, row
    for s in ("n2_gloo", "fully_shard"):
        (row,) = steps[s]["details"]["rows"]
        assert row["ok"] and row["max_rel_err"] <= 1e-4, (s, row)
        assert (
            row["losses"] == steps["zoo"]["details"]["rows"][0]["losses_device"]
            or max(
                abs(a - b)
                for a, b in zip(row["losses"], steps["zoo"]["details"]["rows"][0]["losses_device"])
            )
            < 1e-5
        )
    assert "| zoo | ok |" in md and "## fully_shard" in md


def test_every_step_is_reported_when_the_worker_is_missing(kit, tmp_path):
    r, steps, md = _check(kit, tmp_path, "zoo,n2_gloo,overhead", worker=False)
    assert r.returncode == 0  # skipped steps are not failures
    assert [s["status"] for s in steps.values()] == ["skipped"] * 3
    assert "no fxdp-worker (the build step failed)" in steps["zoo"]["message"]
    assert "| overhead | skipped |" in md


@pytest.mark.skipif(
    os.environ.get("FXDP_GPU_DRY_RUN") != "1", reason="minutes: set FXDP_GPU_DRY_RUN=1"
)
def test_dry_run_builds_against_another_libtorch_and_runs_every_step():
    if not (ROOT / ".gpukit" / "manifest.json").exists():
        r = _run(["bash", "scripts/gpu_check.sh", "--pack"])
        assert r.returncode == 0, r.stdout + r.stderr
    r = _run(["bash", "scripts/gpu_check.sh", "--dry-run", "--skip-compile"])
    out = ROOT / "build-gpukit-dry" / "out"
    steps = {s["step"]: s for s in json.loads((out / "gpu_report.json").read_text())["steps"]}
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert steps["build"]["status"] == "ok"
    assert steps["nccl_ws1"]["status"] == "skipped"  # no GPU here
    assert all(s["status"] == "ok" for n, s in steps.items() if n != "nccl_ws1"), steps


def test_the_build_step_names_what_the_loader_would_miss(tmp_path):
    """The device's first sign of a missing CUDA library: ldd's "not found", named in the report
    (a worker linked against libtorch_cuda starts only where the nvidia-* wheels are)."""
    sys.path.insert(0, str(GPU))
    import build_step

    (tmp_path / "gone.c").write_text("int gone(void) { return 7; }\n")
    (tmp_path / "main.c").write_text("int gone(void);\nint main(void) { return gone(); }\n")
    cc = ["cc", "-o"]
    assert (
        _run(
            [*cc, str(tmp_path / "libfxdpgone.so"), "-shared", "-fPIC", str(tmp_path / "gone.c")]
        ).returncode
        == 0
    )
    r = _run([*cc, str(tmp_path / "main"), str(tmp_path / "main.c"), f"-L{tmp_path}", "-lfxdpgone"])
    assert r.returncode == 0, r.stderr
    (tmp_path / "libfxdpgone.so").unlink()
    assert build_step.unresolved_libs(str(tmp_path / "main")) == ["libfxdpgone.so"]
    assert build_step.unresolved_libs(fxdp_binary("FXDP_WORKER", "fxdp-worker")) == []
    link = "FAILED: tests/nccl_info_test " + "-Wl,--as-needed lib.so " * 200
    out = "\n".join(
        ["[1/3] Building CXX object a.o", link, "x.cc:3:1: error: 'foo' was not declared"]
    )
    assert build_step.build_errors(out).splitlines() == [link[:300], out.splitlines()[2]]
