"""The churn benchmark's job: its member processes (member.py) on this machine over loopback, started, asked to
leave (SIGTERM), restarted as joiners, and awaited with a hard deadline."""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Dict, List

from lightning_mccl.testing.members import MemberProcesses

MEMBER = Path(__file__).resolve().parent / "member.py"


class Job(MemberProcesses):
    """`world` members of one case, writing into `out`; `spec` is member.py's."""

    def __init__(self, out: Path, world: int, spec: dict):
        out.mkdir(parents=True, exist_ok=True)
        spec_path = out / "spec.json"
        spec_path.write_text(json.dumps({**spec, "out": str(out)}))
        self.joiners = 0
        self.asked: List[str] = []  # asked to leave
        super().__init__(out, world, [sys.executable, str(MEMBER), str(spec_path)])

    def start(self, name: str, env: Dict[str, str]) -> None:
        super().start(name, {"CHURN_NAME": name, **env})

    def join(self, go: bool = False) -> str:
        """Starts a joiner; its process name (p1, p2, ...: the manager names it j<k> once admitted). With `go`
        it waits, torch imported and its model built, until `cue(name)` (a host that is back, ready to join)."""
        self.joiners += 1
        name = f"p{self.joiners}"
        self.start(name, {"CHURN_JOIN": "1", **({"CHURN_GO": str(self.out / f"go-{name}")} if go else {})})
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

    def records(self) -> Dict[str, dict]:
        """Every member's record, by its member id (m0, m1, ..., j1, ...)."""
        return {p.stem: json.loads(p.read_text()) for p in sorted(self.out.glob("[mj]*.json"))}
