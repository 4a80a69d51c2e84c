"""Per-group settings (lightning_mccl.Options as pg_options, docs/settings.md): each group reads its settings
when it is made, so two groups in one process differ, and a variable set after a group was made applies to
the next group only. Observed through the bytes each group's engine put on the wire (stats()): bf16 on
the wire halves them, and the values come back rounded to bf16; and through the wire type each group's engine
says it read (`backend.wire_dtype_of`)."""
from __future__ import annotations

import pytest

from lightning_mccl.testing import backend_name, run_ranks

COUNT = 1000  # 4 KB of float32


def _groups_differ(rank, world):
    import os

    import torch
    import torch.distributed as dist

    import lightning_mccl
    from lightning_mccl import stats
    from lightning_mccl.backend import wire_dtype_of

    x = torch.full((COUNT,), 1.0 + 2.0 ** -12)  # not a bfloat16: bf16 on the wire rounds it to 1.0
    ranks = list(range(world))

    def traffic(group):
        before = stats(group)["kinds"].get("allreduce", {}).get("bytes_sent", 0)
        t = x.clone()
        dist.all_reduce(t, group=group)
        return stats(group)["kinds"]["allreduce"]["bytes_sent"] - before, t[0].item()

    plain = dist.new_group(ranks, backend="mccl")
    narrow = dist.new_group(ranks, backend="mccl", pg_options=lightning_mccl.Options(wire_dtype="bf16"))
    as_dict = dist.new_group(ranks, backend="mccl", pg_options={"MCCL_WIRE_DTYPE": "bf16"})
    out = {"plain": traffic(plain), "narrow": traffic(narrow), "dict": traffic(as_dict)}
    os.environ["MCCL_WIRE_DTYPE"] = "bf16"  # after `plain` was made: only the next group reads it
    later = dist.new_group(ranks, backend="mccl")
    out["plain_after"] = traffic(plain)
    out["later"] = traffic(later)
    del os.environ["MCCL_WIRE_DTYPE"]
    half = dist.new_group(ranks, backend="mccl", pg_options={"MCCL_WIRE_DTYPE": "half"})  # the engine's alias
    out["wire"] = [wire_dtype_of(g) for g in (None, plain, narrow, as_dict, later, half)]
    errors = {}
    for bad in ({"MCCL_NSOCKS": "2K"}, {"MCCL_SPINUS": "0"}):
        try:
            dist.new_group(ranks, backend="mccl", pg_options=bad)
        except Exception as e:  # noqa: BLE001 - the type is checked by the parent
            errors[next(iter(bad))] = (type(e).__name__, str(e))
    out["errors"] = errors
    return out


@pytest.mark.skipif(backend_name() != "mccl", reason="mccl's own settings")
def test_two_groups_differ_and_later_variables_apply_to_the_next_group():
    world = 2
    results = run_ranks(_groups_differ, world, timeout=90)
    full = COUNT * 4  # 2 ranks: both allreduce algorithms send the buffer once
    exact = world * (1.0 + 2.0 ** -12)
    for rank, out in enumerate(results):
        assert tuple(out["plain"]) == (full, exact), (rank, out)
        assert tuple(out["narrow"]) == (full // 2, float(world)), (rank, out)
        assert out["dict"] == out["narrow"], (rank, out)
        assert out["plain_after"] == out["plain"], (rank, out)  # made before the variable changed
        assert out["later"] == out["narrow"], (rank, out)
        assert out["wire"] == ["off", "off", "bf16", "bf16", "bf16", "fp16"], (rank, out)
        kind, message = out["errors"]["MCCL_NSOCKS"]
        assert kind == "ValueError" and "MCCL_NSOCKS='2K' is not a whole number" in message, out["errors"]
        kind, message = out["errors"]["MCCL_SPINUS"]
        assert kind == "ValueError" and "unknown MCCL setting 'MCCL_SPINUS'" in message, out["errors"]


def test_options_reject_what_is_not_a_setting():
    import lightning_mccl
    from lightning_mccl.options import settings_of

    assert settings_of(lightning_mccl.Options({"MCCL_ALGO": "rd"}, spin_us=0)) == {"MCCL_ALGO": "rd",
                                                                                   "MCCL_SPIN_US": "0"}
    assert settings_of(None) == {}
    with pytest.raises(ValueError, match="'SPIN_US' is not an MCCL_\\* variable name"):
        lightning_mccl.Options({"SPIN_US": 0})
    with pytest.raises(TypeError, match="pg_options=lightning_mccl.Options"):
        settings_of(["MCCL_ALGO=rd"])
    assert "secret-value" not in repr(lightning_mccl.Options(auth_secret="secret-value-0123456789"))
