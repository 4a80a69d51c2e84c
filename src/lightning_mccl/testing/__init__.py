"""The rank harness that the tests and the benchmarks share: rank processes on this machine, forked from one
fork server that imported torch once, with hard deadlines (`world`). Two ways to use it:

- `run_ranks(fn, world_size)` runs `fn(rank, world_size, *args)` on every rank inside an initialised process
  group and returns the results by rank, or raises `RunFailed` naming each rank that failed or hung
  (the torch.distributed tests);
- `Cluster(fn, world, ...)` runs `fn(chan, **kwargs)` on every rank beside a TCPStore hosted by the caller,
  which reads the ranks' events and may signal, stop or kill any rank (the reliability benchmarks and their
  tests).

It lives in the package, not in tests/, so that benchmarks/ can use it without importing from tests/, and
apart from `lightning_mccl.launcher`, which runs commands on hosts (this forks functions on one machine).
Importing it loads no torch; a run does.
"""
from .cluster import Cluster, find_mccl_key
from .run_ranks import RunFailed, backend_name, init_method, is_gloo, progress, report, run_ranks, to_plain
from .world import RankChannel, RankWorld, context_started, now

__all__ = ["Cluster", "RankChannel", "RankWorld", "RunFailed", "backend_name", "context_started", "find_mccl_key",
           "init_method", "is_gloo", "now", "progress", "report", "run_ranks", "to_plain"]
