"""`mccl launch` keeps secrets off every command line.

While a real two-rank mccl job runs (``--local``, and ``--hostfile`` through the stand-in ssh in fake_bin),
the test reads the command line of every process on this machine (/proc/*/cmdline), the remote commands the
fake ssh was given, and every base64 word in them decoded, and finds neither MCCL_AUTH_SECRET nor a
``--env MY_API_TOKEN`` value. The ranks still see both (they report hashes) and authenticate with the
secret: their allreduce is right.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess
from pathlib import Path

import pytest

from cli_runner import MCCL, RANK_PROGRAMS, RUN_TIMEOUT_S, env_with_fake_ssh, fake_ssh_calls, require_script, wait_for_files
from lightning_mccl.launcher import SHIM_BOOTSTRAP, Outcome, RankExit, RankSpec, local_plan

_BASE64_WORD = re.compile(rb"[A-Za-z0-9+/_-]{16,}={0,2}")


def _decoded_words(data: bytes, depth: int = 0):
    """`data` and every base64 run in it decoded (and base64 inside that, twice over)."""
    yield data
    if depth >= 2:
        return
    for word in _BASE64_WORD.findall(data):
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                inner = decode(word + b"=" * (-len(word) % 4))
            except (binascii.Error, ValueError):
                continue
            yield from _decoded_words(inner, depth + 1)


def _command_lines():
    """{pid: cmdline bytes} of every process we may read (others are gone or not ours to see)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes()
            except OSError:
                continue
    return out


def _descendants(root: int) -> set:
    """The pids below `root` in the process tree (other tests' jobs run beside this one under pytest-xdist)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    below, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - below
        below |= frontier
    return below


def _leaks(text: bytes, needles) -> list:
    return [name for name, value in needles.items() if any(value in d for d in _decoded_words(text))]


def _hostfile(path: Path) -> Path:
    path.write_text("hosts:\n  - {name: mac-0, addr: 127.0.0.1}\n  - {name: mac-1, addr: 127.0.0.2}\n")
    return path


def test_reprs_of_plans_specs_and_outcomes_hold_no_secret():
    """A plan, its rank specs and the outcome that holds them may be printed (a log, a traceback, pytest's
    assertion rewriting): none of their reprs shows MCCL_AUTH_SECRET or an --env value, raw or in base64."""
    needles = {"MCCL_AUTH_SECRET": secrets.token_hex(24).encode(), "MY_API_TOKEN": secrets.token_hex(20).encode()}
    plan = local_plan(2, ["python", "train.py"], env={"MY_API_TOKEN": needles["MY_API_TOKEN"].decode()})
    specs = plan.rank_specs(base_env={"MCCL_AUTH_SECRET": needles["MCCL_AUTH_SECRET"].decode()})
    assert all(_leaks(s.stdin, needles) == list(needles) for s in specs)  # the specs do carry both
    with_env = RankSpec(0, "local", ("python",), env={"MCCL_AUTH_SECRET": needles["MCCL_AUTH_SECRET"].decode()})
    failed = RankExit(spec=specs[1], returncode=1, stopped=False)
    outcome = Outcome(returncode=1, reason="failed", exits=(RankExit(specs[0], 0, True), failed), failed=failed)
    for shown in (plan, *specs, with_env, failed, outcome):
        text = repr(shown)
        assert "local" in text and not _leaks(text.encode(), needles), text


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
@pytest.mark.parametrize("via", ["local", "ssh"])
def test_no_secret_on_any_command_line_while_a_job_runs(tmp_path, via):
    require_script()
    needles = {"MCCL_AUTH_SECRET": secrets.token_hex(24).encode(), "MY_API_TOKEN": secrets.token_hex(20).encode()}
    log = tmp_path / "ssh.log"
    env = env_with_fake_ssh(log, MCCL_AUTH_SECRET=needles["MCCL_AUTH_SECRET"].decode(),
                            MY_API_TOKEN=needles["MY_API_TOKEN"].decode())
    env.pop("MCCL_AUTH_SECRET_FILE", None)
    where = ["--local", "2"] if via == "local" else ["--hostfile", str(_hostfile(tmp_path / "fleet.yaml")),
                                                      "--ssh", "ssh -o BatchMode=yes"]
    argv = [MCCL, "launch", *where, "--env", "MY_API_TOKEN", "--", "python", RANK_PROGRAMS, "secret", str(tmp_path)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        try:
            wait_for_files([tmp_path / "ready-0.json", tmp_path / "ready-1.json"], timeout=RUN_TIMEOUT_S)
        except AssertionError:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"the job never got ready:\n{out.decode()}\n{err.decode()}") from None
        lines = _command_lines()  # the job is running: launcher, shims (or fake ssh) and ranks all alive
        ours = _descendants(proc.pid)
        (tmp_path / "go").touch()
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    out, err = out.decode(), err.decode()
    assert proc.returncode == 0, out + err

    reports = [json.loads((tmp_path / f"ready-{r}.json").read_text()) for r in (0, 1)]
    assert {json.dumps(r["sha256"], sort_keys=True) for r in reports} == {json.dumps(
        {k: hashlib.sha256(v).hexdigest() for k, v in needles.items()}, sort_keys=True)}  # the ranks have both
    assert all(r["sum"] == [3.0] * 4 for r in reports)  # and authenticated with the secret: the job works
    shims = [pid for pid, line in lines.items() if SHIM_BOOTSTRAP.encode() in line and pid in ours]
    ranks = [r["pid"] for r in reports]
    assert len(shims) == 2 and all(pid in lines and pid in ours for pid in ranks), \
        "the scan did not see the job's processes"

    leaks = {pid: _leaks(line, needles) for pid, line in lines.items()}
    assert not {pid: names for pid, names in leaks.items() if names}, \
        {pid: lines[pid][:300] for pid, names in leaks.items() if names}
    if via == "ssh":
        calls = fake_ssh_calls(log)  # what ssh was asked to run on each host
        assert sorted(h for h, _ in calls) == ["mac-0", "mac-1"]
        assert not [remote for _, remote in calls if _leaks(remote.encode(), needles)]
    for name, value in needles.items():  # nor in the launcher's own output
        assert value.decode() not in out + err, name
