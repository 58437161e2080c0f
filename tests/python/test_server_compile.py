"""fxdp-server's CompileService (proto/fxdp/v1/compile.proto), end to end.

Starts the real server ($FXDP_SERVER_BIN, default build/bin/fxdp-server) on an ephemeral port and
drives it with the generated Python stubs and with the CLI ($FXDP_BIN, default build/bin/fxdp,
`--server HOST:PORT`): answers equal the local `fxdp analyze|expand` byte for byte, a repeated
request comes from the cache, bad requests are INVALID_ARGUMENT naming what is wrong, concurrent
clients get correct answers, health checking says SERVING and garbage does not kill the server.
The tests fail, they do not skip, when a binary is missing.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import pathlib
import re
import signal
import subprocess

import grpc
import pytest
from _util import INCONSISTENT, fxdp_binary, traced
from fxdp.v1 import compile_pb2 as cpb
from fxdp.v1 import compile_pb2_grpc as cgrpc
from fxdp.v1 import graph_pb2 as gpb

MAX_MSG = 1 << 30


def cli_report(stdout: str) -> dict:
    """`fxdp expand --json`'s report without "files" (what the CLI wrote; the server writes none)."""
    report = json.loads(stdout)
    report.pop("files")
    return report


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [fxdp_binary("FXDP_BIN", "fxdp"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen(
        [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
    assert m, f"fxdp-server printed {line!r}; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
    yield proc, m.group(1)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("fxdp-server did not exit on SIGTERM")


@pytest.fixture(scope="module")
def channel(server):
    ch = grpc.insecure_channel(
        server[1],
        options=[
            ("grpc.max_send_message_length", MAX_MSG),
            ("grpc.max_receive_message_length", MAX_MSG),
        ],
    )
    yield ch
    ch.close()


@pytest.fixture(scope="module")
def stub(channel):
    return cgrpc.CompileServiceStub(channel)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    d = tmp_path_factory.mktemp("zoo")
    out = {}
    for m, o in [("mlp", "adam"), ("transformer", "adamw")]:
        p = d / f"{m}_{o}.pb"
        traced(m, o).save(str(p))
        out[m] = p
    return out


def graph_def(path) -> "gpb.GraphDef":
    g = gpb.GraphDef()
    g.ParseFromString(pathlib.Path(path).read_bytes())
    return g


def local_json(path, world) -> dict:
    p = cli("analyze", path, "--world-size", world, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


# --------------------------------------------------------------------------- Analyze


@pytest.mark.parametrize("model", ["mlp", "transformer"])
def test_analyze_equals_local(stub, graphs, model):
    path = graphs[model]
    want = local_json(path, 2)
    r = stub.Analyze(cpb.AnalyzeRequest(graph=graph_def(path), world_size=2, include_json=True))
    assert json.loads(r.json) == want
    assert r.world_size == 2 and r.batch_size == want["batch_size"]
    assert [(n.name, n.target, n.placement, n.reason) for n in r.nodes] == [
        (n["name"], n["target"], n["placement"], n["reason"]) for n in want["nodes"]
    ]
    assert [n.batch_dim for n in r.nodes] == [
        -1 if n["batch_dim"] is None else n["batch_dim"] for n in want["nodes"]
    ]
    assert [(x.value, x.output, x.op, x.first_use, x.grad_of) for x in r.reductions] == [
        (x["value"], x["output"], x["op"], x["first_use"], x["grad_of"]) for x in want["reductions"]
    ]
    assert list(r.warnings) == want["warnings"] and list(r.notes) == want["notes"]


def test_analyze_cli_matches_local(server, graphs):
    path = graphs["transformer"]
    for extra in ([], ["--json"]):
        local = cli("analyze", path, "--world-size", 4, *extra)
        remote = cli("analyze", path, "--world-size", 4, "--server", server[1], *extra)
        assert local.returncode == 0 and remote.returncode == 0, remote.stderr
        assert remote.stdout == local.stdout


def test_second_request_is_cached(stub, graphs):
    req = cpb.AnalyzeRequest(graph=graph_def(graphs["mlp"]), world_size=3)
    first = stub.Analyze(req)
    second = stub.Analyze(req)
    assert not first.cached and second.cached
    second.cached = False
    assert second == first
    # Different options are a different submission.
    assert not stub.Analyze(cpb.AnalyzeRequest(graph=req.graph, world_size=5)).cached


def test_cached_bytes_equal_uncached_bytes(channel, graphs):
    # The server keeps a hit as the serialized response: the bytes are those of the computed
    # answer plus `cached = true` (AnalyzeResponse field 9: b"\x48\x01"; ExpandResponse field 5,
    # serialized before its fields 6 to 8, so the tag sits before `memory`, field 8: b"\x42").
    g = graph_def(graphs["mlp"])
    for method, req, resp, tag in (
        (
            "/fxdp.v1.CompileService/Analyze",
            cpb.AnalyzeRequest(graph=g, world_size=11),
            cpb.AnalyzeResponse,
            b"\x48\x01",
        ),
        (
            "/fxdp.v1.CompileService/Expand",
            cpb.ExpandRequest(graph=g, world_size=11),
            cpb.ExpandResponse,
            b"\x28\x01",
        ),
    ):
        call = channel.unary_unary(method)
        first = call(req.SerializeToString(), timeout=30)
        second = call(req.SerializeToString(), timeout=30)
        parsed = resp.FromString(first)
        parsed.cached = True
        assert second == parsed.SerializeToString() and len(second) == len(first) + len(tag)
        assert tag in second and tag not in first
        assert call(req.SerializeToString(), timeout=30) == second


def test_non_canonical_encoding_is_the_same_submission(channel, stub, graphs):
    # The cache keys on the received bytes; a request encoded differently (fields out of order)
    # falls back to the canonical key: same answer, and a hit.
    g = graph_def(graphs["mlp"])
    req = cpb.AnalyzeRequest(graph=g, world_size=13)
    want = stub.Analyze(req)
    assert not want.cached
    reordered = (
        cpb.AnalyzeRequest(world_size=13).SerializeToString()
        + cpb.AnalyzeRequest(graph=g).SerializeToString()
    )
    assert reordered != req.SerializeToString()
    got = cpb.AnalyzeResponse.FromString(
        channel.unary_unary("/fxdp.v1.CompileService/Analyze")(reordered, timeout=30)
    )
    assert got.cached
    got.cached = False
    assert got == want
    # Computed first in the odd encoding, then asked canonically: also one computation.
    reordered = (
        cpb.AnalyzeRequest(world_size=14).SerializeToString()
        + cpb.AnalyzeRequest(graph=g).SerializeToString()
    )
    first = cpb.AnalyzeResponse.FromString(
        channel.unary_unary("/fxdp.v1.CompileService/Analyze")(reordered, timeout=30)
    )
    assert not first.cached
    assert stub.Analyze(cpb.AnalyzeRequest(graph=g, world_size=14)).cached


def test_empty_request_is_invalid_argument(channel):
    for method in ("/fxdp.v1.CompileService/Analyze", "/fxdp.v1.CompileService/Expand"):
        with pytest.raises(grpc.RpcError) as e:
            channel.unary_unary(method)(b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "world_size" in e.value.details()


def test_concurrent_cache_hits(server, graphs):
    # Many clients hitting the same cached entries at once get identical answers.
    g = graph_def(graphs["transformer"])
    reqs = {w: cpb.AnalyzeRequest(graph=g, world_size=w) for w in (2, 4)}
    ch = grpc.insecure_channel(server[1])
    try:
        want = {w: cgrpc.CompileServiceStub(ch).Analyze(r, timeout=30) for w, r in reqs.items()}
    finally:
        ch.close()
    for w in want:
        want[w].cached = True

    def one(i):
        w = (2, 4)[i % 2]
        c = grpc.insecure_channel(server[1])
        try:
            s = cgrpc.CompileServiceStub(c)
            return [(w, s.Analyze(reqs[w], timeout=30)) for _ in range(5)]
        finally:
            c.close()

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        for rs in ex.map(one, range(16)):
            for w, r in rs:
                assert r == want[w]


# --------------------------------------------------------------------------- Expand


@pytest.mark.parametrize("world", [2, 3])
def test_expand_equals_local(stub, server, graphs, tmp_path, world):
    path = graphs["mlp"]
    local_out = tmp_path / "local.pb"
    p = cli("expand", path, "--world-size", world, "-o", local_out, "--json")
    assert p.returncode == 0, p.stderr
    r = stub.Expand(cpb.ExpandRequest(graph=graph_def(path), world_size=world))
    report = json.loads(p.stdout)
    files = report.pop("files")  # what the CLI wrote: the server writes none
    assert json.loads(r.report_json) == report
    assert r.identical == (report["batch_size"] % world == 0)
    if r.identical:
        assert len(r.graphs) == 1
        local = [local_out.read_bytes()]
        assert files == [{"path": str(local_out), "ranks": list(range(world))}]
    else:
        assert len(r.graphs) == world
        local = [(tmp_path / f"local.rank{i}.pb").read_bytes() for i in range(world)]
        assert files == [
            {"path": str(tmp_path / f"local.rank{i}.pb"), "ranks": [i]} for i in range(world)
        ]
    assert [g.SerializeToString() for g in r.graphs] == local
    # The CLI through the server writes the same files and prints the same report.
    remote_out = tmp_path / "remote.pb"
    q = cli(
        "expand", path, "--world-size", world, "-o", remote_out, "--json", "--server", server[1]
    )
    assert q.returncode == 0, q.stderr
    assert q.stdout == p.stdout.replace(
        str(local_out.with_suffix("")), str(remote_out.with_suffix(""))
    )
    names = ["remote.pb"] if r.identical else [f"remote.rank{i}.pb" for i in range(world)]
    assert [f["path"] for f in json.loads(q.stdout)["files"]] == [str(tmp_path / n) for n in names]
    assert [(tmp_path / n).read_bytes() for n in names] == local
    # The expanded graphs decode and verify.
    for n in names:
        c = cli("graph", "check", tmp_path / n)
        assert c.returncode == 0, c.stderr
    # The same submission again is cached.
    again = stub.Expand(cpb.ExpandRequest(graph=graph_def(path), world_size=world))
    assert again.cached and list(again.graphs) == list(r.graphs)


def test_expand_options(stub, graphs, tmp_path):
    path = graphs["transformer"]
    p = cli(
        "expand",
        path,
        "--world-size",
        2,
        "-o",
        tmp_path / "x.pb",
        "--json",
        "--bucket-mb",
        "0.01",
        "--first-bucket-mb",
        "0.001",
        "--group",
        "dp",
    )
    assert p.returncode == 0, p.stderr
    r = stub.Expand(
        cpb.ExpandRequest(
            graph=graph_def(path),
            world_size=2,
            bucket_cap_mb=0.01,
            first_bucket_mb=0.001,
            group_name="dp",
        )
    )
    assert json.loads(r.report_json) == cli_report(p.stdout)
    assert r.graphs[0].SerializeToString() == (tmp_path / "x.pb").read_bytes()
    # The last-bucket split and the overlap schedule: same options, same graphs, local or remote.
    q = cli(
        "expand",
        path,
        "--world-size",
        2,
        "-o",
        tmp_path / "y.pb",
        "--json",
        "--bucket-mb",
        "0.1",
        "--last-bucket-mb",
        "0.001",
        "--no-overlap",
    )
    assert q.returncode == 0, q.stderr
    s = stub.Expand(
        cpb.ExpandRequest(
            graph=graph_def(path),
            world_size=2,
            bucket_cap_mb=0.1,
            last_bucket_mb=0.001,
            no_overlap_schedule=True,
        )
    )
    assert json.loads(s.report_json) == cli_report(q.stdout)
    assert s.graphs[0].SerializeToString() == (tmp_path / "y.pb").read_bytes()
    split = len(json.loads(q.stdout)["buckets"])
    whole = stub.Expand(
        cpb.ExpandRequest(
            graph=graph_def(path),
            world_size=2,
            bucket_cap_mb=0.1,
            last_bucket_mb=0,
            no_overlap_schedule=True,
        )
    )
    assert len(json.loads(whole.report_json)["buckets"]) < split
    overlap = stub.Expand(
        cpb.ExpandRequest(
            graph=graph_def(path), world_size=2, bucket_cap_mb=0.1, last_bucket_mb=0.001
        )
    )
    # the schedule moves nodes (and the report's positions), not the buckets
    assert json.loads(overlap.report_json)["buckets"] == json.loads(s.report_json)["buckets"]
    assert overlap.graphs[0] != s.graphs[0]
    bad = cli("expand", path, "--world-size", 2, "-o", tmp_path / "z.pb", "--last-bucket-mb", "-1")
    assert bad.returncode == 2 and "--last-bucket-mb" in bad.stderr


def test_expand_style_replicate_is_the_default(stub, graphs, tmp_path):
    """--style replicate / DATA_PARALLEL_STYLE_REPLICATE is what a request without a style gets,
    byte for byte; the response says the style and lists no sharded state."""
    path = graphs["mlp"]
    plain = stub.Expand(cpb.ExpandRequest(graph=graph_def(path), world_size=2))
    styled = stub.Expand(
        cpb.ExpandRequest(
            graph=graph_def(path), world_size=2, style=cpb.DATA_PARALLEL_STYLE_REPLICATE
        )
    )
    assert styled.style == plain.style == cpb.DATA_PARALLEL_STYLE_REPLICATE
    assert list(styled.graphs) == list(plain.graphs) and not styled.sharded_state
    assert json.loads(styled.report_json)["style"] == "replicate"
    p = cli(
        "expand", path, "--world-size", 2, "-o", tmp_path / "x.pb", "--style", "replicate", "--json"
    )
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "x.pb").read_bytes() == plain.graphs[0].SerializeToString()


def test_unknown_style_names_the_accepted_ones(server, stub, graphs, tmp_path):
    path = graphs["mlp"]
    with pytest.raises(grpc.RpcError) as e:
        stub.Expand(cpb.ExpandRequest(graph=graph_def(path), world_size=2, style=7))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "ExpandRequest.style: unknown data-parallel style 7; accepted: 0 (DATA_PARALLEL_STYLE_REPLICATE"
        in e.value.details()
        and "1 (DATA_PARALLEL_STYLE_FULLY_SHARD)" in e.value.details()
    )
    for extra in ([], ["--server", server[1]]):
        p = cli(
            "expand", path, "--world-size", 2, "-o", tmp_path / "x.pb", "--style", "zero3", *extra
        )
        assert p.returncode == 2
        assert (
            "--style: unknown data-parallel style 'zero3': expected 'replicate' or 'fully_shard'"
            in p.stderr
        )


# --------------------------------------------------------------------------- errors


def malformed(path) -> "gpb.GraphDef":
    g = graph_def(path)
    g.nodes[5].name = g.nodes[4].name  # two nodes with one name
    return g


def test_malformed_graph_is_invalid_argument_naming_the_node(stub, server, graphs, tmp_path):
    g = malformed(graphs["mlp"])
    bad = g.nodes[5].name
    for call in (
        lambda: stub.Analyze(cpb.AnalyzeRequest(graph=g, world_size=2)),
        lambda: stub.Expand(cpb.ExpandRequest(graph=g, world_size=2)),
    ):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert bad in e.value.details()
    # The CLI reports it like the local command (exit 1).
    f = tmp_path / "bad.pb"
    f.write_bytes(g.SerializeToString())
    local = cli("analyze", f)
    remote = cli("analyze", f, "--server", server[1])
    assert local.returncode == remote.returncode == 1
    assert bad in remote.stderr


def test_expand_refuses_a_graph_that_cannot_run(stub, tmp_path):
    """Expand's shape check of the rank graphs (expansion/shape_check.h): a deliberately
    inconsistent graph is INVALID_ARGUMENT naming rank, node and shapes, not a worker crash."""
    (tmp_path / "g.txt").write_text(INCONSISTENT)
    r = cli("graph", "parse", tmp_path / "g.txt", tmp_path / "g.pb")
    assert r.returncode == 0, r.stderr
    g = graph_def(tmp_path / "g.pb")
    with pytest.raises(grpc.RpcError) as e:
        stub.Expand(cpb.ExpandRequest(graph=g, world_size=2))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (
        "node 'ge' (aten::embedding_dense_backward): grad_output [2, 5, 3] does not match"
        in e.value.details()
    )


@pytest.mark.parametrize("world", [0, -1])
def test_bad_world_size(stub, graphs, world):
    g = graph_def(graphs["mlp"])
    for call in (
        lambda: stub.Analyze(cpb.AnalyzeRequest(graph=g, world_size=world)),
        lambda: stub.Expand(cpb.ExpandRequest(graph=g, world_size=world)),
    ):
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "world_size" in e.value.details()


def test_missing_graph_and_bad_buckets(stub, graphs):
    with pytest.raises(grpc.RpcError) as e:
        stub.Analyze(cpb.AnalyzeRequest(world_size=2))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no graph" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        stub.Expand(
            cpb.ExpandRequest(graph=graph_def(graphs["mlp"]), world_size=2, bucket_cap_mb=-1)
        )
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_unreachable_server_exit_code(graphs):
    p = cli("analyze", graphs["mlp"], "--server", "127.0.0.1:1")
    assert p.returncode == 3 and "127.0.0.1:1" in p.stderr


# --------------------------------------------------------------------------- robustness


def test_concurrent_clients(server, graphs):
    path = graphs["transformer"]
    wants = {w: local_json(path, w) for w in (1, 2, 4, 8)}
    g = graph_def(path)

    def one(i):
        w = (1, 2, 4, 8)[i % 4]
        ch = grpc.insecure_channel(server[1])
        try:
            r = cgrpc.CompileServiceStub(ch).Analyze(
                cpb.AnalyzeRequest(graph=g, world_size=w, include_json=True), timeout=30
            )
            return w, json.loads(r.json)
        finally:
            ch.close()

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        results = list(ex.map(one, range(8)))
    for w, got in results:
        assert got == wants[w]


def health(channel, service: str = "") -> int:
    # grpc.health.v1.Health/Check by hand (grpcio-health-checking is not installed):
    # HealthCheckRequest{service = 1}; HealthCheckResponse{status = 1}, SERVING = 1.
    req = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
    resp = channel.unary_unary("/grpc.health.v1.Health/Check")(req, timeout=10)
    assert resp[:1] in (b"", b"\x08")
    return resp[1] if resp else 0


def test_health_serving(channel):
    assert health(channel) == 1
    assert health(channel, "fxdp.v1.CompileService") == 1


def test_reflection_lists_the_service(channel):
    # grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo, list_services = 7 ("").
    call = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    resp = b"".join(call(iter([b"\x3a\x00"]), timeout=10))
    assert b"fxdp.v1.CompileService" in resp


def test_survives_garbage(server, channel, stub, graphs):
    for method in ("/fxdp.v1.CompileService/Analyze", "/fxdp.v1.CompileService/Expand"):
        for junk in (
            b"\xff\xff\xff\xff",
            b"\x0a\x05abc",
            os.urandom(4096),
            b"\x0a\x80\x80\x80\x80\x10",
        ):
            with pytest.raises(grpc.RpcError) as e:
                channel.unary_unary(method)(junk, timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, junk[:16], e.value)
    with pytest.raises(grpc.RpcError) as e:
        channel.unary_unary("/fxdp.v1.CompileService/Nope")(b"", timeout=10)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # A GraphDef-shaped message of random nodes.
    g = gpb.GraphDef()
    g.nodes.add(name="x")
    with pytest.raises(grpc.RpcError) as e:
        stub.Analyze(cpb.AnalyzeRequest(graph=g, world_size=2))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert server[0].poll() is None
    assert stub.Analyze(cpb.AnalyzeRequest(graph=graph_def(graphs["mlp"]), world_size=2)).nodes


def test_sigterm_shuts_down_cleanly():
    proc = subprocess.Popen(
        [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().startswith("listening on 127.0.0.1:")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_server_usage():
    p = subprocess.run(
        [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--bogus"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert p.returncode == 2 and "unknown argument" in p.stderr
    p = subprocess.run(
        [
            fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"),
            "--local-workers",
            "2",
            "--worker-binary",
            "/nonexistent/fxdp-worker",
        ],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert (
        p.returncode == 2 and "no executable fxdp-worker at '/nonexistent/fxdp-worker'" in p.stderr
    )
    p = subprocess.run(
        [fxdp_binary("FXDP_SERVER_BIN", "fxdp-server"), "--local-workers", "-1"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert (
        p.returncode == 2 and "--local-workers needs an integer in [0, 256], got '-1'" in p.stderr
    )
