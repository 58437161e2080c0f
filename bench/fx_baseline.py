"""The Python baseline for fxdp's graph pipeline: the same work over torch.fx.

fxdp decodes a serialized training step into its C++ IR (and verifies it), follows the batch
dim through every node (view ops by DTensor's DimSpec maps, ported to C++) and rewrites the
graph for N ranks with bucketed gradient all-reduces (bench/pipeline_bench.cc times exactly
that). This script does the same kind of work the way one would in Python with torch's own
machinery, on the same file:

  decode   ``GraphDef.ParseFromString`` (protobuf's upb backend), then a ``torch.fx.Graph``
           built node by node (targets resolved to ``torch.ops`` overloads once per distinct
           op, every value's shape/stride/dtype kept in ``node.meta``), then
           ``Graph.lint()`` (the verifier's counterpart)
  analyze  every node's batch dim / placement, in graph order: view ops through DTensor's
           rules (``torch.distributed.tensor._ops._view_ops``: ``view_groups`` and the
           ``dim_maps`` of view/reshape/_unsafe_view/expand/permute/transpose/t/unsqueeze/
           squeeze), walked the way DTensor's ``propagate_shape_and_sharding`` keeps a
           ``Shard`` (an input dim, the first of a flatten, split piece 0); simple rules for
           the rest (pointwise with broadcasting and linearity, mm/addmm/bmm, sums,
           softmax, layer norm, embedding, nll loss, select, factories); partial values
           (P(sum)/P(avg), mean-scaled batch values) and the first non-linear use of each
  expand   the rank graph, in place: local shapes for every batch-sharded value, size
           arguments rewritten (view/_unsafe_view/reshape/expand/select_backward, factories),
           gradients packed into DDP's buckets (1 MiB first, then 25 MiB, in production
           order), each bucket flattened + cat + scaled + ``_c10d_functional.all_reduce``
           inserted after its last gradient and ``wait_tensor`` + slices + views before the
           first use, the uses redirected; the global loss all-reduced and the local loss
           added as an output; ``Graph.lint()`` again

The rank graphs of an even split are identical, so one graph is built (as fxdp does). The cyclic garbage collector is off while the pipeline runs (as
any bulk fx construction should do: fx nodes form reference cycles) and on between reps.

The analyze phase is bench/fx_baseline_analysis.py.

usage: .venv/bin/python bench/fx_baseline.py --graph G.pb [--reps 3] [--world-size 8]
           [--json OUT] [--check-dtensor]

Prints (or writes) the JSON fxdp_pipeline_bench writes: per rep and phase the wall and CPU
seconds, and the peak RSS of rep 1 (VmHWM, reset before it, minus VmRSS before it; a fresh
process: run it once per graph). ``--check-dtensor`` also checks, for every view node, that
the walk agrees with ``propagate_shape_and_sharding([Shard(d)], ...)`` itself.
"""

from __future__ import annotations

import argparse
import gc
import json
import operator
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "client" / "python"))

import torch  # noqa: E402
import torch.fx as fx  # noqa: E402
from fx_baseline_analysis import P_AVG, P_SUM, Analysis, R  # noqa: E402  (the analyze phase)
from fxdp.v1 import graph_pb2 as pb  # noqa: E402

aten = torch.ops.aten
FIRST_BUCKET_MB, BUCKET_MB = 1.0, 25.0
ITEMSIZE = {
    pb.FLOAT32: 4,
    pb.FLOAT64: 8,
    pb.FLOAT16: 2,
    pb.BFLOAT16: 2,
    pb.INT64: 8,
    pb.INT32: 4,
    pb.INT16: 2,
    pb.INT8: 1,
    pb.UINT8: 1,
    pb.BOOL: 1,
}


# --------------------------------------------------------------------------- memory


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return -1


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# --------------------------------------------------------------------------- decode


def _resolve(name: str, overload: str):
    if name == "operator.getitem":
        return operator.getitem, False
    ns, op = name.split("::", 1)
    fn = getattr(getattr(getattr(torch.ops, ns), op), overload or "default")
    rets = fn._schema.returns
    seq = len(rets) > 1 or (len(rets) == 1 and isinstance(rets[0].type, torch.ListType))
    return fn, seq


