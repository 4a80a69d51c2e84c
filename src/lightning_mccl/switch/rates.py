"""Link rates and token-bucket sizes of the emulated switch.

Rates are written as tc writes them: ``1gbit``, ``10gbit``, ``100mbit``, ``2.5gbit`` (SI units, bits per
second; ``1g`` and a bare number of bits per second work too).

tbf (token bucket filter) charges whole frames (Ethernet header included) against the rate, so TCP goodput
through a link shaped at R is about 1448/1514 = 0.956 R with 1500-byte MTU: 0.956 Gbit/s at 1 Gbit/s is
"line rate", as a real 1 GbE port gives. The bucket (burst) decides how far a short transfer can run ahead
of the rate: a big bucket lets a 1 MB message pass at memory speed. 80 KB at 1 Gbit/s and 256 KB at
10 Gbit/s keep short transfers honest while still reaching the rate on long ones; in between and beyond, the
default grows as the square root of the rate (80 KB x sqrt(rate / 1 Gbit/s)), which meets both points.
"""
from __future__ import annotations

import math
import re

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:bit)?\s*$", re.IGNORECASE)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)
_SI = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_BIN = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

# TCP payload per 1514-byte frame (1500 MTU, 20 IP + 32 TCP with timestamps): the goodput of a shaped link.
TCP_GOODPUT_FRACTION = 1448 / 1514
REFERENCE_BURST_BYTES = 80 * 1000
MIN_BURST_BYTES = 16 * 1000


def parse_rate(text: str) -> int:
    """Bits per second of a tc-style rate; ValueError naming the text otherwise."""
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"rate {text!r}: write it as tc does, e.g. 1gbit, 10gbit, 100mbit")
    bps = float(m.group(1)) * _SI[m.group(2).lower()]
    if bps < 1e6:
        raise ValueError(f"rate {text!r} is below 1 mbit: too slow to emulate a training fleet's links")
    return int(bps)


def parse_size(text: str) -> int:
    """Bytes of ``80kb``, ``256k``, ``1mb`` (binary multiples) or a bare number of bytes."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"size {text!r}: write it as e.g. 80kb, 256kb, 1mb or a number of bytes")
    return int(float(m.group(1)) * _BIN[m.group(2).lower()])


def format_rate(bps: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6)):
        if bps >= scale:
            return f"{bps / scale:g}{unit}"
    return f"{bps:g}bit"


def default_burst(bps: int) -> int:
    """The token bucket for a link of `bps` bits per second (see the module docstring)."""
    return max(MIN_BURST_BYTES, int(REFERENCE_BURST_BYTES * math.sqrt(bps / 1e9)))


def line_rate_goodput(bps: int) -> float:
    """The TCP goodput, bits per second, that counts as 100% of a link shaped at `bps`."""
    return bps * TCP_GOODPUT_FRACTION
