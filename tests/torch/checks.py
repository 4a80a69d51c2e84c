"""Shared checking helpers for the torch.distributed tests (used inside the rank processes).

Inputs are generated per (case label, source rank) from a shared seed, so every rank can rebuild every
other rank's input and compute the expected result itself, in float64 or exact integer arithmetic.
`Sweep` runs many cases in one process-group run, records each failure instead of stopping, and turns
the errors of declared Gloo gaps into skips (only ever when the backend under test is gloo).
"""

from __future__ import annotations

import hashlib
import re
import traceback
import zlib

import numpy as np
import torch
import torch.distributed as dist

from lightning_mccl.testing import progress, report

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
]
FLOATS = [d for d in DTYPES if d.is_floating_point]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
BASIC_OPS = ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
BIT_OPS = ["BAND", "BOR", "BXOR"]


def dname(dtype) -> str:
    return str(dtype).replace("torch.", "")


def counts(ws: int) -> list[int]:
    """0, 1, fewer than the world size, not divisible by it, and a few hundred (prime)."""
    return sorted({0, 1, max(ws - 1, 1), 2 * ws + 1, 257})


def seed_of(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


# ----------------------------------------------------------------------------------------------------------
# Inputs and references


def gen(label, src, n, dtype, kind, *extra):
    """Rank `src`'s input for case `label`: (tensor of `dtype`, exact values as float64/int64/bool numpy).

    Every rank can call this for every src, so each rank knows all inputs. `kind` picks value ranges
    that make the op meaningful without overflow: "sum", "prod" (near +-1), "minmax", "bits",
    "and" (bool mostly True), "or" (bool mostly False).
    """
    rng = np.random.default_rng([seed_of(label, *extra), src])
    if dtype.is_floating_point:
        if kind == "prod":
            v = rng.uniform(0.85, 1.15, n) * rng.choice([-1.0, 1.0], n)
        else:
            v = rng.uniform(-1.0, 1.0, n)
        t = torch.from_numpy(v).to(dtype)
        return t, t.to(torch.float64).numpy()
    if dtype == torch.bool:
        p = {"and": 0.85, "prod": 0.85, "or": 0.15, "sum": 0.15}.get(kind, 0.5)
        v = rng.random(n) < p
        return torch.from_numpy(v.copy()), v
    info = torch.iinfo(dtype)
    if kind == "sum":
        lo, hi = {torch.int8: (-20, 20), torch.uint8: (0, 40), torch.int32: (-(10**8), 10**8),
                  torch.int64: (-(10**15), 10**15)}[dtype]
        v = rng.integers(lo, hi, n, endpoint=True, dtype=np.int64)
    elif kind == "prod":
        choices = {torch.int8: [-2, -1, 1, 2], torch.uint8: [0, 1, 2], torch.int32: list(range(-30, 31)),
                   torch.int64: list(range(-1000, 1001))}[dtype]
        v = rng.choice(np.array(choices, dtype=np.int64), n)
    else:  # minmax / bits: the whole range
        v = rng.integers(info.min, info.max, n, endpoint=True, dtype=np.int64)
    return torch.from_numpy(v.copy()).to(dtype), v


def all_inputs(label, ws, n, dtype, kind, *extra):
    """Every rank's input: list of (tensor, exact numpy)."""
    return [gen(label, r, n, dtype, kind, *extra) for r in range(ws)]


def reduce_ref(stack, op, dtype):
    """Reference reduction over axis 0 of `stack` (float64 / int64 / bool numpy), in exact arithmetic."""
    if dtype == torch.bool:
        # bool reductions are logical: SUM/MAX/BOR = any, PRODUCT/MIN/BAND = all, BXOR = parity
        if op in ("SUM", "MAX", "BOR"):
            return np.any(stack, axis=0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return np.all(stack, axis=0)
        if op == "BXOR":
            return np.bitwise_xor.reduce(stack, axis=0)
        raise ValueError(op)
    if op == "SUM":
        return stack.sum(axis=0)
    if op == "AVG":
        if dtype.is_floating_point:
            return stack.sum(axis=0) / stack.shape[0]
        return stack.sum(axis=0) // stack.shape[0]  # the inputs are built so this divides exactly
    if op == "PRODUCT":
        return np.prod(stack, axis=0)
    if op == "MIN":
        return stack.min(axis=0)
    if op == "MAX":
        return stack.max(axis=0)
    if op == "BAND":
        return np.bitwise_and.reduce(stack, axis=0)
    if op == "BOR":
        return np.bitwise_or.reduce(stack, axis=0)
    if op == "BXOR":
        return np.bitwise_xor.reduce(stack, axis=0)
    raise ValueError(op)


def op_kind(op, dtype):
    if op == "PRODUCT":
        return "prod"
    if dtype == torch.bool:
        return {"MIN": "and", "BAND": "and", "MAX": "or", "SUM": "or", "BOR": "or"}.get(op, "bits")
    if op in ("MIN", "MAX"):
        return "minmax"
    if op in BIT_OPS:
        return "bits"
    return "sum"


def make_avg_divisible(vals, ws):
    """For integer AVG: shift the last rank's values so every element's sum divides by ws exactly."""
    total = np.sum([v for _, v in vals], axis=0)
    t_last, v_last = vals[-1]
    v_new = v_last + ((-total) % ws)
    vals[-1] = (torch.from_numpy(v_new.copy()).to(t_last.dtype), v_new)
    return vals


def tolerance(op, dtype, ws, stack, ref):
    """Allowed |actual - ref| per element for floating types.

    A ring/tree reduction rounds after every partial sum: at most ws-1 roundings, each at most eps
    times the running magnitude, which is bounded by sum(|x|). AVG adds a division (or a pre-division of
    each input). PRODUCT's relative error grows by eps per multiplication. MIN/MAX select an input: exact.
    """
    if not dtype.is_floating_point or op in ("MIN", "MAX"):
        return np.zeros_like(ref, dtype=np.float64)
    eps = torch.finfo(dtype).eps
    if ws == 1:
        return np.zeros_like(ref, dtype=np.float64)
    abs_sum = np.abs(stack).sum(axis=0)
    if op == "SUM":
        return ws * eps * abs_sum
    if op == "AVG":
        return 2.0 * eps * abs_sum + eps * np.abs(ref)
    if op == "PRODUCT":
        return (ws + 1) * eps * np.abs(ref)
    raise ValueError(op)


def as_exact(t: torch.Tensor, strict_bool=True) -> np.ndarray:
    """Exact values as numpy. A bool result must hold only the bytes 0 and 1 (torch assumes that)."""
    t = t.detach()
    if t.dtype.is_floating_point:
        return t.to(torch.float64).numpy()
    if t.dtype == torch.bool:
        raw = t.contiguous().view(torch.uint8).numpy() if t.numel() else np.zeros(0, np.uint8)
        bad = raw[(raw != 0) & (raw != 1)]
        if bad.size and strict_bool:
            raise AssertionError(f"bool result holds bytes other than 0/1: {sorted(set(bad.tolist()))[:8]}")
        return raw.astype(bool)
    return t.to(torch.int64).numpy()


def check_tensor(actual: torch.Tensor, ref, dtype, shape, tol=None, what="result", strict_bool=True):
    """actual must have dtype/shape and match ref (exactly, or within per-element tol for floats)."""
    if actual.dtype != dtype:
        raise AssertionError(f"{what}: dtype changed to {actual.dtype}, expected {dtype}")
    if tuple(actual.shape) != tuple(shape):
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(shape)}")
    got = as_exact(actual, strict_bool).reshape(-1)
    ref = np.asarray(ref).reshape(-1)
    if got.size == 0:
        return
    if dtype.is_floating_point:
        tol = np.zeros_like(ref) if tol is None else np.asarray(tol).reshape(-1)
        err = np.abs(got - ref)
        bad = ~(err <= tol)  # catches NaN too
        if bad.any():
            i = int(np.argmax(np.where(bad, err - tol, -np.inf)))
            raise AssertionError(
                f"{what}: {int(bad.sum())}/{ref.size} elements off; worst at [{i}]: got {got[i]!r}, "
                f"expected {ref[i]!r} (|err| {err[i]:.3g} > tol {tol[i]:.3g})"
            )
    else:
        bad = got != ref
        if bad.any():
            i = int(np.argmax(bad))
            raise AssertionError(
                f"{what}: {int(bad.sum())}/{ref.size} elements differ; first at [{i}]: got {got[i]!r}, expected {ref[i]!r}"
            )


def digest(t: torch.Tensor) -> str:
    if t.numel() == 0:
        return "empty"
    return hashlib.sha1(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def sentinel_like(dtype, n):
    """Output buffers start with garbage that cannot be mistaken for a result."""
    if dtype == torch.bool:
        return torch.ones(n, dtype=dtype)
    if dtype.is_floating_point:
        return torch.full((n,), 12345.0 if dtype != torch.float16 else 1234.0, dtype=dtype)
    return torch.full((n,), 77, dtype=dtype)


# ----------------------------------------------------------------------------------------------------------
# The sweep (runs inside each rank)


class GlooGap(Exception):
    """Gloo does not support this case (only ever raised when the backend is gloo)."""


class Sweep:
    def __init__(self, rank, ws, backend):
        self.rank, self.ws, self.backend = rank, ws, backend
        self.failures: dict[str, list[str]] = {}
        self.skips: dict[str, list[str]] = {}
        self.not_applicable: dict[str, str] = {}
        self.passed: dict[str, int] = {}
        self.digests: dict[str, str] = {}
        self.stuck = False  # set by a case that finds the backend deadlocked: the run must stop

    def case(self, group, label, fn):
        progress(f"{group} {label}")
        try:
            fn()
        except GlooGap as gap:
            self.skips.setdefault(group, []).append(f"{label}: {gap}")
            report(("skip", group, label, str(gap)))
        except Exception as e:  # noqa: BLE001 - every failure is recorded and reported
            text = f"{type(e).__name__}: {e}"
            if not isinstance(e, AssertionError):
                text += "\n" + "".join(traceback.format_exception(e)[-4:-1])
            if len(text) > 1500:
                text = text[:1500] + " ..."
            self.failures.setdefault(group, []).append(f"[rank {self.rank}] {label}: {text}")
            report(("fail", group, label, f"[rank {self.rank}] {label}: {text}"))
        else:
            self.passed[group] = self.passed.get(group, 0) + 1
            report(("pass", group, label, None))

    def na(self, group, reason):
        self.not_applicable[group] = reason
        report(("na", group, None, reason))

    def gloo_gap(self, what, fn):
        """Run fn; if the backend is gloo and it raises, that is a known Gloo gap (skip), else re-raise."""
        try:
            return fn()
        except Exception as e:
            if self.backend == "gloo":
                raise GlooGap(f"gloo lacks {what}: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from e
            raise

    def result(self):
        return {
            "failures": self.failures,
            "skips": self.skips,
            "na": self.not_applicable,
            "passed": self.passed,
            "digests": self.digests,
        }


def rop(op):
    return getattr(dist.ReduceOp, op)


def work_or_clear_error(fn, keywords, what):
    """Run fn; return True when it worked, False when it raised an error naming the cause.

    `keywords`: regex that a clear message must match (re.I). Any other exception is a failure.
    """
    try:
        fn()
        return True
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        if re.search(keywords, msg, re.I):
            return False
        raise AssertionError(f"{what}: neither worked nor raised a clear error (/{keywords}/): {type(e).__name__}: {msg[:400]}") from e


def summary_from_reports(reports: list) -> dict:
    """Rebuild Sweep.result() (without digests) from the partial reports one rank sent before a run failed."""
    out = {"failures": {}, "skips": {}, "na": {}, "passed": {}, "digests": {}}
    for outcome, group, label, text in reports:
        if outcome == "pass":
            out["passed"][group] = out["passed"].get(group, 0) + 1
        elif outcome == "fail":
            out["failures"].setdefault(group, []).append(text)
        elif outcome == "skip":
            out["skips"].setdefault(group, []).append(f"{label}: {text}")
        elif outcome == "na":
            out["na"][group] = text
    return out
