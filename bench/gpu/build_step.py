"""The GPU check's build (docs/gpu.md): fxdp-worker and the executor's gpu and unit tests
configured with FXDP_WORKER_ONLY against a torch package folder (FXDP_TORCH_DIR), Protobuf, Abseil,
GoogleTest and nlohmann-json from the carried deps.tar.xz, NCCL from a Python's nvidia/nccl; and
what the dynamic loader would miss when the worker starts."""

from __future__ import annotations

import os
import shutil
import subprocess

TARGETS = [
    "fxdp-worker",
    "torch_types_test",
    "interpreter_test",
    "random_ops_test",
    "nccl_info_test",
    "nccl_communicator_test",
]
ARCH = "x86_64-linux-gnu"


def torch_dir(given: str | None) -> str:
    """`given`, else the folder of this python's torch."""
    if given:
        return os.path.abspath(given)
    import torch

    return os.path.dirname(torch.__file__)


def nccl_dir(given: str | None) -> str | None:
    """`given`, else this python's nvidia/nccl (the nvidia-nccl-cu13 wheel), else None."""
    if given:
        return given
    import importlib.util

    spec = importlib.util.find_spec("nvidia.nccl")
    return list(spec.submodule_search_locations)[0] if spec else None


def unpack_deps(tarball: str, deps: str) -> tuple[str, str]:
    """Unpacks the carried packages into `deps` (emptied first); returns their usr/ and lib/."""
    shutil.rmtree(deps, ignore_errors=True)
    os.makedirs(deps)
    subprocess.run(["tar", "-C", deps, "-xJf", tarball], check=True)
    usr = os.path.join(deps, "usr")
    return usr, os.path.join(usr, "lib", ARCH)


def configure_command(repo, build, usr, lib, torch, nccl, torch_cuda, dry_run) -> list:
    cfg = [
        "cmake",
        "-S",
        repo,
        "-B",
        build,
        "-G",
        "Ninja",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DFXDP_WORKER_ONLY=ON",
        "-DFXDP_BUILD_BENCH=OFF",
        f"-DFXDP_TORCH_DIR={torch}",
        f"-DCMAKE_PREFIX_PATH={usr};{lib}/cmake",
        f"-DProtobuf_INCLUDE_DIR={usr}/include",
        f"-DProtobuf_LIBRARY={lib}/libprotobuf.so",
        f"-DProtobuf_PROTOC_EXECUTABLE={usr}/bin/protoc",
        f"-DFXDP_TORCH_CUDA={torch_cuda}",
    ]
    if nccl:
        cfg.append(f"-DFXDP_NCCL_DIR={nccl}")
    if dry_run:  # only the carried folder may provide the dependencies
        cfg.append("-DCMAKE_IGNORE_PREFIX_PATH=/usr")
    return cfg


def ninja_command(build: str, jobs: str, targets: list) -> list:
    # -k 0: a target that fails (a test binary that cannot start fails its build, since
    # gtest_discover_tests runs it) leaves the others: the worker's steps still run.
    return ["ninja", "-C", build, "-k", "0", "-j", jobs, *targets]


def build_errors(output: str, keep: int = 12) -> str:
    """ninja's failures and the compilers' and loader's errors, each line cut (a link command
    line is kilobytes long)."""
    keys = ("FAILED:", "error:", "error while loading", "undefined reference")
    lines = [line[:300] for line in output.splitlines() if any(k in line for k in keys)]
    return "\n".join(lines[-keep:])


def unresolved_libs(binary: str) -> list:
    """The shared libraries `ldd` finds no file for (with LD_LIBRARY_PATH as the steps run it)."""
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    return sorted({line.split()[0] for line in r.stdout.splitlines() if "not found" in line})


def add_ld_path(d: str) -> None:
    old = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = d + (":" + old if old else "")
