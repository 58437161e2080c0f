"""The GPU check (issue 28, docs/gpu.md): builds fxdp-worker and the gpu-labelled tests against the
LibTorch of the machine it runs on, with the dependencies carried in .gpukit/ (bench/gpu/pack.py),
then runs every step, each timed and reported even when an earlier one failed, and writes
gpu_report.md + gpu_report.json (and the build and step logs) to --out.

  python3 bench/gpu/gpu_check.py --kit .gpukit --out $OUT                  # on the lent GPU
  python bench/gpu/gpu_check.py --dry-run --torch-dir DIR --out DIR ...   # here, on the CPU

--dry-run runs every step on the CPU ("cuda" runs are CPU runs, the NCCL tests skip) and builds
against --torch-dir with CMAKE_IGNORE_PREFIX_PATH=/usr, so the build finds its dependencies in the
carried folder only. scripts/gpu_check.sh is the one command (it picks python and the defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build_step as bs  # noqa: E402
import worker_runs as wr  # noqa: E402
from report import write_report  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
GPU_TESTS = ["nccl_info_test", "nccl_communicator_test"]
# The executor's own tests, against the machine's LibTorch: every test FXDP_WORKER_ONLY builds.
UNIT_TESTS = ["torch_types_test", "interpreter_test", "random_ops_test"]
STEPS_N1 = 3  # steps of each equality run
GTEST_TIMEOUT_S = 120  # a gtest binary still running then is killed (the device's minutes are few)
# Equality: the losses of every step (max |a-b|/|b|) and the final state (per tensor max |a-b| /
# max|b|, the worst tensor). Rounding differs between devices (cuDNN may use TF32 for
# convolutions) and between N=1 and N=2 (summation order); AdamW then turns the rounding noise of
# a parameter with an exactly-zero gradient (GPT-2's attention key bias: softmax is shift
# invariant) into steps of lr size: 7.3e-4 of the state at N=2 on the CPU, where the losses agree
# to 1e-7. The report gives both numbers; these bounds decide "ok".
TOL_DEVICE = {"loss": 1e-3, "state": 1e-2}  # cuda vs cpu
TOL_N2 = {"loss": 1e-5, "state": 1e-3}  # N=2 vs N=1 on the same device
# The equality runs (zoo, n2_gloo, fully_shard) without TF32: cuDNN convolutions use it by default
# (LibTorch's, as eager's, allow_tf32), and TF32's rounding can flip the sign of a near-zero
# gradient, which Adam turns into a 2 x lr step. NVIDIA_TF32_OVERRIDE=0 turns it off in cuDNN and
# cuBLAS whatever the program asks; the timing steps keep the defaults, as eager's run.
EQUAL_ENV = {"NVIDIA_TF32_OVERRIDE": "0"}


class Check:
    def __init__(self, args):
        self.a = args
        self.kit = os.path.abspath(args.kit)
        self.out = os.path.abspath(args.out)
        self.build = os.path.abspath(args.build)
        self.work = os.path.join(self.build, "gpukit-runs")
        self.device = "cpu" if args.dry_run else args.device
        with open(os.path.join(self.kit, "manifest.json")) as fh:
            self.manifest = json.load(fh)
        self.cases = {c["name"]: c for c in self.manifest["cases"]}
        self.worker = os.path.join(self.build, "bin", "fxdp-worker")
        if args.ld_path:  # every command (builds, workers, python) inherits it
            bs.add_ld_path(args.ld_path)
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(self.work, exist_ok=True)
        self.log = open(os.path.join(self.out, "steps.log"), "w")
        self.n1 = {}  # case -> (device) final state of the N=1 run

    def sh(self, cmd, timeout=600, log=None, **kw) -> subprocess.CompletedProcess:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
        print(
            f"$ {' '.join(cmd)}\n{r.stdout[-4000:]}{r.stderr[-4000:]}(rc {r.returncode})",
            file=log or self.log,
            flush=True,
        )
        return r

    def path(self, rel: str) -> str:
        return os.path.join(self.kit, rel)

    def python(self, *args, timeout=600) -> dict:
        r = self.sh([sys.executable, os.path.join(HERE, "eager.py"), *args], timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"eager.py {args[0]} failed: {r.stderr.strip()[-800:]}")
        return json.loads(r.stdout.strip().splitlines()[-1])

    # ---- steps ------------------------------------------------------------------------------

    def step_env(self) -> dict:
        import torch

        def first_line(cmd):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
                return (
                    (r.stdout or r.stderr).strip().splitlines()[0]
                    if (r.stdout or r.stderr).strip()
                    else ""
                )
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"unavailable ({e})"

        info = {
            "host": platform.node(),
            "kernel": platform.release(),
            "glibc": platform.libc_ver()[1],
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cxx": first_line(["c++", "--version"]),
            "cmake": first_line(["cmake", "--version"]),
            "nvcc": subprocess.run(["nvcc", "--version"], capture_output=True, text=True)
            .stdout.strip()
            .splitlines()[-1]
            if shutil.which("nvcc")
            else None,
            "nvcc_path": shutil.which("nvcc"),
            "ninja": first_line(["ninja", "--version"]),
            "cores": os.cpu_count(),
            "traced_with": self.manifest["traced_with"],
        }
        if not self.a.dry_run and not info["cuda_available"]:
            raise RuntimeError(f"torch {torch.__version__} sees no CUDA device")
        return info

    def torch_cuda(self) -> str:
        """FXDP_TORCH_CUDA: a dry run links the CPU libraries only, unless --link-cuda."""
        return "ON" if self.a.link_cuda else "OFF" if self.a.dry_run else "AUTO"

    def step_build(self) -> dict:
        t0 = time.time()
        deps = os.path.abspath(self.a.deps_dir or os.path.join(self.build, "deps"))
        usr, lib = bs.unpack_deps(self.path("deps.tar.xz"), deps)
        bs.add_ld_path(lib)  # protoc, and the worker's Protobuf and Abseil
        torch, nccl = bs.torch_dir(self.a.torch_dir), bs.nccl_dir(self.a.nccl_dir)
        cfg = bs.configure_command(
            REPO, self.build, usr, lib, torch, nccl, self.torch_cuda(), self.a.dry_run
        )
        blog = open(os.path.join(self.out, "build.log"), "w")
        r = self.sh(cfg, log=blog)
        configure_s = time.time() - t0
        if r.returncode != 0:
            raise RuntimeError("cmake configure failed: " + (r.stdout + r.stderr).strip()[-1500:])
        jobs = str(self.a.jobs or os.cpu_count())
        with open(os.path.join(self.build, "build.ninja")) as fh:
            ninja_file = fh.read()
        targets = [t for t in bs.TARGETS if t in ninja_file]
        # The device builds with every core in minutes; a dry run's fresh build with one job on 2
        # loaded cores took over 30 minutes (34 LibTorch translation units).
        build_s = 4 * 3600 if self.a.dry_run else 1800
        r = self.sh(bs.ninja_command(self.build, jobs, targets), log=blog, timeout=build_s)
        missing = bs.unresolved_libs(self.worker) if os.path.exists(self.worker) else []
        no_libs = f"fxdp-worker cannot start: ldd finds no {', '.join(missing)}" if missing else ""
        if r.returncode != 0:
            errors = bs.build_errors(r.stdout + r.stderr)
            raise RuntimeError(f"ninja failed:\n{errors}\n{no_libs}".strip())
        if missing and not self.a.link_cuda:
            raise StepFailed(no_libs, {"unresolved_libs": missing})
        return {
            "configure_s": round(configure_s, 1),
            "targets": targets,
            "jobs": jobs,
            "torch_dir": torch,
            "nccl_dir": nccl,
            "nccl_path": "nccl_communicator_test" in targets,
            "missing_targets": sorted(set(bs.TARGETS) - set(targets)),
            "torch_cuda": self.torch_cuda(),
            # --link-cuda: what the device's nvidia-* wheels provide (libtorch_cuda's RPATH).
            "unresolved_libs": missing,
        }

    def need_worker(self):
        if not os.access(self.worker, os.X_OK):
            raise SkipStep("no fxdp-worker (the build step failed)")

    def gtests(self, binary: str, only: str = "*") -> list:
        """Each test of a gtest binary (`only`: a --gtest_filter): (name, PASSED/SKIPPED/FAILED,
        message); TIMED OUT after GTEST_TIMEOUT_S."""
        path = os.path.join(self.build, "tests", binary)
        if not os.path.exists(path):
            return [(binary, "NOT BUILT", "")]
        js = os.path.join(self.work, binary + ".json")
        if os.path.exists(js):
            os.remove(js)
        try:
            self.sh(
                [path, f"--gtest_filter={only}", f"--gtest_output=json:{js}"],
                timeout=GTEST_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return [
                (binary, "TIMED OUT", f"killed after {GTEST_TIMEOUT_S} s (--gtest_filter={only})")
            ]
        if not os.path.exists(js):
            return [(binary, "CRASHED", "no gtest report")]
        res = []
        for suite in json.load(open(js))["testsuites"]:
            for t in suite["testsuite"]:
                fails = [f["failure"][:300] for f in t.get("failures", [])]
                status = (
                    "FAILED" if fails else ("SKIPPED" if t.get("result") == "SKIPPED" else "PASSED")
                )
                res.append((f"{suite['name']}.{t['name']}", status, " | ".join(fails)))
        return res

    def step_ctest_gpu(self) -> dict:
        self.need_worker()
        r = self.sh(
            [
                "ctest",
                "--test-dir",
                self.build,
                "-L",
                "gpu",
                "--timeout",
                "60",
                "--output-on-failure",
            ],
            timeout=600,
        )
        tests = [t for b in GPU_TESTS for t in self.gtests(b)]
        failed = [t for t in tests if t[1] not in ("PASSED", "SKIPPED")]
        out = {
            "ctest_rc": r.returncode,
            "tests": tests,
            "summary": (r.stdout.strip().splitlines() or [""])[-3:],
        }
        if r.returncode != 0 or failed:
            raise StepFailed(f"{len(failed)} gpu tests failed: {[t[0] for t in failed]}", out)
        return out

    def step_unit(self) -> dict:
        self.need_worker()
        tests = [t for b in UNIT_TESTS for t in self.gtests(b)]
        failed = [t for t in tests if t[1] not in ("PASSED", "SKIPPED")]
        out = {"passed": sum(t[1] == "PASSED" for t in tests), "failed": failed}
        if failed:
            raise StepFailed(f"{len(failed)} executor tests failed against this LibTorch", out)
        return out

    def state_of(self, c: dict) -> str:
        if c.get("state"):
            return self.path(c["state"])
        out = os.path.join(self.work, c["name"] + ".state.safetensors")
        if not os.path.exists(out):
            self.python(
                "materialize",
                "--name",
                c["name"],
                "--skeleton",
                self.path(c["skeleton"]),
                "--spec",
                self.path(c["spec"]),
                "--out",
                out,
            )
        return out

    def equal_case(self, c: dict) -> dict:
        """One case on the CPU and on the device, STEPS_N1 steps each, compared."""
        res = {}
        for label, dev in (("ref", "cpu"), ("dev", self.device)):  # the dry run: cpu twice
            out = os.path.join(self.work, f"{c['name']}.n1.{label}.safetensors")
            res[label] = wr.run_ranks(
                self.worker,
                self.path(c["graph"]),
                self.state_of(c),
                self.path(c["batch"]),
                STEPS_N1,
                dev,
                out,
                threads=2,
                env_extra=EQUAL_ENV,
            )
            res[label]["final"] = out
        cpu, gpu = res["ref"], res["dev"]
        row = {
            "case": c["name"],
            "nodes": c["nodes"],
            "cpu_rc": cpu["rc"],
            "device_rc": gpu["rc"],
            "losses_cpu": cpu["losses"],
            "losses_device": gpu["losses"],
        }
        expect_fail = c.get("expect_cuda_failure") and not self.a.dry_run
        if gpu["rc"] != 0 or cpu["rc"] != 0:
            row["error"] = gpu.get("error") or cpu.get("error")
            named = bool(expect_fail) and expect_fail in (gpu.get("error") or "")
            row["ok"] = named and gpu["rc"] != 0 and cpu["rc"] == 0
            row["note"] = (
                f"expected: the CPU-only kernel {expect_fail} traced on the CPU"
                if named
                else (f"expected a failure naming {expect_fail}" if expect_fail else "")
            )
            return row
        self.n1[c["name"]] = (gpu["final"], gpu["losses"])
        row.update(wr.compare_states(gpu["final"], cpu["final"]))
        row["loss_rel_diff"] = wr.rel_diff(gpu["losses"], cpu["losses"])
        row["ok"] = within(row, TOL_DEVICE) and not expect_fail
        if expect_fail:
            row["note"] = "expected to fail on cuda (CPU-only kernel) but ran"
        return row

    def step_zoo(self) -> dict:
        self.need_worker()
        cases = [c for c in self.manifest["cases"] if c.get("state") or c.get("skeleton")]
        cases = [c for c in cases if c["name"] != "gpt2_step"]
        par = max(1, min(8, (os.cpu_count() or 2) // 4))
        with ThreadPoolExecutor(par) as ex:
            rows = list(ex.map(self.equal_case, cases))
        bad = [r["case"] for r in rows if not r["ok"]]
        out = {"rows": rows, "tolerance": TOL_DEVICE, "device": self.device}
        if bad:
            raise StepFailed(f"{len(bad)} of {len(rows)} cases differ or fail: {bad}", out)
        return out

    def n2(self, style: str) -> dict:
        self.need_worker()
        rows = []
        for c in self.manifest["cases"]:
            if style not in c.get("n2", {}):
                continue
            out = os.path.join(self.work, f"{c['name']}.{style}.n2.safetensors")
            r = wr.run_ranks(
                self.worker,
                self.path(c["n2"][style]),
                self.state_of(c),
                self.path(c["batch"]),
                STEPS_N1,
                self.device,
                out,
                world=2,
                communicator="gloo",
                threads=2,
                env_extra=EQUAL_ENV,
            )
            row = {"case": c["name"], "rc": r["rc"], "losses": r["losses"], "seconds": r["seconds"]}
            if r["rc"] != 0:
                row.update(error=r.get("error"), ok=False)
            elif c["name"] not in self.n1:
                row.update(error="no N=1 result to compare with (zoo step)", ok=False)
            else:
                row.update(wr.compare_states(out, self.n1[c["name"]][0]))
                row["loss_rel_diff"] = wr.rel_diff(r["losses"], self.n1[c["name"]][1])
                row["ok"] = within(row, TOL_N2)
            rows.append(row)
        bad = [r["case"] for r in rows if not r["ok"]]
        out = {"rows": rows, "tolerance": TOL_N2, "communicator": "gloo (host-staged on cuda)"}
        if bad or not rows:
            raise StepFailed(f"{len(bad)} of {len(rows)} cases differ or fail: {bad}", out)
        return out

    def step_n2_gloo(self) -> dict:
        return self.n2("replicate")

    def step_fully_shard(self) -> dict:
        return self.n2("fully_shard")

    def step_nccl_ws1(self) -> dict:
        self.need_worker()
        tests = self.gtests("nccl_communicator_test", only="*SingleRank*")
        tests += self.gtests("nccl_info_test")
        if not tests or tests[0][1] == "NOT BUILT":
            raise StepFailed(
                "nccl_communicator_test was not built (no NCCL path)", {"tests": tests}
            )
        single = [t for t in tests if "SingleRank" in t[0]]
        if single and all(t[1] == "SKIPPED" for t in single):
            raise SkipStep("no GPU: every single-rank NCCL test skipped")
        bad = [t for t in tests if t[1] not in ("PASSED", "SKIPPED")]
        if bad:
            raise StepFailed(f"{len(bad)} NCCL tests did not pass", {"tests": tests})
        return {"tests": tests}

    def step_overhead(self) -> dict:
        self.need_worker()
        c = self.cases["gpt2_tiny"]
        out = os.path.join(self.work, "overhead.safetensors")
        steps = self.a.timing_steps
        fx = wr.run_ranks(
            self.worker,
            self.path(c["graph"]),
            self.state_of(c),
            self.path(c["batch"]),
            steps,
            self.device,
            out,
        )
        if fx["rc"] != 0:
            raise StepFailed("fxdp-worker failed", fx)
        ea = self.python(
            "run",
            "--name",
            "gpt2_tiny",
            "--state",
            self.state_of(c),
            "--batch",
            self.path(c["batch"]),
            "--device",
            self.device,
            "--steps",
            str(steps),
        )
        nodes = fx["ops"]
        fx_ms = sorted(fx["step_ms"][2:] or fx["step_ms"])[
            len(fx["step_ms"][2:] or fx["step_ms"]) // 2
        ]
        return {
            "case": "gpt2_tiny",
            "ops": nodes,
            "fxdp_ms_per_step": fx_ms,
            "fxdp_us_per_op": 1e3 * fx_ms / nodes,
            "eager_ms_per_step": ea["median_ms"],
            "eager_us_per_op_equiv": 1e3 * ea["median_ms"] / nodes,
            "loss_rel_diff_step1": wr.rel_diff(fx["losses"][:1], ea["losses"][:1]),
        }

    def step_gpt2(self) -> dict:
        self.need_worker()
        name = self.a.gpt2_case if self.a.gpt2_case in self.cases else "gpt2_tiny"
        c = self.cases[name]
        state = self.state_of(c)
        steps = self.a.timing_steps
        fx = wr.run_ranks(
            self.worker,
            self.path(c["graph"]),
            state,
            self.path(c["batch"]),
            steps,
            self.device,
            os.path.join(self.work, "gpt2.final.safetensors"),
        )
        if fx["rc"] != 0:
            raise StepFailed("fxdp-worker failed", fx)
        warm = fx["step_ms"][2:] or fx["step_ms"]
        res = {
            "case": name,
            "size": c.get("size"),
            "steps": steps,
            "fxdp": {
                "median_ms": sorted(warm)[len(warm) // 2],
                "first_step_ms": fx["step_ms"][0],
                "peak_mb": fx.get("peak_mb"),
                "reserved_mb": fx.get("reserved_mb"),
                "ops": fx.get("ops"),
                "losses": fx["losses"],
            },
        }
        for mode in ("eager", "compile"):
            if mode == "compile" and self.a.skip_compile:
                res[mode] = {"skipped": "--skip-compile"}
                continue
            try:
                args = [
                    "run",
                    "--name",
                    name,
                    "--state",
                    state,
                    "--batch",
                    self.path(c["batch"]),
                    "--device",
                    self.device,
                    "--steps",
                    str(steps),
                ]
                res[mode] = self.python(
                    *args, *(["--compile"] if mode == "compile" else []), timeout=900
                )
                res[mode]["loss_rel_diff_vs_fxdp"] = wr.rel_diff(res[mode]["losses"], fx["losses"])
            except Exception as e:  # one mode failing leaves the others' numbers
                res[mode] = {"error": str(e)[-1500:]}
        errs = [m for m in ("eager", "compile") if "error" in res[m]]
        if errs:
            raise StepFailed(f"{errs} failed", res)
        return res


def within(row: dict, tol: dict) -> bool:
    return row.get("loss_rel_diff", 1) <= tol["loss"] and row.get("max_rel_err", 1) <= tol["state"]


class SkipStep(Exception):
    pass


class StepFailed(Exception):
    def __init__(self, msg, details=None):
        super().__init__(msg)
        self.details = details or {}


STEPS = [
    "env",
    "build",
    "ctest_gpu",
    "unit",
    "zoo",
    "n2_gloo",
    "fully_shard",
    "nccl_ws1",
    "overhead",
    "gpt2",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--kit", default=os.path.join(REPO, ".gpukit"))
    ap.add_argument(
        "--out", default=os.environ.get("OUT") or os.path.join(REPO, "build-gpukit", "out")
    )
    ap.add_argument("--build", default=os.path.join(REPO, "build-gpukit"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dry-run", action="store_true", help="on the CPU: every step, no GPU")
    ap.add_argument(
        "--link-cuda",
        action="store_true",
        help="link libtorch_cuda even in a dry run (the link the device makes; the binaries then "
        "cannot start without the nvidia-* wheels: give it its own --build, --steps env,build)",
    )
    ap.add_argument("--torch-dir", help="LibTorch to build against (default: this python's torch)")
    ap.add_argument("--nccl-dir", help="NCCL (include/, lib/); default: this python's nvidia.nccl")
    ap.add_argument("--ld-path", help="prepended to LD_LIBRARY_PATH (a LibTorch's CUDA runtime)")
    ap.add_argument("--jobs", type=int, help="ninja -j (default: every core)")
    ap.add_argument("--deps-dir", help="where deps.tar.xz is unpacked (default: BUILD/deps)")
    ap.add_argument("--steps", default=",".join(STEPS), help="which steps, comma-separated")
    ap.add_argument("--timing-steps", type=int, default=12)
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--gpt2-case", default="gpt2_step", help="the case the gpt2 step times")
    args = ap.parse_args(argv)
    ck = Check(args)
    results, t_all = [], time.time()
    for name in args.steps.split(","):
        t0 = time.time()
        try:
            details, status, msg = getattr(ck, "step_" + name)(), "ok", ""
        except SkipStep as e:
            details, status, msg = {}, "skipped", str(e)
        except StepFailed as e:
            details, status, msg = e.details, "FAILED", str(e)
        except Exception as e:  # noqa: BLE001 - every step reports, whatever happened
            details, status, msg = (
                {"traceback": traceback.format_exc()[-3000:]},
                "FAILED",
                str(e)[-2000:],
            )
        r = {
            "step": name,
            "status": status,
            "seconds": round(time.time() - t0, 1),
            "message": msg,
            "details": details,
        }
        results.append(r)
        print(f"[gpu_check] {name}: {status} ({r['seconds']} s) {msg[:300]}", flush=True)
        # after every step: a run killed by the device's time limit still leaves its report
        write_report(ck.out, results, round(time.time() - t_all, 1), args.dry_run, ck.device)
    total = round(time.time() - t_all, 1)
    write_report(ck.out, results, total, dry_run=args.dry_run, device=ck.device)
    print(f"[gpu_check] {total} s; report in {ck.out}/gpu_report.md", flush=True)
    return 0 if all(r["status"] != "FAILED" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
