"""The elastic launcher tests' job: `mccl launch --local N --elastic` (or --hostfile) of a rank program of
tests/elastic/ (elastic_rank.py by default: torch's DDP over the elastic group; lightning_rank.py: a Lightning
fit), its output in files, with hard deadlines; `start` runs any other `mccl` command (`mccl join`) the same way."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_runner import MCCL, require_script
from lightning_mccl.launcher import free_port

ELASTIC = Path(__file__).resolve().parents[1] / "elastic"
ELASTIC_RANK = str(ELASTIC / "elastic_rank.py")
LIGHTNING_RANK = str(ELASTIC / "lightning_rank.py")
START_S = 60.0  # until the paused member says so
END_S = 90.0  # then until the launcher exits


class ElasticJob:
    """`mccl launch --local N --elastic ...` of elastic_rank.py on a free port (or --hostfile with `options` and
    `env`, the fake ssh's), its output in files."""

    def __init__(self, tmp_path: Path, ranks: int, *options: str, env=None, program: str = ELASTIC_RANK,
                 **scenario):
        require_script()
        self.out, self.port, self.program = tmp_path, free_port(), Path(program).name.encode()
        variables = [f"--env=ELASTIC_{k}={v}" for k, v in {"OUT": tmp_path, **scenario}.items()]
        where = ["--local", str(ranks)] if ranks else []
        self.launcher = start([MCCL, "launch", *where, "--elastic", *options, "--master-port", str(self.port),
                                *variables, "--", "python", program], tmp_path / "launcher", env)

    def await_file(self, name: str) -> None:
        deadline = time.monotonic() + START_S
        while not (self.out / name).exists():
            if self.launcher.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"{name} was not written within {START_S:g} s\n{self.output()}")
            time.sleep(0.05)

    def member_pid(self, rank: int) -> int:
        """The pid of the rank program of `rank` (its environment says ELASTIC_OUT and RANK)."""
        wanted = {f"ELASTIC_OUT={self.out}".encode(), f"RANK={rank}".encode()}
        for entry in Path("/proc").iterdir():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                environ = set((entry / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if self.program in cmdline and wanted <= environ:
                return int(entry.name)
        self.kill()
        raise AssertionError(f"no process of rank {rank}\n{self.output()}")

    def wait(self) -> int:
        try:
            return self.launcher.wait(END_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the launcher did not exit within {END_S:g} s\n{self.output()}") from None

    def kill(self) -> None:
        if self.launcher.poll() is None:
            os.killpg(self.launcher.pid, signal.SIGKILL)
            self.launcher.wait()

    def stdout(self) -> str:
        return (self.out / "launcher.out").read_text()

    def stderr(self) -> str:
        return (self.out / "launcher.err").read_text()

    def output(self) -> str:
        return f"stdout:\n{self.stdout()[-6000:]}\nstderr:\n{self.stderr()}"

    def result(self, member: str) -> dict:
        return json.loads((self.out / f"{member}.json").read_text())


def join_local(job: ElasticJob, program: str, variables) -> str:
    """`mccl join --local 1` of `program` into `job` (with its `--env=...` `variables`), until it exits 0; its
    output. Fails, naming the job's output, if it runs past END_S or exits otherwise."""
    stem = job.out / "joiner"
    joiner = start([MCCL, "join", "--local", "1", "--master-port", str(job.port), *variables, "--", "python", program],
                   stem)
    try:
        code = joiner.wait(END_S)
    except subprocess.TimeoutExpired:
        os.killpg(joiner.pid, signal.SIGKILL)
        joiner.wait()
        raise AssertionError(f"mccl join did not exit within {END_S:g} s\n{job.output()}") from None
    joined = Path(f"{stem}.out").read_text() + Path(f"{stem}.err").read_text()
    assert code == 0, joined[-4000:]
    return joined


def start(argv, stem: Path, env=None) -> subprocess.Popen:
    with open(f"{stem}.out", "w") as out, open(f"{stem}.err", "w") as err:
        return subprocess.Popen(argv, stdout=out, stderr=err, cwd=stem.parent, env=env, start_new_session=True)


@pytest.fixture
def elastic_job(tmp_path):
    """`elastic_job(ranks, *options, program=..., **scenario)` starts an ElasticJob; every one is killed at the end."""
    jobs = []

    def launch(*args, **scenario):
        jobs.append(ElasticJob(tmp_path, *args, **scenario))
        return jobs[-1]

    yield launch
    for job in jobs:
        job.kill()


needs_proc = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds a rank's pid in /proc")

__all__ = ["elastic_job", "needs_proc", "ELASTIC_RANK", "LIGHTNING_RANK", "START_S", "END_S", "ElasticJob",
           "join_local", "start"]
