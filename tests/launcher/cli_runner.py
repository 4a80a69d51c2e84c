"""Helpers for the `mccl` command tests: run the installed script with a deadline, put the fake ssh first on
PATH, and check that processes are gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
RANK_PROGRAMS = str(HERE / "rank_programs.py")
FAKE_BIN = str(HERE / "fake_bin")
# The script `pip install -e .` puts next to the interpreter ([project.scripts] mccl).
MCCL = str(Path(sys.executable).parent / "mccl")
# Every `mccl` run in the tests ends within this, or the test fails (after killing it).
RUN_TIMEOUT_S = 90


def require_script() -> None:
    if not os.access(MCCL, os.X_OK):
        raise AssertionError(f"{MCCL} is missing: reinstall the package (pip install --no-build-isolation -e .)")


def env_with_fake_ssh(log_path=None, **extra) -> dict:
    env = dict(os.environ)
    env["PATH"] = FAKE_BIN + os.pathsep + env.get("PATH", "")
    if log_path is not None:
        env["FAKE_SSH_LOG"] = str(log_path)
    env.update(extra)
    return env


def fake_ssh_calls(log_path) -> list:
    """(host, remote command) of every fake ssh started with env_with_fake_ssh(log_path), in no order."""
    calls = []
    for path in sorted(Path(log_path).parent.glob(Path(log_path).name + ".*")):
        for line in path.read_text().splitlines():
            host, remote = line.split("\t", 1)
            calls.append((host, remote))
    return calls


def run_mccl(*args, timeout: float = RUN_TIMEOUT_S, env=None, cwd=None) -> subprocess.CompletedProcess:
    """`mccl ARGS...` to completion (killed and failed after `timeout`); .elapsed holds its wall time."""
    require_script()
    start = time.monotonic()
    proc = subprocess.Popen([MCCL, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"mccl {' '.join(map(str, args))} did not finish within {timeout} s\n"
                             f"stdout:\n{out}\nstderr:\n{err}")
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    result.elapsed = time.monotonic() - start
    return result


@contextmanager
def killed_on_error(proc: subprocess.Popen):
    """Kills `proc`'s session (started with start_new_session=True) and collects it when the block fails,
    so that no test leaves a launcher and its ranks running."""
    try:
        yield
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def assert_all_gone(pids, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if alive(p)]
        if not left:
            return
        if time.monotonic() > deadline:
            for p in left:  # do not leak them into the rest of the test run
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            raise AssertionError(f"processes {left} outlived the launcher")
        time.sleep(0.05)


def wait_for_files(paths, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            raise AssertionError(f"never appeared: {[p for p in paths if not os.path.exists(p)]}")
        time.sleep(0.05)
