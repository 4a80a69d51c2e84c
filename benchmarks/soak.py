"""Soak: thousands of mixed collectives, then 1,000 init/destroy cycles; memory, fds and threads stay flat.

    python benchmarks/soak.py                                   # 4 ranks, 5000 collectives, 1000 cycles
    python benchmarks/soak.py --collectives 200 --cycles 20 --out soak.json

Every rank samples its VmRSS, open file descriptors and threads (/proc/self) as it goes; after a warm-up
each must be flat: RSS growth within --rss-tolerance-mb, fds and threads exactly unchanged (see
reliability/growth.py for how growth is measured). Every collective's result is checked exactly too.
Prints a table per phase, writes the samples and verdicts to --out (JSON), exits 1 unless all is flat
and right.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lightning_mccl.testing import Cluster, context_started, now  # noqa: E402
from reliability.growth import verdict  # noqa: E402
from reliability.soak_ranks import soak  # noqa: E402

PHASES = ("mixed", "cycles")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--collectives", type=int, default=5000, help="mixed collectives (default 5000)")
    p.add_argument("--cycles", type=int, default=1000, help="init/destroy cycles (default 1000)")
    p.add_argument("--max-bytes", type=int, default=16 << 20, help="largest buffer of a mixed collective")
    p.add_argument("--samples", type=int, default=100, help="samples per phase and rank")
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of each phase not judged (default 0.2)")
    p.add_argument("--rss-tolerance-mb", type=float, default=16.0)
    p.add_argument("--timeout", type=float, default=60.0, help="process-group timeout (s)")
    p.add_argument("--deadline", type=float, default=3600.0, help="the whole soak must end within this (s)")
    p.add_argument("--malloc-mmap-threshold", type=int, default=128 << 10,
                   help="glibc's M_MMAP_THRESHOLD for the ranks (MALLOC_MMAP_THRESHOLD_), so that RSS shows live "
                        "memory, not glibc's cache of freed buffers; 0 leaves glibc's adaptive default")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write samples and verdicts here (JSON)")
    return p.parse_args(argv)


def run(args) -> dict:
    if args.malloc_mmap_threshold:
        # read by glibc when a process starts: it must be in the fork server's environment (ranks are its forks)
        if context_started():
            raise SystemExit("soak: the rank fork server is already running; --malloc-mmap-threshold cannot apply")
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
    kwargs = dict(collectives=args.collectives, cycles=args.cycles, seed=args.seed,
                  max_elems=max(2, args.max_bytes // 4), samples=args.samples)
    t0 = time.monotonic()
    with Cluster(soak, args.nproc, pg_timeout_s=args.timeout, kwargs=kwargs) as c:
        finished = c.wait_until(lambda c: all(c.latest(r, "done") or c.latest(r, "uncaught") or c.exited(r)
                                              for r in range(args.nproc)), now() + args.deadline)
        c.poll(0.1)
        samples = {r: {ph: [f for rr, k, f in c.events if rr == r and k == "sample" and f["phase"] == ph]
                       for ph in PHASES} for r in range(args.nproc)}
        seconds = {ph: max((f["seconds"] for r, k, f in c.events if k == "phase" and f["phase"] == ph), default=None)
                   for ph in PHASES}
        problems = {}
        for r in range(args.nproc):
            if c.latest(r, "uncaught"):
                problems[r] = "raised: " + c.latest(r, "uncaught")["message"][:500]
            elif not c.latest(r, "done"):
                problems[r] = "did not finish before the deadline" if not finished else f"exit code {c.exitcode(r)}"
            elif c.latest(r, "done")["wrong"]:
                problems[r] = "wrong results: " + "; ".join(c.latest(r, "done")["wrong"][:3])
    tol = {"rss_kb": int(args.rss_tolerance_mb * 1024)}
    verdicts = {r: {ph: verdict(samples[r][ph], tol, args.warmup) for ph in PHASES if samples[r][ph]}
                for r in range(args.nproc)}
    flat = all(v["flat"] for per in verdicts.values() for v in per.values())
    return {"config": vars(args), "elapsed_s": round(time.monotonic() - t0, 1), "phase_seconds": seconds,
            "problems": problems, "verdicts": verdicts, "flat": flat, "ok": flat and not problems,
            "samples": samples}


def table(result: dict) -> str:
    lines = []
    cfg = result["config"]
    for ph in PHASES:
        per = {r: v[ph] for r, v in result["verdicts"].items() if ph in v}
        if not per:
            continue
        what = f"{cfg['collectives']} mixed collectives" if ph == "mixed" else f"{cfg['cycles']} init/destroy cycles"
        secs = result["phase_seconds"].get(ph)
        lines.append(f"{what} on {cfg['nproc']} ranks" + (f" ({secs:.1f} s)" if secs else ""))
        lines.append("  rank  RSS MiB first/after warm-up/last/max (growth)     fds first/last/max  "
                     "threads first/last/max  flat")
        for r, v in sorted(per.items()):
            m, f, t = v["rss_kb"], v["fds"], v["threads"]
            mib = lambda x: f"{x / 1024:.1f}"  # noqa: E731
            lines.append(f"  {r:>4}  {mib(m['first'])}/{mib(m['after_warmup'])}/{mib(m['last'])}/{mib(m['max'])} "
                         f"({m['growth'] / 1024:+.1f})".ljust(55)
                         + f"{f['first']}/{f['last']}/{f['max']}".ljust(20)
                         + f"{t['first']}/{t['last']}/{t['max']}".ljust(24) + ("yes" if v["flat"] else "NO"))
    for r, p in sorted(result["problems"].items()):
        lines.append(f"  rank {r}: {p}")
    lines.append(f"total {result['elapsed_s']} s: " + ("flat, every result right" if result["ok"] else "FAILED"))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
