"""The small-message latency of a commit: a 4 KiB allreduce on 4 local ranks, mccl interleaved with Gloo in the
same processes, with the extension built from that commit. For bisecting a latency regression.

    python benchmarks/latency_bisect.py 0ffc1d7 HEAD          # one line per commit (built in /tmp/mccl-bisect)
    python benchmarks/latency_bisect.py --here                # this tree as it is (src/, built in place)
    git bisect start --no-checkout HEAD 0ffc1d7 -- csrc setup.py
    git bisect run python benchmarks/latency_bisect.py --quiet 0.9 --repeat 2 --above-us 140 BISECT_HEAD
    git bisect reset

A commit's tree is checked out with `git worktree add --detach` into /tmp/mccl-bisect/<sha> (kept, so a second
run skips the build), built there with `setup.py build_ext --inplace` by this Python, and its ranks import
lightning_mccl from there. The measurement is this file's and benchmarks/sweep's (the timing of
benchmarks/allreduce.py: barrier, then back-to-back calls for 20 ms, the slowest rank's time per call,
repetitions alternating between the series), so every commit is measured alike. The CPU columns give the CPU
time per call summed over the ranks (spinning included: `--env MCCL_SPIN_US=0` leaves only the work). Each line
gives the load average before the measurement and the share of the CPUs idle in the 2 s (with --quiet, 5 s)
before it: on a shared machine, latencies taken with a load above ~1.5 (or less than ~90% idle) are noise;
--quiet 0.9 waits for a quiet moment.
With --above-us the exit code says whether the (one) commit's mccl median (the least of --repeat measurements) is
above that (1) or not (0), as `git bisect run` reads it; a commit that does not build is skipped (125).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TREES = os.path.join(tempfile.gettempdir(), "mccl-bisect")
SKIP = 125  # git bisect run: this commit cannot be tested


def build(commit: str) -> str:
    """The src/ folder of `commit`'s tree with its extension built; raises CalledProcessError if it does not build."""
    sha = subprocess.check_output(["git", "-C", REPO, "rev-parse", "--short=10", commit], text=True).strip()
    tree = os.path.join(TREES, sha)
    if not os.path.isdir(tree):
        os.makedirs(TREES, exist_ok=True)
        subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", "-q", tree, sha], check=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                   stdout=subprocess.DEVNULL)
    return os.path.join(tree, "src")


