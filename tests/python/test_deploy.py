"""deploy/: lint the systemd units, Dockerfiles, Kubernetes manifests and Slurm script with
real validators (systemd-analyze, hadolint, kubernetes-validate, yamllint, shellcheck; the
Python-packaged ones are installed into .venv by scripts/setup.sh)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
VENV_BIN = Path(sys.executable).parent


def tool(name):
    path = VENV_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    assert found, f"{name} not found: scripts/setup.sh installs it into .venv"
    return found


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def test_systemd_units_verify(tmp_path):
    sa = shutil.which("systemd-analyze")
    if sa is None:
        pytest.skip("systemd-analyze not installed (Debian package 'systemd'); units not verified")
    bindir = ROOT / "build" / "bin"
    if not (bindir / "fxdp-server").exists() or not (bindir / "fxdp-worker").exists():
        pytest.skip("build/bin/fxdp-server and fxdp-worker not built: verify checks ExecStart")
    # verify requires the ExecStart binaries to exist: point /opt/fxdp/build/bin at build/bin.
    for unit in ("fxdp-server.service", "fxdp-worker@.service"):
        text = (DEPLOY / "systemd" / unit).read_text()
        assert "/opt/fxdp/build/bin/" in text
        (tmp_path / unit).write_text(text.replace("/opt/fxdp/build/bin", str(bindir)))
    r = run(
        [sa, "verify", "--man=no", "./fxdp-server.service", "./fxdp-worker@0.service"],
        cwd=tmp_path,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
    )
    # Unknown keys and bad values are only warnings (exit 0): any output is a failure.
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def test_systemd_worker_unit_contract():
    text = (DEPLOY / "systemd" / "fxdp-worker@.service").read_text()
    assert "--device cuda:%i" in text and "Restart=on-failure" in text
    assert "EnvironmentFile=" in text and "NoNewPrivileges=yes" in text
    # TLS and the join token come as systemd credentials.
    assert (
        "LoadCredential=worker.token:" in text
        and "--tls-ca %d/ca.pem --token-file %d/worker.token" in text
    )
    server = (DEPLOY / "systemd" / "fxdp-server.service").read_text()
    assert "LoadCredential=server.key:" in server and "--tls-cert %d/server.pem" in server


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.cuda"])
def test_dockerfiles_hadolint(dockerfile):
    r = run([tool("hadolint"), "--no-color", str(DEPLOY / "docker" / dockerfile)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_k8s_manifests_validate():
    files = [str(DEPLOY / "k8s" / f) for f in ("server.yaml", "workers.yaml")]
    r = run([tool("kubernetes-validate"), "--strict", "--quiet", *files])
    assert r.returncode == 0, r.stdout + r.stderr
    text = (DEPLOY / "k8s" / "server.yaml").read_text()
    assert "grpc:\n              port: 50052" in text and '--health-listen", "0.0.0.0:50052' in text
    assert "--tls-cert" in text and "secretName: fxdp-tls" in text
    workers = (DEPLOY / "k8s" / "workers.yaml").read_text()
    assert "nvidia.com/gpu: 1" in workers
    assert "- --token-file\n            - /etc/fxdp/workers/worker-token" in workers
    # Workers read jobs' data_paths only under --data-root (none: none): the manifest passes the
    # mounted dataset volume.
    assert "- --data-root\n            - /data" in workers
    assert "mountPath: /data" in workers and "readOnly: true" in workers


def test_k8s_yamllint():
    config = "{extends: default, rules: {line-length: {max: 110}, document-start: disable}}"
    r = run([tool("yamllint"), "--strict", "-d", config, str(DEPLOY / "k8s")])
    assert r.returncode == 0, r.stdout + r.stderr


def test_slurm_script_shellcheck():
    script = DEPLOY / "slurm" / "fxdp-workers.sbatch"
    r = run([tool("shellcheck"), "-s", "bash", str(script)])
    assert r.returncode == 0, r.stdout + r.stderr
    text = script.read_text()
    assert "--gpus-per-task=1" in text and "cuda:$SLURM_LOCALID" in text
    assert '--data-root "$2"' in text and '"$FXDP_DATA_ROOT"' in text
