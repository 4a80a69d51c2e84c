"""This rank's per-value work of the 8-bit allreduce, by the two codecs (docs/int8.md, *What runs where*): the
engine's vector code (a CPU tensor's path) and torch ops on the tensor's device (an accelerator's path), each
encoding with error feedback (the residual added, the error left in it) and decoding. Here both run on CPU
tensors on one thread, so the table says what each costs the CPU per value, and, for the torch ops, the ATen
calls one bucket takes and their fixed cost per call (what a device's caller thread pays to queue them).

    python benchmarks/int8_paths.py [--values 1M,6.5M] [--repeat 5] [--out DIR]

The engine's share of the collective itself (the owner's sums, the loopback TCP) is build/engine/bench_int8's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from sweep import report  # noqa: E402


def _count(text: str) -> int:
    scale = {"K": 1e3, "M": 1e6}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale != 1 else text) * scale)


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _aten_calls(fn) -> int:
    """ATen operators one call of `fn` dispatches (each a kernel launch on a device, or an allocation)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/int8_paths.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--values", default="1M,6.5M", help="values per bucket (default: %(default)s, 4 and 26 MB)")
    p.add_argument("--repeat", type=int, default=5, help="the least time of this many runs (default: %(default)s)")
    p.add_argument("--out", default=None, help="output directory (default: runs/bench/int8_paths-<time>)")
    args = p.parse_args(argv)

    import torch

    from lightning_mccl.backend import extension as _C

    torch.set_num_threads(1)
    rows = []
    for count in (_count(v) for v in args.values.split(",")):
        x = torch.randn(count) * torch.exp2(torch.randint(-6, 7, (count // 256 + 1,)).float()).repeat_interleave(256)[:count]
        residual = torch.randn(count) * 1e-3
        for codec, engine in (("engine (vector code)", True), ("torch ops", False)):
            kept = residual.clone()
            wire = _C.int8_encode(x, kept, engine=engine)
            encode = _best(lambda: _C.int8_encode(x, kept, engine=engine), args.repeat)
            decode = _best(lambda: _C.int8_decode(wire, count, engine=engine), args.repeat)
            rows.append({"codec": codec, "values": count, "encode_ns_per_value": encode / count * 1e9,
                         "decode_ns_per_value": decode / count * 1e9})
    small = torch.randn(4096)
    kept = torch.zeros(4096)
    wire = _C.int8_encode(small, kept)
    calls = {"encode": (lambda: _C.int8_encode(small, kept)), "decode": (lambda: _C.int8_decode(wire, 4096))}
    overhead = {k: {"aten_calls": _aten_calls(fn), "us_per_call": _best(fn, 50) * 1e6} for k, fn in calls.items()}
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())

    table = (["codec", "values", "encode + feedback, ns/value", "decode, ns/value"],
             [[r["codec"], f"{r['values']:,}", f"{r['encode_ns_per_value']:.2f}", f"{r['decode_ns_per_value']:.2f}"]
              for r in rows])
    notes = [f"one CPU thread, the least of {args.repeat} runs; load average {load} (the machine is shared)",
             f"torch ops per bucket (4096 values, fixed costs): encode {overhead['encode']['aten_calls']} ATen calls "
             f"in {overhead['encode']['us_per_call']:.0f} us, decode {overhead['decode']['aten_calls']} in "
             f"{overhead['decode']['us_per_call']:.0f} us on this CPU"]
    out = args.out or report.default_out_dir("int8_paths")
    os.makedirs(out, exist_ok=True)
    report.write_csv(os.path.join(out, "results.csv"),
                     rows + [{"codec": "torch ops, fixed cost per bucket", "values": 4096, **{
                         f"{k}_{m}": v for k, d in overhead.items() for m, v in d.items()}}])
    header = report.machine_header(sys.argv[1:] if argv is None else argv, "this machine's CPU, one thread")
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.markdown("The 8-bit allreduce's per-value work, by codec", header, table, notes))
    sizes = sorted({r["values"] for r in rows})
    why = report.plot(os.path.join(out, "results.png"), "8-bit codecs: CPU time per value (one thread)", [{
        "ylabel": "ns per value", "xlabel": "values per bucket", "logx": True,
        "xticks": (sizes, [f"{s:,}" for s in sizes]),
        "series": {f"{c}, {w}": (sizes, [r[f"{w}_ns_per_value"] for r in rows if r["codec"] == c])
                   for c in ("engine (vector code)", "torch ops") for w in ("encode", "decode")}}])
    report.print_table("The 8-bit allreduce's per-value work, by codec", table, notes)
    print(why or f"int8_paths: wrote {out}/results.csv, results.md, results.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
