"""torch.distributed's API as torch documents it, checked against Gloo in the same test.

- `all_gather_coalesced(output_tensor_lists, input_tensor_list)`: output_tensor_lists[r][i] receives rank r's
  input_tensor_list[i] (distributed_c10d.py). Tensors of different sizes, an empty one, several dtypes (one
  per call: torch requires it), sync and async; 2 and 3 ranks; the very values Gloo gives, and the inputs.
- Failures read as torch's own backends word them: a timeout says "Timed out" (Gloo: "Timed out waiting
  ...ms for recv"), a peer that exited says "Connection closed by peer" (Gloo's words). The type is
  DistBackendError, as NCCL raises (Gloo raises a plain RuntimeError); torch has no timeout type.
- DDP's logging data names a third-party backend "custom": torch's ProcessGroup::getBackendName() maps the
  group's BackendType enum (CUSTOM for every registered backend), and a backend cannot change it. Checked
  here so that a torch that lets it (then docs/design.md's note is stale) is noticed.
"""
from __future__ import annotations

import os
import re
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from lightning_mccl.testing import RunFailed, run_ranks

GROUPS = [  # one all_gather_coalesced call each: (dtype, shapes)
    (torch.float32, [(3, 4), (0,), (7,), (1,)]),
    (torch.int64, [(5,), (2, 3)]),
    (torch.float16, [(0,), (9,)]),
    (torch.bfloat16, [(4, 2)]),
    (torch.uint8, [(300,), (1,)]),
]


def _input(rank: int, group: int, i: int, dtype, shape) -> torch.Tensor:
    n = int(np.prod(shape))
    values = torch.arange(n, dtype=torch.float64) + 1000 * rank + 100 * group + 10 * i
    return (values % 251).to(dtype).reshape(shape)  # exact in every dtype above


def gather_coalesced_worker(rank, ws):
    out = {async_op: _gather_all_groups(rank, ws, async_op) for async_op in (False, True)}
    try:  # one output list too few
        dist.all_gather_coalesced([[torch.zeros(2)] for _ in range(ws - 1)], [torch.ones(2)])
        out["bad"] = None
    except Exception as e:  # noqa: BLE001 - the point
        out["bad"] = (type(e).__name__, str(e))
    return out


def _gather_all_groups(rank, ws, async_op):
    out = []
    for g, (dtype, shapes) in enumerate(GROUPS):
        inputs = [_input(rank, g, i, dtype, sh) for i, sh in enumerate(shapes)]
        outputs = [[torch.full(sh, -1, dtype=dtype) for sh in shapes] for _ in range(ws)]
        work = dist.all_gather_coalesced(outputs, inputs, async_op=async_op)
        if async_op:
            work.wait()
        out.append([[(str(t.dtype), tuple(t.shape), t.to(torch.float64)) for t in per_rank] for per_rank in outputs])
    return out


@pytest.mark.parametrize("ws", [2, 3])
def test_all_gather_coalesced_matches_gloo(ws):
    runs = {b: run_ranks(gather_coalesced_worker, ws, backend=b, timeout=90) for b in ("gloo", "mccl")}
    for rank, async_op in [(rank, a) for rank in range(ws) for a in (False, True)]:
        got = {b: runs[b][rank][async_op] for b in runs}
        for g, (dtype, shapes) in enumerate(GROUPS):
            for r in range(ws):
                for i, sh in enumerate(shapes):
                    want = _input(r, g, i, dtype, sh)
                    for backend in ("gloo", "mccl"):
                        name, shape, value = got[backend][g][r][i]
                        where = f"{backend} rank {rank} (async_op={async_op}): {dtype} call, output_tensor_lists[{r}][{i}]"
                        assert (name, shape) == (str(dtype), tuple(sh)), where
                        np.testing.assert_array_equal(value, want.to(torch.float64).numpy(), err_msg=where)
    for rank in range(ws):
        assert runs["mccl"][rank]["bad"] == ("ValueError", f"MCCL invalid argument: rank {rank}: allgather_coalesced "
                                             f"needs {ws} output lists (one per rank), got {ws - 1}")


# How long rank 1 stays away at most: far beyond the process group's timeout (3 s), so rank 0 always times
# out first; rank 1 leaves as soon as rank 0 has its error.
ABSENT_S = 30


def failure_worker(rank, ws, case, done_path):
    """Rank 0's error for `case`; rank 1 provokes it: absent from a barrier (until rank 0 has raised, at
    most ABSENT_S), or gone."""
    if rank == 1:
        if case == "closed":
            os._exit(0)  # no destroy: its sockets just close, as when a process crashes
        give_up = time.monotonic() + ABSENT_S
        while not os.path.exists(done_path) and time.monotonic() < give_up:
            time.sleep(0.05)
        os._exit(0)
    time.sleep(1.0)
    try:
        try:
            if case == "wait":
                dist.barrier(async_op=True).wait(timeout=__import__("datetime").timedelta(milliseconds=300))
            else:
                dist.all_reduce(torch.ones(1000))
        finally:
            open(done_path, "w").close()
    except Exception as e:  # noqa: BLE001 - the point of the test
        return (type(e).__name__, isinstance(e, RuntimeError), str(e))
    return None


def _rank0(case, backend, tmp_path):
    """Rank 0's result; rank 1 ends with os._exit (no result), which is all the run may fail by."""
    done = str(tmp_path / f"{case}-{backend}.done")
    try:
        return run_ranks(failure_worker, 2, backend=backend, args=(case, done), timeout=60, pg_timeout=3)[0]
    except RunFailed as e:
        assert not e.errors and not e.unfinished and 0 in e.results, str(e)
        return e.results[0]


@pytest.mark.parametrize("case,phrase,ours", [
    ("timeout", "Timed out", r"MCCL timeout \(Timed out\): rank 0 timed out"),
    ("wait", "Timed out", r"MCCL timeout \(Timed out\): BARRIER did not complete within 300 ms"),
    ("closed", "Connection closed by peer", r"MCCL connection error: rank 0 lost its connection to rank 1 .*"
                                            r"\(Connection closed by peer\)"),
])
def test_failures_use_torchs_wording_and_type(case, phrase, ours, tmp_path):
    gloo = None if case == "wait" else _rank0(case, "gloo", tmp_path)
    mccl = _rank0(case, "mccl", tmp_path)
    if gloo is not None:  # the convention, as Gloo has it
        assert gloo[1] and phrase in gloo[2], gloo
    assert mccl is not None, f"{case}: rank 0 did not raise"
    etype, is_runtime_error, message = mccl
    assert etype == "DistBackendError" and is_runtime_error, mccl
    assert phrase in message and re.search(ours, message, re.S), message


def ddp_name_worker(rank, ws):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
    model(torch.ones(2, 3)).sum().backward()
    return dist.get_backend(), model._get_ddp_logging_data().get("backend_name")


@pytest.mark.parametrize("backend,logged", [("gloo", "gloo"), ("mccl", "custom")])
def test_ddp_logging_names_a_third_party_backend_custom(backend, logged):
    name, got = run_ranks(ddp_name_worker, 1, backend=backend, timeout=60)[0]
    assert name == backend
    assert got == logged, (f"DDP's logging data now names the {backend} backend {got!r}: torch lets a backend "
                           "report its own name there; update docs/design.md (DDP logging) and this test")
