"""Where the CPU goes while a benchmark runs: samples every thread of every process whose command line
contains --match, and the machine's busy cores, while COMMAND runs.

    python3 benchmarks/gpu_host/thread_cpu.py --match fleet_ddp --out cpu.csv -- python3 benchmarks/fleet_ddp.py ...

Writes one CSV row per sample and thread group (time s, group, cores busy = CPU seconds / interval), where a
group is the thread's name with digits dropped (mccl-progress, mccl-sender, python3, pt_autograd_, ...), summed
over the matching processes; the group "machine" is the whole machine's busy cores (/proc/stat). Prints the
mean cores of each group over the samples in which the machine was at least half as busy as at its peak (the
timed steps, not the start-up), so a run shows whether the engine's threads or the machine's cores are the limit.
"""
from __future__ import annotations

import argparse
import collections
import csv
import os
import re
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / TICK


def threads(match: str) -> dict:
    """(pid, tid) -> (group, cpu seconds) for the threads of matching processes."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if match.encode() not in f.read():
                    continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                rest = stat[stat.rindex(")") + 2:].split()
                out[(pid, tid)] = (re.sub(r"\d+", "", name), (float(rest[11]) + float(rest[12])) / TICK)
        except (OSError, ValueError):
            continue
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--match", required=True)
    p.add_argument("--interval", type=float, default=0.5)
    p.add_argument("--out", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    child = subprocess.Popen(cmd)
    t0 = time.monotonic()
    prev, prev_busy, rows = threads(args.match), machine_busy(), []
    while child.poll() is None:
        time.sleep(args.interval)
        now, busy = threads(args.match), machine_busy()
        t = time.monotonic() - t0
        groups = collections.Counter()
        for key, (group, cpu) in now.items():
            groups[group] += cpu - prev.get(key, (group, 0.0))[1]
        groups["machine"] = busy - prev_busy
        rows += [(round(t, 2), g, round(v / args.interval, 3)) for g, v in sorted(groups.items())]
        prev, prev_busy = now, busy
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time_s", "group", "cores"])
        w.writerows(rows)
    by_t = collections.defaultdict(dict)
    for t, g, v in rows:
        by_t[t][g] = v
    peak = max((d.get("machine", 0.0) for d in by_t.values()), default=0.0)
    window = [d for d in by_t.values() if d.get("machine", 0.0) >= 0.5 * peak]
    print(f"{args.out}: {len(window)} samples of {args.interval} s with the machine at least half as busy as at "
          f"its peak ({peak:.1f} cores); mean busy cores:")
    totals = collections.Counter()
    for d in window:
        totals.update(d)
    for g, v in totals.most_common(12):
        print(f"  {g:24s} {v / max(len(window), 1):6.2f}")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
