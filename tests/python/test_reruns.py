"""Reruns with more than one intra-op thread are bit-identical (issue 24, docs/randomness.md
"Hunting the rerun difference"): the two causes found, each made deterministic by an LD_PRELOAD
stand-in compiled here, so the tests do not wait for a rare interleaving or a loaded machine.

* MKL's vector math (VML) caches the CPU type it detects on its first call without a lock,
  storing the raw type before the mapped one; a thread calling VML in that window runs other
  kernels (tanh off by up to 1342 ulp). The stand-in widens the window: the first caller holds it
  open until another thread has read the raw type (or 1 s passed).
* libgomp under OMP_DYNAMIC=true sizes each team by the load average (a getloadavg stand-in).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import fxdp
import pytest
import torch
import torch.nn.functional as F
from _util import fxdp_binary
from safetensors.torch import load_file, save_file

VML_RACE_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
/* mkl_vml_serv_cpu_detect as MKL 2024.2 does it (one static, no lock: the raw CPU type stored
   first, the mapped one after), with the window between the two stores held open until another
   thread has read the raw type or 1 s passed. VML_RACE_LOG: 'claimed' by the first caller,
   'raced' by a thread that read the raw type. */
static volatile int type = -1, raw_type = -1, claimed = 0, raced = 0;
static void note(const char* what) {
  const char* path = getenv("VML_RACE_LOG");
  FILE* f = path ? fopen(path, "a") : NULL;
  if (f) { fprintf(f, "%s\n", what); fclose(f); }
}
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
int mkl_vml_serv_cpu_detect(void) {
  int t;
  if (__atomic_load_n(&type, __ATOMIC_ACQUIRE) == -1 &&
      __atomic_exchange_n(&claimed, 1, __ATOMIC_ACQ_REL) == 0) {
    void* torch = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    int (*raw)(void) = (int (*)(void))dlsym(torch, "mkl_serv_vml_cpu_detect");
    int (*mapped)(void) = (int (*)(void))dlsym(torch, "mkl_vml_serv_cpu_detect");
    const int r = raw(), m = mapped();
    note("claimed");
    if (r != m) {
      __atomic_store_n(&raw_type, r, __ATOMIC_RELEASE);
      __atomic_store_n(&type, r, __ATOMIC_RELEASE);
      for (double end = now() + 1.0; now() < end && !__atomic_load_n(&raced, __ATOMIC_ACQUIRE);) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
      }
    }
    __atomic_store_n(&type, m, __ATOMIC_RELEASE);
    return m;
  }
  while ((t = __atomic_load_n(&type, __ATOMIC_ACQUIRE)) == -1) {}
  if (t == __atomic_load_n(&raw_type, __ATOMIC_ACQUIRE) &&
      __atomic_exchange_n(&raced, 1, __ATOMIC_ACQ_REL) == 0)
    note("raced");
  return t;
}
"""

LOADAVG_SHIM = r"""
#include <stdlib.h>
int getloadavg(double l[], int n) {  /* the load average FAKE_LOADAVG says */
  const char* v = getenv("FAKE_LOADAVG");
  for (int i = 0; i < n; ++i) l[i] = v ? atof(v) : 0.0;
  return n;
}
"""


def compile_shim(d, name: str, source: str) -> str:
    """`source` compiled into d/name.so (skips without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"no C compiler for the {name} stand-in")
    (d / f"{name}.c").write_text(source)
    out = d / f"{name}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", out, d / f"{name}.c", "-ldl"], check=True)
    return str(out)


class TanhMLP(torch.nn.Module):
    """tanh of 64 x 128 = 8192 floats: ATen gives each of 2 threads 4096 (grain 2048), each
    thread calls MKL's vsTanh, and it is the first VML op of the process."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 128), torch.nn.Linear(128, 4)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def tanh_step(d):
    """The TanhMLP's SGD step saved in `d` (g.pb, s.safetensors, b.safetensors) and its batch."""
    torch.manual_seed(0)
    model = TanhMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(64, 16, generator=g) * 3, torch.randn(64, 4, generator=g))
    step = fxdp.trace(model, opt, F.mse_loss, batch, input_names=("x", "y"))
    step.save(str(d / "g.pb"))
    step.to_safetensors(str(d / "s.safetensors"))
    save_file({"x": batch[0], "y": batch[1]}, str(d / "b.safetensors"))
    return step, batch


