"""The Metal reduction's two settings, declared once with their defaults.

MCCL_METAL            0 (default) | auto | 1. 0: the CPU reducer only. auto: Metal where it is available, its
                      self-test passes and every rank agrees. 1: the same, but a refusal or failure is logged
                      as a warning instead of at info level. Off by default until benchmarks/metal_reduce.py
                      measures it faster than the CPU reducer on a Mac.
MCCL_METAL_MIN_BYTES  reductions of fewer bytes stay on the CPU even when Metal is in use. Default 256 MiB,
                      where Lazarus-931/mccl starts using Metal, until measured here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

METAL_DEFAULT = "0"
METAL_MIN_BYTES_DEFAULT = 256 << 20
MODES = ("0", "auto", "1")


class SettingsError(ValueError):
    """A MCCL_METAL* variable has a value that is not allowed."""


@dataclass(frozen=True)
class MetalSettings:
    mode: str = METAL_DEFAULT
    min_bytes: int = METAL_MIN_BYTES_DEFAULT

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "MetalSettings":
        env = os.environ if env is None else env
        mode = env.get("MCCL_METAL", METAL_DEFAULT).strip().lower() or METAL_DEFAULT
        if mode not in MODES:
            raise SettingsError(f"MCCL_METAL={env['MCCL_METAL']!r}: expected one of {', '.join(MODES)}")
        raw = env.get("MCCL_METAL_MIN_BYTES", "").strip()
        try:
            min_bytes = int(raw) if raw else METAL_MIN_BYTES_DEFAULT
        except ValueError:
            raise SettingsError(f"MCCL_METAL_MIN_BYTES={raw!r}: expected a whole number of bytes") from None
        if min_bytes < 0:
            raise SettingsError(f"MCCL_METAL_MIN_BYTES={raw!r}: must not be negative")
        return cls(mode, min_bytes)

    def describe(self) -> str:
        return f"MCCL_METAL={self.mode}" + (" (the default)" if self.mode == METAL_DEFAULT else "")
