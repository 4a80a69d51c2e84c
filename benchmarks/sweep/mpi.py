"""The mpi4py series: the same collectives through MPI (e.g. Open MPI), for comparison.

MPI ranks cannot join a torch.distributed job, so an mpi4py series is its own launch, by `mpirun` (see
`launch.Placement.run_mpi`), with the byte transfer layer forced to TCP on the benchmark's interface (``btl
tcp,self``): over loopback, MPI would otherwise move data through shared memory, which a fleet of hosts
cannot. Buffers are the same torch tensors as the other series', seen by MPI as numpy arrays.
"""
from __future__ import annotations

from typing import Callable


def available() -> bool:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def comm():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def run(op: str, bufs, c) -> None:
    from mpi4py import MPI

    inp, out = bufs.inp.numpy(), bufs.out.numpy()
    if op == "allreduce":
        c.Allreduce(MPI.IN_PLACE, inp, op=MPI.SUM)
    elif op == "broadcast":
        c.Bcast(inp, root=0)
    elif op == "reduce":
        c.Reduce(MPI.IN_PLACE if c.Get_rank() == 0 else inp, inp, op=MPI.SUM, root=0)
    elif op == "allgather":
        c.Allgather(inp, out)
    elif op == "reduce_scatter":
        c.Reduce_scatter_block(inp, out, op=MPI.SUM)
    elif op == "alltoall":
        c.Alltoall(inp, out)
    else:
        raise ValueError(f"unknown op {op!r}")


def max_reduce(c) -> Callable:
    """In-place elementwise MAX of a float64 torch tensor over all ranks."""
    from mpi4py import MPI

    def reduce(t) -> None:
        c.Allreduce(MPI.IN_PLACE, t.numpy(), op=MPI.MAX)

    return reduce
