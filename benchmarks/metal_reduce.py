"""Metal reduction against the engine's CPU reducer, on a Mac: is Metal faster, and from what size?

    python benchmarks/metal_reduce.py                          # float32/float16/bfloat16 sum, 64 KiB .. 1 GiB
    python benchmarks/metal_reduce.py --dtypes float16 --min 1M --max 256M

Both sides reduce dst = dst + src over the same buffers in unified memory, as a rank would on a received
chunk: the CPU reducer (lightning_mccl._C.reduce_into: NEON, its thread pool) on CPU tensors; Metal
(lightning_mccl.metal.kernels.MetalReducer) on MPS tensors, timed including torch.mps.synchronize(), but not
the copies between CPU and MPS tensors (the in-place path would not make them). The Metal kernels first pass
the same self-test the training path runs. Reported: median time and GB/s (bytes of dst / time) per size,
and the speed-up. Output: the table, results.csv, results.md and results.png in --out. MCCL_METAL stays 0 by
default until this shows Metal ahead; MCCL_METAL_MIN_BYTES should then be the crossover it reports.

Needs macOS with MPS and torch >= 2.7; elsewhere it says why and exits with status 0.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from sweep import report  # noqa: E402
from sweep.sizes import parse_size, size_sweep  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--op", default="sum", choices=("sum", "product", "min", "max"))
    p.add_argument("--min", default="64K")
    p.add_argument("--max", default="1G")
    p.add_argument("--step-factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from lightning_mccl.metal import gate, kernels

    why = kernels.unavailable_reason()
    if why is not None:
        print(f"metal_reduce: Metal cannot run here ({why}); this benchmark needs a Mac with MPS. Nothing measured.")
        return 0
    import torch

    metal = kernels.MetalReducer()
    failure = gate.self_test(metal)
    if failure is not None:
        print(f"metal_reduce: the Metal kernels fail the self-test ({failure}); Metal stays off. Nothing timed.")
        return 1

    rows, series = [], {}
    for dtype in args.dtypes.split(","):
        t = getattr(torch, dtype)
        for nbytes in size_sweep(parse_size(args.min), parse_size(args.max), args.step_factor):
            n = nbytes // t.itemsize
            a, b = torch.rand(n).to(t), torch.rand(n).to(t)
            da, db = a.to("mps"), b.to("mps")

            def cpu():
                gate.cpu_reduce_(a, b, args.op)

            def gpu():
                metal.reduce_(da, db, args.op)
                torch.mps.synchronize()

            times = {name: _median_time(fn, args.iters) for name, fn in (("cpu", cpu), ("metal", gpu))}
            row = {"dtype": dtype, "op": args.op, "bytes": nbytes, "cpu_s": times["cpu"], "metal_s": times["metal"],
                   "cpu_GBps": nbytes / times["cpu"] / 1e9, "metal_GBps": nbytes / times["metal"] / 1e9,
                   "speedup": times["cpu"] / times["metal"]}
            rows.append(row)
            for name in ("cpu", "metal"):
                xs, ys = series.setdefault(f"{name} {dtype}", ([], []))
                xs.append(nbytes)
                ys.append(row[f"{name}_GBps"])

    out = args.out or report.default_out_dir("metal_reduce")
    os.makedirs(out, exist_ok=True)
    table = (["dtype", "size", "CPU ms", "Metal ms", "CPU GB/s", "Metal GB/s", "Metal speed-up"],
             [[r["dtype"], report.human_size(r["bytes"]), f"{r['cpu_s'] * 1e3:.3f}", f"{r['metal_s'] * 1e3:.3f}",
               f"{r['cpu_GBps']:.2f}", f"{r['metal_GBps']:.2f}", f"{r['speedup']:.2f}x"] for r in rows])
    title = f"Metal vs CPU reducer, {args.op}, median of {args.iters}"
    report.print_table(title, table)
    report.write_csv(os.path.join(out, "results.csv"), rows)
    header = report.machine_header(sys.argv[1:], "this Mac")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.markdown(title, header, table))
    note = report.plot(os.path.join(out, "results.png"), title,
                       [{"xlabel": "bytes", "ylabel": "GB/s", "logx": True, "series": series}])
    if note:
        print(note)
    print(f"results in {out}")
    return 0


def _median_time(fn, iters: int) -> float:
    fn()  # warm-up (and, for Metal, the first-use compile)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    sys.exit(main())