def _rare_argument(a, w):
    """decode's argument kinds past the common ones (a ref, an int, a list, a float, a bool, None,
    a string), so those pay no extra call."""
    if w == "scalar":
        s = a.scalar
        k = s.WhichOneof("value")
        return (
            complex(s.complex_value.real, s.complex_value.imag)
            if k == "complex_value"
            else getattr(s, k)
        )
    if w == "dtype":
        return ("dtype", a.dtype)
    if w == "device":
        return ("device", a.device.type, a.device.index)
    if w == "layout":
        return ("layout", a.layout)
    if w == "memory_format":
        return ("memory_format", a.memory_format)
    raise ValueError("empty argument")


def decode(data: bytes):
    """GraphDef bytes -> (fx.Graph, nodes in order, graph metadata). Tensor metadata per node:
    ``meta["tm"]``: a list (one per output) of (shape, stride, dtype) or None."""
    g = pb.GraphDef()
    g.ParseFromString(data)
    graph = fx.Graph()
    env: list = []
    seq: list = []
    extracted: dict = {}
    targets: dict = {}
    PH, CALL, OUT = pb.PLACEHOLDER, pb.CALL_FUNCTION, pb.OUTPUT
    TENSOR = pb.TENSOR

    def ref(r):
        i = r.node
        if not seq[i]:
            return env[i]
        key = (i, r.output)
        x = extracted.get(key)
        if x is None:
            x = extracted[key] = graph.call_function(operator.getitem, (env[i], r.output))
        return x

    def dec(a):
        w = a.WhichOneof("value")
        if w == "ref":
            return ref(a.ref)
        if w == "int_value":
            return a.int_value
        if w == "list":
            return [dec(x) for x in a.list.items]
        if w == "float_value":
            return a.float_value
        if w == "bool_value":
            return a.bool_value
        if w == "none":
            return None
        if w == "string_value":
            return a.string_value
        return _rare_argument(a, w)

    for n in g.nodes:
        kind = n.kind
        is_seq = False
        if kind == PH:
            node = graph.placeholder(n.name)
            ph = n.placeholder
            node.meta["ph"] = (ph.role, ph.state_name, ph.batch_dim)
        elif kind == CALL:
            t = n.target
            key = (t.name, t.overload)
            fs = targets.get(key)
            if fs is None:
                fs = targets[key] = _resolve(t.name, t.overload)
            fn, is_seq = fs
            if fn is operator.getitem:
                r = n.args[0].ref
                node = graph.create_node(
                    "call_function", operator.getitem, (env[r.node], r.output), None, n.name
                )
            else:
                args = tuple(dec(a) for a in n.args)
                kwargs = {kw.name: dec(kw.value) for kw in n.kwargs} if n.kwargs else None
                node = graph.create_node("call_function", fn, args, kwargs, n.name)
        elif kind == OUT:
            node = graph.output(dec(n.args[0]))
            node.meta["specs"] = [(s.role, s.state_name) for s in n.output_specs]
        else:
            raise ValueError(f"node {n.name}: unsupported kind {kind}")
        node.meta["tm"] = [
            (tuple(v.tensor.shape), tuple(v.tensor.stride), v.tensor.dtype)
            if v.kind == TENSOR
            else None
            for v in n.outputs
        ]
        if n.grad_of:
            node.meta["grad_of"] = n.grad_of
        env.append(node)
        seq.append(is_seq)
    graph.lint()
    return graph, env


# --------------------------------------------------------------------------- expansion

SIZE_ARG = {
    aten.view.default: 1,
    aten._unsafe_view.default: 1,
    aten.reshape.default: 1,
    aten.expand.default: 1,
    aten.select_backward.default: 1,
    aten.slice_backward.default: 1,
    aten.new_zeros.default: 1,
    aten.new_ones.default: 1,
    aten.new_empty.default: 1,
    aten.new_full.default: 1,
    aten.zeros.default: 0,
    aten.ones.default: 0,
    aten.empty.memory_format: 0,
    aten.full.default: 0,
}


def _contig(shape):
    st, run = [0] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        st[i] = run
        run *= max(shape[i], 1)
    return tuple(st)


