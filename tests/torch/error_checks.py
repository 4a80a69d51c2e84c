"""What the error tests of the torch backend accept as a clear error: an Exception of ERROR_TYPES whose
message names the cause (lenient regexes, re.I); a call that may instead work and must then be correct; and
a group that still works after a rejected call."""

from __future__ import annotations

import re

import torch
import torch.distributed as dist


ERROR_TYPES = (RuntimeError, ValueError, TypeError)
# The process group's timeout in the runs whose ranks disagree or lose a peer.
PG_TIMEOUT_S = 20.0


def _check_error(e, what, patterns):
    msg = str(e)
    if not isinstance(e, ERROR_TYPES):
        raise AssertionError(f"{what}: raised {type(e).__name__} (not RuntimeError/ValueError/TypeError): {msg[:300]}") from e
    missing = [p for p in patterns if not re.search(p, msg, re.I)]
    if missing:
        raise AssertionError(f"{what}: the message does not name the cause (no match for {missing}): "
                             f"{type(e).__name__}: {msg[:400]}") from e
    return msg


def _call(fn):
    result = fn()
    if hasattr(result, "wait"):  # a Work from the low-level API: errors may surface here
        result.wait()


def expect_error(fn, what, *patterns):
    """fn() must raise an Exception of ERROR_TYPES whose message matches every regex (re.I)."""
    try:
        _call(fn)
    except Exception as e:  # noqa: BLE001
        return _check_error(e, what, patterns)
    raise AssertionError(f"{what}: no exception was raised")


def works_or_error(fn, verify, what, *patterns):
    """Either fn() works and verify() passes, or it raises a clear error (as in expect_error)."""
    try:
        _call(fn)
    except Exception as e:  # noqa: BLE001
        return _check_error(e, what, patterns)
    verify()
    return None


def still_works(rank, ws, after):
    """The group must keep working after a rejected call."""
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    exp = ws * (ws + 1) / 2
    if t.tolist() != [exp] * 3:
        raise AssertionError(f"after {after}: all_reduce gave {t.tolist()}, expected {[exp] * 3}")
