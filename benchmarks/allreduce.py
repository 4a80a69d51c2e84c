"""nccl-tests-style sweep of a collective over message sizes: mccl against Gloo, interleaved in one run.

    python benchmarks/allreduce.py --nproc 4                              # loopback, 4 KiB .. 256 MiB
    python benchmarks/allreduce.py --hosts 4 --rate 1gbit                 # 4 emulated hosts (Linux, root)
    python benchmarks/allreduce.py --op allgather --min 64K --max 16M --step-factor 4
    python benchmarks/allreduce.py --op all                               # every collective, one launch
    python benchmarks/allreduce.py --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:rtol=3e-2,gloo
    python benchmarks/allreduce.py --op allreduce,allreduce_int8 --series mccl,mccl:MCCL_WIRE_DTYPE=bf16:rtol=3e-2:label=bf16

For every size, each series first runs the collective once on known inputs and is checked against a float64
reference; then the series take turns, repetition by repetition, each timed as barrier + one collective,
the slowest rank's time counting. Reported: median, min and max time, algbw = size / median and busbw =
algbw x the nccl-tests factor of the op (allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n;
broadcast, reduce 1), GB/s = 1e9 bytes/s. Output: a table on stdout, and results.csv, results.md, results.png in
--out (default runs/bench/<op>-<time>). Exit code 1 if any result was wrong.
--op takes a comma-separated list (or `all`): the ops then run one after the other in the same ranks.

--hosts N --rate R runs the ranks in N hosts of a throwaway emulated switch (`lightning_mccl.switch`: network
namespaces on a bridge, links shaped with tc tbf, no latency emulation), --switch TAG in a switch that is up.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from lightning_mccl.switch import DEFAULT_CONGESTION  # noqa: E402
from sweep import report  # noqa: E402
from sweep.ops import OPS  # noqa: E402
from sweep.series import Series, launch_groups, parse_series  # noqa: E402
from sweep.sizes import parse_size, size_sweep  # noqa: E402

DTYPES = ("float32", "float16", "bfloat16", "float64")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/allreduce.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="allreduce",
                   help=f"collective(s), comma-separated, or all: {', '.join(OPS)} (default: %(default)s)")
    p.add_argument("--series", default=None,
                   help="comma-separated BACKEND[:ENV=VAL][:label=L][:rtol=X] (default: mccl,gloo)")
    p.add_argument("--backends", default=None,
                   help="plain list of backends: mccl, gloo, mpi4py (loopback only, by mpirun, TCP)")
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: 4, or one per emulated host)")
    p.add_argument("--hosts", type=int, default=None, help="run on a throwaway emulated switch of N hosts")
    p.add_argument("--rate", default="1gbit", help="link rate of the emulated hosts (default: %(default)s)")
    p.add_argument("--burst", default=None, help="tbf bucket of the emulated links (default: by rate)")
    p.add_argument("--congestion", default=DEFAULT_CONGESTION,
                   help="the emulated hosts' TCP congestion control; 'system': the machine's (default: %(default)s)")
    p.add_argument("--switch", default=None, metavar="TAG", help="run on the emulated switch TAG that is up")
    p.add_argument("--min", dest="min_size", default="4K", help="smallest size (default: %(default)s)")
    p.add_argument("--max", dest="max_size", default="256M", help="largest size (default: %(default)s)")
    p.add_argument("--step-factor", type=int, default=2, help="size multiplier (default: %(default)s)")
    p.add_argument("--sizes", default=None, help="explicit comma-separated sizes instead of min/max/step")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--iters", type=int, default=20, help="timed repetitions at most (default: %(default)s)")
    p.add_argument("--min-iters", type=int, default=5, help="timed repetitions at least (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions (default: %(default)s)")
    p.add_argument("--time-budget", type=float, default=3.0,
                   help="seconds of timed repetitions per size, all series together (default: %(default)s)")
    p.add_argument("--baseline", default="gloo", help="series the others are compared to (default: gloo)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL", help="for every rank; repeatable")
    p.add_argument("--out", default=None, help="output directory (default: runs/bench/<op>-<time>)")
    p.add_argument("--timeout", type=float, default=3600.0, help="limit for each launch, seconds")
    p.add_argument("--pg-timeout", type=float, default=600.0, help="process group timeout, seconds")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker(args.worker)
    # SIGTERM as an exception: the ranks are stopped and a throwaway switch is taken down on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = lambda m: sys.stderr.write(f"bench: {m}\n")  # noqa: E731
    try:
        ops = parse_ops(args.op)
        series = _series(args)
        sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else \
            size_sweep(parse_size(args.min_size), parse_size(args.max_size), args.step_factor)
    except ValueError as e:
        build_parser().error(str(e))
    nproc = args.nproc or args.hosts or 4
    if nproc < 2:
        build_parser().error("--nproc: a collective benchmark needs at least 2 ranks")
    name = ops[0] if len(ops) == 1 else "collectives"
    out = args.out or report.default_out_dir(name)
    os.makedirs(out, exist_ok=True)

    from sweep.launch import LaunchFailed, placement

    rows = []
    try:
        with placement(nproc, args.hosts, args.rate, args.switch, args.burst, log=log,
                       congestion=args.congestion) as where:
            header = report.machine_header(argv, where.describe())
            link_gbps = where.link_goodput_gbps()
            for k, group in enumerate(launch_groups(series)):
                spec = {"ops": ops, "sizes": sizes, "dtype": args.dtype, "series": [s.to_json() for s in group],
                        "iters": args.iters, "min_iters": args.min_iters, "warmup": args.warmup,
                        "budget_s": args.time_budget, "pg_timeout": args.pg_timeout,
                        "result": os.path.abspath(os.path.join(out, f".launch{k}.json"))}
                log(f"{', '.join(ops)}: {', '.join(s.label for s in group)} on {where.describe()}")
                rows += where.run_worker(__file__, spec, group, timeout=args.timeout,
                                         mpi=group[0].backend == "mpi4py")["rows"]
    except (LaunchFailed, ValueError, RuntimeError) as e:
        log(str(e))
        return 1
    rows = finish_rows(rows, [s.label for s in series], args.baseline)
    write_outputs(out, rows, header, ops, [s.label for s in series], args.baseline, log, link_gbps)
    bad = [r for r in rows if r["correct"] != "yes"]
    for r in bad:
        log(f"WRONG RESULT: {r['series']} {r['op']} of {report.human_size(r['size_bytes'])}: max relative "
            f"error {r['max_rel_err']} > rtol {r['rtol']}")
    return 1 if bad else 0


def parse_ops(text: str) -> list:
    ops = list(OPS) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        raise ValueError(f"--op {text!r}: unknown {', '.join(unknown) or 'empty'} (use {', '.join(OPS)} or all)")
    return list(dict.fromkeys(ops))


def _series(args) -> list:
    env = {}
    for item in args.env:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ValueError(f"--env {item!r}: write KEY=VALUE")
        env[k] = v
    if args.series and args.backends:
        raise ValueError("give --series or --backends, not both")
    text = args.series or args.backends or "mccl,gloo"
    series = parse_series(text, env)
    if any(s.backend == "mpi4py" for s in series):
        from sweep import mpi

        if not mpi.available():
            raise ValueError("series mpi4py: `import mpi4py` fails here (pip install mpi4py, with an MPI library "
                             "such as Open MPI installed)")
        if args.dtype == "bfloat16":
            raise ValueError("series mpi4py: MPI has no bfloat16; use another --dtype")
    return series


# -- the ranks ------------------------------------------------------------------------------------------------


def worker(spec_path: str) -> int:
    import torch

    with open(spec_path) as f:
        spec = json.load(f)
    series = [Series.from_json(s) for s in spec["series"]]
    dtype = getattr(torch, spec["dtype"])
    if series[0].backend == "mpi4py":
        return mpi_worker(spec, series, dtype)
    import torch.distributed as dist

    from sweep.rank import dist_max_reduce, dist_sum_over_hosts, init_groups

    groups = init_groups(series, spec["pg_timeout"])
    rows = []
    for op in spec["ops"]:
        those = runs_op(op, series)
        for size in spec["sizes"] if those else []:
            runners = {s.label: (lambda bufs, g=groups[s.label]: bufs.run(g),
                                 lambda g=groups[s.label]: dist.barrier(group=g)) for s in those}
            rows += measure(op, size, those, runners, dist_max_reduce, dist.get_rank(), dist.get_world_size(),
                            spec, dtype, sum_reduce=dist_sum_over_hosts)
    if dist.get_rank() == 0:
        _write_result(spec, rows)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def mpi_worker(spec: dict, series: list, dtype) -> int:
    from sweep import mpi

    c = mpi.comm()
    rows = []
    for op in spec["ops"]:
        for size in spec["sizes"] if runs_op(op, series) else []:
            runners = {s.label: (lambda bufs, op=op: mpi.run(op, bufs, c), c.Barrier) for s in series}
            rows += measure(op, size, series, runners, mpi.max_reduce(c), c.Get_rank(), c.Get_size(), spec, dtype)
    if c.Get_rank() == 0:
        _write_result(spec, rows)
    c.Barrier()
    return 0


def runs_op(op: str, series: list) -> list:
    """The series that run `op`: allreduce_int8 is mccl's alone (the others are skipped, said once)."""
    from sweep.rank import say

    if op != "allreduce_int8":
        return list(series)
    those = [s for s in series if s.backend == "mccl"]
    skipped = [s.label for s in series if s.backend != "mccl"]
    if skipped:
        say(f"allreduce_int8 is mccl's 8-bit allreduce: not run by {', '.join(skipped)}")
    return those


