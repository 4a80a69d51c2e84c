"""Every collective of the mccl backend at 2 local ranks with tensors on the device under test (MPS on a
Mac, the CPU everywhere), against float64 references each rank computes itself. Results must come back
on the tensor's own device."""
import pytest
import torch

from devices import DEVICES
from lightning_mccl.testing import run_ranks

WORLD = 2


def _x(rank, n, dtype=torch.float32, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)


def every_collective(rank, world, device):
    import torch.distributed as dist

    dev = torch.device(device)
    checks = {}

    def close(name, got, want, tol=1e-5):
        checks[name] = (got.device.type == dev.type,
                        bool(torch.allclose(got.double().cpu(), want.double(), rtol=tol, atol=tol)))

    for n in (1, 3, 1000, 70_001):
        for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 1e-2), (torch.bfloat16, 5e-2)):
            t = _x(rank, n, dtype).to(dev)
            dist.all_reduce(t)
            close(f"all_reduce/{dtype}/{n}", t, sum(_x(r, n, dtype).double() for r in range(world)), tol)
        t = _x(rank, n).to(dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        close(f"all_reduce_max/{n}", t, torch.stack([_x(r, n) for r in range(world)]).amax(0))
        t = _x(rank, n).to(dev)
        dist.broadcast(t, src=1)
        close(f"broadcast/{n}", t, _x(1, n))
        t = _x(rank, n).to(dev)
        dist.reduce(t, dst=0)
        if rank == 0:
            close(f"reduce/{n}", t, sum(_x(r, n).double() for r in range(world)))
        outs = [torch.empty(n, device=dev) for _ in range(world)]
        dist.all_gather(outs, _x(rank, n).to(dev))
        for r in range(world):
            close(f"all_gather/{n}/{r}", outs[r], _x(r, n))
        flat = torch.empty(world * n, device=dev)
        dist.all_gather_into_tensor(flat, _x(rank, n).to(dev))
        close(f"all_gather_into_tensor/{n}", flat, torch.cat([_x(r, n) for r in range(world)]))
        out = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(out, _x(rank, world * n, salt=1).to(dev))
        want = sum(_x(r, world * n, salt=1).double() for r in range(world))[rank * n:(rank + 1) * n]
        close(f"reduce_scatter_tensor/{n}", out, want)
        out = torch.empty(world * n, device=dev)
        dist.all_to_all_single(out, _x(rank, world * n, salt=2).to(dev))
        want = torch.cat([_x(r, world * n, salt=2)[rank * n:(rank + 1) * n] for r in range(world)])
        close(f"all_to_all_single/{n}", out, want)
        if rank == 0:
            dist.send(_x(0, n, salt=3).to(dev), dst=1)
        else:
            got = torch.empty(n, device=dev)
            dist.recv(got, src=0)
            close(f"send_recv/{n}", got, _x(0, n, salt=3))
    dist.barrier()
    return checks


@pytest.mark.parametrize("device", DEVICES)
def test_every_collective_on_device_tensors(device):
    results = run_ranks(every_collective, WORLD, args=(device,), timeout=180)
    for rank, checks in enumerate(results):
        assert checks, f"rank {rank} checked nothing"
        bad = {name: v for name, v in checks.items() if v != (True, True)}
        assert not bad, f"rank {rank} on {device}: (on the device, values right) failed for {sorted(bad)[:10]}"
