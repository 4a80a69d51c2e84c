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
           "mps": "staged through host buffers (reading MPS memory in place is not built yet)"}
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
