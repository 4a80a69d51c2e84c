"""Lightning under `mccl launch`, on one machine (--local) and on a fleet (--hostfile, through the stand-in
ssh): a Trainer(num_nodes x devices) that does not match the launched world is torchrun's clear error on the
ranks within seconds (not a silent wait for ranks that were never launched), and Ctrl-C ends a training job
with one line per rank: no shutdown tracebacks, no C++ frames, no rank blaming a crashed peer. (--switch
starts the same rank shim inside each host's network namespace instead of over ssh: test_switch.py launches
ranks there.)"""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_runner import MCCL, env_with_fake_ssh, killed_on_error, require_script, run_mccl, wait_for_files
from test_launch import prefixed, write_hostfile

pytestmark = pytest.mark.slow  # make test-quick leaves these out (docs/testing.md)

PROGRAM = str(Path(__file__).resolve().parent / "lightning_rank.py")
MISMATCH = "ValueError: You set `devices=1` and `num_nodes=4` in Lightning, but the product (1 * 4) does not match the world size (2)."
# From the moment a rank has imported torch and Lightning to the launcher's exit (an import alone takes
# several seconds on a busy 2-core machine; that is not what is measured).
ERROR_WITHIN_S = 15.0


def _where(mode, tmp_path):
    if mode == "local":
        return ["--local", "2"], None
    return ["--hostfile", write_hostfile(tmp_path / "fleet.yaml", 2)], env_with_fake_ssh()


@pytest.mark.parametrize("mode", ["local", "hostfile"])
def test_a_num_nodes_mismatch_is_a_clear_error_within_seconds(mode, tmp_path):
    where, env = _where(mode, tmp_path)
    r = run_mccl("launch", *where, "--master-port", "29561", "--", "python", PROGRAM, "4", tmp_path, env=env)
    done = time.time()
    assert r.returncode == 1, r.stdout + r.stderr
    out = prefixed(r.stdout)
    failed = [label for label, lines in out.items() if MISMATCH in lines]
    assert failed, r.stdout  # the first rank to fail stops the other, which may not get as far
    assert "stopping the other 1 rank" in r.stderr and "failed: rank" in r.stderr, r.stderr
    ready = [float((tmp_path / f"ready-{rank}").read_text()) for rank in (0, 1) if (tmp_path / f"ready-{rank}").exists()]
    assert ready and done - min(ready) < ERROR_WITHIN_S, (done - min(ready), r.stdout)


def test_devices_other_than_the_ranks_launched_on_a_node_is_a_clear_error(tmp_path):
    """`--local 2` is one node of 2 ranks (as torchrun --nproc-per-node 2): Trainer(devices=1, num_nodes=2) has the
    right product, which is all Lightning compares, but would make each rank its node's first. The strategy names
    the launcher's LOCAL_WORLD_SIZE instead of failing later on a device index."""
    r = run_mccl("launch", "--local", "2", "--master-port", "29563", "--", "python", PROGRAM, "2", tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    error = ("ValueError: You set `devices=1` and `num_nodes=2` in Lightning, but the launcher started 2 processes on "
             "this node (LOCAL_WORLD_SIZE=2): set devices=2")
    assert any(error in line for lines in prefixed(r.stdout).values() for line in lines), r.stdout
    assert "IndexError" not in r.stdout + r.stderr, r.stdout + r.stderr


def test_ctrl_c_stops_a_training_job_with_one_line_per_rank(tmp_path):
    require_script()
    proc = subprocess.Popen([MCCL, "launch", "--local", "2", "--", "python", PROGRAM, "1", str(tmp_path), "--long",
                             "--devices", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    with killed_on_error(proc):
        wait_for_files([tmp_path / "training-0", tmp_path / "training-1"], timeout=120)
        time.sleep(1.0)  # both ranks in the middle of their allreduces
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    lines = prefixed(out)
    for label in ("local r0", "local r1"):
        stopped = [t for t in lines[label] if t.startswith("stopped by the launcher (exit code ")]
        assert len(stopped) == 1, out
    everything = out + err
    for noise in ("Traceback", "frame #", "crashed", "KeyboardInterrupt"):
        assert noise not in everything, everything
    assert len(err.splitlines()) <= 4, err  # launching ..., `python` runs as ..., received SIGINT ..., stopped
    assert "received SIGINT: stopping all ranks" in err and "stopped (signal); exit code 130" in err, err
