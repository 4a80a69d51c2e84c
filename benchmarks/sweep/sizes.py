"""Message sizes: ``4K``, ``256M``, ``1G`` or bytes; a geometric sweep like nccl-tests' -b/-e/-f."""
from __future__ import annotations

import re
from typing import List

_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)i?b?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"size {text!r}: write e.g. 4K, 64K, 16M, 256M or a number of bytes")
    return int(m.group(1)) * _SCALE[m.group(2).lower()]


def size_sweep(lo: int, hi: int, factor: int) -> List[int]:
    if lo <= 0 or hi < lo:
        raise ValueError(f"sizes {lo}..{hi}: need 0 < min <= max")
    if factor < 2:
        raise ValueError(f"step factor {factor}: must be at least 2")
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out
