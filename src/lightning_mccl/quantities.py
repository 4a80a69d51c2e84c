"""Quantities as people write them on a command line: fleet sizes (``1-48``, ``2,4,8,24``) and a link's
goodput in bits or bytes per second (``9.4gbit``, ``1.17GB/s``). Each parser raises ValueError naming the
text and what to write instead (`mccl plan` shows it as the option's error)."""
from __future__ import annotations

import re
from typing import List

from .switch.rates import parse_rate

MAX_HOSTS = 4096
_BYTES_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kMG]?)B/s\s*$")
_SI = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}


def parse_hosts(text: str) -> List[int]:
    """A range (1-48), a list (2,4,8,24) or both, as sorted distinct host counts >= 1."""
    hosts = set()
    for item in text.split(","):
        a, dash, b = item.strip().partition("-")
        try:
            lo, hi = int(a), int(b) if dash else int(a)
        except ValueError:
            raise ValueError(
                f"{text!r}: {item.strip()!r} is not a host count or a range; write a range such as 1-48 or a list "
                f"such as 2,4,8,24") from None
        if lo < 1:
            raise ValueError(f"{text!r}: host counts start at 1, got {lo}")
        if hi < lo:
            raise ValueError(f"{text!r}: the range {item.strip()} ends before it starts")
        if hi > MAX_HOSTS:
            raise ValueError(f"{text!r}: at most {MAX_HOSTS} hosts, got {hi}")
        hosts.update(range(lo, hi + 1))
    return sorted(hosts)


def parse_goodput(text: str) -> float:
    """Bytes per second from 9.4gbit (bits, as tc writes rates) or 1.17GB/s (bytes)."""
    m = _BYTES_RATE.match(text)
    if m:
        value = float(m.group(1)) * _SI[m.group(2)]
    else:
        try:
            value = parse_rate(text) / 8
        except ValueError:
            value = 0.0
    if not value > 0:
        raise ValueError(f"{text!r}: write a rate such as 9.4gbit or 1.17GB/s")
    return value
