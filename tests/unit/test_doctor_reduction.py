"""`mccl doctor`'s reduction-path report (cli/doctor_reduction.py): every rank's row, with the same
agreement rule as training, on a stand-in for torch.distributed (the real run: tests/launcher/test_doctor.py)."""
from lightning_mccl.cli import doctor_reduction


class TwoRanks:
    """Rank 0 of a 2-rank group whose rank 1 is a Mac that would use Metal."""

    def __init__(self, other):
        self.other = other

    def get_world_size(self):
        return 2

    def all_gather_object(self, out, mine):
        out[0], out[1] = mine, self.other


def test_a_rank_that_cannot_use_metal_keeps_the_other_on_the_cpu(monkeypatch):
    monkeypatch.setenv("MCCL_METAL", "auto")
    mac = {"host": "studio-02", "machine": "arm64", "cpu": "neon (float16 converted in hardware)",
           "vote": {"ok": True, "device": "metal", "reason": "metal passed the self-test"},
           "mps": "in place: MPS shared storage (unified memory)"}
    rows = doctor_reduction.reports(TwoRanks(mac))
    assert rows[0]["vote"]["ok"] is False and rows[0]["vote"]["reason"].startswith("metal unavailable: not macOS")
    assert rows[0]["metal"] == "no: " + rows[0]["vote"]["reason"]
    assert rows[1]["metal"] == "no: rank 0 declined: " + rows[0]["vote"]["reason"]
    assert rows[0]["mps"] == "no MPS device"
    assert rows[0]["cpu"] in ("avx2 (selected at run time)", "sse2 (this cpu has no avx2)")
    table = doctor_reduction.table(rows)
    assert [c.header for c in table.columns] == ["rank", "host", "CPU reducer", "Metal", "MPS tensors"]
    assert table.row_count == 2


def test_all_ranks_yes_means_metal_everywhere(monkeypatch):
    monkeypatch.setenv("MCCL_METAL", "0")
    yes = {"ok": True, "device": "metal", "reason": "metal passed the self-test"}
    monkeypatch.setattr("lightning_mccl.metal.gate.own_vote", lambda settings, reducer: yes)
    mac = {"host": "studio-02", "machine": "arm64", "cpu": "neon", "vote": yes, "mps": "no MPS device"}
    rows = doctor_reduction.reports(TwoRanks(mac))
    assert [r["metal"] for r in rows] == ["yes: metal passed the self-test on all 2 ranks"] * 2


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
