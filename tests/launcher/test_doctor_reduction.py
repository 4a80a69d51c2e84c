"""`mccl doctor`'s reduction-path report (launcher/doctor_reduction.py): every rank's row, on a stand-in for
torch.distributed (the real run: tests/launcher/test_doctor.py)."""
from lightning_mccl.launcher import doctor_reduction


class TwoRanks:
    """Rank 0 of a 2-rank group whose rank 1 is a Mac."""

    def __init__(self, other):
        self.other = other

    def get_world_size(self):
        return 2

    def all_gather_object(self, out, mine):
        out[0], out[1] = mine, self.other


def test_every_rank_reports_its_cpu_reducer_mps_path_and_metal_path():
    mac = {"host": "studio-02", "machine": "arm64", "cpu": "neon (float16 converted in hardware)",
           "mps": "in place: MPS shared storage (unified memory)",
           "metal": "Metal kernels (self-tested against the CPU codec)"}
    rows = doctor_reduction.reports(TwoRanks(mac))
    assert rows[1] == mac
    assert rows[0]["mps"] == "no MPS device"
    assert rows[0]["metal"] == "torch ops: no MPS device"  # lightning_mccl.metal.describe() without a group
    assert rows[0]["cpu"] in ("avx2 (selected at run time)", "sse2 (this cpu has no avx2)")
    table = doctor_reduction.table(rows)
    assert [c.header for c in table.columns] == ["rank", "host", "CPU reducer", "MPS tensors", "MPS per-value work"]
    assert table.row_count == 2
    assert list(table.columns[2].cells) == [rows[0]["cpu"], mac["cpu"]]
    assert list(table.columns[4].cells) == [rows[0]["metal"], mac["metal"]]


def test_the_mps_column_is_the_bindings_own_answer(monkeypatch):
    """What the doctor says for MPS comes from the binding's check (host_memory.hpp), asked for a tensor
    of bucket size; here a meta tensor stands in for the MPS one (there is no MPS device)."""
    import torch

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    probes = []

    def probe():
        probes.append(torch.empty(doctor_reduction.PROBE_BYTES // 4, device="meta"))
        return probes[-1]

    monkeypatch.setattr(doctor_reduction, "mps_probe", probe)
    assert doctor_reduction.mps_path() == "staged through reused host buffers: no CPU mapping is known for meta memory"
    assert probes[0].numel() * 4 == 25 << 20
