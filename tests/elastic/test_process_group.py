"""The process group that re-forms in place, on real ranks (tests/torch/harness.py): it fails fast with a clear
error until it is formed and after it is aborted; DDP holds the same object while what it wraps goes from 3
ranks to 2, and an average divides by the ranks of the current quorum; with a reporter, a failed collective
(a peer killed) is reported and its work completes, and so does every later call, while bad input still raises."""
from __future__ import annotations

import os
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from lightning_mccl.elastic import ElasticProcessGroup, Reconfiguring
from lightning_mccl.testing import is_gloo, run_ranks

pytestmark = pytest.mark.skipif(is_gloo(), reason="the elastic group wraps mccl groups only")


def _store(rank: int, world_size: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world_size, rank == 0, timedelta(seconds=60),
                         wait_for_workers=False)


def _avg_hook(pg, bucket):
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.AVG
    tensor = bucket.buffer()
    return pg.allreduce([tensor], opts).get_future().then(lambda _: tensor)


def _grad_of(ddp, model, rank: int) -> np.ndarray:
    ddp(torch.full((1, 2), float(rank + 1))).sum().backward()
    grad = model.weight.grad.clone().numpy()
    model.zero_grad()
    return grad


def _shrinks_in_place(rank, world_size):
    store = _store(rank, world_size)
    pg = ElasticProcessGroup(store, timeout=timedelta(seconds=60), settings={}, route_to="127.0.0.1")
    out = {}
    try:
        pg.allreduce([torch.ones(1)], dist.AllreduceOptions())
    except Reconfiguring as e:
        out["unformed"] = str(e)
    pg.configure(0, rank, world_size)
    model = torch.nn.Linear(2, 1, bias=False)
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg, init_sync=False)
    ddp.register_comm_hook(pg, _avg_hook)
    out["grad3"] = _grad_of(ddp, model, rank)
    store.add("quorum0-done", 1)
    if rank == 2:  # leaves; the others re-form without it
        pg.abort("rank 2 left")
        return out
    while store.add("quorum0-done", 0) < world_size:
        pass
    pg.configure(1, rank, 2)
    out.update(grad2=_grad_of(ddp, model, rank), held=ddp.process_group is pg, rank=pg.rank(), size=pg.size())
    pg.abort("the test ended")
    try:
        pg.broadcast([torch.ones(1)], dist.BroadcastOptions())
    except Reconfiguring as e:
        out["aborted"] = str(e)
    return out


def test_ddp_holds_the_group_while_it_shrinks_and_averages_divide_by_the_quorum():
    results = run_ranks(_shrinks_in_place, 3, init=False, timeout=180)
    for rank, r in enumerate(results):
        assert r["unformed"].startswith("mccl elastic: allreduce on the elastic process group while the group is not "
                                        "formed yet (the first step boundary forms it)")
        np.testing.assert_array_equal(r["grad3"], [[2.0, 2.0]])  # (1 + 2 + 3) / 3
        if rank < 2:
            np.testing.assert_array_equal(r["grad2"], [[1.5, 1.5]])  # (1 + 2) / 2: the quorum's size
            assert r["held"] and (r["rank"], r["size"]) == (rank, 2)
            assert "broadcast on the elastic process group while the test ended" in r["aborted"]


def _reports_failures(rank, world_size):
    store = _store(rank, world_size)
    reported = []
    pg = ElasticProcessGroup(store, timeout=timedelta(seconds=60), settings={}, route_to="127.0.0.1",
                             report=lambda e: reported.append(str(e)))
    pg.configure(0, rank, world_size)
    pg.allreduce([torch.ones(4)], dist.AllreduceOptions()).wait()
    if rank == 1:
        return {}  # its process exits (and its connections close) while rank 0 waits in the next allreduce
    tensor = torch.ones(4)
    work = pg.allreduce([tensor], dist.AllreduceOptions())
    waited = work.wait()
    value = work.get_future().wait()
    later = pg.allreduce([torch.ones(4)], dist.AllreduceOptions())  # the group failed: the engine raises at once
    later_value = later.get_future().wait()
    try:
        pg.allreduce([torch.ones(4).to_sparse()], dist.AllreduceOptions())
        bad = None
    except ValueError as e:
        bad = str(e)
    pg.abort()
    return {"waited": waited, "value_is_tensor": value[0] is tensor, "later": later_value[0].numel(),
            "reported": reported, "bad": bad}


def test_a_failed_collective_is_reported_and_its_work_completes():
    results = run_ranks(_reports_failures, 2, init=False, timeout=180)
    r = results[0]
    assert r["waited"] and r["value_is_tensor"] and r["later"] == 4
    assert len(r["reported"]) >= 2 and all("MCCL connection error: rank 0 lost its connection to rank 1" in e
                                           for e in r["reported"]), r["reported"]
    assert r["bad"] and "sparse" in r["bad"]
