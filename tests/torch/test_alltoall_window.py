"""The all-to-all's schedules through torch (MCCL_ALLTOALL_WINDOW, docs/settings.md): all_to_all_single with
uneven splits, empty blocks among them, gives every rank exactly its blocks in groups that send to every peer at
once, run the pairwise exchange one round at a time, or two gated on their sends; a bad window is a ValueError
naming the variable and the value. (Each schedule's every case, at 1-8 ranks: tests/engine/test_alltoall.cc.)"""
from __future__ import annotations

import pytest

from lightning_mccl.testing import backend_name, run_ranks

WORLD = 3
SCHEDULES = {"all": {}, "w1": {"alltoall_window": 1}, "w2-send": {"alltoall_window": 2, "alltoall_window_gate": "send"}}


def _split(src: int, dst: int) -> int:
    """Rows rank `src` sends rank `dst`: 0 for some pairs, up to 4."""
    return (src * 2 + dst) % 5


def _exchange(rank, world):
    import torch
    import torch.distributed as dist

    import lightning_mccl

    def block(src, dst):  # 3 columns a row, every value naming its sender, receiver and place
        n = _split(src, dst)
        return torch.arange(n * 3, dtype=torch.int64).reshape(n, 3) + src * 10_000 + dst * 100

    inp = torch.cat([block(rank, j) for j in range(world)])
    want = torch.cat([block(i, rank) for i in range(world)])
    out = {}
    for name, options in SCHEDULES.items():
        group = dist.new_group(list(range(world)), backend="mccl", pg_options=lightning_mccl.Options(**options))
        got = torch.full_like(want, -1)
        dist.all_to_all_single(got, inp, output_split_sizes=[_split(i, rank) for i in range(world)],
                               input_split_sizes=[_split(rank, j) for j in range(world)], group=group)
        out[name] = bool(torch.equal(got, want))
    try:
        dist.new_group(list(range(world)), backend="mccl", pg_options={"MCCL_ALLTOALL_WINDOW": "-1"})
        out["error"] = None
    except Exception as e:  # noqa: BLE001 - the type is checked by the parent
        out["error"] = (type(e).__name__, str(e))
    return out


@pytest.mark.skipif(backend_name() != "mccl", reason="mccl's own setting")
def test_every_schedule_delivers_every_block_and_a_bad_window_is_named():
    for rank, out in enumerate(run_ranks(_exchange, WORLD, timeout=90)):
        assert {name: out[name] for name in SCHEDULES} == {name: True for name in SCHEDULES}, (rank, out)
        kind, message = out["error"]
        assert kind == "ValueError" and "MCCL_ALLTOALL_WINDOW='-1' is not a whole number" in message, (rank, out)
