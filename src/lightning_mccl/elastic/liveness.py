"""Liveness through the Store: each member's heartbeat counter, and how long the others' have been still.

A member's thread adds 1 to ``hb/<member>`` every `heartbeat_s`, over a Store connection of its own (the main
connection may block for long in a process group's bootstrap). Counters, not timestamps: an observer compares
what it reads with what it read before, by its own clock, so the hosts' clocks need not agree. A process that
is killed, crashes, sleeps or loses its network stops bumping; one that computes a long step does not.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, Optional, Tuple

import torch.distributed as dist

from .board import Board
from .errors import HostZeroLost


def heartbeat_key(member: str) -> str:
    return f"hb/{member}"


class Heartbeat:
    """This member's heartbeat thread. `connect()` makes its own Store client. `error` is set (HostZeroLost)
    when the Store went away; the thread then stops."""

    def __init__(self, connect: Callable[[], dist.Store], member: str, address: str, interval_s: float):
        self._connect = connect
        self._member = member
        self._address = address
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[HostZeroLost] = None

    def start(self) -> None:
        board = Board(self._connect(), self._member, self._address)
        board.add(heartbeat_key(self._member), 1)  # beating before anyone looks
        self._thread = threading.Thread(target=self._run, args=(board,), name=f"mccl-elastic-heartbeat-{self._member}",
                                        daemon=True)
        self._thread.start()

    def _run(self, board: Board) -> None:
        key = heartbeat_key(self._member)
        while not self._stop.wait(self._interval_s):
            try:
                board.add(key, 1)
            except HostZeroLost as e:
                self.error = e
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 5 * self._interval_s))
            self._thread = None


class Stillness:
    """How long, by this member's clock, each other member's heartbeat has not moved since it was first looked
    at: the clock starts at the first look, so a member is never found silent sooner than the threshold after."""

    def __init__(self, board: Board):
        self._board = board
        self._seen: Dict[str, Tuple[int, float]] = {}

    def still_for(self, member: str) -> float:
        value = self._board.add(heartbeat_key(member), 0)
        now = time.monotonic()
        last = self._seen.get(member)
        if last is None or last[0] != value:
            self._seen[member] = (value, now)
            return 0.0
        return now - last[1]

    def forget(self, member: str) -> None:
        self._seen.pop(member, None)


__all__ = ["Heartbeat", "Stillness", "heartbeat_key"]
