"""The argument types the `mccl` commands share: each parses one option's text, or raises argparse's
ArgumentTypeError naming what is wrong (argparse prefixes the option: ``argument --local: must be at least
1, got 0``)."""
from __future__ import annotations

import argparse
from typing import Callable, TypeVar

from ..quantities import parse_goodput, parse_hosts
from ..switch.rates import parse_rate

T = TypeVar("T")


def from_parser(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argument type from a library parser that raises ValueError with the whole message."""
    def argument_type(text: str) -> T:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    argument_type.__name__ = parse.__name__
    return argument_type


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: an integer >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
hosts = from_parser(parse_hosts)  # fleet sizes: 1-48, 2,4,8,24
goodput = from_parser(parse_goodput)  # bytes/s from 9.4gbit or 1.17GB/s
rate = from_parser(parse_rate)  # bits/s, tc style: 10gbit


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def port_range(text: str) -> str:
    low, sep, high = text.partition("-")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = 0
    if not sep or not 1 <= lo <= hi <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port range LOW-HIGH (1 <= LOW <= HIGH <= 65535), "
                                         "e.g. 29600-29700")
    return f"{lo}-{hi}"


def _number_of_seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None


def seconds(text: str) -> float:
    """Seconds, 0 or more."""
    value = _number_of_seconds(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """Seconds, more than 0 (a limit of 0 would end the run at once)."""
    value = _number_of_seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def mib(text: str) -> float:
    """A message size in MiB, at least 4 bytes."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    if not value * (1 << 20) >= 4:
        raise argparse.ArgumentTypeError(f"must be at least 4 bytes, got {text} MiB")
    return value


def address_port(text: str):
    """ADDR:PORT (the last colon splits them), as (addr, port)."""
    addr, sep, number = text.rpartition(":")
    if not sep or not addr:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDR:PORT, e.g. 10.0.0.11:29500")
    return addr, port(number)
