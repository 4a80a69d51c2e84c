"""A process group that re-forms in place: the object DDP holds stays; what it wraps is rebuilt.

`ElasticProcessGroup` is a `torch.distributed.ProcessGroup` written in Python (torch calls a Python subclass's
collectives from C++, DDP's reducer included). It forwards every collective to a `ProcessGroupMCCL` of the
current quorum. At a step boundary that changes the membership, or after a failed step (an engine error is
fatal to the group that raised it), the manager calls `configure(quorum_id, rank, size)`: the old group is
aborted (its thread stopped, its sockets closed) and a new one is built through the job's Store under a prefix
of its own (``mccl/elastic/pg/<quorum id>/``), with the new quorum's rank and size. Until it is built, every
collective raises `Reconfiguring` at once, naming why.

With `report` set (the manager sets it), a collective that fails does not raise: its work completes, with
its buffers as the failure left them, and the failure goes to `report(error)`, which fails the step's vote.
DDP's reducer issues collectives of its own outside any comm hook (with ``find_unused_parameters``, the map of
used parameters) and raises from the backward pass when one fails; so a failure anywhere in the step ends in
the vote, never half-way through a backward pass. A collective called while the group is not formed still raises
at once, and so does bad input (a ValueError).

`rank()` and `size()` are the current quorum's, so an AVG divides by the ranks that contributed. The group is
not registered with torch.distributed (it has no place in the default world): pass it to DDP as
``process_group=``, or call its methods.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ..backend import ProcessGroupMCCL
from .board import PREFIX
from .errors import Reconfiguring


class ElasticProcessGroup(dist.ProcessGroup):
    """The process group of an elastic job (see the module docstring)."""

    def __init__(self, store: dist.Store, *, timeout: timedelta, settings: dict, route_to: str = "",
                 report: Optional[Callable[[BaseException], None]] = None):
        super().__init__(0, 1)
        self._report = report
        self._store = store
        self._timeout = timeout
        self._settings = dict(settings)
        self._route_to = route_to
        self._backend: Optional[ProcessGroupMCCL] = None
        self._rank = 0
        self._size = 1
        self.quorum_id: Optional[int] = None
        self._unready = "the group is not formed yet (the first step boundary forms it)"

    # ---- re-forming ---------------------------------------------------------------------------------------

    def configure(self, quorum_id: int, rank: int, size: int) -> None:
        """Abort the wrapped group and build the one of quorum `quorum_id`, as `rank` of `size`."""
        self.abort(f"it re-forms as quorum {quorum_id}")
        store = dist.PrefixStore(f"{PREFIX}pg/{quorum_id}/", self._store)
        self._backend = ProcessGroupMCCL(store, rank, size, self._timeout, self._route_to, self._settings)
        self._rank, self._size, self.quorum_id = rank, size, quorum_id

    def abort(self, why: str = "it was aborted") -> None:
        """Stop the wrapped group (pending collectives fail); collectives then raise Reconfiguring (`why`)."""
        backend, self._backend = self._backend, None
        self._unready = why
        if backend is not None:
            backend.abort()

    def shutdown(self) -> None:
        self.abort("it was shut down")

    @property
    def formed(self) -> bool:
        return self._backend is not None

    @property
    def backend(self) -> ProcessGroupMCCL:
        return self._current("backend")

    def _forward(self, op: str, args: tuple):
        backend = self._current(op)
        if self._report is None:
            return getattr(backend, op)(*args)
        try:
            return _Reported(getattr(backend, op)(*args), args[0], self._report)
        except dist.DistError as e:  # the group failed before: the engine raises its first error at every call
            self._report(e)
            return _Reported(None, args[0], self._report)

    def _current(self, op: str) -> ProcessGroupMCCL:
        if self._backend is None:
            raise Reconfiguring(f"mccl elastic: {op} on the elastic process group while {self._unready}: its "
                                f"collectives fail until a step boundary forms it, and the step they belong to is "
                                f"dropped on every member")
        return self._backend

    # ---- what torch asks of a process group -----------------------------------------------------------------

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    getRank = rank  # the names torch's C++ side calls
    getSize = size

    def getBackendName(self) -> str:
        return "mccl"

    def allreduce(self, *args):
        return self._forward("allreduce", args)

    def allreduce_coalesced(self, *args):
        return self._forward("allreduce_coalesced", args)

    def broadcast(self, *args):
        return self._forward("broadcast", args)

    def reduce(self, *args):
        return self._forward("reduce", args)

    def allgather(self, *args):
        return self._forward("allgather", args)

    def all_gather_single(self, *args):
        return self._forward("all_gather_single", args)

    def all_gather_single_coalesced(self, *args):
        return self._forward("all_gather_single_coalesced", args)

    def gather(self, *args):
        return self._forward("gather", args)

    def scatter(self, *args):
        return self._forward("scatter", args)

    def reduce_scatter(self, *args):
        return self._forward("reduce_scatter", args)

    def reduce_scatter_single(self, *args):
        return self._forward("reduce_scatter_single", args)

    def reduce_scatter_single_coalesced(self, *args):
        return self._forward("reduce_scatter_single_coalesced", args)

    def alltoall(self, *args):
        return self._forward("alltoall", args)

    def all_to_all_single(self, *args):
        return self._forward("all_to_all_single", args)

    def barrier(self, *args):
        return self._forward("barrier", args)

    def send(self, *args):
        return self._forward("send", args)

    def recv(self, *args):
        return self._forward("recv", args)

    def recvAnysource(self, *args):
        return self._forward("recv_anysource", args)

    def __repr__(self) -> str:
        state = f"quorum {self.quorum_id}, rank {self._rank} of {self._size}" if self.formed else self._unready
        return f"ElasticProcessGroup({state})"


class _Reported(dist._Work):
    """A work whose failure is reported instead of raised: `wait()` returns, its future completes with
    `result` (the collective's output buffers). `work` None: the collective failed when it was called."""

    def __init__(self, work, result: Any, report: Callable[[BaseException], None]):
        super().__init__()
        self._work = work
        self._result = result
        self._report = report

    def wait(self, timeout=None) -> bool:
        if self._work is None:
            return True
        try:
            self._work.wait() if timeout is None else self._work.wait(timeout)
        except dist.DistError as e:
            self._report(e)
        return True

    def get_future(self):
        if self._work is None:
            future = torch.futures.Future()
            future.set_result(self._result)
            return future

        def settled(future):
            try:
                return future.value()
            except dist.DistError as e:
                self._report(e)
                return self._result

        return self._work.get_future().then(settled)

    def result(self):
        return self._result

    def is_completed(self) -> bool:
        return self._work is None or self._work.is_completed()

    def is_success(self) -> bool:
        return True


__all__ = ["ElasticProcessGroup"]
