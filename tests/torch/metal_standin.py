"""A stand-in for torch.mps.compile_shader, for testing lightning_mccl.metal where there is no Mac.

It is not Metal and nothing here pretends Metal ran: `compile` checks that the text it is given is the kernels'
source with the arithmetic header embedded, and returns a library whose kernels run, on CPU tensors, the C++
build of the same header through the binding (`_C.metal_reference`, each taking its kernel's arguments). So
the Python side (the choice, the self-test, the agreement across ranks, the fallback, the binding's encoded
path) runs as on a Mac, with the arithmetic Metal would run compiled by g++ instead. `calls` counts each
kernel's launches (with the threads asked for), so that a test can tell which path ran.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

KERNELS = ("int8_encode", "int8_decode", "pseudo_gradient", "outer_step")
WRITTEN = {"int8_encode": 2, "int8_decode": 1, "pseudo_gradient": 2, "outer_step": 1}  # an argument each writes


class StandInLibrary:
    def __init__(self, calls: Counter, corrupt: Optional[str], fail: Optional[str]) -> None:
        self.calls, self.corrupt, self.fail = calls, corrupt, fail

    def __getattr__(self, name: str):
        if name not in KERNELS:
            raise AttributeError(f"the stand-in library has no kernel {name!r}")
        from lightning_mccl.backend import extension as _C

        def launch(*args, threads=None, group_size=None):
            assert threads is not None, f"{name}: the caller gives the threads"
            self.calls[name] += 1
            if name == self.fail:
                raise RuntimeError(f"stand-in: {name} fails")
            getattr(_C.metal_reference, name)(*args)
            if name == self.corrupt:  # a kernel that miscomputes: one of its results changed
                written = args[WRITTEN[name]].view(-1)
                written[min(9, written.numel() - 1)] += 1

        return launch


class StandInCompiler:
    """In lightning_mccl.metal.COMPILER's place: kernels for "cpu" tensors. `corrupt`: a kernel whose results
    the stand-in changes (to play a device that miscomputes); `fail`: a kernel that raises."""

    device_type = "cpu"

    def __init__(self, corrupt: Optional[str] = None, fail: Optional[str] = None) -> None:
        self.corrupt, self.fail = corrupt, fail
        self.calls: Counter = Counter()
        self.compiled = 0

    def unavailable(self) -> Optional[str]:
        return None

    def compile(self, text: str) -> StandInLibrary:
        assert '#include "arithmetic.h"' not in text and "namespace mccl_arith" in text, "the header is embedded"
        for name in KERNELS:
            assert f"kernel void {name}(" in text, f"kernels.metal defines {name}"
        self.compiled += 1
        return StandInLibrary(self.calls, self.corrupt, self.fail)


def install(compiler: StandInCompiler) -> StandInCompiler:
    """Puts `compiler` in torch.mps.compile_shader's place for lightning_mccl.metal (in this process)."""
    from lightning_mccl import metal

    metal.COMPILER = compiler
    return compiler
