"""The machine's per-CPU load and packet processing over a step, to tell whether a slow step had a CPU
saturated by the kernel's network work (the emulated switch's veths and shapers run in softirq, on whichever
CPU the traffic lands), which the machine-wide busy count hides.

Read from /proc/stat and /proc/net/softnet_stat, which are the machine's, not a namespace's: every rank reads
the same values, so one rank's are enough. Elsewhere (macOS) every counter reads 0.

    busy_cores      CPU time not idle over the step, in cores (16 = all 16 busy)
    softirq_cores   of it, in interrupts and softirqs (the network stack's receive and transmit work)
    max_busy        the busiest CPU's busy fraction (1.0 = saturated)
    max_softirq     the largest fraction one CPU spent in interrupts and softirqs
    squeezed        times a CPU's receive processing ran out of its budget and left packets for later
                    (softnet time_squeeze): the softirq work moved to ksoftirqd, a thread like any other
    backlog_drops   packets dropped because a CPU's input backlog was full (softnet dropped)
"""
from __future__ import annotations

import os
import time
from typing import Dict, Iterable, List, Tuple

FIELDS = ("busy_cores", "softirq_cores", "max_busy", "max_softirq", "squeezed", "backlog_drops")
Snapshot = Tuple[List[Tuple[int, int, int]], int, int, float]  # per CPU (total, busy, softirq) ticks; softnet; time


def _cpus() -> List[Tuple[int, int, int]]:
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu") and line[3:4].isdigit()]
    except OSError:
        return []
    out = []
    for fields in lines:
        v = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
        total = sum(v)
        out.append((total, total - v[3] - v[4], v[5] + v[6]))
    return out


def _softnet() -> Tuple[int, int]:
    """(time_squeeze, dropped) summed over the CPUs (hexadecimal columns 3 and 2 of softnet_stat)."""
    try:
        with open("/proc/net/softnet_stat") as f:
            rows = [line.split() for line in f]
    except OSError:
        return 0, 0
    return sum(int(r[2], 16) for r in rows), sum(int(r[1], 16) for r in rows)


def read() -> Snapshot:
    squeezed, dropped = _softnet()
    return _cpus(), squeezed, dropped, time.monotonic()


def delta(before: Snapshot, after: Snapshot) -> Tuple[float, ...]:
    """The counters between two snapshots, in FIELDS order."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = max(after[3] - before[3], 1e-9)
    busy = softirq = max_busy = max_softirq = 0.0
    for (t0, b0, s0), (t1, b1, s1) in zip(before[0], after[0]):
        busy += (b1 - b0) / tick / seconds
        softirq += (s1 - s0) / tick / seconds
        if t1 > t0:
            max_busy = max(max_busy, (b1 - b0) / (t1 - t0))
            max_softirq = max(max_softirq, (s1 - s0) / (t1 - t0))
    return busy, softirq, max_busy, max_softirq, float(after[1] - before[1]), float(after[2] - before[2])


def columns(values: Iterable[float]) -> Dict[str, float]:
    """Values in FIELDS order as result columns: cpu_busy_cores, cpu_softirq_cores, ..."""
    return {f"cpu_{f}": round(float(v), 3) for f, v in zip(FIELDS, values)}
