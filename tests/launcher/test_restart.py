"""`mccl launch --max-restarts`: a failed job is stopped and started again, whole, up to N times."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_runner import MCCL, RANK_PROGRAMS, assert_all_gone, env_with_fake_ssh, require_script, run_mccl, wait_for_files
from lightning_mccl.cli import main
from lightning_mccl.launcher import local_plan
from test_launch import pids_of, prefixed, write_hostfile


def attempts(out_dir: Path, world: int) -> dict:
    """{attempt: {rank: record}} of what each rank recorded (see rank_programs.flaky)."""
    out: dict = {}
    for p in out_dir.glob("attempt-*-rank*.json"):
        attempt, rank = p.stem.removeprefix("attempt-").split("-rank")
        out.setdefault(int(attempt), {})[int(rank)] = json.loads(p.read_text())
    assert all(len(v) == world for v in out.values()), out
    return out


def test_next_attempt_counts_restarts_and_picks_the_port():
    plan = local_plan(2, ["train"], max_restarts=2)
    again = plan.next_attempt(fresh_port=True)
    assert (plan.restart, again.restart, again.max_restarts) == (0, 1, 2) and again.master_port != plan.master_port
    assert plan.next_attempt(fresh_port=False).master_port == plan.master_port
    env = again.rank_env(0, 1, base_env={"MCCL_RESTART_COUNT": "7"})
    assert (env["MCCL_RESTART_COUNT"], env["MCCL_MAX_RESTARTS"], env["TORCHELASTIC_RESTART_COUNT"]) == ("1", "2", "1")


@pytest.mark.parametrize("via", ["local", "ssh"])
def test_a_failed_job_is_restarted_whole_until_it_succeeds(tmp_path, via):
    if via == "local":
        where, env = ["--local", "3"], None
    else:
        where, env = ["--hostfile", write_hostfile(tmp_path / "fleet.yaml", 3), "--master-port", "29581"], \
            env_with_fake_ssh()
    # rank 1 fails (code 3) on the first two attempts; the third attempt succeeds
    r = run_mccl("launch", *where, "--max-restarts", "3", "--grace", "30", "--",
                 "python", RANK_PROGRAMS, "flaky", tmp_path, 1, 3, 2, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = attempts(tmp_path, 3)
    assert sorted(seen) == [0, 1, 2]
    for attempt, ranks in seen.items():
        for rec in ranks.values():
            e = rec["env"]
            assert (e["MCCL_RESTART_COUNT"], e["TORCHELASTIC_RESTART_COUNT"]) == (str(attempt), str(attempt))
            assert (e["MCCL_MAX_RESTARTS"], e["TORCHELASTIC_MAX_RESTARTS"]) == ("3", "3")
        assert len({rec["env"]["MASTER_PORT"] for rec in ranks.values()}) == 1
    ports = [seen[a][0]["env"]["MASTER_PORT"] for a in (0, 1, 2)]
    if via == "local":  # a new rendezvous port for every attempt
        assert len(set(ports)) == 3, ports
    else:  # the hostfile's (here --master-port): the same every time
        assert ports == ["29581"] * 3
    # nothing of a failed attempt outlives it
    for a in (0, 1):
        assert_all_gone(pids_of(tmp_path / f"attempt-{a}", [0, 2]))
    for a in (1, 2):
        assert f"restarting all 3 ranks (restart {a} of 3" in r.stderr
    assert "all 3 ranks finished (after 2 restarts)" in r.stderr
    out = prefixed(r.stdout)
    host1 = "local r1" if via == "local" else "mac-1 r1"
    assert [line for line in out[host1] if line.startswith("rank 1 attempt")] == [
        "rank 1 attempt 0", "rank 1 attempt 1", "rank 1 attempt 2"]


def test_after_the_last_restart_the_exit_code_is_the_failing_ranks(tmp_path):
    r = run_mccl("launch", "--local", "2", "--max-restarts", "1", "--grace", "30", "--",
                 "python", RANK_PROGRAMS, "flaky", tmp_path, 1, 5, 99)
    assert r.returncode == 5, r.stdout + r.stderr
    assert sorted(attempts(tmp_path, 2)) == [0, 1]  # the first run and one restart, no more
    assert "restart 1 of 1" in r.stderr
    assert "failed: rank 1 on local exited with code 5 (no restarts left after 1)" in r.stderr


def test_without_max_restarts_a_failure_is_final(tmp_path):
    r = run_mccl("launch", "--local", "2", "--grace", "30", "--", "python", RANK_PROGRAMS, "flaky", tmp_path, 0, 4, 99)
    assert r.returncode == 4 and sorted(attempts(tmp_path, 2)) == [0]
    assert "restarting" not in r.stderr


def test_ctrl_c_is_not_restarted(tmp_path):
    require_script()
    proc = subprocess.Popen([MCCL, "launch", "--local", "2", "--max-restarts", "3", "--", "python", RANK_PROGRAMS,
                             "sleep", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for_files([tmp_path / "pids-0.json", tmp_path / "pids-1.json"])
        pids = pids_of(tmp_path, [0, 1])
        for p in tmp_path.glob("pids-*.json"):
            p.unlink()
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert "restarting" not in err
    time.sleep(0.5)
    assert not list(tmp_path.glob("pids-*.json")), "the ranks were started again after Ctrl-C"
    assert_all_gone(pids)


def test_max_restarts_must_not_be_negative(capsys):
    assert main(["launch", "--local", "2", "--max-restarts", "-1", "--", "true"]) == 2
    assert "argument --max-restarts: must be at least 0, got -1" in capsys.readouterr().err


def test_a_signal_during_a_failures_stop_is_not_restarted(monkeypatch, capsys):
    """Ctrl-C that comes while the ranks are being stopped after a failure ends the job: the supervisor reports
    the failure (its code) with the signal, and the launcher does not start the ranks again."""
    from lightning_mccl.launcher import Outcome, RankExit, job

    calls = []

    def fake_supervise(plan, **kwargs):
        calls.append(plan.restart)
        spec = plan.rank_specs()[1]
        failed = RankExit(spec, 4, False)
        return Outcome(4, "failed", (failed,), failed, signal.SIGINT)

    monkeypatch.setattr(job, "supervise", fake_supervise)
    assert main(["launch", "--local", "2", "--max-restarts", "3", "--", "true"]) == 4
    err = capsys.readouterr().err
    assert calls == [0] and "restarting" not in err
    assert "failed: rank 1 on local exited with code 4 (not restarted: the launcher got SIGINT)" in err, err