def _local_shapes(an: Analysis, nodes, local_b: int) -> None:
    """Step 1: the local shapes and size arguments of batch-sharded values."""
    pl, batch = an.pl, an.batch
    for node in nodes:
        p = pl[node]
        tm = node.meta["tm"]
        if isinstance(p, list):
            ps = p
        else:
            if p is None or p < 0:
                continue
            ps = [p]
        for k, d in enumerate(ps):
            if d is None or d < 0 or k >= len(tm) or tm[k] is None:
                continue
            shape, stride, dtype = tm[k]
            new = list(shape)
            new[d] = shape[d] // batch * local_b
            new = tuple(new)
            tm[k] = (new, _contig(new) if stride == _contig(shape) else stride, dtype)
        si = SIZE_ARG.get(node.target, -1)
        d = ps[0]
        if si >= 0 and d >= 0 and si < len(node.args) and isinstance(node.args[si], list):
            sizes = list(node.args[si])
            if d < len(sizes) and sizes[d] != -1:
                if sizes[d] % batch:
                    raise ValueError(f"{node.name}: size {sizes[d]} is not a multiple of {batch}")
                sizes[d] = sizes[d] // batch * local_b
                args = list(node.args)
                args[si] = sizes
                node.args = tuple(args)


def _buckets(an: Analysis) -> list:
    """Step 2: buckets of gradients, in production order (DDP's caps)."""
    pos, reduced = an.pos, an.reduced
    grads = sorted((v for v in reduced if "grad_of" in v.meta), key=pos.__getitem__)
    buckets, cur = [], None
    for v in grads:
        op, use = reduced[v]
        produced, first_use = pos[v], pos[use]
        shape, _, dtype = v.meta["tm"][0]
        nbytes = ITEMSIZE.get(dtype, 4)
        for s in shape:
            nbytes *= s
        if cur is not None:
            cap = (FIRST_BUCKET_MB if not buckets else BUCKET_MB) * 1024 * 1024
            if (
                produced >= cur["wait"]
                or dtype != cur["dtype"]
                or op != cur["op"]
                or cur["bytes"] >= cap
            ):
                buckets.append(cur)
                cur = None
        if cur is None:
            cur = {
                "values": [],
                "bytes": 0,
                "op": op,
                "dtype": dtype,
                "start": produced,
                "wait": first_use,
            }
        cur["values"].append(v)
        cur["bytes"] += nbytes
        cur["start"] = max(cur["start"], produced)
        cur["wait"] = min(cur["wait"], first_use)
    if cur is not None:
        buckets.append(cur)
    return buckets


def _call(graph, target, args, name, shape, dtype):
    n = graph.create_node("call_function", target, args, None, name)
    n.meta["tm"] = [(shape, _contig(shape), dtype)]
    return n


def _numel(shape) -> int:
    numel = 1
    for s in shape:
        numel *= s
    return numel


def _bucket_collectives(graph, nodes, b: dict, world: int) -> None:
    """Step 3, one bucket: flatten, cat, scale and all_reduce after its last gradient; wait,
    slice and view before the first use, the uses redirected."""
    c10d = torch.ops._c10d_functional
    vals, dtype = b["values"], b["dtype"]
    with graph.inserting_before(nodes[b["start"]].next):
        flats = []
        total = 0
        for v in vals:
            numel = _numel(v.meta["tm"][0][0])
            flats.append(
                _call(
                    graph, aten.reshape.default, (v, [-1]), "fxdp_flat_" + v.name, (numel,), dtype
                )
            )
            total += numel
        x = (
            flats[0]
            if len(flats) == 1
            else _call(graph, aten.cat.default, (flats, 0), "fxdp_bucket", (total,), dtype)
        )
        if b["op"] == P_AVG:
            x = _call(graph, aten.mul.Scalar, (x, 1.0 / world), "fxdp_scale", (total,), dtype)
        ar = _call(
            graph, c10d.all_reduce.default, (x, "sum", "0"), "fxdp_all_reduce", (total,), dtype
        )
    keep = set(flats)
    with graph.inserting_before(nodes[b["wait"]]):
        w = _call(graph, c10d.wait_tensor.default, (ar,), "fxdp_wait_bucket", (total,), dtype)
        off = 0
        for v in vals:
            shape = v.meta["tm"][0][0]
            numel = _numel(shape)
            s = (
                w
                if len(vals) == 1
                else _call(
                    graph,
                    aten.slice.Tensor,
                    (w, 0, off, off + numel, 1),
                    "fxdp_unpack_" + v.name,
                    (numel,),
                    dtype,
                )
            )
            red = _call(
                graph, aten.view.default, (s, list(shape)), "fxdp_reduced_" + v.name, shape, dtype
            )
            v.replace_all_uses_with(red, delete_user_cb=lambda u: u not in keep)
            off += numel


