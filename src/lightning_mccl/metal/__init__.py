"""Metal kernels for the per-value work of MPS tensors: the 8-bit allreduce's and DiLoCo's (docs/int8.md, *What
runs where*; docs/diloco.md).

Without them that work is torch ops on the device: about 30 kernels and ten passes over memory to encode a bucket
with error feedback, four to decode it. Here each is one kernel and one pass (kernels.metal):

    int8_encode       values + residual -> blocks (scale, codes), residual := what the encoding lost
    int8_decode       blocks -> values (or added to them)
    pseudo_gradient   DiLoCo: flat := own := anchor - weights
    outer_step        DiLoCo: momentum, anchor and the correction `own` of diloco.py's outer Nesterov step

Their arithmetic is arithmetic.h, one text that is also C++: tests/engine/test_metal_arithmetic.cc checks its C++
build bit for bit against the engine's codec, the binding runs it on CPU tensors (`_C.metal_reference`), and
tests/engine/test_metal_kernels.cc runs kernels.metal itself as C++ against a mock of Metal. The kernels are
compiled on first use with torch.mps.compile_shader (no Xcode, no Metal SDK), from this package's arithmetic.h
and kernels.metal, read then.

**The gate.** When an mccl group is made, `agree` (called by the backend's creator) has each rank answer
whether it can use them: MCCL_METAL=off says no; so does a process without an MPS device; else the kernels are
compiled and run once on a small buffer of every kind of value (NaN, Inf, zeros, the largest floats, blocks
whose largest value sits on a scale's edge) against the engine's codec and `_C.metal_reference`, bit for bit.
The ranks exchange their answers through the group's Store: either every rank uses the kernels, or none does
(DiLoCo's anchor must be the same bits everywhere, and Metal's fused outer step rounds differently from torch
ops), and rank 0 logs one line naming the rank and its reason where any rank had an MPS device. The group keeps
the choice (`ProcessGroupMCCL.device_kernels`: "metal", or "torch ops: <why>").

    allreduce_int8(backend, tensor, residual, op) -> Work, or None where the kernels do not apply (another
        device, the group chose torch ops, one rank, a tensor that is not contiguous): int8.all_reduce's Metal
        path. The values are encoded on the current MPS stream (the caller is not stalled), the engine exchanges
        the blocks (ProcessGroupMCCL.allreduce_int8_encoded), and int8_decode writes the result into `tensor`
        before the Work's future completes.
    kernels(group, device) -> Kernels, or None: the group's kernels for tensors on `device` (DiLoCo's caller).
    describe(group=None) -> str: which path the group (or, with none, this process) takes, for `mccl doctor`.
"""
from __future__ import annotations

import functools
import importlib.resources
import logging
import os
from typing import Any, Mapping, Optional

import torch

METAL_VAR = "MCCL_METAL"  # auto (default): the kernels where every rank of a group can use them; off: never
METAL_DEFAULT = "auto"
METAL = "metal"  # ProcessGroupMCCL.device_kernels when the group uses the kernels
NO_DEVICE = "no MPS device"
BLOCK, ROW = 256, 4 + 256  # values per block; a block's bytes (arithmetic.h: kBlock, kRow)
LANES = 32  # int8_encode's threads per block (a SIMD group)
_KEY = "lightning_mccl/metal"  # the group's Store keys: /<rank> each rank's answer, /choice rank 0's

log = logging.getLogger(__name__)


def source() -> str:
    """kernels.metal with arithmetic.h's text in place of its #include (torch's compiler resolves only its own
    headers), read from the installed package."""
    files = importlib.resources.files(__name__)
    text, header = files.joinpath("kernels.metal").read_text(), files.joinpath("arithmetic.h").read_text()
    include = '#include "arithmetic.h"'
    assert text.count(include) == 1, "kernels.metal includes arithmetic.h once"
    return text.replace(include, header)


class Compiler:
    """torch.mps.compile_shader, for tensors on "mps" (the tests put a stand-in in COMPILER's place)."""

    device_type = "mps"

    def unavailable(self) -> Optional[str]:
        """Why these kernels cannot run in this process, or None."""
        if not callable(getattr(getattr(torch, "mps", None), "compile_shader", None)):
            return f"torch {torch.__version__} has no torch.mps.compile_shader"
        return None if torch.backends.mps.is_available() else NO_DEVICE

    def compile(self, text: str) -> Any:
        return torch.mps.compile_shader(text)


COMPILER = Compiler()


