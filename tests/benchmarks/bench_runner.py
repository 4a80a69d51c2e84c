"""`run_script`: runs a benchmark script as a user does, with a hard deadline."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def run_script(name: str, *args, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """`python benchmarks/NAME ARGS...` to completion. Past `timeout` it gets SIGTERM (the script then stops its
    ranks and takes down any switch it made), SIGKILL 15 s later, and the test fails."""
    proc = subprocess.Popen([sys.executable, str(BENCH / name), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        raise AssertionError(f"{name} {' '.join(map(str, args))} did not finish within {timeout:g} s\n"
                             f"--- stdout:\n{out[-3000:]}\n--- stderr:\n{err[-5000:]}")
    proc.stdout_text, proc.stderr_text = out, err
    return proc


def explain(proc) -> str:
    return f"exit code {proc.returncode}\n--- stdout:\n{proc.stdout_text[-3000:]}\n--- stderr:\n{proc.stderr_text[-5000:]}"
