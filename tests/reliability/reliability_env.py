"""Helpers for the reliability smoke tests: benchmarks/ on sys.path (the harnesses live in
benchmarks/reliability, and their rank processes import them by name), and a hard deadline helper."""
from __future__ import annotations

import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.insert(0, BENCHMARKS)


def bounded(fn, timeout_s: float, *args, **kwargs):
    """fn(*args, **kwargs), or AssertionError if it has not returned within timeout_s. The harnesses bound
    every trial themselves; this catches a bug in a harness, so that it fails the test instead of hanging it."""
    box = {}

    def target():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        raise AssertionError(f"{getattr(fn, '__name__', fn)} did not return within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box["value"]
