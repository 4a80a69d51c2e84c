"""How torch finds the backend: the entry point (no import needed), `import lightning_mccl` before or after
torch, the MPS dispatch kernels, and the ProcessGroup's view of it; the `mccl` command line loads no torch.
World size 1, so these run in a subprocess each within seconds."""
import subprocess
import sys
import textwrap

import pytest
import torch

from lightning_mccl.launcher import free_port

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


def test_import_before_torch_registers_the_backend_once_torch_is_imported():
    # The entry point is switched off (a metadata lookup that finds nothing), so only the import can register.
    out = run_python(f"""
        import sys, importlib.metadata as md
        md.entry_points = lambda **kw: []
        import lightning_mccl
        print("torch" in sys.modules)
        import torch, torch.distributed as dist
        print(lightning_mccl.is_registered())
        dist.init_process_group("mccl", init_method="tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        print(dist.get_backend())
        dist.destroy_process_group()
    """)
    assert out.split() == ["False", "True", "mccl"]


def test_a_registration_that_fails_within_torchs_import_warns_and_torch_imports():
    out = run_python("""
        import sys, warnings
        import lightning_mccl
        sys.modules["lightning_mccl.backend"] = None  # make the registration fail
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
        print(torch.__name__, [str(w.message) for w in caught if "lightning-mccl" in str(w.message)])
    """)
    assert out.startswith("torch [\"lightning-mccl: the 'mccl' backend was not registered: ModuleNotFoundError("), out


def test_the_command_line_loads_neither_torch_nor_lightning():
    # A whole launch of one rank (`true`): the launcher process itself never loads them.
    out = run_python("""
        import sys
        from lightning_mccl.cli import main
        code = main(["launch", "--local", "1", "--nproc-per-node", "1", "--", "true"])
        print(code, sorted(m for m in ("torch", "lightning") if m in sys.modules))
    """)
    assert out.splitlines()[-1] == "0 []", out


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