def _write_result(spec: dict, rows: list) -> None:
    with open(spec["result"], "w") as f:
        json.dump({"rows": rows}, f)


def measure(op: str, size: int, series, runners: dict, max_reduce, rank: int, world: int, spec: dict,
            dtype, sum_reduce=None) -> list:
    """One op at one size: check every series once, then time them interleaved. runners[label] = (run(bufs),
    barrier()). Returns the rows (every rank has the same, through max_reduce). With sum_reduce (the sum over
    hosts), also each series' TCP losses and closed windows during its timed calls (tcp_counters.py)."""
    import torch

    from sweep import tcp_counters
    from sweep.ops import Buffers, element_count
    from sweep.rank import interleaved_times, say, summarize

    count = element_count(op, size, world, torch.tensor([], dtype=dtype).element_size())
    if count == 0:
        say(f"{op} {report.human_size(size)}: too small for {world} ranks of {spec['dtype']}, skipped")
        return []
    bufs = Buffers(op, count, rank, world, dtype)
    errors = torch.zeros(len(series), dtype=torch.float64)
    for k, s in enumerate(series):
        bufs.fill_input()
        runners[s.label][0](bufs)
        errors[k] = bufs.check()
    max_reduce(errors)
    bufs.prepare_timing()
    runs = [(lambda run=runners[s.label][0]: run(bufs), runners[s.label][1]) for s in series]
    counted = [] if sum_reduce else None
    times = interleaved_times(runs, warmup=spec["warmup"], iters=spec["iters"], min_iters=spec["min_iters"],
                              budget_s=spec["budget_s"], max_reduce=max_reduce, counters=tcp_counters.read,
                              counted=counted)
    tcp = torch.tensor(counted or [[0.0] * len(tcp_counters.FIELDS)] * len(series), dtype=torch.float64)
    if sum_reduce:
        sum_reduce(tcp)
    rows, line = [], []
    for k, s in enumerate(series):
        rtol = s.rtol if s.rtol is not None else bufs.default_rtol()
        row = {"op": op, "size_bytes": bufs.size_bytes, "count": count, "dtype": spec["dtype"], "world": world,
               "series": s.label, "backend": s.backend, **summarize(times[k]),
               "max_rel_err": float(errors[k]), "rtol": rtol, "correct": "yes" if errors[k] <= rtol else "NO"}
        if sum_reduce:
            row.update(tcp_counters.columns(tcp[k].tolist()))
        rows.append(row)
        line.append(f"{s.label} {row['time_median_s'] * 1e6:.1f} us")
    say(f"{op} {report.human_size(bufs.size_bytes)}: " + ", ".join(line))
    return rows


