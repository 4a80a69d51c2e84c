"""Starts the elastic tests' members as real processes and watches them, with a hard deadline.

`Job(tmp_path, world_size, env)` starts elastic_rank.py once per launched rank on a free port (stdout and
stderr into files); `join()` starts a joiner; `wait(timeout)` returns every process's exit code, or has the
ones still running dump their stacks (SIGUSR1), kills them all and fails naming them, with the end of each one's
output. Nothing is masked: a member's exit code and output are the test's to check. The processes themselves
are `lightning_mccl.testing.members`', which the churn benchmark shares.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Dict, Optional

from lightning_mccl.launcher import free_port
from lightning_mccl.testing.members import MemberProcesses

HERE = Path(__file__).resolve().parent
RANK_PROGRAM = HERE / "elastic_rank.py"


class Job(MemberProcesses):
    def __init__(self, out: Path, world_size: int, env: Dict[str, str]):
        super().__init__(out, world_size, [sys.executable, str(RANK_PROGRAM)],
                         {"ELASTIC_OUT": str(out), "OMP_NUM_THREADS": "1", **env})

    def join(self, name: str = "joiner", env: Optional[Dict[str, str]] = None) -> None:
        self.start(name, {"ELASTIC_JOIN": "1", **(env or {})})

    def await_file(self, name: str, timeout: float) -> float:
        """Until <out>/<name> exists (a member wrote it); fails if a member exits with an error first."""
        deadline = time.monotonic() + timeout
        while not (self.out / name).exists():
            failed = {n: p.returncode for n, p in self.procs.items() if p.poll() not in (None, 0)}
            if failed or time.monotonic() > deadline:
                self.kill_all()
                raise AssertionError(f"{name} was not written within {timeout:g} s (exited: {failed})\n"
                                     f"{self.outputs()}")
            time.sleep(0.02)
        return float((self.out / name).read_text() or 0)

    def await_output(self, name: str, text: str, timeout: float) -> None:
        """Until `name`'s output holds `text`."""
        deadline = time.monotonic() + timeout
        while text not in self.output(name):
            if time.monotonic() > deadline:
                self.kill_all()
                raise AssertionError(f"{name} did not print {text!r} within {timeout:g} s\n{self.outputs()}")
            time.sleep(0.02)

    def signal(self, name: str, sig: int) -> float:
        os.kill(self.procs[name].pid, sig)
        return time.time()

    def wait(self, timeout: float, names=None) -> Dict[str, int]:
        """The exit codes of `names` (default: every process) once they have all exited."""
        deadline = time.monotonic() + timeout
        names = list(self.procs) if names is None else names
        while any(self.procs[n].poll() is None for n in names):
            if time.monotonic() > deadline:
                running = [n for n in names if self.procs[n].poll() is None]
                for n in running:  # their Python stacks into their output, then the end
                    self.procs[n].send_signal(signal.SIGUSR1)
                time.sleep(2.0)
                self.kill_all()
                raise AssertionError(f"members {running} still ran after {timeout:g} s (their stacks are in their "
                                     f"output)\n{self.outputs()}")
            time.sleep(0.05)
        return {n: self.procs[n].returncode for n in names}

    def result(self, member: str) -> dict:
        return json.loads((self.out / f"{member}.json").read_text())


__all__ = ["Job", "free_port"]
