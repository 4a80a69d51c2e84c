"""Shared pieces of the benchmark scripts (benchmarks/allreduce.py, benchmarks/fleet_ddp.py): series of backends,
the collectives, where the ranks run, timing inside the ranks and the reports."""
