"""Writes the folder the GPU check carries to the device (docs/gpu.md): ``.gpukit/`` with

  deps.tar.xz     the Debian packages fxdp-worker's build needs besides LibTorch (Protobuf with
                  protoc, Abseil, GoogleTest, nlohmann-json), their files as installed here
                  (``dpkg -L``: what ``dpkg -x`` of their .deb files gives), no static libraries
                  but GoogleTest's;
  cases/          every zoo model x optimizer and the Hugging Face GPT-2s (bench/gpu/gpt2_model.py)
                  traced here: graph, state and batch; for a few, the graphs ``fxdp expand`` writes
                  for N=2 (replicate and fully_shard). gpt2_step's state is rebuilt on the device
                  from the model's own initialization (its 23M parameters and their optimizer state
                  would not fit the 64 MiB the device tool carries): the skeleton holds the other
                  entries, the spec every entry's dtype, shape and source;
  manifest.json   the cases, and the versions that made them.

Usage (here, with .venv's python and fxdp; scripts/gpu_check.sh --pack calls it):
  python bench/gpu/pack.py [--out .gpukit] [--fxdp build/bin/fxdp] [--quick] [--no-deps]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

DEB_PACKAGES = [
    "libprotobuf-dev",
    "libprotobuf32",
    "protobuf-compiler",
    "libprotoc32",
    "libabsl-dev",
    "libabsl20220623",
    "libgtest-dev",
    "libgmock-dev",
    "nlohmann-json3-dev",
]
ZOO_OPTIMS = ["sgd", "adam", "adamw"]
# cases also expanded for N=2 (even global batches: one graph for both ranks), and how. The cnn's
# BatchNorm equals one device only with --sync-batchnorm, in both styles.
N2_CASES = {
    "zoo_mlp_adam": {"replicate": [], "fully_shard": []},
    "zoo_cnn_sgd": {"replicate": ["--sync-batchnorm"], "fully_shard": ["--sync-batchnorm"]},
    "zoo_transformer_adamw": {"replicate": [], "fully_shard": []},
    "gpt2_tiny": {"replicate": [], "fully_shard": []},
}
HF_CASES = ["gpt2_tiny", "gpt2_tiny_sdpa", "gpt2_tiny_dropout", "gpt2_step"]


def pack_deps(out: str) -> dict:
    """deps.tar.xz of the packages' files; returns {package: version}."""
    versions, files = {}, set()
    for p in DEB_PACKAGES:
        versions[p] = subprocess.check_output(["dpkg-query", "-W", "-f=${Version}", p], text=True)
        for f in subprocess.check_output(["dpkg", "-L", p], text=True).splitlines():
            if os.path.isdir(f) and not os.path.islink(f):
                continue
            if f.startswith(("/usr/share/doc/", "/usr/share/man/", "/usr/share/lintian/")):
                continue
            base = os.path.basename(f)
            if f.endswith(".a") and not base.startswith(("libgtest", "libgmock")):
                continue
            files.add(f.lstrip("/"))
    listing = os.path.join(out, "deps.list")
    with open(listing, "w") as fh:
        fh.write("\n".join(sorted(files)) + "\n")
    subprocess.check_call(
        ["tar", "-C", "/", "-cJf", os.path.join(out, "deps.tar.xz"), "-T", listing]
    )
    os.remove(listing)
    return versions


def save_case(step, batch: dict, base: str) -> dict:
    from safetensors.torch import save_file

    step.save(base + ".pb")
    step.to_safetensors(base + ".state.safetensors")
    save_file({k: v.contiguous() for k, v in batch.items()}, base + ".batch.safetensors")
    return {
        "graph": base + ".pb",
        "state": base + ".state.safetensors",
        "batch": base + ".batch.safetensors",
        "nodes": len(step.graph.nodes),
    }


