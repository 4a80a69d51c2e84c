"""Shared pieces of the benchmark scripts (benchmarks/allreduce.py, benchmarks/ddp_vit.py): series of backends,
the collectives, where the ranks run, timing inside the ranks and the reports."""
