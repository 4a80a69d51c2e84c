"""One rank of benchmarks/fleet_ddp.py: builds one model per series (same seed), times their training steps in
turns on the same synthetic data, and compares the final weights with the reference series'.

A DiLoCo series (ddp_series.py) runs all its steps one after another instead (series by series in its launch),
so that its outer allreduce overlaps its own next steps only; its step time is the mean per inner step over the
whole rounds in the timed steps (each round's steps, its allreduce's start and the apply of the round before),
which the samples/s and the efficiency use; `inner_median_s` is the median of those steps."""
from __future__ import annotations

import json
import os
import time

from . import cpu_counters, ddp_timeline, tcp_counters
from .ddp_series import COMPUTE, DDPSeries
from .rank import dist_max_reduce, dist_min_reduce, dist_sum_over_hosts, init_groups, say, summarize
from .series import Series

EXACT_TOL, COMPRESSED_TOL = 1e-3, 5e-2


def _device(name: str, sync: str):
    """The device and what ends a step on it: every stream, or (sync "stream", cuda) the compute stream."""
    import torch

    if name == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.cuda.set_device(0)  # every rank on GPU 0, as one Mac each
        if sync == "stream":
            return torch.device("cuda", 0), lambda: torch.cuda.current_stream().synchronize()
        return torch.device("cuda", 0), torch.cuda.synchronize
    if name == "mps":
        return torch.device("mps"), torch.mps.synchronize
    return torch.device("cpu"), lambda: None


def _model(spec: dict, device):
    import timm
    import torch

    torch.manual_seed(0)
    kwargs = {k: spec[k] for k in ("patch_size", "depth") if spec.get(k)}
    return timm.create_model(spec["model"], pretrained=False, img_size=spec["img_size"],
                             num_classes=spec["num_classes"], **kwargs).to(device)


def _wrap(s: DDPSeries, model, group, spec: dict):
    """DistributedDataParallel on the series' group, with its settings and comm hook; a DiLoCo series' model
    stays unwrapped (its DiLoCo is made by `_outer`)."""
    if s.diloco:
        return model
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, process_group=group, **s.ddp)
    if s.hook == "bf16_hook":
        ddp.register_comm_hook(group, default_hooks.bf16_compress_hook)
    elif s.hook == "fp16_hook":
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif s.hook == "int8":
        from lightning_mccl.int8 import Int8State, int8_hook

        ddp.register_comm_hook(Int8State(group), int8_hook)
    elif s.powersgd:
        state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=spec["powersgd_rank"],
                                            start_powerSGD_iter=2, use_error_feedback=True, warm_start=True,
                                            batch_tensors_with_same_shape=s.hook == "powersgd_batched")
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp


def _outer(s: DDPSeries, model, group):
    """The DiLoCo of a DiLoCo series, every rank starting from rank 0's weights, averaging as MCCLDiLoCoStrategy(
    compress=<the series' wire type>) does on the model's device (16 bits on an accelerator: cast on the device)."""
    from lightning_mccl import wire_policy
    from lightning_mccl.diloco import DiLoCo, averaging_for

    wire = s.wire or None  # "bf16", "fp16" (the series' MCCL_WIRE_DTYPE) or None
    device = next(model.parameters()).device
    averaging = averaging_for(wire_policy.resolve(wire, device.type, s.backend, "fleet_ddp", diloco=True), group)
    outer = DiLoCo(model, s.sync_every, sync_delay=s.sync_delay, fragments=s.fragments, averaging=averaging)
    outer.broadcast()
    return outer