class Kernels:
    """The compiled kernels, each queued on the current stream of `device_type` tensors (contiguous float32,
    blocks uint8), returning at once."""

    def __init__(self, library: Any, device_type: str) -> None:
        self.library, self.device_type = library, device_type

    def encode(self, values: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
        """The blocks of `values` (+ `residual`, which then holds what the encoding lost): uint8 [blocks, 260]."""
        count = values.numel()
        rows = (count + BLOCK - 1) // BLOCK
        blocks = torch.empty((rows, ROW), dtype=torch.uint8, device=values.device)
        if count:
            feedback = residual is not None
            self.library.int8_encode(values, residual if feedback else values, blocks, count, int(feedback),
                                     threads=rows * LANES, group_size=min(256, rows * LANES))
        return blocks

    def decode(self, blocks: torch.Tensor, out: torch.Tensor, add: bool = False) -> None:
        """out = the values of `blocks` (add: out += them)."""
        if out.numel():
            self.library.int8_decode(blocks, out, int(add), threads=out.numel())

    def pseudo_gradient(self, anchor: torch.Tensor, flat: torch.Tensor, own: torch.Tensor) -> None:
        """DiLoCo: `flat` holds this rank's weights; flat and own become anchor - weights."""
        if flat.numel():
            self.library.pseudo_gradient(anchor, flat, own, threads=flat.numel())

    def outer_step(self, mean: torch.Tensor, momentum: torch.Tensor, anchor: torch.Tensor, own: torch.Tensor,
                   lr: float, mu: float) -> None:
        """DiLoCo's outer step: momentum = mu momentum + mean; u = lr (mean + mu momentum); anchor -= u;
        own -= u (own: this rank's pseudo-gradient, then the correction its weights take)."""
        if own.numel():
            self.library.outer_step(mean, momentum, anchor, own, float(lr), float(mu), threads=own.numel())


@functools.lru_cache(maxsize=None)
def _compiled(compiler: Compiler) -> Kernels:
    """The kernels, compiled once per process (per compiler)."""
    return Kernels(compiler.compile(source()), compiler.device_type)


def _differs(got: torch.Tensor, want: torch.Tensor) -> Optional[int]:
    """The first element whose bits differ, or None."""
    got, want = got.detach().cpu().reshape(-1), want.detach().cpu().reshape(-1)
    if got.dtype == torch.float32:
        got, want = got.view(torch.int32), want.view(torch.int32)
    unequal = (got != want).nonzero()
    return int(unequal[0]) if len(unequal) else None


def _test_values() -> torch.Tensor:
    """3 blocks and a short one: magnitudes over 2^-20..2^20 a block, one block led by 126 times a 17-bit float
    (the scale's edge), NaN, both infinities, both zeros and the largest floats (no denormals: a device may flush
    them, which changes only the residual's denormals)."""
    g = torch.Generator().manual_seed(37)
    count = 3 * BLOCK + 100
    exponents = torch.randint(-20, 21, ((count + BLOCK - 1) // BLOCK,), generator=g).repeat_interleave(BLOCK)
    x = torch.randn(count, generator=g) * torch.exp2(exponents[:count].float())
    big = torch.finfo(torch.float32).max
    x[BLOCK] = 126.0 * 98765.0  # 126 times a 17-bit integer: exact
    for i, v in zip((1, 38, 75, 112, 149, 186, 223), (float("nan"), float("inf"), -float("inf"), 0.0, -0.0,
                                                     big, -big)):
        x[2 * BLOCK + i % 100] = v
    return x


def self_test(kernels: Kernels) -> Optional[str]:
    """None when every kernel gives the CPU's bits on a small buffer (_test_values), else what differed first:
    the encoding (with and without error feedback), the residual and the decoding against the engine's codec;
    decode-and-add and DiLoCo's kernels against their arithmetic's C++ build (_C.metal_reference)."""
    from ..backend import extension as _C

    ref = _C.metal_reference
    device = torch.device(kernels.device_type)

    def there(t: torch.Tensor) -> torch.Tensor:  # a copy, also where the device is the CPU (a stand-in's)
        return t.to(device, copy=True)

    x = _test_values()
    count = x.numel()
    g = torch.Generator().manual_seed(38)
    residual = torch.randn(count, generator=g) * 1e-3
    kept = there(residual)
    blocks = kernels.encode(there(x), kept)
    wire = _C.int8_encode(x, residual, engine=True)  # residual: now what the engine's encoding lost
    plain = kernels.encode(there(x), None)
    decoded = torch.empty(count, device=device)
    kernels.decode(blocks, decoded)
    base = torch.randn(count, generator=g)
    summed = there(base)
    kernels.decode(blocks, summed, add=True)
    ref.int8_decode(blocks.to("cpu", copy=True), base, 1)
    anchor, w, mean, momentum = (torch.randn(count, generator=g) for _ in range(4))
    d_anchor, d_flat, d_mean, d_momentum = there(anchor), there(w), there(mean), there(momentum)
    d_own, own = torch.empty(count, device=device), torch.empty(count)
    kernels.pseudo_gradient(d_anchor, d_flat, d_own)
    ref.pseudo_gradient(anchor, w, own)
    delta = d_own.to("cpu", copy=True)
    kernels.outer_step(d_mean, d_momentum, d_anchor, d_own, 0.7, 0.9)
    ref.outer_step(mean, momentum, anchor, own, 0.7, 0.9)
    checks = [
        ("int8_encode's bytes (with error feedback)", blocks.reshape(-1)[:wire.numel()], wire),
        ("int8_encode's residual", kept, residual),
        ("int8_encode's bytes (without error feedback)", plain.reshape(-1)[:wire.numel()],
         _C.int8_encode(x, engine=True)),
        ("int8_decode's values", decoded, _C.int8_decode(wire, count, engine=True)),
        ("int8_decode's sums (add)", summed, base),
        ("pseudo_gradient's values", delta, w),
        ("outer_step's momentum", d_momentum, momentum),
        ("outer_step's anchor", d_anchor, anchor),
        ("outer_step's correction", d_own, own),
    ]
    for what, got, want in checks:
        at = _differs(got, want)
        if at is not None:
            return f"{what} differ from the CPU's at element {at} of {want.numel()}"
    return None


def setting(environ: Mapping[str, str] = os.environ) -> str:
    """MCCL_METAL: "auto" or "off"; a ValueError naming the variable for anything else (raised when a group is
    made, before its ranks connect)."""
    value = environ.get(METAL_VAR, "").strip().lower() or METAL_DEFAULT
    if value not in ("auto", "off"):
        raise ValueError(f"{METAL_VAR}={environ[METAL_VAR]!r}: expected auto or off (default {METAL_DEFAULT})")
    return value


def own_answer(metal_setting: str) -> str:
    """This process's answer: METAL when it can use the kernels, else why not (MCCL_METAL=off, no MPS device, a
    compile error, what the self-test found)."""
    if metal_setting == "off":
        return f"{METAL_VAR}=off"
    reason = COMPILER.unavailable()
    if reason is not None:
        return reason
    try:
        kernels = _compiled(COMPILER)
    except Exception as e:  # noqa: BLE001 - the fallback names it
        return f"the Metal kernels did not compile: {str(e).strip().splitlines()[0] if str(e).strip() else repr(e)}"
    try:
        found = self_test(kernels)
    except Exception as e:  # noqa: BLE001
        return f"the Metal kernels' self-test raised {e!r}"
    return METAL if found is None else f"self-test: {found}"


def agree(backend: Any, store: Any, rank: int, size: int, metal_setting: str) -> str:
    """Collective, when a group is made (every rank of it calls this with the group's Store, once its ranks have
    connected): each rank's own_answer through the Store, and the group's choice, METAL when every rank can use
    the kernels, else "torch ops: rank R: <its reason>", set as backend.device_kernels and returned. Rank 0 logs
    it in one line where any rank had an MPS device."""
    answer = own_answer(metal_setting)
    store.set(f"{_KEY}/{rank}", answer)
    if rank == 0:
        answers = [answer] + [store.get(f"{_KEY}/{r}").decode() for r in range(1, size)]
        refused = [(r, a) for r, a in enumerate(answers) if a != METAL]
        # The rank to name: the first whose reason is not the lack of a device (that one explains itself).
        named = next((ra for ra in refused if ra[1] != NO_DEVICE), refused[0]) if refused else None
        choice = METAL if named is None else f"torch ops: rank {named[0]}: {named[1]}"
        store.set(f"{_KEY}/choice", choice)
        if any(a != NO_DEVICE for a in answers):
            others = f" (and {len(refused) - 1} other ranks)" if len(refused) > 1 else ""
            (log.info if named is None else log.warning)(
                f"lightning_mccl: the per-value work of MPS tensors (8-bit allreduce, DiLoCo) on this group of {size} "
                f"ranks runs in {'Metal kernels, self-tested on every rank' if named is None else choice + others}")
    else:
        choice = store.get(f"{_KEY}/choice").decode()
    backend.device_kernels = choice
    return choice


def _group_kernels(backend: Any, device: torch.device) -> Optional[Kernels]:
    if backend is None or backend.device_kernels != METAL or device.type != COMPILER.device_type:
        return None
    return _compiled(COMPILER)


def kernels(group: Any, device: torch.device) -> Optional[Kernels]:
    """The kernels for tensors on `device` when `group` (an mccl group, None: the default group) agreed on
    them, else None (torch ops do the work)."""
    from ..backend import mccl_backend

    return _group_kernels(mccl_backend(group), torch.device(device))


def allreduce_int8(backend: Any, tensor: torch.Tensor, residual: Optional[torch.Tensor], op: Any) -> Any:
    """int8.all_reduce's Metal path (module docstring): a Work, or None where the kernels do not apply."""
    found = _group_kernels(backend, tensor.device)
    if found is None or backend.size() < 2 or not tensor.is_contiguous():
        return None
    blocks = found.encode(tensor, residual)
    return backend.allreduce_int8_encoded(tensor, blocks, residual, op, lambda: found.decode(blocks, tensor))


def describe(group: Any = None) -> str:
    """For `mccl doctor`: where the per-value work of MPS tensors runs, "Metal kernels" or "torch ops: <why>", for
    `group`'s ranks when torch.distributed is initialized, else for this process (compiling and self-testing the
    kernels here)."""
    from ..backend import mccl_backend

    backend = mccl_backend(group)
    choice = backend.device_kernels if backend is not None and backend.device_kernels else None
    if choice is None:
        answer = own_answer(setting())
        choice = METAL if answer == METAL else f"torch ops: {answer}"
    return "Metal kernels (self-tested against the CPU codec)" if choice == METAL else choice