def _global_loss(graph, out, pl, world: int) -> None:
    """Step 4: the global loss; the local one as an extra output."""
    c10d = torch.ops._c10d_functional
    specs = out.meta["specs"]
    outs = list(out.args[0])
    for k, (role, _) in enumerate(specs):
        if role != pb.LOSS or not isinstance(outs[k], fx.Node):
            continue
        loss = outs[k]
        p = pl.get(loss, R)
        if p < R:
            shape, _, dtype = loss.meta["tm"][0]
            with graph.inserting_before(out):
                x = (
                    loss
                    if p == P_SUM
                    else _call(
                        graph, aten.mul.Scalar, (loss, 1.0 / world), "fxdp_scale", shape, dtype
                    )
                )
                ar = _call(
                    graph, c10d.all_reduce.default, (x, "sum", "0"), "fxdp_all_reduce", shape, dtype
                )
                outs[k] = _call(graph, c10d.wait_tensor.default, (ar,), "fxdp_wait", shape, dtype)
        outs.append(loss)
        specs.append((pb.OTHER, "local_loss"))
    out.args = (outs,)


def expand(an: Analysis):
    graph, world, batch = an.graph, an.world, an.batch
    if batch % world:
        raise ValueError("the baseline builds one graph: the batch must split evenly")
    nodes = list(graph.nodes)
    _local_shapes(an, nodes, batch // world)
    buckets = _buckets(an)
    for b in buckets:
        _bucket_collectives(graph, nodes, b, world)
    _global_loss(graph, nodes[-1], an.pl, world)
    graph.lint()
    return buckets


# --------------------------------------------------------------------------- driver


def run_once(data: bytes, world: int, check: bool = False):
    times = []
    w0, c0 = time.perf_counter(), time.process_time()
    graph, nodes = decode(data)
    w1, c1 = time.perf_counter(), time.process_time()
    an = Analysis(graph, nodes, world, check).run()
    w2, c2 = time.perf_counter(), time.process_time()
    buckets = expand(an)
    w3, c3 = time.perf_counter(), time.process_time()
    times = [(w1 - w0, c1 - c0), (w2 - w1, c2 - c1), (w3 - w2, c3 - c2)]
    info = {
        "nodes": len(nodes),
        "expanded_nodes": len(graph.nodes),
        "buckets": len(buckets),
        "warnings": sum(w[0] for w in an.warnings.values()),
        "warning_ops": sorted(str(k) for k in an.warnings),
        "reductions": len(an.reduced),
        "view_checks": an.view_checks,
    }
    return times, info, (graph, nodes, an)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--graph", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--check-dtensor", action="store_true")
    args = ap.parse_args(argv)
    data = pathlib.Path(args.graph).read_bytes()
    hwm_reset = _reset_peak()
    rss_before = _status("VmRSS")
    phases = {k: ([], []) for k in ("decode", "analyze", "expand")}
    info, peak = None, -1
    for rep in range(args.reps):
        gc.disable()
        times, inf, keep = run_once(data, args.world_size, args.check_dtensor)
        if rep == 0:
            peak = _status("VmHWM") - rss_before
            info = inf
        for (k, (wl, cl)), (w, c) in zip(phases.items(), times):
            wl.append(round(w, 6))
            cl.append(round(c, 6))
        del keep
        gc.enable()
        gc.collect()
    out = {
        "impl": "torch.fx (Python)",
        "graph": args.graph,
        "nodes": info["nodes"],
        "wire_bytes": len(data),
        "world_size": args.world_size,
        "reps": args.reps,
        "expanded_nodes": info["expanded_nodes"],
        "buckets": info["buckets"],
        "reductions": info["reductions"],
        "warnings": info["warnings"],
        "warning_ops": info["warning_ops"],
        "view_checks": info["view_checks"],
        "peak_rss_bytes": peak,
        "peak_rss_method": (
            "VmHWM (reset before rep 1) - VmRSS before rep 1"
            if hwm_reset
            else "VmHWM - VmRSS before rep 1"
        ),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "threads": 1,
    }
    for k, (wl, cl) in phases.items():
        out[f"{k}_wall_s"] = wl
        out[f"{k}_cpu_s"] = cl
    text = json.dumps(out, indent=1)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