def worker(spec_path: str) -> int:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    with open(spec_path) as f:
        spec = json.load(f)
    series = [DDPSeries.from_json(s) for s in spec["series"]]
    timed = {k for k, s in enumerate(series) if s.backend == "mccl" and not s.diloco}
    # Read once, after the last step: reading it between steps (thousands of dicts each time) slowed every
    # series' steps, Gloo's too. So it holds every collective of the run (fewer than 1000 per step; the engine
    # takes at most a million, and latest_ready() fails if that is too few).
    entries_needed = 1000 * (spec["warmup"] + spec["steps"]) * max(1, len(timed))
    os.environ.setdefault("MCCL_TIMELINE_ENTRIES", str(min(entries_needed, 1_000_000)))
    backends = sorted({s.backend for s in series if s.backend != "none"})
    groups = init_groups([Series(b, b) for b in backends], spec["pg_timeout"])
    torch.set_num_threads(spec["threads"])
    device, sync = _device(spec["device"], spec["sync"])
    rank, world = dist.get_rank(), dist.get_world_size()

    models = {s.label: (_model(spec, device) if s.backend == "none" else
                        _wrap(s, _model(spec, device), groups[s.backend], spec)) for s in series}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for k, m in models.items()}
    outers = {s.label: _outer(s, models[s.label], groups[s.backend]) for s in series if s.diloco}
    labels = list(models)
    start = _flat(_model(spec, torch.device("cpu")))
    params = start.numel()
    grad_bytes = 4 * params

    def batch(step: int):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(spec["batch"], 3, spec["img_size"], spec["img_size"], generator=g)
        y = torch.randint(0, spec["num_classes"], (spec["batch"],), generator=g)
        return x.to(device), y.to(device)

    total = spec["warmup"] + spec["steps"]
    times = torch.zeros(spec["steps"], len(labels), dtype=torch.float64)
    tcp = torch.zeros(spec["steps"], len(labels), len(tcp_counters.FIELDS), dtype=torch.float64)
    cpu = torch.zeros(spec["steps"], len(labels), len(cpu_counters.FIELDS), dtype=torch.float64)  # the machine's
    windows = {k: [] for k in timed}  # mccl series: each timed step's [t0, t1] in the engine's clock
    if timed:
        import lightning_mccl  # clock_ns() and timeline(): the engine's clock and collective times

        clock_ns = lightning_mccl.clock_ns
    else:
        clock_ns = lambda: 0  # noqa: E731
    if outers:  # series by series (module docstring)
        order = [(i, k) for k in range(len(labels)) for i in range(total)]
    else:  # in turns, step by step
        order = [(i, (i + j) % len(labels)) for i in range(total) for j in range(len(labels))]
    for i, k in order:
        x, y = batch(i)
        sync()
        tcp0 = tcp_counters.read()
        dist.barrier()
        t0, t0_ns, cpu0 = time.perf_counter(), clock_ns(), cpu_counters.read()
        opts[labels[k]].zero_grad(set_to_none=True)
        F.cross_entropy(models[labels[k]](x), y).backward()
        opts[labels[k]].step()
        if labels[k] in outers:
            outers[labels[k]].step()
        sync()
        t1_ns, cpu1 = clock_ns(), cpu_counters.read()
        if i >= spec["warmup"]:
            cpu[i - spec["warmup"], k] = torch.tensor(cpu_counters.delta(cpu0, cpu1), dtype=torch.float64)
            times[i - spec["warmup"], k] = time.perf_counter() - t0
            tcp[i - spec["warmup"], k] = torch.tensor(tcp_counters.read(), dtype=torch.float64) - torch.tensor(tcp0)
            if k in timed:
                windows[k].append((t0_ns, t1_ns))
        if (i == spec["warmup"] - 1 or i == total - 1) and (not outers or k == len(labels) - 1):
            say(f"{world} ranks, batch {spec['batch']}: step {i + 1}/{total}")
    for outer in outers.values():
        outer.finish()
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist_sum_over_hosts(tcp)  # every host's losses in the step (only the barrier's frames besides the step's)
    # each timed step's parts (ddp_timeline.py), the mean over the ranks
    parts = torch.zeros(spec["steps"], len(labels), len(ddp_timeline.PARTS), dtype=torch.float64)
    entries = lightning_mccl.timeline(groups["mccl"]) if timed else []
    latest = ddp_timeline.latest_ready(entries, dist_max_reduce, dist_min_reduce) if timed else []
    for k, steps in windows.items():
        for i, (t0_ns, t1_ns) in enumerate(steps):
            step = ddp_timeline.breakdown(entries, t0_ns, t1_ns, world, latest)
            parts[i, k] = torch.tensor([step[p] for p in ddp_timeline.PARTS], dtype=torch.float64)
    dist.all_reduce(parts)
    parts /= world

    rows = []
    compute = summarize(times[:, labels.index(COMPUTE)].tolist())["time_median_s"] if COMPUTE in labels else None
    for k, s in enumerate(series):
        row = {"model": spec["model"], "device": spec["device"], "world": world, "batch_per_rank": spec["batch"],
               "series": s.label, "backend": s.backend, "wire_dtype": s.wire, "hook": s.hook,
               "ddp_options": " ".join(f"{a}={b}" for a, b in s.ddp.items()),
               "env": " ".join(f"{a}={b}" for a, b in s.extra_env), "params": params,
               "grad_bytes": grad_bytes, **summarize(times[:, k].tolist()), "compute_median_s": compute,
               **tcp_counters.columns(tcp[:, k].sum(0).tolist())}
        row["step_s"] = row["time_median_s"]  # what samples/s and the efficiency use
        if s.diloco:
            rounds = s.whole_rounds(spec["warmup"], spec["steps"])
            row.update(sync_every=s.sync_every, sync_delay=s.sync_delay, fragments=s.fragments, rounds_timed=len(rounds) // s.sync_every,
                       step_s=float(times[rounds.start:rounds.stop, k].mean()),
                       inner_median_s=summarize(times[rounds.start:rounds.stop, k].tolist())["time_median_s"])
        if k in timed:
            row.update(ddp_timeline.summarize([dict(zip(ddp_timeline.PARTS, p.tolist())) for p in parts[:, k]]))
        if rank == 0 and s.backend != "none":
            row.update(_compare(s, _flat(getattr(models[s.label], "module", models[s.label])), start, spec))
        rows.append(row)
    if rank == 0:
        with open(spec["result"], "w") as f:
            steps = _timeline_steps(series, timed, times, parts, tcp, cpu, world, spec)
            json.dump({"rows": rows, "timeline_steps": steps}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _timeline_steps(series, timed, times, parts, tcp, cpu, world: int, spec: dict) -> list:
    """A row per timed step of each series: its time (the slowest rank's), for the mccl series its parts (the
    mean over the ranks), the TCP losses of every host in it and the machine's per-CPU load (rank 0's reading,
    cpu_counters.py), so that a slow mode in the medians can be told apart."""
    return [{"world": world, "batch_per_rank": spec["batch"], "series": series[k].label, "step": i,
             "time_s": float(times[i, k]),
             **{f"tl_{p}": float(v) for p, v in zip(ddp_timeline.PARTS, parts[i, k]) if k in timed},
             **tcp_counters.columns(tcp[i, k].tolist()), **cpu_counters.columns(cpu[i, k].tolist())}
            for k in range(len(series)) for i in range(spec["steps"])]


def _flat(model):
    import torch

    return torch.cat([p.detach().reshape(-1).float().cpu() for p in model.parameters()])


def _compare(s: DDPSeries, weights, start, spec: dict) -> dict:
    """The reference series saves its weights (the first launch); every other series is compared with them:
    |w - w_ref| / |w_ref - w_start|, within EXACT_TOL, COMPRESSED_TOL for 16-bit gradients, PowerSGD and DiLoCo
    reported only (a low-rank approximation and local steps train differently by design)."""
    import torch

    if s.label == spec["ref"]:
        torch.save(weights, spec["ref_path"])
        return {}
    if not os.path.exists(spec["ref_path"]):
        return {}
    ref = torch.load(spec["ref_path"])
    rel = float((weights - ref).norm() / (ref - start).norm().clamp_min(1e-30))
    tol = None if s.alone else COMPRESSED_TOL if s.compressed else EXACT_TOL
    return {"weights_vs": spec["ref"], "weights_rel_diff": rel, "weights_tol": tol if tol else "",
            "weights_match": "approx" if tol is None else "yes" if rel <= tol else "NO"}
