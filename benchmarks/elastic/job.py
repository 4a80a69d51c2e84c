"""The churn benchmark's job: its member processes (member.py) on this machine over loopback, started, asked to
leave (SIGTERM), restarted as joiners, and awaited with a hard deadline."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

MEMBER = Path(__file__).resolve().parent / "member.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """`world` members of one case, writing into `out`; `spec` is member.py's."""

    def __init__(self, out: Path, world: int, spec: dict):
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        spec_path = out / "spec.json"
        spec_path.write_text(json.dumps({**spec, "out": str(out)}))
        self.command = [sys.executable, str(MEMBER), str(spec_path)]
        self.env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                    "WORLD_SIZE": str(world), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                    "PYTHONUNBUFFERED": "1"}
        self.procs: Dict[str, subprocess.Popen] = {}
        self.joiners = 0
        self.asked: List[str] = []  # asked to leave
        for rank in range(world):
            self._start(f"m{rank}", {"RANK": str(rank)})

    def _start(self, name: str, env: Dict[str, str]) -> None:
        with open(self.out / f"{name}.out", "w") as log:
            self.procs[name] = subprocess.Popen(self.command, env={**self.env, "CHURN_NAME": name, **env}, stdout=log,
                                                stderr=subprocess.STDOUT)

    def join(self, go: bool = False) -> str:
        """Starts a joiner; its process name (p1, p2, ...: the manager names it j<k> once admitted). With `go`
        it waits, torch imported and its model built, until `cue(name)` (a host that is back, ready to join)."""
        self.joiners += 1
        name = f"p{self.joiners}"
        self._start(name, {"CHURN_JOIN": "1", **({"CHURN_GO": str(self.out / f"go-{name}")} if go else {})})
        return name

    def cue(self, name: str) -> None:
        (self.out / f"go-{name}").write_text(str(time.time()))

    def leave(self, name: str) -> None:
        """Asks `name` to leave (SIGTERM: it leaves at its next step boundary)."""
        self.asked.append(name)
        self.procs[name].send_signal(signal.SIGTERM)

    def training(self, name: str) -> bool:
        """`name` has started its first step (a joiner: it was admitted)."""
        return (self.out / f"training-{name}").exists()

    def running(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def failed(self) -> Dict[str, int]:
        """Members that exited with an error; not one asked to leave that SIGTERM ended (it had finished training
        and closed its manager when the request came)."""
        return {n: p.returncode for n, p in self.procs.items() if p.poll() not in (None, 0)
                and not (n in self.asked and p.returncode == -signal.SIGTERM)}

    def await_file(self, name: str, deadline: float) -> None:
        while not (self.out / name).exists():
            self.check(deadline, f"{name} was not written")
            time.sleep(0.05)

    def wait(self, deadline: float, names: List[str] = None) -> None:
        names = list(self.procs) if names is None else names
        while any(self.procs[n].poll() is None for n in names):
            self.check(deadline, "members still ran")
            time.sleep(0.1)
        self.check(deadline, "")

    def check(self, deadline: float, what: str) -> None:
        """Kills every member and raises when one exited with an error, or (`what`) when the deadline passed."""
        failed = self.failed()
        if failed or time.monotonic() > deadline:
            self.kill_all()
            why = f"members exited with errors: {failed}" if failed else f"{what} by the deadline"
            raise RuntimeError(f"{why}; the end of each member's output:\n{self.outputs()}")

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            p.wait(timeout=10)

    def outputs(self) -> str:
        return "\n".join(f"--- {n} (exit {p.returncode}):\n{(self.out / f'{n}.out').read_text()[-3000:]}"
                         for n, p in self.procs.items())

    def records(self) -> Dict[str, dict]:
        """Every member's record, by its member id (m0, m1, ..., j1, ...)."""
        return {p.stem: json.loads(p.read_text()) for p in sorted(self.out.glob("[mj]*.json"))}
