"""How torch finds the backend: the entry point (no import needed), the MPS dispatch kernels, and the
ProcessGroup's view of it. World size 1, so these run in a subprocess each within seconds."""
import subprocess
import sys
import textwrap

import pytest
import torch

from harness import free_port

TIMEOUT_S = 90


def run_python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def test_init_process_group_finds_mccl_through_the_entry_point_without_import():
    out = run_python(f"""
        import sys, torch, torch.distributed as dist
        dist.init_process_group("mccl", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        assert "lightning_mccl" in sys.modules, "the entry point did not load the package"
        t = torch.arange(4.0)
        dist.all_reduce(t)
        print(dist.get_backend(), dist.get_world_size(), t.tolist())
        dist.destroy_process_group()
    """)
    assert out.split() == ["mccl", "1", "[0.0,", "1.0,", "2.0,", "3.0]"]


def test_backend_is_registered_for_cpu_cuda_and_mps():
    import torch.distributed as dist

    import lightning_mccl

    assert lightning_mccl.is_registered()
    assert dist.Backend("mccl") == "mccl"
    assert set(dist.Backend.backend_capability["mccl"]) == {"cpu", "cuda", "mps"}


def test_c10d_ops_have_mps_kernels_after_import():
    import lightning_mccl  # noqa: F401

    for op in ["allreduce_", "broadcast_", "allgather_", "_allgather_base_", "reduce_scatter_",
               "_reduce_scatter_base_", "alltoall_base_", "send", "recv_", "recv_any_source_", "barrier"]:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"c10d::{op}", "MPS"), op


def test_process_group_holds_a_ProcessGroupMCCL_for_cpu():
    out = run_python(f"""
        import torch, torch.distributed as dist, lightning_mccl
        dist.init_process_group("mccl", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        pg = dist.group.WORLD
        backend = pg._get_backend(torch.device("cpu"))
        print(type(backend).__name__, dist.get_backend(pg))
        dist.destroy_process_group()
    """)
    assert out.split() == ["ProcessGroupMCCL", "mccl"]