def skeleton(model, state_path: str, base: str) -> dict:
    """Replaces the full state file by a skeleton + spec (gpt2_step): parameters come from the
    model on the device, all-zero entries (fresh optimizer state) are made there."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    params = dict(model.named_parameters())
    spec, keep = {}, {}
    with safe_open(state_path, "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            src = "param" if k in params else ("zeros" if not t.any() else "file")
            spec[k] = {
                "dtype": str(t.dtype).replace("torch.", ""),
                "shape": list(t.shape),
                "from": src,
            }
            if src == "file":
                keep[k] = t.contiguous()
            if src == "param" and not bool((params[k].detach() == t).all()):
                raise SystemExit(f"pack: state entry {k} differs from the model's parameter")
    os.remove(state_path)
    save_file(keep, base + ".skeleton.safetensors")
    with open(base + ".spec.json", "w") as fh:
        json.dump(spec, fh, indent=0, sort_keys=True)
    return {"state": None, "skeleton": base + ".skeleton.safetensors", "spec": base + ".spec.json"}


def expand(fxdp: str, graph: str, style: str, extra: list) -> str:
    """`fxdp expand` for N=2; the graph path, '{rank}' where the ranks' graphs differ."""
    out = graph[:-3] + (".n2.pb" if style == "replicate" else ".fs2.pb")
    r = subprocess.run(
        [fxdp, "expand", graph, "--world-size", "2", "-o", out, "--style", style, "--json", *extra],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"pack: fxdp expand {graph} --style {style} failed: {r.stderr}")
    files = [f["path"] for f in json.loads(r.stdout).get("files", [])]
    if files == [out] or (not files and os.path.exists(out)):
        return out
    return out[:-3] + ".rank{rank}.pb"


def trace_cases(out: str, fxdp: str, quick: bool) -> list:
    import fxdp as fx
    import gpt2_model
    from fxdp import zoo

    os.makedirs(os.path.join(out, "cases"), exist_ok=True)
    cases = []
    for m in ["mlp"] if quick else list(zoo.MODELS):
        for o in ["adam"] if quick else ZOO_OPTIMS:
            name = f"zoo_{m}_{o}"
            step, _, _ = zoo.trace_entry(m, o)
            c = save_case(step, zoo.get(m).named_batch(0), os.path.join(out, "cases", name))
            cases.append({"name": name, "kind": "zoo", **c})
    for name in [] if quick else HF_CASES:
        model, opt = gpt2_model.make(name)
        tokens, target = gpt2_model.batch(name)
        step = fx.trace(
            model, opt, gpt2_model.lm_loss, (tokens, target), input_names=("tokens", "target")
        )
        c = save_case(step, {"tokens": tokens, "target": target}, os.path.join(out, "cases", name))
        if name == "gpt2_step":
            c.update(skeleton(model, c["state"], os.path.join(out, "cases", name)))
        cases.append(
            {
                "name": name,
                "kind": "hf",
                **c,
                "size": gpt2_model.SIZES[name],
                # the CPU-only kernel the worker must name on cuda (docs/gpu.md)
                "expect_cuda_failure": "_scaled_dot_product_flash_attention_for_cpu"
                if gpt2_model.SIZES[name]["attn"] == "sdpa"
                else "",
            }
        )
        del model, opt, step
    for c in cases:
        if c["name"] in N2_CASES:
            c["n2"] = {
                s: expand(fxdp, c["graph"], s, extra) for s, extra in N2_CASES[c["name"]].items()
            }
    for c in cases:  # paths relative to the folder
        for k in ("graph", "state", "batch", "skeleton", "spec"):
            if c.get(k):
                c[k] = os.path.relpath(c[k], out)
        for s, p in c.get("n2", {}).items():
            c["n2"][s] = os.path.relpath(p, out)
    return cases


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=".gpukit")
    ap.add_argument("--fxdp", default="build/bin/fxdp")
    ap.add_argument("--quick", action="store_true", help="zoo_mlp_adam only (tests)")
    ap.add_argument(
        "--no-deps", action="store_true", help="no deps.tar.xz (tests that do not build)"
    )
    args = ap.parse_args(argv)
    import torch
    import transformers

    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    deps = {} if args.no_deps else pack_deps(args.out)
    cases = trace_cases(args.out, args.fxdp, args.quick)
    manifest = {
        "traced_with": {"torch": torch.__version__, "transformers": transformers.__version__},
        "deb_packages": deps,
        "cases": cases,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1)
    size = folder_bytes(args.out)
    print(
        f"pack: wrote {args.out} ({len(cases)} cases, {size / 2**20:.1f} MiB, "
        f"{time.time() - t0:.0f} s); the device tool carries at most 64 MiB"
    )
    return 0 if size < 60 * 2**20 else 1


if __name__ == "__main__":
    sys.exit(main())
