"""Rank 0's progress while a job runs (launcher/progress.py): a progress bar's redraws (pieces of output ended
by a carriage return) are told apart from lines, drawn in place on a terminal, and reach a log as a status
line now and then; then real Lightning fits under `mccl launch` (--local, a hostfile through the stand-in
ssh, and an emulated switch where root may make one), whose progress lines arrive while the fit runs, not
at its end."""
from __future__ import annotations

import contextlib
import io
import os
import pty
import re
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cli_runner import MCCL, RUN_TIMEOUT_S, env_with_fake_ssh, require_script
from lightning_mccl.launcher import PrefixedOutput, ProgressLines, RankProcess, RankSpec
from lightning_mccl.launcher.progress import rank_env, status_line
from lightning_mccl.switch import SwitchFleet, privilege_problem, random_tag
from test_launch import write_hostfile

PROGRAM = str(Path(__file__).resolve().parent / "lightning_rank.py")
SWITCH_PROBLEM = privilege_problem()
BAR = ("\x1b[?25l\x1b[2KEpoch 0/1  \x1b[35m━━━━\x1b[0m\x1b[90m━━━━\x1b[0m 5/16 \x1b[2m0:00:01\x1b[0m "
       "\x1b[3mloss: 0.42\x1b[0m")
R0, R1 = RankSpec(0, "mac-0", ()), RankSpec(1, "mac-1", ())


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_redraws_are_told_apart_from_lines():
    r = RankProcess(R0)
    assert r.split_marked(b"start\n\rstep 1\rstep 2\rst") == [("start", False), ("step 1", True), ("step 2", True)]
    assert r.pending_redraw() == "st"  # a redraw still being written: shown as it is
    assert r.split_marked(b"ep 3\rdone 4/4\n") == [("step 3", True), ("done 4/4", False)]  # the bar's last state
    assert r.pending_redraw() is None
    assert r.split_marked(b"half a line") == [] and r.pending_redraw() is None  # no carriage return: a line
    assert r.split(b"\r\n") == ["half a line"]


def test_a_log_gets_a_status_line_now_and_then_and_every_line():
    out = io.StringIO()
    now = [100.0]
    stage = ProgressLines(PrefixedOutput([R0, R1], out), every_s=30.0, clock=lambda: now[0])
    stage.update(R0, BAR)  # the first redraw at once
    now[0] += 10
    stage.update(R0, BAR.replace("5/16", "6/16"))  # within 30 s: not shown
    stage.update(R1, "\r\x1b[2K")  # nothing to show
    stage.line(R1, "\x1b[1mrank 1 says\x1b[0m")
    now[0] += 25
    stage.update(R0, BAR.replace("5/16", "9/16"))
    assert out.getvalue().splitlines() == ["[mac-0 r0] Epoch 0/1 5/16 0:00:01 loss: 0.42", "[mac-1 r1] rank 1 says",
                                           "[mac-0 r0] Epoch 0/1 9/16 0:00:01 loss: 0.42"]
    assert status_line("\x1b[2K 45%|████▌     | 9/20 [00:01<00:01, 8.1it/s, loss=0.4]") == \
        "45%| | 9/20 [00:01<00:01, 8.1it/s, loss=0.4]"  # tqdm's bar too


def test_on_a_terminal_rank_0s_progress_is_one_line_redrawn_in_place_below_the_others():
    out = Terminal()
    prefixed = PrefixedOutput([R0, R1], out)
    stage = ProgressLines(prefixed, every_s=30.0)
    stage.update(R0, BAR)
    stage.update(R0, BAR.replace("5/16", "6/16"))
    stage.line(R1, "rank 1 says")
    prefixed.clear_live()
    text = out.getvalue()
    prefix0 = "\r\x1b[36m[mac-0 r0]\x1b[0m "
    draws = [d for d in text.split(prefix0)[1:]]
    assert len(draws) == 3, repr(text)  # each redraw, and again below rank 1's line
    assert draws[0].startswith("Epoch 0/1  \x1b[35m━━━━\x1b[0m")
    assert "\x1b[?25l" not in text and "\x1b[2K" not in text  # the rank's own cursor moves are not passed on
    assert "6/16" in draws[1] and draws[1].endswith("\x1b[0m\x1b[K\r\x1b[K\x1b[33m[mac-1 r1]\x1b[0m rank 1 says\n")
    assert text.endswith("\x1b[K\r\x1b[K")  # erased for a message of the launcher's own
    prefixed.update(R0, "Epoch 0/1 " + "x" * 500)
    assert len(out.getvalue().rsplit("\r", 2)[-2]) < 200  # cut to the terminal's width, never wrapped


