"""Which 8-bit format the 8-bit allreduce uses: int8 against fp8 e4m3, each with one scale per block of 256
values (the largest magnitude mapped to the format's largest: 126 for int8, 448 for e4m3), on one rank's data
of several distributions. Relative error = |decoded - x|_2 / |x|_2 (docs/int8.md, *The format*).

    python benchmarks/int8_formats.py [--count N] [--out DIR]

numpy simulates both roundings (round to nearest even; e4m3 with its subnormals); no communication.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from sweep import report  # noqa: E402

BLOCK = 256


def int8_blocks(x: np.ndarray) -> np.ndarray:
    b = x.reshape(-1, BLOCK)
    scale = np.abs(b).max(axis=1, keepdims=True) / 126
    scale[scale == 0] = 1
    return (np.round(b / scale) * scale).reshape(-1)


def e4m3(x: np.ndarray) -> np.ndarray:
    """Round to fp8 e4m3: 3 mantissa bits, normal exponents from -6, subnormals in steps of 2^-9, max 448."""
    a = np.abs(x)
    exponent = np.maximum(np.floor(np.log2(np.maximum(a, 2.0 ** -9))), -6)
    step = 2.0 ** (exponent - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448)


def e4m3_blocks(x: np.ndarray) -> np.ndarray:
    b = x.reshape(-1, BLOCK)
    scale = np.abs(b).max(axis=1, keepdims=True) / 448
    scale[scale == 0] = 1
    return (e4m3(b / scale) * scale).reshape(-1)


def distributions(count: int) -> dict:
    rng = np.random.default_rng(0)
    i = np.arange(count)
    return {
        "gaussian": rng.standard_normal(count),
        "laplace": rng.laplace(size=count),
        "student-t, 3 degrees": rng.standard_t(3, size=count),
        "gradient-like (bench_int8.cc)": np.ldexp(1.0, (i // 4096) % 13 - 6) * (rng.uniform(-4, 4, count) +
                                                                               rng.uniform(-4, 4, count)),
        "log-normal magnitudes (sigma 2)": rng.standard_normal(count) * np.exp(2 * rng.standard_normal(count)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/int8_formats.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1 << 20, help="values per distribution (default: %(default)s)")
    p.add_argument("--out", default=None, help="output directory (default: runs/bench/int8_formats-<time>)")
    args = p.parse_args(argv)
    count = args.count - args.count % BLOCK
    rows = []
    for name, x in distributions(count).items():
        norm = np.linalg.norm(x)
        rows.append({"data": name, "values": count,
                     "int8_rel_error": float(np.linalg.norm(int8_blocks(x) - x) / norm),
                     "e4m3_rel_error": float(np.linalg.norm(e4m3_blocks(x) - x) / norm)})
    table = (["data", "int8, scale per 256", "fp8 e4m3, scale per 256", "better"],
             [[r["data"], f"{r['int8_rel_error']:.2e}", f"{r['e4m3_rel_error']:.2e}",
               "int8" if r["int8_rel_error"] < r["e4m3_rel_error"] else "e4m3"] for r in rows])
    notes = ["relative error = |decoded - x|_2 / |x|_2 of one encoding, each block scaled by its largest magnitude"]
    out = args.out or report.default_out_dir("int8_formats")
    os.makedirs(out, exist_ok=True)
    report.write_csv(os.path.join(out, "results.csv"), rows)
    header = {"command": " ".join(["benchmarks/int8_formats.py"] + list(argv if argv is not None else sys.argv[1:]))}
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(report.markdown("8-bit formats, one scale per block of 256", header, table, notes))
    ticks = (list(range(len(rows))), [r["data"] for r in rows])
    why = report.plot(os.path.join(out, "results.png"), "8-bit formats: relative error of one encoding", [{
        "ylabel": "relative error (2-norm)", "logy": True, "xticks": ticks,
        "series": {"int8": (ticks[0], [r["int8_rel_error"] for r in rows]),
                   "fp8 e4m3": (ticks[0], [r["e4m3_rel_error"] for r in rows])}}])
    report.print_table("8-bit formats, one scale per block of 256", table, notes)
    print(why or f"int8_formats: wrote {out}/results.csv, results.md, results.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