def idle_share(seconds: float = 2.0) -> float:
    """The share of this machine's CPU time that was idle over the next `seconds` (Linux; nan elsewhere): what the
    other users of a shared machine leave, read just before a measurement."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    try:
        idle0, all0 = sample()
        time.sleep(seconds)
        idle1, all1 = sample()
    except OSError:
        return float("nan")
    return (idle1 - idle0) / max(1, all1 - all0)


def wait_until_idle(share: float, limit_s: float = 3600.0) -> float:
    """Waits (at most limit_s) until `share` of the CPUs was idle over 5 s; returns the last share read."""
    start = time.monotonic()
    while True:
        idle = idle_share(5.0)
        if not idle < share or time.monotonic() - start > limit_s:  # nan: cannot tell, do not wait
            return idle
        time.sleep(10.0)


def measure(src: str, nproc: int, size: int, env: dict, timeout_s: float) -> dict:
    """Runs the ranks with lightning_mccl from `src`; rank 0's result: median, min, max per series, in us."""
    from lightning_mccl.launcher import free_port  # this tree's (here, not in the ranks: theirs is `src`'s)

    port = free_port()
    procs = []
    with tempfile.NamedTemporaryFile("r", suffix=".json") as result:
        for rank in range(nproc):
            rank_env = dict(os.environ, **env, PYTHONPATH=os.pathsep.join([src, HERE]), MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(nproc), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, __file__, "--rank-of", str(size), result.name],
                                          env=rank_env))
        try:
            codes = [p.wait(timeout=timeout_s) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(codes):
            raise RuntimeError(f"a rank failed (exit codes {codes})")
        return json.load(result)


def rank_main(size: int, result_path: str) -> None:
    """One rank: the measurement, timed as benchmarks/allreduce.py times it."""
    import torch
    import torch.distributed as dist

    from sweep.ops import Buffers
    from sweep.rank import dist_max_reduce, init_groups, interleaved_times
    from sweep.series import parse_series

    series = parse_series("mccl,gloo")
    groups = init_groups(series, 120.0)
    bufs = Buffers("allreduce", size // 4, dist.get_rank(), dist.get_world_size(), torch.float32)
    bufs.fill_input()
    for s in series:  # first call checked: a commit that computes the wrong sum is no data point
        bufs.fill_input()
        bufs.run(groups[s.label])
        if bufs.check() > bufs.default_rtol():
            raise SystemExit(f"{s.label}: wrong allreduce result")
    bufs.prepare_timing()
    calls = [0] * len(series)

    def run(k, g):
        bufs.run(g)
        calls[k] += 1

    runs = [(lambda k=k, g=groups[s.label]: run(k, g), lambda g=groups[s.label]: dist.barrier(group=g))
            for k, s in enumerate(series)]
    counted = []  # per series: this process's CPU seconds and calls over the timed batches
    times = interleaved_times(runs, warmup=3, iters=40, min_iters=10, budget_s=4.0, max_reduce=dist_max_reduce,
                              counters=lambda: (time.process_time(), *calls), counted=counted)
    cpu = torch.tensor([c[0] / c[1 + k] for k, c in enumerate(counted)], dtype=torch.float64)
    dist.all_reduce(cpu)  # the sum over the ranks: the host's CPU time per call
    if dist.get_rank() == 0:
        out = {s.label: [statistics.median(t) * 1e6, min(t) * 1e6, max(t) * 1e6, float(c) * 1e6]
               for s, t, c in zip(series, times, cpu)}
        with open(result_path, "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/latency_bisect.py", description=__doc__.split("\n\n")[0])
    p.add_argument("commits", nargs="*", help="commits to build and measure, in turn")
    p.add_argument("--here", action="store_true", help="measure this tree's src/ too, first (build it yourself)")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--size", type=int, default=4096, help="bytes (default: %(default)s)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL", help="for every rank; repeatable")
    p.add_argument("--above-us", type=float, default=None, help="exit 1 if the mccl median is above this (bisect)")
    p.add_argument("--repeat", type=int, default=1, help="measurements per commit (default: %(default)s)")
    p.add_argument("--quiet", type=float, default=None, metavar="SHARE",
                   help="before each measurement, wait (up to an hour) until this share of the CPUs was idle over 5 s")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement")
    p.add_argument("--rank-of", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rank_of:
        rank_main(int(args.rank_of[0]), args.rank_of[1])
        return 0
    targets = ([("here", os.path.join(REPO, "src"))] if args.here else []) + [(c, None) for c in args.commits]
    if not targets or (args.above_us is not None and len(targets) != 1):
        p.error("give commits to measure, or --here, or both (--above-us: exactly one)")
    env = dict(item.split("=", 1) for item in args.env)
    print(f"{'commit':12} {'load':>5} {'idle':>5} {'mccl us (median, min-max)':>28} {'gloo us':>9} {'mccl/gloo':>9} "
          f"{'mccl CPU us':>11} {'gloo CPU us':>11}", flush=True)
    medians = []
    for name, src in targets:
        try:
            src = src or build(name)
        except subprocess.CalledProcessError as e:
            print(f"{name:12} does not build ({e})", flush=True)
            return SKIP if args.above_us is not None else 1
        for _ in range(args.repeat):
            idle = wait_until_idle(args.quiet) if args.quiet else idle_share()
            load = os.getloadavg()[0]
            r = measure(src, args.nproc, args.size, env, args.timeout)
            medians.append(r["mccl"][0])
            print(f"{name[:12]:12} {load:5.2f} {idle:5.0%} {medians[-1]:9.1f} "
                  f"{'(%.1f-%.1f)' % tuple(r['mccl'][1:3]):>18} {r['gloo'][0]:9.1f} {medians[-1] / r['gloo'][0]:9.4f} "
                  f"{r['mccl'][3]:11.1f} {r['gloo'][3]:11.1f}", flush=True)
    if args.above_us is not None:  # a busy moment only adds time: the best of the repetitions counts
        return 1 if min(medians) > args.above_us else 0
    return 0

if __name__ == "__main__":
    sys.exit(main())