def test_ranks_are_told_their_output_takes_redraws_unless_the_launcher_is_told_otherwise():
    assert rank_env(107, {}) == {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "107"}
    assert rank_env(107, {"COLUMNS": "80"}) == {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    assert rank_env(107, {"TTY_COMPATIBLE": "0"}) == {}


# -- real fits ---------------------------------------------------------------------------------------------------

def _launch(argv, env, stdout):
    require_script()
    return subprocess.Popen([MCCL, *map(str, argv)], stdout=stdout, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)


def _read_timed(fd: int, proc: subprocess.Popen, chunks: list) -> None:
    """Appends (arrival time, bytes) of everything on `fd` until it ends and `proc` exited."""
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:  # a pty whose other side closed
                data = b""
            if data:
                chunks.append((time.time(), data))
                continue
            return
        if proc.poll() is not None:
            return


def _run_fit(tmp_path, where, env, terminal: bool):
    argv = ["launch", *where, "--progress-every", "0.5", "--", "python", PROGRAM, "2", tmp_path, "--progress"]
    chunks: list = []
    if terminal:
        master, slave = pty.openpty()
        proc = _launch(argv, env, slave)
        os.close(slave)
        fd = master
    else:
        proc = _launch(argv, env, subprocess.PIPE)
        fd = proc.stdout.fileno()
    reader = threading.Thread(target=_read_timed, args=(fd, proc, chunks), daemon=True)
    reader.start()
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"mccl launch did not finish within {RUN_TIMEOUT_S} s")
    finally:
        reader.join(10)
        if terminal:
            os.close(master)
    err = proc.stderr.read().decode()
    out = b"".join(d for _, d in chunks).decode()
    assert proc.returncode == 0, out + err
    fit_ended = min(float((tmp_path / f"fit-ended-{r}").read_text()) for r in (0, 1))
    return chunks, out, fit_ended


@contextlib.contextmanager
def _fleet(via, tmp_path):
    """(where, env, rank 0's label) of 2 ranks on 2 hosts: this machine, the stand-in ssh, or an emulated switch."""
    if via == "local":
        yield ["--local", "2", "--nproc-per-node", "1"], None, "local r0"
    elif via == "ssh":
        yield ["--hostfile", write_hostfile(tmp_path / "fleet.yaml", 2)], env_with_fake_ssh(), "mac-0 r0"
    else:
        with SwitchFleet(2, "1gbit", tag=random_tag()) as fleet:
            yield ["--switch", fleet.tag], None, "h0 r0"


@pytest.mark.slow
@pytest.mark.parametrize("via", ["local", "ssh", pytest.param("switch", marks=pytest.mark.skipif(
    SWITCH_PROBLEM is not None, reason=f"switch emulator unavailable: {SWITCH_PROBLEM}"))])
def test_progress_lines_reach_a_log_while_the_fit_runs(tmp_path, via):
    with _fleet(via, tmp_path) as (where, env, label):
        chunks, out, fit_ended = _run_fit(tmp_path, where, env, terminal=False)
    status = re.compile(rb"\[" + re.escape(label.encode()) + rb"\]\s+Epoch \d+/\d+ \d+/\d+ .*loss: \d")
    early = [t for t, data in chunks for line in data.splitlines() if status.search(line) and t < fit_ended]
    assert len(early) >= 2, out  # more than one status line before trainer.fit returned
    assert "\x1b" not in out and "\r" not in out, repr(out[-2000:])  # a log: no escape sequences, no redraws
    assert not re.search(r"r1\]\s+Epoch", out), out  # the other rank shows no progress


@pytest.mark.slow
def test_on_a_terminal_rank_0s_bar_is_redrawn_in_place_while_the_fit_runs(tmp_path):
    chunks, out, fit_ended = _run_fit(tmp_path, ["--local", "2", "--nproc-per-node", "1"], None, terminal=True)
    redraw = re.compile(rb"\r\x1b\[36m\[local r0\]\x1b\[0m +Epoch \d+/\d+ .*?\d+/\d+")
    early = [t for t, data in chunks for _ in redraw.finditer(data) if t < fit_ended]
    assert len(early) >= 5, repr(out[-2000:])
    assert "\x1b[?25l" not in out and "\x1b[2K" not in out  # the rank's own cursor moves are not passed on
