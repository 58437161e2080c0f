"""RESULTS.md from `make bench`'s results (bench/run_all.py): one table per area, each fxdp
number next to its baseline, with the machine, commit and load average.

``render_markdown(results)`` turns results.json (run_all.py's) into the page; ``md_<area>(r)``
renders one area's section.
"""

from __future__ import annotations

import statistics

from md_numbers import bytes_str, f, mm, ratio
from results_llama import md_llama


def md_pipeline(r: dict) -> list:
    L = [
        "## 1. Graph decode + analysis + expansion",
        "",
        f"A synthetic transformer training step (GPT-2-small widths, batch 8; bench/synthetic_graph.h) "
        f"of ~10k/100k/1M nodes, serialized once; both sides read the same file and do, per "
        f"repetition, decode (+ verify), the batch-dim analysis and the data-parallel expansion "
        f"for world size {r['world_size']} (bucketed gradient all-reduces). fxdp: "
        f"`fxdp_pipeline_bench` (C++, one thread). Baseline: `bench/fx_baseline.py`, the same work "
        f"in Python over torch.fx with DTensor's view-op rules "
        f"(`torch.distributed.tensor._ops._view_ops`). CPU time per node (process CPU time, so "
        f"other load on the machine counts less), median (min-max) over repetitions; ratio = "
        f"fxdp / baseline (below 1.00x fxdp is faster). Peak memory: VmHWM minus VmRSS before "
        f"the first repetition, in a fresh process (the input bytes excluded).",
        "",
        "| nodes | phase | fxdp µs/node | torch.fx µs/node | ratio |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in r["sizes"]:
        a, b = row["fxdp_us_per_node"], row["torch_fx_us_per_node"]
        for ph, label in (
            ("decode", "decode + verify"),
            ("analyze", "batch-dim analysis"),
            ("expand", f"expansion (N={r['world_size']})"),
            ("total", "**total**"),
        ):
            L.append(
                f"| {row['nodes']:,} | {label} | {mm(a[ph])} | {mm(b[ph])} | "
                f"{ratio(a[ph]['median'], b[ph]['median'])} |"
            )
    L += [
        "",
        "| nodes | fxdp peak RSS | torch.fx peak RSS | ratio | fxdp reps | torch.fx reps | rank graph: fxdp / torch.fx |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in r["sizes"]:
        a, b = row["fxdp_us_per_node"], row["torch_fx_us_per_node"]
        fa, fb = a["peak_rss_kb_per_node"], b["peak_rss_kb_per_node"]
        L.append(
            f"| {row['nodes']:,} | {fa:.2f} KB/node ({row['fxdp']['peak_rss_bytes'] / 2**20:,.0f} MiB) | "
            f"{fb:.2f} KB/node ({row['torch_fx']['peak_rss_bytes'] / 2**20:,.0f} MiB) | {ratio(fa, fb)} | "
            f"{row['fxdp']['reps']} | {row['torch_fx']['reps']} | "
            f"{row['fxdp']['expanded_nodes']:,} / {row['torch_fx']['expanded_nodes']:,} nodes, "
            f"{row['fxdp']['buckets']} / {row['torch_fx']['buckets']} buckets |"
        )
    L += ["", f"Commands: `{r['commands']['fxdp']}`; baseline `{r['commands']['baseline']}`."]
    if w := r.get("measured"):
        L.append(
            f"This area was measured on its own (`bench/run_all.py --areas pipeline`), {w['date']} at "
            f"commit `{w['git_commit'][:12]}`, 1-minute load average {w['load'][0]} at start and "
            f"{w['load'][-1]} at end: not in the run above."
        )
    return L


def md_executor(r: dict) -> list:
    ns = r["ns_per_node"]
    base = ns.get("fxdp Program::Run", {}).get("median")
    L = [
        "## 2. Executor host overhead per node",
        "",
        f"A chain of {r['nodes']:,} one-element ops (alternating `aten::add`/`aten::mul`), one "
        f"thread, inference mode; wall time of one whole run / nodes, median (min-max) over "
        f"repetitions. fxdp: `Program::Run` (the LibTorch interpreter); baselines on the same "
        f"graph file. ratio = fxdp / baseline (below 1.00x fxdp is faster).",
        "",
        "| executor | ns/node | fxdp / this |",
        "|---|---:|---:|",
    ]
    for name, s in ns.items():
        label = f"**{name}**" if name == "fxdp Program::Run" else name
        L.append(f"| {label} | {mm(s, 0)} | {ratio(base, s['median'])} |")
    L += ["", f"Command: `{r['command']}`."]
    return L


def md_step(r: dict) -> list:
    raw = r["raw"]
    L = [
        "## 3. Training step at N=2 on CPU against DDP (Gloo)",
        "",
        f"`bench/step_vs_ddp.py` (Adam, single-tensor; AdamW for gpt2, a Hugging Face GPT-2 built "
        f"from a config: 6 layers, hidden 256, seq 128, vocabulary 8192; same model, global batch "
        f"and bucket size {raw.get('bucket_mb')} MB for both; every process one intra-op thread): ms "
        f"per step, the median of steps {raw.get('warmup', 0) + 1}-{raw.get('steps')} of each run "
        f"(gpt2: see its line below), then median (min-max) over {raw.get('reps')} repetitions; fxdp "
        f"and DDP run back to back in alternating order. "
        f"\"waiting\" is the time rank 0 is blocked in `Work::Wait` (fxdp_step_bench). "
        f"ratio = fxdp / DDP (below 1.00x fxdp is faster; the target is <= 0.95x).",
        "",
    ]
    models = raw.get("results", {})
    L += [
        "| model | fxdp-worker N=2 ms/step | DDP N=2 ms/step | fxdp / DDP (per repetition) | fxdp waiting on communication (rank 0) | compute alone: fxdp N=1 / eager N=1 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in models.items():

        def g(k):
            return m.get(k, {}) if isinstance(m.get(k), dict) else {}

        L.append(
            f"| {name} | {mm(g('fxdp-worker N=2'), 1)} | {mm(g('DDP N=2'), 1)} | "
            f"{mm(g('fxdp-worker / DDP (per repetition)'))} | {mm(g('fxdp wait (rank 0)'), 1)} | "
            f"{f(g('fxdp-worker N=1').get('median'), 1)} / {f(g('eager N=1').get('median'), 1)} |"
        )
    L += [
        "",
        'Every measured row (ms per step, median (min-max) over repetitions; "wait": ms per step '
        'blocked in `Work::Wait`, "start": ms per step inside `AllReduceSum`; the ratio row is '
        "fxdp-worker / DDP per repetition):",
        "",
        "| model | run | ms/step |",
        "|---|---|---:|",
    ]
    for name, m in models.items():
        for k, v in m.items():
            if isinstance(v, dict) and "median" in v and k != "info":
                L.append(f"| {name} | {k} | {mm(v, 2)} |")
    for name, m in models.items():
        info = m.get("info", {})
        if info:
            L.append("")
            loads = m.get("load average") or []
            L.append(
                f"{name}: {info.get('params', 0):,} parameters, {info.get('graph_nodes')} graph nodes, "
                f"global batch {info.get('global_batch')}, fxdp buckets {info.get('buckets')} bytes, "
                f"{m.get('collectives_per_step')} collectives per fxdp step; 1-minute load average "
                f"at each repetition: {', '.join(f'{x:.1f}' for x in loads)}"
                + (
                    f"; steps/warm-up/repetitions {c['steps']}/{c['warmup']}/{c['reps']}"
                    if (c := m.get("config"))
                    else ""
                )
                + "."
            )
            if m.get("measured"):
                w = m["measured"]
                L.append(
                    f"{name} was measured on its own (`bench/run_all.py --step-models {name}`), "
                    f"{w['date']} at commit `{w['git_commit'][:12]}`, 1-minute load average "
                    f"{w['load'][0]} at start and {w['load'][-1]} at end: not in the run above."
                )
    L += ["", f"**N=4**: {r['n4']}", "", f"Command: `{r['command']}`."]
    return L


def md_compile(r: dict) -> list:
    rows = {(x["rpc"], x["mode"], x["clients"]): x for x in r["rows"]}
    clients = sorted({x["clients"] for x in r["rows"] if x["mode"] != "in-process"})
    L = [
        "## 4. Compile RPC latency",
        "",
        f"A real `fxdp-server` on 127.0.0.1 (ephemeral port), started twice: with its compile "
        f"cache (default, 256 entries) and with `--cache-entries 0` (every request computed). "
        f"`fxdp_compile_load`: N closed-loop clients, each with its own channel (connection), "
        f"sending the same request for {r['duration_s']} s after one warm-up call each; graph: "
        f"{r['graph']}, {r['graph_nodes']} nodes, {r['request_bytes']:,} bytes, world size "
        f"{r['world_size']}. Latency percentiles over all calls of a run, then median (min-max) "
        f"over {r['reps']} runs. The floor: the same compile (decode, analysis[, expansion], "
        f"building the response) called in-process, one thread, no gRPC, no cache. The load "
        f"generator shares the 2 cores with the server.",
        "",
        "| RPC | clients | cache on p50 ms | cache on p99 ms | cache off p50 ms | cache off p99 ms | on / off (p50) | qps on / off | in-process floor p50 ms | cache off p50 / floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rpc in ("analyze", "expand"):
        floor = rows.get((rpc, "in-process", 1))
        fl = floor["p50_ms"]["median"] if floor else None
        for c in clients:
            on, off = rows.get((rpc, "cache on", c)), rows.get((rpc, "cache off", c))
            if not on or not off:
                continue
            L.append(
                f"| {rpc.capitalize()} | {c} | {mm(on['p50_ms'])} | {mm(on['p99_ms'])} | "
                f"{mm(off['p50_ms'])} | {mm(off['p99_ms'])} | "
                f"{ratio(on['p50_ms']['median'], off['p50_ms']['median'])} | "
                f"{f(on['qps']['median'], 0)} / {f(off['qps']['median'], 0)} | "
                f"{mm(floor['p50_ms']) if floor else '-'} | {ratio(off['p50_ms']['median'], fl)} |"
            )
    L += [
        "",
        f"Commands: `{r['commands']['server']}`; `{r['commands']['load']}`; floor "
        f"`{r['commands']['floor']}`.",
    ]
    return L


def md_allreduce(r: dict) -> list:
    impls = r["impls"]
    main, base = "fxdp", "c10d Gloo"
    others = [i for i in impls if i not in (main, base)]
    L = [
        "## 5. All-reduce bandwidth (Gloo, 2 ranks on 127.0.0.1)",
        "",
        f"Sum of float32 tensors, one collective in flight (start + wait), {r['reps']} "
        f"repetitions. fxdp: `GlooCommunicator::AllReduceSumDonated` + `Work::Wait` (in place, "
        f"as buckets are reduced). Baseline: c10d's `ProcessGroupGloo::allreduce` called "
        f"directly (same kind of group, in the same processes); also fxdp's copying "
        f"`AllReduceSum` and `torch.distributed.all_reduce` from Python. Time per all-reduce: "
        f"median (min-max); algbw = bytes / time, busbw = algbw x 2(n-1)/n (as nccl-tests; "
        f"n = 2, so busbw = algbw); ratio = fxdp time / c10d time (below 1.00x fxdp is faster).",
        "",
        f"| size | {main} µs | {base} µs | ratio | {main} algbw GB/s | {base} algbw GB/s | {main} busbw GB/s | "
        + " | ".join(f"{o} µs" for o in others)
        + " |",
        "|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(others),
    ]
    for row in r["table"]:
        a, b = row[main], row[base]
        L.append(
            f"| {bytes_str(row['bytes'])} | {mm(a['time_us'], 1)} | {mm(b['time_us'], 1)} | "
            f"{ratio(a['time_us']['median'], b['time_us']['median'])} | "
            f"{f(a['algbw_gbs']['median'], 3)} | {f(b['algbw_gbs']['median'], 3)} | "
            f"{f(a['busbw_gbs']['median'], 3)} | "
            + " | ".join(f(row[o]["time_us"]["median"], 1) for o in others)
            + " |"
        )
    rs = [row[main]["time_us"]["median"] / row[base]["time_us"]["median"] for row in r["table"]]
    big = [x for x, row in zip(rs, r["table"]) if row["bytes"] >= 1 << 20]
    L += [
        "",
        f"Median of the per-size ratios fxdp / c10d: {statistics.median(rs):.2f}x over all "
        f"{len(rs)} sizes" + (f", {statistics.median(big):.2f}x from 1 MB up" if big else "") + ".",
    ]
    nccl = r["nccl"]
    L += [
        "",
        "**NCCL** (`fxdp_allreduce_bench --device=cuda`: fxdp's `NcclCommunicator` against raw "
        "`ncclAllReduce`): " + (nccl if isinstance(nccl, str) else "see results.json"),
        "",
        "Commands: " + "; ".join(f"`{c}`" for c in r["commands"].values()) + ".",
    ]
    return L


def _md_fsdp_live_bytes(fm: dict, mem: dict) -> list:
    """md_fsdp's table of live tensor bytes per rank next to issue 15's formula (none: either
    is missing)."""
    if not fm or not mem:
        return []
    MB = 1e6
    L = [
        "",
        "**Live tensor bytes** per rank (rank 0, rank 1), counted at LibTorch's CPU allocator "
        "(`FXDP_MEMORY_TRACE`, a separate 3-step run per style), next to issue 15's formula: "
        f"P = {fm['P'] / MB:.1f} MB of parameters, k = {fm['k']} optimizer states per parameter, "
        f"N = {fm['N']}, U = {fm['U'] / MB:.1f} MB (the largest unit fully_shard gathers), A = "
        f"{fm['A'] / MB:.1f} MB (activations, measured separately: REPLICATE's peak minus the state "
        "it holds; its peak is at the loss, before any gradient exists). *state*: what a rank holds "
        "between steps, formula (1+k)P, /N sharded; *params + grads + optimizer state*: live bytes "
        "before the first gradient bucket's wait (every gradient exists, the activations are "
        "gone), formula (2+k)P, (2+k)P/N + U sharded; *peak*: the step's peak, formula "
        "(1+k)P + A, (1+k)P/N + A + U sharded.",
        "",
        "| N=2 | state MB: measured / formula | params + grads + optimizer state MB: measured / "
        "formula | peak MB: measured / formula | peak at node | peak RSS MB (traced run) |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for k in ("fxdp replicate", "fxdp fully_shard"):
        ms, g = mem.get(k), fm.get(k)
        if not ms or not g:
            continue
        eob = [m["end_of_backward"] for m in ms if m.get("end_of_backward") is not None]
        one = lambda xs: ", ".join(f"{x / MB:.1f}" for x in xs)  # noqa: E731
        L.append(
            f"| {'**' + k + '**' if k == 'fxdp fully_shard' else k} | "
            f"{one(m['state'] for m in ms)} / {g['state'] / MB:.1f} | "
            f"{one(eob) or '-'} / {g['pgo'] / MB:.1f} | "
            f"{one(m['peak'] for m in ms)} / {g['peak'] / MB:.1f} | "
            f"{ms[0]['peak_node']} | {', '.join(str(round(m['rss_peak'] / MB)) for m in ms)} |"
        )
    return L


def md_fsdp(r: dict) -> list:
    raw = r["raw"]
    info = raw.get("info", {})
    systems = list(raw.get("ms_per_step", {}))
    MB = 1e6
    L = [
        "## 6. FULLY_SHARD against REPLICATE against PyTorch FSDP2 at N=2 on CPU",
        "",
        f"`bench/fully_shard_vs_fsdp2.py`: the {raw.get('model')} of section 3 "
        f"({info.get('params', 0):,} parameters, AdamW, global batch {info.get('global_batch')}, "
        f"the same batches for all three), 2 ranks over Gloo, one intra-op thread each. fxdp: "
        f"`fxdp expand --style fully_shard|replicate` + 2 `fxdp-worker run`; FSDP2: "
        f"`torch.distributed.fsdp.fully_shard` on every transformer block and the root; fxdp's "
        f"fully_shard units (parameters gathered together) capped at {raw.get('unit_mb', 25)} MiB, about a "
        f"block each, replicate's buckets at {raw.get('bucket_mb', 25)} MiB. ms per "
        f"step: rank 0's median of steps {raw.get('warmup', 0) + 1}-{raw.get('steps')}, then median "
        f"(min-max) over {raw.get('reps')} repetitions run back to back in rotating order. "
        f"Memory per rank (rank 0, rank 1): **peak RSS delta** = the process' peak resident set "
        f"(VmHWM, sampled every 10 ms over the whole run) minus the same program's peak training the "
        f"tiny GPT-2 (~40K parameters), so the runtime's own footprint cancels; **state** = "
        f"parameters + gradients + optimizer state a rank holds between steps, counted from the "
        f"tensors (fxdp: its rank graph's PARAMETER placeholders twice, for the gradient, and "
        f"OPTIMIZER_STATE; FSDP2: the local shards of its parameters, gradients and optimizer "
        f"state after the last step). Under FULLY_SHARD the state is about 1/N of REPLICATE's; during "
        f"a step a rank also holds the gathered parameters of the units in use.",
        "",
        "| N=2 | ms/step | / FSDP2 | peak RSS delta MB | peak RSS MB | state MB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    fsdp2 = raw.get("ms_per_step", {}).get("FSDP2", {}).get("median")
    for k in systems:
        s = raw["ms_per_step"][k]
        delta = raw.get("peak_rss_delta", {}).get(k)
        L.append(
            f"| {'**' + k + '**' if k == 'fxdp fully_shard' else k} | {mm(s, 1)} | "
            f"{ratio(s.get('median'), fsdp2)} | "
            f"{', '.join(f(x / MB, 0) for x in delta) if delta else '-'} | "
            f"{', '.join(f(x / MB, 0) for x in raw.get('peak_rss', {}).get(k, []))} | "
            f"{', '.join(f(x / MB, 1) for x in raw.get('state_bytes', {}).get(k, []))} |"
        )
    L += _md_fsdp_live_bytes(raw.get("formula") or {}, raw.get("memory") or {})
    missing = [k for k in ("fxdp fully_shard", "fxdp replicate", "FSDP2") if k not in systems]
    if missing:
        L += ["", f"Not run: {', '.join(missing)}."]
    loads = raw.get("load average") or []
    L += [
        "",
        f"1-minute load average at each repetition: {', '.join(f'{x:.1f}' for x in loads)}.",
        "",
        f"Command: `{r['command']}`.",
    ]
    return L


def md_trace(r: dict) -> list:
    raw = r["raw"]
    MB = 1e6
    L = [
        "## 7. Client memory of tracing a model built on meta",
        "",
        f"`bench/trace_memory.py`: a Llama-shaped `transformers` model of {raw.get('layers')} layers "
        "(vocabulary 32000) built on the `meta` device, its step (AdamW, LM loss, batch "
        f"{raw.get('batch')} x {raw.get('seq')}) traced by `fxdp.trace_step`'s default mode, each "
        "in a fresh process: RSS before the trace (the model built) and peak RSS (`ru_maxrss`); "
        "the growth is their difference. With the weights on meta it should not grow with the "
        "parameter count.",
        "",
        "| hidden | parameters | graph nodes | trace s | RSS before MB | peak RSS growth MB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for x in raw.get("rows", []):
        L.append(
            f"| {x['hidden']} | {x['params']:,} | {x['nodes']} | {x['seconds']:.1f} | "
            f"{x['rss_before'] / MB:.0f} | {x['growth'] / MB:.0f} |"
        )
    L += ["", f"Command: `{r['command']}`."]
    return L


def md_random(r: dict) -> list:
    L = [
        "## 8. Dropout through fxdp's generator against torch's kernel",
        "",
        "`fxdp_random_bench`: `native_dropout` through fxdp's counter-based Philox generator "
        "(executor/random_ops.h: each element's mask from its global index, then "
        "`input * mask * 1/(1-p)`) against `at::native_dropout` (torch's CPU generator), and "
        "fxdp's `bernoulli.p` (what a traced `nn.Dropout` becomes) against `at::bernoulli`, on "
        "the same float32 tensor, p = 0.1; the two measured alternately in one process. "
        f"Target (issue 24): fxdp within {r['target']}x of torch. Times in ms, median (min-max).",
        "",
        "| op | elements | threads | fxdp ms | torch ms | fxdp / torch |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for x in r["rows"]:
        L.append(
            f"| {x['op']} | {x['numel']:,} | {x['threads']} | {mm(x['fxdp_ms'])} | "
            f"{mm(x['torch_ms'])} | {x['ratio']:.2f}x |"
        )
    worst = max((x["ratio"] for x in r["rows"]), default=None)
    if worst is not None:
        met = "met" if worst <= r["target"] else "**missed**"
        L += ["", f"Worst ratio {worst:.2f}x: target {met}."]
    L += ["", "Commands: " + "; ".join(f"`{c}`" for c in r["commands"]) + "."]
    return L


def md_shapes(r: dict) -> list:
    raw = r["raw"]
    L = [
        "## 10. A new batch shape of a symbolic graph",
        "",
        f"`bench/shape_cost.py`: an HF GPT-2 of {raw.get('layers')} layers of {raw.get('hidden')} "
        f"({raw.get('params', 0):,} parameters; AdamW, `clip_grad_norm_`, a padded batch) traced "
        f"once with `dynamic=True` at {'x'.join(map(str, raw.get('example', [])))} "
        f"({raw.get('trace_cpu_s', 0):.1f} s CPU, {raw.get('nodes')} nodes, "
        f"{raw.get('graph_bytes', 0) / 1e6:.2f} MB); `fxdp_shape_bench` runs the server's "
        "ShapeVariants over it: each new shape instantiated, analysed and expanded for "
        f"{raw.get('world_size')} ranks, as a job's step meets it (`JobInfo.shapes[].compile_ms`). "
        f"Issue 26's target: {raw.get('target_ms', 2000) / 1000:.0f} s per new shape.",
        "",
        "| new shape | compile ms (median, min-max) | CPU ms | rank graph MB |",
        "|---|---:|---:|---:|",
    ]
    for x in raw.get("rows", []):
        ms = x["compile_ms"]
        L.append(
            f"| {x['shape']} | {x['median_ms']:.0f} ({min(ms):.0f}-{max(ms):.0f}) | "
            f"{x['median_cpu_ms']:.0f} | {x['rank_graph_bytes'] / 1e6:.2f} |"
        )
    L += ["", f"Command: `{r['command']}`."]
    return L


RENDER = {
    "pipeline": md_pipeline,
    "executor": md_executor,
    "step": md_step,
    "compile": md_compile,
    "allreduce": md_allreduce,
    "fsdp": md_fsdp,
    "trace": md_trace,
    "random": md_random,
    "llama": md_llama,
    "shapes": md_shapes,
}
TITLES = {
    "pipeline": "1. Graph decode + analysis + expansion",
    "executor": "2. Executor host overhead",
    "step": "3. Training step at N=2 against DDP",
    "compile": "4. Compile RPC latency",
    "allreduce": "5. All-reduce bandwidth",
    "fsdp": "6. FULLY_SHARD vs REPLICATE vs FSDP2",
    "trace": "7. Tracing a meta model: client memory",
    "random": "8. Dropout through fxdp's generator",
    "llama": "9. A 300 M Llama from a Hugging Face checkpoint",
    "shapes": "10. A new batch shape (symbolic GPT-2)",
}


def md_before_after(c: dict) -> list:
    """The comparison of two runs (bench/before_after.py): each headline number before and after,
    and its ratio to the same run's baseline."""
    b, a = c["before"], c["after"]

    def num(x):
        return "-" if x is None else f"{x:.3g}"

    L = [
        "## Before and after (bench/before_after.py)",
        "",
        f"Before: commit `{(b['git_commit'] or '')[:12]}`, {b['date']}, load {b['load_start']} -> "
        f"{b['load_end']}. After: commit `{(a['git_commit'] or '')[:12]}`, {a['date']}, load "
        f"{a['load_start']} -> {a['load_end']}. Lower is better everywhere; \"vs baseline\" is the "
        "fxdp number over its baseline measured in the same run (less moved by the load).",
        "",
        "| what | before | after | after / before | vs baseline before | vs baseline after |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for what, vb, va, rb, ra in c["rows"]:
        change = f"{va / vb:.2f}x" if vb and va is not None else "-"
        L.append(f"| {what} | {num(vb)} | {num(va)} | {change} | {num(rb)} | {num(ra)} |")
    L.append("")
    if c.get("areas"):
        L.append("| area | load before (start / end) | load after (start / end) |")
        L.append("|---|---|---|")
        for name, (lb, la) in c["areas"].items():
            L.append(f"| {name} | {lb[0]} / {lb[-1]} | {la[0]} / {la[-1]} |")
        L.append("")
    for note in c.get("notes", []):  # how the numbers were taken, when not by two whole runs
        L += [note, ""]
    return L


def render_markdown(results: dict) -> str:
    m = results["meta"]
    L = [
        "# fxdp benchmark results",
        "",
        "Written by `make bench` (`bench/run_all.py`); raw numbers in `bench/results.json`. Every "
        "fxdp number is measured next to its baseline in the same run. Read the load average: "
        "this is a small shared VM, and other work on it slows both sides, not always equally.",
        "",
        "| | |",
        "|---|---|",
        f"| date | {m['date']} |",
        f"| git commit | `{m['git_commit'][:12]}`{' (with uncommitted changes)' if m.get('git_dirty') else ''} |",
        f"| machine | {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['gpus']} GPUs |",
        f"| system | {m['os']}, Linux {m['kernel']}, Python {m['python']}, torch {m['torch']} |",
        f"| build | `{m['build_dir']}`, CMAKE_BUILD_TYPE={m['build_type']} |",
        f"| load average (1/5/15 min) | start {m['load_start']}, end {m.get('load_end')} |",
        f"| `make bench` wall time | {m.get('wall_s', 0) / 60:.1f} min"
        + (" (quick mode: the numbers mean nothing)" if m.get("quick") else "")
        + " |",
        "",
    ]
    areas = results["areas"]
    L += ["| area | wall time | load average at start / end |", "|---|---:|---|"]
    for name, a in areas.items():
        L.append(
            f"| {TITLES.get(name, name)} | {a.get('wall_s', 0):.0f} s | "
            f"{a.get('load', ['-', '-'])[0]} / {a.get('load', ['-', '-'])[-1]} |"
        )
    L.append("")
    for name, a in areas.items():
        if "error" in a:
            L += [f"## {TITLES.get(name, name)}", "", f"**failed**: `{a['error'][:2000]}`", ""]
            continue
        L += RENDER[name](a)
        for note in a.get("notes", []):  # a measurement taken apart from the area's run
            L += ["", note]
        if (w := a.get("measured")) and name != "pipeline":  # md_pipeline says it itself
            L += [
                "",
                f"This area was measured on its own (`bench/run_all.py --areas {name} --merge`), "
                f"{w['date']} at commit `{w['git_commit'][:12]}`, 1-minute load average "
                f"{w['load'][0]} at start and {w['load'][-1]} at end: not in the run above.",
            ]
        L.append("")
    if "before_after" in results:
        L += md_before_after(results["before_after"])
    return "\n".join(L).rstrip() + "\n"
