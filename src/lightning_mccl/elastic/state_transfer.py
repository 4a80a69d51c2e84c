"""Sending the training state to the members that lack it, over the re-formed group.

After a boundary that admits members without the state (joiners; at round 0 every member but host 0's), and
once the new group is formed, each receiver gets the whole state from one holder: receivers are dealt to the
holders in turn (receiver i from holder i mod the number of holders), so several joiners are served by several
members at once. The state is one byte string (`torch.save` of a dict: the user's state, the sampler's, the
step counter, the RNG states); it travels as its length (one int64) and then its bytes, by send and recv.

The bytes are unpickled: they come from a member of the same job, over connections authenticated with the job's
secret (docs/reliability.md, *Security*).
"""
from __future__ import annotations

import io
import random
from typing import Any, Callable, Dict, Sequence

import numpy as np
import torch

TAG = 0


def plan(members: Sequence[str], receivers: Sequence[str]) -> Dict[str, str]:
    """Receiver -> the holder that sends it the state."""
    holders = [m for m in members if m not in receivers]
    if receivers and not holders:
        raise ValueError("no member holds the state to send")
    return {r: holders[i % len(holders)] for i, r in enumerate(receivers)}


def transfer(pg, members: Sequence[str], receivers: Sequence[str], me: str, payload: Callable[[], Any],
             load: Callable[[Any], None]) -> None:
    """Send the state to each receiver this member serves, or receive it, over `pg` (ranks in `members` order):
    the group's ProcessGroupMCCL itself, whose failures raise."""
    senders = plan(members, receivers)
    if me in senders:
        load(_receive(pg, members.index(senders[me])))
        return
    mine = [r for r, h in senders.items() if h == me]
    if mine:
        data = _to_bytes(payload())
        for r in mine:
            _send(pg, data, members.index(r))


def _to_bytes(obj: Any) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _send(pg, data: torch.Tensor, dst: int) -> None:
    pg.send([torch.tensor([data.numel()], dtype=torch.int64)], dst, TAG).wait()
    pg.send([data], dst, TAG).wait()


def _receive(pg, src: int) -> Any:
    length = torch.zeros(1, dtype=torch.int64)
    pg.recv([length], src, TAG).wait()
    data = torch.empty(int(length.item()), dtype=torch.uint8)
    pg.recv([data], src, TAG).wait()
    return torch.load(io.BytesIO(data.numpy().tobytes()), weights_only=False)


def rng_states() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])


__all__ = ["plan", "transfer", "rng_states", "set_rng_states"]
