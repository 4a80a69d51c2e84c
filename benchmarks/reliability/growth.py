"""Does a resource grow? The verdict the soak gives for each rank's RSS, fds and threads.

Samples of one phase are split into a warm-up (the first `warmup` fraction: allocator pools, the completion
pool's threads, torch's lazily built state) and the rest. The growth is the median of the last quarter of the
rest minus the median of its first quarter (medians, so one sample taken while a large buffer was alive does
not decide), and the maximum after warm-up is reported beside it. A resource is flat when its growth is at most
its tolerance: `rss_kb` a few MiB (the allocator may keep some of what the largest collective used), file
descriptors and threads exactly 0.
"""
from __future__ import annotations

import statistics

DEFAULT_TOLERANCE = {"rss_kb": 16 * 1024, "fds": 0, "threads": 0}


def growth(values: list, warmup: float = 0.2) -> dict:
    """first, after_warmup, last, max, growth of one resource's samples (in order)."""
    values = [v for v in values if v is not None]
    if not values:
        return {"first": None, "after_warmup": None, "last": None, "max": None, "growth": None}
    rest = values[int(len(values) * warmup):] or values[-1:]
    q = max(1, len(rest) // 4)
    base = statistics.median(rest[:q])
    end = statistics.median(rest[-q:])
    return {"first": values[0], "after_warmup": base, "last": values[-1], "max": max(rest), "growth": end - base}


def verdict(samples: list, tolerance: dict | None = None, warmup: float = 0.2) -> dict:
    """samples: dicts with rss_kb, fds, threads (in order). Returns {resource: growth(...) + flat}, flat."""
    tol = dict(DEFAULT_TOLERANCE, **(tolerance or {}))
    out = {}
    for key, limit in tol.items():
        g = growth([s.get(key) for s in samples], warmup)
        g["tolerance"] = limit
        g["flat"] = g["growth"] is not None and g["growth"] <= limit
        out[key] = g
    out["flat"] = all(out[k]["flat"] for k in tol)
    return out
