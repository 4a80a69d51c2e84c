"""Measures a compute profile (profile.py) on this machine's device (imports torch).

A few training steps of the model without any communication, each: zero_grad, forward, loss, backward,
optimizer step, device synchronize (benchmarks/fleet_ddp.py's "compute" step). A hook on every parameter's
gradient accumulation (`register_post_accumulate_grad_hook`, where DDP's Reducer hooks in too) marks when
backward produced it, in the device's clock (devices.py). Then the methods' device work (kernels.py).

`share_device` N > 1 runs N processes at once on the one device, each the same steps, started together at
every step (a barrier, as the stand-in's ranks start each step after `dist.barrier()`), and keeps, for every
time, the latest over the processes: the stand-in's ranks share one GPU, and a collective starts when the
slowest rank's bucket is ready. A Mac trains alone on its GPU: N = 1.
"""
from __future__ import annotations

import multiprocessing
import platform
import queue as queue_module
import statistics
import time
import traceback
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from .buckets import MIB
from .models import ModelError, ModelSpec
from .profile import Kernels, Param, PowerSGDCost, Profile

OPTIMIZERS = {"sgd": "SGD(lr=0.01, momentum=0.9)", "adamw": "AdamW(lr=1e-3)"}


@dataclass(frozen=True)
class MeasureSpec:
    model: ModelSpec
    batch: int
    device: str  # cpu, cuda, mps (devices.pick resolves auto)
    steps: int = 10
    warmup: int = 3
    share_device: int = 1
    optimizer: str = "sgd"
    powersgd_ranks: Tuple[int, ...] = (1, 4)
    kernel_bytes: int = 5 * MIB  # the buffer the elementwise kernels are timed on
    kernel_repeats: int = 5
    timeout_s: float = 900.0  # for the whole measurement of a shared device


class MeasureError(RuntimeError):
    """A process that measured failed: names it and its error."""


def measure(spec: MeasureSpec, log: Callable[[str], None] = lambda m: None) -> Profile:
    if spec.optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer {spec.optimizer!r}: use {', '.join(OPTIMIZERS)}")
    sharing = f", {spec.share_device} processes sharing it" if spec.share_device > 1 else ""
    log(f"profiling {spec.model.name}, batch {spec.batch}, on {spec.device}{sharing}: {spec.warmup} warm-up + "
        f"{spec.steps} timed steps, then the methods' device work")
    runs = [run_steps(spec, lambda: None)] if spec.share_device == 1 else _shared(spec)
    return combine(spec, runs)


