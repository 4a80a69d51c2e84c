"""The member processes of an elastic job on this machine, for the elastic tests and the churn benchmark: every
member runs `command` with the job's environment (host 0's Store at MASTER_ADDR and a free MASTER_PORT, its
RANK; a joiner without one) and writes its output to <out>/<name>.out; at the end, or when a wait fails, they are
killed together and their outputs' ends shown. The waits (for a file, a line, the exits) are the callers'."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Dict, List, Optional

from ..launcher.launch_plan import LOCAL_ADDR, free_port


class MemberProcesses:
    """`world` launched members, m0 ... m<world - 1>; `start(name, env)` starts another (a joiner)."""

    def __init__(self, out: Path, world: int, command: List[str], env: Optional[Dict[str, str]] = None):
        self.out = out
        self.command = list(command)
        self.port = free_port()
        self.env = {**os.environ, "MASTER_ADDR": LOCAL_ADDR, "MASTER_PORT": str(self.port), "WORLD_SIZE": str(world),
                    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        self.procs: Dict[str, subprocess.Popen] = {}
        for rank in range(world):
            self.start(f"m{rank}", {"RANK": str(rank)})

    def start(self, name: str, env: Dict[str, str]) -> None:
        with open(self.out / f"{name}.out", "w") as log:
            self.procs[name] = subprocess.Popen(self.command, env={**self.env, **env}, stdout=log,
                                                stderr=subprocess.STDOUT)

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            p.wait(timeout=10)

    def output(self, name: str) -> str:
        return (self.out / f"{name}.out").read_text()

    def outputs(self, tail: int = 8000) -> str:
        """The end of every member's output, with its exit code: for a failure's message."""
        return "\n".join(f"--- {n} (exit {p.returncode}):\n{self.output(n)[-tail:]}" for n, p in self.procs.items())


__all__ = ["MemberProcesses"]
