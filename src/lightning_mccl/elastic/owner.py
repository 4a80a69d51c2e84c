"""A Mac whose owner logs in leaves the job: opt-in (`ElasticSettings(leave_when_owner_logs_in=True)`, or
`mccl launch --elastic --leave-on-login`).

A fleet of workstations belongs to people. When someone logs in at a member's screen, the member asks to leave
at the next step boundary (through the Store's leave log, as `mccl leave` does, so the line every member prints
says why: "its owner alice logged in at the console"), its process ends, and the Mac is its owner's again; the
others go on. Who is logged in at the screen is the owner of /dev/console (``stat -f %Su /dev/console``: root
while the login window shows, `mccl doctor` reads it the same way). What counts is a change: someone logs in
where nobody was, or another user than the one logged in when the job started (a Mac the job was launched from
at its keyboard does not leave at once). Off macOS (no console user to read) nothing is watched.

`OwnerWatch(read, ask, interval_s)` is the thread; `read` returns the console user ("" for nobody, None where it
cannot tell), `ask(why)` asks to leave. Tested with a stand-in for `read`; not run on a Mac.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from typing import Callable, Optional

from ..launcher.mac_checks import console_user as probed_console_user

CONSOLE = ["stat", "-f", "%Su", "/dev/console"]


def console_user() -> Optional[str]:
    """The user logged in at this Mac's screen ("" for nobody); None off macOS or when `stat` fails."""
    if sys.platform != "darwin":
        return None
    try:
        done = subprocess.run(CONSOLE, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return probed_console_user({"commands": {"console": (done.returncode, done.stdout)}})


class OwnerWatch:
    """Asks to leave once a user logs in at the console (module docstring)."""

    def __init__(self, read: Callable[[], Optional[str]], ask: Callable[[str], None], interval_s: float):
        self._read, self._ask, self._interval_s = read, ask, interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.asked: Optional[str] = None  # why it asked to leave, once it has

    def start(self) -> None:
        first = self._read()
        if first is None:
            return  # nothing to watch here
        self._thread = threading.Thread(target=self._run, args=(first,), name="mccl-elastic-owner", daemon=True)
        self._thread.start()

    def _run(self, first: str) -> None:
        while not self._stop.wait(self._interval_s):
            user = self._read()
            if user and user != first:
                self.asked = f"its owner {user} logged in at the console"
                self._ask(self.asked)
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 2 * self._interval_s))
            self._thread = None


__all__ = ["OwnerWatch", "console_user"]
