"""The staging path for accelerator tensors, run for real on CUDA (skipped where there is no GPU).

Several ranks share one GPU. Every collective takes CUDA tensors, produced on a side stream the
collective must wait for; results are compared with a float64 reference each rank computes itself,
and DDP on CUDA tensors is compared with the same script on Gloo.
"""
import json
import os

import pytest
import torch

from lightning_mccl.testing import run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _inputs(rank, count, dtype=torch.float64):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(count, generator=g, dtype=torch.float64).to(dtype)


def cuda_collectives(rank, world):
    import torch.distributed as dist

    dev = torch.device("cuda", 0)
    checks = {}
    side = torch.cuda.Stream(device=dev)
    for count in (0, 1, world + 1, 1000, 300_000):
        ref = sum(_inputs(r, count) for r in range(world))
        with torch.cuda.stream(side):
            # Produced by a kernel on a side stream: staging must wait for it.
            t = (_inputs(rank, count).to(dev, torch.float32) * 2.0) / 2.0
            dist.all_reduce(t)
            got = t.double().cpu()
        checks[f"all_reduce/{count}"] = bool(torch.allclose(got, ref, rtol=1e-5, atol=1e-5))
        for dtype, tol in ((torch.bfloat16, 0.05), (torch.float16, 0.01)):
            t = _inputs(rank, count, dtype).to(dev)
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            refd = sum(_inputs(r, count, dtype).double() for r in range(world))
            checks[f"all_reduce_{dtype}/{count}"] = bool(
                torch.allclose(t.double().cpu(), refd, rtol=tol, atol=tol * world))
        b = _inputs(rank, count).to(dev)
        dist.broadcast(b, src=world - 1)
        checks[f"broadcast/{count}"] = bool(torch.equal(b.cpu(), _inputs(world - 1, count)))
        out = torch.empty(world * count, device=dev, dtype=torch.float64)
        dist.all_gather_into_tensor(out, _inputs(rank, count).to(dev))
        checks[f"all_gather_into_tensor/{count}"] = bool(
            torch.equal(out.cpu(), torch.cat([_inputs(r, count) for r in range(world)])))
        rs_out = torch.empty(count, device=dev, dtype=torch.float64)
        dist.reduce_scatter_tensor(rs_out, _inputs(rank, world * count).to(dev))
        rs_ref = sum(_inputs(r, world * count) for r in range(world))[rank * count:(rank + 1) * count]
        checks[f"reduce_scatter_tensor/{count}"] = bool(torch.allclose(rs_out.cpu(), rs_ref, rtol=1e-12, atol=1e-12))
    # all_to_all_single with uneven splits, and send/recv around a ring
    send_splits = [(rank + k) % 3 for k in range(world)]
    recv_splits = [(k + rank) % 3 for k in range(world)]
    inp = torch.cat([torch.full((send_splits[k],), float(rank * 10 + k)) for k in range(world)]).to(dev)
    out = torch.empty(sum(recv_splits), device=dev)
    dist.all_to_all_single(out, inp, recv_splits, send_splits)
    want = torch.cat([torch.full((recv_splits[k],), float(k * 10 + rank)) for k in range(world)])
    checks["all_to_all_single"] = bool(torch.equal(out.cpu(), want))
    right, left = (rank + 1) % world, (rank - 1) % world
    s = torch.full((1000,), float(rank), device=dev)
    r = torch.empty(1000, device=dev)
    ops = [dist.P2POp(dist.isend, s, right), dist.P2POp(dist.irecv, r, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    checks["send_recv"] = bool(torch.equal(r.cpu(), torch.full((1000,), float(left))))
    return checks


def ddp_cuda(rank, world):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x = torch.randn(16, 32, generator=g).to(dev)
        y = torch.randn(16, 8, generator=g).to(dev)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return {k: v.detach().double().cpu().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_on_cuda_tensors(world):
    results = run_ranks(cuda_collectives, world, timeout=240)
    failed = {r: [k for k, ok in res.items() if not ok] for r, res in enumerate(results)}
    out_dir = os.environ.get("MCCL_RESULTS_DIR")
    if out_dir:
        with open(os.path.join(out_dir, f"cuda_staging_world{world}.json"), "w") as f:
            json.dump({"world": world, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "checks": results[0], "failed": failed}, f, indent=1)
    assert all(not v for v in failed.values()), failed


def test_ddp_on_cuda_matches_gloo():
    import numpy as np

    mccl = run_ranks(ddp_cuda, 2, timeout=240)
    gloo = run_ranks(ddp_cuda, 2, timeout=240, backend="gloo")
    for name in mccl[0]:
        for rank in range(2):
            np.testing.assert_allclose(mccl[rank][name], gloo[rank][name], rtol=1e-6, atol=1e-6)
