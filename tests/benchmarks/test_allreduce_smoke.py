"""Smoke test of benchmarks/allreduce.py: 2 ranks on loopback, tiny sizes, every collective in one launch.
Checks the harness (files, columns, every series and size present, results checked), never the timings."""
from __future__ import annotations

import csv

import pytest

from bench_runner import explain, run_script

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)

SIZES = [4096, 16384, 65536]


def test_sweep_writes_csv_markdown_and_plot(tmp_path):
    out = tmp_path / "out"
    proc = run_script("allreduce.py", "--nproc", 2, "--op", "all", "--sizes", "4K,16K,64K", "--iters", 3,
                      "--min-iters", 2, "--warmup", 1, "--time-budget", 0.05, "--out", out, "--timeout", 100,
                      timeout=120)
    assert proc.returncode == 0, explain(proc)
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for col in ("op", "size_bytes", "series", "backend", "world", "iters", "time_median_s", "time_min_s",
                "time_max_s", "algbw_gbps", "busbw_gbps", "speedup_vs_gloo", "max_rel_err", "correct",
                "tcp_retrans_segs", "tcp_rto_timeouts", "tcp_loss_probes", "tcp_zero_windows"):
        assert col in rows[0], col
    ops = ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "alltoall"]
    seen = {(r["op"], int(r["size_bytes"]), r["series"]) for r in rows}
    int8 = {("allreduce_int8", s, "mccl") for s in SIZES}  # mccl's own: Gloo skips it
    assert seen == {(op, s, b) for op in ops for s in SIZES for b in ("mccl", "gloo")} | int8, seen
    for r in rows:
        assert r["correct"] == "yes" and float(r["max_rel_err"]) <= float(r["rtol"]), r
        assert r["world"] == "2" and 2 <= int(r["iters"]) <= 3, r
        assert all(int(r[f"tcp_{c}"]) >= 0 for c in ("retrans_segs", "rto_timeouts", "loss_probes", "zero_windows")), r
        t_min, t_med, t_max = float(r["time_min_s"]), float(r["time_median_s"]), float(r["time_max_s"])
        assert 0 < t_min <= t_med <= t_max, r
        algbw = int(r["size_bytes"]) / t_med / 1e9
        assert abs(float(r["algbw_gbps"]) - algbw) <= 1e-9 * max(1.0, algbw)
        factor = {"allreduce": 1.0, "allreduce_int8": 1.0, "broadcast": 1.0, "reduce": 1.0}.get(r["op"], 0.5)  # n = 2
        assert abs(float(r["busbw_gbps"]) - algbw * factor) <= 1e-9 * max(1.0, algbw)
        assert (r["speedup_vs_gloo"] == "") == (r["series"] == "gloo" or r["op"] == "allreduce_int8")
    md = (out / "results.md").read_text()
    assert "- command: `benchmarks/allreduce.py --nproc 2 --op all" in md
    assert "- where: 2 ranks on this machine over loopback" in md and "torch" in md
    assert md.count("| mccl |") == (len(ops) + 1) * len(SIZES) and md.count("| gloo |") == len(ops) * len(SIZES)
    assert (out / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "busbw GB/s" in proc.stdout_text and "alltoall" in proc.stdout_text


def test_bad_arguments_are_named(tmp_path):
    proc = run_script("allreduce.py", "--series", "mccl,nccl", "--out", tmp_path, timeout=60)
    assert proc.returncode == 2 and "unknown backend 'nccl'" in proc.stderr_text, explain(proc)
    proc = run_script("allreduce.py", "--op", "allreduce,gather", "--out", tmp_path, timeout=60)
    assert proc.returncode == 2 and "unknown gather" in proc.stderr_text, explain(proc)


def test_mpi4py_series_when_installed(tmp_path):
    import shutil

    import pytest

    from sweep import mpi

    if not mpi.available() or shutil.which("mpirun") is None:
        pytest.skip("mpi4py or mpirun not installed (optional: pip install mpi4py, apt-get install openmpi-bin)")
    out = tmp_path / "out"
    proc = run_script("allreduce.py", "--nproc", 2, "--op", "allreduce,allgather", "--sizes", "4K",
                      "--backends", "mccl,mpi4py", "--baseline", "mccl", "--iters", 2, "--min-iters", 2,
                      "--warmup", 1, "--out", out, "--timeout", 100, timeout=120)
    assert proc.returncode == 0, explain(proc)
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["op"], r["series"]) for r in rows} == {(op, s) for op in ("allreduce", "allgather")
                                                      for s in ("mccl", "mpi4py")}
    assert all(r["correct"] == "yes" for r in rows), rows