# -- the report -----------------------------------------------------------------------------------------------


def finish_rows(rows: list, labels: list, baseline: str) -> list:
    """Adds algbw, busbw (GB/s) and the speedup over the baseline series (its time / this time)."""
    base = {(r["op"], r["size_bytes"]): r["time_median_s"] for r in rows if r["series"] == baseline}
    ops = list(dict.fromkeys(r["op"] for r in rows))
    out = []
    for r in sorted(rows, key=lambda r: (ops.index(r["op"]), r["size_bytes"], labels.index(r["series"]))):
        algbw = r["size_bytes"] / r["time_median_s"] / 1e9
        r = dict(r, algbw_gbps=algbw, busbw_gbps=algbw * OPS[r["op"]].bus_factor(r["world"]))
        b = base.get((r["op"], r["size_bytes"]))
        r[f"speedup_vs_{baseline}"] = (b / r["time_median_s"]) if b and r["series"] != baseline else ""
        out.append(r)
    return out


def result_table(rows: list, baseline: str, with_op: bool) -> report.Table:
    cols = (["op"] if with_op else []) + [
        "size", "series", "iters", "time us (median)", "min", "max", "algbw GB/s", "busbw GB/s", f"vs {baseline}",
        "correct"]
    cells = []
    for r in rows:
        sp = r[f"speedup_vs_{baseline}"]
        cells.append(([r["op"]] if with_op else []) + [
            report.human_size(r["size_bytes"]), r["series"], str(r["iters"]), f"{r['time_median_s'] * 1e6:.1f}",
            f"{r['time_min_s'] * 1e6:.1f}", f"{r['time_max_s'] * 1e6:.1f}", f"{r['algbw_gbps']:.3f}",
            f"{r['busbw_gbps']:.3f}", f"{sp:.2f}x" if sp != "" else "",
            "yes" if r["correct"] == "yes" else f"NO ({r['max_rel_err']:.1e})"])
    return cols, cells


