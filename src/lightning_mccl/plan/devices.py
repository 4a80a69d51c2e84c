"""The device a profile runs on and its clock (imports torch; used by measure.py and kernels.py).

On cuda and mps a mark is an event recorded in the device's stream, so that a time is when the device
reached that point, not when the CPU queued the work (the CPU runs ahead); on the CPU, where every operation
runs in the caller, a mark is the time itself. Read marks only after `sync()`.
"""
from __future__ import annotations

import time

DEVICES = ("cpu", "cuda", "mps")
MAC_DEVICE = "mps"  # what a Mac of the fleet trains on: a profile measured elsewhere is another device's compute


class DeviceError(RuntimeError):
    """The device asked for is not available here."""


def pick(name: str) -> str:
    """`auto`: mps, else cuda, else cpu; otherwise the name, checked."""
    import torch

    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        return "mps" if mps else "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda: torch sees no CUDA device here")
    if name == "mps" and not mps:
        raise DeviceError("--device mps: torch's MPS backend is not available here (a Mac with macOS 12.3+ and a "
                          "torch built with MPS)")
    if name not in DEVICES:
        raise DeviceError(f"--device {name}: use one of {', '.join(DEVICES)} or auto")
    return name


class Clock:
    def __init__(self, name: str):
        import torch

        self.name = name
        if name == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as the stand-in computes (fleet_ddp.py)
            torch.backends.cudnn.allow_tf32 = False
            torch.cuda.set_device(0)  # every process on GPU 0, as the stand-in's ranks
            self.device = torch.device("cuda", 0)
            self.sync = torch.cuda.synchronize
            self._event = lambda: torch.cuda.Event(enable_timing=True)
        elif name == "mps":
            self.device = torch.device("mps")
            self.sync = torch.mps.synchronize
            self._event = lambda: torch.mps.event.Event(enable_timing=True)
        else:
            self.device = torch.device("cpu")
            self.sync = lambda: None
            self._event = None

    def mark(self):
        if self._event is None:
            return time.perf_counter()
        e = self._event()
        e.record()
        return e

    def seconds(self, start, end) -> float:
        """From mark `start` to mark `end` (both read after sync())."""
        if self._event is None:
            return end - start
        return start.elapsed_time(end) / 1e3

    def describe(self) -> str:
        import torch

        if self.name == "cuda":
            return torch.cuda.get_device_name(0)
        return f"{cpu_name()}'s GPU" if self.name == "mps" else cpu_name()


def cpu_name() -> str:
    """The processor's marketing name: "Apple M2 Ultra" on a Mac (sysctl), the model name on Linux."""
    import platform
    import subprocess

    if platform.system() == "Darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or platform.machine()
        except (OSError, subprocess.SubprocessError):
            return platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.machine())
    except OSError:
        return platform.processor() or platform.machine()
