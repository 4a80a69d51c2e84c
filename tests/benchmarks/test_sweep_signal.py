"""A benchmark told to stop (Ctrl-C, the SIGTERM of a budget's `timeout`) stops its ranks and ends: it does not
go on to its next launch, which would run past the budget that sent the signal."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
sys.path.insert(0, {bench!r})
from sweep.launch import LaunchFailed, placement
with placement(2) as where:
    for k in range(2):  # as convergence.py does: a failed launch is reported, and the next one runs
        print(f"launch {{k}}", flush=True)
        try:
            where.run([sys.executable, "-c", "import time; print('rank up', flush=True); time.sleep(60)"],
                      env={{}}, timeout=120)
        except LaunchFailed as e:
            print(f"failed: {{e}}", flush=True)
"""


def test_a_signal_ends_the_benchmark_not_just_its_launch(tmp_path):
    script = tmp_path / "two_launches.py"
    script.write_text(SCRIPT.format(bench=str(ROOT / "benchmarks")))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, start_new_session=True)
    # The hard deadline: a script that hangs silently is killed, which ends the reads below.
    watchdog = threading.Timer(90, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        lines = []
        deadline = time.monotonic() + 60
        while sum("rank up" in line for line in lines) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        assert sum("rank up" in line for line in lines) == 2, "".join(lines)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines) + out
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "received SIGTERM: stopping all ranks" in out
    assert "launch 1" not in out, out
