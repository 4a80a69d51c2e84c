"""The board: host 0's Store as the elastic layer uses it.

Every key lives under one prefix (``mccl/elastic/``). Every operation that fails because the Store is gone
raises `HostZeroLost` (the Store is served by host 0's process, which must stay). Waiting for a key polls
`check` rather than calling the Store's own ``wait`` with a timeout, which logs two C++ warnings each time it
times out; the poll starts at 1 ms and backs off (`POLL_S`).

An append-only log (`append`, `read_log`) is a counter plus one key per entry: ``<name>/n`` counts the
entries, ``<name>/<k>`` holds entry k (1-based). A reader keeps its own cursor.
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterable, List, Optional, Tuple

import torch.distributed as dist

from .errors import store_failure

PREFIX = "mccl/elastic/"
POLL_S = (0.001, 0.005, 0.05)  # a wait's first pause between checks, the longest in its first second, after
LOG_ENTRY_WAIT_S = 2.0  # how long a reader waits for a counted log entry to be written before skipping it


class Pauses:
    """The sleeps of one poll: 1 ms doubling to 5 ms, and 50 ms once it has waited a second."""

    def __init__(self):
        self._start = time.monotonic()
        self._pause = POLL_S[0]

    def sleep(self) -> None:
        longest = POLL_S[1] if time.monotonic() - self._start < 1.0 else POLL_S[2]
        time.sleep(min(self._pause, longest))
        self._pause = min(self._pause * 2, longest)


class Board:
    """Host 0's Store under the elastic prefix, for member `member` (named in HostZeroLost)."""

    def __init__(self, store: dist.Store, member: str, address: str):
        self.store = store
        self.member = member
        self.address = address

    def _call(self, op, *args):
        try:
            return op(*args)
        except dist.DistError as e:  # DistNetworkError: the server closed; DistStoreError: it timed out
            raise store_failure(self.member, self.address, e) from None

    def set(self, key: str, value: Any) -> None:
        self._call(self.store.set, PREFIX + key, json.dumps(value))

    def get(self, key: str) -> Any:
        return json.loads(self._call(self.store.get, PREFIX + key))

    def has(self, keys: Iterable[str]) -> bool:
        return bool(self._call(self.store.check, [PREFIX + k for k in keys]))

    def add(self, key: str, amount: int) -> int:
        return int(self._call(self.store.add, PREFIX + key, amount))

    def set_once(self, key: str, value: Any) -> Any:
        """Write `value` unless the key holds a value already; returns the value the key holds after (the
        first writer's: every caller gets the same one)."""
        text = json.dumps(value)
        return json.loads(self._call(self.store.compare_set, PREFIX + key, "", text))

    def compare_set(self, key: str, expected: int, desired: int) -> int:
        """A counter (as `add` keeps it) set to `desired` if it holds `expected`; returns what it holds after."""
        return int(self._call(self.store.compare_set, PREFIX + key, str(expected), str(desired)))

    def delete(self, key: str) -> None:
        self._call(self.store.delete_key, PREFIX + key)

    def get_many(self, keys: List[str]) -> List[Any]:
        """The values of keys known to be set, in one round trip."""
        return [json.loads(v) for v in self._call(self.store.multi_get, [PREFIX + k for k in keys])]

    def get_when_set(self, key: str, deadline: float) -> Optional[Any]:
        """The key's value once it is set; None if it is still unset at `deadline` (time.monotonic())."""
        pauses = Pauses()
        while not self.has([key]):
            if time.monotonic() >= deadline:
                return None
            pauses.sleep()
        return self.get(key)

    # ---- append-only logs -----------------------------------------------------------------------------------

    def append(self, log: str, value: Any) -> int:
        index = self.add(f"{log}/n", 1)
        self.set(f"{log}/{index}", value)
        return index

    def read_log(self, log: str, after: int) -> Tuple[List[Tuple[int, Any]], int]:
        """The (index, entry) pairs after index `after`, and the index to read after next time. An entry
        counted but not written within LOG_ENTRY_WAIT_S (its writer died between the two) is skipped."""
        count = self.add(f"{log}/n", 0)
        entries = []
        for index in range(after + 1, count + 1):
            value = self.get_when_set(f"{log}/{index}", time.monotonic() + LOG_ENTRY_WAIT_S)
            if value is not None:
                entries.append((index, value))
        return entries, max(after, count)


__all__ = ["Board", "Pauses", "PREFIX"]
