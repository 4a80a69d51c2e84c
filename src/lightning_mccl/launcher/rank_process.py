"""One rank as the launcher sees it: its `RankSpec` (what to start, where, and what to write to its stdin)
and `RankProcess`, the started local process (the rank shim, or the ssh client running it), controlled
through its stdin (see `rank_shim`), whose merged output is cut into lines. Used by `supervisor`."""
from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Tuple

# A rank's output line longer than this without a newline is passed on in pieces.
MAX_LINE_BYTES = 64 << 10


@dataclass(frozen=True)
class RankSpec:
    """One rank to run: its global rank, the host it runs on (for messages), the local argv that starts it
    (under the rank shim), that local process's environment (None: this process's) and the bytes written
    to its stdin first (the shim's spec: what must not be on a command line, see `rank_shim`). The environment
    and the spec hold the rank's variables, MCCL_AUTH_SECRET included: left out of the repr (and so of the
    reprs of `supervisor.RankExit` and `Outcome`, which hold a RankSpec)."""

    rank: int
    host: str
    argv: tuple
    env: Optional[Mapping[str, str]] = field(default=None, repr=False)
    stdin: bytes = field(default=b"", repr=False)

    @property
    def label(self) -> str:
        return f"{self.host} r{self.rank}"


class RankProcess:
    """A started (or not yet started) rank: its local process, control pipe and partial output line."""

    def __init__(self, spec: RankSpec):
        self.spec = spec
        self.proc: Optional[subprocess.Popen] = None
        self.code: Optional[int] = None
        self.stopped = False
        self.forced = False
        self.pending = b""
        self.after_cr = False  # `pending` follows a carriage return: a redraw still being written
        self.last_update: Optional[str] = None  # the last redraw passed on (not passed on twice)
        self.reading = False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.code is None

    def start(self) -> None:
        env = dict(self.spec.env) if self.spec.env is not None else None
        self.proc = subprocess.Popen(
            list(self.spec.argv), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True, bufsize=0)
        self.reading = True
        if self.spec.stdin:
            try:  # one small line: the pipe holds it whether or not the shim (or ssh) reads it yet
                self.proc.stdin.write(self.spec.stdin)
            except (BrokenPipeError, OSError):  # it exited at once: its exit code says why
                pass

    def control(self, word: str) -> None:
        stdin = self.proc.stdin if self.proc is not None else None
        if stdin is None or stdin.closed:
            return
        try:
            stdin.write(word.encode("ascii") + b"\n")
        except (BrokenPipeError, OSError, ValueError):  # it is exiting already
            pass

    def close_control(self) -> None:
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def force_kill(self) -> None:
        """SIGKILL the local process's session (the shim, or the ssh client); the last resort."""
        self.forced = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def poll(self, wait: float = 0.0) -> Optional[int]:
        if self.code is None and self.proc is not None:
            try:
                code = self.proc.wait(wait) if wait > 0 else self.proc.poll()
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                self.code = 128 - code if code < 0 else code
        return self.code

    def split_marked(self, data: bytes, final: bool = False) -> List[Tuple[str, bool]]:
        """The complete pieces of the output seen so far, each (text, redraw). A piece ended by ``\\n`` is a
        line (redraw False); the empty pieces around ``\\r``s are dropped, blank lines are kept. Of a line
        with ``\\r``s in it (a progress bar's redraws, then its last state), every piece but the last is a
        redraw; so is a piece ended by ``\\r`` whose line has not ended yet. `pending_redraw` is the text
        after the last ``\\r`` so far."""
        lines = (self.pending + data).split(b"\n")
        self.pending = lines.pop()
        out: List[Tuple[bytes, bool]] = []
        for line in lines:
            pieces = [p for p in line.split(b"\r") if p]
            if not line:
                out.append((b"", False))
            elif pieces:
                out += [(p, True) for p in pieces[:-1]] + [(pieces[-1], False)]
        head, sep, tail = self.pending.rpartition(b"\r")
        if sep:
            out.extend((p, True) for p in head.split(b"\r") if p)
            self.pending = tail
        self.after_cr = bool(sep) or (self.after_cr and not lines)
        if (final and self.pending) or len(self.pending) > MAX_LINE_BYTES:
            out.append((self.pending, False))
            self.pending, self.after_cr = b"", False
        return [(p.decode("utf-8", "replace"), redraw) for p, redraw in out]

    def split(self, data: bytes, final: bool = False) -> List[str]:
        """The texts of `split_marked`: lines and redraws alike."""
        return [text for text, _ in self.split_marked(data, final)]

    def pending_redraw(self) -> Optional[str]:
        """The redraw being written (the text after the last ``\\r``, no newline yet), or None."""
        return self.pending.decode("utf-8", "replace") if self.after_cr and self.pending else None