def run_steps(spec: MeasureSpec, wait: Callable[[], None]) -> dict:
    """This process's measurement: each timed step's times, then the kernels' (kernels.py)."""
    import torch

    from . import kernels
    from .devices import Clock
    from .models import build

    clock = Clock(spec.device)
    built = build(spec.model, spec.batch, clock.device)
    params = [(name, p) for name, p in built.module.named_parameters() if p.requires_grad]
    opt = (torch.optim.SGD([p for _, p in params], lr=0.01, momentum=0.9) if spec.optimizer == "sgd" else
           torch.optim.AdamW([p for _, p in params], lr=1e-3))
    marks, order = {}, []

    def hook(name):
        def mark(_):
            marks[name] = clock.mark()
            order.append(name)
        return mark

    handles = [p.register_post_accumulate_grad_hook(hook(name)) for name, p in params]
    steps = []
    for i in range(spec.warmup + spec.steps):
        x, y = built.batch(i)
        marks.clear()
        order.clear()
        clock.sync()
        wait()
        t0 = clock.mark()
        opt.zero_grad(set_to_none=True)
        loss = built.loss(built.module(x), y)
        t_forward = clock.mark()
        loss.backward()
        t_backward = clock.mark()
        opt.step()
        t_end = clock.mark()
        clock.sync()
        missing = [name for name, _ in params if name not in marks]
        if missing:
            raise ModelError(f"{spec.model.name}: no gradient for {', '.join(missing[:4])}"
                             f"{' and more' if len(missing) > 4 else ''} (unused parameters: DDP would need "
                             f"find_unused_parameters=True; mccl plan does not model that)")
        if i >= spec.warmup:
            steps.append({"forward": clock.seconds(t0, t_forward), "backward": clock.seconds(t0, t_backward),
                          "step": clock.seconds(t0, t_end), "order": list(order),
                          "ready": {n: clock.seconds(t0, m) for n, m in marks.items()}})
    for h in handles:
        h.remove()
    infos = [Param(name, tuple(p.shape), p.element_size(), 0.0) for name, p in params]
    work = kernels.elementwise(clock, spec.kernel_bytes // 4, spec.kernel_repeats, wait)
    for r in spec.powersgd_ranks:
        for phase, times in kernels.powersgd(clock, infos, r, spec.kernel_repeats, wait).items():
            work[f"powersgd_{r}_{phase}"] = times
    return {"steps": steps, "kernels": work, "device_name": clock.describe(), "torch": torch.__version__,
            "params": [(p.name, p.shape, p.value_bytes) for p in infos]}


def _child(spec: MeasureSpec, index: int, barrier, results) -> None:
    try:
        run = run_steps(spec, lambda: barrier.wait(spec.timeout_s))
        results.put((index, run, None))
    except BaseException as e:  # reported to the parent; the others leave the barrier
        barrier.abort()
        results.put((index, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _shared(spec: MeasureSpec) -> List[dict]:
    """run_steps in spec.share_device processes at once (spawned: a fresh torch each, as the ranks). A process
    that fails leaves the barrier broken for the others; the error reported is the first process's own cause,
    not the others' broken barrier. A process that dies without a word is named with its exit code."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(spec.share_device), ctx.Queue()
    procs = [ctx.Process(target=_child, args=(spec, i, barrier, results), name=f"mccl-plan-profile-{i}")
             for i in range(spec.share_device)]
    for p in procs:
        p.start()
    runs: List[Optional[dict]] = [None] * len(procs)
    errors: List[Tuple[int, str]] = []
    reported = set()
    deadline = time.monotonic() + spec.timeout_s
    try:
        while len(reported) < len(procs):
            try:
                index, run, error = results.get(timeout=1.0)
            except queue_module.Empty:
                dead = [i for i, p in enumerate(procs) if i not in reported and p.exitcode is not None]
                if dead and not errors:
                    errors += [(i, f"exited with code {procs[i].exitcode} before reporting") for i in dead]
                if errors or time.monotonic() > deadline:
                    break
                continue
            reported.add(index)
            runs[index] = run
            if error:
                errors.append((index, error))
                deadline = min(deadline, time.monotonic() + 10.0)  # the others' reports of the broken barrier
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    if errors:
        index, error = next((e for e in errors if not e[1].startswith("BrokenBarrierError")), errors[0])
        raise MeasureError(f"profiling process {index} of {spec.share_device} failed: {error}")
    if len(reported) < len(procs):
        raise MeasureError(f"the {spec.share_device} profiling processes did not finish within {spec.timeout_s:g} s")
    return runs


def combine(spec: MeasureSpec, runs: List[dict]) -> Profile:
    """One profile from the processes' runs: per step (or repeat) the latest over the processes, then the
    median over the steps."""
    def step_time(key: str, name: Optional[str] = None) -> float:
        per_step = ([run["steps"][i][key] if name is None else run["steps"][i][key][name] for run in runs]
                    for i in range(spec.steps))
        return statistics.median(max(times) for times in per_step)

    step = step_time("step")
    backward = min(step, step_time("backward"))
    forward = min(backward, step_time("forward"))
    shapes = {name: (shape, size) for name, shape, size in runs[0]["params"]}
    params = tuple(Param(name, tuple(shapes[name][0]), shapes[name][1], min(backward, step_time("ready", name)))
                   for name in runs[0]["steps"][0]["order"])
    work = {name: statistics.median(max(run["kernels"][name][i] for run in runs) for i in range(spec.kernel_repeats))
            for name in runs[0]["kernels"]}
    kernels = Kernels(**{k: v for k, v in work.items() if not k.startswith("powersgd_")},
                      powersgd={r: PowerSGDCost(work[f"powersgd_{r}_p"], work[f"powersgd_{r}_q"],
                                                work[f"powersgd_{r}_d"]) for r in spec.powersgd_ranks})
    machine = {"host": platform.node(), "system": f"{platform.system()} {platform.release()}",
               "torch": runs[0]["torch"], "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    return Profile(model=spec.model.name, model_args=spec.model.args(), batch=spec.batch, device=spec.device,
                   device_name=runs[0]["device_name"], share_device=spec.share_device, steps=spec.steps,
                   warmup=spec.warmup, optimizer=OPTIMIZERS[spec.optimizer], forward_s=forward,
                   backward_s=backward, step_s=step, params=params, kernels=kernels, machine=machine)