BUS_FACTORS = {"allreduce": "2(n-1)/n", "allreduce_int8": "2(n-1)/n", "broadcast": "1", "reduce": "1"}


def write_outputs(out: str, rows: list, header: dict, ops: list, labels: list, baseline: str, log,
                  link_gbps=None) -> None:
    world = rows[0]["world"] if rows else 0
    factors = "; ".join(f"{op} {BUS_FACTORS.get(op, '(n-1)/n')}" for op in ops)
    notes = [f"time: barrier, then back-to-back collectives for at least 20 ms (one when it takes longer), "
             f"per call; the slowest rank's time; median (min, max) over the repetitions. algbw = size / median time; busbw = algbw x the nccl-tests factor ({factors}); "
             f"GB/s = 1e9 B/s. vs {baseline}: {baseline}'s median time / this series' (above 1: faster than "
             f"{baseline})."]
    table = result_table(rows, baseline, len(ops) > 1)
    title = f"{', '.join(ops)}, {rows[0]['dtype'] if rows else ''}, {world} ranks"
    report.write_csv(os.path.join(out, "results.csv"), rows)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.markdown(title, header, table, notes))
    sizes = sorted({r["size_bytes"] for r in rows})
    ticks = (sizes, [report.human_size(s).replace(" ", "") for s in sizes])
    lines = {}
    for op in ops:
        for lab in labels:
            rs = [r for r in rows if r["series"] == lab and r["op"] == op]
            if rs:
                lines[lab if len(ops) == 1 else f"{op} {lab}"] = rs
    panels = [
        {"ylabel": "busbw GB/s", "xlabel": "size", "logx": True, "xticks": ticks,
         "hlines": [(link_gbps, "link TCP goodput (0.956 x rate)")] if link_gbps else [],
         "series": {k: ([r["size_bytes"] for r in rs], [r["busbw_gbps"] for r in rs]) for k, rs in lines.items()}},
        {"ylabel": "time us (median)", "xlabel": "size", "logx": True, "logy": True, "xticks": ticks,
         "series": {k: ([r["size_bytes"] for r in rs], [r["time_median_s"] * 1e6 for r in rs])
                    for k, rs in lines.items()}},
    ]
    why = report.plot(os.path.join(out, "results.png"), f"{title}: {header['where']}", panels)
    if why:
        log(why)
    report.print_table(f"{title} ({header['where']})", table, notes)
    log(f"wrote {out}/results.csv, results.md{'' if why else ', results.png'}")


if __name__ == "__main__":
    sys.exit(main())