def raced(log) -> bool:
    """Whether the stand-in ran (else skips: this torch's MKL has no such detection) and a thread
    read the raw CPU type."""
    if not os.path.exists(log):
        pytest.skip("MKL's mkl_vml_serv_cpu_detect was not called (not the MKL of torch 2.13)")
    lines = open(log).read().split()
    os.remove(log)
    return "raced" in lines


def test_worker_reruns_survive_mkls_vml_detection_race(tmp_path):
    """fxdp-worker at --threads 2 with VML's detection window held open equals it without: the
    executor makes the first VML call on one thread before any step (executor/kernel_init.h).
    Before: the second thread read the raw type and its half of the tanh differed."""
    tanh_step(tmp_path)
    shim = compile_shim(tmp_path, "vml_race", VML_RACE_SHIM)
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    finals, log = [], tmp_path / "race.log"
    for preload in ("", shim):
        out = tmp_path / f"out{len(finals)}.st"
        args = [worker, "run", "--graph", str(tmp_path / "g.pb"), "--state"]
        args += [str(tmp_path / "s.safetensors"), "--steps", "1", "--threads", "2"]
        args += ["--out", str(out), "--data", str(tmp_path / "b.safetensors")]
        env = {**os.environ, "LD_PRELOAD": preload, "VML_RACE_LOG": str(log)}
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        finals.append(load_file(str(out)))
    assert not raced(log), "a step's thread read VML's raw CPU type"
    differ = [k for k in finals[0] if not torch.equal(finals[0][k], finals[1][k])]
    assert not differ, f"{len(differ)} tensors differ with the race's window open: {differ}"


RUN_LOCAL = """
import sys, fxdp, torch
from safetensors.torch import load_file, save_file
torch.set_num_threads(2)
step = fxdp.load(sys.argv[1] + "/g.pb", state=sys.argv[1] + "/s.safetensors")
b = load_file(sys.argv[1] + "/b.safetensors")
state, loss = step.run_local(step.initial_state(), (b["x"], b["y"]))
save_file(dict(state), sys.argv[2])
"""


def test_run_local_survives_mkls_vml_detection_race(tmp_path):
    """TracedStep.run_local in a fresh process on 2 threads, with VML's detection window held open,
    equals run_local here: it makes the first VML call itself (fxdp/traced.py). Before: differed."""
    step, batch = tanh_step(tmp_path)
    want, _ = step.run_local(step.initial_state(), batch)
    shim = compile_shim(tmp_path, "vml_race", VML_RACE_SHIM)
    log, out = tmp_path / "race.log", tmp_path / "local.st"
    env = {**os.environ, "LD_PRELOAD": shim, "VML_RACE_LOG": str(log)}
    r = subprocess.run(
        [sys.executable, "-c", RUN_LOCAL, str(tmp_path), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert not raced(log), "run_local's thread read VML's raw CPU type"
    got = load_file(str(out))
    differ = [k for k in want if not torch.equal(want[k], got[k])]
    assert not differ, f"{len(differ)} tensors differ with the race's window open: {differ}"


def test_reruns_do_not_follow_the_load_average_under_omp_dynamic(tmp_path):
    """With OMP_DYNAMIC=true libgomp sizes each OpenMP team as the cores minus the 15-minute load
    average, and native_layer_norm_backward's weight gradient follows the team size: the worker
    switches the adjustment off, so runs at load 0 and load 20 (a getloadavg stand-in) are
    bit-identical (before: the --threads 2 and the --threads 1 results)."""
    from test_randomness import batches, save, traced

    shim = compile_shim(tmp_path, "loadavg", LOADAVG_SHIM)
    step = traced("gpt2", "sgd")
    paths = save(step, batches("gpt2"), tmp_path)
    worker = fxdp_binary("FXDP_WORKER", "fxdp-worker")
    finals = []
    for load in ("0", "20"):
        out = tmp_path / f"load{load}.st"
        args = [worker, "run", "--graph", str(tmp_path / "g.pb"), "--state"]
        args += [str(tmp_path / "s.safetensors"), "--steps", "2", "--threads", "2"]
        args += ["--out", str(out), "--data", paths[0], "--data", paths[1]]
        env = {**os.environ, "OMP_DYNAMIC": "true", "LD_PRELOAD": shim, "FAKE_LOADAVG": load}
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        finals.append(load_file(str(out)))
    differ = [k for k in finals[0] if not torch.equal(finals[0][k], finals[1][k])]
    assert not differ, f"{len(differ)} tensors differ between load 0 and 20: {differ[:4]}"
