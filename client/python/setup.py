"""Build step of the fxdp package: generates the protobuf/gRPC stubs fxdp.v1.*_pb2*.py.

Why generated at build time and not checked in: the stubs are tied to the exact protoc and gRPC
plugin that wrote them (protobuf's gencode says "NO CHECKED-IN PROTOBUF GENCODE" and checks at
import that the runtime is at least its own version; grpcio's checks grpcio >= the plugin's), and
the protos change with the server. Generating them from the .proto files with the grpcio-tools
pinned in pyproject.toml's [build-system] keeps them equal to the protos by construction, and the
runtime floor in [project].dependencies (grpcio, protobuf) is the one that pin produces.

Where the protos come from: `proto/` next to this file in an sdist (the sdist command below copies
them in, so an sdist builds on its own), else `../../proto` in the fxdp source tree.
`pip install -e` writes the stubs into the source tree (as scripts/setup.sh does); a regular build
writes them into the build directory only.
"""

from __future__ import annotations

import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py
from setuptools.command.sdist import sdist as _sdist

HERE = os.path.dirname(os.path.abspath(__file__))
# Must equal [build-system].requires in pyproject.toml: the generated code requires
# grpcio >= this and the protobuf runtime its protoc was released with.
GRPCIO_TOOLS_VERSION = "1.85.1"


def proto_root() -> str:
    for root in (os.path.join(HERE, "proto"), os.path.join(HERE, "..", "..", "proto")):
        if glob.glob(os.path.join(root, "fxdp", "v1", "*.proto")):
            return os.path.normpath(root)
    raise SystemExit(
        "fxdp build: no fxdp/v1/*.proto found in proto/ (an sdist) or ../../proto (the source "
        f"tree) relative to {HERE}"
    )


def generate_stubs(out_dir: str) -> list:
    """Runs grpc_tools.protoc on every fxdp/v1/*.proto into out_dir/fxdp/v1; returns the files."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError as e:  # only with --no-build-isolation and no grpcio-tools installed
        raise SystemExit(f"fxdp build: grpcio-tools=={GRPCIO_TOOLS_VERSION} is required: {e}")
    from importlib.metadata import version

    have = version("grpcio-tools")
    if have != GRPCIO_TOOLS_VERSION:
        raise SystemExit(
            f"fxdp build: grpcio-tools {have} is installed, the package pins {GRPCIO_TOOLS_VERSION} "
            "(the generated stubs' runtime requirements depend on it)"
        )
    root = proto_root()
    protos = sorted(glob.glob(os.path.join(root, "fxdp", "v1", "*.proto")))
    pkg = os.path.join(out_dir, "fxdp", "v1")
    os.makedirs(pkg, exist_ok=True)
    for old in glob.glob(os.path.join(pkg, "*_pb2*.py")):
        os.remove(old)
    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rel = [os.path.relpath(p, root) for p in protos]
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            *rel,
        ]
    )
    if rc != 0:
        raise SystemExit(f"fxdp build: protoc failed ({rc}) on {', '.join(rel)}")
    init = os.path.join(pkg, "__init__.py")
    with open(init, "w") as f:
        f.write('"""Generated protobuf/gRPC stubs of proto/fxdp/v1 (setup.py, at build time)."""\n')
    return sorted(glob.glob(os.path.join(pkg, "*.py")))


class build_py(_build_py):
    def run(self):
        super().run()
        # Editable installs import from the source tree, so the stubs go there.
        out = HERE if getattr(self, "editable_mode", False) else self.build_lib
        self._fxdp_stubs = generate_stubs(out)

    def get_outputs(self, include_bytecode=True):
        return list(super().get_outputs(include_bytecode)) + list(getattr(self, "_fxdp_stubs", []))


class sdist(_sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for p in glob.glob(os.path.join(root, "fxdp", "v1", "*.proto")):
            dest = os.path.join(base_dir, "proto", "fxdp", "v1")
            os.makedirs(dest, exist_ok=True)
            shutil.copy2(p, dest)


setup(cmdclass={"build_py": build_py, "sdist": sdist})
