"""The methods' own work on the device, timed for a profile (imports torch; used by measure.py).

Each is timed on a buffer of one bucket's float32 gradient (the plan scales it by the bytes: the work is
elementwise and memory-bound), as the methods do it:

    bf16_encode      the bf16 hook's cast of a bucket to bfloat16 and its division by the world size
    bf16_decode      its copy back into the float32 bucket
    pseudo_gradient  DiLoCo: anchor - weights (lightning_mccl.diloco packs it into one float32 vector)
    outer_step       DiLoCo: Nesterov momentum on the averaged pseudo-gradient, the anchor moved, the weights
                     moved by the same step less their own progress

and PowerSGD's matrix work for every matrix it compresses in the model (methods.powersgd_matrix) at each
rank asked for, same-shaped matrices stacked and multiplied at once (batch_tensors_with_same_shape), in its
three phases (profile.PowerSGDCost); P is orthogonalised by torch's own routine.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, List, Sequence

from .methods import powersgd_matrix
from .profile import Param

WORLD = 8  # the bf16 hook divides by the world size; any value costs the same


def timed(clock, repeats: int, wait: Callable[[], None], run: Callable[[], None]) -> List[float]:
    """`run` once untimed, then `repeats` times, each after wait() (the processes sharing the device start
    together); seconds each."""
    run()
    out = []
    for _ in range(repeats):
        clock.sync()
        wait()
        a = clock.mark()
        run()
        b = clock.mark()
        clock.sync()
        out.append(clock.seconds(a, b))
    return out


def elementwise(clock, numel: int, repeats: int, wait) -> Dict[str, List[float]]:
    """Seconds per float32 byte of each elementwise kernel, per repeat."""
    import torch

    from ..diloco import OUTER_LR, OUTER_MOMENTUM

    dev = clock.device
    grad = torch.randn(numel, device=dev)
    half = torch.empty(numel, device=dev, dtype=torch.bfloat16)
    anchor, momentum, delta = (torch.randn(numel, device=dev) for _ in range(3))
    mean = torch.randn(numel, device=dev)

    def outer_step():
        momentum.mul_(OUTER_MOMENTUM).add_(mean)  # the same passes at any lr and momentum (diloco.DiLoCo._apply)
        update = torch.add(mean, momentum, alpha=OUTER_MOMENTUM).mul_(OUTER_LR)
        anchor.sub_(update)
        grad.add_(delta).sub_(update)

    kernels = {
        "bf16_encode": lambda: half.copy_(grad).div_(WORLD),
        "bf16_decode": lambda: grad.copy_(half),
        "pseudo_gradient": lambda: torch.sub(anchor, grad, out=delta),
        "outer_step": outer_step,
    }
    return {name: [t / (4 * numel) for t in timed(clock, repeats, wait, run)] for name, run in kernels.items()}


def powersgd(clock, params: Sequence[Param], rank: int, repeats: int, wait) -> Dict[str, List[float]]:
    """Seconds of PowerSGD's three phases at `rank` over the model's compressed matrices, per repeat."""
    import torch

    shapes = defaultdict(int)
    for p in params:
        m = powersgd_matrix(p, rank)
        if m:
            shapes[m] += 1
    dev = clock.device
    groups = []
    for (rows, cols, r), count in shapes.items():
        grads = torch.randn(count, rows, cols, device=dev)
        groups.append({"m": grads, "e": torch.zeros_like(grads), "q": torch.randn(count, cols, r, device=dev),
                       "p": torch.empty(count, rows, r, device=dev), "approx": torch.empty_like(grads)})
    orthogonalize = _orthogonalize()

    def p_phase():
        for g in groups:
            g["m"].add_(g["e"])
            torch.bmm(g["m"], g["q"], out=g["p"])

    def q_phase():
        for g in groups:
            orthogonalize(g["p"])
            torch.bmm(g["m"].transpose(1, 2), g["p"], out=g["q"])

    def d_phase():
        for g in groups:
            torch.bmm(g["p"], g["q"].transpose(1, 2), out=g["approx"])
            torch.sub(g["m"], g["approx"], out=g["e"])
            g["m"].copy_(g["approx"])

    return {phase: timed(clock, repeats, wait, run) for phase, run in (("p", p_phase), ("q", q_phase), ("d", d_phase))}


def _orthogonalize():
    """torch's PowerSGD orthogonalisation (Gram-Schmidt up to rank 2, QR above), or QR where it is gone."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize as torch_own

        return torch_own
    except ImportError:
        import torch

        return lambda p: p.copy_(torch.linalg.qr(p).Q)
